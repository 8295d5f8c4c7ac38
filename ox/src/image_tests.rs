//! Tests of the flash image and the served device: metadata blobs as WBLOCK bytes, the image
//! round trip (programs, erases, metadata, bad blocks), and recovery from an image left by
//! a controller that never stopped in order.

use std::collections::BTreeMap;
use std::path::PathBuf;

use afa_sim::SimRng;
use afa_ssd::{BlockDevice, Command, DeviceError, QueuedDevice, ReadBuffers};

use crate::image::KIND_TABLE;
use crate::log::{GcMove, LogBlock, LogRecord, RdescEntry};
use crate::tables::{TableId, TablePage};
use crate::tests::small_config;
use crate::*;

/// A fresh directory for one test's image, removed when the guard drops.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("afa-ox-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    fn image(&self) -> PathBuf {
        self.0.join("ox-flash.img")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn sample_blobs() -> Vec<(MetaBlob, Tag)> {
    let log = LogBlock {
        seq: 42,
        records: vec![
            (
                7,
                LogRecord::Rdesc {
                    ctx: 3,
                    entries: vec![
                        RdescEntry {
                            lpid: 9,
                            prior: Ppa::NONE,
                            new: Ppa(1234),
                        },
                        RdescEntry {
                            lpid: 10,
                            prior: Ppa(5),
                            new: Ppa::NONE,
                        },
                    ],
                },
            ),
            (
                8,
                LogRecord::RdescA {
                    ctx: 3,
                    amendments: vec![(0, Ppa(99))],
                },
            ),
            (9, LogRecord::Done { ctx: 3 }),
            (
                10,
                LogRecord::Gc {
                    victim: 17,
                    erase_count: 5,
                    moves: vec![GcMove {
                        lpid: 4,
                        prior: Ppa(70),
                        new: Ppa(700),
                    }],
                },
            ),
            (
                11,
                LogRecord::Erase {
                    block: 17,
                    erase_count: 6,
                },
            ),
            (
                12,
                LogRecord::CkptPages {
                    ckpt: 2,
                    pages: vec![(TableId::Map, 0, 33), (TableId::Wear, 1, 34)],
                },
            ),
        ],
        prev: Some(77),
        links: vec![80, 81],
    };
    let table = TablePage {
        table: TableId::GbitvS,
        index: 3,
        words: vec![1, u64::MAX, 0, 5],
    };
    let rec = CheckpointRecord {
        seq: 5,
        timestamp_ns: 123_456,
        rssp_lsn: 44,
        rssp_block_seq: 6,
        rssp_links: vec![10, 11],
        map_t: vec![1, 2, 3],
        gbitv_t: vec![4],
        wear_s: vec![5, 6],
        channel_cursors: [1, 2, 3, 0],
        next_ctx: 19,
        next_gc_seq: 8,
        revision: 2,
        log_bridges: vec![(7, vec![90, 91]), (9, vec![])],
    };
    vec![
        (MetaBlob::Log(log), Tag::new(TagKind::Log, 0, 42)),
        (
            MetaBlob::Table(table),
            Tag::new(TagKind::Table, 4 << 32 | 3, 11),
        ),
        (
            MetaBlob::Checkpoint(Box::new(rec)),
            Tag::new(TagKind::Checkpoint, 0, 5),
        ),
        (
            MetaBlob::Bbt {
                version: 3,
                bad: vec![2, 9],
            },
            Tag::new(TagKind::Bbt, 1, 3),
        ),
    ]
}

/// A WEAR page holds `wblock_bytes / 4` erase counts. Written as 8-byte words it took
/// twice its WBLOCK, so a served device of more than `wblock_bytes / 8` EBLOCKs failed its
/// first checkpoint ("a table page blob of 12800 bytes does not fit in a 8192-byte
/// WBLOCK", 1,600 EBLOCKs); it is written as 4-byte words now, and a WEAR page of the old
/// kind still reads.
#[test]
fn a_full_wear_page_fits_its_wblock_and_an_old_one_still_reads() {
    let full = TablePage {
        table: TableId::Wear,
        index: 1,
        words: (0..2048u64).map(|i| i * 7).collect(),
    };
    let tag = Tag::new(TagKind::Table, 5 << 32 | 1, 9);
    let blob = MetaBlob::Table(full);
    let (kind, bytes) = encode_meta(&blob, 8192).unwrap();
    assert_eq!(bytes.len(), 8192);
    assert_eq!(decode_meta(kind, &bytes, tag).unwrap(), blob);
    let old = TablePage {
        table: TableId::Wear,
        index: 1,
        words: vec![3, 0, 12],
    };
    let old_bytes: Vec<u8> = old.words.iter().flat_map(|w| w.to_le_bytes()).collect();
    assert_eq!(
        decode_meta(KIND_TABLE, &old_bytes, tag).unwrap(),
        MetaBlob::Table(old)
    );
}

