//! Power loss and recovery of the key-value store on both interfaces, against an oracle of
//! every state its records went through.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;
use crate::ycsb::{Workload, Ycsb, YcsbOp};

/// The store's shape in a test.
#[derive(Debug, Clone, Copy)]
struct Shape {
    /// Write buffer pages: 16 puts flush boundaries among the pages of a split often; the
    /// paper's 256 (1 MiB) makes a block flush 17 packets, whose contexts interleave with
    /// the next flush's and with checkpoint writes.
    buffer_pages: u64,
    /// Block host GC start and stop fractions: low, it cleans often between flushes; at
    /// 0.99 the log runs out of free segments and a flush must clean one while it is being
    /// assembled.
    gc_used_fraction: (f64, f64),
    /// The host link's bandwidth: slow, a 1 MiB flush's packets arrive over milliseconds,
    /// and the contexts of the next flush, of host checkpoint writes and of trims start
    /// among them.
    link_mb_s: Option<f64>,
    /// The device acknowledges flushes from its write-back cache and drains it on backup
    /// power when the power fails.
    device_write_back: bool,
    /// One page program in 500 fails, and log blocks have one forward link: a log block
    /// whose program fails has no other link and is bridged (`OxController::bridge_log`).
    failing_flash: bool,
}

const SMALL_BUFFER: Shape = Shape {
    buffer_pages: 16,
    gc_used_fraction: (0.2, 0.15),
    link_mb_s: None,
    device_write_back: false,
    failing_flash: false,
};
const SHAPES: [Shape; 6] = [
    SMALL_BUFFER,
    Shape {
        buffer_pages: 256,
        gc_used_fraction: (0.2, 0.15),
        link_mb_s: None,
        device_write_back: false,
        failing_flash: false,
    },
    Shape {
        buffer_pages: 16,
        gc_used_fraction: (0.99, 0.99),
        link_mb_s: None,
        device_write_back: false,
        failing_flash: false,
    },
    Shape {
        buffer_pages: 256,
        gc_used_fraction: (0.2, 0.15),
        link_mb_s: Some(100.0),
        device_write_back: false,
        failing_flash: false,
    },
    WRITE_BACK_DEVICE,
    FAILING_FLASH,
];
const WRITE_BACK_DEVICE: Shape = Shape {
    buffer_pages: 256,
    gc_used_fraction: (0.2, 0.15),
    link_mb_s: None,
    device_write_back: true,
    failing_flash: false,
};
const FAILING_FLASH: Shape = Shape {
    buffer_pages: 16,
    gc_used_fraction: (0.2, 0.15),
    link_mb_s: None,
    device_write_back: false,
    failing_flash: true,
};

fn config(interface: Interface, shape: Shape) -> KvConfig {
    let mut cfg = KvConfig::scaled(30_000, interface, 0.2);
    cfg.device.checkpoint.interval_ns = 20_000_000;
    cfg.host_checkpoint_interval_ns = 20_000_000;
    (
        cfg.host_gc_start_used_fraction,
        cfg.host_gc_stop_used_fraction,
    ) = shape.gc_used_fraction;
    cfg.page_images = true;
    cfg.write_buffer_bytes = shape.buffer_pages * PAGE_BYTES;
    if let Some(mb_s) = shape.link_mb_s {
        cfg.device.costs.link_mb_s = mb_s;
    }
    cfg.device.write_cache.write_back = shape.device_write_back;
    if shape.failing_flash {
        cfg.device.faults.program_fail_probability = 0.002;
        cfg.device.log_forward_links = 1;
    }
    cfg
}

/// A write-heavy stream with every third operation an insert of a new key, so that leaves
/// and inner pages split: operations that change several pages.
struct Ops {
    ycsb: Ycsb,
    seed: u64,
    n: u64,
}

impl Ops {
    fn new(kv: &KvStore, seed: u64) -> Ops {
        Ops {
            ycsb: Ycsb::new(Workload::WriteHeavy, kv.cfg.records, seed),
            seed,
            n: 0,
        }
    }
    fn next_op(&mut self) -> YcsbOp {
        self.n += 1;
        if self.n % 3 == 0 {
            YcsbOp::Insert(sector_token(self.seed ^ 0x5eed, self.n))
        } else {
            self.ycsb.next_op()
        }
    }
}

/// Every state the records went through since the load: the changes in order, and for each
/// flush the number of changes made before the operation that submitted it began.
#[derive(Default)]
struct History {
    changes: Vec<(u64, Option<u32>)>,
    flush_start: Vec<usize>,
}

