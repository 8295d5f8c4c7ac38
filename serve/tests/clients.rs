//! Real NBD clients from Debian packages against the server: qemu-io, qemu-img, nbdinfo,
//! nbdcopy, fio's nbd engine and a real ext4 file system through nbdfuse and a loop
//! device. A missing client fails the test under CI=true and skips it otherwise.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use afa_serve::Pace;
use afa_ssd::BlockDevice;
use common::*;

const MIB: u64 = 1 << 20;

/// A RAID 5 array of three small emulated SSDs storing full bytes: the array engine as
/// the served volume.
fn raid5(blocks_per_plane: u32) -> Box<dyn BlockDevice + Send> {
    let members = (0..3)
        .map(|i| {
            let mut cfg = afa_ssd::SsdConfig::default();
            cfg.geometry.channels = 2;
            cfg.geometry.chips_per_channel = 1;
            cfg.geometry.dies_per_chip = 1;
            cfg.geometry.planes_per_die = 1;
            cfg.geometry.blocks_per_plane = blocks_per_plane;
            cfg.geometry.pages_per_block = 32;
            cfg.payload = afa_nand::PayloadMode::Full;
            afa_ssd::Ssd::new(cfg, 100 + i).unwrap()
        })
        .collect();
    let config = afa_array::ArrayConfig {
        level: afa_array::Level::Raid5,
        members: 3,
        ..afa_array::ArrayConfig::default()
    };
    Box::new(afa_array::Array::new(config, members, Vec::new()).unwrap())
}

/// qemu-io fails loudly on I/O errors but only prints a pattern mismatch, so both the exit
/// status and the output are checked.
fn qemu_io(uri: &str, commands: &[&str]) -> String {
    let mut args = vec!["-f", "raw"];
    for c in commands {
        args.push("-c");
        args.push(c);
    }
    args.push(uri);
    let out = run("qemu-io", &args);
    assert!(
        !out.contains("failed") && !out.contains("error"),
        "qemu-io {commands:?}:\n{out}"
    );
    out
}

#[test]
fn qemu_io_writes_reads_patterns_discards_and_flushes() {
    if !have("qemu-io") {
        return;
    }
    for pace in [Pace::Model, Pace::None] {
        let server = serve(Box::new(small_ssd()), pace);
        let uri = server.uri().to_string();
        qemu_io(
            &uri,
            &[
                "write -P 0xab 0 64k",
                "write -P 0xcd 64k 4k",
                "write -P 0x11 70000 3000",
                "flush",
                "read -P 0xab 0 64k",
                "read -P 0xcd 64k 4k",
                "read -P 0x11 70000 3000",
                "write -z 128k 32k",
                "read -P 0 128k 32k",
                "discard 0 64k",
                "read -P 0 0 64k",
                "read -P 0xcd 64k 4k",
            ],
        );
        // A wrong pattern must be detected, so the checks above can fail.
        let out = Command::new("qemu-io")
            .args(["-f", "raw", "-c", "read -P 0xee 64k 4k", &uri])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("Pattern verification failed"), "{text}");
        server.stop();
    }
}

#[test]
fn qemu_img_convert_into_the_export_and_compare_back() {
    if !have("qemu-img") {
        return;
    }
    let server = serve(raid5(64), Pace::None);
    let size = server.size_bytes();
    let dir = scratch("qemu-img");
    let image = dir.join("source.img");
    // Half random bytes, half zeroes, so both data and sparse regions are copied.
    let mut bytes: Vec<u8> = (0..size / 2)
        .map(|i| ((i * 2654435761) >> 13) as u8)
        .collect();
    bytes.resize(size as usize, 0);
    std::fs::write(&image, &bytes).unwrap();
    let uri = server.uri().to_string();
    let image_s = image.to_str().unwrap();
    run(
        "qemu-img",
        &["convert", "-n", "-f", "raw", "-O", "raw", image_s, &uri],
    );
    let out = run(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", image_s, &uri],
    );
    assert!(out.contains("Images are identical"), "{out}");
    // Change one byte of the source: compare must now see a difference.
    bytes[12345] ^= 0xff;
    std::fs::write(&image, &bytes).unwrap();
    let status = Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw", image_s, &uri])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(
        status.code(),
        Some(1),
        "qemu-img compare must report the difference"
    );
}

#[test]
fn nbdinfo_shows_the_size_and_description() {
    if !have("nbdinfo") {
        return;
    }
    let server = serve_with(mem(3), |c| c.description = "raid test volume".into());
    let size = run("nbdinfo", &["--size", server.uri()]);
    assert_eq!(size.trim(), (3 * MIB).to_string());
    let info = run("nbdinfo", &[server.uri()]);
    assert!(info.contains("raid test volume"), "{info}");
    assert!(
        info.contains("can_flush: true") && info.contains("can_multi_conn: true"),
        "{info}"
    );
    // A name the server does not export is refused with its message.
    let wrong = server.uri().replace("/afa", "/other");
    let out = Command::new("nbdinfo").arg(&wrong).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("other"), "{err}");
}

#[test]
fn nbdcopy_round_trips_a_file() {
    if !have("nbdcopy") {
        return;
    }
    let server = serve(Box::new(small_ssd()), Pace::Model);
    let size = server.size_bytes();
    let dir = scratch("nbdcopy");
    let src = dir.join("in.bin");
    let dst = dir.join("out.bin");
    let bytes: Vec<u8> = (0..size).map(|i| (i * 7 + i / 4096) as u8).collect();
    std::fs::write(&src, &bytes).unwrap();
    std::fs::write(&dst, b"").unwrap();
    run("nbdcopy", &[src.to_str().unwrap(), server.uri()]);
    run("nbdcopy", &[server.uri(), dst.to_str().unwrap()]);
    let back = std::fs::read(&dst).unwrap();
    assert!(back == bytes, "nbdcopy round trip differs");
}

