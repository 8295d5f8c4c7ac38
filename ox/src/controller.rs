//! The OX controller: an event-driven FTL in virtual time over the media manager.
//!
//! A command enters at `submit`, crosses the transport, is parsed on one of the embedded
//! cores and becomes one write context (a batch) or one per packet (a block write). A write
//! context follows the WAL protocol of §4.2:
//!
//! 1. its LPAGEs get WBLOCK addresses from the HOT line, and its RDESC (LPID, prior and new
//!    address of every LPAGE) is appended to the log;
//! 2. once the RDESC is durable its WBLOCKs are programmed, each RBLOCK's TAG holding its
//!    LPID; a failed program is amended by an RDESC_A that must be durable before the retry;
//! 3. once every LPAGE is on flash, and every earlier context is installed, its MAP entries
//!    are installed one after another (a concurrent read sees a prefix), a `done` record is
//!    appended, and the host gets its completion.
//!
//! Reads look MAP up at the moment they are parsed and read the RBLOCKs. GC, checkpoints and
//! recovery live in their own modules.

use std::collections::{BTreeMap, VecDeque};

use afa_nand::NandError;
use afa_sim::{transfer_ns, EventLogHash, EventQueue, TimeNs};

use crate::batch::{CompletionRecord, Desc, Request, RequestId};
use crate::log::{FormingBlock, LogBlock, LogRecord, LogState, RdescEntry};
use crate::media::{Media, MetaBlob, Ppa, Ppn, RblockWrite, Tag, TagKind};
use crate::provision::{BlockState, Provisioner, Stream, SystemBlocks};
use crate::tables::{Gbitv, Map, MapEntry, MapMiss, TableId, TablePage, Wear, NO_PPN};
use crate::write_cache::WriteCache;
use crate::{CheckpointRecord, FlashImage, OxConfig, OxError};

/// Bridges one log block may take before the device gives up with `LogWriteFailed`. Each
/// costs a checkpoint WBLOCK and retires the EBLOCKs of the failed links, so a medium that
/// fails this often is wearing out; the bound keeps a failing medium from eating the
/// checkpoint EBLOCKs.
const MAX_LOG_BRIDGES_PER_BLOCK: u32 = 8;

/// Counters of one controller, in the units of the paper's Table 3.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct OxStats {
    /// RBLOCKs read for host read commands, in bytes.
    pub user_read_bytes: u64,
    /// LPAGEs of host writes programmed, in bytes (padding excluded).
    pub user_write_bytes: u64,
    /// Bytes of WBLOCK padding programmed after the last LPAGE of a context.
    pub padding_bytes: u64,
    pub gc_read_bytes: u64,
    pub gc_write_bytes: u64,
    /// Invalid RBLOCKs of collected victims, in bytes: the space GC gave back.
    pub gc_reclaimed_bytes: u64,
    pub gc_victims: u64,
    /// GC copies that lost the optimistic MAP check to a concurrent user write.
    pub gc_copies_lost: u64,
    pub write_commands: u64,
    /// Bytes of write commands as the host sent them (a batch includes its DESC block).
    pub write_command_bytes: u64,
    pub read_commands: u64,
    pub contexts: u64,
    pub rdesc_records: u64,
    pub rdesc_a_records: u64,
    pub done_records: u64,
    pub log_records: u64,
    pub log_blocks_written: u64,
    pub log_link_retries: u64,
    /// Log blocks whose every forward link failed, re-anchored through a reissued
    /// checkpoint record (`OxController::bridge_log`).
    pub log_bridges: u64,
    pub log_bytes: u64,
    pub checkpoints: u64,
    pub table_pages_written: u64,
    pub map_page_loads: u64,
    pub map_page_evictions_written: u64,
    pub log_eblocks_reclaimed: u64,
    pub table_eblocks_reclaimed: u64,
    pub data_program_failures: u64,
    pub eblocks_retired: u64,
    /// Bad-block table or checkpoint EBLOCKs replaced after a failed erase.
    pub system_eblocks_replaced: u64,
    pub stalled_contexts: u64,
    /// Failed programs whose retry waited for GC to free a WBLOCK (the channels were down
    /// to the free EBLOCKs GC's copies may take).
    pub stalled_amendments: u64,
    /// Read commands: the sum of their latencies from submission to completion.
    pub read_latency_ns_total: u64,
    /// Read commands: the sum of the time from parsing to their last MAP entry being looked
    /// up (waits for the read thread and for MAP pages included).
    pub read_map_wait_ns_total: u64,
    /// Read commands that waited for their MAP entries (for the read thread or a MAP page).
    pub read_map_miss_commands: u64,
    /// Read commands: the sum of the time from MAP ready to the last RBLOCK read.
    pub read_flash_ns_total: u64,
    /// MAP page loads: the sum of the time from the need to the page in DRAM (the write of
    /// a dirty page pushed out included).
    pub map_page_load_ns_total: u64,
    /// Times an install waited for the MAP page of its next entry to be loaded.
    pub install_map_waits: u64,
    /// Write-back cache: commands acknowledged before their install.
    pub write_cache_acks: u64,
    /// Write-back cache: RBLOCKs of host reads served from the cache's DRAM.
    pub write_cache_read_rblocks: u64,
    /// Write cache: contexts that waited for room in the cache.
    pub write_cache_full_waits: u64,
}

/// A write context (§4.2): the unit of the WAL protocol and of atomicity.
#[derive(Debug, Clone)]
pub(crate) struct Context {
    pub request: RequestId,
    pub lpids: Vec<u64>,
    pub tokens: Vec<u64>,
    pub new: Vec<Ppa>,
    pub wblocks: Vec<Ppn>,
    /// Entries whose program failed and wait for their RDESC_A to be durable.
    pub failed: Vec<u32>,
    /// Entries whose program failed and that have no new address yet: no WBLOCK could be
    /// had, and the context waits in `OxController::amend_stalled`.
    pub unaddressed: Vec<u32>,
    pub data_end_ns: TimeNs,
    pub data_done: bool,
    pub trim: bool,
    /// LSN of the context's RDESC: a checkpoint's RSSP may not pass it before it installs.
    pub rdesc_lsn: u64,
    /// The log block its RDESC went into (`OxController::log_pinned_too_far`).
    pub rdesc_block_seq: u64,
    /// Its key in the write cache (its start key; 0 before it is admitted).
    pub cache_key: u64,
}

/// A context waiting for WBLOCK addresses (every channel closed by GC or full).
#[derive(Debug, Clone)]
pub(crate) struct PendingContext {
    pub request: RequestId,
    pub lpids: Vec<u64>,
    pub tokens: Vec<u64>,
    pub trim: bool,
    /// WBLOCKs already handed out to this context while it waits for the rest.
    pub held: Vec<Ppn>,
    /// Its key in the write cache (its start key; 0 before it is admitted).
    pub cache_key: u64,
}

#[derive(Debug, Clone)]
pub(crate) struct PendingRequest {
    pub submitted_ns: TimeNs,
    pub request: Request,
    /// Contexts (or reads) still to finish before the completion.
    pub outstanding: u32,
    pub result: Option<Result<Vec<u64>, OxError>>,
    pub ready_ns: TimeNs,
    /// Block writes: packets whose contexts have not started (ready time, LPIDs, tokens).
    pub packets: VecDeque<(TimeNs, Vec<u64>, Vec<u64>)>,
    /// Write-back cache: contexts of the command not yet admitted to the cache.
    pub to_accept: u32,
    /// Write-back cache: when the admitted contexts' MAP entries were flagged.
    pub accept_ready_ns: TimeNs,
    /// Write-back cache: the host has its acknowledgement; the completion is not sent again.
    pub acked: bool,
}

/// What waits for the log to become durable up to an LSN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waiter {
    RdescDurable(u64),
    AmendDurable(u64),
    EraseAfter { block: u32, gc_channel: Option<u32> },
    CkptPagesLogged(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    Arrive(RequestId),
    StartContext(u64),
    ReadIssue(RequestId),
    LogSeal(u64),
    LogDurable {
        block_seq: u64,
        last_lsn: u64,
    },
    DataDone(u64),
    Install {
        ctx: u64,
        idx: u32,
    },
    Complete(RequestId),
    GcCheck(u32),
    GcCopiesDone(u32),
    Erase {
        block: u32,
        gc_channel: Option<u32>,
    },
    CheckpointTimer,
    ForcedCheckpoint,
    CkptRecord(u64),
    CkptDone(u64),
    Ack(RequestId),
    AdmitWaiting,
    /// An install moved the log's pin on: contexts waiting may start.
    RetryStalled,
}

impl Event {
    fn code(&self) -> (u64, u64) {
        match *self {
            Event::Arrive(r) => (1, r),
            Event::StartContext(c) => (2, c),
            Event::ReadIssue(r) => (3, r),
            Event::LogSeal(s) => (4, s),
            Event::LogDurable { block_seq, .. } => (5, block_seq),
            Event::DataDone(c) => (6, c),
            Event::Install { ctx, idx } => (7, ctx << 16 | idx as u64),
            Event::Complete(r) => (8, r),
            Event::GcCheck(c) => (9, c as u64),
            Event::GcCopiesDone(c) => (10, c as u64),
            Event::Erase { block, .. } => (11, block as u64),
            Event::CheckpointTimer => (12, 0),
            Event::ForcedCheckpoint => (15, 0),
            Event::CkptRecord(s) => (13, s),
            Event::CkptDone(s) => (14, s),
            Event::Ack(r) => (16, r),
            Event::AdmitWaiting => (17, 0),
            Event::RetryStalled => (18, 0),
        }
    }
}

/// One GC pass over one victim of one channel.
#[derive(Debug, Clone)]
pub(crate) struct GcPass {
    pub victim: u32,
    pub seq: u64,
    /// (LPID, prior, new) of every copied page.
    pub copies: Vec<(u64, Ppa, Ppa)>,
    pub reclaim_rblocks: u32,
}

/// A checkpoint in progress.
#[derive(Debug, Clone)]
pub(crate) struct CkptInProgress {
    pub record: CheckpointRecord,
    pub pages_end_ns: TimeNs,
}

