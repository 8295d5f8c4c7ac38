//! One connection's protocol loops over any byte stream: the handshake, reading requests
//! and writing replies. They are generic over `Read`/`Write`, so the server runs them on
//! sockets and tests and the fuzz target run them on in-memory buffers.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::time::Instant;

use crate::engine::{Failure, Reply};
use crate::proto::{
    self, greeting, parse_option_header, parse_request_header, Limits, Negotiated, Negotiation,
    OptionOutcome, ProtocolError, Rejection, Request, OPTION_HEADER_BYTES, REQUEST_HEADER_BYTES,
};

/// Why a connection ended abnormally.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("{0}")]
    Protocol(#[from] ProtocolError),
    #[error("the client closed the connection in the middle of a message")]
    Truncated,
    #[error("the client closed the connection before choosing an export")]
    ClosedInHandshake,
    #[error("{0}")]
    Io(io::Error),
}

impl From<io::Error> for SessionError {
    fn from(e: io::Error) -> Self {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            SessionError::Truncated
        } else {
            SessionError::Io(e)
        }
    }
}

/// Runs option haggling. Returns the negotiated transmission settings, or `None` when the
/// client aborted.
pub fn handshake<R: Read, W: Write>(
    reader: &mut R,
    writer: &mut W,
    mut negotiation: Negotiation,
) -> Result<Option<Negotiated>, SessionError> {
    writer.write_all(&greeting())?;
    writer.flush()?;
    let mut flags = [0u8; 4];
    reader.read_exact(&mut flags)?;
    negotiation.client_flags(flags)?;
    let mut out = Vec::new();
    loop {
        let mut header = [0u8; OPTION_HEADER_BYTES];
        if !read_exact_or_eof(reader, &mut header)? {
            return Err(SessionError::ClosedInHandshake);
        }
        let header = parse_option_header(&header)?;
        let mut data = vec![0u8; header.length as usize];
        reader.read_exact(&mut data)?;
        out.clear();
        let outcome = negotiation.option(header, &data, &mut out)?;
        writer.write_all(&out)?;
        writer.flush()?;
        match outcome {
            OptionOutcome::Continue => {}
            OptionOutcome::Transmission(n) => return Ok(Some(n)),
            OptionOutcome::Abort => return Ok(None),
        }
    }
}

/// A request read off the wire.
#[derive(Debug)]
pub enum Incoming {
    /// A valid request for the engine (a write's payload in `data`).
    Job {
        handle: u64,
        request: Request,
        data: Vec<u8>,
    },
    /// A request answered with an error without reaching the engine.
    Rejected {
        handle: u64,
        kind: u16,
        rejection: Rejection,
    },
}

/// How the transmission phase ended without a protocol error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The client sent NBD_CMD_DISC.
    Disconnect,
    /// The client closed the connection between requests.
    Closed,
    /// The consumer of requests stopped (the engine is gone).
    Stopped,
}

/// Reads requests until the client disconnects, handing each to `emit` with whether the
/// next request is already complete in the buffer (so the caller can gather a burst and
/// pass it on in one go); `emit` returns false to stop. `take_buffer` supplies the buffer
/// of each read or write (a recycled one, or a new empty one).
pub fn read_requests<R: Read>(
    reader: &mut BufReader<R>,
    limits: &Limits,
    mut take_buffer: impl FnMut() -> Vec<u8>,
    mut emit: impl FnMut(Incoming, bool) -> bool,
) -> Result<End, SessionError> {
    loop {
        let incoming = match read_request(reader, limits, &mut take_buffer)? {
            Ok(incoming) => incoming,
            Err(end) => return Ok(end),
        };
        if !emit(incoming, next_request_buffered(reader.buffer())) {
            return Ok(End::Stopped);
        }
    }
}

/// How many bytes one read from the client asks for at least: enough for a burst of small
/// requests or several 64 KiB writes per system call.
pub const BURST_READ_BYTES: usize = 256 * 1024;

/// The most a burst buffer keeps between bursts. One large write grows the buffer to hold
/// it (up to the largest request served); the next burst gives the excess back, so a
/// client that once wrote 32 MiB does not pin that much per thread for the rest of its
/// connection.
pub const BURST_KEEP_BYTES: usize = 16 * BURST_READ_BYTES;

