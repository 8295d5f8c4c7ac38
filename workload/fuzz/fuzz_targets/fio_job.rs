//! Feeds arbitrary text to the fio job-file parser and drives every job it accepts through
//! the request generator on a small volume. Either step may refuse its input with an error,
//! but neither may panic, and every request generated must lie inside the volume, on its
//! sectors, and be no longer than the job's largest block; a FLUSH (`fsync=`, `fdatasync=`,
//! `end_fsync`) has neither offset nor length.

#![no_main]

use afa_workload::fio::parse_job_file;
use afa_workload::generator::JobGenerator;
use afa_workload::IoOp;
use libfuzzer_sys::fuzz_target;

/// A volume small enough that every job's region is quick to cover.
const DEVICE_BYTES: u64 = 64 << 20;
const SECTOR_BYTES: u64 = 512;
/// Requests drawn per job: enough to wrap a sequential job over a small region.
const REQUESTS_PER_JOB: usize = 256;

fuzz_target!(|input: &[u8]| {
    let Ok(text) = std::str::from_utf8(input) else {
        return;
    };
    let Ok(jobs) = parse_job_file(text) else {
        return;
    };
    for job in &jobs {
        let Ok(mut generator) = JobGenerator::new(job, DEVICE_BYTES, SECTOR_BYTES, 7, 0) else {
            continue;
        };
        let largest = job
            .block_sizes
            .iter()
            .map(|sizes| sizes.max_bytes())
            .max()
            .unwrap_or(0);
        for _ in 0..REQUESTS_PER_JOB {
            let Some(io) = generator.next_io() else {
                break;
            };
            if io.op == IoOp::Flush {
                assert!(io.offset_bytes == 0 && io.len_bytes == 0, "{io:?}");
                continue;
            }
            assert!(io.offset_bytes % SECTOR_BYTES == 0, "{io:?}");
            assert!(io.len_bytes % SECTOR_BYTES == 0 && io.len_bytes > 0, "{io:?}");
            assert!(io.offset_bytes + io.len_bytes <= DEVICE_BYTES, "{io:?}");
            assert!(io.len_bytes <= largest, "{io:?} longer than {largest}");
        }
    }
});
