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
    assert_eq!("SPC".parse::<TraceFormat>().unwrap(), TraceFormat::Spc);
    assert_eq!("umass".parse::<TraceFormat>().unwrap(), TraceFormat::Spc);
    assert_eq!(
        "Alibaba".parse::<TraceFormat>().unwrap(),
        TraceFormat::Alibaba
    );
    assert_eq!(
        "tencent-cbs".parse::<TraceFormat>().unwrap(),
        TraceFormat::Tencent
    );
    for format in TraceFormat::ALL {
        assert_eq!(format.to_string().parse::<TraceFormat>().unwrap(), format);
    }
    let error = "spc2".parse::<TraceFormat>().unwrap_err();
    assert!(error.to_string().contains("'spc2'"), "{error}");
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
    assert_eq!(guess("0,303567,3584,w,0.000000"), Some(TraceFormat::Spc));
    assert_eq!(
        guess(" 3 , 11542 , 4096 , R , 0.1 "),
        Some(TraceFormat::Spc)
    );
    // Seven fields, as many as MSR has, but the one-letter opcode makes it SPC.
    assert_eq!(guess("0,303567,3584,W,0.5,a,b"), Some(TraceFormat::Spc));
    assert_eq!(
        guess("0,R,126703644672,4096,1577808000000626"),
        Some(TraceFormat::Alibaba)
    );
    assert_eq!(guess("7,w,1000,100,5"), Some(TraceFormat::Alibaba));
    assert_eq!(
        guess("1538323200,12058624,8,1,1063"),
        Some(TraceFormat::Tencent)
    );
    assert_eq!(guess("1, 2, 3, 0, 4"), Some(TraceFormat::Tencent));
    // Near misses of the comma formats match none of them.
    assert_eq!(guess("1,2,3,2,4"), None, "IOType 2");
    assert_eq!(guess("0,R,1,2,3,4"), None, "Alibaba with six fields");
    assert_eq!(guess("0,x,3584,w,0.0"), None, "SPC with a letter LBA");
    assert_eq!(guess("0,1,2,3"), None);
    assert_eq!(guess("what is this"), None);
    assert_eq!(guess(""), None);
}

/// Every fixture's first line is guessed as the format the fixture is in, so adding a
/// format's guess has not stolen another's.
#[test]
fn every_fixture_is_guessed_as_its_format() {
    for (text, format) in [
        (
            include_str!("../../tests/fixtures/msr_small.csv"),
            TraceFormat::MsrCsv,
        ),
        (
            include_str!("../../tests/fixtures/blkparse_small.txt"),
            TraceFormat::Blkparse,
        ),
        (
            include_str!("../../tests/fixtures/fiu_small.txt"),
            TraceFormat::Fiu,
        ),
        (
            include_str!("../../tests/fixtures/iolog_v2.log"),
            TraceFormat::Iolog,
        ),
        (
            include_str!("../../tests/fixtures/iolog_v3.log"),
            TraceFormat::Iolog,
        ),
        (
            include_str!("../../tests/fixtures/ascii_small.trace"),
            TraceFormat::Ascii,
        ),
        (SPC_FIXTURE, TraceFormat::Spc),
        (ALIBABA_FIXTURE, TraceFormat::Alibaba),
        (TENCENT_FIXTURE, TraceFormat::Tencent),
    ] {
        assert_eq!(guess_format(text), Some(format), "{format}");
    }
}

const SPC_FIXTURE: &str = include_str!("../../tests/fixtures/spc_small.csv");
const ALIBABA_FIXTURE: &str = include_str!("../../tests/fixtures/alibaba_small.csv");
const TENCENT_FIXTURE: &str = include_str!("../../tests/fixtures/tencent_small.csv");

fn read_as(format: TraceFormat, text: &str) -> Result<Vec<TraceRecord>, WorkloadError> {
    read_trace(text.as_bytes(), format, "test")
}

