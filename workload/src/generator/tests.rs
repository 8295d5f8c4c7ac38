use super::*;
use crate::fio::{ZoneMode, ZoneSkip};
use proptest::prelude::*;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

fn job(rw: RwMode) -> JobSpec {
    let mut spec = JobSpec::default_named("test");
    spec.rw = rw;
    spec
}

fn collect(generator: &mut JobGenerator, limit: usize) -> Vec<IoRequest> {
    std::iter::from_fn(|| generator.next_io())
        .take(limit)
        .collect()
}

/// Draws `count` random reads of single 4 KiB blocks over `blocks` blocks and returns
/// how often each block was hit.
fn block_histogram(distribution: Distribution, blocks: u64, count: usize) -> Vec<u64> {
    let mut spec = job(RwMode::RandRead);
    spec.distribution = distribution;
    spec.time_based = true;
    let mut generator = JobGenerator::new(&spec, blocks * 4 * KIB, 512, 7, 0).unwrap();
    let mut hits = vec![0u64; blocks as usize];
    for request in collect(&mut generator, count) {
        hits[(request.offset_bytes / (4 * KIB)) as usize] += 1;
    }
    hits
}

/// Share of all hits that land on the hottest `fraction` of the blocks.
fn hottest_share(mut hits: Vec<u64>, fraction: f64) -> f64 {
    let total: u64 = hits.iter().sum();
    hits.sort_unstable_by(|a, b| b.cmp(a));
    let hot = ((hits.len() as f64) * fraction).ceil() as usize;
    hits[..hot].iter().sum::<u64>() as f64 / total as f64
}

#[test]
fn same_inputs_give_the_same_stream() {
    let mut spec = job(RwMode::RandRw);
    spec.block_sizes[0] = BlockSizeSpec::Split(vec![(4 * KIB, 50.0), (64 * KIB, 50.0)]);
    spec.block_sizes[1] = BlockSizeSpec::Range {
        min: 4 * KIB,
        max: 128 * KIB,
    };
    spec.distribution = Distribution::Zipf { theta: 0.9 };
    spec.percentage_random = 70;
    let make = |seed, clone| JobGenerator::new(&spec, 64 * MIB, 512, seed, clone).unwrap();
    let first = collect(&mut make(1, 0), 5000);
    assert_eq!(first, collect(&mut make(1, 0), 5000));
    assert_ne!(first, collect(&mut make(2, 0), 5000), "seed must matter");
    assert_ne!(first, collect(&mut make(1, 1), 5000), "clones must differ");
}

#[test]
fn randseed_overrides_the_run_seed_but_not_the_clone_index() {
    let mut spec = job(RwMode::RandWrite);
    spec.randseed = Some(99);
    let make = |seed, clone| JobGenerator::new(&spec, 64 * MIB, 512, seed, clone).unwrap();
    let first = collect(&mut make(1, 0), 1000);
    assert_eq!(first, collect(&mut make(2, 0), 1000));
    assert_ne!(first, collect(&mut make(1, 1), 1000));
}

#[test]
fn sequential_write_covers_the_region_once_then_ends() {
    let mut spec = job(RwMode::Write);
    spec.block_sizes[1] = BlockSizeSpec::Fixed(16 * KIB);
    spec.offset = SizeSpec::Bytes(MIB);
    spec.size = Some(SizeSpec::Bytes(2 * MIB));
    let mut generator = JobGenerator::new(&spec, 16 * MIB, 512, 0, 0).unwrap();
    assert_eq!(generator.region(), (MIB, 2 * MIB));
    let requests = collect(&mut generator, usize::MAX);
    assert_eq!(requests.len(), 128);
    for (index, request) in requests.iter().enumerate() {
        assert_eq!(request.op, IoOp::Write);
        assert_eq!(request.offset_bytes, MIB + index as u64 * 16 * KIB);
        assert_eq!(request.len_bytes, 16 * KIB);
    }
    assert_eq!(generator.next_io(), None);
    assert_eq!(generator.issued_bytes(), 2 * MIB);
    assert_eq!(generator.issued_ios(), 128);
}

#[test]
fn sequential_requests_are_shortened_at_the_region_end() {
    let mut spec = job(RwMode::Read);
    spec.block_sizes[0] = BlockSizeSpec::Fixed(12 * KIB);
    spec.size = Some(SizeSpec::Bytes(32 * KIB));
    let mut generator = JobGenerator::new(&spec, MIB, 4096, 0, 0).unwrap();
    let lengths: Vec<u64> = collect(&mut generator, 10)
        .iter()
        .map(|r| r.len_bytes)
        .collect();
    assert_eq!(lengths, vec![12 * KIB, 12 * KIB, 8 * KIB]);
}

#[test]
fn time_based_sequential_jobs_wrap_forever() {
    let mut spec = job(RwMode::Read);
    spec.time_based = true;
    spec.size = Some(SizeSpec::Bytes(64 * KIB));
    spec.number_ios = Some(3);
    let mut generator = JobGenerator::new(&spec, MIB, 512, 0, 0).unwrap();
    let offsets: Vec<u64> = collect(&mut generator, 40)
        .iter()
        .map(|r| r.offset_bytes)
        .collect();
    assert_eq!(
        offsets.len(),
        40,
        "time_based ignores the byte and I/O budgets"
    );
    assert_eq!(offsets[16], 0);
    assert_eq!(offsets[17], 4 * KIB);
}

#[test]
fn io_size_extends_a_sequential_job_past_one_pass() {
    let mut spec = job(RwMode::Write);
    spec.size = Some(SizeSpec::Bytes(64 * KIB));
    spec.io_size_bytes = Some(160 * KIB);
    let mut generator = JobGenerator::new(&spec, MIB, 512, 0, 0).unwrap();
    let requests = collect(&mut generator, usize::MAX);
    assert_eq!(requests.len(), 40);
    assert_eq!(requests[16].offset_bytes, 0);
}

#[test]
fn number_ios_caps_the_stream() {
    let mut spec = job(RwMode::RandRead);
    spec.number_ios = Some(10);
    let mut generator = JobGenerator::new(&spec, MIB, 512, 0, 0).unwrap();
    assert_eq!(collect(&mut generator, usize::MAX).len(), 10);
}

#[test]
fn trim_modes_issue_trims() {
    for rw in [RwMode::Trim, RwMode::RandTrim] {
        let mut generator = JobGenerator::new(&job(rw), MIB, 512, 0, 0).unwrap();
        assert!(collect(&mut generator, 100)
            .iter()
            .all(|r| r.op == IoOp::Trim));
    }
}

#[test]
fn percentage_regions_and_clipping() {
    let mut spec = job(RwMode::Read);
    spec.offset = SizeSpec::Percent(25.0);
    spec.size = Some(SizeSpec::Percent(50.0));
    let generator = JobGenerator::new(&spec, 100 * MIB, 512, 0, 0).unwrap();
    assert_eq!(generator.region(), (25 * MIB, 50 * MIB));
    assert_eq!(generator.size_cut(), None);

    // A percentage offset is rounded up to the smallest block size, as fio's
    // `get_start_offset` does: 10% of 10 MiB + 512 is 1,048,627.2 bytes, so 1 MiB + 4 KiB.
    spec.offset = SizeSpec::Percent(10.0);
    spec.size = None;
    let generator = JobGenerator::new(&spec, 10 * MIB + 512, 512, 0, 0).unwrap();
    let (start_bytes, len_bytes) = generator.region();
    assert_eq!(start_bytes, MIB + 4 * KIB);
    assert_eq!(start_bytes + len_bytes, 10 * MIB + 512);
    assert_eq!(generator.size_cut(), None, "no size, nothing cut");
    // `offset_align` replaces the block size there.
    spec.offset_align_bytes = Some(64 * KIB);
    let generator = JobGenerator::new(&spec, 10 * MIB + 512, 512, 0, 0).unwrap();
    assert_eq!(generator.region().0, MIB + 64 * KIB);
    spec.offset_align_bytes = None;

    // A size reaching past the device end is clipped to it, as fio does on a block device,
    // and the size asked for is kept so that the cut can be reported.
    spec.offset = SizeSpec::Bytes(MIB);
    spec.size = Some(SizeSpec::Bytes(100 * MIB));
    let generator = JobGenerator::new(&spec, 4 * MIB, 512, 0, 0).unwrap();
    assert_eq!(generator.region(), (MIB, 3 * MIB));
    assert_eq!(generator.size_cut(), Some(100 * MIB));
    // A size that ends exactly at the device end is not cut.
    spec.size = Some(SizeSpec::Bytes(3 * MIB));
    let generator = JobGenerator::new(&spec, 4 * MIB, 512, 0, 0).unwrap();
    assert_eq!(generator.region(), (MIB, 3 * MIB));
    assert_eq!(generator.size_cut(), None);
    // Percentages are of the whole device, so with an offset they can reach past it too.
    spec.offset = SizeSpec::Percent(50.0);
    spec.size = Some(SizeSpec::Percent(60.0));
    let generator = JobGenerator::new(&spec, 100 * MIB, 512, 0, 0).unwrap();
    assert_eq!(generator.region(), (50 * MIB, 50 * MIB));
    assert_eq!(generator.size_cut(), Some(60 * MIB));
}

