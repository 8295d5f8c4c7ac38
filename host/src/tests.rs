use afa_nand::{Geometry, PayloadMode};
use afa_ssd::Opcode;
use afa_ssd::{Ssd, SsdConfig};
use afa_workload::fio::parse_job_file;
use afa_workload::trace::{read_trace, TraceFormat};

use super::*;

fn ssd(payload: PayloadMode) -> Ssd {
    let cfg = SsdConfig {
        geometry: Geometry {
            channels: 2,
            chips_per_channel: 2,
            dies_per_chip: 1,
            planes_per_die: 2,
            blocks_per_plane: 32,
            pages_per_block: 32,
            page_bytes: 4096,
            sector_bytes: 512,
            oob_bytes_per_page: 64,
        },
        payload,
        over_provisioning: 0.15,
        ..SsdConfig::default()
    };
    Ssd::new(cfg, 1).unwrap()
}

/// [`options`] with every issued request recorded.
fn recording_options() -> RunOptions {
    RunOptions {
        record_requests: true,
        ..options()
    }
}

fn options() -> RunOptions {
    RunOptions {
        seed: 7,
        timeline_interval_ns: 1_000_000,
        preconditioned_sectors: 0,
        background_work: true,
        show_progress: false,
        record_requests: false,
    }
}

const MIXED: &str = "
[global]
iodepth=8
size=2m
[w]
rw=randwrite
bsrange=512-8k
io_size=8m
[rw]
stonewall
rw=randrw
bs=4k
io_size=4m
[trim]
stonewall
rw=randtrim
bs=4k
io_size=256k
[r]
stonewall
rw=read
bs=64k
";

#[test]
fn jobs_run_and_every_read_is_checked() {
    for payload in [PayloadMode::Token, PayloadMode::Full] {
        let mut dev = ssd(payload);
        let jobs = parse_job_file(MIXED).unwrap();
        let out = run(&mut dev, &Workload::Jobs(jobs), &options()).unwrap();
        assert_eq!(out.mismatches, 0, "{:?}", out.first_mismatches);
        assert!(out.reads_checked > 0);
        assert!(out.measurements.write.ios > 0 && out.measurements.read.ios > 0);
        assert!(out.measurements.trim.ios > 0);
        dev.check_invariants();
    }
}

#[test]
fn same_seed_same_event_log() {
    let jobs = parse_job_file(MIXED).unwrap();
    let a = run(
        &mut ssd(PayloadMode::Token),
        &Workload::Jobs(jobs.clone()),
        &options(),
    )
    .unwrap();
    let b = run(
        &mut ssd(PayloadMode::Token),
        &Workload::Jobs(jobs.clone()),
        &options(),
    )
    .unwrap();
    assert_eq!(a.event_hash, b.event_hash);
    assert_eq!(a.sim_time_ns, b.sim_time_ns);
    assert_eq!(a.measurements, b.measurements);
    let mut other = options();
    other.seed = 8;
    let c = run(&mut ssd(PayloadMode::Token), &Workload::Jobs(jobs), &other).unwrap();
    assert_ne!(a.event_hash, c.event_hash);
}

#[test]
fn stonewall_groups_run_one_after_another() {
    let jobs =
        parse_job_file("[a]\nrw=write\nbs=4k\nsize=1m\n[b]\nstonewall\nrw=read\nbs=4k\nsize=1m\n")
            .unwrap();
    let out = run(
        &mut ssd(PayloadMode::Token),
        &Workload::Jobs(jobs),
        &options(),
    )
    .unwrap();
    // Reads come after every write, so they see written data, never zeroes.
    assert_eq!(out.mismatches, 0);
    assert_eq!(out.measurements.read.ios, 256);
    assert_eq!(out.measurements.write.ios, 256);
}

#[test]
fn runtime_limits_a_time_based_job() {
    let jobs =
        parse_job_file("[a]\nrw=randwrite\nbs=4k\niodepth=4\ntime_based\nruntime=20ms\n").unwrap();
    let out = run(
        &mut ssd(PayloadMode::None),
        &Workload::Jobs(jobs),
        &options(),
    )
    .unwrap();
    assert!(out.sim_time_ns >= 20_000_000);
    assert!(out.sim_time_ns < 25_000_000, "{}", out.sim_time_ns);
}

/// 4 MiB of 4 KiB sectors that keep no payload (so the run checks no read), for the test
/// devices that store nothing.
fn untracked_info() -> afa_ssd::DeviceInfo {
    afa_ssd::DeviceInfo {
        sector_bytes: 4096,
        capacity_sectors: 1024,
        payload_unit_bytes: 0,
        tag_bytes_per_sector: 0,
        max_queue_depth: 64,
        max_transfer_sectors: 64,
    }
}

/// A device that answers every command at the instant it arrives and stores nothing, as an
/// engine answers reads of chunks its map has never seen.
struct Instant;

impl BlockDevice for Instant {
    fn info(&self) -> afa_ssd::DeviceInfo {
        untracked_info()
    }
    fn submit(
        &mut self,
        now_ns: TimeNs,
        _cmd: &Command<'_>,
        _out: ReadBuffers<'_>,
    ) -> Result<afa_ssd::Completion, DeviceError> {
        Ok(afa_ssd::Completion {
            done_ns: now_ns,
            gc_active: false,
        })
    }
    fn background(&mut self, _now_ns: TimeNs) -> Option<TimeNs> {
        None
    }
}

/// A job whose requests the device could not take in one command is refused before the run
/// by name, with the sizes; before, the run stopped at the first such request it drew. The
/// limit is the longest request a job can draw: a zero-weight split entry and a range that
/// never reaches its maximum do not count, and trims are not limited.
#[test]
fn a_job_with_requests_beyond_the_devices_transfer_limit_is_refused_before_the_run() {
    // `Instant` takes at most 64 sectors of 4 KiB, 256 KiB.
    for (job, refused) in [
        ("rw=randrw\nbs=4k,512k", true),
        ("rw=randread\nbs=260k", true),
        ("rw=randwrite\nbssplit=4k/100:1m/0", false),
        ("rw=randwrite\nbsrange=128k-300k", false),
        ("rw=randwrite\nbsrange=4k-300k", true),
        ("rw=randtrim\nbs=1m", false),
        ("rw=randwrite\nbs=256k", false),
    ] {
        let text = format!("[big]\n{job}\nnumber_ios=4\n");
        let jobs = parse_job_file(&text).unwrap();
        let result = run(&mut Instant, &Workload::Jobs(jobs), &options());
        match (refused, result) {
            (true, Err(e)) => {
                let text = e.to_string();
                assert!(text.contains("big"), "{job}: {text}");
                assert!(
                    text.contains("maximum transfer of 64 sectors"),
                    "{job}: {text}"
                );
            }
            (false, Ok(_)) => {}
            (refused, other) => panic!("{job}: refused {refused}, got {other:?}"),
        }
    }
}

/// A replayed record the device could not take in one command is refused before the run,
/// naming the record; before, the run simulated everything up to it and then failed there
/// (soak seed 12727: a blkparse trace's 128 KiB write on a device of 64 KiB transfers).
/// Records the device takes run, trims are not limited, and a job's read_iolog is checked
/// the same way.
#[test]
fn a_replay_with_records_beyond_the_devices_transfer_limit_is_refused_before_the_run() {
    // `Instant` takes at most 64 sectors of 4 KiB, 256 KiB.
    let text = "\
128166372003061629,hm,1,Write,4096,8192,100
128166372003071629,hm,1,Write,0,262144,100
128166372003081629,hm,1,Read,4096,266240,100
";
    let records = read_trace(text.as_bytes(), TraceFormat::MsrCsv, "inline").unwrap();
    let closed = TraceReplay::Closed { iodepth: 4 };
    let whole = Workload::Trace {
        records: records.clone(),
        replay: closed,
    };
    let text = run(&mut Instant, &whole, &options())
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("the trace's record 3 (a Read of 266240 bytes at byte 4096")
            && text.contains("maximum transfer of 64 sectors (262144 bytes)"),
        "{text}"
    );
    let fitting = Workload::Trace {
        records: records[..2].to_vec(),
        replay: closed,
    };
    assert_eq!(run(&mut Instant, &fitting, &options()).unwrap().requests, 2);
    let mut trim = records[2];
    trim.op = IoOp::Trim;
    let trims = Workload::Trace {
        records: vec![trim],
        replay: closed,
    };
    assert_eq!(run(&mut Instant, &trims, &options()).unwrap().requests, 1);

    let mut jobs = parse_job_file("[replay]\nread_iolog=log\n").unwrap();
    jobs[0].iolog_records = Some(std::sync::Arc::new(records));
    let text = run(&mut Instant, &Workload::Jobs(jobs), &options())
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("job [replay]: read_iolog's record 3"),
        "{text}"
    );
}

/// A time_based job whose requests take no simulated time would repeat them forever at one
/// instant; the run stops with an error that names the job instead of hanging.
#[test]
fn a_time_based_job_whose_requests_take_no_time_is_refused_not_run_forever() {
    let jobs = parse_job_file("[zero]\nrw=randread\nbs=4k\ntime_based\nruntime=20ms\n").unwrap();
    let err = run(&mut Instant, &Workload::Jobs(jobs), &options()).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, RunError::NoProgress { ref job, at_ns: 0, .. } if job == "zero"),
        "{text}"
    );
    assert!(
        text.contains("time_based runtime would never end"),
        "{text}"
    );
    // The same requests, sized instead of timed (the whole device once), end.
    let jobs = parse_job_file("[zero]\nrw=randread\nbs=4k\n").unwrap();
    let out = run(&mut Instant, &Workload::Jobs(jobs), &options()).unwrap();
    assert_eq!(out.measurements.read.ios, 1024);
}

