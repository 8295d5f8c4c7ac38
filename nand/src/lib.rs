//! The flash medium: geometry, cell modes and their timing, per-die and per-channel
//! next-free time, per-block program order, erase counts, bad blocks, the stored payload and
//! OOB bytes, and injected program/erase failures.
//!
//! The medium knows nothing about logical addresses: that is the controller's business
//! (`afa-ssd`). It enforces the physical rules — pages of a block are programmed in order,
//! once, between erases; bad blocks are never used — and computes when each operation ends.
//!
//! Timing follows the booking model of FEMU and MQSim: each die and each channel remembers
//! when it is busy, and an operation starts when both its input is ready and its resources
//! are free. Unlike their single next-free time, the medium keeps each resource's booked
//! intervals, so an operation ready now may use an idle gap before work booked for later
//! (`Scheduling`). The simulation never needs one event per flash operation.

mod config;
mod store;

pub use config::{CellMode, CellTiming, Geometry, NandTiming, Scheduling};
use serde::{Deserialize, Serialize};
pub use store::{
    fill_unit, sector_token, unit_matches, unit_token, PageStore, PayloadMode, CONTROLLER_OOB_BYTES,
};

use afa_sim::{transfer_ns, Calendar, SimRng, TimeNs};

/// Errors of the medium. A program or erase failure is an expected event that the
/// controller must handle; the others are bugs in the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NandError {
    #[error("invalid NAND configuration: {0}")]
    Config(String),
    #[error("program of page {page} in block {block} failed")]
    ProgramFailed { block: u32, page: u32 },
    #[error("erase of block {block} failed; the block is now bad")]
    EraseFailed { block: u32 },
    #[error("block {block} is bad")]
    BadBlock { block: u32 },
    #[error(
        "page {page} of block {block} programmed out of order (next programmable page is {next})"
    )]
    OutOfOrder { block: u32, page: u32, next: u32 },
    #[error("block {block} cannot change cell mode while it holds data")]
    ModeChangeOnWrittenBlock { block: u32 },
    #[error("a restored image names block {block}, but the medium has {blocks} blocks")]
    RestoreOutOfRange { block: u32, blocks: u32 },
    #[error("a restored image puts block {block}'s write pointer at page {next_page}, past its {pages} pages")]
    RestorePastEnd {
        block: u32,
        next_page: u32,
        pages: u32,
    },
}

/// Probabilities of injected media faults, drawn from the medium's own seeded stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct FaultConfig {
    /// Fraction of blocks marked bad at manufacture.
    pub factory_bad_block_fraction: f64,
    /// Probability that one page program fails (the page is consumed, its data is not stored).
    pub program_fail_probability: f64,
    /// Probability that one block erase fails (the block becomes bad).
    pub erase_fail_probability: f64,
    /// Probability that a page a host read needs from flash cannot be corrected by the
    /// controller's ECC on this read: the command fails with an uncorrectable-read error.
    /// The stored data stays as it was, so a later read (or a rewrite) may succeed, as with
    /// read-disturb and retention errors that a fresh read-retry clears.
    pub read_fail_probability: f64,
}

impl FaultConfig {
    pub fn validate(&self) -> Result<(), NandError> {
        for (name, p) in [
            (
                "factory_bad_block_fraction",
                self.factory_bad_block_fraction,
            ),
            ("program_fail_probability", self.program_fail_probability),
            ("erase_fail_probability", self.erase_fail_probability),
            ("read_fail_probability", self.read_fail_probability),
        ] {
            if !(0.0..1.0).contains(&p) {
                return Err(NandError::Config(format!(
                    "faults.{name} = {p} must lie in [0, 1)"
                )));
            }
        }
        Ok(())
    }

    /// Whether programs or erases may fail while the device runs, so that blocks go bad
    /// after the FTL has laid out its reserve (factory bad blocks are known before).
    pub fn media_can_fail(&self) -> bool {
        self.program_fail_probability > 0.0 || self.erase_fail_probability > 0.0
    }
}

