//! ScalaAFA on real threads against an oracle: clients on several OS threads write, read
//! and trim at once, partial writes of one chunk racing from different clients, through
//! conversion and array-level GC; then an orderly stop hands back the single-owner engine,
//! or a crash hands back the members for recovery, and every completed write must be there.

use std::collections::HashMap;
use std::time::Duration;

use afa_nand::PayloadMode;
use afa_sim::SimRng;
use afa_ssd::Ssd;

use super::tests::engine_keeping;
use super::*;
use crate::tests::{PageCache, PowerCut};

const SECTOR: usize = 4096;
const CLIENTS: u64 = 4;

/// The bytes of version `version` of sector `sector`.
fn pattern(sector: u64, version: u64) -> Vec<u8> {
    let mut x =
        sector.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ version.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    (0..SECTOR / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect()
}

fn volume(level: Level, members: u32, io_threads: u32) -> ScalaAfa<Ssd> {
    let scala = ScalaAfaConfig {
        io_threads,
        // A small spare makes holes run the free HHs out, so array-level GC must clean;
        // small grants make the threads ask, and be recalled from, often.
        spare_fraction: 0.03,
        grant_batch_hhs: 4,
        ..ScalaAfaConfig::default()
    };
    engine_keeping(PayloadMode::Full, level, members, 0, scala)
}

/// What one client wrote: sector → version (0: zeroes, by trim).
type Oracle = HashMap<u64, u64>;

/// Client `id`'s requests. Chunks c with c mod CLIENTS = id in the first half of the volume
/// are its own for multi-sector writes, reads and trims; in the second half it owns the
/// sectors s with s mod CLIENTS = id, so every chunk there takes one-sector writes from
/// every client at once, and each must merge into its chunk without losing the others.
fn client(v: &ThreadedScalaAfa<Ssd>, id: u64, ops: usize, trims: bool, seed: u64) -> Oracle {
    let info = v.info();
    let sectors = info.capacity_sectors;
    let chunk = v.chunk_sectors() as u64;
    let chunks = sectors / chunk;
    let half = chunks / 2;
    let mut rng = SimRng::new(seed * 100 + id);
    let mut oracle = Oracle::new();
    let mut version = 1 + id * 1_000_000;
    let expect = |oracle: &Oracle, s: u64| pattern_or_zero(s, oracle.get(&s).copied());
    for _ in 0..ops {
        version += 1;
        match rng.below(11) {
            // A burst, as a client with a deep queue sends it: writes of distinct own
            // sectors (some sharing a chunk) all started before any is waited for, then
            // reads of them the same way, so each I/O thread gets jobs to run together.
            10 => {
                let mut sectors: Vec<u64> = Vec::new();
                for _ in 0..8 {
                    let c = (rng.below(half / CLIENTS) * CLIENTS + id).min(half - 1);
                    let s = c * chunk + rng.below(chunk);
                    if c % CLIENTS == id && !sectors.contains(&s) {
                        sectors.push(s);
                    }
                }
                let started: Vec<_> = sectors
                    .iter()
                    .map(|&s| v.start_write(s * SECTOR as u64, &pattern(s, version)))
                    .collect();
                for w in started {
                    w.finish(&mut []).expect("write");
                }
                for &s in &sectors {
                    oracle.insert(s, version);
                }
                let started: Vec<_> = sectors
                    .iter()
                    .map(|&s| v.start_read(s * SECTOR as u64, SECTOR))
                    .collect();
                for (r, &s) in started.into_iter().zip(&sectors) {
                    let mut out = vec![0u8; SECTOR];
                    r.finish(&mut out).expect("read");
                    assert!(
                        out == expect(&oracle, s),
                        "client {id}: sector {s} reads wrong after a burst"
                    );
                }
            }
            // Own chunks: a run of sectors inside one of them.
            0..=3 => {
                let c = (rng.below(half / CLIENTS) * CLIENTS + id).min(half - 1);
                if c % CLIENTS != id {
                    continue;
                }
                let first = rng.below(chunk);
                let len = 1 + rng.below(chunk - first);
                let s0 = c * chunk + first;
                let mut data = Vec::new();
                for s in s0..s0 + len {
                    data.extend(pattern(s, version));
                }
                v.write(s0 * SECTOR as u64, &data).expect("write");
                for s in s0..s0 + len {
                    oracle.insert(s, version);
                }
            }
            // Own chunks: a whole chunk or two adjacent owned... a whole chunk.
            4 => {
                let c = (rng.below(half / CLIENTS) * CLIENTS + id).min(half - 1);
                if c % CLIENTS != id {
                    continue;
                }
                if trims && rng.below(3) == 0 {
                    v.trim(c * chunk * SECTOR as u64, chunk * SECTOR as u64)
                        .expect("trim");
                    for s in c * chunk..(c + 1) * chunk {
                        oracle.insert(s, 0);
                    }
                } else {
                    let mut data = Vec::new();
                    for s in c * chunk..(c + 1) * chunk {
                        data.extend(pattern(s, version));
                    }
                    v.write(c * chunk * SECTOR as u64, &data).expect("write");
                    for s in c * chunk..(c + 1) * chunk {
                        oracle.insert(s, version);
                    }
                }
            }
            // Shared chunks: one sector of this client's.
            5..=7 => {
                let s =
                    (half * chunk + rng.below((sectors - half * chunk) / CLIENTS) * CLIENTS + id)
                        .min(sectors - 1);
                if s % CLIENTS != id || s < half * chunk {
                    continue;
                }
                v.write(s * SECTOR as u64, &pattern(s, version))
                    .expect("write");
                oracle.insert(s, version);
            }
            // Read back something of this client's and check it at once.
            _ => {
                let Some((&s, _)) = oracle
                    .iter()
                    .nth(rng.below(oracle.len().max(1) as u64) as usize)
                else {
                    continue;
                };
                let mut out = vec![0u8; SECTOR];
                v.read(s * SECTOR as u64, &mut out).expect("read");
                assert!(
                    out == expect(&oracle, s),
                    "client {id}: sector {s} reads wrong"
                );
            }
        }
    }
    oracle
}

fn pattern_or_zero(sector: u64, version: Option<u64>) -> Vec<u8> {
    match version {
        None | Some(0) => vec![0u8; SECTOR],
        Some(v) => pattern(sector, v),
    }
}

/// Sector `s` of a recovered volume.
fn read_sector(v: &mut ScalaAfa<Ssd>, s: u64) -> Vec<u8> {
    let mut out = vec![0u8; SECTOR];
    v.submit(
        0,
        &Command::read(s, 1),
        ReadBuffers {
            data: &mut out,
            tags: None,
        },
    )
    .expect("read after recovery");
    out
}

/// Runs the clients on threads of their own and merges what they wrote.
fn run_clients(v: &ThreadedScalaAfa<Ssd>, ops: usize, trims: bool, seed: u64) -> Oracle {
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..CLIENTS)
            .map(|id| scope.spawn(move || client(v, id, ops, trims, seed)))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a client panicked"))
            .collect()
    })
}

