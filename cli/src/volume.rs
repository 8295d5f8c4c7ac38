//! Building the configured volume: one SSD, or an array engine over monitored SSDs. `afa
//! run`, `afa reproduce` and serve mode all build volumes here, so an engine is wired once.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use afa_array::{
    Array, ArrayConfig, LogRaid, LogRaidConfig, ScalaAfa, ScalaAfaConfig, Swan, SwanConfig,
    TwoPhase, TwoPhaseConfig,
};
use afa_host::{Monitored, RunOptions, Workload};
use afa_nand::{fill_unit, sector_token};
use afa_sim::{SimRng, TimeNs};
use afa_ssd::{
    BlockDevice, Command, Completion, DeviceError, DeviceInfo, HostWork, Precondition,
    PreconditionPattern, ReadBuffers, Ssd, SsdConfig,
};

use crate::config::ArrayRunConfig;

/// A member SSD with its bandwidth timeline.
pub type Member = Monitored<Ssd>;

/// An array engine over member SSDs.
#[derive(Debug)]
pub enum ArrayVolume {
    Raid(Array<Member>),
    Log(LogRaid<Member>),
    TwoPhase(TwoPhase<Member>),
    Swan(Swan<Member>),
    /// Boxed: the engine's host tables and daemon calendar make it several times larger
    /// than the other engines.
    ScalaAfa(Box<ScalaAfa<Member>>),
}

/// Which engine runs over the members, and its own table.
#[derive(Debug, Clone)]
pub enum EngineChoice {
    Raid,
    Log(LogRaidConfig),
    TwoPhase(TwoPhaseConfig),
    Swan(SwanConfig),
    ScalaAfa(ScalaAfaConfig),
}

/// Everything needed to build an array volume.
#[derive(Debug, Clone)]
pub struct ArraySpec {
    pub engine: ArrayConfig,
    pub choice: EngineChoice,
    pub spares: u32,
    /// Scheduled member failures as (member, time in ns).
    pub failures: Vec<(u32, TimeNs)>,
}

impl ArraySpec {
    pub fn from_config(a: &ArrayRunConfig) -> Self {
        let choice = match (&a.log, &a.two_phase, &a.swan, &a.scalaafa) {
            (Some(l), _, _, _) => EngineChoice::Log(l.clone()),
            (None, Some(t), _, _) => EngineChoice::TwoPhase(t.clone()),
            (None, None, Some(s), _) => EngineChoice::Swan(s.clone()),
            (None, None, None, Some(s)) => EngineChoice::ScalaAfa(s.clone()),
            (None, None, None, None) => EngineChoice::Raid,
        };
        Self {
            engine: a.engine(),
            choice,
            spares: a.spares,
            failures: a
                .failures
                .iter()
                .map(|f| (f.member, (f.at_ms * 1e6) as TimeNs))
                .collect(),
        }
    }
}

impl ArrayVolume {
    /// Builds the members from `ssd` (member i gets seed `seed + i`, spare j `seed + 1000
    /// + j`) and the engine over them, with the scheduled failures at their times.
    pub fn build(
        spec: &ArraySpec,
        ssd: &SsdConfig,
        seed: u64,
        timeline_interval_ns: u64,
    ) -> Result<Self, String> {
        let mut volume = Self::build_engine(spec, ssd, seed, timeline_interval_ns)?;
        volume.schedule_failures(&spec.failures, 0)?;
        Ok(volume)
    }

