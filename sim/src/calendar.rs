//! The booked busy time of one resource: a flash die or channel, a CPU thread.
//!
//! Devices and engines book every operation when its command is submitted, so an operation
//! whose input is ready only later (a parity program after an in-SSD XOR, a relocation's
//! program after its read, a parity computed after its reads complete) reserves its resource
//! in the future. With a single next-free time the resource then counts as busy from now
//! until that future operation ends, and an operation that is ready at once waits behind it
//! while the resource sits idle; a real die's queue, or a polling thread, would run the ready
//! operation first. A calendar keeps the booked intervals instead, so a later-submitted
//! operation can take an idle gap it fits into whole.
//!
//! Booking stays non-preemptive: an operation that does not fit into a gap goes after the
//! booked work, as a die never interrupts an operation it has started.

use crate::TimeNs;

/// Intervals kept per resource. The oldest gap is given up (counted as busy for later
/// placement) when more are booked; a gap that old is behind the simulation's present in
/// practice, so no operation could use it anyway.
const MAX_INTERVALS: usize = 8;

/// Sorted, disjoint busy intervals `[start, end)` of one resource. Touching intervals are
/// merged, so a resource kept busy back to back holds one interval. The intervals live inline
/// (no heap), because every flash operation consults two timelines on the hot path.
#[derive(Debug, Clone, Copy, Default)]
pub struct Calendar {
    busy: [(TimeNs, TimeNs); MAX_INTERVALS],
    len: usize,
    /// The widest idle gap between two kept intervals: an operation longer than it can only
    /// go before the first interval or after the last, so most bookings on a backlogged
    /// resource skip the scan.
    widest_gap_ns: u64,
}

impl Calendar {
    #[inline]
    fn intervals(&self) -> &[(TimeNs, TimeNs)] {
        &self.busy[..self.len]
    }

    /// When the last booked operation ends (0 for a resource never used).
    #[inline]
    pub fn free_ns(&self) -> TimeNs {
        if self.len == 0 {
            0
        } else {
            self.busy[self.len - 1].1
        }
    }

    /// Whether nothing is booked at time `at_ns`.
    #[inline]
    pub fn idle_at(&self, at_ns: TimeNs) -> bool {
        let busy = self.intervals();
        let i = busy.partition_point(|&(_, end)| end <= at_ns);
        i == busy.len() || busy[i].0 > at_ns
    }

    /// The earliest start at or after `ready_ns` of an operation lasting `duration_ns`: in
    /// the first idle gap that holds it whole, or after everything booked.
    #[inline]
    pub fn earliest_start(&self, ready_ns: TimeNs, duration_ns: u64) -> TimeNs {
        let free_ns = self.free_ns();
        if ready_ns >= free_ns {
            return ready_ns;
        }
        if ready_ns + duration_ns <= self.busy[0].0 {
            return ready_ns;
        }
        if duration_ns > self.widest_gap_ns {
            return free_ns;
        }
        let mut start = ready_ns;
        for &(busy_start, busy_end) in self.intervals() {
            if busy_end <= start {
                continue;
            }
            if start + duration_ns <= busy_start {
                return start;
            }
            start = busy_end;
        }
        start
    }

    /// Books an operation lasting `duration_ns` at its earliest start at or after
    /// `ready_ns`; returns when it ends.
    #[inline]
    pub fn book(&mut self, ready_ns: TimeNs, duration_ns: u64) -> TimeNs {
        let start = self.earliest_start(ready_ns, duration_ns);
        self.reserve(start, start + duration_ns);
        start + duration_ns
    }

    /// Whether `[start_ns, end_ns)` holds no booked time.
    #[inline]
    pub fn is_free(&self, start_ns: TimeNs, end_ns: TimeNs) -> bool {
        let busy = self.intervals();
        let i = busy.partition_point(|&(_, end)| end <= start_ns);
        i == busy.len() || busy[i].0 >= end_ns
    }

    /// How much of `[start_ns, end_ns)` is booked.
    pub fn busy_within(&self, start_ns: TimeNs, end_ns: TimeNs) -> u64 {
        self.intervals()
            .iter()
            .map(|&(s, e)| e.min(end_ns).saturating_sub(s.max(start_ns)))
            .sum()
    }

    /// The end of the booked interval holding `at_ns`, or `at_ns` itself when nothing is
    /// booked then (touching intervals are one, so this is when the resource next falls idle).
    pub fn busy_until(&self, at_ns: TimeNs) -> TimeNs {
        let busy = self.intervals();
        let i = busy.partition_point(|&(_, end)| end <= at_ns);
        match busy.get(i) {
            Some(&(start, end)) if start <= at_ns => end,
            _ => at_ns,
        }
    }

