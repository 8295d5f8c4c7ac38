//! The NBD wire protocol, without I/O: constants, the option-haggling state machine, request
//! parsing and checking, and reply encoding. Everything here works on byte slices, so the
//! session code feeds it from sockets and the fuzz target feeds it arbitrary bytes.
//!
//! The subset follows the NBD protocol document (NetworkBlockDevice/nbd, doc/proto.md):
//! fixed newstyle negotiation; NBD_OPT_EXPORT_NAME, ABORT, LIST, INFO, GO and
//! STRUCTURED_REPLY, LIST_META_CONTEXT and SET_META_CONTEXT (the one context
//! `base:allocation`); commands READ, WRITE, DISC, FLUSH, TRIM, WRITE_ZEROES and BLOCK_STATUS
//! with the FUA, NO_HOLE, DF and REQ_ONE flags. TLS and extended headers are declined with
//! NBD_REP_ERR_UNSUP, which every client must accept.

use std::fmt;

/// "NBDMAGIC", the first eight bytes the server sends.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// "IHAVEOPT": the newstyle greeting and the prefix of every client option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Prefix of every option reply.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// Handshake flags (server) and client flags.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// Transmission flags.
pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const FLAG_READ_ONLY: u16 = 1 << 1;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const FLAG_SEND_DF: u16 = 1 << 7;
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;

// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;
pub const OPT_EXTENDED_HEADERS: u32 = 11;

// Option reply types.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
const REP_ERR: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_ERR | 1;
pub const REP_ERR_POLICY: u32 = REP_ERR | 2;
pub const REP_ERR_INVALID: u32 = REP_ERR | 3;
pub const REP_ERR_UNKNOWN: u32 = REP_ERR | 6;

// Information types in NBD_REP_INFO.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// Commands.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;

// Structured reply chunk types and flags.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;

/// The one metadata context served, and the id this server gives it.
pub const BASE_ALLOCATION: &str = "base:allocation";
pub const BASE_ALLOCATION_ID: u32 = 1;
/// `base:allocation` status flags: no storage is allocated, and the range reads as zeroes.
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;

/// Error values in replies (the protocol fixes them to the common Linux errno values).
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ESHUTDOWN: u32 = 108;

/// Bytes of a client option header: magic, option, length.
pub const OPTION_HEADER_BYTES: usize = 16;
/// Bytes of a request header: magic, flags, type, handle, offset, length.
pub const REQUEST_HEADER_BYTES: usize = 28;
/// The largest option payload accepted. Export names are at most 4096 bytes by the
/// protocol, and no option this server understands carries more than a name and a short
/// list; anything larger is a broken or hostile client, and the connection is closed.
pub const MAX_OPTION_BYTES: u32 = 16 * 1024;
/// Strings (export names, messages) are at most 4096 bytes by the protocol.
pub const MAX_STRING_BYTES: usize = 4096;
/// Options a client may send before it must have chosen an export; a client that keeps
/// haggling beyond this is looping, and the connection is closed.
pub const MAX_OPTIONS: u32 = 64;

/// A violation that ends the connection: the stream cannot be trusted any more.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("client flags {0:#x} carry bits this server did not offer")]
    UnknownClientFlags(u32),
    #[error("client did not set NBD_FLAG_C_FIXED_NEWSTYLE (flags {0:#x}); only fixed newstyle negotiation is served")]
    NotFixedNewstyle(u32),
    #[error("option magic {0:#018x} is not IHAVEOPT")]
    BadOptionMagic(u64),
    #[error("option {option} carries {length} bytes, more than the {max} this server accepts")]
    OptionTooLong { option: u32, length: u32, max: u32 },
    #[error("more than {0} options without choosing an export")]
    TooManyOptions(u32),
    #[error("NBD_OPT_EXPORT_NAME asked for unknown export {0:?}")]
    UnknownExportName(String),
    #[error("request magic {0:#010x} is not NBD_REQUEST_MAGIC")]
    BadRequestMagic(u32),
}

