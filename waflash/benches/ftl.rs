//! Micro-benchmark of the WAFLASH controller's write path under unaligned writes: random
//! writes of one to three 4 KiB sectors into 16 KiB pages, one command at a time, on a
//! device written over twice before it is measured (so that its buffer destages, its FTL
//! merges or keeps versions, and GC runs). The baseline (FIFO buffer over the
//! read-modify-write FTL) and WAFLASH (PC-LRU, MV-FTL and compaction) are measured on the
//! same commands. Run with `cargo bench -p afa-waflash`.

use std::hint::black_box;

use afa_nand::{fill_unit, sector_token};
use afa_sim::SimRng;
use afa_ssd::{BlockDevice, Command, ReadBuffers};
use afa_waflash::{BufferPolicy, FtlKind, WaflashConfig, WaflashSsd};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

/// The default WAFLASH device (16 planes of 64 blocks of 64 × 16 KiB pages, 4 MiB buffer,
/// token payloads) with the given buffer and FTL.
fn device(policy: BufferPolicy, ftl: FtlKind, compaction: bool) -> WaflashSsd {
    let config = WaflashConfig {
        buffer_policy: policy,
        ftl,
        compaction,
        ..WaflashConfig::default()
    };
    WaflashSsd::new(config, 1).expect("a valid configuration")
}

/// The stream of unaligned writes, and the clock of a host that sends the next command when
/// the last completes.
struct Writer {
    rng: SimRng,
    now_ns: u64,
    version: u64,
    data: Vec<u8>,
}

impl Writer {
    fn write(&mut self, ssd: &mut WaflashSsd, capacity_sectors: u64, unit_bytes: usize) {
        let sectors = 1 + self.rng.below(3) as u32;
        let lba = self.rng.below(capacity_sectors - u64::from(sectors));
        self.version += 1;
        self.data.resize(sectors as usize * unit_bytes, 0);
        for (i, unit) in self.data.chunks_mut(unit_bytes.max(1)).enumerate() {
            fill_unit(sector_token(lba + i as u64, self.version), unit);
        }
        let done = ssd
            .submit(
                self.now_ns,
                &Command::write(lba, sectors, &self.data),
                ReadBuffers::none(),
            )
            .unwrap_or_else(|e| {
                panic!("write {} of {sectors} sectors at {lba}: {e}", self.version)
            });
        self.now_ns = black_box(done.done_ns);
    }
}

fn unaligned_writes(c: &mut Criterion) {
    let mut group = c.benchmark_group("waflash_unaligned_write_1_to_3_sectors");
    group.throughput(Throughput::Elements(1));
    for (name, policy, ftl, compaction) in [
        ("baseline", BufferPolicy::Fifo, FtlKind::PageRmw, false),
        ("waflash", BufferPolicy::PcLru, FtlKind::MultiVersion, true),
    ] {
        let mut ssd = device(policy, ftl, compaction);
        let info = ssd.info();
        let unit_bytes = info.payload_unit_bytes as usize;
        let mut writer = Writer {
            rng: SimRng::new(4),
            now_ns: 0,
            version: 0,
            data: Vec::new(),
        };
        // Twice the capacity in sectors, at two sectors per write on average.
        for _ in 0..info.capacity_sectors {
            writer.write(&mut ssd, info.capacity_sectors, unit_bytes);
        }
        group.bench_function(name, |b| {
            b.iter(|| writer.write(&mut ssd, info.capacity_sectors, unit_bytes));
        });
    }
    group.finish();
}

criterion_group!(benches, unaligned_writes);
criterion_main!(benches);