/// The OX controller with its medium.
#[derive(Debug)]
pub struct OxController {
    pub(crate) cfg: OxConfig,
    pub(crate) media: Media,
    pub(crate) system: SystemBlocks,
    pub(crate) prov: Provisioner,
    pub(crate) map: Map,
    pub(crate) gbitv: Gbitv,
    pub(crate) wear: Wear,
    pub(crate) log: LogState,
    pub(crate) log_forming: VecDeque<FormingBlock>,
    pub(crate) log_open: Vec<Option<u32>>,
    pub(crate) log_channel_cursor: u32,
    pub(crate) events: EventQueue<Event>,
    pub(crate) now_ns: TimeNs,
    pub(crate) cores_free_ns: Vec<TimeNs>,
    /// When each read thread (MAP lookups of host reads) is free; empty when every read
    /// looks up on its own (`costs.read_lookup_threads` = 0).
    pub(crate) read_threads_free_ns: Vec<TimeNs>,
    pub(crate) next_request: RequestId,
    pub(crate) next_ctx: u64,
    pub(crate) next_gc_seq: u64,
    pub(crate) requests: BTreeMap<RequestId, PendingRequest>,
    pub(crate) contexts: BTreeMap<u64, Context>,
    /// Contexts created by a request's arrival, waiting for their start event.
    pub(crate) starting: BTreeMap<u64, PendingContext>,
    pub(crate) next_start: u64,
    pub(crate) stalled: VecDeque<PendingContext>,
    /// Contexts under way with failed entries that wait for a WBLOCK to be retried at, in
    /// the order they asked. They go before `stalled`: every later context installs after
    /// them.
    pub(crate) amend_stalled: VecDeque<u64>,
    /// The next context to install (contexts install in RDESC order).
    pub(crate) install_next: u64,
    /// When the host-to-device direction of the link is free: one NVMe-oF/TCP connection
    /// carries the commands' data in the order they were submitted, so a write's data
    /// arrives after that of every write submitted before it.
    pub(crate) link_in_free_ns: TimeNs,
    pub(crate) install_busy: bool,
    pub(crate) install_end_ns: TimeNs,
    pub(crate) completions: Vec<CompletionRecord>,
    pub(crate) waiters: BTreeMap<u64, Vec<Waiter>>,
    pub(crate) gc: BTreeMap<u32, GcPass>,
    /// GC passes started per channel (paces static wear levelling).
    pub(crate) gc_passes: Vec<u64>,
    pub(crate) ckpt: Option<CkptInProgress>,
    /// The checkpoint timer found a checkpoint running and waits for it to end.
    pub(crate) ckpt_timer_parked: bool,
    pub(crate) ckpt_seq: u64,
    pub(crate) durable_ckpt: Option<CheckpointRecord>,
    /// The newest checkpoint record programmed (durable or not yet): a log bridge reissues
    /// it, so that it stays the newest.
    pub(crate) newest_ckpt_record: Option<CheckpointRecord>,
    /// Log bridges at or after the durable checkpoint's RSSP block, by log block sequence.
    pub(crate) log_bridges: BTreeMap<u64, Vec<Ppn>>,
    pub(crate) ckpt_block: usize,
    /// Which of the two checkpoint EBLOCKs holds the newest record programmed.
    pub(crate) ckpt_newest_block: usize,
    pub(crate) bbt_version: u64,
    pub(crate) stats: OxStats,
    pub(crate) hash: EventLogHash,
    pub(crate) fatal: Option<OxError>,
    /// A checkpoint was started to free log space for waiting contexts (reset by an erase).
    pub(crate) space_checkpoint_tried: bool,
    /// A GC pass gave up for want of free EBLOCKs while a checkpoint or an erase was about
    /// to free some (`redrive_stalled`).
    pub(crate) gc_gave_up: bool,
    /// Recovery's first checkpoint is under way: GC waits for it (`finish_recovery`).
    pub(crate) recovering: bool,
    /// Why the device refuses writes: recovery found no free EBLOCK for the log.
    pub(crate) read_only: Option<String>,
    /// EBLOCKs whose erase record is logged but which are not erased yet, with its LSN.
    pub(crate) pending_erases: BTreeMap<u32, u64>,
    pub(crate) wcache: WriteCache,
    /// Served with real bytes (`capture_read_bytes`): the bytes each read returns, taken
    /// from the flash image when the read looks MAP up, by request; `None` otherwise.
    pub(crate) read_bytes: Option<BTreeMap<RequestId, Result<Vec<u8>, String>>>,
}

impl OxController {
    /// Formats a fresh medium: finds the system blocks, writes the bad-block tables and the
    /// first checkpoint record, and returns an empty device at time zero.
    pub fn format(cfg: &OxConfig, seed: u64) -> Result<OxController, OxError> {
        Self::format_media(Media::new(cfg, seed)?)
    }

    /// Formats a fresh medium that the caller built (one with a flash image, say).
    pub fn format_media(media: Media) -> Result<OxController, OxError> {
        let cfg = &media.config().clone();
        let mut c = Self::empty(media)?;
        for ch in 0..cfg.channels {
            c.write_bbt(ch, 0)?;
        }
        c.reserve_log_links()?;
        let rec = c.build_checkpoint_record(0, c.log.next_lsn);
        c.write_checkpoint_record(rec.clone(), 0)?;
        c.durable_ckpt = Some(rec);
        c.ckpt_seq = 1;
        if cfg.checkpoint.enabled {
            c.events
                .push(cfg.checkpoint.interval_ns, Event::CheckpointTimer);
        }
        Ok(c)
    }

    /// A controller with empty volatile state over `media`.
    pub(crate) fn empty(media: Media) -> Result<OxController, OxError> {
        let cfg = media.config().clone();
        let system = SystemBlocks::locate(&media)?;
        let prov = Provisioner::new(&media, &system);
        let t = &cfg.terms;
        let map = Map::new(
            cfg.logical_pages,
            cfg.map_entries_per_page(),
            cfg.map_cache_pages as usize,
        );
        let gbitv = Gbitv::new(cfg.eblocks_total(), t.rblocks_per_eblock(), t.wblock_bytes);
        let wear = Wear::new(cfg.eblocks_total(), t.wblock_bytes);
        Ok(OxController {
            log: LogState::new(1, 0, t.wblock_bytes),
            log_forming: VecDeque::new(),
            log_open: vec![None; cfg.channels as usize],
            log_channel_cursor: 0,
            events: EventQueue::new(),
            now_ns: 0,
            cores_free_ns: vec![0; cfg.costs.cores as usize],
            read_threads_free_ns: vec![0; cfg.costs.read_lookup_threads as usize],
            next_request: 1,
            next_ctx: 1,
            next_gc_seq: 1,
            requests: BTreeMap::new(),
            contexts: BTreeMap::new(),
            starting: BTreeMap::new(),
            next_start: 1,
            stalled: VecDeque::new(),
            amend_stalled: VecDeque::new(),
            install_next: 1,
            link_in_free_ns: 0,
            install_busy: false,
            install_end_ns: 0,
            completions: Vec::new(),
            waiters: BTreeMap::new(),
            gc: BTreeMap::new(),
            gc_passes: vec![0; cfg.channels as usize],
            ckpt: None,
            ckpt_timer_parked: false,
            ckpt_seq: 0,
            durable_ckpt: None,
            newest_ckpt_record: None,
            log_bridges: BTreeMap::new(),
            ckpt_block: 0,
            ckpt_newest_block: 0,
            bbt_version: 0,
            stats: OxStats::default(),
            hash: EventLogHash::new(),
            fatal: None,
            space_checkpoint_tried: false,
            gc_gave_up: false,
            recovering: false,
            read_only: None,
            pending_erases: BTreeMap::new(),
            wcache: WriteCache::default(),
            read_bytes: None,
            cfg,
            media,
            system,
            prov,
            map,
            gbitv,
            wear,
        })
    }

    pub fn config(&self) -> &OxConfig {
        &self.cfg
    }
    pub fn stats(&self) -> &OxStats {
        &self.stats
    }
    pub fn media(&self) -> &Media {
        &self.media
    }
    /// The medium's byte plane, if it has one (a served device stages host bytes in it).
    pub fn image_mut(&mut self) -> Option<&mut FlashImage> {
        self.media.image_mut()
    }
    pub fn now_ns(&self) -> TimeNs {
        self.now_ns
    }
    /// Hash of every event processed: two runs of one seed must agree.
    pub fn event_hash(&self) -> u64 {
        self.hash.value()
    }
    pub fn logical_pages(&self) -> u64 {
        self.cfg.logical_pages
    }
    /// Whether a checkpoint is being written.
    pub fn checkpoint_in_progress(&self) -> bool {
        self.ckpt.is_some()
    }
    /// Channels whose GC is running.
    pub fn gc_active(&self) -> bool {
        !self.gc.is_empty()
    }

    // ----- time and cores -------------------------------------------------------------

    /// Runs `cost_ns` of controller software on the earliest free core, no earlier than
    /// `ready_ns`; returns when it ends.
    pub(crate) fn cpu(&mut self, ready_ns: TimeNs, cost_ns: u64) -> TimeNs {
        let (i, _) = self
            .cores_free_ns
            .iter()
            .enumerate()
            .min_by_key(|(i, &t)| (t, *i))
            .expect("at least one core");
        let start = ready_ns.max(self.cores_free_ns[i]);
        let end = start + cost_ns;
        self.cores_free_ns[i] = end;
        end
    }

    fn link_ns(&self, bytes: u64) -> u64 {
        transfer_ns(bytes, self.cfg.costs.link_mb_s)
    }

    /// The time of the next internal event.
    pub fn next_event_ns(&self) -> Option<TimeNs> {
        self.events.peek_time()
    }

    /// Processes every event up to and including `t_ns`, then moves the clock to `t_ns`.
    pub fn advance_to(&mut self, t_ns: TimeNs) {
        while let Some(t) = self.events.peek_time() {
            if t > t_ns {
                break;
            }
            let (t, ev) = self.events.pop().expect("peeked");
            self.now_ns = self.now_ns.max(t);
            let (kind, detail) = ev.code();
            self.hash.record(t, kind, detail);
            self.handle(ev);
            if self.events.peek_time().is_none() && self.anything_stalled() {
                // Nothing is left to happen, so nothing will free space for the contexts
                // that wait for it: they fail now rather than wait for ever. Checking only
                // when a GC pass, an erase or a checkpoint ended missed the case where the
                // last event was a log write (no GC, no periodic checkpoint).
                self.fail_stalled_if_hopeless();
            }
            if self.fatal.is_some() && !self.requests.is_empty() {
                self.fail_all_requests();
            }
        }
        self.now_ns = self.now_ns.max(t_ns);
        self.media.settle(self.now_ns);
    }

    /// The controller hit an error it cannot absorb: every outstanding command fails with it.
    fn fail_all_requests(&mut self) {
        let e = self.fatal.clone().expect("fatal is set");
        let now = self.now_ns;
        for (id, r) in std::mem::take(&mut self.requests) {
            if r.acked {
                // The host has its acknowledgement; the fatal error answers what comes next.
                continue;
            }
            self.completions.push(CompletionRecord {
                id,
                submitted_ns: r.submitted_ns,
                done_ns: now,
                result: Err(e.clone()),
            });
        }
    }

    /// Why the device refuses writes, when it came up read-only.
    pub fn read_only(&self) -> Option<&str> {
        self.read_only.as_deref()
    }

    /// The error that stopped the controller, if any.
    pub fn fatal_error(&self) -> Option<&OxError> {
        self.fatal.as_ref()
    }

    /// Completions delivered so far, in order; the caller takes them.
    pub fn take_completions(&mut self) -> Vec<CompletionRecord> {
        std::mem::take(&mut self.completions)
    }

