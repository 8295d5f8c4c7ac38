//! The host CPU model: the machine that drives an array spends time on every request.
//!
//! A number of I/O threads, each one CPU, take requests in turn (the earliest-free thread
//! takes the next request). A request costs its thread time in categories:
//!
//! - `stack`: the software stack above and below the engine — system call, block layer and
//!   context switches on the way in, the completion path on the way out, and the driver's
//!   work for each command sent to a device (ScalaAFA Figure 3a's preAFA and postAFA);
//! - `array`: the engine's own logic, per request and per chunk handled (AFA);
//! - `parity`: bytes run through the parity code on the host;
//! - `sync`: synchronisation among threads and kernel workers (Other), which grows with the
//!   number of threads in the kernel profile (lock contention) and is absent in the
//!   user-space profile (message passing, no locks);
//! - `background`: work the engine did in the background on this thread's time (a
//!   two-phase array's conversion: its device commands, the bytes it moves through host
//!   memory and the parity it computes).
//!
//! What a thread is not busy with is `waiting`. The engine reports its work through
//! [`BlockDevice::take_host_work`]; the model wraps any device, so the same engine code runs
//! under a kernel or a user-space stack with any number of threads.
//!
//! Timing: the request reaches the engine once the thread has spent its stack time on it;
//! the engine's member commands leave after its array logic and background work (the
//! engine's device timing is shifted by that much); the completion is seen once both the
//! devices are done and the thread has finished the request's CPU work. The completion path
//! is charged together with the submission, so a thread's busy time is contiguous — an
//! approximation that keeps total CPU per request exact, which is what bounds throughput.

use afa_sim::{transfer_ns, TimeNs};
use afa_ssd::{
    BlockDevice, Command, Completion, DeviceError, DeviceInfo, HostWork, QueuedCompletion,
    QueuedDevice, ReadBuffers,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The software stack between the application and the devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StackProfile {
    /// Linux kernel path (mdraid, FusionRAID): system calls, the block layer, interrupts,
    /// context switches, and locks whose contention grows with the number of threads.
    Kernel,
    /// User-space path (SPDK): polling drivers, no system calls or context switches, and
    /// message passing instead of locks.
    Userspace,
}

/// The `[host]` table: threads, profile, and optional overrides of the profile's costs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CpuConfig {
    pub threads: u32,
    pub profile: StackProfile,
    pub request_ns: Option<u64>,
    pub completion_ns: Option<u64>,
    pub member_command_ns: Option<u64>,
    pub array_request_ns: Option<u64>,
    pub chunk_ns: Option<u64>,
    pub sync_ns: Option<u64>,
    pub contention_ns_per_thread: Option<u64>,
    pub parity_mb_s: Option<f64>,
    pub copy_mb_s: Option<f64>,
    pub message_ns: Option<u64>,
}

impl Default for CpuConfig {
    fn default() -> Self {
        Self {
            threads: 1,
            profile: StackProfile::Kernel,
            request_ns: None,
            completion_ns: None,
            member_command_ns: None,
            array_request_ns: None,
            chunk_ns: None,
            sync_ns: None,
            contention_ns_per_thread: None,
            parity_mb_s: None,
            copy_mb_s: None,
            message_ns: None,
        }
    }
}

/// Resolved costs of one profile (every default is documented in docs/models.md).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CpuCosts {
    /// Submission path per request (system call, block layer, context switch).
    pub request_ns: u64,
    /// Completion path per request (interrupt, wake-up, return to user space).
    pub completion_ns: u64,
    /// Driver work per command sent to a device.
    pub member_command_ns: u64,
    /// Engine logic per request.
    pub array_request_ns: u64,
    /// Engine logic per chunk handled.
    pub chunk_ns: u64,
    /// Synchronisation per request with one thread.
    pub sync_ns: u64,
    /// Extra synchronisation per request for every thread beyond the first.
    pub contention_ns_per_thread: u64,
    /// Host parity rate, MB/s of data.
    pub parity_mb_s: f64,
    /// Rate at which background work moves bytes through host memory, MB/s.
    pub copy_mb_s: f64,
    /// One message sent or received between an I/O thread and a space manager (an SPDK
    /// `spdk_thread_send_msg` ring operation), charged as synchronisation.
    pub message_ns: u64,
}