fn check_all<D: BlockDevice>(v: &mut D, oracle: &Oracle) {
    let sectors = v.info().capacity_sectors;
    let mut out = vec![0u8; SECTOR];
    for s in 0..sectors {
        v.submit(
            u64::MAX / 2,
            &Command::read(s, 1),
            ReadBuffers {
                data: &mut out,
                tags: None,
            },
        )
        .expect("read");
        assert!(
            out == pattern_or_zero(s, oracle.get(&s).copied()),
            "sector {s} reads wrong"
        );
    }
}

#[test]
fn threads_keep_every_write_through_conversion_gc_and_an_orderly_stop() {
    for (level, n, threads) in [
        (Level::Raid5, 5, 3),
        (Level::Raid6, 6, 2),
        (Level::Raid5, 3, 1),
    ] {
        let v = volume(level, n, threads)
            .into_threads()
            .expect("threads start");
        assert_eq!(v.io_threads(), threads as usize);
        let mut oracle = run_clients(&v, 1500, true, n as u64);
        v.flush().expect("flush");
        // A second round on the same threads, after the daemon had idle time to convert.
        std::thread::sleep(Duration::from_millis(20));
        oracle.extend(run_clients(&v, 1500, true, 7 + n as u64));
        let mut back = v.stop().expect("orderly stop");
        assert!(
            v.write(0, &[0u8; SECTOR]).is_err(),
            "a stopped volume takes no writes"
        );
        let s = *back.stats();
        assert!(s.stripes_converted > 0, "{level:?}: {s:?}");
        // Three members leave more spare rows per chunk written than these runs use up.
        if n > 3 {
            assert!(s.gc_stripes > 0, "{level:?}: {s:?}");
        }
        assert!(s.grants > 1, "{level:?}: {s:?}");
        check_all(&mut back, &oracle);
        // The single-owner engine carries on from the threads' state, and back again.
        let v = back.into_threads().expect("threads start again");
        oracle.extend(run_clients(&v, 300, true, 11));
        let mut back = v.stop().expect("orderly stop");
        check_all(&mut back, &oracle);
    }
}

