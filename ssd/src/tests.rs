//! Tests of the controller against an oracle: every read is checked against what the host
//! last wrote, for every buffer, GC and SLC policy.

use afa_nand::{fill_unit, sector_token, unit_matches, Geometry, PayloadMode};
use afa_sim::SimRng;
use proptest::prelude::*;

use crate::*;

fn small_config(sector_bytes: u32, payload: PayloadMode) -> SsdConfig {
    SsdConfig {
        geometry: Geometry {
            channels: 2,
            chips_per_channel: 1,
            dies_per_chip: 2,
            planes_per_die: 2,
            blocks_per_plane: 24,
            pages_per_block: 16,
            page_bytes: 4096,
            sector_bytes,
            oob_bytes_per_page: 64,
        },
        payload,
        over_provisioning: 0.25,
        ..SsdConfig::default()
    }
}

/// [`small_config`] shrunk to one plane (one channel, chip and die), where a plane's
/// space cannot come from another.
fn one_plane_config(payload: PayloadMode) -> SsdConfig {
    let mut cfg = small_config(4096, payload);
    cfg.geometry.channels = 1;
    cfg.geometry.dies_per_chip = 1;
    cfg.geometry.planes_per_die = 1;
    cfg
}

/// The host's view: the token each sector should hold.
struct Oracle {
    tokens: Vec<u64>,
    version: u64,
}

struct Harness {
    ssd: Ssd,
    oracle: Oracle,
    now_ns: u64,
    unit: usize,
    checked: u64,
}

impl Harness {
    fn new(config: SsdConfig, seed: u64) -> Self {
        let ssd = Ssd::new(config, seed).expect("valid config");
        let info = ssd.info();
        Self {
            oracle: Oracle {
                tokens: vec![0; info.capacity_sectors as usize],
                version: 0,
            },
            unit: info.payload_unit_bytes as usize,
            ssd,
            now_ns: 0,
            checked: 0,
        }
    }

    /// A write the device may refuse: the oracle takes the new version only if it was
    /// accepted.
    fn try_write(&mut self, lba: u64, sectors: u32) -> Result<Completion, DeviceError> {
        let mut data = vec![0u8; sectors as usize * self.unit];
        let version = self.oracle.version + 1;
        let tokens: Vec<u64> = (0..sectors as u64)
            .map(|i| sector_token(lba + i, version))
            .collect();
        for (i, &token) in tokens.iter().enumerate() {
            if self.unit > 0 {
                fill_unit(token, &mut data[i * self.unit..(i + 1) * self.unit]);
            }
        }
        let c = self.ssd.submit(
            self.now_ns,
            &Command::write(lba, sectors, &data),
            ReadBuffers::none(),
        )?;
        self.oracle.version = version;
        for (i, token) in tokens.into_iter().enumerate() {
            self.oracle.tokens[lba as usize + i] = token;
        }
        self.advance(&c);
        Ok(c)
    }

    fn write(&mut self, lba: u64, sectors: u32) -> Completion {
        self.try_write(lba, sectors).expect("write accepted")
    }

    fn read_and_check(&mut self, lba: u64, sectors: u32) {
        let mut data = vec![0u8; sectors as usize * self.unit];
        let c = self
            .ssd
            .submit(
                self.now_ns,
                &Command::read(lba, sectors),
                ReadBuffers {
                    data: &mut data,
                    tags: None,
                },
            )
            .expect("read accepted");
        self.advance(&c);
        for i in 0..sectors as usize {
            let want = self.oracle.tokens[lba as usize + i];
            let got = &data[i * self.unit..(i + 1) * self.unit];
            assert!(
                unit_matches(want, got),
                "sector {} holds token {:#x}, expected {want:#x}",
                lba + i as u64,
                afa_nand::unit_token(got)
            );
            self.checked += 1;
        }
    }

    fn trim(&mut self, lba: u64, sectors: u32) {
        for i in 0..sectors as usize {
            self.oracle.tokens[lba as usize + i] = 0;
        }
        let c = self
            .ssd
            .submit(
                self.now_ns,
                &Command::trim(lba, sectors),
                ReadBuffers::none(),
            )
            .expect("trim accepted");
        self.advance(&c);
    }

    fn flush(&mut self) {
        let c = self
            .ssd
            .submit(self.now_ns, &Command::flush(), ReadBuffers::none())
            .expect("flush accepted");
        self.advance(&c);
    }

    fn advance(&mut self, c: &Completion) {
        assert!(c.done_ns >= self.now_ns, "completion before submission");
        // Let commands overlap a little, as a queue depth above one would.
        self.now_ns += (c.done_ns - self.now_ns) / 4;
    }

    fn check_all(&mut self) {
        let cap = self.oracle.tokens.len() as u64;
        let mut lba = 0;
        while lba < cap {
            let n = (cap - lba).min(64) as u32;
            self.read_and_check(lba, n);
            lba += n as u64;
        }
    }

    /// Random reads, writes (aligned and not), trims and flushes over a hot region, so GC
    /// and the buffer are exercised.
    fn random_ops(&mut self, seed: u64, ops: usize) {
        let mut rng = SimRng::new(seed);
        let cap = self.oracle.tokens.len() as u64;
        let spp = self.ssd.config().geometry.sectors_per_page() as u64;
        for _ in 0..ops {
            let len = 1 + rng.below(3 * spp) as u32;
            let lba = rng.below(cap - len as u64 + 1);
            match rng.below(100) {
                0..=54 => {
                    self.write(lba, len);
                }
                55..=89 => self.read_and_check(lba, len),
                90..=96 => self.trim(lba, len),
                97 => {
                    // A moment of idle time: background GC and idle erases run.
                    if let Some(next) = self.ssd.background(self.now_ns) {
                        self.now_ns = self.now_ns.max(next);
                    }
                }
                _ => self.flush(),
            }
        }
    }
}

#[test]
fn unwritten_sectors_read_as_zero() {
    let mut h = Harness::new(small_config(4096, PayloadMode::Token), 1);
    h.read_and_check(0, 8);
}

#[test]
fn write_then_read_back_full_and_partial_pages() {
    for sector in [512, 4096] {
        let mut h = Harness::new(small_config(sector, PayloadMode::Full), 1);
        h.write(0, 8);
        h.write(3, 1);
        h.read_and_check(0, 16);
        h.ssd.check_invariants();
    }
}

#[test]
fn partial_page_overwrite_reads_modify_writes() {
    let mut h = Harness::new(small_config(512, PayloadMode::Token), 1);
    h.write(0, 8); // one whole page
    h.write(2, 3); // part of it
    assert_eq!(h.ssd.ftl_stats().rmw_reads, 1);
    h.read_and_check(0, 8);
}

#[test]
fn sustained_random_writes_trigger_gc_and_keep_data() {
    let mut h = Harness::new(small_config(4096, PayloadMode::Token), 3);
    let cap = h.oracle.tokens.len() as u64;
    let mut rng = SimRng::new(9);
    for _ in 0..(cap * 12) {
        h.write(rng.below(cap), 1);
    }
    assert!(h.ssd.ftl_stats().gc_foreground_runs > 0);
    assert!(h.ssd.write_amplification() > 1.0);
    h.check_all();
    h.ssd.check_invariants();
}

#[test]
fn gc_active_flag_is_reported_while_gc_runs() {
    let mut h = Harness::new(small_config(4096, PayloadMode::None), 3);
    let cap = h.oracle.tokens.len() as u64;
    let mut rng = SimRng::new(9);
    let mut seen = false;
    for _ in 0..(cap * 4) {
        seen |= h.write(rng.below(cap), 1).gc_active;
    }
    assert!(seen);
}

#[test]
fn trimmed_sectors_read_zero_even_when_partial() {
    let mut h = Harness::new(small_config(512, PayloadMode::Token), 1);
    h.write(0, 32);
    h.trim(8, 8); // one whole page
    h.trim(18, 3); // part of a page
    h.read_and_check(0, 32);
    assert_eq!(h.ssd.ftl_stats().page_writes, 5);
    assert_eq!(h.ssd.stats().host_page_writes, 4);
}

