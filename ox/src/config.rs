//! The controller's configuration: the flash terms of Table 1, the shape of the open-channel
//! medium, the controller's own costs, GC, checkpoints and the transport to the host.

use afa_nand::{CellMode, FaultConfig, Geometry, NandTiming, PayloadMode, CONTROLLER_OOB_BYTES};
use serde::{Deserialize, Serialize};

use crate::OxError;

/// The flash terms of Table 1 of the paper, as configuration rather than constants.
///
/// The medium's page is the WBLOCK (smallest writable unit), its sector the RBLOCK (smallest
/// readable unit), its block the EBLOCK (smallest erasable unit); each RBLOCK carries a TAG
/// in the out-of-band area that only the controller sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FlashTerms {
    pub rblock_bytes: u32,
    pub wblock_bytes: u32,
    pub eblock_bytes: u32,
    pub tag_bytes: u32,
}

impl Default for FlashTerms {
    /// The paper's figures: 4 KiB RBLOCK, 32 KiB WBLOCK, 8 MiB EBLOCK, 16-byte TAG.
    fn default() -> Self {
        Self {
            rblock_bytes: 4096,
            wblock_bytes: 32 * 1024,
            eblock_bytes: 8 * 1024 * 1024,
            tag_bytes: 16,
        }
    }
}

impl FlashTerms {
    /// RBLOCKs per WBLOCK.
    pub fn rblocks_per_wblock(&self) -> u32 {
        self.wblock_bytes / self.rblock_bytes
    }
    /// WBLOCKs per EBLOCK.
    pub fn wblocks_per_eblock(&self) -> u32 {
        self.eblock_bytes / self.wblock_bytes
    }
    /// RBLOCKs per EBLOCK.
    pub fn rblocks_per_eblock(&self) -> u32 {
        self.eblock_bytes / self.rblock_bytes
    }

    pub fn validate(&self) -> Result<(), OxError> {
        if self.rblock_bytes == 0 || !self.rblock_bytes.is_power_of_two() {
            return Err(OxError::Config(format!(
                "rblock_bytes = {} must be a positive power of two",
                self.rblock_bytes
            )));
        }
        if self.wblock_bytes < self.rblock_bytes || self.wblock_bytes % self.rblock_bytes != 0 {
            return Err(OxError::Config(format!(
                "wblock_bytes = {} must be a multiple of rblock_bytes = {}",
                self.wblock_bytes, self.rblock_bytes
            )));
        }
        if self.eblock_bytes < self.wblock_bytes || self.eblock_bytes % self.wblock_bytes != 0 {
            return Err(OxError::Config(format!(
                "eblock_bytes = {} must be a multiple of wblock_bytes = {}",
                self.eblock_bytes, self.wblock_bytes
            )));
        }
        if self.rblocks_per_wblock() > Geometry::MAX_SECTORS_PER_PAGE {
            return Err(OxError::Config(format!(
                "{} RBLOCKs per WBLOCK exceed the medium's limit of {}",
                self.rblocks_per_wblock(),
                Geometry::MAX_SECTORS_PER_PAGE
            )));
        }
        if self.tag_bytes < 16 {
            return Err(OxError::Config(format!(
                "tag_bytes = {} is too small: a TAG holds an LPID, a writer sequence and a kind (16 bytes)",
                self.tag_bytes
            )));
        }
        Ok(())
    }
}

