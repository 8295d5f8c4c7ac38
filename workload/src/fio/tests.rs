use super::*;
use proptest::prelude::*;

/// Parses a file that must hold exactly one job and returns it.
fn one_job(text: &str) -> JobSpec {
    let jobs = parse_job_file(text).unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(jobs.len(), 1, "expected one job in {text:?}");
    jobs.into_iter().next().unwrap()
}

/// Parses `[job]` followed by `option_line` and returns the job.
fn with_option(option_line: &str) -> JobSpec {
    one_job(&format!("[job]\n{option_line}\n"))
}

/// Parses `[job]` followed by `option_line`, which must fail with `BadValue` for `option`.
fn assert_bad_value(option_line: &str, option: &str) {
    match parse_job_file(&format!("[job]\n{option_line}\n")) {
        Err(WorkloadError::BadValue {
            option: bad, line, ..
        }) => {
            assert_eq!(bad, option, "{option_line}");
            assert_eq!(line, 2, "{option_line}");
        }
        other => panic!("{option_line}: expected BadValue, got {other:?}"),
    }
}

#[test]
fn defaults_match_fio() {
    let job = with_option("");
    assert_eq!(job, JobSpec::default_named("job"));
    assert_eq!(job.rw, RwMode::Read);
    assert_eq!(job.block_sizes[0], BlockSizeSpec::Fixed(4096));
    assert_eq!(job.iodepth, 1);
    assert_eq!(job.numjobs, 1);
    assert_eq!(job.rwmixread_percent, 50);
    assert_eq!(job.percentage_random, 100);
    assert_eq!(job.offset, SizeSpec::Bytes(0));
    assert_eq!(job.size, None);
}

#[test]
fn global_options_are_inherited_and_jobs_come_in_file_order() {
    let text = "\
; a comment
# another comment

[global]
bs = 8k
iodepth=16

[first]
rw=randwrite

[second]
iodepth=4
";
    let jobs = parse_job_file(text).unwrap();
    assert_eq!(jobs.len(), 2);
    assert_eq!(jobs[0].name, "first");
    assert_eq!(jobs[0].rw, RwMode::RandWrite);
    assert_eq!(jobs[0].iodepth, 16);
    assert_eq!(jobs[0].block_sizes[1], BlockSizeSpec::Fixed(8192));
    assert_eq!(jobs[1].name, "second");
    assert_eq!(jobs[1].rw, RwMode::Read);
    assert_eq!(jobs[1].iodepth, 4);
    assert_eq!(jobs[1].block_sizes[0], BlockSizeSpec::Fixed(8192));
}

#[test]
fn a_later_global_section_only_affects_later_jobs() {
    let text = "[a]\n[global]\niodepth=8\n[b]\n";
    let jobs = parse_job_file(text).unwrap();
    assert_eq!(jobs[0].iodepth, 1);
    assert_eq!(jobs[1].iodepth, 8);
}

#[test]
fn job_options_do_not_leak_into_the_next_job() {
    let jobs = parse_job_file("[a]\niodepth=8\n[b]\n").unwrap();
    assert_eq!(jobs[1].iodepth, 1);
}

#[test]
fn name_option_overrides_the_section_name() {
    assert_eq!(with_option("name=renamed").name, "renamed");
    let jobs = parse_job_file("[global]\nname=shared\n[a]\n[b]\nname=own\n").unwrap();
    assert_eq!(jobs[0].name, "shared");
    assert_eq!(jobs[1].name, "own");
}

#[test]
fn comments_and_whitespace() {
    let job = one_job("  [job]  \n\t iodepth\t=\t 32   # queue depth\n  ; indented comment\n");
    assert_eq!(job.iodepth, 32);
    let job = one_job("\u{feff}[job]\r\nbs=16k ; trailing\r\n");
    assert_eq!(job.block_sizes[2], BlockSizeSpec::Fixed(16384));
}

#[test]
fn rw_modes() {
    let cases = [
        ("read", RwMode::Read),
        ("write", RwMode::Write),
        ("randread", RwMode::RandRead),
        ("randwrite", RwMode::RandWrite),
        ("rw", RwMode::ReadWrite),
        ("readwrite", RwMode::ReadWrite),
        ("randrw", RwMode::RandRw),
        ("trim", RwMode::Trim),
        ("randtrim", RwMode::RandTrim),
    ];
    for (text, mode) in cases {
        assert_eq!(with_option(&format!("rw={text}")).rw, mode, "{text}");
        assert_eq!(with_option(&format!("readwrite={text}")).rw, mode, "{text}");
        assert_eq!(parse_rw(mode.fio_name()), Ok(mode), "fio_name round-trips");
    }
    assert!(RwMode::RandRw.is_random() && RwMode::RandRw.is_mixed());
    assert!(!RwMode::Write.is_random() && !RwMode::Write.is_mixed());
}

#[test]
fn rw_refusals() {
    assert_bad_value("rw=trimread", "rw");
    assert_bad_value("rw=sideways", "rw");
    assert_bad_value("rw", "rw");
    assert_bad_value("rw=write:0", "rw");
    assert_bad_value("rw=write:", "rw");
    assert_bad_value("rw=randread:many", "rw");
    assert_bad_value("rw=sideways:8", "rw");
    assert_bad_value("rw_sequencer=random", "rw_sequencer");
}

/// fio's `rw=MODE:N` offset modifier (a size, suffixes allowed) and `rw_sequencer`.
#[test]
fn rw_takes_fios_offset_modifier() {
    let job = with_option("rw=write:4k");
    assert_eq!((job.rw, job.offset_modifier), (RwMode::Write, Some(4096)));
    let job = with_option("rw=randread:8");
    assert_eq!((job.rw, job.offset_modifier), (RwMode::RandRead, Some(8)));
    assert_eq!(with_option("rw=randread").offset_modifier, None);
    assert!(!with_option("").rw_sequencer_identical);
    assert!(with_option("rw_sequencer=identical").rw_sequencer_identical);
    assert!(!with_option("rw_sequencer=sequential").rw_sequencer_identical);
    // A later `rw=` without the modifier drops it.
    assert_eq!(
        one_job("[global]\nrw=write:4k\n[job]\nrw=read\n").offset_modifier,
        None
    );
}

