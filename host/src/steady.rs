//! fio's steady-state detection (`steadystate.c`): a job, or a stonewall group with
//! `group_reporting`, is sampled every check interval, and ends as its runtime would end it
//! once the last window of samples meets the criterion ([`SteadyState`]).

use afa_report::SteadyStateReport;
use afa_sim::TimeNs;
use afa_workload::fio::{SteadyMetric, SteadyState};

const NS_PER_S: u128 = 1_000_000_000;

/// What one job or group has been through: its window of samples and the last verdict.
#[derive(Debug, Clone)]
pub(crate) struct SteadyTracker {
    spec: SteadyState,
    /// The name the report gives it ([`SteadyStateReport::job`]).
    job: String,
    /// The stonewall group whose start starts its clock.
    pub(crate) group: usize,
    /// The streams whose completions it counts and which it ends.
    pub(crate) streams: Vec<u32>,
    started_ns: TimeNs,
    /// The streams' totals at the previous check.
    prev_ios: u64,
    prev_bytes: u64,
    /// The window, oldest sample first, in requests and bytes per second.
    iops: std::collections::VecDeque<u64>,
    bw_bytes_s: std::collections::VecDeque<u64>,
    criterion: Option<f64>,
    max_deviation: f64,
    slope: f64,
    attained_ns: Option<TimeNs>,
}

impl SteadyTracker {
    pub(crate) fn new(spec: SteadyState, job: String, group: usize) -> SteadyTracker {
        // The window fills one sample per interval, so a long one is not reserved up front.
        let window = spec.window_samples().min(4096);
        SteadyTracker {
            spec,
            job,
            group,
            streams: Vec::new(),
            started_ns: 0,
            prev_ios: 0,
            prev_bytes: 0,
            iops: std::collections::VecDeque::with_capacity(window + 1),
            bw_bytes_s: std::collections::VecDeque::with_capacity(window + 1),
            criterion: None,
            max_deviation: 0.0,
            slope: 0.0,
            attained_ns: None,
        }
    }

    /// The group started at `now_ns`; returns when the first check is due. Its streams have
    /// completed nothing yet.
    pub(crate) fn start(&mut self, now_ns: TimeNs) -> TimeNs {
        self.started_ns = now_ns;
        now_ns.saturating_add(self.spec.interval_ns)
    }

    /// When the check after the one at `now_ns` is due.
    pub(crate) fn next_check_ns(&self, now_ns: TimeNs) -> TimeNs {
        now_ns.saturating_add(self.spec.interval_ns)
    }

    /// The check at `now_ns`, given the requests and bytes the streams have completed so
    /// far: turns what completed since the last check into a sample once the ramp is over
    /// (the first sample is the interval that starts at or after its end, as fio begins
    /// recording one interval after `ss_ramp`), and judges the window once it is full.
    /// Returns whether steady state is attained now.
    pub(crate) fn check(&mut self, now_ns: TimeNs, ios: u64, bytes: u64) -> bool {
        let (new_ios, new_bytes) = (ios - self.prev_ios, bytes - self.prev_bytes);
        (self.prev_ios, self.prev_bytes) = (ios, bytes);
        let elapsed_ns = now_ns - self.started_ns;
        if elapsed_ns < self.spec.ramp_ns.saturating_add(self.spec.interval_ns) {
            return false;
        }
        // Rates per second, in whole units as fio keeps them.
        let interval_ns = u128::from(self.spec.interval_ns.max(1));
        let per_s =
            |n: u64| u64::try_from(u128::from(n) * NS_PER_S / interval_ns).unwrap_or(u64::MAX);
        self.iops.push_back(per_s(new_ios));
        self.bw_bytes_s.push_back(per_s(new_bytes));
        let window = self.spec.window_samples();
        while self.iops.len() > window {
            self.iops.pop_front();
            self.bw_bytes_s.pop_front();
        }
        if self.iops.len() < window {
            return false;
        }
        let samples = match self.spec.metric {
            SteadyMetric::Iops => &self.iops,
            SteadyMetric::Bandwidth => &self.bw_bytes_s,
        };
        let (measure, attained) = judge(&self.spec, samples);
        if self.spec.slope {
            self.slope = measure;
        } else {
            self.max_deviation = measure;
        }
        self.criterion = criterion(&self.spec, measure, samples);
        if attained {
            self.attained_ns = Some(now_ns);
        }
        attained
    }

    pub(crate) fn report(&self) -> SteadyStateReport {
        let seconds = |ns: u64| ns as f64 / 1e9;
        SteadyStateReport {
            job: self.job.clone(),
            group: self.group,
            ss: self.spec.describe(),
            duration_s: seconds(self.spec.duration_ns),
            ramp_s: seconds(self.spec.ramp_ns),
            interval_s: seconds(self.spec.interval_ns),
            attained: self.attained_ns.is_some(),
            attained_at_s: self.attained_ns.map(seconds),
            criterion: self.criterion,
            criterion_is_percent: self.spec.limit_is_percent,
            max_deviation: self.max_deviation,
            slope: self.slope,
            window_samples: self.spec.window_samples(),
            iops: self.iops.iter().copied().collect(),
            bw_bytes_s: self.bw_bytes_s.iter().copied().collect(),
        }
    }
}

/// A full window's measure (its least-squares slope against the sample index, or its
/// largest deviation from its mean) and whether the criterion it gives is below the limit.
/// A percentage of a mean of 0 is no criterion at all, so it is never met.
fn judge(spec: &SteadyState, samples: &std::collections::VecDeque<u64>) -> (f64, bool) {
    let measure = if spec.slope {
        least_squares_slope(samples)
    } else {
        max_deviation(samples)
    };
    let attained = criterion(spec, measure, samples).is_some_and(|c| c.abs() < spec.limit);
    (measure, attained)
}

