//! A parser for fio's INI job-file language.
//!
//! [`parse_job_file`] accepts the subset of fio options that change what a simulated block
//! device sees (direction, block sizes, addresses, queue depth, limits, randomness) and
//! turns every job section into a [`JobSpec`]. Options that only matter to a real host
//! (`ioengine`, `direct`, ...) are accepted and ignored; any other option is an error, so
//! that a typo such as `iodeph=32` never silently runs a different workload.

use crate::size::{
    parse_duration_ns, parse_duration_ns_default_unit, parse_size, parse_size_with_kb_base,
    NS_PER_US,
};
use crate::trace::{read_trace, TraceFormat, TraceRecord};
use crate::WorkloadError;

fn one_hundred_percent() -> u32 {
    100
}

/// Reads the fio iolog of every job that replays one (`read_iolog`), a relative path from
/// `base` (the job file's directory), and keeps its requests in the job with `replay_scale`
/// and `replay_align` applied to their offsets, as fio applies them. A relative
/// `write_iolog` path is made one from `base` too.
pub fn resolve_iologs(jobs: &mut [JobSpec], base: &std::path::Path) -> Result<(), WorkloadError> {
    for job in jobs.iter_mut() {
        if let Some(path) = &mut job.write_iolog {
            *path = base.join(&*path).display().to_string();
        }
        let Some(path) = &job.read_iolog else {
            continue;
        };
        let full = base.join(path);
        let invalid = |reason: String| WorkloadError::InvalidJob {
            job: job.name.clone(),
            reason,
        };
        let file = std::fs::File::open(&full)
            .map_err(|e| invalid(format!("cannot open read_iolog {}: {e}", full.display())))?;
        let mut records = read_trace(
            std::io::BufReader::new(file),
            TraceFormat::Iolog,
            &full.display().to_string(),
        )?;
        let scale = job.replay_scale.unwrap_or(1).max(1);
        let align = job.replay_align_bytes.unwrap_or(1).max(1);
        for record in &mut records {
            record.offset_bytes = record.offset_bytes / scale / align * align;
        }
        job.iolog_records = Some(std::sync::Arc::new(records));
    }
    Ok(())
}

/// The I/O pattern of a job, fio's `rw=` option.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum RwMode {
    /// `read`: sequential reads.
    Read,
    /// `write`: sequential writes.
    Write,
    /// `randread`: random reads.
    RandRead,
    /// `randwrite`: random writes.
    RandWrite,
    /// `rw` / `readwrite`: sequential mixed reads and writes.
    ReadWrite,
    /// `randrw`: random mixed reads and writes.
    RandRw,
    /// `trim`: sequential trims.
    Trim,
    /// `randtrim`: random trims.
    RandTrim,
    /// `trimwrite`: each range is trimmed and then written, walking the region in order.
    TrimWrite,
    /// `randtrimwrite`: the same at random offsets.
    RandTrimWrite,
}

impl RwMode {
    /// Whether offsets are chosen at random (subject to `percentage_random`) rather than
    /// walked in order.
    pub fn is_random(self) -> bool {
        matches!(
            self,
            RwMode::RandRead
                | RwMode::RandWrite
                | RwMode::RandRw
                | RwMode::RandTrim
                | RwMode::RandTrimWrite
        )
    }

    /// Whether the job mixes reads and writes according to `rwmixread`.
    pub fn is_mixed(self) -> bool {
        matches!(self, RwMode::ReadWrite | RwMode::RandRw)
    }

    /// Whether each request is a trim followed by a write of the same range.
    pub fn is_trim_write(self) -> bool {
        matches!(self, RwMode::TrimWrite | RwMode::RandTrimWrite)
    }

    /// The spelling fio uses for this mode.
    pub fn fio_name(self) -> &'static str {
        match self {
            RwMode::Read => "read",
            RwMode::Write => "write",
            RwMode::RandRead => "randread",
            RwMode::RandWrite => "randwrite",
            RwMode::ReadWrite => "rw",
            RwMode::RandRw => "randrw",
            RwMode::Trim => "trim",
            RwMode::RandTrim => "randtrim",
            RwMode::TrimWrite => "trimwrite",
            RwMode::RandTrimWrite => "randtrimwrite",
        }
    }
}

/// How the length of each I/O in one direction is chosen. All sizes are in bytes.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum BlockSizeSpec {
    /// Every I/O has this many bytes (`bs=`).
    Fixed(u64),
    /// Lengths are drawn uniformly from `min..=max` bytes (`bsrange=`).
    Range {
        /// Smallest length in bytes.
        min: u64,
        /// Largest length in bytes.
        max: u64,
    },
    /// Lengths are drawn from `(bytes, percent)` pairs with the given weights
    /// (`bssplit=`). After parsing, the percentages add up to 100.
    Split(Vec<(u64, f64)>),
}

impl BlockSizeSpec {
    /// The smallest length this spec can produce, in bytes (0 for an empty split).
    pub fn min_bytes(&self) -> u64 {
        match self {
            BlockSizeSpec::Fixed(bytes) => *bytes,
            BlockSizeSpec::Range { min, .. } => *min,
            BlockSizeSpec::Split(entries) => entries
                .iter()
                .filter(|(_, percent)| *percent > 0.0)
                .map(|(bytes, _)| *bytes)
                .min()
                .unwrap_or(0),
        }
    }

    /// The largest length this spec can produce, in bytes (0 for an empty split).
    pub fn max_bytes(&self) -> u64 {
        match self {
            BlockSizeSpec::Fixed(bytes) => *bytes,
            BlockSizeSpec::Range { max, .. } => *max,
            BlockSizeSpec::Split(entries) => entries
                .iter()
                .filter(|(_, percent)| *percent > 0.0)
                .map(|(bytes, _)| *bytes)
                .max()
                .unwrap_or(0),
        }
    }
}

/// A cap on how fast a job issues one direction's requests (`rate=`, `rate_iops=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum RateLimit {
    /// Bytes per second (`rate=`; fio's units, so `1m` is 1 MiB per second).
    BytesPerSecond(u64),
    /// Requests per second (`rate_iops=`).
    IosPerSecond(u64),
}

impl RateLimit {
    /// The time a request of `len_bytes` takes from the direction's budget, when the
    /// direction's smallest block size is `min_bs_bytes`. fio turns `rate_iops` into a byte
    /// rate at the smallest block size (`__setup_rate`: `rate_iops × min_bs`), so with a
    /// range of sizes a larger request takes more of the budget, and the cap holds the
    /// IOPS only of requests of the smallest size.
    pub fn interval_ns(self, len_bytes: u64, min_bs_bytes: u64) -> f64 {
        match self {
            RateLimit::BytesPerSecond(rate) => len_bytes as f64 * 1e9 / rate as f64,
            RateLimit::IosPerSecond(iops) => {
                let per_request_ns = 1e9 / iops as f64;
                if min_bs_bytes == 0 {
                    per_request_ns
                } else {
                    per_request_ns * len_bytes as f64 / min_bs_bytes as f64
                }
            }
        }
    }
}

/// A size or offset given either in bytes or as a percentage of the device.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum SizeSpec {
    /// An absolute number of bytes.
    Bytes(u64),
    /// A percentage (0 to 100) of the device capacity.
    Percent(f64),
}

/// fio's `zonemode`, as the job file gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum ZoneMode {
    /// Not given: `none`, fio 3.x's default.
    #[default]
    NotSpecified,
    /// `none`: no zones; `zonerange` and `zoneskip` are ignored, and `zonesize` is an error.
    None,
    /// `strided`: I/O stays in one zone until `zonesize` bytes have been transferred there,
    /// then moves on to the next ([`StridedZones`]).
    Strided,
}

/// fio's `zoneskip`: the gap between one strided zone and the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ZoneSkip {
    /// A size (`zoneskip=64k`).
    Bytes(u64),
    /// A number of zones of `zonesize` bytes each (`zoneskip=2z`), which fio turns into
    /// bytes once it knows the zone size.
    Zones(u64),
}

impl Default for ZoneSkip {
    fn default() -> ZoneSkip {
        ZoneSkip::Bytes(0)
    }
}

/// A strided zone layout, resolved from a job's zone options by [`JobSpec::strided_zones`].
///
/// The first zone starts at the job's start (`offset`, plus `offset_increment` for each
/// clone before it) and is `range_bytes` long. Once `size_bytes` have been transferred in
/// a zone, the next request goes to the zone `range_bytes + skip_bytes` further on, or back
/// to the first one if that is at or past the device's end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StridedZones {
    /// `zonesize`: the bytes transferred in a zone before the job moves on.
    pub size_bytes: u64,
    /// `zonerange`: the length of a zone.
    pub range_bytes: u64,
    /// `zoneskip`, in bytes: the gap after a zone.
    pub skip_bytes: u64,
}

/// One zone of fio's `zoned` and `zoned_abs` distributions: `access_percent` of the random
/// requests fall uniformly within it. Zones follow each other from the region's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Zone {
    /// The share of the random requests that fall in the zone, in percent.
    pub access_percent: u32,
    /// The zone's extent.
    pub span: ZoneSpan,
}

/// How far a zone reaches: a share of the region (`zoned`) or a size (`zoned_abs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ZoneSpan {
    /// Percent of the job's region.
    Percent(u32),
    /// Bytes.
    Bytes(u64),
}

/// The most zones a `zoned` or `zoned_abs` distribution may list.
pub const MAX_ZONES: usize = 64;

/// How random offsets are distributed over the job's region, fio's
/// `random_distribution=` option.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Distribution {
    /// `random`: every block equally likely.
    Uniform,
    /// `zipf:θ`: block popularity follows a Zipf law with exponent `theta`.
    Zipf {
        /// The Zipf exponent; larger is more skewed.
        theta: f64,
    },
    /// `pareto:h`: fio's Pareto distribution with shape `h`.
    Pareto {
        /// The shape parameter, strictly between 0 and 1; `0.2` sends about 80% of the
        /// accesses to 20% of the blocks.
        h: f64,
    },
    /// `normal:σ` (alias `gauss:σ`): a normal distribution centred on the middle of the
    /// region.
    Normal {
        /// The standard deviation as a percentage of the region size.
        sigma_percent: f64,
    },
    /// `zoned:A/S:...` (shares of the region) or `zoned_abs:A/SIZE:...` (sizes): each zone
    /// takes its share of the accesses, uniformly within it; the shares add up to 100, and
    /// what lies past the last zone is never addressed.
    Zoned {
        /// The zones, from the region's start.
        zones: Vec<Zone>,
    },
}

/// fio's think time (`handle_thinktime` in its backend): once the job has counted
/// `thinktime_blocks` requests since its last pause (completed ones, or issued ones with
/// `thinktime_blocks_type=issue`), or has run `thinktime_iotime` since then, it stops
/// issuing, waits for every request in flight to complete, and pauses before it fills its
/// queue again. With the default of one block and a queue deeper than one, the job
/// therefore runs at depth one after its first completion, as fio's does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct ThinkTime {
    /// How long the pause lasts (`thinktime=`); 0 never pauses and ignores the rest.
    pub pause_ns: u64,
    /// The part of the pause fio spends spinning on a CPU (`thinktime_spin=`). A spin
    /// longer than the pause lengthens it, as in fio; the spin's CPU time is not charged
    /// to the host model.
    pub spin_ns: u64,
    /// Requests between pauses (`thinktime_blocks=`); `None` when not given, which means
    /// one, unless `thinktime_iotime` is given: then only time brings a pause.
    pub blocks: Option<u64>,
    /// Count issued rather than completed requests (`thinktime_blocks_type=issue`).
    pub count_issued: bool,
    /// Time between pauses (`thinktime_iotime=`, counted from the job's start and then
    /// from the end of each pause); 0 means no time limit.
    pub iotime_ns: u64,
    /// After a pause, a rate-capped job goes on at its rate from where it is
    /// (`rate_ignore_thinktime`) instead of issuing at once until it has caught up with
    /// its schedule.
    pub rate_ignores_pause: bool,
}