/// The export a connection may choose: its names, size and limits.
#[derive(Debug, Clone)]
pub struct ExportInfo {
    /// The export's name; the empty name (the protocol's default export) also selects it.
    pub name: String,
    /// Shown by clients such as nbdinfo.
    pub description: String,
    pub size_bytes: u64,
    /// The preferred request granularity: the device's sector.
    pub preferred_block_bytes: u32,
    /// The largest READ or WRITE payload served; larger requests get EINVAL.
    pub max_request_bytes: u32,
    /// Advertised with NBD_FLAG_READ_ONLY; writes, trims and write-zeroes get EPERM.
    pub read_only: bool,
}

impl ExportInfo {
    /// True when a client's requested export name selects this export.
    pub fn matches(&self, requested: &str) -> bool {
        requested.is_empty() || requested == self.name
    }
}

/// What option haggling settled, for the transmission phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    pub structured_replies: bool,
    /// The client chose the `base:allocation` context: it may send NBD_CMD_BLOCK_STATUS.
    pub base_allocation: bool,
    pub transmission_flags: u16,
}

/// The server's first 18 bytes: NBDMAGIC, IHAVEOPT and the handshake flags.
pub fn greeting() -> [u8; 18] {
    let mut g = [0u8; 18];
    g[0..8].copy_from_slice(&NBD_MAGIC.to_be_bytes());
    g[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    g[16..18].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    g
}

/// A client option header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub length: u32,
}

/// Parses an option header and checks its magic and length.
pub fn parse_option_header(buf: &[u8; OPTION_HEADER_BYTES]) -> Result<OptionHeader, ProtocolError> {
    let magic = u64::from_be_bytes(take(buf, 0));
    if magic != IHAVEOPT {
        return Err(ProtocolError::BadOptionMagic(magic));
    }
    let header = OptionHeader {
        option: u32::from_be_bytes(take(buf, 8)),
        length: u32::from_be_bytes(take(buf, 12)),
    };
    if header.length > MAX_OPTION_BYTES {
        return Err(ProtocolError::OptionTooLong {
            option: header.option,
            length: header.length,
            max: MAX_OPTION_BYTES,
        });
    }
    Ok(header)
}

/// What the session must do after an option.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OptionOutcome {
    /// Send the reply bytes and read the next option.
    Continue,
    /// Send the reply bytes, then enter the transmission phase.
    Transmission(Negotiated),
    /// Send the reply bytes (if any), then close: the client asked to abort.
    Abort,
}

/// Option haggling as a state machine: the session feeds it the client flags and each
/// option, and sends the bytes it produces.
#[derive(Debug)]
pub struct Negotiation {
    export: ExportInfo,
    no_zeroes: bool,
    structured_replies: bool,
    base_allocation: bool,
    options_seen: u32,
    /// When set, every option but ABORT is refused with NBD_REP_ERR_POLICY and this
    /// message: the server is at its connection limit.
    refusal: Option<String>,
}

impl Negotiation {
    pub fn new(export: ExportInfo) -> Self {
        Self {
            export,
            no_zeroes: false,
            structured_replies: false,
            base_allocation: false,
            options_seen: 0,
            refusal: None,
        }
    }

    /// A negotiation that refuses every option with `message` (used when the server is at
    /// its connection limit, so the client learns why instead of seeing a bare close).
    pub fn refusing(export: ExportInfo, message: String) -> Self {
        Self {
            refusal: Some(message),
            ..Self::new(export)
        }
    }

