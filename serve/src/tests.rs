//! Unit and property tests of the parser, the executor and the engine.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use afa_sim::TimeNs;
use afa_ssd::{
    validate_command, BlockDevice, Command, Completion, DeviceError, DeviceInfo, ReadBuffers,
};
use proptest::prelude::*;

use crate::engine::{EngineHandle, InlineJob, Job, Reply};
use crate::proto::*;
use crate::session::replay;
use crate::{Executor, MemDevice, Pace};

/// A client's bytes for a fixed-newstyle handshake onto the default export.
fn handshake_bytes(structured: bool) -> Vec<u8> {
    let mut b = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES)
        .to_be_bytes()
        .to_vec();
    let mut option = |opt: u32, data: &[u8]| {
        b.extend_from_slice(&IHAVEOPT.to_be_bytes());
        b.extend_from_slice(&opt.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
    };
    if structured {
        option(OPT_STRUCTURED_REPLY, &[]);
    }
    option(OPT_GO, &[0, 0, 0, 0, 0, 0]);
    b
}

fn request(flags: u16, kind: u16, handle: u64, offset: u64, length: u32) -> Vec<u8> {
    let mut b = REQUEST_MAGIC.to_be_bytes().to_vec();
    b.extend_from_slice(&flags.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&handle.to_be_bytes());
    b.extend_from_slice(&offset.to_be_bytes());
    b.extend_from_slice(&length.to_be_bytes());
    b
}

#[test]
fn a_scripted_session_writes_and_reads_back() {
    let mut input = handshake_bytes(false);
    input.extend(request(0, CMD_WRITE, 7, 4096, 8));
    input.extend_from_slice(b"afa-data");
    input.extend(request(0, CMD_READ, 8, 4096, 8));
    input.extend(request(0, CMD_DISC, 9, 0, 0));
    let out = replay(&input);
    // Greeting, GO's INFO_EXPORT and ACK, then two simple replies, the second with data.
    let tail = &out[out.len() - 16 - 24..];
    assert_eq!(&tail[..4], &SIMPLE_REPLY_MAGIC.to_be_bytes());
    assert_eq!(&tail[8..16], &7u64.to_be_bytes());
    assert_eq!(&tail[16..20], &SIMPLE_REPLY_MAGIC.to_be_bytes());
    assert_eq!(&tail[20..24], &0u32.to_be_bytes());
    assert_eq!(&tail[32..], b"afa-data");
}

#[test]
fn a_refusing_negotiation_answers_policy_and_acknowledges_abort() {
    let export = ExportInfo {
        name: "afa".into(),
        description: String::new(),
        size_bytes: 4096,
        preferred_block_bytes: 4096,
        max_request_bytes: 4096,
        read_only: false,
    };
    let mut n = Negotiation::refusing(export, "full".into());
    n.client_flags(FLAG_C_FIXED_NEWSTYLE.to_be_bytes()).unwrap();
    let mut out = Vec::new();
    let go = OptionHeader {
        option: OPT_GO,
        length: 0,
    };
    assert_eq!(n.option(go, &[], &mut out), Ok(OptionOutcome::Continue));
    assert_eq!(&out[12..16], &REP_ERR_POLICY.to_be_bytes());
    assert_eq!(&out[20..], b"full");
    let name = OptionHeader {
        option: OPT_EXPORT_NAME,
        length: 0,
    };
    assert!(n.option(name, &[], &mut out).is_err());
    let abort = OptionHeader {
        option: OPT_ABORT,
        length: 0,
    };
    assert_eq!(n.option(abort, &[], &mut out), Ok(OptionOutcome::Abort));
}

/// A meta context request's payload: the export name, then each query.
fn meta_context_payload(export: &str, queries: &[&str]) -> Vec<u8> {
    let mut b = (export.len() as u32).to_be_bytes().to_vec();
    b.extend_from_slice(export.as_bytes());
    b.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        b.extend_from_slice(&(q.len() as u32).to_be_bytes());
        b.extend_from_slice(q.as_bytes());
    }
    b
}

