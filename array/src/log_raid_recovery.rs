//! Log-RAID's map rebuilt after the host lost its memory: the summaries at the end of the
//! full segments, and the open segment from the NVRAM log (`crate::nvram`), newest write
//! sequence number first; or, with volatile host memory, the open segment from the partial
//! summary its last FLUSH wrote. The same steps as SWAN's (`swan_nvram.rs`) over one stream.

use afa_sim::TimeNs;
use afa_ssd::{BlockDevice, Command, DeviceError, ReadBuffers};

use super::{LogRaid, SegmentState, NONE};
use crate::nvram::{logged_streams, NvramLog, OpenSegment};
use crate::swan::{decode_partial_summary, decode_summary, HostMemory, NewestMap};

impl<D: BlockDevice> LogRaid<D> {
    /// Keeps the NVRAM's contents in `log` from now on. Attach it to a new, empty volume,
    /// or to one about to be recovered from the same log.
    pub fn attach_nvram(&mut self, log: Box<dyn NvramLog>) {
        self.nvram.attach(log);
    }

    /// Replaces the log by the open segment alone (`Nvram::replace_with`).
    pub(super) fn compact_nvram(&mut self) -> Result<(), DeviceError> {
        let segment = self.segment_of(self.head);
        let open = (self.head != NONE).then(|| OpenSegment {
            stream: 0,
            segment,
            seq: self.seq[segment as usize],
            first: segment * self.segment_sectors,
            head: self.head,
            stripe_sectors: self.stripe_sectors,
            lbas: &self.lbas,
            stripe_buf: &self.stripe_buf,
            unit: self.unit,
        });
        self.nvram.replace_with(open.into_iter())
    }

    /// Recovers a volume from its members and its NVRAM log after the host lost its memory.
    /// Call on a volume just built over the same members, with the same log attached.
    /// Needs payload `full` (a summary is its sectors' real bytes). Returns when the summary
    /// reads and stripe rewrites are done.
    pub fn recover_from_nvram(&mut self, now_ns: TimeNs) -> Result<TimeNs, DeviceError> {
        let contents = self.nvram.contents("Log-RAID")?;
        let unit = self.unit;
        if unit != self.info.sector_bytes as usize {
            return Err(DeviceError::Unsupported(
                "rebuilding the Log-RAID map needs payload mode full: summaries are real bytes"
                    .into(),
            ));
        }
        let logged = logged_streams(&contents, 1)?.pop().flatten();
        let d = self.data_sectors() as usize;
        if let Some(l) = &logged {
            if l.segment >= self.segments || l.blocks.len() > d {
                return Err(DeviceError::Unsupported(format!(
                    "the Log-RAID NVRAM log holds segment {} with {} sectors; this volume has {} segments of {d}",
                    l.segment,
                    l.blocks.len(),
                    self.segments
                )));
            }
        }
        let open = logged.as_ref().map(|l| l.segment);
        let mut newest = NewestMap::new(self.l2p.len());
        let mut done = now_ns;
        let n = self.summary_sectors as usize;
        let mut summary = vec![0u8; n * unit];
        for seg in 0..self.segments {
            let first = seg * self.segment_sectors;
            let entries = match &logged {
                Some(l) if open == Some(seg) => {
                    self.state[seg as usize] = SegmentState::Open;
                    self.seq[seg as usize] = l.seq;
                    self.next_seq = self.next_seq.max(l.seq + 1);
                    l.blocks.iter().map(|&(lba, w, _)| (lba, w)).collect()
                }
                _ => {
                    let c = self.array.submit(
                        now_ns,
                        &Command::read((first + d as u32) as u64, n as u32),
                        ReadBuffers {
                            data: &mut summary,
                            tags: None,
                        },
                    )?;
                    done = done.max(c.done_ns);
                    match decode_summary(&summary) {
                        Some((seq, id, entries)) if id == seg && entries.len() == d => {
                            self.state[seg as usize] = SegmentState::Full;
                            self.seq[seg as usize] = seq;
                            self.next_seq = self.next_seq.max(seq + 1);
                            entries
                        }
                        _ => {
                            self.state[seg as usize] = SegmentState::Free;
                            Vec::new()
                        }
                    }
                }
            };
            newest.fold(first, self.seq[seg as usize], &entries);
        }
        // A record of the open segment is read from the log: its stripe may not have
        // reached the members.
        let logged_sector = |p: u32| {
            let l = logged.as_ref()?;
            let first = l.segment * self.segment_sectors;
            let i = p.checked_sub(first)? as usize;
            (open == Some(p / self.segment_sectors) && i < l.blocks.len())
                .then(|| l.blocks[i].2.clone())
        };
        let logged_records: Vec<(u32, Vec<u8>)> = newest
            .trim_records
            .iter()
            .filter_map(|&(p, _, _)| logged_sector(p).map(|b| (p, b)))
            .collect();
        done = done.max(self.install_newest(newest, &logged_records, now_ns)?);
        self.head = NONE;
        self.lbas.clear();
        if let Some(l) = logged {
            let first = l.segment * self.segment_sectors;
            self.head = first + l.blocks.len() as u32;
            self.lbas = l.blocks.iter().map(|&(lba, w, _)| (lba, w)).collect();
            // The stripe being filled goes back into NVRAM; a complete one the log holds
            // whole is written again (the crash may have come before it reached the
            // members); the others were on the members before the log was last replaced.
            let ss = self.stripe_sectors as usize;
            for (stripe, blocks) in l.blocks.chunks(ss).enumerate() {
                if blocks.iter().any(|(_, _, data)| data.len() != unit) {
                    continue;
                }
                for (i, (_, _, data)) in blocks.iter().enumerate() {
                    self.stripe_buf[i * unit..(i + 1) * unit].copy_from_slice(data);
                }
                if blocks.len() == ss {
                    let start = first + (stripe * ss) as u32;
                    let c = self.array.submit(
                        now_ns,
                        &Command::write(start as u64, ss as u32, &self.stripe_buf),
                        ReadBuffers::none(),
                    )?;
                    done = done.max(c.done_ns);
                }
            }
            if l.blocks.len() == d {
                // Every data sector is in: the segment was closing when the crash came.
                done = done.max(self.close_segment(now_ns)?);
            }
        }
        done = self.clean_to_reserve(done)?;
        self.compact_nvram()?;
        Ok(done)
    }

