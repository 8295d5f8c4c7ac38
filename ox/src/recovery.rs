//! Power loss and recovery (§4, §7.2.7).
//!
//! Recovery finds the newest checkpoint record in the two well-known EBLOCKs, loads MAP_S,
//! GBITV and WEAR through the tiny tables it holds, probes every EBLOCK's write pointer and
//! the TAG of its first RBLOCK, and redoes the log from the RSSP to its end — the point where
//! every forward link leads to an erased or torn WBLOCK:
//!
//! - a `done` record installs its context's entries (blindly, in order: contexts install in
//!   RDESC order);
//! - a GC record installs each move only if MAP still holds the prior address (the same
//!   optimistic check as at run time);
//! - a context whose RDESC (and amendments) are durable but whose `done` is not is verified
//!   by reading the TAG of every new RBLOCK: if all are there it is installed (it may have
//!   been acknowledged, since `done` is not waited for), otherwise it and every later
//!   context are dropped — no batch is ever partly present.
//!
//! GBITV is then corrected for every RBLOCK the redone log mentions: live exactly when the
//! recovered MAP points at it. A checkpoint is written before the device serves commands.

use std::collections::{BTreeMap, BTreeSet};

use afa_sim::TimeNs;

use crate::controller::Event;
use crate::log::{LogRecord, RdescEntry};
use crate::media::{Media, MetaBlob, Ppa, Ppn, TagKind};
use crate::provision::Stream;
use crate::tables::{MapEntry, TableId, NO_PPN};
use crate::{OxController, OxError};

/// An erase seen in the log: (block, its erase count once erased, record position, the first
/// page its GC pass moved out, if any).
type EraseMark = (u32, u32, usize, Option<(u64, Ppa)>);

/// What a recovery found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    pub checkpoint_seq: u64,
    pub log_blocks_read: u64,
    /// Log blocks found through a bridge in the checkpoint record (their predecessor's
    /// forward links had all failed).
    pub log_bridges_followed: u64,
    pub records_redone: u64,
    /// Contexts installed from their `done` record.
    pub contexts_redone: u64,
    /// Contexts without a durable `done` whose pages were all found and which were installed.
    pub contexts_verified: u64,
    /// Contexts without a durable `done` that were dropped (some page missing).
    pub contexts_dropped: u64,
    pub gc_moves_redone: u64,
    /// WBLOCKs torn by the power loss.
    pub torn_wblocks: u64,
    /// Virtual time from power-on to serving commands (reads, redo, the first checkpoint).
    pub recovery_ns: u64,
    /// No EBLOCK was left for the log and a checkpoint: the device came up read-only.
    pub read_only: bool,
}

/// The medium after a power loss, with what was in flight torn away.
#[derive(Debug)]
pub struct PoweredOff {
    pub media: Media,
    /// When the controller stopped: the power loss, or the end of the write-back cache's
    /// drain on backup power.
    pub at_ns: TimeNs,
    pub torn_wblocks: u64,
    /// How long the write-back cache's drain ran on backup power after the power failed.
    pub drain_ns: u64,
}

impl OxController {
    /// Power fails at `at_ns`: events up to then happen, every program still running is torn,
    /// and all volatile state (DRAM tables, caches, contexts, queued commands) is gone.
    ///
    /// With a write-back cache the controller first drains it on backup power: it admits no
    /// more commands and runs until every write the cache holds is installed.
    pub fn power_loss(mut self, at_ns: TimeNs) -> PoweredOff {
        self.advance_to(at_ns);
        let stop_ns = self.drain_on_power_loss().max(at_ns);
        let torn = self.media.power_loss(stop_ns);
        PoweredOff {
            media: self.media,
            at_ns: stop_ns,
            torn_wblocks: torn,
            drain_ns: stop_ns - at_ns,
        }
    }

