//! ScalaAFA against the oracle: random reads, writes and trims through replication,
//! in-SSD (or host) conversion, array-level GC, recalls, member failures and rebuilds.

use std::collections::BTreeMap;

use afa_sim::SimRng;
use afa_ssd::Ssd;
use proptest::prelude::*;

use super::*;
use crate::tests::{two_phase_config as array_config, Harness, PageCache, PowerCut};

/// The engine tests' SSD with 4 KiB sectors, so each sector's OOB share holds ScalaAFA's
/// metadata, keeping `payload` (`full` members keep a checkpoint's bytes, tokens do not).
fn ssd_keeping(payload: afa_nand::PayloadMode, seed: u64) -> Ssd {
    Ssd::new(scala_ssd_config(payload), seed).unwrap()
}

fn scala_ssd_config(payload: afa_nand::PayloadMode) -> afa_ssd::SsdConfig {
    let mut cfg = crate::tests::ssd_config();
    cfg.geometry.sector_bytes = 4096;
    cfg.geometry.oob_bytes_per_page = 24;
    cfg.payload = payload;
    cfg
}

fn ssd(seed: u64) -> Ssd {
    ssd_keeping(afa_nand::PayloadMode::Token, seed)
}

pub(super) fn engine_keeping(
    payload: afa_nand::PayloadMode,
    level: Level,
    members: u32,
    spares: usize,
    scala: ScalaAfaConfig,
) -> ScalaAfa<Ssd> {
    let config = array_config(level, members);
    let devs = (0..members as u64)
        .map(|i| ssd_keeping(payload, i))
        .collect();
    let spare_devs = (0..spares as u64)
        .map(|i| ssd_keeping(payload, 100 + i))
        .collect();
    ScalaAfa::new(config, scala, devs, spare_devs).unwrap()
}

fn engine(level: Level, members: u32, spares: usize, scala: ScalaAfaConfig) -> ScalaAfa<Ssd> {
    engine_keeping(afa_nand::PayloadMode::Token, level, members, spares, scala)
}

fn with_mode(mode: ScalaMode) -> ScalaAfaConfig {
    ScalaAfaConfig {
        mode,
        ..ScalaAfaConfig::default()
    }
}

const SHAPES: [(Level, u32); 3] = [(Level::Raid5, 5), (Level::Raid6, 6), (Level::Raid5, 3)];

#[test]
fn keeps_data_through_offloaded_conversion_and_gc() {
    for (level, n) in SHAPES {
        // A small spare makes holes run the free HHs out, so array-level GC must clean.
        let scala = ScalaAfaConfig {
            spare_fraction: 0.03,
            ..ScalaAfaConfig::default()
        };
        let mut h = Harness::new(engine(level, n, 0, scala));
        let mut rng = SimRng::new(5 + n as u64);
        let cap = h.tokens.len() as u64;
        let cs = h.volume.chunk_sectors();
        for c in 0..cap / cs as u64 {
            h.write(c * cs as u64, cs).unwrap();
        }
        while h.volume.stats().user_write_sectors < cap * 3 {
            h.random_ops(&mut rng, 100);
        }
        let s = *h.volume.stats();
        assert!(s.stripes_converted > 0, "{level:?}: {s:?}");
        assert!(s.convert_commands >= s.stripes_converted, "{s:?}");
        assert_eq!(s.host_conversions, 0);
        assert!(s.gc_stripes > 0, "{level:?}: {s:?}");
        h.check_all();
    }
}

#[test]
fn scala_co_converts_on_the_host_and_keeps_data() {
    let mut h = Harness::new(engine(Level::Raid6, 6, 0, with_mode(ScalaMode::ScalaCo)));
    let mut rng = SimRng::new(3);
    let cap = h.tokens.len() as u64;
    while h.volume.stats().user_write_sectors < cap * 2 {
        h.random_ops(&mut rng, 100);
    }
    let s = *h.volume.stats();
    assert!(s.host_conversions > 0 && s.convert_commands == 0, "{s:?}");
    h.check_all();
}

/// Scala-CO converts on the daemon's own core (§5.6, §6.5): the reads and the parity write
/// are the daemon's commands, and the I/O threads are not charged for them.
#[test]
fn scala_co_conversion_runs_on_the_daemon_not_the_io_thread() {
    let mut h = Harness::new(engine(Level::Raid5, 5, 0, with_mode(ScalaMode::ScalaCo)));
    let cs = h.volume.chunk_sectors() as u64;
    for c in 0..4 {
        h.write(c * cs, cs as u32).unwrap();
    }
    h.volume.take_host_work();
    h.now_ns += 1_000_000;
    h.volume.background(h.now_ns);
    let s = *h.volume.stats();
    assert_eq!(s.host_conversions, 1, "{s:?}");
    // k reads of the primaries, the parity write and the trim of the VH.
    assert_eq!(s.daemon_commands, 6, "{s:?}");
    let work = h.volume.take_host_work();
    assert_eq!(work.background_commands, 0, "{work:?}");
    assert_eq!(work.background_bytes, 0, "{work:?}");
    assert_eq!(work.background_parity_bytes, 0, "{work:?}");
    h.check_all();
}

/// Converts `groups` full hero groups on the host at once and returns how long the last one
/// took.
fn host_conversion_span_ns(groups: u64) -> TimeNs {
    let mut h = Harness::new(engine(Level::Raid5, 5, 0, with_mode(ScalaMode::ScalaCo)));
    let cs = h.volume.chunk_sectors() as u64;
    for c in 0..4 * groups {
        h.write(c * cs, cs as u32).unwrap();
    }
    let start = h.now_ns + 1_000_000;
    h.volume.serve_manager(start).unwrap();
    let full: usize = h.volume.manager.full.iter().map(|l| l.len()).sum();
    assert_eq!(full as u64, groups);
    assert_eq!(h.volume.stats().host_conversions, 0);
    h.volume.convert_all_full(start).unwrap();
    assert_eq!(h.volume.stats().host_conversions, groups);
    let last = h.volume.pending.iter().map(|&(t, _)| t).max().unwrap();
    last - start
}

/// The daemon polls (SPDK): a host conversion's parity, booked for when its reads complete,
/// does not keep the daemon from issuing the next conversions' reads in the meantime, so the
/// conversions of several full groups overlap instead of running one after another.
#[test]
fn scala_co_conversions_overlap_on_the_daemon() {
    let one = host_conversion_span_ns(1);
    let four = host_conversion_span_ns(4);
    // One after another they take four times one (3.98 with a daemon that has one next-free
    // time); overlapped, about twice, as the members' dies still serialise part of the work.
    assert!(
        four < 3 * one,
        "four conversions took {four} ns, one took {one} ns"
    );
}

/// §5.3: a chunk costs one primary and m backups, and a full HG converts with m commands
/// that move no data over the host link; the parity the SSDs computed reconstructs data.
#[test]
fn placement_gathers_each_stripe_on_its_parity_members() {
    for (level, n) in [(Level::Raid5, 5), (Level::Raid6, 6)] {
        let m = if level == Level::Raid6 { 2 } else { 1 };
        let k = n as u64 - m;
        let mut h = Harness::new(engine(level, n, 0, with_mode(ScalaMode::Scalaafa)));
        let cs = h.volume.chunk_sectors() as u64;
        for c in 0..k {
            h.write(c * cs, cs as u32).unwrap();
        }
        let s = *h.volume.stats();
        assert_eq!(s.member_write_sectors, (1 + m) * k * cs);
        assert_eq!(h.volume.replicated_chunks(), k);
        assert_eq!(s.stripes_converted, 0);
        // The host goes idle: the daemon converts the full HG inside the SSDs.
        h.volume.take_host_work();
        h.now_ns += 1_000_000;
        h.volume.background(h.now_ns);
        let s = *h.volume.stats();
        assert_eq!(s.stripes_converted, 1);
        assert_eq!(s.convert_commands, m);
        assert_eq!(
            s.member_read_sectors, 0,
            "conversion read nothing over the link"
        );
        let work = h.volume.take_host_work();
        assert_eq!(work.background_bytes, 0, "{work:?}");
        // Every member fails in turn (m at once), so reads decode with the SSD's parity.
        h.now_ns += 1_000_000;
        h.volume.background(h.now_ns);
        h.volume.fail_member(1, h.now_ns).unwrap();
        if m == 2 {
            h.volume.fail_member(2, h.now_ns).unwrap();
        }
        h.check_all();
        assert!(h.volume.stats().degraded_reads > 0);
    }
}

/// §5.4: every copy carries (user chunk, slot, timestamp) in its sectors' OOB tags, and the
/// SSD's conversion leaves in the parity chunk's tags the parity of the data chunks' tags.
#[test]
fn metadata_rides_in_the_oob_and_parity_covers_it() {
    let mut h = Harness::new(engine(Level::Raid5, 5, 0, with_mode(ScalaMode::Scalaafa)));
    let cs = h.volume.chunk_sectors();
    for c in [7u64, 3, 9, 1] {
        h.write(c * cs as u64, cs).unwrap();
    }
    let v = &h.volume;
    let stripe = v.amt[7] / 4;
    let mut xor = vec![0u8; v.tag_bytes];
    for (j, want) in [7u32, 3, 9, 1].into_iter().enumerate() {
        let d = v.data_member(stripe, j);
        let tags = v.members[d].device.scan_tags(v.hh_lba(stripe), cs).unwrap();
        let (chunk, slot, ts, kind) = decode_meta(&tags);
        assert_eq!(
            (chunk, slot as usize, ts, kind),
            (want, j, j as u32 + 1, KIND_PRIMARY)
        );
        let mut as_backup = tags[..v.tag_bytes].to_vec();
        as_backup[KIND_AT] = KIND_BACKUP;
        for (x, t) in xor.iter_mut().zip(&as_backup) {
            *x ^= t;
        }
        let p = v.parity_member(stripe, 0);
        let vh = v.stripes[stripe as usize].vhs[0];
        let backup = v.members[p].device.scan_tags(v.vh_lba(vh, j), cs).unwrap();
        assert_eq!(
            decode_meta(&backup),
            (want, j as u8, j as u32 + 1, KIND_BACKUP)
        );
    }
    h.now_ns += 1_000_000;
    h.volume.background(h.now_ns);
    let v = &h.volume;
    assert_eq!(v.stats().stripes_converted, 1);
    let p = v.parity_member(stripe, 0);
    let parity = v.members[p].device.scan_tags(v.hh_lba(stripe), cs).unwrap();
    assert_eq!(&parity[..v.tag_bytes], &xor[..]);
}

type Ops = fn(&mut Harness<ScalaAfa<Ssd>>, &mut SimRng, usize);

/// A RAID 5 (m = 1) or RAID 6 (m = 2) volume with m spares, written over twice by `ops`,
/// whose members `first`, `first + 2`, … fail one after the other under more of `ops`,
/// checked degraded after each, then rebuilt onto the spares.
fn failed_and_rebuilt(
    level: Level,
    n: u32,
    seed: u64,
    first: usize,
    ops: Ops,
) -> Harness<ScalaAfa<Ssd>> {
    let m = if level == Level::Raid6 { 2 } else { 1 };
    let mut h = Harness::new(engine(level, n, m, with_mode(ScalaMode::Scalaafa)));
    let mut rng = SimRng::new(seed);
    let cap = h.tokens.len() as u64;
    while h.volume.stats().user_write_sectors < cap * 2 {
        ops(&mut h, &mut rng, 100);
    }
    for f in 0..m {
        let now = h.now_ns;
        h.volume.fail_member(first + f * 2, now).unwrap();
        ops(&mut h, &mut rng, 300);
        h.check_all();
    }
    assert!(h.volume.rebuilding());
    h.now_ns += 1_000_000_000_000;
    h.volume.background(h.now_ns);
    assert!(!h.volume.rebuilding(), "{level:?}");
    h
}