impl ThinkTime {
    /// How long each pause lasts: fio spins `thinktime_spin` and sleeps what is left of
    /// `thinktime`, nothing when the spin already took that long.
    pub fn pause_total_ns(&self) -> u64 {
        if self.pause_ns == 0 {
            0
        } else {
            self.pause_ns.max(self.spin_ns)
        }
    }

    /// The requests counted between pauses, or `None` when only time brings one.
    pub fn blocks_between_pauses(&self) -> Option<u64> {
        match (self.blocks, self.iotime_ns) {
            (Some(blocks), _) => Some(blocks.max(1)),
            (None, 0) => Some(1),
            (None, _) => None,
        }
    }
}

/// What fio's steady-state detection measures (`steadystate=`): requests or bytes completed
/// per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum SteadyMetric {
    Iops,
    Bandwidth,
}

/// fio's steady-state detection (`steadystate`, `steadystate_duration`,
/// `steadystate_ramp_time`, `steadystate_check_interval`; `steadystate.c`). Every
/// `interval_ns` the host samples the requests and bytes the job completed in that interval,
/// as rates per second; once `ramp_ns` has passed it keeps the last `duration_ns /
/// interval_ns` samples, and when that window is full it judges it after every sample. The
/// job ends, as its runtime would end it, as soon as the window's criterion falls below
/// `limit`:
///
/// * `slope`: the least-squares slope of the samples against their index, in rate per
///   sample (with `limit_is_percent`, as a percentage of the window's mean), in absolute
///   value;
/// * otherwise the largest deviation of a sample from the window's mean (as a percentage of
///   the mean with `limit_is_percent`).
///
/// With `group_reporting` the jobs of a stonewall group are judged together (their rates
/// summed) and all end at once; otherwise every clone of every job is judged and ended on
/// its own.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SteadyState {
    pub metric: SteadyMetric,
    pub slope: bool,
    /// The threshold: requests per second or bytes per second (per sample, for a slope),
    /// or a percentage of the window's mean.
    pub limit: f64,
    pub limit_is_percent: bool,
    /// The window (`steadystate_duration`); 0 turns detection off, fio's default.
    pub duration_ns: u64,
    /// How long the job runs before sampling starts (`steadystate_ramp_time`).
    pub ramp_ns: u64,
    /// The sampling period (`steadystate_check_interval`, fio's default 1 s).
    pub interval_ns: u64,
}

impl Default for SteadyState {
    /// fio's defaults: `iops_slope:0.01%`, checked every second, and off (no window).
    fn default() -> SteadyState {
        SteadyState {
            metric: SteadyMetric::Iops,
            slope: true,
            limit: 0.01,
            limit_is_percent: true,
            duration_ns: 0,
            ramp_ns: 0,
            interval_ns: 1_000_000_000,
        }
    }
}

impl SteadyState {
    /// Whether detection is on: it has a window.
    pub fn enabled(&self) -> bool {
        self.duration_ns > 0
    }

    /// The samples the window holds.
    pub fn window_samples(&self) -> usize {
        (self.duration_ns / self.interval_ns.max(1)) as usize
    }

    /// The criterion as fio prints it in its JSON (`"ss"`): `iops_slope:0.010000%`.
    pub fn describe(&self) -> String {
        format!(
            "{}{}:{:.6}{}",
            match self.metric {
                SteadyMetric::Iops => "iops",
                SteadyMetric::Bandwidth => "bw",
            },
            if self.slope { "_slope" } else { "" },
            self.limit,
            if self.limit_is_percent { "%" } else { "" }
        )
    }
}

/// fio's flow control (`flow`, `flow_id`, `flow_sleep`; fio's `flow.c`): the running jobs
/// that share a flow id keep their requests in proportion to their weights. Before each
/// request a job compares its share of the flow's requests with its share of the flow's
/// weight, and waits while it is ahead: until another job of the flow issues, or, with a
/// sleep, until its own requests in flight have completed and the sleep has passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Flow {
    pub id: u64,
    pub weight: u64,
    pub sleep_ns: u64,
}

/// A direction's least rate (`rate_min`, `rate_iops_min`); fio checks the bytes when both
/// are set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct MinRate {
    pub bytes_per_s: u64,
    pub ios_per_s: u64,
}

impl MinRate {
    pub fn is_set(&self) -> bool {
        self.bytes_per_s > 0 || self.ios_per_s > 0
    }
}

/// fio's latency-target search (`latency_target`, `latency_window`, `latency_percentile`,
/// `latency_run`): the job looks for the deepest queue, up to its `iodepth`, at which
/// `percentile` percent of its requests complete within `target_ns`, judging one window of
/// `window_ns` at a time (the host's `latency` module says how).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LatencyTarget {
    /// The target; 0 (fio's default) turns the search off.
    pub target_ns: u64,
    pub window_ns: u64,
    /// The share of a window's requests that must meet the target, in percent (0, 100].
    pub percentile: f64,
    /// `latency_run`: go on adjusting the depth for the whole run rather than ending the job
    /// once the search has converged.
    pub keep_searching: bool,
}

impl Default for LatencyTarget {
    fn default() -> LatencyTarget {
        LatencyTarget {
            target_ns: 0,
            window_ns: 0,
            percentile: 100.0,
            keep_searching: false,
        }
    }
}

impl LatencyTarget {
    pub fn enabled(&self) -> bool {
        self.target_ns > 0
    }
}