    /// Brings a controller up on a medium that lost power, at `now_ns`.
    ///
    /// A device whose grown bad blocks left no free EBLOCK for the log and the first
    /// checkpoint comes up read-only (`read_only`): reads are served from the redone MAP,
    /// kept whole in DRAM, and every write is refused. The first attempt's writes (table
    /// pages, log blocks) are what a power loss during recovery would leave, which the
    /// read-only redo reads past like any other.
    pub fn recover(
        off: PoweredOff,
        now_ns: TimeNs,
    ) -> Result<(OxController, RecoveryReport), OxError> {
        let start = now_ns.max(off.at_ns);
        let torn = off.torn_wblocks;
        let mut c = OxController::empty(off.media)?;
        let outcome = c
            .redo_log(start, torn, false)
            .and_then(|report| c.finish_recovery(report, start));
        match outcome {
            Ok(report) => Ok((c, report)),
            Err(OxError::NoSpace) => {
                let resume = c.now_ns.max(start);
                let mut ro = OxController::empty(c.media)?;
                let mut report = ro.redo_log(resume, torn, true)?;
                ro.read_only = Some(
                    "no channel has a free EBLOCK for the log and a checkpoint (grown bad blocks took the spare space)"
                        .into(),
                );
                report.read_only = true;
                report.recovery_ns = ro.now_ns - start;
                Ok((ro, report))
            }
            Err(e) => Err(e),
        }
    }

    /// Recovery with power cut `after_ns` after its first checkpoint started: what a power
    /// loss during recovery leaves behind.
    #[cfg(test)]
    pub(crate) fn power_loss_during_recovery(
        off: PoweredOff,
        now_ns: TimeNs,
        after_ns: TimeNs,
    ) -> Result<PoweredOff, OxError> {
        let start = now_ns.max(off.at_ns);
        let mut c = OxController::empty(off.media)?;
        c.redo_log(start, off.torn_wblocks, false)?;
        c.start_recovery_checkpoint()?;
        let at_ns = c.now_ns + after_ns;
        Ok(c.power_loss(at_ns))
    }

