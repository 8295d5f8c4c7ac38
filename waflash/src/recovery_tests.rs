//! Faults. Power loss and recovery: the power goes at a chosen flash program or erase
//! (inside a destage, a read-modify-write, a compaction, a GC copy or erase, an idle merge),
//! the controller rebuilds its FTL from the OOB areas, and an oracle checks that every write
//! a FLUSH or FUA made durable reads back, that every other sector holds a value it may
//! hold, and that the recovered device goes on matching a flat model. Media faults: failed
//! programs, failed erases and uncorrectable reads, with and without a power loss.

use std::os::unix::fs::FileExt;

use afa_nand::{sector_token, unit_matches};
use afa_ssd::{BlockDevice, Command, CommandFlags, DeviceError, ReadBuffers};
use proptest::prelude::*;

use crate::tests::{
    drive_model, flush, flush_and_check_model, preconditioned_model, read_tokens_match, tiny,
    units, whole_drain, write, Op, COMBOS,
};
use crate::{BufferPolicy, FtlKind, FtlRecovery, WaflashConfig, WaflashError, WaflashSsd};

/// The configurations the crash tests run: every buffer × FTL combination, then the FIFO
/// buffer with VSSIM's whole drain over each FTL.
fn config(which: usize) -> WaflashConfig {
    match which {
        0..12 => {
            let (policy, ftl, compaction) = COMBOS[which];
            tiny(policy, ftl, compaction)
        }
        12 => whole_drain(FtlKind::PageRmw, false),
        13 => whole_drain(FtlKind::MultiVersion, false),
        _ => whole_drain(FtlKind::MultiVersion, true),
    }
}

const CONFIGS: usize = 15;

/// What each sector may hold after a power loss.
struct Oracle {
    /// The value a read returns now.
    current: Vec<u64>,
    /// The value the last completed FLUSH made durable, then every value written (or sent
    /// and not acknowledged) since: a write-back buffer may have destaged any of them.
    candidates: Vec<Vec<u64>>,
    /// Sectors a TRIM has covered: TRIM promises no durability (`trim_is_durable` is
    /// false), so after a power loss any value the sector ever held may come back.
    trimmed: Vec<bool>,
    history: Vec<Vec<u64>>,
}

impl Oracle {
    fn new(capacity: u64, precondition: u64) -> Self {
        let current = preconditioned_model(capacity, precondition);
        Self {
            candidates: current.iter().map(|&t| vec![t]).collect(),
            history: current.iter().map(|&t| vec![t, 0]).collect(),
            trimmed: vec![false; capacity as usize],
            current,
        }
    }

    /// A write is on its way: until a flush completes after it, its data may or may not be
    /// durable. Called before the command is sent, so a write that fails stays possible.
    fn sent(&mut self, lba: u64, sectors: u32, token: impl Fn(u64) -> u64) {
        for l in lba..lba + sectors as u64 {
            let t = token(l);
            self.candidates[l as usize].push(t);
            self.history[l as usize].push(t);
        }
    }

    fn acknowledged(&mut self, lba: u64, sectors: u32, token: impl Fn(u64) -> u64) {
        for l in lba..lba + sectors as u64 {
            self.current[l as usize] = token(l);
        }
    }

    /// Everything acknowledged before a completed FLUSH (or a FUA write's own sectors) is
    /// durable: the sectors' only candidate is their current value.
    fn durable(&mut self, sectors: std::ops::Range<u64>) {
        for l in sectors {
            let c = &mut self.candidates[l as usize];
            c.clear();
            c.push(self.current[l as usize]);
        }
    }

    /// Checks the sector `lba` of the recovered device and adopts what it holds as its
    /// current value.
    fn check_after_loss(&mut self, ssd: &mut WaflashSsd, now: u64, lba: u64) -> Result<(), String> {
        let mut out = [0u8; 8];
        ssd.submit(
            now,
            &Command::read(lba, 1),
            ReadBuffers {
                data: &mut out,
                tags: None,
            },
        )
        .map_err(|e| format!("read of sector {lba} after recovery failed: {e}"))?;
        let l = lba as usize;
        let allowed = self.candidates[l].iter().copied().chain(
            self.trimmed[l]
                .then(|| self.history[l].iter().copied())
                .into_iter()
                .flatten(),
        );
        let Some(found) = allowed.into_iter().find(|&t| unit_matches(t, &out)) else {
            return Err(format!(
                "sector {lba} holds none of the {} values it may hold after the power loss \
                 (the durable one: {:#x})",
                self.candidates[l].len(),
                self.candidates[l][0]
            ));
        };
        self.current[l] = found;
        self.candidates[l] = vec![found];
        Ok(())
    }
}

fn fua_write(
    ssd: &mut WaflashSsd,
    now: u64,
    lba: u64,
    sectors: u32,
    version: u64,
) -> Result<u64, DeviceError> {
    let data = units(lba, sectors, version, 8);
    let cmd = Command {
        flags: CommandFlags {
            fua: true,
            ..CommandFlags::default()
        },
        ..Command::write(lba, sectors, &data)
    };
    ssd.submit(now, &cmd, ReadBuffers::none())
        .map(|c| c.done_ns)
}