#[test]
fn invalid_jobs_are_refused() {
    let refused = |spec: &JobSpec, device_bytes: u64, sector_bytes: u64| match JobGenerator::new(
        spec,
        device_bytes,
        sector_bytes,
        0,
        0,
    ) {
        Err(WorkloadError::InvalidJob { job, reason }) => {
            assert_eq!(job, "test");
            reason
        }
        other => panic!("expected InvalidJob, got {other:?}"),
    };
    let base = job(RwMode::RandRead);
    refused(&base, MIB, 0);
    refused(&base, 2 * KIB, 512); // region smaller than one block

    let mut spec = base.clone();
    spec.offset = SizeSpec::Bytes(MIB);
    assert!(refused(&spec, MIB, 512).contains("beyond"));
    spec.offset = SizeSpec::Bytes(100);
    assert!(refused(&spec, MIB, 512).contains("sector"));

    let mut spec = base.clone();
    spec.block_sizes[0] = BlockSizeSpec::Fixed(1000);
    assert!(refused(&spec, MIB, 512).contains("read block size"));
    spec.block_sizes[0] = BlockSizeSpec::Split(vec![(4096, 0.0)]);
    refused(&spec, MIB, 512);
    spec.block_sizes[0] = BlockSizeSpec::Range {
        min: 8192,
        max: 4096,
    };
    refused(&spec, MIB, 512);

    let mut spec = base.clone();
    spec.block_align_bytes = Some(1000);
    refused(&spec, MIB, 512);

    let mut spec = base.clone();
    spec.rwmixread_percent = 101;
    refused(&spec, MIB, 512);
    let mut spec = base.clone();
    spec.percentage_random = 101;
    refused(&spec, MIB, 512);
    let mut spec = base.clone();
    spec.io_size_bytes = Some(0);
    refused(&spec, MIB, 512);
    for distribution in [
        Distribution::Zipf { theta: 0.0 },
        Distribution::Zipf { theta: f64::NAN },
        Distribution::Pareto { h: 1.0 },
        Distribution::Normal {
            sigma_percent: -1.0,
        },
    ] {
        let mut spec = base.clone();
        spec.distribution = distribution;
        refused(&spec, MIB, 512);
    }
}

#[test]
fn unused_directions_are_not_validated() {
    let mut spec = job(RwMode::Read);
    spec.block_sizes[1] = BlockSizeSpec::Fixed(3);
    assert!(JobGenerator::new(&spec, MIB, 512, 0, 0).is_ok());
}

#[test]
fn random_offsets_respect_blockalign() {
    let mut spec = job(RwMode::RandWrite);
    spec.block_sizes[1] = BlockSizeSpec::Fixed(4 * KIB);
    spec.block_align_bytes = Some(64 * KIB);
    spec.offset = SizeSpec::Bytes(512);
    let mut generator = JobGenerator::new(&spec, 64 * MIB, 512, 3, 0).unwrap();
    for request in collect(&mut generator, 2000) {
        assert_eq!((request.offset_bytes - 512) % (64 * KIB), 0);
    }
}

#[test]
fn bsrange_draws_multiples_of_the_minimum() {
    let mut spec = job(RwMode::RandRead);
    spec.block_sizes[0] = BlockSizeSpec::Range {
        min: 4 * KIB,
        max: 18 * KIB,
    };
    let mut generator = JobGenerator::new(&spec, 64 * MIB, 512, 3, 0).unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for request in collect(&mut generator, 2000) {
        seen.insert(request.len_bytes);
    }
    assert_eq!(
        seen.into_iter().collect::<Vec<_>>(),
        vec![4 * KIB, 8 * KIB, 12 * KIB, 16 * KIB]
    );
}

#[test]
fn bssplit_follows_the_weights() {
    let mut spec = job(RwMode::RandRead);
    spec.block_sizes[0] = BlockSizeSpec::Split(vec![(4 * KIB, 70.0), (64 * KIB, 30.0)]);
    spec.time_based = true;
    let mut generator = JobGenerator::new(&spec, 64 * MIB, 512, 3, 0).unwrap();
    let requests = collect(&mut generator, 20_000);
    let small = requests.iter().filter(|r| r.len_bytes == 4 * KIB).count();
    let share = small as f64 / requests.len() as f64;
    assert!((share - 0.7).abs() < 0.02, "4k share {share}");
}

#[test]
fn percentage_random_mixes_in_sequential_io() {
    let mut spec = job(RwMode::RandRead);
    spec.percentage_random = 25;
    spec.time_based = true;
    let mut generator = JobGenerator::new(&spec, 256 * MIB, 512, 5, 0).unwrap();
    let requests = collect(&mut generator, 20_000);
    let continuing = requests
        .windows(2)
        .filter(|pair| pair[1].offset_bytes == pair[0].offset_bytes + pair[0].len_bytes)
        .count();
    let share = continuing as f64 / (requests.len() - 1) as f64;
    assert!((share - 0.75).abs() < 0.02, "sequential share {share}");
}

#[test]
fn sequential_modes_ignore_percentage_random() {
    let mut spec = job(RwMode::Write);
    spec.percentage_random = 0;
    let mut generator = JobGenerator::new(&spec, MIB, 512, 5, 0).unwrap();
    let requests = collect(&mut generator, usize::MAX);
    assert_eq!(requests.len(), 256);
    assert!(requests
        .windows(2)
        .all(|p| p[1].offset_bytes == p[0].offset_bytes + 4 * KIB));
}

#[test]
fn mixed_sequential_jobs_keep_a_cursor_per_direction() {
    let mut spec = job(RwMode::ReadWrite);
    spec.time_based = true;
    let mut generator = JobGenerator::new(&spec, MIB, 512, 5, 0).unwrap();
    let requests = collect(&mut generator, 1000);
    for op in [IoOp::Read, IoOp::Write] {
        let offsets: Vec<u64> = requests
            .iter()
            .filter(|r| r.op == op)
            .map(|r| r.offset_bytes)
            .collect();
        for (index, offset) in offsets.iter().enumerate() {
            assert_eq!(*offset, (index as u64 * 4 * KIB) % MIB, "{op:?}");
        }
    }
}

#[test]
fn zipf_is_skewed_and_scattered() {
    let blocks = 1000;
    let hits = block_histogram(Distribution::Zipf { theta: 1.2 }, blocks, 100_000);
    // The hot blocks must not all sit at the start of the region.
    let mut order: Vec<usize> = (0..blocks as usize).collect();
    order.sort_unstable_by(|&a, &b| hits[b].cmp(&hits[a]));
    let hot_in_first_tenth = order[..100].iter().filter(|&&block| block < 100).count();
    assert!(
        hot_in_first_tenth < 50,
        "hot blocks cluster at the start: {hot_in_first_tenth}"
    );
    let share = hottest_share(hits, 0.1);
    assert!(share > 0.6, "hottest 10% take only {share}");
}

#[test]
fn zipf_works_for_theta_one_and_below() {
    for theta in [0.5, 1.0] {
        let hits = block_histogram(Distribution::Zipf { theta }, 500, 20_000);
        let share = hottest_share(hits, 0.1);
        assert!(share > 0.15, "theta {theta}: hottest 10% take only {share}");
    }
}

#[test]
fn zipf_sampler_matches_the_exact_distribution_for_small_n() {
    let n = 5;
    let theta = 1.2;
    let sampler = ZipfSampler::new(n, theta);
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut counts = [0u64; 5];
    let draws = 200_000;
    for _ in 0..draws {
        let k = sampler.sample(&mut rng);
        assert!((1..=n).contains(&k));
        counts[(k - 1) as usize] += 1;
    }
    let norm: f64 = (1..=n).map(|k| (k as f64).powf(-theta)).sum();
    for (index, count) in counts.iter().enumerate() {
        let expected = ((index + 1) as f64).powf(-theta) / norm;
        let observed = *count as f64 / draws as f64;
        assert!(
            (observed - expected).abs() < 0.01,
            "k={} {observed} vs {expected}",
            index + 1
        );
    }
}

#[test]
fn pareto_follows_the_80_20_rule() {
    let hits = block_histogram(Distribution::Pareto { h: 0.2 }, 1000, 100_000);
    let share = hottest_share(hits, 0.2);
    assert!((0.75..0.9).contains(&share), "hottest 20% take {share}");
}

