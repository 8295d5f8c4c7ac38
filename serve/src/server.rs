//! The listener and the connection threads. Each connection has a reader thread (the
//! handshake, then requests to the engine) and a writer thread (replies back to the
//! client); they share nothing but channels.

use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, TrySendError};

use crate::engine::{
    shutdown_failure, EngineHandle, EngineSender, EngineStats, InlineJob, Job, Pace, Reply,
};
use crate::proto::{ExportInfo, Limits, Negotiation, Request};
use crate::session::{
    handshake, read_requests, rejected_reply, write_reply, BurstBuffer, BurstReader, End, Incoming,
    Linger, Parsed, SessionError,
};
use crate::{log, ServeError, SharedVolume};

/// Where the server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl FromStr for ListenAddr {
    type Err = ServeError;

    /// `IP:PORT` (e.g. `127.0.0.1:10809`, `[::1]:10809`) or `unix:/path/to.sock`.
    fn from_str(s: &str) -> Result<Self, ServeError> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(ServeError::Listen(format!(
                    "{s:?}: the unix: form needs a socket path, as in unix:/tmp/afa.sock"
                )));
            }
            return Ok(ListenAddr::Unix(PathBuf::from(path)));
        }
        s.parse::<SocketAddr>().map(ListenAddr::Tcp).map_err(|_| {
            ServeError::Listen(format!(
                "{s:?} is neither IP:PORT (as in 127.0.0.1:10809) nor unix:/path/to.sock"
            ))
        })
    }
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddr::Tcp(a) => write!(f, "{a}"),
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// The largest `max_request_bytes` accepted (256 MiB).
pub const MAX_REQUEST_CEILING_BYTES: u32 = 256 << 20;

/// The NBD default port (IANA).
pub const DEFAULT_PORT: u16 = 10809;

/// Everything the server needs besides the device.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub listen: ListenAddr,
    pub export_name: String,
    pub description: String,
    pub pace: Pace,
    /// Connections served at once; further ones are refused during the handshake.
    pub max_connections: usize,
    /// The largest READ or WRITE payload; larger requests get EINVAL.
    pub max_request_bytes: u32,
    /// How long a client may take over the handshake before it is dropped.
    pub handshake_timeout_ms: u64,
    /// Log every connection's opening and closing (errors are always logged).
    pub verbose: bool,
    /// Serve the volume read-only: the export says so, and changes get EPERM.
    pub read_only: bool,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            listen: ListenAddr::Tcp(SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT))),
            export_name: "afa".into(),
            description: "afa volume".into(),
            pace: Pace::Model,
            max_connections: 16,
            max_request_bytes: 32 << 20,
            handshake_timeout_ms: 10_000,
            verbose: false,
            read_only: false,
        }
    }
}

/// A connection's flow control: each request takes credits (one per `CREDIT_BYTES` of
/// payload, at least one) from a budget of `CREDITS`, returned when its reply is written.
/// This bounds what a client that never reads its replies can make the server hold.
const CREDITS: usize = 128;
const CREDIT_BYTES: u64 = 512 * 1024;
/// Connections over the limit still get a refusal message, up to this many at once;
/// beyond that they are closed at once.
const REFUSAL_SLOTS: usize = 16;
/// Buffers a connection keeps for reuse, and the largest one it keeps.
const POOLED_BUFFERS: usize = 64;
const MAX_POOLED_BUFFER_BYTES: usize = 256 * 1024;
/// The most requests handed to the engine in one burst.
const MAX_BURST_JOBS: usize = 64;

fn credits_for(bytes: u64) -> u32 {
    bytes.div_ceil(CREDIT_BYTES).clamp(1, CREDITS as u64) as u32
}

enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

