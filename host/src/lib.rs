//! The host that drives a volume: it turns fio jobs or a block trace into commands, keeps
//! each job's queue depth full in virtual time, checks every read against an oracle and
//! feeds completions to the recorder.
//!
//! It runs against any [`BlockDevice`], so one SSD and (later) an array of them are driven
//! by the same code.

pub mod cpu;
mod flow;
mod latency;
mod monitor;
mod oracle;
mod steady;

use afa_nand::{fill_unit, sector_token};
use afa_report::{
    LatencyTargetReport, Measurements, OpClass, Progress, Recorder, SteadyStateReport,
};
use afa_sim::{EventLogHash, EventQueue, SimRng, TimeNs};
use afa_ssd::{BlockDevice, Command, Completion, DeviceError, DeviceInfo, ReadBuffers};
use afa_workload::fio::{Flow, JobSpec, MinRate, RateLimit, RwMode, ThinkTime};
use afa_workload::generator::JobGenerator;
use afa_workload::trace::TraceRecord;
use afa_workload::{IoOp, IoRequest, WorkloadError};

pub use cpu::{CpuConfig, CpuFront, CpuReport, StackProfile};
use flow::Flows;
use latency::{LatencySearch, Verdict};
pub use monitor::Monitored;
pub use oracle::{Mismatch, Oracle};
use steady::SteadyTracker;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    #[error("the device failed a {op:?} of {len_bytes} bytes at byte {offset_bytes}: {source}")]
    Device {
        op: IoOp,
        offset_bytes: u64,
        len_bytes: u64,
        source: DeviceError,
    },
    #[error("request at byte {offset_bytes} of {len_bytes} bytes is not a whole number of {sector_bytes}-byte sectors")]
    Unaligned {
        offset_bytes: u64,
        len_bytes: u64,
        sector_bytes: u32,
    },
    #[error("the device stopped with {outstanding} requests unfinished and nothing left to do")]
    Stalled { outstanding: u32 },
    #[error(
        "job {job}: simulated time stopped at {at_ns} ns, where {events} requests and \
         completions came and went without it advancing, so the job's time_based runtime would \
         never end (its requests take no simulated time, as reads of never-written data do on an \
         engine that answers them from its map when no [host] CPU model is configured); write the \
         data first, add a [host] section, or size the job instead of timing it"
    )]
    NoProgress {
        job: String,
        at_ns: TimeNs,
        events: u64,
    },
    #[error(
        "job {job}: a {op:?} at byte {offset_bytes} took {latency_ns} ns, above {limit}; fio \
         ends the job with ETIMEDOUT (\"max latency exceeded\")"
    )]
    LatencyExceeded {
        job: String,
        op: IoOp,
        offset_bytes: u64,
        latency_ns: u64,
        /// The limit and the option that set it.
        limit: String,
    },
    #[error(
        "job {job}: {option}={minimum} not met by its {direction}, which got {rate} over the \
         {window_ms} ms up to {at_ns} ns; fio ends the job with EIO (\"check_min_rate\")"
    )]
    RateBelowMinimum {
        job: String,
        direction: &'static str,
        option: &'static str,
        minimum: u64,
        /// The rate measured, with its unit.
        rate: String,
        window_ms: u64,
        at_ns: TimeNs,
    },
    #[error(
        "{replay}'s record {number} (a {op:?} of {len_bytes} bytes at byte {offset_bytes}, as \
         replayed on this device) exceeds the device's maximum transfer of \
         {max_transfer_sectors} sectors ({max_transfer_bytes} bytes); each request is one \
         device command, so raise the device's host.max_transfer_sectors or replay a trace \
         of shorter requests"
    )]
    ReplayRequestTooLong {
        /// What replays the records: "the trace", or "job [name]: read_iolog".
        replay: String,
        /// The record's place in the replay, counting from 1.
        number: usize,
        op: IoOp,
        offset_bytes: u64,
        len_bytes: u64,
        max_transfer_sectors: u32,
        max_transfer_bytes: u64,
    },
}

/// Refuses, before the run, a replay with a record longer than the device takes in one
/// command: a replayed record is issued as one command, like a generated request, and
/// otherwise the run would fail at that record's turn, after simulating everything before it.
fn check_replay_fits(
    records: &[TraceRecord],
    info: &DeviceInfo,
    replay: impl FnOnce() -> String,
) -> Result<(), RunError> {
    let sector_bytes = info.sector_bytes as u64;
    let capacity_bytes = info.capacity_sectors * sector_bytes;
    let max_transfer_bytes = info.max_transfer_sectors as u64 * sector_bytes;
    let too_long = records.iter().enumerate().find_map(|(index, r)| {
        let request = wrap_trace_request(*r, capacity_bytes, sector_bytes);
        // Trims are not limited, as for generated requests: a device takes any range.
        (matches!(request.op, IoOp::Read | IoOp::Write) && request.len_bytes > max_transfer_bytes)
            .then_some((index, request))
    });
    match too_long {
        None => Ok(()),
        Some((index, request)) => Err(RunError::ReplayRequestTooLong {
            replay: replay(),
            number: index + 1,
            op: request.op,
            offset_bytes: request.offset_bytes,
            len_bytes: request.len_bytes,
            max_transfer_sectors: info.max_transfer_sectors,
            max_transfer_bytes,
        }),
    }
}

/// Events a run may process at one simulated instant while a `time_based` job is running
/// before the run is taken for one that never ends: a job whose requests take no simulated
/// time would repeat them forever at the same instant.
const EVENTS_AT_ONE_INSTANT_MAX: u64 = 1_000_000;

/// How a trace is replayed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TraceReplay {
    /// Each request is issued at its timestamp multiplied by `time_scale` (open loop).
    Timed { time_scale: f64 },
    /// Requests are issued in order as fast as `iodepth` allows (closed loop).
    Closed { iodepth: u32 },
}

/// What the host runs.
#[derive(Debug, Clone)]
pub enum Workload {
    Jobs(Vec<JobSpec>),
    Trace {
        records: Vec<TraceRecord>,
        replay: TraceReplay,
    },
}

#[derive(Debug, Clone)]
pub struct RunOptions {
    pub seed: u64,
    pub timeline_interval_ns: u64,
    /// Sectors `0..n` hold preconditioned content (`sector_token(lba, 0)`).
    pub preconditioned_sectors: u64,
    /// Give the device idle time for background work.
    pub background_work: bool,
    pub show_progress: bool,
    /// Keep every request the workload issues, at the time it issues it
    /// ([`RunOutcome::issued`]), so that the run's workload can be written as a trace.
    pub record_requests: bool,
}

/// What a run produced, before it is joined with the device's counters into a report.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    pub measurements: Measurements,
    pub sim_time_ns: TimeNs,
    pub requests: u64,
    pub reads_checked: u64,
    pub mismatches: u64,
    pub first_mismatches: Vec<Mismatch>,
    pub event_hash: u64,
    /// Events the host's own queue processed: completions, think-time and wake-up issues,
    /// calls for the device's idle-time work. The host's share of a run's work, which a
    /// job's own options must not make grow faster than its requests.
    pub host_events: u64,
    /// Every request the workload issued, in order, stamped with the simulated time it was
    /// issued at (with `RunOptions::record_requests`; empty otherwise).
    pub issued: Vec<TraceRecord>,
    /// fio's `write_iolog`: for each job that sets it, in file order, the path it names and
    /// the requests its clones issued, stamped as in `issued`. The caller writes the files.
    pub job_logs: Vec<(String, Vec<TraceRecord>)>,
    /// What the run changed in the workload as given, one sentence each: a job whose
    /// `size=` reached past the device's end and was cut there. The library prints none of
    /// them, since only its caller knows whether its user should see them; a caller that
    /// tells the user before the run starts takes them from [`PreparedRun::notes`].
    pub notes: Vec<String>,
    /// fio's steady-state detection, one entry per job clone or group judged (none when no
    /// job set a window).
    pub steady_state: Vec<SteadyStateReport>,
    /// fio's latency-target search, one entry per job clone that set `latency_target`.
    pub latency_target: Vec<LatencyTargetReport>,
}

enum Source {
    /// A job's generator and the requests already drawn from it. Drawing two requests
    /// ahead lets the device prefetch what they will touch (see `BlockDevice::prefetch`);
    /// the sequence of requests is the same either way.
    Job {
        generator: Box<JobGenerator>,
        ahead: std::collections::VecDeque<IoRequest>,
        /// fio's `rate=` / `rate_iops=`, when the job caps any direction.
        rate: Option<Box<RateGate>>,
    },
    /// A trace (the run's, or a job's `read_iolog`), replayed in order from `next`: at
    /// `origin_ns` plus each record's timestamp times `timed`, or (`None`) as fast as the
    /// queue depth allows.
    Trace {
        records: std::sync::Arc<Vec<TraceRecord>>,
        next: usize,
        timed: Option<f64>,
        origin_ns: TimeNs,
    },
}

/// When a rate-capped job may issue its next request of each direction. As in fio, the
/// schedule runs from the job's start and is not moved when the job falls behind it (the
/// device was slower than the cap), so the job then issues at once until it has caught up.
struct RateGate {
    limits: [Option<RateLimit>; 3],
    /// Each direction's smallest block size, in bytes: `rate_iops` counts requests of it.
    min_bs_bytes: [u64; 3],
    /// The earliest time of each direction's next request, in ns (fractional so that rates
    /// that do not divide a second do not drift).
    next_ns: [f64; 3],
    /// `rate_process=poisson`: exponential gaps with the rate's mean, drawn from `rng`.
    poisson: bool,
    rng: SimRng,
    /// The job mixes reads and writes (both with a share), so a request drawn for a
    /// direction ahead of its rate may go to the other one instead, as fio's do.
    switches: bool,
}

impl RateGate {
    fn new(spec: &JobSpec, seed: u64) -> Option<Box<Self>> {
        spec.rate_limits.iter().any(Option::is_some).then(|| {
            Box::new(RateGate {
                limits: spec.rate_limits,
                min_bs_bytes: std::array::from_fn(|d| spec.block_sizes[d].min_bytes()),
                next_ns: [0.0; 3],
                poisson: spec.rate_poisson,
                rng: SimRng::new(seed),
                switches: matches!(spec.rw, RwMode::ReadWrite | RwMode::RandRw)
                    && (1..100).contains(&spec.rwmixread_percent),
            })
        })
    }

