//! afa's reading of fio job files checked against fio itself: for jobs whose requests do
//! not depend on a random draw, the requests `afa run --job FILE --record` issues must be
//! the ones fio 3.x writes to its `write_iolog` for the same file, in order, with the same
//! direction, offset and length. fio runs with `ioengine=psync` on a sparse scratch file
//! larger than any job's region (so that, as on a block device, its file does not end
//! where the job's `size` does), or with `ioengine=null` for trims, which psync cannot
//! issue to a file; afa ignores both options and runs the embedded default's SSD.
//!
//! Random offsets cannot match draw for draw, so the skewed distributions are compared by
//! their shape instead: the share of the requests that go to the hottest 1% and 10% of the
//! blocks.

mod common;
use common::{afa, have};

use std::path::{Path, PathBuf};
use std::process::Command;

/// A scratch folder of this process for one test.
fn scratch(test: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("fio-compat-{}", std::process::id()))
        .join(test);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The requests of an iolog (fio's version 3 or afa's recording of one): direction, offset
/// and length, with fio's flushes (`sync`, `datasync`) as `sync` and their offsets, which
/// fio fills with whatever its request slot held, left out.
fn requests(log: &Path) -> Vec<(String, u64, u64)> {
    let text = std::fs::read_to_string(log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            match fields.as_slice() {
                [_, _, "sync" | "datasync", ..] => Some(("sync".to_string(), 0, 0)),
                [_, _, op @ ("read" | "write" | "trim"), offset, len] => Some((
                    op.to_string(),
                    offset.parse().unwrap(),
                    len.parse().unwrap(),
                )),
                _ => None,
            }
        })
        .collect()
}

