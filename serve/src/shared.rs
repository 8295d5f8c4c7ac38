//! Volumes that do their own concurrency (ScalaAFA's I/O threads and space manager run on
//! real OS threads), served without any lock of the server's: every connection thread
//! applies its requests to the volume directly, so requests from different connections
//! reach the volume at the same time, as they would reach a real array.
//!
//! Unpaced, a reply leaves as soon as its request is applied, on the thread that applied
//! it. Paced, the thread that read a burst applies it and hands the replies to a pacer
//! thread, which sends each one when the wall clock reaches the volume's completion time
//! (`epoch + done_ns`), earliest first. No engine thread owns the volume in either case.

use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use afa_sim::TimeNs;
use afa_ssd::{DeviceError, DeviceInfo, Opcode};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::engine::{
    block_status_descriptors, check_request, device_failure, disconnect_failure, post,
    refuse_inline, send_outbox, size_read_buffer, write_zeroes_in_pieces, Due, EngineStats,
    Failure, InlineJob, Job, Outbox, Pace, Place, Reply,
};
use crate::proto::Request;
use crate::ServeError;

/// A volume that serves many requests at once by itself. The server calls it from many
/// connection threads concurrently and holds no lock around the calls, so the volume must
/// order conflicting requests itself.
pub trait SharedVolume: Send + Sync {
    /// Sector size and capacity; the export's size is capacity_sectors * sector_bytes.
    fn info(&self) -> afa_ssd::DeviceInfo;
    /// The instant the volume's clock counts from: completion times are nanoseconds after it.
    fn epoch(&self) -> std::time::Instant;
    /// Reads out.len() bytes at byte offset `offset` (any alignment; the caller has checked the range).
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<afa_sim::TimeNs, afa_ssd::DeviceError>;
    /// Writes data at byte offset `offset` (any alignment). Returns the model's completion time.
    fn write(&self, offset: u64, data: &[u8]) -> Result<afa_sim::TimeNs, afa_ssd::DeviceError>;
    /// Deallocates the byte range; it reads back as zeroes afterwards (any alignment).
    fn trim(&self, offset: u64, length: u64) -> Result<afa_sim::TimeNs, afa_ssd::DeviceError>;
    /// Whether a trim, once flushed, still reads back as zeroes after a power loss
    /// (`BlockDevice::trim_is_durable`); WRITE_ZEROES writes zeroes to a volume where not.
    fn trim_is_durable(&self) -> bool {
        false
    }
    /// Runs of allocated sectors from `lba` (`BlockDevice::allocation`), covering every
    /// request completed before the call; `None` (the default) reports all of it as data,
    /// which is always correct.
    fn allocation(&self, _lba: u64, _sectors: u32) -> Option<Vec<(u32, bool)>> {
        None
    }
    /// Makes every write completed before the call durable.
    fn flush(&self) -> Result<afa_sim::TimeNs, afa_ssd::DeviceError>;
    /// Stops the volume's threads once the requests applied so far are done, leaving it durable.
    /// Called exactly once, when the server stops.
    fn shutdown(&self) -> Result<(), afa_ssd::DeviceError>;
    /// Starts a read of `length` bytes at `offset` and returns without waiting for it, if
    /// the volume can: the server starts every read and write of a burst before it waits
    /// for any, so that the volume's threads serve them at once. `None`: the server calls
    /// `read` instead.
    fn start_read(&self, _offset: u64, _length: usize) -> Option<Box<dyn Started>> {
        None
    }
    /// As `start_read`, for a write of `data` at `offset`.
    fn start_write(&self, _offset: u64, _data: &[u8]) -> Option<Box<dyn Started>> {
        None
    }
}

/// A read or write a volume has started and finishes on threads of its own.
pub trait Started: Send {
    /// Waits for it. A read's bytes go to `out`, which has its length; a write's `out` is
    /// empty. Returns the completion time on the volume's clock.
    fn finish(self: Box<Self>, out: &mut [u8]) -> Result<TimeNs, DeviceError>;
}