    fn direction(op: IoOp) -> Option<usize> {
        match op {
            IoOp::Read => Some(0),
            IoOp::Write => Some(1),
            IoOp::Trim => Some(2),
            // fio's rates cap data directions; a flush is never held back.
            IoOp::Flush => None,
        }
    }

    /// The direction a request drawn for `drawn` goes to at `now_ns` (fio's `rate_ddir`):
    /// its own when it is due; in a read/write mix, the other one when that is due, or,
    /// with both ahead of their rates, whichever is due first.
    fn choose(&self, drawn: IoOp, now_ns: TimeNs) -> IoOp {
        let due = |d: usize| self.limits[d].map_or(0.0, |_| self.next_ns[d]);
        let now = now_ns as f64;
        match Self::direction(drawn) {
            Some(d @ (0 | 1)) if self.switches && due(d) > now => {
                let other = 1 - d;
                if due(other) <= now || due(other) < due(d) {
                    [IoOp::Read, IoOp::Write][other]
                } else {
                    drawn
                }
            }
            _ => drawn,
        }
    }

    /// The job starts at `now_ns`: every direction may issue at once.
    fn start(&mut self, now_ns: TimeNs) {
        self.next_ns = [now_ns as f64; 3];
    }

    /// When `request` may be issued.
    fn due_ns(&self, request: &IoRequest) -> TimeNs {
        match Self::direction(request.op) {
            Some(d) if self.limits[d].is_some() => self.next_ns[d].ceil() as TimeNs,
            _ => 0,
        }
    }

    /// fio's `rate_ignore_thinktime`: a think-time pause of `pause_ns` moves every capped
    /// direction's schedule on by the pause, so the job does not catch up on what it would
    /// have issued while it paused.
    fn postpone(&mut self, pause_ns: u64) {
        for (next_ns, limit) in self.next_ns.iter_mut().zip(&self.limits) {
            if limit.is_some() {
                *next_ns += pause_ns as f64;
            }
        }
    }

    /// `request` is issued: its direction's next request comes one interval later.
    fn issued(&mut self, request: &IoRequest) {
        let Some(d) = Self::direction(request.op) else {
            return;
        };
        if let Some(limit) = self.limits[d] {
            let mean_ns = limit.interval_ns(request.len_bytes, self.min_bs_bytes[d]);
            let gap_ns = if self.poisson {
                self.rng.exponential(mean_ns)
            } else {
                mean_ns
            };
            self.next_ns[d] += gap_ns;
        }
    }
}

struct Stream {
    source: Source,
    group: usize,
    iodepth: u32,
    outstanding: u32,
    exhausted: bool,
    deadline_ns: Option<TimeNs>,
    ramp_end_ns: TimeNs,
    /// fio's think time; a pause of 0 never pauses.
    think: ThinkTime,
    /// Where the stream is in its think-time cycle.
    thinking: Thinking,
    /// Data requests (not FLUSHes) issued and completed so far: fio's `io_issues` and
    /// `io_blocks`, which `thinktime_blocks` counts.
    issued_requests: u64,
    completed_requests: u64,
    /// The count `thinktime_blocks` is measured from: its value when the last pause was
    /// decided.
    think_mark_requests: u64,
    /// Data requests and bytes completed so far in each direction (read, write, trim),
    /// failed ones left out: fio's `io_blocks` and `io_bytes`, which steady-state
    /// detection, the latency-target search and the minimum rates count.
    done_by_direction: [(u64, u64); 3],
    /// The job's name, with its clone number after a dot when it has several clones: the
    /// name reports and errors give it.
    name: String,
    /// fio's `max_latency`, for reads, writes and trims: a request that takes longer fails
    /// the job.
    max_latency_ns: [Option<u64>; 3],
    /// fio's `latency_target` search, which caps the queue depth below `iodepth`.
    latency: Option<Box<LatencySearch>>,
    /// fio's `rate_min` / `rate_iops_min` and `rate_cycle`, and per direction the last
    /// check's (time, requests, bytes).
    min_rates: [MinRate; 3],
    rate_cycle_ns: u64,
    last_rate_check: [Option<(TimeNs, u64, u64)>; 3],
    /// When the stream started (fio's `td->start`), which the minimum rates' settling
    /// period counts from.
    started_ns: TimeNs,
    /// fio's flow control: the job's flow, the requests it counted in it, and where the
    /// stream is with it.
    flow: Option<Flow>,
    flow_issued: u64,
    flow_state: FlowState,
    /// The flow let a request go that the stream has not issued yet (its rate cap or its
    /// end held it back): the next one goes without asking again, as fio asks once per
    /// request.
    flow_credit: bool,
    /// When the last pause ended (or the stream started): `thinktime_iotime` counts from it.
    think_mark_ns: TimeNs,
    /// Count a read the device fails and go on (`continue_on_error=read`).
    continue_on_read_error: bool,
    runtime_ns: Option<u64>,
    ramp_time_ns: u64,
    /// A timed trace's wake-up is already in the queue.
    wakeup_pending: bool,
    /// fio's `end_fsync`: a job its runtime stops ends with a FLUSH too.
    end_flush: bool,
    /// A write was issued after the last FLUSH.
    unflushed_writes: bool,
    /// fio's `time_based`: the job repeats its I/O until its runtime ends, and only then.
    /// Named by `RunError::NoProgress`.
    time_based: Option<String>,
    /// fio's `startdelay`: the stream starts this long after its group.
    start_delay_ns: u64,
    /// Once the queue is full it drains to this depth before it is filled again (fio's
    /// `iodepth_low` and `iodepth_batch_complete_min`, [`refill_depth`]); `iodepth - 1`
    /// replaces every completion at once.
    refill_at_depth: u32,
    /// The queue filled up and is draining to `refill_at_depth`.
    draining: bool,
    /// fio's `exitall`: when this job finishes, the other jobs of its group stop.
    exit_all: bool,
    /// With `exit_all`, later groups are skipped too (`exit_what=all`).
    exit_all_groups: bool,
    /// fio's `wait_for`: the streams (every clone of the named job) that must have
    /// finished before this one starts; emptied once they have.
    waits_for: Vec<u32>,
    /// The group has started but this stream waits for `waits_for`; it has not started.
    held_back: bool,
    /// fio's `serialize_overlap`: a request is issued only once none of this stream's
    /// requests in flight overlaps it.
    serialize_overlap: bool,
    /// The stream keeps `inflight_ranges`: it serializes overlaps, or some of its requests
    /// wait for the ones they overlap (`IoRequest::after_overlapping`, fio's
    /// `verify_backlog`).
    tracks_overlaps: bool,
    /// Where this stream's requests are recorded for its job's `write_iolog`: an index into
    /// `Host::job_logs`.
    job_log: Option<usize>,
    /// The ranges (offset, length in bytes) of this stream's requests in flight, when it
    /// tracks them, and the next request, kept back while it overlaps one of them.
    inflight_ranges: Vec<(u64, u64)>,
    overlapping: Option<IoRequest>,
}

/// fio's `write_iolog`: the streams of `job` (its clones) record what they issue in one
/// new entry of `job_logs`.
fn attach_job_log(
    job: &JobSpec,
    streams: &mut [Stream],
    job_logs: &mut Vec<(String, Vec<TraceRecord>)>,
) {
    let Some(path) = &job.write_iolog else {
        return;
    };
    job_logs.push((path.clone(), Vec::new()));
    for stream in streams {
        stream.job_log = Some(job_logs.len() - 1);
    }
}

/// fio's steady-state detection for `job`, of stonewall group `group`, whose streams (its
/// clones) are `streams`: with `group_reporting` they join the group's one tracker (the
/// parser has checked that every job of the group asks for the same detection), otherwise
/// each clone gets its own.
fn attach_steady_state(
    job: &JobSpec,
    group: usize,
    streams: (&[Stream], std::ops::Range<u32>),
    trackers: &mut Vec<SteadyTracker>,
) {
    let (all, streams) = streams;
    let spec = job.steady_state;
    if !spec.enabled() {
        return;
    }
    if job.group_reporting {
        match trackers.iter_mut().find(|t| t.group == group) {
            Some(tracker) => tracker.streams.extend(streams),
            None => {
                let mut tracker = SteadyTracker::new(spec, job.name.clone(), group);
                tracker.streams.extend(streams);
                trackers.push(tracker);
            }
        }
        return;
    }
    for stream in streams {
        let name = all[stream as usize].name.clone();
        let mut tracker = SteadyTracker::new(spec, name, group);
        tracker.streams.push(stream);
        trackers.push(tracker);
    }
}

/// Where a stream is with its flow (fio's flow control).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FlowState {
    /// Not counted in its flow: it has no flow, or has not started.
    Out,
    /// Counted in its flow and free to issue while within its share.
    In,
    /// Ahead of its share with a `flow_sleep`: it lets its requests in flight complete
    /// (fio's `io_u_quiesce`) before it sleeps.
    Quiescing,
    /// Ahead of its share: it waits for another stream of the flow to issue (with no
    /// sleep), or for its sleep to pass (an `Event::FlowRetry` is queued).
    Waiting,
    /// Finished: its share has left the flow.
    Left,
}

/// A stream's place in fio's think-time cycle (`handle_thinktime`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Thinking {
    /// Issuing as its queue allows.
    Running,
    /// A pause is due: the stream issues nothing and waits for its requests in flight
    /// (fio's `io_u_quiesce`).
    Quiescing,
    /// Its queue is empty and it pauses until an `Event::ThinkEnd`.
    Pausing,
}

impl Stream {
    /// A stream of group `group` that replays `records` ([`Source::Trace`]), `iodepth` at a
    /// time.
    fn replaying(
        records: std::sync::Arc<Vec<TraceRecord>>,
        timed: Option<f64>,
        iodepth: u32,
        group: usize,
    ) -> Stream {
        let source = Source::Trace {
            records,
            next: 0,
            timed,
            origin_ns: 0,
        };
        Stream::new(source, iodepth, group)
    }

