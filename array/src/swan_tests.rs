//! SWAN against the oracle: random reads, writes and trims through front-end moves and GC,
//! RAID 4/5 groups with a failed member, the role rules of the paper (only the front-end
//! takes writes, GC stays inside one back-end group), summaries and determinism.

use afa_nand::{fill_unit, sector_token};
use afa_sim::SimRng;
use afa_ssd::Ssd;
use proptest::prelude::*;

use super::*;
use crate::tests::{Harness, Watched};

/// The array tests' SSD with 4 KiB sectors, SWAN's blocks as in the paper: a summary lists
/// 13 bytes per block, so one block holds the summary of every segment these tests build
/// (512-byte blocks would give most of them summaries of several blocks, which tests of
/// their own cover).
fn swan_ssd_config() -> afa_ssd::SsdConfig {
    let mut config = crate::tests::ssd_config();
    config.geometry.sector_bytes = 4096;
    config
}

fn ssd(seed: u64) -> Ssd {
    Ssd::new(swan_ssd_config(), seed).unwrap()
}

/// `groups` R-groups of `width` test SSDs, 4 KiB chunks, segments of `stripes` stripes.
fn swan(level: Level, groups: u32, width: u32, stripes: u64, spare: f64) -> Swan<Ssd> {
    swan_of_blocks(level, groups, width, stripes, spare, 4096)
}

/// [`swan`] over test SSDs of `sector_bytes` sectors (SWAN's blocks).
fn swan_of_blocks(
    level: Level,
    groups: u32,
    width: u32,
    stripes: u64,
    spare: f64,
    sector_bytes: u32,
) -> Swan<Ssd> {
    let mut ssd_config = swan_ssd_config();
    ssd_config.geometry.sector_bytes = sector_bytes;
    let members = groups * width;
    let array = ArrayConfig {
        level,
        members,
        chunk_bytes: 4096,
        ..ArrayConfig::default()
    };
    let k = if level == Level::Raid0 {
        width
    } else {
        width - 1
    } as u64;
    let config = SwanConfig {
        groups,
        segment_bytes: 4096 * k * stripes,
        spare_fraction: spare,
        ..SwanConfig::default()
    };
    let devices = (0..members as u64)
        .map(|i| Ssd::new(ssd_config.clone(), i).unwrap())
        .collect();
    Swan::new(array, config, devices, Vec::new()).unwrap()
}

/// A RAID0 layout of `members` SSDs with 4 KiB chunks, the shape most tests build R-groups from.
fn raid0_4k(members: u32) -> ArrayConfig {
    ArrayConfig {
        level: Level::Raid0,
        members,
        chunk_bytes: 4096,
        ..ArrayConfig::default()
    }
}

#[test]
fn keeps_data_through_front_end_moves_and_gc() {
    for (level, groups, width) in [
        (Level::Raid0, 4, 2),
        (Level::Raid5, 3, 3),
        (Level::Raid4, 2, 3),
    ] {
        let mut h = Harness::new(swan(level, groups, width, 4, 0.3));
        let mut rng = SimRng::new(7);
        let cap = h.tokens.len() as u64;
        while h.volume.stats().user_sectors < cap * 4 {
            h.random_ops(&mut rng, 200);
            h.volume.check_invariants();
        }
        let s = h.volume.stats();
        assert!(s.segments_cleaned > 0, "{level:?}: no GC ran");
        assert!(
            s.front_end_switches >= groups as u64,
            "{level:?}: the front-end never moved"
        );
        h.check_all();
        // Every member write was a whole stripe: parity never needed a read.
        for g in h.volume.groups() {
            assert_eq!(g.stats().read_modify_writes, 0, "{level:?}");
            assert_eq!(g.stats().reconstruct_writes, 0, "{level:?}");
        }
    }
}

