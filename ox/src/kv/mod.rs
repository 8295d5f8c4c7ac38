//! The host key-value store of §8: a B-tree of fixed 4 KiB pages updated in place (the
//! paper's modified Bw-tree), a host page cache limited to a fraction of the data set, and a
//! 1 MiB write buffer, on either interface:
//!
//! - **Batch** (BwTree_Batch): the host keeps only its cache; a full write buffer goes to the
//!   SSD as one `flush_batch` (a DESC block and 255 LPAGEs); reads are `read_lpid`.
//! - **Block** (BwTree_Block): the host does LLAMA-like log structuring itself: a map from
//!   LPID to LBA, a circular log of 1 MiB segments written with block writes (each arrives
//!   as 17 packets and so 17 write contexts in OXBlock), host GC that reads the segment at
//!   the head of the log back and re-appends its live pages, and host checkpoints of its map.
//!
//! The host runs one thread (as in the paper). Its CPU time per operation is modelled:
//! a fixed cost per YCSB operation, a cost per device command, per page copied into the
//! write buffer, and — on the block interface only — per page mapped, per page examined by
//! host GC and per map entry checkpointed. A read miss waits for the device; flushes run in
//! the background, at most `max_outstanding_flushes` at a time.
//!
//! The content of a page is its (LPID, version): the device stores the token of that pair,
//! and every page read from the device is checked against the version the host last wrote
//! (the oracle); each record's value version is also checked on every YCSB read.

use std::collections::{BTreeMap, BTreeSet};

use afa_nand::sector_token;
use afa_sim::{TimeNs, NS_PER_S};
use serde::{Deserialize, Serialize};

use crate::page_lru::PageLru;
use images::{FlushHeader, PageImage, PageImages};

mod device;
mod images;
mod recovery;
#[cfg(test)]
mod recovery_tests;

use crate::ycsb::{Workload, Ycsb, YcsbOp, KEY_BYTES, VALUE_BYTES};
use crate::{BatchBuffer, OxConfig, OxController, OxError, OxStats, Request, RequestId};
pub use device::{ConventionalSsd, KvDevice};
pub use recovery::{KvPoweredOff, KvRecoveryReport};

/// Which storage interface the host uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Interface {
    Batch,
    Block,
}

/// The host's CPU costs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HostCosts {
    /// Index traversal, key search and record copy of one YCSB operation.
    pub op_cpu_ns: u64,
    /// Issuing one device command and handling its completion (NVMe-oF/TCP on the host).
    pub io_cpu_ns: u64,
    /// Copying one page into the write buffer.
    pub page_copy_cpu_ns: u64,
    /// Block interface: maintaining the LPID → LBA map for one page written.
    pub map_update_cpu_ns: u64,
    /// Block interface: looking a missing page's LBA up in the LPID → LBA map before it is
    /// read. The batch host skips this: it reads by LPID (§1.2, "it merely needs to know if a
    /// page is cached"). One access to DRAM: the paper's map of 10 M pages (80 MB) is far
    /// larger than the host CPU's 10 MB last-level cache.
    pub map_lookup_cpu_ns: u64,
    /// Block interface: host GC work per page of a cleaned segment (parse, liveness check).
    /// The paper gives no figure for it but the share of host CPU it adds up to (Figure
    /// 15(b): about 10% in write-heavy at 50% cache), so it is calibrated to that: 400 ns
    /// measures 9.7–9.8% at the quick scale (`ox-fig15`). It hardly moves throughput, which waits on the device:
    /// 1,200 ns measured 22% of the CPU at 1% lower throughput.
    pub gc_page_cpu_ns: u64,
    /// Block interface: host checkpoint work per map entry written.
    pub ckpt_entry_cpu_ns: u64,
}

impl Default for HostCosts {
    fn default() -> Self {
        Self {
            op_cpu_ns: 1_800,
            io_cpu_ns: 5_000,
            page_copy_cpu_ns: 400,
            map_update_cpu_ns: 300,
            map_lookup_cpu_ns: 100,
            gc_page_cpu_ns: 400,
            ckpt_entry_cpu_ns: 15,
        }
    }
}

/// The key-value store and its device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvConfig {
    pub interface: Interface,
    /// Records loaded before the measured phase.
    pub records: u64,
    /// Host page cache as a fraction of the data set's pages.
    pub cache_fraction: f64,
    pub write_buffer_bytes: u64,
    pub max_outstanding_flushes: usize,
    /// Page reads the host keeps in flight (LLAMA's asynchronous I/O queue, §8.1.2): a
    /// missing page is requested and the thread goes on; it waits only when this many are
    /// outstanding.
    pub max_outstanding_reads: usize,
    pub costs: HostCosts,
    /// Block interface: host GC starts when this fraction of the log's segments is used …
    pub host_gc_start_used_fraction: f64,
    /// … and stops below this one.
    pub host_gc_stop_used_fraction: f64,
    /// Block interface: LLAMA's log cleaning runs at all. Off, the log must hold every page
    /// the run writes (the paper's non-durable configuration of Figure 15, which runs
    /// without host checkpoints and GC; [`KvConfig::non_durable`] sizes the device for it),
    /// and a log that fills fails the run with `NoSpace`.
    #[serde(default = "host_gc_default")]
    pub host_gc: bool,
    /// Block interface: time between host checkpoints of the LPID → LBA map (0: none).
    pub host_checkpoint_interval_ns: u64,
    /// Block interface: trim a segment once host GC freed it.
    pub host_trim: bool,
    /// Write-back page cache: a changed page stays dirty in the cache and goes to the write
    /// buffer only when it is evicted (or at the end of the load), so updates to a cached
    /// page coalesce and a larger cache writes less — as the paper's Table 3 shows, where
    /// user writes per operation fall about five-fold from 20% to 80% cache. Without it,
    /// every change copies the page into the write buffer at once (write-through).
    #[serde(default)]
    pub write_back: bool,
    /// Keep what every page written to the device holds (B-tree nodes with their flush
    /// headers, map pages and checkpoint records of the block host) beside the tokens the
    /// device stores, so that [`KvStore::recover`] can rebuild the store after a power loss.
    /// It costs host memory, not simulated time: runs are the same with it on or off.
    #[serde(default)]
    pub page_images: bool,
    pub device: OxConfig,
}

/// The fraction of MAP the controller's DRAM caches in [`KvConfig::scaled`] devices. The
/// paper does not give OX's MAP cache size; a fifth was calibrated against the paper's
/// read-heavy gap at the quick scale (and left unchanged since), stated as a fraction so that
/// every scale caches the same share. It was calibrated before the controller's single read
/// thread (`costs.read_lookup_threads`) made each MAP miss hold up the reads behind it, so it
/// now weighs more than it did; docs/ox.md has the sensitivity.
pub const MAP_CACHE_FRACTION: f64 = 0.2;

/// Records per 4 KiB leaf and separators per 4 KiB inner page (32-byte page header).
pub const PAGE_BYTES: u64 = 4096;
const PAGE_HEADER_BYTES: u64 = 32;
pub const LEAF_CAPACITY: usize =
    ((PAGE_BYTES - PAGE_HEADER_BYTES) / (KEY_BYTES + VALUE_BYTES) as u64) as usize;
pub const INNER_CAPACITY: usize = ((PAGE_BYTES - PAGE_HEADER_BYTES) / 16) as usize;

/// The device's logical capacity over the data set's size (§8.2.3: "the SSD capacity was
/// limited to 10 times larger than the dataset size"). The data set is what §8.1.3 defines
/// it to be: the records, an 8-byte key and a 100-byte payload each (10 M records, 1.08 GB
/// in the paper) — not the B-tree pages that hold them, which are about 1.5 times larger
/// (leaves 69% full, 32-byte page headers, inner pages).
pub const DEVICE_TO_DATA_SET_RATIO: f64 = 10.0;

impl KvConfig {
    /// A configuration for `records` records with the device scaled as in §8.2.3: the SSD's
    /// logical capacity [`DEVICE_TO_DATA_SET_RATIO`] times the data set, 30%
    /// over-provisioning, GC at 50% used.
    pub fn scaled(records: u64, interface: Interface, cache_fraction: f64) -> KvConfig {
        Self::scaled_with_ratio(records, interface, cache_fraction, DEVICE_TO_DATA_SET_RATIO)
    }

