//! Parses the synthetic fixtures under `tests/fixtures/`, which follow the real MSR
//! Cambridge and blkparse formats, round-trips them through `write_trace`, and checks that a
//! corrupted line is reported with its line number.

use std::path::PathBuf;

use afa_workload::trace::{read_trace, write_trace, TraceFormat, TraceRecord};
use afa_workload::{IoOp, WorkloadError};

fn fixture(name: &str) -> (String, String) {
    let path: PathBuf = [env!("CARGO_MANIFEST_DIR"), "tests", "fixtures", name]
        .iter()
        .collect();
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("reading {}: {error}", path.display()));
    (text, path.display().to_string())
}

fn round_trip(records: &[TraceRecord], format: TraceFormat) -> Vec<TraceRecord> {
    let mut written = Vec::new();
    write_trace(records, format, &mut written).unwrap();
    read_trace(written.as_slice(), format, "round trip").unwrap()
}

/// Replaces line `line_number` (1-based) of `text` with `replacement`.
fn corrupt(text: &str, line_number: usize, replacement: &str) -> String {
    text.lines()
        .enumerate()
        .map(|(index, line)| {
            if index + 1 == line_number {
                replacement
            } else {
                line
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn msr_fixture_parses() {
    let (text, source) = fixture("msr_small.csv");
    let records = read_trace(text.as_bytes(), TraceFormat::MsrCsv, &source).unwrap();
    assert_eq!(records.len(), 20);
    assert_eq!(
        records[0],
        TraceRecord {
            timestamp_ns: 0,
            op: IoOp::Read,
            offset_bytes: 7014609920,
            len_bytes: 24576,
            volume: 0,
            fua: false,
        }
    );
    // 128166372016382155 - 128166372003061629 ticks of 100 ns.
    assert_eq!(records[1].timestamp_ns, 13_320_526 * 100);
    assert_eq!(records[1].op, IoOp::Write);
    assert_eq!(records[8].op, IoOp::Write, "lower-case type");
    assert_eq!(records[9].op, IoOp::Read, "upper-case type");
    assert!(records
        .windows(2)
        .all(|pair| pair[0].timestamp_ns <= pair[1].timestamp_ns));
    let reads = records.iter().filter(|r| r.op == IoOp::Read).count();
    assert_eq!(reads, 8);
}

#[test]
fn msr_fixture_round_trips() {
    let (text, source) = fixture("msr_small.csv");
    let records = read_trace(text.as_bytes(), TraceFormat::MsrCsv, &source).unwrap();
    assert_eq!(round_trip(&records, TraceFormat::MsrCsv), records);
}

#[test]
fn msr_corrupted_line_is_reported_with_its_number() {
    let (text, source) = fixture("msr_small.csv");
    let broken = corrupt(
        &text,
        13,
        "128166372066401558,hm,0,Read,512,five-twelve,220",
    );
    match read_trace(broken.as_bytes(), TraceFormat::MsrCsv, &source) {
        Err(error @ WorkloadError::TraceLine { line: 13, .. }) => {
            let message = error.to_string();
            assert!(message.contains("msr_small.csv line 13"), "{message}");
            assert!(message.contains("five-twelve"), "{message}");
        }
        other => panic!("expected an error on line 13, got {other:?}"),
    }
}

#[test]
fn blkparse_fixture_parses_queue_events_and_skips_the_summary() {
    let (text, source) = fixture("blkparse_small.txt");
    let records = read_trace(text.as_bytes(), TraceFormat::Blkparse, &source).unwrap();
    let summary: Vec<(IoOp, u64, u64)> = records
        .iter()
        .map(|r| (r.op, r.offset_bytes / 512, r.len_bytes / 512))
        .collect();
    assert_eq!(
        summary,
        vec![
            (IoOp::Write, 223490, 8),
            (IoOp::Write, 223498, 8),
            (IoOp::Read, 10240, 64),
            (IoOp::Write, 4096, 256),
            (IoOp::Read, 8192, 32),
            (IoOp::Flush, 0, 0),
            // jbd2's commit block, `FWS`: its preflush, then the write.
            (IoOp::Flush, 0, 0),
            (IoOp::Write, 500000, 8),
            (IoOp::Trim, 1048576, 2048),
            (IoOp::Read, 123456, 1),
        ]
    );
    assert_eq!(records[0].timestamp_ns, 0);
    assert_eq!(records[2].timestamp_ns, 512_004);
    assert_eq!(records[6].timestamp_ns, records[7].timestamp_ns);
    assert_eq!(records[9].timestamp_ns, 5_123_456);
}

#[test]
fn blkparse_fixture_other_actions() {
    let (text, source) = fixture("blkparse_small.txt");
    let completed = afa_workload::trace::read_blkparse(text.as_bytes(), &source, 'C').unwrap();
    assert_eq!(completed.len(), 2);
    assert_eq!(completed[0].len_bytes, 16 * 512);
}

#[test]
fn blkparse_fixture_round_trips() {
    let (text, source) = fixture("blkparse_small.txt");
    let records = read_trace(text.as_bytes(), TraceFormat::Blkparse, &source).unwrap();
    assert_eq!(round_trip(&records, TraceFormat::Blkparse), records);
}

#[test]
fn blkparse_corrupted_line_is_reported_with_its_number() {
    let (text, source) = fixture("blkparse_small.txt");
    let broken = corrupt(
        &text,
        10,
        "  8,0    1        1     0.000512004  1204  Q   R 10240 - 64 [fio]",
    );
    match read_trace(broken.as_bytes(), TraceFormat::Blkparse, &source) {
        Err(error @ WorkloadError::TraceLine { line: 10, .. }) => {
            assert!(
                error.to_string().contains("blkparse_small.txt line 10"),
                "{error}"
            );
        }
        other => panic!("expected an error on line 10, got {other:?}"),
    }
    // A stray line before the summary is not mistaken for summary text.
    let broken = corrupt(&text, 5, "this is not blkparse output");
    assert!(matches!(
        read_trace(broken.as_bytes(), TraceFormat::Blkparse, &source),
        Err(WorkloadError::TraceLine { line: 5, .. })
    ));
}

#[test]
fn synthetic_traces_round_trip_in_both_formats() {
    let records: Vec<TraceRecord> = (0..50u64)
        .map(|index| TraceRecord {
            timestamp_ns: index * 1_700,
            op: if index % 3 == 0 {
                IoOp::Read
            } else {
                IoOp::Write
            },
            offset_bytes: (index * 7919 % 1000) * 4096,
            len_bytes: (1 + index % 8) * 512,
            volume: 0,
            fua: false,
        })
        .collect();
    assert_eq!(round_trip(&records, TraceFormat::MsrCsv), records);
    assert_eq!(round_trip(&records, TraceFormat::Blkparse), records);
}

/// Reads `name` in `format`, checks it round-trips through `write_trace`, and that replacing
/// line `bad_line` with `bad_text` is reported with the file name and that line number.
fn check_fixture(
    name: &str,
    format: TraceFormat,
    bad_line: usize,
    bad_text: &str,
) -> Vec<TraceRecord> {
    let (text, source) = fixture(name);
    let records = read_trace(text.as_bytes(), format, &source).unwrap();
    assert_eq!(round_trip(&records, format), records, "{name} round trip");
    let broken = corrupt(&text, bad_line, bad_text);
    match read_trace(broken.as_bytes(), format, &source) {
        Err(error @ WorkloadError::TraceLine { line, .. }) if line == bad_line => {
            let message = error.to_string();
            assert!(
                message.contains(&format!("{name} line {bad_line}")),
                "{message}"
            );
        }
        other => panic!("{name}: expected an error on line {bad_line}, got {other:?}"),
    }
    records
}

#[test]
fn fiu_fixture_parses_round_trips_and_reports_bad_lines() {
    let records = check_fixture(
        "fiu_small.txt",
        TraceFormat::Fiu,
        9,
        "89966540123456 4367 nfsd 110246376 128 X 6 0 a87ff679a2f3e71d9181a67b7542122c",
    );
    assert_eq!(records.len(), 12, "the blank line is skipped");
    assert_eq!(
        records[0],
        TraceRecord {
            timestamp_ns: 0,
            op: IoOp::Write,
            offset_bytes: 110246360 * 512,
            len_bytes: 8 * 512,
            volume: 6 << 20,
            fua: false,
        }
    );
    assert_eq!(records[2].op, IoOp::Read);
    assert_eq!(records[2].timestamp_ns, 89966528011272 - 89966527861862);
    assert_eq!(records[4].volume, (6 << 20) | 1);
    assert_eq!(records[10].op, IoOp::Read, "lower-case r");
    let written: u64 = records
        .iter()
        .filter(|r| r.op == IoOp::Write)
        .map(|r| r.len_bytes)
        .sum();
    assert_eq!(written, (8 + 8 + 8 + 8 + 128 + 8 + 8) * 512);
    for bad in [
        "1 2 nfsd 3 8 W 6 0",
        "1 2 nfsd 3 0 W 6 0 00",
        "1 2 nfsd 3 8 W 6 0 not-hex",
        "x 2 nfsd 3 8 W 6 0 00",
        "1 2 nfsd 3 8 W 6 4294967295 00",
    ] {
        let result = read_trace(bad.as_bytes(), TraceFormat::Fiu, "t");
        assert!(
            matches!(result, Err(WorkloadError::TraceLine { line: 1, .. })),
            "{bad}: {result:?}"
        );
    }
}

#[test]
fn iolog_v2_fixture_uses_waits_as_time_and_files_as_volumes() {
    let records = check_fixture(
        "iolog_v2.log",
        TraceFormat::Iolog,
        7,
        "/dev/nvme0n1 read zero 8192",
    );
    let summary: Vec<(u64, IoOp, u64, u64, u32)> = records
        .iter()
        .map(|r| (r.timestamp_ns, r.op, r.offset_bytes, r.len_bytes, r.volume))
        .collect();
    assert_eq!(
        summary,
        vec![
            (0, IoOp::Write, 0, 4096, 0),
            (0, IoOp::Write, 4096, 4096, 0),
            (1_000_000, IoOp::Read, 0, 8192, 0),
            (1_000_000, IoOp::Write, 1048576, 65536, 1),
            (1_250_000, IoOp::Trim, 8192, 8192, 0),
            (1_250_000, IoOp::Flush, 0, 0, 0),
            (1_250_000, IoOp::Flush, 0, 0, 1),
            (1_250_000, IoOp::Read, 12288, 512, 0),
        ]
    );
}

#[test]
fn iolog_v3_fixture_reads_microsecond_timestamps() {
    let records = check_fixture(
        "iolog_v3.log",
        TraceFormat::Iolog,
        5,
        "891 Nvme1n1 fetch 0 4096",
    );
    assert_eq!(records.len(), 8);
    assert_eq!(records[0].timestamp_ns, 0);
    assert_eq!(records[1].timestamp_ns, 10_000);
    assert_eq!(records[7].timestamp_ns, (4096 - 878) * 1000);
    assert_eq!(records[7].offset_bytes, 1 << 30);
    let error = read_trace("write 0 4096\n".as_bytes(), TraceFormat::Iolog, "t").unwrap_err();
    assert!(error.to_string().contains("header"), "{error}");
}

#[test]
fn ascii_fixture_parses_round_trips_and_reports_bad_lines() {
    let records = check_fixture(
        "ascii_small.trace",
        TraceFormat::Ascii,
        4,
        "4200 1 77824 64 2",
    );
    assert_eq!(records.len(), 10);
    assert_eq!(
        records[2],
        TraceRecord {
            timestamp_ns: 4200,
            op: IoOp::Read,
            offset_bytes: 2048 * 512,
            len_bytes: 16 * 512,
            volume: 0,
            fua: false,
        }
    );
    assert_eq!(records[3].volume, 1);
    assert_eq!(records[8].len_bytes, 512);
    for bad in ["1 0 0 8", "1 0 0 0 1", "1 -1 0 8 1", "1 0 0 8 1 extra"] {
        let text = format!("0 0 0 8 0\n{bad}\n");
        let result = read_trace(text.as_bytes(), TraceFormat::Ascii, "t");
        assert!(
            matches!(result, Err(WorkloadError::TraceLine { line: 2, .. })),
            "{bad}: {result:?}"
        );
    }
}

#[test]
fn every_format_round_trips_what_it_can_hold() {
    // Reads and writes of whole sectors on volume 0 fit every format, every 13 µs (a whole
    // number of every format's timestamp steps but Tencent's) or 13 s in Tencent's, whose
    // timestamps are whole seconds.
    let records = |step_ns: u64| -> Vec<TraceRecord> {
        (0..200u64)
            .map(|index| TraceRecord {
                timestamp_ns: index * 13 * step_ns.max(1_000),
                op: if index % 3 == 0 {
                    IoOp::Read
                } else {
                    IoOp::Write
                },
                offset_bytes: (index * 7919 % 1000) * 4096,
                len_bytes: (1 + index % 8) * 512,
                volume: 0,
                fua: false,
            })
            .collect()
    };
    for format in TraceFormat::ALL {
        let records = records(format.timestamp_step_ns());
        assert_eq!(round_trip(&records, format), records, "{format}");
        assert_eq!(format.name().parse::<TraceFormat>().unwrap(), format);
    }
}