    /// Checks the client's 32-bit flags, sent right after the greeting.
    pub fn client_flags(&mut self, buf: [u8; 4]) -> Result<(), ProtocolError> {
        let flags = u32::from_be_bytes(buf);
        if flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
            return Err(ProtocolError::UnknownClientFlags(flags));
        }
        // Plain newstyle clients cannot receive option replies; every client in use today
        // (qemu, libnbd, the Linux nbd-client) speaks fixed newstyle.
        if flags & FLAG_C_FIXED_NEWSTYLE == 0 {
            return Err(ProtocolError::NotFixedNewstyle(flags));
        }
        self.no_zeroes = flags & FLAG_C_NO_ZEROES != 0;
        Ok(())
    }

    /// The transmission flags for this connection so far.
    fn transmission_flags(&self) -> u16 {
        let mut flags = FLAG_HAS_FLAGS
            | FLAG_SEND_FLUSH
            | FLAG_SEND_FUA
            | FLAG_SEND_TRIM
            | FLAG_SEND_WRITE_ZEROES
            // One engine thread serves every connection and no connection has a cache of
            // its own, so a FLUSH on one connection covers writes completed on all.
            | FLAG_CAN_MULTI_CONN;
        if self.export.read_only {
            flags |= FLAG_READ_ONLY;
        }
        if self.structured_replies {
            // A read is always answered with one data chunk, so "do not fragment" holds.
            flags |= FLAG_SEND_DF;
        }
        flags
    }

    fn negotiated(&self) -> Negotiated {
        Negotiated {
            structured_replies: self.structured_replies,
            base_allocation: self.base_allocation,
            transmission_flags: self.transmission_flags(),
        }
    }

    /// Handles one option (`data` is its payload, `header.length` bytes) and appends the
    /// reply bytes to `out`.
    pub fn option(
        &mut self,
        header: OptionHeader,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<OptionOutcome, ProtocolError> {
        self.options_seen += 1;
        if self.options_seen > MAX_OPTIONS {
            return Err(ProtocolError::TooManyOptions(MAX_OPTIONS));
        }
        let opt = header.option;
        if let Some(message) = &self.refusal {
            return match opt {
                OPT_ABORT => {
                    option_reply(out, opt, REP_ACK, &[]);
                    Ok(OptionOutcome::Abort)
                }
                // EXPORT_NAME cannot carry an error; closing is the only refusal.
                OPT_EXPORT_NAME => Err(ProtocolError::UnknownExportName(format!(
                    "(refused: {message})"
                ))),
                _ => {
                    option_reply(out, opt, REP_ERR_POLICY, message.as_bytes());
                    Ok(OptionOutcome::Continue)
                }
            };
        }
        match opt {
            OPT_EXPORT_NAME => {
                let name = String::from_utf8_lossy(data).into_owned();
                if !self.export.matches(&name) {
                    // This option cannot carry an error; the protocol says to close.
                    return Err(ProtocolError::UnknownExportName(name));
                }
                out.extend_from_slice(&self.export.size_bytes.to_be_bytes());
                out.extend_from_slice(&self.transmission_flags().to_be_bytes());
                if !self.no_zeroes {
                    out.extend_from_slice(&[0u8; 124]);
                }
                Ok(OptionOutcome::Transmission(self.negotiated()))
            }
            OPT_ABORT => {
                option_reply(out, opt, REP_ACK, &[]);
                Ok(OptionOutcome::Abort)
            }
            OPT_LIST => {
                if !data.is_empty() {
                    error_reply(out, opt, REP_ERR_INVALID, "NBD_OPT_LIST carries no data");
                    return Ok(OptionOutcome::Continue);
                }
                let name = self.export.name.as_bytes();
                let mut payload = Vec::with_capacity(4 + name.len());
                payload.extend_from_slice(&(name.len() as u32).to_be_bytes());
                payload.extend_from_slice(name);
                option_reply(out, opt, REP_SERVER, &payload);
                option_reply(out, opt, REP_ACK, &[]);
                Ok(OptionOutcome::Continue)
            }
            OPT_INFO | OPT_GO => self.info_or_go(opt, data, out),
            OPT_STRUCTURED_REPLY => {
                // Structured replies are supported: a read is answered with one
                // OFFSET_DATA chunk, and an error with an ERROR chunk that carries a
                // message naming the problem (which simple replies cannot carry). Other
                // successful commands keep the 16-byte simple reply, as the protocol
                // allows.
                if !data.is_empty() {
                    error_reply(
                        out,
                        opt,
                        REP_ERR_INVALID,
                        "NBD_OPT_STRUCTURED_REPLY carries no data",
                    );
                } else if self.structured_replies {
                    error_reply(
                        out,
                        opt,
                        REP_ERR_INVALID,
                        "structured replies are already negotiated",
                    );
                } else {
                    self.structured_replies = true;
                    option_reply(out, opt, REP_ACK, &[]);
                }
                Ok(OptionOutcome::Continue)
            }
            OPT_STARTTLS => {
                error_reply(
                    out,
                    opt,
                    REP_ERR_UNSUP,
                    "TLS is not supported; afa serves on loopback or a unix socket",
                );
                Ok(OptionOutcome::Continue)
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                self.meta_context(opt, data, out);
                Ok(OptionOutcome::Continue)
            }
            OPT_EXTENDED_HEADERS => {
                error_reply(
                    out,
                    opt,
                    REP_ERR_UNSUP,
                    "extended headers are not supported",
                );
                Ok(OptionOutcome::Continue)
            }
            other => {
                error_reply(
                    out,
                    other,
                    REP_ERR_UNSUP,
                    &format!("option {other} is not supported"),
                );
                Ok(OptionOutcome::Continue)
            }
        }
    }

    /// NBD_OPT_LIST_META_CONTEXT and NBD_OPT_SET_META_CONTEXT: the payload is the export
    /// name and a list of queries. `base:allocation` is the one context served; a LIST
    /// query of `base:` (or a LIST with no queries) names it too. SET chooses the contexts
    /// for the transmission phase (those it names, none if it names none), which needs
    /// structured replies, since block status comes back in a structured chunk.
    fn meta_context(&mut self, opt: u32, data: &[u8], out: &mut Vec<u8>) {
        let setting = opt == OPT_SET_META_CONTEXT;
        let Some((name, queries)) = parse_meta_context_request(data) else {
            error_reply(
                out,
                opt,
                REP_ERR_INVALID,
                "malformed meta context request: export name length, name, query count, then each query's length and text",
            );
            return;
        };
        if setting && !self.structured_replies {
            error_reply(
                out,
                opt,
                REP_ERR_INVALID,
                "NBD_OPT_SET_META_CONTEXT needs structured replies (NBD_OPT_STRUCTURED_REPLY first)",
            );
            return;
        }
        if !self.export.matches(&name) {
            error_reply(
                out,
                opt,
                REP_ERR_UNKNOWN,
                &format!("no export named {name:?}"),
            );
            return;
        }
        let names_it = |q: &str| q == BASE_ALLOCATION || (!setting && q == "base:");
        let chosen = if queries.is_empty() {
            !setting
        } else {
            queries.iter().any(|q| names_it(q))
        };
        if chosen {
            let mut payload = BASE_ALLOCATION_ID.to_be_bytes().to_vec();
            payload.extend_from_slice(BASE_ALLOCATION.as_bytes());
            option_reply(out, opt, REP_META_CONTEXT, &payload);
        }
        if setting {
            self.base_allocation = chosen;
        }
        option_reply(out, opt, REP_ACK, &[]);
    }

    fn info_or_go(
        &mut self,
        opt: u32,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<OptionOutcome, ProtocolError> {
        let Some((name, requests)) = parse_info_request(data) else {
            error_reply(
                out,
                opt,
                REP_ERR_INVALID,
                "malformed NBD_OPT_INFO/GO payload (name length, name, count, info types)",
            );
            return Ok(OptionOutcome::Continue);
        };
        if !self.export.matches(&name) {
            error_reply(
                out,
                opt,
                REP_ERR_UNKNOWN,
                &format!(
                    "no export named {name:?}; this server exports {:?}",
                    self.export.name
                ),
            );
            return Ok(OptionOutcome::Continue);
        }
        let mut info = Vec::with_capacity(16);
        info.extend_from_slice(&INFO_EXPORT.to_be_bytes());
        info.extend_from_slice(&self.export.size_bytes.to_be_bytes());
        info.extend_from_slice(&self.transmission_flags().to_be_bytes());
        option_reply(out, opt, REP_INFO, &info);
        let mut sent = [false; 4];
        for request in requests {
            let index = request as usize;
            if index >= sent.len() || sent[index] {
                // Unknown information types are ignored, as the protocol requires.
                continue;
            }
            sent[index] = true;
            let mut info = Vec::new();
            info.extend_from_slice(&request.to_be_bytes());
            match request {
                INFO_NAME => info.extend_from_slice(self.export.name.as_bytes()),
                INFO_DESCRIPTION => info.extend_from_slice(self.export.description.as_bytes()),
                INFO_BLOCK_SIZE => {
                    // The engine serves any byte range (it reads and rewrites partial
                    // sectors itself, atomically with respect to other requests), so the
                    // minimum is one byte; the sector is the preferred size.
                    info.extend_from_slice(&1u32.to_be_bytes());
                    info.extend_from_slice(&self.export.preferred_block_bytes.to_be_bytes());
                    info.extend_from_slice(&self.export.max_request_bytes.to_be_bytes());
                }
                _ => continue,
            }
            option_reply(out, opt, REP_INFO, &info);
        }
        option_reply(out, opt, REP_ACK, &[]);
        if opt == OPT_GO {
            Ok(OptionOutcome::Transmission(self.negotiated()))
        } else {
            Ok(OptionOutcome::Continue)
        }
    }
}

/// Splits an NBD_OPT_INFO/GO payload into the export name and the information types.
fn parse_info_request(data: &[u8]) -> Option<(String, Vec<u16>)> {
    let name_len = u32::from_be_bytes(data.get(0..4)?.try_into().ok()?) as usize;
    if name_len > MAX_STRING_BYTES {
        return None;
    }
    let name = data.get(4..4 + name_len)?;
    let name = std::str::from_utf8(name).ok()?.to_string();
    let rest = &data[4 + name_len..];
    let count = u16::from_be_bytes(rest.get(0..2)?.try_into().ok()?) as usize;
    let list = &rest[2..];
    if list.len() != count * 2 {
        return None;
    }
    let requests = list
        .chunks_exact(2)
        .map(|c| u16::from_be_bytes([c[0], c[1]]))
        .collect();
    Some((name, requests))
}

/// Splits a meta context request into the export name and the queries; `None` when the
/// lengths do not add up to the payload or a string is longer than the protocol allows.
fn parse_meta_context_request(data: &[u8]) -> Option<(String, Vec<String>)> {
    fn string(data: &[u8], at: &mut usize) -> Option<String> {
        let len = u32::from_be_bytes(data.get(*at..*at + 4)?.try_into().ok()?) as usize;
        if len > MAX_STRING_BYTES {
            return None;
        }
        let bytes = data.get(*at + 4..*at + 4 + len)?;
        *at += 4 + len;
        Some(String::from_utf8_lossy(bytes).into_owned())
    }
    let mut at = 0;
    let name = string(data, &mut at)?;
    let count = u32::from_be_bytes(data.get(at..at + 4)?.try_into().ok()?);
    at += 4;
    // Each query takes at least its 4-byte length, so the count is bounded by the payload.
    if count as usize > (data.len() - at) / 4 {
        return None;
    }
    let queries = (0..count)
        .map(|_| string(data, &mut at))
        .collect::<Option<Vec<String>>>()?;
    (at == data.len()).then_some((name, queries))
}

fn option_reply(out: &mut Vec<u8>, option: u32, reply: u32, payload: &[u8]) {
    out.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply.to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
}

fn error_reply(out: &mut Vec<u8>, option: u32, reply: u32, message: &str) {
    option_reply(out, option, reply, truncate(message).as_bytes());
}

/// Cuts a message to the protocol's string limit at a character boundary.
fn truncate(message: &str) -> &str {
    if message.len() <= MAX_STRING_BYTES {
        return message;
    }
    let mut end = MAX_STRING_BYTES;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    &message[..end]
}

/// A request header as sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    pub flags: u16,
    pub kind: u16,
    pub handle: u64,
    pub offset: u64,
    pub length: u32,
}