    /// [`KvConfig::scaled`] with the device `device_to_data_set` times the data set.
    pub fn scaled_with_ratio(
        records: u64,
        interface: Interface,
        cache_fraction: f64,
        device_to_data_set: f64,
    ) -> KvConfig {
        let data_set_bytes = records * (KEY_BYTES + VALUE_BYTES) as u64;
        let data_set_pages = data_set_bytes.div_ceil(PAGE_BYTES);
        let logical_pages = (data_set_pages as f64 * device_to_data_set).ceil() as u64;
        let mut device = OxConfig {
            terms: crate::FlashTerms {
                eblock_bytes: 512 * 1024,
                ..crate::FlashTerms::default()
            },
            channels: 8,
            luns_per_channel: 2,
            ..OxConfig::default()
        };
        let rblocks_per_eblock = device.terms.rblocks_per_eblock() as u64;
        let luns = (device.channels * device.luns_per_channel) as u64;
        let physical_rblocks = logical_pages * 13 / 10;
        // Six EBLOCKs per LUN on top of the 30% for the open and reserved ones, and more if
        // the FTL's reserve (`OxConfig::reserved_eblocks`) would not leave room for the
        // logical pages: a small device with many LUNs holds back more.
        let mut per_lun = (physical_rblocks.div_ceil(rblocks_per_eblock * luns) + 6).max(16);
        loop {
            device.eblocks_per_lun = per_lun as u32;
            let data_eblocks =
                (device.eblocks_total() as u64).saturating_sub(device.reserved_eblocks());
            if data_eblocks * rblocks_per_eblock >= logical_pages {
                break;
            }
            per_lun += 1;
        }
        device.logical_pages = logical_pages;
        // The controller caches a fifth of MAP (MAP_CACHE_FRACTION): the batch host's LPIDs
        // are dense and their MAP pages stay cached, while the block host's LLAMA log spreads
        // its LBAs over the whole device, so its reads miss the MAP cache and wait for a MAP
        // page, and OX's one read thread holds every read behind it while it does — the
        // read-path cost that gives the paper's read-heavy gap (docs/ox.md).
        let map_pages = (logical_pages * 8).div_ceil(device.terms.wblock_bytes as u64);
        device.map_cache_pages = ((map_pages as f64 * MAP_CACHE_FRACTION).ceil() as u32).max(2);
        device.max_batch_pages = 255;
        device.checkpoint.interval_ns = NS_PER_S / 2;
        device.gc.start_used_fraction = 0.5;
        device.gc.stop_used_fraction = 0.45;
        KvConfig {
            interface,
            records,
            cache_fraction,
            write_buffer_bytes: 1024 * 1024,
            max_outstanding_flushes: 2,
            max_outstanding_reads: 32,
            costs: HostCosts::default(),
            host_gc_start_used_fraction: 0.5,
            host_gc_stop_used_fraction: 0.45,
            host_gc: true,
            host_checkpoint_interval_ns: NS_PER_S / 2,
            host_trim: true,
            write_back: false,
            page_images: false,
            device,
        }
    }

    /// The paper's non-durable block configuration (Figure 15's dotted line): the block host
    /// without checkpoints or log cleaning, on a device whose logical capacity holds the
    /// load and `ops` operations' pages without reusing a segment. The device is otherwise
    /// the durable configuration's: the same flash terms, GC and checkpoint settings, and
    /// the same MAP cache in pages (the same controller DRAM), so that only the host's
    /// durability work differs between the two runs.
    pub fn non_durable(records: u64, cache_fraction: f64, ops: u64) -> KvConfig {
        let mut cfg = KvConfig::holding_every_write(records, Interface::Block, cache_fraction, ops);
        cfg.host_gc = false;
        cfg.host_checkpoint_interval_ns = 0;
        cfg
    }

    /// [`KvConfig::scaled`] on a device whose logical capacity holds the load and `ops`
    /// operations' pages without reusing a segment or an LPAGE's old flash, so that a run
    /// with GC off (on the host, the device or both) never runs out of space. The MAP cache
    /// keeps the scaled device's size in pages (the same controller DRAM), so that a run on
    /// this device differs from one on the scaled device only in what it reclaims.
    pub fn holding_every_write(
        records: u64,
        interface: Interface,
        cache_fraction: f64,
        ops: u64,
    ) -> KvConfig {
        let scaled = KvConfig::scaled(records, interface, cache_fraction);
        let data_set_pages = (records * (KEY_BYTES + VALUE_BYTES) as u64).div_ceil(PAGE_BYTES);
        // With the write-through cache every insert of the load and every operation of the
        // run writes at most its leaf page, plus the pages its splits change (a split in a
        // few dozen inserts; the B-tree is about 1.5 times the data set). A quarter more
        // covers the host map's checkpoint area at the end of the LBA space and the
        // segments' rounding; on the device, the 30% over-provisioning holds the log.
        let changes = records + ops;
        let written_pages = changes + changes / 8 + 2 * data_set_pages;
        let ratio = (written_pages * 5 / 4) as f64 / data_set_pages as f64;
        let mut cfg =
            KvConfig::scaled_with_ratio(records, interface, cache_fraction, ratio.max(10.0));
        cfg.device.map_cache_pages = scaled.device.map_cache_pages;
        cfg
    }

    pub fn validate(&self) -> Result<(), OxError> {
        if self.records == 0 {
            return Err(OxError::KvConfig("records must be positive".into()));
        }
        if !(self.cache_fraction > 0.0 && self.cache_fraction <= 1.0) {
            return Err(OxError::KvConfig(format!(
                "cache_fraction = {} must lie in (0, 1]",
                self.cache_fraction
            )));
        }
        if self.write_buffer_bytes < 2 * PAGE_BYTES
            || self.max_outstanding_flushes == 0
            || self.max_outstanding_reads == 0
        {
            return Err(OxError::KvConfig(
                "the write buffer must hold at least two pages and one flush must be allowed"
                    .into(),
            ));
        }
        if !(0.0 < self.host_gc_stop_used_fraction
            && self.host_gc_stop_used_fraction <= self.host_gc_start_used_fraction
            && self.host_gc_start_used_fraction < 1.0)
        {
            return Err(OxError::KvConfig(
                "host GC fractions must satisfy 0 < stop <= start < 1".into(),
            ));
        }
        if self.page_images && self.write_back {
            return Err(OxError::KvConfig(
                "page_images needs the write-through cache: a write-back cache sends pages \
                 to the device one eviction at a time, so the device never holds the B-tree \
                 as one operation boundary left it"
                    .into(),
            ));
        }
        self.device.validate()
    }
}

#[derive(Debug, Clone)]
enum Node {
    Leaf { keys: Vec<u64>, vals: Vec<u32> },
    Inner { keys: Vec<u64>, children: Vec<u64> },
}

/// Host-side counters of one run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct KvStats {
    pub ops: u64,
    pub reads: u64,
    pub updates: u64,
    pub inserts: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Page reads issued to the device for cache misses.
    pub user_read_bytes: u64,
    /// Pages flushed for updates and inserts (host GC relocations excluded).
    pub user_write_bytes: u64,
    pub flushes: u64,
    pub host_gc_read_bytes: u64,
    pub host_gc_write_bytes: u64,
    pub host_gc_reclaimed_bytes: u64,
    pub host_gc_segments: u64,
    pub host_checkpoints: u64,
    pub host_checkpoint_bytes: u64,
    /// Pages read from the device whose token was not the version the host wrote.
    pub mismatches: u64,
    /// Host CPU time by purpose.
    pub cpu_op_ns: u64,
    pub cpu_io_ns: u64,
    pub cpu_gc_ns: u64,
    pub cpu_ckpt_ns: u64,
    /// Host time spent waiting: for a free flush slot, for the read queue, for host GC reads.
    pub wait_flush_ns: u64,
    pub wait_read_ns: u64,
    pub wait_gc_ns: u64,
    pub elapsed_ns: u64,
}

/// The result of one measured phase.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KvRun {
    pub ops_per_s: f64,
    pub host: KvStats,
    /// The device's counters over the measured phase.
    pub device: OxStatsSummary,
    /// Operations completed in each [`TIMELINE_INTERVAL_NS`] of the phase, in order (the
    /// last interval is usually partial): Figure 15(a)'s throughput over time.
    pub ops_per_interval: Vec<u64>,
}

/// The width of one interval of [`KvRun::ops_per_interval`].
pub const TIMELINE_INTERVAL_NS: u64 = NS_PER_S / 10;

impl KvRun {
    /// The coefficient of variation (standard deviation over mean) of the throughput of the
    /// whole intervals: 0 for a constant rate. `None` with fewer than two whole intervals.
    pub fn throughput_variation(&self) -> Option<f64> {
        let whole = self.ops_per_interval.len().checked_sub(1)?;
        if whole < 2 {
            return None;
        }
        let counts = &self.ops_per_interval[..whole];
        let mean = counts.iter().sum::<u64>() as f64 / whole as f64;
        if mean == 0.0 {
            return None;
        }
        let variance = counts
            .iter()
            .map(|&c| (c as f64 - mean).powi(2))
            .sum::<f64>()
            / whole as f64;
        Some(variance.sqrt() / mean)
    }

    /// The share of the host's CPU time spent on log cleaning.
    pub fn gc_cpu_share(&self) -> f64 {
        let h = &self.host;
        let total = h.cpu_op_ns + h.cpu_io_ns + h.cpu_gc_ns + h.cpu_ckpt_ns;
        h.cpu_gc_ns as f64 / total.max(1) as f64
    }
}

/// The device counters a report needs (Table 3).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct OxStatsSummary {
    pub user_read_bytes: u64,
    pub user_write_bytes: u64,
    pub gc_read_bytes: u64,
    pub gc_write_bytes: u64,
    pub gc_reclaimed_bytes: u64,
    pub done_records: u64,
    pub contexts: u64,
    pub write_command_bytes: u64,
    pub checkpoints: u64,
    /// Write contexts that waited for GC to free space (every channel closed or full).
    pub stalled_contexts: u64,
    pub gc_victims: u64,
    /// MAP pages read from flash because the controller's MAP cache missed.
    pub map_page_loads: u64,
    /// Dirty MAP pages written to make room for a MAP page being loaded.
    pub map_page_evictions_written: u64,
    pub read_commands: u64,
    /// Sum of read command latencies, submission to completion.
    pub read_latency_ns_total: u64,
    /// Sum over read commands of the wait for their MAP entries.
    pub read_map_wait_ns_total: u64,
    /// Read commands that waited for their MAP entries (the read thread or a MAP page).
    pub read_map_miss_commands: u64,
    /// Sum over read commands of the time from MAP ready to the last RBLOCK read.
    pub read_flash_ns_total: u64,
    /// Sum of the MAP page loads' times, need to page in DRAM.
    pub map_page_load_ns_total: u64,
}