    /// Rebuilds the volatile state from the newest checkpoint and the log after it. With
    /// `read_only` nothing is written: the MAP cache keeps every page it loads, since a
    /// dirty page could not be written out.
    fn redo_log(
        &mut self,
        start: TimeNs,
        torn_wblocks: u64,
        read_only: bool,
    ) -> Result<RecoveryReport, OxError> {
        let c = self;
        if read_only {
            c.map.grow_without_bound();
        }
        let mut report = RecoveryReport {
            torn_wblocks,
            ..RecoveryReport::default()
        };
        c.now_ns = start;
        for core in c.cores_free_ns.iter_mut() {
            *core = start;
        }
        for thread in c.read_threads_free_ns.iter_mut() {
            *thread = start;
        }
        let mut t = start;

        // Bad-block tables: the newest version of each channel's.
        for ch in 0..c.cfg.channels {
            let block = c.system.bbt[ch as usize];
            let first = c.media.first_ppn(block);
            for p in 0..c.media.write_pointer(block) {
                let (end, blob) = c.media.read_wblock(first + p, start);
                t = t.max(end);
                if let Some(MetaBlob::Bbt { version, .. }) = blob {
                    c.bbt_version = c.bbt_version.max(*version);
                }
            }
        }

        // The newest checkpoint record.
        let mut best: Option<(crate::CheckpointRecord, usize)> = None;
        for (i, &block) in c.system.checkpoint.clone().iter().enumerate() {
            let first = c.media.first_ppn(block);
            for p in 0..c.media.write_pointer(block) {
                let (end, blob) = c.media.read_wblock(first + p, start);
                t = t.max(end);
                if let Some(MetaBlob::Checkpoint(rec)) = blob {
                    // A reissued record (a log bridge) shares its sequence and has a
                    // higher revision.
                    if best
                        .as_ref()
                        .is_none_or(|(b, _)| (rec.seq, rec.revision) > (b.seq, b.revision))
                    {
                        best = Some(((**rec).clone(), i));
                    }
                }
            }
        }
        let (rec, ckpt_block) =
            best.ok_or_else(|| OxError::Recovery("no checkpoint record found".into()))?;
        report.checkpoint_seq = rec.seq;
        c.ckpt_block = ckpt_block;
        c.ckpt_newest_block = ckpt_block;
        c.ckpt_seq = rec.seq + 1;

        // Tables through their tiny tables.
        c.map.map_t = rec.map_t.clone();
        for (j, &ppn) in rec.map_t.iter().enumerate() {
            let words = c.read_table(ppn, TableId::MapS, j as u32, &mut t)?;
            c.map.map_s.load_page(j as u32, &words);
        }
        c.gbitv.gbitv_t = rec.gbitv_t.clone();
        for (j, &ppn) in rec.gbitv_t.iter().enumerate() {
            let words = c.read_table(ppn, TableId::GbitvS, j as u32, &mut t)?;
            c.gbitv.gbitv_s.load_page(j as u32, &words);
        }
        for i in 0..c.gbitv.pages() {
            let ppn = c.gbitv.gbitv_s.ppns[i as usize];
            let words = c.read_table(ppn, TableId::Gbitv, i, &mut t)?;
            c.gbitv.load_page(i, &words);
        }
        c.wear.wear_s.ppns = rec.wear_s.clone();
        for i in 0..c.wear.pages() {
            let ppn = c.wear.wear_s.ppns[i as usize];
            let words = c.read_table(ppn, TableId::Wear, i, &mut t)?;
            c.wear.load_page(i, &words);
        }
        c.map.map_s.dirty_pages.clear();
        c.gbitv.gbitv_s.dirty_pages.clear();
        c.gbitv.take_dirty_pages();
        c.wear.take_dirty_pages();
        let refs: Vec<u32> = c
            .map
            .map_s
            .ppns
            .iter()
            .chain(c.map.map_t.iter())
            .chain(c.gbitv.gbitv_s.ppns.iter())
            .chain(c.gbitv.gbitv_t.iter())
            .chain(c.wear.wear_s.ppns.iter())
            .copied()
            .filter(|&p| p != NO_PPN)
            .collect();
        for ppn in refs {
            c.table_ref(ppn, 1);
        }
        c.recount_durable_table_refs(&rec);
        for s in Stream::ALL {
            let i = match s {
                Stream::Hot => 0,
                Stream::Cold => 1,
                Stream::Log => 2,
                Stream::Table => 3,
            };
            c.prov.set_channel_cursor(s, rec.channel_cursors[i]);
        }

        // Probe every EBLOCK: its write pointer and what its first RBLOCKs hold.
        let probe_reads = (c.media.wblocks_per_eblock() as f64).log2().ceil() as u32 + 1;
        for b in 0..c.media.eblocks_total() {
            if c.system.contains(b) || c.media.is_bad(b) {
                continue;
            }
            let wp = c.media.write_pointer(b);
            if wp == 0 {
                continue;
            }
            let first = c.media.first_ppn(b);
            for _ in 0..probe_reads {
                let (end, _, _) = c.media.read_rblock(c.media.ppa(first, 0), start);
                t = t.max(end);
            }
            let kind = (0..wp)
                .map(|p| c.media.tag_of(c.media.ppa(first + p, 0)).kind)
                .find(|k| *k != TagKind::Empty)
                .unwrap_or(TagKind::Padding);
            let stream = match kind {
                TagKind::Log => Stream::Log,
                TagKind::Table => Stream::Table,
                TagKind::Gc => Stream::Cold,
                _ => Stream::Hot,
            };
            c.prov.mark_recovered(&c.media, b, stream);
        }

        // Walk the log from the RSSP.
        let mut records: Vec<(u64, LogRecord)> = Vec::new();
        let mut expected = rec.rssp_block_seq;
        let mut candidates = rec.rssp_links.clone();
        let mut last_lsn = rec.rssp_lsn.saturating_sub(1);
        let mut walked_blocks: BTreeSet<u32> = BTreeSet::new();
        let bridges: BTreeMap<u64, Vec<Ppn>> = rec.log_bridges.iter().cloned().collect();
        let mut bridged = false;
        loop {
            let mut found = None;
            for &ppn in &candidates {
                if c.media.block_of_ppn(ppn) >= c.media.eblocks_total() {
                    continue;
                }
                let (end, blob) = c.media.read_wblock(ppn, t);
                t = t.max(end);
                if let Some(MetaBlob::Log(lb)) = blob {
                    if lb.seq == expected {
                        found = Some((ppn, lb.clone()));
                        break;
                    }
                }
            }
            let Some((ppn, lb)) = found else {
                // The predecessor's links lead nowhere; if they all failed, a bridge in the
                // checkpoint record says where the block went instead.
                match bridges.get(&expected) {
                    Some(links) if !bridged => {
                        candidates = links.clone();
                        bridged = true;
                        report.log_bridges_followed += 1;
                        continue;
                    }
                    _ => break,
                }
            };
            bridged = false;
            report.log_blocks_read += 1;
            let b = c.media.block_of_ppn(ppn);
            walked_blocks.insert(b);
            let first_lsn = lb.records.first().map_or(0, |r| r.0);
            let block_last = lb.last_lsn().unwrap_or(0);
            let m = &mut c.prov.blocks[b as usize];
            m.max_lsn = m.max_lsn.max(block_last);
            c.log.written.insert(lb.seq, (ppn, first_lsn, block_last));
            c.log.last_ppn = Some(ppn);
            for (lsn, r) in lb.records {
                last_lsn = last_lsn.max(lsn);
                if lsn >= rec.rssp_lsn {
                    records.push((lsn, r));
                }
            }
            candidates = lb.links;
            expected += 1;
        }

        // Table pages the redo writes (MAP pages pushed out of the cache) are stamped with
        // the log's next LSN, which must already lie past every record: the WEAR rule below
        // takes a table EBLOCK whose first page is stamped after an erase record as erased.
        c.log.next_lsn = last_lsn + 1;

        // Redo.
        let mut pending: BTreeMap<u64, Vec<RdescEntry>> = BTreeMap::new();
        let mut mentions: Vec<(Ppa, u64)> = Vec::new();
        let mut erase_marks: Vec<EraseMark> = Vec::new();
        let mut max_ctx = rec.next_ctx.saturating_sub(1);
        let mut gc_records = 0u64;
        for (pos, (_, r)) in records.iter().enumerate() {
            report.records_redone += 1;
            match r {
                LogRecord::Rdesc { ctx, entries } => {
                    max_ctx = max_ctx.max(*ctx);
                    pending.insert(*ctx, entries.clone());
                }
                LogRecord::RdescA { ctx, amendments } => {
                    if let Some(e) = pending.get_mut(ctx) {
                        for &(i, ppa) in amendments {
                            if let Some(entry) = e.get_mut(i as usize) {
                                mentions.push((entry.new, entry.lpid));
                                entry.new = ppa;
                            }
                        }
                    }
                }
                LogRecord::Done { ctx } => {
                    if let Some(entries) = pending.remove(ctx) {
                        report.contexts_redone += 1;
                        c.redo_entries(&entries, &mut mentions, &mut t);
                    }
                }
                LogRecord::Gc {
                    victim,
                    erase_count,
                    moves,
                } => {
                    gc_records += 1;
                    for m in moves {
                        let (end, cur) = c.map_lookup(m.lpid, t);
                        t = t.max(end);
                        if cur.ppa() == m.prior {
                            c.map.set(m.lpid, MapEntry::new(m.new));
                            report.gc_moves_redone += 1;
                        }
                        mentions.push((m.prior, m.lpid));
                        mentions.push((m.new, m.lpid));
                    }
                    let first_move = moves.first().map(|m| (m.lpid, m.prior));
                    erase_marks.push((*victim, *erase_count, pos, first_move));
                }
                LogRecord::Erase { block, erase_count } => {
                    erase_marks.push((*block, *erase_count, pos, None))
                }
                LogRecord::CkptPages { .. } => {}
            }
        }
        // Contexts without a durable `done`, in RDESC order: verify, install or drop.
        let mut dropping = false;
        for (ctx, entries) in pending {
            let mut complete = !dropping;
            if complete {
                for e in &entries {
                    if e.new.is_none() {
                        continue;
                    }
                    let (end, _, tag) = c.media.read_rblock(e.new, t);
                    t = t.max(end);
                    if tag.kind != TagKind::User
                        || tag.lpid != e.lpid
                        || tag.seq != ctx & 0xffff_ffff_ffff
                    {
                        complete = false;
                        break;
                    }
                }
            }
            if complete {
                report.contexts_verified += 1;
                c.redo_entries(&entries, &mut mentions, &mut t);
            } else {
                dropping = true;
                report.contexts_dropped += 1;
                for e in &entries {
                    mentions.push((e.new, e.lpid));
                }
            }
        }

        // WEAR: an erase record counts if the EBLOCK was erased after it (it is free now, or
        // something the log mentions was written into it since, or the first page GC moved
        // out of it is gone).
        let mut mentioned_after: BTreeMap<u32, usize> = BTreeMap::new();
        for (pos, (_, r)) in records.iter().enumerate() {
            let news: Vec<Ppa> = match r {
                LogRecord::Rdesc { entries, .. } => entries.iter().map(|e| e.new).collect(),
                LogRecord::RdescA { amendments, .. } => amendments.iter().map(|a| a.1).collect(),
                LogRecord::Gc { moves, .. } => moves.iter().map(|m| m.new).collect(),
                _ => Vec::new(),
            };
            for p in news.into_iter().filter(|p| !p.is_none()) {
                mentioned_after.insert(c.media.block_of_ppa(p), pos);
            }
        }
        let mut erased_blocks = BTreeSet::new();
        for (block, erase_count, pos, first_move) in erase_marks {
            let free_now = c.media.write_pointer(block) == 0;
            let lsn = records[pos].0;
            let first_tag = c.media.tag_of(c.media.ppa(c.media.first_ppn(block), 0));
            let rewritten = mentioned_after.get(&block).is_some_and(|&p| p > pos)
                || walked_blocks.contains(&block) && c.prov.blocks[block as usize].max_lsn > lsn
                || first_tag.kind == TagKind::Table && first_tag.seq > lsn;
            let moved_gone = first_move.is_some_and(|(lpid, prior)| {
                let tag = c.media.tag_of(prior);
                !(matches!(tag.kind, TagKind::User | TagKind::Gc) && tag.lpid == lpid)
            });
            if free_now || rewritten || moved_gone {
                // The count the erase made, not one more than WEAR holds: the checkpointed
                // WEAR page may have been written after the erase (checkpoints are fuzzy).
                c.wear.set(block, c.wear.get(block).max(erase_count));
                erased_blocks.insert(block);
            }
        }

        // GBITV: free EBLOCKs hold nothing; erased ones start empty; every RBLOCK the log
        // mentions is live exactly when MAP points at it.
        for b in 0..c.media.eblocks_total() {
            if c.media.write_pointer(b) == 0 || erased_blocks.contains(&b) {
                c.gbitv.clear_block(b);
            }
        }
        // An RBLOCK may be mentioned for several LPIDs (its EBLOCK was erased and written
        // again within the redone log), and not in the order it held them: a context's RDESC
        // names the prior address it saw when it started, and its `done` (or its
        // verification) may come after GC moved that page away and wrote another LPID there.
        // So it is live when any LPID mentioned with it maps to it now; MAP never maps two.
        let mut owners: BTreeMap<Ppa, BTreeSet<u64>> = BTreeMap::new();
        for (ppa, lpid) in mentions {
            if !ppa.is_none() {
                owners.entry(ppa).or_default().insert(lpid);
            }
        }
        for (ppa, lpids) in owners {
            if c.media.block_of_ppa(ppa) >= c.media.eblocks_total() {
                continue;
            }
            let mut live = false;
            for lpid in lpids {
                let (end, cur) = c.map_lookup(lpid, t);
                t = t.max(end);
                live |= cur.ppa() == ppa;
            }
            c.set_live(ppa, live);
        }

        // The log continues after its last block, in fresh EBLOCKs.
        c.log.next_lsn = last_lsn + 1;
        c.log.durable_lsn = c.log.next_lsn;
        c.log.next_block_seq = expected;
        c.log.last_end_ns = t;
        c.next_ctx = max_ctx + 1;
        c.install_next = c.next_ctx;
        c.next_gc_seq = rec.next_gc_seq + gc_records;
        c.now_ns = t;
        for core in c.cores_free_ns.iter_mut() {
            *core = (*core).max(t);
        }
        for thread in c.read_threads_free_ns.iter_mut() {
            *thread = (*thread).max(t);
        }
        // The bridges the walk crossed stay: a reissue of this record before the next
        // checkpoint must still lead recovery over them. One at or past the walk's end
        // named WBLOCKs its block never reached, and the log goes on elsewhere.
        let mut bridges = bridges;
        bridges.retain(|&seq, _| seq < expected);
        c.log_bridges = bridges;
        c.newest_ckpt_record = Some(rec.clone());
        c.durable_ckpt = Some(rec);
        // A MAP page pushed out of the cache during the redo and not written (no space) is
        // a failed recovery, never a lost mapping.
        if let Some(e) = &c.fatal {
            return Err(e.clone());
        }
        report.recovery_ns = c.now_ns - start;
        Ok(report)
    }

