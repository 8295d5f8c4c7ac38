//! The engine thread: it owns the volume, applies every request to it in arrival order and
//! sends each reply when the wall clock reaches the model's completion time (paced) or at
//! once (unpaced). Connections talk to it over channels only.
//!
//! Time: the device lives in virtual nanoseconds. Paced, virtual time is the wall-clock time
//! since the engine started, so a command the model completes at `done_ns` is answered at
//! `start + done_ns` (as FEMU does). Unpaced, virtual time is the wall clock plus a skew
//! that grows whenever the host outruns the model and the device's queue is full: the
//! clock then jumps to the earliest completion, so the model never sees more than its
//! queue depth outstanding, while the reply goes out at once.
//!
//! Unpaced, a reply needs nothing from the engine but the applied request, so there is no
//! engine thread to hand requests to: the engine sits behind a mutex and the connection
//! thread that read a burst applies it itself and writes the replies (as nbdkit's worker
//! threads do). A hand-over costs two thread switches per burst, and on a loaded host each
//! switch waits for a core; that made unpaced serving several times slower than nbdkit
//! whenever anything else ran. Only idle-time device work (`background`) runs on a thread
//! of its own, once the volume has been quiet for `IDLE_QUIET_NS`.
//!
//! A volume that does its own concurrency (a [`crate::SharedVolume`]) has no engine that
//! owns it: see the `shared` module for how it is applied and paced.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use afa_sim::TimeNs;
use afa_ssd::{BlockDevice, Command, DeviceError, DeviceInfo, Opcode, ReadBuffers};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::proto::{Request, EINVAL, EIO, ENOSPC, EPERM, ESHUTDOWN};
use crate::queued::{queueable, Finished, QueuedJobs};
use crate::shared::{SharedEngine, SharedHandle, SharedVolume};
use crate::ServeError;

/// How replies are timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// A reply leaves no earlier than the model's completion time, mapped to wall clock.
    Model,
    /// Replies leave as soon as the command is applied; the model's clock runs ahead.
    None,
}

/// One request for the engine, with where its reply goes.
#[derive(Debug)]
pub struct Job {
    pub handle: u64,
    pub request: Request,
    /// A write's payload; for a read, a buffer to read into (its contents are
    /// overwritten). Buffers circulate between a connection and the engine, so steady
    /// traffic allocates nothing.
    pub data: Vec<u8>,
    /// Where the reply goes; replies travel in batches, one channel message per burst.
    pub reply_to: Sender<Vec<Reply>>,
    /// Flow-control credits the connection took for this request; they travel back with
    /// the reply so the connection's writer can return them.
    pub credits: u32,
}

/// A failed request: the errno for the wire and a message for structured replies and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub errno: u32,
    pub message: String,
}

/// The answer to one request.
#[derive(Debug)]
pub struct Reply {
    pub handle: u64,
    /// For a read: its offset, so a structured reply can say where the data belongs.
    pub read_offset: Option<u64>,
    /// A block status reply: `data` holds its descriptors in wire order.
    pub block_status: bool,
    pub result: Result<(), Failure>,
    /// A successful read's data. Otherwise the request's buffer, handed back so the
    /// connection can reuse it (it is never sent).
    pub data: Vec<u8>,
    pub credits: u32,
}

enum Message {
    /// A connection's burst of requests, in arrival order: one message (and at most one
    /// wake-up of the engine) per burst rather than per request.
    Jobs(Vec<Job>),
    Shutdown,
}

/// Counters the engine reports when it stops.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub requests: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub errors: u64,
    /// Calls of the device's `background` while idle.
    pub background_calls: u64,
}

/// Applies byte-addressed requests to a sector-addressed device: splits them at the
/// device's maximum transfer and reads and rewrites partial sectors (read-modify-write),
/// which is atomic because one thread owns the device.
#[derive(Debug)]
pub struct Executor<D: BlockDevice + ?Sized> {
    info: DeviceInfo,
    /// The largest command sent to the device, in sectors.
    chunk_sectors: u32,
    device: Box<D>,
}

/// Chunk size for WRITE_ZEROES with NO_HOLE, so a 4 GiB request does not allocate 4 GiB.
const ZERO_CHUNK_BYTES: u64 = 1 << 20;

impl<D: BlockDevice + ?Sized> Executor<D> {
    /// Wraps a device; serve mode needs real bytes, so the device must store the whole
    /// sector (payload `full`).
    pub fn new(device: Box<D>) -> Result<Self, ServeError> {
        let info = device.info();
        if info.payload_unit_bytes != info.sector_bytes {
            return Err(ServeError::PayloadNotFull {
                unit_bytes: info.payload_unit_bytes,
                sector_bytes: info.sector_bytes,
            });
        }
        if info.sector_bytes == 0 || info.capacity_sectors == 0 {
            return Err(ServeError::EmptyDevice);
        }
        // Keep each command at most 1 MiB of payload (and at most the device's limit):
        // large enough to amortise, small enough that a partial-sector buffer stays small.
        let chunk_sectors =
            ((1u32 << 20) / info.sector_bytes).clamp(1, info.max_transfer_sectors.max(1));
        Ok(Self {
            info,
            chunk_sectors,
            device,
        })
    }

    pub fn info(&self) -> DeviceInfo {
        self.info
    }

    pub fn size_bytes(&self) -> u64 {
        self.info.capacity_sectors * self.info.sector_bytes as u64
    }

    pub fn device_mut(&mut self) -> &mut D {
        &mut self.device
    }

    /// A failed device command as the client's errno and the log's message. A device out
    /// of space also names its flash's faults, as `afa run` does, so the operator can tell
    /// a full volume from one whose grown bad blocks took its spare.
    pub(crate) fn failure(&self, op: Opcode, place: Place, e: &DeviceError) -> Failure {
        let mut failure = device_failure(op, place, e);
        if failure.errno == ENOSPC {
            failure.message = self.device.media_faults().explain(&failure.message);
        }
        failure
    }