/// One fio job, with every option this simulator understands resolved to a value.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct JobSpec {
    /// The job's name: its section name, unless overridden by `name=`.
    pub name: String,
    /// The I/O pattern (`rw=`).
    pub rw: RwMode,
    /// Block sizes for reads, writes and trims, in that order.
    pub block_sizes: [BlockSizeSpec; 3],
    /// Alignment of random offsets (`blockalign=`); `None` aligns to the minimum block
    /// size of each direction, as fio does.
    pub block_align_bytes: Option<u64>,
    /// The size of the region the job addresses (`size=`); `None` means from `offset` to
    /// the end of the device.
    pub size: Option<SizeSpec>,
    /// Where the job's region starts (`offset=`).
    pub offset: SizeSpec,
    /// Added to `offset` once per clone of a `numjobs` job (`offset_increment=`, bytes or a
    /// percentage of the device): clone `i` starts at `offset + i × offset_increment`.
    pub offset_increment: SizeSpec,
    /// What a start computed from a percentage (`offset=` or `offset_increment=`) is
    /// rounded up to (`offset_align=`); `None` rounds up to the smallest block size of any
    /// direction, as fio does.
    #[serde(default)]
    pub offset_align_bytes: Option<u64>,
    /// Bytes to transfer before the job ends (`io_size=`); `None` means `size`.
    pub io_size_bytes: Option<u64>,
    /// Maximum number of I/Os (`number_ios=`); `None` means unlimited.
    pub number_ios: Option<u64>,
    /// Number of I/Os kept in flight (`iodepth=`).
    pub iodepth: u32,
    /// Number of identical clones of the job (`numjobs=`).
    pub numjobs: u32,
    /// Maximum run time (`runtime=`); `None` means unlimited.
    pub runtime_ns: Option<u64>,
    /// Keep running until `runtime_ns` even after the byte budget is spent (`time_based`).
    pub time_based: bool,
    /// Warm-up time excluded from statistics (`ramp_time=`).
    pub ramp_time_ns: u64,
    /// Percentage of mixed I/O that are reads (`rwmixread=`, or 100 − `rwmixwrite=`).
    pub rwmixread_percent: u32,
    /// Distribution of random offsets (`random_distribution=`).
    pub distribution: Distribution,
    /// Percentage of I/O in random modes that are random rather than sequential
    /// (`percentage_random=`). Sequential modes ignore it.
    pub percentage_random: u32,
    /// Fixed seed for the job's randomness (`randseed=`), overriding the run's seed.
    pub randseed: Option<u64>,
    /// fio's think time: when the job pauses, and for how long (`thinktime=` and the
    /// options that qualify it).
    #[serde(default)]
    pub think: ThinkTime,
    /// Wait for all previous jobs to finish before starting (`stonewall`).
    pub stonewall: bool,
    /// Count a read the device fails and go on, rather than end the run
    /// (`continue_on_error=read`).
    pub continue_on_read_error: bool,
    /// Issue a FLUSH after every this many writes (`fsync=`, `fdatasync=`; at the block layer
    /// both are a FLUSH of the device's volatile cache); `None` never does.
    pub flush_every_writes: Option<u64>,
    /// Issue a FLUSH when the job (each of its `loops` iterations) has issued its last
    /// write (`end_fsync`, `fsync_on_close`), unless the last request was one already.
    pub end_flush: bool,
    /// Every write asks for force unit access (`sync=1`, `sync=sync`, `sync=dsync`): Linux
    /// sends a direct write on a file opened `O_SYNC` or `O_DSYNC` to a block device with
    /// the FUA flag, and it completes only once the data is durable.
    pub fua_writes: bool,
    /// Caps on the rate each direction (read, write, trim) is issued at (`rate=`,
    /// `rate_iops=`); `None` issues as fast as the queue depth allows. Like fio, a job that
    /// fell behind its schedule (the device was slower) issues at once until it has caught
    /// up.
    pub rate_limits: [Option<RateLimit>; 3],
    /// `rate_process=poisson`: the gaps between a direction's requests are exponentially
    /// distributed with the rate's mean, rather than all equal (`linear`).
    pub rate_poisson: bool,
    /// How many times the job runs (`loops=`). fio starts each iteration afresh: its byte
    /// and I/O budgets again, sequential positions back at the region's start, and the
    /// random generators reseeded, so every iteration issues the same requests.
    #[serde(default = "one_loop")]
    pub loops: u32,
    /// How long after its group starts the job starts (`startdelay=`); its `ramp_time`
    /// and `runtime` count from then.
    #[serde(default)]
    pub start_delay_ns: u64,
    /// The queue's low-water mark (`iodepth_low=`): once the job's queue is full it drains
    /// to this many requests before it is filled again. `None`, 0 or a value of at least
    /// `iodepth` keeps the queue full, as in fio.
    #[serde(default)]
    pub iodepth_low: Option<u32>,
    /// fio's `iodepth_batch_complete_min` (alias `iodepth_batch_complete`): a full queue
    /// waits for at least this many completions at a time before it is filled again. `None`
    /// or 0 waits for one, as in fio.
    #[serde(default)]
    pub iodepth_batch_complete_min: Option<u32>,
    /// When this job finishes, the other jobs of its group stop (`exitall`), as their
    /// runtime would stop them.
    #[serde(default)]
    pub exit_all: bool,
    /// With `exitall`, which jobs it stops (`exit_what=`): `false` (`group`, fio's default,
    /// and `stonewall`, the same here since only one stonewall group runs at a time) stops
    /// the other jobs of the group; `true` (`all`) also skips every later group.
    #[serde(default)]
    pub exit_all_groups: bool,
    /// Sequential requests take the read block sizes and random ones the write block sizes,
    /// whatever their direction (`bs_is_seq_rand`).
    #[serde(default)]
    pub bs_is_seq_rand: bool,
    /// The job starts only once the job of this name, which comes before it in the file,
    /// has finished (`wait_for=`); `None` starts with its group.
    #[serde(default)]
    pub wait_for: Option<String>,
    /// A request is issued only once no request of the job in flight overlaps it
    /// (`serialize_overlap`).
    #[serde(default)]
    pub serialize_overlap: bool,
    /// fio's `read_iolog`: the job replays this fio iolog (v2 or v3) instead of drawing its
    /// own requests, with the `replay_*` options below ([`resolve_iologs`] reads it).
    #[serde(default)]
    pub read_iolog: Option<String>,
    /// `replay_no_stall`: the log's requests go as fast as the queue depth allows, not at
    /// their timestamps.
    #[serde(default)]
    pub replay_no_stall: bool,
    /// `replay_time_scale`: the replay runs at this percentage of the log's rate (100: as
    /// recorded, 200: twice as fast).
    #[serde(default = "one_hundred_percent")]
    pub replay_time_scale_percent: u32,
    /// `replay_scale`: the log's byte offsets are divided by this factor.
    #[serde(default)]
    pub replay_scale: Option<u64>,
    /// `replay_align`: the log's byte offsets (after `replay_scale`) are rounded down to a
    /// multiple of this power of two.
    #[serde(default)]
    pub replay_align_bytes: Option<u64>,
    /// fio's `fill_device` (or `fill_fs`): the job writes until the device is full, so its
    /// region runs from its offset to the device's end, whatever `size` and `io_size` say.
    #[serde(default)]
    pub fill_device: bool,
    /// fio's `write_iolog`: the run writes the requests this job issued (every clone's, in
    /// the order they were issued) to this file as a fio iolog (version 3).
    #[serde(default)]
    pub write_iolog: Option<String>,
    /// The requests of `read_iolog`, scaled and aligned, once [`resolve_iologs`] has read them.
    #[serde(skip)]
    pub iolog_records: Option<std::sync::Arc<Vec<TraceRecord>>>,
    /// fio's verify pass (`verify=` a method, with `do_verify` left on): each iteration
    /// ends by reading back what it wrote (by offset, each byte from its last write), once
    /// its writes have completed. The run's oracle checks those reads as it checks every
    /// read; the method only names fio's checksum.
    #[serde(default)]
    pub verify: bool,
    /// fio's `verify_backlog`: with the verify pass on, after every this many writes the
    /// job reads back `verify_backlog_batch` of the writes not yet read back, oldest first,
    /// before it goes on; the verify pass at the end reads back only what is left.
    #[serde(default)]
    pub verify_backlog: Option<u64>,
    /// fio's `verify_backlog_batch`: how many writes each of those checks reads back;
    /// `None` means `verify_backlog`.
    #[serde(default)]
    pub verify_backlog_batch: Option<u64>,
    /// fio's steady-state detection ([`SteadyState`]); off unless a window is given.
    pub steady_state: SteadyState,
    /// fio's `group_reporting`. afa's report always sums every job; the option decides
    /// only whether steady state is judged per group or per job clone.
    pub group_reporting: bool,
    /// fio's latency-target search ([`LatencyTarget`]); off unless a target is given.
    pub latency_target: LatencyTarget,
    /// fio's `rate_min` and `rate_iops_min` for reads, writes and trims: once the job has run
    /// two seconds, a direction whose rate over a `rate_cycle` falls below its minimum
    /// (bytes per second, or else requests per second) fails the job, as in fio. 0 checks
    /// nothing.
    pub min_rates: [MinRate; 3],
    /// fio's `rate_cycle`: the least time between two checks of the minimum rates.
    pub rate_cycle_ns: u64,
    /// fio's flow control ([`Flow`]): `flow` (the weight; 0, the default, is no flow
    /// control), `flow_id` and `flow_sleep`.
    pub flow_weight: u64,
    pub flow_id: u64,
    pub flow_sleep_ns: u64,
    /// fio's `max_latency` for reads, writes and trims: a request that takes longer fails
    /// the job with ETIMEDOUT, as in fio. `None` sets no limit.
    pub max_latency_ns: [Option<u64>; 3],
    /// fio's `rw=MODE:N` offset modifier. In a sequential mode, N bytes are skipped after
    /// every request (holes); in a random mode, a new random offset is drawn only every N
    /// requests, the ones between following on from it (or repeating it, with
    /// `rw_sequencer=identical`). `None` (or 1 in a random mode) changes nothing.
    #[serde(default)]
    pub offset_modifier: Option<u64>,
    /// fio's `rw_sequencer=identical`: in a random mode with `rw=MODE:N`, the requests
    /// between two random offsets repeat the last one rather than follow on from it.
    #[serde(default)]
    pub rw_sequencer_identical: bool,
    /// fio's `zonemode`; [`JobSpec::strided_zones`] resolves it with the other zone options.
    #[serde(default)]
    pub zone_mode: ZoneMode,
    /// fio's `zonesize`: the bytes transferred in a strided zone before the job moves to the
    /// next one; 0 when not given.
    #[serde(default)]
    pub zone_size_bytes: u64,
    /// fio's `zonerange`: the length of a strided zone; 0 (not given) means `zonesize`.
    #[serde(default)]
    pub zone_range_bytes: u64,
    /// fio's `zoneskip`: the gap between one strided zone and the next.
    #[serde(default)]
    pub zone_skip: ZoneSkip,
}

fn one_loop() -> u32 {
    1
}

impl JobSpec {
    /// The job's flow control, when it has a weight.
    pub fn flow(&self) -> Option<Flow> {
        (self.flow_weight > 0).then_some(Flow {
            id: self.flow_id,
            weight: self.flow_weight,
            sleep_ns: self.flow_sleep_ns,
        })
    }

    /// A job with fio's defaults: sequential reads of 4 KiB over the whole device, queue
    /// depth 1, one clone, no time limit, a 50/50 read mix and uniform randomness.
    pub fn default_named(name: &str) -> JobSpec {
        JobSpec {
            name: name.to_string(),
            rw: RwMode::Read,
            block_sizes: [
                BlockSizeSpec::Fixed(4096),
                BlockSizeSpec::Fixed(4096),
                BlockSizeSpec::Fixed(4096),
            ],
            block_align_bytes: None,
            size: None,
            offset: SizeSpec::Bytes(0),
            offset_increment: SizeSpec::Bytes(0),
            offset_align_bytes: None,
            io_size_bytes: None,
            number_ios: None,
            iodepth: 1,
            numjobs: 1,
            runtime_ns: None,
            time_based: false,
            ramp_time_ns: 0,
            rwmixread_percent: 50,
            distribution: Distribution::Uniform,
            percentage_random: 100,
            randseed: None,
            think: ThinkTime::default(),
            stonewall: false,
            continue_on_read_error: false,
            flush_every_writes: None,
            end_flush: false,
            fua_writes: false,
            rate_limits: [None; 3],
            rate_poisson: false,
            loops: 1,
            start_delay_ns: 0,
            iodepth_low: None,
            iodepth_batch_complete_min: None,
            exit_all: false,
            exit_all_groups: false,
            bs_is_seq_rand: false,
            wait_for: None,
            serialize_overlap: false,
            read_iolog: None,
            replay_no_stall: false,
            replay_time_scale_percent: 100,
            replay_scale: None,
            replay_align_bytes: None,
            write_iolog: None,
            fill_device: false,
            iolog_records: None,
            verify: false,
            verify_backlog: None,
            verify_backlog_batch: None,
            offset_modifier: None,
            rw_sequencer_identical: false,
            steady_state: SteadyState::default(),
            group_reporting: false,
            latency_target: LatencyTarget::default(),
            max_latency_ns: [None; 3],
            min_rates: [MinRate::default(); 3],
            rate_cycle_ns: 1_000_000_000,
            flow_weight: 0,
            flow_id: 0,
            flow_sleep_ns: 0,
            zone_mode: ZoneMode::NotSpecified,
            zone_size_bytes: 0,
            zone_range_bytes: 0,
            zone_skip: ZoneSkip::Bytes(0),
        }
    }

    /// The job's strided zones, or `None` for a job without zones, by the rules of fio's
    /// option fix-up (`fixup_options` and, for `Nz` skips, the zone granularity applied when
    /// the job's files are set up): `zonerange` defaults to `zonesize`; `zoneskip=Nz` is N
    /// times `zonesize`.
    ///
    /// Errors, as in fio 3.x: `zonemode=strided` without a `zonesize`, and a `zonesize`
    /// with `zonemode=none`, its default.
    pub fn strided_zones(&self) -> Result<Option<StridedZones>, String> {
        let size_bytes = self.zone_size_bytes;
        match self.zone_mode {
            // fio 3.x's zonemode defaults to none, which it refuses beside a zonesize
            // ("--zonemode=none and --zonesize are not compatible"), as its 3.33 does.
            ZoneMode::None | ZoneMode::NotSpecified if size_bytes > 0 => Err(format!(
                "zonemode=none (fio's default) and zonesize={size_bytes} are not compatible, \
                 as in fio: drop zonesize, or add zonemode=strided"
            )),
            ZoneMode::None | ZoneMode::NotSpecified => Ok(None),
            ZoneMode::Strided if size_bytes == 0 => Err(
                "zonemode=strided needs zonesize, the bytes to transfer in each zone before \
                 moving to the next, as in fio"
                    .to_string(),
            ),
            ZoneMode::Strided => {
                let range_bytes = match self.zone_range_bytes {
                    0 => size_bytes,
                    range_bytes => range_bytes,
                };
                let skip_bytes = match self.zone_skip {
                    ZoneSkip::Bytes(bytes) => bytes,
                    ZoneSkip::Zones(zones) => zones.checked_mul(size_bytes).ok_or_else(|| {
                        format!(
                            "zoneskip={zones}z is {zones} zones of zonesize={size_bytes} \
                             bytes, past any device"
                        )
                    })?,
                };
                Ok(Some(StridedZones {
                    size_bytes,
                    range_bytes,
                    skip_bytes,
                }))
            }
        }
    }
}