/// Cleaning a window at a time, with a GC stream that holds one stripe: runs wait for the
/// stream's buffer in the middle, victims are left part-cleaned when their group becomes the
/// front-end, and nothing is lost.
#[test]
fn windowed_cleaning_with_a_one_stripe_buffer_keeps_data() {
    for (level, groups, width) in [(Level::Raid0, 3, 2), (Level::Raid5, 3, 3)] {
        let members = groups * width;
        let k = if level == Level::Raid0 {
            width
        } else {
            width - 1
        } as u64;
        let array = ArrayConfig {
            level,
            members,
            chunk_bytes: 4096,
            ..ArrayConfig::default()
        };
        let config = SwanConfig {
            groups,
            segment_bytes: 4096 * k * 16,
            spare_fraction: 0.3,
            gc_read_window_blocks: 1,
            buffer_stripes: 1,
            ..SwanConfig::default()
        };
        let devices = (0..members as u64).map(ssd).collect();
        let mut h = Harness::new(Swan::new(array, config, devices, Vec::new()).unwrap());
        let mut rng = SimRng::new(31);
        let cap = h.tokens.len() as u64;
        while h.volume.stats().user_sectors < cap * 5 {
            h.random_ops(&mut rng, 200);
            h.volume.check_invariants();
        }
        h.check_all();
        let s = h.volume.stats();
        assert!(s.segments_cleaned > 0, "{level:?}: no GC ran");
        assert!(
            s.gc_append_waits > 0,
            "{level:?}: no run waited for the buffer"
        );
        assert!(
            s.gc_victims_abandoned > 0,
            "{level:?}: no victim was left part-cleaned"
        );
    }
}

#[test]
fn only_the_front_end_takes_user_writes_and_gc_stays_in_one_group() {
    let members = 8u32;
    let array = raid0_4k(members);
    let config = SwanConfig {
        groups: 4,
        segment_bytes: 4096 * 2 * 4,
        spare_fraction: 0.4,
        ..SwanConfig::default()
    };
    let devices = (0..members as u64).map(|i| Watched::new(ssd(i))).collect();
    let mut v = Swan::new(array, config, devices, Vec::new()).unwrap();
    let cap = v.info().capacity_sectors;
    let mut rng = SimRng::new(3);
    let mut now = 0u64;
    let data = vec![0u8; 2 * 8];
    // Random 2-sector writes (the oracle test covers data); between writes, check that the
    // groups' roles are exclusive: no write reaches a group that is neither the front-end
    // nor the one being cleaned, and no read reaches a group other than the one cleaned
    // (the workload writes only, so every member read is a GC read).
    let mut last: Vec<(usize, usize)> = (0..8).map(|_| (0, 0)).collect();
    while v.stats().user_sectors < cap * 3 {
        let front = v.front_end();
        let gc = v.gc_group();
        let lba = rng.below(cap - 2);
        let c = v
            .submit(now, &Command::write(lba, 2, &data), ReadBuffers::none())
            .unwrap();
        now += (c.done_ns - now) / 2 + 1;
        let (front_after, gc_after) = (v.front_end(), v.gc_group());
        for (m, dev) in v.members().enumerate() {
            let g = m / 2;
            let (w0, r0) = last[m];
            let wrote = dev.writes.len() > w0;
            let read = dev.reads.len() > r0;
            let allowed = [Some(front), gc, Some(front_after), gc_after];
            if wrote {
                assert!(
                    allowed.contains(&Some(g)),
                    "group {g} written outside its role"
                );
            }
            if read {
                assert!(
                    [gc, gc_after].contains(&Some(g)) || v.stats().foreground_gc_stalls > 0,
                    "group {g} read while not cleaned"
                );
            }
            last[m] = (dev.writes.len(), dev.reads.len());
        }
    }
    assert!(v.stats().segments_cleaned > 0);
}