#[test]
fn degraded_reads_and_rebuild_lose_nothing() {
    for (level, n) in [(Level::Raid5, 5), (Level::Raid6, 6)] {
        let mut h = failed_and_rebuilt(level, n, 11, 0, |h, rng, n| h.random_ops(rng, n));
        let mut rng = SimRng::new(12);
        let s = *h.volume.stats();
        assert!(s.units_rebuilt > 0 && s.last_rebuild_ns.is_some(), "{s:?}");
        assert!(s.degraded.degraded_read_commands > 0, "{s:?}");
        h.check_all();
        h.random_ops(&mut rng, 300);
        h.check_all();
    }
}

/// A parity chunk whose tags outlived its data (a host crash over member files) decodes a lost
/// member's chunk to other bytes: the read fails instead of returning them.
#[test]
fn a_decode_that_misses_its_checksums_fails_the_read() {
    let mut h = Harness::new(engine(Level::Raid5, 5, 0, with_mode(ScalaMode::Scalaafa)));
    let cs = h.volume.chunk_sectors();
    for c in 0..4u64 {
        h.write(c * cs as u64, cs).unwrap();
    }
    h.now_ns += 1_000_000;
    h.volume.background(h.now_ns);
    assert_eq!(h.volume.stats().stripes_converted, 1);
    let (stripe, j) = (h.volume.amt[2] / 4, (h.volume.amt[2] % 4) as usize);
    let (d, p) = (
        h.volume.data_member(stripe, j),
        h.volume.parity_member(stripe, 0),
    );
    let lba = h.volume.hh_lba(stripe);
    // The parity's data goes back to something else; its tags stay.
    let tags = h.volume.members[p].device.scan_tags(lba, cs).unwrap();
    let garbage = vec![0x5au8; cs as usize * h.volume.unit];
    let stale = Command {
        tags: Some(&tags),
        ..Command::write(lba, cs, &garbage)
    };
    let now = h.now_ns;
    h.volume.members[p]
        .device
        .submit(now, &stale, ReadBuffers::none())
        .unwrap();
    h.volume.fail_member(d, now).unwrap();
    let mut out = vec![0u8; cs as usize * h.volume.unit];
    let read = Command::read(2 * cs as u64, cs);
    let err = h
        .volume
        .submit(
            now,
            &read,
            ReadBuffers {
                data: &mut out,
                tags: None,
            },
        )
        .unwrap_err();
    assert!(matches!(err, DeviceError::Medium(_)), "{err:?}");
    // The other chunks read from their own members.
    h.read_check(0, cs);
}

/// The XOR of three whole copies (data and tags), which is what a decode from a parity of
/// another generation gives, is not whole under the tags' checksum, though it would be
/// under plain CRC-32, which is affine over XOR.
#[test]
fn an_xor_of_whole_copies_is_not_whole() {
    let (tag_bytes, unit, sectors) = (16usize, 8usize, 4u32);
    let copy = |i: u8| -> (Vec<u8>, Vec<u8>) {
        let data: Vec<u8> = (0..unit * sectors as usize)
            .map(|b| (b as u8).wrapping_mul(31).wrapping_add(i.wrapping_mul(97)))
            .collect();
        let meta = encode_meta(7, 0, 100, KIND_BACKUP);
        let tags = meta_tags(tag_bytes, unit, sectors, meta, &data).unwrap();
        (data, tags)
    };
    let (datas, tagss): (Vec<Vec<u8>>, Vec<Vec<u8>>) = (1..=3).map(copy).unzip();
    for (data, tags) in datas.iter().zip(&tagss) {
        assert!(copy_is_whole(tags, data, tag_bytes, unit));
    }
    let xor = |all: &[Vec<u8>]| -> Vec<u8> {
        let mut out = all[0].clone();
        for c in &all[1..] {
            out.iter_mut().zip(c).for_each(|(o, b)| *o ^= b);
        }
        out
    };
    let (data, tags) = (xor(&datas), xor(&tagss));
    assert!(!copy_is_whole(&tags, &data, tag_bytes, unit));
    // The premise: plain CRC-32 of the XOR is the XOR of the CRC-32s.
    let crc = |d: &[u8]| crc32fast::hash(&d[..unit]);
    assert_eq!(crc(&data), crc(&datas[0]) ^ crc(&datas[1]) ^ crc(&datas[2]));
}

/// A replacement rebuilt onto a spare carries the OOB metadata of every chunk it holds, so a
/// power loss after the rebuild finds every acknowledged write by the OOB scan (§5.4), with
/// one member and with two members rebuilt.
#[test]
fn recovery_after_a_rebuild_finds_the_rebuilt_chunks_metadata() {
    for (level, n) in [(Level::Raid5, 5), (Level::Raid6, 6)] {
        // No trims: a trim outlives a power loss only through a checkpoint (docs/scalaafa.md).
        let mut h = failed_and_rebuilt(level, n, 23, 1, writes_and_reads);
        h.check_all();
        let (config, scala) = (h.volume.config.clone(), h.volume.scala.clone());
        let mut h = h.after_crash(|v| {
            ScalaAfa::recover(config, scala, v.into_members(), vec![]).expect("recovery")
        });
        h.check_all();
        writes_and_reads(&mut h, &mut SimRng::new(24), 300);
        h.check_all();
    }
}

/// A primary the SSD cannot read this time is read from a replica before conversion and
/// decoded from the stripe after it; the oracle sees nothing of it.
#[test]
fn uncorrectable_primaries_are_read_from_replicas_or_decoded() {
    for (level, n) in SHAPES {
        let config = ArrayConfig {
            level,
            members: n,
            chunk_bytes: 8 * 1024,
            ..ArrayConfig::default()
        };
        let mut cfg = scala_ssd_config(afa_nand::PayloadMode::Token);
        // Rare enough that two members seldom fail the same stripe at once, which one
        // parity cannot answer.
        cfg.faults.read_fail_probability = 0.002;
        let devs = (0..n as u64)
            .map(|i| Ssd::new(cfg.clone(), i).unwrap())
            .collect();
        let volume = ScalaAfa::new(config, with_mode(ScalaMode::Scalaafa), devs, vec![]).unwrap();
        let mut h = Harness::new(volume);
        let mut rng = SimRng::new(43);
        let cap = h.tokens.len() as u64;
        while h.volume.stats().user_write_sectors < cap * 2 {
            writes_and_reads(&mut h, &mut rng, 100);
        }
        h.check_all();
        let s = *h.volume.stats();
        assert!(s.read_errors_corrected > 0, "{level:?} {n}: {s:?}");
        assert!(s.stripes_converted > 0, "{level:?} {n}: {s:?}");
    }
}

/// RAID 6 reads through any two members that cannot read: a stripe in replication from
/// its third copy, a converted one decoded from the four chunks left. The first unreadable
/// replica, or the second unreadable shard of a decode, used to fail the read.
#[test]
fn raid6_reads_through_two_unreadable_members() {
    for mode in [ScalaMode::Scalaafa, ScalaMode::ScalaCo] {
        let (devs, flags) =
            crate::tests::Unreadable::members(&scala_ssd_config(afa_nand::PayloadMode::Token), 6);
        let volume =
            ScalaAfa::new(array_config(Level::Raid6, 6), with_mode(mode), devs, vec![]).unwrap();
        let mut h = Harness::new(volume);
        let mut rng = SimRng::new(44);
        let cap = h.tokens.len() as u64;
        while h.volume.stats().user_write_sectors < cap * 2 {
            writes_and_reads(&mut h, &mut rng, 100);
        }
        let replicated = |v: &ScalaAfa<_>| {
            v.stripes
                .iter()
                .filter(|s| matches!(s.state, HhState::Open | HhState::Full))
                .count()
        };
        assert!(h.volume.stats().stripes_converted > 0, "{mode:?}");
        assert!(replicated(&h.volume) > 0, "{mode:?}");
        crate::tests::check_all_with_two_unreadable(&mut h, &flags);
        assert!(h.volume.stats().read_errors_corrected > 0, "{mode:?}");
    }
}

/// RAID 5 of five members whose reads can be made to fail (`fail_next[i]`: member i's
/// next reads), with tokens.
fn unreadable_raid5() -> (
    Harness<ScalaAfa<crate::tests::Unreadable>>,
    Vec<std::sync::Arc<std::sync::atomic::AtomicU32>>,
) {
    let (devs, _) =
        crate::tests::Unreadable::members(&scala_ssd_config(afa_nand::PayloadMode::Token), 5);
    let fail_next = devs.iter().map(|d| d.fail_next_reads.clone()).collect();
    let scala = ScalaAfaConfig::default();
    let volume = ScalaAfa::new(array_config(Level::Raid5, 5), scala, devs, vec![]).unwrap();
    (Harness::new(volume), fail_next)
}

/// RAID 5: a converted chunk whose home cannot be read is decoded from the others, and
/// when one of those fails too, that is two erasures for one parity. The SSD's read errors
/// are transient, so the shard is read again and the decode goes on (the config soak, seed
/// 5263, failed a trim's read there).
#[test]
fn a_decode_reads_again_a_shard_that_failed_once() {
    use std::sync::atomic::Ordering::Relaxed;
    let (mut h, fail_next) = unreadable_raid5();
    let mut rng = SimRng::new(45);
    let cap = h.tokens.len() as u64;
    while h.volume.stats().user_write_sectors < cap * 2 {
        writes_and_reads(&mut h, &mut rng, 100);
    }
    let k = h.volume.k as u32;
    let (stripe, chunk) = (0..h.volume.rows)
        .filter(|&r| h.volume.stripes[r as usize].state == HhState::Striped)
        .find_map(|r| {
            let c = h.volume.stripes[r as usize].chunks[0];
            (c != NONE && h.volume.amt[c as usize] == r * k).then_some((r, c))
        })
        .expect("a converted stripe whose first slot is live");
    fail_next[h.volume.data_member(stripe, 0)].store(1, Relaxed);
    fail_next[h.volume.data_member(stripe, 1)].store(1, Relaxed);
    let cs = h.volume.chunk_sectors();
    h.try_read_check(chunk as u64 * cs as u64, cs)
        .expect("the chunk is decoded through a shard read twice");
    let s = *h.volume.stats();
    assert_eq!(s.read_retries, 1, "{s:?}");
    assert_eq!(s.read_errors_corrected, 1, "{s:?}");
}

/// RAID 5: a chunk of a stripe still in replication whose primary and backup both fail one
/// read is read again rather than failing the read: there is no parity to decode from yet,
/// and the SSD's read errors are transient (the config soak, seed 15973, failed a write of
/// scala-co on RAID 6 with a member down there).
#[test]
fn a_replicated_chunk_whose_copies_all_failed_once_is_read_again() {
    use std::sync::atomic::Ordering::Relaxed;
    let (mut h, fail_next) = unreadable_raid5();
    let cs = h.volume.chunk_sectors();
    h.write(0, cs).unwrap();
    let a = h.volume.amt[0];
    let (stripe, j) = (a / h.volume.k as u32, (a % h.volume.k as u32) as usize);
    assert!(matches!(
        h.volume.stripes[stripe as usize].state,
        HhState::Open | HhState::Full
    ));
    fail_next[h.volume.data_member(stripe, j)].store(1, Relaxed);
    fail_next[h.volume.parity_member(stripe, 0)].store(1, Relaxed);
    h.try_read_check(0, cs)
        .expect("the chunk is read from a copy read twice");
    let s = *h.volume.stats();
    assert_eq!(s.read_retries, 1, "{s:?}");
    assert_eq!(s.read_errors_corrected, 1, "{s:?}");
}

