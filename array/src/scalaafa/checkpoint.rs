//! Periodic checkpoints of the AMT and HGMT (ScalaAFA §5.4: "periodical checkpoints … only
//! scanning the un-checkpointed metadata").
//!
//! A checkpoint is a snapshot of the host tables taken between two requests: every user
//! chunk's AFA chunk and the timestamp of its copy, and every stripe's state and VH list. It
//! is written as data to one of two slots at the end of every member (the slots alternate, so
//! a checkpoint cut short by a power loss never destroys the one before it), with a header
//! naming its sequence number and a checksum of its body. It counts once every live member
//! has its copy.
//!
//! What it saves: recovery reads the OOB tags only of the heroes a write could have reached
//! since the snapshot. That set is known because heroes are sealed and freed in a fixed way:
//! a stripe that was full, converting or striped at the snapshot keeps its content until it
//! is freed (by conversion for its VHs, by array-level GC or overwrites for its row), and a
//! hero freed after a snapshot is quarantined — not granted again — until a later checkpoint
//! has counted (F2FS keeps its "prefree" segments the same way). So every write after the
//! newest complete checkpoint went to a hero that was free, held or open at its snapshot,
//! and those are the heroes recovery scans; the sealed ones come from the checkpoint.
//!
//! The checkpoint's bytes survive only on members that keep whole sectors (`full` payload,
//! or file-backed members); with `token` or `none` payloads the slots are written for their
//! time alone and recovery falls back to scanning every OOB area.

use afa_ssd::{BlockDevice, DeviceError};

use super::*;
// The checksum of SWAN's segment summaries: enough to tell a whole checkpoint from a torn
// or stale one.
use crate::swan::fnv1a as checksum;

const MAGIC: u32 = 0x5343_4b50; // "SCKP"
const VERSION: u32 = 1;
/// Bytes of the header: magic, version, sequence, clock, k, m, rows, volume chunks, VHs per
/// member, body length and body checksum.
pub(super) const HEADER_BYTES: usize = 4 + 4 + 8 + 4 + 2 + 2 + 4 + 8 + 4 + 8 + 8;
/// Where the header's fields after the sequence number start: the clock, the shape, the
/// body's length and its checksum, which together stand for the tables a checkpoint holds.
const AFTER_SEQ: usize = 4 + 4 + 8;

/// A stripe's state as a checkpoint records it.
pub(super) const SNAP_UNSEALED: u8 = 0;
/// All k slots written, backups in its VHs (full or converting at the snapshot).
pub(super) const SNAP_REPLICATED: u8 = 1;
pub(super) const SNAP_STRIPED: u8 = 2;

/// The host tables as one checkpoint holds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Snapshot {
    pub seq: u64,
    /// The write clock at the snapshot: every later write has a larger timestamp.
    pub clock: u32,
    /// AMT: user chunk → AFA chunk, NONE if unwritten.
    pub amt: Vec<u32>,
    /// The timestamp of each mapped chunk's copy.
    pub amt_ts: Vec<u32>,
    /// Per stripe: `SNAP_*`.
    pub sealed: Vec<u8>,
    /// Per stripe, m VH numbers (NONE when it has none).
    pub vhs: Vec<u32>,
}

/// Sizes both the engine and recovery derive from the shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SnapshotShape {
    pub k: usize,
    pub m: usize,
    pub rows: u32,
    pub volume_chunks: u64,
    pub vhs_per_member: u32,
}

impl SnapshotShape {
    pub fn body_bytes(&self) -> usize {
        self.volume_chunks as usize * 8 + self.rows as usize * (1 + 4 * self.m)
    }
}