#[test]
fn time_based_without_runtime_is_refused() {
    let jobs = parse_job_file("[a]\nrw=randwrite\ntime_based\n").unwrap();
    let err = run(
        &mut ssd(PayloadMode::None),
        &Workload::Jobs(jobs),
        &options(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("runtime"), "{err}");
}

#[test]
fn think_time_spaces_requests() {
    let jobs = parse_job_file("[a]\nrw=randread\nbs=4k\nnumber_ios=10\nthinktime=1ms\n").unwrap();
    let out = run(
        &mut ssd(PayloadMode::Token),
        &Workload::Jobs(jobs),
        &options(),
    )
    .unwrap();
    assert!(out.sim_time_ns >= 9_000_000, "{}", out.sim_time_ns);
}

/// The simulated times at which `job_text`'s requests were issued, in order.
fn issue_times_ns(job_text: &str) -> Vec<u64> {
    let jobs = parse_job_file(job_text).unwrap();
    let recording = recording_options();
    let out = run(
        &mut ssd(PayloadMode::Token),
        &Workload::Jobs(jobs),
        &recording,
    )
    .unwrap();
    assert_eq!(out.mismatches, 0);
    out.issued.iter().map(|r| r.timestamp_ns).collect()
}

/// fio pauses after every `thinktime_blocks` completed requests (one by default), and
/// first waits for every request in flight (`io_u_quiesce`): a job with a deep queue
/// fills it once, and after its first completion runs one request at a time, each issued
/// a whole think time after the previous one completed. (Each free slot used to think on
/// its own, so eight slots issued eight times as often as fio does.)
#[test]
fn think_time_with_a_deep_queue_runs_one_request_at_a_time_as_fio_does() {
    let times =
        issue_times_ns("[a]\nrw=randwrite\nbs=4k\niodepth=8\nnumber_ios=20\nthinktime=1ms\n");
    assert_eq!(times.len(), 20);
    assert!(times[..8].iter().all(|&t| t == 0), "{times:?}");
    for pair in times[7..].windows(2) {
        assert!(pair[1] >= pair[0] + 1_000_000, "{times:?}");
    }
}

/// `thinktime_blocks_type=issue` counts issued requests: a job of depth 4 that pauses every
/// 4 issues sends bursts of 4 at one instant, a pause apart.
#[test]
fn think_time_counted_in_issued_requests_sends_bursts() {
    let times = issue_times_ns(
        "[a]\nrw=randread\nbs=4k\niodepth=4\nnumber_ios=16\nthinktime=2ms\n\
         thinktime_blocks=4\nthinktime_blocks_type=issue\n",
    );
    assert_eq!(times.len(), 16);
    for burst in times.chunks(4) {
        assert!(burst.iter().all(|&t| t == burst[0]), "{times:?}");
    }
    for pair in times.chunks(4).collect::<Vec<_>>().windows(2) {
        assert!(pair[1][0] >= pair[0][0] + 2_000_000, "{times:?}");
    }
}

/// `thinktime_iotime` without `thinktime_blocks`: the job runs at full depth for the given
/// time, then pauses, and only time brings a pause.
#[test]
fn think_time_by_io_time_alternates_runs_and_pauses() {
    let times = issue_times_ns(
        "[a]\nrw=randread\nbs=4k\niodepth=4\ntime_based\nruntime=40ms\nthinktime=3ms\n\
         thinktime_iotime=5ms\n",
    );
    // The bursts between pauses (gaps of at least the think time).
    let mut bursts = vec![(times[0], times[0])];
    for pair in times.windows(2) {
        if pair[1] >= pair[0] + 3_000_000 {
            bursts.push((pair[1], pair[1]));
        } else {
            bursts.last_mut().unwrap().1 = pair[1];
        }
    }
    // Each cycle takes at least 5 + 3 ms, so a 40 ms run holds at most five of them.
    assert!((3..=5).contains(&bursts.len()), "{bursts:?}");
    for (start, end) in &bursts[..bursts.len() - 1] {
        assert!(end - start >= 4_500_000, "{bursts:?}");
    }
    // Inside a burst the queue is kept full: many requests, not one per pause.
    assert!(times.len() > 10 * bursts.len(), "{} requests", times.len());
}

/// A pause never outlasts the job's runtime (fio sleeps at most what is left of it).
#[test]
fn a_think_time_pause_ends_with_the_runtime() {
    let out = run_job_text("[a]\nrw=randread\nbs=4k\ntime_based\nruntime=10ms\nthinktime=1s\n");
    assert!(out.requests >= 1);
    assert!(out.sim_time_ns < 20_000_000, "{}", out.sim_time_ns);
}

/// Under a rate cap a job catches up after each pause by default, so pauses cost it little;
/// with `rate_ignore_thinktime` its schedule moves on by each pause and the pauses add up.
#[test]
fn rate_ignore_thinktime_moves_the_schedule_on_by_each_pause() {
    let job = "[a]\nrw=randread\nbs=4k\nnumber_ios=40\nrate_iops=2000\nthinktime=4ms\n\
               thinktime_blocks=10\n";
    let catching_up = run_job_text(job).sim_time_ns;
    let ignoring = run_job_text(&format!("{job}rate_ignore_thinktime=1\n")).sim_time_ns;
    // 40 requests at 2,000 per second take 20 ms; three pauses inside the run add 12 ms.
    assert!(catching_up < 27_000_000, "{catching_up}");
    assert!(
        ignoring >= catching_up + 10_000_000,
        "{ignoring} vs {catching_up}"
    );
}

#[test]
fn traces_replay_timed_and_closed_loop() {
    let text = "\
128166372003061629,hm,1,Write,4096,8192,100
128166372003071629,hm,1,Read,4096,4096,100
128166372013061629,hm,1,Write,999999999999,512,100
128166372013061630,hm,1,Read,999999999999,512,100
";
    let records = read_trace(text.as_bytes(), TraceFormat::MsrCsv, "inline").unwrap();
    for replay in [
        TraceReplay::Timed { time_scale: 1.0 },
        TraceReplay::Closed { iodepth: 4 },
    ] {
        let w = Workload::Trace {
            records: records.clone(),
            replay,
        };
        let out = run(&mut ssd(PayloadMode::Token), &w, &options()).unwrap();
        assert_eq!(out.requests, 4);
        assert_eq!(out.mismatches, 0);
        if let TraceReplay::Timed { .. } = replay {
            // The third record is one second after the first.
            assert!(out.sim_time_ns >= 1_000_000_000);
        }
    }
}

#[test]
fn requests_beyond_the_device_are_an_error_not_a_panic() {
    let jobs = parse_job_file("[a]\nrw=write\nbs=4k\noffset=1g\n").unwrap();
    let err = run(
        &mut ssd(PayloadMode::Token),
        &Workload::Jobs(jobs),
        &options(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("offset"), "{err}");
}

/// A `size=` past the device's end is cut there, as fio does on a block device, but not
/// silently: the run names the job, the size asked for and the device's size.
#[test]
fn a_size_past_the_device_end_is_cut_and_reported() {
    let mut dev = ssd(PayloadMode::Token);
    let capacity_bytes = dev.info().capacity_sectors * 512;
    let jobs = parse_job_file("[w]\nrw=write\nbs=64k\noffset=1m\nsize=1g\n").unwrap();
    let out = run(&mut dev, &Workload::Jobs(jobs), &options()).unwrap();
    assert_eq!(out.notes.len(), 1, "{:?}", out.notes);
    let note = &out.notes[0];
    for part in [
        "job \"w\"".to_string(),
        "size=1073741824 bytes from offset 1048576".to_string(),
        format!("{capacity_bytes}-byte device"),
        format!("cut to the {} bytes", capacity_bytes - (1 << 20)),
        "io_size= defaults".to_string(),
    ] {
        assert!(note.contains(&part), "{part:?} not in {note}");
    }
    // The job wrote its cut region once, as fio would.
    assert_eq!(
        out.measurements.write.bytes,
        capacity_bytes - (1 << 20),
        "{note}"
    );

    // One note for a job however many of its clones are cut.
    let out = run_job_text(
        "[c]\nrw=randwrite\nbs=4k\nsize=1g\nnumjobs=3\nio_size=64k\n[fits]\nrw=read\nbs=4k\nsize=1m\n",
    );
    assert_eq!(out.notes.len(), 1, "{:?}", out.notes);
    assert!(
        out.notes[0].contains("job \"c\" clone 0 (3 of its 3 clones)"),
        "{:?}",
        out.notes
    );
    assert!(
        !out.notes[0].contains("io_size= defaults"),
        "{:?}",
        out.notes
    );

    // A job that fits is not noted.
    assert!(run_job_text("[w]\nrw=write\nbs=4k\nsize=1m\n")
        .notes
        .is_empty());
}

/// A prepared run gives its notes before it starts, for a caller to show its user then, and
/// the outcome holds the same notes.
#[test]
fn a_prepared_run_gives_its_notes_before_it_starts() {
    let mut dev = ssd(PayloadMode::Token);
    let jobs = parse_job_file("[w]\nrw=write\nbs=64k\nsize=1g\nio_size=1m\n").unwrap();
    let prepared = PreparedRun::new(&mut dev, &Workload::Jobs(jobs), &options()).unwrap();
    let notes = prepared.notes().to_vec();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].starts_with("job \"w\": size=1073741824 bytes"),
        "{notes:?}"
    );
    let shown = format!("{prepared:?}");
    assert!(shown.contains("size=1073741824 bytes"), "{shown}");
    let out = prepared.run().unwrap();
    assert_eq!(out.notes, notes);
    assert_eq!(out.measurements.write.bytes, 1 << 20);
}

