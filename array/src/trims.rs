//! Trim records of the log-structured engines (SWAN, Log-RAID).
//!
//! A log-structured engine rebuilds its map after a crash from the segment summaries, taking
//! for every logical block the copy with the highest write sequence number. A trim leaves no
//! copy, so without a record of it the rebuild would hand a trimmed block its last written
//! data back from an older segment. A trim of blocks that held data is therefore appended to
//! the log as a *trim record*: one block, with a write sequence number of its own, whose
//! summary entry has the reserved address [`TRIM_RECORD`] and whose bytes hold the range. The
//! rebuild treats it as a write of every block of the range.
//!
//! A record stays a valid block of its segment (cleaning moves it, keeping its number) while
//! any block of its range still has the trim as its newest operation: until that block is
//! written again, an older copy of it may lie in a segment not yet cleaned.

use std::collections::BTreeMap;

use afa_nand::{fill_unit, sector_token};

use crate::swan::{fnv1a, seal_block, NewestMap};

const NONE: u32 = u32::MAX;

/// The summary address of a trim record. Volumes have fewer logical blocks than physical
/// ones, and fewer than `u32::MAX - 1` physical ones, so no logical block has this address.
pub const TRIM_RECORD: u32 = u32::MAX - 1;

/// Magic at the start of a trim record.
pub const TRIM_MAGIC: &[u8; 8] = b"SWANTRIM";

/// Encodes a trim record of logical blocks `start..start + count` made by the operation of
/// write sequence number `wseq`: magic, start, count, write sequence number and an FNV-1a
/// checksum. Returns None if it does not fit in `unit` bytes.
pub fn encode_trim_record(start: u32, count: u32, wseq: u64, unit: usize) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(32);
    out.extend_from_slice(TRIM_MAGIC);
    out.extend_from_slice(&start.to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&wseq.to_le_bytes());
    seal_block(out, unit)
}

/// Decodes a trim record written by [`encode_trim_record`]: (start, count, write sequence
/// number); None unless magic and checksum match.
pub fn decode_trim_record(block: &[u8]) -> Option<(u32, u32, u64)> {
    if block.len() < 32 || &block[..8] != TRIM_MAGIC {
        return None;
    }
    let sum = u64::from_le_bytes(block[24..32].try_into().ok()?);
    if fnv1a(&block[..24]) != sum {
        return None;
    }
    let start = u32::from_le_bytes(block[8..12].try_into().ok()?);
    let count = u32::from_le_bytes(block[12..16].try_into().ok()?);
    let wseq = u64::from_le_bytes(block[16..24].try_into().ok()?);
    Some((start, count, wseq))
}

/// The block a trim record holds: its encoding, or in a payload mode too small for it
/// (tokens, none) a token of its range and number, as any other block there.
pub(crate) fn trim_record_bytes(start: u32, count: u32, wseq: u64, unit: usize) -> Vec<u8> {
    encode_trim_record(start, count, wseq, unit).unwrap_or_else(|| {
        let mut block = vec![0u8; unit];
        fill_unit(sector_token(start as u64, wseq), &mut block);
        block
    })
}

/// A live trim record: the range it trimmed and how many of those blocks still have the
/// trim as their newest operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TrimRecord {
    start: u32,
    count: u32,
    live: u32,
}

/// An engine's live trim records.
#[derive(Debug, Clone)]
pub(crate) struct Trims {
    /// Per logical block, the physical block of the record holding its newest operation
    /// (NONE when that is a write, or the block never held data).
    trim_of: Vec<u32>,
    /// The live records by physical block.
    records: BTreeMap<u32, TrimRecord>,
}

impl Trims {
    pub fn new(logical_blocks: usize) -> Self {
        Self {
            trim_of: vec![NONE; logical_blocks],
            records: BTreeMap::new(),
        }
    }

