//! Power loss and recovery of the host key-value store (§8.1.2: "checkpointing and
//! recovering BwTree's mapping", which the batch interface removes from the host).
//!
//! Fault model, written before the code:
//!
//! - **Power loss at T.** The host loses all its memory: the B-tree's pages, its cache, the
//!   write buffer, the LLAMA map. The device loses what OX's fault model says it loses
//!   (`crate::recovery`): after its own recovery it holds every context it acknowledged and a
//!   prefix, in the order it installs them, of the rest. A batch is one context, so the batch
//!   host finds a prefix of its flushes (batches are installed in the order they are
//!   submitted). A block write is a context per packet and packets of two writes in flight
//!   interleave, so the block host may find any mix of the pages of its unacknowledged flushes.
//! - **What the store keeps.** The host acknowledges nothing to a client before the flush that
//!   carries it is acknowledged, and a flush is taken only at an operation boundary
//!   (`KvStore::flush_at_boundary`). Recovery brings the store back to the B-tree as one
//!   operation boundary left it: at or after the newest flush that, with every flush before it,
//!   the device had acknowledged. No record acknowledged that way is lost, no operation is half
//!   present, and no record comes back with a value it never had.
//! - **Batch host.** The device's MAP already knows where every LPID is: the host reads its
//!   pages back by LPID, finds the newest flush among their headers and takes the root and page
//!   count from it. A page whose header disagrees (an LPID mapped beyond the newest flush's page
//!   count) is a broken prefix and fails the recovery with its name.
//! - **Block host (LLAMA).** The map comes from the newest checkpoint record whose write
//!   completed (the record is written only once its map pages are acknowledged), then the log
//!   is replayed from the record's flush on in flush order, each segment found by the flush
//!   header of its first page. A segment cut short (a page missing) ends the replay, and so does
//!   a missing flush unless a later header says host GC had cleaned it (the log is cleaned in
//!   flush order, and a segment is freed only once every flush up to the one carrying its live
//!   pages is acknowledged, so every page the replay may fall back on is still in place).
//!   Recovery then writes a checkpoint, so that the flushes it left out can never be mixed
//!   with later ones.

use std::collections::BTreeMap;

use afa_sim::TimeNs;

use super::images::{CheckpointRecord, FlushHeader, PageImage, PageImages};
use super::{Interface, KvConfig, KvStore, Node, Purpose, NONE, PAGE_BYTES};
use crate::recovery::{PoweredOff, RecoveryReport};
use crate::{OxController, OxError, Request};

/// A store after a power loss: the device's medium and what its pages hold.
#[derive(Debug)]
pub struct KvPoweredOff {
    cfg: KvConfig,
    device: PoweredOff,
    images: Option<PageImages>,
}

/// What a recovery of the store found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KvRecoveryReport {
    /// The device's own recovery (OX: checkpoint and WAL redo).
    pub device: RecoveryReport,
    /// Host reads of its own state: commands and pages.
    pub read_commands: u64,
    pub pages_read: u64,
    /// Block host: the checkpoint record used, the segments whose headers were read, the
    /// flushes replayed and those skipped as cleaned by host GC.
    pub checkpoint_seq: Option<u64>,
    pub segments_scanned: u64,
    pub flushes_replayed: u64,
    pub flushes_skipped_cleaned: u64,
    /// The flush whose operation boundary the store came back to (`None`: nothing had been
    /// flushed, the store is empty).
    pub flush: Option<u64>,
    pub pages: u64,
    pub records: u64,
    /// Virtual time of the device's recovery and of the host's after it (its reads, and on
    /// the block interface the checkpoint it writes).
    pub device_recovery_ns: u64,
    pub host_recovery_ns: u64,
}

/// The pages found (by LPID), the root and the flush whose boundary they hold.
type FoundTree = (Vec<Found>, u64, Option<u64>);

/// A B-tree page as the device gave it back.
struct Found {
    version: u64,
    node: Node,
}

impl KvStore {
    /// Power fails at `at_ns` (at or after the store's clock): the host's memory is gone, the
    /// device keeps what OX's fault model says it keeps.
    pub fn power_loss(self, at_ns: TimeNs) -> KvPoweredOff {
        let at = at_ns.max(self.now_ns);
        KvPoweredOff {
            device: self.dev.power_loss(at),
            images: self.images,
            cfg: self.cfg,
        }
    }