/// fio's `continue_on_error=read`: a read the device fails is counted and the job goes on;
/// without it the run ends with the device's error.
#[test]
fn continue_on_error_counts_failed_reads_and_goes_on() {
    let faulty = || {
        let mut dev = ssd(PayloadMode::Token);
        let mut cfg = dev.config().clone();
        cfg.faults.read_fail_probability = 0.05;
        dev = Ssd::new(cfg, 1).unwrap();
        dev
    };
    let job = |extra: &str| {
        parse_job_file(&format!(
            "[w]\nrw=write\nbs=4k\nsize=1m\n[r]\nstonewall\nrw=randread\nbs=4k\nsize=1m\n\
             io_size=2m\niodepth=4\n{extra}\n"
        ))
        .unwrap()
    };
    let mut dev = faulty();
    let out = run(
        &mut dev,
        &Workload::Jobs(job("continue_on_error=read")),
        &options(),
    )
    .unwrap();
    let read = &out.measurements.read;
    assert!(read.errors > 0, "{read:?}");
    assert_eq!(read.errors, dev.stats().uncorrectable_reads);
    assert_eq!(
        read.ios + read.errors,
        512,
        "every request is a read or an error"
    );
    assert_eq!(out.mismatches, 0);
    assert_eq!(out.reads_checked, read.ios * 8);
    let mut dev = faulty();
    let err = run(&mut dev, &Workload::Jobs(job("")), &options()).unwrap_err();
    assert!(err.to_string().contains("could not be read"), "{err}");
}

/// A device that learns when a command completes only by running (the shape of OX's
/// controller): a command takes `latency_ns` plus 1 µs per sector, several run at once, and
/// a write changes the medium only when it completes, so a read that overlaps a write may
/// return either version. `stall` never completes anything.
struct SlowQueue {
    sectors: Vec<u64>,
    now_ns: TimeNs,
    latency_ns: u64,
    running: std::collections::BTreeMap<(TimeNs, u64), (Opcode, u64, Vec<u64>)>,
    most_in_flight: usize,
    /// Writes started with force unit access.
    fua_writes: u64,
    stall: bool,
    /// Reads return every token with its lowest bit flipped.
    corrupt_reads: bool,
}

impl SlowQueue {
    fn new(capacity: u64) -> Self {
        SlowQueue {
            sectors: vec![0; capacity as usize],
            now_ns: 0,
            latency_ns: 50_000,
            running: std::collections::BTreeMap::new(),
            most_in_flight: 0,
            fua_writes: 0,
            stall: false,
            corrupt_reads: false,
        }
    }
}

impl BlockDevice for SlowQueue {
    fn info(&self) -> afa_ssd::DeviceInfo {
        afa_ssd::DeviceInfo {
            sector_bytes: 4096,
            capacity_sectors: self.sectors.len() as u64,
            payload_unit_bytes: 8,
            tag_bytes_per_sector: 0,
            max_queue_depth: 64,
            max_transfer_sectors: 64,
        }
    }
    fn submit(
        &mut self,
        _now_ns: TimeNs,
        _cmd: &Command<'_>,
        _out: ReadBuffers<'_>,
    ) -> Result<afa_ssd::Completion, DeviceError> {
        panic!("a queued device is driven through its queued interface");
    }
    fn background(&mut self, _now_ns: TimeNs) -> Option<TimeNs> {
        None
    }
    fn queued(&mut self) -> Option<&mut dyn afa_ssd::QueuedDevice> {
        Some(self)
    }
}

impl afa_ssd::QueuedDevice for SlowQueue {
    fn start(&mut self, now_ns: TimeNs, cmd: &Command<'_>, tag: u64) -> Result<(), DeviceError> {
        assert!(
            now_ns >= self.now_ns,
            "started at {now_ns} in the device's past {}",
            self.now_ns
        );
        let tokens = cmd
            .data
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        self.fua_writes += u64::from(cmd.opcode == Opcode::Write && cmd.flags.fua);
        let done = now_ns + self.latency_ns + cmd.sectors as u64 * 1_000 + tag % 7 * 3_000;
        self.running
            .insert((done, tag), (cmd.opcode, cmd.lba, tokens));
        self.most_in_flight = self.most_in_flight.max(self.running.len());
        Ok(())
    }
    fn next_event_ns(&self) -> Option<TimeNs> {
        if self.stall {
            return None;
        }
        self.running.keys().next().map(|&(t, _)| t)
    }
    fn advance_to(&mut self, t_ns: TimeNs) -> Vec<afa_ssd::QueuedCompletion> {
        self.now_ns = self.now_ns.max(t_ns);
        let mut done = Vec::new();
        while let Some(entry) = self.running.first_entry() {
            if entry.key().0 > t_ns {
                break;
            }
            let ((t, tag), (op, lba, tokens)) = entry.remove_entry();
            let sectors = |n: usize| lba as usize..lba as usize + n;
            let data = match op {
                Opcode::Write => {
                    self.sectors[sectors(tokens.len())].copy_from_slice(&tokens);
                    Vec::new()
                }
                // A read of this toy device always covers 4 KiB per request sector: the
                // job below reads 4 KiB at a time.
                Opcode::Read => self.sectors[sectors(1)]
                    .iter()
                    .flat_map(|&t| (t ^ u64::from(self.corrupt_reads)).to_le_bytes())
                    .collect(),
                Opcode::Trim | Opcode::Flush => Vec::new(),
            };
            done.push(afa_ssd::QueuedCompletion {
                tag,
                done_ns: t,
                result: Ok(data),
            });
        }
        done
    }
}

const QUEUED_JOB: &str = "
[global]
size=1m
iodepth=16
[fill]
rw=write
bs=16k
[mixed]
stonewall
rw=randrw
bs=4k
io_size=2m
";

/// A queued device gets the job's whole queue depth, every read is checked against the
/// version its sectors held when it started or a write that completed since, and a seed
/// gives the same run.
#[test]
fn a_queued_device_keeps_the_queue_full_and_every_read_is_checked() {
    let jobs = parse_job_file(QUEUED_JOB).unwrap();
    let mut dev = SlowQueue::new(256);
    let a = run(&mut dev, &Workload::Jobs(jobs.clone()), &options()).unwrap();
    assert_eq!(a.mismatches, 0, "{:?}", a.first_mismatches);
    assert!(a.reads_checked > 100, "{}", a.reads_checked);
    assert_eq!(dev.most_in_flight, 16);
    assert!(dev.running.is_empty());
    let b = run(
        &mut SlowQueue::new(256),
        &Workload::Jobs(jobs.clone()),
        &options(),
    )
    .unwrap();
    assert_eq!(
        (a.event_hash, a.sim_time_ns, a.measurements),
        (b.event_hash, b.sim_time_ns, b.measurements)
    );
    // A device that returns the wrong data is caught.
    let mut liar = SlowQueue::new(256);
    liar.corrupt_reads = true;
    let caught = run(&mut liar, &Workload::Jobs(jobs), &options()).unwrap();
    assert!(caught.mismatches > 0);
}

/// A queued device that stops completing what it was given ends the run with an error
/// naming the commands left, instead of ending as if the job were done.
#[test]
fn a_queued_device_that_never_completes_fails_the_run() {
    let mut dev = SlowQueue::new(256);
    dev.stall = true;
    let jobs = parse_job_file("[w]\nrw=write\nbs=4k\nsize=64k\niodepth=4\n").unwrap();
    let err = run(&mut dev, &Workload::Jobs(jobs), &options()).unwrap_err();
    assert!(matches!(err, RunError::Stalled { outstanding: 4 }), "{err}");
}

/// Behind the host CPU model a queued device still gets the job's whole queue depth, every
/// read is still checked, and the host's threads bound the throughput: with a submission
/// path of 40 µs, one thread takes at least 40 µs per request and two threads finish the
/// same job in about half the time, while the device, which takes 50 µs per command with
/// 16 in flight, would allow far more.
#[test]
fn a_queued_device_behind_the_host_cpu_model_keeps_its_queue_and_pays_the_threads() {
    let jobs = parse_job_file(QUEUED_JOB).unwrap();
    let run_with = |threads: u32| {
        let config = CpuConfig {
            threads,
            request_ns: Some(40_000),
            ..CpuConfig::default()
        };
        let mut dev = SlowQueue::new(256);
        let mut front = CpuFront::new(&mut dev, &config).unwrap();
        let outcome = run(&mut front, &Workload::Jobs(jobs.clone()), &options()).unwrap();
        let report = front.report(outcome.sim_time_ns);
        assert!(dev.running.is_empty());
        (outcome, report, dev.most_in_flight)
    };
    let (one, one_cpu, one_depth) = run_with(1);
    assert_eq!(one.mismatches, 0, "{:?}", one.first_mismatches);
    assert!(one.reads_checked > 100, "{}", one.reads_checked);
    assert!(
        one_depth > 1,
        "one thread still overlaps device time: {one_depth}"
    );
    assert!(
        one.sim_time_ns >= one.requests * 40_000,
        "{} requests in {} ns",
        one.requests,
        one.sim_time_ns
    );
    let busy = one_cpu.threads[0].busy;
    assert_eq!(busy.stack_ns % 1_000, 0);
    assert!(busy.stack_ns >= one.requests * 40_000, "{busy:?}");
    let (two, _, two_depth) = run_with(2);
    assert_eq!(two.mismatches, 0, "{:?}", two.first_mismatches);
    assert!(two_depth >= one_depth, "{two_depth} < {one_depth}");
    let speedup = one.sim_time_ns as f64 / two.sim_time_ns as f64;
    assert!((1.7..2.3).contains(&speedup), "two threads: {speedup}×");
    // A seed gives the same run behind the model too.
    let (again, _, _) = run_with(2);
    assert_eq!(
        (again.event_hash, again.sim_time_ns),
        (two.event_hash, two.sim_time_ns)
    );
}

/// The model offers the queued interface exactly when the device behind it has one.
#[test]
fn the_host_cpu_model_passes_the_queued_interface_on() {
    let mut dev = SlowQueue::new(256);
    let mut front = CpuFront::new(&mut dev, &CpuConfig::default()).unwrap();
    assert!(front.queued().is_some());
    let mut ssd = ssd(PayloadMode::Token);
    let mut plain = CpuFront::new(&mut ssd, &CpuConfig::default()).unwrap();
    assert!(plain.queued().is_none());
}