/// Parses a request header; a wrong magic means the stream is out of step.
pub fn parse_request_header(
    buf: &[u8; REQUEST_HEADER_BYTES],
) -> Result<RequestHeader, ProtocolError> {
    let magic = u32::from_be_bytes(take(buf, 0));
    if magic != REQUEST_MAGIC {
        return Err(ProtocolError::BadRequestMagic(magic));
    }
    Ok(RequestHeader {
        flags: u16::from_be_bytes(take(buf, 4)),
        kind: u16::from_be_bytes(take(buf, 6)),
        handle: u64::from_be_bytes(take(buf, 8)),
        offset: u64::from_be_bytes(take(buf, 16)),
        length: u32::from_be_bytes(take(buf, 24)),
    })
}

fn take<const N: usize>(buf: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&buf[at..at + N]);
    a
}

/// A checked request, in bytes; the engine maps it onto sectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    Read {
        offset: u64,
        length: u32,
    },
    /// The `length` payload bytes follow the header on the wire.
    Write {
        offset: u64,
        length: u32,
        fua: bool,
    },
    Flush,
    Trim {
        offset: u64,
        length: u32,
        fua: bool,
    },
    /// `no_hole`: the client wants the zeroes written, not deallocated.
    WriteZeroes {
        offset: u64,
        length: u32,
        fua: bool,
        no_hole: bool,
    },
    /// NBD_CMD_BLOCK_STATUS in the `base:allocation` context; `req_one`: the client wants
    /// one extent only.
    BlockStatus {
        offset: u64,
        length: u32,
        req_one: bool,
    },
    Disconnect,
}

