//! The page-level FTL: logical-to-physical mapping, block allocation across the parallel
//! units, the SLC cache and its evictor, garbage collection and wear levelling.
//!
//! Everything is kept in flat vectors indexed by page, block or plane number, so that the
//! per-page metadata costs about nine bytes (l2p and p2l entries and a transient bit) and
//! the hot path touches few cache lines.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use afa_nand::{CellMode, Geometry, Nand, NandError};
use afa_sim::TimeNs;

use crate::config::{
    parse_allocation_order, GcConfig, SlcCacheConfig, SlcEvictionPolicy, SsdConfig, VictimPolicy,
    WearLevelingConfig,
};
use crate::device::DeviceError;

/// The "no page" / "no block" marker in mapping tables and links.
pub const NONE: u32 = u32::MAX;

/// Greedy key of a block that is not a candidate victim (not a full dense block).
const NOT_A_VICTIM: u16 = u16::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BlockState {
    Free,
    Open,
    Full,
    Bad,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pool {
    Dense,
    Slc,
}

#[derive(Debug, Clone, Copy)]
struct BlockInfo {
    valid: u16,
    /// Pages programmed since the last erase (the FTL's copy of the NAND write pointer,
    /// kept beside the other per-block fields so the hot path touches one cache line).
    written: u16,
    /// Valid pages written with the transient flag.
    transient: u16,
    state: BlockState,
    pool: Pool,
    /// A page program failed in this block: retire it instead of erasing it when cleaned.
    retire: bool,
    /// Sequence number at which the block was filled (age for FIFO and cost-benefit).
    closed_seq: u64,
    plane: u32,
    /// The block's index within its plane (its slot in the plane's greedy keys).
    index_in_plane: u32,
}

/// Free blocks of one plane and pool, handed out least-erased first under dynamic wear
/// levelling, oldest-freed first otherwise.
#[derive(Debug, Default)]
struct FreePool {
    heap: BinaryHeap<Reverse<(u64, u32)>>,
}

impl FreePool {
    fn len(&self) -> usize {
        self.heap.len()
    }
    fn push(&mut self, key: u64, block: u32) {
        self.heap.push(Reverse((key, block)));
    }
    fn pop(&mut self) -> Option<u32> {
        self.heap.pop().map(|Reverse((_, b))| b)
    }
}

#[derive(Debug)]
struct Plane {
    free_dense: FreePool,
    free_slc: FreePool,
    host_open: u32,
    gc_open: u32,
    slc_open: u32,
    /// The SLC block taking host pages written with the transient flag (§5.5 of ScalaAFA):
    /// they are kept apart from ordinary pages so that a block's transient count tells the
    /// evictor something (mixed in one block, every block would hold the same share).
    slc_transient_open: u32,
    /// Greedy victim keys by block index within the plane: the valid-page count of a full
    /// dense block, `NOT_A_VICTIM` for any other block. A plane's keys are a small contiguous
    /// array (1 KB for 512 blocks) that stays in cache, so keeping it current costs one
    /// cached write per invalidation and finding the victim is a short linear scan, where
    /// bucket lists would touch neighbouring blocks all over memory on every invalidation.
    greedy_keys: Vec<u16>,
    /// Dense full blocks in the order they were filled (FIFO victim selection); entries whose
    /// block has since been cleaned are skipped lazily.
    fifo: VecDeque<(u32, u64)>,
    slc_full: Vec<u32>,
    /// Good blocks of the plane's SLC pool: free, open or full. Fewer than two (grown bad
    /// blocks that no free dense block could replace) and the plane writes past its cache.
    slc_blocks: u32,
    erases_since_wear_check: u32,
    /// The victim being cleaned a few pages at a time (incremental GC), NONE if none.
    gc_victim: u32,
    /// The next page of `gc_victim` to examine.
    gc_next_page: u32,
    /// Pages relocated per host page written while `gc_victim` is cleaned.
    gc_pace: u32,
}

/// Counters the FTL keeps; the controller adds them to its report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FtlStats {
    /// Logical pages the FTL wrote for the host side (from the command path or the write
    /// buffer; a partial page counts as one). Rewrites absorbed by the buffer never get here.
    pub page_writes: u64,
    /// Pages read to merge a partial-page write (read-modify-write).
    pub rmw_reads: u64,
    pub gc_foreground_runs: u64,
    pub gc_background_runs: u64,
    pub gc_pages_moved: u64,
    pub slc_evictions: u64,
    pub slc_pages_migrated: u64,
    /// Of those, pages written with the transient flag (which the array will soon drop).
    pub slc_transient_pages_migrated: u64,
    pub static_wl_moves: u64,
    /// Wholly invalid blocks erased in idle time (`gc.idle_erase`).
    pub idle_erases: u64,
    pub program_failures: u64,
    pub blocks_retired: u64,
    /// SLC blocks gone bad, and those of them that a free dense block replaced.
    pub slc_blocks_lost: u64,
    pub slc_blocks_replaced: u64,
    /// Pages a cleaning relocated to another plane because its own had no room left for
    /// them (`Ftl::reclaim_across_planes`, the last resort before a write is refused).
    pub gc_pages_moved_across_planes: u64,
}

/// Where a page write comes from: the host stream, host pages flagged transient, or
/// relocation (GC, eviction, wear levelling), which goes to a separate open block so cold
/// data is kept apart. Transient host pages have their own SLC block; without an SLC cache
/// they share the host block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    Host,
    Transient,
    Relocation,
}

#[derive(Debug)]
pub struct Ftl {
    geometry: Geometry,
    pages_per_block: u32,
    ppb_shift: Option<u32>,
    slc_pages_per_block: u32,
    logical_pages: u32,
    l2p: Vec<u32>,
    p2l: Vec<u32>,
    transient_bits: Vec<u64>,
    blocks: Vec<BlockInfo>,
    planes: Vec<Plane>,
    allocation_order: Vec<u32>,
    cursor: usize,
    die_aware_window: u32,
    die_of_plane: Vec<u32>,
    gc: GcConfig,
    slc: SlcCacheConfig,
    /// Blocks each plane sets aside as its SLC cache (0 without one).
    slc_blocks_per_plane: u32,
    wear: WearLevelingConfig,
    seq: u64,
    background_cursor: usize,
    /// End of the latest GC or eviction operation scheduled on any die.
    gc_busy_until_ns: TimeNs,
    /// Set while preconditioning: NAND operations are applied without timing or counting.
    untimed: bool,
    /// Free blocks each plane keeps beyond the hard threshold (1 when programs or erases can
    /// fail, else 0): a program that fails closes its block, so the relocation it was part
    /// of needs one block more than it planned. Without the spare, GC started only once a
    /// plane was below the hard threshold, and a failure during a relocation that took the
    /// plane's last free block left it with valid pages it could move nowhere. An erase that
    /// fails does the same one step later: the relocation took a free block and the victim
    /// gives none back. A plane one block below the threshold then had none left, and a
    /// relocation block too full for the next victim's pages left it with a third of its
    /// pages garbage and no way to reclaim them (config soak, seed 9145: one plane, two
    /// failed erases). GC may still use the spare (it must, to restore it after a failure
    /// took it).
    failure_spare: usize,
    pub stats: FtlStats,
}