/// A job's `fsync=N` reaches the device as a FLUSH after every Nth write, counted under
/// `flush` in the measurements, on a device that answers at once and on a queued one that
/// keeps the job's queue depth; every read is still checked.
#[test]
fn a_jobs_fsync_sends_a_flush_after_every_nth_write() {
    let text = "[global]\nsize=1m\nfsync=8\nend_fsync\n[w]\nrw=randwrite\nbs=4k\nnumber_ios=100\n\
                [r]\nstonewall\nrw=randread\nbs=4k\nnumber_ios=50\n";
    let jobs = parse_job_file(text).unwrap();
    let mut ssd = ssd(PayloadMode::Token);
    let direct = run(&mut ssd, &Workload::Jobs(jobs.clone()), &options()).unwrap();
    // 100 writes: 12 periodic flushes and one at the end for the last 4 writes.
    assert_eq!(direct.measurements.flush.ios, 13);
    assert_eq!(direct.measurements.write.ios, 100);
    assert_eq!(direct.mismatches, 0);
    let deep = parse_job_file(&text.replace("[global]\n", "[global]\niodepth=16\n")).unwrap();
    let mut dev = SlowQueue::new(256);
    let queued = run(&mut dev, &Workload::Jobs(deep), &options()).unwrap();
    assert_eq!(queued.measurements.flush.ios, 13);
    assert_eq!(queued.mismatches, 0);
    assert!(queued.reads_checked >= 50);
    assert_eq!(dev.most_in_flight, 16);
}

/// A job's `sync=1` reaches the device as FUA writes, on the queued interface and on a device
/// that answers at once: an SSD with a DRAM write buffer then answers each write only once it
/// is on flash, so writes take longer than the buffer would make them. The recorded requests
/// keep the flag.
#[test]
fn a_sync_job_sends_every_write_with_force_unit_access() {
    let text = "[w]\nsize=1m\nrw=randwrite\nbs=4k\nnumber_ios=200\niodepth=8\n";
    let synced = text.replace("[w]\n", "[w]\nsync=1\n");
    let buffered = || {
        let mut config = ssd(PayloadMode::Token).config().clone();
        config.write_buffer.capacity_bytes = 256 * 1024;
        Ssd::new(config, 1).unwrap()
    };
    let recording = recording_options();
    let mean_write_us = |job: &str| {
        let jobs = parse_job_file(job).unwrap();
        let out = run(&mut buffered(), &Workload::Jobs(jobs), &recording).unwrap();
        assert_eq!(out.mismatches, 0);
        assert_eq!(out.measurements.write.ios, 200);
        let fua = out.issued.iter().filter(|r| r.fua).count();
        (out.measurements.write.latency_us.mean, fua)
    };
    let (plain_us, plain_fua) = mean_write_us(text);
    let (fua_us, fua) = mean_write_us(&synced);
    assert_eq!((plain_fua, fua), (0, 200));
    assert!(
        fua_us > 2.0 * plain_us,
        "FUA {fua_us} µs, buffered {plain_us} µs"
    );

    let mut dev = SlowQueue::new(256);
    let out = run(
        &mut dev,
        &Workload::Jobs(parse_job_file(&synced).unwrap()),
        &options(),
    );
    assert_eq!(out.unwrap().mismatches, 0);
    assert_eq!(dev.fua_writes, 200);
}

/// Runs a job file on the test SSD and checks that every read was right.
fn run_job_text(text: &str) -> RunOutcome {
    let jobs = parse_job_file(text).unwrap();
    let out = run(
        &mut ssd(PayloadMode::Token),
        &Workload::Jobs(jobs),
        &options(),
    )
    .unwrap();
    assert_eq!(out.mismatches, 0, "{:?}", out.first_mismatches);
    out
}

/// `thinktime` and `rate` together: a think-time event cleared the flag of a rate wake-up
/// still queued, so the cap queued another, and every wake-up that found its request not yet
/// due queued one more. The queue grew with every request (a configuration soak's run
/// crawled at a thousand requests per host second). Each request now costs the host a
/// completion, a think-time event and at most one wake-up.
#[test]
fn think_time_under_a_rate_cap_costs_a_few_host_events_per_request() {
    let out = run_job_text(
        "[j]\nsize=1m\nrw=randwrite\nbs=4k\niodepth=8\nio_size=4m\nthinktime=50\nrate=8000k\n",
    );
    assert_eq!(out.requests, 1024);
    assert_eq!(out.measurements.write.ios, 1024);
    assert!(
        out.host_events <= 3 * out.requests + 16,
        "{} host events for {} requests",
        out.host_events,
        out.requests
    );
}

/// `rate_iops` holds a job to its rate when the device could go faster: equal gaps give the
/// rate exactly, Poisson gaps on average; a cap on reads leaves a mixed job's writes alone;
/// a cap above what the device can do changes little, since a job behind its schedule
/// issues at once (as fio's does); and a seed gives the same run.
#[test]
fn a_rate_cap_holds_the_job_to_its_rate() {
    let run_job = |extra: &str| {
        run_job_text(&format!(
            "[j]\nsize=1m\nrw=randwrite\nbs=4k\niodepth=8\ntime_based\nruntime=500ms\n{extra}"
        ))
    };
    let writes = |extra: &str| run_job(extra).measurements.write.ios as i64;
    assert!((writes("rate_iops=2000\n") - 1000).abs() <= 2);
    assert!(
        (writes("rate=8000k\n") - 1000).abs() <= 2,
        "2,000 writes of 4 KiB a second"
    );
    let poisson = writes("rate_iops=2000\nrate_process=poisson\n");
    assert!((poisson - 1000).abs() <= 100, "{poisson}");
    assert_ne!(poisson, 1000);
    let free = writes("");
    assert!(free > 3000, "{free}");
    let above = writes("rate_iops=1000000\n");
    assert!(
        (above - free).abs() * 50 <= free,
        "{above} against {free} uncapped"
    );
    let mixed = run_job("rw=randrw\nrate_iops=500,\n");
    let (reads, mixed_writes) = (mixed.measurements.read.ios, mixed.measurements.write.ios);
    assert!(reads.abs_diff(250) <= 2, "{reads} reads");
    assert!(mixed_writes > 1000, "{mixed_writes} writes");
    // fio counts `rate_iops` at the smallest block size (a byte rate of 2,000 × 4 KiB a
    // second): with lengths of 4, 8 and 12 KiB, 8 KiB on average, half as many writes.
    let ranged = run_job("bsrange=4k-12k\nblockalign=4k\nrate_iops=2000\n");
    let w = &ranged.measurements.write;
    assert!(w.ios.abs_diff(500) <= 20, "{} writes", w.ios);
    assert!(
        w.bytes.abs_diff(4_096_000) <= 12 * 1024,
        "{} bytes",
        w.bytes
    );
    // A cap whose next request would come after the runtime ends the job at the runtime.
    let sparse = run_job("rate_iops=3\n");
    assert_eq!(sparse.measurements.write.ios, 2);
    assert_eq!(sparse.sim_time_ns, 500_000_000);
    let again = run_job("rate_iops=2000\nrate_process=poisson\n");
    assert_eq!(
        again.event_hash,
        run_job("rate_iops=2000\nrate_process=poisson\n").event_hash
    );
}

/// `end_fsync` also ends a job that its runtime stops with a FLUSH, once, after its last
/// write; a time-based job without it, or one that wrote nothing, ends without one.
#[test]
fn end_fsync_flushes_a_job_its_runtime_stops() {
    let flushes = |job: &str| {
        let out = run_job_text(job);
        (out.measurements.flush.ios, out.measurements.write.ios)
    };
    let timed = "[w]\nsize=1m\nrw=randwrite\nbs=4k\niodepth=16\ntime_based\nruntime=100ms\n";
    assert_eq!(flushes(timed).0, 0);
    assert_eq!(flushes(&format!("{timed}end_fsync\n")).0, 1);
    // With a period as well, the last writes get their flush whether or not a period ended.
    for period in [7u64, 8] {
        let (f, writes) = flushes(&format!("{timed}end_fsync\nfsync={period}\n"));
        assert!(writes > 10 * period, "{writes} writes");
        assert_eq!(
            f,
            writes.div_ceil(period),
            "fsync={period}, {writes} writes"
        );
    }
    let reads = timed.replace("randwrite", "randread");
    assert_eq!(flushes(&format!("{reads}end_fsync\n")).0, 0);
}