/// The option replies in `out`, as (reply type, payload).
fn option_replies(mut out: &[u8]) -> Vec<(u32, Vec<u8>)> {
    let mut replies = Vec::new();
    while out.len() >= 20 {
        let kind = u32::from_be_bytes(out[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(out[16..20].try_into().unwrap()) as usize;
        replies.push((kind, out[20..20 + len].to_vec()));
        out = &out[20 + len..];
    }
    replies
}

/// `base:allocation` is listed (for its name, for `base:` and for an empty list), chosen
/// by SET once structured replies are on, refused by SET without them, and malformed or
/// foreign requests get an error reply.
#[test]
fn meta_context_negotiation_serves_base_allocation_only() {
    let export = ExportInfo {
        name: "afa".into(),
        description: String::new(),
        size_bytes: 1 << 20,
        preferred_block_bytes: 512,
        max_request_bytes: 1 << 20,
        read_only: false,
    };
    let mut n = Negotiation::new(export);
    n.client_flags(FLAG_C_FIXED_NEWSTYLE.to_be_bytes()).unwrap();
    let ask = |n: &mut Negotiation, option: u32, data: &[u8]| {
        let mut out = Vec::new();
        let header = OptionHeader {
            option,
            length: data.len() as u32,
        };
        assert_eq!(
            n.option(header, data, &mut out),
            Ok(OptionOutcome::Continue)
        );
        option_replies(&out)
    };
    let mut context = BASE_ALLOCATION_ID.to_be_bytes().to_vec();
    context.extend_from_slice(BASE_ALLOCATION.as_bytes());
    let found = vec![(REP_META_CONTEXT, context.clone()), (REP_ACK, vec![])];
    for queries in [
        &[][..],
        &["base:"],
        &["base:allocation", "qemu:dirty-bitmap:x"],
    ] {
        let payload = meta_context_payload("afa", queries);
        assert_eq!(
            ask(&mut n, OPT_LIST_META_CONTEXT, &payload),
            found,
            "{queries:?}"
        );
    }
    let none = ask(
        &mut n,
        OPT_LIST_META_CONTEXT,
        &meta_context_payload("", &["qemu:x"]),
    );
    assert_eq!(none, vec![(REP_ACK, vec![])]);
    let set = meta_context_payload("afa", &["base:allocation"]);
    let refused = ask(&mut n, OPT_SET_META_CONTEXT, &set);
    assert_eq!(refused[0].0, REP_ERR_INVALID);
    assert!(String::from_utf8_lossy(&refused[0].1).contains("structured replies"));
    assert_eq!(
        ask(&mut n, OPT_STRUCTURED_REPLY, &[]),
        vec![(REP_ACK, vec![])]
    );
    let unknown = ask(
        &mut n,
        OPT_SET_META_CONTEXT,
        &meta_context_payload("other", &[]),
    );
    assert_eq!(unknown[0].0, REP_ERR_UNKNOWN);
    let mut torn = set.clone();
    torn.pop();
    assert_eq!(
        ask(&mut n, OPT_SET_META_CONTEXT, &torn)[0].0,
        REP_ERR_INVALID
    );
    assert_eq!(ask(&mut n, OPT_SET_META_CONTEXT, &set), found);
    let mut out = Vec::new();
    let go = OptionHeader {
        option: OPT_GO,
        length: 6,
    };
    match n.option(go, &[0; 6], &mut out) {
        Ok(OptionOutcome::Transmission(negotiated)) => assert!(negotiated.base_allocation),
        other => panic!("{other:?}"),
    }
}

/// Over a whole session: BLOCK_STATUS before the context is chosen is refused with
/// EINVAL; after it, the reply is one BLOCK_STATUS chunk of the context's id (a RAM disk
/// cannot tell holes, so the range is one data extent), and REQ_ONE is accepted.
#[test]
fn a_session_answers_block_status_in_its_context() {
    let mut without = handshake_bytes(true);
    without.extend(request(0, CMD_BLOCK_STATUS, 5, 0, 4096));
    without.extend(request(0, CMD_DISC, 6, 0, 0));
    let out = replay(&without);
    let mut error_chunk = STRUCTURED_REPLY_MAGIC.to_be_bytes().to_vec();
    error_chunk.extend_from_slice(&REPLY_FLAG_DONE.to_be_bytes());
    error_chunk.extend_from_slice(&REPLY_TYPE_ERROR.to_be_bytes());
    error_chunk.extend_from_slice(&5u64.to_be_bytes());
    let at = out
        .windows(error_chunk.len())
        .position(|w| w == error_chunk)
        .expect("an error chunk for the block status");
    assert_eq!(&out[at + 20..at + 24], &EINVAL.to_be_bytes());
    let message = String::from_utf8_lossy(&out[at + 26..]);
    assert!(message.contains("base:allocation"), "{message}");

    let mut input = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES)
        .to_be_bytes()
        .to_vec();
    for (opt, data) in [
        (OPT_STRUCTURED_REPLY, vec![]),
        (
            OPT_SET_META_CONTEXT,
            meta_context_payload("", &[BASE_ALLOCATION]),
        ),
        (OPT_GO, vec![0; 6]),
    ] {
        input.extend_from_slice(&IHAVEOPT.to_be_bytes());
        input.extend_from_slice(&opt.to_be_bytes());
        input.extend_from_slice(&(data.len() as u32).to_be_bytes());
        input.extend_from_slice(&data);
    }
    input.extend(request(CMD_FLAG_REQ_ONE, CMD_BLOCK_STATUS, 7, 512, 8192));
    input.extend(request(0, CMD_DISC, 8, 0, 0));
    let out = replay(&input);
    let chunk = &out[out.len() - 32..];
    assert_eq!(&chunk[..4], &STRUCTURED_REPLY_MAGIC.to_be_bytes());
    assert_eq!(&chunk[4..6], &REPLY_FLAG_DONE.to_be_bytes());
    assert_eq!(&chunk[6..8], &REPLY_TYPE_BLOCK_STATUS.to_be_bytes());
    assert_eq!(&chunk[8..16], &7u64.to_be_bytes());
    assert_eq!(&chunk[16..20], &12u32.to_be_bytes());
    assert_eq!(&chunk[20..24], &BASE_ALLOCATION_ID.to_be_bytes());
    assert_eq!(&chunk[24..28], &8192u32.to_be_bytes());
    assert_eq!(&chunk[28..32], &0u32.to_be_bytes());
}

#[test]
fn option_headers_and_request_headers_check_their_magic() {
    let mut h = [0u8; OPTION_HEADER_BYTES];
    assert!(matches!(
        parse_option_header(&h),
        Err(ProtocolError::BadOptionMagic(0))
    ));
    h[..8].copy_from_slice(&IHAVEOPT.to_be_bytes());
    h[12..].copy_from_slice(&(MAX_OPTION_BYTES + 1).to_be_bytes());
    assert!(matches!(
        parse_option_header(&h),
        Err(ProtocolError::OptionTooLong { .. })
    ));
    let r: [u8; REQUEST_HEADER_BYTES] = request(3, CMD_READ, 1, 2, 3).try_into().unwrap();
    let parsed = parse_request_header(&r).unwrap();
    assert_eq!(
        (
            parsed.flags,
            parsed.kind,
            parsed.handle,
            parsed.offset,
            parsed.length
        ),
        (3, CMD_READ, 1, 2, 3)
    );
}

/// The fuzz target's committed seeds (serve/fuzz/seeds/session, which `.ci/run` hands to
/// cargo fuzz) are whole sessions: each gets past the handshake and is answered request by
/// request, so the fuzzer starts from inputs that reach the request parser and the
/// executor instead of spending its time on the handshake's magic numbers.
#[test]
fn the_fuzz_seeds_are_sessions_that_reach_their_requests() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/session");
    let mut seeds = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let input = std::fs::read(&path).unwrap();
        let out = replay(&input);
        let replies = [SIMPLE_REPLY_MAGIC, STRUCTURED_REPLY_MAGIC]
            .iter()
            .map(|magic| out.windows(4).filter(|w| *w == magic.to_be_bytes()).count())
            .sum::<usize>();
        assert!(replies >= 2, "{}: {replies} replies", path.display());
        seeds += 1;
    }
    assert!(seeds >= 6, "{seeds} seeds in {}", dir.display());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(afa_sim::proptest_cases(2000)))]

    /// Any bytes at all, from the first byte of the handshake.
    #[test]
    fn arbitrary_input_never_panics(input in proptest::collection::vec(any::<u8>(), 0..512)) {
        let out = replay(&input);
        prop_assert_eq!(&out[..18], &greeting()[..]);
    }

    /// A valid handshake, then arbitrary request headers (with valid magic half the time)
    /// and payload bytes.
    #[test]
    fn arbitrary_requests_never_panic(
        structured in any::<bool>(),
        requests in proptest::collection::vec(
            (any::<bool>(), any::<u16>(), 0u16..10, any::<u64>(), prop_oneof![any::<u64>(), 0u64..(1 << 20)], prop_oneof![any::<u32>(), 0u32..70_000], proptest::collection::vec(any::<u8>(), 0..64)),
            0..8,
        ),
    ) {
        let mut input = handshake_bytes(structured);
        for (good_magic, flags, kind, handle, offset, length, tail) in requests {
            let mut r = request(flags, kind, handle, offset, length);
            if !good_magic {
                r[0] ^= 0x5a;
            }
            input.extend(r);
            input.extend(tail);
        }
        let _ = replay(&input);
    }
}

/// A stream that hands out its bytes in reads of the given sizes (cycling), as a socket
/// hands out whatever has arrived.
struct Chunked<'a> {
    bytes: &'a [u8],
    sizes: Vec<usize>,
    next: usize,
}

impl std::io::Read for Chunked<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let size = self.sizes[self.next % self.sizes.len()].max(1);
        self.next += 1;
        let n = size.min(buf.len()).min(self.bytes.len());
        buf[..n].copy_from_slice(&self.bytes[..n]);
        self.bytes = &self.bytes[n..];
        Ok(n)
    }
}

/// What either parser made of one request: its handle, the request or the rejection's
/// errno, and a write's payload.
type Seen = (u64, Result<Request, u32>, Vec<u8>);

/// The requests of `stream` as the paced connection reads them, one at a time.
fn parse_one_by_one(stream: &[u8], sizes: &[usize], limits: &Limits) -> (Vec<Seen>, String) {
    let chunked = Chunked {
        bytes: stream,
        sizes: sizes.to_vec(),
        next: 0,
    };
    let mut reader = std::io::BufReader::with_capacity(4096, chunked);
    let mut seen = Vec::new();
    let end = crate::session::read_requests(&mut reader, limits, Vec::new, |incoming, _| {
        seen.push(match incoming {
            crate::session::Incoming::Job {
                handle,
                request,
                data,
            } => (handle, Ok(request), data),
            crate::session::Incoming::Rejected {
                handle, rejection, ..
            } => (handle, Err(rejection.errno), Vec::new()),
        });
        true
    });
    (seen, format!("{end:?}"))
}

/// The requests of `stream` as the unpaced connection reads them, in place, in bursts of
/// at most `max`.
fn parse_in_bursts(
    stream: &[u8],
    sizes: &[usize],
    limits: &Limits,
    max: usize,
) -> (Vec<Seen>, String) {
    let chunked = Chunked {
        bytes: stream,
        sizes: sizes.to_vec(),
        next: 0,
    };
    let mut reader = crate::session::BurstReader::new(chunked, &[]);
    let mut buf = crate::session::BurstBuffer::default();
    let mut seen = Vec::new();
    let mut parsed = Vec::new();
    loop {
        parsed.clear();
        let read = reader.read_burst(&mut buf, limits, max, &mut parsed);
        assert!(
            parsed.len() <= max,
            "a burst of {} exceeds {max}",
            parsed.len()
        );
        for p in parsed.drain(..) {
            seen.push(match p {
                crate::session::Parsed::Job {
                    handle,
                    request,
                    payload,
                } => (handle, Ok(request), buf.bytes()[payload].to_vec()),
                crate::session::Parsed::Rejected {
                    handle, rejection, ..
                } => (handle, Err(rejection.errno), Vec::new()),
            });
        }
        match read {
            Ok(None) => {}
            Ok(Some(end)) => return (seen, format!("Ok({end:?})")),
            Err(e) => return (seen, format!("Err({e:?})")),
        }
    }
}

