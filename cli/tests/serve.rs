//! `afa serve` as a process: stop and restart, and kill -9, with file-backed state. Every
//! rule of the fault model (docs/serve.md) has its own test; data is checked with qemu-io
//! patterns (-P), which fail on any byte that differs.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

mod common;
use common::have;
use common::serve::{
    kill_9_under_load_keeps_the_flushed_region, log_raid, qemu_io, qemu_io_read_only, scalaafa,
    scratch, setup, swan, ONE_SSD, RAID5,
};

const AFA: &str = env!("CARGO_BIN_EXE_afa");

#[test]
fn stop_and_restart_keep_every_flushed_write() {
    if !have("qemu-io", "command -v qemu-io") {
        return;
    }
    let s = setup("restart", RAID5);
    let afa = s.start(&["--pace", "none"]);
    qemu_io(
        &afa.uri,
        &[
            "write -P 0x5a 0 1M",
            "write -P 0xa5 3M 64k",
            "write -P 0x33 5000 3000",
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
            "read -P 0x5a 8000 1040576",
            "read -P 0xa5 3M 64k",
        ],
    );
    // A second restart changes nothing either.
    afa.stop();
    let afa = s.start(&[]);
    qemu_io(&afa.uri, &["read -P 0xa5 3M 64k"]);
}

/// With factory bad blocks the members' SSDs differ in size. Every member file was sized by
/// the first one's model, and a volume with `--state` did not start at all ("the timing model
/// for member-1.img has 18816 sectors of 4096 bytes, the file 18710"); each file now holds
/// what the smallest SSD exports, as the engines use of every member.
#[test]
fn a_kept_array_of_ssds_with_factory_bad_blocks_starts_and_keeps_its_writes() {
    if !have("qemu-io", "command -v qemu-io") {
        return;
    }
    let toml = format!("{RAID5}[ssd.faults]\nfactory_bad_block_fraction = 0.03\n");
    let s = setup("factory-bad", &toml);
    let afa = s.start(&["--pace", "none"]);
    qemu_io(&afa.uri, &["write -P 0x5a 0 1M", "flush"]);
    afa.stop();
    let afa = s.start(&["--pace", "none"]);
    qemu_io(&afa.uri, &["read -P 0x5a 0 1M"]);
}

/// `--read-only` serves a kept volume for reading only: clients see a read-only export
/// (qemu refuses to open it for writing) and the data is as the last run left it.
#[test]
fn read_only_serves_the_kept_volume_and_takes_no_write() {
    if !have("qemu-io", "command -v qemu-io") {
        return;
    }
    let s = setup("read-only", RAID5);
    let afa = s.start(&["--pace", "none"]);
    qemu_io(&afa.uri, &["write -P 0x3c 0 1M", "flush"]);
    afa.stop();
    let afa = s.start(&["--read-only"]);
    assert!(afa.line.contains(", read-only) at "), "{}", afa.line);
    qemu_io_read_only(&afa.uri, &["read -P 0x3c 0 1M"]);
    let write = Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write -P 0x11 0 4k", &afa.uri])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&write.stderr);
    assert!(
        !write.status.success() && said.contains("Permission denied"),
        "{said}"
    );
    afa.stop();
    let afa = s.start(&[]);
    qemu_io(&afa.uri, &["read -P 0x3c 0 1M"]);
}

#[test]
fn kill_9_keeps_every_flushed_write() {
    if !have("qemu-io", "command -v qemu-io") {
        return;
    }
    let s = setup("kill9-flushed", RAID5);
    let afa = s.start(&["--pace", "model"]);
    qemu_io(&afa.uri, &["write -P 0x42 1M 2M", "flush"]);
    afa.kill_9();
    let afa = s.start(&[]);
    qemu_io(&afa.uri, &["read -P 0x42 1M 2M"]);
}

#[test]
fn kill_9_keeps_acknowledged_writes_because_the_server_caches_nothing() {
    if !have("qemu-io", "command -v qemu-io") {
        return;
    }
    let s = setup("kill9-acked", RAID5);
    let afa = s.start(&["--pace", "none"]);
    // No flush: the writes are acknowledged, written to the member files, not fsynced.
    qemu_io(
        &afa.uri,
        &["write -P 0x17 0 256k", "write -P 0x71 10M 100000"],
    );
    afa.kill_9();
    let afa = s.start(&[]);
    qemu_io(
        &afa.uri,
        &["read -P 0x17 0 256k", "read -P 0x71 10M 100000"],
    );
}

