//! afa's reading of fio job files checked against fio itself: for jobs whose requests do
//! not depend on a random draw, the requests `afa run --job FILE --record` issues must be
//! the ones fio 3.x writes to its `write_iolog` for the same file, in order, with the same
//! direction, offset and length. fio runs with `ioengine=psync` on a sparse scratch file
//! larger than any job's region (so that, as on a block device, its file does not end
//! where the job's `size` does), or with `ioengine=null` for trims, which psync cannot
//! issue to a file; afa ignores both options and runs the embedded default's SSD.

mod common;
use common::{afa, have};

use std::path::{Path, PathBuf};
use std::process::Command;

fn scratch() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("fio-compat-{}", std::process::id()));
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
    let job_path = dir.join(format!("{name}.fio"));
    std::fs::write(&job_path, &job).unwrap();
    let fio_log = dir.join(format!("{name}.fio.log"));
    let afa_log = dir.join(format!("{name}.afa.log"));
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
    let dir = scratch();
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
