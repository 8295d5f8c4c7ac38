//! ScalaAFA on real threads: the I/O threads and the space manager each run on an OS thread
//! of their own and talk by channels only, as §5.2 has them (serve mode's engine; the
//! simulation pumps the same actors in a fixed order instead).
//!
//! The engine's state is split by owner, so that nothing of it is shared but channels and
//! one atomic counter (the write timestamps):
//!
//! - **I/O thread t** owns the user chunks c with c mod T = t: their AMT entries, every
//!   write, read and trim of them (a partial write merges into its chunk there, so writes
//!   to one chunk never race), the heroes the manager granted it and its open hero group.
//!   It reports each write to the daemon (`Wrote`) in the order it made them.
//! - **The daemon** is a single-owner [`ScalaAfa`] over member proxies: the space manager
//!   (grants, returns, recalls), the authoritative AMT and HGMT rebuilt from the threads'
//!   reports, the stripes' live counts, conversion, array-level GC and checkpoints. Its
//!   code is the simulation's; only where it would reach into a thread does it send a
//!   message instead.
//! - **The member SSDs** are hardware to the engine: an actor's command runs on the
//!   device at once, under the device's own lock (the SSD controller taking one command
//!   at a time), and its completion comes back on the actor's reply channel, as an NVMe
//!   completion queue entry would. An idle thread gives each SSD its idle time.
//!
//! Races are closed by messages rather than locks. Array-level GC moves a chunk the
//! daemon does not own: it writes the new copy and tells the owner (`Moved`), which takes
//! it only if the chunk has not been written since; a thread announces each write
//! (`Writing`) before it draws a timestamp, and GC does not move a chunk being written, so
//! no moved copy carries a newer timestamp than a newer user write (recovery trusts the
//! newest timestamp). And a thread may be reading a chunk's
//! old copy while its row is freed: a dead row is freed only after every thread has passed
//! a barrier sent after its last chunk died, so no read of it can still be in flight (an
//! RCU grace period; freed rows already wait for a checkpoint the same way).
//!
//! Reads are steered as §5.3 has them: every member reply says whether the SSD is
//! collecting garbage, and a thread sends a read whose home member last said so to a calm
//! replica of the chunk, if its group is one the thread knows in replication. The thread
//! does not learn of conversions, so the replica's OOB tags must name the chunk's backup;
//! otherwise the read goes to the primary after all.
//!
//! Members that failed before the threads started are served around: no copy goes to
//! them, and a chunk whose home failed, or whose primary the SSD cannot correct, is read
//! from a replica whose tags still name it, or decoded from its stripe (data and parity
//! read with their tags, and the decoded tags must name the chunk's backup). GC moves tell
//! the owner the copy's timestamp and group, so the owner knows every chunk's replicas.
//!
//! What stays with the single-owner engine: members failing while the engine runs, rebuilds
//! and scheduled failures ([`ScalaAfa::into_threads`] refuses a rebuilding member and a
//! schedule).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, unbounded, Receiver, RecvTimeoutError, Sender};

use super::*;

/// How long the daemon waits for a message before it counts the host as idle and converts
/// every full hero group (§5.3).
const IDLE_NS: u64 = 1_000_000;
/// How long a member SSD must go without a command before it gets idle time.
pub(super) const MEMBER_IDLE_NS: u64 = 1_000_000;
/// The most jobs an I/O thread takes from its queue at once.
const MAX_BATCH_JOBS: usize = 32;
/// The longest an I/O thread waits for a grant before it fails the write as out of space.
const GRANT_TIMEOUT: Duration = Duration::from_secs(30);

/// The clock every actor reads: nanoseconds since the engine started on threads.
#[derive(Debug, Clone, Copy)]
struct Clock {
    epoch: Instant,
}

impl Clock {
    fn now_ns(&self) -> TimeNs {
        self.epoch.elapsed().as_nanos().min(u64::MAX as u128) as u64
    }
}

// ----- the member SSDs -----

/// A command for a member SSD, with where its reply goes.
enum MemberOp {
    Submit {
        member: usize,
        opcode: Opcode,
        lba: u64,
        sectors: u32,
        data: Vec<u8>,
        tags: Option<Vec<u8>>,
        flags: CommandFlags,
        /// A read returns the sectors' tags as well.
        read_tags: bool,
        reply: Sender<MemberReply>,
        /// Tells the replies to one issuer's commands apart.
        tag: usize,
    },
    Convert {
        member: usize,
        cmd: ConvertCommand,
        reply: Sender<MemberReply>,
        tag: usize,
    },
    ScanTags {
        lba: u64,
        sectors: u32,
        reply: Sender<Option<Vec<u8>>>,
    },
}

struct MemberReply {
    tag: usize,
    /// The member that answered: its completion says whether it is collecting garbage.
    member: usize,
    result: Result<MemberDone, DeviceError>,
}

struct MemberDone {
    completion: Completion,
    /// A read's data and tags.
    data: Vec<u8>,
    tags: Vec<u8>,
}

/// A member SSD shared by the actors that command it (the I/O threads, the daemon and the
/// server's flushes). The sender runs its command on the device at once, under the
/// device's own lock, and the reply goes to the reply channel the command names, as an
/// NVMe submission queue entry names its completion queue. The lock stands for the SSD's
/// controller, which takes one command at a time; the engine itself shares nothing.
///
/// The members used to be owned by agent threads that applied the commands sent to them.
/// On a host with fewer cores than threads each command then cost a thread switch to the
/// agent and one back, and the daemon, which calls members one command at a time for GC
/// and conversion, spent most of its time switching (about eight switches per 4 KiB user
/// write; docs/scalaafa.md has the figures).
struct SharedMember<D> {
    slot: Mutex<MemberSlot<D>>,
}

struct MemberSlot<D> {
    /// `None` once the engine has stopped and handed the device back.
    device: Option<D>,
    /// The latest time a command or idle work ran at: the device's clock never goes back.
    last_ns: TimeNs,
    /// When the device should next get idle time, unless a command comes first.
    idle_at: Option<TimeNs>,
}

/// What the actors see of a member: commands run now, idle time, and the device handed back.
trait MemberPort: Send + Sync {
    /// Runs `op` on the device now and sends its reply; fails once the device is gone.
    fn execute(&self, op: MemberOp, clock: Clock) -> Result<(), DeviceError>;
    /// Gives the device idle time if none of its commands ran for [`MEMBER_IDLE_NS`];
    /// returns when it next wants some.
    fn idle(&self, clock: Clock) -> Option<TimeNs>;
}

impl<D: BlockDevice + Send> SharedMember<D> {
    fn new(device: D) -> Self {
        SharedMember {
            slot: Mutex::new(MemberSlot {
                device: Some(device),
                last_ns: 0,
                idle_at: None,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemberSlot<D>> {
        // A command that panicked leaves the device as the panic found it; the engine's
        // threads report that panic themselves.
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the device back; later commands fail as if its thread had stopped.
    fn take(&self) -> Option<D> {
        self.lock().device.take()
    }
}

impl<D: BlockDevice + Send> MemberPort for SharedMember<D> {
    fn execute(&self, op: MemberOp, clock: Clock) -> Result<(), DeviceError> {
        let mut slot = self.lock();
        let t = clock.now_ns().max(slot.last_ns);
        slot.last_ns = t;
        slot.idle_at = Some(t + MEMBER_IDLE_NS);
        let device = slot.device.as_mut().ok_or_else(member_gone)?;
        match op {
            MemberOp::Submit {
                member,
                opcode,
                lba,
                sectors,
                data,
                tags,
                flags,
                read_tags,
                reply,
                tag,
            } => {
                let info = device.info();
                let cmd = Command {
                    opcode,
                    lba,
                    sectors,
                    data: &data,
                    tags: tags.as_deref(),
                    flags,
                };
                let reading = opcode == Opcode::Read;
                let unit = info.payload_unit_bytes as usize;
                let tag_bytes = info.tag_bytes_per_sector as usize;
                let mut out = vec![0u8; if reading { sectors as usize * unit } else { 0 }];
                let mut out_tags = vec![
                    0u8;
                    if reading && read_tags {
                        sectors as usize * tag_bytes
                    } else {
                        0
                    }
                ];
                let result = device
                    .submit(
                        t,
                        &cmd,
                        ReadBuffers {
                            data: &mut out,
                            tags: (reading && read_tags).then_some(&mut out_tags[..]),
                        },
                    )
                    .map(|completion| MemberDone {
                        completion,
                        data: out,
                        tags: out_tags,
                    });
                drop(slot);
                let _ = reply.send(MemberReply {
                    tag,
                    member,
                    result,
                });
            }
            MemberOp::Convert {
                member,
                cmd,
                reply,
                tag,
            } => {
                let result = device.convert(t, &cmd).map(|completion| MemberDone {
                    completion,
                    data: Vec::new(),
                    tags: Vec::new(),
                });
                drop(slot);
                let _ = reply.send(MemberReply {
                    tag,
                    member,
                    result,
                });
            }
            MemberOp::ScanTags {
                lba,
                sectors,
                reply,
            } => {
                let tags = device.scan_tags(lba, sectors);
                drop(slot);
                let _ = reply.send(tags);
            }
        }
        Ok(())
    }

    fn idle(&self, clock: Clock) -> Option<TimeNs> {
        // A member busy with a command is not idle: look again a little later.
        let Ok(mut slot) = self.slot.try_lock() else {
            return Some(clock.now_ns() + MEMBER_IDLE_NS);
        };
        let now = clock.now_ns().max(slot.last_ns);
        match slot.idle_at {
            Some(at) if at <= now => {
                slot.last_ns = now;
                let next = slot.device.as_mut().and_then(|d| d.background(now));
                slot.idle_at = next.map(|next| next.max(now + MEMBER_IDLE_NS / 10));
                slot.idle_at
            }
            at => at,
        }
    }
}

/// How an actor commands a member: `send` runs the command at once, on the caller's thread.
#[derive(Clone)]
struct MemberQueue {
    port: Arc<dyn MemberPort>,
    clock: Clock,
}

impl MemberQueue {
    /// Runs `op` on the member now; its reply is on the channel the op names.
    fn send(&self, op: MemberOp) -> Result<(), DeviceError> {
        self.port.execute(op, self.clock)
    }
}

impl std::fmt::Debug for MemberQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MemberQueue")
    }
}

/// The longest the idle thread sleeps when no member wants idle time: a command sets its
/// member's idle time [`MEMBER_IDLE_NS`] ahead, so it is found late by at most this much.
const IDLE_POLL_MAX: Duration = Duration::from_millis(10);

/// The idle thread: gives each member its idle time (background GC, idle erases) once no
/// command has come to it for [`MEMBER_IDLE_NS`], as the SSD's firmware would.
fn run_idle(members: Vec<Arc<dyn MemberPort>>, stop: Receiver<()>, clock: Clock) {
    loop {
        let next = members.iter().filter_map(|m| m.idle(clock)).min();
        let now = clock.now_ns();
        let wait = next.map_or(IDLE_POLL_MAX, |at| {
            Duration::from_nanos(at.saturating_sub(now))
                .clamp(Duration::from_nanos(MEMBER_IDLE_NS / 10), IDLE_POLL_MAX)
        });
        match stop.recv_timeout(wait) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => return,
        }
    }
}

/// The daemon's view of a member: a device whose commands go to the shared member.
#[derive(Debug)]
pub(super) struct MemberProxy {
    info: DeviceInfo,
    member: usize,
    ops: MemberQueue,
    reply_tx: Sender<MemberReply>,
    reply_rx: Receiver<MemberReply>,
}

impl std::fmt::Debug for MemberOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MemberOp::Submit { .. } => "Submit",
            MemberOp::Convert { .. } => "Convert",
            MemberOp::ScanTags { .. } => "ScanTags",
        })
    }
}

