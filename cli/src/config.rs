//! The TOML run configuration: the device, its preconditioning, the workload and the report.
//! Every key is listed with its unit and default in docs/configuration.md.

use std::path::{Path, PathBuf};

use afa_ssd::{Precondition, SsdConfig};
use serde::{Deserialize, Serialize};

/// The configuration embedded in the binary, used when `afa run` gets no file.
pub const DEFAULT_CONFIG: &str = include_str!("default.toml");

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunConfig {
    pub seed: u64,
    pub ssd: SsdConfig,
    pub precondition: Precondition,
    /// An array of identical SSDs (each as `[ssd]`) instead of one SSD.
    pub array: Option<ArrayRunConfig>,
    /// The host CPU model (`[host]`): I/O threads and a software-stack profile. Without it
    /// the host is infinitely fast.
    pub host: Option<afa_host::CpuConfig>,
    /// A WAFLASH SSD instead of `[ssd]` (`[waflash.ssd]`, optional `[waflash.filebench]`).
    pub waflash: Option<crate::waflash::WaflashRunConfig>,
    /// One OX SSD (OXBlock, the in-SSD log-structured FTL behind a block interface) instead
    /// of `[ssd]`, served by `afa serve` (`[ox]` with the keys of `afa_ox::OxConfig`).
    pub ox: Option<afa_ox::OxConfig>,
    pub workload: WorkloadConfig,
    pub report: ReportConfig,
}

/// The `[array]` table: the engine, spares and scheduled member failures.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArrayRunConfig {
    pub level: afa_array::Level,
    pub members: u32,
    #[serde(default = "default_chunk_bytes")]
    pub chunk_bytes: u64,
    #[serde(default = "default_parity_mb_s")]
    pub parity_mb_s: f64,
    #[serde(default = "default_rebuild_mb_s")]
    pub rebuild_mb_s: f64,
    /// mdraid's stripe cache in stripes (0: off).
    #[serde(default)]
    pub stripe_cache_stripes: u32,
    /// Spare SSDs that replace failed members and are rebuilt onto.
    #[serde(default)]
    pub spares: u32,
    #[serde(default)]
    pub failures: Vec<FailureConfig>,
    /// Log-RAID on top of the array (raid0, raid4 or raid5): `[array.log]`.
    #[serde(default)]
    pub log: Option<afa_array::LogRaidConfig>,
    /// Two-phase write with host conversion (FusionRAID-style) converting into `level`
    /// stripes (raid5 or raid6): `[array.two_phase]`.
    #[serde(default)]
    pub two_phase: Option<afa_array::TwoPhaseConfig>,
    /// SWAN: the members split into R-groups of `level` (raid0, raid4 or raid5), one
    /// front-end taking writes, GC in one back-end group at a time: `[array.swan]`.
    #[serde(default)]
    pub swan: Option<afa_array::SwanConfig>,
    /// ScalaAFA (or its ablations scala-co and scala-wr, by `mode`) converting into
    /// `level` stripes: `[array.scalaafa]`.
    #[serde(default)]
    pub scalaafa: Option<afa_array::ScalaAfaConfig>,
}

/// The simulated clock's range in milliseconds: u64 nanoseconds.
const MAX_SIMULATED_MS: f64 = u64::MAX as f64 / afa_sim::NS_PER_MS as f64;

/// One scheduled member failure.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailureConfig {
    pub member: u32,
    /// Simulated time of the failure, in milliseconds.
    pub at_ms: f64,
}

fn default_chunk_bytes() -> u64 {
    afa_array::ArrayConfig::default().chunk_bytes
}
fn default_parity_mb_s() -> f64 {
    afa_array::ArrayConfig::default().parity_mb_s
}
fn default_rebuild_mb_s() -> f64 {
    afa_array::ArrayConfig::default().rebuild_mb_s
}

