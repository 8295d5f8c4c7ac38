//! Garbage collection per channel (§5.1, §7.2.8) and static wear levelling.
//!
//! When a channel's used EBLOCKs exceed `start_used_fraction`, GC closes the channel to user
//! writes (reads go on) and collects victims one at a time until the used fraction falls
//! below `stop_used_fraction`. Victims are FULL HOT or COLD EBLOCKs with no context in
//! flight, most invalid RBLOCKs first, and — as OX picks them — at least half invalid while
//! the channel has room. GBITV says which RBLOCKs are live and their TAGs give the LPIDs, so
//! only WBLOCKs that hold a live RBLOCK are read (whole, as OX does). The live RBLOCKs are
//! written to the COLD line, and MAP is updated with the optimistic check: an entry moves
//! only if it still points at the victim, so a user write that landed meanwhile wins. The GC record of the moves is durable before
//! the victim is erased.

use afa_sim::TimeNs;

use crate::controller::{Event, GcPass, Waiter};
use crate::log::{GcMove, LogRecord};
use crate::media::{Ppn, RblockWrite, Tag, TagKind};
use crate::provision::{BlockState, Stream};
use crate::OxController;

impl OxController {
    /// Schedules a GC check of the channel of a WBLOCK just handed out, if it crossed the
    /// start threshold.
    pub(crate) fn gc_trigger_for(&mut self, ppn: Ppn) {
        if !self.cfg.gc.enabled {
            return;
        }
        let ch = self.media.channel_of(self.media.block_of_ppn(ppn));
        self.checkpoint_if_space_is_short(ch, self.cfg.meta_trigger_eblocks());
        if !self.gc.contains_key(&ch) && self.gc_wanted(ch) {
            self.events.push(self.now_ns, Event::GcCheck(ch));
        }
    }

    /// Whether channel `ch` needs a GC turn: its used fraction reached the start threshold,
    /// or it has closed to user writes for want of free EBLOCKs. A start threshold above
    /// the used fraction at which user writes close (`1 − (2 × luns_per_channel + 2) /
    /// usable EBLOCKs`, 0.81 on a channel of 32) was never reached: writes waited for a GC
    /// that never started, and the run never ended.
    fn gc_wanted(&self, ch: u32) -> bool {
        self.prov.used_fraction(ch) >= self.cfg.gc.start_used_fraction
            || self.prov.free_in_channel(ch) <= self.prov.reserve_eblocks(Stream::Hot)
    }

    /// The EBLOCK GC should collect next in a channel, if any would give space back.
    pub(crate) fn pick_victim(&self, ch: u32) -> Option<u32> {
        let full_rblocks = self.cfg.terms.rblocks_per_eblock();
        let mut best: Option<(u32, u32)> = None; // (invalid, block)
        let mut coldest: Option<(u32, u32)> = None; // (erase count, block)
        let mut max_erase = 0;
        for b in self.prov.blocks_of_channel(&self.media, ch) {
            let m = &self.prov.blocks[b as usize];
            if m.state == BlockState::Bad || m.state == BlockState::System {
                continue;
            }
            max_erase = max_erase.max(self.media.erase_count(b));
            let candidate = m.state == BlockState::Full
                && matches!(m.stream, Some(Stream::Hot) | Some(Stream::Cold))
                && m.inflight == 0
                && !self.gc.values().any(|p| p.victim == b);
            if !candidate {
                continue;
            }
            if m.retire {
                return Some(b);
            }
            let invalid = full_rblocks - self.gbitv.valid(b);
            if best.is_none_or(|(i, _)| invalid > i) {
                best = Some((invalid, b));
            }
            let e = self.media.erase_count(b);
            if coldest.is_none_or(|(c, _)| e < c) {
                coldest = Some((e, b));
            }
        }
        // Static wear levelling takes every eighth pass of a channel at most, so that moving
        // cold data never starves the passes that give space back.
        let wl = self.cfg.gc.static_wear_threshold_erases;
        if let Some((e, b)) = coldest {
            if wl > 0 && max_erase > e + wl && self.gc_passes[ch as usize] % 8 == 7 {
                return Some(b);
            }
        }
        best.filter(|&(invalid, _)| invalid > 0 && invalid >= self.min_invalid_rblocks(ch))
            .map(|(_, b)| b)
    }