    /// The largest command sent to the device, in sectors.
    pub(crate) fn chunk_sectors(&self) -> u32 {
        self.chunk_sectors
    }

    pub fn background(&mut self, now_ns: TimeNs) -> Option<TimeNs> {
        self.device.background(now_ns)
    }

    /// Applies one request at `now_ns`; returns the completion time and a read's data.
    pub fn execute(
        &mut self,
        now_ns: TimeNs,
        request: &Request,
        data: &[u8],
    ) -> Result<(TimeNs, Vec<u8>), Failure> {
        let mut buf = Vec::new();
        let done = self.execute_into(now_ns, request, &mut buf, Some(data))?;
        if !matches!(request, Request::Read { .. } | Request::BlockStatus { .. }) {
            buf.clear();
        }
        Ok((done, buf))
    }

    /// Applies one request at `now_ns` and returns its completion time. A write's payload
    /// is `payload`, or `buf` when there is none; a read's data replaces `buf`'s contents.
    pub fn execute_into(
        &mut self,
        now_ns: TimeNs,
        request: &Request,
        buf: &mut Vec<u8>,
        payload: Option<&[u8]>,
    ) -> Result<TimeNs, Failure> {
        let data: &[u8] = payload.unwrap_or(buf);
        check_request(request, self.size_bytes(), data.len())?;
        match *request {
            Request::Read { offset, length } => {
                size_read_buffer(buf, length);
                self.read_bytes(now_ns, offset, buf)
            }
            // FUA goes down with the write: the seam's contract is that such a write
            // completes only once it is durable, which every device keeps for the data it
            // wrote (an SSD programs those pages, a file is synced), so the rest of the
            // volume's buffered writes need not be flushed with it.
            Request::Write { offset, fua, .. } => self.write_bytes(now_ns, offset, data, fua),
            Request::Flush => self.flush(now_ns),
            Request::Trim {
                offset,
                length,
                fua,
            } => {
                // TRIM is advisory: only whole sectors inside the range are deallocated,
                // the partial sectors at its edges are left as they are.
                let mut done = self.trim_whole_sectors(now_ns, offset, length)?;
                if fua {
                    done = done.max(self.flush(now_ns)?);
                }
                Ok(done)
            }
            Request::WriteZeroes {
                offset,
                length,
                fua,
                no_hole,
            } => {
                if no_hole || !self.device.trim_is_durable() {
                    // Where a power loss could undo a trim, the zeroes are written.
                    self.write_zeroes(now_ns, offset, length as u64, fua)
                } else {
                    // Deallocated sectors read back as zeroes (the BlockDevice contract),
                    // so whole sectors are trimmed and only the partial edges are written.
                    self.zero_by_trim(now_ns, offset, length, fua)
                }
            }
            Request::BlockStatus {
                offset,
                length,
                req_one,
            } => {
                let sector = self.sector();
                let first = offset / sector;
                let end = (offset + length as u64).div_ceil(sector);
                let runs = self.device.allocation(first, (end - first) as u32);
                *buf = block_status_descriptors(runs.as_deref(), offset, length, sector, req_one);
                Ok(now_ns)
            }
            // `check_request` has refused it already; answering again keeps a server
            // thread from ever panicking over a request.
            Request::Disconnect => Err(disconnect_failure()),
        }
    }

    fn sector(&self) -> u64 {
        self.info.sector_bytes as u64
    }

    fn submit(
        &mut self,
        now_ns: TimeNs,
        cmd: &Command<'_>,
        out: ReadBuffers<'_>,
    ) -> Result<TimeNs, Failure> {
        self.device
            .submit(now_ns, cmd, out)
            .map(|c| c.done_ns)
            .map_err(|e| self.failure(cmd.opcode, Place::Sector(cmd.lba), &e))
    }

    /// Reads whole sectors `lba..lba + buf.len() / sector` in device-sized chunks.
    fn read_sectors(
        &mut self,
        now_ns: TimeNs,
        lba: u64,
        buf: &mut [u8],
    ) -> Result<TimeNs, Failure> {
        let sector = self.sector() as usize;
        let mut done = now_ns;
        let chunk_bytes = self.chunk_sectors as usize * sector;
        for (i, piece) in buf.chunks_mut(chunk_bytes).enumerate() {
            let at = lba + (i * chunk_bytes / sector) as u64;
            let n = (piece.len() / sector) as u32;
            let t = self.submit(
                now_ns,
                &Command::read(at, n),
                ReadBuffers {
                    data: piece,
                    tags: None,
                },
            )?;
            done = done.max(t);
        }
        Ok(done)
    }

    /// Writes whole sectors starting at `lba` in device-sized chunks, each with force unit
    /// access when `fua` is set.
    fn write_sectors(
        &mut self,
        now_ns: TimeNs,
        lba: u64,
        data: &[u8],
        fua: bool,
    ) -> Result<TimeNs, Failure> {
        let sector = self.sector() as usize;
        let mut done = now_ns;
        let chunk_bytes = self.chunk_sectors as usize * sector;
        for (i, piece) in data.chunks(chunk_bytes).enumerate() {
            let at = lba + (i * chunk_bytes / sector) as u64;
            let n = (piece.len() / sector) as u32;
            let mut cmd = Command::write(at, n, piece);
            cmd.flags.fua = fua;
            let t = self.submit(now_ns, &cmd, ReadBuffers::none())?;
            done = done.max(t);
        }
        Ok(done)
    }

    fn read_bytes(
        &mut self,
        now_ns: TimeNs,
        offset: u64,
        out: &mut [u8],
    ) -> Result<TimeNs, Failure> {
        let sector = self.sector();
        let end = offset + out.len() as u64;
        if offset % sector == 0 && end % sector == 0 {
            return self.read_sectors(now_ns, offset / sector, out);
        }
        let first = offset / sector;
        let last = end.div_ceil(sector);
        let mut whole = vec![0u8; ((last - first) * sector) as usize];
        let done = self.read_sectors(now_ns, first, &mut whole)?;
        let skip = (offset - first * sector) as usize;
        out.copy_from_slice(&whole[skip..skip + out.len()]);
        Ok(done)
    }

