//! The NBD server at the wire level, with a hand-written client: what real clients do, and
//! what broken or hostile ones do (which must close only that connection, with a reason).

mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use afa_serve::proto::*;
use afa_serve::{MemDevice, Pace};
use common::*;

const MIB: u64 = 1 << 20;

#[test]
fn go_reports_size_flags_and_block_sizes() {
    let server = serve(mem(4), Pace::None);
    let (mut c, flags) = RawClient::connect(&server);
    assert_eq!(flags, FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
    c.send_client_flags(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    let replies = c.go("afa", &[INFO_BLOCK_SIZE, INFO_NAME, INFO_DESCRIPTION, 99]);
    let infos: Vec<_> = replies.iter().filter(|r| r.kind == REP_INFO).collect();
    assert_eq!(replies.last().unwrap().kind, REP_ACK);
    let export = infos
        .iter()
        .find(|r| u16::from_be_bytes([r.data[0], r.data[1]]) == INFO_EXPORT)
        .expect("NBD_INFO_EXPORT is always sent");
    assert_eq!(
        u64::from_be_bytes(export.data[2..10].try_into().unwrap()),
        4 * MIB
    );
    let tflags = u16::from_be_bytes(export.data[10..12].try_into().unwrap());
    for f in [
        FLAG_HAS_FLAGS,
        FLAG_SEND_FLUSH,
        FLAG_SEND_FUA,
        FLAG_SEND_TRIM,
        FLAG_SEND_WRITE_ZEROES,
        FLAG_CAN_MULTI_CONN,
    ] {
        assert_eq!(tflags & f, f, "flag {f:#x} in {tflags:#x}");
    }
    assert_eq!(tflags & FLAG_SEND_DF, 0, "DF needs structured replies");
    let block = infos
        .iter()
        .find(|r| u16::from_be_bytes([r.data[0], r.data[1]]) == INFO_BLOCK_SIZE)
        .expect("block sizes were asked for");
    let min = u32::from_be_bytes(block.data[2..6].try_into().unwrap());
    let preferred = u32::from_be_bytes(block.data[6..10].try_into().unwrap());
    let max = u32::from_be_bytes(block.data[10..14].try_into().unwrap());
    assert_eq!((min, preferred, max), (1, 4096, 32 << 20));
    let name = infos
        .iter()
        .find(|r| u16::from_be_bytes([r.data[0], r.data[1]]) == INFO_NAME)
        .unwrap();
    assert_eq!(&name.data[2..], b"afa");
    assert_eq!(infos.len(), 4, "unknown info type 99 is ignored");
}

#[test]
fn list_names_the_export_and_abort_is_acknowledged() {
    let server = serve(mem(1), Pace::None);
    let (mut c, _) = RawClient::connect(&server);
    c.send_client_flags(FLAG_C_FIXED_NEWSTYLE);
    c.send_option(OPT_LIST, &[]);
    let r = c.read_opt_reply();
    assert_eq!(r.kind, REP_SERVER);
    assert_eq!(&r.data[4..], b"afa");
    assert_eq!(c.read_opt_reply().kind, REP_ACK);
    c.send_option(OPT_LIST, b"junk");
    assert_eq!(c.read_opt_reply().kind, REP_ERR_INVALID);
    c.send_option(OPT_ABORT, &[]);
    assert_eq!(c.read_opt_reply().kind, REP_ACK);
    assert!(c.is_closed());
}

#[test]
fn unknown_export_is_refused_by_go_and_closes_export_name() {
    let server = serve(mem(1), Pace::None);
    let (mut c, _) = RawClient::connect(&server);
    c.send_client_flags(FLAG_C_FIXED_NEWSTYLE);
    let replies = c.go("nope", &[]);
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].kind, REP_ERR_UNKNOWN);
    let message = String::from_utf8_lossy(&replies[0].data);
    assert!(
        message.contains("nope") && message.contains("afa"),
        "{message}"
    );
    // The connection survives a refused GO, and the right name then works.
    let replies = c.go("afa", &[]);
    assert_eq!(replies.last().unwrap().kind, REP_ACK);

    let (mut c, _) = RawClient::connect(&server);
    c.send_client_flags(FLAG_C_FIXED_NEWSTYLE);
    c.send_option(OPT_EXPORT_NAME, b"nope");
    assert!(
        c.is_closed(),
        "EXPORT_NAME cannot carry an error, so the server closes"
    );

    // EXPORT_NAME with the right name enters transmission with size and flags.
    let (mut c, _) = RawClient::connect(&server);
    c.send_client_flags(FLAG_C_FIXED_NEWSTYLE);
    c.send_option(OPT_EXPORT_NAME, b"afa");
    let mut reply = [0u8; 10 + 124];
    c.stream.read_exact(&mut reply).unwrap();
    assert_eq!(u64::from_be_bytes(reply[0..8].try_into().unwrap()), MIB);
    assert!(reply[10..].iter().all(|&b| b == 0));
}