#[test]
fn bs_single_value_applies_to_all_directions() {
    let job = with_option("bs=64k");
    assert_eq!(
        job.block_sizes,
        [0, 1, 2].map(|_| BlockSizeSpec::Fixed(65536))
    );
}

#[test]
fn bs_lists_follow_fio_rules() {
    let fixed = |kib: u64| BlockSizeSpec::Fixed(kib * 1024);
    // The last value, when not followed by a comma, fills the remaining directions.
    assert_eq!(
        with_option("bs=8k,32k").block_sizes,
        [fixed(8), fixed(32), fixed(32)]
    );
    // A trailing comma leaves the remaining directions at their previous value.
    assert_eq!(
        with_option("bs=8k,32k,").block_sizes,
        [fixed(8), fixed(32), fixed(4)]
    );
    assert_eq!(
        with_option("bs=,8k").block_sizes,
        [fixed(4), fixed(8), fixed(8)]
    );
    assert_eq!(
        with_option("bs=,8k,").block_sizes,
        [fixed(4), fixed(8), fixed(4)]
    );
    assert_eq!(
        with_option("blocksize=1k,2k,3k").block_sizes,
        [fixed(1), fixed(2), fixed(3)]
    );
}

#[test]
fn bs_refusals() {
    assert_bad_value("bs=0", "bs");
    assert_bad_value("bs=4q", "bs");
    assert_bad_value("bs=1k,2k,3k,4k", "bs");
    assert_bad_value("bs=,", "bs");
    assert_bad_value("bs=", "bs");
}

#[test]
fn bsrange() {
    assert_eq!(
        with_option("bsrange=1k-9k").block_sizes[0],
        BlockSizeSpec::Range {
            min: 1024,
            max: 9216
        }
    );
    let job = with_option("bsrange=512-4k,8k-16k");
    assert_eq!(
        job.block_sizes[0],
        BlockSizeSpec::Range {
            min: 512,
            max: 4096
        }
    );
    assert_eq!(
        job.block_sizes[2],
        BlockSizeSpec::Range {
            min: 8192,
            max: 16384
        }
    );
    assert_eq!(job.block_sizes[2].min_bytes(), 8192);
    assert_eq!(job.block_sizes[2].max_bytes(), 16384);
    assert_bad_value("bsrange=9k-1k", "bsrange");
    assert_bad_value("bsrange=4k", "bsrange");
    assert_bad_value("bsrange=0-4k", "bsrange");
}

#[test]
fn bssplit_with_all_percentages() {
    let job = with_option("bssplit=4k/50:8k/30:64k/20");
    assert_eq!(
        job.block_sizes[0],
        BlockSizeSpec::Split(vec![(4096, 50.0), (8192, 30.0), (65536, 20.0)])
    );
    assert_eq!(job.block_sizes[0].min_bytes(), 4096);
    assert_eq!(job.block_sizes[0].max_bytes(), 65536);
}

#[test]
fn bssplit_missing_percentages_share_the_rest() {
    let job = with_option("bssplit=4k/40:8k:16k/");
    assert_eq!(
        job.block_sizes[1],
        BlockSizeSpec::Split(vec![(4096, 40.0), (8192, 30.0), (16384, 30.0)])
    );
    let job = with_option("bssplit=4k");
    assert_eq!(
        job.block_sizes[0],
        BlockSizeSpec::Split(vec![(4096, 100.0)])
    );
}

#[test]
fn bssplit_short_of_100_gives_the_rest_to_the_last_entry() {
    let job = with_option("bssplit=4k/50:8k/20");
    assert_eq!(
        job.block_sizes[0],
        BlockSizeSpec::Split(vec![(4096, 50.0), (8192, 50.0)])
    );
}

#[test]
fn bssplit_per_direction() {
    let job = with_option("bssplit=4k/50:8k/50,16k/100");
    assert_eq!(
        job.block_sizes[0],
        BlockSizeSpec::Split(vec![(4096, 50.0), (8192, 50.0)])
    );
    assert_eq!(
        job.block_sizes[1],
        BlockSizeSpec::Split(vec![(16384, 100.0)])
    );
    assert_eq!(
        job.block_sizes[2],
        BlockSizeSpec::Split(vec![(16384, 100.0)])
    );
}

#[test]
fn bssplit_refusals() {
    assert_bad_value("bssplit=4k/60:8k/50", "bssplit");
    assert_bad_value("bssplit=4k/-5", "bssplit");
    assert_bad_value("bssplit=4k/abc", "bssplit");
    assert_bad_value("bssplit=4k/50::8k/50", "bssplit");
    assert_bad_value("bssplit=0/100", "bssplit");
    assert_bad_value("bssplit=4k/NaN", "bssplit");
    let too_many = vec!["4k"; MAX_BSSPLIT_ENTRIES + 1].join(":");
    assert_bad_value(&format!("bssplit={too_many}"), "bssplit");
}

#[test]
fn blockalign() {
    assert_eq!(with_option("blockalign=8k").block_align_bytes, Some(8192));
    assert_eq!(with_option("ba=4k,4k").block_align_bytes, Some(4096));
    assert_bad_value("ba=4k,8k", "ba");
    assert_bad_value("ba=0", "ba");
}

#[test]
fn size_and_offset() {
    assert_eq!(with_option("size=1g").size, Some(SizeSpec::Bytes(1 << 30)));
    assert_eq!(with_option("size=50%").size, Some(SizeSpec::Percent(50.0)));
    assert_eq!(with_option("offset=1m").offset, SizeSpec::Bytes(1 << 20));
    assert_eq!(with_option("offset=25%").offset, SizeSpec::Percent(25.0));
    assert_eq!(with_option("offset=0%").offset, SizeSpec::Percent(0.0));
    assert_bad_value("size=0", "size");
    assert_bad_value("size=0%", "size");
    assert_bad_value("size=101%", "size");
    assert_bad_value("size=lots", "size");
    assert_bad_value("offset=100%", "offset");
    assert_bad_value("offset=x%", "offset");
}

#[test]
fn io_size_and_number_ios() {
    assert_eq!(with_option("io_size=10g").io_size_bytes, Some(10 << 30));
    assert_eq!(with_option("io_limit=1m").io_size_bytes, Some(1 << 20));
    assert_eq!(with_option("number_ios=1000").number_ios, Some(1000));
    assert_eq!(with_option("number_ios=0").number_ios, None);
    assert_bad_value("io_size=0", "io_size");
    assert_bad_value("number_ios=many", "number_ios");
}