/// A burst buffer grows to hold a large write and gives the excess back at the next burst.
#[test]
fn a_burst_buffer_gives_back_what_one_large_write_took() {
    use crate::session::{BurstBuffer, BurstReader, Parsed, BURST_KEEP_BYTES};
    let limits = Limits {
        size_bytes: 64 << 20,
        max_request_bytes: 32 << 20,
        structured_replies: false,
        base_allocation: false,
        read_only: false,
    };
    let big = 20u32 << 20;
    let mut stream = request(0, CMD_WRITE, 1, 0, big);
    stream.extend(std::iter::repeat_n(0x5a, big as usize));
    stream.extend(request(0, CMD_FLUSH, 2, 0, 0));
    let mut reader = BurstReader::new(&stream[..], &[]);
    let mut buf = BurstBuffer::default();
    let mut parsed = Vec::new();
    assert_eq!(
        reader
            .read_burst(&mut buf, &limits, 8, &mut parsed)
            .unwrap(),
        None
    );
    let Parsed::Job { payload, .. } = &parsed[0] else {
        panic!("the write was rejected: {parsed:?}");
    };
    assert_eq!(payload.len(), big as usize);
    assert!(buf.bytes()[payload.clone()].iter().all(|&b| b == 0x5a));
    assert!(buf.held_bytes() > big as usize);
    parsed.clear();
    let end = reader
        .read_burst(&mut buf, &limits, 8, &mut parsed)
        .unwrap();
    assert!(
        matches!(parsed[..], [Parsed::Job { handle: 2, .. }]),
        "{parsed:?}"
    );
    assert_eq!(end, None);
    assert!(buf.held_bytes() <= BURST_KEEP_BYTES, "{}", buf.held_bytes());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(afa_sim::proptest_cases(300)))]

    /// Parsing in place in bursts finds the same requests, payloads and rejections as
    /// reading them one at a time, however the stream is cut into reads and wherever it
    /// ends (a cut inside a request is a truncated stream for both).
    #[test]
    fn burst_parsing_in_place_matches_reading_one_request_at_a_time(
        requests in proptest::collection::vec(
            (0u16..6, any::<u64>(), 0u64..(1 << 20), prop_oneof![0u32..9000, 60_000u32..70_000]),
            0..24,
        ),
        sizes in proptest::collection::vec(prop_oneof![1usize..64, 1usize..20_000, 100_000usize..300_000], 1..8),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
        max in 1usize..8,
    ) {
        let limits = Limits {
            size_bytes: 1 << 20,
            max_request_bytes: 64 * 1024,
            structured_replies: false,
            base_allocation: false,
            read_only: false,
        };
        let mut stream = Vec::new();
        for &(kind, handle, offset, length) in &requests {
            // Kinds 0..5 are READ, WRITE, DISC (sent only last, below), FLUSH and TRIM;
            // 5 is a write past the end of the export, rejected with its payload dropped.
            let (kind, offset, length) = match kind {
                5 => (CMD_WRITE, (1 << 20) - 512, length.max(1024)),
                2 => (CMD_FLUSH, 0, 0),
                3 => (CMD_FLUSH, 0, 0),
                k => (k, offset, length),
            };
            stream.extend(request(0, kind, handle, offset, length));
            if kind == CMD_WRITE {
                stream.extend((0..length).map(|i| (i as u64 ^ handle) as u8));
            }
        }
        if truncate && !stream.is_empty() {
            stream.truncate(cut.index(stream.len()));
        } else {
            stream.extend(request(0, CMD_DISC, 0, 0, 0));
        }
        let (one, one_end) = parse_one_by_one(&stream, &sizes, &limits);
        let (burst, burst_end) = parse_in_bursts(&stream, &sizes, &limits, max);
        prop_assert_eq!(one.len(), burst.len());
        for (a, b) in one.iter().zip(&burst) {
            prop_assert_eq!(a, b);
        }
        prop_assert_eq!(one_end, burst_end);
    }
}

/// What a region of bytes should hold after each operation, for the executor's property.
#[derive(Debug, Clone)]
enum Op {
    Write {
        offset: u64,
        len: u32,
        seed: u8,
    },
    Trim {
        offset: u64,
        len: u32,
    },
    Zero {
        offset: u64,
        len: u32,
        no_hole: bool,
    },
    Read {
        offset: u64,
        len: u32,
    },
}

fn op_strategy(size: u64) -> impl Strategy<Value = Op> {
    let range =
        (0..size - 1).prop_flat_map(move |o| (Just(o), 1..=((size - o).min(20_000) as u32)));
    prop_oneof![
        (range.clone(), any::<u8>()).prop_map(|((offset, len), seed)| Op::Write {
            offset,
            len,
            seed
        }),
        range
            .clone()
            .prop_map(|(offset, len)| Op::Trim { offset, len }),
        (range.clone(), any::<bool>()).prop_map(|((offset, len), no_hole)| Op::Zero {
            offset,
            len,
            no_hole
        }),
        range.prop_map(|(offset, len)| Op::Read { offset, len }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(afa_sim::proptest_cases(200)))]

    /// Byte-addressed requests on a sector device behave like a flat byte array: partial
    /// sectors are read, modified and written back, trims zero only whole sectors.
    #[test]
    fn the_executor_behaves_like_a_byte_array(ops in proptest::collection::vec(op_strategy(64 * 1024), 1..40)) {
        let size = 64 * 1024u64;
        let mut exec = Executor::new(Box::new(MemDevice::new(512, size / 512).unwrap())).unwrap();
        let mut model = vec![0u8; size as usize];
        for (t, op) in ops.into_iter().enumerate() {
            let now = t as u64 * 1000;
            match op {
                Op::Write { offset, len, seed } => {
                    let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(seed | 1).wrapping_add(seed)).collect();
                    exec.execute(now, &Request::Write { offset, length: len, fua: false }, &data).unwrap();
                    model[offset as usize..(offset + len as u64) as usize].copy_from_slice(&data);
                }
                Op::Trim { offset, len } => {
                    exec.execute(now, &Request::Trim { offset, length: len, fua: true }, &[]).unwrap();
                    let first = offset.div_ceil(512) * 512;
                    let last = (offset + len as u64) / 512 * 512;
                    if first < last {
                        model[first as usize..last as usize].fill(0);
                    }
                }
                Op::Zero { offset, len, no_hole } => {
                    exec.execute(now, &Request::WriteZeroes { offset, length: len, fua: false, no_hole }, &[]).unwrap();
                    model[offset as usize..(offset + len as u64) as usize].fill(0);
                }
                Op::Read { offset, len } => {
                    let (_, got) = exec.execute(now, &Request::Read { offset, length: len }, &[]).unwrap();
                    prop_assert_eq!(&got[..], &model[offset as usize..(offset + len as u64) as usize]);
                }
            }
        }
        let (_, all) = exec.execute(0, &Request::Read { offset: 0, length: size as u32 }, &[]).unwrap();
        prop_assert_eq!(all, model);
    }
}

/// Parses the descriptors of a block status reply into (length, flags).
fn descriptors(bytes: &[u8]) -> Vec<(u64, u32)> {
    bytes
        .chunks_exact(8)
        .map(|d| {
            let len = u32::from_be_bytes(d[..4].try_into().unwrap()) as u64;
            (len, u32::from_be_bytes(d[4..].try_into().unwrap()))
        })
        .collect()
}

/// Checks a block status reply against the bytes the volume holds: the extents start at
/// the request's offset and have positive lengths that cover it exactly (one extent, no
/// longer than the request, with `req_one`), and every extent reported as a hole reads as
/// zeroes. Returns the extents.
fn check_block_status(
    exec: &mut Executor<dyn BlockDevice + Send>,
    model: &[u8],
    offset: u64,
    len: u32,
    req_one: bool,
) -> Vec<(u64, u32)> {
    let request = Request::BlockStatus {
        offset,
        length: len,
        req_one,
    };
    let (_, bytes) = exec.execute(0, &request, &[]).unwrap();
    let extents = descriptors(&bytes);
    assert!(!extents.is_empty() && extents.iter().all(|&(l, _)| l > 0));
    let covered: u64 = extents.iter().map(|&(l, _)| l).sum();
    if req_one {
        assert!(extents.len() == 1 && covered <= len as u64, "{extents:?}");
    } else {
        assert_eq!(covered, len as u64, "{extents:?}");
    }
    let mut at = offset;
    for &(l, flags) in &extents {
        if flags & STATE_HOLE != 0 {
            assert_eq!(flags, STATE_HOLE | STATE_ZERO);
            let hole = &model[at as usize..(at + l) as usize];
            assert!(
                hole.iter().all(|&b| b == 0),
                "a hole at {at}+{l} holds data"
            );
        } else {
            assert_eq!(flags, 0);
        }
        at += l;
    }
    extents
}

/// The serve mode SSD (full payload, in memory), small enough to exercise quickly.
fn small_full_ssd() -> afa_ssd::Ssd {
    let config = afa_ssd::SsdConfig {
        geometry: afa_nand::Geometry {
            channels: 2,
            chips_per_channel: 1,
            dies_per_chip: 1,
            planes_per_die: 1,
            blocks_per_plane: 32,
            pages_per_block: 32,
            page_bytes: 4096,
            sector_bytes: 512,
            oob_bytes_per_page: 64,
        },
        payload: afa_nand::PayloadMode::Full,
        over_provisioning: 0.25,
        ..afa_ssd::SsdConfig::default()
    };
    afa_ssd::Ssd::new(config, 1).unwrap()
}

