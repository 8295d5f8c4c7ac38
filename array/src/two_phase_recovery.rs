//! Rebuilding the two-phase engine's map from the members alone, by a scan of the OOB tag
//! every chunk slot carries (the engine's tag format is in `two_phase.rs`), after an orderly
//! stop as after a crash. Modelled on ScalaAFA's recovery (`scalaafa/recovery.rs`).
//!
//! The rules, in the order the scan applies them:
//!
//! 1. A slot whose tag is all zeroes is free. A tag that names no replica, data or parity
//!    chunk of this volume (an unknown kind, a chunk past the volume, an index past the
//!    code) is stale and the slot is trimmed. When the data is verified, a slot whose data
//!    does not match the checksum in its tag is stale too: a host crash can keep a member
//!    file's tag sidecar but not its data (the page cache writes them in any order), and the
//!    copies that copy replaced are still there, because released slots are trimmed only
//!    after the next flush.
//! 2. A stripe is converted when its conversion sequence names exactly k data slots (one per
//!    index) and m parity slots (one per row) on k + m different members, and each parity
//!    slot's chunk field is the parity of the data slots' chunk fields (ScalaAFA's rule:
//!    the parity's tags are the parity of the data's tags). Conversion writes the whole
//!    stripe before it releases any replica, and a slot's tags are written after its data,
//!    so a stripe cut short by a crash fails this test and is dropped: the replicas it was
//!    made from are still on the members.
//! 3. Replicas and converted stripes' data slots compete for each user chunk: the highest
//!    sequence wins (replica writes and conversions draw from one counter, so no two copies
//!    of different writes share one). A chunk's new replicas are written before its old
//!    copies are released, so the newest whole write is always found.
//! 4. Everything that lost is trimmed, so a later recovery cannot mistake it for data; a
//!    converted stripe none of whose chunks won is freed. Winning replica sets that a crash
//!    left with fewer than m + 1 copies are replicated again; the other replicas are queued
//!    for conversion again, oldest first, as they were.
//!
//! With members lost ([`TwoPhase::recover_degraded`], up to m with
//! [`TwoPhase::recover_with`]), nothing is read from them. Every stripe has one slot on each
//! member (k + m = n), so a whole stripe shows one slot on every other member; the data slots'
//! chunk fields on the lost members are decoded from the parity fields (the parity check then
//! covers only the rows left over). A replica set found as many copies short as it has lost
//! members among the others had those copies there; one shorter still is replicated again.
//! The lost members' slots these name are given free slot numbers there (a stripe's missing
//! slots go to its lost members in order: which held which does not matter, as neither serves
//! and a rebuild regenerates each from the others).
//!
//! A trim is not recorded, so a chunk trimmed whole may come back after a crash with the
//! data it held (NBD allows a trimmed block to read back anything). Sequence numbers are 32
//! bits in the tags: a volume recovers correctly until 2^32 chunk writes and conversions
//! have been made over its life.

use std::collections::BTreeMap;

use super::*;

/// What the last recovery found on the members.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TwoPhaseRecovery {
    /// Chunk slots whose OOB tag was read.
    pub tag_reads: u64,
    /// User chunks found in replicas, and queued for conversion again.
    pub replicated_chunks: u64,
    /// User chunks found in converted stripes.
    pub striped_chunks: u64,
    /// Converted stripes kept (with at least one live chunk).
    pub stripes: u64,
    /// Stripes a crash cut short (dropped; their replicas were kept).
    pub incomplete_stripes: u64,
    /// Slots trimmed because a newer copy won, or their tags named nothing.
    pub stale_slots: u64,
    /// Replica sets a crash left short of copies, written again.
    pub rereplicated_chunks: u64,
    /// Copies whose data did not match the checksum in their tags (a host crash kept the
    /// tags but not the data), dropped; counted only when the data was verified.
    pub torn_copies: u64,
}

/// The copies of one replica set found on the members: (copy number, slot).
type Copies = Vec<(u8, Slot)>;

/// One slot of a stripe, as its tag names it.
#[derive(Debug, Clone, Copy)]
struct Piece {
    kind: u8,
    index: u8,
    field: u32,
    slot: Slot,
}

impl<D: BlockDevice> TwoPhase<D> {
    /// Rebuilds a volume from members an engine left behind (none failed), from their OOB
    /// tags alone. Needs members that keep [`TWO_PHASE_TAG_BYTES`] of tag per sector and
    /// bytes (payload `token` or `full`).
    /// Every copy's data is checked against the checksum in its tags.
    pub fn recover(
        config: ArrayConfig,
        two_phase: TwoPhaseConfig,
        members: Vec<D>,
        spares: Vec<D>,
    ) -> Result<Self, ArrayError> {
        Self::recover_with(config, two_phase, members, spares, &[], true)
    }