/// Costs of the controller's software, which runs on the SSD's embedded cores (the paper's
/// ARM Cortex-A72 running OX in user space), and of the transport to the host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ControllerCosts {
    /// Embedded cores that run FTL work; each piece of work takes the earliest free core.
    pub cores: u32,
    /// Parsing and dispatching one host command.
    pub command_cpu_ns: u64,
    /// Creating one write context (the unit the WAL protocol protects).
    pub context_cpu_ns: u64,
    /// Building and appending one log record (RDESC, RDESC_A, done, GC, erase).
    pub log_record_cpu_ns: u64,
    /// Per LPAGE written: parsing the DESC entry, filling the TAG, grouping into WBLOCKs.
    pub page_cpu_ns: u64,
    /// Installing one MAP entry (the install of a batch walks its entries in order, which is
    /// what makes a concurrent read see a prefix).
    pub map_update_ns: u64,
    /// One-way latency of a command or completion over the fabric (NVMe-oF/TCP).
    pub transport_latency_ns: u64,
    /// Link rate between host and SSD in MB/s (the paper's 100 Gb/s network).
    pub link_mb_s: f64,
    /// Payload bytes of one transport packet (a 64 KiB IP datagram less its header): the
    /// paper's 1 MiB buffer arrives as 17 packets.
    pub packet_bytes: u32,
    /// OXBlock: packet contexts of one write command under way at once (0: all of them).
    /// The paper says an OXBlock internal write is bounded by the packet size; whether OX
    /// then runs a command's packet contexts one at a time or side by side it does not say.
    pub block_packet_contexts: u32,
    /// Threads that look MAP up for host reads (0: every read looks up on its own). OX's
    /// LBA I/O layer has one read thread (`lba_io_sec_sq` in ox-ctrl's oxb-lba-io.c: "1
    /// write thread and 1 read thread"); it looks every LBA of a read up in MAP, in arrival
    /// order, and a MAP page that is not in DRAM is loaded synchronously in that thread
    /// (`map_read` → `map_load_pg_cache`, which writes a dirty page out first), so a MAP
    /// miss holds up every read queued behind it.
    pub read_lookup_threads: u32,
}

impl Default for ControllerCosts {
    fn default() -> Self {
        Self {
            cores: 4,
            command_cpu_ns: 4_000,
            context_cpu_ns: 25_000,
            log_record_cpu_ns: 4_000,
            page_cpu_ns: 400,
            map_update_ns: 150,
            transport_latency_ns: 15_000,
            link_mb_s: 12_500.0,
            packet_bytes: 65_512,
            block_packet_contexts: 0,
            read_lookup_threads: 1,
        }
    }
}

/// Garbage collection per channel (§7.2.8).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OxGcConfig {
    pub enabled: bool,
    /// GC starts on a channel when the fraction of its data EBLOCKs in use exceeds this
    /// (the paper's "aggressive" 50% and "non-aggressive" 70%).
    pub start_used_fraction: f64,
    /// GC on a channel stops once the used fraction falls below this.
    pub stop_used_fraction: f64,
    /// Static wear levelling: when the most erased data EBLOCK of a channel exceeds the least
    /// erased FULL one by more than this many erases, the cold one is collected so that its
    /// EBLOCK returns to the free pool. Zero turns it off.
    pub static_wear_threshold_erases: u32,
    /// Channels that may be closed for GC at once (0: no limit). Channels fill at the same
    /// pace under round-robin striping, so without a limit they all start GC together and
    /// user writes stall; the paper does not say how OX staggers them, this is our choice.
    pub max_gc_channels: u32,
    /// Read each WBLOCK of a victim that holds a live RBLOCK whole (OX's GC reads flash pages,
    /// `block_gc_read_blk` in ox-ctrl), rather than only the live RBLOCKs. The paper's
    /// Table 3 shows the effect: OXBatch's GC reads about three times what it writes.
    pub read_whole_wblocks: bool,
    /// A victim must have at least this fraction of its RBLOCKs invalid
    /// (`APP_GC_TARGET_RATE` = 0.5 in ox-ctrl's ox-app.h): GC does not copy a mostly live
    /// EBLOCK to gain a little space while the channel still has room.
    pub min_invalid_fraction: f64,
    /// Above this used fraction of the channel the minimum falls linearly, to nothing when
    /// the channel is full (`APP_GC_THRESD` = 0.7 in ox-ctrl's ox-app.h). When user writes
    /// can no longer get an EBLOCK in the channel any victim with an invalid RBLOCK will do:
    /// our addition, so that the minimum can never leave a full channel without a victim.
    pub min_invalid_relax_from_used_fraction: f64,
}

impl Default for OxGcConfig {
    fn default() -> Self {
        Self {
            max_gc_channels: 4,
            read_whole_wblocks: true,
            min_invalid_fraction: 0.5,
            min_invalid_relax_from_used_fraction: 0.7,
            enabled: true,
            start_used_fraction: 0.5,
            stop_used_fraction: 0.45,
            static_wear_threshold_erases: 16,
        }
    }
}

