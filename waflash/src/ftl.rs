//! The FTL: page allocation striped over the planes, the baseline read-modify-write page
//! FTL, MV-FTL (§III-B), compacted partial pages (§III-C), greedy GC that merges versions,
//! and idle-time merging.
//!
//! Each physical page carries, in its OOB area, the logical page it belongs to and the
//! written-sector pattern (a bitmask of sectors; Fig. 5's patterns are two of its values).
//! A compacted page carries the marker `COMPACTED` in place of the logical page, and its
//! page header (0xFFFF marker and ⟨LPN, offset, len⟩ index) in the page's metadata area.
//!
//! The OOB area also holds the page's write sequence number: a GC copy keeps its source's, a
//! new write or merge takes the next one. That is what power-loss recovery orders versions
//! by (see [`Ftl::recover`]): the mapping table, reference counts and free lists are
//! controller DRAM, the medium and its OOB areas are all that survive.

use std::collections::BTreeSet;

use afa_nand::{Geometry, Nand};
use afa_sim::TimeNs;
use afa_ssd::DeviceError;
use serde::Serialize;

use crate::config::{FtlKind, WaflashConfig};
use crate::mapping::MappingTable;
use crate::WaflashError;

const NONE: u32 = u32::MAX;
/// OOB logical-page value of a compacted page: its pieces are listed in its header.
const COMPACTED: u32 = u32::MAX - 1;
/// The identifier a compacted page begins with (§III-C).
pub const COMPACTED_MARKER: u16 = 0xFFFF;
/// Bytes of one index entry: LPN (4), physical offset, first logical sector and length in
/// sectors (1 each).
pub const INDEX_ENTRY_BYTES: usize = 7;
/// Bytes before the index: the marker and the entry count.
pub const HEADER_PREFIX_BYTES: usize = 3;

/// One piece of a compacted page: `len` sectors of logical page `lpn`, starting at sector
/// `first` of that logical page, stored from sector `offset` of the physical page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub lpn: u32,
    pub offset: u8,
    pub first: u8,
    pub len: u8,
}

impl Piece {
    fn mask(&self) -> u64 {
        run_mask(self.first as u32, self.len as u32)
    }
}

/// The runs of consecutive set bits of `mask`, lowest first, as (first bit, length): a
/// run of sectors is copied with one copy rather than a sector at a time.
fn runs(mask: u64) -> impl Iterator<Item = (usize, usize)> {
    let mut m = mask;
    std::iter::from_fn(move || {
        if m == 0 {
            return None;
        }
        let first = m.trailing_zeros();
        let len = (!(m >> first)).trailing_zeros();
        m &= !run_mask(first, len);
        Some((first as usize, len as usize))
    })
}

fn run_mask(first: u32, len: u32) -> u64 {
    let ones = if len >= 64 {
        u64::MAX
    } else {
        (1u64 << len) - 1
    };
    ones << first
}

/// Encodes a compacted page's header: the 0xFFFF marker, the entry count, then one
/// ⟨LPN, offset, first, len⟩ entry per piece.
pub fn encode_header(pieces: &[Piece]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_PREFIX_BYTES + pieces.len() * INDEX_ENTRY_BYTES);
    out.extend_from_slice(&COMPACTED_MARKER.to_be_bytes());
    out.push(pieces.len() as u8);
    for p in pieces {
        out.extend_from_slice(&p.lpn.to_le_bytes());
        out.extend_from_slice(&[p.offset, p.first, p.len]);
    }
    out
}

/// Decodes a compacted page's header; anything that does not begin with the marker or is
/// cut short is an error naming the problem.
pub fn decode_header(bytes: &[u8]) -> Result<Vec<Piece>, WaflashError> {
    Ok(header_index(bytes)?
        .chunks_exact(INDEX_ENTRY_BYTES)
        .map(index_entry)
        .collect())
}

/// The index of a compacted page's header: its ⟨LPN, offset, first, len⟩ entries, after
/// the marker and the entry count have been checked.
fn header_index(bytes: &[u8]) -> Result<&[u8], WaflashError> {
    if bytes.len() < HEADER_PREFIX_BYTES || bytes[..2] != COMPACTED_MARKER.to_be_bytes() {
        return Err(WaflashError::Header(
            "the page does not begin with the 0xFFFF compaction marker".into(),
        ));
    }
    let count = bytes[2] as usize;
    let body = &bytes[HEADER_PREFIX_BYTES..];
    if body.len() != count * INDEX_ENTRY_BYTES {
        return Err(WaflashError::Header(format!(
            "the header announces {count} entries but holds {} bytes of index",
            body.len()
        )));
    }
    Ok(body)
}

fn index_entry(c: &[u8]) -> Piece {
    Piece {
        lpn: u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
        offset: c[4],
        first: c[5],
        len: c[6],
    }
}

/// What the FTL did, for the report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct FtlStats {
    /// Logical pages handed to the FTL by the buffer (flush, eviction).
    pub page_writes: u64,
    pub full_page_writes: u64,
    /// Partial pages handed to the FTL (the unaligned writes that reached flash).
    pub partial_page_writes: u64,
    /// Extra flash reads in the write path: read-modify-write of an old version, reads of
    /// a compacted piece being overwritten, and reads of forced merges.
    pub extra_reads: u64,
    /// Partial pages written as a new version without reading the old one.
    pub version_writes: u64,
    /// Writes that found `max_versions` versions and merged them in the foreground.
    pub forced_merges: u64,
    pub gc_merges: u64,
    pub idle_merges: u64,
    /// Compacted physical pages written and the pieces they held.
    pub compacted_pages: u64,
    pub compacted_pieces: u64,
    /// Header bytes written in compacted pages.
    pub compaction_header_bytes: u64,
    /// Host reads that needed more than one flash page for one logical page.
    pub multi_version_reads: u64,
    pub gc_runs: u64,
    pub gc_pages_moved: u64,
    /// Programs that failed (`faults.program_fail_probability`): each was written again on
    /// another page, and its block retired at its next GC.
    pub program_failures: u64,
    /// Blocks taken out of service: retired after a failed program, or bad after a failed
    /// erase.
    pub blocks_retired: u64,
    /// Partial pages that would have become another version (a new version or a compacted
    /// piece) but were merged with their old versions instead, because the versions already
    /// kept filled their share of the spare space (`Ftl::version_room`).
    pub versions_refused_for_space: u64,
    /// Pages with versions merged in the foreground to give back a page the versions had
    /// borrowed from logical pages not written yet, when one of those was written.
    pub merges_for_space: u64,
}

/// The part of the FTL's state that is on flash: each page's OOB area (logical page,
/// written-sector pattern, sequence number) and each compacted page's header.
#[derive(Debug)]
pub struct FlashMeta {
    oob_lpn: Vec<u32>,
    oob_mask: Vec<u64>,
    oob_seq: Vec<u64>,
    headers: Headers,
    /// Blocks where a program failed and which GC has not retired yet, by block (empty:
    /// none). The controller records the mark on flash when the program fails, as it
    /// records a bad block, so that a power loss does not put the block back in service.
    retiring: Vec<bool>,
}

#[cfg(test)]
impl FlashMeta {
    /// Writes `lpn` into the OOB area of `ppn`, as a medium damaged outside the
    /// controller's knowledge would hold (tests of recovery's errors).
    pub(crate) fn corrupt_oob_lpn(&mut self, ppn: u32, lpn: u32) {
        self.oob_lpn[ppn as usize] = lpn;
    }
}

/// Pages programmed and blocks erased over some stretch of time.
#[derive(Debug, Default)]
pub struct Changes {
    pub pages: Vec<u32>,
    pub blocks: Vec<u32>,
}

impl FlashMeta {
    /// The OOB areas of a medium of `pages` pages none of which is programmed.
    pub(crate) fn blank(pages: usize) -> Self {
        Self {
            oob_lpn: vec![NONE; pages],
            oob_mask: vec![0; pages],
            oob_seq: vec![0; pages],
            headers: Headers::new(pages as u64),
            retiring: Vec::new(),
        }
    }

