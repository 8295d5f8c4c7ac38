//! Tests of the controller: the batch interface and Figure 3, the WAL protocol, GC,
//! checkpoints, recovery from power loss at random points, program failures (RDESC_A), the
//! block interface, determinism, and a property test against an oracle.

use std::collections::{BTreeMap, BTreeSet};

use afa_nand::sector_token;
use afa_sim::{SimRng, TimeNs};
use proptest::prelude::*;

use crate::*;

/// A small device that fills quickly: 4 channels × 2 LUNs × 80 EBLOCKs of 8 WBLOCKs of
/// 8 KiB (2 RBLOCKs; a MAP page holds 1024 entries), so that GC, checkpoints, MAP cache evictions and log truncation all
/// happen within a few thousand LPAGE writes.
pub(crate) fn small_config() -> OxConfig {
    OxConfig {
        terms: FlashTerms {
            rblock_bytes: 4096,
            wblock_bytes: 8 * 1024,
            eblock_bytes: 64 * 1024,
            tag_bytes: 16,
        },
        channels: 4,
        luns_per_channel: 2,
        eblocks_per_lun: 80,
        logical_pages: 4000,
        map_cache_pages: 2,
        log_forward_links: 2,
        max_batch_pages: 255,
        gc: OxGcConfig {
            enabled: true,
            start_used_fraction: 0.6,
            stop_used_fraction: 0.55,
            static_wear_threshold_erases: 8,
            max_gc_channels: 2,
            read_whole_wblocks: true,
            min_invalid_fraction: 0.5,
            min_invalid_relax_from_used_fraction: 0.7,
        },
        checkpoint: OxCheckpointConfig {
            enabled: true,
            interval_ns: 20_000_000,
        },
        ..OxConfig::default()
    }
}

pub(crate) fn batch(pages: &[(u64, u64)], cfg: &OxConfig) -> Request {
    Request::FlushBatch(BatchBuffer::new(pages, cfg.terms.rblock_bytes).unwrap())
}

pub(crate) fn read_all(c: &mut OxController, now: TimeNs) -> (TimeNs, Vec<u64>) {
    let n = c.logical_pages();
    let max = c.config().max_batch_pages as u64;
    let mut out = Vec::with_capacity(n as usize);
    let mut t = now.max(c.now_ns());
    let mut lpid = 0;
    while lpid < n {
        let k = max.min(n - lpid);
        let id = c
            .submit(t, Request::ReadBatch((lpid..lpid + k).collect()))
            .unwrap();
        let done = c.run_until_complete(id).unwrap();
        out.extend(done.result.unwrap());
        t = done.done_ns;
        lpid += k;
    }
    (t, out)
}

#[test]
fn a_batch_is_read_back_and_the_ftl_stays_consistent() {
    let cfg = small_config();
    let mut c = OxController::format(&cfg, 1).unwrap();
    let pages: Vec<(u64, u64)> = (0..100).map(|l| (l * 7, sector_token(l * 7, 1))).collect();
    let id = c.submit(0, batch(&pages, &cfg)).unwrap();
    let done = c.run_until_complete(id).unwrap();
    assert!(done.result.is_ok());
    assert!(done.done_ns > 0);
    let (_, all) = read_all(&mut c, done.done_ns);
    for (l, t) in &pages {
        assert_eq!(all[*l as usize], *t);
    }
    assert_eq!(all.iter().filter(|&&t| t != 0).count(), 100);
    assert_eq!(c.stats().done_records, 1);
    c.check_invariants().unwrap();
}

#[test]
fn bad_input_is_refused_with_typed_errors() {
    let cfg = small_config();
    let mut c = OxController::format(&cfg, 1).unwrap();
    let rb = cfg.terms.rblock_bytes;
    assert_eq!(
        c.submit(0, batch(&[(cfg.logical_pages, 1)], &cfg)),
        Err(OxError::LpidOutOfRange {
            lpid: cfg.logical_pages,
            capacity: cfg.logical_pages
        })
    );
    let empty = BatchBuffer::new(&[], rb).unwrap();
    assert_eq!(
        c.submit(0, Request::FlushBatch(empty)),
        Err(OxError::EmptyBatch)
    );
    let mut mismatched = BatchBuffer::new(&[(1, 1), (2, 2)], rb).unwrap();
    mismatched.tokens.pop();
    assert!(matches!(
        c.submit(0, Request::FlushBatch(mismatched)),
        Err(OxError::DescMismatch {
            listed: 2,
            carried: 1
        })
    ));
    let mut garbage = BatchBuffer::new(&[(1, 1)], rb).unwrap();
    garbage.desc_block[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        c.submit(0, Request::FlushBatch(garbage)),
        Err(OxError::MalformedDesc(_))
    ));
    let big: Vec<(u64, u64)> = (0..300).map(|l| (l, 1)).collect();
    assert!(matches!(
        c.submit(0, batch(&big, &cfg)),
        Err(OxError::BatchTooLarge { .. })
    ));
    c.advance_to(1_000);
    assert!(matches!(
        c.submit(10, Request::ReadLpid(0)),
        Err(OxError::TimeWentBackwards { .. })
    ));
    assert!(matches!(
        c.submit(
            2_000,
            Request::ReadBlocks {
                lba: cfg.logical_pages - 1,
                count: 2
            }
        ),
        Err(OxError::LpidOutOfRange { .. })
    ));
}

// ----- Figure 3: reads concurrent with a batch --------------------------------------------

/// Writes version 1 of LPIDs 0..n, then submits version 2 as one batch at `t0`; returns the
/// controller, the batch's id, its LPIDs and t0.
fn figure3_setup(n: u64) -> (OxController, RequestId, Vec<u64>, TimeNs, OxConfig) {
    let mut cfg = small_config();
    // A slow install (20 µs per MAP entry) widens the window in which reads overlap it.
    cfg.costs.map_update_ns = 20_000;
    let mut c = OxController::format(&cfg, 3).unwrap();
    let v1: Vec<(u64, u64)> = (0..n).map(|l| (l, sector_token(l, 1))).collect();
    let id = c.submit(0, batch(&v1, &cfg)).unwrap();
    let t0 = c.run_until_complete(id).unwrap().done_ns + 1_000;
    let v2: Vec<(u64, u64)> = (0..n).map(|l| (l, sector_token(l, 2))).collect();
    let id = c.submit(t0, batch(&v2, &cfg)).unwrap();
    (c, id, (0..n).collect(), t0, cfg)
}

/// How many of the batch's LPAGEs (in batch order) a read saw at version 2, checking that
/// they form a prefix.
fn visible_prefix(tokens: &[u64]) -> usize {
    let seen: Vec<bool> = tokens
        .iter()
        .enumerate()
        .map(|(l, &t)| {
            assert!(
                t == sector_token(l as u64, 1) || t == sector_token(l as u64, 2),
                "LPID {l} read a token of neither version"
            );
            t == sector_token(l as u64, 2)
        })
        .collect();
    let k = seen.iter().take_while(|&&s| s).count();
    assert!(
        seen[k..].iter().all(|&s| !s),
        "the read saw a non-prefix of the batch: {seen:?}"
    );
    k
}

#[test]
fn figure3a_a_read_acknowledged_before_the_batch_sees_none_of_it() {
    let cfg = small_config();
    let mut c = OxController::format(&cfg, 3).unwrap();
    let v1: Vec<(u64, u64)> = (0..64).map(|l| (l, sector_token(l, 1))).collect();
    let id = c.submit(0, batch(&v1, &cfg)).unwrap();
    let t = c.run_until_complete(id).unwrap().done_ns;
    let r = c.submit(t, Request::ReadBatch((0..64).collect())).unwrap();
    let read = c.run_until_complete(r).unwrap();
    let v2: Vec<(u64, u64)> = (0..64).map(|l| (l, sector_token(l, 2))).collect();
    let w = c.submit(read.done_ns, batch(&v2, &cfg)).unwrap();
    assert_eq!(visible_prefix(&read.result.unwrap()), 0);
    c.run_until_complete(w).unwrap();
}

#[test]
fn figure3b_a_read_issued_after_the_acknowledgement_sees_all_of_it() {
    let (mut c, id, lpids, _, _) = figure3_setup(64);
    let ack = c.run_until_complete(id).unwrap().done_ns;
    let r = c.submit(ack, Request::ReadBatch(lpids.clone())).unwrap();
    let tokens = c.run_until_complete(r).unwrap().result.unwrap();
    assert_eq!(visible_prefix(&tokens), lpids.len());
}

#[test]
fn figure3c_a_concurrent_read_sees_a_time_ordered_prefix() {
    let (mut c, id, lpids, t0, _) = figure3_setup(64);
    // Issue reads every 300 µs across the batch's lifetime; each sees a prefix, and reads
    // during the install see partial prefixes.
    let mut prefixes = Vec::new();
    let mut t = t0;
    let mut ack = None;
    for _ in 0..1000 {
        c.submit(t, Request::ReadBatch(lpids.clone())).unwrap();
        t += 300_000;
        c.advance_to(t);
        for done in c.take_completions() {
            if done.id == id {
                ack = Some(done.done_ns);
            } else {
                prefixes.push(visible_prefix(&done.result.unwrap()));
            }
        }
        if ack.is_some() {
            break;
        }
    }
    assert!(ack.is_some(), "the batch never completed");
    c.quiesce();
    for done in c.take_completions() {
        prefixes.push(visible_prefix(&done.result.unwrap()));
    }
    assert!(prefixes.contains(&0));
    assert!(
        prefixes.iter().any(|&k| k > 0 && k < lpids.len()),
        "no read caught the batch half installed: {prefixes:?}"
    );
}

#[test]
fn figure3d_a_later_read_sees_a_prefix_at_least_as_long() {
    let (mut c, id, lpids, t0, _) = figure3_setup(64);
    // Read A, then read B issued once A is acknowledged, over and over through the batch.
    let mut t = t0;
    let mut seen = Vec::new();
    let mut acked = false;
    for _ in 0..1000 {
        let r = c.submit(t, Request::ReadBatch(lpids.clone())).unwrap();
        let done = c.run_until_complete(r).unwrap();
        let k = visible_prefix(&done.result.unwrap());
        if let Some(&last) = seen.last() {
            assert!(k >= last, "read B saw {k} pages after read A saw {last}");
        }
        seen.push(k);
        t = done.done_ns;
        if acked {
            break;
        }
        acked = c.take_completions().iter().any(|d| d.id == id);
    }
    assert_eq!(seen.last(), Some(&lpids.len()), "{seen:?}");
    assert!(
        seen.iter().any(|&k| k > 0 && k < lpids.len()),
        "no read landed inside the install: {seen:?}"
    );
}

