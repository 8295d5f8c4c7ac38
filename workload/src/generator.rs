//! Turns a [`JobSpec`] into a deterministic stream of [`IoRequest`]s.
//!
//! The generator reproduces what fio would send to a block device for one job clone:
//! which direction, which offset and which length each I/O has, and when the job's byte
//! budget runs out. Timing (queue depth, think time, runtime) is the simulator's business
//! and is not modelled here.

use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::fio::{
    BlockSizeSpec, Distribution, JobSpec, RwMode, SizeSpec, StridedZones, Zone, ZoneSpan,
};
use crate::{IoOp, IoRequest, WorkloadError};

/// Index of each direction in [`JobSpec::block_sizes`] and in the generator's state.
const READ: usize = 0;
const WRITE: usize = 1;
const TRIM: usize = 2;

/// How many times a skewed distribution may draw a slot that leaves no room for the I/O
/// before the generator clamps the slot instead. Re-drawing keeps the distribution exact
/// in the common case; the bound keeps `next_io` cheap in pathological ones.
const MAX_REDRAWS: u32 = 8;

/// Fixed-point scale for `bssplit` weights, so that the per-I/O choice uses integers.
const SPLIT_WEIGHT_SCALE: f64 = 1e6;

/// A stream of I/O requests for one clone of one job.
///
/// Region: the job addresses `[offset, offset + size)` clipped to the device, with both
/// ends rounded down to the sector size. Percentage offsets are additionally aligned down
/// to the job's block alignment, as fio does. fio run on a block device also clips a
/// `size` that reaches past the device's end (its random map and its sequential walk stop
/// at the device size), but says nothing; here the cut is kept in
/// [`JobGenerator::size_cut`] so that the driver can tell the user what was measured.
///
/// Offsets: sequential modes walk the region from its start and wrap at its end, with a
/// separate cursor per direction (as fio keeps one last position per direction). Random
/// modes pick a slot of `blockalign` bytes (default: the direction's minimum block size)
/// from the distribution; with `percentage_random` below 100, each I/O is random with that
/// probability and otherwise continues sequentially after the previous I/O of its
/// direction. A request never crosses the region end: sequential ones are shortened, random
/// ones only use slots where the whole request fits. fio's `rw=MODE:N` leaves a hole of N
/// bytes after each sequential request, or in a random mode draws a new random offset only
/// every N requests (the others follow on from it, or repeat it with
/// `rw_sequencer=identical`). The `zoned` distributions give each zone of the region its
/// share of the random requests, uniformly within the zone.
///
/// Skewed distributions (Zipf, Pareto) rank the region's slots by popularity and map ranks
/// to slots through a fixed bijective scrambling, so the hot data is spread over the region
/// instead of piling up at its start; the scrambling does not depend on the seed, so every
/// clone and every run shares the same hot set. The normal distribution is centred on the
/// middle of the region and is not scrambled.
///
/// Strided zones (fio's `zonemode=strided`): the job works in one zone of `zonerange`
/// bytes at a time, starting with the one at the region's start. Before each request, as
/// fio's `setup_strided_zone_mode` does, a zone in which `zonesize` bytes have been
/// transferred (reads, writes and trims together) gives way to the one `zonerange +
/// zoneskip` further on, or to the first one when that would start at or past the device's
/// end (fio wraps at the end of the file, which for a block device is the device's end, not
/// `offset + size`: `size` only sets the default byte budget, and the skipped bytes do not
/// count against it). Entering a zone, and every time the bytes transferred in it reach a
/// multiple of `zonerange`, every direction's sequential position goes back to the zone's
/// start; so does one direction's that has reached the zone's end, so that a `zonesize`
/// larger than `zonerange` walks the zone again. Sequential requests follow on from the
/// last one of their direction as usual (a hole of `rw=MODE:N` after the zone's first,
/// and a request may reach past the zone's end, as fio's do); random ones draw their slot
/// from the zone, with the offset distribution laid over the zone. Where fio would fail a
/// request that reaches past the device's end and end the job's pass, the zone here ends
/// at the device's end: sequential requests are shortened there and random ones stay
/// before it.
///
/// Lengths: `bs` gives a fixed length; `bsrange` draws uniformly among the multiples of the
/// minimum size (or of the sector size when the minimum is not a power of two) between
/// minimum and maximum; `bssplit` draws each size with its percentage as weight.
///
/// End: without `time_based`, the stream ends once the bytes issued reach `io_size` (or
/// the region size when `io_size` is unset) or the number of I/Os reaches `number_ios`.
/// The last I/O is not shortened to fit the budget, so a budget that is not a multiple of
/// the block size is overshot by less than one block, as in fio.
/// With `loops=N` the job then starts again, N times in all, with its budgets afresh but
/// going on from where the last iteration left off: its sequential positions and random
/// stream carry on, as fio 3.33's do on a device (its file positions survive
/// `clear_io_state`, and without a random map its offsets do not repeat), so an iteration
/// that walked the whole region starts the next at the region's start by wrapping, and one
/// that stopped halfway lets the next take the rest. A sequential job's iterations that
/// stop short of the region's end run on into the next as one pass, as fio's do.
/// With `verify`, each pass ends (after its `end_fsync` FLUSH) with fio's verify pass: the
/// pass's writes read back by offset, each byte from its last write, the first read
/// waiting for the pass's requests to complete.
///
/// Flushes: with `fsync=N` (or `fdatasync=N`) a FLUSH goes before the request that follows
/// every Nth write (so none after a pass's last write), and with `end_fsync` each pass ends
/// with one if a write came after the last; a FLUSH
/// takes a place in the job's queue like any other request and does not wait for the
/// writes in flight (the device's FLUSH covers the writes completed before it).
#[derive(Debug, Clone)]
pub struct JobGenerator {
    rng: ChaCha8Rng,
    region_start_bytes: u64,
    region_len_bytes: u64,
    /// The region's length as `size=` asked for it, when the device's end cut it short.
    size_cut_from_bytes: Option<u64>,
    rw: RwMode,
    rwmixread_percent: u32,
    /// Probability (in percent) that an I/O is random; 0 for sequential modes.
    random_percent: u32,
    /// Per-direction state, `None` for directions the job never issues.
    directions: [Option<DirectionState>; 3],
    budget_bytes: u64,
    max_ios: u64,
    /// `trimwrite` / `randtrimwrite`: the range the last trim covered, which the next
    /// request writes.
    pending_write: Option<(u64, u64)>,
    time_based: bool,
    issued_bytes: u64,
    issued_ios: u64,
    /// The second value of the last Box–Muller pair, saved for the next normal draw.
    spare_normal: Option<f64>,
    /// `fsync=` / `fdatasync=`: a FLUSH after every this many writes; 0 never.
    flush_every_writes: u64,
    /// `end_fsync`: a FLUSH once the budget is spent, if a write came after the last one.
    end_flush: bool,
    /// fio's `sync=`: every write asks for force unit access.
    fua_writes: bool,
    /// Writes issued since the last FLUSH.
    writes_since_flush: u64,
    /// The next request is a FLUSH (the period's last write was just issued).
    flush_due: bool,
    /// Iterations still to run after this one (`loops=` − 1).
    loops_left: u32,
    /// fio's `verify`: each iteration ends with a pass that reads back what it wrote.
    verify: bool,
    /// The writes of this iteration, (offset, length) in issue order, for the verify pass.
    written: Vec<(u64, u64)>,
    /// How many of `written` the verify pass has read back.
    verified: usize,
    /// fio's `verify_backlog` (0: none): after this many writes, `backlog_batch` of the
    /// writes not yet read back are; `verified_front` of `written` have been, and
    /// `backlog_due` reads are still to come.
    backlog_every: u64,
    backlog_batch: u64,
    writes_since_backlog: u64,
    backlog_due: u64,
    verified_front: usize,
    /// fio's `rw=MODE:N`: the hole after each sequential request, in bytes (sequential
    /// modes), or how many requests share one random offset (random modes; 1 without it).
    hole_bytes: u64,
    /// A holed sequential job without `io_size` ends its iteration once a direction's next
    /// request would start past the region's end, as fio does on a device (its next offset
    /// falls outside the file's I/O size); with `io_size` (or `time_based`) it wraps to the
    /// region's start instead.
    holes_end_the_pass: bool,
    /// The `end_fsync` FLUSH of the empty iteration fio runs after a pass that ran through
    /// several iterations ([`Self::pass_goes_on`]), issued when the pass ends.
    deferred_end_flushes: u32,
    random_every: u64,
    /// `rw_sequencer=identical`: the requests between random offsets repeat the last one.
    repeat_offset: bool,
    /// Requests issued since the last random offset (random modes with `random_every`).
    since_random: u64,
    /// fio's `bs_is_seq_rand`: the lengths of sequential requests (the read block sizes)
    /// and of random ones (the write block sizes), whatever their direction.
    seq_rand_lengths: Option<Box<[LengthSampler; 2]>>,
    /// fio's strided zones (`zonemode=strided`); `None` for a job without zones.
    zones: Option<StridedZoneState>,
}

