//! Measurement collection and run reports for afa.
//!
//! [`Recorder`] sits on the simulator's hot path and collects per-request latencies, counters and
//! a throughput timeline; [`Recorder::finish`] turns them into [`Measurements`]. The CLI combines
//! those with device counters into a [`RunReport`], which is written as JSON (the key names are a
//! contract other tools read) and printed as a human summary. [`Progress`] is a nearly free
//! progress bar for long runs.
//!
//! Units: time is virtual (simulated) nanoseconds unless a name says otherwise, latencies in the
//! reports are microseconds, and **MB means 10^6 bytes** (so MB/s is 10^6 bytes per second of
//! virtual time), matching the convention of storage benchmarks such as fio's "MB/s".

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};

/// Bytes per MB. afa uses decimal megabytes throughout, like storage vendors and fio's "MB/s".
const BYTES_PER_MB: f64 = 1e6;
const NS_PER_US: f64 = 1e3;
const NS_PER_MS: f64 = 1e6;
const NS_PER_S: f64 = 1e9;

/// The kind of a host request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpClass {
    Read,
    Write,
    Trim,
    Flush,
}

impl OpClass {
    /// Index into the per-op arrays of [`Recorder`].
    fn index(self) -> usize {
        match self {
            OpClass::Read => 0,
            OpClass::Write => 1,
            OpClass::Trim => 2,
            OpClass::Flush => 3,
        }
    }
}

/// The timeline is a dense vector indexed by `complete_ns / interval`. A bogus completion time
/// (say `u64::MAX`) with a small interval would otherwise try to allocate an enormous vector, so
/// once the timeline would exceed this many buckets the interval is doubled and neighbouring
/// buckets are merged. That keeps memory bounded (16 bytes per bucket, 16 MiB at most) without
/// dropping any bytes from the timeline.
const MAX_TIMELINE_BUCKETS: u64 = 1 << 20;

/// Adds two timeline buckets (`[read, write]` bytes), saturating rather than overflowing.
fn add_bucket_bytes(acc: [u64; 2], bucket: &[u64; 2]) -> [u64; 2] {
    [
        acc[0].saturating_add(bucket[0]),
        acc[1].saturating_add(bucket[1]),
    ]
}

/// Per-op-class accumulators.
#[derive(Debug)]
struct OpStats {
    latency_ns: Histogram<u64>,
    ios: u64,
    bytes: u64,
    /// Exact sum of latencies, for an exact mean. u128 because millions of multi-second latencies
    /// could overflow u64 nanoseconds in long runs.
    latency_sum_ns: u128,
    latency_max_ns: u64,
    /// The op's active span: rates are per second of the time this kind of I/O was in
    /// flight, as fio reports a job's bandwidth over its own runtime, so a read phase that
    /// follows a write phase is not diluted by it.
    first_submit_ns: u64,
    last_complete_ns: u64,
    /// Requests the device failed and the job went on past (fio's `continue_on_error`).
    errors: u64,
}

impl OpStats {
    fn new() -> Self {
        Self {
            // Three significant digits bound the quantisation error of every percentile at 0.1 %;
            // `new` auto-resizes, so no maximum latency has to be guessed up front.
            latency_ns: Histogram::new(3)
                .expect("3 significant digits is within hdrhistogram's supported range 0..=5"),
            ios: 0,
            bytes: 0,
            latency_sum_ns: 0,
            latency_max_ns: 0,
            first_submit_ns: u64::MAX,
            last_complete_ns: 0,
            errors: 0,
        }
    }

    fn report(&self, measure_from_ns: u64) -> OpReport {
        let window_ns = self
            .last_complete_ns
            .saturating_sub(self.first_submit_ns.max(measure_from_ns));
        let window_s = window_ns as f64 / NS_PER_S;
        // An empty window has no meaningful rate; report 0 rather than NaN or infinity, which JSON
        // cannot represent.
        let per_second = |amount: f64| {
            if window_ns == 0 {
                0.0
            } else {
                amount / window_s
            }
        };
        OpReport {
            ios: self.ios,
            bytes: self.bytes,
            iops: per_second(self.ios as f64),
            bandwidth_mb_s: per_second(self.bytes as f64 / BYTES_PER_MB),
            latency_us: self.latency_summary(),
            latency_cdf: self.latency_cdf(),
            errors: self.errors,
        }
    }