// ----- the block interface and Figure 12 ---------------------------------------------------

/// One NVMe-oF/TCP connection carries the writes' data in the order they were submitted:
/// a small write submitted right after a large one cannot overtake it, so two writes of the
/// same page in flight land in the order the host sent them. Before the link was booked as
/// one resource, each command's data crossed it independently, the small batch started its
/// context first and the large one installed the older version over it (the host key-value
/// store read back a stale page on a 100 MB/s link).
#[test]
fn writes_of_one_page_in_flight_land_in_the_order_they_were_submitted() {
    for (mb_s, block) in [(100.0, false), (100.0, true), (12_500.0, false)] {
        let mut cfg = small_config();
        cfg.costs.link_mb_s = mb_s;
        let mut c = OxController::format(&cfg, 3).unwrap();
        let write = |pages: &[(u64, u64)]| {
            if block {
                Request::WriteBlocks {
                    lba: pages[0].0,
                    tokens: pages.iter().map(|p| p.1).collect(),
                }
            } else {
                batch(pages, &cfg)
            }
        };
        // A large write with page 7 at version 1, then a one-page write of version 2.
        let large: Vec<(u64, u64)> = (0..200).map(|l| (l, sector_token(l, 1))).collect();
        let a = c.submit(0, write(&large)).unwrap();
        let b = c.submit(1_000, write(&[(7, sector_token(7, 2))])).unwrap();
        let ta = c.run_until_complete(a).unwrap().done_ns;
        let tb = c.run_until_complete(b).unwrap().done_ns;
        assert!(
            tb >= ta,
            "{mb_s} MB/s block {block}: the later write completed first"
        );
        let r = c.submit(tb, Request::ReadLpid(7)).unwrap();
        let got = c.run_until_complete(r).unwrap().result.unwrap();
        assert_eq!(got, vec![sector_token(7, 2)], "{mb_s} MB/s block {block}");
        c.check_invariants().unwrap();
    }
}

#[test]
fn a_1mib_block_write_is_17_contexts_and_a_batch_is_one() {
    let mut cfg = small_config();
    cfg.logical_pages = 2000;
    let mut c = OxController::format(&cfg, 5).unwrap();
    let tokens: Vec<u64> = (0..256).map(|l| sector_token(l, 1)).collect();
    let id = c
        .submit(
            0,
            Request::WriteBlocks {
                lba: 0,
                tokens: tokens.clone(),
            },
        )
        .unwrap();
    let t = c.run_until_complete(id).unwrap().done_ns;
    assert_eq!(c.stats().done_records, 17);
    assert_eq!(c.stats().contexts, 17);
    // A batch of 255 LPAGEs plus its DESC is a 1 MiB buffer: one context, one done.
    let pages: Vec<(u64, u64)> = (0..255)
        .map(|l| (1000 + l, sector_token(1000 + l, 1)))
        .collect();
    let id = c.submit(t, batch(&pages, &cfg)).unwrap();
    let t = c.run_until_complete(id).unwrap().done_ns;
    assert_eq!(c.stats().done_records, 18);
    let r = c
        .submit(t, Request::ReadBlocks { lba: 0, count: 256 })
        .unwrap();
    assert_eq!(c.run_until_complete(r).unwrap().result.unwrap(), tokens);
    c.check_invariants().unwrap();
}

#[test]
fn trim_unmaps_and_reads_zero() {
    let cfg = small_config();
    let mut c = OxController::format(&cfg, 5).unwrap();
    let tokens: Vec<u64> = (0..8).map(|l| sector_token(l, 1)).collect();
    let id = c
        .submit(0, Request::WriteBlocks { lba: 0, tokens })
        .unwrap();
    let t = c.run_until_complete(id).unwrap().done_ns;
    let id = c
        .submit(t, Request::TrimBlocks { lba: 2, count: 3 })
        .unwrap();
    let t = c.run_until_complete(id).unwrap().done_ns;
    let r = c
        .submit(t, Request::ReadBlocks { lba: 0, count: 8 })
        .unwrap();
    let got = c.run_until_complete(r).unwrap().result.unwrap();
    assert_eq!(got[2..5], [0, 0, 0]);
    assert_eq!(got[5], sector_token(5, 1));
    c.check_invariants().unwrap();
}

#[test]
fn the_block_device_seam_serves_host_commands() {
    use afa_ssd::{BlockDevice, Command, ReadBuffers};
    let cfg = small_config();
    let mut d = OxBlockDevice::new(OxController::format(&cfg, 9).unwrap());
    let info = d.info();
    assert_eq!(info.sector_bytes, 4096);
    let data: Vec<u8> = (0..16u64)
        .flat_map(|l| sector_token(100 + l, 3).to_le_bytes())
        .collect();
    let w = d
        .submit(0, &Command::write(100, 16, &data), ReadBuffers::none())
        .unwrap();
    let mut out = vec![0u8; data.len()];
    let r = d
        .submit(
            w.done_ns,
            &Command::read(100, 16),
            ReadBuffers {
                data: &mut out,
                tags: None,
            },
        )
        .unwrap();
    assert!(r.done_ns > w.done_ns);
    assert_eq!(out, data);
    assert!(d
        .submit(
            0,
            &Command::read(info.capacity_sectors, 1),
            ReadBuffers::none()
        )
        .is_err());
}

/// The queued interface runs commands side by side: reads started together finish sooner
/// than one after another, each returns its data, a flush completes after the transport's
/// latency, and bad input is refused at once.
#[test]
fn the_queued_interface_runs_host_commands_side_by_side() {
    use afa_ssd::{BlockDevice, Command};
    let cfg = small_config();
    let mut d = OxBlockDevice::new(OxController::format(&cfg, 9).unwrap());
    assert!(d.info().max_queue_depth > 1);
    let q = d
        .queued()
        .expect("write-through offers the queued interface");
    let data: Vec<u8> = (0..64u64)
        .flat_map(|l| sector_token(l, 1).to_le_bytes())
        .collect();
    q.start(0, &Command::write(0, 64, &data), 1).unwrap();
    let mut done = Vec::new();
    while let Some(t) = q.next_event_ns() {
        done.extend(q.advance_to(t));
        if !done.is_empty() {
            break;
        }
    }
    let written = done[0].done_ns;
    assert_eq!((done[0].tag, done[0].result.clone()), (1, Ok(Vec::new())));
    // Eight reads of different WBLOCKs at once, then the same eight one at a time.
    for i in 0..8u64 {
        q.start(written, &Command::read(i * 8, 1), 10 + i).unwrap();
    }
    q.start(written, &Command::flush(), 99).unwrap();
    let mut reads = Vec::new();
    while reads.len() < 9 {
        let t = q.next_event_ns().expect("commands under way");
        reads.extend(q.advance_to(t));
    }
    let flush = reads.iter().find(|c| c.tag == 99).unwrap();
    assert_eq!(
        flush.done_ns,
        written + cfg.costs.transport_latency_ns,
        "write-through: nothing to drain"
    );
    for c in reads.iter().filter(|c| c.tag != 99) {
        let lba = (c.tag - 10) * 8;
        assert_eq!(c.result, Ok(sector_token(lba, 1).to_le_bytes().to_vec()));
    }
    let together = reads.iter().map(|c| c.done_ns).max().unwrap() - written;
    let mut t = written + together;
    let start = t;
    for i in 0..8u64 {
        q.start(t, &Command::read(i * 8, 1), 20 + i).unwrap();
        loop {
            let next = q.next_event_ns().unwrap();
            if let Some(c) = q.advance_to(next).pop() {
                t = c.done_ns;
                break;
            }
        }
    }
    assert!(
        together < t - start,
        "{together} ns side by side, {} ns one by one",
        t - start
    );
    assert!(q.start(t, &Command::read(cfg.logical_pages, 1), 5).is_err());
}

/// Costs are steps of simulated time and the link a bandwidth, under the workspace's
/// bounds; a value past them is refused by name before any arithmetic can overflow.
#[test]
fn costs_beyond_an_hour_or_a_link_below_a_kilobyte_per_second_are_refused_by_name() {
    let mut cfg = OxConfig::default();
    cfg.costs.page_cpu_ns = i64::MAX as u64;
    let err = cfg.validate().unwrap_err().to_string();
    assert!(err.contains("costs.page_cpu_ns"), "{err}");
    let mut cfg = OxConfig::default();
    cfg.costs.link_mb_s = 1e-9;
    let err = cfg.validate().unwrap_err().to_string();
    assert!(err.contains("costs.link_mb_s"), "{err}");
    let mut cfg = OxConfig::default();
    cfg.checkpoint.interval_ns = u64::MAX;
    let err = cfg.validate().unwrap_err().to_string();
    assert!(err.contains("checkpoint.interval_ns"), "{err}");
    assert!(OxConfig::default().validate().is_ok());
}

// ----- GC, checkpoints, wear -------------------------------------------------------------

/// Drives random batches of zipf-ish LPIDs with up to `qd` outstanding; returns the oracle
/// (LPID → token of the newest acknowledged version) and the final time.
pub(crate) fn drive(
    c: &mut OxController,
    rng: &mut SimRng,
    batches: usize,
    qd: usize,
    start: TimeNs,
) -> (BTreeMap<u64, u64>, TimeNs) {
    let cfg = c.config().clone();
    let mut oracle = BTreeMap::new();
    let mut version = 1_000;
    let mut t = start;
    let mut outstanding: BTreeMap<RequestId, Vec<(u64, u64)>> = BTreeMap::new();
    let (mut submitted, mut steps) = (0, 0u64);
    while submitted < batches || !outstanding.is_empty() {
        if submitted < batches && outstanding.len() < qd {
            let n = 1 + rng.below(64) as usize;
            let pages: Vec<(u64, u64)> = (0..n)
                .map(|_| {
                    let hot = rng.chance(0.7);
                    let l = if hot {
                        rng.below(cfg.logical_pages / 5)
                    } else {
                        rng.below(cfg.logical_pages)
                    };
                    version += 1;
                    (l, sector_token(l, version))
                })
                .collect();
            let id = c.submit(t, batch(&pages, &cfg)).unwrap();
            outstanding.insert(id, pages);
            submitted += 1;
            t += 100_000;
        } else {
            let next = c.next_event_ns().expect("work is under way");
            c.advance_to(next);
            t = t.max(next);
        }
        for done in c.take_completions() {
            assert!(
                done.result.is_ok(),
                "{:?} {:?} free per channel {:?}",
                done.result,
                c.stats(),
                (0..cfg.channels)
                    .map(|ch| c.free_eblocks(ch))
                    .collect::<Vec<_>>()
            );
            for (l, tok) in outstanding.remove(&done.id).unwrap_or_default() {
                oracle.insert(l, tok);
            }
        }
        // Block status while MAP pages are evicted, loaded and checkpointed: an LPID no
        // outstanding batch writes holds data exactly when the oracle has a version of it.
        steps += 1;
        if steps % 64 == 0 {
            let writing: BTreeSet<u64> = outstanding.values().flatten().map(|p| p.0).collect();
            for l in (0..cfg.logical_pages).filter(|l| !writing.contains(l)) {
                assert_eq!(c.peek_holds_data(l), oracle.contains_key(&l), "LPID {l}");
            }
        }
    }
    (oracle, t)
}