    /// Recovers a volume with volatile host memory after a power loss: builds the map from
    /// the members alone, from the summaries of the full segments and the newest partial
    /// summary of each segment a FLUSH (or a cleaning) wrote out. Every write a completed
    /// FLUSH covered is there; later ones may be. Call on a volume just built over the same
    /// members. Needs payload `full`. Returns when the summary reads, and any cleaning that
    /// restores the reserve of free segments, are done.
    pub fn recover_volatile(&mut self, now_ns: TimeNs) -> Result<TimeNs, DeviceError> {
        if self.config.host_memory != HostMemory::Volatile {
            return Err(DeviceError::Unsupported(
                "a Log-RAID volume with battery-backed host memory recovers from its NVRAM log \
                 (array.log.host_memory = \"battery-backed\")"
                    .into(),
            ));
        }
        let unit = self.unit;
        if unit != self.info.sector_bytes as usize {
            return Err(DeviceError::Unsupported(
                "rebuilding the Log-RAID map needs payload mode full: summaries are real bytes"
                    .into(),
            ));
        }
        let d = self.data_sectors() as usize;
        let (stripe, n) = (self.stripe_sectors, self.summary_sectors);
        let mut newest = NewestMap::new(self.l2p.len());
        let mut done = now_ns;
        let mut summary = vec![0u8; n as usize * unit];
        for seg in 0..self.segments {
            let first = seg * self.segment_sectors;
            done = done.max(self.read_sectors(first + d as u32, now_ns, &mut summary)?);
            let mut found = match decode_summary(&summary) {
                Some((seq, id, entries)) if id == seg && entries.len() == d => Some((seq, entries)),
                _ => None,
            };
            // The newest partial summary: the end of every stripe is read, the last stripe
            // first, and the first that holds a partial summary of this segment listing
            // every sector before its place is the newest (the end of a stripe no FLUSH
            // wrote holds data, and a trimmed one zeroes).
            let mut end = self.segment_sectors;
            while found.is_none() && end >= stripe {
                let at = end - n;
                done = done.max(self.read_sectors(first + at, now_ns, &mut summary)?);
                if let Some((seq, id, entries)) = decode_partial_summary(&summary) {
                    if id == seg && entries.len() == at as usize {
                        found = Some((seq, entries));
                    }
                }
                end -= stripe;
            }
            let entries = match found {
                Some((seq, entries)) => {
                    // A segment with a partial summary is closed as it is: its sectors past
                    // the summary were never flushed, and cleaning takes back the rest.
                    self.state[seg as usize] = SegmentState::Full;
                    self.seq[seg as usize] = seq;
                    self.next_seq = self.next_seq.max(seq + 1);
                    entries
                }
                None => {
                    self.state[seg as usize] = SegmentState::Free;
                    Vec::new()
                }
            };
            newest.fold(first, self.seq[seg as usize], &entries);
        }
        done = done.max(self.install_newest(newest, &[], now_ns)?);
        self.head = NONE;
        self.lbas.clear();
        self.clean_to_reserve(done)
    }

