//! `afa serve` of one WAFLASH SSD (`[waflash]`) as a process: real clients' unaligned
//! writes go through its write buffer, MV-FTL and compaction and read back byte for byte
//! (qemu-io patterns, -P, and fio's own verification), and the server reports on stop what
//! they did inside the device. With `--state` the medium is kept in a file and recovered
//! from its OOB areas after kill -9 or a stop.

use std::process::Command;

mod common;
use common::have;
use common::serve::{qemu_io, setup};

/// The default WAFLASH SSD geometry (16 KiB pages of four 4 KiB sectors, 1 GiB raw) with
/// a 2 MiB write buffer, so that a few MiB of writes reach the flash.
const WAFLASH: &str = "seed = 7\n[waflash.ssd]\nbuffer_bytes = 2097152\n";

/// The count just before `what` in the server's WAFLASH line.
fn count(line: &str, what: &str) -> u64 {
    let at = line
        .find(what)
        .unwrap_or_else(|| panic!("no {what:?} in {line}"));
    line[..at]
        .rsplit([' ', ','])
        .find(|w| !w.is_empty())
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no count before {what:?} in {line}"))
}

#[test]
fn waflash_serves_unaligned_writes_and_reports_what_they_did() {
    if !(have("qemu-io", "command -v qemu-io") && have("fio", "command -v fio")) {
        return;
    }
    let s = setup("waflash", WAFLASH);
    let afa = s.start_in_memory(&["--pace", "model"]);
    // Writes that begin or end inside a 16 KiB page (some inside a 4 KiB sector), then
    // overwrites of parts of them, read back across every boundary.
    qemu_io(
        &afa.uri,
        &[
            "write -P 0x11 0 1M",
            "write -P 0x22 5000 3000",
            "write -P 0x33 20480 4096",
            "write -P 0x44 65536 6144",
            "write -P 0x55 102400 9216",
            "flush",
            "write -P 0x66 106496 2048",
            "write -P 0x77 4096 512",
            "flush",
            "read -P 0x11 0 4096",
            "read -P 0x77 4096 512",
            "read -P 0x11 4608 392",
            "read -P 0x22 5000 3000",
            "read -P 0x11 8000 12480",
            "read -P 0x33 20480 4096",
            "read -P 0x11 24576 40960",
            "read -P 0x44 65536 6144",
            "read -P 0x11 71680 30720",
            "read -P 0x55 102400 4096",
            "read -P 0x66 106496 2048",
            "read -P 0x55 108544 3072",
            "read -P 0x11 111616 936960",
        ],
    );
    // 6 KiB random writes at depth 16 (every one a partial page at one end or both), each
    // block checked by fio when it is read back.
    let out = Command::new("fio")
        .args([
            "--name=unaligned",
            "--ioengine=nbd",
            &format!("--uri={}", afa.uri),
            "--rw=randwrite",
            "--bs=6k",
            "--iodepth=16",
            "--offset=2m",
            "--size=6m",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            // fio would otherwise leave its verify state file in the working directory.
            "--verify_state_save=0",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("err= 0"),
        "fio: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = afa.stop();
    let line = stderr
        .lines()
        .find(|l| l.contains("WAFLASH:"))
        .unwrap_or_else(|| panic!("no WAFLASH counters on stop: {stderr}"));
    // fio's 1,024 writes of 6 KiB each begin or end inside a page, as do qemu-io's.
    assert!(count(line, " unaligned writes") >= 1024, "{line}");
    assert!(count(line, " partial pages to the FTL") > 0, "{line}");
    assert!(count(line, " version writes") > 0, "{line}");
}

/// With `--state` the medium is kept in a flash image that every completed FLUSH brings up
/// to date; a restart rebuilds the FTL from the OOB areas, after kill -9 as after an
/// orderly stop, and every flushed write reads back, unaligned pieces and compacted pages
/// included.
#[test]
fn waflash_kept_in_state_recovers_every_flushed_write_after_kill_9_and_a_stop() {
    if !have("qemu-io", "command -v qemu-io") {
        return;
    }
    let s = setup("waflash-kill9", WAFLASH);
    let afa = s.start(&["--pace", "none"]);
    qemu_io(
        &afa.uri,
        &[
            "write -P 0x11 0 3M",
            "write -P 0x22 5000 3000",
            "write -P 0x33 20480 1024",
            "write -P 0x44 65536 6144",
            "flush",
        ],
    );
    afa.kill_9();
    let afa = s.start(&[]);
    let reads = [
        "read -P 0x11 0 5000",
        "read -P 0x22 5000 3000",
        "read -P 0x11 8000 12480",
        "read -P 0x33 20480 1024",
        "read -P 0x11 21504 44032",
        "read -P 0x44 65536 6144",
        "read -P 0x11 71680 3074048",
    ];
    qemu_io(&afa.uri, &reads);
    qemu_io(&afa.uri, &["write -P 0x55 1M 10000", "flush"]);
    let stderr = afa.stop();
    assert!(stderr.contains("WAFLASH:"), "{stderr}");
    let afa = s.start(&[]);
    qemu_io(
        &afa.uri,
        &["read -P 0x55 1M 10000", "read -P 0x44 65536 6144"],
    );
    let stderr = afa.stop();
    let line = stderr
        .lines()
        .find(|l| l.contains("WAFLASH recovered"))
        .unwrap_or_else(|| panic!("no recovery line: {stderr}"));
    assert!(line.contains("after an orderly stop"), "{line}");
    assert!(count(line, " logical pages mapped") >= 192, "{line}");
}

/// The kill lands among destages, GC and compaction while fio writes at random.
#[test]
fn waflash_kill_9_in_the_middle_of_a_write_load_keeps_the_flushed_region() {
    common::serve::kill_9_under_load_keeps_the_flushed_region("waflash-kill9-load", WAFLASH, 24);
}