    /// Whether a trim of `start..start + count` must be logged: some block of it holds data
    /// or an earlier trim. A block never written since the volume was made has no older copy
    /// to come back.
    pub fn must_log(&self, l2p: &[u32], start: u32, count: u32) -> bool {
        (start as usize..start as usize + count as usize)
            .any(|l| l2p[l] != NONE || self.trim_of[l] != NONE)
    }

    /// The record at physical block `record` now holds the newest operation of every block
    /// of `start..start + count` that holds data or an earlier trim; those blocks are
    /// unmapped in `l2p`. Returns the physical blocks no longer valid: the data the trim
    /// deallocated, and earlier records that now hold nothing.
    pub fn record(&mut self, record: u32, start: u32, count: u32, l2p: &mut [u32]) -> Vec<u32> {
        let mut invalid = Vec::new();
        let mut live = 0;
        let range = start as usize..start as usize + count as usize;
        for (l, mapped) in range.clone().zip(&mut l2p[range]) {
            let old = std::mem::replace(mapped, NONE);
            if old != NONE {
                invalid.push(old);
            } else if self.trim_of[l] == NONE {
                continue;
            }
            invalid.extend(self.untrim(l as u32));
            self.trim_of[l] = record;
            live += 1;
        }
        self.records
            .insert(record, TrimRecord { start, count, live });
        invalid
    }

    /// Maps the block appended at `physical` for `lba`; a trim record (`lba` is
    /// [`TRIM_RECORD`]) is only marked, its caller maps the range (`record`, or `moved` when
    /// cleaning copies it). Returns the blocks no longer valid: the record that held `lba`'s
    /// newest operation if it now holds nothing, and `lba`'s older copy.
    pub fn map_appended(
        &mut self,
        l2p: &mut [u32],
        p2l: &mut [u32],
        lba: u32,
        physical: u32,
    ) -> [Option<u32>; 2] {
        p2l[physical as usize] = lba;
        if lba == TRIM_RECORD {
            return [None, None];
        }
        let record = self.untrim(lba);
        let old = std::mem::replace(&mut l2p[lba as usize], physical);
        [record, (old != NONE).then_some(old)]
    }

    /// A write (or a newer trim) of `lba` ends the trim that was its newest operation.
    /// Returns that trim's record when it now holds nothing, and is no longer valid.
    pub fn untrim(&mut self, lba: u32) -> Option<u32> {
        // Every block whose newest operation is a trim has its record live, so with no live
        // record there is nothing to end. Most volumes never see a trim, and this spares
        // every write a cache miss on `trim_of` (12% of `swan-fig4a`'s time before).
        if self.records.is_empty() {
            return None;
        }
        let record = std::mem::replace(&mut self.trim_of[lba as usize], NONE);
        if record == NONE {
            return None;
        }
        let r = self
            .records
            .get_mut(&record)
            .expect("a trimmed block's record is live");
        r.live -= 1;
        if r.live > 0 {
            return None;
        }
        self.records.remove(&record);
        Some(record)
    }

    /// Cleaning copied the record at `from` to `to`: the blocks it holds follow it.
    pub fn moved(&mut self, from: u32, to: u32) {
        let r = self
            .records
            .remove(&from)
            .expect("cleaning moves live trim records only");
        for l in r.start as usize..r.start as usize + r.count as usize {
            if self.trim_of[l] == from {
                self.trim_of[l] = to;
            }
        }
        self.records.insert(to, r);
    }

    /// Installs the map `newest` assembled, after it took in every trim record
    /// ([`NewestMap::install`]); the records still holding a block's newest operation are
    /// live again, valid blocks of their segments (of `segment_blocks`) with their write
    /// sequence numbers.
    pub fn install_rebuilt(
        &mut self,
        newest: &NewestMap,
        l2p: &mut [u32],
        p2l: &mut [u32],
        wseq: &mut [u64],
        valid: &mut [u32],
        segment_blocks: u32,
    ) {
        newest.install(l2p, p2l, wseq, valid, segment_blocks);
        let found = &newest.trims_found;
        self.trim_of = newest.trim_of();
        self.records.clear();
        for &r in self.trim_of.iter().filter(|&&r| r != NONE) {
            let (start, count, _) = found[&r];
            self.records
                .entry(r)
                .or_insert(TrimRecord {
                    start,
                    count,
                    live: 0,
                })
                .live += 1;
        }
        for &r in self.records.keys() {
            p2l[r as usize] = TRIM_RECORD;
            wseq[r as usize] = found[&r].2;
            valid[(r / segment_blocks) as usize] += 1;
        }
    }