    /// Reads `out.len()` bytes of sectors from `first`; returns when they are there.
    fn read_sectors(
        &mut self,
        first: u32,
        now_ns: TimeNs,
        out: &mut [u8],
    ) -> Result<TimeNs, DeviceError> {
        let sectors = (out.len() / self.unit) as u32;
        let c = self.array.submit(
            now_ns,
            &Command::read(first as u64, sectors),
            ReadBuffers {
                data: out,
                tags: None,
            },
        )?;
        Ok(c.done_ns)
    }

    /// Takes in the trim records `newest` lists (from `logged` when it holds the sector,
    /// else read from the members) and installs the rebuilt map; every segment not free is
    /// full or open, as the caller set. Returns when the record reads are done.
    fn install_newest(
        &mut self,
        mut newest: NewestMap,
        logged: &[(u32, Vec<u8>)],
        now_ns: TimeNs,
    ) -> Result<TimeNs, DeviceError> {
        let mut done = now_ns;
        let mut sector = vec![0u8; self.unit];
        newest.fold_trim_records("Log-RAID sector", |p| {
            match logged.iter().find(|(q, _)| *q == p) {
                Some((_, b)) => Ok(b.clone()),
                None => {
                    done = done.max(self.read_sectors(p, now_ns, &mut sector)?);
                    Ok(sector.clone())
                }
            }
        })?;
        self.next_wseq = self.next_wseq.max(newest.next_wseq);
        self.trims.install_rebuilt(
            &newest,
            &mut self.l2p,
            &mut self.p2l,
            &mut self.wseq,
            &mut self.valid,
            self.segment_sectors,
        );
        self.free = (0..self.segments)
            .filter(|&s| self.state[s as usize] == SegmentState::Free)
            .collect();
        Ok(done)
    }

    /// The crash may have cut a cleaning short after its relocations had taken the last
    /// free segment. The rest of its victim's valid data fits in the room the open segment
    /// has left (or the victim holds none), but user writes would take that room first, and
    /// then no segment would be left to clean into. So the cleaning that opening a segment
    /// asks for is done now, as it would have been.
    fn clean_to_reserve(&mut self, mut done: TimeNs) -> Result<TimeNs, DeviceError> {
        while self.free.len() < self.config.gc_free_segments as usize {
            match self.clean_one(done)? {
                Some(t) => done = done.max(t),
                None => break,
            }
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
    use std::sync::Arc;

    use afa_nand::{fill_unit, sector_token};
    use afa_sim::SimRng;
    use afa_ssd::Ssd;

    use super::*;
    use crate::nvram::MemNvram;
    use crate::tests::{check_volatile, run_volatile_until_crash, ssd_config, Crashing, Durable};
    use crate::{Array, ArrayConfig, Level, LogRaidConfig};

    fn members(n: u32) -> Vec<Ssd> {
        let mut cfg = ssd_config();
        cfg.payload = afa_nand::PayloadMode::Full;
        (0..n as u64)
            .map(|i| Ssd::new(cfg.clone(), i).unwrap())
            .collect()
    }

    fn volume<'a>(
        level: Level,
        ssds: &'a mut [Ssd],
        crash: &Arc<AtomicBool>,
        log: &MemNvram,
    ) -> LogRaid<Crashing<'a>> {
        let devices = ssds
            .iter_mut()
            .map(|inner| Crashing {
                inner,
                crash: crash.clone(),
            })
            .collect();
        log_volume(level, devices, 0.3, log)
    }