/// §5.2: grants are batches by message; many threads on a small volume run the manager dry,
/// so it recalls unused heroes; ending a thread returns its heroes and closes its HG.
#[test]
fn many_threads_trigger_recalls_and_ending_threads_returns_heroes() {
    let scala = ScalaAfaConfig {
        io_threads: 8,
        grant_batch_hhs: 1024,
        ..ScalaAfaConfig::default()
    };
    let mut h = Harness::new(engine(Level::Raid5, 5, 0, scala));
    let mut rng = SimRng::new(17);
    let cap = h.tokens.len() as u64;
    while h.volume.stats().user_write_sectors < cap * 2 {
        h.random_ops(&mut rng, 100);
    }
    let s = *h.volume.stats();
    assert!(s.grants > 8, "{s:?}");
    assert!(s.recalls > 0, "{s:?}");
    let work = h.volume.take_host_work();
    assert!(work.messages > 0 || s.thread_messages > 0, "{work:?}");
    for t in 0..8 {
        h.volume.end_thread(t, h.now_ns).unwrap();
    }
    assert!(h.volume.end_thread(8, h.now_ns).is_err());
    assert!(h.threads_hold_nothing());
    h.now_ns += 1_000_000_000;
    h.volume.background(h.now_ns);
    h.check_all();
    h.random_ops(&mut rng, 300);
    h.check_all();
}

impl Harness<ScalaAfa<Ssd>> {
    fn threads_hold_nothing(&self) -> bool {
        let v = &self.volume;
        v.threads[..v.scala.io_threads as usize]
            .iter()
            .all(|t| t.hhs.is_empty() && t.vhs.iter().all(|l| l.is_empty()))
    }
}

#[test]
fn a_seed_reproduces_a_run() {
    let run = || {
        let mut h = Harness::new(engine(Level::Raid5, 4, 1, with_mode(ScalaMode::Scalaafa)));
        let mut rng = SimRng::new(99);
        h.random_ops(&mut rng, 1500);
        h.volume.fail_member(2, h.now_ns).unwrap();
        h.random_ops(&mut rng, 500);
        (h.now_ns, *h.volume.stats())
    };
    assert_eq!(run(), run());
}

#[test]
fn bad_configurations_are_refused_with_the_key_named() {
    let config = ArrayConfig {
        level: Level::Raid10,
        members: 4,
        ..ArrayConfig::default()
    };
    let devs = (0..4).map(ssd).collect();
    let err = ScalaAfa::new(config, ScalaAfaConfig::default(), devs, vec![]).unwrap_err();
    assert!(err.to_string().contains("raid5 or raid6"), "{err}");
    let config = ArrayConfig {
        level: Level::Raid5,
        members: 4,
        chunk_bytes: 8 * 1024,
        ..ArrayConfig::default()
    };
    let bad = ScalaAfaConfig {
        transient_fraction: 0.7,
        ..ScalaAfaConfig::default()
    };
    let devs = (0..4).map(ssd).collect();
    let err = ScalaAfa::new(config, bad, devs, vec![]).unwrap_err();
    assert!(err.to_string().contains("transient_fraction"), "{err}");
}

/// Found by the property test below: RS(4, 2) with three threads and a spare rebuilding.
#[test]
fn raid6_three_threads_with_a_rebuilding_spare_keeps_finding_space() {
    let seed = 9346694696851444828u64;
    let scala = ScalaAfaConfig {
        mode: ScalaMode::ScalaWr,
        io_threads: 3,
        ..ScalaAfaConfig::default()
    };
    let mut h = Harness::new(engine(Level::Raid6, 6, 1, scala));
    let mut rng = SimRng::new(seed);
    h.random_ops(&mut rng, 2159);
    h.volume.fail_member((seed % 6) as usize, h.now_ns).unwrap();
    h.random_ops(&mut rng, 2500 - 2159);
    h.check_all();
}

/// Found by the property test below: RAID 5 over four members, three threads, one member
/// failed for good.
#[test]
fn raid5_three_threads_with_a_failed_member_keeps_finding_space() {
    let seed = 11845951395099632144u64;
    let scala = ScalaAfaConfig {
        io_threads: 3,
        ..ScalaAfaConfig::default()
    };
    let mut h = Harness::new(engine(Level::Raid5, 4, 0, scala));
    let mut rng = SimRng::new(seed);
    h.random_ops(&mut rng, 1706);
    h.volume.fail_member((seed % 4) as usize, h.now_ns).unwrap();
    h.random_ops(&mut rng, 2500 - 1706);
    h.check_all();
}

/// Random writes and checked reads (no trims: a trim is not durable across a power loss).
fn writes_and_reads<D: BlockDevice>(h: &mut Harness<ScalaAfa<D>>, rng: &mut SimRng, count: usize) {
    let cap = h.tokens.len() as u64;
    for _ in 0..count {
        let len = 1 + rng.below(40) as u32;
        let lba = rng.below(cap - len as u64);
        if rng.below(4) == 0 {
            h.read_check(lba, len);
        } else {
            h.write(lba, len).expect("write accepted");
        }
    }
}

/// Power loss between any two requests: the engine's host memory is gone, the members keep
/// what they were sent (these SSDs have no volatile write buffer, so every acknowledged
/// write is durable). Recovery from the OOB scan alone must give back every acknowledged
/// write, and the recovered volume must keep working.
fn crash_and_recover(level: Level, n: u32, seed: u64, crash_after: usize) {
    let volume = engine(level, n, 0, with_mode(ScalaMode::Scalaafa));
    crash_and_recover_volume(volume, seed, crash_after, false);
}

/// The body of every power-loss test without a lost member: `crash_after` requests, an
/// optional torn checkpoint (`tear_newest`: one more is taken and destroyed on every member,
/// as if the power had gone while it was written), recovery, the oracle over everything
/// acknowledged, then more requests and the oracle again. Returns the recovered stats.
fn crash_and_recover_volume(
    volume: ScalaAfa<Ssd>,
    seed: u64,
    crash_after: usize,
    tear_newest: bool,
) -> ScalaAfaStats {
    let mut h = Harness::new(volume);
    let mut rng = SimRng::new(seed);
    writes_and_reads(&mut h, &mut rng, crash_after);
    let torn = tear_newest.then(|| {
        h.volume.checkpoint(h.now_ns).unwrap();
        let seq = h.volume.checkpoints.next_seq - 1;
        (seq, h.volume.checkpoint_lba(seq % 2, 0))
    });
    let (config, scala) = (h.volume.config.clone(), h.volume.scala.clone());
    let now_ns = h.now_ns;
    let mut h = h.after_crash(|v| {
        let mut members = v.into_members();
        if let Some((_, lba)) = torn {
            // The header's chunk (two 4 KiB sectors) never reached any member.
            let sectors = 2;
            for d in &mut members {
                let zeros = vec![0u8; sectors as usize * 4096];
                d.submit(
                    now_ns,
                    &Command::write(lba, sectors, &zeros),
                    ReadBuffers::none(),
                )
                .unwrap();
            }
        }
        ScalaAfa::recover(config, scala, members, vec![]).expect("recovery")
    });
    assert_copies_agree(&mut h.volume);
    let stats = *h.volume.stats();
    if let Some((seq, _)) = torn {
        assert!(
            stats.recovered_checkpoint_seq.is_none_or(|s| s < seq),
            "{stats:?}"
        );
    }
    h.check_all();
    writes_and_reads(&mut h, &mut rng, 400);
    h.now_ns += 1_000_000_000;
    h.volume.background(h.now_ns);
    h.check_all();
    stats
}

/// Power loss that also takes member `failed` (its device is replaced by a blank one that
/// recovery must not need): recovery from the other members' OOB areas must give back every
/// acknowledged write, serve it degraded (or rebuild it onto `spare`), and keep working.
fn crash_and_recover_degraded(level: Level, n: u32, seed: u64, crash_after: usize, spare: bool) {
    let mut h = Harness::new(engine(level, n, 0, with_mode(ScalaMode::Scalaafa)));
    let mut rng = SimRng::new(seed);
    writes_and_reads(&mut h, &mut rng, crash_after);
    let (config, scala) = (h.volume.config.clone(), h.volume.scala.clone());
    let mut h = h.after_crash(|v| {
        let mut members = v.into_members();
        let failed = (seed % n as u64) as usize;
        // The lost SSD's slot holds a blank device: anything read from it would be wrong.
        members[failed] = ssd(500 + seed);
        let spares = if spare { vec![ssd(900 + seed)] } else { vec![] };
        ScalaAfa::recover_degraded(config, scala, members, spares, failed).expect("recovery")
    });
    assert_copies_agree(&mut h.volume);
    h.check_all();
    writes_and_reads(&mut h, &mut rng, 400);
    h.now_ns += 1_000_000_000;
    h.volume.background(h.now_ns);
    h.check_all();
    if spare {
        // Give the rebuild time to finish, then lose nothing either.
        for _ in 0..200 {
            if !h.volume.rebuilding() {
                break;
            }
            h.now_ns += 1_000_000_000;
            h.volume.background(h.now_ns);
        }
        assert!(!h.volume.rebuilding());
        h.check_all();
    }
}

/// Power loss after `crash_after` requests on a volume of `full` members checkpointing every
/// `interval_ms` (0: never), with `threads` I/O threads; see `crash_and_recover_volume`.
fn crash_and_recover_checkpointed(
    level: Level,
    n: u32,
    seed: u64,
    crash_after: usize,
    interval_ms: f64,
    tear_newest: bool,
    threads: u32,
) -> ScalaAfaStats {
    let scala = ScalaAfaConfig {
        checkpoint_interval_ms: interval_ms,
        io_threads: threads,
        ..ScalaAfaConfig::default()
    };
    let volume = engine_keeping(afa_nand::PayloadMode::Full, level, n, 0, scala);
    crash_and_recover_volume(volume, seed, crash_after, tear_newest)
}

/// Power lost after `budget` medium-changing member commands, wherever that falls: between
/// a write's primary and its backups, inside a conversion (host or in-SSD), a cleaning's
/// moves, the trims that recycle a hero group, or a checkpoint. Requests are writes, checked
/// reads and idle time (in which the daemon converts every full hero group). Recovery must
/// give back every acknowledged write, and each sector of the write the power cut either old
/// or new; then the recovered volume must keep working.
fn crash_inside_a_request(
    level: Level,
    n: u32,
    seed: u64,
    budget: u64,
    payload: afa_nand::PayloadMode,
    scala: ScalaAfaConfig,
) -> ScalaAfaStats {
    crash_inside_a_request_losing(level, n, seed, budget, payload, scala, &[])
}