/// Recording the requests changes nothing of the run, and keeps one record per request
/// issued, in issue order.
#[test]
fn recording_the_requests_keeps_each_one_and_changes_nothing() {
    let jobs = parse_job_file(MIXED).unwrap();
    let plain = run(
        &mut ssd(PayloadMode::Token),
        &Workload::Jobs(jobs.clone()),
        &options(),
    )
    .unwrap();
    assert!(plain.issued.is_empty());
    let recording = recording_options();
    let recorded = run(
        &mut ssd(PayloadMode::Token),
        &Workload::Jobs(jobs),
        &recording,
    )
    .unwrap();
    assert_eq!(
        (recorded.event_hash, recorded.sim_time_ns),
        (plain.event_hash, plain.sim_time_ns)
    );
    assert_eq!(recorded.issued.len() as u64, recorded.requests);
    assert!(recorded
        .issued
        .windows(2)
        .all(|w| w[0].timestamp_ns <= w[1].timestamp_ns));
    let bytes = |op: IoOp| -> u64 {
        recorded
            .issued
            .iter()
            .filter(|r| r.op == op)
            .map(|r| r.len_bytes)
            .sum()
    };
    assert_eq!(bytes(IoOp::Write), recorded.measurements.write.bytes);
    assert_eq!(bytes(IoOp::Read), recorded.measurements.read.bytes);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(afa_sim::proptest_cases(24)))]

    /// Any number of threads, submission cost and queue depth behind the host CPU model, on
    /// a queued device that completes out of order, with flushes mixed in: every read is
    /// checked and right, every request completes, the device never sees more than the job's
    /// queue depth, and the same inputs give the same run.
    #[test]
    fn the_host_cpu_model_over_a_queued_device_loses_nothing(
        threads in 1u32..5,
        request_ns in 0u64..60_000,
        iodepth in 1u32..25,
        fsync in 0u32..12,
        seed in 0u64..1_000,
    ) {
        let text = format!(
            "[global]\nsize=1m\niodepth={iodepth}\nfsync={fsync}\n\
             [mixed]\nrw=randrw\nbs=4k\nnumber_ios=400\nio_size=100m\n"
        );
        let jobs = parse_job_file(&text).unwrap();
        let config = CpuConfig { threads, request_ns: Some(request_ns), ..CpuConfig::default() };
        let once = || {
            let mut dev = SlowQueue::new(256);
            let mut front = CpuFront::new(&mut dev, &config).unwrap();
            let options = RunOptions { seed, ..options() };
            let out = run(&mut front, &Workload::Jobs(jobs.clone()), &options).unwrap();
            assert!(dev.running.is_empty());
            (out, dev.most_in_flight)
        };
        let (a, depth) = once();
        proptest::prop_assert_eq!(a.mismatches, 0, "{:?}", a.first_mismatches);
        proptest::prop_assert!(depth <= iodepth as usize);
        let writes = a.measurements.write.ios;
        // A FLUSH after every `fsync` writes, issued before the next request as fio
        // issues it: one due after the job's last request never goes out.
        let most = if fsync == 0 { 0 } else { writes / fsync as u64 };
        let flushes = a.measurements.flush.ios;
        proptest::prop_assert!(flushes == most || flushes + 1 == most, "{flushes} of {most}");
        proptest::prop_assert_eq!(a.requests, 400 + flushes);
        let (b, _) = once();
        proptest::prop_assert_eq!((a.event_hash, a.sim_time_ns), (b.event_hash, b.sim_time_ns));
    }

    /// Rate caps on any mix of reads and writes, linear or Poisson, at any queue depth, on a
    /// queued device: every read is right, the device never sees more than the queue depth,
    /// the job ends with its runtime, a linear cap is never exceeded (at most one request
    /// per gap, the first at the start), and the same inputs give the same run.
    #[test]
    fn rate_capped_jobs_keep_their_caps_and_lose_nothing(
        read_iops in proptest::option::of(1u64..50_000),
        write_iops in proptest::option::of(1u64..50_000),
        rwmixread in 0u32..101,
        poisson in proptest::bool::ANY,
        iodepth in 1u32..17,
        seed in 0u64..1_000,
    ) {
        let cap = |c: Option<u64>| c.unwrap_or(0).to_string();
        let text = format!(
            "[r]\nsize=1m\nrw=randrw\nrwmixread={rwmixread}\nbs=4k\niodepth={iodepth}\n\
             time_based\nruntime=50ms\nrate_iops={},{},\nrate_process={}\n",
            cap(read_iops),
            cap(write_iops),
            if poisson { "poisson" } else { "linear" },
        );
        let jobs = parse_job_file(&text).unwrap();
        let once = || {
            let mut dev = SlowQueue::new(256);
            let options = RunOptions { seed, ..options() };
            let out = run(&mut dev, &Workload::Jobs(jobs.clone()), &options).unwrap();
            assert!(dev.running.is_empty());
            (out, dev.most_in_flight)
        };
        let (a, depth) = once();
        proptest::prop_assert_eq!(a.mismatches, 0, "{:?}", a.first_mismatches);
        proptest::prop_assert!(depth <= iodepth as usize);
        proptest::prop_assert!(a.sim_time_ns <= 51_000_000, "{} ns", a.sim_time_ns);
        if !poisson {
            for (capped, ios) in [
                (read_iops, a.measurements.read.ios),
                (write_iops, a.measurements.write.ios),
            ] {
                if let Some(iops) = capped {
                    // Requests at 0, 1/iops, 2/iops, … before the 50 ms runtime ends.
                    proptest::prop_assert!(ios <= (iops * 50).div_ceil(1000), "{ios} > {iops}/s");
                }
            }
        }
        let (b, _) = once();
        proptest::prop_assert_eq!((a.event_hash, a.sim_time_ns), (b.event_hash, b.sim_time_ns));
    }
}

/// Values each option may take in `any_accepted_job_runs_or_is_refused_never_panics`:
/// ordinary ones and the edges (sizes below a sector, unaligned sizes, zero, 100%, one
/// I/O, rates far above and below what the device does).
const JOB_OPTION_VALUES: &[(&str, &[&str])] = &[
    (
        "rw",
        &[
            "read",
            "write",
            "randread",
            "randwrite",
            "rw",
            "randrw",
            "trim",
            "randtrim",
        ],
    ),
    (
        "bs",
        &[
            "512",
            "1k",
            "3k",
            "4k",
            "4097",
            "64k",
            "1m",
            "4k,8k",
            "512,64k,4k",
        ],
    ),
    ("bsrange", &["512-8k", "4k-4k", "1k-3k", "4k-1m"]),
    (
        "bssplit",
        &["4k/50:64k/50", "512/10:4k/90", "4k/100", "8k/0:4k/100"],
    ),
    ("blockalign", &["512", "4k", "3k", "64k"]),
    ("size", &["0", "512", "4k", "1m", "50%", "100%", "1g"]),
    ("offset", &["0", "4k", "3k", "50%", "99%", "2m"]),
    ("offset_increment", &["0", "4k", "1m"]),
    ("io_size", &["4k", "1m", "3k"]),
    ("number_ios", &["1", "7", "1000"]),
    ("iodepth", &["1", "7", "64", "1024"]),
    ("numjobs", &["1", "3"]),
    ("time_based", &["1", "0"]),
    ("ramp_time", &["0", "1ms", "5ms"]),
    ("thinktime", &["0", "10", "1000"]),
    ("thinktime_blocks", &["1", "3", "64"]),
    ("thinktime_blocks_type", &["complete", "issue"]),
    ("thinktime_iotime", &["1ms", "0"]),
    ("thinktime_spin", &["0", "20"]),
    ("rate_ignore_thinktime", &["0", "1"]),
    ("bs_is_seq_rand", &["0", "1"]),
    ("kb_base", &["1024", "1000"]),
    ("verify", &["0", "crc32c"]),
    ("verify_backlog", &["0", "4", "32"]),
    ("verify_backlog_batch", &["2", "64"]),
    ("serialize_overlap", &["0", "1"]),
    ("exit_what", &["group", "all"]),
    ("exitall", &["0", "1"]),
    ("offset_align", &["0", "4k", "64k"]),
    ("offset_increment", &["0", "3%", "4k"]),
    ("rwmixread", &["0", "30", "100"]),
    ("rwmixwrite", &["0", "70", "100"]),
    (
        "random_distribution",
        &["random", "zipf:1.2", "zipf:0.5", "pareto:0.3", "normal:10"],
    ),
    ("percentage_random", &["0", "50", "100"]),
    ("randseed", &["1", "12345"]),
    ("stonewall", &["1"]),
    ("fsync", &["0", "1", "5"]),
    ("fdatasync", &["3"]),
    ("sync", &["0", "1", "dsync"]),
    ("end_fsync", &["0", "1"]),
    ("rate", &["1k", "1m", "100m", ",1m", "1m,"]),
    ("rate_iops", &["1", "100", "1000000", ",50", "50,"]),
    ("rate_process", &["linear", "poisson"]),
    ("continue_on_error", &["none", "read"]),
];

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(afa_sim::proptest_cases(64)))]
    /// Any job file the parser accepts, of options with ordinary and edge values, either
    /// runs with every read right or fails with an error that says something; it never
    /// panics. Each job is held to 20 ms of simulated time so that a slow one stays cheap.
    #[test]
    fn any_accepted_job_runs_or_is_refused_never_panics(
        picks in proptest::collection::vec(
            (0..JOB_OPTION_VALUES.len(), 0usize..16),
            1..10,
        ),
        two_jobs in proptest::bool::ANY,
        seed in 0u64..1_000,
    ) {
        let mut text = String::from("[a]\n");
        for (i, &(option, choice)) in picks.iter().enumerate() {
            if two_jobs && i == picks.len() / 2 {
                text.push_str("[b]\n");
            }
            let (name, values) = JOB_OPTION_VALUES[option];
            text.push_str(&format!("{name}={}\n", values[choice % values.len()]));
        }
        text.push_str("runtime=20ms\n");
        let Ok(jobs) = parse_job_file(&text) else {
            return Ok(());
        };
        let options = RunOptions { seed, ..options() };
        match run(&mut ssd(PayloadMode::Token), &Workload::Jobs(jobs), &options) {
            Ok(out) => proptest::prop_assert_eq!(
                out.mismatches, 0, "{}: {:?}", text, out.first_mismatches
            ),
            Err(e) => proptest::prop_assert!(!e.to_string().is_empty(), "{}", text),
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(afa_sim::proptest_cases(64)))]
    /// Any trace records, in or out of order, inside the device or past its end, of any
    /// length (zero, unaligned, larger than the device), replayed open or closed loop,
    /// either run with every read right or fail with an error that says something.
    #[test]
    fn any_trace_replays_or_is_refused_never_panics(
        records in proptest::collection::vec(
            (0u64..50_000_000, 0usize..4, 0u64..(40 << 20), 0u64..(1 << 20), proptest::bool::ANY),
            0..200,
        ),
        closed in proptest::option::of(1u32..64),
        scale in 0.0f64..4.0,
        aligned in proptest::bool::ANY,
    ) {
        let records: Vec<TraceRecord> = records
            .into_iter()
            .map(|(timestamp_ns, op, offset, len, fua)| {
                let op = [IoOp::Read, IoOp::Write, IoOp::Trim, IoOp::Flush][op];
                let (offset_bytes, len_bytes) = if aligned {
                    (offset / 512 * 512, len / 512 * 512)
                } else {
                    (offset, len)
                };
                TraceRecord {
                    timestamp_ns,
                    op,
                    offset_bytes,
                    len_bytes: if op == IoOp::Flush { 0 } else { len_bytes },
                    volume: 0,
                    fua: fua && op == IoOp::Write,
                }
            })
            .collect();
        let replay = match closed {
            Some(iodepth) => TraceReplay::Closed { iodepth },
            None => TraceReplay::Timed { time_scale: scale },
        };
        let text = format!("{replay:?} over {} records", records.len());
        let workload = Workload::Trace { records, replay };
        match run(&mut ssd(PayloadMode::Token), &workload, &options()) {
            Ok(out) => proptest::prop_assert_eq!(
                out.mismatches, 0, "{}: {:?}", text, out.first_mismatches
            ),
            Err(e) => proptest::prop_assert!(!e.to_string().is_empty(), "{}", text),
        }
    }
}