    /// Processes events until request `id` completes and returns its completion (other
    /// completions stay queued for `take_completions`).
    pub fn run_until_complete(&mut self, id: RequestId) -> Result<CompletionRecord, OxError> {
        loop {
            if let Some(pos) = self.completions.iter().position(|c| c.id == id) {
                return Ok(self.completions.remove(pos));
            }
            if !self.requests.contains_key(&id) {
                return Err(OxError::UnknownRequest(id));
            }
            match self.events.peek_time() {
                Some(t) => self.advance_to(t),
                None => return Err(OxError::Stuck(id)),
            }
        }
    }

    /// Whether any request, context, GC pass, checkpoint or log block is under way.
    pub fn busy(&self) -> bool {
        // A device that failed does nothing more: work under way then waits for ever, and a
        // host waiting for it to go idle (a stonewall) waited with it, timer tick by tick.
        // Every later command fails with the error instead.
        self.fatal.is_none() && self.busy_with_work()
    }

    fn busy_with_work(&self) -> bool {
        !self.requests.is_empty()
            || !self.contexts.is_empty()
            || !self.gc.is_empty()
            || self.ckpt.is_some()
            || !self.log_forming.is_empty()
            || !self.waiters.is_empty()
    }

    /// Processes events until nothing is under way (periodic checkpoints aside).
    pub fn quiesce(&mut self) {
        while self.busy() {
            match self.events.peek_time() {
                Some(t) => self.advance_to(t),
                None => break,
            }
        }
    }

    // ----- submission -----------------------------------------------------------------

    /// Submits a command at `now_ns`. Bad input is refused at once with a typed error; the
    /// command's completion arrives later (see `run_until_complete`, `take_completions`).
    pub fn submit(&mut self, now_ns: TimeNs, request: Request) -> Result<RequestId, OxError> {
        if let Some(e) = &self.fatal {
            return Err(e.clone());
        }
        if now_ns < self.now_ns {
            return Err(OxError::TimeWentBackwards {
                now_ns,
                clock_ns: self.now_ns,
            });
        }
        self.validate(&request)?;
        if let Some(reason) = &self.read_only {
            if !request.is_read() {
                return Err(OxError::ReadOnly(reason.clone()));
            }
        }
        self.advance_to(now_ns);
        let id = self.next_request;
        self.next_request += 1;
        let c = self.cfg.costs.clone();
        let rb = self.cfg.terms.rblock_bytes as u64;
        match &request {
            Request::FlushBatch(buf) => {
                // The controller waits for every packet of the buffer (DESC included) and
                // then creates one write context for all of it.
                let bytes = (buf.tokens.len() as u64 + 1) * rb;
                self.stats.write_commands += 1;
                self.stats.write_command_bytes += bytes;
                let start = now_ns.max(self.link_in_free_ns);
                self.link_in_free_ns = start + self.link_ns(bytes);
                let arrive = self.link_in_free_ns + c.transport_latency_ns;
                self.events.push(arrive, Event::Arrive(id));
            }
            Request::WriteBlocks { tokens, .. } => {
                let bytes = tokens.len() as u64 * rb;
                self.stats.write_commands += 1;
                self.stats.write_command_bytes += bytes;
                // Packets are handled as they arrive; `Arrive` of the request only counts
                // them, each packet's context starts at its own arrival.
                self.events
                    .push(now_ns + c.transport_latency_ns, Event::Arrive(id));
            }
            // A command capsule is a few dozen bytes, but on the one connection it follows
            // the data of every write sent before it, so it arrives only after that data.
            Request::TrimBlocks { .. } => {
                let start = now_ns.max(self.link_in_free_ns);
                self.events
                    .push(start + c.transport_latency_ns, Event::Arrive(id));
            }
            Request::ReadLpid(_) | Request::ReadBatch(_) | Request::ReadBlocks { .. } => {
                self.stats.read_commands += 1;
                let start = now_ns.max(self.link_in_free_ns);
                self.events
                    .push(start + c.transport_latency_ns, Event::Arrive(id));
            }
        }
        self.requests.insert(
            id,
            PendingRequest {
                submitted_ns: now_ns,
                request,
                outstanding: 0,
                result: None,
                ready_ns: now_ns,
                packets: VecDeque::new(),
                to_accept: 0,
                accept_ready_ns: now_ns,
                acked: false,
            },
        );
        Ok(id)
    }

    fn check_lpid(&self, lpid: u64) -> Result<(), OxError> {
        if lpid >= self.cfg.logical_pages {
            return Err(OxError::LpidOutOfRange {
                lpid,
                capacity: self.cfg.logical_pages,
            });
        }
        Ok(())
    }

    fn validate(&self, request: &Request) -> Result<(), OxError> {
        let max = self.cfg.max_batch_pages as usize;
        match request {
            Request::FlushBatch(buf) => {
                let desc = Desc::parse(&buf.desc_block)?;
                if desc.lpids.len() != buf.tokens.len() {
                    return Err(OxError::DescMismatch {
                        listed: desc.lpids.len(),
                        carried: buf.tokens.len(),
                    });
                }
                if desc.lpids.is_empty() {
                    return Err(OxError::EmptyBatch);
                }
                if desc.lpids.len() > max {
                    return Err(OxError::BatchTooLarge {
                        pages: desc.lpids.len(),
                        max,
                    });
                }
                for &l in &desc.lpids {
                    self.check_lpid(l)?;
                }
            }
            Request::ReadLpid(l) => self.check_lpid(*l)?,
            Request::ReadBatch(ls) => {
                if ls.is_empty() {
                    return Err(OxError::EmptyBatch);
                }
                if ls.len() > max {
                    return Err(OxError::BatchTooLarge {
                        pages: ls.len(),
                        max,
                    });
                }
                for &l in ls {
                    self.check_lpid(l)?;
                }
            }
            Request::WriteBlocks { lba, tokens } => {
                if tokens.is_empty() {
                    return Err(OxError::EmptyBatch);
                }
                self.check_range(*lba, tokens.len() as u64)?;
            }
            Request::ReadBlocks { lba, count } | Request::TrimBlocks { lba, count } => {
                if *count == 0 {
                    return Err(OxError::EmptyBatch);
                }
                self.check_range(*lba, *count as u64)?;
            }
        }
        Ok(())
    }

    fn check_range(&self, lba: u64, count: u64) -> Result<(), OxError> {
        let end = lba.saturating_add(count);
        if end > self.cfg.logical_pages {
            return Err(OxError::LpidOutOfRange {
                lpid: end - 1,
                capacity: self.cfg.logical_pages,
            });
        }
        Ok(())
    }

    // ----- event dispatch -------------------------------------------------------------

    fn handle(&mut self, ev: Event) {
        match ev {
            Event::Arrive(id) => self.on_arrive(id),
            Event::StartContext(k) => self.on_start_context(k),
            Event::ReadIssue(id) => self.on_read_issue(id),
            Event::LogSeal(seq) => self.on_log_seal(seq),
            Event::LogDurable {
                block_seq,
                last_lsn,
            } => self.on_log_durable(block_seq, last_lsn),
            Event::DataDone(ctx) => self.on_data_done(ctx),
            Event::Install { ctx, idx } => self.on_install(ctx, idx),
            Event::Complete(id) => self.on_complete(id),
            Event::GcCheck(ch) => self.on_gc_check(ch),
            Event::GcCopiesDone(ch) => self.on_gc_copies_done(ch),
            Event::Erase { block, gc_channel } => self.on_erase(block, gc_channel),
            Event::CheckpointTimer => self.on_checkpoint_timer(),
            Event::ForcedCheckpoint => {
                self.checkpoint_now();
            }
            Event::CkptRecord(seq) => self.on_ckpt_record(seq),
            Event::CkptDone(seq) => self.on_ckpt_done(seq),
            Event::Ack(id) => self.on_ack(id),
            Event::AdmitWaiting => self.on_admit_waiting(),
            Event::RetryStalled => self.retry_stalled(),
        }
    }

    fn on_arrive(&mut self, id: RequestId) {
        let now = self.now_ns;
        let Some(req) = self.requests.get(&id) else {
            return;
        };
        let request = req.request.clone();
        let c = self.cfg.costs.clone();
        let rb = self.cfg.terms.rblock_bytes as u64;
        match request {
            Request::FlushBatch(buf) => {
                let desc = Desc::parse(&buf.desc_block).expect("validated at submit");
                self.set_contexts_to_accept(id, 1);
                let t = self.cpu(now, c.command_cpu_ns);
                self.add_context(t, id, desc.lpids, buf.tokens, false);
            }
            Request::WriteBlocks { lba, tokens } => {
                // Packet k carries bytes [k·P, (k+1)·P) of the buffer; an RBLOCK belongs to
                // the packet that completes it.
                // Each packet is its own context. At most `block_packet_contexts` of one
                // command are under way at once; a further packet's context starts once it
                // has arrived and an earlier one is installed (1 makes every internal write
                // at most a packet, as §8.2.1 describes; 0 lets all run at once).
                let p = c.packet_bytes as u64;
                let total = tokens.len() as u64 * rb;
                let packets = total.div_ceil(p);
                let mut first = 0u64;
                let mut queue = VecDeque::new();
                // The packets follow the data of the writes submitted before this one.
                let base = now.max(self.link_in_free_ns + c.transport_latency_ns);
                self.link_in_free_ns = base - c.transport_latency_ns + self.link_ns(total);
                for k in 0..packets {
                    let end_byte = ((k + 1) * p).min(total);
                    let last = end_byte / rb;
                    let arrive = base + self.link_ns(end_byte);
                    if last > first {
                        let range = first as usize..last as usize;
                        let lpids = range.clone().map(|i| lba + i as u64).collect();
                        queue.push_back((arrive, lpids, tokens[range].to_vec()));
                        first = last;
                    }
                }
                let limit = match c.block_packet_contexts {
                    0 => usize::MAX,
                    n => n as usize,
                };
                let mut started = Vec::new();
                while started.len() < limit {
                    match queue.pop_front() {
                        Some(p) => started.push(p),
                        None => break,
                    }
                }
                self.set_contexts_to_accept(id, (started.len() + queue.len()) as u32);
                if let Some(r) = self.requests.get_mut(&id) {
                    r.outstanding += queue.len() as u32;
                    r.packets = queue;
                }
                for (arrive, lpids, toks) in started {
                    let t = self.cpu(arrive, c.command_cpu_ns);
                    self.add_context(t, id, lpids, toks, false);
                }
            }
            Request::TrimBlocks { lba, count } => {
                self.set_contexts_to_accept(id, 1);
                let t = self.cpu(now, c.command_cpu_ns);
                let lpids = (lba..lba + count as u64).collect::<Vec<_>>();
                let zeros = vec![0; lpids.len()];
                self.add_context(t, id, lpids, zeros, true);
            }
            Request::ReadLpid(_) | Request::ReadBatch(_) | Request::ReadBlocks { .. } => {
                let t = self.cpu(now, c.command_cpu_ns);
                self.events.push(t, Event::ReadIssue(id));
            }
        }
    }

    fn set_contexts_to_accept(&mut self, id: RequestId, n: u32) {
        if let Some(r) = self.requests.get_mut(&id) {
            r.to_accept = n;
        }
    }