/// Where a strided job is in its zones. Offsets are relative to the region's start, as the
/// directions' positions are.
#[derive(Debug, Clone)]
struct StridedZoneState {
    layout: StridedZones,
    /// The device's end, rounded down to a whole sector: a zone that would start at or past
    /// it is replaced by the first one, and a zone that reaches past it ends there.
    device_end_bytes: u64,
    /// Where the current zone starts (fio's moving `file_offset`).
    start_bytes: u64,
    /// Bytes transferred in the current zone (fio's `zone_bytes`).
    transferred_bytes: u64,
}

#[derive(Debug, Clone)]
struct DirectionState {
    lengths: LengthSampler,
    align_bytes: u64,
    /// Number of `align_bytes` slots in the region.
    slot_count: u64,
    offsets: OffsetSampler,
    /// Where the next sequential I/O starts, relative to the region start. In a strided
    /// job, where the last request ended (fio's `last_pos`): the hole of `rw=MODE:N` is
    /// added when the next start is computed, after the zone's bounds have been checked.
    next_sequential_bytes: u64,
    /// Where the last I/O started, relative to the region start.
    last_offset_bytes: u64,
}

#[derive(Debug, Clone)]
enum LengthSampler {
    Fixed(u64),
    /// `first_bytes + granularity_bytes * k` for `k` in `0..value_count`.
    Range {
        first_bytes: u64,
        granularity_bytes: u64,
        value_count: u64,
    },
    /// `(len_bytes, cumulative_weight)` pairs; a draw in `0..total_weight` picks the first
    /// entry whose cumulative weight exceeds it.
    Split {
        entries: Vec<(u64, u64)>,
        total_weight: u64,
    },
}

#[derive(Debug, Clone)]
enum OffsetSampler {
    Uniform,
    Zipf(ZipfSampler),
    /// fio's Pareto: `rank = (n - 1) * u^exponent` with `exponent = ln h / ln(1 - h)`.
    Pareto {
        exponent: f64,
    },
    Normal {
        centre_slot: f64,
        sigma_slots: f64,
    },
    /// fio's zoned distributions: (cumulative access percent, first slot, slot count) per
    /// zone.
    Zoned(Vec<(u32, u64, u64)>),
}