/// A checkpoint record of the image version before log bridges ends after its WEAR_S
/// list; it still reads, as revision 0 without bridges.
#[test]
fn a_checkpoint_record_without_revision_and_bridges_still_reads() {
    let (blob, tag) = sample_blobs().swap_remove(2);
    let (kind, bytes) = encode_meta(&blob, 8192).unwrap();
    // The revision (4 bytes), the count (4) and the bridges (8 + 4 + 8 and 8 + 4).
    let old = &bytes[..bytes.len() - 4 - 4 - 20 - 12];
    let MetaBlob::Checkpoint(mut rec) = blob else {
        panic!("the sample's third blob is a checkpoint record");
    };
    rec.revision = 0;
    rec.log_bridges.clear();
    assert_eq!(
        decode_meta(kind, old, tag).unwrap(),
        MetaBlob::Checkpoint(rec)
    );
}

#[test]
fn metadata_blobs_round_trip_through_wblock_bytes() {
    for (blob, tag) in sample_blobs() {
        let (kind, bytes) = encode_meta(&blob, 8192).unwrap();
        assert!(bytes.len() <= 8192);
        assert_eq!(decode_meta(kind, &bytes, tag).unwrap(), blob);
        // A truncated blob is an error, not a panic or a shorter blob.
        if bytes.len() > 1 {
            assert!(decode_meta(kind, &bytes[..bytes.len() - 1], tag).is_err());
        }
    }
}

#[test]
fn a_blob_larger_than_its_wblock_is_refused() {
    let page = MetaBlob::Table(TablePage {
        table: TableId::Map,
        index: 0,
        words: vec![0; 1025],
    });
    let err = encode_meta(&page, 8192).unwrap_err();
    assert!(err.contains("does not fit in a 8192-byte WBLOCK"), "{err}");
    let fits = MetaBlob::Table(TablePage {
        table: TableId::Map,
        index: 0,
        words: vec![0; 1024],
    });
    assert!(encode_meta(&fits, 8192).is_ok());
}

/// The bytes of one sector of version `version` of LBA `lba`: distinct for every pair.
fn sector_bytes(lba: u64, version: u64) -> Vec<u8> {
    let word = afa_nand::sector_token(lba, version);
    (0..512u64)
        .flat_map(|i| (word ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).to_le_bytes())
        .collect()
}

/// Writes `writes` random runs of 1..=8 sectors over the first `span` LBAs (so GC runs once
/// the span is overwritten a few times); returns the oracle of acknowledged bytes.
fn write_random(
    d: &mut OxServedDevice,
    rng: &mut SimRng,
    writes: u32,
    span: u64,
    oracle: &mut BTreeMap<u64, Vec<u8>>,
    version: &mut u64,
) {
    let mut t = d.controller().now_ns();
    for _ in 0..writes {
        let sectors = 1 + rng.below(8) as u32;
        let lba = rng.below(span - sectors as u64);
        *version += 1;
        let data: Vec<u8> = (0..sectors as u64)
            .flat_map(|i| sector_bytes(lba + i, *version))
            .collect();
        let c = d
            .submit(t, &Command::write(lba, sectors, &data), ReadBuffers::none())
            .unwrap();
        t = c.done_ns;
        for i in 0..sectors as u64 {
            oracle.insert(lba + i, sector_bytes(lba + i, *version));
        }
    }
}

/// The bytes of `sectors` sectors from `lba`, read at `t`.
fn read_sectors(d: &mut OxServedDevice, t: u64, lba: u64, sectors: u32) -> Vec<u8> {
    let mut out = vec![0u8; sectors as usize * 4096];
    d.submit(
        t,
        &Command::read(lba, sectors),
        ReadBuffers {
            data: &mut out,
            tags: None,
        },
    )
    .unwrap();
    out
}

fn check_oracle(d: &mut OxServedDevice, oracle: &BTreeMap<u64, Vec<u8>>, span: u64) {
    let t = d.controller().now_ns();
    for lba in 0..span {
        let out = read_sectors(d, t, lba, 1);
        match oracle.get(&lba) {
            Some(want) => assert!(out == *want, "LBA {lba} reads other bytes"),
            None => assert!(out.iter().all(|&b| b == 0), "LBA {lba} never written"),
        }
    }
}