    /// The latency distribution as a compact CDF: the histogram's recorded buckets merged into
    /// groups whose latencies lie within [`CDF_STEP_RATIO`] of each other, one point per group
    /// at its highest latency (clamped to the exact maximum, as the percentiles are) with the
    /// exact number of requests at or below it. The counts stay exact, so plots and fio's
    /// histogram bins can be derived from it; only the latency axis is quantised.
    fn latency_cdf(&self) -> Vec<CdfPoint> {
        let mut points = Vec::new();
        let mut cumulative = 0_u64;
        // The open group: its first latency and its last (highest) latency so far.
        let mut group: Option<(u64, u64)> = None;
        for bucket in self.latency_ns.iter_recorded() {
            let value_ns = bucket.value_iterated_to().min(self.latency_max_ns);
            if let Some((first_ns, last_ns)) = group {
                if value_ns as f64 > first_ns as f64 * CDF_STEP_RATIO {
                    points.push(CdfPoint(last_ns, cumulative));
                    group = None;
                }
            }
            cumulative += bucket.count_at_value();
            group = Some(group.map_or((value_ns, value_ns), |(first, _)| (first, value_ns)));
        }
        if let Some((_, last_ns)) = group {
            points.push(CdfPoint(last_ns, cumulative));
        }
        points
    }

    fn latency_summary(&self) -> LatencySummary {
        if self.ios == 0 {
            return LatencySummary::default();
        }
        let max_ns = self.latency_max_ns;
        // hdrhistogram reports the highest value equivalent to a bucket, which can exceed the
        // exact maximum by up to 0.1 %; clamping keeps p99.9 ≤ max, which readers expect.
        let quantile_us =
            |q: f64| self.latency_ns.value_at_quantile(q).min(max_ns) as f64 / NS_PER_US;
        LatencySummary {
            mean: self.latency_sum_ns as f64 / self.ios as f64 / NS_PER_US,
            p50: quantile_us(0.50),
            p90: quantile_us(0.90),
            p99: quantile_us(0.99),
            p999: quantile_us(0.999),
            max: max_ns as f64 / NS_PER_US,
        }
    }
}

/// Collects per-request results during a simulation. Time is virtual nanoseconds.
#[derive(Debug)]
pub struct Recorder {
    /// Indexed by [`OpClass::index`].
    ops: [OpStats; 4],
    /// Current timeline bucket width; 0 disables the timeline. Starts at the requested width and
    /// only grows if the timeline would exceed [`MAX_TIMELINE_BUCKETS`].
    timeline_interval_ns: u64,
    /// Bytes completed per bucket: `[read, write]`.
    timeline_bytes: Vec<[u64; 2]>,
    measure_from_ns: u64,
}

impl Recorder {
    /// `timeline_interval_ns` is the bucket width of the throughput timeline (0 disables it).
    pub fn new(timeline_interval_ns: u64) -> Self {
        Self {
            ops: [
                OpStats::new(),
                OpStats::new(),
                OpStats::new(),
                OpStats::new(),
            ],
            timeline_interval_ns,
            timeline_bytes: Vec::new(),
            measure_from_ns: 0,
        }
    }

    /// Called once per completed host request; must be cheap (millions per second): a histogram
    /// record (latency in ns, 3 significant digits, auto-resize), counters, and one timeline
    /// bucket add (a vector indexed by `complete_ns / interval`, grown as needed).
    ///
    /// Requests completing before `measure_from_ns` (ramp time) are not counted anywhere,
    /// including the timeline. A `complete_ns` earlier than `submit_ns` is treated as zero
    /// latency rather than wrapping around.
    pub fn record(&mut self, op: OpClass, submit_ns: u64, complete_ns: u64, bytes: u64) {
        if complete_ns < self.measure_from_ns {
            return;
        }
        let latency_ns = complete_ns.saturating_sub(submit_ns);
        let stats = &mut self.ops[op.index()];
        if stats.latency_ns.record(latency_ns).is_err() {
            // Only values beyond hdrhistogram's resize limit (about 2^62 ns, 146 years) fail;
            // clamp them into the top bucket instead of losing the sample.
            stats.latency_ns.saturating_record(latency_ns);
        }
        stats.ios += 1;
        stats.bytes = stats.bytes.saturating_add(bytes);
        stats.latency_sum_ns += u128::from(latency_ns);
        stats.latency_max_ns = stats.latency_max_ns.max(latency_ns);
        stats.first_submit_ns = stats.first_submit_ns.min(submit_ns);
        stats.last_complete_ns = stats.last_complete_ns.max(complete_ns);

        let lane = match op {
            OpClass::Read => 0,
            OpClass::Write => 1,
            // The timeline shows data throughput only; trims and flushes move no data.
            OpClass::Trim | OpClass::Flush => return,
        };
        if self.timeline_interval_ns == 0 {
            return;
        }
        let mut bucket = complete_ns / self.timeline_interval_ns;
        if bucket >= MAX_TIMELINE_BUCKETS {
            self.coarsen_timeline(complete_ns);
            bucket = complete_ns / self.timeline_interval_ns;
        }
        // `bucket < MAX_TIMELINE_BUCKETS`, so the conversion cannot truncate.
        let bucket = bucket as usize;
        if bucket >= self.timeline_bytes.len() {
            self.timeline_bytes.resize(bucket + 1, [0, 0]);
        }
        let slot = &mut self.timeline_bytes[bucket][lane];
        *slot = slot.saturating_add(bytes);
    }