    fn add_context(
        &mut self,
        t: TimeNs,
        id: RequestId,
        lpids: Vec<u64>,
        tokens: Vec<u64>,
        trim: bool,
    ) {
        if let Some(r) = self.requests.get_mut(&id) {
            r.outstanding += 1;
        }
        let k = self.next_start;
        self.next_start += 1;
        self.starting.insert(
            k,
            PendingContext {
                request: id,
                lpids,
                tokens,
                trim,
                held: Vec::new(),
                cache_key: 0,
            },
        );
        self.events.push(t, Event::StartContext(k));
    }

    fn on_start_context(&mut self, k: u64) {
        if self.admit_on_start(k) {
            self.start_admitted(k);
        }
    }

    /// Starts context `k`, admitted to the write cache.
    pub(crate) fn start_admitted(&mut self, k: u64) {
        let Some(p) = self.starting.remove(&k) else {
            return;
        };
        if !self.anything_stalled() {
            if let Some(p) = self.try_start_context(p) {
                self.stall(p);
            }
        } else {
            // Keep arrival order: a context may not overtake one that waits for space, nor
            // take the space a failed program's retry waits for.
            self.stall(p);
        }
    }

    fn stall(&mut self, p: PendingContext) {
        self.stats.stalled_contexts += 1;
        self.stalled.push_back(p);
        for ch in 0..self.cfg.channels {
            self.events.push(self.now_ns, Event::GcCheck(ch));
        }
        self.fail_stalled_if_hopeless();
    }

    /// Whether a context or a failed program's retry waits for space.
    pub(crate) fn anything_stalled(&self) -> bool {
        !self.stalled.is_empty() || !self.amend_stalled.is_empty()
    }

    /// Readdresses failed programs, then starts contexts that waited for space, in order,
    /// as far as space allows.
    pub(crate) fn retry_stalled(&mut self) {
        while let Some(&ctx) = self.amend_stalled.front() {
            // Nothing is left to readdress here when the context is gone or has no
            // unaddressed program left, and a context whose earlier RDESC_A is not yet
            // durable readdresses the rest itself once its retry is programmed
            // (`program_context`).
            let readdressed_elsewhere = self
                .contexts
                .get(&ctx)
                .is_none_or(|c| c.unaddressed.is_empty() || !c.failed.is_empty());
            if readdressed_elsewhere || self.amend_context(ctx, self.now_ns) {
                self.amend_stalled.pop_front();
            } else {
                return;
            }
        }
        while let Some(p) = self.stalled.pop_front() {
            if let Some(p) = self.try_start_context(p) {
                self.stalled.push_front(p);
                break;
            }
        }
    }

    /// When nothing can free space any more, the waiting contexts fail with `NoSpace`.
    pub(crate) fn fail_stalled_if_hopeless(&mut self) {
        if !self.anything_stalled() || !self.gc.is_empty() {
            return;
        }
        // Channels closed for a GC pass that is no longer running reopen first.
        for ch in 0..self.cfg.channels {
            self.prov.gc_channels[ch as usize] = false;
        }
        self.wake_gc_turn_waiters();
        self.retry_stalled();
        if !self.anything_stalled() {
            return;
        }
        // With GC off a victim frees nothing: waiting for one would wait for ever.
        let any_victim =
            self.cfg.gc.enabled && (0..self.cfg.channels).any(|ch| self.pick_victim(ch).is_some());
        // Contexts under way will install, and each lets the next checkpoint's RSSP move on
        // past its RDESC and truncate more of the log: with a small MAP cache the installs
        // crawl, the log pinned behind them took 213 of 752 EBLOCKs in a soak, and writes
        // the write-back cache had acknowledged failed as hopeless while they went on. Only
        // those before the first context whose retry waits for a WBLOCK can install.
        let blocked_from_ctx = self.amend_stalled.iter().copied().min().unwrap_or(u64::MAX);
        let installable = self
            .contexts
            .keys()
            .next()
            .is_some_and(|&k| k < blocked_from_ctx);
        if any_victim || !self.waiters.is_empty() || self.ckpt.is_some() || installable {
            return;
        }
        // A checkpoint may truncate the log and free its EBLOCKs: try that once.
        if !self.space_checkpoint_tried {
            self.space_checkpoint_tried = true;
            self.start_checkpoint();
            return;
        }
        while let Some(p) = self.stalled.pop_front() {
            self.fail_context(p);
        }
        // Data the host already sent has nowhere to go: the device cannot go on.
        if !self.amend_stalled.is_empty() {
            self.fatal = Some(OxError::NoSpace);
        }
    }

    /// A waiting context fails for lack of space.
    pub(crate) fn fail_context(&mut self, p: PendingContext) {
        self.forget_failed(&p);
        // WBLOCKs it held are programmed as padding, so that the EBLOCKs' program order
        // stays intact for whoever writes after them.
        for ppn in p.held {
            let b = self.media.block_of_ppn(ppn) as usize;
            self.prov.blocks[b].inflight -= 1;
            let now = self.now_ns;
            if let Err(e) = self.media.program(ppn, now, &[], None) {
                self.absorb_program_failure(ppn, e);
            }
        }
        self.finish_part(p.request, Some(Err(OxError::NoSpace)), self.now_ns);
    }

    /// Tries to give a context its addresses and append its RDESC; hands it back when not
    /// every WBLOCK can be had yet. The WBLOCKs it got stay reserved for it: WBLOCKs of an
    /// EBLOCK are handed out in order and must be programmed in that order, and the contexts
    /// behind it wait (they may not overtake it), so nothing else programs after them.
    fn try_start_context(&mut self, mut p: PendingContext) -> Option<PendingContext> {
        if self.log_pinned_too_far() {
            return Some(p);
        }
        let now = self.now_ns;
        let spp = self.media.rblocks_per_wblock() as usize;
        let n = p.lpids.len();
        let wblocks_needed = if p.trim { 0 } else { n.div_ceil(spp) };
        while p.held.len() < wblocks_needed {
            match self.prov.alloc(&self.media, Stream::Hot) {
                Some(ppn) => {
                    self.gc_trigger_for(ppn);
                    let b = self.media.block_of_ppn(ppn) as usize;
                    // Held WBLOCKs keep their EBLOCK away from GC until the context installs.
                    self.prov.blocks[b].inflight += 1;
                    p.held.push(ppn);
                }
                None => return Some(p),
            }
        }
        let wblocks = std::mem::take(&mut p.held);
        for &ppn in &wblocks {
            let b = self.media.block_of_ppn(ppn) as usize;
            self.prov.blocks[b].inflight -= 1;
        }
        self.start_with(p, wblocks, now);
        None
    }

    /// Whether the log written since the oldest context not yet installed has reached the
    /// META streams' checkpoint margin (`OxConfig::meta_trigger_eblocks`, in log blocks).
    /// No checkpoint can truncate the log past that context's RDESC, so while installs lag
    /// (a small MAP cache makes each one wait for MAP page loads) everything logged after
    /// it — RDESCs, GC and checkpoint records — stays on flash. New contexts wait until
    /// the installs catch up: in a soak the log behind one such context took 213 of 752
    /// EBLOCKs, GC and a checkpoint then found no free EBLOCK, and writes the write-back
    /// cache had acknowledged were lost.
    fn log_pinned_too_far(&self) -> bool {
        let Some(oldest) = self.contexts.values().next() else {
            return false;
        };
        let pinned_blocks = self.log.next_block_seq - oldest.rdesc_block_seq;
        let budget_blocks =
            self.cfg.meta_trigger_eblocks() * self.media.wblocks_per_eblock() as u64;
        pinned_blocks > budget_blocks
    }

    fn start_with(&mut self, p: PendingContext, wblocks: Vec<Ppn>, now: TimeNs) {
        let spp = self.media.rblocks_per_wblock() as usize;
        let n = p.lpids.len();
        let ctx = self.next_ctx;
        self.next_ctx += 1;
        self.stats.contexts += 1;
        let mut new = Vec::with_capacity(n);
        if p.trim {
            new.resize(n, Ppa::NONE);
        } else {
            // LPAGEs fill the WBLOCKs in buffer order; the last one is padded.
            for i in 0..n {
                let w = i / spp;
                new.push(self.media.ppa(wblocks[w], (i % spp) as u32));
                let b = self.media.block_of_ppn(wblocks[w]);
                self.prov.blocks[b as usize].inflight += 1;
            }
        }
        // Look up every prior address (loading MAP pages on demand), then append the RDESC.
        let mut ready = now;
        let mut entries = Vec::with_capacity(n);
        for (i, &lpid) in p.lpids.iter().enumerate() {
            let (t, e) = self.map_lookup(lpid, now);
            ready = ready.max(t);
            entries.push(RdescEntry {
                lpid,
                prior: e.ppa(),
                new: new[i],
            });
        }
        let costs = &self.cfg.costs;
        let cost = costs
            .context_cpu_ns
            .saturating_add(costs.page_cpu_ns.saturating_mul(n as u64))
            .saturating_add(costs.log_record_cpu_ns);
        let t = self.cpu(ready, cost);
        self.stats.rdesc_records += 1;
        let lsn = self.log_append(LogRecord::Rdesc { ctx, entries }, t);
        self.contexts.insert(
            ctx,
            Context {
                request: p.request,
                lpids: p.lpids,
                tokens: p.tokens,
                new,
                wblocks,
                failed: Vec::new(),
                unaddressed: Vec::new(),
                data_end_ns: t,
                data_done: false,
                trim: p.trim,
                rdesc_lsn: lsn,
                // A record joins the newest forming block or opens the next one.
                rdesc_block_seq: self.log.next_block_seq - 1,
                cache_key: p.cache_key,
            },
        );
        self.wait_log(lsn, Waiter::RdescDurable(ctx));
    }

    // ----- MAP access -----------------------------------------------------------------

    /// The MAP entry of `lpid`, loading its MAP page when it is not cached. Returns when the
    /// entry is available.
    pub(crate) fn map_lookup(&mut self, lpid: u64, ready_ns: TimeNs) -> (TimeNs, MapEntry) {
        let t = self.ensure_map_page(lpid, ready_ns);
        (t, self.map.get(lpid).expect("page is cached"))
    }

    /// Makes the MAP page of `lpid` resident; returns when it is.
    pub(crate) fn ensure_map_page(&mut self, lpid: u64, ready_ns: TimeNs) -> TimeNs {
        match self.map.probe(lpid) {
            MapMiss::Hit { ready_ns: loaded } => ready_ns.max(loaded),
            MapMiss::Load { page, ppn } => {
                // A full cache frees a slot first. OX writes a dirty page out before its slot
                // takes the new page (`map_load_pg_cache` in ox-ctrl's oxb-gl-map.c evicts,
                // then reads), so the load waits for that program; MAP_S then points at the
                // new copy (the checkpoint makes it durable).
                let mut start = ready_ns;
                if let Some(ev) = self.map.make_room() {
                    self.stats.map_page_evictions_written += 1;
                    start = self.write_table_page(TableId::Map, ev.page, ev.words, ready_ns);
                }
                let (end, words) = if ppn == NO_PPN {
                    (start, None)
                } else {
                    self.stats.map_page_loads += 1;
                    let (end, blob) = self.media.read_wblock(ppn, start);
                    let words = match blob {
                        Some(MetaBlob::Table(TablePage {
                            table: TableId::Map,
                            index,
                            words,
                        })) if *index == page => Some(words.clone()),
                        _ => {
                            self.fatal = Some(OxError::Recovery(format!(
                                "MAP page {page} is not readable at WBLOCK {ppn}"
                            )));
                            None
                        }
                    };
                    (end, words)
                };
                self.stats.map_page_load_ns_total += end - ready_ns;
                // The slot was freed above, so inserting pushes nothing out; should it ever,
                // the page is written rather than lost.
                if let Some(ev) = self.map.insert_page(page, words.as_deref(), end) {
                    self.stats.map_page_evictions_written += 1;
                    self.write_table_page(TableId::Map, ev.page, ev.words, end);
                }
                self.reflag_loaded_page(page);
                end
            }
        }
    }