#[test]
fn write_buffer_absorbs_rewrites_and_flush_drains_it() {
    let mut cfg = small_config(4096, PayloadMode::Token);
    cfg.write_buffer.capacity_bytes = 16 * 4096;
    let mut h = Harness::new(cfg, 1);
    for _ in 0..4 {
        h.write(0, 4);
    }
    assert_eq!(h.ssd.buffered_pages(), 4);
    assert_eq!(h.ssd.nand_counters().programs.iter().sum::<u64>(), 0);
    h.read_and_check(0, 4);
    assert!(h.ssd.stats().buffer_read_hits > 0);
    h.flush();
    assert_eq!(h.ssd.buffered_pages(), 0);
    assert_eq!(h.ssd.nand_counters().programs.iter().sum::<u64>(), 4);
    // Sixteen host page writes became four programs.
    assert_eq!(h.ssd.write_amplification(), 0.25);
    h.read_and_check(0, 4);
}

/// Writes that come slower than the flash can program them find room in the buffer, so they
/// complete at DRAM speed however many have been written: the buffer programs its coldest
/// pages once half of it is dirty. Without write-behind (`destage_fraction = 1`) a full
/// buffer makes each of them wait for a program, with the flash idle in between.
#[test]
fn write_behind_keeps_room_for_writes_the_flash_keeps_up_with() {
    let mut cfg = small_config(4096, PayloadMode::None);
    cfg.write_buffer.capacity_bytes = 16 * 4096;
    let slowest_write_ns = |destage_fraction: f64| {
        let mut cfg = cfg.clone();
        cfg.write_buffer.destage_fraction = destage_fraction;
        let mut ssd = Ssd::new(cfg.clone(), 1).unwrap();
        let pages = ssd.info().capacity_sectors;
        let program_ns = cfg.timing.mlc.program_ns.max(cfg.timing.slc.program_ns);
        let mut slowest = 0;
        // One page every two programs, over pages never rewritten, four buffers' worth.
        for i in 0..64u64 {
            let at = i * 2 * program_ns;
            let c = ssd
                .submit(
                    at,
                    &Command::write(i * 7 % pages, 1, &[]),
                    ReadBuffers::none(),
                )
                .unwrap();
            slowest = slowest.max(c.done_ns - at);
        }
        assert!(ssd.buffered_pages() <= 16);
        (slowest, program_ns)
    };
    let (behind_ns, program_ns) = slowest_write_ns(0.5);
    assert!(
        behind_ns * 10 < program_ns,
        "{behind_ns} ns against a {program_ns} ns program"
    );
    let (on_demand_ns, _) = slowest_write_ns(1.0);
    assert!(on_demand_ns >= program_ns, "{on_demand_ns} ns");
    for bad in [-0.1, 1.5, f64::NAN] {
        cfg.write_buffer.destage_fraction = bad;
        let err = Ssd::new(cfg.clone(), 1).unwrap_err().to_string();
        assert!(err.contains("write_buffer.destage_fraction"), "{err}");
    }
}

#[test]
fn buffered_writes_complete_faster_than_programs() {
    let mut cfg = small_config(4096, PayloadMode::None);
    cfg.write_buffer.capacity_bytes = 64 * 4096;
    let mut buffered = Ssd::new(cfg.clone(), 1).unwrap();
    cfg.write_buffer.capacity_bytes = 0;
    let mut direct = Ssd::new(cfg, 1).unwrap();
    let b = buffered
        .submit(0, &Command::write(0, 1, &[]), ReadBuffers::none())
        .unwrap();
    let d = direct
        .submit(0, &Command::write(0, 1, &[]), ReadBuffers::none())
        .unwrap();
    assert!(b.done_ns * 10 < d.done_ns, "{} vs {}", b.done_ns, d.done_ns);
}

#[test]
fn a_write_buffer_larger_than_the_device_is_refused_not_allocated() {
    let mut cfg = small_config(4096, PayloadMode::None);
    cfg.write_buffer.capacity_bytes = i64::MAX as u64;
    let e = Ssd::new(cfg, 1).unwrap_err();
    assert!(
        e.to_string()
            .contains("write_buffer.capacity_bytes = 9223372036854775807 is larger than"),
        "{e}"
    );
}

/// A half-duplex link (SATA) carries read and write data one at a time: a write whose data
/// would cross while a read's data goes up waits for it, where a full-duplex link (PCIe)
/// carries both at once.
#[test]
fn a_half_duplex_link_carries_one_direction_at_a_time() {
    let mut cfg = small_config(4096, PayloadMode::None);
    cfg.write_buffer.capacity_bytes = 0;
    // 40 MB/s: 16 pages take 1.6 ms to cross, far longer than a flash read.
    cfg.host.bandwidth_mb_s = 40.0;
    let run = |duplex: Duplex| {
        let mut cfg = cfg.clone();
        cfg.host.duplex = duplex;
        let mut ssd = Ssd::new(cfg, 1).unwrap();
        let w = ssd
            .submit(0, &Command::write(0, 16, &[]), ReadBuffers::none())
            .unwrap();
        let t = w.done_ns + 1_000_000;
        let mut out = [];
        let read = ssd
            .submit(
                t,
                &Command::read(0, 16),
                ReadBuffers {
                    data: &mut out,
                    tags: None,
                },
            )
            .unwrap();
        // Submitted after the read, ready while the read's data crosses.
        let write = ssd
            .submit(
                t + 200_000,
                &Command::write(64, 16, &[]),
                ReadBuffers::none(),
            )
            .unwrap();
        (read.done_ns - t, write.done_ns - t)
    };
    let (read_full, write_full) = run(Duplex::Full);
    let (read_half, write_half) = run(Duplex::Half);
    let transfer_ns = afa_sim::transfer_ns(16 * 4096, 40.0);
    assert_eq!(read_full, read_half, "the read goes first either way");
    // Full duplex: the write's data crosses beside the read's. Half: after it, which
    // holds the write back by most of the read's transfer.
    assert!(
        write_half >= write_full + transfer_ns / 2,
        "{write_half} vs {write_full}"
    );
    assert!(
        write_half >= read_half + transfer_ns,
        "{write_half} vs {read_half}"
    );
}

/// However reads and writes interleave, a half-duplex link carries no more than its
/// bandwidth: a slow link's makespan is at least all the bytes over the rate.
#[test]
fn a_half_duplex_link_never_carries_more_than_its_bandwidth() {
    let mut cfg = small_config(4096, PayloadMode::None);
    cfg.write_buffer.capacity_bytes = 0;
    cfg.host.bandwidth_mb_s = 40.0;
    cfg.host.duplex = Duplex::Half;
    let mut ssd = Ssd::new(cfg, 1).unwrap();
    let mut rng = SimRng::new(3);
    let mut out = [];
    let mut times: Vec<u64> = (0..200).map(|_| rng.below(20_000_000)).collect();
    times.sort_unstable();
    let (mut last, mut bytes) = (0, 0u64);
    for (i, at) in times.into_iter().enumerate() {
        let lba = rng.below(64) * 8;
        let cmd = if i % 2 == 0 {
            Command::write(lba, 8, &[])
        } else {
            Command::read(lba, 8)
        };
        let buffers = ReadBuffers {
            data: &mut out,
            tags: None,
        };
        let c = ssd.submit(at, &cmd, buffers).unwrap();
        last = last.max(c.done_ns);
        bytes += 8 * 4096;
    }
    let floor_ns = afa_sim::transfer_ns(bytes, 40.0);
    assert!(
        last >= floor_ns,
        "{last} ns for {bytes} bytes (at least {floor_ns})"
    );
}

#[test]
fn slc_cache_takes_host_writes_and_evicts_to_dense_blocks() {
    let mut cfg = small_config(4096, PayloadMode::Token);
    // Two SLC blocks of 8 pages per plane.
    cfg.slc_cache.capacity_bytes = 8 * 2 * 8 * 4096;
    let mut h = Harness::new(cfg, 1);
    let cap = h.oracle.tokens.len() as u64;
    let mut rng = SimRng::new(5);
    for _ in 0..(cap * 3) {
        h.write(rng.below(cap), 1);
    }
    let n = *h.ssd.nand_counters();
    assert!(n.programs[0] > 0, "no SLC programs");
    assert!(n.programs[1] > 0, "no MLC programs");
    assert!(h.ssd.ftl_stats().slc_evictions > 0);
    let planes = h.ssd.config().geometry.planes_total() as u64;
    assert_eq!(h.ssd.slc_blocks(), 2 * planes);
    h.check_all();
    h.ssd.check_invariants();
}