/// Runs `ops` (every fourth write with FUA) with the power cut after `budget` flash
/// operations, recovers, checks every sector against the oracle, then runs `after` on the
/// recovered device against a flat model. Returns what recovery found.
fn crash_and_recover(
    config: WaflashConfig,
    precondition: u64,
    ops: &[(Op, u64)],
    budget: u64,
    after: &[(Op, u64)],
) -> Result<FtlRecovery, TestCaseError> {
    let mut ssd = WaflashSsd::new(config, 7).unwrap();
    ssd.precondition(precondition).unwrap();
    let capacity = ssd.info().capacity_sectors;
    let mut oracle = Oracle::new(capacity, precondition);
    ssd.cut_power_after(budget);
    let mut now = 0u64;
    for (i, (op, dt)) in ops.iter().enumerate() {
        now += dt;
        let version = i as u64 + 1;
        let outcome = match *op {
            Op::Write { lba, sectors } => {
                let token = |l| sector_token(l, version);
                oracle.sent(lba, sectors, token);
                let fua = i % 4 == 0;
                let data = units(lba, sectors, version, 8);
                let r = if fua {
                    fua_write(&mut ssd, now, lba, sectors, version)
                } else {
                    ssd.submit(
                        now,
                        &Command::write(lba, sectors, &data),
                        ReadBuffers::none(),
                    )
                    .map(|c| c.done_ns)
                };
                r.map(|_| {
                    oracle.acknowledged(lba, sectors, token);
                    if fua {
                        oracle.durable(lba..lba + sectors as u64);
                    }
                })
            }
            Op::Read { lba, sectors } => {
                let expect = oracle.current[lba as usize..(lba + sectors as u64) as usize].to_vec();
                let mut out = vec![0u8; expect.len() * 8];
                let r = ssd.submit(
                    now,
                    &Command::read(lba, sectors),
                    ReadBuffers {
                        data: &mut out,
                        tags: None,
                    },
                );
                if r.is_ok() {
                    prop_assert!(
                        expect
                            .iter()
                            .enumerate()
                            .all(|(k, &t)| unit_matches(t, &out[k * 8..(k + 1) * 8])),
                        "op {i}: read of {sectors} sectors at {lba} before the power loss"
                    );
                }
                r.map(|_| ())
            }
            Op::Trim { lba, sectors } => {
                oracle.sent(lba, sectors, |_| 0);
                for l in lba..lba + sectors as u64 {
                    oracle.trimmed[l as usize] = true;
                }
                ssd.submit(now, &Command::trim(lba, sectors), ReadBuffers::none())
                    .map(|_| oracle.acknowledged(lba, sectors, |_| 0))
            }
            Op::Flush => ssd
                .submit(now, &Command::flush(), ReadBuffers::none())
                .map(|_| oracle.durable(0..capacity)),
            Op::Idle => {
                if let Some(t) = ssd.background(now) {
                    now = now.max(t);
                }
                Ok(())
            }
        };
        if let Err(e) = outcome {
            prop_assert!(ssd.power_lost(), "op {i} failed without a power loss: {e}");
            prop_assert_eq!(e, DeviceError::Failed);
            break;
        }
    }
    let lost_mid_run = ssd.power_lost();
    let medium = ssd.power_loss();
    now += 1_000_000;
    let (mut ssd, found) = WaflashSsd::recover(medium, now).unwrap();
    ssd.check_invariants();
    prop_assert!(!lost_mid_run || found.pages_scanned > 0 || precondition == 0);
    for lba in 0..capacity {
        if let Err(e) = oracle.check_after_loss(&mut ssd, now, lba) {
            return Err(TestCaseError::fail(e));
        }
    }
    // The recovered device keeps working: writes, GC and merges over what recovery built.
    let mut model = oracle.current;
    let now = drive_model(&mut ssd, &mut model, after, now, 1 << 32, read_tokens_match)?;
    flush_and_check_model(&mut ssd, &model, capacity, now, read_tokens_match)?;
    Ok(found)
}

/// Random sector-granular operations over the first 600 sectors, as in the flat-model tests,
/// with `trims` choosing whether TRIM is among them.
fn random_ops(rng: &mut afa_sim::SimRng, n: usize, gap_ns: u64, trims: bool) -> Vec<(Op, u64)> {
    (0..n)
        .map(|_| {
            let lba = rng.below(600);
            let sectors = (1 + rng.below(9) as u32).min((600 - lba) as u32);
            let op = match rng.below(20) {
                0..=12 => Op::Write { lba, sectors },
                13..=15 => Op::Read { lba, sectors },
                16 if trims => Op::Trim { lba, sectors },
                17 => Op::Flush,
                _ => Op::Idle,
            };
            (op, rng.below(gap_ns))
        })
        .collect()
}

/// `config` with failing programs (0.05%) and erases (0.5%). A run of 4,000 operations on
/// the tiny device programs about 5,000 pages and erases about 300 blocks, so it retires a
/// few of its 19 spare blocks, not all: each retired block is a spare gone, and a plane
/// without one refuses writes. No read faults: the crash oracle counts a failed command as
/// the power loss.
fn with_media_faults(mut config: WaflashConfig) -> WaflashConfig {
    config.faults.program_fail_probability = 0.0005;
    config.faults.erase_fail_probability = 0.005;
    config
}