/// A device that records each command's opcode and FUA flag before passing it on.
struct Recording {
    inner: MemDevice,
    seen: Arc<std::sync::Mutex<Vec<(afa_ssd::Opcode, bool)>>>,
}

impl BlockDevice for Recording {
    fn info(&self) -> DeviceInfo {
        self.inner.info()
    }
    fn submit(
        &mut self,
        now_ns: TimeNs,
        cmd: &Command<'_>,
        out: ReadBuffers<'_>,
    ) -> Result<Completion, DeviceError> {
        self.seen.lock().unwrap().push((cmd.opcode, cmd.flags.fua));
        self.inner.submit(now_ns, cmd, out)
    }
    fn trim_is_durable(&self) -> bool {
        self.inner.trim_is_durable()
    }
    fn background(&mut self, now_ns: TimeNs) -> Option<TimeNs> {
        self.inner.background(now_ns)
    }
}

/// FUA goes down with the writes a request makes (the seam promises such a write is
/// durable when it completes), so it costs no flush of the whole volume; only a trim,
/// whose command has no FUA flag, is followed by a flush.
#[test]
fn fua_requests_send_their_writes_with_fua_and_flush_only_after_a_trim() {
    use afa_ssd::Opcode::{Flush, Read, Trim, Write};
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let device = Recording {
        inner: MemDevice::new(512, 256).unwrap(),
        seen: Arc::clone(&seen),
    };
    let mut exec = Executor::new(Box::new(device)).unwrap();
    let mut run = |request: Request, data: &[u8]| {
        seen.lock().unwrap().clear();
        exec.execute(0, &request, data).unwrap();
        std::mem::take(&mut *seen.lock().unwrap())
    };
    let write = |offset, length, fua| Request::Write {
        offset,
        length,
        fua,
    };
    assert_eq!(run(write(1024, 1024, true), &[7; 1024]), [(Write, true)]);
    assert_eq!(run(write(1024, 1024, false), &[7; 1024]), [(Write, false)]);
    // An unaligned write reads its edge sectors and writes the whole sectors with FUA.
    assert_eq!(
        run(write(1000, 100, true), &[9; 100]),
        [(Read, false), (Read, false), (Write, true)]
    );
    let zeroes = |no_hole| Request::WriteZeroes {
        offset: 1000,
        length: 2000,
        fua: true,
        no_hole,
    };
    assert_eq!(
        run(zeroes(true), &[]),
        [(Read, false), (Read, false), (Write, true)]
    );
    // Trimmed whole sectors, then the two partial edges, each read and written with FUA.
    assert_eq!(
        run(zeroes(false), &[]),
        [
            (Trim, false),
            (Read, false),
            (Write, true),
            (Read, false),
            (Write, true),
            (Flush, false)
        ]
    );
    let trim = Request::Trim {
        offset: 0,
        length: 4096,
        fua: true,
    };
    assert_eq!(run(trim, &[]), [(Trim, false), (Flush, false)]);
}

/// Block status on the emulated SSD: all holes when new; written pages are data, and a
/// trim of whole pages makes them holes again.
#[test]
fn block_status_on_the_emulated_ssd_follows_writes_and_trims() {
    let device: Box<dyn BlockDevice + Send> = Box::new(small_full_ssd());
    let mut exec = Executor::new(device).unwrap();
    let size = exec.size_bytes();
    let mut model = vec![0u8; size as usize];
    let hole = STATE_HOLE | STATE_ZERO;
    let all = check_block_status(&mut exec, &model, 0, size as u32, false);
    assert_eq!(all, vec![(size, hole)]);
    let data = vec![0xa5u8; 3000];
    exec.execute(
        0,
        &Request::Write {
            offset: 10_000,
            length: 3000,
            fua: false,
        },
        &data,
    )
    .unwrap();
    model[10_000..13_000].fill(0xa5);
    // Bytes 10,000..13,000 touch pages 2 and 3 (8,192..16,383): page-granular data.
    let got = check_block_status(&mut exec, &model, 0, size as u32, false);
    assert_eq!(got, vec![(8192, hole), (8192, 0), (size - 16_384, hole)]);
    let one = check_block_status(&mut exec, &model, 9000, 100_000, true);
    assert_eq!(one, vec![(16_384 - 9000, 0)]);
    exec.execute(
        0,
        &Request::Trim {
            offset: 8192,
            length: 8192,
            fua: false,
        },
        &[],
    )
    .unwrap();
    model[8192..16_384].fill(0);
    let after = check_block_status(&mut exec, &model, 0, size as u32, false);
    assert_eq!(after, vec![(size, hole)]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(afa_sim::proptest_cases(48)))]

    /// Random writes, trims and zeroes on the emulated SSD and on a file-backed device:
    /// every block status reply covers its range and calls nothing a hole that holds data.
    #[test]
    fn block_status_never_calls_data_a_hole(
        ops in proptest::collection::vec(op_strategy(256 * 1024), 1..30),
        on_file in any::<bool>(),
        case in any::<u64>(),
    ) {
        let size = 256 * 1024u64;
        let path = std::env::temp_dir().join(format!("afa-block-status-{}-{case}.img", std::process::id()));
        let device: Box<dyn BlockDevice + Send> = if on_file {
            let _ = std::fs::remove_file(&path);
            Box::new(crate::FileDevice::open(&path, 512, size / 512, None).unwrap())
        } else {
            Box::new(small_full_ssd())
        };
        let mut exec = Executor::new(device).unwrap();
        let size = size.min(exec.size_bytes());
        let mut model = vec![0u8; exec.size_bytes() as usize];
        for op in ops {
            match op {
                Op::Write { offset, len, seed } if offset + (len as u64) <= size => {
                    let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(seed | 1).wrapping_add(seed) | 1).collect();
                    exec.execute(0, &Request::Write { offset, length: len, fua: false }, &data).unwrap();
                    model[offset as usize..(offset + len as u64) as usize].copy_from_slice(&data);
                }
                Op::Trim { offset, len } if offset + (len as u64) <= size => {
                    exec.execute(0, &Request::Trim { offset, length: len, fua: false }, &[]).unwrap();
                    let first = offset.div_ceil(512) * 512;
                    let last = (offset + len as u64) / 512 * 512;
                    if first < last {
                        model[first as usize..last as usize].fill(0);
                    }
                }
                Op::Zero { offset, len, no_hole } if offset + (len as u64) <= size => {
                    exec.execute(0, &Request::WriteZeroes { offset, length: len, fua: false, no_hole }, &[]).unwrap();
                    model[offset as usize..(offset + len as u64) as usize].fill(0);
                }
                Op::Read { offset, len } if offset + (len as u64) <= size => {
                    check_block_status(&mut exec, &model, offset, len, false);
                    check_block_status(&mut exec, &model, offset, len, true);
                }
                _ => {}
            }
        }
        let whole = exec.size_bytes() as u32;
        check_block_status(&mut exec, &model, 0, whole, false);
        let _ = std::fs::remove_file(&path);
    }
}

/// A device that completes every command `latency_ns` later and counts, at each submit,
/// how many earlier commands are still outstanding at the submit time.
struct Counting {
    info: DeviceInfo,
    latency_ns: u64,
    done: Vec<TimeNs>,
    max_outstanding: Arc<AtomicU64>,
    background_calls: Arc<AtomicU64>,
}

impl BlockDevice for Counting {
    fn info(&self) -> DeviceInfo {
        self.info
    }
    fn submit(
        &mut self,
        now_ns: TimeNs,
        cmd: &Command<'_>,
        out: ReadBuffers<'_>,
    ) -> Result<Completion, DeviceError> {
        validate_command(&self.info, cmd, &out)?;
        self.done.retain(|&d| d > now_ns);
        self.max_outstanding
            .fetch_max(self.done.len() as u64 + 1, Ordering::SeqCst);
        let done_ns = now_ns + self.latency_ns;
        self.done.push(done_ns);
        Ok(Completion {
            done_ns,
            gc_active: false,
        })
    }
    fn background(&mut self, now_ns: TimeNs) -> Option<TimeNs> {
        self.background_calls.fetch_add(1, Ordering::SeqCst);
        // Asks to be called again soon twice, then has nothing more to do.
        (self.background_calls.load(Ordering::SeqCst) < 3).then_some(now_ns + 1_000_000)
    }
}