    /// Brings the device and then the store back after a power loss, at `now_ns`. Needs
    /// `page_images`: the host rebuilds itself from what its pages hold.
    pub fn recover(
        off: KvPoweredOff,
        now_ns: TimeNs,
    ) -> Result<(KvStore, KvRecoveryReport), OxError> {
        let images = off.images.ok_or_else(|| {
            OxError::KvConfig(
                "the store kept no page images (page_images = false), so it cannot be \
                 rebuilt from the device"
                    .into(),
            )
        })?;
        let (dev, device) = OxController::recover(off.device, now_ns)?;
        let mut s = KvStore::on_device(off.cfg, dev, Some(images))?;
        let start = s.now_ns;
        let mut report = KvRecoveryReport {
            device_recovery_ns: device.recovery_ns,
            device,
            ..KvRecoveryReport::default()
        };
        let (pages, root, flush) = match s.cfg.interface {
            Interface::Batch => s.find_batch_pages(&mut report)?,
            Interface::Block => s.find_block_pages(&mut report)?,
        };
        s.install(pages, root)?;
        s.next_flush = s.next_flush.max(flush.map_or(0, |f| f + 1));
        if let Some(f) = flush {
            // The boundary the store came back to is acknowledged: a checkpoint taken before
            // the next flush records its root.
            s.acked_header = Some(FlushHeader {
                flush: f,
                pages_in_flush: 0,
                root: s.root,
                pages: s.nodes.len() as u64,
                log_head_flush: 0,
            });
        }
        report.flush = flush;
        if s.cfg.interface == Interface::Block && !s.nodes.is_empty() {
            s.rebuild_log()?;
            // A checkpoint of the whole map, so that a later recovery starts past every flush
            // this one left out.
            s.dirty_map_pages = (0..s.nodes.len() as u64)
                .map(|l| l * 8 / PAGE_BYTES)
                .collect();
            s.host_checkpoint()?;
            while s.ckpt_in_flight.is_some() || !s.inflight.is_empty() {
                s.wait_flushes_below(1)?;
                s.drain_completions()?;
            }
        }
        if s.nodes.is_empty() {
            // Nothing was ever flushed: an empty tree, as a new store starts.
            s.new_page(Node::Leaf {
                keys: Vec::new(),
                vals: Vec::new(),
            });
            s.touch(0);
            s.mark_modified(0)?;
        }
        report.pages = s.nodes.len() as u64;
        report.records = s.records.len() as u64;
        report.host_recovery_ns = s.now_ns - start;
        s.next_ckpt_ns = s.now_ns + s.cfg.host_checkpoint_interval_ns;
        s.stats = Default::default();
        Ok((s, report))
    }

    /// Submits `requests` with up to `max_outstanding_reads` in flight and returns what each
    /// read, in order.
    fn read_all(
        &mut self,
        requests: Vec<Request>,
        report: &mut KvRecoveryReport,
    ) -> Result<Vec<Vec<u64>>, OxError> {
        let mut out = Vec::with_capacity(requests.len());
        for chunk in requests.chunks(self.cfg.max_outstanding_reads.max(1)) {
            let mut ids = Vec::with_capacity(chunk.len());
            for r in chunk {
                self.cpu(self.cfg.costs.io_cpu_ns, Purpose::Io);
                report.read_commands += 1;
                report.pages_read += match r {
                    Request::ReadBlocks { count, .. } => *count as u64,
                    Request::ReadBatch(l) => l.len() as u64,
                    _ => 1,
                };
                ids.push(self.submit(r.clone())?);
            }
            // Completions of the other reads stay queued until the whole chunk is in.
            for id in ids {
                let c = self.dev.run_until_complete(id)?;
                self.now_ns = self.now_ns.max(c.done_ns);
                out.push(c.result?);
            }
            self.drain_completions()?;
        }
        Ok(out)
    }

    fn image(&self, address: u64, token: u64) -> Option<&PageImage> {
        self.images.as_ref()?.read(address, token)
    }