/// As [`crash_inside_a_request`]; the power loss also takes the members `lost` (their slots
/// hold blank devices recovery must not need).
fn crash_inside_a_request_losing(
    level: Level,
    n: u32,
    seed: u64,
    budget: u64,
    payload: afa_nand::PayloadMode,
    scala: ScalaAfaConfig,
    lost: &[usize],
) -> ScalaAfaStats {
    let devs = (0..n as u64).map(|i| ssd_keeping(payload, i)).collect();
    let devs = PowerCut::members(devs, budget);
    let volume = ScalaAfa::new(array_config(level, n), scala.clone(), devs, vec![]).unwrap();
    let mut h = Harness::new(volume);
    let mut rng = SimRng::new(seed);
    let cap = h.tokens.len() as u64;
    let mut torn = None;
    for _ in 0..20_000 {
        let len = 1 + rng.below(40) as u32;
        let lba = rng.below(cap - len as u64);
        match rng.below(16) {
            0..=3 => {
                if h.try_read_check(lba, len).is_err() {
                    break;
                }
            }
            4 => {
                h.now_ns += 2_000_000;
                h.volume.background(h.now_ns);
            }
            _ => {
                if h.write(lba, len).is_err() {
                    torn = Some((lba, len, h.version));
                    break;
                }
            }
        }
    }
    let config = h.volume.config.clone();
    let in_place = scala.sub_chunk_writes == SubChunkWrites::InPlace;
    let mut h = h.after_crash(|v| {
        let mut members: Vec<Ssd> = v.into_members().into_iter().map(|d| d.inner).collect();
        if lost.is_empty() {
            return ScalaAfa::recover(config, scala, members, vec![]).expect("recovery");
        }
        for (i, &f) in lost.iter().enumerate() {
            members[f] = ssd_keeping(payload, 500 + i as u64 + seed);
        }
        ScalaAfa::recover_without(config, scala, members, vec![], lost).expect("recovery")
    });
    assert_copies_agree(&mut h.volume);
    h.check_after_crash(torn);
    writes_and_reads(&mut h, &mut rng, 400);
    h.now_ns += 1_000_000_000;
    h.volume.background(h.now_ns);
    h.check_all();
    let stats = *h.volume.stats();
    if in_place && lost.is_empty() {
        // Copies that disagree would show here: the failed member's chunks are read from
        // their replicas, or decoded from parity computed from the backups.
        h.volume
            .fail_member((seed % n as u64) as usize, h.now_ns)
            .unwrap();
        h.check_all();
    }
    stats
}

/// After a recovery, every slot written in a replicated stripe has copies that agree
/// sector by sector on every member that serves them (all but the kind byte of their tags,
/// whose checksums cover the data; a spare is left out until its rebuild reaches them).
fn assert_copies_agree<D: BlockDevice>(v: &mut ScalaAfa<D>) {
    let cs = v.chunk_sectors;
    for row in 0..v.rows {
        let s = &v.stripes[row as usize];
        if !matches!(s.state, HhState::Open | HhState::Full) {
            continue;
        }
        for j in 0..s.filled as usize {
            let mut here = v.slot_copies(row, j);
            here.retain(|&(member, _, vh)| match vh {
                None => v.serves_row(member, row),
                Some(vh) => v.serves_vh(member, vh),
            });
            let mut tags: Vec<Vec<u8>> = here
                .iter()
                .map(|&(d, lba, _)| v.members[d].device.scan_tags(lba, cs).unwrap())
                .collect();
            for t in &mut tags {
                set_kind(t, v.tag_bytes, 0);
            }
            assert!(
                tags.windows(2).all(|w| w[0] == w[1]),
                "row {row} slot {j}: copies {here:?} disagree"
            );
        }
    }
}

/// One random request of the host-crash tests: a write (noted in `since` once a flush has
/// been taken), a checked read, or idle time in which the daemon converts every full hero
/// group.
fn request_noting(
    h: &mut Harness<ScalaAfa<PageCache>>,
    rng: &mut SimRng,
    since: Option<&mut BTreeMap<usize, Vec<u64>>>,
) {
    let cap = h.tokens.len() as u64;
    let len = 1 + rng.below(40) as u32;
    let lba = rng.below(cap - len as u64);
    match rng.below(16) {
        0..=3 => h.read_check(lba, len),
        4 => {
            h.now_ns += 2_000_000;
            h.volume.background(h.now_ns);
        }
        _ => match since {
            Some(since) => h.write_noting(lba, len, since).expect("write accepted"),
            None => h.write(lba, len).expect("write accepted"),
        },
    }
}

/// `before` requests, a FLUSH, `after` more whose writes are acknowledged but not flushed
/// (conversions and cleanings run among them), then a host crash: the members sit behind a
/// page cache, so each command since the flush keeps or loses its data and its tags
/// independently. Every sector must read back as flushed or as a later write, never older,
/// also once a member has failed and reads are decoded from the parity, and the recovered
/// volume must keep working.
///
/// Each (member, request) in `lost` fails that member before that request (of `before +
/// after`): the crash then hits a dirty degraded volume, and the lost members' chunks must
/// still read back as flushed or later, from backups or parity.
///
/// With `fua_one_in` > 0, about one request in that many after the flush is a FUA write,
/// whose sectors must then read back as it wrote them or later.
#[allow(clippy::too_many_arguments)]
fn host_crash_and_recover(
    level: Level,
    n: u32,
    seed: u64,
    before: usize,
    after: usize,
    scala: ScalaAfaConfig,
    payload: afa_nand::PayloadMode,
    lost: &[(usize, usize)],
    fua_one_in: u64,
) -> ScalaAfaStats {
    let devs = (0..n as u64)
        .map(|i| PageCache::new(ssd_keeping(payload, i)))
        .collect();
    let config = array_config(level, n);
    let mut volume = ScalaAfa::new(config.clone(), scala.clone(), devs, vec![]).unwrap();
    volume.keep_flushed_writes();
    let mut h = Harness::new(volume);
    let mut rng = SimRng::new(seed);
    let fail_here = |h: &mut Harness<ScalaAfa<PageCache>>, i: usize| {
        for &(member, _) in lost.iter().filter(|&&(_, at)| at == i) {
            h.volume.fail_member(member, h.now_ns).unwrap();
        }
    };
    for i in 0..before {
        fail_here(&mut h, i);
        request_noting(&mut h, &mut rng, None);
    }
    h.volume
        .submit(h.now_ns, &Command::flush(), ReadBuffers::none())
        .unwrap();
    let mut flushed = h.tokens.clone();
    let mut since = BTreeMap::new();
    let cap = h.tokens.len() as u64;
    for i in before..before + after {
        fail_here(&mut h, i);
        if fua_one_in > 0 && rng.below(fua_one_in) == 0 {
            let len = 1 + rng.below(40) as u32;
            let lba = rng.below(cap - len as u64);
            h.write_fua_noting(lba, len, &mut flushed, &mut since)
                .expect("write accepted");
        } else {
            request_noting(&mut h, &mut rng, Some(&mut since));
        }
    }
    let failed: Vec<usize> = lost.iter().map(|&(member, _)| member).collect();
    let mut h = h.after_crash(|v| {
        let members = v
            .into_members()
            .into_iter()
            .map(|d| d.crash(&mut rng))
            .collect();
        ScalaAfa::recover_with(config, scala, members, vec![], &failed, true).expect("recovery")
    });
    assert_copies_agree(&mut h.volume);
    h.adopt_flushed_or_later(&flushed, &since);
    // Reads decoded from the parity recovery left must give the same data back.
    if lost.is_empty() {
        h.volume
            .fail_member((seed % n as u64) as usize, h.now_ns)
            .unwrap();
    }
    h.check_all();
    writes_and_reads(&mut h, &mut rng, 400);
    h.now_ns += 1_000_000_000;
    h.volume.background(h.now_ns);
    h.check_all();
    *h.volume.stats()
}

/// `per_shape` host crashes on each of `SHAPES` with in-SSD and host conversion, random
/// lengths and seeds from `seed`, and `lost` distinct random members failed at random
/// requests (shapes with fewer parity rows are skipped); returns the recoveries' counters
/// summed.
fn host_crash_sweep(seed: u64, per_shape: usize, lost: usize) -> ScalaAfaStats {
    let mut rng = SimRng::new(seed);
    let mut total = ScalaAfaStats::default();
    for (level, n) in SHAPES {
        let m = if level == Level::Raid6 { 2 } else { 1 };
        if lost > m {
            continue;
        }
        for mode in [ScalaMode::Scalaafa, ScalaMode::ScalaCo] {
            for _ in 0..per_shape {
                let before = rng.below(3000) as usize;
                let after = 1 + rng.below(600) as usize;
                let seed = rng.next_u64();
                let mut failing: Vec<(usize, usize)> = Vec::new();
                while failing.len() < lost {
                    let member = rng.below(n as u64) as usize;
                    let at = rng.below((before + after) as u64) as usize;
                    if failing.iter().all(|&(f, _)| f != member) {
                        failing.push((member, at));
                    }
                }
                let token = afa_nand::PayloadMode::Token;
                let scala = with_mode(mode);
                let stats = host_crash_and_recover(
                    level, n, seed, before, after, scala, token, &failing, 0,
                );
                total.recovery_torn_chunks += stats.recovery_torn_chunks;
                total.recovery_unwhole_copies += stats.recovery_unwhole_copies;
                total.recovery_resynced_stripes += stats.recovery_resynced_stripes;
            }
        }
    }
    total
}

/// A FUA write is durable when it completes: after a flush, random requests with one in
/// four a FUA write (conversions among them), then a host crash behind the members' page
/// cache, on a whole volume and on one that loses a member.
#[test]
fn a_fua_write_survives_a_host_crash() {
    let mut rng = SimRng::new(80);
    for (level, n) in SHAPES {
        for mode in [ScalaMode::Scalaafa, ScalaMode::ScalaCo] {
            for lose in [false, true] {
                let (before, after) = (rng.below(2000) as usize, 1 + rng.below(400) as usize);
                let lost = [(
                    rng.below(n as u64) as usize,
                    rng.below(after as u64) as usize,
                )];
                let lost: &[(usize, usize)] = if lose { &lost } else { &[] };
                let (seed, token) = (rng.next_u64(), afa_nand::PayloadMode::Token);
                let scala = with_mode(mode);
                host_crash_and_recover(level, n, seed, before, after, scala, token, lost, 4);
            }
        }
    }
}

#[test]
fn a_host_crash_keeps_every_flushed_write() {
    let total = host_crash_sweep(77, 6, 0);
    // The crashes tore copies, and kept tags without their data, for recovery to drop.
    assert!(total.recovery_torn_chunks > 0, "{total:?}");
    assert!(total.recovery_unwhole_copies > 0, "{total:?}");
    assert!(total.recovery_resynced_stripes > 0, "{total:?}");
}

/// A host crash over a volume that had already lost a member (md's "dirty degraded"
/// array): every flushed write of the lost member is still found, from its backups when the
/// parity that replaced them did not survive the crash.
#[test]
fn a_host_crash_on_a_degraded_volume_keeps_every_flushed_write() {
    let total = host_crash_sweep(78, 16, 1);
    // The crashes tore copies, lost slots among them, for recovery to drop.
    assert!(total.recovery_torn_chunks > 0, "{total:?}");
}

/// The same with m = 2 and two members lost (4+2 only).
#[test]
fn a_host_crash_with_two_members_lost_keeps_every_flushed_write() {
    let total = host_crash_sweep(79, 16, 2);
    assert!(total.recovery_torn_chunks > 0, "{total:?}");
}

