//! Log-RAID: host-side log-structured writing over a RAID 0/4/5 array (the SOFA/Purity
//! design SWAN compares itself against).
//!
//! Every sector the user writes is appended to the open stripe in host NVRAM; a full stripe
//! is written to the array in one full-stripe write, so parity never needs a read. A map
//! sends each volume sector to its newest physical sector. When free segments run short, the
//! segment with the fewest valid sectors is cleaned: its valid sectors are read back and
//! appended to the log, and the segment is trimmed on the members before reuse.
//!
//! The last sectors of every segment hold its summary (SWAN's format: sequence number, and
//! the logical address and write sequence number of every data sector), so the map can be
//! rebuilt from the members after the host loses its memory; the open segment's list lives in
//! the NVRAM, which an [`crate::NvramLog`] keeps when it must outlive the process
//! (`log_raid_recovery.rs`). Without NVRAM (`host_memory = "volatile"`) a FLUSH writes the
//! open stripe's new sectors and a partial summary into the stripe's last sectors, as SWAN's
//! does (docs/swan.md, "Without battery-backed memory").

use std::collections::VecDeque;

use afa_nand::{fill_unit, sector_token};
use afa_sim::TimeNs;
use afa_ssd::{
    validate_command, BlockDevice, Command, Completion, DeviceError, DeviceInfo, HostWork, Opcode,
    ReadBuffers,
};
use serde::{Deserialize, Serialize};

use crate::nvram::Nvram;
use crate::swan::{encode_partial_summary, encode_summary, HostMemory};
use crate::trims::{trim_record_bytes, Trims, TRIM_RECORD};
use crate::{Array, Level};

const NONE: u32 = u32::MAX;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogRaidConfig {
    /// Stripes per segment (the unit of cleaning).
    pub segment_stripes: u32,
    /// Fraction of the array's capacity kept out of the volume for cleaning.
    pub spare_fraction: f64,
    /// Cleaning starts when fewer free segments than this remain.
    pub gc_free_segments: u32,
    /// Host NVRAM holding the open stripe and stripes being written, in stripes.
    pub nvram_stripes: u32,
    /// Time to copy a write into NVRAM, in ns.
    pub nvram_write_ns: u64,
    /// Whether the host memory holding the open stripe and the open segment's list
    /// survives a power loss (`battery-backed`, the NVRAM of SOFA and Purity) or not
    /// (`volatile`: a write is durable once a FLUSH after it completes).
    pub host_memory: HostMemory,
}

impl Default for LogRaidConfig {
    fn default() -> Self {
        Self {
            segment_stripes: 16,
            spare_fraction: 0.1,
            gc_free_segments: 2,
            nvram_stripes: 8,
            nvram_write_ns: 2_000,
            host_memory: HostMemory::BatteryBacked,
        }
    }
}

/// Stripe writes in flight that each hold one stripe of host buffer (NVRAM) until they
/// complete: the back-pressure a log-structured engine puts on its writers. Shared by
/// Log-RAID and SWAN.
#[derive(Debug, Clone, Default)]
pub(crate) struct WriteWindow {
    inflight: VecDeque<TimeNs>,
}