    /// Builds the volume as [`ArrayVolume::build`] does, then preconditions it through its
    /// engine ([`precondition`]) and zeroes every counter and member timeline, so the
    /// measured run reports only itself. That run must go through [`Shifted`] by the
    /// returned `epoch_ns`; the scheduled failures are that much later in engine time, so
    /// they keep their times in the measured run's clock.
    pub fn build_preconditioned(
        spec: &ArraySpec,
        ssd: &SsdConfig,
        seed: u64,
        timeline_interval_ns: u64,
        p: &Precondition,
    ) -> Result<(Self, Preconditioned), String> {
        let mut volume = Self::build_engine(spec, ssd, seed, timeline_interval_ns)?;
        let mut done = Preconditioned::default();
        if p.fill_fraction > 0.0 {
            let min_write_sectors = match &volume {
                ArrayVolume::Swan(_) => {
                    return Err(
                        "[precondition] does not apply to a SWAN volume: age it with array.swan.age_fraction, the paper's procedure"
                            .into(),
                    )
                }
                ArrayVolume::Raid(a) => a.min_write_sectors(),
                _ => 1,
            };
            // The fill writes whole flash pages, so that no member reads to merge, in units
            // the level accepts (raid5f takes only whole stripes, which need not be whole
            // pages): the least common multiple of both.
            let page_sectors = ssd.geometry.sectors_per_page() as u64;
            let unit_sectors =
                min_write_sectors / gcd(min_write_sectors, page_sectors) * page_sectors;
            done = precondition(volume.device(), p, seed, unit_sectors)?;
            let epoch_ns = done.epoch_ns;
            let member = |m: &mut Member| {
                m.inner_mut().reset_counters();
                m.restart_at(epoch_ns);
            };
            match &mut volume {
                ArrayVolume::Raid(a) => a.reset_counters(member),
                ArrayVolume::Log(l) => l.reset_counters(member),
                ArrayVolume::TwoPhase(t) => t.reset_counters(member),
                ArrayVolume::ScalaAfa(s) => s.reset_counters(member),
                ArrayVolume::Swan(_) => unreachable!("refused above"),
            }
        }
        volume.schedule_failures(&spec.failures, done.epoch_ns)?;
        Ok((volume, done))
    }

    fn build_engine(
        spec: &ArraySpec,
        ssd: &SsdConfig,
        seed: u64,
        timeline_interval_ns: u64,
    ) -> Result<Self, String> {
        let member = |seed: u64| -> Result<Member, String> {
            let ssd = Ssd::new(ssd.clone(), seed).map_err(|e| e.to_string())?;
            Ok(Monitored::new(ssd, timeline_interval_ns))
        };
        let members = (0..spec.engine.members as u64)
            .map(|i| member(seed.wrapping_add(i)))
            .collect::<Result<Vec<_>, _>>()?;
        let spares = (0..spec.spares as u64)
            .map(|i| member(seed.wrapping_add(1000 + i)))
            .collect::<Result<Vec<_>, _>>()?;
        let mut volume = match &spec.choice {
            EngineChoice::TwoPhase(t) => ArrayVolume::TwoPhase(
                TwoPhase::new(spec.engine.clone(), t.clone(), members, spares)
                    .map_err(|e| e.to_string())?,
            ),
            EngineChoice::Swan(c) => ArrayVolume::Swan(
                Swan::new(spec.engine.clone(), c.clone(), members, spares)
                    .map_err(|e| format!("array.swan: {e}"))?,
            ),
            EngineChoice::ScalaAfa(s) => ArrayVolume::ScalaAfa(Box::new(
                ScalaAfa::new(spec.engine.clone(), s.clone(), members, spares)
                    .map_err(|e| e.to_string())?,
            )),
            EngineChoice::Raid | EngineChoice::Log(_) => {
                let array =
                    Array::new(spec.engine.clone(), members, spares).map_err(|e| e.to_string())?;
                match &spec.choice {
                    EngineChoice::Log(c) => ArrayVolume::Log(
                        LogRaid::new(array, c.clone())
                            .map_err(|e| engine_config_error("array.log", e))?,
                    ),
                    _ => ArrayVolume::Raid(array),
                }
            }
        };
        if let ArrayVolume::Swan(s) = &mut volume {
            let fraction = s.config().age_fraction;
            if fraction > 0.0 && ssd.payload != afa_nand::PayloadMode::None {
                return Err(
                    "array.swan.age_fraction needs ssd.payload = \"none\": the run's oracle cannot know what aging wrote"
                        .into(),
                );
            }
            if fraction > 0.0 {
                let epoch = age(s, fraction, seed)?;
                s.set_epoch(epoch);
            }
        }
        Ok(volume)
    }