/// A request parsed in place in a [`BurstBuffer`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// A valid request for the engine; a write's payload is `payload` in the burst buffer
    /// (an empty range for every other request).
    Job {
        handle: u64,
        request: Request,
        payload: std::ops::Range<usize>,
    },
    /// A request answered with an error without reaching the engine.
    Rejected {
        handle: u64,
        kind: u16,
        rejection: Rejection,
    },
}

/// The bytes of one burst as they came off the wire. A thread keeps its own buffer across
/// bursts, so steady traffic neither allocates nor page-faults; `bytes` is only ever grown
/// (and zeroed) when a burst needs more room than any before it.
#[derive(Debug, Default)]
pub struct BurstBuffer {
    bytes: Vec<u8>,
    filled: usize,
}

impl BurstBuffer {
    /// The bytes read into the buffer; a [`Parsed::Job`]'s payload range indexes them.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes[..self.filled]
    }

    /// Bytes of memory the buffer holds now (what it keeps between bursts).
    pub fn held_bytes(&self) -> usize {
        self.bytes.len()
    }

    /// Makes room for at least `room` unread bytes after what the buffer holds.
    fn reserve(&mut self, room: usize) {
        let want = self.filled + room;
        if self.bytes.len() < want {
            self.bytes.resize(want, 0);
        }
    }
}

/// How long a burst waits for more of a client's requests once its first bytes have come
/// in: as long as new bytes keep arriving at most `quiet_ns` apart, and at most `max_ns`
/// after the read that brought the first ones.
///
/// A client that keeps many requests in flight sends them one system call each, so a
/// reader that takes only what is there at once serves bursts of one or two requests and
/// pays a read, a reply write and a wake-up for each. The client pays too: every request it
/// sends to a reader asleep in `read` wakes that reader from inside the client's own send.
/// Waiting a few microseconds while requests are still arriving gathers them into one
/// burst (interrupt coalescing, as NICs and NAPI do it). A client that keeps only a few
/// requests in flight is better served without waiting (`MIN_LINGER_BURST_REQUESTS`).
///
/// A waiting thread holds a core, and on a machine with more runnable threads than cores
/// that core may be the one the client needs to send: a step of the wait that took
/// `preempted_step_ns` or more shows the thread lost its core, and the reader then stops
/// lingering for a while.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Linger {
    pub quiet_ns: u64,
    pub max_ns: u64,
    pub preempted_step_ns: u64,
}

/// How many bytes the stream holds that a read would return at once (0 when it cannot
/// tell).
pub type PendingBytes = Box<dyn Fn() -> usize + Send>;

/// Lingering pays when a client keeps many requests in flight. With few, the time the
/// client takes to send the rest of them is better spent serving the first: a burst that
/// lingered until no more came and holds fewer requests than this makes the reader stop
/// lingering for a while (see [`BurstReader::linger`]).
const MIN_LINGER_BURST_REQUESTS: usize = 8;

/// The most reads a reader takes without lingering after bursts where lingering did not pay.
const MAX_LINGER_SKIP_READS: u32 = 64;

/// A [`Linger`] window, the stream's [`PendingBytes`], and when the reader lingers.
struct Lingering {
    window: Linger,
    pending: PendingBytes,
    /// How the burst being read stopped lingering (`None`: it did not linger).
    stopped: Option<LingerStop>,
    /// Reads still to take without lingering.
    skip_reads: u32,
    /// How many reads the last burst that showed lingering did not pay (a short burst, or a
    /// wait that lost its core) made the reader skip; 0 after one that paid.
    skip_backoff: u32,
}

/// Why a burst stopped lingering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LingerStop {
    /// No new byte came for the quiet time: the client had nothing more in flight.
    Quiet,
    /// The buffer filled or the time ran out while bytes kept coming.
    Full,
    /// The thread lost its core while it waited: the machine has more runnable threads
    /// than cores, and a waiting thread takes a core the client may need to send.
    Preempted,
}

impl std::fmt::Debug for Lingering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lingering")
            .field("window", &self.window)
            .field("skip_reads", &self.skip_reads)
            .finish_non_exhaustive()
    }
}

