use super::*;

const US: u64 = 1_000;
const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;

fn close(actual: f64, expected: f64, relative: f64) -> bool {
    (actual - expected).abs() <= relative * expected.abs()
}

#[test]
fn percentiles_of_known_inputs() {
    let mut recorder = Recorder::new(0);
    // Latencies 1 µs, 2 µs, …, 1000 µs, submitted at various times.
    for i in 1..=1000_u64 {
        let submit_ns = i * 7 * US;
        recorder.record(OpClass::Read, submit_ns, submit_ns + i * US, 4096);
    }
    let m = recorder.finish(S);
    let lat = &m.read.latency_us;
    // hdrhistogram with 3 significant digits: every percentile within 0.1 %.
    for (actual, expected) in [
        (lat.p50, 500.0),
        (lat.p90, 900.0),
        (lat.p99, 990.0),
        (lat.p999, 999.0),
    ] {
        assert!(close(actual, expected, 1e-3), "{actual} vs {expected}");
    }
    // Mean and max are exact.
    assert_eq!(lat.mean, 500.5);
    assert_eq!(lat.max, 1000.0);
    assert!(lat.p999 <= lat.max);
    assert_eq!(m.read.ios, 1000);
    assert_eq!(m.read.bytes, 4_096_000);
    // Rates are over the op's active span: first submission at 7 µs, last completion at
    // 7000 + 1000 µs, so 7993 µs.
    assert!(
        close(m.read.iops, 1000.0 / 7993e-6, 1e-12),
        "{}",
        m.read.iops
    );
    assert!(close(m.read.bandwidth_mb_s, 4.096 / 7993e-6, 1e-12));
    // Other op classes untouched.
    assert_eq!(m.write, OpReport::default());
    assert_eq!(m.trim.latency_us, LatencySummary::default());
}

#[test]
fn single_sample_and_zero_latency() {
    let mut recorder = Recorder::new(0);
    recorder.record(OpClass::Flush, 5 * US, 5 * US, 0);
    // A completion before submission is clamped to zero latency instead of wrapping.
    recorder.record(OpClass::Flush, 9 * US, 3 * US, 0);
    let lat = recorder.finish(MS).flush.latency_us;
    assert_eq!(lat, LatencySummary::default());

    let mut recorder = Recorder::new(0);
    recorder.record(OpClass::Trim, 0, 123_456, 0);
    let lat = recorder.finish(MS).trim.latency_us;
    assert_eq!(lat.max, 123.456);
    assert_eq!(lat.mean, 123.456);
    assert_eq!(lat.p50, lat.max, "percentiles are clamped to the exact max");
}

#[test]
fn huge_values_do_not_panic() {
    let mut recorder = Recorder::new(1);
    recorder.record(OpClass::Write, 0, u64::MAX, u64::MAX);
    recorder.record(OpClass::Write, 0, u64::MAX, u64::MAX);
    recorder.record(OpClass::Read, 0, 10, 1);
    let m = recorder.finish(u64::MAX);
    assert_eq!(m.write.ios, 2);
    assert_eq!(m.write.bytes, u64::MAX, "byte counts saturate");
    assert!(m.write.latency_us.max > 0.0);
    assert!(m.timeline.len() as u64 <= MAX_TIMELINE_BUCKETS);
    let total_write_mb: f64 = m.timeline.iter().map(|p| p.write_mb_s).sum();
    assert!(total_write_mb > 0.0, "coarsening keeps the bytes");
    // Everything stays finite so the JSON can round-trip.
    assert!(m
        .timeline
        .iter()
        .all(|p| p.read_mb_s.is_finite() && p.write_mb_s.is_finite()));
}