    fn write_bytes(
        &mut self,
        now_ns: TimeNs,
        offset: u64,
        data: &[u8],
        fua: bool,
    ) -> Result<TimeNs, Failure> {
        let sector = self.sector();
        let end = offset + data.len() as u64;
        if offset % sector == 0 && end % sector == 0 {
            return self.write_sectors(now_ns, offset / sector, data, fua);
        }
        // Read-modify-write of the partial sectors at the edges.
        let first = offset / sector;
        let last = end.div_ceil(sector);
        let mut whole = vec![0u8; ((last - first) * sector) as usize];
        let s = sector as usize;
        let mut done = now_ns;
        if offset % sector != 0 {
            done = done.max(self.read_sectors(now_ns, first, &mut whole[..s])?);
        }
        if end % sector != 0 && (last - 1 > first || offset % sector == 0) {
            let tail = whole.len() - s;
            done = done.max(self.read_sectors(now_ns, last - 1, &mut whole[tail..])?);
        }
        let skip = (offset - first * sector) as usize;
        whole[skip..skip + data.len()].copy_from_slice(data);
        // The write is submitted at the same instant as its reads: devices take commands
        // in time order, and the model's queues serialise what conflicts anyway.
        Ok(done.max(self.write_sectors(now_ns, first, &whole, fua)?))
    }

    fn flush(&mut self, now_ns: TimeNs) -> Result<TimeNs, Failure> {
        self.submit(now_ns, &Command::flush(), ReadBuffers::none())
    }

    /// Trims the whole sectors inside `offset..offset + length`.
    fn trim_whole_sectors(
        &mut self,
        now_ns: TimeNs,
        offset: u64,
        length: u32,
    ) -> Result<TimeNs, Failure> {
        let sector = self.sector();
        let first = offset.div_ceil(sector);
        let last = (offset + length as u64) / sector;
        if first >= last {
            return Ok(now_ns);
        }
        // A trim carries no payload, so it is not split at the transfer limit; its sector
        // count fits in u32 because the request length does.
        let cmd = Command::trim(first, (last - first) as u32);
        self.submit(now_ns, &cmd, ReadBuffers::none())
    }

    /// Zeroes `offset..offset + length` by trimming its whole sectors and writing its
    /// partial edges. With `fua` the edges go with force unit access and the trim is
    /// followed by a flush, since the seam's FUA flag is a write's.
    fn zero_by_trim(
        &mut self,
        now_ns: TimeNs,
        offset: u64,
        length: u32,
        fua: bool,
    ) -> Result<TimeNs, Failure> {
        let sector = self.sector();
        let end = offset + length as u64;
        let first = offset.div_ceil(sector) * sector;
        let last = end / sector * sector;
        if first >= last {
            return self.write_zeroes(now_ns, offset, length as u64, fua);
        }
        let mut done = self.trim_whole_sectors(now_ns, offset, length)?;
        if offset < first {
            done = done.max(self.write_zeroes(now_ns, offset, first - offset, fua)?);
        }
        if last < end {
            done = done.max(self.write_zeroes(now_ns, last, end - last, fua)?);
        }
        if fua {
            done = done.max(self.flush(now_ns)?);
        }
        Ok(done)
    }

    fn write_zeroes(
        &mut self,
        now_ns: TimeNs,
        offset: u64,
        length: u64,
        fua: bool,
    ) -> Result<TimeNs, Failure> {
        write_zeroes_in_pieces(now_ns, offset, length, |at, zeros| {
            self.write_bytes(now_ns, at, zeros, fua)
        })
    }
}

/// Writes `length` zero bytes from `offset` with `write`, in pieces of at most
/// `ZERO_CHUNK_BYTES` from one zeroed buffer, so a 4 GiB request does not allocate 4 GiB.
/// Returns the latest completion time, and `now_ns` when there is nothing to write.
pub(crate) fn write_zeroes_in_pieces(
    now_ns: TimeNs,
    offset: u64,
    length: u64,
    mut write: impl FnMut(u64, &[u8]) -> Result<TimeNs, Failure>,
) -> Result<TimeNs, Failure> {
    let zeros = vec![0u8; length.min(ZERO_CHUNK_BYTES) as usize];
    let mut done = now_ns;
    let mut at = offset;
    while at < offset + length {
        let n = (offset + length - at).min(ZERO_CHUNK_BYTES);
        done = done.max(write(at, &zeros[..n as usize])?);
        at += n;
    }
    Ok(done)
}

/// Checks what a request asks against an export of `size_bytes`: its range must lie
/// inside the export and a write must come with exactly its payload. Devices and shared
/// volumes are checked by this one function, so both answer the same requests with the
/// same errors.
pub(crate) fn check_request(
    request: &Request,
    size_bytes: u64,
    payload_bytes: usize,
) -> Result<(), Failure> {
    let in_range = |offset: u64, length: u32| {
        offset
            .checked_add(length as u64)
            .is_some_and(|end| end <= size_bytes)
    };
    let (what, offset, length) = match *request {
        Request::Read { offset, length } => ("read", offset, length),
        Request::Write { offset, length, .. } => ("write", offset, length),
        Request::Trim { offset, length, .. } => ("trim", offset, length),
        Request::WriteZeroes { offset, length, .. } => ("write-zeroes", offset, length),
        Request::BlockStatus { offset, length, .. } => ("block status", offset, length),
        Request::Flush => return Ok(()),
        Request::Disconnect => return Err(disconnect_failure()),
    };
    if !in_range(offset, length) {
        return Err(out_of_range(what, offset, length, size_bytes));
    }
    if matches!(request, Request::Write { .. }) && payload_bytes != length as usize {
        return Err(Failure {
            errno: EINVAL,
            message: format!("write of {length} bytes came with {payload_bytes} payload bytes"),
        });
    }
    Ok(())
}