    /// Recovers a volume whose member `failed` is lost (its device may be anything of the
    /// right size: nothing is read from it), then puts the first spare, if any, in its place
    /// and rebuilds it; without a spare the volume serves degraded.
    pub fn recover_degraded(
        config: ArrayConfig,
        two_phase: TwoPhaseConfig,
        members: Vec<D>,
        spares: Vec<D>,
        failed: usize,
    ) -> Result<Self, ArrayError> {
        Self::recover_with(config, two_phase, members, spares, &[failed], true)
    }

    /// [`recover`](Self::recover) or, with members `failed` (up to m; the spares replace
    /// them in the order given), [`recover_degraded`](Self::recover_degraded).
    /// `verify_data` reads every tagged copy and drops those whose data does not match the
    /// checksum in their tags, which only a crash of the host (not of the process) can
    /// leave: after an orderly stop, which synced everything, it may be skipped.
    pub fn recover_with(
        config: ArrayConfig,
        two_phase: TwoPhaseConfig,
        members: Vec<D>,
        spares: Vec<D>,
        failed: &[usize],
        verify_data: bool,
    ) -> Result<Self, ArrayError> {
        let mut v = Self::new(config, two_phase, members, spares)?;
        crate::check_lost_members(failed, v.members.len(), v.m)?;
        v.make_recoverable()?;
        // The lost members take no writes while the map is rebuilt.
        for &f in failed {
            v.members[f].state = MemberState::Failed;
        }
        let report = v
            .rebuild_map(failed, verify_data)
            .map_err(|e| ArrayError::Config(format!("two-phase recovery failed: {e}")))?;
        v.recovery = Some(report);
        for &f in failed {
            if !v.spares.is_empty() {
                v.members[f].device = v.spares.remove(0);
                v.members[f].state = MemberState::Rebuilding {
                    upto: 0,
                    next_due_ns: 0,
                    started_ns: 0,
                };
            }
        }
        Ok(v)
    }

    /// What the recovery that built this volume found, if it was recovered.
    pub fn recovery(&self) -> Option<&TwoPhaseRecovery> {
        self.recovery.as_ref()
    }