/// Recovery from the members the threads leave behind, after a crash (the tables lost at
/// once) and after an orderly stop (serve mode drops the tables at every stop and rebuilds
/// them at the next start), from the OOB tags alone and from the daemon's checkpoints
/// (taken every 5 ms, while the threads write).
#[test]
fn recovery_after_threads_crash_or_stop_loses_no_completed_write() {
    for seed in 0..3 {
        let checkpoint_interval_ms = if seed == 1 { 5.0 } else { 0.0 };
        for (level, n, threads) in [(Level::Raid5, 5, 2), (Level::Raid6, 6, 3)] {
            for crash in [true, false] {
                let mut engine = volume(level, n, threads);
                if checkpoint_interval_ms > 0.0 {
                    let config = engine.config.clone();
                    let scala = ScalaAfaConfig {
                        checkpoint_interval_ms,
                        ..engine.scala.clone()
                    };
                    let members = engine.into_members();
                    engine = ScalaAfa::new(config, scala, members, vec![]).unwrap();
                }
                let (config, scala) = (engine.config.clone(), engine.scala.clone());
                let v = engine.into_threads().expect("threads start");
                // Whole-chunk trims only unmap, and recovery may find a trimmed chunk's
                // last copy, so these runs do not trim.
                let oracle = run_clients(&v, 2000, false, 3 * seed + n as u64);
                let members = if crash {
                    v.crash().expect("crash")
                } else {
                    v.stop().expect("orderly stop").into_members()
                };
                let mut recovered =
                    ScalaAfa::recover(config, scala, members, vec![]).expect("recovery");
                if checkpoint_interval_ms > 0.0 {
                    assert!(
                        recovered.stats().recovered_checkpoint_seq.is_some(),
                        "{level:?}: the threads' daemon wrote no checkpoint"
                    );
                }
                check_all(&mut recovered, &oracle);
            }
        }
    }
}

/// One client's run until the power goes: writes of one or more sectors into its own chunks
/// (c mod CLIENTS = id), each read back, until a write or a read fails. Returns what was
/// acknowledged and the write the power cut (sector → version), if any.
fn client_until_cut(
    v: &ThreadedScalaAfa<PowerCut>,
    id: u64,
    seed: u64,
) -> (Oracle, HashMap<u64, u64>) {
    let chunk = v.chunk_sectors() as u64;
    let chunks = v.info().capacity_sectors / chunk;
    let mut rng = SimRng::new(seed * 100 + id);
    let mut oracle = Oracle::new();
    let mut version = 1 + id * 1_000_000;
    loop {
        let c = rng.below(chunks / CLIENTS) * CLIENTS + id;
        let first = c * chunk + rng.below(chunk);
        let len = 1 + rng.below(c * chunk + chunk - first);
        version += 1;
        let data: Vec<u8> = (first..first + len)
            .flat_map(|s| pattern(s, version))
            .collect();
        if v.write(first * SECTOR as u64, &data).is_err() {
            let torn = (first..first + len).map(|s| (s, version)).collect();
            return (oracle, torn);
        }
        for s in first..first + len {
            oracle.insert(s, version);
        }
        let mut out = vec![0u8; len as usize * SECTOR];
        if v.read(first * SECTOR as u64, &mut out).is_err() {
            return (oracle, HashMap::new());
        }
        assert!(
            out == data,
            "client {id}: a write read back wrong before the cut"
        );
    }
}

/// The power goes while the threads write: the members refuse every command after a budget
/// shared by all the members, so writes of several clients (in several hero
/// groups, and several slots of one group) are cut at once, in any order of their copies.
/// Recovery must give back every acknowledged write, and each sector of a cut write old or
/// new. The same with a member that failed before the threads started (they write around
/// it, and recovery is degraded).
#[test]
fn recovery_after_the_power_goes_while_threads_write() {
    let shapes = [
        (Level::Raid5, 5, 2),
        (Level::Raid6, 6, 3),
        (Level::Raid5, 4, 1),
    ];
    let cuts = [(300, None), (700, Some(1)), (1500, None), (3000, Some(1))];
    for ((level, n, threads), (budget, failed)) in shapes
        .into_iter()
        .flat_map(|shape| cuts.map(|cut| (shape, cut)))
    {
        let engine = volume(level, n, threads);
        let (config, scala) = (engine.config.clone(), engine.scala.clone());
        let members = PowerCut::members(engine.into_members(), budget);
        let mut engine = ScalaAfa::new(config.clone(), scala.clone(), members, vec![]).unwrap();
        if let Some(f) = failed {
            engine.fail_member(f, 0).unwrap();
        }
        let v = engine.into_threads().expect("threads start");
        let runs: Vec<(Oracle, HashMap<u64, u64>)> = std::thread::scope(|s| {
            let clients: Vec<_> = (0..CLIENTS)
                .map(|id| {
                    let v = &v;
                    s.spawn(move || client_until_cut(v, id, budget))
                })
                .collect();
            clients
                .into_iter()
                .map(|h| h.join().expect("a client panicked"))
                .collect()
        });
        let members = v.crash().expect("crash");
        let members = members.into_iter().map(|m| m.inner).collect();
        let mut recovered = match failed {
            None => ScalaAfa::recover(config, scala, members, vec![]),
            Some(f) => ScalaAfa::recover_degraded(config, scala, members, vec![], f),
        }
        .expect("recovery");
        let mut torn_sectors = 0;
        for (oracle, torn) in &runs {
            torn_sectors += torn.len();
            let mut sectors: Vec<u64> = oracle.keys().chain(torn.keys()).copied().collect();
            sectors.sort_unstable();
            sectors.dedup();
            for s in sectors {
                let out = read_sector(&mut recovered, s);
                let acked = pattern_or_zero(s, oracle.get(&s).copied());
                let cut = torn.get(&s).map(|&v| pattern(s, v));
                assert!(
                    out == acked || cut.is_some_and(|c| out == c),
                    "{level:?}: sector {s} lost its acknowledged write"
                );
            }
        }
        assert!(torn_sectors > 0, "{level:?}: no write was cut");
    }
}