#[test]
fn ramp_time_is_excluded() {
    let mut recorder = Recorder::new(MS);
    recorder.set_measure_from_ns(10 * MS);
    // During the ramp: slow requests that must not pollute the statistics.
    for i in 0..100 {
        recorder.record(OpClass::Write, i * US, 9 * MS, 1_000_000);
    }
    // Submitted during the ramp but completing after it: counted (fio semantics).
    recorder.record(OpClass::Write, 9 * MS, 10 * MS + 20 * US, 1_000_000);
    for i in 0..9 {
        let complete_ns = 11 * MS + i * MS;
        recorder.record(
            OpClass::Write,
            complete_ns - 20 * US,
            complete_ns,
            1_000_000,
        );
    }
    let m = recorder.finish(20 * MS);
    assert_eq!(m.write.ios, 10);
    assert_eq!(m.write.bytes, 10_000_000);
    // 10 IOs over the 9 ms from the window's start (10 ms) to the last completion (19 ms).
    assert!(close(m.write.iops, 10.0 / 9e-3, 1e-12), "{}", m.write.iops);
    assert!(close(m.write.bandwidth_mb_s, 10.0 / 9e-3, 1e-12));
    assert_eq!(m.write.latency_us.max, 1000.0 + 20.0);
    assert!(close(m.write.latency_us.p50, 20.0, 1e-3));
    // The timeline covers only the window: buckets starting at 10, 11, …, 19 ms.
    assert_eq!(m.timeline.len(), 10);
    assert_eq!(m.timeline[0].t_ms, 10.0);
    assert_eq!(m.timeline[9].t_ms, 19.0);
    assert!(m
        .timeline
        .iter()
        .all(|p| p.write_mb_s == 1000.0 && p.read_mb_s == 0.0));
}

#[test]
fn empty_window_reports_zero_rates() {
    let mut recorder = Recorder::new(MS);
    recorder.set_measure_from_ns(5 * MS);
    // Completes before the window opens, so nothing is measured.
    recorder.record(OpClass::Read, 4 * MS, 5 * MS - 1, 512);
    let m = recorder.finish(5 * MS);
    assert_eq!(m.read.ios, 0);
    assert_eq!(m.read.iops, 0.0);
    assert_eq!(m.read.bandwidth_mb_s, 0.0);
    assert!(m.timeline.is_empty());
}

#[test]
fn timeline_bucketing() {
    let mut recorder = Recorder::new(10 * MS);
    // Bucket 0 [0, 10 ms): 2 MB read. Bucket 1: nothing. Bucket 2 [20, 30 ms): 1 MB read, 3 MB
    // written, plus a trim and a flush that carry no data. Completions on bucket boundaries go to
    // the bucket they start.
    recorder.record(OpClass::Read, 0, 1, 1_000_000);
    recorder.record(OpClass::Read, 0, 10 * MS - 1, 1_000_000);
    recorder.record(OpClass::Read, 0, 20 * MS, 1_000_000);
    recorder.record(OpClass::Write, 0, 25 * MS, 3_000_000);
    recorder.record(OpClass::Trim, 0, 26 * MS, 8_000_000);
    recorder.record(OpClass::Flush, 0, 27 * MS, 0);
    let m = recorder.finish(30 * MS);
    let points: Vec<(f64, f64, f64)> = m
        .timeline
        .iter()
        .map(|p| (p.t_ms, p.read_mb_s, p.write_mb_s))
        .collect();
    assert_eq!(
        points,
        vec![(0.0, 200.0, 0.0), (10.0, 0.0, 0.0), (20.0, 100.0, 300.0)]
    );
    // Trim bytes count in the trim report but not in the data timeline.
    assert_eq!(m.trim.bytes, 8_000_000);

    // A window ending mid-bucket divides by the covered part only: 3 MB in 5 ms = 600 MB/s.
    let mut recorder = Recorder::new(10 * MS);
    recorder.record(OpClass::Write, 0, 2 * MS, 3_000_000);
    let m = recorder.finish(5 * MS);
    assert_eq!(m.timeline.len(), 1);
    assert!(close(m.timeline[0].write_mb_s, 600.0, 1e-12));

    // Interval 0 disables the timeline.
    let mut recorder = Recorder::new(0);
    recorder.record(OpClass::Write, 0, 2 * MS, 3_000_000);
    assert!(recorder.finish(5 * MS).timeline.is_empty());
}

