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
    /// Valid pages written with the transient flag.
    transient: u16,
    state: BlockState,
    pool: Pool,
    /// A page program failed in this block: retire it instead of erasing it when cleaned.
    retire: bool,
    /// Sequence number at which the block was filled (age for FIFO and cost-benefit).
    closed_seq: u64,
    /// Links of the greedy bucket list the block is in (dense full blocks only).
    prev: u32,
    next: u32,
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
    first_block: u32,
    free_dense: FreePool,
    free_slc: FreePool,
    host_open: u32,
    gc_open: u32,
    slc_open: u32,
    /// Heads of the greedy bucket lists: dense full blocks by valid-page count.
    bucket_head: Vec<u32>,
    /// No bucket below this index is occupied.
    min_bucket: u32,
    /// Dense full blocks in the order they were filled (FIFO victim selection); entries whose
    /// block has since been cleaned are skipped lazily.
    fifo: VecDeque<(u32, u64)>,
    slc_full: Vec<u32>,
    erases_since_wear_check: u32,
}

/// Counters the FTL keeps; the controller adds them to its report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FtlStats {
    /// Logical pages written by the host (a partial page counts as one).
    pub host_page_writes: u64,
    /// Pages read to merge a partial-page write (read-modify-write).
    pub rmw_reads: u64,
    pub gc_foreground_runs: u64,
    pub gc_background_runs: u64,
    pub gc_pages_moved: u64,
    pub slc_evictions: u64,
    pub slc_pages_migrated: u64,
    pub static_wl_moves: u64,
    pub program_failures: u64,
    pub blocks_retired: u64,
}

/// Where a page write comes from: the host stream, or relocation (GC, eviction, wear
/// levelling), which goes to a separate open block so cold data is kept apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    Host,
    Relocation,
}