impl Snapshot {
    pub fn encode(&self, shape: &SnapshotShape) -> Vec<u8> {
        let mut body = Vec::with_capacity(shape.body_bytes());
        for &a in &self.amt {
            body.extend_from_slice(&a.to_le_bytes());
        }
        for &t in &self.amt_ts {
            body.extend_from_slice(&t.to_le_bytes());
        }
        body.extend_from_slice(&self.sealed);
        for &v in &self.vhs {
            body.extend_from_slice(&v.to_le_bytes());
        }
        debug_assert_eq!(body.len(), shape.body_bytes());
        let mut out = Vec::with_capacity(HEADER_BYTES + body.len());
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&self.clock.to_le_bytes());
        out.extend_from_slice(&(shape.k as u16).to_le_bytes());
        out.extend_from_slice(&(shape.m as u16).to_le_bytes());
        out.extend_from_slice(&shape.rows.to_le_bytes());
        out.extend_from_slice(&shape.volume_chunks.to_le_bytes());
        out.extend_from_slice(&shape.vhs_per_member.to_le_bytes());
        out.extend_from_slice(&(body.len() as u64).to_le_bytes());
        out.extend_from_slice(&checksum(&body).to_le_bytes());
        debug_assert_eq!(out.len(), HEADER_BYTES);
        out.extend_from_slice(&body);
        out
    }

    /// The checkpoint in `bytes` if it is whole and was written for a volume of `shape`.
    pub fn decode(bytes: &[u8], shape: &SnapshotShape) -> Option<Snapshot> {
        let mut at = 0usize;
        let mut take = |n: usize| -> Option<&[u8]> {
            let s = bytes.get(at..at + n)?;
            at += n;
            Some(s)
        };
        let u16_ = |s: &[u8]| u16::from_le_bytes(s.try_into().unwrap());
        let u32_ = |s: &[u8]| u32::from_le_bytes(s.try_into().unwrap());
        let u64_ = |s: &[u8]| u64::from_le_bytes(s.try_into().unwrap());
        if u32_(take(4)?) != MAGIC || u32_(take(4)?) != VERSION {
            return None;
        }
        let seq = u64_(take(8)?);
        let clock = u32_(take(4)?);
        let same_shape = u16_(take(2)?) as usize == shape.k
            && u16_(take(2)?) as usize == shape.m
            && u32_(take(4)?) == shape.rows
            && u64_(take(8)?) == shape.volume_chunks
            && u32_(take(4)?) == shape.vhs_per_member;
        let body_len = u64_(take(8)?) as usize;
        let sum = u64_(take(8)?);
        if !same_shape || body_len != shape.body_bytes() {
            return None;
        }
        let body = take(body_len)?;
        if checksum(body) != sum {
            return None;
        }
        let chunks = shape.volume_chunks as usize;
        let rows = shape.rows as usize;
        let words = |s: &[u8]| -> Vec<u32> { s.chunks_exact(4).map(u32_).collect() };
        let amt = words(&body[..chunks * 4]);
        let amt_ts = words(&body[chunks * 4..chunks * 8]);
        let sealed = body[chunks * 8..chunks * 8 + rows].to_vec();
        let vhs = words(&body[chunks * 8 + rows..]);
        if sealed.iter().any(|&s| s > SNAP_STRIPED) {
            return None;
        }
        Some(Snapshot {
            seq,
            clock,
            amt,
            amt_ts,
            sealed,
            vhs,
        })
    }
}

/// The engine's checkpoint bookkeeping.
#[derive(Debug, Clone, Default)]
pub(super) struct Checkpoints {
    /// Chunks of one slot (0: checkpoints are off).
    pub slot_chunks: u32,
    /// Sequence number of the next checkpoint.
    pub next_seq: u64,
    pub next_due_ns: TimeNs,
    /// What the newest checkpoint written holds (see `tables_fingerprint`), if one was.
    pub saved: Option<u64>,
    /// Heroes freed since the last snapshot: HH rows, and (member, VH).
    pub quarantine_hhs: Vec<u32>,
    pub quarantine_vhs: Vec<(usize, u32)>,
    /// Heroes freed before a snapshot whose checkpoint is still being written.
    pub releasing: Vec<Releasing>,
}

/// Heroes that return to the manager once a checkpoint counts.
#[derive(Debug, Clone, Default)]
pub(super) struct Releasing {
    pub counts_at_ns: TimeNs,
    pub hhs: Vec<u32>,
    pub vhs: Vec<(usize, u32)>,
}