/// Reads requests in bursts straight into a caller's [`BurstBuffer`] and parses them where
/// they lie, so a write's payload is copied once, from the buffer into the device, instead
/// of first from a stream buffer into a payload buffer. Bytes of a request that a read cut
/// off are carried over to the next burst (a small copy: at most one request per burst).
#[derive(Debug)]
pub struct BurstReader<R> {
    inner: R,
    /// How a burst waits for more requests once its first bytes have come in (none: it
    /// takes only what one read returns).
    linger: Option<Lingering>,
    /// Bytes read past the last whole request of the previous burst.
    carry: Vec<u8>,
    /// Payload bytes of a rejected write still to be dropped from the stream.
    discard: u64,
    /// That rejected write, answered once its payload is dropped (as the one-at-a-time
    /// reader does, so a stream that ends inside the payload answers neither).
    rejected: Option<Parsed>,
}

impl<R: Read> BurstReader<R> {
    /// A reader of `inner`, starting with `buffered`: bytes already read from the stream
    /// (by the handshake's buffered reader) that belong to the first requests.
    pub fn new(inner: R, buffered: &[u8]) -> Self {
        BurstReader {
            inner,
            linger: None,
            carry: buffered.to_vec(),
            discard: 0,
            rejected: None,
        }
    }

    /// Makes every read that brings new bytes wait for more while they keep arriving, as
    /// `window` says; `pending` tells how many bytes the stream holds.
    pub fn with_linger(mut self, window: Linger, pending: PendingBytes) -> Self {
        self.linger = Some(Lingering {
            window,
            pending,
            stopped: None,
            skip_reads: 0,
            skip_backoff: 0,
        });
        self
    }

    /// Reads one burst into `buf`: waits for the first whole request, then takes every
    /// request already whole in what was read, up to `max`, so a burst never waits for the
    /// network after its first request. Parsed requests are appended to `out` (they stay
    /// there even when an error ends the stream, so the caller can still serve them);
    /// returns how the stream ended after them, if it did.
    pub fn read_burst(
        &mut self,
        buf: &mut BurstBuffer,
        limits: &Limits,
        max: usize,
        out: &mut Vec<Parsed>,
    ) -> Result<Option<End>, SessionError> {
        let first = out.len();
        buf.filled = 0;
        if buf.bytes.len() > BURST_KEEP_BYTES && self.carry.len() <= BURST_KEEP_BYTES {
            buf.bytes.truncate(BURST_KEEP_BYTES);
            buf.bytes.shrink_to_fit();
        }
        buf.reserve(self.carry.len());
        buf.bytes[..self.carry.len()].copy_from_slice(&self.carry);
        buf.filled = self.carry.len();
        self.carry.clear();
        let mut pos = 0;
        let result = loop {
            let parsed_some = out.len() > first;
            if out.len() - first >= max.max(1) {
                break Ok(None);
            }
            if self.discard > 0 {
                let dropped = self.discard.min((buf.filled - pos) as u64);
                pos += dropped as usize;
                self.discard -= dropped;
                if self.discard > 0 {
                    if parsed_some {
                        break Ok(None);
                    }
                    if self.fill(buf, &mut pos, 0)? == 0 {
                        break Err(SessionError::Truncated);
                    }
                    continue;
                }
            }
            if let Some(rejected) = self.rejected.take() {
                out.push(rejected);
                continue;
            }
            let avail = buf.filled - pos;
            if avail < REQUEST_HEADER_BYTES {
                if parsed_some {
                    break Ok(None);
                }
                if self.fill(buf, &mut pos, REQUEST_HEADER_BYTES)? == 0 {
                    break if buf.filled == pos {
                        Ok(Some(End::Closed))
                    } else {
                        Err(SessionError::Truncated)
                    };
                }
                continue;
            }
            let mut header = [0u8; REQUEST_HEADER_BYTES];
            header.copy_from_slice(&buf.bytes[pos..pos + REQUEST_HEADER_BYTES]);
            let header = match parse_request_header(&header) {
                Ok(h) => h,
                Err(e) => break Err(e.into()),
            };
            match header.check(limits) {
                Ok(Request::Disconnect) => break Ok(Some(End::Disconnect)),
                Ok(request) => {
                    let payload_bytes = match request {
                        Request::Write { length, .. } => length as usize,
                        _ => 0,
                    };
                    let whole = REQUEST_HEADER_BYTES + payload_bytes;
                    if avail < whole {
                        if parsed_some {
                            break Ok(None);
                        }
                        if self.fill(buf, &mut pos, whole)? == 0 {
                            break Err(SessionError::Truncated);
                        }
                        continue;
                    }
                    let at = pos + REQUEST_HEADER_BYTES;
                    out.push(Parsed::Job {
                        handle: header.handle,
                        request,
                        payload: at..at + payload_bytes,
                    });
                    pos += whole;
                }
                Err(rejection) => {
                    pos += REQUEST_HEADER_BYTES;
                    self.discard = rejection.discard_bytes as u64;
                    self.rejected = Some(Parsed::Rejected {
                        handle: header.handle,
                        kind: header.kind,
                        rejection,
                    });
                }
            }
        };
        if matches!(result, Ok(None)) {
            self.carry.extend_from_slice(&buf.bytes[pos..buf.filled]);
        }
        self.burst_read(out.len() - first);
        result
    }