#[test]
fn timeline_coarsens_instead_of_exhausting_memory() {
    let mut recorder = Recorder::new(1);
    recorder.record(OpClass::Read, 0, 0, 1_000);
    recorder.record(OpClass::Read, 0, 3 * MAX_TIMELINE_BUCKETS, 1_000);
    assert!(recorder.timeline_bytes.len() as u64 <= MAX_TIMELINE_BUCKETS);
    assert_eq!(recorder.timeline_interval_ns, 4);
    let total: u64 = recorder.timeline_bytes.iter().map(|b| b[0]).sum();
    assert_eq!(total, 2_000);
}

pub(crate) fn sample_report() -> RunReport {
    let mut recorder = Recorder::new(MS);
    for i in 0..100_u64 {
        recorder.record(OpClass::Read, i * 10 * US, i * 10 * US + 87 * US, 4096);
        recorder.record(
            OpClass::Write,
            i * 10 * US,
            i * 10 * US + 1234 * US,
            131_072,
        );
    }
    recorder.record(OpClass::Trim, 0, 3 * US, 1 << 20);
    let m = recorder.finish(2 * MS);
    RunReport {
        seed: 424_242,
        sim_time_ns: 2 * MS,
        host_time_s: 0.125,
        config: serde_json::json!({ "ssd": { "dies": 4, "cell": "tlc" }, "workload": "randrw" }),
        read: m.read,
        write: m.write,
        trim: m.trim,
        flush: m.flush,
        waf: 2.75,
        host_page_writes: 3200,
        nand: NandReport {
            page_reads: 4101,
            page_programs: 8800,
            block_erases: 37,
            slc_reads: 1001,
            slc_programs: 5200,
            slc_erases: 21,
            mlc_reads: 3100,
            mlc_programs: 3600,
            mlc_erases: 16,
            read_suspends: 0,
        },
        gc: GcReport {
            runs: 91,
            foreground_runs: 17,
            background_runs: 74,
            pages_moved: 5600,
            slc_evictions: 13,
            idle_erases: 7,
            pages_moved_across_planes: 2,
        },
        wear: WearReport {
            erase_count_min: 2,
            erase_count_max: 9,
            erase_count_mean: 4.5,
            static_wl_moves: 6,
            life_used_fraction: 0.003,
            bad_blocks: 3,
            program_failures: 2,
            erase_failures: 1,
        },
        integrity: IntegrityReport {
            reads_checked: 777,
            mismatches: 0,
        },
        die_busy_fraction: vec![0.25, 0.5, 0.75, 0.625],
        timeline: m.timeline,
        array: None,
        members: Vec::new(),
        cpu: None,
        device: serde_json::Map::new(),
        steady_state: Vec::new(),
        latency_target: Vec::new(),
    }
}

