//! Arrays of SSDs: one volume over N member devices with a RAID layout.
//!
//! An [`Array`] is itself a [`BlockDevice`], so the host, the workloads, the oracle and the
//! reports drive it exactly as they drive one SSD. Member commands are timed by the members
//! in the same next-free-time model the SSD uses: a stripe write issues its reads when the
//! command arrives, computes parity when the last read is back and issues its writes then,
//! and completes with the last write. Members see commands in the order the array issues
//! them, as FEMU's devices do.
//!
//! Failures: a member can fail at any time. Reads of its chunks are reconstructed from the
//! survivors (degraded reads); writes keep the survivors and the parity consistent, so that
//! the lost chunks stay recoverable. A rebuild onto a spare proceeds at a configured rate, a
//! stripe at a time, interleaved with host I/O; stripes already rebuilt are served by the
//! spare, the rest stay degraded until the rebuild reaches them.

mod layout;
mod log_raid;
mod nvram;
pub mod scalaafa;
mod swan;
mod trims;
mod two_phase;

pub use layout::{Layout, Level, StripeMap};
pub use log_raid::{LogRaid, LogRaidConfig, LogRaidStats};
pub use nvram::{MemNvram, NvramLog};
pub use scalaafa::{
    InFlight, ScalaAfa, ScalaAfaConfig, ScalaAfaStats, ScalaMode, SubChunkWrites, ThreadedScalaAfa,
    META_TAG_BYTES,
};
pub use swan::{
    decode_summary, encode_summary, HostMemory, ReadKind, Swan, SwanConfig, SwanEvent, SwanStats,
    VictimPolicy,
};
pub use two_phase::{
    TwoPhase, TwoPhaseConfig, TwoPhaseRecovery, TwoPhaseStats, TWO_PHASE_TAG_BYTES,
};

use afa_parity::ErasureCodec;
use afa_sim::{transfer_ns, TimeNs};
use afa_ssd::{
    validate_command, BlockDevice, Command, Completion, DeviceError, DeviceInfo, HostWork, Opcode,
    ReadBuffers,
};
use serde::{Deserialize, Serialize};

/// The array's configuration (the `[array]` table).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ArrayConfig {
    pub level: Level,
    /// Member devices in the array (spares not included).
    pub members: u32,
    pub chunk_bytes: u64,
    /// Host parity computation rate in MB/s (10^6 bytes of data per second).
    pub parity_mb_s: f64,
    /// Rebuild rate onto a spare, in MB/s of rebuilt member data.
    pub rebuild_mb_s: f64,
    /// mdraid's stripe cache, in stripes (0: off). Partial-stripe writes wait in host
    /// memory, so sequential small writes that fill a stripe are written as one full
    /// stripe; a stripe evicted before it fills is written by read-modify-write or
    /// reconstruct-write. The cache is volatile: FLUSH and FUA writes drain it.
    pub stripe_cache_stripes: u32,
}

impl Default for ArrayConfig {
    fn default() -> Self {
        Self {
            level: Level::Raid5,
            members: 5,
            chunk_bytes: 64 * 1024,
            parity_mb_s: 12_000.0,
            rebuild_mb_s: 500.0,
            stripe_cache_stripes: 0,
        }
    }
}

/// Counters of the array engine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ArrayStats {
    pub full_stripe_writes: u64,
    pub read_modify_writes: u64,
    pub reconstruct_writes: u64,
    pub degraded_reads: u64,
    /// What degraded mode costs a reader (serialised flat).
    #[serde(flatten)]
    pub degraded: DegradedReadLatency,
    /// How long the last completed rebuild took, in ns of simulated time.
    pub last_rebuild_ns: Option<u64>,
    pub member_read_sectors: u64,
    pub member_write_sectors: u64,
    /// Member reads that failed as uncorrectable and were answered from the stripe's other
    /// members instead, their rows then written back to the member (md's "read error
    /// corrected").
    pub read_errors_corrected: u64,
    /// Member reads made again because a correction found more members unreadable than the
    /// stripe's redundancy covers (`correct_read`).
    pub read_retries: u64,
    pub user_write_sectors: u64,
    pub stripes_rebuilt: u64,
    /// Partial-stripe writes absorbed by the stripe cache.
    pub stripe_cache_writes: u64,
    /// Stripes the cache completed and wrote whole.
    pub stripe_cache_full_stripes: u64,
    /// Stripes evicted (or flushed) before they were complete.
    pub stripe_cache_evictions: u64,
}

/// Read commands that needed a reconstruction, and their summed and largest latency
/// inside the array (ns).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DegradedReadLatency {
    pub degraded_read_commands: u64,
    pub degraded_read_latency_ns_total: u64,
    pub degraded_read_latency_ns_max: u64,
}

impl DegradedReadLatency {
    fn record(&mut self, latency_ns: u64) {
        self.degraded_read_commands += 1;
        self.degraded_read_latency_ns_total += latency_ns;
        self.degraded_read_latency_ns_max = self.degraded_read_latency_ns_max.max(latency_ns);
    }
}

/// Member failures still to happen, as (time, member), earliest last; each engine applies
/// them when the first command or idle call at or after their time arrives.
#[derive(Debug, Clone, Default)]
pub(crate) struct FailureSchedule(Vec<(TimeNs, usize)>);

impl FailureSchedule {
    fn add(&mut self, at_ns: TimeNs, member: usize) {
        self.0.push((at_ns, member));
        self.0.sort_by(|a, b| b.cmp(a));
    }
    /// The next failure due by `now_ns`, removed from the schedule.
    fn pop_due(&mut self, now_ns: TimeNs) -> Option<(TimeNs, usize)> {
        let &(at, _) = self.0.last()?;
        if at > now_ns {
            return None;
        }
        self.0.pop()
    }
    fn next_ns(&self) -> Option<TimeNs> {
        self.0.last().map(|&(t, _)| t)
    }
}

/// A stripe waiting in the stripe cache: its data rows and which sectors are present.
#[derive(Debug)]
struct CachedStripe {
    stripe: u64,
    data: Vec<u8>,
    present: Vec<bool>,
    present_count: u32,
    last_use: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MemberState {
    Alive,
    Failed,
    /// Being rebuilt onto its replacement: stripes below `upto` are rebuilt.
    Rebuilding {
        upto: u64,
        started_ns: TimeNs,
    },
}

#[derive(Debug)]
struct Member<D> {
    device: D,
    state: MemberState,
}

/// One piece of a command inside one data chunk of a stripe.
#[derive(Debug, Clone, Copy)]
struct Piece {
    /// Data chunk index in the stripe.
    index: usize,
    /// First row (sector within the chunk) and row count.
    row: u32,
    rows: u32,
    /// Offset of the piece in the command, in sectors.
    cmd_offset: u64,
}

/// A partial-stripe write: the pieces of the command in one stripe and the parity rows they
/// span (`row0..row0 + rows`).
#[derive(Debug, Clone, Copy)]
struct StripeWrite<'a> {
    stripe: u64,
    map: &'a StripeMap,
    pieces: &'a [Piece],
    data: &'a [u8],
    row0: u32,
    rows: u32,
    now_ns: TimeNs,
}

/// A volume over member devices.
#[derive(Debug)]
pub struct Array<D: BlockDevice> {
    config: ArrayConfig,
    layout: Layout,
    members: Vec<Member<D>>,
    spares: Vec<D>,
    codec: Option<Box<dyn ErasureCodec>>,
    /// Member failures still to happen, as (time, member), earliest last.
    scheduled_failures: FailureSchedule,
    info: DeviceInfo,
    unit: usize,
    chunk_sectors: u32,
    stripes: u64,
    stats: ArrayStats,
    /// Host work since the last `take_host_work`, for the host CPU model.
    work: HostWork,
    /// Whether the commands being issued are background work (rebuild).
    in_background: bool,
    /// The write being applied asked for force unit access: every member write it makes
    /// carries the flag too, so its data and parity are durable when it completes.
    member_fua: bool,
    cache: Vec<CachedStripe>,
    /// Completion times of stripe writes the cache started, which hold a cache slot until
    /// they are done.
    cache_inflight: std::collections::BinaryHeap<std::cmp::Reverse<TimeNs>>,
    cache_clock: u64,
}