/// Chunks of one checkpoint slot for a member of `chunks` chunks: sized for the largest
/// tables the member's space could hold, so that the slots can be placed before the rows
/// are known.
pub(super) fn slot_chunks(chunks: u64, k: usize, m: usize, chunk_bytes: u64) -> u32 {
    let bound = SnapshotShape {
        k,
        m,
        rows: chunks as u32,
        volume_chunks: chunks * k as u64,
        vhs_per_member: 0,
    };
    ((HEADER_BYTES + bound.body_bytes()) as u64).div_ceil(chunk_bytes) as u32
}

/// A checksum of an encoded checkpoint's header after its sequence number: two checkpoints
/// with the same fingerprint hold the same clock and (up to a 64-bit checksum) the same
/// tables. A collision would only skip a checkpoint while no hero waits in quarantine, which
/// is safe: every write since the newest checkpoint still went to a hero recovery scans.
fn tables_fingerprint(bytes: &[u8]) -> u64 {
    checksum(&bytes[AFTER_SEQ..HEADER_BYTES])
}

impl<D: BlockDevice> ScalaAfa<D> {
    pub(super) fn snapshot_shape(&self) -> SnapshotShape {
        SnapshotShape {
            k: self.k,
            m: self.m,
            rows: self.rows,
            volume_chunks: self.amt.len() as u64,
            vhs_per_member: self.vhs_per_member,
        }
    }

    /// First sector of chunk `i` of checkpoint slot `slot` on every member.
    pub(super) fn checkpoint_lba(&self, slot: u64, i: u32) -> u64 {
        let first_chunk = self.rows as u64
            + self.vhs_per_member as u64 * self.k as u64
            + slot * self.checkpoints.slot_chunks as u64;
        (first_chunk + i as u64) * self.chunk_sectors as u64
    }

    /// Whether checkpoints are written.
    pub(super) fn checkpointing(&self) -> bool {
        self.checkpoints.slot_chunks > 0
    }

    /// Returns a freed HH row to the manager, or to quarantine until the next checkpoint.
    pub(super) fn release_hh(&mut self, row: u32) {
        if self.checkpointing() {
            self.checkpoints.quarantine_hhs.push(row);
        } else {
            self.manager.free_hhs.push_back(row);
        }
    }

    /// Returns a freed VH to the manager, or to quarantine until the next checkpoint.
    pub(super) fn release_vh(&mut self, member: usize, vh: u32) {
        if self.checkpointing() {
            self.checkpoints.quarantine_vhs.push((member, vh));
        } else {
            self.manager.free_vhs[member].push_back(vh);
        }
    }

    /// HH rows free, or freed and waiting for a checkpoint or a flush: array-level GC need
    /// not clean while those will hand rows back anyway.
    pub(super) fn reclaimed_hhs(&self) -> usize {
        self.manager.free_hhs.len()
            + (self.unflushed.iter().map(|(_, h)| h))
                .chain(&self.replaced)
                .filter(|h| matches!(h, Held::Row(_)))
                .count()
            + self.checkpoints.quarantine_hhs.len()
            + self
                .checkpoints
                .releasing
                .iter()
                .map(|r| r.hhs.len())
                .sum::<usize>()
            + self.remote.as_ref().map_or(0, |r| r.waiting_hhs())
    }

    /// Hands the manager the heroes of every checkpoint that has counted by `now_ns`.
    pub(super) fn release_checkpointed(&mut self, now_ns: TimeNs) {
        let mut i = 0;
        while i < self.checkpoints.releasing.len() {
            if self.checkpoints.releasing[i].counts_at_ns <= now_ns {
                let r = self.checkpoints.releasing.swap_remove(i);
                self.manager.free_hhs.extend(r.hhs);
                for (p, vh) in r.vhs {
                    self.manager.free_vhs[p].push_back(vh);
                }
            } else {
                i += 1;
            }
        }
    }