#[test]
fn kill_9_in_the_middle_of_a_write_load_keeps_the_flushed_region() {
    kill_9_under_load_keeps_the_flushed_region("kill9-load", RAID5, 24);
}

/// As above on ScalaAFA: the kill lands among replica writes and in-file conversions.
#[test]
fn scalaafa_kill_9_in_the_middle_of_a_write_load_keeps_the_flushed_region() {
    kill_9_under_load_keeps_the_flushed_region("scalaafa-kill9-load", &scalaafa(""), 24);
}

/// As above on SWAN: the kill lands among NVRAM log appends and stripe writes.
#[test]
fn swan_kill_9_in_the_middle_of_a_write_load_keeps_the_flushed_region() {
    kill_9_under_load_keeps_the_flushed_region("swan-kill9-load", &swan(""), 24);
}

/// ScalaAFA's I/O threads, daemon and members run on OS threads of their own in serve
/// mode; with member failures configured, the single-owner engine serves instead.
#[test]
fn scalaafa_is_served_on_its_own_threads_unless_failures_are_configured() {
    let s = setup("scalaafa-threads", &scalaafa(""));
    let stderr = s.start(&["--pace", "none"]).stop();
    assert!(stderr.contains("ScalaAFA runs 2 I/O threads"), "{stderr}");
    let failing = scalaafa("failures = [{ member = 1, at_ms = 600000 }]");
    let s = setup("scalaafa-failures", &failing);
    let stderr = s.start(&["--pace", "none"]).stop();
    assert!(
        stderr.contains("runs on the server's engine thread"),
        "{stderr}"
    );
}

/// ScalaAFA keeps its AMT and HGMT in host memory only; every restart rebuilds them from the
/// OOB tags in the members' sidecar files (§5.4), after an orderly stop and after kill -9,
/// with stripes both converted and still in replication.
#[test]
fn scalaafa_rebuilds_its_map_from_oob_tags_after_a_stop_and_after_kill_9() {
    // More than the transient areas hold: most stripes are converted to parity.
    rebuilds_after_a_stop_and_after_kill_9("scalaafa", &scalaafa(""), &["0x5a"], 30);
}

/// The same with checkpoints of the AMT and HGMT every 2 ms: restarts start from the newest
/// whole checkpoint in the members' files and read only the OOB tags of the heroes written
/// since.
#[test]
fn scalaafa_with_checkpoints_rebuilds_after_a_stop_and_after_kill_9() {
    let toml = format!("{}checkpoint_interval_ms = 2.0\n", scalaafa(""));
    rebuilds_after_a_stop_and_after_kill_9("scalaafa-checkpoints", &toml, &["0x5a"], 30);
}

/// SWAN keeps its map in host memory; every restart rebuilds it from the segment summaries
/// on the members and the NVRAM log of the open segments, after an orderly stop and after
/// kill -9, and keeps acknowledged writes that were never flushed (the NVRAM holds them).
#[test]
fn swan_rebuilds_its_map_from_summaries_and_nvram_after_a_stop_and_after_kill_9() {
    // The volume is 76.7 MiB: three passes make segments go through GC.
    rebuilds_after_a_stop_and_after_kill_9("swan", &swan(""), &["0x11", "0x22", "0x5a"], 76);
}

/// The same with 4 MiB segments, whose summaries take their last four blocks: the map comes
/// back from summaries read across several blocks.
#[test]
fn swan_with_summaries_of_several_blocks_rebuilds_after_a_stop_and_after_kill_9() {
    let toml = swan("").replace("segment_bytes = 1048576", "segment_bytes = 4194304");
    rebuilds_after_a_stop_and_after_kill_9(
        "swan-long-summaries",
        &toml,
        &["0x11", "0x22", "0x5a"],
        64,
    );
}

/// SWAN on a host without NVRAM (`host_memory = "volatile"`): kill -9 under a write load
/// keeps what the last flush covered, found through the partial summary the flush wrote.
#[test]
fn volatile_swan_kill_9_in_the_middle_of_a_write_load_keeps_the_flushed_region() {
    let toml = format!("{}host_memory = \"volatile\"\n", swan(""));
    kill_9_under_load_keeps_the_flushed_region("swan-volatile-kill9-load", &toml, 24);
}