impl JobGenerator {
    /// Builds the generator for one clone of `spec`.
    ///
    /// `device_bytes` is the capacity of the target volume, `sector_bytes` the smallest
    /// addressable unit (offsets and lengths are multiples of it; block sizes that are not
    /// are an error), `seed` selects all randomness (`spec.randseed`, when set, overrides
    /// it), and `clone_index` tells the clones of a `numjobs` job apart: each clone draws
    /// from its own ChaCha stream.
    ///
    /// Errors ([`WorkloadError::InvalidJob`]): zero sector size; an offset at or beyond the
    /// device end or not sector-aligned; an empty region or one smaller than a block or an
    /// alignment unit; a block size or alignment of the directions the job uses that is
    /// zero or not a multiple of the sector size; an empty `bssplit`; out-of-range
    /// percentages or distribution parameters (possible when the spec was built in code);
    /// an `io_size` of zero; zone options fio refuses together ([`JobSpec::strided_zones`]);
    /// a `zonerange` or `zoneskip` that is not a whole number of sectors, or a `zonerange`
    /// longer than the region or shorter than a block or an alignment unit.
    pub fn new(
        spec: &JobSpec,
        device_bytes: u64,
        sector_bytes: u64,
        seed: u64,
        clone_index: u32,
    ) -> Result<Self, WorkloadError> {
        let invalid = |reason: String| WorkloadError::InvalidJob {
            job: spec.name.clone(),
            reason,
        };
        if sector_bytes == 0 {
            return Err(invalid("sector size must be greater than zero".to_string()));
        }
        if spec.rwmixread_percent > 100 {
            return Err(invalid(format!(
                "rwmixread {} is more than 100 percent",
                spec.rwmixread_percent
            )));
        }
        if spec.percentage_random > 100 {
            return Err(invalid(format!(
                "percentage_random {} is more than 100 percent",
                spec.percentage_random
            )));
        }
        if spec.io_size_bytes == Some(0) {
            return Err(invalid("io_size must be greater than zero".to_string()));
        }
        if let (Some(hole), false) = (spec.offset_modifier, spec.rw.is_random()) {
            if hole % sector_bytes != 0 {
                return Err(invalid(format!(
                    "the {hole}-byte hole of rw={}:{hole} is not a whole number of \
                     {sector_bytes}-byte sectors",
                    spec.rw.fio_name()
                )));
            }
        }
        if spec.verify && spec.time_based && spec.verify_backlog.is_none() {
            return Err(invalid(
                "verify with time_based is not modelled without verify_backlog: give the job \
                 an io_size or number_ios, and its verify pass reads back what it wrote, or \
                 verify_backlog, which reads back the writes as the job goes"
                    .to_string(),
            ));
        }
        validate_distribution(&spec.distribution).map_err(&invalid)?;

        let used = used_directions(spec.rw);
        let mut lengths: [Option<(LengthSampler, u64)>; 3] = [None, None, None];
        for direction in [READ, WRITE, TRIM] {
            if used[direction] {
                let block_sizes = &spec.block_sizes[direction];
                let sampler = LengthSampler::new(block_sizes, sector_bytes).map_err(|reason| {
                    invalid(format!("{} {reason}", DIRECTION_NAMES[direction]))
                })?;
                let align_bytes = spec.block_align_bytes.unwrap_or(block_sizes.min_bytes());
                if align_bytes == 0 || align_bytes % sector_bytes != 0 {
                    return Err(invalid(format!(
                        "block alignment {align_bytes} is not a positive multiple of the \
                         {sector_bytes}-byte sector"
                    )));
                }
                lengths[direction] = Some((sampler, align_bytes));
            }
        }
        // fio (`get_start_offset`): clone `i` starts at `offset + i × offset_increment`, and
        // when either is a percentage of the device the start is rounded up to
        // `offset_align`, or to the smallest block size of any direction.
        let base_bytes = match spec.offset {
            SizeSpec::Bytes(bytes) => bytes,
            SizeSpec::Percent(percent) => percent_of(device_bytes, percent).map_err(&invalid)?,
        };
        let increment_bytes = match spec.offset_increment {
            SizeSpec::Bytes(bytes) => bytes,
            SizeSpec::Percent(percent) => percent_of(device_bytes, percent).map_err(&invalid)?,
        };
        let raw_start_bytes = increment_bytes
            .checked_mul(clone_index as u64)
            .and_then(|step| step.checked_add(base_bytes))
            .ok_or_else(|| {
                invalid(format!(
                    "clone {clone_index} would start at offset {base_bytes} + {clone_index} × \
                     offset_increment {increment_bytes}, past any device"
                ))
            })?;
        let from_percent = matches!(spec.offset, SizeSpec::Percent(_))
            || matches!(spec.offset_increment, SizeSpec::Percent(_));
        let region_start_bytes = if from_percent {
            let align_bytes = spec.offset_align_bytes.unwrap_or_else(|| {
                spec.block_sizes
                    .iter()
                    .map(BlockSizeSpec::min_bytes)
                    .min()
                    .unwrap_or(sector_bytes)
            });
            // A start rounded past any device is refused below like any other.
            raw_start_bytes
                .div_ceil(align_bytes.max(1))
                .saturating_mul(align_bytes.max(1))
        } else {
            raw_start_bytes
        };
        if region_start_bytes % sector_bytes != 0 {
            return Err(invalid(format!(
                "the region starts at byte {region_start_bytes} (offset {base_bytes} + clone \
                 {clone_index} × offset_increment {increment_bytes}), which is not a multiple \
                 of the {sector_bytes}-byte sector"
            )));
        }
        if region_start_bytes >= device_bytes {
            return Err(invalid(format!(
                "offset {region_start_bytes} is at or beyond the end of the {device_bytes}-byte \
                 device"
            )));
        }
        let available_bytes = device_bytes - region_start_bytes;
        let wanted_bytes = match spec.size {
            // fio's `fill_device` writes until the device has no space left.
            _ if spec.fill_device => available_bytes,
            None => available_bytes,
            Some(SizeSpec::Bytes(bytes)) => bytes,
            Some(SizeSpec::Percent(percent)) => {
                percent_of(device_bytes, percent).map_err(&invalid)?
            }
        };
        // A size past the device's end is cut there, as fio does on a block device; the cut
        // is recorded so that it is reported, not silent.
        let size_cut_from_bytes = (wanted_bytes > available_bytes).then_some(wanted_bytes);
        let region_len_bytes = {
            let clipped = wanted_bytes.min(available_bytes);
            clipped - clipped % sector_bytes
        };
        if region_len_bytes == 0 {
            return Err(invalid(format!(
                "the job's region is empty (offset {region_start_bytes}, device {device_bytes} \
                 bytes)"
            )));
        }

        let zones = match spec.strided_zones().map_err(&invalid)? {
            None => None,
            Some(layout) => {
                for (name, bytes) in [
                    ("zonerange", layout.range_bytes),
                    ("zoneskip", layout.skip_bytes),
                ] {
                    if bytes % sector_bytes != 0 {
                        return Err(invalid(format!(
                            "{name}={bytes} is not a whole number of {sector_bytes}-byte \
                             sectors, so the zones would not start on sectors"
                        )));
                    }
                }
                // fio fails every request that starts `size` bytes or more into its zone,
                // which ends the job's pass; a zone that fits the region never does that.
                if layout.range_bytes > region_len_bytes {
                    return Err(invalid(format!(
                        "zonerange={} is larger than the job's {region_len_bytes}-byte region \
                         (size, or the device from the offset on): fio fails the requests \
                         that start that far into a zone, so make zonerange at most the \
                         region",
                        layout.range_bytes
                    )));
                }
                Some(StridedZoneState {
                    layout,
                    device_end_bytes: available_bytes - available_bytes % sector_bytes,
                    start_bytes: 0,
                    transferred_bytes: 0,
                })
            }
        };
        // Random offsets are drawn from the region, or in a strided job from the current
        // zone, whose slots the offset distribution is laid over.
        let (space_bytes, space_name) = match &zones {
            None => (region_len_bytes, "region"),
            Some(zones) => (zones.layout.range_bytes, "zone (zonerange)"),
        };

        let mut directions: [Option<DirectionState>; 3] = [None, None, None];
        for (direction, entry) in lengths.into_iter().enumerate() {
            let Some((sampler, align_bytes)) = entry else {
                continue;
            };
            let min_len_bytes = spec.block_sizes[direction].min_bytes();
            if space_bytes < min_len_bytes || space_bytes < align_bytes {
                return Err(invalid(format!(
                    "the {space_bytes}-byte {space_name} is smaller than the {} block size \
                     {min_len_bytes} or alignment {align_bytes}",
                    DIRECTION_NAMES[direction]
                )));
            }
            let slot_count = space_bytes / align_bytes;
            directions[direction] = Some(DirectionState {
                lengths: sampler,
                align_bytes,
                slot_count,
                offsets: OffsetSampler::new(
                    &spec.distribution,
                    slot_count,
                    align_bytes,
                    space_bytes,
                )
                .map_err(|reason| match &zones {
                    None => invalid(reason),
                    Some(_) => invalid(format!(
                        "{reason}: with zonemode=strided, random_distribution is laid over \
                         each zone"
                    )),
                })?,
                next_sequential_bytes: 0,
                last_offset_bytes: 0,
            });
        }

        let seq_rand_lengths = if spec.bs_is_seq_rand {
            let sampler = |direction: usize| {
                LengthSampler::new(&spec.block_sizes[direction], sector_bytes).map_err(|reason| {
                    invalid(format!(
                        "{} {reason} (bs_is_seq_rand takes it for {} requests)",
                        DIRECTION_NAMES[direction],
                        if direction == READ {
                            "sequential"
                        } else {
                            "random"
                        }
                    ))
                })
            };
            Some(Box::new([sampler(READ)?, sampler(WRITE)?]))
        } else {
            None
        };

        let mut rng = ChaCha8Rng::seed_from_u64(spec.randseed.unwrap_or(seed));
        rng.set_stream(u64::from(clone_index));

        Ok(JobGenerator {
            hole_bytes: if spec.rw.is_random() {
                0
            } else {
                spec.offset_modifier.unwrap_or(0)
            },
            deferred_end_flushes: 0,
            holes_end_the_pass: !spec.rw.is_random()
                && spec.offset_modifier.unwrap_or(0) > 0
                && spec.io_size_bytes.is_none()
                && !spec.time_based
                && !spec.fill_device,
            random_every: if spec.rw.is_random() {
                spec.offset_modifier.unwrap_or(1)
            } else {
                1
            },
            repeat_offset: spec.rw_sequencer_identical,
            since_random: 0,
            seq_rand_lengths,
            verify: spec.verify,
            written: Vec::new(),
            verified: 0,
            backlog_every: if spec.verify {
                spec.verify_backlog.unwrap_or(0)
            } else {
                0
            },
            backlog_batch: spec
                .verify_backlog_batch
                .or(spec.verify_backlog)
                .unwrap_or(0),
            writes_since_backlog: 0,
            backlog_due: 0,
            verified_front: 0,
            loops_left: spec.loops.saturating_sub(1),
            rng,
            region_start_bytes,
            region_len_bytes,
            size_cut_from_bytes,
            rw: spec.rw,
            rwmixread_percent: spec.rwmixread_percent,
            random_percent: if spec.rw.is_random() {
                spec.percentage_random
            } else {
                0
            },
            directions,
            // fio lets a trim-then-write job issue twice its bytes and requests, since each
            // range is trimmed and then written.
            budget_bytes: if spec.fill_device {
                region_len_bytes
            } else {
                spec.io_size_bytes.unwrap_or(region_len_bytes)
            }
            .saturating_mul(if spec.rw.is_trim_write() { 2 } else { 1 }),
            max_ios: spec
                .number_ios
                .unwrap_or(u64::MAX)
                .saturating_mul(if spec.rw.is_trim_write() { 2 } else { 1 }),
            pending_write: None,
            zones,
            time_based: spec.time_based,
            issued_bytes: 0,
            issued_ios: 0,
            spare_normal: None,
            flush_every_writes: spec.flush_every_writes.unwrap_or(0),
            end_flush: spec.end_flush,
            fua_writes: spec.fua_writes,
            writes_since_flush: 0,
            flush_due: false,
        })
    }