/// A client connection on either transport.
#[derive(Debug)]
enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Conn {
    fn try_clone(&self) -> io::Result<Conn> {
        Ok(match self {
            Conn::Tcp(s) => Conn::Tcp(s.try_clone()?),
            Conn::Unix(s) => Conn::Unix(s.try_clone()?),
        })
    }
    fn shutdown(&self) {
        // The peer may already be gone; there is nothing more to do then.
        let _ = match self {
            Conn::Tcp(s) => s.shutdown(Shutdown::Both),
            Conn::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }
    /// Bytes received and not yet read (the FIONREAD ioctl, which both TCP and Unix
    /// stream sockets answer); 0 when the socket cannot tell.
    #[allow(unsafe_code)]
    fn pending_bytes(&self) -> usize {
        use std::os::fd::AsRawFd;
        let fd = match self {
            Conn::Tcp(s) => s.as_raw_fd(),
            Conn::Unix(s) => s.as_raw_fd(),
        };
        let mut pending: libc::c_int = 0;
        // SAFETY: `fd` is this connection's open socket for the whole call, and FIONREAD
        // writes one c_int through the pointer, which points at `pending`.
        let status = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut pending as *mut libc::c_int) };
        if status < 0 {
            0
        } else {
            usize::try_from(pending).unwrap_or(0)
        }
    }
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Conn::Tcp(s) => s.set_read_timeout(t),
            Conn::Unix(s) => s.set_read_timeout(t),
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.read(buf),
            Conn::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.write(buf),
            Conn::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Conn::Tcp(s) => s.flush(),
            Conn::Unix(s) => s.flush(),
        }
    }
}

/// State shared by the acceptor and the connection threads (read-only but for counters).
struct Shared {
    export: ExportInfo,
    config: ServeConfig,
    engine: EngineSender,
    active: AtomicUsize,
    next_id: AtomicU64,
}

/// A bound server, not yet accepting.
pub struct Server {
    listener: Listener,
    shared: Arc<Shared>,
    engine: EngineHandle,
    local: ListenAddr,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("local", &self.local)
            .finish()
    }
}

impl Server {
    /// Binds the listener and starts the engine over `device`.
    pub fn bind(
        config: ServeConfig,
        device: Box<dyn afa_ssd::BlockDevice + Send>,
    ) -> Result<Self, ServeError> {
        Self::bind_with(config, |pace| EngineHandle::spawn(device, pace))
    }

    /// Binds the listener and serves `volume`, which does its own concurrency: connection
    /// threads apply requests to it directly, many at once, with no lock of the server's.
    pub fn bind_shared(
        config: ServeConfig,
        volume: Arc<dyn SharedVolume>,
    ) -> Result<Self, ServeError> {
        Self::bind_with(config, |pace| EngineHandle::spawn_shared(volume, pace))
    }

    /// Checks the configuration, binds the listener and starts the engine with `start`,
    /// which both kinds of volume share so that they are served alike.
    fn bind_with(
        config: ServeConfig,
        start: impl FnOnce(Pace) -> Result<(EngineHandle, afa_ssd::DeviceInfo), ServeError>,
    ) -> Result<Self, ServeError> {
        if config.max_connections == 0 {
            return Err(ServeError::Config(
                "max_connections must be at least 1".into(),
            ));
        }
        // A request is buffered whole, so the ceiling bounds the memory one request takes.
        if !(4096..=MAX_REQUEST_CEILING_BYTES).contains(&config.max_request_bytes) {
            return Err(ServeError::Config(format!(
                "max_request_bytes = {} must be from 4096 to {MAX_REQUEST_CEILING_BYTES}",
                config.max_request_bytes
            )));
        }
        if config.export_name.len() > crate::proto::MAX_STRING_BYTES {
            return Err(ServeError::Config(
                "the export name is longer than 4096 bytes".into(),
            ));
        }
        let (listener, local) = match &config.listen {
            ListenAddr::Tcp(addr) => {
                let l = TcpListener::bind(addr)
                    .map_err(|e| ServeError::Listen(format!("cannot listen on {addr}: {e}")))?;
                let local = l
                    .local_addr()
                    .map_err(|e| ServeError::Listen(format!("{addr}: {e}")))?;
                (Listener::Tcp(l), ListenAddr::Tcp(local))
            }
            ListenAddr::Unix(path) => {
                remove_stale_socket(path)?;
                let l = UnixListener::bind(path).map_err(|e| {
                    ServeError::Listen(format!("cannot listen on unix:{}: {e}", path.display()))
                })?;
                (
                    Listener::Unix(l, path.clone()),
                    ListenAddr::Unix(path.clone()),
                )
            }
        };
        let (engine, info) = start(config.pace)?;
        let export = ExportInfo {
            name: config.export_name.clone(),
            description: config.description.clone(),
            size_bytes: info.capacity_sectors * info.sector_bytes as u64,
            preferred_block_bytes: info.sector_bytes,
            max_request_bytes: config.max_request_bytes,
            read_only: config.read_only,
        };
        let shared = Arc::new(Shared {
            export,
            config,
            engine: engine.sender(),
            active: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
        });
        Ok(Self {
            listener,
            shared,
            engine,
            local,
        })
    }