    fn rebuild_map(
        &mut self,
        failed: &[usize],
        verify_data: bool,
    ) -> Result<TwoPhaseRecovery, DeviceError> {
        let (k, m) = (self.k, self.m);
        let volume_chunks = self.map.len() as u64;
        let mut report = TwoPhaseRecovery::default();
        // Replica copies by (user chunk, sequence), with their copy numbers.
        let mut replicas: BTreeMap<(u32, u32), Copies> = BTreeMap::new();
        // Stripe slots by conversion sequence.
        let mut stripes: BTreeMap<u32, Vec<Piece>> = BTreeMap::new();
        let mut stale: Vec<Slot> = Vec::new();
        let mut newest_seq: u32 = 0;
        for member in 0..self.members.len() {
            if failed.contains(&member) {
                continue;
            }
            for slot in 0..self.slots_per_member {
                let s = Slot { member, slot };
                let tag = self.members[member]
                    .device
                    .scan_tags(self.slot_lba(s, 0), 1)
                    .ok_or_else(|| DeviceError::Unsupported("scan_tags".into()))?;
                report.tag_reads += 1;
                if tag.len() < TWO_PHASE_TAG_BYTES {
                    return Err(DeviceError::Unsupported(format!(
                        "member {member} returned {} tag bytes per sector, fewer than {TWO_PHASE_TAG_BYTES}",
                        tag.len()
                    )));
                }
                if tag.iter().all(|&b| b == 0) {
                    continue;
                }
                let (kind, index) = (tag[0], tag[1]);
                let field = u32::from_le_bytes([tag[2], tag[3], tag[4], tag[5]]);
                let seq = u32::from_le_bytes([tag[6], tag[7], tag[8], tag[9]]);
                let sum = u32::from_le_bytes([tag[10], tag[11], tag[12], tag[13]]);
                let chunk_ok = (field as u64) < volume_chunks;
                if matches!(kind, KIND_REPLICA | KIND_DATA | KIND_PARITY) {
                    newest_seq = newest_seq.max(seq);
                }
                if verify_data && !self.slot_matches(s, sum)? {
                    // Rule 1: tags without their data are stale.
                    report.torn_copies += 1;
                    stale.push(s);
                    continue;
                }
                match kind {
                    KIND_REPLICA if chunk_ok && (index as usize) <= m => {
                        replicas.entry((field, seq)).or_default().push((index, s));
                    }
                    KIND_DATA if chunk_ok && (index as usize) < k => {
                        stripes.entry(seq).or_default().push(Piece {
                            kind,
                            index,
                            field,
                            slot: s,
                        });
                    }
                    KIND_PARITY if (index as usize) < m => {
                        stripes.entry(seq).or_default().push(Piece {
                            kind,
                            index,
                            field,
                            slot: s,
                        });
                    }
                    _ => stale.push(s),
                }
            }
        }
        // Rule 2: which stripes were converted whole. Their slots in stripe order (data by
        // index, then parity by row) and the data slots' chunk fields.
        let mut converted: BTreeMap<u32, (Vec<Option<Slot>>, Vec<u32>)> = BTreeMap::new();
        for (&seq, pieces) in &stripes {
            match self.whole_stripe(pieces, failed)? {
                Some(stripe) => {
                    converted.insert(seq, stripe);
                }
                None => {
                    report.incomplete_stripes += 1;
                    stale.extend(pieces.iter().map(|p| p.slot));
                }
            }
        }
        // Rule 3: the newest copy of each user chunk, as (sequence, where).
        #[derive(Clone, Copy)]
        enum Winner {
            Replica,
            Striped(u8),
        }
        let mut newest: BTreeMap<u32, (u32, Winner)> = BTreeMap::new();
        let mut offer = |chunk: u32, seq: u32, w: Winner| {
            let e = newest.entry(chunk).or_insert((seq, w));
            if seq > e.0 {
                *e = (seq, w);
            }
        };
        for &(chunk, seq) in replicas.keys() {
            offer(chunk, seq, Winner::Replica);
        }
        for (&seq, (_, fields)) in &converted {
            for (j, &chunk) in fields.iter().enumerate() {
                offer(chunk, seq, Winner::Striped(j as u8));
            }
        }
        let wins = |chunk: u32, seq: u32, striped_at: Option<u8>| {
            newest.get(&chunk).is_some_and(|&(s, w)| {
                s == seq
                    && match (w, striped_at) {
                        (Winner::Replica, None) => true,
                        (Winner::Striped(j), Some(i)) => j == i,
                        _ => false,
                    }
            })
        };
        // Slots of the lost members that the tables name get free slot numbers there, in
        // turn.
        let mut next_lost_slot = vec![0u32; self.members.len()];
        let mut lost_slot = |member: usize| -> Result<Slot, DeviceError> {
            let slot = next_lost_slot[member];
            if slot >= self.slots_per_member {
                return Err(DeviceError::Unsupported(format!(
                    "member {member} would need more than its {} slots",
                    self.slots_per_member
                )));
            }
            next_lost_slot[member] += 1;
            Ok(Slot { member, slot })
        };
        // Rule 4: the tables, from the winners.
        for (&seq, (found, fields)) in &converted {
            let chunks: Vec<u64> = fields
                .iter()
                .enumerate()
                .map(|(j, &c)| {
                    if wins(c, seq, Some(j as u8)) {
                        c as u64
                    } else {
                        DEAD
                    }
                })
                .collect();
            let live = chunks.iter().filter(|&&c| c != DEAD).count();
            if live == 0 {
                stale.extend(found.iter().flatten().copied());
                continue;
            }
            // A whole stripe misses one slot per lost member (`whole_stripe`).
            let mut lost = failed.iter().copied();
            let mut slots = Vec::with_capacity(found.len());
            for s in found {
                slots.push(match s {
                    Some(s) => *s,
                    None => lost_slot(lost.next().ok_or(DeviceError::Failed)?)?,
                });
            }
            let sid = self.stripes.len() as u32;
            for &s in &slots {
                self.members[s.member].owner[s.slot as usize] = STRIPE_BIT | sid;
            }
            for (index, &c) in chunks.iter().enumerate() {
                if c != DEAD {
                    self.map[c as usize] = Loc::Striped {
                        stripe: sid,
                        index: index as u8,
                    };
                }
            }
            self.stripes.push(StripeRec {
                slots,
                chunks,
                tagged_chunks: fields.iter().map(|&c| c as u64).collect(),
                seq: seq as u64,
                live: live as u32,
            });
            self.by_live[live].insert(sid);
            report.stripes += 1;
            report.striped_chunks += live as u64;
        }
        // Replica sets by sequence, oldest first: the conversion queue's order.
        let mut sets: Vec<(u32, u32, Copies)> = replicas
            .into_iter()
            .map(|((chunk, seq), copies)| (seq, chunk, copies))
            .collect();
        sets.sort_by_key(|&(seq, chunk, _)| (seq, chunk));
        let mut short = Vec::new();
        for (seq, chunk, mut copies) in sets {
            if !wins(chunk, seq, None) {
                stale.extend(copies.iter().map(|&(_, s)| s));
                continue;
            }
            copies.sort_by_key(|&(index, s)| (index, s.member, s.slot));
            // Two copies on one member would not survive that member's failure apart: one
            // is kept, the other is stale.
            let mut slots: Vec<Slot> = Vec::with_capacity(copies.len());
            for (_, s) in copies {
                if slots.iter().any(|kept| kept.member == s.member) {
                    stale.push(s);
                } else {
                    slots.push(s);
                }
            }
            // A set as many copies short as it has lost members among the others had those
            // copies there; a set shorter still was cut short and is written again.
            let elsewhere: Vec<usize> = failed
                .iter()
                .copied()
                .filter(|&f| !slots.iter().any(|s| s.member == f))
                .collect();
            if !elsewhere.is_empty() && slots.len() + elsewhere.len() == m + 1 {
                for f in elsewhere {
                    slots.push(lost_slot(f)?);
                }
            }
            let id = self.rsets.len() as u32;
            for &s in &slots {
                self.members[s.member].owner[s.slot as usize] = id;
            }
            if slots.len() < m + 1 {
                short.push(chunk as u64);
            }
            self.rsets.push(ReplicaSet {
                slots,
                chunk: chunk as u64,
                seq: seq as u64,
            });
            self.map[chunk as usize] = Loc::Replica(id);
            self.queue.push_back((id, seq as u64));
            self.stats.replicated_chunks += 1;
            report.replicated_chunks += 1;
        }
        // Free lists: every slot nothing owns, low slots handed out first.
        for mem in &mut self.members {
            mem.free = (0..self.slots_per_member)
                .rev()
                .filter(|&s| mem.owner[s as usize] == FREE)
                .collect();
        }
        self.next_seq = newest_seq as u64;
        stale.sort_by_key(|s| (s.member, s.slot));
        stale.dedup();
        for s in stale {
            if self.members[s.member].owner[s.slot as usize] != FREE {
                continue;
            }
            self.count_command(0);
            let lba = self.slot_lba(s, 0);
            self.members[s.member].device.submit(
                0,
                &Command::trim(lba, self.chunk_sectors),
                ReadBuffers::none(),
            )?;
            report.stale_slots += 1;
        }
        // Replica sets a crash left short of copies are written again whole.
        let cu = self.chunk_bytes_units();
        for chunk in short {
            let mut buf = vec![0u8; cu];
            self.read_chunk(chunk, 0, self.chunk_sectors, 0, &mut buf)?;
            let old = self.map[chunk as usize];
            self.replicate(chunk, &buf, 0)?;
            self.release_loc(old, 0)?;
            report.rereplicated_chunks += 1;
        }
        Ok(report)
    }