impl std::fmt::Debug for MemberReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MemberReply({})", self.tag)
    }
}

/// The member's device is gone: the engine is stopping.
fn member_gone() -> DeviceError {
    DeviceError::Unsupported("the engine has stopped and handed the member back".into())
}

impl MemberProxy {
    fn call(&self, op: MemberOp) -> Result<MemberDone, DeviceError> {
        self.ops.send(op)?;
        self.reply_rx.recv().map_err(|_| member_gone())?.result
    }
}

impl BlockDevice for MemberProxy {
    fn info(&self) -> DeviceInfo {
        self.info
    }

    fn submit(
        &mut self,
        _now_ns: TimeNs,
        cmd: &Command<'_>,
        out: ReadBuffers<'_>,
    ) -> Result<Completion, DeviceError> {
        let done = self.call(MemberOp::Submit {
            member: self.member,
            opcode: cmd.opcode,
            lba: cmd.lba,
            sectors: cmd.sectors,
            data: cmd.data.to_vec(),
            tags: cmd.tags.map(<[u8]>::to_vec),
            flags: cmd.flags,
            read_tags: out.tags.is_some(),
            reply: self.reply_tx.clone(),
            tag: 0,
        })?;
        if cmd.opcode == Opcode::Read {
            out.data.copy_from_slice(&done.data);
            if let Some(tags) = out.tags {
                tags.copy_from_slice(&done.tags);
            }
        }
        Ok(done.completion)
    }

    /// The idle thread gives the device its idle time.
    fn background(&mut self, _now_ns: TimeNs) -> Option<TimeNs> {
        None
    }

    fn convert(
        &mut self,
        _now_ns: TimeNs,
        cmd: &ConvertCommand,
    ) -> Result<Completion, DeviceError> {
        self.call(MemberOp::Convert {
            member: self.member,
            cmd: *cmd,
            reply: self.reply_tx.clone(),
            tag: 0,
        })
        .map(|d| d.completion)
    }

    fn scan_tags(&self, lba: u64, sectors: u32) -> Option<Vec<u8>> {
        let (tx, rx) = bounded(1);
        self.ops
            .send(MemberOp::ScanTags {
                lba,
                sectors,
                reply: tx,
            })
            .ok()?;
        rx.recv().ok().flatten()
    }
}

// ----- the daemon's side -----

/// A barrier sent to every I/O thread, and the rows freed once all have passed it.
#[derive(Debug)]
struct Barrier {
    epoch: u64,
    rows: Vec<u32>,
    passed: Vec<bool>,
}

/// A chunk array-level GC moved from AFA chunk `from` to `to`, with the copy's timestamp
/// and the VHs of the group it went to (where its backups are while that group is in
/// replication).
#[derive(Debug)]
pub(super) struct Move {
    chunk: u32,
    from: u32,
    to: u32,
    ts: u32,
    vhs: Vec<u32>,
}

/// What the daemon keeps beyond the single-owner engine while the I/O threads run on OS
/// threads of their own.
#[derive(Debug)]
pub(super) struct Remote {
    clock: Arc<AtomicU32>,
    io_threads: usize,
    /// GC moves not yet told to the chunks' owners.
    moved: Vec<Move>,
    /// Writes announced (`Writing`) and not yet reported (`Wrote`), per user chunk.
    writing: HashMap<u32, u32>,
    /// Rows whose chunks all died since the last barrier was sent.
    dying: Vec<u32>,
    /// Open groups the daemon asked their threads to seal (`Control::Seal`) and has not
    /// seen full since, and the asks not sent yet, as (thread, stripe).
    sealing: HashSet<u32>,
    seals: Vec<(usize, u32)>,
    barriers: VecDeque<Barrier>,
    next_epoch: u64,
    /// A stop was asked for: orderly (everything before it handled) or not.
    stop: Option<bool>,
    /// The first error of the daemon's own work, reported when the engine stops.
    error: Option<DeviceError>,
    /// Member flushes started (members behind a volatile cache): a dead row held while this
    /// read n waits for flush n + 1 or a later one; and the write clock when the latest one
    /// started.
    flushes: Arc<FlushCount>,
}

/// The member flushes of an engine on threads, counted where they start.
#[derive(Debug, Default)]
pub(super) struct FlushCount {
    started: AtomicU64,
    /// The write clock when the latest flush started.
    clock: AtomicU32,
}

impl FlushCount {
    /// A flush starts now, with the write clock at `clock`; returns its number.
    fn start(&self, clock: u32) -> u64 {
        self.clock.fetch_max(clock, Ordering::SeqCst);
        self.started.fetch_add(1, Ordering::SeqCst) + 1
    }
}

impl Remote {
    pub(super) fn flushes_started(&self) -> u64 {
        self.flushes.started.load(Ordering::SeqCst)
    }

    pub(super) fn flush_clock(&self) -> u32 {
        self.flushes.clock.load(Ordering::SeqCst)
    }

    /// The daemon flushes the members itself.
    pub(super) fn flush_starts(&self, clock: u32) {
        self.flushes.start(clock);
    }

    /// Rows freed but waiting for a barrier.
    pub(super) fn waiting_hhs(&self) -> usize {
        self.dying.len() + self.barriers.iter().map(|b| b.rows.len()).sum::<usize>()
    }
}

impl<D: BlockDevice> ScalaAfa<D> {
    /// Whether thread `t` runs on an OS thread of its own (the daemon cannot pump it).
    pub(super) fn is_remote_thread(&self, t: usize) -> bool {
        self.remote.as_ref().is_some_and(|r| t < r.io_threads)
    }

    /// The next write timestamp. On threads the counter is sequentially consistent: a
    /// thread announces a write (`Writing`) before it draws its timestamp, so when the
    /// daemon draws a later one, the announcement is already in its inbox.
    pub(super) fn next_ts(&mut self) -> u32 {
        match &self.remote {
            Some(r) => r.clock.fetch_add(1, Ordering::SeqCst).wrapping_add(1),
            None => {
                self.clock = self.clock.wrapping_add(1);
                self.clock
            }
        }
    }

    /// The newest timestamp handed out.
    pub(super) fn current_clock(&self) -> u32 {
        match &self.remote {
            Some(r) => r.clock.load(Ordering::SeqCst),
            None => self.clock,
        }
    }

    /// Handles every report the threads have sent so far (on threads only).
    pub(super) fn take_reports(&mut self, now_ns: TimeNs) -> Result<(), DeviceError> {
        if self.remote.is_none() {
            return Ok(());
        }
        while let Ok(msg) = self.manager.inbox.try_recv() {
            self.take_message(msg, now_ns)?;
        }
        Ok(())
    }

    /// A thread announced a write of `chunk`.
    pub(super) fn writing(&mut self, chunk: u32) {
        if let Some(r) = &mut self.remote {
            *r.writing.entry(chunk).or_insert(0) += 1;
        }
    }

    /// Whether a write of `chunk` has been announced and not yet reported.
    pub(super) fn being_written(&self, chunk: u32) -> bool {
        self.remote
            .as_ref()
            .is_some_and(|r| r.writing.contains_key(&chunk))
    }

    /// Array-level GC moved `chunk` out of AFA chunk `from`: its owner is told.
    pub(super) fn moved(&mut self, chunk: u32, from: u32) {
        let to = self.amt[chunk as usize];
        let ts = self.amt_ts[chunk as usize];
        let vhs = self.stripes[(to / self.k as u32) as usize].vhs.clone();
        if let Some(r) = &mut self.remote {
            r.moved.push(Move {
                chunk,
                from,
                to,
                ts,
                vhs,
            });
        }
    }

    /// Holds a dead row back until every I/O thread passes a barrier; false when the row
    /// can be freed at once.
    pub(super) fn defer_free(&mut self, row: u32) -> bool {
        match &mut self.remote {
            Some(r) if r.stop.is_none() => {
                r.dying.push(row);
                true
            }
            _ => false,
        }
    }

    /// A thread assembled hero group `stripe` from its heroes.
    pub(super) fn opened(&mut self, thread: usize, stripe: u32, vhs: Vec<u32>) {
        self.open_hg(stripe, vhs);
        self.open[thread] = Some(stripe);
    }

    /// A thread wrote `chunk` into slot `j` of its open group (the bookkeeping half of
    /// `write_chunk`).
    pub(super) fn wrote(
        &mut self,
        thread: usize,
        chunk: u32,
        stripe: u32,
        j: usize,
        ts: u32,
        now_ns: TimeNs,
    ) -> Result<(), DeviceError> {
        if let Some(r) = &mut self.remote {
            if let std::collections::hash_map::Entry::Occupied(mut e) = r.writing.entry(chunk) {
                *e.get_mut() -= 1;
                if *e.get() == 0 {
                    e.remove();
                }
            }
        }
        self.unmap(chunk, now_ns)?;
        self.amt[chunk as usize] = stripe * self.k as u32 + j as u32;
        self.amt_ts[chunk as usize] = ts;
        let k = self.k;
        let s = &mut self.stripes[stripe as usize];
        debug_assert_eq!(s.filled as usize, j);
        s.chunks[j] = chunk;
        s.live += 1;
        s.filled += 1;
        s.first_ts = s.first_ts.min(ts);
        if s.filled as usize == k {
            s.state = HhState::Full;
            // A thread batching its writes may have opened its next group already.
            if self.open[thread] == Some(stripe) {
                self.open[thread] = None;
            }
            self.manager.full[thread].push_back(stripe);
            if let Some(r) = &mut self.remote {
                r.sealing.remove(&stripe);
            }
        }
        self.stats.chunks_written += 1;
        Ok(())
    }

    /// Asks thread `t` to seal its open group `stripe` (once; its `Sealed` comes later).
    pub(super) fn ask_seal(&mut self, t: usize, stripe: u32) {
        if let Some(r) = &mut self.remote {
            if r.sealing.insert(stripe) {
                r.seals.push((t, stripe));
            }
        }
    }

    /// Thread `thread` sealed its open group `stripe`: the slots it had not filled are
    /// trimmed, so the group is full and queued for conversion, as `close_open` leaves it.
    pub(super) fn sealed(&mut self, thread: usize, stripe: u32) {
        if let Some(r) = &mut self.remote {
            r.sealing.remove(&stripe);
        }
        let s = &mut self.stripes[stripe as usize];
        if s.state != HhState::Open {
            return;
        }
        s.filled = self.k as u32;
        s.state = HhState::Full;
        if self.open[thread] == Some(stripe) {
            self.open[thread] = None;
        }
        self.manager.full[thread].push_back(stripe);
        self.stats.groups_sealed += 1;
    }

