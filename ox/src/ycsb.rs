//! YCSB (Cooper et al., SoCC 2010): 8-byte keys, 100-byte values, a scrambled zipfian key
//! choice, the load phase, the paper's read-heavy and write-heavy phases, and workloads A–D.

use afa_sim::SimRng;
use serde::{Deserialize, Serialize};

/// Bytes of a YCSB key and value as in the paper.
pub const KEY_BYTES: u32 = 8;
pub const VALUE_BYTES: u32 = 100;

/// The zipfian constant YCSB uses.
pub const ZIPFIAN_THETA: f64 = 0.99;

/// YCSB's key of record number `i` (its "hashed" insert order): FNV-1a of the number, so
/// that consecutive inserts land all over the key space.
pub fn record_key(i: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in i.to_le_bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// YCSB's `ZipfianGenerator` (Gray et al., "Quickly generating billion-record synthetic
/// databases"): item 0 is the most popular.
#[derive(Debug, Clone)]
pub struct Zipfian {
    items: u64,
    theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
    half_pow_theta: f64,
}

fn zeta(n: u64, theta: f64) -> f64 {
    (1..=n).map(|i| 1.0 / (i as f64).powf(theta)).sum()
}

impl Zipfian {
    pub fn new(items: u64, theta: f64) -> Zipfian {
        let items = items.max(1);
        let zetan = zeta(items, theta);
        let zeta2 = zeta(2, theta);
        let alpha = 1.0 / (1.0 - theta);
        let eta = (1.0 - (2.0 / items as f64).powf(1.0 - theta)) / (1.0 - zeta2 / zetan);
        Zipfian {
            items,
            theta,
            alpha,
            zetan,
            eta,
            half_pow_theta: 1.0 + 0.5f64.powf(theta),
        }
    }

    pub fn items(&self) -> u64 {
        self.items
    }

    pub fn next(&self, rng: &mut SimRng) -> u64 {
        let u = rng.unit_f64();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < self.half_pow_theta {
            return 1.min(self.items - 1);
        }
        let v = (self.items as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        let _ = self.theta;
        v.min(self.items - 1)
    }
}

/// YCSB's `ScrambledZipfianGenerator`: zipfian popularity, with the popular items spread over
/// the key space by a hash.
#[derive(Debug, Clone)]
pub struct ScrambledZipfian {
    zipf: Zipfian,
    items: u64,
}

impl ScrambledZipfian {
    pub fn new(items: u64) -> ScrambledZipfian {
        ScrambledZipfian {
            zipf: Zipfian::new(items, ZIPFIAN_THETA),
            items: items.max(1),
        }
    }
    /// A record number in `0..items`.
    pub fn next(&self, rng: &mut SimRng) -> u64 {
        record_key(self.zipf.next(rng)) % self.items
    }
}

/// The workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// The paper's read-heavy phase: 19 reads, then 1 update, repeated.
    ReadHeavy,
    /// The paper's write-heavy phase: 19 updates, then 1 read, repeated.
    WriteHeavy,
    /// YCSB A: 50% reads, 50% updates, zipfian.
    A,
    /// YCSB B: 95% reads, 5% updates, zipfian.
    B,
    /// YCSB C: 100% reads, zipfian.
    C,
    /// YCSB D: 95% reads of the latest records, 5% inserts.
    D,
}

/// One operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum YcsbOp {
    Read(u64),
    Update(u64),
    Insert(u64),
}

/// Draws the operations of one workload over a data set of `records` records.
#[derive(Debug, Clone)]
pub struct Ycsb {
    workload: Workload,
    records: u64,
    zipf: ScrambledZipfian,
    latest: Zipfian,
    rng: SimRng,
    count: u64,
}

impl Ycsb {
    pub fn new(workload: Workload, records: u64, seed: u64) -> Ycsb {
        Ycsb {
            workload,
            records: records.max(1),
            zipf: ScrambledZipfian::new(records),
            latest: Zipfian::new(records, ZIPFIAN_THETA),
            rng: SimRng::fork(seed, 0x5943_5342), // "YCSB"
            count: 0,
        }
    }