    /// Whether the data in slot `s` has checksum `sum` (module doc).
    fn slot_matches(&mut self, s: Slot, sum: u32) -> Result<bool, DeviceError> {
        let mut buf = vec![0u8; self.chunk_bytes_units()];
        self.member_read(s, 0, self.chunk_sectors, 0, &mut buf)?;
        Ok(data_sum(&buf) == sum)
    }

    /// The slots (stripe order; None for those on the lost members) and data chunk fields
    /// of a stripe whose tags show it was written whole (rule 2 of the module doc), or None.
    #[allow(clippy::type_complexity)]
    fn whole_stripe(
        &self,
        pieces: &[Piece],
        failed: &[usize],
    ) -> Result<Option<(Vec<Option<Slot>>, Vec<u32>)>, DeviceError> {
        let (k, m) = (self.k, self.m);
        let expected = k + m - failed.len();
        if pieces.len() != expected {
            return Ok(None);
        }
        let mut slots: Vec<Option<Slot>> = vec![None; k + m];
        let mut fields = vec![0u32; k + m];
        for p in pieces {
            let at = if p.kind == KIND_DATA {
                p.index as usize
            } else {
                k + p.index as usize
            };
            if slots[at].is_some() {
                return Ok(None);
            }
            slots[at] = Some(p.slot);
            fields[at] = p.field;
        }
        let mut members: Vec<usize> = slots.iter().flatten().map(|s| s.member).collect();
        members.sort_unstable();
        members.dedup();
        if members.len() != expected || members.iter().any(|m| failed.contains(m)) {
            return Ok(None);
        }
        let missing: Vec<usize> = (0..k + m).filter(|&i| slots[i].is_none()).collect();
        let mut shards: Vec<[u8; 4]> = fields.iter().map(|f| f.to_le_bytes()).collect();
        if !missing.is_empty() {
            // The lost members' fields are decoded from the others (module doc).
            let present: Vec<bool> = (0..k + m).map(|i| !missing.contains(&i)).collect();
            let mut refs: Vec<&mut [u8]> = shards.iter_mut().map(|s| s.as_mut_slice()).collect();
            self.codec
                .reconstruct(&mut refs, &present)
                .map_err(|_| DeviceError::Failed)?;
            for &lost in &missing {
                fields[lost] = u32::from_le_bytes(shards[lost]);
                if lost < k && fields[lost] as usize >= self.map.len() {
                    return Ok(None);
                }
            }
        }
        let refs: Vec<&[u8]> = shards[..k].iter().map(|d| d.as_slice()).collect();
        for r in (0..m).filter(|&r| !missing.contains(&(k + r))) {
            let mut want = [0u8; 4];
            self.codec
                .encode_row(r, &refs, &mut want)
                .map_err(|_| DeviceError::Failed)?;
            if u32::from_le_bytes(want) != fields[k + r] {
                return Ok(None);
            }
        }
        Ok(Some((slots, fields[..k].to_vec())))
    }
}

#[cfg(test)]
mod tests {
    use afa_nand::PayloadMode;
    use afa_sim::SimRng;
    use afa_ssd::Ssd;
    use proptest::prelude::*;

    use super::*;
    use crate::tests::{two_phase_config as config, Harness, PageCache, PowerCut};