    /// Thread `thread` passed barrier `epoch`: rows behind barriers every thread passed are
    /// freed.
    pub(super) fn passed(
        &mut self,
        thread: usize,
        epoch: u64,
        now_ns: TimeNs,
    ) -> Result<(), DeviceError> {
        let Some(r) = &mut self.remote else {
            return Ok(());
        };
        if let Some(b) = r.barriers.iter_mut().find(|b| b.epoch == epoch) {
            b.passed[thread] = true;
        }
        let mut rows = Vec::new();
        while r
            .barriers
            .front()
            .is_some_and(|b| b.passed.iter().all(|&p| p))
        {
            rows.extend(r.barriers.pop_front().map(|b| b.rows).unwrap_or_default());
        }
        for row in rows {
            self.free_hh_now(row, now_ns)?;
        }
        Ok(())
    }

    pub(super) fn stop_requested(&mut self, orderly: bool) {
        if let Some(r) = &mut self.remote {
            r.stop = Some(orderly);
        }
    }
}

/// What the daemon sends an I/O thread besides grants and recalls.
#[derive(Debug)]
enum Control {
    /// GC wrote `chunk` anew at AFA chunk `to`; the owner takes it if the chunk is still at
    /// `from`.
    Moved(Move),
    /// Answer `Passed` once every read started before is done.
    Barrier { epoch: u64 },
    /// Close the open group `stripe` early (trimming the slots not filled) and answer
    /// `Sealed`: its VHs are the last of their members and every free row needs one.
    Seal { stripe: u32 },
    /// Stop now, failing what is queued (a crash).
    Stop,
}

impl ScalaAfa<MemberProxy> {
    /// Sends the owners what GC moved and starts a barrier for the rows that died.
    fn dispatch(&mut self, controls: &[Sender<Control>]) {
        let Some(r) = &mut self.remote else {
            return;
        };
        let threads = controls.len();
        for mv in r.moved.drain(..) {
            let _ = controls[mv.chunk as usize % threads].send(Control::Moved(mv));
        }
        for (t, stripe) in r.seals.drain(..) {
            let _ = controls[t].send(Control::Seal { stripe });
        }
        if !r.dying.is_empty() {
            let epoch = r.next_epoch;
            r.next_epoch += 1;
            for c in controls {
                let _ = c.send(Control::Barrier { epoch });
            }
            r.barriers.push_back(Barrier {
                epoch,
                rows: std::mem::take(&mut r.dying),
                passed: vec![false; threads],
            });
        }
    }

    /// Keeps the first error of the daemon's work for the stop. Running short of heroes is
    /// not one: the threads' asks wait, and later rounds convert, clean and grant again.
    fn note(&mut self, result: Result<(), DeviceError>) {
        match (result, &mut self.remote) {
            (Err(DeviceError::NoSpace { .. } | DeviceError::VolumeFull(_)), _)
            | (Ok(()), _)
            | (_, None) => {}
            (Err(e), Some(r)) => {
                r.error.get_or_insert(e);
            }
        }
    }

    /// Whether the daemon has background work that needs it awake.
    fn busy(&self) -> bool {
        !self.pending.is_empty()
            || self.manager.full.iter().any(|l| !l.is_empty())
            || !self.manager.waiting.is_empty()
            || self.checkpointing()
    }

    /// The daemon thread: handles the threads' messages as they come, converts when the
    /// host is idle, and returns its state when asked to stop.
    fn run_daemon(mut self, controls: Vec<Sender<Control>>, clock: Clock) -> Self {
        let inbox = self.manager.inbox.clone();
        loop {
            let timeout = if self.busy() {
                Duration::from_nanos(IDLE_NS)
            } else {
                Duration::from_millis(100)
            };
            let now = clock.now_ns();
            match inbox.recv_timeout(timeout) {
                Ok(msg) => {
                    let r = self.take_message(msg, now);
                    self.note(r);
                    let r = self.serve_manager(now);
                    self.note(r);
                }
                Err(RecvTimeoutError::Timeout) => {
                    // The host is idle: the daemon converts every full HG (§5.3).
                    let r = self
                        .serve_manager(now)
                        .and_then(|()| self.convert_all_full(now))
                        .and_then(|()| self.recycle_done(now));
                    self.note(r);
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
            if self.remote.as_ref().is_some_and(|r| r.stop.is_none()) {
                self.dispatch(&controls);
            }
            match self.remote.as_ref().and_then(|r| r.stop) {
                Some(true) => {
                    // Every thread has ended, so no read is in flight: the rows waiting
                    // for a barrier are freed now.
                    let now = clock.now_ns();
                    let r = self.serve_manager(now);
                    self.note(r);
                    let rows: Vec<u32> = self
                        .remote
                        .as_mut()
                        .map(|r| {
                            let mut rows = std::mem::take(&mut r.dying);
                            rows.extend(r.barriers.drain(..).flat_map(|b| b.rows));
                            rows
                        })
                        .unwrap_or_default();
                    for row in rows {
                        let r = self.free_hh_now(row, now);
                        self.note(r);
                    }
                    break;
                }
                Some(false) => break,
                None => {}
            }
        }
        self
    }
}

// ----- the I/O threads -----

/// Where a write's or a trim's completion time (or error) goes.
type Answer = Sender<Result<TimeNs, DeviceError>>;

/// A member command's completion time, and a read's bytes and (if asked for) tags.
type CopyReply = Result<(TimeNs, Vec<u8>, Vec<u8>), DeviceError>;

/// Which copy a chunk read goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CopyChoice {
    /// The primary, or a calm replica while the primary's member collects garbage.
    Steered,
    Primary,
    /// This replica: (member, lba, the chunk's timestamp).
    At((usize, u64, u32)),
}

/// Where a chunk read went: `skip` bytes of the reply precede the bytes asked for, and a
/// read sent to a replica must find the backup of (chunk, slot, timestamp) there.
#[derive(Debug, Clone, Copy)]
struct ReadPlan {
    skip: usize,
    replica_of: Option<(u32, usize, u32)>,
}

/// A chunk read's completion time and bytes, or its error.
type PieceRead = Result<(TimeNs, Vec<u8>), DeviceError>;

/// A read piece's completion time, where it goes in the caller's buffer, and its bytes.
type ReadReply = Result<(TimeNs, usize, Vec<u8>), DeviceError>;

/// What an I/O thread is asked to do with one of its chunks.
enum IoJob {
    Write {
        chunk: u32,
        /// Byte offset in the chunk.
        at: usize,
        data: Vec<u8>,
        reply: Answer,
    },
    Read {
        chunk: u32,
        at: usize,
        len: usize,
        reply: Sender<ReadReply>,
        /// Where the piece goes in the caller's buffer.
        offset: usize,
    },
    /// Deallocates `len` bytes at `at`: a whole chunk is unmapped, part of one reads back as
    /// zeroes.
    Trim {
        chunk: u32,
        at: usize,
        len: usize,
        reply: Answer,
    },
    /// Which of the chunks `first..end` this thread owns are mapped (a block-status query),
    /// answered after every job queued before it.
    Allocation {
        first: u32,
        end: u32,
        reply: Sender<Vec<u32>>,
    },
    /// Ends the thread once everything queued before is done.
    Stop,
}

/// The geometry an I/O thread needs.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    k: usize,
    m: usize,
    n: usize,
    rows: u32,
    chunk_sectors: u32,
    sector_bytes: usize,
    tag_bytes: usize,
    threads: usize,
    transient: bool,
}

impl Geometry {
    fn chunk_bytes(&self) -> usize {
        self.chunk_sectors as usize * self.sector_bytes
    }
    fn data_member(&self, stripe: u32, j: usize) -> usize {
        space::parity_member(stripe, self.m + j, self.n)
    }
    fn parity_member(&self, stripe: u32, r: usize) -> usize {
        space::parity_member(stripe, r, self.n)
    }
    fn hh_lba(&self, stripe: u32) -> u64 {
        stripe as u64 * self.chunk_sectors as u64
    }
    fn vh_lba(&self, vh: u32, slot: usize) -> u64 {
        (self.rows as u64 + vh as u64 * self.k as u64 + slot as u64) * self.chunk_sectors as u64
    }
    /// Whether `tags`, read with a copy, name the backup of (chunk, slot, timestamp).
    fn names_backup(&self, tags: &[u8], (chunk, slot, ts): (u32, usize, u32)) -> bool {
        self.tag_bytes >= META_TAG_BYTES
            && tags.len() >= self.tag_bytes
            && decode_meta(&tags[..self.tag_bytes]) == (chunk, slot as u8, ts, KIND_BACKUP)
    }

    fn tags(&self, chunk: u32, slot: usize, ts: u32, kind: u8, data: &[u8]) -> Option<Vec<u8>> {
        meta_tags(
            self.tag_bytes,
            self.sector_bytes,
            self.chunk_sectors,
            encode_meta(chunk, slot as u8, ts, kind),
            data,
        )
    }
}

/// The hero group an I/O thread is filling.
#[derive(Debug)]
struct OpenGroup {
    stripe: u32,
    vhs: Vec<u32>,
    filled: usize,
}

struct IoThread {
    id: usize,
    g: Geometry,
    heroes: ThreadHeroes,
    /// AMT entries of this thread's chunks: chunk c at index c / T.
    amt: Vec<u32>,
    open: Option<OpenGroup>,
    low_water: usize,
    clock: Arc<AtomicU32>,
    members: Vec<MemberQueue>,
    reply_tx: Sender<MemberReply>,
    reply_rx: Receiver<MemberReply>,
    control: Receiver<Control>,
    /// Set by a crash stop seen while waiting for a grant.
    stopped: bool,
    /// Whether each member reported garbage collection in its last reply to this thread:
    /// a read whose home member does is sent to a calm replica (§5.3), as the
    /// single-owner engine steers it.
    gc_active: Vec<bool>,
    /// The write timestamps of this thread's chunks (indexed as `amt`; a GC move tells the
    /// timestamp the daemon drew for its copy).
    ts: Vec<u32>,
    /// The VHs of the hero groups this thread opened, of those in replication when it
    /// started and of those GC moved its chunks into: where a chunk's backups are until
    /// its stripe is converted. A read of a backup checks the copy's tags, since the
    /// thread does not learn of conversions.
    group_vhs: HashMap<u32, Vec<u32>>,
    /// Reads served from a replica, steered from a home member collecting garbage.
    replica_reads: u64,
    /// Reads of a primary the SSD could not correct, served from a replica or decoded.
    reads_corrected: u64,
    /// Whether each member serves (a failed one takes no command and holds nothing).
    serving: Vec<bool>,
    /// Reads of chunks on a failed member, from a replica or decoded from their stripe.
    degraded_reads: u64,
    /// The erasure code, to decode a chunk on a failed member from its stripe.
    codec: Box<dyn ErasureCodec>,
}

/// A write given its slot and sent to the members, not yet reported.
struct Placed {
    chunk: u32,
    stripe: u32,
    slot: usize,
    ts: u32,
    /// Its copies' replies come under tags `first_tag..first_tag + 1 + m`.
    first_tag: usize,
    /// When the read it merged was done.
    t0: TimeNs,
    /// Its place among the writes placed together.
    index: usize,
}

/// Writes placed together, and the commands sent (`issued`) under `tags` tags.
#[derive(Default)]
struct PlacedWrites {
    placed: Vec<Placed>,
    tags: usize,
    issued: usize,
}