    /// Doubles the timeline interval (merging bucket pairs) until `complete_ns` fits. Cold path:
    /// only runs for absurdly long runs or bogus timestamps.
    #[cold]
    fn coarsen_timeline(&mut self, complete_ns: u64) {
        while complete_ns / self.timeline_interval_ns >= MAX_TIMELINE_BUCKETS {
            self.timeline_interval_ns = self.timeline_interval_ns.saturating_mul(2);
            let merged: Vec<[u64; 2]> = self
                .timeline_bytes
                .chunks(2)
                .map(|pair| pair.iter().fold([0, 0], add_bucket_bytes))
                .collect();
            self.timeline_bytes = merged;
        }
    }

    /// Sets the start of the measured window (the end of the ramp). Call it before recording:
    /// requests already recorded are not removed retroactively.
    pub fn set_measure_from_ns(&mut self, t_ns: u64) {
        self.measure_from_ns = t_ns;
    }

    /// Adds every request `other` recorded to this recorder's per-op totals and latency
    /// histograms (pooling several devices' latencies into one distribution). The timeline
    /// is left alone: two recorders' buckets need not line up.
    pub fn add_ops_of(&mut self, other: &Recorder) {
        for (mine, theirs) in self.ops.iter_mut().zip(&other.ops) {
            // Adding fails only where resizing would (values near 2^62 ns) and before it
            // changes anything; then each value is clamped in, as `record` does.
            if mine.latency_ns.add(&theirs.latency_ns).is_err() {
                for bucket in theirs.latency_ns.iter_recorded() {
                    mine.latency_ns
                        .saturating_record_n(bucket.value_iterated_to(), bucket.count_at_value());
                }
            }
            mine.ios += theirs.ios;
            mine.bytes = mine.bytes.saturating_add(theirs.bytes);
            mine.latency_sum_ns += theirs.latency_sum_ns;
            mine.latency_max_ns = mine.latency_max_ns.max(theirs.latency_max_ns);
            mine.first_submit_ns = mine.first_submit_ns.min(theirs.first_submit_ns);
            mine.last_complete_ns = mine.last_complete_ns.max(theirs.last_complete_ns);
            mine.errors += theirs.errors;
        }
    }

    /// Summaries over the measured window `[measure_from_ns, end_ns]`.
    ///
    /// IOPS and bandwidth are over the window length in virtual time (0 for an empty window).
    /// The timeline lists every bucket that overlaps the window, including empty ones; each
    /// bucket's rate is its bytes divided by the part of the bucket inside the window, so partial
    /// first and last buckets are not understated. Requests recorded with a completion time after
    /// `end_ns` still count in the totals but fall outside the timeline.
    /// Counts a request of class `op` that the device failed and the job went on past.
    pub fn record_error(&mut self, op: OpClass) {
        self.ops[op.index()].errors += 1;
    }

    pub fn finish(&self, end_ns: u64) -> Measurements {
        let [read, write, trim, flush] =
            [0, 1, 2, 3].map(|i| self.ops[i].report(self.measure_from_ns));
        Measurements {
            read,
            write,
            trim,
            flush,
            timeline: self.timeline(end_ns),
        }
    }

    fn timeline(&self, end_ns: u64) -> Vec<TimelinePoint> {
        let raw_interval_ns = self.timeline_interval_ns;
        if raw_interval_ns == 0 || end_ns <= self.measure_from_ns {
            return Vec::new();
        }
        // A window far longer than anything recorded (a bogus end_ns) could ask for billions of
        // points; widen the output buckets by powers of two, as `record` does, to stay bounded.
        let mut factor = 1_u64;
        let mut interval_ns = raw_interval_ns;
        while (end_ns - 1) / interval_ns - self.measure_from_ns / interval_ns
            >= MAX_TIMELINE_BUCKETS
        {
            factor = factor.saturating_mul(2);
            interval_ns = interval_ns.saturating_mul(2);
        }
        let first_bucket = self.measure_from_ns / interval_ns;
        // Last bucket that starts strictly before end_ns.
        let last_bucket = (end_ns - 1) / interval_ns;
        (first_bucket..=last_bucket)
            .map(|bucket| {
                let start_ns = bucket.saturating_mul(interval_ns);
                let stop_ns = start_ns.saturating_add(interval_ns);
                let covered_ns = stop_ns.min(end_ns) - start_ns.max(self.measure_from_ns);
                let bytes = self.raw_bucket_bytes(bucket.saturating_mul(factor), factor);
                let covered_s = covered_ns as f64 / NS_PER_S;
                TimelinePoint {
                    t_ms: start_ns as f64 / NS_PER_MS,
                    read_mb_s: bytes[0] as f64 / BYTES_PER_MB / covered_s,
                    write_mb_s: bytes[1] as f64 / BYTES_PER_MB / covered_s,
                }
            })
            .collect()
    }