    /// The next request, or `None` once the job's byte budget (`io_size`, else the region
    /// size) is spent or `number_ios` requests have been issued. With `time_based` set the
    /// stream never ends; the caller stops it when the runtime is over.
    pub fn next_io(&mut self) -> Option<IoRequest> {
        self.next_io_choosing(|op| op)
    }

    /// [`Self::next_io`], with the drawn direction handed to `choose`, which may swap it
    /// for another direction the job's mode issues (fio does so when the drawn direction is
    /// ahead of its `rate` and the other one is not). The draws are the same either way;
    /// only the request's direction, and the offset and length drawn for it, change.
    pub fn next_io_choosing(&mut self, choose: impl FnOnce(IoOp) -> IoOp) -> Option<IoRequest> {
        // fio decides on a FLUSH when it fetches the next request, so the one due after the
        // iteration's last write is never issued (`end_fsync` issues its own).
        if self.flush_due {
            if !self.iteration_spent() {
                return Some(self.flush());
            }
            self.flush_due = false;
        }
        if self.backlog_due > 0 {
            if let Some(read) = self.next_backlog_read() {
                return Some(read);
            }
        }
        // A trim of `trimwrite` is followed by the write of its range, whatever the budget
        // says, so that no range is left trimmed and unwritten. fio's `randtrimwrite` writes
        // exactly that range; its `trimwrite` walks the writes in order with the write block
        // size, which is the same range when trims and writes share a block size, fio's
        // default.
        if let Some((offset_bytes, len_bytes)) = self.pending_write.take() {
            return Some(self.issue(IoOp::Write, offset_bytes, len_bytes));
        }
        if self.iteration_spent() && self.pass_goes_on() {
            // fio's pass covers `loops` budgets at once until it reaches the region's end:
            // the next iteration follows without the FLUSH or the verify pass between. fio
            // then runs one more iteration with nothing left to issue, which it closes with
            // its `end_fsync` FLUSH after the pass's verify, and stops (measured: two
            // FLUSHes with `loops=2` and with `loops=3`).
            if self.end_flush {
                self.deferred_end_flushes = 1;
            }
            self.start_next_loop();
        }
        if self.iteration_spent() {
            if self.end_flush && self.writes_since_flush > 0 {
                return Some(self.flush());
            }
            if let Some(read) = self.next_verify_read() {
                return Some(read);
            }
            if self.deferred_end_flushes > 0 {
                self.deferred_end_flushes -= 1;
                return Some(self.flush());
            }
            if self.loops_left == 0 {
                return None;
            }
            self.start_next_loop();
        }
        let drawn = match self.rw {
            RwMode::Read | RwMode::RandRead => READ,
            RwMode::Write | RwMode::RandWrite => WRITE,
            RwMode::Trim | RwMode::RandTrim | RwMode::TrimWrite | RwMode::RandTrimWrite => TRIM,
            RwMode::ReadWrite | RwMode::RandRw => {
                if self.rng.gen_range(0..100) < self.rwmixread_percent {
                    READ
                } else {
                    WRITE
                }
            }
        };
        let wanted = choose(DIRECTION_OPS[drawn]);
        let chosen = DIRECTION_OPS
            .iter()
            .position(|&op| op == wanted)
            .filter(|&d| self.directions[d].is_some());
        let direction = chosen.unwrap_or(drawn);
        // With `rw=randMODE:N` only every Nth request draws a new random offset (the first
        // one included); the others follow on from it, or repeat it.
        let modified = self.random_every > 1 && self.random_percent > 0;
        let random = if modified {
            let due = self.since_random % self.random_every == 0;
            self.since_random += 1;
            due
        } else {
            match self.random_percent {
                0 => false,
                100 => true,
                percent => self.rng.gen_range(0..100) < percent,
            }
        };
        if let Some(zones) = self.zones.as_mut() {
            zones.enter(direction, &mut self.directions);
        }
        // The constructor fills the state of every direction the mode can pick, so this
        // only returns early if that invariant were broken.
        let state = self.directions[direction].as_mut()?;
        let rng = &mut self.rng;
        let region_len_bytes = self.region_len_bytes;

        let lengths = match self.seq_rand_lengths.as_deref_mut() {
            Some([sequential, random_lengths]) => {
                if random {
                    random_lengths
                } else {
                    sequential
                }
            }
            None => &mut state.lengths,
        };
        let mut len_bytes = lengths.sample(rng).min(region_len_bytes);
        let relative_offset_bytes = if let Some(zones) = &self.zones {
            if random {
                // The zone may end early at the device's end; the slot limit keeps the
                // request inside what is left of it.
                let zone_len_bytes = zones.end_bytes() - zones.start_bytes;
                len_bytes = len_bytes.min(zone_len_bytes);
                let last_slot = (zone_len_bytes - len_bytes) / state.align_bytes;
                let slot = state.pick_slot(rng, last_slot, &mut self.spare_normal);
                zones.start_bytes + slot * state.align_bytes
            } else {
                let start_bytes = if modified && self.repeat_offset {
                    state.last_offset_bytes
                } else {
                    zones.sequential_start(state.next_sequential_bytes, self.hole_bytes)
                };
                len_bytes = len_bytes.min(zones.device_end_bytes - start_bytes);
                start_bytes
            }
        } else if random {
            // A length clipped to the region is a multiple of the sector size but maybe not
            // of the alignment; the slot limit below still keeps the request inside.
            let last_slot = (region_len_bytes - len_bytes) / state.align_bytes;
            let slot = state.pick_slot(rng, last_slot, &mut self.spare_normal);
            slot * state.align_bytes
        } else if modified && self.repeat_offset {
            // `rw_sequencer=identical`: the last random offset again.
            let start_bytes = state.last_offset_bytes;
            len_bytes = len_bytes.min(region_len_bytes - start_bytes);
            start_bytes
        } else {
            let mut start_bytes = state.next_sequential_bytes;
            if start_bytes >= region_len_bytes {
                start_bytes = 0;
            }
            // fio checks only that a sequential request starts inside the region, so on a
            // device its last one may reach past the region's end; here the region is a
            // bound every request keeps, and the last one is shortened.
            len_bytes = len_bytes.min(region_len_bytes - start_bytes);
            start_bytes
        };
        state.last_offset_bytes = relative_offset_bytes;
        let end_bytes = relative_offset_bytes + len_bytes;
        if let Some(zones) = self.zones.as_mut() {
            state.next_sequential_bytes = end_bytes;
            zones.transferred_bytes = zones.transferred_bytes.saturating_add(len_bytes);
        } else {
            // A hole after a sequential request (`rw=MODE:N`) may reach past the region's
            // end, where the next request wraps to its start.
            state.next_sequential_bytes = end_bytes.saturating_add(self.hole_bytes);
        }

        let offset_bytes = self.region_start_bytes + relative_offset_bytes;
        if self.rw.is_trim_write() {
            self.pending_write = Some((offset_bytes, len_bytes));
        }
        Some(self.issue(DIRECTION_OPS[direction], offset_bytes, len_bytes))
    }