    /// Books `[start_ns, end_ns)`, merging it with the intervals it touches.
    #[inline]
    pub fn reserve(&mut self, start_ns: TimeNs, end_ns: TimeNs) {
        if start_ns >= end_ns {
            return;
        }
        // The common case: the operation goes at or after the end of everything booked.
        let free_ns = self.free_ns();
        if start_ns >= free_ns {
            if self.len > 0 && start_ns == free_ns {
                self.busy[self.len - 1].1 = end_ns;
            } else {
                self.push(start_ns, end_ns);
            }
            return;
        }
        self.reserve_inside(start_ns, end_ns);
    }

    /// Appends an interval after the last one, giving up the oldest gap when full.
    #[inline]
    fn push(&mut self, start_ns: TimeNs, end_ns: TimeNs) {
        if self.len == MAX_INTERVALS {
            self.busy[0].1 = self.busy[1].1;
            self.busy.copy_within(2.., 1);
            self.len -= 1;
            self.measure_gaps();
        }
        if self.len > 0 {
            let gap_ns = start_ns - self.busy[self.len - 1].1;
            self.widest_gap_ns = self.widest_gap_ns.max(gap_ns);
        }
        self.busy[self.len] = (start_ns, end_ns);
        self.len += 1;
    }

    fn measure_gaps(&mut self) {
        self.widest_gap_ns = self.busy[..self.len]
            .windows(2)
            .map(|w| w[1].0 - w[0].1)
            .max()
            .unwrap_or(0);
    }

    /// Books an interval that starts before the last booked end: into a gap, or overlapping
    /// or touching booked intervals, which it merges with.
    fn reserve_inside(&mut self, start_ns: TimeNs, end_ns: TimeNs) {
        self.place_inside(start_ns, end_ns);
        self.measure_gaps();
    }

