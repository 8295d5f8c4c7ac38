//! fio's latency-target search (`latency_target`, `latency_window`, `latency_percentile`,
//! `latency_run`; the `lat_target_*` functions of fio's `io_u.c`): the job looks for the
//! deepest queue at which `latency_percentile` percent of its requests complete within
//! `latency_target`.
//!
//! It starts at depth 1. Each window (`latency_window` of time, counted from the window's
//! start) whose share of requests within the target reaches the percentile raises the depth:
//! it doubles until a window first fails, and is then bisected between the last depth that
//! passed and the lowest that failed. A failed window (or, at the 100th percentile, any one
//! request over the target) halves the way back towards the last depth that passed, and the
//! job first lets every request in flight complete (fio's `io_u_quiesce`), so that requests
//! issued at the deeper queue do not fail the shallower one. When a passing window leaves the
//! depth where it was, the search has converged: the job runs one more window at that depth
//! and ends (unless `latency_run` keeps it searching until its runtime). A request over the
//! target at depth 1 and the 100th percentile is fatal, as in fio.

use afa_sim::TimeNs;

/// The most changes of depth a search keeps for its report.
const STEPS_KEPT_MAX: usize = 10_000;

/// What a completion, or the end of a window, means for the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Go on at the current depth.
    Continue,
    /// The depth went up: fill the queue to it.
    Deeper,
    /// The depth went down, or the final window is about to start: issue nothing until
    /// every request in flight has completed, then call [`LatencySearch::quiesced`].
    Quiesce,
    /// The search is over: the job ends as its runtime would end it.
    Done,
    /// A request took longer than the target at depth 1: the job fails.
    Fatal,
}

/// One job clone's search.
#[derive(Debug, Clone)]
pub(crate) struct LatencySearch {
    target_ns: u64,
    window_ns: u64,
    percentile: f64,
    /// `latency_run`: keep adjusting the depth for the whole run instead of ending once the
    /// search converges.
    keep_searching: bool,
    iodepth: u32,
    depth: u32,
    depth_low: u32,
    depth_high: u32,
    /// Passing windows in a row at the depth just below `depth_high`.
    stable_count: u32,
    window_start_ns: TimeNs,
    /// Completions counted before the window started, and the ones in it over the target.
    window_ios_mark: u64,
    window_failed: u64,
    /// The window at the depth found is running (fio's `latency_end_run`).
    final_run: bool,
    quiescing: bool,
    /// The final run's start, and its completions and their summed latency, for the report.
    final_run_start_ns: Option<TimeNs>,
    final_run_ios: u64,
    final_run_latency_ns: u128,
    /// The start and the changes of depth, with their times: the first
    /// [`STEPS_KEPT_MAX`] of them, and how many changes there were in all.
    steps: Vec<(TimeNs, u32)>,
    depth_changes: u64,
    converged: bool,
    /// The last completion the search saw: where its record of depths ends.
    last_completion_ns: TimeNs,
}

impl LatencySearch {
    pub(crate) fn new(
        target_ns: u64,
        window_ns: u64,
        percentile: f64,
        keep_searching: bool,
        iodepth: u32,
    ) -> LatencySearch {
        LatencySearch {
            target_ns,
            window_ns,
            percentile,
            keep_searching,
            iodepth: iodepth.max(1),
            depth: 1,
            depth_low: 1,
            depth_high: iodepth.max(1),
            stable_count: 0,
            window_start_ns: 0,
            window_ios_mark: 0,
            window_failed: 0,
            final_run: false,
            quiescing: false,
            final_run_start_ns: None,
            final_run_ios: 0,
            final_run_latency_ns: 0,
            steps: vec![(0, 1)],
            depth_changes: 0,
            last_completion_ns: 0,
            converged: false,
        }
    }

    /// The job starts at `now_ns`, having completed `ios` requests so far: the first window
    /// starts.
    pub(crate) fn start(&mut self, now_ns: TimeNs, ios: u64) {
        self.steps = vec![(now_ns, self.depth)];
        self.new_window(now_ns, ios);
    }

    pub(crate) fn target_ns(&self) -> u64 {
        self.target_ns
    }

    /// The most requests the job may have in flight now.
    pub(crate) fn depth(&self) -> u32 {
        self.depth
    }

    /// The job waits for its requests in flight before it issues more.
    pub(crate) fn quiescing(&self) -> bool {
        self.quiescing
    }