/// Fuzzy incremental checkpoints (§6).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OxCheckpointConfig {
    pub enabled: bool,
    /// Virtual time between the starts of two checkpoints.
    pub interval_ns: u64,
}

impl Default for OxCheckpointConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            interval_ns: 3_000_000_000,
        }
    }
}

/// The controller's write cache (§7.2.9): whether a write is acknowledged once it is durable
/// on flash (write-through, the paper's measured configuration) or once its buffer is in the
/// controller's DRAM (write-back, which §7.1 names as an option and §9 proposes for a
/// controller whose DRAM is backed by flash on power failure).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OxWriteCacheConfig {
    /// Acknowledge writes once they are in the cache. The cache's DRAM is taken to be
    /// power-loss protected: on a power loss the controller finishes writing every write the
    /// cache holds before it stops (`PoweredOff::drain_ns` says how long that took).
    pub write_back: bool,
    /// Bytes of write data the cache holds from a context's start to its MAP install, in
    /// either mode; a write that does not fit waits, unacknowledged, for room. 0 takes the
    /// largest allowed: a quarter of the over-provisioned flash, and at least one batch.
    pub capacity_bytes: u64,
}

/// Everything that shapes one OX controller and its medium.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OxConfig {
    pub terms: FlashTerms,
    pub channels: u32,
    /// Chips (LUNs) per channel; a channel pipelines WBLOCKs over them.
    pub luns_per_channel: u32,
    pub eblocks_per_lun: u32,
    /// Logical pages (LPIDs) the device exposes; the rest of the flash is over-provisioning,
    /// log, tables and system blocks.
    pub logical_pages: u64,
    pub timing: NandTiming,
    pub cell_mode: CellMode,
    pub payload: PayloadMode,
    pub faults: FaultConfig,
    /// MAP pages (WBLOCK-sized) the controller keeps in DRAM; the rest load on demand.
    pub map_cache_pages: u32,
    /// Forward links per log block (§4.3): a failed log write retries at the next one.
    pub log_forward_links: u32,
    /// Largest number of LPAGEs in one batch (the DESC block lists them).
    pub max_batch_pages: u32,
    pub costs: ControllerCosts,
    pub gc: OxGcConfig,
    pub checkpoint: OxCheckpointConfig,
    pub write_cache: OxWriteCacheConfig,
}

impl Default for OxConfig {
    /// A small device (8 channels × 2 LUNs × 64 EBLOCKs of 1 MiB, 1 GiB raw) that tests and
    /// examples run in well under a second.
    fn default() -> Self {
        let terms = FlashTerms {
            eblock_bytes: 1024 * 1024,
            ..FlashTerms::default()
        };
        Self {
            terms,
            channels: 8,
            luns_per_channel: 2,
            eblocks_per_lun: 64,
            logical_pages: 160 * 1024,
            timing: NandTiming::default(),
            cell_mode: CellMode::Mlc,
            payload: PayloadMode::Token,
            faults: FaultConfig::default(),
            map_cache_pages: 8,
            log_forward_links: 3,
            max_batch_pages: 511,
            costs: ControllerCosts::default(),
            gc: OxGcConfig::default(),
            checkpoint: OxCheckpointConfig::default(),
            write_cache: OxWriteCacheConfig::default(),
        }
    }
}

impl OxConfig {
    /// The medium's geometry: one plane per die and one die per LUN, so that a LUN is a
    /// parallel unit as in an open-channel SSD.
    pub fn geometry(&self) -> Geometry {
        let t = &self.terms;
        Geometry {
            channels: self.channels,
            chips_per_channel: self.luns_per_channel,
            dies_per_chip: 1,
            planes_per_die: 1,
            blocks_per_plane: self.eblocks_per_lun,
            pages_per_block: t.wblocks_per_eblock(),
            page_bytes: t.wblock_bytes,
            sector_bytes: t.rblock_bytes,
            oob_bytes_per_page: CONTROLLER_OOB_BYTES + t.tag_bytes * t.rblocks_per_wblock(),
        }
    }

    pub fn eblocks_total(&self) -> u32 {
        self.channels * self.luns_per_channel * self.eblocks_per_lun
    }