    /// Schedules `failures` (member, time) at `epoch_ns` + their times.
    fn schedule_failures(
        &mut self,
        failures: &[(u32, TimeNs)],
        epoch_ns: TimeNs,
    ) -> Result<(), String> {
        let failed = |name: &str, r: Result<(), afa_array::ArrayError>| {
            r.map_err(|e| format!("array.failures: {name}: {e}"))
        };
        for &(member, at_ns) in failures {
            let (m, at_ns) = (member as usize, epoch_ns + at_ns);
            match self {
                ArrayVolume::Raid(a) => failed("raid", a.schedule_failure(m, at_ns))?,
                ArrayVolume::Log(l) => {
                    failed("log-raid", l.array_mut().schedule_failure(m, at_ns))?
                }
                ArrayVolume::TwoPhase(t) => failed("two-phase", t.schedule_failure(m, at_ns))?,
                ArrayVolume::Swan(s) => failed("swan", s.schedule_failure(m, at_ns))?,
                ArrayVolume::ScalaAfa(s) => failed("scalaafa", s.schedule_failure(m, at_ns))?,
            }
        }
        Ok(())
    }

    pub fn device(&mut self) -> &mut dyn BlockDevice {
        match self {
            ArrayVolume::Raid(a) => a,
            ArrayVolume::Log(l) => l,
            ArrayVolume::TwoPhase(t) => t,
            ArrayVolume::Swan(s) => s,
            ArrayVolume::ScalaAfa(s) => s.as_mut(),
        }
    }

    pub fn device_ref(&self) -> &dyn BlockDevice {
        match self {
            ArrayVolume::Raid(a) => a,
            ArrayVolume::Log(l) => l,
            ArrayVolume::TwoPhase(t) => t,
            ArrayVolume::Swan(s) => s,
            ArrayVolume::ScalaAfa(s) => s.as_ref(),
        }
    }

    pub fn members(&self) -> Vec<&Member> {
        match self {
            ArrayVolume::Raid(a) => a.members().collect(),
            ArrayVolume::Log(l) => l.array().members().collect(),
            ArrayVolume::TwoPhase(t) => t.members().collect(),
            ArrayVolume::Swan(s) => s.members().collect(),
            ArrayVolume::ScalaAfa(s) => s.members().collect(),
        }
    }

    /// The members, to reset or read their monitors (see [`Monitored`]).
    pub fn members_mut(&mut self) -> Vec<&mut Member> {
        match self {
            ArrayVolume::Raid(a) => a.members_mut().collect(),
            ArrayVolume::Log(l) => l.array_mut().members_mut().collect(),
            ArrayVolume::TwoPhase(t) => t.members_mut().collect(),
            ArrayVolume::Swan(s) => s.members_mut().collect(),
            ArrayVolume::ScalaAfa(s) => s.members_mut().collect(),
        }
    }

    /// Sectors the user asked the volume to write.
    pub fn user_write_sectors(&self) -> u64 {
        match self {
            ArrayVolume::Raid(a) => a.stats().user_write_sectors,
            ArrayVolume::Log(l) => l.stats().user_sectors,
            ArrayVolume::TwoPhase(t) => t.stats().user_write_sectors,
            ArrayVolume::Swan(s) => s.stats().user_sectors,
            ArrayVolume::ScalaAfa(s) => s.stats().user_write_sectors,
        }
    }

    /// Sectors the engine wrote to its members.
    pub fn member_write_sectors(&self) -> u64 {
        match self {
            ArrayVolume::Raid(a) => a.stats().member_write_sectors,
            ArrayVolume::Log(l) => l.array().stats().member_write_sectors,
            ArrayVolume::TwoPhase(t) => t.stats().member_write_sectors,
            ArrayVolume::Swan(s) => s.member_write_sectors(),
            ArrayVolume::ScalaAfa(s) => s.stats().member_write_sectors,
        }
    }