impl CpuCosts {
    /// The calibrated costs of a profile.
    ///
    /// The kernel profile is calibrated on ScalaAFA §3.1 (FusionRAID, 4+1, 64 KiB
    /// sequential writes): one replicated 64 KiB write costs 13.65 µs of CPU (4.8 GB/s with
    /// one thread), of which the stack is 7.4 µs (54%); each further thread adds 4.55 µs of
    /// contention (7.2 GB/s with two); a conversion stripe costs about 418 µs of CPU, which
    /// brings user throughput to about 0.55 GB/s once conversion runs on the one thread.
    pub fn of(profile: StackProfile) -> Self {
        match profile {
            StackProfile::Kernel => Self {
                request_ns: 2_500,
                completion_ns: 1_500,
                member_command_ns: 1_700,
                array_request_ns: 2_000,
                chunk_ns: 1_000,
                sync_ns: 3_250,
                contention_ns_per_thread: 4_550,
                parity_mb_s: 6_600.0,
                copy_mb_s: 2_100.0,
                message_ns: 200,
            },
            // SPDK-like: a few hundred ns per request and per NVMe command when polling,
            // ISA-L parity and memcpy at memory speed, no locks.
            StackProfile::Userspace => Self {
                request_ns: 500,
                completion_ns: 200,
                member_command_ns: 400,
                array_request_ns: 500,
                chunk_ns: 300,
                sync_ns: 0,
                contention_ns_per_thread: 0,
                parity_mb_s: 12_000.0,
                copy_mb_s: 10_000.0,
                message_ns: 200,
            },
        }
    }
}

impl CpuConfig {
    /// The profile's costs with this table's overrides applied.
    pub fn costs(&self) -> CpuCosts {
        let base = CpuCosts::of(self.profile);
        CpuCosts {
            request_ns: self.request_ns.unwrap_or(base.request_ns),
            completion_ns: self.completion_ns.unwrap_or(base.completion_ns),
            member_command_ns: self.member_command_ns.unwrap_or(base.member_command_ns),
            array_request_ns: self.array_request_ns.unwrap_or(base.array_request_ns),
            chunk_ns: self.chunk_ns.unwrap_or(base.chunk_ns),
            sync_ns: self.sync_ns.unwrap_or(base.sync_ns),
            contention_ns_per_thread: self
                .contention_ns_per_thread
                .unwrap_or(base.contention_ns_per_thread),
            parity_mb_s: self.parity_mb_s.unwrap_or(base.parity_mb_s),
            copy_mb_s: self.copy_mb_s.unwrap_or(base.copy_mb_s),
            message_ns: self.message_ns.unwrap_or(base.message_ns),
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.threads == 0 || self.threads > 1024 {
            return Err(format!(
                "host.threads = {} must be between 1 and 1024",
                self.threads
            ));
        }
        let c = self.costs();
        for (name, v) in [
            ("host.parity_mb_s", c.parity_mb_s),
            ("host.copy_mb_s", c.copy_mb_s),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("{name} = {v} must be a positive number"));
            }
        }
        Ok(())
    }
}

/// CPU time one thread spent, by category.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ThreadBusy {
    pub stack_ns: u64,
    pub array_ns: u64,
    pub parity_ns: u64,
    pub sync_ns: u64,
    pub background_ns: u64,
}

impl ThreadBusy {
    pub fn total_ns(&self) -> u64 {
        self.stack_ns + self.array_ns + self.parity_ns + self.sync_ns + self.background_ns
    }
}

/// One thread in the report: its busy time by category and its waiting time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ThreadReport {
    #[serde(flatten)]
    pub busy: ThreadBusy,
    pub waiting_ns: u64,
    pub busy_fraction: f64,
}

/// The host's CPU use over a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CpuReport {
    pub profile: StackProfile,
    pub costs: CpuCosts,
    pub threads: Vec<ThreadReport>,
    /// Each category's share of all threads' time (busy categories plus waiting).
    pub fractions: CategoryFractions,
}

/// Shares of thread time, summing to 1.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CategoryFractions {
    pub stack: f64,
    pub array: f64,
    pub parity: f64,
    pub sync: f64,
    pub background: f64,
    pub waiting: f64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Thread {
    free_ns: TimeNs,
    busy: ThreadBusy,
}

/// A device driven through the host CPU model.
#[derive(Debug)]
pub struct CpuFront<D> {
    inner: D,
    profile: StackProfile,
    costs: CpuCosts,
    threads: Vec<Thread>,
    queued: QueuedTiming,
}