    /// A B-tree page read at `address` that must hold `lpid`.
    fn node_at(
        &self,
        address: u64,
        token: u64,
        lpid: u64,
    ) -> Result<(Found, FlushHeader), OxError> {
        match self.image(address, token) {
            Some(PageImage::Node {
                lpid: l,
                version,
                header,
                node,
            }) if *l == lpid => Ok((
                Found {
                    version: *version,
                    node: node.clone(),
                },
                *header,
            )),
            _ => Err(OxError::Recovery(format!(
                "page {lpid} of the B-tree is not at address {address}: the device returned \
                 token {token:#x}, which the host never wrote there for it"
            ))),
        }
    }

    /// Batch host: the pages are wherever the device's MAP says; LPIDs are dense.
    fn find_batch_pages(&mut self, report: &mut KvRecoveryReport) -> Result<FoundTree, OxError> {
        let lp = self.cfg.device.logical_pages;
        let mut mapped = |s: &mut KvStore, l: u64| -> Result<bool, OxError> {
            let t = s.read_all(vec![Request::ReadLpid(l)], report)?;
            Ok(t[0].first().is_some_and(|&t| t != 0))
        };
        // The number of pages: every LPID below it is mapped, none from it on. Doubling
        // finds a bound, bisection the first unmapped LPID below it.
        let count = if !mapped(self, 0)? {
            0
        } else {
            let mut bound = 1;
            while bound < lp && mapped(self, bound)? {
                bound *= 2;
            }
            let (mut lo, mut hi) = (bound / 2 + 1, bound.min(lp));
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if mapped(self, mid)? {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            lo
        };
        let max = self.cfg.device.max_batch_pages.max(1) as u64;
        let requests = (0..count)
            .step_by(max as usize)
            .map(|first| Request::ReadBatch((first..(first + max).min(count)).collect()))
            .collect();
        let tokens: Vec<u64> = self.read_all(requests, report)?.concat();
        let mut pages = Vec::with_capacity(count as usize);
        let mut newest: Option<FlushHeader> = None;
        for (l, &t) in tokens.iter().enumerate() {
            let (found, header) = self.node_at(l as u64, t, l as u64)?;
            if newest.is_none_or(|n| header.flush > n.flush) {
                newest = Some(header);
            }
            pages.push(found);
        }
        let Some(newest) = newest else {
            return Ok((pages, NONE, None));
        };
        if newest.pages != count {
            return Err(OxError::Recovery(format!(
                "the device maps {count} B-tree pages but its newest flush ({}) had {}: a \
                 later flush is present without an earlier one",
                newest.flush, newest.pages
            )));
        }
        Ok((pages, newest.root, Some(newest.flush)))
    }

    /// Block host: the newest checkpoint, then the log replayed in flush order.
    fn find_block_pages(&mut self, report: &mut KvRecoveryReport) -> Result<FoundTree, OxError> {
        // The checkpoint record: the newest readable one.
        let slots = self.read_all(
            vec![Request::ReadBlocks {
                lba: self.record_lba(0),
                count: 2,
            }],
            report,
        )?;
        let mut record: Option<CheckpointRecord> = None;
        for (slot, &t) in slots[0].iter().enumerate() {
            if let Some(PageImage::Record(r)) = self.image(self.record_lba(slot as u64), t) {
                if record.as_ref().is_none_or(|b| r.seq > b.seq) {
                    record = Some(r.clone());
                }
            }
        }
        report.checkpoint_seq = record.as_ref().map(|r| r.seq);

        // The map as the checkpoint left it.
        let mut lba_of: Vec<u64> = Vec::new();
        if let Some(r) = &record {
            let wanted: Vec<(u64, u8)> = r
                .halves
                .iter()
                .enumerate()
                .filter_map(|(p, h)| h.map(|h| (p as u64, h)))
                .collect();
            let requests = wanted
                .iter()
                .map(|&(p, h)| Request::ReadBlocks {
                    lba: self.map_page_lba(p, h),
                    count: 1,
                })
                .collect();
            let tokens = self.read_all(requests, report)?;
            for (&(p, h), t) in wanted.iter().zip(tokens) {
                let lba = self.map_page_lba(p, h);
                match self.image(lba, t[0]) {
                    Some(PageImage::MapPage { index, lbas }) if *index == p => {
                        let first = (p * PAGE_BYTES / 8) as usize;
                        if lba_of.len() < first + lbas.len() {
                            lba_of.resize(first + lbas.len(), NONE);
                        }
                        lba_of[first..first + lbas.len()].copy_from_slice(lbas);
                    }
                    _ => {
                        return Err(OxError::Recovery(format!(
                            "checkpoint {} names map page {p} at LBA {lba}, which does not \
                             hold it",
                            r.seq
                        )))
                    }
                }
            }
        }

        // Every segment's flush header, from its first page.
        let requests = (0..self.segments)
            .map(|seg| Request::ReadBlocks {
                lba: seg * self.seg_pages,
                count: 1,
            })
            .collect();
        let firsts = self.read_all(requests, report)?;
        report.segments_scanned = self.segments;
        let mut by_flush: BTreeMap<u64, (u64, FlushHeader)> = BTreeMap::new();
        let mut head = record.as_ref().map_or(0, |r| r.log_head_flush);
        for (seg, t) in firsts.iter().enumerate() {
            let base = seg as u64 * self.seg_pages;
            if let Some(PageImage::Node { header, .. }) = self.image(base, t[0]) {
                head = head.max(header.log_head_flush);
                if let Some((other, _)) = by_flush.insert(header.flush, (seg as u64, *header)) {
                    return Err(OxError::Recovery(format!(
                        "segments {other} and {seg} both begin flush {}",
                        header.flush
                    )));
                }
                self.seg_flush[seg] = header.flush;
            }
        }
        let newest_found = by_flush.keys().next_back().copied();

        // Replay from the checkpoint's flush on.
        let mut found: BTreeMap<u64, Found> = BTreeMap::new();
        let mut last: Option<FlushHeader> = None;
        let mut f = record.as_ref().map_or(0, |r| r.replay_from_flush);
        while newest_found.is_some_and(|n| f <= n) {
            let Some(&(seg, header)) = by_flush.get(&f) else {
                if f < head {
                    report.flushes_skipped_cleaned += 1;
                    f += 1;
                    continue;
                }
                break;
            };
            let base = seg * self.seg_pages;
            let tokens = self.read_all(
                vec![Request::ReadBlocks {
                    lba: base,
                    count: header.pages_in_flush,
                }],
                report,
            )?;
            let mut pages = Vec::with_capacity(tokens[0].len());
            let mut whole = tokens[0].len() == header.pages_in_flush as usize;
            for (i, &t) in tokens[0].iter().enumerate() {
                match self.image(base + i as u64, t) {
                    Some(PageImage::Node {
                        lpid,
                        version,
                        header: h,
                        node,
                    }) if h.flush == f => pages.push((
                        *lpid,
                        Found {
                            version: *version,
                            node: node.clone(),
                        },
                    )),
                    _ => {
                        whole = false;
                        break;
                    }
                }
            }
            if !whole {
                // Cut short by the power loss: nothing from here on was acknowledged.
                break;
            }
            for (i, (lpid, page)) in pages.into_iter().enumerate() {
                if lba_of.len() <= lpid as usize {
                    lba_of.resize(lpid as usize + 1, NONE);
                }
                lba_of[lpid as usize] = base + i as u64;
                found.insert(lpid, page);
            }
            report.flushes_replayed += 1;
            last = Some(header);
            f += 1;
        }
        let (root, count, flush) = match (last, &record) {
            (Some(h), _) => (h.root, h.pages, Some(h.flush)),
            (None, Some(r)) if r.root != NONE => {
                (r.root, r.pages, Some(r.replay_from_flush.saturating_sub(1)))
            }
            _ => (NONE, 0, None),
        };
        // Flush numbers go on past every header on the device, replayed or not.
        self.next_flush = newest_found.map_or(0, |n| n + 1);

        // The pages the replay did not bring, from where the map says they are.
        lba_of.resize(count as usize, NONE);
        let missing: Vec<u64> = (0..count).filter(|l| !found.contains_key(l)).collect();
        if let Some(&l) = missing.iter().find(|&&l| lba_of[l as usize] == NONE) {
            return Err(OxError::Recovery(format!(
                "page {l} of the B-tree has no place in the recovered map"
            )));
        }
        // Read in runs of consecutive LBAs (what survives of each segment), at most a
        // segment a command.
        let mut at: Vec<(u64, u64)> = missing.iter().map(|&l| (lba_of[l as usize], l)).collect();
        at.sort_unstable();
        let mut runs: Vec<(u64, u32)> = Vec::new();
        for &(lba, _) in &at {
            match runs.last_mut() {
                Some((first, n)) if *first + *n as u64 == lba && (*n as u64) < self.seg_pages => {
                    *n += 1
                }
                _ => runs.push((lba, 1)),
            }
        }
        let requests = runs
            .iter()
            .map(|&(lba, count)| Request::ReadBlocks { lba, count })
            .collect();
        let tokens: Vec<u64> = self.read_all(requests, report)?.concat();
        for (&(lba, l), &t) in at.iter().zip(&tokens) {
            let (page, _) = self.node_at(lba, t, l)?;
            found.insert(l, page);
        }
        self.lba_of = lba_of;
        if let Some(r) = record {
            self.ckpt_seq = r.seq + 1;
            self.ckpt_halves = r.halves;
        }
        Ok((found.into_values().collect(), root, flush))
    }

    /// Takes the pages found as the store's B-tree, with their versions durable, and the
    /// records they hold as the oracle.
    fn install(&mut self, pages: Vec<Found>, root: u64) -> Result<(), OxError> {
        let n = pages.len();
        if n > 0 && root as usize >= n {
            return Err(OxError::Recovery(format!(
                "the recovered root {root} lies beyond the {n} pages found"
            )));
        }
        self.version = pages.iter().map(|p| p.version).collect();
        self.flushed_version = self.version.clone();
        self.durable_version = self.version.clone();
        self.nodes = pages.into_iter().map(|p| p.node).collect();
        self.dirty = vec![false; n];
        self.cache = crate::page_lru::PageLru::new(n);
        if self.lba_of.len() != n {
            self.lba_of = vec![NONE; n];
        }
        self.root = if n > 0 { root } else { 0 };
        self.records.clear();
        self.depth = 1;
        if n == 0 {
            return Ok(());
        }
        // Walk the tree from the root: every page reachable once, leaves in key order.
        let mut stack = vec![(self.root, 1u64)];
        let mut seen = vec![false; n];
        let mut leaves = Vec::new();
        while let Some((p, level)) = stack.pop() {
            if p as usize >= n || std::mem::replace(&mut seen[p as usize], true) {
                return Err(OxError::Recovery(format!(
                    "page {p} is referenced twice or lies beyond the {n} pages found"
                )));
            }
            self.depth = self.depth.max(level);
            match &self.nodes[p as usize] {
                Node::Leaf { .. } => leaves.push(p),
                Node::Inner { children, .. } => {
                    stack.extend(children.iter().rev().map(|&c| (c, level + 1)));
                }
            }
        }
        for p in leaves {
            if let Node::Leaf { keys, vals } = &self.nodes[p as usize] {
                for (&k, &v) in keys.iter().zip(vals) {
                    if self.records.insert(k, v).is_some() {
                        return Err(OxError::Recovery(format!(
                            "key {k:#x} is in two leaves of the recovered tree"
                        )));
                    }
                }
            }
        }
        self.cache_capacity = ((self.cfg.cache_fraction * n as f64).round() as usize).max(1);
        Ok(())
    }

    /// Block host: the log's segments, live counts and order from the recovered map.
    fn rebuild_log(&mut self) -> Result<(), OxError> {
        let mut slots: Vec<Vec<u64>> = vec![Vec::new(); self.segments as usize];
        let mut live = vec![0u32; self.segments as usize];
        for (l, &lba) in self.lba_of.iter().enumerate() {
            if lba == NONE {
                continue;
            }
            let seg = (lba / self.seg_pages) as usize;
            let i = (lba % self.seg_pages) as usize;
            if seg >= slots.len() || self.seg_flush[seg] == NONE {
                return Err(OxError::Recovery(format!(
                    "page {l} is at LBA {lba}, outside every segment the log holds"
                )));
            }
            if slots[seg].len() <= i {
                slots[seg].resize(i + 1, NONE);
            }
            slots[seg][i] = l as u64;
            live[seg] += 1;
        }
        let mut used: Vec<u64> = (0..self.segments)
            .filter(|&s| live[s as usize] > 0)
            .collect();
        used.sort_by_key(|&s| self.seg_flush[s as usize]);
        for (flush, &n) in self.seg_flush.iter_mut().zip(&live) {
            if n == 0 {
                *flush = NONE;
            }
        }
        self.free_segs = (0..self.segments)
            .filter(|&s| live[s as usize] == 0)
            .collect();
        self.log_order = used.into_iter().collect();
        self.seg_slots = slots;
        self.seg_live = live;
        Ok(())
    }
}
