use super::*;

fn small() -> Geometry {
    Geometry {
        channels: 2,
        chips_per_channel: 1,
        dies_per_chip: 2,
        planes_per_die: 2,
        blocks_per_plane: 4,
        pages_per_block: 8,
        page_bytes: 4096,
        sector_bytes: 4096,
        oob_bytes_per_page: 64,
    }
}

fn nand(payload: PayloadMode) -> Nand {
    Nand::new(
        small(),
        NandTiming::default(),
        CellMode::Mlc,
        payload,
        FaultConfig::default(),
        1,
    )
    .unwrap()
}

#[test]
fn pages_are_programmed_in_order() {
    let mut n = nand(PayloadMode::None);
    assert!(n.program(0, 0).is_ok());
    let err = n.program(2, 0).unwrap_err();
    assert_eq!(
        err,
        NandError::OutOfOrder {
            block: 0,
            page: 2,
            next: 1
        }
    );
    n.erase(0, 0).unwrap();
    assert_eq!(n.next_page(0), 0);
    assert_eq!(n.erase_count(0), 1);
}

#[test]
fn same_die_serialises_and_other_dies_overlap() {
    let mut n = nand(PayloadMode::None);
    let t = n.timing().clone();
    let xfer = transfer_ns(4096, t.channel_mb_s);
    // Two programs on the same plane of one die run back to back.
    let a = n.program(0, 0).unwrap();
    let b = n.program(1, 0).unwrap();
    assert_eq!(a, xfer + t.mlc.program_ns);
    assert_eq!(b, a + t.mlc.program_ns);
    // A block on another channel's die starts at once.
    let other = small().block_in_plane(small().plane_index(1, 0, 0, 0), 0) * 8;
    let c = n.program(other, 0).unwrap();
    assert_eq!(c, xfer + t.mlc.program_ns);
}

#[test]
fn multi_plane_program_shares_the_array_time() {
    let g = small();
    let mut n = nand(PayloadMode::None);
    let t = n.timing().clone();
    let plane1_block = g.block_in_plane(g.plane_index(0, 0, 0, 1), 0);
    let xfer = transfer_ns(4096, t.channel_mb_s);
    let a = n.program(0, 0).unwrap();
    assert_eq!(a, xfer + t.mlc.program_ns);
    // The second plane's data arrives one transfer later; the two planes program together,
    // so the pair ends one transfer after a lone program would, not a whole program later.
    let b = n.program(plane1_block * g.pages_per_block, 0).unwrap();
    assert_eq!(b, 2 * xfer + t.mlc.program_ns);
    // A third program on plane 0 cannot join (its plane is taken) and waits.
    let c = n.program(1, 0).unwrap();
    assert_eq!(c, b + t.mlc.program_ns);
    // With data ready at once (a read batch), the second plane joins.
    let mut n = nand(PayloadMode::None);
    let r1 = n.read(0, 0, 4096);
    let r2 = n.read(plane1_block * g.pages_per_block, 0, 4096);
    assert_eq!(r1, t.mlc.read_ns + xfer);
    assert_eq!(r2, t.mlc.read_ns + 2 * xfer);
}

#[test]
fn slc_blocks_hold_fewer_pages_and_are_faster() {
    let mut n = nand(PayloadMode::None);
    assert_eq!(n.pages_in_mode(CellMode::Slc), 4);
    n.set_block_mode(1, CellMode::Slc).unwrap();
    let done = n.program(8, 0).unwrap();
    let t = n.timing().clone();
    assert_eq!(done, transfer_ns(4096, t.channel_mb_s) + t.slc.program_ns);
    assert_eq!(n.counters().programs[0], 1);
    for p in 1..4 {
        n.program(8 + p, 0).unwrap();
    }
    assert!(matches!(
        n.program(12, 0),
        Err(NandError::OutOfOrder { .. })
    ));
    assert!(n.set_block_mode(1, CellMode::Mlc).is_err());
}

#[test]
fn store_copies_payload_and_tags() {
    let mut n = nand(PayloadMode::Token);
    n.store_mut()
        .page_mut(3)
        .copy_from_slice(&7u64.to_le_bytes());
    n.store_mut().page_tags_mut(3)[0] = 9;
    n.store_mut().copy_page(3, 10);
    assert_eq!(n.store().page(10), &7u64.to_le_bytes());
    assert_eq!(n.store().page_tags(10).unwrap()[0], 9);
    assert_eq!(n.store().tag_bytes_per_sector(), 56);
}

