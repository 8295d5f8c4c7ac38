//! SWAN's battery-backed host memory (§4.1) as a log that outlives the host.
//!
//! The paper keeps the open stripes and the open segments' block lists in battery-backed
//! memory, so an acknowledged write is durable before it reaches an SSD, and recovery after a
//! power loss reads the segment summaries of the full segments plus that memory. In
//! simulation the memory is the engine's own state and nothing is lost. To survive a real
//! crash of the process (serve mode with `--state`), the same contents are kept in an
//! [`NvramLog`]: every block appended to an open segment is recorded, with its data, before
//! the append returns; every segment opened is recorded; when a segment closes (its summary is
//! on the members) the log is replaced by the open streams alone, so it never holds more than
//! the open segments.
//!
//! Recovery ([`Swan::recover_from_nvram`]) reads the log, restores each stream's open
//! segment, block list and open stripe, rebuilds the map from the summaries and those lists
//! (the newest write sequence number wins), and writes again any stripe of an open segment
//! that the log holds whole, because a crash may have come between the record of a stripe's
//! last block and the stripe's write to the members. The log's frames are `crate::nvram`'s.

use afa_sim::TimeNs;
use afa_ssd::{BlockDevice, Command, DeviceError, ReadBuffers};

use super::{SegmentState, Swan, NONE};
use crate::nvram::{logged_streams, NvramLog, OpenSegment};
use crate::trims::TRIM_RECORD;

impl<D: BlockDevice> Swan<D> {
    /// Keeps the host NVRAM's contents in `log` from now on. Attach it to a new, empty
    /// volume, or to one about to be recovered from the same log.
    pub fn attach_nvram(&mut self, log: Box<dyn NvramLog>) {
        self.nvram.attach(log);
    }

    /// Stream number of the user stream (`None`) or group `g`'s GC stream.
    pub(super) fn stream_id(gc: Option<usize>) -> u32 {
        gc.map_or(0, |g| g as u32 + 1)
    }

    /// Replaces the log by the open streams alone (`Nvram::replace_with`).
    pub(super) fn compact_nvram(&mut self) -> Result<(), DeviceError> {
        let streams = std::iter::once((None, &self.user)).chain(
            self.gc_streams
                .iter()
                .enumerate()
                .map(|(g, s)| (Some(g), s)),
        );
        let open = streams
            .filter(|(_, s)| s.segment != NONE)
            .map(|(gc, s)| OpenSegment {
                stream: Self::stream_id(gc),
                segment: s.segment,
                seq: self.seq[s.segment as usize],
                first: s.segment * self.segment_sectors,
                head: s.head,
                stripe_sectors: self.stripe_sectors,
                lbas: &s.lbas,
                stripe_buf: &s.stripe_buf,
                unit: self.unit,
            });
        self.nvram.replace_with(open)
    }