#[test]
fn the_image_round_trip_restores_programs_erases_metadata_and_bad_blocks() {
    let dir = TempDir::new("round-trip");
    let mut cfg = small_config();
    cfg.faults.program_fail_probability = 0.003;
    cfg.faults.factory_bad_block_fraction = 0.02;
    let image = FlashImage::create(&dir.image(), &cfg).unwrap();
    let mut d = OxServedDevice::format(&cfg, 5, image).unwrap();
    let mut rng = SimRng::new(5);
    let mut oracle = BTreeMap::new();
    let mut version = 0;
    write_random(&mut d, &mut rng, 3000, 3000, &mut oracle, &mut version);
    let ctrl = d.into_controller();
    let original = ctrl.media();
    assert!(original.counters().erases > 0, "no erase happened");
    assert!(
        original.counters().program_failures > 0,
        "no program failed"
    );
    assert!(
        (0..original.eblocks_total()).any(|b| original.is_bad(b)),
        "no bad EBLOCK"
    );
    assert!(ctrl.stats().eblocks_retired > 0, "no EBLOCK was retired");
    let image = FlashImage::open(&dir.image(), &cfg).unwrap();
    let (restored, torn) = Media::restore(&cfg, 5, image).unwrap();
    assert_eq!(torn, 0);
    let mut metas = 0;
    for block in 0..original.eblocks_total() {
        assert_eq!(
            restored.is_bad(block),
            original.is_bad(block),
            "EBLOCK {block}"
        );
        assert_eq!(
            restored.erase_count(block),
            original.erase_count(block),
            "EBLOCK {block}"
        );
        if original.is_bad(block) {
            continue;
        }
        assert_eq!(
            restored.write_pointer(block),
            original.write_pointer(block),
            "EBLOCK {block}"
        );
        let first = original.first_ppn(block);
        for ppn in first..first + original.write_pointer(block) {
            assert_eq!(restored.meta_of(ppn), original.meta_of(ppn), "WBLOCK {ppn}");
            metas += original.meta_of(ppn).is_some() as u32;
            for i in 0..original.rblocks_per_wblock() {
                let ppa = original.ppa(ppn, i);
                assert_eq!(restored.tag_of(ppa), original.tag_of(ppa), "RBLOCK {ppa:?}");
                assert_eq!(
                    restored.token_of(ppa),
                    original.token_of(ppa),
                    "RBLOCK {ppa:?}"
                );
            }
        }
    }
    assert!(metas > 0);
}

#[test]
fn recovery_from_the_image_of_a_dropped_controller_keeps_every_acknowledged_write() {
    let dir = TempDir::new("recovery");
    let mut cfg = small_config();
    cfg.faults.program_fail_probability = 0.002;
    let span = 3000;
    let image = FlashImage::create(&dir.image(), &cfg).unwrap();
    let mut d = OxServedDevice::format(&cfg, 8, image).unwrap();
    let mut rng = SimRng::new(8);
    let mut oracle = BTreeMap::new();
    let mut version = 0;
    write_random(&mut d, &mut rng, 2500, span, &mut oracle, &mut version);
    let stats = *d.controller().stats();
    assert!(stats.gc_victims > 0, "GC never ran: {stats:?}");
    assert!(stats.checkpoints > 1, "no checkpoint after the format");
    // No orderly stop: the controller, its DRAM tables and open contexts just go, as when
    // the process is killed. Only the image remains.
    drop(d);
    let image = FlashImage::open(&dir.image(), &cfg).unwrap();
    let (mut d, report) = OxServedDevice::recover(&cfg, 8, image).unwrap();
    assert!(report.records_redone > 0, "{report:?}");
    check_oracle(&mut d, &oracle, span);
    d.controller().check_invariants().unwrap();
    // The recovered device takes new writes (GC included) and recovers again.
    write_random(&mut d, &mut rng, 1500, span, &mut oracle, &mut version);
    drop(d);
    let image = FlashImage::open(&dir.image(), &cfg).unwrap();
    let (mut d, _) = OxServedDevice::recover(&cfg, 8, image).unwrap();
    check_oracle(&mut d, &oracle, span);
}