impl OxStatsSummary {
    fn delta(a: &OxStats, b: &OxStats) -> OxStatsSummary {
        OxStatsSummary {
            user_read_bytes: b.user_read_bytes - a.user_read_bytes,
            user_write_bytes: b.user_write_bytes - a.user_write_bytes,
            gc_read_bytes: b.gc_read_bytes - a.gc_read_bytes,
            gc_write_bytes: b.gc_write_bytes - a.gc_write_bytes,
            gc_reclaimed_bytes: b.gc_reclaimed_bytes - a.gc_reclaimed_bytes,
            done_records: b.done_records - a.done_records,
            contexts: b.contexts - a.contexts,
            write_command_bytes: b.write_command_bytes - a.write_command_bytes,
            map_page_loads: b.map_page_loads - a.map_page_loads,
            map_page_evictions_written: b.map_page_evictions_written - a.map_page_evictions_written,
            read_commands: b.read_commands - a.read_commands,
            read_latency_ns_total: b.read_latency_ns_total - a.read_latency_ns_total,
            read_map_wait_ns_total: b.read_map_wait_ns_total - a.read_map_wait_ns_total,
            read_map_miss_commands: b.read_map_miss_commands - a.read_map_miss_commands,
            read_flash_ns_total: b.read_flash_ns_total - a.read_flash_ns_total,
            map_page_load_ns_total: b.map_page_load_ns_total - a.map_page_load_ns_total,
            checkpoints: b.checkpoints - a.checkpoints,
            stalled_contexts: b.stalled_contexts - a.stalled_contexts,
            gc_victims: b.gc_victims - a.gc_victims,
        }
    }
}

const NONE: u64 = u64::MAX;

fn host_gc_default() -> bool {
    true
}

/// What a flush in flight carried.
#[derive(Debug, Clone, Default)]
struct InFlight {
    lpids: Vec<u64>,
    /// The version of each page the write carries.
    versions: Vec<u64>,
    /// The flush's number (`None` for trims and checkpoint writes).
    flush: Option<u64>,
    /// Block interface: the LBA each page had before this flush, so a host checkpoint can
    /// record the map as the acknowledged flushes left it.
    old_lbas: Vec<u64>,
}

/// A block-host checkpoint whose map pages are on their way; its record is written once
/// they are all acknowledged, so a record on the device always finds its map pages there.
#[derive(Debug, Clone)]
struct CheckpointInFlight {
    record: images::CheckpointRecord,
    /// Map page writes not yet acknowledged.
    outstanding: BTreeSet<RequestId>,
    /// The record's write, once submitted.
    record_write: Option<RequestId>,
}

/// The store, on an OX controller unless said otherwise.
#[derive(Debug)]
pub struct KvStore<D: KvDevice = OxController> {
    cfg: KvConfig,
    dev: D,
    now_ns: TimeNs,
    nodes: Vec<Node>,
    /// Version of every page as last modified, and as last handed to the device.
    version: Vec<u64>,
    flushed_version: Vec<u64>,
    /// Version of every page as last acknowledged by the device: what a power loss must
    /// leave on it.
    durable_version: Vec<u64>,
    root: u64,
    /// The records and their value versions: the oracle of the KV level.
    records: BTreeMap<u64, u32>,
    cache_capacity: usize,
    /// The pages in the host cache, in recency order.
    cache: PageLru,
    buffer: Vec<u64>,
    in_buffer: BTreeSet<u64>,
    buffer_capacity: usize,
    /// Write-back cache: pages changed since they last went to the write buffer.
    dirty: Vec<bool>,
    /// Write-back cache: dirty pages the cache evicted, on their way to the write buffer.
    evicted_dirty: Vec<u64>,
    inflight: BTreeMap<RequestId, InFlight>,
    inflight_pages: BTreeMap<u64, u32>,
    /// Page reads in flight: the token each must return.
    pending_reads: BTreeMap<RequestId, u64>,
    // Block interface: LLAMA.
    lba_of: Vec<u64>,
    seg_pages: u64,
    segments: u64,
    seg_slots: Vec<Vec<u64>>,
    seg_live: Vec<u32>,
    free_segs: std::collections::VecDeque<u64>,
    /// Segments cleaned whose live pages are not yet durable in their new place, oldest
    /// first, each with the number of the flush that carries those pages (the next one
    /// after the cleaning: it writes the whole buffer). Until that flush is acknowledged the
    /// old copies are the only durable ones, so the segment is neither trimmed nor reused.
    cleaned: std::collections::VecDeque<(u64, u64)>,
    /// Number of the next flush, and the flushes submitted but not yet acknowledged.
    next_flush: u64,
    flushes_in_flight: BTreeSet<u64>,
    /// A flush has taken the buffer's pages but is not submitted yet (it is finding a
    /// segment, which may clean one): pages buffered meanwhile go in the flush after it.
    assembling_flush: bool,
    log_order: std::collections::VecDeque<u64>,
    /// The flush each segment holds (`NONE` for a free or cleaned one).
    seg_flush: Vec<u64>,
    /// Pages host GC took out of a cleaned segment that wait in the write buffer for their
    /// new place, with the LBA they had: still their durable copy.
    relocating: BTreeMap<u64, u64>,
    /// Pages of the flush being assembled: host GC leaves them to it.
    assembling_lpids: BTreeSet<u64>,
    /// The header of the newest flush every flush up to which is acknowledged.
    acked_header: Option<FlushHeader>,
    /// Headers of flushes in flight, by number.
    inflight_headers: BTreeMap<u64, FlushHeader>,
    /// Levels of the B-tree (a leaf root is one).
    depth: u64,
    ckpt_base_lba: u64,
    map_pages: u64,
    /// Number of the next host checkpoint, the halves of the checkpoint area the newest
    /// submitted record points at, and the checkpoint under way.
    ckpt_seq: u64,
    ckpt_halves: Vec<Option<u8>>,
    ckpt_in_flight: Option<CheckpointInFlight>,
    dirty_map_pages: BTreeSet<u64>,
    /// What the device's pages hold (`KvConfig::page_images`).
    images: Option<PageImages>,
    next_ckpt_ns: TimeNs,
    in_gc: bool,
    stats: KvStats,
}

impl KvStore {
    /// Formats a device and builds an empty store.
    pub fn new(cfg: KvConfig, seed: u64) -> Result<KvStore, OxError> {
        cfg.validate()?;
        let dev = OxController::format(&cfg.device, seed)?;
        let images = cfg
            .page_images
            .then(|| PageImages::new(cfg.device.logical_pages));
        KvStore::on_device(cfg, dev, images)?.with_root()
    }
}

impl KvStore<ConventionalSsd> {
    /// The block host on a conventional SSD of `ssd` (Figure 14's sanity check): the same
    /// host, its LLAMA log over the SSD's LBAs, `cfg.device` giving only the LBA space's
    /// size. Recovery is OX's, so `page_images` is refused.
    pub fn on_conventional(
        cfg: KvConfig,
        ssd: afa_ssd::SsdConfig,
        seed: u64,
    ) -> Result<KvStore<ConventionalSsd>, OxError> {
        cfg.validate()?;
        if cfg.interface != Interface::Block || cfg.page_images {
            return Err(OxError::KvConfig(
                "a conventional SSD serves the block interface, without page images".into(),
            ));
        }
        let dev = ConventionalSsd::new(ssd, cfg.device.logical_pages, seed)?;
        KvStore::on_device(cfg, dev, None)?.with_root()
    }
}

impl<D: KvDevice> KvStore<D> {
    /// The empty B-tree: one leaf, the root.
    fn with_root(mut self) -> Result<Self, OxError> {
        self.new_page(Node::Leaf {
            keys: Vec::new(),
            vals: Vec::new(),
        });
        self.touch(0);
        self.mark_modified(0)?;
        Ok(self)
    }

    /// A store with no pages over `dev`, its clock at the device's, keeping `images` of what
    /// the device's pages hold.
    fn on_device(cfg: KvConfig, dev: D, images: Option<PageImages>) -> Result<KvStore<D>, OxError> {
        let lp = cfg.device.logical_pages;
        let seg_pages = cfg.write_buffer_bytes / PAGE_BYTES;
        // The host checkpoint area sits at the end of the LBA space: two well-known LBAs
        // for the checkpoint records and room for two copies of the map of every LPID the
        // data set may use, so a checkpoint never overwrites a map page the newest record
        // points at with another page.
        let max_lpids = lp / 4;
        let map_pages = (max_lpids * 8).div_ceil(PAGE_BYTES);
        let ckpt_pages = map_pages * 2 + 2;
        let log_lbas = lp.saturating_sub(ckpt_pages);
        let segments = log_lbas / seg_pages;
        if cfg.interface == Interface::Block && segments < 4 {
            return Err(OxError::KvConfig(format!(
                "the device's {lp} logical pages leave only {segments} host log segments"
            )));
        }
        let buffer_capacity = match cfg.interface {
            // The DESC takes the first RBLOCK of the buffer.
            Interface::Batch => (seg_pages as usize - 1).min(cfg.device.max_batch_pages as usize),
            Interface::Block => seg_pages as usize,
        };
        Ok(KvStore {
            now_ns: dev.now_ns(),
            nodes: Vec::new(),
            version: Vec::new(),
            flushed_version: Vec::new(),
            durable_version: Vec::new(),
            root: 0,
            records: BTreeMap::new(),
            cache_capacity: usize::MAX,
            cache: PageLru::new(0),
            buffer: Vec::new(),
            in_buffer: BTreeSet::new(),
            buffer_capacity,
            dirty: Vec::new(),
            evicted_dirty: Vec::new(),
            inflight: BTreeMap::new(),
            inflight_pages: BTreeMap::new(),
            pending_reads: BTreeMap::new(),
            lba_of: Vec::new(),
            seg_pages,
            segments,
            seg_slots: vec![Vec::new(); segments as usize],
            seg_live: vec![0; segments as usize],
            free_segs: (0..segments).collect(),
            cleaned: std::collections::VecDeque::new(),
            next_flush: 0,
            flushes_in_flight: BTreeSet::new(),
            assembling_flush: false,
            log_order: std::collections::VecDeque::new(),
            seg_flush: vec![NONE; segments as usize],
            relocating: BTreeMap::new(),
            assembling_lpids: BTreeSet::new(),
            acked_header: None,
            inflight_headers: BTreeMap::new(),
            depth: 1,
            ckpt_base_lba: segments * seg_pages,
            map_pages,
            ckpt_seq: 0,
            ckpt_halves: vec![None; map_pages as usize],
            ckpt_in_flight: None,
            dirty_map_pages: BTreeSet::new(),
            images,
            next_ckpt_ns: dev.now_ns() + cfg.host_checkpoint_interval_ns,
            in_gc: false,
            stats: KvStats::default(),
            dev,
            cfg,
        })
    }