/// Writes `records` in `format` and reads them back.
fn round_trip(records: &[TraceRecord], format: TraceFormat) -> Vec<TraceRecord> {
    let mut written = Vec::new();
    write_trace(records, format, &mut written).unwrap();
    read_trace(written.as_slice(), format, "round trip").unwrap()
}

/// Puts each bad line between two good ones and checks that it is refused on line 2 with
/// the whole message (`trace test line 2: ...`) naming the problem.
fn check_malformed(format: TraceFormat, good: &str, cases: &[(&str, &str)]) {
    for (bad, reason_part) in cases {
        let text = format!("{good}\n{bad}\n{good}\n");
        let message = read_as(format, &text).unwrap_err().to_string();
        assert!(
            message.starts_with("trace test line 2: "),
            "{format} {bad:?}: {message}"
        );
        assert!(message.contains(reason_part), "{format} {bad:?}: {message}");
        line_error(read_as(format, &text), 2);
    }
}

/// Asserts that writing `record` in `format` is refused as invalid input, with a message
/// containing `reason_part`.
fn assert_refused(format: TraceFormat, record: TraceRecord, reason_part: &str) {
    let mut out = Vec::new();
    let error = write_trace([record], format, &mut out).unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput, "{format}");
    assert!(error.to_string().contains(reason_part), "{format}: {error}");
    assert!(out.is_empty(), "{format} wrote part of a refused record");
}

#[test]
fn spc_fixture_reads_every_field_variant() {
    let records = read_as(TraceFormat::Spc, SPC_FIXTURE).unwrap();
    assert_eq!(
        records,
        vec![
            record(0, IoOp::Write, 303567 * 512, 3584, 0),
            record(0, IoOp::Write, 55590 * 512, 3072, 1),
            record(26_214_000, IoOp::Write, 303574 * 512, 3584, 0),
            record(26_214_000, IoOp::Write, 240840 * 512, 3072, 1),
            record(52_407_000, IoOp::Read, 125638 * 512, 512, 2),
            // Upper-case opcodes, spaces around fields and optional trailing fields.
            record(62_406_000, IoOp::Write, 303581 * 512, 3584, 0),
            record(100_000_000, IoOp::Read, 11542 * 512, 4096, 3),
            record(132_408_000, IoOp::Write, 303588 * 512, 3584, 0),
            // After the blank line; a size that is not whole sectors.
            record(1_000_001_000, IoOp::Read, 4 * 512, 16384, 4),
            record(2_500_000_000, IoOp::Write, 1000 * 512, 1000, 5),
        ]
    );
    assert_eq!(round_trip(&records, TraceFormat::Spc), records);
}

#[test]
fn spc_timestamps_are_exact_and_relative_to_the_earliest() {
    let times = |text: &str| -> Vec<u64> {
        read_as(TraceFormat::Spc, text)
            .unwrap()
            .iter()
            .map(|r| r.timestamp_ns)
            .collect()
    };
    // 0.3 and 0.7 are not exact in binary floating point; read as digits they are.
    assert_eq!(
        times("0,0,512,r,5.3\n0,0,512,r,0.000000001\n0,0,512,r,5.7\r\n0,0,512,r,12.\n"),
        [5_299_999_999, 0, 5_699_999_999, 11_999_999_999]
    );
    assert_eq!(
        times("0,0,512,r,18446744073.709551615\n"),
        [0],
        "a lone record is the earliest"
    );
    assert_eq!(
        times("0,0,512,r,0\n0,0,512,r,18446744073.709551615\n"),
        [0, u64::MAX]
    );
}