    /// Sums `count` recorded buckets starting at `first`, treating buckets never written as empty.
    fn raw_bucket_bytes(&self, first: u64, count: u64) -> [u64; 2] {
        let len = self.timeline_bytes.len();
        let start = usize::try_from(first).map_or(len, |i| i.min(len));
        let stop = usize::try_from(first.saturating_add(count)).map_or(len, |i| i.min(len));
        self.timeline_bytes[start..stop]
            .iter()
            .fold([0, 0], add_bucket_bytes)
    }
}

/// What [`Recorder::finish`] returns: per-op summaries and the throughput timeline.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Measurements {
    pub read: OpReport,
    pub write: OpReport,
    pub trim: OpReport,
    pub flush: OpReport,
    pub timeline: Vec<TimelinePoint>,
}

/// Summary of one op class over the measured window.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct OpReport {
    /// Completed requests.
    pub ios: u64,
    /// Bytes transferred by those requests.
    pub bytes: u64,
    /// Requests per second of virtual time.
    pub iops: f64,
    /// MB (10^6 bytes) per second of virtual time.
    pub bandwidth_mb_s: f64,
    /// Completion latency (submit to complete) in microseconds.
    pub latency_us: LatencySummary,
    /// The latency CDF: `[latency_ns, requests_at_or_below]` points in increasing order (see
    /// [`CdfPoint`]). Empty in reports written before it existed and when no request completed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub latency_cdf: Vec<CdfPoint>,
    /// Requests the device failed that the job went on past (fio's `continue_on_error`);
    /// they count in nothing above. Left out when there were none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub errors: u64,
}

impl OpReport {
    /// The smallest CDF latency with at least `quantile` of the requests at or below it, in
    /// ns (the CDF's 1% latency steps bound its error); 0 with no CDF.
    pub fn cdf_quantile_ns(&self, quantile: f64) -> u64 {
        let Some(last) = self.latency_cdf.last() else {
            return 0;
        };
        let needed = (quantile * last.requests_at_or_below() as f64).ceil() as u64;
        self.latency_cdf
            .iter()
            .find(|p| p.requests_at_or_below() >= needed)
            .unwrap_or(last)
            .latency_ns()
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A latency CDF merges histogram buckets into groups spanning at most this factor in
/// latency, so each point is within 1 % of every latency it stands for; since each group
/// starts more than this factor above the previous one, a CDF has at most about 2,300 points
/// over ten decades of latency (typically a few hundred).
pub const CDF_STEP_RATIO: f64 = 1.01;

/// One point of a latency CDF: `(latency_ns, requests_at_or_below)`, serialised as a
/// two-element JSON array to keep reports compact. The last point's count is the op's `ios`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CdfPoint(pub u64, pub u64);

impl CdfPoint {
    /// The latency in nanoseconds.
    pub fn latency_ns(self) -> u64 {
        self.0
    }

    /// How many requests completed with at most this latency.
    pub fn requests_at_or_below(self) -> u64 {
        self.1
    }
}

/// Latency statistics in microseconds. Percentiles come from an HDR histogram with 3 significant
/// digits (error ≤ 0.1 %, clamped to the exact maximum); `mean` and `max` are exact. All zero
/// when no request completed.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct LatencySummary {
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

/// One bucket of the throughput timeline.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TimelinePoint {
    /// Start of the bucket, in milliseconds of virtual time.
    pub t_ms: f64,
    /// Read throughput in MB (10^6 bytes) per second of virtual time.
    pub read_mb_s: f64,
    /// Write throughput in MB (10^6 bytes) per second of virtual time.
    pub write_mb_s: f64,
}

/// The run report: what `afa run --json PATH` writes. The field names are the JSON key names and
/// form a contract that other tools read; do not rename them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunReport {
    pub seed: u64,
    /// Simulated (virtual) time the run covered.
    pub sim_time_ns: u64,
    /// Wall-clock time the simulation took.
    pub host_time_s: f64,
    /// Echo of the configuration that ran.
    pub config: serde_json::Value,
    pub read: OpReport,
    pub write: OpReport,
    pub trim: OpReport,
    pub flush: OpReport,
    /// Write amplification: NAND page programs / host page writes.
    pub waf: f64,
    pub host_page_writes: u64,
    pub nand: NandReport,
    pub gc: GcReport,
    pub wear: WearReport,
    pub integrity: IntegrityReport,
    /// Per die, busy time / simulated time.
    pub die_busy_fraction: Vec<f64>,
    pub timeline: Vec<TimelinePoint>,
    /// Array engine counters, when the volume is an array of SSDs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<serde_json::Value>,
    /// Per member device of an array: its own counters and bandwidth timeline.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<MemberReport>,
    /// The host CPU model's use per thread and category, when `[host]` is configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<serde_json::Value>,
    /// The counters of a device other than the emulated SSD of `afa-ssd`, each under its own
    /// top-level key: a WAFLASH SSD's `waflash` report, an OX SSD's `ox` counters. `nand`,
    /// `wear` and `die_busy_fraction` then hold what that device's flash counted, and `gc`
    /// its GC as the device counts it (OX: collected EBLOCKs as runs, moved RBLOCKs as pages).
    /// fio's steady-state detection, one entry per job or group judged, when any job set
    /// a window (`steadystate_duration`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steady_state: Vec<SteadyStateReport>,
    /// fio's latency-target search, one entry per job clone that set `latency_target`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub latency_target: Vec<LatencyTargetReport>,
    #[serde(default, flatten)]
    pub device: serde_json::Map<String, serde_json::Value>,
}