impl Ftl {
    pub fn new(config: &SsdConfig, nand: &mut Nand) -> Result<Self, crate::SsdError> {
        let g = config.geometry.clone();
        let ppb = g.pages_per_block;
        let slc_ppb = nand.pages_in_mode(CellMode::Slc);
        let planes_total = g.planes_total();
        let slc_blocks_per_plane = if config.slc_cache.capacity_bytes == 0 {
            0
        } else {
            let slc_block_bytes = slc_ppb as u64 * g.page_bytes as u64;
            let blocks = config.slc_cache.capacity_bytes.div_ceil(slc_block_bytes);
            blocks.div_ceil(planes_total as u64) as u32
        };
        let failure_spare = u32::from(config.faults.media_can_fail());
        let reserve_per_plane = config.gc.hard_threshold_blocks + 2 + failure_spare;
        if slc_blocks_per_plane > 0 && slc_blocks_per_plane < 2 {
            return Err(crate::SsdError::Config(
                "slc_cache.capacity_bytes must give every plane at least two SLC blocks".into(),
            ));
        }
        if slc_blocks_per_plane + reserve_per_plane >= g.blocks_per_plane {
            return Err(crate::SsdError::Config(format!(
                "slc_cache.capacity_bytes needs {slc_blocks_per_plane} SLC blocks per plane, which leaves too few of the {} blocks per plane",
                g.blocks_per_plane
            )));
        }
        let mut blocks = vec![
            BlockInfo {
                valid: 0,
                written: 0,
                transient: 0,
                state: BlockState::Free,
                pool: Pool::Dense,
                retire: false,
                closed_seq: 0,
                plane: 0,
                index_in_plane: 0,
            };
            g.blocks_total() as usize
        ];
        for (b, info) in blocks.iter_mut().enumerate() {
            info.plane = g.plane_of_block(b as u32);
            info.index_in_plane = b as u32 / planes_total;
        }
        let mut planes = Vec::with_capacity(planes_total as usize);
        let mut dense_good_blocks = 0u64;
        for p in 0..planes_total {
            let mut plane = Plane {
                free_dense: FreePool::default(),
                free_slc: FreePool::default(),
                host_open: NONE,
                gc_open: NONE,
                slc_open: NONE,
                slc_transient_open: NONE,
                greedy_keys: vec![NOT_A_VICTIM; g.blocks_per_plane as usize],
                fifo: VecDeque::new(),
                slc_full: Vec::new(),
                slc_blocks: 0,
                erases_since_wear_check: 0,
                gc_victim: NONE,
                gc_next_page: 0,
                gc_pace: 1,
            };
            let mut slc_left = slc_blocks_per_plane;
            for b in g.blocks_of_plane(p) {
                if nand.is_bad(b) {
                    blocks[b as usize].state = BlockState::Bad;
                    continue;
                }
                if slc_left > 0 {
                    slc_left -= 1;
                    nand.set_block_mode(b, CellMode::Slc)?;
                    blocks[b as usize].pool = Pool::Slc;
                    plane.free_slc.push(b as u64, b);
                    plane.slc_blocks += 1;
                } else {
                    dense_good_blocks += 1;
                    plane.free_dense.push(b as u64, b);
                }
            }
            if plane.free_dense.len() <= reserve_per_plane as usize {
                return Err(crate::SsdError::Config(format!(
                    "plane {p} has only {} usable dense blocks; GC needs more than {reserve_per_plane}",
                    plane.free_dense.len()
                )));
            }
            planes.push(plane);
        }
        // The logical capacity comes out of the dense blocks that GC does not hold in reserve.
        let usable_pages =
            (dense_good_blocks - (reserve_per_plane as u64 * planes_total as u64)) * ppb as u64;
        let all_dense_pages = dense_good_blocks * ppb as u64;
        let logical = (all_dense_pages as f64 / (1.0 + config.over_provisioning)).floor() as u64;
        if logical == 0 || logical > usable_pages {
            return Err(crate::SsdError::Config(format!(
                "over_provisioning = {} leaves {logical} logical pages, but GC reserves need the spare of at least {} blocks per plane",
                config.over_provisioning, reserve_per_plane
            )));
        }
        let dims = parse_allocation_order(&config.ftl.allocation_order)?;
        let pages_total = g.pages_total() as usize;
        Ok(Self {
            allocation_order: allocation_order(&g, dims),
            die_aware_window: config.ftl.die_aware_window.clamp(1, planes_total),
            die_of_plane: (0..planes_total).map(|p| g.die_of_plane(p)).collect(),
            pages_per_block: ppb,
            ppb_shift: ppb.is_power_of_two().then(|| ppb.trailing_zeros()),
            slc_pages_per_block: slc_ppb,
            logical_pages: logical as u32,
            l2p: afa_sim::mem::huge_vec(NONE, logical as usize),
            p2l: afa_sim::mem::huge_vec(NONE, pages_total),
            transient_bits: vec![0; pages_total.div_ceil(64)],
            blocks,
            planes,
            cursor: 0,
            gc: config.gc.clone(),
            slc: config.slc_cache.clone(),
            slc_blocks_per_plane,
            wear: config.wear_leveling.clone(),
            seq: 0,
            background_cursor: 0,
            gc_busy_until_ns: 0,
            untimed: false,
            failure_spare: failure_spare as usize,
            stats: FtlStats::default(),
            geometry: g,
        })
    }

    /// Free dense blocks below which a plane cleans before a host page or an SLC migration
    /// may take space: the hard threshold, plus the spare for a failed program or erase.
    #[inline]
    fn gc_floor(&self) -> usize {
        self.gc.hard_threshold_blocks as usize + self.failure_spare
    }

    /// Blocks of the whole device set aside as its SLC cache (0 without one): what one
    /// turnover of the cache evicts.
    pub fn slc_blocks(&self) -> u64 {
        self.slc_blocks_per_plane as u64 * self.planes.len() as u64
    }

    #[inline]
    fn block_of(&self, ppn: u32) -> u32 {
        match self.ppb_shift {
            Some(shift) => ppn >> shift,
            None => ppn / self.pages_per_block,
        }
    }

    pub fn logical_pages(&self) -> u32 {
        self.logical_pages
    }

    pub fn gc_busy_until_ns(&self) -> TimeNs {
        self.gc_busy_until_ns
    }

    pub fn set_untimed(&mut self, untimed: bool) {
        self.untimed = untimed;
    }

    /// The plane the next host page goes to: the next in the configured allocation order,
    /// or, with a die-aware window of W > 1, whichever of the next W planes in that order has
    /// its die free first, so that host writes flow around dies busy with GC as a real
    /// controller's dynamic allocation does.
    #[inline]
    fn next_plane(&mut self, nand: &Nand) -> u32 {
        let len = self.allocation_order.len();
        let mut best = self.allocation_order[self.cursor];
        if self.die_aware_window > 1 {
            let mut best_free = nand.die_free_ns(self.die_of_plane[best as usize]);
            let soft = self.gc.soft_threshold_blocks as usize;
            for i in 1..self.die_aware_window as usize {
                let p = self.allocation_order[(self.cursor + i) % len];
                // A plane short of free blocks is left to the plain order: steering writes
                // to it because its die looks idle would fill it faster than it cleans.
                if self.planes[p as usize].free_dense.len() < soft {
                    continue;
                }
                let free = nand.die_free_ns(self.die_of_plane[p as usize]);
                if free < best_free {
                    best = p;
                    best_free = free;
                }
            }
        }
        self.cursor += 1;
        if self.cursor == len {
            self.cursor = 0;
        }
        best
    }

    #[inline]
    fn capacity_of(&self, block: u32) -> u32 {
        match self.blocks[block as usize].pool {
            Pool::Dense => self.pages_per_block,
            Pool::Slc => self.slc_pages_per_block,
        }
    }

    // ----- NAND access, timed or not ------------------------------------------------------

    #[inline]
    fn nand_read(&mut self, nand: &mut Nand, ppn: u32, ready_ns: TimeNs) -> TimeNs {
        if self.untimed {
            return ready_ns;
        }
        nand.read(ppn, ready_ns, self.geometry.page_bytes)
    }

    #[inline]
    fn nand_program(
        &mut self,
        nand: &mut Nand,
        ppn: u32,
        ready_ns: TimeNs,
    ) -> Result<TimeNs, NandError> {
        if self.untimed {
            nand.program_untimed(ppn)?;
            return Ok(ready_ns);
        }
        nand.program(ppn, ready_ns)
    }

    #[inline]
    fn nand_erase(
        &mut self,
        nand: &mut Nand,
        block: u32,
        ready_ns: TimeNs,
    ) -> Result<TimeNs, NandError> {
        if self.untimed {
            nand.erase_untimed(block);
            return Ok(ready_ns);
        }
        nand.erase(block, ready_ns)
    }

    // ----- Greedy keys ---------------------------------------------------------------------

    /// Records a block's current key: its valid count when it is a full dense block.
    #[inline]
    fn set_greedy_key(&mut self, block: u32) {
        let b = &self.blocks[block as usize];
        let key = if b.state == BlockState::Full && b.pool == Pool::Dense {
            b.valid
        } else {
            NOT_A_VICTIM
        };
        self.planes[b.plane as usize].greedy_keys[b.index_in_plane as usize] = key;
    }

    // ----- Mapping ------------------------------------------------------------------------