    /// Reads once from the stream into `buf` (and lingers for more, when the reader was
    /// given a [`Linger`]), first making room for `need` bytes from `pos` on. Only called
    /// while nothing of this burst is parsed, so the unparsed bytes can move to the front of
    /// the buffer (no payload range points into it yet). Returns the bytes read; 0 at the
    /// end of the stream.
    fn fill(
        &mut self,
        buf: &mut BurstBuffer,
        pos: &mut usize,
        need: usize,
    ) -> Result<usize, SessionError> {
        if *pos > 0 {
            buf.bytes.copy_within(*pos..buf.filled, 0);
            buf.filled -= *pos;
            *pos = 0;
        }
        buf.reserve(need.saturating_sub(buf.filled).max(BURST_READ_BYTES));
        let n = read_into(&mut self.inner, buf)?;
        if n == 0 {
            return Ok(0);
        }
        Ok(n + self.linger(buf)?)
    }

    /// After a read that brought bytes, waits while more keep arriving (see [`Linger`])
    /// and reads them too. Returns the bytes read.
    ///
    /// A burst that lingered until no more came and still holds fewer than
    /// `MIN_LINGER_BURST_REQUESTS` requests means the client keeps few in flight (one, for
    /// a client that waits for each reply), and every wait adds to their latency; so the
    /// reader then takes the next reads without lingering, one after the first such burst
    /// and twice as many after each further one (up to `MAX_LINGER_SKIP_READS`), until a
    /// burst that lingers brings enough again ([`Self::burst_read`]). A wait during which
    /// the thread lost its core counts the same way, whatever the burst holds.
    fn linger(&mut self, buf: &mut BurstBuffer) -> Result<usize, SessionError> {
        let Some(l) = &mut self.linger else {
            return Ok(0);
        };
        if l.skip_reads > 0 {
            l.skip_reads -= 1;
            return Ok(0);
        }
        let room = buf.bytes.len() - buf.filled;
        let start = Instant::now();
        let mut seen = (l.pending)();
        let mut changed = start;
        let mut step = start;
        l.stopped = Some(LingerStop::Full);
        while seen < room {
            let now = Instant::now();
            if now.duration_since(step).as_nanos() >= u128::from(l.window.preempted_step_ns) {
                l.stopped = Some(LingerStop::Preempted);
                break;
            }
            step = now;
            if now.duration_since(start).as_nanos() >= u128::from(l.window.max_ns) {
                break;
            }
            if now.duration_since(changed).as_nanos() >= u128::from(l.window.quiet_ns) {
                l.stopped = Some(LingerStop::Quiet);
                break;
            }
            std::hint::spin_loop();
            let now_pending = (l.pending)();
            if now_pending != seen {
                seen = now_pending;
                changed = Instant::now();
            }
        }
        if seen == 0 || room == 0 {
            return Ok(0);
        }
        // The bytes are in the stream already and only this thread reads it, so the read
        // returns at once.
        Ok(read_into(&mut self.inner, buf)?)
    }

