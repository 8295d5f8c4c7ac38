//! ScalaAFA (ATC '24): a user-space two-phase-write array whose conversion runs inside the
//! SSDs.
//!
//! Space (§5.1): each member is cut into a normal area of chunk rows and a transient area
//! sized like the SLC cache. Row i of the normal area across the k + m members is horizontal
//! hero (HH) i, bound to stripe i; k contiguous chunks of one member's transient area form a
//! vertical hero (VH). A hero group (HG) is one HH plus m VHs on the stripe's m parity
//! members.
//!
//! Permissions (§5.2): the space manager ([`space`]) grants heroes to I/O threads in batches
//! by message; a thread writes only into heroes it holds, asks again below a low-water mark,
//! returns its heroes when it ends and queues full HGs for conversion. When grants run dry
//! the manager converts, recalls unused heroes from threads (fewer from threads that asked
//! often), and runs array-level GC over stripes with holes.
//!
//! Placement (§5.3): a chunk written to slot j of stripe i goes (primary copy) to row i of
//! the slot's data member and (backup copies, flagged transient) to slot j of the HG's VHs,
//! one on each parity member — so each parity member gathers the whole stripe locally and
//! converts it with one `convert` command: no data crosses the host link. `scala-co` instead
//! converts on the host daemon (read, parity, write back); `scala-wr` does not flag backups
//! as transient.
//!
//! Metadata (§5.4): every chunk write carries (user chunk, slot, timestamp) in the sectors'
//! OOB tags; conversion computes parity over data and tags alike. [`ScalaAfa::recover`]
//! rebuilds the AMT and HGMT from the members alone (an OOB scan), and
//! [`ScalaAfa::recover_degraded`] and [`ScalaAfa::recover_without`] do so with up to m
//! members lost.
//!
//! Reads use the primary copy, or a replica while the home member reported GC; with a member
//! failed they use a replica or reconstruct from the stripe; a rebuild onto a spare restores
//! every row and VH.

mod checkpoint;
mod recovery;
mod space;
#[cfg(test)]
mod tests;
mod threaded;
#[cfg(test)]
mod threaded_tests;

pub use threaded::{InFlight, ThreadedScalaAfa};

use std::collections::BTreeSet;

use afa_parity::ErasureCodec;
use afa_sim::{transfer_ns, Calendar, TimeNs};
use afa_ssd::{
    validate_command, BlockDevice, Command, CommandFlags, Completion, ConvertCommand, DeviceError,
    DeviceInfo, HostWork, Opcode, ParityType, ReadBuffers,
};
use serde::{Deserialize, Serialize};

use crate::{ArrayConfig, ArrayError, DegradedReadLatency, FailureSchedule, Level};
use space::{SpaceManager, ThreadHeroes, ToManager, ToThread};

/// Which variant of the engine runs (§6.5's ablations).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScalaMode {
    /// Every design: conversion offloaded to the SSDs, backups flagged transient.
    Scalaafa,
    /// Conversion on the host daemon thread (Scala-CO).
    ScalaCo,
    /// Offloaded conversion, but backups not flagged transient (Scala-WR).
    ScalaWr,
}

/// How a write smaller than a chunk reaches the members.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SubChunkWrites {
    /// The chunk's current copy is read, the write merged into it, and the whole chunk
    /// written out of place into the open hero group. Every chunk copy stays as it was
    /// written, which crash recovery and the member-flush rules rely on.
    #[default]
    Merge,
    /// The public prototype's path (`bdev_afa.c`): while the chunk's stripe is still
    /// replicated (its hero group open or full, not yet converting), only the sectors
    /// written go to the primary and the backups, in place; a chunk never written gets a
    /// fresh slot holding only those sectors; a converted chunk is merged as above.
    /// A power cut can tear an update between the primary and a backup; recovery makes the
    /// copies agree again (`resync_replicas`). Simulation only: serve mode's threads, and
    /// recovery after a host crash over members with volatile caches (where an in-place
    /// update may destroy the only durable copy of a sector), refuse it.
    InPlace,
}

/// The `[array.scalaafa]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScalaAfaConfig {
    pub mode: ScalaMode,
    /// I/O threads of the engine; requests are handed to them in turn.
    pub io_threads: u32,
    /// HHs per grant (each comes with its m VHs).
    pub grant_batch_hhs: u32,
    /// A thread asks for more heroes when it holds fewer HHs than this (0: a quarter of a
    /// batch).
    pub low_water_hhs: u32,
    /// Transient area per member in bytes (0: `transient_fraction` of the member).
    pub transient_bytes: u64,
    pub transient_fraction: f64,
    /// Conversion starts when fewer than this fraction of the VHs are free (or when idle).
    pub convert_watermark_fraction: f64,
    /// Fraction of the normal area kept out of the volume, for out-of-place updates.
    pub spare_fraction: f64,
    /// Daemon thread: one message handled, in ns.
    pub daemon_message_ns: u64,
    /// Daemon thread: one device command issued and completed, in ns.
    pub daemon_command_ns: u64,
    /// Daemon thread: host-conversion memory copy rate, MB/s.
    pub daemon_copy_mb_s: f64,
    /// Daemon thread: host-conversion parity rate, MB/s.
    pub daemon_parity_mb_s: f64,
    /// Interval between checkpoints of the AMT and HGMT in milliseconds (0: none, and
    /// recovery scans every OOB area). Two checkpoint slots are reserved at the end of
    /// every member.
    pub checkpoint_interval_ms: f64,
    /// How writes smaller than a chunk are written (`merge` or `in-place`).
    pub sub_chunk_writes: SubChunkWrites,
}

impl Default for ScalaAfaConfig {
    fn default() -> Self {
        Self {
            mode: ScalaMode::Scalaafa,
            io_threads: 1,
            grant_batch_hhs: 1024,
            low_water_hhs: 0,
            transient_bytes: 0,
            transient_fraction: 0.05,
            convert_watermark_fraction: 0.5,
            spare_fraction: 0.1,
            daemon_message_ns: 200,
            daemon_command_ns: 1_100,
            daemon_copy_mb_s: 10_000.0,
            daemon_parity_mb_s: 12_000.0,
            checkpoint_interval_ms: 0.0,
            sub_chunk_writes: SubChunkWrites::Merge,
        }
    }
}

/// Counters of the engine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ScalaAfaStats {
    pub user_write_sectors: u64,
    pub chunks_written: u64,
    /// Writes smaller than a chunk that wrote only their sectors
    /// (`sub_chunk_writes = "in-place"`).
    pub in_place_writes: u64,
    pub member_read_sectors: u64,
    pub member_write_sectors: u64,
    pub stripes_converted: u64,
    pub convert_commands: u64,
    pub host_conversions: u64,
    pub grants: u64,
    pub recalls: u64,
    /// Half-filled open HGs the manager closed early because their VHs were the last of
    /// their members and no free row could be grouped without them (see `seal_blocking`).
    pub groups_sealed: u64,
    pub thread_messages: u64,
    pub daemon_messages: u64,
    pub gc_stripes: u64,
    pub gc_chunks_moved: u64,
    /// Cleans that ended early because the GC writer found no room for a move (see
    /// `collect_garbage`).
    pub gc_cleans_out_of_room: u64,
    pub replica_reads: u64,
    pub degraded_reads: u64,
    /// Primary reads that failed as uncorrectable and were answered from a replica or by
    /// decoding the stripe.
    pub read_errors_corrected: u64,
    /// Chunk reads made again because a decode found more shards unreadable than the
    /// stripe has parities (`reconstruct_rows`).
    pub read_retries: u64,
    #[serde(flatten)]
    pub degraded: DegradedReadLatency,
    pub units_rebuilt: u64,
    pub last_rebuild_ns: Option<u64>,
    /// Member commands the daemon issued for background work (host conversion, GC,
    /// rebuild), and the bytes they moved.
    pub daemon_commands: u64,
    pub daemon_bytes: u64,
    /// Time writers waited for heroes (grants, conversions, GC), summed, in ns.
    pub hero_wait_ns: u64,
    /// Checkpoints written, and the bytes of one copy of each.
    pub checkpoints: u64,
    pub checkpoint_bytes: u64,
    /// OOB tag areas (one chunk copy each) the last recovery read, and the sequence number
    /// of the checkpoint it started from.
    pub recovery_tag_reads: u64,
    pub recovered_checkpoint_seq: Option<u64>,
    /// Chunks the last recovery found in only some of their copies (a write the power cut)
    /// and dropped, and conversions it found stopped between parity members and finished.
    pub recovery_torn_chunks: u64,
    /// Copies the last verified recovery found whose data did not match the checksums in
    /// their tags (a host crash kept their tags without their data), and striped stripes
    /// whose parity it computed again.
    pub recovery_unwhole_copies: u64,
    pub recovery_resynced_stripes: u64,
    /// Chunk copies the last recovery found differing from their primary in some sectors
    /// (an in-place update the power cut between copies) and made agree again.
    pub recovery_resynced_copies: u64,
    pub recovery_finished_conversions: u64,
    pub first_conversion_ns: Option<TimeNs>,
}

const NONE: u32 = u32::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HhState {
    /// In the manager's free list.
    Free,
    /// Granted to a thread, not yet opened.
    Held,
    /// Being filled by a thread (or the GC writer).
    Open,
    /// All k slots written, waiting for conversion.
    Full,
    /// Conversion commands issued; the VHs return at `done_ns`.
    Converting,
    /// In the striping layout.
    Striped,
}

/// One stripe (bound to HH row i) and its HGMT entry.
#[derive(Debug, Clone)]
struct Stripe {
    state: HhState,
    /// User chunk held by each slot, or NONE (not written this generation, or overwritten).
    chunks: Vec<u32>,
    live: u32,
    filled: u32,
    /// The HG's VH on each parity member (HGMT's VH list), NONE once converted.
    vhs: Vec<u32>,
    /// Parity rows that could not be written (their member was down at conversion).
    parity_missing: u32,
    convert_done_ns: TimeNs,
    /// The oldest write timestamp of the copies in the row since its group opened (0 when
    /// unknown, as after a recovery): with members behind a volatile cache, a dead row may
    /// hold the last flushed version of a chunk only if this is not after the last flush.
    first_ts: u32,
    /// Whether the conversion in flight left the backups in the HG's VHs (issued while the
    /// volume was degraded, `holds_backups`): they must be trimmed before the VHs go back
    /// to the manager, even if the volume is whole again when the conversion ends.
    backups_kept: bool,
}