/// The descriptors of a `base:allocation` block status reply for `length` bytes from
/// `offset`: each a length in bytes and the flags (0 for data; HOLE and ZERO for a range
/// the device holds nothing for), in wire order. `runs` are the device's allocation runs
/// in sectors of `sector_bytes`, from the sector holding `offset`; `None` (a device that
/// cannot tell) reports the whole range as data. With `req_one`, only the first extent.
pub(crate) fn block_status_descriptors(
    runs: Option<&[(u32, bool)]>,
    offset: u64,
    length: u32,
    sector_bytes: u64,
    req_one: bool,
) -> Vec<u8> {
    let end = offset + length as u64;
    let mut extents: Vec<(u64, u32)> = Vec::new();
    let mut at = offset / sector_bytes * sector_bytes;
    for &(sectors, allocated) in runs.unwrap_or(&[]) {
        let run_end = (at + sectors as u64 * sector_bytes).min(end);
        let from = at.max(offset);
        at = run_end;
        if run_end <= from {
            continue;
        }
        let flags = if allocated {
            0
        } else {
            crate::proto::STATE_HOLE | crate::proto::STATE_ZERO
        };
        match extents.last_mut() {
            Some((len, f)) if *f == flags => *len += run_end - from,
            _ => extents.push((run_end - from, flags)),
        }
    }
    // Whatever the device did not describe counts as data.
    let described: u64 = extents.iter().map(|&(len, _)| len).sum();
    if described < length as u64 {
        match extents.last_mut() {
            Some((len, 0)) => *len += length as u64 - described,
            _ => extents.push((length as u64 - described, 0)),
        }
    }
    if req_one {
        extents.truncate(1);
    }
    let mut out = Vec::with_capacity(extents.len() * 8);
    for (len, flags) in extents {
        out.extend_from_slice(&(len as u32).to_be_bytes());
        out.extend_from_slice(&flags.to_be_bytes());
    }
    out
}

/// The answer to NBD_CMD_DISC, should one ever reach a volume: it ends the connection and
/// has no reply of its own.
pub(crate) fn disconnect_failure() -> Failure {
    Failure {
        errno: EINVAL,
        message: "NBD_CMD_DISC has no reply".into(),
    }
}

/// Cuts or grows a recycled buffer to a read's `length` without zeroing what the read
/// overwrites anyway.
pub(crate) fn size_read_buffer(buf: &mut Vec<u8>, length: u32) {
    let length = length as usize;
    if buf.len() >= length {
        buf.truncate(length);
    } else {
        buf.resize(length, 0);
    }
}

fn out_of_range(what: &str, offset: u64, length: u32, size: u64) -> Failure {
    Failure {
        errno: EINVAL,
        message: format!(
            "{what} of {length} bytes at offset {offset} ends past the export's {size} bytes"
        ),
    }
}

/// Where a failed command was aimed, for its message: a device counts in sectors, a
/// shared volume in bytes, and a flush of a volume has no place at all.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Place {
    Sector(u64),
    Byte(u64),
    Whole,
}

/// Maps a device's or a volume's error onto the protocol's errno values, keeping its
/// message, so both kinds of volume fail a request with the same errno.
pub(crate) fn device_failure(op: Opcode, place: Place, e: &DeviceError) -> Failure {
    let errno = match e {
        DeviceError::OutOfRange { .. } | DeviceError::TooLarge { .. } => EINVAL,
        DeviceError::NoSpace { .. } | DeviceError::VolumeFull(_) => ENOSPC,
        DeviceError::Unsupported(_) => EINVAL,
        // The protocol's answer to a write on a read-only export.
        DeviceError::ReadOnly(_) => EPERM,
        DeviceError::Failed
        | DeviceError::Uncorrectable { .. }
        | DeviceError::Medium(_)
        | DeviceError::PayloadLength { .. }
        | DeviceError::TagLength { .. } => EIO,
    };
    let op = match op {
        Opcode::Read => "read",
        Opcode::Write => "write",
        Opcode::Trim => "trim",
        Opcode::Flush => "flush",
    };
    let message = match place {
        Place::Sector(lba) => format!("device {op} at sector {lba} failed: {e}"),
        Place::Byte(offset) => format!("volume {op} at byte {offset} failed: {e}"),
        Place::Whole => format!("volume {op} failed: {e}"),
    };
    Failure { errno, message }
}

/// A reply waiting for its wall-clock time, ordered by (due time, arrival sequence).
pub(crate) struct Due {
    pub(crate) due_ns: TimeNs,
    pub(crate) seq: u64,
    pub(crate) reply: Reply,
    pub(crate) reply_to: Sender<Vec<Reply>>,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        (self.due_ns, self.seq) == (other.due_ns, other.seq)
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Due {
    // Reversed, so that the max-heap pops the earliest reply first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.due_ns, other.seq).cmp(&(self.due_ns, self.seq))
    }
}

/// Further bursts taken without blocking before the replies go out.
const MAX_BURSTS_PER_ROUND: usize = 64;

/// The shortest idle wait between `background` calls, so a device that keeps asking to be
/// called "now" cannot spin the engine thread.
const MIN_BACKGROUND_GAP_NS: u64 = 100_000;

struct Engine<D: BlockDevice + ?Sized> {
    exec: Executor<D>,
    pace: Pace,
    start: Instant,
    /// Unpaced only: how far virtual time runs ahead of the wall clock.
    skew_ns: u64,
    last_now_ns: TimeNs,
    /// Paced: replies not yet due. Their count is the device's outstanding commands.
    pending: BinaryHeap<Due>,
    /// Unpaced: completion times of commands the model still counts as outstanding.
    outstanding: BinaryHeap<std::cmp::Reverse<TimeNs>>,
    /// Paced: jobs held back because the device's queue is full, or because they must be
    /// applied whole while requests are under way on its queued interface.
    waiting: VecDeque<Job>,
    /// Paced, over a device with a queued interface: the requests under way on it
    /// (`queued` module); `None` for every other device.
    queued: Option<QueuedJobs>,
    seq: u64,
    queue_depth: usize,
    /// Virtual time at which the device asked for its next idle call.
    background_at_ns: Option<TimeNs>,
    /// Set by every request: the device gets an idle call once the engine goes quiet.
    background_armed: bool,
    /// Replies ready to go, grouped by connection, sent together after each burst so a
    /// connection's writer wakes once per burst.
    outbox: Outbox,
    stats: EngineStats,
}