    /// Records inserted so far (load plus workload D's inserts).
    pub fn records(&self) -> u64 {
        self.records
    }

    /// The keys of the load phase, in insert order.
    pub fn load_keys(records: u64) -> impl Iterator<Item = u64> {
        (0..records).map(record_key)
    }

    pub fn next_op(&mut self) -> YcsbOp {
        let n = self.count;
        self.count += 1;
        match self.workload {
            Workload::ReadHeavy => {
                let k = record_key(self.zipf.next(&mut self.rng));
                if n % 20 == 19 {
                    YcsbOp::Update(k)
                } else {
                    YcsbOp::Read(k)
                }
            }
            Workload::WriteHeavy => {
                let k = record_key(self.zipf.next(&mut self.rng));
                if n % 20 == 19 {
                    YcsbOp::Read(k)
                } else {
                    YcsbOp::Update(k)
                }
            }
            Workload::A | Workload::B | Workload::C => {
                let k = record_key(self.zipf.next(&mut self.rng));
                let read_fraction = match self.workload {
                    Workload::A => 0.5,
                    Workload::B => 0.95,
                    _ => 1.0,
                };
                if self.rng.chance(read_fraction) {
                    YcsbOp::Read(k)
                } else {
                    YcsbOp::Update(k)
                }
            }
            Workload::D => {
                if self.rng.chance(0.95) {
                    // "Latest": the most recently inserted records are the most popular.
                    let back = self.latest.next(&mut self.rng) % self.records;
                    YcsbOp::Read(record_key(self.records - 1 - back))
                } else {
                    let k = record_key(self.records);
                    self.records += 1;
                    YcsbOp::Insert(k)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipfian_favours_low_items_and_stays_in_range() {
        let z = Zipfian::new(1000, ZIPFIAN_THETA);
        let mut rng = SimRng::new(1);
        let mut counts = vec![0u32; 1000];
        for _ in 0..100_000 {
            counts[z.next(&mut rng) as usize] += 1;
        }
        // Item 0 takes about 1/zeta(1000) ≈ 13% of draws; the tail item almost none.
        assert!(counts[0] > 10_000 && counts[0] < 16_000, "{}", counts[0]);
        assert!(counts[0] > 5 * counts[10]);
        assert!(counts[999] < 100);
    }

    #[test]
    fn read_heavy_interleaves_19_reads_and_one_update() {
        let mut y = Ycsb::new(Workload::ReadHeavy, 100, 7);
        let ops: Vec<YcsbOp> = (0..40).map(|_| y.next_op()).collect();
        let updates = ops
            .iter()
            .filter(|o| matches!(o, YcsbOp::Update(_)))
            .count();
        assert_eq!(updates, 2);
        assert!(matches!(ops[19], YcsbOp::Update(_)));
        assert!(matches!(ops[39], YcsbOp::Update(_)));
        let mut w = Ycsb::new(Workload::WriteHeavy, 100, 7);
        let reads = (0..40)
            .filter(|_| matches!(w.next_op(), YcsbOp::Read(_)))
            .count();
        assert_eq!(reads, 2);
    }

    #[test]
    fn keys_come_from_the_loaded_records() {
        let keys: std::collections::BTreeSet<u64> = Ycsb::load_keys(500).collect();
        assert_eq!(keys.len(), 500);
        for w in [Workload::A, Workload::B, Workload::C, Workload::ReadHeavy] {
            let mut y = Ycsb::new(w, 500, 3);
            for _ in 0..2000 {
                let k = match y.next_op() {
                    YcsbOp::Read(k) | YcsbOp::Update(k) | YcsbOp::Insert(k) => k,
                };
                assert!(keys.contains(&k), "{w:?} drew an unknown key");
            }
        }
        let mut d = Ycsb::new(Workload::D, 500, 3);
        let inserts = (0..2000)
            .filter(|_| matches!(d.next_op(), YcsbOp::Insert(_)))
            .count();
        assert!((50..150).contains(&inserts), "{inserts}");
        assert_eq!(d.records(), 500 + inserts as u64);
    }
}