    /// Records that a program failed in `block` of a medium of `blocks` blocks (from a
    /// flash image's block table).
    pub(crate) fn mark_retiring(&mut self, block: u32, blocks: u32) {
        if self.retiring.is_empty() {
            self.retiring = vec![false; blocks as usize];
        }
        self.retiring[block as usize] = true;
    }

    /// Restores the OOB area of `ppn` (and its compaction header, when not empty) from a
    /// flash image.
    pub(crate) fn restore(&mut self, ppn: u32, lpn: u32, mask: u64, seq: u64, header: &[u8]) {
        let i = ppn as usize;
        self.oob_lpn[i] = lpn;
        self.oob_mask[i] = mask;
        self.oob_seq[i] = seq;
        if !header.is_empty() {
            self.headers.insert(ppn, header.to_vec());
        }
    }
}

/// What recovery after a power loss found on the medium.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct FtlRecovery {
    /// Programmed pages whose OOB was read (compacted pages among them).
    pub pages_scanned: u64,
    pub compacted_pages_scanned: u64,
    /// Pages consumed by a program the power loss interrupted: no OOB, nothing readable.
    pub torn_pages: u64,
    /// Pages holding a version of some logical page after recovery; the others scanned
    /// are stale and wait for GC.
    pub live_pages: u64,
    /// Logical pages with data, and those of them with more than one version.
    pub mapped_pages: u64,
    pub multi_version_pages: u64,
    /// Blocks a plane was writing, kept open at their write pointer.
    pub open_blocks: u64,
    /// Bad blocks (retired or failed to erase), skipped.
    pub bad_blocks: u64,
    /// Blocks a failed program marked for retirement that GC had not retired yet.
    pub retiring_blocks: u64,
    /// Logical pages merged because recovery found more than `max_versions` versions.
    pub merges: u64,
}

#[derive(Debug)]
pub(crate) struct Ftl {
    geometry: Geometry,
    kind: FtlKind,
    compaction: bool,
    spp: u32,
    full_mask: u64,
    unit: usize,
    mv_threshold: u32,
    max_versions: usize,
    gc_threshold: usize,
    pub map: MappingTable,
    /// The OOB areas and compacted-page headers: the part of the FTL's state that is on
    /// flash and survives a power loss.
    oob_lpn: Vec<u32>,
    oob_mask: Vec<u64>,
    oob_seq: Vec<u64>,
    headers: Headers,
    /// The sequence number the next new page (a write or a merge) is stamped with.
    next_seq: u64,
    /// Flash programs and erases left before an injected power loss, and whether it has
    /// happened (after which the FTL refuses everything).
    power_budget: Option<u64>,
    power_lost: bool,
    /// Pages programmed and blocks erased since the last [`Ftl::take_changes`], when a
    /// flash image keeps the medium in a file.
    changes: Option<Changes>,
    refs: Vec<u8>,
    block_valid: Vec<u32>,
    /// Physical pages holding a version some logical page still maps: the sum of
    /// `block_valid`.
    valid_pages: u64,
    /// The most valid pages under which a partial page may still add a version: the logical
    /// pages plus half of the spare pages (see `version_room`).
    version_ceiling_pages: u64,
    block_free: Vec<bool>,
    /// Blocks where a program failed: no more pages are allocated in them, and their next
    /// GC retires them instead of erasing them.
    retire: Vec<bool>,
    free_blocks: Vec<Vec<u32>>,
    active: Vec<u32>,
    /// Per plane, whether its last GC stopped short of the reserve because every block it
    /// could collect was wholly valid. Only an invalidated page in the plane or a block it
    /// opens can give GC something to collect, so both clear the flag; until then the
    /// allocator passes the plane over without scanning its blocks again, and the die a
    /// write will go to is predicted past it (`next_write_die`).
    gc_stuck: Vec<bool>,
    alloc_order: Vec<u32>,
    cursor: usize,
    /// Logical pages with more than one version, for idle-time merging (ordered, so the
    /// order of merges does not depend on hashing).
    multi: BTreeSet<u32>,
    /// Pages of each block handed out by the allocator (a page is allocated just before it
    /// is programmed).
    next_page_hint: Vec<u32>,
    pub stats: FtlStats,
}

/// The headers of the compacted pages, by physical page: a slot per page that holds one,
/// so that a read finds its page's index in one step (4 bytes per physical page).
#[derive(Debug)]
pub(crate) struct Headers {
    slot_of_ppn: Vec<u32>,
    slots: Vec<Vec<u8>>,
    free: Vec<u32>,
}

impl Headers {
    fn new(pages: u64) -> Self {
        Self {
            slot_of_ppn: vec![NONE; pages as usize],
            slots: Vec::new(),
            free: Vec::new(),
        }
    }

    fn insert(&mut self, ppn: u32, header: Vec<u8>) {
        self.remove(ppn);
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize] = header;
                slot
            }
            None => {
                self.slots.push(header);
                self.slots.len() as u32 - 1
            }
        };
        self.slot_of_ppn[ppn as usize] = slot;
    }

    fn remove(&mut self, ppn: u32) {
        let slot = std::mem::replace(&mut self.slot_of_ppn[ppn as usize], NONE);
        if slot != NONE {
            self.slots[slot as usize] = Vec::new();
            self.free.push(slot);
        }
    }

    /// The header of `ppn`, empty when it holds none (which decodes as an error).
    fn get(&self, ppn: u32) -> &[u8] {
        match self.slot_of_ppn[ppn as usize] {
            NONE => &[],
            slot => &self.slots[slot as usize],
        }
    }
}

/// Whether a flash operation may start under an injected power loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Power {
    On,
    /// This operation is the one the power loss interrupts.
    Interrupted,
    /// The power is gone: nothing starts.
    Off,
}

fn nand_err(_: afa_nand::NandError) -> DeviceError {
    DeviceError::Failed
}

impl Ftl {
    /// An FTL with nothing mapped over `nand`, whose bad blocks (factory bad, or found bad
    /// before) it never allocates.
    pub fn new(config: &WaflashConfig, unit: usize, nand: &Nand) -> Result<Self, WaflashError> {
        let g = config.geometry.clone();
        let spp = g.sectors_per_page();
        let pages = g.pages_total();
        let planes = g.planes_total();
        let map = MappingTable::new(config.logical_pages(), pages)?;
        // Consecutive allocations go to different channels first, then chips, dies and
        // planes, so that a burst of writes spreads over the whole medium.
        let mut alloc_order = Vec::with_capacity(planes as usize);
        for k in 0..planes {
            let ch = k % g.channels;
            let r = k / g.channels;
            let chip = r % g.chips_per_channel;
            let r = r / g.chips_per_channel;
            let die = r % g.dies_per_chip;
            let plane = r / g.dies_per_chip;
            alloc_order.push(g.plane_index(ch, chip, die, plane));
        }
        let free_blocks = (0..planes)
            .map(|p| {
                // Popped from the back: the lowest-numbered block is used first.
                let mut v: Vec<u32> = g.blocks_of_plane(p).filter(|&b| !nand.is_bad(b)).collect();
                v.reverse();
                v
            })
            .collect();
        let block_free: Vec<bool> = (0..g.blocks_total()).map(|b| !nand.is_bad(b)).collect();
        let good_pages =
            block_free.iter().filter(|&&good| good).count() as u64 * u64::from(g.pages_per_block);
        let logical_pages = u64::from(config.logical_pages());
        let version_ceiling_pages = logical_pages + good_pages.saturating_sub(logical_pages) / 2;
        Ok(Self {
            kind: config.ftl,
            compaction: config.compaction,
            spp,
            full_mask: run_mask(0, spp),
            unit,
            mv_threshold: config.mv_threshold(),
            max_versions: config.max_versions as usize,
            gc_threshold: config.gc_threshold_blocks as usize,
            map,
            oob_lpn: vec![NONE; pages as usize],
            oob_mask: vec![0; pages as usize],
            oob_seq: vec![0; pages as usize],
            headers: Headers::new(pages),
            next_seq: 1,
            power_budget: None,
            power_lost: false,
            changes: None,
            refs: vec![0; pages as usize],
            block_valid: vec![0; g.blocks_total() as usize],
            valid_pages: 0,
            version_ceiling_pages,
            block_free,
            retire: vec![false; g.blocks_total() as usize],
            free_blocks,
            active: vec![NONE; planes as usize],
            gc_stuck: vec![false; planes as usize],
            alloc_order,
            cursor: 0,
            multi: BTreeSet::new(),
            next_page_hint: vec![0; g.blocks_total() as usize],
            stats: FtlStats::default(),
            geometry: g,
        })
    }

