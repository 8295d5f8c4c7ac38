//! The controller's write cache (§7.2.9), write-through or write-back (§9).
//!
//! Every write context enters the cache when its start event comes, in arrival order, if its
//! pages fit in the cache's capacity (a context always fits an empty cache); otherwise it and
//! every context behind it wait for an install to free room. The cache is DRAM, so it is
//! finite in either mode, and the bound keeps the device from handing more WBLOCKs to
//! contexts under way than GC and the log can live with, whatever the host's queue depth.
//!
//! With `write_cache.write_back` a write is also acknowledged once every one of its contexts
//! is in the cache, not once it is installed: the WAL protocol (RDESC, program, MAP install,
//! `done`) runs after the acknowledgement exactly as it runs before one with the write-through
//! cache. What changes:
//!
//! - **Admission** marks each of the context's LPIDs in MAP with the cached flag (the entry's
//!   MAP page is loaded for it) and puts the page's token in the side table, the small
//!   associative table §3.2.2 describes.
//! - **Acknowledgement.** A command is acknowledged once all its contexts are admitted and
//!   their MAP pages are in DRAM, and never before a command acknowledged earlier, so the host
//!   sees acknowledgements in arrival order as it does without the cache.
//! - **Reads.** A read whose MAP entry carries the cached flag takes the newest token of the
//!   side table from DRAM and reads no flash. The flag is not durable: MAP pages are written
//!   without it, and a page loaded again gets it back from the side table.
//! - **Install.** Contexts install in RDESC order, so the oldest version of an LPID in the
//!   side table is the one being installed; it leaves the table, and the flag stays only while
//!   a newer version waits.
//! - **Power loss.** The cache's DRAM is taken to be backed by flash, as §9 assumes: when power
//!   fails the host interface stops (no context is admitted any more) and the controller runs
//!   until every admitted context is installed, then stops. The drain's length is reported,
//!   since it is what the backup power must last. Recovery then finds every acknowledged write
//!   in the log like any other.
//! - **Flush.** A flush of the block interface waits until the cache is empty.
//!
//! Should an admitted context fail after its command was acknowledged (the device is out of
//! space and nothing can be reclaimed), the controller stops with an error naming it rather
//! than forget a write it acknowledged.

use std::collections::{BTreeMap, VecDeque};

use afa_sim::TimeNs;

use crate::controller::{Event, PendingContext};
use crate::{OxController, OxError};

/// The write cache's state in controller DRAM.
#[derive(Debug, Clone, Default)]
pub(crate) struct WriteCache {
    /// LPID → versions admitted but not installed, oldest first: (context key, token).
    pub side: BTreeMap<u64, VecDeque<(u64, u64)>>,
    /// Bytes of write data the admitted contexts hold.
    pub bytes: u64,
    /// Admitted contexts not yet installed (nor failed).
    pub contexts: u64,
    /// Start keys of contexts waiting for room, in arrival order.
    pub waiting: VecDeque<u64>,
    /// The latest acknowledgement given: acknowledgements keep arrival order.
    pub last_ack_ns: TimeNs,
    /// Power failed: the host interface admits nothing any more.
    pub powering_down: bool,
}

impl WriteCache {
    /// The newest cached token of `lpid`, if a version waits in the cache.
    pub fn newest(&self, lpid: u64) -> Option<u64> {
        self.side.get(&lpid).and_then(|v| v.back()).map(|&(_, t)| t)
    }
}

impl OxController {
    fn write_back(&self) -> bool {
        self.cfg.write_cache.write_back
    }

    /// Bytes a context holds in the cache (a trim holds no data).
    fn cached_bytes(&self, p: &PendingContext) -> u64 {
        if p.trim {
            0
        } else {
            p.lpids.len() as u64 * self.cfg.terms.rblock_bytes as u64
        }
    }

    /// Start event `k`: admits the context to the cache, or queues it for room. Returns
    /// whether it was admitted and may start.
    pub(crate) fn admit_on_start(&mut self, k: u64) -> bool {
        if self.wcache.powering_down {
            // The host interface is down: what was not admitted is lost, unacknowledged.
            self.starting.remove(&k);
            return false;
        }
        if !self.wcache.waiting.is_empty() || !self.fits(k) {
            self.stats.write_cache_full_waits += 1;
            self.wcache.waiting.push_back(k);
            return false;
        }
        self.admit(k);
        true
    }