#[test]
fn iodepth_and_numjobs() {
    assert_eq!(with_option("iodepth=128").iodepth, 128);
    assert_eq!(with_option("numjobs=4").numjobs, 4);
    assert_bad_value("iodepth=0", "iodepth");
    assert_bad_value("iodepth=-1", "iodepth");
    assert_bad_value("iodepth=99999999999", "iodepth");
    assert_bad_value("numjobs=0", "numjobs");
    assert_bad_value("numjobs=two", "numjobs");
}

#[test]
fn time_options() {
    let job = with_option("runtime=30");
    assert_eq!(job.runtime_ns, Some(30_000_000_000));
    assert_eq!(with_option("runtime=2m").runtime_ns, Some(120_000_000_000));
    assert_eq!(with_option("runtime=0").runtime_ns, None);
    assert_eq!(with_option("ramp_time=500ms").ramp_time_ns, 500_000_000);
    assert_eq!(with_option("thinktime=100").think.pause_ns, 100_000);
    assert_eq!(with_option("thinktime=2ms").think.pause_ns, 2_000_000);
    assert_bad_value("runtime=soon", "runtime");
    assert_bad_value("thinktime=", "thinktime");
}

/// fio's think-time options, with their units: `thinktime_spin` in microseconds like
/// `thinktime`, `thinktime_iotime` in seconds like `runtime`.
#[test]
fn think_time_options() {
    let job = parse_job_file(
        "[j]\nthinktime=100\nthinktime_spin=30\nthinktime_blocks=8\n\
         thinktime_blocks_type=issue\nthinktime_iotime=2\nrate_ignore_thinktime=1\n",
    )
    .unwrap()
    .remove(0);
    assert_eq!(
        job.think,
        ThinkTime {
            pause_ns: 100_000,
            spin_ns: 30_000,
            blocks: Some(8),
            count_issued: true,
            iotime_ns: 2_000_000_000,
            rate_ignores_pause: true,
        }
    );
    // fio's defaults: one completed block between pauses; with only a time between pauses,
    // no count at all; a spin longer than the pause lengthens it.
    let plain = with_option("thinktime=1ms").think;
    assert_eq!(plain.blocks_between_pauses(), Some(1));
    assert!(!plain.count_issued);
    let timed = parse_job_file("[j]\nthinktime=1ms\nthinktime_iotime=50ms\n")
        .unwrap()
        .remove(0)
        .think;
    assert_eq!(timed.blocks_between_pauses(), None);
    let spun = parse_job_file("[j]\nthinktime=10\nthinktime_spin=25\n")
        .unwrap()
        .remove(0)
        .think;
    assert_eq!(spun.pause_total_ns(), 25_000);
    assert_eq!(with_option("thinktime_spin=25").think.pause_total_ns(), 0);
    assert_bad_value("thinktime_blocks=0", "thinktime_blocks");
    assert_bad_value("thinktime_blocks=many", "thinktime_blocks");
    assert_bad_value("thinktime_blocks_type=submit", "thinktime_blocks_type");
    assert_bad_value("thinktime_iotime=soon", "thinktime_iotime");
    assert_bad_value("rate_ignore_thinktime=maybe", "rate_ignore_thinktime");
    let err = parse_job_file("[j]\nthinkcycles=1000\n").unwrap_err();
    assert!(err.to_string().contains("thinktime_spin"), "{err}");
}

#[test]
fn boolean_options() {
    assert!(with_option("time_based").time_based);
    assert!(with_option("time_based=1").time_based);
    assert!(!with_option("time_based=0").time_based);
    assert!(with_option("stonewall").stonewall);
    assert!(with_option("wait_for_previous=yes").stonewall);
    assert!(!with_option("stonewall=off").stonewall);
    assert_bad_value("time_based=maybe", "time_based");
}

#[test]
fn rwmix() {
    assert_eq!(with_option("rwmixread=70").rwmixread_percent, 70);
    assert_eq!(with_option("rwmixwrite=70").rwmixread_percent, 30);
    assert_eq!(with_option("rwmixread=0").rwmixread_percent, 0);
    assert_bad_value("rwmixread=101", "rwmixread");
    assert_bad_value("rwmixwrite=200", "rwmixwrite");
}

#[test]
fn random_distribution() {
    let distribution =
        |text: &str| with_option(&format!("random_distribution={text}")).distribution;
    assert_eq!(distribution("random"), Distribution::Uniform);
    assert_eq!(distribution("zipf:1.2"), Distribution::Zipf { theta: 1.2 });
    assert_eq!(distribution("zipf:1"), Distribution::Zipf { theta: 1.0 });
    assert_eq!(distribution("pareto:0.2"), Distribution::Pareto { h: 0.2 });
    assert_eq!(
        distribution("normal:10"),
        Distribution::Normal {
            sigma_percent: 10.0
        }
    );
    assert_eq!(
        distribution("gauss:5"),
        Distribution::Normal { sigma_percent: 5.0 }
    );
    for bad in [
        "zipf",
        "zipf:0",
        "zipf:-1",
        "zipf:inf",
        "zipf:1.2:0.5",
        "pareto:1",
        "pareto:0",
        "normal:100",
        "normal:-1",
        "random:3",
        "lognormal:3",
    ] {
        assert_bad_value(&format!("random_distribution={bad}"), "random_distribution");
    }
}