    /// Log-RAID of 4-stripe segments over `devices` (4 KiB chunks), keeping its NVRAM in
    /// `log`.
    fn log_volume<D: BlockDevice>(
        level: Level,
        devices: Vec<D>,
        spare_fraction: f64,
        log: &MemNvram,
    ) -> LogRaid<D> {
        let config = ArrayConfig {
            level,
            members: devices.len() as u32,
            chunk_bytes: 4096,
            ..ArrayConfig::default()
        };
        let array = Array::new(config, devices, Vec::new()).unwrap();
        let log_config = LogRaidConfig {
            segment_stripes: 4,
            spare_fraction,
            ..LogRaidConfig::default()
        };
        let mut v = LogRaid::new(array, log_config).unwrap();
        v.attach_nvram(Box::new(log.clone()));
        v
    }

    /// Writes 1..12 sectors at random addresses, trims some, with a flush now and then;
    /// returns false when a write or trim failed (the crash), after marking its sectors as
    /// either old or new.
    fn write_ops<D: BlockDevice>(
        v: &mut LogRaid<D>,
        oracle: &mut [u64],
        cut: &mut Vec<(usize, u64, u64)>,
        rng: &mut SimRng,
        ops: usize,
    ) -> bool {
        let unit = v.info().payload_unit_bytes as usize;
        let cap = oracle.len() as u64;
        for op in 0..ops {
            let now = op as u64 * 20_000;
            if rng.below(50) == 0 {
                if v.submit(now, &Command::flush(), ReadBuffers::none())
                    .is_err()
                {
                    return false;
                }
                continue;
            }
            let len = 1 + rng.below(12) as u32;
            let lba = rng.below(cap - len as u64);
            if rng.below(10) == 0 {
                // A trim is acknowledged like a write: its sectors must read as zeroes.
                let ok = v
                    .submit(now, &Command::trim(lba, len), ReadBuffers::none())
                    .is_ok();
                let range = lba as usize..(lba + len as u64) as usize;
                for (at, token) in range.clone().zip(&mut oracle[range]) {
                    if ok {
                        *token = 0;
                    } else {
                        cut.push((at, *token, 0));
                    }
                }
                if !ok {
                    return false;
                }
                continue;
            }
            let version = rng.next_u64() | 1;
            let mut data = vec![0u8; len as usize * unit];
            let tokens: Vec<u64> = (0..len as u64)
                .map(|i| sector_token(lba + i, version))
                .collect();
            for (i, &t) in tokens.iter().enumerate() {
                fill_unit(t, &mut data[i * unit..(i + 1) * unit]);
            }
            let ok = v
                .submit(now, &Command::write(lba, len, &data), ReadBuffers::none())
                .is_ok();
            for (i, &t) in tokens.iter().enumerate() {
                let at = lba as usize + i;
                if ok {
                    oracle[at] = t;
                } else {
                    cut.push((at, oracle[at], t));
                }
            }
            if !ok {
                return false;
            }
        }
        true
    }

    fn check_all<D: BlockDevice>(
        v: &mut LogRaid<D>,
        oracle: &mut [u64],
        cut: &[(usize, u64, u64)],
        now_ns: TimeNs,
    ) {
        let unit = v.info().payload_unit_bytes as usize;
        let mut out = vec![0u8; unit];
        let mut want = vec![0u8; unit];
        let read = |v: &mut LogRaid<D>, lba: usize, out: &mut [u8]| {
            let buf = ReadBuffers {
                data: out,
                tags: None,
            };
            v.submit(now_ns, &Command::read(lba as u64, 1), buf)
                .unwrap();
        };
        // The write the crash cut short may be there wholly, in part or not at all.
        for &(lba, old, new) in cut {
            read(v, lba, &mut out);
            fill_unit(new, &mut want);
            oracle[lba] = if out == want { new } else { old };
        }
        for (lba, &t) in oracle.iter().enumerate() {
            read(v, lba, &mut out);
            if t == 0 {
                want.fill(0);
            } else {
                fill_unit(t, &mut want);
            }
            assert!(out == want, "sector {lba} lost or wrong after recovery");
        }
    }