/// Served with the write-back cache, a read of a version the cache still holds takes its
/// bytes from the stage, a trimmed one reads zeroes, and a flush drains the cache into the
/// image, so a kill after it keeps every write.
#[test]
fn a_served_device_with_a_write_back_cache_reads_its_cache_and_a_flush_makes_it_durable() {
    let dir = TempDir::new("write-back");
    let mut cfg = small_config();
    cfg.write_cache.write_back = true;
    let span = 3000;
    let image = FlashImage::create(&dir.image(), &cfg).unwrap();
    let mut d = OxServedDevice::format(&cfg, 9, image).unwrap();
    let mut rng = SimRng::new(9);
    let mut oracle = BTreeMap::new();
    let mut version = 0;
    write_random(&mut d, &mut rng, 2500, span, &mut oracle, &mut version);
    assert!(d.controller().write_cache_bytes() > 0);
    let t = d.controller().now_ns();
    d.submit(t, &Command::trim(100, 8), ReadBuffers::none())
        .unwrap();
    for lba in 100..108 {
        oracle.remove(&lba);
    }
    write_random(&mut d, &mut rng, 20, span, &mut oracle, &mut version);
    // Read right after it is acknowledged, a write is still in the cache.
    version += 1;
    let data: Vec<u8> = (0..8)
        .flat_map(|i| sector_bytes(2000 + i, version))
        .collect();
    let t = d.controller().now_ns();
    let w = d
        .submit(t, &Command::write(2000, 8, &data), ReadBuffers::none())
        .unwrap();
    for i in 0..8 {
        oracle.insert(2000 + i, sector_bytes(2000 + i, version));
    }
    let out = read_sectors(&mut d, w.done_ns, 2000, 8);
    assert!(
        out == data,
        "a read right after the write returned other bytes"
    );
    // A trim right after: the cache holds it, and the sectors read as zeroes.
    let t = d.controller().now_ns();
    let trim = d
        .submit(t, &Command::trim(2000, 4), ReadBuffers::none())
        .unwrap();
    for lba in 2000..2004 {
        oracle.remove(&lba);
    }
    let out = read_sectors(&mut d, trim.done_ns, 2000, 8);
    assert!(
        out[..4 * 4096].iter().all(|&b| b == 0),
        "a cached trim read data"
    );
    assert!(out[4 * 4096..] == data[4 * 4096..]);
    check_oracle(&mut d, &oracle, span);
    let stats = *d.controller().stats();
    assert!(
        stats.write_cache_read_rblocks > 0,
        "no read hit the cache: {stats:?}"
    );
    assert!(stats.gc_victims > 0, "GC never ran: {stats:?}");
    let t = d.controller().now_ns();
    d.submit(t, &Command::flush(), ReadBuffers::none()).unwrap();
    assert_eq!(d.controller().write_cache_bytes(), 0);
    // Killed after the flush: the image holds every write.
    drop(d);
    let image = FlashImage::open(&dir.image(), &cfg).unwrap();
    let (mut d, _) = OxServedDevice::recover(&cfg, 9, image).unwrap();
    check_oracle(&mut d, &oracle, span);
    d.controller().check_invariants().unwrap();
}

/// Serve mode passes FUA down instead of flushing the whole volume, so a FUA write must
/// itself be durable: installed past the write-back cache and synced to the image.
#[test]
fn a_fua_write_is_installed_and_synced() {
    let dir = TempDir::new("fua");
    let mut cfg = small_config();
    cfg.write_cache.write_back = true;
    let span = 3000;
    let image = FlashImage::create(&dir.image(), &cfg).unwrap();
    let mut d = OxServedDevice::format(&cfg, 10, image).unwrap();
    let mut rng = SimRng::new(10);
    let mut oracle = BTreeMap::new();
    let mut version = 0;
    write_random(&mut d, &mut rng, 30, span, &mut oracle, &mut version);
    assert!(d.controller().write_cache_bytes() > 0);
    let syncs = |d: &OxServedDevice| d.controller().media().image().unwrap().syncs();
    let before = syncs(&d);
    version += 1;
    let data: Vec<u8> = (0..8)
        .flat_map(|i| sector_bytes(2500 + i, version))
        .collect();
    let mut fua = Command::write(2500, 8, &data);
    fua.flags.fua = true;
    let t = d.controller().now_ns();
    d.submit(t, &fua, ReadBuffers::none()).unwrap();
    assert!(syncs(&d) > before, "a FUA write left the image unsynced");
    // Killed without a flush: the FUA write is kept.
    drop(d);
    let image = FlashImage::open(&dir.image(), &cfg).unwrap();
    let (mut d, _) = OxServedDevice::recover(&cfg, 10, image).unwrap();
    let t = d.controller().now_ns();
    assert!(
        read_sectors(&mut d, t, 2500, 8) == data,
        "the FUA write was lost"
    );
}

#[test]
fn an_in_memory_device_returns_the_bytes_written() {
    let cfg = small_config();
    let mut d = OxServedDevice::format(&cfg, 2, FlashImage::in_memory(&cfg)).unwrap();
    assert_eq!(d.info().payload_unit_bytes, d.info().sector_bytes);
    let mut rng = SimRng::new(2);
    let mut oracle = BTreeMap::new();
    let mut version = 0;
    write_random(&mut d, &mut rng, 2000, 2000, &mut oracle, &mut version);
    assert!(d.controller().stats().gc_victims > 0);
    check_oracle(&mut d, &oracle, 2000);
}

