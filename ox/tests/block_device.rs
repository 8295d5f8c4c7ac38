//! OXBlock behind the workspace's `BlockDevice` seam, driven by the host layer's fio jobs with
//! the oracle checking every read.

use afa_host::{run, RunOptions, Workload};
use afa_ox::{OxBlockDevice, OxConfig, OxController};
use afa_ssd::BlockDevice;
use afa_workload::fio::parse_job_file;

const JOBS: &str = "
[global]
iodepth=1
size=16m
bs=4k
[w]
rw=randwrite
io_size=24m
[rw]
stonewall
rw=randrw
io_size=8m
fsync=32
[seq]
stonewall
rw=write
bs=1m
io_size=8m
[r]
stonewall
rw=read
bs=64k
";

/// The jobs at queue depth 1 and 16 through the queued interface (where the host holds back
/// requests that overlap one in flight), write-through and write-back; the mixed job sends a
/// FLUSH after every 32 writes, which on the write-back device waits for the writes its
/// cache acknowledged.
#[test]
fn fio_jobs_on_oxblock_read_back_every_write() {
    for (iodepth, write_back) in [(1, false), (16, false), (1, true), (16, true)] {
        let mut cfg = OxConfig::default();
        cfg.write_cache.write_back = write_back;
        let text = JOBS.replace("iodepth=1", &format!("iodepth={iodepth}"));
        fio_jobs_read_back_every_write(&cfg, &text);
    }
}

fn fio_jobs_read_back_every_write(cfg: &OxConfig, jobs: &str) {
    let mut dev = OxBlockDevice::new(OxController::format(cfg, 3).unwrap());
    assert_eq!(dev.info().sector_bytes, 4096);
    assert!(dev.queued().is_some());
    let jobs = parse_job_file(jobs).unwrap();
    let options = RunOptions {
        seed: 3,
        timeline_interval_ns: 1_000_000,
        preconditioned_sectors: 0,
        background_work: true,
        show_progress: false,
        record_requests: false,
    };
    let out = run(&mut dev, &Workload::Jobs(jobs), &options).unwrap();
    assert_eq!(out.mismatches, 0, "{:?}", out.first_mismatches);
    assert!(out.reads_checked > 0);
    assert!(out.measurements.flush.ios > 0);
    let c = dev.controller();
    c.check_invariants().unwrap();
    // 1 MiB sequential writes arrive as 17 packets: 17 contexts and `done` records each.
    assert!(c.stats().done_records > c.stats().write_commands);
}
