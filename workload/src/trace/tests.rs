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
                len_bytes: 512,
                volume: 0,
                fua: false,
            },
            TraceRecord {
                timestamp_ns: 1000,
                op: IoOp::Write,
                offset_bytes: 0,
                len_bytes: 8192,
                volume: 0,
                fua: false,
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
            len_bytes: 8 * 512,
            volume: 8 << 20,
            fua: false,
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
    assert_eq!(op("FWFS"), Some(IoOp::Flush), "the preflush comes first");
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
            len_bytes: 0,
            volume: 8 << 20,
            fua: false,
        }]
    );
}

/// blktrace's flags around the direction: a leading `F` is a preflush, read as a FLUSH
/// before the request; an `F` after a write's `W` is FUA. An empty write with a preflush is
/// only the flush.
#[test]
fn blkparse_reads_preflush_and_fua() {
    let ops = |line: &str| -> Vec<(IoOp, bool, u64)> {
        blkparse(line)
            .unwrap()
            .iter()
            .map(|r| (r.op, r.fua, r.len_bytes))
            .collect()
    };
    let q = |rwbs: &str| format!("8,0 0 1 1.5 1 Q {rwbs} 8 + 8 [p]\n");
    assert_eq!(ops(&q("W")), [(IoOp::Write, false, 4096)]);
    assert_eq!(ops(&q("WS")), [(IoOp::Write, false, 4096)]);
    assert_eq!(ops(&q("WFS")), [(IoOp::Write, true, 4096)]);
    assert_eq!(
        ops(&q("FWFS")),
        [(IoOp::Flush, false, 0), (IoOp::Write, true, 4096)]
    );
    assert_eq!(
        ops(&q("FWS")),
        [(IoOp::Flush, false, 0), (IoOp::Write, false, 4096)]
    );
    assert_eq!(
        ops(&q("RF")),
        [(IoOp::Read, false, 4096)],
        "FUA is a write's"
    );
    assert_eq!(
        ops(&q("FD")),
        [(IoOp::Flush, false, 0), (IoOp::Trim, false, 4096)]
    );
    assert_eq!(
        ops("8,0 0 1 1.5 1 Q FWS 0 + 0 [p]\n"),
        [(IoOp::Flush, false, 0)]
    );
    assert_eq!(ops("8,0 0 1 1.5 1 Q FWS [p]\n"), [(IoOp::Flush, false, 0)]);
    // A FUA write is written back as one, and read again the same.
    let fua = blkparse(&q("WFS")).unwrap();
    let mut text = Vec::new();
    write_trace(&fua, TraceFormat::Blkparse, &mut text).unwrap();
    assert_eq!(blkparse(std::str::from_utf8(&text).unwrap()).unwrap(), fua);
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
        volume: 0,
        fua: false,
    };
    let error = write_trace([trim], TraceFormat::MsrCsv, Vec::new()).unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput);
    let unaligned = TraceRecord {
        op: IoOp::Read,
        len_bytes: 100,
        ..trim
    };
    let error = write_trace([unaligned], TraceFormat::Blkparse, Vec::new()).unwrap_err();
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

fn record(
    timestamp_ns: u64,
    op: IoOp,
    offset_bytes: u64,
    len_bytes: u64,
    volume: u32,
) -> TraceRecord {
    TraceRecord {
        timestamp_ns,
        op,
        offset_bytes,
        len_bytes,
        volume,
        fua: false,
    }
}

#[test]
fn stats_use_table2_units() {
    let records = [
        record(0, IoOp::Write, 0, 4096, 0),
        record(5, IoOp::Write, 0, 8192, 1),
        record(9, IoOp::Read, 1 << 30, 1 << 30, 0),
        record(10, IoOp::Flush, 0, 0, 0),
    ];
    let stats = stats::TraceStats::of(records);
    assert_eq!(stats.write_count, 2);
    assert_eq!(stats.read_count, 1);
    assert_eq!(stats.flush_count, 1);
    assert_eq!(stats.write_avg_kib(), 6.0);
    assert_eq!(stats.read_gib(), 1.0);
    assert_eq!(stats.write_kops(), 0.002);
    assert_eq!(stats.duration_ns, 10);
    assert_eq!(stats.end_offset_bytes, 2 << 30);
    assert_eq!(stats.volumes, 2);
    assert_eq!(
        stats::TraceStats::of(Vec::<TraceRecord>::new()).read_avg_kib(),
        0.0
    );
}