#[test]
fn a_torn_slot_restores_as_a_consumed_wblock_and_a_tampered_one_fails_the_read() {
    let dir = TempDir::new("torn");
    let cfg = small_config();
    let image = FlashImage::create(&dir.image(), &cfg).unwrap();
    let mut d = OxServedDevice::format(&cfg, 3, image).unwrap();
    let data = sector_bytes(7, 1);
    d.submit(0, &Command::write(7, 1, &data), ReadBuffers::none())
        .unwrap();
    let ppa = d.controller().peek_mapping(7);
    let media = d.controller().media();
    let spp = media.rblocks_per_wblock() as u64;
    let ppn = (ppa.0 / spp) as u32;
    let index = ppa.0 % spp;
    drop(d);
    // Flip one byte of the RBLOCK's bytes in the file: the slot's checksum no longer holds.
    let layout_slots = {
        let table = cfg.eblocks_total() as u64 * 16;
        4096 + table.div_ceil(4096) * 4096
    };
    let slot = layout_slots + ppn as u64 * (4096 + cfg.terms.wblock_bytes as u64);
    let at = slot + 4096 + index * 4096 + 100;
    let mut bytes = std::fs::read(dir.image()).unwrap();
    bytes[at as usize] ^= 0xff;
    std::fs::write(dir.image(), &bytes).unwrap();
    let image = FlashImage::open(&dir.image(), &cfg).unwrap();
    let (media, torn) = Media::restore(&cfg, 3, image).unwrap();
    assert_eq!(torn, 1);
    assert_eq!(media.tag_of(ppa), Tag::EMPTY);
    // A device that reads a slot whose token is not the one the controller returned fails
    // the read instead of returning other bytes.
    let image = FlashImage::open(&dir.image(), &cfg).unwrap();
    let (mut d, report) = OxServedDevice::recover(&cfg, 3, image).unwrap();
    assert_eq!(report.torn_wblocks, 1);
    let mut out = vec![0u8; 4096];
    let r = d.submit(
        d.controller().now_ns(),
        &Command::read(7, 1),
        ReadBuffers {
            data: &mut out,
            tags: None,
        },
    );
    // The write's context had a durable `done` but its WBLOCK is torn: MAP points at an
    // RBLOCK that holds nothing, which the device reports instead of returning zeros.
    assert!(matches!(r, Err(DeviceError::Medium(_))), "{r:?}");
}

#[test]
fn an_image_of_another_medium_or_no_image_at_all_is_refused() {
    let dir = TempDir::new("shape");
    let cfg = small_config();
    drop(FlashImage::create(&dir.image(), &cfg).unwrap());
    // Creating over an existing image never truncates it.
    assert!(FlashImage::create(&dir.image(), &cfg).is_err());
    let mut other = cfg.clone();
    other.eblocks_per_lun += 8;
    let err = FlashImage::open(&dir.image(), &other)
        .unwrap_err()
        .to_string();
    assert!(err.contains("but the configuration gives"), "{err}");
    std::fs::write(dir.0.join("not-an-image"), vec![0u8; 8192]).unwrap();
    let err = FlashImage::open(&dir.0.join("not-an-image"), &cfg)
        .unwrap_err()
        .to_string();
    assert!(err.contains("is not an OX flash image"), "{err}");
    // An image that was created but never formatted holds no checkpoint to recover from.
    let image = FlashImage::open(&dir.image(), &cfg).unwrap();
    let err = OxServedDevice::recover(&cfg, 1, image)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no checkpoint record"), "{err}");
}

/// Compares two media WBLOCK by WBLOCK: write pointers, erase counts, bad flags, TAGs,
/// tokens and metadata.
fn assert_same_medium(a: &Media, b: &Media) {
    for block in 0..a.eblocks_total() {
        assert_eq!(a.is_bad(block), b.is_bad(block), "EBLOCK {block}");
        assert_eq!(a.erase_count(block), b.erase_count(block), "EBLOCK {block}");
        if a.is_bad(block) {
            continue;
        }
        assert_eq!(
            a.write_pointer(block),
            b.write_pointer(block),
            "EBLOCK {block}"
        );
        let first = a.first_ppn(block);
        for ppn in first..first + a.write_pointer(block) {
            assert_eq!(a.meta_of(ppn), b.meta_of(ppn), "WBLOCK {ppn}");
            for i in 0..a.rblocks_per_wblock() {
                let ppa = a.ppa(ppn, i);
                assert_eq!(a.tag_of(ppa), b.tag_of(ppa), "RBLOCK {ppa:?}");
                assert_eq!(a.token_of(ppa), b.token_of(ppa), "RBLOCK {ppa:?}");
            }
        }
    }
}