/// Options that fio understands but that cannot change what a simulated device sees: they
/// steer the real host (its I/O engine, CPUs, page cache and files), fill the data buffers
/// (the oracle writes its own data, and no device here compresses or deduplicates), or
/// shape fio's own logs and reports (`afa` reports every run the same way). Options that
/// would change the requests a device receives, such as `kb_base` or `nrfiles`, are not
/// here: they are refused until they are modelled.
const IGNORED_OPTIONS: &[&str] = &[
    // The real host's I/O path.
    "ioengine",
    "direct",
    "buffered",
    "thread",
    "filename",
    "invalidate",
    "fadvise_hint",
    "create_on_open",
    "allow_file_create",
    "overwrite",
    "fallocate",
    "unlink",
    "hipri",
    "fixedbufs",
    "registerfiles",
    "sqthread_poll",
    "sqthread_poll_cpu",
    "io_submit_mode",
    "cpus_allowed",
    "cpus_allowed_policy",
    "cpumask",
    "numa_cpu_nodes",
    "numa_mem_policy",
    "nice",
    "prio",
    "prioclass",
    "cmdprio",
    "cmdprio_class",
    "cmdprio_percentage",
    "cmdprio_bssplit",
    "ioscheduler",
    "atomic",
    "write_hint",
    "uid",
    "gid",
    "cgroup",
    "cgroup_weight",
    "cgroup_nodelete",
    "exec_prerun",
    "exec_postrun",
    "pre_read",
    "create_serialize",
    "create_fsync",
    "unlink_each_loop",
    "directory",
    "filename_format",
    "unique_filename",
    "lockmem",
    "mem",
    "iomem",
    "mem_align",
    "iomem_align",
    "hugepage-size",
    // fio's own handling of a failed request: a run here stops at the device's first
    // error (but the reads `continue_on_error=read` counts), so there is nothing left for
    // the other jobs to stop.
    "exitall_on_error",
    "error_dump",
    // Deprecated in fio, where they no longer do anything.
    "rwmixcycle",
    "flow_watermark",
    // Options that only qualify one that is refused unless it is off (verifying trims,
    // more than one file): with it off they change nothing.
    "trim_verify_zero",
    "file_service_type",
    // How fio reads an iolog (in pieces, or onto another device): the replay's requests
    // are the same.
    "read_iolog_chunked",
    "replay_redirect",
    // How fio hands its queued requests to the kernel: it commits them in batches of
    // `iodepth_batch`, but always before it waits for a completion, so in simulated time
    // every request it queued reaches the device at the instant it was queued; and how
    // many completions it takes at most per call (`iodepth_batch_complete_max`) only
    // orders refills within one instant. (`iodepth_batch_complete_min`, which makes a full
    // queue wait for several completions, is modelled.)
    "iodepth_batch",
    "iodepth_batch_submit",
    "iodepth_batch_complete_max",
    // Data buffer contents, and how fio checks them in its verify pass (the pass itself
    // is modelled: `verify=`).
    "verify_pattern",
    "verify_interval",
    "verify_offset",
    "verify_fatal",
    "verify_dump",
    "verify_async",
    "verify_state_save",
    "verify_state_load",
    "refill_buffers",
    "scramble_buffers",
    "zero_buffers",
    "buffer_pattern",
    "buffer_compress_percentage",
    "buffer_compress_chunk",
    "dedupe_percentage",
    "dedupe_mode",
    "dedupe_working_set_percentage",
    "dedupe_global",
    // fio's random generators: `afa` draws from its own seeded generator.
    "norandommap",
    "randrepeat",
    "allrandrepeat",
    "random_generator",
    // fio's logs and reports.
    "description",
    "new_group",
    "unified_rw_reporting",
    "unit_base",
    "lat_percentiles",
    "clat_percentiles",
    "slat_percentiles",
    "percentile_list",
    "disable_lat",
    "disable_clat",
    "disable_slat",
    "disable_bw_measurement",
    "gtod_reduce",
    "clocksource",
    "write_bw_log",
    "write_lat_log",
    "write_iops_log",
    "write_hist_log",
    "log_avg_msec",
    "log_hist_msec",
    "log_hist_coarseness",
    "log_max_value",
    "log_offset",
    "log_compression",
    "log_unix_epoch",
    "per_job_logs",
    "bwavgtime",
    "iopsavgtime",
    "significant_figures",
    "log_entries",
    "stats",
];

/// fio's verify methods (`verify=`): each one turns the verify pass on. The checksum itself
/// is fio's business; the run's oracle checks every read.
const VERIFY_METHODS: &[&str] = &[
    "md5",
    "crc64",
    "crc32c",
    "crc32c-intel",
    "crc32",
    "crc16",
    "crc7",
    "xxhash",
    "sha512",
    "sha256",
    "sha1",
    "sha3-224",
    "sha3-256",
    "sha3-384",
    "sha3-512",
    "meta",
    "pattern",
    "null",
];

/// fio options real job files carry that would change the requests a device receives and
/// are not modelled, each with why and what to use instead: refused by name, so that they
/// are told apart from typos.
const UNMODELLED_OPTIONS: &[(&[&str], &str)] = &[
    (
        &[
            "verify_only",
            "experimental_verify",
            "trim_percentage",
            "trim_backlog",
        ],
        "fio's verify pass (verify=, with verify_backlog in the middle of the writes) is \
         modelled, not verifying without writing, fio's experimental verify or verifying \
         trims",
    ),
    (
        &["nrfiles", "filesize", "openfiles", "opendir", "create_only"],
        "a job addresses one block device here, not a set of files",
    ),
    (
        &[
            "max_open_zones",
            "job_max_open_zones",
            "zonecapacity",
            "read_beyond_wp",
            "ignore_zone_limits",
            "zone_reset_threshold",
            "zone_reset_frequency",
            "write_zone_remainder",
        ],
        "only fio's zonemode=zbd uses it, and zoned block devices (zones written at their \
         write pointer, zone resets, open-zone limits) are not modelled; zonemode=strided is",
    ),
    (
        &["bs_unaligned", "blocksize_unaligned"],
        "requests here are whole sectors: block sizes must be multiples of the sector size",
    ),
    (
        &["thinkcycles"],
        "a spin of CPU cycles after every request lasts as long as the host's processor \
         takes, which a simulated run does not know; use thinktime_spin",
    ),
];

/// Whether an option that is not modelled is set to the value at which it changes nothing:
/// its fio default, or off. Tools that write job files spell such values out, and refusing
/// `max_open_zones=0` or `nrfiles=1` would turn away a job that is modelled exactly.
fn leaves_the_requests_alone(key: &str, value: Option<&str>) -> bool {
    let Some(value) = value.map(|v| v.trim().to_ascii_lowercase()) else {
        return false;
    };
    // Zero in every direction of a per-direction list, as a size or as a duration.
    let zero = || {
        value.split(',').all(|part| {
            let part = part.trim();
            part.is_empty() || parse_size(part) == Ok(0) || parse_duration_ns(part) == Ok(0)
        })
    };
    let off = || matches!(value.as_str(), "0" | "false" | "no" | "off");
    match key {
        "nrfiles" | "openfiles" => parse_unsigned(&value) == Ok(1),
        "verify_only"
        | "experimental_verify"
        | "bs_unaligned"
        | "blocksize_unaligned"
        | "read_beyond_wp"
        | "ignore_zone_limits"
        | "write_zone_remainder" => off(),
        "trim_percentage" | "trim_backlog" | "thinkcycles" | "max_open_zones"
        | "job_max_open_zones" | "zonecapacity" => zero(),
        // fio's float options: 0 never resets a zone.
        "zone_reset_threshold" | "zone_reset_frequency" => {
            value.parse::<f64>().is_ok_and(|number| number == 0.0)
        }
        _ => false,
    }
}

/// The most `bssplit` entries per direction fio allows.
const MAX_BSSPLIT_ENTRIES: usize = 64;