    pub fn device(&self) -> &D {
        &self.dev
    }
    pub fn stats(&self) -> &KvStats {
        &self.stats
    }
    pub fn now_ns(&self) -> TimeNs {
        self.now_ns
    }
    /// Pages of the B-tree.
    pub fn pages(&self) -> u64 {
        self.nodes.len() as u64
    }

    // ----- CPU and device ---------------------------------------------------------------

    fn cpu(&mut self, ns: u64, purpose: Purpose) {
        self.now_ns += ns;
        match purpose {
            Purpose::Op => self.stats.cpu_op_ns += ns,
            Purpose::Io => self.stats.cpu_io_ns += ns,
            Purpose::Gc => self.stats.cpu_gc_ns += ns,
            Purpose::Ckpt => self.stats.cpu_ckpt_ns += ns,
        }
    }

    fn submit(&mut self, req: Request) -> Result<RequestId, OxError> {
        let now = self.now_ns.max(self.dev.now_ns());
        self.now_ns = now;
        self.dev.submit(now, req)
    }

    /// Handles completions that arrived: acknowledged flushes leave the in-flight set, and a
    /// host checkpoint whose map pages are all acknowledged gets its record written.
    fn drain_completions(&mut self) -> Result<(), OxError> {
        for c in self.dev.take_completions() {
            if let Some(expect) = self.pending_reads.remove(&c.id) {
                if c.result?.first() != Some(&expect) {
                    self.stats.mismatches += 1;
                }
                continue;
            }
            if let Some(f) = self.inflight.remove(&c.id) {
                c.result?;
                if let Some(n) = f.flush {
                    self.flushes_in_flight.remove(&n);
                }
                for (&l, &v) in f.lpids.iter().zip(&f.versions) {
                    let durable = &mut self.durable_version[l as usize];
                    *durable = (*durable).max(v);
                }
                for l in f.lpids {
                    if let Some(n) = self.inflight_pages.get_mut(&l) {
                        *n -= 1;
                        if *n == 0 {
                            self.inflight_pages.remove(&l);
                        }
                    }
                }
            } else {
                c.result?;
            }
            if let Some(ck) = self.ckpt_in_flight.as_mut() {
                ck.outstanding.remove(&c.id);
                if ck.record_write == Some(c.id) {
                    self.ckpt_in_flight = None;
                }
            }
        }
        // The header of the newest flush with every flush before it acknowledged.
        let acked = self.acknowledged_flushes();
        while let Some((&n, &h)) = self.inflight_headers.first_key_value() {
            if n >= acked {
                break;
            }
            self.inflight_headers.remove(&n);
            self.acked_header = Some(h);
        }
        self.write_checkpoint_record()?;
        self.release_cleaned()
    }

    /// Flushes numbered below this one are all acknowledged.
    fn acknowledged_flushes(&self) -> u64 {
        self.flushes_in_flight
            .first()
            .copied()
            .unwrap_or(self.next_flush)
    }

    /// Frees (and trims) the cleaned segments whose relocated pages are durable in their
    /// new place: the flush that carries the last of them, and every flush before it, has
    /// been acknowledged (flushes may complete out of order).
    fn release_cleaned(&mut self) -> Result<(), OxError> {
        while let Some(&(seg, flush)) = self.cleaned.front() {
            let oldest_in_flight = self.flushes_in_flight.first().copied().unwrap_or(u64::MAX);
            if flush >= self.next_flush || oldest_in_flight <= flush {
                return Ok(());
            }
            self.cleaned.pop_front();
            self.free_segs.push_back(seg);
            if self.cfg.host_trim {
                self.cpu(self.cfg.costs.io_cpu_ns, Purpose::Gc);
                // The trim goes in the background, like a flush.
                let t = self.submit(Request::TrimBlocks {
                    lba: seg * self.seg_pages,
                    count: self.seg_pages as u32,
                })?;
                self.inflight.insert(t, InFlight::default());
            }
        }
        Ok(())
    }

    /// Waits for one request (a read, or the host GC's segment read).
    fn wait(&mut self, id: RequestId) -> Result<Vec<u64>, OxError> {
        let c = self.dev.run_until_complete(id)?;
        self.now_ns = self.now_ns.max(c.done_ns);
        self.drain_completions()?;
        c.result
    }

    /// Waits until fewer than `n` flushes are in flight.
    fn wait_flushes_below(&mut self, n: usize) -> Result<(), OxError> {
        let start = self.now_ns;
        let r = self.wait_flushes_below_inner(n);
        self.stats.wait_flush_ns += self.now_ns - start;
        r
    }

    fn wait_flushes_below_inner(&mut self, n: usize) -> Result<(), OxError> {
        while self.inflight.len() >= n {
            let Some(t) = self.dev.next_event_ns() else {
                let oldest = self.inflight.keys().next().copied().unwrap_or_default();
                return Err(OxError::Stuck(oldest));
            };
            self.dev.advance_to(t);
            self.now_ns = self.now_ns.max(t);
            self.drain_completions()?;
        }
        Ok(())
    }

    // ----- the page cache ---------------------------------------------------------------

    fn touch(&mut self, lpid: u64) {
        self.cache.touch(lpid);
        while self.cache.len() > self.cache_capacity {
            let victim = self.cache.pop_lru().expect("non-empty");
            if std::mem::take(&mut self.dirty[victim as usize]) {
                self.evicted_dirty.push(victim);
            }
        }
    }

    /// Write-back cache: moves the dirty pages the cache evicted into the write buffer.
    fn write_back_evicted(&mut self) -> Result<(), OxError> {
        while !self.evicted_dirty.is_empty() {
            let pages = std::mem::take(&mut self.evicted_dirty);
            for l in pages {
                self.buffer_page(l)?;
            }
        }
        Ok(())
    }

    /// Write-back cache: every dirty page goes to the write buffer.
    fn write_back_all(&mut self) -> Result<(), OxError> {
        let dirty: Vec<u64> = (0..self.dirty.len() as u64)
            .filter(|&l| self.dirty[l as usize])
            .collect();
        for l in dirty {
            self.dirty[l as usize] = false;
            self.buffer_page(l)?;
        }
        self.write_back_evicted()
    }

    /// Makes a page resident: a hit, a copy still in host memory (buffer or flush in
    /// flight), or a read from the device, checked against the version the host wrote.
    fn access(&mut self, lpid: u64) -> Result<(), OxError> {
        if self.cache.contains(lpid) {
            self.stats.cache_hits += 1;
            self.touch(lpid);
            return Ok(());
        }
        self.stats.cache_misses += 1;
        if self.in_buffer.contains(&lpid)
            || self.inflight_pages.contains_key(&lpid)
            || self.evicted_dirty.contains(&lpid)
        {
            self.touch(lpid);
            return Ok(());
        }
        self.read_page_from_device(lpid)?;
        self.stats.user_read_bytes += PAGE_BYTES;
        self.touch(lpid);
        Ok(())
    }

    /// Requests a page from the device without waiting for it (the thread waits only when
    /// the read queue is full). The operation that needed the page goes on as if it had
    /// arrived: the model does not suspend operations, so a leaf that depends on a missing
    /// inner page is requested at the same time (inner pages almost never miss).
    fn read_page_from_device(&mut self, lpid: u64) -> Result<(), OxError> {
        self.cpu(self.cfg.costs.io_cpu_ns, Purpose::Io);
        if self.cfg.interface == Interface::Block {
            self.cpu(self.cfg.costs.map_lookup_cpu_ns, Purpose::Io);
        }
        let req = match self.cfg.interface {
            Interface::Batch => Request::ReadLpid(lpid),
            Interface::Block => Request::ReadBlocks {
                lba: self.lba_of[lpid as usize],
                count: 1,
            },
        };
        let expect = sector_token(lpid, self.flushed_version[lpid as usize]);
        let id = self.submit(req)?;
        self.pending_reads.insert(id, expect);
        while self.pending_reads.len() >= self.cfg.max_outstanding_reads {
            self.wait_oldest_read()?;
        }
        Ok(())
    }

    /// Waits for the oldest page read and checks what it returned.
    fn wait_oldest_read(&mut self) -> Result<(), OxError> {
        let Some((&oldest, &expect)) = self.pending_reads.iter().next() else {
            return Ok(());
        };
        let c = self.dev.run_until_complete(oldest)?;
        self.stats.wait_read_ns += c.done_ns.saturating_sub(self.now_ns);
        self.now_ns = self.now_ns.max(c.done_ns);
        self.pending_reads.remove(&oldest);
        if c.result?.first() != Some(&expect) {
            self.stats.mismatches += 1;
        }
        self.drain_completions()
    }

    // ----- the write buffer and flushes -------------------------------------------------

    /// A page changed: its new image goes into the write buffer (once per buffer), or,
    /// with the write-back cache, it stays dirty in the cache until evicted.
    fn mark_modified(&mut self, lpid: u64) -> Result<(), OxError> {
        self.version[lpid as usize] += 1;
        if self.cfg.write_back && self.cache.contains(lpid) {
            self.dirty[lpid as usize] = true;
            return Ok(());
        }
        self.buffer_page(lpid)
    }