    /// Programs one table page in the table stream and points its directory entry at it.
    /// Returns the program's end.
    pub(crate) fn write_table_page(
        &mut self,
        table: TableId,
        index: u32,
        words: Vec<u64>,
        ready_ns: TimeNs,
    ) -> TimeNs {
        let spp = self.media.rblocks_per_wblock();
        // The TAG of a table page carries the log's next LSN when it was written: recovery
        // compares it with erase records to tell an EBLOCK rewritten since its erase.
        let stamp = self.log.next_lsn;
        let rblocks: Vec<RblockWrite> = (0..spp)
            .map(|_| {
                RblockWrite::meta(Tag::new(
                    TagKind::Table,
                    table_code(table) << 32 | index as u64,
                    stamp,
                ))
            })
            .collect();
        let page = TablePage {
            table,
            index,
            words,
        };
        loop {
            let Some(ppn) = self.prov.alloc(&self.media, Stream::Table) else {
                self.fatal = Some(OxError::NoSpace);
                return ready_ns;
            };
            self.gc_trigger_for(ppn);
            match self
                .media
                .program(ppn, ready_ns, &rblocks, Some(MetaBlob::Table(page.clone())))
            {
                Ok(end) => {
                    self.stats.table_pages_written += 1;
                    let old = match table {
                        TableId::Map => self.map.page_written(index, ppn),
                        TableId::MapS => {
                            std::mem::replace(&mut self.map.map_t[index as usize], ppn)
                        }
                        TableId::Gbitv => self.gbitv.gbitv_s.set(index as usize, ppn),
                        TableId::GbitvS => {
                            std::mem::replace(&mut self.gbitv.gbitv_t[index as usize], ppn)
                        }
                        TableId::Wear => self.wear.wear_s.set(index as usize, ppn),
                    };
                    self.table_ref(ppn, 1);
                    if old != NO_PPN {
                        self.table_ref(old, -1);
                        self.reclaim_dead_table_block(self.media.block_of_ppn(old), end);
                    }
                    return end;
                }
                Err(e) => {
                    if !self.absorb_program_failure(ppn, e) {
                        return ready_ns;
                    }
                }
            }
        }
    }

    /// Reclaims a FULL table EBLOCK as soon as no current table page and no page of the
    /// durable checkpoint is left in it, unless a checkpoint is under way (its record may
    /// still reach pages the current tables have moved past; its end reclaims them).
    /// Waiting for the next checkpoint instead let pages pushed out of a small MAP cache
    /// pile up: with EBLOCKs of four WBLOCKs, GC's MAP updates wrote dead table EBLOCKs
    /// faster than checkpoints gave them back, until the log had no EBLOCK left for the
    /// erase records that would have freed them. Recovery's redo, which writes table pages
    /// before the log continues (and before `durable_ckpt` is set), leaves them to the
    /// checkpoint that ends recovery.
    fn reclaim_dead_table_block(&mut self, block: u32, ready_ns: TimeNs) {
        let m = &self.prov.blocks[block as usize];
        if self.ckpt.is_none()
            && self.durable_ckpt.is_some()
            && m.state == BlockState::Full
            && m.stream == Some(Stream::Table)
            && m.table_refs_current == 0
            && m.table_refs_durable == 0
        {
            self.stats.table_eblocks_reclaimed += 1;
            self.reclaim_meta_block(block, ready_ns);
        }
    }

    pub(crate) fn table_ref(&mut self, ppn: Ppn, delta: i32) {
        let b = self.media.block_of_ppn(ppn) as usize;
        let m = &mut self.prov.blocks[b];
        m.table_refs_current = (m.table_refs_current as i64 + delta as i64).max(0) as u32;
    }

    /// A program failed at `ppn`: the EBLOCK is closed and will be retired once its live
    /// content has moved. Returns false (and records a fatal error) for other errors.
    pub(crate) fn absorb_program_failure(&mut self, ppn: Ppn, e: NandError) -> bool {
        match e {
            NandError::ProgramFailed { .. } => {
                let b = self.media.block_of_ppn(ppn);
                self.prov.blocks[b as usize].retire = true;
                self.prov.close_block(b);
                true
            }
            other => {
                self.fatal = Some(OxError::Nand(other));
                false
            }
        }
    }

    // ----- the write path -------------------------------------------------------------

    /// The context's RDESC (or RDESC_A) is durable: program its (remaining) WBLOCKs.
    fn program_context(&mut self, ctx: u64, amend: bool) {
        let now = self.now_ns;
        let spp = self.media.rblocks_per_wblock();
        let Some(c) = self.contexts.get(&ctx) else {
            return;
        };
        let (trim, n) = (c.trim, c.lpids.len() as u32);
        if trim {
            let end = now;
            let c = self.contexts.get_mut(&ctx).expect("present");
            c.data_end_ns = end;
            self.events.push(end, Event::DataDone(ctx));
            return;
        }
        // Entries to program, grouped by WBLOCK in order.
        let todo: Vec<u32> = if amend {
            std::mem::take(&mut self.contexts.get_mut(&ctx).expect("present").failed)
        } else {
            (0..n).collect()
        };
        let c = self.contexts.get(&ctx).expect("present");
        let mut by_wblock: BTreeMap<Ppn, Vec<u32>> = BTreeMap::new();
        for &i in &todo {
            let ppn = self.media.ppn_of(c.new[i as usize]);
            by_wblock.entry(ppn).or_default().push(i);
        }
        let mut failed = Vec::new();
        let mut end_max = now;
        for (ppn, idxs) in by_wblock {
            let c = self.contexts.get(&ctx).expect("present");
            let mut rblocks =
                vec![RblockWrite::meta(Tag::new(TagKind::Padding, 0, 0)); spp as usize];
            for &i in &idxs {
                let r = (c.new[i as usize].0 % spp as u64) as usize;
                rblocks[r] = RblockWrite {
                    tag: Tag::new(TagKind::User, c.lpids[i as usize], ctx),
                    token: c.tokens[i as usize],
                    source: None,
                };
            }
            let used = rblocks
                .iter()
                .filter(|r| r.tag.kind == TagKind::User)
                .count() as u64;
            match self.media.program(ppn, now, &rblocks, None) {
                Ok(end) => {
                    let rb = self.cfg.terms.rblock_bytes as u64;
                    self.stats.user_write_bytes += used * rb;
                    self.stats.padding_bytes += (spp as u64 - used) * rb;
                    end_max = end_max.max(end);
                }
                Err(e) => {
                    self.stats.data_program_failures += 1;
                    if !self.absorb_program_failure(ppn, e) {
                        return;
                    }
                    failed.extend(idxs);
                }
            }
        }
        let c = self.contexts.get_mut(&ctx).expect("present");
        c.data_end_ns = c.data_end_ns.max(end_max);
        c.unaddressed.extend(failed);
        if c.unaddressed.is_empty() {
            let end = c.data_end_ns;
            self.events.push(end, Event::DataDone(ctx));
            return;
        }
        if !self.amend_context(ctx, end_max) && !self.amend_stalled.contains(&ctx) {
            self.amend_stalled.push_back(ctx);
        }
    }

    /// RDESC_A (§4.2.2): new addresses for a context's failed LPAGEs, logged and durable
    /// before the retry is programmed. A retry is data the host already sent, so it takes
    /// WBLOCKs even in channels closed for GC, and below the free EBLOCKs held back from
    /// user writes, down to those GC's copies may take. Below that it waits for GC: the
    /// device used to stop with `NoSpace` there, though GC was running and nearly half the
    /// written flash was stale. The WBLOCKs it did get are logged and programmed at once, so
    /// that no WBLOCK is held unprogrammed while others after it in its EBLOCK are written.
    /// Returns whether every failed entry has an address.
    pub(crate) fn amend_context(&mut self, ctx: u64, ready_ns: TimeNs) -> bool {
        let spp = self.media.rblocks_per_wblock() as usize;
        let Some(c) = self.contexts.get_mut(&ctx) else {
            return true;
        };
        if !c.failed.is_empty() {
            // An RDESC_A is on its way; the rest is readdressed once its retry is programmed.
            return false;
        }
        let pending = std::mem::take(&mut c.unaddressed);
        let mut amendments = Vec::new();
        let mut new_wblocks = Vec::new();
        let mut left = Vec::new();
        for chunk in pending.chunks(spp) {
            let ppn = if left.is_empty() {
                self.amend_wblock()
            } else {
                None
            };
            let Some(ppn) = ppn else {
                left.extend_from_slice(chunk);
                continue;
            };
            new_wblocks.push(ppn);
            for (r, &i) in chunk.iter().enumerate() {
                amendments.push((i, self.media.ppa(ppn, r as u32)));
            }
        }
        let c = self.contexts.get_mut(&ctx).expect("present");
        for &(i, ppa) in &amendments {
            let old = std::mem::replace(&mut c.new[i as usize], ppa);
            let ob = self.media.block_of_ppa(old) as usize;
            self.prov.blocks[ob].inflight -= 1;
            let nb = self.media.block_of_ppa(ppa) as usize;
            self.prov.blocks[nb].inflight += 1;
        }
        c.failed = amendments.iter().map(|&(i, _)| i).collect();
        c.wblocks.extend(new_wblocks);
        c.unaddressed = left;
        let all_addressed = c.unaddressed.is_empty();
        if !amendments.is_empty() {
            self.stats.rdesc_a_records += 1;
            let t = self.cpu(ready_ns.max(self.now_ns), self.cfg.costs.log_record_cpu_ns);
            let lsn = self.log_append(LogRecord::RdescA { ctx, amendments }, t);
            self.wait_log(lsn, Waiter::AmendDurable(ctx));
        }
        if !all_addressed {
            self.stats.stalled_amendments += 1;
            for ch in 0..self.cfg.channels {
                self.events.push(self.now_ns, Event::GcCheck(ch));
            }
        }
        all_addressed
    }