#[test]
fn gc_checkpoints_and_map_evictions_keep_every_page() {
    let cfg = small_config();
    let mut c = OxController::format(&cfg, 11).unwrap();
    let mut rng = SimRng::new(11);
    let (oracle, t) = drive(&mut c, &mut rng, 600, 4, 0);
    c.quiesce();
    let s = *c.stats();
    assert!(s.gc_victims > 10, "GC did not run: {s:?}");
    assert!(s.checkpoints > 2, "no checkpoints: {s:?}");
    assert!(
        s.map_page_loads > 0 && s.map_page_evictions_written > 0,
        "{s:?}"
    );
    assert!(
        s.log_eblocks_reclaimed > 0,
        "the log was never truncated: {s:?}"
    );
    assert!(s.gc_reclaimed_bytes > 0);
    let (_, all) = read_all(&mut c, t);
    for (l, tok) in &oracle {
        assert_eq!(all[*l as usize], *tok, "LPID {l}");
    }
    c.check_invariants().unwrap();
    c.check_wear().unwrap();
}

/// OX's GC reads each WBLOCK that holds a live RBLOCK whole; reading only the live RBLOCKs
/// reads exactly what is written. Either way every page survives.
#[test]
fn gc_reads_whole_wblocks_that_hold_live_rblocks() {
    let run = |whole: bool| {
        let mut cfg = small_config();
        cfg.gc.read_whole_wblocks = whole;
        let mut c = OxController::format(&cfg, 13).unwrap();
        let mut rng = SimRng::new(13);
        let (oracle, t) = drive(&mut c, &mut rng, 600, 4, 0);
        c.quiesce();
        let (_, all) = read_all(&mut c, t);
        for (l, tok) in &oracle {
            assert_eq!(all[*l as usize], *tok, "LPID {l}");
        }
        c.check_invariants().unwrap();
        (*c.stats(), cfg)
    };
    let (live_only, _) = run(false);
    assert!(
        live_only.gc_write_bytes > 0,
        "GC moved nothing: {live_only:?}"
    );
    assert_eq!(live_only.gc_read_bytes, live_only.gc_write_bytes);
    let (whole, cfg) = run(true);
    let wblock = cfg.terms.wblock_bytes as u64;
    let per_wblock = cfg.terms.rblocks_per_wblock() as u64;
    assert!(whole.gc_write_bytes > 0, "GC moved nothing: {whole:?}");
    assert_eq!(whole.gc_read_bytes % wblock, 0);
    assert!(whole.gc_read_bytes > whole.gc_write_bytes, "{whole:?}");
    assert!(
        whole.gc_read_bytes <= whole.gc_write_bytes * per_wblock,
        "{whole:?}"
    );
}

/// OX picks only victims with at least half their RBLOCKs invalid while the channel has
/// room; without that minimum, mostly live EBLOCKs are taken.
#[test]
fn gc_leaves_mostly_live_eblocks_alone_while_the_channel_has_room() {
    let victims = |min_invalid: f64| {
        let mut cfg = quiet_config();
        cfg.gc.min_invalid_fraction = min_invalid;
        let mut c = OxController::format(&cfg, 21).unwrap();
        let mut t = 0;
        let first: Vec<u64> = (0..1600).collect();
        let again: Vec<u64> = (0..800).step_by(3).collect();
        for (lpids, version) in [(&first, 1), (&again, 2)] {
            for chunk in lpids.chunks(200) {
                let pages: Vec<(u64, u64)> = chunk
                    .iter()
                    .map(|&l| (l, sector_token(l, version)))
                    .collect();
                let id = c.submit(t, batch(&pages, &cfg)).unwrap();
                t = c.run_until_complete(id).unwrap().done_ns;
            }
        }
        c.quiesce();
        (0..cfg.channels).filter_map(|ch| c.pick_victim(ch)).count()
    };
    // The EBLOCKs that held LPIDs 0..800 are about a third invalid: not worth collecting yet.
    assert_eq!(victims(0.5), 0);
    assert!(victims(0.0) > 0);
}

/// A configuration where nothing happens in the background, so that latencies are those of
/// the path under test.
fn quiet_config() -> OxConfig {
    let mut cfg = small_config();
    cfg.gc.enabled = false;
    cfg.checkpoint.enabled = false;
    cfg
}

/// A MAP cache miss that pushes a dirty MAP page out waits for that page's write before
/// the slot takes the new page (OX evicts, then loads).
#[test]
fn a_map_miss_that_evicts_a_dirty_page_waits_for_its_write() {
    let cfg = quiet_config();
    let per_page = cfg.map_entries_per_page();
    let mut c = OxController::format(&cfg, 3).unwrap();
    // MAP pages 0 and 1 fill the two-page cache and are dirty.
    let pages = [
        (0, sector_token(0, 1)),
        (per_page, sector_token(per_page, 1)),
    ];
    let id = c.submit(0, batch(&pages, &cfg)).unwrap();
    let t = c.run_until_complete(id).unwrap().done_ns;
    let evictions = c.stats().map_page_evictions_written;
    // MAP page 2 was never written: it needs no flash read, only a slot.
    let r = c.submit(t, Request::ReadLpid(2 * per_page + 5)).unwrap();
    let done = c.run_until_complete(r).unwrap();
    assert_eq!(done.result.unwrap(), vec![0]);
    assert_eq!(c.stats().map_page_evictions_written, evictions + 1);
    let program_ns = cfg.timing.of(cfg.cell_mode).program_ns;
    assert!(
        done.done_ns - t >= program_ns,
        "the read took {} ns, less than one program of the evicted page ({program_ns} ns)",
        done.done_ns - t
    );
}

/// A reader of a MAP page that another read is loading waits for the load (OX's per-page
/// lock, §7.2.5): it is not served from a page that is not in DRAM yet.
#[test]
fn a_reader_of_a_map_page_being_loaded_waits_for_the_load() {
    let cfg = quiet_config();
    let per_page = cfg.map_entries_per_page();
    let mut c = OxController::format(&cfg, 4).unwrap();
    // Page 0 is written, then pushed out of the two-page cache by reads of pages 1 and 2,
    // never written and so clean: the next miss frees a slot without a write.
    let group0: Vec<(u64, u64)> = (0..8).map(|l| (l * 3, sector_token(l * 3, 1))).collect();
    let id = c.submit(0, batch(&group0, &cfg)).unwrap();
    let mut t = c.run_until_complete(id).unwrap().done_ns;
    for lpid in [per_page, 2 * per_page] {
        let r = c.submit(t, Request::ReadLpid(lpid)).unwrap();
        t = c.run_until_complete(r).unwrap().done_ns;
    }
    // Let the write of page 0 end.
    t += 10_000_000;
    c.advance_to(t);
    let loads = c.stats().map_page_loads;
    // Two reads of page 0 at once: one loads it, the other must wait for that load.
    let a = c.submit(t, Request::ReadLpid(0)).unwrap();
    let b = c.submit(t, Request::ReadLpid(21)).unwrap();
    let done_a = c.run_until_complete(a).unwrap();
    let done_b = c.run_until_complete(b).unwrap();
    assert_eq!(done_a.result.clone().unwrap(), vec![group0[0].1]);
    assert_eq!(done_b.result.clone().unwrap(), vec![group0[7].1]);
    assert_eq!(
        c.stats().map_page_loads,
        loads + 1,
        "page 0 was loaded twice"
    );
    // The same read once page 0 is cached: no load in its path.
    let t2 = done_a.done_ns.max(done_b.done_ns) + 1_000_000;
    let h = c.submit(t2, Request::ReadLpid(21)).unwrap();
    let hit_ns = c.run_until_complete(h).unwrap().done_ns - t2;
    let read_ns = cfg.timing.of(cfg.cell_mode).read_ns;
    for (name, d) in [("first", &done_a), ("second", &done_b)] {
        assert!(
            d.done_ns - t >= hit_ns + read_ns,
            "the {name} read took {} ns; with page 0 cached it takes {hit_ns} ns",
            d.done_ns - t
        );
    }
}

/// The install of a batch whose MAP page left the cache while its data was being written
/// (the page was loaded when the batch's RDESC took the prior addresses) waits for the page
/// to be loaded again: in OX the thread that upserts the entries reads the page first.
#[test]
fn an_install_waits_for_the_map_page_it_changes() {
    let cfg = quiet_config();
    let per_page = cfg.map_entries_per_page();
    let write_with_reads = |reads: bool| {
        let mut c = OxController::format(&cfg, 4).unwrap();
        // One page in each of MAP pages 0, 1 and 2, so that each is on flash to be loaded.
        let pages: Vec<(u64, u64)> = [3, per_page + 3, 2 * per_page + 3]
            .map(|l| (l, sector_token(l, 1)))
            .to_vec();
        let id = c.submit(0, batch(&pages, &cfg)).unwrap();
        let t = c.run_until_complete(id).unwrap().done_ns + 10_000_000;
        c.advance_to(t);
        let (loads, waits) = (c.stats().map_page_loads, c.stats().install_map_waits);
        let id = c
            .submit(t, batch(&[(3, sector_token(3, 2))], &cfg))
            .unwrap();
        if reads {
            // Pages 1 and 2 (cached until the batch's RDESC loaded page 0) take the two-page
            // cache back while the batch's data is programmed.
            for lpid in [per_page + 3, 2 * per_page + 3] {
                c.submit(t + 300_000, Request::ReadLpid(lpid)).unwrap();
            }
        }
        let write_ns = c.run_until_complete(id).unwrap().done_ns - t;
        let r = c.submit(t + 10_000_000, Request::ReadLpid(3)).unwrap();
        assert_eq!(
            c.run_until_complete(r).unwrap().result.unwrap(),
            vec![sector_token(3, 2)]
        );
        let waits = c.stats().install_map_waits - waits;
        (write_ns, c.stats().map_page_loads - loads, waits)
    };
    let (cached_ns, _, cached_waits) = write_with_reads(false);
    assert_eq!(cached_waits, 0);
    let (pushed_out_ns, loads, waits) = write_with_reads(true);
    assert!(
        loads >= 3,
        "pages 1 and 2, then page 0 again: {loads} loads"
    );
    assert_eq!(waits, 1, "the install did not wait for page 0");
    assert!(pushed_out_ns > cached_ns);
}

