//! Helpers shared by the serve tests: servers over small devices, a raw NBD client for
//! protocol-level checks, and the rule for clients that are not installed.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;

use afa_serve::proto::*;
use afa_serve::{ListenAddr, MemDevice, Pace, RunningServer, ServeConfig, Server};
use afa_ssd::BlockDevice;

/// A server on an ephemeral loopback port over `device`.
pub fn serve(device: Box<dyn BlockDevice + Send>, pace: Pace) -> RunningServer {
    serve_with(device, |c| c.pace = pace)
}

pub fn serve_with(
    device: Box<dyn BlockDevice + Send>,
    tweak: impl FnOnce(&mut ServeConfig),
) -> RunningServer {
    let mut config = ServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        ..ServeConfig::default()
    };
    tweak(&mut config);
    Server::bind(config, device).unwrap().spawn().unwrap()
}

/// A RAM disk of `mib` MiB with 4 KiB sectors.
pub fn mem(mib: u64) -> Box<dyn BlockDevice + Send> {
    Box::new(MemDevice::new(4096, mib * 256).unwrap())
}

/// A small emulated SSD storing full bytes (8 MiB raw).
pub fn small_ssd() -> afa_ssd::Ssd {
    let mut cfg = afa_ssd::SsdConfig::default();
    cfg.geometry.channels = 2;
    cfg.geometry.chips_per_channel = 1;
    cfg.geometry.dies_per_chip = 1;
    cfg.geometry.planes_per_die = 1;
    cfg.geometry.blocks_per_plane = 64;
    cfg.geometry.pages_per_block = 16;
    cfg.payload = afa_nand::PayloadMode::Full;
    afa_ssd::Ssd::new(cfg, 7).unwrap()
}

/// Whether a client program is installed. Under CI=true a missing client is a failure;
/// elsewhere the test is skipped with a note.
pub fn have(program: &str) -> bool {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {program}"))
        .env("PATH", path_with_sbin())
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !found {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("{program} is not installed, and CI=true requires every client (see .ci/run)");
        }
        eprintln!("skipping: {program} is not installed (install it to run this test)");
    }
    found
}

/// PATH with the system directories where mkfs.ext4, fsck.ext4 and losetup live, which a
/// non-root user's PATH often lacks.
pub fn path_with_sbin() -> String {
    let path = std::env::var("PATH").unwrap_or_default();
    format!("{path}:/usr/sbin:/sbin")
}

/// Runs a command and returns its stdout; fails the test with its output otherwise.
pub fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .env("PATH", path_with_sbin())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{program} {args:?} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    stdout
}

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

