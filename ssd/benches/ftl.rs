//! Micro-benchmark of the emulated SSD's write path in its steady state: 4 KiB random
//! overwrites of a preconditioned device whose garbage collection runs all along, one command
//! at a time through the `BlockDevice` seam. `afa bench sim` measures the same path at
//! 64 GiB through the host driver; this one isolates the device on a device small enough
//! to precondition in a second. Run with `cargo bench -p afa-ssd`.

use std::hint::black_box;

use afa_nand::{fill_unit, sector_token, Geometry, PayloadMode};
use afa_sim::SimRng;
use afa_ssd::{
    BlockDevice, Command, Precondition, PreconditionPattern, ReadBuffers, Ssd, SsdConfig,
};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

/// 32 planes of 64 blocks of 128 pages of 4 KiB: 1 GiB raw, 7% over-provisioning, so that
/// greedy GC moves several pages per write as on a full drive.
fn device(payload: PayloadMode) -> Ssd {
    let config = SsdConfig {
        geometry: Geometry {
            channels: 4,
            chips_per_channel: 2,
            dies_per_chip: 2,
            planes_per_die: 2,
            blocks_per_plane: 64,
            pages_per_block: 128,
            page_bytes: 4096,
            sector_bytes: 4096,
            oob_bytes_per_page: 64,
        },
        payload,
        over_provisioning: 0.07,
        ..SsdConfig::default()
    };
    let mut ssd = Ssd::new(config, 1).expect("a valid configuration");
    ssd.precondition(
        &Precondition {
            fill_fraction: 1.0,
            pattern: PreconditionPattern::Random,
            overwrite_rounds: 1.0,
        },
        1,
    )
    .expect("preconditioning succeeds");
    ssd
}

fn random_writes(c: &mut Criterion) {
    let mut group = c.benchmark_group("ssd_random_write_4KiB");
    group.throughput(Throughput::Elements(1));
    for (name, payload) in [("none", PayloadMode::None), ("token", PayloadMode::Token)] {
        let mut ssd = device(payload);
        let info = ssd.info();
        let mut data = vec![0u8; info.payload_unit_bytes as usize];
        let mut rng = SimRng::new(3);
        let mut now_ns = 0;
        let mut version = 0;
        group.bench_function(name, |b| {
            b.iter(|| {
                let lba = rng.below(info.capacity_sectors);
                version += 1;
                fill_unit(sector_token(lba, version), &mut data);
                let done = ssd
                    .submit(now_ns, &Command::write(lba, 1, &data), ReadBuffers::none())
                    .expect("the write succeeds");
                // One command at a time: the next arrives when this one completes, so the
                // device never exceeds its queue depth however long GC makes a write.
                now_ns = black_box(done.done_ns);
            });
        });
    }
    group.finish();
}

criterion_group!(benches, random_writes);
criterion_main!(benches);