/// How long a read of a cached MAP page takes when it is queued right behind a read whose
/// MAP page must be loaded, with `threads` read threads; and how long the same read takes
/// on an idle controller with its page cached.
fn read_behind_a_map_miss_ns(threads: u32) -> (u64, u64) {
    let mut cfg = quiet_config();
    cfg.costs.read_lookup_threads = threads;
    let per_page = cfg.map_entries_per_page();
    let mut c = OxController::format(&cfg, 5).unwrap();
    // MAP pages 0, 1 and 2 hold written LPAGEs; the cache holds two of them.
    let pages: Vec<(u64, u64)> = [0, per_page, 2 * per_page]
        .iter()
        .map(|&l| (l, sector_token(l, 1)))
        .collect();
    let id = c.submit(0, batch(&pages, &cfg)).unwrap();
    let mut t = c.run_until_complete(id).unwrap().done_ns;
    // Reads of pages 0 and 1 leave them cached (page 1 the most recently used) and page 2
    // on flash; then every write ends.
    for lpid in [0, per_page] {
        let r = c.submit(t, Request::ReadLpid(lpid)).unwrap();
        t = c.run_until_complete(r).unwrap().done_ns;
    }
    t += 10_000_000;
    c.advance_to(t);
    let loads = c.stats().map_page_loads;
    // A misses (page 2 must be loaded); B, a nanosecond later, hits page 1.
    let a = c.submit(t, Request::ReadLpid(2 * per_page)).unwrap();
    let b = c.submit(t + 1, Request::ReadLpid(per_page)).unwrap();
    let done_a = c.run_until_complete(a).unwrap();
    let done_b = c.run_until_complete(b).unwrap();
    assert_eq!(done_a.result.unwrap(), vec![pages[2].1]);
    assert_eq!(done_b.result.unwrap(), vec![pages[1].1]);
    assert_eq!(
        c.stats().map_page_loads,
        loads + 1,
        "only A loads a MAP page"
    );
    // The same read once nothing else is under way.
    let t2 = done_a.done_ns.max(done_b.done_ns) + 10_000_000;
    c.advance_to(t2);
    let h = c.submit(t2, Request::ReadLpid(per_page)).unwrap();
    let hit_ns = c.run_until_complete(h).unwrap().done_ns - t2;
    (done_b.done_ns - (t + 1), hit_ns)
}

/// OX's LBA I/O layer looks MAP up for host reads in one read thread, which loads a
/// missing MAP page synchronously: a read whose page is cached still waits behind a read
/// queued before it that misses. With a lookup per read (0 threads) it does not.
#[test]
fn one_read_thread_holds_a_read_behind_a_map_miss() {
    let read_ns = quiet_config().timing.of(quiet_config().cell_mode).read_ns;
    let (behind_ns, hit_ns) = read_behind_a_map_miss_ns(1);
    assert!(
        behind_ns >= hit_ns + read_ns,
        "one read thread: the hit took {behind_ns} ns behind the miss, {hit_ns} ns alone"
    );
    let (free_ns, hit_ns) = read_behind_a_map_miss_ns(0);
    assert!(
        free_ns < hit_ns + read_ns,
        "a lookup per read: the hit took {free_ns} ns behind the miss, {hit_ns} ns alone"
    );
}

/// Erase-count spread after a cold half and a small hot set: with static wear levelling
/// and without.
fn erase_spread(threshold: u32) -> (u32, u32) {
    let mut cfg = small_config();
    cfg.checkpoint.enabled = false;
    cfg.gc.static_wear_threshold_erases = threshold;
    let mut c = OxController::format(&cfg, 13).unwrap();
    let mut rng = SimRng::new(13);
    let cold: Vec<(u64, u64)> = (1000..3000).map(|l| (l, sector_token(l, 1))).collect();
    for chunk in cold.chunks(200) {
        let id = c.submit(c.now_ns(), batch(chunk, &cfg)).unwrap();
        c.run_until_complete(id).unwrap();
    }
    let mut t = c.now_ns();
    for v in 0..1500u64 {
        let pages: Vec<(u64, u64)> = (0..32)
            .map(|_| {
                let l = rng.below(100);
                (l, sector_token(l, 10 + v))
            })
            .collect();
        let id = c.submit(t, batch(&pages, &cfg)).unwrap();
        t = c.run_until_complete(id).unwrap().done_ns;
    }
    let (_, all) = read_all(&mut c, t);
    for (l, tok) in &cold {
        assert_eq!(all[*l as usize], *tok);
    }
    c.check_invariants().unwrap();
    c.erase_count_range()
}

#[test]
fn static_wear_levelling_bounds_the_erase_spread() {
    let (lo_off, hi_off) = erase_spread(0);
    let (lo_on, hi_on) = erase_spread(4);
    assert!(hi_off > 8, "too few erases to judge: {lo_off}..{hi_off}");
    assert!(
        hi_on - lo_on < hi_off - lo_off,
        "static wear levelling did not narrow the spread: {lo_on}..{hi_on} vs {lo_off}..{hi_off}"
    );
}

#[test]
fn program_failures_are_amended_by_rdesc_a() {
    let mut cfg = small_config();
    cfg.faults.program_fail_probability = 0.004;
    let mut c = OxController::format(&cfg, 17).unwrap();
    let mut rng = SimRng::new(17);
    let (oracle, t) = drive(&mut c, &mut rng, 300, 2, 0);
    c.quiesce();
    let s = *c.stats();
    assert!(s.rdesc_a_records > 0, "no RDESC_A: {s:?}");
    assert!(s.data_program_failures > 0);
    let (_, all) = read_all(&mut c, t);
    for (l, tok) in &oracle {
        assert_eq!(all[*l as usize], *tok, "LPID {l}");
    }
    c.check_invariants().unwrap();
}

// ----- power loss and recovery ------------------------------------------------------------

/// Batches submitted before a power loss: their pages, and whether the host got the ack.
pub(crate) struct Submitted {
    pub pages: Vec<(u64, u64)>,
    pub acked: bool,
}

/// Runs random batches and cuts power at `cut_ns`; returns what was submitted and the
/// medium. `state_before` is the content written by an initial synchronous phase.
pub(crate) fn run_and_cut(
    cfg: &OxConfig,
    seed: u64,
    cut_ns: TimeNs,
    pre_batches: usize,
) -> (Vec<Submitted>, BTreeMap<u64, u64>, PoweredOff) {
    let mut c = OxController::format(cfg, seed).unwrap();
    let mut rng = SimRng::new(seed);
    let (base, mut t) = drive(&mut c, &mut rng, pre_batches, 3, 0);
    let mut submitted: Vec<Submitted> = Vec::new();
    let mut ids: BTreeMap<RequestId, usize> = BTreeMap::new();
    let mut version = 1_000_000;
    let cut = t + cut_ns;
    while t < cut {
        let n = 1 + rng.below(40) as usize;
        let pages: Vec<(u64, u64)> = (0..n)
            .map(|_| {
                let l = rng.below(cfg.logical_pages);
                version += 1;
                (l, sector_token(l, version))
            })
            .collect();
        let id = c.submit(t, batch(&pages, cfg)).unwrap();
        ids.insert(id, submitted.len());
        submitted.push(Submitted {
            pages,
            acked: false,
        });
        t += 100_000 + rng.below(300_000);
        c.advance_to(t.min(cut));
        for done in c.take_completions() {
            if let Some(&i) = ids.get(&done.id) {
                submitted[i].acked = true;
            }
        }
    }
    c.advance_to(cut);
    for done in c.take_completions() {
        if let Some(&i) = ids.get(&done.id) {
            submitted[i].acked = true;
        }
    }
    (submitted, base, c.power_loss(cut))
}

/// Recovers and checks the rules of the fault model; returns the recovery report.
pub(crate) fn recover_and_check(
    cfg: &OxConfig,
    submitted: &[Submitted],
    base: &BTreeMap<u64, u64>,
    off: PoweredOff,
) -> RecoveryReport {
    let at = off.at_ns;
    let (mut c, report) = OxController::recover(off, at + 1_000_000).unwrap();
    c.check_invariants().unwrap();
    let now = c.now_ns();
    let (_, all) = read_all(&mut c, now);
    // Acknowledged batches form a prefix (contexts install and acknowledge in order).
    let acked = submitted.iter().take_while(|s| s.acked).count();
    assert!(
        submitted[acked..].iter().all(|s| !s.acked),
        "acknowledgements out of order"
    );
    // The state must equal the base plus the acknowledged batches plus some prefix of the
    // others, each applied whole.
    let matches_with = |k: usize| {
        let mut expect = base.clone();
        for s in &submitted[..acked + k] {
            for &(l, tok) in &s.pages {
                expect.insert(l, tok);
            }
        }
        (0..cfg.logical_pages).all(|l| all[l as usize] == expect.get(&l).copied().unwrap_or(0))
    };
    let ok = (0..=submitted.len() - acked).any(matches_with);
    assert!(
        ok,
        "after recovery the state is not the acknowledged batches plus a whole prefix of the others \
         ({} submitted, {acked} acknowledged, report {report:?})",
        submitted.len()
    );
    // The device keeps working after recovery.
    let id = c
        .submit(c.now_ns(), batch(&[(1, sector_token(1, 99))], cfg))
        .unwrap();
    assert!(c.run_until_complete(id).unwrap().result.is_ok());
    c.check_invariants().unwrap();
    report
}

#[test]
fn recovery_after_a_clean_stop_loses_nothing_and_restores_wear() {
    let cfg = small_config();
    let mut c = OxController::format(&cfg, 21).unwrap();
    let mut rng = SimRng::new(21);
    let (oracle, _) = drive(&mut c, &mut rng, 400, 3, 0);
    c.quiesce();
    let t = c.now_ns();
    let (mut c, report) = OxController::recover(c.power_loss(t), t).unwrap();
    assert!(report.recovery_ns > 0);
    c.check_invariants().unwrap();
    c.check_wear().unwrap();
    let now = c.now_ns();
    let (_, all) = read_all(&mut c, now);
    for (l, tok) in &oracle {
        assert_eq!(all[*l as usize], *tok);
    }
}