impl History {
    fn after_load(kv: &KvStore) -> History {
        History {
            changes: Vec::new(),
            flush_start: vec![0; kv.next_flush as usize],
        }
    }

    /// Runs `ops` operations, recording what each changed.
    fn drive(&mut self, kv: &mut KvStore, stream: &mut Ops, ops: u64) {
        for _ in 0..ops {
            let op = stream.next_op();
            let key = match op {
                YcsbOp::Read(_) => None,
                YcsbOp::Update(k) | YcsbOp::Insert(k) => Some(k),
            };
            let prev = key.map(|k| kv.records.get(&k).copied());
            let (flushes, at) = (kv.next_flush, self.changes.len());
            kv.step(op).unwrap();
            for _ in flushes..kv.next_flush {
                self.flush_start.push(at);
            }
            if let (Some(k), Some(prev)) = (key, prev) {
                if kv.records.get(&k).copied() != prev {
                    self.changes.push((k, prev));
                }
            }
        }
    }

    /// Which state the recovered records are: the number of changes it holds, at or after
    /// the operation that submitted the newest flush acknowledged with all before it.
    fn find(
        &self,
        recovered: &BTreeMap<u64, u32>,
        current: &BTreeMap<u64, u32>,
        acknowledged_flushes: u64,
    ) -> Result<usize, String> {
        let lower = match acknowledged_flushes {
            0 => 0,
            n => self.flush_start[n as usize - 1],
        };
        let mut state = current.clone();
        let mut differ: BTreeSet<u64> = state
            .keys()
            .chain(recovered.keys())
            .filter(|k| state.get(k) != recovered.get(k))
            .copied()
            .collect();
        let mut at = self.changes.len();
        loop {
            if differ.is_empty() {
                return Ok(at);
            }
            if at == lower {
                let k = differ.first().copied().unwrap_or(0);
                return Err(format!(
                    "the recovered records match no operation boundary since the newest \
                     acknowledged flush ({} changes ago): {} keys differ at the oldest, e.g. \
                     {k:#x}: recovered {:?}, then {:?}",
                    self.changes.len() - lower,
                    differ.len(),
                    recovered.get(&k),
                    state.get(&k)
                ));
            }
            at -= 1;
            let (k, prev) = self.changes[at];
            match prev {
                Some(v) => state.insert(k, v),
                None => state.remove(&k),
            };
            if state.get(&k) == recovered.get(&k) {
                differ.remove(&k);
            } else {
                differ.insert(k);
            }
        }
    }
}

/// Where the power fails.
#[derive(Debug, Clone, Copy)]
enum Cut {
    /// `delay_ns` after the host's clock once `ops` operations ran.
    After { ops: u64, delay_ns: u64 },
    /// At the host's clock right after the operation during which the `n`-th flush since
    /// the load became acknowledged with every flush before it: the flush after it is most
    /// likely still in flight, so the device holds one and not the other.
    AtAck { n: u64 },
}

/// Loads, runs the operation stream until the cut, cuts the power, recovers, checks the
/// records against every state since the newest acknowledged flush, and runs `after` more
/// operations without a mismatch. Returns the store and the report.
fn cut_and_recover(
    interface: Interface,
    shape: Shape,
    seed: u64,
    cut: Cut,
    after: u64,
) -> (KvStore, KvRecoveryReport) {
    let mut kv = KvStore::new(config(interface, shape), seed).unwrap();
    kv.load().unwrap();
    let mut hist = History::after_load(&kv);
    let mut stream = Ops::new(&kv, seed);
    let delay_ns = match cut {
        Cut::After { ops, delay_ns } => {
            hist.drive(&mut kv, &mut stream, ops);
            delay_ns
        }
        Cut::AtAck { n } => {
            let target = kv.acknowledged_flushes() + n;
            for _ in 0..200_000 {
                if kv.acknowledged_flushes() >= target {
                    break;
                }
                hist.drive(&mut kv, &mut stream, 1);
            }
            assert!(
                kv.acknowledged_flushes() >= target,
                "{interface:?} {shape:?}: too few flushes"
            );
            0
        }
    };
    assert_eq!(kv.stats.mismatches, 0);
    let (current, acked, now) = (kv.records.clone(), kv.acknowledged_flushes(), kv.now_ns);
    let off = kv.power_loss(now + delay_ns);
    let (mut back, report) = KvStore::recover(off, now + delay_ns).unwrap();
    let at = hist
        .find(&back.records, &current, acked)
        .unwrap_or_else(|e| panic!("{interface:?} {shape:?} seed {seed} {cut:?}: {e}\n{report:?}"));
    assert!(at <= hist.changes.len());
    back.device().check_invariants().unwrap();
    if after > 0 {
        let r = back.run(Workload::WriteHeavy, after, seed + 1).unwrap();
        assert_eq!(
            r.host.mismatches, 0,
            "{interface:?} after recovery: {report:?}"
        );
        back.device().check_invariants().unwrap();
    }
    (back, report)
}