/// Parses a fio job file into one [`JobSpec`] per job section, in file order.
///
/// The language:
///
/// * `[name]` starts a section. `[global]` sections set defaults for every job section
///   that follows them (a later `[global]` amends the defaults for later jobs only); every
///   other section is a job. Jobs inherit the section name unless they set `name=`.
/// * `key=value` sets an option (whitespace around `=` is ignored); a bare `key` sets a
///   boolean option such as `time_based` or `stonewall`.
/// * Lines whose first non-blank character is `#` or `;` are comments, as is anything
///   after a `#` or `;` that follows whitespace. Blank lines are ignored.
/// * Setting an option twice keeps the last value.
///
/// Supported options and the rules applied to their values:
///
/// * `rw`/`readwrite`: `read`, `write`, `randread`, `randwrite`, `rw`/`readwrite`, `randrw`,
///   `trim`, `randtrim`, `trimwrite`, `randtrimwrite`, each with fio's optional `:N`
///   offset modifier (a size: the hole after each sequential request, or how many random
///   requests share one random offset).
/// * `rw_sequencer`: `sequential` or `identical`.
/// * `bs`/`blocksize`, `bsrange`/`blocksize_range`, `bssplit`: one value for all
///   directions or a `read,write,trim` list, following fio: an empty entry keeps the
///   previous value, and a last entry not followed by a comma also applies to the
///   remaining directions. Sizes must be greater than zero; a range needs `min <= max`;
///   `bssplit` entries are `size/percent` joined by `:`, a missing percentage shares what
///   the others leave equally, the given percentages must add up to at most 100, and if
///   they add up to less (with none missing) the last entry takes the rest, as in fio.
/// * `blockalign`/`ba`: a size greater than zero (a per-direction list must repeat the
///   same value, because one alignment is kept for all directions).
/// * `size`: a size greater than zero, or a percentage in (0, 100] of the device.
/// * `offset`: a size, or a percentage in [0, 100) of the device.
/// * `zonemode`: `none` or `strided` (`zbd` is refused by name); `zonesize`, `zonerange`:
///   sizes (0: not given); `zoneskip`: a size or a number of zones (`2z`). Percentages are
///   refused. [`JobSpec::strided_zones`] gives the rules that tie them together.
/// * `io_size`/`io_limit`: a size greater than zero.
/// * `number_ios`: a count (size suffixes allowed); 0 means unlimited, as in fio.
/// * `iodepth`, `numjobs`: integers of at least 1.
/// * `runtime`/`timeout`, `ramp_time`: durations, bare numbers in seconds; a runtime of 0
///   means unlimited.
/// * `thinktime`, `thinktime_spin`: durations, bare numbers in microseconds;
///   `thinktime_iotime`: a duration, bare numbers in seconds; `thinktime_blocks`: an
///   integer of at least 1; `thinktime_blocks_type`: `complete` or `issue`;
///   `rate_ignore_thinktime`: a boolean ([`ThinkTime`]).
/// * `time_based`, `stonewall`/`wait_for_previous`: booleans (bare, `1`/`0`, `true`/`false`,
///   `yes`/`no`, `on`/`off`).
/// * `rwmixread`, `rwmixwrite`: percentages 0 to 100; `rwmixwrite=N` means
///   `rwmixread=100-N`.
/// * `random_distribution`: `random`, `zipf:θ` with θ > 0 (fio refuses exactly 1 because
///   of its sampler; ours handles it), `pareto:h` with 0 < h < 1, `normal:σ` or `gauss:σ`
///   with 0 ≤ σ < 100 (percent of the region), `zoned:A/S:...` (S percent of the region)
///   or `zoned_abs:A/SIZE:...` (also `zoned_abs=...`) with whole access percentages adding
///   up to 100 and at most [`MAX_ZONES`] zones. fio's `:center` suffix and per-direction
///   zone lists are refused.
/// * `percentage_random`: 0 to 100 (a per-direction list must repeat the same value).
/// * `randseed`: an unsigned 64-bit integer.
/// * `name`: a non-empty string.
/// * `loops`: an integer of at least 1; every iteration issues the same requests.
/// * `startdelay`: a duration, bare numbers in seconds (a `min-max` range is refused).
/// * `iodepth_low`: an unsigned integer; 0 or at least `iodepth` keeps the queue full.
/// * `iodepth_batch_complete_min` (`iodepth_batch_complete`): an unsigned integer; a full
///   queue waits for that many completions (0 and 1: one) before it is filled again.
/// * `exitall`: a boolean; when the job finishes, the other jobs of its group stop.
/// * `verify`: `none`/`0` or one of fio's methods (`crc32c`, `md5`, ...), which turns the
///   verify pass on; `do_verify`: a boolean (on by default) that can turn it off.
/// * `end_fsync`, `fsync_on_close`: booleans; either one ends every iteration with a FLUSH.
/// * Accepted and ignored: the host-side, buffer-content and reporting options of
///   `IGNORED_OPTIONS` (`ioengine`, `direct`, `group_reporting`, `refill_buffers`,
///   `write_bw_log`, `percentile_list`, ...).
///
/// Errors: an unknown option is [`WorkloadError::UnknownOption`], a fio option this
/// simulator does not model is [`WorkloadError::UnsupportedOption`], a refused value is
/// [`WorkloadError::BadValue`], a line that is not a section, option, comment or blank (or
/// an option before the first section) is [`WorkloadError::Syntax`], and a file without
/// any job section is [`WorkloadError::NoJobs`]. The parser never panics.
pub fn parse_job_file(text: &str) -> Result<Vec<JobSpec>, WorkloadError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut global = JobBuilder {
        spec: JobSpec::default_named("global"),
        name_from_option: false,
        fsync: None,
        fdatasync: None,
        end_fsync: false,
        fsync_on_close: false,
        verify_method: false,
        do_verify: true,
        kb_base: 1024,
    };
    let kb_bases = section_kb_bases(text);
    let mut current = Section::None;
    let mut jobs = Vec::new();

    for (index, raw_line) in text.lines().enumerate() {
        let line_number = index + 1;
        let line = strip_comment(raw_line).trim();
        if line.is_empty() {
            continue;
        }
        if line.starts_with('[') {
            let Some(name) = line
                .strip_prefix('[')
                .and_then(|rest| rest.strip_suffix(']'))
            else {
                return Err(WorkloadError::Syntax {
                    line: line_number,
                    reason: format!("malformed section header '{line}'"),
                });
            };
            let name = name.trim();
            if name.is_empty() {
                return Err(WorkloadError::Syntax {
                    line: line_number,
                    reason: "section header without a name".to_string(),
                });
            }
            if let Section::Job { builder, .. } = std::mem::replace(&mut current, Section::None) {
                jobs.push(builder.spec);
            }
            // fio parses a section's kb_base before its other options, wherever it stands.
            let kb_base = kb_bases.get(&line_number).copied();
            current = if name == "global" {
                if let Some(base) = kb_base {
                    global.kb_base = base;
                }
                Section::Global
            } else {
                let mut builder = Box::new(global.clone());
                if let Some(base) = kb_base {
                    builder.kb_base = base;
                }
                if !builder.name_from_option {
                    builder.spec.name = name.to_string();
                }
                Section::Job {
                    section: name.to_string(),
                    builder,
                }
            };
            continue;
        }

        let (key, value) = match line.split_once('=') {
            Some((key, value)) => (key.trim(), Some(value.trim())),
            None => (line, None),
        };
        if key.is_empty() {
            return Err(WorkloadError::Syntax {
                line: line_number,
                reason: format!("option without a name in '{line}'"),
            });
        }
        match &mut current {
            Section::None => {
                return Err(WorkloadError::Syntax {
                    line: line_number,
                    reason: format!("option '{key}' appears before any [section]"),
                })
            }
            Section::Global => apply_option(&mut global, "global", key, value, line_number)?,
            Section::Job { section, builder } => {
                apply_option(builder, section, key, value, line_number)?
            }
        }
    }
    if let Section::Job { builder, .. } = current {
        jobs.push(builder.spec);
    }
    if jobs.is_empty() {
        return Err(WorkloadError::NoJobs);
    }
    // fio's `wait_for` names one job earlier in the file: it allows no forward reference,
    // and a waitee's name must be unique.
    for (index, job) in jobs.iter().enumerate() {
        let Some(name) = &job.wait_for else {
            continue;
        };
        let earlier = jobs[..index].iter().filter(|j| &j.name == name).count();
        let reason = match (earlier, jobs.iter().filter(|j| &j.name == name).count()) {
            (1, 1) => continue,
            (0, _) => format!("wait_for={name} names no job before this one"),
            _ => format!("wait_for={name} names more than one job"),
        };
        return Err(WorkloadError::InvalidJob {
            job: job.name.clone(),
            reason,
        });
    }
    check_steady_states(&jobs)?;
    check_zone_modes(&jobs)?;
    Ok(jobs)
}

/// fio's rules for the zone options, which hold across options and sections (a `zonesize`
/// in `[global]` with a job's `zonemode`): see [`JobSpec::strided_zones`].
fn check_zone_modes(jobs: &[JobSpec]) -> Result<(), WorkloadError> {
    for job in jobs {
        job.strided_zones()
            .map_err(|reason| WorkloadError::InvalidJob {
                job: job.name.clone(),
                reason,
            })?;
    }
    Ok(())
}

/// fio's rules for steady-state detection: the window holds a whole number of samples, and
/// the jobs of one stonewall group (`td_steadystate_init`'s "reporting group") share one
/// setting, since with `group_reporting` they are judged and ended together.
fn check_steady_states(jobs: &[JobSpec]) -> Result<(), WorkloadError> {
    let mut group_first = 0;
    for (index, job) in jobs.iter().enumerate() {
        if index > 0 && job.stonewall {
            group_first = index;
        }
        let ss = &job.steady_state;
        let invalid = |reason: String| WorkloadError::InvalidJob {
            job: job.name.clone(),
            reason,
        };
        if ss.enabled() && ss.duration_ns % ss.interval_ns != 0 {
            return Err(invalid(format!(
                "steadystate_duration ({} ns) must be a whole multiple of \
                 steadystate_check_interval ({} ns)",
                ss.duration_ns, ss.interval_ns
            )));
        }
        if ss.enabled() && ss.slope && ss.window_samples() < 2 {
            return Err(invalid(format!(
                "a slope ({}) needs a window of at least two samples: \
                 steadystate_duration is one steadystate_check_interval",
                ss.describe()
            )));
        }
        let first = &jobs[group_first];
        let differs = first.steady_state.enabled() != ss.enabled()
            || (ss.enabled()
                && (first.steady_state != *ss || first.group_reporting != job.group_reporting));
        if differs {
            return Err(invalid(format!(
                "steady-state options (steadystate, steadystate_duration, \
                 steadystate_ramp_time, steadystate_check_interval, group_reporting) must be \
                 the same for every job of a stonewall group, and differ from those of [{}]",
                first.name
            )));
        }
    }
    Ok(())
}

/// The `kb_base` each section sets (its last one, as a later setting wins), by the line
/// number of the section's header. Values that are not 1000 or 1024 are left for the
/// option's own parse to refuse.
fn section_kb_bases(text: &str) -> std::collections::BTreeMap<usize, u64> {
    let mut bases = std::collections::BTreeMap::new();
    let mut header = 0;
    for (index, raw_line) in text.lines().enumerate() {
        let line = strip_comment(raw_line).trim();
        if line.starts_with('[') {
            header = index + 1;
            continue;
        }
        if let Some((key, value)) = line.split_once('=') {
            if key.trim() == "kb_base" {
                if let Ok(base @ (1000 | 1024)) = value.trim().parse::<u64>() {
                    bases.insert(header, base);
                }
            }
        }
    }
    bases
}

/// The section whose options the parser is currently reading.
enum Section {
    /// Before the first section header.
    None,
    /// Inside a `[global]` section.
    Global,
    /// Inside a job section.
    Job {
        section: String,
        builder: Box<JobBuilder>,
    },
}

/// A job under construction.
#[derive(Clone)]
struct JobBuilder {
    spec: JobSpec,
    /// Whether `name=` was given, so that a global `name=` is not overwritten by the
    /// section name of each job.
    name_from_option: bool,
    /// The periods `fsync=` and `fdatasync=` gave, kept apart so that a job may repeat the
    /// global one's option or set the other to the same period.
    fsync: Option<u64>,
    fdatasync: Option<u64>,
    /// `end_fsync=` and `fsync_on_close=`, kept apart so that either may turn the end
    /// FLUSH on and a later `0` for one does not turn the other's off.
    end_fsync: bool,
    fsync_on_close: bool,
    /// `verify=` named a method, and `do_verify=` (on unless turned off): the verify pass
    /// runs when both hold, whichever option the file gives first.
    verify_method: bool,
    do_verify: bool,
    /// fio's `kb_base` (1024 or 1000), which fio reads before the section's other options.
    kb_base: u64,
}

/// Removes a comment from a line: the whole line if it starts with `#` or `;`, otherwise
/// from the first `#` or `;` preceded by whitespace.
fn strip_comment(line: &str) -> &str {
    let trimmed = line.trim_start();
    if trimmed.starts_with('#') || trimmed.starts_with(';') {
        return "";
    }
    let mut previous_is_space = false;
    for (index, c) in line.char_indices() {
        if (c == '#' || c == ';') && previous_is_space {
            return &line[..index];
        }
        previous_is_space = c.is_whitespace();
    }
    line
}

/// Where an option came from, for error messages.
struct OptionContext<'a> {
    section: &'a str,
    option: &'a str,
    value: &'a str,
    line: usize,
    /// fio's `kb_base` of the section: what `k`, `m`, ... count in.
    kb_base: u64,
}

impl OptionContext<'_> {
    fn bad(&self, reason: impl Into<String>) -> WorkloadError {
        WorkloadError::BadValue {
            section: self.section.to_string(),
            option: self.option.to_string(),
            value: self.value.to_string(),
            reason: reason.into(),
            line: self.line,
        }
    }

    /// The option's value, which must be present.
    /// A byte count under the section's `kb_base`.
    fn size(&self, text: &str) -> Result<u64, String> {
        parse_size_with_kb_base(text, self.kb_base)
    }

    fn required<'v>(&self, value: Option<&'v str>) -> Result<&'v str, WorkloadError> {
        match value {
            Some(value) if !value.is_empty() => Ok(value),
            _ => Err(self.bad("the option needs a value")),
        }
    }
}