    /// A stream of group `group` that draws its requests from `source`, `iodepth` at a
    /// time, with none of a job's options.
    fn new(source: Source, iodepth: u32, group: usize) -> Stream {
        Stream {
            source,
            group,
            iodepth,
            outstanding: 0,
            exhausted: false,
            deadline_ns: None,
            ramp_end_ns: 0,
            think: ThinkTime::default(),
            thinking: Thinking::Running,
            issued_requests: 0,
            completed_requests: 0,
            think_mark_requests: 0,
            done_by_direction: [(0, 0); 3],
            name: String::new(),
            max_latency_ns: [None; 3],
            latency: None,
            min_rates: [MinRate::default(); 3],
            rate_cycle_ns: 1_000_000_000,
            last_rate_check: [None; 3],
            started_ns: 0,
            flow: None,
            flow_issued: 0,
            flow_state: FlowState::Out,
            flow_credit: false,
            think_mark_ns: 0,
            continue_on_read_error: false,
            runtime_ns: None,
            ramp_time_ns: 0,
            wakeup_pending: false,
            end_flush: false,
            unflushed_writes: false,
            time_based: None,
            start_delay_ns: 0,
            refill_at_depth: iodepth.saturating_sub(1),
            draining: false,
            exit_all: false,
            exit_all_groups: false,
            waits_for: Vec::new(),
            held_back: false,
            serialize_overlap: false,
            tracks_overlaps: false,
            job_log: None,
            inflight_ranges: Vec::new(),
            overlapping: None,
        }
    }

    /// The options of `job` that a stream of it keeps whether it draws its own pattern or
    /// replays a log (`read_iolog`); `waits_for` are the streams its `wait_for` names.
    fn take_job_options(&mut self, job: &JobSpec, waits_for: &[u32], clone: u32) {
        self.name = if job.numjobs > 1 {
            format!("{}.{clone}", job.name)
        } else {
            job.name.clone()
        };
        self.max_latency_ns = job.max_latency_ns;
        self.min_rates = job.min_rates;
        self.flow = job.flow();
        self.rate_cycle_ns = job.rate_cycle_ns;
        let target = &job.latency_target;
        self.latency = target.enabled().then(|| {
            Box::new(LatencySearch::new(
                target.target_ns,
                target.window_ns,
                target.percentile,
                target.keep_searching,
                job.iodepth,
            ))
        });
        self.think = job.think;
        self.continue_on_read_error = job.continue_on_read_error;
        self.runtime_ns = job.runtime_ns;
        self.ramp_time_ns = job.ramp_time_ns;
        self.start_delay_ns = job.start_delay_ns;
        self.exit_all = job.exit_all;
        self.exit_all_groups = job.exit_all_groups;
        self.waits_for = waits_for.to_vec();
        self.serialize_overlap = job.serialize_overlap;
        self.tracks_overlaps = job.serialize_overlap;
    }

    /// Whether a pause is due now (`thinktime_blocks` requests counted, or
    /// `thinktime_iotime` run, since the last one); if so, the count is marked.
    fn think_due(&mut self, now_ns: TimeNs) -> bool {
        if self.think.pause_ns == 0 || self.thinking != Thinking::Running {
            return false;
        }
        let counted = if self.think.count_issued {
            self.issued_requests
        } else {
            self.completed_requests
        };
        let by_time = self.think.iotime_ns > 0
            && now_ns >= self.think_mark_ns.saturating_add(self.think.iotime_ns);
        let by_count = self
            .think
            .blocks_between_pauses()
            .is_some_and(|blocks| counted >= self.think_mark_requests.saturating_add(blocks));
        if by_time || by_count {
            self.think_mark_requests = counted;
            self.thinking = Thinking::Quiescing;
        }
        self.thinking == Thinking::Quiescing
    }

    /// fio's checks of one completed data request that took `latency_ns` (made after the
    /// ramp, as fio's accounting is): `max_latency`, the minimum rates and the
    /// latency-target search. Returns whether the queue may now be filled to a greater
    /// depth, because the search went deeper.
    fn judge_completion(
        &mut self,
        now_ns: TimeNs,
        latency_ns: u64,
        op: IoOp,
        offset_bytes: u64,
    ) -> Result<bool, RunError> {
        let exceeded = |name: &str, limit: String| RunError::LatencyExceeded {
            job: name.to_string(),
            op,
            offset_bytes,
            latency_ns,
            limit,
        };
        let direction = direction_index(op);
        if let Some(max_ns) = self.max_latency_ns[direction] {
            if latency_ns > max_ns {
                return Err(exceeded(&self.name, format!("max_latency={max_ns} ns")));
            }
        }
        self.check_min_rate(now_ns, direction)?;
        if self.latency.is_none() {
            return Ok(false);
        }
        let ios = self.done().0;
        let Some(search) = self.latency.as_mut() else {
            return Ok(false);
        };
        match search.completed(now_ns, latency_ns, ios) {
            Verdict::Fatal => {
                let target_ns = search.target_ns();
                Err(exceeded(
                    &self.name,
                    format!("latency_target={target_ns} ns at queue depth 1"),
                ))
            }
            Verdict::Done => {
                self.deadline_ns = Some(self.deadline_ns.map_or(now_ns, |d| d.min(now_ns)));
                Ok(false)
            }
            Verdict::Deeper => Ok(true),
            Verdict::Continue | Verdict::Quiesce => Ok(false),
        }
    }

    /// The data requests and bytes completed so far, all directions together.
    fn done(&self) -> (u64, u64) {
        self.done_by_direction
            .iter()
            .fold((0, 0), |(ios, bytes), d| (ios + d.0, bytes + d.1))
    }

    /// fio's `__check_min_rate` for `direction`, after one of its requests completed: from
    /// two seconds after the start (fio's settling period), the rate since the last check,
    /// once at least `rate_cycle` has passed, must reach `rate_min` (or, without it,
    /// `rate_iops_min`).
    fn check_min_rate(&mut self, now_ns: TimeNs, direction: usize) -> Result<(), RunError> {
        const SETTLE_NS: u64 = 2_000_000_000;
        let minimum = self.min_rates[direction];
        if !minimum.is_set() || now_ns < self.started_ns.saturating_add(SETTLE_NS) {
            return Ok(());
        }
        let (ios, bytes) = self.done_by_direction[direction];
        if let Some((last_ns, last_ios, last_bytes)) = self.last_rate_check[direction] {
            // fio counts whole milliseconds.
            let spent_ms = (now_ns - last_ns) / 1_000_000;
            if spent_ms == 0 || spent_ms * 1_000_000 < self.rate_cycle_ns {
                return Ok(());
            }
            // fio checks the bytes when both minimums are set.
            let (option, minimum, done, unit) = if minimum.bytes_per_s > 0 {
                ("rate_min", minimum.bytes_per_s, bytes - last_bytes, "B/s")
            } else {
                ("rate_iops_min", minimum.ios_per_s, ios - last_ios, "IOPS")
            };
            let rate = done.saturating_mul(1000) / spent_ms;
            if rate < minimum {
                return Err(RunError::RateBelowMinimum {
                    job: self.name.clone(),
                    direction: ["reads", "writes", "trims"][direction],
                    option,
                    minimum,
                    rate: format!("{rate} {unit}"),
                    window_ms: spent_ms,
                    at_ns: now_ns,
                });
            }
        }
        self.last_rate_check[direction] = Some((now_ns, ios, bytes));
        Ok(())
    }

    /// A latency-target search that waits for the requests in flight (after its depth went
    /// down, or before its final window) goes on once the last has completed; returns
    /// whether it did, so that the queue is filled to the new depth.
    fn end_quiesce(&mut self, now_ns: TimeNs) -> bool {
        let waiting = self.outstanding == 0
            && self
                .latency
                .as_ref()
                .is_some_and(|search| search.quiescing());
        if !waiting {
            return false;
        }
        let ios = self.done().0;
        if let Some(search) = self.latency.as_mut() {
            search.quiesced(now_ns, ios);
        }
        true
    }

    /// The most requests the stream may have in flight now: its `iodepth`, or less while a
    /// latency-target search holds it lower.
    fn depth_limit(&self) -> u32 {
        self.latency
            .as_ref()
            .map_or(self.iodepth, |l| l.depth().min(self.iodepth))
    }

    /// One more request is in flight; a queue that fills up and refills below
    /// `iodepth - 1` starts to drain.
    fn count_issued(&mut self) {
        self.outstanding += 1;
        if self.outstanding >= self.iodepth && self.refill_at_depth + 1 < self.iodepth {
            self.draining = true;
        }
    }
}

/// The depth a full queue of `iodepth` drains to before fio fills it again. fio waits for
/// completions only when the queue is full, and then reaps them in batches of at least
/// `iodepth_batch_complete_min` (0 counts as 1; no more than the queue holds) until the
/// depth is at most `iodepth_low` (0, or a mark above the depth, is the depth itself).
pub(crate) fn refill_depth(iodepth: u32, low: Option<u32>, complete_min: Option<u32>) -> u32 {
    let low = match low {
        Some(l) if l > 0 => l.min(iodepth),
        _ => iodepth,
    };
    let batch = complete_min.unwrap_or(1).clamp(1, iodepth.max(1));
    let batches = (iodepth - low).div_ceil(batch).max(1);
    iodepth.saturating_sub(batches.saturating_mul(batch))
}

/// Mixed into a job's seed for its rate process, so the gaps are not the draws its
/// generator makes.
const RATE_SEED: u64 = 0x7261_7465_5f67_6170;

/// A request in flight, kept in a slab so that queue entries stay small (the heap moves
/// them on every push and pop).
#[derive(Debug, Clone, Copy)]
struct Inflight {
    stream: u32,
    op: IoOp,
    offset_bytes: u64,
    bytes: u64,
    submit_ns: TimeNs,
    /// The device failed it and the job goes on: it counts as an error, not as I/O.
    failed: bool,
}

#[derive(Debug, Clone, Copy)]
enum Event {
    /// The request in slab slot `slot` completes.
    Complete { slot: u32 },
    /// `stream` may issue its next request: a timed trace record or a rate-capped request
    /// it waits for is due.
    Wakeup { stream: u32 },
    /// `stream`'s think-time pause is over: it fills its queue again.
    ThinkEnd { stream: u32 },
    /// The device asked to be called for idle-time work.
    Background,
    /// `stream`'s `startdelay` has passed: it fills its queue.
    Start { stream: u32 },
    /// A steady-state tracker samples its streams (fio's `steadystate_check`).
    SteadyCheck { tracker: u32 },
    /// `stream` waited for its flow (fio's flow control) and tries again.
    FlowRetry { stream: u32 },
}