#[test]
fn json_round_trip_with_contract_keys() {
    let report = sample_report();
    let json = report.to_json_pretty();
    let back: RunReport = serde_json::from_str(&json).expect("report JSON parses back");
    assert_eq!(back, report);

    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    let keys = |v: &serde_json::Value| -> Vec<String> {
        let mut keys: Vec<String> = v.as_object().expect("object").keys().cloned().collect();
        keys.sort();
        keys
    };
    let sorted = |list: &[&str]| -> Vec<String> {
        let mut list: Vec<String> = list.iter().map(|s| (*s).to_owned()).collect();
        list.sort();
        list
    };
    assert_eq!(
        keys(&value),
        sorted(&[
            "seed",
            "sim_time_ns",
            "host_time_s",
            "config",
            "read",
            "write",
            "trim",
            "flush",
            "waf",
            "host_page_writes",
            "nand",
            "gc",
            "wear",
            "integrity",
            "die_busy_fraction",
            "timeline",
        ])
    );
    for op in ["read", "write", "trim", "flush"] {
        // The CDF is left out when no request completed (flush here).
        let mut expected = vec!["ios", "bytes", "iops", "bandwidth_mb_s", "latency_us"];
        if value[op]["ios"] != 0 {
            expected.push("latency_cdf");
        }
        assert_eq!(keys(&value[op]), sorted(&expected));
        assert_eq!(
            keys(&value[op]["latency_us"]),
            sorted(&["mean", "p50", "p90", "p99", "p999", "max"])
        );
    }
    assert_eq!(
        keys(&value["nand"]),
        sorted(&[
            "page_reads",
            "page_programs",
            "block_erases",
            "slc_reads",
            "slc_programs",
            "slc_erases",
            "mlc_reads",
            "mlc_programs",
            "mlc_erases",
            "read_suspends",
        ])
    );
    assert_eq!(
        keys(&value["gc"]),
        sorted(&[
            "runs",
            "foreground_runs",
            "background_runs",
            "pages_moved",
            "slc_evictions",
            "idle_erases",
            "pages_moved_across_planes",
        ])
    );
    assert_eq!(
        keys(&value["wear"]),
        sorted(&[
            "erase_count_min",
            "erase_count_max",
            "erase_count_mean",
            "static_wl_moves",
            "life_used_fraction",
            "bad_blocks",
            "program_failures",
            "erase_failures",
        ])
    );
    assert_eq!(
        keys(&value["integrity"]),
        sorted(&["reads_checked", "mismatches"])
    );
    let timeline = value["timeline"].as_array().expect("timeline is an array");
    assert_eq!(timeline.len(), 2);
    assert_eq!(
        keys(&timeline[0]),
        sorted(&["t_ms", "read_mb_s", "write_mb_s"])
    );
    assert_eq!(value["config"]["ssd"]["cell"], "tlc");
    assert_eq!(value["die_busy_fraction"][3], 0.625);
    assert_eq!(value["write"]["ios"], 100);
}