/// What the model keeps for a device driven through its queued interface
/// ([`QueuedDevice`]), whose completions come back only as its clock passes them.
#[derive(Debug, Default)]
struct QueuedTiming {
    /// The latest time a command was started at on the device: the model starts a command
    /// once its thread has spent the submission path on it, ahead of the host's clock, and
    /// the device may not be moved back behind it.
    device_ns: TimeNs,
    /// Per tag of a command under way: the time its completion is delayed by on the way
    /// back (the engine's work and the completion path) and when its thread's work on it
    /// ends.
    under_way: BTreeMap<u64, Charged>,
    /// Completions the device delivered whose host-side completion lies ahead, by (time,
    /// arrival order).
    held: BTreeMap<(TimeNs, u64), QueuedCompletion>,
    arrivals: u64,
    /// The device's next event as it said after the last call that could change it:
    /// `next_event_ns` takes `&self`, and the device's queued interface needs `&mut`.
    device_next_ns: Option<TimeNs>,
}

/// The CPU time one request was charged, as it bears on its completion.
#[derive(Debug, Clone, Copy)]
struct Charged {
    /// Added to the devices' completion time: the engine's work delays its member commands,
    /// and the completion path follows them.
    after_devices_ns: u64,
    /// When the thread has finished all of the request's CPU work.
    cpu_end_ns: TimeNs,
}

impl Charged {
    /// When the host sees the request complete whose devices were done at `devices_ns`.
    fn finish(&self, devices_ns: TimeNs) -> TimeNs {
        (devices_ns + self.after_devices_ns).max(self.cpu_end_ns)
    }
}

impl<D: BlockDevice> CpuFront<D> {
    pub fn new(inner: D, config: &CpuConfig) -> Result<Self, String> {
        config.validate()?;
        Ok(Self {
            inner,
            profile: config.profile,
            costs: config.costs(),
            threads: vec![Thread::default(); config.threads as usize],
            queued: QueuedTiming::default(),
        })
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }
    pub fn inner_mut(&mut self) -> &mut D {
        &mut self.inner
    }

    /// The CPU report for a run that ended at `end_ns`.
    pub fn report(&self, end_ns: TimeNs) -> CpuReport {
        let mut sum = ThreadBusy::default();
        let mut waiting_total = 0u64;
        let threads: Vec<ThreadReport> = self
            .threads
            .iter()
            .map(|t| {
                // Work charged beyond the end of the run (a last completion path) still
                // counts as busy; the thread's span is then its own end.
                let span = end_ns.max(t.busy.total_ns());
                let waiting_ns = span - t.busy.total_ns();
                sum.stack_ns += t.busy.stack_ns;
                sum.array_ns += t.busy.array_ns;
                sum.parity_ns += t.busy.parity_ns;
                sum.sync_ns += t.busy.sync_ns;
                sum.background_ns += t.busy.background_ns;
                waiting_total += waiting_ns;
                ThreadReport {
                    busy: t.busy,
                    waiting_ns,
                    busy_fraction: if span == 0 {
                        0.0
                    } else {
                        t.busy.total_ns() as f64 / span as f64
                    },
                }
            })
            .collect();
        let all = (sum.total_ns() + waiting_total).max(1) as f64;
        CpuReport {
            profile: self.profile,
            costs: self.costs,
            threads,
            fractions: CategoryFractions {
                stack: sum.stack_ns as f64 / all,
                array: sum.array_ns as f64 / all,
                parity: sum.parity_ns as f64 / all,
                sync: sum.sync_ns as f64 / all,
                background: sum.background_ns as f64 / all,
                waiting: waiting_total as f64 / all,
            },
        }
    }

    /// Records the device's next event after a call that may have changed it.
    fn note_device_next(&mut self) {
        self.queued.device_next_ns = self.inner.queued().and_then(|q| q.next_event_ns());
    }

    /// Takes the thread that is free first for a request that arrives at `now_ns`, charges
    /// it the submission path and its share of synchronisation, and returns it with the
    /// time the request reaches the engine.
    ///
    /// The time returned never decreases from one call to the next while `now_ns` does
    /// not: the thread taken is the earliest free, and taking it only moves its free time
    /// later, so the earliest free time of all threads never goes back.
    fn take_thread(&mut self, now_ns: TimeNs) -> (usize, TimeNs) {
        let c = self.costs;
        let extra_threads = self.threads.len() as u64 - 1;
        let sync_ns = c.sync_ns + c.contention_ns_per_thread * extra_threads;
        let i = self.pick_thread();
        let start = now_ns.max(self.threads[i].free_ns);
        let thread = &mut self.threads[i];
        thread.busy.stack_ns += c.request_ns;
        thread.busy.sync_ns += sync_ns;
        thread.free_ns = start + c.request_ns + sync_ns;
        (i, thread.free_ns)
    }