#[test]
fn transient_aware_eviction_migrates_fewer_pages() {
    // Half the writes are transient replicas that are trimmed soon after; a transient-aware
    // evictor leaves them in SLC to die there, so fewer pages migrate to MLC.
    let run = |policy: SlcEvictionPolicy| {
        let mut cfg = small_config(4096, PayloadMode::None);
        cfg.slc_cache.capacity_bytes = 8 * 4 * 8 * 4096;
        cfg.slc_cache.eviction = policy;
        let mut ssd = Ssd::new(cfg, 1).unwrap();
        let cap = ssd.info().capacity_sectors;
        let mut rng = SimRng::new(11);
        let mut pending = std::collections::VecDeque::new();
        // Normal and transient writes are interleaved at random, so every plane's SLC blocks
        // mix both (a fixed alternation would send each kind to its own planes).
        for i in 0..(cap * 8) {
            if rng.chance(0.5) {
                let cmd = Command::write(rng.below(cap / 2), 1, &[]);
                ssd.submit(i * 1000, &cmd, ReadBuffers::none()).unwrap();
                continue;
            }
            let replica = cap / 2 + rng.below(cap / 2);
            let mut cmd = Command::write(replica, 1, &[]);
            cmd.flags.transient = true;
            ssd.submit(i * 1000, &cmd, ReadBuffers::none()).unwrap();
            pending.push_back(replica);
            if pending.len() > 160 {
                let old = pending.pop_front().unwrap();
                ssd.submit(i * 1000, &Command::trim(old, 1), ReadBuffers::none())
                    .unwrap();
            }
        }
        ssd.ftl_stats().slc_pages_migrated
    };
    let greedy = run(SlcEvictionPolicy::Greedy);
    let transient = run(SlcEvictionPolicy::Transient);
    assert!(
        transient < greedy,
        "transient {transient} vs greedy {greedy}"
    );
}

/// Transient pages fill SLC blocks of their own (ScalaAFA §5.5), so the evictor can leave
/// them in SLC while ordinary blocks are there to evict: a quarter of the SLC cache holds
/// live transient pages, four caches' worth of ordinary pages stream past, and no transient
/// page migrates. Mixed into every block, the transient pages would migrate with each one.
#[test]
fn transient_pages_fill_their_own_slc_blocks() {
    let mut cfg = small_config(4096, PayloadMode::None);
    cfg.slc_cache.capacity_bytes = 8 * 4 * 8 * 4096;
    cfg.slc_cache.eviction = SlcEvictionPolicy::Transient;
    let slc_pages = cfg.slc_cache.capacity_bytes / 4096;
    let mut ssd = Ssd::new(cfg, 1).unwrap();
    let cap = ssd.info().capacity_sectors;
    let mut rng = SimRng::new(3);
    let mut transient_written = 0;
    let mut i = 0;
    while i < 4 * slc_pages || transient_written < slc_pages / 4 {
        if transient_written < slc_pages / 4 && rng.chance(0.2) {
            let mut cmd = Command::write(cap / 2 + transient_written, 1, &[]);
            cmd.flags.transient = true;
            ssd.submit(i * 1000, &cmd, ReadBuffers::none()).unwrap();
            transient_written += 1;
        } else {
            let cmd = Command::write(rng.below(cap / 2), 1, &[]);
            ssd.submit(i * 1000, &cmd, ReadBuffers::none()).unwrap();
        }
        i += 1;
    }
    let stats = ssd.ftl_stats();
    assert!(stats.slc_pages_migrated > 0, "{stats:?}");
    assert_eq!(stats.slc_transient_pages_migrated, 0, "{stats:?}");
    ssd.check_invariants();
}

#[test]
fn tags_are_stored_with_the_data_and_returned() {
    let mut ssd = Ssd::new(small_config(512, PayloadMode::Token), 1).unwrap();
    let tag_bytes = ssd.info().tag_bytes_per_sector as usize;
    assert_eq!(tag_bytes, 7);
    let data = vec![1u8; 4 * 8];
    let tags: Vec<u8> = (0..4 * tag_bytes as u8).collect();
    let cmd = Command {
        tags: Some(&tags),
        ..Command::write(10, 4, &data)
    };
    ssd.submit(0, &cmd, ReadBuffers::none()).unwrap();
    let mut out = vec![0u8; 4 * 8];
    let mut out_tags = vec![0u8; 4 * tag_bytes];
    ssd.submit(
        0,
        &Command::read(10, 4),
        ReadBuffers {
            data: &mut out,
            tags: Some(&mut out_tags),
        },
    )
    .unwrap();
    assert_eq!(out, data);
    assert_eq!(out_tags, tags);
}

/// The OOB scan of a page the write buffer holds in part takes the buffered sectors' tags
/// from the buffer and the others from flash, as a read does. It took the whole slot, and a
/// slot keeps the tags of the page it buffered before, so the scan returned another page's
/// metadata for the sectors the buffer did not hold.
#[test]
fn an_oob_scan_of_a_partly_buffered_page_takes_the_other_sectors_from_flash() {
    let mut cfg = small_config(512, PayloadMode::Token);
    cfg.write_buffer.capacity_bytes = 4 * 4096;
    // Pages leave the buffer only when a flush (or a write needing the slot) sends them.
    cfg.write_buffer.destage_fraction = 1.0;
    let mut ssd = Ssd::new(cfg, 1).unwrap();
    let tag = ssd.info().tag_bytes_per_sector as usize;
    let spp = 8;
    let data = vec![7u8; spp * 8];
    let write = |ssd: &mut Ssd, lba: u64, sectors: u32, byte: u8| {
        let tags = vec![byte; sectors as usize * tag];
        let cmd = Command {
            tags: Some(&tags),
            ..Command::write(lba, sectors, &data[..sectors as usize * 8])
        };
        ssd.submit(0, &cmd, ReadBuffers::none()).unwrap();
        ssd.submit(0, &Command::flush(), ReadBuffers::none())
            .unwrap();
    };
    // Page 0 goes to flash with tags 0xA1; page 1 then passes through the same buffer slot
    // with tags 0xB2; one sector of page 0 is rewritten with 0xC3 and stays buffered.
    write(&mut ssd, 0, spp as u32, 0xA1);
    write(&mut ssd, spp as u64, spp as u32, 0xB2);
    let tags = vec![0xC3; tag];
    let cmd = Command {
        tags: Some(&tags),
        ..Command::write(1, 1, &data[..8])
    };
    ssd.submit(0, &cmd, ReadBuffers::none()).unwrap();
    let mut want = vec![0xA1; spp * tag];
    want[tag..2 * tag].fill(0xC3);
    assert_eq!(ssd.scan_tags(0, spp as u32).unwrap(), want);
    let mut out = vec![0u8; spp * 8];
    let mut out_tags = vec![0u8; spp * tag];
    ssd.submit(
        0,
        &Command::read(0, spp as u32),
        ReadBuffers {
            data: &mut out,
            tags: Some(&mut out_tags),
        },
    )
    .unwrap();
    assert_eq!(out_tags, want);
}

#[test]
fn bad_commands_are_refused_with_reasons() {
    let mut ssd = Ssd::new(small_config(4096, PayloadMode::Token), 1).unwrap();
    let cap = ssd.info().capacity_sectors;
    let err = ssd
        .submit(0, &Command::read(cap, 1), ReadBuffers::none())
        .unwrap_err();
    assert!(matches!(err, DeviceError::OutOfRange { .. }), "{err}");
    let err = ssd
        .submit(0, &Command::write(0, 2, &[0u8; 8]), ReadBuffers::none())
        .unwrap_err();
    assert!(err.to_string().contains("payload"), "{err}");
}