#[test]
fn normal_is_centred() {
    let blocks = 1000;
    let hits = block_histogram(
        Distribution::Normal {
            sigma_percent: 10.0,
        },
        blocks,
        50_000,
    );
    let total: u64 = hits.iter().sum();
    let mean = hits
        .iter()
        .enumerate()
        .map(|(b, h)| b as f64 * *h as f64)
        .sum::<f64>()
        / total as f64;
    assert!((mean - 499.5).abs() < 5.0, "mean block {mean}");
    let within_one_sigma: u64 = hits[400..600].iter().sum();
    let share = within_one_sigma as f64 / total as f64;
    assert!((share - 0.683).abs() < 0.02, "within one sigma {share}");
}

#[test]
fn scatter_is_a_bijection() {
    for slot_count in 1..300u64 {
        let mut seen = vec![false; slot_count as usize];
        for rank in 0..slot_count {
            let slot = scatter(rank, slot_count);
            assert!(slot < slot_count);
            assert!(
                !seen[slot as usize],
                "n={slot_count}: slot {slot} hit twice"
            );
            seen[slot as usize] = true;
        }
    }
    // Large domains must not hang or overflow.
    assert!(scatter(12345, u64::MAX) < u64::MAX);
    assert!(scatter(7, (1 << 40) + 3) < (1 << 40) + 3);
}

#[test]
fn skewed_distributions_fit_large_requests() {
    // With 64 KiB requests on 4 KiB alignment, the last 15 slots cannot start a request.
    let mut spec = job(RwMode::RandRead);
    spec.block_sizes[0] = BlockSizeSpec::Split(vec![(4 * KIB, 50.0), (64 * KIB, 50.0)]);
    spec.block_align_bytes = Some(4 * KIB);
    spec.time_based = true;
    for distribution in [
        Distribution::Zipf { theta: 1.5 },
        Distribution::Pareto { h: 0.1 },
        Distribution::Normal {
            sigma_percent: 60.0,
        },
    ] {
        spec.distribution = distribution;
        let mut generator = JobGenerator::new(&spec, 128 * KIB, 512, 1, 0).unwrap();
        for request in collect(&mut generator, 5000) {
            assert!(request.offset_bytes + request.len_bytes <= 128 * KIB);
        }
    }
}

fn block_size_strategy() -> impl Strategy<Value = BlockSizeSpec> {
    let sectors = 1u64..=64;
    prop_oneof![
        sectors.clone().prop_map(|n| BlockSizeSpec::Fixed(n * 512)),
        (sectors.clone(), 0u64..=64).prop_map(|(min, extra)| BlockSizeSpec::Range {
            min: min * 512,
            max: (min + extra) * 512,
        }),
        proptest::collection::vec((sectors, 1.0f64..100.0), 1..5).prop_map(|entries| {
            BlockSizeSpec::Split(
                entries
                    .into_iter()
                    .map(|(n, percent)| (n * 512, percent))
                    .collect(),
            )
        }),
    ]
}

fn distribution_strategy() -> impl Strategy<Value = Distribution> {
    prop_oneof![
        Just(Distribution::Uniform),
        (0.1f64..3.0).prop_map(|theta| Distribution::Zipf { theta }),
        (0.01f64..0.99).prop_map(|h| Distribution::Pareto { h }),
        (0.0f64..99.0).prop_map(|sigma_percent| Distribution::Normal { sigma_percent }),
        proptest::collection::vec((0u32..=100, 1u32..=20), 1..5).prop_map(|entries| {
            let mut left = 100;
            let last = entries.len() - 1;
            let zones = entries
                .iter()
                .enumerate()
                .map(|(i, &(access, size))| {
                    let access_percent = if i == last { left } else { access.min(left) };
                    left -= access_percent;
                    Zone {
                        access_percent,
                        span: ZoneSpan::Percent(size),
                    }
                })
                .collect();
            Distribution::Zoned { zones }
        }),
    ]
}

fn rw_strategy() -> impl Strategy<Value = RwMode> {
    proptest::sample::select(vec![
        RwMode::Read,
        RwMode::Write,
        RwMode::RandRead,
        RwMode::RandWrite,
        RwMode::ReadWrite,
        RwMode::RandRw,
        RwMode::Trim,
        RwMode::RandTrim,
        RwMode::TrimWrite,
        RwMode::RandTrimWrite,
    ])
}

