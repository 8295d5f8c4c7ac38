//! Rebuilding the AMT and HGMT from the members alone after a power loss (ScalaAFA §5.4),
//! by a full scan of the OOB metadata every chunk copy carries.
//!
//! The walk follows §5.4: each HH slot's primary copy names its user chunk, slot and write
//! timestamp; the newest copy of a user chunk wins (older copies are holes). A stripe is in
//! the striping layout when the tags at its parity members' HH row are the parity of its data
//! slots' tags; otherwise its VHs are found by matching the backups' (chunk, timestamp) on
//! its parity members' transient areas. A hero group that was still open is closed (its
//! unwritten slots deallocated on the HH and the VHs) and queued for conversion.

use std::collections::BTreeMap;

use afa_ssd::{BlockDevice, DeviceError};

use super::*;

impl<D: BlockDevice> ScalaAfa<D> {
    /// Recovers a volume from members a crashed engine left behind (no member failed).
    /// Needs members that keep tags (`token` or `full` payload).
    pub fn recover(
        config: ArrayConfig,
        scala: ScalaAfaConfig,
        members: Vec<D>,
        spares: Vec<D>,
    ) -> Result<Self, ArrayError> {
        let mut v = Self::new(config, scala, members, spares)?;
        if v.tag_bytes < META_TAG_BYTES || v.unit == 0 {
            return Err(ArrayError::Config(
                "recovery needs members that keep OOB tags (payload token or full)".into(),
            ));
        }
        v.rebuild_tables()
            .map_err(|e| ArrayError::Config(format!("recovery failed: {e}")))?;
        Ok(v)
    }

    fn tags_of(&self, member: usize, lba: u64) -> Result<Vec<u8>, DeviceError> {
        self.members[member]
            .device
            .scan_tags(lba, 1)
            .ok_or(DeviceError::Unsupported("scan_tags".into()))
    }

    fn rebuild_tables(&mut self) -> Result<(), DeviceError> {
        let (k, m) = (self.k, self.m);
        // Physical primaries per row: (chunk, ts) or None, and the newest copy per chunk.
        let mut primaries: Vec<Vec<Option<(u32, u32)>>> = Vec::with_capacity(self.rows as usize);
        let mut newest: BTreeMap<u32, (u32, u32)> = BTreeMap::new();
        for row in 0..self.rows {
            let mut slots = vec![None; k];
            for (j, slot) in slots.iter_mut().enumerate() {
                let t = self.tags_of(self.data_member(row, j), self.hh_lba(row))?;
                let (chunk, s, ts, kind) = decode_meta(&t);
                if kind == KIND_PRIMARY && s as usize == j && (chunk as usize) < self.amt.len() {
                    *slot = Some((chunk, ts));
                    let a = row * k as u32 + j as u32;
                    let e = newest.entry(chunk).or_insert((ts, a));
                    if ts > e.0 {
                        *e = (ts, a);
                    }
                }
            }
            primaries.push(slots);
        }
        // Backups per member: (chunk, ts) → (vh, slot).
        let mut backups: Vec<BTreeMap<(u32, u32), (u32, usize)>> = Vec::new();
        for p in 0..self.members.len() {
            let mut map = BTreeMap::new();
            for vh in 0..self.vhs_per_member {
                for j in 0..k {
                    let t = self.tags_of(p, self.vh_lba(vh, j))?;
                    let (chunk, s, ts, kind) = decode_meta(&t);
                    if kind == KIND_BACKUP && s as usize == j {
                        map.insert((chunk, ts), (vh, j));
                    }
                }
            }
            backups.push(map);
        }
        for (&chunk, &(_, a)) in &newest {
            self.amt[chunk as usize] = a;
        }
        let mut used_vhs = vec![vec![false; self.vhs_per_member as usize]; self.members.len()];
        let mut open_rows = Vec::new();
        for row in 0..self.rows {
            let slots = &primaries[row as usize];
            let live: Vec<u32> = (0..k)
                .map(|j| match slots[j] {
                    Some((c, _)) if self.amt[c as usize] == row * k as u32 + j as u32 => c,
                    _ => NONE,
                })
                .collect();
            let written = slots.iter().filter(|s| s.is_some()).count();
            let s = &mut self.stripes[row as usize];
            s.live = live.iter().filter(|&&c| c != NONE).count() as u32;
            s.chunks = live;
            if written == 0 {
                continue;
            }
            // Converted: the parity members' tags are the parity of the data tags.
            let mut data_tags: Vec<Vec<u8>> = (0..k)
                .map(|j| self.tags_of(self.data_member(row, j), self.hh_lba(row)))
                .collect::<Result<_, _>>()?;
            // Parity covers the backups' tags (kind = backup), which equal the primaries'
            // in all but the kind byte.
            for t in &mut data_tags {
                set_kind(t, self.tag_bytes, KIND_BACKUP);
            }
            let refs: Vec<&[u8]> = data_tags.iter().map(|t| t.as_slice()).collect();
            let mut striped = true;
            for r in 0..m {
                let mut want = vec![0u8; self.tag_bytes];
                self.codec
                    .encode_row(r, &refs, &mut want)
                    .map_err(|_| DeviceError::Failed)?;
                if self.tags_of(self.parity_member(row, r), self.hh_lba(row))? != want {
                    striped = false;
                }
            }
            if striped {
                self.stripes[row as usize].state = HhState::Striped;
                self.stripes[row as usize].filled = k as u32;
                continue;
            }
            // In replication: find the HG's VH on each parity member.
            let mut vhs = Vec::with_capacity(m);
            for r in 0..m {
                let p = self.parity_member(row, r);
                let found = slots
                    .iter()
                    .flatten()
                    .find_map(|key| backups[p].get(key).map(|&(vh, _)| vh));
                let Some(vh) = found else {
                    return Err(DeviceError::Unsupported(format!(
                        "row {row}: neither parity nor backups found"
                    )));
                };
                used_vhs[p][vh as usize] = true;
                self.members[p].vh_owner[vh as usize] = row;
                vhs.push(vh);
            }
            let s = &mut self.stripes[row as usize];
            s.vhs = vhs;
            s.filled = written as u32;
            s.state = HhState::Open;
            open_rows.push(row);
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
        self.clock = newest.values().map(|&(ts, _)| ts).max().unwrap_or(0);
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
        Ok(())
    }
}