    /// Copies a page's current image into the write buffer (once per buffer), flushing a
    /// full buffer.
    fn buffer_page(&mut self, lpid: u64) -> Result<(), OxError> {
        if self.in_buffer.insert(lpid) {
            self.buffer.push(lpid);
            self.cpu(self.cfg.costs.page_copy_cpu_ns, Purpose::Op);
            self.stats.user_write_bytes += PAGE_BYTES;
            if self.buffer.len() >= self.buffer_capacity {
                self.flush()?;
            }
        }
        Ok(())
    }

    /// Sends the write buffer to the device.
    fn flush(&mut self) -> Result<(), OxError> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        self.wait_flushes_below(self.cfg.max_outstanding_flushes)?;
        let lpids = std::mem::take(&mut self.buffer);
        self.in_buffer.clear();
        // Nested when finding a segment cleans one whose pages fill the buffer again; host
        // GC leaves the pages of every flush being assembled to that flush.
        let outer_assembling = std::mem::replace(&mut self.assembling_flush, true);
        let outer_lpids = self.assembling_lpids.clone();
        self.assembling_lpids.extend(lpids.iter().copied());
        for &l in &lpids {
            self.flushed_version[l as usize] = self.version[l as usize];
            *self.inflight_pages.entry(l).or_insert(0) += 1;
        }
        let versions: Vec<u64> = lpids.iter().map(|&l| self.version[l as usize]).collect();
        let pages: Vec<(u64, u64)> = lpids
            .iter()
            .map(|&l| (l, sector_token(l, self.version[l as usize])))
            .collect();
        self.cpu(self.cfg.costs.io_cpu_ns, Purpose::Io);
        let mut old_lbas = Vec::new();
        let mut base = 0;
        let req = match self.cfg.interface {
            Interface::Batch => Request::FlushBatch(BatchBuffer::new(
                &pages,
                self.cfg.device.terms.rblock_bytes,
            )?),
            Interface::Block => {
                let seg = self.take_segment()?;
                base = seg * self.seg_pages;
                for (i, &l) in lpids.iter().enumerate() {
                    let lba = base + i as u64;
                    let mut old = std::mem::replace(&mut self.lba_of[l as usize], lba);
                    let relocated_from = self.relocating.remove(&l);
                    if old != NONE {
                        let seg_old = (old / self.seg_pages) as usize;
                        self.seg_live[seg_old] = self.seg_live[seg_old].saturating_sub(1);
                    } else if let Some(from) = relocated_from {
                        old = from;
                    }
                    old_lbas.push(old);
                    self.seg_live[seg as usize] += 1;
                    self.dirty_map_pages.insert(l * 8 / PAGE_BYTES);
                }
                self.seg_slots[seg as usize] = lpids.clone();
                self.seg_flush[seg as usize] = self.next_flush;
                self.log_order.push_back(seg);
                let cost = self.cfg.costs.map_update_cpu_ns * lpids.len() as u64;
                self.cpu(cost, Purpose::Io);
                Request::WriteBlocks {
                    lba: base,
                    tokens: pages.iter().map(|p| p.1).collect(),
                }
            }
        };
        let flush = self.next_flush;
        let header = FlushHeader {
            flush,
            pages_in_flush: lpids.len() as u32,
            root: self.root,
            pages: self.nodes.len() as u64,
            log_head_flush: self
                .log_order
                .front()
                .map_or(flush, |&seg| self.seg_flush[seg as usize]),
        };
        if let Some(images) = self.images.as_mut() {
            for (i, (&l, &(_, token))) in lpids.iter().zip(&pages).enumerate() {
                let address = match self.cfg.interface {
                    Interface::Batch => l,
                    Interface::Block => base + i as u64,
                };
                let image = PageImage::Node {
                    lpid: l,
                    version: self.version[l as usize],
                    header,
                    node: self.nodes[l as usize].clone(),
                };
                images.write(address, token, image);
            }
        }
        let id = self.submit(req)?;
        self.stats.flushes += 1;
        self.next_flush += 1;
        self.flushes_in_flight.insert(flush);
        self.inflight_headers.insert(flush, header);
        self.assembling_flush = outer_assembling;
        self.assembling_lpids = outer_lpids;
        self.inflight.insert(
            id,
            InFlight {
                lpids,
                versions,
                flush: Some(flush),
                old_lbas,
            },
        );
        if self.cfg.interface == Interface::Block && !self.in_gc {
            self.host_gc()?;
        }
        Ok(())
    }

    /// At an operation boundary: flushes the write buffer while the next operation might
    /// not fit in it, so that no operation's pages are split between two flushes and every
    /// flush leaves the device holding the B-tree as an operation boundary left it.
    fn flush_at_boundary(&mut self) -> Result<(), OxError> {
        // An insert changes at most its leaf and, splitting up to a new root, two pages per
        // level and the new root.
        let headroom = (2 * self.depth + 2) as usize;
        while !self.buffer.is_empty() && self.buffer.len() + headroom > self.buffer_capacity {
            self.flush()?;
        }
        Ok(())
    }

    fn take_segment(&mut self) -> Result<u64, OxError> {
        if self.free_segs.is_empty() && !self.cleaned.is_empty() {
            // Cleaned segments free up as the writes carrying their pages are acknowledged.
            self.wait_flushes_below(1)?;
        }
        if self.free_segs.is_empty() && self.cfg.host_gc {
            self.host_gc_one()?;
            self.release_cleaned()?;
        }
        self.free_segs.pop_front().ok_or(OxError::NoSpace)
    }

    /// The share of the log's segments in use; cleaned segments count as free, since they
    /// are only waiting for their pages' new copies to be acknowledged.
    fn used_fraction(&self) -> f64 {
        1.0 - (self.free_segs.len() + self.cleaned.len()) as f64 / self.segments as f64
    }

    /// LLAMA-like host GC: clean segments at the head of the log while too few are free.
    fn host_gc(&mut self) -> Result<(), OxError> {
        if !self.cfg.host_gc || self.used_fraction() < self.cfg.host_gc_start_used_fraction {
            return Ok(());
        }
        // At most one pass over the log: when the live pages fill nearly as much as the stop
        // fraction allows, each cleaning writes as much as it frees and would never end.
        for _ in 0..self.segments {
            if self.used_fraction() <= self.cfg.host_gc_stop_used_fraction || !self.host_gc_one()? {
                break;
            }
        }
        Ok(())
    }

    /// Cleans the oldest segment: reads it back whole, re-appends its live pages and frees
    /// it. Returns false when there is nothing to clean.
    fn host_gc_one(&mut self) -> Result<bool, OxError> {
        // Segments still being written cannot be cleaned.
        let Some(seg) = self.log_order.front().copied() else {
            return Ok(false);
        };
        let busy = self.inflight.values().any(|f| {
            f.lpids
                .iter()
                .any(|&l| self.lba_of[l as usize] / self.seg_pages == seg)
        });
        if busy {
            self.wait_flushes_below(1)?;
        }
        self.log_order.pop_front();
        self.in_gc = true;
        let base = seg * self.seg_pages;
        let slots = std::mem::take(&mut self.seg_slots[seg as usize]);
        self.cpu(self.cfg.costs.io_cpu_ns, Purpose::Gc);
        let id = self.submit(Request::ReadBlocks {
            lba: base,
            count: slots.len().max(1) as u32,
        })?;
        let before = self.now_ns;
        let tokens = self.wait(id)?;
        self.stats.wait_gc_ns += self.now_ns - before;
        self.stats.host_gc_read_bytes += slots.len() as u64 * PAGE_BYTES;
        self.stats.host_gc_segments += 1;
        self.cpu(
            self.cfg.costs.gc_page_cpu_ns * slots.len() as u64,
            Purpose::Gc,
        );
        let mut live = Vec::new();
        let mut carried = 0;
        for (i, &l) in slots.iter().enumerate() {
            if l != NONE && self.lba_of[l as usize] == base + i as u64 {
                if self.assembling_lpids.contains(&l) {
                    // A flush being assembled carries the page's newer version; this copy
                    // stays its durable one until that flush is acknowledged.
                    carried += 1;
                    continue;
                }
                // The device must hold the version the host last wrote for a live page.
                if tokens.get(i) != Some(&sector_token(l, self.flushed_version[l as usize])) {
                    self.stats.mismatches += 1;
                }
                // Until the buffer takes it to its new place the page lives in host memory,
                // and the copy here stays its durable one.
                self.lba_of[l as usize] = NONE;
                self.relocating.insert(l, base + i as u64);
                live.push(l);
            }
        }
        self.stats.host_gc_reclaimed_bytes +=
            (slots.len() - live.len() - carried) as u64 * PAGE_BYTES;
        self.seg_live[seg as usize] = 0;
        self.seg_flush[seg as usize] = NONE;
        for l in live {
            // Relocated pages keep their version: only their address changes.
            if self.in_buffer.insert(l) {
                self.buffer.push(l);
                self.stats.host_gc_write_bytes += PAGE_BYTES;
                self.cpu(self.cfg.costs.page_copy_cpu_ns, Purpose::Gc);
                if self.buffer.len() >= self.buffer_capacity {
                    self.flush()?;
                }
            }
        }
        self.in_gc = false;
        // The segment is freed (and trimmed) once its live pages are durable elsewhere. Those
        // the loop above flushed went in flushes numbered below `next_flush`; the rest wait
        // in the write buffer (some were there already, with a newer version), which the
        // next flush writes whole: the one after a flush being assembled, if there is one.
        let carrier = self.next_flush + u64::from(self.assembling_flush);
        self.cleaned.push_back((seg, carrier));
        self.release_cleaned()?;
        Ok(true)
    }

    /// LBA of map page `index`'s copy in `half` of the checkpoint area, and of record slot
    /// `slot`.
    fn map_page_lba(&self, index: u64, half: u8) -> u64 {
        self.ckpt_base_lba + 2 + half as u64 * self.map_pages + index
    }
    fn record_lba(&self, slot: u64) -> u64 {
        self.ckpt_base_lba + slot
    }

    /// Host checkpoint of the LPID → LBA map: the map pages changed since the last one are
    /// written to the checkpoint area, as the acknowledged flushes left them; once they are
    /// all acknowledged, a checkpoint record naming them and the flush to replay from goes
    /// to the well-known record slot (`write_checkpoint_record`). Checkpoint `n` writes its
    /// pages into half `n % 2` of the area at each page's own place, so it overwrites only
    /// an older copy of the same page, never one of another page a record points at.
    fn host_checkpoint(&mut self) -> Result<(), OxError> {
        if self.ckpt_in_flight.is_some() {
            // The previous checkpoint's record is not written yet; the next tick takes over.
            return Ok(());
        }
        let pages: Vec<u64> = std::mem::take(&mut self.dirty_map_pages)
            .into_iter()
            .collect();
        if pages.is_empty() {
            return Ok(());
        }
        if let Some(&p) = pages.iter().find(|&&p| p >= self.map_pages) {
            // The area holds the map of a quarter of the LBAs: a tree that outgrew it would
            // have its map pages overwrite each other or the log.
            return Err(OxError::KvConfig(format!(
                "the B-tree's {} pages outgrew the host checkpoint area, which maps {} LPIDs \
                 (map page {p} of {})",
                self.nodes.len(),
                self.map_pages * PAGE_BYTES / 8,
                self.map_pages
            )));
        }
        self.stats.host_checkpoints += 1;
        let entries = pages.len() as u64 * PAGE_BYTES / 8;
        self.cpu(self.cfg.costs.ckpt_entry_cpu_ns * entries, Purpose::Ckpt);
        let seq = self.ckpt_seq;
        self.ckpt_seq += 1;
        let half = (seq % 2) as u8;
        // The map as the acknowledged flushes left it: a page in a flush in flight keeps the
        // LBA it had before the oldest such flush, and its map page stays dirty for the next
        // checkpoint.
        let replay_from_flush = self.acknowledged_flushes();
        let mut before_in_flight: BTreeMap<u64, u64> = BTreeMap::new();
        let mut in_flight: Vec<&InFlight> = self
            .inflight
            .values()
            .filter(|f| f.flush.is_some())
            .collect();
        in_flight.sort_by_key(|f| std::cmp::Reverse(f.flush));
        for f in in_flight {
            for (&l, &old) in f.lpids.iter().zip(&f.old_lbas) {
                before_in_flight.insert(l, old);
            }
        }
        let entries_per_page = PAGE_BYTES / 8;
        let acked_lba = |s: &KvStore<D>, l: u64| -> u64 {
            if let Some(&old) = before_in_flight.get(&l) {
                return old;
            }
            match s.lba_of[l as usize] {
                NONE => s.relocating.get(&l).copied().unwrap_or(NONE),
                lba => lba,
            }
        };
        let mut halves = self.ckpt_halves.clone();
        let mut outstanding = BTreeSet::new();
        // Runs of consecutive map pages, at most 256 pages a write.
        let mut runs: Vec<Vec<u64>> = Vec::new();
        for &p in &pages {
            match runs.last_mut() {
                Some(run) if run.len() < 256 && run.last() == Some(&(p - 1)) => run.push(p),
                _ => runs.push(vec![p]),
            }
        }
        for run in runs {
            let n = run.len() as u64;
            let lba = self.map_page_lba(run[0], half);
            self.wait_flushes_below(self.cfg.max_outstanding_flushes)?;
            self.cpu(self.cfg.costs.io_cpu_ns, Purpose::Ckpt);
            let tokens: Vec<u64> = run
                .iter()
                .map(|&p| sector_token(u64::MAX - p, seq))
                .collect();
            if self.images.is_some() {
                for (i, &p) in run.iter().enumerate() {
                    let first = p * entries_per_page;
                    let last = ((p + 1) * entries_per_page).min(self.nodes.len() as u64);
                    let lbas = (first..last.max(first))
                        .map(|l| acked_lba(self, l))
                        .collect();
                    let image = PageImage::MapPage { index: p, lbas };
                    if let Some(images) = self.images.as_mut() {
                        images.write(lba + i as u64, tokens[i], image);
                    }
                }
            }
            for &p in &run {
                halves[p as usize] = Some(half);
            }
            let id = self.submit(Request::WriteBlocks { lba, tokens })?;
            self.stats.host_checkpoint_bytes += n * PAGE_BYTES;
            self.inflight.insert(id, InFlight::default());
            outstanding.insert(id);
        }
        for l in before_in_flight.keys() {
            self.dirty_map_pages.insert(l * 8 / PAGE_BYTES);
        }
        let header = self.acked_header;
        self.ckpt_in_flight = Some(CheckpointInFlight {
            record: images::CheckpointRecord {
                seq,
                replay_from_flush,
                root: header.map_or(NONE, |h| h.root),
                pages: header.map_or(0, |h| h.pages),
                log_head_flush: header.map_or(0, |h| h.log_head_flush),
                halves,
            },
            outstanding,
            record_write: None,
        });
        self.drain_completions()
    }

    /// Writes the record of the checkpoint under way once its map pages are acknowledged.
    fn write_checkpoint_record(&mut self) -> Result<(), OxError> {
        let Some(ck) = self.ckpt_in_flight.as_ref() else {
            return Ok(());
        };
        if !ck.outstanding.is_empty() || ck.record_write.is_some() {
            return Ok(());
        }
        let record = ck.record.clone();
        self.cpu(self.cfg.costs.io_cpu_ns, Purpose::Ckpt);
        let lba = self.record_lba(record.seq % 2);
        let token = sector_token(u64::MAX - self.map_pages - 1, record.seq);
        self.ckpt_halves = record.halves.clone();
        if let Some(images) = self.images.as_mut() {
            images.write(lba, token, PageImage::Record(record));
        }
        let id = self.submit(Request::WriteBlocks {
            lba,
            tokens: vec![token],
        })?;
        self.stats.host_checkpoint_bytes += PAGE_BYTES;
        self.inflight.insert(id, InFlight::default());
        if let Some(ck) = self.ckpt_in_flight.as_mut() {
            ck.record_write = Some(id);
        }
        Ok(())
    }

    // ----- the B-tree -------------------------------------------------------------------

    fn new_page(&mut self, node: Node) -> u64 {
        let l = self.nodes.len() as u64;
        self.nodes.push(node);
        self.version.push(0);
        self.flushed_version.push(0);
        self.durable_version.push(0);
        self.cache.add_page();
        self.dirty.push(false);
        self.lba_of.push(NONE);
        l
    }

    /// The path from the root to the leaf that holds (or would hold) `key`, each page made
    /// resident on the way.
    fn descend(&mut self, key: u64) -> Result<Vec<u64>, OxError> {
        let mut path = vec![self.root];
        let mut p = self.root;
        loop {
            self.access(p)?;
            match &self.nodes[p as usize] {
                Node::Leaf { .. } => return Ok(path),
                Node::Inner { keys, children } => {
                    let i = keys.partition_point(|&k| k <= key);
                    p = children[i];
                    path.push(p);
                }
            }
        }
    }

    fn get(&mut self, key: u64) -> Result<Option<u32>, OxError> {
        let path = self.descend(key)?;
        let leaf = *path.last().expect("non-empty");
        if let Node::Leaf { keys, vals } = &self.nodes[leaf as usize] {
            return Ok(keys.binary_search(&key).ok().map(|i| vals[i]));
        }
        Ok(None)
    }

    fn update(&mut self, key: u64) -> Result<bool, OxError> {
        let path = self.descend(key)?;
        let leaf = *path.last().expect("non-empty");
        let found = if let Node::Leaf { keys, vals } = &mut self.nodes[leaf as usize] {
            match keys.binary_search(&key) {
                Ok(i) => {
                    vals[i] += 1;
                    Some(vals[i])
                }
                Err(_) => None,
            }
        } else {
            None
        };
        match found {
            Some(v) => {
                self.records.insert(key, v);
                self.mark_modified(leaf)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn insert(&mut self, key: u64) -> Result<(), OxError> {
        let path = self.descend(key)?;
        let leaf = *path.last().expect("non-empty");
        if let Node::Leaf { keys, vals } = &mut self.nodes[leaf as usize] {
            match keys.binary_search(&key) {
                Ok(i) => vals[i] += 1,
                Err(i) => {
                    keys.insert(i, key);
                    vals.insert(i, 1);
                }
            }
        }
        self.records.insert(key, 1);
        self.mark_modified(leaf)?;
        // Split full pages bottom-up.
        let mut child = leaf;
        for depth in (0..path.len()).rev() {
            let p = path[depth];
            if p != child {
                break;
            }
            let over = match &self.nodes[p as usize] {
                Node::Leaf { keys, .. } => keys.len() > LEAF_CAPACITY,
                Node::Inner { keys, .. } => keys.len() > INNER_CAPACITY,
            };
            if !over {
                break;
            }
            let (sep, right) = match &mut self.nodes[p as usize] {
                Node::Leaf { keys, vals } => {
                    let h = keys.len() / 2;
                    let rk = keys.split_off(h);
                    let rv = vals.split_off(h);
                    (rk[0], Node::Leaf { keys: rk, vals: rv })
                }
                Node::Inner { keys, children } => {
                    let h = keys.len() / 2;
                    let mut rk = keys.split_off(h);
                    let sep = rk.remove(0);
                    let rc = children.split_off(h + 1);
                    (
                        sep,
                        Node::Inner {
                            keys: rk,
                            children: rc,
                        },
                    )
                }
            };
            let r = self.new_page(right);
            self.touch(r);
            self.mark_modified(p)?;
            self.mark_modified(r)?;
            if depth == 0 {
                let root = self.new_page(Node::Inner {
                    keys: vec![sep],
                    children: vec![p, r],
                });
                self.touch(root);
                self.mark_modified(root)?;
                self.root = root;
                self.depth += 1;
            } else {
                let parent = path[depth - 1];
                if let Node::Inner { keys, children } = &mut self.nodes[parent as usize] {
                    let i = keys.partition_point(|&k| k <= sep);
                    keys.insert(i, sep);
                    children.insert(i + 1, r);
                }
                self.mark_modified(parent)?;
                child = parent;
            }
        }
        Ok(())
    }

    // ----- phases -----------------------------------------------------------------------

    /// Loads `records` records, flushes everything, and empties the cache (the paper's
    /// experiments are cold).
    pub fn load(&mut self) -> Result<(), OxError> {
        for k in Ycsb::load_keys(self.cfg.records) {
            self.cpu(self.cfg.costs.op_cpu_ns, Purpose::Op);
            self.insert(k)?;
            self.write_back_evicted()?;
            self.flush_at_boundary()?;
        }
        self.write_back_all()?;
        self.flush()?;
        self.wait_flushes_below(1)?;
        while !self.pending_reads.is_empty() {
            self.wait_oldest_read()?;
        }
        self.dev.quiesce();
        self.now_ns = self.now_ns.max(self.dev.now_ns());
        self.cache_capacity =
            ((self.cfg.cache_fraction * self.nodes.len() as f64).round() as usize).max(1);
        self.cache.clear();
        self.stats = KvStats::default();
        Ok(())
    }

    /// Runs `ops` operations of `workload` and measures them.
    pub fn run(&mut self, workload: Workload, ops: u64, seed: u64) -> Result<KvRun, OxError> {
        let mut y = Ycsb::new(workload, self.cfg.records, seed);
        let start_ns = self.now_ns;
        let dev_before = self.dev.stats();
        self.next_ckpt_ns = start_ns + self.cfg.host_checkpoint_interval_ns;
        let mut ops_per_interval = Vec::new();
        for _ in 0..ops {
            self.step(y.next_op())?;
            let interval = ((self.now_ns - start_ns) / TIMELINE_INTERVAL_NS) as usize;
            if ops_per_interval.len() <= interval {
                ops_per_interval.resize(interval + 1, 0);
            }
            ops_per_interval[interval] += 1;
        }
        while !self.pending_reads.is_empty() {
            self.wait_oldest_read()?;
        }
        let elapsed = self.now_ns - start_ns;
        self.stats.elapsed_ns = elapsed;
        let device = OxStatsSummary::delta(&dev_before, &self.dev.stats());
        Ok(KvRun {
            ops_per_s: ops as f64 * NS_PER_S as f64 / elapsed.max(1) as f64,
            host: self.stats,
            device,
            ops_per_interval,
        })
    }

    /// One YCSB operation, then the host checkpoint if one is due and the device's work up
    /// to the host's clock.
    fn step(&mut self, op: YcsbOp) -> Result<(), OxError> {
        self.stats.ops += 1;
        self.cpu(self.cfg.costs.op_cpu_ns, Purpose::Op);
        match op {
            YcsbOp::Read(k) => {
                self.stats.reads += 1;
                let got = self.get(k)?;
                if got != self.records.get(&k).copied() {
                    self.stats.mismatches += 1;
                }
            }
            YcsbOp::Update(k) => {
                self.stats.updates += 1;
                if !self.update(k)? {
                    self.stats.mismatches += 1;
                }
            }
            YcsbOp::Insert(k) => {
                self.stats.inserts += 1;
                self.insert(k)?;
            }
        }
        self.write_back_evicted()?;
        self.flush_at_boundary()?;
        if self.cfg.interface == Interface::Block
            && self.cfg.host_checkpoint_interval_ns > 0
            && self.now_ns >= self.next_ckpt_ns
        {
            self.next_ckpt_ns += self.cfg.host_checkpoint_interval_ns;
            self.host_checkpoint()?;
        }
        // Let the device catch up with the host's clock so that background work and
        // completions are processed in time order.
        self.dev.advance_to(self.now_ns);
        self.drain_completions()
    }
}

#[derive(Debug, Clone, Copy)]
enum Purpose {
    Op,
    Io,
    Gc,
    Ckpt,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One GC turn at a time (`max_gc_channels = 1`) on a device whose channels fill
    /// together, without checkpoints: a channel whose turn ended for want of a victim used
    /// to leave the channels refused a turn waiting with no event left to wake them, and
    /// the store failed for a flush that could never complete.
    #[test]
    fn one_gc_turn_at_a_time_never_strands_a_flush() {
        let mut cfg = KvConfig::scaled(100_000, Interface::Batch, 0.2);
        cfg.device.gc.max_gc_channels = 1;
        cfg.device.checkpoint.enabled = false;
        cfg.host_checkpoint_interval_ns = 0;
        let mut kv = KvStore::new(cfg, 42).unwrap();
        kv.load().unwrap();
        let run = kv.run(Workload::WriteHeavy, 200_000, 42 ^ 0x5eed).unwrap();
        assert_eq!(run.host.mismatches, 0);
        assert!(run.device.gc_victims > 0);
    }

    fn small(interface: Interface, cache: f64) -> KvConfig {
        let mut cfg = KvConfig::scaled(30_000, interface, cache);
        cfg.device.checkpoint.interval_ns = 20_000_000;
        cfg.host_checkpoint_interval_ns = 20_000_000;
        cfg
    }

    /// §8.2.3's device is ten times the data set, and the data set is the records (§8.1.3),
    /// not the B-tree pages that hold them.
    #[test]
    fn the_device_is_ten_times_the_records() {
        let cfg = KvConfig::scaled(100_000, Interface::Batch, 0.2);
        let records_bytes = 100_000 * (KEY_BYTES + VALUE_BYTES) as u64;
        assert_eq!(
            cfg.device.logical_pages,
            10 * records_bytes.div_ceil(PAGE_BYTES)
        );
        assert_eq!(
            KvConfig::scaled_with_ratio(100_000, Interface::Block, 0.2, 5.0)
                .device
                .logical_pages,
            5 * records_bytes.div_ceil(PAGE_BYTES)
        );
    }

    #[test]
    fn the_btree_holds_every_record_after_the_load() {
        let mut kv = KvStore::new(small(Interface::Batch, 1.0), 1).unwrap();
        kv.load().unwrap();
        assert!(kv.pages() > 30_000 / LEAF_CAPACITY as u64);
        for k in Ycsb::load_keys(30_000) {
            assert_eq!(kv.get(k).unwrap(), Some(1));
        }
        assert_eq!(kv.get(12345).unwrap(), None);
        assert_eq!(kv.stats().mismatches, 0);
    }

    #[test]
    fn both_interfaces_run_ycsb_without_a_mismatch() {
        for interface in [Interface::Batch, Interface::Block] {
            for w in [
                Workload::WriteHeavy,
                Workload::ReadHeavy,
                Workload::A,
                Workload::D,
            ] {
                let mut kv = KvStore::new(small(interface, 0.2), 2).unwrap();
                kv.load().unwrap();
                let r = kv.run(w, 4_000, 9).unwrap();
                assert_eq!(r.host.mismatches, 0, "{interface:?} {w:?}");
                assert!(r.ops_per_s > 0.0);
                assert!(r.host.cache_misses > 0);
                kv.device().check_invariants().unwrap();
            }
        }
    }

    /// Dirty pages coalesce in a write-back cache: fewer pages are written than with
    /// write-through, fewer still with a larger cache, and every read stays right.
    #[test]
    fn a_write_back_cache_writes_less_the_larger_it_is() {
        let written = |interface, cache, write_back| {
            let mut cfg = small(interface, cache);
            cfg.write_back = write_back;
            let mut kv = KvStore::new(cfg, 5).unwrap();
            kv.load().unwrap();
            let r = kv.run(Workload::WriteHeavy, 6_000, 6).unwrap();
            assert_eq!(r.host.mismatches, 0, "{interface:?} cache {cache}");
            kv.device().check_invariants().unwrap();
            r.host.user_write_bytes
        };
        for interface in [Interface::Batch, Interface::Block] {
            let through = written(interface, 0.2, false);
            let back_small = written(interface, 0.2, true);
            let back_large = written(interface, 0.8, true);
            assert!(
                back_small < through,
                "{interface:?}: {back_small} vs {through}"
            );
            assert!(
                back_large < back_small,
                "{interface:?}: {back_large} vs {back_small}"
            );
        }
    }

    #[test]
    fn the_block_host_collects_its_log_and_checkpoints_its_map() {
        let mut cfg = small(Interface::Block, 0.2);
        cfg.host_gc_start_used_fraction = 0.2;
        cfg.host_gc_stop_used_fraction = 0.15;
        let mut kv = KvStore::new(cfg, 3).unwrap();
        kv.load().unwrap();
        let r = kv.run(Workload::WriteHeavy, 20_000, 4).unwrap();
        assert!(r.host.host_gc_segments > 0, "{:?}", r.host);
        assert!(r.host.host_gc_reclaimed_bytes > 0);
        assert!(r.host.host_checkpoints > 0);
        assert!(r.host.cpu_gc_ns > 0 && r.host.cpu_ckpt_ns > 0);
        assert_eq!(r.host.mismatches, 0);
        // Every 1 MiB host flush arrives as 17 packets and so 17 contexts.
        assert!(r.device.done_records >= 17 * (r.host.flushes - 1));
    }

    /// Figure 15's non-durable configuration: the block host neither cleans its log nor
    /// checkpoints its map, its device holds every page the run writes, and the run's
    /// timeline counts every operation once.
    #[test]
    fn the_non_durable_block_host_neither_cleans_nor_checkpoints() {
        let ops = 20_000;
        let cfg = KvConfig::non_durable(30_000, 0.2, ops);
        let durable = KvConfig::scaled(30_000, Interface::Block, 0.2);
        assert!(cfg.device.logical_pages > durable.device.logical_pages);
        assert_eq!(cfg.device.map_cache_pages, durable.device.map_cache_pages);
        let mut kv = KvStore::new(cfg, 3).unwrap();
        kv.load().unwrap();
        let r = kv.run(Workload::WriteHeavy, ops, 4).unwrap();
        assert_eq!(r.host.host_gc_segments, 0, "{:?}", r.host);
        assert_eq!(r.host.host_checkpoints, 0);
        assert_eq!(r.host.cpu_gc_ns + r.host.cpu_ckpt_ns, 0);
        assert_eq!(r.gc_cpu_share(), 0.0);
        assert_eq!(r.host.mismatches, 0);
        assert_eq!(r.ops_per_interval.iter().sum::<u64>(), ops);
        let whole_intervals = r.host.elapsed_ns / TIMELINE_INTERVAL_NS;
        assert!(r.ops_per_interval.len() as u64 >= whole_intervals);
    }

    fn on_conventional(cache: f64, seed: u64) -> KvStore<ConventionalSsd> {
        let cfg = small(Interface::Block, cache);
        let ssd = ConventionalSsd::config_like(&cfg.device);
        KvStore::on_conventional(cfg, ssd, seed).unwrap()
    }

    /// Figure 14's conventional SSD: the block host runs on it with every read checked, and
    /// the SSD's own FTL collects under the host's log.
    #[test]
    fn the_block_host_runs_on_a_conventional_ssd_without_a_mismatch() {
        let mut kv = on_conventional(0.2, 7);
        kv.load().unwrap();
        let r = kv.run(Workload::WriteHeavy, 20_000, 8).unwrap();
        assert_eq!(r.host.mismatches, 0);
        assert!(r.host.host_gc_segments > 0, "{:?}", r.host);
        assert!(r.host.cache_misses > 0 && r.device.read_commands > 0);
        assert!(r.device.user_write_bytes >= r.host.user_write_bytes);
        assert!(r.device.gc_victims > 0, "{:?}", r.device);
        let mut kv = on_conventional(0.5, 7);
        kv.load().unwrap();
        let again = kv.run(Workload::ReadHeavy, 20_000, 8).unwrap();
        assert_eq!(again.host.mismatches, 0);
        // A seed gives the same run.
        let mut kv = on_conventional(0.5, 7);
        kv.load().unwrap();
        assert_eq!(kv.run(Workload::ReadHeavy, 20_000, 8).unwrap(), again);
    }

    #[test]
    fn a_conventional_ssd_refuses_the_batch_interface_and_page_images() {
        let batch = small(Interface::Batch, 0.2);
        let ssd = ConventionalSsd::config_like(&batch.device);
        let err = KvStore::on_conventional(batch, ssd.clone(), 1).unwrap_err();
        assert!(err.to_string().contains("block interface"), "{err}");
        let mut images = small(Interface::Block, 0.2);
        images.page_images = true;
        assert!(KvStore::on_conventional(images, ssd.clone(), 1).is_err());
        // An SSD too small for the store's LBA space is refused by name.
        let mut half = small(Interface::Block, 0.2).device;
        half.logical_pages /= 2;
        let small_ssd = ConventionalSsd::config_like(&half);
        let err = KvStore::on_conventional(small(Interface::Block, 0.2), small_ssd, 1).unwrap_err();
        assert!(err.to_string().contains("fewer than"), "{err}");
        // A batch request never reaches the SSD.
        let cfg = small(Interface::Block, 0.2);
        let mut dev =
            ConventionalSsd::new(ConventionalSsd::config_like(&cfg.device), 1_000, 1).unwrap();
        let err = dev.submit(0, Request::ReadLpid(3)).unwrap_err();
        assert!(err.to_string().contains("batch interface"), "{err}");
    }

    /// The adapter delivers completions in time order and only once the clock reaches them.
    #[test]
    fn a_conventional_ssd_delivers_completions_when_the_clock_reaches_them() {
        let cfg = small(Interface::Block, 0.2);
        let mut dev =
            ConventionalSsd::new(ConventionalSsd::config_like(&cfg.device), 1_000, 1).unwrap();
        let tokens: Vec<u64> = (0..256).map(|l| sector_token(l, 1)).collect();
        let write = dev
            .submit(0, Request::WriteBlocks { lba: 0, tokens })
            .unwrap();
        let read = dev
            .submit(0, Request::ReadBlocks { lba: 300, count: 1 })
            .unwrap();
        assert!(dev.take_completions().is_empty());
        let t = dev.next_event_ns().unwrap();
        dev.advance_to(t);
        let first = dev.take_completions();
        assert_eq!(first.len(), 1);
        // The unwritten sector reads as zero and is done long before the 1 MiB write.
        assert_eq!((first[0].id, first[0].result.clone()), (read, Ok(vec![0])));
        let done = dev.run_until_complete(write).unwrap();
        assert!(done.done_ns > first[0].done_ns);
        let id = dev
            .submit(0, Request::ReadBlocks { lba: 255, count: 1 })
            .unwrap();
        let back = dev.run_until_complete(id).unwrap();
        assert!(
            back.submitted_ns >= done.done_ns,
            "submitted at the device's clock"
        );
        assert_eq!(back.result, Ok(vec![sector_token(255, 1)]));
        assert!(dev.run_until_complete(id).is_err());
    }

    /// Without cleaning, a log that fills stops the run by name instead of overwriting a
    /// live page.
    #[test]
    fn a_block_host_without_cleaning_fails_when_its_log_fills() {
        // Sized for 1,000 operations; the run asks for a hundred times as many.
        let mut kv = KvStore::new(KvConfig::non_durable(30_000, 0.2, 1_000), 5).unwrap();
        kv.load().unwrap();
        let err = kv.run(Workload::WriteHeavy, 100_000, 6).unwrap_err();
        assert!(matches!(err, OxError::NoSpace), "{err}");
    }

    #[test]
    fn throughput_variation_is_zero_for_a_steady_run_and_leaves_out_the_last_interval() {
        let run = |counts: Vec<u64>| KvRun {
            ops_per_s: 1.0,
            host: KvStats::default(),
            device: OxStatsSummary::default(),
            ops_per_interval: counts,
        };
        assert_eq!(run(vec![5, 5, 5, 1]).throughput_variation(), Some(0.0));
        // Intervals 4 and 6: mean 5, deviation 1.
        let v = run(vec![4, 6, 9]).throughput_variation().unwrap();
        assert!((v - 0.2).abs() < 1e-12, "{v}");
        assert_eq!(run(vec![4, 9]).throughput_variation(), None);
    }

    /// Power fails right after the `nth` operation of a write-heavy run on the block
    /// interface that cleaned a host log segment (while the cleaned segment's live pages are
    /// on their way to their new place); the device recovers and its whole log is read back.
    /// Returns the pages whose version the device had acknowledged but which no longer hold
    /// it (nor a later version the host wrote).
    fn pages_lost_at_power_loss(nth: u64, seed: u64) -> Vec<u64> {
        let mut cfg = small(Interface::Block, 0.2);
        // The host cleans its log often, so cuts can fall just after a cleaning.
        cfg.host_gc_start_used_fraction = 0.2;
        cfg.host_gc_stop_used_fraction = 0.15;
        let mut kv = KvStore::new(cfg, seed).unwrap();
        kv.load().unwrap();
        let mut ycsb = Ycsb::new(Workload::WriteHeavy, kv.cfg.records, seed);
        let mut cleaning_ops = 0;
        for _ in 0..100_000u64 {
            let cleaned = kv.stats.host_gc_segments;
            kv.step(ycsb.next_op()).unwrap();
            if kv.stats.host_gc_segments > cleaned {
                cleaning_ops += 1;
                if cleaning_ops == nth {
                    break;
                }
            }
        }
        assert_eq!(cleaning_ops, nth, "the run cleaned too little");
        let (now, log_lbas) = (kv.now_ns, kv.segments * kv.seg_pages);
        let (durable, written) = (kv.durable_version.clone(), kv.flushed_version.clone());
        let KvStore { dev, .. } = kv;
        let (mut dev, _) = OxController::recover(dev.power_loss(now), now).unwrap();
        let mut on_device = BTreeSet::new();
        let mut lba = 0;
        while lba < log_lbas {
            let count = (log_lbas - lba).min(256) as u32;
            let at = dev.now_ns();
            let id = dev.submit(at, Request::ReadBlocks { lba, count }).unwrap();
            on_device.extend(dev.run_until_complete(id).unwrap().result.unwrap());
            lba += count as u64;
        }
        (0..durable.len() as u64)
            .filter(|&l| {
                let v = durable[l as usize];
                v > 0 && !(v..=written[l as usize]).any(|w| on_device.contains(&sector_token(l, w)))
            })
            .collect()
    }

    /// The block host's own log structuring must not lose a page the device acknowledged:
    /// its cleaning moves live pages through the volatile write buffer, so the segment they
    /// came from may be trimmed or reused only once their new copies are durable.
    #[test]
    fn a_power_loss_keeps_every_page_the_block_device_acknowledged() {
        for (nth, seed) in [(1, 1), (2, 2), (5, 3), (9, 4), (14, 5)] {
            let lost = pages_lost_at_power_loss(nth, seed);
            assert!(
                lost.is_empty(),
                "cut after cleaning {nth}: {} pages lost, {lost:?}",
                lost.len()
            );
        }
    }
}