    /// Reserves the log's next forward links and starts recovery's checkpoint, with GC held
    /// off until its record is durable (`finish_recovery` says why).
    fn start_recovery_checkpoint(&mut self) -> Result<(), OxError> {
        self.reserve_log_links()?;
        self.recovering = true;
        self.checkpoint_now();
        Ok(())
    }

    /// Writes a checkpoint of the recovered state before the device serves commands.
    ///
    /// GC waits for it: the log continues in fresh EBLOCKs that only this checkpoint's
    /// record leads to, so a GC pass logged before that record is durable would be lost to
    /// a power loss now, and the EBLOCK it erased with it, while the older checkpoint's
    /// MAP still points there.
    fn finish_recovery(
        &mut self,
        mut report: RecoveryReport,
        start: TimeNs,
    ) -> Result<RecoveryReport, OxError> {
        let c = self;
        c.start_recovery_checkpoint()?;
        while c.ckpt.is_some() {
            match c.events.peek_time() {
                Some(when) => c.advance_to(when),
                None => break,
            }
            if let Some(e) = &c.fatal {
                return Err(e.clone());
            }
        }
        c.recovering = false;
        if let Some(e) = &c.fatal {
            return Err(e.clone());
        }
        for ch in 0..c.cfg.channels {
            c.events.push(c.now_ns, Event::GcCheck(ch));
        }
        c.quiesce();
        if let Some(e) = &c.fatal {
            return Err(e.clone());
        }
        if c.cfg.checkpoint.enabled {
            let next = c.now_ns + c.cfg.checkpoint.interval_ns;
            c.events.push(next, Event::CheckpointTimer);
        }
        report.recovery_ns = c.now_ns - start;
        Ok(report)
    }

