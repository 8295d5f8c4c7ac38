//! `afa serve --state` over the two-phase engine (replicate, then convert on the host): its
//! map lives in host memory only, so every restart rebuilds it from the OOB tags in the
//! members' sidecar files, after an orderly stop and after kill -9, with stripes both
//! converted and still replicated (docs/serve.md, docs/models.md). Member failures
//! configured with `--state` are recorded in `DIR/members.txt`: a failed member's file is
//! never read after a restart (two-phase, RAID 5, Log-RAID and ScalaAFA), and a rebuild
//! onto a spare that a kill cut short is finished by the restart. Data is checked with
//! qemu-io patterns (-P), which fail on any byte that differs. The server and qemu-io
//! helpers are in `common/serve.rs`.

use std::path::Path;
use std::time::{Duration, Instant};

mod common;
use common::have;
use common::serve::{
    kill_9_under_load_keeps_the_flushed_region, log_raid, qemu_io, scalaafa, setup, swan, RAID5,
};

/// Two-phase over a RAID 5 of three small SSDs (16 MiB raw each, 64 KiB chunks): a 26 MiB
/// volume whose conversion starts past about 1.3 MiB of replicated data, so writing a few
/// MiB converts stripes inside the member files.
fn two_phase() -> String {
    format!("{RAID5}[array.two_phase]\n")
}

/// The number before `what` in the restart's recovery line ("... 21 replicated and 299
/// striped chunks ...").
fn recovered(stderr: &str, what: &str) -> u64 {
    let line = stderr
        .lines()
        .find(|l| l.contains("rebuilt the two-phase map"))
        .unwrap_or_else(|| panic!("no recovery line on stderr: {stderr}"));
    let at = line
        .find(what)
        .unwrap_or_else(|| panic!("no '{what}' in {line}"));
    line[..at]
        .split_whitespace()
        .last()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count before '{what}' in {line}"))
}

/// Writes over 20 MiB (far past the watermark, so conversion has run) with an unaligned
/// piece and a rewrite of converted chunks, flushes, stops with SIGTERM, and reads it all
/// back from a restart that rebuilt the map from both converted and replicated chunks.
#[test]
fn two_phase_stop_and_restart_keep_every_flushed_write() {
    if !have("qemu-io", "command -v qemu-io") {
        return;
    }
    let s = setup("restart", &two_phase());
    let afa = s.start(&["--pace", "none"]);
    qemu_io(
        &afa.uri,
        &[
            "write -P 0x5a 0 20M",
            "write -P 0x33 5000 3000",
            "write -P 0xa5 3M 64k",
            "flush",
        ],
    );
    afa.stop();
    let afa = s.start(&["--pace", "model"]);
    qemu_io(
        &afa.uri,
        &[
            "read -P 0x5a 0 4096",
            "read -P 0x33 5000 3000",
            "read -P 0x5a 8000 3137728",
            "read -P 0xa5 3M 64k",
            "read -P 0x5a 3211264 17760256",
        ],
    );
    let log = afa.stop();
    assert!(recovered(&log, "striped chunks") > 0, "{log}");
    assert!(recovered(&log, "replicated and") > 0, "{log}");
    assert_eq!(recovered(&log, "stripes cut short"), 0, "{log}");
}

/// kill -9 keeps every flushed write and the acknowledged writes after the last flush (the
/// server caches nothing), with conversion run before the kill.
#[test]
fn two_phase_kill_9_keeps_flushed_and_acknowledged_writes_after_conversion() {
    if !have("qemu-io", "command -v qemu-io") {
        return;
    }
    let s = setup("kill9", &two_phase());
    let afa = s.start(&["--pace", "model"]);
    qemu_io(&afa.uri, &["write -P 0x42 1M 8M", "flush"]);
    // Acknowledged, never flushed: rewrites of converted chunks, and an unaligned piece.
    qemu_io(
        &afa.uri,
        &["write -P 0x17 2M 256k", "write -P 0x71 10M 100000"],
    );
    afa.kill_9();
    let afa = s.start(&[]);
    qemu_io(
        &afa.uri,
        &[
            "read -P 0x42 1M 1M",
            "read -P 0x17 2M 256k",
            "read -P 0x42 2359296 7077888",
            "read -P 0x71 10M 100000",
        ],
    );
    // The recovered volume keeps converting and keeps the data through a second kill.
    qemu_io(&afa.uri, &["write -P 0x66 12M 6M"]);
    let log = afa.kill_9();
    assert!(recovered(&log, "striped chunks") > 0, "{log}");
    let afa = s.start(&[]);
    qemu_io(
        &afa.uri,
        &[
            "read -P 0x42 1M 1M",
            "read -P 0x17 2M 256k",
            "read -P 0x71 10M 100000",
            "read -P 0x66 12M 6M",
        ],
    );
}