fn counting(queue_depth: u32, latency_ns: u64) -> (Counting, Arc<AtomicU64>, Arc<AtomicU64>) {
    let max = Arc::new(AtomicU64::new(0));
    let bg = Arc::new(AtomicU64::new(0));
    let d = Counting {
        info: DeviceInfo {
            sector_bytes: 512,
            capacity_sectors: 1024,
            payload_unit_bytes: 512,
            tag_bytes_per_sector: 0,
            max_queue_depth: queue_depth,
            max_transfer_sectors: 1024,
        },
        latency_ns,
        done: Vec::new(),
        max_outstanding: max.clone(),
        background_calls: bg.clone(),
    };
    (d, max, bg)
}

/// Sends `jobs` writes, collects their replies, then waits (up to 10 s) until the device
/// has had `background_calls` idle calls, and stops the engine.
fn flood(pace: Pace, jobs: u64, background_calls: u64) -> (u64, u64, Vec<Reply>) {
    let (device, max, bg) = counting(4, 2_000_000);
    let (engine, _) = EngineHandle::spawn(Box::new(device), pace).unwrap();
    let tx = engine.sender();
    let (reply_tx, reply_rx) = crossbeam_channel::unbounded();
    // Half the jobs one burst at a time, half in one burst.
    let job = |h: u64| Job {
        handle: h,
        request: Request::Write {
            offset: 0,
            length: 512,
            fua: false,
        },
        data: vec![h as u8; 512],
        reply_to: reply_tx.clone(),
        credits: 1,
    };
    let mut replies = Vec::new();
    if pace == Pace::None {
        // Unpaced engines are applied on the submitting thread, each write's payload in
        // place in the burst's bytes.
        let inline = |j: Job, at: usize| InlineJob {
            handle: j.handle,
            request: j.request,
            buf: Vec::new(),
            payload: at..at + j.data.len(),
        };
        for h in 0..jobs / 2 {
            let j = job(h);
            let burst = j.data.clone();
            replies.extend(tx.apply(vec![inline(j, 0)], &burst));
        }
        let mut burst = Vec::new();
        let mut batch = Vec::new();
        for h in jobs / 2..jobs {
            let j = job(h);
            let at = burst.len();
            burst.extend_from_slice(&j.data);
            batch.push(inline(j, at));
        }
        replies.extend(tx.apply(batch, &burst));
    } else {
        for h in 0..jobs / 2 {
            tx.submit(vec![job(h)]).unwrap();
        }
        tx.submit((jobs / 2..jobs).map(job).collect()).unwrap();
        while replies.len() < jobs as usize {
            replies.extend(reply_rx.recv_timeout(Duration::from_secs(10)).unwrap());
        }
    }
    // Polled rather than slept: a loaded machine (CI runs several test binaries at once)
    // can starve the engine thread for a long while.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while bg.load(Ordering::SeqCst) < background_calls && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let stats = engine.stop();
    assert_eq!(stats.requests, jobs);
    (
        max.load(Ordering::SeqCst),
        bg.load(Ordering::SeqCst),
        replies,
    )
}

#[test]
fn unpaced_engine_never_exceeds_the_queue_depth_in_virtual_time() {
    let (max, _, replies) = flood(Pace::None, 64, 0);
    assert!(max <= 4, "{max} outstanding with queue depth 4");
    assert!(replies.iter().all(|r| r.result.is_ok()));
}

#[test]
fn unpaced_engine_gives_the_device_idle_time_once_requests_stop() {
    let (_, background_calls, replies) = flood(Pace::None, 2, 3);
    assert!(background_calls >= 3, "{background_calls} idle calls");
    assert!(replies.iter().all(|r| r.result.is_ok()));
}

#[test]
fn unpaced_engine_refuses_requests_once_stopped() {
    let (device, _, _) = counting(4, 2_000_000);
    let (engine, _) = EngineHandle::spawn(Box::new(device), Pace::None).unwrap();
    let tx = engine.sender();
    engine.stop();
    let write = Request::Write {
        offset: 0,
        length: 512,
        fua: false,
    };
    let job = InlineJob {
        handle: 7,
        request: write,
        buf: Vec::new(),
        payload: 0..512,
    };
    let replies = tx.apply(vec![job], &[0; 512]);
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].handle, 7);
    assert_eq!(
        replies[0].result.as_ref().unwrap_err().errno,
        crate::proto::ESHUTDOWN
    );
}

#[test]
fn paced_engine_holds_requests_beyond_the_queue_depth_and_answers_in_order() {
    let (max, _, replies) = flood(Pace::Model, 16, 0);
    assert!(max <= 4, "{max} outstanding with queue depth 4");
    let handles: Vec<u64> = replies.iter().map(|r| r.handle).collect();
    assert_eq!(
        handles,
        (0..16).collect::<Vec<_>>(),
        "equal latencies complete in order"
    );
}

#[test]
fn the_engine_gives_the_device_idle_time() {
    let (_, background_calls, _) = flood(Pace::Model, 2, 3);
    assert!(
        background_calls >= 3,
        "background called {background_calls} times"
    );
}

#[test]
fn stopping_answers_held_requests_within_the_queue_depth() {
    // Completions 10 s out: nothing is due before the stop, so the stop itself must answer
    // every request, jumping virtual time rather than exceeding the queue depth.
    let (device, max, _) = counting(4, 10_000_000_000);
    let (engine, _) = EngineHandle::spawn(Box::new(device), Pace::Model).unwrap();
    let (reply_tx, reply_rx) = crossbeam_channel::unbounded();
    let jobs: Vec<Job> = (0..16)
        .map(|h| Job {
            handle: h,
            request: Request::Write {
                offset: 512 * h,
                length: 512,
                fua: false,
            },
            data: vec![1; 512],
            reply_to: reply_tx.clone(),
            credits: 1,
        })
        .collect();
    engine.sender().submit(jobs).unwrap();
    let stats = engine.stop();
    assert_eq!(stats.requests, 16);
    let replies: usize = reply_rx.try_iter().map(|v| v.len()).sum();
    assert_eq!(replies, 16);
    let max = max.load(Ordering::SeqCst);
    assert!(max <= 4, "{max} outstanding with queue depth 4");
}

/// A RAM volume for the shared engine that counts its calls, and those after `shutdown`.
struct CountingVolume {
    bytes: std::sync::Mutex<Vec<u8>>,
    epoch: std::time::Instant,
    calls: AtomicU64,
    shutdowns: AtomicU64,
}