/// The criterion from a window's measure: the measure itself, or its percentage of the
/// window's mean; `None` when that mean is 0.
fn criterion(
    spec: &SteadyState,
    measure: f64,
    samples: &std::collections::VecDeque<u64>,
) -> Option<f64> {
    if !spec.limit_is_percent {
        return Some(measure);
    }
    let mean = mean(samples);
    (mean > 0.0).then(|| 100.0 * measure / mean)
}

fn mean(samples: &std::collections::VecDeque<u64>) -> f64 {
    samples.iter().map(|&y| y as f64).sum::<f64>() / samples.len().max(1) as f64
}

/// The largest distance of a sample from the samples' mean.
fn max_deviation(samples: &std::collections::VecDeque<u64>) -> f64 {
    let mean = mean(samples);
    samples
        .iter()
        .map(|&y| (y as f64 - mean).abs())
        .fold(0.0, f64::max)
}

/// The least-squares slope of the samples against their index 0, 1, ..., n - 1, in the
/// samples' unit per sample. The parser refuses a slope over fewer than two samples, for
/// which it is undefined.
fn least_squares_slope(samples: &std::collections::VecDeque<u64>) -> f64 {
    let n = samples.len() as f64;
    let sum_x = n * (n - 1.0) / 2.0;
    let sum_x_sq = (n - 1.0) * n * (2.0 * n - 1.0) / 6.0;
    let (sum_y, sum_xy) = samples
        .iter()
        .enumerate()
        .fold((0.0, 0.0), |(sy, sxy), (x, &y)| {
            (sy + y as f64, sxy + x as f64 * y as f64)
        });
    (sum_xy - sum_x * sum_y / n) / (sum_x_sq - sum_x * sum_x / n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(slope: bool, limit: f64, percent: bool) -> SteadyState {
        SteadyState {
            metric: SteadyMetric::Iops,
            slope,
            limit,
            limit_is_percent: percent,
            duration_ns: 4_000_000_000,
            ramp_ns: 0,
            interval_ns: 1_000_000_000,
        }
    }

    #[test]
    fn the_slope_is_the_least_squares_fit_of_the_window() {
        let samples: std::collections::VecDeque<u64> = [10, 12, 14, 16].into();
        assert!((least_squares_slope(&samples) - 2.0).abs() < 1e-12);
        let noisy: std::collections::VecDeque<u64> = [100, 98, 104, 102].into();
        // x̄ = 1.5, ȳ = 101; Σ(x - x̄)(y - ȳ) = 1.5 + 1.5 + 1.5 + 1.5 = 6; Σ(x - x̄)² = 5.
        assert!((least_squares_slope(&noisy) - 1.2).abs() < 1e-12);
        let level: std::collections::VecDeque<u64> = [100, 104, 98, 102].into();
        assert!(least_squares_slope(&level).abs() < 1e-12);
        assert!((max_deviation(&noisy) - 3.0).abs() < 1e-12);
    }

    #[test]
    fn samples_start_after_the_ramp_and_the_full_window_is_judged() {
        let mut s = spec(false, 5.0, true);
        s.ramp_ns = 2_000_000_000;
        let mut tracker = SteadyTracker::new(s, "j".into(), 0);
        assert_eq!(tracker.start(0), 1_000_000_000);
        // Two intervals of ramp: counted but not sampled.
        assert!(!tracker.check(1_000_000_000, 50, 50 * 4096));
        assert!(!tracker.check(2_000_000_000, 100, 100 * 4096));
        // Four samples of 100, 100, 100, 104 requests per second: within 5% of the mean.
        let mut ios = 100;
        for (second, per_s) in [(3, 100), (4, 100), (5, 100)] {
            ios += per_s;
            assert!(!tracker.check(second * 1_000_000_000, ios, ios * 4096));
        }
        assert!(tracker.check(6_000_000_000, ios + 104, (ios + 104) * 4096));
        let report = tracker.report();
        assert_eq!(report.iops, vec![100, 100, 100, 104]);
        assert_eq!(report.bw_bytes_s, vec![409_600, 409_600, 409_600, 425_984]);
        assert_eq!(report.attained_at_s, Some(6.0));
        assert!((report.max_deviation - 3.0).abs() < 1e-12);
        assert!((report.criterion.unwrap() - 300.0 / 101.0).abs() < 1e-9);
    }

    #[test]
    fn a_rising_rate_is_not_steady_and_the_window_slides() {
        let mut tracker = SteadyTracker::new(spec(true, 1.0, true), "j".into(), 0);
        tracker.start(0);
        let mut ios = 0;
        for second in 1..=8u64 {
            ios += 100 * second;
            assert!(!tracker.check(second * 1_000_000_000, ios, ios));
        }
        let report = tracker.report();
        assert_eq!(report.iops, vec![500, 600, 700, 800]);
        assert!((report.slope - 100.0).abs() < 1e-9);
        assert!(!report.attained);
        // An absolute limit above the slope is met.
        let mut lenient = SteadyTracker::new(spec(true, 101.0, false), "j".into(), 0);
        lenient.start(0);
        let mut ios = 0;
        let attained: Vec<bool> = (1..=4u64)
            .map(|second| {
                ios += 100 * second;
                lenient.check(second * 1_000_000_000, ios, ios)
            })
            .collect();
        assert_eq!(attained, [false, false, false, true]);
    }

    #[test]
    fn a_percentage_of_an_idle_window_is_never_met() {
        let mut tracker = SteadyTracker::new(spec(false, 50.0, true), "j".into(), 0);
        tracker.start(0);
        for second in 1..=6u64 {
            assert!(!tracker.check(second * 1_000_000_000, 0, 0));
        }
        assert_eq!(tracker.report().criterion, None);
    }
}