/// What an I/O thread hands back when it ends.
struct IoThreadEnd {
    heroes: ThreadHeroes,
    open: Option<u32>,
    amt: Vec<u32>,
    /// What the daemon sent after the thread's last look, for the stop to apply.
    control: Receiver<Control>,
    replica_reads: u64,
    reads_corrected: u64,
    degraded_reads: u64,
}

impl IoThread {
    fn run(mut self, jobs: Receiver<IoJob>) -> IoThreadEnd {
        let grants = self.heroes.inbox.clone();
        let control = self.control.clone();
        while !self.stopped {
            select! {
                recv(control) -> c => match c {
                    Ok(c) => self.take_control(c),
                    Err(_) => break,
                },
                recv(grants) -> g => if let Ok(g) = g {
                    self.heroes.take(g);
                },
                recv(jobs) -> j => match j {
                    Ok(IoJob::Stop) | Err(_) => break,
                    Ok(job) => {
                        // What else is queued comes along, so that the members get the
                        // batch's commands together and each hand-off serves many.
                        let mut batch = vec![job];
                        let mut stop = false;
                        while batch.len() < MAX_BATCH_JOBS {
                            match jobs.try_recv() {
                                Ok(IoJob::Stop) => {
                                    stop = true;
                                    break;
                                }
                                Ok(job) => batch.push(job),
                                Err(_) => break,
                            }
                        }
                        self.run_batch(batch);
                        if stop {
                            break;
                        }
                    }
                },
            }
        }
        IoThreadEnd {
            heroes: self.heroes,
            open: self.open.map(|o| o.stripe),
            amt: self.amt,
            control: self.control,
            replica_reads: self.replica_reads,
            reads_corrected: self.reads_corrected,
            degraded_reads: self.degraded_reads,
        }
    }

    fn take_control(&mut self, c: Control) {
        match c {
            Control::Moved(mv) => {
                let e = mv.chunk as usize / self.g.threads;
                if self.amt[e] == mv.from {
                    self.amt[e] = mv.to;
                    self.ts[e] = mv.ts;
                    self.group_vhs.insert(mv.to / self.g.k as u32, mv.vhs);
                }
            }
            Control::Barrier { epoch } => self.heroes.send(ToManager::Passed {
                thread: self.id,
                epoch,
            }),
            Control::Seal { stripe } => self.seal(stripe),
            Control::Stop => self.stopped = true,
        }
    }

    /// Closes the open group early if it is still `stripe` (it may have filled since the
    /// daemon asked): the slots not filled are trimmed on the HH and on the VHs, as
    /// `close_open` does, and the daemon is told. Every write into the group has been
    /// reported before (controls are taken between batches), so `Sealed` follows its
    /// `Wrote`s on the daemon's channel.
    fn seal(&mut self, stripe: u32) {
        if self.open.as_ref().is_none_or(|o| o.stripe != stripe) {
            return;
        }
        let Some(open) = self.open.take() else {
            return;
        };
        let g = self.g;
        let (lba, cs) = (g.hh_lba(stripe), g.chunk_sectors);
        let mut issued = 0;
        let mut tag = 0;
        for j in open.filled..g.k {
            let d = g.data_member(stripe, j);
            let mut targets = vec![(d, lba)];
            for (r, &vh) in open.vhs.iter().enumerate() {
                targets.push((g.parity_member(stripe, r), g.vh_lba(vh, j)));
            }
            for (member, at) in targets {
                if self.serving[member] {
                    let sent =
                        self.issue(member, Opcode::Trim, at, cs, Vec::new(), None, false, tag);
                    issued += usize::from(sent.is_ok());
                }
                tag += 1;
            }
        }
        // A trim that failed leaves a slot no chunk was written to: conversion reads it as
        // whatever it holds and the parity covers that, so the group is full either way.
        self.collect_each(issued, tag);
        self.heroes.send(ToManager::Sealed {
            thread: self.id,
            stripe,
        });
    }

    /// Runs a batch of jobs in order. Reads and writes of distinct chunks run together;
    /// a second job for a chunk, and a trim, start a new run after the last one's.
    fn run_batch(&mut self, batch: Vec<IoJob>) {
        let mut run: Vec<IoJob> = Vec::new();
        let mut chunks: Vec<u32> = Vec::new();
        for job in batch {
            let chunk = match &job {
                IoJob::Write { chunk, .. } | IoJob::Read { chunk, .. } => Some(*chunk),
                _ => None,
            };
            match chunk {
                Some(c) if !chunks.contains(&c) => {
                    chunks.push(c);
                    run.push(job);
                }
                Some(c) => {
                    self.run_together(std::mem::take(&mut run));
                    chunks = vec![c];
                    run.push(job);
                }
                None => {
                    self.run_together(std::mem::take(&mut run));
                    chunks.clear();
                    self.run_job(job);
                }
            }
        }
        self.run_together(run);
    }

    /// Runs reads and writes of distinct chunks together: every read they need is sent to
    /// the members at once, then every write, so one hand-off carries many commands.
    /// Writes take slots in their order and are reported in it.
    fn run_together(&mut self, jobs: Vec<IoJob>) {
        if jobs.len() <= 1 {
            jobs.into_iter().for_each(|job| self.run_job(job));
            return;
        }
        let g = self.g;
        let cb = g.chunk_bytes();
        // The reads: of read jobs, and of the chunks partial writes merge into.
        let mut read_tag: Vec<Option<usize>> = vec![None; jobs.len()];
        let mut spans: Vec<(u32, u32, usize, usize, ReadPlan)> = Vec::new();
        // Reads decoded from a stripe (their home member failed), or that could not be sent.
        // The decodes run first, while no other read's reply can arrive.
        let mut early: Vec<Option<PieceRead>> = (0..jobs.len()).map(|_| None).collect();
        let mut wanted = Vec::new();
        for (i, job) in jobs.iter().enumerate() {
            let (chunk, at, len) = match job {
                IoJob::Read { chunk, at, len, .. } => (*chunk, *at, *len),
                IoJob::Write {
                    chunk, at, data, ..
                } if !(*at == 0 && data.len() == cb) => (*chunk, 0, cb),
                _ => continue,
            };
            let a = self.amt[chunk as usize / g.threads];
            if a == NONE {
                continue;
            }
            if self.home_failed(a) {
                let skip = at % g.sector_bytes;
                let read = self.read_degraded(chunk, a, at, len);
                self.degraded_reads += u64::from(read.is_ok());
                early[i] = Some(read.map(|(t, bytes, _)| (t, cut(bytes, skip, len))));
            } else {
                wanted.push((i, chunk, a, at, len));
            }
        }
        for (i, chunk, a, at, len) in wanted {
            let tag = spans.len();
            match self.issue_read(chunk, a, at, len, tag, CopyChoice::Steered) {
                Ok(plan) => {
                    read_tag[i] = Some(tag);
                    spans.push((chunk, a, at, len, plan));
                }
                Err(e) => early[i] = Some(Err(e)),
            }
        }
        let mut read = self.collect_each(spans.len(), spans.len());
        self.settle_reads(&spans, &mut read);
        let mut writes = Vec::new();
        let mut replies = Vec::new();
        for (i, job) in jobs.into_iter().enumerate() {
            // The bytes a read job or a partial write found: its chunk's, or zeroes if the
            // chunk was never written.
            let early = early[i].take();
            let found = |read: &mut Vec<Option<CopyReply>>| match read_tag[i] {
                _ if early.is_some() => early.unwrap_or_else(|| Err(member_gone())),
                Some(tag) => match read[tag].take() {
                    Some(Ok((t, bytes, _))) => {
                        let (_, _, _, len, plan) = spans[tag];
                        Ok((t, cut(bytes, plan.skip, len)))
                    }
                    Some(Err(e)) => Err(e),
                    None => Err(member_gone()),
                },
                None => Ok((0, Vec::new())),
            };
            match job {
                IoJob::Read {
                    len, reply, offset, ..
                } => {
                    let r = found(&mut read).map(|(t, mut bytes)| {
                        bytes.resize(len, 0);
                        (t, offset, bytes)
                    });
                    let _ = reply.send(r);
                }
                IoJob::Write {
                    chunk,
                    at,
                    data,
                    reply,
                } => {
                    if at == 0 && data.len() == cb {
                        writes.push((chunk, 0, data));
                        replies.push(reply);
                        continue;
                    }
                    match found(&mut read) {
                        Ok((t, mut whole)) => {
                            whole.resize(cb, 0);
                            whole[at..at + data.len()].copy_from_slice(&data);
                            writes.push((chunk, t, whole));
                            replies.push(reply);
                        }
                        Err(e) => {
                            let _ = reply.send(Err(e));
                        }
                    }
                }
                other => self.run_job(other),
            }
        }
        for (result, reply) in self.write_together(writes).into_iter().zip(replies) {
            let _ = reply.send(result);
        }
    }

    /// Writes whole chunks of distinct user chunks through the open hero groups, all copies
    /// of a group's writes sent before any is waited for, and reports them in order. A
    /// group's writes are reported before the next group is opened: opening may wait for a
    /// grant, and the daemon may need those reports to make room for it. Each write is
    /// (chunk, when the read it merged was done, the chunk's bytes); the results come in
    /// the writes' order.
    fn write_together(
        &mut self,
        writes: Vec<(u32, TimeNs, Vec<u8>)>,
    ) -> Vec<Result<TimeNs, DeviceError>> {
        let g = self.g;
        let mut results: Vec<Result<TimeNs, DeviceError>> = (0..writes.len())
            .map(|_| Err(Self::stopped_error()))
            .collect();
        let mut batch = PlacedWrites::default();
        for (index, (chunk, t0, data)) in writes.into_iter().enumerate() {
            if let Err(e) = self.open_group() {
                results[index] = Err(e);
                continue;
            }
            let Some(open) = &mut self.open else {
                continue;
            };
            let (stripe, j, vhs) = (open.stripe, open.filled, open.vhs.clone());
            open.filled += 1;
            let group_full = open.filled == g.k;
            if group_full {
                self.open = None;
            }
            self.heroes.send(ToManager::Writing { chunk });
            let ts = self.clock.fetch_add(1, Ordering::SeqCst).wrapping_add(1);
            let first_tag = batch.tags;
            let primary = g.tags(chunk, j, ts, KIND_PRIMARY, &data);
            // The backups' tags are the primary's with another kind byte.
            let backup = primary.clone().map(|mut t| {
                set_kind(&mut t, g.tag_bytes, KIND_BACKUP);
                t
            });
            let (d, lba, cs) = (g.data_member(stripe, j), g.hh_lba(stripe), g.chunk_sectors);
            // A failed member takes no copy; the chunk keeps the others.
            if self.serving[d] {
                let sent = self.issue(
                    d,
                    Opcode::Write,
                    lba,
                    cs,
                    data.clone(),
                    primary,
                    false,
                    first_tag,
                );
                batch.issued += usize::from(sent.is_ok());
            }
            for (r, &vh) in vhs.iter().enumerate() {
                let p = g.parity_member(stripe, r);
                if !self.serving[p] {
                    continue;
                }
                let lba = g.vh_lba(vh, j);
                let tag = first_tag + 1 + r;
                let sent = self.issue(
                    p,
                    Opcode::Write,
                    lba,
                    cs,
                    data.clone(),
                    backup.clone(),
                    g.transient,
                    tag,
                );
                batch.issued += usize::from(sent.is_ok());
            }
            batch.tags += 1 + g.m;
            batch.placed.push(Placed {
                chunk,
                stripe,
                slot: j,
                ts,
                first_tag,
                t0,
                index,
            });
            if group_full {
                self.report_writes(std::mem::take(&mut batch), &mut results);
            }
        }
        self.report_writes(batch, &mut results);
        results
    }