/// Applies one `key[=value]` line to a job (or to the global defaults).
fn apply_option(
    builder: &mut JobBuilder,
    section: &str,
    key: &str,
    value: Option<&str>,
    line: usize,
) -> Result<(), WorkloadError> {
    let context = OptionContext {
        section,
        option: key,
        value: value.unwrap_or(""),
        line,
        kb_base: builder.kb_base,
    };
    let spec = &mut builder.spec;
    match key {
        "rw" | "readwrite" => {
            let text = context.required(value)?;
            let (mode, modifier) = match text.split_once(':') {
                Some((mode, n)) => (mode, Some(n)),
                None => (text, None),
            };
            spec.rw = parse_rw(mode).map_err(|r| context.bad(r))?;
            spec.offset_modifier = match modifier {
                None => None,
                Some(n) => match context.size(n.trim()).map_err(|r| context.bad(r))? {
                    0 => return Err(context.bad("the ':N' offset modifier must be positive")),
                    n => Some(n),
                },
            };
        }
        "rw_sequencer" => {
            spec.rw_sequencer_identical =
                match context.required(value)?.to_ascii_lowercase().as_str() {
                    "sequential" => false,
                    "identical" => true,
                    _ => return Err(context.bad("expected sequential or identical")),
                }
        }
        "bs" | "blocksize" => parse_per_direction(
            &context,
            context.required(value)?,
            &mut spec.block_sizes,
            |text| positive_size(text, context.kb_base).map(BlockSizeSpec::Fixed),
        )?,
        "bsrange" | "blocksize_range" => parse_per_direction(
            &context,
            context.required(value)?,
            &mut spec.block_sizes,
            |text| parse_block_size_range(text, context.kb_base),
        )?,
        "bssplit" => parse_per_direction(
            &context,
            context.required(value)?,
            &mut spec.block_sizes,
            |text| parse_block_size_split(text, context.kb_base),
        )?,
        "blockalign" | "ba" => {
            let bytes = single_across_directions(&context, context.required(value)?, |text| {
                positive_size(text, context.kb_base)
            })?;
            spec.block_align_bytes = Some(bytes);
        }
        "size" => {
            let size = parse_size_spec(context.required(value)?, context.kb_base)
                .map_err(|r| context.bad(r))?;
            match size {
                SizeSpec::Bytes(0) => return Err(context.bad("size must be greater than zero")),
                SizeSpec::Percent(percent) if !(percent > 0.0 && percent <= 100.0) => {
                    return Err(context.bad("a size percentage must be in (0, 100]"))
                }
                _ => spec.size = Some(size),
            }
        }
        "offset" => {
            let offset = parse_size_spec(context.required(value)?, context.kb_base)
                .map_err(|r| context.bad(r))?;
            if let SizeSpec::Percent(percent) = offset {
                if !(0.0..100.0).contains(&percent) {
                    return Err(context.bad("an offset percentage must be in [0, 100)"));
                }
            }
            spec.offset = offset;
        }
        "io_size" | "io_limit" => {
            spec.io_size_bytes = Some(
                positive_size(context.required(value)?, context.kb_base)
                    .map_err(|r| context.bad(r))?,
            )
        }
        "number_ios" => {
            let count = context
                .size(context.required(value)?)
                .map_err(|r| context.bad(r))?;
            spec.number_ios = (count > 0).then_some(count);
        }
        "iodepth" => spec.iodepth = parse_at_least_one(&context, context.required(value)?)?,
        "numjobs" => spec.numjobs = parse_at_least_one(&context, context.required(value)?)?,
        "runtime" | "timeout" => {
            let runtime_ns =
                parse_duration_ns(context.required(value)?).map_err(|r| context.bad(r))?;
            spec.runtime_ns = (runtime_ns > 0).then_some(runtime_ns);
        }
        "time_based" => spec.time_based = parse_bool(&context, value)?,
        "ramp_time" => {
            spec.ramp_time_ns =
                parse_duration_ns(context.required(value)?).map_err(|r| context.bad(r))?
        }
        "continue_on_error" => {
            spec.continue_on_read_error = match context.required(value)? {
                "none" | "0" | "verify" => false,
                "read" => true,
                other => {
                    return Err(context.bad(format!(
                        "continue_on_error={other} is not supported (use none, read or verify): \
                         a failed write leaves its sectors undefined, which the oracle could not \
                         check any more"
                    )))
                }
            }
        }
        "thinktime" => {
            spec.think.pause_ns =
                parse_duration_ns_default_unit(context.required(value)?, NS_PER_US)
                    .map_err(|r| context.bad(r))?
        }
        "thinktime_spin" => {
            spec.think.spin_ns = parse_duration_ns_default_unit(context.required(value)?, NS_PER_US)
                .map_err(|r| context.bad(r))?
        }
        "thinktime_blocks" => {
            let blocks = parse_unsigned(context.required(value)?).map_err(|r| context.bad(r))?;
            if blocks == 0 {
                return Err(context.bad("must be at least 1"));
            }
            spec.think.blocks = Some(blocks);
        }
        "thinktime_blocks_type" => {
            spec.think.count_issued = match context.required(value)?.to_ascii_lowercase().as_str() {
                "complete" => false,
                "issue" => true,
                _ => return Err(context.bad("expected complete or issue")),
            }
        }
        "thinktime_iotime" => {
            spec.think.iotime_ns =
                parse_duration_ns(context.required(value)?).map_err(|r| context.bad(r))?
        }
        "rate_ignore_thinktime" => spec.think.rate_ignores_pause = parse_bool(&context, value)?,
        "rwmixread" => {
            spec.rwmixread_percent =
                parse_percent(context.required(value)?).map_err(|r| context.bad(r))?
        }
        "rwmixwrite" => {
            spec.rwmixread_percent =
                100 - parse_percent(context.required(value)?).map_err(|r| context.bad(r))?
        }
        "random_distribution" => {
            spec.distribution = parse_distribution(context.required(value)?, context.kb_base)
                .map_err(|r| context.bad(r))?
        }
        "percentage_random" => {
            spec.percentage_random =
                single_across_directions(&context, context.required(value)?, parse_percent)?
        }
        "randseed" => {
            spec.randseed =
                Some(parse_unsigned(context.required(value)?).map_err(|r| context.bad(r))?)
        }
        "stonewall" | "wait_for_previous" => spec.stonewall = parse_bool(&context, value)?,
        "fsync" | "fdatasync" => {
            let every = parse_unsigned(context.required(value)?).map_err(|r| context.bad(r))?;
            let every = (every > 0).then_some(every);
            // Both are a FLUSH at the block layer, so two different periods would be one
            // stream of flushes that neither option describes.
            let other = if key == "fsync" {
                builder.fdatasync
            } else {
                builder.fsync
            };
            if let (Some(a), Some(b)) = (every, other) {
                if a != b {
                    return Err(context.bad(format!(
                        "fsync and fdatasync are both a FLUSH of the device here; give one of \
                         them, or the same period ({b} was given to the other)"
                    )));
                }
            }
            if key == "fsync" {
                builder.fsync = every;
            } else {
                builder.fdatasync = every;
            }
            spec.flush_every_writes = builder.fsync.or(builder.fdatasync);
        }
        // Both are a FLUSH when the job (each iteration of it) ends: fio closes the job's
        // files at the end of every iteration, and a block device's close-time fsync is
        // that FLUSH.
        "end_fsync" | "fsync_on_close" => {
            let on = parse_bool(&context, value)?;
            if key == "end_fsync" {
                builder.end_fsync = on;
            } else {
                builder.fsync_on_close = on;
            }
            spec.end_flush = builder.end_fsync || builder.fsync_on_close;
        }
        "loops" => spec.loops = parse_at_least_one(&context, context.required(value)?)?,
        "exitall" => spec.exit_all = parse_bool(&context, value)?,
        "exit_what" => {
            spec.exit_all_groups = match context.required(value)?.to_ascii_lowercase().as_str() {
                "group" | "stonewall" => false,
                "all" => true,
                _ => return Err(context.bad("expected group, stonewall or all")),
            }
        }
        "bs_is_seq_rand" => spec.bs_is_seq_rand = parse_bool(&context, value)?,
        "serialize_overlap" => spec.serialize_overlap = parse_bool(&context, value)?,
        "wait_for" => {
            let name = context.required(value)?.trim();
            if name.is_empty() {
                return Err(context.bad("needs the name of an earlier job"));
            }
            spec.wait_for = Some(name.to_string());
        }
        "verify_backlog" | "verify_backlog_batch" => {
            let count = parse_unsigned(context.required(value)?).map_err(|r| context.bad(r))?;
            let count = (count > 0).then_some(count);
            if key == "verify_backlog" {
                spec.verify_backlog = count;
            } else {
                spec.verify_backlog_batch = count;
            }
        }
        "kb_base" => match context.required(value)?.trim() {
            "1000" | "1024" => {}
            _ => return Err(context.bad("expected 1000 or 1024")),
        },
        "fill_device" | "fill_fs" => spec.fill_device = parse_bool(&context, value)?,
        "write_iolog" => {
            let path = context.required(value)?.trim();
            if path.is_empty() {
                return Err(context.bad("needs the path of the iolog to write"));
            }
            spec.write_iolog = Some(path.to_string());
        }
        "read_iolog" => {
            let path = context.required(value)?.trim();
            if path.is_empty() {
                return Err(context.bad("needs the path of a fio iolog"));
            }
            spec.read_iolog = Some(path.to_string());
        }
        "replay_no_stall" => spec.replay_no_stall = parse_bool(&context, value)?,
        "replay_time_scale" => {
            let percent = parse_unsigned(context.required(value)?).map_err(|r| context.bad(r))?;
            spec.replay_time_scale_percent = match u32::try_from(percent) {
                Ok(0) | Err(_) => {
                    return Err(context.bad("a percentage of the log's rate, at least 1"))
                }
                Ok(p) => p,
            };
        }
        "replay_scale" => {
            let factor = parse_unsigned(context.required(value)?).map_err(|r| context.bad(r))?;
            spec.replay_scale = (factor > 1).then_some(factor);
        }
        "replay_align" => {
            let bytes = context
                .size(context.required(value)?)
                .map_err(|r| context.bad(r))?;
            if bytes > 0 && !bytes.is_power_of_two() {
                return Err(context.bad("must be a power of two"));
            }
            spec.replay_align_bytes = (bytes > 1).then_some(bytes);
        }
        "offset_align" => {
            let bytes = context
                .size(context.required(value)?)
                .map_err(|r| context.bad(r))?;
            spec.offset_align_bytes = (bytes > 0).then_some(bytes);
        }
        "verify" => {
            builder.verify_method = match context.required(value)?.to_ascii_lowercase().as_str() {
                "0" | "none" => false,
                method if VERIFY_METHODS.contains(&method) => true,
                _ => {
                    return Err(context.bad(format!(
                        "expected none or one of fio's methods ({})",
                        VERIFY_METHODS.join(", ")
                    )))
                }
            };
            spec.verify = builder.verify_method && builder.do_verify;
        }
        "do_verify" => {
            builder.do_verify = parse_bool(&context, value)?;
            spec.verify = builder.verify_method && builder.do_verify;
        }
        "startdelay" => {
            let text = context.required(value)?;
            if text.contains('-') {
                return Err(context.bad(
                    "a startdelay range (a random delay per job) is not supported; give one duration",
                ));
            }
            spec.start_delay_ns = parse_duration_ns(text).map_err(|r| context.bad(r))?;
        }
        "iodepth_batch_complete_min" | "iodepth_batch_complete" => {
            let min = parse_unsigned(context.required(value)?).map_err(|r| context.bad(r))?;
            spec.iodepth_batch_complete_min = Some(u32::try_from(min).unwrap_or(u32::MAX));
        }
        "steadystate" | "ss" => {
            spec.steady_state = parse_steady_criterion(&context, context.required(value)?)
                .map(|(metric, slope, limit, limit_is_percent)| SteadyState {
                    metric,
                    slope,
                    limit,
                    limit_is_percent,
                    ..spec.steady_state
                })
                .map_err(|r| context.bad(r))?
        }
        "steadystate_duration" | "ss_dur" => {
            spec.steady_state.duration_ns =
                parse_duration_ns(context.required(value)?).map_err(|r| context.bad(r))?
        }
        "steadystate_ramp_time" | "ss_ramp" => {
            spec.steady_state.ramp_ns =
                parse_duration_ns(context.required(value)?).map_err(|r| context.bad(r))?
        }
        "steadystate_check_interval" | "ss_interval" => {
            spec.steady_state.interval_ns =
                match parse_duration_ns(context.required(value)?).map_err(|r| context.bad(r))? {
                    // fio samples in whole milliseconds; a shorter period would also cost the
                    // simulation an event per period.
                    interval if interval < 1_000_000 => {
                        return Err(context.bad("the check interval must be at least 1 ms"))
                    }
                    interval => interval,
                }
        }
        "group_reporting" => spec.group_reporting = parse_bool(&context, value)?,
        // fio reads a bare number of these as microseconds.
        "latency_target" => {
            spec.latency_target.target_ns =
                parse_duration_ns_default_unit(context.required(value)?, NS_PER_US)
                    .map_err(|r| context.bad(r))?
        }
        "latency_window" => {
            spec.latency_target.window_ns =
                parse_duration_ns_default_unit(context.required(value)?, NS_PER_US)
                    .map_err(|r| context.bad(r))?
        }
        "latency_percentile" => {
            let text = context.required(value)?;
            spec.latency_target.percentile = match text.trim().parse::<f64>() {
                Ok(p) if p > 0.0 && p <= 100.0 => p,
                _ => return Err(context.bad("expected a percentage above 0, at most 100")),
            }
        }
        "latency_run" => spec.latency_target.keep_searching = parse_bool(&context, value)?,
        "max_latency" => {
            let mut limits = spec.max_latency_ns;
            parse_per_direction(&context, context.required(value)?, &mut limits, |text| {
                // fio reads 0 as "no limit" for that direction.
                parse_duration_ns_default_unit(text, NS_PER_US).map(|ns| (ns > 0).then_some(ns))
            })?;
            spec.max_latency_ns = limits;
        }
        "iodepth_low" => {
            let low = parse_unsigned(context.required(value)?).map_err(|r| context.bad(r))?;
            // fio reads 0, or a mark above the depth, as "keep the queue full".
            spec.iodepth_low = Some(u32::try_from(low).unwrap_or(u32::MAX));
        }
        "rate_min" | "ratemin" | "rate_iops_min" => {
            let bytes = key != "rate_iops_min";
            let mut values = [None; 3];
            parse_per_direction(&context, context.required(value)?, &mut values, |text| {
                if bytes {
                    context.size(text).map(Some)
                } else {
                    parse_unsigned(text).map(Some)
                }
            })?;
            for (rate, value) in spec.min_rates.iter_mut().zip(values) {
                match (value, bytes) {
                    (Some(v), true) => rate.bytes_per_s = v,
                    (Some(v), false) => rate.ios_per_s = v,
                    (None, _) => {}
                }
            }
        }
        "flow" => {
            spec.flow_weight =
                parse_unsigned(context.required(value)?).map_err(|r| context.bad(r))?
        }
        "flow_id" => {
            spec.flow_id = parse_unsigned(context.required(value)?).map_err(|r| context.bad(r))?
        }
        // fio's integer microseconds.
        "flow_sleep" => {
            spec.flow_sleep_ns = parse_unsigned(context.required(value)?)
                .map_err(|r| context.bad(r))?
                .saturating_mul(1_000)
        }
        "rate_cycle" | "ratecycle" => {
            // fio's integer milliseconds.
            spec.rate_cycle_ns = match parse_unsigned(context.required(value)?) {
                Ok(ms) if ms > 0 => ms.saturating_mul(1_000_000),
                Ok(_) => return Err(context.bad("the rate cycle must be positive")),
                Err(reason) => return Err(context.bad(reason)),
            }
        }
        "rate" | "rate_iops" => {
            let mut limits: [Option<RateLimit>; 3] = [None; 3];
            let bytes = key == "rate";
            parse_per_direction(&context, context.required(value)?, &mut limits, |text| {
                let number = if bytes {
                    context.size(text)?
                } else {
                    parse_unsigned(text)?
                };
                match number {
                    // fio reads 0 as "no cap" for that direction.
                    0 => Ok(None),
                    n if bytes => Ok(Some(RateLimit::BytesPerSecond(n))),
                    n => Ok(Some(RateLimit::IosPerSecond(n))),
                }
            })?;
            for (slot, limit) in spec.rate_limits.iter_mut().zip(limits) {
                let Some(limit) = limit else { continue };
                if let Some(other) =
                    slot.filter(|o| std::mem::discriminant(o) != std::mem::discriminant(&limit))
                {
                    let had = match other {
                        RateLimit::BytesPerSecond(n) => format!("rate = {n} bytes/s"),
                        RateLimit::IosPerSecond(n) => format!("rate_iops = {n}"),
                    };
                    return Err(context.bad(format!(
                        "a direction is capped by rate or by rate_iops, not both (it has {had})"
                    )));
                }
                *slot = Some(limit);
            }
        }
        "rate_process" => {
            spec.rate_poisson = match context.required(value)?.to_ascii_lowercase().as_str() {
                "linear" => false,
                "poisson" => true,
                _ => return Err(context.bad("expected linear or poisson")),
            }
        }
        "offset_increment" => {
            let increment = parse_size_spec(context.required(value)?, context.kb_base)
                .map_err(|r| context.bad(r))?;
            if let SizeSpec::Percent(percent) = increment {
                if !(0.0..=100.0).contains(&percent) {
                    return Err(context.bad("an offset_increment percentage must be in [0, 100]"));
                }
            }
            spec.offset_increment = increment;
        }
        "zonemode" => {
            spec.zone_mode = match context
                .required(value)?
                .trim()
                .to_ascii_lowercase()
                .as_str()
            {
                "none" => ZoneMode::None,
                "strided" => ZoneMode::Strided,
                "zbd" => {
                    return Err(WorkloadError::UnsupportedOption {
                        section: section.to_string(),
                        option: key.to_string(),
                        line,
                        reason: "zonemode=zbd drives a zoned block device (zones written \
                                 at their write pointer, zone resets, open-zone limits), \
                                 which is not modelled; zonemode=strided (I/O in one zone \
                                 at a time) is"
                            .to_string(),
                    })
                }
                _ => return Err(context.bad("expected none, strided or zbd")),
            }
        }
        "zonesize" => spec.zone_size_bytes = zone_bytes(&context, context.required(value)?)?,
        "zonerange" => spec.zone_range_bytes = zone_bytes(&context, context.required(value)?)?,
        "zoneskip" => {
            let text = context.required(value)?.trim();
            spec.zone_skip = match text.strip_suffix(['z', 'Z']) {
                // fio's `Nz`: a whole number of zones, counted in decimal.
                Some(count) => ZoneSkip::Zones(count.trim().parse::<u64>().map_err(|_| {
                    context.bad(format!(
                        "'{count}' is not a number of zones (zoneskip=Nz skips N zones)"
                    ))
                })?),
                None => ZoneSkip::Bytes(zone_bytes(&context, text)?),
            };
        }
        "sync" => {
            spec.fua_writes = match value.map(str::to_ascii_lowercase).as_deref() {
                Some("sync") | Some("dsync") => true,
                Some("none") => false,
                _ => parse_bool(&context, value).map_err(|_| {
                    context.bad("expected none, sync, dsync or a boolean (1/0, true/false)")
                })?,
            }
        }
        "name" => {
            spec.name = context.required(value)?.to_string();
            builder.name_from_option = true;
        }
        _ if IGNORED_OPTIONS.contains(&key) => {}
        _ if leaves_the_requests_alone(key, value) => {}
        _ => {
            let unmodelled = UNMODELLED_OPTIONS
                .iter()
                .find(|(names, _)| names.contains(&key));
            return Err(match unmodelled {
                Some((_, reason)) => WorkloadError::UnsupportedOption {
                    section: section.to_string(),
                    option: key.to_string(),
                    line,
                    reason: reason.to_string(),
                },
                None => WorkloadError::UnknownOption {
                    section: section.to_string(),
                    option: key.to_string(),
                    line,
                },
            });
        }
    }
    Ok(())
}