/// Counters of a shared engine. They are atomics because many connection threads apply
/// requests at once and none of them may wait for another to count.
#[derive(Debug, Default)]
struct SharedStats {
    requests: AtomicU64,
    read_bytes: AtomicU64,
    write_bytes: AtomicU64,
    errors: AtomicU64,
}

impl SharedStats {
    fn snapshot(&self) -> EngineStats {
        EngineStats {
            requests: self.requests.load(Ordering::Relaxed),
            read_bytes: self.read_bytes.load(Ordering::Relaxed),
            write_bytes: self.write_bytes.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            // A shared volume does its idle-time work on its own threads.
            background_calls: 0,
        }
    }
}

/// One request of a burst and where its payload is: in the connection's burst buffer
/// (`payload`), or in `buf`.
struct Item<'a> {
    handle: u64,
    request: Request,
    buf: Vec<u8>,
    payload: Option<&'a [u8]>,
    credits: u32,
}

/// What the connection threads of a paced shared engine send the pacer.
enum PacerMessage {
    /// The replies of one applied burst, each with its completion time.
    Replies(Vec<Due>),
    /// Every request has been applied: send what is left and end.
    Shutdown,
}

/// The state every connection thread shares for a shared volume. Nothing in it is locked:
/// the request path touches only atomics, the volume and the pacer's channel.
pub(crate) struct SharedEngine {
    volume: Arc<dyn SharedVolume>,
    size_bytes: u64,
    /// Paced only: the channel to the pacer thread.
    pacer: Option<Sender<PacerMessage>>,
    /// Set when the server stops; requests that come later are refused.
    stopped: AtomicBool,
    /// Bursts being applied right now. Stopping waits for it to reach zero, so the volume
    /// is never called after its `shutdown`.
    bursts_in_flight: AtomicU64,
    /// Arrival order of replies, which breaks ties between equal completion times.
    seq: AtomicU64,
    stats: SharedStats,
}

impl std::fmt::Debug for SharedEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedEngine")
            .field("size_bytes", &self.size_bytes)
            .field("paced", &self.pacer.is_some())
            .finish()
    }
}