    pub fn full_mask(&self) -> u64 {
        self.full_mask
    }

    pub fn compaction(&self) -> bool {
        self.compaction
    }

    /// Whether a partial page of `mask` would be a compaction piece.
    pub fn is_small(&self, mask: u64) -> bool {
        mask != self.full_mask && mask.count_ones() <= self.mv_threshold
    }

    fn die_of_ppn(&self, ppn: u32) -> u32 {
        let block = ppn / self.geometry.pages_per_block;
        self.geometry
            .die_of_plane(self.geometry.plane_of_block(block))
    }

    /// The die a partial write of `lpn` would read in read-modify-write (its newest
    /// version), if the page is mapped.
    pub fn read_die(&self, lpn: u32) -> Option<u32> {
        self.map.newest(lpn).map(|p| self.die_of_ppn(p))
    }

    /// The position in the round robin of the plane a page allocated at `now_ns` goes to:
    /// the first plane from the cursor on whose die is idle, or the cursor's plane when
    /// every die is busy. This is dynamic allocation as in SSDSim, which assigns a write
    /// to a chip when it dispatches it (a token keeping the order round robin); it is what
    /// makes a full page cheaper than a partial one under congestion, §III-A's premise: the
    /// full page may go to any idle die, the read-modify-write is tied to its old data's.
    fn next_slot(&self, nand: &Nand, now_ns: TimeNs) -> usize {
        let n = self.alloc_order.len();
        (0..n)
            .map(|k| (self.cursor + k) % n)
            .find(|&i| nand.die_free_ns(self.geometry.die_of_plane(self.alloc_order[i])) <= now_ns)
            .unwrap_or(self.cursor)
    }

    /// The die a page write that reads nothing, allocated at `now_ns`, is programmed on:
    /// that of the plane `alloc` takes, which passes over full planes whose GC is known to
    /// be stuck. (A plane whose GC has not yet been found stuck is predicted to be taken;
    /// `alloc` finds out when it tries.)
    pub fn next_write_die(&self, nand: &Nand, now_ns: TimeNs) -> u32 {
        let slot = self.next_slot(nand, now_ns);
        let n = self.alloc_order.len();
        let plane = (0..n)
            .map(|k| self.alloc_order[(slot + k) % n])
            .find(|&plane| !self.passed_over(plane))
            .unwrap_or(self.alloc_order[slot]);
        self.geometry.die_of_plane(plane)
    }

    /// Whether `alloc` passes `plane` over: short of its reserve, its open block full, and
    /// its GC stuck.
    fn passed_over(&self, plane: u32) -> bool {
        self.free_blocks[plane as usize].len() < self.gc_threshold
            && self.gc_stuck[plane as usize]
            && !self.active_has_room(plane)
    }

    /// Whether a partial write of `lpn` with `mask` would need a flash read on this FTL
    /// (read-modify-write).
    pub fn needs_read(&self, lpn: u32, mask: u64) -> bool {
        if mask == self.full_mask || !self.holds_sectors_outside(lpn, mask) {
            return false;
        }
        match self.kind {
            FtlKind::PageRmw => true,
            FtlKind::MultiVersion => mask.count_ones() <= self.mv_threshold && !self.compaction,
        }
    }

    /// Whether a version of `lpn` on flash holds sectors outside `mask`: only such data is
    /// read back when `mask` is written (SSDSim's "un-covered update" read); an old version
    /// whose sectors the write covers entirely is not read, nor is a page never written.
    pub fn holds_sectors_outside(&self, lpn: u32, mask: u64) -> bool {
        self.map
            .iter_versions(lpn)
            .any(|v| self.version_mask(lpn, v) & !mask != 0)
    }

    /// The sectors of `lpn` that some version on flash holds (the rest read as zeroes).
    pub fn sectors_on_flash(&self, lpn: u32) -> u64 {
        self.map
            .iter_versions(lpn)
            .fold(0, |held, v| held | self.version_mask(lpn, v))
    }

    /// Logical pages with more than one version.
    pub fn multi_version_pages(&self) -> usize {
        self.multi.len()
    }

    // ----- allocation and GC -------------------------------------------------------------

    fn alloc_in_plane(&mut self, plane: u32) -> Result<u32, DeviceError> {
        let ppb = self.geometry.pages_per_block;
        let b = self.active[plane as usize];
        if b != NONE {
            let next = self.next_page_hint[b as usize];
            if next < ppb {
                self.next_page_hint[b as usize] += 1;
                return Ok(b * ppb + next);
            }
        }
        let nb = self.free_blocks[plane as usize]
            .pop()
            .ok_or(DeviceError::NoSpace { plane })?;
        self.block_free[nb as usize] = false;
        self.active[plane as usize] = nb;
        // The block it closed can now be collected.
        self.gc_stuck[plane as usize] = false;
        self.next_page_hint[nb as usize] = 1;
        Ok(nb * ppb)
    }

    fn alloc(&mut self, nand: &mut Nand, now_ns: TimeNs) -> Result<u32, DeviceError> {
        let slot = self.next_slot(nand, now_ns);
        self.cursor = (slot + 1) % self.alloc_order.len();
        // A plane whose GC cannot get back to its reserve of free blocks (every block it
        // could collect is wholly valid) is passed over for the next plane in order: new
        // data goes where there is room, and the overwrites it brings free pages in the full
        // plane. GC's relocations draw on the reserve, so a plane that gave it away to new
        // data could no longer collect at all. Planes drift apart in valid pages because a
        // write goes to the next idle die while the versions it replaces stay where they
        // are; with the default 12% spare a few percent more valid pages than the device's
        // average fill a plane. Only when every plane is short does the reserve go.
        let n = self.alloc_order.len();
        for k in 0..n {
            let plane = self.alloc_order[(slot + k) % n];
            let p = plane as usize;
            if self.free_blocks[p].len() < self.gc_threshold {
                if self.gc_stuck[p] {
                    debug_assert_eq!(self.gc_victim(nand, plane), None, "plane {plane} unstuck");
                } else {
                    self.gc(nand, plane, now_ns)?;
                    self.gc_stuck[p] = self.free_blocks[p].len() < self.gc_threshold;
                }
            }
            if self.free_blocks[plane as usize].len() >= self.gc_threshold
                || self.active_has_room(plane)
            {
                return self.alloc_in_plane(plane);
            }
        }
        self.alloc_in_plane(self.alloc_order[slot])
    }

    /// Whether the plane's open block has a page left (so allocating takes no free block).
    fn active_has_room(&self, plane: u32) -> bool {
        let b = self.active[plane as usize];
        b != NONE && self.next_page_hint[b as usize] < self.geometry.pages_per_block
    }

    /// The block of `plane` GC collects next (greedy: fewest valid pages), or None when
    /// every block it could collect is wholly valid and nothing can be reclaimed.
    fn gc_victim(&self, nand: &Nand, plane: u32) -> Option<u32> {
        let active = self.active[plane as usize];
        self.geometry
            .blocks_of_plane(plane)
            .filter(|&b| !self.block_free[b as usize] && b != active && !nand.is_bad(b))
            .min_by_key(|&b| (self.block_valid[b as usize], b))
            .filter(|&b| self.block_valid[b as usize] < self.geometry.pages_per_block)
    }

