//! `afa serve` of one OX SSD (`[ox]`) as a process: its flash image survives an orderly stop,
//! kill -9 and a load that makes GC move pages, and every restart runs OX's own recovery
//! (the newest checkpoint, then redo of the WAL). Data is checked with qemu-io patterns
//! (-P), which fail on any byte that differs.

mod common;
use common::have;
use common::serve::{qemu_io, qemu_io_read_only, Setup};

/// A small OX SSD: 4 channels × 2 LUNs × 80 EBLOCKs of 64 KiB (40 MiB of flash) exposing
/// 4000 pages of 4 KiB (15.6 MiB), so that writing the volume three times over makes GC
/// collect EBLOCKs; checkpoints every 20 ms of device time.
const OX: &str = include_str!("fixtures/ox_serve.toml");

/// Bytes of the volume: 4000 pages of 4 KiB.
const VOLUME_BYTES: u64 = 4000 * 4096;

fn cmds(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// The OX volume above in a fresh scratch directory.
fn setup(name: &str) -> Setup {
    common::serve::setup(&format!("ox-{name}"), OX)
}

/// The recovery line a restart prints, or a panic naming what was printed instead.
fn recovery_line(stderr: &str) -> &str {
    stderr
        .lines()
        .find(|l| l.contains("OX recovered"))
        .unwrap_or_else(|| panic!("no recovery was logged: {stderr}"))
}

#[test]
fn ox_stop_and_restart_keep_every_flushed_write() {
    if !have("qemu-io", "command -v qemu-io") {
        return;
    }
    let s = setup("restart");
    let afa = s.start(&["--pace", "none"]);
    qemu_io(
        &afa.uri,
        &cmds(&[
            "write -P 0x5a 0 1M",
            "write -P 0xa5 3M 64k",
            "write -P 0x33 5000 3000",
            "flush",
        ]),
    );
    let stderr = afa.stop();
    assert!(
        !stderr.contains("OX recovered"),
        "a fresh start formats: {stderr}"
    );
    assert!(s.state.join("ox-flash.img").exists());
    let afa = s.start(&["--pace", "model"]);
    qemu_io(
        &afa.uri,
        &cmds(&[
            "read -P 0x5a 0 4096",
            "read -P 0x33 5000 3000",
            "read -P 0x5a 8000 1040576",
            "read -P 0xa5 3M 64k",
            "read -P 0 4M 64k",
        ]),
    );
    let stderr = afa.stop();
    // Recovery runs after an orderly stop too: OX keeps its tables in DRAM.
    assert!(
        recovery_line(&stderr).contains("after an orderly stop"),
        "{stderr}"
    );
    let afa = s.start(&[]);
    qemu_io(&afa.uri, &cmds(&["read -P 0xa5 3M 64k"]));
}

#[test]
fn ox_kill_9_keeps_every_flushed_and_every_acknowledged_write() {
    if !have("qemu-io", "command -v qemu-io") {
        return;
    }
    let s = setup("kill9");
    let afa = s.start(&["--pace", "model"]);
    qemu_io(&afa.uri, &cmds(&["write -P 0x42 1M 2M", "flush"]));
    // Acknowledged but never flushed: a program reaches the image (pwrite) before the
    // controller can acknowledge the write, so a killed process loses none of it.
    qemu_io(
        &afa.uri,
        &cmds(&["write -P 0x17 5M 256k", "write -P 0x18 1M 8k"]),
    );
    afa.kill_9();
    let afa = s.start(&[]);
    qemu_io(
        &afa.uri,
        &cmds(&[
            "read -P 0x18 1M 8k",
            "read -P 0x42 1032k 2040k",
            "read -P 0x17 5M 256k",
        ]),
    );
    // The recovered device takes new writes, and recovers them after another kill.
    qemu_io(
        &afa.uri,
        &cmds(&["write -P 0x12 9M 64k", "read -P 0x12 9M 64k"]),
    );
    let stderr = afa.kill_9();
    assert!(
        recovery_line(&stderr).contains("after an unclean stop"),
        "{stderr}"
    );
    let afa = s.start(&[]);
    qemu_io(
        &afa.uri,
        &cmds(&["read -P 0x12 9M 64k", "read -P 0x17 5M 256k"]),
    );
}

/// With the write-back cache a write is answered from the controller's DRAM: it reads back
/// at once, a FLUSH (or an orderly stop) drains the cache into the image, and a kill -9
/// after the flush keeps every write.
#[test]
fn ox_with_a_write_back_cache_serves_its_cache_and_keeps_what_a_flush_drained() {
    if !have("qemu-io", "command -v qemu-io") {
        return;
    }
    let config = OX.replace(
        "[ox.write_cache]\n",
        "[ox.write_cache]\nwrite_back = true\n",
    );
    assert_ne!(config, OX);
    let s = common::serve::setup("ox-write-back", &config);
    let afa = s.start(&["--pace", "model"]);
    qemu_io(
        &afa.uri,
        &cmds(&[
            "write -P 0x61 0 2M",
            "write -P 0x62 64k 8k",
            "read -P 0x62 64k 8k",
            "read -P 0x61 72k 1976k",
            "flush",
            "write -P 0x63 3M 256k",
            "flush",
        ]),
    );
    afa.kill_9();
    let afa = s.start(&[]);
    qemu_io(
        &afa.uri,
        &cmds(&[
            "read -P 0x61 0 64k",
            "read -P 0x62 64k 8k",
            "read -P 0x61 72k 1976k",
            "read -P 0x63 3M 256k",
            "write -P 0x64 5M 64k",
        ]),
    );
    // The orderly stop flushes: the write above survives it.
    afa.stop();
    let afa = s.start(&[]);
    qemu_io(&afa.uri, &cmds(&["read -P 0x64 5M 64k"]));
}

/// A deterministic stream of offsets for the random writes.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

#[test]
fn ox_kill_9_after_a_load_that_makes_gc_move_pages_keeps_every_write() {
    if !have("qemu-io", "command -v qemu-io") {
        return;
    }
    let s = setup("gc");
    let afa = s.start(&["--pace", "none"]);
    let pages = VOLUME_BYTES / 4096;
    // The pattern byte of every 4 KiB page, as the host last wrote it.
    let mut oracle = vec![0u8; pages as usize];
    let mut rng = Lcg(3);
    let mut pattern = 0u8;
    // Two sequential passes over the whole volume, each followed by random 8 KiB
    // overwrites: more than three times the volume in all, over 40 MiB of flash, so GC
    // must collect EBLOCKs, and the random overwrites leave victims with live pages to move.
    for _ in 0..2 {
        pattern = pattern.wrapping_add(1);
        qemu_io(
            &afa.uri,
            &[format!("write -P {pattern:#x} 0 {VOLUME_BYTES}")],
        );
        oracle.fill(pattern);
        let mut writes = Vec::new();
        for _ in 0..1000 {
            pattern = pattern.wrapping_add(1).max(1);
            let page = rng.below(pages - 1);
            writes.push(format!("write -P {pattern:#x} {} 8k", page * 4096));
            oracle[page as usize] = pattern;
            oracle[page as usize + 1] = pattern;
        }
        qemu_io(&afa.uri, &writes);
    }
    // No flush: every write was acknowledged, and that is enough against kill -9.
    afa.kill_9();
    let afa = s.start(&[]);
    let mut reads = Vec::new();
    let mut start = 0usize;
    for i in 1..=oracle.len() {
        if i == oracle.len() || oracle[i] != oracle[start] {
            reads.push(format!(
                "read -P {:#x} {} {}",
                oracle[start],
                start * 4096,
                (i - start) * 4096
            ));
            start = i;
        }
    }
    qemu_io(&afa.uri, &reads);
    let stderr = afa.stop();
    let line = recovery_line(&stderr);
    // The volume was written more than three times over 40 MiB of flash (640 EBLOCKs): GC
    // must have erased data EBLOCKs, and the medium's erase counts came back from the image.
    let erases: u64 = line
        .rsplit("; ")
        .next()
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no erase count in {line}"));
    assert!(
        erases > 100,
        "only {erases} erases: GC did not run ({line})"
    );
}

#[test]
fn ox_state_refuses_another_medium() {
    let s = setup("shape");
    let afa = s.start(&[]);
    afa.stop();
    std::fs::write(
        &s.config,
        OX.replace("eblocks_per_lun = 80", "eblocks_per_lun = 96"),
    )
    .unwrap();
    let err = s.refused_start(&s.config, &s.socket);
    assert!(err.contains("holds a volume made as"), "{err}");
}

/// A served OX SSD whose grown bad blocks took every free EBLOCK while it was stopped
/// comes back read-only instead of not at all: recovery needs free EBLOCKs for the log and
/// its checkpoint. Every write made before can be read, the export says it is read-only,
/// and a write is refused.
#[test]
fn ox_without_free_eblocks_comes_back_read_only_and_serves_every_write() {
    if !have("qemu-io", "command -v qemu-io") {
        return;
    }
    let s = setup("worn");
    let afa = s.start(&["--pace", "none"]);
    qemu_io(
        &afa.uri,
        &cmds(&["write -P 0x6c 0 2M", "write -P 0x9e 7M 1M", "flush"]),
    );
    afa.stop();

    #[derive(serde::Deserialize)]
    struct Volume {
        ox: afa_ox::OxConfig,
    }
    let volume: Volume = toml::from_str(OX).unwrap();
    let image = afa_ox::FlashImage::open(&s.state.join("ox-flash.img"), &volume.ox).unwrap();
    let (mut media, _) = afa_ox::Media::restore(&volume.ox, 11, image).unwrap();
    assert!(media.retire_every_free_eblock().unwrap() > 0);
    media.image_mut().unwrap().sync().unwrap();
    drop(media);

    let afa = s.start(&["--pace", "none"]);
    assert!(afa.line.contains(", read-only) at "), "{}", afa.line);
    qemu_io_read_only(
        &afa.uri,
        &cmds(&["read -P 0x6c 0 2M", "read -P 0x9e 7M 1M", "read -P 0 3M 1M"]),
    );
    let write = std::process::Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write -P 0x11 0 4k", &afa.uri])
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&write.stdout),
        String::from_utf8_lossy(&write.stderr)
    );
    // qemu refuses to open a read-only export for writing.
    assert!(
        !write.status.success() && said.contains("Permission denied"),
        "a write to the read-only export went through: {said}"
    );
    let stderr = afa.stop();
    assert!(stderr.contains("OX came up read-only"), "{stderr}");
    // Nothing was written: the next start finds the same device, read-only again.
    let afa = s.start(&[]);
    qemu_io_read_only(&afa.uri, &cmds(&["read -P 0x6c 0 2M"]));
    let stderr = afa.stop();
    assert!(stderr.contains("OX came up read-only"), "{stderr}");
}