impl crate::SharedVolume for CountingVolume {
    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            sector_bytes: 512,
            capacity_sectors: 64,
            payload_unit_bytes: 512,
            tag_bytes_per_sector: 0,
            max_queue_depth: 4,
            max_transfer_sectors: 64,
        }
    }
    fn epoch(&self) -> std::time::Instant {
        self.epoch
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<TimeNs, DeviceError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let bytes = self.bytes.lock().unwrap();
        out.copy_from_slice(&bytes[offset as usize..offset as usize + out.len()]);
        Ok(0)
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<TimeNs, DeviceError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let mut bytes = self.bytes.lock().unwrap();
        bytes[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        Ok(0)
    }
    fn trim(&self, offset: u64, length: u64) -> Result<TimeNs, DeviceError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.bytes.lock().unwrap()[offset as usize..(offset + length) as usize].fill(0);
        Ok(0)
    }
    fn flush(&self) -> Result<TimeNs, DeviceError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(0)
    }
    fn shutdown(&self) -> Result<(), DeviceError> {
        self.shutdowns.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// Once stopped, a shared engine refuses what connections still send (unpaced with
/// ESHUTDOWN, paced by giving the jobs back) without calling the volume, and dropping the
/// handle after `stop` does not shut the volume down a second time.
#[test]
fn a_stopped_shared_engine_refuses_requests_without_calling_the_volume() {
    for pace in [Pace::None, Pace::Model] {
        let volume = Arc::new(CountingVolume {
            bytes: std::sync::Mutex::new(vec![0; 64 * 512]),
            epoch: std::time::Instant::now(),
            calls: AtomicU64::new(0),
            shutdowns: AtomicU64::new(0),
        });
        let (engine, info) = EngineHandle::spawn_shared(volume.clone(), pace).unwrap();
        assert_eq!(info.capacity_sectors, 64);
        let tx = engine.sender();
        let write = Request::Write {
            offset: 0,
            length: 512,
            fua: false,
        };
        let (reply_tx, reply_rx) = crossbeam_channel::unbounded();
        let job = |handle| Job {
            handle,
            request: write,
            data: vec![1; 512],
            reply_to: reply_tx.clone(),
            credits: 1,
        };
        let inline = |handle| InlineJob {
            handle,
            request: write,
            buf: Vec::new(),
            payload: 0..512,
        };
        match pace {
            Pace::None => {
                let replies = tx.apply(vec![inline(1)], &[1; 512]);
                assert_eq!(replies[0].result, Ok(()));
            }
            Pace::Model => {
                tx.submit(vec![job(1)]).unwrap();
                let replies = reply_rx.recv_timeout(Duration::from_secs(10)).unwrap();
                assert_eq!(replies[0].result, Ok(()));
            }
        }
        let stats = engine.stop();
        assert_eq!((stats.requests, stats.write_bytes), (1, 512));
        assert_eq!(volume.shutdowns.load(Ordering::SeqCst), 1);
        let calls = volume.calls.load(Ordering::SeqCst);
        let replies = tx.apply(vec![inline(2)], &[2; 512]);
        assert_eq!(
            replies[0].result.as_ref().unwrap_err().errno,
            crate::proto::ESHUTDOWN
        );
        let refused = tx.submit(vec![job(3)]).unwrap_err();
        assert_eq!(refused[0].handle, 3);
        assert_eq!(volume.calls.load(Ordering::SeqCst), calls, "{pace:?}");
        assert_eq!(volume.shutdowns.load(Ordering::SeqCst), 1, "{pace:?}");
    }
}

/// An SSD's uncorrectable read reaches the client as EIO, with the device's reason; the
/// data stays, so a later read returns it.
#[test]
fn an_uncorrectable_read_is_answered_with_eio() {
    let mut config = afa_ssd::SsdConfig {
        geometry: afa_nand::Geometry {
            channels: 2,
            chips_per_channel: 1,
            dies_per_chip: 1,
            planes_per_die: 2,
            blocks_per_plane: 32,
            pages_per_block: 16,
            page_bytes: 4096,
            sector_bytes: 4096,
            oob_bytes_per_page: 64,
        },
        over_provisioning: 0.25,
        ..afa_ssd::SsdConfig::default()
    };
    config.payload = afa_nand::PayloadMode::Full;
    config.faults.read_fail_probability = 0.5;
    let ssd = afa_ssd::Ssd::new(config, 3).unwrap();
    let mut exec = Executor::new(Box::new(ssd)).unwrap();
    let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
    let write = Request::Write {
        offset: 0,
        length: 8192,
        fua: true,
    };
    exec.execute(0, &write, &data).unwrap();
    let read = Request::Read {
        offset: 0,
        length: 8192,
    };
    let (mut failed, mut good) = (0, 0);
    for t in 1..=40u64 {
        match exec.execute(t * 1_000_000, &read, &[]) {
            Ok((_, got)) => {
                assert_eq!(got, data);
                good += 1;
            }
            Err(f) => {
                assert_eq!(f.errno, EIO);
                assert!(f.message.contains("could not be read"), "{}", f.message);
                failed += 1;
            }
        }
    }
    assert!(failed > 0 && good > 0, "{failed} failed, {good} read");
}

/// A socket as a lingering reader sees it: the `arrived` bytes can be read at once, and
/// each look at how many are pending lets the next of the `queued` requests arrive, as if
/// the client sent one while the reader waited. A read of an empty socket waits for (takes)
/// the next queued request; with none left the stream ends.
#[derive(Clone, Default)]
struct Wire {
    state: std::sync::Arc<std::sync::Mutex<WireState>>,
}

#[derive(Default)]
struct WireState {
    arrived: std::collections::VecDeque<u8>,
    queued: std::collections::VecDeque<Vec<u8>>,
    /// Requests that may still arrive while the reader lingers (the rest only when it
    /// reads again).
    arrive_while_lingering: usize,
    /// The next look at the pending bytes takes this long, as if the reader lost its core.
    stall: Option<Duration>,
}

impl Wire {
    fn new(requests: Vec<Vec<u8>>, arrive_while_lingering: usize) -> Self {
        let wire = Wire::default();
        wire.send(requests, arrive_while_lingering);
        wire
    }

    /// The client sends `requests`; `arrive_while_lingering` of them come while the reader
    /// waits, the rest when it reads.
    fn send(&self, requests: Vec<Vec<u8>>, arrive_while_lingering: usize) {
        let mut s = self.state.lock().unwrap();
        s.queued.extend(requests);
        s.arrive_while_lingering = arrive_while_lingering;
    }

    fn pending(&self) -> usize {
        let stall = self.state.lock().unwrap().stall.take();
        if let Some(stall) = stall {
            std::thread::sleep(stall);
        }
        let mut s = self.state.lock().unwrap();
        if s.arrive_while_lingering > 0 {
            if let Some(next) = s.queued.pop_front() {
                s.arrived.extend(next);
                s.arrive_while_lingering -= 1;
            }
        }
        s.arrived.len()
    }
}

impl std::io::Read for Wire {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut s = self.state.lock().unwrap();
        if s.arrived.is_empty() {
            if let Some(next) = s.queued.pop_front() {
                s.arrived.extend(next);
            }
        }
        let n = buf.len().min(s.arrived.len());
        for (dst, src) in buf.iter_mut().zip(s.arrived.drain(..n)) {
            *dst = src;
        }
        Ok(n)
    }
}

/// A reader of `wire`, lingering as `linger` says (not at all for `None`).
fn wire_reader(
    wire: &Wire,
    linger: Option<crate::session::Linger>,
) -> crate::session::BurstReader<Wire> {
    let mut reader = crate::session::BurstReader::new(wire.clone(), &[]);
    if let Some(window) = linger {
        let probe = wire.clone();
        reader = reader.with_linger(window, Box::new(move || probe.pending()));
    }
    reader
}

/// Reads the next burst and returns the handles it parsed.
fn next_burst(reader: &mut crate::session::BurstReader<Wire>) -> Vec<u64> {
    use crate::session::{BurstBuffer, Parsed};
    let limits = Limits {
        size_bytes: 1 << 30,
        max_request_bytes: 1 << 20,
        structured_replies: false,
        base_allocation: false,
        read_only: false,
    };
    let mut buf = BurstBuffer::default();
    let mut parsed = Vec::new();
    reader
        .read_burst(&mut buf, &limits, 64, &mut parsed)
        .unwrap();
    parsed
        .iter()
        .map(|p| match p {
            Parsed::Job { handle, .. } | Parsed::Rejected { handle, .. } => *handle,
        })
        .collect()
}

/// The first burst of a reader of `wire`.
fn one_burst(wire: &Wire, linger: Option<crate::session::Linger>) -> Vec<u64> {
    next_burst(&mut wire_reader(wire, linger))
}

/// 4 KiB writes, each its own request, handles 1..=n.
fn small_writes(n: u64) -> Vec<Vec<u8>> {
    small_writes_from(1, n)
}

/// `n` 4 KiB writes with handles from `first` on.
fn small_writes_from(first: u64, n: u64) -> Vec<Vec<u8>> {
    (first..first + n)
        .map(|h| {
            let mut r = request(0, CMD_WRITE, h, h * 4096, 4096);
            r.extend(std::iter::repeat_n(h as u8, 4096));
            r
        })
        .collect()
}

/// A client with many requests in flight sends them one at a time: a burst that lingers
/// takes every request that arrives while it waits, one that does not takes only what its
/// read found.
#[test]
fn a_lingering_burst_takes_the_requests_that_arrive_while_it_waits() {
    let window = crate::session::Linger {
        quiet_ns: 200_000_000,
        max_ns: 1_000_000_000,
        preempted_step_ns: 1_000_000_000,
    };
    assert_eq!(one_burst(&Wire::new(small_writes(8), 7), None), vec![1]);
    assert_eq!(
        one_burst(&Wire::new(small_writes(8), 7), Some(window)),
        (1..=8).collect::<Vec<_>>()
    );
    // Requests that arrive only after the linger ended wait for the next burst.
    assert_eq!(
        one_burst(&Wire::new(small_writes(8), 3), Some(window)),
        vec![1, 2, 3, 4]
    );
}

/// A client with one request in flight: nothing more arrives, and the burst ends after the
/// quiet time with that request.
#[test]
fn a_lingering_burst_ends_when_nothing_more_arrives() {
    let window = crate::session::Linger {
        quiet_ns: 20_000,
        max_ns: 1_000_000_000,
        preempted_step_ns: 1_000_000_000,
    };
    let started = std::time::Instant::now();
    assert_eq!(
        one_burst(&Wire::new(small_writes(1), 0), Some(window)),
        vec![1]
    );
    // Generous: only a wait that does not end at all (up to max_ns) would take this long.
    assert!(started.elapsed() < std::time::Duration::from_millis(500));
}