#[test]
fn bad_configs_name_the_field() {
    let mut cfg = small_config(4096, PayloadMode::Token);
    cfg.over_provisioning = -1.0;
    assert!(Ssd::new(cfg, 1)
        .unwrap_err()
        .to_string()
        .contains("over_provisioning"));
    let mut cfg = small_config(4096, PayloadMode::Token);
    cfg.ftl.allocation_order = "CWDX".into();
    assert!(Ssd::new(cfg, 1)
        .unwrap_err()
        .to_string()
        .contains("allocation_order"));
    let mut cfg = small_config(4096, PayloadMode::Token);
    cfg.gc.hard_threshold_blocks = 1;
    assert!(Ssd::new(cfg, 1)
        .unwrap_err()
        .to_string()
        .contains("hard_threshold"));
}

/// The error of a configuration that `Ssd::new` must refuse.
fn config_error(cfg: SsdConfig) -> String {
    match Ssd::new(cfg, 1) {
        Ok(_) => panic!("the configuration was accepted"),
        Err(e) => e.to_string(),
    }
}

/// A plane must hold the SLC cache, the GC reserve and some data. The FTL used to blame
/// `slc_cache.capacity_bytes` whenever a plane was short of blocks, even without a cache;
/// each shortfall must now name the key at fault and the bound it breaks, and each bound
/// must be exact (the value at the bound is accepted).
#[test]
fn plane_budget_errors_name_the_key_at_fault() {
    // small_config: 8 planes of 24 blocks of 16 MLC pages of 4 KiB, 25% spare.
    let mut cfg = small_config(4096, PayloadMode::Token);
    cfg.geometry.blocks_per_plane = 3;
    let err = config_error(cfg);
    assert!(
        err.contains("geometry.blocks_per_plane = 3 is too small"),
        "{err}"
    );
    assert!(err.contains("must be at least 5"), "{err}");
    assert!(!err.contains("slc_cache"), "{err}");

    // A threshold larger than the plane is named as such, before the soft threshold (4 by
    // default) is found below it.
    let mut cfg = small_config(4096, PayloadMode::Token);
    cfg.gc.hard_threshold_blocks = 200;
    let err = config_error(cfg);
    assert!(
        err.contains("gc.hard_threshold_blocks = 200 is too large"),
        "{err}"
    );
    assert!(err.contains("geometry.blocks_per_plane = 24"), "{err}");
    assert!(err.contains("can be at most 21"), "{err}");
    assert!(!err.contains("slc_cache") && !err.contains("soft"), "{err}");
    let mut cfg = small_config(4096, PayloadMode::Token);
    cfg.gc.hard_threshold_blocks = 21;
    cfg.gc.soft_threshold_blocks = 21;
    cfg.over_provisioning = 24.0;
    Ssd::new(cfg, 1).expect("the largest threshold fits");

    // Program failures add a spare block per plane, and the message says why.
    let mut cfg = small_config(4096, PayloadMode::Token);
    cfg.gc.hard_threshold_blocks = 21;
    cfg.gc.soft_threshold_blocks = 21;
    cfg.over_provisioning = 24.0;
    cfg.faults.program_fail_probability = 0.001;
    let err = config_error(cfg);
    assert!(err.contains("can be at most 20"), "{err}");
    assert!(err.contains("faults.program_fail_probability"), "{err}");

    // An SLC block here holds 8 pages (16 MLC pages at one bit per cell), 32 KiB; 8 planes.
    let mut cfg = small_config(4096, PayloadMode::Token);
    cfg.slc_cache.capacity_bytes = 8 * 32_768;
    let err = config_error(cfg);
    assert!(err.contains("slc_cache.capacity_bytes = 262144"), "{err}");
    assert!(err.contains("more than 262144 bytes"), "{err}");
    let mut cfg = small_config(4096, PayloadMode::Token);
    cfg.slc_cache.capacity_bytes = 8 * 32_768 + 1;
    Ssd::new(cfg, 1).expect("two SLC blocks per plane");

    // 24 blocks less a reserve of 4 and one for data leave room for 19 SLC blocks.
    let largest_slc = 19 * 8 * 32_768;
    let mut cfg = small_config(4096, PayloadMode::Token);
    cfg.slc_cache.capacity_bytes = largest_slc + 1;
    cfg.over_provisioning = 4.0;
    let err = config_error(cfg);
    assert!(err.contains("takes 20 SLC blocks in each plane"), "{err}");
    assert!(
        err.contains(&format!("at most {largest_slc} bytes")),
        "{err}"
    );
    let mut cfg = small_config(4096, PayloadMode::Token);
    cfg.slc_cache.capacity_bytes = largest_slc;
    cfg.over_provisioning = 4.0;
    Ssd::new(cfg, 1).expect("the largest cache fits");

    // 192 dense blocks, 32 of them the reserve: the logical pages must fit in the other
    // 160, which takes 3072 / 2560 − 1 = 20% spare.
    let mut cfg = small_config(4096, PayloadMode::Token);
    cfg.over_provisioning = 0.01;
    let err = config_error(cfg);
    assert!(
        err.contains("over_provisioning = 0.01 leaves 3041 logical pages"),
        "{err}"
    );
    assert!(err.contains("must be at least 0.2"), "{err}");
    let mut cfg = small_config(4096, PayloadMode::Token);
    cfg.over_provisioning = 0.2;
    Ssd::new(cfg, 1).expect("the smallest spare fits");
    let mut cfg = small_config(4096, PayloadMode::Token);
    cfg.over_provisioning = 1e300;
    let err = config_error(cfg);
    assert!(err.contains("leaves no logical page"), "{err}");
    assert!(err.contains("at most 3071"), "{err}");
}

#[test]
fn preconditioned_content_is_the_version_zero_token() {
    for (pattern, victim) in [
        (PreconditionPattern::Sequential, VictimPolicy::Greedy),
        (PreconditionPattern::RandomSimulated, VictimPolicy::Greedy),
        (PreconditionPattern::Random, VictimPolicy::Greedy),
        (PreconditionPattern::Random, VictimPolicy::Fifo),
        (PreconditionPattern::Random, VictimPolicy::CostBenefit),
    ] {
        let mut cfg = small_config(512, PayloadMode::Full);
        cfg.gc.victim = victim;
        let mut h = Harness::new(cfg, 1);
        let p = Precondition {
            fill_fraction: 0.9,
            pattern,
            overwrite_rounds: 0.5,
        };
        h.ssd.precondition(&p, 7).unwrap();
        let filled = p.filled_pages(h.ssd.logical_pages()) as usize * 8;
        for lba in 0..filled {
            h.oracle.tokens[lba] = sector_token(lba as u64, 0);
        }
        assert_eq!(h.ssd.nand_counters().programs.iter().sum::<u64>(), 0);
        h.check_all();
        h.ssd.check_invariants();
        // The device keeps working from the preconditioned state.
        h.random_ops(3, 500);
        h.check_all();
        h.ssd.check_invariants();
    }
}

#[test]
fn constructed_steady_state_has_the_simulated_write_amplification() {
    // Greedy at 15% spare: the directly built state and the simulated history must give the
    // same amplification under further random writes.
    let waf_after = |pattern: PreconditionPattern| {
        let mut cfg = small_config(4096, PayloadMode::None);
        cfg.over_provisioning = 0.15;
        cfg.geometry.blocks_per_plane = 256;
        let mut ssd = Ssd::new(cfg, 1).unwrap();
        let p = Precondition {
            fill_fraction: 1.0,
            pattern,
            overwrite_rounds: if pattern == PreconditionPattern::Random {
                0.0
            } else {
                4.0
            },
        };
        ssd.precondition(&p, 2).unwrap();
        let cap = ssd.info().capacity_sectors;
        let mut rng = SimRng::new(5);
        for i in 0..cap {
            ssd.submit(
                i * 100_000,
                &Command::write(rng.below(cap), 1, &[]),
                ReadBuffers::none(),
            )
            .unwrap();
        }
        ssd.write_amplification()
    };
    let built = waf_after(PreconditionPattern::Random);
    let simulated = waf_after(PreconditionPattern::RandomSimulated);
    assert!(
        (built - simulated).abs() / simulated < 0.08,
        "built {built} vs simulated {simulated}"
    );
}