    /// MAP entries per MAP page (8-byte entries in a WBLOCK-sized page).
    pub fn map_entries_per_page(&self) -> u64 {
        self.terms.wblock_bytes as u64 / 8
    }

    pub fn validate(&self) -> Result<(), OxError> {
        self.terms.validate()?;
        self.geometry().validate()?;
        self.timing.validate()?;
        self.faults.validate()?;
        if self.payload == PayloadMode::Full {
            return Err(OxError::Config(
                "payload = full is not supported by OX; use token (an 8-byte fingerprint per RBLOCK) or none".into(),
            ));
        }
        if self.log_forward_links == 0 || 2 * self.log_forward_links > self.channels {
            return Err(OxError::Config(format!(
                "log_forward_links = {} must be at least 1 and at most half the {} channels, \
                 so that consecutive log blocks reserve disjoint channels",
                self.log_forward_links, self.channels
            )));
        }
        if self.map_cache_pages < 2 {
            return Err(OxError::Config("map_cache_pages must be at least 2".into()));
        }
        let max_desc = (self.terms.rblock_bytes as u64 - 8) / 8;
        if self.max_batch_pages == 0 || self.max_batch_pages as u64 > max_desc {
            return Err(OxError::Config(format!(
                "max_batch_pages = {} must lie in 1..={max_desc}: the DESC is one RBLOCK of 8-byte LPIDs after an 8-byte count",
                self.max_batch_pages
            )));
        }
        if self.eblocks_per_lun < 8 {
            return Err(OxError::Config(format!(
                "eblocks_per_lun = {} is too small: each LUN needs room for open HOT, COLD, log and table blocks and a GC reserve",
                self.eblocks_per_lun
            )));
        }
        // The FTL's own EBLOCKs (`reserved_eblocks`) come out of the flash before the
        // logical space; the rest must hold every logical page once.
        let data_rblocks = (self.eblocks_total() as u64).saturating_sub(self.reserved_eblocks())
            * self.terms.rblocks_per_eblock() as u64;
        if self.logical_pages == 0 || self.logical_pages > data_rblocks {
            return Err(OxError::Config(format!(
                "logical_pages = {} must lie in 1..={data_rblocks}: the RBLOCKs left after the {} EBLOCKs \
                 the FTL keeps for itself (system blocks, 4 open EBLOCKs per LUN, 2 × luns_per_channel + 2 \
                 free EBLOCKs per channel held back from user writes, the log and table pages between \
                 checkpoints, and 2 EBLOCKs per channel of GC margin)",
                self.logical_pages,
                self.reserved_eblocks()
            )));
        }
        let gc = &self.gc;
        if !(0.0 < gc.stop_used_fraction
            && gc.stop_used_fraction <= gc.start_used_fraction
            && gc.start_used_fraction < 1.0)
        {
            return Err(OxError::Config(format!(
                "gc fractions must satisfy 0 < stop ({}) <= start ({}) < 1",
                gc.stop_used_fraction, gc.start_used_fraction
            )));
        }
        if !((0.0..=1.0).contains(&gc.min_invalid_fraction)
            && gc.min_invalid_relax_from_used_fraction > 0.0
            && gc.min_invalid_relax_from_used_fraction < 1.0)
        {
            return Err(OxError::Config(format!(
                "gc.min_invalid_fraction = {} must lie in [0, 1] and \
                 gc.min_invalid_relax_from_used_fraction = {} in (0, 1)",
                gc.min_invalid_fraction, gc.min_invalid_relax_from_used_fraction
            )));
        }
        if self.checkpoint.enabled && self.checkpoint.interval_ns == 0 {
            return Err(OxError::Config(
                "checkpoint.interval_ns must be positive".into(),
            ));
        }
        let batch_bytes = self.max_batch_bytes();
        let wc = &self.write_cache;
        if wc.capacity_bytes != 0 {
            if wc.capacity_bytes < batch_bytes {
                return Err(OxError::Config(format!(
                    "write_cache.capacity_bytes = {} must hold the largest batch ({} pages of {} bytes = {batch_bytes} bytes)",
                    wc.capacity_bytes, self.max_batch_pages, self.terms.rblock_bytes
                )));
            }
            let limit = self.write_cache_limit_bytes();
            if wc.capacity_bytes > limit {
                return Err(OxError::Config(format!(
                    "write_cache.capacity_bytes = {} exceeds {limit} bytes, a quarter of the over-provisioned flash: \
                     every write in the cache holds WBLOCKs that GC cannot collect until it installs (0 takes the limit)",
                    wc.capacity_bytes
                )));
            }
        }
        let c = &self.costs;
        if c.cores == 0 || !(c.link_mb_s.is_finite() && c.link_mb_s > 0.0) || c.packet_bytes == 0 {
            return Err(OxError::Config(
                "costs: cores, link_mb_s and packet_bytes must be positive".into(),
            ));
        }
        // Every cost is a step of simulated time, and the link a bandwidth, under the
        // workspace's bounds: beyond them the clock's sums overflow (a page cost of i64::MAX
        // did, in a context's CPU time) or one command takes years of simulated time.
        for (name, ns) in [
            ("costs.command_cpu_ns", c.command_cpu_ns),
            ("costs.context_cpu_ns", c.context_cpu_ns),
            ("costs.log_record_cpu_ns", c.log_record_cpu_ns),
            ("costs.page_cpu_ns", c.page_cpu_ns),
            ("costs.map_update_ns", c.map_update_ns),
            ("costs.transport_latency_ns", c.transport_latency_ns),
            ("checkpoint.interval_ns", self.checkpoint.interval_ns),
        ] {
            afa_sim::check_step_ns(name, ns).map_err(OxError::Config)?;
        }
        afa_sim::check_bandwidth_mb_s("costs.link_mb_s", c.link_mb_s).map_err(OxError::Config)?;
        Ok(())
    }