#[test]
fn table2_rows_are_self_consistent() {
    // Count × average size matches the data column in binary units for every row (within
    // the table's rounding), which is how the units were inferred.
    for name in synth::profile_names() {
        let row = synth::profile(name).unwrap();
        let written = row.write_kops * 1000.0 * row.write_avg_kib / (1024.0 * 1024.0);
        let read = row.read_kops * 1000.0 * row.read_avg_kib / (1024.0 * 1024.0);
        assert!(
            (written / row.written_gib - 1.0).abs() < 0.03,
            "{name} written {written}"
        );
        assert!(
            (read / row.read_gib - 1.0).abs() < 0.03,
            "{name} read {read}"
        );
    }
    assert!(synth::profile("PROXY0").is_some());
    assert!(synth::profile("proxy1").is_none());
}

/// Synthesizes about `requests` requests like `name`, with the default model.
fn synthesize(name: &str, requests: f64, seed: u64) -> (synth::SynthOptions, Vec<TraceRecord>) {
    let row = synth::profile(name).unwrap();
    let mut options = synth::SynthOptions::new(row.clone());
    options.scale = requests / ((row.write_kops + row.read_kops) * 1000.0);
    options.seed = seed;
    let records = synth::Synthesizer::new(options.clone()).unwrap().collect();
    (options, records)
}

#[test]
fn synthesized_traces_match_their_table2_row_within_five_percent() {
    for name in synth::profile_names() {
        let (options, records) = synthesize(name, 20_000.0, 7);
        let row = &options.profile;
        let counted = stats::TraceStats::of(&records);
        let got = counted.table2_row();
        assert_eq!(
            (counted.write_count, counted.read_count),
            options.counts(),
            "{name}"
        );
        let close = |what: &str, got: f64, want: f64| {
            assert!(
                (got / want - 1.0).abs() <= 0.05,
                "{name} {what}: synthesized {got}, Table 2 {want}"
            );
        };
        close(
            "write count",
            got.write_kops / options.scale,
            row.write_kops,
        );
        close("read count", got.read_kops / options.scale, row.read_kops);
        close("write size", got.write_avg_kib, row.write_avg_kib);
        close("read size", got.read_avg_kib, row.read_avg_kib);
        close(
            "data written",
            got.written_gib / options.scale,
            row.written_gib,
        );
        close("data read", got.read_gib / options.scale, row.read_gib);
        assert!(records
            .iter()
            .all(|r| r.offset_bytes + r.len_bytes <= options.volume_bytes));
        assert!(records
            .windows(2)
            .all(|w| w[0].timestamp_ns <= w[1].timestamp_ns));
    }
}

#[test]
fn a_seed_reproduces_a_synthesized_trace_byte_for_byte() {
    let bytes = |seed| {
        let (_, records) = synthesize("src2", 2_000.0, seed);
        let mut out = Vec::new();
        write_trace(&records, TraceFormat::MsrCsv, &mut out).unwrap();
        out
    };
    assert_eq!(bytes(3), bytes(3));
    assert_ne!(bytes(3), bytes(4));
}

#[test]
fn synthesized_locality_follows_the_model() {
    let (options, records) = synthesize("webmail", 40_000.0, 11);
    // Sequential continuations: a request starting where the previous one of its kind ended.
    let mut ends: [Option<u64>; 2] = [None, None];
    let mut sequential = 0;
    let mut jumps = Vec::new();
    for r in &records {
        let kind = usize::from(r.op == IoOp::Read);
        if ends[kind] == Some(r.offset_bytes) {
            sequential += 1;
        } else {
            jumps.push(r.offset_bytes);
        }
        ends[kind] = Some(r.offset_bytes + r.len_bytes);
    }
    let sequential_fraction = sequential as f64 / records.len() as f64;
    assert!(
        (sequential_fraction - options.sequential_fraction).abs() < 0.03,
        "sequential fraction {sequential_fraction}"
    );
    // Jumps land in the hot extents with probability hot_access + (1 - hot_access) × hot_space.
    let extent_bytes = 1 << 20;
    let extents = options.volume_bytes / extent_bytes;
    let hot_count = (extents as f64 * options.hot_space_fraction) as u64;
    let hot: std::collections::HashSet<u64> = (0..hot_count)
        .map(|rank| crate::generator::scatter(rank, extents))
        .collect();
    let in_hot = jumps
        .iter()
        .filter(|o| hot.contains(&(*o / extent_bytes)))
        .count();
    let expected = options.hot_access_fraction
        + (1.0 - options.hot_access_fraction) * options.hot_space_fraction;
    let fraction = in_hot as f64 / jumps.len() as f64;
    assert!(
        (fraction - expected).abs() < 0.03,
        "hot fraction {fraction}, model {expected}"
    );
}

#[test]
fn synth_options_are_validated() {
    let mut options = synth::SynthOptions::new(synth::profile("DAP").unwrap());
    assert!(options.validate().is_ok());
    options.scale = 0.0;
    assert!(options.validate().unwrap_err().contains("scale"));
    options.scale = 1.0;
    options.volume_bytes = 1000;
    assert!(options.validate().unwrap_err().contains("volume"));
    options.volume_bytes = 1 << 30;
    options.hot_access_fraction = 1.5;
    assert!(options.validate().unwrap_err().contains("hot access"));
}