    /// The address actually bound (the port is filled in when 0 was asked for).
    pub fn local_addr(&self) -> &ListenAddr {
        &self.local
    }

    /// The export's size in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.shared.export.size_bytes
    }

    /// An NBD URI for this export, as qemu, libnbd and fio take it.
    pub fn uri(&self) -> String {
        let name = &self.shared.export.name;
        match &self.local {
            ListenAddr::Tcp(a) => format!("nbd://{a}/{name}"),
            ListenAddr::Unix(p) => format!("nbd+unix:///{name}?socket={}", p.display()),
        }
    }

    /// Serves on a background thread until `stop` is called on the result.
    pub fn spawn(self) -> Result<RunningServer, ServeError> {
        let stop = Arc::new(AtomicBool::new(false));
        let uri = self.uri();
        let local = self.local.clone();
        let size_bytes = self.size_bytes();
        let Server {
            listener,
            shared,
            engine,
            ..
        } = self;
        let stop_flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("afa-accept".into())
            .spawn(move || {
                let (closed_tx, closed_rx) = crossbeam_channel::unbounded();
                let open = accept_loop(&listener, &shared, &stop_flag, &closed_tx, &closed_rx);
                for (_, conn) in open {
                    conn.shutdown();
                }
                if let Listener::Unix(_, path) = &listener {
                    let _ = std::fs::remove_file(path);
                }
            })
            .map_err(ServeError::Thread)?;
        Ok(RunningServer {
            stop,
            thread: Some(thread),
            engine: Some(engine),
            local,
            uri,
            size_bytes,
        })
    }
}

/// A server serving on a background thread.
#[derive(Debug)]
pub struct RunningServer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    engine: Option<EngineHandle>,
    local: ListenAddr,
    uri: String,
    size_bytes: u64,
}