    /// The fewest invalid RBLOCKs a victim must have in channel `ch`, as OX's
    /// `block_gc_get_target_blks` computes it: half the EBLOCK while the channel is less than
    /// 70% used, less and less above, none once user writes cannot get an EBLOCK there.
    fn min_invalid_rblocks(&self, ch: u32) -> u32 {
        let g = &self.cfg.gc;
        if self.prov.free_in_channel(ch) <= self.prov.reserve_eblocks(Stream::Hot) {
            return 0;
        }
        let used = self.prov.used_fraction(ch);
        let relax = g.min_invalid_relax_from_used_fraction;
        let scale = if used >= relax {
            (1.0 - (used - relax) / (1.0 - relax)).max(0.0)
        } else {
            1.0
        };
        let full = self.cfg.terms.rblocks_per_eblock() as f64;
        (full * g.min_invalid_fraction * scale).floor() as u32
    }

    pub(crate) fn on_gc_check(&mut self, ch: u32) {
        if !self.cfg.gc.enabled
            || self.gc.contains_key(&ch)
            || self.fatal.is_some()
            || self.recovering
            || self.read_only.is_some()
        {
            return;
        }
        let needed = self.gc_wanted(ch)
            || (self.prov.is_gc_channel(ch)
                && self.prov.used_fraction(ch) > self.cfg.gc.stop_used_fraction);
        if !needed {
            self.end_gc_turn(ch);
            self.retry_stalled();
            return;
        }
        let limit = self.cfg.gc.max_gc_channels;
        let closed = self.prov.gc_channels.iter().filter(|&&c| c).count() as u32;
        if limit > 0 && !self.prov.is_gc_channel(ch) && closed >= limit {
            // This channel waits its turn: the next turn to end wakes it.
            self.prov.gc_turn_waiting[ch as usize] = true;
            return;
        }
        match self.pick_victim(ch) {
            Some(v) => self.start_gc_pass(ch, v),
            None => {
                self.end_gc_turn(ch);
                self.retry_stalled();
                self.fail_stalled_if_hopeless();
            }
        }
    }

    /// Reopens channel `ch` to user writes after its GC turn and wakes the channels that
    /// were refused a turn while `max_gc_channels` channels held one. Every way a turn ends
    /// wakes them: when a turn ended for want of a victim they used to wait with no event
    /// left to wake them, and contexts stalled for their space never completed. Only
    /// channels that were refused are woken, and a woken channel that is refused again
    /// waits without an event, so turns that end at the same instant cannot wake each
    /// other for ever.
    fn end_gc_turn(&mut self, ch: u32) {
        self.prov.gc_channels[ch as usize] = false;
        self.wake_gc_turn_waiters();
    }

    /// Lets every channel refused a GC turn check again.
    pub(crate) fn wake_gc_turn_waiters(&mut self) {
        for ch in 0..self.cfg.channels {
            if std::mem::take(&mut self.prov.gc_turn_waiting[ch as usize]) {
                self.events.push(self.now_ns, Event::GcCheck(ch));
            }
        }
    }