#[test]
fn declined_options_get_err_unsup_with_a_reason() {
    let server = serve(mem(1), Pace::None);
    let (mut c, _) = RawClient::connect(&server);
    c.send_client_flags(FLAG_C_FIXED_NEWSTYLE);
    for opt in [OPT_STARTTLS, OPT_EXTENDED_HEADERS, 4242] {
        c.send_option(opt, &[]);
        let r = c.read_opt_reply();
        assert_eq!((r.option, r.kind), (opt, REP_ERR_UNSUP));
        assert!(!r.data.is_empty(), "the refusal says why");
    }
    // Meta contexts are served (`base:allocation`); a request without its export name
    // and queries is malformed.
    for opt in [OPT_SET_META_CONTEXT, OPT_LIST_META_CONTEXT] {
        c.send_option(opt, &[]);
        let r = c.read_opt_reply();
        assert_eq!((r.option, r.kind), (opt, REP_ERR_INVALID));
        assert!(!r.data.is_empty(), "the refusal says why");
    }
    c.send_option(OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(c.read_opt_reply().kind, REP_ACK);
    c.send_option(OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(c.read_opt_reply().kind, REP_ERR_INVALID, "negotiated twice");
    let go = c.go("", &[]);
    let export = &go[0].data;
    let tflags = u16::from_be_bytes(export[10..12].try_into().unwrap());
    assert_eq!(tflags & FLAG_SEND_DF, FLAG_SEND_DF);
}

#[test]
fn write_read_round_trip_with_simple_and_structured_replies() {
    for structured in [false, true] {
        let server = serve(mem(4), Pace::Model);
        let mut c = RawClient::open(&server, structured);
        let data = pattern(64 * 1024, 5);
        c.send_request(0, CMD_WRITE, 1, 8192, data.len() as u32, &data);
        let r = c.read_reply(0);
        assert_eq!((r.handle, r.errno), (1, 0));
        c.send_request(0, CMD_READ, 2, 8192, data.len() as u32, &[]);
        let r = c.read_reply(data.len());
        assert_eq!((r.handle, r.errno), (2, 0));
        assert_eq!(r.data, data);
        c.send_request(CMD_FLAG_FUA, CMD_WRITE, 3, 0, 4096, &data[..4096]);
        assert_eq!(c.read_reply(0).errno, 0);
        c.send_request(0, CMD_FLUSH, 4, 0, 0, &[]);
        assert_eq!(c.read_reply(0).errno, 0);
        c.send_request(0, CMD_DISC, 5, 0, 0, &[]);
        assert!(c.is_closed());
    }
}

#[test]
fn unaligned_requests_read_modify_write_partial_sectors() {
    let server = serve(mem(1), Pace::None);
    let mut c = RawClient::open(&server, true);
    let base = pattern(16384, 1);
    c.send_request(0, CMD_WRITE, 1, 0, base.len() as u32, &base);
    assert_eq!(c.read_reply(0).errno, 0);
    let mut expected = base.clone();
    // Within one sector, across a sector boundary, and spanning several sectors.
    for (i, (offset, len)) in [(100usize, 10usize), (4000, 200), (1000, 9000), (4096, 5000)]
        .into_iter()
        .enumerate()
    {
        let data = pattern(len, 100 + i as u8);
        expected[offset..offset + len].copy_from_slice(&data);
        c.send_request(
            0,
            CMD_WRITE,
            10 + i as u64,
            offset as u64,
            len as u32,
            &data,
        );
        assert_eq!(c.read_reply(0).errno, 0);
    }
    c.send_request(0, CMD_READ, 20, 0, 16384, &[]);
    assert_eq!(c.read_reply(16384).data, expected);
    c.send_request(0, CMD_READ, 21, 4001, 3, &[]);
    assert_eq!(c.read_reply(3).data, expected[4001..4004]);
}

#[test]
fn out_of_range_and_oversized_requests_get_einval_and_the_connection_goes_on() {
    for structured in [false, true] {
        let server = serve_with(mem(1), |c| c.max_request_bytes = 64 * 1024);
        let mut c = RawClient::open(&server, structured);
        c.send_request(0, CMD_READ, 1, MIB - 4096, 8192, &[]);
        let r = c.read_reply(8192);
        assert_eq!(r.errno, EINVAL);
        if structured {
            assert!(r.message.contains("past the export"), "{}", r.message);
        }
        c.send_request(0, CMD_WRITE, 2, MIB, 4096, &[7u8; 4096]);
        assert_eq!(c.read_reply(0).errno, EINVAL);
        c.send_request(0, CMD_TRIM, 3, u64::MAX - 10, 4096, &[]);
        assert_eq!(c.read_reply(0).errno, EINVAL, "offset + length overflows");
        c.send_request(0, CMD_READ, 4, 0, 128 * 1024, &[]);
        let r = c.read_reply(0);
        assert_eq!(r.errno, EINVAL);
        if structured {
            assert!(r.message.contains("maximum request"), "{}", r.message);
        }
        // The oversized write's payload is read and dropped, so the stream stays in step.
        c.send_request(0, CMD_WRITE, 5, 0, 128 * 1024, &vec![9u8; 128 * 1024]);
        assert_eq!(c.read_reply(0).errno, EINVAL);
        c.send_request(0, CMD_READ, 6, 0, 0, &[]);
        assert_eq!(c.read_reply(0).errno, EINVAL, "zero-length read");
        c.send_request(0, CMD_FLUSH, 7, 8, 0, &[]);
        assert_eq!(c.read_reply(0).errno, EINVAL, "flush with an offset");
        c.send_request(0, 5, 8, 0, 4096, &[]);
        assert_eq!(
            c.read_reply(0).errno,
            EINVAL,
            "NBD_CMD_CACHE is not offered"
        );
        c.send_request(1 << 7, CMD_WRITE, 9, 0, 4096, &[1u8; 4096]);
        assert_eq!(c.read_reply(0).errno, EINVAL, "unknown flag");
        c.send_request(CMD_FLAG_DF, CMD_WRITE, 10, 0, 4096, &[1u8; 4096]);
        assert_eq!(c.read_reply(0).errno, EINVAL, "DF is for reads only");
        // Nothing above reached the device.
        c.send_request(0, CMD_READ, 11, 0, 4096, &[]);
        let r = c.read_reply(4096);
        assert_eq!((r.handle, r.errno), (11, 0));
        assert!(r.data.iter().all(|&b| b == 0));
    }
}

/// A read-only export says so in its transmission flags, answers every request that would
/// change it with EPERM (a write's payload read and dropped, so the stream stays in step),
/// and still serves reads and flushes.
#[test]
fn a_read_only_export_advertises_it_and_refuses_changes_with_eperm() {
    let server = serve_with(mem(1), |c| c.read_only = true);
    let (mut c, _) = RawClient::connect(&server);
    c.send_client_flags(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    let replies = c.go("afa", &[]);
    let export = replies
        .iter()
        .find(|r| r.kind == REP_INFO && u16::from_be_bytes([r.data[0], r.data[1]]) == INFO_EXPORT)
        .expect("NBD_INFO_EXPORT is always sent");
    let tflags = u16::from_be_bytes(export.data[10..12].try_into().unwrap());
    assert_eq!(tflags & FLAG_READ_ONLY, FLAG_READ_ONLY, "{tflags:#x}");
    for structured in [false, true] {
        let mut c = RawClient::open(&server, structured);
        c.send_request(0, CMD_WRITE, 1, 0, 4096, &[7u8; 4096]);
        let r = c.read_reply(0);
        assert_eq!((r.handle, r.errno), (1, EPERM));
        if structured {
            assert!(r.message.contains("read-only"), "{}", r.message);
        }
        c.send_request(0, CMD_TRIM, 2, 0, 4096, &[]);
        assert_eq!(c.read_reply(0).errno, EPERM);
        c.send_request(0, CMD_WRITE_ZEROES, 3, 0, 4096, &[]);
        assert_eq!(c.read_reply(0).errno, EPERM);
        c.send_request(0, CMD_FLUSH, 4, 0, 0, &[]);
        assert_eq!(c.read_reply(0).errno, 0);
        c.send_request(0, CMD_READ, 5, 0, 4096, &[]);
        let r = c.read_reply(4096);
        assert_eq!((r.handle, r.errno), (5, 0));
        assert!(
            r.data.iter().all(|&b| b == 0),
            "the refused write reached the device"
        );
    }
}

#[test]
fn trim_and_write_zeroes_read_back_as_zeroes() {
    let server = serve(Box::new(small_ssd()), Pace::None);
    let mut c = RawClient::open(&server, false);
    let data = pattern(65536, 3);
    c.send_request(0, CMD_WRITE, 1, 0, 65536, &data);
    assert_eq!(c.read_reply(0).errno, 0);
    c.send_request(0, CMD_TRIM, 2, 4096, 8192, &[]);
    assert_eq!(c.read_reply(0).errno, 0);
    c.send_request(0, CMD_WRITE_ZEROES, 3, 20000, 10000, &[]);
    assert_eq!(c.read_reply(0).errno, 0);
    c.send_request(
        CMD_FLAG_NO_HOLE | CMD_FLAG_FUA,
        CMD_WRITE_ZEROES,
        4,
        40000,
        3000,
        &[],
    );
    assert_eq!(c.read_reply(0).errno, 0);
    c.send_request(0, CMD_READ, 5, 0, 65536, &[]);
    let got = c.read_reply(65536).data;
    let mut expected = data.clone();
    expected[4096..12288].fill(0);
    expected[20000..30000].fill(0);
    expected[40000..43000].fill(0);
    assert_eq!(got, expected);
}

#[test]
fn pipelined_requests_are_all_answered_with_their_handles() {
    let server = serve(Box::new(small_ssd()), Pace::Model);
    let mut c = RawClient::open(&server, true);
    let n = 200u64;
    for i in 0..n {
        let data = vec![i as u8; 4096];
        c.send_request(0, CMD_WRITE, 1000 + i, i * 4096, 4096, &data);
    }
    let mut handles: Vec<u64> = (0..n)
        .map(|_| c.read_reply(0))
        .map(|r| {
            assert_eq!(r.errno, 0);
            r.handle
        })
        .collect();
    handles.sort();
    assert_eq!(handles, (1000..1000 + n).collect::<Vec<_>>());
    for i in 0..n {
        c.send_request(0, CMD_READ, i, i * 4096, 4096, &[]);
    }
    for _ in 0..n {
        let r = c.read_reply(4096);
        assert!(
            r.data.iter().all(|&b| b == r.handle as u8),
            "handle {}",
            r.handle
        );
    }
}

#[test]
fn disc_answers_outstanding_requests_first() {
    let server = serve(
        Box::new(
            MemDevice::new(4096, 256)
                .unwrap()
                .with_latency_ns(50_000_000),
        ),
        Pace::Model,
    );
    let mut c = RawClient::open(&server, false);
    c.send_request(0, CMD_WRITE, 1, 0, 4096, &[4u8; 4096]);
    c.send_request(0, CMD_DISC, 2, 0, 0, &[]);
    let r = c.read_reply(0);
    assert_eq!((r.handle, r.errno), (1, 0));
    assert!(c.is_closed());
}

#[test]
fn paced_replies_wait_for_the_model_and_unpaced_ones_do_not() {
    let latency = Duration::from_millis(300);
    for pace in [Pace::Model, Pace::None] {
        let device = MemDevice::new(4096, 256)
            .unwrap()
            .with_latency_ns(latency.as_nanos() as u64);
        let server = serve(Box::new(device), pace);
        let mut c = RawClient::open(&server, false);
        let start = Instant::now();
        c.send_request(0, CMD_WRITE, 1, 0, 4096, &[1u8; 4096]);
        assert_eq!(c.read_reply(0).errno, 0);
        let elapsed = start.elapsed();
        match pace {
            Pace::Model => assert!(elapsed >= latency, "paced reply after {elapsed:?}"),
            Pace::None => assert!(elapsed < latency, "unpaced reply after {elapsed:?}"),
        }
    }
}

#[test]
fn several_connections_at_once_share_one_volume() {
    for pace in [Pace::Model, Pace::None] {
        several_connections(pace);
    }
}

fn several_connections(pace: Pace) {
    let server = serve(Box::new(small_ssd()), pace);
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let mut c = RawClient::open(&server, t % 2 == 0);
            std::thread::spawn(move || {
                for i in 0..50u64 {
                    let offset = (t * 50 + i) * 8192;
                    c.send_request(
                        0,
                        CMD_WRITE,
                        i,
                        offset,
                        8192,
                        &vec![(t * 50 + i) as u8; 8192],
                    );
                    assert_eq!(c.read_reply(0).errno, 0);
                }
                c.send_request(0, CMD_FLUSH, 99, 0, 0, &[]);
                assert_eq!(c.read_reply(0).errno, 0);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut c = RawClient::open(&server, false);
    for k in 0..200u64 {
        c.send_request(0, CMD_READ, k, k * 8192, 8192, &[]);
        let r = c.read_reply(8192);
        assert!(r.data.iter().all(|&b| b == k as u8), "block {k}");
    }
}

#[test]
fn malformed_input_closes_only_that_connection() {
    let server = serve(mem(1), Pace::None);
    // Garbage instead of client flags.
    let (mut c, _) = RawClient::connect(&server);
    c.send_client_flags(0xdead_beef);
    assert!(c.is_closed());
    // Plain (not fixed) newstyle.
    let (mut c, _) = RawClient::connect(&server);
    c.send_client_flags(0);
    assert!(c.is_closed());
    // A bad option magic.
    let (mut c, _) = RawClient::connect(&server);
    c.send_client_flags(FLAG_C_FIXED_NEWSTYLE);
    c.stream.write_all(&[0x55; 16]).unwrap();
    assert!(c.is_closed());
    // An option claiming a huge payload.
    let (mut c, _) = RawClient::connect(&server);
    c.send_client_flags(FLAG_C_FIXED_NEWSTYLE);
    let mut m = IHAVEOPT.to_be_bytes().to_vec();
    m.extend_from_slice(&OPT_GO.to_be_bytes());
    m.extend_from_slice(&u32::MAX.to_be_bytes());
    c.stream.write_all(&m).unwrap();
    assert!(c.is_closed());
    // A malformed GO payload is an error reply, not a close.
    let (mut c, _) = RawClient::connect(&server);
    c.send_client_flags(FLAG_C_FIXED_NEWSTYLE);
    c.send_option(OPT_GO, &[0, 0, 0, 200, b'x']);
    assert_eq!(c.read_opt_reply().kind, REP_ERR_INVALID);
    // A bad request magic in transmission.
    let mut c = RawClient::open(&server, true);
    c.stream.write_all(&[0xff; 28]).unwrap();
    assert!(c.is_closed());
    // Truncated in the middle of a write's payload.
    let mut c = RawClient::open(&server, false);
    c.send_request(0, CMD_WRITE, 1, 0, 4096, &[1u8; 100]);
    c.stream.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(c.is_closed());
    // The server still serves.
    let mut c = RawClient::open(&server, false);
    c.send_request(0, CMD_READ, 1, 0, 4096, &[]);
    assert_eq!(c.read_reply(4096).errno, 0);
}

#[test]
fn connections_over_the_limit_are_refused_with_a_message() {
    let server = serve_with(mem(1), |c| c.max_connections = 1);
    let first = RawClient::open(&server, false);
    let (mut second, _) = RawClient::connect(&server);
    second.send_client_flags(FLAG_C_FIXED_NEWSTYLE);
    let replies = second.go("", &[]);
    assert_eq!(replies[0].kind, REP_ERR_POLICY);
    let message = String::from_utf8_lossy(&replies[0].data);
    assert!(message.contains("limit of 1"), "{message}");
    drop(second);
    drop(first);
    // Once the first has gone, a new client gets in (the count drops asynchronously).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (mut c, _) = RawClient::connect(&server);
        c.send_client_flags(FLAG_C_FIXED_NEWSTYLE);
        if c.go("", &[]).last().unwrap().kind == REP_ACK {
            break;
        }
        assert!(Instant::now() < deadline, "the slot was never freed");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_silent_client_is_dropped_after_the_handshake_timeout() {
    let server = serve_with(mem(1), |c| c.handshake_timeout_ms = 200);
    let (mut c, _) = RawClient::connect(&server);
    let start = Instant::now();
    assert!(c.is_closed());
    assert!(start.elapsed() >= Duration::from_millis(150));
}

#[test]
fn unix_socket_listener_serves_and_cleans_up() {
    let dir = scratch("unix");
    let path = dir.join("afa.sock");
    let server = serve_with(mem(1), |c| {
        c.listen = format!("unix:{}", path.display()).parse().unwrap()
    });
    assert!(server.uri().starts_with("nbd+unix:///afa?socket="));
    let mut s = std::os::unix::net::UnixStream::connect(&path).unwrap();
    let mut greet = [0u8; 18];
    s.read_exact(&mut greet).unwrap();
    assert_eq!(&greet[0..8], b"NBDMAGIC");
    drop(s);
    server.stop();
    assert!(!path.exists(), "the socket file is removed on stop");
}

#[test]
fn listen_addresses_parse_or_name_the_problem() {
    use afa_serve::ListenAddr;
    assert!(matches!(
        "127.0.0.1:10809".parse::<ListenAddr>(),
        Ok(ListenAddr::Tcp(_))
    ));
    assert!(matches!(
        "[::1]:10809".parse::<ListenAddr>(),
        Ok(ListenAddr::Tcp(_))
    ));
    assert!(matches!(
        "unix:/tmp/x.sock".parse::<ListenAddr>(),
        Ok(ListenAddr::Unix(_))
    ));
    let e = "localhost".parse::<ListenAddr>().unwrap_err().to_string();
    assert!(e.contains("\"localhost\"") && e.contains("IP:PORT"), "{e}");
    assert!("unix:"
        .parse::<ListenAddr>()
        .unwrap_err()
        .to_string()
        .contains("socket path"));
}