    /// Whether the iteration has issued all it may: its bytes, its requests, or a holed
    /// pass that ran past the region's end. A `time_based` job never is.
    fn iteration_spent(&self) -> bool {
        !self.time_based
            && (self.issued_bytes >= self.budget_bytes
                || self.issued_ios >= self.max_ios
                || self.holes_past_the_end())
    }

    /// Whether a spent iteration of a sequential job runs straight into the next, as fio's
    /// do: fio issues `loops` times the budget in one pass (its `io_issue_bytes_exceeded`
    /// multiplies the limit by the loops) and only a pass that reaches the region's end
    /// stops for its `end_fsync` FLUSH and verify pass before the next. Checked against
    /// fio's iolog: `io_size=16k` of 64 KiB three times with `verify` writes 48 KiB and then
    /// reads it back. Random jobs keep a pass per iteration, as fio's do when their random
    /// map has covered the region.
    fn pass_goes_on(&self) -> bool {
        self.loops_left > 0
            && self.random_percent == 0
            && self.zones.is_none()
            && !self.holes_past_the_end()
            && self
                .directions
                .iter()
                .flatten()
                .all(|d| d.next_sequential_bytes < self.region_len_bytes)
    }

    /// Whether a holed sequential pass is over: some direction's next request would start
    /// at or past the region's end ([`Self::holes_end_the_pass`]).
    fn holes_past_the_end(&self) -> bool {
        self.holes_end_the_pass
            && self.zones.is_none()
            && self
                .directions
                .iter()
                .flatten()
                .any(|d| d.next_sequential_bytes >= self.region_len_bytes)
    }

    /// Counts a request of the job's own pattern against its budgets, and a write towards
    /// its FLUSHes and verification, and returns it.
    fn issue(&mut self, op: IoOp, offset_bytes: u64, len_bytes: u64) -> IoRequest {
        self.issued_bytes = self.issued_bytes.saturating_add(len_bytes);
        self.issued_ios += 1;
        if op == IoOp::Write {
            self.writes_since_flush += 1;
            self.flush_due = self.flush_every_writes > 0
                && self.writes_since_flush % self.flush_every_writes == 0;
            if self.verify {
                self.written.push((offset_bytes, len_bytes));
                if self.backlog_every > 0 {
                    self.writes_since_backlog += 1;
                    if self.writes_since_backlog >= self.backlog_every {
                        self.writes_since_backlog = 0;
                        self.backlog_due += self.backlog_batch;
                    }
                }
            }
        }
        IoRequest {
            op,
            offset_bytes,
            len_bytes,
            fua: op == IoOp::Write && self.fua_writes,
            drain_first: false,
            after_overlapping: false,
        }
    }

    /// The next read of fio's verify pass, which reads back the iteration's writes in
    /// [`verify_order`], once they have all completed; `None` when the pass is over (or
    /// there is none).
    fn next_verify_read(&mut self) -> Option<IoRequest> {
        // What `verify_backlog` read back already is not read again.
        if self.verified == 0 && self.verified_front > 0 {
            let front = self.verified_front.min(self.written.len());
            self.written.drain(..front);
            self.verified_front = 0;
            self.backlog_due = 0;
        }
        if self.verified == 0 && !self.written.is_empty() {
            self.written = verify_order(&self.written);
        }
        let Some(&(offset_bytes, len_bytes)) = self.written.get(self.verified) else {
            self.written.clear();
            self.verified = 0;
            return None;
        };
        self.verified += 1;
        Some(IoRequest {
            op: IoOp::Read,
            offset_bytes,
            len_bytes,
            fua: false,
            drain_first: self.verified == 1,
            after_overlapping: false,
        })
    }

    /// The next read of fio's `verify_backlog`: the oldest write not yet read back, once no
    /// request in flight overlaps it; `None` (and no more due) when every write has been.
    fn next_backlog_read(&mut self) -> Option<IoRequest> {
        let Some(&(offset_bytes, len_bytes)) = self.written.get(self.verified_front) else {
            self.backlog_due = 0;
            return None;
        };
        self.verified_front += 1;
        self.backlog_due -= 1;
        // A long (time-based) job forgets the writes it has read back.
        if self.verified_front >= 4096 && self.verified_front * 2 >= self.written.len() {
            self.written.drain(..self.verified_front);
            self.verified_front = 0;
        }
        Some(IoRequest {
            op: IoOp::Read,
            offset_bytes,
            len_bytes,
            fua: false,
            drain_first: false,
            after_overlapping: true,
        })
    }