    /// Called once a burst of `requests` requests is read: a burst that lingered until no
    /// more came and holds fewer than `MIN_LINGER_BURST_REQUESTS`, or whose thread lost its
    /// core while it lingered, makes the next reads skip lingering; any other burst that
    /// lingered ends the skipping.
    fn burst_read(&mut self, requests: usize) {
        let Some(l) = &mut self.linger else {
            return;
        };
        let Some(stopped) = l.stopped.take() else {
            return;
        };
        let short = stopped == LingerStop::Quiet && requests < MIN_LINGER_BURST_REQUESTS;
        if short || stopped == LingerStop::Preempted {
            l.skip_backoff = (l.skip_backoff * 2).clamp(1, MAX_LINGER_SKIP_READS);
            l.skip_reads = l.skip_backoff;
        } else {
            l.skip_backoff = 0;
        }
    }
}

/// One read into the free part of `buf`, retried when a signal interrupts it.
fn read_into<R: Read>(inner: &mut R, buf: &mut BurstBuffer) -> io::Result<usize> {
    loop {
        match inner.read(&mut buf.bytes[buf.filled..]) {
            Ok(n) => {
                buf.filled += n;
                return Ok(n);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Reads one request, or how the transmission ended between requests.
fn read_request<R: Read>(
    reader: &mut BufReader<R>,
    limits: &Limits,
    take_buffer: &mut impl FnMut() -> Vec<u8>,
) -> Result<Result<Incoming, End>, SessionError> {
    let mut header = [0u8; REQUEST_HEADER_BYTES];
    if !read_exact_or_eof(reader, &mut header)? {
        return Ok(Err(End::Closed));
    }
    let header = parse_request_header(&header)?;
    let incoming = match header.check(limits) {
        Ok(Request::Disconnect) => return Ok(Err(End::Disconnect)),
        Ok(request) => {
            let data = match request {
                Request::Write { length, .. } => {
                    let mut data = take_buffer();
                    read_payload(reader, &mut data, length as usize)?;
                    data
                }
                Request::Read { .. } => take_buffer(),
                _ => Vec::new(),
            };
            Incoming::Job {
                handle: header.handle,
                request,
                data,
            }
        }
        Err(rejection) => {
            discard(reader, rejection.discard_bytes as u64)?;
            Incoming::Rejected {
                handle: header.handle,
                kind: header.kind,
                rejection,
            }
        }
    };
    Ok(Ok(incoming))
}

/// Whether `buffered` holds a whole request (header, and payload for a write), so that
/// reading it will not wait for the network.
fn next_request_buffered(buffered: &[u8]) -> bool {
    let Some(header) = buffered.get(..REQUEST_HEADER_BYTES) else {
        return false;
    };
    let kind = u16::from_be_bytes([header[6], header[7]]);
    if kind != proto::CMD_WRITE {
        return true;
    }
    let length = u32::from_be_bytes([header[24], header[25], header[26], header[27]]);
    buffered.len() - REQUEST_HEADER_BYTES >= length as usize
}

/// Reads a write's payload: what is already buffered is copied, the rest is read straight
/// from the stream into the payload, so large writes are not copied through the buffer.
fn read_payload<R: Read>(
    reader: &mut BufReader<R>,
    data: &mut Vec<u8>,
    length: usize,
) -> Result<(), SessionError> {
    // A recycled buffer is cut or grown to size; what it held is overwritten below.
    if data.len() >= length {
        data.truncate(length);
    } else {
        data.resize(length, 0);
    }
    let buffered = reader.buffer().len().min(length);
    data[..buffered].copy_from_slice(&reader.buffer()[..buffered]);
    reader.consume(buffered);
    reader.get_mut().read_exact(&mut data[buffered..])?;
    Ok(())
}

/// Fills `buf`, or returns false if the stream ends before its first byte.
fn read_exact_or_eof<R: Read>(reader: &mut R, buf: &mut [u8]) -> Result<bool, SessionError> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) if filled == 0 => return Ok(false),
            Ok(0) => return Err(SessionError::Truncated),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(true)
}

/// Reads and drops `bytes` bytes (a rejected write's payload) without buffering them.
fn discard<R: Read>(reader: &mut R, bytes: u64) -> Result<(), SessionError> {
    let copied = io::copy(&mut reader.take(bytes), &mut io::sink())?;
    if copied < bytes {
        return Err(SessionError::Truncated);
    }
    Ok(())
}

/// The reply to a rejected request.
pub fn rejected_reply(handle: u64, kind: u16, rejection: Rejection, credits: u32) -> Reply {
    Reply {
        handle,
        read_offset: (kind == proto::CMD_READ).then_some(0),
        block_status: false,
        result: Err(Failure {
            errno: rejection.errno,
            message: rejection.message,
        }),
        data: Vec::new(),
        credits,
    }
}

/// Writes one reply: a read's data after its header; errors as a structured ERROR chunk
/// (with the message) when structured replies were negotiated, else as a simple reply.
pub fn write_reply<W: Write>(writer: &mut W, structured: bool, reply: &Reply) -> io::Result<()> {
    let mut header = Vec::with_capacity(32);
    match (&reply.result, reply.read_offset) {
        // Block status is only served once structured replies are negotiated.
        (Ok(()), _) if reply.block_status => {
            proto::structured_block_status(&mut header, reply.handle, &reply.data);
            writer.write_all(&header)?;
        }
        (Ok(()), Some(offset)) => {
            if structured {
                let len = reply.data.len() as u32;
                proto::structured_read_header(&mut header, reply.handle, offset, len);
            } else {
                proto::simple_reply(&mut header, 0, reply.handle);
            }
            writer.write_all(&header)?;
            writer.write_all(&reply.data)?;
        }
        (Ok(()), None) => {
            proto::simple_reply(&mut header, 0, reply.handle);
            writer.write_all(&header)?;
        }
        (Err(f), _) => {
            proto::error_reply_for(&mut header, structured, reply.handle, f.errno, &f.message);
            writer.write_all(&header)?;
        }
    }
    Ok(())
}

/// Runs a whole connection on `input` — the handshake, then every request executed at once
/// on a 1 MiB RAM disk — and returns the bytes the server sent. It is the fuzz target's
/// body (serve/fuzz) and the property tests': any input must end in a reply stream or a
/// clean stop, never a panic.
pub fn replay(input: &[u8]) -> Vec<u8> {
    use crate::proto::ExportInfo;
    use crate::{Executor, MemDevice};

    let export = ExportInfo {
        name: "afa".into(),
        description: "fuzz".into(),
        size_bytes: 1 << 20,
        preferred_block_bytes: 4096,
        max_request_bytes: 64 * 1024,
        read_only: false,
    };
    let mut reader = input;
    let mut out = Vec::new();
    let negotiated = match handshake(&mut reader, &mut out, Negotiation::new(export.clone())) {
        Ok(Some(n)) => n,
        _ => return out,
    };
    let device = match MemDevice::new(4096, 256) {
        Ok(d) => d,
        Err(_) => return out,
    };
    let Ok(mut exec) = Executor::new(Box::new(device)) else {
        return out;
    };
    let limits = Limits {
        size_bytes: export.size_bytes,
        max_request_bytes: export.max_request_bytes,
        structured_replies: negotiated.structured_replies,
        base_allocation: negotiated.base_allocation,
        read_only: false,
    };
    let mut now_ns = 0;
    // Bursts as the unpaced connection reads them, in place (the paced one reads the same
    // requests one by one through `read_requests`; the tests check both parse alike).
    let mut reader = BurstReader::new(reader, &[]);
    let mut buf = BurstBuffer::default();
    let mut burst = Vec::new();
    loop {
        burst.clear();
        let read = reader.read_burst(&mut buf, &limits, 4, &mut burst);
        for parsed in burst.drain(..) {
            let reply = match parsed {
                Parsed::Job {
                    handle,
                    request,
                    payload,
                } => {
                    now_ns += 1_000;
                    let mut data = Vec::new();
                    let result = exec
                        .execute_into(now_ns, &request, &mut data, Some(&buf.bytes()[payload]))
                        .map(|_| ());
                    Reply {
                        handle,
                        read_offset: match request {
                            Request::Read { offset, .. } => Some(offset),
                            _ => None,
                        },
                        block_status: matches!(request, Request::BlockStatus { .. }),
                        result,
                        data,
                        credits: 1,
                    }
                }
                Parsed::Rejected {
                    handle,
                    kind,
                    rejection,
                } => rejected_reply(handle, kind, rejection, 1),
            };
            if write_reply(&mut out, negotiated.structured_replies, &reply).is_err() {
                return out;
            }
        }
        if !matches!(read, Ok(None)) {
            return out;
        }
    }
}