    /// Takes a checkpoint if one is due and something has changed since the last one.
    ///
    /// A checkpoint of the very tables the newest one holds, with no hero waiting in
    /// quarantine, would save recovery nothing, so it is not written; the timer is re-armed
    /// all the same. This is also what lets an idle volume come to rest: a checkpoint's
    /// member writes wake the daemon when they complete, and when writing one takes longer
    /// than the interval (tiny chunks make the slots, sized for the largest tables a member
    /// could hold, many chunks long) the next one is already due by then, so rewriting
    /// unchanged tables would keep the host's idle loop going forever.
    pub(super) fn checkpoint_if_due(&mut self, now_ns: TimeNs) -> Result<(), DeviceError> {
        if self.checkpointing() && now_ns >= self.checkpoints.next_due_ns {
            let bytes = self.take_snapshot(now_ns);
            let unchanged = self.checkpoints.quarantine_hhs.is_empty()
                && self.checkpoints.quarantine_vhs.is_empty()
                && self.checkpoints.saved == Some(tables_fingerprint(&bytes));
            if !unchanged {
                self.write_checkpoint(now_ns, &bytes)?;
            }
        }
        self.release_checkpointed(now_ns);
        Ok(())
    }

    /// Snapshots the tables and writes them to the next slot of every writable member, on
    /// the daemon. Returns when the checkpoint counts; the heroes quarantined before the
    /// snapshot are released then.
    pub(super) fn checkpoint(&mut self, now_ns: TimeNs) -> Result<TimeNs, DeviceError> {
        let bytes = self.take_snapshot(now_ns);
        self.write_checkpoint(now_ns, &bytes)
    }

    /// Re-arms the checkpoint timer and encodes the tables as the next checkpoint.
    fn take_snapshot(&mut self, now_ns: TimeNs) -> Vec<u8> {
        let interval_ns = (self.scala.checkpoint_interval_ms * 1e6) as u64;
        self.checkpoints.next_due_ns = now_ns + interval_ns.max(1);
        let snap = self.snapshot(self.checkpoints.next_seq);
        snap.encode(&self.snapshot_shape())
    }

