//! `afa`: the all-flash-array engine and NAND SSD emulator. This is the one place where the
//! layers are wired together, through typed options.

mod bench;
mod config;
mod report;
mod reproduce;
mod serve;
mod volume;
mod waflash;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use afa_host::{RunOptions, TraceReplay, Workload};
use afa_ssd::{BlockDevice, Ssd};
use afa_workload::fio::parse_job_file;
use afa_workload::trace::{read_trace, TraceFormat};

#[derive(Debug, Parser)]
#[command(
    name = "afa",
    version,
    about = "All-flash-array engine and NAND SSD emulator"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a simulation (the embedded default when no CONFIG is given).
    Run {
        config: Option<PathBuf>,
        /// Overrides the configuration's seed.
        #[arg(long)]
        seed: Option<u64>,
        /// Writes the full report as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Suppresses the human summary.
        #[arg(long)]
        quiet: bool,
    },
    /// Analytic models.
    Model {
        #[command(subcommand)]
        model: ModelCommand,
    },
    /// Reruns one of the papers' experiments: the paper's figures next to the measured ones.
    Reproduce(reproduce::ReproduceArgs),
    /// Serves the volume as an NBD export to real clients (qemu, nbd tools, fio, nbdfuse).
    Serve(serve::ServeArgs),
    /// Benchmarks of the simulator itself and of its agreement with the models.
    Bench {
        #[command(subcommand)]
        bench: bench::BenchCommand,
    },
}