#[test]
fn injected_faults_fail_programs_and_erases() {
    let faults = FaultConfig {
        factory_bad_block_fraction: 0.0,
        program_fail_probability: 0.5,
        erase_fail_probability: 0.5,
        read_fail_probability: 0.0,
    };
    let mut n = Nand::new(
        small(),
        NandTiming::default(),
        CellMode::Mlc,
        PayloadMode::None,
        faults,
        3,
    )
    .unwrap();
    let mut failed = 0;
    for p in 0..8 {
        if n.program(p, 0).is_err() {
            failed += 1;
        }
    }
    assert!(failed > 0 && failed < 8, "{failed} of 8 failed");
    let mut bad = 0;
    for b in 1..16 {
        if n.erase(b, 0).is_err() {
            bad += 1;
            assert!(n.is_bad(b));
            assert!(matches!(
                n.program(b * 8, 0),
                Err(NandError::BadBlock { .. })
            ));
        }
    }
    assert!(bad > 0);
}

#[test]
fn bad_geometry_is_named() {
    let mut g = small();
    g.page_bytes = 3000;
    let err = g.validate().unwrap_err().to_string();
    assert!(err.contains("page_bytes"), "{err}");
    let mut g = small();
    g.channels = 0;
    assert!(g.validate().unwrap_err().to_string().contains("channels"));
}

/// Mutated soak configurations found a die of 65,535 planes, whose plane bit overflowed its
/// mask with a panic, and counts whose product overflowed the u32 helpers.
#[test]
fn geometries_beyond_the_masks_and_page_numbers_are_refused_without_a_panic() {
    let mut g = small();
    g.planes_per_die = 33;
    let err = g.validate().unwrap_err().to_string();
    assert!(err.contains("planes_per_die = 33"), "{err}");
    g.planes_per_die = 32;
    assert!(g.validate().is_ok());
    let mut g = small();
    g.channels = u32::MAX;
    g.chips_per_channel = u32::MAX;
    g.blocks_per_plane = u32::MAX;
    let err = g.validate().unwrap_err().to_string();
    assert!(err.contains("2^32-1"), "{err}");
}

/// A medium whose payload could not be allocated on any machine is refused with the numbers
/// and what to change, where the process used to abort in the allocator (65,535 channels of
/// full payload asked for 4 TiB). The limit is read from Linux's /proc/meminfo.
#[test]
#[cfg(target_os = "linux")]
fn a_medium_too_large_for_the_machine_is_refused_with_the_payload_to_change() {
    // 2^31 pages of 64 KiB: 128 TiB of full payload.
    let g = Geometry {
        channels: 1024,
        chips_per_channel: 16,
        dies_per_chip: 8,
        planes_per_die: 4,
        blocks_per_plane: 256,
        pages_per_block: 16,
        page_bytes: 65536,
        sector_bytes: 4096,
        oob_bytes_per_page: 64,
    };
    assert!(g.validate().is_ok());
    let err = Nand::new(
        g,
        NandTiming::default(),
        CellMode::Mlc,
        PayloadMode::Full,
        FaultConfig::default(),
        1,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("payload = \"full\""), "{err}");
    assert!(err.contains("payload = \"token\" or \"none\""), "{err}");
}

#[test]
fn full_units_carry_their_token_and_detect_corruption() {
    let token = sector_token(42, 7);
    assert_ne!(token, 0);
    let mut unit = vec![0u8; 4096];
    fill_unit(token, &mut unit);
    assert_eq!(unit_token(&unit), token);
    assert!(unit_matches(token, &unit));
    unit[4000] ^= 1;
    assert!(!unit_matches(token, &unit));
    let mut zero = vec![0u8; 512];
    fill_unit(0, &mut zero);
    assert!(unit_matches(0, &zero));
    assert!(!unit_matches(token, &zero));
}

fn nand_scheduled(scheduling: Scheduling) -> Nand {
    nand_timed(NandTiming {
        scheduling,
        multi_plane: false,
        ..NandTiming::default()
    })
}

/// The small medium of these tests with `timing`, payload none.
fn nand_timed(timing: NandTiming) -> Nand {
    Nand::new(
        small(),
        timing,
        CellMode::Mlc,
        PayloadMode::None,
        FaultConfig::default(),
        1,
    )
    .unwrap()
}