/// The index of a data request's direction in fio's per-direction options: read, write,
/// trim.
fn direction_index(op: IoOp) -> usize {
    match op {
        IoOp::Read => 0,
        IoOp::Write => 1,
        IoOp::Trim | IoOp::Flush => 2,
    }
}

fn op_class(op: IoOp) -> OpClass {
    match op {
        IoOp::Read => OpClass::Read,
        IoOp::Write => OpClass::Write,
        IoOp::Trim => OpClass::Trim,
        IoOp::Flush => OpClass::Flush,
    }
}

/// Drives `device` with `workload` until every job ends. Deterministic: the same device
/// state, workload and options give the same outcome, bit for bit.
pub fn run(
    device: &mut dyn BlockDevice,
    workload: &Workload,
    options: &RunOptions,
) -> Result<RunOutcome, RunError> {
    PreparedRun::new(device, workload, options)?.run()
}

/// A run set up on its device and not started yet: [`run`] in two steps. A command line
/// tells its user the run's [`notes`](Self::notes) between the two, so that the user learns
/// the workload is not quite what the job file says before the run starts, and still learns
/// it when the run then fails.
pub struct PreparedRun<'d> {
    host: Host<'d>,
}

impl<'d> PreparedRun<'d> {
    /// Sets `workload` up on `device`. Fails where [`run`] fails before its first request.
    pub fn new(
        device: &'d mut dyn BlockDevice,
        workload: &Workload,
        options: &RunOptions,
    ) -> Result<Self, RunError> {
        Ok(Self {
            host: Host::new(device, workload, options)?,
        })
    }

    /// What the run will change in the workload as given; the outcome's
    /// [`RunOutcome::notes`] holds the same.
    pub fn notes(&self) -> &[String] {
        &self.host.notes
    }

    /// Drives the device until every job ends, as [`run`] does.
    pub fn run(mut self) -> Result<RunOutcome, RunError> {
        self.host.run()?;
        Ok(self.host.finish())
    }
}

impl std::fmt::Debug for PreparedRun<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The device is a trait object without `Debug`; the notes are what a caller of a
        // prepared run looks at.
        f.debug_struct("PreparedRun")
            .field("streams", &self.host.streams.len())
            .field("notes", &self.host.notes)
            .finish_non_exhaustive()
    }
}

struct Host<'d> {
    device: &'d mut dyn BlockDevice,
    streams: Vec<Stream>,
    /// Some job's `exitall` has yet to fire, so finished jobs are looked for after every
    /// event.
    exit_all_jobs: bool,
    groups: usize,
    current_group: usize,
    /// When the running group started (`startdelay` counts from it).
    group_start_ns: TimeNs,
    queue: EventQueue<Event>,
    recorder: Recorder,
    oracle: Option<Oracle>,
    sector_bytes: u64,
    capacity_bytes: u64,
    unit_bytes: usize,
    device_outstanding: u32,
    device_queue_depth: u32,
    /// Streams waiting for a device queue slot, in arrival order.
    waiting: std::collections::VecDeque<u32>,
    now_ns: TimeNs,
    hash: EventLogHash,
    host_events: u64,
    requests: u64,
    write_buf: Vec<u8>,
    read_buf: Vec<u8>,
    background_pending: bool,
    background_work: bool,
    progress: Option<(Progress, u64)>,
    inflight: Vec<Inflight>,
    free_slots: Vec<u32>,
    /// The device takes commands through its queued interface (`BlockDevice::queued`).
    queued: bool,
    /// Queued device: the slots of the commands under way.
    queued_slots: std::collections::BTreeSet<u32>,
    /// Queued device: requests held back because they overlap a command under way, in
    /// arrival order (fio's `serialize_overlap`): a device may complete overlapping
    /// commands in any order, so only serialized ones leave every sector's content known.
    parked: std::collections::VecDeque<(u32, IoRequest)>,
    /// The requests issued so far, when the run records them.
    issued: Option<Vec<TraceRecord>>,
    /// [`RunOutcome::job_logs`], filled as the requests are issued.
    job_logs: Vec<(String, Vec<TraceRecord>)>,
    /// [`RunOutcome::notes`].
    notes: Vec<String>,
    /// fio's steady-state detection: one tracker per job clone, or per group with
    /// `group_reporting`.
    trackers: Vec<SteadyTracker>,
    /// fio's flow control between the streams that share a flow id; `has_flows` says
    /// whether any stream has one, so that finished streams are looked for only then.
    flows: Flows,
    has_flows: bool,
}

impl<'d> Host<'d> {
    fn new(
        device: &'d mut dyn BlockDevice,
        workload: &Workload,
        options: &RunOptions,
    ) -> Result<Self, RunError> {
        let info = device.info();
        let queued = device.queued().is_some();
        let sector_bytes = info.sector_bytes as u64;
        let capacity_bytes = info.capacity_sectors * sector_bytes;
        let mut streams: Vec<Stream> = Vec::new();
        let mut groups = 0;
        let mut progress_total = 0u64;
        let mut notes = Vec::new();
        let mut job_logs: Vec<(String, Vec<TraceRecord>)> = Vec::new();
        let mut trackers: Vec<SteadyTracker> = Vec::new();
        match workload {
            Workload::Jobs(jobs) => {
                // The streams of each job so far, for `wait_for`.
                let mut job_streams: Vec<std::ops::Range<u32>> = Vec::with_capacity(jobs.len());
                for (index, job) in jobs.iter().enumerate() {
                    if job.time_based && job.runtime_ns.is_none() {
                        // fio would run such a job forever; a simulation must end.
                        return Err(RunError::Workload(WorkloadError::InvalidJob {
                            job: job.name.clone(),
                            reason: "time_based needs a runtime".into(),
                        }));
                    }
                    if index == 0 || job.stonewall {
                        groups += 1;
                    }
                    // fio's `wait_for` names a job earlier in the file (the parser checks
                    // it); a job of an earlier group has finished before this one's starts.
                    let waits_for: Vec<u32> = match &job.wait_for {
                        Some(name) => {
                            let waitee = jobs[..index].iter().rposition(|j| &j.name == name);
                            match waitee {
                                Some(w) => job_streams[w]
                                    .clone()
                                    .filter(|&i| streams[i as usize].group == groups - 1)
                                    .collect(),
                                None => {
                                    return Err(RunError::Workload(WorkloadError::InvalidJob {
                                        job: job.name.clone(),
                                        reason: format!(
                                            "wait_for={name} names no job before this one"
                                        ),
                                    }))
                                }
                            }
                        }
                        None => Vec::new(),
                    };
                    let first_stream = streams.len() as u32;
                    if let Some(path) = &job.read_iolog {
                        let invalid = |reason: String| {
                            RunError::Workload(WorkloadError::InvalidJob {
                                job: job.name.clone(),
                                reason,
                            })
                        };
                        let records = job.iolog_records.clone().ok_or_else(|| {
                            invalid(format!(
                                "read_iolog={path} was not read (afa_workload::fio::resolve_iologs)"
                            ))
                        })?;
                        if job.time_based {
                            return Err(invalid(
                                "time_based with read_iolog is not modelled: a replay ends \
                                 with its log"
                                    .into(),
                            ));
                        }
                        check_replay_fits(&records, &info, || {
                            format!("job [{}]: read_iolog", job.name)
                        })?;
                        // fio replays the log in place of the job's own pattern; the job
                        // keeps its queue depth, timing options and place among the jobs.
                        let timed = (!job.replay_no_stall)
                            .then(|| 100.0 / f64::from(job.replay_time_scale_percent.max(1)));
                        for clone in 0..job.numjobs {
                            progress_total += records.iter().map(|r| r.len_bytes).sum::<u64>();
                            let mut stream =
                                Stream::replaying(records.clone(), timed, job.iodepth, groups - 1);
                            stream.take_job_options(job, &waits_for, clone);
                            streams.push(stream);
                        }
                        job_streams.push(first_stream..streams.len() as u32);
                        attach_job_log(job, &mut streams[first_stream as usize..], &mut job_logs);
                        attach_steady_state(
                            job,
                            groups - 1,
                            (&streams, first_stream..streams.len() as u32),
                            &mut trackers,
                        );
                        continue;
                    }
                    // The clones whose region the device's end cut short, and the first
                    // of them, for one note per job however many clones it has.
                    let mut cut_clones = 0u32;
                    let mut first_cut = None;
                    for clone in 0..job.numjobs {
                        let seed = options.seed ^ (index as u64) << 32;
                        let generator =
                            JobGenerator::new(job, capacity_bytes, sector_bytes, seed, clone)?;
                        // Each request goes to the device as one command (the host does not
                        // split requests as a kernel's block layer would), so one the device
                        // would refuse is refused here, before the run, not at its first draw.
                        let longest_bytes = generator.longest_data_request_bytes();
                        let max_transfer_bytes = info.max_transfer_sectors as u64 * sector_bytes;
                        if longest_bytes > max_transfer_bytes {
                            return Err(RunError::Workload(WorkloadError::InvalidJob {
                                job: job.name.clone(),
                                reason: format!(
                                    "requests of up to {longest_bytes} bytes exceed the device's maximum transfer of {} sectors ({max_transfer_bytes} bytes); each request is one device command",
                                    info.max_transfer_sectors
                                ),
                            }));
                        }
                        if let Some(wanted_bytes) = generator.size_cut() {
                            cut_clones += 1;
                            first_cut.get_or_insert((clone, wanted_bytes, generator.region()));
                        }
                        let per_loop_bytes = job.io_size_bytes.unwrap_or(generator.region().1).min(
                            job.number_ios.map_or(u64::MAX, |n| {
                                n.saturating_mul(job.block_sizes[1].max_bytes())
                            }),
                        );
                        // The verify pass reads back the share of the bytes that are writes.
                        let write_percent = match job.rw {
                            RwMode::Write | RwMode::RandWrite => 100,
                            RwMode::ReadWrite | RwMode::RandRw => {
                                100u32.saturating_sub(job.rwmixread_percent)
                            }
                            // Every range is trimmed and then written.
                            RwMode::TrimWrite | RwMode::RandTrimWrite => 100,
                            _ => 0,
                        };
                        let verify_bytes = if job.verify {
                            per_loop_bytes / 100 * u64::from(write_percent)
                        } else {
                            0
                        };
                        // A trim-then-write job transfers its bytes twice.
                        let trims_bytes = if job.rw.is_trim_write() {
                            per_loop_bytes
                        } else {
                            0
                        };
                        progress_total += per_loop_bytes
                            .saturating_add(trims_bytes)
                            .saturating_add(verify_bytes)
                            .saturating_mul(u64::from(job.loops));
                        let source = Source::Job {
                            generator: Box::new(generator),
                            ahead: std::collections::VecDeque::with_capacity(3),
                            rate: RateGate::new(job, seed ^ (clone as u64) << 16 ^ RATE_SEED),
                        };
                        let mut stream = Stream::new(source, job.iodepth, groups - 1);
                        stream.take_job_options(job, &waits_for, clone);
                        // What only a job's own pattern has, not a replay of a log.
                        stream.end_flush = job.end_flush;
                        stream.time_based = job.time_based.then(|| job.name.clone());
                        stream.refill_at_depth = refill_depth(
                            job.iodepth,
                            job.iodepth_low,
                            job.iodepth_batch_complete_min,
                        );
                        stream.tracks_overlaps |= job.verify && job.verify_backlog.is_some();
                        streams.push(stream);
                    }
                    job_streams.push(first_stream..streams.len() as u32);
                    attach_job_log(job, &mut streams[first_stream as usize..], &mut job_logs);
                    attach_steady_state(
                        job,
                        groups - 1,
                        (&streams, first_stream..streams.len() as u32),
                        &mut trackers,
                    );
                    if let Some((clone, wanted_bytes, (start_bytes, len_bytes))) = first_cut {
                        let which = if job.numjobs > 1 {
                            format!(
                                " clone {clone} ({cut_clones} of its {} clones)",
                                job.numjobs
                            )
                        } else {
                            String::new()
                        };
                        let budget = if job.io_size_bytes.is_none() {
                            ", which is also all it transfers (io_size= defaults to the region)"
                        } else {
                            ""
                        };
                        notes.push(format!(
                            "job \"{}\"{which}: size={wanted_bytes} bytes from offset \
                             {start_bytes} reaches past the end of the {capacity_bytes}-byte \
                             device, so its region is cut to the {len_bytes} bytes up to the \
                             end{budget}; fio cuts it the same way on a block device",
                            job.name
                        ));
                    }
                }
            }
            Workload::Trace { records, replay } => {
                check_replay_fits(records, &info, || "the trace".to_string())?;
                groups = 1;
                progress_total = records.iter().map(|r| r.len_bytes).sum();
                let (iodepth, timed) = match *replay {
                    TraceReplay::Timed { time_scale } => (u32::MAX, Some(time_scale)),
                    TraceReplay::Closed { iodepth } => (iodepth.max(1), None),
                };
                streams.push(Stream::replaying(
                    std::sync::Arc::new(records.clone()),
                    timed,
                    iodepth,
                    0,
                ));
            }
        }
        let oracle = (info.payload_unit_bytes > 0).then(|| {
            Oracle::new(
                info.capacity_sectors,
                options.preconditioned_sectors.min(info.capacity_sectors),
            )
        });
        let progress = options
            .show_progress
            .then(|| (Progress::new(progress_total.max(1), "bytes"), 0));
        let has_flows = streams.iter().any(|s| s.flow.is_some());
        Ok(Self {
            device,
            exit_all_jobs: streams.iter().any(|s| s.exit_all),
            streams,
            groups,
            current_group: 0,
            group_start_ns: 0,
            queue: EventQueue::with_capacity(1024),
            recorder: Recorder::new(options.timeline_interval_ns),
            oracle,
            sector_bytes,
            capacity_bytes,
            unit_bytes: info.payload_unit_bytes as usize,
            device_outstanding: 0,
            device_queue_depth: info.max_queue_depth.max(1),
            waiting: std::collections::VecDeque::new(),
            now_ns: 0,
            hash: EventLogHash::new(),
            host_events: 0,
            requests: 0,
            write_buf: Vec::new(),
            read_buf: Vec::new(),
            background_pending: false,
            background_work: options.background_work,
            progress,
            inflight: Vec::new(),
            free_slots: Vec::new(),
            queued,
            queued_slots: std::collections::BTreeSet::new(),
            issued: options.record_requests.then(Vec::new),
            job_logs,
            parked: std::collections::VecDeque::new(),
            notes,
            trackers,
            flows: Flows::default(),
            has_flows,
        })
    }