impl ArrayRunConfig {
    pub fn engine(&self) -> afa_array::ArrayConfig {
        afa_array::ArrayConfig {
            level: self.level,
            members: self.members,
            chunk_bytes: self.chunk_bytes,
            parity_mb_s: self.parity_mb_s,
            rebuild_mb_s: self.rebuild_mb_s,
            stripe_cache_stripes: self.stripe_cache_stripes,
        }
    }
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            seed: 1,
            ssd: SsdConfig::default(),
            precondition: Precondition::default(),
            array: None,
            host: None,
            waflash: None,
            ox: None,
            workload: WorkloadConfig::default(),
            report: ReportConfig::default(),
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkloadConfig {
    /// A fio job file, relative to the configuration file.
    pub job_file: Option<PathBuf>,
    /// A fio job file written inline.
    pub job: Option<String>,
    pub trace: Option<TraceConfig>,
    /// Give the device idle time for background GC between requests (default true).
    pub background_work: Option<bool>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceConfig {
    /// Trace file, relative to the configuration file.
    pub path: PathBuf,
    /// "msr" (MSR Cambridge CSV), "blkparse" (blkparse text output), "fiu" (FIU IODedup),
    /// "iolog" (fio iolog v2/v3), "ascii" (SSDSim/MQSim), "spc" (Storage Performance Council),
    /// "alibaba" (Alibaba Cloud block traces 2020) or "tencent" (Tencent CBS traces 2018).
    pub format: String,
    /// "timed" (issue at the trace's timestamps) or "closed" (as fast as iodepth allows).
    #[serde(default = "default_replay")]
    pub replay: String,
    #[serde(default = "default_iodepth")]
    pub iodepth: u32,
    /// Multiplier on trace timestamps in timed replay (0.5 replays twice as fast).
    #[serde(default = "default_scale")]
    pub time_scale: f64,
    /// Keeps only these volumes of the trace, laid side by side in this order (docs/traces.md).
    #[serde(default)]
    pub volumes: Vec<u32>,
    /// Distance between laid-out volumes in bytes (default: the largest end offset rounded up
    /// to 1 MiB).
    #[serde(default)]
    pub volume_stride_bytes: Option<u64>,
}

fn default_replay() -> String {
    "timed".into()
}
fn default_iodepth() -> u32 {
    32
}
fn default_scale() -> f64 {
    1.0
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReportConfig {
    /// Width of a throughput-timeline bucket in milliseconds of simulated time (0: none).
    pub timeline_interval_ms: f64,
}

impl Default for ReportConfig {
    fn default() -> Self {
        Self {
            timeline_interval_ms: 10.0,
        }
    }
}

/// A configuration and the directory its relative paths are resolved against.
#[derive(Debug)]
pub struct LoadedConfig {
    pub config: RunConfig,
    pub base_dir: PathBuf,
    pub source: String,
}

/// One `--set KEY=VALUE` of the command line: a dotted key of the configuration (tables
/// created on the way) or `job.OPTION`, a fio option appended to every job section of the
/// workload (so it wins over what the section and `[global]` say).
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    pub key: String,
    pub value: toml::Value,
}

impl std::str::FromStr for Override {
    type Err = String;

    /// Parses `KEY=VALUE`; VALUE is a TOML value (`0.2`, `true`, `"raid6"`, `[1, 2]`) or,
    /// if it is none, the text itself as a string, so that `--set array.level=raid6` needs
    /// no quotes.
    fn from_str(text: &str) -> Result<Self, String> {
        let Some((key, value)) = text.split_once('=') else {
            return Err(format!("--set {text}: expected KEY=VALUE"));
        };
        let key = key.trim();
        crate::sweep::check_key(key).map_err(|e| format!("--set {text}: {e}"))?;
        let value = value.trim();
        let parsed = toml::from_str::<toml::Table>(&format!("v = {value}"))
            .ok()
            .and_then(|mut t| t.remove("v"));
        Ok(Override {
            key: key.to_string(),
            value: parsed.unwrap_or_else(|| toml::Value::String(value.to_string())),
        })
    }
}

/// The configuration at `path` (or the embedded default) with `overrides` applied, the
/// directory its relative paths are resolved against, and how errors name it.
pub fn read_config(
    path: Option<&Path>,
    overrides: &[Override],
    job_file: Option<&Path>,
) -> Result<(RunConfig, PathBuf, String), String> {
    let (text, base_dir, source) = match path {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .map_err(|e| format!("cannot read configuration {}: {e}", p.display()))?;
            let dir = p.parent().map(Path::to_path_buf).unwrap_or_default();
            (text, dir, p.display().to_string())
        }
        None => (
            DEFAULT_CONFIG.to_string(),
            PathBuf::from("."),
            "embedded default".to_string(),
        ),
    };
    let not_toml = |e: toml::de::Error| {
        // A fio job file given where the configuration goes is the likeliest mistake of a
        // fio user: say how to run it.
        let looks_like_fio = path.is_some_and(|p| p.extension().is_some_and(|x| x == "fio"))
            || afa_workload::fio::parse_job_file(&text).is_ok();
        if looks_like_fio {
            format!(
                "configuration {source} is a fio job file, not a configuration: run it with \
                 `afa run --job {source}` (on the embedded default's SSD), or `afa run CONFIG \
                 --job {source}` for another device"
            )
        } else {
            format!("configuration {source}: {e}")
        }
    };
    if overrides.is_empty() && job_file.is_none() {
        // Straight from the text, so that an error names its line.
        let config: RunConfig = toml::from_str(&text).map_err(not_toml)?;
        return Ok((config, base_dir, source));
    }
    let mut table: toml::Table = toml::from_str(&text).map_err(not_toml)?;
    if let Some(job_file) = job_file {
        // `--job` replaces the configuration's workload, whatever it was; the path is the
        // caller's, so it is made absolute rather than read from the configuration's folder.
        let job_file = std::path::absolute(job_file)
            .map_err(|e| format!("--job {}: {e}", job_file.display()))?;
        let workload = table
            .entry("workload")
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let toml::Value::Table(workload) = workload else {
            return Err(format!("configuration {source}: workload is not a table"));
        };
        workload.remove("job");
        workload.remove("trace");
        workload.insert(
            "job_file".to_string(),
            toml::Value::String(job_file.display().to_string()),
        );
        // A WAFLASH device's Filebench personality is a workload too.
        if let Some(toml::Value::Table(waflash)) = table.get_mut("waflash") {
            waflash.remove("filebench");
        }
    }
    let mut job_options = Vec::new();
    for o in overrides {
        match o.key.strip_prefix(crate::sweep::JOB_PREFIX) {
            Some(option) => {
                job_options.push((option.to_string(), crate::sweep::fio_value(&o.value)))
            }
            None => crate::sweep::set_dotted(&mut table, &o.key, o.value.clone())
                .map_err(|e| format!("--set {}: {e}", o.key))?,
        }
    }
    if !job_options.is_empty() {
        let workload = table.get("workload").and_then(toml::Value::as_table);
        let job = match (
            workload
                .and_then(|w| w.get("job"))
                .and_then(toml::Value::as_str),
            workload
                .and_then(|w| w.get("job_file"))
                .and_then(toml::Value::as_str),
        ) {
            (Some(text), _) => text.to_string(),
            (None, Some(file)) => {
                let file = base_dir.join(file);
                std::fs::read_to_string(&file)
                    .map_err(|e| format!("cannot read job file {}: {e}", file.display()))?
            }
            (None, None) => {
                return Err(format!(
                    "--set job.*: configuration {source} has no fio workload \
                     (workload.job or workload.job_file)"
                ))
            }
        };
        let job = crate::sweep::override_job_options(&job, &job_options);
        if let Some(toml::Value::Table(w)) = table.get_mut("workload") {
            w.remove("job_file");
            w.insert("job".to_string(), toml::Value::String(job));
        }
    }
    let config: RunConfig = toml::Value::Table(table)
        .try_into()
        .map_err(|e| format!("configuration {source} with --set: {e}"))?;
    Ok((config, base_dir, source))
}

pub fn load(
    path: Option<&Path>,
    overrides: &[Override],
    job_file: Option<&Path>,
) -> Result<LoadedConfig, String> {
    let (config, base_dir, source) = read_config(path, overrides, job_file)?;
    config
        .ssd
        .validate()
        .map_err(|e| format!("configuration {source}: {e}"))?;
    config
        .precondition
        .validate()
        .map_err(|e| format!("configuration {source}: {e}"))?;
    // `afa run` drives `[ssd]`, `[array]`, `[waflash]` or `[ox]`, one at a time: ignoring a
    // device table would measure something else than asked.
    //
    // Preconditioning builds the state of a generic SSD or of an array over them; OX and
    // WAFLASH devices have FTLs of their own, and a fill given for them used to be dropped
    // without a word, so that a random read "of a 90% full device" read nothing from flash.
    let device = if config.ox.is_some() {
        Some("[ox]")
    } else if config.waflash.is_some() {
        Some("[waflash]")
    } else {
        None
    };
    if let Some(device) = device {
        if config.precondition.fill_fraction > 0.0 {
            return Err(format!(
                "configuration {source}: [precondition] fill_fraction = {} is not applied to a {device} device \
                 (preconditioning builds generic SSDs and arrays); fill it with a job instead, \
                 e.g. a first job with rw=write and a second with stonewall",
                config.precondition.fill_fraction
            ));
        }
    }
    if let Some(ox) = &config.ox {
        if config.array.is_some() || config.waflash.is_some() {
            return Err(format!(
                "configuration {source}: [ox] runs one OX SSD and cannot be combined with [array] or [waflash]"
            ));
        }
        ox.validate()
            .map_err(|e| format!("configuration {source}: ox: {e}"))?;
    }
    let w = &config.workload;
    let filebench = config
        .waflash
        .as_ref()
        .is_some_and(|w| w.filebench.is_some());
    let sources = w.job_file.is_some() as u32
        + w.job.is_some() as u32
        + w.trace.is_some() as u32
        + filebench as u32;
    if sources != 1 {
        return Err(format!(
            "configuration {source}: [workload] needs exactly one of job_file, job or trace, or [waflash.filebench] (found {sources})"
        ));
    }
    if let Some(wf) = &config.waflash {
        wf.ssd
            .validate()
            .map_err(|e| format!("configuration {source}: waflash.ssd: {e}"))?;
        // A WAFLASH run is one WAFLASH SSD; an array over them is not wired yet, and
        // silently ignoring [array] would measure something else than asked.
        if config.array.is_some() {
            return Err(format!(
                "configuration {source}: [waflash] runs one WAFLASH SSD and cannot be combined with [array]"
            ));
        }
    }
    if let Some(a) = &config.array {
        let engines = a.log.is_some() as u32
            + a.two_phase.is_some() as u32
            + a.swan.is_some() as u32
            + a.scalaafa.is_some() as u32;
        if engines > 1 {
            return Err(format!(
                "configuration {source}: [array.log], [array.two_phase], [array.swan] and [array.scalaafa] are separate engines; choose one"
            ));
        }
        for (i, f) in a.failures.iter().enumerate() {
            // A time past the simulated clock's end (u64 ns, about 584 years) would saturate
            // to that end, and NaN to 0: either would fail the member at a time no one asked for.
            if !(f.at_ms >= 0.0 && f.at_ms < MAX_SIMULATED_MS) {
                return Err(format!(
                    "configuration {source}: array.failures[{i}].at_ms = {} must be a time in \
                     milliseconds from 0 to below {MAX_SIMULATED_MS:e}",
                    f.at_ms
                ));
            }
        }
    }
    if let Some(h) = &config.host {
        h.validate()
            .map_err(|e| format!("configuration {source}: {e}"))?;
    }
    if !(config.report.timeline_interval_ms >= 0.0
        && config.report.timeline_interval_ms.is_finite())
    {
        return Err(format!(
            "configuration {source}: report.timeline_interval_ms must be a non-negative number"
        ));
    }
    Ok(LoadedConfig {
        config,
        base_dir,
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `--set` value is TOML where it parses as TOML and the bare text otherwise.
    #[test]
    fn an_override_value_is_toml_or_else_text() {
        let value = |text: &str| text.parse::<Override>().unwrap().value;
        assert_eq!(value("a.b=0.2"), toml::Value::Float(0.2));
        assert_eq!(value("a=7"), toml::Value::Integer(7));
        assert_eq!(value("a=true"), toml::Value::Boolean(true));
        assert_eq!(value("a=raid6"), toml::Value::String("raid6".into()));
        assert_eq!(value("a=\"x y\""), toml::Value::String("x y".into()));
        assert_eq!(value("a = [1, 2]").as_array().map(Vec::len), Some(2));
        let o: Override = " job.iodepth = 32 ".parse().unwrap();
        assert_eq!(o.key, "job.iodepth");
        for bad in ["novalue", "=1", ".a=1", "a..b=1"] {
            assert!(bad.parse::<Override>().is_err(), "{bad}");
        }
    }

    /// A cell mode's timing table written in part keeps that mode's defaults for the keys it
    /// leaves out, so one key can be set (or swept) on a configuration without the table.
    #[test]
    fn a_partial_cell_timing_table_keeps_that_modes_defaults_for_the_rest() {
        let set = |text: &str| text.parse::<Override>().unwrap();
        let defaults = afa_nand::NandTiming::default();
        let cfg = load(None, &[set("ssd.timing.mlc.program_ns=900000")], None)
            .unwrap()
            .config;
        let timing = &cfg.ssd.timing;
        assert_eq!(timing.mlc.program_ns, 900_000);
        assert_eq!(timing.mlc.read_ns, defaults.mlc.read_ns);
        assert_eq!(timing.mlc.erase_ns, defaults.mlc.erase_ns);
        assert_eq!(timing.mlc.endurance_cycles, defaults.mlc.endurance_cycles);
        assert_eq!(timing.slc, defaults.slc, "the other modes keep theirs");
        assert_eq!(timing.tlc, defaults.tlc);
        // Each mode fills from its own defaults, not from another mode's.
        let cfg = load(
            None,
            &[
                set("ssd.timing.slc.read_ns=30000"),
                set("ssd.timing.tlc.erase_ns=7000000"),
            ],
            None,
        )
        .unwrap()
        .config;
        assert_eq!(cfg.ssd.timing.slc.read_ns, 30_000);
        assert_eq!(cfg.ssd.timing.slc.program_ns, defaults.slc.program_ns);
        assert_eq!(cfg.ssd.timing.tlc.erase_ns, 7_000_000);
        assert_eq!(cfg.ssd.timing.tlc.read_ns, defaults.tlc.read_ns);
        // A misspelt key is still refused, by name, and a bad value still fails validation.
        let err = load(None, &[set("ssd.timing.mlc.program_us=900")], None).unwrap_err();
        assert!(err.contains("program_us"), "{err}");
        let err = load(None, &[set("ssd.timing.mlc.endurance_cycles=0")], None).unwrap_err();
        assert!(err.contains("endurance_cycles"), "{err}");
    }

    #[test]
    fn afa_run_takes_one_ox_ssd_and_refuses_it_beside_another_device() {
        let dir = std::env::temp_dir().join(format!("afa-config-ox-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("run.toml");
        let job = "[workload]\njob = \"[w]\\nrw=randwrite\\nsize=1m\\n\"\n";
        std::fs::write(&path, format!("[ox]\n{job}")).unwrap();
        assert!(load(Some(&path), &[], None).unwrap().config.ox.is_some());
        for (extra, named) in [
            (
                "[array]\nlevel = \"raid5\"\nmembers = 3\n",
                "cannot be combined",
            ),
            ("[waflash.ssd]\n", "cannot be combined"),
            (
                "[precondition]\nfill_fraction = 0.9\n",
                "fill_fraction = 0.9 is not applied to a [ox] device",
            ),
        ] {
            std::fs::write(&path, format!("[ox]\n{job}{extra}")).unwrap();
            let err = load(Some(&path), &[], None).unwrap_err();
            assert!(err.contains(named), "{err}");
        }
        std::fs::write(&path, format!("[ox]\nchannels = 0\n{job}")).unwrap();
        let err = load(Some(&path), &[], None).unwrap_err();
        assert!(err.contains("ox: ") && err.contains("channels"), "{err}");
        // WAFLASH has its own FTL too; an empty precondition table is no fill and is taken.
        let fill = "[precondition]\nfill_fraction = 0.5\n";
        std::fs::write(&path, format!("[waflash.ssd]\n{job}{fill}")).unwrap();
        let err = load(Some(&path), &[], None).unwrap_err();
        assert!(err.contains("not applied to a [waflash] device"), "{err}");
        std::fs::write(&path, format!("[waflash.ssd]\n{job}[precondition]\n")).unwrap();
        assert!(load(Some(&path), &[], None).is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_partial_waflash_geometry_or_host_table_keeps_waflash_defaults_for_the_rest() {
        let dir = std::env::temp_dir().join(format!("afa-config-wfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("run.toml");
        let job = "[workload]\njob = \"[w]\\nrw=randwrite\\nbs=16k\\nsize=1m\\n\"\n";
        std::fs::write(
            &path,
            format!("[waflash.ssd.geometry]\nblocks_per_plane = 48\n[waflash.ssd.host]\nqueue_depth = 8\n{job}"),
        )
        .unwrap();
        let cfg = load(Some(&path), &[], None).unwrap().config;
        let ssd = &cfg.waflash.expect("a [waflash] table").ssd;
        let default = afa_waflash::WaflashConfig::default();
        assert_eq!(ssd.geometry.blocks_per_plane, 48);
        assert_eq!(ssd.geometry.page_bytes, 16_384, "WAFLASH's 16 KiB pages");
        assert_eq!(ssd.geometry.channels, default.geometry.channels);
        assert_eq!(ssd.host.queue_depth, 8);
        assert_eq!(
            ssd.host.max_transfer_sectors,
            default.host.max_transfer_sectors
        );
        std::fs::write(
            &path,
            format!("[waflash.ssd.geometry]\npage_kib = 16\n{job}"),
        )
        .unwrap();
        let err = load(Some(&path), &[], None).unwrap_err();
        assert!(err.contains("page_kib"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