/// kill -9 while fio writes at random: the kill lands among replica writes, conversions
/// and cleaning, and the flushed region before them survives it.
#[test]
fn two_phase_kill_9_in_the_middle_of_a_write_load_keeps_the_flushed_region() {
    // The 26 MiB volume takes the load in 16 MiB past the flushed 8 MiB.
    kill_9_under_load_keeps_the_flushed_region("kill9-load", &two_phase(), 16);
}

/// An SSD whose OOB area leaves fewer than the engine's 14 tag bytes per sector cannot keep
/// the two-phase metadata, and the refusal says what to raise.
#[test]
fn two_phase_with_state_refuses_ssds_with_too_little_oob() {
    let toml = two_phase().replace(
        "pages_per_block = 32\n",
        "pages_per_block = 32\noob_bytes_per_page = 16\n",
    );
    let s = setup("small-oob", &toml);
    let err = s.refused_start(&s.config, &s.socket);
    assert!(
        err.contains("two-phase with --state needs 14 bytes of OOB tag per sector")
            && err.contains("oob_bytes_per_page"),
        "{err}"
    );
}

/// Waits (up to 10 s) until `DIR/members.txt` contains `line`.
fn wait_for_member_record(state: &Path, line: &str) -> String {
    let path = state.join("members.txt");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if text.lines().any(|l| l == line) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{} never said {line:?}: {text}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Overwrites a member file and its tag sidecar (if any) with 0xee, as a failed drive's stale or
/// garbled content: a restart that read either would return wrong bytes.
fn garble(state: &Path, file: &str) {
    for name in [file.to_string(), format!("{file}.tags")] {
        let path = state.join(&name);
        if name.ends_with(".tags") && !path.exists() {
            // Members of a static layout keep no tags.
            continue;
        }
        let len = std::fs::metadata(&path).unwrap().len() as usize;
        std::fs::write(&path, vec![0xee; len]).unwrap();
    }
}

/// A member fails (at its configured time, no spare): the failure is recorded in
/// members.txt before anything else is written, writes after it go to the other members,
/// and after a kill -9 the restart serves degraded without reading the failed member's
/// file, which is garbled here to prove it.
/// Returns the log of the first restart's server (empty where qemu-io is missing outside CI).
fn a_failed_member_is_never_read_again(name: &str, toml: &str) -> String {
    failed_members_are_never_read_again(name, toml, &[1])
}

/// As [`a_failed_member_is_never_read_again`], with every member of `failed` failing at its
/// configured time.
fn failed_members_are_never_read_again(name: &str, toml: &str, failed: &[usize]) -> String {
    if !have("qemu-io", "command -v qemu-io") {
        return String::new();
    }
    let s = setup(name, toml);
    let afa = s.start(&["--pace", "model"]);
    qemu_io(&afa.uri, &["write -P 0x5a 0 8M", "flush"]);
    let records: Vec<String> = failed
        .iter()
        .map(|f| format!("member {f} member-{f}.img failed"))
        .collect();
    for r in &records {
        wait_for_member_record(&s.state, r);
    }
    qemu_io(
        &afa.uri,
        &["write -P 0x77 1M 1M", "write -P 0x21 6M 3M", "flush"],
    );
    afa.kill_9();
    for f in failed {
        garble(&s.state, &format!("member-{f}.img"));
    }
    let afa = s.start(&[]);
    let reads = [
        "read -P 0x5a 0 1M",
        "read -P 0x77 1M 1M",
        "read -P 0x5a 2M 4M",
        "read -P 0x21 6M 3M",
    ];
    qemu_io(&afa.uri, &reads);
    // An orderly stop and restart keep it so, and no failure happens twice.
    let log = afa.stop();
    for f in failed {
        assert!(!log.contains(&format!("member {f} failed")), "{log}");
    }
    let afa = s.start(&[]);
    qemu_io(&afa.uri, &reads);
    afa.stop();
    for r in &records {
        wait_for_member_record(&s.state, r);
    }
    log
}

#[test]
fn two_phase_with_a_failed_member_restarts_degraded_without_reading_its_file() {
    let toml = two_phase().replace(
        "members = 3\n",
        "members = 3\nfailures = [{ member = 1, at_ms = 1500 }]\n",
    );
    a_failed_member_is_never_read_again("failed", &toml);
}

/// The same over a plain RAID 5 (a static layout): the restart serves degraded reads.
#[test]
fn raid5_with_a_failed_member_restarts_degraded_without_reading_its_file() {
    let toml = RAID5.replace(
        "members = 3\n",
        "members = 3\nfailures = [{ member = 1, at_ms = 1500 }]\n",
    );
    a_failed_member_is_never_read_again("raid5-failed", &toml);
}

/// A member fails with a spare configured: its rebuild onto the spare's file is recorded,
/// a kill -9 comes in the middle of it, and the restart rebuilds the spare's file again
/// from the start (never reading the failed member's file, garbled here), serves every
/// pattern meanwhile, and records the rebuild's end; a further restart serves from the
/// spare's file.
fn a_rebuild_onto_a_spare_continues_after_kill_9(name: &str, toml: &str) {
    if !have("qemu-io", "command -v qemu-io") {
        return;
    }
    let s = setup(name, toml);
    let afa = s.start(&["--pace", "model"]);
    qemu_io(&afa.uri, &["write -P 0x5a 0 8M", "flush"]);
    wait_for_member_record(&s.state, "member 1 member-3.img rebuilding");
    qemu_io(&afa.uri, &["write -P 0x77 1M 1M", "write -P 0x21 6M 3M"]);
    afa.kill_9();
    garble(&s.state, "member-1.img");
    let afa = s.start(&[]);
    let reads = [
        "read -P 0x5a 0 1M",
        "read -P 0x77 1M 1M",
        "read -P 0x5a 2M 4M",
        "read -P 0x21 6M 3M",
    ];
    qemu_io(&afa.uri, &reads);
    let record = wait_for_member_record(&s.state, "member 1 member-3.img serving");
    assert!(!record.lines().any(|l| l.starts_with("spare ")), "{record}");
    qemu_io(&afa.uri, &reads);
    // The restarted server, not the killed one, finished the rebuild.
    let log = afa.stop();
    assert!(
        log.contains("the rebuild of member 1 onto member-3.img is done"),
        "{log}"
    );
    let afa = s.start(&[]);
    qemu_io(&afa.uri, &reads);
}

#[test]
fn two_phase_rebuild_onto_a_spare_continues_after_kill_9() {
    let toml = two_phase().replace(
        "members = 3\n",
        "members = 3\nspares = 1\nrebuild_mb_s = 2.0\nfailures = [{ member = 1, at_ms = 1000 }]\n",
    );
    a_rebuild_onto_a_spare_continues_after_kill_9("rebuild", &toml);
}

#[test]
fn raid5_rebuild_onto_a_spare_continues_after_kill_9() {
    let toml = RAID5.replace(
        "members = 3\n",
        "members = 3\nspares = 1\nrebuild_mb_s = 6.0\nfailures = [{ member = 1, at_ms = 1000 }]\n",
    );
    a_rebuild_onto_a_spare_continues_after_kill_9("raid5-rebuild", &toml);
}

#[test]
fn scalaafa_with_a_failed_member_restarts_degraded_without_reading_its_file() {
    // ScalaAFA recovers its map from the OOB tags too, and with a recorded failure it
    // recovers without the failed member.
    let toml = scalaafa("failures = [{ member = 1, at_ms = 1500 }]");
    let log = a_failed_member_is_never_read_again("scalaafa-failed", &toml);
    // With its failure behind it and no spare, the restart serves degraded on threads.
    if !log.is_empty() {
        assert!(log.contains("serves without member 1"), "{log}");
        assert!(log.contains("ScalaAFA runs 2 I/O threads"), "{log}");
    }
}

/// Members 1 and 2 fail, one after the other: with two parity rows the volume loses both
/// and then the power (kill -9), and the restart recovers from the other members alone.
const TWO_FAILURES: &str =
    "failures = [{ member = 1, at_ms = 1500 }, { member = 2, at_ms = 1600 }]";

/// As RAID 6 over `members` members (m = 2).
fn raid6_of(toml: &str, members: u32) -> String {
    toml.replace(
        "level = \"raid5\"\nmembers = 3",
        &format!("level = \"raid6\"\nmembers = {members}"),
    )
}

#[test]
fn scalaafa_with_two_failed_members_restarts_without_reading_their_files() {
    let toml = raid6_of(&scalaafa(TWO_FAILURES), 4);
    let log = failed_members_are_never_read_again("scalaafa-two-failed", &toml, &[1, 2]);
    if !log.is_empty() {
        assert!(log.contains("serves without members [1, 2]"), "{log}");
    }
}

#[test]
fn two_phase_with_two_failed_members_restarts_without_reading_their_files() {
    // Two-phase writes m + 1 replicas on distinct members, so with two failed it needs
    // five members to go on taking writes.
    let toml = raid6_of(&two_phase(), 5)
        .replace("members = 5\n", &format!("members = 5\n{TWO_FAILURES}\n"));
    assert!(
        toml.contains("raid6") && toml.contains("member = 2"),
        "{toml}"
    );
    failed_members_are_never_read_again("two-phase-two-failed", &toml, &[1, 2]);
}

#[test]
fn log_raid_with_a_failed_member_restarts_degraded_without_reading_its_file() {
    let toml = log_raid("failures = [{ member = 1, at_ms = 1500 }]");
    a_failed_member_is_never_read_again("lograid-failed", &toml);
}

#[test]
fn log_raid_rebuild_onto_a_spare_continues_after_kill_9() {
    let toml =
        log_raid("spares = 1\nrebuild_mb_s = 6.0\nfailures = [{ member = 1, at_ms = 1000 }]");
    a_rebuild_onto_a_spare_continues_after_kill_9("lograid-rebuild", &toml);
}

/// A failed member of an R-group without a spare: the restart recovers SWAN's map through
/// degraded reads of the group.
#[test]
fn swan_with_a_failed_member_restarts_degraded_without_reading_its_file() {
    let toml = swan("failures = [{ member = 1, at_ms = 1500 }]");
    a_failed_member_is_never_read_again("swan-failed", &toml);
}

/// With two spares and member 4 (in the second group) failing: SWAN deals spare
/// j to group j mod 2, so the failed member is rebuilt onto the second spare's file
/// (member-7.img), not the first. A kill -9 in the middle of that rebuild, and the restart
/// hands the second group the same file again (recovering the map from the summaries and
/// the NVRAM log through degraded reads of the group, never from the failed member's file,
/// garbled here) and finishes the rebuild; the first group's spare is still unused.
#[test]
fn swan_rebuild_onto_its_r_groups_spare_continues_after_kill_9() {
    if !have("qemu-io", "command -v qemu-io") {
        return;
    }
    let toml = swan("spares = 2\nrebuild_mb_s = 6.0\nfailures = [{ member = 4, at_ms = 1000 }]");
    let s = setup("swan-rebuild", &toml);
    let afa = s.start(&["--pace", "model"]);
    qemu_io(&afa.uri, &["write -P 0x5a 0 8M", "flush"]);
    wait_for_member_record(&s.state, "member 4 member-7.img rebuilding");
    qemu_io(&afa.uri, &["write -P 0x77 1M 1M", "write -P 0x21 6M 3M"]);
    afa.kill_9();
    garble(&s.state, "member-4.img");
    let afa = s.start(&[]);
    let reads = [
        "read -P 0x5a 0 1M",
        "read -P 0x77 1M 1M",
        "read -P 0x5a 2M 4M",
        "read -P 0x21 6M 3M",
    ];
    qemu_io(&afa.uri, &reads);
    let record = wait_for_member_record(&s.state, "member 4 member-7.img serving");
    assert!(
        record.lines().any(|l| l.contains("member-6.img")),
        "the first group's spare should still be unused: {record}"
    );
    let log = afa.stop();
    assert!(
        log.contains("the rebuild of member 4 onto member-7.img is done"),
        "{log}"
    );
    let afa = s.start(&[]);
    qemu_io(&afa.uri, &reads);
}