#[derive(Debug)]
pub struct Ftl {
    geometry: Geometry,
    pages_per_block: u32,
    slc_pages_per_block: u32,
    logical_pages: u32,
    l2p: Vec<u32>,
    p2l: Vec<u32>,
    transient_bits: Vec<u64>,
    blocks: Vec<BlockInfo>,
    planes: Vec<Plane>,
    allocation_order: Vec<u32>,
    cursor: usize,
    gc: GcConfig,
    slc: SlcCacheConfig,
    slc_enabled: bool,
    wear: WearLevelingConfig,
    seq: u64,
    background_cursor: usize,
    /// End of the latest GC or eviction operation scheduled on any die.
    gc_busy_until_ns: TimeNs,
    /// Set while preconditioning: NAND operations are applied without timing or counting.
    untimed: bool,
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
        let reserve_per_plane = config.gc.hard_threshold_blocks + 2;
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
                transient: 0,
                state: BlockState::Free,
                pool: Pool::Dense,
                retire: false,
                closed_seq: 0,
                prev: NONE,
                next: NONE,
            };
            g.blocks_total() as usize
        ];
        let mut planes = Vec::with_capacity(planes_total as usize);
        let mut dense_good_blocks = 0u64;
        for p in 0..planes_total {
            let first = p * g.blocks_per_plane;
            let mut plane = Plane {
                first_block: first,
                free_dense: FreePool::default(),
                free_slc: FreePool::default(),
                host_open: NONE,
                gc_open: NONE,
                slc_open: NONE,
                bucket_head: vec![NONE; ppb as usize + 1],
                min_bucket: ppb + 1,
                fifo: VecDeque::new(),
                slc_full: Vec::new(),
                erases_since_wear_check: 0,
            };
            let mut slc_left = slc_blocks_per_plane;
            for b in first..first + g.blocks_per_plane {
                if nand.is_bad(b) {
                    blocks[b as usize].state = BlockState::Bad;
                    continue;
                }
                if slc_left > 0 {
                    slc_left -= 1;
                    nand.set_block_mode(b, CellMode::Slc)?;
                    blocks[b as usize].pool = Pool::Slc;
                    plane.free_slc.push(b as u64, b);
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
            pages_per_block: ppb,
            slc_pages_per_block: slc_ppb,
            logical_pages: logical as u32,
            l2p: vec![NONE; logical as usize],
            p2l: vec![NONE; pages_total],
            transient_bits: vec![0; pages_total.div_ceil(64)],
            blocks,
            planes,
            cursor: 0,
            gc: config.gc.clone(),
            slc: config.slc_cache.clone(),
            slc_enabled: slc_blocks_per_plane > 0,
            wear: config.wear_leveling.clone(),
            seq: 0,
            background_cursor: 0,
            gc_busy_until_ns: 0,
            untimed: false,
            stats: FtlStats::default(),
            geometry: g,
        })
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

    /// The plane the next host page goes to, in the configured allocation order.
    #[inline]
    fn next_plane(&mut self) -> u32 {
        let p = self.allocation_order[self.cursor];
        self.cursor += 1;
        if self.cursor == self.allocation_order.len() {
            self.cursor = 0;
        }
        p
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

    // ----- Greedy buckets -----------------------------------------------------------------

    #[inline]
    fn bucket_link(&mut self, plane: u32, block: u32) {
        let valid = self.blocks[block as usize].valid as u32;
        let pl = &mut self.planes[plane as usize];
        let head = pl.bucket_head[valid as usize];
        pl.bucket_head[valid as usize] = block;
        if valid < pl.min_bucket {
            pl.min_bucket = valid;
        }
        let b = &mut self.blocks[block as usize];
        b.prev = NONE;
        b.next = head;
        if head != NONE {
            self.blocks[head as usize].prev = block;
        }
    }

    #[inline]
    fn bucket_unlink(&mut self, plane: u32, block: u32) {
        let BlockInfo {
            prev, next, valid, ..
        } = self.blocks[block as usize];
        if prev != NONE {
            self.blocks[prev as usize].next = next;
        } else {
            self.planes[plane as usize].bucket_head[valid as usize] = next;
        }
        if next != NONE {
            self.blocks[next as usize].prev = prev;
        }
        let b = &mut self.blocks[block as usize];
        b.prev = NONE;
        b.next = NONE;
    }

    // ----- Mapping ------------------------------------------------------------------------

    /// Marks a physical page invalid, keeping the block's counters and greedy bucket right.
    #[inline]
    fn invalidate(&mut self, ppn: u32) {
        let block = ppn / self.pages_per_block;
        let plane = block / self.geometry.blocks_per_plane;
        self.p2l[ppn as usize] = NONE;
        let transient = self.take_transient_bit(ppn);
        let info = self.blocks[block as usize];
        let in_bucket = info.state == BlockState::Full && info.pool == Pool::Dense;
        if in_bucket {
            self.bucket_unlink(plane, block);
        }
        let b = &mut self.blocks[block as usize];
        debug_assert!(
            b.valid > 0,
            "invalidating a page of block {block} with no valid pages"
        );
        b.valid -= 1;
        if transient {
            b.transient -= 1;
        }
        if in_bucket {
            self.bucket_link(plane, block);
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
        let block = ppn / self.pages_per_block;
        let b = &mut self.blocks[block as usize];
        b.valid += 1;
        if transient {
            b.transient += 1;
            self.transient_bits[ppn as usize / 64] |= 1u64 << (ppn % 64);
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
                self.bucket_link(plane, block);
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
        let block = if current != NONE && nand.next_page(current) < self.capacity_of(current) {
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
        let ppn = block * self.pages_per_block + nand.next_page(block);
        Ok(ppn)
    }

    #[inline]
    fn open_of(&self, plane: u32, pool: Pool, stream: Stream) -> u32 {
        let pl = &self.planes[plane as usize];
        match (pool, stream) {
            (Pool::Slc, _) => pl.slc_open,
            (Pool::Dense, Stream::Host) => pl.host_open,
            (Pool::Dense, Stream::Relocation) => pl.gc_open,
        }
    }

    #[inline]
    fn set_open(&mut self, plane: u32, pool: Pool, stream: Stream, block: u32) {
        let pl = &mut self.planes[plane as usize];
        match (pool, stream) {
            (Pool::Slc, _) => pl.slc_open = block,
            (Pool::Dense, Stream::Host) => pl.host_open = block,
            (Pool::Dense, Stream::Relocation) => pl.gc_open = block,
        }
    }

    /// A program failed on `ppn`: the page is lost, its block is closed now and retired
    /// when it is next cleaned.
    fn handle_program_failure(&mut self, plane: u32, ppn: u32) {
        let block = ppn / self.pages_per_block;
        self.stats.program_failures += 1;
        self.blocks[block as usize].retire = true;
        let pl = &mut self.planes[plane as usize];
        for open in [&mut pl.host_open, &mut pl.gc_open, &mut pl.slc_open] {
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
        self.stats.host_page_writes += 1;
        let mut planes_out_of_space = 0;
        loop {
            let plane = self.next_plane();
            // A plane that lost blocks to failures may fill up before the others; the page
            // then goes to the next plane, and only a device with no room anywhere says so.
            let ppn = match self.allocate_host_page(nand, plane, ready_ns) {
                Ok(ppn) => ppn,
                Err(DeviceError::NoSpace { .. }) if planes_out_of_space + 1 < self.planes.len() => {
                    planes_out_of_space += 1;
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
    ) -> Result<u32, DeviceError> {
        // Foreground GC: the plane must keep its reserve of free dense blocks.
        while self.planes[plane as usize].free_dense.len() < self.gc.hard_threshold_blocks as usize
        {
            if !self.collect_one(nand, plane, now_ns, false)? {
                break;
            }
        }
        if !self.slc_enabled {
            return self.take_page(nand, plane, Pool::Dense, Stream::Host);
        }
        let open = self.planes[plane as usize].slc_open;
        let open_has_room = open != NONE && nand.next_page(open) < self.capacity_of(open);
        if !open_has_room && self.planes[plane as usize].free_slc.len() == 0 {
            if open != NONE {
                self.close_block(plane, open);
                self.planes[plane as usize].slc_open = NONE;
            }
            self.evict_slc(nand, plane, now_ns)?;
        }
        self.take_page(nand, plane, Pool::Slc, Stream::Host)
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
        let first = victim * self.pages_per_block;
        let written = nand.next_page(victim);
        let mut last_read = now_ns;
        for ppn in first..first + written {
            let lpn = self.p2l[ppn as usize];
            if lpn == NONE {
                continue;
            }
            let read_done = self.nand_read(nand, ppn, now_ns);
            last_read = last_read.max(read_done);
            loop {
                let dst = self.take_page(nand, plane, Pool::Dense, Stream::Relocation)?;
                match self.nand_program(nand, dst, read_done) {
                    Ok(done) => {
                        self.gc_busy_until_ns = self.gc_busy_until_ns.max(done);
                        break self.move_mapping(nand, lpn, ppn, dst);
                    }
                    Err(NandError::ProgramFailed { .. }) => {
                        self.handle_program_failure(plane, dst);
                    }
                    Err(e) => panic!("FTL invariant broken: {e}"),
                }
            }
        }
        debug_assert_eq!(self.blocks[victim as usize].valid, 0);
        self.erase_block(nand, plane, victim, last_read)
    }

    #[inline]
    fn move_mapping(&mut self, nand: &mut Nand, lpn: u32, src: u32, dst: u32) {
        nand.store_mut().copy_page(src, dst);
        let transient = self.transient_bits[src as usize / 64] >> (src % 64) & 1 == 1;
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
            return Ok(ready_ns);
        }
        match self.nand_erase(nand, block, ready_ns) {
            Ok(done) => {
                self.gc_busy_until_ns = self.gc_busy_until_ns.max(done);
                let key = self.free_key(nand, block);
                let b = &mut self.blocks[block as usize];
                b.state = BlockState::Free;
                b.valid = 0;
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
                Ok(ready_ns)
            }
            Err(e) => panic!("FTL invariant broken: {e}"),
        }
    }

    // ----- Garbage collection -------------------------------------------------------------

    /// Picks a dense victim in `plane` by the configured policy and removes it from the
    /// full-block structures.
    fn take_victim(&mut self, plane: u32) -> Option<u32> {
        let victim = match self.gc.victim {
            VictimPolicy::Greedy => {
                let pl = &self.planes[plane as usize];
                let mut v = pl.min_bucket;
                while (v as usize) < pl.bucket_head.len() && pl.bucket_head[v as usize] == NONE {
                    v += 1;
                }
                self.planes[plane as usize].min_bucket = v;
                let head = *self.planes[plane as usize].bucket_head.get(v as usize)?;
                (head != NONE).then_some(head)?
            }
            VictimPolicy::Fifo => loop {
                let (block, seq) = self.planes[plane as usize].fifo.pop_front()?;
                let b = &self.blocks[block as usize];
                if b.state == BlockState::Full && b.closed_seq == seq {
                    break block;
                }
            },
            VictimPolicy::CostBenefit => {
                let first = self.planes[plane as usize].first_block;
                let ppb = self.pages_per_block as f64;
                let mut best = (f64::NEG_INFINITY, NONE);
                for block in first..first + self.geometry.blocks_per_plane {
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
        self.bucket_unlink(plane, victim);
        self.blocks[victim as usize].state = BlockState::Open; // being cleaned
        Some(victim)
    }

    /// Returns a victim that will not be cleaned after all to the full-block structures.
    fn put_back(&mut self, plane: u32, victim: u32) {
        self.blocks[victim as usize].state = BlockState::Full;
        self.bucket_link(plane, victim);
        if self.gc.victim == VictimPolicy::Fifo {
            let seq = self.blocks[victim as usize].closed_seq;
            self.planes[plane as usize].fifo.push_front((victim, seq));
        }
    }

    /// Whether `pages` relocated pages fit in the plane's relocation block plus its free
    /// blocks, so that a cleaning never stops halfway.
    fn relocation_fits(&self, nand: &Nand, plane: u32, pages: u32) -> bool {
        let pl = &self.planes[plane as usize];
        let room = if pl.gc_open == NONE {
            0
        } else {
            self.pages_per_block - nand.next_page(pl.gc_open)
        };
        let blocks_needed = pages.saturating_sub(room).div_ceil(self.pages_per_block);
        pl.free_dense.len() >= blocks_needed as usize
    }

    /// Cleans one victim block in `plane`. Returns false when no block would yield space.
    fn collect_one(
        &mut self,
        nand: &mut Nand,
        plane: u32,
        now_ns: TimeNs,
        background: bool,
    ) -> Result<bool, DeviceError> {
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
        if !self.relocation_fits(nand, plane, moved as u32) {
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
        let victim = self.planes[plane as usize].slc_full.swap_remove(index);
        self.blocks[victim as usize].state = BlockState::Open;
        let moved = self.blocks[victim as usize].valid as u64;
        // Migration fills dense blocks, so the plane's dense reserve must hold first.
        while self.planes[plane as usize].free_dense.len() < self.gc.hard_threshold_blocks as usize
        {
            if !self.collect_one(nand, plane, now_ns, false)? {
                break;
            }
        }
        self.relocate_and_erase(nand, plane, victim, now_ns)?;
        self.stats.slc_evictions += 1;
        self.stats.slc_pages_migrated += moved;
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
        let first = self.planes[plane as usize].first_block;
        let mut max_erases = 0;
        let mut coldest = (u32::MAX, NONE);
        for block in first..first + self.geometry.blocks_per_plane {
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
        self.bucket_unlink(plane, victim);
        self.blocks[victim as usize].state = BlockState::Open;
        self.relocate_and_erase(nand, plane, victim, now_ns)?;
        self.stats.static_wl_moves += 1;
        Ok(())
    }

    /// Idle-time work: cleans one block in the next plane that is below the soft threshold
    /// and whose die is idle. Returns when to look again, or None when nothing is left.
    pub fn background(
        &mut self,
        nand: &mut Nand,
        now_ns: TimeNs,
    ) -> Result<Option<TimeNs>, DeviceError> {
        if !self.gc.background {
            return Ok(None);
        }
        let planes = self.planes.len();
        let mut next: Option<TimeNs> = None;
        for _ in 0..planes {
            let p = self.background_cursor;
            self.background_cursor = (self.background_cursor + 1) % planes;
            if self.planes[p].free_dense.len() >= self.gc.soft_threshold_blocks as usize {
                continue;
            }
            let first = self.planes[p].first_block;
            let die_free = nand.die_free_ns_of_block(first);
            if die_free > now_ns {
                next = Some(next.map_or(die_free, |n: TimeNs| n.min(die_free)));
                continue;
            }
            if self.collect_one(nand, p as u32, now_ns, true)? {
                let done = nand.die_free_ns_of_block(first);
                next = Some(next.map_or(done, |n: TimeNs| n.min(done)));
            }
        }
        Ok(next)
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
