//! What the tests of `afa serve` as a process share: a scratch directory, a running server
//! with its state directory, and qemu-io with patterns (-P), which fails on any byte that
//! differs.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A scratch directory that is removed when its test ends without a panic; a failed test
/// keeps its files to look at. Every run would otherwise leave its images and state
/// directories (up to 120 MB each) in the target directory.
pub struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A fresh directory under cargo's target tmpdir, unique to this process and moment.
pub fn scratch(name: &str) -> Scratch {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "serve-{name}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

/// A running `afa serve`, killed (SIGKILL) if still running when dropped.
pub struct Afa {
    pub child: Child,
    pub uri: String,
    /// The "serving ... at URI" line.
    pub line: String,
}

impl Afa {
    /// Starts `afa serve` and waits for its "serving ... at URI" line; without a state
    /// directory the volume is kept in memory.
    pub fn start(config: &Path, socket: &Path, state: Option<&Path>, extra: &[&str]) -> Afa {
        let mut command = Command::new(env!("CARGO_BIN_EXE_afa"));
        command
            .arg("serve")
            .arg(config)
            .arg("--listen")
            .arg(format!("unix:{}", socket.display()));
        if let Some(state) = state {
            command.arg("--state").arg(state);
        }
        let mut child = command
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("afa starts");
        let mut line = String::new();
        let read = BufReader::new(child.stdout.take().unwrap()).read_line(&mut line);
        if !matches!(read, Ok(n) if n > 0) || !line.starts_with("serving") {
            let out = child.wait_with_output().unwrap();
            panic!(
                "afa serve did not start ({}): {line}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let uri = line.trim().rsplit(" at ").next().unwrap().to_string();
        Afa { child, uri, line }
    }

    /// kill -9: the process gets no chance to flush or clean up. Returns what it printed on
    /// stderr.
    pub fn kill_9(mut self) -> String {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.stderr()
    }

    /// An orderly stop (SIGTERM), as an operator or a service manager does it: the server
    /// flushes, exits with success and records the stop as clean. Returns what it printed
    /// on stderr.
    pub fn stop(mut self) -> String {
        let pid = self.child.id().to_string();
        let status = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(10);
        let exit = loop {
            if let Some(exit) = self.child.try_wait().unwrap() {
                break exit;
            }
            assert!(Instant::now() < deadline, "afa serve ignored SIGTERM");
            std::thread::sleep(Duration::from_millis(10));
        };
        let stderr = self.stderr();
        assert!(exit.success(), "afa serve stopped with {exit}: {stderr}");
        stderr
    }

    /// Sends SIGTERM and then SIGINT at once, as an impatient operator or a service manager
    /// that escalates does; returns the exit status (within 10 s) and stderr.
    pub fn stop_twice(mut self) -> (std::process::ExitStatus, String) {
        // The shell's built-in kill sends both within microseconds, before the stop can
        // have finished.
        let pid = self.child.id();
        let status = Command::new("sh")
            .arg("-c")
            .arg(format!("kill -TERM {pid} && kill -INT {pid}"))
            .status()
            .unwrap();
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(10);
        let exit = loop {
            if let Some(exit) = self.child.try_wait().unwrap() {
                break exit;
            }
            assert!(
                Instant::now() < deadline,
                "afa serve ignored two stop signals"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        (exit, self.stderr())
    }

    fn stderr(&mut self) -> String {
        let mut stderr = String::new();
        if let Some(mut pipe) = self.child.stderr.take() {
            let _ = pipe.read_to_string(&mut stderr);
        }
        stderr
    }
}

impl Drop for Afa {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs qemu-io commands on `uri`; fails on an error or a pattern mismatch.
pub fn qemu_io<S: AsRef<str>>(uri: &str, commands: &[S]) {
    qemu_io_opened(&[], uri, commands);
}

/// `qemu_io` on an export opened read-only (`-r`), as a read-only export must be.
pub fn qemu_io_read_only<S: AsRef<str>>(uri: &str, commands: &[S]) {
    qemu_io_opened(&["-r"], uri, commands);
}

fn qemu_io_opened<S: AsRef<str>>(open_flags: &[&str], uri: &str, commands: &[S]) {
    let mut args = open_flags.to_vec();
    args.extend(["-f", "raw"]);
    for c in commands {
        args.extend(["-c", c.as_ref()]);
    }
    args.push(uri);
    let out = Command::new("qemu-io").args(&args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && !text.contains("failed") && !text.contains("error"),
        "qemu-io ({} commands, first {:?}): {text}{}",
        commands.len(),
        commands.first().map(|c| c.as_ref()),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A volume's configuration, its socket and its state directory in a scratch directory.
pub struct Setup {
    /// The scratch directory holding the rest.
    pub dir: Scratch,
    pub config: PathBuf,
    pub socket: PathBuf,
    pub state: PathBuf,
}

/// Writes `toml` as the configuration of a fresh scratch directory named after `name`.
pub fn setup(name: &str, toml: &str) -> Setup {
    let dir = scratch(name);
    let config = dir.join("volume.toml");
    std::fs::write(&config, toml).unwrap();
    Setup {
        socket: dir.join("afa.sock"),
        state: dir.join("state"),
        config,
        dir,
    }
}

impl Setup {
    /// Starts a server on this volume with `extra` arguments.
    pub fn start(&self, extra: &[&str]) -> Afa {
        Afa::start(&self.config, &self.socket, Some(&self.state), extra)
    }

    /// Starts a server on this volume kept in memory (no `--state`).
    pub fn start_in_memory(&self, extra: &[&str]) -> Afa {
        Afa::start(&self.config, &self.socket, None, extra)
    }

    /// Runs `afa serve CONFIG --listen unix:SOCKET --state DIR` with this volume's state
    /// directory, expecting the start to be refused (exit status 2); returns its stderr.
    pub fn refused_start(&self, config: &Path, socket: &Path) -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_afa"))
            .arg("serve")
            .arg(config)
            .arg("--listen")
            .arg(format!("unix:{}", socket.display()))
            .arg("--state")
            .arg(&self.state)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        stderr
    }
}

/// Writes a pattern to the first 4 MiB and flushes, then kills the server (kill -9) while
/// fio writes at random (QD 32) to `load_mib` MiB from 8 MiB on; the restart still reads
/// the flushed pattern and takes new writes. Needs qemu-io and fio.
pub fn kill_9_under_load_keeps_the_flushed_region(name: &str, toml: &str, load_mib: u64) {
    if !(super::have("qemu-io", "command -v qemu-io") && super::have("fio", "command -v fio")) {
        return;
    }
    let s = setup(name, toml);
    let afa = s.start(&["--pace", "model"]);
    qemu_io(&afa.uri, &["write -P 0x99 0 4M", "flush"]);
    // Random writes to another region, killed while in flight.
    let mut fio = Command::new("fio")
        .args([
            "--name=load",
            "--ioengine=nbd",
            &format!("--uri={}", afa.uri),
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=32",
            "--offset=8m",
            &format!("--size={load_mib}m"),
            "--time_based",
            "--runtime=30",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    afa.kill_9();
    let _ = fio.kill();
    let _ = fio.wait();
    let afa = s.start(&[]);
    qemu_io(&afa.uri, &["read -P 0x99 0 4M"]);
    // The volume takes new writes after the crash.
    qemu_io(&afa.uri, &["write -P 0x12 5M 64k", "read -P 0x12 5M 64k"]);
}

/// Small emulated SSDs (2 channels, 2 dies each, 32 blocks of 64 pages of 4 KiB per plane).
const SMALL_SSDS: &str = r#"
[ssd]
over_provisioning = 0.15
[ssd.geometry]
channels = 2
chips_per_channel = 1
dies_per_chip = 2
planes_per_die = 1
blocks_per_plane = 32
pages_per_block = 64
page_bytes = 4096
sector_bytes = 4096
"#;

/// ScalaAFA (2+1) over three small SSDs whose transient areas (2 MiB each) are far smaller
/// than the volume, so writing it converts stripes inside the member files; `array_extra`
/// is added to `[array]`, and keys of `[array.scalaafa]` may follow the text.
pub fn scalaafa(array_extra: &str) -> String {
    format!(
        r#"
seed = 7
[ssd]
over_provisioning = 0.25
[ssd.geometry]
channels = 2
chips_per_channel = 1
dies_per_chip = 2
planes_per_die = 1
blocks_per_plane = 32
pages_per_block = 64
page_bytes = 4096
sector_bytes = 4096
oob_bytes_per_page = 24
[ssd.slc_cache]
capacity_bytes = 2097152
eviction = "transient"
[array]
level = "raid5"
members = 3
chunk_bytes = 65536
{array_extra}
[array.scalaafa]
mode = "scalaafa"
transient_bytes = 2097152
io_threads = 2
"#
    )
}

/// SWAN over two R-groups of RAID 5 (2 data + 1 parity) on six small SSDs, 1 MiB segments:
/// writing the volume a few times over makes the back-end clean segments. `array_extra` is
/// added to `[array]`.
pub fn swan(array_extra: &str) -> String {
    format!(
        "seed = 9\n{SMALL_SSDS}[array]\nlevel = \"raid5\"\nmembers = 6\nchunk_bytes = 65536\n{array_extra}\n[array.swan]\ngroups = 2\nsegment_bytes = 1048576\nspare_fraction = 0.3\n"
    )
}

/// Log-RAID over a RAID 5 of three small SSDs (about 27 MiB each), 1 MiB segments;
/// `array_extra` is added to `[array]`.
pub fn log_raid(array_extra: &str) -> String {
    format!(
        "seed = 11\n{SMALL_SSDS}[array]\nlevel = \"raid5\"\nmembers = 3\nchunk_bytes = 65536\n{array_extra}\n[array.log]\nsegment_stripes = 8\nspare_fraction = 0.2\n"
    )
}

/// The seed and geometry of a small emulated SSD (about 15 MiB), as configuration text.
macro_rules! small_ssd {
    () => {
        r#"
seed = 5
[ssd.geometry]
channels = 2
chips_per_channel = 1
dies_per_chip = 1
planes_per_die = 1
blocks_per_plane = 64
pages_per_block = 32
"#
    };
}

/// One small emulated SSD, no array.
pub const ONE_SSD: &str = small_ssd!();

/// A small RAID 5 of three emulated SSDs (about 30 MiB): a static layout, so its member
/// files are the whole state.
pub const RAID5: &str = concat!(
    small_ssd!(),
    r#"[array]
level = "raid5"
members = 3
"#
);