/// A client that never stops sending: the linger ends at its maximum, or when the burst
/// buffer is full, and the burst still holds whole requests only.
#[test]
fn a_lingering_burst_ends_at_its_maximum_while_requests_keep_coming() {
    let window = crate::session::Linger {
        quiet_ns: 1_000_000_000,
        max_ns: 5_000_000,
        preempted_step_ns: 1_000_000_000,
    };
    let handles = one_burst(&Wire::new(small_writes(1000), 1000), Some(window));
    assert!(handles.len() > 1, "{handles:?}");
    assert_eq!(handles, (1..=handles.len() as u64).collect::<Vec<_>>());
}

/// A client that keeps four requests in flight: a burst that lingered until nothing more
/// came holds only four, so the reader takes the next read without lingering, then two,
/// and so on, until a burst brings eight or more again.
#[test]
fn a_client_with_few_requests_in_flight_is_served_without_lingering() {
    let window = crate::session::Linger {
        quiet_ns: 100_000_000,
        max_ns: 10_000_000_000,
        preempted_step_ns: 10_000_000_000,
    };
    let wire = Wire::new(small_writes(4), 3);
    let mut reader = wire_reader(&wire, Some(window));
    assert_eq!(next_burst(&mut reader), vec![1, 2, 3, 4]);
    // One read without lingering: it takes only the request it found.
    wire.send(small_writes_from(5, 4), 3);
    assert_eq!(next_burst(&mut reader), vec![5]);
    assert_eq!(next_burst(&mut reader), vec![6, 7, 8]);
    // Short again: two reads without lingering, then a burst of ten.
    wire.send(small_writes_from(9, 12), 11);
    assert_eq!(next_burst(&mut reader), vec![9]);
    assert_eq!(next_burst(&mut reader), vec![10]);
    assert_eq!(next_burst(&mut reader), (11..=20).collect::<Vec<_>>());
    // A burst of ten resets the rule: the next burst lingers at once.
    wire.send(small_writes_from(21, 4), 3);
    assert_eq!(next_burst(&mut reader), vec![21, 22, 23, 24]);
}

/// A reader that loses its core while it lingers (a step of the wait takes far longer than
/// one look at the socket) stops waiting, and takes the next read without lingering: on an
/// oversubscribed machine a waiting thread holds a core the client may need to send.
#[test]
fn a_reader_descheduled_while_it_lingers_stops_lingering_for_a_while() {
    let window = crate::session::Linger {
        quiet_ns: 50_000_000,
        max_ns: 10_000_000_000,
        preempted_step_ns: 100_000_000,
    };
    let wire = Wire::new(small_writes(8), 7);
    wire.state.lock().unwrap().stall = Some(Duration::from_millis(300));
    let mut reader = wire_reader(&wire, Some(window));
    assert_eq!(next_burst(&mut reader), vec![1, 2]);
    assert_eq!(next_burst(&mut reader), vec![3]);
    assert_eq!(next_burst(&mut reader), vec![4, 5, 6, 7, 8]);
}

/// Counters of a [`SideBySide`] device, shared with the test that drives it.
#[derive(Default)]
struct SideBySideCounts {
    /// The most commands under way on the queued interface at once.
    max_in_flight: AtomicU64,
    /// Commands `submit` took while queued ones were under way.
    submits_beside_queued: AtomicU64,
    submits: AtomicU64,
}

/// A device with a queued interface whose commands each take `latency_ns`, side by side;
/// its `submit`, like OX's, runs one command at a time on its own clock. Bytes live in a
/// `MemDevice`; a queued read takes its bytes when it starts.
struct SideBySide {
    mem: MemDevice,
    latency_ns: u64,
    clock_ns: TimeNs,
    /// Queued commands by (completion time, tag), with a read's bytes.
    under_way: std::collections::BTreeMap<(TimeNs, u64), Vec<u8>>,
    counts: Arc<SideBySideCounts>,
}

impl BlockDevice for SideBySide {
    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            max_queue_depth: 64,
            max_transfer_sectors: 8,
            ..self.mem.info()
        }
    }
    fn submit(
        &mut self,
        now_ns: TimeNs,
        cmd: &Command<'_>,
        out: ReadBuffers<'_>,
    ) -> Result<Completion, DeviceError> {
        self.counts.submits.fetch_add(1, Ordering::SeqCst);
        if !self.under_way.is_empty() {
            self.counts
                .submits_beside_queued
                .fetch_add(1, Ordering::SeqCst);
        }
        self.mem.submit(now_ns, cmd, out)?;
        self.clock_ns = self.clock_ns.max(now_ns) + self.latency_ns;
        Ok(Completion {
            done_ns: self.clock_ns,
            gc_active: false,
        })
    }
    fn background(&mut self, _now_ns: TimeNs) -> Option<TimeNs> {
        None
    }
    fn queued(&mut self) -> Option<&mut dyn afa_ssd::QueuedDevice> {
        Some(self)
    }
}

impl afa_ssd::QueuedDevice for SideBySide {
    fn start(&mut self, now_ns: TimeNs, cmd: &Command<'_>, tag: u64) -> Result<(), DeviceError> {
        let info = self.info();
        let mut bytes = vec![0u8; cmd.sectors as usize * info.sector_bytes as usize];
        if cmd.opcode != afa_ssd::Opcode::Read {
            bytes.clear();
        }
        self.mem.submit(
            now_ns,
            cmd,
            ReadBuffers {
                data: &mut bytes,
                tags: None,
            },
        )?;
        self.under_way
            .insert((now_ns + self.latency_ns, tag), bytes);
        self.counts
            .max_in_flight
            .fetch_max(self.under_way.len() as u64, Ordering::SeqCst);
        Ok(())
    }
    fn next_event_ns(&self) -> Option<TimeNs> {
        self.under_way.keys().next().map(|&(t, _)| t)
    }
    fn advance_to(&mut self, t_ns: TimeNs) -> Vec<afa_ssd::QueuedCompletion> {
        let mut done = Vec::new();
        while let Some(entry) = self.under_way.first_entry() {
            if entry.key().0 > t_ns {
                break;
            }
            let ((done_ns, tag), bytes) = entry.remove_entry();
            done.push(afa_ssd::QueuedCompletion {
                tag,
                done_ns,
                result: Ok(bytes),
            });
        }
        done
    }
}

/// A 512 KiB [`SideBySide`] device whose commands take `latency_ns` each.
fn side_by_side(latency_ns: u64) -> (SideBySide, Arc<SideBySideCounts>) {
    let counts = Arc::new(SideBySideCounts::default());
    let device = SideBySide {
        mem: MemDevice::new(512, 1024).unwrap(),
        latency_ns,
        clock_ns: 0,
        under_way: Default::default(),
        counts: Arc::clone(&counts),
    };
    (device, counts)
}

/// Paced over a device with a queued interface, a burst's requests run side by side on it
/// (split at its transfer limit), every read returns what was written, and a request that
/// must be applied whole (a partial sector's read-modify-write, WRITE_ZEROES) waits until
/// nothing is under way, so the device's `submit` never runs beside queued commands.
#[test]
fn a_paced_engine_serves_a_queued_device_side_by_side() {
    let (device, counts) = side_by_side(2_000_000);
    let (engine, _) = EngineHandle::spawn(Box::new(device), Pace::Model).unwrap();
    let tx = engine.sender();
    let (reply_tx, reply_rx) = crossbeam_channel::unbounded();
    let job = |handle: u64, request: Request, data: Vec<u8>| Job {
        handle,
        request,
        data,
        reply_to: reply_tx.clone(),
        credits: 1,
    };
    let round = |jobs: Vec<Job>| -> Vec<Reply> {
        let n = jobs.len();
        tx.submit(jobs).unwrap();
        let mut replies = Vec::new();
        while replies.len() < n {
            replies.extend(reply_rx.recv_timeout(Duration::from_secs(10)).unwrap());
        }
        replies.sort_by_key(|r| r.handle);
        replies
    };
    let mut model = vec![0u8; 1024 * 512];
    // 32 writes of 8 KiB (two commands each at the 4 KiB transfer limit), one burst.
    let writes: Vec<Job> = (0..32u64)
        .map(|h| {
            let data = vec![h as u8 + 1; 8192];
            let offset = h * 8192;
            model[offset as usize..offset as usize + 8192].copy_from_slice(&data);
            let fua = h % 4 == 0;
            job(
                h,
                Request::Write {
                    offset,
                    length: 8192,
                    fua,
                },
                data,
            )
        })
        .collect();
    assert!(round(writes).iter().all(|r| r.result.is_ok()));
    assert!(
        counts.max_in_flight.load(Ordering::SeqCst) > 8,
        "the burst's writes ran one after the other"
    );
    // Reads beside a partial-sector write, a WRITE_ZEROES, a flush and a trim.
    let mut mixed: Vec<Job> = (0..16u64)
        .map(|h| {
            let read = Request::Read {
                offset: h * 4096,
                length: 4096,
            };
            job(h, read, Vec::new())
        })
        .collect();
    let partial = vec![0xab; 1000];
    mixed.insert(
        5,
        job(
            100,
            Request::Write {
                offset: 700,
                length: 1000,
                fua: false,
            },
            partial,
        ),
    );
    mixed.insert(9, job(101, Request::Flush, Vec::new()));
    let zeroes = Request::WriteZeroes {
        offset: 8192,
        length: 4096,
        fua: false,
        no_hole: true,
    };
    mixed.insert(12, job(102, zeroes, Vec::new()));
    mixed.push(job(
        103,
        Request::Trim {
            offset: 65536,
            length: 4096,
            fua: false,
        },
        Vec::new(),
    ));
    let replies = round(mixed);
    assert!(replies.iter().all(|r| r.result.is_ok()), "a request failed");
    assert_eq!(counts.submits_beside_queued.load(Ordering::SeqCst), 0);
    assert!(
        counts.submits.load(Ordering::SeqCst) > 0,
        "nothing was applied whole"
    );
    // Reads that went before the partial write and the zeroes in the burst saw the data
    // before them; read everything again now that all are applied.
    model[700..1700].fill(0xab);
    model[8192..12288].fill(0);
    model[65536..69632].fill(0);
    let reads: Vec<Job> = (0..128u64)
        .map(|h| {
            let read = Request::Read {
                offset: h * 4096,
                length: 4096,
            };
            job(h, read, Vec::new())
        })
        .collect();
    for (h, r) in round(reads).into_iter().enumerate() {
        assert!(r.result.is_ok());
        assert!(
            r.data[..] == model[h * 4096..(h + 1) * 4096],
            "read {h} returned other bytes"
        );
    }
    let stats = engine.stop();
    assert_eq!(stats.requests, 32 + 20 + 128);
    assert_eq!(stats.errors, 0);
    assert_eq!(counts.submits_beside_queued.load(Ordering::SeqCst), 0);
}