/// Whether `len_bytes` is a length `spec` can produce (before clipping at the region end).
fn length_allowed(spec: &BlockSizeSpec, len_bytes: u64) -> bool {
    match spec {
        BlockSizeSpec::Fixed(bytes) => len_bytes == *bytes,
        BlockSizeSpec::Range { min, max } => (*min..=*max).contains(&len_bytes),
        BlockSizeSpec::Split(entries) => entries.iter().any(|(bytes, _)| *bytes == len_bytes),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn requests_stay_inside_the_region(
        rw in rw_strategy(),
        block_sizes in block_size_strategy(),
        distribution in distribution_strategy(),
        align_sectors in proptest::option::of(1u64..=16),
        offset_sectors in 0u64..2048,
        size_sectors in 64u64..4096,
        device_extra_sectors in 0u64..2048,
        percentage_random in 0u32..=100,
        modifier in proptest::option::of(1u64..=8),
        identical in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let sector_bytes = 512;
        let mut spec = job(rw);
        // A count of random requests per offset, or a hole of that many sectors.
        spec.offset_modifier = modifier.map(|n| if rw.is_random() { n } else { n * sector_bytes });
        spec.rw_sequencer_identical = identical;
        spec.block_sizes = [block_sizes.clone(), block_sizes.clone(), block_sizes.clone()];
        spec.distribution = distribution;
        spec.block_align_bytes = align_sectors.map(|n| n * sector_bytes);
        spec.offset = SizeSpec::Bytes(offset_sectors * sector_bytes);
        spec.size = Some(SizeSpec::Bytes(size_sectors * sector_bytes));
        spec.percentage_random = percentage_random;
        spec.time_based = true;
        let device_bytes = (offset_sectors + size_sectors + device_extra_sectors) * sector_bytes;
        let mut generator = JobGenerator::new(&spec, device_bytes, sector_bytes, seed, 0).unwrap();
        let (start_bytes, len_bytes) = generator.region();
        prop_assert_eq!(start_bytes, offset_sectors * sector_bytes);
        prop_assert_eq!(len_bytes, size_sectors * sector_bytes);
        let end_bytes = start_bytes + len_bytes;
        for _ in 0..300 {
            let request = generator.next_io().unwrap();
            prop_assert!(request.offset_bytes >= start_bytes);
            prop_assert!(request.offset_bytes + request.len_bytes <= end_bytes);
            prop_assert_eq!(request.offset_bytes % sector_bytes, 0);
            prop_assert_eq!(request.len_bytes % sector_bytes, 0);
            prop_assert!(request.len_bytes > 0);
            let clipped_at_end = request.offset_bytes + request.len_bytes == end_bytes;
            prop_assert!(
                length_allowed(&block_sizes, request.len_bytes) || clipped_at_end,
                "length {} not allowed by {:?}", request.len_bytes, block_sizes
            );
            let expected_op = match rw {
                RwMode::Read | RwMode::RandRead => Some(IoOp::Read),
                RwMode::Write | RwMode::RandWrite => Some(IoOp::Write),
                RwMode::Trim | RwMode::RandTrim => Some(IoOp::Trim),
                RwMode::ReadWrite | RwMode::RandRw => None,
                RwMode::TrimWrite | RwMode::RandTrimWrite => None,
            };
            if let Some(op) = expected_op {
                prop_assert_eq!(request.op, op);
            } else if rw.is_trim_write() {
                prop_assert!(matches!(request.op, IoOp::Trim | IoOp::Write));
            } else {
                prop_assert!(matches!(request.op, IoOp::Read | IoOp::Write));
            }
        }
    }

    #[test]
    fn size_limited_sequential_jobs_cover_the_region_exactly_once(
        rw in proptest::sample::select(vec![RwMode::Read, RwMode::Write, RwMode::Trim]),
        block_sizes in block_size_strategy(),
        offset_sectors in 0u64..512,
        size_sectors in 1u64..2048,
        seed in any::<u64>(),
    ) {
        let sector_bytes = 512;
        let mut spec = job(rw);
        spec.block_sizes = [block_sizes.clone(), block_sizes.clone(), block_sizes];
        spec.offset = SizeSpec::Bytes(offset_sectors * sector_bytes);
        spec.size = Some(SizeSpec::Bytes(size_sectors * sector_bytes));
        let device_bytes = (offset_sectors + size_sectors) * sector_bytes;
        let Ok(mut generator) = JobGenerator::new(&spec, device_bytes, sector_bytes, seed, 0) else {
            // Regions smaller than the minimum block size are refused; nothing to cover.
            prop_assert!(spec.block_sizes[0].min_bytes() > size_sectors * sector_bytes);
            return Ok(());
        };
        let mut next_offset_bytes = offset_sectors * sector_bytes;
        while let Some(request) = generator.next_io() {
            prop_assert_eq!(request.offset_bytes, next_offset_bytes);
            next_offset_bytes += request.len_bytes;
        }
        prop_assert_eq!(next_offset_bytes, device_bytes);
    }

    #[test]
    fn rwmixread_sets_the_read_share(rwmixread in 0u32..=100, seed in any::<u64>()) {
        let mut spec = job(RwMode::RandRw);
        spec.rwmixread_percent = rwmixread;
        spec.time_based = true;
        let mut generator = JobGenerator::new(&spec, 64 * MIB, 512, seed, 0).unwrap();
        let count = 4000;
        let reads = collect(&mut generator, count).iter().filter(|r| r.op == IoOp::Read).count();
        let share = reads as f64 / count as f64;
        // Five standard deviations of a binomial share at worst p = 0.5 is about 0.04.
        prop_assert!((share - f64::from(rwmixread) / 100.0).abs() < 0.04, "share {}", share);
    }
}

/// `fsync=N` puts a FLUSH after every Nth write (reads do not count), `end_fsync` one after
/// the last write unless a FLUSH just came, and neither counts against the I/O budget.
/// `offset_increment` moves each clone's region by that much: clone `i` addresses
/// `[offset + i × increment, … + size)`; one that would start past the device is an error.
#[test]
fn offset_increment_moves_each_clones_region() {
    let mut spec = job(RwMode::RandWrite);
    spec.offset = SizeSpec::Bytes(4096);
    spec.size = Some(SizeSpec::Bytes(64 << 10));
    spec.offset_increment = SizeSpec::Bytes(128 << 10);
    for clone in 0..4u32 {
        let mut g = JobGenerator::new(&spec, MIB, 512, 3, clone).unwrap();
        let start = 4096 + clone as u64 * (128 << 10);
        assert_eq!(g.region(), (start, 64 << 10));
        assert!(
            collect(&mut g, 200)
                .iter()
                .all(|r| r.offset_bytes >= start
                    && r.offset_bytes + r.len_bytes <= start + (64 << 10))
        );
    }
    assert!(JobGenerator::new(&spec, MIB, 512, 3, 8).is_err());
    spec.offset_increment = SizeSpec::Bytes(1000);
    assert!(
        JobGenerator::new(&spec, MIB, 512, 3, 1).is_err(),
        "not a whole sector"
    );
    spec.offset_increment = SizeSpec::Bytes(u64::MAX / 2);
    assert!(
        JobGenerator::new(&spec, MIB, 512, 3, 3).is_err(),
        "overflow"
    );
    // A percentage increment is of the device, and the start it gives is rounded up to the
    // block size: 3% of 1 MiB is 31,457.28 bytes, so clone 1 starts at 4096 + 32 KiB.
    spec.offset_increment = SizeSpec::Percent(3.0);
    spec.size = Some(SizeSpec::Bytes(16 << 10));
    let g = JobGenerator::new(&spec, MIB, 512, 3, 1).unwrap();
    assert_eq!(g.region().0, 4096 + (32 << 10));
}

/// `fill_device` writes from the job's offset to the device's end, whatever `size` and
/// `io_size` say, as fio writes until the device has no space left.
#[test]
fn fill_device_writes_to_the_end_of_the_device() {
    let mut spec = job(RwMode::Write);
    spec.offset = SizeSpec::Bytes(256 << 10);
    spec.size = Some(SizeSpec::Bytes(64 << 10));
    spec.io_size_bytes = Some(16 << 10);
    spec.fill_device = true;
    let mut g = JobGenerator::new(&spec, MIB, 512, 1, 0).unwrap();
    assert_eq!(g.region(), (256 << 10, MIB - (256 << 10)));
    let written: u64 = collect(&mut g, 10_000).iter().map(|r| r.len_bytes).sum();
    assert_eq!(written, MIB - (256 << 10));
}

/// `bs_is_seq_rand`: sequential requests take the read block size and random ones the
/// write block size, whatever their direction.
#[test]
fn bs_is_seq_rand_sizes_by_randomness_not_direction() {
    let mut spec = job(RwMode::RandRw);
    spec.block_sizes = [
        BlockSizeSpec::Fixed(8 << 10),
        BlockSizeSpec::Fixed(16 << 10),
        BlockSizeSpec::Fixed(4 << 10),
    ];
    spec.percentage_random = 50;
    spec.bs_is_seq_rand = true;
    spec.number_ios = Some(400);
    spec.io_size_bytes = Some(64 * MIB);
    let requests = collect(
        &mut JobGenerator::new(&spec, 4 * MIB, 512, 9, 0).unwrap(),
        400,
    );
    let sized = |len: u64, op: IoOp| {
        requests
            .iter()
            .filter(|r| r.len_bytes == len && r.op == op)
            .count()
    };
    // Both sizes in both directions, and nothing else.
    for op in [IoOp::Read, IoOp::Write] {
        assert!(sized(8 << 10, op) > 20, "{op:?}");
        assert!(sized(16 << 10, op) > 20, "{op:?}");
    }
    assert_eq!(
        sized(8 << 10, IoOp::Read)
            + sized(8 << 10, IoOp::Write)
            + sized(16 << 10, IoOp::Read)
            + sized(16 << 10, IoOp::Write),
        400
    );
    // A sequential job takes the read size for its writes.
    let mut seq = job(RwMode::Write);
    seq.block_sizes = spec.block_sizes.clone();
    seq.bs_is_seq_rand = true;
    seq.number_ios = Some(10);
    let writes = collect(
        &mut JobGenerator::new(&seq, 4 * MIB, 512, 9, 0).unwrap(),
        10,
    );
    assert!(writes.iter().all(|r| r.len_bytes == 8 << 10), "{writes:?}");
}

/// `sync=1` marks every write FUA and nothing else, and draws the same requests as without.
#[test]
fn sync_jobs_mark_every_write_fua() {
    let mut spec = job(RwMode::RandRw);
    spec.number_ios = Some(200);
    spec.flush_every_writes = Some(5);
    let plain = collect(&mut JobGenerator::new(&spec, MIB, 512, 3, 0).unwrap(), 400);
    spec.fua_writes = true;
    let synced = collect(&mut JobGenerator::new(&spec, MIB, 512, 3, 0).unwrap(), 400);
    assert_eq!(plain.len(), synced.len());
    assert!(plain.iter().all(|r| !r.fua));
    for (p, s) in plain.iter().zip(&synced) {
        assert_eq!(s.fua, s.op == IoOp::Write, "{s:?}");
        assert_eq!(IoRequest { fua: false, ..*s }, *p);
    }
    assert!(synced.iter().any(|r| r.op == IoOp::Read));
    assert!(synced.iter().any(|r| r.op == IoOp::Flush));
}

#[test]
fn flushes_follow_every_nth_write_and_the_last_one() {
    let ops = |spec: &JobSpec| -> String {
        let mut generator = JobGenerator::new(spec, MIB, 512, 3, 0).unwrap();
        collect(&mut generator, 100)
            .iter()
            .map(|r| match r.op {
                IoOp::Read => 'R',
                IoOp::Write => 'W',
                IoOp::Trim => 'T',
                IoOp::Flush => {
                    assert_eq!((r.offset_bytes, r.len_bytes), (0, 0));
                    'F'
                }
            })
            .collect()
    };
    let mut spec = job(RwMode::RandWrite);
    spec.number_ios = Some(10);
    spec.flush_every_writes = Some(4);
    assert_eq!(ops(&spec), "WWWWFWWWWFWW");
    spec.end_flush = true;
    assert_eq!(ops(&spec), "WWWWFWWWWFWWF");
    spec.number_ios = Some(8);
    assert_eq!(
        ops(&spec),
        "WWWWFWWWWF",
        "no second flush after the last write's"
    );
    spec.flush_every_writes = None;
    assert_eq!(ops(&spec), "WWWWWWWWF");
    // Mixed: only writes count towards the period, and the requests drawn are the same as
    // without flushes.
    let mut mixed = job(RwMode::RandRw);
    mixed.number_ios = Some(40);
    let plain = ops(&mixed);
    mixed.flush_every_writes = Some(3);
    let flushed = ops(&mixed);
    assert_eq!(flushed.replace('F', ""), plain);
    for (i, _) in flushed.match_indices('F') {
        let writes = flushed[..i].replace('F', "").matches('W').count();
        assert_eq!(writes % 3, 0, "{flushed}");
    }
    assert_eq!(flushed.matches('F').count(), plain.matches('W').count() / 3);
    // A read-only job with end_fsync issues no flush: nothing was written.
    let mut reads = job(RwMode::RandRead);
    reads.number_ios = Some(5);
    reads.end_flush = true;
    assert_eq!(ops(&reads), "RRRRR");
}

/// `loops=N` runs the job N times as fio 3.33 does on a device: each iteration spends its
/// whole budget again but goes on from where the last one left off, its sequential
/// positions and its random stream included; `end_fsync` closes every iteration. The
/// offsets are those fio wrote to its iolog for the same jobs on a file.
#[test]
fn loops_go_on_where_the_last_iteration_left_off() {
    let all = |spec: &JobSpec| {
        let mut generator = JobGenerator::new(spec, MIB, 512, 5, 0).unwrap();
        collect(&mut generator, 10_000)
    };
    let mut random = job(RwMode::RandRw);
    random.number_ios = Some(40);
    let once = all(&random);
    assert_eq!(once.len(), 40);
    random.number_ios = Some(120);
    let long = all(&random);
    random.number_ios = Some(40);
    random.loops = 3;
    // Three iterations of 40 are one stream of 120: no iteration repeats the first.
    assert_eq!(all(&random), long);
    assert_ne!(long[40..80], once[..]);

    let offsets = |spec: &JobSpec| -> Vec<u64> {
        all(spec)
            .iter()
            .filter(|r| r.op != IoOp::Flush)
            .map(|r| r.offset_bytes / KIB)
            .collect()
    };
    // 32 KiB of a 64 KiB region per iteration: the second iteration takes the second half
    // (fio: 0 1 2 ... 15 in 4 KiB blocks).
    let mut sequential = job(RwMode::Write);
    sequential.size = Some(SizeSpec::Bytes(64 * KIB));
    sequential.io_size_bytes = Some(32 * KIB);
    sequential.loops = 2;
    assert_eq!(
        offsets(&sequential),
        (0..16).map(|b| b * 4).collect::<Vec<_>>()
    );
    // 48 KiB per iteration: the second wraps at the region's end (fio: 0 ... 15, 0 ... 7).
    let mut wrapping = sequential.clone();
    wrapping.io_size_bytes = Some(48 * KIB);
    let expected: Vec<u64> = (0..16).chain(0..8).map(|b| b * 4).collect();
    assert_eq!(offsets(&wrapping), expected);
    // An iteration over the whole region starts the next at its start.
    let mut whole = sequential.clone();
    whole.io_size_bytes = None;
    let expected: Vec<u64> = (0..16).chain(0..16).map(|b| b * 4).collect();
    assert_eq!(offsets(&whole), expected);

    sequential.end_flush = true;
    let ops: String = all(&sequential)
        .iter()
        .map(|r| if r.op == IoOp::Flush { 'F' } else { 'W' })
        .collect();
    // One pass over the region, then fio's empty iteration's FLUSH.
    assert_eq!(ops, "WWWWWWWWWWWWWWWWFF");
}

/// `zoned:60/10:30/20:8/30:2/40`: each zone of the region takes its share of the random
/// requests, uniformly within it; with zones covering only part of the region, nothing
/// past the last zone is addressed; `zoned_abs` zones are sizes, and zones reaching past the
/// region are refused by name.
#[test]
fn zoned_distributions_give_each_zone_its_share() {
    let zone = |access_percent, span| Zone {
        access_percent,
        span,
    };
    let zoned = Distribution::Zoned {
        zones: vec![
            zone(60, ZoneSpan::Percent(10)),
            zone(30, ZoneSpan::Percent(20)),
            zone(8, ZoneSpan::Percent(30)),
            zone(2, ZoneSpan::Percent(40)),
        ],
    };
    let hits = block_histogram(zoned, 1000, 100_000);
    let share = |from: usize, to: usize| hits[from..to].iter().sum::<u64>() as f64 / 1e5;
    for (from, to, expected) in [
        (0, 100, 0.6),
        (100, 300, 0.3),
        (300, 600, 0.08),
        (600, 1000, 0.02),
    ] {
        let got = share(from, to);
        assert!((got - expected).abs() < 0.01, "blocks {from}..{to}: {got}");
    }
    // Uniform within a zone: the first zone's blocks are hit alike.
    let (low, high) = (
        hits[..100].iter().min().unwrap(),
        hits[..100].iter().max().unwrap(),
    );
    assert!(*low > 450 && *high < 750, "{low}..{high}");

    let partial = Distribution::Zoned {
        zones: vec![
            zone(50, ZoneSpan::Percent(10)),
            zone(50, ZoneSpan::Percent(10)),
        ],
    };
    let hits = block_histogram(partial, 1000, 20_000);
    assert_eq!(hits[200..].iter().sum::<u64>(), 0);
    assert!(hits[..100].iter().sum::<u64>() > 9_000);

    let absolute = Distribution::Zoned {
        zones: vec![
            zone(90, ZoneSpan::Bytes(64 * KIB)),
            zone(10, ZoneSpan::Bytes(64 * KIB)),
        ],
    };
    let hits = block_histogram(absolute.clone(), 1000, 20_000);
    assert!(hits[..16].iter().sum::<u64>() > 17_500);
    assert_eq!(hits[32..].iter().sum::<u64>(), 0);

    let mut spec = job(RwMode::RandRead);
    spec.distribution = absolute;
    let error = JobGenerator::new(&spec, 100 * KIB, 512, 1, 0).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("131072 bytes into the 102400-byte region"),
        "{error}"
    );
}