    fn place_inside(&mut self, start_ns: TimeNs, end_ns: TimeNs) {
        let len = self.len;
        // The first interval that overlaps or touches the new one, and the first past it.
        let first = self.busy[..len].partition_point(|&(_, end)| end < start_ns);
        let mut past = first;
        let (mut start, mut end) = (start_ns, end_ns);
        while past < len && self.busy[past].0 <= end {
            start = start.min(self.busy[past].0);
            end = end.max(self.busy[past].1);
            past += 1;
        }
        if past == first {
            // A new interval inside a gap: make room for it, giving up the oldest gap when
            // the timeline is full.
            let mut at = first;
            if len == MAX_INTERVALS {
                if at == 0 {
                    // Older than every interval kept: it merges into the first one.
                    self.busy[0].0 = start;
                    return;
                }
                self.busy[0].1 = self.busy[1].1;
                self.busy.copy_within(2..len, 1);
                self.len -= 1;
                if at == 1 {
                    // It lay in the gap just given up, which now counts as busy.
                    return;
                }
                at -= 1;
            }
            self.busy.copy_within(at..self.len, at + 1);
            self.busy[at] = (start, end);
            self.len += 1;
        } else {
            self.busy[first] = (start, end);
            self.busy.copy_within(past..len, first + 1);
            self.len -= past - first - 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_time_within_a_range_and_the_end_of_the_interval_holding_an_instant() {
        let mut c = Calendar::default();
        c.reserve(10, 20);
        c.reserve(20, 30);
        c.reserve(50, 60);
        assert_eq!(c.busy_within(0, 100), 30);
        assert_eq!(c.busy_within(15, 55), 20);
        assert_eq!(c.busy_within(30, 50), 0);
        // Touching intervals are one: the resource is busy from 10 until 30.
        assert_eq!(c.busy_until(12), 30);
        assert_eq!(c.busy_until(40), 40);
        assert_eq!(c.busy_until(59), 60);
        assert_eq!(c.busy_until(60), 60);
    }

    #[test]
    fn a_short_operation_fills_the_gap_before_a_future_booking() {
        let mut t = Calendar::default();
        t.reserve(100, 200);
        assert_eq!(t.earliest_start(10, 50), 10);
        assert_eq!(t.free_ns().max(10), 200);
        // Too long for the gap: it goes after the booked work, never through it.
        assert_eq!(t.earliest_start(10, 91), 200);
        // Exactly filling the gap is allowed.
        assert_eq!(t.earliest_start(10, 90), 10);
    }

    #[test]
    fn reserving_merges_touching_and_overlapping_intervals() {
        let mut t = Calendar::default();
        t.reserve(100, 200);
        t.reserve(300, 400);
        t.reserve(200, 300);
        assert_eq!(t.intervals(), [(100, 400)]);
        t.reserve(50, 60);
        t.reserve(55, 120);
        assert_eq!(t.intervals(), [(50, 400)]);
        assert!(t.is_free(0, 50));
        assert!(!t.is_free(0, 51));
        assert!(t.is_free(400, 500));
        assert!(t.idle_at(400));
        assert!(!t.idle_at(399));
        assert_eq!(t.free_ns(), 400);
    }

    #[test]
    fn the_oldest_gap_is_given_up_beyond_the_interval_limit() {
        let mut t = Calendar::default();
        for i in 0..=MAX_INTERVALS as u64 {
            t.reserve(i * 100, i * 100 + 10);
        }
        assert_eq!(t.len, MAX_INTERVALS);
        assert_eq!(t.busy[0], (0, 110));
        // The lost gap no longer takes an operation; later gaps still do.
        assert_eq!(t.earliest_start(20, 5), 110);
        assert_eq!(t.earliest_start(120, 5), 120);
    }

    /// The calendar's rule written plainly: merge the new interval with every one it
    /// overlaps or touches; when that leaves more than `MAX_INTERVALS`, give up the oldest
    /// gap. A new interval that lies in the oldest gap itself is inside what is given up.
    fn reference_reserve(kept: &mut Vec<(TimeNs, TimeNs)>, start_ns: TimeNs, end_ns: TimeNs) {
        if start_ns >= end_ns {
            return;
        }
        let (mut start, mut end) = (start_ns, end_ns);
        kept.retain(|&(s, e)| {
            let apart = e < start_ns || s > end_ns;
            if !apart {
                start = start.min(s);
                end = end.max(e);
            }
            apart
        });
        let at = kept.partition_point(|&(s, _)| s < start);
        kept.insert(at, (start, end));
        if kept.len() > MAX_INTERVALS {
            let through = if at == 1 { 2 } else { 1 };
            kept[0].1 = kept[through].1;
            kept.drain(1..=through);
        }
    }

    proptest::proptest! {
        /// Long runs of bookings, mostly apart so that the calendar is often full, against
        /// the rule written plainly: the same intervals and the same widest gap after every
        /// booking, and the same earliest start for a probe.
        #[test]
        fn a_full_calendar_gives_up_its_oldest_gap_as_the_rule_says(
            ops in proptest::collection::vec(
                (0u64..4_000, 1u64..60, 0u64..3, 1u64..80), 1..400)
        ) {
            let mut t = Calendar::default();
            let mut kept: Vec<(TimeNs, TimeNs)> = Vec::new();
            let mut now = 0;
            for (offset, duration, how, probe) in ops {
                // Mostly forward in time, as a simulation books, sometimes into the past.
                let start = match how {
                    0 => now + offset % 200,
                    1 => t.earliest_start(now.saturating_sub(offset), duration),
                    _ => offset,
                };
                t.reserve(start, start + duration);
                reference_reserve(&mut kept, start, start + duration);
                now = now.max(start);
                proptest::prop_assert_eq!(t.intervals(), &kept[..]);
                let widest = kept.windows(2).map(|w| w[1].0 - w[0].1).max().unwrap_or(0);
                proptest::prop_assert_eq!(t.widest_gap_ns, widest);
                let ready = now.saturating_sub(probe * 10);
                let mut first_fit = ready;
                for &(busy_start, busy_end) in &kept {
                    if busy_end <= first_fit {
                        continue;
                    }
                    if first_fit + probe <= busy_start {
                        break;
                    }
                    first_fit = busy_end;
                }
                proptest::prop_assert_eq!(t.earliest_start(ready, probe), first_fit);
            }
        }

        /// Against a naive calendar of every booked nanosecond: the intervals stay sorted,
        /// disjoint and apart; everything booked stays busy; and an operation is placed only
        /// where the calendar is free, at or after its input is ready.
        #[test]
        fn bookings_never_overlap_and_are_never_forgotten(
            ops in proptest::collection::vec((0u64..400, 1u64..40, proptest::bool::ANY), 1..60)
        ) {
            let mut t = Calendar::default();
            let mut calendar = vec![false; 2_000];
            for (ready, duration, fill_gaps) in ops {
                let start = if fill_gaps {
                    let start = t.earliest_start(ready, duration);
                    // The shortcuts agree with a plain first-fit scan of the gaps.
                    let mut first_fit = ready;
                    for &(busy_start, busy_end) in t.intervals() {
                        if busy_end <= first_fit {
                            continue;
                        }
                        if first_fit + duration <= busy_start {
                            break;
                        }
                        first_fit = busy_end;
                    }
                    proptest::prop_assert_eq!(start, first_fit);
                    start
                } else {
                    ready.max(t.free_ns())
                };
                proptest::prop_assert!(start >= ready);
                proptest::prop_assert!(t.is_free(start, start + duration));
                proptest::prop_assert!(
                    calendar[start as usize..(start + duration) as usize].iter().all(|b| !b)
                );
                t.reserve(start, start + duration);
                calendar[start as usize..(start + duration) as usize].fill(true);
                let busy = t.intervals();
                for pair in busy.windows(2) {
                    proptest::prop_assert!(pair[0].0 < pair[0].1 && pair[0].1 < pair[1].0);
                }
                let widest = busy.windows(2).map(|w| w[1].0 - w[0].1).max().unwrap_or(0);
                proptest::prop_assert_eq!(t.widest_gap_ns, widest);
                for (ns, &booked) in calendar.iter().enumerate() {
                    if booked {
                        proptest::prop_assert!(!t.idle_at(ns as u64), "{ns} forgotten");
                    }
                }
            }
        }
    }
}