    fn run(&mut self) -> Result<(), RunError> {
        if self.streams.is_empty() {
            return Ok(());
        }
        self.start_group(0)?;
        let (mut instant_ns, mut events_at_instant) = (0, 0u64);
        loop {
            // A queued device's completions come back as its clock passes them: it runs up
            // to its next event whenever that comes before the host's next one.
            if self.queued && self.device_outstanding > 0 {
                let device_t = self.device.queued().and_then(|q| q.next_event_ns());
                match (device_t, self.queue.peek_time()) {
                    (Some(d), host) if host.is_none_or(|h| d <= h) => {
                        self.collect_queued(d)?;
                        continue;
                    }
                    (None, None) => {
                        return Err(RunError::Stalled {
                            outstanding: self.device_outstanding,
                        })
                    }
                    _ => {}
                }
            }
            let Some((t, event)) = self.queue.pop() else {
                // A held-back request waits for a command under way, so none can be left
                // once nothing is.
                if !self.parked.is_empty() {
                    return Err(RunError::Stalled {
                        outstanding: self.parked.len() as u32,
                    });
                }
                break;
            };
            // A tracker whose streams have all finished checks nothing more; its last check
            // must not stretch the run past its last completion.
            if let Event::SteadyCheck { tracker } = event {
                if !self.tracker_running(tracker as usize) {
                    continue;
                }
            }
            self.now_ns = t;
            self.host_events += 1;
            if t == instant_ns {
                events_at_instant += 1;
                if events_at_instant > EVENTS_AT_ONE_INSTANT_MAX {
                    self.refuse_a_timeless_loop(t, events_at_instant)?;
                }
            } else {
                (instant_ns, events_at_instant) = (t, 0);
            }
            match event {
                Event::Complete { slot } => {
                    let Inflight {
                        stream,
                        op,
                        offset_bytes,
                        bytes,
                        submit_ns,
                        failed,
                    } = self.inflight[slot as usize];
                    self.free_slots.push(slot);
                    self.hash.record(t, 1, stream as u64);
                    self.device_outstanding -= 1;
                    let s = &mut self.streams[stream as usize];
                    s.outstanding -= 1;
                    if let Some(i) = s
                        .inflight_ranges
                        .iter()
                        .position(|&r| r == (offset_bytes, bytes))
                    {
                        s.inflight_ranges.swap_remove(i);
                    }
                    if !failed && op != IoOp::Flush {
                        let d = &mut s.done_by_direction[direction_index(op)];
                        d.0 += 1;
                        d.1 += bytes;
                    }
                    let mut fill = false;
                    if !failed && op != IoOp::Flush && t >= s.ramp_end_ns {
                        fill = s.judge_completion(t, t - submit_ns, op, offset_bytes)?;
                    }
                    fill |= s.end_quiesce(t);
                    if failed {
                        self.recorder.record_error(op_class(op));
                    } else if t >= s.ramp_end_ns {
                        self.recorder.record(op_class(op), submit_ns, t, bytes);
                    }
                    if let Some((p, done)) = self.progress.as_mut() {
                        *done += bytes;
                        p.update(*done);
                    }
                    if let Some(next) = self.waiting.pop_front() {
                        self.issue(next)?;
                    }
                    if !self.think_after_completion(stream, op) {
                        self.refill(stream)?;
                    }
                    if fill {
                        self.issue_filling(stream, true)?;
                    }
                    self.maybe_finish_group()?;
                }
                Event::Wakeup { stream } => {
                    self.hash.record(t, 2, stream as u64);
                    // Only the wake-up itself clears the flag. A think-time event that
                    // cleared it while the wake-up was still queued let the rate cap queue
                    // another, and every wake-up that then found its request not yet due
                    // queued one more: with `thinktime` and `rate` together the queue grew
                    // with every request and a run crawled at a thousand requests per
                    // host second.
                    let s = &mut self.streams[stream as usize];
                    s.wakeup_pending = false;
                    if s.thinking == Thinking::Running {
                        self.refill(stream)?;
                    }
                    self.maybe_finish_group()?;
                }
                Event::ThinkEnd { stream } => {
                    self.hash.record(t, 5, stream as u64);
                    let s = &mut self.streams[stream as usize];
                    s.thinking = Thinking::Running;
                    s.think_mark_ns = t;
                    // The queue emptied for the pause, so it is below any low-water mark.
                    s.draining = false;
                    if s.think.rate_ignores_pause {
                        if let Source::Job {
                            rate: Some(rate), ..
                        } = &mut s.source
                        {
                            rate.postpone(s.think.pause_total_ns());
                        }
                    }
                    // fio fills its queue again after a pause, as at the start.
                    self.issue_filling(stream, true)?;
                    self.maybe_finish_group()?;
                }
                Event::Background => {
                    self.background_pending = false;
                }
                Event::Start { stream } => {
                    self.hash.record(t, 4, stream as u64);
                    self.fill_at_start(stream as usize)?;
                    self.maybe_finish_group()?;
                }
                Event::FlowRetry { stream } => {
                    self.hash.record(t, 7, u64::from(stream));
                    let s = &mut self.streams[stream as usize];
                    if s.flow_state == FlowState::Waiting {
                        s.flow_state = FlowState::In;
                        if s.thinking == Thinking::Running {
                            self.issue_filling(stream, true)?;
                        }
                    }
                    self.maybe_finish_group()?;
                }
                Event::SteadyCheck { tracker } => {
                    self.hash.record(t, 6, u64::from(tracker));
                    self.check_steady_state(tracker as usize);
                    self.maybe_finish_group()?;
                }
            }
            self.maybe_background();
        }
        Ok(())
    }