/// Client `id` writes `count` runs of sectors inside its own chunks, each with a version of
/// its own, and notes every version each sector took.
fn client_writes(
    v: &ThreadedScalaAfa<PageCache>,
    id: u64,
    rng: &mut SimRng,
    version: &mut u64,
    count: usize,
) -> HashMap<u64, Vec<u64>> {
    let chunk = v.chunk_sectors() as u64;
    let chunks = v.info().capacity_sectors / chunk;
    let mut wrote: HashMap<u64, Vec<u64>> = HashMap::new();
    for _ in 0..count {
        let c = rng.below(chunks / CLIENTS) * CLIENTS + id;
        let first = c * chunk + rng.below(chunk);
        let len = 1 + rng.below(c * chunk + chunk - first);
        *version += 1;
        let data: Vec<u8> = (first..first + len)
            .flat_map(|s| pattern(s, *version))
            .collect();
        v.write(first * SECTOR as u64, &data).expect("write");
        for s in first..first + len {
            wrote.entry(s).or_default().push(*version);
        }
    }
    wrote
}

/// The host crashes under clients on threads, the members behind its page cache: rounds
/// of writes from every client, each ended by a FLUSH (so that heroes are held, trimmed
/// and handed out again while the clients write), then writes that are acknowledged but
/// not flushed, then the crash keeps or loses each unsynced command's data and tags.
/// Recovery must give back every sector as the last flush left it or as a later write.
#[test]
fn a_host_crash_under_threads_keeps_every_flushed_write() {
    let total = host_crash_under_threads(false);
    // The crashes kept tags without their data, and stripes were resynced.
    assert!(total.recovery_unwhole_copies > 0, "{total:?}");
    assert!(total.recovery_resynced_stripes > 0, "{total:?}");
}

/// The same on a volume that lost a member before the clients started (a dirty degraded
/// array after the crash): the lost member's flushed chunks come back from their backups
/// or their parity.
#[test]
fn a_host_crash_under_threads_on_a_degraded_volume_keeps_every_flushed_write() {
    let total = host_crash_under_threads(true);
    assert!(total.recovery_resynced_stripes > 0, "{total:?}");
}

/// Runs the host-crash rounds over both shapes and three seeds each, with a member failed
/// first if `degraded`; returns the recoveries' counters summed.
fn host_crash_under_threads(degraded: bool) -> ScalaAfaStats {
    let shapes = [(Level::Raid5, 5, 2), (Level::Raid6, 6, 3)];
    let mut total = ScalaAfaStats::default();
    for ((level, n, threads), seed) in shapes
        .into_iter()
        .flat_map(|shape| (1..=3u64).map(move |seed| (shape, seed)))
    {
        let lost: Vec<usize> = degraded
            .then_some((seed % n as u64) as usize)
            .into_iter()
            .collect();
        let engine = volume(level, n, threads);
        let (config, scala) = (engine.config.clone(), engine.scala.clone());
        let members = engine
            .into_members()
            .into_iter()
            .map(PageCache::new)
            .collect();
        let mut engine = ScalaAfa::new(config.clone(), scala.clone(), members, vec![]).unwrap();
        engine.keep_flushed_writes();
        for &f in &lost {
            engine.fail_member(f, 0).unwrap();
        }
        let v = engine.into_threads().expect("threads start");
        let mut rngs: Vec<SimRng> = (0..CLIENTS)
            .map(|id| SimRng::new(seed * 100 + id))
            .collect();
        let mut versions: Vec<u64> = (0..CLIENTS).map(|id| id * 1_000_000).collect();
        // Runs one round of `count` writes on every client at once.
        let mut round = |count: usize| -> Vec<HashMap<u64, Vec<u64>>> {
            std::thread::scope(|s| {
                let clients: Vec<_> = rngs
                    .iter_mut()
                    .zip(versions.iter_mut())
                    .enumerate()
                    .map(|(id, (rng, version))| {
                        let v = &v;
                        s.spawn(move || client_writes(v, id as u64, rng, version, count))
                    })
                    .collect();
                clients
                    .into_iter()
                    .map(|h| h.join().expect("a client panicked"))
                    .collect()
            })
        };
        let mut flushed: HashMap<u64, u64> = HashMap::new();
        for _ in 0..3 {
            for wrote in round(150) {
                for (s, vs) in wrote {
                    flushed.insert(s, *vs.last().unwrap());
                }
            }
            v.flush().expect("flush");
        }
        let mut since: HashMap<u64, Vec<u64>> = HashMap::new();
        for wrote in round(150) {
            for (s, vs) in wrote {
                since.entry(s).or_default().extend(vs);
            }
        }
        let mut rng = SimRng::new(seed);
        let members = v.crash().expect("crash");
        let members = members.into_iter().map(|m| m.crash(&mut rng)).collect();
        let mut recovered =
            ScalaAfa::recover_with(config, scala, members, vec![], &lost, true).expect("recovery");
        let mut sectors: Vec<u64> = flushed.keys().chain(since.keys()).copied().collect();
        sectors.sort_unstable();
        sectors.dedup();
        for s in sectors {
            let out = read_sector(&mut recovered, s);
            let at_flush = pattern_or_zero(s, flushed.get(&s).copied());
            let later = since.get(&s).into_iter().flatten();
            assert!(
                out == at_flush || later.clone().any(|&v| out == pattern(s, v)),
                "{level:?} seed {seed}: sector {s} reads neither as flushed nor as a later write"
            );
        }
        let st = recovered.stats();
        total.recovery_unwhole_copies += st.recovery_unwhole_copies;
        total.recovery_resynced_stripes += st.recovery_resynced_stripes;
    }
    total
}