proptest! {
    #![proptest_config(ProptestConfig { cases: afa_sim::proptest_cases(32), ..ProptestConfig::default() })]

    /// Power lost at a random flash operation of a random run on any configuration, with
    /// or without failing programs and erases: every durable write survives, nothing reads
    /// back that was never written there, and the recovered device matches a flat model
    /// from then on.
    #[test]
    fn power_loss_at_any_flash_operation_keeps_every_durable_write(
        which in 0..CONFIGS,
        precondition in prop_oneof![Just(0u64), Just(600u64)],
        seed in any::<u64>(),
        len in 1usize..600,
        budget in 0u64..1500,
        faults in any::<bool>(),
    ) {
        let mut rng = afa_sim::SimRng::new(seed);
        let ops = random_ops(&mut rng, len, 300_000, true);
        let after = random_ops(&mut rng, 300, 300_000, true);
        let config = if faults { with_media_faults(config(which)) } else { config(which) };
        crash_and_recover(config, precondition, &ops, budget, &after)?;
    }

    /// Failing programs and erases and uncorrectable reads on any configuration: every
    /// write is kept (a failed program is written again elsewhere), a read that fails
    /// leaves the data as it was (a retry returns it), and the FTL stays consistent.
    #[test]
    fn media_faults_lose_nothing_on_any_configuration(
        which in 0..CONFIGS,
        seed in any::<u64>(),
        len in 1usize..800,
    ) {
        let mut rng = afa_sim::SimRng::new(seed);
        let ops = random_ops(&mut rng, len, 300_000, true);
        run_with_media_faults(config(which), seed, &ops)?;
    }
}

/// Runs `ops` against a flat model on `config` with failing programs and erases
/// ([`with_media_faults`]), reads (10% per flash page read) and factory bad blocks (4%); a read that fails as uncorrectable is retried until it
/// returns. Returns the report.
fn run_with_media_faults(
    config: WaflashConfig,
    seed: u64,
    ops: &[(Op, u64)],
) -> Result<crate::WaflashReport, TestCaseError> {
    let mut config = with_media_faults(config);
    config.faults.read_fail_probability = 0.1;
    config.faults.factory_bad_block_fraction = 0.04;
    let mut ssd = WaflashSsd::new(config, seed).unwrap();
    ssd.precondition(600).unwrap();
    let capacity = ssd.info().capacity_sectors;
    let mut model = preconditioned_model(capacity, 600);
    let now = drive_model(&mut ssd, &mut model, ops, 0, 1, read_until_it_returns)?;
    flush_and_check_model(
        &mut ssd,
        &model,
        capacity.min(600),
        now,
        read_until_it_returns,
    )?;
    Ok(ssd.report())
}

/// Reads `expect.len()` sectors at `lba`, again as long as the read fails as uncorrectable
/// (the data stays; a retry may succeed), and compares them with `expect`.
fn read_until_it_returns(ssd: &mut WaflashSsd, now: u64, lba: u64, expect: &[u64]) -> bool {
    let mut out = vec![0u8; expect.len() * 8];
    for _ in 0..200 {
        let r = ssd.submit(
            now,
            &Command::read(lba, expect.len() as u32),
            ReadBuffers {
                data: &mut out,
                tags: None,
            },
        );
        match r {
            Ok(_) => {
                return expect
                    .iter()
                    .enumerate()
                    .all(|(k, &t)| unit_matches(t, &out[k * 8..(k + 1) * 8]))
            }
            Err(DeviceError::Uncorrectable { .. }) => continue,
            Err(e) => panic!("read of {} sectors at {lba}: {e}", expect.len()),
        }
    }
    panic!("read at {lba} failed 200 times in a row");
}

#[test]
fn failed_programs_and_erases_retire_blocks_and_lose_nothing() {
    let mut total = crate::FtlStats::default();
    let mut uncorrectable = 0;
    for which in 0..CONFIGS {
        let mut rng = afa_sim::SimRng::new(which as u64);
        let ops = random_ops(&mut rng, 4000, 200_000, false);
        let r = run_with_media_faults(config(which), which as u64, &ops)
            .unwrap_or_else(|e| panic!("configuration {which}: {e}"));
        total.program_failures += r.ftl.program_failures;
        total.blocks_retired += r.ftl.blocks_retired;
        uncorrectable += r.device.uncorrectable_reads;
    }
    assert!(total.program_failures > 0, "{total:?}");
    assert!(total.blocks_retired > 0, "{total:?}");
    assert!(uncorrectable > 0);
}

