//! One connection's protocol loops over any byte stream: the handshake, reading requests
//! and writing replies. They are generic over `Read`/`Write`, so the server runs them on
//! sockets and tests and the fuzz target run them on in-memory buffers.

use std::io::{self, BufRead, BufReader, Read, Write};

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

/// Reads one burst: the next request (waiting for it), then every request already complete
/// in the buffer, up to `max` in all, so a burst never waits for the network after its
/// first request. Returns the burst and, when the stream ended after it, how it ended.
pub fn read_burst<R: Read>(
    reader: &mut BufReader<R>,
    limits: &Limits,
    mut take_buffer: impl FnMut() -> Vec<u8>,
    max: usize,
    burst: &mut Vec<Incoming>,
) -> Result<Option<End>, SessionError> {
    loop {
        match read_request(reader, limits, &mut take_buffer)? {
            Ok(incoming) => burst.push(incoming),
            Err(end) => return Ok(Some(end)),
        }
        if burst.len() >= max.max(1) || !next_request_buffered(reader.buffer()) {
            return Ok(None);
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
    };
    let mut now_ns = 0;
    let mut reader = BufReader::with_capacity(4096, reader);
    // Bursts as the unpaced connection reads them (the paced one reads the same requests
    // one by one through `read_requests`, which shares `read_request`).
    let mut burst = Vec::new();
    loop {
        let read = read_burst(&mut reader, &limits, Vec::new, 4, &mut burst);
        for incoming in burst.drain(..) {
            let reply = match incoming {
                Incoming::Job {
                    handle,
                    request,
                    mut data,
                } => {
                    now_ns += 1_000;
                    let result = exec.execute_into(now_ns, &request, &mut data).map(|_| ());
                    Reply {
                        handle,
                        read_offset: match request {
                            Request::Read { offset, .. } => Some(offset),
                            _ => None,
                        },
                        result,
                        data,
                        credits: 1,
                    }
                }
                Incoming::Rejected {
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