#[test]
fn human_summary_contains_the_numbers() {
    let report = sample_report();
    let text = report.human_summary();
    for needle in [
        "424242", // seed
        "0.002000 s",
        "0.125 s",
        "1608",
        // read row: 100 IOs of 4096 bytes over 2 ms, latency 87 µs
        "409600",
        // 100 reads between the first submission (0) and the last completion (1077 µs).
        "92850.5",
        "380.32",
        "87.00",
        // write row: 1234 µs latency, 13107200 bytes over 0..2224 µs
        "13107200",
        "5893.53",
        "1234.00",
        // trim row: 1 MiB
        "1048576",
        "2.750",
        "8800",
        "3200",
        "5200",
        "3600",
        "1001",
        "3100",
        "SLC",
        "MLC/TLC",
        "91 runs",
        "17 foreground",
        "74 background",
        "5600 pages moved",
        "13 SLC evictions",
        "min 2",
        "mean 4.50",
        "max 9",
        "6 static",
        "0.30% of rated life",
        "3 blocks bad (from the factory or retired), 2 failed programs, 1 failed erases",
        "777 sectors read and checked",
        "0 mismatches",
        "min 0.250",
        "mean 0.531",
        "max 0.750",
        "4 dies",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    assert!(!text.contains('\u{1b}'), "no escape codes");
}

#[test]
fn human_summary_columns_are_aligned() {
    let text = sample_report().human_summary();
    let op_lines: Vec<&str> = text
        .lines()
        .skip_while(|line| !line.starts_with("op "))
        .take(5)
        .collect();
    assert_eq!(op_lines.len(), 5, "{text}");
    let width = op_lines[0].chars().count();
    // Right-aligned numeric columns make every row end at the same column.
    assert!(
        op_lines.iter().all(|line| line.chars().count() == width),
        "{text}"
    );
}

/// Flash without faults gets no faults row.
#[test]
fn human_summary_without_faults_has_no_faults_row() {
    let mut report = sample_report();
    report.wear.bad_blocks = 0;
    report.wear.program_failures = 0;
    report.wear.erase_failures = 0;
    assert!(!report.human_summary().contains("Faults"));
}

#[test]
fn human_summary_without_dies() {
    let mut report = sample_report();
    report.die_busy_fraction.clear();
    assert!(report.human_summary().contains("no dies reported"));
}

#[test]
fn progress_is_quiet_for_short_runs() {
    let mut progress = Progress::new(100_000, "requests");
    for done in 0..100_000 {
        progress.update(done);
    }
    // Well under a second has passed, so no bar was created.
    assert!(progress.bar.is_none());
    progress.finish();
    progress.finish();
}

#[test]
fn progress_creates_bar_after_a_second() {
    let mut progress = Progress::new(10, "pages");
    // Pretend the run started long ago instead of sleeping in the test.
    progress.started = Instant::now()
        .checked_sub(Duration::from_secs(2))
        .unwrap_or_else(Instant::now);
    for done in 0..UPDATE_CHECK_INTERVAL {
        progress.update(done);
    }
    if Instant::now().duration_since(progress.started) >= SHOW_AFTER {
        let bar = progress.bar.as_ref().expect("bar shown after a second");
        assert_eq!(bar.position(), UPDATE_CHECK_INTERVAL - 1);
    }
    progress.finish();
    assert!(progress.bar.is_none());
}

#[test]
fn latency_cdf_counts_are_exact_and_groups_span_one_percent() {
    let mut recorder = Recorder::new(0);
    // Latencies 1 µs … 1000 µs, and a far outlier at 5 ms.
    let mut latencies_ns: Vec<u64> = (1..=1000_u64).map(|i| i * US).collect();
    latencies_ns.push(5 * MS);
    for (i, latency_ns) in latencies_ns.iter().enumerate() {
        let submit_ns = i as u64 * 3 * US;
        recorder.record(OpClass::Write, submit_ns, submit_ns + latency_ns, 4096);
    }
    let m = recorder.finish(S);
    let cdf = &m.write.latency_cdf;
    assert_eq!(
        cdf.last(),
        Some(&CdfPoint(5 * MS, 1001)),
        "ends at the exact max"
    );
    // Far fewer points than samples: where samples are dense, 1 % of latency is one point.
    assert!(cdf.len() < 600 && cdf.len() > 100, "{} points", cdf.len());
    for pair in cdf.windows(2) {
        assert!(pair[1].latency_ns() > pair[0].latency_ns());
        assert!(pair[1].requests_at_or_below() > pair[0].requests_at_or_below());
    }
    // The counts are exact: every sample at or below a point's latency, and no other.
    for point in cdf {
        let exact = latencies_ns
            .iter()
            .filter(|l| **l <= point.latency_ns())
            .count() as u64;
        assert_eq!(point.requests_at_or_below(), exact, "{point:?}");
    }
    assert!(m.read.latency_cdf.is_empty(), "no reads, no CDF");
}

#[test]
fn reports_written_before_the_cdf_still_load() {
    let report = sample_report();
    let mut value = serde_json::to_value(&report).unwrap();
    for op in ["read", "write", "trim", "flush"] {
        value[op].as_object_mut().unwrap().remove("latency_cdf");
    }
    let back: RunReport = serde_json::from_value(value).expect("old report loads");
    assert!(back.write.latency_cdf.is_empty());
    assert_eq!(back.write.latency_us, report.write.latency_us);
}

#[test]
fn pooled_recorders_report_as_one_that_recorded_every_request() {
    // Two devices' latencies, pooled, against one recorder that saw them all.
    let (mut a, mut b, mut all) = (Recorder::new(0), Recorder::new(0), Recorder::new(0));
    for i in 1..=500_u64 {
        a.record(OpClass::Read, i * US, i * US + i * US, 4096);
        all.record(OpClass::Read, i * US, i * US + i * US, 4096);
        b.record(OpClass::Write, i * MS, i * MS + 3 * i * US, 8192);
        all.record(OpClass::Write, i * MS, i * MS + 3 * i * US, 8192);
    }
    b.record(OpClass::Read, 2 * S, 2 * S + 7 * MS, 4096);
    all.record(OpClass::Read, 2 * S, 2 * S + 7 * MS, 4096);
    let mut pooled = Recorder::new(0);
    pooled.add_ops_of(&a);
    pooled.add_ops_of(&b);
    assert_eq!(pooled.finish(3 * S), all.finish(3 * S));
}