    /// A WBLOCK for a failed program's retry. A context waiting for space may hold WBLOCKs
    /// it could not yet use (`try_start_context`); they are the next to be programmed in
    /// their EBLOCKs, so the retry takes those first: a WBLOCK allocated after them in the
    /// same EBLOCK could not be programmed before they are.
    fn amend_wblock(&mut self) -> Option<Ppn> {
        if let Some(p) = self.stalled.iter_mut().find(|p| !p.held.is_empty()) {
            let ppn = p.held.remove(0);
            // A held WBLOCK counts once in its EBLOCK's inflight; the retry counts its
            // LPAGEs instead.
            let b = self.media.block_of_ppn(ppn) as usize;
            self.prov.blocks[b].inflight -= 1;
            return Some(ppn);
        }
        let retry_reserve = self.prov.reserve_eblocks(Stream::Cold);
        self.prov.alloc_any(&self.media, Stream::Hot).or_else(|| {
            self.prov
                .alloc_any_above(&self.media, Stream::Hot, retry_reserve)
        })
    }

    fn on_data_done(&mut self, ctx: u64) {
        if let Some(c) = self.contexts.get_mut(&ctx) {
            if c.failed.is_empty() && c.unaddressed.is_empty() {
                c.data_done = true;
            }
        }
        self.try_install();
    }

    /// Starts installing the next context in RDESC order if its data is on flash.
    fn try_install(&mut self) {
        if self.install_busy {
            return;
        }
        let ctx = self.install_next;
        let Some(c) = self.contexts.get(&ctx) else {
            return;
        };
        if !c.data_done {
            return;
        }
        self.install_busy = true;
        let start = self.now_ns.max(self.install_end_ns);
        self.events.push(
            start + self.cfg.costs.map_update_ns,
            Event::Install { ctx, idx: 0 },
        );
    }

    /// Installs MAP entry `idx` of a context; the entries go in buffer order, so a read
    /// concurrent with the install sees a prefix of the batch.
    fn on_install(&mut self, ctx: u64, idx: u32) {
        let now = self.now_ns;
        let Some(c) = self.contexts.get(&ctx) else {
            return;
        };
        let lpid = c.lpids[idx as usize];
        let new = c.new[idx as usize];
        let n = c.lpids.len() as u32;
        let key = c.cache_key;
        let resident_ns = self.ensure_map_page(lpid, now);
        if resident_ns > now {
            // The entry's MAP page is being loaded: the install (one entry at a time, in
            // order) waits for it and goes on from this entry.
            self.stats.install_map_waits += 1;
            self.events.push(resident_ns, Event::Install { ctx, idx });
            return;
        }
        let newer_cached = self.release_installed(lpid, key);
        let entry = if new.is_none() {
            MapEntry::UNMAPPED
        } else {
            MapEntry::new(new)
        };
        let old = self
            .map
            .set(lpid, entry.with_cached(newer_cached))
            .expect("page is cached")
            .ppa();
        if !old.is_none() && old != new {
            self.set_live(old, false);
        }
        if !new.is_none() {
            self.set_live(new, true);
            let b = self.media.block_of_ppa(new) as usize;
            self.prov.blocks[b].inflight -= 1;
        }
        if idx + 1 < n {
            self.events.push(
                now + self.cfg.costs.map_update_ns,
                Event::Install { ctx, idx: idx + 1 },
            );
            return;
        }
        // Installed: append `done` (not waited for, §4.2.2), then complete.
        let c = self.contexts.remove(&ctx).expect("present");
        self.stats.done_records += 1;
        let t = self.cpu(now, self.cfg.costs.log_record_cpu_ns);
        self.log_append(LogRecord::Done { ctx }, t);
        self.install_busy = false;
        self.install_end_ns = now;
        self.install_next = ctx + 1;
        // The install lets a checkpoint truncate further: one more is worth trying for the
        // contexts that wait for space, and those that waited for the log to move on may
        // start.
        if self.anything_stalled() {
            self.space_checkpoint_tried = false;
            self.events.push(now, Event::RetryStalled);
        }
        self.release_context(c.cache_key, &c.lpids, c.trim);
        self.finish_part(c.request, None, t);
        self.try_install();
    }

    /// Sets the GBITV bit of an RBLOCK.
    pub(crate) fn set_live(&mut self, ppa: Ppa, live: bool) {
        let b = self.media.block_of_ppa(ppa);
        let r = self.media.rblock_in_eblock(ppa);
        self.gbitv.set(b, r, live);
    }

    /// One part (context or the whole read) of a request finished at `t`.
    pub(crate) fn finish_part(
        &mut self,
        id: RequestId,
        result: Option<Result<Vec<u64>, OxError>>,
        t: TimeNs,
    ) {
        let latency = self.cfg.costs.transport_latency_ns;
        let Some(r) = self.requests.get_mut(&id) else {
            return;
        };
        if let Some((arrive, lpids, tokens)) = r.packets.pop_front() {
            // The next packet of a block write starts (its count is already outstanding).
            r.outstanding -= 1;
            let cost = self.cfg.costs.command_cpu_ns;
            let start = self.cpu(arrive.max(t), cost);
            let k = self.next_start;
            self.next_start += 1;
            self.starting.insert(
                k,
                PendingContext {
                    request: id,
                    lpids,
                    tokens,
                    trim: false,
                    held: Vec::new(),
                    cache_key: 0,
                },
            );
            self.events.push(start, Event::StartContext(k));
            if let Some(r) = self.requests.get_mut(&id) {
                if let Some(res) = result {
                    if r.result.as_ref().is_none_or(|x| x.is_ok()) {
                        r.result = Some(res);
                    }
                }
            }
            return;
        }
        r.outstanding = r.outstanding.saturating_sub(1);
        r.ready_ns = r.ready_ns.max(t);
        if let Some(res) = result {
            if r.result.as_ref().is_none_or(|x| x.is_ok()) {
                r.result = Some(res);
            }
        }
        if r.outstanding == 0 {
            let done = r.ready_ns + latency;
            self.events.push(done, Event::Complete(id));
        }
    }

    fn on_complete(&mut self, id: RequestId) {
        if let Some(r) = self.requests.remove(&id) {
            if r.acked {
                // The host was answered when the command entered the write-back cache.
                if let Some(Err(e)) = &r.result {
                    self.acknowledged_write_failed(id, e);
                }
                return;
            }
            if matches!(
                r.request,
                Request::ReadLpid(_) | Request::ReadBatch(_) | Request::ReadBlocks { .. }
            ) {
                self.stats.read_latency_ns_total += self.now_ns - r.submitted_ns;
            }
            self.completions.push(CompletionRecord {
                id,
                submitted_ns: r.submitted_ns,
                done_ns: self.now_ns,
                result: r.result.unwrap_or(Ok(Vec::new())),
            });
        }
    }

    // ----- the read path --------------------------------------------------------------

    fn on_read_issue(&mut self, id: RequestId) {
        let now = self.now_ns;
        let Some(r) = self.requests.get(&id) else {
            return;
        };
        let lpids: Vec<u64> = match &r.request {
            Request::ReadLpid(l) => vec![*l],
            Request::ReadBatch(ls) => ls.clone(),
            Request::ReadBlocks { lba, count } => (*lba..*lba + *count as u64).collect(),
            _ => Vec::new(),
        };
        // MAP is looked up now, for every LPAGE at once: what the read sees is fixed here.
        // With read threads (OX's LBA I/O read thread) the lookups run in the earliest free
        // thread, one LPAGE after the other, and a MAP page load holds the thread: the
        // entries are taken now, their times are those of the thread.
        let thread = self
            .read_threads_free_ns
            .iter()
            .enumerate()
            .min_by_key(|(i, &t)| (t, *i))
            .map(|(i, _)| i);
        let mut entries = Vec::with_capacity(lpids.len());
        let mut ready = now;
        match thread {
            Some(i) => {
                let mut t = now.max(self.read_threads_free_ns[i]);
                for &l in &lpids {
                    let (end, e) = self.map_lookup(l, t);
                    t = end;
                    entries.push(e);
                }
                self.read_threads_free_ns[i] = t;
                ready = t;
            }
            None => {
                for &l in &lpids {
                    let (t, e) = self.map_lookup(l, now);
                    ready = ready.max(t);
                    entries.push(e);
                }
            }
        }
        let addrs: Vec<Ppa> = entries.iter().map(|e| e.ppa()).collect();
        self.stats.read_map_wait_ns_total += ready - now;
        if ready > now {
            self.stats.read_map_miss_commands += 1;
        }
        let mut end = ready;
        let mut tokens = Vec::with_capacity(addrs.len());
        let mut i = 0;
        while i < addrs.len() {
            if entries[i].cached() {
                // A newer version waits in the write-back cache: its side table answers.
                let Some(token) = self.wcache.newest(lpids[i]) else {
                    self.fatal = Some(OxError::WriteCacheInconsistent { lpid: lpids[i] });
                    return;
                };
                self.stats.write_cache_read_rblocks += 1;
                tokens.push(token);
                i += 1;
                continue;
            }
            if addrs[i].is_none() {
                tokens.push(0);
                i += 1;
                continue;
            }
            // RBLOCKs that follow one another in one WBLOCK (a block read of a range written
            // together) share one array read of that WBLOCK.
            let ppn = self.media.ppn_of(addrs[i]);
            let mut j = i + 1;
            while j < addrs.len()
                && !entries[j].cached()
                && !addrs[j].is_none()
                && self.media.ppn_of(addrs[j]) == ppn
            {
                j += 1;
            }
            let (t, toks) = self.media.read_rblocks_of_wblock(&addrs[i..j], ready);
            self.stats.user_read_bytes += (j - i) as u64 * self.cfg.terms.rblock_bytes as u64;
            end = end.max(t);
            tokens.extend(toks);
            i = j;
        }
        if self.read_bytes.is_some() {
            let cached: Vec<bool> = entries.iter().map(|e| e.cached()).collect();
            let taken = self.read_image_bytes(&lpids, &cached, &addrs, &tokens);
            if let Some(reads) = &mut self.read_bytes {
                reads.insert(id, taken);
            }
        }
        let bytes = tokens.len() as u64 * self.cfg.terms.rblock_bytes as u64;
        let done = end + self.link_ns(bytes);
        self.stats.read_flash_ns_total += end - ready;
        if let Some(r) = self.requests.get_mut(&id) {
            r.outstanding = 1;
        }
        self.finish_part(id, Some(Ok(tokens)), done);
    }

    // ----- the log --------------------------------------------------------------------

    /// Appends a record that is ready at `ready_ns`; returns its LSN. The record is durable
    /// once its log block is (see `wait_log`).
    pub(crate) fn log_append(&mut self, rec: LogRecord, ready_ns: TimeNs) -> u64 {
        let lsn = self.log.next_lsn;
        self.log.next_lsn += 1;
        self.stats.log_records += 1;
        let bytes = rec.bytes();
        self.stats.log_bytes += bytes as u64;
        let cap = self.log.capacity_bytes;
        let queued = self.log_forming.len();
        if let Some(back) = self.log_forming.back_mut() {
            // The front block is programmed at its issue time, so a record joins it only if
            // ready by then. A block queued behind it waits for the front's program to end,
            // so any record that fits joins it (group commit), moving its issue no earlier
            // than the record is ready.
            let joinable = if queued == 1 {
                ready_ns <= back.issue_ns
            } else {
                true
            };
            if back.bytes + bytes <= cap && joinable {
                back.issue_ns = back.issue_ns.max(ready_ns);
                back.records.push((lsn, rec));
                back.bytes += bytes;
                return lsn;
            }
        }
        let seq = self.log.next_block_seq;
        self.log.next_block_seq += 1;
        let first = self.log_forming.is_empty();
        let issue = if first {
            ready_ns.max(self.log.last_end_ns)
        } else {
            ready_ns
        };
        self.log_forming.push_back(FormingBlock {
            seq,
            records: vec![(lsn, rec)],
            bytes,
            issue_ns: issue,
        });
        if first {
            self.events.push(issue, Event::LogSeal(seq));
        }
        lsn
    }

