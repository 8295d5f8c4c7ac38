//! Rebuilding the AMT and HGMT from the members alone after a power loss (ScalaAFA §5.4),
//! by a full scan of the OOB metadata every chunk copy carries.
//!
//! The walk follows §5.4: each HH slot's primary copy names its user chunk, slot and write
//! timestamp; the newest copy of a user chunk wins (older copies are holes). A stripe is in
//! the striping layout when the tags at its parity members' HH row are the parity of its data
//! slots' tags; otherwise its VHs are found by matching the backups' (chunk, timestamp) on
//! its parity members' transient areas. A hero group that was still open is closed (its
//! unwritten slots deallocated on the HH and the VHs) and queued for conversion.
//!
//! With in-place updates (`sub_chunk_writes = "in-place"`) a chunk's copies keep their
//! slot and timestamp when part of it is rewritten, so a power cut between the primary and
//! a backup leaves copies that agree on their name and differ in some sectors. Once the
//! tables stand, every replicated slot's copies are compared through the checksums in
//! their tags and made to agree (`resync_replicas`). Every written copy names its chunk in
//! its first sector, which the engine writes even when an update to a fresh slot does not
//! cover it. After a host crash over volatile caches the option is refused: an in-place
//! update overwrites the only copy of its sectors the last flush made durable.
//!
//! With members lost (up to m), their primaries are named by their backups or decoded from
//! their stripes' tags, and chunks left only in backups no group can be bound to are written
//! again (see [`ScalaAfa::recover_degraded`] and [`ScalaAfa::recover_without`]). A parity
//! chunk whose tag and data are both zeroes was trimmed when its stripe was freed and is
//! not decoded with.
//!
//! With checkpoints (`checkpoint_interval_ms`) and members that keep whole sectors, the walk
//! starts from the newest whole checkpoint: the stripes it found striped take their chunks
//! from it, the VHs of the stripes it found full or converting are not scanned (their
//! backups are those stripes' primaries), and only the heroes that were free, held or open at
//! its snapshot have all their OOB areas read (see `checkpoint.rs` for why no later write can
//! lie elsewhere). A stripe that was full or converting at the snapshot is striped now if its
//! parity members' tags are the parity of its data tags. A recovery that loses a member as
//! well scans everything.
//!
//! After a host crash over members behind a volatile cache ([`ScalaAfa::recover_with`]),
//! each command since the members' last flush may have kept its data, its tags, both or
//! neither. Every copy the walk takes is then read whole and checked against the checksums
//! in its tags: a copy whose tags outlived its data is dropped as a torn write would be, and
//! the older copy it replaced (kept until a flush, see
//! [`ScalaAfa::keep_flushed_writes`]) wins again. A whole primary is kept even when its
//! backups are gone (a conversion's trim of them reached the medium, its parity did not):
//! its stripe is taken as striped. Checkpoints are not used, since one may name copies that
//! did not survive. Every striped stripe's parity is then computed again from its data
//! (md's resync after an unclean shutdown), since a parity chunk's tags may have outlived
//! its data. A stripe with a lost member cannot be resynced: each lost slot is decoded and
//! checked against its decoded checksums instead, kept only if whole, and the parity written
//! again over what is kept (`settle_lost_slots`). A stripe converted since the last flush
//! that may hold flushed chunks kept its backups through the crash (the engine trims them
//! only after a flush), so it is found replicated again.

use std::collections::BTreeMap;

use afa_ssd::{BlockDevice, DeviceError};

use super::checkpoint::{Snapshot, SNAP_REPLICATED, SNAP_STRIPED, SNAP_UNSEALED};
use super::*;

/// One member's backups found by the scan: (user chunk, timestamp) → (VH, slot).
type Backups = BTreeMap<(u32, u32), (u32, usize)>;

impl<D: BlockDevice> ScalaAfa<D> {
    /// Recovers a volume from members a crashed engine left behind (no member failed).
    /// Needs members that keep tags (`token` or `full` payload).
    pub fn recover(
        config: ArrayConfig,
        scala: ScalaAfaConfig,
        members: Vec<D>,
        spares: Vec<D>,
    ) -> Result<Self, ArrayError> {
        Self::recover_without(config, scala, members, spares, &[])
    }

    /// Recovers a volume after a power loss that also took member `failed` (it may be any
    /// device in its slot; nothing is read from it). What that member held is found from the
    /// others: a primary it kept is named by its backup (replication phase) or by decoding
    /// the tags of its stripe (after conversion); a chunk whose only surviving copies are
    /// backups in a vertical hero no live primary points to is written again into a new hero
    /// group. The member is then failed, and replaced by the first spare if there is one.
    pub fn recover_degraded(
        config: ArrayConfig,
        scala: ScalaAfaConfig,
        members: Vec<D>,
        spares: Vec<D>,
        failed: usize,
    ) -> Result<Self, ArrayError> {
        Self::recover_without(config, scala, members, spares, &[failed])
    }

    /// Recovers a volume after a power loss that also took the members `failed`, as many as
    /// the array has parity rows (m): as [`recover_degraded`](Self::recover_degraded) does
    /// with one, each stripe's lost primaries named by their backups or decoded together
    /// from the stripe's surviving tags. The spares replace the failed members in the order
    /// given. With m members lost a decode has no parity row left over to check it by, so a
    /// stripe the power cut in mid-free is told from a whole one by the decoded tags' kind
    /// and slot, and by a parity chunk trimmed to zeroes, tag and data, which is not decoded
    /// with (see `rebuild_tables`).
    pub fn recover_without(
        config: ArrayConfig,
        scala: ScalaAfaConfig,
        members: Vec<D>,
        spares: Vec<D>,
        failed: &[usize],
    ) -> Result<Self, ArrayError> {
        Self::recover_with(config, scala, members, spares, failed, false)
    }

