//! The run report in the structure fio 3.x writes with `--output-format=json+`, so that tools
//! written for fio (plotting scripts, result parsers, `fio_jsonplus_clat2csv`) read afa's
//! results unchanged.
//!
//! afa's run report aggregates every host request of the run, so the output has one job, as
//! fio's `group_reporting` would. Each direction (`read`, `write`, `trim`) carries what fio
//! writes: `io_bytes`, `io_kbytes`, `bw_bytes`, `bw` (KiB/s), `iops`, `runtime` (ms),
//! `total_ios`, the `slat_ns` / `clat_ns` / `lat_ns` statistics with fio's default
//! `percentile` list and json+'s `bins`, and bandwidth and IOPS samples. The mapping, and
//! which fields are derived or zero because the simulator has no such notion, is documented in
//! `docs/plots.md`:
//!
//! - afa measures one latency, submit to complete, which is fio's `lat`; `clat` equals it and
//!   `slat` is empty (N = 0), as fio writes for an engine without a submission phase.
//! - The percentiles, `min`, `stddev` and the bins come from the report's latency CDF, whose
//!   latency axis is quantised to 1 % (so a percentile may exceed the report's own, exact to
//!   0.1 %, by up to 1 %); `mean`, `max` and `N` are exact.
//! - Time stamps are zero: a simulation runs in virtual time and its output must not depend on
//!   the wall clock (two runs with one seed write identical files).

use serde_json::{json, Map, Value};

use crate::{OpReport, RunReport, SteadyStateReport, TimelinePoint};

/// The fio release whose json+ structure this module writes.
pub const FIO_VERSION: &str = "fio-3.33";

/// fio's default `percentile_list`.
const FIO_PERCENTILES: [f64; 17] = [
    1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95,
    99.99,
];

const NS_PER_US: f64 = 1e3;
const BYTES_PER_KIB: u64 = 1024;

/// The whole fio json+ document for `report`, with one job named `job_name`.
pub fn to_fio_json(report: &RunReport, job_name: &str) -> Value {
    let mut job = Map::new();
    job.insert("jobname".into(), json!(job_name));
    job.insert("groupid".into(), json!(0));
    // fio reports an errno; a read that returned the wrong data is an I/O error (EIO).
    let error = if report.integrity.mismatches > 0 {
        5
    } else {
        0
    };
    job.insert("error".into(), json!(error));
    job.insert("eta".into(), json!(0));
    let sim_ms = report.sim_time_ns as f64 / 1e6;
    job.insert("elapsed".into(), json!((sim_ms / 1e3).ceil() as u64));
    job.insert(
        "job options".into(),
        Value::Object(job_options(report, job_name)),
    );
    for (name, op) in [
        ("read", &report.read),
        ("write", &report.write),
        ("trim", &report.trim),
    ] {
        let samples = bandwidth_samples_kib_s(&report.timeline, name);
        job.insert(name.into(), direction(op, &samples));
    }
    job.insert(
        "sync".into(),
        json!({
            "total_ios": report.flush.ios,
            "lat_ns": latency_stats(&report.flush),
        }),
    );
    job.insert("job_runtime".into(), json!(sim_ms.round() as u64));
    // CPU use, context switches, page faults and queue-depth distributions are not modelled
    // in fio's terms; fio's keys are present (parsers index them) and zero.
    job.insert("usr_cpu".into(), json!(0.0));
    job.insert("sys_cpu".into(), json!(0.0));
    job.insert("ctx".into(), json!(0));
    job.insert("majf".into(), json!(0));
    job.insert("minf".into(), json!(0));
    job.insert(
        "iodepth_level".into(),
        zero_buckets(&["1", "2", "4", "8", "16", "32", ">=64"]),
    );
    for key in ["iodepth_submit", "iodepth_complete"] {
        job.insert(
            key.into(),
            zero_buckets(&["0", "4", "8", "16", "32", "64", ">=64"]),
        );
    }
    let [latency_ns, latency_us, latency_ms] = latency_distribution(report);
    job.insert("latency_ns".into(), latency_ns);
    job.insert("latency_us".into(), latency_us);
    job.insert("latency_ms".into(), latency_ms);
    // fio's latency-target search: the depth it settled on, its target in nanoseconds and
    // its window in microseconds, as fio keeps them; for the first job that searched.
    let search = report.latency_target.first();
    job.insert("latency_depth".into(), json!(search.map_or(1, |s| s.depth)));
    job.insert(
        "latency_target".into(),
        json!(search.map_or(0, |s| (s.target_us * 1e3).round() as u64)),
    );
    job.insert(
        "latency_percentile".into(),
        json!(search.map_or(100.0, |s| s.percentile)),
    );
    job.insert(
        "latency_window".into(),
        json!(search.map_or(0, |s| (s.window_s * 1e6).round() as u64)),
    );
    // fio writes one `steadystate` object per job it reports; afa reports the run as one
    // job, so it writes the first job's (or group's) detection.
    if let Some(ss) = report.steady_state.first() {
        job.insert("steadystate".into(), steady_state(ss));
    }

    json!({
        "fio version": FIO_VERSION,
        "timestamp": 0,
        "timestamp_ms": 0,
        "time": "Thu Jan  1 00:00:00 1970",
        "jobs": [Value::Object(job)],
        // Not part of fio's output; fio parsers ignore unknown top-level keys. It says where
        // the numbers came from.
        "afa": {
            "seed": report.seed,
            "sim_time_ns": report.sim_time_ns,
            "waf": report.waf,
            "integrity_mismatches": report.integrity.mismatches,
        },
    })
}