    fn gc(&mut self, nand: &mut Nand, plane: u32, now_ns: TimeNs) -> Result<(), DeviceError> {
        let ppb = self.geometry.pages_per_block;
        while self.free_blocks[plane as usize].len() < self.gc_threshold {
            let Some(victim) = self.gc_victim(nand, plane) else {
                return Ok(());
            };
            self.stats.gc_runs += 1;
            for page in 0..ppb {
                let ppn = victim * ppb + page;
                if self.refs[ppn as usize] == 0 {
                    continue;
                }
                if self.oob_lpn[ppn as usize] == COMPACTED {
                    self.relocate_compacted(nand, ppn, plane, now_ns)?;
                } else {
                    let lpn = self.oob_lpn[ppn as usize];
                    if self.map.is_multi(lpn) {
                        self.stats.gc_merges += 1;
                        self.merge_into(nand, lpn, now_ns, Some(plane))?;
                    } else {
                        self.copy_page(nand, ppn, lpn, plane, now_ns)?;
                    }
                }
            }
            debug_assert_eq!(self.block_valid[victim as usize], 0);
            let erased = self.erase(nand, victim, now_ns)?;
            for page in 0..ppb {
                let ppn = (victim * ppb + page) as usize;
                self.oob_lpn[ppn] = NONE;
                self.oob_mask[ppn] = 0;
                self.oob_seq[ppn] = 0;
                self.headers.remove(ppn as u32);
            }
            if erased {
                self.next_page_hint[victim as usize] = 0;
                self.block_free[victim as usize] = true;
                self.free_blocks[plane as usize].insert(0, victim);
            }
        }
        Ok(())
    }

    fn copy_page(
        &mut self,
        nand: &mut Nand,
        ppn: u32,
        lpn: u32,
        plane: u32,
        now_ns: TimeNs,
    ) -> Result<(), DeviceError> {
        let mut new = self.alloc_in_plane(plane)?;
        let page_bytes = self.geometry.page_bytes;
        let read_done = nand.read(ppn, now_ns, page_bytes);
        self.program(nand, &mut new, read_done)?;
        nand.store_mut().copy_page(ppn, new);
        // The copy keeps its source's sequence number: it is the same version, from the same
        // point in the page's history.
        self.stamp(
            new,
            lpn,
            self.oob_mask[ppn as usize],
            self.oob_seq[ppn as usize],
        );
        self.remap(lpn, &[new]);
        self.stats.gc_pages_moved += 1;
        Ok(())
    }

    /// Moves the live pieces of a compacted page to a new compacted page.
    fn relocate_compacted(
        &mut self,
        nand: &mut Nand,
        ppn: u32,
        plane: u32,
        now_ns: TimeNs,
    ) -> Result<(), DeviceError> {
        let pieces = self.pieces(ppn);
        let live: Vec<Piece> = pieces
            .into_iter()
            .filter(|p| self.map.iter_versions(p.lpn).any(|v| v == ppn))
            .collect();
        let mut new = self.alloc_in_plane(plane)?;
        let read_done = nand.read(ppn, now_ns, self.geometry.page_bytes);
        self.program(nand, &mut new, read_done)?;
        let mut packed = Vec::with_capacity(live.len());
        let mut at = 0u8;
        for p in &live {
            if self.unit > 0 {
                let u = self.unit;
                let src = p.offset as usize * u..(p.offset + p.len) as usize * u;
                let data = nand.store().page(ppn)[src].to_vec();
                nand.store_mut().page_mut(new)[at as usize * u..(at + p.len) as usize * u]
                    .copy_from_slice(&data);
            }
            packed.push(Piece { offset: at, ..*p });
            at += p.len;
        }
        self.stamp(new, COMPACTED, 0, self.oob_seq[ppn as usize]);
        self.headers.insert(new, encode_header(&packed));
        let mut lpns: Vec<u32> = live.iter().map(|p| p.lpn).collect();
        lpns.dedup();
        for lpn in lpns {
            let vs: Vec<u32> = self
                .map
                .versions(lpn)
                .into_iter()
                .map(|v| if v == ppn { new } else { v })
                .collect();
            self.remap(lpn, &vs);
        }
        self.stats.gc_pages_moved += 1;
        Ok(())
    }

    // ----- flash operations and power loss ---------------------------------------------

    /// Records what a program writes into the page's OOB area (and so survives a power
    /// loss): the logical page (or `COMPACTED`), the written-sector pattern and the sequence
    /// number.
    fn stamp(&mut self, ppn: u32, lpn: u32, mask: u64, seq: u64) {
        self.oob_lpn[ppn as usize] = lpn;
        self.oob_mask[ppn as usize] = mask;
        self.oob_seq[ppn as usize] = seq;
    }

    fn take_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    /// Arms an injected power loss: the controller loses power when it starts its
    /// `operations + 1`-th flash program or erase from now on.
    pub fn cut_power_after(&mut self, operations: u64) {
        self.power_budget = Some(operations);
    }

    pub fn power_lost(&self) -> bool {
        self.power_lost
    }

    /// Whether the next flash operation may start. The one that exhausts the budget is
    /// the one the power loss interrupts (`Interrupted`); none starts after it (`Off`).
    fn power_for_one_more(&mut self) -> Power {
        if self.power_lost {
            return Power::Off;
        }
        match &mut self.power_budget {
            Some(0) => {
                self.power_lost = true;
                Power::Interrupted
            }
            Some(left) => {
                *left -= 1;
                Power::On
            }
            None => Power::On,
        }
    }

    /// Programs the newly allocated page `*ppn` with data in controller memory at
    /// `ready_ns`. A program that fails (an injected fault) consumes its page holding
    /// nothing; its block gets no more pages and is retired at its next GC, and the data is
    /// programmed again on the next page of the same plane, `*ppn` following it. A program
    /// the power loss interrupts is torn: the page is consumed, holding nothing readable and
    /// no OOB, and the controller stops.
    fn program(
        &mut self,
        nand: &mut Nand,
        ppn: &mut u32,
        ready_ns: TimeNs,
    ) -> Result<TimeNs, DeviceError> {
        loop {
            match self.power_for_one_more() {
                Power::On => {}
                Power::Interrupted => {
                    if let Some(c) = &mut self.changes {
                        c.pages.push(*ppn);
                    }
                    nand.program_untimed(*ppn).map_err(nand_err)?;
                    nand.store_mut().clear_page(*ppn);
                    return Err(DeviceError::Failed);
                }
                Power::Off => return Err(DeviceError::Failed),
            }
            if let Some(c) = &mut self.changes {
                c.pages.push(*ppn);
            }
            match nand.program(*ppn, ready_ns) {
                Ok(done) => return Ok(done),
                Err(afa_nand::NandError::ProgramFailed { block, .. }) => {
                    self.stats.program_failures += 1;
                    self.retire[block as usize] = true;
                    let plane = self.geometry.plane_of_block(block);
                    if self.active[plane as usize] == block {
                        self.active[plane as usize] = NONE;
                    }
                    *ppn = self.alloc_in_plane(plane)?;
                }
                Err(e) => return Err(nand_err(e)),
            }
        }
    }

    /// Erases `block`, a GC victim whose live pages have all moved; returns whether it is
    /// free again. A block where a program failed is retired instead (marked bad, with no
    /// flash operation), and an erase that fails leaves its block bad. An erase the power
    /// loss interrupts leaves the block as it was: every live page it held has been copied
    /// first, so recovery sees both copies of them and keeps one.
    fn erase(&mut self, nand: &mut Nand, block: u32, now_ns: TimeNs) -> Result<bool, DeviceError> {
        if std::mem::take(&mut self.retire[block as usize]) {
            nand.retire_block(block);
            self.stats.blocks_retired += 1;
            if let Some(c) = &mut self.changes {
                c.blocks.push(block);
            }
            return Ok(false);
        }
        if self.power_for_one_more() != Power::On {
            return Err(DeviceError::Failed);
        }
        if let Some(c) = &mut self.changes {
            c.blocks.push(block);
        }
        match nand.erase(block, now_ns) {
            Ok(_) => Ok(true),
            Err(afa_nand::NandError::EraseFailed { .. }) => {
                self.stats.blocks_retired += 1;
                Ok(false)
            }
            Err(e) => Err(nand_err(e)),
        }
    }

    // ----- references and versions -------------------------------------------------------

    fn block_of(&self, ppn: u32) -> usize {
        (ppn / self.geometry.pages_per_block) as usize
    }

    fn add_ref(&mut self, ppn: u32) {
        self.refs[ppn as usize] += 1;
        if self.refs[ppn as usize] == 1 {
            let b = self.block_of(ppn);
            self.block_valid[b] += 1;
            self.valid_pages += 1;
        }
    }

