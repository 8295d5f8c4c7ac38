//! End-to-end tests of the `afa` binary: the embedded default run, determinism, config
//! and job-file errors, traces, models.

mod common;
use common::{afa, afa_json, fixture};

use std::path::PathBuf;
use std::process::Output;

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("afa-cli-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn read_json(path: &PathBuf) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Runs `afa run` on a fixture configuration, insists it succeeds, and returns its JSON.
fn run_fixture(name: &str) -> serde_json::Value {
    run_json(name, &fixture(name))
}

/// The same for a configuration given as text, written to a temporary file `name`.
fn run_text(name: &str, text: &str) -> serde_json::Value {
    let path = temp(name);
    std::fs::write(&path, text).unwrap();
    run_json(name, path.to_str().unwrap())
}

/// Runs `afa run` on the configuration file `config`, insists it succeeds, and returns its
/// JSON.
fn run_json(name: &str, config: &str) -> serde_json::Value {
    let json = temp(&format!("{name}.json"));
    let out = afa(&["run", config, "--quiet", "--json", json.to_str().unwrap()]);
    assert!(out.status.success(), "{name}: {}", stderr(&out));
    read_json(&json)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn default_run_passes_integrity_and_prints_the_seed_first() {
    let json = temp("default.json");
    let out = afa(&["run", "--json", json.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("seed: 1\n"), "{stdout}");
    let v = read_json(&json);
    assert_eq!(v["integrity"]["mismatches"], 0);
    assert!(v["integrity"]["reads_checked"].as_u64().unwrap() > 0);
    assert!(v.get("array").is_none(), "one SSD has no array section");
    assert!(v.get("members").is_none(), "one SSD has no member list");
    for key in [
        "seed",
        "sim_time_ns",
        "host_time_s",
        "read",
        "write",
        "waf",
        "nand",
        "gc",
        "integrity",
        "timeline",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    for op in ["read", "write"] {
        for key in ["ios", "bytes", "iops", "bandwidth_mb_s"] {
            assert!(v[op][key].is_number(), "{op}.{key}");
        }
        for key in ["mean", "p50", "p90", "p99", "p999", "max"] {
            assert!(
                v[op]["latency_us"][key].is_number(),
                "{op}.latency_us.{key}"
            );
        }
    }
    for key in [
        "page_reads",
        "page_programs",
        "block_erases",
        "slc_programs",
        "mlc_programs",
    ] {
        assert!(v["nand"][key].is_u64(), "nand.{key}");
    }
    assert!(v["gc"]["runs"].is_u64() && v["gc"]["pages_moved"].is_u64());
    let point = &v["timeline"][0];
    for key in ["t_ms", "read_mb_s", "write_mb_s"] {
        assert!(point[key].is_number(), "timeline.{key}");
    }
}

/// Removes the one key allowed to differ between two runs of the same seed.
fn without_host_time(mut v: serde_json::Value) -> serde_json::Value {
    v.as_object_mut().unwrap().remove("host_time_s");
    v
}

#[test]
fn same_seed_gives_identical_json_and_another_seed_does_not() {
    let config = fixture("jobfile.toml");
    let paths: Vec<PathBuf> = ["a.json", "b.json", "c.json"]
        .iter()
        .map(|n| temp(n))
        .collect();
    for (path, seed) in paths.iter().zip(["3", "3", "4"]) {
        let out = afa(&[
            "run",
            &config,
            "--seed",
            seed,
            "--quiet",
            "--json",
            path.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let [a, b, c] = [0, 1, 2].map(|i| without_host_time(read_json(&paths[i])));
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_eq!(a["integrity"]["mismatches"], 0);
    // The job file exercises the SLC cache, the buffer and GC.
    assert!(a["nand"]["slc_programs"].as_u64().unwrap() > 0);
    assert!(
        a["gc"]["runs"].as_u64().unwrap() > 0 || a["gc"]["slc_evictions"].as_u64().unwrap() > 0
    );
}

/// A job file written for fio on a real host runs unchanged: its host-side, buffer and log
/// options are accepted, and what would change the requests is modelled. The fill's verify
/// pass reads back its 4,096 writes; the hot job runs its 2,000 zoned writes twice, each
/// iteration closed by a FLUSH; its `exitall` stops the delayed background reader long
/// before its 10 s runtime.
#[test]
fn a_job_file_written_for_a_real_host_runs_unchanged() {
    let v = run_fixture("real_world.toml");
    assert_eq!(v["integrity"]["mismatches"], 0);
    assert_eq!(v["write"]["ios"], 4096 + 2 * 2000);
    assert_eq!(v["flush"]["ios"], 2);
    let reads = v["read"]["ios"].as_u64().unwrap();
    assert!(reads > 4096, "{reads}");
    let sim_s = v["sim_time_ns"].as_f64().unwrap() / 1e9;
    assert!(sim_s < 5.0, "{sim_s}");
}

/// A job that replays a fio iolog (`read_iolog`, a path from the job file's directory)
/// issues the log's requests in place of its own pattern, beside a job of its own, and every
/// read of both is checked.
#[test]
fn a_job_replays_a_fio_iolog_beside_another() {
    let log = temp("replay.iolog");
    let mut text = String::from("fio version 3 iolog\n1 /dev/sdb add\n2 /dev/sdb open\n");
    for i in 0..40u64 {
        text.push_str(&format!(
            "{} /dev/sdb write {} 8192\n",
            10 + i * 50,
            i * 8192
        ));
    }
    for i in 0..40u64 {
        text.push_str(&format!(
            "{} /dev/sdb read {} 8192\n",
            2_100 + i * 50,
            i * 8192
        ));
    }
    text.push_str("4200 /dev/sdb sync 0 0\n4300 /dev/sdb close\n");
    std::fs::write(&log, text).unwrap();
    let job = temp("replay.fio");
    // A configuration that runs the job file as it now stands.
    let config = format!("[workload]\njob_file = {:?}\n", job.to_str().unwrap());
    let run_at = |percent: u32| {
        std::fs::write(
            &job,
            format!(
                "[replay]\nread_iolog=replay.iolog\nreplay_time_scale={percent}\niodepth=4\n\
                 [own]\nrw=randread\nbs=4k\noffset=8m\nsize=1m\nnumber_ios=30\n"
            ),
        )
        .unwrap();
        let v = run_text("replay.toml", &config);
        assert_eq!(v["integrity"]["mismatches"], 0);
        assert_eq!(v["write"]["ios"], 40);
        assert_eq!(v["read"]["ios"], 70);
        assert_eq!(v["flush"]["ios"], 1);
        v["sim_time_ns"].as_u64().unwrap()
    };
    // The log's last request (the sync) comes 4.19 ms after its first: the replay keeps
    // that timing, or half of it at twice the rate.
    let as_recorded_ns = run_at(100);
    let twice_as_fast_ns = run_at(200);
    assert!(as_recorded_ns >= 4_190_000, "{as_recorded_ns}");
    assert!(twice_as_fast_ns >= 2_095_000, "{twice_as_fast_ns}");
    assert!(
        twice_as_fast_ns < as_recorded_ns,
        "{twice_as_fast_ns} vs {as_recorded_ns}"
    );
    // A job that writes its requests as an iolog (`write_iolog`, a path from the job file's
    // directory) gives a log that replays to the same requests.
    std::fs::write(
        &job,
        "[w]\nrw=randwrite\nbs=4k\nsize=1m\nnumber_ios=25\nwrite_iolog=written.iolog\n\
         [r]\nrw=read\nbs=8k\noffset=2m\nsize=64k\n",
    )
    .unwrap();
    let v = run_text("replay_written.toml", &config);
    assert_eq!(v["write"]["ios"], 25);
    let written = std::fs::read_to_string(temp("written.iolog")).unwrap();
    assert!(written.starts_with("fio version 3 iolog"), "{written}");
    assert_eq!(
        written.lines().filter(|l| l.contains(" write ")).count(),
        25
    );
    assert_eq!(written.lines().filter(|l| l.contains(" read ")).count(), 0);
    std::fs::write(
        &job,
        "[again]\nread_iolog=written.iolog\nreplay_no_stall=1\n",
    )
    .unwrap();
    let v = run_text("replay_again.toml", &config);
    assert_eq!(v["write"]["ios"], 25);
    assert_eq!(v["integrity"]["mismatches"], 0);
    // A log that is not there is named, with the job.
    std::fs::write(&job, "[replay]\nread_iolog=missing.iolog\n").unwrap();
    let out = run_config("replay_missing.toml", &config);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("[replay]") && stderr.contains("missing.iolog"),
        "{stderr}"
    );
}

#[test]
fn trace_replay_runs_from_a_config() {
    let v = run_fixture("trace.toml");
    assert_eq!(v["read"]["ios"], 3);
    assert_eq!(v["write"]["ios"], 2);
    assert_eq!(v["integrity"]["mismatches"], 0);
    // The last record comes one second after the first.
    assert!(v["sim_time_ns"].as_u64().unwrap() >= 1_000_000_000);
}

fn run_config(name: &str, text: &str) -> Output {
    let path = temp(name);
    std::fs::write(&path, text).unwrap();
    afa(&["run", path.to_str().unwrap(), "--quiet"])
}

#[test]
fn config_errors_name_the_field_and_do_not_panic() {
    let cases = [
        (
            "unknown.toml",
            "[ssd]\nover_provisoning = 0.1\n[workload]\njob=\"[a]\\nrw=read\\n\"\n",
            "over_provisoning",
        ),
        (
            "badop.toml",
            "[ssd]\nover_provisioning = -0.1\n[workload]\njob=\"[a]\\nrw=read\\n\"\n",
            "over_provisioning",
        ),
        (
            "geometry.toml",
            "[ssd.geometry]\npage_bytes = 3000\n[workload]\njob=\"[a]\\nrw=read\\n\"\n",
            "page_bytes",
        ),
        (
            "policy.toml",
            "[ssd.gc]\nvictim = \"lru\"\n[workload]\njob=\"[a]\\nrw=read\\n\"\n",
            "victim",
        ),
        ("noworkload.toml", "seed = 1\n", "workload"),
        (
            "badjob.toml",
            "[workload]\njob = \"[a]\\nrw=randwrite\\niodeph=4\\n\"\n",
            "iodeph",
        ),
        (
            "missingjob.toml",
            "[workload]\njob_file = \"nope.fio\"\n",
            "nope.fio",
        ),
        (
            "trace.toml",
            "[workload.trace]\npath = \"nope.csv\"\nformat = \"msr\"\n",
            "nope.csv",
        ),
        (
            "traceformat.toml",
            "[workload.trace]\npath = \"x\"\nformat = \"spx\"\n",
            "spx",
        ),
        (
            "threads.toml",
            "[host]\nthreads = 0\n[workload]\njob=\"[a]\\nrw=read\\n\"\n",
            "host.threads",
        ),
        (
            "profile.toml",
            "[host]\nprofile = \"dpdk\"\n[workload]\njob=\"[a]\\nrw=read\\n\"\n",
            "dpdk",
        ),
        (
            "twophase.toml",
            "[array]\nlevel = \"raid10\"\nmembers = 4\n[array.two_phase]\n[workload]\njob=\"[a]\\nrw=read\\n\"\n",
            "raid5 or raid6",
        ),
        (
            "watermark.toml",
            "[array]\nlevel = \"raid5\"\nmembers = 5\n[array.two_phase]\nwatermark_fraction = 0.9\n[workload]\njob=\"[a]\\nrw=read\\n\"\n",
            "watermark_fraction",
        ),
        (
            "failureinf.toml",
            "[array]\nlevel = \"raid5\"\nmembers = 5\nfailures = [{ member = 1, at_ms = inf }]\n[workload]\njob=\"[a]\\nrw=read\\n\"\n",
            "array.failures[0].at_ms = inf",
        ),
        (
            "failurenan.toml",
            "[array]\nlevel = \"raid5\"\nmembers = 5\nfailures = [{ member = 1, at_ms = 5.0 }, { member = 2, at_ms = nan }]\n[workload]\njob=\"[a]\\nrw=read\\n\"\n",
            "array.failures[1].at_ms = NaN",
        ),
        (
            "twoengines.toml",
            "[array]\nlevel = \"raid5\"\nmembers = 5\n[array.two_phase]\n[array.log]\n[workload]\njob=\"[a]\\nrw=read\\n\"\n",
            "choose one",
        ),
        (
            "logzero.toml",
            "[array]\nlevel = \"raid5\"\nmembers = 3\n[array.log]\nsegment_stripes = 0\n[workload]\njob=\"[a]\\nrw=read\\n\"\n",
            "array.log: segment_stripes = 0 must be positive",
        ),
        (
            "loggcfree.toml",
            "[array]\nlevel = \"raid5\"\nmembers = 3\n[array.log]\ngc_free_segments = 1\n[workload]\njob=\"[a]\\nrw=read\\n\"\n",
            "gc_free_segments = 1 must be at least 2",
        ),
        (
            "members.toml",
            "[array]\nlevel = \"raid6\"\nmembers = 3\n[workload]\njob=\"[a]\\nrw=read\\n\"\n",
            "raid6 needs at least 4 members",
        ),
    ];
    for (name, text, needle) in cases {
        let out = run_config(name, text);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains(needle), "{name}: {err}");
        assert!(!err.contains("panicked"), "{name}: {err}");
    }
}

/// A plane must hold the SLC cache, the GC reserve and some data. A plane short of blocks
/// used to be blamed on `slc_cache.capacity_bytes`, even with no cache configured; the
/// error must name the key at fault and the bound it breaks.
#[test]
fn plane_shortfalls_name_the_key_at_fault() {
    let job = "[workload]\njob=\"[a]\\nrw=read\\n\"\n";
    let cases = [
        (
            "plane3.toml",
            "[ssd.geometry]\nblocks_per_plane = 3\n",
            "geometry.blocks_per_plane = 3 is too small",
            "blocks_per_plane must be at least 5",
        ),
        // The soft threshold (4 by default) is below this one too, but the threshold too
        // large for the plane is the fault to name.
        (
            "hard200.toml",
            "[ssd.gc]\nhard_threshold_blocks = 200\n",
            "gc.hard_threshold_blocks = 200 is too large for a plane of geometry.blocks_per_plane = 128",
            "the threshold can be at most 125",
        ),
        // 8 GiB of SLC on the default device: 512 KiB SLC blocks, 256 in each of 64 planes.
        (
            "slc8g.toml",
            "[ssd.slc_cache]\ncapacity_bytes = 8589934592\n",
            "slc_cache.capacity_bytes = 8589934592 takes 256 SLC blocks in each plane",
            "the cache can be at most 4127195136 bytes",
        ),
    ];
    for (name, ssd, fault, bound) in cases {
        let out = run_config(name, &format!("{ssd}{job}"));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains(fault) && err.contains(bound), "{name}: {err}");
        assert!(!err.contains("panicked"), "{name}: {err}");
        if !ssd.contains("slc_cache") {
            assert!(!err.contains("slc_cache"), "{name}: {err}");
        }
    }
}

/// A job's `size=` past the device's end is cut there, as fio does on a block device, and
/// `afa run` says so on stderr, once, instead of measuring a smaller region silently. The
/// host library only returns the note; the command prints it before the run starts, so a
/// run that then fails still shows it.
#[test]
fn a_size_past_the_device_end_is_cut_with_a_note() {
    let geometry = "[ssd.geometry]\nchannels = 2\nchips_per_channel = 1\ndies_per_chip = 1\nplanes_per_die = 1\nblocks_per_plane = 64\npages_per_block = 64\npage_bytes = 16384\n";
    let note = "note: job \"w\": size=1073741824 bytes from offset 0 reaches past the end of the ";
    let out = run_config(
        "size_past_end.toml",
        &format!(
            "{geometry}[workload]\njob = \"[w]\\nrw=randwrite\\nbs=4k\\nsize=1g\\nio_size=1m\\n\"\n"
        ),
    );
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(err.matches(note).count(), 1, "{err}");
    assert_eq!(err.matches("note: ").count(), 1, "{err}");
    assert!(
        err.contains("fio cuts it the same way on a block device"),
        "{err}"
    );

    // Half the second job's reads fail, and the run stops at the first that does; the note
    // on its cut region was printed before, once.
    let out = run_config(
        "size_past_end_failing.toml",
        &format!(
            "[ssd]\npayload = \"token\"\n[ssd.faults]\nread_fail_probability = 0.5\n{geometry}\
             [workload]\njob = \"[f]\\nrw=write\\nbs=64k\\nsize=1m\\n[w]\\nstonewall\\n\
             rw=read\\nbs=4k\\nsize=1g\\nio_size=1m\\n\"\n"
        ),
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.matches(note).count(), 1, "{err}");
    let error = err.find("error: ").expect(&err);
    assert!(err.find(note).unwrap() < error, "{err}");
    assert!(err[error..].contains("could not be read"), "{err}");
}

/// The flash's faults are in the report: a `Faults` row in the summary and the counts in
/// the JSON's `wear`. A device whose failed programs took its spare blocks fails the run
/// with an error that names them; before, it said only that a plane was out of space.
#[test]
fn media_faults_are_reported_and_named_when_they_fill_the_device() {
    let ssd = "[ssd]\npayload = \"token\"\nover_provisioning = 0.2\n\
               [ssd.geometry]\nchannels = 1\nchips_per_channel = 1\ndies_per_chip = 1\n\
               planes_per_die = 1\nblocks_per_plane = 64\npages_per_block = 32\npage_bytes = 4096\n\
               [ssd.faults]\nprogram_fail_probability = 0.01\n";
    let json = temp("faults.json");
    let config = temp("faults_small.toml");
    std::fs::write(
        &config,
        format!("{ssd}[workload]\njob = \"[w]\\nrw=randwrite\\nbs=4k\\nio_size=2m\\n\"\n"),
    )
    .unwrap();
    let out = afa(&[
        "run",
        config.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", stderr(&out));
    let faults = text
        .lines()
        .find(|l| l.starts_with("Faults"))
        .unwrap_or_else(|| panic!("no Faults row: {text}"));
    let v = read_json(&json);
    let failed = v["wear"]["program_failures"].as_u64().unwrap();
    assert!(failed > 0, "{v}");
    assert!(
        faults.contains(&format!("{failed} failed programs")),
        "{faults}"
    );

    let out = run_config(
        "faults_full.toml",
        &format!("{ssd}[workload]\njob = \"[w]\\nrw=randwrite\\nbs=4k\\nio_size=64m\\n\"\n"),
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("out of space"), "{err}");
    assert!(err.contains("media faults by then: "), "{err}");
    assert!(err.contains("failed programs"), "{err}");
}

/// raid5f takes only whole stripes, and a 3-chunk stripe of 4 KiB chunks is not a whole
/// number of 16 KiB flash pages: preconditioning writes in units that are both.
#[test]
fn a_raid5f_volume_whose_stripe_is_not_whole_pages_is_preconditioned() {
    let out = run_config(
        "raid5f_fill.toml",
        "[ssd.geometry]\nchannels = 2\nchips_per_channel = 1\ndies_per_chip = 1\nplanes_per_die = 1\nblocks_per_plane = 64\npages_per_block = 64\npage_bytes = 16384\n[array]\nlevel = \"raid5f\"\nmembers = 4\nchunk_bytes = 4096\n[precondition]\nfill_fraction = 0.3\n[workload]\njob = \"[r]\\nrw=read\\nbs=12k\\nsize=24m\\n\"\n",
    );
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn a_corrupt_trace_line_is_reported_with_its_line_number() {
    let trace = temp("corrupt.csv");
    std::fs::write(
        &trace,
        "128166372003061629,hm,1,Write,4096,8192,100\n128166372003071629,hm,1,Wrte,0,512,1\n",
    )
    .unwrap();
    let config = format!(
        "[workload.trace]\npath = \"{}\"\nformat = \"msr\"\n",
        trace.display()
    );
    let out = run_config("corrupt.toml", &config);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("line 2"), "{err}");
}

#[test]
fn waf_model_prints_the_prediction() {
    let out = afa(&["model", "waf", "--policy", "fifo", "--op", "0.28"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("2.4814"), "{text}");
    let out = afa(&["model", "waf", "--policy", "greedy", "--op", "-1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("op"));
}

#[test]
fn waf_bench_agrees_with_the_model_on_a_small_device() {
    // A quick version of `afa bench waf`; the full one runs by hand (see README).
    let json = temp("waf.json");
    let out = afa(&[
        "bench",
        "waf",
        "--policy",
        "greedy",
        "--op",
        "0.28",
        "--pages-per-block",
        "32",
        "--rounds",
        "0.5",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = read_json(&json);
    let error = v["relative_error"].as_f64().unwrap();
    assert!(error.abs() < 0.10, "{v}");
}

#[test]
fn raid5_array_with_a_failure_and_rebuild_keeps_every_read_right() {
    let v = run_fixture("raid5.toml");
    assert_eq!(v["integrity"]["mismatches"], 0);
    assert!(v["integrity"]["reads_checked"].as_u64().unwrap() > 0);
    assert!(v["array"]["stripes_rebuilt"].as_u64().unwrap() > 0);
    assert!(v["array"]["read_modify_writes"].as_u64().unwrap() > 0);
    // Twenty dies: four per member SSD.
    assert_eq!(v["die_busy_fraction"].as_array().unwrap().len(), 20);
    assert!(v["array"]["write_amplification"].as_f64().unwrap() > 1.0);
    // Five member slots (the spare took member 2's place), each with its own timeline.
    let members = v["members"].as_array().unwrap();
    assert_eq!(members.len(), 5);
    let written: u64 = members
        .iter()
        .map(|m| m["write_bytes"].as_u64().unwrap())
        .sum();
    assert!(
        written > v["write"]["bytes"].as_u64().unwrap(),
        "parity makes members write more"
    );
    assert!(members
        .iter()
        .all(|m| !m["timeline"].as_array().unwrap().is_empty()));
}

/// `faults.read_fail_probability`: a RAID 5 volume answers the reads its SSDs cannot
/// correct from parity and loses nothing; a lone SSD has nothing to answer them from, and the
/// run stops with the device's reason, or, with fio's `continue_on_error=read`, counts them.
#[test]
fn uncorrectable_reads_are_corrected_by_raid5_and_named_on_one_ssd() {
    // Healthy: with a member failed, RAID 5 has nothing left to answer a second error from
    // (the unrecoverable-read-during-rebuild case), and the run would stop.
    let raid5 = std::fs::read_to_string(fixture("raid5.toml"))
        .unwrap()
        .replace("failures = [{ member = 2, at_ms = 30.0 }]", "")
        .replace(
            "[array]",
            "[ssd.faults]\nread_fail_probability = 0.0002\n\n[array]",
        );
    let v = run_text("read-faults-raid5.toml", &raid5);
    assert_eq!(v["integrity"]["mismatches"], 0);
    assert!(
        v["array"]["read_errors_corrected"].as_u64().unwrap() > 0,
        "{}",
        v["array"]
    );
    let one_ssd = "[ssd]\npayload = \"token\"\n[ssd.faults]\nread_fail_probability = 0.01\n\
                   [workload]\njob = \"[w]\\nrw=randwrite\\nbs=4k\\nsize=8m\\n[r]\\nstonewall\\n\
                   rw=randread\\nbs=4k\\nsize=8m\\n\"\n";
    let out = run_config("read-faults-one.toml", one_ssd);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("could not be read"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // With fio's continue_on_error=read the job counts them and goes on.
    let going_on = one_ssd.replace("rw=randread", "rw=randread\\ncontinue_on_error=read");
    let v = run_text("read-faults-going-on.toml", &going_on);
    assert!(v["read"]["errors"].as_u64().unwrap() > 0, "{}", v["read"]);
    assert_eq!(v["integrity"]["mismatches"], 0);
}

#[test]
fn log_raid_cleans_segments_and_keeps_every_read_right() {
    let v = run_fixture("lograid.toml");
    assert_eq!(v["integrity"]["mismatches"], 0);
    assert!(v["array"]["log"]["segments_cleaned"].as_u64().unwrap() > 0);
    // Cleaning rewrites live data, so the members write more than the user did.
    assert!(v["array"]["write_amplification"].as_f64().unwrap() > 1.0);
    // Log-RAID writes whole stripes only.
    assert_eq!(v["array"]["read_modify_writes"], 0);
}

#[test]
fn two_phase_with_a_host_cpu_converts_fails_over_and_reports_cpu_time() {
    let v = run_fixture("two_phase.toml");
    assert_eq!(v["integrity"]["mismatches"], 0, "{}", v["integrity"]);
    assert!(v["integrity"]["reads_checked"].as_u64().unwrap() > 0);
    let a = &v["array"];
    assert!(a["stripes_converted"].as_u64().unwrap() > 0, "{a}");
    assert!(a["slots_rebuilt"].as_u64().unwrap() > 0, "{a}");
    // Replication writes two copies; conversion adds k + m chunks per k: between 1.25 and 3.5.
    let amp = a["write_amplification"].as_f64().unwrap();
    assert!(amp > 1.25 && amp < 3.5, "{amp}");
    let cpu = &v["cpu"];
    assert_eq!(cpu["threads"].as_array().unwrap().len(), 1);
    let f = &cpu["fractions"];
    let sum: f64 = ["stack", "array", "parity", "sync", "background", "waiting"]
        .iter()
        .map(|k| f[k].as_f64().unwrap())
        .sum();
    assert!((sum - 1.0).abs() < 1e-9, "{f}");
    assert!(f["background"].as_f64().unwrap() > 0.0, "{f}");
}

#[test]
fn reproduce_writes_the_paper_and_measured_maps_with_the_same_labels() {
    let json = temp("fig3.json");
    let out = afa(&[
        "reproduce",
        "scalaafa-fig3",
        "--quick",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = read_json(&json);
    assert_eq!(v["id"], "scalaafa-fig3");
    let paper = v["paper"].as_object().unwrap();
    let measured = v["measured"].as_object().unwrap();
    let labels: Vec<&String> = paper.keys().collect();
    assert_eq!(labels, measured.keys().collect::<Vec<_>>());
    for label in [
        "rep_1t_gbps",
        "rep_2t_gbps",
        "rep_8t_gbps",
        "conv_gbps",
        "randwrite_two-phase/raid5",
    ] {
        assert!(measured[label].as_f64().unwrap() > 0.0, "{label}");
    }
    // Conversion collapses throughput; replication beats read-modify-write by 3x or more.
    assert!(
        measured["conv_gbps"].as_f64().unwrap() < measured["rep_1t_gbps"].as_f64().unwrap() / 4.0
    );
    assert!(measured["randwrite_two-phase/raid5"].as_f64().unwrap() >= 3.0);
    // The claims are judged on the same run and carried in the JSON beside the labels.
    let claims = v["claims"].as_array().unwrap();
    assert_eq!(claims.len(), 3, "{claims:?}");
    for c in claims {
        assert!(c["claim"].as_str().unwrap().contains("within ±25%"), "{c}");
        assert!(c["holds"].is_boolean(), "{c}");
        assert!(c["values"].as_str().unwrap().contains("ratio"), "{c}");
    }
    // The same run again against the first as its baseline: a seed reproduces it, so
    // nothing moves.
    let again = afa(&[
        "reproduce",
        "scalaafa-fig3",
        "--quick",
        "--baseline",
        json.to_str().unwrap(),
    ]);
    assert!(again.status.success(), "{}", stderr(&again));
    let text = String::from_utf8_lossy(&again.stdout);
    assert!(
        text.contains("against the baseline: all 5 labels unchanged"),
        "{text}"
    );
    let err = afa(&["reproduce", "no-such-figure"]);
    assert!(!err.status.success());
    assert!(
        stderr(&err).contains("unknown experiment"),
        "{}",
        stderr(&err)
    );
}

#[test]
fn reproduce_on_worker_processes_prints_and_measures_what_one_process_does() {
    let ids = ["swan-model", "ox-fig12", "scalaafa-fig11"];
    let run = |jobs: &str, json: &PathBuf| {
        let mut args = vec!["reproduce"];
        args.extend(ids);
        args.extend(["--quick", "--jobs", jobs, "--json", json.to_str().unwrap()]);
        let out = afa(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let (one, two) = (temp("jobs-1.json"), temp("jobs-2.json"));
    let printed_one = run("1", &one);
    let printed_two = run("2", &two);
    // The same text in the same order, then the tally over the three experiments.
    assert_eq!(printed_one, printed_two);
    assert!(
        printed_two.contains("claims over 3 experiments"),
        "{printed_two}"
    );
    let (a, b) = (read_json(&one), read_json(&two));
    assert_eq!(a, b);
    let listed: Vec<&str> = b
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, ids);
    // A worker that fails is named, and the experiments after it still run and print.
    let failing = afa(&[
        "reproduce",
        "swan-fig6",
        "swan-model",
        "--quick",
        "--jobs",
        "2",
        "--swan-fig6-report",
        "/nonexistent-afa-dir/fig6.json",
    ]);
    assert!(!failing.status.success());
    assert!(
        stderr(&failing).contains("experiments failed: swan-fig6: cannot write"),
        "{}",
        stderr(&failing)
    );
    let text = String::from_utf8_lossy(&failing.stdout);
    assert!(text.contains("claims over 1 experiment:"), "{text}");
    let zero = afa(&["reproduce", "swan-model", "--jobs", "0"]);
    assert!(stderr(&zero).contains("--jobs must be at least 1"));
}

/// `--seeds N` runs each experiment under N seeds, in this process or on workers alike, and
/// reports each label's mean and spread and each claim's count of seeds; what it cannot
/// mean (a baseline, a chart of one run) is refused by name.
#[test]
fn reproduce_over_several_seeds_reports_means_spreads_and_claims_per_seed() {
    let ids = ["swan-model", "ox-fig12"];
    let run = |jobs: &str, json: &PathBuf| {
        let mut args = vec!["reproduce"];
        args.extend(ids);
        args.extend([
            "--quick",
            "--seed",
            "5",
            "--seeds",
            "2",
            "--jobs",
            jobs,
            "--json",
            json.to_str().unwrap(),
        ]);
        let out = afa(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let (one, two) = (temp("seeds-1.json"), temp("seeds-2.json"));
    let printed_one = run("1", &one);
    let printed_two = run("2", &two);
    assert_eq!(printed_one, printed_two);
    // With --plots, each experiment's chart draws the means with their ranges.
    let plots = temp("seeds-plots");
    let out = afa(&[
        "reproduce",
        "ox-fig12",
        "--quick",
        "--seeds",
        "2",
        "--plots",
        plots.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let svg = std::fs::read_to_string(plots.join("ox-fig12.svg")).unwrap();
    assert!(svg.contains("measured: mean, whisker min–max"), "{svg}");
    assert!(svg.contains("(×1.00–1.00)"), "{svg}");
    for wanted in [
        "seeds: 2 (5 to 6)",
        "ox-fig12 with seed 6",
        "swan-model over 2 seeds",
        "MISS   0/2 N within ±5% of the paper's 1.890",
        "claims over 2 experiments × 2 seeds: ",
    ] {
        assert!(printed_two.contains(wanted), "{wanted:?} in {printed_two}");
    }
    let (a, b) = (read_json(&one), read_json(&two));
    assert_eq!(a, b);
    let fig12 = &b.as_array().unwrap()[1];
    assert_eq!(fig12["id"], "ox-fig12");
    assert_eq!(fig12["seeds"], serde_json::json!([5, 6]));
    // The same labels as a one-seed run, holding the means; every seed's own values too.
    assert_eq!(fig12["measured"]["done_per_mib_block"], 17.0);
    let spread = &fig12["spread"]["done_per_mib_block"];
    assert_eq!(spread["min"], 17.0);
    assert_eq!(spread["seeds"], 2);
    let runs = fig12["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[1]["seed"], 6);
    for claim in fig12["claims"].as_array().unwrap() {
        assert_eq!(claim["holds_on"], 2, "{claim}");
        assert_eq!(claim["values"].as_array().unwrap().len(), 2, "{claim}");
    }
    // An earlier --seeds run is the baseline of a --seeds run: the same seeds, nothing moved.
    let again = afa(&[
        "reproduce",
        "ox-fig12",
        "swan-model",
        "--quick",
        "--seed",
        "5",
        "--seeds",
        "2",
        "--baseline",
        two.to_str().unwrap(),
    ]);
    assert!(again.status.success(), "{}", stderr(&again));
    let text = String::from_utf8_lossy(&again.stdout);
    assert!(
        text.contains("against the baseline: all 2 label means unchanged"),
        "{text}"
    );
    assert!(
        text.contains("against the baseline: 0 of 2 experiments moved, 0 beyond the seeds' spread"),
        "{text}"
    );
    // A one-seed file and a file of means are no baselines of each other.
    let one_seed = temp("one-seed.json");
    let out = afa(&[
        "reproduce",
        "ox-fig12",
        "--quick",
        "--json",
        one_seed.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let refused = |args: &[&str], wanted: &str| {
        let out = afa(args);
        assert!(!out.status.success(), "{args:?}");
        assert!(stderr(&out).contains(wanted), "{}", stderr(&out));
    };
    refused(
        &["reproduce", "ox-fig12", "--baseline", two.to_str().unwrap()],
        "holds means over several seeds",
    );
    refused(
        &[
            "reproduce",
            "ox-fig12",
            "--seeds",
            "2",
            "--baseline",
            one_seed.to_str().unwrap(),
        ],
        "holds one seed's run",
    );
    refused(
        &["reproduce", "ox-fig12", "--seeds", "0"],
        "--seeds must be at least 1",
    );
    refused(
        &[
            "reproduce",
            "ox-fig12",
            "--seed",
            "18446744073709551615",
            "--seeds",
            "2",
        ],
        "past the largest seed",
    );
}

/// `--set` overrides configuration keys and, with `job.`, fio options of every job, in the
/// order given; the report's configuration shows the result. A key the configuration does
/// not have, a path through a value and an argument without `=` are refused by name.
#[test]
fn set_overrides_configuration_keys_and_job_options() {
    let json = temp("set.json");
    let v = afa_json(
        &[
            "run",
            "--quiet",
            "--set",
            "ssd.over_provisioning=0.25",
            "--set",
            "job.number_ios=2000",
            "--set",
            "job.fsync=100",
            "--set",
            "seed=9",
        ],
        &json,
    );
    assert_eq!(v["seed"], 9);
    assert_eq!(v["config"]["ssd"]["over_provisioning"], 0.25);
    assert_eq!(v["write"]["ios"], 2000);
    assert_eq!(v["read"]["ios"], 2000);
    // A FLUSH after every 100th write but the last, which ends the job (fio issues the
    // FLUSH before the next request).
    assert_eq!(v["flush"]["ios"], 19);
    assert_eq!(v["integrity"]["mismatches"], 0);
    // A string value needs no quotes, and a later --set wins.
    let json = temp("set-policy.json");
    let v = afa_json(
        &[
            "run",
            "--quiet",
            "--set",
            "ssd.write_buffer.policy=fifo",
            "--set",
            "job.number_ios=100",
            "--set",
            "job.number_ios=200",
        ],
        &json,
    );
    assert_eq!(v["config"]["ssd"]["write_buffer"]["policy"], "fifo");
    assert_eq!(v["write"]["ios"], 200);
    for (arg, named) in [
        ("ssd.no_such_key=1", "no_such_key"),
        ("ssd.over_provisioning.x=1", "over_provisioning"),
        ("ssd.over_provisioning", "KEY=VALUE"),
        ("ssd..x=1", "dotted key"),
        ("job.fsync=-2", "fsync"),
    ] {
        let out = afa(&["run", "--quiet", "--set", arg]);
        assert!(!out.status.success(), "--set {arg} was taken");
        let err = stderr(&out);
        assert!(err.contains(named), "--set {arg}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// A configuration (written to the temporary file `name`) that replays `trace` in `format`
/// at its recorded times on the embedded default SSD.
fn timed_replay_config(trace: &std::path::Path, format: &str, name: &str) -> std::path::PathBuf {
    let config = temp(name);
    let default = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/default.toml"),
    )
    .unwrap();
    let head = &default[..default.find("[workload]").unwrap()];
    std::fs::write(
        &config,
        format!(
            "{head}[workload.trace]\npath = {:?}\nformat = \"{format}\"\nreplay = \"timed\"\n",
            trace.to_str().unwrap()
        ),
    )
    .unwrap();
    config
}

/// A job with `sync=1` records its writes as FUA writes (`WFS`) in blkparse, and replaying
/// that trace sends them as FUA again; a format without the flag says what it dropped.
#[test]
fn a_sync_jobs_fua_writes_are_recorded_and_replayed() {
    // Runs the 200-request sync job recording into `path` in `format`; returns its stderr.
    let record_synced = |path: &std::path::Path, format: &str| {
        let out = afa(&[
            "run",
            "--quiet",
            "--set",
            "job.number_ios=200",
            "--set",
            "job.sync=1",
            "--record",
            path.to_str().unwrap(),
            "--record-format",
            format,
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        stderr(&out)
    };
    let trace = temp("synced.blkparse");
    record_synced(&trace, "blkparse");
    let text = std::fs::read_to_string(&trace).unwrap();
    let fua_lines = |text: &str| text.lines().filter(|l| l.contains(" WFS ")).count();
    assert_eq!(fua_lines(&text), 200, "the random-write job's writes");

    let config = timed_replay_config(&trace, "blkparse", "replay-synced.toml");
    let again = temp("replayed-synced.blkparse");
    let out = afa(&[
        "run",
        config.to_str().unwrap(),
        "--quiet",
        "--record",
        again.to_str().unwrap(),
        "--record-format",
        "blkparse",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(fua_lines(&std::fs::read_to_string(&again).unwrap()), 200);

    let note = record_synced(&temp("synced.iolog"), "iolog");
    assert!(
        note.contains("records 200 FUA writes as plain writes"),
        "{note}"
    );
}

/// `--record` writes the requests the workload issued as a trace, at the simulated times
/// it issued them; replayed with `timed` on the same configuration it issues the same
/// requests. A format without flushes (ASCII) leaves them out and says so.
#[test]
fn record_writes_the_workload_as_a_trace_that_replays_to_the_same_requests() {
    let small = ["--set", "job.number_ios=300", "--set", "job.fsync=64"];
    // The last recording is gzipped (its name ends in .gz) and replayed from the .gz file.
    for (format, gz) in [("iolog", false), ("ascii", false), ("iolog", true)] {
        let suffix = if gz { ".gz" } else { "" };
        let trace = temp(&format!("recorded-{gz}.{format}{suffix}"));
        let json = temp(&format!("recorded-{format}-{gz}.json"));
        let mut args = vec!["run", "--quiet"];
        args.extend(small);
        args.extend([
            "--record",
            trace.to_str().unwrap(),
            "--record-format",
            format,
        ]);
        let out = afa(&[args.as_slice(), &["--json", json.to_str().unwrap()]].concat());
        assert!(out.status.success(), "{}", stderr(&out));
        let original = read_json(&json);
        let flushes = if format == "ascii" {
            assert!(
                stderr(&out).contains("leaves out 4 Flush"),
                "{}",
                stderr(&out)
            );
            0
        } else {
            4
        };
        let bytes = std::fs::read(&trace).unwrap();
        assert_eq!(
            bytes.starts_with(&[0x1f, 0x8b]),
            gz,
            "{format}: gzipped or not"
        );
        let text = if gz {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut text)
                .unwrap();
            text
        } else {
            String::from_utf8(bytes).unwrap()
        };
        let records =
            afa_workload::trace::read_trace(text.as_bytes(), format.parse().unwrap(), format)
                .unwrap();
        assert_eq!(
            records.len(),
            600 + flushes,
            "{format}: writes, reads, flushes"
        );
        assert!(records
            .windows(2)
            .all(|w| w[0].timestamp_ns <= w[1].timestamp_ns));
        // Replayed open loop at the recorded times, the same requests reach the device.
        let config = timed_replay_config(&trace, format, &format!("replay-{format}-{gz}.toml"));
        let replay_json = temp(&format!("replay-{format}-{gz}.json"));
        let replayed = afa_json(&["run", config.to_str().unwrap(), "--quiet"], &replay_json);
        for op in ["read", "write"] {
            assert_eq!(replayed[op]["ios"], original[op]["ios"], "{format} {op}");
            assert_eq!(
                replayed[op]["bytes"], original[op]["bytes"],
                "{format} {op}"
            );
        }
        assert_eq!(replayed["flush"]["ios"], flushes);
        assert_eq!(replayed["integrity"]["mismatches"], 0);
    }
    let out = afa(&["run", "--record", "x", "--record-format", "nonsense"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("nonsense"), "{}", stderr(&out));
}

/// `afa run --job FILE` runs a fio job file on the embedded default's SSD, or on a given
/// configuration's device in place of its workload (with `--set job.*` still applied); a job
/// file given where the configuration goes is refused with the command that runs it.
#[test]
fn a_fio_job_file_runs_with_job_on_the_default_or_a_configured_device() {
    let job = fixture("mixed.fio");
    let alone = afa_json(&["run", "--job", &job, "--quiet"], &temp("job-alone.json"));
    assert_eq!(alone["integrity"]["mismatches"], 0);
    assert!(alone["write"]["ios"].as_u64().unwrap() > 0);
    assert!(alone["read"]["ios"].as_u64().unwrap() > 0);
    assert!(alone.get("array").is_none());
    assert_eq!(
        alone["config"]["workload"]["job_file"]
            .as_str()
            .map(|p| p.ends_with("mixed.fio")),
        Some(true)
    );

    // On an array, in place of its own workload, with an option overridden.
    let array = afa_json(
        &[
            "run",
            &fixture("raid5.toml"),
            "--job",
            &job,
            "--set",
            "job.iodepth=4",
            "--quiet",
        ],
        &temp("job-array.json"),
    );
    assert!(array.get("array").is_some());
    assert_eq!(array["integrity"]["mismatches"], 0);
    assert!(array["config"]["workload"]["job"]
        .as_str()
        .unwrap()
        .contains("iodepth=4"));

    let out = afa(&["run", &job]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("is a fio job file, not a configuration: run it with `afa run --job"),
        "{}",
        stderr(&out)
    );
}