    /// The engine tests' SSD with 4 KiB sectors, so each sector's OOB share (16 bytes) holds
    /// the engine's tag, keeping tokens.
    fn ssd(seed: u64) -> Ssd {
        let mut cfg = crate::tests::ssd_config();
        cfg.geometry.sector_bytes = 4096;
        cfg.geometry.oob_bytes_per_page = 24;
        cfg.payload = PayloadMode::Token;
        Ssd::new(cfg, seed).unwrap()
    }

    /// A recoverable volume written full and then overwritten a sector at a time flushes its
    /// members once per several writes: its released slots come back only through a member
    /// flush, so once short it makes room up to a headroom above the reserve. Stopping at
    /// the reserve flushed every member for about every write (a file member's `fdatasync`
    /// each time in serve mode, tools/serve_soak.py seed 20221).
    #[test]
    fn a_full_recoverable_volume_under_small_overwrites_flushes_once_per_several_writes() {
        let members = (0..6).map(|i| crate::tests::Watched::new(ssd(i))).collect();
        let mut volume = TwoPhase::new(
            config(Level::Raid6, 6),
            TwoPhaseConfig::default(),
            members,
            vec![],
        )
        .unwrap();
        volume.make_recoverable().unwrap();
        let mut h = Harness::new(volume);
        let capacity_sectors = h.volume.info().capacity_sectors;
        for lba in (0..capacity_sectors).step_by(2) {
            h.write(lba, 2).unwrap();
        }
        let flushed = |h: &Harness<TwoPhase<crate::tests::Watched>>| {
            h.volume.members().map(|m| m.flushes).max().unwrap_or(0)
        };
        let after_fill = flushed(&h);
        let mut rng = SimRng::new(5);
        let writes = 1500;
        for _ in 0..writes {
            h.write(rng.below(capacity_sectors), 1).unwrap();
        }
        let flushes = flushed(&h) - after_fill;
        assert!(
            flushes * 4 <= writes,
            "{flushes} member flushes for {writes} one-sector writes"
        );
        h.check_all();
    }

    /// Random writes (some partial chunks, some spanning chunks) and checked reads until
    /// `ops` are done or a write fails at the power cut; returns the torn write.
    fn run_until_cut<D: BlockDevice>(
        h: &mut Harness<TwoPhase<D>>,
        rng: &mut SimRng,
        ops: usize,
    ) -> Option<(u64, u32, u64)> {
        let cap = h.tokens.len() as u64;
        for _ in 0..ops {
            let len = 1 + rng.below(6) as u32;
            let lba = rng.below(cap - len as u64);
            if rng.below(5) == 0 {
                h.read_check(lba, len);
            } else if h.write(lba, len).is_err() {
                return Some((lba, len, h.version));
            }
        }
        None
    }

    /// Power lost after `budget` medium-changing member commands (anywhere: inside a
    /// replication, a conversion or a cleaning). Returns what recovery found.
    fn crash_and_recover(level: Level, n: u32, seed: u64, budget: u64) -> TwoPhaseRecovery {
        crash_and_recover_losing(level, n, seed, budget, &[], false)
    }

    /// As [`crash_and_recover`]; the members `lost` have their devices replaced by blank ones
    /// recovery must not need, and with `spare` as many spares are rebuilt in their places
    /// to the end, after which nothing is lost either.
    fn crash_and_recover_losing(
        level: Level,
        n: u32,
        seed: u64,
        budget: u64,
        lost: &[usize],
        spare: bool,
    ) -> TwoPhaseRecovery {
        let devs = PowerCut::members((0..n as u64).map(ssd).collect(), budget);
        let mut volume =
            TwoPhase::new(config(level, n), TwoPhaseConfig::default(), devs, vec![]).unwrap();
        volume.make_recoverable().unwrap();
        let mut h = Harness::new(volume);
        let mut rng = SimRng::new(seed);
        let torn = run_until_cut(&mut h, &mut rng, 20_000);
        let Harness {
            volume,
            tokens,
            now_ns,
            ..
        } = h;
        let mut members: Vec<Ssd> = volume.into_members().into_iter().map(|d| d.inner).collect();
        let recovered = if lost.is_empty() {
            TwoPhase::recover(config(level, n), TwoPhaseConfig::default(), members, vec![])
        } else {
            // Anything read from a lost member's slot would be wrong.
            for (i, &f) in lost.iter().enumerate() {
                members[f] = ssd(500 + i as u64 + seed % 100);
            }
            let spares = if spare {
                (0..lost.len() as u64).map(|i| ssd(900 + i)).collect()
            } else {
                vec![]
            };
            let (config, tp) = (config(level, n), TwoPhaseConfig::default());
            TwoPhase::recover_with(config, tp, members, spares, lost, true)
        }
        .expect("recovery");
        let report = *recovered
            .recovery()
            .expect("a recovered volume has a report");
        recovered.check_slot_accounting();
        let mut h = Harness::new(recovered);
        h.tokens = tokens;
        h.now_ns = now_ns;
        h.version = 1 << 40;
        h.check_after_crash(torn);
        h.volume.check_slot_accounting();
        // The recovered volume keeps working: conversion, cleaning and the oracle again.
        h.random_ops(&mut rng, 600);
        h.check_all();
        if spare && !lost.is_empty() {
            for _ in 0..400 {
                if !h.volume.rebuilding() {
                    break;
                }
                h.now_ns += 1_000_000_000;
                h.volume.background(h.now_ns);
            }
            assert!(!h.volume.rebuilding(), "the rebuild did not finish");
            h.check_all();
            h.random_ops(&mut rng, 200);
            h.check_all();
        }
        h.volume.check_slot_accounting();
        report
    }