    fn drop_ref(&mut self, ppn: u32) {
        self.refs[ppn as usize] -= 1;
        if self.refs[ppn as usize] == 0 {
            let b = self.block_of(ppn);
            self.block_valid[b] -= 1;
            self.valid_pages -= 1;
            // GC may now find a page to reclaim in this plane.
            self.gc_stuck[self.geometry.plane_of_block(b as u32) as usize] = false;
        }
    }

    /// Whether a partial page may become one more version of its logical page (a new
    /// version or a compacted piece) rather than be merged with the versions it has.
    ///
    /// Every version beyond a page's first holds a physical page that a single-version FTL
    /// would have invalidated, so versions eat into the spare space GC lives on. Left
    /// unbounded, small random writes over the whole device (every page written in pieces of
    /// one to three sectors) fill every block with valid versions until GC finds nothing to
    /// reclaim and a write fails for want of space. The paper's MV-FTL counts on the old
    /// version's page staying around until GC anyway (§V-D); that holds only while versions
    /// leave GC something to collect. So the valid pages, versions included, may reach the
    /// logical pages plus half of the spare pages: beyond that a partial page is merged
    /// (read-modify-write), as the baseline FTL does, until merges in GC, in idle time or on
    /// a full-page write bring the count down.
    ///
    /// The ceiling bounds the valid pages, so versions may also use the pages of logical
    /// pages not written yet, as the paper's MV-FTL does on a device the workload has not
    /// filled. Those pages are borrowed: before a page written for the first time adds a
    /// valid page at the ceiling, a page with versions is merged to give one back
    /// (`make_room_for_a_new_page`; one merge frees a page, unless the versions it drops
    /// are compacted pages that other pieces still use, and then it takes another), so the
    /// valid pages do not pass the ceiling while any page has versions to merge. (From 2026-11-30 to 2026-12-02 every logical page not
    /// written yet counted against the ceiling instead, which kept versions to half the
    /// spare on a device a workload had barely touched: `waflash-fig7`'s random write at
    /// 1 KiB then refused 189,237 versions and went through read-modify-write. Before that,
    /// the ceiling held with nothing given back, and a sequential fill in 4 KiB writes with
    /// a flush after each ran out of space with no block holding an invalid page for GC.)
    fn version_room(&self) -> bool {
        self.valid_pages < self.version_ceiling_pages
    }

    /// Before a write adds a valid page that replaces none (a logical page written for the
    /// first time), merges pages with versions until the valid pages are below the ceiling
    /// again; the versions borrowed the pages of logical pages not written yet, and this
    /// write takes one of them back. Each merge leaves its page with one version, so the
    /// loop ends. Returns when the last merge ends (`now_ns` if none was needed, or none
    /// could be made: without versions the valid pages are at most the logical pages, below
    /// the ceiling).
    fn make_room_for_a_new_page(
        &mut self,
        nand: &mut Nand,
        now_ns: TimeNs,
    ) -> Result<TimeNs, DeviceError> {
        let mut done = now_ns;
        while self.valid_pages >= self.version_ceiling_pages {
            let Some(&lpn) = self.multi.first() else {
                break;
            };
            done = done.max(self.merge_into(nand, lpn, now_ns, None)?);
            self.stats.merges_for_space += 1;
        }
        Ok(done)
    }

    /// Replaces the version list of `lpn` (newest first), keeping references counted.
    fn remap(&mut self, lpn: u32, versions: &[u32]) {
        // Most pages have a single version before and after (every full-page write, every
        // read-modify-write): that case is served from the entry itself, without gathering
        // the old list or touching the set of multi-version pages, which the write path
        // would otherwise search on every page it writes.
        let was_multi = self.map.is_multi(lpn);
        if was_multi {
            let old = self.map.versions(lpn);
            for &v in versions {
                if !old.contains(&v) {
                    self.add_ref(v);
                }
            }
            for &v in &old {
                if !versions.contains(&v) {
                    self.drop_ref(v);
                }
            }
        } else {
            let old = self.map.newest(lpn);
            for &v in versions {
                if old != Some(v) {
                    self.add_ref(v);
                }
            }
            if let Some(v) = old.filter(|v| !versions.contains(v)) {
                self.drop_ref(v);
            }
        }
        self.map.set_versions(lpn, versions);
        let is_multi = versions.len() > 1;
        if is_multi && !was_multi {
            self.multi.insert(lpn);
        } else if was_multi && !is_multi {
            self.multi.remove(&lpn);
        }
    }

    fn pieces(&self, ppn: u32) -> Vec<Piece> {
        self.pieces_of(ppn, None).collect()
    }