/// A block where a program failed gets no more pages and is retired by its next GC. The
/// mark used to live in controller DRAM only, so a power loss before that GC put the block
/// back in service: recovery could reopen it at its write pointer, or GC erase it and reuse
/// it. The mark is now on flash with the block's state, and the block stays out of service.
#[test]
fn a_block_whose_program_failed_stays_out_of_service_after_a_power_loss() {
    let mut config = tiny(BufferPolicy::Lru, FtlKind::MultiVersion, false);
    config.faults.program_fail_probability = 0.002;
    let mut checked = 0;
    for seed in 0..8u64 {
        let mut rng = afa_sim::SimRng::new(seed);
        let ops = random_ops(&mut rng, 1500, 200_000, false);
        let after = random_ops(&mut rng, 1500, 200_000, false);
        let mut ssd = WaflashSsd::new(config.clone(), seed).unwrap();
        ssd.precondition(600).unwrap();
        let capacity = ssd.info().capacity_sectors;
        let mut model = preconditioned_model(capacity, 600);
        let now = drive_model(&mut ssd, &mut model, &ops, 0, 1, read_tokens_match).unwrap();
        flush_and_check_model(&mut ssd, &model, 600, now, read_tokens_match).unwrap();
        let retiring = ssd.retiring_blocks();
        let pointers: Vec<u32> = retiring.iter().map(|&b| ssd.nand().next_page(b)).collect();
        let (mut ssd, found) = WaflashSsd::recover(ssd.power_loss(), now).unwrap();
        assert_eq!(found.retiring_blocks, retiring.len() as u64, "{found:?}");
        assert_eq!(ssd.retiring_blocks(), retiring);
        let now = drive_model(&mut ssd, &mut model, &after, now + 1, 1, read_tokens_match).unwrap();
        flush_and_check_model(&mut ssd, &model, 600, now, read_tokens_match).unwrap();
        for (&b, &p) in retiring.iter().zip(&pointers) {
            // Retired by GC since (bad, never erased), or still waiting for it; never
            // written again.
            assert_eq!(
                ssd.nand().next_page(b),
                p,
                "seed {seed}: block {b} was written again"
            );
            assert!(
                ssd.nand().is_bad(b) || ssd.retiring_blocks().contains(&b),
                "seed {seed}: block {b} went back into service"
            );
        }
        checked += retiring.len();
    }
    assert!(checked > 0, "no run left a block waiting for retirement");
}

#[test]
fn a_bad_block_stays_out_of_service_after_a_power_loss() {
    let mut config = with_media_faults(tiny(BufferPolicy::Lru, FtlKind::MultiVersion, false));
    config.faults.erase_fail_probability = 0.02;
    let mut rng = afa_sim::SimRng::new(3);
    let ops = random_ops(&mut rng, 3000, 200_000, false);
    let mut ssd = WaflashSsd::new(config, 5).unwrap();
    ssd.precondition(600).unwrap();
    let capacity = ssd.info().capacity_sectors;
    let mut model = preconditioned_model(capacity, 600);
    let now = drive_model(&mut ssd, &mut model, &ops, 0, 1, read_tokens_match).unwrap();
    flush_and_check_model(&mut ssd, &model, 600, now, read_tokens_match).unwrap();
    let retired = ssd.ftl_stats().blocks_retired;
    assert!(retired > 0);
    let bad_before = (0..ssd.nand().geometry().blocks_total())
        .filter(|&b| ssd.nand().is_bad(b))
        .count() as u64;
    assert_eq!(bad_before, retired);
    let (mut ssd, found) = WaflashSsd::recover(ssd.power_loss(), now).unwrap();
    assert_eq!(found.bad_blocks, retired, "{found:?}");
    // Everything was flushed: all of it is back.
    flush_and_check_model(&mut ssd, &model, 600, now + 1, read_tokens_match).unwrap();
}

#[test]
fn power_loss_inside_gc_merges_and_compaction_keeps_every_durable_write() {
    // Long runs that wrap the tiny device several times, cut at points spread over them, so
    // that the power goes inside GC copies and erases, merges and compacted destages.
    let mut total = FtlRecovery::default();
    for which in 0..CONFIGS {
        for (k, budget) in [40u64, 700, 1900, 3100].into_iter().enumerate() {
            let mut rng = afa_sim::SimRng::new(which as u64 * 10 + k as u64);
            let ops = random_ops(&mut rng, 4000, 200_000, false);
            let after = random_ops(&mut rng, 1500, 200_000, false);
            let found = crash_and_recover(config(which), 600, &ops, budget, &after)
                .unwrap_or_else(|e| panic!("configuration {which}, budget {budget}: {e}"));
            total.pages_scanned += found.pages_scanned;
            total.torn_pages += found.torn_pages;
            total.live_pages += found.live_pages;
            total.multi_version_pages += found.multi_version_pages;
            total.compacted_pages_scanned += found.compacted_pages_scanned;
        }
    }
    // The cuts fell inside programs (a torn page each), and recovery met stale pages,
    // several versions of a page and compacted pages.
    assert!(total.torn_pages > 0, "{total:?}");
    assert!(total.pages_scanned > total.live_pages, "{total:?}");
    assert!(total.multi_version_pages > 0, "{total:?}");
    assert!(total.compacted_pages_scanned > 0, "{total:?}");
}

#[test]
fn a_flushed_write_survives_and_an_unflushed_one_in_the_buffer_does_not() {
    let mut ssd =
        WaflashSsd::new(tiny(BufferPolicy::PcLru, FtlKind::MultiVersion, true), 3).unwrap();
    ssd.precondition(64).unwrap();
    // Sectors 1..=3 of page 0 (a new version), then a flush; then page 1 whole, which stays
    // in the buffer.
    write(&mut ssd, 0, 1, 3, 7);
    let t = flush(&mut ssd, 1_000);
    let t = write(&mut ssd, t, 4, 4, 8);
    assert_eq!(ssd.buffered_pages().0, 1);
    let (mut ssd, found) = WaflashSsd::recover(ssd.power_loss(), t + 1_000).unwrap();
    assert!(found.mapped_pages >= 16, "{found:?}");
    assert_eq!(found.torn_pages, 0);
    let page0 = [
        sector_token(0, 0),
        sector_token(1, 7),
        sector_token(2, 7),
        sector_token(3, 7),
    ];
    assert!(read_tokens_match(&mut ssd, t + 2_000, 0, &page0));
    let page1: Vec<u64> = (4..8).map(|l| sector_token(l, 0)).collect();
    assert!(
        read_tokens_match(&mut ssd, t + 3_000, 4, &page1),
        "the unflushed write of page 1 was in DRAM only"
    );
    ssd.check_invariants();
}

