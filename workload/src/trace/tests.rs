use super::*;

fn msr(text: &str) -> Result<Vec<TraceRecord>, WorkloadError> {
    read_trace(text.as_bytes(), TraceFormat::MsrCsv, "test.csv")
}

fn blkparse(text: &str) -> Result<Vec<TraceRecord>, WorkloadError> {
    read_trace(text.as_bytes(), TraceFormat::Blkparse, "test.txt")
}

/// Asserts that `result` is a `TraceLine` error for line `line`, and returns its reason.
fn line_error(result: Result<Vec<TraceRecord>, WorkloadError>, line: usize) -> String {
    match result {
        Err(WorkloadError::TraceLine {
            line: found,
            reason,
            ..
        }) if found == line => reason,
        other => panic!("expected an error on line {line}, got {other:?}"),
    }
}

#[test]
fn format_names() {
    assert_eq!("msr".parse::<TraceFormat>().unwrap(), TraceFormat::MsrCsv);
    assert_eq!(
        "MSR-CSV".parse::<TraceFormat>().unwrap(),
        TraceFormat::MsrCsv
    );
    assert_eq!(
        "blkparse".parse::<TraceFormat>().unwrap(),
        TraceFormat::Blkparse
    );
    let error = "spc".parse::<TraceFormat>().unwrap_err();
    assert!(error.to_string().contains("'spc'"), "{error}");
}

#[test]
fn msr_timestamps_are_relative_and_in_nanoseconds() {
    let records = msr("1000,h,0,Read,4096,512,5\n1010,h,0,Write,0,8192,5\n").unwrap();
    assert_eq!(
        records,
        vec![
            TraceRecord {
                timestamp_ns: 0,
                op: IoOp::Read,
                offset_bytes: 4096,
                len_bytes: 512
            },
            TraceRecord {
                timestamp_ns: 1000,
                op: IoOp::Write,
                offset_bytes: 0,
                len_bytes: 8192
            },
        ]
    );
}

#[test]
fn msr_accepts_header_blank_lines_crlf_and_any_case() {
    let text = "Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime\r\n\r\n\
                5,h,0,rEaD,0,512,1\r\n";
    assert_eq!(msr(text).unwrap().len(), 1);
}

#[test]
fn msr_rebases_to_the_earliest_timestamp() {
    let records = msr("20,h,0,Read,0,512,1\n10,h,0,Read,0,512,1\n").unwrap();
    assert_eq!(records[0].timestamp_ns, 1000);
    assert_eq!(records[1].timestamp_ns, 0);
}

#[test]
fn msr_malformed_lines() {
    let good = "1,h,0,Read,0,512,1\n";
    for (bad, reason_part) in [
        ("1,h,0,Read,0,512", "7 comma-separated"),
        ("x,h,0,Read,0,512,1", "timestamp"),
        ("1,h,0,Trim,0,512,1", "neither Read nor Write"),
        ("1,h,0,Read,-4,512,1", "offset"),
        ("1,h,0,Read,0,0,1", "size is zero"),
        ("1,h,0,Read,18446744073709551615,512,1", "overflows"),
    ] {
        let reason = line_error(msr(&format!("{good}{good}{bad}\n{good}")), 3);
        assert!(reason.contains(reason_part), "{bad}: {reason}");
    }
    line_error(msr("\u{ff}\n"), 1);
}

#[test]
fn blkparse_basic_queue_event() {
    let records =
        blkparse("  8,0    3        1     0.000000000   697  Q   W 223490 + 8 [kjournald]\n")
            .unwrap();
    assert_eq!(
        records,
        vec![TraceRecord {
            timestamp_ns: 0,
            op: IoOp::Write,
            offset_bytes: 223490 * 512,
            len_bytes: 8 * 512
        }]
    );
}

#[test]
fn blkparse_rwbs_mapping() {
    let line = |rwbs: &str| format!("8,0 0 1 1.5 1 Q {rwbs} 8 + 8 [p]\n");
    let op = |rwbs: &str| blkparse(&line(rwbs)).unwrap().first().map(|r| r.op);
    assert_eq!(op("R"), Some(IoOp::Read));
    assert_eq!(op("RA"), Some(IoOp::Read));
    assert_eq!(op("RM"), Some(IoOp::Read));
    assert_eq!(op("W"), Some(IoOp::Write));
    assert_eq!(op("WS"), Some(IoOp::Write));
    assert_eq!(op("FWFS"), Some(IoOp::Write));
    assert_eq!(op("D"), Some(IoOp::Trim));
    assert_eq!(op("DS"), Some(IoOp::Trim));
    assert_eq!(op("F"), Some(IoOp::Flush));
    assert_eq!(op("N"), None);
    let flush = blkparse("8,0 0 1 2.25 1 Q FN [kworker]\n").unwrap();
    assert_eq!(
        flush,
        vec![TraceRecord {
            timestamp_ns: 2_250_000_000,
            op: IoOp::Flush,
            offset_bytes: 0,
            len_bytes: 0
        }]
    );
}