#[test]
fn a_read_ready_now_runs_in_the_idle_gap_before_a_program_booked_for_later() {
    let xfer = transfer_ns(4096, NandTiming::default().channel_mb_s);
    let t = NandTiming::default();
    let later_ns = 1_000_000;
    let block1_page = 8; // block 1 is on plane 0 of die 0, like block 0.
    let mut fill = nand_scheduled(Scheduling::FillGaps);
    let mut first_come = nand_scheduled(Scheduling::FirstCome);
    for n in [&mut fill, &mut first_come] {
        n.program(0, 0).unwrap();
        // A program whose data is ready only later (a parity after an XOR) books the die then.
        n.program(block1_page, later_ns).unwrap();
    }
    let program_end = xfer + t.mlc.program_ns;
    // The die is idle between the first program and the later one: a read fits there.
    assert_eq!(
        fill.read(1, program_end, 4096),
        program_end + t.mlc.read_ns + xfer
    );
    assert!(fill.die_idle_at(0, program_end + t.mlc.read_ns));
    // First-come booking makes it wait behind the program booked for later.
    assert_eq!(
        first_come.read(1, program_end, 4096),
        later_ns + xfer + t.mlc.program_ns + t.mlc.read_ns + xfer
    );
}

#[test]
fn gap_filling_never_programs_a_blocks_pages_out_of_order_in_time() {
    let t = NandTiming::default();
    let mut n = nand_scheduled(Scheduling::FillGaps);
    let late = n.program(0, 5_000_000).unwrap();
    // Page 1's data is ready at once, and the die is idle before the late program, but the
    // block's pages are programmed in order: page 1 follows page 0.
    let next = n.program(1, 0).unwrap();
    assert_eq!(next, late + t.mlc.program_ns);
    // The block's erase also waits for its last program.
    assert_eq!(n.erase(0, 0).unwrap(), next + t.mlc.erase_ns);
}

#[test]
fn restore_block_sets_write_pointer_erase_count_and_bad_flag() {
    let mut a = nand(PayloadMode::Token);
    // Build some history: two erases of block 1, three pages in block 2, block 3 retired.
    a.erase(1, 0).unwrap();
    a.erase(1, 0).unwrap();
    let ppb = a.geometry().pages_per_block;
    for p in 0..3 {
        a.program(2 * ppb + p, 0).unwrap();
    }
    a.retire_block(3);
    let mut b = nand(PayloadMode::Token);
    for block in 0..a.geometry().blocks_total() {
        b.restore_block(
            block,
            a.next_page(block),
            a.erase_count(block),
            a.is_bad(block),
        )
        .unwrap();
    }
    for block in 0..a.geometry().blocks_total() {
        assert_eq!(b.next_page(block), a.next_page(block), "block {block}");
        assert_eq!(b.erase_count(block), a.erase_count(block), "block {block}");
        assert_eq!(b.is_bad(block), a.is_bad(block), "block {block}");
    }
    // The restored write pointer is enforced: the next program must go to page 3.
    assert!(matches!(
        b.program(2 * ppb + 2, 0),
        Err(NandError::OutOfOrder { next: 3, .. })
    ));
    b.program(2 * ppb + 3, 0).unwrap();
    assert!(matches!(
        b.program(3 * ppb, 0),
        Err(NandError::BadBlock { block: 3 })
    ));
}

#[test]
fn restore_block_refuses_a_pointer_past_the_block_or_an_unknown_block() {
    let mut n = nand(PayloadMode::None);
    let ppb = n.geometry().pages_per_block;
    let blocks = n.geometry().blocks_total();
    assert!(matches!(
        n.restore_block(0, ppb + 1, 0, false),
        Err(NandError::RestorePastEnd { .. })
    ));
    assert!(matches!(
        n.restore_block(blocks, 0, 0, false),
        Err(NandError::RestoreOutOfRange { .. })
    ));
    // A full block is a valid restored state.
    n.restore_block(0, ppb, 5, false).unwrap();
    assert_eq!(n.next_page(0), ppb);
}

fn nand_with_read_suspend() -> Nand {
    nand_timed(NandTiming {
        multi_plane: false,
        read_suspend: true,
        ..NandTiming::default()
    })
}

#[test]
fn a_read_suspends_the_program_in_progress_and_later_work_moves_back() {
    let t = NandTiming::default();
    let xfer = transfer_ns(4096, t.channel_mb_s);
    let mut n = nand_with_read_suspend();
    let program_end = n.program(0, 0).unwrap();
    assert_eq!(program_end, xfer + t.mlc.program_ns);
    // Block 1 (plane 1) lives on the same die; a read arriving mid-program goes first.
    let ready = xfer + 100_000;
    let read_end = n.read(8 + 1, ready, 4096);
    assert_eq!(read_end, ready + t.suspend_ns + t.mlc.read_ns + xfer);
    assert_eq!(n.counters().read_suspends, 1);
    // The program resumes after the read: work booked later on the die starts only after
    // the program's remaining time, now that much later.
    let displaced = t.suspend_ns + t.mlc.read_ns;
    assert_eq!(n.die_free_ns(0), program_end + displaced);
    let erase_end = n.erase(8, 0).unwrap();
    assert_eq!(erase_end, program_end + displaced + t.mlc.erase_ns);
}