/// A fresh scratch directory under the target directory.
pub fn scratch(name: &str) -> Scratch {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "{name}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

pub fn tcp_addr(server: &RunningServer) -> std::net::SocketAddr {
    match server.local_addr() {
        ListenAddr::Tcp(a) => *a,
        ListenAddr::Unix(_) => panic!("not a TCP server"),
    }
}

/// A raw NBD client, for what the real clients never send.
pub struct RawClient {
    pub stream: TcpStream,
    pub structured: bool,
}

/// One option reply.
#[derive(Debug)]
pub struct OptReply {
    pub option: u32,
    pub kind: u32,
    pub data: Vec<u8>,
}

/// One transmission reply: the errno and (for reads) the data, plus a structured error's
/// message.
#[derive(Debug)]
pub struct CmdReply {
    pub handle: u64,
    pub errno: u32,
    pub data: Vec<u8>,
    pub message: String,
}

impl RawClient {
    /// Connects and reads the greeting; returns the handshake flags.
    pub fn connect(server: &RunningServer) -> (Self, u16) {
        let mut stream = TcpStream::connect(tcp_addr(server)).unwrap();
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let mut greet = [0u8; 18];
        stream.read_exact(&mut greet).unwrap();
        assert_eq!(&greet[0..8], b"NBDMAGIC");
        assert_eq!(&greet[8..16], b"IHAVEOPT");
        let flags = u16::from_be_bytes([greet[16], greet[17]]);
        (
            Self {
                stream,
                structured: false,
            },
            flags,
        )
    }

    pub fn send_client_flags(&mut self, flags: u32) {
        self.stream.write_all(&flags.to_be_bytes()).unwrap();
    }

    pub fn send_option(&mut self, option: u32, data: &[u8]) {
        let mut m = Vec::new();
        m.extend_from_slice(&IHAVEOPT.to_be_bytes());
        m.extend_from_slice(&option.to_be_bytes());
        m.extend_from_slice(&(data.len() as u32).to_be_bytes());
        m.extend_from_slice(data);
        self.stream.write_all(&m).unwrap();
    }

    pub fn read_opt_reply(&mut self) -> OptReply {
        let mut h = [0u8; 20];
        self.stream.read_exact(&mut h).unwrap();
        assert_eq!(
            u64::from_be_bytes(h[0..8].try_into().unwrap()),
            OPTION_REPLY_MAGIC
        );
        let option = u32::from_be_bytes(h[8..12].try_into().unwrap());
        let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
        let mut data = vec![0u8; len as usize];
        self.stream.read_exact(&mut data).unwrap();
        OptReply { option, kind, data }
    }

    /// Sends NBD_OPT_GO for `name`; returns every reply up to the final one.
    pub fn go(&mut self, name: &str, infos: &[u16]) -> Vec<OptReply> {
        let mut d = Vec::new();
        d.extend_from_slice(&(name.len() as u32).to_be_bytes());
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
        for i in infos {
            d.extend_from_slice(&i.to_be_bytes());
        }
        self.send_option(OPT_GO, &d);
        let mut replies = Vec::new();
        loop {
            let r = self.read_opt_reply();
            let last = r.kind != REP_INFO;
            replies.push(r);
            if last {
                return replies;
            }
        }
    }

    /// A full fixed-newstyle handshake onto the default export.
    pub fn open(server: &RunningServer, structured: bool) -> Self {
        let (mut c, _) = Self::connect(server);
        c.send_client_flags(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
        if structured {
            c.send_option(OPT_STRUCTURED_REPLY, &[]);
            assert_eq!(c.read_opt_reply().kind, REP_ACK);
            c.structured = true;
        }
        let replies = c.go("", &[]);
        assert_eq!(replies.last().unwrap().kind, REP_ACK, "{replies:?}");
        c
    }

    pub fn send_request(
        &mut self,
        flags: u16,
        kind: u16,
        handle: u64,
        offset: u64,
        length: u32,
        data: &[u8],
    ) {
        let mut m = Vec::with_capacity(28 + data.len());
        m.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        m.extend_from_slice(&flags.to_be_bytes());
        m.extend_from_slice(&kind.to_be_bytes());
        m.extend_from_slice(&handle.to_be_bytes());
        m.extend_from_slice(&offset.to_be_bytes());
        m.extend_from_slice(&length.to_be_bytes());
        m.extend_from_slice(data);
        self.stream.write_all(&m).unwrap();
    }

    /// Reads one reply; `read_len` is the data length expected if it answers a read.
    pub fn read_reply(&mut self, read_len: usize) -> CmdReply {
        let mut magic = [0u8; 4];
        self.stream.read_exact(&mut magic).unwrap();
        match u32::from_be_bytes(magic) {
            SIMPLE_REPLY_MAGIC => {
                let mut h = [0u8; 12];
                self.stream.read_exact(&mut h).unwrap();
                let errno = u32::from_be_bytes(h[0..4].try_into().unwrap());
                let handle = u64::from_be_bytes(h[4..12].try_into().unwrap());
                let mut data = vec![0u8; if errno == 0 { read_len } else { 0 }];
                self.stream.read_exact(&mut data).unwrap();
                CmdReply {
                    handle,
                    errno,
                    data,
                    message: String::new(),
                }
            }
            STRUCTURED_REPLY_MAGIC => {
                let mut h = [0u8; 16];
                self.stream.read_exact(&mut h).unwrap();
                let flags = u16::from_be_bytes(h[0..2].try_into().unwrap());
                let kind = u16::from_be_bytes(h[2..4].try_into().unwrap());
                let handle = u64::from_be_bytes(h[4..12].try_into().unwrap());
                let len = u32::from_be_bytes(h[12..16].try_into().unwrap());
                assert_eq!(
                    flags & REPLY_FLAG_DONE,
                    REPLY_FLAG_DONE,
                    "one chunk per reply"
                );
                let mut payload = vec![0u8; len as usize];
                self.stream.read_exact(&mut payload).unwrap();
                match kind {
                    REPLY_TYPE_OFFSET_DATA => CmdReply {
                        handle,
                        errno: 0,
                        data: payload[8..].to_vec(),
                        message: String::new(),
                    },
                    REPLY_TYPE_ERROR => {
                        let errno = u32::from_be_bytes(payload[0..4].try_into().unwrap());
                        let mlen = u16::from_be_bytes(payload[4..6].try_into().unwrap()) as usize;
                        CmdReply {
                            handle,
                            errno,
                            data: Vec::new(),
                            message: String::from_utf8_lossy(&payload[6..6 + mlen]).into_owned(),
                        }
                    }
                    other => panic!("unexpected structured chunk type {other}"),
                }
            }
            other => panic!("bad reply magic {other:#x}"),
        }
    }

    /// Whether the server has closed the connection (reads EOF or a reset).
    pub fn is_closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        match self.stream.read(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            // A timeout means the server kept the connection open.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                false
            }
            Err(_) => true,
        }
    }
}

/// fio's nbd engine against `uri`, every block it writes verified by crc32c afterwards;
/// `extra` names the load (and `--numjobs` for jobs at once). Every job must finish without
/// error and read back at least what it wrote.
pub fn fio_verify(uri: &str, name: &str, extra: &[&str]) {
    let mut args = vec![
        format!("--name={name}"),
        "--ioengine=nbd".into(),
        format!("--uri={uri}"),
        "--verify=crc32c".into(),
        "--do_verify=1".into(),
        "--verify_fatal=1".into(),
        // fio would otherwise leave verify-state files in the working directory.
        "--verify_state_save=0".into(),
        "--output-format=json".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run("fio", &args);
    let json_start = out.find('{').expect("fio prints JSON");
    let report: serde_json::Value = serde_json::from_str(&out[json_start..]).unwrap();
    let jobs = report["jobs"].as_array().expect("fio reports its jobs");
    assert!(!jobs.is_empty(), "fio {name} reported no job:\n{out}");
    for job in jobs {
        assert_eq!(job["error"], 0, "fio {name} reported an error:\n{out}");
        let written = job["write"]["io_bytes"].as_u64().unwrap_or(0);
        let verified = job["read"]["io_bytes"].as_u64().unwrap_or(0);
        assert!(written > 0, "fio {name} wrote nothing:\n{out}");
        // The verify phase reads back everything that was written.
        assert!(
            verified >= written,
            "fio {name} verified {verified} of {written} bytes:\n{out}"
        );
    }
}

/// `len` bytes that differ with `seed` and along the buffer, for write-and-read checks.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}