    /// Charges thread `i` the work the engine reported for the request that reached it at
    /// `issue_ns`: its logic, parity, background work, the driver's work per member command
    /// and the completion path.
    fn charge(&mut self, i: usize, issue_ns: TimeNs) -> Charged {
        let c = self.costs;
        let work: HostWork = self.inner.take_host_work();
        // Messages to and from the space manager are sent while the engine works, so they
        // delay the member commands like the engine's own logic.
        let messages_ns = c.message_ns * work.messages;
        let array_ns = c.array_request_ns + c.chunk_ns * work.chunks + messages_ns;
        let parity_ns = transfer_ns(work.parity_bytes, c.parity_mb_s);
        let background_ns = (c.request_ns + c.completion_ns + c.member_command_ns)
            * work.background_commands
            + transfer_ns(work.background_bytes, c.copy_mb_s)
            + transfer_ns(work.background_parity_bytes, c.parity_mb_s);
        // The driver's work for the member commands and the completion path follow the
        // engine's work; the submission path (`request_ns`) came before it.
        let post_ns = c.member_command_ns * work.member_commands + c.completion_ns;
        let thread = &mut self.threads[i];
        thread.busy.stack_ns += post_ns;
        thread.busy.array_ns += array_ns;
        thread.busy.parity_ns += parity_ns;
        thread.busy.background_ns += background_ns;
        let cpu_end_ns = issue_ns + array_ns + parity_ns + background_ns + post_ns;
        thread.free_ns = cpu_end_ns;
        Charged {
            after_devices_ns: array_ns + background_ns + c.completion_ns,
            cpu_end_ns,
        }
    }

    /// The thread that is free first (the lowest index among equals, for determinism).
    fn pick_thread(&self) -> usize {
        let mut best = 0;
        for (i, t) in self.threads.iter().enumerate() {
            if t.free_ns < self.threads[best].free_ns {
                best = i;
            }
        }
        best
    }
}

impl<D: BlockDevice> BlockDevice for CpuFront<D> {
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
        let (thread, issue) = self.take_thread(now_ns);
        // Work left over from idle-time calls belongs to no request; drop it so it is not
        // charged to this one.
        self.inner.take_host_work();
        let result = self.inner.submit(issue, cmd, out);
        let charged = self.charge(thread, issue);
        let completion = result?;
        Ok(Completion {
            done_ns: charged.finish(completion.done_ns),
            gc_active: completion.gc_active,
        })
    }

    fn queued(&mut self) -> Option<&mut dyn QueuedDevice> {
        // The model passes the queued interface on when the device has one, so a queued
        // device keeps its queue depth behind the host's threads too.
        self.inner.queued()?;
        Some(self)
    }

    fn prefetch(&self, lba: u64, stage: u8) {
        self.inner.prefetch(lba, stage);
    }

    fn background(&mut self, now_ns: TimeNs) -> Option<TimeNs> {
        let next = self.inner.background(now_ns);
        self.note_device_next();
        next
    }

    fn take_host_work(&mut self) -> HostWork {
        // The host model consumes the engine's work itself; nothing is left for a caller.
        HostWork::default()
    }
}

/// The queued interface behind the host's threads: a command is started on the device once
/// its thread has spent the submission path on it, and its completion is held until the
/// thread has done the rest of its work and the completion path, as `submit` times it.
impl<D: BlockDevice> QueuedDevice for CpuFront<D> {
    fn start(&mut self, now_ns: TimeNs, cmd: &Command<'_>, tag: u64) -> Result<(), DeviceError> {
        let (thread, issue) = self.take_thread(now_ns);
        // `take_thread` never goes back in time, but a caller's clock may be behind a
        // command started earlier; the device is never moved back.
        let issue = issue.max(self.queued.device_ns);
        self.inner.take_host_work();
        let device = self
            .inner
            .queued()
            .expect("a device whose queued interface the model passed on");
        let started = device.start(issue, cmd, tag);
        self.queued.device_ns = issue;
        self.note_device_next();
        started?;
        let charged = self.charge(thread, issue);
        self.queued.under_way.insert(tag, charged);
        Ok(())
    }