/// A member that reports garbage collection in every completion when `gc` is set, whose
/// reads below `unreadable_below` (the HH area: the primaries) the SSD cannot correct, and
/// which logs when each of its commands and idle-time calls ran when it has a `log`.
#[derive(Debug)]
struct Collecting {
    inner: Ssd,
    gc: bool,
    unreadable_below: u64,
    /// (time, whether it was idle time) in the order they ran.
    log: Option<IdleLog>,
}

type IdleLog = std::sync::Arc<std::sync::Mutex<Vec<(TimeNs, bool)>>>;

impl Collecting {
    fn note(&self, now_ns: TimeNs, idle: bool) {
        if let Some(log) = &self.log {
            log.lock().unwrap().push((now_ns, idle));
        }
    }
}

impl BlockDevice for Collecting {
    fn info(&self) -> DeviceInfo {
        self.inner.info()
    }
    fn submit(
        &mut self,
        now_ns: TimeNs,
        cmd: &Command<'_>,
        out: ReadBuffers<'_>,
    ) -> Result<Completion, DeviceError> {
        self.note(now_ns, false);
        if cmd.opcode == Opcode::Read && cmd.lba < self.unreadable_below {
            return Err(DeviceError::Uncorrectable {
                lba: cmd.lba,
                sectors: cmd.sectors,
            });
        }
        let c = self.inner.submit(now_ns, cmd, out)?;
        Ok(Completion {
            gc_active: c.gc_active || self.gc,
            ..c
        })
    }
    fn convert(&mut self, now_ns: TimeNs, cmd: &ConvertCommand) -> Result<Completion, DeviceError> {
        self.note(now_ns, false);
        self.inner.convert(now_ns, cmd)
    }
    fn background(&mut self, now_ns: TimeNs) -> Option<TimeNs> {
        self.note(now_ns, true);
        self.inner.background(now_ns)
    }
    fn scan_tags(&self, lba: u64, sectors: u32) -> Option<Vec<u8>> {
        self.inner.scan_tags(lba, sectors)
    }
}

/// `engine`'s volume on threads over [`Collecting`] members: member i reports garbage
/// collection when `gc(i)`, and no member can correct its sectors below `unreadable_below`.
fn on_collecting_members(
    engine: ScalaAfa<Ssd>,
    gc: impl Fn(usize) -> bool,
    unreadable_below: u64,
) -> ThreadedScalaAfa<Collecting> {
    let (config, scala) = (engine.config.clone(), engine.scala.clone());
    let members = engine
        .into_members()
        .into_iter()
        .enumerate()
        .map(|(i, inner)| Collecting {
            inner,
            gc: gc(i),
            unreadable_below,
            log: None,
        })
        .collect();
    ScalaAfa::new(config, scala, members, vec![])
        .unwrap()
        .into_threads()
        .expect("threads start")
}

/// §5.3 on threads: a read whose home member reports garbage collection goes to a calm
/// replica while its group is in replication, and to the primary once the replica's tags
/// no longer name the chunk (its stripe converted in the idle time between the rounds).
/// Every read is checked, and the orderly stop's table check still holds.
#[test]
fn threads_read_replicas_while_a_home_member_collects_garbage() {
    let v = on_collecting_members(volume(Level::Raid5, 5, 2), |i| i == 1, 0);
    let chunk = v.chunk_sectors() as u64;
    let mut oracle = Oracle::new();
    for round in 0..3u64 {
        let version = 10 + round;
        for c in 0..40 {
            let data: Vec<u8> = (c * chunk..(c + 1) * chunk)
                .flat_map(|s| pattern(s, version))
                .collect();
            v.write(c * chunk * SECTOR as u64, &data).expect("write");
            (c * chunk..(c + 1) * chunk).for_each(|s| {
                oracle.insert(s, version);
            });
        }
        for c in 0..40 {
            let mut out = vec![0u8; chunk as usize * SECTOR];
            v.read(c * chunk * SECTOR as u64, &mut out).expect("read");
            let want: Vec<u8> = (c * chunk..(c + 1) * chunk)
                .flat_map(|s| pattern(s, version))
                .collect();
            assert!(out == want, "round {round}: chunk {c} reads wrong");
        }
        // Idle time: the daemon converts the full groups, and their replicas go.
        std::thread::sleep(Duration::from_millis(20));
        for c in 0..40 {
            let mut out = vec![0u8; chunk as usize * SECTOR];
            v.read(c * chunk * SECTOR as u64, &mut out).expect("read");
            assert!(
                out[..SECTOR] == pattern(c * chunk, version)[..],
                "round {round}: chunk {c} reads wrong after conversion"
            );
        }
    }
    let mut back = v.stop().expect("orderly stop");
    assert!(back.stats().replica_reads > 0, "{:?}", back.stats());
    check_all(&mut back, &oracle);
}