/// fio's steady-state detection as one job (or one stonewall group, with `group_reporting`)
/// went through it: the criterion it was judged by, whether and when it was met, and the
/// last window of samples, oldest first. fio writes the same under a job's `steadystate`
/// key of its JSON.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SteadyStateReport {
    /// The job judged (its clone number after a dot when it has several clones and they
    /// are judged one by one), or the first job of the group judged together.
    pub job: String,
    /// The stonewall group, from 0.
    pub group: usize,
    /// The criterion and threshold as fio prints them (`iops_slope:0.010000%`).
    pub ss: String,
    /// The window, the ramp before sampling and the sampling period, in seconds.
    pub duration_s: f64,
    pub ramp_s: f64,
    pub interval_s: f64,
    /// Whether the criterion fell below its threshold, ending the job(s), and when
    /// (simulated seconds from the run's start).
    pub attained: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attained_at_s: Option<f64>,
    /// The criterion at the last full window: the slope, or the largest deviation from the
    /// mean, as a percentage of the window's mean when the threshold is one. `None` when the
    /// window never filled, or its mean was 0 for a percentage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub criterion: Option<f64>,
    pub criterion_is_percent: bool,
    /// The last full window's largest deviation from its mean and least-squares slope, in
    /// the measured unit (per sample, for the slope); 0 when the criterion does not compute
    /// it, as in fio.
    pub max_deviation: f64,
    pub slope: f64,
    /// The samples the window holds when full.
    pub window_samples: usize,
    /// The last window's samples, oldest first: requests and bytes completed per second.
    pub iops: Vec<u64>,
    pub bw_bytes_s: Vec<u64>,
}

impl SteadyStateReport {
    /// fio's `iops_mean`: the window's sum over its full length (a window that never filled
    /// counts its missing samples as 0, as fio's does).
    pub fn iops_mean(&self) -> u64 {
        self.iops.iter().sum::<u64>() / self.window_samples.max(1) as u64
    }

    /// fio's `bw_mean`, in bytes per second, computed as [`Self::iops_mean`].
    pub fn bw_mean_bytes_s(&self) -> u64 {
        self.bw_bytes_s.iter().sum::<u64>() / self.window_samples.max(1) as u64
    }

    /// One line for the human summary.
    pub fn summary_line(&self) -> String {
        let outcome = match self.attained_at_s {
            Some(at_s) if self.attained => format!("attained at {at_s:.3} s"),
            _ => "not attained".to_string(),
        };
        let criterion = match self.criterion {
            Some(c) => format!("{c:.6}{}", if self.criterion_is_percent { "%" } else { "" }),
            None => "none (the window never filled)".to_string(),
        };
        format!(
            "Steady state of {} ({}, a {} s window of {} samples after a {} s ramp): {outcome}; \
             last criterion {criterion}; window mean {} IOPS, {:.2} MB/s",
            self.job,
            self.ss,
            self.duration_s,
            self.window_samples,
            self.ramp_s,
            self.iops_mean(),
            self.bw_mean_bytes_s() as f64 / BYTES_PER_MB
        )
    }
}

/// fio's latency-target search as one job clone went through it (`latency_target`): the
/// queue depth it settled on (fio's `latency_depth`), the final window at that depth, and
/// every change of depth on the way.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct LatencyTargetReport {
    /// The job (its clone number after a dot when it has several clones).
    pub job: String,
    pub target_us: f64,
    pub window_s: f64,
    pub percentile: f64,
    /// The depth found, or where the search stood when the job ended.
    pub depth: u32,
    /// The search converged and its final window at `depth` passed, which ended the job.
    pub converged: bool,
    /// When the final window at the depth found started, its completions and their mean
    /// latency. fio resets the job's statistics there so that its report covers that
    /// window alone; the run report here covers the whole run, search included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_run_start_s: Option<f64>,
    pub final_run_ios: u64,
    pub final_run_latency_mean_us: f64,
    /// The changes of depth in all, and `[seconds, depth]` at the start and at each change
    /// (the first 10,000 changes).
    pub depth_changes: u64,
    pub steps: Vec<(f64, u32)>,
    /// The job's last completion the search saw, where the record of depths ends.
    #[serde(default)]
    pub last_completion_s: f64,
}