    /// Reads the live RBLOCKs of the victim and writes them to the COLD line.
    fn start_gc_pass(&mut self, ch: u32, victim: u32) {
        let now = self.now_ns;
        self.prov.gc_channels[ch as usize] = true;
        self.gc_passes[ch as usize] += 1;
        let seq = self.next_gc_seq;
        self.next_gc_seq += 1;
        let spp = self.media.rblocks_per_wblock() as usize;
        let rb = self.cfg.terms.rblock_bytes as u64;
        let live = self.gbitv.live_rblocks(victim);
        let first = self.media.first_ppn(victim);
        // OX reads every WBLOCK of the victim that holds a live RBLOCK whole, as the flash
        // page it is (`block_gc_read_blk` in ox-ctrl's oxb-gc.c), and then picks the live
        // RBLOCKs out of the buffer; this is why the paper's Table 3 shows OXBatch's GC
        // reading about three times what it writes. Each source WBLOCK is read once; `read_at`
        // holds when it is in controller memory.
        let whole = self.cfg.gc.read_whole_wblocks;
        let mut read_at: Vec<(u32, TimeNs)> = Vec::new();
        if whole {
            for &r in &live {
                let w = r / spp as u32;
                if read_at.last().is_none_or(|&(p, _)| p != w) {
                    let (t, _) = self.media.read_wblock(first + w, now);
                    self.stats.gc_read_bytes += self.cfg.terms.wblock_bytes as u64;
                    read_at.push((w, t));
                }
            }
        }
        let mut copies = Vec::with_capacity(live.len());
        let mut end_max = now;
        for chunk in live.chunks(spp) {
            let mut ready = now;
            let mut rblocks = Vec::with_capacity(spp);
            let mut priors = Vec::with_capacity(spp);
            for &r in chunk {
                let ppa = self.media.ppa(first + r / spp as u32, r % spp as u32);
                let (t, token, tag) = if whole {
                    let w = r / spp as u32;
                    let t = read_at
                        .iter()
                        .find(|&&(p, _)| p == w)
                        .map_or(now, |&(_, t)| t);
                    (t, self.media.token_of(ppa), self.media.tag_of(ppa))
                } else {
                    self.media.read_rblock(ppa, now)
                };
                ready = ready.max(t);
                rblocks.push(RblockWrite {
                    tag: Tag::new(TagKind::Gc, tag.lpid, seq),
                    token,
                    source: Some(ppa),
                });
                priors.push((tag.lpid, ppa));
            }
            if !whole {
                self.stats.gc_read_bytes += chunk.len() as u64 * rb;
            }
            let ready = self.cpu(ready, self.cfg.costs.page_cpu_ns * chunk.len() as u64);
            loop {
                // The COLD line stripes over the channels. When none has room above the
                // reserve GC copies keep, the victim's own channel takes the copies down
                // to its last two free EBLOCKs (`alloc_gc_copy_in_channel`).
                let striped = self.prov.alloc(&self.media, Stream::Cold);
                let Some(ppn) =
                    striped.or_else(|| self.prov.alloc_gc_copy_in_channel(&self.media, ch))
                else {
                    // Nowhere to move the pages: give up on this victim for now.
                    self.abort_gc(ch, copies);
                    return;
                };
                let to = self.media.channel_of(self.media.block_of_ppn(ppn));
                self.checkpoint_if_space_is_short(to, self.cfg.meta_trigger_eblocks());
                match self.media.program(ppn, ready, &rblocks, None) {
                    Ok(end) => {
                        end_max = end_max.max(end);
                        self.stats.gc_write_bytes += chunk.len() as u64 * rb;
                        let b = self.media.block_of_ppn(ppn) as usize;
                        self.prov.blocks[b].inflight += chunk.len() as u32;
                        for (i, &(lpid, prior)) in priors.iter().enumerate() {
                            copies.push((lpid, prior, self.media.ppa(ppn, i as u32)));
                        }
                        break;
                    }
                    Err(e) => {
                        if !self.absorb_program_failure(ppn, e) {
                            self.abort_gc(ch, copies);
                            return;
                        }
                    }
                }
            }
        }
        let reclaim = self.cfg.terms.rblocks_per_eblock() - live.len() as u32;
        self.gc.insert(
            ch,
            GcPass {
                victim,
                seq,
                copies,
                reclaim_rblocks: reclaim,
            },
        );
        self.events.push(end_max, Event::GcCopiesDone(ch));
    }

    /// Abandons a pass whose pages could not all be moved: the copies made are garbage.
    fn abort_gc(&mut self, ch: u32, copies: Vec<(u64, crate::media::Ppa, crate::media::Ppa)>) {
        for (_, _, new) in copies {
            let b = self.media.block_of_ppa(new) as usize;
            self.prov.blocks[b].inflight -= 1;
        }
        self.end_gc_turn(ch);
        // GC cannot move pages anywhere now, but that is for good only if nothing else will
        // free an EBLOCK. A checkpoint under way, or one that would give log and table
        // EBLOCKs back, frees some, and so does an erase waiting for its log record; each
        // lets GC try again when it is done (`redrive_stalled`). Failing the waiting
        // contexts at once, as this did, failed writes a running checkpoint was about to
        // make room for. Contexts under way are relief too: each install lets the next
        // checkpoint truncate more of the log (`fail_stalled_if_hopeless` says more).
        let relief = self.checkpoint_if_space_is_short(ch, 1)
            || self.ckpt.is_some()
            || !self.pending_erases.is_empty()
            || !self.contexts.is_empty();
        if relief {
            self.gc_gave_up = true;
        } else if self.gc.is_empty() {
            while let Some(p) = self.stalled.pop_front() {
                self.fail_context(p);
            }
        }
    }

    /// Space came back from outside GC (a checkpoint's end or the erase of a log or table
    /// EBLOCK): waiting contexts start if they now fit, and if a GC pass gave up for want
    /// of free EBLOCKs every channel checks for GC again, since it may now move its
    /// victim's pages. Nothing else would wake the contexts: the pass that gave up left no
    /// event.
    pub(crate) fn redrive_stalled(&mut self) {
        self.retry_stalled();
        if std::mem::take(&mut self.gc_gave_up) && self.anything_stalled() {
            for ch in 0..self.cfg.channels {
                self.events.push(self.now_ns, Event::GcCheck(ch));
            }
        }
    }