    /// Starts the job's next `loops` iteration as fio does: the budgets again from zero, the
    /// sequential positions and the random stream going on where the last iteration left
    /// them (fio's `clear_io_state` keeps its files' positions; measured with fio 3.33 on a
    /// file: `io_size=32k` of a 64 KiB region twice writes the region once, and random
    /// offsets without a random map never repeat), and strided zones from the first.
    fn start_next_loop(&mut self) {
        self.loops_left -= 1;
        self.issued_bytes = 0;
        self.issued_ios = 0;
        self.writes_since_backlog = 0;
        self.backlog_due = 0;
        self.verified_front = 0;
        // A holed pass that ran past the region's end starts the next at its start.
        if self.holes_past_the_end() {
            for state in self.directions.iter_mut().flatten() {
                if state.next_sequential_bytes >= self.region_len_bytes {
                    state.next_sequential_bytes = 0;
                }
            }
        }
        // fio's new iteration (`clear_io_state`) puts the file's offset back at the job's
        // start and its zone byte count at zero: the first zone again.
        if let Some(zones) = self.zones.as_mut() {
            zones.start_bytes = 0;
            zones.transferred_bytes = 0;
        }
    }

    /// A FLUSH of the device's volatile cache (fio's `fsync`: like fio, it does not count
    /// against the job's byte or I/O budget).
    fn flush(&mut self) -> IoRequest {
        self.flush_due = false;
        self.writes_since_flush = 0;
        IoRequest {
            op: IoOp::Flush,
            offset_bytes: 0,
            len_bytes: 0,
            fua: false,
            drain_first: false,
            after_overlapping: false,
        }
    }

    /// The region the job addresses, as `(start_bytes, len_bytes)`.
    pub fn region(&self) -> (u64, u64) {
        (self.region_start_bytes, self.region_len_bytes)
    }

    /// The region length `size=` asked for, in bytes, when it reached past the device's end
    /// and the region was cut there ([`Self::region`] holds what is left); `None` when the
    /// whole size fits. A percentage size counts too: `offset=50%` with `size=60%` is cut.
    pub fn size_cut(&self) -> Option<u64> {
        self.size_cut_from_bytes
    }

    /// The longest read or write the job can issue, in bytes (0 for a job of trims only).
    /// Trims are left out: a device's transfer limit bounds the data a command carries.
    pub fn longest_data_request_bytes(&self) -> u64 {
        [READ, WRITE]
            .iter()
            .filter_map(|&d| self.directions[d].as_ref())
            .map(|d| d.lengths.longest_bytes())
            .max()
            .unwrap_or(0)
    }

    /// Bytes issued so far.
    pub fn issued_bytes(&self) -> u64 {
        self.issued_bytes
    }

    /// Requests issued so far.
    pub fn issued_ios(&self) -> u64 {
        self.issued_ios
    }
}

const DIRECTION_NAMES: [&str; 3] = ["read", "write", "trim"];
const DIRECTION_OPS: [IoOp; 3] = [IoOp::Read, IoOp::Write, IoOp::Trim];

/// Which of read, write and trim a mode can issue.
fn used_directions(rw: RwMode) -> [bool; 3] {
    match rw {
        RwMode::Read | RwMode::RandRead => [true, false, false],
        RwMode::Write | RwMode::RandWrite => [false, true, false],
        // The writes of `trimwrite` cover the ranges of its trims.
        RwMode::Trim | RwMode::RandTrim | RwMode::TrimWrite | RwMode::RandTrimWrite => {
            [false, false, true]
        }
        RwMode::ReadWrite | RwMode::RandRw => [true, true, false],
    }
}

/// `percent` of `total_bytes`, rounded down; refuses percentages outside [0, 100].
fn percent_of(total_bytes: u64, percent: f64) -> Result<u64, String> {
    if !(0.0..=100.0).contains(&percent) {
        return Err(format!("percentage {percent} is not in [0, 100]"));
    }
    // Float-to-integer casts saturate, and the range check keeps the product within the
    // device, so this cannot overflow.
    let bytes = (total_bytes as f64 * percent / 100.0).floor() as u64;
    Ok(bytes.min(total_bytes))
}

fn validate_distribution(distribution: &Distribution) -> Result<(), String> {
    match *distribution {
        Distribution::Uniform => Ok(()),
        Distribution::Zipf { theta } if theta.is_finite() && theta > 0.0 => Ok(()),
        Distribution::Zipf { theta } => Err(format!("zipf exponent {theta} is not positive")),
        Distribution::Pareto { h } if h > 0.0 && h < 1.0 => Ok(()),
        Distribution::Pareto { h } => Err(format!("pareto shape {h} is not in (0, 1)")),
        Distribution::Normal { sigma_percent }
            if sigma_percent.is_finite() && sigma_percent >= 0.0 =>
        {
            Ok(())
        }
        Distribution::Normal { sigma_percent } => Err(format!(
            "normal deviation {sigma_percent} percent is not a non-negative number"
        )),
        Distribution::Zoned { ref zones } => crate::fio::validate_zones(zones),
    }
}