    /// Marks a physical page invalid, keeping the block's counters and greedy key right.
    #[inline]
    fn invalidate(&mut self, ppn: u32) {
        let block = self.block_of(ppn);
        self.p2l[ppn as usize] = NONE;
        let info = self.blocks[block as usize];
        // Most blocks hold no transient page; skipping the bitmap for them saves a cache miss.
        let transient = info.transient > 0 && self.take_transient_bit(ppn);
        let b = &mut self.blocks[block as usize];
        debug_assert!(
            b.valid > 0,
            "invalidating a page of block {block} with no valid pages"
        );
        b.valid -= 1;
        if transient {
            b.transient -= 1;
        }
        if info.state == BlockState::Full && info.pool == Pool::Dense {
            self.planes[info.plane as usize].greedy_keys[info.index_in_plane as usize] -= 1;
        }
    }

    #[inline]
    fn take_transient_bit(&mut self, ppn: u32) -> bool {
        let (word, bit) = (ppn as usize / 64, ppn % 64);
        let was = self.transient_bits[word] >> bit & 1 == 1;
        self.transient_bits[word] &= !(1u64 << bit);
        was
    }

    #[inline]
    fn map(&mut self, lpn: u32, ppn: u32, transient: bool) {
        self.l2p[lpn as usize] = ppn;
        self.p2l[ppn as usize] = lpn;
        let block = self.block_of(ppn);
        let b = &mut self.blocks[block as usize];
        b.valid += 1;
        if transient {
            b.transient += 1;
            self.transient_bits[ppn as usize / 64] |= 1u64 << (ppn % 64);
        }
    }

    /// Starts loading the metadata a write of `lpn` will touch: the mapping entry at stage 0;
    /// at stage 1 (when that entry is likely cached) the old page's reverse entry and its
    /// block's record.
    #[inline]
    pub fn prefetch(&self, lpn: u32, stage: u8) {
        if lpn as usize >= self.l2p.len() {
            return;
        }
        if stage == 0 {
            afa_sim::mem::prefetch(&self.l2p, lpn as usize);
            return;
        }
        let old = self.l2p[lpn as usize];
        if old != NONE {
            afa_sim::mem::prefetch(&self.p2l, old as usize);
            afa_sim::mem::prefetch(&self.blocks, self.block_of(old) as usize);
        }
    }

    /// Removes a logical page's mapping (TRIM).
    pub fn unmap(&mut self, lpn: u32) {
        let old = self.l2p[lpn as usize];
        if old != NONE {
            self.invalidate(old);
            self.l2p[lpn as usize] = NONE;
        }
    }

    // ----- Block lifecycle ----------------------------------------------------------------

    fn close_block(&mut self, plane: u32, block: u32) {
        self.seq += 1;
        let seq = self.seq;
        let b = &mut self.blocks[block as usize];
        b.state = BlockState::Full;
        b.closed_seq = seq;
        match b.pool {
            Pool::Dense => {
                self.set_greedy_key(block);
                if self.gc.victim == VictimPolicy::Fifo {
                    self.planes[plane as usize].fifo.push_back((block, seq));
                }
            }
            Pool::Slc => self.planes[plane as usize].slc_full.push(block),
        }
    }

    fn free_key(&self, nand: &Nand, block: u32) -> u64 {
        if self.wear.dynamic {
            ((nand.erase_count(block) as u64) << 32) | (self.seq & 0xffff_ffff)
        } else {
            self.seq
        }
    }

    /// Takes a free block of the plane's pool and opens it.
    fn open_block(&mut self, nand: &Nand, plane: u32, pool: Pool) -> Option<u32> {
        let pl = &mut self.planes[plane as usize];
        let block = match pool {
            Pool::Dense => pl.free_dense.pop()?,
            Pool::Slc => pl.free_slc.pop()?,
        };
        debug_assert_eq!(
            nand.next_page(block),
            0,
            "opened block {block} is not erased"
        );
        let b = &mut self.blocks[block as usize];
        debug_assert_eq!(b.state, BlockState::Free);
        b.state = BlockState::Open;
        b.valid = 0;
        b.written = 0;
        b.transient = 0;
        Some(block)
    }

    /// The next page of the open block of `stream` in `plane`, opening a new block if needed.
    fn take_page(
        &mut self,
        nand: &mut Nand,
        plane: u32,
        pool: Pool,
        stream: Stream,
    ) -> Result<u32, DeviceError> {
        let current = self.open_of(plane, pool, stream);
        let block = if current != NONE
            && (self.blocks[current as usize].written as u32) < self.capacity_of(current)
        {
            current
        } else {
            if current != NONE {
                self.close_block(plane, current);
                self.set_open(plane, pool, stream, NONE);
            }
            let b = self
                .open_block(nand, plane, pool)
                .ok_or(DeviceError::NoSpace { plane })?;
            self.set_open(plane, pool, stream, b);
            b
        };
        let b = &mut self.blocks[block as usize];
        debug_assert_eq!(b.written as u32, nand.next_page(block));
        let ppn = block * self.pages_per_block + b.written as u32;
        // The page is consumed whether its program then succeeds or fails.
        b.written += 1;
        Ok(ppn)
    }

    #[inline]
    fn open_of(&self, plane: u32, pool: Pool, stream: Stream) -> u32 {
        let pl = &self.planes[plane as usize];
        match (pool, stream) {
            (Pool::Slc, Stream::Transient) => pl.slc_transient_open,
            (Pool::Slc, _) => pl.slc_open,
            (Pool::Dense, Stream::Host | Stream::Transient) => pl.host_open,
            (Pool::Dense, Stream::Relocation) => pl.gc_open,
        }
    }

    #[inline]
    fn set_open(&mut self, plane: u32, pool: Pool, stream: Stream, block: u32) {
        let pl = &mut self.planes[plane as usize];
        match (pool, stream) {
            (Pool::Slc, Stream::Transient) => pl.slc_transient_open = block,
            (Pool::Slc, _) => pl.slc_open = block,
            (Pool::Dense, Stream::Host | Stream::Transient) => pl.host_open = block,
            (Pool::Dense, Stream::Relocation) => pl.gc_open = block,
        }
    }

    /// A program failed on `ppn`: the page is lost, its block is closed now and retired
    /// when it is next cleaned.
    fn handle_program_failure(&mut self, plane: u32, ppn: u32) {
        let block = self.block_of(ppn);
        self.stats.program_failures += 1;
        self.blocks[block as usize].retire = true;
        let pl = &mut self.planes[plane as usize];
        for open in [
            &mut pl.host_open,
            &mut pl.gc_open,
            &mut pl.slc_open,
            &mut pl.slc_transient_open,
        ] {
            if *open == block {
                *open = NONE;
            }
        }
        self.close_block(plane, block);
    }

    // ----- Writes -------------------------------------------------------------------------