    /// Bytes of the largest batch's pages.
    fn max_batch_bytes(&self) -> u64 {
        self.max_batch_pages as u64 * self.terms.rblock_bytes as u64
    }

    /// The largest write cache allowed: a quarter of the spare flash, the flash that neither
    /// the logical pages, the system blocks, the open EBLOCKs nor two EBLOCKs per LUN need.
    /// Admitted writes hold WBLOCKs that GC cannot collect until they install, and a cache
    /// holding a large share of the spare flash leaves GC and the log without free EBLOCKs:
    /// on the tests' 40 MiB device (21 MiB spare), writing at a queue depth of 64, a cache of
    /// the whole spare ran every channel out of free EBLOCKs in 8 seeds of 8, three quarters
    /// of it in 1 of 8, 60% and half of it in none. A quarter keeps a factor of two from that.
    ///
    /// The spare is measured as it was for that calibration, not against the larger
    /// `reserved_eblocks` of today: that cut the key-value experiments' cache from 11 MiB to
    /// 2 MiB and their batch host's write-heavy throughput by a sixth. At the largest
    /// `logical_pages` the cache still holds at least a batch, and
    /// `largest_logical_space_soak` runs there with it.
    pub fn write_cache_limit_bytes(&self) -> u64 {
        let luns = (self.channels * self.luns_per_channel) as u64;
        let calibrated_reserve = self.channels as u64 + 2 + luns * 4 + luns * 2;
        let data_bytes = (self.eblocks_total() as u64).saturating_sub(calibrated_reserve)
            * self.terms.eblock_bytes as u64;
        let spare = data_bytes.saturating_sub(self.logical_pages * self.terms.rblock_bytes as u64);
        spare / 4
    }

    /// The write cache's capacity in effect (`capacity_bytes`, or the limit when 0).
    pub fn write_cache_capacity_bytes(&self) -> u64 {
        match self.write_cache.capacity_bytes {
            0 => self.write_cache_limit_bytes().max(self.max_batch_bytes()),
            n => n,
        }
    }