#[test]
fn program_and_erase_failures_lose_nothing() {
    let mut cfg = small_config(4096, PayloadMode::Token);
    cfg.geometry.blocks_per_plane = 64;
    // Failed programs and erases eat into the free-block reserve while GC runs, so a device
    // expecting faults keeps a deeper reserve.
    cfg.gc.hard_threshold_blocks = 4;
    cfg.gc.soft_threshold_blocks = 6;
    cfg.faults.program_fail_probability = 0.0003;
    cfg.faults.erase_fail_probability = 0.002;
    let mut h = Harness::new(cfg, 5);
    let cap = h.oracle.tokens.len() as u64;
    let mut rng = SimRng::new(4);
    for _ in 0..cap * 4 {
        h.write(rng.below(cap), 1);
    }
    h.random_ops(3, 2000);
    assert!(h.ssd.nand_counters().program_failures > 0);
    assert!(h.ssd.nand_counters().erase_failures > 0);
    assert!(h.ssd.ftl_stats().blocks_retired > 0);
    h.check_all();
    h.ssd.check_invariants();
}

/// The small device with two SLC blocks of 8 pages in each of its 8 planes (the fewest
/// allowed) and erases that fail with probability `erase_fail`.
fn two_slc_blocks_per_plane(erase_fail: f64) -> SsdConfig {
    let mut cfg = small_config(4096, PayloadMode::Token);
    cfg.slc_cache.capacity_bytes = 8 * 2 * 8 * 4096;
    cfg.faults.erase_fail_probability = erase_fail;
    cfg
}

/// SLC blocks are erased far more often than dense ones, so they are the first that erase
/// failures take. A bad SLC block is replaced by a free dense block; before, a plane whose
/// two SLC blocks had both gone bad had nothing to evict and refused every write
/// (`NoSpace`) with a handful of bad blocks in the device.
#[test]
fn bad_slc_blocks_are_replaced_and_the_device_keeps_writing() {
    let mut cfg = two_slc_blocks_per_plane(0.01);
    cfg.geometry.blocks_per_plane = 64;
    cfg.gc.hard_threshold_blocks = 4;
    cfg.gc.soft_threshold_blocks = 6;
    let mut h = Harness::new(cfg, 7);
    let cap = h.oracle.tokens.len() as u64;
    let mut rng = SimRng::new(7);
    for _ in 0..cap * 3 {
        h.write(rng.below(cap), 1);
    }
    h.random_ops(8, 2000);
    assert!(
        h.ssd.ftl_stats().slc_blocks_replaced > 0,
        "{:?}",
        h.ssd.ftl_stats()
    );
    h.check_all();
    h.ssd.check_invariants();
}

/// With too little spare to replace every SLC block that fails, a plane loses its cache and
/// writes to dense blocks; the device wears out in the end (`NoSpace`), but every write it
/// accepted reads back, and a refused write changes nothing.
#[test]
fn a_plane_that_loses_its_slc_cache_writes_past_it_and_keeps_every_accepted_write() {
    let mut cfg = two_slc_blocks_per_plane(0.05);
    // The GC reserve holds a spare block when erases can fail, which 0.25 does not cover.
    cfg.over_provisioning = 0.3;
    cfg.gc.hard_threshold_blocks = 2;
    cfg.gc.soft_threshold_blocks = 3;
    let mut h = Harness::new(cfg, 1);
    let cap = h.oracle.tokens.len() as u64;
    let mut rng = SimRng::new(1);
    let mut refused = None;
    let mut accepted = 0u64;
    for _ in 0..cap * 6 {
        if let Err(e) = h.try_write(rng.below(cap), 1) {
            refused = Some(e);
            break;
        }
        accepted += 1;
    }
    assert!(accepted > cap, "worn out after {accepted} writes");
    let stats = h.ssd.ftl_stats();
    assert!(
        stats.slc_blocks_lost > stats.slc_blocks_replaced,
        "every lost SLC block was replaced: {stats:?}"
    );
    assert!(
        matches!(refused, Some(DeviceError::NoSpace { .. })),
        "{refused:?}"
    );
    h.check_all();
    h.ssd.check_invariants();
}

/// A device of one plane whose two SLC blocks leave no spare to replace one that fails. The
/// first failed erase of an evicted SLC block used to stop the device with `NoSpace`: the
/// eviction had freed nothing, and the write then asked for an SLC page anyway. The plane
/// now writes to its dense blocks and keeps going.
#[test]
fn a_failed_erase_of_an_evicted_slc_block_does_not_stop_a_one_plane_device() {
    for seed in 0..8 {
        let mut cfg = one_plane_config(PayloadMode::Token);
        cfg.geometry.blocks_per_plane = 32;
        // 0.35 until planes kept a spare block when erases can fail: the spare is a block of
        // the margin between losing the cache's block and wearing out that this test needs.
        cfg.over_provisioning = 0.45;
        cfg.slc_cache.capacity_bytes = 2 * 8 * 4096;
        cfg.faults.erase_fail_probability = 0.02;
        let mut h = Harness::new(cfg, seed);
        let cap = h.oracle.tokens.len() as u64;
        let mut rng = SimRng::new(seed);
        let mut writes_after_loss = None;
        for _ in 0..cap * 8 {
            let lost_unreplaced = {
                let stats = h.ssd.ftl_stats();
                stats.slc_blocks_lost > stats.slc_blocks_replaced
            };
            if lost_unreplaced {
                *writes_after_loss.get_or_insert(0u64) += 1;
            }
            if let Err(e) = h.try_write(rng.below(cap), 1) {
                // Erases keep failing, so the device may wear out, but not as soon as the
                // cache has lost a block.
                let after = writes_after_loss.unwrap_or(0);
                assert!(
                    after > cap,
                    "seed {seed}: {e} after {after} writes past the lost SLC block ({:?})",
                    h.ssd.ftl_stats()
                );
                break;
            }
        }
        assert!(
            writes_after_loss.is_some(),
            "seed {seed}: no SLC block was lost without a replacement"
        );
        h.check_all();
        h.ssd.check_invariants();
    }
}

fn policy_config(index: u32) -> SsdConfig {
    let sector = if index & 1 == 0 { 4096 } else { 512 };
    let payload = if index & 2 == 0 {
        PayloadMode::Token
    } else {
        PayloadMode::Full
    };
    let mut cfg = small_config(sector, payload);
    cfg.gc.victim = [
        VictimPolicy::Greedy,
        VictimPolicy::Fifo,
        VictimPolicy::CostBenefit,
    ][(index / 4 % 3) as usize];
    match index / 12 % 3 {
        0 => {}
        1 => {
            cfg.write_buffer.capacity_bytes = 12 * 4096;
            cfg.write_buffer.policy = BufferPolicy::Fifo;
        }
        _ => {
            cfg.write_buffer.capacity_bytes = 12 * 4096;
            cfg.write_buffer.policy = BufferPolicy::Lru;
        }
    }
    if index / 36 % 2 == 1 {
        cfg.slc_cache.capacity_bytes = 8 * 2 * 8 * 4096;
        cfg.slc_cache.eviction = SlcEvictionPolicy::Transient;
    }
    cfg.wear_leveling.static_threshold_erases = if index % 5 == 0 { 4 } else { 0 };
    cfg.ftl.die_aware_window = if index % 3 == 0 { 1 } else { 4 };
    cfg.gc.incremental = index % 7 != 0;
    cfg.gc.idle_erase = index % 4 != 2;
    cfg
}

#[test]
fn every_policy_combination_keeps_data() {
    for index in 0..72 {
        let mut h = Harness::new(policy_config(index), index as u64);
        h.random_ops(index as u64, 1500);
        h.check_all();
        h.ssd.check_invariants();
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(afa_sim::proptest_cases(24)))]
    #[test]
    fn random_operations_match_the_oracle(index in 0u32..72, seed in any::<u64>(), ops in 100usize..1500) {
        let mut h = Harness::new(policy_config(index), seed);
        h.random_ops(seed, ops);
        h.check_all();
        h.ssd.check_invariants();
        prop_assert!(h.checked > 0);
    }
}