#[test]
fn spc_malformed_lines() {
    check_malformed(
        TraceFormat::Spc,
        "0,8,4096,w,0.5",
        &[
            ("0,8,4096,w", "at least 5 comma-separated fields"),
            ("0 8 4096 w 0.5", "found 1"),
            ("x,8,4096,w,0.5", "ASU 'x'"),
            ("-1,8,4096,w,0.5", "ASU '-1'"),
            ("4294967296,8,4096,w,0.5", "ASU '4294967296'"),
            ("0,,4096,w,0.5", "LBA ''"),
            ("0,0x8,4096,w,0.5", "LBA '0x8'"),
            ("0,8,4k,w,0.5", "size '4k'"),
            ("0,8,0,w,0.5", "size is zero"),
            ("0,8,4096,x,0.5", "opcode 'x' is neither r nor w"),
            ("0,8,4096,write,0.5", "opcode 'write'"),
            ("0,8,4096,w,", "timestamp '' is not a decimal"),
            ("0,8,4096,w,-0.5", "timestamp '-0.5' is negative"),
            ("0,8,4096,w,NaN", "timestamp 'NaN' is not a decimal"),
            ("0,8,4096,w,1e3", "timestamp '1e3' is not a decimal"),
            ("0,8,4096,w,.5", "timestamp '.5' is not a decimal"),
            ("0,8,4096,w,1.2.3", "timestamp '1.2.3' is not a decimal"),
            ("0,8,4096,w,0.1234567891", "more than 9 decimal places"),
            ("0,8,4096,w,18446744073.709551616", "too large"),
            ("0,8,4096,w,99999999999999999999", "too large"),
            (
                "0,36028797018963968,512,w,0.5",
                "LBA '36028797018963968' is too large",
            ),
            ("0,36028797018963967,1024,w,0.5", "offset + size overflows"),
        ],
    );
}

#[test]
fn alibaba_fixture_reads_every_field_variant() {
    let records = read_as(TraceFormat::Alibaba, ALIBABA_FIXTURE).unwrap();
    assert_eq!(
        records,
        vec![
            record(0, IoOp::Read, 126703644672, 4096, 0),
            record(622_000, IoOp::Write, 126703648768, 8192, 0),
            record(622_000, IoOp::Read, 4096, 65536, 3),
            record(1_384_000, IoOp::Write, 126703656960, 4096, 0),
            // Lower-case opcodes, and offsets and lengths that are not whole sectors.
            record(2_374_000, IoOp::Read, 1000, 100, 7),
            record(9_374_000, IoOp::Write, 69632, 4096, 3),
            // After the blank line.
            record(1_000_000_000, IoOp::Read, 0, 512, 0),
            record(1_999_374_000, IoOp::Write, 1 << 40, 131072, 12),
        ]
    );
    assert_eq!(round_trip(&records, TraceFormat::Alibaba), records);
    assert_eq!(
        read_as(TraceFormat::Alibaba, " 1 , W , 512 , 512 , 9 \r\n").unwrap(),
        [record(0, IoOp::Write, 512, 512, 1)],
        "spaces around fields and CRLF"
    );
}

#[test]
fn alibaba_malformed_lines() {
    check_malformed(
        TraceFormat::Alibaba,
        "0,R,4096,4096,1577808000000626",
        &[
            ("0,R,4096,4096", "expected 5 comma-separated fields"),
            ("0,R,4096,4096,1,2", "found 6"),
            ("dev,R,4096,4096,1", "device_id 'dev'"),
            ("-1,R,4096,4096,1", "device_id '-1'"),
            ("4294967296,R,4096,4096,1", "device_id '4294967296'"),
            ("0,X,4096,4096,1", "opcode 'X' is neither R nor W"),
            ("0,RW,4096,4096,1", "opcode 'RW'"),
            ("0,R,-4096,4096,1", "offset '-4096'"),
            ("0,R,4096,4 KiB,1", "length '4 KiB'"),
            (
                "0,R,4096,4294967296,1",
                "length '4294967296' is not an unsigned 32-bit",
            ),
            ("0,R,4096,0,1", "length is zero"),
            ("0,R,4096,4096,1.5", "timestamp '1.5'"),
            ("0,R,4096,4096,-1", "timestamp '-1'"),
            (
                "0,R,18446744073709551615,4096,1",
                "offset + length overflows",
            ),
        ],
    );
    // Microseconds that are too far apart to count in 64-bit nanoseconds.
    let far = format!("0,R,0,512,0\n0,R,0,512,{}\n", u64::MAX);
    assert!(line_error(read_as(TraceFormat::Alibaba, &far), 2).contains("too far"));
    // Absolute microseconds are rebased before they are scaled, so a late clock is fine.
    let late = format!("0,R,0,512,{}\n0,R,0,512,{}\n", u64::MAX - 1, u64::MAX);
    assert_eq!(
        read_as(TraceFormat::Alibaba, &late).unwrap()[1].timestamp_ns,
        1000
    );
}

