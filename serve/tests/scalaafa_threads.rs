//! ScalaAFA on real threads (its I/O threads, daemon and member SSDs each on an OS thread)
//! served to real clients: fio's nbd engine with two jobs at once verifying every block,
//! qemu-io patterns, discards and unaligned writes, and qemu-img's convert and compare,
//! paced and unpaced. A missing client fails the test under CI=true and skips it otherwise.

mod common;

use std::sync::Arc;

use afa_array::{ArrayConfig, Level, ScalaAfa, ScalaAfaConfig};
use afa_serve::{Pace, RunningServer, ServeConfig, Server, SharedVolume};
use common::*;

/// ScalaAFA over `members` small emulated SSDs that keep full bytes and 24 bytes of OOB per
/// 4 KiB sector (the engine's metadata needs 10), started on threads.
fn scalaafa(members: u32, level: Level, io_threads: u32) -> Arc<dyn SharedVolume> {
    let ssds = (0..members as u64)
        .map(|i| {
            let mut cfg = afa_ssd::SsdConfig::default();
            cfg.geometry.channels = 2;
            cfg.geometry.chips_per_channel = 1;
            cfg.geometry.dies_per_chip = 1;
            cfg.geometry.planes_per_die = 1;
            cfg.geometry.blocks_per_plane = 48;
            cfg.geometry.pages_per_block = 32;
            cfg.geometry.page_bytes = 4096;
            cfg.geometry.sector_bytes = 4096;
            cfg.geometry.oob_bytes_per_page = 24;
            cfg.over_provisioning = 0.25;
            cfg.payload = afa_nand::PayloadMode::Full;
            afa_ssd::Ssd::new(cfg, 40 + i).unwrap()
        })
        .collect();
    let config = ArrayConfig {
        level,
        members,
        chunk_bytes: 16 << 10,
        ..ArrayConfig::default()
    };
    let scala = ScalaAfaConfig {
        io_threads,
        // Little spare space, so that overwrites make array-level GC clean while the
        // clients write.
        spare_fraction: 0.05,
        ..ScalaAfaConfig::default()
    };
    let engine = ScalaAfa::new(config, scala, ssds, Vec::new()).unwrap();
    Arc::new(engine.into_threads().expect("ScalaAFA starts on threads"))
}

fn serve_shared(volume: Arc<dyn SharedVolume>, pace: Pace) -> RunningServer {
    let config = ServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        pace,
        ..ServeConfig::default()
    };
    Server::bind_shared(config, volume)
        .unwrap()
        .spawn()
        .unwrap()
}

/// fio with `jobs` jobs at once on disjoint regions of `region` each, verified.
fn fio_jobs(uri: &str, name: &str, jobs: u32, region: &str, extra: &[&str]) {
    let spread = [
        format!("--numjobs={jobs}"),
        format!("--size={region}"),
        format!("--offset_increment={region}"),
    ];
    let args: Vec<&str> = spread
        .iter()
        .map(String::as_str)
        .chain(extra.iter().copied())
        .collect();
    fio_verify(uri, name, &args);
}

#[test]
fn fio_verifies_two_jobs_at_once_on_scalaafa_threads() {
    if !have("fio") {
        return;
    }
    let server = serve_shared(scalaafa(5, Level::Raid5, 2), Pace::None);
    let uri = server.uri().to_string();
    // Each job writes its region three times over: 4 KiB writes merge into 16 KiB chunks
    // on their owner thread, hero groups fill, convert and are cleaned.
    fio_jobs(
        &uri,
        "randwrite",
        2,
        "6m",
        &["--rw=randwrite", "--bs=4k", "--iodepth=32", "--loops=3"],
    );
    fio_jobs(
        &uri,
        "seqwrite",
        2,
        "6m",
        &[
            "--rw=write",
            "--bsrange=4k-64k",
            "--iodepth=16",
            "--loops=2",
        ],
    );
    server.stop();
    let server = serve_shared(scalaafa(6, Level::Raid6, 3), Pace::Model);
    fio_jobs(
        server.uri(),
        "paced",
        2,
        "2m",
        &["--rw=randwrite", "--bs=16k", "--iodepth=8"],
    );
}

#[test]
fn qemu_io_and_qemu_img_on_scalaafa_threads() {
    if !(have("qemu-io") && have("qemu-img")) {
        return;
    }
    let server = serve_shared(scalaafa(3, Level::Raid5, 2), Pace::None);
    let uri = server.uri().to_string();
    let out = run(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "write -P 0x11 0 1M",
            "-c",
            "write -P 0x22 5000 3000",
            "-c",
            "discard 512k 64k",
            "-c",
            "write -z 800k 10k",
            "-c",
            "flush",
            "-c",
            "read -P 0x11 0 4096",
            "-c",
            "read -P 0x22 5000 3000",
            "-c",
            "read -P 0x11 8000 516288",
            "-c",
            "read -P 0 512k 64k",
            "-c",
            "read -P 0 800k 10k",
            "-c",
            "read -P 0x11 576k 224k",
            &uri,
        ],
    );
    assert!(
        !out.contains("failed") && !out.contains("error"),
        "qemu-io:\n{out}"
    );
    let dir = scratch("scalaafa-threads-img");
    let image = dir.join("in.raw");
    let bytes: Vec<u8> = (0..3u64 << 20).map(|i| (i * 13 + i / 4096) as u8).collect();
    std::fs::write(&image, &bytes).unwrap();
    let image = image.to_str().unwrap();
    run(
        "qemu-img",
        &["convert", "-n", "-f", "raw", "-O", "raw", image, &uri],
    );
    run(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", image, &uri],
    );
}