/// Leaving the count of bursts in flight, also when applying a burst panics, so a stop
/// never waits for a burst that will not finish.
struct InFlight<'a>(&'a AtomicU64);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl SharedEngine {
    /// Enters the count of bursts in flight, or refuses when the server has stopped. The
    /// count is raised before the flag is read and the stop sets the flag before it reads
    /// the count (both sequentially consistent), so either the stop waits for this burst
    /// or this burst sees the stop: no request reaches the volume after `shutdown`.
    fn enter(&self) -> Option<InFlight<'_>> {
        self.bursts_in_flight.fetch_add(1, Ordering::SeqCst);
        let guard = InFlight(&self.bursts_in_flight);
        if self.stopped.load(Ordering::SeqCst) {
            return None;
        }
        Some(guard)
    }

    /// The volume's clock now, in nanoseconds after its epoch.
    fn now_ns(&self) -> TimeNs {
        self.volume
            .epoch()
            .elapsed()
            .as_nanos()
            .min(u64::MAX as u128) as u64
    }

    /// Unpaced: applies a burst on the calling thread and returns the replies in order,
    /// writes taking their payloads from `burst`. A paced engine refuses the jobs, as a
    /// paced device engine does: its replies must wait for the pacer (a wiring mistake,
    /// answered as a shutdown).
    pub(crate) fn apply(&self, jobs: Vec<InlineJob>, burst: &[u8]) -> Vec<Reply> {
        if self.pacer.is_some() {
            return jobs.into_iter().map(refuse_inline).collect();
        }
        let Some(_in_flight) = self.enter() else {
            return jobs.into_iter().map(refuse_inline).collect();
        };
        let items = jobs
            .into_iter()
            .map(|job| Item {
                handle: job.handle,
                request: job.request,
                buf: job.buf,
                payload: Some(burst.get(job.payload).unwrap_or_default()),
                credits: 0,
            })
            .collect();
        self.apply_many(items)
            .into_iter()
            .map(|(_, reply)| reply)
            .collect()
    }

    /// Applies a burst on the calling thread. Paced, the replies go to the pacer, which
    /// sends each at its completion time; unpaced, they go to the connection at once.
    /// Gives the jobs back when the server has stopped.
    pub(crate) fn submit(&self, jobs: Vec<Job>) -> Result<(), Vec<Job>> {
        let Some(_in_flight) = self.enter() else {
            return Err(jobs);
        };
        let mut reply_tos = Vec::with_capacity(jobs.len());
        let items = jobs
            .into_iter()
            .map(|job| {
                reply_tos.push(job.reply_to);
                Item {
                    handle: job.handle,
                    request: job.request,
                    buf: job.data,
                    payload: None,
                    credits: job.credits,
                }
            })
            .collect();
        let applied = self.apply_many(items).into_iter().zip(reply_tos);
        match &self.pacer {
            Some(pacer) => {
                let dues = applied
                    .map(|((due_ns, reply), reply_to)| Due {
                        due_ns,
                        seq: self.seq.fetch_add(1, Ordering::Relaxed),
                        reply,
                        reply_to,
                    })
                    .collect();
                // The pacer ends only after every burst in flight has been handed over,
                // so this send cannot find it gone.
                let _ = pacer.send(PacerMessage::Replies(dues));
            }
            None => {
                let mut outbox = Outbox::new();
                for ((_, reply), reply_to) in applied {
                    post(&mut outbox, reply_to, reply);
                }
                send_outbox(&mut outbox);
            }
        }
        Ok(())
    }

    /// Applies a burst's requests and returns their completion times and replies, in
    /// order. The reads and writes the volume can start are all started before any is
    /// waited for, so its threads serve them at once; any other request first waits for
    /// those started before it, so it is applied after them, as one at a time.
    fn apply_many(&self, items: Vec<Item<'_>>) -> Vec<(TimeNs, Reply)> {
        let mut out: Vec<Option<(TimeNs, Reply)>> = (0..items.len()).map(|_| None).collect();
        let mut started: Vec<(usize, Item<'_>, Box<dyn Started>)> = Vec::new();
        for (i, item) in items.into_iter().enumerate() {
            match self.start(&item) {
                Some(handle) => started.push((i, item, handle)),
                None => {
                    for (j, earlier, handle) in started.drain(..) {
                        out[j] = Some(self.finish(earlier, handle));
                    }
                    out[i] = Some(self.apply_one(
                        item.handle,
                        item.request,
                        item.buf,
                        item.payload,
                        item.credits,
                    ));
                }
            }
        }
        for (j, item, handle) in started {
            out[j] = Some(self.finish(item, handle));
        }
        out.into_iter().flatten().collect()
    }

    /// Starts a read or write that passes the checks, if the volume can start it.
    fn start(&self, item: &Item<'_>) -> Option<Box<dyn Started>> {
        let data: &[u8] = item.payload.unwrap_or(&item.buf);
        check_request(&item.request, self.size_bytes, data.len()).ok()?;
        match item.request {
            Request::Read { offset, length } => self.volume.start_read(offset, length as usize),
            Request::Write { offset, .. } => self.volume.start_write(offset, data),
            _ => None,
        }
    }

    /// Waits for a started read or write and makes its reply.
    fn finish(&self, item: Item<'_>, started: Box<dyn Started>) -> (TimeNs, Reply) {
        let Item {
            handle,
            request,
            mut buf,
            credits,
            ..
        } = item;
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        let outcome = match request {
            Request::Read { offset, length } => {
                size_read_buffer(&mut buf, length);
                started
                    .finish(&mut buf)
                    .map_err(|e| device_failure(Opcode::Read, Place::Byte(offset), &e))
            }
            Request::Write { offset, fua, .. } => started
                .finish(&mut [])
                .map_err(|e| device_failure(Opcode::Write, Place::Byte(offset), &e))
                .and_then(|done| self.flush_if(fua, done)),
            // Only reads and writes are started.
            _ => Err(disconnect_failure()),
        };
        self.reply_for(handle, request, buf, credits, outcome)
    }

    /// Applies one request and returns its completion time on the volume's clock and its
    /// reply. A failed request completes now: there is nothing to wait for.
    fn apply_one(
        &self,
        handle: u64,
        request: Request,
        mut data: Vec<u8>,
        payload: Option<&[u8]>,
        credits: u32,
    ) -> (TimeNs, Reply) {
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        let outcome = self.execute_into(&request, &mut data, payload);
        self.reply_for(handle, request, data, credits, outcome)
    }

    /// Counts a request's outcome and makes its reply. A failed request completes now:
    /// there is nothing to wait for.
    fn reply_for(
        &self,
        handle: u64,
        request: Request,
        data: Vec<u8>,
        credits: u32,
        outcome: Result<TimeNs, Failure>,
    ) -> (TimeNs, Reply) {
        let read_offset = match request {
            Request::Read { offset, .. } => Some(offset),
            _ => None,
        };
        let (done_ns, result) = match outcome {
            Ok(done) => {
                match request {
                    Request::Read { length, .. } => {
                        self.stats
                            .read_bytes
                            .fetch_add(length as u64, Ordering::Relaxed);
                    }
                    Request::Write { length, .. } => {
                        self.stats
                            .write_bytes
                            .fetch_add(length as u64, Ordering::Relaxed);
                    }
                    _ => {}
                }
                (done, Ok(()))
            }
            Err(f) => {
                let earlier = self.stats.errors.fetch_add(1, Ordering::Relaxed);
                crate::log_request_failure(earlier, &f);
                (self.now_ns(), Err(f))
            }
        };
        let reply = Reply {
            handle,
            read_offset,
            block_status: matches!(request, Request::BlockStatus { .. }),
            result,
            data,
            credits,
        };
        (done_ns, reply)
    }

    /// Applies one request to the volume and returns its completion time. A write's
    /// payload is `payload`, or `buf` when there is none; a read's data replaces `buf`'s
    /// contents. The checks are the device engine's, so both answer alike.
    fn execute_into(
        &self,
        request: &Request,
        buf: &mut Vec<u8>,
        payload: Option<&[u8]>,
    ) -> Result<TimeNs, Failure> {
        let data: &[u8] = payload.unwrap_or(buf);
        check_request(request, self.size_bytes, data.len())?;
        let volume = &*self.volume;
        let failed = |op: Opcode, offset: u64| {
            move |e: DeviceError| device_failure(op, Place::Byte(offset), &e)
        };
        match *request {
            Request::Read { offset, length } => {
                size_read_buffer(buf, length);
                volume
                    .read(offset, buf)
                    .map_err(failed(Opcode::Read, offset))
            }
            Request::Write { offset, fua, .. } => {
                let done = volume
                    .write(offset, data)
                    .map_err(failed(Opcode::Write, offset))?;
                self.flush_if(fua, done)
            }
            Request::Flush => self.flush(),
            Request::Trim {
                offset,
                length,
                fua,
            } => {
                let done = volume
                    .trim(offset, length as u64)
                    .map_err(failed(Opcode::Trim, offset))?;
                self.flush_if(fua, done)
            }
            Request::WriteZeroes {
                offset,
                length,
                fua,
                no_hole,
            } => {
                let done = if no_hole || !volume.trim_is_durable() {
                    // Where a power loss could undo a trim, the zeroes are written.
                    write_zeroes_in_pieces(self.now_ns(), offset, length as u64, |at, zeros| {
                        volume.write(at, zeros).map_err(failed(Opcode::Write, at))
                    })?
                } else {
                    // The volume promises that a trimmed range reads back as zeroes, at
                    // any alignment, so the whole range is deallocated.
                    volume
                        .trim(offset, length as u64)
                        .map_err(failed(Opcode::Trim, offset))?
                };
                self.flush_if(fua, done)
            }
            Request::BlockStatus {
                offset,
                length,
                req_one,
            } => {
                let sector = self.volume.info().sector_bytes as u64;
                let first = offset / sector;
                let end = (offset + length as u64).div_ceil(sector);
                let runs = self.volume.allocation(first, (end - first) as u32);
                *buf = block_status_descriptors(runs.as_deref(), offset, length, sector, req_one);
                Ok(self.now_ns())
            }
            // `check_request` has refused it already; answering again keeps a connection
            // thread from ever panicking over a request.
            Request::Disconnect => Err(disconnect_failure()),
        }
    }

    fn flush(&self) -> Result<TimeNs, Failure> {
        self.volume
            .flush()
            .map_err(|e| device_failure(Opcode::Flush, Place::Whole, &e))
    }

    /// Flushes after a request with FUA, which completes when both it and the flush have.
    fn flush_if(&self, fua: bool, done_ns: TimeNs) -> Result<TimeNs, Failure> {
        if fua {
            Ok(done_ns.max(self.flush()?))
        } else {
            Ok(done_ns)
        }
    }
}