/// fio's verify pass: each iteration ends (after its end FLUSH) with one read of every
/// write it issued that no later write overlaps, by offset, the first of which waits for
/// the writes to complete;
/// read-only jobs have nothing to verify, and a time-based job with verify is refused.
#[test]
fn verify_reads_back_every_write_of_each_iteration() {
    let all = |spec: &JobSpec| {
        let mut generator = JobGenerator::new(spec, MIB, 512, 5, 0).unwrap();
        collect(&mut generator, 10_000)
    };
    let mut spec = job(RwMode::RandRw);
    spec.number_ios = Some(20);
    spec.verify = true;
    let requests = all(&spec);
    let (run, pass) = requests.split_at(20);
    let writes: Vec<(u64, u64)> = run
        .iter()
        .filter(|r| r.op == IoOp::Write)
        .map(|r| (r.offset_bytes, r.len_bytes))
        .collect();
    assert!(!writes.is_empty());
    let reads: Vec<(u64, u64)> = pass.iter().map(|r| (r.offset_bytes, r.len_bytes)).collect();
    // Sorted by offset, each write dropping the earlier ones it overlaps.
    let mut kept: Vec<(u64, u64)> = Vec::new();
    for &(o, l) in &writes {
        kept.retain(|&(ko, kl)| ko + kl <= o || ko >= o + l);
        kept.push((o, l));
    }
    kept.sort_unstable();
    assert_eq!(reads, kept);
    assert!(pass.iter().all(|r| r.op == IoOp::Read));
    assert!(pass[0].drain_first && pass[1..].iter().all(|r| !r.drain_first));
    assert!(run.iter().all(|r| !r.drain_first));

    spec.rw = RwMode::Write;
    spec.number_ios = Some(4);
    spec.end_flush = true;
    spec.loops = 2;
    let ops: String = all(&spec)
        .iter()
        .map(|r| match r.op {
            IoOp::Write => 'W',
            IoOp::Read => 'R',
            IoOp::Flush => 'F',
            IoOp::Trim => 'T',
        })
        .collect();
    // fio runs the two iterations of 4 writes as one pass, verifies it, and closes the
    // empty iteration after it with one more FLUSH (its iolog for `number_ios=3`, `loops=2`:
    // 6 writes, a sync, 6 reads, a sync).
    assert_eq!(ops, "WWWWWWWWFRRRRRRRRF");

    let mut reads_only = job(RwMode::RandRead);
    reads_only.number_ios = Some(5);
    reads_only.verify = true;
    assert_eq!(all(&reads_only).len(), 5);

    spec.time_based = true;
    spec.runtime_ns = Some(1_000_000);
    let error = JobGenerator::new(&spec, MIB, 512, 5, 0).unwrap_err();
    assert!(
        error.to_string().contains("verify with time_based"),
        "{error}"
    );
}