#[test]
fn blkparse_keeps_only_the_requested_action() {
    let text = "8,0 0 1 0.1 1 Q W 0 + 8 [p]\n8,0 0 2 0.2 1 D W 0 + 8 [p]\n\
                8,0 0 3 0.3 0 C W 0 + 8 [0]\n";
    let completed = read_blkparse(text.as_bytes(), "t", 'C').unwrap();
    assert_eq!(completed.len(), 1);
    assert_eq!(completed[0].timestamp_ns, 300_000_000);
    assert_eq!(read_blkparse(text.as_bytes(), "t", 'D').unwrap().len(), 1);
}

#[test]
fn blkparse_skips_the_summary() {
    let text = "8,0 0 1 0.1 1 Q W 0 + 8 [p]\nCPU0 (8,0):\n Reads Queued: 0, 0KiB\n\
                Total (8,0):\nThroughput (R/W): 0KiB/s / 0KiB/s\nEvents (8,0): 1 entries\n";
    assert_eq!(blkparse(text).unwrap().len(), 1);
}

#[test]
fn blkparse_malformed_lines() {
    let good = "8,0 0 1 0.1 1 Q W 0 + 8 [p]\n";
    for (bad, reason_part) in [
        ("garbage here", "major,minor"),
        ("8,0 0 1", "time"),
        ("8,0 0 1 0.1 1 Q", "RWBS"),
        ("8,0 x 1 0.1 1 Q W 0 + 8 [p]", "cpu"),
        ("8,0 0 1 0.1.2 1 Q W 0 + 8 [p]", "time"),
        ("8,0 0 1 0.1234567890 1 Q W 0 + 8 [p]", "time"),
        ("8,0 0 1 0.1 1 Q W zero + 8 [p]", "sector"),
        ("8,0 0 1 0.1 1 Q W 0 - 8 [p]", "'+'"),
        ("8,0 0 1 0.1 1 Q W 0 +", "count"),
        ("8,0 0 1 0.1 1 Q W 0 + x [p]", "count"),
        ("8,0 0 1 0.1 1 Q W [p]", "sector"),
        ("8,0 0 1 0.1 1 Q W 36028797018963968 + 8 [p]", "too large"),
    ] {
        let reason = line_error(blkparse(&format!("{good}{bad}\n{good}")), 2);
        assert!(reason.contains(reason_part), "{bad}: {reason}");
    }
}

#[test]
fn write_refuses_what_the_format_cannot_hold() {
    let trim = TraceRecord {
        timestamp_ns: 0,
        op: IoOp::Trim,
        offset_bytes: 0,
        len_bytes: 512,
    };
    let error = write_trace(&[trim], TraceFormat::MsrCsv, Vec::new()).unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput);
    let unaligned = TraceRecord {
        op: IoOp::Read,
        len_bytes: 100,
        ..trim
    };
    let error = write_trace(&[unaligned], TraceFormat::Blkparse, Vec::new()).unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput);
}

#[test]
fn seconds_parsing_is_exact() {
    assert_eq!(parse_seconds_ns("0.000000001"), Some(1));
    assert_eq!(parse_seconds_ns("12.5"), Some(12_500_000_000));
    assert_eq!(parse_seconds_ns("3"), Some(3_000_000_000));
    assert_eq!(parse_seconds_ns(".5"), None);
    assert_eq!(parse_seconds_ns("1.-5"), None);
    assert_eq!(parse_seconds_ns("99999999999999999999"), None);
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn readers_never_panic(text in any::<String>()) {
            let _ = msr(&text);
            let _ = blkparse(&text);
        }

        #[test]
        fn readers_never_panic_on_plausible_lines(
            text in "([0-9,. +QWRDFNCa-z\\[\\]]{0,60}\n){0,10}"
        ) {
            let _ = msr(&text);
            let _ = blkparse(&text);
        }
    }
}