    /// The engine's counters for the report, with the array-level write amplification
    /// (member writes per user write).
    pub fn engine_json(&self) -> serde_json::Value {
        let mut json = match self {
            ArrayVolume::Raid(a) => serde_json::to_value(a.stats()),
            ArrayVolume::Log(l) => {
                let mut v = serde_json::to_value(l.array().stats()).unwrap_or_default();
                v["log"] = serde_json::to_value(l.stats()).unwrap_or_default();
                Ok(v)
            }
            ArrayVolume::TwoPhase(t) => {
                let mut v = serde_json::to_value(t.stats()).unwrap_or_default();
                v["watermark_chunks"] = serde_json::json!(t.watermark_chunks());
                Ok(v)
            }
            ArrayVolume::Swan(s) => {
                let mut v = serde_json::to_value(s.stats()).unwrap_or_default();
                let width = s.group_width();
                let groups: Vec<Vec<usize>> = (0..s.groups().len())
                    .map(|g| (g * width..(g + 1) * width).collect())
                    .collect();
                v["groups"] = serde_json::json!(groups);
                v["degraded_reads"] = serde_json::json!(s.degraded_reads());
                let (segment_blocks, summary_blocks) = s.segment_blocks();
                v["segment_blocks"] = serde_json::json!(segment_blocks);
                v["summary_blocks_per_segment"] = serde_json::json!(summary_blocks);
                Ok(v)
            }
            ArrayVolume::ScalaAfa(s) => {
                let mut v = serde_json::to_value(s.stats()).unwrap_or_default();
                v["mode"] = serde_json::to_value(s.scala_config().mode).unwrap_or_default();
                v["replicated_chunks"] = serde_json::json!(s.replicated_chunks());
                Ok(v)
            }
        }
        .unwrap_or_default();
        let user = self.user_write_sectors();
        json["write_amplification"] = serde_json::json!(if user == 0 {
            0.0
        } else {
            self.member_write_sectors() as f64 / user as f64
        });
        json
    }
}

/// What [`precondition`] did: the engine time the measured run starts at, and the sectors
/// `0..sectors` that hold their preconditioning content.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Preconditioned {
    pub epoch_ns: TimeNs,
    pub sectors: u64,
}

/// Requests kept in flight while preconditioning.
const PRECONDITION_QUEUE_DEPTH: u32 = 32;
/// Sequential fill requests are this large (rounded down to the write unit).
const PRECONDITION_REQUEST_BYTES: u64 = 1 << 20;

/// The greatest common divisor of two positive numbers.
fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// An engine's refusal of its configuration, under the section it came from. Engines refuse
/// a configuration with `DeviceError::Unsupported`, whose "command not supported" wording
/// is for commands, so only its text is kept.
pub fn engine_config_error(section: &str, e: afa_ssd::DeviceError) -> String {
    match e {
        afa_ssd::DeviceError::Unsupported(text) => format!("{section}: {text}"),
        other => format!("{section}: {other}"),
    }
}

/// Preconditions a volume by writing `p`'s fill through it as a host would, unmeasured:
/// the sectors `0 .. floor(capacity × fill_fraction)` (rounded down to `unit_sectors`) in
/// order, then for `random-simulated` `overwrite_rounds` × (filled / unit) overwrites of
/// `unit_sectors` at uniform random unit-aligned places of the filled range. Every write
/// carries `sector_token(lba, 0)`, as an SSD's own preconditioning stores, so the run's
/// oracle checks every read of the filled range.
///
/// Unlike one SSD's preconditioning this is simulated history: an array engine's mapping,
/// parity and log can only be known by running it, so the members spend NAND time and the
/// measured run starts when the last fill write completes (`epoch_ns`, see [`Shifted`]).
/// The `random` pattern builds one SSD's steady state from its GC model and is refused.
pub fn precondition(
    device: &mut dyn BlockDevice,
    p: &Precondition,
    seed: u64,
    unit_sectors: u64,
) -> Result<Preconditioned, String> {
    p.validate().map_err(|e| e.to_string())?;
    if p.pattern == PreconditionPattern::Random {
        return Err("precondition.pattern = \"random\" builds one SSD's steady state from its GC model and cannot be applied through an array engine; use \"random-simulated\" or \"sequential\" with [array]".into());
    }
    let info = device.info();
    let unit = unit_sectors.max(1);
    if unit > info.max_transfer_sectors as u64 {
        return Err(format!(
            "preconditioning: the volume's write unit of {unit} sectors exceeds its transfer limit of {} sectors",
            info.max_transfer_sectors
        ));
    }
    let filled = (info.capacity_sectors as f64 * p.fill_fraction).floor() as u64 / unit * unit;
    if filled == 0 {
        return Ok(Preconditioned::default());
    }
    let sector_bytes = info.sector_bytes as u64;
    let request = (PRECONDITION_REQUEST_BYTES / sector_bytes)
        .min(info.max_transfer_sectors as u64)
        .max(unit)
        / unit
        * unit;
    let mut filler = Filler {
        device,
        queue_depth: PRECONDITION_QUEUE_DEPTH.min(info.max_queue_depth).max(1) as usize,
        in_flight: BinaryHeap::new(),
        now_ns: 0,
        last_done_ns: 0,
        unit_bytes: info.payload_unit_bytes as usize,
        payload: Vec::new(),
    };
    let mut lba = 0;
    while lba < filled {
        let sectors = request.min(filled - lba);
        filler.write(lba, sectors)?;
        lba += sectors;
    }
    if p.pattern == PreconditionPattern::RandomSimulated {
        let mut rng = SimRng::fork(seed, 0x5052_4543); // "PREC", as one SSD's overwrites
        let units = filled / unit;
        for _ in 0..(units as f64 * p.overwrite_rounds) as u64 {
            filler.write(rng.below(units) * unit, unit)?;
        }
    }
    Ok(Preconditioned {
        epoch_ns: filler.last_done_ns,
        sectors: filled,
    })
}