/// The uncorrectable host reads of `FaultConfig::read_fail_probability`, drawn from a stream
/// of their own, apart from the medium's, so that turning read faults on moves no other
/// fault. The controller draws them: a read fails this time, the stored data stays.
#[derive(Debug, Clone)]
pub struct HostReadFaults {
    probability: f64,
    rng: SimRng,
}

impl HostReadFaults {
    pub fn new(faults: &FaultConfig, seed: u64) -> Self {
        Self {
            probability: faults.read_fail_probability,
            rng: SimRng::fork(seed, 0x5245_4144), // "READ"
        }
    }

    /// Whether a host read that needed `flash_pages` pages from flash fails as
    /// uncorrectable (each page's ECC failing with the probability).
    pub fn read_fails(&mut self, flash_pages: u32) -> bool {
        self.probability > 0.0 && (0..flash_pages).any(|_| self.rng.chance(self.probability))
    }
}

/// Operation counters, split by the cell mode the block was in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct NandCounters {
    pub reads: [u64; 3],
    pub programs: [u64; 3],
    pub erases: [u64; 3],
    pub program_failures: u64,
    pub erase_failures: u64,
    /// Reads that went ahead of program or erase work booked on their die
    /// (`timing.read_suspend`).
    pub read_suspends: u64,
}

/// What the flash has failed at so far: its bad blocks (from the factory or retired after a
/// failed program or erase) and its failed programs and erases. A volume sums its devices'
/// counts, so that a device out of space can say whether grown bad blocks took its spare.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MediaFaults {
    pub bad_blocks: u64,
    pub program_failures: u64,
    pub erase_failures: u64,
}

impl std::ops::AddAssign for MediaFaults {
    fn add_assign(&mut self, other: Self) {
        self.bad_blocks += other.bad_blocks;
        self.program_failures += other.program_failures;
        self.erase_failures += other.erase_failures;
    }
}

impl std::iter::Sum for MediaFaults {
    fn sum<I: Iterator<Item = Self>>(iter: I) -> Self {
        let mut total = Self::default();
        for f in iter {
            total += f;
        }
        total
    }
}

impl MediaFaults {
    /// The faults in words, or `None` when the flash had none.
    pub fn summary(&self) -> Option<String> {
        (*self != Self::default()).then(|| {
            format!(
                "{} blocks bad (from the factory or retired), {} failed programs, {} failed erases",
                self.bad_blocks, self.program_failures, self.erase_failures
            )
        })
    }