    /// As [`recover_without`](Self::recover_without); with `verify`, after a host crash over
    /// members behind a volatile cache, keeping every write the last member flush made
    /// durable: each copy is checked against the checksums in its tags, and every striped
    /// stripe's parity is computed again from its data (see the module documentation).
    /// Stripes with a lost member have their lost slots checked and their parity settled.
    pub fn recover_with(
        config: ArrayConfig,
        scala: ScalaAfaConfig,
        members: Vec<D>,
        spares: Vec<D>,
        failed: &[usize],
        verify: bool,
    ) -> Result<Self, ArrayError> {
        if verify && scala.sub_chunk_writes == SubChunkWrites::InPlace {
            return Err(ArrayError::Config(
                "array.scalaafa.sub_chunk_writes = \"in-place\" cannot be recovered after a \
                 host crash over members with volatile caches: an in-place update overwrites \
                 the only copy of its sectors the last flush made durable; use \"merge\""
                    .into(),
            ));
        }
        let mut v = Self::new(config, scala, members, spares)?;
        if v.tag_bytes < META_TAG_BYTES || v.unit == 0 {
            return Err(ArrayError::Config(
                "recovery needs members that keep OOB tags (payload token or full)".into(),
            ));
        }
        crate::check_lost_members(failed, v.members.len(), v.m)?;
        // The failed members take no writes while the tables are rebuilt (closing open
        // groups trims their unwritten slots), then spares, if any, replace them.
        for &f in failed {
            v.members[f].state = MemberState::Failed;
        }
        // The newest whole checkpoint numbers the next one even when a lost member keeps it
        // from being used: a later recovery must never prefer an older checkpoint to the
        // ones written from here on.
        let newest = v.newest_checkpoint(failed);
        if v.checkpointing() {
            v.checkpoints.next_seq = newest.as_ref().map_or(0, |s| s.seq + 1);
            // No periodic checkpoint while the tables are half rebuilt; the one below
            // records them whole.
            v.checkpoints.next_due_ns = TimeNs::MAX;
        }
        // After a host crash a whole checkpoint may name copies whose data did not survive
        // (its write reached the medium, theirs did not), and every copy is read anyway:
        // the walk then scans everything, as it does with a member lost.
        let snap = newest.filter(|_| failed.is_empty() && !verify);
        v.stats.recovered_checkpoint_seq = snap.as_ref().map(|s| s.seq);
        let failure = |e: DeviceError| ArrayError::Config(format!("recovery failed: {e}"));
        let (orphans, stale) = v
            .rebuild_tables(failed, snap.as_ref(), verify)
            .map_err(failure)?;
        if v.scala.sub_chunk_writes == SubChunkWrites::InPlace {
            // Before a spare takes a failed member's place: the rebuild copies what the
            // surviving copies hold, which must agree by then.
            v.resync_replicas().map_err(failure)?;
        }
        for &f in failed {
            v.take_spare(f, 0);
        }
        v.rewrite_orphans(orphans, stale).map_err(failure)?;
        if verify {
            v.resync_parity(failed).map_err(failure)?;
            // What recovery rewrote and trimmed is made durable before the volume serves:
            // another host crash must find the state recovered here.
            v.flush_serving(0).map_err(failure)?;
        }
        if v.checkpointing() {
            // The recovered tables are checkpointed before the volume serves: heroes freed
            // while they were rebuilt are then safe to grant, and the next recovery starts
            // from here.
            v.checkpoint(0).map_err(failure)?;
            v.release_checkpointed(TimeNs::MAX);
        }
        Ok(v)
    }

    fn tags_of(&mut self, member: usize, lba: u64) -> Result<Vec<u8>, DeviceError> {
        self.stats.recovery_tag_reads += 1;
        self.members[member]
            .device
            .scan_tags(lba, 1)
            .ok_or(DeviceError::Unsupported("scan_tags".into()))
    }

    /// Whether the chunk copy at `lba` of `member` is whole: its data matches the checksums
    /// its tags keep (a host crash may keep a copy's tags without its data, or part of it).
    fn copy_whole(&mut self, member: usize, lba: u64) -> Result<bool, DeviceError> {
        let cs = self.chunk_sectors;
        let mut data = vec![0u8; self.chunk_units()];
        self.member_read(member, lba, cs, 0, &mut data)?;
        let tags = self.members[member]
            .device
            .scan_tags(lba, cs)
            .ok_or(DeviceError::Unsupported("scan_tags".into()))?;
        let whole = copy_is_whole(&tags, &data, self.tag_bytes, self.unit);
        if !whole {
            self.stats.recovery_unwhole_copies += 1;
        }
        Ok(whole)
    }

