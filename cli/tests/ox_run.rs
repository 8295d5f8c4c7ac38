//! `afa run` on one OX SSD (`[ox]`) behind its block interface, driven by a fio job with
//! every read checked: deterministic per seed, and the controller's own counters (WAL
//! contexts and `done` records, checkpoints, GC) in the JSON.

mod common;
use common::{afa, fixture};

use std::path::PathBuf;

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("afa-ox-run-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Runs the fixture with `seed` and returns its JSON without the host's own time.
fn run(seed: &str, name: &str) -> serde_json::Value {
    run_config(&fixture("ox_run.toml"), seed, name)
}

/// Runs `config` with `seed` and returns its JSON without the host's own time.
fn run_config(config: &str, seed: &str, name: &str) -> serde_json::Value {
    let json = temp(name);
    let out = afa(&[
        "run",
        config,
        "--seed",
        seed,
        "--quiet",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    v.as_object_mut().unwrap().remove("host_time_s");
    v
}

#[test]
fn an_ox_run_checks_every_read_and_reports_the_controller() {
    let a = run("11", "a.json");
    assert_eq!(a["integrity"]["mismatches"], 0);
    // fio's random map reads each 4 KiB block of the 15 MiB file once (3,840 reads).
    assert_eq!(a["integrity"]["reads_checked"], 3840);
    assert_eq!(a["read"]["ios"], 3840);
    let ox = &a["ox"];
    // OXBlock: every write packet is a context of its own, closed by its own done record,
    // so a 64 KiB write of the fill (two packets) makes two. fio's random map writes each
    // 8 KiB block of the file once: 240 fill writes and 1,920 overwrites.
    assert_eq!(ox["write_commands"], 240 + 1920, "{ox}");
    let contexts = ox["contexts"].as_u64().unwrap();
    assert_eq!(contexts, 2 * 240 + 1920, "{ox}");
    assert_eq!(ox["done_records"].as_u64().unwrap(), contexts, "{ox}");
    // Three volumes' worth of writes on 40 MiB of flash: GC collects, and checkpoints run.
    assert!(ox["gc_victims"].as_u64().unwrap() > 0, "{ox}");
    assert!(ox["checkpoints"].as_u64().unwrap() > 0, "{ox}");
    // Every WBLOCK programmed (LPAGEs, padding, GC copies, log and tables) per WBLOCK of
    // LPAGEs written.
    assert!(a["waf"].as_f64().unwrap() > 1.0, "{}", a["waf"]);
    assert_eq!(a["gc"]["runs"], ox["gc_victims"]);
}

/// The run report is the one every `afa run` writes, so the plotting and fio tools take it.
#[test]
fn an_ox_run_report_plots_and_speaks_fio_json() {
    run("11", "plotted.json");
    let dir = temp("plots");
    let out = afa(&[
        "plot",
        temp("plotted.json").to_str().unwrap(),
        "-o",
        dir.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(dir.join("timeline.svg").exists() && dir.join("nand.svg").exists());
    let out = afa(&[
        "run",
        &fixture("ox_run.toml"),
        "--output-format",
        "fio-json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fio: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(fio["jobs"][0]["error"], 0);
    assert!(fio["jobs"][0]["write"]["io_bytes"].as_u64().unwrap() > 0);
}

#[test]
fn an_ox_run_is_the_same_for_the_same_seed_and_not_for_another() {
    let a = run("11", "same-a.json");
    let b = run("11", "same-b.json");
    let c = run("12", "other.json");
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn an_ox_run_whose_checkpoints_overrun_their_interval_still_finishes() {
    // Checkpoints every 10 ns: each runs for milliseconds, so the next waits for it. The run
    // used to tick through every checkpoint and never find the device idle at a stonewall.
    let text = std::fs::read_to_string(fixture("ox_run.toml"))
        .unwrap()
        .replace("interval_ns = 20000000", "interval_ns = 10");
    assert!(text.contains("interval_ns = 10\n"));
    let config = temp("storm.toml");
    std::fs::write(&config, text).unwrap();
    let v = run_config(config.to_str().unwrap(), "11", "storm.json");
    let ox = &v["ox"];
    assert!(ox["checkpoints"].as_u64().unwrap() > 100, "{ox}");
    assert_eq!(v["integrity"]["mismatches"], 0);
    assert_eq!(v["integrity"]["reads_checked"], 3840);
}

/// Failed programs and erases on the medium, checkpoints every millisecond so that the
/// checkpoint EBLOCKs are erased often: the FTL absorbs every failure (RDESC_A, retired
/// EBLOCKs, replaced system EBLOCKs), every read is still right, and the summary line names
/// what it absorbed.
#[test]
fn an_ox_run_with_media_faults_checks_every_read_and_names_the_faults() {
    let text = std::fs::read_to_string(fixture("ox_run.toml"))
        .unwrap()
        .replace("interval_ns = 20000000", "interval_ns = 1000000")
        + "[ox.faults]\nprogram_fail_probability = 0.002\nerase_fail_probability = 0.02\n";
    let config = temp("faults.toml");
    std::fs::write(&config, text).unwrap();
    let out = afa(&["run", config.to_str().unwrap(), "--seed", "11"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let text = format!("{stdout}{stderr}");
    assert!(text.contains("0 mismatches"), "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("ox (OXBlock"))
        .unwrap_or_else(|| panic!("no summary line: {text}"));
    assert!(line.contains("; media faults: "), "{line}");
    assert!(!line.contains(" 0 failed erases"), "{line}");
    let v = run_config(config.to_str().unwrap(), "11", "faults.json");
    assert_eq!(v["integrity"]["mismatches"], 0);
    assert_eq!(v["integrity"]["reads_checked"], 3840);
    assert!(
        v["ox"]["eblocks_retired"].as_u64().unwrap() > 0,
        "{}",
        v["ox"]
    );
}

/// A medium whose failed programs retire EBLOCK after EBLOCK runs out of space, and the
/// error says why, as an SSD's does. Found by a configuration soak: the run said only that
/// no EBLOCK could be reclaimed, which reads like an FTL that lost track of its space.
#[test]
fn an_ox_run_that_faults_fill_names_them_in_its_error() {
    let text = std::fs::read_to_string(fixture("ox_run.toml"))
        .unwrap()
        .replace("number_ios=6000", "number_ios=60000")
        + "[ox.faults]\nprogram_fail_probability = 0.02\n";
    let config = temp("faults_full.toml");
    std::fs::write(&config, text).unwrap();
    let out = afa(&["run", config.to_str().unwrap(), "--seed", "11", "--quiet"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("no EBLOCK can be reclaimed"), "{err}");
    assert!(err.contains("media faults by then: "), "{err}");
    assert!(err.contains("failed programs"), "{err}");
}

/// With `[ox.write_cache] write_back = true` every write is acknowledged from the controller's
/// cache, and every read is still checked against what was written.
/// Found by a configuration soak: a write-back OX SSD with no periodic checkpoint (so the
/// log is truncated only when space runs short) whose writes waited for space once stopped
/// with a request unfinished and nothing left to do. With GC off, no event was left to
/// declare the wait hopeless (the last was a log write); with GC on and
/// `start_used_fraction` above the channels' use, a GC turn ended at its stop threshold
/// while the channels were still closed to user writes, and nothing started another. Now
/// the first run fails with the acknowledged write it lost, and the second finishes.
#[test]
fn an_ox_run_whose_writes_wait_for_space_never_stops_with_them_unfinished() {
    let config = |gc: bool| {
        format!(
            "seed = 2427964208\n\
             [ox]\nchannels = 3\nluns_per_channel = 1\neblocks_per_lun = 32\n\
             logical_pages = 6929\ncell_mode = \"tlc\"\npayload = \"token\"\nlog_forward_links = 1\n\
             [ox.terms]\nrblock_bytes = 4096\nwblock_bytes = 32768\neblock_bytes = 2097152\n\
             [ox.gc]\nenabled = {gc}\nstart_used_fraction = 0.95\nstop_used_fraction = 0.95\n\
             [ox.checkpoint]\nenabled = false\n\
             [ox.write_cache]\nwrite_back = true\n\
             [workload]\njob = \"\"\"\n\
             [fill]\nrw=write\nbs=128k\niodepth=32\n\
             [over]\nstonewall\nrw=randwrite\nbs=4k\nio_size=27716k\niodepth=8\n\
             [more]\nstonewall\nrw=write\nbs=4k\nnumber_ios=1000\nfsync=64\nend_fsync=1\n\
             [verify]\nstonewall\nrw=read\nbs=128k\niodepth=16\n\"\"\"\n"
        )
    };
    let path = temp("wait_for_space_gc_off.toml");
    std::fs::write(&path, config(false)).unwrap();
    let out = afa(&["run", path.to_str().unwrap(), "--quiet"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(!err.contains("nothing left to do"), "{err}");
    assert!(
        err.contains("after the write-back cache acknowledged it"),
        "{err}"
    );
    let path = temp("wait_for_space_gc_on.toml");
    std::fs::write(&path, config(true)).unwrap();
    run_config(
        path.to_str().unwrap(),
        "2427964208",
        "wait_for_space_gc_on.json",
    );
}

/// Found by a configuration soak: with a MAP cache of 8 pages every install waits for MAP
/// page loads, and a write-back cache let hundreds of contexts start ahead of them. No
/// checkpoint could truncate the log past the oldest one's RDESC, the log behind it grew to
/// 213 of 752 EBLOCKs (checkpoints forced by the long log only added to it), and writes the
/// cache had acknowledged failed as hopeless while the installs went on. New contexts now
/// wait while the log pinned behind the oldest one exceeds the META margin, and contexts
/// under way count against hopelessness.
#[test]
fn an_ox_run_whose_installs_lag_behind_a_write_back_cache_loses_no_acknowledged_write() {
    let config = "seed = 3714442328\n\
         [ox]\nchannels = 8\nluns_per_channel = 2\neblocks_per_lun = 47\nlogical_pages = 35509\n\
         payload = \"token\"\nmap_cache_pages = 8\nlog_forward_links = 2\nmax_batch_pages = 63\n\
         [ox.terms]\nrblock_bytes = 512\nwblock_bytes = 16384\neblock_bytes = 65536\n\
         [ox.timing]\nscheduling = \"first-come\"\nmulti_plane = false\n\
         [ox.gc]\nread_whole_wblocks = true\nmin_invalid_relax_from_used_fraction = 0.95\n\
         [ox.write_cache]\nwrite_back = true\n\
         [workload]\njob = \"\"\"\n\
         [fill]\nrw=write\nbs=128k\niodepth=4\n\
         [over]\nstonewall\nrw=randwrite\nbs=5k\nio_size=18180608\niodepth=8\n\
         [verify]\nstonewall\nrw=read\nbs=128k\niodepth=16\n\"\"\"\n";
    let path = temp("installs_lag.toml");
    std::fs::write(&path, config).unwrap();
    let v = run_config(path.to_str().unwrap(), "3714442328", "installs_lag.json");
    assert_eq!(v["integrity"]["mismatches"], 0);
    // The verify phase reads every logical page back.
    assert_eq!(v["integrity"]["reads_checked"], 35509, "{}", v["integrity"]);
}

#[test]
fn an_ox_run_with_a_write_back_cache_checks_every_read() {
    let text = std::fs::read_to_string(fixture("ox_run.toml")).unwrap()
        + "[ox.write_cache]\nwrite_back = true\n";
    let config = temp("write-back.toml");
    std::fs::write(&config, text).unwrap();
    let v = run_config(config.to_str().unwrap(), "11", "write-back.json");
    assert_eq!(v["integrity"]["mismatches"], 0);
    assert_eq!(v["integrity"]["reads_checked"], 3840);
    let ox = &v["ox"];
    assert_eq!(ox["write_cache_acks"], ox["write_commands"], "{ox}");
    assert_eq!(ox["write_commands"], 240 + 1920, "{ox}");
}

/// With the write-through cache the host keeps the job's iodepth in flight through
/// OXBlock's queued interface: the controller serves reads side by side, every read is still
/// checked, and the run is the same for the same seed.
#[test]
fn an_ox_run_keeps_the_jobs_queue_depth_in_flight() {
    let fixture_text = std::fs::read_to_string(fixture("ox_run.toml")).unwrap();
    assert!(fixture_text.contains("[global]\n"));
    let deep = temp("ox_run_iodepth8.toml");
    std::fs::write(
        &deep,
        fixture_text.replace("[global]\n", "[global]\niodepth=8\n"),
    )
    .unwrap();
    let one = run("11", "qd1.json");
    let eight = run_config(deep.to_str().unwrap(), "11", "qd8.json");
    assert_eq!(eight["integrity"]["mismatches"], 0);
    assert_eq!(eight["integrity"]["reads_checked"], 3840);
    assert_reads_run_side_by_side(&one, &eight);
    assert_eq!(
        run_config(deep.to_str().unwrap(), "11", "qd8-again.json"),
        eight
    );
}

/// Behind the host CPU model (`[host]`) the queued interface is passed on: the host still
/// keeps the job's iodepth in flight, every read is still checked, and the threads' CPU time
/// is reported.
#[test]
fn an_ox_run_behind_the_host_cpu_model_keeps_the_jobs_queue_depth_in_flight() {
    let fixture_text = std::fs::read_to_string(fixture("ox_run.toml")).unwrap();
    let with_host = |iodepth: u32, name: &str| {
        let path = temp(name);
        let text = fixture_text
            .replace("[global]\n", &format!("[global]\niodepth={iodepth}\n"))
            .replace("[workload]\n", "[host]\nthreads = 1\n[workload]\n");
        assert!(text.contains("[host]") && text.contains("iodepth="));
        std::fs::write(&path, text).unwrap();
        run_config(path.to_str().unwrap(), "11", &format!("{name}.json"))
    };
    let one = with_host(1, "ox_run_host_qd1.toml");
    let eight = with_host(8, "ox_run_host_qd8.toml");
    for v in [&one, &eight] {
        assert_eq!(v["integrity"]["mismatches"], 0);
        assert_eq!(v["integrity"]["reads_checked"], 3840);
        let busy = v["cpu"]["threads"][0]["stack_ns"].as_u64().unwrap();
        assert!(busy > 0, "{}", v["cpu"]);
    }
    assert_reads_run_side_by_side(&one, &eight);
}

/// A run at iodepth 8 reads more than twice as fast as the same run at iodepth 1: the
/// controller serves the reads side by side.
fn assert_reads_run_side_by_side(one: &serde_json::Value, eight: &serde_json::Value) {
    let iops = |v: &serde_json::Value| v["read"]["iops"].as_f64().unwrap();
    assert!(
        iops(eight) > 2.0 * iops(one),
        "{} vs {} read IOPS",
        iops(eight),
        iops(one)
    );
}
