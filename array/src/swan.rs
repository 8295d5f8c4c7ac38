//! SWAN (ATC '19): spatial separation of array-level GC across R-groups.
//!
//! The SSDs form a two-dimensional array: R-groups (columns), each an [`Array`] of its
//! members (RAID 0, 4 or 5). The volume exposes linear 4 KiB blocks (one block per sector);
//! the physical space of every R-group is cut into fixed-size segments written log-structured,
//! a full stripe at a time. The last block of every segment holds its summary (sequence
//! number, the logical address of every block, a checksum), or its last blocks where the
//! summary of a large segment outgrows one. A trim of blocks that held data
//! is logged too, as a trim record, so that a map rebuilt from the summaries keeps it.
//!
//! Only the front-end R-group takes user writes. When its free segments run out it joins the
//! back-end, and the back-end group with the most free segments becomes the front-end. GC
//! runs inside one back-end group at a time, on its own clock that overlaps the front-end's
//! writes: a victim (greedy by default) has its valid blocks read and rewritten into a
//! segment of the same group, and is then trimmed on the members. Reads go to whichever
//! group holds the block; each read is counted by the kind of group that served it
//! (front-end, idle back-end, back-end in GC: the paper's Table 4).

use std::collections::{BTreeMap, VecDeque};

use afa_nand::{fill_unit, sector_token};
use afa_sim::TimeNs;
use afa_ssd::{
    validate_command, BlockDevice, Command, Completion, DeviceError, DeviceInfo, HostWork, Opcode,
    ReadBuffers,
};
use serde::{Deserialize, Serialize};

use crate::log_raid::WriteWindow;
use crate::nvram::Nvram;
use crate::trims::{decode_trim_record, trim_record_bytes, Trims, TRIM_RECORD};
use crate::{Array, ArrayConfig, ArrayError, Level};

const NONE: u32 = u32::MAX;

/// Free segments every R-group keeps for its own GC: the front-end moves on before it would
/// take them, so that a group returned to the back-end can always start cleaning.
const GC_RESERVE_SEGMENTS: usize = 2;

/// When GC is wanted but no back-end group has a victim, how long until it looks again.
const GC_RETRY_NS: TimeNs = 1_000_000;

/// How a victim segment is chosen inside the R-group being cleaned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum VictimPolicy {
    /// The segment with the fewest valid blocks (the paper's choice).
    #[default]
    Greedy,
    /// The oldest segment (lowest sequence number).
    Fifo,
}

/// What a power loss does to the host memory that holds the open stripes and the open
/// segments' block lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum HostMemory {
    /// Battery-backed, as the paper assumes (§4.1): a write is durable once acknowledged, and
    /// recovery takes the open segments from that memory (or its NVRAM log).
    #[default]
    BatteryBacked,
    /// Lost at power loss, as in a host without NVRAM: a write is durable once a FLUSH (or a
    /// FUA write) after it completes. A FLUSH writes the blocks of the user stream's open
    /// stripe that are not yet on the members and a partial summary of the segment so far
    /// into that stripe's last block (which the stripe's own summary takes once it is
    /// full), so recovery finds the flushed blocks without the lost memory. A cleaned victim
    /// is trimmed only once its moved blocks and the user writes that replaced its other
    /// blocks are on the members the same way.
    Volatile,
}

/// The `[array.swan]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SwanConfig {
    /// R-groups; the array's members are split into this many groups of equal width, in
    /// member order (members 0..w form group 0).
    pub groups: u32,
    /// Segment size in bytes: a whole number of the group's stripes.
    pub segment_bytes: u64,
    /// Fraction of the physical segment space kept out of the volume.
    pub spare_fraction: f64,
    pub victim: VictimPolicy,
    /// Background GC runs while the back-end groups hold fewer free segments than this
    /// fraction of one group's segments.
    pub gc_free_target: f64,
    /// A group is cleaned only while its best victim holds at most this fraction of valid
    /// blocks; past it the group counts as compacted.
    pub gc_max_victim_valid: f64,
    /// Back-end groups cleaned at once (1: the paper's one group at a time; Equation 1's
    /// recycle-time argument lets every back-end group clean during its whole stay).
    pub gc_parallel_groups: u32,
    /// Blocks per SSD of the group being cleaned that GC keeps being read at once (SATA's
    /// command queue holds 32); the victim's other reads wait in the host, where user reads
    /// go ahead of them (§3.3: reads "always given highest priority"). 0: every read of a
    /// victim is issued at once.
    pub gc_read_window_blocks: u32,
    /// Host memory holding stripes being written, per stream, in stripes.
    pub buffer_stripes: u32,
    /// Time to copy a user write into host memory, in ns.
    pub buffer_write_ns: u64,
    /// Aging before measuring (paper §5): fraction of the volume written by random writes
    /// after every SSD is trimmed (0: none). Applied by the tool that builds the volume.
    pub age_fraction: f64,
    /// Whether the open stripes survive a power loss (`battery-backed`, the paper's
    /// assumption) or only what a FLUSH wrote out does (`volatile`).
    pub host_memory: HostMemory,
}

impl Default for SwanConfig {
    fn default() -> Self {
        Self {
            groups: 2,
            segment_bytes: 1 << 20,
            spare_fraction: 0.1,
            victim: VictimPolicy::Greedy,
            gc_free_target: 1.0,
            gc_max_victim_valid: 0.95,
            gc_parallel_groups: 1,
            gc_read_window_blocks: 32,
            buffer_stripes: 8,
            buffer_write_ns: 2_000,
            age_fraction: 0.0,
            host_memory: HostMemory::BatteryBacked,
        }
    }
}

/// The kind of R-group that served a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadKind {
    FrontEnd,
    BackEndIdle,
    BackEndGc,
}

/// Reads served by one kind of group.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ReadsByKind {
    /// Member-array read commands.
    pub reads: u64,
    pub sectors: u64,
    pub latency_ns_total: u64,
    pub latency_ns_max: u64,
}

impl ReadsByKind {
    fn record(&mut self, sectors: u32, latency_ns: u64) {
        self.reads += 1;
        self.sectors += sectors as u64;
        self.latency_ns_total += latency_ns;
        self.latency_ns_max = self.latency_ns_max.max(latency_ns);
    }
}

/// A change of role: the front-end moved, or GC started or stopped in a group.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SwanEvent {
    pub t_ns: u64,
    /// "front_end", "gc_start", "gc_stop" (background GC) or "foreground_gc_start",
    /// "foreground_gc_stop" (the writer waits while the next front-end is cleaned).
    pub kind: &'static str,
    pub group: u32,
}

/// One cleaned victim, for the paper's Figure 7.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct VictimSample {
    pub t_ns: u64,
    pub group: u32,
    /// Valid blocks over data blocks of the victim.
    pub utilization: f64,
    /// Free segments in the whole array after it was cleaned.
    pub free_segments: u32,
}

/// SWAN's counters.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SwanStats {
    pub user_sectors: u64,
    pub stripes_written: u64,
    pub segments_written: u64,
    pub segments_cleaned: u64,
    pub gc_sectors_moved: u64,
    /// Times cleaning held the rest of a read run back because the GC stream's buffer was
    /// full, and victims left part-cleaned because their group became the front-end.
    pub gc_append_waits: u64,
    pub gc_victims_abandoned: u64,
    /// Sector reads cleaning issued again after a read its group could not correct (RAID 0
    /// has nothing else to read them from; a flash read error is transient).
    pub gc_read_retries: u64,
    pub front_end_switches: u64,
    /// Times the front-end had to wait for GC (the back-end fell behind), and how long.
    pub foreground_gc_stalls: u64,
    pub foreground_gc_stall_ns: u64,
    pub reads_front_end: ReadsByKind,
    pub reads_back_end_idle: ReadsByKind,
    pub reads_back_end_gc: ReadsByKind,
    /// Reads served from host memory (the open stripes) or of never-written blocks.
    pub reads_buffered_sectors: u64,
    /// Trim records appended to the log (trims of blocks that held data), and moved by GC.
    pub trim_records_written: u64,
    pub trim_records_moved: u64,
    /// With volatile host memory: partial summaries written into the last block of a stripe
    /// not yet full (by FLUSHes, and before victims were trimmed).
    pub partial_summaries: u64,
    /// With volatile host memory and a summary of several blocks: blocks of no address a
    /// FLUSH padded a stripe out with, when its data reached into the summary's slots.
    pub partial_summary_pad_blocks: u64,
    /// Engine time of the user's time 0 (the end of aging).
    pub epoch_ns: u64,
    pub events: Vec<SwanEvent>,
    pub victims: Vec<VictimSample>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SegmentState {
    Free,
    Open,
    Full,
    /// Cleaned, with volatile host memory: the victim stays on the members, untrimmed, until
    /// what it moved and the writes that replaced its other blocks are durable.
    Cleaned,
}

/// A cleaned victim waiting to be trimmed (volatile host memory): it may go once its GC
/// stream has made `gc_mark` blocks durable and the user stream `user_mark`.
#[derive(Debug, Clone, Copy)]
struct CleanedVictim {
    segment: u32,
    group: usize,
    gc_mark: u64,
    user_mark: u64,
}

/// An append point: the open segment and the stripe being filled in host memory.
#[derive(Debug, Clone)]
struct Stream {
    /// Global segment id, NONE when no segment is open.
    segment: u32,
    /// Physical block where the next append goes.
    head: u32,
    stripe_buf: Vec<u8>,
    /// Logical address of every data block appended to the open segment.
    /// Logical address and write sequence number of every data block appended to the open
    /// segment.
    lbas: Vec<(u32, u64)>,
    window: WriteWindow,
    /// Blocks placed in the stream's segments so far (data, pads, summaries), and how many of
    /// them were on the members under a summary when it was last made durable or closed a
    /// segment (what volatile host memory needs to tell a victim may be trimmed).
    placed: u64,
    durable_placed: u64,
    /// When the last stripe write of the stream completes.
    written_ns: TimeNs,
    /// With volatile host memory: whether the last block of the head's stripe holds a
    /// partial summary (a FLUSH put it there, and the stripe's summary takes the block when
    /// the stripe fills), and how many blocks at the start of the stripe are on the members
    /// (the rest go when it fills).
    summary_slot: bool,
    stripe_written: u32,
}

impl Stream {
    fn new(stripe_bytes: usize) -> Self {
        Self {
            segment: NONE,
            head: NONE,
            stripe_buf: vec![0; stripe_bytes],
            lbas: Vec::new(),
            window: WriteWindow::default(),
            placed: 0,
            durable_placed: 0,
            written_ns: 0,
            summary_slot: false,
            stripe_written: 0,
        }
    }
}

/// A victim being cleaned. Its valid blocks are read a window at a time and appended to the
/// group's GC stream in order as their reads complete, so a user read submitted meanwhile
/// waits on an SSD behind at most one window of GC commands, not behind the whole victim.
#[derive(Debug)]
struct Cleaning {
    group: usize,
    victim: u32,
    utilization: f64,
    /// Runs of valid blocks not yet read: first physical block, length.
    unread: VecDeque<(u32, u32)>,
    /// Runs read, not yet appended, in the order they were issued: first physical block,
    /// length, the data, when the read completes.
    reading: VecDeque<(u32, u32, Vec<u8>, TimeNs)>,
    /// When the GC stream may take the next block: its last append returned this.
    append_ready_ns: TimeNs,
}

/// What one step of a cleaning did.
enum CleaningStep {
    /// More to do from this time on.
    Again(TimeNs),
    /// The victim is clean and trimmed, as of this time.
    Done(TimeNs),
}

