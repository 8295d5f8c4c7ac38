//! A device wrapper that records the bytes each command moves, bucketed by completion time:
//! the per-member bandwidth timelines of an array (SWAN Figure 6 is drawn from these), and,
//! once asked to, each command's latency inside the member (SWAN Figure 12).

use afa_report::{Measurements, OpClass, Recorder, TimelinePoint};
use afa_sim::TimeNs;
use afa_ssd::{
    BlockDevice, Command, Completion, DeviceError, DeviceInfo, HostWork, Opcode, ReadBuffers,
};

/// The most buckets a member timeline records or returns (as the run timeline's bound).
const MAX_BUCKETS: u64 = 1 << 20;

/// Forwards every call to `inner` and counts read and written bytes per time bucket.
#[derive(Debug)]
pub struct Monitored<D> {
    inner: D,
    interval_ns: u64,
    /// Bytes read and written per bucket of `interval_ns`, by completion time since
    /// `epoch_ns`.
    buckets: Vec<[u64; 2]>,
    /// Device time of the timeline's 0 (after preconditioning).
    epoch_ns: TimeNs,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Each read's and write's latency inside the member (submission to completion), from
    /// the time [`Monitored::record_latency_from`] names; `None` until then, so that runs
    /// that never ask pay nothing per command.
    latency: Option<Box<Recorder>>,
}

impl<D: BlockDevice> Monitored<D> {
    /// `interval_ns` of 0 keeps totals only.
    pub fn new(inner: D, interval_ns: u64) -> Self {
        Self {
            inner,
            interval_ns,
            buckets: Vec::new(),
            epoch_ns: 0,
            read_bytes: 0,
            write_bytes: 0,
            latency: None,
        }
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// The wrapped device, for resetting its counters between phases of a run; commands
    /// must still go through the monitor, or the timeline misses them.
    pub fn inner_mut(&mut self) -> &mut D {
        &mut self.inner
    }

    /// Forgets every byte counted so far and starts the timeline at device time
    /// `epoch_ns`, where a measured run begins after an unmeasured one (preconditioning).
    pub fn restart_at(&mut self, epoch_ns: TimeNs) {
        self.buckets.clear();
        self.epoch_ns = epoch_ns;
        self.read_bytes = 0;
        self.write_bytes = 0;
    }

    /// Starts recording the latency of every read and write that completes at or after
    /// device time `from_ns` (the end of aging), forgetting any recorded before.
    pub fn record_latency_from(&mut self, from_ns: TimeNs) {
        let mut recorder = Recorder::new(0);
        recorder.set_measure_from_ns(from_ns);
        self.latency = Some(Box::new(recorder));
    }
}

impl<D> Monitored<D> {
    /// The member's read and write latency since [`Monitored::record_latency_from`], with
    /// rates over the window up to `end_ns`; `None` if it was never asked to record.
    pub fn latency(&self, end_ns: TimeNs) -> Option<Measurements> {
        self.latency.as_ref().map(|r| r.finish(end_ns))
    }

    /// The recorder behind [`Monitored::latency`], to pool several members' latencies
    /// ([`Recorder::add_ops_of`]).
    pub fn latency_recorder(&self) -> Option<&Recorder> {
        self.latency.as_deref()
    }

    /// Read and write MB/s (10^6 bytes) per bucket, up to `end_ns` counted from the epoch.
    /// A run far longer than its buckets (a rebuild or a parity engine configured absurdly
    /// slow ends years of simulated time later) widens the output buckets by powers of two,
    /// as the run's own timeline does, so that the timeline never holds more than
    /// `MAX_BUCKETS` points.
    pub fn timeline(&self, end_ns: TimeNs) -> Vec<TimelinePoint> {
        if self.interval_ns == 0 {
            return Vec::new();
        }
        let raw = end_ns
            .div_ceil(self.interval_ns)
            .max(self.buckets.len() as u64);
        let mut factor = 1_u64;
        while raw.div_ceil(factor) > MAX_BUCKETS {
            factor *= 2;
        }
        let interval_ns = self.interval_ns.saturating_mul(factor);
        let seconds = interval_ns as f64 / 1e9;
        (0..raw.div_ceil(factor))
            .map(|b| {
                let first = (b * factor) as usize;
                let [r, w] = self
                    .buckets
                    .iter()
                    .skip(first)
                    .take(factor as usize)
                    .fold([0, 0], |[r, w], [br, bw]| [r + br, w + bw]);
                TimelinePoint {
                    t_ms: (b as f64) * interval_ns as f64 / 1e6,
                    read_mb_s: r as f64 / 1e6 / seconds,
                    write_mb_s: w as f64 / 1e6 / seconds,
                }
            })
            .collect()
    }
}

impl<D: BlockDevice> BlockDevice for Monitored<D> {
    fn info(&self) -> DeviceInfo {
        self.inner.info()
    }

    fn media_faults(&self) -> afa_nand::MediaFaults {
        self.inner.media_faults()
    }

    fn submit(
        &mut self,
        now_ns: TimeNs,
        cmd: &Command<'_>,
        out: ReadBuffers<'_>,
    ) -> Result<Completion, DeviceError> {
        let c = self.inner.submit(now_ns, cmd, out)?;
        let bytes = cmd.sectors as u64 * self.inner.info().sector_bytes as u64;
        let (lane, op) = match cmd.opcode {
            Opcode::Read => (0, OpClass::Read),
            Opcode::Write => (1, OpClass::Write),
            Opcode::Trim | Opcode::Flush => return Ok(c),
        };
        if let Some(recorder) = &mut self.latency {
            recorder.record(op, now_ns, c.done_ns, bytes);
        }
        if lane == 0 {
            self.read_bytes += bytes;
        } else {
            self.write_bytes += bytes;
        }
        if let Some(b) = (c.done_ns.saturating_sub(self.epoch_ns)).checked_div(self.interval_ns) {
            let b = b as usize;
            // Bounded like the run timeline: a bogus completion time cannot allocate without
            // limit.
            if b < MAX_BUCKETS as usize {
                if b >= self.buckets.len() {
                    self.buckets.resize(b + 1, [0, 0]);
                }
                self.buckets[b][lane] += bytes;
            }
        }
        Ok(c)
    }