/// fio's `steadystate` object (`show_thread_status_json`). The criterion is a string with
/// fio's `%f` precision; `duration` is in whole seconds when it is whole, as fio counts it,
/// and in seconds otherwise (fio's window is a whole number of seconds); the samples are
/// oldest first.
fn steady_state(ss: &SteadyStateReport) -> Value {
    let duration = if ss.duration_s.fract() == 0.0 {
        json!(ss.duration_s as u64)
    } else {
        json!(ss.duration_s)
    };
    let criterion = format!(
        "{:.6}{}",
        ss.criterion.unwrap_or(0.0),
        if ss.criterion_is_percent { "%" } else { "" }
    );
    json!({
        "ss": ss.ss,
        "duration": duration,
        "attained": u8::from(ss.attained),
        "criterion": criterion,
        "max_deviation": ss.max_deviation,
        "slope": ss.slope,
        "data": {
            "bw_mean": ss.bw_mean_bytes_s(),
            "iops_mean": ss.iops_mean(),
            "iops": ss.iops,
            "bw": ss.bw_bytes_s,
        },
    })
}

fn zero_buckets(keys: &[&str]) -> Value {
    Value::Object(keys.iter().map(|k| ((*k).to_owned(), json!(0.0))).collect())
}

/// fio's `job options` are the job file's options as strings. The run's configuration holds
/// its inline job file under `workload.job`; its `[global]` section and first job section
/// are folded into one map (the first job's options win), the way fio echoes a job's options.
fn job_options(report: &RunReport, job_name: &str) -> Map<String, Value> {
    let mut options = Map::new();
    options.insert("name".into(), json!(job_name));
    options.insert("ioengine".into(), json!("afa"));
    let Some(text) = report.config["workload"]["job"].as_str() else {
        return options;
    };
    let mut section = String::new();
    let mut jobs_seen = 0;
    for raw in text.lines() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.trim().to_owned();
            if section != "global" {
                jobs_seen += 1;
            }
            continue;
        }
        if section != "global" && jobs_seen > 1 {
            break;
        }
        let (key, value) = match line.split_once('=') {
            Some((k, v)) => (k.trim(), v.trim()),
            None => (line, ""),
        };
        if key != "name" {
            options.insert(key.to_owned(), json!(value));
        }
    }
    options
}

/// One direction's section: totals, latency statistics and per-sample bandwidth and IOPS.
fn direction(op: &OpReport, samples_kib_s: &[f64]) -> Value {
    let bw_bytes = (op.bandwidth_mb_s * 1e6).round() as u64;
    let runtime_ms = if bw_bytes > 0 {
        (op.bytes as f64 / bw_bytes as f64 * 1e3).round() as u64
    } else if op.iops > 0.0 {
        (op.ios as f64 / op.iops * 1e3).round() as u64
    } else {
        0
    };
    // IOPS per sample from the bandwidth at the op's mean request size; the timeline counts
    // bytes, not requests.
    let kib_per_io = if op.ios > 0 {
        op.bytes as f64 / op.ios as f64 / BYTES_PER_KIB as f64
    } else {
        0.0
    };
    let iops_samples: Vec<f64> = if kib_per_io > 0.0 {
        samples_kib_s.iter().map(|s| s / kib_per_io).collect()
    } else {
        Vec::new()
    };
    let (bw_min, bw_max, bw_mean, bw_dev) = sample_stats(samples_kib_s);
    let (iops_min, iops_max, iops_mean, iops_dev) = sample_stats(&iops_samples);
    let latency = latency_stats(op);
    json!({
        "io_bytes": op.bytes,
        "io_kbytes": op.bytes / BYTES_PER_KIB,
        "bw_bytes": bw_bytes,
        "bw": bw_bytes / BYTES_PER_KIB,
        "iops": op.iops,
        "runtime": runtime_ms,
        "total_ios": op.ios,
        "short_ios": 0,
        "drop_ios": 0,
        "slat_ns": { "min": 0, "max": 0, "mean": 0.0, "stddev": 0.0, "N": 0 },
        "clat_ns": latency.clone(),
        "lat_ns": latency,
        "bw_min": bw_min.round() as u64,
        "bw_max": bw_max.round() as u64,
        "bw_agg": if op.ios > 0 { 100.0 } else { 0.0 },
        "bw_mean": bw_mean,
        "bw_dev": bw_dev,
        "bw_samples": samples_kib_s.len(),
        "iops_min": iops_min.round() as u64,
        "iops_max": iops_max.round() as u64,
        "iops_mean": iops_mean,
        "iops_stddev": iops_dev,
        "iops_samples": iops_samples.len(),
    })
}