    /// Power loss of the host at many points of runs that clean segments, and crashes at a
    /// member write: recovery from the summaries and the NVRAM log loses no acknowledged
    /// write, and the volume goes on working through a second crash.
    #[test]
    fn no_acknowledged_write_is_lost_at_any_crash_point() {
        for level in [Level::Raid0, Level::Raid5] {
            let mut rng = SimRng::new(23);
            let (mut cleaned, mut records_moved) = (0, 0);
            for round in 0..8 {
                let mut ssds = members(3);
                let log = MemNvram::default();
                let crash = Arc::new(AtomicBool::new(false));
                let cap = volume(level, &mut ssds, &crash, &log)
                    .info()
                    .capacity_sectors;
                let mut oracle = vec![0u64; cap as usize];
                let mut cut = Vec::new();
                {
                    let mut v = volume(level, &mut ssds, &crash, &log);
                    let ops = (cap / 16 + rng.below(cap / 2)) as usize;
                    assert!(write_ops(&mut v, &mut oracle, &mut cut, &mut rng, ops));
                    if round % 2 == 1 {
                        // The crash comes at the next member write.
                        crash.store(true, Ordering::SeqCst);
                        while write_ops(&mut v, &mut oracle, &mut cut, &mut rng, 1) {}
                    }
                    cleaned += v.stats().segments_cleaned;
                    records_moved += v.stats().trim_records_moved;
                }
                crash.store(false, Ordering::SeqCst);
                let mut v = volume(level, &mut ssds, &crash, &log);
                let t = v.recover_from_nvram(1 << 40).unwrap();
                check_all(&mut v, &mut oracle, &cut, t);
                cut.clear();
                assert!(write_ops(&mut v, &mut oracle, &mut cut, &mut rng, 300));
                drop(v);
                let mut v = volume(level, &mut ssds, &crash, &log);
                let t = v.recover_from_nvram(1 << 41).unwrap();
                check_all(&mut v, &mut oracle, &cut, t);
            }
            assert!(cleaned > 0, "{level:?}: the runs never cleaned a segment");
            assert!(
                records_moved > 0,
                "{level:?}: cleaning never moved a trim record"
            );
        }
    }

