//! Where each chunk of a volume lives: RAID levels as pure address arithmetic.

use serde::{Deserialize, Serialize};

/// The array engines that place data by a fixed layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Striping, no redundancy.
    Raid0,
    /// Every member holds a full copy.
    Raid1,
    /// Striping over mirrored pairs.
    Raid10,
    /// Striping with one dedicated parity member (the last).
    Raid4,
    /// Striping with rotating parity, left-symmetric (mdraid's default).
    Raid5,
    /// Striping with two rotating parity chunks, P and Q (Reed–Solomon rows 0 and 1).
    Raid6,
    /// RAID 5 that accepts only full-stripe writes, as SPDK's raid5f does.
    Raid5f,
}

impl std::fmt::Display for Level {
    /// The level as a configuration spells it (`array.level`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Level::Raid0 => "raid0",
            Level::Raid1 => "raid1",
            Level::Raid10 => "raid10",
            Level::Raid4 => "raid4",
            Level::Raid5 => "raid5",
            Level::Raid6 => "raid6",
            Level::Raid5f => "raid5f",
        })
    }
}

/// The placement of one stripe: which member holds each data chunk and each redundancy chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StripeMap {
    /// Member of data chunk i.
    pub data: Vec<usize>,
    /// Members of the redundancy chunks: parity rows for parity levels, copies for mirrors
    /// (one list of copies per data chunk, flattened: copy j of data chunk i is
    /// `redundancy[i * copies + j]`).
    pub redundancy: Vec<usize>,
}

/// The geometry of an array: how many members, data and redundancy chunks per stripe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub level: Level,
    pub members: usize,
    /// Data chunks per stripe.
    pub k: usize,
    /// Parity chunks per stripe (parity levels), or extra copies of each data chunk (mirrors).
    pub m: usize,
}

impl Layout {
    /// Checks the member count for the level.
    pub fn new(level: Level, members: usize) -> Result<Self, String> {
        let (min, k, m) = match level {
            Level::Raid0 => (1, members, 0),
            Level::Raid1 => (2, 1, members.saturating_sub(1)),
            Level::Raid10 => (2, members / 2, 1),
            Level::Raid4 | Level::Raid5 | Level::Raid5f => (3, members.saturating_sub(1), 1),
            Level::Raid6 => (4, members.saturating_sub(2), 2),
        };
        if members < min {
            return Err(format!(
                "array.members = {members}: {level} needs at least {min} members"
            ));
        }
        if level == Level::Raid10 && members % 2 != 0 {
            return Err(format!(
                "array.members = {members}: raid10 needs an even number of members"
            ));
        }
        Ok(Self {
            level,
            members,
            k,
            m,
        })
    }

    /// Whether redundancy is parity (computed) rather than copies.
    pub fn is_parity(&self) -> bool {
        matches!(
            self.level,
            Level::Raid4 | Level::Raid5 | Level::Raid6 | Level::Raid5f
        )
    }

    /// Members that can fail without losing data.
    pub fn tolerance(&self) -> usize {
        match self.level {
            Level::Raid0 => 0,
            Level::Raid1 => self.members - 1,
            // One failure per pair is survived; only one is guaranteed.
            Level::Raid10 => 1,
            _ => self.m,
        }
    }

    /// Placement of stripe `stripe`.
    pub fn stripe(&self, stripe: u64) -> StripeMap {
        let n = self.members;
        match self.level {
            Level::Raid0 => StripeMap {
                data: (0..n).collect(),
                redundancy: Vec::new(),
            },
            Level::Raid1 => {
                // Rotate which copy is "primary" so reads spread over the members.
                let first = (stripe % n as u64) as usize;
                StripeMap {
                    data: vec![first],
                    redundancy: (1..n).map(|j| (first + j) % n).collect(),
                }
            }
            Level::Raid10 => StripeMap {
                data: (0..n / 2).map(|i| 2 * i).collect(),
                redundancy: (0..n / 2).map(|i| 2 * i + 1).collect(),
            },
            Level::Raid4 => StripeMap {
                data: (0..n - 1).collect(),
                redundancy: vec![n - 1],
            },
            Level::Raid5 | Level::Raid5f => {
                // Left-symmetric: parity walks backwards from the last member and data starts
                // just after it, so consecutive chunks land on consecutive members.
                let p = n - 1 - (stripe % n as u64) as usize;
                StripeMap {
                    data: (0..n - 1).map(|i| (p + 1 + i) % n).collect(),
                    redundancy: vec![p],
                }
            }
            Level::Raid6 => {
                let p = n - 1 - (stripe % n as u64) as usize;
                let q = (p + 1) % n;
                StripeMap {
                    data: (0..n - 2).map(|i| (p + 2 + i) % n).collect(),
                    redundancy: vec![p, q],
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_member_appears_once_per_stripe() {
        for (level, n) in [
            (Level::Raid0, 3),
            (Level::Raid1, 3),
            (Level::Raid10, 4),
            (Level::Raid4, 5),
            (Level::Raid5, 5),
            (Level::Raid6, 6),
            (Level::Raid5f, 3),
        ] {
            let layout = Layout::new(level, n).unwrap();
            for s in 0..12 {
                let map = layout.stripe(s);
                let mut seen: Vec<usize> =
                    map.data.iter().chain(&map.redundancy).copied().collect();
                seen.sort();
                assert_eq!(seen, (0..n).collect::<Vec<_>>(), "{level:?} stripe {s}");
            }
        }
    }

    #[test]
    fn raid5_is_left_symmetric() {
        let l = Layout::new(Level::Raid5, 4).unwrap();
        assert_eq!(l.stripe(0).redundancy, vec![3]);
        assert_eq!(l.stripe(0).data, vec![0, 1, 2]);
        assert_eq!(l.stripe(1).redundancy, vec![2]);
        assert_eq!(l.stripe(1).data, vec![3, 0, 1]);
    }

    #[test]
    fn too_few_members_is_an_error() {
        assert!(Layout::new(Level::Raid6, 3)
            .unwrap_err()
            .contains("at least 4"));
        assert!(Layout::new(Level::Raid10, 5).unwrap_err().contains("even"));
    }
}