/// A device whose commands take 10 to 14 µs (by their LBA) and that keeps the time each
/// one was submitted and completed.
#[derive(Default)]
struct Timed {
    commands: Vec<(TimeNs, TimeNs)>,
}

impl Timed {
    /// How many earlier commands were still in flight when each submission instant came,
    /// with how many commands were submitted at that instant.
    fn depth_at_each_submission(&self) -> Vec<(usize, usize)> {
        let mut instants: Vec<TimeNs> = self.commands.iter().map(|c| c.0).collect();
        instants.dedup();
        instants
            .iter()
            .map(|&t| {
                let before = self.commands.iter().filter(|c| c.0 < t && c.1 > t).count();
                let now = self.commands.iter().filter(|c| c.0 == t).count();
                (before, now)
            })
            .collect()
    }
}

impl BlockDevice for Timed {
    fn info(&self) -> afa_ssd::DeviceInfo {
        untracked_info()
    }
    fn submit(
        &mut self,
        now_ns: TimeNs,
        cmd: &Command<'_>,
        _out: ReadBuffers<'_>,
    ) -> Result<afa_ssd::Completion, DeviceError> {
        let done_ns = now_ns + 10_000 + cmd.lba % 5 * 1_000;
        self.commands.push((now_ns, done_ns));
        Ok(afa_ssd::Completion {
            done_ns,
            gc_active: false,
        })
    }
    fn background(&mut self, _now_ns: TimeNs) -> Option<TimeNs> {
        None
    }
}

/// `iodepth_low=2` under `iodepth=8`: once the queue is full it drains to two requests
/// before it is filled again, in one burst of six; without it every completion is replaced at
/// once (several at an instant when they complete together), so the queue stays full.
#[test]
fn iodepth_low_lets_a_full_queue_drain_before_it_is_filled_again() {
    let depths = |extra: &str| {
        let jobs = parse_job_file(&format!(
            "[a]\nrw=randread\nbs=4k\niodepth=8\nnumber_ios=400\n{extra}\n"
        ))
        .unwrap();
        let mut device = Timed::default();
        let out = run(&mut device, &Workload::Jobs(jobs), &options()).unwrap();
        assert_eq!(out.requests, 400);
        device.depth_at_each_submission()
    };
    let full = depths("");
    let interior = |d: &[(usize, usize)]| d[1..d.len() - 1].to_vec();
    assert!(
        interior(&full)
            .iter()
            .all(|&(before, now)| before > 2 && before + now == 8),
        "{full:?}"
    );
    let drained = depths("iodepth_low=2");
    assert_eq!(drained[0], (0, 8));
    assert!(
        drained[1..].iter().all(|&(before, _)| before <= 2),
        "{drained:?}"
    );
    // Each refill comes when the second-last request of the queue completes and tops it
    // up by six (more of the two may complete at that instant).
    assert!(
        interior(&drained).iter().all(|&(_, now)| now == 6),
        "{drained:?}"
    );
    // 0, and a mark at or above the depth, keep the queue full, as in fio.
    assert_eq!(depths("iodepth_low=0"), full);
    assert_eq!(depths("iodepth_low=8"), full);
    // `iodepth_batch_complete_min=4`: a full queue waits for four completions, then takes
    // four new requests at once; batched submission changes nothing in simulated time.
    let batched = depths("iodepth_batch_complete_min=4");
    assert!(
        interior(&batched).iter().all(|&(_, now)| now == 4),
        "{batched:?}"
    );
    assert_eq!(depths("iodepth_batch_complete=4"), batched);
    assert_eq!(depths("iodepth_batch=8\niodepth_batch_submit=8"), full);
    assert_eq!(depths("iodepth_batch_complete_min=1"), full);
}

/// fio reaps a full queue in batches of `iodepth_batch_complete_min` until its depth is
/// at most `iodepth_low`, and only then fills it again.
#[test]
fn the_refill_depth_follows_fios_reaping_loop() {
    assert_eq!(refill_depth(8, None, None), 7);
    assert_eq!(refill_depth(8, Some(0), Some(0)), 7);
    assert_eq!(refill_depth(8, Some(2), None), 2);
    assert_eq!(refill_depth(8, Some(20), None), 7);
    assert_eq!(refill_depth(8, None, Some(4)), 4);
    assert_eq!(refill_depth(8, Some(2), Some(4)), 0);
    assert_eq!(refill_depth(8, Some(5), Some(2)), 4);
    assert_eq!(refill_depth(8, None, Some(16)), 0);
    assert_eq!(refill_depth(1, None, None), 0);
}

/// `startdelay` starts a job that long after its group, and its runtime counts from then;
/// the group's other jobs start at once.
#[test]
fn startdelay_starts_a_job_later_and_its_runtime_counts_from_then() {
    let jobs = parse_job_file(
        "[now]\nrw=randwrite\nbs=4k\nnumber_ios=10\n\
         [later]\nrw=randread\nbs=4k\nstartdelay=2ms\ntime_based\nruntime=1ms\n",
    )
    .unwrap();
    let recording = recording_options();
    let out = run(&mut Timed::default(), &Workload::Jobs(jobs), &recording).unwrap();
    let first = |op: IoOp| out.issued.iter().find(|r| r.op == op).unwrap().timestamp_ns;
    let last = |op: IoOp| {
        out.issued
            .iter()
            .rev()
            .find(|r| r.op == op)
            .unwrap()
            .timestamp_ns
    };
    assert_eq!(first(IoOp::Write), 0);
    assert_eq!(first(IoOp::Read), 2_000_000);
    assert!(last(IoOp::Read) < 3_000_000, "{}", last(IoOp::Read));
    assert!(last(IoOp::Read) > 2_900_000, "{}", last(IoOp::Read));
}

/// `exitall`: when the job that sets it finishes, the other jobs of its group stop (a
/// time-based background load ends with the measured job, and ends with the FLUSH its
/// `end_fsync` asks for); the next group starts as usual. Without it the background load
/// runs its whole runtime.
#[test]
fn exitall_stops_the_group_when_its_job_finishes() {
    let text = |exitall: &str| {
        format!(
            "[measured]\nrw=randread\nbs=4k\nnumber_ios=50\n{exitall}\n\
             [background]\nrw=randrw\nbs=4k\ntime_based\nruntime=1s\nrate_iops=1000\n\
             end_fsync=1\n\
             [after]\nstonewall\nrw=write\nbs=4k\nnumber_ios=5\n"
        )
    };
    let recording = recording_options();
    let run_text = |t: &str| {
        let jobs = parse_job_file(t).unwrap();
        run(&mut Timed::default(), &Workload::Jobs(jobs), &recording).unwrap()
    };
    let plain = run_text(&text(""));
    assert!(plain.sim_time_ns > 1_000_000_000, "{}", plain.sim_time_ns);
    let stopped = run_text(&text("exitall"));
    assert!(stopped.sim_time_ns < 10_000_000, "{}", stopped.sim_time_ns);
    let flushes: Vec<usize> = (0..stopped.issued.len())
        .filter(|&i| stopped.issued[i].op == IoOp::Flush)
        .collect();
    assert_eq!(flushes.len(), 1, "{:?}", stopped.issued);
    let after: Vec<(IoOp, u64)> = stopped.issued[flushes[0] + 1..]
        .iter()
        .map(|r| (r.op, r.offset_bytes))
        .collect();
    assert_eq!(
        after,
        (0..5).map(|i| (IoOp::Write, i * 4096)).collect::<Vec<_>>()
    );
}

/// `exit_what=all`: the job that ends its group with `exitall` also keeps every later group
/// from starting (with fio's default, `group`, the stonewalled job still runs).
#[test]
fn exit_what_all_skips_the_later_groups() {
    let text = |what: &str| {
        format!(
            "[measured]\nrw=randread\nbs=4k\nnumber_ios=50\nexitall\n{what}\n\
             [background]\nrw=randread\nbs=4k\ntime_based\nruntime=1s\n\
             [after]\nstonewall\nrw=write\nbs=4k\nnumber_ios=5\n"
        )
    };
    let writes = |t: &str| {
        let jobs = parse_job_file(t).unwrap();
        run(&mut Timed::default(), &Workload::Jobs(jobs), &options())
            .unwrap()
            .measurements
            .write
            .ios
    };
    assert_eq!(writes(&text("exit_what=group")), 5);
    assert_eq!(writes(&text("exit_what=all")), 0);
}

/// `wait_for`: a job starts once the job it names has finished (its last request
/// completed), not with its group; its `startdelay` still counts from the group's start.
#[test]
fn wait_for_starts_a_job_when_the_one_it_names_has_finished() {
    let jobs = parse_job_file(
        "[fill]\nrw=write\nbs=4k\niodepth=4\nnumber_ios=40\n\
         [check]\nrw=read\nbs=4k\nnumber_ios=40\nwait_for=fill\n\
         [other]\nrw=randread\nbs=4k\noffset=1m\nnumber_ios=10\n",
    )
    .unwrap();
    let recording = recording_options();
    let mut timed = Timed::default();
    let out = run(&mut timed, &Workload::Jobs(jobs.clone()), &recording).unwrap();
    assert_eq!(out.mismatches, 0);
    const MIB: u64 = 1 << 20;
    let issued = |op: IoOp, from: u64| {
        out.issued
            .iter()
            .filter(move |r| r.op == op && (r.offset_bytes >= MIB) == (from == MIB))
            .map(|r| r.timestamp_ns)
    };
    let last_write = issued(IoOp::Write, 0).max().unwrap();
    let first_check = issued(IoOp::Read, 0).min().unwrap();
    // The device takes 10 µs per request: the last write completes 10 µs after its issue.
    assert!(
        first_check >= last_write + 10_000,
        "{first_check} vs {last_write}"
    );
    // The job that waits for nothing starts at once.
    assert_eq!(issued(IoOp::Read, MIB).min(), Some(0));
    assert_eq!(out.measurements.read.ios, 50);
}