impl RunningServer {
    pub fn uri(&self) -> &str {
        &self.uri
    }
    pub fn local_addr(&self) -> &ListenAddr {
        &self.local
    }
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// Stops accepting, closes every connection, lets the engine answer what it holds and
    /// flush the device, and returns its counters.
    pub fn stop(mut self) -> EngineStats {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> EngineStats {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the acceptor, which is blocked in accept().
        match &self.local {
            ListenAddr::Tcp(a) => drop(TcpStream::connect(a)),
            ListenAddr::Unix(p) => drop(UnixStream::connect(p)),
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.engine
            .take()
            .map(EngineHandle::stop)
            .unwrap_or_default()
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.stop_inner();
        }
    }
}

/// Refuses to take over a path that is not a socket or that a live server listens on.
fn remove_stale_socket(path: &Path) -> Result<(), ServeError> {
    use std::os::unix::fs::FileTypeExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    if !meta.file_type().is_socket() {
        return Err(ServeError::Listen(format!(
            "unix:{} exists and is not a socket; refusing to replace it",
            path.display()
        )));
    }
    if UnixStream::connect(path).is_ok() {
        return Err(ServeError::Listen(format!(
            "unix:{}: another server is listening there",
            path.display()
        )));
    }
    std::fs::remove_file(path).map_err(|e| {
        ServeError::Listen(format!(
            "cannot remove stale socket {}: {e}",
            path.display()
        ))
    })
}

/// Accepts until `stop` is set; returns the connections still open then.
fn accept_loop(
    listener: &Listener,
    shared: &Arc<Shared>,
    stop: &AtomicBool,
    closed_tx: &Sender<u64>,
    closed_rx: &Receiver<u64>,
) -> Vec<(u64, Conn)> {
    let mut open: Vec<(u64, Conn)> = Vec::new();
    loop {
        let accepted = match listener {
            Listener::Tcp(l) => l.accept().map(|(s, peer)| {
                // Replies are small and latency-bound; Nagle's algorithm would hold them.
                if let Err(e) = s.set_nodelay(true) {
                    log(&format!("cannot set TCP_NODELAY for {peer}: {e}"));
                }
                (Conn::Tcp(s), peer.to_string())
            }),
            Listener::Unix(l, path) => l
                .accept()
                .map(|(s, _)| (Conn::Unix(s), format!("unix:{}", path.display()))),
        };
        if stop.load(Ordering::SeqCst) {
            return open;
        }
        while let Ok(id) = closed_rx.try_recv() {
            open.retain(|(i, _)| *i != id);
        }
        let (conn, peer) = match accepted {
            Ok(c) => c,
            Err(e) => {
                // Running out of descriptors or a connection reset before accept: the
                // listener itself is fine, so keep serving after a short pause.
                log(&format!("accept failed: {e}"));
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let active = shared.active.fetch_add(1, Ordering::SeqCst) + 1;
        let limit = shared.config.max_connections;
        if active > limit + REFUSAL_SLOTS {
            shared.active.fetch_sub(1, Ordering::SeqCst);
            log(&format!(
                "connection {id} from {peer} closed at once: {} connections open (limit {limit})",
                active - 1
            ));
            conn.shutdown();
            continue;
        }
        if let Ok(clone) = conn.try_clone() {
            open.push((id, clone));
        }
        let refusal = (active > limit)
            .then(|| format!("the server is at its limit of {limit} connections; try again later"));
        let conn_shared = shared.clone();
        let closed_tx = closed_tx.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("afa-conn-{id}"))
            .spawn(move || {
                connection(conn, id, &peer, &conn_shared, refusal);
                conn_shared.active.fetch_sub(1, Ordering::SeqCst);
                let _ = closed_tx.send(id);
            });
        if let Err(e) = spawned {
            // The closure (and the connection in it) was dropped unrun: undo its count.
            shared.active.fetch_sub(1, Ordering::SeqCst);
            open.retain(|(i, _)| *i != id);
            log(&format!("cannot start a thread for connection {id}: {e}"));
        }
    }
}

/// Serves one connection to its end, logging why it ended if that was not a clean close.
fn connection(conn: Conn, id: u64, peer: &str, shared: &Shared, refusal: Option<String>) {
    let verbose = shared.config.verbose;
    let who = format!("connection {id} ({peer})");
    let outcome = match conn.try_clone() {
        Ok(c) => serve(c, shared, refusal.clone()),
        Err(e) => Err(SessionError::Io(e)),
    };
    // The acceptor keeps a clone of every socket (to close them all on stop), so dropping
    // ours would not close the connection: shut it down explicitly on every path.
    conn.shutdown();
    match outcome {
        Ok(end) if refusal.is_some() => log(&format!("{who}: refused ({end})")),
        Ok(end) => {
            if verbose {
                log(&format!("{who}: {end}"));
            }
        }
        Err(e) => log(&format!("{who}: closed: {e}")),
    }
}

fn serve(conn: Conn, shared: &Shared, refusal: Option<String>) -> Result<String, SessionError> {
    let timeout = Duration::from_millis(shared.config.handshake_timeout_ms.max(1));
    conn.set_read_timeout(Some(timeout))?;
    let mut reader = BufReader::with_capacity(256 * 1024, conn.try_clone()?);
    let mut writer = BufWriter::with_capacity(256 * 1024, conn.try_clone()?);
    let negotiation = match refusal {
        Some(message) => Negotiation::refusing(shared.export.clone(), message),
        None => Negotiation::new(shared.export.clone()),
    };
    let negotiated = match handshake(&mut reader, &mut writer, negotiation) {
        Ok(Some(n)) => n,
        Ok(None) => return Ok("the client aborted the handshake".into()),
        Err(SessionError::Io(e))
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            conn.shutdown();
            return Err(SessionError::Io(io::Error::new(
                e.kind(),
                format!("no complete handshake within {} ms", timeout.as_millis()),
            )));
        }
        Err(e) => {
            conn.shutdown();
            return Err(e);
        }
    };
    // Clients may idle as long as they like once connected.
    conn.set_read_timeout(None)?;
    let structured = negotiated.structured_replies;
    let limits = Limits {
        size_bytes: shared.export.size_bytes,
        max_request_bytes: shared.export.max_request_bytes,
        structured_replies: structured,
        base_allocation: negotiated.base_allocation,
        read_only: shared.export.read_only,
    };
    if shared.config.pace == Pace::None {
        return transmission_inline(conn, reader, writer, shared, &limits);
    }
    let (reply_tx, reply_rx) = crossbeam_channel::unbounded::<Vec<Reply>>();
    let (credit_tx, credit_rx) = crossbeam_channel::bounded::<()>(CREDITS);
    // Request buffers go reader -> engine -> writer -> back to the reader, so steady
    // traffic neither allocates nor page-faults.
    let (pool_tx, pool_rx) = crossbeam_channel::bounded::<Vec<u8>>(POOLED_BUFFERS);
    let writer_thread = std::thread::Builder::new()
        .name("afa-conn-writer".into())
        .spawn(move || reply_loop(writer, &reply_rx, &credit_rx, &pool_tx, structured))
        .map_err(SessionError::Io)?;
    let engine = &shared.engine;
    // Requests that arrive together go to the engine as one burst: one channel message
    // and at most one wake-up of the engine thread, instead of one per request.
    let mut burst: Vec<Job> = Vec::new();
    let hand_over = |burst: &mut Vec<Job>| -> bool {
        if burst.is_empty() {
            return true;
        }
        match engine.submit(std::mem::take(burst)) {
            Ok(()) => true,
            Err(jobs) => {
                let replies = jobs
                    .into_iter()
                    .map(|job| Reply {
                        handle: job.handle,
                        read_offset: None,
                        block_status: false,
                        result: Err(shutdown_failure()),
                        data: job.data,
                        credits: job.credits,
                    })
                    .collect();
                let _ = reply_tx.send(replies);
                false
            }
        }
    };
    let take_buffer = || pool_rx.try_recv().unwrap_or_default();
    let result = read_requests(&mut reader, &limits, take_buffer, |incoming, next_ready| {
        let bytes = match &incoming {
            Incoming::Job { request, .. } => request_bytes(request),
            Incoming::Rejected { .. } => 0,
        };
        let credits = credits_for(bytes);
        for _ in 0..credits {
            match credit_tx.try_send(()) {
                Ok(()) => {}
                Err(TrySendError::Full(())) => {
                    // Out of credits: hand over what was gathered, then wait for replies
                    // to drain. The writer owns the receiver; when it is gone the
                    // connection is dead.
                    if !hand_over(&mut burst) || credit_tx.send(()).is_err() {
                        return false;
                    }
                }
                Err(TrySendError::Disconnected(())) => return false,
            }
        }
        match incoming {
            Incoming::Job {
                handle,
                request,
                data,
            } => burst.push(Job {
                handle,
                request,
                data,
                reply_to: reply_tx.clone(),
                credits,
            }),
            Incoming::Rejected {
                handle,
                kind,
                rejection,
            } => {
                if shared.config.verbose {
                    log(&format!(
                        "request {handle:#x} rejected: {}",
                        rejection.message
                    ));
                }
                let reply = rejected_reply(handle, kind, rejection, credits);
                if reply_tx.send(vec![reply]).is_err() {
                    return false;
                }
            }
        }
        if !next_ready || burst.len() >= MAX_BURST_JOBS {
            return hand_over(&mut burst);
        }
        true
    });
    // Requests read before the end (even before a protocol violation) are still served.
    hand_over(&mut burst);
    // The writer ends once every outstanding reply is written: the engine holds the other
    // senders, one per job in flight.
    drop(reply_tx);
    if result.is_err() {
        // A protocol violation: hard disconnect, as the protocol allows.
        conn.shutdown();
    }
    let written = writer_thread.join();
    conn.shutdown();
    let end = result?;
    match written {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(SessionError::Io(e)),
        Err(_) => {
            return Err(SessionError::Io(io::Error::other(
                "the reply writer panicked",
            )));
        }
    }
    Ok(describe(end))
}

/// What a connection's transmission ended with, for the log.
fn describe(end: End) -> String {
    match end {
        End::Disconnect => "the client disconnected (NBD_CMD_DISC)".into(),
        End::Closed => "the client closed the connection".into(),
        End::Stopped => "the server is shutting down".into(),
    }
}

/// Threads that take turns at one unpaced connection (see [`transmission_inline`]) over a
/// device the connection's thread applies requests to itself.
const INLINE_TURN_THREADS: usize = 1;

/// Threads that take turns at one unpaced connection over a volume with threads of its own:
/// while one waits for the volume's threads to apply its burst, the other reads and hands
/// over the next (ScalaAFA, two fio jobs at QD 32 over two I/O threads: 5.2–5.4 K IOPS and
/// 744–819 MB/s with two, 4.6–4.9 K and 672–730 MB/s with one).
const SHARED_TURN_THREADS: usize = 2;

/// How an unpaced connection's burst waits for more of the client's requests (see
/// [`Linger`]): while they keep arriving at most 10 µs apart, for at most 80 µs. Of the
/// quiet times measured with `afa bench serve` (2, 6, 10 and 20 µs), 10 µs served the most
/// requests per CPU second on both sides (docs/serve.md, "Benchmark").
///
/// A step of the wait (one look at the socket) takes well under a microsecond; one of
/// 50 µs or more means the thread was descheduled. With two CPU hogs beside the bench,
/// waiting through that measured 0.40× nbdkit on 4 KiB; stopping for a while, 0.89–1.83×
/// (the design before lingering: 1.02–1.09×).
const INLINE_LINGER: Linger = Linger {
    quiet_ns: 10_000,
    max_ns: 80_000,
    preempted_step_ns: 50_000,
};

/// Unpaced transmission. A reply may leave as soon as the engine has applied its request,
/// so no engine thread is involved: the connection's own threads read a burst, apply it to
/// the engine themselves and write the replies, with no hand-off of requests between
/// threads on the request path (which matters on a busy host). `INLINE_TURN_THREADS`
/// threads (`SHARED_TURN_THREADS` over a volume with threads of its own) take turns
/// (leader/follower): one holds the reading side and waits for the next burst while another
/// applies the previous burst and writes its replies. A burst lingers for the client's
/// requests while they keep arriving (`INLINE_LINGER`), and while the connection serves a
/// burst the next requests gather in the socket without waking anyone. A device gets one
/// thread: with two, the second waited in `read` while the first served, so almost every
/// request the client sent woke it (bursts of one or two), and the client's sends paid for
/// those wake-ups; with lingering, one thread served more per CPU second on both sides
/// (docs/serve.md, "Benchmark"). A connection holds at most one burst of `MAX_BURST_JOBS`
/// per turn thread. Replies of different bursts may leave in either order, which NBD
/// allows: a request is not ordered against another still in flight, and a FLUSH covers
/// the writes already replied to, all of which were applied before their replies were
/// written.
fn transmission_inline(
    conn: Conn,
    reader: BufReader<Conn>,
    writer: BufWriter<Conn>,
    shared: &Shared,
    limits: &Limits,
) -> Result<String, SessionError> {
    let (pool_tx, pool_rx) = crossbeam_channel::bounded::<Vec<u8>>(POOLED_BUFFERS);
    // What the handshake's reader holds beyond the last option belongs to the first
    // requests; from here on requests are read in place into each turn's burst buffer.
    let pending = conn.try_clone()?;
    let reader = BurstReader::new(reader.get_ref().try_clone()?, reader.buffer())
        .with_linger(INLINE_LINGER, Box::new(move || pending.pending_bytes()));
    let turns = Turns {
        reader: std::sync::Mutex::new(ReadSide {
            reader,
            ended: None,
        }),
        writer: std::sync::Mutex::new(WriteSide {
            writer,
            error: None,
        }),
        conn: &conn,
        shared,
        limits,
        pool_tx,
        pool_rx,
    };
    std::thread::scope(|scope| {
        let turn_threads = if shared.engine.runs_own_threads() {
            SHARED_TURN_THREADS
        } else {
            INLINE_TURN_THREADS
        };
        let helpers: Vec<_> = (1..turn_threads)
            .filter_map(|_| {
                std::thread::Builder::new()
                    .name("afa-conn-turn".into())
                    .spawn_scoped(scope, || turns.take_turns())
                    .ok()
            })
            .collect();
        turns.take_turns();
        for helper in helpers {
            // A turn that panicked has left its burst unanswered; the client sees the
            // connection close below, as after any server failure.
            let _ = helper.join();
        }
    });
    conn.shutdown();
    let ReadSide { ended, .. } = turns.reader.into_inner().unwrap_or_else(|p| p.into_inner());
    let WriteSide { error, .. } = turns.writer.into_inner().unwrap_or_else(|p| p.into_inner());
    match (ended, error) {
        (Some(Err(e)), _) => Err(e),
        (_, Some(e)) => Err(SessionError::Io(e)),
        (Some(Ok(end)), None) => Ok(describe(end)),
        // Only a panicked turn leaves the stream without an end.
        (None, None) => Ok(describe(End::Stopped)),
    }
}

/// The reading side of an unpaced connection, and how its request stream ended.
struct ReadSide {
    reader: BurstReader<Conn>,
    ended: Option<Result<End, SessionError>>,
}

/// The writing side of an unpaced connection, and the first error writing to it.
struct WriteSide {
    writer: BufWriter<Conn>,
    error: Option<io::Error>,
}

/// What the threads of one unpaced connection share.
struct Turns<'a> {
    reader: std::sync::Mutex<ReadSide>,
    writer: std::sync::Mutex<WriteSide>,
    conn: &'a Conn,
    shared: &'a Shared,
    limits: &'a Limits,
    /// Read buffers come back here once their replies are written, so steady traffic
    /// neither allocates nor page-faults.
    pool_tx: Sender<Vec<u8>>,
    pool_rx: Receiver<Vec<u8>>,
}