#[test]
fn a_power_loss_tears_the_same_wblocks_in_the_image_as_in_the_medium() {
    let dir = TempDir::new("power-loss");
    let cfg = small_config();
    let image = FlashImage::create(&dir.image(), &cfg).unwrap();
    let mut c = OxController::format_media(Media::with_image(&cfg, 13, image).unwrap()).unwrap();
    let mut rng = SimRng::new(13);
    // A first phase run batch by batch, long enough for GC and checkpoints to erase; then
    // overlapping batches, so that programs are in flight when the power fails.
    let mut t = 0;
    let mut version = 0;
    for k in 0..700 {
        let n = 1 + rng.below(40) as usize;
        let pages: Vec<(u64, u64)> = (0..n)
            .map(|_| {
                let l = rng.below(cfg.logical_pages);
                version += 1;
                (l, afa_nand::sector_token(l, version))
            })
            .collect();
        let image = c.image_mut().unwrap();
        for &(l, token) in &pages {
            image.stage(token, &sector_bytes(l, token));
        }
        let buffer = BatchBuffer::new(&pages, cfg.terms.rblock_bytes).unwrap();
        let id = c.submit(t, Request::FlushBatch(buffer)).unwrap();
        if k < 650 {
            t = c.run_until_complete(id).unwrap().done_ns;
        } else {
            t += 100_000 + rng.below(300_000);
            c.advance_to(t);
        }
    }
    assert_eq!(c.media().image().unwrap().error(), None);
    let off = c.power_loss(t);
    assert!(off.torn_wblocks > 0, "nothing was in flight at the cut");
    assert!(off.media.counters().erases > 0);
    // The powered-off medium still writes its image as it recovers, so the restored one
    // gets a copy of the file as the power loss left it.
    let copy = dir.0.join("copy.img");
    std::fs::copy(dir.image(), &copy).unwrap();
    let image = FlashImage::open(&copy, &cfg).unwrap();
    let (restored, _) = Media::restore(&cfg, 13, image).unwrap();
    assert_same_medium(&off.media, &restored);
    // Both recover to the same MAP, and the image holds the bytes of every mapped RBLOCK.
    let at = off.at_ns;
    let (a, _) = OxController::recover(off, at).unwrap();
    let restored = PoweredOff {
        media: restored,
        at_ns: at,
        torn_wblocks: 0,
        drain_ns: 0,
    };
    let (b, _) = OxController::recover(restored, at).unwrap();
    let map = b.debug_map();
    assert_eq!(a.debug_map(), map);
    let image = b.media().image().unwrap();
    for (lpid, ppa) in map.into_iter().enumerate() {
        if ppa.is_none() {
            continue;
        }
        let (tag, token, bytes) = image.read_user(ppa).unwrap();
        assert_eq!(tag.lpid, lpid as u64);
        assert!(bytes == sector_bytes(lpid as u64, token), "LPID {lpid}");
    }
}

/// A command under way on the queued interface, with what its completion is checked against.
enum InFlight {
    /// The LBAs written and the bytes of each.
    Write(u64, Vec<Vec<u8>>),
    /// The LBAs read and, for each, every version it may return: the one acknowledged when
    /// the read started, and any a write started meanwhile (overlapping commands have no
    /// order).
    Read(u64, Vec<Vec<Vec<u8>>>),
    Trim(u64, u32),
    Flush,
}