#[test]
fn power_loss_inside_a_request_loses_no_acknowledged_write() {
    let token = afa_nand::PayloadMode::Token;
    let (mut torn, mut finished) = (0, 0);
    for (level, n) in [(Level::Raid5, 5), (Level::Raid6, 6), (Level::Raid5, 3)] {
        for mode in [ScalaMode::Scalaafa, ScalaMode::ScalaCo] {
            for budget in [0, 1, 2, 3, 5, 40, 333, 1200, 4000] {
                let seed = 90 + budget + n as u64;
                let s = crash_inside_a_request(level, n, seed, budget, token, with_mode(mode));
                torn += s.recovery_torn_chunks;
                finished += s.recovery_finished_conversions;
            }
        }
    }
    assert!(torn > 0, "no cut fell between a chunk's copies");
    // Cuts between the parity members of one conversion (m = 2), in the SSDs and on the host.
    for (mode, budget) in [(ScalaMode::Scalaafa, 347), (ScalaMode::ScalaCo, 438)] {
        let s = crash_inside_a_request(Level::Raid6, 6, 7, budget, token, with_mode(mode));
        finished += s.recovery_finished_conversions;
    }
    assert!(finished >= 2, "finished {finished}");
}

/// A power loss that also takes a member, cut at every member command over a stretch of
/// host conversions and cleanings. Found by a sweep like this one: the cut fell while a
/// cleaned stripe's chunks were being trimmed, the lost member was one of its data members,
/// and recovery decoded that member's tag from the half-trimmed slots and a parity still
/// whole, naming a chunk never written. A decode must now give a backup's tag back whole.
#[test]
fn power_loss_inside_a_request_with_a_lost_member_loses_nothing() {
    for budget in 700..800 {
        for lost in 0..4 {
            crash_inside_a_request_losing(
                Level::Raid5,
                4,
                7,
                budget,
                afa_nand::PayloadMode::Token,
                with_mode(ScalaMode::ScalaCo),
                &[lost],
            );
        }
    }
}

/// With m = 2 and a member lost: a stripe cut in mid-free whose decoded tag looked whole
/// but did not reproduce the second parity row (seed 9, budget 2434, member 0) and another
/// (seed 8, budget 1763, member 2), both found by a sweep; and a host conversion cut between
/// its parity members (seed 7, budget 438), with each member lost in turn. When the lost
/// member holds one of the stripe's data chunks, recovery finds that chunk's tag in the
/// backups still on the second parity member, sees the first parity row written, and
/// finishes the conversion.
#[test]
fn power_loss_with_a_lost_member_and_two_parity_rows() {
    let token = afa_nand::PayloadMode::Token;
    let scalaafa = with_mode(ScalaMode::Scalaafa);
    crash_inside_a_request_losing(Level::Raid6, 6, 9, 2434, token, scalaafa, &[0]);
    let co = with_mode(ScalaMode::ScalaCo);
    crash_inside_a_request_losing(Level::Raid6, 6, 8, 1763, token, co.clone(), &[2]);
    let mut finished = 0;
    for lost in 0..6 {
        let s = crash_inside_a_request_losing(Level::Raid6, 6, 7, 438, token, co.clone(), &[lost]);
        finished += s.recovery_finished_conversions;
    }
    // Members 0 to 3 hold the stripe's data; 4 and 5 its parity.
    assert_eq!(finished, 4);
}

/// With m = 2 a power loss may take two members and lose nothing acknowledged: every pair
/// of members of a 4+2 volume, lost with cuts in writes, host and in-SSD conversions and
/// cleanings. A pair of data members is decoded from both parity rows (no row is left over
/// to check the decode by); a data and a parity member from the other parity row; two
/// parity members leave the primaries as the only copies.
#[test]
fn power_loss_with_two_lost_members_loses_nothing() {
    let token = afa_nand::PayloadMode::Token;
    let mut finished = 0;
    for (budget, mode) in [
        (3, ScalaMode::Scalaafa),
        (347, ScalaMode::Scalaafa),
        (438, ScalaMode::ScalaCo),
        (1763, ScalaMode::ScalaCo),
        (2434, ScalaMode::Scalaafa),
        (4000, ScalaMode::ScalaCo),
    ] {
        for a in 0..6 {
            for b in a + 1..6 {
                let s = crash_inside_a_request_losing(
                    Level::Raid6,
                    6,
                    7 + budget,
                    budget,
                    token,
                    with_mode(mode),
                    &[a, b],
                );
                finished += s.recovery_finished_conversions;
            }
        }
    }
    assert!(
        finished > 0,
        "no cut fell between the parity members of a conversion"
    );
}

/// Recovery refuses more lost members than the array has parity rows, and a member named
/// twice, with an error naming the member.
#[test]
fn recovery_refuses_more_lost_members_than_parity_rows() {
    let members = || {
        (0..4u64)
            .map(|i| ssd_keeping(afa_nand::PayloadMode::Token, i))
            .collect()
    };
    let config = array_config(Level::Raid5, 4);
    let scala = ScalaAfaConfig::default();
    let err = ScalaAfa::recover_without(config.clone(), scala.clone(), members(), vec![], &[0, 2])
        .unwrap_err();
    assert!(
        err.to_string().contains("tolerates 1 failed members"),
        "{err}"
    );
    let err = ScalaAfa::recover_without(config, scala, members(), vec![], &[1, 1]).unwrap_err();
    assert!(err.to_string().contains("named twice"), "{err}");
}