/// On threads, a primary the SSD cannot correct is read from its replica while its group
/// is in replication. Every member's primaries are unreadable here, and the one I/O thread
/// writes fewer chunks than a group holds, so the group stays open and no conversion takes
/// the replicas away.
#[test]
fn threads_read_a_replica_when_the_primary_cannot_be_corrected() {
    let engine = volume(Level::Raid5, 5, 1);
    let hh_area = engine.rows as u64 * engine.chunk_sectors() as u64;
    let v = on_collecting_members(engine, |_| false, hh_area);
    let chunk = v.chunk_sectors() as u64;
    for c in 0..3 {
        let data: Vec<u8> = (c * chunk..(c + 1) * chunk)
            .flat_map(|s| pattern(s, 1))
            .collect();
        v.write(c * chunk * SECTOR as u64, &data).expect("write");
        let mut out = vec![0u8; data.len()];
        v.read(c * chunk * SECTOR as u64, &mut out)
            .expect("read from the replica");
        assert!(out == data, "chunk {c} reads wrong");
        // A part of the chunk, too (the copy's sectors are cut the same way).
        let mut part = vec![0u8; SECTOR];
        v.read((c * chunk + 1) * SECTOR as u64, &mut part)
            .expect("read from the replica");
        assert!(
            part == pattern(c * chunk + 1, 1),
            "chunk {c} reads wrong in part"
        );
    }
    let back = v.stop().expect("orderly stop");
    assert_eq!(back.stats().read_errors_corrected, 6, "{:?}", back.stats());
}

/// With members failed before the threads start (and no spare to rebuild onto), the
/// threads serve degraded: no copy goes to a failed member, and a chunk whose home failed
/// is read from a replica or decoded from its stripe, through conversion and GC, with every
/// read checked by the clients. The orderly stop's tables agree, and a crash recovers
/// degraded.
#[test]
fn threads_serve_degraded_with_failed_members() {
    for (level, n, threads, failed) in [
        (Level::Raid5, 5, 2, vec![1]),
        (Level::Raid6, 6, 3, vec![0, 4]),
    ] {
        for crash in [false, true] {
            let mut engine = volume(level, n, threads);
            for &f in &failed {
                engine.fail_member(f, 0).unwrap();
            }
            let (config, scala) = (engine.config.clone(), engine.scala.clone());
            let v = engine
                .into_threads()
                .expect("threads start with failed members");
            // Whole-chunk trims only unmap, and a recovery may find a trimmed chunk's last
            // copy, so the runs that crash do not trim.
            let oracle = run_clients(&v, 1500, !crash, 7 + n as u64);
            if crash {
                let members = v.crash().expect("crash");
                let mut recovered =
                    ScalaAfa::recover_without(config, scala, members, vec![], &failed)
                        .expect("recovery");
                check_all(&mut recovered, &oracle);
            } else {
                let mut back = v.stop().expect("orderly stop");
                assert!(
                    back.stats().degraded_reads > 0,
                    "{level:?}: {:?}",
                    back.stats()
                );
                check_all(&mut back, &oracle);
            }
        }
    }
}