    pub(crate) fn wait_log(&mut self, lsn: u64, w: Waiter) {
        if let Waiter::EraseAfter { block, .. } = w {
            // A checkpoint's RSSP may not pass an erase record before the erase happened,
            // or the erase would be in neither the checkpointed WEAR nor the redone log.
            self.pending_erases.insert(block, lsn);
        }
        if lsn < self.log.durable_lsn {
            self.wake(w);
        } else {
            self.waiters.entry(lsn).or_default().push(w);
        }
    }

    /// Reserves the forward links of the next log block: the next WBLOCK of the log's open
    /// EBLOCK in each of `log_forward_links` consecutive channels. Consecutive log blocks
    /// reserve disjoint channels, so that one block's failed attempts never consume a
    /// WBLOCK its successor was promised.
    pub(crate) fn reserve_log_links(&mut self) -> Result<(), OxError> {
        let taken: Vec<u32> = self.log_link_channels();
        let links = self.pick_log_links(&taken);
        if links.is_empty() {
            return Err(OxError::NoSpace);
        }
        self.log.links = links;
        Ok(())
    }

    /// The channels of the links reserved for the next log block.
    fn log_link_channels(&self) -> Vec<u32> {
        self.log
            .links
            .iter()
            .map(|&p| self.media.channel_of(self.media.block_of_ppn(p)))
            .collect()
    }

    /// Up to `log_forward_links` WBLOCKs for a log block, one per channel, skipping the
    /// channels in `taken` (whose next WBLOCK another block was promised).
    fn pick_log_links(&mut self, taken: &[u32]) -> Vec<Ppn> {
        let n = self.cfg.log_forward_links as usize;
        let mut links = Vec::with_capacity(n);
        let channels = self.cfg.channels;
        for k in 0..channels {
            if links.len() == n {
                break;
            }
            let ch = (self.log_channel_cursor + k) % channels;
            if taken.contains(&ch) {
                continue;
            }
            // A channel without a free EBLOCK is skipped; the next one takes the link.
            if let Ok(ppn) = self.log_next_wblock(ch) {
                links.push(ppn);
                self.log_channel_cursor = (ch + 1) % channels;
            }
        }
        links
    }

    /// Re-anchors the log when every forward link of log block `seq` failed to program.
    /// Recovery reaches a log block only from its predecessor's links, so the block goes to
    /// fresh WBLOCKs and a bridge names them: the newest checkpoint record is reissued (same
    /// sequence, next revision) with the bridge in it, at the checkpoint EBLOCKs' well-known
    /// location. Returns the fresh WBLOCKs and when the reissued record is on flash; the
    /// block is programmed only after that, so a power loss in between leaves at worst a
    /// bridge to erased WBLOCKs, and nothing in the block is durable (or acknowledged)
    /// before the block itself is.
    fn bridge_log(&mut self, seq: u64, ready_ns: TimeNs) -> Result<(Vec<Ppn>, TimeNs), OxError> {
        let taken = self.log_link_channels();
        let links = self.pick_log_links(&taken);
        let Some(mut rec) = self.newest_ckpt_record.clone() else {
            return Err(OxError::LogWriteFailed { block_seq: seq });
        };
        if links.is_empty() {
            return Err(OxError::LogWriteFailed { block_seq: seq });
        }
        self.log_bridges.insert(seq, links.clone());
        rec.revision += 1;
        rec.log_bridges = self.log_bridges_from(rec.rssp_block_seq);
        let end = self.write_checkpoint_record(rec, ready_ns)?;
        self.stats.log_bridges += 1;
        Ok((links, end))
    }

    /// The next unwritten WBLOCK of the log's open EBLOCK in a channel.
    fn log_next_wblock(&mut self, ch: u32) -> Result<Ppn, OxError> {
        let ppb = self.media.wblocks_per_eblock();
        if let Some(b) = self.log_open[ch as usize] {
            let wp = self.media.write_pointer(b);
            if wp < ppb && !self.prov.blocks[b as usize].retire {
                return Ok(self.media.first_ppn(b) + wp);
            }
            // The log's EBLOCK is full: it stays (FULL, META) until a checkpoint truncates
            // the log past it.
            self.prov.blocks[b as usize].alloc_ptr = ppb;
            self.prov.close_block(b);
            self.log_open[ch as usize] = None;
        }
        let ppn = self
            .prov
            .alloc_in_channel(&self.media, Stream::Log, ch)
            .ok_or(OxError::NoSpace)?;
        let b = self.media.block_of_ppn(ppn);
        self.checkpoint_if_log_is_long();
        // The log tracks its own write pointer (the medium's), so the provisioner's is
        // moved to the end: nothing else may be handed out of this EBLOCK.
        self.prov.close_block(b);
        self.prov.blocks[b as usize].alloc_ptr = ppb;
        self.log_open[ch as usize] = Some(b);
        self.gc_trigger_for(ppn);
        Ok(ppn)
    }

    /// Log EBLOCKs are reclaimed only by a checkpoint; when they take more than a tenth of
    /// the usable flash, a checkpoint starts whatever the interval says.
    fn checkpoint_if_log_is_long(&mut self) {
        if self.ckpt.is_some() {
            return;
        }
        let log_blocks = self
            .prov
            .blocks
            .iter()
            .filter(|m| m.stream == Some(Stream::Log))
            .count() as u64;
        let usable: u64 = self.prov.usable_per_channel.iter().map(|&u| u as u64).sum();
        if log_blocks * 10 > usable {
            self.events.push(self.now_ns, Event::ForcedCheckpoint);
        }
    }

    fn on_log_seal(&mut self, seq: u64) {
        let now = self.now_ns;
        let Some(front) = self.log_forming.front() else {
            return;
        };
        if front.seq != seq {
            return;
        }
        if front.issue_ns > now {
            self.events.push(front.issue_ns, Event::LogSeal(seq));
            return;
        }
        let front = self.log_forming.pop_front().expect("present");
        let attempts = self.log.links.clone();
        if let Err(e) = self.reserve_log_links() {
            self.fatal = Some(e);
            return;
        }
        let block = LogBlock {
            seq,
            records: front.records,
            prev: self.log.last_ppn,
            links: self.log.links.clone(),
        };
        let spp = self.media.rblocks_per_wblock();
        let rblocks: Vec<RblockWrite> = (0..spp)
            .map(|_| RblockWrite::meta(Tag::new(TagKind::Log, 0, seq)))
            .collect();
        let mut ready = now;
        let first_lsn = block.records.first().map_or(0, |r| r.0);
        let last_lsn = block.last_lsn().unwrap_or(0);
        let mut attempts = attempts;
        for bridge in 0..=MAX_LOG_BRIDGES_PER_BLOCK {
            if bridge > 0 {
                match self.bridge_log(seq, ready) {
                    Ok((links, end)) => {
                        attempts = links;
                        ready = end;
                    }
                    Err(e) => {
                        self.fatal = Some(e);
                        return;
                    }
                }
            }
            for (k, &ppn) in attempts.iter().enumerate() {
                if k > 0 {
                    self.stats.log_link_retries += 1;
                }
                match self
                    .media
                    .program(ppn, ready, &rblocks, Some(MetaBlob::Log(block.clone())))
                {
                    Ok(end) => {
                        self.stats.log_blocks_written += 1;
                        let b = self.media.block_of_ppn(ppn);
                        let m = &mut self.prov.blocks[b as usize];
                        m.max_lsn = m.max_lsn.max(last_lsn);
                        self.log.last_ppn = Some(ppn);
                        self.log.last_end_ns = end;
                        self.log.written.insert(seq, (ppn, first_lsn, last_lsn));
                        self.events.push(
                            end,
                            Event::LogDurable {
                                block_seq: seq,
                                last_lsn,
                            },
                        );
                        if let Some(next) = self.log_forming.front_mut() {
                            next.issue_ns = next.issue_ns.max(end);
                            let (t, s) = (next.issue_ns, next.seq);
                            self.events.push(t, Event::LogSeal(s));
                        }
                        return;
                    }
                    Err(e) => {
                        let b = self.media.block_of_ppn(ppn);
                        if !self.absorb_program_failure(ppn, e) {
                            return;
                        }
                        let ch = self.media.channel_of(b) as usize;
                        if self.log_open[ch] == Some(b) {
                            self.log_open[ch] = None;
                        }
                        ready += self.cfg.timing.of(self.cfg.cell_mode).program_ns;
                    }
                }
            }
        }
        self.fatal = Some(OxError::LogWriteFailed { block_seq: seq });
    }

    fn on_log_durable(&mut self, _seq: u64, last_lsn: u64) {
        self.log.durable_lsn = self.log.durable_lsn.max(last_lsn + 1);
        let durable = self.log.durable_lsn;
        let ready: Vec<u64> = self.waiters.range(..durable).map(|(&k, _)| k).collect();
        for lsn in ready {
            for w in self.waiters.remove(&lsn).unwrap_or_default() {
                self.wake(w);
            }
        }
    }

    fn wake(&mut self, w: Waiter) {
        match w {
            Waiter::RdescDurable(ctx) => self.program_context(ctx, false),
            Waiter::AmendDurable(ctx) => self.program_context(ctx, true),
            Waiter::EraseAfter { block, gc_channel } => self
                .events
                .push(self.now_ns, Event::Erase { block, gc_channel }),
            Waiter::CkptPagesLogged(seq) => {
                let t = self.ckpt.as_ref().map_or(self.now_ns, |c| c.pages_end_ns);
                self.events.push(t.max(self.now_ns), Event::CkptRecord(seq));
            }
        }
    }

    // ----- bad blocks -----------------------------------------------------------------