    /// A request completed at `now_ns` after `latency_ns`; `ios` counts the job's completed
    /// requests, this one included. Completions while the job quiesces count towards the
    /// window that follows but fail no depth: they were issued at the deeper queue.
    pub(crate) fn completed(&mut self, now_ns: TimeNs, latency_ns: u64, ios: u64) -> Verdict {
        self.last_completion_ns = now_ns;
        if self.final_run_start_ns.is_some() && !self.quiescing {
            self.final_run_ios += 1;
            self.final_run_latency_ns += u128::from(latency_ns);
        }
        // Once the search is over, the requests still in flight as the job ends judge
        // nothing.
        if self.quiescing || self.converged {
            return Verdict::Continue;
        }
        if latency_ns > self.target_ns {
            if self.percentile >= 100.0 {
                if self.depth == 1 {
                    return Verdict::Fatal;
                }
                self.ramp_down(now_ns);
                return Verdict::Quiesce;
            }
            self.window_failed += 1;
        }
        self.check_window(now_ns, ios)
    }

    /// Every request in flight has completed after a [`Verdict::Quiesce`]: the next window
    /// starts now.
    pub(crate) fn quiesced(&mut self, now_ns: TimeNs, ios: u64) {
        self.quiescing = false;
        if self.final_run && self.final_run_start_ns.is_none() {
            self.final_run_start_ns = Some(now_ns);
        }
        self.new_window(now_ns, ios);
    }

    /// fio's `lat_target_check`: once the window has lasted `latency_window`, its share of
    /// requests within the target raises the depth or lowers it. A window with no completion
    /// is not judged (fio's share would be 0/0).
    fn check_window(&mut self, now_ns: TimeNs, ios: u64) -> Verdict {
        if now_ns - self.window_start_ns < self.window_ns {
            return Verdict::Continue;
        }
        let window_ios = ios - self.window_ios_mark;
        if window_ios == 0 {
            return Verdict::Continue;
        }
        let success_percent =
            100.0 * (window_ios - self.window_failed.min(window_ios)) as f64 / window_ios as f64;
        if success_percent >= self.percentile {
            self.success(now_ns, ios)
        } else if self.depth == 1 {
            // fio leaves a failing window at depth 1 as it is: there is no shallower queue.
            Verdict::Continue
        } else {
            self.ramp_down(now_ns);
            Verdict::Quiesce
        }
    }

    /// fio's `lat_target_success`.
    fn success(&mut self, now_ns: TimeNs, ios: u64) -> Verdict {
        let before = self.depth;
        self.depth_low = self.depth;
        if self.depth + 1 == self.depth_high {
            // The depth cannot rise by bisection any more; fio raises the ceiling by one
            // after three passing windows in a row so that the depth found is not left below
            // what the target allows.
            self.stable_count += 1;
            if self.stable_count >= 3 {
                self.depth_high += 1;
                self.stable_count = 0;
            }
        }
        self.depth = if self.depth_high != self.iodepth {
            (self.depth + self.depth_high) / 2
        } else {
            self.depth * 2
        }
        .min(self.iodepth);
        if self.depth != before {
            self.record_step(now_ns);
        }
        if !self.keep_searching && self.depth == before {
            if self.final_run {
                self.converged = true;
                return Verdict::Done;
            }
            // Converged: one more window at this depth, whose numbers are the result.
            self.final_run = true;
            self.quiescing = true;
            return Verdict::Quiesce;
        }
        self.new_window(now_ns, ios);
        if self.depth > before {
            Verdict::Deeper
        } else {
            Verdict::Continue
        }
    }

    /// fio's `__lat_target_failed`, at a depth above 1 (the callers handle depth 1).
    fn ramp_down(&mut self, now_ns: TimeNs) {
        self.depth_high = self.depth;
        if self.depth == self.depth_low {
            self.depth_low = self.depth_low.saturating_sub(1).max(1);
        }
        self.depth = ((self.depth + self.depth_low) / 2).max(1);
        self.stable_count = 0;
        self.record_step(now_ns);
        self.quiescing = true;
    }

    /// Counts a change of depth and keeps it while the record has room: with `latency_run`
    /// and a short window a run may change depth at most completions.
    fn record_step(&mut self, now_ns: TimeNs) {
        self.depth_changes += 1;
        if self.steps.len() < STEPS_KEPT_MAX {
            self.steps.push((now_ns, self.depth));
        }
    }

    fn new_window(&mut self, now_ns: TimeNs, ios: u64) {
        self.window_start_ns = now_ns;
        self.window_ios_mark = ios;
        self.window_failed = 0;
    }