    /// `error` with the faults appended when the flash had any, so that a device that ran
    /// out of space because grown bad blocks took its spare blocks says so.
    pub fn explain(&self, error: impl std::fmt::Display) -> String {
        match self.summary() {
            Some(faults) => format!("{error} (media faults by then: {faults})"),
            None => error.to_string(),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct BlockState {
    next_page: u16,
    mode: CellMode,
    bad: bool,
    erase_count: u32,
    /// When the block's latest program ends: the next program of the block, and its erase,
    /// start no earlier, so that gap filling never reorders a block's pages in time.
    program_end_ns: TimeNs,
    /// The die holding the block and the block's plane as a bit within the die, kept here
    /// so that the hot path needs no division to find them.
    die: u32,
    plane_bit: u32,
}

/// What a die is doing in its current (latest) operation, so that an operation of the same
/// kind on another plane can join it as a multi-plane command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpKind {
    Idle,
    Read,
    Program,
    Erase,
}

#[derive(Debug, Clone)]
struct DieState {
    calendar: Calendar,
    busy_ns: u64,
    /// The die's most recently booked operation, which another plane's operation may join.
    batch_kind: OpKind,
    batch_start_ns: TimeNs,
    batch_end_ns: TimeNs,
    batch_planes_mask: u64,
}

/// The flash medium of one SSD.
#[derive(Debug)]
pub struct Nand {
    geometry: Geometry,
    timing: NandTiming,
    dense_mode: CellMode,
    dies: Vec<DieState>,
    /// Each die's reads alone, kept only when reads may go ahead (`timing.read_suspend` or
    /// `timing.erase_suspend`; empty otherwise, so the dies stay small on the hot path): a
    /// read may go ahead of programs and erases, but never through another read.
    die_reads: Vec<Calendar>,
    /// Each die's programs alone, kept only with `timing.erase_suspend` and not
    /// `read_suspend`: a read may then go ahead of erases but must fit around programs.
    die_programs: Vec<Calendar>,
    channels: Vec<Calendar>,
    blocks: Vec<BlockState>,
    counters: NandCounters,
    faults: FaultConfig,
    fault_rng: SimRng,
    store: PageStore,
    page_transfer_ns: u64,
    /// Pages a block holds in each cell mode (index by `CellMode::index`).
    pages_in_mode: [u32; 3],
    channel_of_die: Vec<u32>,
    /// log2(pages_per_block) when it is a power of two, so page-to-block is a shift.
    ppb_shift: Option<u32>,
}

impl Nand {
    /// Builds an erased medium. `dense_mode` is the mode blocks are in unless the controller
    /// switches one to SLC; `seed` drives injected faults.
    pub fn new(
        geometry: Geometry,
        timing: NandTiming,
        dense_mode: CellMode,
        payload: PayloadMode,
        faults: FaultConfig,
        seed: u64,
    ) -> Result<Self, NandError> {
        geometry.validate()?;
        timing.validate()?;
        faults.validate()?;
        PageStore::check_fits_in_memory(&geometry, payload)?;
        let mut fault_rng = SimRng::fork(seed, 0x4e41_4e44); // "NAND"
        let mut blocks: Vec<BlockState> = (0..geometry.blocks_total())
            .map(|b| {
                let plane = geometry.plane_of_block(b);
                BlockState {
                    next_page: 0,
                    mode: dense_mode,
                    bad: false,
                    erase_count: 0,
                    program_end_ns: 0,
                    die: geometry.die_of_plane(plane),
                    plane_bit: 1 << (plane % geometry.planes_per_die),
                }
            })
            .collect();
        if faults.factory_bad_block_fraction > 0.0 {
            for b in blocks.iter_mut() {
                b.bad = fault_rng.chance(faults.factory_bad_block_fraction);
            }
        }
        let idle_die = DieState {
            calendar: Calendar::default(),
            busy_ns: 0,
            batch_kind: OpKind::Idle,
            batch_start_ns: 0,
            batch_end_ns: 0,
            batch_planes_mask: 0,
        };
        let page_transfer_ns = transfer_ns(geometry.page_bytes as u64, timing.channel_mb_s);
        let native_bits = dense_mode.bits_per_cell();
        let pages_in_mode = [CellMode::Slc, CellMode::Mlc, CellMode::Tlc]
            .map(|m| (geometry.pages_per_block * m.bits_per_cell() / native_bits).max(1));
        let channel_of_die = (0..geometry.dies_total())
            .map(|d| geometry.channel_of_die(d))
            .collect();
        let ppb_shift = geometry
            .pages_per_block
            .is_power_of_two()
            .then(|| geometry.pages_per_block.trailing_zeros());
        Ok(Self {
            pages_in_mode,
            channel_of_die,
            ppb_shift,
            dies: vec![idle_die; geometry.dies_total() as usize],
            die_reads: if timing.reads_go_ahead() {
                vec![Calendar::default(); geometry.dies_total() as usize]
            } else {
                Vec::new()
            },
            die_programs: if timing.erase_suspend && !timing.read_suspend {
                vec![Calendar::default(); geometry.dies_total() as usize]
            } else {
                Vec::new()
            },
            channels: vec![Calendar::default(); geometry.channels as usize],
            store: PageStore::new(&geometry, payload),
            geometry,
            timing,
            dense_mode,
            blocks,
            counters: NandCounters::default(),
            faults,
            fault_rng,
            page_transfer_ns,
        })
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }
    pub fn timing(&self) -> &NandTiming {
        &self.timing
    }
    pub fn dense_mode(&self) -> CellMode {
        self.dense_mode
    }
    pub fn counters(&self) -> &NandCounters {
        &self.counters
    }
    /// Zeroes the operation counters and die busy times (measurements start after
    /// preconditioning).
    pub fn reset_counters(&mut self) {
        self.counters = NandCounters::default();
        for d in &mut self.dies {
            d.busy_ns = 0;
        }
    }
    pub fn store(&self) -> &PageStore {
        &self.store
    }
    pub fn store_mut(&mut self) -> &mut PageStore {
        &mut self.store
    }

    /// Pages a block holds in `mode`: a dense block used as SLC keeps one bit per cell and
    /// so holds 1/bits of its native pages.
    #[inline]
    pub fn pages_in_mode(&self, mode: CellMode) -> u32 {
        self.pages_in_mode[mode.index()]
    }

    /// The block holding physical page `ppn`.
    #[inline]
    pub fn block_of(&self, ppn: u32) -> u32 {
        match self.ppb_shift {
            Some(shift) => ppn >> shift,
            None => ppn / self.geometry.pages_per_block,
        }
    }

    #[inline]
    pub fn block_mode(&self, block: u32) -> CellMode {
        self.blocks[block as usize].mode
    }
    /// The bad blocks and the failed programs and erases so far.
    pub fn media_faults(&self) -> MediaFaults {
        MediaFaults {
            bad_blocks: self.blocks.iter().filter(|b| b.bad).count() as u64,
            program_failures: self.counters.program_failures,
            erase_failures: self.counters.erase_failures,
        }
    }
    #[inline]
    pub fn is_bad(&self, block: u32) -> bool {
        self.blocks[block as usize].bad
    }
    #[inline]
    pub fn erase_count(&self, block: u32) -> u32 {
        self.blocks[block as usize].erase_count
    }
    /// The next page that may be programmed in `block`.
    #[inline]
    pub fn next_page(&self, block: u32) -> u32 {
        self.blocks[block as usize].next_page as u32
    }

    /// Marks a block bad (the controller retires it after a program failure).
    pub fn retire_block(&mut self, block: u32) {
        self.blocks[block as usize].bad = true;
    }

    /// Switches an erased block between SLC and the dense mode.
    pub fn set_block_mode(&mut self, block: u32, mode: CellMode) -> Result<(), NandError> {
        let b = &mut self.blocks[block as usize];
        if b.next_page != 0 {
            return Err(NandError::ModeChangeOnWrittenBlock { block });
        }
        b.mode = mode;
        Ok(())
    }

    /// When everything booked on die `die` has ended.
    #[inline]
    pub fn die_free_ns(&self, die: u32) -> TimeNs {
        self.dies[die as usize].calendar.free_ns()
    }

    /// Whether die `die` has nothing booked at `at_ns` (it may have work booked later).
    #[inline]
    pub fn die_idle_at(&self, die: u32, at_ns: TimeNs) -> bool {
        self.dies[die as usize].calendar.idle_at(at_ns)
    }

    /// When everything booked on the die holding `block` has ended.
    #[inline]
    pub fn die_free_ns_of_block(&self, block: u32) -> TimeNs {
        self.dies[self.blocks[block as usize].die as usize]
            .calendar
            .free_ns()
    }

    /// Busy time of every die, in nanoseconds.
    pub fn die_busy_ns(&self) -> Vec<u64> {
        self.dies.iter().map(|d| d.busy_ns).collect()
    }

    /// Decides whether an operation of `kind` on a block of `die` (plane bit `plane_bit`)
    /// ready at `ready_ns` can join the die's latest batch as a multi-plane command: same
    /// kind, a plane not yet in it, and input ready within one page transfer of the batch
    /// start (a controller gathers the planes' data before issuing the multi-plane command).
    /// Returns the batch's new end, if the die is free to run that long.
    #[inline]
    fn joined_batch_end(
        &self,
        die: usize,
        plane_bit: u32,
        kind: OpKind,
        ready_ns: TimeNs,
        latency_ns: u64,
    ) -> Option<TimeNs> {
        let d = &self.dies[die];
        let joins = self.timing.multi_plane
            && d.batch_kind == kind
            && d.batch_planes_mask & plane_bit as u64 == 0
            && ready_ns <= d.batch_start_ns + self.page_transfer_ns;
        if !joins {
            return None;
        }
        // The batch waits for this plane's input (at most one page transfer) and then runs
        // once for all its planes; it cannot stretch into work booked after it.
        let end = d.batch_end_ns.max(ready_ns + latency_ns);
        d.calendar.is_free(d.batch_end_ns, end).then_some(end)
    }

    /// Occupies `die` for an operation of `kind` lasting `latency_ns`, starting no earlier
    /// than `ready_ns`, or joins its latest batch. Returns the end of the array operation.
    #[inline]
    fn occupy_die(
        &mut self,
        die: usize,
        plane_bit: u32,
        kind: OpKind,
        ready_ns: TimeNs,
        latency_ns: u64,
    ) -> TimeNs {
        let joined = self.joined_batch_end(die, plane_bit, kind, ready_ns, latency_ns);
        let scheduling = self.timing.scheduling;
        let prioritised = kind == OpKind::Read && self.timing.reads_go_ahead();
        let program_kept = kind == OpKind::Program && !self.die_programs.is_empty();
        let d = &mut self.dies[die];
        if let Some(end) = joined {
            d.calendar.reserve(d.batch_end_ns, end);
            if prioritised {
                self.die_reads[die].reserve(d.batch_end_ns, end);
            }
            if program_kept {
                self.die_programs[die].reserve(d.batch_end_ns, end);
            }
            d.batch_planes_mask |= plane_bit as u64;
            d.busy_ns += end - d.batch_end_ns;
            d.batch_end_ns = end;
            return end;
        }
        let start = earliest_start(&d.calendar, scheduling, ready_ns, latency_ns);
        if prioritised {
            if let Some(end) = self.read_ahead(die, ready_ns, latency_ns, start + latency_ns) {
                return end;
            }
        }
        let d = &mut self.dies[die];
        let end = start + latency_ns;
        d.calendar.reserve(start, end);
        if prioritised {
            self.die_reads[die].reserve(start, end);
        }
        if program_kept {
            self.die_programs[die].reserve(start, end);
        }
        d.busy_ns += latency_ns;
        d.batch_kind = kind;
        d.batch_start_ns = start;
        d.batch_end_ns = end;
        d.batch_planes_mask = plane_bit as u64;
        end
    }

    /// Places a read ahead of the program and erase work booked on its die, if that ends it
    /// before `in_turn_end_ns` (when it would end waiting its turn); returns its end.
    ///
    /// The read takes the earliest time no other read holds. If the die is then in the middle
    /// of a program or erase, the operation is suspended first (`suspend_ns`); the work the
    /// read displaces resumes after it, so the die's booked time grows by what was displaced
    /// and every operation booked later starts that much later. Operations booked before the
    /// read keep the completion time they were given when submitted (this model books a
    /// command's completion then), a small optimism of one read per suspension.
    fn read_ahead(
        &mut self,
        die: usize,
        ready_ns: TimeNs,
        latency_ns: u64,
        in_turn_end_ns: TimeNs,
    ) -> Option<TimeNs> {
        let scheduling = self.timing.scheduling;
        let suspend_ns = self.timing.suspend_ns;
        let d = &mut self.dies[die];
        let reads = &mut self.die_reads[die];
        let programs = self.die_programs.get(die);
        // The earliest time no other read holds and, with erase suspend alone, no program
        // either: a program is never suspended then, so the read waits for it and may go
        // ahead of the erases after it. Each round moves the start forward past one booked
        // interval, so the search ends.
        let mut start = ready_ns;
        loop {
            let free_of_reads = earliest_start(reads, scheduling, start, suspend_ns + latency_ns);
            let free_of_both = programs.map_or(free_of_reads, |p| {
                earliest_start(p, scheduling, free_of_reads, suspend_ns + latency_ns)
            });
            if free_of_both == free_of_reads {
                start = free_of_reads;
                break;
            }
            start = free_of_both;
        }
        // Nothing to suspend when the die is idle then, or when it has just finished another
        // read (the suspended operation has not resumed in between).
        let follows_read = start > 0 && reads.busy_until(start - 1) == start;
        let overhead_ns = if d.calendar.idle_at(start) || follows_read {
            0
        } else {
            suspend_ns
        };
        let end = start + overhead_ns + latency_ns;
        if end >= in_turn_end_ns {
            return None;
        }
        let displaced_ns = d.calendar.busy_within(start, end);
        reads.reserve(start, end);
        d.calendar.reserve(start, end);
        let resume_ns = d.calendar.busy_until(start);
        d.calendar.book(resume_ns, displaced_ns);
        d.busy_ns += overhead_ns + latency_ns;
        self.counters.read_suspends += 1;
        Some(end)
    }

    #[inline]
    fn channel_transfer(&mut self, die: usize, ready_ns: TimeNs, bytes: u32) -> TimeNs {
        let channel = self.channel_of_die[die] as usize;
        let ns = if bytes == self.geometry.page_bytes {
            self.page_transfer_ns
        } else {
            transfer_ns(bytes as u64, self.timing.channel_mb_s)
        };
        let calendar = &mut self.channels[channel];
        let start = earliest_start(calendar, self.timing.scheduling, ready_ns, ns);
        calendar.reserve(start, start + ns);
        start + ns
    }

    /// Reads `xfer_bytes` of page `ppn` (array read, then channel transfer to the controller).
    /// Returns when the data is in controller memory.
    #[inline]
    pub fn read(&mut self, ppn: u32, ready_ns: TimeNs, xfer_bytes: u32) -> TimeNs {
        let state = self.blocks[self.block_of(ppn) as usize];
        let latency = self.timing.of(state.mode).read_ns;
        let die = state.die as usize;
        let array_done = self.occupy_die(die, state.plane_bit, OpKind::Read, ready_ns, latency);
        self.counters.reads[state.mode.index()] += 1;
        self.channel_transfer(die, array_done, xfer_bytes)
    }

    /// Programs page `ppn` with data that is in controller memory at `ready_ns`: channel
    /// transfer, then the array program. The page must be the block's next page.
    ///
    /// On an injected failure the page is consumed but holds nothing; the controller must
    /// write the data elsewhere and retire the block.
    #[inline]
    pub fn program(&mut self, ppn: u32, ready_ns: TimeNs) -> Result<TimeNs, NandError> {
        let state = self.claim_next_page(ppn)?;
        let die = state.die as usize;
        let xfer_done = self.channel_transfer(die, ready_ns, self.geometry.page_bytes);
        let latency = self.timing.of(state.mode).program_ns;
        let die_ready = xfer_done.max(state.program_end_ns);
        let end = self.occupy_die(die, state.plane_bit, OpKind::Program, die_ready, latency);
        let block = self.block_of(ppn);
        self.blocks[block as usize].program_end_ns = end;
        self.counters.programs[state.mode.index()] += 1;
        if self.faults.program_fail_probability > 0.0
            && self.fault_rng.chance(self.faults.program_fail_probability)
        {
            self.counters.program_failures += 1;
            self.store.clear_page(ppn);
            let block = self.block_of(ppn);
            let page = ppn - block * self.geometry.pages_per_block;
            return Err(NandError::ProgramFailed { block, page });
        }
        Ok(end)
    }

    /// Erases a block. On an injected failure the block becomes bad.
    pub fn erase(&mut self, block: u32, ready_ns: TimeNs) -> Result<TimeNs, NandError> {
        let state = self.blocks[block as usize];
        if state.bad {
            return Err(NandError::BadBlock { block });
        }
        let latency = self.timing.of(state.mode).erase_ns;
        let end = self.occupy_die(
            state.die as usize,
            state.plane_bit,
            OpKind::Erase,
            ready_ns.max(state.program_end_ns),
            latency,
        );
        self.counters.erases[state.mode.index()] += 1;
        let b = &mut self.blocks[block as usize];
        b.erase_count += 1;
        b.next_page = 0;
        b.program_end_ns = end;
        if self.faults.erase_fail_probability > 0.0
            && self.fault_rng.chance(self.faults.erase_fail_probability)
        {
            self.counters.erase_failures += 1;
            self.blocks[block as usize].bad = true;
            return Err(NandError::EraseFailed { block });
        }
        Ok(end)
    }

    /// Programs the next page of a block without timing or counting it: preconditioning
    /// builds the state a long write history leaves behind without simulating the history.
    pub fn program_untimed(&mut self, ppn: u32) -> Result<(), NandError> {
        self.claim_next_page(ppn).map(|_| ())
    }

    /// Checks that `ppn` is its good block's next programmable page and advances the
    /// block's write pointer past it. Returns the block's state from before the program.
    #[inline]
    fn claim_next_page(&mut self, ppn: u32) -> Result<BlockState, NandError> {
        let block = self.block_of(ppn);
        let page = ppn - block * self.geometry.pages_per_block;
        let state = self.blocks[block as usize];
        if state.bad {
            return Err(NandError::BadBlock { block });
        }
        if page != state.next_page as u32 || page >= self.pages_in_mode[state.mode.index()] {
            return Err(NandError::OutOfOrder {
                block,
                page,
                next: state.next_page as u32,
            });
        }
        self.blocks[block as usize].next_page += 1;
        Ok(state)
    }

    /// Restores a block's state from a persisted image of the medium: its write pointer,
    /// erase count and bad flag. Only a controller that brings a medium back from a file
    /// calls it, before any operation; the page contents are restored through the store.
    pub fn restore_block(
        &mut self,
        block: u32,
        next_page: u32,
        erase_count: u32,
        bad: bool,
    ) -> Result<(), NandError> {
        let Some(b) = self.blocks.get(block as usize) else {
            return Err(NandError::RestoreOutOfRange {
                block,
                blocks: self.blocks.len() as u32,
            });
        };
        let pages = self.pages_in_mode[b.mode.index()];
        if next_page > pages {
            return Err(NandError::RestorePastEnd {
                block,
                next_page,
                pages,
            });
        }
        let b = &mut self.blocks[block as usize];
        b.next_page = next_page as _;
        b.erase_count = erase_count;
        b.bad = bad;
        Ok(())
    }

    /// Erases a block without timing (preconditioning only).
    pub fn erase_untimed(&mut self, block: u32) {
        let b = &mut self.blocks[block as usize];
        b.next_page = 0;
        b.erase_count += 1;
    }
}

/// Where an operation lasting `duration_ns`, ready at `ready_ns`, starts on `calendar`.
#[inline]
fn earliest_start(
    calendar: &Calendar,
    scheduling: Scheduling,
    ready_ns: TimeNs,
    duration_ns: u64,
) -> TimeNs {
    match scheduling {
        Scheduling::FillGaps => calendar.earliest_start(ready_ns, duration_ns),
        Scheduling::FirstCome => ready_ns.max(calendar.free_ns()),
    }
}

#[cfg(test)]
mod tests;