    /// Waits for the copies of placed writes, reports the writes to the daemon in order
    /// and puts each one's outcome in `results`.
    fn report_writes(&mut self, batch: PlacedWrites, results: &mut [Result<TimeNs, DeviceError>]) {
        let g = self.g;
        let copies = 1 + g.m;
        let copies_done = self.collect_each(batch.issued, batch.tags);
        for w in batch.placed {
            self.heroes.send(ToManager::Wrote {
                thread: self.id,
                chunk: w.chunk,
                stripe: w.stripe,
                slot: w.slot as u32,
                ts: w.ts,
            });
            // The daemon maps the chunk to its new slot whether or not every copy landed, so
            // the owner does too: a write that failed leaves the chunk's bytes undefined, as
            // on any device.
            self.amt[w.chunk as usize / g.threads] = w.stripe * g.k as u32 + w.slot as u32;
            self.ts[w.chunk as usize / g.threads] = w.ts;
            let mut done = w.t0;
            let mut error = None;
            for (c, r) in copies_done[w.first_tag..w.first_tag + copies]
                .iter()
                .enumerate()
            {
                let member = match c {
                    0 => g.data_member(w.stripe, w.slot),
                    _ => g.parity_member(w.stripe, c - 1),
                };
                if !self.serving[member] {
                    continue;
                }
                match r {
                    Some(Ok((t, _, _))) => done = done.max(*t),
                    Some(Err(e)) => {
                        error.get_or_insert(e.clone());
                    }
                    None => {
                        error.get_or_insert_with(member_gone);
                    }
                }
            }
            results[w.index] = match error {
                Some(e) => Err(e),
                None => Ok(done),
            };
        }
    }

    fn run_job(&mut self, job: IoJob) {
        match job {
            IoJob::Write {
                chunk,
                at,
                data,
                reply,
            } => {
                let _ = reply.send(self.write(chunk, at, &data));
            }
            IoJob::Read {
                chunk,
                at,
                len,
                reply,
                offset,
            } => {
                let r = self.read(chunk, at, len).map(|(t, d)| (t, offset, d));
                let _ = reply.send(r);
            }
            IoJob::Trim {
                chunk,
                at,
                len,
                reply,
            } => {
                let _ = reply.send(self.trim(chunk, at, len));
            }
            IoJob::Allocation { first, end, reply } => {
                // Thread `id` owns the chunks `c` with `c % threads == id` (`owner`).
                let threads = self.g.threads as u32;
                let own = first + (self.id as u32 + threads - first % threads) % threads;
                let mapped = (own..end)
                    .step_by(threads as usize)
                    .filter(|&c| self.amt[c as usize / threads as usize] != NONE)
                    .collect();
                let _ = reply.send(mapped);
            }
            IoJob::Stop => self.stopped = true,
        }
    }

    fn stopped_error() -> DeviceError {
        DeviceError::Unsupported("the ScalaAFA engine is stopping".into())
    }

    /// Runs a command on member `member`; its reply comes to this thread's channel under
    /// `tag`.
    #[allow(clippy::too_many_arguments)]
    fn issue(
        &self,
        member: usize,
        opcode: Opcode,
        lba: u64,
        sectors: u32,
        data: Vec<u8>,
        tags: Option<Vec<u8>>,
        transient: bool,
        tag: usize,
    ) -> Result<(), DeviceError> {
        self.members[member]
            .send(MemberOp::Submit {
                member,
                opcode,
                lba,
                sectors,
                data,
                tags,
                flags: CommandFlags {
                    fua: false,
                    transient,
                },
                read_tags: false,
                reply: self.reply_tx.clone(),
                tag,
            })
            .map_err(|_| member_gone())
    }

    /// Collects `n` replies to commands tagged below `tags`: each tag's completion time and
    /// data, or its error, or nothing if no reply came for it.
    fn collect_each(&mut self, n: usize, tags: usize) -> Vec<Option<CopyReply>> {
        let mut out: Vec<Option<CopyReply>> = (0..tags).map(|_| None).collect();
        for _ in 0..n {
            let Ok(r) = self.reply_rx.recv() else {
                break;
            };
            if let (Ok(d), Some(gc)) = (&r.result, self.gc_active.get_mut(r.member)) {
                *gc = d.completion.gc_active;
            }
            if let Some(slot) = out.get_mut(r.tag) {
                *slot = Some(r.result.map(|d| (d.completion.done_ns, d.data, d.tags)));
            }
        }
        out
    }

    /// Reads `len` bytes at byte `at` of `chunk`: from its primary copy, or from a replica
    /// while the primary's member collects garbage.
    fn read(
        &mut self,
        chunk: u32,
        at: usize,
        len: usize,
    ) -> Result<(TimeNs, Vec<u8>), DeviceError> {
        let a = self.amt[chunk as usize / self.g.threads];
        if a == NONE {
            return Ok((0, vec![0u8; len]));
        }
        if self.home_failed(a) {
            let (t, bytes, _) = self.read_degraded(chunk, a, at, len)?;
            self.degraded_reads += 1;
            return Ok((t, cut(bytes, at % self.g.sector_bytes, len)));
        }
        let plan = self.issue_read(chunk, a, at, len, 0, CopyChoice::Steered)?;
        let spans = [(chunk, a, at, len, plan)];
        let mut replies = self.collect_each(1, 1);
        self.settle_reads(&spans, &mut replies);
        let reply = replies.pop().flatten();
        let (t, bytes, _) = reply.unwrap_or_else(|| Err(member_gone()))?;
        Ok((t, cut(bytes, plan.skip, len)))
    }

    /// Whether the home member of AFA chunk `a` failed.
    fn home_failed(&self, a: u32) -> bool {
        let g = self.g;
        !self.serving[g.data_member(a / g.k as u32, (a % g.k as u32) as usize)]
    }