/// The same volume written three times over (so that the back-end cleans segments and its
/// victims wait for their moves to be flushed), with a small write in the middle of a
/// stripe: after kill -9 the flushed contents are all there, and after an orderly stop,
/// which flushes, so are the writes no client flushed.
#[test]
fn volatile_swan_rebuilds_from_summaries_and_partial_summaries() {
    let toml = format!("{}host_memory = \"volatile\"\n", swan(""));
    volatile_rebuilds_from_summaries_and_partial_summaries("swan-volatile", &toml, 76);
}

/// The same with 4 MiB segments, whose summaries and partial summaries take four blocks.
#[test]
fn volatile_swan_with_summaries_of_several_blocks_rebuilds_from_them() {
    let toml = format!("{}host_memory = \"volatile\"\n", swan(""))
        .replace("segment_bytes = 1048576", "segment_bytes = 4194304");
    volatile_rebuilds_from_summaries_and_partial_summaries("swan-volatile-long", &toml, 64);
}

/// As above on Log-RAID, whose cleaner writes a partial summary before it trims a victim.
#[test]
fn volatile_log_raid_rebuilds_from_summaries_and_partial_summaries() {
    let toml = format!("{}host_memory = \"volatile\"\n", log_raid(""));
    volatile_rebuilds_from_summaries_and_partial_summaries("lograid-volatile", &toml, 40);
}

/// Writes the first `fill_mib` MiB three times and a small piece in the middle of a stripe,
/// flushes, kills the server and reads it all back; then writes without a flush, stops in
/// order, and reads that back too.
fn volatile_rebuilds_from_summaries_and_partial_summaries(name: &str, toml: &str, fill_mib: u64) {
    if !have("qemu-io", "command -v qemu-io") {
        return;
    }
    let s = setup(name, toml);
    let afa = s.start(&["--pace", "none"]);
    let fill: Vec<String> = ["0x11", "0x22", "0x5a"]
        .iter()
        .map(|p| format!("write -P {p} 0 {fill_mib}M"))
        .collect();
    let mut commands: Vec<&str> = fill.iter().map(String::as_str).collect();
    commands.extend(["write -P 0x33 5000 3000", "flush"]);
    qemu_io(&afa.uri, &commands);
    afa.kill_9();
    let afa = s.start(&["--pace", "none"]);
    let tail = format!("read -P 0x5a 8000 {}", (fill_mib << 20) - 8000);
    qemu_io(
        &afa.uri,
        &["read -P 0x5a 0 4096", "read -P 0x33 5000 3000", &tail],
    );
    qemu_io(&afa.uri, &["write -P 0x44 3M 100000"]);
    afa.stop();
    let afa = s.start(&["--pace", "none"]);
    qemu_io(
        &afa.uri,
        &["read -P 0x33 5000 3000", "read -P 0x44 3M 100000"],
    );
}

/// A SWAN volume served with one `host_memory` setting is refused with the other (the state
/// directory's record of the volume names the setting): each keeps what the other's recovery
/// would not read, the NVRAM log's open segments or the partial summaries.
#[test]
fn swan_refuses_a_change_of_host_memory_between_starts() {
    if !have("qemu-io", "command -v qemu-io") {
        return;
    }
    let volatile = format!("{}host_memory = \"volatile\"\n", swan(""));
    for (name, first, then, expect) in [
        (
            "swan-bb-then-volatile",
            swan(""),
            volatile.clone(),
            "host_memory: Volatile",
        ),
        (
            "swan-volatile-then-bb",
            volatile.clone(),
            swan(""),
            "host_memory: BatteryBacked",
        ),
    ] {
        let s = setup(name, &first);
        let afa = s.start(&["--pace", "none"]);
        qemu_io(&afa.uri, &["write -P 0x21 0 300000", "flush"]);
        afa.stop();
        let other = s.dir.join("other.toml");
        std::fs::write(&other, &then).unwrap();
        let stderr = s.refused_start(&other, &s.dir.join("other.sock"));
        assert!(
            stderr.contains("holds a volume made as") && stderr.contains(expect),
            "{name}: {stderr}"
        );
        // The volume is untouched by the refused start.
        let afa = s.start(&["--pace", "none"]);
        qemu_io(&afa.uri, &["read -P 0x21 0 300000"]);
        afa.stop();
    }
}