#[test]
fn a_read_suspends_an_erase_but_never_another_read() {
    let t = NandTiming::default();
    let xfer = transfer_ns(4096, t.channel_mb_s);
    let mut n = nand_with_read_suspend();
    let erase_end = n.erase(1, 0).unwrap();
    let first = n.read(0, 1_000_000, 4096);
    assert_eq!(first, 1_000_000 + t.suspend_ns + t.mlc.read_ns + xfer);
    // A second read ready at the same time waits for the first one's array read, not for
    // the erase, and the erase stays suspended in between.
    let second = n.read(64, 1_000_000, 4096);
    assert_eq!(second, 1_000_000 + t.suspend_ns + 2 * t.mlc.read_ns + xfer);
    assert!(second < erase_end);
    assert_eq!(n.counters().read_suspends, 2);
}

#[test]
fn without_read_suspend_a_read_waits_for_the_program_in_progress() {
    let t = NandTiming::default();
    let xfer = transfer_ns(4096, t.channel_mb_s);
    let mut n = nand_scheduled(Scheduling::FillGaps);
    let program_end = n.program(0, 0).unwrap();
    assert_eq!(
        n.read(9, xfer + 100_000, 4096),
        program_end + t.mlc.read_ns + xfer
    );
    assert_eq!(n.counters().read_suspends, 0);
}

fn nand_with_erase_suspend() -> Nand {
    nand_timed(NandTiming {
        multi_plane: false,
        erase_suspend: true,
        ..NandTiming::default()
    })
}

#[test]
fn with_erase_suspend_alone_a_read_goes_ahead_of_an_erase_but_not_of_a_program() {
    let t = NandTiming::default();
    let xfer = transfer_ns(4096, t.channel_mb_s);
    let mut n = nand_with_erase_suspend();
    // Block 1 (plane 1) shares die 0 with block 0: a read of block 0 ready mid-erase goes
    // first, and the erase resumes after it.
    let erase_end = n.erase(1, 0).unwrap();
    let read_end = n.read(0, 1_000_000, 4096);
    assert_eq!(read_end, 1_000_000 + t.suspend_ns + t.mlc.read_ns + xfer);
    assert_eq!(n.counters().read_suspends, 1);
    let displaced = t.suspend_ns + t.mlc.read_ns;
    assert_eq!(n.die_free_ns(0), erase_end + displaced);
    // A program booked after the resumed erase is not suspended: a read ready in the middle
    // of it waits for it to end.
    let program_end = n.program(8, 0).unwrap();
    assert_eq!(program_end, erase_end + displaced + t.mlc.program_ns);
    let ready = program_end - t.mlc.program_ns / 2;
    assert_eq!(n.read(9, ready, 4096), program_end + t.mlc.read_ns + xfer);
    assert_eq!(n.counters().read_suspends, 1);
    // An erase booked behind the program and that read (block 9 is on die 0 too, and so is
    // page 2 of block 0): a read ready mid-program waits for the program and for the read
    // before it, then goes ahead of the erase.
    let erase_9_end = n.erase(9, 0).unwrap();
    assert_eq!(erase_9_end, program_end + t.mlc.read_ns + t.mlc.erase_ns);
    let behind_program = n.read(2, program_end - 1_000, 4096);
    assert_eq!(behind_program, program_end + 2 * t.mlc.read_ns + xfer);
    assert_eq!(n.counters().read_suspends, 2);
}

#[test]
fn an_erase_suspend_as_long_as_an_erase_is_refused() {
    let timing = NandTiming {
        erase_suspend: true,
        suspend_ns: NandTiming::default().slc.erase_ns,
        ..NandTiming::default()
    };
    let e = timing.validate().unwrap_err().to_string();
    assert!(e.contains("timing.suspend_ns"), "{e}");
    assert!(e.contains("timing.slc.erase_ns"), "{e}");
}