/// The simulated SSDs serve commands in the order they are submitted, so a GC read
/// submitted after a GC write with a later time would wait behind that write's program and
/// cleaning would run at queue depth 1. Cleaning must issue a victim's reads before its
/// writes: on a group that is being cleaned (and takes no user writes), no read may follow a
/// write that was submitted for a later time.
#[test]
fn gc_reads_are_not_queued_behind_later_gc_writes() {
    let members = 8u32;
    let array = raid0_4k(members);
    let config = SwanConfig {
        groups: 4,
        segment_bytes: 4096 * 2 * 16,
        spare_fraction: 0.4,
        ..SwanConfig::default()
    };
    let devices = (0..members as u64).map(|i| Watched::new(ssd(i))).collect();
    let mut v = Swan::new(array, config, devices, Vec::new()).unwrap();
    let cap = v.info().capacity_sectors;
    let mut rng = SimRng::new(5);
    let mut now = 0u64;
    let data = vec![0u8; 2 * 8];
    let mut checked = 0;
    while v.stats().user_sectors < cap * 3 {
        let (front, gc) = (v.front_end(), v.gc_group());
        let before: Vec<usize> = v.members().map(|d| d.order.len()).collect();
        let lba = rng.below(cap - 2);
        let c = v
            .submit(now, &Command::write(lba, 2, &data), ReadBuffers::none())
            .unwrap();
        now += (c.done_ns - now) / 2 + 1;
        let Some(g) = gc else { continue };
        if v.gc_group() != Some(g) || front == g || v.front_end() == g {
            continue;
        }
        for (m, dev) in v.members().enumerate() {
            if m / 2 != g {
                continue;
            }
            let mut latest_write = 0;
            for &(write, t) in &dev.order[before[m]..] {
                if write {
                    latest_write = latest_write.max(t);
                } else {
                    assert!(
                        t >= latest_write,
                        "member {m}: a GC read for {t} ns was queued behind a write for \
                         {latest_write} ns"
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 100, "only {checked} GC reads were checked");
}

/// Mean latency of the user reads served by the group being cleaned, over a run of random
/// reads, writes and trims that wraps the volume three times.
fn gc_group_read_latency_ns(gc_read_window_blocks: u32) -> (u64, u64) {
    let array = raid0_4k(6);
    let config = SwanConfig {
        groups: 3,
        segment_bytes: 4096 * 2 * 64,
        spare_fraction: 0.3,
        gc_read_window_blocks,
        ..SwanConfig::default()
    };
    let devices = (0..6).map(ssd).collect();
    let mut h = Harness::new(Swan::new(array, config, devices, Vec::new()).unwrap());
    let mut rng = SimRng::new(9);
    let cap = h.tokens.len() as u64;
    while h.volume.stats().user_sectors < cap * 3 {
        h.random_ops(&mut rng, 200);
    }
    h.check_all();
    let r = h.volume.stats().reads_back_end_gc;
    (r.latency_ns_total / r.reads.max(1), r.reads)
}

/// §3.3: reads are "always given highest priority". GC keeps only a window of its reads on
/// the SSDs, so a user read in the group being cleaned queues behind that window, not behind
/// every read and write of the victim.
#[test]
fn user_reads_in_the_group_being_cleaned_wait_behind_one_window_of_gc_reads() {
    // One block of 4 KiB is one page of the test SSD.
    let (windowed_ns, windowed_reads) = gc_group_read_latency_ns(1);
    let (whole_ns, whole_reads) = gc_group_read_latency_ns(0);
    assert!(
        windowed_reads > 50 && whole_reads > 50,
        "{windowed_reads} / {whole_reads} reads"
    );
    assert!(
        windowed_ns * 2 < whole_ns,
        "reads in the group being cleaned take {windowed_ns} ns with a window of one block \
         per SSD against {whole_ns} ns with the whole victim's reads issued at once"
    );
}

#[test]
fn degraded_reads_in_a_raid5_group_lose_nothing() {
    let mut h = Harness::new(swan(Level::Raid5, 3, 3, 4, 0.3));
    let mut rng = SimRng::new(11);
    h.random_ops(&mut rng, 1500);
    let now = h.now_ns;
    // Member 4 is the second member of group 1.
    h.volume.fail_member(4, now).unwrap();
    h.check_all();
    assert!(
        h.volume.degraded_reads() > 0,
        "no read needed reconstruction"
    );
    let cap = h.tokens.len() as u64;
    while h.volume.stats().user_sectors < cap * 3 {
        h.random_ops(&mut rng, 200);
    }
    h.check_all();
}

#[test]
fn reads_are_counted_by_the_kind_of_group_that_served_them() {
    let mut h = Harness::new(swan(Level::Raid0, 3, 2, 4, 0.3));
    let mut rng = SimRng::new(5);
    let cap = h.tokens.len() as u64;
    while h.volume.stats().user_sectors < cap * 3 {
        h.random_ops(&mut rng, 200);
    }
    let s = h.volume.stats();
    let total = s.reads_front_end.reads + s.reads_back_end_idle.reads + s.reads_back_end_gc.reads;
    assert!(total > 0);
    assert!(s.reads_back_end_idle.reads > 0 && s.reads_front_end.reads > 0);
}

#[test]
fn summaries_round_trip_and_reject_corruption() {
    let entries = vec![(5, 1), (NONE, 0), (0xFF_FFFF, u64::MAX), (7, 3)];
    let block = encode_summary(42, 9, &entries, 512).unwrap();
    assert_eq!(decode_summary(&block), Some((42, 9, entries.clone())));
    let mut bad = block.clone();
    bad[30] ^= 1;
    assert_eq!(decode_summary(&bad), None);
    assert!(encode_summary(1, 1, &vec![(0, 0); 40], 512).is_none());
}

/// A trim record is written only when a trimmed block has held data, and lives while any
/// block whose newest operation it holds is not written again.
#[test]
fn a_trim_record_lives_while_a_block_it_trimmed_is_unwritten() {
    let mut v = swan(Level::Raid0, 2, 2, 2, 0.3);
    let unit = v.info().payload_unit_bytes as usize;
    let op = |v: &mut Swan<Ssd>, cmd: Command<'_>| {
        v.submit(0, &cmd, ReadBuffers::none()).unwrap();
        v.check_invariants();
    };
    let data = vec![0x5au8; 8 * unit];
    let live = |v: &Swan<Ssd>| v.trims.live_counts();
    op(&mut v, Command::trim(0, 8));
    assert_eq!(
        v.stats().trim_records_written,
        0,
        "nothing there to come back"
    );
    op(&mut v, Command::write(0, 8, &data));
    op(&mut v, Command::trim(0, 8));
    assert_eq!((v.stats().trim_records_written, live(&v)), (1, vec![8]));
    op(&mut v, Command::write(0, 4, &data[..4 * unit]));
    assert_eq!(live(&v), vec![4]);
    // Blocks 2 and 3 hold data, 4 and 5 the first trim: all four go to the second record.
    op(&mut v, Command::trim(2, 4));
    assert_eq!((v.stats().trim_records_written, live(&v)), (2, vec![2, 4]));
    op(&mut v, Command::write(2, 6, &data[..6 * unit]));
    assert!(live(&v).is_empty(), "every trimmed block was written again");
}

#[test]
fn full_segments_end_in_a_summary_of_their_blocks() {
    // The oracle tests' SSD, keeping every byte so that the summary can be read back.
    let mut cfg = ssd(0).config().clone();
    cfg.payload = afa_nand::PayloadMode::Full;
    let devices = (0..4).map(|i| Ssd::new(cfg.clone(), i).unwrap()).collect();
    let array = raid0_4k(4);
    let config = SwanConfig {
        groups: 2,
        segment_bytes: 4096 * 2 * 2,
        ..SwanConfig::default()
    };
    let mut v = Swan::new(array, config, devices, Vec::new()).unwrap();
    let seg = v.segment_sectors;
    let unit = 4096;
    let data = vec![0xabu8; unit * seg as usize];
    // One segment's worth of data blocks, written backwards.
    for i in (0..seg as u64 - 1).rev() {
        v.submit(0, &Command::write(i, 1, &data[..unit]), ReadBuffers::none())
            .unwrap();
    }
    let mut block = vec![0u8; unit];
    v.groups[0]
        .submit(
            0,
            &Command::read(seg as u64 - 1, 1),
            ReadBuffers {
                data: &mut block,
                tags: None,
            },
        )
        .unwrap();
    let (seq, segment, entries) = decode_summary(&block).expect("a valid summary");
    assert_eq!((seq, segment), (1, 0));
    let want: Vec<(u32, u64)> = (0..seg - 1).rev().zip(1..).collect();
    assert_eq!(entries, want);
}

/// A volume larger than its full segments' victim ceilings could leave every full segment
/// too full to clean: with a ceiling of one half and 20% spare, random writes ran the log out
/// of victims within eight passes, and a volume filling its usable segments wedged under
/// sequential overwrites at the default ceiling (config soak, seed 9603). The volume is now
/// capped where some full segment is always under the ceiling, and those writes complete.
#[test]
fn the_volume_is_capped_where_some_full_segment_is_always_under_the_victim_ceiling() {
    let build = |ceiling: f64| {
        let config = SwanConfig {
            groups: 2,
            segment_bytes: 4096 * 2 * 4,
            spare_fraction: 0.2,
            gc_max_victim_valid: ceiling,
            ..SwanConfig::default()
        };
        let devices = (0..4).map(ssd).collect();
        Swan::new(raid0_4k(4), config, devices, Vec::new()).unwrap()
    };
    let at_default_ceiling = build(0.95).info().capacity_sectors;
    let mut h = Harness::new(build(0.5));
    let cap = h.tokens.len() as u64;
    // 7 data blocks a segment (and its summary): a victim holds at most 3, so the volume
    // is under 4 blocks a full segment, 71% of the one at the default ceiling.
    assert!(
        cap * 4 < at_default_ceiling * 3,
        "{cap} of {at_default_ceiling}"
    );
    let mut rng = SimRng::new(3);
    for i in 0..cap * 8 {
        let lba = rng.below(cap);
        if let Err(e) = h.write(lba, 1) {
            panic!("write {i} of {}: {e}", cap * 8);
        }
    }
    h.check_all();
}

#[test]
fn bad_configurations_are_refused_with_the_key() {
    let devices = || (0..4u64).map(ssd).collect::<Vec<_>>();
    let array = raid0_4k(4);
    let bad = |config: SwanConfig, array: ArrayConfig| {
        Swan::new(array, config, devices(), Vec::new())
            .unwrap_err()
            .to_string()
    };
    let e = bad(
        SwanConfig {
            groups: 3,
            ..SwanConfig::default()
        },
        array.clone(),
    );
    assert!(e.contains("split evenly"), "{e}");
    let e = bad(
        SwanConfig {
            groups: 2,
            segment_bytes: 4096 * 3,
            ..SwanConfig::default()
        },
        array.clone(),
    );
    assert!(e.contains("segment_bytes"), "{e}");
    let e = bad(
        SwanConfig {
            groups: 1,
            ..SwanConfig::default()
        },
        array.clone(),
    );
    assert!(e.contains("at least 2 R-groups"), "{e}");
    let e = bad(
        SwanConfig::default(),
        ArrayConfig {
            level: Level::Raid6,
            ..array
        },
    );
    assert!(e.contains("raid0, raid4 or raid5"), "{e}");
}

/// The summary takes as many blocks at the end of a segment as its entries need, in every
/// payload mode, so that a configuration measured with tokens writes what one serving bytes
/// writes. Volatile host memory, whose partial summaries take the open stripe's last
/// blocks, refuses segments whose summary fills a stripe.
#[test]
fn a_summary_takes_the_blocks_its_entries_need_in_every_payload_mode() {
    // Blocks of 512 B hold the entries of 36 blocks; 64 KiB segments have 128 blocks and
    // 320 KiB segments 640, in stripes of 16.
    let segment = |stripes: u64, host_memory: HostMemory| SwanConfig {
        groups: 2,
        segment_bytes: 4096 * 2 * stripes,
        host_memory,
        ..SwanConfig::default()
    };
    for payload in [
        afa_nand::PayloadMode::None,
        afa_nand::PayloadMode::Token,
        afa_nand::PayloadMode::Full,
    ] {
        let mut ssd_config = crate::tests::ssd_config();
        ssd_config.payload = payload;
        let devices = || {
            (0..4)
                .map(|i| Ssd::new(ssd_config.clone(), i).unwrap())
                .collect()
        };
        for memory in [HostMemory::BatteryBacked, HostMemory::Volatile] {
            let v = Swan::new(raid0_4k(4), segment(8, memory), devices(), Vec::new()).unwrap();
            assert_eq!((v.summary_blocks, v.data_blocks()), (4, 124), "{payload:?}");
        }
        let v = Swan::new(
            raid0_4k(4),
            segment(40, HostMemory::BatteryBacked),
            devices(),
            Vec::new(),
        )
        .unwrap();
        assert_eq!(
            (v.summary_blocks, v.stripe_sectors),
            (16, 16),
            "{payload:?}"
        );
        let e = Swan::new(
            raid0_4k(4),
            segment(40, HostMemory::Volatile),
            devices(),
            Vec::new(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("the summary takes 16 blocks of 512 B while a stripe holds 16"),
            "{payload:?}: {e}"
        );
    }
    // The paper's 1 MiB segments of 4 KiB blocks keep their summary in one block, and
    // 16 MiB segments in 13.
    assert_eq!(summary_blocks_for(256, 4096), 1);
    assert_eq!(summary_blocks_for(4096, 4096), 13);
}

#[test]
fn a_seed_reproduces_the_run() {
    let run = || {
        let mut h = Harness::new(swan(Level::Raid5, 2, 3, 4, 0.3));
        let mut rng = SimRng::new(99);
        h.random_ops(&mut rng, 3000);
        (h.now_ns, h.volume.stats().clone())
    };
    assert_eq!(run(), run());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(afa_sim::proptest_cases(8)))]
    #[test]
    fn swan_matches_the_oracle(
        seed in any::<u64>(),
        which in 0usize..4,
        greedy in any::<bool>(),
        fail_at in 0usize..4000,
    ) {
        // The last shape's segments of 128 blocks of 512 B keep their summaries in four
        // blocks.
        let (level, groups, width, stripes, sector_bytes) = [
            (Level::Raid0, 3, 1, 2, 4096),
            (Level::Raid5, 2, 3, 2, 4096),
            (Level::Raid4, 3, 3, 2, 4096),
            (Level::Raid5, 2, 3, 8, 512),
        ][which];
        let mut v = swan_of_blocks(level, groups, width, stripes, 0.25, sector_bytes);
        if !greedy {
            v.config.victim = VictimPolicy::Fifo;
        }
        let mut h = Harness::new(v);
        let cap = h.tokens.len() as u64;
        prop_assert_eq!(h.check_allocation(), Some(cap), "a new volume is all holes");
        let mut rng = SimRng::new(seed);
        for i in 0..40 {
            h.random_ops(&mut rng, 100);
            if level != Level::Raid0 && i * 100 == fail_at / 100 * 100 {
                let now = h.now_ns;
                h.volume.fail_member(fail_at % (groups * width) as usize, now).unwrap();
            }
        }
        h.volume.check_invariants();
        h.check_all();
        let holes = h.check_allocation().expect("SWAN knows its allocation");
        prop_assert!(holes < cap);
    }
}

/// SWAN over `groups` RAID groups of test SSDs of `sector_bytes` sectors keeping full bytes,
/// 4 KiB chunks, segments of `stripes` stripes.
fn swan_full(level: Level, groups: u32, width: u32, sector_bytes: u32, stripes: u64) -> Swan<Ssd> {
    let mut cfg = swan_ssd_config();
    cfg.geometry.sector_bytes = sector_bytes;
    cfg.payload = afa_nand::PayloadMode::Full;
    let members = groups * width;
    let devices = (0..members as u64)
        .map(|i| Ssd::new(cfg.clone(), i).unwrap())
        .collect();
    let array = ArrayConfig {
        level,
        members,
        chunk_bytes: 4096,
        ..ArrayConfig::default()
    };
    let k = if level == Level::Raid0 {
        width
    } else {
        width - 1
    } as u64;
    let config = SwanConfig {
        groups,
        segment_bytes: 4096 * k * stripes,
        spare_fraction: 0.3,
        ..SwanConfig::default()
    };
    Swan::new(array, config, devices, Vec::new()).unwrap()
}

/// Writes, reads and trims (one operation in ten), full payload.
fn write_read_ops(h: &mut Harness<Swan<Ssd>>, rng: &mut SimRng, ops: usize) {
    let cap = h.tokens.len() as u64;
    for _ in 0..ops {
        let len = 1 + rng.below(24) as u32;
        let lba = rng.below(cap - len as u64);
        match rng.below(10) {
            0..=2 => h.read_check_full(lba, len),
            3 => h.trim(lba, len),
            _ => h.write_full(lba, len),
        }
    }
}

impl Harness<Swan<Ssd>> {
    fn write_full(&mut self, lba: u64, sectors: u32) {
        let unit = self.volume.info().payload_unit_bytes as usize;
        let version = self.now_ns ^ (lba << 20) ^ 0x5eed;
        let mut data = vec![0u8; sectors as usize * unit];
        for i in 0..sectors as usize {
            let t = sector_token(lba + i as u64, version);
            fill_unit(t, &mut data[i * unit..(i + 1) * unit]);
            self.tokens[lba as usize + i] = t;
        }
        let c = self
            .volume
            .submit(
                self.now_ns,
                &Command::write(lba, sectors, &data),
                ReadBuffers::none(),
            )
            .expect("write accepted");
        self.now_ns += (c.done_ns.saturating_sub(self.now_ns)) / 3 + 1;
    }

    fn read_check_full(&mut self, lba: u64, sectors: u32) {
        let unit = self.volume.info().payload_unit_bytes as usize;
        let mut out = vec![0u8; sectors as usize * unit];
        let c = self
            .volume
            .submit(
                self.now_ns,
                &Command::read(lba, sectors),
                ReadBuffers {
                    data: &mut out,
                    tags: None,
                },
            )
            .expect("read accepted");
        for i in 0..sectors as usize {
            let mut want = vec![0u8; unit];
            fill_unit(self.tokens[lba as usize + i], &mut want);
            assert!(
                out[i * unit..(i + 1) * unit] == want[..],
                "sector {} read back wrong",
                lba + i as u64
            );
            self.checked += 1;
        }
        self.now_ns += (c.done_ns.saturating_sub(self.now_ns)) / 3 + 1;
    }
}

#[test]
fn the_map_rebuilt_from_summaries_is_the_map() {
    // Blocks of 512 B: segments of two stripes (32 blocks) keep their summaries in one
    // block, the last case's of eight stripes (128 blocks) in four.
    for (level, groups, width, sector_bytes, stripes) in [
        (Level::Raid0, 3, 2, 512, 2),
        (Level::Raid5, 2, 3, 512, 2),
        (Level::Raid5, 2, 3, 512, 8),
    ] {
        let mut h = Harness::new(swan_full(level, groups, width, sector_bytes, stripes));
        let summary_blocks = if stripes == 8 { 4 } else { 1 };
        assert_eq!(h.volume.summary_blocks, summary_blocks);
        let mut rng = SimRng::new(17);
        let cap = h.tokens.len() as u64;
        let mut rebuilds = 0;
        while h.volume.stats().user_sectors < cap * 3 {
            let ops = 50 + rng.below(300) as usize;
            write_read_ops(&mut h, &mut rng, ops);
            // Each block's version: while a victim is being cleaned, a moved block and its
            // copy are the same version, and the rebuild may take either.
            let versions = |v: &Swan<Ssd>| -> Vec<Option<u64>> {
                v.l2p
                    .iter()
                    .map(|&p| (p != NONE).then(|| v.wseq[p as usize]))
                    .collect()
            };
            let before = versions(&h.volume);
            let now = h.now_ns;
            h.volume.rebuild_map(now).unwrap();
            assert!(
                before == versions(&h.volume),
                "{level:?}: the rebuilt map holds other versions than the live one"
            );
            h.volume.check_invariants();
            rebuilds += 1;
        }
        assert!(
            h.volume.stats().segments_cleaned > 0,
            "{level:?}: no GC ran"
        );
        // Trims went into the log, and cleaning carried some of their records forward.
        assert!(h.volume.stats().trim_records_moved > 0, "{level:?}");
        assert!(rebuilds > 3);
        let mut lba = 0;
        while lba < cap {
            let n = (cap - lba).min(64) as u32;
            h.read_check_full(lba, n);
            lba += n as u64;
        }
    }
}

#[test]
fn a_rebuild_needs_full_payloads() {
    let mut v = swan(Level::Raid0, 2, 2, 2, 0.3);
    let e = v.rebuild_map(0).unwrap_err();
    assert!(e.to_string().contains("payload mode full"), "{e}");
}

/// SWAN0 of 4 groups of 2 members whose SSDs erase wholly invalid blocks in idle time (or
/// not), with segments of one flash block on every plane of a member, so that a cleaned
/// segment's TRIM empties whole blocks.
fn swan_idle_erase(idle_erase: bool) -> Swan<Ssd> {
    let mut ssd_config = swan_ssd_config();
    ssd_config.gc.background = false;
    ssd_config.gc.idle_erase = idle_erase;
    let g = &ssd_config.geometry;
    let member_segment_bytes =
        g.planes_total() as u64 * g.pages_per_block as u64 * g.page_bytes as u64;
    let array = raid0_4k(8);
    let config = SwanConfig {
        groups: 4,
        segment_bytes: 2 * member_segment_bytes,
        spare_fraction: 0.4,
        gc_parallel_groups: 3,
        ..SwanConfig::default()
    };
    let devices = (0..8u64)
        .map(|i| Ssd::new(ssd_config.clone(), i).unwrap())
        .collect();
    Swan::new(array, config, devices, Vec::new()).unwrap()
}

#[test]
fn idle_back_end_groups_erase_what_cleaning_trimmed() {
    let mut write_path_erases = Vec::new();
    for idle_erase in [false, true] {
        let mut h = Harness::new(swan_idle_erase(idle_erase));
        let mut rng = SimRng::new(21);
        let cap = h.tokens.len() as u64;
        while h.volume.stats().user_sectors < cap * 4 {
            h.random_ops(&mut rng, 200);
        }
        h.volume.check_invariants();
        h.check_all();
        assert!(h.volume.stats().segments_cleaned > 0, "no GC ran");
        let idle: u64 = h.volume.members().map(|m| m.ftl_stats().idle_erases).sum();
        if idle_erase {
            assert!(idle > 0, "no back-end member erased in idle time");
        } else {
            assert_eq!(idle, 0);
        }
        // Erases a write had to wait for: the members' foreground GC runs, which here move
        // no page and only erase.
        write_path_erases.push(
            h.volume
                .members()
                .map(|m| m.ftl_stats().gc_foreground_runs)
                .sum::<u64>(),
        );
    }
    assert!(
        write_path_erases[1] < write_path_erases[0],
        "idle erase left {} erases in the write path, against {} without",
        write_path_erases[1],
        write_path_erases[0]
    );
}

#[test]
fn groups_of_unequal_capacity_take_the_smallest_and_keep_data() {
    // The last group's SSDs are smaller, as SSDs with more factory bad blocks would be.
    let members = 6u32;
    let devices: Vec<Ssd> = (0..members as u64)
        .map(|i| {
            let mut c = swan_ssd_config();
            if i >= 4 {
                c.geometry.blocks_per_plane -= 4;
            }
            Ssd::new(c, i).unwrap()
        })
        .collect();
    let smallest = devices.last().unwrap().info().capacity_sectors;
    assert!(smallest < devices[0].info().capacity_sectors);
    let array = raid0_4k(members);
    let config = SwanConfig {
        groups: 3,
        segment_bytes: 4096 * 2 * 4,
        spare_fraction: 0.3,
        ..SwanConfig::default()
    };
    let mut h = Harness::new(Swan::new(array, config, devices, Vec::new()).unwrap());
    let mut rng = SimRng::new(13);
    let cap = h.tokens.len() as u64;
    while h.volume.stats().user_sectors < cap * 4 {
        h.random_ops(&mut rng, 200);
    }
    h.volume.check_invariants();
    h.check_all();
    assert!(h.volume.stats().segments_cleaned > 0, "no GC ran");
}

/// A foreground GC stall holds the whole user stream, not only the write that met it: the
/// log has no head until the stall ends, so a write submitted during the stall cannot
/// complete before it. (Before this rule the writes behind the stalled one went on appending
/// "in the past", the stalls chained on the GC clock, and background GC never ran.)
#[test]
fn writes_submitted_during_a_foreground_stall_wait_for_its_end() {
    let mut v = swan(Level::Raid0, 2, 2, 4, 0.15);
    let cap = v.info().capacity_sectors;
    let mut rng = SimRng::new(11);
    let data = vec![0u8; 2 * 8];
    let mut now = 0u64;
    let mut checked = 0;
    while v.stats().user_sectors < cap * 3 {
        let stalls = v.stats().foreground_gc_stalls;
        let resume_ns = v
            .stats()
            .events
            .iter()
            .rev()
            .find(|e| e.kind == "foreground_gc_stop")
            .map_or(0, |e| e.t_ns);
        let lba = rng.below(cap - 2);
        let c = v
            .submit(now, &Command::write(lba, 2, &data), ReadBuffers::none())
            .unwrap();
        if stalls > 0 && now < resume_ns && v.stats().foreground_gc_stalls == stalls {
            assert!(
                c.done_ns >= resume_ns,
                "a write submitted at {now} ns completed at {} ns, inside a stall ending at {resume_ns} ns",
                c.done_ns
            );
            checked += 1;
        }
        // The writer barely waits between writes, so the back-end falls behind.
        now += 1_000;
    }
    assert!(v.stats().foreground_gc_stalls >= 3, "{:?}", v.stats());
    assert!(checked > 0, "no write was submitted during a stall");
}