const CUTS: [(u64, Cut); 6] = [
    (
        1,
        Cut::After {
            ops: 0,
            delay_ns: 0,
        },
    ),
    (
        2,
        Cut::After {
            ops: 700,
            delay_ns: 0,
        },
    ),
    (
        3,
        Cut::After {
            ops: 1_500,
            delay_ns: 300_000,
        },
    ),
    (
        4,
        Cut::After {
            ops: 3_000,
            delay_ns: 1_500_000,
        },
    ),
    (5, Cut::AtAck { n: 40 }),
    (6, Cut::AtAck { n: 97 }),
];

#[test]
fn the_batch_host_comes_back_to_an_operation_boundary_at_every_cut() {
    for (seed, cut) in CUTS {
        let (_, r) = cut_and_recover(Interface::Batch, SMALL_BUFFER, seed, cut, 500);
        assert!(r.flush.is_some(), "{r:?}");
        assert_eq!(r.checkpoint_seq, None);
        assert_eq!(r.segments_scanned, 0);
    }
}

#[test]
fn the_block_host_comes_back_to_an_operation_boundary_at_every_cut() {
    let mut replayed = 0;
    let mut from_checkpoint = 0;
    for (seed, cut) in CUTS {
        let (_, r) = cut_and_recover(Interface::Block, SMALL_BUFFER, seed, cut, 500);
        assert!(r.segments_scanned > 0, "{r:?}");
        replayed += r.flushes_replayed;
        from_checkpoint += u64::from(r.checkpoint_seq.is_some());
    }
    assert!(
        replayed > 0 && from_checkpoint > 0,
        "{replayed} {from_checkpoint}"
    );
}

/// On a device that acknowledges flushes from its write-back cache, both hosts come back to
/// an operation boundary no older than the newest acknowledged flush: the drain on backup
/// power keeps what the cache acknowledged.
#[test]
fn both_hosts_recover_on_a_device_with_a_write_back_cache() {
    for interface in [Interface::Batch, Interface::Block] {
        for (seed, cut) in CUTS {
            cut_and_recover(interface, WRITE_BACK_DEVICE, seed, cut, 300);
        }
    }
}

/// On flash whose programs fail, with one forward link per log block, both hosts come back
/// to an operation boundary at every cut: the device's retries, amendments and log bridges
/// lose nothing a flush was acknowledged for. (Each failed program retires its EBLOCK, and
/// at one program in 200 the load of this small device already runs out of them.)
#[test]
fn both_hosts_recover_on_flash_whose_programs_fail() {
    for interface in [Interface::Batch, Interface::Block] {
        for (seed, cut) in CUTS {
            cut_and_recover(interface, FAILING_FLASH, seed, cut, 300);
        }
    }
}

/// A second power loss after a recovery finds the checkpoint the recovery wrote, and the
/// flushes the first recovery left out never come back.
#[test]
fn a_recovered_store_survives_another_power_loss() {
    for interface in [Interface::Batch, Interface::Block] {
        let (mut kv, _) = cut_and_recover(
            interface,
            SMALL_BUFFER,
            7,
            Cut::After {
                ops: 2_000,
                delay_ns: 700_000,
            },
            0,
        );
        let mut hist = History {
            changes: Vec::new(),
            flush_start: vec![0; kv.next_flush as usize],
        };
        let mut stream = Ops::new(&kv, 8);
        hist.drive(&mut kv, &mut stream, 1_500);
        let (current, acked, now) = (kv.records.clone(), kv.acknowledged_flushes(), kv.now_ns);
        let (back, _) = KvStore::recover(kv.power_loss(now + 200_000), now + 200_000).unwrap();
        hist.find(&back.records, &current, acked)
            .unwrap_or_else(|e| panic!("{interface:?}: {e}"));
    }
}