fn parse_rw(text: &str) -> Result<RwMode, String> {
    match text.to_ascii_lowercase().as_str() {
        "read" => Ok(RwMode::Read),
        "write" => Ok(RwMode::Write),
        "randread" => Ok(RwMode::RandRead),
        "randwrite" => Ok(RwMode::RandWrite),
        "rw" | "readwrite" => Ok(RwMode::ReadWrite),
        "randrw" => Ok(RwMode::RandRw),
        "trim" => Ok(RwMode::Trim),
        "randtrim" => Ok(RwMode::RandTrim),
        "trimwrite" => Ok(RwMode::TrimWrite),
        "randtrimwrite" => Ok(RwMode::RandTrimWrite),
        _ => Err(
            "expected read, write, randread, randwrite, rw, readwrite, randrw, trim, randtrim, \
             trimwrite or randtrimwrite"
                .to_string(),
        ),
    }
}

/// Applies a `read,write,trim` list to the three per-direction slots with fio's rules: an
/// empty entry keeps the slot's current value, and the last entry, when not followed by a
/// comma, also fills the directions after it.
fn parse_per_direction<T>(
    context: &OptionContext<'_>,
    text: &str,
    slots: &mut [T; 3],
    parse_one: impl Fn(&str) -> Result<T, String>,
) -> Result<(), WorkloadError> {
    let parts: Vec<&str> = text.split(',').map(str::trim).collect();
    if parts.len() > 3 {
        return Err(context.bad("at most three comma-separated values (read,write,trim)"));
    }
    if parts.iter().all(|part| part.is_empty()) {
        return Err(context.bad("the option needs a value"));
    }
    let last = parts.last().copied().unwrap_or("");
    for (index, slot) in slots.iter_mut().enumerate() {
        let part = parts.get(index).copied().unwrap_or(last);
        if !part.is_empty() {
            *slot = parse_one(part).map_err(|reason| context.bad(reason))?;
        }
    }
    Ok(())
}

/// Parses an option that fio allows per direction but that this crate keeps once: every
/// non-empty entry of a comma list must parse to the same value.
fn single_across_directions<T: PartialEq>(
    context: &OptionContext<'_>,
    text: &str,
    parse_one: impl Fn(&str) -> Result<T, String>,
) -> Result<T, WorkloadError> {
    let mut result: Option<T> = None;
    for part in text
        .split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
    {
        let value = parse_one(part).map_err(|reason| context.bad(reason))?;
        match &result {
            Some(previous) if *previous != value => {
                return Err(context.bad("different values per direction are not supported"))
            }
            _ => result = Some(value),
        }
    }
    result.ok_or_else(|| context.bad("the option needs a value"))
}

fn positive_size(text: &str, kb_base: u64) -> Result<u64, String> {
    match parse_size_with_kb_base(text, kb_base)? {
        0 => Err("must be greater than zero".to_string()),
        bytes => Ok(bytes),
    }
}

fn parse_block_size_range(text: &str, kb_base: u64) -> Result<BlockSizeSpec, String> {
    let (min_text, max_text) = text
        .split_once('-')
        .ok_or_else(|| format!("expected 'min-max', got '{text}'"))?;
    let min = positive_size(min_text, kb_base)?;
    let max = positive_size(max_text, kb_base)?;
    if min > max {
        return Err(format!("minimum {min} is larger than maximum {max}"));
    }
    Ok(BlockSizeSpec::Range { min, max })
}