#[derive(Debug, Subcommand)]
enum ModelCommand {
    /// Steady-state write amplification of uniform random writes.
    Waf {
        #[arg(long, value_enum)]
        policy: GcPolicyArg,
        /// Over-provisioning, (physical − logical) / logical.
        #[arg(long)]
        op: f64,
        #[arg(long, default_value_t = 64)]
        pages_per_block: u32,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum GcPolicyArg {
    Fifo,
    Greedy,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run {
            config,
            seed,
            json,
            quiet,
        } => run(config.as_deref(), seed, json.as_deref(), quiet),
        Command::Model {
            model:
                ModelCommand::Waf {
                    policy,
                    op,
                    pages_per_block,
                },
        } => model_waf(policy, op, pages_per_block),
        Command::Bench { bench } => bench::run(bench),
        Command::Reproduce(args) => reproduce::run(args),
        Command::Serve(args) => serve::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

pub fn model_waf_value(policy: GcPolicyArg, op: f64, pages_per_block: u32) -> Result<f64, String> {
    match policy {
        GcPolicyArg::Fifo => afa_model::waf_fifo(op),
        GcPolicyArg::Greedy => afa_model::waf_greedy(op, pages_per_block),
    }
    .map_err(|e| e.to_string())
}

fn model_waf(policy: GcPolicyArg, op: f64, pages_per_block: u32) -> Result<(), String> {
    let waf = model_waf_value(policy, op, pages_per_block)?;
    let utilisation = afa_model::utilisation_from_op(op);
    println!(
        "policy {policy:?}, over-provisioning {op}, logical utilisation {utilisation:.4}, pages per block {pages_per_block}"
    );
    println!("predicted steady-state write amplification: {waf:.4}");
    Ok(())
}

fn run(
    config_path: Option<&Path>,
    seed: Option<u64>,
    json: Option<&Path>,
    quiet: bool,
) -> Result<(), String> {
    let loaded = config::load(config_path)?;
    let mut cfg = loaded.config;
    if let Some(seed) = seed {
        cfg.seed = seed;
    }
    // The seed comes first, so that any run can be reproduced from its output.
    println!("seed: {}", cfg.seed);
    if let Some(w) = &cfg.waflash {
        return waflash::run(&cfg, w, &loaded.base_dir, json, quiet);
    }
    let workload = load_workload(&cfg.workload, &loaded.base_dir)?;
    let build_ssd = |seed: u64| -> Result<Ssd, String> {
        Ssd::new(cfg.ssd.clone(), seed).map_err(|e| format!("configuration {}: {e}", loaded.source))
    };
    let mut options = RunOptions {
        seed: cfg.seed,
        timeline_interval_ns: (cfg.report.timeline_interval_ms * 1e6) as u64,
        preconditioned_sectors: 0,
        background_work: cfg.workload.background_work.unwrap_or(true),
        show_progress: true,
    };
    let config_json = serde_json::to_value(&cfg).map_err(|e| e.to_string())?;
    let (report, outcome) = if let Some(array_cfg) = &cfg.array {
        // Members are built from [ssd] with distinct seeds; preconditioning an array is
        // a later step (members would need parity-consistent content), so it is refused.
        if cfg.precondition.fill_fraction > 0.0 {
            return Err("precondition is not supported with [array] yet".into());
        }
        let spec = volume::ArraySpec::from_config(array_cfg);
        let mut array =
            volume::ArrayVolume::build(&spec, &cfg.ssd, cfg.seed, options.timeline_interval_ns)
                .map_err(|e| format!("configuration {}: {e}", loaded.source))?;
        let host_start = std::time::Instant::now();
        let (outcome, cpu) = run_on(array.device(), cfg.host.as_ref(), &workload, &options)?;
        let host_time_s = host_start.elapsed().as_secs_f64();
        let sector = array.device().info().sector_bytes as u64;
        let members = array.members();
        let ssds: Vec<&Ssd> = members.iter().map(|m| m.inner()).collect();
        let page = cfg.ssd.geometry.page_bytes as u64;
        let user_pages = (array.user_write_sectors() * sector).div_ceil(page);
        let mut report = report::build(
            &ssds,
            user_pages,
            &outcome,
            cfg.seed,
            host_time_s,
            config_json,
        );
        report.array = Some(array.engine_json());
        report.members = report::member_reports(&members, outcome.sim_time_ns);
        report.cpu = cpu;
        (report, outcome)
    } else {
        let mut ssd = build_ssd(cfg.seed)?;
        ssd.precondition(&cfg.precondition, cfg.seed)
            .map_err(|e| format!("preconditioning: {e}"))?;
        let spp = cfg.ssd.geometry.sectors_per_page() as u64;
        options.preconditioned_sectors =
            cfg.precondition.filled_pages(ssd.logical_pages()) as u64 * spp;
        // Host time covers the simulated run only, not building and preconditioning the
        // device, so that requests per host second measure the simulator's speed.
        let host_start = std::time::Instant::now();
        let (outcome, cpu) = run_on(&mut ssd, cfg.host.as_ref(), &workload, &options)?;
        let host_time_s = host_start.elapsed().as_secs_f64();
        let host_pages = ssd.stats().host_page_writes;
        let mut report = report::build(
            &[&ssd],
            host_pages,
            &outcome,
            cfg.seed,
            host_time_s,
            config_json,
        );
        report.cpu = cpu;
        (report, outcome)
    };
    if !quiet {
        print!("{}", report.human_summary());
    }
    if let Some(path) = json {
        std::fs::write(path, report.to_json_pretty())
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if outcome.mismatches > 0 {
        return Err(format!(
            "{} of {} checked sectors read back wrong; first: {:?}",
            outcome.mismatches, outcome.reads_checked, outcome.first_mismatches
        ));
    }
    Ok(())
}

/// Runs the workload on `device`, through the host CPU model when one is configured, and
/// returns the outcome and the CPU report.
pub fn run_on(
    device: &mut dyn BlockDevice,
    host: Option<&afa_host::CpuConfig>,
    workload: &Workload,
    options: &RunOptions,
) -> Result<(afa_host::RunOutcome, Option<serde_json::Value>), String> {
    match host {
        Some(h) => {
            let mut front = afa_host::CpuFront::new(device, h)?;
            let outcome =
                afa_host::run(&mut front, workload, options).map_err(|e| e.to_string())?;
            let cpu = serde_json::to_value(front.report(outcome.sim_time_ns)).ok();
            Ok((outcome, cpu))
        }
        None => {
            let outcome = afa_host::run(device, workload, options).map_err(|e| e.to_string())?;
            Ok((outcome, None))
        }
    }
}

fn load_workload(w: &config::WorkloadConfig, base: &Path) -> Result<Workload, String> {
    if let Some(text) = &w.job {
        let jobs = parse_job_file(text).map_err(|e| format!("inline job: {e}"))?;
        return Ok(Workload::Jobs(jobs));
    }
    if let Some(path) = &w.job_file {
        let path = base.join(path);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read job file {}: {e}", path.display()))?;
        let jobs = parse_job_file(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        return Ok(Workload::Jobs(jobs));
    }
    let t = w.trace.as_ref().ok_or("[workload] names no job or trace")?;
    let path = base.join(&t.path);
    let format: TraceFormat = t
        .format
        .parse()
        .map_err(|e| format!("workload.trace.format: {e}"))?;
    let file = std::fs::File::open(&path)
        .map_err(|e| format!("cannot open trace {}: {e}", path.display()))?;
    let records = read_trace(
        std::io::BufReader::new(file),
        format,
        &path.display().to_string(),
    )
    .map_err(|e| e.to_string())?;
    let replay = match t.replay.as_str() {
        "timed" => {
            if !(t.time_scale.is_finite() && t.time_scale >= 0.0) {
                return Err("workload.trace.time_scale must be a non-negative number".into());
            }
            TraceReplay::Timed {
                time_scale: t.time_scale,
            }
        }
        "closed" => TraceReplay::Closed { iodepth: t.iodepth },
        other => {
            return Err(format!(
                "workload.trace.replay = {other:?} must be \"timed\" or \"closed\""
            ))
        }
    };
    Ok(Workload::Trace { records, replay })
}