    fn fits(&self, k: u64) -> bool {
        let Some(p) = self.starting.get(&k) else {
            return true;
        };
        self.wcache.contexts == 0
            || self.wcache.bytes + self.cached_bytes(p) <= self.cfg.write_cache_capacity_bytes()
    }

    /// Puts context `k`'s pages in the cache and, write-back, flags them in MAP and
    /// acknowledges its command once all the command's contexts are in.
    fn admit(&mut self, k: u64) {
        let now = self.now_ns;
        let Some(p) = self.starting.get_mut(&k) else {
            return;
        };
        p.cache_key = k;
        let bytes = self.cached_bytes(self.starting.get(&k).expect("present"));
        self.wcache.bytes += bytes;
        self.wcache.contexts += 1;
        if !self.write_back() {
            // Write-through: the cache only bounds the write data under way; the command is
            // answered once its contexts are installed.
            return;
        }
        let p = self.starting.get(&k).expect("present");
        let (lpids, tokens, request, trim) = (p.lpids.clone(), p.tokens.clone(), p.request, p.trim);
        for (&lpid, &token) in lpids.iter().zip(&tokens) {
            let token = if trim { 0 } else { token };
            self.wcache
                .side
                .entry(lpid)
                .or_default()
                .push_back((k, token));
        }
        let mut ready = now;
        for &lpid in &lpids {
            ready = ready.max(self.ensure_map_page(lpid, now));
            self.map.set_cached(lpid, true);
        }
        let latency = self.cfg.costs.transport_latency_ns;
        let Some(r) = self.requests.get_mut(&request) else {
            return;
        };
        r.accept_ready_ns = r.accept_ready_ns.max(ready);
        r.to_accept = r.to_accept.saturating_sub(1);
        if r.to_accept == 0 {
            let ack = r.accept_ready_ns.max(self.wcache.last_ack_ns);
            self.wcache.last_ack_ns = ack;
            self.events.push(ack + latency, Event::Ack(request));
        }
    }

    /// Every context of a command is in the cache: the host gets its acknowledgement.
    pub(crate) fn on_ack(&mut self, id: u64) {
        let now = self.now_ns;
        let Some(r) = self.requests.get_mut(&id) else {
            // Already completed: it was durable before its acknowledgement was due.
            return;
        };
        if r.acked || r.result.as_ref().is_some_and(|x| x.is_err()) {
            // A failure before the acknowledgement completes the command with its error.
            return;
        }
        r.acked = true;
        self.stats.write_cache_acks += 1;
        self.completions.push(crate::CompletionRecord {
            id,
            submitted_ns: r.submitted_ns,
            done_ns: now,
            result: Ok(Vec::new()),
        });
    }

    /// Entry `lpid` of context `key` was installed: its version leaves the side table.
    /// Returns whether a newer version still waits (the MAP entry keeps its cached flag).
    pub(crate) fn release_installed(&mut self, lpid: u64, key: u64) -> bool {
        if !self.write_back() {
            return false;
        }
        let Some(versions) = self.wcache.side.get_mut(&lpid) else {
            return false;
        };
        // Contexts install in RDESC order, which is admission order, so this context's
        // version is the oldest one.
        if let Some(pos) = versions.iter().position(|&(k, _)| k == key) {
            versions.remove(pos);
        }
        if versions.is_empty() {
            self.wcache.side.remove(&lpid);
            false
        } else {
            true
        }
    }

    /// Context `key` left the cache (installed or failed): its room frees, and contexts that
    /// waited for room are admitted and started in order.
    pub(crate) fn release_context(&mut self, key: u64, lpids: &[u64], trim: bool) {
        if key == 0 {
            return;
        }
        let bytes = if trim {
            0
        } else {
            lpids.len() as u64 * self.cfg.terms.rblock_bytes as u64
        };
        self.wcache.bytes -= bytes;
        self.wcache.contexts -= 1;
        if !self.wcache.waiting.is_empty() {
            // Admitted in an event of their own: a context may leave the cache in the middle
            // of failing the contexts that wait for space, which must not start new ones.
            self.events.push(self.now_ns, Event::AdmitWaiting);
        }
    }