/// A request the server answers with an error and then carries on: the stream is still in
/// step (a rejected WRITE's payload is read and dropped first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub errno: u32,
    pub message: String,
    /// Payload bytes that follow the header and must be skipped.
    pub discard_bytes: u32,
}

/// The facts a request is checked against.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub size_bytes: u64,
    pub max_request_bytes: u32,
    pub structured_replies: bool,
    /// The client chose `base:allocation`, so it may ask for block status.
    pub base_allocation: bool,
    /// The export is read-only: requests that would change it get EPERM.
    pub read_only: bool,
}

impl RequestHeader {
    /// Checks a request against the export and the negotiated options.
    pub fn check(&self, limits: &Limits) -> Result<Request, Rejection> {
        let payload = if self.kind == CMD_WRITE {
            self.length
        } else {
            0
        };
        let reject = |errno: u32, message: String| Rejection {
            errno,
            message,
            discard_bytes: payload,
        };
        let allowed_flags = match self.kind {
            CMD_READ if limits.structured_replies => CMD_FLAG_FUA | CMD_FLAG_DF,
            CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE,
            CMD_READ | CMD_WRITE | CMD_FLUSH | CMD_TRIM | CMD_DISC => CMD_FLAG_FUA,
            CMD_BLOCK_STATUS if limits.base_allocation => CMD_FLAG_REQ_ONE,
            CMD_BLOCK_STATUS => return Err(reject(
                EINVAL,
                "NBD_CMD_BLOCK_STATUS needs the base:allocation context (NBD_OPT_SET_META_CONTEXT)"
                    .into(),
            )),
            other => {
                return Err(reject(
                    EINVAL,
                    format!("command type {other} is not supported"),
                ))
            }
        };
        if self.flags & !allowed_flags != 0 {
            return Err(reject(
                EINVAL,
                format!(
                    "command flags {:#x} are not valid for {}",
                    self.flags,
                    command_name(self.kind)
                ),
            ));
        }
        let fua = self.flags & CMD_FLAG_FUA != 0;
        if limits.read_only && matches!(self.kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES) {
            return Err(reject(
                EPERM,
                format!("{} on a read-only export", command_name(self.kind)),
            ));
        }
        match self.kind {
            CMD_DISC => return Ok(Request::Disconnect),
            CMD_FLUSH => {
                if self.offset != 0 || self.length != 0 {
                    return Err(reject(
                        EINVAL,
                        format!(
                            "NBD_CMD_FLUSH must have offset and length 0 (got {} and {})",
                            self.offset, self.length
                        ),
                    ));
                }
                return Ok(Request::Flush);
            }
            _ => {}
        }
        let name = command_name(self.kind);
        if self.length == 0 {
            return Err(reject(EINVAL, format!("{name} of 0 bytes")));
        }
        let end = self.offset.checked_add(self.length as u64);
        if end.is_none_or(|e| e > limits.size_bytes) {
            return Err(reject(
                EINVAL,
                format!(
                    "{name} of {} bytes at offset {} ends past the export's {} bytes",
                    self.length, self.offset, limits.size_bytes
                ),
            ));
        }
        let carries_data = matches!(self.kind, CMD_READ | CMD_WRITE);
        if carries_data && self.length > limits.max_request_bytes {
            return Err(reject(
                EINVAL,
                format!(
                    "{name} of {} bytes exceeds the maximum request of {} bytes",
                    self.length, limits.max_request_bytes
                ),
            ));
        }
        let (offset, length) = (self.offset, self.length);
        Ok(match self.kind {
            CMD_READ => Request::Read { offset, length },
            CMD_WRITE => Request::Write {
                offset,
                length,
                fua,
            },
            CMD_TRIM => Request::Trim {
                offset,
                length,
                fua,
            },
            CMD_BLOCK_STATUS => Request::BlockStatus {
                offset,
                length,
                req_one: self.flags & CMD_FLAG_REQ_ONE != 0,
            },
            _ => Request::WriteZeroes {
                offset,
                length,
                fua,
                no_hole: self.flags & CMD_FLAG_NO_HOLE != 0,
            },
        })
    }
}