#[test]
fn a_cut_command_fails_and_so_does_every_later_one() {
    let mut ssd = WaflashSsd::new(tiny(BufferPolicy::Lru, FtlKind::PageRmw, false), 1).unwrap();
    ssd.cut_power_after(0);
    // The buffer takes the write; the flush's first program meets the power loss.
    write(&mut ssd, 0, 0, 4, 1);
    let e = ssd
        .submit(10, &Command::flush(), ReadBuffers::none())
        .unwrap_err();
    assert_eq!(e, DeviceError::Failed);
    assert!(ssd.power_lost());
    let mut out = [0u8; 8];
    let read = ssd.submit(
        20,
        &Command::read(0, 1),
        ReadBuffers {
            data: &mut out,
            tags: None,
        },
    );
    assert_eq!(read.unwrap_err(), DeviceError::Failed);
    assert_eq!(ssd.background(30), None);
    let (mut ssd, found) = WaflashSsd::recover(ssd.power_loss(), 40).unwrap();
    assert_eq!(found.torn_pages, 1, "{found:?}");
    assert_eq!(found.mapped_pages, 0);
    assert!(read_tokens_match(&mut ssd, 50, 0, &[0; 4]));
    // The torn page's block stays open after it; the next write goes on from there.
    write(&mut ssd, 60, 0, 4, 2);
    flush(&mut ssd, 70);
    ssd.check_invariants();
}

#[test]
fn a_seed_and_a_cut_reproduce_the_recovery() {
    let run = || {
        let mut rng = afa_sim::SimRng::new(5);
        let ops = random_ops(&mut rng, 3000, 200_000, true);
        let mut ssd =
            WaflashSsd::new(tiny(BufferPolicy::PcLru, FtlKind::MultiVersion, true), 9).unwrap();
        ssd.precondition(600).unwrap();
        ssd.cut_power_after(1_234);
        let mut now = 0;
        for (i, (op, dt)) in ops.iter().enumerate() {
            now += dt;
            let r = match *op {
                Op::Write { lba, sectors } => {
                    let data = units(lba, sectors, i as u64 + 1, 8);
                    ssd.submit(
                        now,
                        &Command::write(lba, sectors, &data),
                        ReadBuffers::none(),
                    )
                    .map(|_| ())
                }
                Op::Flush => ssd
                    .submit(now, &Command::flush(), ReadBuffers::none())
                    .map(|_| ()),
                _ => Ok(()),
            };
            if r.is_err() {
                break;
            }
        }
        assert!(ssd.power_lost(), "the run never reached the cut");
        let (ssd, found) = WaflashSsd::recover(ssd.power_loss(), now).unwrap();
        let entries: Vec<u32> = (0..150).map(|l| ssd.mapping_entry(l)).collect();
        (found, entries, ssd.report().flash_programs)
    };
    assert_eq!(run(), run());
}

#[test]
fn recovery_names_a_page_whose_oob_is_not_this_devices() {
    let mut ssd = WaflashSsd::new(tiny(BufferPolicy::Lru, FtlKind::MultiVersion, true), 1).unwrap();
    ssd.precondition(64).unwrap();
    let mut medium = ssd.power_loss();
    medium.corrupt_oob_lpn(0, 1 << 30);
    let e = WaflashSsd::recover(medium, 0).unwrap_err();
    assert!(matches!(e, WaflashError::Recovery(_)), "{e}");
    assert!(e.to_string().contains("page 0's OOB names"), "{e}");
}

/// A directory of its own under the system's temporary directory, removed when dropped
/// (the image tests use it too: their names differ from these).
pub(crate) struct Scratch(pub(crate) std::path::PathBuf);