/// The SWAN volume over R-groups.
#[derive(Debug)]
pub struct Swan<D: BlockDevice> {
    groups: Vec<Array<D>>,
    config: SwanConfig,
    info: DeviceInfo,
    unit: usize,
    width: usize,
    stripe_sectors: u32,
    segment_sectors: u32,
    /// Blocks at the end of every segment that hold its summary (one for the paper's 1 MiB
    /// segments of 4 KiB blocks).
    summary_blocks: u32,
    /// Segments per group.
    group_segments: u32,
    l2p: Vec<u32>,
    p2l: Vec<u32>,
    /// Write sequence number of the data in every physical block: a user write takes the
    /// next number, a GC copy keeps its source's, so the newest version of a block wins a
    /// map rebuild even when an older version was copied into a later segment.
    wseq: Vec<u64>,
    next_wseq: u64,
    /// The live trim records (`trims.rs`): each is a valid block of its segment.
    trims: Trims,
    /// The physical block the last append took.
    last_appended: u32,
    valid: Vec<u32>,
    state: Vec<SegmentState>,
    seq: Vec<u64>,
    next_seq: u64,
    free: Vec<VecDeque<u32>>,
    front: usize,
    user: Stream,
    /// One GC append point per group (only the cleaning group's moves).
    gc_streams: Vec<Stream>,
    /// Per GC lane (`gc_parallel_groups` of them): the group it cleans and its clock.
    gc_group: Vec<Option<usize>>,
    gc_clock_ns: Vec<TimeNs>,
    /// When the user stream may take blocks again after a foreground GC stall: the log has
    /// no head until the stall ends, so every write, trim record and FLUSH summary
    /// submitted meanwhile waits for it, not only the one that found the front-end full.
    user_resume_ns: TimeNs,
    /// Per GC lane, the victim it is cleaning.
    cleaning: Vec<Option<Cleaning>>,
    /// Cleaned victims not yet trimmed (volatile host memory only), oldest first.
    cleaned: Vec<CleanedVictim>,
    /// Per group, when its members next want idle time while the group is an idle back-end
    /// group (None: they have nothing to do until the group is trimmed or changes role).
    idle_next_ns: Vec<Option<TimeNs>>,
    /// Engine time when the user's time 0 began (after aging): added to every time the
    /// user gives, taken off every completion.
    epoch_ns: TimeNs,
    stats: SwanStats,
    /// Where the host NVRAM's contents are kept when they must outlive the process
    /// (`swan_nvram.rs`); in simulation the engine's own memory is the NVRAM.
    nvram: Nvram,
}

/// Segment summaries, NVRAM log frames and ScalaAFA's checkpoints carry this checksum.
pub(crate) use afa_sim::fnv1a;

/// The map a rebuild is assembling from segment summaries and open segments' lists: for
/// every logical block, the version with the highest write sequence number (a GC copy keeps
/// its source's number, so a stale copy in a later segment never wins). A victim is trimmed
/// only once all of it has moved, so a crash while it is cleaned finds a moved block twice,
/// the same version in both places; the one in the segment opened later wins, which need
/// not be the one the live map pointed at (a group's GC segment can be older than the user
/// segment it takes copies from) but holds the same data. Shared by SWAN and Log-RAID.
pub(crate) struct NewestMap {
    /// (write sequence number, segment sequence number, physical block) per logical block.
    best: Vec<(u64, u64, u32)>,
    /// Whether a logical block's newest operation is a trim (its physical block is then the
    /// trim record's, `trims.rs`).
    trimmed: Vec<bool>,
    /// (physical block, write sequence number, segment sequence number) of every trim record
    /// the folded entries list, to be read and taken in by `fold_trim_record`.
    pub trim_records: Vec<(u32, u64, u64)>,
    /// The trim records taken in: physical block → (start, count, write sequence number).
    pub trims_found: BTreeMap<u32, (u32, u32, u64)>,
    /// One past the highest write sequence number seen.
    pub next_wseq: u64,
}

impl NewestMap {
    pub fn new(logical_blocks: usize) -> Self {
        Self {
            best: vec![(0, 0, NONE); logical_blocks],
            trimmed: vec![false; logical_blocks],
            trim_records: Vec::new(),
            trims_found: BTreeMap::new(),
            next_wseq: 1,
        }
    }

    /// Takes in the entries of the segment of sequence number `seq` whose first data block
    /// is physical block `first`.
    pub fn fold(&mut self, first: u32, seq: u64, entries: &[(u32, u64)]) {
        for (i, &(lba, w)) in entries.iter().enumerate() {
            if lba == TRIM_RECORD {
                self.trim_records.push((first + i as u32, w, seq));
                continue;
            }
            if lba == NONE || lba as usize >= self.best.len() {
                continue;
            }
            let (best_w, best_seq, _) = self.best[lba as usize];
            if (w, seq) > (best_w, best_seq) {
                self.best[lba as usize] = (w, seq, first + i as u32);
                self.trimmed[lba as usize] = false;
            }
            self.next_wseq = self.next_wseq.max(w + 1);
        }
    }

    /// Takes in every trim record the folded entries list (`trim_records`), reading its
    /// bytes with `read`. A listed block that holds no record of its write is an error
    /// naming it as `what` ("SWAN block", "Log-RAID sector").
    pub fn fold_trim_records(
        &mut self,
        what: &str,
        mut read: impl FnMut(u32) -> Result<Vec<u8>, DeviceError>,
    ) -> Result<(), DeviceError> {
        for (p, w, seq) in std::mem::take(&mut self.trim_records) {
            let bytes = read(p)?;
            if !self.fold_trim_record(p, w, seq, &bytes) {
                return Err(DeviceError::Medium(format!(
                    "{what} {p} is listed as the trim record of write {w} but does not hold one"
                )));
            }
        }
        Ok(())
    }

    /// Takes in the trim record at physical block `record` (write sequence number `w`, in
    /// the segment of sequence number `seq`), whose bytes are `block`: the trim is the newest
    /// operation of every block of its range no later write reached. Returns false when the
    /// block holds no trim record of that write within the volume.
    pub fn fold_trim_record(&mut self, record: u32, w: u64, seq: u64, block: &[u8]) -> bool {
        let Some((start, count, rw)) = decode_trim_record(block) else {
            return false;
        };
        if rw != w || start as u64 + count as u64 > self.best.len() as u64 {
            return false;
        }
        self.trims_found.insert(record, (start, count, w));
        for lba in start as usize..start as usize + count as usize {
            let (best_w, best_seq, _) = self.best[lba];
            if (w, seq) > (best_w, best_seq) {
                self.best[lba] = (w, seq, record);
                self.trimmed[lba] = true;
            }
        }
        self.next_wseq = self.next_wseq.max(w + 1);
        true
    }

    /// The trim record each trimmed logical block's newest operation is in (NONE for the
    /// others).
    pub fn trim_of(&self) -> Vec<u32> {
        self.best
            .iter()
            .zip(&self.trimmed)
            .map(|(&(_, _, p), &t)| if t { p } else { NONE })
            .collect()
    }

    /// Makes the assembled map the engine's: `l2p`, `p2l`, `wseq` per physical block and
    /// the valid blocks of every segment of `segment_blocks`.
    pub fn install(
        &self,
        l2p: &mut [u32],
        p2l: &mut [u32],
        wseq: &mut [u64],
        valid: &mut [u32],
        segment_blocks: u32,
    ) {
        l2p.fill(NONE);
        p2l.fill(NONE);
        valid.fill(0);
        for (lba, &(w, _, p)) in self.best.iter().enumerate() {
            if p != NONE && !self.trimmed[lba] {
                l2p[lba] = p;
                p2l[p as usize] = lba as u32;
                wseq[p as usize] = w;
                valid[(p / segment_blocks) as usize] += 1;
            }
        }
    }
}

/// Bytes of a summary block besides its 13-byte entries: magic, sequence number, segment
/// id, block count and checksum.
const SUMMARY_OVERHEAD_BYTES: u64 = 8 + 8 + 4 + 4 + 8;

/// The most valid blocks a victim may hold: `gc_max_victim_valid` of a segment's `d` data
/// blocks, and fewer than all of them (a victim must free something). With volatile host
/// memory a victim may also cost blocks besides its valid ones: a partial summary in the GC
/// stream's open stripe (when it must be trimmed before that stripe fills), and with a
/// summary of several blocks up to one block fewer of padding, so a victim with no more
/// invalid blocks than twice the summary's frees nothing.
fn victim_ceiling(gc_max_victim_valid: f64, d: u32, summary_blocks: u32, volatile: bool) -> u32 {
    let ceiling = ((gc_max_victim_valid * d as f64) as u32).min(d.saturating_sub(1));
    if volatile {
        ceiling.min(d.saturating_sub(2 * summary_blocks))
    } else {
        ceiling
    }
}

/// Blocks of `sector_bytes` the summary of a segment of `segment_sectors` blocks takes at
/// its end: the fewest whose bytes hold the entries of the blocks left for data.
fn summary_blocks_for(segment_sectors: u32, sector_bytes: u64) -> u32 {
    (1..segment_sectors)
        .find(|&n| {
            SUMMARY_OVERHEAD_BYTES + 13 * (segment_sectors - n) as u64 <= n as u64 * sector_bytes
        })
        .unwrap_or(segment_sectors)
}

/// Magic at the start of a segment summary block.
pub const SUMMARY_MAGIC: &[u8; 8] = b"SWANSUM1";

/// Encodes a segment summary: magic, sequence number, segment id, block count, then for each
/// data block its 5-byte logical address (0xFF.. for none) and 8-byte write sequence number,
/// and an FNV-1a checksum of all that. Returns None if it does not fit in `unit` bytes.
pub fn encode_summary(
    seq: u64,
    segment: u32,
    entries: &[(u32, u64)],
    unit: usize,
) -> Option<Vec<u8>> {
    encode_summary_as(SUMMARY_MAGIC, seq, segment, entries, unit)
}

/// Magic at the start of a partial summary: the last block of a stripe a FLUSH wrote with
/// volatile host memory before the stripe was full, listing the segment's blocks before it.
pub const PARTIAL_SUMMARY_MAGIC: &[u8; 8] = b"SWANPSM1";

/// Encodes a partial summary: [`encode_summary`]'s layout under [`PARTIAL_SUMMARY_MAGIC`],
/// with an entry for every block of the segment before the summary's own.
pub fn encode_partial_summary(
    seq: u64,
    segment: u32,
    entries: &[(u32, u64)],
    unit: usize,
) -> Option<Vec<u8>> {
    encode_summary_as(PARTIAL_SUMMARY_MAGIC, seq, segment, entries, unit)
}

fn encode_summary_as(
    magic: &[u8; 8],
    seq: u64,
    segment: u32,
    entries: &[(u32, u64)],
    unit: usize,
) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(24 + entries.len() * 13 + 8);
    out.extend_from_slice(magic);
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&segment.to_le_bytes());
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for &(l, w) in entries {
        let v: u64 = if l == NONE { 0xFF_FFFF_FFFF } else { l as u64 };
        out.extend_from_slice(&v.to_le_bytes()[..5]);
        out.extend_from_slice(&w.to_le_bytes());
    }
    seal_block(out, unit)
}

