//! Building the configured volume: one SSD, or an array engine over monitored SSDs. `afa
//! run`, `afa reproduce` and serve mode all build volumes here, so an engine is wired once.

use afa_array::{
    Array, ArrayConfig, LogRaid, LogRaidConfig, ScalaAfa, ScalaAfaConfig, Swan, SwanConfig,
    TwoPhase, TwoPhaseConfig,
};
use afa_host::{Monitored, RunOptions, Workload};
use afa_sim::TimeNs;
use afa_ssd::{
    BlockDevice, Command, Completion, DeviceError, DeviceInfo, HostWork, ReadBuffers, Ssd,
    SsdConfig,
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
    /// + j`) and the engine over them.
    pub fn build(
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
        let failures = |name: &str, r: Result<(), afa_array::ArrayError>| {
            r.map_err(|e| format!("array.failures: {name}: {e}"))
        };
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
                        LogRaid::new(array, c.clone()).map_err(|e| format!("array.log: {e}"))?,
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
        for &(member, at_ns) in &spec.failures {
            let m = member as usize;
            match &mut volume {
                ArrayVolume::Raid(a) => failures("raid", a.schedule_failure(m, at_ns))?,
                ArrayVolume::Log(l) => {
                    failures("log-raid", l.array_mut().schedule_failure(m, at_ns))?
                }
                ArrayVolume::TwoPhase(t) => failures("two-phase", t.schedule_failure(m, at_ns))?,
                ArrayVolume::Swan(s) => failures("swan", s.schedule_failure(m, at_ns))?,
                ArrayVolume::ScalaAfa(s) => failures("scalaafa", s.schedule_failure(m, at_ns))?,
            }
        }
        Ok(volume)
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

    pub fn members(&self) -> Vec<&Member> {
        match self {
            ArrayVolume::Raid(a) => a.members().collect(),
            ArrayVolume::Log(l) => l.array().members().collect(),
            ArrayVolume::TwoPhase(t) => t.members().collect(),
            ArrayVolume::Swan(s) => s.members().collect(),
            ArrayVolume::ScalaAfa(s) => s.members().collect(),
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