    fn redo_entries(
        &mut self,
        entries: &[RdescEntry],
        mentions: &mut Vec<(Ppa, u64)>,
        t: &mut TimeNs,
    ) {
        for e in entries {
            let (end, cur) = self.map_lookup(e.lpid, *t);
            *t = (*t).max(end);
            mentions.push((cur.ppa(), e.lpid));
            mentions.push((e.prior, e.lpid));
            mentions.push((e.new, e.lpid));
            let entry = if e.new.is_none() {
                MapEntry::UNMAPPED
            } else {
                MapEntry::new(e.new)
            };
            self.map.set(e.lpid, entry);
        }
    }

    /// Reads a table page at `ppn` (or an empty one for a page never written).
    fn read_table(
        &mut self,
        ppn: u32,
        table: TableId,
        index: u32,
        t: &mut TimeNs,
    ) -> Result<Vec<u64>, OxError> {
        if ppn == NO_PPN {
            return Ok(Vec::new());
        }
        let (end, blob) = self.media.read_wblock(ppn, *t);
        *t = (*t).max(end);
        match blob {
            Some(MetaBlob::Table(p)) if p.table == table && p.index == index => Ok(p.words.clone()),
            _ => Err(OxError::Recovery(format!(
                "table page {table:?}[{index}] is not readable at WBLOCK {ppn}"
            ))),
        }
    }
}
