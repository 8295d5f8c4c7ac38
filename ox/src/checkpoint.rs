//! Fuzzy incremental checkpoints (§6, §7.2.7).
//!
//! A checkpoint starts by fixing the redo scan start point (RSSP): the LSN of the oldest
//! RDESC whose context is not installed, or the log's tail when every context is. It then
//! writes, as table pages in the META line, the MAP pages that changed (and MAP pages living
//! in nearly empty table EBLOCKs, to let those EBLOCKs go), the MAP_S pages that now point
//! at new MAP pages, and likewise GBITV, GBITV_S and WEAR. The pages capture the tables as
//! they are when written, while user writes go on — the checkpoint is fuzzy; redo from the
//! RSSP makes the state exact. A CkptPages log record lists the pages; once it and the pages
//! are durable, the checkpoint record (MAP_T, GBITV_T, WEAR_S, RSSP, the provisioning
//! cursors) goes to the next WBLOCK of a well-known EBLOCK. Then the log before the RSSP and
//! table pages no longer reachable are reclaimed.

use std::collections::BTreeSet;

use afa_sim::TimeNs;

use crate::controller::{CkptInProgress, Event, Waiter};
use crate::log::LogRecord;
use crate::media::{MetaBlob, Ppn, RblockWrite, Tag, TagKind};
use crate::provision::{BlockState, Stream};
use crate::tables::{TableId, NO_PPN};
use crate::{OxController, OxError};

/// The checkpoint record written at a well-known location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointRecord {
    pub seq: u64,
    pub timestamp_ns: u64,
    /// Redo starts at the first record with this LSN or later.
    pub rssp_lsn: u64,
    /// The log block holding the RSSP and the WBLOCKs it may be at (one when it was already
    /// written, the reserved forward links when it was not).
    pub rssp_block_seq: u64,
    pub rssp_links: Vec<Ppn>,
    pub map_t: Vec<Ppn>,
    pub gbitv_t: Vec<Ppn>,
    pub wear_s: Vec<Ppn>,
    /// Round-robin channel of each provisioning stream (HOT, COLD, log, table).
    pub channel_cursors: [u32; 4],
    pub next_ctx: u64,
    pub next_gc_seq: u64,
    /// A record is reissued, with the same `seq` and the next revision, when the log needs
    /// a bridge before the next checkpoint: recovery takes the highest (seq, revision).
    pub revision: u32,
    /// Log bridges: (log block sequence, the WBLOCKs it may be at) for a log block that
    /// none of its predecessor's forward links could take (see `OxController::bridge_log`).
    /// Recovery tries them when the links lead nowhere. Only blocks at or after the RSSP
    /// are listed.
    pub log_bridges: Vec<(u64, Vec<Ppn>)>,
}

impl OxController {
    /// The bridges a record whose redo starts at log block `rssp_block_seq` must carry.
    pub(crate) fn log_bridges_from(&self, rssp_block_seq: u64) -> Vec<(u64, Vec<Ppn>)> {
        self.log_bridges
            .range(rssp_block_seq..)
            .map(|(&seq, links)| (seq, links.clone()))
            .collect()
    }

    pub(crate) fn build_checkpoint_record(&self, seq: u64, rssp_lsn: u64) -> CheckpointRecord {
        let written = self
            .log
            .written
            .iter()
            .find(|(_, &(_, _, last))| last >= rssp_lsn);
        let (rssp_block_seq, rssp_links) = match written {
            Some((&s, &(ppn, _, _))) => (s, vec![ppn]),
            None => (
                self.log_forming
                    .front()
                    .map_or(self.log.next_block_seq, |f| f.seq),
                self.log.links.clone(),
            ),
        };
        CheckpointRecord {
            seq,
            timestamp_ns: self.now_ns,
            rssp_lsn,
            rssp_block_seq,
            rssp_links,
            map_t: self.map.map_t.clone(),
            gbitv_t: self.gbitv.gbitv_t.clone(),
            wear_s: self.wear.wear_s.ppns.clone(),
            channel_cursors: Stream::ALL.map(|s| self.prov.channel_cursor(s)),
            next_ctx: self.next_ctx,
            next_gc_seq: self.next_gc_seq,
            revision: 0,
            log_bridges: self.log_bridges_from(rssp_block_seq),
        }
    }