    /// Writes logical page `lpn`: the sectors in `mask` come from the host, the others (for a
    /// partial page) from the page's current version, read first (read-modify-write).
    /// `fill` stores the new page's payload once its physical page is known: it receives the
    /// new and the old physical page (NONE if the page was unmapped).
    ///
    /// Returns when the program completes.
    pub fn write_page(
        &mut self,
        nand: &mut Nand,
        lpn: u32,
        full_page: bool,
        ready_ns: TimeNs,
        transient: bool,
        fill: &mut dyn FnMut(&mut Nand, u32, u32),
    ) -> Result<TimeNs, DeviceError> {
        self.stats.page_writes += 1;
        let mut planes_out_of_space = 0;
        // The planes that refused this page, once one has.
        let mut refused: Vec<bool> = Vec::new();
        loop {
            let mut plane = self.next_plane(nand);
            // The die-aware choice may pick a plane that has just refused (a plane that takes
            // no page leaves its die idle, so it looks the best again): the page then goes to
            // the first plane in allocation order that has not refused it. Before, the
            // retries could all land on the full planes, and a device whose other planes were
            // mostly free said it had no space (config soak, seed 6265).
            if refused.get(plane as usize) == Some(&true) {
                let mut order = self.allocation_order.iter().copied();
                if let Some(p) = order.find(|&p| !refused[p as usize]) {
                    plane = p;
                }
            }
            // A plane that lost blocks to failures may fill up before the others; the page
            // then goes to the next plane, and only a device with no room anywhere says so.
            let ppn = match self.allocate_host_page(nand, plane, ready_ns, transient) {
                Ok(ppn) => ppn,
                Err(DeviceError::NoSpace { .. }) if planes_out_of_space + 1 < self.planes.len() => {
                    planes_out_of_space += 1;
                    if refused.is_empty() {
                        refused = vec![false; self.planes.len()];
                    }
                    refused[plane as usize] = true;
                    continue;
                }
                Err(e @ DeviceError::NoSpace { .. }) => {
                    // Every plane refused the page. Garbage a plane could not reclaim on its
                    // own may still be reclaimable with the other planes' room; if a block
                    // was reclaimed, every plane is asked again.
                    if !self.reclaim_across_planes(nand, ready_ns)? {
                        return Err(e);
                    }
                    planes_out_of_space = 0;
                    refused.clear();
                    continue;
                }
                Err(e) => return Err(e),
            };
            let old = self.l2p[lpn as usize];
            let mut ready = ready_ns;
            if !full_page && old != NONE {
                ready = self.nand_read(nand, old, ready);
                self.stats.rmw_reads += 1;
            }
            match self.nand_program(nand, ppn, ready) {
                Ok(done) => {
                    fill(nand, ppn, old);
                    if old != NONE {
                        self.invalidate(old);
                    }
                    self.map(lpn, ppn, transient);
                    return Ok(done);
                }
                Err(NandError::ProgramFailed { .. }) => {
                    self.handle_program_failure(plane, ppn);
                }
                Err(e) => panic!("FTL invariant broken: {e}"),
            }
        }
    }

    /// The physical page holding logical page `lpn`, or NONE.
    pub fn mapped(&self, lpn: u32) -> u32 {
        self.l2p[lpn as usize]
    }

    /// Reads logical page `lpn` (or its first `xfer_bytes`). Returns the physical page read
    /// (NONE if unmapped, in which case no flash is touched) and when the data is ready.
    #[inline]
    pub fn read_page(
        &mut self,
        nand: &mut Nand,
        lpn: u32,
        ready_ns: TimeNs,
        xfer_bytes: u32,
    ) -> (u32, TimeNs) {
        let ppn = self.l2p[lpn as usize];
        if ppn == NONE {
            return (NONE, ready_ns);
        }
        (ppn, nand.read(ppn, ready_ns, xfer_bytes))
    }

    fn allocate_host_page(
        &mut self,
        nand: &mut Nand,
        plane: u32,
        now_ns: TimeNs,
        transient: bool,
    ) -> Result<u32, DeviceError> {
        // Foreground GC: the plane must keep its reserve of free dense blocks. Below the soft
        // threshold, incremental GC does a share of the cleaning with every host page; below
        // the hard threshold, whole victims are cleaned before the write may proceed.
        let free = self.planes[plane as usize].free_dense.len();
        if self.gc.incremental
            && free < self.gc.soft_threshold_blocks as usize
            && free >= self.gc_floor()
        {
            self.incremental_step(nand, plane, now_ns, u32::MAX - 1)?;
        }
        // The victim in progress must always be able to finish: if its remaining pages would
        // need every free block, it is finished now, before the host takes one.
        let victim = self.planes[plane as usize].gc_victim;
        if victim != NONE {
            let remaining = self.blocks[victim as usize].valid as u32;
            let free = self.planes[plane as usize].free_dense.len();
            if free <= self.relocation_blocks_needed(plane, remaining) as usize {
                self.collect_one(nand, plane, now_ns, false)?;
            }
        }
        self.restore_dense_reserve(nand, plane, now_ns)?;
        let stream = if transient {
            Stream::Transient
        } else {
            Stream::Host
        };
        let mut evicted = false;
        loop {
            if self.planes[plane as usize].slc_blocks < 2 {
                if evicted {
                    // The eviction that lost the cache's block migrated pages into dense
                    // blocks, so the reserve is restored again before a host page takes one.
                    self.restore_dense_reserve(nand, plane, now_ns)?;
                }
                return self.take_dense_host_page(nand, plane);
            }
            let open = self.open_of(plane, Pool::Slc, stream);
            let open_has_room = open != NONE
                && (self.blocks[open as usize].written as u32) < self.capacity_of(open);
            if open_has_room || self.planes[plane as usize].free_slc.len() > 0 {
                return self.take_page(nand, plane, Pool::Slc, stream);
            }
            if open != NONE {
                self.close_block(plane, open);
                self.set_open(plane, Pool::Slc, stream, NONE);
            }
            // The evicted block's erase can fail. A free dense block then replaces it if the
            // plane has one beyond its reserve; if not, the cache has lost a block and the
            // loop looks again: at another victim, or, with fewer than two SLC blocks left,
            // at the dense blocks. Taking an SLC page straight after the eviction found no
            // free SLC block and stopped the device with `NoSpace` after one failed erase.
            // Every turn either frees an SLC block or loses one, so the loop ends.
            self.evict_slc(nand, plane, now_ns)?;
            evicted = true;
        }
    }

    /// Cleans `plane` until it has its reserve of free dense blocks again, or nothing more
    /// would yield space.
    fn restore_dense_reserve(
        &mut self,
        nand: &mut Nand,
        plane: u32,
        now_ns: TimeNs,
    ) -> Result<(), DeviceError> {
        while self.planes[plane as usize].free_dense.len() < self.gc_floor() {
            if !self.collect_one(nand, plane, now_ns, false)? {
                break;
            }
        }
        Ok(())
    }

    /// A host page from the plane's dense blocks, for a plane without an SLC cache (or whose
    /// cache lost all but one block to failures).
    fn take_dense_host_page(&mut self, nand: &mut Nand, plane: u32) -> Result<u32, DeviceError> {
        // If GC could not restore the plane's reserve, its blocks hold almost nothing but
        // valid data. A new host block would eat the reserve that relocation needs, so the
        // page goes to another plane instead (the caller tries the next one) and the plane
        // drains as its data is overwritten. Without this, a write pattern that keeps sending
        // long-lived data to the same planes fills them while the others stay half empty,
        // and the device reports no space at 70% utilisation.
        let pl = &self.planes[plane as usize];
        let open = pl.host_open;
        let open_has_room =
            open != NONE && (self.blocks[open as usize].written as u32) < self.capacity_of(open);
        if !open_has_room && pl.free_dense.len() < self.gc_floor() {
            return Err(DeviceError::NoSpace { plane });
        }
        self.take_page(nand, plane, Pool::Dense, Stream::Host)
    }

    /// Moves the valid pages of `victim` to the plane's relocation block and erases it.
    /// Returns when the erase ends.
    fn relocate_and_erase(
        &mut self,
        nand: &mut Nand,
        plane: u32,
        victim: u32,
        now_ns: TimeNs,
    ) -> Result<TimeNs, DeviceError> {
        let (_, _, last_read) =
            self.relocate_pages(nand, plane, victim, 0, u32::MAX, now_ns, false)?;
        debug_assert_eq!(self.blocks[victim as usize].valid, 0);
        self.erase_block(nand, plane, victim, last_read)
    }