/// Ends an encoded block with the FNV-1a checksum of what it holds and pads it to `unit`
/// bytes; None if it does not fit.
pub(crate) fn seal_block(mut out: Vec<u8>, unit: usize) -> Option<Vec<u8>> {
    let sum = fnv1a(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    if out.len() > unit {
        return None;
    }
    out.resize(unit, 0);
    Some(out)
}

/// A decoded segment summary: (sequence number, segment, (address, write sequence) per block).
pub type Summary = (u64, u32, Vec<(u32, u64)>);

/// Decodes a summary written by [`encode_summary`]; None unless magic and checksum match.
pub fn decode_summary(block: &[u8]) -> Option<Summary> {
    decode_summary_as(SUMMARY_MAGIC, block)
}

/// Decodes a partial summary written by [`encode_partial_summary`].
pub fn decode_partial_summary(block: &[u8]) -> Option<Summary> {
    decode_summary_as(PARTIAL_SUMMARY_MAGIC, block)
}

fn decode_summary_as(magic: &[u8; 8], block: &[u8]) -> Option<Summary> {
    if block.len() < 32 || &block[..8] != magic {
        return None;
    }
    let seq = u64::from_le_bytes(block[8..16].try_into().ok()?);
    let segment = u32::from_le_bytes(block[16..20].try_into().ok()?);
    let count = u32::from_le_bytes(block[20..24].try_into().ok()?) as usize;
    let end = 24usize.checked_add(count.checked_mul(13)?)?;
    if end + 8 > block.len() {
        return None;
    }
    let sum = u64::from_le_bytes(block[end..end + 8].try_into().ok()?);
    if fnv1a(&block[..end]) != sum {
        return None;
    }
    let entries = block[24..end]
        .chunks(13)
        .map(|c| {
            let mut b = [0u8; 8];
            b[..5].copy_from_slice(&c[..5]);
            let v = u64::from_le_bytes(b);
            let lba = if v == 0xFF_FFFF_FFFF { NONE } else { v as u32 };
            let w = u64::from_le_bytes(c[5..13].try_into().expect("13-byte entry"));
            (lba, w)
        })
        .collect();
    Some((seq, segment, entries))
}

impl<D: BlockDevice> Swan<D> {
    /// Builds SWAN over `members` split into `swan.groups` R-groups of `array.level`
    /// (raid0, raid4 or raid5) with `array.chunk_bytes`; spare j goes to group j mod groups.
    pub fn new(
        array: ArrayConfig,
        swan: SwanConfig,
        members: Vec<D>,
        spares: Vec<D>,
    ) -> Result<Self, ArrayError> {
        let groups = (swan.groups as usize).max(1);
        let mut spare_lists: Vec<Vec<D>> = (0..groups).map(|_| Vec::new()).collect();
        for (j, s) in spares.into_iter().enumerate() {
            spare_lists[j % groups].push(s);
        }
        Self::with_group_spares(array, swan, members, spare_lists)
    }

    /// The same with each R-group's spares given: `spare_lists[g]` are group g's, taken in
    /// order as its members fail. A restart in serve mode uses it to hand a group that was
    /// rebuilding onto a spare the same spare's file again.
    pub fn with_group_spares(
        array: ArrayConfig,
        swan: SwanConfig,
        members: Vec<D>,
        spare_lists: Vec<Vec<D>>,
    ) -> Result<Self, ArrayError> {
        let err = |s: String| ArrayError::Config(s);
        if !matches!(array.level, Level::Raid0 | Level::Raid4 | Level::Raid5) {
            return Err(err(format!(
                "swan R-groups are raid0, raid4 or raid5, not {:?}",
                array.level
            )));
        }
        let groups = swan.groups as usize;
        if groups < 2 {
            return Err(err(format!(
                "array.swan.groups = {groups}: SWAN needs at least 2 R-groups (a front-end and a back-end)"
            )));
        }
        if members.len() != array.members as usize || members.len() % groups != 0 {
            return Err(err(format!(
                "array.members = {} ({} devices given) must split evenly into {groups} R-groups",
                array.members,
                members.len()
            )));
        }
        if !(0.0..0.95).contains(&swan.spare_fraction) {
            return Err(err(format!(
                "array.swan.spare_fraction = {} must lie in [0, 0.95)",
                swan.spare_fraction
            )));
        }
        if !(swan.gc_free_target.is_finite() && swan.gc_free_target >= 0.0) {
            return Err(err(format!(
                "array.swan.gc_free_target = {} must be a non-negative number",
                swan.gc_free_target
            )));
        }
        if !(swan.gc_max_victim_valid > 0.0 && swan.gc_max_victim_valid <= 1.0) {
            return Err(err(format!(
                "array.swan.gc_max_victim_valid = {} must lie in (0, 1]",
                swan.gc_max_victim_valid
            )));
        }
        if !(0.0..1.0).contains(&swan.age_fraction) {
            return Err(err(format!(
                "array.swan.age_fraction = {} must lie in [0, 1)",
                swan.age_fraction
            )));
        }
        if swan.gc_parallel_groups == 0 || swan.gc_parallel_groups as usize >= groups {
            return Err(err(format!(
                "array.swan.gc_parallel_groups = {} must lie in [1, groups − 1 = {}]",
                swan.gc_parallel_groups,
                groups - 1
            )));
        }
        if swan.buffer_stripes == 0 {
            return Err(err("array.swan.buffer_stripes must be positive".into()));
        }
        afa_sim::check_step_ns("array.swan.buffer_write_ns", swan.buffer_write_ns).map_err(&err)?;
        let width = members.len() / groups;
        let group_config = ArrayConfig {
            members: width as u32,
            ..array.clone()
        };
        if spare_lists.len() != groups {
            return Err(err(format!(
                "{} spare lists given for {groups} R-groups",
                spare_lists.len()
            )));
        }
        let mut member_iter = members.into_iter();
        let mut arrays = Vec::with_capacity(groups);
        for spares in spare_lists {
            let m: Vec<D> = member_iter.by_ref().take(width).collect();
            arrays.push(Array::new(group_config.clone(), m, spares)?);
        }
        let ainfo = arrays[0].info();
        let sector = ainfo.sector_bytes as u64;
        let stripe_sectors = arrays[0].chunk_sectors() * arrays[0].layout().k as u32;
        if swan.segment_bytes == 0
            || swan.segment_bytes % sector != 0
            || (swan.segment_bytes / sector) % stripe_sectors as u64 != 0
        {
            return Err(err(format!(
                "array.swan.segment_bytes = {} must be a positive multiple of the R-group's stripe ({} B: chunk {} B × {} data members)",
                swan.segment_bytes,
                stripe_sectors as u64 * sector,
                array.chunk_bytes,
                arrays[0].layout().k
            )));
        }
        let segment_sectors = (swan.segment_bytes / sector) as u32;
        if segment_sectors < 2 {
            return Err(err(
                "array.swan.segment_bytes must hold at least two blocks (data and summary)".into(),
            ));
        }
        let unit = ainfo.payload_unit_bytes as usize;
        // The summary takes as many blocks at the end of the segment as its entries need,
        // whatever the payload mode, so that a configuration measured with tokens or without
        // bytes writes what one serving real bytes writes.
        let summary_blocks = summary_blocks_for(segment_sectors, sector);
        if summary_blocks >= segment_sectors {
            return Err(err(format!(
                "array.swan.segment_bytes = {}: the summary of a segment of {segment_sectors} blocks of {sector} B leaves no block for data; use larger segments or larger blocks",
                swan.segment_bytes
            )));
        }
        if swan.host_memory == HostMemory::Volatile && summary_blocks >= stripe_sectors {
            // A FLUSH writes a partial summary, listing every block of the segment before
            // it, into the open stripe's last blocks, as many as the segment's summary in
            // its last stripe, so a stripe must hold more.
            return Err(err(format!(
                "array.swan.host_memory = \"volatile\" needs stripes longer than a segment's summary: a FLUSH writes a partial summary into the end of the open stripe, and with segment_bytes = {} the summary takes {summary_blocks} blocks of {sector} B while a stripe holds {stripe_sectors}; raise chunk_bytes or lower segment_bytes",
                swan.segment_bytes
            )));
        }
        // Members may differ in capacity (an SSD's factory bad blocks come out of its logical
        // space), and so may the groups: every group gets as many segments as the smallest
        // holds, since a segment's id addresses the same blocks in every group.
        let smallest_group_sectors = arrays
            .iter()
            .map(|a| a.info().capacity_sectors)
            .min()
            .unwrap_or(0);
        let group_segments = (smallest_group_sectors / segment_sectors as u64) as u32;
        let needed = GC_RESERVE_SEGMENTS as u32 + 2;
        if group_segments < needed {
            return Err(err(format!(
                "each R-group holds only {group_segments} segments; SWAN needs at least {needed}"
            )));
        }
        let total_segments = group_segments as u64 * groups as u64;
        let physical = total_segments * segment_sectors as u64;
        if physical >= NONE as u64 {
            return Err(err(format!(
                "the array's {physical} blocks exceed SWAN's 2^32 block addresses"
            )));
        }
        let data_per_segment = (segment_sectors - summary_blocks) as u64;
        let logical =
            ((total_segments * data_per_segment) as f64 * (1.0 - swan.spare_fraction)) as u64;
        // GC cleans only segments that hold at most a ceiling of valid blocks (see
        // `victim_max_valid`), fewer than all. Once every group is down to its GC reserve,
        // every segment but the reserves and the open ones (the user stream's and one per GC
        // stream) is full, and if the volume's blocks could leave each of those above the
        // ceiling, the log wedges once written through. (Config soak, seed 9603: 36
        // segments, the volume filling all but the reserves and one more segment per group,
        // and after sequential overwrites every full segment 99.7% valid against a ceiling
        // of 95%.) A volume of fewer blocks than the full segments times one more than the
        // ceiling leaves some full segment under it, so the volume is capped there; the cap
        // also leaves every group its reserve plus one segment, so the log always has
        // somewhere to go. With many segments it does not bind: at the default spare and
        // ceiling, 1 − spare_fraction of the log fits from about 130 segments on.
        let ceiling = victim_ceiling(
            swan.gc_max_victim_valid,
            data_per_segment as u32,
            summary_blocks,
            swan.host_memory == HostMemory::Volatile,
        ) as u64;
        let full_segments = total_segments - groups as u64 * (GC_RESERVE_SEGMENTS as u64 + 1) - 1;
        let cleanable = (full_segments * (ceiling + 1)).saturating_sub(1);
        let logical = logical.min(cleanable);
        if logical == 0 {
            return Err(err("the SWAN volume would be empty".into()));
        }
        let stripe_bytes = stripe_sectors as usize * unit;
        let free = (0..groups as u32)
            .map(|g| (g * group_segments..(g + 1) * group_segments).collect())
            .collect();
        let mut swan_engine = Self {
            info: DeviceInfo {
                capacity_sectors: logical,
                tag_bytes_per_sector: 0,
                max_queue_depth: arrays.iter().map(|a| a.info().max_queue_depth).sum(),
                ..ainfo
            },
            unit,
            width,
            stripe_sectors,
            segment_sectors,
            summary_blocks,
            group_segments,
            l2p: vec![NONE; logical as usize],
            p2l: vec![NONE; physical as usize],
            wseq: vec![0; physical as usize],
            next_wseq: 1,
            trims: Trims::new(logical as usize),
            last_appended: NONE,
            valid: vec![0; total_segments as usize],
            state: vec![SegmentState::Free; total_segments as usize],
            seq: vec![0; total_segments as usize],
            next_seq: 1,
            free,
            front: 0,
            user: Stream::new(stripe_bytes),
            gc_streams: (0..groups).map(|_| Stream::new(stripe_bytes)).collect(),
            gc_group: vec![None; swan.gc_parallel_groups as usize],
            gc_clock_ns: vec![0; swan.gc_parallel_groups as usize],
            user_resume_ns: 0,
            cleaning: (0..swan.gc_parallel_groups).map(|_| None).collect(),
            cleaned: Vec::new(),
            idle_next_ns: vec![Some(0); groups],
            epoch_ns: 0,
            stats: SwanStats::default(),
            nvram: Nvram::default(),
            groups: arrays,
            config: swan,
        };
        swan_engine.event(0, "front_end", 0);
        Ok(swan_engine)
    }

    /// Starts the user's clock at engine time `epoch_ns` (after aging, so that a measured
    /// run starting at 0 finds the members as aging left them). Events and victim samples
    /// stay in engine time; `stats().epoch_ns` says where the user's time 0 is.
    pub fn set_epoch(&mut self, epoch_ns: TimeNs) {
        self.epoch_ns = epoch_ns;
        self.stats.epoch_ns = epoch_ns;
    }

    pub fn config(&self) -> &SwanConfig {
        &self.config
    }
    pub fn stats(&self) -> &SwanStats {
        &self.stats
    }
    /// The R-groups, in order.
    pub fn groups(&self) -> &[Array<D>] {
        &self.groups
    }
    /// Members per R-group.
    pub fn group_width(&self) -> usize {
        self.width
    }
    /// Blocks per segment, and how many of them at its end hold its summary.
    pub fn segment_blocks(&self) -> (u32, u32) {
        (self.segment_sectors, self.summary_blocks)
    }
    /// Every member, group by group.
    pub fn members(&self) -> impl Iterator<Item = &D> {
        self.groups.iter().flat_map(|g| g.members())
    }
    /// Every member, group by group, to reset or read their own measurement counters;
    /// commands must still go through the engine, which alone knows where data lives.
    pub fn members_mut(&mut self) -> impl Iterator<Item = &mut D> {
        self.groups.iter_mut().flat_map(|g| g.members_mut())
    }
    /// The front-end R-group.
    pub fn front_end(&self) -> usize {
        self.front
    }
    /// The R-group being cleaned, if any.
    pub fn gc_group(&self) -> Option<usize> {
        self.gc_group.iter().find_map(|g| *g)
    }
    /// Whether R-group `g` is being cleaned.
    pub fn in_gc(&self, g: usize) -> bool {
        self.gc_group.contains(&Some(g))
    }
    /// Free segments of R-group `g`.
    pub fn free_segments(&self, g: usize) -> usize {
        self.free[g].len()
    }
    /// Sectors the members were asked to write, over all groups.
    pub fn member_write_sectors(&self) -> u64 {
        self.groups
            .iter()
            .map(|g| g.stats().member_write_sectors)
            .sum()
    }
    /// Degraded reads over all groups.
    pub fn degraded_reads(&self) -> u64 {
        self.groups.iter().map(|g| g.stats().degraded_reads).sum()
    }

    /// Arranges for array member `member` (numbered group by group) to fail at `at_ns`.
    pub fn schedule_failure(&mut self, member: usize, at_ns: TimeNs) -> Result<(), ArrayError> {
        let g = member / self.width;
        if g >= self.groups.len() {
            return Err(ArrayError::Fail(member, "no such member".into()));
        }
        self.groups[g].schedule_failure(member % self.width, at_ns)
    }

    /// Whether any R-group is rebuilding a failed member onto a spare.
    pub fn rebuilding(&self) -> bool {
        self.groups.iter().any(|g| g.rebuilding())
    }

    /// Fails array member `member` now (degraded reads follow in RAID 4/5 groups); its
    /// R-group's first spare, if it has one, takes its place.
    pub fn fail_member(&mut self, member: usize, now_ns: TimeNs) -> Result<(), ArrayError> {
        let g = member / self.width;
        if g >= self.groups.len() {
            return Err(ArrayError::Fail(member, "no such member".into()));
        }
        self.groups[g].fail_member(member % self.width, now_ns)
    }

    /// Checks the map against the segment counters (for tests): every mapped block points
    /// back at its address, and every segment's valid count matches its mapped blocks.
    pub fn check_invariants(&self) {
        let mut valid = vec![0u32; self.valid.len()];
        for (lba, &p) in self.l2p.iter().enumerate() {
            if p != NONE {
                assert_eq!(self.p2l[p as usize], lba as u32, "p2l of {p} is not {lba}");
                valid[(p / self.segment_sectors) as usize] += 1;
            }
        }
        self.trims.check(&self.l2p, &self.p2l);
        for r in self.trims.live_records() {
            valid[(r / self.segment_sectors) as usize] += 1;
        }
        assert_eq!(
            valid, self.valid,
            "segment valid counts disagree with the map"
        );
        for (s, st) in self.state.iter().enumerate() {
            if matches!(*st, SegmentState::Free | SegmentState::Cleaned) {
                assert_eq!(
                    self.valid[s], 0,
                    "free or cleaned segment {s} holds valid blocks"
                );
            }
        }
        let free: usize = self.free.iter().map(|f| f.len()).sum();
        let free_state = self
            .state
            .iter()
            .filter(|s| **s == SegmentState::Free)
            .count();
        assert_eq!(free, free_state, "free lists disagree with segment states");
    }

    fn event(&mut self, t_ns: TimeNs, kind: &'static str, group: usize) {
        self.stats.events.push(SwanEvent {
            t_ns,
            kind,
            group: group as u32,
        });
    }

    #[inline]
    fn group_sectors(&self) -> u32 {
        self.group_segments * self.segment_sectors
    }
    #[inline]
    fn group_of(&self, physical: u32) -> usize {
        (physical / self.group_sectors()) as usize
    }
    /// The block's address inside its group's array.
    #[inline]
    fn group_lba(&self, physical: u32) -> u64 {
        (physical % self.group_sectors()) as u64
    }
    /// Data blocks per segment (the last `summary_blocks` hold the summary).
    #[inline]
    fn data_blocks(&self) -> u32 {
        self.segment_sectors - self.summary_blocks
    }

    /// Blocks a partial summary takes at the end of the stripe that holds block `physical`
    /// (volatile host memory): the fewest whose bytes hold an entry for every block of the
    /// segment before them. Early stripes need fewer than the segment's summary, which the
    /// segment's last stripe takes (`summary_blocks`).
    fn partial_summary_blocks(&self, physical: u32) -> u32 {
        let stripe = (physical % self.segment_sectors) / self.stripe_sectors;
        let end = (stripe + 1) * self.stripe_sectors;
        summary_blocks_for(end, self.info.sector_bytes as u64)
    }

    /// Whether `physical` lies in a stripe still being filled in host memory; returns its
    /// payload there.
    fn buffered(&self, physical: u32) -> Option<&[u8]> {
        let g = self.group_of(physical);
        let streams = [&self.user, &self.gc_streams[g]];
        streams.into_iter().find_map(|s| {
            (s.head != NONE
                && physical / self.stripe_sectors == s.head / self.stripe_sectors
                && physical < s.head)
                .then(|| {
                    let off = (physical % self.stripe_sectors) as usize * self.unit;
                    &s.stripe_buf[off..off + self.unit]
                })
        })
    }

    fn invalidate(&mut self, physical: u32) {
        self.p2l[physical as usize] = NONE;
        self.valid[(physical / self.segment_sectors) as usize] -= 1;
    }

    /// Free segments the back-end holds beyond each group's GC reserve.
    fn back_end_free(&self) -> usize {
        (0..self.groups.len())
            .filter(|&g| g != self.front)
            .map(|g| self.free[g].len().saturating_sub(GC_RESERVE_SEGMENTS))
            .sum()
    }

    fn gc_needed(&self) -> bool {
        (self.back_end_free() as f64) < self.config.gc_free_target * self.group_segments as f64
    }

    /// Invalid blocks in group `g`'s full segments: what cleaning it could reclaim.
    fn reclaimable(&self, g: usize) -> u64 {
        let d = self.data_blocks();
        (g as u32 * self.group_segments..(g as u32 + 1) * self.group_segments)
            .filter(|&s| self.state[s as usize] == SegmentState::Full)
            .map(|s| (d - self.valid[s as usize]) as u64)
            .sum()
    }

    /// The back-end group most worth cleaning, if any has a victim.
    fn pick_gc_group(&self) -> Option<usize> {
        (0..self.groups.len())
            .filter(|&g| g != self.front && !self.in_gc(g) && self.pick_victim(g).is_some())
            .max_by_key(|&g| (self.reclaimable(g), std::cmp::Reverse(g)))
    }

    /// Runs background GC steps on the GC clocks up to `now_ns`: GC overlaps the front-end's
    /// writes, one victim at a time, inside one back-end group per lane (one lane by
    /// default: the paper's one group at a time).
    fn advance_gc(&mut self, now_ns: TimeNs) -> Result<(), DeviceError> {
        self.release_cleaned(now_ns, None)?;
        for lane in 0..self.gc_group.len() {
            self.advance_lane(lane, now_ns)?;
        }
        Ok(())
    }

    fn advance_lane(&mut self, lane: usize, now_ns: TimeNs) -> Result<(), DeviceError> {
        loop {
            if self.gc_clock_ns[lane] > now_ns {
                return Ok(());
            }
            let t = self.gc_clock_ns[lane];
            if let Some(mut c) = self.cleaning[lane].take() {
                match self.step_cleaning(&mut c, t)? {
                    CleaningStep::Again(next) => {
                        self.cleaning[lane] = Some(c);
                        self.gc_clock_ns[lane] = next.max(t + 1);
                    }
                    CleaningStep::Done(done) => {
                        self.gc_clock_ns[lane] = done.max(t + 1);
                        if !self.gc_needed() {
                            self.event(self.gc_clock_ns[lane], "gc_stop", c.group);
                            self.gc_group[lane] = None;
                        }
                    }
                }
                continue;
            }
            if self.gc_group[lane].is_none() {
                if !self.gc_needed() {
                    self.gc_clock_ns[lane] = now_ns;
                    return Ok(());
                }
                match self.pick_gc_group() {
                    Some(g) => {
                        self.gc_group[lane] = Some(g);
                        self.event(t, "gc_start", g);
                    }
                    None => {
                        // Nothing is worth cleaning yet; look again after a while rather
                        // than scanning every segment on every command.
                        self.gc_clock_ns[lane] = now_ns + GC_RETRY_NS;
                        return Ok(());
                    }
                }
            }
            let g = self.gc_group[lane].expect("a GC group was chosen");
            match self.start_cleaning(g) {
                Some(c) => self.cleaning[lane] = Some(c),
                None if self.cleaned.iter().any(|c| c.group == g) => {
                    // The victims cleaned and not yet trimmed hold the room the next one
                    // needs: their streams are made durable now so that they can go.
                    let done = self.release_cleaned(t, Some(g))?;
                    self.gc_clock_ns[lane] = done.max(t + 1);
                }
                None => {
                    self.gc_group[lane] = None;
                    self.event(t, "gc_stop", g);
                }
            }
        }
    }

    /// The most valid blocks a victim may hold.
    fn victim_max_valid(&self) -> u32 {
        victim_ceiling(
            self.config.gc_max_victim_valid,
            self.data_blocks(),
            self.summary_blocks,
            self.volatile(),
        )
    }

    /// Blocks group `g`'s GC stream can still take: the rest of its open segment and its
    /// free segments.
    fn gc_room(&self, g: usize) -> u32 {
        let d = self.data_blocks();
        let s = &self.gc_streams[g];
        let open_room = if s.head == NONE {
            0
        } else {
            d - (s.head % self.segment_sectors)
        };
        open_room + self.free[g].len() as u32 * d
    }

    /// The error of a foreground clean that found no victim in any group, with the numbers
    /// that tell which setting to change: the emptiest full segment against the victim
    /// ceiling (`gc_max_victim_valid`) and the room of its group's GC stream.
    fn no_victim_error(&self) -> DeviceError {
        let d = self.data_blocks();
        let emptiest = (0..self.state.len())
            .filter(|&s| self.state[s] == SegmentState::Full)
            .min_by_key(|&s| (self.valid[s], s));
        let Some(s) = emptiest else {
            return DeviceError::VolumeFull(
                "SWAN has no R-group left with a segment worth cleaning: no segment is full".into(),
            );
        };
        let g = s / self.group_segments as usize;
        let log = self.state.len() as u64 * d as u64;
        DeviceError::VolumeFull(format!(
            "SWAN has no R-group left with a segment worth cleaning: the emptiest full \
             segment (R-group {g}) holds {} valid blocks of {d}, a victim may hold at most {} \
             (array.swan.gc_max_victim_valid = {}) and R-group {g}'s GC stream has room for \
             {}; the volume fills {:.0}% of the log, which its cap keeps below what the full \
             segments' ceilings hold, so some segment should have been under the ceiling (a \
             fault of the engine: the configuration and seed reproduce it)",
            self.valid[s],
            self.victim_max_valid(),
            self.config.gc_max_victim_valid,
            self.gc_room(g),
            100.0 * self.info.capacity_sectors as f64 / log as f64
        ))
    }

    /// Chooses a victim in group `g`: a full segment worth cleaning whose valid blocks fit
    /// in the group's free space.
    fn pick_victim(&self, g: usize) -> Option<u32> {
        let d = self.data_blocks();
        let max_valid = self.victim_max_valid();
        let room = self.gc_room(g);
        let candidates = (g as u32 * self.group_segments..(g as u32 + 1) * self.group_segments)
            .filter(|&s| self.state[s as usize] == SegmentState::Full)
            .filter(|&s| self.valid[s as usize] < d && self.valid[s as usize] <= max_valid)
            .filter(|&s| self.valid[s as usize] <= room);
        match self.config.victim {
            VictimPolicy::Greedy => candidates.min_by_key(|&s| (self.valid[s as usize], s)),
            VictimPolicy::Fifo => candidates.min_by_key(|&s| (self.seq[s as usize], s)),
        }
    }

    /// Chooses a victim of group `g` and lists its valid blocks as runs of consecutive
    /// blocks (one read command each); None when the group has nothing worth cleaning.
    fn start_cleaning(&self, g: usize) -> Option<Cleaning> {
        let victim = self.pick_victim(g)?;
        let d = self.data_blocks();
        let first = victim * self.segment_sectors;
        // A run no longer than the window, so that it is never more than one window's read.
        let max_run = match self.config.gc_read_window_blocks {
            0 => u32::MAX,
            w => w.saturating_mul(self.width as u32),
        };
        let mut unread = VecDeque::new();
        let mut p = first;
        while p < first + d {
            if self.p2l[p as usize] == NONE {
                p += 1;
                continue;
            }
            let mut run = 1;
            while p + run < first + d && self.p2l[(p + run) as usize] != NONE && run < max_run {
                run += 1;
            }
            unread.push_back((p, run));
            p += run;
        }
        Some(Cleaning {
            group: g,
            victim,
            utilization: self.valid[victim as usize] as f64 / d as f64,
            unread,
            reading: VecDeque::new(),
            append_ready_ns: 0,
        })
    }

    /// Cleans one victim of group `g` from `now_ns` to its end; returns when it is done, or
    /// None when the group has nothing left worth cleaning.
    fn clean_one(&mut self, g: usize, now_ns: TimeNs) -> Result<Option<TimeNs>, DeviceError> {
        match self.start_cleaning(g) {
            Some(c) => self.finish_cleaning(c, now_ns).map(Some),
            None => Ok(None),
        }
    }

    /// Runs a cleaning's steps one after the other from `now_ns` until the victim is clean.
    fn finish_cleaning(&mut self, mut c: Cleaning, now_ns: TimeNs) -> Result<TimeNs, DeviceError> {
        let mut t = now_ns;
        loop {
            match self.step_cleaning(&mut c, t)? {
                CleaningStep::Again(next) => t = next.max(t + 1),
                CleaningStep::Done(done) => return Ok(done),
            }
        }
    }

    /// Does what cleaning `c` can do at `now_ns`: appends the blocks of the reads that have
    /// completed, in the order they were issued, then issues reads while the window has room.
    /// Every write GC submits is for a time no later than `now_ns`, so a read issued here never
    /// queues on its die behind a GC write booked for later (which once turned cleaning into
    /// read, program, read, program at queue depth 1: "GC issue order" in docs/swan.md).
    fn step_cleaning(
        &mut self,
        c: &mut Cleaning,
        now_ns: TimeNs,
    ) -> Result<CleaningStep, DeviceError> {
        let g = c.group;
        let unit = self.unit;
        while c.append_ready_ns <= now_ns {
            let Some(&(_, _, _, read_done)) = c.reading.front() else {
                break;
            };
            if read_done > now_ns {
                break;
            }
            let (p, run, buf, _) = c.reading.pop_front().expect("a read is in flight");
            let mut t = read_done.max(c.append_ready_ns);
            for i in 0..run {
                if t > now_ns {
                    // The stream's buffer is full until later: the rest of the run waits.
                    self.stats.gc_append_waits += 1;
                    let rest = buf[i as usize * unit..].to_vec();
                    c.reading.push_front((p + i, run - i, rest, read_done));
                    break;
                }
                let q = p + i;
                // A user write or trim since the read leaves nothing to move.
                let lba = self.p2l[q as usize];
                if lba == NONE {
                    continue;
                }
                let wseq = self.wseq[q as usize];
                let data = &buf[i as usize * unit..(i as usize + 1) * unit];
                t = t.max(self.append(Some(g), lba, wseq, data, t)?);
                if lba == TRIM_RECORD {
                    self.trims.moved(q, self.last_appended);
                    self.invalidate(q);
                    self.stats.trim_records_moved += 1;
                }
                self.stats.gc_sectors_moved += 1;
            }
            c.append_ready_ns = t;
        }
        let window = self.config.gc_read_window_blocks as u64 * self.width as u64;
        let mut in_flight: u64 = c
            .reading
            .iter()
            .filter(|r| r.3 > now_ns)
            .map(|r| r.1 as u64)
            .sum();
        while let Some(&(p, run)) = c.unread.front() {
            if window > 0 && in_flight > 0 && in_flight + run as u64 > window {
                break;
            }
            c.unread.pop_front();
            let mut buf = vec![0u8; run as usize * unit];
            let at = self.group_lba(p);
            let done = crate::cleaner_read(
                &mut self.groups[g],
                now_ns,
                at,
                run,
                &mut buf,
                &mut self.stats.gc_read_retries,
            )?;
            c.reading.push_back((p, run, buf, done));
            in_flight += run as u64;
        }
        if !c.reading.is_empty() {
            // Next: when the oldest read completes (appends go in order), or sooner when
            // another read's completion opens the window.
            let oldest = c.reading.front().map_or(now_ns, |r| r.3);
            let window_opens = c.reading.iter().map(|r| r.3).filter(|&d| d > now_ns).min();
            let next = match window_opens {
                Some(w) if !c.unread.is_empty() => w.min(oldest.max(c.append_ready_ns)),
                _ => oldest.max(c.append_ready_ns),
            };
            return Ok(CleaningStep::Again(next));
        }
        debug_assert_eq!(self.valid[c.victim as usize], 0);
        let done = now_ns.max(c.append_ready_ns);
        let trimmed = if self.volatile() {
            // Without battery-backed memory the victim is the only durable copy of what it
            // moved until the GC stream puts it on the members under a summary, and of the
            // older versions of the blocks user writes replaced until the user stream does:
            // a crash after the trim would otherwise lose data a FLUSH had made durable. It
            // waits, whole, until both have (usually when their segments close).
            self.state[c.victim as usize] = SegmentState::Cleaned;
            self.cleaned.push(CleanedVictim {
                segment: c.victim,
                group: g,
                gc_mark: self.gc_streams[g].placed,
                user_mark: self.user.placed,
            });
            done
        } else {
            self.trim_victim(c.victim, done)?
        };
        self.stats.segments_cleaned += 1;
        let free_segments = self.free.iter().map(|f| f.len() as u32).sum();
        self.stats.victims.push(VictimSample {
            t_ns: done,
            group: g as u32,
            utilization: c.utilization,
            free_segments,
        });
        Ok(CleaningStep::Done(trimmed))
    }

    /// Trims a cleaned victim on its group's members and frees it; returns when the trim
    /// is done.
    fn trim_victim(&mut self, victim: u32, now_ns: TimeNs) -> Result<TimeNs, DeviceError> {
        // Trimming the whole segment lets the SSDs erase without moving dead data (§4.2).
        let first = victim * self.segment_sectors;
        let g = self.group_of(first);
        let at = self.group_lba(first);
        let trim = self.groups[g].submit(
            now_ns,
            &Command::trim(at, self.segment_sectors),
            ReadBuffers::none(),
        )?;
        self.state[victim as usize] = SegmentState::Free;
        self.free[g].push_back(victim);
        self.idle_next_ns[g] = Some(0);
        Ok(now_ns.max(trim.done_ns))
    }

    /// Trims the cleaned victims (volatile host memory) whose moved and replaced blocks are
    /// durable. With `force`, first makes durable the streams the victims of group `force`
    /// wait for, as a FLUSH does: for when space is short. Returns when the
    /// trims are done.
    fn release_cleaned(
        &mut self,
        now_ns: TimeNs,
        force: Option<usize>,
    ) -> Result<TimeNs, DeviceError> {
        let mut done = now_ns;
        if self.cleaned.is_empty() {
            return Ok(done);
        }
        if let Some(g) = force {
            // A victim waits for the GC stream of its own group, so only `g`'s can be behind.
            let (gc_behind, user_behind) = self.cleaned.iter().filter(|c| c.group == g).fold(
                (false, false),
                |(gc, user), c| {
                    (
                        gc || self.gc_streams[g].durable_placed < c.gc_mark,
                        user || self.user.durable_placed < c.user_mark,
                    )
                },
            );
            if gc_behind {
                done = done.max(self.make_durable(Some(g), now_ns)?);
            }
            if user_behind {
                done = done.max(self.make_durable(None, now_ns)?);
            }
        }
        let mut i = 0;
        while i < self.cleaned.len() {
            let c = self.cleaned[i];
            let gc = &self.gc_streams[c.group];
            if gc.durable_placed >= c.gc_mark && self.user.durable_placed >= c.user_mark {
                // After the stripe writes that made the moves durable.
                let at = done.max(gc.written_ns).max(self.user.written_ns);
                self.cleaned.remove(i);
                done = done.max(self.trim_victim(c.segment, at)?);
            } else {
                i += 1;
            }
        }
        Ok(done)
    }

    /// Gives the idle back-end groups (neither the front-end nor being cleaned) idle time:
    /// SWAN sends them no command but reads, so their SSDs are idle most of the time, and a
    /// real SSD uses such time for its own work, such as erasing the blocks that SWAN's
    /// TRIMs emptied (`ssd.gc.idle_erase`). Each SSD decides for itself whether it is idle
    /// (no command of the host in flight, the die free); this only lets it look.
    fn idle_back_end(&mut self, now_ns: TimeNs) {
        for g in 0..self.groups.len() {
            if g == self.front || self.in_gc(g) {
                continue;
            }
            if self.idle_next_ns[g].is_none_or(|t| t > now_ns) {
                continue;
            }
            self.idle_next_ns[g] = self.groups[g]
                .members_background(now_ns)
                .map(|t| t.max(now_ns + 1));
        }
    }

    /// Opens a segment for the user stream, moving the front-end when its group runs out.
    /// Returns when appending may go on (later than `now_ns` if GC had to catch up).
    fn open_user_segment(&mut self, now_ns: TimeNs) -> Result<TimeNs, DeviceError> {
        let mut t = now_ns;
        if self.free[self.front].len() <= GC_RESERVE_SEGMENTS {
            let mut next = (0..self.groups.len())
                .filter(|&g| g != self.front)
                .max_by_key(|&g| (self.free[g].len(), std::cmp::Reverse(g)))
                .expect("SWAN has at least two groups");
            if self.free[next].len() <= GC_RESERVE_SEGMENTS {
                // The back-end fell behind: the writer waits while GC frees a segment.
                (t, next) = self.foreground_gc(next, t)?;
            }
            for lane in 0..self.gc_group.len() {
                if self.gc_group[lane] == Some(next) {
                    // The victim stays as far as it got: the blocks appended so far have
                    // moved, the rest are still valid where they were.
                    self.gc_group[lane] = None;
                    if self.cleaning[lane].take().is_some() {
                        self.stats.gc_victims_abandoned += 1;
                    }
                    self.event(t, "gc_stop", next);
                }
            }
            if next != self.front && self.volatile() {
                // The new front-end's GC stream stops: what its cleaned victims wait for
                // goes out now, or they would hold their space while it takes writes.
                t = t.max(self.release_cleaned(t, Some(next))?);
            }
            if next != self.front {
                self.idle_next_ns[self.front] = Some(0);
                self.front = next;
                self.stats.front_end_switches += 1;
                self.event(t, "front_end", next);
            }
            self.user_resume_ns = self.user_resume_ns.max(t);
        }
        let segment = self.free[self.front].pop_front().ok_or_else(|| {
            DeviceError::VolumeFull(format!(
                "SWAN's front-end R-group {} has no free segment",
                self.front
            ))
        })?;
        self.open(segment, None)?;
        Ok(t)
    }

    /// Cleans group `g` (or, if it has nothing left worth cleaning, the group that has the
    /// most to reclaim, the front-end last) until it has a segment beyond its reserve.
    /// Returns when that is done, and the group that has the space.
    fn foreground_gc(
        &mut self,
        mut g: usize,
        now_ns: TimeNs,
    ) -> Result<(TimeNs, usize), DeviceError> {
        let mut t = now_ns.max(self.gc_clock_ns.iter().copied().max().unwrap_or(0));
        // The victims being cleaned in the background are finished first, so that no victim
        // is cleaned twice at once.
        for lane in 0..self.cleaning.len() {
            if let Some(c) = self.cleaning[lane].take() {
                t = t.max(self.finish_cleaning(c, t)?);
            }
        }
        self.stats.foreground_gc_stalls += 1;
        self.event(t, "foreground_gc_start", g);
        while self.free[g].len() <= GC_RESERVE_SEGMENTS {
            match self.clean_one(g, t)? {
                Some(done) => t = t.max(done),
                None if self.cleaned.iter().any(|c| c.group == g) => {
                    t = t.max(self.release_cleaned(t, Some(g))?);
                }
                None => {
                    let front = self.front;
                    let other = (0..self.groups.len())
                        .filter(|&h| h != g && self.pick_victim(h).is_some())
                        .max_by_key(|&h| (h != front, self.reclaimable(h), std::cmp::Reverse(h)));
                    self.event(t, "foreground_gc_stop", g);
                    g = other.ok_or_else(|| self.no_victim_error())?;
                    self.event(t, "foreground_gc_start", g);
                }
            }
        }
        self.event(t, "foreground_gc_stop", g);
        self.stats.foreground_gc_stall_ns += t - now_ns;
        for clock in &mut self.gc_clock_ns {
            *clock = (*clock).max(t);
        }
        Ok((t, g))
    }

    fn open(&mut self, segment: u32, gc: Option<usize>) -> Result<(), DeviceError> {
        self.nvram
            .open(Self::stream_id(gc), segment, self.next_seq)?;
        self.state[segment as usize] = SegmentState::Open;
        self.seq[segment as usize] = self.next_seq;
        self.next_seq += 1;
        let s = match gc {
            Some(g) => &mut self.gc_streams[g],
            None => &mut self.user,
        };
        s.segment = segment;
        s.head = segment * self.segment_sectors;
        s.lbas.clear();
        s.summary_slot = false;
        s.stripe_written = 0;
        Ok(())
    }

    /// Appends one block of logical address `lba` to the user stream (`gc` None) or to
    /// group `gc`'s GC stream. Returns when it is in host memory and the buffer has room.
    fn append(
        &mut self,
        gc: Option<usize>,
        lba: u32,
        wseq: u64,
        data: &[u8],
        now_ns: TimeNs,
    ) -> Result<TimeNs, DeviceError> {
        let mut t = now_ns;
        let head = match gc {
            Some(g) => self.gc_streams[g].head,
            None => self.user.head,
        };
        if head == NONE {
            match gc {
                Some(g) => {
                    let segment = self.free[g].pop_front().ok_or_else(|| {
                        DeviceError::VolumeFull(format!(
                            "SWAN's R-group {g} has no free segment for its cleaning"
                        ))
                    })?;
                    self.open(segment, Some(g))?;
                }
                None => t = self.open_user_segment(now_ns)?,
            }
        }
        // Recorded before anything changes: once this append returns, the block survives
        // the loss of the host's memory.
        self.nvram.block(Self::stream_id(gc), lba, wseq, data)?;
        let unit = self.unit;
        let stripe_sectors = self.stripe_sectors;
        let s = match gc {
            Some(g) => &mut self.gc_streams[g],
            None => &mut self.user,
        };
        let physical = s.head;
        let offset = (physical % stripe_sectors) as usize;
        if unit > 0 {
            s.stripe_buf[offset * unit..(offset + 1) * unit].copy_from_slice(data);
        }
        s.lbas.push((lba, wseq));
        s.head += 1;
        s.placed += 1;
        let invalid = self
            .trims
            .map_appended(&mut self.l2p, &mut self.p2l, lba, physical);
        for p in invalid.into_iter().flatten() {
            self.invalidate(p);
        }
        self.last_appended = physical;
        self.wseq[physical as usize] = wseq;
        self.valid[(physical / self.segment_sectors) as usize] += 1;
        let head = physical + 1;
        let summary_slots = self.partial_summary_blocks(physical);
        let s = match gc {
            Some(g) => &self.gc_streams[g],
            None => &self.user,
        };
        if s.summary_slot && head % stripe_sectors == stripe_sectors - summary_slots {
            // A FLUSH took the stripe's last blocks for its summary: the stripe is full.
            return Ok(t.max(self.complete_stripe(gc, t)?));
        }
        if head % stripe_sectors == 0 {
            t = t.max(self.flush_stripe(gc, t)?);
        }
        if head % self.segment_sectors == self.data_blocks() {
            t = t.max(self.end_segment(gc, t)?);
        }
        Ok(t)
    }

    /// Ends the stream's segment, whose data blocks are all placed: its last
    /// `summary_blocks` take the summary, every stripe they reach is written (a segment is a
    /// whole number of stripes, so the summary ends one) and the segment closes. Returns
    /// when the buffer has room for the next stripe.
    pub(crate) fn end_segment(
        &mut self,
        gc: Option<usize>,
        now_ns: TimeNs,
    ) -> Result<TimeNs, DeviceError> {
        let (unit, n) = (self.unit, self.summary_blocks as usize);
        let stripe_sectors = self.stripe_sectors;
        let s = match gc {
            Some(g) => &self.gc_streams[g],
            None => &self.user,
        };
        let seq = self.seq[s.segment as usize];
        let encoded = encode_summary(seq, s.segment, &s.lbas, unit * n);
        let token = sector_token(s.segment as u64, seq);
        let mut t = now_ns;
        for i in 0..n {
            let s = match gc {
                Some(g) => &mut self.gc_streams[g],
                None => &mut self.user,
            };
            let offset = (s.head % stripe_sectors) as usize;
            let slot = &mut s.stripe_buf[offset * unit..(offset + 1) * unit];
            match &encoded {
                Some(bytes) => slot.copy_from_slice(&bytes[i * unit..(i + 1) * unit]),
                // In token mode a block holds 8 bytes: it carries the sequence number only.
                None => fill_unit(token, slot),
            }
            s.head += 1;
            s.placed += 1;
            if s.head % stripe_sectors == 0 {
                t = t.max(self.flush_stripe(gc, t)?);
            }
        }
        self.close(gc)?;
        Ok(t)
    }

    /// Writes a partial summary of the blocks before the head (the summary of a stripe a
    /// FLUSH wrote part of, with volatile host memory) into the open stripe's last slots,
    /// from the head on (`partial_summary_blocks`). The partial summary takes slots of the
    /// segment: they get entries of no address, so entries stay one per block.
    fn put_partial_summary(&mut self, gc: Option<usize>) {
        let head = match gc {
            Some(g) => self.gc_streams[g].head,
            None => self.user.head,
        };
        let (unit, n) = (self.unit, self.partial_summary_blocks(head) as usize);
        let stripe_sectors = self.stripe_sectors;
        let s = match gc {
            Some(g) => &mut self.gc_streams[g],
            None => &mut self.user,
        };
        let seq = self.seq[s.segment as usize];
        let offset = (s.head % stripe_sectors) as usize;
        let slots = &mut s.stripe_buf[offset * unit..(offset + n) * unit];
        match encode_partial_summary(seq, s.segment, &s.lbas, unit * n) {
            Some(bytes) => slots.copy_from_slice(&bytes),
            // In token mode a block holds 8 bytes: each carries the sequence number only.
            None => {
                for slot in slots.chunks_mut(unit.max(1)) {
                    fill_unit(sector_token(s.segment as u64, seq), slot);
                }
            }
        }
        s.lbas.extend(std::iter::repeat_n((NONE, 0), n));
        s.head += n as u32;
        s.placed += n as u64;
    }

    /// With volatile host memory, ends the head's stripe with a summary in its last slots
    /// (where the head is): the segment's summary if they are the segment's last, a partial
    /// summary otherwise. Writes what of the stripe is not yet on the members and closes the
    /// segment at its end. Returns when the buffer has room for the next stripe.
    fn complete_stripe(
        &mut self,
        gc: Option<usize>,
        now_ns: TimeNs,
    ) -> Result<TimeNs, DeviceError> {
        let d = self.data_blocks();
        let s = match gc {
            Some(g) => &mut self.gc_streams[g],
            None => &mut self.user,
        };
        s.summary_slot = false;
        // In the segment's last stripe the slots are those of the segment's summary.
        if s.head % self.segment_sectors == d {
            return self.end_segment(gc, now_ns);
        }
        self.put_partial_summary(gc);
        let t = self.flush_stripe(gc, now_ns)?;
        // Every block the stream placed is on the members under this stripe's summary.
        let s = match gc {
            Some(g) => &mut self.gc_streams[g],
            None => &mut self.user,
        };
        s.durable_placed = s.placed;
        Ok(t)
    }

    /// With volatile host memory, puts every block appended to the stream on the members
    /// under a summary. The blocks of the open stripe not yet there are written, and a
    /// partial summary listing every block of the segment before the stripe's last slots
    /// (those not yet filled as entries of no address) goes into those slots, as many as its
    /// entries need (`partial_summary_blocks`). Nothing is padded: later appends fill the
    /// rest of the stripe, and once it is full its last slots take the stripe's summary in
    /// place of this one, so a FLUSH costs the log those slots (one block, unless segments
    /// are large), whatever the stripe holds. (When the head already is at the stripe's
    /// summary slots, the summary simply takes them and the stripe is complete; when it is
    /// past their start, which only a summary of several blocks allows, the stripe is padded
    /// out with blocks of no address and the summary goes into the next stripe's end.)
    /// Returns when every stripe the stream has written is on the members.
    fn make_durable(&mut self, gc: Option<usize>, now_ns: TimeNs) -> Result<TimeNs, DeviceError> {
        let unit = self.unit;
        let stripe_sectors = self.stripe_sectors;
        let group_sectors = self.group_sectors();
        let head = match gc {
            Some(g) => self.gc_streams[g].head,
            None => self.user.head,
        };
        let slots = if head == NONE {
            0
        } else {
            self.partial_summary_blocks(head)
        };
        let s = match gc {
            Some(g) => &mut self.gc_streams[g],
            None => &mut self.user,
        };
        if s.segment == NONE || s.placed == s.durable_placed {
            return Ok(now_ns.max(s.written_ns));
        }
        if s.head % stripe_sectors > stripe_sectors - slots {
            // The data reaches into the summary's slots: they are padded with blocks of no
            // address, the stripe goes out, and the summary takes the next stripe's end. The
            // segment's last stripe never gets here (its data ends where its summary starts).
            let segment = s.segment;
            let pad = stripe_sectors - s.head % stripe_sectors;
            while s.head % stripe_sectors != 0 {
                let offset = (s.head % stripe_sectors) as usize;
                s.stripe_buf[offset * unit..(offset + 1) * unit].fill(0);
                s.lbas.push((NONE, 0));
                s.head += 1;
                s.placed += 1;
            }
            self.stats.partial_summary_pad_blocks += u64::from(pad);
            self.flush_stripe(gc, now_ns)?;
            let s = match gc {
                Some(g) => &self.gc_streams[g],
                None => &self.user,
            };
            debug_assert_eq!(s.segment, segment, "a pad never ends a segment");
        }
        let head = match gc {
            Some(g) => self.gc_streams[g].head,
            None => self.user.head,
        };
        let n = self.partial_summary_blocks(head);
        let last = stripe_sectors - n;
        let s = match gc {
            Some(g) => &mut self.gc_streams[g],
            None => &mut self.user,
        };
        let filled = s.head % stripe_sectors;
        if filled == last {
            let segment = s.segment;
            self.complete_stripe(gc, now_ns)?;
            let s = match gc {
                Some(g) => &self.gc_streams[g],
                None => &self.user,
            };
            if s.segment == segment {
                self.stats.partial_summaries += 1;
            }
            return Ok(now_ns.max(s.written_ns));
        }
        let seq = self.seq[s.segment as usize];
        let mut entries = s.lbas.clone();
        entries.resize(s.lbas.len() + (last - filled) as usize, (NONE, 0));
        let slots = &mut s.stripe_buf[last as usize * unit..];
        match encode_partial_summary(seq, s.segment, &entries, unit * n as usize) {
            Some(bytes) => slots.copy_from_slice(&bytes),
            // In token mode a block holds 8 bytes: each carries the sequence number only.
            None => {
                for slot in slots.chunks_mut(unit.max(1)) {
                    fill_unit(sector_token(s.segment as u64, seq), slot);
                }
            }
        }
        let start = s.head - filled;
        let g = (start / group_sectors) as usize;
        let base = (start % group_sectors) as u64;
        let from = s.stripe_written;
        // The data first: a crash between the two writes then leaves the previous summary,
        // which lists none of these blocks, rather than a summary listing blocks not there.
        if filled > from {
            let data = &s.stripe_buf[from as usize * unit..filled as usize * unit];
            let c = self.groups[g].submit(
                now_ns,
                &Command::write(base + from as u64, filled - from, data),
                ReadBuffers::none(),
            )?;
            s.written_ns = s.written_ns.max(c.done_ns);
        }
        let c = self.groups[g].submit(
            now_ns,
            &Command::write(base + last as u64, n, &s.stripe_buf[last as usize * unit..]),
            ReadBuffers::none(),
        )?;
        s.written_ns = s.written_ns.max(c.done_ns);
        s.summary_slot = true;
        s.stripe_written = filled;
        s.durable_placed = s.placed;
        self.stats.partial_summaries += 1;
        Ok(now_ns.max(s.written_ns))
    }

    fn volatile(&self) -> bool {
        self.config.host_memory == HostMemory::Volatile
    }

    fn close(&mut self, gc: Option<usize>) -> Result<(), DeviceError> {
        let s = match gc {
            Some(g) => &mut self.gc_streams[g],
            None => &mut self.user,
        };
        let segment = s.segment;
        s.segment = NONE;
        s.head = NONE;
        // The summary stripe is written: every block the stream placed is under a summary.
        s.durable_placed = s.placed;
        self.state[segment as usize] = SegmentState::Full;
        self.stats.segments_written += 1;
        // The summary is on the members: the segment's records may leave the NVRAM log.
        self.compact_nvram()
    }

    /// A FLUSH of the volume. With battery-backed host memory (the paper's §4.1
    /// assumption) the open stripes are durable where they are, so it needs only the
    /// members' own flushes, and the NVRAM log's when that memory is kept in one. With
    /// volatile host memory the user stream's open stripe goes out first, under a partial
    /// summary; the GC streams need not, since a victim stays whole on the members until
    /// what it moved is durable.
    fn flush(&mut self, now_ns: TimeNs) -> Result<TimeNs, DeviceError> {
        self.nvram.sync()?;
        let mut done = now_ns;
        let mut at = now_ns;
        if self.volatile() {
            // The summary goes into the user stream, which a foreground GC stall may hold,
            // and the members' flushes must follow it.
            at = now_ns.max(self.user_resume_ns);
            done = self.make_durable(None, at)?;
            // Victims that waited for these user writes may go (not waited for: a trim
            // adds nothing to what the FLUSH made durable).
            self.release_cleaned(at, None)?;
        }
        for g in &mut self.groups {
            done = done.max(
                g.submit(at, &Command::flush(), ReadBuffers::none())?
                    .done_ns,
            );
        }
        Ok(done)
    }

    /// Writes what of the stream's full stripe (the one just before its head) is not yet on
    /// the members: the whole stripe as one full-stripe write, or, when a FLUSH (volatile
    /// host memory) already wrote its first blocks, the rest of it. Returns when the buffer
    /// has room for the next stripe.
    fn flush_stripe(&mut self, gc: Option<usize>, now_ns: TimeNs) -> Result<TimeNs, DeviceError> {
        let capacity = self.config.buffer_stripes as usize;
        let unit = self.unit;
        let stripe_sectors = self.stripe_sectors;
        let group_sectors = self.group_sectors();
        let s = match gc {
            Some(g) => &mut self.gc_streams[g],
            None => &mut self.user,
        };
        let from = std::mem::take(&mut s.stripe_written);
        let start = s.head - stripe_sectors;
        let g = (start / group_sectors) as usize;
        let c = self.groups[g].submit(
            now_ns,
            &Command::write(
                (start % group_sectors) as u64 + from as u64,
                stripe_sectors - from,
                &s.stripe_buf[from as usize * unit..],
            ),
            ReadBuffers::none(),
        )?;
        self.stats.stripes_written += 1;
        s.written_ns = s.written_ns.max(c.done_ns);
        Ok(s.window.admit(now_ns, c.done_ns, capacity))
    }

    fn write(&mut self, now_ns: TimeNs, cmd: &Command<'_>) -> Result<TimeNs, DeviceError> {
        let unit = self.unit;
        let mut done = now_ns + self.config.buffer_write_ns;
        let zeros = vec![0u8; unit];
        for i in 0..cmd.sectors as usize {
            let data = if unit > 0 {
                &cmd.data[i * unit..(i + 1) * unit]
            } else {
                &zeros[..]
            };
            let wseq = self.next_wseq;
            self.next_wseq += 1;
            // A stall met by an earlier sector, or by an earlier write, holds this one too.
            let at = now_ns.max(self.user_resume_ns);
            let t = self.append(None, (cmd.lba + i as u64) as u32, wseq, data, at)?;
            done = done.max(t + self.config.buffer_write_ns);
        }
        self.stats.user_sectors += cmd.sectors as u64;
        Ok(done)
    }

    fn read_kind(&self, g: usize) -> ReadKind {
        if g == self.front {
            ReadKind::FrontEnd
        } else if self.in_gc(g) {
            ReadKind::BackEndGc
        } else {
            ReadKind::BackEndIdle
        }
    }

    fn read(
        &mut self,
        now_ns: TimeNs,
        cmd: &Command<'_>,
        out: &mut [u8],
    ) -> Result<TimeNs, DeviceError> {
        let unit = self.unit;
        let mut done = now_ns + self.config.buffer_write_ns;
        let n = cmd.sectors as usize;
        let mut i = 0usize;
        while i < n {
            let physical = self.l2p[cmd.lba as usize + i];
            if physical == NONE {
                out[i * unit..(i + 1) * unit].fill(0);
                self.stats.reads_buffered_sectors += 1;
                i += 1;
                continue;
            }
            if let Some(bytes) = self.buffered(physical) {
                out[i * unit..(i + 1) * unit].copy_from_slice(bytes);
                self.stats.reads_buffered_sectors += 1;
                i += 1;
                continue;
            }
            // The longest run of consecutive blocks of one segment, read in one command.
            let mut run = 1u32;
            while i + (run as usize) < n
                && self.l2p[cmd.lba as usize + i + run as usize] == physical + run
                && (physical + run) % self.segment_sectors != 0
                && self.buffered(physical + run).is_none()
            {
                run += 1;
            }
            let g = self.group_of(physical);
            let kind = self.read_kind(g);
            let at = self.group_lba(physical);
            let c = self.groups[g].submit(
                now_ns,
                &Command::read(at, run),
                ReadBuffers {
                    data: &mut out[i * unit..(i + run as usize) * unit],
                    tags: None,
                },
            )?;
            let by_kind = match kind {
                ReadKind::FrontEnd => &mut self.stats.reads_front_end,
                ReadKind::BackEndIdle => &mut self.stats.reads_back_end_idle,
                ReadKind::BackEndGc => &mut self.stats.reads_back_end_gc,
            };
            by_kind.record(run, c.done_ns - now_ns);
            done = done.max(c.done_ns);
            i += run as usize;
        }
        Ok(done)
    }

    /// Trims a range. Unless none of its blocks has held data, the trim goes into the log
    /// as a trim record (one block, appended like a write, with its own write sequence
    /// number), so that a map rebuilt from the summaries after a crash keeps the blocks
    /// trimmed instead of giving them an older copy back.
    fn trim(&mut self, now_ns: TimeNs, cmd: &Command<'_>) -> Result<TimeNs, DeviceError> {
        let (start, count) = (cmd.lba as u32, cmd.sectors);
        let done = now_ns + self.config.buffer_write_ns;
        if !self.trims.must_log(&self.l2p, start, count) {
            return Ok(done);
        }
        let wseq = self.next_wseq;
        self.next_wseq += 1;
        let data = trim_record_bytes(start, count, wseq, self.unit);
        let at = now_ns.max(self.user_resume_ns);
        let t = self.append(None, TRIM_RECORD, wseq, &data, at)?;
        for p in self
            .trims
            .record(self.last_appended, start, count, &mut self.l2p)
        {
            self.invalidate(p);
        }
        self.stats.trim_records_written += 1;
        Ok(done.max(t + self.config.buffer_write_ns))
    }

    /// Rebuilds the map as after a loss of the host's DRAM: the summary in the last block(s) of
    /// every segment is read from the members, the open segments' lists come from the
    /// battery-backed host memory (the paper's §4.1 assumption, which also keeps the open
    /// stripes), and for every logical block the version with the highest write sequence
    /// number wins; a trim counts as a write of its range (its record is a log block with a
    /// summary entry of its own), so a trimmed block stays trimmed. Needs payload `full` (a
    /// summary is a block's real bytes). Returns when the summary and trim record reads are
    /// done.
    pub fn rebuild_map(&mut self, now_ns: TimeNs) -> Result<TimeNs, DeviceError> {
        self.rebuild_map_with(now_ns, &BTreeMap::new())
    }

    /// [`Self::rebuild_map`], with the blocks of the open segments that a recovery holds in
    /// its NVRAM log (by physical block) read from there: a stripe the log holds may not have
    /// reached the members.
    pub(crate) fn rebuild_map_with(
        &mut self,
        now_ns: TimeNs,
        logged: &BTreeMap<u32, Vec<u8>>,
    ) -> Result<TimeNs, DeviceError> {
        let now_ns = now_ns + self.epoch_ns;
        let sector = self.info.sector_bytes as usize;
        if self.unit != sector {
            return Err(DeviceError::Unsupported(
                "rebuilding the SWAN map needs payload mode full: summaries are real bytes".into(),
            ));
        }
        let d = self.data_blocks();
        // A cleaned victim not yet trimmed is a full segment again: its summary is read
        // like any other, and cleaning finds it empty or not as the rebuilt map says.
        self.cleaned.clear();
        let mut newest = NewestMap::new(self.l2p.len());
        let mut done = now_ns;
        let mut block = vec![0u8; self.unit];
        let open: Vec<(u32, Vec<(u32, u64)>)> = std::iter::once(&self.user)
            .chain(&self.gc_streams)
            .filter(|st| st.segment != NONE)
            .map(|st| (st.segment, st.lbas.clone()))
            .collect();
        for segment in 0..self.state.len() as u32 {
            let first = segment * self.segment_sectors;
            let entries = if let Some((_, lbas)) = open.iter().find(|(s, _)| *s == segment) {
                self.state[segment as usize] = SegmentState::Open;
                lbas.clone()
            } else {
                let mut summary = Vec::with_capacity(self.summary_blocks as usize * self.unit);
                for p in first + d..first + self.segment_sectors {
                    done = done.max(self.read_block(p, now_ns, &mut block)?);
                    summary.extend_from_slice(&block);
                }
                let mut found = match decode_summary(&summary) {
                    Some((seq, id, entries)) if id == segment && entries.len() == d as usize => {
                        Some((seq, entries))
                    }
                    _ => None,
                };
                if found.is_none() && self.volatile() {
                    found = self
                        .find_partial_summary(segment, now_ns, &mut done)?
                        .map(|(seq, _, entries)| (seq, entries));
                }
                match found {
                    Some((seq, entries)) => {
                        // A segment a crash left with a partial summary is closed as it is:
                        // its blocks past the summary were never flushed, and cleaning takes
                        // back the rest of its space.
                        self.state[segment as usize] = SegmentState::Full;
                        self.seq[segment as usize] = seq;
                        self.next_seq = self.next_seq.max(seq + 1);
                        entries
                    }
                    None => {
                        self.state[segment as usize] = SegmentState::Free;
                        Vec::new()
                    }
                }
            };
            newest.fold(first, self.seq[segment as usize], &entries);
        }
        newest.fold_trim_records("SWAN block", |p| {
            if let Some(b) = logged.get(&p) {
                Ok(b.clone())
            } else if let Some(b) = self.buffered(p) {
                Ok(b.to_vec())
            } else {
                done = done.max(self.read_block(p, now_ns, &mut block)?);
                Ok(block.clone())
            }
        })?;
        self.next_wseq = self.next_wseq.max(newest.next_wseq);
        self.trims.install_rebuilt(
            &newest,
            &mut self.l2p,
            &mut self.p2l,
            &mut self.wseq,
            &mut self.valid,
            self.segment_sectors,
        );
        for (g, free) in self.free.iter_mut().enumerate() {
            let range = g as u32 * self.group_segments..(g as u32 + 1) * self.group_segments;
            *free = range
                .filter(|&s| self.state[s as usize] == SegmentState::Free)
                .collect();
        }
        Ok(done - self.epoch_ns)
    }

    /// The newest partial summary of `segment`: the last `partial_summary_blocks` of each of
    /// its stripes are read, the last stripe first, and the first that hold a partial summary
    /// of this segment listing every block before them are the ones the last FLUSH wrote (a
    /// cleaned segment is trimmed whole, so older ones read as zeroes). Adds the reads to
    /// `done`.
    fn find_partial_summary(
        &mut self,
        segment: u32,
        now_ns: TimeNs,
        done: &mut TimeNs,
    ) -> Result<Option<Summary>, DeviceError> {
        let first = segment * self.segment_sectors;
        let stripes = self.segment_sectors / self.stripe_sectors;
        let mut block = vec![0u8; self.unit];
        let mut blocks = Vec::with_capacity(self.summary_blocks as usize * self.unit);
        for stripe in (0..stripes).rev() {
            let n = self.partial_summary_blocks(first + stripe * self.stripe_sectors);
            let offset = (stripe + 1) * self.stripe_sectors - n;
            blocks.clear();
            for p in first + offset..first + offset + n {
                *done = (*done).max(self.read_block(p, now_ns, &mut block)?);
                blocks.extend_from_slice(&block);
            }
            if let Some(summary) = decode_partial_summary(&blocks) {
                if summary.1 == segment && summary.2.len() == offset as usize {
                    return Ok(Some(summary));
                }
            }
        }
        Ok(None)
    }

    /// Recovers a volume with volatile host memory after a power loss: builds the map from
    /// the members alone, from the summaries of the full segments and the newest partial
    /// summary of each segment a FLUSH wrote out. Every write a completed FLUSH (or FUA)
    /// covered is there; later ones may be. Call on a volume just built over the same
    /// members. Returns when the summary reads are done.
    pub fn recover_volatile(&mut self, now_ns: TimeNs) -> Result<TimeNs, DeviceError> {
        if !self.volatile() {
            return Err(DeviceError::Unsupported(
                "a SWAN volume with battery-backed host memory recovers from its NVRAM log \
                 (array.swan.host_memory = \"battery-backed\")"
                    .into(),
            ));
        }
        let done = self.rebuild_map_with(now_ns, &BTreeMap::new())?;
        // No segment is open: the group with the most free segments takes the writes, as
        // when the front-end moves.
        self.front = (0..self.groups.len())
            .max_by_key(|&g| (self.free[g].len(), std::cmp::Reverse(g)))
            .expect("SWAN has at least two groups");
        Ok(done)
    }

    /// Reads physical block `p` from its group into `out`; returns when it is there.
    fn read_block(
        &mut self,
        p: u32,
        now_ns: TimeNs,
        out: &mut [u8],
    ) -> Result<TimeNs, DeviceError> {
        let (g, at) = (self.group_of(p), self.group_lba(p));
        let buffers = ReadBuffers {
            data: out,
            tags: None,
        };
        Ok(self.groups[g]
            .submit(now_ns, &Command::read(at, 1), buffers)?
            .done_ns)
    }

    /// Trims every member's whole capacity (the paper's "clean" step before aging). Only
    /// allowed while the volume holds no data.
    pub fn trim_members(&mut self, now_ns: TimeNs) -> Result<TimeNs, DeviceError> {
        if self.l2p.iter().any(|&p| p != NONE) {
            return Err(DeviceError::Unsupported(
                "trimming the members of a SWAN volume that holds data".into(),
            ));
        }
        let mut done = now_ns;
        for g in &mut self.groups {
            let cap = g.info().capacity_sectors;
            let mut at = 0u64;
            while at < cap {
                let n = (cap - at).min(u32::MAX as u64 / 2) as u32;
                let c = g.submit(now_ns, &Command::trim(at, n), ReadBuffers::none())?;
                done = done.max(c.done_ns);
                at += n as u64;
            }
        }
        Ok(done)
    }
}

impl<D: BlockDevice> BlockDevice for Swan<D> {
    fn info(&self) -> DeviceInfo {
        self.info
    }

    /// Every R-group's members' and spares' flash faults together.
    fn media_faults(&self) -> afa_nand::MediaFaults {
        self.groups.iter().map(|g| g.media_faults()).sum()
    }

    /// A trim of blocks that held data is a trim record in the log, appended (and kept in
    /// the NVRAM) like a write, so after a power loss the rebuilt map keeps them trimmed.
    fn trim_is_durable(&self) -> bool {
        true
    }

    /// A sector the map does not place (never written, or trimmed) reads as zeroes.
    fn allocation(&self, lba: u64, sectors: u32) -> Option<Vec<(u32, bool)>> {
        crate::chunk_allocation(lba, sectors, self.info.capacity_sectors, 1, |s| {
            self.l2p.get(s as usize).is_none_or(|&p| p != NONE)
        })
    }

    fn submit(
        &mut self,
        now_ns: TimeNs,
        cmd: &Command<'_>,
        out: ReadBuffers<'_>,
    ) -> Result<Completion, DeviceError> {
        validate_command(&self.info, cmd, &out)?;
        let now_ns = now_ns + self.epoch_ns;
        self.advance_gc(now_ns)?;
        self.idle_back_end(now_ns);
        let done_ns = match cmd.opcode {
            Opcode::Write => {
                // The stripes the write filled went to members that may cache them.
                let written = self.write(now_ns, cmd)?;
                crate::answer_fua_after_flush(written, cmd.flags.fua, || self.flush(now_ns))?
            }
            Opcode::Read => self.read(now_ns, cmd, out.data)?,
            Opcode::Trim => self.trim(now_ns, cmd)?,
            Opcode::Flush => self.flush(now_ns)?,
        };
        Ok(Completion {
            done_ns: done_ns - self.epoch_ns,
            gc_active: self.gc_group.iter().any(Option::is_some),
        })
    }

    fn background(&mut self, now_ns: TimeNs) -> Option<TimeNs> {
        let now_ns = now_ns + self.epoch_ns;
        if self.advance_gc(now_ns).is_err() {
            return None;
        }
        let mut next = (0..self.gc_group.len())
            .filter(|&l| self.gc_group[l].is_some())
            .map(|l| self.gc_clock_ns[l].max(now_ns + 1))
            .min();
        for g in &mut self.groups {
            if let Some(t) = g.background(now_ns) {
                next = Some(next.map_or(t, |n: TimeNs| n.min(t)));
            }
        }
        next.map(|t| t.saturating_sub(self.epoch_ns))
    }

    fn take_host_work(&mut self) -> HostWork {
        let mut w = HostWork::default();
        for g in &mut self.groups {
            w.add(&g.take_host_work());
        }
        w
    }
}

#[path = "swan_nvram.rs"]
mod nvram;

#[cfg(test)]
#[path = "swan_tests.rs"]
mod tests;