/// Found by `power_loss_inside_a_request_loses_no_acknowledged_write`: with m = 2 the power
/// cut the first write after its primary and one backup, and recovery refused the volume
/// ("no backups on member 0") where it must drop the chunk the write never acknowledged.
#[test]
fn a_chunk_missing_a_backup_is_dropped_not_refused() {
    let s = crash_inside_a_request(
        Level::Raid6,
        6,
        98,
        2,
        afa_nand::PayloadMode::Token,
        with_mode(ScalaMode::Scalaafa),
    );
    assert_eq!(s.recovery_torn_chunks, 1, "{s:?}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(afa_sim::proptest_cases(12)))]
    #[test]
    fn power_loss_at_random_member_commands(
        seed in any::<u64>(),
        raid6 in any::<bool>(),
        budget in 0u64..6000,
        host_conversion in any::<bool>(),
        threads in 1u32..=3,
        checkpoint_ms in prop_oneof![Just(0.0), 0.5f64..10.0],
        lost_count in 0usize..=2,
        lost_at in (0usize..6, 0usize..5),
        in_place in any::<bool>(),
    ) {
        let (level, n) = if raid6 { (Level::Raid6, 6) } else { (Level::Raid5, 4) };
        let (mut scala, payload) = random_scala(host_conversion, threads, checkpoint_ms);
        if in_place {
            scala.sub_chunk_writes = SubChunkWrites::InPlace;
        }
        // Up to m distinct members lost with the power.
        let n = n as usize;
        let first = lost_at.0 % n;
        let lost = [first, (first + 1 + lost_at.1 % (n - 1)) % n];
        let lost = &lost[..lost_count.min(if raid6 { 2 } else { 1 })];
        crash_inside_a_request_losing(level, n as u32, seed, budget, payload, scala, lost);
    }
}

/// With m = 2 the power can cut a conversion between the two parity members: one holds the
/// stripe's parity and its VH was trimmed, the other still holds the backups. A recovery
/// from a checkpoint taken while the stripe was full used to bind both VHs the checkpoint
/// named, so the stripe stayed replicated with a trimmed backup (its copies disagreed, and a
/// read from that backup after a failure would return zeroes); it is now half converted,
/// as a full scan finds it. Cases the property test above found when run with twenty times
/// its cases (RAID 6, host conversion, two I/O threads, checkpoints every 0.5 ms).
#[test]
fn a_conversion_cut_between_parity_members_after_a_checkpoint_is_found_half_converted() {
    for budget in [2452, 2460, 2480] {
        let (scala, payload) = random_scala(true, 2, 0.5);
        let s = crash_inside_a_request_losing(
            Level::Raid6,
            6,
            14_895_836_644_352_147_225,
            budget,
            payload,
            scala,
            &[],
        );
        assert!(s.recovered_checkpoint_seq.is_some(), "{s:?}");
    }
}

/// §5.4: recovery starts from the newest checkpoint and reads only the OOB areas of the
/// heroes a write could have reached since, and loses nothing.
#[test]
fn recovery_from_a_checkpoint_reads_fewer_oob_areas_and_loses_nothing() {
    for (level, n) in [(Level::Raid5, 5), (Level::Raid6, 6)] {
        let scan = crash_and_recover_checkpointed(level, n, 7, 2500, 0.0, false, 1);
        let from_checkpoint = crash_and_recover_checkpointed(level, n, 7, 2500, 2.0, false, 1);
        assert!(scan.recovered_checkpoint_seq.is_none());
        assert!(
            from_checkpoint.recovered_checkpoint_seq.is_some(),
            "{from_checkpoint:?}"
        );
        assert!(
            from_checkpoint.recovery_tag_reads * 2 < scan.recovery_tag_reads,
            "{} OOB areas read from the checkpoint, {} by a full scan",
            from_checkpoint.recovery_tag_reads,
            scan.recovery_tag_reads
        );
    }
}

/// A checkpoint cut short by the power loss is not used; the one before it is, and the
/// heroes freed since that one were not handed out again, so nothing is lost.
#[test]
fn a_torn_checkpoint_falls_back_to_the_one_before() {
    for (level, n) in [(Level::Raid5, 5), (Level::Raid6, 6)] {
        for crash_after in [300, 1500, 2500] {
            let s = crash_and_recover_checkpointed(
                level,
                n,
                11 + crash_after as u64,
                crash_after,
                2.0,
                true,
                2,
            );
            assert!(s.recovered_checkpoint_seq.is_some(), "{s:?}");
        }
    }
}

/// A recovery that lost a member cannot use the checkpoints (it scans everything), but the
/// checkpoint it writes must still come after the newest one on the members: a later
/// recovery that prefers an older checkpoint would miss what was written since.
#[test]
fn a_degraded_recovery_numbers_its_checkpoint_after_the_newest() {
    let full = afa_nand::PayloadMode::Full;
    let scala = ScalaAfaConfig {
        checkpoint_interval_ms: 2.0,
        ..ScalaAfaConfig::default()
    };
    let mut h = Harness::new(engine_keeping(full, Level::Raid5, 5, 0, scala));
    let mut rng = SimRng::new(23);
    writes_and_reads(&mut h, &mut rng, 1500);
    let newest = h.volume.checkpoints.next_seq - 1;
    let (config, scala) = (h.volume.config.clone(), h.volume.scala.clone());
    let (tokens, now_ns) = (h.tokens.clone(), h.now_ns);
    let mut members = h.volume.into_members();
    members[2] = ssd_keeping(full, 500);
    let spares = vec![ssd_keeping(full, 900)];
    let v = ScalaAfa::recover_degraded(config.clone(), scala.clone(), members, spares, 2)
        .expect("recovery");
    assert_eq!(v.stats().recovered_checkpoint_seq, None);
    assert!(
        v.checkpoints.next_seq >= newest + 2,
        "its own checkpoint must come after {newest}"
    );
    let mut h = Harness::new(v);
    h.tokens = tokens;
    h.now_ns = now_ns;
    writes_and_reads(&mut h, &mut rng, 800);
    let (tokens, now_ns) = (h.tokens.clone(), h.now_ns);
    let members = h.volume.into_members();
    let v = ScalaAfa::recover(config, scala, members, vec![]).expect("recovery");
    assert!(
        v.stats()
            .recovered_checkpoint_seq
            .is_some_and(|s| s > newest),
        "{:?}",
        v.stats()
    );
    let mut h = Harness::new(v);
    h.tokens = tokens;
    h.now_ns = now_ns;
    h.check_all();
}

#[test]
fn checkpoints_need_a_sane_interval() {
    let scala = ScalaAfaConfig {
        checkpoint_interval_ms: -1.0,
        ..ScalaAfaConfig::default()
    };
    let config = ArrayConfig {
        level: Level::Raid5,
        members: 4,
        chunk_bytes: 8 * 1024,
        ..ArrayConfig::default()
    };
    let devs = (0..4)
        .map(|i| ssd_keeping(afa_nand::PayloadMode::Full, i))
        .collect();
    let err = ScalaAfa::new(config, scala, devs, vec![])
        .unwrap_err()
        .to_string();
    assert!(err.contains("checkpoint_interval_ms"), "{err}");
}

/// Found by a configuration soak (4 KiB chunks on small SSDs, a checkpoint every 5 ms): the
/// checkpoint slots are sized for the largest tables a member could hold, so with tiny
/// chunks one checkpoint is some 200 KiB per member and takes longer to write than its
/// interval. Once the host went idle, each checkpoint's member writes woke the daemon again
/// when they completed, by which time the next checkpoint was due, so the daemon rewrote
/// the same unchanged tables forever and the run never ended. An idle volume must instead
/// settle: after its tables are saved once, the host's idle loop (call `background`, sleep
/// until the time it names) has to come to an end.
#[test]
fn an_idle_volume_stops_checkpointing_once_its_tables_are_saved() {
    let mut ssd_cfg = crate::tests::ssd_config();
    ssd_cfg.geometry = afa_nand::Geometry {
        channels: 2,
        chips_per_channel: 1,
        dies_per_chip: 2,
        planes_per_die: 2,
        blocks_per_plane: 16,
        pages_per_block: 48,
        page_bytes: 8192,
        sector_bytes: 512,
        oob_bytes_per_page: 64,
    };
    ssd_cfg.over_provisioning = 0.661;
    let config = ArrayConfig {
        level: Level::Raid5,
        members: 4,
        chunk_bytes: 4096,
        ..ArrayConfig::default()
    };
    let scala = ScalaAfaConfig {
        checkpoint_interval_ms: 5.0,
        ..ScalaAfaConfig::default()
    };
    let devs = (0..4)
        .map(|i| Ssd::new(ssd_cfg.clone(), i).unwrap())
        .collect();
    let mut h = Harness::new(ScalaAfa::new(config, scala, devs, vec![]).unwrap());
    let mut rng = SimRng::new(1);
    let cap = h.tokens.len() as u64;
    for _ in 0..192 {
        h.write(rng.below(cap), 1).unwrap();
    }
    // The host's idle loop. Bounded, so that a volume that never settles fails the test
    // instead of hanging it; a settling volume needs a handful of wake-ups.
    let start = h.now_ns;
    let mut wakeups = 0;
    while let Some(next) = h.volume.background(h.now_ns) {
        wakeups += 1;
        assert!(
            wakeups < 10_000,
            "still busy {} ms after going idle, {} checkpoints written",
            (h.now_ns - start) / 1_000_000,
            h.volume.stats().checkpoints
        );
        h.now_ns = next.max(h.now_ns + 1);
    }
    // Whatever the idle time did, the data is still there.
    h.check_all();
}

/// A checkpoint that takes longer than its interval does not make the next one due at
/// once: the interval runs from the end of the last checkpoint, so the members get that
/// long for user writes between two checkpoints (config soak seed 15971).
#[test]
fn checkpoints_wait_an_interval_after_the_last_one_ends() {
    let interval_ns = 1_000_000;
    let scala = ScalaAfaConfig {
        checkpoint_interval_ms: interval_ns as f64 / 1e6,
        ..ScalaAfaConfig::default()
    };
    let mut h = Harness::new(engine(Level::Raid5, 4, 0, scala));
    let mut rng = SimRng::new(3);
    let cap = h.tokens.len() as u64;
    for _ in 0..64 {
        h.write(rng.below(cap), 1).unwrap();
    }
    let start = h.now_ns;
    let done = h.volume.checkpoint(start).unwrap();
    assert!(
        done - start > interval_ns,
        "the test needs a checkpoint slower than its interval: {} ns",
        done - start
    );
    // The tables change, so the next checkpoint is not skipped as unchanged.
    h.write(rng.below(cap), 1).unwrap();
    let written = h.volume.stats().checkpoints;
    h.volume.checkpoint_if_due(start + interval_ns).unwrap();
    assert_eq!(
        h.volume.stats().checkpoints,
        written,
        "due before the last one ended"
    );
    h.volume.checkpoint_if_due(done + interval_ns).unwrap();
    assert_eq!(h.volume.stats().checkpoints, written + 1);
}

/// Found by the property test below: an array-level clean inside a clean (the GC writer
/// asking for heroes) moved the rest of the outer clean's victim and its row was handed out
/// again, and the outer clean then copied the new contents of that row as its chunks.
#[test]
fn a_clean_inside_a_clean_never_copies_a_reused_row() {
    crash_and_recover(Level::Raid6, 6, 14554579755642887789, 1103);
}

/// Found by the property test below: a hero group whose only written slot was on the lost
/// member leaves its chunk in backups no surviving primary points to (an orphan), which
/// recovery must write again.
#[test]
fn recovery_with_a_failed_member_rewrites_orphaned_backups() {
    crash_and_recover_degraded(Level::Raid5, 4, 1055491651208405091, 1178, false);
}

#[test]
fn recovery_with_a_failed_member_loses_no_acknowledged_write() {
    for (level, n) in [(Level::Raid5, 5), (Level::Raid6, 6), (Level::Raid5, 3)] {
        for crash_after in [0, 1, 7, 150, 900, 2500] {
            let seed = 60 + crash_after as u64 + n as u64;
            crash_and_recover_degraded(level, n, seed, crash_after, crash_after % 2 == 1);
        }
    }
}

#[test]
fn recovery_after_power_loss_loses_no_acknowledged_write() {
    for (level, n) in [(Level::Raid5, 5), (Level::Raid6, 6)] {
        for crash_after in [0, 1, 7, 150, 900, 2500] {
            crash_and_recover(level, n, 40 + crash_after as u64, crash_after);
        }
    }
}

/// The engine configuration and member payload of the power-loss property tests: in-SSD or
/// host conversion, I/O threads, and checkpoints (0: none), which keep their bytes only on
/// members that keep whole sectors.
fn random_scala(
    host_conversion: bool,
    threads: u32,
    checkpoint_ms: f64,
) -> (ScalaAfaConfig, afa_nand::PayloadMode) {
    let mode = if host_conversion {
        ScalaMode::ScalaCo
    } else {
        ScalaMode::Scalaafa
    };
    let scala = ScalaAfaConfig {
        mode,
        io_threads: threads,
        checkpoint_interval_ms: checkpoint_ms,
        ..ScalaAfaConfig::default()
    };
    let payload = if checkpoint_ms > 0.0 {
        afa_nand::PayloadMode::Full
    } else {
        afa_nand::PayloadMode::Token
    };
    (scala, payload)
}

/// A checkpoint whose write reached the medium names copies whose data did not: recovery
/// after a host crash scans every OOB area instead of trusting it (cases the property test
/// below found).
#[test]
fn a_host_crash_does_not_trust_a_checkpoint() {
    let full = afa_nand::PayloadMode::Full;
    for (seed, threads, interval_ms, before, after) in [
        (13131311752833882961, 1, 0.5, 180, 32),
        (14567323905509029903, 2, 0.9114854225525242, 185, 95),
    ] {
        let scala = ScalaAfaConfig {
            io_threads: threads,
            checkpoint_interval_ms: interval_ms,
            ..ScalaAfaConfig::default()
        };
        let stats =
            host_crash_and_recover(Level::Raid5, 4, seed, before, after, scala, full, &[], 0);
        assert_eq!(stats.recovered_checkpoint_seq, None);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(afa_sim::proptest_cases(8)))]
    #[test]
    fn a_host_crash_at_random_points_keeps_every_flushed_write(
        seed in any::<u64>(),
        raid6 in any::<bool>(),
        host_conversion in any::<bool>(),
        threads in 1u32..=3,
        checkpoint_ms in prop_oneof![Just(0.0), 0.5f64..10.0],
        before in 0usize..3000,
        after in 1usize..600,
    ) {
        let (level, n) = if raid6 { (Level::Raid6, 6) } else { (Level::Raid5, 4) };
        let (scala, payload) = random_scala(host_conversion, threads, checkpoint_ms);
        host_crash_and_recover(level, n, seed, before, after, scala, payload, &[], 0);
    }

    #[test]
    fn recovery_at_random_points(seed in any::<u64>(), raid6 in any::<bool>(), crash_after in 0usize..3000) {
        let (level, n) = if raid6 { (Level::Raid6, 6) } else { (Level::Raid5, 4) };
        crash_and_recover(level, n, seed, crash_after);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(afa_sim::proptest_cases(8)))]
    #[test]
    fn recovery_from_checkpoints_at_random_points(
        seed in any::<u64>(),
        raid6 in any::<bool>(),
        crash_after in 0usize..3000,
        interval_ms in 0.5f64..20.0,
        tear_newest in any::<bool>(),
        threads in 1u32..=3,
    ) {
        let (level, n) = if raid6 { (Level::Raid6, 6) } else { (Level::Raid5, 4) };
        crash_and_recover_checkpointed(level, n, seed, crash_after, interval_ms, tear_newest, threads);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(afa_sim::proptest_cases(8)))]
    #[test]
    fn recovery_with_a_failed_member_at_random_points(
        seed in any::<u64>(),
        raid6 in any::<bool>(),
        crash_after in 0usize..3000,
        spare in any::<bool>(),
    ) {
        let (level, n) = if raid6 { (Level::Raid6, 6) } else { (Level::Raid5, 4) };
        crash_and_recover_degraded(level, n, seed, crash_after, spare);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(afa_sim::proptest_cases(10)))]
    #[test]
    fn matches_the_oracle(
        seed in any::<u64>(),
        raid6 in any::<bool>(),
        mode in 0u8..3,
        threads in 1u32..4,
        fail_at in 0usize..2500,
        spare in any::<bool>(),
    ) {
        let (level, n) = if raid6 { (Level::Raid6, 6) } else { (Level::Raid5, 4) };
        let mode = [ScalaMode::Scalaafa, ScalaMode::ScalaCo, ScalaMode::ScalaWr][mode as usize];
        let scala = ScalaAfaConfig { mode, io_threads: threads, ..ScalaAfaConfig::default() };
        let mut h = Harness::new(engine(level, n, spare as usize, scala));
        let cap = h.tokens.len() as u64;
        prop_assert_eq!(h.check_allocation(), Some(cap), "a new volume is all holes");
        let mut rng = SimRng::new(seed);
        h.random_ops(&mut rng, fail_at);
        let victim = (seed % n as u64) as usize;
        h.volume.fail_member(victim, h.now_ns).unwrap();
        h.random_ops(&mut rng, 2500 - fail_at);
        h.check_all();
        let holes = h.check_allocation().expect("ScalaAFA knows its allocation");
        prop_assert!(holes < cap);
        prop_assert!(h.checked > 0);
    }
}