    /// Moves valid pages of `victim`, starting at page `from`, to the plane's relocation
    /// block until `max_moves` pages have moved or the block is done. Returns the next page
    /// to examine, the pages moved and when the last read ended. With `spill`, a page the
    /// plane has no room for goes to another plane's relocation block.
    #[allow(clippy::too_many_arguments)]
    fn relocate_pages(
        &mut self,
        nand: &mut Nand,
        plane: u32,
        victim: u32,
        from: u32,
        max_moves: u32,
        now_ns: TimeNs,
        spill: bool,
    ) -> Result<(u32, u32, TimeNs), DeviceError> {
        let first = victim * self.pages_per_block;
        let end = first + self.blocks[victim as usize].written as u32;
        // Touch the mapping entries of the pages about to move first. These loads are
        // independent, so the processor overlaps their cache misses; the updates below then
        // hit the cache instead of stalling one store miss at a time.
        let mut touched = 0u32;
        let mut ahead = 0;
        for ppn in first + from..end {
            let lpn = self.p2l[ppn as usize];
            if lpn != NONE {
                touched ^= self.l2p[lpn as usize];
                ahead += 1;
                if ahead == max_moves {
                    break;
                }
            }
        }
        std::hint::black_box(touched);
        let mut last_read = now_ns;
        let mut moved = 0;
        let mut ppn = first + from;
        while ppn < end && moved < max_moves {
            let lpn = self.p2l[ppn as usize];
            if lpn != NONE {
                let read_done = self.nand_read(nand, ppn, now_ns);
                last_read = last_read.max(read_done);
                loop {
                    let dst_plane = if spill {
                        self.relocation_plane(plane)
                    } else {
                        plane
                    };
                    let dst = self.take_page(nand, dst_plane, Pool::Dense, Stream::Relocation)?;
                    match self.nand_program(nand, dst, read_done) {
                        Ok(done) => {
                            self.gc_busy_until_ns = self.gc_busy_until_ns.max(done);
                            if dst_plane != plane {
                                self.stats.gc_pages_moved_across_planes += 1;
                            }
                            break self.move_mapping(nand, lpn, ppn, dst);
                        }
                        Err(NandError::ProgramFailed { .. }) => {
                            self.handle_program_failure(dst_plane, dst);
                        }
                        Err(e) => panic!("FTL invariant broken: {e}"),
                    }
                }
                moved += 1;
            }
            ppn += 1;
        }
        Ok((ppn - first, moved, last_read))
    }

    #[inline]
    fn move_mapping(&mut self, nand: &mut Nand, lpn: u32, src: u32, dst: u32) {
        nand.store_mut().copy_page(src, dst);
        let src_block = self.block_of(src) as usize;
        let transient = self.blocks[src_block].transient > 0
            && self.transient_bits[src as usize / 64] >> (src % 64) & 1 == 1;
        self.invalidate(src);
        self.map(lpn, dst, transient);
    }

    fn erase_block(
        &mut self,
        nand: &mut Nand,
        plane: u32,
        block: u32,
        ready_ns: TimeNs,
    ) -> Result<TimeNs, DeviceError> {
        let info = self.blocks[block as usize];
        if info.retire {
            nand.retire_block(block);
            self.blocks[block as usize].state = BlockState::Bad;
            self.stats.blocks_retired += 1;
            self.lost_block(nand, plane, info.pool);
            return Ok(ready_ns);
        }
        match self.nand_erase(nand, block, ready_ns) {
            Ok(done) => {
                self.gc_busy_until_ns = self.gc_busy_until_ns.max(done);
                let key = self.free_key(nand, block);
                let b = &mut self.blocks[block as usize];
                b.state = BlockState::Free;
                b.valid = 0;
                b.written = 0;
                b.transient = 0;
                let pl = &mut self.planes[plane as usize];
                match info.pool {
                    Pool::Dense => pl.free_dense.push(key, block),
                    Pool::Slc => pl.free_slc.push(key, block),
                }
                pl.erases_since_wear_check += 1;
                Ok(done)
            }
            Err(NandError::EraseFailed { .. }) => {
                self.blocks[block as usize].state = BlockState::Bad;
                self.stats.blocks_retired += 1;
                self.lost_block(nand, plane, info.pool);
                Ok(ready_ns)
            }
            Err(e) => panic!("FTL invariant broken: {e}"),
        }
    }

    /// A block of `pool` went bad. An SLC block is replaced by a free dense block while the
    /// plane keeps its GC reserve, as a drive replaces a bad block of its static SLC region
    /// from its spare blocks. SLC blocks are erased far more often than dense ones, so they
    /// are the ones that fail: a plane whose two SLC blocks had both gone bad had no block
    /// to evict and refused every write (`NoSpace`) with a handful of bad blocks in the
    /// device. Without a spare dense block the pool shrinks, and below two blocks the
    /// plane's writes go to dense blocks directly.
    fn lost_block(&mut self, nand: &mut Nand, plane: u32, pool: Pool) {
        if pool != Pool::Slc {
            return;
        }
        self.stats.slc_blocks_lost += 1;
        let floor = self.gc_floor();
        let pl = &mut self.planes[plane as usize];
        pl.slc_blocks -= 1;
        if pl.free_dense.len() <= floor + 1 {
            return;
        }
        let Some(block) = pl.free_dense.pop() else {
            return;
        };
        let key = self.free_key(nand, block);
        let pl = &mut self.planes[plane as usize];
        if nand.set_block_mode(block, CellMode::Slc).is_err() {
            // A free block is erased; should it not be, it stays dense.
            pl.free_dense.push(key, block);
            return;
        }
        pl.free_slc.push(key, block);
        pl.slc_blocks += 1;
        self.blocks[block as usize].pool = Pool::Slc;
        self.stats.slc_blocks_replaced += 1;
    }

    // ----- Garbage collection -------------------------------------------------------------

    /// Picks a dense victim in `plane` by the configured policy and removes it from the
    /// full-block structures.
    fn take_victim(&mut self, plane: u32) -> Option<u32> {
        let victim = match self.gc.victim {
            VictimPolicy::Greedy => {
                let keys = &self.planes[plane as usize].greedy_keys;
                // The first minimum, found with a plain scan the compiler vectorises.
                let min = *keys.iter().min()?;
                if min == NOT_A_VICTIM {
                    return None;
                }
                let index = keys.iter().position(|&k| k == min)? as u32;
                self.geometry.block_in_plane(plane, index)
            }
            VictimPolicy::Fifo => {
                // The oldest block, skipping stale entries. A block whose pages are all still
                // valid would free nothing, so it goes to the back of the queue and the next
                // oldest is cleaned instead (a full lap means nothing can be freed).
                let mut skipped = 0;
                loop {
                    let pl = &mut self.planes[plane as usize];
                    let (block, seq) = pl.fifo.pop_front()?;
                    let b = &self.blocks[block as usize];
                    if b.state != BlockState::Full || b.closed_seq != seq {
                        continue;
                    }
                    if b.valid as u32 >= self.pages_per_block && !b.retire {
                        pl.fifo.push_back((block, seq));
                        skipped += 1;
                        if skipped > pl.fifo.len() {
                            return None;
                        }
                        continue;
                    }
                    break block;
                }
            }
            VictimPolicy::CostBenefit => {
                let ppb = self.pages_per_block as f64;
                let mut best = (f64::NEG_INFINITY, NONE);
                for block in self.geometry.blocks_of_plane(plane) {
                    let b = &self.blocks[block as usize];
                    if b.state != BlockState::Full || b.pool != Pool::Dense {
                        continue;
                    }
                    let u = b.valid as f64 / ppb;
                    let age = (self.seq - b.closed_seq) as f64 + 1.0;
                    let score = (1.0 - u) * age / (1.0 + u);
                    if score > best.0 {
                        best = (score, block);
                    }
                }
                (best.1 != NONE).then_some(best.1)?
            }
        };
        self.blocks[victim as usize].state = BlockState::Open; // being cleaned
        self.set_greedy_key(victim);
        Some(victim)
    }

    /// Returns a victim that will not be cleaned after all to the full-block structures.
    fn put_back(&mut self, plane: u32, victim: u32) {
        self.blocks[victim as usize].state = BlockState::Full;
        self.set_greedy_key(victim);
        if self.gc.victim == VictimPolicy::Fifo {
            let seq = self.blocks[victim as usize].closed_seq;
            self.planes[plane as usize].fifo.push_front((victim, seq));
        }
    }

    /// Whether `pages` relocated pages fit in the plane's relocation block plus its free
    /// blocks, so that a cleaning never stops halfway.
    fn relocation_fits(&self, plane: u32, pages: u32) -> bool {
        let needed = self.relocation_blocks_needed(plane, pages) as usize;
        self.planes[plane as usize].free_dense.len() >= needed
    }

    /// Free blocks that relocating `pages` pages would open, after the relocation block's
    /// remaining room.
    fn relocation_blocks_needed(&self, plane: u32, pages: u32) -> u32 {
        let pl = &self.planes[plane as usize];
        let room = if pl.gc_open == NONE {
            0
        } else {
            self.pages_per_block - self.blocks[pl.gc_open as usize].written as u32
        };
        pages.saturating_sub(room).div_ceil(self.pages_per_block)
    }