/// The block host rebuilds its LLAMA map from its checkpoint and log; the batch host only
/// reads its pages back by LPID: the host-side recovery the batch interface removes.
#[test]
fn the_block_host_reads_its_map_and_log_back_and_the_batch_host_does_not() {
    let (_, batch) = cut_and_recover(
        Interface::Batch,
        SMALL_BUFFER,
        5,
        Cut::After {
            ops: 2_000,
            delay_ns: 0,
        },
        0,
    );
    let (_, block) = cut_and_recover(
        Interface::Block,
        SMALL_BUFFER,
        5,
        Cut::After {
            ops: 2_000,
            delay_ns: 0,
        },
        0,
    );
    assert_eq!(batch.segments_scanned + batch.flushes_replayed, 0);
    assert!(block.checkpoint_seq.is_some() && block.segments_scanned > 0);
    assert!(
        block.read_commands > batch.read_commands,
        "block {block:?}\nbatch {batch:?}"
    );
}

#[test]
fn recovery_is_deterministic() {
    for interface in [Interface::Batch, Interface::Block] {
        let cut = Cut::After {
            ops: 1_200,
            delay_ns: 400_000,
        };
        let (a, ra) = cut_and_recover(interface, SMALL_BUFFER, 11, cut, 300);
        let (b, rb) = cut_and_recover(interface, SMALL_BUFFER, 11, cut, 300);
        assert_eq!(ra, rb);
        assert_eq!(a.records, b.records);
        assert_eq!(a.now_ns, b.now_ns);
        assert_eq!(a.device().event_hash(), b.device().event_hash());
    }
}

/// The images cost memory, not time: a run is the same with them on or off.
#[test]
fn page_images_do_not_change_a_run() {
    for interface in [Interface::Batch, Interface::Block] {
        let run = |images: bool| {
            let mut cfg = config(interface, SMALL_BUFFER);
            cfg.page_images = images;
            let mut kv = KvStore::new(cfg, 3).unwrap();
            kv.load().unwrap();
            let r = kv.run(Workload::WriteHeavy, 3_000, 4).unwrap();
            (r.ops_per_s, r.host, kv.device().event_hash())
        };
        assert_eq!(run(true), run(false), "{interface:?}");
    }
}

#[test]
fn recovery_without_page_images_is_refused_by_name() {
    let mut cfg = config(Interface::Block, SMALL_BUFFER);
    cfg.page_images = false;
    let mut kv = KvStore::new(cfg, 1).unwrap();
    kv.load().unwrap();
    let now = kv.now_ns;
    let err = KvStore::recover(kv.power_loss(now), now).unwrap_err();
    assert!(err.to_string().contains("page_images"), "{err}");
}

#[test]
fn page_images_with_a_write_back_cache_are_refused_by_name() {
    let mut cfg = config(Interface::Batch, SMALL_BUFFER);
    cfg.write_back = true;
    let err = KvStore::new(cfg, 1).unwrap_err();
    assert!(err.to_string().contains("write-through"), "{err}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: afa_sim::proptest_cases(16), ..ProptestConfig::default() })]

    #[test]
    fn power_loss_at_random_points_keeps_every_acknowledged_flush(
        block in any::<bool>(),
        shape in 0usize..SHAPES.len(),
        seed in 0u64..1_000,
        ops in 0u64..2_500,
        delay_ns in 0u64..3_000_000,
    ) {
        let interface = if block { Interface::Block } else { Interface::Batch };
        cut_and_recover(interface, SHAPES[shape], seed, Cut::After { ops, delay_ns }, 300);
    }

    #[test]
    fn power_loss_between_two_flushes_keeps_the_acknowledged_one(
        block in any::<bool>(),
        shape in 0usize..SHAPES.len(),
        seed in 0u64..1_000,
        n in 1u64..60,
    ) {
        let interface = if block { Interface::Block } else { Interface::Batch };
        cut_and_recover(interface, SHAPES[shape], seed, Cut::AtAck { n }, 300);
    }
}

/// The checkpoint area maps a quarter of the LBAs; a tree that outgrows it is refused by
/// name rather than let its map pages overwrite each other.
#[test]
fn a_tree_that_outgrows_the_host_checkpoint_area_is_refused_by_name() {
    let mut cfg = KvConfig::scaled_with_ratio(30_000, Interface::Block, 0.2, 4.0);
    cfg.host_checkpoint_interval_ns = 1_000_000;
    let mut kv = KvStore::new(cfg, 1).unwrap();
    kv.load().unwrap();
    let err = kv.run(Workload::WriteHeavy, 5_000, 2).unwrap_err();
    assert!(
        err.to_string().contains("outgrew the host checkpoint area"),
        "{err}"
    );
}