    /// Reads the sectors holding bytes `at..at + len` of `chunk` (AFA chunk `a`) without its
    /// primary (its member failed, or the SSD could not correct it): from a replica the
    /// thread knows whose tags still name the chunk, else decoded from the stripe. The
    /// daemon converts stripes meanwhile, one parity member after the other, so a stripe
    /// caught between two of them neither keeps every replica nor decodes yet; the read
    /// then tries again, a millisecond later, for up to 50 ms.
    fn read_degraded(&mut self, chunk: u32, a: u32, at: usize, len: usize) -> CopyReply {
        const ATTEMPTS: usize = 50;
        let mut last = Err(DeviceError::Failed);
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            for r in 0..self.g.m {
                let Some(replica) = self.replica_on(chunk, a, r) else {
                    continue;
                };
                let copy = (chunk, (a % self.g.k as u32) as usize, replica.2);
                let plan = self.issue_read(chunk, a, at, len, 0, CopyChoice::At(replica))?;
                debug_assert_eq!(plan.replica_of, Some(copy));
                if let Some(Ok(reply)) = self.collect_each(1, 1).pop().flatten() {
                    if self.g.names_backup(&reply.2, copy) {
                        return Ok(reply);
                    }
                }
            }
            last = self.read_decoded(chunk, a, at, len);
            if last.is_ok() {
                return last;
            }
        }
        last
    }

    /// Decodes the sectors holding bytes `at..at + len` of `chunk` (AFA chunk `a`) from the
    /// same sectors of its stripe's other chunks on the serving members (data and parity,
    /// read with their tags), as the single-owner engine decodes a degraded read; a shard
    /// that cannot be read is left out while k others remain. The parity covers the backups' tags, so the decoded tags
    /// must be the chunk's backup's: a stripe still in replication, or a row freed and used
    /// again, does not decode to them, and the read fails instead of returning other bytes.
    fn read_decoded(&mut self, chunk: u32, a: u32, at: usize, len: usize) -> CopyReply {
        let g = self.g;
        let (stripe, j) = (a / g.k as u32, (a % g.k as u32) as usize);
        let first = at / g.sector_bytes;
        let sectors = (at + len).div_ceil(g.sector_bytes) - first;
        let shards = g.k + g.m;
        let mut sent = 0;
        for i in (0..shards).filter(|&i| i != j) {
            let member = if i < g.k {
                g.data_member(stripe, i)
            } else {
                g.parity_member(stripe, i - g.k)
            };
            if !self.serving[member] {
                continue;
            }
            self.members[member]
                .send(MemberOp::Submit {
                    member,
                    opcode: Opcode::Read,
                    lba: g.hh_lba(stripe) + first as u64,
                    sectors: sectors as u32,
                    data: Vec::new(),
                    tags: None,
                    flags: CommandFlags {
                        fua: false,
                        transient: false,
                    },
                    read_tags: true,
                    reply: self.reply_tx.clone(),
                    tag: i,
                })
                .map_err(|_| member_gone())?;
            sent += 1;
        }
        let replies = self.collect_each(sent, shards);
        let mut data = vec![vec![0u8; sectors * g.sector_bytes]; shards];
        let mut tags = vec![vec![0u8; sectors * g.tag_bytes]; shards];
        let mut present = vec![false; shards];
        let mut done = 0;
        for (i, reply) in replies.into_iter().enumerate() {
            let Some(Ok((t, bytes, mut t_tags))) = reply else {
                continue;
            };
            if i < g.k {
                // The parity was computed over the backups' tags.
                set_kind(&mut t_tags, g.tag_bytes, KIND_BACKUP);
            }
            done = done.max(t);
            data[i] = bytes;
            tags[i] = t_tags;
            present[i] = true;
        }
        let decode = |shards: &mut Vec<Vec<u8>>, codec: &dyn ErasureCodec| {
            let mut refs: Vec<&mut [u8]> = shards.iter_mut().map(|v| v.as_mut_slice()).collect();
            codec
                .reconstruct(&mut refs, &present)
                .map_err(|_| DeviceError::Failed)
        };
        decode(&mut data, self.codec.as_ref())?;
        decode(&mut tags, self.codec.as_ref())?;
        let ts = self.ts[chunk as usize / g.threads];
        if !g.names_backup(&tags[j], (chunk, j, ts)) {
            return Err(DeviceError::Medium(format!(
                "chunk {chunk} does not decode from its stripe"
            )));
        }
        // A parity whose tags outlived its data (a host crash, with a member lost before it)
        // decodes to the chunk's tags but to other bytes.
        if !copy_is_whole(&tags[j], &data[j], g.tag_bytes, g.sector_bytes) {
            return Err(DeviceError::Medium(format!(
                "chunk {chunk} decodes to data its checksums do not match"
            )));
        }
        Ok((
            done,
            std::mem::take(&mut data[j]),
            std::mem::take(&mut tags[j]),
        ))
    }

    /// A replica of `chunk` (AFA chunk `a`), one whose member is not collecting garbage if
    /// `calm`, as (member, lba of the copy, the chunk's timestamp): known while the thread
    /// knows the chunk's timestamp and its group's VHs.
    fn replica(&self, chunk: u32, a: u32, calm: bool) -> Option<(usize, u64, u32)> {
        (0..self.g.m)
            .filter_map(|r| self.replica_on(chunk, a, r))
            .find(|&(p, _, _)| !(calm && self.gc_active[p]))
    }

    /// The replica of `chunk` (AFA chunk `a`) on its group's parity member `r`, if the
    /// thread knows it and that member serves.
    fn replica_on(&self, chunk: u32, a: u32, r: usize) -> Option<(usize, u64, u32)> {
        let g = self.g;
        let ts = self.ts[chunk as usize / g.threads];
        let (stripe, j) = (a / g.k as u32, (a % g.k as u32) as usize);
        let vh = *self.group_vhs.get(&stripe).filter(|_| ts != NONE)?.get(r)?;
        let p = g.parity_member(stripe, r);
        (vh != NONE && self.serving[p]).then(|| (p, g.vh_lba(vh, j), ts))
    }

    /// Sends the read of the whole sectors holding bytes `at..at + len` of `chunk` (AFA
    /// chunk `a`), tagged `tag`, to the copy `choice` picks (a replica's read brings its
    /// tags, to be checked); fails only when the engine has stopped.
    fn issue_read(
        &self,
        chunk: u32,
        a: u32,
        at: usize,
        len: usize,
        tag: usize,
        choice: CopyChoice,
    ) -> Result<ReadPlan, DeviceError> {
        let g = self.g;
        let (stripe, j) = (a / g.k as u32, (a % g.k as u32) as usize);
        let home = g.data_member(stripe, j);
        let replica = match choice {
            CopyChoice::Steered if self.gc_active[home] => self.replica(chunk, a, true),
            CopyChoice::Steered | CopyChoice::Primary => None,
            CopyChoice::At(replica) => Some(replica),
        };
        let first = at / g.sector_bytes;
        let last = (at + len).div_ceil(g.sector_bytes);
        let (member, lba) = match replica {
            Some((p, lba, _)) => (p, lba),
            None => (home, g.hh_lba(stripe)),
        };
        self.members[member]
            .send(MemberOp::Submit {
                member,
                opcode: Opcode::Read,
                lba: lba + first as u64,
                sectors: (last - first) as u32,
                data: Vec::new(),
                tags: None,
                flags: CommandFlags {
                    fua: false,
                    transient: false,
                },
                read_tags: replica.is_some(),
                reply: self.reply_tx.clone(),
                tag,
            })
            .map_err(|_| member_gone())?;
        Ok(ReadPlan {
            skip: at - first * g.sector_bytes,
            replica_of: replica.map(|(_, _, ts)| (chunk, j, ts)),
        })
    }

    /// Completes the reads sent under `spans` (chunk, AFA chunk, at, len, plan), whose
    /// replies are in `replies` by tag. A replica read that failed, or whose tags do not
    /// name the chunk's backup (the stripe was converted since, and the VH reused or
    /// dropped), is sent again to the primary; a primary the SSD could not correct is read
    /// as a failed member's chunk is ([`Self::read_degraded`]).
    fn settle_reads(
        &mut self,
        spans: &[(u32, u32, usize, usize, ReadPlan)],
        replies: &mut [Option<CopyReply>],
    ) {
        let g = self.g;
        let mut again = Vec::new();
        for (tag, &(chunk, a, at, len, plan)) in spans.iter().enumerate() {
            let stale = match (&replies[tag], plan.replica_of) {
                (Some(Ok((_, _, tags))), Some(copy)) => !g.names_backup(tags, copy),
                (Some(Err(_)), Some(_)) => true,
                _ => false,
            };
            self.replica_reads += u64::from(plan.replica_of.is_some() && !stale);
            if stale
                && self
                    .issue_read(chunk, a, at, len, tag, CopyChoice::Primary)
                    .is_ok()
            {
                again.push(tag);
            }
        }
        if !again.is_empty() {
            let mut second = self.collect_each(again.len(), replies.len());
            for tag in again {
                replies[tag] = second[tag].take();
            }
        }
        for (tag, &(chunk, a, at, len, _)) in spans.iter().enumerate() {
            if let Some(Err(DeviceError::Uncorrectable { .. })) = replies[tag] {
                if let Ok(reply) = self.read_degraded(chunk, a, at, len) {
                    self.reads_corrected += 1;
                    replies[tag] = Some(Ok(reply));
                }
            }
        }
    }

    fn write(&mut self, chunk: u32, at: usize, data: &[u8]) -> Result<TimeNs, DeviceError> {
        let cb = self.g.chunk_bytes();
        let (t0, whole) = if at == 0 && data.len() == cb {
            (0, data.to_vec())
        } else {
            // Out-of-place update of part of a chunk: the rest comes from its copy.
            let (t, mut b) = self.read(chunk, 0, cb)?;
            b[at..at + data.len()].copy_from_slice(data);
            (t, b)
        };
        let mut done = self.write_together(vec![(chunk, t0, whole)]);
        done.pop().unwrap_or_else(|| Err(Self::stopped_error()))
    }

    fn trim(&mut self, chunk: u32, at: usize, len: usize) -> Result<TimeNs, DeviceError> {
        let e = chunk as usize / self.g.threads;
        if at == 0 && len == self.g.chunk_bytes() {
            if self.amt[e] != NONE {
                self.amt[e] = NONE;
                self.heroes.send(ToManager::Unmapped { chunk });
            }
            return Ok(0);
        }
        if self.amt[e] == NONE {
            return Ok(0);
        }
        // A partial trim writes zeroes, so the chunk reads back as trimmed.
        self.write(chunk, at, &vec![0u8; len])
    }

    /// The open hero group, assembled from this thread's heroes; asks the manager for more
    /// below the low-water mark and waits for a grant when it holds none.
    fn open_group(&mut self) -> Result<(), DeviceError> {
        if self.open.is_some() {
            return Ok(());
        }
        let grants = self.heroes.inbox.clone();
        let control = self.control.clone();
        let deadline = Instant::now() + GRANT_TIMEOUT;
        loop {
            self.heroes.pump();
            if let Some((stripe, vhs, _)) = self.heroes.assemble() {
                if self.heroes.held_hhs() < self.low_water {
                    self.heroes.ask(0);
                }
                self.heroes.send(ToManager::Opened {
                    thread: self.id,
                    stripe,
                    vhs: vhs.clone(),
                });
                self.group_vhs.insert(stripe, vhs.clone());
                self.open = Some(OpenGroup {
                    stripe,
                    vhs,
                    filled: 0,
                });
                return Ok(());
            }
            self.heroes.ask(0);
            // Waiting for the grant, the thread still answers the daemon: the grant may
            // need rows that are freed only once this thread passes a barrier.
            select! {
                recv(grants) -> g => if let Ok(g) = g {
                    self.heroes.take(g);
                },
                recv(control) -> c => match c {
                    Ok(c) => self.take_control(c),
                    Err(_) => return Err(Self::stopped_error()),
                },
                default(deadline.saturating_duration_since(Instant::now())) => {
                    return Err(DeviceError::VolumeFull(format!(
                        "I/O thread {} waited {} s for a hero group and was granted none",
                        self.id,
                        GRANT_TIMEOUT.as_secs()
                    )));
                }
            }
            if self.stopped {
                return Err(Self::stopped_error());
            }
        }
    }
}

// ----- the engine on threads -----

/// Join handles and channel ends only the stop needs.
struct Running<D> {
    io: Vec<JoinHandle<IoThreadEnd>>,
    controls: Vec<Sender<Control>>,
    daemon: JoinHandle<ScalaAfa<MemberProxy>>,
    to_daemon: Sender<ToManager>,
    members: Vec<Arc<SharedMember<D>>>,
    idle: JoinHandle<()>,
    idle_stop: Sender<()>,
    spares: Vec<D>,
}

/// A ScalaAFA volume whose I/O threads, space manager (daemon) and member SSDs each run on
/// an OS thread of their own (see the module documentation). Requests may come from any
/// number of threads at once; a request's chunks go to their owners' threads.
pub struct ThreadedScalaAfa<D: BlockDevice + Send + 'static> {
    info: DeviceInfo,
    g: Geometry,
    clock: Clock,
    jobs: Vec<Sender<IoJob>>,
    members: Vec<MemberQueue>,
    /// Whether each member serves: a flush leaves a failed one alone.
    serving: Vec<bool>,
    /// With members behind a volatile cache: flushes started, the write clock, and the
    /// daemon to tell when one is done (it then trims and hands out the rows it held for it).
    flushes: Option<(Arc<FlushCount>, Arc<AtomicU32>, Sender<ToManager>)>,
    /// Taken by the stop; never touched on the request path.
    running: Mutex<Option<Running<D>>>,
}

impl<D: BlockDevice + Send + 'static> std::fmt::Debug for ThreadedScalaAfa<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadedScalaAfa")
            .field("info", &self.info)
            .field("io_threads", &self.g.threads)
            .finish()
    }
}

/// A read or write handed to the I/O threads and not yet waited for.
#[derive(Debug)]
pub struct InFlight {
    pieces: usize,
    replies: Replies,
}

#[derive(Debug)]
enum Replies {
    Read(Receiver<ReadReply>),
    Write(Receiver<Result<TimeNs, DeviceError>>),
    Refused(DeviceError),
}

impl InFlight {
    fn refused(e: DeviceError) -> Self {
        InFlight {
            pieces: 0,
            replies: Replies::Refused(e),
        }
    }

    /// Waits for every piece; returns the latest completion or the first error. A read's
    /// bytes go to `out`, which has the read's length; a write's `out` is empty.
    pub fn finish(self, out: &mut [u8]) -> Result<TimeNs, DeviceError> {
        match self.replies {
            Replies::Refused(e) => Err(e),
            Replies::Read(rx) => {
                let next = || rx.recv().unwrap_or_else(|_| Err(stopped()));
                gather(self.pieces, next, |(t, at, data)| {
                    out[at..at + data.len()].copy_from_slice(&data);
                    t
                })
            }
            Replies::Write(rx) => {
                let next = || rx.recv().unwrap_or_else(|_| Err(stopped()));
                gather(self.pieces, next, |t| t)
            }
        }
    }
}

/// Takes `n` replies from `next`; returns the latest completion `each` finds in them,
/// or the first error (after all `n` are in, so none is left to a later request).
/// The `len` bytes that start `skip` bytes into a sector-aligned read's reply.
fn cut(mut bytes: Vec<u8>, skip: usize, len: usize) -> Vec<u8> {
    bytes.drain(..skip);
    bytes.truncate(len);
    bytes
}

fn gather<T>(
    n: usize,
    mut next: impl FnMut() -> Result<T, DeviceError>,
    mut each: impl FnMut(T) -> TimeNs,
) -> Result<TimeNs, DeviceError> {
    let mut done = 0;
    let mut error = None;
    for _ in 0..n {
        match next() {
            Ok(v) => done = done.max(each(v)),
            Err(e) => {
                error.get_or_insert(e);
            }
        }
    }
    match error {
        Some(e) => Err(e),
        None => Ok(done),
    }
}

fn stopped() -> DeviceError {
    DeviceError::Unsupported("the ScalaAFA volume has stopped".into())
}