/// On threads too, a chunk of a lost member decoded from a parity whose tags outlived its
/// data (a host crash) fails the read instead of returning other bytes.
#[test]
fn threads_fail_a_decode_that_misses_its_checksums() {
    let mut engine = volume(Level::Raid5, 5, 2);
    let cs = engine.chunk_sectors();
    // Eight whole chunks fill the two I/O threads' hero groups, converted when idle.
    for c in 0..8u64 {
        let data: Vec<u8> = (0..cs as u64)
            .flat_map(|i| pattern(c * cs as u64 + i, 1))
            .collect();
        engine
            .submit(
                0,
                &Command::write(c * cs as u64, cs, &data),
                ReadBuffers::none(),
            )
            .unwrap();
    }
    engine.background(1_000_000_000);
    assert_eq!(engine.stats().stripes_converted, 2);
    let a = engine.amt[4];
    let (stripe, j) = (a / 4, (a % 4) as usize);
    let (d, p) = (
        engine.data_member(stripe, j),
        engine.parity_member(stripe, 0),
    );
    let lba = engine.hh_lba(stripe);
    // The parity's data goes back to something else; its tags stay.
    let tags = engine.members[p].device.scan_tags(lba, cs).unwrap();
    let garbage = vec![0x5au8; cs as usize * SECTOR];
    let stale = Command {
        tags: Some(&tags),
        ..Command::write(lba, cs, &garbage)
    };
    engine.members[p]
        .device
        .submit(1_000_000_000, &stale, ReadBuffers::none())
        .unwrap();
    engine.fail_member(d, 1_000_000_000).unwrap();
    let v = engine.into_threads().expect("threads start");
    let mut out = vec![0u8; SECTOR];
    let err = v.read(4 * cs as u64 * SECTOR as u64, &mut out).unwrap_err();
    assert!(matches!(err, DeviceError::Medium(_)), "{err:?}");
    // Chunks on members that serve read as written.
    v.read(0, &mut out).unwrap();
    assert_eq!(out, pattern(0, 1));
    v.stop().expect("orderly stop");
}

#[test]
fn threads_are_refused_while_a_member_is_rebuilt() {
    let scala = ScalaAfaConfig {
        io_threads: 2,
        ..ScalaAfaConfig::default()
    };
    // With a spare, the failed member's place is rebuilt, which is the single-owner
    // engine's to do.
    let mut v = engine_keeping(PayloadMode::Full, Level::Raid5, 5, 1, scala);
    v.fail_member(1, 0).unwrap();
    let (mut back, why) = v.into_threads().expect_err("refused");
    assert!(why.contains("rebuilt"), "{why}");
    // The engine comes back whole and still serves.
    let data = pattern(0, 1);
    back.submit(0, &Command::write(0, 1, &data), ReadBuffers::none())
        .unwrap();
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: afa_sim::proptest_cases(10), ..Default::default() })]

    /// Random byte-granular writes, reads and trims through the threads, one request at a
    /// time or started together as a burst, against a byte oracle; then an orderly stop and
    /// every byte read back through the single-owner engine.
    #[test]
    fn threads_match_a_byte_oracle(
        threads in 1u32..4,
        ops in proptest::collection::vec((0u8..5, proptest::prelude::any::<u64>(), 1usize..20_000), 1..120),
    ) {
        let v = volume(Level::Raid5, 5, threads).into_threads().expect("threads start");
        let size = (v.info().capacity_sectors * SECTOR as u64) as usize;
        let sectors = v.info().capacity_sectors as u32;
        proptest::prop_assert_eq!(v.allocation(0, sectors), Some(vec![(sectors, false)]), "a new volume is all holes");
        let mut oracle = vec![0u8; size];
        let bytes = |seed: usize, len: usize| -> Vec<u8> {
            (0..len).map(|i| (seed.wrapping_mul(131) ^ i.wrapping_mul(7)) as u8).collect()
        };
        for (i, &(kind, at, len)) in ops.iter().enumerate() {
            let at = (at % size as u64) as usize;
            let len = len.min(size - at);
            match kind {
                0 | 1 => {
                    let data = bytes(i + 1, len);
                    v.write(at as u64, &data).expect("write");
                    oracle[at..at + len].copy_from_slice(&data);
                }
                2 => {
                    let mut out = vec![0u8; len];
                    v.read(at as u64, &mut out).expect("read");
                    proptest::prop_assert!(out == oracle[at..at + len], "read at {} of {}", at, len);
                }
                3 => {
                    v.trim(at as u64, len as u64).expect("trim");
                    oracle[at..at + len].fill(0);
                }
                _ => {
                    // A burst of disjoint writes started together, then read back together.
                    let step = len.max(1);
                    let starts: Vec<usize> = (0..6).map(|k| at + k * step).filter(|&a| a + len <= size).collect();
                    let started: Vec<_> = starts
                        .iter()
                        .enumerate()
                        .map(|(k, &a)| v.start_write(a as u64, &bytes(i * 10 + k, len)))
                        .collect();
                    for w in started {
                        w.finish(&mut []).expect("write");
                    }
                    for (k, &a) in starts.iter().enumerate() {
                        oracle[a..a + len].copy_from_slice(&bytes(i * 10 + k, len));
                    }
                    let started: Vec<_> = starts.iter().map(|&a| v.start_read(a as u64, len)).collect();
                    for (r, &a) in started.into_iter().zip(&starts) {
                        let mut out = vec![0u8; len];
                        r.finish(&mut out).expect("read");
                        proptest::prop_assert!(out == oracle[a..a + len], "burst read at {}", a);
                    }
                }
            }
        }
        // Block status through the threads: no hole holds data, and the answer is the
        // single-owner engine's once the threads hand their tables back.
        let runs = v.allocation(0, sectors).expect("the threads know their allocation");
        let mut at = 0usize;
        for &(n, allocated) in &runs {
            let bytes = at * SECTOR..(at + n as usize) * SECTOR;
            proptest::prop_assert!(allocated || oracle[bytes].iter().all(|&b| b == 0), "a hole at sector {} holds data", at);
            at += n as usize;
        }
        proptest::prop_assert_eq!(at, sectors as usize);
        let mut back = v.stop().expect("orderly stop");
        proptest::prop_assert_eq!(back.allocation(0, sectors), Some(runs));
        let mut out = vec![0u8; SECTOR];
        for s in 0..size / SECTOR {
            back.submit(0, &Command::read(s as u64, 1), ReadBuffers { data: &mut out, tags: None })
                .expect("read");
            proptest::prop_assert!(out[..] == oracle[s * SECTOR..(s + 1) * SECTOR], "sector {}", s);
        }
    }
}