/// ScalaAFA's `convert`: the device reads a vertical hero, writes parity row `row` of its
/// data and tags at the destination (RS row 0 is XOR), deallocates the source, and sends
/// nothing over the host link; a parity row that does not exist is refused.
#[test]
fn convert_computes_parity_over_data_and_tags_in_place() {
    let mut ssd = Ssd::new(small_config(4096, PayloadMode::Full), 3).unwrap();
    let tag = ssd.info().tag_bytes_per_sector as usize;
    let (k, cs) = (3usize, 2u32);
    let unit = 4096usize;
    let mut xor = vec![0u8; cs as usize * unit];
    let mut xor_tags = vec![0u8; cs as usize * tag];
    for i in 0..k {
        let data: Vec<u8> = (0..cs as usize * unit)
            .map(|b| (b * 7 + i * 31) as u8)
            .collect();
        let tags: Vec<u8> = (0..cs as usize * tag).map(|b| (b + i * 5) as u8).collect();
        xor.iter_mut().zip(&data).for_each(|(x, d)| *x ^= d);
        xor_tags.iter_mut().zip(&tags).for_each(|(x, t)| *x ^= t);
        let cmd = Command {
            tags: Some(&tags),
            ..Command::write(100 + (i as u64) * cs as u64, cs, &data)
        };
        ssd.submit(0, &cmd, ReadBuffers::none()).unwrap();
    }
    let before = ssd.stats().host_page_writes;
    let cmd = ConvertCommand {
        src_lba: 100,
        dst_lba: 10,
        chunk_sectors: cs,
        k: k as u8,
        parity: ParityType { row: 0, of: 2 },
        trim_source: true,
    };
    let c = ssd.convert(1_000_000, &cmd).unwrap();
    assert!(c.done_ns > 1_000_000 + ssd.config().convert.engine_ns(3, 8192));
    assert_eq!(ssd.stats().convert_commands, 1);
    assert_eq!(ssd.stats().host_page_writes, before + cs as u64);
    let mut out = vec![0u8; cs as usize * unit];
    let mut out_tags = vec![0u8; cs as usize * tag];
    ssd.submit(
        c.done_ns,
        &Command::read(10, cs),
        ReadBuffers {
            data: &mut out,
            tags: Some(&mut out_tags),
        },
    )
    .unwrap();
    assert_eq!(out, xor);
    assert_eq!(out_tags, xor_tags);
    assert_eq!(ssd.scan_tags(10, cs).unwrap(), xor_tags);
    // The vertical hero is gone.
    let mut src = vec![1u8; cs as usize * unit];
    ssd.submit(
        c.done_ns,
        &Command::read(100, cs),
        ReadBuffers {
            data: &mut src,
            tags: None,
        },
    )
    .unwrap();
    assert!(src.iter().all(|&b| b == 0));
    // Without `trim_source` the source stays readable: an array behind a volatile cache
    // trims it itself once the parity is durable.
    let keep = ConvertCommand {
        src_lba: 10 + cs as u64,
        dst_lba: 40,
        k: 1,
        trim_source: false,
        ..cmd
    };
    ssd.submit(
        c.done_ns,
        &Command::write(keep.src_lba, cs, &xor),
        ReadBuffers::none(),
    )
    .unwrap();
    let kept = ssd.convert(c.done_ns, &keep).unwrap();
    ssd.submit(
        kept.done_ns,
        &Command::read(keep.src_lba, cs),
        ReadBuffers {
            data: &mut src,
            tags: None,
        },
    )
    .unwrap();
    assert_eq!(src, xor, "source kept");
    let bad = ConvertCommand {
        parity: ParityType { row: 2, of: 2 },
        ..cmd
    };
    let err = ssd.convert(c.done_ns, &bad).unwrap_err();
    assert!(err.to_string().contains("parity row 2 of 2"), "{err}");
}

/// Writes the device's whole capacity once in page-sized commands, then trims all of it:
/// every block the writes filled is left holding no valid page.
fn fill_then_trim(h: &mut Harness) {
    let cap = h.oracle.tokens.len() as u64;
    let spp = h.ssd.config().geometry.sectors_per_page();
    let mut lba = 0;
    while lba < cap {
        h.write(lba, spp);
        lba += spp as u64;
    }
    h.trim(0, cap as u32);
}

/// Gives the device idle time until it has nothing left to do; returns the time then.
fn idle_until_done(ssd: &mut Ssd, mut now_ns: u64) -> u64 {
    while let Some(next) = ssd.background(now_ns) {
        assert!(
            next > now_ns,
            "background asked to be called again at {next} <= {now_ns}"
        );
        now_ns = next;
    }
    now_ns
}

fn idle_erase_config(on: bool) -> SsdConfig {
    let mut cfg = small_config(4096, PayloadMode::Token);
    // Without background GC, any erase before a write needs a block is an idle erase.
    cfg.gc.background = false;
    cfg.gc.idle_erase = on;
    cfg
}

#[test]
fn an_idle_ssd_erases_its_trimmed_blocks_so_later_writes_pay_no_erase() {
    let mut erases_in_rewrite = Vec::new();
    let mut rewrite_ns = Vec::new();
    for on in [false, true] {
        let mut h = Harness::new(idle_erase_config(on), 5);
        fill_then_trim(&mut h);
        let filled_blocks = h.ssd.nand_counters().programs.iter().sum::<u64>()
            / h.ssd.config().geometry.pages_per_block as u64;
        h.now_ns = idle_until_done(&mut h.ssd, h.now_ns);
        let idle = h.ssd.ftl_stats().idle_erases;
        if on {
            // Every block the fill closed is erased (the open host blocks are not full).
            let planes = h.ssd.config().geometry.planes_total() as u64;
            assert!(
                idle + planes >= filled_blocks && idle > 0,
                "{idle} idle erases for {filled_blocks} filled blocks"
            );
        } else {
            assert_eq!(idle, 0, "idle erase is off");
        }
        let erases_before = h.ssd.nand_counters().erases.iter().sum::<u64>();
        let start = h.now_ns;
        fill_then_trim(&mut h);
        erases_in_rewrite.push(h.ssd.nand_counters().erases.iter().sum::<u64>() - erases_before);
        rewrite_ns.push(h.now_ns - start);
        h.check_all();
        h.ssd.check_invariants();
    }
    assert!(
        erases_in_rewrite[0] > 0,
        "without idle erase the rewrite must erase in the write path"
    );
    // Blocks the idle time erased are free for the rewrite: at most the open blocks the
    // first fill left behind still need an erase.
    let planes = idle_erase_config(true).geometry.planes_total() as u64;
    assert!(
        erases_in_rewrite[1] <= planes,
        "rewrite after idle erase still erased {} blocks",
        erases_in_rewrite[1]
    );
    assert!(
        rewrite_ns[1] < rewrite_ns[0],
        "the rewrite took {} ns after idle erase, {} ns without",
        rewrite_ns[1],
        rewrite_ns[0]
    );
}

#[test]
fn idle_erase_waits_until_the_host_has_nothing_in_flight() {
    let mut h = Harness::new(idle_erase_config(true), 6);
    fill_then_trim(&mut h);
    let cap = h.oracle.tokens.len() as u64;
    let spp = h.ssd.config().geometry.sectors_per_page();
    // A write in flight: the device is not idle before it completes.
    let data = vec![0u8; spp as usize * h.unit];
    let c = h
        .ssd
        .submit(
            h.now_ns,
            &Command::write(cap - spp as u64, spp, &data),
            ReadBuffers::none(),
        )
        .expect("write accepted");
    assert!(c.done_ns > h.now_ns);
    let next = h.ssd.background(h.now_ns);
    assert_eq!(h.ssd.ftl_stats().idle_erases, 0, "erased while busy");
    assert_eq!(
        next,
        Some(c.done_ns),
        "should look again when the write is done"
    );
    assert!(h.ssd.background(c.done_ns).is_some());
    assert!(
        h.ssd.ftl_stats().idle_erases > 0,
        "idle, yet erased nothing"
    );
}