    /// The live records' physical blocks.
    pub fn live_records(&self) -> impl Iterator<Item = u32> + '_ {
        self.records.keys().copied()
    }

    /// How many blocks each live record holds, in the order of their physical blocks.
    #[cfg(test)]
    pub fn live_counts(&self) -> Vec<u32> {
        self.records.values().map(|r| r.live).collect()
    }

    /// Panics unless every trimmed block is unmapped and lies in its record's range, every
    /// record's count is its trimmed blocks and `p2l` marks every record.
    pub fn check(&self, l2p: &[u32], p2l: &[u32]) {
        let mut live = BTreeMap::new();
        for (lba, &r) in self.trim_of.iter().enumerate() {
            if r != NONE {
                assert_eq!(l2p[lba], NONE, "{lba} is both mapped and trimmed");
                let rec = self.records.get(&r).expect("trimmed by a live record");
                assert!(
                    (rec.start as usize..(rec.start + rec.count) as usize).contains(&lba),
                    "{lba} is trimmed by record {r}, whose range does not hold it"
                );
                *live.entry(r).or_insert(0u32) += 1;
            }
        }
        for (&r, rec) in &self.records {
            assert_eq!(p2l[r as usize], TRIM_RECORD, "record {r} is not mapped");
            assert_eq!(
                live.get(&r).copied(),
                Some(rec.live),
                "record {r}'s live count"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::swan::{decode_summary, encode_summary};

    #[test]
    fn trim_records_round_trip_and_reject_corruption() {
        let block = encode_trim_record(40, 9, 77, 512).unwrap();
        assert_eq!(decode_trim_record(&block), Some((40, 9, 77)));
        let mut bad = block.clone();
        bad[12] ^= 1;
        assert_eq!(decode_trim_record(&bad), None);
        // A summary is not a trim record, nor the other way round.
        let summary = encode_summary(1, 1, &[(TRIM_RECORD, 77)], 512).unwrap();
        assert_eq!(decode_trim_record(&summary), None);
        assert_eq!(decode_summary(&block), None);
        assert_eq!(decode_summary(&summary).unwrap().2, vec![(TRIM_RECORD, 77)]);
        assert!(encode_trim_record(0, 1, 1, 8).is_none());
    }

    /// A newer trim takes the blocks of an older one; the older record dies with its last.
    #[test]
    fn a_record_dies_with_the_last_block_it_holds() {
        let mut t = Trims::new(16);
        let mut l2p = vec![NONE; 16];
        l2p[2..6].copy_from_slice(&[100, 101, 102, 103]);
        assert!(!t.must_log(&l2p, 8, 4), "never written");
        assert!(t.must_log(&l2p, 0, 4));
        assert_eq!(t.record(200, 0, 4, &mut l2p), vec![100, 101]);
        assert_eq!(t.live_counts(), vec![2]);
        // Blocks 2 and 3 hold the first trim, 4 and 5 data.
        assert_eq!(t.record(201, 2, 4, &mut l2p), vec![200, 102, 103]);
        assert_eq!(t.live_counts(), vec![4]);
        t.moved(201, 300);
        assert_eq!(t.live_records().collect::<Vec<_>>(), vec![300]);
        let mut p2l = vec![NONE; 400];
        p2l[300] = TRIM_RECORD;
        t.check(&l2p, &p2l);
        for l in 2..5 {
            assert_eq!(t.untrim(l), None);
        }
        assert_eq!(t.untrim(2), None, "a block is untrimmed once");
        assert_eq!(t.untrim(5), Some(300));
        assert!(t.live_counts().is_empty());
    }
}