    /// A striped stripe's lost slots after a host crash are only as good as the parity they
    /// are decoded from, whose data may not have survived with its tags (a conversion or a
    /// cleaning since the last flush). Each lost slot's chunk is decoded and checked against
    /// the checksums in its decoded tags; one that misses them is taken as unwritten (the
    /// chunk's older copy, which the flush protocol kept, wins again), and the stripe's
    /// parity is written again over what recovery keeps: the surviving primaries that are
    /// whole, the lost slots that decoded whole, zeroes for the rest (as a trimmed slot
    /// reads). A later decode, or a rebuild onto a spare, then gives back exactly that.
    /// `slots` are the row's primaries as recovery names them; `unwhole` marks the
    /// surviving ones whose data did not survive with their tags (trimmed once the tables
    /// stand).
    fn settle_lost_slots(
        &mut self,
        row: u32,
        failed: &[usize],
        slots: &mut [Option<(u32, u32)>],
        unwhole: &[bool],
    ) -> Result<(), DeviceError> {
        let (k, m) = (self.k, self.m);
        let (cs, tb) = (self.chunk_sectors, self.tag_bytes);
        let lba = self.hh_lba(row);
        let members: Vec<usize> = (0..k)
            .map(|j| self.data_member(row, j))
            .chain((0..m).map(|r| self.parity_member(row, r)))
            .collect();
        let present: Vec<bool> = members.iter().map(|i| !failed.contains(i)).collect();
        let mut data = vec![vec![0u8; self.chunk_units()]; k + m];
        let mut tags = vec![vec![0u8; cs as usize * tb]; k + m];
        for (s, &i) in members.iter().enumerate() {
            if present[s] {
                self.member_read(i, lba, cs, 0, &mut data[s])?;
                tags[s] = (self.members[i].device)
                    .scan_tags(lba, cs)
                    .ok_or(DeviceError::Unsupported("scan_tags".into()))?;
                if s < k {
                    // Parity covers the backups' tags (kind = backup).
                    set_kind(&mut tags[s], tb, KIND_BACKUP);
                }
            }
        }
        let decoded = {
            let mut d: Vec<&mut [u8]> = data.iter_mut().map(|v| v.as_mut_slice()).collect();
            let mut t: Vec<&mut [u8]> = tags.iter_mut().map(|v| v.as_mut_slice()).collect();
            self.codec.reconstruct(&mut d, &present).is_ok()
                && self.codec.reconstruct(&mut t, &present).is_ok()
        };
        for j in 0..k {
            let lost = !present[j];
            let keep = if lost {
                decoded && slots[j].is_some() && copy_is_whole(&tags[j], &data[j], tb, self.unit)
            } else {
                !unwhole[j]
            };
            if lost && slots[j].is_some() && !keep {
                slots[j] = None;
                self.stats.recovery_torn_chunks += 1;
                self.stats.recovery_unwhole_copies += 1;
            }
            if !keep {
                data[j].iter_mut().for_each(|b| *b = 0);
                tags[j].iter_mut().for_each(|b| *b = 0);
            }
        }
        let refs: Vec<&[u8]> = data[..k].iter().map(|v| v.as_slice()).collect();
        let trefs: Vec<&[u8]> = tags[..k].iter().map(|v| v.as_slice()).collect();
        for r in (0..m).filter(|&r| present[k + r]) {
            let mut parity = vec![0u8; self.chunk_units()];
            let mut ptags = vec![0u8; cs as usize * tb];
            self.codec
                .encode_row(r, &refs, &mut parity)
                .map_err(|_| DeviceError::Failed)?;
            self.codec
                .encode_row(r, &trefs, &mut ptags)
                .map_err(|_| DeviceError::Failed)?;
            if parity != data[k + r] || ptags != tags[k + r] {
                self.member_write(members[k + r], lba, 0, &parity, Some(&ptags), false)?;
            }
        }
        self.stats.recovery_resynced_stripes += 1;
        Ok(())
    }

    /// Computes every striped stripe's parity again from its data slots (data and tags), as
    /// md resyncs after an unclean shutdown: a host crash may have kept a parity chunk's tags
    /// without its data. Stripes with a member in `failed` had theirs settled while the
    /// tables were rebuilt (`settle_lost_slots`).
    fn resync_parity(&mut self, failed: &[usize]) -> Result<(), DeviceError> {
        let all_rows = (1u32 << self.m) - 1;
        for row in 0..self.rows {
            let whole = (0..self.members.len()).all(|i| !failed.contains(&i));
            if self.stripes[row as usize].state != HhState::Striped || !whole {
                continue;
            }
            let (_, missing) = self.write_parity(row, 0, all_rows, false)?;
            self.stripes[row as usize].parity_missing = missing;
            self.stats.recovery_resynced_stripes += 1;
        }
        Ok(())
    }

    /// In-place updates (`SubChunkWrites::InPlace`) write a chunk's primary, then its
    /// backups, into the slots the chunk already holds, under the timestamp it already has:
    /// a power cut between them leaves copies that name the same (chunk, timestamp) but
    /// differ in the sectors the update covered. The update was not acknowledged, so either
    /// version of those sectors may stay, but the copies must agree before the volume
    /// serves: reads take the primary or a replica, and conversion computes the parity
    /// from the backups. Every slot written in a replicated stripe, live or dead (the
    /// parity covers both), is compared sector by sector through the checksums in its
    /// copies' tags, and each sector that differs is copied, data and tag, from the primary
    /// (or, with the primary's member lost, from the first surviving backup) to the others.
    fn resync_replicas(&mut self) -> Result<(), DeviceError> {
        let (cs, tb, unit) = (self.chunk_sectors, self.tag_bytes, self.unit);
        let transient = self.scala.mode != ScalaMode::ScalaWr;
        for row in 0..self.rows {
            let s = &self.stripes[row as usize];
            if !matches!(s.state, HhState::Open | HhState::Full) {
                continue;
            }
            for j in 0..s.filled as usize {
                let mut copies = self.slot_copies(row, j);
                copies.retain(|&(member, _, _)| self.writable(member));
                let Some((&(src, src_lba, _), others)) = copies.split_first() else {
                    continue;
                };
                let src_tags = self.chunk_tags(src, src_lba)?;
                for &(dst, dst_lba, vh) in others {
                    let backup = vh.is_some();
                    let tags = self.chunk_tags(dst, dst_lba)?;
                    let differs = |i: usize| {
                        let (a, b) = (&src_tags[i * tb..(i + 1) * tb], &tags[i * tb..(i + 1) * tb]);
                        a.iter()
                            .zip(b)
                            .enumerate()
                            .any(|(at, (x, y))| at != KIND_AT && x != y)
                    };
                    let mut resynced = false;
                    let mut i = 0;
                    while i < cs as usize {
                        if !differs(i) {
                            i += 1;
                            continue;
                        }
                        let start = i;
                        while i < cs as usize && differs(i) {
                            i += 1;
                        }
                        let rows = (i - start) as u32;
                        let mut data = vec![0u8; rows as usize * unit];
                        self.member_read(src, src_lba + start as u64, rows, 0, &mut data)?;
                        let mut t = src_tags[start * tb..i * tb].to_vec();
                        set_kind(&mut t, tb, if backup { KIND_BACKUP } else { KIND_PRIMARY });
                        self.member_write_rows(
                            dst,
                            dst_lba + start as u64,
                            rows,
                            0,
                            &data,
                            Some(&t),
                            backup && transient,
                        )?;
                        resynced = true;
                    }
                    if resynced {
                        self.stats.recovery_resynced_copies += 1;
                    }
                }
            }
        }
        Ok(())
    }