/// fio's zoned distributions: `ACCESS/SIZE` zones from the region's start, sizes in
/// percent (`zoned`) or bytes (`zoned_abs`, also written with `=`), access shares adding up
/// to exactly 100.
#[test]
fn zoned_distributions() {
    let distribution =
        |text: &str| with_option(&format!("random_distribution={text}")).distribution;
    let zone = |access_percent, span| Zone {
        access_percent,
        span,
    };
    assert_eq!(
        distribution("zoned:60/10:30/20:8/30:2/40"),
        Distribution::Zoned {
            zones: vec![
                zone(60, ZoneSpan::Percent(10)),
                zone(30, ZoneSpan::Percent(20)),
                zone(8, ZoneSpan::Percent(30)),
                zone(2, ZoneSpan::Percent(40)),
            ]
        }
    );
    assert_eq!(
        distribution("zoned:100/5"),
        Distribution::Zoned {
            zones: vec![zone(100, ZoneSpan::Percent(5))]
        }
    );
    let absolute = Distribution::Zoned {
        zones: vec![
            zone(70, ZoneSpan::Bytes(1 << 20)),
            zone(30, ZoneSpan::Bytes(3 << 20)),
        ],
    };
    assert_eq!(distribution("zoned_abs:70/1m:30/3m"), absolute);
    assert_eq!(distribution("zoned_abs=70/1m:30/3m"), absolute);
    assert_eq!(distribution("ZONED_ABS:70/1M:30/3M"), absolute);
    for bad in [
        "zoned",
        "zoned:",
        "zoned:60/10:30/20",
        "zoned:60/10:50/20",
        "zoned:50/60:50/60",
        "zoned:100/0",
        "zoned:100",
        "zoned:50/10:50/x",
        "zoned:50/5:50/95,100/100",
        "zoned:50.5/10:49.5/10",
        "zoned_abs:100/0",
        "zoned_abs:60/1m:30/1m",
        "zoned_abs:100/lots",
    ] {
        assert_bad_value(&format!("random_distribution={bad}"), "random_distribution");
    }
    let many = vec!["1/1"; 100].join(":");
    assert_bad_value(
        &format!("random_distribution=zoned:{many}"),
        "random_distribution",
    );
}

#[test]
fn percentage_random_and_randseed() {
    assert_eq!(with_option("percentage_random=30").percentage_random, 30);
    assert_eq!(with_option("percentage_random=30,30").percentage_random, 30);
    assert_bad_value("percentage_random=30,40", "percentage_random");
    assert_bad_value("percentage_random=101", "percentage_random");
    assert_eq!(with_option("randseed=42").randseed, Some(42));
    assert_eq!(with_option("randseed=0xff").randseed, Some(255));
    assert_bad_value("randseed=-3", "randseed");
}

#[test]
fn ignored_options_are_accepted() {
    let text = "[job]\nioengine=libaio\ndirect=1\nbuffered=0\ngroup_reporting\nthread\n\
                norandommap\nrandrepeat=0\nfilename=/dev/nvme0n1\ndescription=whatever you like\n";
    // `group_reporting` only decides how steady state is judged, which is off here.
    let mut expected = JobSpec::default_named("job");
    expected.group_reporting = true;
    assert_eq!(one_job(text), expected);
    // Every option of the list, as real job files carry them (logs, percentiles, buffer
    // contents, CPU placement): none changes the job.
    let every: String = IGNORED_OPTIONS
        .iter()
        .map(|option| format!("{option}=1\n"))
        .collect();
    assert_eq!(
        one_job(&format!("[job]\n{every}")),
        JobSpec::default_named("job")
    );
}

/// Options that would change what the device receives are refused until they are
/// modelled, not accepted and dropped, and by name with what to use instead, not as typos.
/// Options that are not modelled are accepted at the value where they change nothing (fio's
/// default, or off), as tools that write job files spell them out; any other value is
/// still refused by name.
#[test]
fn unmodelled_options_at_their_neutral_value_are_accepted() {
    for option in [
        "zonemode=none",
        "nrfiles=1",
        "openfiles=1",
        "verify_backlog=0",
        "experimental_verify=0",
        "verify_only=0",
        "trim_percentage=0",
        "fill_device=0",
        "bs_unaligned=false",
        "thinkcycles=0",
        "rate_min=0",
        "rate_iops_min=0,0",
        "latency_target=0",
        "max_latency=0",
        "flow=0",
        "trim_verify_zero=1",
        "file_service_type=roundrobin",
        "ss_dur=30s",
        "replay_no_stall=1",
        "ioscheduler=none",
        "rwmixcycle=500",
        "exitall_on_error",
        "stats=0",
    ] {
        parse_job_file(&format!("[job]\n{option}\n")).unwrap_or_else(|e| panic!("{option}: {e}"));
    }
    for option in ["zonemode=zbd", "max_open_zones=8", "nrfiles=2"] {
        assert!(
            matches!(
                parse_job_file(&format!("[job]\n{option}\n")),
                Err(WorkloadError::UnsupportedOption { .. })
            ),
            "{option}"
        );
    }
}