    /// Fails the run when a `time_based` job is still running after `events` events at the
    /// instant `at_ns`: its runtime would never be reached.
    fn refuse_a_timeless_loop(&self, at_ns: TimeNs, events: u64) -> Result<(), RunError> {
        let running = self
            .streams
            .iter()
            .filter(|s| s.group == self.current_group && !s.exhausted);
        match running.filter_map(|s| s.time_based.as_ref()).next() {
            Some(job) => Err(RunError::NoProgress {
                job: job.clone(),
                at_ns,
                events,
            }),
            None => Ok(()),
        }
    }

    /// Runs a queued device up to `t_ns` and turns what completed into completion events;
    /// reads are checked here (nothing that overlaps a read runs beside it, so its sectors
    /// hold now what they held when it started), and held-back requests that no longer
    /// overlap anything under way start.
    fn collect_queued(&mut self, t_ns: TimeNs) -> Result<(), RunError> {
        let completions = self
            .device
            .queued()
            .expect("a queued device")
            .advance_to(t_ns);
        for c in completions {
            let slot = c.tag as u32;
            let record = self.inflight[slot as usize];
            self.queued_slots.remove(&slot);
            match c.result {
                Ok(data) => {
                    if let (Some(oracle), IoOp::Read) = (self.oracle.as_mut(), record.op) {
                        let lba = record.offset_bytes / self.sector_bytes;
                        oracle.check(lba, &data, self.unit_bytes, c.done_ns);
                    }
                }
                Err(_)
                    if record.op == IoOp::Read
                        && self.streams[record.stream as usize].continue_on_read_error =>
                {
                    self.inflight[slot as usize].failed = true;
                }
                Err(source) => {
                    return Err(RunError::Device {
                        op: record.op,
                        offset_bytes: record.offset_bytes,
                        len_bytes: record.bytes,
                        source,
                    })
                }
            }
            let done = c.done_ns.max(self.now_ns);
            self.hash
                .record(done, 3, record.offset_bytes / self.sector_bytes.max(1));
            self.queue.push(done, Event::Complete { slot });
        }
        // What was held back behind the commands that completed starts when they did.
        self.now_ns = self.now_ns.max(t_ns);
        self.start_parked()
    }

    /// Gives the device idle time when nothing is outstanding.
    fn maybe_background(&mut self) {
        if !self.background_work || self.device_outstanding > 0 || self.background_pending {
            return;
        }
        if let Some(next) = self.device.background(self.now_ns) {
            // Only worth waking up if the host would otherwise stay idle until then.
            if self.queue.peek_time().is_none_or(|t| t > next) && next > self.now_ns {
                self.background_pending = true;
                self.queue.push(next, Event::Background);
            }
        }
    }

    fn start_group(&mut self, group: usize) -> Result<(), RunError> {
        self.current_group = group;
        self.group_start_ns = self.now_ns;
        let now = self.now_ns;
        let mut max_ramp_end = now;
        for i in 0..self.streams.len() {
            let s = &mut self.streams[i];
            if s.group != group {
                continue;
            }
            // The measurement of the run as a whole starts after the ramps alone.
            max_ramp_end = max_ramp_end.max(now + s.ramp_time_ns);
            if !s.waits_for.is_empty() {
                s.held_back = true;
                continue;
            }
            self.start_stream(i)?;
        }
        if group == 0 {
            self.recorder.set_measure_from_ns(max_ramp_end);
        }
        for (i, tracker) in self.trackers.iter_mut().enumerate() {
            if tracker.group == group {
                let first_check_ns = tracker.start(now);
                self.queue
                    .push(first_check_ns, Event::SteadyCheck { tracker: i as u32 });
            }
        }
        self.maybe_finish_group()
    }

    /// Starts stream `i` of the running group now, or at its `startdelay` after the group's
    /// start if that is later. A delayed job's ramp and runtime count from its own start.
    fn start_stream(&mut self, i: usize) -> Result<(), RunError> {
        let now = self.now_ns;
        let s = &mut self.streams[i];
        let start = now.max(self.group_start_ns + s.start_delay_ns);
        s.deadline_ns = s.runtime_ns.map(|r| start + s.ramp_time_ns + r);
        match &mut s.source {
            Source::Job {
                rate: Some(rate), ..
            } => rate.start(start),
            Source::Trace { origin_ns, .. } => *origin_ns = start,
            Source::Job { rate: None, .. } => {}
        }
        s.ramp_end_ns = start + s.ramp_time_ns;
        s.think_mark_ns = start;
        s.started_ns = start;
        let done_ios = s.done().0;
        if let Some(search) = s.latency.as_mut() {
            search.start(start, done_ios);
        }
        if start > now {
            self.queue.push(start, Event::Start { stream: i as u32 });
            return Ok(());
        }
        if matches!(s.source, Source::Trace { timed: Some(_), .. }) {
            s.wakeup_pending = true;
            self.queue.push(now, Event::Wakeup { stream: i as u32 });
            return Ok(());
        }
        self.fill_at_start(i)
    }

    /// fio's `wait_for`: starts the running group's streams held back for jobs that have
    /// now finished (issued their last request and seen it complete).
    fn release_waiting_streams(&mut self) -> Result<(), RunError> {
        for i in 0..self.streams.len() {
            let s = &self.streams[i];
            if !s.held_back || s.group != self.current_group {
                continue;
            }
            let finished = s.waits_for.iter().all(|&w| {
                let waitee = &self.streams[w as usize];
                waitee.exhausted && waitee.outstanding == 0
            });
            if finished {
                let s = &mut self.streams[i];
                s.held_back = false;
                s.waits_for.clear();
                self.start_stream(i)?;
            }
        }
        Ok(())
    }

    /// fio's `flow_threshold_exceeded` before a request of `stream`: whether it may go. One
    /// that may wakes the streams that waited for its flow to move; one that may not waits,
    /// for them or for its `flow_sleep` once its requests in flight have completed.
    fn pass_flow(&mut self, stream: u32) -> bool {
        let now = self.now_ns;
        let s = &mut self.streams[stream as usize];
        let Some(flow) = s.flow else {
            return true;
        };
        match self.flows.pass(flow.id, flow.weight, &mut s.flow_issued) {
            Ok(woken) => {
                s.flow_credit = true;
                self.wake_flow_waiters(woken);
                true
            }
            Err(()) => {
                if flow.sleep_ns == 0 {
                    s.flow_state = FlowState::Waiting;
                    self.flows.wait(flow.id, stream);
                } else if s.outstanding == 0 {
                    s.flow_state = FlowState::Waiting;
                    self.queue.push(
                        now.saturating_add(flow.sleep_ns),
                        Event::FlowRetry { stream },
                    );
                } else {
                    s.flow_state = FlowState::Quiescing;
                }
                false
            }
        }
    }

    /// The streams that waited for their flow to move try again now.
    fn wake_flow_waiters(&mut self, woken: Vec<u32>) {
        let now = self.now_ns;
        for w in woken {
            self.queue.push(now, Event::FlowRetry { stream: w });
        }
    }

    /// Counts a starting stream in its flow.
    fn join_flow(&mut self, stream: usize) {
        let s = &mut self.streams[stream];
        if let (Some(flow), FlowState::Out) = (s.flow, s.flow_state) {
            s.flow_state = FlowState::In;
            self.flows.join(flow.id, flow.weight);
        }
    }

    /// fio's flow control after a completion or a stream's end: a stream that quiesced for
    /// its `flow_sleep` starts sleeping once its last request has completed, and the share
    /// of a stream that has finished leaves its flow, waking the streams that waited in it.
    fn settle_flows(&mut self) {
        let now = self.now_ns;
        for i in 0..self.streams.len() {
            let s = &mut self.streams[i];
            let Some(flow) = s.flow else {
                continue;
            };
            if s.flow_state == FlowState::Quiescing && s.outstanding == 0 {
                s.flow_state = FlowState::Waiting;
                self.queue.push(
                    now.saturating_add(flow.sleep_ns),
                    Event::FlowRetry { stream: i as u32 },
                );
            }
            let s = &mut self.streams[i];
            let finished = s.exhausted && s.outstanding == 0;
            if finished && matches!(s.flow_state, FlowState::In | FlowState::Waiting) {
                s.flow_state = FlowState::Left;
                let woken = self.flows.leave(flow.id, flow.weight, s.flow_issued);
                self.wake_flow_waiters(woken);
            }
        }
    }

    /// A job's first requests: as many as its queue holds.
    fn fill_at_start(&mut self, stream: usize) -> Result<(), RunError> {
        self.join_flow(stream);
        for _ in 0..self.streams[stream].iodepth {
            self.issue(stream as u32)?;
            if self.streams[stream].exhausted {
                break;
            }
        }
        Ok(())
    }

    /// fio's think time when one of `stream`'s requests of kind `op` has completed: counts
    /// it, decides whether a pause is due, and starts the pause once the queue is empty.
    /// Returns whether the stream waits (for its queue to empty or its pause to end), in
    /// which case it is not refilled now. A stream with nothing left to issue does not
    /// pause: fio's loop ends with its last request.
    fn think_after_completion(&mut self, stream: u32, op: IoOp) -> bool {
        let now = self.now_ns;
        let s = &mut self.streams[stream as usize];
        if s.think.pause_ns == 0 {
            return false;
        }
        if op != IoOp::Flush {
            s.completed_requests += 1;
            s.think_due(now);
        }
        if s.thinking == Thinking::Quiescing && s.outstanding == 0 {
            if s.exhausted {
                s.thinking = Thinking::Running;
                return false;
            }
            s.thinking = Thinking::Pausing;
            // A pause never outlasts the job's runtime: fio sleeps at most what is left.
            let end = now.saturating_add(s.think.pause_total_ns());
            let end = s.deadline_ns.map_or(end, |d| end.min(d.max(now)));
            self.queue.push(end, Event::ThinkEnd { stream });
        }
        s.thinking != Thinking::Running
    }

    /// A stream's queue has room again (a completion, the end of a think time, a wake-up).
    /// fio refills it at once, unless `iodepth_low` or `iodepth_batch_complete_min` make a
    /// full queue drain first: then it waits, and fills the queue up when the depth gets to
    /// the stream's `refill_at_depth`.
    fn refill(&mut self, stream: u32) -> Result<(), RunError> {
        let s = &mut self.streams[stream as usize];
        if !s.draining {
            return self.issue(stream);
        }
        if s.outstanding > s.refill_at_depth {
            return Ok(());
        }
        s.draining = false;
        self.issue_filling(stream, true)
    }