    /// A member that fails every write once `writes_left` member writes have been made:
    /// a crash at any member write, not only at the first one of a request.
    struct CrashAfter<'a> {
        inner: &'a mut Ssd,
        writes_left: Arc<AtomicI64>,
    }

    impl BlockDevice for CrashAfter<'_> {
        fn info(&self) -> afa_ssd::DeviceInfo {
            self.inner.info()
        }
        fn submit(
            &mut self,
            now_ns: TimeNs,
            cmd: &Command<'_>,
            out: ReadBuffers<'_>,
        ) -> Result<afa_ssd::Completion, DeviceError> {
            if cmd.opcode == afa_ssd::Opcode::Write
                && self.writes_left.fetch_sub(1, Ordering::SeqCst) <= 0
            {
                return Err(DeviceError::Failed);
            }
            self.inner.submit(now_ns, cmd, out)
        }
        fn background(&mut self, now_ns: TimeNs) -> Option<TimeNs> {
            self.inner.background(now_ns)
        }
    }

    /// Log-RAID over RAID 0 of `ssds` with 20% of its space spare, as `afa serve`'s test
    /// volume has.
    fn tight_volume<'a>(
        ssds: &'a mut [Ssd],
        writes_left: &Arc<AtomicI64>,
        log: &MemNvram,
    ) -> LogRaid<CrashAfter<'a>> {
        let devices = ssds
            .iter_mut()
            .map(|inner| CrashAfter {
                inner,
                writes_left: writes_left.clone(),
            })
            .collect();
        log_volume(Level::Raid0, devices, 0.2, log)
    }

    /// A crash can come while cleaning relocates a victim's data into the last free
    /// segment. The volume that recovery rebuilds then has no free segment, and the room
    /// left in the open segment is all that the rest of the victim's data has. Recovery must
    /// finish that cleaning before user writes take the room, or every later write finds
    /// no segment to clean into and fails for want of space the volume has.
    #[test]
    fn the_volume_takes_writes_after_a_crash_in_the_middle_of_cleaning() {
        let mut rng = SimRng::new(31);
        let never = i64::MAX / 2;
        for _round in 0..afa_sim::proptest_cases(12) {
            let mut ssds = members(3);
            let log = MemNvram::default();
            let writes_left = Arc::new(AtomicI64::new(never));
            let cap = tight_volume(&mut ssds, &writes_left, &log)
                .info()
                .capacity_sectors;
            let mut oracle = vec![0u64; cap as usize];
            let mut cut = Vec::new();
            {
                let mut v = tight_volume(&mut ssds, &writes_left, &log);
                // Past the volume's capacity twice over, so that cleaning runs all the time,
                // then on to a crash at a random member write.
                let ops = (cap / 3) as usize;
                assert!(write_ops(&mut v, &mut oracle, &mut cut, &mut rng, ops));
                writes_left.store(rng.below(2_000) as i64, Ordering::SeqCst);
                while write_ops(&mut v, &mut oracle, &mut cut, &mut rng, 1) {}
            }
            writes_left.store(never, Ordering::SeqCst);
            let mut v = tight_volume(&mut ssds, &writes_left, &log);
            let t = v.recover_from_nvram(1 << 40).unwrap();
            check_all(&mut v, &mut oracle, &cut, t);
            cut.clear();
            // A capacity's worth of writes after the crash: none may fail.
            let ops = (cap / 6) as usize;
            assert!(
                write_ops(&mut v, &mut oracle, &mut cut, &mut rng, ops),
                "a write failed after recovery"
            );
            check_all(&mut v, &mut oracle, &cut, 1 << 41);
        }
    }

    #[test]
    fn recovery_needs_the_log_and_full_payloads() {
        let mut ssds = members(2);
        let crash = Arc::new(AtomicBool::new(false));
        let mut v = volume(Level::Raid0, &mut ssds, &crash, &MemNvram::default());
        v.nvram = crate::nvram::Nvram::default();
        let e = v.recover_from_nvram(0).unwrap_err();
        assert!(e.to_string().contains("NVRAM log"), "{e}");
    }

    /// Log-RAID with volatile host memory over `ssds`: 4 KiB chunks of 512-byte sectors,
    /// segments of four stripes, no NVRAM log.
    fn volatile_volume(level: Level, ssds: &mut [Ssd]) -> LogRaid<&mut Ssd> {
        let config = ArrayConfig {
            level,
            members: ssds.len() as u32,
            chunk_bytes: 4096,
            ..ArrayConfig::default()
        };
        let array = Array::new(config, ssds.iter_mut().collect(), Vec::new()).unwrap();
        let log_config = LogRaidConfig {
            segment_stripes: 4,
            spare_fraction: 0.3,
            host_memory: HostMemory::Volatile,
            ..LogRaidConfig::default()
        };
        LogRaid::new(array, log_config).unwrap()
    }

    /// Power loss at many points of random write/trim/FLUSH runs that clean segments, on a
    /// host without NVRAM: recovery from the summaries and the partial summaries keeps every
    /// write a completed FLUSH covered, loses some that none covered, and the volume goes on
    /// working through a second crash. Fails if a victim is trimmed before its relocated
    /// sectors and the writes that replaced its others are on the members.
    #[test]
    fn volatile_memory_keeps_every_flushed_write_at_any_crash_point() {
        for level in [Level::Raid0, Level::Raid5] {
            let mut rng = SimRng::new(61);
            let (mut cleaned, mut partial, mut pads, mut lost) = (0, 0, 0, 0);
            for _ in 0..afa_sim::proptest_cases(8) {
                let mut ssds = members(3);
                let cap = volatile_volume(level, &mut ssds).info().capacity_sectors;
                let mut d = Durable::new(cap as usize);
                let crash_at = (cap / 16 + rng.below(cap / 2)) as usize;
                // From a FLUSH every other operation to one in 60.
                let flush_one_in = 2 + rng.below(59);
                {
                    let mut v = volatile_volume(level, &mut ssds);
                    run_volatile_until_crash(&mut v, &mut d, &mut rng, crash_at, flush_one_in);
                    cleaned += v.stats().segments_cleaned;
                    partial += v.stats().partial_summaries;
                    pads += v.stats().pad_sectors;
                }
                let mut v = volatile_volume(level, &mut ssds);
                let t = v.recover_volatile(1 << 40).unwrap();
                lost += check_volatile(&mut v, &mut d, t);
                run_volatile_until_crash(&mut v, &mut d, &mut rng, 300, flush_one_in);
                drop(v);
                let mut v = volatile_volume(level, &mut ssds);
                let t = v.recover_volatile(1 << 41).unwrap();
                lost += check_volatile(&mut v, &mut d, t);
            }
            assert!(cleaned > 0, "{level:?}: the runs never cleaned a segment");
            assert!(partial > 0, "{level:?}: no FLUSH wrote a partial summary");
            assert!(pads > 0, "{level:?}: no FLUSH padded a stripe");
            assert!(lost > 0, "{level:?}: no crash lost an unflushed write");
        }
    }

    /// A FLUSH writes the open stripe's sectors not yet on the members and the partial
    /// summary in the stripe's last sectors, not a padded stripe; the stripe's rest goes when
    /// its data reaches the summary. Only when the data already reaches into the summary's
    /// sectors is the stripe padded out. Fails if a FLUSH pads otherwise, or if a stripe
    /// writes again what a FLUSH wrote.
    #[test]
    fn a_flush_writes_the_new_sectors_and_a_partial_summary_only() {
        let mut ssds = members(3);
        let mut v = volatile_volume(Level::Raid0, &mut ssds);
        let unit = v.info().payload_unit_bytes as usize;
        let stripe = v.stripe_sectors as u64;
        let n = v.summary_sectors as u64;
        assert!(
            stripe > n + 3,
            "the test needs room for two FLUSHes in a stripe"
        );
        let mut data = vec![0u8; unit];
        let mut now = 0;
        let mut lba = 0;
        // Writes the next `count` sectors, then a FLUSH; returns the sectors the members took.
        let mut write_and_flush = |v: &mut LogRaid<&mut Ssd>, count: u64| {
            let before = v.array().stats().member_write_sectors;
            for _ in 0..count {
                fill_unit(sector_token(lba, 1), &mut data);
                now += 1_000_000;
                let buf = ReadBuffers::none();
                v.submit(now, &Command::write(lba, 1, &data), buf).unwrap();
                lba += 1;
            }
            v.submit(now, &Command::flush(), ReadBuffers::none())
                .unwrap();
            v.array().stats().member_write_sectors - before
        };
        assert_eq!(
            write_and_flush(&mut v, 1),
            1 + n,
            "a sector and the summary"
        );
        assert_eq!(
            write_and_flush(&mut v, 1),
            1 + n,
            "the next and the summary"
        );
        assert_eq!(
            write_and_flush(&mut v, 0),
            0,
            "nothing new, nothing written"
        );
        // The data reaches the summary: the stripe's rest goes, the summary included.
        assert_eq!(write_and_flush(&mut v, stripe - n - 2), stripe - 2);
        // A stripe filled into its last sectors without a FLUSH is padded out, and the next
        // stripe's end takes the summary.
        assert_eq!(write_and_flush(&mut v, stripe - n + 1), stripe + n);
        assert_eq!(v.stats().partial_summaries, 3);
        assert_eq!(v.stats().pad_sectors, n - 1);
        drop(v);
        let mut v = volatile_volume(Level::Raid0, &mut ssds);
        v.recover_volatile(1 << 40).unwrap();
        let mut out = vec![0u8; unit];
        let mut want = vec![0u8; unit];
        // Every sector written was flushed.
        for lba in 0..2 * stripe - 2 * n + 1 {
            let buf = ReadBuffers {
                data: &mut out,
                tags: None,
            };
            v.submit(1 << 41, &Command::read(lba, 1), buf).unwrap();
            fill_unit(sector_token(lba, 1), &mut want);
            assert_eq!(out, want, "sector {lba} after the rebuild");
        }
    }

    /// Recovery without the NVRAM log is refused with battery-backed host memory, and a
    /// volatile configuration whose stripes cannot hold a summary besides data is refused,
    /// both by name.
    #[test]
    fn volatile_recovery_and_stripes_are_checked_by_name() {
        let mut ssds = members(3);
        let crash = Arc::new(AtomicBool::new(false));
        let mut v = volume(Level::Raid0, &mut ssds, &crash, &MemNvram::default());
        let e = v.recover_volatile(0).unwrap_err().to_string();
        assert!(e.contains("host_memory"), "{e}");
        drop(v);
        let config = ArrayConfig {
            level: Level::Raid0,
            members: 3,
            chunk_bytes: 512,
            ..ArrayConfig::default()
        };
        let array = Array::new(config, ssds.iter_mut().collect(), Vec::new()).unwrap();
        let log_config = LogRaidConfig {
            segment_stripes: 64,
            host_memory: HostMemory::Volatile,
            ..LogRaidConfig::default()
        };
        let e = LogRaid::new(array, log_config).unwrap_err().to_string();
        assert!(e.contains("stripes longer than the segment summary"), "{e}");
    }
}