#[test]
fn tencent_fixture_reads_every_field_variant() {
    let records = read_as(TraceFormat::Tencent, TENCENT_FIXTURE).unwrap();
    let s = 1_000_000_000;
    assert_eq!(
        records,
        vec![
            record(0, IoOp::Write, 12058624 * 512, 4096, 1063),
            record(0, IoOp::Write, 12058632 * 512, 4096, 1063),
            record(s, IoOp::Read, 3045632 * 512, 8192, 1063),
            record(s, IoOp::Write, 44040192 * 512, 65536, 2170),
            record(2 * s, IoOp::Read, 0, 512, 2170),
            // After the blank line.
            record(5 * s, IoOp::Write, 12058640 * 512, 4096, 1063),
            record(60 * s, IoOp::Read, 3045648 * 512, 131072, 1063),
            record(60 * s, IoOp::Read, 7 * 512, 4096, 0),
        ]
    );
    assert_eq!(round_trip(&records, TraceFormat::Tencent), records);
    assert_eq!(
        read_as(TraceFormat::Tencent, " 9 , 1 , 2 , 1 , 3 \r\n").unwrap(),
        [record(0, IoOp::Write, 512, 1024, 3)],
        "spaces around fields and CRLF"
    );
}

#[test]
fn tencent_malformed_lines() {
    check_malformed(
        TraceFormat::Tencent,
        "1538323200,12058624,8,1,1063",
        &[
            (
                "1538323200,12058624,8,1",
                "expected 5 comma-separated fields",
            ),
            ("1538323200,12058624,8,1,1063,0", "found 6"),
            ("1538323200.5,12058624,8,1,1063", "Timestamp '1538323200.5'"),
            ("1538323200,-8,8,1,1063", "Offset '-8'"),
            ("1538323200,12058624,eight,1,1063", "Size 'eight'"),
            ("1538323200,12058624,0,1,1063", "size is zero"),
            (
                "1538323200,12058624,8,2,1063",
                "IOType '2' is neither 0 (read) nor 1 (write)",
            ),
            ("1538323200,12058624,8,W,1063", "IOType 'W'"),
            ("1538323200,12058624,8,1,v1063", "VolumeID 'v1063'"),
            (
                "1538323200,12058624,8,1,4294967296",
                "VolumeID '4294967296'",
            ),
            (
                "1538323200,36028797018963968,8,1,1063",
                "Offset is too large",
            ),
            ("1538323200,36028797018963960,8,1,1063", "size is too large"),
        ],
    );
    // Seconds that are too far apart to count in 64-bit nanoseconds.
    let far = "0,0,1,0,0\n18446744074,0,1,0,0\n";
    assert!(line_error(read_as(TraceFormat::Tencent, far), 2).contains("too far"));
    let fits = "0,0,1,0,0\n18446744073,0,1,0,0\n";
    assert_eq!(
        read_as(TraceFormat::Tencent, fits).unwrap()[1].timestamp_ns,
        18_446_744_073_000_000_000
    );
}