/// Serves random overlapping writes, reads, trims and flushes through the queued interface
/// with up to 24 commands in flight (writes to LBAs being read included, so that a write
/// moves MAP on before an earlier read completes), checks every read, and returns the
/// oracle and how many reads had a write race them.
fn drive_queued(
    d: &mut OxServedDevice,
    rng: &mut SimRng,
    commands: u64,
    span: u64,
    oracle: &mut BTreeMap<u64, Vec<u8>>,
) -> u64 {
    let mut in_flight: BTreeMap<u64, InFlight> = BTreeMap::new();
    let mut writing: BTreeMap<u64, u32> = BTreeMap::new();
    let (mut tag, mut version, mut raced) = (0u64, 1u64 << 32, 0);
    let mut t = d.controller().now_ns();
    let zero = vec![0u8; 4096];
    while tag < commands || !in_flight.is_empty() {
        if tag < commands && in_flight.len() < 24 {
            let n = 1 + rng.below(8) as u32;
            let lba = rng.below(span - n as u64);
            let lbas = lba..lba + n as u64;
            let roll = rng.below(100);
            let free = lbas.clone().all(|l| !writing.contains_key(&l));
            let q: &mut dyn QueuedDevice = d;
            if roll < 50 && free {
                version += 1;
                let pages: Vec<Vec<u8>> = lbas.clone().map(|l| sector_bytes(l, version)).collect();
                q.start(t, &Command::write(lba, n, &pages.concat()), tag)
                    .unwrap();
                for (l, page) in lbas.clone().zip(&pages) {
                    *writing.entry(l).or_default() += 1;
                    for f in in_flight.values_mut() {
                        if let InFlight::Read(first, versions) = f {
                            if (*first..*first + versions.len() as u64).contains(&l) {
                                versions[(l - *first) as usize].push(page.clone());
                                raced += 1;
                            }
                        }
                    }
                }
                in_flight.insert(tag, InFlight::Write(lba, pages));
            } else if roll < 90 && free {
                q.start(t, &Command::read(lba, n), tag).unwrap();
                let versions = lbas
                    .map(|l| vec![oracle.get(&l).cloned().unwrap_or_else(|| zero.clone())])
                    .collect();
                in_flight.insert(tag, InFlight::Read(lba, versions));
            } else if roll < 95 && free {
                q.start(t, &Command::trim(lba, n), tag).unwrap();
                for l in lbas {
                    *writing.entry(l).or_default() += 1;
                }
                in_flight.insert(tag, InFlight::Trim(lba, n));
            } else {
                q.start(t, &Command::flush(), tag).unwrap();
                in_flight.insert(tag, InFlight::Flush);
            }
            tag += 1;
            t += rng.below(20_000);
        } else {
            let q: &mut dyn QueuedDevice = d;
            t = q.next_event_ns().expect("commands under way").max(t);
        }
        let q: &mut dyn QueuedDevice = d;
        for c in q.advance_to(t) {
            assert!(c.done_ns <= t);
            let done = in_flight
                .remove(&c.tag)
                .expect("a completion of a command under way");
            let result = c.result.unwrap_or_else(|e| panic!("tag {}: {e}", c.tag));
            match done {
                InFlight::Write(lba, pages) => {
                    for (l, page) in (lba..).zip(pages) {
                        oracle.insert(l, page);
                        *writing.get_mut(&l).unwrap() -= 1;
                        writing.retain(|_, n| *n > 0);
                    }
                }
                InFlight::Read(lba, versions) => {
                    for (i, may) in versions.iter().enumerate() {
                        let got = &result[i * 4096..(i + 1) * 4096];
                        assert!(
                            may.iter().any(|v| v[..] == *got),
                            "tag {}: LBA {} read bytes of no version it may return",
                            c.tag,
                            lba + i as u64
                        );
                    }
                }
                InFlight::Trim(lba, n) => {
                    for l in lba..lba + n as u64 {
                        oracle.remove(&l);
                        *writing.get_mut(&l).unwrap() -= 1;
                        writing.retain(|_, n| *n > 0);
                    }
                }
                InFlight::Flush => {}
            }
        }
    }
    raced
}

/// The queued interface serves overlapping commands with their bytes, write-through and
/// with the write-back cache, through GC; a read that a later write races returns one of
/// the two versions (the bytes are taken when the read looks MAP up, not at its completion,
/// when MAP may point at the newer version); a restart from the image after a flush keeps
/// everything.
#[test]
fn the_queued_interface_serves_overlapping_commands_with_their_bytes() {
    for write_back in [false, true] {
        let dir = TempDir::new(&format!("queued-{write_back}"));
        let mut cfg = small_config();
        cfg.write_cache.write_back = write_back;
        let span = 3000;
        let image = FlashImage::create(&dir.image(), &cfg).unwrap();
        let mut d = OxServedDevice::format(&cfg, 12, image).unwrap();
        let mut rng = SimRng::new(12);
        let mut oracle = BTreeMap::new();
        let raced = drive_queued(&mut d, &mut rng, 6000, span, &mut oracle);
        assert!(raced > 0, "no write raced a read");
        assert!(d.controller().stats().gc_victims > 0, "GC never ran");
        // The synchronous interface takes over once the queue is empty.
        let t = d.controller().now_ns();
        d.submit(t, &Command::flush(), ReadBuffers::none()).unwrap();
        check_oracle(&mut d, &oracle, span);
        d.controller().check_invariants().unwrap();
        drop(d);
        let image = FlashImage::open(&dir.image(), &cfg).unwrap();
        let (mut d, _) = OxServedDevice::recover(&cfg, 12, image).unwrap();
        check_oracle(&mut d, &oracle, span);
    }
}