    /// Cleans one victim block in `plane`, finishing the incremental victim first if one is
    /// in progress. Returns false when no block would yield space.
    fn collect_one(
        &mut self,
        nand: &mut Nand,
        plane: u32,
        now_ns: TimeNs,
        background: bool,
    ) -> Result<bool, DeviceError> {
        if self.planes[plane as usize].gc_victim != NONE {
            self.incremental_step(nand, plane, now_ns, u32::MAX)?;
            return Ok(true);
        }
        let Some(victim) = self.take_victim(plane) else {
            return Ok(false);
        };
        if self.blocks[victim as usize].valid as u32 >= self.pages_per_block
            && !self.blocks[victim as usize].retire
        {
            // Every page is valid: cleaning would only burn an erase.
            self.put_back(plane, victim);
            return Ok(false);
        }
        let moved = self.blocks[victim as usize].valid as u64;
        if !self.relocation_fits(plane, moved as u32) {
            self.put_back(plane, victim);
            return Ok(false);
        }
        self.relocate_and_erase(nand, plane, victim, now_ns)?;
        self.stats.gc_pages_moved += moved;
        if background {
            self.stats.gc_background_runs += 1;
        } else {
            self.stats.gc_foreground_runs += 1;
        }
        self.maybe_level_wear(nand, plane, now_ns)?;
        Ok(true)
    }

    /// Room for relocated pages in `plane`: what its relocation block has left plus its
    /// free dense blocks.
    fn relocation_room(&self, plane: u32) -> u64 {
        let pl = &self.planes[plane as usize];
        let open_room = if pl.gc_open == NONE {
            0
        } else {
            self.capacity_of(pl.gc_open) - self.blocks[pl.gc_open as usize].written as u32
        };
        open_room as u64 + pl.free_dense.len() as u64 * self.pages_per_block as u64
    }

    /// Where a page relocated out of `plane` goes when it may spill: `plane` itself while it
    /// has room, then the plane whose relocation block has room left, then the plane with
    /// the most free dense blocks (an open relocation block is filled before another plane
    /// gives up a free block).
    fn relocation_plane(&self, plane: u32) -> u32 {
        if self.relocation_room(plane) > 0 {
            return plane;
        }
        let mut best = (0u64, plane);
        for &q in &self.allocation_order {
            let pl = &self.planes[q as usize];
            let open_room = pl.gc_open != NONE
                && (self.blocks[pl.gc_open as usize].written as u32) < self.capacity_of(pl.gc_open);
            // Open room ranks above any count of free blocks.
            let rank = if open_room {
                u64::MAX
            } else {
                pl.free_dense.len() as u64
            };
            if rank > best.0 {
                best = (rank, q);
            }
        }
        best.1
    }

    /// The block `reclaim_across_planes` would clean, with its plane: the one with the
    /// fewest valid pages in the device (a full dense block, or a victim cleaned a few
    /// pages at a time) that frees space, if the room of every plane together holds its
    /// valid pages. A device that refuses a write for space has none.
    pub(crate) fn reclaimable_block(&self) -> Option<(u32, u32)> {
        let mut best: Option<(u16, u32, u32)> = None;
        for plane in 0..self.planes.len() as u32 {
            let in_progress = self.planes[plane as usize].gc_victim;
            for block in self.geometry.blocks_of_plane(plane) {
                let b = &self.blocks[block as usize];
                let candidate =
                    block == in_progress || (b.state == BlockState::Full && b.pool == Pool::Dense);
                if !candidate || (b.valid as u32 >= self.pages_per_block && !b.retire) {
                    continue;
                }
                if best.is_none_or(|(valid, _, _)| b.valid < valid) {
                    best = Some((b.valid, plane, block));
                }
            }
        }
        let (valid, plane, block) = best?;
        let room: u64 = (0..self.planes.len() as u32)
            .map(|q| self.relocation_room(q))
            .sum();
        (room >= valid as u64).then_some((plane, block))
    }

    /// The last resort before a write is refused for space. Every plane has refused the
    /// page, but a plane may still hold garbage it cannot reclaim alone: its victim's valid
    /// pages do not fit in its own room because a failed erase took the free block the
    /// relocation needed, or because the host's writes left the plane with nothing but
    /// valid data. (Config soak, seed 8030, before planes kept a spare block when erases can
    /// fail: one plane 98% valid with one free block, the other a third garbage with none,
    /// and a device that said it had no space.) The victim
    /// with the fewest valid pages in the device is cleaned, its pages relocated to its own
    /// plane while that has room and to the other planes after, as a controller copies a
    /// page between planes through its buffer. Returns whether a block was reclaimed.
    ///
    /// Each reclaim frees more pages than it uses (the victim is not wholly valid), or loses
    /// the victim for good (a failed erase, or a block retired after a failed program), so a
    /// caller that repeats it until a write fits, or until it returns false, ends.
    fn reclaim_across_planes(
        &mut self,
        nand: &mut Nand,
        now_ns: TimeNs,
    ) -> Result<bool, DeviceError> {
        let Some((plane, victim)) = self.reclaimable_block() else {
            return Ok(false);
        };
        if self.planes[plane as usize].gc_victim == victim {
            // Its pages already moved are invalid, so relocating from its first page again
            // moves only the rest.
            self.planes[plane as usize].gc_victim = NONE;
        } else {
            self.blocks[victim as usize].state = BlockState::Open; // being cleaned
            self.set_greedy_key(victim);
        }
        let (_, moved, last_read) =
            self.relocate_pages(nand, plane, victim, 0, u32::MAX, now_ns, true)?;
        debug_assert_eq!(self.blocks[victim as usize].valid, 0);
        self.erase_block(nand, plane, victim, last_read)?;
        self.stats.gc_pages_moved += moved as u64;
        self.stats.gc_foreground_runs += 1;
        Ok(true)
    }

    /// Incremental GC: relocates up to `max_moves` pages (the victim's pace when
    /// `u32::MAX` is not asked for) of the plane's current victim, choosing a victim first if
    /// none is in progress, and erases the victim once it is empty. Spreading a victim's
    /// relocation over the host writes that consume the space it frees keeps a host write
    /// from waiting behind a whole block's worth of copies.
    fn incremental_step(
        &mut self,
        nand: &mut Nand,
        plane: u32,
        now_ns: TimeNs,
        max_moves: u32,
    ) -> Result<(), DeviceError> {
        let p = plane as usize;
        if self.planes[p].gc_victim == NONE {
            let Some(victim) = self.take_victim(plane) else {
                return Ok(());
            };
            let valid = self.blocks[victim as usize].valid as u32;
            let full = valid >= self.pages_per_block && !self.blocks[victim as usize].retire;
            if full || !self.relocation_fits(plane, valid) {
                self.put_back(plane, victim);
                return Ok(());
            }
            // Pages to move per page of space the victim gives back: cleaning then finishes
            // just as the host has used up the space.
            let invalid = (self.pages_per_block - valid).max(1);
            let pl = &mut self.planes[p];
            pl.gc_victim = victim;
            pl.gc_next_page = 0;
            pl.gc_pace = valid.div_ceil(invalid).max(1);
            self.stats.gc_foreground_runs += 1;
        }
        let pl = &self.planes[p];
        let (victim, from) = (pl.gc_victim, pl.gc_next_page);
        let moves = if max_moves == u32::MAX {
            u32::MAX
        } else {
            pl.gc_pace.min(max_moves)
        };
        let (next, moved, last_read) =
            self.relocate_pages(nand, plane, victim, from, moves, now_ns, false)?;
        self.stats.gc_pages_moved += moved as u64;
        if next >= self.blocks[victim as usize].written as u32 {
            debug_assert_eq!(self.blocks[victim as usize].valid, 0);
            self.planes[p].gc_victim = NONE;
            self.erase_block(nand, plane, victim, last_read)?;
            self.maybe_level_wear(nand, plane, now_ns)?;
        } else {
            self.planes[p].gc_next_page = next;
        }
        Ok(())
    }