#[test]
fn idle_erase_keeps_runs_deterministic_and_data_intact() {
    let run = |seed: u64| {
        let mut h = Harness::new(idle_erase_config(true), seed);
        for round in 0..30 {
            if round % 10 == 0 {
                // Whole trimmed blocks, which random small writes and trims seldom leave.
                fill_then_trim(&mut h);
            }
            h.random_ops(seed ^ round, 200);
            if round % 3 == 0 {
                h.now_ns = idle_until_done(&mut h.ssd, h.now_ns);
            }
        }
        h.check_all();
        h.ssd.check_invariants();
        (
            h.now_ns,
            h.ssd.ftl_stats().idle_erases,
            *h.ssd.nand_counters(),
        )
    };
    let first = run(11);
    assert!(first.1 > 0, "the random run never erased in idle time");
    assert_eq!(first, run(11));
}

/// `faults.read_fail_probability`: a host read needing a page from flash fails as
/// uncorrectable now and then; the data stays, so the reads that succeed return it, and a
/// read of sectors never written (no flash page) never fails.
#[test]
fn uncorrectable_reads_fail_the_command_and_leave_the_data() {
    let mut config = small_config(512, PayloadMode::Token);
    config.faults.read_fail_probability = 0.3;
    config.write_buffer.capacity_bytes = 0;
    let mut ssd = Ssd::new(config, 5).unwrap();
    let unit = ssd.info().payload_unit_bytes as usize;
    let mut data = vec![0u8; 8 * unit];
    for (i, sector) in data.chunks_mut(unit).enumerate() {
        fill_unit(sector_token(i as u64, 1), sector);
    }
    ssd.submit(0, &Command::write(0, 8, &data), ReadBuffers::none())
        .unwrap();
    let read = |ssd: &mut Ssd, lba: u64| {
        let mut out = vec![0u8; 8 * unit];
        let r = ssd.submit(
            1_000_000_000,
            &Command::read(lba, 8),
            ReadBuffers {
                data: &mut out,
                tags: None,
            },
        );
        r.map(|_| out)
    };
    let (mut failed, mut good) = (0, 0);
    for _ in 0..40 {
        match read(&mut ssd, 0) {
            Ok(out) => {
                assert_eq!(out, data, "a read that succeeds returns the data");
                good += 1;
            }
            Err(e) => {
                assert_eq!(e, DeviceError::Uncorrectable { lba: 0, sectors: 8 });
                assert!(e.to_string().contains("could not be read"), "{e}");
                failed += 1;
            }
        }
    }
    assert!(failed > 0 && good > 0, "{failed} failed, {good} read");
    assert_eq!(ssd.stats().uncorrectable_reads, failed);
    let unwritten = ssd.info().capacity_sectors - 8;
    for _ in 0..20 {
        assert!(
            read(&mut ssd, unwritten).is_ok(),
            "an unwritten range has no page to fail"
        );
    }
}

/// `small_config` with 16 KiB pages of four 4 KiB sectors, so that a 4 KiB trim covers a
/// quarter of a page.
fn sub_page_config(buffer_bytes: u64) -> SsdConfig {
    let mut cfg = small_config(4096, PayloadMode::Token);
    cfg.geometry.page_bytes = 16384;
    cfg.write_buffer.capacity_bytes = buffer_bytes;
    cfg
}

fn total_programs(ssd: &Ssd) -> u64 {
    ssd.nand_counters().programs.iter().sum()
}

/// Sectors that were never written already read as zero, so trimming them needs no flash
/// work at all: before, every sub-page trim wrote a page of zeroes, and trimming an empty
/// device in 4 KiB pieces programmed (and then garbage-collected) a page per piece.
#[test]
fn a_trim_of_unwritten_sectors_programs_nothing() {
    for buffer_bytes in [0, 8 * 16384] {
        let mut h = Harness::new(sub_page_config(buffer_bytes), 1);
        let cap = h.oracle.tokens.len() as u64;
        for lba in 0..cap {
            h.trim(lba, 1);
        }
        h.trim(1, 2);
        h.flush();
        assert_eq!(total_programs(&h.ssd), 0, "buffer {buffer_bytes}");
        assert_eq!(h.ssd.ftl_stats().page_writes, 0, "buffer {buffer_bytes}");
        assert_eq!(h.ssd.buffered_pages(), 0, "buffer {buffer_bytes}");
        h.check_all();
        h.ssd.check_invariants();
    }
}

/// A written page whose sectors are trimmed one piece at a time holds no data once the last
/// piece goes: it is then unmapped like a page trimmed whole, and trims of it (or of pieces
/// already trimmed) cost nothing more.
#[test]
fn sub_page_trims_that_cover_a_written_page_unmap_it() {
    for buffer_bytes in [0, 8 * 16384] {
        let mut h = Harness::new(sub_page_config(buffer_bytes), 2);
        h.write(0, 8); // pages 0 and 1
        h.flush();
        let written = total_programs(&h.ssd);
        // The first trims of page 0 must record themselves (the other sectors hold data).
        h.trim(0, 1);
        h.trim(2, 1);
        h.flush();
        let recorded = total_programs(&h.ssd);
        assert!(recorded > written, "buffer {buffer_bytes}");
        // Trimming the same sectors again changes nothing.
        h.trim(0, 1);
        h.trim(2, 1);
        h.flush();
        assert_eq!(total_programs(&h.ssd), recorded, "buffer {buffer_bytes}");
        // Sector 1 still leaves sector 3 holding data, so it is recorded too; sector 3 then
        // completes the page, which is dropped without a program.
        h.trim(1, 1);
        h.flush();
        let recorded = total_programs(&h.ssd);
        h.trim(3, 1);
        h.flush();
        assert_eq!(total_programs(&h.ssd), recorded, "buffer {buffer_bytes}");
        assert_eq!(
            h.ssd.allocation(0, 8),
            Some(vec![(4, false), (4, true)]),
            "buffer {buffer_bytes}"
        );
        h.trim(0, 4);
        h.trim(1, 2);
        h.flush();
        assert_eq!(total_programs(&h.ssd), recorded, "buffer {buffer_bytes}");
        // A rewrite of a trimmed sector makes it hold data again: trimming it records again.
        h.write(5, 1);
        h.trim(4, 1);
        h.write(4, 1);
        h.trim(5, 3);
        h.flush();
        h.check_all();
        h.ssd.check_invariants();
    }
}

/// Two concurrent trims of a whole never-written device with an SLC cache, in 4 KiB pieces
/// of 8 KiB pages, used to write a page of zeroes per piece and run out of space. Trims of
/// data that is not there must not consume space.
#[test]
fn concurrent_sub_page_trims_of_an_empty_slc_device_succeed_without_programs() {
    let mut cfg = small_config(4096, PayloadMode::None);
    cfg.geometry.page_bytes = 8192;
    cfg.slc_cache.capacity_bytes = 8 * 2 * 8 * 8192;
    let mut ssd = Ssd::new(cfg, 3).expect("valid config");
    let cap = ssd.info().capacity_sectors;
    let mut now_ns = 0;
    // The two streams interleave, each walking the device sector by sector.
    for lba in 0..cap {
        for _stream in 0..2 {
            let c = ssd
                .submit(now_ns, &Command::trim(lba, 1), ReadBuffers::none())
                .expect("a trim of an empty device succeeds");
            now_ns = c.done_ns;
        }
    }
    assert_eq!(total_programs(&ssd), 0);
    ssd.check_invariants();
}

/// Writes `rounds` passes over the whole device: `streams` interleaved sequential writers of
/// `sectors` sectors each, all starting at sector 0, as concurrent sequential jobs do.
fn sequential_streams(h: &mut Harness, streams: u64, sectors: u32, rounds: u64) {
    let cap = h.oracle.tokens.len() as u64;
    let steps = cap / sectors as u64;
    for _ in 0..rounds {
        for step in 0..steps {
            for _ in 0..streams {
                h.write(step * sectors as u64, sectors);
            }
        }
    }
}