/// `verify_backlog=4`: after every fourth write the four writes not yet read back are, in
/// the order they were written, each once no request in flight overlaps it; with a batch of
/// two only half are, and the verify pass at the end reads back the rest. With
/// `time_based`, which has no pass at the end, the backlog is the verification.
#[test]
fn verify_backlog_reads_back_the_writes_as_the_job_goes() {
    let all = |spec: &JobSpec| {
        let mut generator = JobGenerator::new(spec, MIB, 512, 5, 0).unwrap();
        collect(&mut generator, 10_000)
    };
    let mut spec = job(RwMode::Write);
    spec.verify = true;
    spec.number_ios = Some(12);
    spec.verify_backlog = Some(4);
    let requests = all(&spec);
    let ops: String = requests
        .iter()
        .map(|r| if r.op == IoOp::Write { 'W' } else { 'R' })
        .collect();
    assert_eq!(ops, "WWWWRRRRWWWWRRRRWWWWRRRR");
    for (w, r) in requests[..4].iter().zip(&requests[4..8]) {
        assert_eq!((w.offset_bytes, w.len_bytes), (r.offset_bytes, r.len_bytes));
        assert!(r.after_overlapping && !r.drain_first);
    }
    spec.verify_backlog_batch = Some(2);
    let ops: String = all(&spec)
        .iter()
        .map(|r| if r.op == IoOp::Write { 'W' } else { 'R' })
        .collect();
    assert_eq!(ops, "WWWWRRWWWWRRWWWWRRRRRRRR");
    spec.verify_backlog_batch = None;
    spec.time_based = true;
    spec.runtime_ns = Some(1_000_000);
    let mut g = JobGenerator::new(&spec, MIB, 512, 5, 0).unwrap();
    let ops: String = (0..12)
        .map(|_| match g.next_io().unwrap().op {
            IoOp::Write => 'W',
            _ => 'R',
        })
        .collect();
    assert_eq!(ops, "WWWWRRRRWWWW");
}

/// The verify pass reads each byte back from its last write: a write replaces the earlier
/// ones it overlaps, whole, and the reads go by offset.
#[test]
fn the_verify_order_keeps_the_last_write_of_every_byte() {
    assert_eq!(verify_order(&[(8, 4), (0, 4), (2, 4)]), [(2, 4), (8, 4)]);
    assert_eq!(verify_order(&[(0, 4), (4, 4), (2, 4)]), [(2, 4)]);
    assert_eq!(verify_order(&[(0, 16), (4, 4), (12, 8)]), [(4, 4), (12, 8)]);
    assert_eq!(
        verify_order(&[(4, 4), (0, 4), (8, 4)]),
        [(0, 4), (4, 4), (8, 4)]
    );
    assert_eq!(verify_order(&[(0, 4), (0, 4)]), [(0, 4)]);
    assert!(verify_order(&[]).is_empty());
}

/// `rw=write:4k` leaves a 4 KiB hole after every request; `rw=randread:4` draws a new
/// random offset every fourth request and follows on from it in between, or repeats it
/// with `rw_sequencer=identical`.
#[test]
fn the_offset_modifier_makes_holes_or_runs() {
    let offsets = |spec: &JobSpec, count: usize| -> Vec<u64> {
        let mut generator = JobGenerator::new(spec, MIB, 512, 9, 0).unwrap();
        collect(&mut generator, count)
            .iter()
            .map(|r| r.offset_bytes / KIB)
            .collect()
    };
    let mut holes = job(RwMode::Write);
    holes.offset_modifier = Some(4 * KIB);
    assert_eq!(offsets(&holes, 5), [0, 8, 16, 24, 32]);
    // As fio on a device, the pass ends where the next request would start past the
    // region's end (fio: 3 writes for size=24k)...
    holes.size = Some(SizeSpec::Bytes(24 * KIB));
    assert_eq!(offsets(&holes, 6), [0, 8, 16]);
    // ...but with an io_size the holes count against nothing: the job writes its io_size,
    // wrapping to the start when a hole reaches past the end.
    holes.io_size_bytes = Some(24 * KIB);
    assert_eq!(offsets(&holes, 7), [0, 8, 16, 0, 8, 16]);
    // A next iteration starts the pass at the region's start.
    holes.io_size_bytes = None;
    holes.loops = 2;
    assert_eq!(offsets(&holes, 7), [0, 8, 16, 0, 8, 16]);

    let mut runs = job(RwMode::RandRead);
    runs.offset_modifier = Some(4);
    let got = offsets(&runs, 12);
    for run in got.chunks(4) {
        assert_eq!(
            run,
            [run[0], run[0] + 4, run[0] + 8, run[0] + 12],
            "{got:?}"
        );
    }
    assert!(
        got.chunks(4)
            .map(|r| r[0])
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            > 1
    );
    runs.rw_sequencer_identical = true;
    let got = offsets(&runs, 12);
    for run in got.chunks(4) {
        assert!(run.iter().all(|&o| o == run[0]), "{got:?}");
    }
    // A hole must be whole sectors.
    let mut odd = job(RwMode::Write);
    odd.offset_modifier = Some(1000);
    let error = JobGenerator::new(&odd, MIB, 512, 9, 0).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("1000-byte hole of rw=write:1000"),
        "{error}"
    );
    // 1 is every request, as without the modifier.
    runs.offset_modifier = Some(1);
    runs.rw_sequencer_identical = false;
    let mut plain = job(RwMode::RandRead);
    plain.offset_modifier = None;
    assert_eq!(offsets(&runs, 50), offsets(&plain, 50));
}

/// The first job of a fio job file, which must parse. A file of one `[z]` job that gives
/// a `zonesize` but no `zonemode` is given `zonemode=strided`, which fio requires.
fn parsed_job(text: &str) -> JobSpec {
    let text =
        if text.starts_with("[z]\n") && text.contains("zonesize=") && !text.contains("zonemode=") {
            text.replacen("[z]\n", "[z]\nzonemode=strided\n", 1)
        } else {
            text.to_string()
        };
    crate::fio::parse_job_file(&text)
        .unwrap_or_else(|error| panic!("{text:?}: {error}"))
        .remove(0)
}

/// The first `count` requests of `spec`'s clone `clone` on a `device_bytes` volume of
/// 512-byte sectors, as (offset, length) in KiB.
fn requests_kib(spec: &JobSpec, device_bytes: u64, clone: u32, count: usize) -> Vec<(u64, u64)> {
    let mut generator = JobGenerator::new(spec, device_bytes, 512, 5, clone).unwrap();
    collect(&mut generator, count)
        .iter()
        .map(|r| (r.offset_bytes / KIB, r.len_bytes / KIB))
        .collect()
}

fn offsets_kib(spec: &JobSpec, device_bytes: u64, clone: u32, count: usize) -> Vec<u64> {
    requests_kib(spec, device_bytes, clone, count)
        .into_iter()
        .map(|(offset, _)| offset)
        .collect()
}

/// fio's strided zones, sequentially: 16 KiB in each 64 KiB zone, then the zone 64 + 64
/// KiB further on, back to the first one at the device's end. The skipped bytes do not
/// count against the byte budget (fio counts them in `io_skip_bytes`, which nothing reads
/// since its `keep_running` stopped adding them), so the job still transfers its region's
/// worth. A `zonesize` without `zonemode=strided` is refused, as fio 3.x refuses it beside
/// its default `zonemode=none`.
#[test]
fn strided_sequential_reads_take_zonesize_from_each_zone() {
    let text = "[z]\nrw=read\nbs=4k\nzonemode=strided\nzonerange=64k\nzonesize=16k\n\
                zoneskip=64k\n";
    let spec = parsed_job(text);
    assert_eq!(
        spec.strided_zones(),
        Ok(Some(StridedZones {
            size_bytes: 16 * KIB,
            range_bytes: 64 * KIB,
            skip_bytes: 64 * KIB,
        }))
    );
    let mut expected = Vec::new();
    for zone_kib in [0, 128, 256, 384, 0, 128] {
        expected.extend([zone_kib, zone_kib + 4, zone_kib + 8, zone_kib + 12]);
    }
    assert_eq!(offsets_kib(&spec, 512 * KIB, 0, 24), expected);
    let mut generator = JobGenerator::new(&spec, 512 * KIB, 512, 5, 0).unwrap();
    assert_eq!(collect(&mut generator, usize::MAX).len(), 128);
    assert_eq!(generator.issued_bytes(), 512 * KIB);

    let error = crate::fio::parse_job_file(&text.replace("zonemode=strided\n", ""))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("zonemode=none (fio's default) and zonesize"),
        "{error}"
    );
}

/// Each `loops` iteration starts again at the first zone, as fio's `clear_io_state` puts
/// the file's offset back at the job's start.
#[test]
fn strided_loops_start_again_at_the_first_zone() {
    let spec = parsed_job(
        "[z]\nrw=write\nbs=4k\nzonerange=64k\nzonesize=16k\nzoneskip=64k\nio_size=40k\n\
         loops=2\n",
    );
    let first = [0, 4, 8, 12, 128, 132, 136, 140, 256, 260];
    let got = offsets_kib(&spec, MIB, 0, 100);
    assert_eq!(got.len(), 20);
    assert_eq!(got[..10], first);
    assert_eq!(got[10..], first);
}