    /// While two spares are rebuilt no replica goes to them, so afterwards the oldest
    /// replicas all sit on the other four members. Converting those in order took a slot
    /// of each spare per stripe and gave none back, until no stripe fit and a write failed
    /// with no space (found by `recovery_with_two_lost_members_at_random_points`).
    #[test]
    fn conversions_after_a_rebuild_do_not_drain_the_rebuilt_members() {
        let seed = 18181573284193185091;
        let first = (seed % 6) as usize;
        let lost = [first, (first + 5) % 6];
        crash_and_recover_losing(Level::Raid6, 6, seed, 2585, &lost, true);
    }

    #[test]
    fn recovery_with_a_lost_member_keeps_every_acknowledged_write() {
        let mut rng = SimRng::new(11);
        let mut total = TwoPhaseRecovery::default();
        for (level, n) in [(Level::Raid5, 4), (Level::Raid6, 6), (Level::Raid5, 3)] {
            for i in 0..8 {
                let budget = rng.below(2500);
                let lost = [rng.below(n as u64) as usize];
                let r =
                    crash_and_recover_losing(level, n, rng.next_u64(), budget, &lost, i % 2 == 1);
                total.replicated_chunks += r.replicated_chunks;
                total.stripes += r.stripes;
            }
        }
        assert!(total.replicated_chunks > 0, "{total:?}");
        assert!(total.stripes > 0, "{total:?}");
    }

    /// Every pair of a 4+2 volume's members lost with the power at a few cuts, then (with
    /// spares) both rebuilt at once; and more lost members than parity rows are refused.
    #[test]
    fn recovery_with_two_lost_members_keeps_every_acknowledged_write() {
        let mut total = TwoPhaseRecovery::default();
        for budget in [0, 40, 700, 1500, 2400, 3900] {
            for a in 0..6 {
                for b in a + 1..6 {
                    let spare = (a + b) % 2 == 0;
                    let r = crash_and_recover_losing(
                        Level::Raid6,
                        6,
                        budget + 5,
                        budget,
                        &[a, b],
                        spare,
                    );
                    total.replicated_chunks += r.replicated_chunks;
                    total.stripes += r.stripes;
                }
            }
        }
        assert!(total.replicated_chunks > 0, "{total:?}");
        assert!(total.stripes > 0, "{total:?}");
        let members = (0..4).map(ssd).collect();
        let err = TwoPhase::recover_with(
            config(Level::Raid5, 4),
            TwoPhaseConfig::default(),
            members,
            vec![],
            &[0, 1],
            true,
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("tolerates 1 failed members"),
            "{err}"
        );
    }

    #[test]
    fn recovery_after_power_loss_at_random_commands_keeps_every_acknowledged_write() {
        let mut rng = SimRng::new(7);
        let mut total = TwoPhaseRecovery::default();
        for (level, n) in [(Level::Raid5, 4), (Level::Raid6, 6), (Level::Raid5, 3)] {
            for _ in 0..12 {
                let budget = rng.below(2500);
                let r = crash_and_recover(level, n, rng.next_u64(), budget);
                total.replicated_chunks += r.replicated_chunks;
                total.stripes += r.stripes;
                total.incomplete_stripes += r.incomplete_stripes;
                total.stale_slots += r.stale_slots;
                total.rereplicated_chunks += r.rereplicated_chunks;
            }
        }
        // The loop reached every case the recovery tells apart.
        assert!(total.replicated_chunks > 0, "{total:?}");
        assert!(total.stripes > 0, "{total:?}");
        assert!(total.incomplete_stripes > 0, "{total:?}");
        assert!(total.stale_slots > 0, "{total:?}");
        assert!(total.rereplicated_chunks > 0, "{total:?}");
    }