/// With an SLC cache, a host page always went to the next plane's SLC block, and a full SLC
/// block was migrated into the plane's dense blocks even when GC could not restore their
/// reserve. A plane that happened to hold more valid data than the others (die-aware
/// allocation steers writes by die, overlapping read-modify-writes invalidate pages in
/// other planes than they write) then filled its reserve until a relocation found no block,
/// and the device reported no space while well short of full. Such a plane must send host
/// pages elsewhere, as it does without an SLC cache.
#[test]
fn slc_cache_sends_writes_away_from_a_plane_whose_dense_blocks_are_full() {
    // Die-aware allocation in plane-first order, page-sized sequential writes.
    let mut cfg = small_config(4096, PayloadMode::Token);
    cfg.slc_cache.capacity_bytes = 8 * 2 * 8 * 4096;
    cfg.ftl.allocation_order = "PCWD".into();
    cfg.ftl.die_aware_window = 2;
    cfg.geometry.blocks_per_plane = 64;
    cfg.over_provisioning = 0.1;
    let mut h = Harness::new(cfg, 1);
    sequential_streams(&mut h, 1, 1, 6);
    h.check_all();
    h.ssd.check_invariants();
    // Two concurrent sequential writers of half pages on 8 KiB pages.
    let mut cfg = small_config(4096, PayloadMode::Token);
    cfg.geometry.page_bytes = 8192;
    cfg.slc_cache.capacity_bytes = 8 * 2 * 8 * 8192;
    cfg.geometry.blocks_per_plane = 64;
    cfg.over_provisioning = 0.1;
    let mut h = Harness::new(cfg, 1);
    sequential_streams(&mut h, 2, 1, 3);
    h.check_all();
    h.ssd.check_invariants();
}

/// A program that fails closes its block, so the relocation it interrupts needs one free
/// block more than it planned. GC used to start only once a plane was below the hard
/// threshold and could take the plane's last free block; a failure then left the victim's
/// remaining valid pages with nowhere to go, and the device reported no space at half its
/// raw capacity after a handful of failures. Planes now keep a spare free block when
/// programs can fail.
#[test]
fn a_failed_program_during_gc_does_not_run_the_device_out_of_space() {
    let mut cfg = one_plane_config(PayloadMode::None);
    cfg.geometry.blocks_per_plane = 95;
    cfg.geometry.pages_per_block = 120;
    cfg.over_provisioning = 1.0;
    cfg.faults.program_fail_probability = 1e-4;
    let mut ssd = Ssd::new(cfg, 1).expect("valid config");
    let cap = ssd.info().capacity_sectors;
    let data = vec![0u8; 32 * ssd.info().payload_unit_bytes as usize];
    let mut rng = SimRng::new(1);
    let mut now_ns = 0;
    for _ in 0..6000 {
        let lba = rng.below(cap / 32) * 32;
        let c = ssd
            .submit(now_ns, &Command::write(lba, 32, &data), ReadBuffers::none())
            .expect("a few failed programs leave plenty of space");
        now_ns = c.done_ns;
    }
    assert!(ssd.nand_counters().program_failures > 0);
    ssd.check_invariants();
}

/// Die-aware allocation over planes that lose blocks to failed programs: a plane that
/// refuses a page takes no die time, so its die looks idle and the die-aware choice picked
/// it again. The retries of one page could all land on the full planes, and the device
/// said it had no space with most of its other planes free, after losing a few of its 256
/// blocks (config soak, seed 6265: 18 of a member's). Now a page goes to a plane that has not refused it,
/// and the device keeps writing until it has lost far more.
#[test]
fn die_aware_allocation_does_not_retry_a_plane_that_refused_the_page() {
    for seed in 0..8 {
        let mut cfg = small_config(4096, PayloadMode::Token);
        cfg.geometry.blocks_per_plane = 32;
        cfg.geometry.pages_per_block = 32;
        cfg.over_provisioning = 0.45;
        cfg.ftl.allocation_order = "PCWD".to_string();
        cfg.ftl.die_aware_window = 1000;
        cfg.gc.hard_threshold_blocks = 3;
        cfg.gc.soft_threshold_blocks = 3;
        cfg.gc.incremental = true;
        cfg.faults.program_fail_probability = 2e-4;
        let blocks = 2 * 2 * 2 * 32;
        let mut h = Harness::new(cfg, seed);
        let cap = h.oracle.tokens.len() as u64;
        let mut rng = SimRng::new(seed);
        for _ in 0..cap * 160 {
            if let Err(e) = h.try_write(rng.below(cap), 1) {
                // Failed programs keep retiring blocks, so the device wears out, but only
                // once it has lost a large share of them (47 to 60 here; 9 at seed 0 before).
                let retired = h.ssd.ftl_stats().blocks_retired;
                assert!(
                    retired * 8 >= blocks,
                    "seed {seed}: {e} with only {retired} of {blocks} blocks retired"
                );
                break;
            }
        }
        h.check_all();
        h.ssd.check_invariants();
    }
}

/// A plane can hold garbage it cannot reclaim alone: its victim's valid pages need more
/// room than its relocation block has left, and failed erases took the free blocks that the
/// relocation would have opened. With die-aware allocation the other plane may by then hold
/// almost nothing but valid data, so every plane refused the write and the device said it
/// had no space with a third of a plane's pages garbage (config soak, seed 8030, before
/// planes kept a spare block for failed erases). The victim's pages that do not fit now go
/// to another plane's relocation block, and a device refuses a write only when no block in
/// it could be cleaned with the room of all its planes.
#[test]
fn a_plane_whose_victim_does_not_fit_relocates_the_rest_to_another_plane() {
    let mut across = 0;
    for seed in 0..8 {
        let mut cfg = small_config(4096, PayloadMode::Token);
        cfg.geometry.dies_per_chip = 1;
        cfg.geometry.planes_per_die = 1;
        cfg.geometry.blocks_per_plane = 32;
        cfg.geometry.pages_per_block = 64;
        cfg.over_provisioning = 0.2635;
        cfg.ftl.die_aware_window = 1000;
        cfg.gc.hard_threshold_blocks = 2;
        // Erases fail often enough that two fail in a row now and then.
        cfg.faults.erase_fail_probability = 3e-2;
        let mut h = Harness::new(cfg, seed);
        let cap = h.oracle.tokens.len() as u64;
        let mut rng = SimRng::new(seed);
        for _ in 0..cap * 60 {
            if let Err(e) = h.try_write(rng.below(cap), 1) {
                // Failed erases wear the device out in the end, but it refuses a write only
                // with nothing left it could clean.
                assert_eq!(
                    h.ssd.reclaimable_block(),
                    None,
                    "seed {seed}: {e} with a block it could clean ({:?})",
                    h.ssd.ftl_stats()
                );
                break;
            }
        }
        across += h.ssd.ftl_stats().gc_pages_moved_across_planes;
        h.check_all();
        h.ssd.check_invariants();
    }
    assert!(across > 0, "no seed needed another plane's room");
}

/// A failed erase gives back no block for the one its relocation took. A plane that was one
/// block below the hard threshold when GC started was then left with no free block, and
/// when its relocation block had less room than the next victim's valid pages, nothing could
/// be reclaimed: the device said it had no space with a third of its pages garbage and two
/// failed erases (config soak, seed 9145). A plane keeps a spare free block when erases can
/// fail, as it does when programs can.
#[test]
fn failed_erases_do_not_leave_a_plane_with_garbage_it_cannot_reclaim() {
    for seed in 0..8 {
        let mut cfg = one_plane_config(PayloadMode::Token);
        cfg.geometry.blocks_per_plane = 64;
        cfg.geometry.pages_per_block = 96;
        cfg.over_provisioning = 0.2844;
        cfg.gc.victim = VictimPolicy::Fifo;
        cfg.faults.erase_fail_probability = 2e-3;
        let mut h = Harness::new(cfg, seed);
        let cap = h.oracle.tokens.len() as u64;
        // Blocks beyond what the logical space fills.
        let spare_blocks = 64.0 - cap as f64 / 96.0;
        let mut rng = SimRng::new(seed);
        for _ in 0..cap * 40 {
            if let Err(e) = h.try_write(rng.below(cap), 1) {
                // The device wears out once failed erases have taken most of its spare
                // blocks (12 of 14.2 here; 3 at seed 0 without the spare).
                let retired = h.ssd.ftl_stats().blocks_retired;
                assert!(
                    retired as f64 >= 0.7 * spare_blocks,
                    "seed {seed}: {e} with only {retired} blocks retired"
                );
                break;
            }
        }
        h.check_all();
        h.ssd.check_invariants();
    }
}