    /// EBLOCKs that never hold logical data, and so the over-provisioning the FTL needs:
    ///
    /// - the system blocks: a bad-block table per channel and two checkpoint blocks;
    /// - one open EBLOCK per LUN for each of the four write streams (after a power loss the
    ///   partly written ones are closed and new ones opened);
    /// - the free EBLOCKs the provisioner holds back from user writes in every channel,
    ///   `2 × luns_per_channel + 2` (`Provisioner::reserve_eblocks`): GC copies and the
    ///   log and table streams live on them;
    /// - the log and table streams' EBLOCKs between checkpoints
    ///   (`meta_reserve_eblocks`);
    /// - a GC margin of two EBLOCKs per channel: with every logical page written and all of
    ///   the above in use, this much flash still holds only stale RBLOCKs, so that GC always
    ///   finds victims and each pass gives back more than its copies and its MAP updates
    ///   (a dirty MAP page pushed out of the cache is a table page written) take.
    ///
    /// This used to count two reserve EBLOCKs per LUN and nothing for the META streams or
    /// for GC, fewer than the provisioner holds back alone; at the largest `logical_pages`
    /// it accepted, the log and table EBLOCKs written between checkpoints took the last
    /// free EBLOCKs, GC could not move a victim's pages, and writes failed with `NoSpace`.
    /// The margins counted per channel (GC's, and the META streams' growth between
    /// checkpoints) held on six geometries of one to eight LUNs per channel, filled to the
    /// bound and overwritten twice at iodepths 1, 16 and 64. Counted per LUN they left the
    /// key-value experiments' quick device (8 channels of 2 LUNs, 256 EBLOCKs) room for
    /// 5,888 logical pages, fewer than the 7,920 it exposes; counted per channel, 9,984.
    pub fn reserved_eblocks(&self) -> u64 {
        let luns = (self.channels * self.luns_per_channel) as u64;
        let system = self.channels as u64 + 2;
        let open = luns * 4;
        let held_back = self.channels as u64 * (2 * self.luns_per_channel as u64 + 2);
        let gc_margin = self.channels as u64 * 2;
        system + open + held_back + self.meta_reserve_eblocks() + gc_margin
    }

    /// EBLOCKs reserved for the log and the table pages.
    ///
    /// Two per channel cover what the two META streams write between checkpoints: a
    /// checkpoint starts early once the EBLOCKs it would give back reach one per channel and
    /// a channel runs short of free EBLOCKs (`checkpoint_if_space_is_short`), and the second
    /// covers what they write while it runs.
    ///
    /// The rest holds the table pages the current tables and the durable checkpoint point
    /// at, twice over. The table stream stripes its pages over every LUN, and an EBLOCK goes
    /// only once no current or durable page is left in it, so the pages can be spread thin;
    /// but a checkpoint rewrites the live pages of a table EBLOCK that holds a quarter of its
    /// WBLOCKs or fewer, so outside the open EBLOCKs (one per LUN) no more than
    /// `4 × table pages / WBLOCKs per EBLOCK` stay pinned; on a small device one EBLOCK per
    /// table page is the lower bound.
    pub fn meta_reserve_eblocks(&self) -> u64 {
        let luns = (self.channels * self.luns_per_channel) as u64;
        let pages = self.table_pages();
        let spread = (4 * pages).div_ceil(self.terms.wblocks_per_eblock() as u64) + luns;
        2 * self.meta_trigger_eblocks() + 2 * pages.min(spread)
    }

    /// The table pages a checkpoint reaches (MAP, MAP_S, GBITV, GBITV_S and WEAR), counted
    /// for a MAP that covers the whole flash, since `logical_pages` is bounded by this.
    pub fn table_pages(&self) -> u64 {
        let wb = self.terms.wblock_bytes as u64;
        let eblocks = self.eblocks_total() as u64;
        let entries = wb / 8;
        let map = (eblocks * self.terms.rblocks_per_eblock() as u64).div_ceil(entries);
        let map_s = map.div_ceil((entries / 2).max(1));
        let words_per_eblock = (self.terms.rblocks_per_eblock() as u64).div_ceil(64);
        let gbitv = eblocks.div_ceil((entries / words_per_eblock).max(1));
        let gbitv_s = gbitv.div_ceil(entries);
        let wear = eblocks.div_ceil(wb / 4);
        map + map_s + gbitv + gbitv_s + wear
    }

    /// Over-provisioning the checkpoint trigger counts on: half of what the META streams
    /// write between checkpoints (see `meta_reserve_eblocks`).
    pub(crate) fn meta_trigger_eblocks(&self) -> u64 {
        self.channels as u64
    }
}