/// One request of a random burst: kind (0 write, 1 read, 2 trim, 3 write-zeroes, 4 flush),
/// whether its range is whole sectors, offset, length, FUA, and a pattern seed.
type BurstOp = (u8, bool, u64, u32, bool, u8);

fn burst_op() -> impl Strategy<Value = BurstOp> {
    (
        0u8..5,
        any::<bool>(),
        0u64..500 * 1024,
        1u32..20_000,
        any::<bool>(),
        any::<u8>(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(afa_sim::proptest_cases(24)))]

    /// Random bursts of writes, reads, trims, write-zeroes and flushes, aligned or not,
    /// through the paced engine over a device with a queued interface behave like a flat
    /// byte array: within a burst requests on disjoint ranges, so their order does not
    /// matter; every read checked; the device's `submit` never runs beside queued commands.
    #[test]
    fn a_queued_device_behind_the_paced_engine_behaves_like_a_byte_array(
        rounds in proptest::collection::vec(proptest::collection::vec(burst_op(), 1..16), 1..6),
    ) {
        let size = 512 * 1024u64;
        let (device, counts) = side_by_side(100_000);
        let (engine, _) = EngineHandle::spawn(Box::new(device), Pace::Model).unwrap();
        let tx = engine.sender();
        let (reply_tx, reply_rx) = crossbeam_channel::unbounded();
        let mut model = vec![0u8; size as usize];
        let mut handle = 0u64;
        for ops in rounds {
            let mut taken: Vec<(u64, u64)> = Vec::new();
            let mut jobs = Vec::new();
            let mut reads = Vec::new();
            let mut next = model.clone();
            for (kind, aligned, offset, len, fua, seed) in ops {
                let (mut offset, mut len) = (offset.min(size - 1), len as u64);
                if aligned {
                    offset = offset / 512 * 512;
                    len = len.div_ceil(512) * 512;
                }
                len = len.min(size - offset);
                let range = (offset, offset + len);
                if kind != 4 && taken.iter().any(|&(a, b)| range.0 < b && a < range.1) {
                    continue;
                }
                taken.push(range);
                let (o, l) = (offset as usize, len as u32);
                let (request, data) = match kind {
                    0 => {
                        let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(seed | 1).wrapping_add(seed)).collect();
                        next[o..o + l as usize].copy_from_slice(&data);
                        (Request::Write { offset, length: l, fua }, data)
                    }
                    1 => {
                        reads.push((handle, offset, len));
                        (Request::Read { offset, length: l }, Vec::new())
                    }
                    2 => {
                        let first = offset.div_ceil(512) * 512;
                        let last = (offset + len) / 512 * 512;
                        if first < last {
                            next[first as usize..last as usize].fill(0);
                        }
                        (Request::Trim { offset, length: l, fua }, Vec::new())
                    }
                    3 => {
                        next[o..o + l as usize].fill(0);
                        (Request::WriteZeroes { offset, length: l, fua, no_hole: seed % 2 == 0 }, Vec::new())
                    }
                    _ => (Request::Flush, Vec::new()),
                };
                jobs.push(Job { handle, request, data, reply_to: reply_tx.clone(), credits: 1 });
                handle += 1;
            }
            let n = jobs.len();
            tx.submit(jobs).unwrap();
            let mut replies = Vec::new();
            while replies.len() < n {
                replies.extend(reply_rx.recv_timeout(Duration::from_secs(10)).unwrap());
            }
            for r in &replies {
                prop_assert!(r.result.is_ok(), "request {} failed: {:?}", r.handle, r.result);
            }
            for (h, offset, len) in reads {
                let r = replies.iter().find(|r| r.handle == h).unwrap();
                prop_assert!(
                    r.data[..] == model[offset as usize..(offset + len) as usize],
                    "read {} of {} bytes at {} returned other bytes", h, len, offset
                );
            }
            model = next;
        }
        // The last burst's writes read back too, in one request of many commands.
        let read_all = Request::Read { offset: 0, length: size as u32 };
        tx.submit(vec![Job { handle, request: read_all, data: Vec::new(), reply_to: reply_tx.clone(), credits: 1 }]).unwrap();
        let all = reply_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        prop_assert!(all[0].result.is_ok());
        prop_assert!(all[0].data == model, "the volume holds other bytes at the end");
        engine.stop();
        prop_assert_eq!(counts.submits_beside_queued.load(Ordering::SeqCst), 0);
        prop_assert!(counts.max_in_flight.load(Ordering::SeqCst) > 0);
    }
}

/// A device whose queued interface takes commands and never completes them.
struct Stuck(MemDevice);

impl BlockDevice for Stuck {
    fn info(&self) -> DeviceInfo {
        self.0.info()
    }
    fn submit(
        &mut self,
        now_ns: TimeNs,
        cmd: &Command<'_>,
        out: ReadBuffers<'_>,
    ) -> Result<Completion, DeviceError> {
        self.0.submit(now_ns, cmd, out)
    }
    fn background(&mut self, _now_ns: TimeNs) -> Option<TimeNs> {
        None
    }
    fn queued(&mut self) -> Option<&mut dyn afa_ssd::QueuedDevice> {
        Some(self)
    }
}

impl afa_ssd::QueuedDevice for Stuck {
    fn start(&mut self, _now_ns: TimeNs, _cmd: &Command<'_>, _tag: u64) -> Result<(), DeviceError> {
        Ok(())
    }
    fn next_event_ns(&self) -> Option<TimeNs> {
        None
    }
    fn advance_to(&mut self, _t_ns: TimeNs) -> Vec<afa_ssd::QueuedCompletion> {
        Vec::new()
    }
}

/// A request under way on a queued interface that has nothing left to do fails with EIO
/// and a message, rather than leaving its client waiting forever.
#[test]
fn a_request_a_queued_device_never_completes_fails_instead_of_hanging() {
    let device = Stuck(MemDevice::new(512, 64).unwrap());
    let (engine, _) = EngineHandle::spawn(Box::new(device), Pace::Model).unwrap();
    let (reply_tx, reply_rx) = crossbeam_channel::unbounded();
    let read = Request::Read {
        offset: 0,
        length: 4096,
    };
    let job = Job {
        handle: 1,
        request: read,
        data: Vec::new(),
        reply_to: reply_tx,
        credits: 1,
    };
    engine.sender().submit(vec![job]).unwrap();
    let replies = reply_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let failure = replies[0].result.as_ref().unwrap_err();
    assert_eq!(failure.errno, crate::proto::EIO);
    assert!(
        failure.message.contains("stopped before completing"),
        "{}",
        failure.message
    );
    assert_eq!(engine.stop().errors, 1);
}