/// The running shared engine: the state connections share and, paced, the pacer thread.
#[derive(Debug)]
pub(crate) struct SharedHandle {
    engine: Arc<SharedEngine>,
    pacer: Option<JoinHandle<()>>,
    /// Whether `stop` has run, so the volume's `shutdown` is called exactly once.
    stopped: bool,
}

/// How long a stop sleeps between looks at the bursts still being applied. Stopping is
/// rare, and polling keeps every lock off the request path.
const STOP_POLL: Duration = Duration::from_micros(200);

impl SharedHandle {
    /// Starts serving `volume`: a pacer thread when paced, no thread at all unpaced (the
    /// volume does its idle-time work on its own threads).
    pub(crate) fn spawn(
        volume: Arc<dyn SharedVolume>,
        pace: Pace,
    ) -> Result<(Self, DeviceInfo), ServeError> {
        let info = volume.info();
        if info.sector_bytes == 0 || info.capacity_sectors == 0 {
            return Err(ServeError::EmptyDevice);
        }
        let size_bytes = info.capacity_sectors * info.sector_bytes as u64;
        let (pacer_tx, pacer) = match pace {
            Pace::None => (None, None),
            Pace::Model => {
                let (tx, rx) = crossbeam_channel::unbounded();
                let epoch = volume.epoch();
                let thread = std::thread::Builder::new()
                    .name("afa-pacer".into())
                    .spawn(move || pace_replies(epoch, &rx))
                    .map_err(ServeError::Thread)?;
                (Some(tx), Some(thread))
            }
        };
        let engine = Arc::new(SharedEngine {
            volume,
            size_bytes,
            pacer: pacer_tx,
            stopped: AtomicBool::new(false),
            bursts_in_flight: AtomicU64::new(0),
            seq: AtomicU64::new(0),
            stats: SharedStats::default(),
        });
        let handle = Self {
            engine,
            pacer,
            stopped: false,
        };
        Ok((handle, info))
    }