    /// Evicts one SLC block of `plane`: its valid pages migrate to dense blocks.
    fn evict_slc(
        &mut self,
        nand: &mut Nand,
        plane: u32,
        now_ns: TimeNs,
    ) -> Result<(), DeviceError> {
        let policy = self.slc.eviction;
        let factor = self.slc.transient_factor;
        let pl = &self.planes[plane as usize];
        let mut best: Option<(usize, f64)> = None;
        for (i, &block) in pl.slc_full.iter().enumerate() {
            let b = &self.blocks[block as usize];
            let invalid = (self.slc_pages_per_block - b.valid as u32) as f64;
            let score = match policy {
                SlcEvictionPolicy::Greedy => invalid,
                // Older blocks have smaller closed_seq; negate so the oldest scores highest.
                SlcEvictionPolicy::Fifo => -(b.closed_seq as f64),
                SlcEvictionPolicy::Transient => invalid - factor * b.transient as f64,
            };
            if best.is_none_or(|(_, s)| score > s) {
                best = Some((i, score));
            }
        }
        let Some((index, _)) = best else {
            return Err(DeviceError::NoSpace { plane });
        };
        let victim = self.planes[plane as usize].slc_full[index];
        let moved = self.blocks[victim as usize].valid as u64;
        let moved_transient = self.blocks[victim as usize].transient as u64;
        // Migration fills dense blocks, so the plane's dense reserve must hold first.
        self.restore_dense_reserve(nand, plane, now_ns)?;
        let floor = self.gc_floor();
        // Migrated pages take dense space as host pages do without an SLC cache. If GC could
        // not restore the reserve, the plane's dense blocks hold almost nothing but valid
        // data, and the reserve is what relocation needs: the SLC block stays, and the host
        // page goes to another plane (the caller tries the next one) while this one drains
        // as its data is overwritten. Without this, writes that happen to leave more valid
        // data in one plane than in the others fill that plane's reserve with migrated pages
        // until a relocation finds no block at all, with the device far from full.
        let free = self.planes[plane as usize].free_dense.len();
        let needed = self.relocation_blocks_needed(plane, moved as u32) as usize;
        if needed > free || (needed > 0 && free < floor) {
            return Err(DeviceError::NoSpace { plane });
        }
        let pl = &mut self.planes[plane as usize];
        let index = pl
            .slc_full
            .iter()
            .position(|&b| b == victim)
            .expect("GC does not touch SLC blocks");
        pl.slc_full.swap_remove(index);
        self.blocks[victim as usize].state = BlockState::Open;
        self.relocate_and_erase(nand, plane, victim, now_ns)?;
        self.stats.slc_evictions += 1;
        self.stats.slc_pages_migrated += moved;
        self.stats.slc_transient_pages_migrated += moved_transient;
        Ok(())
    }

    /// Static wear levelling: every 64 erases in a plane, if the spread of erase counts
    /// exceeds the threshold, the least-erased full block (cold data) is cleaned so that it
    /// returns to the free pool and takes hot writes.
    fn maybe_level_wear(
        &mut self,
        nand: &mut Nand,
        plane: u32,
        now_ns: TimeNs,
    ) -> Result<(), DeviceError> {
        let threshold = self.wear.static_threshold_erases;
        if threshold == 0 || self.planes[plane as usize].erases_since_wear_check < 64 {
            return Ok(());
        }
        self.planes[plane as usize].erases_since_wear_check = 0;
        let mut max_erases = 0;
        let mut coldest = (u32::MAX, NONE);
        for block in self.geometry.blocks_of_plane(plane) {
            let b = &self.blocks[block as usize];
            if b.state == BlockState::Bad || b.pool != Pool::Dense {
                continue;
            }
            let e = nand.erase_count(block);
            max_erases = max_erases.max(e);
            if b.state == BlockState::Full && e < coldest.0 {
                coldest = (e, block);
            }
        }
        if coldest.1 == NONE || max_erases - coldest.0 <= threshold {
            return Ok(());
        }
        let victim = coldest.1;
        self.blocks[victim as usize].state = BlockState::Open;
        self.set_greedy_key(victim);
        self.relocate_and_erase(nand, plane, victim, now_ns)?;
        self.stats.static_wl_moves += 1;
        Ok(())
    }

    /// Idle-time work: cleans one block in the next plane that is below the soft threshold
    /// and whose die is idle, and, with `gc.idle_erase`, erases one wholly invalid block in
    /// every plane whose die is idle, once the host has nothing in flight (from
    /// `host_idle_from_ns` on). Returns when to look again, or None when nothing is left.
    pub fn background(
        &mut self,
        nand: &mut Nand,
        now_ns: TimeNs,
        host_idle_from_ns: TimeNs,
    ) -> Result<Option<TimeNs>, DeviceError> {
        let mut next: Option<TimeNs> = None;
        let soonest = |next: &mut Option<TimeNs>, t: TimeNs| {
            *next = Some(next.map_or(t, |n: TimeNs| n.min(t)));
        };
        if self.gc.background {
            let planes = self.planes.len();
            for _ in 0..planes {
                let p = self.background_cursor;
                self.background_cursor = (self.background_cursor + 1) % planes;
                if self.planes[p].free_dense.len() >= self.gc.soft_threshold_blocks as usize {
                    continue;
                }
                let first = self.geometry.block_in_plane(p as u32, 0);
                let die_free = nand.die_free_ns_of_block(first);
                if die_free > now_ns {
                    soonest(&mut next, die_free);
                    continue;
                }
                if self.collect_one(nand, p as u32, now_ns, true)? {
                    soonest(&mut next, nand.die_free_ns_of_block(first));
                }
            }
        }
        if self.gc.idle_erase {
            if let Some(t) = self.idle_erase(nand, now_ns, host_idle_from_ns)? {
                soonest(&mut next, t);
            }
        }
        Ok(next)
    }

    /// Erases one full dense block holding no valid page in every plane whose die has
    /// nothing booked from `now_ns` on, if the host has nothing in flight (`now_ns` at or
    /// after `host_idle_from_ns`). A real controller does this in idle time so that a
    /// TRIMmed block is ready before a write needs it (the SWAN paper's model counts the
    /// erase in the back-end's cleaning time, §3.5). Returns when to look again: when the
    /// host's last command ends, or when the earliest die with work left is free.
    fn idle_erase(
        &mut self,
        nand: &mut Nand,
        now_ns: TimeNs,
        host_idle_from_ns: TimeNs,
    ) -> Result<Option<TimeNs>, DeviceError> {
        let planes = self.planes.len() as u32;
        let wholly_invalid = |ftl: &Self, plane: u32| -> Option<u32> {
            let index = ftl.planes[plane as usize]
                .greedy_keys
                .iter()
                .position(|&k| k == 0)?;
            Some(ftl.geometry.block_in_plane(plane, index as u32))
        };
        if now_ns < host_idle_from_ns {
            // The host still has commands in flight: the device is not idle yet.
            let any = (0..planes).any(|p| wholly_invalid(self, p).is_some());
            return Ok(any.then_some(host_idle_from_ns));
        }
        let mut next: Option<TimeNs> = None;
        for plane in 0..planes {
            let Some(block) = wholly_invalid(self, plane) else {
                continue;
            };
            let die_free = nand.die_free_ns_of_block(block);
            if die_free > now_ns {
                next = Some(next.map_or(die_free, |n: TimeNs| n.min(die_free)));
                continue;
            }
            // Taken out of the victim structures first, as a GC victim is.
            self.blocks[block as usize].state = BlockState::Open;
            self.set_greedy_key(block);
            let done = self.erase_block(nand, plane, block, now_ns)?;
            // A block marked for retirement, or whose erase failed, is retired instead.
            if self.blocks[block as usize].state == BlockState::Free {
                self.stats.idle_erases += 1;
            }
            self.maybe_level_wear(nand, plane, now_ns)?;
            if wholly_invalid(self, plane).is_some() {
                let free = nand.die_free_ns_of_block(block).max(done);
                next = Some(next.map_or(free, |n: TimeNs| n.min(free)));
            }
        }
        Ok(next)
    }