/// Log-RAID rebuilds its map from the summaries at the end of its segments and the NVRAM
/// log, like SWAN, after its cleaner has moved data.
#[test]
fn log_raid_rebuilds_its_map_from_summaries_and_nvram_after_a_stop_and_after_kill_9() {
    rebuilds_after_a_stop_and_after_kill_9("lograid", &log_raid(""), &["0x11", "0x22", "0x5a"], 40);
}

/// As above on Log-RAID.
#[test]
fn log_raid_kill_9_in_the_middle_of_a_write_load_keeps_the_flushed_region() {
    kill_9_under_load_keeps_the_flushed_region("lograid-kill9-load", &log_raid(""), 24);
}

/// Log-RAID on a host without NVRAM (`host_memory = "volatile"`): kill -9 under a write
/// load keeps what the last flush covered, found through the partial summary it wrote.
#[test]
fn volatile_log_raid_kill_9_in_the_middle_of_a_write_load_keeps_the_flushed_region() {
    let toml = format!("{}host_memory = \"volatile\"\n", log_raid(""));
    kill_9_under_load_keeps_the_flushed_region("lograid-volatile-kill9-load", &toml, 24);
}

/// Fills the first `fill_mib` MiB once per pattern (the last one stays), writes two small
/// pieces over it and flushes; stops and restarts, reads everything back, writes zeroes the
/// server may deallocate and flushes, and writes more without a flush; kills and restarts,
/// and reads everything back again. The volume must
/// hold at least 36 MiB.
fn rebuilds_after_a_stop_and_after_kill_9(
    name: &str,
    toml: &str,
    fill_patterns: &[&str],
    fill_mib: u64,
) {
    if !have("qemu-io", "command -v qemu-io") {
        return;
    }
    let s = setup(name, toml);
    let afa = s.start(&["--pace", "none"]);
    let mut fill: Vec<String> = fill_patterns
        .iter()
        .map(|p| format!("write -P {p} 0 {fill_mib}M"))
        .collect();
    fill.extend(["write -P 0x33 5000 3000", "write -P 0xc4 20M 64k", "flush"].map(String::from));
    qemu_io(
        &afa.uri,
        &fill.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    afa.stop();
    let afa = s.start(&["--pace", "model"]);
    let tail = format!("read -P 0x5a 21037056 {}", (fill_mib << 20) - 21037056);
    qemu_io(
        &afa.uri,
        &[
            "read -P 0x5a 0 4096",
            "read -P 0x33 5000 3000",
            "read -P 0x5a 8000 20963520",
            "read -P 0xc4 20M 64k",
            &tail,
            // Zeroes that may be written as a deallocation (no NO_HOLE flag), flushed: 2 MiB
            // whose log segments hold nothing else afterwards, and 8 KiB among live data,
            // whose older copies stay on the members until their segments are cleaned.
            "write -z -u 24M 2M",
            "write -z -u 27M 8k",
            "flush",
            // Acknowledged, never flushed, then a kill.
            "write -P 0x81 1M 3M",
            "write -P 0x19 30M 4100k",
            "write -P 0x77 35M 12k",
        ],
    );
    afa.kill_9();
    let afa = s.start(&["--pace", "none"]);
    qemu_io(
        &afa.uri,
        &[
            "read -P 0x33 5000 3000",
            "read -P 0x81 1M 3M",
            "read -P 0x5a 4M 16M",
            "read -P 0xc4 20M 64k",
            "read -P 0x5a 21037056 4128768",
            "read -P 0 24M 2M",
            "read -P 0x5a 26M 1M",
            "read -P 0 27M 8k",
            "read -P 0x5a 28319744 3137536",
            "read -P 0x19 30M 4100k",
            "read -P 0x77 35M 12k",
        ],
    );
}

#[test]
fn a_state_directory_refuses_another_configuration_and_a_second_server() {
    let s = setup("mismatch", RAID5);
    let afa = s.start(&[]);
    // A second server on the same directory.
    let other_socket = s.dir.join("other.sock");
    let err = s.refused_start(&s.config, &other_socket);
    assert!(err.contains("in use by another afa serve"), "{err}");
    afa.stop();
    // The same directory under a different layout.
    let raid6 = RAID5.replace("raid5\"\nmembers = 3", "raid6\"\nmembers = 4");
    let config = s.dir.join("raid6.toml");
    std::fs::write(&config, raid6).unwrap();
    let err = s.refused_start(&config, &s.socket);
    assert!(err.contains("Raid5") && err.contains("Raid6"), "{err}");
}

#[test]
fn bad_arguments_are_named() {
    let out = Command::new(AFA)
        .args(["serve", "--listen", "localhost"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("\"localhost\"") && err.contains("IP:PORT"),
        "{err}"
    );
    let out = Command::new(AFA)
        .args(["serve", "--listen", "127.0.0.1:0", "--max-connections", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("max_connections"));
}

/// A request the volume refuses is logged with its cause, not only counted: raid5f takes
/// only whole stripes, and the operator of a server that answers EINVAL should see why.
#[test]
fn a_failed_request_is_logged_with_its_cause() {
    if !have("qemu-io", "command -v qemu-io") {
        return;
    }
    let s = setup("failure-log", &RAID5.replace("\"raid5\"", "\"raid5f\""));
    let afa = s.start_in_memory(&["--pace", "none"]);
    let write = Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write -P 0x11 0 4k", &afa.uri])
        .output()
        .unwrap();
    assert!(
        !write.status.success() || String::from_utf8_lossy(&write.stdout).contains("error"),
        "{write:?}"
    );
    let stderr = afa.stop();
    assert!(
        stderr.contains("request failed with errno 22")
            && stderr.contains("raid5f accepts only full-stripe writes"),
        "{stderr}"
    );
    assert!(stderr.contains("1 errors)"), "{stderr}");
}

#[test]
fn the_embedded_default_volume_is_served_without_a_config() {
    if !have("nbdinfo", "command -v nbdinfo") {
        return;
    }
    let dir = scratch("default");
    let socket = dir.join("afa.sock");
    let mut child = Command::new(AFA)
        .args(["serve", "--listen"])
        .arg(format!("unix:{}", socket.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("one emulated SSD in memory"), "{line}");
    let uri = line.trim().rsplit(" at ").next().unwrap().to_string();
    let out = Command::new("nbdinfo")
        .args(["--size", &uri])
        .output()
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let size: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(size > 1 << 30, "the default SSD exports {size} bytes");
}

/// An orderly stop is recorded as clean and the restart serves at once; after kill -9 the
/// restart resyncs the redundancy (md's unclean-shutdown resync), which a torn write needs:
/// here member 0's file is overwritten behind the server's back, as a write that reached
/// one member and not the parity would leave it, and afterwards every stripe's XOR over
/// the three RAID 5 members is zero again.
/// A second stop signal while the first stop runs ends the process at once (status 128 +
/// the signal), as a kill -9 would: the state is left unclean, so the next start resyncs,
/// and nothing acknowledged is lost. When the orderly stop wins the race it ends with
/// success instead, and the volume is just as whole.
#[test]
fn a_second_stop_signal_exits_at_once_and_loses_nothing() {
    if !have("qemu-io", "command -v qemu-io") {
        return;
    }
    let s = setup("twice", RAID5);
    let afa = s.start(&["--pace", "none"]);
    qemu_io(
        &afa.uri,
        &["write -P 0x6b 0 2M", "flush", "write -P 0x2d 1M 64k"],
    );
    let (exit, stderr) = afa.stop_twice();
    match exit.code() {
        // Both signals are pending at once, so either may be taken as the first.
        Some(130 | 143) => assert!(stderr.contains(" while stopping: exiting"), "{stderr}"),
        Some(0) => assert!(stderr.contains("stopped after"), "{stderr}"),
        other => panic!("afa serve ended with {other:?}: {stderr}"),
    }
    let afa = s.start(&[]);
    qemu_io(
        &afa.uri,
        &[
            "read -P 0x6b 0 1M",
            "read -P 0x2d 1M 64k",
            "read -P 0x6b 1088k 960k",
        ],
    );
    let restart = afa.stop();
    if exit.code() != Some(0) {
        assert!(
            restart.contains("resynced"),
            "no resync after a forced stop: {restart}"
        );
    }
}

#[test]
fn a_kill_makes_the_restart_resync_parity_and_an_orderly_stop_does_not() {
    if !have("qemu-io", "command -v qemu-io") {
        return;
    }
    let s = setup("resync", RAID5);
    let afa = s.start(&["--pace", "none"]);
    qemu_io(&afa.uri, &["write -P 0x3c 0 2M", "flush"]);
    let first = afa.stop();
    assert!(
        !first.contains("resynced"),
        "a fresh volume needs no resync: {first}"
    );
    let afa = s.start(&[]);
    let clean = afa.stop();
    assert!(
        !clean.contains("resynced"),
        "an orderly stop needs no resync: {clean}"
    );
    let afa = s.start(&[]);
    afa.kill_9();
    // A torn write: new bytes on member 0 only, far from the client's data.
    let member0 = s.state.join("member-0.img");
    let mut bytes = std::fs::read(&member0).unwrap();
    let at = bytes.len() / 2;
    bytes[at..at + 65536].fill(0xee);
    std::fs::write(&member0, &bytes).unwrap();
    let afa = s.start(&[]);
    qemu_io(&afa.uri, &["read -P 0x3c 0 2M"]);
    let after_kill = afa.stop();
    assert!(
        after_kill.contains("resynced"),
        "no resync after kill -9: {after_kill}"
    );
    let members: Vec<Vec<u8>> = (0..3)
        .map(|i| std::fs::read(s.state.join(format!("member-{i}.img"))).unwrap())
        .collect();
    let len = members.iter().map(Vec::len).min().unwrap();
    let bad = (0..len)
        .filter(|&b| members[0][b] ^ members[1][b] ^ members[2][b] != 0)
        .count();
    assert_eq!(bad, 0, "{bad} bytes where the RAID 5 parity does not match");
}

/// `nbdinfo --map` of `uri`: the `base:allocation` extents as (offset, length, type), with
/// neighbours of the same type merged (a client may ask in pieces).
fn allocation_map(uri: &str) -> Vec<(u64, u64, u32)> {
    let out = Command::new("nbdinfo")
        .args(["--map=base:allocation", uri])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "nbdinfo --map failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut map: Vec<(u64, u64, u32)> = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (offset, length, kind) = (
            f[0].parse().unwrap(),
            f[1].parse().unwrap(),
            f[2].parse().unwrap(),
        );
        match map.last_mut() {
            Some((o, l, k)) if *k == kind && *o + *l == offset => *l += length,
            _ => map.push((offset, length, kind)),
        }
    }
    map
}

/// NBD block status (`base:allocation`) as a client sees it, on one SSD, an md-style RAID 5,
/// Log-RAID and SWAN volumes (whose maps place every sector), ScalaAFA on its threads (per
/// chunk), one OX SSD and one WAFLASH SSD, each in memory and in files: data only where qemu-io wrote, holes (type 3: hole and zero)
/// elsewhere, and a hole again once the written range is discarded.
#[test]
fn nbdinfo_maps_written_data_and_holes() {
    if !(have("nbdinfo", "command -v nbdinfo") && have("qemu-io", "command -v qemu-io")) {
        return;
    }
    let volumes = [
        ("ssd", ONE_SSD.to_string()),
        ("raid5", RAID5.to_string()),
        ("log-raid", log_raid("")),
        ("swan", swan("")),
        ("scalaafa", scalaafa("")),
        ("ox", include_str!("fixtures/ox_serve.toml").to_string()),
        (
            "waflash",
            "seed = 7\n[waflash.ssd]\nbuffer_bytes = 2097152\n".to_string(),
        ),
    ];
    for ((name, toml), in_memory) in volumes.iter().flat_map(|v| [(v, true), (v, false)]) {
        let s = setup(&format!("block-status-{name}-{in_memory}"), toml);
        let afa = if in_memory {
            s.start_in_memory(&[])
        } else {
            s.start(&[])
        };
        let fresh = allocation_map(&afa.uri);
        assert_eq!(fresh.len(), 1, "{fresh:?}");
        let size = fresh[0].1;
        assert_eq!(fresh[0], (0, size, 3));
        qemu_io(&afa.uri, &["write -P 0x5a 1M 64k", "flush"]);
        let written = allocation_map(&afa.uri);
        let expected = vec![
            (0, 1 << 20, 3),
            (1 << 20, 64 << 10, 0),
            ((1 << 20) + (64 << 10), size - (1 << 20) - (64 << 10), 3),
        ];
        assert_eq!(written, expected, "{name}, in memory: {in_memory}");
        // Whole stripes, so that md-style RAID trims its members (a partial stripe gets
        // zeroes written, keeping the parity right, and stays data).
        qemu_io(&afa.uri, &["discard 1M 1M", "flush", "read -P 0 1M 64k"]);
        let discarded = allocation_map(&afa.uri);
        assert_eq!(discarded, fresh, "{name}, in memory: {in_memory}");
        afa.stop();
    }
}