    fn maybe_finish_group(&mut self) -> Result<(), RunError> {
        if self.has_flows {
            self.settle_flows();
        }
        let group = self.current_group;
        self.maybe_exit_all(group);
        if self.streams.iter().any(|s| s.held_back) {
            self.release_waiting_streams()?;
        }
        let done = self
            .streams
            .iter()
            .filter(|s| s.group == group)
            .all(|s| s.exhausted && s.outstanding == 0);
        if done && group + 1 < self.groups {
            self.start_group(group + 1)?;
        }
        Ok(())
    }

    /// fio's `exitall`: once a job that sets it has finished (issued its last request and
    /// seen it complete), every other job of its group is stopped as its runtime would
    /// stop it: it issues nothing more (but the FLUSH `end_fsync` asks for), and its
    /// requests in flight complete.
    fn maybe_exit_all(&mut self, group: usize) {
        if !self.exit_all_jobs {
            return;
        }
        let now = self.now_ns;
        let finished = self
            .streams
            .iter()
            .find(|s| s.group == group && s.exit_all && s.exhausted && s.outstanding == 0);
        let Some(finished) = finished else {
            return;
        };
        // `exit_what=all`: the groups after this one never start.
        if finished.exit_all_groups {
            self.groups = self.groups.min(group + 1);
        }
        for s in self.streams.iter_mut().filter(|s| s.group == group) {
            s.exit_all = false;
            if s.held_back {
                // A job still waiting for another (`wait_for`) never starts.
                s.held_back = false;
                s.exhausted = true;
            } else if !s.exhausted {
                s.deadline_ns = Some(s.deadline_ns.map_or(now, |d| d.min(now)));
            }
        }
        self.exit_all_jobs = self.streams.iter().any(|s| s.exit_all);
    }

    /// Whether any stream `tracker` judges has yet to finish (or to start).
    fn tracker_running(&self, tracker: usize) -> bool {
        self.trackers[tracker].streams.iter().any(|&i| {
            let s = &self.streams[i as usize];
            !(s.exhausted && s.outstanding == 0)
        })
    }

    /// fio's `steadystate_check` for one tracker: samples what its streams completed since
    /// the last check. Once the window meets the criterion its streams stop as their runtime
    /// would stop them (as `exitall` stops a group); otherwise the next check is queued.
    fn check_steady_state(&mut self, tracker: usize) {
        let now = self.now_ns;
        let t = &self.trackers[tracker];
        let (ios, bytes) = t.streams.iter().fold((0, 0), |(ios, bytes), &i| {
            let s = &self.streams[i as usize];
            let (done_ios, done_bytes) = s.done();
            (ios + done_ios, bytes + done_bytes)
        });
        let t = &mut self.trackers[tracker];
        if !t.check(now, ios, bytes) {
            let next_ns = t.next_check_ns(now);
            self.queue.push(
                next_ns,
                Event::SteadyCheck {
                    tracker: tracker as u32,
                },
            );
            return;
        }
        for &i in &t.streams {
            let s = &mut self.streams[i as usize];
            if s.held_back {
                // A job still waiting for another (`wait_for`) never starts.
                s.held_back = false;
                s.exhausted = true;
            } else if !s.exhausted {
                s.deadline_ns = Some(s.deadline_ns.map_or(now, |d| d.min(now)));
            }
        }
    }

    /// The next request of a stream, or None when it is done.
    fn next_request(&mut self, stream: u32) -> Option<IoRequest> {
        let now = self.now_ns;
        let capacity = self.capacity_bytes;
        let sector = self.sector_bytes;
        let s = &mut self.streams[stream as usize];
        if s.exhausted {
            return None;
        }
        if s.deadline_ns.is_some_and(|d| now >= d) {
            s.exhausted = true;
            // fio's `end_fsync` ends a job its runtime stops as it ends one that ran out of
            // bytes (the generator issues that one).
            if s.end_flush && s.unflushed_writes {
                s.unflushed_writes = false;
                return Some(IoRequest {
                    op: IoOp::Flush,
                    offset_bytes: 0,
                    len_bytes: 0,
                    fua: false,
                    drain_first: false,
                    after_overlapping: false,
                });
            }
            return None;
        }
        let request = match &mut s.source {
            Source::Job {
                generator,
                ahead,
                rate,
            } => {
                // A rate-capped job draws each request when a slot is free for it, so that
                // its direction can follow the rates at that moment.
                let lookahead = if rate.is_some() { 1 } else { 3 };
                while ahead.len() < lookahead {
                    let drawn = match rate.as_deref() {
                        Some(gate) => generator.next_io_choosing(|op| gate.choose(op, now)),
                        None => generator.next_io(),
                    };
                    match drawn {
                        Some(r) => ahead.push_back(r),
                        None => break,
                    }
                }
                // fio's verify pass starts once the writes it reads back have completed.
                if ahead.front().is_some_and(|r| r.drain_first) && s.outstanding > 0 {
                    return None;
                }
                if let (Some(rate), Some(next)) = (rate.as_mut(), ahead.front()) {
                    let due = rate.due_ns(next);
                    if due > now {
                        // Not yet: come back when the cap allows it (once), or when the
                        // runtime ends if that comes first, so the job ends on time.
                        if !s.wakeup_pending {
                            s.wakeup_pending = true;
                            let wake = s.deadline_ns.map_or(due, |d| d.min(due));
                            self.queue.push(wake, Event::Wakeup { stream });
                        }
                        return None;
                    }
                    rate.issued(next);
                }
                let request = ahead.pop_front();
                for (stage, r) in ahead.iter().enumerate() {
                    if r.op == IoOp::Write {
                        self.device
                            .prefetch(r.offset_bytes / sector, 1 - stage as u8);
                    }
                }
                request
            }
            Source::Trace {
                records,
                next,
                timed,
                origin_ns,
            } => {
                let r = records.get(*next).copied();
                if let (Some(scale), Some(r)) = (*timed, r) {
                    let due = origin_ns.saturating_add((r.timestamp_ns as f64 * scale) as TimeNs);
                    if due > now {
                        // Not yet: come back at the record's time (once).
                        if !s.wakeup_pending {
                            s.wakeup_pending = true;
                            self.queue.push(due, Event::Wakeup { stream });
                        }
                        return None;
                    }
                }
                *next += 1;
                r.map(|r| wrap_trace_request(r, capacity, sector))
            }
        };
        match request.map(|r| r.op) {
            None => s.exhausted = true,
            Some(IoOp::Write) => s.unflushed_writes = true,
            Some(IoOp::Flush) => s.unflushed_writes = false,
            Some(_) => {}
        }
        request
    }

    fn issue(&mut self, stream: u32) -> Result<(), RunError> {
        self.issue_filling(stream, false)
    }

    /// Issues the stream's next request, or with `filling` as many as its queue takes (a
    /// queue that drained to its refill depth, or to nothing for fio's verify pass, is
    /// filled again at once).
    fn issue_filling(&mut self, stream: u32, mut filling: bool) -> Result<(), RunError> {
        loop {
            let s = &self.streams[stream as usize];
            if s.outstanding >= s.depth_limit()
                || s.latency.as_ref().is_some_and(|l| l.quiescing())
                || matches!(s.flow_state, FlowState::Quiescing | FlowState::Waiting)
                || s.draining
                || s.thinking != Thinking::Running
                || s.group != self.current_group
            {
                return Ok(());
            }
            if self.device_outstanding >= self.device_queue_depth {
                self.waiting.push_back(stream);
                return Ok(());
            }
            // fio's flow control decides before each new request (a request kept back for
            // an overlap has already been counted).
            let s = &self.streams[stream as usize];
            if s.flow_state == FlowState::In
                && !s.flow_credit
                && s.overlapping.is_none()
                && !s.exhausted
                && !self.pass_flow(stream)
            {
                return Ok(());
            }
            // A request kept back for an overlap is dropped when the runtime has ended
            // meanwhile; the next one is asked for, which ends the stream.
            let now = self.now_ns;
            let s = &mut self.streams[stream as usize];
            let running = s.deadline_ns.is_none_or(|d| now < d);
            let kept = s.overlapping.take().filter(|_| running);
            let Some(request) = kept.or_else(|| self.next_request(stream)) else {
                return Ok(());
            };
            let s = &mut self.streams[stream as usize];
            if s.tracks_overlaps && request.op != IoOp::Flush {
                let (start, end) = (
                    request.offset_bytes,
                    request.offset_bytes + request.len_bytes,
                );
                let waits = s.serialize_overlap || request.after_overlapping;
                if waits
                    && s.inflight_ranges
                        .iter()
                        .any(|&(o, l)| o < end && start < o + l)
                {
                    // fio's `serialize_overlap`, or a verify read of a write in flight:
                    // the request waits for the one it overlaps.
                    s.overlapping = Some(request);
                    return Ok(());
                }
                s.inflight_ranges
                    .push((request.offset_bytes, request.len_bytes));
            }
            // A request that waited for its stream to drain starts from an empty queue.
            filling |= request.drain_first;
            let op = request.op;
            self.streams[stream as usize].flow_credit = false;
            self.submit(stream, request)?;
            let now = self.now_ns;
            let s = &mut self.streams[stream as usize];
            if op != IoOp::Flush {
                s.issued_requests += 1;
                if s.think_due(now) {
                    return Ok(());
                }
            }
            // A timed trace issues every record that is due, and so does a rate-capped job
            // when its wake-up comes; any other job issues one request per free slot, and its
            // slots are refilled one by one as completions arrive.
            let timed = matches!(
                self.streams[stream as usize].source,
                Source::Trace { timed: Some(_), .. } | Source::Job { rate: Some(_), .. }
            );
            if !timed && !filling {
                return Ok(());
            }
        }
    }