impl WriteWindow {
    /// Admits a stripe write issued at `now_ns` that completes at `done_ns`, in a buffer of
    /// `capacity` stripes. Returns when the buffer has room for the next stripe (the oldest
    /// write in flight may have to finish first).
    pub(crate) fn admit(&mut self, now_ns: TimeNs, done_ns: TimeNs, capacity: usize) -> TimeNs {
        self.inflight.push_back(done_ns);
        let mut ready = now_ns;
        while let Some(&front) = self.inflight.front() {
            if front <= now_ns {
                self.inflight.pop_front();
            } else if self.inflight.len() >= capacity {
                ready = ready.max(front);
                self.inflight.pop_front();
            } else {
                break;
            }
        }
        ready
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SegmentState {
    Free,
    Open,
    Full,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct LogRaidStats {
    pub user_sectors: u64,
    pub stripes_written: u64,
    pub segments_cleaned: u64,
    pub gc_sectors_moved: u64,
    /// Trim records appended to the log (trims of sectors that held data), and moved by
    /// cleaning.
    pub trim_records_written: u64,
    pub trim_records_moved: u64,
    /// Sector reads cleaning issued again after a read the array could not correct (RAID 0
    /// has nothing else to read them from; a flash read error is transient).
    pub gc_read_retries: u64,
    /// With volatile host memory: partial summaries written into the end of a stripe not yet
    /// full (by FLUSHes, and before cleaned segments were trimmed), and sectors padded out
    /// of stripes whose end the data had already taken.
    pub partial_summaries: u64,
    pub pad_sectors: u64,
}

/// A log-structured volume over an array.
#[derive(Debug)]
pub struct LogRaid<D: BlockDevice> {
    array: Array<D>,
    config: LogRaidConfig,
    unit: usize,
    stripe_sectors: u32,
    segment_sectors: u32,
    /// Sectors at the end of every segment that hold its summary.
    summary_sectors: u32,
    segments: u32,
    l2p: Vec<u32>,
    p2l: Vec<u32>,
    /// Write sequence number of the data in every physical sector: a user write takes the
    /// next number, a cleaning copy keeps its source's, so the newest version wins a rebuild.
    wseq: Vec<u64>,
    next_wseq: u64,
    /// The live trim records (`trims.rs`): each is a valid sector of its segment.
    trims: Trims,
    /// The physical sector the last append took.
    last_appended: u32,
    valid: Vec<u32>,
    state: Vec<SegmentState>,
    /// Sequence number of every segment's opening.
    seq: Vec<u64>,
    next_seq: u64,
    free: VecDeque<u32>,
    /// Logical address and write sequence number of every data sector appended to the open
    /// segment (in NVRAM; the summary once the segment is full).
    lbas: Vec<(u32, u64)>,
    /// Physical sector where the next appended sector goes, NONE when no segment is open.
    head: u32,
    /// Payload of the open stripe (in NVRAM).
    stripe_buf: Vec<u8>,
    /// Stripe writes still holding NVRAM.
    inflight: WriteWindow,
    /// With volatile host memory: whether the last `summary_sectors` of the head's stripe
    /// hold a FLUSH's partial summary (the stripe's data then ends before them), and how
    /// many sectors at the stripe's start are already on the members.
    summary_slot: bool,
    stripe_written: u32,
    /// Sectors appended so far, and how many of them were on the members under a summary
    /// at the last FLUSH, stripe summary or segment close.
    placed: u64,
    durable_placed: u64,
    /// When the last write to the members of the open segment's stripes completes.
    written_ns: TimeNs,
    info: DeviceInfo,
    cleaning: bool,
    /// When the log takes user writes again after a synchronous cleaning: the log stops
    /// while a victim's valid sectors are read (docs/swan.md), so every write and trim
    /// record submitted meanwhile waits for it, not only the one that opened the segment.
    /// Otherwise a later write would fill the stripe that holds the relocated sectors and
    /// send it to the members before those sectors had been read.
    user_resume_ns: TimeNs,
    stats: LogRaidStats,
    /// Where the NVRAM's contents are kept when they must outlive the process.
    nvram: Nvram,
}

/// Sectors of `sector_bytes` that a summary of the rest of a `segment_sectors` segment
/// needs: 32 bytes of header and checksum and 13 bytes per data sector
/// ([`encode_summary`]).
fn summary_sectors_for(segment_sectors: u32, sector_bytes: u64) -> u32 {
    (32 + 13 * segment_sectors as u64).div_ceil(sector_bytes + 13) as u32
}

/// The log sectors a cleaned victim may cost besides its valid sectors. With volatile host
/// memory the victim may be trimmed only once its relocated sectors are durable
/// (`make_durable`): the open stripe is padded and a partial summary written into it, up to
/// a whole stripe when the relocations ended on a stripe boundary. With battery-backed
/// memory the relocations are durable in NVRAM and cost nothing more.
fn clean_cost_sectors(memory: HostMemory, stripe_sectors: u32) -> u32 {
    match memory {
        HostMemory::Volatile => stripe_sectors,
        HostMemory::BatteryBacked => 0,
    }
}

impl<D: BlockDevice> LogRaid<D> {
    pub fn new(array: Array<D>, config: LogRaidConfig) -> Result<Self, DeviceError> {
        if !matches!(
            array.layout().level,
            Level::Raid0 | Level::Raid4 | Level::Raid5
        ) {
            return Err(DeviceError::Unsupported(format!(
                "log-raid runs over raid0, raid4 or raid5, not {}",
                array.layout().level
            )));
        }
        let bad = |s: String| DeviceError::Unsupported(s);
        for (key, value) in [
            ("segment_stripes", config.segment_stripes),
            ("nvram_stripes", config.nvram_stripes),
            ("gc_free_segments", config.gc_free_segments),
        ] {
            if value == 0 {
                return Err(bad(format!("{key} = 0 must be positive")));
            }
        }
        if config.gc_free_segments < 2 {
            // With one, the user's next segment takes the last free one before cleaning
            // starts, and cleaning then has no segment to move its victim's data into.
            return Err(bad(format!(
                "gc_free_segments = {} must be at least 2: cleaning needs a free segment to move data into while writes take another",
                config.gc_free_segments
            )));
        }
        if !(0.0..0.9).contains(&config.spare_fraction) || config.spare_fraction.is_nan() {
            return Err(bad(format!(
                "log-raid spare_fraction = {} must lie in [0, 0.9)",
                config.spare_fraction
            )));
        }
        afa_sim::check_step_ns("log-raid nvram_write_ns", config.nvram_write_ns).map_err(&bad)?;
        let ainfo = array.info();
        let stripe_sectors = (array.chunk_sectors() as u64 * array.layout().k as u64) as u32;
        let segment_sectors = stripe_sectors * config.segment_stripes;
        let summary_sectors = summary_sectors_for(segment_sectors, ainfo.sector_bytes as u64);
        if summary_sectors >= segment_sectors {
            return Err(bad(format!(
                "a log-raid segment of {segment_sectors} sectors cannot hold data besides its {summary_sectors}-sector summary; raise segment_stripes"
            )));
        }
        if config.host_memory == HostMemory::Volatile && summary_sectors >= stripe_sectors {
            return Err(bad(format!(
                "log-raid host_memory = \"volatile\" needs stripes longer than the segment summary: a FLUSH writes a partial summary into the end of the open stripe, and the summary of a {segment_sectors}-sector segment takes {summary_sectors} sectors while a stripe holds {stripe_sectors}; raise chunk_bytes or lower segment_stripes"
            )));
        }
        let data_sectors = (segment_sectors - summary_sectors) as u64;
        let clean_cost = clean_cost_sectors(config.host_memory, stripe_sectors) as u64;
        if data_sectors <= clean_cost {
            return Err(bad(format!(
                "log-raid host_memory = \"volatile\" needs segments of more than one stripe: cleaning a victim may cost a stripe of padding and partial summary, and a segment of {segment_sectors} sectors holds only {data_sectors} of data; raise segment_stripes"
            )));
        }
        let segments = (ainfo.capacity_sectors / segment_sectors as u64) as u32;
        let reserve = config.gc_free_segments + 1;
        if segments <= reserve + 1 {
            return Err(bad(format!(
                "the array holds only {segments} segments; log-raid needs more than {}",
                reserve + 1
            )));
        }
        let physical = segments as u64 * segment_sectors as u64;
        // Sector addresses are 32 bits (the map, the summaries), and the highest two values
        // mean "none" and "trim record" (`trims.rs`).
        if physical >= NONE as u64 {
            return Err(bad(format!(
                "the array's {physical} sectors exceed log-raid's 2^32 sector addresses"
            )));
        }
        // Cleaning must free more than it costs, however evenly the invalid sectors lie: with
        // this much exposed, the full segments hold on average more invalid sectors than a
        // victim's cleaning costs (`clean_cost_sectors`), so the victim with the fewest valid
        // ones is always worth cleaning. Exposing the whole of the free segments' space, a
        // volatile-memory volume written full once and then overwritten at random came to
        // every segment holding one stripe of invalid sectors, and cleaning went round its
        // segments for ever, each victim's stripe of padding taking what it freed.
        let usable = (segments - reserve) as u64 * (data_sectors - clean_cost);
        let logical = (((segments as u64 * data_sectors) as f64 * (1.0 - config.spare_fraction))
            as u64)
            .min(usable);
        let unit = ainfo.payload_unit_bytes as usize;
        Ok(Self {
            info: DeviceInfo {
                capacity_sectors: logical,
                tag_bytes_per_sector: 0,
                ..ainfo
            },
            unit,
            stripe_sectors,
            segment_sectors,
            summary_sectors,
            segments,
            l2p: vec![NONE; logical as usize],
            p2l: vec![NONE; physical as usize],
            wseq: vec![0; physical as usize],
            next_wseq: 1,
            trims: Trims::new(logical as usize),
            last_appended: NONE,
            valid: vec![0; segments as usize],
            state: vec![SegmentState::Free; segments as usize],
            seq: vec![0; segments as usize],
            next_seq: 1,
            free: (0..segments).collect(),
            lbas: Vec::new(),
            head: NONE,
            stripe_buf: vec![0; stripe_sectors as usize * unit],
            inflight: WriteWindow::default(),
            summary_slot: false,
            stripe_written: 0,
            placed: 0,
            durable_placed: 0,
            written_ns: 0,
            cleaning: false,
            user_resume_ns: 0,
            stats: LogRaidStats::default(),
            nvram: Nvram::default(),
            array,
            config,
        })
    }

    pub fn array(&self) -> &Array<D> {
        &self.array
    }
    pub fn array_mut(&mut self) -> &mut Array<D> {
        &mut self.array
    }
    pub fn stats(&self) -> &LogRaidStats {
        &self.stats
    }
    /// Zeroes the log's and the array's counters and hands every member to `member` (see
    /// [`Array::reset_counters`]).
    pub fn reset_counters(&mut self, member: impl FnMut(&mut D)) {
        self.stats = LogRaidStats::default();
        self.array.reset_counters(member);
    }

    #[inline]
    fn segment_of(&self, physical: u32) -> u32 {
        physical / self.segment_sectors
    }

    /// Data sectors per segment (the summary takes the rest).
    #[inline]
    fn data_sectors(&self) -> u32 {
        self.segment_sectors - self.summary_sectors
    }

    /// Whether `physical` lies in the open stripe, still only in NVRAM.
    fn in_open_stripe(&self, physical: u32) -> bool {
        self.head != NONE
            && physical / self.stripe_sectors == self.head / self.stripe_sectors
            && physical < self.head
    }

    fn invalidate(&mut self, physical: u32) {
        self.p2l[physical as usize] = NONE;
        let s = self.segment_of(physical) as usize;
        self.valid[s] -= 1;
    }

    /// Opens a new segment, cleaning first when free segments run short.
    fn open_segment(&mut self, now_ns: TimeNs) -> Result<TimeNs, DeviceError> {
        let mut t = now_ns;
        if !self.cleaning {
            while self.free.len() < self.config.gc_free_segments as usize {
                match self.clean_one(t)? {
                    Some(done) => t = t.max(done),
                    None => break,
                }
            }
            self.user_resume_ns = self.user_resume_ns.max(t);
        }
        if self.head != NONE {
            // Cleaning relocated data and so opened a segment already; appending goes on there.
            return Ok(t);
        }
        let seg = *self.free.front().ok_or_else(|| {
            DeviceError::VolumeFull("log-raid has no free segment left to open".into())
        })?;
        self.nvram.open(0, seg, self.next_seq)?;
        self.free.pop_front();
        self.state[seg as usize] = SegmentState::Open;
        self.seq[seg as usize] = self.next_seq;
        self.next_seq += 1;
        self.head = seg * self.segment_sectors;
        self.lbas.clear();
        Ok(t)
    }

    /// Cleans the full segment with the fewest valid sectors. Returns when its relocated data
    /// was read, or None when no segment would free space.
    fn clean_one(&mut self, now_ns: TimeNs) -> Result<Option<TimeNs>, DeviceError> {
        let victim = (0..self.segments)
            .filter(|&s| self.state[s as usize] == SegmentState::Full)
            .min_by_key(|&s| (self.valid[s as usize], s));
        let Some(victim) = victim else {
            return Ok(None);
        };
        // A victim freeing no more than its cleaning costs frees nothing.
        let cost = clean_cost_sectors(self.config.host_memory, self.stripe_sectors);
        if self.valid[victim as usize] + cost >= self.data_sectors() {
            return Ok(None);
        }
        // Relocations append without cleaning (`open_segment`); the flag is cleared whether
        // or not they succeed, so that a failed relocation does not stop cleaning for good.
        self.cleaning = true;
        let relocated = self.relocate_valid(victim, now_ns);
        self.cleaning = false;
        let t = relocated?;
        let trim_at = if self.volatile() {
            // Until the relocated sectors, and the writes that replaced the victim's other
            // sectors, are on the members under a summary, the victim holds the versions a
            // crash must find: it is trimmed once those writes are done. The open stripe is
            // padded out and written whole rather than in part (as a FLUSH does): the pad
            // costs at most a stripe per segment freed, while writing stripes in part once
            // per victim cost the writers more than 40% of their throughput (docs/swan.md,
            // "Log-RAID without battery-backed memory").
            self.make_durable(t, true)?
        } else {
            t
        };
        debug_assert_eq!(self.valid[victim as usize], 0);
        let first = victim * self.segment_sectors;
        // Trimming the whole segment keeps the members' FTLs from moving dead data.
        let c = self.array.submit(
            trim_at,
            &Command::trim(first as u64, self.segment_sectors),
            ReadBuffers::none(),
        )?;
        self.state[victim as usize] = SegmentState::Free;
        self.free.push_back(victim);
        self.stats.segments_cleaned += 1;
        if self.volatile() {
            // The writers need not wait for the trim: the members take the writes that
            // reuse the segment after it, in the order they are submitted.
            return Ok(Some(t));
        }
        Ok(Some(t.max(c.done_ns)))
    }

    /// Appends every valid sector of segment `victim` to the log. Returns when the last was
    /// read.
    fn relocate_valid(&mut self, victim: u32, now_ns: TimeNs) -> Result<TimeNs, DeviceError> {
        let first = victim * self.segment_sectors;
        // Every read of the victim is issued before any of the writes that relocate its data:
        // the members serve commands in the order they are submitted, so a read submitted
        // after a stripe write would wait on its die behind that write's program although
        // the host had issued it first, and cleaning would run at queue depth 1.
        let unit = self.unit;
        let mut runs: Vec<(u32, u32, Vec<u8>, TimeNs)> = Vec::new();
        let mut physical = first;
        while physical < first + self.segment_sectors {
            if self.p2l[physical as usize] == NONE {
                physical += 1;
                continue;
            }
            let mut run = 1;
            while physical + run < first + self.segment_sectors
                && self.p2l[(physical + run) as usize] != NONE
            {
                run += 1;
            }
            let mut buf = vec![0u8; run as usize * unit];
            let done = crate::cleaner_read(
                &mut self.array,
                now_ns,
                physical as u64,
                run,
                &mut buf,
                &mut self.stats.gc_read_retries,
            )?;
            runs.push((physical, run, buf, done));
            physical += run;
        }
        // A stripe of relocated data is written once every sector in it has been read.
        let mut t = now_ns;
        for (physical, run, buf, read_done) in &runs {
            t = t.max(*read_done);
            for i in 0..*run {
                let q = physical + i;
                let lba = self.p2l[q as usize];
                let wseq = self.wseq[q as usize];
                let data = &buf[i as usize * unit..(i as usize + 1) * unit];
                self.append(lba, wseq, data, t)?;
                if lba == TRIM_RECORD {
                    self.trims.moved(q, self.last_appended);
                    self.invalidate(q);
                    self.stats.trim_records_moved += 1;
                }
                self.stats.gc_sectors_moved += 1;
            }
        }
        Ok(t)
    }

    /// Appends one sector of volume address `lba` written with sequence number `wseq`.
    /// Returns when it is in NVRAM.
    fn append(
        &mut self,
        lba: u32,
        wseq: u64,
        data: &[u8],
        now_ns: TimeNs,
    ) -> Result<TimeNs, DeviceError> {
        let mut t = now_ns;
        if self.head == NONE {
            t = self.open_segment(now_ns)?;
        }
        // Recorded before anything changes: once this append returns, the sector survives
        // the loss of the host's memory.
        self.nvram.block(0, lba, wseq, data)?;
        let physical = self.head;
        let offset = (physical % self.stripe_sectors) as usize;
        if self.unit > 0 {
            self.stripe_buf[offset * self.unit..(offset + 1) * self.unit].copy_from_slice(data);
        }
        let invalid = self
            .trims
            .map_appended(&mut self.l2p, &mut self.p2l, lba, physical);
        for p in invalid.into_iter().flatten() {
            self.invalidate(p);
        }
        self.last_appended = physical;
        self.wseq[physical as usize] = wseq;
        self.lbas.push((lba, wseq));
        let seg = self.segment_of(physical);
        self.valid[seg as usize] += 1;
        self.head += 1;
        self.placed += 1;
        let (stripe, n) = (self.stripe_sectors, self.summary_sectors);
        if self.summary_slot
            && self.head % stripe == stripe - n
            && self.head % self.segment_sectors != self.data_sectors()
        {
            // A FLUSH took the stripe's last sectors for its summary: the stripe is full.
            return Ok(t.max(self.complete_stripe(t)?));
        }
        if self.head % stripe == 0 {
            t = t.max(self.flush_stripe(t)?);
        }
        if self.head % self.segment_sectors == self.data_sectors() {
            t = t.max(self.close_segment(t)?);
        }
        Ok(t)
    }

    fn volatile(&self) -> bool {
        self.config.host_memory == HostMemory::Volatile
    }

    /// The summary bytes of `entries` (every sector of the segment before the summary) for
    /// the `summary_sectors` it takes: the real summary with payload `full`, else a token of
    /// the segment's sequence number in every sector (with token payloads a sector holds 8
    /// bytes).
    fn summary_bytes(&self, entries: &[(u32, u64)], partial: bool) -> Vec<u8> {
        let seg = self.segment_of(self.head);
        let seq = self.seq[seg as usize];
        let (unit, n) = (self.unit, self.summary_sectors as usize);
        if unit == self.info.sector_bytes as usize {
            let encoded = if partial {
                encode_partial_summary(seq, seg, entries, n * unit)
            } else {
                encode_summary(seq, seg, entries, n * unit)
            };
            encoded.expect("summary_sectors_for leaves room for the summary")
        } else {
            let mut bytes = vec![0u8; n * unit];
            for block in bytes.chunks_mut(unit.max(1)) {
                fill_unit(sector_token(seg as u64, seq), block);
            }
            bytes
        }
    }

    /// With volatile host memory, ends the head's stripe (whose data reaches the sectors
    /// before its summary) with a partial summary of the segment so far and writes what of
    /// it is not on the members yet. Returns when NVRAM has room for the next stripe.
    fn complete_stripe(&mut self, now_ns: TimeNs) -> Result<TimeNs, DeviceError> {
        let (unit, n) = (self.unit, self.summary_sectors as usize);
        let summary = self.summary_bytes(&self.lbas, true);
        let offset = (self.head % self.stripe_sectors) as usize;
        if unit > 0 {
            self.stripe_buf[offset * unit..(offset + n) * unit].copy_from_slice(&summary);
        }
        self.lbas.extend(std::iter::repeat_n((NONE, 0), n));
        self.head += n as u32;
        let t = self.flush_stripe(now_ns)?;
        self.durable_placed = self.placed;
        Ok(t)
    }

    /// Appends `count` zero sectors of no address to the open stripe (volatile host memory).
    fn pad(&mut self, count: u32) {
        let offset = (self.head % self.stripe_sectors) as usize;
        let unit = self.unit;
        if unit > 0 {
            self.stripe_buf[offset * unit..(offset + count as usize) * unit].fill(0);
        }
        self.lbas
            .extend(std::iter::repeat_n((NONE, 0), count as usize));
        self.head += count;
        self.stats.pad_sectors += count as u64;
    }

    /// With volatile host memory, puts every sector appended so far on the members under a
    /// summary: the open stripe's sectors not yet there are written, then a partial summary
    /// listing every sector of the segment before the stripe's last `summary_sectors` (those
    /// not yet filled as entries of no address) goes into those last sectors. The stripe
    /// stays open; when its data reaches the summary, the stripe's own partial summary takes
    /// those sectors in place of this one. If the data already reaches into them, the stripe
    /// is padded out and the next stripe's end takes the summary. With `pad_stripe` the
    /// stripe is padded out up to its summary and written whole instead. Returns when the
    /// writes are done.
    fn make_durable(&mut self, now_ns: TimeNs, pad_stripe: bool) -> Result<TimeNs, DeviceError> {
        if self.head == NONE || self.placed == self.durable_placed {
            return Ok(now_ns.max(self.written_ns));
        }
        let (unit, stripe, n) = (self.unit, self.stripe_sectors, self.summary_sectors);
        let mut filled = self.head % stripe;
        if pad_stripe && filled < stripe - n {
            self.pad(stripe - n - filled);
            filled = stripe - n;
        }
        if filled > stripe - n {
            self.pad(stripe - filled);
            self.flush_stripe(now_ns)?;
            filled = 0;
        }
        if self.head % self.segment_sectors == self.data_sectors() {
            // Padded up to the segment's summary.
            self.close_segment(now_ns)?;
            return Ok(now_ns.max(self.written_ns));
        }
        self.stats.partial_summaries += 1;
        if filled == stripe - n {
            self.complete_stripe(now_ns)?;
            return Ok(now_ns.max(self.written_ns));
        }
        let mut entries = self.lbas.clone();
        entries.resize(self.lbas.len() + (stripe - n - filled) as usize, (NONE, 0));
        let summary = self.summary_bytes(&entries, true);
        let tail = (stripe - n) as usize * unit;
        if unit > 0 {
            self.stripe_buf[tail..].copy_from_slice(&summary);
        }
        let start = self.head - filled;
        let from = self.stripe_written;
        // The data first: a crash between the two writes then leaves the previous summary,
        // which lists none of these sectors, rather than one listing sectors not there.
        if filled > from {
            let data = &self.stripe_buf[from as usize * unit..filled as usize * unit];
            let c = self.array.submit(
                now_ns,
                &Command::write((start + from) as u64, filled - from, data),
                ReadBuffers::none(),
            )?;
            self.written_ns = self.written_ns.max(c.done_ns);
        }
        let c = self.array.submit(
            now_ns,
            &Command::write((start + stripe - n) as u64, n, &self.stripe_buf[tail..]),
            ReadBuffers::none(),
        )?;
        self.written_ns = self.written_ns.max(c.done_ns);
        self.summary_slot = true;
        self.stripe_written = filled;
        self.durable_placed = self.placed;
        Ok(now_ns.max(self.written_ns))
    }

    /// Appends the open segment's summary to its last sectors, writes the stripes that
    /// fills, and closes the segment. Returns when NVRAM has room again.
    fn close_segment(&mut self, now_ns: TimeNs) -> Result<TimeNs, DeviceError> {
        let seg = self.segment_of(self.head);
        let (unit, n) = (self.unit, self.summary_sectors as usize);
        let summary = self.summary_bytes(&self.lbas, false);
        let mut t = now_ns;
        for i in 0..n {
            let offset = (self.head % self.stripe_sectors) as usize;
            if unit > 0 {
                self.stripe_buf[offset * unit..(offset + 1) * unit]
                    .copy_from_slice(&summary[i * unit..(i + 1) * unit]);
            }
            self.head += 1;
            if self.head % self.stripe_sectors == 0 {
                t = t.max(self.flush_stripe(t)?);
            }
        }
        self.state[seg as usize] = SegmentState::Full;
        self.head = NONE;
        self.durable_placed = self.placed;
        // The summary is on the members: the segment's records may leave the NVRAM log.
        self.compact_nvram()?;
        Ok(t)
    }

    /// A FLUSH of the volume. NVRAM is durable, so it needs only the members' own
    /// flushes, and the NVRAM log's when that memory is kept in one. With volatile host
    /// memory the open stripe goes out first, under a partial summary.
    fn flush(&mut self, now_ns: TimeNs) -> Result<TimeNs, DeviceError> {
        self.nvram.sync()?;
        let (mut at, mut done) = (now_ns, now_ns);
        if self.volatile() {
            // The summary goes into the log, which a synchronous cleaning may hold, and the
            // members' flushes must follow it.
            at = now_ns.max(self.user_resume_ns);
            done = self.make_durable(at, false)?;
        }
        let flush = Command::flush();
        Ok(done.max(self.array.submit(at, &flush, ReadBuffers::none())?.done_ns))
    }

    /// Writes the full stripe just before the head to the array: as one full-stripe write,
    /// or, when a FLUSH (volatile host memory) already wrote its first sectors, the rest of
    /// it. Returns when NVRAM has room for the next stripe (the oldest in-flight stripe write
    /// may have to finish).
    fn flush_stripe(&mut self, now_ns: TimeNs) -> Result<TimeNs, DeviceError> {
        let from = std::mem::take(&mut self.stripe_written);
        self.summary_slot = false;
        let start = self.head - self.stripe_sectors + from;
        let c = self.array.submit(
            now_ns,
            &Command::write(
                start as u64,
                self.stripe_sectors - from,
                &self.stripe_buf[from as usize * self.unit..],
            ),
            ReadBuffers::none(),
        )?;
        self.written_ns = self.written_ns.max(c.done_ns);
        self.stats.stripes_written += 1;
        Ok(self
            .inflight
            .admit(now_ns, c.done_ns, self.config.nvram_stripes as usize))
    }

    fn write(&mut self, now_ns: TimeNs, cmd: &Command<'_>) -> Result<TimeNs, DeviceError> {
        let unit = self.unit;
        let mut done = now_ns + self.config.nvram_write_ns;
        let zeros = vec![0u8; unit];
        for i in 0..cmd.sectors as usize {
            let data = if unit > 0 {
                &cmd.data[i * unit..(i + 1) * unit]
            } else {
                &zeros[..]
            };
            let wseq = self.next_wseq;
            self.next_wseq += 1;
            // A cleaning started by an earlier sector, or by an earlier write, holds this one.
            let at = now_ns.max(self.user_resume_ns);
            let t = self.append((cmd.lba + i as u64) as u32, wseq, data, at)?;
            done = done.max(t + self.config.nvram_write_ns);
        }
        self.stats.user_sectors += cmd.sectors as u64;
        Ok(done)
    }

    /// Trims a range. Unless none of its sectors has held data, the trim goes into the log
    /// as a trim record (`trims.rs`), so that the map rebuilt after a crash keeps the
    /// sectors trimmed instead of giving them an older copy back.
    fn trim(&mut self, now_ns: TimeNs, cmd: &Command<'_>) -> Result<TimeNs, DeviceError> {
        let (start, count) = (cmd.lba as u32, cmd.sectors);
        let done = now_ns + self.config.nvram_write_ns;
        if !self.trims.must_log(&self.l2p, start, count) {
            return Ok(done);
        }
        let wseq = self.next_wseq;
        self.next_wseq += 1;
        let data = trim_record_bytes(start, count, wseq, self.unit);
        let at = now_ns.max(self.user_resume_ns);
        let t = self.append(TRIM_RECORD, wseq, &data, at)?;
        for p in self
            .trims
            .record(self.last_appended, start, count, &mut self.l2p)
        {
            self.invalidate(p);
        }
        self.stats.trim_records_written += 1;
        Ok(done.max(t + self.config.nvram_write_ns))
    }

    fn read(
        &mut self,
        now_ns: TimeNs,
        cmd: &Command<'_>,
        out: &mut [u8],
    ) -> Result<TimeNs, DeviceError> {
        let unit = self.unit;
        let mut done = now_ns + self.config.nvram_write_ns;
        let mut i = 0usize;
        let n = cmd.sectors as usize;
        while i < n {
            let physical = self.l2p[cmd.lba as usize + i];
            if physical == NONE || self.in_open_stripe(physical) {
                if unit > 0 {
                    let dst = &mut out[i * unit..(i + 1) * unit];
                    if physical == NONE {
                        dst.fill(0);
                    } else {
                        let off = (physical % self.stripe_sectors) as usize;
                        dst.copy_from_slice(&self.stripe_buf[off * unit..(off + 1) * unit]);
                    }
                }
                i += 1;
                continue;
            }
            // Read the longest run of physically consecutive sectors in one command.
            let mut run = 1;
            while i + run < n
                && self.l2p[cmd.lba as usize + i + run] == physical + run as u32
                && !self.in_open_stripe(physical + run as u32)
            {
                run += 1;
            }
            let c = self.array.submit(
                now_ns,
                &Command::read(physical as u64, run as u32),
                ReadBuffers {
                    data: &mut out[i * unit..(i + run) * unit],
                    tags: None,
                },
            )?;
            done = done.max(c.done_ns);
            i += run;
        }
        Ok(done)
    }
}

impl<D: BlockDevice> BlockDevice for LogRaid<D> {
    fn info(&self) -> DeviceInfo {
        self.info
    }

    fn media_faults(&self) -> afa_nand::MediaFaults {
        self.array.media_faults()
    }

    /// A trim of sectors that held data is a trim record in the log, appended (and kept in
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
            done_ns,
            gc_active: false,
        })
    }

    fn background(&mut self, now_ns: TimeNs) -> Option<TimeNs> {
        self.array.background(now_ns)
    }

    fn take_host_work(&mut self) -> HostWork {
        self.array.take_host_work()
    }
}

#[path = "log_raid_recovery.rs"]
mod recovery;
