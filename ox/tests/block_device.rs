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

/// A configuration soak's device (`afa run`): write-back cache, EBLOCKs of 32 WBLOCKs,
/// program failures. A page program failed when every channel had come down to the free
/// EBLOCKs held back from user writes, and the retry of that write, data the cache had
/// already acknowledged, found no WBLOCK: the controller stopped with `NoSpace`, its
/// contexts stayed under way, and the host waited at the next stonewall for ever while the
/// checkpoint timer ticked. The retry now goes below that reserve, down to GC's, and a
/// stopped controller is no longer busy.
#[test]
fn a_failed_program_is_retried_when_every_channel_has_closed_to_user_writes() {
    let cfg: OxConfig = toml::from_str(
        r#"
        channels = 4
        luns_per_channel = 3
        eblocks_per_lun = 16
        logical_pages = 4736
        cell_mode = "slc"
        payload = "token"
        log_forward_links = 2
        [terms]
        rblock_bytes = 4096
        wblock_bytes = 65536
        eblock_bytes = 2097152
        [faults]
        factory_bad_block_fraction = 0.03
        program_fail_probability = 0.0001
        [costs]
        cores = 1
        command_cpu_ns = 1000
        log_record_cpu_ns = 0
        link_mb_s = 1000.0
        read_lookup_threads = 0
        [gc]
        static_wear_threshold_erases = 16
        max_gc_channels = 1
        read_whole_wblocks = false
        [checkpoint]
        interval_ns = 3000000000
        [write_cache]
        write_back = true
        capacity_bytes = 5437440
        "#,
    )
    .unwrap();
    let jobs = "
[global]
iodepth=64
[fill]
rw=write
bs=128k
iodepth=32
[over]
stonewall
rw=randwrite
bs=4k
io_size=18944k
iodepth=128
[phase0]
rw=randwrite
bs=4k
iodepth=64
size=16252k
number_ios=5000
stonewall
[phase1]
rw=rw
bs=8k
iodepth=64
number_ios=1250
rwmixread=50
[phase2]
rw=randtrim
bs=32k
iodepth=128
size=25%
number_ios=5000
[verify]
stonewall
rw=read
bs=256k
iodepth=4
";
    let seed = 4283136236;
    let mut dev = OxBlockDevice::new(OxController::format(&cfg, seed).unwrap());
    let options = RunOptions {
        seed,
        timeline_interval_ns: 10_000_000,
        preconditioned_sectors: 0,
        background_work: true,
        show_progress: false,
        record_requests: false,
    };
    let jobs = parse_job_file(jobs).unwrap();
    // Before the fix the run never ended; the guard turns that into a failure.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let out = run(&mut dev, &Workload::Jobs(jobs), &options);
        let stats = *dev.controller().stats();
        let failure = dev.controller().fatal_error().cloned();
        let _ = tx.send((out.map(|o| (o.mismatches, o.reads_checked)), stats, failure));
    });
    let (out, stats, failure) = rx
        .recv_timeout(std::time::Duration::from_secs(600))
        .expect("the run did not end");
    let (mismatches, reads_checked) = out.unwrap();
    assert_eq!(mismatches, 0);
    assert_eq!(reads_checked, 4736 + 1244);
    assert!(stats.rdesc_a_records > 0, "{stats:?}");
    assert!(failure.is_none(), "{failure:?}");
}