    pub(crate) fn engine(&self) -> Arc<SharedEngine> {
        self.engine.clone()
    }

    pub(crate) fn is_running(&self) -> bool {
        !self.stopped
    }

    /// Refuses further requests, waits for the bursts being applied, lets the pacer send
    /// what is left, shuts the volume down once and returns the counters.
    pub(crate) fn stop(&mut self) -> EngineStats {
        let engine = &self.engine;
        if !self.stopped {
            self.stopped = true;
            engine.stopped.store(true, Ordering::SeqCst);
            while engine.bursts_in_flight.load(Ordering::SeqCst) > 0 {
                std::thread::sleep(STOP_POLL);
            }
            if let Some(pacer) = &engine.pacer {
                let _ = pacer.send(PacerMessage::Shutdown);
            }
            if let Some(Err(_)) = self.pacer.take().map(JoinHandle::join) {
                crate::log("the pacer thread panicked");
            }
            if let Err(e) = engine.volume.shutdown() {
                crate::log(&format!("the volume's shutdown failed: {e}"));
            }
        }
        engine.stats.snapshot()
    }
}

/// The wall-clock instant of completion time `due_ns` on a clock that counts from `epoch`.
fn instant_of(epoch: Instant, due_ns: TimeNs) -> Instant {
    // A time too far out to represent is answered at once rather than never.
    epoch
        .checked_add(Duration::from_nanos(due_ns))
        .unwrap_or(epoch)
}