impl LatencyTargetReport {
    /// One line for the human summary.
    pub fn summary_line(&self) -> String {
        let outcome = if self.converged {
            format!(
                "converged at queue depth {} (final window from {:.3} s: {} requests, mean \
                 latency {:.2} µs)",
                self.depth,
                self.final_run_start_s.unwrap_or(0.0),
                self.final_run_ios,
                self.final_run_latency_mean_us
            )
        } else {
            format!("at queue depth {} when the job ended", self.depth)
        };
        format!(
            "Latency target of {} ({} µs for {}% of the requests, {} s windows): {outcome}; \
             {} changes of depth",
            self.job, self.target_us, self.percentile, self.window_s, self.depth_changes
        )
    }
}

/// One member device of an array.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct MemberReport {
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub nand: NandReport,
    pub gc: GcReport,
    /// Read and write MB/s of this member over time, bucketed as the run timeline.
    pub timeline: Vec<TimelinePoint>,
}

/// NAND operation counters. The totals cover both cell modes; `slc_*` counts operations in SLC
/// mode (e.g. an SLC cache), and `mlc_*` counts operations in the device's dense cell mode,
/// whichever it is (MLC or TLC).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct NandReport {
    pub page_reads: u64,
    pub page_programs: u64,
    pub block_erases: u64,
    pub slc_reads: u64,
    pub slc_programs: u64,
    pub slc_erases: u64,
    /// Reads in the dense cell mode (MLC or TLC).
    pub mlc_reads: u64,
    /// Programs in the dense cell mode (MLC or TLC).
    pub mlc_programs: u64,
    /// Erases in the dense cell mode (MLC or TLC).
    pub mlc_erases: u64,
    /// Reads that went ahead of program or erase work on their die (`timing.read_suspend`).
    #[serde(default)]
    pub read_suspends: u64,
}

/// Garbage-collection counters.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct GcReport {
    pub runs: u64,
    pub foreground_runs: u64,
    pub background_runs: u64,
    pub pages_moved: u64,
    pub slc_evictions: u64,
    /// Wholly invalid blocks erased in idle time (`ssd.gc.idle_erase`); not counted in `runs`.
    #[serde(default)]
    pub idle_erases: u64,
    /// Of `pages_moved`, pages relocated to another plane because the victim's own plane
    /// had no room left for them (the FTL's last resort before it refuses a write).
    #[serde(default)]
    pub pages_moved_across_planes: u64,
}

/// Block erase-count distribution and wear-levelling activity.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct WearReport {
    pub erase_count_min: u64,
    pub erase_count_max: u64,
    pub erase_count_mean: f64,
    pub static_wl_moves: u64,
    /// Erase count of the most worn block over the rated endurance of the dense cell mode.
    #[serde(default)]
    pub life_used_fraction: f64,
    /// Blocks marked bad: at the factory, or retired after a failed program or erase.
    #[serde(default)]
    pub bad_blocks: u64,
    #[serde(default)]
    pub program_failures: u64,
    #[serde(default)]
    pub erase_failures: u64,
}

impl WearReport {
    /// The media faults of the run in words, or `None` when the flash had none.
    pub fn faults_summary(&self) -> Option<String> {
        afa_nand::MediaFaults {
            bad_blocks: self.bad_blocks,
            program_failures: self.program_failures,
            erase_failures: self.erase_failures,
        }
        .summary()
    }
}

/// Data-integrity checking: sectors whose payload a read verified against the oracle, and
/// how many of them did not match.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct IntegrityReport {
    pub reads_checked: u64,
    pub mismatches: u64,
}

impl RunReport {
    /// Pretty-printed JSON. Non-finite floats have no JSON form and are written as `null`, so
    /// producers should keep every float finite.
    pub fn to_json_pretty(&self) -> String {
        // Serialising this struct cannot fail: every map key is a string and no custom
        // serialiser returns errors. Fall back to a JSON error object rather than panicking.
        serde_json::to_string_pretty(self).unwrap_or_else(|err| {
            serde_json::json!({ "error": format!("could not serialise run report: {err}") })
                .to_string()
        })
    }

    /// Simulated host requests completed per wall-clock second: the simulator's own speed.
    /// Derived, not stored, so that the JSON of two runs with one seed differs only in
    /// `host_time_s`.
    pub fn requests_per_host_second(&self) -> f64 {
        let ios = self.read.ios + self.write.ios + self.trim.ios + self.flush.ios;
        if self.host_time_s > 0.0 {
            ios as f64 / self.host_time_s
        } else {
            0.0
        }
    }