/// A closed loop of writes at a fixed queue depth: each write is submitted when the
/// earliest outstanding one completes, once `queue_depth` are outstanding. The fill does not
/// go through the host driver (`afa_host::run`, as aging does) because its oracle gives every
/// write a new version, and the fill must leave version 0 everywhere for the measured run's.
struct Filler<'d> {
    device: &'d mut dyn BlockDevice,
    queue_depth: usize,
    in_flight: BinaryHeap<Reverse<TimeNs>>,
    now_ns: TimeNs,
    last_done_ns: TimeNs,
    unit_bytes: usize,
    payload: Vec<u8>,
}

impl Filler<'_> {
    fn write(&mut self, lba: u64, sectors: u64) -> Result<(), String> {
        if self.in_flight.len() >= self.queue_depth {
            if let Some(Reverse(t)) = self.in_flight.pop() {
                self.now_ns = self.now_ns.max(t);
            }
        }
        let u = self.unit_bytes;
        self.payload.resize(sectors as usize * u, 0);
        if u > 0 {
            for (i, out) in self.payload.chunks_mut(u).enumerate() {
                fill_unit(sector_token(lba + i as u64, 0), out);
            }
        }
        let c = self
            .device
            .submit(
                self.now_ns,
                &Command::write(lba, sectors as u32, &self.payload),
                ReadBuffers::none(),
            )
            .map_err(|e| format!("preconditioning: write of {sectors} sectors at {lba}: {e}"))?;
        self.last_done_ns = self.last_done_ns.max(c.done_ns);
        self.in_flight.push(Reverse(c.done_ns));
        Ok(())
    }
}

/// Aging (SWAN §5): every SSD is trimmed, then random 8 KiB writes amounting to `fraction` of
/// the volume's capacity are made, unmeasured. Returns the simulated time aging ended; run
/// the measured workload through [`Shifted`] by that much (SWAN takes it as its epoch).
pub fn age(device: &mut dyn BlockDevice, fraction: f64, seed: u64) -> Result<TimeNs, String> {
    if !(0.0..1.0).contains(&fraction) {
        return Err(format!("age fraction {fraction} must lie in [0, 1)"));
    }
    let info = device.info();
    // Freshly built SSDs are clean; the trim is the step the paper takes on used ones.
    let c = device
        .submit(
            0,
            &Command::trim(0, info.capacity_sectors.min(u32::MAX as u64) as u32),
            ReadBuffers::none(),
        )
        .map_err(|e| format!("aging: trim: {e}"))?;
    let capacity = info.capacity_sectors * info.sector_bytes as u64;
    let bytes = ((capacity as f64 * fraction) as u64) / 8192 * 8192;
    if bytes == 0 {
        return Ok(c.done_ns);
    }
    let job = format!("[age]\nrw=randwrite\nbs=8k\niodepth=64\nsize={capacity}\nio_size={bytes}\n");
    let jobs = afa_workload::fio::parse_job_file(&job).map_err(|e| format!("aging job: {e}"))?;
    let options = RunOptions {
        seed: seed ^ 0xa9e,
        timeline_interval_ns: 0,
        preconditioned_sectors: 0,
        background_work: false,
        show_progress: false,
        record_requests: false,
    };
    let mut shifted = Shifted {
        device,
        epoch_ns: c.done_ns,
    };
    let outcome = afa_host::run(&mut shifted, &Workload::Jobs(jobs), &options)
        .map_err(|e| format!("aging: {e}"))?;
    Ok(c.done_ns + outcome.sim_time_ns)
}

