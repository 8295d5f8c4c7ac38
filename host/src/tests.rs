use afa_nand::{Geometry, PayloadMode};
use afa_ssd::{Ssd, SsdConfig};
use afa_workload::fio::parse_job_file;
use afa_workload::trace::{read_trace, TraceFormat};

use super::*;

fn ssd(payload: PayloadMode) -> Ssd {
    let cfg = SsdConfig {
        geometry: Geometry {
            channels: 2,
            chips_per_channel: 2,
            dies_per_chip: 1,
            planes_per_die: 2,
            blocks_per_plane: 32,
            pages_per_block: 32,
            page_bytes: 4096,
            sector_bytes: 512,
            oob_bytes_per_page: 64,
        },
        payload,
        over_provisioning: 0.15,
        ..SsdConfig::default()
    };
    Ssd::new(cfg, 1).unwrap()
}

fn options() -> RunOptions {
    RunOptions {
        seed: 7,
        timeline_interval_ns: 1_000_000,
        preconditioned_sectors: 0,
        background_work: true,
        show_progress: false,
    }
}

const MIXED: &str = "
[global]
iodepth=8
size=2m
[w]
rw=randwrite
bsrange=512-8k
io_size=8m
[rw]
stonewall
rw=randrw
bs=4k
io_size=4m
[trim]
stonewall
rw=randtrim
bs=4k
io_size=256k
[r]
stonewall
rw=read
bs=64k
";

#[test]
fn jobs_run_and_every_read_is_checked() {
    for payload in [PayloadMode::Token, PayloadMode::Full] {
        let mut dev = ssd(payload);
        let jobs = parse_job_file(MIXED).unwrap();
        let out = run(&mut dev, &Workload::Jobs(jobs), &options()).unwrap();
        assert_eq!(out.mismatches, 0, "{:?}", out.first_mismatches);
        assert!(out.reads_checked > 0);
        assert!(out.measurements.write.ios > 0 && out.measurements.read.ios > 0);
        assert!(out.measurements.trim.ios > 0);
        dev.check_invariants();
    }
}

#[test]
fn same_seed_same_event_log() {
    let jobs = parse_job_file(MIXED).unwrap();
    let a = run(
        &mut ssd(PayloadMode::Token),
        &Workload::Jobs(jobs.clone()),
        &options(),
    )
    .unwrap();
    let b = run(
        &mut ssd(PayloadMode::Token),
        &Workload::Jobs(jobs.clone()),
        &options(),
    )
    .unwrap();
    assert_eq!(a.event_hash, b.event_hash);
    assert_eq!(a.sim_time_ns, b.sim_time_ns);
    assert_eq!(a.measurements, b.measurements);
    let mut other = options();
    other.seed = 8;
    let c = run(&mut ssd(PayloadMode::Token), &Workload::Jobs(jobs), &other).unwrap();
    assert_ne!(a.event_hash, c.event_hash);
}

#[test]
fn stonewall_groups_run_one_after_another() {
    let jobs =
        parse_job_file("[a]\nrw=write\nbs=4k\nsize=1m\n[b]\nstonewall\nrw=read\nbs=4k\nsize=1m\n")
            .unwrap();
    let out = run(
        &mut ssd(PayloadMode::Token),
        &Workload::Jobs(jobs),
        &options(),
    )
    .unwrap();
    // Reads come after every write, so they see written data, never zeroes.
    assert_eq!(out.mismatches, 0);
    assert_eq!(out.measurements.read.ios, 256);
    assert_eq!(out.measurements.write.ios, 256);
}

#[test]
fn runtime_limits_a_time_based_job() {
    let jobs =
        parse_job_file("[a]\nrw=randwrite\nbs=4k\niodepth=4\ntime_based\nruntime=20ms\n").unwrap();
    let out = run(
        &mut ssd(PayloadMode::None),
        &Workload::Jobs(jobs),
        &options(),
    )
    .unwrap();
    assert!(out.sim_time_ns >= 20_000_000);
    assert!(out.sim_time_ns < 25_000_000, "{}", out.sim_time_ns);
}

#[test]
fn time_based_without_runtime_is_refused() {
    let jobs = parse_job_file("[a]\nrw=randwrite\ntime_based\n").unwrap();
    let err = run(
        &mut ssd(PayloadMode::None),
        &Workload::Jobs(jobs),
        &options(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("runtime"), "{err}");
}

#[test]
fn think_time_spaces_requests() {
    let jobs = parse_job_file("[a]\nrw=randread\nbs=4k\nnumber_ios=10\nthinktime=1ms\n").unwrap();
    let out = run(
        &mut ssd(PayloadMode::Token),
        &Workload::Jobs(jobs),
        &options(),
    )
    .unwrap();
    assert!(out.sim_time_ns >= 9_000_000, "{}", out.sim_time_ns);
}

#[test]
fn traces_replay_timed_and_closed_loop() {
    let text = "\
128166372003061629,hm,1,Write,4096,8192,100
128166372003071629,hm,1,Read,4096,4096,100
128166372013061629,hm,1,Write,999999999999,512,100
128166372013061630,hm,1,Read,999999999999,512,100
";
    let records = read_trace(text.as_bytes(), TraceFormat::MsrCsv, "inline").unwrap();
    for replay in [
        TraceReplay::Timed { time_scale: 1.0 },
        TraceReplay::Closed { iodepth: 4 },
    ] {
        let w = Workload::Trace {
            records: records.clone(),
            replay,
        };
        let out = run(&mut ssd(PayloadMode::Token), &w, &options()).unwrap();
        assert_eq!(out.requests, 4);
        assert_eq!(out.mismatches, 0);
        if let TraceReplay::Timed { .. } = replay {
            // The third record is one second after the first.
            assert!(out.sim_time_ns >= 1_000_000_000);
        }
    }
}

#[test]
fn requests_beyond_the_device_are_an_error_not_a_panic() {
    let jobs = parse_job_file("[a]\nrw=write\nbs=4k\noffset=1g\n").unwrap();
    let err = run(
        &mut ssd(PayloadMode::Token),
        &Workload::Jobs(jobs),
        &options(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("offset"), "{err}");
}

/// fio's `continue_on_error=read`: a read the device fails is counted and the job goes on;
/// without it the run ends with the device's error.
#[test]
fn continue_on_error_counts_failed_reads_and_goes_on() {
    let faulty = || {
        let mut dev = ssd(PayloadMode::Token);
        let mut cfg = dev.config().clone();
        cfg.faults.read_fail_probability = 0.05;
        dev = Ssd::new(cfg, 1).unwrap();
        dev
    };
    let job = |extra: &str| {
        parse_job_file(&format!(
            "[w]\nrw=write\nbs=4k\nsize=1m\n[r]\nstonewall\nrw=randread\nbs=4k\nsize=1m\n\
             io_size=2m\niodepth=4\n{extra}\n"
        ))
        .unwrap()
    };
    let mut dev = faulty();
    let out = run(
        &mut dev,
        &Workload::Jobs(job("continue_on_error=read")),
        &options(),
    )
    .unwrap();
    let read = &out.measurements.read;
    assert!(read.errors > 0, "{read:?}");
    assert_eq!(read.errors, dev.stats().uncorrectable_reads);
    assert_eq!(
        read.ios + read.errors,
        512,
        "every request is a read or an error"
    );
    assert_eq!(out.mismatches, 0);
    assert_eq!(out.reads_checked, read.ios * 8);
    let mut dev = faulty();
    let err = run(&mut dev, &Workload::Jobs(job("")), &options()).unwrap_err();
    assert!(err.to_string().contains("could not be read"), "{err}");
}