/// A dead hero kept from the manager until a member flush (see `ScalaAfa::unflushed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Held {
    /// An HH row whose chunks all died: it may hold the last flushed version of one.
    Row(u32),
    /// VH `.1` on member `.0`, of a stripe converted since the last flush: with a member
    /// lost, its backups are the only copies of that member's chunks until the parity that
    /// replaced them is durable (a host crash may keep the trim of the backups and lose the
    /// parity, or hand the VH to a group whose writes overwrite them).
    Vh(usize, u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MemberState {
    Alive,
    Failed,
    /// Units (HH rows, then VHs) below `upto` are rebuilt.
    Rebuilding {
        upto: u32,
        next_due_ns: TimeNs,
        started_ns: TimeNs,
    },
}

#[derive(Debug)]
struct Member<D> {
    device: D,
    state: MemberState,
    /// The member reported GC on its last completion: reads prefer replicas.
    gc_active: bool,
    /// The stripe each VH of this member belongs to, or NONE.
    vh_owner: Vec<u32>,
    /// Units (HH rows, then VHs) a replacement received whole since it joined: hero groups
    /// assembled after the failure write their rows and VHs from scratch, so the
    /// replacement serves them at once and the rebuild skips them.
    fresh: Vec<bool>,
}

/// A ScalaAFA volume over k + m member SSDs.
#[derive(Debug)]
pub struct ScalaAfa<D: BlockDevice> {
    config: ArrayConfig,
    scala: ScalaAfaConfig,
    k: usize,
    m: usize,
    members: Vec<Member<D>>,
    spares: Vec<D>,
    codec: Box<dyn ErasureCodec>,
    /// AMT: user chunk → AFA chunk (stripe · k + slot), NONE if unwritten.
    amt: Vec<u32>,
    /// The write timestamp of each mapped chunk's copy, for checkpoints.
    amt_ts: Vec<u32>,
    checkpoints: checkpoint::Checkpoints,
    stripes: Vec<Stripe>,
    /// Striped stripes by live chunks, for array-level GC.
    by_live: Vec<BTreeSet<u32>>,
    manager: SpaceManager,
    /// I/O threads, then the GC writer (the daemon's own writer).
    threads: Vec<ThreadHeroes>,
    /// The HG each thread is filling.
    open: Vec<Option<u32>>,
    next_thread: usize,
    /// Conversions in flight as (done, stripe).
    pending: Vec<(TimeNs, u32)>,
    /// The daemon's core: when it is busy handling messages and background work.
    daemon: Calendar,
    /// Write timestamp (§5.4's 32-bit timestamp), incremented per chunk written.
    clock: u32,
    rows: u32,
    vhs_per_member: u32,
    batch_hhs: usize,
    low_water: usize,
    gc_reserve: usize,
    scheduled_failures: FailureSchedule,
    info: DeviceInfo,
    unit: usize,
    tag_bytes: usize,
    chunk_sectors: u32,
    background_depth: u32,
    /// Array-level cleans in progress, one inside the other.
    gc_nesting: u32,
    work: HostWork,
    messages_taken: u64,
    stats: ScalaAfaStats,
    /// Members sit behind a volatile cache (a host's page cache): see
    /// [`ScalaAfa::keep_flushed_writes`].
    keep_flushed: bool,
    /// With `keep_flushed`, the heroes that died since the last member flush and may hold
    /// the only durable copy of a flushed chunk, each with the number of flushes started
    /// when it died: HH rows whose chunks all died, and converted stripes' VHs. Their
    /// copies stay on the members, and the heroes away from the manager, until a flush
    /// started after has made the newer copies (or the parity) durable.
    unflushed: Vec<(u64, Held)>,
    /// The write clock when the last member flush started (simulation; on threads the
    /// shared `Remote::flush_clock`): a copy with a later timestamp was written after it.
    flush_clock: u32,
    /// Dead heroes whose copies' replacements a flush has made durable: trimmed and handed
    /// out at the next flush, before its members flush, so that the trims are durable when
    /// it ends (an orderly stop's last flush leaves no trim in a volatile cache), or at once
    /// when the manager runs short.
    replaced: Vec<Held>,
    /// Set while the I/O threads run on OS threads of their own ([`ThreadedScalaAfa`]) and
    /// this engine is the daemon's state.
    remote: Option<threaded::Remote>,
}

/// Bytes of ScalaAFA metadata per sector tag: user chunk (4), slot (1), timestamp (4), the
/// copy's kind (1), and a checksum of the sector's payload (4). The first 72 bits are §5.4's
/// metadata; the kind tells recovery a primary from a backup; the checksum lets recovery
/// tell a copy whose tags reached the medium without its data (a host crash over member
/// files, whose page cache writes data and tag sidecar back in any order) from a whole one.
pub const META_TAG_BYTES: usize = 14;
/// Where the kind byte and the payload checksum sit in a sector's tag.
const KIND_AT: usize = 9;
const SUM_AT: usize = 10;
const KIND_PRIMARY: u8 = 1;
const KIND_BACKUP: u8 = 2;

/// The geometry both the engine and recovery derive from the members and the configuration.
#[derive(Debug, Clone, Copy)]
struct Shape {
    k: usize,
    m: usize,
    chunk_sectors: u32,
    rows: u32,
    vhs_per_member: u32,
    volume_chunks: u64,
    /// Chunks of one of the two checkpoint slots at the end of every member (0: none).
    checkpoint_slot_chunks: u32,
}

fn shape<D: BlockDevice>(
    config: &ArrayConfig,
    scala: &ScalaAfaConfig,
    members: &[D],
    spares: &[D],
) -> Result<(Shape, DeviceInfo), ArrayError> {
    let err = |s: String| ArrayError::Config(s);
    let m = match config.level {
        Level::Raid5 => 1,
        Level::Raid6 => 2,
        other => {
            return Err(err(format!(
                "scalaafa converts to raid5 or raid6 stripes, not {other:?}"
            )))
        }
    };
    let n = members.len();
    if n != config.members as usize || n < m + 2 {
        return Err(err(format!(
            "scalaafa needs array.members = {} devices and at least {} of them; got {n}",
            config.members,
            m + 2
        )));
    }
    let k = n - m;
    let s = &scala;
    if s.io_threads == 0 || s.io_threads > 256 {
        return Err(err(format!(
            "array.scalaafa.io_threads = {} must lie in 1..=256",
            s.io_threads
        )));
    }
    if s.grant_batch_hhs == 0 {
        return Err(err("array.scalaafa.grant_batch_hhs must be positive".into()));
    }
    if !(s.transient_fraction > 0.0 && s.transient_fraction < 0.5) {
        return Err(err(format!(
            "array.scalaafa.transient_fraction = {} must lie in (0, 0.5)",
            s.transient_fraction
        )));
    }
    if !(s.convert_watermark_fraction >= 0.0 && s.convert_watermark_fraction <= 1.0) {
        return Err(err(format!(
            "array.scalaafa.convert_watermark_fraction = {} must lie in [0, 1]",
            s.convert_watermark_fraction
        )));
    }
    if !(0.02..0.9).contains(&s.spare_fraction) {
        return Err(err(format!(
            "array.scalaafa.spare_fraction = {} must lie in [0.02, 0.9)",
            s.spare_fraction
        )));
    }
    let max_interval_ms = afa_sim::MAX_STEP_NS as f64 / afa_sim::NS_PER_MS as f64;
    if !(s.checkpoint_interval_ms >= 0.0 && s.checkpoint_interval_ms <= max_interval_ms) {
        return Err(err(format!(
            "array.scalaafa.checkpoint_interval_ms = {} must be zero (no checkpoints) or a \
             positive interval of at most an hour ({max_interval_ms} ms)",
            s.checkpoint_interval_ms
        )));
    }
    for (name, v) in [
        ("array.scalaafa.daemon_copy_mb_s", s.daemon_copy_mb_s),
        ("array.scalaafa.daemon_parity_mb_s", s.daemon_parity_mb_s),
    ] {
        afa_sim::check_bandwidth_mb_s(name, v).map_err(&err)?;
    }
    for (name, ns) in [
        ("array.scalaafa.daemon_message_ns", s.daemon_message_ns),
        ("array.scalaafa.daemon_command_ns", s.daemon_command_ns),
    ] {
        afa_sim::check_step_ns(name, ns).map_err(&err)?;
    }
    let (first, chunk_sectors, min_capacity) = crate::check_members(config, members, spares)?;
    let chunks = (min_capacity / chunk_sectors as u64).min(u32::MAX as u64 / 2);
    let transient_chunks = if s.transient_bytes > 0 {
        s.transient_bytes / config.chunk_bytes
    } else {
        (chunks as f64 * s.transient_fraction) as u64
    };
    let vhs_per_member = (transient_chunks / k as u64).min(chunks / 2 / k as u64) as u32;
    let checkpoint_slot_chunks = if s.checkpoint_interval_ms > 0.0 {
        checkpoint::slot_chunks(chunks, k, m, config.chunk_bytes)
    } else {
        0
    };
    let rows =
        (chunks as i64 - vhs_per_member as i64 * k as i64 - 2 * checkpoint_slot_chunks as i64)
            .max(0) as u32;
    let volume_chunks =
        ((rows as f64 * (1.0 - s.spare_fraction)) as u64 * k as u64).min(u32::MAX as u64 - 1);
    if vhs_per_member < 4 || rows < 16 {
        return Err(err(format!(
            "members of {chunks} chunks leave {rows} rows and {vhs_per_member} vertical heroes: \
             too small for a scalaafa volume"
        )));
    }
    Ok((
        Shape {
            k,
            m,
            chunk_sectors,
            rows,
            vhs_per_member,
            volume_chunks,
            checkpoint_slot_chunks,
        },
        first,
    ))
}

impl<D: BlockDevice> ScalaAfa<D> {
    /// Builds an empty volume; `config.level` is the striping layout (raid5: m = 1, raid6:
    /// m = 2).
    pub fn new(
        config: ArrayConfig,
        scala: ScalaAfaConfig,
        members: Vec<D>,
        spares: Vec<D>,
    ) -> Result<Self, ArrayError> {
        let (sh, first) = shape(&config, &scala, &members, &spares)?;
        let n = members.len();
        let threads = scala.io_threads as usize + 1;
        let free_hhs = (0..sh.rows).collect();
        let free_vhs = (0..n).map(|_| (0..sh.vhs_per_member).collect()).collect();
        let (manager, ends) = space::connect(threads, n, sh.m, free_hhs, free_vhs);
        let codec = afa_parity::codec(sh.k, sh.m).map_err(|e| ArrayError::Config(e.to_string()))?;
        let unit = first.payload_unit_bytes as usize;
        let tag_bytes = members
            .iter()
            .map(|d| d.info().tag_bytes_per_sector as usize)
            .min()
            .unwrap_or(0);
        // Every thread holding a full batch must leave the others something; a quarter of
        // the rows per thread at most.
        // A batch is at most a quarter of the rows per thread and half of all VHs; when
        // threads hold the rest, the manager recalls (§5.2).
        let batch_hhs = (scala.grant_batch_hhs as usize)
            .min((sh.rows as usize / (4 * threads)).max(1))
            .min(sh.vhs_per_member as usize * n / (sh.m * 2))
            .max(1);
        let low_water = if scala.low_water_hhs > 0 {
            (scala.low_water_hhs as usize).min(batch_hhs)
        } else {
            (batch_hhs / 4).max(1)
        };
        let info = DeviceInfo {
            sector_bytes: first.sector_bytes,
            capacity_sectors: sh.volume_chunks * sh.chunk_sectors as u64,
            payload_unit_bytes: first.payload_unit_bytes,
            tag_bytes_per_sector: 0,
            max_queue_depth: members.iter().map(|d| d.info().max_queue_depth).sum(),
            max_transfer_sectors: u32::MAX,
        };
        Ok(Self {
            members: members
                .into_iter()
                .map(|device| Member {
                    device,
                    state: MemberState::Alive,
                    gc_active: false,
                    vh_owner: vec![NONE; sh.vhs_per_member as usize],
                    fresh: Vec::new(),
                })
                .collect(),
            spares,
            codec,
            amt: vec![NONE; sh.volume_chunks as usize],
            amt_ts: vec![0; sh.volume_chunks as usize],
            checkpoints: checkpoint::Checkpoints {
                slot_chunks: sh.checkpoint_slot_chunks,
                ..checkpoint::Checkpoints::default()
            },
            stripes: vec![
                Stripe {
                    state: HhState::Free,
                    chunks: vec![NONE; sh.k],
                    live: 0,
                    filled: 0,
                    vhs: Vec::new(),
                    parity_missing: 0,
                    convert_done_ns: 0,
                    first_ts: 0,
                    backups_kept: false,
                };
                sh.rows as usize
            ],
            by_live: vec![BTreeSet::new(); sh.k + 1],
            manager,
            threads: ends,
            open: vec![None; threads],
            next_thread: 0,
            pending: Vec::new(),
            daemon: Calendar::default(),
            clock: 0,
            rows: sh.rows,
            vhs_per_member: sh.vhs_per_member,
            batch_hhs,
            low_water,
            gc_reserve: 2,
            scheduled_failures: FailureSchedule::default(),
            info,
            unit,
            tag_bytes,
            chunk_sectors: sh.chunk_sectors,
            background_depth: 0,
            gc_nesting: 0,
            work: HostWork::default(),
            messages_taken: 0,
            stats: ScalaAfaStats::default(),
            keep_flushed: false,
            unflushed: Vec::new(),
            replaced: Vec::new(),
            flush_clock: 0,
            remote: None,
            k: sh.k,
            m: sh.m,
            config,
            scala,
        })
    }

    /// Keeps every flushed write across a host crash, for members behind a volatile cache
    /// (member files under the host's page cache), whose commands since their last flush may
    /// each reach the medium or not, data and tags independently. A row whose chunks all
    /// died (overwritten, trimmed or moved by array-level GC) and which may hold the last
    /// flushed version of one (a copy written before the last flush started) is then
    /// neither trimmed nor handed out again until a member flush has made the chunks' newer
    /// copies durable. A row written wholly since holds no version a flush promised, and is
    /// freed at once. Recovery after such a crash is [`ScalaAfa::recover_with`] with
    /// `verify`.
    pub fn keep_flushed_writes(&mut self) {
        self.keep_flushed = true;
    }

    /// How many member flushes have started (on threads, counted by every caller of
    /// [`ThreadedScalaAfa::flush`]; the simulation releases everything at each flush).
    fn flushes_started(&self) -> u64 {
        self.remote.as_ref().map_or(0, |r| r.flushes_started())
    }

    /// The write clock when the latest member flush started.
    fn flushed_clock(&self) -> u32 {
        match &self.remote {
            Some(r) => r.flush_clock(),
            None => self.flush_clock,
        }
    }

    /// Notes that a member flush starts now: every copy written so far may be durable once
    /// it ends.
    fn flush_starts(&mut self) {
        let now = self.current_clock();
        match &self.remote {
            Some(r) => r.flush_starts(now),
            None => self.flush_clock = now,
        }
    }

    /// The rows that died before flush number `upto` started (every one with `u64::MAX`)
    /// have their chunks' newer copies durable now: they may be trimmed.
    fn mark_replaced(&mut self, upto: u64) {
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.unflushed)
            .into_iter()
            .partition(|&(started, _)| started < upto);
        self.unflushed = waiting;
        self.replaced
            .extend(ready.into_iter().map(|(_, held)| held));
    }

    /// Whether any hero waits for a member flush.
    fn holds_any(&self) -> bool {
        !self.unflushed.is_empty() || !self.replaced.is_empty()
    }

    /// Whether a VH of a converted stripe waits for a member flush.
    fn holds_vhs(&self) -> bool {
        let mut held = self.unflushed.iter().map(|(_, h)| h).chain(&self.replaced);
        held.any(|h| matches!(h, Held::Vh(..)))
    }

    /// Trims the dead heroes whose copies' replacements are durable and hands them back to
    /// the manager. Returns when the trims are done.
    fn release_replaced(&mut self, now_ns: TimeNs) -> Result<TimeNs, DeviceError> {
        let mut done = now_ns;
        self.background_depth += 1;
        let mut result = Ok(());
        let heroes = std::mem::take(&mut self.replaced);
        let vh_sectors = self.k as u32 * self.chunk_sectors;
        for (at, &held) in heroes.iter().enumerate() {
            let trimmed = match held {
                Held::Row(row) => {
                    let lba = self.hh_lba(row);
                    (0..self.members.len()).try_fold(now_ns, |t, i| {
                        Ok(t.max(self.member_trim(i, lba, self.chunk_sectors, now_ns)?))
                    })
                }
                Held::Vh(p, vh) => self.member_trim(p, self.vh_lba(vh, 0), vh_sectors, now_ns),
            };
            match trimmed {
                Ok(t) => done = done.max(t),
                Err(e) => {
                    // The heroes not trimmed stay held: none is handed out untrimmed.
                    self.replaced.extend_from_slice(&heroes[at..]);
                    result = Err(e);
                    break;
                }
            }
            match held {
                Held::Row(row) => self.release_hh(row),
                Held::Vh(p, vh) => self.release_vh(p, vh),
            }
        }
        self.background_depth -= 1;
        result.map(|()| done)
    }

    /// Trims and hands out the rows an earlier flush made redundant, flushes the serving
    /// members (which makes those trims durable too), and marks every row that died before
    /// it redundant now. Returns when the flush is done.
    fn flush_and_release(&mut self, now_ns: TimeNs) -> Result<TimeNs, DeviceError> {
        let trimmed = self.release_replaced(now_ns)?;
        self.flush_starts();
        let flushed = self.flush_serving(trimmed)?;
        self.mark_replaced(u64::MAX);
        Ok(flushed)
    }

    /// A FLUSH of the volume: with `keep_flushed`, the release of the rows it makes
    /// redundant too.
    fn flush(&mut self, now_ns: TimeNs) -> Result<TimeNs, DeviceError> {
        if self.keep_flushed {
            self.flush_and_release(now_ns)
        } else {
            self.flush_serving(now_ns)
        }
    }

    /// Flushes every member that has not failed; returns when all are done.
    fn flush_serving(&mut self, now_ns: TimeNs) -> Result<TimeNs, DeviceError> {
        let serving = self
            .members
            .iter_mut()
            .filter(|m| m.state != MemberState::Failed)
            .map(|m| &mut m.device);
        crate::flush_members(now_ns, serving, &mut self.work)
    }

    pub fn stats(&self) -> &ScalaAfaStats {
        &self.stats
    }
    /// Zeroes the engine's counters, the messages its threads and daemon have counted, and
    /// hands every member and spare to `member` (see [`Array::reset_counters`]).
    pub fn reset_counters(&mut self, mut member: impl FnMut(&mut D)) {
        self.stats = ScalaAfaStats::default();
        self.threads.iter_mut().for_each(|t| t.messages = 0);
        self.messages_taken = 0;
        self.manager.messages = 0;
        self.manager.recalls = 0;
        self.members.iter_mut().for_each(|m| member(&mut m.device));
        self.spares.iter_mut().for_each(member);
    }
    pub fn scala_config(&self) -> &ScalaAfaConfig {
        &self.scala
    }
    pub fn members(&self) -> impl Iterator<Item = &D> {
        self.members.iter().map(|m| &m.device)
    }
    /// The member devices, to reset or read their own measurement counters; commands must
    /// still go through the engine, which alone knows where data lives.
    pub fn members_mut(&mut self) -> impl Iterator<Item = &mut D> {
        self.members.iter_mut().map(|m| &mut m.device)
    }
    pub fn chunk_sectors(&self) -> u32 {
        self.chunk_sectors
    }
    /// HH rows (stripes) in each member's normal area.
    pub fn rows(&self) -> u32 {
        self.rows
    }
    pub fn vhs_per_member(&self) -> u32 {
        self.vhs_per_member
    }
    /// Chunks currently held as replicas (in open or full hero groups).
    pub fn replicated_chunks(&self) -> u64 {
        self.stripes
            .iter()
            .filter(|s| matches!(s.state, HhState::Open | HhState::Full))
            .map(|s| s.filled as u64)
            .sum()
    }
    /// Takes the members back (the volume is dropped: a crash, for recovery tests).
    pub fn into_members(self) -> Vec<D> {
        self.members.into_iter().map(|m| m.device).collect()
    }

    // ----- geometry -----

    fn parity_member(&self, stripe: u32, r: usize) -> usize {
        space::parity_member(stripe, r, self.members.len())
    }
    fn data_member(&self, stripe: u32, j: usize) -> usize {
        space::parity_member(stripe, self.m + j, self.members.len())
    }
    fn hh_lba(&self, stripe: u32) -> u64 {
        stripe as u64 * self.chunk_sectors as u64
    }
    fn vh_lba(&self, vh: u32, slot: usize) -> u64 {
        (self.rows as u64 + vh as u64 * self.k as u64 + slot as u64) * self.chunk_sectors as u64
    }
    fn chunk_units(&self) -> usize {
        self.chunk_sectors as usize * self.unit
    }

    /// Whether `member` serves rebuild unit `unit` (HH row, or rows + VH number).
    fn serves(&self, member: usize, unit: u32) -> bool {
        match self.members[member].state {
            MemberState::Alive => true,
            MemberState::Failed => false,
            MemberState::Rebuilding { upto, .. } => {
                unit < upto || self.members[member].fresh.get(unit as usize) == Some(&true)
            }
        }
    }

    /// Marks a unit a replacement now receives whole.
    fn mark_fresh(&mut self, member: usize, unit: u32) {
        if let MemberState::Rebuilding { .. } = self.members[member].state {
            self.members[member].fresh[unit as usize] = true;
        }
    }
    fn serves_row(&self, member: usize, stripe: u32) -> bool {
        self.serves(member, stripe)
    }
    fn serves_vh(&self, member: usize, vh: u32) -> bool {
        self.serves(member, self.rows + vh)
    }
    /// Whether writes should go to `member` (a rebuilding member takes new writes: the
    /// rebuild skips what is already current only by rewriting it, which is harmless).
    fn writable(&self, member: usize) -> bool {
        self.members[member].state != MemberState::Failed
    }

    // ----- member I/O -----

    /// Counts a member command against the I/O thread that issues it. Background work
    /// (conversion, array-level GC, rebuild) is the daemon's: it runs on its own pinned core
    /// (§5.6) and costs the I/O threads nothing directly; what it costs them is the daemon's
    /// time, which delays grants (`daemon_at`).
    fn count_command(&mut self, sectors: u32) {
        if self.background_depth > 0 {
            self.stats.daemon_commands += 1;
            self.stats.daemon_bytes += sectors as u64 * self.info.sector_bytes as u64;
        } else {
            self.work.member_commands += 1;
        }
    }

    fn member_read(
        &mut self,
        member: usize,
        lba: u64,
        rows: u32,
        now_ns: TimeNs,
        out: &mut [u8],
    ) -> Result<TimeNs, DeviceError> {
        self.count_command(rows);
        self.stats.member_read_sectors += rows as u64;
        let c = self.members[member].device.submit(
            now_ns,
            &Command::read(lba, rows),
            ReadBuffers {
                data: out,
                tags: None,
            },
        )?;
        self.members[member].gc_active = c.gc_active;
        Ok(c.done_ns)
    }

    fn member_write(
        &mut self,
        member: usize,
        lba: u64,
        now_ns: TimeNs,
        data: &[u8],
        tags: Option<&[u8]>,
        transient: bool,
    ) -> Result<TimeNs, DeviceError> {
        let rows = self.chunk_sectors;
        self.member_write_rows(member, lba, rows, now_ns, data, tags, transient)
    }

    /// Writes `rows` sectors of a chunk copy (a whole chunk, or the piece an in-place
    /// update covers).
    #[allow(clippy::too_many_arguments)]
    fn member_write_rows(
        &mut self,
        member: usize,
        lba: u64,
        rows: u32,
        now_ns: TimeNs,
        data: &[u8],
        tags: Option<&[u8]>,
        transient: bool,
    ) -> Result<TimeNs, DeviceError> {
        self.count_command(rows);
        self.stats.member_write_sectors += rows as u64;
        let cmd = Command {
            opcode: Opcode::Write,
            lba,
            sectors: rows,
            data,
            tags,
            flags: CommandFlags {
                fua: false,
                transient,
            },
        };
        let c = self.members[member]
            .device
            .submit(now_ns, &cmd, ReadBuffers::none())?;
        self.members[member].gc_active = c.gc_active;
        Ok(c.done_ns)
    }

    fn member_trim(
        &mut self,
        member: usize,
        lba: u64,
        sectors: u32,
        now_ns: TimeNs,
    ) -> Result<TimeNs, DeviceError> {
        if !self.writable(member) {
            return Ok(now_ns);
        }
        self.count_command(0);
        let c = self.members[member].device.submit(
            now_ns,
            &Command::trim(lba, sectors),
            ReadBuffers::none(),
        )?;
        Ok(c.done_ns)
    }

    // ----- the space manager (daemon) -----

    /// Books `cost_ns` of the daemon's core at or after `at_ns`; returns when it is done.
    /// The daemon polls (SPDK): work whose input is ready only later, such as a host
    /// conversion's parity once its reads complete, does not keep it from messages and
    /// commands it can handle before then.
    fn daemon_at(&mut self, at_ns: TimeNs, cost_ns: u64) -> TimeNs {
        self.daemon.book(at_ns, cost_ns)
    }

    /// The daemon handles its inbox at `now_ns`: returns, full HGs and asks.
    fn serve_manager(&mut self, now_ns: TimeNs) -> Result<(), DeviceError> {
        self.recycle_done(now_ns)?;
        self.checkpoint_if_due(now_ns)?;
        while let Ok(msg) = self.manager.inbox.try_recv() {
            self.daemon_at(now_ns, self.scala.daemon_message_ns);
            self.take_message(msg, now_ns)?;
        }
        // The watermark counts the VHs of full HGs against all VHs: granted but unused VHs
        // are still free space, only waiting in a thread's hands.
        let total_vhs = (self.vhs_per_member as usize * self.members.len()) as f64;
        let full_vhs = (self.manager.full.iter().map(|l| l.len()).sum::<usize>() * self.m) as f64;
        // Conversion is paced: one HG per visit of the daemon, which outruns the threads
        // (they fill one HG per k chunks), so the SSDs interleave it with user writes
        // instead of taking a burst that would stall them.
        if total_vhs - full_vhs < total_vhs * self.scala.convert_watermark_fraction {
            self.convert_some_full(now_ns, 1)?;
        }
        // §5.2 path 4: array-level GC keeps a batch of HHs free for the next grant.
        if self.reclaimed_hhs() < self.gc_reserve + self.batch_hhs && self.background_depth == 0 {
            self.collect_garbage(now_ns)?;
        }
        // The GC writer's ask goes first: its grant is what lets a clean free rows, while
        // an I/O thread's ask may wait for that clean, and behind it the GC writer's would
        // never be answered.
        let gc_thread = self.scala.io_threads as usize;
        if let Some(pos) = self
            .manager
            .waiting
            .iter()
            .position(|&(t, _)| t == gc_thread)
        {
            if let Some(ask) = self.manager.waiting.remove(pos) {
                self.manager.waiting.push_front(ask);
            }
        }
        // The ask leaves the queue before it is granted: a grant may clean garbage, and the
        // clean may run the manager again, which must not answer (or drop) it twice.
        while let Some((thread, at_ns)) = self.manager.waiting.pop_front() {
            match self.grant(thread, at_ns.max(now_ns)) {
                Ok(true) => {}
                Ok(false) => {
                    self.manager.waiting.push_front((thread, at_ns));
                    break;
                }
                Err(e) => {
                    self.manager.waiting.push_front((thread, at_ns));
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Heroes the manager may give `thread`: I/O threads leave a reserve for the GC writer.
    fn grantable_hhs(&self, thread: usize) -> usize {
        let gc = thread == self.scala.io_threads as usize;
        let free = self.manager.free_hhs.len();
        if gc {
            free
        } else {
            free.saturating_sub(self.gc_reserve)
        }
    }

    /// Takes one HH with VHs on its parity members from the free lists.
    fn take_group(&mut self, thread: usize) -> Option<(u32, Vec<(usize, u32)>)> {
        if self.grantable_hhs(thread) == 0 {
            return None;
        }
        // The first free HH whose parity members all have a free VH (they rotate, so a
        // member short of VHs only skips the rows it is parity of).
        let pos = self.manager.free_hhs.iter().position(|&hh| {
            (0..self.m).all(|r| !self.manager.free_vhs[self.parity_member(hh, r)].is_empty())
        })?;
        let hh = self.manager.free_hhs.remove(pos)?;
        let mut vhs = Vec::with_capacity(self.m);
        for r in 0..self.m {
            let p = self.parity_member(hh, r);
            let vh = self.manager.free_vhs[p].pop_front()?;
            vhs.push((p, vh));
        }
        Some((hh, vhs))
    }

    /// Answers an ask with a batch. Returns false when nothing could be granted even after
    /// conversion, recall and GC.
    fn grant(&mut self, thread: usize, at_ns: TimeNs) -> Result<bool, DeviceError> {
        let mut hhs = Vec::new();
        let mut vhs = Vec::new();
        let mut ready = at_ns;
        for attempt in 0..5 {
            while hhs.len() < self.batch_hhs {
                match self.take_group(thread) {
                    Some((hh, v)) => {
                        self.stripes[hh as usize].state = HhState::Held;
                        hhs.push(hh);
                        vhs.extend(v);
                    }
                    None => break,
                }
            }
            if !hhs.is_empty() {
                break;
            }
            // Nothing free: make space, cheapest first.
            match attempt {
                // §5.2 path 3: no more heroes to grant, so recall unused ones.
                0 => self.recall(thread, at_ns)?,
                1 => {
                    // Heroes that died since the last member flush wait for one: when rows
                    // are what is short, or VHs wait too (a degraded volume's conversions
                    // keep theirs until a flush; otherwise conversion frees VHs), flush now
                    // and trim them at once.
                    let rows_short = self.grantable_hhs(thread) == 0;
                    if (rows_short || self.holds_vhs()) && self.holds_any() {
                        let flushed = self.flush_and_release(at_ns)?;
                        ready = ready.max(self.release_replaced(flushed)?);
                    }
                    // Heroes freed since the last snapshot wait for a checkpoint: write
                    // one now and wait for it.
                    if self.checkpointing() {
                        if !self.checkpoints.quarantine_hhs.is_empty()
                            || !self.checkpoints.quarantine_vhs.is_empty()
                        {
                            self.checkpoint(at_ns)?;
                        }
                        let counts = self.checkpoints.releasing.iter().map(|r| r.counts_at_ns);
                        if let Some(t) = counts.max() {
                            ready = ready.max(t);
                            self.release_checkpointed(t);
                        }
                    }
                    // Conversions free VHs when they end: start every full HG and wait
                    // for the earliest.
                    self.convert_all_full(at_ns)?;
                    if let Some(t) = self.recycle_earliest()? {
                        ready = ready.max(t);
                    }
                }
                2 => {
                    // Last resort: clean HHs, then wait for every conversion.
                    let t = self.collect_garbage(at_ns)?;
                    ready = self.convert_all_and_wait(ready.max(t))?;
                }
                3 => {
                    // Rows are free but every one needs a member whose VHs all sit in
                    // other threads' half-filled open groups: close those groups, as
                    // ending their threads would, and convert them to free their VHs.
                    let sealed = self.seal_blocking(thread, ready)?;
                    if sealed {
                        ready = self.convert_all_and_wait(ready)?;
                    }
                }
                _ => {}
            }
        }
        if hhs.is_empty() {
            return Ok(false);
        }
        let t = self.daemon_at(ready, self.scala.daemon_message_ns);
        self.stats.grants += 1;
        self.manager
            .send(thread, ToThread::Grant { hhs, vhs, at_ns: t });
        Ok(true)
    }

    /// Starts converting every full HG at `ready` and waits for them all, so that their
    /// VHs are free; the conversions' VHs may wait for a flush (degraded), taken now too.
    /// Returns when the last is done.
    fn convert_all_and_wait(&mut self, mut ready: TimeNs) -> Result<TimeNs, DeviceError> {
        self.convert_all_full(ready)?;
        while let Some(t) = self.recycle_earliest()? {
            ready = ready.max(t);
        }
        if self.holds_vhs() {
            let flushed = self.flush_and_release(ready)?;
            ready = ready.max(self.release_replaced(flushed)?);
        }
        Ok(ready)
    }

    /// Closes the open HGs of other threads that hold a VH on a member with none free,
    /// when a free row the asker may take needs such a member. Returns whether it closed
    /// any. Threads on OS threads of their own write into their groups without the
    /// daemon, so they are asked to seal theirs (`Control::Seal`), and their `Sealed`
    /// reaches the inbox later, when the ask is served again. The GC writer's group stays
    /// open: a clean nested in this grant may be filling it.
    fn seal_blocking(&mut self, asker: usize, now_ns: TimeNs) -> Result<bool, DeviceError> {
        if self.grantable_hhs(asker) == 0 {
            return Ok(false);
        }
        let short: Vec<bool> = self.manager.free_vhs.iter().map(|l| l.is_empty()).collect();
        let row_needs_short = self
            .manager
            .free_hhs
            .iter()
            .any(|&hh| (0..self.m).any(|r| short[self.parity_member(hh, r)]));
        if !row_needs_short {
            return Ok(false);
        }
        let gc_writer = self.scala.io_threads as usize;
        let mut sealed = false;
        for t in 0..self.open.len() {
            if t == asker || t == gc_writer {
                continue;
            }
            let Some(stripe) = self.open[t] else {
                continue;
            };
            let holds_short = (0..self.m).any(|r| short[self.parity_member(stripe, r)]);
            if holds_short && self.is_remote_thread(t) {
                self.ask_seal(t, stripe);
            } else if holds_short {
                self.close_open(t, now_ns)?;
                self.stats.groups_sealed += 1;
                sealed = true;
            }
        }
        if sealed {
            while let Ok(msg) = self.manager.inbox.try_recv() {
                self.take_message(msg, now_ns)?;
            }
        }
        Ok(sealed)
    }

    /// Broadcasts a recall to every other thread and takes their returns. Threads running
    /// on OS threads of their own answer later; their returns reach the manager's inbox.
    fn recall(&mut self, asker: usize, at_ns: TimeNs) -> Result<(), DeviceError> {
        self.stats.recalls += 1;
        self.manager.recalls += 1;
        for t in 0..self.threads.len() {
            if t == asker {
                continue;
            }
            let per_mille = SpaceManager::recall_per_mille(self.manager.recent_asks[t]);
            self.manager.send(t, ToThread::Recall { per_mille });
            if !self.is_remote_thread(t) {
                self.threads[t].pump();
            }
        }
        for a in &mut self.manager.recent_asks {
            *a /= 2;
        }
        while let Ok(msg) = self.manager.inbox.try_recv() {
            self.take_message(msg, at_ns)?;
        }
        Ok(())
    }

    /// The daemon handles one message from a thread.
    fn take_message(&mut self, msg: ToManager, now_ns: TimeNs) -> Result<(), DeviceError> {
        self.manager.messages += 1;
        match msg {
            ToManager::Ask { thread, at_ns } => {
                self.manager.recent_asks[thread] += 1;
                self.manager.waiting.push_back((thread, at_ns));
            }
            ToManager::Return { hhs, vhs, .. } => {
                for hh in hhs {
                    self.stripes[hh as usize].state = HhState::Free;
                    self.manager.free_hhs.push_back(hh);
                }
                for (ssd, vh) in vhs {
                    self.manager.free_vhs[ssd].push_back(vh);
                }
            }
            ToManager::Full { thread, stripe } => self.manager.full[thread].push_back(stripe),
            ToManager::Opened {
                thread,
                stripe,
                vhs,
            } => self.opened(thread, stripe, vhs),
            ToManager::Wrote {
                thread,
                chunk,
                stripe,
                slot,
                ts,
            } => self.wrote(thread, chunk, stripe, slot as usize, ts, now_ns)?,
            ToManager::Writing { chunk } => self.writing(chunk),
            ToManager::Sealed { thread, stripe } => self.sealed(thread, stripe),
            ToManager::Unmapped { chunk } => self.unmap(chunk, now_ns)?,
            ToManager::Passed { thread, epoch } => self.passed(thread, epoch, now_ns)?,
            ToManager::Stop { orderly } => self.stop_requested(orderly),
            ToManager::Flushed { upto } => {
                self.mark_replaced(upto);
                self.release_replaced(now_ns)?;
            }
        }
        Ok(())
    }

    // ----- conversion -----

    /// Starts converting up to `limit` full HGs, taking the threads' lists in turn.
    fn convert_some_full(&mut self, now_ns: TimeNs, limit: usize) -> Result<(), DeviceError> {
        let mut done = 0;
        while done < limit {
            let mut any = false;
            for t in 0..self.manager.full.len() {
                if done < limit {
                    if let Some(stripe) = self.manager.full[t].pop_front() {
                        self.convert(stripe, now_ns)?;
                        done += 1;
                        any = true;
                    }
                }
            }
            if !any {
                break;
            }
        }
        Ok(())
    }

    /// Starts converting every full HG on every thread's list.
    fn convert_all_full(&mut self, now_ns: TimeNs) -> Result<(), DeviceError> {
        for t in 0..self.manager.full.len() {
            while let Some(stripe) = self.manager.full[t].pop_front() {
                self.convert(stripe, now_ns)?;
            }
        }
        Ok(())
    }

    fn convert(&mut self, stripe: u32, now_ns: TimeNs) -> Result<(), DeviceError> {
        let start = self.daemon_at(now_ns, 0);
        self.stats.first_conversion_ns.get_or_insert(start);
        // Both conversions decide here, by the same rule, whether to trim the VHs.
        self.stripes[stripe as usize].backups_kept = self.holds_backups(stripe);
        self.background_depth += 1;
        let r = match self.scala.mode {
            ScalaMode::Scalaafa | ScalaMode::ScalaWr => self.convert_offloaded(stripe, start),
            ScalaMode::ScalaCo => self.convert_on_host(stripe, start, (1 << self.m) - 1),
        };
        self.background_depth -= 1;
        let done = r?;
        let s = &mut self.stripes[stripe as usize];
        s.state = HhState::Converting;
        s.convert_done_ns = done;
        self.pending.push((done, stripe));
        self.stats.stripes_converted += 1;
        Ok(())
    }

    /// §5.3: one `convert` command per parity member; the daemon only issues them.
    fn convert_offloaded(&mut self, stripe: u32, start: TimeNs) -> Result<TimeNs, DeviceError> {
        let mut done = start;
        let mut missing = 0;
        let mut on_host = 0;
        for r in 0..self.m {
            let p = self.parity_member(stripe, r);
            let vh = self.stripes[stripe as usize].vhs[r];
            if self.writable(p) && !self.serves_vh(p, vh) && self.serves_row(p, stripe) {
                // A replacement whose rebuild has passed this row but not reached the VH:
                // its SSD lacks the backups to convert, and the rebuild will not come back
                // to the row, so the daemon writes this parity row from the primaries.
                // (Marked missing, as it was until 2026-12-02, it stayed missing: the
                // recovery after a restart found the row's parity on that member blank,
                // took the stripe for neither replicated nor striped, and dropped its
                // chunks as torn.)
                on_host |= 1 << r;
                continue;
            }
            if !self.writable(p) || !self.serves_vh(p, vh) {
                missing |= 1 << r;
                if self.writable(p) && !self.holds_backups(stripe) {
                    // A replacement the rebuild has reached neither at this row nor at the
                    // VH took the backups written since it came in, but not the earlier
                    // ones. Nothing reads them, and the rebuild does not come back to a VH
                    // the conversion frees, so they are trimmed here as the SSDs trim the
                    // VHs they convert; left, they would hand the next group a VH holding
                    // backups, which recovery takes for that group's (found by the config
                    // soak with a debug build's `assert_vhs_trimmed`).
                    let vlba = self.vh_lba(vh, 0);
                    let sectors = self.k as u32 * self.chunk_sectors;
                    self.member_trim(p, vlba, sectors, start)?;
                }
                continue;
            }
            let issue = self.daemon_at(start, self.scala.daemon_command_ns);
            let cmd = ConvertCommand {
                src_lba: self.vh_lba(vh, 0),
                dst_lba: self.hh_lba(stripe),
                chunk_sectors: self.chunk_sectors,
                k: self.k as u8,
                parity: ParityType {
                    row: r as u8,
                    of: self.m as u8,
                },
                trim_source: !self.holds_backups(stripe),
            };
            self.stats.convert_commands += 1;
            let c = self.members[p].device.convert(issue, &cmd)?;
            done = done.max(c.done_ns);
        }
        if on_host != 0 {
            done = done.max(self.convert_on_host(stripe, start, on_host)?);
            missing |= self.stripes[stripe as usize].parity_missing & on_host;
        }
        self.stripes[stripe as usize].parity_missing = missing;
        Ok(done)
    }

    /// Scala-CO: the daemon reads the k primaries, computes the parity and writes it back,
    /// for the parity rows in the mask `rows` (recovery finishes a conversion the power cut
    /// stopped with only the rows still missing).
    fn convert_on_host(
        &mut self,
        stripe: u32,
        start: TimeNs,
        rows: u32,
    ) -> Result<TimeNs, DeviceError> {
        self.stats.host_conversions += 1;
        let (done, missing) = self.write_parity(stripe, start, rows, true)?;
        let s = &mut self.stripes[stripe as usize];
        s.parity_missing = (s.parity_missing & !rows) | missing;
        Ok(done)
    }

    /// Reads the k primaries of `stripe` (data, and tags as the backups carry them),
    /// computes the parity rows in the mask `rows` on the daemon and writes them, each
    /// followed by the trim of the VH it replaces if `trim_vhs` (a conversion). Returns when
    /// they are written, and the mask of those whose member could not take them.
    fn write_parity(
        &mut self,
        stripe: u32,
        start: TimeNs,
        rows: u32,
        trim_vhs: bool,
    ) -> Result<(TimeNs, u32), DeviceError> {
        let (k, m) = (self.k, self.m);
        let cu = self.chunk_units();
        let cs = self.chunk_sectors;
        let mut data = vec![vec![0u8; cu]; k];
        let mut tags = vec![vec![0u8; cs as usize * self.tag_bytes]; k];
        let mut t_read = start;
        for (j, buf) in data.iter_mut().enumerate() {
            let issue = self.daemon_at(start, self.scala.daemon_command_ns);
            let t = self.read_slot(stripe, j, 0, cs, issue, buf, false)?;
            t_read = t_read.max(t);
        }
        if self.tag_bytes > 0 {
            for (j, tag) in tags.iter_mut().enumerate() {
                if let Some(t) = self.slot_tags(stripe, j) {
                    *tag = t;
                }
            }
        }
        let chunk_bytes = self.config.chunk_bytes;
        let cpu_ns = transfer_ns((k + m) as u64 * chunk_bytes, self.scala.daemon_copy_mb_s)
            + transfer_ns(k as u64 * chunk_bytes, self.scala.daemon_parity_mb_s);
        // The daemon computes the parity on its own core: its time, not an I/O thread's.
        let computed = self.daemon_at(t_read, cpu_ns);
        let mut done = computed;
        let mut missing = 0;
        for r in (0..m).filter(|&r| rows >> r & 1 == 1) {
            let p = self.parity_member(stripe, r);
            let mut parity = vec![0u8; cu];
            let mut ptags = vec![0u8; cs as usize * self.tag_bytes];
            {
                let refs: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
                self.codec
                    .encode_row(r, &refs, &mut parity)
                    .map_err(|_| DeviceError::Failed)?;
                if self.tag_bytes > 0 {
                    let trefs: Vec<&[u8]> = tags.iter().map(|v| v.as_slice()).collect();
                    self.codec
                        .encode_row(r, &trefs, &mut ptags)
                        .map_err(|_| DeviceError::Failed)?;
                }
            }
            if !self.writable(p) {
                missing |= 1 << r;
                continue;
            }
            let issue = self.daemon_at(computed, self.scala.daemon_command_ns);
            let lba = self.hh_lba(stripe);
            let tags_ref = (self.tag_bytes > 0).then_some(&ptags[..]);
            done = done.max(self.member_write(p, lba, issue, &parity, tags_ref, false)?);
            if trim_vhs && !self.holds_backups(stripe) {
                let vh = self.stripes[stripe as usize].vhs[r];
                let vlba = self.vh_lba(vh, 0);
                self.member_trim(p, vlba, k as u32 * cs, done)?;
            }
        }
        Ok((done, missing))
    }

    /// The OOB tags of slot j's copies as the parity members hold them (kind = backup):
    /// parity, in the SSD or on the host, is always computed over these, so that recovery
    /// can check it the same way for every mode.
    fn slot_tags(&self, stripe: u32, j: usize) -> Option<Vec<u8>> {
        let d = self.data_member(stripe, j);
        let lba = self.hh_lba(stripe);
        let mut t = if self.serves_row(d, stripe) {
            self.members[d].device.scan_tags(lba, self.chunk_sectors)?
        } else {
            let s = &self.stripes[stripe as usize];
            (0..self.m).find_map(|r| {
                let p = self.parity_member(stripe, r);
                let vh = s.vhs.get(r).copied().unwrap_or(NONE);
                (vh != NONE && self.serves_vh(p, vh))
                    .then(|| {
                        self.members[p]
                            .device
                            .scan_tags(self.vh_lba(vh, j), self.chunk_sectors)
                    })
                    .flatten()
            })?
        };
        set_kind(&mut t, self.tag_bytes, KIND_BACKUP);
        Some(t)
    }

    /// Ends the conversions done by `now_ns`: their VHs go back to the manager.
    fn recycle_done(&mut self, now_ns: TimeNs) -> Result<(), DeviceError> {
        let mut i = 0;
        while i < self.pending.len() {
            if self.pending[i].0 <= now_ns {
                let (_, stripe) = self.pending.swap_remove(i);
                self.finish_conversion(stripe, now_ns)?;
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// Ends the earliest conversion in flight; returns its end time.
    fn recycle_earliest(&mut self) -> Result<Option<TimeNs>, DeviceError> {
        let Some(pos) = self
            .pending
            .iter()
            .enumerate()
            .min_by_key(|(_, &(t, s))| (t, s))
            .map(|(i, _)| i)
        else {
            return Ok(None);
        };
        let (t, stripe) = self.pending.swap_remove(pos);
        self.finish_conversion(stripe, t)?;
        // Everything else done by then ends too.
        self.recycle_done(t)?;
        Ok(Some(t))
    }

    fn finish_conversion(&mut self, stripe: u32, now_ns: TimeNs) -> Result<(), DeviceError> {
        let vhs = std::mem::take(&mut self.stripes[stripe as usize].vhs);
        // On a degraded volume a stripe that may hold flushed chunks keeps its backups (the
        // conversion did not trim them) until a flush has made its parity durable. So does a
        // stripe whose conversion was issued while the volume was degraded and ends with it
        // whole again (a rebuild finished in between): its VHs still hold the backups, and
        // handed out untrimmed, a group that took one would write over some of them and
        // leave the rest, which recovery reads as the stripe's, torn. The trim comes with
        // the next flush.
        let hold = self.holds_backups(stripe) || self.stripes[stripe as usize].backups_kept;
        self.stripes[stripe as usize].backups_kept = false;
        let started = self.flushes_started();
        for (r, vh) in vhs.into_iter().enumerate() {
            let p = self.parity_member(stripe, r);
            self.members[p].vh_owner[vh as usize] = NONE;
            if hold {
                self.unflushed.push((started, Held::Vh(p, vh)));
            } else {
                self.release_vh(p, vh);
            }
        }
        let s = &mut self.stripes[stripe as usize];
        s.state = HhState::Striped;
        let live = s.live;
        if live == 0 {
            self.free_hh(stripe, now_ns)?;
        } else {
            self.by_live[live as usize].insert(stripe);
        }
        Ok(())
    }

    /// A striped HH whose chunks are all dead returns to the manager; its chunks are
    /// deallocated on the members. With the I/O threads on OS threads of their own, a thread
    /// may still be reading a chunk that moved, so the HH waits for every thread to pass a
    /// barrier first.
    fn free_hh(&mut self, stripe: u32, now_ns: TimeNs) -> Result<(), DeviceError> {
        if self.defer_free(stripe) {
            return Ok(());
        }
        self.free_hh_now(stripe, now_ns)
    }

    /// Whether `stripe` may hold a chunk copy written before the last member flush started,
    /// which a host crash must not take (members behind a volatile cache only).
    fn holds_flushed(&self, stripe: u32) -> bool {
        self.keep_flushed && self.stripes[stripe as usize].first_ts <= self.flushed_clock()
    }

    /// Whether a conversion of `stripe` must keep its backups until a member flush: it may
    /// hold flushed chunks, and a member is lost, so a host crash that kept the backups'
    /// trim and lost the parity would lose that member's chunks. On a whole volume recovery
    /// computes the parity again from the primaries, and a member that fails first has the
    /// others flushed (`fail_member`), so the backups are needed only while degraded.
    fn holds_backups(&self, stripe: u32) -> bool {
        self.holds_flushed(stripe) && self.members.iter().any(|m| m.state != MemberState::Alive)
    }

    fn free_hh_now(&mut self, stripe: u32, now_ns: TimeNs) -> Result<(), DeviceError> {
        let hold = self.holds_flushed(stripe);
        if !hold {
            let lba = self.hh_lba(stripe);
            for i in 0..self.members.len() {
                self.member_trim(i, lba, self.chunk_sectors, now_ns)?;
            }
        }
        let s = &mut self.stripes[stripe as usize];
        s.state = HhState::Free;
        s.chunks.iter_mut().for_each(|c| *c = NONE);
        s.filled = 0;
        s.parity_missing = 0;
        if hold {
            let started = self.flushes_started();
            self.unflushed.push((started, Held::Row(stripe)));
        } else {
            self.release_hh(stripe);
        }
        Ok(())
    }

    // ----- array-level GC (§5.2 retrieval path 4) -----

    /// Cleans striped HHs with holes until a grant is possible: their live chunks are
    /// written again by the daemon's own writer, and the HHs freed.
    fn collect_garbage(&mut self, now_ns: TimeNs) -> Result<TimeNs, DeviceError> {
        let mut t = now_ns;
        // A clean nested in a clean (the GC writer asking for heroes) may go one level
        // deeper to find room, but no further: the recursion is bounded.
        if self.gc_nesting >= 2 {
            return Ok(t);
        }
        let gc_thread = self.scala.io_threads as usize;
        for _ in 0..self.batch_hhs.max(4) {
            if self.reclaimed_hhs() >= self.gc_reserve + self.batch_hhs {
                break;
            }
            let Some(victim) = (1..self.k).find_map(|l| self.by_live[l].iter().next().copied())
            else {
                break;
            };
            self.stats.gc_stripes += 1;
            let live: Vec<(usize, u32)> = self.stripes[victim as usize]
                .chunks
                .iter()
                .enumerate()
                .filter(|&(_, &c)| c != NONE)
                .map(|(j, &c)| (j, c))
                .collect();
            self.background_depth += 1;
            self.gc_nesting += 1;
            let mut r = Ok(());
            // Whether the GC writer found no room for a move: this clean stops there.
            let mut out_of_room = false;
            for (j, chunk) in live {
                // Writing a chunk may itself ask for heroes, and a grant may clean again,
                // moving this victim's other chunks and freeing (and reusing) its row: a
                // chunk no longer in its slot has moved already, and its slot must not be
                // read.
                //
                // The copy's timestamp is drawn first, then the threads' reports are taken:
                // with the I/O threads on OS threads of their own, a user write of this chunk
                // that drew an older timestamp has announced itself by then, and the move
                // waits for a later clean. Every copy that could outlive a newer user write
                // on the media is thus older than it, so recovery never prefers it.
                let ts = self.next_ts();
                self.take_reports(t)?;
                let s = &self.stripes[victim as usize];
                if s.state != HhState::Striped || s.chunks[j] != chunk || self.being_written(chunk)
                {
                    continue;
                }
                let mut buf = vec![0u8; self.chunk_units()];
                let from = victim * self.k as u32 + j as u32;
                let moving = Some((from, ts));
                match self.read_slot(victim, j, 0, self.chunk_sectors, t, &mut buf, false) {
                    Ok(rt) => match self.write_chunk_as(gc_thread, chunk, &buf, rt, moving) {
                        Ok((wt, written)) => {
                            t = t.max(wt);
                            if written {
                                self.stats.gc_chunks_moved += 1;
                                self.moved(chunk, from);
                            }
                        }
                        // No hero group for the GC writer: in a clean nested in a grant to
                        // the GC writer itself, that grant holds the writer's ask, so the
                        // inner writer can never be answered. The chunks not yet moved stay
                        // live where they are (a victim cleaned halfway is still a striped
                        // HH), and the clean ends without an error, so that the grant goes
                        // on to its other ways of making room (conversions, a member flush)
                        // instead of failing the user write that started it.
                        Err(DeviceError::VolumeFull(_) | DeviceError::NoSpace { .. }) => {
                            self.stats.gc_cleans_out_of_room += 1;
                            out_of_room = true;
                            break;
                        }
                        Err(e) => {
                            r = Err(e);
                            break;
                        }
                    },
                    Err(e) => {
                        r = Err(e);
                        break;
                    }
                }
            }
            self.background_depth -= 1;
            self.gc_nesting -= 1;
            r?;
            if out_of_room {
                break;
            }
        }
        Ok(t)
    }

    // ----- the write path -----

    /// The thread's open HG, assembling one from its heroes (and asking the manager) if
    /// needed. Returns the stripe and when its heroes are usable.
    fn open_group(&mut self, thread: usize, now_ns: TimeNs) -> Result<(u32, TimeNs), DeviceError> {
        // Each round the manager may have to convert, recall or collect garbage before it
        // can grant; the last round only receives. A clean inside the manager writes
        // through the GC writer, so when this is the GC writer, a nested clean may have
        // opened (or filled) its group meanwhile: the open group is looked at every round.
        for round in 0..6 {
            if let Some(s) = self.open[thread] {
                return Ok((s, now_ns));
            }
            self.threads[thread].pump();
            if let Some((stripe, ready)) = self.assemble(thread) {
                self.open[thread] = Some(stripe);
                if self.threads[thread].held_hhs() < self.low_water {
                    self.threads[thread].ask(now_ns);
                    self.serve_manager(now_ns)?;
                    self.threads[thread].pump();
                }
                if self.open[thread] == Some(stripe) {
                    return Ok((stripe, ready.max(now_ns)));
                }
                continue;
            }
            if round < 5 {
                self.threads[thread].ask(now_ns);
                self.serve_manager(now_ns)?;
            }
        }
        Err(self.no_hero_group(thread))
    }

    /// The error of a thread that could assemble no hero group, naming what was short.
    /// (It said `NoSpace` in plane 0 until the config soak met it: the members had room,
    /// the volume's layout did not.) A group needs a free HH and a free VH on each of that
    /// HH's m parity members; the open groups of the other threads hold the VHs of some
    /// members, and their unfilled slots are rows no one else may use.
    fn no_hero_group(&self, thread: usize) -> DeviceError {
        let who = if thread == self.scala.io_threads as usize {
            "the GC writer".to_string()
        } else {
            format!("I/O thread {thread}")
        };
        let free_vhs: Vec<usize> = self.manager.free_vhs.iter().map(|l| l.len()).collect();
        let open = self.open.iter().flatten().count();
        let volume_rows = self.amt.len() as u64 / self.k as u64;
        DeviceError::VolumeFull(format!(
            "no hero group for {who}: {} free HHs (whose parity members must each have a \
             free VH), free VHs per member {free_vhs:?}, {open} groups open; the volume \
             leaves {} spare rows for {} I/O threads and the GC writer (fewer \
             array.scalaafa.io_threads, a larger spare_fraction or a larger transient area \
             leave each thread more room)",
            self.manager.free_hhs.len(),
            self.rows as u64 - volume_rows,
            self.scala.io_threads
        ))
    }

    /// Pops an HH and, for each of its parity members, a VH there from the thread's lists.
    fn assemble(&mut self, thread: usize) -> Option<(u32, TimeNs)> {
        let (hh, vhs, ready) = self.threads[thread].assemble()?;
        self.open_hg(hh, vhs);
        Some((hh, ready))
    }

    /// Every VH handed to a group reads as trimmed: the group writes its backups slot by
    /// slot, and a backup an earlier group left in a slot this one has not reached yet is
    /// read by recovery as this group's (its stripe then looks half replicated, and its
    /// chunks torn). Checked where the members are at hand (not on the engine's threads).
    #[cfg(debug_assertions)]
    fn assert_vhs_trimmed(&self, hh: u32, vhs: &[u32]) {
        if self.tag_bytes == 0 || self.remote.is_some() {
            return;
        }
        let sectors = self.k as u32 * self.chunk_sectors;
        for (r, &vh) in vhs.iter().enumerate() {
            let p = self.parity_member(hh, r);
            if self.members[p].state != MemberState::Alive {
                continue;
            }
            if let Some(tags) = self.members[p]
                .device
                .scan_tags(self.vh_lba(vh, 0), sectors)
            {
                assert!(
                    tags.iter().all(|&b| b == 0),
                    "VH {vh} on member {p}, handed to group {hh}, still holds backups"
                );
            }
        }
    }

    /// Records hero group `hh` (its HGMT entry: VH `vhs[r]` on parity member r) as open.
    fn open_hg(&mut self, hh: u32, vhs: Vec<u32>) {
        #[cfg(debug_assertions)]
        self.assert_vhs_trimmed(hh, &vhs);
        for (r, &vh) in vhs.iter().enumerate() {
            let p = self.parity_member(hh, r);
            self.members[p].vh_owner[vh as usize] = hh;
        }
        for i in 0..self.members.len() {
            self.mark_fresh(i, hh);
        }
        for (r, &vh) in vhs.iter().enumerate() {
            let p = self.parity_member(hh, r);
            self.mark_fresh(p, self.rows + vh);
        }
        let s = &mut self.stripes[hh as usize];
        debug_assert!(matches!(s.state, HhState::Held));
        s.state = HhState::Open;
        s.vhs = vhs;
        s.filled = 0;
        s.live = 0;
        s.first_ts = u32::MAX;
        s.chunks.iter_mut().for_each(|c| *c = NONE);
    }

    /// Writes one whole user chunk through `thread`'s open HG (§5.3 placement).
    fn write_chunk(
        &mut self,
        thread: usize,
        chunk: u32,
        data: &[u8],
        now_ns: TimeNs,
    ) -> Result<TimeNs, DeviceError> {
        self.write_chunk_as(thread, chunk, data, now_ns, None)
            .map(|(done, _)| done)
    }

    /// Writes one whole user chunk, or (`moving`: its AFA chunk and the timestamp drawn for
    /// the copy) a copy array-level GC moves. Returns whether the chunk was written: a move
    /// is dropped when the chunk has left its source meanwhile.
    fn write_chunk_as(
        &mut self,
        thread: usize,
        chunk: u32,
        data: &[u8],
        now_ns: TimeNs,
        moving: Option<(u32, u32)>,
    ) -> Result<(TimeNs, bool), DeviceError> {
        let (stripe, ready) = self.open_group(thread, now_ns)?;
        // Opening a group may run the manager, and a clean nested in it may have moved this
        // very chunk (or a thread's report shown it overwritten): a second copy would only
        // be dead on arrival.
        if moving.is_some_and(|(from, _)| self.amt[chunk as usize] != from) {
            return Ok((ready, false));
        }
        self.stats.hero_wait_ns += ready - now_ns;
        let j = self.stripes[stripe as usize].filled as usize;
        let ts = match moving {
            Some((_, ts)) => ts,
            None => self.next_ts(),
        };
        let done = self.write_copies(stripe, j, chunk, ts, 0..self.chunk_sectors, data, ready)?;
        self.fill_slot(thread, stripe, j, chunk, ts, done)?;
        Ok((done, true))
    }

    /// Records user chunk `chunk` as written (timestamp `ts`) into slot j of `thread`'s open
    /// group `stripe`, its old slot becoming a hole, and queues the group for conversion
    /// once every slot is written.
    fn fill_slot(
        &mut self,
        thread: usize,
        stripe: u32,
        j: usize,
        chunk: u32,
        ts: u32,
        done_ns: TimeNs,
    ) -> Result<(), DeviceError> {
        self.unmap(chunk, done_ns)?;
        self.amt[chunk as usize] = stripe * self.k as u32 + j as u32;
        self.amt_ts[chunk as usize] = ts;
        let s = &mut self.stripes[stripe as usize];
        s.chunks[j] = chunk;
        s.live += 1;
        s.filled += 1;
        s.first_ts = s.first_ts.min(ts);
        if s.filled as usize == self.k {
            s.state = HhState::Full;
            self.open[thread] = None;
            self.threads[thread].send(ToManager::Full { thread, stripe });
        }
        self.stats.chunks_written += 1;
        Ok(())
    }

    /// Forgets where user chunk `chunk` lived (its old slot becomes a hole).
    fn unmap(&mut self, chunk: u32, now_ns: TimeNs) -> Result<(), DeviceError> {
        let a = std::mem::replace(&mut self.amt[chunk as usize], NONE);
        if a == NONE {
            return Ok(());
        }
        let stripe = a / self.k as u32;
        let j = (a % self.k as u32) as usize;
        let s = &mut self.stripes[stripe as usize];
        debug_assert_eq!(s.chunks[j], chunk);
        s.chunks[j] = NONE;
        let live = s.live;
        s.live -= 1;
        if s.state == HhState::Striped {
            self.by_live[live as usize].remove(&stripe);
            if live == 1 {
                self.free_hh(stripe, now_ns)?;
            } else {
                self.by_live[live as usize - 1].insert(stripe);
            }
        }
        Ok(())
    }

    fn pick_thread(&mut self) -> usize {
        let t = self.next_thread;
        self.next_thread = (self.next_thread + 1) % self.scala.io_threads as usize;
        t
    }

    fn write(
        &mut self,
        now_ns: TimeNs,
        lba: u64,
        sectors: u32,
        data: &[u8],
    ) -> Result<TimeNs, DeviceError> {
        self.serve_manager(now_ns)?;
        let thread = self.pick_thread();
        let cs = self.chunk_sectors as u64;
        let cu = self.chunk_units();
        let first = lba / cs;
        let last = (lba + sectors as u64 - 1) / cs;
        let mut done = now_ns;
        for chunk in first..=last {
            self.work.chunks += 1;
            let c_start = chunk * cs;
            let from = lba.max(c_start);
            let to = (lba + sectors as u64).min(c_start + cs);
            let offset = ((from - lba) as usize) * self.unit;
            let len = ((to - from) as usize) * self.unit;
            let piece = &data[offset..offset + len];
            if to - from < cs && self.scala.sub_chunk_writes == SubChunkWrites::InPlace {
                let rows = (from - c_start) as u32..(to - c_start) as u32;
                if let Some(t) = self.write_in_place(thread, chunk as u32, rows, piece, now_ns)? {
                    done = done.max(t);
                    continue;
                }
            }
            let mut t = now_ns;
            let buf;
            let whole: &[u8] = if to - from == cs {
                piece
            } else {
                // Out-of-place update of part of a chunk: the rest comes from its copy.
                let mut b = vec![0u8; cu];
                t = t.max(self.read_chunk(chunk as u32, 0, cs as u32, t, &mut b)?);
                let at = ((from - c_start) as usize) * self.unit;
                b[at..at + len].copy_from_slice(piece);
                buf = b;
                &buf
            };
            done = done.max(self.write_chunk(thread, chunk as u32, whole, t)?);
        }
        self.stats.user_write_sectors += sectors as u64;
        Ok(done)
    }

    /// The prototype's write of a piece smaller than a chunk (`SubChunkWrites::InPlace`):
    /// into the chunk's own slot while its stripe is replicated, or into a fresh slot that
    /// holds only the piece when the chunk was never written. Returns `None` when the
    /// chunk's stripe is converting or striped, which the caller merges as usual.
    fn write_in_place(
        &mut self,
        thread: usize,
        chunk: u32,
        rows: std::ops::Range<u32>,
        piece: &[u8],
        now_ns: TimeNs,
    ) -> Result<Option<TimeNs>, DeviceError> {
        let a = self.amt[chunk as usize];
        if a == NONE {
            // A fresh slot reads as zeroes everywhere (no hero is handed out untrimmed), so
            // the piece alone leaves the rest of the chunk as it was: never written. Those
            // sectors carry no tags, which a decode accepts in this mode
            // (`copy_is_whole_with_holes`). The first sector is written too, as zeroes, when
            // the piece does not cover it: recovery and the parity checks read a copy's
            // name from its first sector's OOB, so every written copy must carry it there.
            let (stripe, ready) = self.open_group(thread, now_ns)?;
            self.stats.hero_wait_ns += ready - now_ns;
            let j = self.stripes[stripe as usize].filled as usize;
            let ts = self.next_ts();
            let mut done = self.write_copies(stripe, j, chunk, ts, rows.clone(), piece, ready)?;
            if rows.start > 0 {
                let zeroes = vec![0u8; self.unit];
                done = done.max(self.write_copies(stripe, j, chunk, ts, 0..1, &zeroes, ready)?);
            }
            self.fill_slot(thread, stripe, j, chunk, ts, done)?;
            self.stats.in_place_writes += 1;
            return Ok(Some(done));
        }
        let stripe = a / self.k as u32;
        let j = (a % self.k as u32) as usize;
        if !matches!(
            self.stripes[stripe as usize].state,
            HhState::Open | HhState::Full
        ) {
            return Ok(None);
        }
        // The copies keep the chunk's timestamp: the update changes bytes, not which copy
        // of the chunk is the newest.
        let ts = self.amt_ts[chunk as usize];
        let done = self.write_copies(stripe, j, chunk, ts, rows, piece, now_ns)?;
        self.stats.in_place_writes += 1;
        Ok(Some(done))
    }

    /// Writes `piece` (a whole chunk, or the rows an in-place update covers) into `rows` of
    /// slot j of `stripe`: its primary in the HH and each backup in the stripe's VHs (flagged
    /// transient except in `scala-wr`), as §5.3 places them, each sector with its OOB tag:
    /// (user chunk, slot, timestamp `ts`, kind) and the checksum of its payload.
    #[allow(clippy::too_many_arguments)]
    fn write_copies(
        &mut self,
        stripe: u32,
        j: usize,
        chunk: u32,
        ts: u32,
        rows: std::ops::Range<u32>,
        piece: &[u8],
        ready: TimeNs,
    ) -> Result<TimeNs, DeviceError> {
        let (row, rows) = (rows.start, rows.end - rows.start);
        let mut tags = meta_tags(
            self.tag_bytes,
            self.unit,
            rows,
            encode_meta(chunk, j as u8, ts, KIND_PRIMARY),
            piece,
        );
        let mut done = ready;
        let d = self.data_member(stripe, j);
        if self.writable(d) {
            let lba = self.hh_lba(stripe) + row as u64;
            done = done.max(self.member_write_rows(
                d,
                lba,
                rows,
                ready,
                piece,
                tags.as_deref(),
                false,
            )?);
        }
        let transient = self.scala.mode != ScalaMode::ScalaWr;
        // The backups' tags are the primary's with another kind byte.
        if let Some(t) = &mut tags {
            set_kind(t, self.tag_bytes, KIND_BACKUP);
        }
        for r in 0..self.m {
            let p = self.parity_member(stripe, r);
            if self.writable(p) {
                let vh = self.stripes[stripe as usize].vhs[r];
                let lba = self.vh_lba(vh, j) + row as u64;
                done = done.max(self.member_write_rows(
                    p,
                    lba,
                    rows,
                    ready,
                    piece,
                    tags.as_deref(),
                    transient,
                )?);
            }
        }
        Ok(done)
    }

    // ----- the read path -----

    /// Reads rows of slot j of `stripe`: the primary, or a replica when the home member
    /// is down or (if `steer`) reported GC, or a reconstruction from the stripe. A copy that
    /// cannot be read is one more erasure: the read goes on to the other replicas, then to
    /// the primary it steered away from, then to the stripe, and fails only when none of
    /// them can answer (on RAID 6, two unreadable copies of a stripe in replication are
    /// survived through the third).
    #[allow(clippy::too_many_arguments)]
    fn read_slot(
        &mut self,
        stripe: u32,
        j: usize,
        row: u32,
        rows: u32,
        now_ns: TimeNs,
        out: &mut [u8],
        steer: bool,
    ) -> Result<TimeNs, DeviceError> {
        let home = self.data_member(stripe, j);
        let s = &self.stripes[stripe as usize];
        // Replicas exist until conversion is issued (the SSD drops them then), and in a
        // stripe recovery found between its parity rows until the host has written the rows
        // still missing (their VHs are kept until then; the others are NONE). Those whose
        // member is not collecting garbage are tried first when steering.
        let vhs_held = matches!(s.state, HhState::Open | HhState::Full)
            || (s.state == HhState::Striped && s.vhs.iter().any(|&vh| vh != NONE));
        let mut replicas: Vec<(usize, u64)> = if vhs_held {
            (0..self.m)
                .filter_map(|r| {
                    let p = self.parity_member(stripe, r);
                    let vh = s.vhs[r];
                    (vh != NONE && self.serves_vh(p, vh)).then(|| (p, self.vh_lba(vh, j)))
                })
                .collect()
        } else {
            Vec::new()
        };
        if steer {
            replicas.sort_by_key(|&(p, _)| self.members[p].gc_active);
        }
        let striped = matches!(s.state, HhState::Converting | HhState::Striped);
        let home_ok = self.serves_row(home, stripe);
        let replica_calm = replicas
            .first()
            .is_some_and(|&(p, _)| !self.members[p].gc_active);
        let steered_away = home_ok && steer && self.members[home].gc_active && replica_calm;
        let lba = self.hh_lba(stripe) + row as u64;
        let mut unreadable = None;
        if home_ok && !steered_away {
            match self.member_read(home, lba, rows, now_ns, out) {
                Err(e @ DeviceError::Uncorrectable { .. }) if !replicas.is_empty() || striped => {
                    unreadable = Some(e);
                }
                result => return result,
            }
        } else if home_ok {
            self.stats.replica_reads += 1;
        } else {
            self.stats.degraded_reads += 1;
        }
        for &(p, vlba) in &replicas {
            match self.member_read(p, vlba + row as u64, rows, now_ns, out) {
                Err(e @ DeviceError::Uncorrectable { .. }) => unreadable = Some(e),
                result => {
                    self.count_corrected(unreadable.is_some(), &result);
                    return result;
                }
            }
        }
        if steered_away {
            match self.member_read(home, lba, rows, now_ns, out) {
                Err(e @ DeviceError::Uncorrectable { .. }) => unreadable = Some(e),
                result => return result,
            }
        }
        let (shards, t) = match self.reconstruct_rows(stripe, row, rows, now_ns, j) {
            // A stripe still in replication has nothing to decode from: every copy is read
            // again (`read_copies_again`; the config soak, seed 15973, RAID 6 with a member
            // down, failed a write there). The error is the last unreadable copy's, which
            // names its sectors.
            Err(DeviceError::Failed) if !striped => {
                let copies = home_ok
                    .then_some((home, lba))
                    .into_iter()
                    .chain(replicas.iter().map(|&(p, vlba)| (p, vlba + row as u64)))
                    .collect::<Vec<_>>();
                let (read, retries) =
                    crate::read_copies_again(&copies, &mut unreadable, |(p, at)| {
                        self.member_read(p, at, rows, now_ns, out)
                    })?;
                self.stats.read_retries += retries;
                return match read {
                    Some(t) => {
                        self.count_corrected(true, &Ok(t));
                        Ok(t)
                    }
                    None => Err(unreadable.unwrap_or(DeviceError::Failed)),
                };
            }
            result => result?,
        };
        if !self.decoded_whole(stripe, j, row, rows, &shards[j])? {
            return Err(DeviceError::Medium(format!(
                "slot {j} of stripe {stripe} decodes to data its checksums do not match"
            )));
        }
        out.copy_from_slice(&shards[j]);
        self.count_corrected(unreadable.is_some(), &Ok(t));
        Ok(t)
    }

    /// Counts a read answered after a copy could not be read.
    fn count_corrected(&mut self, after_unreadable: bool, result: &Result<TimeNs, DeviceError>) {
        if after_unreadable && result.is_ok() {
            self.stats.read_errors_corrected += 1;
        }
    }

    /// Reads rows of every serving chunk of converted `stripe` and decodes the others.
    fn reconstruct_rows(
        &mut self,
        stripe: u32,
        row: u32,
        rows: u32,
        now_ns: TimeNs,
        wanted: usize,
    ) -> Result<(Vec<Vec<u8>>, TimeNs), DeviceError> {
        let (k, m) = (self.k, self.m);
        let s = &self.stripes[stripe as usize];
        if !matches!(s.state, HhState::Converting | HhState::Striped) {
            return Err(DeviceError::Failed);
        }
        let mut shards = vec![vec![0u8; rows as usize * self.unit]; k + m];
        let mut present = vec![false; k + m];
        let mut t = now_ns;
        let mut unreadable = None;
        let lba = self.hh_lba(stripe) + row as u64;
        let sources: Vec<Option<usize>> = (0..k + m)
            .map(|i| self.shard_source(stripe, i, wanted))
            .collect();
        let readable: Vec<bool> = sources.iter().map(Option::is_some).collect();
        // An unreadable shard is one more erasure, which the code may still cover (RAID 6);
        // beyond that, it is read again (`read_shards`).
        let (read_ns, retries) = crate::read_shards(&readable, &mut present, m, |i| {
            let Some(member) = sources[i] else {
                return Ok(None);
            };
            let read = self.member_read(member, lba, rows, now_ns, &mut shards[i]);
            crate::as_erasure(read, &mut unreadable)
        })?;
        self.stats.read_retries += retries;
        t = t.max(read_ns);
        {
            let mut refs: Vec<&mut [u8]> = shards.iter_mut().map(|v| v.as_mut_slice()).collect();
            if self.codec.reconstruct(&mut refs, &present).is_err() {
                return Err(unreadable.unwrap_or(DeviceError::Failed));
            }
        }
        let bytes = k as u64 * rows as u64 * self.info.sector_bytes as u64;
        // A rebuild or GC decodes on the daemon's core; only a reader pays on its own.
        if self.background_depth == 0 {
            self.work.parity_bytes += bytes;
        }
        Ok((shards, t + transfer_ns(bytes, self.config.parity_mb_s)))
    }

    /// The member to read shard `i` (k data chunks, then m parity chunks) of a converted
    /// stripe from when reconstructing shard `wanted`: None for the wanted shard itself, a
    /// parity chunk conversion has not written, and a member that does not serve the row.
    fn shard_source(&self, stripe: u32, i: usize, wanted: usize) -> Option<usize> {
        let k = self.k;
        let member = if i < k {
            self.data_member(stripe, i)
        } else {
            if self.stripes[stripe as usize].parity_missing >> (i - k) & 1 == 1 {
                return None;
            }
            self.parity_member(stripe, i - k)
        };
        (i != wanted && self.serves_row(member, stripe)).then_some(member)
    }

    /// The OOB tags of shard `wanted` of a converted stripe, decoded from the other shards'
    /// tags as its data is from theirs: the SSDs' conversion computed the parity chunks'
    /// tags over the backups' tags (§5.4), which are the primaries' but for the kind byte.
    /// None when the members keep no tags.
    /// Whether sectors `row..row + rows` of slot `j`, decoded as `data`, match the checksums
    /// in their tags decoded the same way. A parity whose tags outlived its data (a host
    /// crash over member files, with a member lost before it) decodes to other bytes, and
    /// the read fails rather than return them. An unwritten slot (zero tags) checks nothing.
    fn decoded_whole(
        &self,
        stripe: u32,
        j: usize,
        row: u32,
        rows: u32,
        data: &[u8],
    ) -> Result<bool, DeviceError> {
        if self.tag_bytes < META_TAG_BYTES || self.unit == 0 {
            return Ok(true);
        }
        let Some(tags) = self.reconstruct_tags(stripe, j)? else {
            return Ok(true);
        };
        let tb = self.tag_bytes;
        let tags = &tags[row as usize * tb..(row + rows) as usize * tb];
        if self.scala.sub_chunk_writes == SubChunkWrites::InPlace {
            return Ok(copy_is_whole_with_holes(tags, data, tb, self.unit));
        }
        Ok(tags.iter().all(|&b| b == 0) || copy_is_whole(tags, data, tb, self.unit))
    }

    fn reconstruct_tags(&self, stripe: u32, wanted: usize) -> Result<Option<Vec<u8>>, DeviceError> {
        let lba = self.hh_lba(stripe);
        let mut shards = Vec::with_capacity(self.k + self.m);
        let mut present = Vec::with_capacity(self.k + self.m);
        for i in 0..self.k + self.m {
            match self.shard_source(stripe, i, wanted) {
                Some(member) => {
                    let Some(mut tags) = self.members[member]
                        .device
                        .scan_tags(lba, self.chunk_sectors)
                    else {
                        return Ok(None);
                    };
                    if i < self.k {
                        set_kind(&mut tags, self.tag_bytes, KIND_BACKUP);
                    }
                    shards.push(tags);
                    present.push(true);
                }
                None => {
                    shards.push(Vec::new());
                    present.push(false);
                }
            }
        }
        let len = shards.iter().map(Vec::len).max().unwrap_or(0);
        for shard in &mut shards {
            shard.resize(len, 0);
        }
        let mut refs: Vec<&mut [u8]> = shards.iter_mut().map(|v| v.as_mut_slice()).collect();
        self.codec
            .reconstruct(&mut refs, &present)
            .map_err(|_| DeviceError::Failed)?;
        let mut tags = shards.swap_remove(wanted);
        if wanted < self.k {
            set_kind(&mut tags, self.tag_bytes, KIND_PRIMARY);
        }
        Ok(Some(tags))
    }

    fn read_chunk(
        &mut self,
        chunk: u32,
        row: u32,
        rows: u32,
        now_ns: TimeNs,
        out: &mut [u8],
    ) -> Result<TimeNs, DeviceError> {
        let a = self.amt[chunk as usize];
        if a == NONE {
            out.fill(0);
            return Ok(now_ns);
        }
        let stripe = a / self.k as u32;
        let j = (a % self.k as u32) as usize;
        self.read_slot(stripe, j, row, rows, now_ns, out, true)
    }

    fn read(
        &mut self,
        now_ns: TimeNs,
        lba: u64,
        sectors: u32,
        out: &mut [u8],
    ) -> Result<TimeNs, DeviceError> {
        let cs = self.chunk_sectors as u64;
        let mut done = now_ns;
        let mut at = lba;
        let end = lba + sectors as u64;
        while at < end {
            let chunk = at / cs;
            let row = (at % cs) as u32;
            let rows = (cs - row as u64).min(end - at) as u32;
            self.work.chunks += 1;
            let o = ((at - lba) as usize) * self.unit;
            let len = rows as usize * self.unit;
            done =
                done.max(self.read_chunk(chunk as u32, row, rows, now_ns, &mut out[o..o + len])?);
            at += rows as u64;
        }
        Ok(done)
    }

    fn trim(&mut self, now_ns: TimeNs, lba: u64, sectors: u32) -> Result<TimeNs, DeviceError> {
        let cs = self.chunk_sectors as u64;
        let end = lba + sectors as u64;
        let mut done = now_ns;
        let mut at = lba;
        while at < end {
            let chunk = at / cs;
            let to = ((chunk + 1) * cs).min(end);
            if at % cs == 0 && to - at == cs {
                self.unmap(chunk as u32, now_ns)?;
            } else if self.amt[chunk as usize] != NONE {
                // A partial trim writes zeroes, so the chunk reads back as trimmed.
                let zeros = vec![0u8; (to - at) as usize * self.unit];
                done = done.max(self.write(now_ns, at, (to - at) as u32, &zeros)?);
            }
            at = to;
        }
        Ok(done)
    }

    /// Ends I/O thread `thread` (§5.2 retrieval path 1): its open HG is closed (the unused
    /// slots are deallocated on the HH and the VHs alike, so both read as zeroes and the
    /// parity the SSDs compute matches the stripe) and queued for conversion, and its
    /// unused heroes go back to the manager.
    pub fn end_thread(&mut self, thread: usize, now_ns: TimeNs) -> Result<(), DeviceError> {
        if thread >= self.scala.io_threads as usize {
            return Err(DeviceError::Unsupported(format!(
                "no I/O thread {thread}; the engine has {}",
                self.scala.io_threads
            )));
        }
        self.close_open(thread, now_ns)?;
        self.threads[thread].pump();
        self.threads[thread].return_all();
        self.serve_manager(now_ns)
    }

    fn close_open(&mut self, thread: usize, now_ns: TimeNs) -> Result<(), DeviceError> {
        let Some(stripe) = self.open[thread].take() else {
            return Ok(());
        };
        let filled = self.stripes[stripe as usize].filled as usize;
        let cs = self.chunk_sectors;
        for j in filled..self.k {
            let d = self.data_member(stripe, j);
            let lba = self.hh_lba(stripe);
            self.member_trim(d, lba, cs, now_ns)?;
            for r in 0..self.m {
                let p = self.parity_member(stripe, r);
                let vh = self.stripes[stripe as usize].vhs[r];
                let vlba = self.vh_lba(vh, j);
                self.member_trim(p, vlba, cs, now_ns)?;
            }
        }
        let s = &mut self.stripes[stripe as usize];
        s.filled = self.k as u32;
        s.state = HhState::Full;
        self.threads[thread].send(ToManager::Full { thread, stripe });
        Ok(())
    }

    // ----- failures -----

    /// Fails member `i` now; a spare, if any, takes its place and is rebuilt.
    pub fn fail_member(&mut self, i: usize, now_ns: TimeNs) -> Result<(), ArrayError> {
        if i >= self.members.len() {
            return Err(ArrayError::Fail(i, "no such member".into()));
        }
        if self.members[i].state != MemberState::Alive {
            return Err(ArrayError::Fail(i, "already failed".into()));
        }
        let down = self
            .members
            .iter()
            .filter(|m| m.state != MemberState::Alive)
            .count();
        if down + 1 > self.m {
            return Err(ArrayError::Fail(
                i,
                format!("the array tolerates {} failed members", self.m),
            ));
        }
        self.members[i].state = MemberState::Failed;
        self.take_spare(i, now_ns);
        if self.keep_flushed {
            // Conversions issued while the volume was whole trimmed their backups: their
            // parity must be durable before a host crash can find the member gone.
            self.flush_and_release(now_ns).map_err(|e| {
                ArrayError::Fail(i, format!("flushing the other members failed: {e}"))
            })?;
        }
        Ok(())
    }

    /// Puts the first spare, if any, in failed member `i`'s place and starts its rebuild.
    fn take_spare(&mut self, i: usize, now_ns: TimeNs) {
        if !self.spares.is_empty() {
            self.members[i].device = self.spares.remove(0);
            self.members[i].fresh = vec![false; (self.rows + self.vhs_per_member) as usize];
            self.members[i].state = MemberState::Rebuilding {
                upto: 0,
                next_due_ns: now_ns,
                started_ns: now_ns,
            };
        }
    }

    /// Arranges for `member` to fail at `at_ns`.
    pub fn schedule_failure(&mut self, member: usize, at_ns: TimeNs) -> Result<(), ArrayError> {
        if member >= self.members.len() {
            return Err(ArrayError::Fail(member, "no such member".into()));
        }
        self.scheduled_failures.add(at_ns, member);
        Ok(())
    }

    pub fn rebuilding(&self) -> bool {
        self.members
            .iter()
            .any(|m| matches!(m.state, MemberState::Rebuilding { .. }))
    }

    fn apply_scheduled_failures(&mut self, now_ns: TimeNs) -> Result<(), DeviceError> {
        while let Some((at, member)) = self.scheduled_failures.pop_due(now_ns) {
            if self.fail_member(member, at).is_err() {
                self.members[member].state = MemberState::Failed;
            }
        }
        let failed = self
            .members
            .iter()
            .filter(|m| m.state == MemberState::Failed)
            .count();
        if failed > self.m {
            return Err(DeviceError::Failed);
        }
        Ok(())
    }

    /// Rebuilds every unit (HH rows, then VHs) of a replacement whose turn has come.
    fn advance_rebuild(&mut self, now_ns: TimeNs) -> Result<(), DeviceError> {
        let unit_ns = transfer_ns(self.config.chunk_bytes, self.config.rebuild_mb_s);
        let units = self.rows + self.vhs_per_member;
        for i in 0..self.members.len() {
            while let MemberState::Rebuilding {
                upto,
                next_due_ns,
                started_ns,
            } = self.members[i].state
            {
                if upto >= units {
                    self.stats.last_rebuild_ns = Some(next_due_ns.saturating_sub(started_ns));
                    self.members[i].state = MemberState::Alive;
                    self.members[i].fresh = Vec::new();
                    break;
                }
                if next_due_ns > now_ns {
                    break;
                }
                self.background_depth += 1;
                let r = if self.members[i].fresh[upto as usize] {
                    Ok(0)
                } else {
                    self.rebuild_unit(i, upto, next_due_ns)
                };
                self.background_depth -= 1;
                let cost = r?;
                self.members[i].state = MemberState::Rebuilding {
                    upto: upto + 1,
                    next_due_ns: next_due_ns + cost * unit_ns,
                    started_ns,
                };
                self.stats.units_rebuilt += 1;
            }
        }
        Ok(())
    }

    /// Restores one unit of replacement `member`; returns how many chunks it wrote (the
    /// rebuild's rate is in chunks).
    fn rebuild_unit(
        &mut self,
        member: usize,
        unit: u32,
        now_ns: TimeNs,
    ) -> Result<u64, DeviceError> {
        let cs = self.chunk_sectors;
        let cu = self.chunk_units();
        if unit < self.rows {
            let stripe = unit;
            let state = self.stripes[stripe as usize].state;
            let role = (0..self.k)
                .find(|&j| self.data_member(stripe, j) == member)
                .map(Some)
                .unwrap_or(None);
            let lba = self.hh_lba(stripe);
            match state {
                HhState::Free | HhState::Held => Ok(0),
                HhState::Open | HhState::Full => {
                    // Only primaries exist; copy the filled slot from a replica.
                    let Some(j) = role else { return Ok(0) };
                    if j >= self.stripes[stripe as usize].filled as usize {
                        return Ok(0);
                    }
                    let mut buf = vec![0u8; cu];
                    let t = self.read_slot(stripe, j, 0, cs, now_ns, &mut buf, false)?;
                    let tags = self.slot_tags(stripe, j).map(|mut t| {
                        set_kind(&mut t, self.tag_bytes, KIND_PRIMARY);
                        t
                    });
                    self.member_write(member, lba, t, &buf, tags.as_deref(), false)?;
                    Ok(1)
                }
                HhState::Converting | HhState::Striped => {
                    let wanted = match role {
                        Some(j) => j,
                        None => {
                            let r = (0..self.m)
                                .find(|&r| self.parity_member(stripe, r) == member)
                                .expect("a member is data or parity of every stripe");
                            self.k + r
                        }
                    };
                    let (shards, t) = self.reconstruct_rows(stripe, 0, cs, now_ns, wanted)?;
                    let tags = self.reconstruct_tags(stripe, wanted)?;
                    self.member_write(member, lba, t, &shards[wanted], tags.as_deref(), false)?;
                    if wanted >= self.k {
                        self.stripes[stripe as usize].parity_missing &= !(1 << (wanted - self.k));
                    }
                    Ok(1)
                }
            }
        } else {
            let vh = unit - self.rows;
            let stripe = self.members[member].vh_owner[vh as usize];
            if stripe == NONE
                || !matches!(
                    self.stripes[stripe as usize].state,
                    HhState::Open | HhState::Full
                )
            {
                return Ok(0);
            }
            let filled = self.stripes[stripe as usize].filled as usize;
            let mut n = 0;
            for j in 0..filled {
                let mut buf = vec![0u8; cu];
                let t = self.read_slot(stripe, j, 0, cs, now_ns, &mut buf, false)?;
                let tags = self.slot_tags(stripe, j);
                let lba = self.vh_lba(vh, j);
                let transient = self.scala.mode != ScalaMode::ScalaWr;
                self.member_write(member, lba, t, &buf, tags.as_deref(), transient)?;
                n += 1;
            }
            Ok(n)
        }
    }

    fn take_messages(&mut self) -> u64 {
        let total: u64 = self.threads.iter().map(|t| t.messages).sum();
        let d = total - self.messages_taken;
        self.messages_taken = total;
        self.stats.thread_messages = total;
        self.stats.daemon_messages = self.manager.messages;
        d
    }
}

/// The OOB tags of one chunk copy: `meta` in every one of its `chunk_sectors` sectors, each
/// with the checksum of its own payload unit in `data`.
fn meta_tags(
    tag_bytes: usize,
    unit: usize,
    chunk_sectors: u32,
    meta: [u8; META_TAG_BYTES],
    data: &[u8],
) -> Option<Vec<u8>> {
    // Timing-only runs (payload none) keep no bytes, so neither do they keep metadata: it
    // rides in the same program operations and costs no time.
    if tag_bytes < META_TAG_BYTES || unit == 0 {
        return None;
    }
    let mut tags = vec![0u8; tag_bytes * chunk_sectors as usize];
    for (tag, payload) in tags.chunks_mut(tag_bytes).zip(data.chunks(unit)) {
        tag[..META_TAG_BYTES].copy_from_slice(&meta);
        tag[SUM_AT..META_TAG_BYTES].copy_from_slice(&payload_sum(payload).to_le_bytes());
    }
    Some(tags)
}

/// The checksum a sector's tag keeps of its payload unit: CRC-32, which `crc32fast` computes
/// with the CPU's carry-less multiply (it runs over every sector of every chunk written, on
/// serve mode's write path), passed through MurmurHash3's 32-bit finalizer.
///
/// CRC-32 alone is affine over XOR: the XOR of an odd number of whole copies (data and
/// tags alike) is whole again. A lost member's slot decoded from a parity chunk that a host
/// crash left from another generation of its stripe is exactly such an XOR, so with CRC-32
/// alone it passed the check and a read returned other bytes; the finalizer's multiplies
/// make the checksum nonlinear, and such a decode fails it.
fn payload_sum(payload: &[u8]) -> u32 {
    let mut h = crc32fast::hash(payload);
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// Names the tags' payload checksum, for what a volume's state directory records.
pub const PAYLOAD_CHECKSUM: &str = "CRC-32 through murmur3's fmix32";

/// Whether a chunk copy is whole: every sector's tag carries the first one's metadata and
/// the checksum of that sector's payload in `data` (units of `unit` bytes).
fn copy_is_whole(tags: &[u8], data: &[u8], tag_bytes: usize, unit: usize) -> bool {
    let Some(first) = tags.get(..SUM_AT).filter(|_| tag_bytes >= META_TAG_BYTES) else {
        return false;
    };
    tags.chunks(tag_bytes)
        .zip(data.chunks(unit))
        .all(|(tag, payload)| {
            &tag[..SUM_AT] == first
                && tag[SUM_AT..META_TAG_BYTES] == payload_sum(payload).to_le_bytes()
        })
}

/// Whether a chunk copy that in-place writes built is whole: every sector is a hole (no tag,
/// payload zero: never written since its slot was handed out) or carries the first tagged
/// sector's metadata and the checksum of its own payload.
fn copy_is_whole_with_holes(tags: &[u8], data: &[u8], tag_bytes: usize, unit: usize) -> bool {
    if tag_bytes < META_TAG_BYTES {
        return false;
    }
    let first = tags
        .chunks(tag_bytes)
        .find(|tag| tag.iter().any(|&b| b != 0))
        .map(|tag| &tag[..SUM_AT]);
    tags.chunks(tag_bytes)
        .zip(data.chunks(unit))
        .all(|(tag, payload)| {
            if tag.iter().all(|&b| b == 0) {
                payload.iter().all(|&b| b == 0)
            } else {
                Some(&tag[..SUM_AT]) == first
                    && tag[SUM_AT..META_TAG_BYTES] == payload_sum(payload).to_le_bytes()
            }
        })
}

/// Packs ScalaAFA's 72 bits of per-chunk metadata plus the copy's kind (the checksum bytes
/// are filled per sector by [`meta_tags`]).
fn encode_meta(chunk: u32, slot: u8, ts: u32, kind: u8) -> [u8; META_TAG_BYTES] {
    let mut b = [0u8; META_TAG_BYTES];
    b[..4].copy_from_slice(&chunk.to_le_bytes());
    b[4] = slot;
    b[5..9].copy_from_slice(&ts.to_le_bytes());
    b[KIND_AT] = kind;
    b
}

/// Sets the kind byte of every sector's metadata in a chunk's tags (zero tags stay zero:
/// a deallocated slot carries no metadata).
fn set_kind(tags: &mut [u8], tag_bytes: usize, kind: u8) {
    for sector in tags.chunks_mut(tag_bytes) {
        if sector.iter().any(|&b| b != 0) {
            sector[KIND_AT] = kind;
        }
    }
}

/// Unpacks [`encode_meta`]: (chunk, slot, timestamp, kind).
fn decode_meta(b: &[u8]) -> (u32, u8, u32, u8) {
    (
        u32::from_le_bytes(b[..4].try_into().expect("4 bytes")),
        b[4],
        u32::from_le_bytes(b[5..9].try_into().expect("4 bytes")),
        b[9],
    )
}

impl<D: BlockDevice> BlockDevice for ScalaAfa<D> {
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

    /// A user chunk the AMT does not place (never written, or trimmed whole) reads as
    /// zeroes; every other chunk is allocated.
    fn allocation(&self, lba: u64, sectors: u32) -> Option<Vec<(u32, bool)>> {
        let cs = self.chunk_sectors as u64;
        crate::chunk_allocation(lba, sectors, self.info.capacity_sectors, cs, |c| {
            self.amt.get(c as usize).is_none_or(|&a| a != NONE)
        })
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
                let t = self.read(now_ns, cmd.lba, cmd.sectors, out.data)?;
                if self.stats.degraded_reads > before {
                    self.stats.degraded.record(t - now_ns);
                }
                t
            }
            Opcode::Write => {
                // The flush after a FUA write makes the rows held for the last flushed
                // version of a chunk count the FUA write's copies too.
                let written = self.write(now_ns, cmd.lba, cmd.sectors, cmd.data)?;
                crate::answer_fua_after_flush(written, cmd.flags.fua, || self.flush(now_ns))?
            }
            Opcode::Trim => self.trim(now_ns, cmd.lba, cmd.sectors)?,
            Opcode::Flush => self.flush(now_ns)?,
        };
        Ok(Completion {
            done_ns,
            gc_active: false,
        })
    }

    fn background(&mut self, now_ns: TimeNs) -> Option<TimeNs> {
        if self.apply_scheduled_failures(now_ns).is_err() {
            return None;
        }
        let mut next: Option<TimeNs> = self.scheduled_failures.next_ns();
        // The host is idle: the daemon converts every full HG (§5.3).
        if self.serve_manager(now_ns).is_ok() && self.convert_all_full(now_ns).is_ok() {
            if let Some(t) = self.pending.iter().map(|&(t, _)| t).min() {
                let due = t.max(now_ns + 1);
                next = Some(next.map_or(due, |n| n.min(due)));
            }
        }
        let _ = self.recycle_done(now_ns);
        for m in &mut self.members {
            if let Some(t) = m.device.background(now_ns) {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        }
        if self.advance_rebuild(now_ns).is_ok() {
            for m in &self.members {
                if let MemberState::Rebuilding { next_due_ns, .. } = m.state {
                    let due = next_due_ns.max(now_ns + 1);
                    next = Some(next.map_or(due, |n| n.min(due)));
                }
            }
        }
        next
    }

    fn take_host_work(&mut self) -> HostWork {
        let messages = self.take_messages();
        let mut w = std::mem::take(&mut self.work);
        w.messages += messages;
        w
    }
}