    fn next_event_ns(&self) -> Option<TimeNs> {
        let held = self.queued.held.keys().next().map(|&(t, _)| t);
        match (held, self.queued.device_next_ns) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn advance_to(&mut self, t_ns: TimeNs) -> Vec<QueuedCompletion> {
        // The device may already be past `t_ns` (it was moved to the last start); running it
        // to where it is delivers what it finished there, which waits here like the rest.
        let device_t = t_ns.max(self.queued.device_ns);
        let device = self
            .inner
            .queued()
            .expect("a device whose queued interface the model passed on");
        let finished = device.advance_to(device_t);
        self.queued.device_ns = device_t;
        for mut c in finished {
            // A tag the model did not start is passed on as the device timed it.
            if let Some(charged) = self.queued.under_way.remove(&c.tag) {
                c.done_ns = charged.finish(c.done_ns);
            }
            self.queued
                .held
                .insert((c.done_ns, self.queued.arrivals), c);
            self.queued.arrivals += 1;
        }
        self.note_device_next();
        let mut done = Vec::new();
        while let Some(entry) = self.queued.held.first_entry() {
            if entry.key().0 > t_ns {
                break;
            }
            done.push(entry.remove());
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use afa_ssd::Opcode;

    /// A device that completes everything after a fixed time and reports fixed work.
    #[derive(Debug)]
    struct Fixed {
        latency_ns: u64,
        work: HostWork,
        pending: HostWork,
    }

    impl BlockDevice for Fixed {
        fn info(&self) -> DeviceInfo {
            DeviceInfo {
                sector_bytes: 4096,
                capacity_sectors: 1 << 20,
                payload_unit_bytes: 0,
                tag_bytes_per_sector: 0,
                max_queue_depth: 1024,
                max_transfer_sectors: 1024,
            }
        }
        fn submit(
            &mut self,
            now_ns: TimeNs,
            cmd: &Command<'_>,
            _out: ReadBuffers<'_>,
        ) -> Result<Completion, DeviceError> {
            assert_eq!(cmd.opcode, Opcode::Write);
            self.pending.add(&self.work);
            Ok(Completion {
                done_ns: now_ns + self.latency_ns,
                gc_active: false,
            })
        }
        fn background(&mut self, _now_ns: TimeNs) -> Option<TimeNs> {
            None
        }
        fn take_host_work(&mut self) -> HostWork {
            std::mem::take(&mut self.pending)
        }
    }

    fn replicated_write() -> HostWork {
        HostWork {
            chunks: 1,
            member_commands: 2,
            ..HostWork::default()
        }
    }

    /// Requests submitted back to back on `threads` threads: user bytes per CPU second.
    fn saturated_gb_s(threads: u32, work: HostWork) -> f64 {
        let dev = Fixed {
            latency_ns: 1,
            work,
            pending: HostWork::default(),
        };
        let config = CpuConfig {
            threads,
            ..CpuConfig::default()
        };
        let mut front = CpuFront::new(dev, &config).unwrap();
        let n = 10_000u64;
        let mut last = 0;
        for _ in 0..n {
            let c = front
                .submit(0, &Command::write(0, 16, &[]), ReadBuffers::none())
                .unwrap();
            last = last.max(c.done_ns);
        }
        (n * 65_536) as f64 / last as f64
    }

    /// `Fixed`'s timing and work behind the queued interface: a command completes
    /// `latency_ns` after it starts, whatever else is under way.
    #[derive(Debug)]
    struct FixedQueue {
        fixed: Fixed,
        now_ns: TimeNs,
        running: BTreeMap<(TimeNs, u64), ()>,
    }

    impl BlockDevice for FixedQueue {
        fn info(&self) -> DeviceInfo {
            self.fixed.info()
        }
        fn submit(
            &mut self,
            now_ns: TimeNs,
            cmd: &Command<'_>,
            out: ReadBuffers<'_>,
        ) -> Result<Completion, DeviceError> {
            self.fixed.submit(now_ns, cmd, out)
        }
        fn background(&mut self, _now_ns: TimeNs) -> Option<TimeNs> {
            None
        }
        fn take_host_work(&mut self) -> HostWork {
            self.fixed.take_host_work()
        }
        fn queued(&mut self) -> Option<&mut dyn QueuedDevice> {
            Some(self)
        }
    }

    impl QueuedDevice for FixedQueue {
        fn start(
            &mut self,
            now_ns: TimeNs,
            _cmd: &Command<'_>,
            tag: u64,
        ) -> Result<(), DeviceError> {
            assert!(now_ns >= self.now_ns, "started in the device's past");
            self.fixed.pending.add(&self.fixed.work);
            self.running
                .insert((now_ns + self.fixed.latency_ns, tag), ());
            Ok(())
        }
        fn next_event_ns(&self) -> Option<TimeNs> {
            self.running.keys().next().map(|&(t, _)| t)
        }
        fn advance_to(&mut self, t_ns: TimeNs) -> Vec<QueuedCompletion> {
            assert!(
                t_ns >= self.now_ns,
                "moved back from {} to {t_ns}",
                self.now_ns
            );
            self.now_ns = t_ns;
            let mut done = Vec::new();
            while let Some(entry) = self.running.first_entry() {
                if entry.key().0 > t_ns {
                    break;
                }
                let (done_ns, tag) = *entry.key();
                entry.remove();
                done.push(QueuedCompletion {
                    tag,
                    done_ns,
                    result: Ok(Vec::new()),
                });
            }
            done
        }
    }

    /// The queued interface times a request as `submit` does: a burst of requests all
    /// arriving at 0, on two threads, completes at the same times and charges the threads
    /// the same work either way, and each completion is held until then.
    #[test]
    fn the_queued_interface_times_requests_as_submit_does() {
        let config = CpuConfig {
            threads: 2,
            ..CpuConfig::default()
        };
        let fixed = || Fixed {
            latency_ns: 30_000,
            work: replicated_write(),
            pending: HostWork::default(),
        };
        let mut direct = CpuFront::new(fixed(), &config).unwrap();
        let submitted: Vec<TimeNs> = (0..8)
            .map(|_| {
                direct
                    .submit(0, &Command::write(0, 16, &[]), ReadBuffers::none())
                    .unwrap()
                    .done_ns
            })
            .collect();
        let dev = FixedQueue {
            fixed: fixed(),
            now_ns: 0,
            running: BTreeMap::new(),
        };
        let mut queued = CpuFront::new(dev, &config).unwrap();
        for tag in 0..8 {
            queued.start(0, &Command::write(0, 16, &[]), tag).unwrap();
        }
        let mut completed = vec![0; 8];
        let mut seen = 0;
        while let Some(t) = queued.next_event_ns() {
            for c in queued.advance_to(t) {
                assert_eq!(c.done_ns, t, "a completion comes back at its time");
                completed[c.tag as usize] = c.done_ns;
                seen += 1;
            }
        }
        assert_eq!(seen, 8);
        assert_eq!(completed, submitted);
        let end = *submitted.iter().max().unwrap();
        assert_eq!(queued.report(end).threads, direct.report(end).threads);
    }

    #[test]
    fn kernel_profile_is_calibrated_on_fusionraid_replication() {
        let one = saturated_gb_s(1, replicated_write());
        let two = saturated_gb_s(2, replicated_write());
        assert!((one - 4.8).abs() < 0.1, "one thread: {one} GB/s");
        assert!((two - 7.2).abs() < 0.15, "two threads: {two} GB/s");
    }

    #[test]
    fn stack_share_at_one_thread_is_about_54_percent() {
        let dev = Fixed {
            latency_ns: 1,
            work: replicated_write(),
            pending: HostWork::default(),
        };
        let mut front = CpuFront::new(dev, &CpuConfig::default()).unwrap();
        let mut end = 0;
        for _ in 0..1000 {
            end = front
                .submit(0, &Command::write(0, 16, &[]), ReadBuffers::none())
                .unwrap()
                .done_ns;
        }
        let r = front.report(end);
        assert!((r.fractions.stack - 0.54).abs() < 0.02, "{:?}", r.fractions);
        assert!(r.fractions.waiting < 0.01, "{:?}", r.fractions);
    }

    #[test]
    fn background_work_slows_the_thread() {
        let conv = HostWork {
            background_commands: 17 / 4,
            background_bytes: 589_824 / 4,
            background_parity_bytes: 262_144 / 4,
            ..replicated_write()
        };
        let with = saturated_gb_s(1, conv);
        let without = saturated_gb_s(1, replicated_write());
        assert!(with < without / 5.0, "{with} vs {without}");
    }

    #[test]
    fn userspace_profile_has_no_contention_and_bad_threads_are_refused() {
        let c = CpuConfig {
            profile: StackProfile::Userspace,
            threads: 8,
            ..CpuConfig::default()
        };
        assert_eq!(c.costs().contention_ns_per_thread, 0);
        let bad = CpuConfig {
            threads: 0,
            ..CpuConfig::default()
        };
        assert!(bad.validate().unwrap_err().contains("host.threads"));
    }
}