    fn prefetch(&self, lba: u64, stage: u8) {
        self.inner.prefetch(lba, stage);
    }

    fn background(&mut self, now_ns: TimeNs) -> Option<TimeNs> {
        self.inner.background(now_ns)
    }

    fn convert(
        &mut self,
        now_ns: TimeNs,
        cmd: &afa_ssd::ConvertCommand,
    ) -> Result<Completion, DeviceError> {
        self.inner.convert(now_ns, cmd)
    }

    fn scan_tags(&self, lba: u64, sectors: u32) -> Option<Vec<u8>> {
        self.inner.scan_tags(lba, sectors)
    }

    fn trim_is_durable(&self) -> bool {
        self.inner.trim_is_durable()
    }

    fn allocation(&self, lba: u64, sectors: u32) -> Option<Vec<(u32, bool)>> {
        self.inner.allocation(lba, sectors)
    }

    fn take_host_work(&mut self) -> HostWork {
        self.inner.take_host_work()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn monitor(interval_ns: u64, buckets: Vec<[u64; 2]>) -> Monitored<()> {
        Monitored {
            inner: (),
            interval_ns,
            buckets,
            epoch_ns: 0,
            read_bytes: 0,
            write_bytes: 0,
            latency: None,
        }
    }

    #[test]
    fn a_timeline_has_a_point_per_bucket_up_to_the_end() {
        // 10 ms buckets: 1 MB written in the first is 100 MB/s.
        let m = monitor(10_000_000, vec![[0, 1_000_000], [500_000, 0]]);
        let t = m.timeline(35_000_000);
        assert_eq!(t.len(), 4);
        assert_eq!(
            (t[0].t_ms, t[0].write_mb_s, t[0].read_mb_s),
            (0.0, 100.0, 0.0)
        );
        assert_eq!((t[1].t_ms, t[1].read_mb_s), (10.0, 50.0));
        assert_eq!((t[3].t_ms, t[3].write_mb_s), (30.0, 0.0));
    }

    #[test]
    fn a_run_that_ends_years_later_gets_a_bounded_timeline_that_keeps_every_byte() {
        let m = monitor(10_000_000, vec![[3_000_000, 7_000_000]; 1000]);
        // About 584 years of simulated time: 1.8e12 buckets of 10 ms.
        let t = m.timeline(u64::MAX);
        assert!(t.len() as u64 <= MAX_BUCKETS, "{} points", t.len());
        let width_s = (t[1].t_ms - t[0].t_ms) / 1e3;
        let written: f64 = t.iter().map(|p| p.write_mb_s * 1e6 * width_s).sum();
        let read: f64 = t.iter().map(|p| p.read_mb_s * 1e6 * width_s).sum();
        assert!((written - 7e9).abs() < 1.0, "{written}");
        assert!((read - 3e9).abs() < 1.0, "{read}");
    }

    /// Completes every read 100 µs and every write 500 µs after its submission.
    #[derive(Debug)]
    struct FixedLatency;

    impl BlockDevice for FixedLatency {
        fn info(&self) -> DeviceInfo {
            DeviceInfo {
                sector_bytes: 4096,
                capacity_sectors: 1024,
                payload_unit_bytes: 0,
                tag_bytes_per_sector: 0,
                max_queue_depth: 64,
                max_transfer_sectors: 64,
            }
        }
        fn submit(
            &mut self,
            now_ns: TimeNs,
            cmd: &Command<'_>,
            _out: ReadBuffers<'_>,
        ) -> Result<Completion, DeviceError> {
            let latency_ns = match cmd.opcode {
                Opcode::Read => 100_000,
                _ => 500_000,
            };
            Ok(Completion {
                done_ns: now_ns + latency_ns,
                gc_active: false,
            })
        }
        fn background(&mut self, _now_ns: TimeNs) -> Option<TimeNs> {
            None
        }
    }

    #[test]
    fn latency_is_recorded_only_when_asked_and_only_from_the_named_time() {
        let mut m = Monitored::new(FixedLatency, 0);
        let submit = |m: &mut Monitored<FixedLatency>, at_ns: TimeNs, cmd: &Command<'_>| {
            m.submit(at_ns, cmd, ReadBuffers::none())
                .expect("fixed device");
        };
        submit(&mut m, 0, &Command::read(0, 1));
        assert!(
            m.latency(1_000_000).is_none(),
            "nothing asked, nothing kept"
        );
        m.record_latency_from(1_000_000);
        // Completes at 0.6 ms, before the window: left out, as aging's commands are.
        submit(&mut m, 100_000, &Command::write(0, 1, &[]));
        submit(&mut m, 2_000_000, &Command::read(0, 2));
        submit(&mut m, 2_000_000, &Command::write(8, 1, &[]));
        submit(&mut m, 2_000_000, &Command::trim(8, 1));
        let l = m.latency(3_000_000).expect("asked to record");
        assert_eq!((l.read.ios, l.read.bytes), (1, 8192));
        assert_eq!(l.write.ios, 1);
        assert_eq!(l.trim.ios, 0, "trims move no data and are not timed");
        assert_eq!(l.read.latency_us.mean, 100.0);
        assert_eq!(l.write.latency_us.p50, 500.0);
    }
}