impl Turns<'_> {
    /// One thread's share of the connection: read a burst while holding the reading side,
    /// apply it, write its replies while holding the writing side, until the stream ends.
    fn take_turns(&self) {
        // Each turn reads its bursts into its own buffer and applies the writes from it,
        // so the buffer is free again once the burst is applied.
        let mut burst = BurstBuffer::default();
        let mut parsed = Vec::with_capacity(MAX_BURST_JOBS);
        let mut jobs = Vec::with_capacity(MAX_BURST_JOBS);
        let mut replies = Vec::with_capacity(MAX_BURST_JOBS);
        loop {
            let last = {
                let mut side = self.reader.lock().unwrap_or_else(|p| p.into_inner());
                if side.ended.is_some() {
                    return;
                }
                let read =
                    side.reader
                        .read_burst(&mut burst, self.limits, MAX_BURST_JOBS, &mut parsed);
                match read {
                    Ok(None) => false,
                    Ok(Some(end)) => {
                        side.ended = Some(Ok(end));
                        true
                    }
                    Err(e) => {
                        // A protocol violation: hard disconnect, as the protocol allows,
                        // once the requests read before it are served below.
                        side.ended = Some(Err(e));
                        true
                    }
                }
            };
            for request in parsed.drain(..) {
                match request {
                    Parsed::Job {
                        handle,
                        request,
                        payload,
                    } => {
                        let buf = match request {
                            Request::Read { .. } => self.pool_rx.try_recv().unwrap_or_default(),
                            _ => Vec::new(),
                        };
                        jobs.push(InlineJob {
                            handle,
                            request,
                            buf,
                            payload,
                        });
                    }
                    Parsed::Rejected {
                        handle,
                        kind,
                        rejection,
                    } => {
                        if self.shared.config.verbose {
                            log(&format!(
                                "request {handle:#x} rejected: {}",
                                rejection.message
                            ));
                        }
                        replies.push(rejected_reply(handle, kind, rejection, 0));
                    }
                }
            }
            if !jobs.is_empty() {
                // Only unpaced engines run inline, and only unpaced connections come here;
                // a paced engine refuses the jobs, answered as a shutdown.
                let applied = self
                    .shared
                    .engine
                    .apply(std::mem::take(&mut jobs), burst.bytes());
                replies.extend(applied);
            }
            if !self.write_replies(&mut replies) {
                // The other turn may be waiting in a read from a client that will never
                // send again; closing the socket wakes it.
                self.conn.shutdown();
                return;
            }
            // The stream ended in this turn's read; the other turn, if it is still
            // serving a burst, finds the end when it next takes the reading side.
            if last {
                return;
            }
        }
    }

    /// Writes and flushes the replies; false when the connection cannot take them.
    fn write_replies(&self, replies: &mut Vec<Reply>) -> bool {
        let mut side = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        if side.error.is_some() {
            replies.clear();
            return false;
        }
        let structured = self.limits.structured_replies;
        let mut written = Ok(());
        for reply in replies.drain(..) {
            if written.is_ok() {
                written = write_reply(&mut side.writer, structured, &reply);
            }
            if reply.data.capacity() > 0 && reply.data.capacity() <= MAX_POOLED_BUFFER_BYTES {
                let _ = self.pool_tx.try_send(reply.data);
            }
        }
        match written.and_then(|()| side.writer.flush()) {
            Ok(()) => true,
            Err(e) => {
                side.error = Some(e);
                false
            }
        }
    }
}