    fn submit(&mut self, stream: u32, request: IoRequest) -> Result<(), RunError> {
        let record = TraceRecord {
            timestamp_ns: self.now_ns,
            op: request.op,
            offset_bytes: request.offset_bytes,
            len_bytes: request.len_bytes,
            volume: 0,
            fua: request.fua,
        };
        if let Some(issued) = self.issued.as_mut() {
            issued.push(record);
        }
        if let Some(log) = self.streams[stream as usize].job_log {
            self.job_logs[log].1.push(record);
        }
        let sector = self.sector_bytes;
        if request.op != IoOp::Flush
            && (request.offset_bytes % sector != 0 || request.len_bytes % sector != 0)
        {
            return Err(RunError::Unaligned {
                offset_bytes: request.offset_bytes,
                len_bytes: request.len_bytes,
                sector_bytes: sector as u32,
            });
        }
        let lba = request.offset_bytes / sector;
        let sectors = (request.len_bytes / sector) as u32;
        if self.queued {
            return self.submit_queued(stream, request, lba, sectors);
        }
        let unit = self.unit_bytes;
        let now = self.now_ns;
        let device_error = |source| RunError::Device {
            op: request.op,
            offset_bytes: request.offset_bytes,
            len_bytes: request.len_bytes,
            source,
        };
        let mut failed = false;
        let completion = match request.op {
            IoOp::Write => {
                self.stage_write(lba, sectors);
                let cmd = write_command(lba, sectors, &self.write_buf, request.fua);
                self.device
                    .submit(now, &cmd, ReadBuffers::none())
                    .map_err(device_error)?
            }
            IoOp::Read => {
                self.read_buf.resize(sectors as usize * unit, 0);
                let read = self.device.submit(
                    now,
                    &Command::read(lba, sectors),
                    ReadBuffers {
                        data: &mut self.read_buf,
                        tags: None,
                    },
                );
                match read {
                    Ok(c) => {
                        if let Some(oracle) = self.oracle.as_mut() {
                            oracle.check(lba, &self.read_buf, unit, now);
                        }
                        c
                    }
                    // The job counts the error and goes on; the failed read returned nothing
                    // to check, and it completes at once so that the queue stays full.
                    Err(_) if self.streams[stream as usize].continue_on_read_error => {
                        failed = true;
                        Completion {
                            done_ns: now,
                            gc_active: false,
                        }
                    }
                    Err(e) => return Err(device_error(e)),
                }
            }
            IoOp::Trim => {
                self.forget(lba, sectors);
                self.device
                    .submit(now, &Command::trim(lba, sectors), ReadBuffers::none())
                    .map_err(device_error)?
            }
            IoOp::Flush => self
                .device
                .submit(now, &Command::flush(), ReadBuffers::none())
                .map_err(device_error)?,
        };
        debug_assert!(completion.done_ns >= now, "completion before submission");
        self.hash.record(completion.done_ns, 3, lba);
        self.requests += 1;
        self.device_outstanding += 1;
        self.streams[stream as usize].count_issued();
        let slot = self.take_slot(Inflight {
            stream,
            op: request.op,
            offset_bytes: request.offset_bytes,
            bytes: request.len_bytes,
            submit_ns: now,
            failed,
        });
        self.queue
            .push(completion.done_ns.max(now), Event::Complete { slot });
        Ok(())
    }

    /// Fills the write buffer with a fresh version of `sectors` sectors from `lba`, which
    /// the oracle now expects there.
    fn stage_write(&mut self, lba: u64, sectors: u32) {
        let unit = self.unit_bytes;
        self.write_buf.resize(sectors as usize * unit, 0);
        if let Some(oracle) = self.oracle.as_mut() {
            let version = oracle.next_version();
            for i in 0..sectors as usize {
                let token = sector_token(lba + i as u64, version);
                oracle.set(lba + i as u64, token);
                fill_unit(token, &mut self.write_buf[i * unit..(i + 1) * unit]);
            }
        }
    }

    /// The oracle expects zeroes in trimmed sectors.
    fn forget(&mut self, lba: u64, sectors: u32) {
        if let Some(oracle) = self.oracle.as_mut() {
            for i in 0..sectors as u64 {
                oracle.set(lba + i, 0);
            }
        }
    }

    /// A slot of the in-flight table for `record`.
    fn take_slot(&mut self, record: Inflight) -> u32 {
        match self.free_slots.pop() {
            Some(slot) => {
                self.inflight[slot as usize] = record;
                slot
            }
            None => {
                self.inflight.push(record);
                self.inflight.len() as u32 - 1
            }
        }
    }

    /// Whether `request` overlaps a command under way on a queued device in a way whose
    /// outcome depends on their order.
    fn overlaps_queued(&self, request: &IoRequest) -> bool {
        self.queued_slots.iter().any(|&slot| {
            let r = &self.inflight[slot as usize];
            order_matters(request, r.op, r.offset_bytes, r.bytes)
        })
    }

    /// Takes a request for a queued device: started at once, or held back while it overlaps
    /// a command under way. Either way it counts against its stream's queue depth.
    fn submit_queued(
        &mut self,
        stream: u32,
        request: IoRequest,
        lba: u64,
        sectors: u32,
    ) -> Result<(), RunError> {
        self.streams[stream as usize].count_issued();
        if !self.parked.is_empty() || self.overlaps_queued(&request) {
            self.parked.push_back((stream, request));
            return self.start_parked();
        }
        self.start_queued(stream, request, lba, sectors)
    }

    /// Starts the held-back requests that no longer overlap a command under way, in order;
    /// one that still does holds back those behind it that overlap it too.
    fn start_parked(&mut self) -> Result<(), RunError> {
        let sector = self.sector_bytes;
        let mut i = 0;
        while i < self.parked.len() {
            let (stream, request) = self.parked[i];
            let behind = self
                .parked
                .iter()
                .take(i)
                .any(|(_, r)| order_matters(&request, r.op, r.offset_bytes, r.len_bytes));
            if behind || self.overlaps_queued(&request) {
                i += 1;
                continue;
            }
            self.parked.remove(i);
            let (lba, sectors) = (request.offset_bytes / sector, request.len_bytes / sector);
            self.start_queued(stream, request, lba, sectors as u32)?;
        }
        Ok(())
    }

    /// Starts a request on a queued device; it completes in [`Host::collect_queued`].
    fn start_queued(
        &mut self,
        stream: u32,
        request: IoRequest,
        lba: u64,
        sectors: u32,
    ) -> Result<(), RunError> {
        let now = self.now_ns;
        let slot = self.take_slot(Inflight {
            stream,
            op: request.op,
            offset_bytes: request.offset_bytes,
            bytes: request.len_bytes,
            submit_ns: now,
            failed: false,
        });
        self.queued_slots.insert(slot);
        let cmd = match request.op {
            IoOp::Write => {
                self.stage_write(lba, sectors);
                write_command(lba, sectors, &self.write_buf, request.fua)
            }
            IoOp::Read => Command::read(lba, sectors),
            IoOp::Trim => {
                self.forget(lba, sectors);
                Command::trim(lba, sectors)
            }
            IoOp::Flush => Command::flush(),
        };
        let started = self
            .device
            .queued()
            .expect("a queued device")
            .start(now, &cmd, slot as u64);
        if let Err(source) = started {
            return Err(RunError::Device {
                op: request.op,
                offset_bytes: request.offset_bytes,
                len_bytes: request.len_bytes,
                source,
            });
        }
        self.requests += 1;
        self.device_outstanding += 1;
        Ok(())
    }

    fn finish(mut self) -> RunOutcome {
        if let Some((p, _)) = self.progress.as_mut() {
            p.finish();
        }
        let (checked, mismatches, first) = self.oracle.as_ref().map_or((0, 0, Vec::new()), |o| {
            (
                o.reads_checked(),
                o.mismatches(),
                o.first_mismatches().to_vec(),
            )
        });
        RunOutcome {
            measurements: self.recorder.finish(self.now_ns),
            sim_time_ns: self.now_ns,
            requests: self.requests,
            reads_checked: checked,
            mismatches,
            first_mismatches: first,
            event_hash: self.hash.value(),
            host_events: self.host_events,
            issued: self.issued.unwrap_or_default(),
            job_logs: self.job_logs,
            notes: self.notes,
            steady_state: self.trackers.iter().map(SteadyTracker::report).collect(),
            latency_target: self
                .streams
                .iter()
                .filter_map(|s| s.latency.as_ref().map(|l| l.report(s.name.clone())))
                .collect(),
        }
    }
}

/// A write of `sectors` sectors from `lba`, with force unit access when the request asks.
fn write_command(lba: u64, sectors: u32, data: &[u8], fua: bool) -> Command<'_> {
    let mut cmd = Command::write(lba, sectors, data);
    cmd.flags.fua = fua;
    cmd
}

/// Whether `request` and a request `op` on `len_bytes` bytes from `offset_bytes` must not run
/// side by side: their ranges overlap and at least one changes what it covers (a write or a
/// trim). A flush covers no range.
fn order_matters(request: &IoRequest, op: IoOp, offset_bytes: u64, len_bytes: u64) -> bool {
    let changes = |op| matches!(op, IoOp::Write | IoOp::Trim);
    let covers = |op, len| op != IoOp::Flush && len > 0;
    (changes(request.op) || changes(op))
        && covers(request.op, request.len_bytes)
        && covers(op, len_bytes)
        && request.offset_bytes < offset_bytes + len_bytes
        && offset_bytes < request.offset_bytes + request.len_bytes
}

/// Maps a trace request into the device: offsets wrap around the capacity and both ends are
/// rounded to whole sectors, so any trace can be replayed on any device.
fn wrap_trace_request(r: TraceRecord, capacity_bytes: u64, sector_bytes: u64) -> IoRequest {
    if r.op == IoOp::Flush {
        return IoRequest {
            op: IoOp::Flush,
            offset_bytes: 0,
            len_bytes: 0,
            fua: false,
            drain_first: false,
            after_overlapping: false,
        };
    }
    let start = r.offset_bytes / sector_bytes * sector_bytes;
    let end = (r.offset_bytes + r.len_bytes.max(1)).div_ceil(sector_bytes) * sector_bytes;
    let len = (end - start).min(capacity_bytes);
    let offset = start % capacity_bytes;
    let offset = if offset + len > capacity_bytes {
        capacity_bytes - len
    } else {
        offset
    };
    IoRequest {
        op: r.op,
        offset_bytes: offset,
        len_bytes: len,
        fua: r.fua,
        drain_first: false,
        after_overlapping: false,
    }
}

#[cfg(test)]
mod tests;