/// Stray writes onto the members after a power loss (a controller bug, a bad sector read
/// back as other bytes): chunks of random bytes with random OOB tags. What recovery reads
/// from the OOB areas is then not what the engine wrote; it must end in an error, or in a
/// volume that answers every read and takes new writes, never in a panic. Nothing is
/// checked against the oracle: the medium lied.
fn recover_after_stray_writes(seed: u64, raid6: bool, crash_after: usize, strays: usize) {
    let (level, n) = if raid6 {
        (Level::Raid6, 6)
    } else {
        (Level::Raid5, 4)
    };
    let mut h = Harness::new(engine(level, n, 0, with_mode(ScalaMode::Scalaafa)));
    let mut rng = SimRng::new(seed);
    writes_and_reads(&mut h, &mut rng, crash_after);
    let (config, scala) = (h.volume.config.clone(), h.volume.scala.clone());
    let (cs, unit, now_ns) = (h.volume.chunk_sectors(), h.volume.unit, h.now_ns);
    let mut members = h.volume.into_members();
    for _ in 0..strays {
        let d = &mut members[rng.below(n as u64) as usize];
        let info = d.info();
        let sectors = 1 + rng.below(cs as u64) as u32;
        let lba = rng.below(info.capacity_sectors - sectors as u64);
        let noise = |rng: &mut SimRng, len: usize| -> Vec<u8> {
            (0..len).map(|_| rng.next_u64() as u8).collect()
        };
        let data = noise(&mut rng, sectors as usize * unit);
        let tags = noise(
            &mut rng,
            sectors as usize * info.tag_bytes_per_sector as usize,
        );
        let stray = Command {
            tags: Some(&tags),
            ..Command::write(lba, sectors, &data)
        };
        d.submit(now_ns, &stray, ReadBuffers::none()).unwrap();
    }
    let Ok(mut v) = ScalaAfa::recover(config, scala, members, vec![]) else {
        return;
    };
    let capacity = v.info().capacity_sectors;
    let mut out = vec![0u8; cs as usize * unit];
    let mut t = now_ns;
    for lba in (0..capacity).step_by(cs as usize) {
        t += 1_000;
        let _ = v.submit(
            t,
            &Command::read(lba, cs),
            ReadBuffers {
                data: &mut out,
                tags: None,
            },
        );
    }
    let data = vec![0x33u8; cs as usize * unit];
    let _ = v.submit(t, &Command::write(0, cs, &data), ReadBuffers::none());
    v.background(t + 1_000_000_000);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(afa_sim::proptest_cases(16)))]
    #[test]
    fn recovery_from_members_with_stray_writes_never_panics(
        seed in any::<u64>(),
        raid6 in any::<bool>(),
        crash_after in 0usize..1500,
        strays in 1usize..40,
    ) {
        recover_after_stray_writes(seed, raid6, crash_after, strays);
    }
}

/// The prototype's in-place path: a write smaller than a chunk goes into the chunk's own
/// slot while its stripe is replicated, so fewer member sectors are written than by
/// merging, and nothing is lost through conversion (whose parity is computed from the
/// updated backups), array-level GC, degraded reads and a rebuild.
fn in_place_run(level: Level, n: u32, mode: ScalaMode, threads: u32, seed: u64, fail: bool) {
    let m = if level == Level::Raid6 { 2 } else { 1 };
    let scala = ScalaAfaConfig {
        mode,
        io_threads: threads,
        spare_fraction: 0.03,
        sub_chunk_writes: SubChunkWrites::InPlace,
        ..ScalaAfaConfig::default()
    };
    let mut h = Harness::new(engine(level, n, if fail { m } else { 0 }, scala));
    let mut rng = SimRng::new(seed);
    let cap = h.tokens.len() as u64;
    while h.volume.stats().user_write_sectors < cap * 2 {
        h.random_ops(&mut rng, 100);
    }
    if fail {
        let now = h.now_ns;
        h.volume.fail_member(1, now).unwrap();
        h.random_ops(&mut rng, 300);
        h.check_all();
        h.now_ns += 1_000_000_000_000;
        h.volume.background(h.now_ns);
        assert!(!h.volume.rebuilding(), "{level:?}");
        h.random_ops(&mut rng, 300);
    }
    let s = *h.volume.stats();
    assert!(s.in_place_writes > 0 && s.stripes_converted > 0, "{s:?}");
    h.check_all();
}

#[test]
fn in_place_sub_chunk_writes_write_fewer_sectors_than_merging() {
    let run = |sub_chunk_writes| {
        let scala = ScalaAfaConfig {
            sub_chunk_writes,
            // The test SSD is small: a larger transient area gives 32 KiB chunks VHs.
            transient_fraction: 0.3,
            ..ScalaAfaConfig::default()
        };
        // 32 KiB chunks: eight sectors, so a one-sector write merged costs eight per copy.
        let mut config = array_config(Level::Raid5, 5);
        config.chunk_bytes = 32 * 1024;
        let devs = (0..5).map(ssd).collect();
        let mut h = Harness::new(ScalaAfa::new(config, scala, devs, Vec::new()).unwrap());
        let mut rng = SimRng::new(21);
        // One-sector writes over 64 chunks, so most land in a chunk still replicated.
        let mut written = std::collections::BTreeSet::new();
        let mut fresh_off_row_0 = 0;
        for _ in 0..400 {
            let lba = rng.below(64 * 8);
            if written.insert(lba / 8) && lba % 8 != 0 {
                fresh_off_row_0 += 1;
            }
            h.write(lba, 1).expect("write accepted");
        }
        h.check_all();
        (*h.volume.stats(), fresh_off_row_0)
    };
    let ((merged, _), (in_place, fresh_off_row_0)) =
        (run(SubChunkWrites::Merge), run(SubChunkWrites::InPlace));
    // A merge writes the whole chunk on each of the two copies. The in-place run uses one
    // slot per chunk and converts nothing in so short a run, so each of its writes puts
    // the one sector on each copy, and a chunk's first write its first sector too (the
    // one that names the copy) when it does not cover it.
    assert_eq!(in_place.stripes_converted, 0, "{in_place:?}");
    assert_eq!(merged.in_place_writes, 0, "{merged:?}");
    assert_eq!(merged.chunks_written, 400, "{merged:?}");
    assert_eq!(merged.member_write_sectors, 400 * 2 * 8, "{merged:?}");
    assert_eq!(in_place.in_place_writes, 400, "{in_place:?}");
    assert_eq!(
        in_place.chunks_written, 64,
        "one fresh slot per chunk: {in_place:?}"
    );
    assert!(fresh_off_row_0 > 0);
    assert_eq!(
        in_place.member_write_sectors,
        (400 + fresh_off_row_0) * 2,
        "{in_place:?}"
    );
}