/// The synchronous interface refuses a command while queued ones are under way (it would
/// run the controller past them and take their completions), and the queued interface
/// refuses a tag already under way.
#[test]
fn the_served_device_keeps_its_two_interfaces_apart() {
    let cfg = small_config();
    let mut d = OxServedDevice::format(&cfg, 13, FlashImage::in_memory(&cfg)).unwrap();
    let data = sector_bytes(5, 1);
    let q: &mut dyn QueuedDevice = &mut d;
    q.start(0, &Command::write(5, 1, &data), 7).unwrap();
    let again = q.start(0, &Command::read(5, 1), 7).unwrap_err();
    assert!(again.to_string().contains("tag 7"), "{again}");
    let err = d
        .submit(0, &Command::read(5, 1), ReadBuffers::none())
        .unwrap_err();
    assert!(matches!(err, DeviceError::Unsupported(_)), "{err}");
    let q: &mut dyn QueuedDevice = &mut d;
    let t = q.next_event_ns().unwrap();
    let mut done = Vec::new();
    let mut t = t;
    while done.is_empty() {
        done = q.advance_to(t);
        t = q.next_event_ns().unwrap_or(t + 1_000_000);
    }
    assert_eq!(done[0].tag, 7);
    assert!(done[0].result.is_ok());
    let now = d.controller().now_ns();
    assert!(read_sectors(&mut d, now, 5, 1) == data);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(afa_sim::proptest_cases(6)))]

    /// The same over random seeds, in memory, write-through or write-back: every read of
    /// overlapping queued commands returns a version it may, and everything reads back.
    #[test]
    fn queued_commands_keep_their_bytes_for_any_seed(seed in 0u64..1_000_000, write_back: bool) {
        let mut cfg = small_config();
        cfg.write_cache.write_back = write_back;
        let mut d = OxServedDevice::format(&cfg, seed, FlashImage::in_memory(&cfg)).unwrap();
        let mut rng = SimRng::new(seed);
        let mut oracle = BTreeMap::new();
        drive_queued(&mut d, &mut rng, 2000, 1500, &mut oracle);
        check_oracle(&mut d, &oracle, 1500);
        d.controller().check_invariants().unwrap();
    }
}

/// The image a damage test starts from: a formatted device that took random writes (GC and
/// checkpoints included) and was then dropped as a killed process drops it.
fn damaged_image_base() -> &'static (Vec<u8>, OxConfig) {
    static BASE: std::sync::OnceLock<(Vec<u8>, OxConfig)> = std::sync::OnceLock::new();
    BASE.get_or_init(|| {
        let dir = TempDir::new("damage-base");
        let cfg = small_config();
        let image = FlashImage::create(&dir.image(), &cfg).unwrap();
        let mut d = OxServedDevice::format(&cfg, 21, image).unwrap();
        let mut rng = SimRng::new(21);
        let (mut oracle, mut version) = (BTreeMap::new(), 0);
        write_random(&mut d, &mut rng, 1200, 1000, &mut oracle, &mut version);
        drop(d);
        (std::fs::read(dir.image()).unwrap(), cfg)
    })
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(afa_sim::proptest_cases(48)))]

    /// A state directory can be damaged on disk (a bad sector, a stray write, a copy cut
    /// short). Whatever bytes of the image change, opening it and recovering from it end in
    /// an error that says what is wrong, or in a device that answers every read with bytes
    /// or an error: never in a panic.
    #[test]
    fn a_damaged_image_is_refused_or_recovered_never_a_panic(
        flips in proptest::collection::vec((0.0f64..1.0, 1u8..=255), 1..24),
        cut_fraction in proptest::option::weighted(0.25, 0.0f64..1.0),
    ) {
        let (base, cfg) = damaged_image_base();
        let mut bytes = base.clone();
        afa_sim::damage_bytes(&mut bytes, &flips, cut_fraction);
        let dir = TempDir::new("damaged");
        std::fs::write(dir.image(), &bytes).unwrap();
        let Ok(image) = FlashImage::open(&dir.image(), cfg) else {
            return Ok(());
        };
        let Ok((mut d, _)) = OxServedDevice::recover(cfg, 21, image) else {
            return Ok(());
        };
        let t = d.controller().now_ns();
        let mut out = vec![0u8; 4096];
        for lba in 0..1000 {
            let _ = d.submit(
                t,
                &Command::read(lba, 1),
                ReadBuffers { data: &mut out, tags: None },
            );
        }
    }
}

/// The slot checksum as images on disk were sealed with it: every 8-byte chunk (the last one
/// zero-padded) mixed in turn. The faster word loop must give the same sums, or images
/// written before it would load as torn.
fn slot_checksum_as_first_written(header: &[u8], content: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut mix = |bytes: &[u8]| {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            h = (h ^ u64::from_le_bytes(w)).wrapping_mul(0x0000_0100_0000_01b3);
            h ^= h >> 29;
        }
    };
    mix(&header[..24]);
    mix(&header[32..]);
    mix(content);
    h
}

#[test]
fn slot_checksums_are_those_images_were_first_sealed_with() {
    let mut rng = SimRng::new(7);
    let mut bytes = vec![0u8; 65_536 + 64];
    for b in bytes.iter_mut() {
        *b = rng.next_u64() as u8;
    }
    for header_bytes in [32, 33, 39, 40, 64, 77] {
        let header = &bytes[..header_bytes];
        for content_bytes in (0..=41).chain([4095, 4096, 65_536]) {
            let content = &bytes[64..64 + content_bytes];
            assert_eq!(
                crate::image::slot_checksum(header, content),
                slot_checksum_as_first_written(header, content),
                "header {header_bytes} bytes, content {content_bytes} bytes"
            );
        }
    }
}