/// WEAR's redo is exact wherever fuzzy checkpoints fall among erases: an erase record carries
/// the count its erase made, so a WEAR page checkpointed after the erase is not counted once
/// more, nor one checkpointed before it left a count short. Runs with checkpoints at several
/// intervals lose power once stopped, and again right after each recovery (a redo of a redo).
#[test]
fn wear_is_exact_across_fuzzy_checkpoints_and_repeated_recovery() {
    for (seed, interval_us) in [(31u64, 150u64), (32, 600), (33, 1_500), (34, 5_000)] {
        let mut cfg = small_config();
        cfg.checkpoint.interval_ns = interval_us * 1_000;
        let mut c = OxController::format(&cfg, seed).unwrap();
        let mut rng = SimRng::new(seed);
        drive(&mut c, &mut rng, 400, 3, 0);
        c.quiesce();
        assert!(
            c.erase_count_range().1 > 0,
            "seed {seed}: GC erased nothing"
        );
        for round in 0..2 {
            let t = c.now_ns();
            let (recovered, _) = OxController::recover(c.power_loss(t), t).unwrap();
            c = recovered;
            c.check_wear()
                .unwrap_or_else(|e| panic!("seed {seed}, recovery {round}: {e}"));
        }
    }
}

#[test]
fn power_loss_at_random_points_keeps_acknowledged_batches_whole() {
    let cfg = small_config();
    let mut totals = RecoveryReport::default();
    for seed in 0..12u64 {
        let mut rng = SimRng::new(1000 + seed);
        let cut = 1_000_000 + rng.below(40_000_000);
        let (submitted, base, off) = run_and_cut(&cfg, 1000 + seed, cut, 150 + 20 * seed as usize);
        let r = recover_and_check(&cfg, &submitted, &base, off);
        totals.contexts_verified += r.contexts_verified;
        totals.contexts_dropped += r.contexts_dropped;
        totals.torn_wblocks += r.torn_wblocks;
        totals.gc_moves_redone += r.gc_moves_redone;
    }
    assert!(
        totals.torn_wblocks > 0,
        "no power loss tore anything: {totals:?}"
    );
    assert!(
        totals.contexts_dropped > 0,
        "no unacknowledged batch was dropped: {totals:?}"
    );
}

#[test]
fn power_loss_during_checkpoints_gc_and_log_writes() {
    // Cut power at the moments the device is busiest with background work: search forward
    // for a time at which a checkpoint (resp. a GC pass) is in flight, then cut there.
    let cfg = small_config();
    let mut hit_ckpt = 0;
    let mut hit_gc = 0;
    for seed in 0..10u64 {
        let mut c = OxController::format(&cfg, 2000 + seed).unwrap();
        let mut rng = SimRng::new(2000 + seed);
        let (_, t0) = drive(&mut c, &mut rng, 250, 3, 0);
        let want_ckpt = seed % 2 == 0;
        // Probe in a scratch copy? The controller is not clonable, so find the moment on a
        // twin run with the same seed (runs are deterministic).
        let mut probe = OxController::format(&cfg, 2000 + seed).unwrap();
        let mut prng = SimRng::new(2000 + seed);
        drive(&mut probe, &mut prng, 250, 3, 0);
        let mut cut = None;
        let mut t = t0;
        let mut version = 5_000_000u64;
        let mut qrng = SimRng::new(77 + seed);
        for _ in 0..400 {
            let n = 1 + qrng.below(40) as usize;
            let pages: Vec<(u64, u64)> = (0..n)
                .map(|_| {
                    let l = qrng.below(cfg.logical_pages);
                    version += 1;
                    (l, sector_token(l, version))
                })
                .collect();
            probe.submit(t, batch(&pages, &cfg)).unwrap();
            t += 150_000;
            probe.advance_to(t);
            probe.take_completions();
            let busy = if want_ckpt {
                probe.checkpoint_in_progress()
            } else {
                probe.gc_active()
            };
            if busy {
                cut = Some(t);
                break;
            }
            if t > t0 + 2_000_000 && want_ckpt {
                probe.checkpoint_now();
            }
        }
        let Some(cut) = cut else { continue };
        if want_ckpt {
            hit_ckpt += 1;
        } else {
            hit_gc += 1;
        }
        // Replay the same commands on the real run, recording acknowledgements.
        let mut submitted = Vec::new();
        let mut ids = BTreeMap::new();
        let mut t = t0;
        let mut version = 5_000_000u64;
        let mut qrng = SimRng::new(77 + seed);
        while t < cut {
            let n = 1 + qrng.below(40) as usize;
            let pages: Vec<(u64, u64)> = (0..n)
                .map(|_| {
                    let l = qrng.below(cfg.logical_pages);
                    version += 1;
                    (l, sector_token(l, version))
                })
                .collect();
            let id = c.submit(t, batch(&pages, &cfg)).unwrap();
            ids.insert(id, submitted.len());
            submitted.push(Submitted {
                pages,
                acked: false,
            });
            t += 150_000;
            c.advance_to(t.min(cut));
            for d in c.take_completions() {
                if let Some(&i) = ids.get(&d.id) {
                    submitted[i].acked = true;
                }
            }
            if t > t0 + 2_000_000 && want_ckpt && !c.checkpoint_in_progress() && t < cut {
                c.checkpoint_now();
            }
        }
        c.advance_to(cut);
        for d in c.take_completions() {
            if let Some(&i) = ids.get(&d.id) {
                submitted[i].acked = true;
            }
        }
        let busy = if want_ckpt {
            c.checkpoint_in_progress()
        } else {
            c.gc_active()
        };
        assert!(busy, "the twin run diverged: determinism is broken");
        // The base state is what the first phase acknowledged: rebuild it by reading it from a
        // third twin (cheaper than threading the oracle through).
        let mut twin = OxController::format(&cfg, 2000 + seed).unwrap();
        let mut trng = SimRng::new(2000 + seed);
        let (base, _) = drive(&mut twin, &mut trng, 250, 3, 0);
        recover_and_check(&cfg, &submitted, &base, c.power_loss(cut));
    }
    assert!(hit_ckpt > 0, "never caught a checkpoint in flight");
    assert!(hit_gc > 0, "never caught GC in flight");
}

#[test]
fn power_loss_with_program_failures_keeps_batches_atomic() {
    let mut cfg = small_config();
    cfg.faults.program_fail_probability = 0.005;
    for seed in 0..5u64 {
        let mut rng = SimRng::new(3000 + seed);
        let cut = 2_000_000 + rng.below(20_000_000);
        let (submitted, base, off) = run_and_cut(&cfg, 3000 + seed, cut, 100);
        recover_and_check(&cfg, &submitted, &base, off);
    }
}

/// Every forward link of a log block fails (here its only one). The device used to stop
/// with `LogWriteFailed`. The block now goes to fresh WBLOCKs named by a bridge in a reissued
/// checkpoint record; the batches are acknowledged, and recovery, finding the failed link
/// empty, follows the bridge and loses none of them.
#[test]
fn a_log_block_whose_every_link_fails_is_bridged_and_recovery_follows_the_bridge() {
    let mut cfg = small_config();
    cfg.log_forward_links = 1;
    // No checkpoint may truncate the log past the bridged block before the power loss.
    cfg.checkpoint.interval_ns = 10_000_000_000;
    let mut c = OxController::format(&cfg, 41).unwrap();
    // The first log block's link.
    let failing = c.log.links.clone();
    assert_eq!(failing.len(), 1);
    c.media.program_fails.extend(failing.iter().copied());
    let mut rng = SimRng::new(41);
    let (oracle, t) = drive(&mut c, &mut rng, 80, 4, 0);
    c.quiesce();
    assert!(c.fatal.is_none(), "{:?}", c.fatal);
    assert!(c.media.program_fails.is_empty(), "the link was never tried");
    assert_eq!(c.stats().log_bridges, 1);
    c.check_invariants().unwrap();
    let t = t.max(c.now_ns());
    let (mut r, report) = OxController::recover(c.power_loss(t), t).unwrap();
    assert_eq!(report.log_bridges_followed, 1, "{report:?}");
    r.check_invariants().unwrap();
    let now = r.now_ns();
    let (_, all) = read_all(&mut r, now);
    for (l, tok) in &oracle {
        assert_eq!(all[*l as usize], *tok, "LPID {l}");
    }
}

/// With one forward link per log block and program failures, log blocks are bridged again
/// and again (and bridges themselves fail and are bridged anew). Power lost at random
/// moments — between a bridge and its block, during checkpoints that must carry bridges
/// forward — keeps every acknowledged batch and every batch atomic.
#[test]
fn power_loss_with_bridged_log_blocks_keeps_acknowledged_batches() {
    let mut cfg = small_config();
    cfg.log_forward_links = 1;
    cfg.faults.program_fail_probability = 0.08;
    cfg.checkpoint.interval_ns = 5_000_000;
    let mut followed = 0;
    for seed in 0..16u64 {
        let mut rng = SimRng::new(4100 + seed);
        let cut = 2_000_000 + rng.below(30_000_000);
        let (submitted, base, off) = run_and_cut(&cfg, 4100 + seed, cut, 60);
        followed += recover_and_check(&cfg, &submitted, &base, off).log_bridges_followed;
    }
    assert!(followed > 0, "no recovery crossed a bridge");
}

// ----- system EBLOCKs ---------------------------------------------------------------------

/// The checkpoint EBLOCK holding the newest record is full, and every program of the other
/// one fails after its erase. The writer used to switch back and erase the block with the
/// newest record: power lost before the new record was on flash then left no checkpoint
/// record at all ("no checkpoint record found"). The failing EBLOCK is now retired and
/// replaced, and the full one is kept.
#[test]
fn a_checkpoint_eblock_filled_by_failed_programs_is_replaced_without_erasing_the_newest_record() {
    let cfg = small_config();
    let mut c = OxController::format(&cfg, 43).unwrap();
    let ppb = c.media.wblocks_per_eblock();
    let [full, failing] = c.system.checkpoint;
    let mut t = 0;
    for seq in 1..ppb as u64 {
        let rec = c.build_checkpoint_record(seq, c.log.next_lsn);
        t = c.write_checkpoint_record(rec, t).unwrap();
    }
    assert_eq!(c.media.write_pointer(full), ppb);
    let first = c.media.first_ppn(failing);
    c.media.program_fails.extend(first..first + ppb);
    let rec = c.build_checkpoint_record(ppb as u64, c.log.next_lsn);
    let end = c.write_checkpoint_record(rec, t).unwrap();
    assert!(c.media.program_fails.is_empty());
    assert_eq!(
        c.media.write_pointer(full),
        ppb,
        "the newest record's EBLOCK was erased"
    );
    assert!(c.media.is_bad(failing));
    assert_ne!(c.system.checkpoint[1], failing);
    assert_eq!(c.stats().system_eblocks_replaced, 1);
    // Power fails while the new record is being programmed: the one before it remains.
    let (r, report) = OxController::recover(c.power_loss(end - 1), end).unwrap();
    assert_eq!(report.checkpoint_seq, ppb as u64 - 1);
    r.check_invariants().unwrap();
}