/// Further messages taken without blocking before the due replies go out, so replies to
/// concurrent bursts leave together.
const MAX_MESSAGES_PER_ROUND: usize = 64;

/// The pacer thread: holds every reply until the wall clock reaches its completion time
/// and sends the due ones earliest first. When the server stops it sends what is left at
/// once, as the device engine does, since nobody is left to wait for.
fn pace_replies(epoch: Instant, rx: &Receiver<PacerMessage>) {
    let mut pending: BinaryHeap<Due> = BinaryHeap::new();
    let mut outbox = Outbox::new();
    loop {
        let now = Instant::now();
        while pending
            .peek()
            .is_some_and(|d| instant_of(epoch, d.due_ns) <= now)
        {
            if let Some(d) = pending.pop() {
                post(&mut outbox, d.reply_to, d.reply);
            }
        }
        send_outbox(&mut outbox);
        let message = match pending.peek() {
            Some(d) => match rx.recv_deadline(instant_of(epoch, d.due_ns)) {
                Ok(m) => Some(m),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => Some(PacerMessage::Shutdown),
            },
            None => Some(rx.recv().unwrap_or(PacerMessage::Shutdown)),
        };
        let mut open = true;
        let mut take = |m: PacerMessage| match m {
            PacerMessage::Replies(dues) => {
                pending.extend(dues);
                true
            }
            PacerMessage::Shutdown => false,
        };
        if let Some(m) = message {
            open = take(m);
            for _ in 0..MAX_MESSAGES_PER_ROUND {
                if !open {
                    break;
                }
                match rx.try_recv() {
                    Ok(m) => open = take(m),
                    Err(_) => break,
                }
            }
        }
        if !open {
            break;
        }
    }
    while let Some(d) = pending.pop() {
        post(&mut outbox, d.reply_to, d.reply);
    }
    send_outbox(&mut outbox);
}

/// ScalaAFA running on threads of its own (its I/O threads, daemon and members, §5.2):
/// requests go straight to the owners of their chunks.
impl<D: afa_ssd::BlockDevice + Send + 'static> SharedVolume for afa_array::ThreadedScalaAfa<D> {
    fn info(&self) -> DeviceInfo {
        afa_array::ThreadedScalaAfa::info(self)
    }
    fn epoch(&self) -> Instant {
        afa_array::ThreadedScalaAfa::epoch(self)
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<TimeNs, DeviceError> {
        afa_array::ThreadedScalaAfa::read(self, offset, out)
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<TimeNs, DeviceError> {
        afa_array::ThreadedScalaAfa::write(self, offset, data)
    }
    fn trim(&self, offset: u64, length: u64) -> Result<TimeNs, DeviceError> {
        afa_array::ThreadedScalaAfa::trim(self, offset, length)
    }
    fn flush(&self) -> Result<TimeNs, DeviceError> {
        afa_array::ThreadedScalaAfa::flush(self)
    }
    fn allocation(&self, lba: u64, sectors: u32) -> Option<Vec<(u32, bool)>> {
        afa_array::ThreadedScalaAfa::allocation(self, lba, sectors)
    }
    /// Flushes the members and stops every thread. The single-owner engine the threads
    /// hand back is dropped: the next start rebuilds the tables from the OOB tags (§5.4).
    fn shutdown(&self) -> Result<(), DeviceError> {
        self.stop_flushed().map(drop)
    }
    fn start_read(&self, offset: u64, length: usize) -> Option<Box<dyn Started>> {
        Some(Box::new(afa_array::ThreadedScalaAfa::start_read(
            self, offset, length,
        )))
    }
    fn start_write(&self, offset: u64, data: &[u8]) -> Option<Box<dyn Started>> {
        Some(Box::new(afa_array::ThreadedScalaAfa::start_write(
            self, offset, data,
        )))
    }
}

impl Started for afa_array::InFlight {
    fn finish(self: Box<Self>, out: &mut [u8]) -> Result<TimeNs, DeviceError> {
        afa_array::InFlight::finish(*self, out)
    }
}