/// Errors building an array.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ArrayError {
    #[error("invalid array configuration: {0}")]
    Config(String),
    #[error("member {0} cannot fail: {1}")]
    Fail(usize, String),
    #[error("resync: {0}")]
    Resync(String),
}

/// Checks the members a recovery is told the power loss also took: each one of the
/// `members`, none named twice, and no more than the `m` failures the code tolerates.
pub(crate) fn check_lost_members(
    failed: &[usize],
    members: usize,
    m: usize,
) -> Result<(), ArrayError> {
    for (i, &f) in failed.iter().enumerate() {
        if f >= members {
            return Err(ArrayError::Fail(f, "no such member".into()));
        }
        if failed[..i].contains(&f) {
            return Err(ArrayError::Fail(f, "named twice as failed".into()));
        }
    }
    if failed.len() > m {
        return Err(ArrayError::Fail(
            failed[m],
            format!(
                "the array tolerates {m} failed members, and {} are lost",
                failed.len()
            ),
        ));
    }
    Ok(())
}

/// The allocation of `sectors` sectors from `lba` on a volume mapped in chunks of
/// `chunk_sectors`, where `written(chunk)` says whether a chunk holds data (an unwritten
/// chunk reads as zeroes). `None` when the range runs past `capacity_sectors`.
pub(crate) fn chunk_allocation(
    lba: u64,
    sectors: u32,
    capacity_sectors: u64,
    chunk_sectors: u64,
    written: impl Fn(u64) -> bool,
) -> Option<Vec<(u32, bool)>> {
    let end = lba.checked_add(sectors as u64)?;
    if end > capacity_sectors {
        return None;
    }
    let mut runs = Vec::new();
    let mut at = lba;
    while at < end {
        let chunk = at / chunk_sectors;
        let to = ((chunk + 1) * chunk_sectors).min(end);
        afa_ssd::push_allocation_run(&mut runs, (to - at) as u32, written(chunk));
        at = to;
    }
    Some(runs)
}

/// When a write that `written` completes may be answered, for an engine that makes a FUA
/// write durable with a flush of the whole volume (`flush`, run only when `fua`), as Linux
/// does for a device without FUA: what such an engine's durability rests on (open stripes,
/// replicas, rows held for the last flushed copy of a chunk) is its flush's business, so a
/// FUA write that skipped it could be lost even with every member write it made on flash.
pub(crate) fn answer_fua_after_flush(
    written: TimeNs,
    fua: bool,
    flush: impl FnOnce() -> Result<TimeNs, DeviceError>,
) -> Result<TimeNs, DeviceError> {
    Ok(if fua { written.max(flush()?) } else { written })
}

/// Flushes every given member device, counting one member command each in `work`; returns
/// when the last flush completes. Every engine's FLUSH ends here, over its serving members.
pub(crate) fn flush_members<'a, D: BlockDevice + 'a>(
    now_ns: TimeNs,
    devices: impl Iterator<Item = &'a mut D>,
    work: &mut HostWork,
) -> Result<TimeNs, DeviceError> {
    let mut done = now_ns;
    for device in devices {
        work.member_commands += 1;
        let c = device.submit(now_ns, &Command::flush(), ReadBuffers::none())?;
        done = done.max(c.done_ns);
    }
    Ok(done)
}

/// Reads one sector (a cleaner's) or one shard (a correction's, a decode's) this many
/// times at most before giving it up as unreadable.
pub(crate) const READ_ATTEMPTS: u32 = 16;

/// Reads again data whose every copy (`copies`: mirrors, replicas) failed once as
/// uncorrectable: up to `READ_ATTEMPTS - 1` more passes over them through `read`, until one
/// reads. The SSD's read errors are transient (the data stays), so a later read of a copy
/// finds it, as `read_shards` finds a parity stripe's shards; before, the user's command
/// failed. Returns when the read completed (None when no copy read) and the reads made
/// again; the last uncorrectable error goes to `unreadable`, and any other error stops it.
pub(crate) fn read_copies_again<C: Copy>(
    copies: &[C],
    unreadable: &mut Option<DeviceError>,
    mut read: impl FnMut(C) -> Result<TimeNs, DeviceError>,
) -> Result<(Option<TimeNs>, u64), DeviceError> {
    let mut retries = 0;
    for _ in 1..READ_ATTEMPTS {
        for &copy in copies {
            retries += 1;
            if let Some(done) = as_erasure(read(copy), unreadable)? {
                return Ok((Some(done), retries));
            }
        }
    }
    Ok((None, retries))
}

/// Reads the shards of a stripe that `readable` marks and `present` does not, through
/// `read` (`Ok(Some(done))`: read; `Ok(None)`: could not be read this time; an error stops
/// it), marking them present. While more shards are missing than the stripe's `parities`
/// cover, the ones that could not be read are read again, up to `READ_ATTEMPTS` times
/// each: the SSD's read errors are transient (ECC and read retry failed this time; the
/// data stays), and a host's block layer retries a failed read. Returns when the last read
/// completed (0 if none did) and how many reads were made again.
pub(crate) fn read_shards(
    readable: &[bool],
    present: &mut [bool],
    parities: usize,
    mut read: impl FnMut(usize) -> Result<Option<TimeNs>, DeviceError>,
) -> Result<(TimeNs, u64), DeviceError> {
    let mut done = 0;
    let mut retries = 0;
    for attempt in 0..READ_ATTEMPTS {
        for i in 0..readable.len() {
            if !readable[i] || present[i] {
                continue;
            }
            if attempt > 0 {
                retries += 1;
            }
            if let Some(t) = read(i)? {
                present[i] = true;
                done = done.max(t);
            }
        }
        let missing = present.iter().filter(|&&p| !p).count();
        let unread = (0..readable.len()).any(|i| readable[i] && !present[i]);
        if missing <= parities || !unread {
            break;
        }
    }
    Ok((done, retries))
}