impl Scratch {
    pub(crate) fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("afa-waflash-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn full_bytes(lba: u64, sectors: u32, version: u64) -> Vec<u8> {
    units(lba, sectors, version, 4096)
}

fn read_bytes(ssd: &mut WaflashSsd, now: u64, lba: u64, sectors: u32) -> Vec<u8> {
    let mut out = vec![0u8; sectors as usize * 4096];
    ssd.submit(
        now,
        &Command::read(lba, sectors),
        ReadBuffers {
            data: &mut out,
            tags: None,
        },
    )
    .expect("read");
    out
}

#[test]
fn a_medium_kept_in_an_image_holds_every_flushed_write_after_the_process_goes() {
    let dir = Scratch::new("image");
    let path = dir.0.join("waflash.img");
    let mut config = tiny(BufferPolicy::PcLru, FtlKind::MultiVersion, true);
    // Factory bad blocks and failing erases: the image keeps every bad block.
    config.faults.factory_bad_block_fraction = 0.03;
    config.faults.erase_fail_probability = 0.002;
    let image = crate::WaflashImage::create(&path, &config).unwrap();
    let mut ssd = WaflashSsd::create_in(config.clone(), 1, image).unwrap();
    let capacity = 600u64;
    let mut model = vec![0u64; capacity as usize];
    let mut rng = afa_sim::SimRng::new(21);
    let mut now = 0;
    // Enough sector-granular writes to run GC, merges and compaction, a flush every 50.
    for i in 0..3000u64 {
        now += 100_000;
        let lba = rng.below(capacity - 9);
        let n = 1 + rng.below(9) as u32;
        let data = full_bytes(lba, n, i + 1);
        ssd.submit(now, &Command::write(lba, n, &data), ReadBuffers::none())
            .unwrap();
        for l in lba..lba + n as u64 {
            model[l as usize] = sector_token(l, i + 1);
        }
        if i % 50 == 49 {
            flush(&mut ssd, now);
        }
    }
    flush(&mut ssd, now);
    assert!(ssd.ftl_stats().gc_runs > 0 && ssd.ftl_stats().compacted_pages > 0);
    // Writes after the last flush are in DRAM (and maybe on pages not committed): the
    // process going loses them, as a power loss would.
    let late = full_bytes(0, 4, 99_999);
    ssd.submit(now + 1, &Command::write(0, 4, &late), ReadBuffers::none())
        .unwrap();
    let bad: Vec<u32> = (0..ssd.nand().geometry().blocks_total())
        .filter(|&b| ssd.nand().is_bad(b))
        .collect();
    assert!(!bad.is_empty());
    drop(ssd);
    // Another seed draws other factory bad blocks: the image's are the ones that count.
    let (mut ssd, found) = WaflashSsd::open_image(config.clone(), 2, &path).unwrap();
    assert!(found.pages_scanned > found.live_pages, "{found:?}");
    assert_eq!(found.bad_blocks, bad.len() as u64);
    for &b in &bad {
        assert!(ssd.nand().is_bad(b), "block {b} came back good");
    }
    assert_eq!(found.torn_pages, 0);
    ssd.check_invariants();
    for lba in (0..capacity).step_by(4) {
        let got = read_bytes(&mut ssd, 1, lba, 4);
        for k in 0..4 {
            let t = model[(lba + k) as usize];
            assert!(
                unit_matches(t, &got[k as usize * 4096..(k as usize + 1) * 4096]),
                "sector {} after reopening the image",
                lba + k
            );
        }
    }
    // The reopened device goes on: more writes, a flush, and a second reopening.
    let data = full_bytes(8, 4, 123_456);
    ssd.submit(2, &Command::write(8, 4, &data), ReadBuffers::none())
        .unwrap();
    flush(&mut ssd, 3);
    drop(ssd);
    let (mut ssd, _) = WaflashSsd::open_image(config, 2, &path).unwrap();
    assert_eq!(read_bytes(&mut ssd, 4, 8, 4), data);
}

#[test]
fn an_image_refuses_another_shape_or_version_and_drops_a_torn_commit() {
    let dir = Scratch::new("shape");
    let path = dir.0.join("waflash.img");
    let config = tiny(BufferPolicy::Lru, FtlKind::MultiVersion, false);
    let image = crate::WaflashImage::create(&path, &config).unwrap();
    let mut ssd = WaflashSsd::create_in(config.clone(), 1, image).unwrap();
    let data = full_bytes(0, 4, 5);
    ssd.submit(0, &Command::write(0, 4, &data), ReadBuffers::none())
        .unwrap();
    flush(&mut ssd, 10);
    drop(ssd);
    let mut other = config.clone();
    other.geometry.blocks_per_plane += 1;
    let e = WaflashSsd::open_image(other, 1, &path).unwrap_err();
    assert!(e.to_string().contains("another shape"), "{e}");
    let e = WaflashSsd::open_image(config.clone(), 1, &dir.0.join("missing.img")).unwrap_err();
    assert!(e.to_string().contains("cannot open the flash image"), "{e}");
    // An image of the format before this one (its journal in a file of its own, its block
    // table elsewhere) is refused by its version.
    let header = std::fs::read(&path).unwrap()[..4096].to_vec();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.write_all_at(&1u32.to_le_bytes(), 8).unwrap();
    let e = WaflashSsd::open_image(config.clone(), 1, &path).unwrap_err();
    assert!(
        e.to_string().contains("version 1 WAFLASH flash image"),
        "{e}"
    );
    file.write_all_at(&header, 0).unwrap();
    // A commit pointer to a record cut short (a commit the process did not finish) is
    // dropped: the image keeps what the last whole commit left.
    let mut pointer = b"AFAWFPTR".to_vec();
    for word in [99u64, 1 << 40, 4096] {
        pointer.extend_from_slice(&word.to_le_bytes());
    }
    let sum = afa_sim::fnv1a(&pointer);
    pointer.extend_from_slice(&sum.to_le_bytes());
    file.write_all_at(&pointer, 4096).unwrap();
    let (mut ssd, _) = WaflashSsd::open_image(config, 1, &path).unwrap();
    assert_eq!(read_bytes(&mut ssd, 20, 0, 4), data);
}

#[test]
fn a_device_out_of_spare_blocks_refuses_writes_and_keeps_what_it_acknowledged() {
    // Programs fail so often that retired blocks use up every plane's spare ones: writes
    // are then refused (NoSpace), and the pages a refused destage took from the buffer go
    // back to it, so every acknowledged write still reads back.
    for (which, seed) in [(3usize, 1u64), (7, 2), (11, 3), (12, 4)] {
        let mut config = config(which);
        config.faults.program_fail_probability = 0.05;
        let mut ssd = WaflashSsd::new(config, seed).unwrap();
        ssd.precondition(600).unwrap();
        let capacity = ssd.info().capacity_sectors;
        let mut model = preconditioned_model(capacity, 600);
        let mut rng = afa_sim::SimRng::new(seed);
        let mut now = 0;
        let mut refused = 0;
        for i in 0..20_000u64 {
            now += 100_000;
            let lba = rng.below(600 - 9);
            let n = 1 + rng.below(9) as u32;
            let data = units(lba, n, i + 1, 8);
            match ssd.submit(now, &Command::write(lba, n, &data), ReadBuffers::none()) {
                Ok(_) => {
                    for l in lba..lba + n as u64 {
                        model[l as usize] = sector_token(l, i + 1);
                    }
                }
                Err(DeviceError::NoSpace { .. }) => {
                    refused += 1;
                    if refused == 20 {
                        break;
                    }
                }
                Err(e) => panic!("configuration {which}: write {i}: {e}"),
            }
        }
        assert_eq!(
            refused, 20,
            "configuration {which} never ran out of spare blocks"
        );
        for lba in (0..600).step_by(4) {
            assert!(
                read_tokens_match(
                    &mut ssd,
                    now + 1,
                    lba,
                    &model[lba as usize..lba as usize + 4]
                ),
                "configuration {which}: sectors {lba}..{} after the device ran out",
                lba + 4
            );
        }
    }
}

/// The image a damage test starts from: a device that took sector-granular writes (GC,
/// merges and compaction included) with a flush every 50 and was then dropped, with its
/// configuration.
fn damaged_image_base() -> &'static (Vec<u8>, WaflashConfig) {
    static BASE: std::sync::OnceLock<(Vec<u8>, WaflashConfig)> = std::sync::OnceLock::new();
    BASE.get_or_init(|| {
        let dir = Scratch::new("damage-base");
        let path = dir.0.join("waflash.img");
        let config = tiny(BufferPolicy::PcLru, FtlKind::MultiVersion, true);
        let image = crate::WaflashImage::create(&path, &config).unwrap();
        let mut ssd = WaflashSsd::create_in(config.clone(), 1, image).unwrap();
        let mut rng = afa_sim::SimRng::new(5);
        let mut now = 0;
        for i in 0..2000u64 {
            now += 100_000;
            let lba = rng.below(591);
            let n = 1 + rng.below(9) as u32;
            let data = full_bytes(lba, n, i + 1);
            ssd.submit(now, &Command::write(lba, n, &data), ReadBuffers::none())
                .unwrap();
            if i % 50 == 49 {
                flush(&mut ssd, now);
            }
        }
        drop(ssd);
        (std::fs::read(&path).unwrap(), config)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: afa_sim::proptest_cases(48), ..ProptestConfig::default() })]

    /// A state directory can be damaged on disk (a bad sector, a stray write, a copy cut
    /// short). Whatever bytes of the image change, opening it ends in an error that says
    /// what is wrong, or in a device that answers every read with bytes or an error and
    /// takes a write and a flush: never in a panic.
    #[test]
    fn a_damaged_image_is_refused_or_recovered_never_a_panic(
        flips in proptest::collection::vec((0.0f64..1.0, 1u8..=255), 1..24),
        cut_fraction in proptest::option::weighted(0.25, 0.0f64..1.0),
    ) {
        let (base, config) = damaged_image_base();
        let mut bytes = base.clone();
        afa_sim::damage_bytes(&mut bytes, &flips, cut_fraction);
        let dir = Scratch::new("damaged");
        let path = dir.0.join("waflash.img");
        std::fs::write(&path, &bytes).unwrap();
        let Ok((mut ssd, _)) = WaflashSsd::open_image(config.clone(), 1, &path) else {
            return Ok(());
        };
        let mut out = vec![0u8; 4096];
        for lba in 0..600 {
            let _ = ssd.submit(
                1,
                &Command::read(lba, 1),
                ReadBuffers { data: &mut out, tags: None },
            );
        }
        let data = full_bytes(3, 2, 1 << 40);
        let _ = ssd.submit(2, &Command::write(3, 2, &data), ReadBuffers::none());
        let _ = ssd.submit(3, &Command::flush(), ReadBuffers::none());
    }
}