    /// The human summary printed at the end of a run: a table with a row per op type (IOs,
    /// bytes, IOPS, MB/s, latency mean/p50/p90/p99/p99.9/max in µs), WAF, NAND counters split
    /// SLC / MLC-TLC, GC runs and pages moved, wear, integrity, and the die busy fraction as
    /// min/mean/max. Plain text, aligned columns, no colour codes.
    pub fn human_summary(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail, so the fmt::Results below are ignored.
        let _ = writeln!(
            out,
            "seed {}, simulated {:.6} s, host {:.3} s, {:.0} requests per host second",
            self.seed,
            self.sim_time_ns as f64 / NS_PER_S,
            self.host_time_s,
            self.requests_per_host_second()
        );
        out.push('\n');

        let mut ops = Table::new(&[
            "op", "IOs", "bytes", "IOPS", "MB/s", "mean", "p50", "p90", "p99", "p99.9", "max",
        ]);
        for (name, op) in [
            ("read", &self.read),
            ("write", &self.write),
            ("trim", &self.trim),
            ("flush", &self.flush),
        ] {
            let lat = &op.latency_us;
            ops.row(vec![
                name.to_owned(),
                op.ios.to_string(),
                op.bytes.to_string(),
                format!("{:.1}", op.iops),
                format!("{:.2}", op.bandwidth_mb_s),
                format!("{:.2}", lat.mean),
                format!("{:.2}", lat.p50),
                format!("{:.2}", lat.p90),
                format!("{:.2}", lat.p99),
                format!("{:.2}", lat.p999),
                format!("{:.2}", lat.max),
            ]);
        }
        let _ = writeln!(out, "Host I/O (latency in µs, MB = 10^6 bytes)");
        out.push_str(&ops.render());
        for (name, op) in [("read", &self.read), ("write", &self.write)] {
            if op.errors > 0 {
                let _ = writeln!(
                    out,
                    "{} {name} requests failed and were counted (continue_on_error)",
                    op.errors
                );
            }
        }
        for steady in &self.steady_state {
            let _ = writeln!(out, "{}", steady.summary_line());
        }
        for search in &self.latency_target {
            let _ = writeln!(out, "{}", search.summary_line());
        }
        out.push('\n');

        let _ = writeln!(
            out,
            "Write amplification: {:.3} ({} NAND page programs / {} host page writes)",
            self.waf, self.nand.page_programs, self.host_page_writes
        );
        out.push('\n');

        let nand = &self.nand;
        let mut nand_table = Table::new(&["NAND", "reads", "programs", "erases"]);
        for (name, reads, programs, erases) in [
            ("SLC", nand.slc_reads, nand.slc_programs, nand.slc_erases),
            (
                "MLC/TLC",
                nand.mlc_reads,
                nand.mlc_programs,
                nand.mlc_erases,
            ),
            (
                "total",
                nand.page_reads,
                nand.page_programs,
                nand.block_erases,
            ),
        ] {
            nand_table.row(vec![
                name.to_owned(),
                reads.to_string(),
                programs.to_string(),
                erases.to_string(),
            ]);
        }
        out.push_str(&nand_table.render());
        out.push('\n');

        let gc = &self.gc;
        let wear = &self.wear;
        let integrity = &self.integrity;
        let mut misc = Table::new(&["", ""]);
        misc.row(vec![
            "GC".to_owned(),
            format!(
                "{} runs ({} foreground, {} background), {} pages moved, {} SLC evictions",
                gc.runs, gc.foreground_runs, gc.background_runs, gc.pages_moved, gc.slc_evictions
            ),
        ]);
        misc.row(vec![
            "Wear".to_owned(),
            format!(
                "erase count min {} / mean {:.2} / max {} ({:.2}% of rated life), {} static wear-levelling moves",
                wear.erase_count_min,
                wear.erase_count_mean,
                wear.erase_count_max,
                wear.life_used_fraction * 100.0,
                wear.static_wl_moves
            ),
        ]);
        if let Some(faults) = wear.faults_summary() {
            misc.row(vec!["Faults".to_owned(), faults]);
        }
        misc.row(vec![
            "Integrity".to_owned(),
            format!(
                "{} sectors read and checked, {} mismatches",
                integrity.reads_checked, integrity.mismatches
            ),
        ]);
        misc.row(vec!["Die busy".to_owned(), self.die_busy_summary()]);
        if let Some(f) = self.cpu.as_ref().map(|c| &c["fractions"]) {
            let pct = |k: &str| f[k].as_f64().unwrap_or(0.0) * 100.0;
            misc.row(vec![
                "Host CPU".to_owned(),
                format!(
                    "stack {:.1}%, array {:.1}%, parity {:.1}%, sync {:.1}%, background {:.1}%, waiting {:.1}% of thread time",
                    pct("stack"),
                    pct("array"),
                    pct("parity"),
                    pct("sync"),
                    pct("background"),
                    pct("waiting")
                ),
            ]);
        }
        out.push_str(&misc.render_left_aligned_without_header());
        out
    }