/// Random requests draw their slot from the current zone, whatever the distribution, and
/// the zone changes once `zonesize` bytes have gone to it.
#[test]
fn strided_random_requests_stay_in_the_current_zone() {
    for distribution in ["random", "zipf:1.2", "normal:20"] {
        let spec = parsed_job(&format!(
            "[z]\nrw=randread\nbs=4k\nzonerange=64k\nzonesize=32k\n\
             random_distribution={distribution}\n"
        ));
        let offsets = offsets_kib(&spec, MIB, 0, 1000);
        // The region's worth: 256 requests, eight per zone, 16 zones before the wrap.
        assert_eq!(offsets.len(), 256, "{distribution}");
        for (index, offset) in offsets.iter().enumerate() {
            let zone_kib = (index as u64 / 8 % 16) * 64;
            assert!(
                (zone_kib..zone_kib + 64).contains(offset) && offset % 4 == 0,
                "{distribution}: request {index} at {offset} KiB is outside the zone at \
                 {zone_kib} KiB"
            );
        }
        let distinct: std::collections::BTreeSet<_> = offsets.iter().collect();
        assert!(distinct.len() > 100, "{distribution}: {}", distinct.len());
    }
}

/// In a read/write mix both directions' bytes count towards `zonesize`, each direction
/// walks the zone with its own position, and both positions go back to the zone's start
/// whenever the zone's byte count reaches a multiple of `zonerange` (fio's
/// `fio_file_reset`), as well as one direction's that reaches the zone's end.
#[test]
fn strided_zones_count_the_bytes_of_every_direction() {
    let spec = parsed_job(
        "[z]\nrw=rw\nbs=4k,8k\nzonerange=16k\nzonesize=40k\nzoneskip=112k\nrwmixread=50\n",
    );
    let mut generator = JobGenerator::new(&spec, MIB, 512, 5, 0).unwrap();
    let requests = collect(&mut generator, 400);
    let (mut zone_kib, mut transferred_kib) = (0, 0);
    let mut next_kib = [0u64; 2];
    let mut mid_zone_resets = 0;
    for request in &requests {
        let (offset, len) = (request.offset_bytes / KIB, request.len_bytes / KIB);
        let direction = usize::from(request.op == IoOp::Write);
        if transferred_kib >= 40 {
            transferred_kib = 0;
            zone_kib = (zone_kib + 128) % 1024;
        }
        if next_kib[direction] >= zone_kib + 16 {
            next_kib[direction] = zone_kib;
        }
        if transferred_kib % 16 == 0 {
            mid_zone_resets += usize::from(transferred_kib > 0 && next_kib != [zone_kib; 2]);
            next_kib = [zone_kib; 2];
        }
        assert_eq!(offset, next_kib[direction], "{requests:?}");
        next_kib[direction] = offset + len;
        transferred_kib += len;
    }
    assert!(
        mid_zone_resets > 0,
        "the reset at a multiple of zonerange was not exercised"
    );
}

/// Zones wrap to the clone's start once the next one would start at or past the device's
/// end (not at `offset + size`: as in fio, the zones leave the region, whose size only
/// sets the byte budget). Each clone of a `numjobs` job starts, and wraps, at its own
/// `offset + i × offset_increment`.
#[test]
fn strided_zones_wrap_to_each_clones_start_at_the_device_end() {
    let spec = parsed_job(
        "[z]\nrw=write\nbs=4k\noffset=256k\nsize=256k\nzonerange=256k\nzonesize=8k\n\
         numjobs=2\noffset_increment=128k\n",
    );
    assert_eq!(
        offsets_kib(&spec, MIB, 0, 10),
        [256, 260, 512, 516, 768, 772, 256, 260, 512, 516]
    );
    // Clone 1's third zone would reach past the device's end; it is used up to there.
    assert_eq!(
        offsets_kib(&spec, MIB, 1, 10),
        [384, 388, 640, 644, 896, 900, 384, 388, 640, 644]
    );
}

/// A zone the device's end cuts short ends there: sequential requests are shortened at the
/// device's end and start the zone again (where fio would fail the request and end the
/// job's pass), while a request may still reach past the end of a whole zone, as fio's do.
#[test]
fn a_zone_cut_by_the_device_end_ends_there() {
    let spec = parsed_job("[z]\nrw=read\nbs=96k\nzonerange=256k\nzonesize=256k\nio_size=1m\n");
    assert_eq!(
        requests_kib(&spec, 640 * KIB, 0, 11),
        [
            (0, 96),
            (96, 96),
            (192, 96),
            (256, 96),
            (352, 96),
            (448, 96),
            (512, 96),
            (608, 32),
            (512, 96),
            (608, 32),
            (0, 96),
        ]
    );
    let random =
        parsed_job("[z]\nrw=randread\nbs=64k\nzonerange=256k\nzonesize=256k\nio_size=1m\n");
    let requests = requests_kib(&random, 640 * KIB, 0, 16);
    // Four requests in each of the two whole zones, then four in the 128 KiB left of the
    // third, then the first zone again.
    for (index, &(offset, len)) in requests.iter().enumerate() {
        let zone_kib = (index as u64 / 4 % 3) * 256;
        assert!(
            offset >= zone_kib && offset + len <= (zone_kib + 256).min(640) && len == 64,
            "{requests:?}"
        );
    }
}

/// A `zonesize` larger than `zonerange` walks the zone again until `zonesize` bytes have
/// been transferred there.
#[test]
fn a_zonesize_above_zonerange_revisits_the_zone() {
    let spec = parsed_job("[z]\nrw=write\nbs=4k\nzonerange=16k\nzonesize=48k\nzoneskip=16k\n");
    let mut expected = Vec::new();
    for zone_kib in [0, 32] {
        for _ in 0..3 {
            expected.extend([zone_kib, zone_kib + 4, zone_kib + 8, zone_kib + 12]);
        }
    }
    assert_eq!(offsets_kib(&spec, MIB, 0, 24), expected);
}

/// `rw=read:4k` in a zone, as fio's `get_next_seq_offset` does it: the hole follows every
/// request but the zone's first, one request starts at the zone's end, and the one after
/// it, past the end, goes back to the zone's start.
#[test]
fn strided_holes_follow_fio() {
    let spec = parsed_job("[z]\nrw=read:4k\nbs=4k\nzonerange=16k\nzonesize=16k\nzoneskip=16k\n");
    assert_eq!(
        offsets_kib(&spec, MIB, 0, 12),
        [0, 8, 16, 0, 32, 40, 48, 32, 64, 72, 80, 64]
    );
    // `rw_sequencer=identical` repeats the zone's start, where fio's reset leaves it.
    let identical = parsed_job(
        "[z]\nrw=randread:4\nrw_sequencer=identical\nbs=4k\nzonerange=64k\nzonesize=16k\n",
    );
    let offsets = offsets_kib(&identical, MIB, 0, 12);
    for (index, run) in offsets.chunks(4).enumerate() {
        let zone_kib = index as u64 * 64;
        assert!(
            run.iter().all(|&o| o == run[0]) && (zone_kib..zone_kib + 64).contains(&run[0]),
            "{offsets:?}"
        );
    }
}

/// The zone options are parsed as fio reads them (sizes under `kb_base`, `zoneskip=Nz` in
/// zones of `zonesize`), and bad values and combinations are refused by name.
#[test]
fn zone_options_are_parsed_and_checked_as_fio_does() {
    let spec = parsed_job("[z]\nkb_base=1000\nzonesize=4k\nzoneskip=3z\n");
    assert_eq!(spec.zone_skip, ZoneSkip::Zones(3));
    assert_eq!(
        spec.strided_zones(),
        Ok(Some(StridedZones {
            size_bytes: 4000,
            range_bytes: 4000,
            skip_bytes: 12_000,
        }))
    );
    // zonemode=none leaves the requests alone, zonerange and zoneskip included.
    let none = parsed_job("[z]\nrw=randread\nzonemode=none\nzonerange=64k\nzoneskip=1m\n");
    assert_eq!(none.zone_mode, ZoneMode::None);
    assert_eq!(none.strided_zones(), Ok(None));
    let plain = parsed_job("[z]\nrw=randread\n");
    assert_eq!(
        offsets_kib(&none, MIB, 0, 100),
        offsets_kib(&plain, MIB, 0, 100)
    );
    // Options only zonemode=zbd uses are accepted where they change nothing.
    parsed_job("[z]\nmax_open_zones=0\njob_max_open_zones=0\nzonecapacity=0\nread_beyond_wp=0\n");

    let parse = |text: &str| crate::fio::parse_job_file(text).map(|_| ());
    for (text, option) in [
        ("[z]\nzonesize=-4k\n", "zonesize"),
        ("[z]\nzonesize=lots\n", "zonesize"),
        ("[z]\nzonesize=2z\n", "zonesize"),
        ("[z]\nzonerange=10%\n", "zonerange"),
        ("[z]\nzonerange=\n", "zonerange"),
        ("[z]\nzoneskip=10%\n", "zoneskip"),
        ("[z]\nzoneskip=xz\n", "zoneskip"),
        ("[z]\nzoneskip=-1\n", "zoneskip"),
        ("[z]\nzonemode=sideways\n", "zonemode"),
    ] {
        match parse(text) {
            Err(WorkloadError::BadValue { option: named, .. }) => {
                assert_eq!(named, option, "{text:?}")
            }
            other => panic!("{text:?}: {other:?}"),
        }
    }
    for (text, option) in [
        ("[z]\nzonemode=zbd\n", "zonemode"),
        ("[z]\nmax_open_zones=8\n", "max_open_zones"),
        ("[z]\nzonecapacity=1m\n", "zonecapacity"),
        ("[z]\nread_beyond_wp=1\n", "read_beyond_wp"),
    ] {
        match parse(text) {
            Err(WorkloadError::UnsupportedOption {
                option: named,
                reason,
                ..
            }) => {
                assert_eq!(named, option, "{text:?}");
                assert!(reason.contains("zoned block device"), "{reason}");
            }
            other => panic!("{text:?}: {other:?}"),
        }
    }
    for (text, needle) in [
        ("[z]\nzonemode=strided\n", "needs zonesize"),
        ("[z]\nzonemode=strided\nzonesize=0\n", "needs zonesize"),
        ("[z]\nzonemode=none\nzonesize=16k\n", "not compatible"),
        (
            "[global]\nzonesize=16k\n[z]\nzonemode=none\n",
            "not compatible",
        ),
    ] {
        match parse(text) {
            Err(error @ WorkloadError::InvalidJob { .. }) => {
                let message = error.to_string();
                assert!(
                    message.contains("[z]") && message.contains(needle),
                    "{text:?}: {message}"
                );
            }
            other => panic!("{text:?}: {other:?}"),
        }
    }
}