    /// A stop between requests, after a flush: replicated and converted chunks are both found
    /// where they were, nothing is stale, and conversion goes on from the replicas.
    #[test]
    fn recovery_finds_replicated_and_converted_stripes() {
        for (level, n) in [(Level::Raid5, 5), (Level::Raid6, 6)] {
            let devs = (0..n as u64).map(ssd).collect();
            let mut volume =
                TwoPhase::new(config(level, n), TwoPhaseConfig::default(), devs, vec![]).unwrap();
            volume.make_recoverable().unwrap();
            let mut h = Harness::new(volume);
            let cs = h.volume.chunk_sectors() as u64;
            let watermark = h.volume.watermark_chunks();
            for c in 0..watermark * 3 {
                h.write(c * cs, cs as u32).unwrap();
            }
            let before = *h.volume.stats();
            assert!(before.stripes_converted > 0, "{before:?}");
            // An orderly stop flushes, which trims the copies held back since the last flush.
            h.volume
                .submit(h.now_ns, &Command::flush(), ReadBuffers::none())
                .unwrap();
            let Harness {
                volume,
                tokens,
                now_ns,
                ..
            } = h;
            let members = volume.into_members();
            let v = TwoPhase::recover(config(level, n), TwoPhaseConfig::default(), members, vec![])
                .unwrap();
            let r = *v.recovery().unwrap();
            assert_eq!(r.replicated_chunks, before.replicated_chunks, "{r:?}");
            assert_eq!(r.stripes, before.stripes_converted, "{r:?}");
            assert_eq!(
                r.striped_chunks + r.replicated_chunks,
                watermark * 3,
                "{r:?}"
            );
            assert_eq!((r.stale_slots, r.incomplete_stripes), (0, 0), "{r:?}");
            let mut h = Harness::new(v);
            h.tokens = tokens;
            h.now_ns = now_ns;
            h.check_all();
            for c in 0..watermark * 2 {
                h.write(c * cs, cs as u32).unwrap();
            }
            assert!(h.volume.stats().stripes_converted > 0);
            h.check_all();
        }
    }

    /// The copies a rewrite supersedes keep their data and tags, and their slots are not
    /// handed out, until a flush has made the rewrite durable; the flush then trims them.
    #[test]
    fn superseded_copies_are_held_until_a_flush() {
        let devs = (0..4).map(ssd).collect();
        let mut volume = TwoPhase::new(
            config(Level::Raid5, 4),
            TwoPhaseConfig::default(),
            devs,
            vec![],
        )
        .unwrap();
        volume.make_recoverable().unwrap();
        let mut h = Harness::new(volume);
        let cs = h.volume.chunk_sectors();
        h.write(0, cs).unwrap();
        let Loc::Replica(id) = h.volume.map[0] else {
            panic!("chunk 0 is replicated")
        };
        let old = h.volume.rsets[id as usize].slots.clone();
        h.write(0, cs).unwrap();
        let tagged = |v: &TwoPhase<Ssd>, s: Slot| {
            let lba = v.slot_lba(s, 0);
            let tag = v.members[s.member].device.scan_tags(lba, 1).unwrap();
            tag.iter().any(|&b| b != 0)
        };
        let free = |v: &TwoPhase<Ssd>, s: Slot| v.members[s.member].free.contains(&s.slot);
        for &s in &old {
            assert!(tagged(&h.volume, s) && !free(&h.volume, s), "{s:?}");
        }
        h.volume
            .submit(h.now_ns, &Command::flush(), ReadBuffers::none())
            .unwrap();
        for &s in &old {
            assert!(!tagged(&h.volume, s) && free(&h.volume, s), "{s:?}");
        }
        h.check_all();
    }

    #[test]
    fn recovery_refuses_members_that_keep_no_tags() {
        // 512-byte sectors on 4 KiB pages leave 7 tag bytes per sector: too few.
        let devs = (0..4).map(crate::tests::ssd).collect();
        let err = TwoPhase::recover(
            config(Level::Raid5, 4),
            TwoPhaseConfig::default(),
            devs,
            vec![],
        )
        .unwrap_err();
        assert!(err.to_string().contains("OOB tag"), "{err}");
    }

    /// `before` random writes, a FLUSH, `after` more (acknowledged, not flushed), then a host
    /// crash. Every sector must read back as flushed or as one of the writes after the flush
    /// (never older), and the volume must keep working. Returns what recovery found. With
    /// `lost` = Some((member, when)), that member fails after `when` writes of the `after`
    /// (a dirty degraded volume at the crash). With `fua_one_in` > 0, one write in that many
    /// after the flush asks for force unit access, and must then survive the crash too.
    fn host_crash_and_recover(
        level: Level,
        n: u32,
        seed: u64,
        before: usize,
        after: usize,
        lost: Option<(usize, usize)>,
        fua_one_in: u64,
    ) -> TwoPhaseRecovery {
        let devs = (0..n as u64).map(|i| PageCache::new(ssd(i))).collect();
        let mut volume =
            TwoPhase::new(config(level, n), TwoPhaseConfig::default(), devs, vec![]).unwrap();
        volume.make_recoverable().unwrap();
        let mut h = Harness::new(volume);
        let mut rng = SimRng::new(seed);
        assert!(run_until_cut(&mut h, &mut rng, before).is_none());
        h.volume
            .submit(h.now_ns, &Command::flush(), ReadBuffers::none())
            .unwrap();
        let mut flushed = h.tokens.clone();
        let mut since: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        let cap = h.tokens.len() as u64;
        for i in 0..after {
            if let Some((member, _)) = lost.filter(|&(_, when)| when == i) {
                h.volume.fail_member(member, h.now_ns).unwrap();
            }
            let len = 1 + rng.below(6) as u32;
            let lba = rng.below(cap - len as u64);
            if fua_one_in > 0 && rng.below(fua_one_in) == 0 {
                h.write_fua_noting(lba, len, &mut flushed, &mut since)
                    .unwrap();
            } else {
                h.write_noting(lba, len, &mut since).unwrap();
            }
        }
        let Harness {
            volume,
            tokens,
            now_ns,
            ..
        } = h;
        let members = volume
            .into_members()
            .into_iter()
            .map(|d| d.crash(&mut rng))
            .collect();
        let failed: Vec<usize> = lost.map(|(member, _)| member).into_iter().collect();
        let (config, tp) = (config(level, n), TwoPhaseConfig::default());
        let recovered =
            TwoPhase::recover_with(config, tp, members, vec![], &failed, true).expect("recovery");
        let report = *recovered.recovery().unwrap();
        let mut h = Harness::new(recovered);
        h.now_ns = now_ns;
        h.version = 1 << 40;
        h.tokens = tokens;
        h.adopt_flushed_or_later(&flushed, &since);
        h.random_ops(&mut rng, 400);
        h.check_all();
        report
    }