impl<D: BlockDevice + ?Sized> Engine<D> {
    fn wall_ns(&self) -> u64 {
        self.start.elapsed().as_nanos().min(u64::MAX as u128) as u64
    }

    fn now_ns(&mut self) -> TimeNs {
        let now = (self.wall_ns() + self.skew_ns).max(self.last_now_ns);
        self.last_now_ns = now;
        now
    }

    /// The wall-clock instant that corresponds to virtual time `t`.
    fn instant_of(&self, t: TimeNs) -> Instant {
        self.start + Duration::from_nanos(t.saturating_sub(self.skew_ns))
    }

    fn run(mut self, rx: Receiver<Message>) -> EngineStats {
        let mut open = true;
        while open || self.in_flight() > 0 || !self.waiting.is_empty() {
            self.poll_queued();
            self.release_due();
            self.admit_waiting();
            let idle = self.in_flight() == 0 && self.waiting.is_empty() && rx.is_empty();
            if idle && open {
                self.idle_work();
            }
            let next_reply = self.pending.peek().map(|d| self.instant_of(d.due_ns));
            let next_device = self.next_queued_event_ns().map(|t| self.instant_of(t));
            let next_background = self
                .background_at_ns
                .filter(|_| self.in_flight() == 0 && self.waiting.is_empty())
                .map(|t| self.instant_of(t));
            let deadline = [next_reply, next_device, next_background]
                .into_iter()
                .flatten()
                .min();
            if !open {
                // Shutting down: answer what is left without waiting for the wall clock.
                self.drain_now();
                continue;
            }
            let message = match deadline {
                Some(d) => match rx.recv_deadline(d) {
                    Ok(m) => Some(m),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => Some(Message::Shutdown),
                },
                None => Some(rx.recv().unwrap_or(Message::Shutdown)),
            };
            match message {
                Some(Message::Jobs(jobs)) => {
                    jobs.into_iter().for_each(|j| self.accept(j));
                    // Take whatever else has arrived meanwhile before answering, so that
                    // replies to concurrent bursts leave together.
                    for _ in 0..MAX_BURSTS_PER_ROUND {
                        match rx.try_recv() {
                            Ok(Message::Jobs(jobs)) => {
                                jobs.into_iter().for_each(|j| self.accept(j))
                            }
                            Ok(Message::Shutdown) => {
                                open = false;
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                }
                Some(Message::Shutdown) => open = false,
                None => {}
            }
            self.send_outbox();
        }
        self.send_outbox();
        self.final_flush();
        self.stats
    }

    fn accept(&mut self, job: Job) {
        if self.in_flight() >= self.queue_depth || !self.waiting.is_empty() || self.held(&job) {
            self.waiting.push_back(job)
        } else {
            self.start_job(job)
        }
    }

    fn admit_waiting(&mut self) {
        while self.in_flight() < self.queue_depth {
            if self.waiting.front().is_some_and(|job| self.held(job)) {
                return;
            }
            let Some(job) = self.waiting.pop_front() else {
                return;
            };
            self.start_job(job);
        }
    }

    /// Requests the device holds: those whose replies are not yet due and those under way
    /// on its queued interface. Their count is bounded by the device's queue depth.
    fn in_flight(&self) -> usize {
        self.pending.len() + self.queued.as_ref().map_or(0, QueuedJobs::len)
    }

    /// Whether `job` must wait: a request applied whole (`queued` module) goes to the
    /// device's `submit`, which would run past the commands under way on its queued
    /// interface, so it waits until they have completed.
    fn held(&self, job: &Job) -> bool {
        self.queued.as_ref().is_some_and(|q| {
            !q.is_empty() && !queueable(&job.request, self.exec.info().sector_bytes as u64)
        })
    }

    /// Applies a job on the engine thread, which runs only paced engines (unpaced ones are
    /// applied inline by the connections): the reply waits for its completion time. Over a
    /// queued interface, a request of whole commands is started on it instead.
    fn start_job(&mut self, job: Job) {
        debug_assert_eq!(
            self.pace,
            Pace::Model,
            "the engine thread runs paced engines only"
        );
        let sector_bytes = self.exec.info().sector_bytes as u64;
        if let Some(mut queued) = self.queued.take() {
            if queueable(&job.request, sector_bytes) {
                self.background_armed = true;
                self.background_at_ns = None;
                self.stats.requests += 1;
                let now = self.now_ns();
                let answered = queued.start(&mut self.exec, now, job);
                self.queued = Some(queued);
                if let Some(done) = answered {
                    self.answer_queued(done);
                }
                return;
            }
            self.queued = Some(queued);
        }
        let (done_ns, reply) = self.apply(job.handle, job.request, job.data, None, job.credits);
        self.seq += 1;
        self.pending.push(Due {
            due_ns: done_ns,
            seq: self.seq,
            reply,
            reply_to: job.reply_to,
        });
    }

    /// Applies one request to the device now and returns its completion time in virtual
    /// time and its reply.
    fn apply(
        &mut self,
        handle: u64,
        request: Request,
        mut data: Vec<u8>,
        payload: Option<&[u8]>,
        credits: u32,
    ) -> (TimeNs, Reply) {
        self.background_armed = true;
        self.background_at_ns = None;
        let mut now = self.now_ns();
        if self.pace == Pace::None {
            while self.outstanding.peek().is_some_and(|r| r.0 <= now) {
                self.outstanding.pop();
            }
            if self.outstanding.len() >= self.queue_depth {
                // The host outran the model: jump virtual time to the earliest completion
                // so the device never has more than its queue depth outstanding.
                if let Some(std::cmp::Reverse(t)) = self.outstanding.pop() {
                    if t > now {
                        self.skew_ns += t - now;
                        now = self.now_ns();
                    }
                }
            }
        }
        self.stats.requests += 1;
        let outcome = self.exec.execute_into(now, &request, &mut data, payload);
        let read_offset = match request {
            Request::Read { offset, .. } => Some(offset),
            _ => None,
        };
        let (done_ns, result) = match outcome {
            Ok(done) => {
                match request {
                    Request::Read { length, .. } => self.stats.read_bytes += length as u64,
                    Request::Write { length, .. } => self.stats.write_bytes += length as u64,
                    _ => {}
                }
                (done, Ok(()))
            }
            Err(f) => {
                crate::log_request_failure(self.stats.errors, &f);
                self.stats.errors += 1;
                (now, Err(f))
            }
        };
        if self.pace == Pace::None {
            self.outstanding.push(std::cmp::Reverse(done_ns));
        }
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

    /// Makes what the device buffers durable before the engine goes away, once every
    /// command it has is complete in virtual time (the flush must not exceed the device's
    /// queue depth either).
    fn final_flush(&mut self) {
        if let Some(latest) = self.outstanding.iter().map(|r| r.0).max() {
            self.jump_to(latest);
        }
        let now = self.now_ns();
        if let Err(f) = self.exec.flush(now) {
            crate::log(&format!("final flush failed: {}", f.message));
        }
    }

    /// Runs the device's queued interface to the present and answers the requests it
    /// completed (their replies are due: they completed by now).
    fn poll_queued(&mut self) {
        let Some(mut queued) = self.queued.take() else {
            return;
        };
        let now = self.now_ns();
        let finished = queued.advance(&mut self.exec, now);
        self.queued = Some(queued);
        for done in finished {
            self.answer_queued(done);
        }
    }

    /// When the device's queued interface next has something to do while requests are
    /// under way on it.
    fn next_queued_event_ns(&mut self) -> Option<TimeNs> {
        let queued = self.queued.as_ref()?;
        queued.next_event_ns(&mut self.exec)
    }

    /// A request of the queued interface is answered: its reply waits for its time with
    /// the others (it is due by now unless it failed before reaching the device).
    fn answer_queued(&mut self, done: Finished) {
        self.stats.read_bytes += done.read_bytes;
        self.stats.write_bytes += done.write_bytes;
        if let Err(f) = &done.reply.result {
            crate::log_request_failure(self.stats.errors, f);
            self.stats.errors += 1;
        }
        self.seq += 1;
        self.pending.push(Due {
            due_ns: done.done_ns,
            seq: self.seq,
            reply: done.reply,
            reply_to: done.reply_to,
        });
    }

    fn release_due(&mut self) {
        let now = self.now_ns();
        while self.pending.peek().is_some_and(|d| d.due_ns <= now) {
            if let Some(d) = self.pending.pop() {
                self.post(d.reply_to, d.reply);
            }
        }
        self.send_outbox();
    }

    /// Shutting down: answers everything without waiting for the wall clock. Virtual time
    /// jumps from completion to completion instead, so the device still never has more
    /// than its queue depth outstanding.
    fn drain_now(&mut self) {
        loop {
            self.admit_waiting();
            if self.in_flight() == 0 {
                // Nothing under way, so nothing held back: `admit_waiting` took every job.
                break;
            }
            let next_reply = self.pending.peek().map(|d| d.due_ns);
            let next_device = self.next_queued_event_ns();
            match next_reply.into_iter().chain(next_device).min() {
                Some(t) => self.jump_to(t),
                None => {
                    // Requests under way on a device with nothing more to do would never
                    // complete: they fail rather than hold the stop up forever.
                    let now = self.now_ns();
                    if let Some(queued) = self.queued.as_mut() {
                        let failed = queued.fail_all(now, crate::queued::STALLED);
                        failed.into_iter().for_each(|done| self.answer_queued(done));
                    }
                }
            }
            self.poll_queued();
            self.release_due();
        }
        self.send_outbox();
    }

    /// Moves virtual time forward to `t` (never back).
    fn jump_to(&mut self, t: TimeNs) {
        let now = self.now_ns();
        if t > now {
            self.skew_ns += t - now;
        }
    }

    /// Queues a reply in the outbox, with the others for the same connection.
    fn post(&mut self, to: Sender<Vec<Reply>>, reply: Reply) {
        post(&mut self.outbox, to, reply);
    }

    fn send_outbox(&mut self) {
        send_outbox(&mut self.outbox);
    }

    /// Gives the device its idle-time work when it asked for it (or after new requests).
    fn idle_work(&mut self) {
        let now = self.now_ns();
        let due = self.background_at_ns.is_some_and(|t| t <= now);
        if !(self.background_armed || due) {
            return;
        }
        self.background_armed = false;
        self.stats.background_calls += 1;
        self.background_at_ns = self
            .exec
            .background(now)
            .map(|t| t.max(now + MIN_BACKGROUND_GAP_NS));
    }
}

/// Replies ready to go, grouped by connection, so a connection's writer wakes once per
/// group rather than once per reply.
pub(crate) type Outbox = Vec<(Sender<Vec<Reply>>, Vec<Reply>)>;

/// Queues a reply in the outbox, with the others for the same connection.
pub(crate) fn post(outbox: &mut Outbox, to: Sender<Vec<Reply>>, reply: Reply) {
    match outbox.iter_mut().rev().find(|(s, _)| s.same_channel(&to)) {
        Some((_, replies)) => replies.push(reply),
        None => outbox.push((to, vec![reply])),
    }
}

/// Sends every group in the outbox to its connection and empties it.
pub(crate) fn send_outbox(outbox: &mut Outbox) {
    for (to, replies) in outbox.drain(..) {
        // A connection that went away dropped its receiver; its replies are moot.
        let _ = to.send(replies);
    }
}

/// How long the volume must be quiet before an unpaced engine gives the device its
/// idle-time work: long enough that a client streaming requests never waits behind it.
const IDLE_QUIET_NS: u64 = 1_000_000;

type DynEngine = Engine<dyn BlockDevice + Send>;

/// A request applied on the connection's own thread.
#[derive(Debug)]
pub struct InlineJob {
    pub handle: u64,
    pub request: Request,
    /// Where a read's data goes (a recycled buffer, or an empty one).
    pub buf: Vec<u8>,
    /// A write's payload in the connection's burst buffer (empty for other requests).
    pub payload: std::ops::Range<usize>,
}

/// The unpaced engine, applied by whichever connection thread holds its lock.
struct InlineEngine {
    engine: Mutex<InlineState>,
    start: Instant,
    /// Wall-clock nanoseconds since `start` of the last request, for idle detection.
    last_request_ns: AtomicU64,
    /// The idle thread is parked until a request wakes it.
    parked: AtomicBool,
    wake: Sender<Message>,
}

struct InlineState {
    engine: Box<DynEngine>,
    stopped: bool,
}

impl InlineEngine {
    fn lock(&self) -> MutexGuard<'_, InlineState> {
        // A panic inside the engine leaves it as it was between two requests (every
        // request is applied whole under the lock), so its state is still usable.
        self.engine.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wall_ns(&self) -> u64 {
        self.start.elapsed().as_nanos().min(u64::MAX as u128) as u64
    }

    /// The idle thread: gives the device its background work once the volume has been
    /// quiet for `IDLE_QUIET_NS`, or when the device asked to be called, and parks when
    /// there is nothing to do. It makes the final flush when the engine stops.
    fn idle_loop(self: Arc<Self>, rx: Receiver<Message>) -> EngineStats {
        loop {
            let quiet_at = self.start
                + Duration::from_nanos(
                    self.last_request_ns.load(AtomicOrdering::Acquire) + IDLE_QUIET_NS,
                );
            let due = {
                let state = self.lock();
                let e = &state.engine;
                if e.background_armed {
                    Some(quiet_at)
                } else {
                    e.background_at_ns.map(|t| e.instant_of(t))
                }
            };
            let message = match due {
                Some(at) if at <= Instant::now() => {
                    self.lock().engine.idle_work();
                    continue;
                }
                Some(at) => match rx.recv_deadline(at) {
                    Ok(m) => m,
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => Message::Shutdown,
                },
                None => {
                    self.parked.store(true, AtomicOrdering::Release);
                    // A request may have come between the look above and parking; it saw
                    // `parked` false and sent no wake-up, so look once more.
                    if self.lock().engine.background_armed {
                        self.parked.store(false, AtomicOrdering::Release);
                        continue;
                    }
                    rx.recv().unwrap_or(Message::Shutdown)
                }
            };
            if matches!(message, Message::Shutdown) {
                let mut state = self.lock();
                state.stopped = true;
                state.engine.final_flush();
                return state.engine.stats;
            }
        }
    }

    /// Applies a burst of requests on the calling thread and returns their replies in
    /// order; after the engine has stopped, every request is refused. Writes take their
    /// payload from `burst`, the bytes the burst was read into.
    fn apply(&self, jobs: Vec<InlineJob>, burst: &[u8]) -> Vec<Reply> {
        let replies = {
            let mut state = self.lock();
            if state.stopped {
                jobs.into_iter().map(refuse_inline).collect()
            } else {
                jobs.into_iter()
                    .map(|job| {
                        let payload = burst.get(job.payload).unwrap_or_default();
                        let engine = &mut state.engine;
                        engine
                            .apply(job.handle, job.request, job.buf, Some(payload), 0)
                            .1
                    })
                    .collect()
            }
        };
        self.last_request_ns
            .store(self.wall_ns(), AtomicOrdering::Release);
        if self.parked.swap(false, AtomicOrdering::AcqRel) {
            let _ = self.wake.try_send(Message::Jobs(Vec::new()));
        }
        replies
    }
}

/// The running engine: for a device, its thread and the channel to it (paced) or the
/// locked inline engine and its idle thread (unpaced); for a shared volume, its pacer
/// thread (paced) or no thread at all (unpaced).
#[derive(Debug)]
pub struct EngineHandle {
    kind: HandleKind,
}

#[derive(Debug)]
enum HandleKind {
    /// A device owned by the engine: `tx` reaches the engine thread (paced) or the idle
    /// thread (unpaced), and `thread` is that thread until it is stopped.
    Device {
        tx: Sender<Message>,
        thread: Option<JoinHandle<EngineStats>>,
        inline: Option<Arc<InlineEngine>>,
    },
    /// A volume that does its own concurrency, applied by the connection threads.
    Shared(SharedHandle),
}

/// What connections hold to submit jobs.
#[derive(Debug, Clone)]
pub struct EngineSender {
    kind: SenderKind,
}

#[derive(Debug, Clone)]
enum SenderKind {
    Device {
        tx: Sender<Message>,
        inline: Option<Arc<InlineEngine>>,
    },
    Shared(Arc<SharedEngine>),
}

impl std::fmt::Debug for InlineEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InlineEngine")
    }
}

impl EngineSender {
    /// Queues a burst of jobs for the engine thread; gives them back when the engine has
    /// stopped. A shared volume has no engine thread: the calling thread applies the jobs
    /// itself and hands their replies to the pacer, which sends each at its time.
    pub fn submit(&self, jobs: Vec<Job>) -> Result<(), Vec<Job>> {
        match &self.kind {
            SenderKind::Device { tx, .. } => tx.send(Message::Jobs(jobs)).map_err(|e| match e.0 {
                Message::Jobs(jobs) => jobs,
                Message::Shutdown => Vec::new(),
            }),
            SenderKind::Shared(shared) => shared.submit(jobs),
        }
    }

    /// Whether the volume runs threads of its own (ScalaAFA's I/O threads, daemon and idle
    /// thread), so that applying a burst waits for them rather than working.
    pub fn runs_own_threads(&self) -> bool {
        matches!(self.kind, SenderKind::Shared(_))
    }

    /// Unpaced engines only: applies a burst of jobs on the calling thread, writes taking
    /// their payloads from `burst`, and returns the replies in order. A paced engine, whose
    /// replies wait for the wall clock and so go through [`EngineSender::submit`], refuses
    /// every job (a wiring mistake, answered as a shutdown).
    pub fn apply(&self, jobs: Vec<InlineJob>, burst: &[u8]) -> Vec<Reply> {
        match &self.kind {
            SenderKind::Device {
                inline: Some(inline),
                ..
            } => inline.apply(jobs, burst),
            SenderKind::Device { inline: None, .. } => {
                jobs.into_iter().map(refuse_inline).collect()
            }
            SenderKind::Shared(shared) => shared.apply(jobs, burst),
        }
    }
}

/// The reply to a job the engine cannot take because it has stopped.
pub(crate) fn refuse_inline(job: InlineJob) -> Reply {
    Reply {
        handle: job.handle,
        read_offset: None,
        block_status: false,
        result: Err(shutdown_failure()),
        data: job.buf,
        credits: 0,
    }
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Message::Jobs(j) => write!(f, "Jobs({})", j.len()),
            Message::Shutdown => f.write_str("Shutdown"),
        }
    }
}