/// A device whose clock runs `epoch_ns` ahead of its user's: the user starts at 0 and the
/// device sees `epoch_ns`, so a measured run can follow aging without waiting for it.
#[derive(Debug)]
pub struct Shifted<D> {
    pub device: D,
    pub epoch_ns: TimeNs,
}

impl<D: BlockDevice> BlockDevice for Shifted<D> {
    fn info(&self) -> DeviceInfo {
        self.device.info()
    }

    fn media_faults(&self) -> afa_nand::MediaFaults {
        self.device.media_faults()
    }
    fn submit(
        &mut self,
        now_ns: TimeNs,
        cmd: &Command<'_>,
        out: ReadBuffers<'_>,
    ) -> Result<Completion, DeviceError> {
        let c = self.device.submit(now_ns + self.epoch_ns, cmd, out)?;
        Ok(Completion {
            done_ns: c.done_ns.saturating_sub(self.epoch_ns),
            ..c
        })
    }
    fn prefetch(&self, lba: u64, stage: u8) {
        self.device.prefetch(lba, stage)
    }
    fn background(&mut self, now_ns: TimeNs) -> Option<TimeNs> {
        self.device
            .background(now_ns + self.epoch_ns)
            .map(|t| t.saturating_sub(self.epoch_ns))
    }
    fn take_host_work(&mut self) -> HostWork {
        self.device.take_host_work()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use afa_array::{ArrayConfig, Level};

    /// Degraded reads of a 4 KiB random-read run over a RAID 5 volume filled halfway, with
    /// member 1 failing `fail_at_ns` into the measured run; also the fill's end in engine
    /// time and the run's length.
    fn degraded_reads_with_failure_at(fail_at_ns: TimeNs) -> (u64, TimeNs, TimeNs) {
        let ssd = SsdConfig {
            payload: afa_nand::PayloadMode::Token,
            geometry: afa_nand::Geometry {
                channels: 2,
                chips_per_channel: 1,
                dies_per_chip: 2,
                planes_per_die: 1,
                blocks_per_plane: 64,
                pages_per_block: 64,
                page_bytes: 4096,
                sector_bytes: 4096,
                ..afa_nand::Geometry::default()
            },
            ..SsdConfig::default()
        };
        let spec = ArraySpec {
            engine: ArrayConfig {
                level: Level::Raid5,
                members: 4,
                ..ArrayConfig::default()
            },
            choice: EngineChoice::Raid,
            spares: 0,
            failures: vec![(1, fail_at_ns)],
        };
        let fill = Precondition {
            fill_fraction: 0.5,
            ..Precondition::default()
        };
        let (mut volume, pre) =
            ArrayVolume::build_preconditioned(&spec, &ssd, 3, 0, &fill).expect("the volume builds");
        let job = "[r]\nrw=randread\nbs=4k\niodepth=16\nio_size=2m\n";
        let jobs = afa_workload::fio::parse_job_file(job).unwrap();
        let options = RunOptions {
            seed: 3,
            timeline_interval_ns: 0,
            preconditioned_sectors: pre.sectors,
            background_work: true,
            show_progress: false,
            record_requests: false,
        };
        let mut device = Shifted {
            device: volume.device(),
            epoch_ns: pre.epoch_ns,
        };
        let outcome = afa_host::run(&mut device, &Workload::Jobs(jobs), &options).unwrap();
        assert_eq!(outcome.mismatches, 0);
        assert!(outcome.reads_checked > 0);
        let degraded = volume.engine_json()["degraded_reads"].as_u64().unwrap();
        (degraded, pre.epoch_ns, outcome.sim_time_ns)
    }

    /// A failure scheduled at t ms happens t ms into the measured run, not t ms into the
    /// fill that came before it.
    #[test]
    fn scheduled_failures_keep_their_time_in_the_measured_run() {
        let (degraded, epoch_ns, run_ns) = degraded_reads_with_failure_at(0);
        assert!(
            degraded > 0,
            "a member failed at the run's start degrades its reads"
        );
        let after_run_ns = run_ns + 1_000_000;
        assert!(
            after_run_ns < epoch_ns,
            "the fill ({epoch_ns} ns) must outlast the run ({run_ns} ns) for this test"
        );
        let (degraded, ..) = degraded_reads_with_failure_at(after_run_ns);
        assert_eq!(degraded, 0, "the failure is due after the run ends");
    }
}