/// `serialize_overlap`: a request waits while one of its job's requests in flight overlaps
/// it. Over four 4 KiB slots a queue of eight never holds two requests for one slot.
#[test]
fn serialize_overlap_keeps_overlapping_requests_apart() {
    let text = |serialize: &str| {
        format!("[w]\nrw=randwrite\nbs=4k\nsize=16k\nio_size=1m\niodepth=8\nnumber_ios=100\n{serialize}\n")
    };
    let recording = recording_options();
    let at_start = |t: &str| {
        let jobs = parse_job_file(t).unwrap();
        let out = run(&mut Timed::default(), &Workload::Jobs(jobs), &recording).unwrap();
        assert_eq!(out.measurements.write.ios, 100);
        out.issued
            .iter()
            .filter(|r| r.timestamp_ns == 0)
            .map(|r| r.offset_bytes)
            .collect::<Vec<_>>()
    };
    assert_eq!(at_start(&text("")).len(), 8);
    let mut serialized = at_start(&text("serialize_overlap=1"));
    let issued = serialized.len();
    serialized.sort_unstable();
    serialized.dedup();
    assert_eq!(
        serialized.len(),
        issued,
        "two requests for one slot at once"
    );
    assert!(issued <= 4);
}

/// fio's `verify_backlog`: after every eighth write the job reads back the eight it wrote,
/// each read once its write has completed (the device takes at least 10 µs), though its
/// queue has room for them at once, and the oracle
/// checks every one; a time-based job verifies that way as it goes.
#[test]
fn verify_backlog_reads_each_write_back_once_it_has_completed() {
    // A queue deeper than the backlog: the reads could go at once if they did not wait.
    let text = "[w]\nrw=randwrite\nbs=4k\niodepth=16\nnumber_ios=64\nverify=crc32c\n\
                verify_backlog=8\n";
    let out = run_job_text(text);
    assert_eq!(out.measurements.write.ios, 64);
    assert_eq!(out.measurements.read.ios, 64);
    assert!(out.reads_checked >= 64, "{}", out.reads_checked);
    let recording = recording_options();
    let jobs = parse_job_file(text).unwrap();
    let out = run(&mut Timed::default(), &Workload::Jobs(jobs), &recording).unwrap();
    let mut written_at = std::collections::HashMap::new();
    for r in &out.issued {
        match r.op {
            IoOp::Write => {
                written_at.insert(r.offset_bytes, r.timestamp_ns);
            }
            IoOp::Read => {
                let w = written_at[&r.offset_bytes];
                assert!(
                    r.timestamp_ns >= w + 10_000,
                    "read at {} of a write at {w}",
                    r.timestamp_ns
                );
            }
            _ => {}
        }
    }
    let out = run_job_text(
        "[w]\nrw=randwrite\nbs=4k\niodepth=4\ntime_based\nruntime=20ms\nverify=md5\n\
         verify_backlog=8\n",
    );
    assert!(
        out.measurements.read.ios >= 8,
        "{}",
        out.measurements.read.ios
    );
}

/// fio's verify pass waits for the writes it reads back: its first read is submitted once
/// every write of the job has completed, and the oracle checks every one of its reads.
#[test]
fn the_verify_pass_starts_once_the_writes_have_completed() {
    let text = "[w]\nrw=write\nbs=4k\niodepth=8\nnumber_ios=64\nverify=crc32c\n";
    let mut timed = Timed::default();
    let out = run(
        &mut timed,
        &Workload::Jobs(parse_job_file(text).unwrap()),
        &options(),
    )
    .unwrap();
    assert_eq!(out.requests, 128);
    let (writes, reads) = timed.commands.split_at(64);
    let last_write_done = writes.iter().map(|c| c.1).max().unwrap();
    assert_eq!(reads[0].0, last_write_done);
    // Then the queue fills again at once.
    assert!(reads[..8].iter().all(|c| c.0 == last_write_done));

    let out = run_job_text(text);
    assert_eq!(out.measurements.read.ios, 64);
    assert_eq!(out.reads_checked, 64 * 8);
}

fn run_timed(text: &str) -> RunOutcome {
    let jobs = parse_job_file(text).unwrap();
    run(&mut Timed::default(), &Workload::Jobs(jobs), &options()).unwrap()
}

/// fio's steady-state detection ends a time-based job as soon as its window of samples is
/// level: the device here completes every request in 10–14 µs, so each 10 ms sample of one
/// request at a time is within 1% of the window's mean from the start.
#[test]
fn steady_state_ends_a_time_based_job_once_its_window_is_level() {
    let job = "[j]\nrw=write\nbs=4k\nsize=1m\ntime_based\nruntime=10s\nss=iops:1%\n\
               ss_dur=50ms\nss_interval=10ms\n";
    let out = run_timed(job);
    assert_eq!(out.steady_state.len(), 1);
    let ss = &out.steady_state[0];
    assert!(ss.attained, "{ss:?}");
    assert_eq!(ss.attained_at_s, Some(0.05));
    assert_eq!(ss.iops.len(), 5);
    let mean = ss.iops.iter().sum::<u64>() as f64 / 5.0;
    assert!(
        (mean - 1e9 / 12_000.0).abs() < 1e9 / 12_000.0 * 0.01,
        "{mean}"
    );
    assert_eq!(ss.bw_bytes_s[0], ss.iops[0] * 4096);
    // The job stopped at the check, as its runtime would have stopped it: its last request
    // was in flight then.
    assert!(out.sim_time_ns < 50_000_000 + 20_000, "{}", out.sim_time_ns);

    // Sampling starts after the ramp: the first sample is the interval from 30 to 40 ms.
    let out = run_timed(&format!("{job}ss_ramp=30ms\n"));
    assert_eq!(out.steady_state[0].attained_at_s, Some(0.08));
    assert_eq!(out.steady_state[0].ss, "iops:1.000000%");
}

/// A window that never meets its criterion leaves the job to its runtime, and the report
/// keeps the last window and its criterion.
#[test]
fn steady_state_not_attained_leaves_the_job_its_runtime() {
    let out = run_timed(
        "[j]\nrw=randwrite\nbs=4k\nsize=1m\ntime_based\nruntime=100ms\nss=iops:0\n\
         ss_dur=30ms\nss_interval=10ms\n",
    );
    let ss = &out.steady_state[0];
    assert!(!ss.attained);
    assert_eq!(ss.attained_at_s, None);
    assert_eq!(ss.iops.len(), 3);
    assert!(ss.criterion.is_some_and(|c| c > 0.0), "{ss:?}");
    assert!(out.sim_time_ns >= 100_000_000, "{}", out.sim_time_ns);
}

/// A job that ends before its window fills is judged on nothing, and no check outlasts it:
/// the run ends with its last completion.
#[test]
fn a_job_shorter_than_its_steady_state_window_ends_with_its_last_request() {
    let out = run_timed(
        "[j]\nrw=write\nbs=4k\nnumber_ios=10\nss=iops:1%\nss_dur=50ms\nss_interval=10ms\n",
    );
    let ss = &out.steady_state[0];
    assert!(!ss.attained);
    assert_eq!(ss.criterion, None);
    assert!(ss.iops.is_empty());
    assert!(out.sim_time_ns < 200_000, "{}", out.sim_time_ns);
}

/// With `group_reporting` the jobs of a group are judged together and end together;
/// without it every clone is judged, and ends, on its own.
#[test]
fn steady_state_is_judged_per_group_with_group_reporting_and_per_clone_without() {
    let jobs = "ss=iops:2%\nss_dur=40ms\nss_interval=10ms\ntime_based\nruntime=1s\n\
                bs=4k\nsize=1m\n[a]\nrw=write\n[b]\nrw=randwrite\nnumjobs=2\n";
    let out = run_timed(&format!("[global]\ngroup_reporting\n{jobs}"));
    assert_eq!(out.steady_state.len(), 1);
    let ss = &out.steady_state[0];
    assert_eq!(ss.job, "a");
    assert!(ss.attained);
    // Three streams at one request each, every 10–14 µs.
    let per_stream = ss.iops.iter().sum::<u64>() as f64 / 4.0 / 3.0;
    assert!(
        (per_stream - 1e9 / 12_000.0).abs() < 1_500.0,
        "{per_stream}"
    );
    assert!(out.sim_time_ns < 40_000_000 + 20_000, "{}", out.sim_time_ns);

    let out = run_timed(&format!("[global]\n{jobs}"));
    let names: Vec<&str> = out.steady_state.iter().map(|s| s.job.as_str()).collect();
    assert_eq!(names, ["a", "b.0", "b.1"]);
    assert!(out.steady_state.iter().all(|s| s.iops.len() == 4));
}

/// A device that serves one command at a time, each in 10 µs, so that a request's latency
/// is 10 µs times the requests ahead of it and its own: at queue depth d, about 10·d µs.
#[derive(Default)]
struct Serial {
    next_free_ns: TimeNs,
}

impl BlockDevice for Serial {
    fn info(&self) -> afa_ssd::DeviceInfo {
        untracked_info()
    }
    fn submit(
        &mut self,
        now_ns: TimeNs,
        _cmd: &Command<'_>,
        _out: ReadBuffers<'_>,
    ) -> Result<afa_ssd::Completion, DeviceError> {
        let done_ns = now_ns.max(self.next_free_ns) + 10_000;
        self.next_free_ns = done_ns;
        Ok(afa_ssd::Completion {
            done_ns,
            gc_active: false,
        })
    }
    fn background(&mut self, _now_ns: TimeNs) -> Option<TimeNs> {
        None
    }
}

fn run_serial(text: &str) -> Result<RunOutcome, RunError> {
    let jobs = parse_job_file(text).unwrap();
    run(&mut Serial::default(), &Workload::Jobs(jobs), &options())
}