impl<D: BlockDevice + Send + 'static> ScalaAfa<D> {
    /// Starts the engine on threads: one per I/O thread (`io_threads`), the daemon, and one
    /// per member. Refused, with the volume handed back, while a member is failed or being
    /// rebuilt or failures are scheduled (the single-owner engine handles those), and for
    /// members that do not keep whole sectors. The threads' clock starts at zero, as serve
    /// mode's does, so the engine should not have run ahead in virtual time before.
    pub fn into_threads(self) -> Result<ThreadedScalaAfa<D>, (Box<Self>, String)> {
        if self.scala.sub_chunk_writes == SubChunkWrites::InPlace {
            return Err((
                Box::new(self),
                "sub_chunk_writes = \"in-place\" runs in the simulation only".into(),
            ));
        }
        if self
            .members
            .iter()
            .any(|m| matches!(m.state, MemberState::Rebuilding { .. }))
        {
            return Err((Box::new(self), "a member is being rebuilt".into()));
        }
        if self.scheduled_failures.next_ns().is_some() {
            return Err((Box::new(self), "member failures are scheduled".into()));
        }
        if self.unit != self.info.sector_bytes as usize {
            return Err((
                Box::new(self),
                "the members keep no whole sectors (payload is not full)".into(),
            ));
        }
        let threads = self.scala.io_threads.max(1) as usize;
        let clock = Clock {
            epoch: Instant::now(),
        };
        let g = Geometry {
            k: self.k,
            m: self.m,
            n: self.members.len(),
            rows: self.rows,
            chunk_sectors: self.chunk_sectors,
            sector_bytes: self.unit,
            tag_bytes: self.tag_bytes,
            threads,
            transient: self.scala.mode != ScalaMode::ScalaWr,
        };
        let info = self.info;
        let low_water = self.low_water;
        let ts_clock = Arc::new(AtomicU32::new(self.clock));
        let flushes = Arc::new(FlushCount {
            clock: AtomicU32::new(self.flush_clock),
            ..FlushCount::default()
        });
        let keep_flushed = self.keep_flushed;
        let (v, devices, spares) = self.take_devices();
        let n = devices.len();
        let infos: Vec<DeviceInfo> = devices.iter().map(|d| d.info()).collect();
        let members: Vec<Arc<SharedMember<D>>> = devices
            .into_iter()
            .map(|d| Arc::new(SharedMember::new(d)))
            .collect();
        let ports: Vec<Arc<dyn MemberPort>> = members
            .iter()
            .map(|m| m.clone() as Arc<dyn MemberPort>)
            .collect();
        let queues: Vec<MemberQueue> = ports
            .iter()
            .map(|port| MemberQueue {
                port: port.clone(),
                clock,
            })
            .collect();
        let (idle_stop, idle_rx) = bounded(1);
        let idle = std::thread::Builder::new()
            .name("scalaafa-idle".into())
            .spawn(move || run_idle(ports, idle_rx, clock))
            .expect("the OS cannot start a thread");
        let proxies = infos
            .into_iter()
            .enumerate()
            .map(|(i, info)| {
                let (reply_tx, reply_rx) = unbounded();
                MemberProxy {
                    info,
                    member: i,
                    ops: queues[i].clone(),
                    reply_tx,
                    reply_rx,
                }
            })
            .collect();
        let (mut v, _, _) = v.swap_devices(proxies);
        v.remote = Some(Remote {
            clock: ts_clock.clone(),
            io_threads: threads,
            moved: Vec::new(),
            writing: HashMap::new(),
            dying: Vec::new(),
            sealing: HashSet::new(),
            seals: Vec::new(),
            barriers: VecDeque::new(),
            next_epoch: 0,
            stop: None,
            error: None,
            flushes: flushes.clone(),
        });
        let to_daemon = v.threads[0].to_manager.clone();
        let serving: Vec<bool> = v
            .members
            .iter()
            .map(|m| m.state == MemberState::Alive)
            .collect();
        // The groups in replication now, for reads steered to their backups.
        let replicating: HashMap<u32, Vec<u32>> = (0..v.rows)
            .filter(|&r| matches!(v.stripes[r as usize].state, HhState::Open | HhState::Full))
            .map(|r| (r, v.stripes[r as usize].vhs.clone()))
            .collect();
        let mut jobs = Vec::new();
        let mut controls = Vec::new();
        let mut io = Vec::new();
        for t in 0..threads {
            let stand_in = v.threads[t].stand_in();
            let heroes = std::mem::replace(&mut v.threads[t], stand_in);
            let amt = (t..v.amt.len())
                .step_by(threads)
                .map(|c| v.amt[c])
                .collect();
            let open = v.open[t].map(|stripe| {
                let s = &v.stripes[stripe as usize];
                OpenGroup {
                    stripe,
                    vhs: s.vhs.clone(),
                    filled: s.filled as usize,
                }
            });
            let (job_tx, job_rx) = unbounded();
            let (control_tx, control_rx) = unbounded();
            let (reply_tx, reply_rx) = unbounded();
            let thread = IoThread {
                id: t,
                g,
                heroes,
                amt,
                open,
                low_water,
                clock: ts_clock.clone(),
                members: queues.clone(),
                reply_tx,
                reply_rx,
                control: control_rx,
                stopped: false,
                gc_active: vec![false; n],
                ts: (t..v.amt_ts.len())
                    .step_by(threads)
                    .map(|c| if v.amt[c] == NONE { NONE } else { v.amt_ts[c] })
                    .collect(),
                group_vhs: replicating.clone(),
                replica_reads: 0,
                reads_corrected: 0,
                serving: serving.clone(),
                degraded_reads: 0,
                codec: afa_parity::codec(g.k, g.m).expect("the engine's own code"),
            };
            io.push(
                std::thread::Builder::new()
                    .name(format!("scalaafa-io{t}"))
                    .spawn(move || thread.run(job_rx))
                    .expect("the OS cannot start a thread"),
            );
            jobs.push(job_tx);
            controls.push(control_tx);
        }
        let daemon_controls = controls.clone();
        let daemon = std::thread::Builder::new()
            .name("scalaafa-daemon".into())
            .spawn(move || v.run_daemon(daemon_controls, clock))
            .expect("the OS cannot start a thread");
        Ok(ThreadedScalaAfa {
            info,
            g,
            clock,
            jobs,
            members: queues,
            serving,
            flushes: keep_flushed.then(|| (flushes, ts_clock.clone(), to_daemon.clone())),
            running: Mutex::new(Some(Running {
                io,
                controls,
                daemon,
                to_daemon,
                members,
                idle,
                idle_stop,
                spares,
            })),
        })
    }
}

/// Stands for "no device" while an engine's members change hands.
#[derive(Debug)]
pub(super) struct NoDevice;

impl BlockDevice for NoDevice {
    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            sector_bytes: 1,
            capacity_sectors: 0,
            payload_unit_bytes: 0,
            tag_bytes_per_sector: 0,
            max_queue_depth: 1,
            max_transfer_sectors: 0,
        }
    }
    fn submit(
        &mut self,
        _now_ns: TimeNs,
        _cmd: &Command<'_>,
        _out: ReadBuffers<'_>,
    ) -> Result<Completion, DeviceError> {
        Err(DeviceError::Unsupported("no device".into()))
    }
    fn background(&mut self, _now_ns: TimeNs) -> Option<TimeNs> {
        None
    }
}

impl<D: BlockDevice> ScalaAfa<D> {
    /// Gives the engine the member devices `devices` (in member order) and hands back the
    /// ones it had and its spares. The devices change hands twice when the engine starts on
    /// threads (to [`NoDevice`], then to proxies of the shared members) and twice when it
    /// stops.
    fn swap_devices<E: BlockDevice>(self, devices: Vec<E>) -> (ScalaAfa<E>, Vec<D>, Vec<D>) {
        let mut old = Vec::with_capacity(self.members.len());
        let members = self
            .members
            .into_iter()
            .zip(devices)
            .map(|(m, device)| {
                old.push(m.device);
                Member {
                    device,
                    state: m.state,
                    gc_active: m.gc_active,
                    vh_owner: m.vh_owner,
                    fresh: m.fresh,
                }
            })
            .collect();
        let v = ScalaAfa {
            config: self.config,
            scala: self.scala,
            k: self.k,
            m: self.m,
            members,
            spares: Vec::new(),
            codec: self.codec,
            amt: self.amt,
            amt_ts: self.amt_ts,
            checkpoints: self.checkpoints,
            stripes: self.stripes,
            by_live: self.by_live,
            manager: self.manager,
            threads: self.threads,
            open: self.open,
            next_thread: self.next_thread,
            pending: self.pending,
            daemon: self.daemon,
            clock: self.clock,
            rows: self.rows,
            vhs_per_member: self.vhs_per_member,
            batch_hhs: self.batch_hhs,
            low_water: self.low_water,
            gc_reserve: self.gc_reserve,
            scheduled_failures: self.scheduled_failures,
            info: self.info,
            unit: self.unit,
            tag_bytes: self.tag_bytes,
            chunk_sectors: self.chunk_sectors,
            background_depth: self.background_depth,
            gc_nesting: self.gc_nesting,
            work: self.work,
            messages_taken: self.messages_taken,
            stats: self.stats,
            keep_flushed: self.keep_flushed,
            unflushed: self.unflushed,
            replaced: self.replaced,
            flush_clock: self.flush_clock,
            remote: self.remote,
        };
        (v, old, self.spares)
    }

    /// Takes the member devices out, leaving stand-ins.
    fn take_devices(self) -> (ScalaAfa<NoDevice>, Vec<D>, Vec<D>) {
        let stand_ins = (0..self.members.len()).map(|_| NoDevice).collect();
        self.swap_devices(stand_ins)
    }
}

/// One request's pieces, each inside one chunk: (chunk, byte offset in the chunk, length,
/// byte offset in the request).
fn pieces(
    offset: u64,
    len: usize,
    chunk_bytes: usize,
) -> impl Iterator<Item = (u32, usize, usize, usize)> {
    let cb = chunk_bytes as u64;
    let end = offset + len as u64;
    let mut at = offset;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let chunk = at / cb;
        let to = ((chunk + 1) * cb).min(end);
        let piece = (
            chunk as u32,
            (at - chunk * cb) as usize,
            (to - at) as usize,
            (at - offset) as usize,
        );
        at = to;
        Some(piece)
    })
}