impl EngineHandle {
    /// Starts the engine over `device`: an engine thread when paced, the shared engine and
    /// its idle thread when unpaced.
    pub fn spawn(
        device: Box<dyn BlockDevice + Send>,
        pace: Pace,
    ) -> Result<(Self, DeviceInfo), ServeError> {
        let mut exec = Executor::new(device)?;
        let info = exec.info();
        // Paced, a device that runs its commands side by side in an event loop of its own
        // is served through that loop (`queued` module); unpaced, every request is applied
        // at once anyway.
        let queued =
            (pace == Pace::Model && exec.device_mut().queued().is_some()).then(QueuedJobs::default);
        let start = Instant::now();
        let engine = Engine {
            exec,
            pace,
            start,
            skew_ns: 0,
            last_now_ns: 0,
            pending: BinaryHeap::new(),
            outstanding: BinaryHeap::new(),
            waiting: VecDeque::new(),
            queued,
            seq: 0,
            queue_depth: info.max_queue_depth.max(1) as usize,
            background_at_ns: None,
            background_armed: false,
            outbox: Vec::new(),
            stats: EngineStats::default(),
        };
        if pace == Pace::None {
            let (wake, rx) = crossbeam_channel::bounded(1);
            let inline = Arc::new(InlineEngine {
                engine: Mutex::new(InlineState {
                    engine: Box::new(engine),
                    stopped: false,
                }),
                start,
                last_request_ns: AtomicU64::new(0),
                parked: AtomicBool::new(false),
                wake: wake.clone(),
            });
            let idle = inline.clone();
            let thread = std::thread::Builder::new()
                .name("afa-engine-idle".into())
                .spawn(move || idle.idle_loop(rx))
                .map_err(ServeError::Thread)?;
            let kind = HandleKind::Device {
                tx: wake,
                thread: Some(thread),
                inline: Some(inline),
            };
            return Ok((Self { kind }, info));
        }
        let (tx, rx) = crossbeam_channel::unbounded();
        let thread = std::thread::Builder::new()
            .name("afa-engine".into())
            .spawn(move || engine.run(rx))
            .map_err(ServeError::Thread)?;
        let kind = HandleKind::Device {
            tx,
            thread: Some(thread),
            inline: None,
        };
        Ok((Self { kind }, info))
    }