/// On threads the member SSDs get idle time (their background GC and idle erases) from
/// the idle thread: only once no command has reached them for `MEMBER_IDLE_NS`, and every
/// member gets some once the clients stop. Each device's clock never runs backwards, so
/// commands from the I/O threads, the daemon and idle time interleave in time order.
#[test]
fn members_get_idle_time_only_when_their_commands_stop() {
    let engine = volume(Level::Raid5, 5, 2);
    let (config, scala) = (engine.config.clone(), engine.scala.clone());
    let logs: Vec<_> = (0..5)
        .map(|_| std::sync::Arc::new(std::sync::Mutex::new(Vec::new())))
        .collect();
    let members = engine
        .into_members()
        .into_iter()
        .zip(&logs)
        .map(|(inner, log)| Collecting {
            inner,
            gc: false,
            unreadable_below: 0,
            log: Some(log.clone()),
        })
        .collect();
    let v = ScalaAfa::new(config, scala, members, vec![])
        .unwrap()
        .into_threads()
        .expect("threads start");
    let chunk = v.chunk_sectors() as u64;
    // Rounds of writes long enough for the idle thread to look at the members meanwhile,
    // each followed by a pause long enough for idle time.
    for round in 0..3u64 {
        let start = std::time::Instant::now();
        let mut c = 0;
        while start.elapsed() < Duration::from_millis(20) {
            let data: Vec<u8> = (c * chunk..(c + 1) * chunk)
                .flat_map(|s| pattern(s, round + 1))
                .collect();
            v.write(c * chunk * SECTOR as u64, &data).expect("write");
            c = (c + 1) % 30;
        }
        std::thread::sleep(Duration::from_millis(30));
    }
    // A loaded test machine may run the idle thread late: wait for it, within reason.
    let idle_seen = || {
        logs.iter()
            .all(|log| log.lock().unwrap().iter().any(|&(_, idle)| idle))
    };
    let waited = std::time::Instant::now();
    while !idle_seen() && waited.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    v.stop().expect("orderly stop");
    for (i, log) in logs.iter().enumerate() {
        let log = log.lock().unwrap();
        assert!(
            log.iter().any(|&(_, idle)| idle),
            "member {i} got no idle time"
        );
        let mut last_command_ns = None;
        let mut previous_ns = 0;
        for &(t, idle) in log.iter() {
            assert!(t >= previous_ns, "member {i}: its clock went back");
            previous_ns = t;
            match (idle, last_command_ns) {
                (false, _) => last_command_ns = Some(t),
                (true, Some(c)) => assert!(
                    t - c >= super::threaded::MEMBER_IDLE_NS,
                    "member {i}: idle time {} ns after a command",
                    t - c
                ),
                (true, None) => {}
            }
        }
    }
}

/// Eight threads on RAID 6 of six members with four VHs each, the case of
/// `a_thread_whose_rows_need_vhs_held_in_open_groups_gets_them_sealed` on threads: the
/// daemon cannot close a thread's group itself, so it asks the threads whose open groups
/// hold the short members' VHs to seal them. Every write lands; before, a thread waited
/// out its grant timeout and failed the write.
#[test]
fn threads_seal_their_open_groups_when_the_daemon_asks() {
    let scala = super::tests::hero_starved_config();
    let v = engine_keeping(PayloadMode::Full, Level::Raid6, 6, 0, scala)
        .into_threads()
        .expect("threads start");
    let cs = v.chunk_sectors() as u64;
    let chunks = v.info().capacity_sectors / cs;
    let mut oracle = Oracle::new();
    for round in 1..=2 {
        for c in 0..chunks {
            let data: Vec<u8> = (0..cs).flat_map(|i| pattern(c * cs + i, round)).collect();
            v.write(c * cs * SECTOR as u64, &data)
                .unwrap_or_else(|e| panic!("round {round}, chunk {c}: {e}"));
            oracle.extend((0..cs).map(|i| (c * cs + i, round)));
        }
    }
    let mut back = v.stop().expect("orderly stop");
    assert!(back.stats().groups_sealed > 0, "{:?}", back.stats());
    check_all(&mut back, &oracle);
}