/// Reads every sector's token (0 for zeroes).
fn read_all_tokens(ssd: &mut WaflashSsd, now: u64, capacity: u64) -> Vec<u64> {
    let mut tokens = Vec::with_capacity(capacity as usize);
    for lba in (0..capacity).step_by(4) {
        let n = (capacity - lba).min(4) as u32;
        let got = read_bytes(ssd, now, lba, n);
        for k in 0..n as usize {
            tokens.push(afa_nand::unit_token(&got[k * 4096..(k + 1) * 4096]));
        }
    }
    tokens
}

/// The process serving an image-backed SSD goes at random points of a random run, by a
/// kill (no flush: what the last FLUSH or FUA write committed survives) or by an orderly
/// stop (a FLUSH, then the process goes), and the next one reopens the image. After an
/// orderly stop every acknowledged write reads back, but on a sector a TRIM deallocated
/// since its last write (a trim is not durable).
fn kills_and_orderly_stops(
    seed: u64,
    policy: BufferPolicy,
    compaction: bool,
) -> Result<(), String> {
    let config = tiny(policy, FtlKind::MultiVersion, compaction);
    let max_sectors = 400;
    let steps = 2500;
    // A restart (a kill or an orderly stop, half each) comes at this many steps in a
    // thousand; the other steps are I/O, flushes and idle time.
    let restarts_per_mille = 100;
    let dir = Scratch::new(&format!(
        "stops-{seed}-{:?}-{}",
        config.buffer_policy, config.compaction
    ));
    let path = dir.0.join("waflash.img");
    let image = crate::WaflashImage::create(&path, &config).unwrap();
    let mut ssd = WaflashSsd::create_in(config.clone(), seed, image).unwrap();
    let capacity = ssd.info().capacity_sectors.min(max_sectors);
    let mut model = vec![0u64; capacity as usize];
    let mut trimmed = vec![false; capacity as usize];
    let mut rng = afa_sim::SimRng::new(seed);
    let mut now = 0u64;
    let mut version = 0u64;
    for step in 0..steps {
        now += 1 + rng.below(200_000);
        let roll = if rng.below(1000) < restarts_per_mille {
            90 + rng.below(10)
        } else {
            rng.below(90)
        };
        match roll {
            0..=59 => {
                let most = ssd.info().max_transfer_sectors.min(64) as u64;
                let lba = rng.below(capacity - most);
                let n = 1 + rng.below(most) as u32;
                version += 1;
                let data = full_bytes(lba, n, version);
                let fua = rng.below(10) == 0;
                let cmd = if fua {
                    Command {
                        flags: CommandFlags {
                            fua: true,
                            ..Default::default()
                        },
                        ..Command::write(lba, n, &data)
                    }
                } else {
                    Command::write(lba, n, &data)
                };
                ssd.submit(now, &cmd, ReadBuffers::none())
                    .map_err(|e| format!("step {step}: write: {e}"))?;
                for l in lba..lba + n as u64 {
                    model[l as usize] = sector_token(l, version);
                    trimmed[l as usize] = false;
                }
            }
            60..=69 => {
                let lba = rng.below(capacity - 16);
                let n = 1 + rng.below(16) as u32;
                ssd.submit(now, &Command::trim(lba, n), ReadBuffers::none())
                    .map_err(|e| format!("step {step}: trim: {e}"))?;
                for l in lba..lba + n as u64 {
                    model[l as usize] = 0;
                    trimmed[l as usize] = true;
                }
            }
            70..=74 => {
                flush(&mut ssd, now);
            }
            75..=84 => {
                let lba = rng.below(capacity - 16);
                let n = 1 + rng.below(16) as u32;
                let got = read_bytes(&mut ssd, now, lba, n);
                for k in 0..n as usize {
                    let s = lba as usize + k;
                    let token = afa_nand::unit_token(&got[k * 4096..(k + 1) * 4096]);
                    if token != model[s] {
                        return Err(format!(
                            "step {step}: sector {s} reads {token:#x}, not {:#x}",
                            model[s]
                        ));
                    }
                }
            }
            85..=89 => {
                now += 5_000_000;
                while let Some(next) = ssd.background(now) {
                    if next > now {
                        break;
                    }
                }
            }
            90..=94 => {
                // Kill: the next process takes the image as the last commit left it; half
                // the kills come inside a commit, as a kill -9 during a FLUSH would.
                if rng.below(2) == 0 {
                    use crate::image::Stage;
                    let stages = [
                        Stage::Direct,
                        Stage::Record,
                        Stage::Pointer,
                        Stage::Sync,
                        Stage::Apply,
                    ];
                    let stage = stages[rng.below(5) as usize];
                    ssd.image_mut().expect("kept in an image").hooks.cut_before = Some(stage);
                    let _ = ssd.submit(now, &Command::flush(), ReadBuffers::none());
                }
                drop(ssd);
                ssd = WaflashSsd::open_image(config.clone(), seed, &path)
                    .map_err(|e| format!("step {step}: reopen after a kill: {e}"))?
                    .0;
                now = 0;
                model = read_all_tokens(&mut ssd, now, capacity);
                trimmed.fill(false);
            }
            _ => {
                // Orderly stop: the final flush, then the process goes.
                flush(&mut ssd, now);
                drop(ssd);
                ssd = WaflashSsd::open_image(config.clone(), seed, &path)
                    .map_err(|e| format!("step {step}: reopen after a stop: {e}"))?
                    .0;
                now = 0;
                let got = read_all_tokens(&mut ssd, now, capacity);
                for s in 0..capacity as usize {
                    if !trimmed[s] && got[s] != model[s] {
                        return Err(format!(
                            "step {step}: sector {s} reads {:#x} after an orderly stop, not {:#x}",
                            got[s], model[s]
                        ));
                    }
                }
                model = got;
                trimmed.fill(false);
            }
        }
    }
    Ok(())
}

#[test]
fn kills_and_orderly_stops_of_an_image_lose_no_acknowledged_write() {
    let mut failures = Vec::new();
    for seed in 0..10 {
        for (policy, compaction) in [
            (BufferPolicy::PcLru, true),
            (BufferPolicy::PcLru, false),
            (BufferPolicy::Lru, true),
        ] {
            if let Err(e) = kills_and_orderly_stops(seed, policy, compaction) {
                failures.push(format!(
                    "seed {seed} {policy:?} compaction {compaction}: {e}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