/// `read_iolog` and its `replay_*` options; [`resolve_iologs`] reads the log from the job
/// file's directory and applies `replay_scale` and `replay_align` to its offsets.
#[test]
fn iolog_replay_options_and_loading() {
    let dir = std::env::temp_dir().join(format!("afa-iolog-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("t.log"),
        "fio version 2 iolog\nsdb add\nsdb open\nsdb write 1000000 4096\nsdb read 40960 512\n",
    )
    .unwrap();
    let mut jobs = parse_job_file(
        "[r]\nread_iolog=t.log\nreplay_no_stall=1\nreplay_time_scale=50\nreplay_scale=2\n\
         replay_align=4k\n",
    )
    .unwrap();
    let job = &jobs[0];
    assert_eq!(job.read_iolog.as_deref(), Some("t.log"));
    assert!(job.replay_no_stall);
    assert_eq!(job.replay_time_scale_percent, 50);
    assert_eq!(job.replay_scale, Some(2));
    assert_eq!(job.replay_align_bytes, Some(4096));
    resolve_iologs(&mut jobs, &dir).unwrap();
    let records = jobs[0].iolog_records.as_deref().unwrap();
    let offsets: Vec<u64> = records.iter().map(|r| r.offset_bytes).collect();
    // 1,000,000 / 2 = 500,000, down to 4 KiB: 499,712; 40,960 / 2 = 20,480 (already aligned).
    assert_eq!(offsets, [499_712, 20_480]);
    let mut missing = parse_job_file("[r]\nread_iolog=nope.log\n").unwrap();
    let error = resolve_iologs(&mut missing, &dir).unwrap_err().to_string();
    assert!(
        error.contains("[r]") && error.contains("nope.log"),
        "{error}"
    );
    assert_bad_value("replay_time_scale=0", "replay_time_scale");
    assert_bad_value("replay_align=3000", "replay_align");
    assert_bad_value("read_iolog=", "read_iolog");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `kb_base=1000` counts the SI spellings (`k`, `kb`, `m`) in powers of 1000 and the IEC
/// ones (`kib`) in powers of 1024, in every size of its section wherever it stands (fio
/// reads it first); a job inherits the global one and may set its own.
#[test]
fn kb_base_chooses_what_size_suffixes_count_in() {
    let jobs = parse_job_file(
        "[global]\nkb_base=1000\n\
         [si]\nbs=4k\nsize=1m\nrate=2m\n\
         [mixed]\nbs=8kib\nkb_base=1000\noffset=2mb\n\
         [binary]\nbs=4k\nkb_base=1024\nsize=1m\n\
         [range]\nbsrange=1k-8kib\n",
    )
    .unwrap();
    assert_eq!(jobs[0].block_sizes[0], BlockSizeSpec::Fixed(4000));
    assert_eq!(jobs[0].size, Some(SizeSpec::Bytes(1_000_000)));
    assert_eq!(
        jobs[0].rate_limits[0],
        Some(RateLimit::BytesPerSecond(2_000_000))
    );
    assert_eq!(
        jobs[3].block_sizes[1],
        BlockSizeSpec::Range {
            min: 1000,
            max: 8192
        }
    );
    assert_eq!(jobs[1].block_sizes[0], BlockSizeSpec::Fixed(8192));
    assert_eq!(jobs[1].offset, SizeSpec::Bytes(2_000_000));
    // A job's own kb_base counts for every size of its section, even one before it.
    assert_eq!(jobs[2].block_sizes[0], BlockSizeSpec::Fixed(4096));
    assert_eq!(jobs[2].size, Some(SizeSpec::Bytes(1 << 20)));
    assert_bad_value("kb_base=1001", "kb_base");
}

/// `exit_what`, `bs_is_seq_rand`, `serialize_overlap` and `wait_for`, which must name one
/// job earlier in the file.
#[test]
fn job_coordination_options() {
    assert!(with_option("exit_what=all").exit_all_groups);
    assert!(!with_option("exit_what=stonewall").exit_all_groups);
    assert_bad_value("exit_what=some", "exit_what");
    assert!(with_option("bs_is_seq_rand=1").bs_is_seq_rand);
    assert!(with_option("serialize_overlap=1").serialize_overlap);
    let jobs = parse_job_file("[a]\nrw=write\n[b]\nwait_for=a\n").unwrap();
    assert_eq!(jobs[1].wait_for.as_deref(), Some("a"));
    for (text, reason) in [
        ("[a]\nwait_for=b\n[b]\nrw=write\n", "names no job before"),
        ("[a]\n[a]\n[b]\nwait_for=a\n", "more than one job"),
        ("[a]\nwait_for=a\n", "names no job before"),
    ] {
        let error = parse_job_file(text).unwrap_err().to_string();
        assert!(error.contains(reason), "{text:?}: {error}");
    }
    assert_bad_value("wait_for=", "wait_for");
}

#[test]
fn options_that_shape_the_requests_are_not_ignored() {
    for option in [
        "nrfiles=2",
        "verify_only=1",
        "zonemode=zbd",
        "bs_unaligned",
        "thinkcycles=1000",
    ] {
        assert!(
            matches!(
                parse_job_file(&format!("[job]\n{option}\n")),
                Err(WorkloadError::UnsupportedOption { .. })
            ),
            "{option}"
        );
    }
    let error = parse_job_file("[job]\nrw=write\nverify_only=1\n").unwrap_err();
    assert!(
        error.to_string().starts_with(
            "job file line 3, section [job]: fio option 'verify_only' is not modelled: \
             fio's verify pass"
        ),
        "{error}"
    );
    // No option is both ignored and refused.
    for (names, _) in UNMODELLED_OPTIONS {
        for name in *names {
            assert!(!IGNORED_OPTIONS.contains(name), "{name}");
        }
    }
}

/// `startdelay` is a duration (bare numbers in seconds, as in fio); a range is refused.
/// `iodepth_low` is any unsigned mark (fio reads 0 and marks above the depth as a full
/// queue, which the run applies).
#[test]
fn startdelay_queue_marks_and_exitall_are_read() {
    assert_eq!(with_option("").start_delay_ns, 0);
    assert_eq!(with_option("startdelay=2").start_delay_ns, 2_000_000_000);
    assert_eq!(with_option("startdelay=5ms").start_delay_ns, 5_000_000);
    assert_bad_value("startdelay=1-5", "startdelay");
    assert_bad_value("startdelay=soon", "startdelay");
    assert_eq!(with_option("").iodepth_low, None);
    assert_eq!(with_option("iodepth_low=4").iodepth_low, Some(4));
    assert_eq!(with_option("iodepth_low=0").iodepth_low, Some(0));
    assert_bad_value("iodepth_low=-1", "iodepth_low");
    assert_eq!(with_option("").iodepth_batch_complete_min, None);
    assert_eq!(
        with_option("iodepth_batch_complete_min=4").iodepth_batch_complete_min,
        Some(4)
    );
    assert_eq!(
        with_option("iodepth_batch_complete=2").iodepth_batch_complete_min,
        Some(2)
    );
    assert_bad_value("iodepth_batch_complete_min=x", "iodepth_batch_complete_min");
    assert!(with_option("exitall").exit_all);
    assert!(!with_option("exitall=0").exit_all);
    assert!(!with_option("").exit_all);
}

/// `verify=METHOD` turns fio's verify pass on, `verify=none` (or 0) and `do_verify=0` turn
/// it off, in either order; an unknown method is refused with the list.
#[test]
fn verify_turns_the_verify_pass_on() {
    assert!(!with_option("").verify);
    assert!(with_option("verify=crc32c").verify);
    assert!(with_option("verify=MD5").verify);
    assert!(!with_option("verify=none").verify);
    assert!(!with_option("verify=0").verify);
    assert!(!one_job("[job]\nverify=md5\ndo_verify=0\n").verify);
    assert!(!one_job("[job]\ndo_verify=0\nverify=md5\n").verify);
    assert!(one_job("[global]\nverify=sha256\n[job]\ndo_verify=1\n").verify);
    assert!(one_job("[job]\nverify=md5\nverify_fatal=1\nverify_pattern=0xff\n").verify);
    match parse_job_file("[job]\nverify=crc99\n") {
        Err(WorkloadError::BadValue { option, reason, .. }) => {
            assert_eq!(option, "verify");
            assert!(reason.contains("crc32c"), "{reason}");
        }
        other => panic!("expected BadValue, got {other:?}"),
    }
    assert_bad_value("do_verify=maybe", "do_verify");
}

/// `loops=N` runs the job N times (at least once).
#[test]
fn loops_counts_the_iterations() {
    assert_eq!(with_option("").loops, 1);
    assert_eq!(with_option("loops=3").loops, 3);
    assert_eq!(one_job("[global]\nloops=2\n[job]\nrw=write\n").loops, 2);
    assert_bad_value("loops=0", "loops");
    assert_bad_value("loops=-1", "loops");
    assert_bad_value("loops", "loops");
}

#[test]
fn unknown_option_names_section_option_and_line() {
    let text = "[global]\nbs=4k\n\n[randw]\nrw=randwrite\n# comment\niodeph=32\n";
    let error = parse_job_file(text).unwrap_err();
    assert!(
        matches!(
            &error,
            WorkloadError::UnknownOption { section, option, line: 7 }
                if section == "randw" && option == "iodeph"
        ),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "job file line 7, section [randw]: unknown option 'iodeph'"
    );
}

#[test]
fn unknown_option_in_global_names_global() {
    let error = parse_job_file("[global]\nverfy=crc32\n[a]\n").unwrap_err();
    assert!(
        matches!(&error, WorkloadError::UnknownOption { section, line: 2, .. } if section == "global"),
        "{error:?}"
    );
}

#[test]
fn bad_value_names_section_option_value_and_line() {
    let error = parse_job_file("[global]\n[seq]\nbs=4k\niodepth=0\n").unwrap_err();
    match &error {
        WorkloadError::BadValue {
            section,
            option,
            value,
            line,
            ..
        } => {
            assert_eq!(
                (section.as_str(), option.as_str(), value.as_str(), *line),
                ("seq", "iodepth", "0", 4)
            );
        }
        other => panic!("expected BadValue, got {other:?}"),
    }
    assert!(error.to_string().contains("must be at least 1"), "{error}");
}

#[test]
fn syntax_errors() {
    for (text, line) in [
        ("bs=4k\n[job]\n", 1),
        ("[job\n", 1),
        ("[job]\n[]\n", 2),
        ("[job]\n=4k\n", 2),
    ] {
        match parse_job_file(text) {
            Err(WorkloadError::Syntax { line: found, .. }) => assert_eq!(found, line, "{text:?}"),
            other => panic!("{text:?}: expected a syntax error, got {other:?}"),
        }
    }
}

#[test]
fn files_without_jobs_are_refused() {
    assert!(matches!(parse_job_file(""), Err(WorkloadError::NoJobs)));
    assert!(matches!(
        parse_job_file("# nothing\n[global]\nbs=4k\n"),
        Err(WorkloadError::NoJobs)
    ));
}

#[test]
fn last_setting_wins() {
    let job = with_option("iodepth=2\niodepth=8\nbs=4k\nbsrange=4k-8k");
    assert_eq!(job.iodepth, 8);
    assert_eq!(
        job.block_sizes[0],
        BlockSizeSpec::Range {
            min: 4096,
            max: 8192
        }
    );
}

#[test]
fn a_realistic_job_file() {
    let text = "\
[global]
ioengine=libaio
direct=1
filename=/dev/nvme0n1
time_based
runtime=60
group_reporting

[seq-fill]
rw=write
bs=128k
iodepth=32
size=100%
stonewall

[mixed]
stonewall
rw=randrw
rwmixread=70
bssplit=4k/60:16k/30:128k/10,4k/
iodepth=64
numjobs=4
random_distribution=zipf:1.1
ramp_time=5s
";
    let jobs = parse_job_file(text).unwrap();
    assert_eq!(jobs.len(), 2);
    assert!(jobs.iter().all(|job| job.time_based && job.stonewall));
    assert_eq!(jobs[0].size, Some(SizeSpec::Percent(100.0)));
    assert_eq!(jobs[1].numjobs, 4);
    assert_eq!(jobs[1].rwmixread_percent, 70);
    assert_eq!(jobs[1].distribution, Distribution::Zipf { theta: 1.1 });
    assert_eq!(
        jobs[1].block_sizes[1],
        BlockSizeSpec::Split(vec![(4096, 100.0)])
    );
    assert_eq!(jobs[1].runtime_ns, Some(60_000_000_000));
}

/// Option names the parser knows, to build job files that get past the name check.
const KNOWN_OPTIONS: &[&str] = &[
    "rw",
    "bs",
    "bsrange",
    "bssplit",
    "blockalign",
    "size",
    "offset",
    "io_size",
    "number_ios",
    "iodepth",
    "numjobs",
    "runtime",
    "time_based",
    "ramp_time",
    "rwmixread",
    "rwmixwrite",
    "random_distribution",
    "percentage_random",
    "randseed",
    "thinktime",
    "stonewall",
    "name",
    "direct",
    "ss",
    "ss_dur",
    "ss_ramp",
    "ss_interval",
    "group_reporting",
    "latency_target",
    "latency_window",
    "latency_percentile",
    "latency_run",
    "max_latency",
    "rate_min",
    "rate_iops_min",
    "rate_cycle",
    "zonemode",
    "zonesize",
    "zonerange",
    "zoneskip",
    "flow",
    "flow_id",
    "flow_sleep",
];

proptest! {
    #[test]
    fn parser_never_panics_on_arbitrary_text(text in any::<String>()) {
        let _ = parse_job_file(&text);
    }

    #[test]
    fn parser_never_panics_on_ini_like_text(
        text in "[\\[\\]=a-z0-9 #;:,/%.\\-\n\t]{0,300}"
    ) {
        let _ = parse_job_file(&text);
    }

    #[test]
    fn parser_never_panics_on_known_options_with_odd_values(
        entries in proptest::collection::vec(
            (proptest::sample::select(KNOWN_OPTIONS), "[0-9a-zA-Z:/,%.\\-]{0,24}"),
            0..12,
        )
    ) {
        let mut text = String::from("[job]\n");
        for (option, value) in &entries {
            text.push_str(option);
            text.push('=');
            text.push_str(value);
            text.push('\n');
        }
        match parse_job_file(&text) {
            Ok(jobs) => prop_assert_eq!(jobs.len(), 1),
            Err(error) => prop_assert!(!error.to_string().is_empty()),
        }
    }
}

#[test]
fn continue_on_error_goes_on_past_failed_reads_only() {
    assert!(!with_option("rw=read").continue_on_read_error);
    assert!(with_option("continue_on_error=read").continue_on_read_error);
    assert!(!with_option("continue_on_error=none").continue_on_read_error);
    assert!(!with_option("continue_on_error=verify").continue_on_read_error);
    for refused in ["write", "io", "all", "1"] {
        assert_bad_value(&format!("continue_on_error={refused}"), "continue_on_error");
    }
    let error = parse_job_file("[job]\ncontinue_on_error=all\n").unwrap_err();
    assert!(
        error.to_string().contains("use none, read or verify"),
        "{error}"
    );
}

/// `rate=` caps bytes and `rate_iops=` requests per second, per direction as fio spells it
/// (one value for all, `a,b` for reads and writes with trims inheriting the last value
/// unless a trailing comma ends the list, an empty or zero entry for none);
/// `rate_process` picks linear or Poisson gaps; `offset_increment` is a size.
#[test]
fn rate_options_cap_each_direction() {
    use RateLimit::{BytesPerSecond as B, IosPerSecond as I};
    assert_eq!(with_option("rate=1m").rate_limits, [Some(B(1 << 20)); 3]);
    assert_eq!(
        with_option("rate=,500k").rate_limits,
        [None, Some(B(500 << 10)), Some(B(500 << 10))]
    );
    assert_eq!(
        with_option("rate=500k,").rate_limits,
        [Some(B(500 << 10)), None, None]
    );
    assert_eq!(
        with_option("rate_iops=100,0").rate_limits,
        [Some(I(100)), None, None]
    );
    assert_eq!(
        one_job("[job]\nrate_iops=,200\nrate=1k,\n").rate_limits,
        [Some(B(1024)), Some(I(200)), Some(I(200))],
        "a byte rate for the direction rate_iops left alone"
    );
    assert_eq!(
        one_job("[global]\nrate=1m\n[job]\nrate=2m\n").rate_limits,
        [Some(B(2 << 20)); 3]
    );
    assert_eq!(JobSpec::default_named("j").rate_limits, [None; 3]);
    assert!(!with_option("rate_process=linear").rate_poisson);
    assert!(with_option("rate_process=Poisson").rate_poisson);
    assert_eq!(
        with_option("offset_increment=16m").offset_increment,
        SizeSpec::Bytes(16 << 20)
    );
    assert_eq!(
        with_option("offset_increment=5%").offset_increment,
        SizeSpec::Percent(5.0)
    );
    assert_eq!(
        with_option("offset_align=64k").offset_align_bytes,
        Some(64 << 10)
    );
    assert_eq!(with_option("offset_align=0").offset_align_bytes, None);
    assert_bad_value("offset_increment=150%", "offset_increment");
    assert_bad_value("rate=fast", "rate");
    assert_bad_value("rate_iops=1k", "rate_iops");
    assert_bad_value("rate_iops=-5", "rate_iops");
    assert_bad_value("rate_process=bursty", "rate_process");
    assert_bad_value("offset_increment=x", "offset_increment");
    match parse_job_file("[job]\nrate=1m\nrate_iops=100\n") {
        Err(WorkloadError::BadValue { option, reason, .. }) => {
            assert_eq!(option, "rate_iops");
            assert!(reason.contains("not both"), "{reason}");
        }
        other => panic!("expected BadValue, got {other:?}"),
    }
}

/// `sync=` makes every write FUA, as Linux sends an `O_SYNC` or `O_DSYNC` direct write to a
/// block device; fio's spellings of "no" leave them alone.
#[test]
fn sync_makes_every_write_fua() {
    for on in [
        "sync=1",
        "sync=sync",
        "sync=dsync",
        "sync=DSYNC",
        "sync=true",
        "sync",
    ] {
        assert!(with_option(on).fua_writes, "{on}");
    }
    for off in ["sync=0", "sync=none", "sync=false", "sync=off"] {
        assert!(!with_option(off).fua_writes, "{off}");
    }
    assert!(!with_option("").fua_writes);
    assert!(one_job("[global]\nsync=1\n[job]\nrw=write\n").fua_writes);
    assert_bad_value("sync=osync", "sync");
    assert_bad_value("sync=2", "sync");
}

/// `fsync=` and `fdatasync=` give the period of the job's flushes (0 none), `end_fsync` a
/// last one; a job inherits them from `[global]`, and two different periods are refused by
/// name, since both options are the same FLUSH at the block layer.
#[test]
fn fsync_options_give_the_flush_period() {
    assert_eq!(with_option("fsync=32").flush_every_writes, Some(32));
    assert_eq!(with_option("fdatasync=8").flush_every_writes, Some(8));
    assert_eq!(with_option("fsync=0").flush_every_writes, None);
    assert_eq!(with_option("").flush_every_writes, None);
    assert!(with_option("end_fsync=1").end_flush);
    assert!(!with_option("").end_flush);
    let same = one_job("[job]\nfsync=4\nfdatasync=4\n");
    assert_eq!(same.flush_every_writes, Some(4));
    let inherited = one_job("[global]\nfsync=16\nend_fsync\n[job]\nrw=write\n");
    assert_eq!(
        (inherited.flush_every_writes, inherited.end_flush),
        (Some(16), true)
    );
    // A job repeats the global option with another period: its own wins.
    let own = one_job("[global]\nfsync=16\n[job]\nfsync=2\n");
    assert_eq!(own.flush_every_writes, Some(2));
    match parse_job_file("[job]\nfsync=8\nfdatasync=16\n") {
        Err(WorkloadError::BadValue { option, reason, .. }) => {
            assert_eq!(option, "fdatasync");
            assert!(reason.contains("fsync"), "{reason}");
        }
        other => panic!("expected BadValue, got {other:?}"),
    }
    assert_bad_value("fsync=-1", "fsync");
    assert_bad_value("fsync", "fsync");
    assert_bad_value("end_fsync=maybe", "end_fsync");
}

/// `fsync_on_close` is the same end FLUSH as `end_fsync` on a block device (fio closes the
/// job's files when an iteration ends); turning one off leaves the other's on.
#[test]
fn fsync_on_close_is_the_end_flush() {
    assert!(with_option("fsync_on_close=1").end_flush);
    assert!(!with_option("fsync_on_close=0").end_flush);
    assert!(one_job("[job]\nend_fsync=1\nfsync_on_close=0\n").end_flush);
    assert!(one_job("[global]\nfsync_on_close\n[job]\nend_fsync=0\n").end_flush);
    assert!(!one_job("[job]\nfsync_on_close=1\nfsync_on_close=0\n").end_flush);
    assert_bad_value("fsync_on_close=maybe", "fsync_on_close");
}

#[test]
fn steady_state_options_parse_as_fio_reads_them() {
    let off = with_option("ss=iops:10%");
    assert!(!off.steady_state.enabled(), "no window, no detection");
    // `ss_dur` alone takes fio's default criterion, iops_slope:0.01%, every second.
    let default = with_option("ss_dur=30");
    assert_eq!(default.steady_state.duration_ns, 30_000_000_000);
    assert_eq!(default.steady_state.describe(), "iops_slope:0.010000%");
    assert_eq!(default.steady_state.window_samples(), 30);
    let job = one_job(
        "[job]\nsteadystate=BW_slope:10M\nsteadystate_duration=2s\n\
         steadystate_ramp_time=500ms\nsteadystate_check_interval=100ms\ngroup_reporting\n",
    );
    let ss = job.steady_state;
    assert_eq!(ss.metric, SteadyMetric::Bandwidth);
    assert!(ss.slope && !ss.limit_is_percent);
    assert_eq!(ss.limit, 10.0 * 1024.0 * 1024.0);
    assert_eq!((ss.ramp_ns, ss.interval_ns), (500_000_000, 100_000_000));
    assert_eq!(ss.window_samples(), 20);
    assert!(job.group_reporting);
    let iops = with_option("ss=iops:250").steady_state;
    assert_eq!(
        (iops.metric, iops.slope, iops.limit),
        (SteadyMetric::Iops, false, 250.0)
    );
    assert!(!iops.limit_is_percent);
}

#[test]
fn bad_steady_state_options_are_refused_by_name() {
    assert_bad_value("ss=iops", "ss");
    assert_bad_value("steadystate=lat:1ms", "steadystate");
    assert_bad_value("ss=iops:-1%", "ss");
    assert_bad_value("ss=iops:lots", "ss");
    assert_bad_value("ss_interval=0", "ss_interval");
    assert_bad_value("ss_interval=500us", "ss_interval");
    assert_bad_value("ss_dur=soon", "ss_dur");
    let refused = |text: &str, words: &str| match parse_job_file(text) {
        Err(WorkloadError::InvalidJob { reason, .. }) => {
            assert!(reason.contains(words), "{reason}")
        }
        other => panic!("{text}: expected InvalidJob, got {other:?}"),
    };
    refused("[j]\nss_dur=1500ms\n", "whole multiple");
    refused("[j]\nss_dur=1s\n", "at least two samples");
    // fio wants one setting for every job of a group, and lets another group differ.
    refused("[a]\nss_dur=5\n[b]\n", "differ from those of [a]");
    refused("[a]\nss_dur=5\n[b]\nss_dur=6\n", "same for every job");
    refused(
        "[a]\nss_dur=5\n[b]\nss_dur=5\ngroup_reporting\n",
        "group_reporting",
    );
    let jobs = parse_job_file("[a]\nss_dur=5\n[b]\nstonewall\n").unwrap();
    assert!(jobs[0].steady_state.enabled() && !jobs[1].steady_state.enabled());
}

#[test]
fn latency_target_options_parse_as_fio_reads_them() {
    let off = with_option("latency_window=5s").latency_target;
    assert!(!off.enabled());
    let job = one_job(
        "[job]\nlatency_target=10ms\nlatency_window=500000\nlatency_percentile=99.9\n\
         latency_run=1\nmax_latency=0,2ms\n",
    );
    let target = job.latency_target;
    assert_eq!(target.target_ns, 10_000_000);
    // Bare numbers are microseconds.
    assert_eq!(target.window_ns, 500_000_000);
    assert_eq!(target.percentile, 99.9);
    assert!(target.keep_searching && target.enabled());
    assert_eq!(job.max_latency_ns, [None, Some(2_000_000), Some(2_000_000)]);
    assert_eq!(
        with_option("latency_target=250").latency_target.target_ns,
        250_000
    );
    assert_bad_value("latency_percentile=0", "latency_percentile");
    assert_bad_value("latency_percentile=100.5", "latency_percentile");
    assert_bad_value("latency_target=fast", "latency_target");
    assert_bad_value("max_latency=1ms,2ms,3ms,4ms", "max_latency");
}

#[test]
fn minimum_rate_options_parse_per_direction() {
    let job = one_job("[job]\nrate_min=1m,2m\nrate_iops_min=0,0,50\nrate_cycle=250\n");
    let rates = job.min_rates;
    assert_eq!(
        rates[0],
        MinRate {
            bytes_per_s: 1 << 20,
            ios_per_s: 0
        }
    );
    assert_eq!(
        rates[1],
        MinRate {
            bytes_per_s: 2 << 20,
            ios_per_s: 0
        }
    );
    assert_eq!(
        rates[2],
        MinRate {
            bytes_per_s: 2 << 20,
            ios_per_s: 50
        }
    );
    assert_eq!(job.rate_cycle_ns, 250_000_000);
    assert_eq!(with_option("rw=write").rate_cycle_ns, 1_000_000_000);
    assert!(!with_option("rate_min=0").min_rates[1].is_set());
    assert_bad_value("rate_cycle=0", "rate_cycle");
    assert_bad_value("rate_iops_min=lots", "rate_iops_min");
}

#[test]
fn trim_then_write_modes_parse() {
    assert_eq!(with_option("rw=trimwrite").rw, RwMode::TrimWrite);
    assert_eq!(
        with_option("readwrite=randtrimwrite").rw,
        RwMode::RandTrimWrite
    );
    assert!(RwMode::RandTrimWrite.is_random() && !RwMode::TrimWrite.is_random());
    assert_eq!(RwMode::RandTrimWrite.fio_name(), "randtrimwrite");
}

#[test]
fn flow_options_parse() {
    let job = one_job("[job]\nflow=3\nflow_id=7\nflow_sleep=250\nflow_watermark=1024\n");
    assert_eq!(
        job.flow(),
        Some(Flow {
            id: 7,
            weight: 3,
            sleep_ns: 250_000
        })
    );
    assert_eq!(with_option("flow_id=7").flow(), None);
    assert_bad_value("flow=-1", "flow");
    assert_bad_value("flow_sleep=soon", "flow_sleep");
}