impl<D: BlockDevice + Send + 'static> ThreadedScalaAfa<D> {
    pub fn info(&self) -> DeviceInfo {
        self.info
    }

    /// The instant the engine's clock counts from: completion times are nanoseconds after it.
    pub fn epoch(&self) -> Instant {
        self.clock.epoch
    }

    pub fn io_threads(&self) -> usize {
        self.g.threads
    }

    pub fn chunk_sectors(&self) -> u32 {
        self.g.chunk_sectors
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(), DeviceError> {
        let size = self.info.capacity_sectors * self.info.sector_bytes as u64;
        if offset.checked_add(len).is_none_or(|end| end > size) {
            let sector = self.info.sector_bytes as u64;
            return Err(DeviceError::OutOfRange {
                lba: offset / sector,
                sectors: len.div_ceil(sector).min(u32::MAX as u64) as u32,
                capacity: self.info.capacity_sectors,
            });
        }
        Ok(())
    }

    fn owner(&self, chunk: u32) -> &Sender<IoJob> {
        &self.jobs[chunk as usize % self.jobs.len()]
    }

    /// The allocation of `sectors` sectors from `lba`, per chunk as the single-owner
    /// engine answers it: a chunk is data when its owner's AMT maps it. Every I/O thread is
    /// asked for the chunks it owns, behind the jobs already queued to it, so the answer
    /// covers every request completed before the call. `None` past the end or once the
    /// threads have stopped.
    pub fn allocation(&self, lba: u64, sectors: u32) -> Option<Vec<(u32, bool)>> {
        let cs = self.g.chunk_sectors as u64;
        let end = lba.checked_add(sectors as u64)?;
        if end > self.info.capacity_sectors {
            return None;
        }
        let first = u32::try_from(lba / cs).ok()?;
        let last = u32::try_from(end.div_ceil(cs)).ok()?;
        let (tx, rx) = unbounded();
        for jobs in &self.jobs {
            let ask = IoJob::Allocation {
                first,
                end: last,
                reply: tx.clone(),
            };
            jobs.send(ask).ok()?;
        }
        drop(tx);
        let mut mapped = vec![false; (last - first) as usize];
        for _ in &self.jobs {
            for c in rx.recv().ok()? {
                mapped[(c - first) as usize] = true;
            }
        }
        crate::chunk_allocation(lba, sectors, self.info.capacity_sectors, cs, |c| {
            mapped[(c - first as u64) as usize]
        })
    }

    /// Reads `out.len()` bytes at byte `offset`; returns the model's completion time.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<TimeNs, DeviceError> {
        self.start_read(offset, out.len()).finish(out)
    }

    /// Writes `data` at byte `offset` (any alignment); returns the model's completion time.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<TimeNs, DeviceError> {
        self.start_write(offset, data).finish(&mut [])
    }

    /// Hands a read of `length` bytes at `offset` to its chunks' owners without waiting:
    /// a caller with many requests starts them all, then finishes each.
    pub fn start_read(&self, offset: u64, length: usize) -> InFlight {
        let sent = self.dispatch(offset, length, |chunk, at, len, offset, reply| {
            IoJob::Read {
                chunk,
                at,
                len,
                reply,
                offset,
            }
        });
        match sent {
            Ok((pieces, rx)) => InFlight {
                pieces,
                replies: Replies::Read(rx),
            },
            Err(e) => InFlight::refused(e),
        }
    }

    /// As `start_read`, for a write of `data` at `offset` (any alignment).
    pub fn start_write(&self, offset: u64, data: &[u8]) -> InFlight {
        let sent = self.dispatch(offset, data.len(), |chunk, at, len, from, reply| {
            IoJob::Write {
                chunk,
                at,
                data: data[from..from + len].to_vec(),
                reply,
            }
        });
        match sent {
            Ok((pieces, rx)) => InFlight {
                pieces,
                replies: Replies::Write(rx),
            },
            Err(e) => InFlight::refused(e),
        }
    }

    /// Deallocates `length` bytes at `offset`: whole chunks are unmapped, the parts of
    /// chunks at the edges are written with zeroes, so the range reads back as zeroes.
    pub fn trim(&self, offset: u64, length: u64) -> Result<TimeNs, DeviceError> {
        // The range is checked before any piece is cut, so the length fits in memory's
        // address space when it counts.
        let len = usize::try_from(length).unwrap_or(usize::MAX);
        let (pieces, rx) = self.dispatch(offset, len, |chunk, at, len, _, reply| IoJob::Trim {
            chunk,
            at,
            len,
            reply,
        })?;
        gather(
            pieces,
            || rx.recv().unwrap_or_else(|_| Err(stopped())),
            |t| t,
        )
    }

    /// Checks a request's range and sends each of its pieces to its chunk's owner, as the
    /// job `job` makes from (chunk, byte in the chunk, length, byte in the request, where
    /// to reply). Returns how many pieces went out and where their replies come.
    fn dispatch<T>(
        &self,
        offset: u64,
        length: usize,
        mut job: impl FnMut(u32, usize, usize, usize, Sender<T>) -> IoJob,
    ) -> Result<(usize, Receiver<T>), DeviceError> {
        self.check_range(offset, length as u64)?;
        let (tx, rx) = unbounded();
        let mut sent = 0;
        for (chunk, at, len, from) in pieces(offset, length, self.g.chunk_bytes()) {
            self.owner(chunk)
                .send(job(chunk, at, len, from, tx.clone()))
                .map_err(|_| stopped())?;
            sent += 1;
        }
        Ok((sent, rx))
    }

    /// Makes every write completed before the call durable: each member flushes. The AMT
    /// and HGMT need nothing, since recovery rebuilds them from the OOB tags (§5.4). With
    /// members behind a volatile cache the daemon then learns that the copies replaced
    /// before this flush started are no longer needed.
    pub fn flush(&self) -> Result<TimeNs, DeviceError> {
        let started = self
            .flushes
            .as_ref()
            .map(|(count, clock, _)| count.start(clock.load(Ordering::SeqCst)));
        let done = self.flush_members()?;
        if let (Some(upto), Some((_, _, daemon))) = (started, &self.flushes) {
            daemon
                .send(ToManager::Flushed { upto })
                .map_err(|_| stopped())?;
        }
        Ok(done)
    }

    fn flush_members(&self) -> Result<TimeNs, DeviceError> {
        let (tx, rx) = unbounded();
        let mut sent = 0;
        for (i, member) in self.members.iter().enumerate() {
            if !self.serving[i] {
                continue;
            }
            sent += 1;
            member
                .send(MemberOp::Submit {
                    member: i,
                    opcode: Opcode::Flush,
                    lba: 0,
                    sectors: 0,
                    data: Vec::new(),
                    tags: None,
                    flags: CommandFlags::default(),
                    read_tags: false,
                    reply: tx.clone(),
                    tag: i,
                })
                .map_err(|_| stopped())?;
        }
        let next = || {
            rx.recv()
                .map_err(|_| stopped())
                .and_then(|r| r.result.map(|d| d.completion.done_ns))
        };
        gather(sent, next, |t| t)
    }

    fn take_running(&self) -> Result<Running<D>, DeviceError> {
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(stopped)
    }

    /// The orderly end of a served volume: flushes, stops every thread and flushes the
    /// members once more, since the daemon may have trimmed copies the first flush made
    /// redundant, and a recovery after an orderly stop does not check the copies. Hands back
    /// the single-owner engine.
    pub fn stop_flushed(&self) -> Result<ScalaAfa<D>, DeviceError> {
        self.flush()?;
        let mut v = self.stop()?;
        v.submit(self.clock.now_ns(), &Command::flush(), ReadBuffers::none())?;
        Ok(v)
    }

    /// Stops the engine once every request sent so far is done and hands back the single-
    /// owner engine, with its tables whole (the daemon has handled every report).
    pub fn stop(&self) -> Result<ScalaAfa<D>, DeviceError> {
        let run = self.take_running()?;
        for j in &self.jobs {
            let _ = j.send(IoJob::Stop);
        }
        let ends: Vec<IoThreadEnd> = run
            .io
            .into_iter()
            .map(|h| h.join().map_err(|_| panicked("an I/O thread")))
            .collect::<Result<_, _>>()?;
        let _ = run.to_daemon.send(ToManager::Stop { orderly: true });
        let mut v = run.daemon.join().map_err(|_| panicked("the daemon"))?;
        let devices = take_members(&run.members, run.idle, run.idle_stop)?;
        drop(run.controls);
        let remote = v.remote.take();
        let threads = self.g.threads;
        let mut ends = ends;
        // GC moves the threads had not taken when they ended, in the order they were made:
        // those still in a thread's channel, then those the daemon held back at the stop.
        let late = remote
            .iter()
            .flat_map(|r| r.moved.iter().map(|mv| (mv.chunk, mv.from, mv.to)));
        let queued: Vec<(u32, u32, u32)> = ends
            .iter()
            .flat_map(|e| e.control.try_iter())
            .filter_map(|c| match c {
                Control::Moved(mv) => Some((mv.chunk, mv.from, mv.to)),
                _ => None,
            })
            .collect();
        for (chunk, from, to) in queued.into_iter().chain(late) {
            let e = &mut ends[chunk as usize % threads].amt[chunk as usize / threads];
            if *e == from {
                *e = to;
            }
        }
        for (t, end) in ends.into_iter().enumerate() {
            // The daemon's tables come from the threads' reports, so they must agree.
            let mine = (t..v.amt.len()).step_by(threads);
            if end.open != v.open[t] || mine.zip(&end.amt).any(|(c, &a)| v.amt[c] != a) {
                return Err(DeviceError::Medium(format!(
                    "I/O thread {t}'s AMT disagrees with the daemon's at the stop"
                )));
            }
            v.threads[t] = end.heroes;
            v.stats.replica_reads += end.replica_reads;
            v.stats.read_errors_corrected += end.reads_corrected;
            v.stats.degraded_reads += end.degraded_reads;
        }
        if let Some(r) = &remote {
            v.clock = r.clock.load(Ordering::SeqCst);
            v.flush_clock = r.flush_clock();
        }
        let (mut v, _, _) = v.swap_devices(devices);
        v.spares = run.spares;
        match remote.and_then(|r| r.error) {
            Some(e) => Err(e),
            None => Ok(v),
        }
    }

    /// Stops every thread at once, as a crash would: queued requests fail, the daemon's
    /// tables are dropped, and the member devices are handed back as they are (for
    /// recovery tests).
    pub fn crash(&self) -> Result<Vec<D>, DeviceError> {
        let run = self.take_running()?;
        for c in &run.controls {
            let _ = c.send(Control::Stop);
        }
        for h in run.io {
            h.join().map_err(|_| panicked("an I/O thread"))?;
        }
        let _ = run.to_daemon.send(ToManager::Stop { orderly: false });
        run.daemon.join().map_err(|_| panicked("the daemon"))?;
        take_members(&run.members, run.idle, run.idle_stop)
    }
}

impl<D: BlockDevice + Send + 'static> Drop for ThreadedScalaAfa<D> {
    /// A volume dropped without a stop still ends its threads, as an orderly stop would:
    /// the daemon and the I/O threads hold channels to each other and would otherwise wait
    /// forever.
    fn drop(&mut self) {
        let running = self.running.get_mut().map(|r| r.is_some());
        if running.unwrap_or(true) {
            let _ = self.stop();
        }
    }
}

/// Ends the idle thread and takes the member devices back, in member order. Every actor
/// that could command them has ended; a command that comes later fails.
fn take_members<D: BlockDevice + Send>(
    members: &[Arc<SharedMember<D>>],
    idle: JoinHandle<()>,
    idle_stop: Sender<()>,
) -> Result<Vec<D>, DeviceError> {
    let _ = idle_stop.send(());
    idle.join().map_err(|_| panicked("the idle thread"))?;
    members
        .iter()
        .map(|m| {
            m.take()
                .ok_or_else(|| DeviceError::Medium("a member device was taken twice".into()))
        })
        .collect()
}

fn panicked(who: &str) -> DeviceError {
    DeviceError::Medium(format!("{who} of the ScalaAFA engine panicked"))
}