/// A shard read's outcome as `read_shards` takes it: an uncorrectable read is an erasure
/// (`Ok(None)`), kept in `unreadable` to name its sectors if the decode fails after all.
pub(crate) fn as_erasure(
    read: Result<TimeNs, DeviceError>,
    unreadable: &mut Option<DeviceError>,
) -> Result<Option<TimeNs>, DeviceError> {
    match read {
        Ok(done) => Ok(Some(done)),
        Err(e @ DeviceError::Uncorrectable { .. }) => {
            *unreadable = Some(e);
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Reads `sectors` at `lba` of `device` for a log cleaner (Log-RAID's, SWAN's). An
/// uncorrectable read is transient on a flash device (the data stays; ECC and read retries
/// failed this time), and over RAID 0 nothing else holds the sectors, so the cleaner reads
/// them again, one sector at a time, up to `READ_ATTEMPTS` times each, as a host
/// retries a failed I/O. Before, the error ended whatever user command had driven the
/// cleaning, with sectors it had never asked for. Counts the retried reads in `retries`;
/// returns when the last read completes.
pub(crate) fn cleaner_read<D: BlockDevice + ?Sized>(
    device: &mut D,
    now_ns: TimeNs,
    lba: u64,
    sectors: u32,
    out: &mut [u8],
    retries: &mut u64,
) -> Result<TimeNs, DeviceError> {
    let read = |device: &mut D, lba: u64, sectors: u32, out: &mut [u8]| {
        device
            .submit(
                now_ns,
                &Command::read(lba, sectors),
                ReadBuffers {
                    data: out,
                    tags: None,
                },
            )
            .map(|c| c.done_ns)
    };
    match read(device, lba, sectors, out) {
        Err(DeviceError::Uncorrectable { .. }) => {}
        result => return result,
    }
    // Timing-only payloads keep no bytes (a unit of 0): each sector's slice is then empty.
    let unit = out.len() / sectors as usize;
    let mut done = now_ns;
    for i in 0..sectors as usize {
        let sector = &mut out[i * unit..(i + 1) * unit];
        let mut attempt = 1;
        loop {
            *retries += 1;
            match read(device, lba + i as u64, 1, sector) {
                Ok(t) => {
                    done = done.max(t);
                    break;
                }
                Err(DeviceError::Uncorrectable { .. }) if attempt < READ_ATTEMPTS => {
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok(done)
}

/// Checks what every engine needs of its devices and rates: the same sector size and payload
/// mode on every device, a chunk of whole sectors, positive rates. Returns the first device's
/// facts, sectors per chunk and the smallest device's capacity in sectors.
pub(crate) fn check_members<D: BlockDevice>(
    config: &ArrayConfig,
    members: &[D],
    spares: &[D],
) -> Result<(DeviceInfo, u32, u64), ArrayError> {
    let err = |s: String| ArrayError::Config(s);
    let first = members
        .first()
        .ok_or_else(|| err("an array needs members".into()))?
        .info();
    for (i, m) in members.iter().chain(spares).enumerate() {
        let info = m.info();
        if info.sector_bytes != first.sector_bytes
            || info.payload_unit_bytes != first.payload_unit_bytes
        {
            return Err(err(format!(
                "device {i} has {} B sectors and {} B payload units; device 0 has {} and {}",
                info.sector_bytes,
                info.payload_unit_bytes,
                first.sector_bytes,
                first.payload_unit_bytes
            )));
        }
    }
    let sector = first.sector_bytes as u64;
    if config.chunk_bytes == 0 || config.chunk_bytes % sector != 0 {
        return Err(err(format!(
            "array.chunk_bytes = {} must be a positive multiple of the {sector} B sector",
            config.chunk_bytes
        )));
    }
    for (name, v) in [
        ("array.parity_mb_s", config.parity_mb_s),
        ("array.rebuild_mb_s", config.rebuild_mb_s),
    ] {
        afa_sim::check_bandwidth_mb_s(name, v).map_err(&err)?;
    }
    let min_capacity = members
        .iter()
        .chain(spares)
        .map(|m| m.info().capacity_sectors)
        .min()
        .unwrap_or(0);
    Ok((first, (config.chunk_bytes / sector) as u32, min_capacity))
}

/// Pieces re-based so the first starts at offset 0, and the sectors they cover: a trim's
/// pieces become a zero write of its own.
fn rebased(pieces: &[Piece]) -> (Vec<Piece>, u64) {
    let first = pieces[0].cmd_offset;
    let sectors = pieces.iter().map(|p| p.rows as u64).sum();
    let shifted = pieces
        .iter()
        .map(|p| Piece {
            cmd_offset: p.cmd_offset - first,
            ..*p
        })
        .collect();
    (shifted, sectors)
}

impl<D: BlockDevice> Array<D> {
    /// Builds an array over `members` (which must match `config.members`) with `spares`
    /// waiting to replace failed members.
    pub fn new(config: ArrayConfig, members: Vec<D>, spares: Vec<D>) -> Result<Self, ArrayError> {
        let err = |s: String| ArrayError::Config(s);
        if members.len() != config.members as usize {
            return Err(err(format!(
                "array.members = {} but {} member devices were given",
                config.members,
                members.len()
            )));
        }
        let layout = Layout::new(config.level, members.len()).map_err(err)?;
        let (first, chunk_sectors, min_capacity) = check_members(&config, &members, &spares)?;
        let stripes = min_capacity / chunk_sectors as u64;
        if stripes == 0 {
            return Err(err("members are smaller than one chunk".into()));
        }
        let codec = if layout.is_parity() {
            Some(afa_parity::codec(layout.k, layout.m).map_err(|e| err(e.to_string()))?)
        } else {
            None
        };
        let info = DeviceInfo {
            sector_bytes: first.sector_bytes,
            capacity_sectors: stripes * layout.k as u64 * chunk_sectors as u64,
            payload_unit_bytes: first.payload_unit_bytes,
            tag_bytes_per_sector: 0,
            max_queue_depth: members.iter().map(|m| m.info().max_queue_depth).sum(),
            max_transfer_sectors: u32::MAX,
        };
        Ok(Self {
            unit: first.payload_unit_bytes as usize,
            members: members
                .into_iter()
                .map(|device| Member {
                    device,
                    state: MemberState::Alive,
                })
                .collect(),
            spares,
            codec,
            scheduled_failures: FailureSchedule::default(),
            info,
            chunk_sectors,
            stripes,
            layout,
            config,
            stats: ArrayStats::default(),
            work: HostWork::default(),
            in_background: false,
            member_fua: false,
            cache: Vec::new(),
            cache_inflight: std::collections::BinaryHeap::new(),
            cache_clock: 0,
        })
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    /// Sectors per chunk.
    pub fn chunk_sectors(&self) -> u32 {
        self.chunk_sectors
    }
    pub fn stats(&self) -> &ArrayStats {
        &self.stats
    }
    pub fn member(&self, i: usize) -> &D {
        &self.members[i].device
    }
    pub fn members(&self) -> impl Iterator<Item = &D> {
        self.members.iter().map(|m| &m.device)
    }
    /// The member devices, to reset or read their own measurement counters; commands must
    /// still go through the engine, which alone knows where data lives.
    pub fn members_mut(&mut self) -> impl Iterator<Item = &mut D> {
        self.members.iter_mut().map(|m| &mut m.device)
    }
    /// Hands the member devices back in order (the array, and what its stripe cache held,
    /// is gone), as a host crash or an orderly stop leaves them.
    pub fn into_members(self) -> Vec<D> {
        self.members.into_iter().map(|m| m.device).collect()
    }

    /// Zeroes the engine's counters and hands every member and spare to `member` to zero
    /// theirs, so that a measured run after an unmeasured one (preconditioning) reports only
    /// itself. The volume's contents and state are untouched.
    pub fn reset_counters(&mut self, mut member: impl FnMut(&mut D)) {
        self.stats = ArrayStats::default();
        self.members.iter_mut().for_each(|m| member(&mut m.device));
        self.spares.iter_mut().for_each(member);
    }

    /// The smallest write the level accepts, in sectors: a whole stripe for `raid5f`, which
    /// refuses anything else, one sector otherwise.
    pub fn min_write_sectors(&self) -> u64 {
        if self.layout.level == Level::Raid5f {
            self.chunk_sectors as u64 * self.layout.k as u64
        } else {
            1
        }
    }

    /// Gives the members that have not failed idle time at `now_ns` for their own work (an
    /// SSD's idle-time GC and erases), without the array's background duties (scheduled
    /// failures, rebuild), which keep to the host's idle time. An engine that leaves some
    /// members without commands while others are busy (SWAN's back-end) calls this.
    /// Returns when the members would like to be called again.
    pub fn members_background(&mut self, now_ns: TimeNs) -> Option<TimeNs> {
        let mut next: Option<TimeNs> = None;
        for m in &mut self.members {
            if m.state == MemberState::Failed {
                continue;
            }
            if let Some(t) = m.device.background(now_ns) {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        }
        next
    }
    /// Whether member `i` currently serves stripe `stripe`.
    fn serves(&self, i: usize, stripe: u64) -> bool {
        match self.members[i].state {
            MemberState::Alive => true,
            MemberState::Failed => false,
            MemberState::Rebuilding { upto, .. } => stripe < upto,
        }
    }

    /// Whether some member of `stripe` does not serve it (failed, or not yet rebuilt).
    fn stripe_degraded(&self, map: &StripeMap, stripe: u64) -> bool {
        map.data
            .iter()
            .chain(&map.redundancy)
            .any(|&m| !self.serves(m, stripe))
    }

    fn failed_count(&self) -> usize {
        self.members
            .iter()
            .filter(|m| m.state != MemberState::Alive)
            .count()
    }

    /// Fails member `i` now. If a spare is available, its rebuild starts at `now_ns`.
    pub fn fail_member(&mut self, i: usize, now_ns: TimeNs) -> Result<(), ArrayError> {
        if i >= self.members.len() {
            return Err(ArrayError::Fail(i, "no such member".into()));
        }
        if self.members[i].state != MemberState::Alive {
            return Err(ArrayError::Fail(i, "already failed".into()));
        }
        if self.failed_count() + 1 > self.layout.tolerance() {
            return Err(ArrayError::Fail(
                i,
                format!(
                    "the array tolerates {} failed members",
                    self.layout.tolerance()
                ),
            ));
        }
        self.members[i].state = MemberState::Failed;
        self.start_rebuilds(now_ns);
        Ok(())
    }

    /// Arranges for member `member` to fail at `at_ns` (checked when the first command or
    /// idle call at or after that time arrives).
    pub fn schedule_failure(&mut self, member: usize, at_ns: TimeNs) -> Result<(), ArrayError> {
        if member >= self.members.len() {
            return Err(ArrayError::Fail(member, "no such member".into()));
        }
        self.scheduled_failures.add(at_ns, member);
        Ok(())
    }

    fn apply_scheduled_failures(&mut self, now_ns: TimeNs) -> Result<(), DeviceError> {
        while let Some((at, member)) = self.scheduled_failures.pop_due(now_ns) {
            // A failure beyond the tolerance is refused by fail_member; the array then has
            // lost data and says so on every command.
            if self.fail_member(member, at).is_err() {
                self.members[member].state = MemberState::Failed;
                return Err(DeviceError::Failed);
            }
        }
        if self.failed_beyond_tolerance() {
            return Err(DeviceError::Failed);
        }
        Ok(())
    }

    fn failed_beyond_tolerance(&self) -> bool {
        self.members
            .iter()
            .filter(|m| m.state == MemberState::Failed)
            .count()
            > self.layout.tolerance()
    }

    /// Puts a spare in place of each failed member that is not yet being rebuilt.
    fn start_rebuilds(&mut self, now_ns: TimeNs) {
        for i in 0..self.members.len() {
            if self.members[i].state == MemberState::Failed && !self.spares.is_empty() {
                let spare = self.spares.remove(0);
                self.members[i].device = spare;
                self.members[i].state = MemberState::Rebuilding {
                    upto: 0,
                    started_ns: now_ns,
                };
            }
        }
    }

    /// Whether any member is being rebuilt.
    pub fn rebuilding(&self) -> bool {
        self.members
            .iter()
            .any(|m| matches!(m.state, MemberState::Rebuilding { .. }))
    }

    /// Rebuilds every stripe whose turn (at the configured rate) has come by `now_ns`.
    fn advance_rebuild(&mut self, now_ns: TimeNs) -> Result<(), DeviceError> {
        let stripe_ns = transfer_ns(self.config.chunk_bytes, self.config.rebuild_mb_s);
        for i in 0..self.members.len() {
            while let MemberState::Rebuilding { upto, started_ns } = self.members[i].state {
                if upto >= self.stripes {
                    self.stats.last_rebuild_ns = Some(upto * stripe_ns);
                    self.members[i].state = MemberState::Alive;
                    break;
                }
                let due = started_ns + (upto + 1) * stripe_ns;
                if due > now_ns {
                    break;
                }
                self.in_background = true;
                let rebuilt = self.rebuild_stripe(i, upto, due);
                self.in_background = false;
                rebuilt?;
                self.members[i].state = MemberState::Rebuilding {
                    upto: upto + 1,
                    started_ns,
                };
                self.stats.stripes_rebuilt += 1;
            }
        }
        Ok(())
    }

    /// Regenerates member `target`'s chunk of `stripe` from the survivors onto it.
    fn rebuild_stripe(
        &mut self,
        target: usize,
        stripe: u64,
        now_ns: TimeNs,
    ) -> Result<(), DeviceError> {
        let map = self.layout.stripe(stripe);
        let rows = self.chunk_sectors;
        let (shards, mut present, t) =
            self.read_stripe_rows(stripe, &map, 0, rows, now_ns, Some(target))?;
        let mut shards = shards;
        let role = map
            .data
            .iter()
            .chain(&map.redundancy)
            .position(|&m| m == target)
            .expect("every member has a role in every stripe");
        if !self.layout.is_parity() {
            // A mirror: the chunk is any surviving copy of the same data chunk.
            let copy = self.surviving_copy(&map, role, stripe, Some(target));
            let Some(src) = copy else {
                return Err(DeviceError::Failed);
            };
            let data = shards[src].clone();
            self.member_write(target, stripe, 0, rows, t, &data)?;
            return Ok(());
        }
        present[role] = false;
        let codec = self.codec.as_ref().expect("parity level has a codec");
        let mut refs: Vec<&mut [u8]> = shards.iter_mut().map(|s| s.as_mut_slice()).collect();
        codec
            .reconstruct(&mut refs, &present)
            .map_err(|_| DeviceError::Failed)?;
        let data = shards[role].clone();
        self.member_write(target, stripe, 0, rows, t, &data)?;
        Ok(())
    }

    /// Rewrites every stripe's redundancy from its data: parity recomputed, mirror copies
    /// copied from the first copy. This is md's resync after an unclean stop: a write cut
    /// off between its data and its parity (the write hole) leaves the data right but the
    /// parity stale, which would only show when a later degraded read reconstructed from it.
    /// Returns the stripes rewritten and when the last write completes. Every member must
    /// be alive: a degraded array has nothing to resync from.
    pub fn resync(&mut self, now_ns: TimeNs) -> Result<(u64, TimeNs), ArrayError> {
        if self.layout.m == 0 {
            return Ok((0, now_ns));
        }
        if let Some(i) = self
            .members
            .iter()
            .position(|m| !matches!(m.state, MemberState::Alive))
        {
            return Err(ArrayError::Resync(format!("member {i} is not alive")));
        }
        let rows = self.chunk_sectors;
        let mut done = now_ns;
        for stripe in 0..self.stripes {
            let map = self.layout.stripe(stripe);
            let k = map.data.len();
            let mut data = Vec::with_capacity(k);
            let mut t = now_ns;
            for &m in &map.data {
                let mut buf = vec![0u8; rows as usize * self.unit];
                let read = self.member_read(m, stripe, 0, rows, now_ns, &mut buf);
                t = t.max(read.map_err(|e| {
                    ArrayError::Resync(format!("reading member {m}, stripe {stripe}: {e}"))
                })?);
                data.push(buf);
            }
            let redundancy: Vec<Vec<u8>> = if self.layout.is_parity() {
                let mut parity = vec![vec![0u8; rows as usize * self.unit]; map.redundancy.len()];
                let codec = self.codec.as_ref().expect("parity level has a codec");
                let inputs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
                let mut outputs: Vec<&mut [u8]> =
                    parity.iter_mut().map(Vec::as_mut_slice).collect();
                codec
                    .encode(&inputs, &mut outputs)
                    .map_err(|e| ArrayError::Resync(format!("parity of stripe {stripe}: {e}")))?;
                parity
            } else {
                // Mirrors: copy j of data chunk c sits at redundancy index c·copies + j.
                let copies = map.redundancy.len() / k.max(1);
                (0..map.redundancy.len())
                    .map(|r| data[r / copies.max(1)].clone())
                    .collect()
            };
            for (r, chunk) in redundancy.iter().enumerate() {
                let m = map.redundancy[r];
                let written = self.member_write(m, stripe, 0, rows, t, chunk);
                done = done.max(written.map_err(|e| {
                    ArrayError::Resync(format!("writing member {m}, stripe {stripe}: {e}"))
                })?);
            }
        }
        Ok((self.stripes, done))
    }

    /// For mirrors: the role index (in data ++ redundancy order) of a serving copy of the
    /// data chunk at `role`, other than `exclude`.
    fn surviving_copy(
        &self,
        map: &StripeMap,
        role: usize,
        stripe: u64,
        exclude: Option<usize>,
    ) -> Option<usize> {
        self.surviving_copy_except(map, role, stripe, exclude.as_slice())
    }

    /// As [`Self::surviving_copy`], other than every member in `exclude`.
    fn surviving_copy_except(
        &self,
        map: &StripeMap,
        role: usize,
        stripe: u64,
        exclude: &[usize],
    ) -> Option<usize> {
        let k = map.data.len();
        let copies = map.redundancy.len() / k.max(1);
        let chunk = if role < k {
            role
        } else {
            (role - k) / copies.max(1)
        };
        let mut candidates = vec![chunk];
        candidates.extend((0..copies).map(|j| k + chunk * copies + j));
        candidates.into_iter().find(|&r| {
            let m = if r < k {
                map.data[r]
            } else {
                map.redundancy[r - k]
            };
            !exclude.contains(&m) && self.serves(m, stripe)
        })
    }

    /// Reads rows `row..row+rows` of every serving member of `stripe` (except `exclude`),
    /// in data ++ redundancy order. Returns the shards, which ones are present, and when the
    /// last read completed.
    #[allow(clippy::type_complexity)]
    fn read_stripe_rows(
        &mut self,
        stripe: u64,
        map: &StripeMap,
        row: u32,
        rows: u32,
        now_ns: TimeNs,
        exclude: Option<usize>,
    ) -> Result<(Vec<Vec<u8>>, Vec<bool>, TimeNs), DeviceError> {
        let roles: Vec<usize> = map.data.iter().chain(&map.redundancy).copied().collect();
        let mut shards = Vec::with_capacity(roles.len());
        let mut present = Vec::with_capacity(roles.len());
        let mut done = now_ns;
        for &m in &roles {
            let mut buf = vec![0u8; rows as usize * self.unit];
            let serving = Some(m) != exclude && self.serves(m, stripe);
            if serving {
                done = done.max(self.member_read(m, stripe, row, rows, now_ns, &mut buf)?);
            }
            shards.push(buf);
            present.push(serving);
        }
        Ok((shards, present, done))
    }

    #[inline]
    fn member_lba(&self, stripe: u64, row: u32) -> u64 {
        stripe * self.chunk_sectors as u64 + row as u64
    }

    /// Reads rows of member `m`'s chunk of `stripe`. A read the member cannot correct is
    /// answered from the stripe's redundancy instead, as md does; only a layout without any
    /// (RAID 0), or a stripe without enough left, passes the error on.
    fn member_read(
        &mut self,
        m: usize,
        stripe: u64,
        row: u32,
        rows: u32,
        now_ns: TimeNs,
        out: &mut [u8],
    ) -> Result<TimeNs, DeviceError> {
        match self.member_read_once(m, stripe, row, rows, now_ns, out) {
            Err(e @ DeviceError::Uncorrectable { .. }) => self
                .correct_read(m, stripe, row, rows, now_ns, out)?
                .ok_or(e),
            result => result,
        }
    }

    /// Rebuilds rows of member `m`'s chunk of `stripe`, which `m` could not read, from the
    /// stripe's other serving members into `out`, and writes them back to `m` so that the
    /// next read finds them. Returns when `out` is ready, or None when the stripe has no
    /// redundancy to rebuild them from (or too little readable).
    fn correct_read(
        &mut self,
        m: usize,
        stripe: u64,
        row: u32,
        rows: u32,
        now_ns: TimeNs,
        out: &mut [u8],
    ) -> Result<Option<TimeNs>, DeviceError> {
        let map = self.layout.stripe(stripe);
        let roles: Vec<usize> = map.data.iter().chain(&map.redundancy).copied().collect();
        let Some(role) = roles.iter().position(|&r| r == m) else {
            return Ok(None);
        };
        let ready = if self.layout.is_parity() {
            let serving: Vec<bool> = roles
                .iter()
                .map(|&other| other != m && self.serves(other, stripe))
                .collect();
            let mut shards = vec![vec![0u8; rows as usize * self.unit]; roles.len()];
            let mut present = vec![false; roles.len()];
            // A second unreadable member is one more erasure, not an error yet; a third
            // (a member failed besides) is read again. A correction that fails after all
            // passes on the caller's error, so the erasures' own are not kept.
            let (read_ns, retries) = read_shards(&serving, &mut present, self.layout.m, |i| {
                let read =
                    self.member_read_once(roles[i], stripe, row, rows, now_ns, &mut shards[i]);
                as_erasure(read, &mut None)
            })?;
            self.stats.read_retries += retries;
            let done = read_ns.max(now_ns);
            // A parity write holds the array's codec while it reads (and so may land here);
            // a rare correction then builds its own.
            let built;
            let codec = match self.codec.as_deref() {
                Some(codec) => codec,
                None => {
                    built = afa_parity::codec(self.layout.k, self.layout.m)
                        .map_err(|_| DeviceError::Failed)?;
                    &*built
                }
            };
            let mut refs: Vec<&mut [u8]> = shards.iter_mut().map(|s| s.as_mut_slice()).collect();
            if codec.reconstruct(&mut refs, &present).is_err() {
                return Ok(None);
            }
            out.copy_from_slice(&shards[role]);
            let rebuilt = self.layout.k * rows as usize * self.info.sector_bytes as usize;
            done + self.parity_ns(rebuilt)
        } else {
            // Every other serving copy in turn, until one reads.
            let mut tried = vec![m];
            let first_pass = loop {
                let Some(copy) = self.surviving_copy_except(&map, role, stripe, &tried) else {
                    break None;
                };
                let member = roles[copy];
                match self.member_read_once(member, stripe, row, rows, now_ns, out) {
                    Ok(t) => break Some(t),
                    Err(DeviceError::Uncorrectable { .. }) => tried.push(member),
                    Err(e) => return Err(e),
                }
            };
            match first_pass {
                Some(t) => t,
                // Every copy failed once: each is read again, `m` included.
                None if tried.len() > 1 => {
                    let (read, retries) = read_copies_again(&tried, &mut None, |member| {
                        self.member_read_once(member, stripe, row, rows, now_ns, out)
                    })?;
                    self.stats.read_retries += retries;
                    match read {
                        Some(t) => t,
                        None => return Ok(None),
                    }
                }
                None => return Ok(None),
            }
        };
        self.stats.read_errors_corrected += 1;
        // The rewrite goes out once the data is rebuilt; the reader does not wait for it.
        self.member_write(m, stripe, row, rows, ready, out)?;
        Ok(Some(ready))
    }

    fn member_read_once(
        &mut self,
        m: usize,
        stripe: u64,
        row: u32,
        rows: u32,
        now_ns: TimeNs,
        out: &mut [u8],
    ) -> Result<TimeNs, DeviceError> {
        let lba = self.member_lba(stripe, row);
        self.stats.member_read_sectors += rows as u64;
        self.count_command(rows);
        let c = self.members[m].device.submit(
            now_ns,
            &Command::read(lba, rows),
            ReadBuffers {
                data: out,
                tags: None,
            },
        )?;
        Ok(c.done_ns)
    }

    fn member_write(
        &mut self,
        m: usize,
        stripe: u64,
        row: u32,
        rows: u32,
        now_ns: TimeNs,
        data: &[u8],
    ) -> Result<TimeNs, DeviceError> {
        let lba = self.member_lba(stripe, row);
        self.stats.member_write_sectors += rows as u64;
        self.count_command(rows);
        let mut cmd = Command::write(lba, rows, data);
        cmd.flags.fua = self.member_fua;
        let c = self.members[m]
            .device
            .submit(now_ns, &cmd, ReadBuffers::none())?;
        Ok(c.done_ns)
    }

    /// Splits a volume range into per-stripe pieces, counting each as host work.
    fn pieces(&mut self, lba: u64, sectors: u32) -> Vec<(u64, Vec<Piece>)> {
        let out = self.split(lba, sectors);
        self.work.chunks += out.iter().map(|(_, v)| v.len() as u64).sum::<u64>();
        out
    }

    /// Splits a volume range into per-stripe pieces.
    fn split(&self, lba: u64, sectors: u32) -> Vec<(u64, Vec<Piece>)> {
        let cs = self.chunk_sectors as u64;
        let stripe_sectors = cs * self.layout.k as u64;
        let mut out: Vec<(u64, Vec<Piece>)> = Vec::new();
        let mut at = lba;
        let end = lba + sectors as u64;
        while at < end {
            let stripe = at / stripe_sectors;
            let within = at % stripe_sectors;
            let index = (within / cs) as usize;
            let row = (within % cs) as u32;
            let rows = (cs - row as u64).min(end - at) as u32;
            let piece = Piece {
                index,
                row,
                rows,
                cmd_offset: at - lba,
            };
            match out.last_mut() {
                Some((s, v)) if *s == stripe => v.push(piece),
                _ => out.push((stripe, vec![piece])),
            }
            at += rows as u64;
        }
        out
    }

    /// The time the host takes to run `bytes` of data through the parity code (also
    /// counted as host work).
    fn parity_ns(&mut self, bytes: usize) -> u64 {
        if self.in_background {
            self.work.background_parity_bytes += bytes as u64;
        } else {
            self.work.parity_bytes += bytes as u64;
        }
        transfer_ns(bytes as u64, self.config.parity_mb_s)
    }

    /// Counts one member command of `rows` sectors as host work.
    fn count_command(&mut self, rows: u32) {
        if self.in_background {
            self.work.background_commands += 1;
            self.work.background_bytes += rows as u64 * self.info.sector_bytes as u64;
        } else {
            self.work.member_commands += 1;
        }
    }

    fn write(&mut self, now_ns: TimeNs, cmd: &Command<'_>) -> Result<TimeNs, DeviceError> {
        if self.layout.level == Level::Raid5f {
            let stripe_sectors = self.chunk_sectors as u64 * self.layout.k as u64;
            if cmd.lba % stripe_sectors != 0 || cmd.sectors as u64 % stripe_sectors != 0 {
                return Err(DeviceError::Unsupported(format!(
                    "raid5f accepts only full-stripe writes ({} sectors, aligned); got {} sectors at {}",
                    stripe_sectors, cmd.sectors, cmd.lba
                )));
            }
        }
        self.stats.user_write_sectors += cmd.sectors as u64;
        let mut done = now_ns;
        let cached = self.config.stripe_cache_stripes > 0
            && self.layout.is_parity()
            && self.layout.level != Level::Raid5f;
        let cs = self.chunk_sectors;
        for (stripe, pieces) in self.pieces(cmd.lba, cmd.sectors) {
            let full =
                pieces.len() == self.layout.k && pieces.iter().all(|p| p.row == 0 && p.rows == cs);
            if cached {
                if !full && !cmd.flags.fua {
                    done = done.max(self.cache_write(stripe, &pieces, cmd.data, now_ns)?);
                    continue;
                }
                // A full stripe supersedes what the cache holds of it; a FUA write first
                // writes back the stripe's cached sectors so it lands after them.
                if let Some(i) = self.cache.iter().position(|e| e.stripe == stripe) {
                    let entry = self.cache.swap_remove(i);
                    if !full {
                        done = done.max(self.write_back(entry, now_ns)?);
                    }
                }
            }
            let t = if self.layout.is_parity() {
                self.write_parity_stripe(stripe, &pieces, cmd.data, now_ns)?
            } else {
                self.write_plain_stripe(stripe, &pieces, cmd.data, now_ns)?
            };
            done = done.max(t);
        }
        Ok(done)
    }

    /// Puts a partial-stripe write into the stripe cache. Returns when the write is in
    /// host memory (after waiting for a free cache slot if every slot is taken).
    fn cache_write(
        &mut self,
        stripe: u64,
        pieces: &[Piece],
        data: &[u8],
        now_ns: TimeNs,
    ) -> Result<TimeNs, DeviceError> {
        let cs = self.chunk_sectors as usize;
        let k = self.layout.k;
        let unit = self.unit;
        let mut t = now_ns;
        let index = match self.cache.iter().position(|e| e.stripe == stripe) {
            Some(i) => i,
            None => {
                while self.cache_inflight.peek().is_some_and(|r| r.0 <= t) {
                    self.cache_inflight.pop();
                }
                let capacity = self.config.stripe_cache_stripes as usize;
                if self.cache.len() + self.cache_inflight.len() >= capacity
                    && !self.cache.is_empty()
                {
                    // Evict the least recently used stripe: written back as it is.
                    let lru = (0..self.cache.len())
                        .min_by_key(|&i| self.cache[i].last_use)
                        .expect("the cache is not empty");
                    let entry = self.cache.swap_remove(lru);
                    self.stats.stripe_cache_evictions += 1;
                    let done = self.write_back(entry, t)?;
                    self.cache_inflight.push(std::cmp::Reverse(done));
                }
                while self.cache.len() + self.cache_inflight.len() >= capacity {
                    // Every slot holds a stripe being written: wait for the first to finish.
                    let std::cmp::Reverse(free) = self
                        .cache_inflight
                        .pop()
                        .expect("a full cache with no entries has writes in flight");
                    t = t.max(free);
                }
                self.cache.push(CachedStripe {
                    stripe,
                    data: vec![0u8; k * cs * unit],
                    present: vec![false; k * cs],
                    present_count: 0,
                    last_use: 0,
                });
                self.cache.len() - 1
            }
        };
        self.stats.stripe_cache_writes += 1;
        self.cache_clock += 1;
        let mut bytes = 0u64;
        {
            let entry = &mut self.cache[index];
            entry.last_use = self.cache_clock;
            for p in pieces {
                let src = &data[p.cmd_offset as usize * unit..][..p.rows as usize * unit];
                let at = p.index * cs + p.row as usize;
                entry.data[at * unit..(at + p.rows as usize) * unit].copy_from_slice(src);
                for present in &mut entry.present[at..at + p.rows as usize] {
                    if !*present {
                        *present = true;
                        entry.present_count += 1;
                    }
                }
                bytes += p.rows as u64 * self.info.sector_bytes as u64;
            }
        }
        // Copying into host memory at the parity engine's memory rate.
        let t = t + transfer_ns(bytes, self.config.parity_mb_s);
        if self.cache[index].present_count as usize == k * cs {
            let entry = self.cache.swap_remove(index);
            self.stats.stripe_cache_full_stripes += 1;
            let done = self.write_back(entry, t)?;
            self.cache_inflight.push(std::cmp::Reverse(done));
        }
        Ok(t)
    }

    /// Writes a cached stripe's present sectors to the members (a full-stripe write when
    /// every sector is present).
    fn write_back(&mut self, entry: CachedStripe, now_ns: TimeNs) -> Result<TimeNs, DeviceError> {
        let cs = self.chunk_sectors as usize;
        let mut pieces = Vec::new();
        let mut data = Vec::with_capacity(entry.present_count as usize * self.unit);
        let mut offset_sectors = 0u64;
        for index in 0..self.layout.k {
            let mut row = 0;
            while row < cs {
                if !entry.present[index * cs + row] {
                    row += 1;
                    continue;
                }
                let start = row;
                while row < cs && entry.present[index * cs + row] {
                    row += 1;
                }
                let at = index * cs + start;
                pieces.push(Piece {
                    index,
                    row: start as u32,
                    rows: (row - start) as u32,
                    cmd_offset: offset_sectors,
                });
                offset_sectors += (row - start) as u64;
                data.extend_from_slice(&entry.data[at * self.unit..(at + row - start) * self.unit]);
            }
        }
        self.write_parity_stripe(entry.stripe, &pieces, &data, now_ns)
    }

    /// Writes every cached stripe back. Returns when the last write is done.
    fn drain_cache(&mut self, now_ns: TimeNs) -> Result<TimeNs, DeviceError> {
        let mut done = now_ns;
        while let Some(entry) = self.cache.pop() {
            self.stats.stripe_cache_evictions += 1;
            done = done.max(self.write_back(entry, now_ns)?);
        }
        while let Some(std::cmp::Reverse(t)) = self.cache_inflight.pop() {
            done = done.max(t);
        }
        Ok(done)
    }

    /// Copies the stripe cache's sectors over what was read from the members.
    fn overlay_cache(&self, cmd: &Command<'_>, out: &mut [u8]) {
        if self.cache.is_empty() || self.unit == 0 {
            return;
        }
        let cs = self.chunk_sectors as u64;
        let stripe_sectors = cs * self.layout.k as u64;
        let unit = self.unit;
        for entry in &self.cache {
            let base = entry.stripe * stripe_sectors;
            let from = cmd.lba.max(base);
            let to = (cmd.lba + cmd.sectors as u64).min(base + stripe_sectors);
            for lba in from..to {
                let within = (lba - base) as usize;
                if entry.present[within] {
                    let dst = (lba - cmd.lba) as usize * unit;
                    out[dst..dst + unit]
                        .copy_from_slice(&entry.data[within * unit..(within + 1) * unit]);
                }
            }
        }
    }

    fn piece_data<'a>(&self, data: &'a [u8], p: &Piece) -> &'a [u8] {
        let start = p.cmd_offset as usize * self.unit;
        &data[start..start + p.rows as usize * self.unit]
    }

    /// RAID 0/1/10: each piece to its member and to every serving copy.
    fn write_plain_stripe(
        &mut self,
        stripe: u64,
        pieces: &[Piece],
        data: &[u8],
        now_ns: TimeNs,
    ) -> Result<TimeNs, DeviceError> {
        let map = self.layout.stripe(stripe);
        let k = map.data.len();
        let copies = map.redundancy.len() / k.max(1);
        let mut done = now_ns;
        for p in pieces {
            let bytes = self.piece_data(data, p);
            let mut targets = vec![map.data[p.index]];
            targets.extend((0..copies).map(|j| map.redundancy[p.index * copies + j]));
            if !targets.iter().any(|&m| self.serves(m, stripe)) {
                // Every copy is gone: the data cannot be stored.
                return Err(DeviceError::Failed);
            }
            for m in targets {
                // Only serving copies are written; a member being rebuilt gets this stripe
                // from a copy when the rebuild reaches it.
                if self.serves(m, stripe) {
                    done = done.max(self.member_write(m, stripe, p.row, p.rows, now_ns, bytes)?);
                }
            }
        }
        Ok(done)
    }

    /// RAID 4/5/6 (and 5f): full-stripe, read-modify-write or reconstruct-write.
    fn write_parity_stripe(
        &mut self,
        stripe: u64,
        pieces: &[Piece],
        data: &[u8],
        now_ns: TimeNs,
    ) -> Result<TimeNs, DeviceError> {
        let map = self.layout.stripe(stripe);
        let (k, m) = (self.layout.k, self.layout.m);
        let cs = self.chunk_sectors;
        let row0 = pieces.iter().map(|p| p.row).min().unwrap_or(0);
        let row1 = pieces.iter().map(|p| p.row + p.rows).max().unwrap_or(0);
        let rows = row1 - row0;
        let unit = self.unit;
        let degraded = self.stripe_degraded(&map, stripe);
        let full = pieces.len() == k && pieces.iter().all(|p| p.row == 0 && p.rows == cs);
        // Sectors each strategy must read: the old data of the pieces and the old parity
        // (read-modify-write), or every data row the write does not supply
        // (reconstruct-write). mdraid picks the cheaper the same way.
        let rmw_reads: u64 =
            pieces.iter().map(|p| p.rows as u64).sum::<u64>() + (m as u64) * rows as u64;
        let supplied: u64 = pieces.iter().map(|p| p.rows as u64).sum();
        let rcw_reads = k as u64 * rows as u64 - supplied;
        let codec = self.codec.take().expect("parity level has a codec");
        let partial = StripeWrite {
            stripe,
            map: &map,
            pieces,
            data,
            row0,
            rows,
            now_ns,
        };
        let result = if full && !degraded {
            self.stats.full_stripe_writes += 1;
            let shards: Vec<&[u8]> = pieces.iter().map(|p| self.piece_data(data, p)).collect();
            let mut parity = vec![vec![0u8; cs as usize * unit]; m];
            {
                let mut prefs: Vec<&mut [u8]> =
                    parity.iter_mut().map(|v| v.as_mut_slice()).collect();
                codec
                    .encode(&shards, &mut prefs)
                    .map_err(|_| DeviceError::Failed)?;
            }
            let t = now_ns + self.parity_ns(k * cs as usize * self.info.sector_bytes as usize);
            let mut done = t;
            for p in pieces {
                let bytes = self.piece_data(data, p);
                done = done.max(self.member_write(map.data[p.index], stripe, 0, cs, t, bytes)?);
            }
            for (j, par) in parity.iter().enumerate() {
                done = done.max(self.member_write(map.redundancy[j], stripe, 0, cs, t, par)?);
            }
            Ok(done)
        } else if !degraded && rmw_reads < rcw_reads {
            self.stats.read_modify_writes += 1;
            self.read_modify_write(&*codec, &partial)
        } else {
            self.stats.reconstruct_writes += 1;
            self.reconstruct_write(&*codec, &partial)
        };
        self.codec = Some(codec);
        result
    }

    fn read_modify_write(
        &mut self,
        codec: &dyn ErasureCodec,
        w: &StripeWrite<'_>,
    ) -> Result<TimeNs, DeviceError> {
        let StripeWrite {
            stripe,
            map,
            pieces,
            data,
            row0,
            rows,
            now_ns,
        } = *w;
        let unit = self.unit;
        let mut t_read = now_ns;
        let mut olds = Vec::with_capacity(pieces.len());
        for p in pieces {
            let mut buf = vec![0u8; p.rows as usize * unit];
            t_read = t_read.max(self.member_read(
                map.data[p.index],
                stripe,
                p.row,
                p.rows,
                now_ns,
                &mut buf,
            )?);
            olds.push(buf);
        }
        let mut parity = Vec::with_capacity(map.redundancy.len());
        for &pm in &map.redundancy {
            let mut buf = vec![0u8; rows as usize * unit];
            t_read = t_read.max(self.member_read(pm, stripe, row0, rows, now_ns, &mut buf)?);
            parity.push(buf);
        }
        let mut work = 0;
        for (p, old) in pieces.iter().zip(&olds) {
            let new = self.piece_data(data, p);
            let off = (p.row - row0) as usize * unit;
            for (j, par) in parity.iter_mut().enumerate() {
                codec
                    .update_parity(j, p.index, old, new, &mut par[off..off + new.len()])
                    .map_err(|_| DeviceError::Failed)?;
                // The update runs three buffers through the XOR: old data, new data and the
                // old parity.
                work += 3 * p.rows as usize;
            }
        }
        let t = t_read + self.parity_ns(work * self.info.sector_bytes as usize);
        let mut done = t;
        for p in pieces {
            let bytes = self.piece_data(data, p);
            done =
                done.max(self.member_write(map.data[p.index], stripe, p.row, p.rows, t, bytes)?);
        }
        for (j, par) in parity.iter().enumerate() {
            done = done.max(self.member_write(map.redundancy[j], stripe, row0, rows, t, par)?);
        }
        Ok(done)
    }

    /// Reads every row the write does not supply (reconstructing rows of failed members from
    /// parity), computes the parity of the new rows, writes the pieces and the parity to the
    /// members that serve the stripe.
    fn reconstruct_write(
        &mut self,
        codec: &dyn ErasureCodec,
        w: &StripeWrite<'_>,
    ) -> Result<TimeNs, DeviceError> {
        let StripeWrite {
            stripe,
            map,
            pieces,
            data,
            row0,
            rows,
            now_ns,
        } = *w;
        let unit = self.unit;
        let (k, m) = (self.layout.k, self.layout.m);
        let degraded = self.stripe_degraded(map, stripe);
        // Old rows: all shards if degraded (a failed data member's rows come from parity),
        // otherwise only the data rows the write leaves untouched.
        let (mut shards, present, t_read) = if degraded {
            self.read_stripe_rows(stripe, map, row0, rows, now_ns, None)?
        } else {
            let mut shards = vec![vec![0u8; rows as usize * unit]; k + m];
            let mut t = now_ns;
            for (i, shard) in shards.iter_mut().enumerate().take(k) {
                let covered = pieces
                    .iter()
                    .any(|p| p.index == i && p.row == row0 && p.rows == rows);
                if !covered {
                    t = t.max(self.member_read(map.data[i], stripe, row0, rows, now_ns, shard)?);
                }
            }
            (shards, vec![true; k + m], t)
        };
        if degraded && present.iter().any(|&p| !p) {
            let mut refs: Vec<&mut [u8]> = shards.iter_mut().map(|s| s.as_mut_slice()).collect();
            codec
                .reconstruct(&mut refs, &present)
                .map_err(|_| DeviceError::Failed)?;
        }
        for p in pieces {
            let new = self.piece_data(data, p);
            let off = (p.row - row0) as usize * unit;
            shards[p.index][off..off + new.len()].copy_from_slice(new);
        }
        {
            let (data_shards, parity_shards) = shards.split_at_mut(k);
            let drefs: Vec<&[u8]> = data_shards.iter().map(|s| s.as_slice()).collect();
            let mut prefs: Vec<&mut [u8]> =
                parity_shards.iter_mut().map(|s| s.as_mut_slice()).collect();
            codec
                .encode(&drefs, &mut prefs)
                .map_err(|_| DeviceError::Failed)?;
        }
        let t = t_read + self.parity_ns(k * rows as usize * self.info.sector_bytes as usize);
        let mut done = t;
        for p in pieces {
            let member = map.data[p.index];
            if self.writable(member, stripe) {
                let bytes = self.piece_data(data, p);
                done = done.max(self.member_write(member, stripe, p.row, p.rows, t, bytes)?);
            }
        }
        for j in 0..m {
            let member = map.redundancy[j];
            if self.writable(member, stripe) {
                let par = shards[k + j].clone();
                done = done.max(self.member_write(member, stripe, row0, rows, t, &par)?);
            }
        }
        Ok(done)
    }

    /// Whether a write should reach member `m` for `stripe`: only members serving it; a member
    /// being rebuilt gets the stripe regenerated when the rebuild reaches it.
    fn writable(&self, m: usize, stripe: u64) -> bool {
        self.serves(m, stripe)
    }

    fn read(
        &mut self,
        now_ns: TimeNs,
        cmd: &Command<'_>,
        out: &mut [u8],
    ) -> Result<TimeNs, DeviceError> {
        let unit = self.unit;
        let mut done = now_ns;
        for (stripe, pieces) in self.pieces(cmd.lba, cmd.sectors) {
            let map = self.layout.stripe(stripe);
            for p in &pieces {
                let dst_start = p.cmd_offset as usize * unit;
                let dst_len = p.rows as usize * unit;
                let primary = map.data[p.index];
                if self.serves(primary, stripe) {
                    let t = self.member_read(
                        primary,
                        stripe,
                        p.row,
                        p.rows,
                        now_ns,
                        &mut out[dst_start..dst_start + dst_len],
                    )?;
                    done = done.max(t);
                    continue;
                }
                self.stats.degraded_reads += 1;
                if !self.layout.is_parity() {
                    let copy = self
                        .surviving_copy(&map, p.index, stripe, None)
                        .ok_or(DeviceError::Failed)?;
                    let k = map.data.len();
                    let member = if copy < k {
                        map.data[copy]
                    } else {
                        map.redundancy[copy - k]
                    };
                    let t = self.member_read(
                        member,
                        stripe,
                        p.row,
                        p.rows,
                        now_ns,
                        &mut out[dst_start..dst_start + dst_len],
                    )?;
                    done = done.max(t);
                    continue;
                }
                let (mut shards, present, t) =
                    self.read_stripe_rows(stripe, &map, p.row, p.rows, now_ns, None)?;
                let codec = self.codec.as_ref().expect("parity level has a codec");
                let mut refs: Vec<&mut [u8]> =
                    shards.iter_mut().map(|s| s.as_mut_slice()).collect();
                codec
                    .reconstruct(&mut refs, &present)
                    .map_err(|_| DeviceError::Failed)?;
                out[dst_start..dst_start + dst_len].copy_from_slice(&shards[p.index]);
                let rebuilt = self.layout.k * p.rows as usize * self.info.sector_bytes as usize;
                done = done.max(t + self.parity_ns(rebuilt));
            }
        }
        Ok(done)
    }

    fn trim(&mut self, now_ns: TimeNs, cmd: &Command<'_>) -> Result<TimeNs, DeviceError> {
        let cs = self.chunk_sectors;
        let mut done = now_ns;
        for (stripe, pieces) in self.pieces(cmd.lba, cmd.sectors) {
            let whole =
                pieces.len() == self.layout.k && pieces.iter().all(|p| p.row == 0 && p.rows == cs);
            if let Some(i) = self.cache.iter().position(|e| e.stripe == stripe) {
                if whole {
                    self.cache.swap_remove(i);
                } else {
                    // The cached stripe takes the zeroes, so a read sees the trim.
                    let (shifted, sectors) = rebased(&pieces);
                    let zeros = vec![0u8; sectors as usize * self.unit];
                    done = done.max(self.cache_write(stripe, &shifted, &zeros, now_ns)?);
                    continue;
                }
            }
            if whole {
                // Zero data gives zero parity in every code, so trimming the whole stripe on
                // every member keeps it consistent.
                let lba = self.member_lba(stripe, 0);
                for m in 0..self.members.len() {
                    if self.serves(m, stripe) {
                        self.work.member_commands += 1;
                        let c = self.members[m].device.submit(
                            now_ns,
                            &Command::trim(lba, cs),
                            ReadBuffers::none(),
                        )?;
                        done = done.max(c.done_ns);
                    }
                }
                continue;
            }
            // A partial trim writes zeroes, so that parity (or the copies) stays consistent.
            let (shifted, sectors) = rebased(&pieces);
            let zeros = vec![0u8; sectors as usize * self.unit];
            let t = if self.layout.is_parity() {
                self.write_parity_stripe(stripe, &shifted, &zeros, now_ns)?
            } else {
                self.write_plain_stripe(stripe, &shifted, &zeros, now_ns)?
            };
            done = done.max(t);
        }
        Ok(done)
    }
}

impl<D: BlockDevice> BlockDevice for Array<D> {
    fn info(&self) -> DeviceInfo {
        self.info
    }

    /// The members' and the spares' flash faults together.
    fn media_faults(&self) -> afa_nand::MediaFaults {
        let members = self.members.iter().map(|m| m.device.media_faults());
        members
            .chain(self.spares.iter().map(|s| s.media_faults()))
            .sum()
    }

    /// A volume sector whose data member serves its stripe is read from that member at a
    /// fixed place (`read`), so it is allocated when that member's sector is, or when the
    /// stripe cache holds its stripe (acknowledged data no member has yet). One whose data
    /// member is failed, or not yet rebuilt there, is read from the other members, whose
    /// sectors say nothing about it alone, so it counts as data: a hole reported wrongly
    /// would lose it from a sparse copy, data reported wrongly costs only a read of zeroes.
    /// An array whose serving data members cannot say does not say either.
    fn allocation(&self, lba: u64, sectors: u32) -> Option<Vec<(u32, bool)>> {
        let end = lba.checked_add(sectors as u64)?;
        if end > self.info.capacity_sectors {
            return None;
        }
        let mut runs = Vec::new();
        for (stripe, pieces) in self.split(lba, sectors) {
            if self.cache.iter().any(|c| c.stripe == stripe) {
                let rows = pieces.iter().map(|p| p.rows).sum();
                afa_ssd::push_allocation_run(&mut runs, rows, true);
                continue;
            }
            let map = self.layout.stripe(stripe);
            for p in pieces {
                let primary = map.data[p.index];
                if !self.serves(primary, stripe) {
                    afa_ssd::push_allocation_run(&mut runs, p.rows, true);
                    continue;
                }
                let device = &self.members[primary].device;
                for (n, allocated) in device.allocation(self.member_lba(stripe, p.row), p.rows)? {
                    afa_ssd::push_allocation_run(&mut runs, n, allocated);
                }
            }
        }
        Some(runs)
    }

    fn submit(
        &mut self,
        now_ns: TimeNs,
        cmd: &Command<'_>,
        out: ReadBuffers<'_>,
    ) -> Result<Completion, DeviceError> {
        validate_command(&self.info, cmd, &out)?;
        self.apply_scheduled_failures(now_ns)?;
        self.advance_rebuild(now_ns)?;
        let done_ns = match cmd.opcode {
            Opcode::Read => {
                let before = self.stats.degraded_reads;
                let t = self.read(now_ns, cmd, out.data)?;
                if self.stats.degraded_reads > before {
                    self.stats.degraded.record(t - now_ns);
                }
                self.overlay_cache(cmd, out.data);
                t
            }
            Opcode::Write => {
                self.member_fua = cmd.flags.fua;
                let written = self.write(now_ns, cmd);
                self.member_fua = false;
                written?
            }
            Opcode::Trim => self.trim(now_ns, cmd)?,
            Opcode::Flush => {
                let drained = self.drain_cache(now_ns)?;
                let serving = self
                    .members
                    .iter_mut()
                    .filter(|m| m.state != MemberState::Failed)
                    .map(|m| &mut m.device);
                drained.max(flush_members(now_ns, serving, &mut self.work)?)
            }
        };
        Ok(Completion {
            done_ns,
            gc_active: false,
        })
    }

    fn prefetch(&self, _lba: u64, _stage: u8) {}

    fn take_host_work(&mut self) -> HostWork {
        std::mem::take(&mut self.work)
    }

    fn background(&mut self, now_ns: TimeNs) -> Option<TimeNs> {
        if self.apply_scheduled_failures(now_ns).is_err() {
            return None;
        }
        let mut next: Option<TimeNs> = self.scheduled_failures.next_ns();
        for m in &mut self.members {
            if let Some(t) = m.device.background(now_ns) {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        }
        if self.advance_rebuild(now_ns).is_ok() {
            let stripe_ns = transfer_ns(self.config.chunk_bytes, self.config.rebuild_mb_s);
            for m in &self.members {
                if let MemberState::Rebuilding { upto, started_ns } = m.state {
                    let due = started_ns + (upto + 1) * stripe_ns;
                    next = Some(next.map_or(due, |n| n.min(due)));
                }
            }
        }
        next
    }
}

#[cfg(test)]
mod tests;