    /// Builds the state that uniform random overwrites of `filled` logical pages leave
    /// behind, without simulating them: each plane's blocks get valid-page counts from the
    /// steady state of the GC policy (the greedy mean-field levels, or FIFO's exponential
    /// decay with age), and the logical pages are scattered over the valid slots by a seeded
    /// permutation. `fill` stores each page's payload. The FTL must be empty.
    pub fn construct_random_steady_state(
        &mut self,
        nand: &mut Nand,
        filled: u32,
        seed: u64,
        fill: &mut dyn FnMut(&mut Nand, u32, u32),
    ) -> Result<(), crate::SsdError> {
        if self.stats.page_writes > 0 || self.l2p.iter().any(|&p| p != NONE) {
            return Err(crate::SsdError::Config(
                "a random steady state can only be constructed on an empty device".into(),
            ));
        }
        let planes = self.planes.len() as u32;
        let ppb = self.pages_per_block;
        let reserve = self.gc_floor() + 2;
        let mut permutation = Permutation::new(filled, seed);
        for plane in 0..planes {
            let share = filled / planes + u32::from(plane < filled % planes);
            let mut free = Vec::new();
            while let Some(b) = self.planes[plane as usize].free_dense.pop() {
                free.push(b);
            }
            let total_blocks = free.len();
            let usable = total_blocks.saturating_sub(reserve);
            if share as u64 > usable as u64 * ppb as u64 {
                return Err(crate::SsdError::Config(format!(
                    "plane {plane} cannot hold {share} valid pages in {usable} blocks"
                )));
            }
            let rho = share as f64 / (total_blocks as f64 * ppb as f64);
            let mut counts = self.steady_state_counts(rho, usable)?;
            let mut sum: i64 = counts.iter().map(|&c| c as i64).sum();
            // Round the model's fractions to exactly `share` valid pages.
            let mut i = 0;
            while sum != share as i64 && !counts.is_empty() {
                let c = &mut counts[i % usable];
                if sum < share as i64 && *c < ppb {
                    *c += 1;
                    sum += 1;
                } else if sum > share as i64 && *c > 0 {
                    *c -= 1;
                    sum -= 1;
                }
                i += 1;
            }
            let (to_fill, keep_free) = free.split_at(usable);
            for &block in keep_free {
                let key = self.free_key(nand, block);
                self.planes[plane as usize].free_dense.push(key, block);
            }
            for (&block, &valid) in to_fill.iter().zip(&counts) {
                if valid == 0 {
                    // An empty block in the steady state is simply a free block.
                    let key = self.free_key(nand, block);
                    self.planes[plane as usize].free_dense.push(key, block);
                    continue;
                }
                let b = &mut self.blocks[block as usize];
                b.state = BlockState::Open;
                b.valid = 0;
                b.written = ppb as u16;
                b.transient = 0;
                let first = block * ppb;
                for page in 0..ppb {
                    let ppn = first + page;
                    nand.program_untimed(ppn)?;
                    if page < valid {
                        let lpn = permutation.next().ok_or_else(|| {
                            crate::SsdError::Config("steady state ran out of pages".into())
                        })?;
                        self.map(lpn, ppn, false);
                        fill(nand, ppn, lpn);
                    }
                }
                self.close_block(plane, block);
            }
        }
        Ok(())
    }

    /// Valid-page counts for `blocks` full blocks at utilisation `rho`, oldest block first.
    fn steady_state_counts(&self, rho: f64, blocks: usize) -> Result<Vec<u32>, crate::SsdError> {
        let ppb = self.pages_per_block;
        if blocks == 0 || rho <= 0.0 {
            return Ok(vec![0; blocks]);
        }
        let model_error = |e: afa_model::ModelError| crate::SsdError::Config(e.to_string());
        let counts = match self.gc.victim {
            VictimPolicy::Fifo => {
                // Under FIFO a block's valid fraction decays as u*^age, from 1 when written
                // to u* when cleaned, where (u*−1)/ln u* = rho.
                let u = afa_model::segment_utilisation_from_disk_utilisation(rho.min(0.999_999))
                    .map_err(model_error)?;
                (0..blocks)
                    .map(|i| {
                        let age = 1.0 - (i as f64 + 0.5) / blocks as f64;
                        (ppb as f64 * u.powf(age)).round() as u32
                    })
                    .collect()
            }
            VictimPolicy::Greedy | VictimPolicy::CostBenefit => {
                let state =
                    afa_model::greedy_steady_state(rho.min(0.999_999), ppb).map_err(model_error)?;
                // Block i takes the level at its quantile of the level distribution.
                let mut cumulative = Vec::with_capacity(state.level_fractions.len());
                let mut total = 0.0;
                for f in &state.level_fractions {
                    total += f;
                    cumulative.push(total);
                }
                (0..blocks)
                    .map(|i| {
                        let q = (i as f64 + 0.5) / blocks as f64 * total;
                        cumulative.partition_point(|&c| c < q).min(ppb as usize) as u32
                    })
                    .collect()
            }
        };
        Ok(counts)
    }

    /// Checks every structural invariant; tests call it after random operation sequences.
    pub fn check_invariants(&self, nand: &Nand) {
        let ppb = self.pages_per_block;
        for (lpn, &ppn) in self.l2p.iter().enumerate() {
            if ppn != NONE {
                assert_eq!(
                    self.p2l[ppn as usize], lpn as u32,
                    "l2p/p2l disagree at lpn {lpn}"
                );
            }
        }
        for (block, info) in self.blocks.iter().enumerate() {
            let first = block as u32 * ppb;
            let valid = (first..first + ppb)
                .filter(|&p| self.p2l[p as usize] != NONE)
                .count();
            assert_eq!(valid, info.valid as usize, "valid count of block {block}");
            let key = self.planes[info.plane as usize].greedy_keys[info.index_in_plane as usize];
            let candidate = info.state == BlockState::Full && info.pool == Pool::Dense;
            let expected = if candidate { info.valid } else { NOT_A_VICTIM };
            assert_eq!(key, expected, "greedy key of block {block}");
            if info.state != BlockState::Bad {
                assert_eq!(
                    info.written as u32,
                    nand.next_page(block as u32),
                    "write pointer of block {block}"
                );
            }
            for p in first..first + ppb {
                let lpn = self.p2l[p as usize];
                if lpn != NONE {
                    assert_eq!(self.l2p[lpn as usize], p, "p2l/l2p disagree at ppn {p}");
                    assert!(
                        p - first < nand.next_page(block as u32),
                        "valid page beyond write pointer"
                    );
                }
            }
        }
    }
}

/// Lists every plane in the order consecutive pages visit them; `dims` names the dimensions
/// (0 channel, 1 chip, 2 die, 3 plane) fastest-varying first.
fn allocation_order(g: &Geometry, dims: [usize; 4]) -> Vec<u32> {
    let sizes = [
        g.channels,
        g.chips_per_channel,
        g.dies_per_chip,
        g.planes_per_die,
    ];
    (0..g.planes_total())
        .map(|mut i| {
            let mut coord = [0u32; 4];
            for &d in &dims {
                coord[d] = i % sizes[d];
                i /= sizes[d];
            }
            g.plane_index(coord[0], coord[1], coord[2], coord[3])
        })
        .collect()
}

/// A seeded permutation of `0..n` that needs no memory: a full-period linear congruential
/// sequence modulo the next power of two, skipping values of `n` and above.
#[derive(Debug)]
struct Permutation {
    n: u32,
    mask: u64,
    multiplier: u64,
    increment: u64,
    state: u64,
    produced: u32,
}

impl Permutation {
    fn new(n: u32, seed: u64) -> Self {
        let size = (n.max(1) as u64).next_power_of_two();
        // a ≡ 1 (mod 4) and an odd increment give a full period modulo a power of two.
        let mixed = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        Self {
            n,
            mask: size - 1,
            multiplier: (mixed & !3) | 1 | 4,
            increment: ((mixed >> 17) | 1) & (size * 2 - 1),
            state: (mixed >> 29) & (size - 1),
            produced: 0,
        }
    }

    fn next(&mut self) -> Option<u32> {
        if self.produced == self.n {
            return None;
        }
        loop {
            self.state = self
                .state
                .wrapping_mul(self.multiplier)
                .wrapping_add(self.increment)
                & self.mask;
            if self.state < self.n as u64 {
                self.produced += 1;
                return Some(self.state as u32);
            }
        }
    }
}

#[cfg(test)]
mod permutation_tests {
    use super::Permutation;

    #[test]
    fn permutation_visits_every_value_once() {
        for n in [1u32, 2, 3, 7, 8, 1000, 4097] {
            let mut seen = vec![false; n as usize];
            let mut p = Permutation::new(n, 42);
            while let Some(v) = p.next() {
                assert!(!seen[v as usize], "{v} twice for n {n}");
                seen[v as usize] = true;
            }
            assert!(seen.iter().all(|&s| s), "n {n}");
        }
    }
}