/// fio's latency-target search finds the deepest queue whose requests all complete within
/// the target: 55 µs on a device that takes 10 µs per request queued is depth 5. It doubles
/// to 8, fails, bisects down to 5, runs a final window there and ends the job, long before
/// its runtime.
#[test]
fn the_latency_target_search_finds_the_deepest_queue_within_the_target() {
    let out = run_serial(
        "[j]\nrw=randread\nbs=4k\niodepth=32\ntime_based\nruntime=10s\nlatency_target=55\n\
         latency_window=1ms\n",
    )
    .unwrap();
    let search = &out.latency_target[0];
    assert!(search.converged, "{search:?}");
    assert_eq!(search.depth, 5);
    let depths: Vec<u32> = search.steps.iter().map(|s| s.1).collect();
    assert_eq!(depths, [1, 2, 4, 8, 6, 5]);
    assert!(search.final_run_ios > 0);
    assert!(
        (search.final_run_latency_mean_us - 50.0).abs() < 1.0,
        "{}",
        search.final_run_latency_mean_us
    );
    assert!(out.sim_time_ns < 20_000_000, "{}", out.sim_time_ns);

    // With latency_run the search goes on until the runtime.
    let out = run_serial(
        "[j]\nrw=randread\nbs=4k\niodepth=32\ntime_based\nruntime=20ms\nlatency_target=55\n\
         latency_window=1ms\nlatency_run=1\n",
    )
    .unwrap();
    assert!(!out.latency_target[0].converged);
    assert_eq!(out.latency_target[0].depth, 5);
    assert!(out.sim_time_ns >= 20_000_000);
}

/// fio fails a job whose request takes longer than `max_latency`, or than `latency_target`
/// at queue depth 1, with ETIMEDOUT: the run stops with an error naming the job and limit.
#[test]
fn a_request_over_max_latency_or_over_the_target_at_depth_one_fails_the_job() {
    let error =
        run_serial("[slow]\nrw=randwrite\nbs=4k\niodepth=4\nnumber_ios=64\nmax_latency=30us\n")
            .unwrap_err()
            .to_string();
    assert!(error.contains("job slow: a Write"), "{error}");
    assert!(error.contains("above max_latency=30000 ns"), "{error}");
    // Reads are not capped when only writes are.
    run_serial("[r]\nrw=randread\nbs=4k\niodepth=4\nnumber_ios=64\nmax_latency=0,30us\n").unwrap();
    let error = run_serial("[t]\nrw=randread\nbs=4k\nnumber_ios=64\nlatency_target=5us\n")
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("above latency_target=5000 ns at queue depth 1"),
        "{error}"
    );
}

/// fio's `rate_min` and `rate_iops_min`: after two seconds of settling, a direction whose
/// rate over a `rate_cycle` falls below its minimum fails the job (fio: EIO); one that keeps
/// it runs to its end.
#[test]
fn a_job_below_its_minimum_rate_fails_after_the_settling_period() {
    let job = "[capped]\nrw=randwrite\nbs=4k\ntime_based\nruntime=5s\nrate_iops=1000\n";
    let out = run_serial(&format!("{job}rate_iops_min=900\n")).unwrap();
    assert!(out.sim_time_ns >= 5_000_000_000);
    let error = run_serial(&format!("{job}rate_iops_min=2000\n"))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("job capped: rate_iops_min=2000 not met by its writes, which got 1000 IOPS over the 1000 ms"),
        "{error}"
    );
    // The first check after the two seconds only marks where the next one counts from.
    let RunError::RateBelowMinimum { at_ns, .. } =
        run_serial(&format!("{job}rate_min=8m\n")).unwrap_err()
    else {
        panic!("expected RateBelowMinimum");
    };
    assert!((3_000_000_000..3_002_000_000).contains(&at_ns), "{at_ns}");
    // A minimum on reads says nothing about a job that only writes.
    run_serial(&format!("{job}rate_min=8m,0\n")).unwrap();
    // With a longer cycle the check waits for it.
    let error = run_serial(&format!("{job}rate_iops_min=2000\nrate_cycle=2500\n"))
        .unwrap_err()
        .to_string();
    assert!(error.contains("over the 2500 ms"), "{error}");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(afa_sim::proptest_cases(16)))]

    /// fio's run controls together (steady state, the latency-target search, strided zones,
    /// flow control) on the emulated SSD with token payloads: every read is right, a run
    /// either ends or fails at depth 1 with the target's error, the search never goes past
    /// `iodepth`, and the same inputs give the same run.
    #[test]
    fn run_controls_lose_nothing_and_repeat(
        iodepth in 1u32..17,
        target_us in 20u64..3_000,
        window_us in 0u64..2_000,
        percentile in proptest::sample::select(vec![90.0, 99.0, 100.0]),
        criterion in proptest::sample::select(vec!["iops:5%", "iops_slope:1%", "bw:20%", "bw_slope:2%"]),
        samples in 2u64..12,
        zone_kib in proptest::sample::select(vec![0u64, 64, 256]),
        rw in proptest::sample::select(vec!["randrw", "randwrite", "write", "rw"]),
        group_reporting in proptest::bool::ANY,
        flow_weights in (0u64..4, 0u64..4),
        flow_sleep_us in proptest::sample::select(vec![0u64, 20]),
        seed in 0u64..1_000,
    ) {
        let zones = if zone_kib == 0 {
            String::new()
        } else {
            format!("zonemode=strided\nzonesize={zone_kib}k\nzonerange={}k\nzoneskip={zone_kib}k\n", zone_kib * 2)
        };
        let text = format!(
            "[global]\nsize=2m\nbs=4k\ntime_based\nruntime=30ms\nss={criterion}\n\
             ss_dur={samples}ms\nss_interval=1ms\ngroup_reporting={}\n\
             flow_sleep={flow_sleep_us}\n\
             [a]\nrw={rw}\niodepth={iodepth}\nlatency_target={target_us}us\n\
             latency_window={window_us}us\nlatency_percentile={percentile}\nflow={}\n{zones}\
             [b]\nrw=randread\niodepth=2\nnumjobs=2\nflow={}\n",
            u8::from(group_reporting),
            flow_weights.0,
            flow_weights.1,
        );
        let jobs = parse_job_file(&text).unwrap();
        let once = || {
            let options = RunOptions { seed, ..options() };
            run(&mut ssd(PayloadMode::Token), &Workload::Jobs(jobs.clone()), &options)
        };
        match (once(), once()) {
            (Ok(a), Ok(b)) => {
                proptest::prop_assert_eq!(a.mismatches, 0, "{:?}", a.first_mismatches);
                proptest::prop_assert!(a.latency_target.iter().all(|l| l.depth <= iodepth));
                proptest::prop_assert_eq!(
                    a.steady_state.len(),
                    if group_reporting { 1 } else { 3 }
                );
                proptest::prop_assert_eq!(
                    (a.event_hash, a.sim_time_ns),
                    (b.event_hash, b.sim_time_ns)
                );
            }
            (Err(a), Err(b)) => {
                let (a, b) = (a.to_string(), b.to_string());
                proptest::prop_assert!(a.contains("at queue depth 1"), "{}", a);
                proptest::prop_assert_eq!(a, b);
            }
            (a, b) => proptest::prop_assert!(false, "{:?} against {:?}", a.err(), b.err()),
        }
    }
}

/// fio's `randtrimwrite` on the emulated SSD: every range is trimmed and then written, and
/// the verify pass reads back what the writes left, each read checked by the oracle.
#[test]
fn trim_then_write_ranges_read_back_as_written() {
    let out = run_job_text(
        "[j]\nrw=randtrimwrite\nbs=4k\nsize=1m\nnumber_ios=200\niodepth=8\nverify=crc32c\n",
    );
    assert_eq!(out.measurements.trim.ios, 200);
    assert_eq!(out.measurements.write.ios, 200);
    // Each distinct range once, from its last write: about 256 (1 - e^(-200/256)) of the
    // 256 ranges.
    let reads = out.measurements.read.ios;
    assert!((110..=170).contains(&reads), "{reads}");
    assert!(out.reads_checked >= reads);
}

/// fio's flow control: two jobs of one flow id with weights 3 and 1 issue three requests to
/// one, although each alone would go as fast as the other; with different flow ids they are
/// not coupled. A `flow_sleep` keeps the proportion too.
#[test]
fn jobs_of_one_flow_issue_in_proportion_to_their_weights() {
    let jobs = |a: &str, b: &str| {
        format!(
            "[global]\nbs=4k\nsize=1m\ntime_based\nruntime=20ms\niodepth=4\n\
             [writer]\nrw=randwrite\n{a}\n[reader]\nrw=randread\n{b}\n"
        )
    };
    let ratio = |out: &RunOutcome| {
        out.measurements.write.ios as f64 / out.measurements.read.ios.max(1) as f64
    };
    let coupled = run_timed(&jobs("flow=3\nflow_id=1", "flow=1\nflow_id=1"));
    assert!((ratio(&coupled) - 3.0).abs() < 0.1, "{}", ratio(&coupled));
    let apart = run_timed(&jobs("flow=3\nflow_id=1", "flow=1\nflow_id=2"));
    assert!((ratio(&apart) - 1.0).abs() < 0.1, "{}", ratio(&apart));
    let sleeping = run_timed(&jobs("flow=1\nflow_sleep=50", "flow=2\nflow_sleep=50"));
    assert!(
        (ratio(&sleeping) - 0.5).abs() < 0.05,
        "{}",
        ratio(&sleeping)
    );
    // The same inputs give the same run.
    let again = run_timed(&jobs("flow=3\nflow_id=1", "flow=1\nflow_id=1"));
    assert_eq!(coupled.event_hash, again.event_hash);
    // A rate cap holds a request the flow let go; it is counted once, when it goes, so the
    // uncapped job of equal weight keeps to the capped one's pace.
    let capped = run_timed(&jobs("flow=1\nrate_iops=5000", "flow=1"));
    assert_eq!(capped.measurements.write.ios, 100);
    assert!((ratio(&capped) - 1.0).abs() < 0.05, "{}", ratio(&capped));
}