    /// Writes a channel's bad-block table at the next WBLOCK of its system EBLOCK (§7.2.1);
    /// a full EBLOCK is erased and the table starts again at its first WBLOCK. An EBLOCK
    /// whose erase fails is replaced (`replace_system_block`), and the table written to the
    /// replacement lists it.
    pub(crate) fn write_bbt(&mut self, ch: u32, ready_ns: TimeNs) -> Result<TimeNs, OxError> {
        let mut ready = ready_ns;
        self.bbt_version += 1;
        let spp = self.media.rblocks_per_wblock();
        let rblocks: Vec<RblockWrite> = (0..spp)
            .map(|_| RblockWrite::meta(Tag::new(TagKind::Bbt, ch as u64, self.bbt_version)))
            .collect();
        // A failed program consumes its WBLOCK; the table goes to the next one. A block that
        // failed programs filled since this call erased it is worn out: it is retired and
        // replaced, as a checkpoint EBLOCK is, rather than erased again and again.
        let ppb = self.media.wblocks_per_eblock();
        let attempts = 4 * ppb;
        let mut erased_here = false;
        for _ in 0..attempts {
            let mut block = self.system.bbt[ch as usize];
            if self.media.write_pointer(block) >= ppb {
                if erased_here {
                    block = self.replace_system_block(block, ch)?;
                    self.system.bbt[ch as usize] = block;
                    erased_here = false;
                } else {
                    match self.media.erase(block, ready) {
                        Ok(end) => {
                            ready = end;
                            erased_here = true;
                        }
                        Err(NandError::EraseFailed { .. }) => {
                            block = self.replace_system_block(block, ch)?;
                            self.system.bbt[ch as usize] = block;
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            let bad: Vec<u32> = (0..self.media.eblocks_total())
                .filter(|&b| self.media.channel_of(b) == ch && self.media.is_bad(b))
                .collect();
            let blob = MetaBlob::Bbt {
                version: self.bbt_version,
                bad,
            };
            let ppn = self.media.first_ppn(block) + self.media.write_pointer(block);
            match self.media.program(ppn, ready, &rblocks, Some(blob)) {
                Ok(end) => return Ok(end),
                Err(NandError::ProgramFailed { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(OxError::SystemWriteFailed {
            what: format!("bad-block table of channel {ch}"),
            attempts,
        })
    }

    /// Takes a free EBLOCK, of `channel` when it has one, in place of a system EBLOCK whose
    /// erase failed (it is bad now) or that failed programs filled (it is retired here).
    /// The paper's well-known locations are fixed; a device that stopped at the first
    /// failed erase of one would end its life early for a block it can do without.
    /// Recovery finds the replacement by its first record's TAG (`SystemBlocks::locate`).
    /// The caller records the replacement in `self.system` and writes the failed EBLOCK's
    /// bad-block table.
    pub(crate) fn replace_system_block(
        &mut self,
        failed: u32,
        channel: u32,
    ) -> Result<u32, OxError> {
        self.stats.eblocks_retired += 1;
        self.stats.system_eblocks_replaced += 1;
        if !self.media.is_bad(failed) {
            self.media.retire(failed);
        }
        self.wear.set(failed, self.media.erase_count(failed));
        self.prov.mark_bad(&self.media, failed);
        self.prov
            .take_for_system(&self.media, channel)
            .ok_or(OxError::NoSpace)
    }

    /// Retires an EBLOCK (a failed erase, or a program failure once its content moved).
    pub(crate) fn retire_block(&mut self, block: u32) {
        self.stats.eblocks_retired += 1;
        self.media.retire(block);
        self.prov.mark_bad(&self.media, block);
        self.gbitv.clear_block(block);
        let ch = self.media.channel_of(block);
        let now = self.now_ns;
        if let Err(e) = self.write_bbt(ch, now) {
            self.fatal = Some(e);
        }
    }

    // ----- inspection for tests and reports -------------------------------------------

    /// The MAP entry of every LPID, reading MAP pages that are not cached straight from the
    /// medium's content without timing (for oracles and invariant checks only).
    pub fn debug_map(&self) -> Vec<Ppa> {
        let per = self.map.entries_per_page;
        let mut out = Vec::with_capacity(self.cfg.logical_pages as usize);
        for page in 0..self.map.pages() {
            let words = self.map.cached_words(page).or_else(|| {
                let ppn = self.map.map_s.ppns[page as usize];
                match self.media.meta_of(ppn) {
                    Some(MetaBlob::Table(t)) => Some(t.words.clone()),
                    _ => None,
                }
            });
            for i in 0..per {
                let lpid = page as u64 * per + i;
                if lpid >= self.cfg.logical_pages {
                    break;
                }
                let e = words
                    .as_ref()
                    .and_then(|w| w.get(i as usize))
                    .map_or(MapEntry::UNMAPPED, |&x| MapEntry(x));
                out.push(e.ppa());
            }
        }
        out
    }

    /// The RBLOCK MAP points at for `lpid` now, without timing or touching the MAP cache:
    /// a served device uses it to fetch the bytes of what a read just returned.
    pub fn peek_mapping(&self, lpid: u64) -> Ppa {
        if lpid >= self.cfg.logical_pages {
            return Ppa::NONE;
        }
        let per = self.map.entries_per_page;
        let page = (lpid / per) as u32;
        let i = (lpid % per) as usize;
        let word = match self.map.cached_entry(page, i) {
            Some(word) => Some(word),
            None => {
                let ppn = self.map.map_s.ppns[page as usize];
                match self.media.meta_of(ppn) {
                    Some(MetaBlob::Table(t)) => t.words.get(i).copied(),
                    _ => None,
                }
            }
        };
        word.map_or(Ppa::NONE, |w| MapEntry(w).ppa())
    }

    /// Makes every host read keep the bytes it returns (`take_read_bytes`), taken from the
    /// flash image at the moment the read looks MAP up: by its completion a later write may
    /// have moved MAP on, or GC erased the RBLOCK, so the bytes cannot be looked up then.
    pub fn capture_read_bytes(&mut self) {
        self.read_bytes.get_or_insert_with(BTreeMap::new);
    }

    /// The bytes read `id` returned (one RBLOCK per LPAGE), or why they could not be taken
    /// from the image; `None` for a request that read nothing or before it looked MAP up.
    pub fn take_read_bytes(&mut self, id: RequestId) -> Option<Result<Vec<u8>, String>> {
        self.read_bytes.as_mut()?.remove(&id)
    }

    /// The bytes of the RBLOCKs a read found: zeroes for an unmapped LPAGE (token 0), the
    /// staged bytes of a version the write-back cache holds, or the image's bytes at the
    /// RBLOCK MAP pointed at, checked against the token and TAG the controller read, so a
    /// mismatch is an error, never other bytes.
    fn read_image_bytes(
        &self,
        lpids: &[u64],
        cached: &[bool],
        addrs: &[Ppa],
        tokens: &[u64],
    ) -> Result<Vec<u8>, String> {
        let image = self
            .media
            .image()
            .ok_or_else(|| "the medium has no flash image".to_string())?;
        let rb = self.cfg.terms.rblock_bytes as usize;
        let mut out = vec![0u8; lpids.len() * rb];
        for (i, dst) in out.chunks_exact_mut(rb).enumerate() {
            let (lpid, token) = (lpids[i], tokens[i]);
            if cached[i] {
                // A trim waits in the write-back cache as token 0 and reads zeroes.
                if token != 0 {
                    let staged = image.staged(token).ok_or_else(|| {
                        format!("LPID {lpid}: the write cache returned token {token:#x}, whose bytes are not staged")
                    })?;
                    dst.copy_from_slice(staged);
                }
                continue;
            }
            let ppa = addrs[i];
            if ppa.is_none() {
                if token != 0 {
                    return Err(format!(
                        "LPID {lpid} read token {token:#x} but is not mapped"
                    ));
                }
                continue;
            }
            let (tag, stored, bytes) = image.read_user(ppa)?;
            if stored != token
                || tag.lpid != lpid
                || !matches!(tag.kind, TagKind::User | TagKind::Gc)
            {
                return Err(format!(
                    "LPID {lpid}: the controller read token {token:#x}, but RBLOCK {} of the image holds token {stored:#x} with TAG {tag:?}",
                    ppa.0
                ));
            }
            dst.copy_from_slice(&bytes);
        }
        Ok(out)
    }

    /// Whether a read of `lpid` now would return data: the newest version waiting in the
    /// write-back cache is a write (a trim waits there as token 0), or, with none waiting,
    /// MAP points at an RBLOCK. Without timing or touching the MAP cache, like
    /// `peek_mapping`; a served device answers block-status queries with it.
    pub fn peek_holds_data(&self, lpid: u64) -> bool {
        match self.wcache.newest(lpid) {
            Some(token) => token != 0,
            None => !self.peek_mapping(lpid).is_none(),
        }
    }

    /// Checks the FTL's invariants: GBITV marks exactly the RBLOCKs MAP points at, every
    /// mapped RBLOCK's TAG names its LPID, no live page sits in a free EBLOCK.
    pub fn check_invariants(&self) -> Result<(), String> {
        let map = self.debug_map();
        let mut expect = Gbitv::new(
            self.cfg.eblocks_total(),
            self.cfg.terms.rblocks_per_eblock(),
            self.cfg.terms.wblock_bytes,
        );
        for (lpid, &ppa) in map.iter().enumerate() {
            if ppa.is_none() {
                continue;
            }
            let b = self.media.block_of_ppa(ppa);
            if b >= self.cfg.eblocks_total() {
                return Err(format!("LPID {lpid} maps outside the medium: {ppa:?}"));
            }
            let tag = self.media.tag_of(ppa);
            if !matches!(tag.kind, TagKind::User | TagKind::Gc) || tag.lpid != lpid as u64 {
                return Err(format!("LPID {lpid} maps to {ppa:?} whose TAG is {tag:?}"));
            }
            if !expect.set(b, self.media.rblock_in_eblock(ppa), true) {
                return Err(format!("two LPIDs map to {ppa:?}"));
            }
        }
        for b in 0..self.cfg.eblocks_total() {
            if expect.valid(b) != self.gbitv.valid(b) {
                return Err(format!(
                    "EBLOCK {b}: GBITV counts {} live RBLOCKs, MAP points at {}",
                    self.gbitv.valid(b),
                    expect.valid(b)
                ));
            }
        }
        if expect.raw_bits() != self.gbitv.raw_bits() {
            return Err("GBITV bits differ from the RBLOCKs MAP points at".into());
        }
        Ok(())
    }

    /// The WEAR table's erase counts against the medium's, for the EBLOCKs that hold data.
    pub fn check_wear(&self) -> Result<(), String> {
        for b in 0..self.cfg.eblocks_total() {
            if self.system.contains(b) {
                continue;
            }
            let (w, m) = (self.wear.get(b), self.media.erase_count(b));
            if w != m {
                return Err(format!("EBLOCK {b}: WEAR says {w} erases, the medium {m}"));
            }
        }
        Ok(())
    }

    /// Free EBLOCKs of a channel.
    pub fn free_eblocks(&self, channel: u32) -> u32 {
        self.prov.free_in_channel(channel)
    }

    /// Erase counts of the data EBLOCKs: (min, max).
    pub fn erase_count_range(&self) -> (u32, u32) {
        let mut lo = u32::MAX;
        let mut hi = 0;
        for b in 0..self.cfg.eblocks_total() {
            if self.system.contains(b) || self.media.is_bad(b) {
                continue;
            }
            let e = self.media.erase_count(b);
            lo = lo.min(e);
            hi = hi.max(e);
        }
        (lo.min(hi), hi)
    }
}

pub(crate) fn table_code(t: TableId) -> u64 {
    match t {
        TableId::Map => 1,
        TableId::MapS => 2,
        TableId::Gbitv => 3,
        TableId::GbitvS => 4,
        TableId::Wear => 5,
    }
}