    /// The pieces of the compacted page `ppn`, only those of `lpn` when it is given, read
    /// from its header's index as a read locates its piece (without collecting them: reads
    /// and merges ask for one page's pieces on every access).
    fn pieces_of(&self, ppn: u32, lpn: Option<u32>) -> impl Iterator<Item = Piece> + '_ {
        // The header was written by this FTL; failing to decode it is a bug, not an input
        // error, so it is an assertion.
        header_index(self.headers.get(ppn))
            .expect("compacted page header decodes")
            .chunks_exact(INDEX_ENTRY_BYTES)
            .map(index_entry)
            .filter(move |p| lpn.is_none_or(|l| p.lpn == l))
    }

    /// Which sectors of `lpn` the physical page `ppn` holds.
    fn version_mask(&self, lpn: u32, ppn: u32) -> u64 {
        if self.oob_lpn[ppn as usize] == COMPACTED {
            self.pieces_of(ppn, Some(lpn)).fold(0, |m, p| m | p.mask())
        } else {
            self.oob_mask[ppn as usize]
        }
    }

    /// Copies sectors `mask` of `lpn` from its version at `ppn` into the page image.
    fn copy_sectors(&self, nand: &Nand, lpn: u32, ppn: u32, mask: u64, image: &mut [u8]) {
        let u = self.unit;
        if u == 0 || mask == 0 {
            return;
        }
        let page = nand.store().page(ppn);
        if self.oob_lpn[ppn as usize] == COMPACTED {
            for p in self.pieces_of(ppn, Some(lpn)) {
                for (s, len) in runs(mask & p.mask()) {
                    // Sector `s` of the logical page sits at `offset + (s − first)` here.
                    let src = (p.offset as usize + s - p.first as usize) * u;
                    image[s * u..(s + len) * u].copy_from_slice(&page[src..src + len * u]);
                }
            }
        } else {
            for (s, len) in runs(mask) {
                image[s * u..(s + len) * u].copy_from_slice(&page[s * u..(s + len) * u]);
            }
        }
    }

    /// Drops versions whose sectors newer versions cover entirely. `versions` is newest
    /// first; `first_mask` is the mask of its first element.
    fn prune(&self, lpn: u32, versions: &[u32], first_mask: u64) -> Vec<u32> {
        let mut covered = first_mask;
        let mut out = vec![versions[0]];
        for &v in &versions[1..] {
            if covered == self.full_mask {
                break;
            }
            let m = self.version_mask(lpn, v);
            if m & !covered != 0 {
                out.push(v);
                covered |= m;
            }
        }
        out
    }

    /// Reads the sectors of `need` that versions of `lpn` hold into `image`, starting at
    /// `now_ns`; sectors no version holds become zeroes. Returns when the data is in
    /// controller memory and the number of flash reads.
    fn gather(
        &mut self,
        nand: &mut Nand,
        lpn: u32,
        need: u64,
        now_ns: TimeNs,
        image: &mut [u8],
    ) -> (TimeNs, u32) {
        let u = self.unit;
        let mut remaining = need;
        let mut done = now_ns;
        let mut reads = 0;
        let sector_bytes = self.geometry.sector_bytes;
        for v in self.map.iter_versions(lpn) {
            if remaining == 0 {
                break;
            }
            // The patterns are in the OOB areas the FTL keeps cached, so it knows which
            // versions to read and reads them in parallel.
            let m = self.version_mask(lpn, v) & remaining;
            if m == 0 {
                continue;
            }
            let t = nand.read(v, now_ns, m.count_ones() * sector_bytes);
            done = done.max(t);
            reads += 1;
            self.copy_sectors(nand, lpn, v, m, image);
            remaining &= !m;
        }
        if u > 0 {
            for (s, len) in runs(remaining) {
                image[s * u..(s + len) * u].fill(0);
            }
        }
        (done, reads)
    }

    fn store_image(&self, nand: &mut Nand, ppn: u32, image: &[u8], mask: u64) {
        let u = self.unit;
        if u == 0 {
            return;
        }
        let page = nand.store_mut().page_mut(ppn);
        if mask == self.full_mask {
            page.copy_from_slice(image);
            return;
        }
        page.fill(0);
        for (s, len) in runs(mask) {
            page[s * u..(s + len) * u].copy_from_slice(&image[s * u..(s + len) * u]);
        }
    }

    /// Writes `lpn` as one merged page holding every sector (those no version holds are
    /// zeroes), invalidating all its versions. `image` already holds the sectors `have`;
    /// the rest are read from flash. Returns when the program ends.
    fn merge_write(
        &mut self,
        nand: &mut Nand,
        lpn: u32,
        mut new: u32,
        have: u64,
        image: &mut [u8],
        now_ns: TimeNs,
    ) -> Result<(TimeNs, u32), DeviceError> {
        let (read_done, reads) = self.gather(nand, lpn, self.full_mask & !have, now_ns, image);
        let done = self.program(nand, &mut new, read_done)?;
        let full = self.full_mask;
        self.store_image(nand, new, image, full);
        let seq = self.take_seq();
        self.stamp(new, lpn, full, seq);
        self.remap(lpn, &[new]);
        Ok((done, reads))
    }

    /// Merges every version of `lpn` into one page (GC when `plane` is given, else idle
    /// merging through the allocator).
    fn merge_into(
        &mut self,
        nand: &mut Nand,
        lpn: u32,
        now_ns: TimeNs,
        plane: Option<u32>,
    ) -> Result<TimeNs, DeviceError> {
        let new = match plane {
            Some(p) => self.alloc_in_plane(p)?,
            None => self.alloc(nand, now_ns)?,
        };
        let mut image = vec![0u8; self.spp as usize * self.unit];
        let (done, _) = self.merge_write(nand, lpn, new, 0, &mut image, now_ns)?;
        Ok(done)
    }

    // ----- the host-facing operations ----------------------------------------------------

    /// Writes the sectors `mask` of `lpn` from the page image `image` (sector `s` at
    /// `image[s * unit..]`), starting at `now_ns`. Returns when the page is programmed.
    pub fn write(
        &mut self,
        nand: &mut Nand,
        lpn: u32,
        mask: u64,
        image: &[u8],
        now_ns: TimeNs,
    ) -> Result<TimeNs, DeviceError> {
        self.stats.page_writes += 1;
        let full = mask == self.full_mask;
        if full {
            self.stats.full_page_writes += 1;
        } else {
            self.stats.partial_page_writes += 1;
        }
        let mapped = self.map.newest(lpn).is_some();
        let room_ns = if mapped {
            now_ns
        } else {
            self.make_room_for_a_new_page(nand, now_ns)?
        };
        // Every page, a read-modify-write's merged page included, is programmed where the
        // allocator puts it (the next idle die of the round robin), as both of the paper's
        // platforms do: VSSIM's page FTL takes the new page from its overall allocator
        // (`GET_NEW_PAGE(.., MODE_OVERALL, ..)`) before it looks at the old one, and SSDSim
        // allocates dynamically, dispatching the write once its update read is done. Only
        // the read is tied to the old version's die. The program waits for the read's data;
        // the die it is booked on stays usable before it, as its calendar fills idle gaps.
        // Allocation may run GC, which may move this page's versions: look at them after.
        let mut new = self.alloc(nand, now_ns)?;
        if full || !mapped {
            let done = self.program(nand, &mut new, now_ns)?;
            self.store_image(nand, new, image, mask);
            let seq = self.take_seq();
            self.stamp(new, lpn, mask, seq);
            self.remap(lpn, &[new]);
            return Ok(done.max(room_ns));
        }
        let mut multi_version =
            self.kind == FtlKind::MultiVersion && mask.count_ones() > self.mv_threshold;
        if multi_version && !self.version_room() {
            self.stats.versions_refused_for_space += 1;
            multi_version = false;
        }
        if multi_version {
            let mut vs = vec![new];
            vs.extend(self.map.versions(lpn));
            let mut vs = self.prune(lpn, &vs, mask);
            if vs.len() <= self.max_versions {
                self.stats.version_writes += 1;
                let done = self.program(nand, &mut new, now_ns)?;
                vs[0] = new;
                self.store_image(nand, new, image, mask);
                let seq = self.take_seq();
                self.stamp(new, lpn, mask, seq);
                self.remap(lpn, &vs);
                return Ok(done);
            }
            self.stats.forced_merges += 1;
        }
        let mut merged = image.to_vec();
        let (done, reads) = self.merge_write(nand, lpn, new, mask, &mut merged, now_ns)?;
        self.stats.extra_reads += reads as u64;
        Ok(done)
    }

    /// Writes a batch of small partial pages (each of at most `mv_threshold` sectors) as
    /// compacted pages. A piece whose newest version is itself a compacted piece is merged
    /// with it first (one read); a piece that grows past the threshold that way is written
    /// as a new version instead. Returns when the last program ends.
    pub fn write_compacted(
        &mut self,
        nand: &mut Nand,
        batch: &[(u32, u64, Vec<u8>)],
        now_ns: TimeNs,
    ) -> Result<TimeNs, DeviceError> {
        let u = self.unit;
        let mut done = now_ns;
        let mut ready = now_ns;
        let mut pack: Vec<(u32, u64, Vec<u8>)> = Vec::with_capacity(batch.len());
        for (lpn, mask, image) in batch {
            let (lpn, mut mask, mut image) = (*lpn, *mask, image.clone());
            self.stats.page_writes += 1;
            self.stats.partial_page_writes += 1;
            if let Some(newest) = self.map.newest(lpn) {
                if self.oob_lpn[newest as usize] == COMPACTED {
                    let m = self.version_mask(lpn, newest) & !mask;
                    if m != 0 {
                        let t =
                            nand.read(newest, now_ns, m.count_ones() * self.geometry.sector_bytes);
                        self.stats.extra_reads += 1;
                        ready = ready.max(t);
                        self.copy_sectors(nand, lpn, newest, m, &mut image);
                        mask |= m;
                    }
                }
            }
            // A piece of a mapped page is one more version of it: with no room for one, it
            // is merged by the ordinary write path instead. A piece grown past the threshold
            // goes there anyway, and that path counts its own refusal.
            let grown = mask.count_ones() > self.mv_threshold;
            let refused = !grown && self.map.newest(lpn).is_some() && !self.version_room();
            if refused {
                self.stats.versions_refused_for_space += 1;
            }
            if refused || grown {
                // Counted once already as a partial page; the write path counts it again, so
                // take it back.
                self.stats.page_writes -= 1;
                self.stats.partial_page_writes -= 1;
                done = done.max(self.write(nand, lpn, mask, &image, ready)?);
                continue;
            }
            pack.push((lpn, mask, image));
        }
        let mut i = 0;
        while i < pack.len() {
            // Fill one physical page with whole pieces in order.
            let mut used = 0u32;
            let mut j = i;
            while j < pack.len() && used + pack[j].1.count_ones() <= self.spp {
                used += pack[j].1.count_ones();
                j += 1;
            }
            // A compacted page that holds a piece of a logical page written for the first
            // time adds a valid page that replaces none.
            if pack[i..j]
                .iter()
                .any(|(lpn, _, _)| self.map.newest(*lpn).is_none())
            {
                done = done.max(self.make_room_for_a_new_page(nand, now_ns)?);
            }
            let mut new = self.alloc(nand, now_ns)?;
            let t = self.program(nand, &mut new, ready)?;
            done = done.max(t);
            let mut pieces = Vec::new();
            let mut at = 0usize;
            if u > 0 {
                nand.store_mut().page_mut(new).fill(0);
            }
            for (lpn, mask, image) in &pack[i..j] {
                // A non-contiguous pattern becomes one index entry per run of sectors.
                for (first, len) in runs(*mask) {
                    if u > 0 {
                        let src = &image[first * u..(first + len) * u];
                        nand.store_mut().page_mut(new)[at * u..(at + len) * u].copy_from_slice(src);
                    }
                    pieces.push(Piece {
                        lpn: *lpn,
                        offset: at as u8,
                        first: first as u8,
                        len: len as u8,
                    });
                    at += len;
                }
            }
            let header = encode_header(&pieces);
            self.stats.compacted_pages += 1;
            self.stats.compacted_pieces += (j - i) as u64;
            self.stats.compaction_header_bytes += header.len() as u64;
            let seq = self.take_seq();
            self.stamp(new, COMPACTED, 0, seq);
            self.headers.insert(new, header);
            for (lpn, mask, image) in &pack[i..j] {
                let mut vs = vec![new];
                vs.extend(self.map.versions(*lpn));
                let vs = self.prune(*lpn, &vs, *mask);
                if vs.len() <= self.max_versions {
                    self.remap(*lpn, &vs);
                } else {
                    // Too many versions: the piece is on flash, but the page is merged
                    // into one full page at once so the chain stays bounded.
                    self.stats.forced_merges += 1;
                    self.remap(*lpn, &vs);
                    let mut img = image.clone();
                    let merged = self.alloc(nand, now_ns)?;
                    let (t, reads) = self.merge_write(nand, *lpn, merged, 0, &mut img, t)?;
                    self.stats.extra_reads += reads as u64;
                    done = done.max(t);
                }
            }
            i = j;
        }
        Ok(done)
    }

    /// Reads sectors `need` of `lpn` into the page image, starting at `now_ns`. Returns when
    /// the data is in controller memory and how many flash pages were read.
    pub fn read(
        &mut self,
        nand: &mut Nand,
        lpn: u32,
        need: u64,
        now_ns: TimeNs,
        image: &mut [u8],
    ) -> (TimeNs, u32) {
        let (done, reads) = self.gather(nand, lpn, need, now_ns, image);
        if reads > 1 {
            self.stats.multi_version_reads += 1;
        }
        (done, reads)
    }

    /// Forgets a logical page (TRIM of the whole page).
    pub fn unmap(&mut self, lpn: u32) {
        self.remap(lpn, &[]);
    }

    /// Whether any logical page has more than one version.
    pub fn has_versions_to_merge(&self) -> bool {
        !self.multi.is_empty()
    }

    /// Merges up to `batch` multi-version pages while the device is idle. Returns when the
    /// last merge ends, or None when there was nothing to merge.
    pub fn idle_merge(
        &mut self,
        nand: &mut Nand,
        now_ns: TimeNs,
        batch: u32,
    ) -> Result<Option<TimeNs>, DeviceError> {
        let mut done = None;
        for _ in 0..batch {
            let Some(&lpn) = self.multi.first() else {
                break;
            };
            let t = self.merge_into(nand, lpn, now_ns, None)?;
            self.stats.idle_merges += 1;
            done = Some(done.unwrap_or(t).max(t));
        }
        Ok(done)
    }

    /// Writes sectors `mask` of a page without timing (preconditioning); the others stay
    /// unwritten.
    pub fn fill_untimed(
        &mut self,
        nand: &mut Nand,
        lpn: u32,
        mask: u64,
        image: &[u8],
    ) -> Result<(), DeviceError> {
        let plane = self.alloc_order[self.cursor];
        self.cursor = (self.cursor + 1) % self.alloc_order.len();
        let new = self.alloc_in_plane(plane)?;
        nand.program_untimed(new).map_err(nand_err)?;
        if let Some(c) = &mut self.changes {
            c.pages.push(new);
        }
        self.store_image(nand, new, image, mask);
        let seq = self.take_seq();
        self.stamp(new, lpn, mask, seq);
        self.remap(lpn, &[new]);
        Ok(())
    }

    // ----- the medium kept in a file ---------------------------------------------------

    /// Starts recording which pages are programmed and which blocks erased, so that a
    /// flash image can write what changed.
    pub fn track_changes(&mut self) {
        self.changes.get_or_insert_with(Changes::default);
    }

    /// The pages programmed and blocks erased since tracking began or the last call, each
    /// once, in order; tracking goes on.
    pub fn take_changes(&mut self) -> Changes {
        let mut c = self
            .changes
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default();
        c.pages.sort_unstable();
        c.pages.dedup();
        c.blocks.sort_unstable();
        c.blocks.dedup();
        c
    }

    /// Records that `block`'s state changed other than by a program or an erase (a factory
    /// bad block an image must learn of).
    pub fn note_block_change(&mut self, block: u32) {
        if let Some(c) = &mut self.changes {
            c.blocks.push(block);
        }
    }

    /// Puts back changes an image failed to take, so that the next attempt writes them.
    pub fn restore_changes(&mut self, taken: Changes) {
        if let Some(c) = &mut self.changes {
            c.pages.extend(taken.pages);
            c.blocks.extend(taken.blocks);
        }
    }

    /// What the OOB area of `ppn` holds (logical page or `u32::MAX` for none, pattern,
    /// sequence number) and the page's compaction header (empty for other pages).
    pub fn page_meta(&self, ppn: u32) -> (u32, u64, u64, &[u8]) {
        let i = ppn as usize;
        (
            self.oob_lpn[i],
            self.oob_mask[i],
            self.oob_seq[i],
            self.headers.get(ppn),
        )
    }

    // ----- power loss and recovery ------------------------------------------------------

    /// What survives a power loss: the OOB areas and the compacted pages' headers (the
    /// medium itself is the caller's). Everything else is controller DRAM.
    pub fn into_flash_meta(self) -> FlashMeta {
        FlashMeta {
            oob_lpn: self.oob_lpn,
            oob_mask: self.oob_mask,
            oob_seq: self.oob_seq,
            headers: self.headers,
            retiring: self.retire,
        }
    }

    /// Whether a program failed in `block` and GC has not retired it yet.
    pub fn retiring(&self, block: u32) -> bool {
        self.retire[block as usize]
    }

    /// Rebuilds the FTL from the medium after a power loss, as the controller does when the
    /// power comes back. Every programmed page's OOB is scanned (and a compacted page's
    /// header read); a logical page's versions are its pages in descending sequence order,
    /// keeping each one that holds a sector no newer page holds, until every sector is
    /// covered. That is the rule the FTL keeps versions by while it runs (a full page
    /// invalidates all older ones; a version whose sectors newer ones cover is dropped), so
    /// the rebuilt versions are the ones the map held, GC copies (which keep their source's
    /// sequence number) and copies an interrupted GC left twice included. Blocks never
    /// programmed since their erase are free; the block a plane was writing stays open at
    /// its write pointer. A logical page left with more versions than `max_versions` (data
    /// a whole-page TRIM had dropped before the loss, which TRIM lets come back) is merged
    /// into one page at `now_ns`.
    pub fn recover(
        config: &WaflashConfig,
        unit: usize,
        nand: &mut Nand,
        meta: FlashMeta,
        now_ns: TimeNs,
        track_changes: bool,
    ) -> Result<(Self, FtlRecovery), WaflashError> {
        let mut ftl = Ftl::new(config, unit, nand)?;
        if track_changes {
            // The merges below program pages an image must get.
            ftl.track_changes();
        }
        let pages = ftl.geometry.pages_total() as usize;
        if [meta.oob_lpn.len(), meta.oob_mask.len(), meta.oob_seq.len()] != [pages; 3]
            || meta.headers.slot_of_ppn.len() != pages
        {
            return Err(WaflashError::Recovery(format!(
                "the OOB areas describe {} pages but the medium has {pages}",
                meta.oob_lpn.len()
            )));
        }
        ftl.oob_lpn = meta.oob_lpn;
        ftl.oob_mask = meta.oob_mask;
        ftl.oob_seq = meta.oob_seq;
        ftl.headers = meta.headers;
        if !meta.retiring.is_empty() {
            if meta.retiring.len() != ftl.retire.len() {
                return Err(WaflashError::Recovery(format!(
                    "the retirement marks describe {} blocks but the medium has {}",
                    meta.retiring.len(),
                    ftl.retire.len()
                )));
            }
            ftl.retire = meta.retiring;
        }
        let g = ftl.geometry.clone();
        let ppb = g.pages_per_block;
        let logical = ftl.map.logical_pages();
        let mut report = FtlRecovery::default();
        // (logical page, sequence number, physical page) of every version found.
        let mut found: Vec<(u32, u64, u32)> = Vec::new();
        let mut max_seq = 0;
        let mut open: Vec<Option<u32>> = vec![None; g.planes_total() as usize];
        for block in 0..g.blocks_total() {
            let written = nand.next_page(block);
            ftl.next_page_hint[block as usize] = written;
            if nand.is_bad(block) {
                // Retired or failed to erase: every live page it held was moved before, and
                // nothing on it is trusted.
                ftl.block_free[block as usize] = false;
                ftl.next_page_hint[block as usize] = ppb;
                report.bad_blocks += 1;
                continue;
            }
            if written == 0 {
                continue;
            }
            ftl.block_free[block as usize] = false;
            if ftl.retire[block as usize] {
                // A program failed here: its pages are read as any others', it gets no
                // more, and its next GC retires it.
                ftl.next_page_hint[block as usize] = ppb;
                report.retiring_blocks += 1;
            } else if written > 0 && written < ppb {
                let plane = g.plane_of_block(block) as usize;
                match open[plane] {
                    // Only the block a plane was writing is partly programmed; should
                    // there be another, its unwritten pages wait for its erase.
                    Some(_) => ftl.next_page_hint[block as usize] = ppb,
                    None => open[plane] = Some(block),
                }
            }
            for ppn in block * ppb..block * ppb + written {
                let lpn = ftl.oob_lpn[ppn as usize];
                if lpn == NONE {
                    report.torn_pages += 1;
                    continue;
                }
                report.pages_scanned += 1;
                max_seq = max_seq.max(ftl.oob_seq[ppn as usize]);
                if lpn == COMPACTED {
                    report.compacted_pages_scanned += 1;
                    let pieces = decode_header(ftl.headers.get(ppn)).map_err(|e| {
                        WaflashError::Recovery(format!("compacted page {ppn}: {e}"))
                    })?;
                    let at = found.len();
                    for p in pieces {
                        ftl.check_piece(ppn, &p, logical)?;
                        if !found[at..].iter().any(|&(l, _, _)| l == p.lpn) {
                            found.push((p.lpn, ftl.oob_seq[ppn as usize], ppn));
                        }
                    }
                } else {
                    let mask = ftl.oob_mask[ppn as usize];
                    if lpn >= logical || mask == 0 || mask & !ftl.full_mask != 0 {
                        return Err(WaflashError::Recovery(format!(
                            "page {ppn}'s OOB names sectors {mask:#x} of logical page {lpn}, \
                             not a page of this device's {logical}"
                        )));
                    }
                    found.push((lpn, ftl.oob_seq[ppn as usize], ppn));
                }
            }
        }
        for plane in 0..g.planes_total() {
            let free: Vec<u32> = g
                .blocks_of_plane(plane)
                .filter(|&b| ftl.block_free[b as usize])
                .collect();
            // Popped from the back: the lowest-numbered block is used first.
            ftl.free_blocks[plane as usize] = free.into_iter().rev().collect();
            ftl.active[plane as usize] = open[plane as usize].unwrap_or(NONE);
        }
        report.open_blocks = open.iter().flatten().count() as u64;
        ftl.next_seq = max_seq + 1;
        // Newest first within a logical page; equal sequence numbers are the two copies of
        // one version an interrupted GC left, either of which will do.
        found.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(b.2.cmp(&a.2)));
        let mut crowded = Vec::new();
        for group in found.chunk_by(|a, b| a.0 == b.0) {
            let lpn = group[0].0;
            let candidates: Vec<u32> = group.iter().map(|&(_, _, ppn)| ppn).collect();
            let first_mask = ftl.version_mask(lpn, candidates[0]);
            let versions = ftl.prune(lpn, &candidates, first_mask);
            ftl.remap(lpn, &versions);
            report.mapped_pages += 1;
            if versions.len() > ftl.max_versions {
                crowded.push(lpn);
            }
        }
        for lpn in crowded {
            ftl.merge_into(nand, lpn, now_ns, None)
                .map_err(WaflashError::Device)?;
            report.merges += 1;
        }
        report.live_pages = ftl.refs.iter().filter(|&&r| r > 0).count() as u64;
        report.multi_version_pages = ftl.multi.len() as u64;
        Ok((ftl, report))
    }

    /// Checks that a compacted page's index entry names a piece of a page of this device
    /// that fits in both the logical and the physical page.
    fn check_piece(&self, ppn: u32, p: &Piece, logical: u32) -> Result<(), WaflashError> {
        let spp = self.spp;
        if p.lpn >= logical
            || p.len == 0
            || p.first as u32 + p.len as u32 > spp
            || p.offset as u32 + p.len as u32 > spp
        {
            return Err(WaflashError::Recovery(format!(
                "compacted page {ppn} indexes {} sectors of logical page {} from sector {} \
                 at offset {}, which do not fit this device's {logical} pages of {spp} sectors",
                p.len, p.lpn, p.first, p.offset
            )));
        }
        Ok(())
    }

    /// Checks the structural invariants (tests): reference counts match the mapping,
    /// block valid counts match the references, versions are distinct and hold sectors.
    pub fn check_invariants(&self) {
        let mut refs = vec![0u32; self.refs.len()];
        for lpn in 0..self.oob_len_lpns() {
            let vs = self.map.versions(lpn);
            assert!(
                vs.len() <= self.max_versions,
                "lpn {lpn} has {} versions",
                vs.len()
            );
            for (i, &v) in vs.iter().enumerate() {
                assert!(!vs[..i].contains(&v), "lpn {lpn} lists page {v} twice");
                refs[v as usize] += 1;
                let owner = self.oob_lpn[v as usize];
                assert!(
                    owner == lpn || owner == COMPACTED,
                    "page {v} of lpn {lpn} belongs to {owner}"
                );
                assert!(
                    self.version_mask(lpn, v) != 0,
                    "version {v} of lpn {lpn} holds nothing"
                );
            }
            assert_eq!(vs.len() > 1, self.multi.contains(&lpn));
        }
        let ppb = self.geometry.pages_per_block as usize;
        for (b, &valid) in self.block_valid.iter().enumerate() {
            let live = (0..ppb).filter(|&p| refs[b * ppb + p] > 0).count() as u32;
            assert_eq!(live, valid, "block {b} valid count");
        }
        assert_eq!(
            self.valid_pages,
            self.block_valid.iter().map(|&v| u64::from(v)).sum::<u64>(),
            "valid page count"
        );
        for (p, &r) in refs.iter().enumerate() {
            assert_eq!(r, self.refs[p] as u32, "page {p} reference count");
        }
    }

    fn oob_len_lpns(&self) -> u32 {
        self.map.logical_pages()
    }

    /// Bytes of compaction header per byte of compacted page written so far.
    pub fn compaction_space_overhead(&self) -> f64 {
        let pages = self.stats.compacted_pages;
        if pages == 0 {
            return 0.0;
        }
        self.stats.compaction_header_bytes as f64 / (pages * self.geometry.page_bytes as u64) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The runs cover exactly the set bits, in order, each run maximal.
        #[test]
        fn runs_are_the_maximal_runs_of_set_bits(mask in proptest::num::u64::ANY) {
            let mut rebuilt = 0u64;
            let mut last_end = None;
            for (first, len) in runs(mask) {
                proptest::prop_assert!(len > 0);
                if let Some(end) = last_end {
                    // A gap of at least one clear bit separates two runs.
                    proptest::prop_assert!(first > end);
                }
                rebuilt |= run_mask(first as u32, len as u32);
                last_end = Some(first + len);
            }
            proptest::prop_assert_eq!(rebuilt, mask);
        }
    }
}