/// The generator refuses zones that do not fit the job: not whole sectors, longer than
/// the region, or shorter than a block; and, for a spec built in code, zone options fio
/// refuses together.
#[test]
fn strided_zones_that_do_not_fit_are_refused() {
    let refused = |text: &str, device_bytes: u64, needle: &str| {
        let spec = parsed_job(text);
        let error = JobGenerator::new(&spec, device_bytes, 512, 0, 0).unwrap_err();
        assert!(
            matches!(error, WorkloadError::InvalidJob { .. }) && error.to_string().contains(needle),
            "{text:?}: {error}"
        );
    };
    refused("[z]\nzonesize=1000\n", MIB, "zonerange=1000");
    refused("[z]\nzonesize=4k\nzoneskip=100\n", MIB, "zoneskip=100");
    refused(
        "[z]\nzonesize=64k\nsize=32k\n",
        MIB,
        "larger than the job's",
    );
    refused(
        "[z]\nzonesize=128k\noffset=960k\n",
        MIB,
        "larger than the job's",
    );
    refused("[z]\nbs=8k\nzonesize=4k\n", MIB, "zone (zonerange)");
    refused(
        "[z]\nrw=randread\nzonesize=64k\nrandom_distribution=zoned_abs:50/32k:50/64k\n",
        MIB,
        "laid over each zone",
    );
    let mut spec = job(RwMode::Read);
    spec.zone_mode = ZoneMode::Strided;
    let error = JobGenerator::new(&spec, MIB, 512, 0, 0).unwrap_err();
    assert!(error.to_string().contains("needs zonesize"), "{error}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Whatever the zones, every request lies on the device and on its sectors, and a
    /// random one in its zone (whose start is a whole number of strides past the region's
    /// start).
    #[test]
    fn strided_requests_stay_on_the_device(
        rw in rw_strategy(),
        block_sizes in block_size_strategy(),
        distribution in distribution_strategy(),
        range_sectors in 1u64..512,
        size_sectors in 1u64..1024,
        skip_sectors in 0u64..512,
        offset_sectors in 0u64..1024,
        region_extra_sectors in 0u64..1024,
        device_extra_sectors in 0u64..2048,
        modifier in proptest::option::of(1u64..=8),
        identical in any::<bool>(),
        percentage_random in prop_oneof![Just(100u32), 0u32..=100],
        seed in any::<u64>(),
    ) {
        let sector_bytes = 512;
        let mut spec = job(rw);
        spec.block_sizes = [block_sizes.clone(), block_sizes.clone(), block_sizes];
        spec.distribution = distribution;
        spec.offset_modifier = modifier.map(|n| if rw.is_random() { n } else { n * sector_bytes });
        spec.rw_sequencer_identical = identical;
        spec.percentage_random = percentage_random;
        spec.zone_size_bytes = size_sectors * sector_bytes;
        spec.zone_range_bytes = range_sectors * sector_bytes;
        spec.zone_skip = ZoneSkip::Bytes(skip_sectors * sector_bytes);
        spec.offset = SizeSpec::Bytes(offset_sectors * sector_bytes);
        spec.size = Some(SizeSpec::Bytes((range_sectors + region_extra_sectors) * sector_bytes));
        spec.time_based = true;
        let device_bytes =
            (offset_sectors + range_sectors + region_extra_sectors + device_extra_sectors)
                * sector_bytes;
        let Ok(mut generator) = JobGenerator::new(&spec, device_bytes, sector_bytes, seed, 0)
        else {
            // Zones shorter than a block or an alignment unit are refused.
            return Ok(());
        };
        let start_bytes = offset_sectors * sector_bytes;
        let stride_bytes = (range_sectors + skip_sectors) * sector_bytes;
        for _ in 0..300 {
            let request = generator.next_io().unwrap();
            prop_assert!(request.offset_bytes >= start_bytes);
            prop_assert!(request.offset_bytes + request.len_bytes <= device_bytes);
            prop_assert_eq!(request.offset_bytes % sector_bytes, 0);
            prop_assert_eq!(request.len_bytes % sector_bytes, 0);
            prop_assert!(request.len_bytes > 0);
            // A request drawn at random lies inside its zone, which starts a whole number
            // of strides past the region's start.
            if rw.is_random() && percentage_random == 100 && modifier.is_none() {
                let into_stride = (request.offset_bytes - start_bytes) % stride_bytes;
                prop_assert!(
                    into_stride + request.len_bytes <= range_sectors * sector_bytes,
                    "{:?} is not inside a zone", request
                );
            }
        }
    }
}

/// fio's `trimwrite` trims each range and then writes it, walking the region in order, and
/// is allowed twice the bytes (and requests) since every byte goes out twice.
#[test]
fn trimwrite_trims_each_range_then_writes_it() {
    let mut spec = job(RwMode::TrimWrite);
    spec.size = Some(SizeSpec::Bytes(16 * KIB));
    let mut generator = JobGenerator::new(&spec, MIB, 512, 1, 0).unwrap();
    let requests = collect(&mut generator, 100);
    let expected: Vec<(IoOp, u64)> = (0..4)
        .flat_map(|i| [(IoOp::Trim, i * 4 * KIB), (IoOp::Write, i * 4 * KIB)])
        .collect();
    let got: Vec<(IoOp, u64)> = requests.iter().map(|r| (r.op, r.offset_bytes)).collect();
    assert_eq!(got, expected);
    assert!(requests.iter().all(|r| r.len_bytes == 4 * KIB));

    // Random ranges, each written right after its trim; number_ios counts pairs' halves.
    let mut spec = job(RwMode::RandTrimWrite);
    spec.number_ios = Some(10);
    spec.block_sizes[2] = BlockSizeSpec::Split(vec![(4 * KIB, 50.0), (16 * KIB, 50.0)]);
    let mut generator = JobGenerator::new(&spec, MIB, 512, 9, 0).unwrap();
    let requests = collect(&mut generator, 100);
    assert_eq!(requests.len(), 20);
    for pair in requests.chunks(2) {
        assert_eq!((pair[0].op, pair[1].op), (IoOp::Trim, IoOp::Write));
        assert_eq!(
            (pair[0].offset_bytes, pair[0].len_bytes),
            (pair[1].offset_bytes, pair[1].len_bytes)
        );
    }
    let offsets: std::collections::BTreeSet<u64> =
        requests.iter().map(|r| r.offset_bytes).collect();
    assert!(offsets.len() > 5, "random offsets: {offsets:?}");

    // With verify, the writes are read back.
    let mut spec = job(RwMode::TrimWrite);
    spec.size = Some(SizeSpec::Bytes(8 * KIB));
    spec.verify = true;
    let mut generator = JobGenerator::new(&spec, MIB, 512, 1, 0).unwrap();
    let ops: Vec<IoOp> = collect(&mut generator, 100).iter().map(|r| r.op).collect();
    assert_eq!(
        ops,
        [
            IoOp::Trim,
            IoOp::Write,
            IoOp::Trim,
            IoOp::Write,
            IoOp::Read,
            IoOp::Read
        ]
    );
}