    /// Starts serving a volume that does its own concurrency. Connection threads apply
    /// requests to it directly, many at once and with no lock of the server's; paced, a
    /// pacer thread holds each reply until the volume's clock says it is complete.
    pub fn spawn_shared(
        volume: Arc<dyn SharedVolume>,
        pace: Pace,
    ) -> Result<(Self, DeviceInfo), ServeError> {
        let (handle, info) = SharedHandle::spawn(volume, pace)?;
        let kind = HandleKind::Shared(handle);
        Ok((Self { kind }, info))
    }

    pub fn sender(&self) -> EngineSender {
        let kind = match &self.kind {
            HandleKind::Device { tx, inline, .. } => SenderKind::Device {
                tx: tx.clone(),
                inline: inline.clone(),
            },
            HandleKind::Shared(handle) => SenderKind::Shared(handle.engine()),
        };
        EngineSender { kind }
    }

    /// Stops the engine after it has answered every queued job and flushed the device (or
    /// shut the shared volume down).
    pub fn stop(mut self) -> EngineStats {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> EngineStats {
        match &mut self.kind {
            HandleKind::Device { tx, thread, .. } => {
                // Unpaced, the channel is the idle thread's one-message wake-up slot; the
                // send blocks until the thread has taken what is in it.
                let _ = tx.send(Message::Shutdown);
                match thread.take().map(JoinHandle::join) {
                    Some(Ok(stats)) => stats,
                    Some(Err(_)) => {
                        crate::log("the engine thread panicked");
                        EngineStats::default()
                    }
                    None => EngineStats::default(),
                }
            }
            HandleKind::Shared(handle) => handle.stop(),
        }
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        // Stopping twice would call the shared volume's `shutdown` twice, so only an engine
        // that is still running is stopped here.
        let running = match &self.kind {
            HandleKind::Device { thread, .. } => thread.is_some(),
            HandleKind::Shared(handle) => handle.is_running(),
        };
        if running {
            self.stop_inner();
        }
    }
}

/// The reply to a job refused because the engine is shutting down.
pub fn shutdown_failure() -> Failure {
    Failure {
        errno: ESHUTDOWN,
        message: "the server is shutting down".into(),
    }
}