    /// Programs a checkpoint record at the next WBLOCK of the current checkpoint EBLOCK,
    /// switching to (and first erasing) the other one when it is full.
    ///
    /// A failed program consumes its WBLOCK and the record goes to the next one. A block
    /// filled by failed programs since the switch holds no record, while the newest record
    /// is in the other block: switching back would erase that, and a power loss would then
    /// leave no checkpoint at all. Such a block is worn out, so it is retired and replaced
    /// by a free EBLOCK instead, and the other block is kept.
    pub(crate) fn write_checkpoint_record(
        &mut self,
        rec: CheckpointRecord,
        ready_ns: TimeNs,
    ) -> Result<TimeNs, OxError> {
        let ppb = self.media.wblocks_per_eblock();
        let spp = self.media.rblocks_per_wblock();
        let rblocks: Vec<RblockWrite> = (0..spp)
            .map(|_| RblockWrite::meta(Tag::new(TagKind::Checkpoint, 0, rec.seq)))
            .collect();
        let mut ready = ready_ns;
        // Each replacement takes a free EBLOCK, so the loop ends with `NoSpace` if not here.
        let attempts = 4 * ppb;
        for _ in 0..attempts {
            let mut block = self.system.checkpoint[self.ckpt_block];
            if self.media.write_pointer(block) >= ppb {
                let ch = self.media.channel_of(block);
                if self.ckpt_newest_block == self.ckpt_block {
                    // The other block holds only older records: the newest is in this one.
                    self.ckpt_block ^= 1;
                    block = self.system.checkpoint[self.ckpt_block];
                    let ch = self.media.channel_of(block);
                    match self.media.erase(block, ready) {
                        Ok(end) => ready = end,
                        Err(afa_nand::NandError::EraseFailed { .. }) => {
                            block = self.replace_system_block(block, ch)?;
                            self.system.checkpoint[self.ckpt_block] = block;
                            ready = self.write_bbt(ch, ready)?;
                        }
                        Err(e) => return Err(e.into()),
                    }
                } else {
                    block = self.replace_system_block(block, ch)?;
                    self.system.checkpoint[self.ckpt_block] = block;
                    ready = self.write_bbt(ch, ready)?;
                }
            }
            let ppn = self.media.first_ppn(block) + self.media.write_pointer(block);
            match self.media.program(
                ppn,
                ready,
                &rblocks,
                Some(MetaBlob::Checkpoint(Box::new(rec.clone()))),
            ) {
                Ok(end) => {
                    self.ckpt_newest_block = self.ckpt_block;
                    self.newest_ckpt_record = Some(rec);
                    return Ok(end);
                }
                Err(afa_nand::NandError::ProgramFailed { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(OxError::SystemWriteFailed {
            what: "checkpoint record".into(),
            attempts,
        })
    }

    pub(crate) fn on_checkpoint_timer(&mut self) {
        if !self.cfg.checkpoint.enabled {
            return;
        }
        if self.ckpt.is_some() {
            // The checkpoint has overrun its interval. The timer waits for it to end and
            // then gives the device a whole interval without one (see
            // `resume_checkpoint_timer`).
            self.ckpt_timer_parked = true;
            return;
        }
        let next = self.now_ns + self.cfg.checkpoint.interval_ns;
        self.events.push(next, Event::CheckpointTimer);
        if self.fatal.is_none() {
            self.start_checkpoint();
        }
    }

    /// Restarts a timer parked by a checkpoint that overran its interval, a whole interval
    /// after that checkpoint's end. Ticking on through the checkpoint and starting the next
    /// one at the first tick after it cost an event per tick (10^5 per checkpoint at a
    /// 10 ns interval) and left the device no moment without a checkpoint under way, so a
    /// host waiting for the device to go idle (a job's stonewall) waited for ever.
    fn resume_checkpoint_timer(&mut self) {
        if std::mem::take(&mut self.ckpt_timer_parked) {
            let next = self.now_ns + self.cfg.checkpoint.interval_ns;
            self.events.push(next, Event::CheckpointTimer);
        }
    }

    /// Starts a checkpoint now unless one is running; returns whether one started.
    pub fn checkpoint_now(&mut self) -> bool {
        if self.ckpt.is_some() || self.fatal.is_some() {
            return false;
        }
        self.start_checkpoint();
        true
    }

    pub(crate) fn start_checkpoint(&mut self) {
        let now = self.now_ns;
        let seq = self.ckpt_seq;
        self.ckpt_seq += 1;
        let rssp_lsn = self.rssp_now();
        let ppb = self.media.wblocks_per_eblock();

        // Table EBLOCKs that are mostly stale: rewrite their live pages so they can go.
        let sparse: BTreeSet<u32> = (0..self.media.eblocks_total())
            .filter(|&b| {
                let m = &self.prov.blocks[b as usize];
                m.state == BlockState::Full
                    && m.stream == Some(Stream::Table)
                    && m.table_refs_current > 0
                    && m.table_refs_current <= ppb / 4
            })
            .collect();
        let in_sparse = |ppn: Ppn, media: &crate::media::Media| {
            ppn != NO_PPN && sparse.contains(&media.block_of_ppn(ppn))
        };
        let mut map_pages: BTreeSet<u32> = self.map.dirty_cached_pages().into_iter().collect();
        for (i, &ppn) in self.map.map_s.ppns.iter().enumerate() {
            if in_sparse(ppn, &self.media) {
                map_pages.insert(i as u32);
            }
        }
        for (j, &ppn) in self.map.map_t.iter().enumerate() {
            if in_sparse(ppn, &self.media) {
                self.map.map_s.dirty_pages.insert(j as u32);
            }
        }
        let gbitv_relocate: Vec<u32> = (0..self.gbitv.pages())
            .filter(|&i| in_sparse(self.gbitv.gbitv_s.ppns[i as usize], &self.media))
            .collect();
        for i in gbitv_relocate {
            self.gbitv.mark_dirty(i);
        }
        for (j, &ppn) in self.gbitv.gbitv_t.iter().enumerate() {
            if in_sparse(ppn, &self.media) {
                self.gbitv.gbitv_s.dirty_pages.insert(j as u32);
            }
        }
        let wear_relocate: Vec<u32> = (0..self.wear.pages())
            .filter(|&i| in_sparse(self.wear.wear_s.ppns[i as usize], &self.media))
            .collect();
        for i in wear_relocate {
            self.wear.mark_dirty(i);
        }

        let mut written: Vec<(TableId, u32, Ppn)> = Vec::new();
        let mut end = now;
        // MAP pages, then the MAP_S pages that now point at them.
        for page in map_pages {
            let (t, words) = match self.map.cached_words(page) {
                Some(w) => (now, w),
                None => {
                    let ppn = self.map.map_s.ppns[page as usize];
                    let (t, blob) = self.media.read_wblock(ppn, now);
                    match blob {
                        Some(MetaBlob::Table(p)) => (t, p.words.clone()),
                        _ => continue,
                    }
                }
            };
            end = end.max(self.write_table_page(TableId::Map, page, words, t));
            written.push((TableId::Map, page, self.map.map_s.ppns[page as usize]));
        }
        let map_s_dirty = std::mem::take(&mut self.map.map_s.dirty_pages);
        for j in map_s_dirty {
            let words = self.map.map_s.page_words(j);
            end = end.max(self.write_table_page(TableId::MapS, j, words, now));
            written.push((TableId::MapS, j, self.map.map_t[j as usize]));
        }
        for i in self.gbitv.take_dirty_pages() {
            let words = self.gbitv.page_words(i);
            end = end.max(self.write_table_page(TableId::Gbitv, i, words, now));
            written.push((TableId::Gbitv, i, self.gbitv.gbitv_s.ppns[i as usize]));
        }
        let gbitv_s_dirty = std::mem::take(&mut self.gbitv.gbitv_s.dirty_pages);
        for j in gbitv_s_dirty {
            let words = self.gbitv.gbitv_s.page_words(j);
            end = end.max(self.write_table_page(TableId::GbitvS, j, words, now));
            written.push((TableId::GbitvS, j, self.gbitv.gbitv_t[j as usize]));
        }
        for i in self.wear.take_dirty_pages() {
            let words = self.wear.page_words(i);
            end = end.max(self.write_table_page(TableId::Wear, i, words, now));
            written.push((TableId::Wear, i, self.wear.wear_s.ppns[i as usize]));
        }
        self.wear.wear_s.dirty_pages.clear();

        let record = self.build_checkpoint_record(seq, rssp_lsn);
        let t = self.cpu(now, self.cfg.costs.log_record_cpu_ns);
        let lsn = self.log_append(
            LogRecord::CkptPages {
                ckpt: seq,
                pages: written,
            },
            t,
        );
        self.ckpt = Some(CkptInProgress {
            record,
            pages_end_ns: end,
        });
        self.wait_log(lsn, Waiter::CkptPagesLogged(seq));
    }

    pub(crate) fn on_ckpt_record(&mut self, seq: u64) {
        let now = self.now_ns;
        let Some(c) = self.ckpt.as_ref() else {
            return;
        };
        if c.record.seq != seq {
            return;
        }
        if c.pages_end_ns > now {
            self.events.push(c.pages_end_ns, Event::CkptRecord(seq));
            return;
        }
        // A log bridge made since the checkpoint started must be in its record, or the
        // record, once newest, would hide it from recovery.
        let bridges = self.log_bridges_from(c.record.rssp_block_seq);
        let c = self.ckpt.as_mut().expect("checked above");
        c.record.log_bridges = bridges;
        let rec = c.record.clone();
        match self.write_checkpoint_record(rec, now) {
            Ok(end) => self.events.push(end, Event::CkptDone(seq)),
            Err(e) => self.fatal = Some(e),
        }
    }

    /// The checkpoint record is durable: it becomes the recovery point, and the log before
    /// its RSSP and table pages no checkpoint reaches are reclaimed.
    pub(crate) fn on_ckpt_done(&mut self, seq: u64) {
        let now = self.now_ns;
        let Some(c) = self.ckpt.take() else {
            return;
        };
        if c.record.seq != seq {
            self.ckpt = Some(c);
            return;
        }
        self.stats.checkpoints += 1;
        self.resume_checkpoint_timer();
        let rec = c.record;
        self.recount_durable_table_refs(&rec);
        let rssp = rec.rssp_lsn;
        self.log_bridges = self.log_bridges.split_off(&rec.rssp_block_seq);
        self.durable_ckpt = Some(rec);
        self.log.written.retain(|_, &mut (_, _, last)| last >= rssp);
        let reclaim = self.truncated_meta_blocks(rssp, false);
        for &b in &reclaim {
            match self.prov.blocks[b as usize].stream {
                Some(Stream::Log) => self.stats.log_eblocks_reclaimed += 1,
                _ => self.stats.table_eblocks_reclaimed += 1,
            }
        }
        for b in reclaim {
            self.reclaim_meta_block(b, now);
        }
        self.redrive_stalled();
        self.fail_stalled_if_hopeless();
    }

    /// The RSSP of a checkpoint started now: the oldest log record a redo may still need,
    /// that of the oldest context under way or of an erase not yet done.
    fn rssp_now(&self) -> u64 {
        self.contexts
            .values()
            .map(|c| c.rdesc_lsn)
            .chain(self.pending_erases.values().copied())
            .min()
            .unwrap_or(self.log.next_lsn)
            .min(self.log.next_lsn)
    }

    /// The FULL log and table EBLOCKs a durable checkpoint at `rssp` frees: log EBLOCKs
    /// wholly before the RSSP (and neither open nor reserved by a forward link), and table
    /// EBLOCKs that neither the current tables nor the durable checkpoint point into. For a
    /// checkpoint not yet started, `new_checkpoint`, the durable one's pages do not count:
    /// the new one replaces it and reaches only what the current tables reach.
    fn truncated_meta_blocks(&self, rssp: u64, new_checkpoint: bool) -> Vec<u32> {
        let open_logs: Vec<u32> = self.log_open.iter().flatten().copied().collect();
        let link_blocks: Vec<u32> = self
            .log
            .links
            .iter()
            .map(|&p| self.media.block_of_ppn(p))
            .collect();
        (0..self.media.eblocks_total())
            .filter(|&b| {
                let m = &self.prov.blocks[b as usize];
                m.state == BlockState::Full
                    && match m.stream {
                        Some(Stream::Log) => {
                            m.max_lsn < rssp && !open_logs.contains(&b) && !link_blocks.contains(&b)
                        }
                        Some(Stream::Table) => {
                            m.table_refs_current == 0
                                && (new_checkpoint || m.table_refs_durable == 0)
                        }
                        _ => false,
                    }
            })
            .collect()
    }

    /// Starts a checkpoint when channel `ch` has closed to user writes for want of free
    /// EBLOCKs and a checkpoint would give `min_frees` log and table EBLOCKs back.
    ///
    /// Log EBLOCKs go only when a checkpoint's RSSP passes them, and table EBLOCKs only when
    /// no current or durable table page is left in them, so between two checkpoints the
    /// META streams grow with every context (an RDESC and a `done` record), every GC pass
    /// and every dirty MAP page pushed out of the cache, however little free space is left.
    /// On the timer alone (or when the log reached a tenth of the flash) they took the free
    /// EBLOCKs GC needed to move its victims' pages, and at the largest accepted
    /// `logical_pages` every channel ran out. The configuration reserves
    /// `OxConfig::meta_reserve_eblocks` for these streams; a checkpoint starts once what it
    /// would free reaches half of that share, so the other half covers what the streams write
    /// while it runs. Nothing happens while the channel takes user writes, so a device with
    /// room checkpoints on its timer as before.
    ///
    /// The checkpoint starts from an event, never from here: this runs where WBLOCKs are
    /// handed out, in the middle of writing a table page or moving a GC victim's pages, and
    /// a checkpoint started there wrote its own table pages into the EBLOCK the interrupted
    /// write had been given a WBLOCK of, out of program order.
    ///
    /// Returns whether a checkpoint is under way or asked for.
    pub(crate) fn checkpoint_if_space_is_short(&mut self, ch: u32, min_frees: u64) -> bool {
        if self.ckpt.is_some() {
            return true;
        }
        if self.fatal.is_some()
            || self.prov.free_in_channel(ch) > self.prov.reserve_eblocks(Stream::Hot)
        {
            return false;
        }
        let frees = self.truncated_meta_blocks(self.rssp_now(), true).len() as u64;
        let wanted = frees >= min_frees;
        if wanted {
            self.events.push(self.now_ns, Event::ForcedCheckpoint);
        }
        wanted
    }

    /// Counts, per EBLOCK, the table pages the durable checkpoint reaches.
    pub(crate) fn recount_durable_table_refs(&mut self, rec: &CheckpointRecord) {
        for m in self.prov.blocks.iter_mut() {
            m.table_refs_durable = 0;
        }
        let mut reach: Vec<Ppn> = Vec::new();
        for &ppn in rec.map_t.iter().chain(rec.gbitv_t.iter()) {
            if ppn == NO_PPN {
                continue;
            }
            reach.push(ppn);
            if let Some(MetaBlob::Table(p)) = self.media.meta_of(ppn) {
                reach.extend(p.words.iter().map(|&w| w as Ppn).filter(|&p| p != NO_PPN));
            }
        }
        reach.extend(rec.wear_s.iter().copied().filter(|&p| p != NO_PPN));
        for ppn in reach {
            let b = self.media.block_of_ppn(ppn) as usize;
            self.prov.blocks[b].table_refs_durable += 1;
        }
    }
}