    /// Recovers a volume from its members and its NVRAM log after the host lost its memory
    /// (module doc). Call on a volume just built over the same members, with the same log
    /// attached. Returns when the summary reads and stripe rewrites are done.
    pub fn recover_from_nvram(&mut self, now_ns: TimeNs) -> Result<TimeNs, DeviceError> {
        let logged = logged_streams(&self.nvram.contents("SWAN")?, 1 + self.gc_streams.len())?;
        let d = self.data_blocks() as usize;
        let segments = self.state.len() as u32;
        let unit = self.unit;
        for (id, entry) in logged.iter().enumerate() {
            let Some(l) = entry else { continue };
            if l.segment >= segments || l.blocks.len() > d {
                return Err(DeviceError::Unsupported(format!(
                    "the SWAN NVRAM log holds segment {} with {} blocks; this volume has {segments} segments of {d}",
                    l.segment,
                    l.blocks.len()
                )));
            }
            let gc = id.checked_sub(1);
            let s = match gc {
                Some(g) => &mut self.gc_streams[g],
                None => &mut self.user,
            };
            s.segment = l.segment;
            s.head = l.segment * self.segment_sectors + l.blocks.len() as u32;
            s.lbas = l.blocks.iter().map(|&(lba, w, _)| (lba, w)).collect();
            self.seq[l.segment as usize] = l.seq;
            self.next_seq = self.next_seq.max(l.seq + 1);
        }
        // The trim records of the open segments, as the log holds them: their stripes may
        // not be on the members.
        let mut records = std::collections::BTreeMap::new();
        for l in logged.iter().flatten() {
            let first = l.segment * self.segment_sectors;
            for (i, (lba, _, data)) in l.blocks.iter().enumerate() {
                if *lba == TRIM_RECORD && data.len() == unit {
                    records.insert(first + i as u32, data.clone());
                }
            }
        }
        let mut done = self.rebuild_map_with(now_ns, &records)?;
        let now_ns = now_ns + self.epoch_ns;
        // Stripes of the open segments: the one being filled goes back into host memory;
        // a complete one the log holds whole is written again (it may have missed the
        // members); the others were on the members before the log was last replaced.
        for (id, entry) in logged.iter().enumerate() {
            let Some(l) = entry else { continue };
            let gc = id.checked_sub(1);
            let first = l.segment * self.segment_sectors;
            let ss = self.stripe_sectors as usize;
            let head = l.blocks.len();
            for (stripe, blocks) in l.blocks.chunks(ss).enumerate() {
                if blocks.iter().any(|(_, _, data)| data.len() != unit) {
                    continue;
                }
                let start = first + (stripe * ss) as u32;
                let (g, at) = (self.group_of(start), self.group_lba(start));
                let s = match gc {
                    Some(g) => &mut self.gc_streams[g],
                    None => &mut self.user,
                };
                for (i, (_, _, data)) in blocks.iter().enumerate() {
                    s.stripe_buf[i * unit..(i + 1) * unit].copy_from_slice(data);
                }
                if blocks.len() == ss {
                    let c = self.groups[g].submit(
                        now_ns,
                        &Command::write(at, ss as u32, &s.stripe_buf),
                        ReadBuffers::none(),
                    )?;
                    done = done.max(c.done_ns - self.epoch_ns);
                }
            }
            if head == d {
                // Every data block is in: the segment was closing when the crash came.
                let t = self.end_segment(gc, now_ns)?;
                done = done.max(t - self.epoch_ns);
            }
        }
        // The user stream's group takes the writes; with no open user segment, the group
        // with the most free segments does, as when the front-end moves.
        self.front = if self.user.segment != NONE {
            self.group_of(self.user.segment * self.segment_sectors)
        } else {
            (0..self.groups.len())
                .max_by_key(|&g| (self.free[g].len(), std::cmp::Reverse(g)))
                .expect("SWAN has at least two groups")
        };
        debug_assert!(self
            .state
            .iter()
            .enumerate()
            .filter(|(_, &st)| st == SegmentState::Open)
            .all(|(seg, _)| {
                std::iter::once(&self.user)
                    .chain(&self.gc_streams)
                    .any(|s| s.segment == seg as u32)
            }));
        self.compact_nvram()?;
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use afa_nand::{fill_unit, sector_token};
    use afa_sim::SimRng;
    use afa_ssd::Ssd;

    use std::sync::Arc;

    use super::*;
    use crate::nvram::MemNvram;
    use crate::swan::SwanConfig;
    use crate::tests::{check_volatile, run_volatile_until_crash, ssd_config, Crashing, Durable};
    use crate::{ArrayConfig, Level};

    fn config(level: Level, groups: u32, width: u32) -> (ArrayConfig, SwanConfig) {
        let array = ArrayConfig {
            level,
            members: groups * width,
            chunk_bytes: 4096,
            ..ArrayConfig::default()
        };
        let k = if level == Level::Raid0 {
            width
        } else {
            width - 1
        } as u64;
        let swan = SwanConfig {
            groups,
            segment_bytes: 4096 * k * 2,
            spare_fraction: 0.3,
            ..SwanConfig::default()
        };
        (array, swan)
    }

    fn members(n: u32) -> Vec<Ssd> {
        let mut cfg = ssd_config();
        cfg.payload = afa_nand::PayloadMode::Full;
        (0..n as u64)
            .map(|i| Ssd::new(cfg.clone(), i).unwrap())
            .collect()
    }

    fn volume<'a>(
        level: Level,
        groups: u32,
        width: u32,
        ssds: &'a mut [Ssd],
        log: &MemNvram,
    ) -> Swan<&'a mut Ssd> {
        volume_over(level, groups, width, ssds.iter_mut().collect(), log)
    }

    fn volume_over<D: BlockDevice>(
        level: Level,
        groups: u32,
        width: u32,
        devices: Vec<D>,
        log: &MemNvram,
    ) -> Swan<D> {
        let (array, swan) = config(level, groups, width);
        let mut v = Swan::new(array, swan, devices, Vec::new()).unwrap();
        v.attach_nvram(Box::new(log.clone()));
        v
    }

    fn submit<D: BlockDevice>(v: &mut Swan<D>, now_ns: TimeNs, cmd: &Command<'_>, out: &mut [u8]) {
        let out = ReadBuffers {
            data: out,
            tags: None,
        };
        v.submit(now_ns, cmd, out).unwrap();
    }

    /// Writes (random, overlapping, through GC) and flushes until op `crash_at`, then drops
    /// the engine: the host's memory is gone, the members and the NVRAM log are not.
    fn run_until_crash<D: BlockDevice>(
        v: &mut Swan<D>,
        oracle: &mut [u64],
        rng: &mut SimRng,
        crash_at: usize,
    ) {
        let unit = v.info().payload_unit_bytes as usize;
        let cap = oracle.len() as u64;
        for op in 0..crash_at {
            let now = op as u64 * 20_000;
            if rng.below(50) == 0 {
                submit(v, now, &Command::flush(), &mut []);
                continue;
            }
            let len = 1 + rng.below(12) as u32;
            let lba = rng.below(cap - len as u64);
            if rng.below(10) == 0 {
                // An acknowledged trim must survive the crash too: the blocks read as zeros.
                submit(v, now, &Command::trim(lba, len), &mut []);
                oracle[lba as usize..(lba + len as u64) as usize].fill(0);
                continue;
            }
            let mut data = vec![0u8; len as usize * unit];
            for i in 0..len as usize {
                let t = sector_token(lba + i as u64, op as u64 + 1);
                fill_unit(t, &mut data[i * unit..(i + 1) * unit]);
                oracle[lba as usize + i] = t;
            }
            submit(v, now, &Command::write(lba, len, &data), &mut []);
        }
    }

    fn check_all<D: BlockDevice>(v: &mut Swan<D>, oracle: &[u64], now_ns: TimeNs) {
        let unit = v.info().payload_unit_bytes as usize;
        let mut out = vec![0u8; unit];
        let mut want = vec![0u8; unit];
        for (lba, &t) in oracle.iter().enumerate() {
            submit(v, now_ns, &Command::read(lba as u64, 1), &mut out);
            if t == 0 {
                want.fill(0);
            } else {
                fill_unit(t, &mut want);
            }
            assert!(out == want, "sector {lba} lost or wrong after recovery");
        }
    }

    /// Power loss at many points of a run that cleans segments: recovery from the summaries
    /// and the NVRAM log loses no acknowledged write, and the volume goes on working.
    #[test]
    fn no_acknowledged_write_is_lost_at_any_crash_point() {
        for (level, groups, width) in [(Level::Raid0, 3, 2), (Level::Raid5, 2, 3)] {
            let mut rng = SimRng::new(31 + groups as u64);
            let mut cleaned = 0;
            for _ in 0..6 {
                let mut ssds = members(groups * width);
                let log = MemNvram::default();
                let cap = volume(level, groups, width, &mut ssds, &log)
                    .info()
                    .capacity_sectors;
                let mut oracle = vec![0u64; cap as usize];
                // Up to about three times the volume written: crashes before, during and
                // after segment cleaning.
                let crash_at = (cap / 16 + rng.below(cap / 2)) as usize;
                cleaned += {
                    let mut v = volume(level, groups, width, &mut ssds, &log);
                    run_until_crash(&mut v, &mut oracle, &mut rng, crash_at);
                    v.check_invariants();
                    v.stats().segments_cleaned
                };
                let mut v = volume(level, groups, width, &mut ssds, &log);
                let t = v.recover_from_nvram(1 << 40).unwrap();
                v.check_invariants();
                check_all(&mut v, &oracle, t);
                // A second life: more writes, another crash, another recovery.
                run_until_crash(&mut v, &mut oracle, &mut rng, 200);
                drop(v);
                let mut v = volume(level, groups, width, &mut ssds, &log);
                let t = v.recover_from_nvram(1 << 41).unwrap();
                check_all(&mut v, &oracle, t);
            }
            assert!(cleaned > 0, "{level:?}: the runs never cleaned a segment");
        }
    }

    /// A volume of segments of `stripes` stripes over RAID 5 groups of 2 + 1, with its log.
    fn volume_of<'a>(stripes: u64, ssds: &'a mut [Ssd], log: &MemNvram) -> Swan<&'a mut Ssd> {
        let (array, mut swan) = config(Level::Raid5, 2, 3);
        swan.segment_bytes = 4096 * 2 * stripes;
        let mut v = Swan::new(array, swan, ssds.iter_mut().collect(), Vec::new()).unwrap();
        v.attach_nvram(Box::new(log.clone()));
        v
    }

    /// A segment whose summary outgrows its last block keeps it in its last blocks: inside
    /// the last stripe, as that whole stripe, and across the last two. Recovery reads them
    /// all at any crash point and loses no acknowledged write.
    #[test]
    fn summaries_of_several_blocks_recover_at_any_crash_point() {
        // Stripes of 16 blocks of 512 B; a block holds the entries of 36 blocks.
        for (stripes, summary_blocks) in [(8, 4), (40, 16), (44, 18)] {
            let mut rng = SimRng::new(stripes);
            let mut cleaned = 0;
            for _ in 0..4 {
                let mut ssds = members(6);
                let log = MemNvram::default();
                let v = volume_of(stripes, &mut ssds, &log);
                assert_eq!(v.summary_blocks, summary_blocks, "{stripes} stripes");
                let cap = v.info().capacity_sectors;
                drop(v);
                let mut oracle = vec![0u64; cap as usize];
                let crash_at = (cap / 16 + rng.below(cap / 2)) as usize;
                cleaned += {
                    let mut v = volume_of(stripes, &mut ssds, &log);
                    run_until_crash(&mut v, &mut oracle, &mut rng, crash_at);
                    v.check_invariants();
                    v.stats().segments_cleaned
                };
                let mut v = volume_of(stripes, &mut ssds, &log);
                let t = v.recover_from_nvram(1 << 40).unwrap();
                v.check_invariants();
                check_all(&mut v, &oracle, t);
            }
            assert!(
                cleaned > 0,
                "{stripes} stripes: the runs never cleaned a segment"
            );
        }
    }

    /// Power cut at every member write of the close of a segment whose summary spans two
    /// stripes (18 blocks: the last 2 of the last data stripe and a stripe of 16): recovery
    /// writes the summary again from the log, and after the log is replaced the summary on
    /// the members alone holds the segment.
    #[test]
    fn a_summary_cut_short_across_two_stripes_is_written_again_from_the_log() {
        use crate::tests::PowerCut;
        const STRIPES: u64 = 44;
        // Writes the first segment's data blocks one at a time until the budget of member
        // commands runs out. Returns the oracle, the sector whose write failed (with its
        // token) and the budget spent before the segment's last block and in all.
        let run = |budget: u64, ssds: &mut [Ssd], log: &MemNvram| {
            let devices = PowerCut::members(ssds.iter_mut().collect::<Vec<_>>(), budget);
            let left = devices[0].budget.clone();
            let spent = || budget - left.load(std::sync::atomic::Ordering::SeqCst);
            let (array, mut swan) = config(Level::Raid5, 2, 3);
            swan.segment_bytes = 4096 * 2 * STRIPES;
            let mut v = Swan::new(array, swan, devices, Vec::new()).unwrap();
            v.attach_nvram(Box::new(log.clone()));
            assert_eq!(v.summary_blocks, 18);
            let (d, unit) = (v.data_blocks() as u64, v.info().payload_unit_bytes as usize);
            let mut oracle = vec![0u64; v.info().capacity_sectors as usize];
            let (mut cut, mut before_last) = (None, 0);
            let mut data = vec![0u8; unit];
            for lba in 0..d {
                if lba == d - 1 {
                    before_last = spent();
                }
                let t = sector_token(lba, 1);
                fill_unit(t, &mut data);
                let cmd = Command::write(lba, 1, &data);
                match v.submit(lba * 20_000, &cmd, ReadBuffers::none()) {
                    Ok(_) => oracle[lba as usize] = t,
                    Err(_) => {
                        cut = Some((lba, t));
                        break;
                    }
                }
            }
            (oracle, cut, before_last, spent())
        };
        let (_, cut, first, last) = run(u64::MAX, &mut members(6), &MemNvram::default());
        assert!(cut.is_none());
        // The last data block ends its stripe's data and the summary fills the stripe and
        // one more: two full-stripe writes of three members each.
        assert_eq!(last - first, 6);
        for budget in first..last {
            let mut ssds = members(6);
            let log = MemNvram::default();
            let (mut oracle, cut, _, _) = run(budget, &mut ssds, &log);
            let (lba, token) = cut.expect("the budget runs out inside the segment's close");
            for life in 0..2 {
                let mut v = volume_of(STRIPES, &mut ssds, &log);
                let t = v.recover_from_nvram(1 << 40).unwrap();
                v.check_invariants();
                let unit = v.info().payload_unit_bytes as usize;
                let (mut out, mut want) = (vec![0u8; unit], vec![0u8; unit]);
                submit(&mut v, t, &Command::read(lba, 1), &mut out);
                fill_unit(token, &mut want);
                if life == 0 && out == want {
                    oracle[lba as usize] = token;
                }
                check_all(&mut v, &oracle, t);
                if life == 0 {
                    assert_eq!(v.state[0], SegmentState::Full, "budget {budget}");
                }
            }
        }
    }

    /// The crash comes at a member write: the stripe the log holds whole never reached the
    /// members (sometimes the one carrying a segment's summary). Recovery writes it again;
    /// every acknowledged write is there, and the write cut short is there wholly or in part
    /// (each of its sectors old or new).
    #[test]
    fn a_stripe_that_missed_the_members_is_written_again_from_the_log() {
        let (level, groups, width) = (Level::Raid5, 2, 3);
        let mut rng = SimRng::new(77);
        for _ in 0..8 {
            let mut ssds = members(groups * width);
            let log = MemNvram::default();
            let crash = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let cap = volume(level, groups, width, &mut ssds, &log)
                .info()
                .capacity_sectors;
            let mut oracle = vec![0u64; cap as usize];
            let mut cut: Vec<(usize, u64, u64)> = Vec::new();
            {
                let devices = ssds
                    .iter_mut()
                    .map(|inner| Crashing {
                        inner,
                        crash: crash.clone(),
                    })
                    .collect();
                let mut v = volume_over(level, groups, width, devices, &log);
                run_until_crash(&mut v, &mut oracle, &mut rng, (cap / 8) as usize);
                crash.store(true, std::sync::atomic::Ordering::SeqCst);
                let unit = v.info().payload_unit_bytes as usize;
                for op in 0.. {
                    let lba = rng.below(cap - 8);
                    let mut data = vec![0u8; 8 * unit];
                    let tokens: Vec<u64> = (0..8)
                        .map(|i| sector_token(lba + i, 1 << 32 | op))
                        .collect();
                    for (i, &t) in tokens.iter().enumerate() {
                        fill_unit(t, &mut data[i * unit..(i + 1) * unit]);
                    }
                    let out = ReadBuffers::none();
                    match v.submit(1 << 39, &Command::write(lba, 8, &data), out) {
                        Ok(_) => {
                            for (i, &t) in tokens.iter().enumerate() {
                                oracle[lba as usize + i] = t;
                            }
                        }
                        Err(_) => {
                            cut = tokens
                                .iter()
                                .enumerate()
                                .map(|(i, &t)| (lba as usize + i, oracle[lba as usize + i], t))
                                .collect();
                            break;
                        }
                    }
                }
            }
            let mut v = volume(level, groups, width, &mut ssds, &log);
            let t = v.recover_from_nvram(1 << 40).unwrap();
            v.check_invariants();
            let unit = v.info().payload_unit_bytes as usize;
            let mut out = vec![0u8; unit];
            for (lba, old, new) in cut {
                submit(&mut v, t, &Command::read(lba as u64, 1), &mut out);
                let mut want = vec![0u8; unit];
                fill_unit(new, &mut want);
                oracle[lba] = if out == want { new } else { old };
            }
            check_all(&mut v, &oracle, t);
        }
    }

    /// The log holds only the open segments: it is replaced whenever a segment closes.
    #[test]
    fn the_log_stays_as_small_as_the_open_segments() {
        let mut ssds = members(6);
        let log = MemNvram::default();
        let mut v = volume(Level::Raid0, 3, 2, &mut ssds, &log);
        let cap = v.info().capacity_sectors;
        let mut oracle = vec![0u64; cap as usize];
        let mut rng = SimRng::new(5);
        run_until_crash(&mut v, &mut oracle, &mut rng, 2000);
        assert!(v.stats().segments_written > 20);
        // Four streams (user and three GC) of at most one segment of data each, framed.
        let segment = v.segment_sectors as usize * (4096 + 40);
        assert!(
            log.len() <= 4 * segment,
            "log of {} bytes for segments of {segment}",
            log.len()
        );
    }

    /// A volume with volatile host memory over `ssds`.
    fn volatile_volume(level: Level, groups: u32, width: u32, ssds: &mut [Ssd]) -> Swan<&mut Ssd> {
        // Chunks of two sectors make stripes of four blocks and segments of eight stripes: a
        // user segment stays open across many writes, so a victim is often cleaned while the
        // writes that replaced its blocks are only in memory, and a FLUSH often finds a stripe
        // partly filled.
        volatile_volume_of(level, groups, width, 1024, ssds)
    }

    fn volatile_volume_of(
        level: Level,
        groups: u32,
        width: u32,
        chunk_bytes: u64,
        ssds: &mut [Ssd],
    ) -> Swan<&mut Ssd> {
        let (mut array, mut swan) = config(level, groups, width);
        swan.host_memory = crate::swan::HostMemory::Volatile;
        array.chunk_bytes = chunk_bytes;
        Swan::new(array, swan, ssds.iter_mut().collect(), Vec::new()).unwrap()
    }

    /// Power loss at many points of runs that clean segments, on a host without NVRAM:
    /// recovery from the summaries and the partial summaries of the FLUSHes keeps every
    /// write a completed FLUSH covered, and the volume goes on working. Fails if a victim is
    /// trimmed before the user writes that replaced its blocks are on the members.
    #[test]
    fn volatile_memory_keeps_every_flushed_write_at_any_crash_point() {
        for (level, groups, width) in [(Level::Raid0, 3, 2), (Level::Raid5, 2, 3)] {
            let runs = volatile_crash_runs(level, groups, width, 41, volatile_volume);
            assert!(
                runs.cleaned > 0,
                "{level:?}: the runs never cleaned a segment"
            );
            assert!(
                runs.partial > 0,
                "{level:?}: no FLUSH wrote a partial summary"
            );
            // The memory is volatile: some write no FLUSH covered must have been lost, or
            // the test would not tell this mode from battery-backed memory.
            assert!(runs.lost > 0, "{level:?}: no crash lost an unflushed write");
        }
    }

    /// What [`volatile_crash_runs`] counted over its runs.
    struct CrashRuns {
        cleaned: u64,
        partial: u64,
        pads: u64,
        lost: usize,
    }

    /// Runs random writes, trims and FLUSHes over volumes `build` makes until a power loss at
    /// a random point, recovers, checks every sector against what was flushed, and does it
    /// again on the recovered volume; `proptest_cases(6)` such runs.
    fn volatile_crash_runs(
        level: Level,
        groups: u32,
        width: u32,
        seed: u64,
        build: for<'a> fn(Level, u32, u32, &'a mut [Ssd]) -> Swan<&'a mut Ssd>,
    ) -> CrashRuns {
        let mut rng = SimRng::new(seed + groups as u64);
        let mut runs = CrashRuns {
            cleaned: 0,
            partial: 0,
            pads: 0,
            lost: 0,
        };
        for _ in 0..afa_sim::proptest_cases(6) {
            let mut ssds = members(groups * width);
            let cap = build(level, groups, width, &mut ssds)
                .info()
                .capacity_sectors;
            let mut d = Durable::new(cap as usize);
            let crash_at = (cap / 16 + rng.below(cap / 2)) as usize;
            // From a FLUSH every other operation (several into one stripe) to one in 60.
            let flush_one_in = 2 + rng.below(59);
            {
                let mut v = build(level, groups, width, &mut ssds);
                run_volatile_until_crash(&mut v, &mut d, &mut rng, crash_at, flush_one_in);
                v.check_invariants();
                runs.cleaned += v.stats().segments_cleaned;
                runs.partial += v.stats().partial_summaries;
                runs.pads += v.stats().partial_summary_pad_blocks;
            }
            let mut v = build(level, groups, width, &mut ssds);
            let t = v.recover_volatile(1 << 40).unwrap();
            v.check_invariants();
            runs.lost += check_volatile(&mut v, &mut d, t);
            // A second life on the recovered volume: more writes, another crash.
            run_volatile_until_crash(&mut v, &mut d, &mut rng, 300, flush_one_in);
            drop(v);
            let mut v = build(level, groups, width, &mut ssds);
            let t = v.recover_volatile(1 << 41).unwrap();
            v.check_invariants();
            runs.lost += check_volatile(&mut v, &mut d, t);
        }
        runs
    }

    /// Power loss at many points of runs over segments whose summaries take four blocks of
    /// 512 B (8 stripes of 16 blocks): partial summaries take the open stripe's last four
    /// blocks, a FLUSH whose data already reaches into them pads the stripe out, and every
    /// flushed write survives.
    #[test]
    fn volatile_memory_with_summaries_of_several_blocks_keeps_every_flushed_write() {
        fn build(level: Level, groups: u32, width: u32, ssds: &mut [Ssd]) -> Swan<&mut Ssd> {
            let (array, mut swan) = config(level, groups, width);
            let k = if level == Level::Raid0 {
                width
            } else {
                width - 1
            } as u64;
            swan.host_memory = crate::swan::HostMemory::Volatile;
            swan.segment_bytes = 4096 * k * 8;
            let v = Swan::new(array, swan, ssds.iter_mut().collect(), Vec::new()).unwrap();
            assert_eq!((v.summary_blocks, v.stripe_sectors), (4, 16));
            v
        }
        for (level, groups, width) in [(Level::Raid0, 3, 2), (Level::Raid5, 2, 3)] {
            let runs = volatile_crash_runs(level, groups, width, 43, build);
            assert!(
                runs.cleaned > 0,
                "{level:?}: the runs never cleaned a segment"
            );
            assert!(
                runs.partial > 0 && runs.pads > 0,
                "{level:?}: {} partial summaries, {} pads",
                runs.partial,
                runs.pads
            );
            assert!(runs.lost > 0, "{level:?}: no crash lost an unflushed write");
        }
    }

    /// A FLUSH after every write rewrites the open stripe's summary nearly every time, and
    /// the volume goes on working: segments fill, cleaning runs, and every read is right.
    #[test]
    fn a_flush_after_every_write_keeps_the_volume_working() {
        let mut ssds = members(6);
        let mut v = volatile_volume(Level::Raid0, 3, 2, &mut ssds);
        let cap = v.info().capacity_sectors;
        let mut d = Durable::new(cap as usize);
        let mut rng = SimRng::new(9);
        run_volatile_until_crash(&mut v, &mut d, &mut rng, 3 * cap as usize, 2);
        let stats = v.stats().clone();
        assert!(stats.partial_summaries > 100);
        assert!(stats.segments_cleaned > 0);
        drop(v);
        let mut v = volatile_volume(Level::Raid0, 3, 2, &mut ssds);
        let t = v.recover_volatile(1 << 40).unwrap();
        check_volatile(&mut v, &mut d, t);
    }

    /// The rule for replaced blocks: a cleaned victim is not trimmed while the user writes
    /// that replaced some of its blocks are only in memory, even once everything it moved
    /// is durable; a crash then finds the flushed versions in it.
    #[test]
    fn a_victim_waits_for_the_writes_that_replaced_its_blocks() {
        let mut ssds = members(6);
        let mut v = volatile_volume(Level::Raid0, 3, 2, &mut ssds);
        let unit = v.info().payload_unit_bytes as usize;
        let d = v.data_blocks() as u64;
        let write = |v: &mut Swan<&mut Ssd>, lba: u64, version: u64, now: TimeNs| {
            let mut data = vec![0u8; unit];
            fill_unit(sector_token(lba, version), &mut data);
            submit(v, now, &Command::write(lba, 1, &data), &mut []);
        };
        // Three segments of version 1, flushed; then version 2 of five blocks of the first
        // segment, not flushed.
        for lba in 0..3 * d {
            write(&mut v, lba, 1, lba * 1000);
        }
        submit(&mut v, 1 << 30, &Command::flush(), &mut []);
        for lba in 0..5 {
            write(&mut v, lba, 2, (1 << 30) + lba * 1000);
        }
        assert_eq!(v.group_of(0), 0);
        let t = v
            .clean_one(0, 1 << 31)
            .unwrap()
            .expect("segment 0 is worth cleaning");
        assert_eq!(v.state[0], SegmentState::Cleaned);
        // What the victim moved is durable; the user writes are not.
        let t = v.make_durable(Some(0), t).unwrap();
        v.release_cleaned(t, None).unwrap();
        assert_eq!(
            v.state[0],
            SegmentState::Cleaned,
            "trimmed before its replacements were durable"
        );
        drop(v);
        let mut v = volatile_volume(Level::Raid0, 3, 2, &mut ssds);
        let t = v.recover_volatile(1 << 40).unwrap();
        let mut out = vec![0u8; unit];
        let (mut flushed, mut later) = (vec![0u8; unit], vec![0u8; unit]);
        let mut older = 0;
        for lba in 0..5 {
            submit(&mut v, t, &Command::read(lba, 1), &mut out);
            fill_unit(sector_token(lba, 1), &mut flushed);
            fill_unit(sector_token(lba, 2), &mut later);
            // Version 2 of a block may have reached the members under a stripe's summary.
            assert!(
                out == flushed || out == later,
                "block {lba} lost its flushed version"
            );
            older += usize::from(out == flushed);
        }
        assert!(
            older > 0,
            "every version 2 survived: the victim was not needed"
        );
    }

    /// Writes blocks one at a time from block 0 on, each sector's token that of its block
    /// and version 1, a millisecond apart.
    #[derive(Default)]
    struct SequentialWriter {
        lba: u64,
        now_ns: TimeNs,
    }

    impl SequentialWriter {
        /// Writes the next `n` blocks, then a FLUSH; returns the sectors the members took.
        fn write_and_flush(&mut self, v: &mut Swan<&mut Ssd>, n: u64) -> u64 {
            let mut data = vec![0u8; v.info().payload_unit_bytes as usize];
            let before = v.member_write_sectors();
            for _ in 0..n {
                fill_unit(sector_token(self.lba, 1), &mut data);
                self.now_ns += 1_000_000;
                submit(v, self.now_ns, &Command::write(self.lba, 1, &data), &mut []);
                self.lba += 1;
            }
            submit(v, self.now_ns, &Command::flush(), &mut []);
            v.member_write_sectors() - before
        }
    }

    /// A FLUSH writes the blocks of the open stripe that are not on the members yet and the
    /// stripe's last block (its partial summary), not a padded stripe; the stripe's rest goes
    /// when it fills. Fails if a FLUSH pads, or if a full stripe writes again what a FLUSH
    /// already wrote.
    #[test]
    fn a_flush_writes_the_new_blocks_and_the_stripe_summary_only() {
        let mut ssds = members(6);
        let mut v = volatile_volume(Level::Raid0, 3, 2, &mut ssds);
        let unit = v.info().payload_unit_bytes as usize;
        let stripe = v.stripe_sectors as u64;
        assert!(stripe >= 4, "the test needs two FLUSHes inside one stripe");
        let mut w = SequentialWriter::default();
        let mut write_and_flush = |v: &mut Swan<&mut Ssd>, n: u64| w.write_and_flush(v, n);
        assert_eq!(write_and_flush(&mut v, 1), 2, "one block and the summary");
        assert_eq!(
            write_and_flush(&mut v, 1),
            2,
            "the next block and the summary"
        );
        assert_eq!(
            write_and_flush(&mut v, 0),
            0,
            "nothing new, nothing written"
        );
        // Filling the stripe writes its remaining blocks, its last (the summary) included;
        // the FLUSH after it finds everything on the members.
        assert_eq!(write_and_flush(&mut v, stripe - 3), stripe - 2);
        // A FLUSH whose head is at the stripe's last block puts the summary there: the
        // whole stripe goes as one write.
        assert_eq!(write_and_flush(&mut v, stripe - 1), stripe);
        // A stripe filled without a FLUSH is all data; the FLUSH after it writes only the
        // next stripe's last block.
        assert_eq!(write_and_flush(&mut v, stripe), stripe + 1);
        assert_eq!(v.stats().partial_summaries, 4);
        // A power loss now: the members hold every block under a summary.
        drop(v);
        let mut v = volatile_volume(Level::Raid0, 3, 2, &mut ssds);
        v.recover_volatile(1 << 40).unwrap();
        let mut out = vec![0u8; unit];
        let mut want = vec![0u8; unit];
        // Every block written was flushed.
        for lba in 0..3 * stripe - 2 {
            submit(&mut v, 1 << 41, &Command::read(lba, 1), &mut out);
            fill_unit(sector_token(lba, 1), &mut want);
            assert_eq!(out, want, "block {lba} after the rebuild");
        }
    }

    /// With summaries of several blocks (8 stripes of 16 blocks of 512 B, a summary of 4), a
    /// partial summary takes only the slots its entries need: one in the first stripes, four
    /// in the last. A FLUSH whose data reaches into them pads the stripe out and puts the
    /// summary at the next stripe's end. Fails if every partial summary takes the segment
    /// summary's four blocks, or if a FLUSH writes over data with its summary.
    #[test]
    fn a_partial_summary_takes_the_slots_its_entries_need() {
        fn build(ssds: &mut [Ssd]) -> Swan<&mut Ssd> {
            let (array, mut swan) = config(Level::Raid0, 3, 2);
            swan.host_memory = crate::swan::HostMemory::Volatile;
            swan.segment_bytes = 4096 * 2 * 8;
            Swan::new(array, swan, ssds.iter_mut().collect(), Vec::new()).unwrap()
        }
        let mut ssds = members(6);
        let mut v = build(&mut ssds);
        assert_eq!((v.stripe_sectors, v.summary_blocks), (16, 4));
        let slots: Vec<u32> = (0..8).map(|s| v.partial_summary_blocks(s * 16)).collect();
        assert_eq!(slots, [1, 1, 2, 2, 3, 3, 3, 4]);
        let unit = v.info().payload_unit_bytes as usize;
        let mut w = SequentialWriter::default();
        let mut write_and_flush = |v: &mut Swan<&mut Ssd>, n: u64| w.write_and_flush(v, n);
        assert_eq!(
            write_and_flush(&mut v, 1),
            2,
            "one block and a one-block summary"
        );
        drop(v);
        // A fresh volume: two full stripes, then 15 blocks of the third, whose partial
        // summary needs two slots, so the FLUSH pads one block and writes the summary into
        // the fourth stripe's last two.
        let mut ssds = members(6);
        let mut v = build(&mut ssds);
        assert_eq!(write_and_flush(&mut v, 47), 32 + 16 + 2);
        assert_eq!(v.stats().partial_summary_pad_blocks, 1);
        drop(v);
        let mut v = build(&mut ssds);
        v.recover_volatile(1 << 40).unwrap();
        let (mut out, mut want) = (vec![0u8; unit], vec![0u8; unit]);
        // The second volume's blocks are 1 to 47 (block 0 went to the first).
        for lba in 1..48 {
            submit(&mut v, 1 << 41, &Command::read(lba, 1), &mut out);
            fill_unit(sector_token(lba, 1), &mut want);
            assert_eq!(out, want, "block {lba} after the rebuild");
        }
    }

    /// Making a stream durable may cost a victim one block of the GC stream (a partial
    /// summary), so a victim with a single invalid block would free nothing: never picked,
    /// whatever `gc_max_victim_valid` allows. Fails without the rule.
    #[test]
    fn a_victim_frees_more_than_the_summary_it_may_cost() {
        let mut ssds = members(6);
        let (mut array, mut swan) = config(Level::Raid0, 3, 2);
        swan.host_memory = crate::swan::HostMemory::Volatile;
        swan.gc_max_victim_valid = 1.0;
        array.chunk_bytes = 1024;
        let mut v = Swan::new(array, swan, ssds.iter_mut().collect(), Vec::new()).unwrap();
        let unit = v.info().payload_unit_bytes as usize;
        let d = v.data_blocks() as u64;
        let mut data = vec![0u8; unit];
        let mut write = |v: &mut Swan<&mut Ssd>, lba: u64, version: u64, now: TimeNs| {
            fill_unit(sector_token(lba, version), &mut data);
            submit(v, now, &Command::write(lba, 1, &data), &mut []);
        };
        for lba in 0..d {
            write(&mut v, lba, 1, lba * 1000);
        }
        assert_eq!(v.state[0], SegmentState::Full);
        write(&mut v, 3, 2, d * 1000);
        assert_eq!(v.pick_victim(0), None, "one invalid block");
        write(&mut v, 4, 2, d * 1000 + 1000);
        assert_eq!(v.pick_victim(0), Some(0));
    }

    /// With volatile host memory a segment of one stripe works: its last block is the
    /// segment's summary, and a FLUSH's partial summary takes it until the stripe is full.
    #[test]
    fn volatile_memory_works_with_one_stripe_segments() {
        let mut ssds = members(6);
        let (mut array, mut swan) = config(Level::Raid0, 3, 2);
        swan.host_memory = crate::swan::HostMemory::Volatile;
        array.chunk_bytes = 2048;
        swan.segment_bytes = 4096;
        fn build<'a>(
            array: &ArrayConfig,
            swan: &SwanConfig,
            ssds: &'a mut [Ssd],
        ) -> Swan<&'a mut Ssd> {
            Swan::new(
                array.clone(),
                swan.clone(),
                ssds.iter_mut().collect(),
                Vec::new(),
            )
            .unwrap()
        }
        let mut v = build(&array, &swan, &mut ssds);
        assert_eq!(v.segment_sectors, v.stripe_sectors);
        let cap = v.info().capacity_sectors;
        let mut d = Durable::new(cap as usize);
        let mut rng = SimRng::new(12);
        run_volatile_until_crash(&mut v, &mut d, &mut rng, 3 * cap as usize, 7);
        assert!(v.stats().segments_cleaned > 0 && v.stats().partial_summaries > 0);
        drop(v);
        let mut v = build(&array, &swan, &mut ssds);
        let t = v.recover_volatile(1 << 40).unwrap();
        v.check_invariants();
        check_volatile(&mut v, &mut d, t);
    }

    /// Recovery without the NVRAM log is refused when the configuration says the host memory
    /// is battery-backed: that volume's open segments live in the log.
    #[test]
    fn recovery_without_the_log_needs_volatile_memory() {
        let mut ssds = members(6);
        let log = MemNvram::default();
        let mut v = volume(Level::Raid0, 3, 2, &mut ssds, &log);
        let e = v.recover_volatile(0).unwrap_err().to_string();
        assert!(e.contains("host_memory"), "{e}");
    }
}