/// Every program of a bad-block table's EBLOCK fails after the erase that makes room in it.
/// The writer erased it again until it gave up with a configuration error ("the bad-block
/// table of channel 1 cannot be written"); the EBLOCK is now retired and replaced, and
/// recovery finds the table in its replacement.
#[test]
fn a_bad_block_table_eblock_filled_by_failed_programs_is_replaced() {
    let cfg = small_config();
    let mut c = OxController::format(&cfg, 44).unwrap();
    let ppb = c.media.wblocks_per_eblock();
    let failing = c.system.bbt[1];
    let mut t = 0;
    while c.media.write_pointer(failing) < ppb {
        t = c.write_bbt(1, t).unwrap();
    }
    let first = c.media.first_ppn(failing);
    c.media.program_fails.extend(first..first + ppb);
    t = c.write_bbt(1, t).unwrap();
    assert!(c.media.program_fails.is_empty());
    assert!(c.media.is_bad(failing));
    let replacement = c.system.bbt[1];
    assert_ne!(replacement, failing);
    assert_eq!(c.stats().system_eblocks_replaced, 1);
    let (r, _) = OxController::recover(c.power_loss(t), t).unwrap();
    assert_eq!(r.system.bbt[1], replacement);
    r.check_invariants().unwrap();
}

/// The erases of a bad-block table's EBLOCK and of a checkpoint EBLOCK fail. Each is
/// replaced by a free EBLOCK, the device goes on taking batches, and recovery finds the
/// replacements by their records' TAGs and loses nothing. Either failure stopped the device.
#[test]
fn system_eblocks_whose_erase_fails_are_replaced_and_found_again_by_recovery() {
    let mut cfg = small_config();
    cfg.checkpoint.interval_ns = 500_000;
    let mut c = OxController::format(&cfg, 31).unwrap();
    let before = c.system.clone();
    c.media.erase_fails.insert(before.bbt[1]);
    c.media.erase_fails.insert(before.checkpoint[1]);
    // Channel 1's table EBLOCK fills, so its next version erases it.
    let mut t = 0;
    for _ in 0..=c.media.wblocks_per_eblock() {
        t = c.write_bbt(1, t).unwrap();
    }
    let mut rng = SimRng::new(31);
    let (oracle, t) = drive(&mut c, &mut rng, 400, 4, t);
    c.quiesce();
    let after = c.system.clone();
    assert_ne!(after.bbt[1], before.bbt[1]);
    assert_ne!(after.checkpoint[1], before.checkpoint[1]);
    assert_eq!(
        (after.bbt[0], after.checkpoint[0]),
        (before.bbt[0], before.checkpoint[0])
    );
    for b in [before.bbt[1], before.checkpoint[1]] {
        assert!(c.media.is_bad(b), "EBLOCK {b} is not marked bad");
    }
    assert_eq!(c.stats().system_eblocks_replaced, 2);
    assert!(c.stats().checkpoints > 2 * c.media.wblocks_per_eblock() as u64);
    c.check_invariants().unwrap();
    // Which checkpoint EBLOCK recovery calls the first is immaterial: records alternate.
    let same = |a: &crate::provision::SystemBlocks, b: &crate::provision::SystemBlocks| {
        let mut ca = a.checkpoint;
        let mut cb = b.checkpoint;
        ca.sort_unstable();
        cb.sort_unstable();
        a.bbt == b.bbt && ca == cb
    };
    let t = t.max(c.now_ns());
    let (mut r, _) = OxController::recover(c.power_loss(t), t).unwrap();
    assert!(same(&r.system, &after), "{:?} against {after:?}", r.system);
    r.check_invariants().unwrap();
    let now = r.now_ns();
    let (now, all) = read_all(&mut r, now);
    for (l, tok) in &oracle {
        assert_eq!(all[*l as usize], *tok, "LPID {l}");
    }
    // The replacements keep serving: more batches, checkpoints and a second recovery.
    let mut expect = oracle;
    let mut t = now.max(r.now_ns());
    let checkpoints = r.stats().checkpoints;
    for i in 0..200u64 {
        let pages: Vec<(u64, u64)> = (0..8)
            .map(|_| {
                let l = rng.below(cfg.logical_pages);
                (l, sector_token(l, 1_000_000 + i))
            })
            .collect();
        let id = r.submit(t, batch(&pages, &cfg)).unwrap();
        let done = r.run_until_complete(id).unwrap();
        assert!(done.result.is_ok(), "{:?}", done.result);
        expect.extend(pages);
        t = r.now_ns();
    }
    assert!(r.stats().checkpoints > checkpoints);
    let (mut r, _) = OxController::recover(r.power_loss(t), t).unwrap();
    assert!(same(&r.system, &after), "{:?} against {after:?}", r.system);
    let now = r.now_ns();
    let (_, all) = read_all(&mut r, now);
    for (l, tok) in &expect {
        assert_eq!(all[*l as usize], *tok, "LPID {l}");
    }
}

/// A controller that stopped (`fatal`) does nothing more, so work under way never ends: it
/// must not call itself busy, or a host waiting for it to go idle at a stonewall waits for
/// ever while the checkpoint timer ticks (found by the configuration soak). Every later
/// command fails with the error.
#[test]
fn a_stopped_controller_is_not_busy_and_refuses_commands() {
    let cfg = small_config();
    let mut c = OxController::format(&cfg, 5).unwrap();
    let pages: Vec<(u64, u64)> = (0..32).map(|l| (l, sector_token(l, 1))).collect();
    c.submit(0, batch(&pages, &cfg)).unwrap();
    assert!(c.busy());
    c.fatal = Some(OxError::NoSpace);
    assert!(!c.busy());
    assert!(matches!(
        c.submit(c.now_ns(), Request::ReadLpid(0)),
        Err(OxError::NoSpace)
    ));
}

/// Random erase failures, some of them of system EBLOCKs, with power cut at random points:
/// acknowledged batches survive whole.
#[test]
fn power_loss_with_erase_failures_keeps_batches_atomic() {
    let mut cfg = small_config();
    cfg.faults.erase_fail_probability = 0.05;
    cfg.checkpoint.interval_ns = 500_000;
    for seed in 0..5u64 {
        let mut rng = SimRng::new(4000 + seed);
        let cut = 2_000_000 + rng.below(20_000_000);
        let (submitted, base, off) = run_and_cut(&cfg, 4000 + seed, cut, 100);
        recover_and_check(&cfg, &submitted, &base, off);
    }
}

// ----- determinism and properties -------------------------------------------------------

fn hash_of_run(seed: u64) -> (u64, OxStats) {
    let mut cfg = small_config();
    cfg.faults.program_fail_probability = 0.002;
    let mut c = OxController::format(&cfg, seed).unwrap();
    let mut rng = SimRng::new(seed);
    drive(&mut c, &mut rng, 200, 4, 0);
    c.quiesce();
    (c.event_hash(), *c.stats())
}

#[test]
fn a_seed_reproduces_the_run_bit_for_bit() {
    let a = hash_of_run(42);
    let b = hash_of_run(42);
    assert_eq!(a, b);
    assert_ne!(a.0, hash_of_run(43).0);
}

#[derive(Debug, Clone)]
enum Op {
    Write(Vec<(u64, u8)>),
    Read(Vec<u64>),
    Trim(u64, u32),
    Checkpoint,
    Idle(u32),
}

fn op_strategy(lpids: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => prop::collection::vec((0..lpids, any::<u8>()), 1..40).prop_map(Op::Write),
        2 => prop::collection::vec(0..lpids, 1..20).prop_map(Op::Read),
        1 => (0..lpids - 8, 1u32..8).prop_map(|(l, n)| Op::Trim(l, n)),
        1 => Just(Op::Checkpoint),
        1 => (1u32..5000).prop_map(Op::Idle),
    ]
}

/// Submits operation `i` of a property test at `t` and runs it to completion, checking a
/// read against the oracle and keeping the oracle up to date; returns when it ended.
fn apply_op(
    c: &mut OxController,
    oracle: &mut BTreeMap<u64, u64>,
    i: usize,
    op: &Op,
    t: TimeNs,
) -> Result<TimeNs, TestCaseError> {
    let cfg = c.config().clone();
    Ok(match op {
        Op::Write(pages) => {
            let pages: Vec<(u64, u64)> = pages
                .iter()
                .map(|&(l, v)| (l, sector_token(l, i as u64 * 256 + v as u64)))
                .collect();
            let id = c.submit(t, batch(&pages, &cfg)).unwrap();
            let d = c.run_until_complete(id).unwrap();
            prop_assert!(d.result.is_ok(), "{:?}", d.result);
            for (l, tok) in pages {
                oracle.insert(l, tok);
            }
            d.done_ns
        }
        Op::Read(lpids) => {
            let id = c.submit(t, Request::ReadBatch(lpids.clone())).unwrap();
            let d = c.run_until_complete(id).unwrap();
            let got = d.result.unwrap();
            for (k, l) in lpids.iter().enumerate() {
                prop_assert_eq!(got[k], oracle.get(l).copied().unwrap_or(0));
            }
            d.done_ns
        }
        Op::Trim(l, n) => {
            let id = c
                .submit(t, Request::TrimBlocks { lba: *l, count: *n })
                .unwrap();
            for x in *l..*l + *n as u64 {
                oracle.remove(&x);
            }
            c.run_until_complete(id).unwrap().done_ns
        }
        Op::Checkpoint => {
            c.checkpoint_now();
            t
        }
        Op::Idle(us) => {
            let t = t + *us as u64 * 1_000;
            c.advance_to(t);
            t
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: afa_sim::proptest_cases(24), ..ProptestConfig::default() })]

    /// Random writes, reads, trims, checkpoints and idle time against an oracle, with
    /// concurrent commands; every read is checked, and the FTL's invariants hold at the end.
    #[test]
    fn random_operations_match_the_oracle(ops in prop::collection::vec(op_strategy(600), 1..60)) {
        let mut cfg = small_config();
        cfg.logical_pages = 600;
        let mut c = OxController::format(&cfg, 7).unwrap();
        let mut oracle: BTreeMap<u64, u64> = BTreeMap::new();
        let mut t = 0;
        for (i, op) in ops.iter().enumerate() {
            t = apply_op(&mut c, &mut oracle, i, op, t)?;
            for l in 0..cfg.logical_pages {
                prop_assert_eq!(c.peek_holds_data(l), oracle.contains_key(&l), "LPID {} after op {}", l, i);
            }
        }
        c.quiesce();
        prop_assert!(c.check_invariants().is_ok(), "{:?}", c.check_invariants());
    }

    /// The same on flash where one page program in 30 fails and log blocks have one forward
    /// link, so that data programs are amended, EBLOCKs retired and log blocks bridged; then
    /// power fails once the device is idle, and recovery keeps every completed write.
    #[test]
    fn random_operations_on_failing_flash_match_the_oracle_through_a_power_loss(
        ops in prop::collection::vec(op_strategy(600), 1..60),
        seed in 0u64..1_000,
    ) {
        let mut cfg = small_config();
        cfg.logical_pages = 600;
        cfg.log_forward_links = 1;
        cfg.faults.program_fail_probability = 1.0 / 30.0;
        let mut c = OxController::format(&cfg, seed).unwrap();
        let mut oracle: BTreeMap<u64, u64> = BTreeMap::new();
        // The format's own programs (bad-block tables, the first checkpoint record) end
        // after time 0; a power loss before them finds an unformatted device, so the
        // commands start once they are on flash.
        let mut t = 10 * cfg.timing.of(cfg.cell_mode).program_ns;
        for (i, op) in ops.iter().enumerate() {
            t = apply_op(&mut c, &mut oracle, i, op, t)?;
        }
        c.quiesce();
        prop_assert!(c.check_invariants().is_ok(), "{:?}", c.check_invariants());
        let t = t.max(c.now_ns());
        let (mut r, _) = OxController::recover(c.power_loss(t), t).unwrap();
        prop_assert!(r.check_invariants().is_ok(), "{:?}", r.check_invariants());
        let now = r.now_ns();
        let (_, all) = read_all(&mut r, now);
        for l in 0..cfg.logical_pages {
            prop_assert_eq!(all[l as usize], oracle.get(&l).copied().unwrap_or(0), "LPID {}", l);
        }
    }
}