/// A uniform draw in `[0, 1)` with 53 bits of precision.
pub(crate) fn uniform_unit(rng: &mut ChaCha8Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

impl StridedZoneState {
    /// Where the current zone ends: `zonerange` after its start, or at the device's end if
    /// that comes first.
    fn end_bytes(&self) -> u64 {
        self.start_bytes
            .saturating_add(self.layout.range_bytes)
            .min(self.device_end_bytes)
    }

    /// fio's `setup_strided_zone_mode`, before each request of `direction`: moves on to
    /// the next zone once `zonesize` bytes have been transferred in this one, and puts the
    /// sequential positions back at the zone's start where fio does.
    fn enter(&mut self, direction: usize, directions: &mut [Option<DirectionState>; 3]) {
        if self.transferred_bytes >= self.layout.size_bytes {
            self.transferred_bytes = 0;
            let next_bytes = self
                .start_bytes
                .saturating_add(self.layout.range_bytes)
                .saturating_add(self.layout.skip_bytes);
            // fio wraps to the job's start once a zone would start at or past the end of
            // the file, which for a block device is its end.
            self.start_bytes = if next_bytes >= self.device_end_bytes {
                0
            } else {
                next_bytes
            };
        }
        // A direction that has reached the zone's end starts it again, so that a `zonesize`
        // larger than `zonerange` walks the zone more than once.
        if let Some(state) = directions[direction].as_mut() {
            if state.next_sequential_bytes >= self.end_bytes() {
                state.next_sequential_bytes = self.start_bytes;
            }
        }
        // fio resets the file (`fio_file_reset`) whenever the zone's byte count is a
        // multiple of `zonerange`, entering a zone included: every direction's position
        // and last start go back to the zone's start.
        if self.transferred_bytes % self.layout.range_bytes == 0 {
            for state in directions.iter_mut().flatten() {
                state.next_sequential_bytes = self.start_bytes;
                state.last_offset_bytes = self.start_bytes;
            }
        }
    }

    /// Where a sequential request starts after one that ended at `last_end_bytes`, as fio's
    /// `get_next_seq_offset` computes it in a zone: right after it, plus the hole of
    /// `rw=MODE:N` unless the last request ended at the zone's start (fio adds the hole
    /// only to a position past it). A start at or past the device's end, where fio would
    /// fail the request, is the zone's start instead.
    fn sequential_start(&self, last_end_bytes: u64, hole_bytes: u64) -> u64 {
        // `enter` leaves no position before the zone; should one be, it counts as the
        // zone's start rather than as a request outside the zone.
        let mut start_bytes = last_end_bytes.max(self.start_bytes);
        if start_bytes > self.start_bytes {
            start_bytes = start_bytes.saturating_add(hole_bytes);
        }
        if start_bytes >= self.device_end_bytes {
            self.start_bytes
        } else {
            start_bytes
        }
    }
}

impl LengthSampler {
    fn new(spec: &BlockSizeSpec, sector_bytes: u64) -> Result<Self, String> {
        let check = |bytes: u64| {
            if bytes == 0 || bytes % sector_bytes != 0 {
                Err(format!(
                    "block size {bytes} is not a positive multiple of the {sector_bytes}-byte \
                     sector"
                ))
            } else {
                Ok(bytes)
            }
        };
        match spec {
            BlockSizeSpec::Fixed(bytes) => Ok(LengthSampler::Fixed(check(*bytes)?)),
            BlockSizeSpec::Range { min, max } => {
                let first_bytes = check(*min)?;
                if max < min {
                    return Err(format!("block size range {min}-{max} is empty"));
                }
                // fio rounds range draws to the minimum size when it is a power of two;
                // otherwise the sector size is the only constraint.
                let granularity_bytes = if first_bytes.is_power_of_two() {
                    first_bytes
                } else {
                    sector_bytes
                };
                let value_count = (max - first_bytes) / granularity_bytes + 1;
                Ok(LengthSampler::Range {
                    first_bytes,
                    granularity_bytes,
                    value_count,
                })
            }
            BlockSizeSpec::Split(split) => {
                let mut entries = Vec::with_capacity(split.len());
                let mut total_weight: u64 = 0;
                for &(bytes, percent) in split {
                    if !percent.is_finite() || percent < 0.0 {
                        return Err(format!("bssplit percentage {percent} is not valid"));
                    }
                    // Percentages are at most a few hundred, so the scaled weight fits.
                    let weight = (percent * SPLIT_WEIGHT_SCALE).round() as u64;
                    if weight == 0 {
                        continue;
                    }
                    check(bytes)?;
                    total_weight = total_weight.saturating_add(weight);
                    entries.push((bytes, total_weight));
                }
                if entries.is_empty() {
                    return Err("bssplit has no entry with a positive percentage".to_string());
                }
                Ok(LengthSampler::Split {
                    entries,
                    total_weight,
                })
            }
        }
    }

    /// The longest length a draw can give, in bytes.
    fn longest_bytes(&self) -> u64 {
        match self {
            LengthSampler::Fixed(bytes) => *bytes,
            LengthSampler::Range {
                first_bytes,
                granularity_bytes,
                value_count,
            } => first_bytes + granularity_bytes * value_count.saturating_sub(1),
            // An entry whose cumulative weight did not grow has no weight: it is never drawn.
            LengthSampler::Split { entries, .. } => entries
                .iter()
                .scan(0u64, |before, &(bytes, cumulative_weight)| {
                    let drawn = cumulative_weight > *before;
                    *before = cumulative_weight;
                    Some(if drawn { bytes } else { 0 })
                })
                .max()
                .unwrap_or(0),
        }
    }

    fn sample(&self, rng: &mut ChaCha8Rng) -> u64 {
        match self {
            LengthSampler::Fixed(bytes) => *bytes,
            LengthSampler::Range {
                first_bytes,
                granularity_bytes,
                value_count,
            } => first_bytes + granularity_bytes * rng.gen_range(0..*value_count),
            LengthSampler::Split {
                entries,
                total_weight,
            } => {
                let draw = rng.gen_range(0..*total_weight);
                entries
                    .iter()
                    .find(|(_, cumulative_weight)| draw < *cumulative_weight)
                    .or(entries.last())
                    .map_or(0, |(bytes, _)| *bytes)
            }
        }
    }
}

impl OffsetSampler {
    /// The sampler of `distribution` over `slot_count` slots of `align_bytes` in a region of
    /// `region_bytes`. Errors: a `zoned_abs` zone list that reaches past the region's end.
    fn new(
        distribution: &Distribution,
        slot_count: u64,
        align_bytes: u64,
        region_bytes: u64,
    ) -> Result<Self, String> {
        Ok(match *distribution {
            Distribution::Uniform => OffsetSampler::Uniform,
            Distribution::Zipf { theta } => {
                OffsetSampler::Zipf(ZipfSampler::new(slot_count, theta))
            }
            Distribution::Pareto { h } => OffsetSampler::Pareto {
                exponent: h.ln() / (1.0 - h).ln(),
            },
            Distribution::Normal { sigma_percent } => OffsetSampler::Normal {
                centre_slot: (slot_count - 1) as f64 / 2.0,
                sigma_slots: sigma_percent / 100.0 * slot_count as f64,
            },
            Distribution::Zoned { ref zones } => {
                OffsetSampler::Zoned(zone_slots(zones, slot_count, align_bytes, region_bytes)?)
            }
        })
    }
}

/// Each zone as (cumulative access percent, first slot, slot count), from the region's
/// start (shares of the region count its whole length, as fio's count the file's). A zone
/// smaller than one slot still has its one slot, so that its share of the accesses goes
/// somewhere near where it asked.
fn zone_slots(
    zones: &[Zone],
    slot_count: u64,
    align_bytes: u64,
    region_bytes: u64,
) -> Result<Vec<(u32, u64, u64)>, String> {
    let mut start_bytes = 0u64;
    let mut cumulative = 0;
    let mut slots = Vec::with_capacity(zones.len());
    for zone in zones {
        let len_bytes = match zone.span {
            // The percentages add up to at most 100, so the sum stays within the region.
            ZoneSpan::Percent(p) => percent_of(region_bytes, f64::from(p))?,
            ZoneSpan::Bytes(b) => b,
        };
        let end_bytes = start_bytes.saturating_add(len_bytes);
        if end_bytes > region_bytes {
            return Err(format!(
                "the zones reach {end_bytes} bytes into the {region_bytes}-byte region"
            ));
        }
        let first = (start_bytes / align_bytes).min(slot_count - 1);
        let count = (end_bytes / align_bytes).saturating_sub(first).max(1);
        cumulative += zone.access_percent;
        slots.push((cumulative, first, count.min(slot_count - first)));
        start_bytes = end_bytes;
    }
    Ok(slots)
}

impl DirectionState {
    /// Picks a slot in `0..=last_slot` (where `last_slot < slot_count`) from the offset
    /// distribution.
    fn pick_slot(
        &self,
        rng: &mut ChaCha8Rng,
        last_slot: u64,
        spare_normal: &mut Option<f64>,
    ) -> u64 {
        let mut slot = 0;
        for _ in 0..MAX_REDRAWS {
            slot = match &self.offsets {
                OffsetSampler::Uniform => return rng.gen_range(0..=last_slot),
                OffsetSampler::Zipf(zipf) => scatter(zipf.sample(rng) - 1, self.slot_count),
                OffsetSampler::Pareto { exponent } => {
                    let last_rank = self.slot_count - 1;
                    // Casting a float to an integer saturates, and `min` keeps the rank
                    // within the region even if rounding pushed it past the end.
                    let rank = (last_rank as f64 * uniform_unit(rng).powf(*exponent)) as u64;
                    scatter(rank.min(last_rank), self.slot_count)
                }
                OffsetSampler::Normal {
                    centre_slot,
                    sigma_slots,
                } => {
                    let z = standard_normal(rng, spare_normal);
                    let x = (centre_slot + z * sigma_slots).round();
                    // NaN and negative values cast to 0; large values saturate.
                    (x.max(0.0) as u64).min(self.slot_count - 1)
                }
                OffsetSampler::Zoned(zones) => {
                    let draw = rng.gen_range(0..100);
                    // The shares add up to 100, so some zone's cumulative share exceeds
                    // the draw; zones with no share are never chosen.
                    let &(_, first, count) = zones
                        .iter()
                        .find(|z| draw < z.0)
                        .unwrap_or(&zones[zones.len() - 1]);
                    first + rng.gen_range(0..count)
                }
            };
            if slot <= last_slot {
                return slot;
            }
        }
        slot.min(last_slot)
    }
}

/// The reads of fio's verify pass for writes issued in `written` order, as fio orders them
/// for a job without its random map (which `afa` never keeps: its random offsets may
/// repeat, as with fio's `norandommap`): sorted by offset, and a write that overlaps an
/// earlier one replaces it, so every byte is read back once, from its last write.
fn verify_order(written: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut pieces: std::collections::BTreeMap<u64, u64> = std::collections::BTreeMap::new();
    for &(offset, len) in written {
        let end = offset + len;
        let overlapping: Vec<u64> = pieces
            .range(..end)
            .rev()
            .take_while(|&(&o, &l)| o + l > offset || o >= offset)
            .filter(|&(&o, &l)| o + l > offset)
            .map(|(&o, _)| o)
            .collect();
        for o in overlapping {
            pieces.remove(&o);
        }
        pieces.insert(offset, len);
    }
    pieces.into_iter().collect()
}

/// A standard normal draw by the Box–Muller transform, which yields two independent values
/// per pair of uniforms; the second is kept in `spare` for the next call.
fn standard_normal(rng: &mut ChaCha8Rng, spare: &mut Option<f64>) -> f64 {
    if let Some(value) = spare.take() {
        return value;
    }
    // `1 - u` lies in (0, 1], so the logarithm is finite.
    let radius = (-2.0 * (1.0 - uniform_unit(rng)).ln()).sqrt();
    let angle = std::f64::consts::TAU * uniform_unit(rng);
    *spare = Some(radius * angle.sin());
    radius * angle.cos()
}

/// Maps a popularity rank in `0..slot_count` to a slot through a fixed bijection, so that
/// popular slots are spread over the region.
///
/// The bijection works on the smallest power-of-two domain that holds `slot_count` values,
/// using steps that are each invertible on that domain (multiplication by an odd constant
/// and a right xor-shift, both modulo the domain size), and "cycle-walks": results outside
/// `0..slot_count` are fed back in until one lands inside. Because the domain is less than
/// twice `slot_count`, that takes fewer than two rounds on average.
pub(crate) fn scatter(rank: u64, slot_count: u64) -> u64 {
    if slot_count <= 1 {
        return 0;
    }
    let bits = 64 - (slot_count - 1).leading_zeros();
    let mask = if bits == 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    };
    let shift = bits.div_ceil(2).max(1);
    let mut value = rank & mask;
    loop {
        value = value.wrapping_mul(0x9E37_79B9_7F4A_7C15) & mask;
        value ^= value >> shift;
        value = value.wrapping_mul(0xBF58_476D_1CE4_E5B9) & mask;
        value ^= value >> shift;
        if value < slot_count {
            return value;
        }
    }
}