    /// What the search found, for the report.
    pub(crate) fn report(&self, job: String) -> afa_report::LatencyTargetReport {
        let seconds = |ns: u64| ns as f64 / 1e9;
        afa_report::LatencyTargetReport {
            job,
            target_us: self.target_ns as f64 / 1e3,
            window_s: seconds(self.window_ns),
            percentile: self.percentile,
            depth: self.depth,
            converged: self.converged,
            final_run_start_s: self.final_run_start_ns.map(seconds),
            final_run_ios: self.final_run_ios,
            final_run_latency_mean_us: if self.final_run_ios == 0 {
                0.0
            } else {
                self.final_run_latency_ns as f64 / self.final_run_ios as f64 / 1e3
            },
            depth_changes: self.depth_changes,
            last_completion_s: seconds(self.last_completion_ns),
            steps: self
                .steps
                .iter()
                .map(|&(at_ns, depth)| (seconds(at_ns), depth))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// Feeds `search` one window of `n` completions at `latency_ns` each, spread over the
    /// window, starting at `*now`; returns the last verdict and moves `*now` and `*ios` on.
    fn window(
        search: &mut LatencySearch,
        now: &mut TimeNs,
        ios: &mut u64,
        n: u64,
        latency_ns: u64,
    ) -> Verdict {
        let mut verdict = Verdict::Continue;
        for _ in 0..n {
            *now += 10 * MS / n;
            *ios += 1;
            verdict = search.completed(*now, latency_ns, *ios);
            if verdict != Verdict::Continue {
                break;
            }
        }
        if verdict == Verdict::Quiesce {
            search.quiesced(*now, *ios);
        }
        verdict
    }

    #[test]
    fn the_depth_doubles_then_bisects_and_the_search_ends_after_a_final_window() {
        // Requests meet the target at depths up to 5 and miss it from 6 on.
        let mut search = LatencySearch::new(MS, 10 * MS, 100.0, false, 32);
        search.start(0, 0);
        let (mut now, mut ios) = (0, 0);
        let mut verdicts = Vec::new();
        for _ in 0..20 {
            let latency = if search.depth() <= 5 { MS / 2 } else { 2 * MS };
            let verdict = window(&mut search, &mut now, &mut ios, 10, latency);
            verdicts.push((verdict, search.depth()));
            if verdict == Verdict::Done {
                break;
            }
        }
        let depths: Vec<u32> = search.steps.iter().map(|s| s.1).collect();
        // 1 → 2 → 4 → 8 (fails) → 6 (fails) → 5, which passes, stays, and passes its final
        // window.
        assert_eq!(depths, [1, 2, 4, 8, 6, 5]);
        assert_eq!(search.depth(), 5);
        assert!(search.converged);
        assert_eq!(verdicts.last().unwrap().0, Verdict::Done);
        let report = search.report("j".into());
        assert!(report.final_run_start_s.is_some());
        assert_eq!(report.final_run_latency_mean_us, 500.0);
    }

    #[test]
    fn a_percentile_below_100_tolerates_its_share_of_slow_requests() {
        let mut search = LatencySearch::new(MS, 10 * MS, 90.0, true, 8);
        search.start(0, 0);
        let (mut now, mut ios) = (0, 0);
        // One request in ten over the target: 90% within it passes.
        for _ in 0..9 {
            now += MS;
            ios += 1;
            assert_eq!(search.completed(now, MS / 2, ios), Verdict::Continue);
        }
        now += MS;
        ios += 1;
        assert_eq!(search.completed(now, 3 * MS, ios), Verdict::Deeper);
        assert_eq!(search.depth(), 2);
        // Two in ten fail the window.
        for i in 0..10 {
            now += MS;
            ios += 1;
            let latency = if i < 2 { 3 * MS } else { MS / 2 };
            let verdict = search.completed(now, latency, ios);
            assert_eq!(verdict == Verdict::Quiesce, i == 9, "{i}: {verdict:?}");
        }
        assert_eq!(search.depth(), 1);
        assert!(search.quiescing());
        // Completions while it quiesces fail nothing.
        assert_eq!(
            search.completed(now + 1, 9 * MS, ios + 1),
            Verdict::Continue
        );
        search.quiesced(now + 1, ios + 1);
        assert!(!search.quiescing());
    }

    #[test]
    fn a_slow_request_at_depth_one_is_fatal_at_the_100th_percentile() {
        let mut search = LatencySearch::new(MS, 10 * MS, 100.0, false, 4);
        search.start(0, 0);
        assert_eq!(search.completed(MS, 2 * MS, 1), Verdict::Fatal);
    }
}