#[test]
fn checkpoints_that_overrun_their_interval_leave_the_device_idle_between_them() {
    // A 10 ns interval: every checkpoint overruns it. The timer waits for each and gives
    // the device a whole interval without one, so a host that waits for it to go idle (a
    // job's stonewall) goes on, and the timer does not tick through the checkpoint.
    let mut cfg = small_config();
    cfg.checkpoint.interval_ns = 10;
    let mut c = OxController::format(&cfg, 1).unwrap();
    let mut t = 0;
    let mut expect = vec![0u64; cfg.logical_pages as usize];
    for round in 0..20u64 {
        let pages: Vec<(u64, u64)> = (0..16)
            .map(|l| {
                let lpid = (round * 16 + l) % cfg.logical_pages;
                (lpid, sector_token(lpid, round + 1))
            })
            .collect();
        for &(lpid, token) in &pages {
            expect[lpid as usize] = token;
        }
        let id = c.submit(t, batch(&pages, &cfg)).unwrap();
        assert!(c.run_until_complete(id).unwrap().result.is_ok());
        let mut events = 0;
        while c.busy() {
            let next = c.next_event_ns().expect("a busy device has an event");
            c.advance_to(next);
            events += 1;
            assert!(events < 10_000, "round {round}: the device never went idle");
        }
        t = c.now_ns();
    }
    assert!(c.stats().checkpoints >= 20, "{}", c.stats().checkpoints);
    let (_, tokens) = read_all(&mut c, t);
    assert_eq!(tokens, expect);
}

/// The host-to-device direction of the link is one NVMe-oF/TCP connection, a byte stream:
/// a read or trim command sent after a batch arrives only after the batch's data, so it
/// waits for that transfer, while one sent on an idle link arrives after the latency alone.
#[test]
fn a_read_sent_after_a_batch_arrives_after_the_batchs_data() {
    let cfg = small_config();
    let rb = cfg.terms.rblock_bytes as u64;
    let pages: Vec<(u64, u64)> = (0..200).map(|l| (l, sector_token(l, 1))).collect();
    let transfer_ns = afa_sim::transfer_ns((pages.len() as u64 + 1) * rb, cfg.costs.link_mb_s);
    let read_latency = |after_batch: bool| -> u64 {
        let mut c = OxController::format(&cfg, 5).unwrap();
        // The page read is written first, and everything settles, so that the read finds
        // it on flash either way.
        let w = c.submit(0, batch(&[(3999, 7)], &cfg)).unwrap();
        c.run_until_complete(w).unwrap();
        c.quiesce();
        let t = c.now_ns();
        if after_batch {
            c.submit(t, batch(&pages, &cfg)).unwrap();
        }
        let r = c.submit(t, Request::ReadLpid(3999)).unwrap();
        let done = c.run_until_complete(r).unwrap();
        assert_eq!(done.result.clone().unwrap(), vec![7]);
        done.done_ns - t
    };
    let idle = read_latency(false);
    let behind = read_latency(true);
    assert!(
        behind >= idle + transfer_ns,
        "a read behind {transfer_ns} ns of batch data took {behind} ns, {idle} ns on an idle link"
    );
}

// ----- space at the largest accepted logical_pages -------------------------------------

/// `cfg` with `logical_pages` at the largest value `validate` accepts.
fn at_max_logical(mut cfg: OxConfig) -> OxConfig {
    cfg.logical_pages = u64::MAX;
    let err = cfg.validate().unwrap_err().to_string();
    let max: u64 = err
        .split("1..=")
        .nth(1)
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no bound in {err}"));
    cfg.logical_pages = max;
    cfg.validate().unwrap();
    cfg
}

/// Writes the whole logical space once in 64 KiB block writes, then overwrites it with
/// `ops` block writes of 4–64 KiB at random places, `iodepth` of them under way at once, as
/// fio's `randwrite` does. Returns the first failed write's error, if any.
fn fill_then_overwrite(
    c: &mut OxController,
    seed: u64,
    iodepth: usize,
    ops: usize,
) -> Result<(), OxError> {
    let n = c.logical_pages();
    let mut rng = SimRng::new(seed);
    let mut version = 1u64;
    let mut jobs: Vec<(u64, u32)> = (0..n)
        .step_by(16)
        .map(|l| (l, 16.min((n - l) as u32)))
        .collect();
    for _ in 0..ops {
        let pages = 1 + rng.below(16) as u32;
        let lba = rng.below(n - pages as u64 + 1);
        jobs.push((lba, pages));
    }
    let mut t = c.now_ns();
    let mut under_way = 0usize;
    let mut next = jobs.into_iter();
    loop {
        while under_way < iodepth {
            let Some((lba, pages)) = next.next() else {
                break;
            };
            version += 1;
            let tokens = (lba..lba + pages as u64)
                .map(|l| sector_token(l, version))
                .collect();
            c.submit(t, Request::WriteBlocks { lba, tokens })?;
            under_way += 1;
        }
        if under_way == 0 {
            return Ok(());
        }
        let Some(when) = c.next_event_ns() else {
            return Err(OxError::Stuck(0));
        };
        // A device that only checkpoints on its timer while the writes wait never runs
        // out of events; an hour of device time is far beyond any run here (the longest,
        // at the largest logical space, takes about ten minutes).
        if when > 3600 * 1_000_000_000 {
            return Err(OxError::Stuck(under_way as u64));
        }
        c.advance_to(when);
        t = c.now_ns();
        for done in c.take_completions() {
            under_way -= 1;
            done.result?;
        }
    }
}

/// A program that fails when the channels are down to the free EBLOCKs GC's copies may take
/// waits for GC to give space back, and its context goes on: the device used to stop with
/// `NoSpace` there, though GC was running and nearly half the written flash was stale
/// (found by the config soak: two channels of one LUN, two thirds of the largest logical
/// space, the write-back cache and one program or erase in 500 failing).
#[test]
fn a_failed_program_waits_for_gc_when_the_channels_are_down_to_their_reserve() {
    let mut stalled = 0;
    for seed in 0..16 {
        let mut cfg = small_config();
        cfg.channels = 2;
        cfg.luns_per_channel = 1;
        cfg.terms.wblock_bytes = 32 * 1024;
        cfg.terms.eblock_bytes = 256 * 1024;
        cfg.log_forward_links = 1;
        cfg.map_cache_pages = 8;
        cfg.logical_pages = 5120;
        cfg.write_cache.write_back = true;
        cfg.faults.program_fail_probability = 0.002;
        cfg.faults.erase_fail_probability = 0.002;
        let mut c = OxController::format(&cfg, seed).unwrap();
        // More writes than this wear the device out: one WBLOCK program in 500 failing
        // retires a third of its EBLOCKs over 4000 overwrites, and it is full for good.
        fill_then_overwrite(&mut c, seed, 32, 2000).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        // What the write-back cache acknowledged, programmed in the background.
        let now = c.now_ns();
        c.advance_to(now + 1_000_000_000);
        assert!(
            c.fatal_error().is_none(),
            "seed {seed}: {:?}",
            c.fatal_error()
        );
        stalled += c.stats().stalled_amendments;
    }
    assert!(stalled > 0);
}

/// The geometries the space tests fill to the largest `logical_pages`: (a) the tests'
/// small device, 4 channels of 2 LUNs with a MAP cache of 2 pages; (b) 2 channels of 4 LUNs
/// with 16 KiB WBLOCKs; (c) 8 channels of 1 LUN with 256 KiB EBLOCKs; (d) a 1 s checkpoint
/// interval and a MAP cache of 64 pages; (e) 2 channels of 8 LUNs; (f) the write-back cache.
fn space_geometries() -> Vec<(&'static str, OxConfig)> {
    let mut b = small_config();
    b.channels = 2;
    b.luns_per_channel = 4;
    b.eblocks_per_lun = 40;
    b.terms.wblock_bytes = 16 * 1024;
    b.terms.eblock_bytes = 128 * 1024;
    b.map_cache_pages = 8;
    b.log_forward_links = 1;
    let mut c = small_config();
    c.channels = 8;
    c.luns_per_channel = 1;
    c.eblocks_per_lun = 40;
    c.terms.eblock_bytes = 256 * 1024;
    c.map_cache_pages = 4;
    let mut d = small_config();
    d.checkpoint.interval_ns = 1_000_000_000;
    d.map_cache_pages = 64;
    let mut e = small_config();
    e.channels = 2;
    e.luns_per_channel = 8;
    e.eblocks_per_lun = 40;
    e.log_forward_links = 1;
    let mut f = small_config();
    f.write_cache.write_back = true;
    vec![
        ("a", small_config()),
        ("b", b),
        ("c", c),
        ("d", d),
        ("e", e),
        ("f", f),
    ]
}