/// Runs the job file `job` under fio (with `write_iolog`) and under `afa run --job …
/// --record`, insisting both succeed, and returns the two logs.
fn run_both(dir: &Path, name: &str, job: &str) -> (PathBuf, PathBuf) {
    let job_path = dir.join(format!("{name}.fio"));
    std::fs::write(&job_path, job).unwrap();
    let fio_log = dir.join(format!("{name}.fio.log"));
    let afa_log = dir.join(format!("{name}.afa.log"));
    // fio appends to an iolog that exists.
    let _ = std::fs::remove_file(&fio_log);
    let out = Command::new("fio")
        .arg(&job_path)
        .arg(format!("--write_iolog={}", fio_log.display()))
        .arg("--output=/dev/null")
        .output()
        .expect("fio runs");
    assert!(
        out.status.success(),
        "fio {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = afa(&[
        "run",
        "--job",
        job_path.to_str().unwrap(),
        "--quiet",
        "--record",
        afa_log.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "afa {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (fio_log, afa_log)
}

/// Runs `options` as one job under fio (on `engine`) and under afa, and insists both issue
/// the same requests.
fn same_requests(dir: &Path, data: &Path, name: &str, engine: &str, options: &[&str]) {
    let mut job = format!("[{name}]\nioengine={engine}\n");
    if engine == "psync" {
        job.push_str(&format!("filename={}\n", data.display()));
    } else {
        job.push_str("filename=/dev/null\n");
    }
    for option in options {
        job.push_str(option);
        job.push('\n');
    }
    let (fio_log, afa_log) = run_both(dir, name, &job);
    let (mut fio, mut ours) = (requests(&fio_log), requests(&afa_log));
    assert!(!fio.is_empty(), "fio issued nothing for {name}:\n{job}");
    // The clones of a job run side by side, so only the requests, not their order across
    // clones, can be compared (fio's threads interleave as they are scheduled).
    if options.iter().any(|o| o.starts_with("numjobs=")) {
        fio.sort_unstable();
        ours.sort_unstable();
    }
    assert_eq!(fio, ours, "{name}: fio's requests, then afa's, for\n{job}");
}

#[test]
fn deterministic_jobs_issue_what_fio_issues() {
    if !have("fio", "command -v fio") {
        return;
    }
    let dir = scratch("deterministic");
    let data = dir.join("data.img");
    // Sparse: nothing is written but what the jobs write.
    std::fs::File::create(&data)
        .and_then(|f| f.set_len(1 << 30))
        .unwrap();
    let cases: &[(&str, &str, &[&str])] = &[
        ("sequential", "psync", &["rw=read", "bs=4k", "size=64k"]),
        ("holes", "psync", &["rw=write:4k", "bs=4k", "size=64k"]),
        (
            "holes_loops",
            "psync",
            &["rw=write:4k", "bs=4k", "size=24k", "loops=2"],
        ),
        (
            "holes_io_size",
            "psync",
            &["rw=read:12k", "bs=4k", "size=64k", "io_size=64k"],
        ),
        (
            "offset",
            "psync",
            &["rw=read", "bs=8k", "offset=64k", "size=64k"],
        ),
        (
            "io_size_wraps",
            "psync",
            &["rw=read", "bs=4k", "size=16k", "io_size=40k"],
        ),
        (
            "number_ios",
            "psync",
            &["rw=write", "bs=4k", "size=64k", "number_ios=5"],
        ),
        (
            "loops_whole_region",
            "psync",
            &["rw=read", "bs=4k", "size=16k", "loops=3"],
        ),
        (
            "loops_go_on",
            "psync",
            &["rw=write", "bs=4k", "size=64k", "io_size=32k", "loops=2"],
        ),
        (
            "loops_wrap",
            "psync",
            &["rw=read", "bs=4k", "size=64k", "io_size=48k", "loops=2"],
        ),
        (
            "loops_one_pass_then_verify",
            "psync",
            &[
                "rw=write",
                "bs=4k",
                "size=64k",
                "io_size=16k",
                "loops=3",
                "verify=crc32c",
                "end_fsync=1",
            ],
        ),
        (
            "loops_end_fsync",
            "psync",
            &[
                "rw=write",
                "bs=4k",
                "size=64k",
                "io_size=32k",
                "loops=2",
                "end_fsync=1",
            ],
        ),
        (
            "loops_verify_each_pass",
            "psync",
            &["rw=write", "bs=4k", "size=16k", "loops=2", "verify=crc32c"],
        ),
        (
            "number_ios_loops_verify",
            "psync",
            &[
                "rw=write",
                "bs=4k",
                "size=64k",
                "number_ios=3",
                "loops=2",
                "verify=crc32c",
                "end_fsync=1",
            ],
        ),
        (
            "verify_pass",
            "psync",
            &["rw=write", "bs=4k", "size=32k", "verify=crc32c"],
        ),
        (
            "fsync_and_end_fsync",
            "psync",
            &["rw=write", "bs=4k", "size=32k", "fsync=3", "end_fsync=1"],
        ),
        (
            "fdatasync",
            "psync",
            &["rw=write", "bs=4k", "size=32k", "fdatasync=2"],
        ),
        (
            "zones_skip",
            "psync",
            &[
                "rw=write",
                "bs=4k",
                "size=64k",
                "zonemode=strided",
                "zonesize=8k",
                "zonerange=32k",
                "zoneskip=16k",
            ],
        ),
        (
            "zones_revisited",
            "psync",
            &[
                "rw=read",
                "bs=4k",
                "size=256k",
                "io_size=96k",
                "zonemode=strided",
                "zonesize=48k",
                "zonerange=16k",
            ],
        ),
        (
            "zones_with_holes",
            "psync",
            &[
                "rw=read:4k",
                "bs=4k",
                "size=256k",
                "io_size=64k",
                "zonemode=strided",
                "zonesize=16k",
                "zonerange=64k",
            ],
        ),
        (
            "mix_all_reads",
            "psync",
            &["rw=rw", "rwmixread=100", "bs=4k", "size=32k"],
        ),
        (
            "random_made_sequential",
            "psync",
            &["rw=randwrite", "percentage_random=0", "bs=8k", "size=64k"],
        ),
        (
            "clones_offset_increment",
            "psync",
            &[
                "rw=write",
                "bs=4k",
                "size=16k",
                "numjobs=3",
                "offset=8k",
                "offset_increment=64k",
            ],
        ),
        ("trim", "null", &["rw=trim", "bs=16k", "size=128k"]),
        ("trimwrite", "null", &["rw=trimwrite", "bs=4k", "size=32k"]),
    ];
    for (name, engine, options) in cases {
        same_requests(&dir, &data, name, engine, options);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The shares of `log`'s requests that go to its hottest 1% and 10% of `blocks` 4 KiB
/// blocks.
fn hot_shares(log: &Path, blocks: usize) -> [f64; 2] {
    let mut counts = std::collections::BTreeMap::<u64, u64>::new();
    let requests = requests(log);
    for (_, offset, _) in &requests {
        *counts.entry(offset / 4096).or_default() += 1;
    }
    let mut hits: Vec<u64> = counts.into_values().collect();
    hits.sort_unstable_by(|a, b| b.cmp(a));
    [0.01, 0.1].map(|fraction| {
        let hottest = (blocks as f64 * fraction) as usize;
        hits.iter().take(hottest).sum::<u64>() as f64 / requests.len() as f64
    })
}

/// fio's skewed random distributions and afa's put the same shares of the requests on the
/// hottest blocks: zipf, pareto, normal and zoned, 16,384 random 4 KiB reads of a 64 MiB
/// region (fio's random map ends the pass once it has touched as many blocks as the region
/// holds; afa's budget is the region's bytes, the same count).
#[test]
fn skewed_random_distributions_have_fios_shape() {
    if !have("fio", "command -v fio") {
        return;
    }
    let dir = scratch("skewed");
    for distribution in [
        "zipf:1.2",
        "zipf:0.8",
        "pareto:0.9",
        "normal:10",
        "zoned:50/10:50/90",
    ] {
        let job = format!(
            "[d]\nioengine=null\nfilename=/dev/null\nrw=randread\nbs=4k\nsize=64m\n\
             random_distribution={distribution}\n"
        );
        let name = distribution.replace([':', '/', '.'], "_");
        let (fio_log, afa_log) = run_both(&dir, &name, &job);
        let (theirs, ours) = (hot_shares(&fio_log, 16384), hot_shares(&afa_log, 16384));
        for (t, o) in theirs.iter().zip(ours) {
            assert!(
                (t - o).abs() < 0.04,
                "{distribution}: fio's hottest 1% and 10% take {theirs:?}, afa's {ours:?}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