/// Zipf sampler by rejection-inversion (W. Hörmann and G. Derflinger, "Rejection-inversion
/// to generate variates from monotone discrete distributions", 1996), following the
/// formulation in Apache Commons RNG. It draws `k` in `1..=n` with probability proportional
/// to `k^-exponent` in constant time and constant memory for any `n`, and works for every
/// positive exponent including 1.
#[derive(Debug, Clone)]
pub(crate) struct ZipfSampler {
    n: u64,
    exponent: f64,
    h_integral_x1: f64,
    h_integral_n: f64,
    s: f64,
}

/// Upper bound on rejection rounds. The acceptance rate is high (well above one half), so
/// the bound is only a guard against a non-terminating loop should floating point ever
/// misbehave.
const MAX_ZIPF_ROUNDS: u32 = 64;

impl ZipfSampler {
    pub(crate) fn new(n: u64, exponent: f64) -> Self {
        let n = n.max(1);
        let h_integral_x1 = h_integral(1.5, exponent) - 1.0;
        let h_integral_n = h_integral(n as f64 + 0.5, exponent);
        let s = 2.0 - h_integral_inverse(h_integral(2.5, exponent) - h(2.0, exponent), exponent);
        ZipfSampler {
            n,
            exponent,
            h_integral_x1,
            h_integral_n,
            s,
        }
    }

    pub(crate) fn sample(&self, rng: &mut ChaCha8Rng) -> u64 {
        let mut k = 1;
        for _ in 0..MAX_ZIPF_ROUNDS {
            let u =
                self.h_integral_n + uniform_unit(rng) * (self.h_integral_x1 - self.h_integral_n);
            let x = h_integral_inverse(u, self.exponent);
            // The cast saturates (and maps NaN to 0); the clamp keeps k in range.
            k = ((x + 0.5) as u64).clamp(1, self.n);
            let k_float = k as f64;
            if k_float - x <= self.s
                || u >= h_integral(k_float + 0.5, self.exponent) - h(k_float, self.exponent)
            {
                return k;
            }
        }
        k
    }
}

/// `H(x) = ((x^(1-e)) - 1) / (1 - e)`, the integral of `h` with the `e = 1` limit `ln x`.
fn h_integral(x: f64, exponent: f64) -> f64 {
    let log_x = x.ln();
    helper2((1.0 - exponent) * log_x) * log_x
}

/// `h(x) = x^-e`.
fn h(x: f64, exponent: f64) -> f64 {
    (-exponent * x.ln()).exp()
}

/// The inverse of [`h_integral`].
fn h_integral_inverse(x: f64, exponent: f64) -> f64 {
    // Rounding can push t slightly below -1, where log1p is undefined.
    let t = (x * (1.0 - exponent)).max(-1.0);
    (helper1(t) * x).exp()
}

/// `ln(1 + x) / x`, accurate near zero.
fn helper1(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.ln_1p() / x
    } else {
        1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x))
    }
}

/// `(e^x - 1) / x`, accurate near zero.
fn helper2(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.exp_m1() / x
    } else {
        1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x))
    }
}

#[cfg(test)]
mod tests;
