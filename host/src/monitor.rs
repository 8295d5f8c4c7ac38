//! A device wrapper that records the bytes each command moves, bucketed by completion time:
//! the per-member bandwidth timelines of an array (SWAN Figure 6 is drawn from these).

use afa_report::TimelinePoint;
use afa_sim::TimeNs;
use afa_ssd::{
    BlockDevice, Command, Completion, DeviceError, DeviceInfo, HostWork, Opcode, ReadBuffers,
};

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

    /// Read and write MB/s (10^6 bytes) per bucket, up to `end_ns` counted from the epoch.
    pub fn timeline(&self, end_ns: TimeNs) -> Vec<TimelinePoint> {
        if self.interval_ns == 0 {
            return Vec::new();
        }
        let buckets = end_ns.div_ceil(self.interval_ns) as usize;
        let seconds = self.interval_ns as f64 / 1e9;
        (0..buckets.max(self.buckets.len()))
            .map(|b| {
                let [r, w] = self.buckets.get(b).copied().unwrap_or([0, 0]);
                TimelinePoint {
                    t_ms: (b as u64 * self.interval_ns) as f64 / 1e6,
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

    fn submit(
        &mut self,
        now_ns: TimeNs,
        cmd: &Command<'_>,
        out: ReadBuffers<'_>,
    ) -> Result<Completion, DeviceError> {
        let c = self.inner.submit(now_ns, cmd, out)?;
        let bytes = cmd.sectors as u64 * self.inner.info().sector_bytes as u64;
        let lane = match cmd.opcode {
            Opcode::Read => 0,
            Opcode::Write => 1,
            Opcode::Trim | Opcode::Flush => return Ok(c),
        };
        if lane == 0 {
            self.read_bytes += bytes;
        } else {
            self.write_bytes += bytes;
        }
        if let Some(b) = (c.done_ns.saturating_sub(self.epoch_ns)).checked_div(self.interval_ns) {
            let b = b as usize;
            // Bounded like the run timeline: a bogus completion time cannot allocate without
            // limit.
            if b < 1 << 20 {
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

    fn take_host_work(&mut self) -> HostWork {
        self.inner.take_host_work()
    }
}