#[test]
fn new_writers_write_their_formats_lines() {
    let records = [
        record(0, IoOp::Write, 303567 * 512, 3584, 0),
        record(2_500_000_001, IoOp::Read, 1024, 8192, 1063),
    ];
    let text = |format| {
        let mut out = Vec::new();
        write_trace(records, format, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    };
    assert_eq!(
        text(TraceFormat::Spc),
        "0,303567,3584,w,0.000000000\n1063,2,8192,r,2.500000001\n"
    );
    assert_eq!(
        text(TraceFormat::Alibaba),
        "0,W,155426304,3584,0\n1063,R,1024,8192,2500000\n"
    );
    assert_eq!(
        text(TraceFormat::Tencent),
        "0,303567,7,1,0\n2,2,16,0,1063\n"
    );
}

/// Tencent counts whole seconds, so its writer truncates finer times, as the MSR (100 ns)
/// and iolog (µs) writers truncate to theirs; Alibaba truncates to microseconds.
#[test]
fn writers_truncate_times_to_their_format_step() {
    let records = [
        record(0, IoOp::Write, 0, 512, 0),
        record(1_999_999_999, IoOp::Write, 0, 512, 0),
        record(3_000_000_500, IoOp::Read, 0, 512, 0),
    ];
    let times = |format| -> Vec<u64> {
        round_trip(&records, format)
            .iter()
            .map(|r| r.timestamp_ns)
            .collect()
    };
    assert_eq!(
        times(TraceFormat::Tencent),
        [0, 1_000_000_000, 3_000_000_000]
    );
    assert_eq!(
        times(TraceFormat::Alibaba),
        [0, 1_999_999_000, 3_000_000_000]
    );
    assert_eq!(times(TraceFormat::Spc), [0, 1_999_999_999, 3_000_000_500]);
    for format in TraceFormat::ALL {
        let step_ns = format.timestamp_step_ns();
        let kept: Vec<u64> = records
            .iter()
            .map(|r| r.timestamp_ns / step_ns * step_ns)
            .collect();
        assert_eq!(times(format), kept, "{format}");
    }
}

#[test]
fn new_writers_refuse_what_their_format_cannot_hold() {
    let read = record(0, IoOp::Read, 4096, 4096, 0);
    for format in [TraceFormat::Spc, TraceFormat::Alibaba, TraceFormat::Tencent] {
        assert!(!format.holds(IoOp::Trim) && !format.holds(IoOp::Flush));
        assert!(format.holds(IoOp::Read) && format.holds(IoOp::Write));
        assert!(!format.holds_fua());
        assert_refused(
            format,
            TraceRecord {
                op: IoOp::Trim,
                ..read
            },
            "Trim",
        );
        assert_refused(
            format,
            TraceRecord {
                op: IoOp::Flush,
                len_bytes: 0,
                ..read
            },
            "Flush",
        );
        let empty = TraceRecord {
            len_bytes: 0,
            ..read
        };
        assert_refused(format, empty, "");
    }
    // SPC's LBA counts 512-byte blocks, but its size is bytes.
    let unaligned_offset = TraceRecord {
        offset_bytes: 4097,
        ..read
    };
    assert_refused(TraceFormat::Spc, unaligned_offset, "offset 4097");
    let odd_size = TraceRecord {
        len_bytes: 100,
        ..read
    };
    assert_eq!(round_trip(&[odd_size], TraceFormat::Spc), [odd_size]);
    // Tencent counts both in sectors.
    assert_refused(TraceFormat::Tencent, unaligned_offset, "offset 4097");
    assert_refused(TraceFormat::Tencent, odd_size, "length 100");
    // Alibaba counts bytes, up to an unsigned 32-bit length.
    assert_eq!(
        round_trip(&[unaligned_offset, odd_size], TraceFormat::Alibaba),
        [unaligned_offset, odd_size]
    );
    let huge = TraceRecord {
        len_bytes: 1 << 32,
        ..read
    };
    assert_refused(TraceFormat::Alibaba, huge, "4294967296");
    let largest = TraceRecord {
        len_bytes: u64::from(u32::MAX),
        ..read
    };
    assert_eq!(round_trip(&[largest], TraceFormat::Alibaba), [largest]);
}

/// A corrupted line of each new fixture is reported with the file name and line number.
#[test]
fn new_fixtures_report_a_corrupt_line_with_file_and_number() {
    for (text, format, name, line, bad) in [
        (
            SPC_FIXTURE,
            TraceFormat::Spc,
            "spc_small.csv",
            5,
            "2,125638,512,q,0.052407",
        ),
        (
            ALIBABA_FIXTURE,
            TraceFormat::Alibaba,
            "alibaba_small.csv",
            8,
            "0,R,0,0,1577808001000626",
        ),
        (
            TENCENT_FIXTURE,
            TraceFormat::Tencent,
            "tencent_small.csv",
            9,
            "1538323260,7,8,0",
        ),
    ] {
        let broken: String = text
            .lines()
            .enumerate()
            .map(|(index, original)| if index + 1 == line { bad } else { original })
            .collect::<Vec<_>>()
            .join("\n");
        let message = read_trace(broken.as_bytes(), format, name)
            .unwrap_err()
            .to_string();
        assert!(
            message.starts_with(&format!("trace {name} line {line}: ")),
            "{message}"
        );
    }
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    /// Builds records every format holds from generated parts, timed in multiples of
    /// `step_ns` from 0 and with volumes numbered in order of first appearance (as iolog
    /// numbers them).
    fn holdable_records(parts: &[(u64, bool, u64, u64, u32)], step_ns: u64) -> Vec<TraceRecord> {
        let mut seen_volumes: Vec<u32> = Vec::new();
        let mut steps = 0;
        parts
            .iter()
            .enumerate()
            .map(
                |(index, &(gap_steps, is_read, offset_sectors, len_sectors, volume))| {
                    if index > 0 {
                        steps += gap_steps;
                    }
                    let volume = match seen_volumes.iter().position(|v| *v == volume) {
                        Some(position) => position,
                        None => {
                            seen_volumes.push(volume);
                            seen_volumes.len() - 1
                        }
                    };
                    TraceRecord {
                        timestamp_ns: steps * step_ns,
                        op: if is_read { IoOp::Read } else { IoOp::Write },
                        offset_bytes: offset_sectors * 512,
                        len_bytes: len_sectors * 512,
                        volume: volume as u32,
                        fua: false,
                    }
                },
            )
            .collect()
    }

    proptest! {
        #[test]
        fn every_format_round_trips_what_it_holds(
            parts in proptest::collection::vec(
                (0u64..5_000, any::<bool>(), 0u64..1 << 40, 1u64..2048, 0u32..6),
                1..40,
            )
        ) {
            for format in TraceFormat::ALL {
                let records = holdable_records(&parts, format.timestamp_step_ns());
                prop_assert_eq!(round_trip(&records, format), records, "{}", format);
            }
        }

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

        /// Lines of the comma-separated formats' alphabet, with numbers near the overflow
        /// limits, reach the field checks rather than stopping at the field count.
        #[test]
        fn readers_never_panic_on_plausible_comma_lines(
            lines in proptest::collection::vec(
                proptest::collection::vec(
                    "([0-9]{0,20}|[0-9]{1,11}\\.[0-9]{0,10}|[rRwW01]| ?[0-9]{1,3} ?|-1)",
                    3..8,
                ),
                0..8,
            )
        ) {
            let text: String = lines.iter().map(|fields| fields.join(",") + "\n").collect();
            for format in TraceFormat::ALL {
                if let Ok(records) = read_trace(text.as_bytes(), format, "plausible") {
                    let mut written = Vec::new();
                    if write_trace(&records, format, &mut written).is_ok() {
                        let again = read_trace(written.as_slice(), format, "again").unwrap();
                        prop_assert_eq!(again.len(), records.len());
                    }
                }
            }
        }
    }
}