/// Two devices at the largest `logical_pages` the configuration accepts, filled and then
/// overwritten twice at random, one request at a time and 64 at once, never run out of
/// flash. The accepted bound used to leave fewer spare EBLOCKs than the provisioner holds
/// back from user writes, the log and table EBLOCKs written between checkpoints were
/// counted nowhere, and GC copies took the free EBLOCKs of channels whose victims held only
/// live pages: writes failed with `NoSpace` at iodepth 16.
#[test]
fn a_device_at_its_largest_logical_space_takes_random_overwrites() {
    let mut geometries = space_geometries().into_iter().map(|(_, cfg)| cfg);
    let (four_channels, two_channels) = (geometries.next().unwrap(), geometries.next().unwrap());
    for (cfg, seed, iodepth) in [(four_channels, 1, 64), (two_channels, 2, 1)] {
        let cfg = at_max_logical(cfg);
        let mut c = OxController::format(&cfg, seed).unwrap();
        // The reserve counts on a bound on the table pages a checkpoint writes.
        let table_pages = c.map.pages()
            + c.map.map_s.pages()
            + c.gbitv.pages()
            + c.gbitv.gbitv_s.pages()
            + c.wear.pages();
        assert!(table_pages as u64 <= cfg.table_pages());
        let overwrites = 2 * cfg.logical_pages as usize;
        fill_then_overwrite(&mut c, seed, iodepth, overwrites).unwrap_or_else(|e| {
            panic!(
                "{} logical pages at iodepth {iodepth}: {e}",
                cfg.logical_pages
            )
        });
        assert!(c.stats().gc_victims > 0 && c.stats().checkpoints > 0);
    }
}

/// A failed erase of a system block or a log block no forward link could take stops the
/// device as a failure of its medium; it was reported as a command not supported.
#[test]
fn flash_failures_the_ftl_cannot_absorb_reach_the_host_as_medium_failures() {
    use afa_ssd::DeviceError;
    let erase = OxError::Nand(afa_nand::NandError::EraseFailed { block: 36 });
    for e in [erase, OxError::LogWriteFailed { block_seq: 7 }] {
        let text = e.to_string();
        match crate::block::device_error(e) {
            DeviceError::Medium(m) => assert_eq!(m, text),
            other => panic!("{text} became {other:?}"),
        }
    }
    assert!(matches!(
        crate::block::device_error(OxError::EmptyBatch),
        DeviceError::Unsupported(_)
    ));
}

/// A GC start threshold above the used fraction at which a channel closes to user writes
/// (here 1 − 4 / 20 = 0.8 of a channel of 20 usable EBLOCKs) was accepted and never
/// reached: the writes waited for a GC that never started while the checkpoint timer ran on
/// for ever. GC now also starts in a channel closed to user writes.
#[test]
fn gc_starts_in_a_channel_closed_to_user_writes_below_its_start_threshold() {
    let mut cfg = OxConfig {
        luns_per_channel: 1,
        eblocks_per_lun: 21,
        logical_pages: 345,
        ..OxConfig::default()
    };
    cfg.terms.eblock_bytes = 128 * 1024;
    cfg.gc.start_used_fraction = 0.95;
    cfg.validate().unwrap();
    let mut c = OxController::format(&cfg, 1).unwrap();
    fill_then_overwrite(&mut c, 1, 16, 1000).unwrap();
    assert!(c.stats().gc_victims > 0);
}

/// The soak behind `a_device_at_its_largest_logical_space_takes_random_overwrites`, too long
/// for CI (about five minutes): six geometries at the largest `logical_pages`, three seeds
/// at iodepths 1, 16 and 64 each. `GEOM=ab` runs only geometries a and b. Run with
/// `cargo test -p afa-ox --lib largest_logical_space_soak -- --ignored --nocapture`.
#[test]
#[ignore]
fn largest_logical_space_soak() {
    let sel = std::env::var("GEOM").unwrap_or_default();
    let mut bad = 0;
    for (name, g) in space_geometries() {
        if !sel.is_empty() && !sel.contains(name) {
            continue;
        }
        let cfg = at_max_logical(g);
        let n = cfg.logical_pages as usize;
        eprintln!(
            "geometry {name}: logical_pages {n} of {} rblocks",
            cfg.eblocks_total() as u64 * cfg.terms.rblocks_per_eblock() as u64
        );
        for seed in 1..=3u64 {
            for qd in [1usize, 16, 64] {
                let mut c = OxController::format(&cfg, seed).unwrap();
                let r = fill_then_overwrite(&mut c, seed, qd, n * 2);
                let s = c.stats();
                eprintln!(
                    "{name} seed {seed} qd {qd}: {r:?} wa {:.2} ckpts {}",
                    (s.user_write_bytes + s.gc_write_bytes + s.padding_bytes) as f64
                        / s.user_write_bytes as f64,
                    s.checkpoints
                );
                if r.is_err() {
                    bad += 1;
                }
            }
        }
    }
    assert_eq!(bad, 0);
}

/// One-RBLOCK random writes at iodepth 32 on a device of 512-byte RBLOCKs and EBLOCKs of
/// four WBLOCKs, a quarter full, with the default MAP cache of 8 pages: GC's MAP updates
/// push a dirty MAP page out for most pages they move, each a WBLOCK of the table stream.
/// Dead table EBLOCKs waited for the next checkpoint, piled up to 61% of the flash, and the
/// log found no EBLOCK for the erase records that would have freed them: writes failed
/// with `NoSpace` after 80,058 of them (found by the configuration soak).
#[test]
fn table_eblocks_are_reclaimed_when_their_pages_die_so_map_churn_cannot_fill_the_device() {
    let cfg = OxConfig {
        terms: FlashTerms {
            rblock_bytes: 512,
            wblock_bytes: 8192,
            eblock_bytes: 32768,
            tag_bytes: 16,
        },
        channels: 4,
        luns_per_channel: 4,
        eblocks_per_lun: 117,
        logical_pages: 30000,
        log_forward_links: 2,
        max_batch_pages: 63,
        ..OxConfig::default()
    };
    let mut c = OxController::format(&cfg, 1).unwrap();
    let n = cfg.logical_pages;
    let mut rng = SimRng::new(1);
    let mut tokens = vec![0u64; n as usize];
    let (mut t, mut under_way, mut issued) = (0, 0, 0u64);
    loop {
        while under_way < 32 && issued < 100_000 {
            let lba = if issued < n { issued } else { rng.below(n) };
            issued += 1;
            tokens[lba as usize] = sector_token(lba, issued);
            let write = Request::WriteBlocks {
                lba,
                tokens: vec![tokens[lba as usize]],
            };
            c.submit(t, write).unwrap();
            under_way += 1;
        }
        if under_way == 0 {
            break;
        }
        c.advance_to(c.next_event_ns().expect("writes are under way"));
        t = c.now_ns();
        for done in c.take_completions() {
            under_way -= 1;
            assert!(done.result.is_ok(), "write {issued}: {:?}", done.result);
        }
    }
    assert!(c.stats().gc_victims > 0);
    c.quiesce();
    c.check_invariants().unwrap();
    let now = c.now_ns();
    let (_, all) = read_all(&mut c, now);
    assert_eq!(all, tokens);
}

/// A power loss during recovery, while its first checkpoint is being written, loses no
/// acknowledged batch. The log after a recovery continues in fresh EBLOCKs that only that
/// checkpoint's record leads to, so a GC pass that ran meanwhile (its record in the new log,
/// its victim erased) was invisible to the next recovery, whose MAP still pointed into the
/// erased victim. GC now waits for recovery's checkpoint.
#[test]
fn power_loss_during_recovery_loses_no_acknowledged_batch() {
    let cfg = small_config();
    let mut cuts = 0;
    for seed in 0..12u64 {
        let mut rng = SimRng::new(3000 + seed);
        let cut = 1_000_000 + rng.below(40_000_000);
        let ops = 300 + 20 * seed as usize;
        for delay_ns in [900_000u64, 2_500_000, 4_000_000] {
            let (submitted, base, off) = run_and_cut(&cfg, 3000 + seed, cut, ops);
            let at = off.at_ns + 1_000_000;
            let off = OxController::power_loss_during_recovery(off, at, delay_ns).unwrap();
            cuts += 1;
            recover_and_check(&cfg, &submitted, &base, off);
        }
    }
    assert_eq!(cuts, 36);
}

/// A device whose grown bad blocks took every free EBLOCK comes up read-only after a power
/// loss: recovery needs free EBLOCKs for the log and its checkpoint, and without them the
/// device failed to start, though every acknowledged page was on the flash. Reads are
/// served, writes and trims are refused by name, and nothing is written, so the next
/// recovery finds the same state.
#[test]
fn a_device_without_free_eblocks_recovers_read_only_and_serves_every_acknowledged_page() {
    let cfg = small_config();
    let mut c = OxController::format(&cfg, 41).unwrap();
    let mut rng = SimRng::new(41);
    let (oracle, _) = drive(&mut c, &mut rng, 300, 3, 0);
    c.quiesce();
    let t = c.now_ns();
    let mut off = c.power_loss(t);
    let retired = off.media.retire_every_free_eblock().unwrap();
    assert!(retired > 0, "the run left no free EBLOCK to take away");
    for round in 0..2 {
        let at = off.at_ns;
        let (mut c, report) = OxController::recover(off, at + 1_000_000).unwrap();
        assert!(report.read_only, "round {round}: {report:?}");
        assert!(c.read_only().is_some());
        c.check_invariants().unwrap();
        let now = c.now_ns();
        let (_, all) = read_all(&mut c, now);
        for (l, tok) in &oracle {
            assert_eq!(all[*l as usize], *tok, "round {round}: LPID {l}");
        }
        let now = c.now_ns();
        let refused = c.submit(now, batch(&[(1, sector_token(1, 7))], &cfg));
        assert!(
            matches!(refused, Err(OxError::ReadOnly(_))),
            "round {round}: {refused:?}"
        );
        let trim = c.submit(now, Request::TrimBlocks { lba: 0, count: 1 });
        assert!(matches!(trim, Err(OxError::ReadOnly(_))), "{trim:?}");
        let before: Vec<u32> = (0..c.media().eblocks_total())
            .map(|b| c.media().write_pointer(b))
            .collect();
        c.quiesce();
        let after: Vec<u32> = (0..c.media().eblocks_total())
            .map(|b| c.media().write_pointer(b))
            .collect();
        assert_eq!(before, after, "a read-only device wrote to the flash");
        let t = c.now_ns();
        off = c.power_loss(t);
    }
}