    fn die_busy_summary(&self) -> String {
        let fractions = &self.die_busy_fraction;
        if fractions.is_empty() {
            return "no dies reported".to_owned();
        }
        let min = fractions.iter().copied().fold(f64::INFINITY, f64::min);
        let max = fractions.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mean = fractions.iter().sum::<f64>() / fractions.len() as f64;
        format!(
            "min {min:.3} / mean {mean:.3} / max {max:.3} over {} dies",
            fractions.len()
        )
    }
}

/// A minimal plain-text table: the first column left-aligned (labels), the rest right-aligned
/// (numbers), columns separated by two spaces.
struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(header: &[&str]) -> Self {
        Self {
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Display width in characters; byte length would misalign cells containing "µ".
    fn width(cell: &str) -> usize {
        cell.chars().count()
    }

    fn column_widths<'a>(&self, lines: impl Iterator<Item = &'a Vec<String>>) -> Vec<usize> {
        let mut widths = vec![0; self.header.len()];
        for line in lines {
            for (width, cell) in widths.iter_mut().zip(line) {
                *width = (*width).max(Self::width(cell));
            }
        }
        widths
    }

    fn render_line(out: &mut String, cells: &[String], widths: &[usize], right_align: bool) {
        let mut line = String::new();
        for (i, (cell, &width)) in cells.iter().zip(widths).enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            let padding = " ".repeat(width.saturating_sub(Self::width(cell)));
            if i > 0 && right_align {
                line.push_str(&padding);
                line.push_str(cell);
            } else {
                line.push_str(cell);
                line.push_str(&padding);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }

    fn render(&self) -> String {
        let widths = self.column_widths(std::iter::once(&self.header).chain(&self.rows));
        let mut out = String::new();
        Self::render_line(&mut out, &self.header, &widths, true);
        for row in &self.rows {
            Self::render_line(&mut out, row, &widths, true);
        }
        out
    }

    /// For label/sentence pairs, where right-aligning the sentences would look ragged.
    fn render_left_aligned_without_header(&self) -> String {
        let widths = self.column_widths(self.rows.iter());
        let mut out = String::new();
        for row in &self.rows {
            Self::render_line(&mut out, row, &widths, false);
        }
        out
    }
}

/// How many [`Progress::update`] calls pass between host-clock reads. A power of two so the
/// check is a mask, and large enough that the clock read is negligible per call.
const UPDATE_CHECK_INTERVAL: u64 = 4096;

/// Runs shorter than this never show a bar, so quick runs and tests stay quiet.
const SHOW_AFTER: Duration = Duration::from_secs(1);

/// Shows an indicatif bar on stderr only for runs that last over one host second (and only when
/// stderr is a terminal; indicatif hides itself otherwise). `update` is called often and must be
/// nearly free: it checks the host clock only every 4096 calls.
#[derive(Debug)]
pub struct Progress {
    total: u64,
    unit_label: String,
    started: Instant,
    calls: u64,
    last_done: u64,
    bar: Option<ProgressBar>,
}

impl Progress {
    /// `total` is the expected final value passed to [`update`](Self::update); `unit_label`
    /// names what is counted (e.g. "requests") and is shown next to the counts.
    pub fn new(total: u64, unit_label: &str) -> Self {
        Self {
            total,
            unit_label: unit_label.to_owned(),
            started: Instant::now(),
            calls: 0,
            last_done: 0,
            bar: None,
        }
    }

    /// Reports progress. Cheap on all but one call in 4096, which reads the host clock and, once
    /// the run has lasted over a second, creates or advances the bar.
    pub fn update(&mut self, done: u64) {
        self.calls = self.calls.wrapping_add(1);
        self.last_done = done;
        if self.calls % UPDATE_CHECK_INTERVAL != 0 {
            return;
        }
        self.refresh();
    }

    #[cold]
    fn refresh(&mut self) {
        if self.bar.is_none() {
            if self.started.elapsed() < SHOW_AFTER {
                return;
            }
            self.bar = Some(self.make_bar());
        }
        if let Some(bar) = &self.bar {
            bar.set_position(self.last_done);
        }
    }

    fn make_bar(&self) -> ProgressBar {
        let bar = ProgressBar::with_draw_target(Some(self.total), ProgressDrawTarget::stderr());
        // The template is a constant, so parsing only fails if it is edited badly; fall back to
        // indicatif's default look rather than panicking.
        let style = ProgressStyle::with_template(
            "{elapsed_precise} [{wide_bar}] {human_pos}/{human_len} {msg} ({per_sec}, eta {eta})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.set_message(self.unit_label.clone());
        bar
    }

    /// Removes the bar, if one was shown, so that the summary printed next starts on a clean
    /// line. Safe to call more than once.
    pub fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.set_position(self.last_done);
            bar.finish_and_clear();
        }
    }
}

pub mod fio_json;
pub mod html;
pub mod plot;

#[cfg(test)]
mod tests;