fn parse_block_size_split(text: &str, kb_base: u64) -> Result<BlockSizeSpec, String> {
    let mut entries: Vec<(u64, Option<f64>)> = Vec::new();
    for entry in text.split(':').map(str::trim) {
        if entries.len() == MAX_BSSPLIT_ENTRIES {
            return Err(format!(
                "at most {MAX_BSSPLIT_ENTRIES} entries per direction"
            ));
        }
        if entry.is_empty() {
            return Err("empty entry (expected size/percent)".to_string());
        }
        let (size_text, percent_text) = match entry.split_once('/') {
            Some((size, percent)) => (size.trim(), percent.trim()),
            None => (entry, ""),
        };
        let bytes = positive_size(size_text, kb_base)?;
        let percent = if percent_text.is_empty() {
            None
        } else {
            let percent: f64 = percent_text
                .parse()
                .map_err(|_| format!("'{percent_text}' is not a percentage"))?;
            if !(0.0..=100.0).contains(&percent) {
                return Err(format!("percentage {percent_text} is not in [0, 100]"));
            }
            Some(percent)
        };
        entries.push((bytes, percent));
    }
    let given_sum: f64 = entries.iter().filter_map(|(_, percent)| *percent).sum();
    // A little slack lets `33.33:33.33:33.34`-style splits through despite rounding.
    if given_sum > 100.0 + 1e-9 {
        return Err(format!("percentages add up to {given_sum}, more than 100"));
    }
    let rest = (100.0 - given_sum).max(0.0);
    let missing = entries
        .iter()
        .filter(|(_, percent)| percent.is_none())
        .count();
    let mut split: Vec<(u64, f64)> = entries
        .iter()
        .map(|(bytes, percent)| (*bytes, percent.unwrap_or(rest / missing.max(1) as f64)))
        .collect();
    if missing == 0 && rest > 0.0 {
        // fio lets the last entry absorb whatever the percentages leave over.
        if let Some(last) = split.last_mut() {
            last.1 += rest;
        }
    }
    Ok(BlockSizeSpec::Split(split))
}

/// A `zonesize`, `zonerange` or `zoneskip` in bytes, under the section's `kb_base`; 0 is
/// allowed (fio's default: not given, or no skip).
fn zone_bytes(context: &OptionContext<'_>, text: &str) -> Result<u64, WorkloadError> {
    if text.trim_end().ends_with('%') {
        // fio reads a zone option's percentage as its internal encoding of one, which no
        // zone code decodes, so it is refused rather than given a meaning fio lacks.
        return Err(context.bad("a zone option takes a size, not a percentage"));
    }
    if text.trim_end().ends_with(['z', 'Z']) {
        return Err(context.bad("a number of zones (Nz) is only fio's for zoneskip; give a size"));
    }
    context
        .size(text.trim())
        .map_err(|reason| context.bad(reason))
}

fn parse_size_spec(text: &str, kb_base: u64) -> Result<SizeSpec, String> {
    match text.strip_suffix('%') {
        Some(number) => {
            let percent: f64 = number
                .trim()
                .parse()
                .map_err(|_| format!("'{text}' is not a percentage"))?;
            if !percent.is_finite() {
                return Err(format!("'{text}' is not a percentage"));
            }
            Ok(SizeSpec::Percent(percent))
        }
        None => parse_size_with_kb_base(text, kb_base).map(SizeSpec::Bytes),
    }
}

/// Parses a plain unsigned integer, decimal or `0x` hexadecimal, without unit suffixes.
fn parse_unsigned(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let parsed = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse::<u64>(),
    };
    parsed.map_err(|_| format!("'{text}' is not an unsigned integer"))
}

fn parse_at_least_one(context: &OptionContext<'_>, text: &str) -> Result<u32, WorkloadError> {
    let number = parse_unsigned(text).map_err(|reason| context.bad(reason))?;
    match u32::try_from(number) {
        Ok(0) => Err(context.bad("must be at least 1")),
        Ok(number) => Ok(number),
        Err(_) => Err(context.bad("is too large")),
    }
}

fn parse_percent(text: &str) -> Result<u32, String> {
    let number = parse_unsigned(text)?;
    if number > 100 {
        return Err("a percentage must be between 0 and 100".to_string());
    }
    // The range check above makes the conversion lossless.
    Ok(number as u32)
}

/// fio's `steadystate=CRITERION:LIMIT` (`str_steadystate_cb`): the metric, whether its
/// slope is judged, and the limit, as a percentage of the mean when it ends in `%`. A
/// bandwidth limit is a size per second (`bw:10M`), an IOPS limit a number.
fn parse_steady_criterion(
    context: &OptionContext<'_>,
    text: &str,
) -> Result<(SteadyMetric, bool, f64, bool), String> {
    let Some((criterion, limit)) = text.split_once(':') else {
        return Err(format!(
            "'{text}' needs a threshold after its criterion (for example iops_slope:0.1%)"
        ));
    };
    let (metric, slope) = match criterion.trim().to_ascii_lowercase().as_str() {
        "iops" => (SteadyMetric::Iops, false),
        "iops_slope" => (SteadyMetric::Iops, true),
        "bw" => (SteadyMetric::Bandwidth, false),
        "bw_slope" => (SteadyMetric::Bandwidth, true),
        other => {
            return Err(format!(
                "unknown criterion '{other}' (expected iops, iops_slope, bw or bw_slope)"
            ))
        }
    };
    let limit = limit.trim();
    let (limit, percent) = match limit.strip_suffix('%') {
        Some(number) => (parse_threshold(number.trim())?, true),
        None if metric == SteadyMetric::Bandwidth => (context.size(limit)? as f64, false),
        None => (parse_threshold(limit)?, false),
    };
    Ok((metric, slope, limit, percent))
}

/// A steady-state threshold: a finite number, not negative.
fn parse_threshold(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(value) if value.is_finite() && value >= 0.0 => Ok(value),
        _ => Err(format!("the threshold '{text}' is not a number at least 0")),
    }
}

fn parse_bool(context: &OptionContext<'_>, value: Option<&str>) -> Result<bool, WorkloadError> {
    match value.map(str::to_ascii_lowercase).as_deref() {
        None | Some("") | Some("1") | Some("true") | Some("yes") | Some("on") => Ok(true),
        Some("0") | Some("false") | Some("no") | Some("off") => Ok(false),
        Some(_) => Err(context.bad("expected a boolean (1/0, true/false, yes/no, on/off)")),
    }
}

fn parse_distribution(text: &str, kb_base: u64) -> Result<Distribution, String> {
    let lower = text.to_ascii_lowercase();
    for kind in ["zoned_abs", "zoned"] {
        if let Some(rest) = lower.strip_prefix(kind) {
            let absolute = kind == "zoned_abs";
            // fio writes `zoned_abs=...` with an `=` in its examples as well as `:`.
            let Some(list) = rest.strip_prefix(':').or_else(|| rest.strip_prefix('=')) else {
                return Err(format!("'{kind}' needs its zones ({kind}:ACCESS/SIZE:...)"));
            };
            return parse_zones(list, absolute, kb_base).map(|zones| Distribution::Zoned { zones });
        }
    }
    let mut parts = lower.split(':').map(str::trim);
    let kind = parts.next().unwrap_or("");
    let parameter = parts.next();
    if parts.next().is_some() {
        return Err("fio's ':center' part is not supported".to_string());
    }
    let number = |name: &str| -> Result<f64, String> {
        let text =
            parameter.ok_or_else(|| format!("'{kind}' needs a parameter ({kind}:{name})"))?;
        let value: f64 = text
            .parse()
            .map_err(|_| format!("'{text}' is not a number"))?;
        if value.is_finite() {
            Ok(value)
        } else {
            Err(format!("'{text}' is not a finite number"))
        }
    };
    match kind {
        "random" => match parameter {
            None => Ok(Distribution::Uniform),
            Some(_) => Err("'random' takes no parameter".to_string()),
        },
        "zipf" => {
            let theta = number("theta")?;
            if theta <= 0.0 {
                return Err("the zipf exponent must be greater than 0".to_string());
            }
            Ok(Distribution::Zipf { theta })
        }
        "pareto" => {
            let h = number("h")?;
            if !(h > 0.0 && h < 1.0) {
                return Err("the pareto shape must be strictly between 0 and 1".to_string());
            }
            Ok(Distribution::Pareto { h })
        }
        "normal" | "gauss" => {
            let sigma_percent = number("sigma")?;
            if !(0.0..100.0).contains(&sigma_percent) {
                return Err("the normal deviation must be in [0, 100) percent".to_string());
            }
            Ok(Distribution::Normal { sigma_percent })
        }
        _ => Err(
            "expected random, zipf:θ, pareto:h, normal:σ, gauss:σ, zoned:A/S:... or zoned_abs:A/SIZE:..."
                .to_string(),
        ),
    }
}

/// The zones of `zoned` (sizes in percent of the region) or `zoned_abs` (sizes in bytes):
/// `ACCESS/SIZE` entries joined by `:`, whose access shares add up to exactly 100.
fn parse_zones(list: &str, absolute: bool, kb_base: u64) -> Result<Vec<Zone>, String> {
    if list.contains(',') {
        return Err(
            "per-direction zones are not supported; give one set of zones for all directions"
                .to_string(),
        );
    }
    let mut zones = Vec::new();
    for entry in list.split(':').map(str::trim) {
        let (access, size) = entry
            .split_once('/')
            .ok_or_else(|| format!("zone '{entry}' is not ACCESS/SIZE"))?;
        let access_percent = parse_percent(access)?;
        let span = if absolute {
            match parse_size_with_kb_base(size, kb_base)? {
                0 => return Err(format!("zone '{entry}' has no size")),
                bytes => ZoneSpan::Bytes(bytes),
            }
        } else {
            match parse_percent(size)? {
                0 => return Err(format!("zone '{entry}' has no size")),
                percent => ZoneSpan::Percent(percent),
            }
        };
        zones.push(Zone {
            access_percent,
            span,
        });
    }
    validate_zones(&zones)?;
    Ok(zones)
}

/// The rules every zone list keeps, however it was built: at least one zone, access
/// shares adding up to 100, no empty zone, and shares of the region adding up to at most
/// 100.
pub(crate) fn validate_zones(zones: &[Zone]) -> Result<(), String> {
    if zones.is_empty() || zones.len() > MAX_ZONES {
        return Err(format!("a zoned distribution needs 1 to {MAX_ZONES} zones"));
    }
    let access: u64 = zones.iter().map(|z| u64::from(z.access_percent)).sum();
    if access != 100 {
        return Err(format!(
            "the zones' access percentages add up to {access}, not 100"
        ));
    }
    let mut region_percent = 0u64;
    for zone in zones {
        match zone.span {
            ZoneSpan::Percent(0) | ZoneSpan::Bytes(0) => {
                return Err("a zone has no size".to_string())
            }
            ZoneSpan::Percent(p) => region_percent += u64::from(p),
            ZoneSpan::Bytes(_) => {}
        }
    }
    if region_percent > 100 {
        return Err(format!(
            "the zones cover {region_percent} percent of the region, more than 100"
        ));
    }
    let mixed = zones
        .windows(2)
        .any(|w| std::mem::discriminant(&w[0].span) != std::mem::discriminant(&w[1].span));
    if mixed {
        return Err("a zone list mixes shares of the region with sizes".to_string());
    }
    Ok(())
}

#[cfg(test)]
mod tests;