/// A host crash over volatile caches may keep an in-place update's tags without its data,
/// and the update overwrote the flushed copy of those sectors: recovery after one refuses
/// the option, as the threads of serve mode do (they have no in-place path).
#[test]
fn in_place_sub_chunk_writes_are_refused_after_a_host_crash_and_on_threads() {
    let scala = ScalaAfaConfig {
        sub_chunk_writes: SubChunkWrites::InPlace,
        ..ScalaAfaConfig::default()
    };
    let config = array_config(Level::Raid5, 5);
    let devs = (0..5).map(ssd).collect();
    let Err(err) = ScalaAfa::recover_with(config, scala.clone(), devs, Vec::new(), &[], true)
    else {
        panic!("host-crash recovery of an in-place volume was not refused");
    };
    assert!(err.to_string().contains("sub_chunk_writes"), "{err}");
    let v = engine(Level::Raid5, 5, 0, scala);
    let Err((_, why)) = v.into_threads() else {
        panic!("threads for an in-place volume were not refused");
    };
    assert!(why.contains("in-place"), "{why}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(afa_sim::proptest_cases(6)))]
    #[test]
    fn in_place_sub_chunk_writes_lose_nothing(
        seed in any::<u64>(),
        raid6 in any::<bool>(),
        mode in prop_oneof![
            Just(ScalaMode::Scalaafa),
            Just(ScalaMode::ScalaCo),
            Just(ScalaMode::ScalaWr)
        ],
        threads in 1u32..=3,
        fail in any::<bool>(),
    ) {
        let (level, n) = if raid6 { (Level::Raid6, 6) } else { (Level::Raid5, 5) };
        in_place_run(level, n, mode, threads, seed, fail);
    }
}

#[test]
fn in_place_sub_chunk_writes_keep_data_on_every_shape() {
    for (level, n) in SHAPES {
        in_place_run(level, n, ScalaMode::Scalaafa, 1, 7 + n as u64, false);
    }
    in_place_run(Level::Raid6, 6, ScalaMode::Scalaafa, 2, 9, true);
}

fn in_place(mode: ScalaMode) -> ScalaAfaConfig {
    ScalaAfaConfig {
        sub_chunk_writes: SubChunkWrites::InPlace,
        ..with_mode(mode)
    }
}

/// Power lost at member commands among in-place updates, conversions and cleanings: every
/// acknowledged write survives, the update the cut tore reads back old or new in each
/// sector, and recovery leaves the copies of every replicated slot agreeing (checked
/// directly, and by reading a failed member's chunks from replicas and parity).
#[test]
fn power_loss_inside_an_in_place_update_leaves_its_copies_agreeing() {
    let token = afa_nand::PayloadMode::Token;
    let scalaafa = in_place(ScalaMode::Scalaafa);
    // Cuts a sweep over every member command of these runs found inside an update of a
    // replicated chunk: on 4+2 after its primary (both backups then differ from it) and
    // after its first backup (one does), and on 4+1 and 2+1 after its primary.
    for (level, n, seed, budget, resynced) in [
        (Level::Raid6, 6, 7, 521, 2),
        (Level::Raid6, 6, 7, 522, 1),
        (Level::Raid6, 6, 7, 736, 2),
        (Level::Raid6, 6, 7, 737, 1),
        (Level::Raid5, 5, 2786, 2591, 1),
        (Level::Raid5, 3, 2081, 1888, 1),
    ] {
        let s = crash_inside_a_request(level, n, seed, budget, token, scalaafa.clone());
        assert_eq!(
            s.recovery_resynced_copies, resynced,
            "{level:?} {budget}: {s:?}"
        );
    }
    // Cuts elsewhere: in conversions (in the SSDs and on the host), cleanings, fresh slots.
    for (level, n) in SHAPES {
        for mode in [ScalaMode::Scalaafa, ScalaMode::ScalaCo] {
            for budget in [1, 2, 3, 5, 40, 333, 1200, 4000] {
                let seed = 190 + budget + n as u64;
                crash_inside_a_request(level, n, seed, budget, token, in_place(mode));
            }
        }
    }
}

/// The same with a member lost in the power cut: a lost primary's backups serve, and agree
/// with each other once recovered (m = 2: the cuts after an update's primary and after its
/// first backup, with each member lost in turn).
#[test]
fn power_loss_inside_an_in_place_update_with_a_lost_member_loses_nothing() {
    let token = afa_nand::PayloadMode::Token;
    let scalaafa = in_place(ScalaMode::Scalaafa);
    for budget in [521, 522, 1763] {
        for lost in 0..6 {
            crash_inside_a_request_losing(
                Level::Raid6,
                6,
                7,
                budget,
                token,
                scalaafa.clone(),
                &[lost],
            );
        }
    }
    for budget in [3, 40, 700] {
        for lost in 0..4 {
            crash_inside_a_request_losing(
                Level::Raid5,
                4,
                7 + budget,
                budget,
                token,
                scalaafa.clone(),
                &[lost],
            );
        }
    }
}

/// An in-place volume recovers from its newest checkpoint too: in-place updates move no
/// chunk, so what the checkpoint names stays where it was.
#[test]
fn power_loss_on_a_checkpointed_in_place_volume_loses_nothing() {
    for (level, n) in SHAPES {
        let scala = ScalaAfaConfig {
            checkpoint_interval_ms: 2.0,
            ..in_place(ScalaMode::Scalaafa)
        };
        let volume = engine_keeping(afa_nand::PayloadMode::Full, level, n, 0, scala);
        let stats = crash_and_recover_volume(volume, 31 + n as u64, 2500, false);
        assert!(stats.recovered_checkpoint_seq.is_some(), "{stats:?}");
    }
}

/// A case `a_host_crash_at_random_points_keeps_every_flushed_write` drew on CI: after a
/// host crash, recovery and a member failure on 4+2, a user write ran the manager, whose
/// clean asked for heroes for the GC writer, whose grant cleaned again; the inner GC writer
/// could never be answered (the outer grant held its ask) and its `NoSpace` failed the user
/// write, while converting and flushing would have made room. The clean now ends there.
#[test]
fn a_clean_nested_in_the_gc_writers_own_grant_does_not_fail_the_user_write() {
    let (scala, payload) = random_scala(false, 2, 0.0);
    host_crash_and_recover(
        Level::Raid6,
        6,
        12311496768200926796,
        1904,
        95,
        scala,
        payload,
        &[],
        0,
    );
}

/// A conversion issued while a member is rebuilt keeps its backups (a host crash could
/// otherwise keep their trim and lose the parity); when the rebuild ends before the
/// conversion does, the VHs still hold those backups and must be trimmed before a group
/// takes one. Before, they went back to the manager untrimmed, a group that took one wrote
/// some of its slots over them, and the recovery after a clean stop read the rest as the old
/// stripe's backups, took that stripe for half replicated and dropped one of its chunks as
/// torn (found by a serve-mode soak: a flushed write read back as zeroes after a restart).
/// Half of these seeds handed out such a VH; `assert_vhs_trimmed` names it at once in debug
/// builds, and the free VHs are checked here at the end.
#[test]
fn vhs_a_conversion_kept_during_a_rebuild_are_trimmed_before_reuse() {
    for seed in 0..8 {
        served_through_rebuilds(Level::Raid5, 5, &[(1, 40_000_000)], seed);
    }
}

/// A replacement whose rebuild has passed a row but not yet reached its VH cannot convert
/// that row in its SSD (it lacks the backups), and the rebuild does not come back to the
/// row: the daemon writes that parity row from the primaries. Before, the row was marked
/// missing and stayed so; after a clean stop the recovery found the parity blank on the
/// replacement, took the stripe for neither replicated nor striped and dropped its chunks
/// as torn (found by the serve-mode soak on RAID 6 with two members rebuilt in turn).
#[test]
fn a_row_a_rebuild_has_passed_gets_its_parity_when_its_stripe_converts() {
    // Seeds 8 and 12 lost chunks before the change.
    for seed in 0..16 {
        served_through_rebuilds(Level::Raid6, 6, &[(1, 30_000_000), (3, 60_000_000)], seed);
    }
}

/// A replacement takes the writes of groups opened before it came in, though it serves
/// neither their rows nor their VHs until its rebuild gets there. A conversion that found
/// it so marked its parity row missing and left those backups in the VH, which the next
/// group to take the VH then held as its own; the conversion now trims them. Found by the
/// config soak (`afa run`, RAID 6 with a spare) through `assert_vhs_trimmed`.
#[test]
fn backups_a_replacement_took_before_its_rebuild_reached_them_are_trimmed() {
    let config = ArrayConfig {
        // A rebuild unit takes 1.3 s: the test is over long before it reaches the group.
        rebuild_mb_s: 0.05,
        ..array_config(Level::Raid5, 5)
    };
    let scala = with_mode(ScalaMode::Scalaafa);
    let volume = ScalaAfa::new(config, scala, (0..5).map(ssd).collect(), vec![ssd(100)]).unwrap();
    let mut h = Harness::new(volume);
    let (k, cs) = (h.volume.k as u64, h.volume.chunk_sectors);
    // Whole chunks in order, until a group past the first rows has its first slot.
    let mut chunk = 0;
    let stripe = loop {
        h.write(chunk * cs as u64, cs).unwrap();
        chunk += 1;
        if let Some(stripe) = h.volume.open[0] {
            if stripe >= 2 && h.volume.stripes[stripe as usize].filled == 1 {
                break stripe;
            }
        }
    };
    let p = h.volume.parity_member(stripe, 0);
    let vh = h.volume.stripes[stripe as usize].vhs[0];
    h.volume.fail_member(p, h.now_ns).unwrap();
    for _ in 1..k {
        h.write(chunk * cs as u64, cs).unwrap();
        chunk += 1;
    }
    assert!(!h.volume.serves_vh(p, vh) && !h.volume.serves_row(p, stripe));
    let vh_tags = |h: &Harness<ScalaAfa<Ssd>>| {
        let lba = h.volume.vh_lba(vh, 0);
        (h.volume.members[p].device)
            .scan_tags(lba, k as u32 * cs)
            .unwrap()
    };
    assert!(
        vh_tags(&h).iter().any(|&b| b != 0),
        "the replacement took backups"
    );
    // Idle: the full group converts, and its VHs go back to the manager.
    while h.volume.stripes[stripe as usize].state != HhState::Striped {
        h.now_ns += 100_000;
        h.volume.background(h.now_ns);
    }
    assert!(h.volume.rebuilding());
    assert!(vh_tags(&h).iter().all(|&b| b == 0), "VH {vh} of member {p}");
    h.check_all();
}

/// A volume served as `afa serve --state` serves one (members behind a page cache, so
/// `keep_flushed_writes`), losing `failures` (member, time) onto spares rebuilt at 50 MB/s
/// while requests and idle time alternate: the free VHs are trimmed at the end, and a
/// recovery after the last flush gives back every write.
fn served_through_rebuilds(level: Level, n: u32, failures: &[(usize, TimeNs)], seed: u64) {
    let config = ArrayConfig {
        chunk_bytes: 64 * 1024,
        rebuild_mb_s: 50.0,
        ..array_config(level, n)
    };
    let scala = ScalaAfaConfig {
        transient_bytes: 2 << 20,
        ..ScalaAfaConfig::default()
    };
    let mut cfg = scala_ssd_config(afa_nand::PayloadMode::Token);
    cfg.geometry.blocks_per_plane = 64;
    cfg.geometry.pages_per_block = 64;
    cfg.over_provisioning = 0.25;
    let ssd = |i: u64| Ssd::new(cfg.clone(), i).unwrap();
    let spares = (0..failures.len() as u64).map(|i| ssd(100 + i)).collect();
    let mut v = ScalaAfa::new(config, scala, (0..n as u64).map(ssd).collect(), spares).unwrap();
    v.keep_flushed_writes();
    for &(member, at_ns) in failures {
        v.schedule_failure(member, at_ns).unwrap();
    }
    let mut h = Harness::new(v);
    let flush = |h: &mut Harness<ScalaAfa<Ssd>>| {
        let now_ns = h.now_ns;
        (h.volume)
            .submit(now_ns, &Command::flush(), ReadBuffers::none())
            .unwrap();
    };
    let mut rng = SimRng::new(seed);
    let cap = h.tokens.len() as u64;
    let hot = if rng.below(2) == 0 { cap } else { cap / 16 };
    // Idle often (full groups convert at once) or seldom (they wait, and a rebuild can
    // overtake them).
    let idle_one_in = [3, 30][rng.below(2) as usize];
    let mut now_ns = 0;
    for _ in 0..rng.below(600) + 50 {
        // Requests and idle time as a served volume sees them: conversions start when the
        // host is idle.
        now_ns += rng.below(200_000);
        h.now_ns = h.now_ns.max(now_ns);
        if rng.below(idle_one_in) == 0 {
            h.volume.background(h.now_ns);
        }
        let len = [1, 1, 2, 4, 16][rng.below(5) as usize];
        let lba = rng.below(hot - len as u64);
        match rng.below(10) {
            0..=6 => h.write(lba, len).unwrap(),
            7 => flush(&mut h),
            _ => h.read_check(lba, len),
        }
    }
    // Past every failure and rebuild.
    h.now_ns += 10_000_000_000;
    h.volume.background(h.now_ns);
    flush(&mut h);
    assert!(!h.volume.rebuilding(), "seed {seed}");
    let sectors = h.volume.k as u32 * h.volume.chunk_sectors;
    for p in 0..n as usize {
        for &vh in &h.volume.manager.free_vhs[p] {
            let lba = h.volume.vh_lba(vh, 0);
            let tags = h.volume.members[p].device.scan_tags(lba, sectors).unwrap();
            assert!(
                tags.iter().all(|&b| b == 0),
                "seed {seed}: free VH {vh} of member {p}"
            );
        }
    }
    let (config, scala) = (h.volume.config.clone(), h.volume.scala.clone());
    let mut h = h.after_crash(|v| {
        ScalaAfa::recover(config, scala, v.into_members(), vec![]).expect("recovery")
    });
    h.check_all();
}

/// The soak's case of hero starvation (seed 1085): with RAID 6 of six members, eight
/// threads and four VHs per member, the threads' open groups come to hold every VH of the
/// members that the free rows need.
pub(super) fn hero_starved_config() -> ScalaAfaConfig {
    ScalaAfaConfig {
        io_threads: 8,
        transient_bytes: 128 * 1024,
        spare_fraction: 0.02,
        ..ScalaAfaConfig::default()
    }
}

/// Eight threads on RAID 6 of six members with four VHs each: the free rows come to need
/// only members whose every VH sits in other threads' half-filled open groups (found by the
/// config soak). The manager seals those groups early so the write goes on; before, it
/// failed (first with `NoSpace` in plane 0, though no member was full).
#[test]
fn a_thread_whose_rows_need_vhs_held_in_open_groups_gets_them_sealed() {
    let mut h = Harness::new(engine(Level::Raid6, 6, 0, hero_starved_config()));
    assert_eq!(h.volume.vhs_per_member(), 4);
    let cap = h.tokens.len() as u64;
    let cs = h.volume.chunk_sectors();
    for round in 0..2 {
        for c in 0..cap / cs as u64 {
            h.write(c * cs as u64, cs)
                .unwrap_or_else(|e| panic!("round {round}, chunk {c}: {e}"));
        }
    }
    assert!(h.volume.stats().groups_sealed > 0, "{:?}", h.volume.stats());
    h.check_all();
}

/// The error of a thread that can assemble no hero group names who asked and what was
/// short, so that a user can tell which setting to change.
#[test]
fn the_no_hero_group_error_names_the_thread_and_the_shortage() {
    let scala = ScalaAfaConfig {
        io_threads: 3,
        ..ScalaAfaConfig::default()
    };
    let h = Harness::new(engine(Level::Raid6, 6, 0, scala));
    let DeviceError::VolumeFull(why) = h.volume.no_hero_group(1) else {
        panic!("expected VolumeFull");
    };
    assert!(why.contains("no hero group for I/O thread 1"), "{why}");
    assert!(
        why.contains("free VHs per member [") && why.contains("3 I/O threads"),
        "{why}"
    );
    let DeviceError::VolumeFull(why) = h.volume.no_hero_group(3) else {
        panic!("expected VolumeFull");
    };
    assert!(why.contains("no hero group for the GC writer"), "{why}");
}