/// The protocol's name of a command type, for messages.
pub fn command_name(kind: u16) -> CommandName {
    CommandName(kind)
}

/// Displays a command type as its protocol name.
#[derive(Debug, Clone, Copy)]
pub struct CommandName(u16);

impl fmt::Display for CommandName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            CMD_READ => f.write_str("NBD_CMD_READ"),
            CMD_WRITE => f.write_str("NBD_CMD_WRITE"),
            CMD_DISC => f.write_str("NBD_CMD_DISC"),
            CMD_FLUSH => f.write_str("NBD_CMD_FLUSH"),
            CMD_TRIM => f.write_str("NBD_CMD_TRIM"),
            CMD_WRITE_ZEROES => f.write_str("NBD_CMD_WRITE_ZEROES"),
            CMD_BLOCK_STATUS => f.write_str("NBD_CMD_BLOCK_STATUS"),
            other => write!(f, "command type {other}"),
        }
    }
}

/// Appends a simple reply header (the data of a successful read follows it).
pub fn simple_reply(out: &mut Vec<u8>, errno: u32, handle: u64) {
    out.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&errno.to_be_bytes());
    out.extend_from_slice(&handle.to_be_bytes());
}

/// Appends the header of a final structured reply chunk of type `kind` whose payload is
/// `payload_len` bytes.
fn final_chunk_header(out: &mut Vec<u8>, handle: u64, kind: u16, payload_len: u32) {
    out.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&REPLY_FLAG_DONE.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&handle.to_be_bytes());
    out.extend_from_slice(&payload_len.to_be_bytes());
}