fn request_bytes(request: &crate::proto::Request) -> u64 {
    use crate::proto::Request;
    match *request {
        Request::Read { length, .. } | Request::Write { length, .. } => length as u64,
        _ => 0,
    }
}

/// Writes replies as they come, flushing whenever no further reply is waiting, and
/// returns each reply's credits to the reader.
fn reply_loop(
    mut writer: BufWriter<Conn>,
    replies: &Receiver<Vec<Reply>>,
    credits: &Receiver<()>,
    pool: &Sender<Vec<u8>>,
    structured: bool,
) -> io::Result<()> {
    while let Ok(burst) = replies.recv() {
        for reply in burst {
            write_reply(&mut writer, structured, &reply)?;
            for _ in 0..reply.credits {
                let _ = credits.try_recv();
            }
            // Only buffers of ordinary size are kept, so one huge request does not pin
            // its memory for the life of the connection.
            if reply.data.capacity() <= MAX_POOLED_BUFFER_BYTES {
                let _ = pool.try_send(reply.data);
            }
        }
        if replies.is_empty() {
            writer.flush()?;
        }
    }
    writer.flush()
}

impl std::fmt::Display for End {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            End::Disconnect => "disconnected",
            End::Closed => "closed",
            End::Stopped => "stopped",
        })
    }
}