    /// Where slot j of a replicated `stripe` keeps its copies, whatever their members'
    /// state: (member, lba, VH) for the primary in the HH (no VH), then each backup in a VH
    /// the stripe still holds.
    pub(super) fn slot_copies(&self, stripe: u32, j: usize) -> Vec<(usize, u64, Option<u32>)> {
        let mut copies = vec![(self.data_member(stripe, j), self.hh_lba(stripe), None)];
        for (r, &vh) in self.stripes[stripe as usize].vhs.iter().enumerate() {
            if vh != NONE {
                copies.push((self.parity_member(stripe, r), self.vh_lba(vh, j), Some(vh)));
            }
        }
        copies
    }

    /// Every sector's tag of the chunk copy at `lba` of `member`.
    fn chunk_tags(&mut self, member: usize, lba: u64) -> Result<Vec<u8>, DeviceError> {
        self.stats.recovery_tag_reads += 1;
        self.members[member]
            .device
            .scan_tags(lba, self.chunk_sectors)
            .ok_or(DeviceError::Unsupported("scan_tags".into()))
    }

    /// The (chunk, timestamp) a tag names if it is copy `kind` of slot `j`.
    fn named(&self, tag: &[u8], j: usize, kind: u8) -> Option<(u32, u32)> {
        let (chunk, s, ts, k) = decode_meta(tag);
        (k == kind && s as usize == j && (chunk as usize) < self.amt.len()).then_some((chunk, ts))
    }