    /// The copies are on flash: install the ones that still hold (optimistic check), log the
    /// moves, and erase the victim once that record is durable.
    pub(crate) fn on_gc_copies_done(&mut self, ch: u32) {
        let now = self.now_ns;
        let Some(pass) = self.gc.get(&ch).cloned() else {
            return;
        };
        let mut moves = Vec::with_capacity(pass.copies.len());
        for &(lpid, prior, new) in &pass.copies {
            // Read the entry, then compare again under the entry's lock and swap only if
            // unchanged (§7.2.8); in one simulated thread the two reads coincide.
            let (_, seen) = self.map_lookup(lpid, now);
            let b = self.media.block_of_ppa(new) as usize;
            self.prov.blocks[b].inflight -= 1;
            if seen.ppa() == prior {
                // A newer version waiting in the write-back cache keeps its flag.
                let entry = crate::tables::MapEntry::new(new).with_cached(seen.cached());
                self.map.set(lpid, entry);
                self.set_live(prior, false);
                self.set_live(new, true);
                moves.push(GcMove { lpid, prior, new });
            } else {
                self.stats.gc_copies_lost += 1;
            }
        }
        let cost = self.cfg.costs.log_record_cpu_ns
            + self.cfg.costs.map_update_ns * pass.copies.len() as u64;
        let t = self.cpu(now, cost);
        let lsn = self.log_append(
            LogRecord::Gc {
                victim: pass.victim,
                erase_count: self.wear.get(pass.victim) + 1,
                moves,
            },
            t,
        );
        self.wait_log(
            lsn,
            Waiter::EraseAfter {
                block: pass.victim,
                gc_channel: Some(ch),
            },
        );
    }

    /// Erases (or retires) an EBLOCK whose erase record is durable.
    pub(crate) fn on_erase(&mut self, block: u32, gc_channel: Option<u32>) {
        let now = self.now_ns;
        self.pending_erases.remove(&block);
        if let Some(ch) = gc_channel {
            if let Some(pass) = self.gc.remove(&ch) {
                self.stats.gc_victims += 1;
                self.stats.gc_reclaimed_bytes +=
                    pass.reclaim_rblocks as u64 * self.cfg.terms.rblock_bytes as u64;
                let _ = pass.seq;
            }
        }
        if self.gbitv.valid(block) != 0 {
            // A live page appeared in the victim: never erase live data.
            self.fatal = Some(crate::OxError::Recovery(format!(
                "EBLOCK {block} still holds {} live RBLOCKs at erase",
                self.gbitv.valid(block)
            )));
            return;
        }
        if self.prov.blocks[block as usize].retire {
            self.retire_block(block);
        } else {
            match self.media.erase(block, now) {
                Ok(_) => {
                    self.space_checkpoint_tried = false;
                    self.wear.set(block, self.media.erase_count(block));
                    self.gbitv.clear_block(block);
                    self.prov.add_free(&self.media, block);
                }
                Err(_) => {
                    self.wear.set(block, self.media.erase_count(block));
                    self.retire_block(block);
                }
            }
        }
        match gc_channel {
            Some(ch) if self.prov.used_fraction(ch) > self.cfg.gc.stop_used_fraction => {
                self.events.push(now, Event::GcCheck(ch));
                self.retry_stalled();
            }
            Some(ch) => {
                self.end_gc_turn(ch);
                self.retry_stalled();
                // Below the stop threshold but still at the reserve that closes the channel
                // to user writes, with writes waiting: the turn goes on. Nothing else would
                // start it again (a waiting context asks for GC only when it first stalls),
                // and with `start_used_fraction` above the channel's use the writes waited
                // for ever.
                if self.anything_stalled() && self.gc_wanted(ch) {
                    self.events.push(now, Event::GcCheck(ch));
                }
            }
            None => self.redrive_stalled(),
        }
        self.fail_stalled_if_hopeless();
    }

    /// Reclaims a log or table EBLOCK after a checkpoint: an erase record first (so that
    /// WEAR stays exact across a crash), then the erase.
    pub(crate) fn reclaim_meta_block(&mut self, block: u32, ready_ns: TimeNs) {
        self.prov.blocks[block as usize].stream = None;
        let t = self.cpu(ready_ns, self.cfg.costs.log_record_cpu_ns);
        let erase_count = self.wear.get(block) + 1;
        let lsn = self.log_append(LogRecord::Erase { block, erase_count }, t);
        self.wait_log(
            lsn,
            Waiter::EraseAfter {
                block,
                gc_channel: None,
            },
        );
    }
}