/// min, max, mean and sample standard deviation (as fio computes it); zeros when empty.
fn sample_stats(samples: &[f64]) -> (f64, f64, f64, f64) {
    if samples.is_empty() {
        return (0.0, 0.0, 0.0, 0.0);
    }
    let n = samples.len() as f64;
    let min = samples.iter().copied().fold(f64::INFINITY, f64::min);
    let max = samples.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mean = samples.iter().sum::<f64>() / n;
    let dev = if samples.len() > 1 {
        (samples.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    (min, max, mean, dev)
}

/// The direction's bandwidth per timeline bucket in KiB/s (fio's `bw` unit), from its first
/// to its last non-zero bucket: fio samples a job only while it runs, so the idle time of a
/// read phase before the write phase started is not a sample of zero bandwidth.
fn bandwidth_samples_kib_s(timeline: &[TimelinePoint], direction: &str) -> Vec<f64> {
    let rate_mb_s = |p: &TimelinePoint| match direction {
        "read" => p.read_mb_s,
        "write" => p.write_mb_s,
        _ => 0.0,
    };
    let first = timeline.iter().position(|p| rate_mb_s(p) > 0.0);
    let last = timeline.iter().rposition(|p| rate_mb_s(p) > 0.0);
    match (first, last) {
        (Some(first), Some(last)) => timeline[first..=last]
            .iter()
            .map(|p| rate_mb_s(p) * 1e6 / BYTES_PER_KIB as f64)
            .collect(),
        _ => Vec::new(),
    }
}

/// fio's latency statistics object (`min`, `max`, `mean`, `stddev`, `N`, and when any request
/// completed, `percentile` and json+'s `bins`).
fn latency_stats(op: &OpReport) -> Value {
    let l = &op.latency_us;
    let mean_ns = l.mean * NS_PER_US;
    let mut stats = Map::new();
    let min_ns = op.latency_cdf.first().map_or(0, |p| p.latency_ns());
    stats.insert("min".into(), json!(min_ns));
    stats.insert("max".into(), json!((l.max * NS_PER_US).round() as u64));
    stats.insert("mean".into(), json!(mean_ns));
    // The variance from the CDF's groups, each at its upper latency: an estimate, since the
    // report keeps the exact mean but not the exact second moment.
    let mut previous = 0;
    let mut square_sum = 0.0;
    for p in &op.latency_cdf {
        let count = p.requests_at_or_below() - previous;
        previous = p.requests_at_or_below();
        square_sum += count as f64 * (p.latency_ns() as f64 - mean_ns).powi(2);
    }
    let stddev = if op.ios > 1 {
        (square_sum / (op.ios - 1) as f64).sqrt()
    } else {
        0.0
    };
    stats.insert("stddev".into(), json!(stddev));
    stats.insert("N".into(), json!(op.ios));
    if op.ios > 0 {
        let mut percentiles = Map::new();
        // Every percentile comes from the CDF, even those the report holds exactly: mixing
        // the two could make the list decrease, which fio's never does.
        for q in FIO_PERCENTILES {
            let value_ns = op.cdf_quantile_ns(q / 100.0);
            percentiles.insert(format!("{q:.6}"), json!(value_ns));
        }
        stats.insert("percentile".into(), Value::Object(percentiles));
        let mut bins = Map::new();
        let mut previous = 0;
        for p in &op.latency_cdf {
            let count = p.requests_at_or_below() - previous;
            previous = p.requests_at_or_below();
            if count > 0 {
                bins.insert(p.latency_ns().to_string(), json!(count));
            }
        }
        stats.insert("bins".into(), Value::Object(bins));
    }
    Value::Object(stats)
}

/// fio's `latency_ns`, `latency_us` and `latency_ms` maps: the percentage of all requests
/// (every direction) whose latency falls in each range, a range's key being its upper bound
/// and the previous key its lower bound (exclusive).
fn latency_distribution(report: &RunReport) -> [Value; 3] {
    let ops = [&report.read, &report.write, &report.trim];
    let total: u64 = ops.iter().map(|o| o.ios).sum();
    let at_or_below = |bound_ns: f64| -> u64 {
        ops.iter()
            .map(|o| {
                o.latency_cdf
                    .iter()
                    .take_while(|p| p.latency_ns() as f64 <= bound_ns)
                    .last()
                    .map_or(0, |p| p.requests_at_or_below())
            })
            .sum()
    };
    let percent = |count: u64| {
        if total == 0 {
            0.0
        } else {
            100.0 * count as f64 / total as f64
        }
    };
    const STEPS: [u32; 10] = [2, 4, 10, 20, 50, 100, 250, 500, 750, 1000];
    // The ranges chain across the three maps: latency_us "2" starts where latency_ns "1000"
    // ends, and so on.
    let mut lower_ns = 0.0;
    let mut bucket_map = |unit_ns: f64, steps: &[u32]| {
        let mut map = Map::new();
        for &step in steps {
            let upper_ns = f64::from(step) * unit_ns;
            let count = at_or_below(upper_ns).saturating_sub(at_or_below(lower_ns));
            map.insert(step.to_string(), json!(percent(count)));
            lower_ns = upper_ns;
        }
        map
    };
    let ns = bucket_map(1.0, &STEPS);
    let us = bucket_map(1e3, &STEPS);
    let mut ms = bucket_map(1e6, &[2, 4, 10, 20, 50, 100, 250, 500, 750, 1000, 2000]);
    let above = total.saturating_sub(at_or_below(2000.0 * 1e6));
    ms.insert(">=2000".into(), json!(percent(above)));
    [Value::Object(ns), Value::Object(us), Value::Object(ms)]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What fio 3.33 wrote for a `--output-format=json+` run of the null engine (bins
    /// shortened), the reference structure.
    const FIO_REFERENCE: &str = include_str!("testdata/fio-3.33-jsonplus.json");

    /// Every key of `reference` is in `ours` with a value of the same JSON kind, recursively;
    /// the keys of `bins` are latencies and differ from run to run, so only their kind counts.
    fn assert_same_structure(reference: &Value, ours: &Value, path: &str) {
        match (reference, ours) {
            (Value::Object(r), Value::Object(o)) => {
                if path.ends_with(".bins") {
                    assert!(o.keys().all(|k| k.parse::<u64>().is_ok()), "{path}");
                    assert!(o.values().all(Value::is_u64), "{path}");
                    return;
                }
                for (key, value) in r {
                    let child = format!("{path}.{key}");
                    let theirs = o.get(key).unwrap_or_else(|| panic!("missing {child}"));
                    assert_same_structure(value, theirs, &child);
                }
            }
            (Value::Array(r), Value::Array(o)) => {
                assert_eq!(r.len(), o.len(), "{path}");
                for (i, (r, o)) in r.iter().zip(o).enumerate() {
                    assert_same_structure(r, o, &format!("{path}[{i}]"));
                }
            }
            // fio writes integers for counts and floats with a fraction for rates; both are
            // JSON numbers, and parsers read them as numbers.
            (Value::Number(_), Value::Number(_)) | (Value::String(_), Value::String(_)) => {}
            _ => panic!("{path}: fio has {reference}, afa has {ours}"),
        }
    }

    fn sample() -> Value {
        let mut report = crate::tests::sample_report();
        report.config = json!({
            "workload": { "job": "[global]\nbs=4k\niodepth=32\n[w]\nrw=randwrite\n[r]\nrw=randread\n" }
        });
        to_fio_json(&report, "sample")
    }

    #[test]
    fn has_every_key_fio_writes() {
        let reference: Value = serde_json::from_str(FIO_REFERENCE).unwrap();
        let ours = sample();
        let job = &ours["jobs"][0];
        // The job options are the job's own, so only their kind is compared.
        let mut reference_job = reference["jobs"][0].clone();
        reference_job["job options"] = json!({});
        assert_same_structure(&reference_job, job, "jobs[0]");
        for key in ["fio version", "timestamp", "timestamp_ms", "time"] {
            assert!(ours.get(key).is_some(), "{key}");
        }
        // The percentile keys are exactly fio's.
        let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
        assert_eq!(
            keys(&job["write"]["lat_ns"]["percentile"]),
            keys(&reference["jobs"][0]["write"]["lat_ns"]["percentile"])
        );
    }

    #[test]
    fn values_follow_fios_units() {
        let report = crate::tests::sample_report();
        let ours = sample();
        let job = &ours["jobs"][0];
        let w = &job["write"];
        assert_eq!(w["io_bytes"], report.write.bytes);
        assert_eq!(w["io_kbytes"], report.write.bytes / 1024);
        assert_eq!(w["total_ios"], report.write.ios);
        let bw_bytes = w["bw_bytes"].as_u64().unwrap();
        assert_eq!(bw_bytes, (report.write.bandwidth_mb_s * 1e6).round() as u64);
        assert_eq!(w["bw"], bw_bytes / 1024, "bw is KiB/s");
        assert_eq!(w["iops"], report.write.iops);
        // Every write took 1234 µs: each percentile is within the CDF's 1 %.
        for (key, value) in w["lat_ns"]["percentile"].as_object().unwrap() {
            let ns = value.as_u64().unwrap() as f64;
            assert!((ns / 1_234_000.0 - 1.0).abs() < 0.01, "{key}: {ns}");
        }
        assert_eq!(w["clat_ns"], w["lat_ns"], "no separate submission latency");
        assert_eq!(w["slat_ns"]["N"], 0);
        let bins = w["lat_ns"]["bins"].as_object().unwrap();
        assert_eq!(bins.values().map(|v| v.as_u64().unwrap()).sum::<u64>(), 100);
        assert_eq!(w["lat_ns"]["N"], 100);
        // A direction with requests has percentiles; sync, without any flush, has none, as
        // fio writes it.
        assert!(job["trim"]["lat_ns"].get("percentile").is_some());
        assert!(job["sync"]["lat_ns"].get("percentile").is_none());
        // The latency distribution covers every request once.
        let total: f64 = ["latency_ns", "latency_us", "latency_ms"]
            .iter()
            .flat_map(|k| job[*k].as_object().unwrap().values())
            .map(|v| v.as_f64().unwrap())
            .sum();
        assert!((total - 100.0).abs() < 1e-6, "{total}");
        // 1234 µs writes fall in fio's "2 ms" bucket (1–2 ms), 87 µs reads in "100 µs".
        let share = |k: &str, b: &str| job[k][b].as_f64().unwrap();
        assert!(
            (share("latency_ms", "2") + share("latency_us", "100") - 200.0 * 100.0 / 201.0).abs()
                < 1e-6
        );
        // Options: [global] and the first job, as fio echoes them.
        let options = &job["job options"];
        assert_eq!(options["bs"], "4k");
        assert_eq!(options["rw"], "randwrite");
        assert_eq!(options["name"], "sample");
        assert_eq!(job["error"], 0);
    }

    #[test]
    fn mismatches_are_reported_as_an_io_error() {
        let mut report = crate::tests::sample_report();
        report.integrity.mismatches = 3;
        assert_eq!(to_fio_json(&report, "x")["jobs"][0]["error"], 5);
    }

    #[test]
    fn steady_state_is_written_as_fio_writes_it() {
        let mut report = crate::tests::sample_report();
        assert!(to_fio_json(&report, "x")["jobs"][0]
            .get("steadystate")
            .is_none());
        report.steady_state.push(SteadyStateReport {
            job: "x".into(),
            ss: "iops:5.000000%".into(),
            duration_s: 3.0,
            interval_s: 1.0,
            attained: true,
            attained_at_s: Some(4.0),
            criterion: Some(0.5),
            criterion_is_percent: true,
            max_deviation: 1.0,
            window_samples: 3,
            iops: vec![199, 200, 201],
            bw_bytes_s: vec![199 * 4096, 200 * 4096, 201 * 4096],
            ..SteadyStateReport::default()
        });
        let ss = &to_fio_json(&report, "x")["jobs"][0]["steadystate"];
        assert_eq!(ss["ss"], "iops:5.000000%");
        assert_eq!(ss["duration"], 3);
        assert_eq!(ss["attained"], 1);
        assert_eq!(ss["criterion"], "0.500000%");
        assert_eq!(ss["max_deviation"], 1.0);
        assert_eq!(ss["data"]["iops_mean"], 200);
        assert_eq!(ss["data"]["bw_mean"], 200 * 4096);
        assert_eq!(ss["data"]["iops"], json!([199, 200, 201]));
    }
}