    /// Rebuilds the AMT and HGMT, from `snap` and the heroes unsealed at its snapshot, or
    /// from every OOB area. Nothing is read from the members `failed`. Returns the
    /// chunks whose newest copy survives only as backups no hero group could be bound to,
    /// with where to read one (chunk, member, lba), and every unclaimed backup (member, lba).
    #[allow(clippy::type_complexity)]
    fn rebuild_tables(
        &mut self,
        failed: &[usize],
        snap: Option<&Snapshot>,
        verify: bool,
    ) -> Result<(Vec<(u32, usize, u64)>, Vec<(usize, u64)>), DeviceError> {
        let (k, m) = (self.k, self.m);
        let alive = |i: usize| !failed.contains(&i);
        let sealed = |row: u32| snap.map_or(SNAP_UNSEALED, |s| s.sealed[row as usize]);
        // Primaries per row as the checkpoint names them (rows striped at the snapshot) or
        // the members hold them: (chunk, ts), None if unwritten or on the failed member
        // (filled in below from the stripe's other members). The checkpoint names only the
        // live chunks, so a replicated row's primaries are read: its written slots, dead or
        // alive, tell how far the group was filled.
        let mut primaries: Vec<Vec<Option<(u32, u32)>>> = vec![vec![None; k]; self.rows as usize];
        // Primaries whose data does not match their tags (`verify` only): taken as torn.
        let mut unwhole = vec![vec![false; k]; self.rows as usize];
        if let Some(s) = snap {
            for (chunk, (&a, &ts)) in s.amt.iter().zip(&s.amt_ts).enumerate() {
                if a != NONE && sealed(a / k as u32) == SNAP_STRIPED {
                    primaries[(a / k as u32) as usize][(a % k as u32) as usize] =
                        Some((chunk as u32, ts));
                }
            }
        }
        for (row, slots) in primaries.iter_mut().enumerate() {
            let row = row as u32;
            if sealed(row) == SNAP_STRIPED {
                continue;
            }
            for (j, slot) in slots.iter_mut().enumerate() {
                let d = self.data_member(row, j);
                if alive(d) {
                    let t = self.tags_of(d, self.hh_lba(row))?;
                    *slot = self.named(&t, j, KIND_PRIMARY);
                    if verify && slot.is_some() && !self.copy_whole(d, self.hh_lba(row))? {
                        unwhole[row as usize][j] = true;
                    }
                }
            }
        }
        // VHs of the stripes sealed at the snapshot: their backups are known without a scan.
        let mut sealed_vhs = vec![vec![false; self.vhs_per_member as usize]; self.members.len()];
        if let Some(s) = snap {
            for row in 0..self.rows {
                for r in 0..m {
                    let vh = s.vhs[row as usize * m + r];
                    if sealed(row) == SNAP_REPLICATED && vh != NONE {
                        sealed_vhs[self.parity_member(row, r)][vh as usize] = true;
                    }
                }
            }
        }
        // Copies to trim once the tables stand (member, lba): backups no group claims, and
        // the copies of chunks a power cut left incomplete.
        let mut stale = Vec::new();
        // Backups per member: (chunk, ts) → (vh, slot).
        let mut backups: Vec<Backups> = Vec::new();
        for (p, sealed_here) in sealed_vhs.iter().enumerate() {
            let mut map = BTreeMap::new();
            if alive(p) {
                for vh in 0..self.vhs_per_member {
                    if sealed_here[vh as usize] {
                        continue;
                    }
                    for j in 0..k {
                        let lba = self.vh_lba(vh, j);
                        let t = self.tags_of(p, lba)?;
                        if let Some(key) = self.named(&t, j, KIND_BACKUP) {
                            if verify && !self.copy_whole(p, lba)? {
                                // Trimmed, so that no later recovery takes it for data.
                                stale.push((p, lba));
                            } else {
                                map.insert(key, (vh, j));
                            }
                        }
                    }
                }
            }
            backups.push(map);
        }
        // Stripes full or converting at the snapshot: striped now if their parity checks,
        // else still replicated in the VHs the checkpoint names, on each parity member
        // whose VH still holds the stripe's backups. With m >= 2 the power may have cut a
        // conversion between parity members: those it reached hold the parity and their VH
        // was trimmed, so they are left without backups here, as a full scan would find
        // them, and the stripe is taken as half converted below.
        let mut striped_now = vec![false; self.rows as usize];
        for row in 0..self.rows {
            match sealed(row) {
                SNAP_STRIPED => striped_now[row as usize] = true,
                SNAP_REPLICATED => {
                    if self.parity_checks(row)? {
                        striped_now[row as usize] = true;
                    } else if let Some(s) = snap {
                        for r in 0..m {
                            let vh = s.vhs[row as usize * m + r];
                            if vh == NONE {
                                continue;
                            }
                            let p = self.parity_member(row, r);
                            if !self.vh_holds_a_backup(p, vh, &primaries[row as usize])? {
                                continue;
                            }
                            for (j, key) in primaries[row as usize].iter().enumerate() {
                                if let Some(key) = key {
                                    backups[p].insert(*key, (vh, j));
                                }
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        let mut used_vhs = vec![vec![false; self.vhs_per_member as usize]; self.members.len()];
        // Rows whose VH on a failed member is unknown: (row, parity row r).
        let mut lost_vhs = Vec::new();
        let mut half_converted = Vec::new();
        let mut open_rows = Vec::new();
        for row in 0..self.rows {
            let failed_slots: Vec<usize> = (0..k)
                .filter(|&j| !alive(self.data_member(row, j)))
                .collect();
            let failed_parity: u32 = (0..m)
                .filter(|&r| !alive(self.parity_member(row, r)))
                .fold(0, |rows, r| rows | 1 << r);
            if striped_now[row as usize] {
                let s = &mut self.stripes[row as usize];
                s.state = HhState::Striped;
                s.filled = k as u32;
                s.parity_missing = failed_parity;
                continue;
            }
            let alive_written = primaries[row as usize].iter().flatten().count();
            // Replication phase: the HG's VH on each serving parity member, found by the
            // backups of the stripe's surviving primaries.
            let mut vhs = self.vhs_of(row, &primaries[row as usize], &backups);
            let mut replicated = vhs.iter().any(|&vh| vh != NONE);
            // After conversion: the serving parity members hold the parity of the data tags.
            let mut data_tags: Vec<Vec<u8>> = Vec::with_capacity(k);
            for j in 0..k {
                let d = self.data_member(row, j);
                let mut t = if alive(d) {
                    self.tags_of(d, self.hh_lba(row))?
                } else {
                    vec![0u8; self.tag_bytes]
                };
                // Parity covers the backups' tags (kind = backup), which equal the primaries'
                // in all but the kind byte.
                set_kind(&mut t, self.tag_bytes, KIND_BACKUP);
                data_tags.push(t);
            }
            let mut parity_tags: Vec<Option<Vec<u8>>> = Vec::with_capacity(m);
            for r in 0..m {
                let p = self.parity_member(row, r);
                parity_tags.push(if alive(p) {
                    Some(self.tags_of(p, self.hh_lba(row))?)
                } else {
                    None
                });
            }
            // A conversion the power cut stopped between parity members (m >= 2): some hold
            // the stripe's parity and no longer its backups, the others still its backups.
            // The stripe is striped; the parity rows still missing are computed again once
            // the tables stand.
            let mut unconverted = 0u32;
            let striped = if replicated {
                if failed_parity == 0 {
                    // A failed member's tag is its backup's in a VH still holding the row.
                    let mut tags = data_tags.clone();
                    for &jf in &failed_slots {
                        tags[jf] = self.backup_tags(row, &vhs, jf)?;
                    }
                    let refs: Vec<&[u8]> = tags.iter().map(|t| t.as_slice()).collect();
                    let mut converted = 0;
                    for (r, t) in parity_tags.iter().enumerate() {
                        if vhs[r] == NONE && t.as_ref() == Some(&self.parity_tags(r, &refs)?) {
                            converted += 1;
                        } else if vhs[r] != NONE {
                            unconverted |= 1 << r;
                        }
                    }
                    let half = converted > 0 && converted + unconverted.count_ones() as usize == m;
                    if half {
                        for &jf in &failed_slots {
                            primaries[row as usize][jf] = self.named(&tags[jf], jf, KIND_BACKUP);
                        }
                    }
                    half
                } else {
                    false
                }
            } else if !failed_slots.is_empty() {
                // Data tags are missing, so the parity cannot be checked; with no backups
                // left, a stripe that holds anything has been converted. Its missing tags
                // are decoded from the others.
                let any_parity = parity_tags
                    .iter()
                    .flatten()
                    .any(|t| t.iter().any(|&b| b != 0));
                if alive_written == 0 && !any_parity {
                    false
                } else {
                    // A parity chunk trimmed when the stripe was freed reads as zeroes, tag
                    // and data. A decode with it gives the code of the other tags, which for
                    // consecutive chunks names the next chunk and timestamp, in the lost
                    // slot, and passes for a real tag when no parity row is left over to
                    // check it. A zero tag alone does not tell (four consecutive chunks'
                    // tags code to zero too), but a parity chunk's data is the code of its
                    // data chunks' tokens or bytes, zero only for a stripe of zero data.
                    let mut usable = parity_tags.clone();
                    for (r, t) in parity_tags.iter().enumerate() {
                        let zero_tag = t.as_ref().is_some_and(|t| t.iter().all(|&b| b == 0));
                        if zero_tag && self.parity_data_is_zero(row, r)? {
                            usable[r] = None;
                        }
                    }
                    let mut shards: Vec<Vec<u8>> = data_tags.clone();
                    let mut present = vec![true; k + m];
                    for &jf in &failed_slots {
                        present[jf] = false;
                    }
                    for (r, t) in usable.iter().enumerate() {
                        shards.push(t.clone().unwrap_or_else(|| vec![0u8; self.tag_bytes]));
                        present[k + r] = t.is_some();
                    }
                    let mut refs: Vec<&mut [u8]> =
                        shards.iter_mut().map(|v| v.as_mut_slice()).collect();
                    // Too few shards left: the stripe was being freed, and its lost slots
                    // are taken as unwritten.
                    let decoded = present.iter().filter(|&&p| !p).count() <= m
                        && self.codec.reconstruct(&mut refs, &present).is_ok();
                    // The parity covers the backups' tags, so a consistent decode gives a
                    // backup's tag back whole; another kind byte, or a parity row the
                    // decoded tags do not reproduce (when one is left over beyond the
                    // decode), means the shards do not belong together (a stripe the power
                    // cut in mid-free), and the slots are taken as unwritten.
                    let refs: Vec<&[u8]> = shards[..k].iter().map(|t| t.as_slice()).collect();
                    let mut consistent = decoded;
                    for (r, t) in usable.iter().enumerate() {
                        if let Some(t) = t {
                            consistent &= *t == self.parity_tags(r, &refs)?;
                        }
                    }
                    for &jf in &failed_slots {
                        primaries[row as usize][jf] = consistent
                            .then(|| self.named(&shards[jf], jf, KIND_BACKUP))
                            .flatten();
                    }
                    true
                }
            } else if alive_written == 0 {
                false
            } else {
                let refs: Vec<&[u8]> = data_tags.iter().map(|t| t.as_slice()).collect();
                let mut checked = 0;
                let mut matches = true;
                for (r, t) in parity_tags.iter().enumerate() {
                    if let Some(t) = t {
                        checked += 1;
                        matches &= *t == self.parity_tags(r, &refs)?;
                    }
                }
                // With the only parity member failed, the stripe's backups went with it:
                // whether or not it was converted, its primaries are its only copies now.
                checked == 0 || matches
            };
            // After a host crash, a chunk copy whose data survived with its tags is kept
            // even when its backups did not (a conversion's trim of them reached the
            // medium, and its parity did not; or a group filled since the last flush lost
            // a backup): the stripe is striped, and its parity computed again from its
            // primaries once the tables stand. Its VHs, claimed by no group, are trimmed
            // unless another group has taken them since.
            let whole = |j: usize| {
                primaries[row as usize][j]
                    .filter(|_| !unwhole[row as usize][j])
                    .map(|key| (j, key))
            };
            let primaries_kept = !striped
                && verify
                && failed_slots.is_empty()
                && failed_parity == 0
                && (0..k).any(|j| whole(j).is_some())
                && (!replicated
                    || (0..k)
                        .filter_map(whole)
                        .any(|(j, key)| !self.backed_up(row, j, key, &backups, alive)));
            if striped || primaries_kept {
                // A primary whose data did not survive with its tags is dropped, and its
                // slot trimmed before the parity is computed again.
                for j in 0..k {
                    if unwhole[row as usize][j] {
                        primaries[row as usize][j] = None;
                        self.stats.recovery_torn_chunks += 1;
                        stale.push((self.data_member(row, j), self.hh_lba(row)));
                    }
                }
                if verify && !failed_slots.is_empty() {
                    self.settle_lost_slots(
                        row,
                        failed,
                        &mut primaries[row as usize],
                        &unwhole[row as usize],
                    )?;
                }
                let s = &mut self.stripes[row as usize];
                s.state = HhState::Striped;
                s.filled = k as u32;
                s.parity_missing = failed_parity;
                // After a host crash every striped stripe's parity is computed again once the
                // tables stand, so a stripe found between its parity rows needs no finishing
                // from its VHs; and those may have gone to another group since its
                // conversion released them, whose writes the crash kept only in part.
                if replicated && !primaries_kept && !verify {
                    s.parity_missing = unconverted;
                    s.vhs = vhs;
                    half_converted.push(row);
                }
                continue;
            }
            // A chunk is written primary first, then each backup; a power cut in between
            // leaves a primary without every backup (never acknowledged). It is dropped with
            // its copies: kept, the group's parity, computed later from its VHs, would not
            // match its HH. So is a primary whose data did not survive with its tags.
            let mut torn = vec![false; k];
            for j in 0..k {
                if let Some(key) = primaries[row as usize][j] {
                    if unwhole[row as usize][j] || !self.backed_up(row, j, key, &backups, alive) {
                        primaries[row as usize][j] = None;
                        torn[j] = true;
                        self.stats.recovery_torn_chunks += 1;
                        let d = self.data_member(row, j);
                        if alive(d) {
                            stale.push((d, self.hh_lba(row)));
                        }
                    }
                }
            }
            if torn.contains(&true) {
                vhs = self.vhs_of(row, &primaries[row as usize], &backups);
                replicated = vhs.iter().any(|&vh| vh != NONE);
            }
            if !replicated {
                // Nothing of this stripe survives but, perhaps, backups of a group whose
                // only written slots were on failed members: those are found as orphans.
                primaries[row as usize].iter_mut().for_each(|s| *s = None);
                continue;
            }
            for &jf in &failed_slots {
                // A failed member's primary is named by its backup in the group's VH.
                let t = self.backup_tags(row, &vhs, jf)?;
                let key = self.named(&t, jf, KIND_BACKUP);
                if key.is_some_and(|key| self.backed_up(row, jf, key, &backups, alive)) {
                    primaries[row as usize][jf] = key;
                } else if key.is_some() {
                    torn[jf] = true;
                }
            }
            for (r, &vh) in vhs.iter().enumerate() {
                let p = self.parity_member(row, r);
                if vh == NONE {
                    if alive(p) {
                        return Err(DeviceError::Unsupported(format!(
                            "row {row}: no backups on member {p}"
                        )));
                    }
                    lost_vhs.push((row, r));
                    continue;
                }
                used_vhs[p][vh as usize] = true;
                self.members[p].vh_owner[vh as usize] = row;
            }
            // The group was filled up to its last whole chunk; closing it below trims the
            // slots after that, and a slot before it holding no chunk is trimmed here, on the
            // HH and the VHs alike, so that the parity the conversion computes from the VHs
            // matches the HH: a torn chunk's slot, or one whose data a host crash kept
            // without its tags.
            let filled = (0..k)
                .rev()
                .find(|&j| primaries[row as usize][j].is_some())
                .map_or(0, |j| j + 1);
            for j in (0..filled).filter(|&j| primaries[row as usize][j].is_none()) {
                let d = self.data_member(row, j);
                if !torn[j] && alive(d) {
                    stale.push((d, self.hh_lba(row)));
                }
                for (r, &vh) in vhs.iter().enumerate() {
                    let p = self.parity_member(row, r);
                    if vh != NONE && alive(p) {
                        stale.push((p, self.vh_lba(vh, j)));
                    }
                }
            }
            let s = &mut self.stripes[row as usize];
            s.vhs = vhs;
            s.filled = filled as u32;
            s.state = HhState::Open;
            open_rows.push(row);
        }
        // A group whose VH on a failed member is unknown gets any unused one there: the
        // member serves nothing, and a rebuild rewrites that VH from the surviving copies.
        for (row, r) in lost_vhs {
            let p = self.parity_member(row, r);
            let vh = (0..self.vhs_per_member)
                .find(|&v| !used_vhs[p][v as usize])
                .ok_or(DeviceError::Failed)?;
            used_vhs[p][vh as usize] = true;
            self.members[p].vh_owner[vh as usize] = row;
            self.stripes[row as usize].vhs[r] = vh;
        }
        // The newest copy of each user chunk wins (AMT).
        let mut newest: BTreeMap<u32, (u32, u32)> = BTreeMap::new();
        for (row, slots) in primaries.iter().enumerate() {
            for (j, slot) in slots.iter().enumerate() {
                if let Some((chunk, ts)) = *slot {
                    let a = row as u32 * k as u32 + j as u32;
                    let e = newest.entry(chunk).or_insert((ts, a));
                    if ts > e.0 {
                        *e = (ts, a);
                    }
                }
            }
        }
        // Backups in VHs no group claimed: a chunk whose newest copy is one of them is
        // written again once the tables stand.
        let mut orphans: BTreeMap<u32, (u32, usize, u64)> = BTreeMap::new();
        for (p, map) in backups.iter().enumerate() {
            for (&(chunk, ts), &(vh, j)) in map {
                if used_vhs[p][vh as usize] {
                    continue;
                }
                // Every backup no group claims is dropped once the tables stand, so a later
                // recovery cannot mistake it for data.
                stale.push((p, self.vh_lba(vh, j)));
                if newest.get(&chunk).is_some_and(|&(t, _)| t >= ts) {
                    continue;
                }
                let e = orphans.entry(chunk).or_insert((ts, p, self.vh_lba(vh, j)));
                if ts > e.0 {
                    *e = (ts, p, self.vh_lba(vh, j));
                }
            }
        }
        for (&chunk, &(_, a)) in &newest {
            if !orphans.contains_key(&chunk) {
                self.amt[chunk as usize] = a;
            }
        }
        for row in 0..self.rows {
            let slots = &primaries[row as usize];
            let live: Vec<u32> = (0..k)
                .map(|j| match slots[j] {
                    Some((c, _)) if self.amt[c as usize] == row * k as u32 + j as u32 => c,
                    _ => NONE,
                })
                .collect();
            let s = &mut self.stripes[row as usize];
            s.live = live.iter().filter(|&&c| c != NONE).count() as u32;
            s.chunks = live;
            // A striped row whose every chunk was written again since the checkpoint was
            // freed after it: free it again, and drop its stale tags.
            if s.state == HhState::Striped && s.live == 0 {
                s.state = HhState::Free;
                s.filled = 0;
                s.parity_missing = 0;
                let lba = self.hh_lba(row);
                for i in 0..self.members.len() {
                    self.member_trim(i, lba, self.chunk_sectors, 0)?;
                }
            }
        }
        // Free lists: every HH and VH not in use.
        self.manager.free_hhs = (0..self.rows)
            .filter(|&r| self.stripes[r as usize].state == HhState::Free)
            .collect();
        for (p, used) in used_vhs.iter().enumerate() {
            self.manager.free_vhs[p] = (0..self.vhs_per_member)
                .filter(|&v| !used[v as usize])
                .collect();
        }
        for s in 0..self.rows {
            let st = &self.stripes[s as usize];
            if st.state == HhState::Striped && st.live > 0 {
                self.by_live[st.live as usize].insert(s);
            }
        }
        // The timestamps continue after the newest one seen.
        self.clock = newest
            .values()
            .map(|&(ts, _)| ts)
            .chain(orphans.values().map(|&(ts, _, _)| ts))
            .chain(snap.map(|s| s.clock))
            .max()
            .unwrap_or(0);
        for (&chunk, &(ts, _)) in &newest {
            self.amt_ts[chunk as usize] = ts;
        }
        // Open hero groups are closed and queued for conversion (thread 0's list).
        for row in open_rows {
            self.open[0] = Some(row);
            self.close_open(0, 0)?;
        }
        let mut done = 0;
        while let Ok(msg) = self.manager.inbox.try_recv() {
            if let ToManager::Full { stripe, .. } = msg {
                self.manager.full[0].push_back(stripe);
                done += 1;
            }
        }
        debug_assert!(done <= self.rows as usize);
        // The parity rows a cut conversion did not write, from the primaries, before the
        // backups that stood in for them are trimmed. A failed data member's chunk is read
        // from its backup in the VHs those rows still hold (two lost data members leave too
        // few shards to decode it). Those VHs are
        // already in the free lists, as a converted stripe's are, and nothing is granted
        // before the conversion has trimmed them; the stripe forgets them once it is whole.
        for row in half_converted {
            let rows = self.stripes[row as usize].parity_missing;
            self.convert_on_host(row, 0, rows)?;
            self.stripes[row as usize].vhs.clear();
            self.stats.recovery_finished_conversions += 1;
        }
        let orphans = orphans
            .into_iter()
            .map(|(chunk, (_, p, lba))| (chunk, p, lba))
            .collect();
        Ok((orphans, stale))
    }

    /// The tags of slot `j`'s backup in the first of `row`'s VHs that is known.
    fn backup_tags(&mut self, row: u32, vhs: &[u32], j: usize) -> Result<Vec<u8>, DeviceError> {
        let (r, vh) = vhs
            .iter()
            .enumerate()
            .find(|&(_, &vh)| vh != NONE)
            .map(|(r, &vh)| (r, vh))
            .expect("replicated rows have a VH");
        self.tags_of(self.parity_member(row, r), self.vh_lba(vh, j))
    }

    /// The tags parity row `r` holds over the data slots' tags `data`, as conversion
    /// computes them.
    fn parity_tags(&self, r: usize, data: &[&[u8]]) -> Result<Vec<u8>, DeviceError> {
        let mut want = vec![0u8; self.tag_bytes];
        self.codec
            .encode_row(r, data, &mut want)
            .map_err(|_| DeviceError::Failed)?;
        Ok(want)
    }

    /// Whether the chunk parity row `r` of `row` holds reads as zeroes.
    fn parity_data_is_zero(&mut self, row: u32, r: usize) -> Result<bool, DeviceError> {
        let mut buf = vec![0u8; self.chunk_units()];
        let (p, lba) = (self.parity_member(row, r), self.hh_lba(row));
        self.member_read(p, lba, self.chunk_sectors, 0, &mut buf)?;
        Ok(buf.iter().all(|&b| b == 0))
    }

    /// The VH on each parity member of `row` holding a backup of one of its primaries.
    fn vhs_of(&self, row: u32, primaries: &[Option<(u32, u32)>], backups: &[Backups]) -> Vec<u32> {
        (0..self.m)
            .map(|r| {
                let p = self.parity_member(row, r);
                primaries
                    .iter()
                    .flatten()
                    .find_map(|key| backups[p].get(key).map(|&(vh, _)| vh))
                    .unwrap_or(NONE)
            })
            .collect()
    }

    /// Whether chunk `key` at slot `j` of `row` has its backup in slot `j` of a VH on every
    /// serving parity member.
    fn backed_up(
        &self,
        row: u32,
        j: usize,
        key: (u32, u32),
        backups: &[Backups],
        alive: impl Fn(usize) -> bool,
    ) -> bool {
        (0..self.m).all(|r| {
            let p = self.parity_member(row, r);
            !alive(p) || backups[p].get(&key).is_some_and(|&(_, at)| at == j)
        })
    }

    /// Whether VH `vh` on member `p` still holds the backup of one of the stripe's
    /// `primaries` (by slot), so that it was not trimmed by a conversion since the
    /// checkpoint. Reads tags only until one names its primary's chunk: one read when the
    /// VH is intact.
    fn vh_holds_a_backup(
        &mut self,
        p: usize,
        vh: u32,
        primaries: &[Option<(u32, u32)>],
    ) -> Result<bool, DeviceError> {
        for (j, key) in primaries.iter().enumerate() {
            let Some(key) = *key else { continue };
            let t = self.tags_of(p, self.vh_lba(vh, j))?;
            if self.named(&t, j, KIND_BACKUP) == Some(key) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Whether the tags at `row` on its parity members are the parity of its data slots'
    /// tags (every member alive): the stripe was converted.
    fn parity_checks(&mut self, row: u32) -> Result<bool, DeviceError> {
        let (k, m) = (self.k, self.m);
        let mut data_tags = Vec::with_capacity(k);
        for j in 0..k {
            let mut t = self.tags_of(self.data_member(row, j), self.hh_lba(row))?;
            set_kind(&mut t, self.tag_bytes, KIND_BACKUP);
            data_tags.push(t);
        }
        let refs: Vec<&[u8]> = data_tags.iter().map(|t| t.as_slice()).collect();
        for r in 0..m {
            let have = self.tags_of(self.parity_member(row, r), self.hh_lba(row))?;
            if have != self.parity_tags(r, &refs)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Trims every free VH that still holds a tag, before any is handed out. The backups
    /// recovery recognised (by their first sector's tag) are dropped with the stale copies,
    /// but a write the power cut tore may have left tags in a slot's later sectors, or stray
    /// ones, and a group that took the VH would leave them beside its own backups, where
    /// the next recovery reads them as the group's (`ScalaAfa::assert_vhs_trimmed`).
    fn trim_free_vhs(&mut self) -> Result<(), DeviceError> {
        if self.tag_bytes == 0 {
            return Ok(());
        }
        let sectors = self.k as u32 * self.chunk_sectors;
        for p in 0..self.members.len() {
            if self.members[p].state != MemberState::Alive {
                continue;
            }
            let free: Vec<u32> = self.manager.free_vhs[p].iter().copied().collect();
            for vh in free {
                let lba = self.vh_lba(vh, 0);
                let tagged = (self.members[p].device)
                    .scan_tags(lba, sectors)
                    .is_none_or(|tags| tags.iter().any(|&b| b != 0));
                if tagged {
                    self.member_trim(p, lba, sectors, 0)?;
                }
            }
        }
        Ok(())
    }

    /// Writes orphaned chunks again through thread 0: all are read first, because the VHs
    /// they sit in are free and a new group may take one.
    fn rewrite_orphans(
        &mut self,
        orphans: Vec<(u32, usize, u64)>,
        stale: Vec<(usize, u64)>,
    ) -> Result<(), DeviceError> {
        let cs = self.chunk_sectors;
        let mut copies = Vec::with_capacity(orphans.len());
        for &(chunk, p, lba) in &orphans {
            let mut buf = vec![0u8; self.chunk_units()];
            self.member_read(p, lba, cs, 0, &mut buf)?;
            copies.push((chunk, buf));
        }
        for (p, lba) in stale {
            self.member_trim(p, lba, cs, 0)?;
        }
        self.trim_free_vhs()?;
        for (chunk, buf) in copies {
            self.write_chunk(0, chunk, &buf, 0)?;
        }
        if !orphans.is_empty() {
            self.close_open(0, 0)?;
        }
        Ok(())
    }
}