#[test]
fn fio_nbd_engine_verifies_random_and_sequential_writes() {
    if !have("fio") {
        return;
    }
    let server = serve(raid5(64), Pace::Model);
    let uri = server.uri().to_string();
    fio_verify(
        &uri,
        "randwrite",
        &["--rw=randwrite", "--bs=4k", "--iodepth=16", "--size=4m"],
    );
    fio_verify(
        &uri,
        "seqwrite",
        &["--rw=write", "--bs=64k", "--iodepth=8", "--size=6m"],
    );
    let server = serve(Box::new(small_ssd()), Pace::None);
    fio_verify(
        server.uri(),
        "randrw",
        &[
            "--rw=randwrite",
            "--bsrange=4k-64k",
            "--iodepth=32",
            "--size=4m",
        ],
    );
}

/// Undoes the mounts and devices of the file-system test, whatever happened.
struct FsCleanup {
    mount: std::path::PathBuf,
    loop_dev: Option<String>,
    fuse_dir: std::path::PathBuf,
    nbdfuse: Option<Child>,
}

impl Drop for FsCleanup {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg(&self.mount)
            .stderr(Stdio::null())
            .status();
        if let Some(dev) = &self.loop_dev {
            let _ = Command::new("losetup")
                .args(["-d", dev])
                .env("PATH", path_with_sbin())
                .status();
        }
        let _ = Command::new("fusermount3")
            .arg("-u")
            .arg(&self.fuse_dir)
            .stderr(Stdio::null())
            .status();
        if let Some(mut child) = self.nbdfuse.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Whether this machine lets the test use FUSE, loop devices and mount (root in a
/// container with /dev/fuse and loop devices). Under CI=true they must be there.
fn fs_capable() -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    let ok = root && Path::new("/dev/fuse").exists() && Path::new("/dev/loop-control").exists();
    if !ok {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("the file-system test needs root, /dev/fuse and loop devices under CI=true");
        }
        eprintln!("skipping: the file-system test needs root, /dev/fuse and loop devices");
    }
    ok
}

fn wait_for(path: &Path, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} did not appear",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn ext4_through_nbdfuse_and_a_loop_device_survives_fsck_and_remount() {
    // Root, FUSE and loop devices first: without them the tools do not matter.
    if !(fs_capable()
        && have("nbdfuse")
        && have("mkfs.ext4")
        && have("fsck.ext4")
        && have("losetup")
        && have("fusermount3"))
    {
        return;
    }
    let server = serve(raid5(256), Pace::Model);
    assert!(server.size_bytes() >= 24 * MIB, "ext4 needs some room");
    let dir = scratch("ext4");
    let fuse_dir = dir.join("fuse");
    let mount = dir.join("mnt");
    std::fs::create_dir_all(&fuse_dir).unwrap();
    std::fs::create_dir_all(&mount).unwrap();
    let disk = fuse_dir.join("disk");
    let mut cleanup = FsCleanup {
        mount: mount.clone(),
        loop_dev: None,
        fuse_dir: fuse_dir.clone(),
        nbdfuse: None,
    };
    let child = Command::new("nbdfuse")
        .arg(&disk)
        .arg(server.uri())
        .spawn()
        .expect("nbdfuse starts");
    cleanup.nbdfuse = Some(child);
    wait_for(&disk, Duration::from_secs(10));
    let dev = run("losetup", &["-f", "--show", disk.to_str().unwrap()])
        .trim()
        .to_string();
    cleanup.loop_dev = Some(dev.clone());
    run("mkfs.ext4", &["-q", "-F", &dev]);
    let mnt = mount.to_str().unwrap();
    run("mount", &[&dev, mnt]);
    // A tree to copy: this crate's sources and a few generated files.
    let tree = dir.join("tree");
    std::fs::create_dir_all(tree.join("sub/deeper")).unwrap();
    for i in 0..20u32 {
        let body: Vec<u8> = (0..(i * 9973 % 200_000)).map(|b| (b ^ i) as u8).collect();
        std::fs::write(tree.join(format!("sub/file{i}.bin")), body).unwrap();
    }
    std::fs::write(tree.join("sub/deeper/note.txt"), "afa serve ext4 test\n").unwrap();
    run(
        "cp",
        &[
            "-a",
            concat!(env!("CARGO_MANIFEST_DIR"), "/src"),
            tree.to_str().unwrap(),
        ],
    );
    run("cp", &["-a", tree.to_str().unwrap(), mnt]);
    run("umount", &[mnt]);
    let fsck = run("fsck.ext4", &["-n", "-f", &dev]);
    eprintln!("fsck.ext4 -n: {fsck}");
    assert!(fsck.contains("clean") || fsck.contains("Pass 5"), "{fsck}");
    assert!(!fsck.contains("UNEXPECTED"), "{fsck}");
    run("mount", &[&dev, mnt]);
    run(
        "diff",
        &[
            "-r",
            tree.to_str().unwrap(),
            mount.join("tree").to_str().unwrap(),
        ],
    );
    run("umount", &[mnt]);
    drop(cleanup);
}