#[test]
fn transform_scales_time_and_lays_volumes_side_by_side() {
    let records = vec![
        record(1000, IoOp::Write, 0, 4096, 7),
        record(2000, IoOp::Read, 3 << 20, 4096, 2),
        record(3000, IoOp::Write, 4096, 4096, 9),
        record(4000, IoOp::Write, 8192, 512, 2),
    ];
    let transform = transform::TraceTransform {
        time_scale: 0.5,
        volumes: vec![2, 7],
        ..Default::default()
    };
    let out = transform.apply(records.clone()).unwrap();
    // Volume 9 is dropped; volume 2 comes first, volume 7 one stride (4 MiB: volume 2's end
    // rounded up to 1 MiB) after it.
    assert_eq!(
        out,
        vec![
            record(500, IoOp::Write, 4 << 20, 4096, 0),
            record(1000, IoOp::Read, 3 << 20, 4096, 0),
            record(2000, IoOp::Write, 8192, 512, 0),
        ]
    );
    let transform = transform::TraceTransform {
        volumes: vec![7, 2],
        volume_stride_bytes: Some(1 << 30),
        ..Default::default()
    };
    let out = transform.apply(records).unwrap();
    assert_eq!(out[1].offset_bytes, (1 << 30) + (3 << 20));
}

#[test]
fn transform_wraps_addresses_into_the_device() {
    let transform = transform::TraceTransform {
        wrap_bytes: Some(1 << 20),
        align_bytes: 4096,
        ..Default::default()
    };
    let out = transform
        .apply(vec![
            record(0, IoOp::Write, (5 << 20) + 100, 200, 0),
            record(0, IoOp::Write, (1 << 20) - 4096, 8192, 0),
            record(0, IoOp::Read, 0, 3 << 20, 0),
            record(0, IoOp::Flush, 77, 0, 0),
        ])
        .unwrap();
    let ranges: Vec<(u64, u64)> = out.iter().map(|r| (r.offset_bytes, r.len_bytes)).collect();
    assert_eq!(
        ranges,
        vec![(0, 4096), ((1 << 20) - 8192, 8192), (0, 1 << 20), (0, 0)]
    );
}

#[test]
fn transform_refuses_bad_parameters() {
    let bad = |t: transform::TraceTransform| t.apply(Vec::new()).unwrap_err();
    assert!(bad(transform::TraceTransform {
        time_scale: -1.0,
        ..Default::default()
    })
    .contains("time scale"));
    assert!(bad(transform::TraceTransform {
        volumes: vec![1, 1],
        ..Default::default()
    })
    .contains("twice"));
    assert!(bad(transform::TraceTransform {
        wrap_bytes: Some(1000),
        ..Default::default()
    })
    .contains("wrap"));
    let overflow = transform::TraceTransform {
        volumes: vec![0, 1],
        volume_stride_bytes: Some(1 << 62),
        ..Default::default()
    };
    let records = vec![record(0, IoOp::Write, u64::MAX - 8192, 4096, 1)];
    assert!(overflow.apply(records).unwrap_err().contains("overflows"));
}

#[test]
fn formats_are_guessed_from_the_first_line() {
    let guess = |text: &str| guess_format(text);
    assert_eq!(guess("\n1,h,0,Read,0,512,1\n"), Some(TraceFormat::MsrCsv));
    assert_eq!(
        guess("Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime"),
        Some(TraceFormat::MsrCsv)
    );
    assert_eq!(
        guess("  8,0 0 1 0.1 1 Q W 0 + 8 [p]"),
        Some(TraceFormat::Blkparse)
    );
    assert_eq!(guess("1 2 p 3 8 W 6 0 ab"), Some(TraceFormat::Fiu));
    assert_eq!(guess("fio version 2 iolog"), Some(TraceFormat::Iolog));
    assert_eq!(guess("0 0 1024 8 0"), Some(TraceFormat::Ascii));
    assert_eq!(guess("what is this"), None);
    assert_eq!(guess(""), None);
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn readers_never_panic(text in any::<String>()) {
            for format in TraceFormat::ALL {
                let _ = read_trace(text.as_bytes(), format, "any");
            }
        }

        #[test]
        fn readers_never_panic_on_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            for format in TraceFormat::ALL {
                let _ = read_trace(bytes.as_slice(), format, "bytes");
            }
        }

        #[test]
        fn readers_never_panic_on_plausible_lines(
            text in "(fio version [23] iolog\n)?([0-9,. +QWRDFNCa-z\\[\\]]{0,60}\n){0,10}"
        ) {
            for format in TraceFormat::ALL {
                let _ = read_trace(text.as_bytes(), format, "plausible");
            }
        }
    }
}