#[test]
fn a_suspend_as_long_as_a_program_is_refused() {
    let timing = NandTiming {
        read_suspend: true,
        suspend_ns: NandTiming::default().slc.program_ns,
        ..NandTiming::default()
    };
    let e = timing.validate().unwrap_err().to_string();
    assert!(e.contains("timing.suspend_ns"), "{e}");
    assert!(e.contains("timing.slc.program_ns"), "{e}");
}

/// One operation of the medium property test.
#[derive(Debug, Clone)]
enum MediumOp {
    /// Program page `page` of block `block` (in order or not) with data ready `after_ns`
    /// past the previous operation's readiness.
    Program {
        block: u32,
        page: u32,
        after_ns: u64,
    },
    Erase {
        block: u32,
        after_ns: u64,
    },
    Read {
        block: u32,
        page: u32,
        after_ns: u64,
    },
}

fn medium_op(blocks: u32, pages: u32) -> impl proptest::strategy::Strategy<Value = MediumOp> {
    use proptest::prelude::*;
    prop_oneof![
        6 => (0..blocks, 0..pages, 0u64..3_000_000)
            .prop_map(|(block, page, after_ns)| MediumOp::Program { block, page, after_ns }),
        1 => (0..blocks, 0u64..3_000_000)
            .prop_map(|(block, after_ns)| MediumOp::Erase { block, after_ns }),
        3 => (0..blocks, 0..pages, 0u64..3_000_000)
            .prop_map(|(block, page, after_ns)| MediumOp::Read { block, page, after_ns }),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(afa_sim::proptest_cases(200)))]

    /// Random programs (in and out of order), erases and reads at random ready times, under
    /// either scheduling, against a model of each block: a program succeeds exactly when it
    /// is its block's next page; no operation ends before its input was ready plus its own
    /// latency; a block's pages finish programming in order and its erase after its last
    /// program; erase counts, write pointers and the counters follow the model.
    #[test]
    fn the_medium_follows_its_rules_for_any_sequence(
        first_come in proptest::prelude::any::<bool>(),
        ops in proptest::collection::vec(medium_op(small().blocks_total(), 8), 1..300),
    ) {
        let mut timing = NandTiming::default();
        if first_come {
            timing.scheduling = Scheduling::FirstCome;
        }
        let mut n = Nand::new(small(), timing.clone(), CellMode::Mlc, PayloadMode::None, FaultConfig::default(), 3)
            .unwrap();
        let t = timing.mlc;
        let xfer = transfer_ns(4096, timing.channel_mb_s);
        let blocks = small().blocks_total() as usize;
        let (mut next, mut erases) = (vec![0u32; blocks], vec![0u32; blocks]);
        let mut last_program_end = vec![0u64; blocks];
        let (mut programs, mut reads) = (0u64, 0u64);
        let mut ready = 0u64;
        for op in ops {
            match op {
                MediumOp::Program { block, page, after_ns } => {
                    ready += after_ns;
                    let b = block as usize;
                    let result = n.program(block * 8 + page, ready);
                    if page == next[b] {
                        let end = result.unwrap();
                        proptest::prop_assert!(end >= ready + xfer + t.program_ns);
                        proptest::prop_assert!(end >= last_program_end[b] + t.program_ns);
                        last_program_end[b] = end;
                        next[b] += 1;
                        programs += 1;
                    } else {
                        let refused = matches!(result, Err(NandError::OutOfOrder { .. }));
                        proptest::prop_assert!(refused, "{result:?}");
                    }
                }
                MediumOp::Erase { block, after_ns } => {
                    ready += after_ns;
                    let b = block as usize;
                    let end = n.erase(block, ready).unwrap();
                    proptest::prop_assert!(end >= ready.max(last_program_end[b]) + t.erase_ns);
                    last_program_end[b] = end;
                    next[b] = 0;
                    erases[b] += 1;
                }
                MediumOp::Read { block, page, after_ns } => {
                    ready += after_ns;
                    let end = n.read(block * 8 + page, ready, 4096);
                    proptest::prop_assert!(end >= ready + t.read_ns + xfer);
                    reads += 1;
                }
            }
        }
        for block in 0..blocks as u32 {
            proptest::prop_assert_eq!(n.next_page(block), next[block as usize]);
            proptest::prop_assert_eq!(n.erase_count(block), erases[block as usize]);
        }
        let c = n.counters();
        let mlc = CellMode::Mlc.index();
        proptest::prop_assert_eq!(c.programs[mlc], programs);
        proptest::prop_assert_eq!(c.reads[mlc], reads);
        proptest::prop_assert_eq!(c.erases[mlc], erases.iter().map(|&e| e as u64).sum::<u64>());
    }
}