/// Appends the header of a final OFFSET_DATA chunk for `data_len` bytes read at `offset`;
/// the data follows it.
pub fn structured_read_header(out: &mut Vec<u8>, handle: u64, offset: u64, data_len: u32) {
    final_chunk_header(out, handle, REPLY_TYPE_OFFSET_DATA, data_len + 8);
    out.extend_from_slice(&offset.to_be_bytes());
}

/// Appends a final BLOCK_STATUS chunk of the `base:allocation` context whose descriptors,
/// each a length in bytes and the status flags, are `descriptors` (8 bytes each, already
/// in wire order).
pub fn structured_block_status(out: &mut Vec<u8>, handle: u64, descriptors: &[u8]) {
    let len = 4 + descriptors.len() as u32;
    final_chunk_header(out, handle, REPLY_TYPE_BLOCK_STATUS, len);
    out.extend_from_slice(&BASE_ALLOCATION_ID.to_be_bytes());
    out.extend_from_slice(descriptors);
}

/// Appends a final ERROR chunk carrying `message`.
pub fn structured_error(out: &mut Vec<u8>, handle: u64, errno: u32, message: &str) {
    let message = truncate(message).as_bytes();
    final_chunk_header(out, handle, REPLY_TYPE_ERROR, 6 + message.len() as u32);
    out.extend_from_slice(&errno.to_be_bytes());
    out.extend_from_slice(&(message.len() as u16).to_be_bytes());
    out.extend_from_slice(message);
}

/// Appends the reply to a request that failed: a structured ERROR chunk with the message
/// when structured replies are negotiated, else a simple reply (which carries the errno
/// only, and no data even for a read).
pub fn error_reply_for(
    out: &mut Vec<u8>,
    structured_replies: bool,
    handle: u64,
    errno: u32,
    message: &str,
) {
    if structured_replies {
        structured_error(out, handle, errno, message);
    } else {
        simple_reply(out, errno, handle);
    }
}