    #[test]
    fn a_host_crash_keeps_every_flushed_write() {
        let mut rng = SimRng::new(21);
        let mut total = TwoPhaseRecovery::default();
        for (level, n) in [(Level::Raid5, 4), (Level::Raid6, 6), (Level::Raid5, 3)] {
            for _ in 0..8 {
                let before = rng.below(1500) as usize;
                let after = 1 + rng.below(300) as usize;
                let r = host_crash_and_recover(level, n, rng.next_u64(), before, after, None, 0);
                total.torn_copies += r.torn_copies;
                total.stripes += r.stripes;
                total.incomplete_stripes += r.incomplete_stripes;
            }
        }
        // The crashes tore copies, and conversions, for recovery to drop.
        assert!(total.torn_copies > 0, "{total:?}");
        assert!(total.stripes > 0, "{total:?}");
        assert!(total.incomplete_stripes > 0, "{total:?}");
    }

    /// A FUA write is durable when it completes, also on a volume that loses a member after
    /// the flush: one write in four after the flush is FUA, and the crash must leave each of
    /// them (or a later write) in place.
    #[test]
    fn a_fua_write_survives_a_host_crash() {
        let mut rng = SimRng::new(22);
        for (level, n) in [(Level::Raid5, 4), (Level::Raid6, 6), (Level::Raid5, 3)] {
            for degraded in [false, true] {
                for _ in 0..4 {
                    let before = rng.below(1500) as usize;
                    let after = 1 + rng.below(300) as usize;
                    let lost = degraded.then(|| {
                        (
                            rng.below(n as u64) as usize,
                            rng.below(after as u64) as usize,
                        )
                    });
                    let seed = rng.next_u64();
                    host_crash_and_recover(level, n, seed, before, after, lost, 4);
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(afa_sim::proptest_cases(8)))]
        #[test]
        fn recovery_at_random_points(seed in any::<u64>(), raid6 in any::<bool>(), budget in 0u64..4000) {
            let (level, n) = if raid6 { (Level::Raid6, 6) } else { (Level::Raid5, 4) };
            crash_and_recover(level, n, seed, budget);
        }

        #[test]
        fn a_host_crash_at_random_points_keeps_every_flushed_write(
            seed in any::<u64>(),
            raid6 in any::<bool>(),
            before in 0usize..2000,
            after in 1usize..400,
        ) {
            let (level, n) = if raid6 { (Level::Raid6, 6) } else { (Level::Raid5, 4) };
            host_crash_and_recover(level, n, seed, before, after, None, 0);
        }

        /// The same on a volume that loses a member after the flush.
        #[test]
        fn a_host_crash_on_a_degraded_volume_keeps_every_flushed_write(
            seed in any::<u64>(),
            raid6 in any::<bool>(),
            before in 0usize..2000,
            after in 1usize..400,
            when in 0usize..400,
        ) {
            let (level, n) = if raid6 { (Level::Raid6, 6) } else { (Level::Raid5, 4) };
            let lost = ((seed % n as u64) as usize, when % after);
            host_crash_and_recover(level, n, seed, before, after, Some(lost), 0);
        }

        #[test]
        fn recovery_with_a_lost_member_at_random_points(
            seed in any::<u64>(),
            raid6 in any::<bool>(),
            budget in 0u64..4000,
            spare in any::<bool>(),
        ) {
            let (level, n) = if raid6 { (Level::Raid6, 6) } else { (Level::Raid5, 4) };
            let lost = [(seed % n as u64) as usize];
            crash_and_recover_losing(level, n, seed, budget, &lost, spare);
        }

        /// With m = 2, two members lost with the power, with or without two spares.
        #[test]
        fn recovery_with_two_lost_members_at_random_points(
            seed in any::<u64>(),
            budget in 0u64..4000,
            spare in any::<bool>(),
            second in 1usize..6,
        ) {
            let first = (seed % 6) as usize;
            let lost = [first, (first + second) % 6];
            crash_and_recover_losing(Level::Raid6, 6, seed, budget, &lost, spare);
        }
    }
}