    /// Admits and starts the contexts that waited for room, in order, as far as room allows.
    pub(crate) fn on_admit_waiting(&mut self) {
        while !self.wcache.powering_down {
            let Some(&k) = self.wcache.waiting.front() else {
                break;
            };
            if !self.fits(k) {
                break;
            }
            self.wcache.waiting.pop_front();
            self.admit(k);
            self.start_admitted(k);
        }
    }

    /// An admitted context failed: its versions leave the side table (a read sees the version
    /// before it again) and its room frees.
    pub(crate) fn forget_failed(&mut self, p: &PendingContext) {
        if p.cache_key == 0 {
            return;
        }
        for &lpid in &p.lpids {
            let Some(versions) = self.wcache.side.get_mut(&lpid) else {
                continue;
            };
            versions.retain(|&(k, _)| k != p.cache_key);
            if versions.is_empty() {
                self.wcache.side.remove(&lpid);
                self.map.set_cached(lpid, false);
            }
        }
        self.release_context(p.cache_key, &p.lpids, p.trim);
    }

    /// A MAP page was loaded: entries of LPIDs with a version in the cache get their flag back.
    pub(crate) fn reflag_loaded_page(&mut self, page: u32) {
        if self.wcache.side.is_empty() {
            return;
        }
        let per = self.map.entries_per_page;
        let first = page as u64 * per;
        let lpids: Vec<u64> = self
            .wcache
            .side
            .range(first..first + per)
            .map(|(&l, _)| l)
            .collect();
        for lpid in lpids {
            self.map.set_cached(lpid, true);
        }
    }

    /// An acknowledged write failed after its acknowledgement: the controller stops.
    pub(crate) fn acknowledged_write_failed(&mut self, id: u64, e: &OxError) {
        self.fatal = Some(OxError::AcknowledgedWriteFailed {
            request: id,
            reason: e.to_string(),
        });
    }

    /// Runs the controller until the write cache holds nothing (a flush of the block
    /// interface); returns when it is empty.
    pub fn drain_write_cache(&mut self) -> TimeNs {
        if !self.write_back() {
            // Write-through: whatever the cache holds has not been acknowledged.
            return self.now_ns;
        }
        while (self.wcache.contexts > 0 || !self.wcache.waiting.is_empty()) && self.fatal.is_none()
        {
            match self.events.peek_time() {
                Some(t) => self.advance_to(t),
                None => break,
            }
        }
        self.now_ns
    }

    /// Power failed: the host interface stops, and the backup power runs the controller until
    /// every admitted context is installed. Returns when it stopped.
    pub(crate) fn drain_on_power_loss(&mut self) -> TimeNs {
        if !self.write_back() {
            return self.now_ns;
        }
        self.wcache.powering_down = true;
        while self.wcache.contexts > 0 && self.fatal.is_none() {
            match self.events.peek_time() {
                Some(t) => self.advance_to(t),
                None => break,
            }
        }
        self.now_ns
    }

    /// Whether version `token` of `lpid` waits in the write-back cache (admitted, not yet
    /// installed, so its RBLOCK may not be programmed yet).
    pub fn write_cache_holds(&self, lpid: u64, token: u64) -> bool {
        self.wcache
            .side
            .get(&lpid)
            .is_some_and(|v| v.iter().any(|&(_, t)| t == token))
    }

    /// Bytes of write data the cache holds now.
    pub fn write_cache_bytes(&self) -> u64 {
        self.wcache.bytes
    }

    /// Commands the write-back cache acknowledged whose contexts are not all installed yet:
    /// what a flush started now must wait for.
    pub fn acknowledged_not_durable(&self) -> Vec<crate::RequestId> {
        self.requests
            .iter()
            .filter(|(_, r)| r.acked)
            .map(|(&id, _)| id)
            .collect()
    }

    /// Whether command `id` is still under way (not yet completed, or, acknowledged by the
    /// write-back cache, not yet installed).
    pub fn under_way(&self, id: crate::RequestId) -> bool {
        self.requests.contains_key(&id)
    }
}