    /// Writes the checkpoint `take_snapshot` encoded; see `checkpoint`.
    fn write_checkpoint(&mut self, now_ns: TimeNs, bytes: &[u8]) -> Result<TimeNs, DeviceError> {
        let seq = self.checkpoints.next_seq;
        self.checkpoints.next_seq += 1;
        let cu = self.chunk_units();
        let full_sectors = self.unit == self.info.sector_bytes as usize;
        let chunks = (bytes.len() as u64).div_ceil(self.config.chunk_bytes) as u32;
        debug_assert!(chunks <= self.checkpoints.slot_chunks);
        let mut done = now_ns;
        self.background_depth += 1;
        let mut result = Ok(());
        'members: for p in 0..self.members.len() {
            if !self.writable(p) {
                continue;
            }
            for i in 0..chunks {
                // Members that keep only tokens or nothing cannot hold the bytes: the slot
                // is written for its time alone, and recovery will not find it whole.
                let mut buf = vec![0u8; cu];
                if full_sectors {
                    let from = i as usize * cu;
                    let piece = &bytes[from.min(bytes.len())..(from + cu).min(bytes.len())];
                    buf[..piece.len()].copy_from_slice(piece);
                }
                let issue = self.daemon_at(now_ns, self.scala.daemon_command_ns);
                let lba = self.checkpoint_lba(seq % 2, i);
                match self.member_write(p, lba, issue, &buf, None, false) {
                    Ok(t) => done = done.max(t),
                    Err(e) => {
                        result = Err(e);
                        break 'members;
                    }
                }
            }
        }
        self.background_depth -= 1;
        result?;
        // The interval runs from the end of the checkpoint. Counted from its start, a
        // checkpoint that takes longer than the interval (a large table on small members)
        // would have the next one due at once, and checkpoints would run back to back,
        // holding the members from user writes: the config soak's seed 15971 (5 ms on a
        // 200 KB table) wrote 18.7 GB of checkpoints for 540 MB of user data.
        let interval_ns = (self.scala.checkpoint_interval_ms * 1e6) as u64;
        self.checkpoints.next_due_ns = self.checkpoints.next_due_ns.max(done + interval_ns.max(1));
        self.stats.checkpoints += 1;
        self.stats.checkpoint_bytes += bytes.len() as u64;
        self.checkpoints.saved = Some(tables_fingerprint(bytes));
        let hhs = std::mem::take(&mut self.checkpoints.quarantine_hhs);
        let vhs = std::mem::take(&mut self.checkpoints.quarantine_vhs);
        self.checkpoints.releasing.push(Releasing {
            counts_at_ns: done,
            hhs,
            vhs,
        });
        Ok(done)
    }

    /// The tables as a checkpoint records them.
    fn snapshot(&self, seq: u64) -> Snapshot {
        let m = self.m;
        let mut sealed = Vec::with_capacity(self.rows as usize);
        let mut vhs = Vec::with_capacity(self.rows as usize * m);
        for s in &self.stripes {
            sealed.push(match s.state {
                HhState::Free | HhState::Held | HhState::Open => SNAP_UNSEALED,
                HhState::Full | HhState::Converting => SNAP_REPLICATED,
                HhState::Striped => SNAP_STRIPED,
            });
            for r in 0..m {
                vhs.push(s.vhs.get(r).copied().unwrap_or(NONE));
            }
        }
        Snapshot {
            seq,
            clock: self.current_clock(),
            amt: self.amt.clone(),
            amt_ts: self.amt_ts.clone(),
            sealed,
            vhs,
        }
    }

    /// The newest whole checkpoint any member holds (the `failed` are not read), if any.
    pub(super) fn newest_checkpoint(&mut self, failed: &[usize]) -> Option<Snapshot> {
        if !self.checkpointing() || self.unit != self.info.sector_bytes as usize {
            return None;
        }
        let shape = self.snapshot_shape();
        let len = HEADER_BYTES + shape.body_bytes();
        let chunks = (len as u64).div_ceil(self.config.chunk_bytes) as u32;
        let cu = self.chunk_units();
        let mut best: Option<Snapshot> = None;
        for p in 0..self.members.len() {
            if failed.contains(&p) {
                continue;
            }
            for slot in 0..2 {
                let mut bytes = vec![0u8; chunks as usize * cu];
                let mut readable = true;
                for i in 0..chunks {
                    let lba = self.checkpoint_lba(slot, i);
                    let buf = &mut bytes[i as usize * cu..(i as usize + 1) * cu];
                    if self
                        .member_read(p, lba, self.chunk_sectors, 0, buf)
                        .is_err()
                    {
                        readable = false;
                        break;
                    }
                }
                if !readable {
                    continue;
                }
                if let Some(s) = Snapshot::decode(&bytes, &shape) {
                    if best.as_ref().is_none_or(|b| s.seq > b.seq) {
                        best = Some(s);
                    }
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> SnapshotShape {
        SnapshotShape {
            k: 3,
            m: 2,
            rows: 4,
            volume_chunks: 6,
            vhs_per_member: 9,
        }
    }

    fn snap() -> Snapshot {
        Snapshot {
            seq: 7,
            clock: 42,
            amt: vec![0, NONE, 5, 11, NONE, 2],
            amt_ts: vec![3, 0, 9, 41, 0, 12],
            sealed: vec![SNAP_STRIPED, SNAP_REPLICATED, SNAP_UNSEALED, SNAP_UNSEALED],
            vhs: vec![NONE, NONE, 4, 8, NONE, NONE, 1, NONE],
        }
    }

    #[test]
    fn a_checkpoint_decodes_to_what_was_encoded() {
        let bytes = snap().encode(&shape());
        assert_eq!(bytes.len(), HEADER_BYTES + shape().body_bytes());
        // Trailing bytes (the rest of the slot) do not matter.
        let mut padded = bytes.clone();
        padded.resize(bytes.len() + 100, 0xee);
        assert_eq!(Snapshot::decode(&padded, &shape()), Some(snap()));
    }

    #[test]
    fn a_torn_stale_or_foreign_checkpoint_is_refused() {
        let bytes = snap().encode(&shape());
        // Cut short: part of the body never reached the member.
        assert_eq!(Snapshot::decode(&bytes[..bytes.len() - 1], &shape()), None);
        // One byte of the body differs from what the checksum covers.
        let mut flipped = bytes.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(Snapshot::decode(&flipped, &shape()), None);
        // Written for another shape of volume.
        let other = SnapshotShape { rows: 5, ..shape() };
        assert_eq!(Snapshot::decode(&bytes, &other), None);
        // An erased slot.
        assert_eq!(Snapshot::decode(&vec![0; bytes.len()], &shape()), None);
    }
}
