//! `afa`: the all-flash-array engine and NAND SSD emulator. This is the one place where the
//! layers are wired together, through typed options.

mod bench;
mod config;
mod ox_run;
mod plot;
mod report;
mod reproduce;
mod serve;
mod serve_members;
mod sweep;
mod trace;
mod volume;
mod waflash;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use afa_host::{RunOptions, TraceReplay, Workload};
use afa_report::RunReport;
use afa_ssd::{BlockDevice, Ssd};
use afa_workload::fio::parse_job_file;
use afa_workload::trace::TraceRecord;

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
        /// `fio-json` writes fio 3.x json+ instead of the summary (docs/plots.md).
        #[arg(long, value_enum, default_value_t)]
        output_format: plot::OutputFormat,
        /// Where `--output-format fio-json` writes (default: stdout, with the seed on stderr).
        #[arg(long)]
        output: Option<PathBuf>,
        /// Overrides one key of the configuration, `ssd.over_provisioning=0.2`, or with
        /// `job.` one fio option of every job, `job.iodepth=32`; repeatable, applied in order.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<config::Override>,
        /// Runs this fio job file in place of the configuration's workload, on the
        /// configuration's device (the embedded default's SSD when no CONFIG is given).
        #[arg(long, value_name = "PATH")]
        job: Option<PathBuf>,
        /// Writes every request the workload issued, at the simulated time it issued it, as
        /// a trace (replayable by `afa run`, fio's `read_iolog`, SSDSim/MQSim).
        #[arg(long, value_name = "PATH")]
        record: Option<PathBuf>,
        /// The recorded trace's format: `iolog` (fio v3), `msr`, `blkparse`, `fiu`, `ascii`,
        /// `spc`, `alibaba` or `tencent`.
        #[arg(long, default_value = "iolog", requires = "record")]
        record_format: String,
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
    /// Draws a run report's figures as SVG and PNG.
    Plot(plot::PlotArgs),
    /// Overlays several runs' figures and prints their ratios.
    Compare(plot::CompareArgs),
    /// Writes one self-contained HTML page with runs' configuration, tables and figures.
    Report(plot::ReportArgs),
    /// Block traces: statistics, synthesis, conversion (docs/traces.md).
    Trace {
        #[command(subcommand)]
        command: trace::TraceCommand,
    },
    /// Runs a grid of simulations in parallel, one JSON line per point (docs/sweep.md).
    Sweep(sweep::SweepArgs),
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
    /// SWAN's sizing (ATC '19 §3.5): the minimum number of R-groups from Equation 1 and the
    /// R-group width for a network bandwidth.
    Swan(SwanModelArgs),
}

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("util").required(true).args(["utilization", "disk_utilization"])))]
struct SwanModelArgs {
    /// Time to erase a segment's flash blocks, in µs.
    #[arg(long)]
    erase_us: f64,
    /// Time to read one block, in µs.
    #[arg(long)]
    read_us: f64,
    /// Time to write one block, in µs.
    #[arg(long)]
    write_us: f64,
    #[arg(long)]
    blocks_per_segment: u32,
    /// Segment utilisation u of the cleaned segments.
    #[arg(long)]
    utilization: Option<f64>,
    /// Disk utilisation u_d; u solves u_d = (u − 1) / ln u.
    #[arg(long)]
    disk_utilization: Option<f64>,
    /// Network bandwidth to fill, in GB/s (with --ssd-write-gb-s: the R-group width).
    #[arg(long, requires = "ssd_write_gb_s")]
    network_gb_s: Option<f64>,
    /// One SSD's write bandwidth, in GB/s.
    #[arg(long, requires = "network_gb_s")]
    ssd_write_gb_s: Option<f64>,
    /// Parity members per R-group.
    #[arg(long, default_value_t = 0)]
    parity: u32,
    /// SSDs in the box, to split into R-groups.
    #[arg(long)]
    ssds: Option<u32>,
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
            output_format,
            output,
            set,
            job,
            record,
            record_format,
        } => run(
            (config.as_deref(), &set, job.as_deref()),
            seed,
            json.as_deref(),
            quiet,
            (output_format, output.as_deref()),
            (record.as_deref(), &record_format),
        ),
        Command::Model {
            model:
                ModelCommand::Waf {
                    policy,
                    op,
                    pages_per_block,
                },
        } => model_waf(policy, op, pages_per_block),
        Command::Model {
            model: ModelCommand::Swan(args),
        } => model_swan(&args),
        Command::Bench { bench } => bench::run(bench),
        Command::Reproduce(args) => reproduce::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Plot(args) => plot::plot(args),
        Command::Compare(args) => plot::compare(args),
        Command::Report(args) => plot::report(args),
        Command::Trace { command } => trace::run(command),
        Command::Sweep(args) => sweep::run(args),
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

fn model_swan(a: &SwanModelArgs) -> Result<(), String> {
    use afa_model::swan::{group_width, min_groups, min_groups_for_disk_utilization, SwanDevice};
    let device = SwanDevice {
        erase_us: a.erase_us,
        read_us: a.read_us,
        write_us: a.write_us,
        blocks_per_segment: a.blocks_per_segment,
    };
    let s = match (a.utilization, a.disk_utilization) {
        (Some(u), _) => min_groups(&device, u),
        (None, Some(u_d)) => {
            let s = min_groups_for_disk_utilization(&device, u_d);
            if let Ok(s) = &s {
                println!(
                    "disk utilisation u_d {u_d}: segment utilisation u = {:.4} (u_d = (u − 1) / ln u)",
                    s.segment_utilization
                );
            }
            s
        }
        (None, None) => return Err("give --utilization or --disk-utilization".into()),
    }
    .map_err(|e| e.to_string())?;
    let b = a.blocks_per_segment as f64;
    println!(
        "segment: T_w = {:.1} µs, T_r = {:.1} µs, T_e = {} µs",
        a.write_us * b,
        a.read_us * b,
        a.erase_us
    );
    println!(
        "cleaning a segment takes {:.1} µs; the front-end consumes what it frees in {:.1} µs",
        s.clean_segment_us, s.consume_segment_us
    );
    println!(
        "minimum R-groups (Equation 1): N = {:.3}, so {} R-groups",
        s.min_groups,
        s.min_groups.ceil()
    );
    if let (Some(net), Some(ssd)) = (a.network_gb_s, a.ssd_write_gb_s) {
        let w = group_width(net, ssd, a.parity, a.ssds).map_err(|e| e.to_string())?;
        println!(
            "R-group width for {net} GB/s over {ssd} GB/s SSDs: {} SSDs ({} data + {} parity)",
            w.ssds_per_group, w.data_per_group, a.parity
        );
        if let (Some(n), Some(groups), Some(left)) = (a.ssds, w.groups, w.leftover_ssds) {
            let verdict = if groups as f64 >= s.min_groups {
                "enough to hide GC"
            } else {
                "fewer than Equation 1 asks for: GC will reach the front-end"
            };
            println!(
                "{n} SSDs: {groups} R-groups (1 front-end + {} back-end) and {left} spare SSDs; {verdict}",
                groups.saturating_sub(1)
            );
        }
    }
    Ok(())
}

fn run(
    (config_path, overrides, job_file): (Option<&Path>, &[config::Override], Option<&Path>),
    seed: Option<u64>,
    json: Option<&Path>,
    quiet: bool,
    (output_format, output): (plot::OutputFormat, Option<&Path>),
    (record, record_format): (Option<&Path>, &str),
) -> Result<(), String> {
    // Checked before the run, so that a typo does not cost a whole run.
    let record = match record {
        Some(path) => Some((path, trace::parse_format(record_format)?)),
        None => None,
    };
    let loaded = config::load(config_path, overrides, job_file)?;
    let mut cfg = loaded.config;
    if let Some(seed) = seed {
        cfg.seed = seed;
    }
    // The seed comes first, so that any run can be reproduced from its output. When stdout
    // carries the fio JSON document, the seed goes to stderr so that stdout parses.
    let fio_to_stdout = output_format == plot::OutputFormat::FioJson && output.is_none();
    if fio_to_stdout {
        eprintln!("seed: {}", cfg.seed);
    } else {
        println!("seed: {}", cfg.seed);
    }
    let delivery = Delivery {
        config_path,
        json,
        quiet,
        fio_to_stdout,
        output_format,
        output,
        record,
    };
    let config_json = serde_json::to_value(&cfg).map_err(|e| e.to_string())?;
    let mut device_options = device_run_options(&cfg, quiet);
    device_options.record_requests = record.is_some();
    if let Some(w) = &cfg.waflash {
        let (report, outcome, line) =
            waflash::run(&cfg, w, &loaded.base_dir, config_json, &device_options)?;
        return delivery.deliver(&report, &outcome, Some(&line));
    }
    if let Some(ox) = &cfg.ox {
        let (report, outcome, line) =
            ox_run::run(&cfg, ox, &loaded.base_dir, config_json, &device_options)?;
        return delivery.deliver(&report, &outcome, Some(&line));
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
        record_requests: record.is_some(),
    };
    let (report, outcome) = if let Some(array_cfg) = &cfg.array {
        // Members are built from [ssd] with distinct seeds. Preconditioning writes the fill
        // through the engine, so the run starts where the fill left the simulated clock.
        let spec = volume::ArraySpec::from_config(array_cfg);
        let (mut array, pre) = volume::ArrayVolume::build_preconditioned(
            &spec,
            &cfg.ssd,
            cfg.seed,
            options.timeline_interval_ns,
            &cfg.precondition,
        )
        .map_err(|e| format!("configuration {}: {e}", loaded.source))?;
        options.preconditioned_sectors = pre.sectors;
        let mut device = volume::Shifted {
            device: array.device(),
            epoch_ns: pre.epoch_ns,
        };
        let host_start = std::time::Instant::now();
        let (outcome, cpu) = run_on(
            &mut device,
            cfg.host.as_ref(),
            &workload,
            &options,
            Notes::Print,
        )
        .map_err(|e| array.device_ref().media_faults().explain(e))?;
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
        let (outcome, cpu) = run_on(
            &mut ssd,
            cfg.host.as_ref(),
            &workload,
            &options,
            Notes::Print,
        )
        .map_err(|e| ssd.media_faults().explain(e))?;
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
    delivery.deliver(&report, &outcome, None)
}

/// Where a run's report goes: the fio JSON document, the human summary, the JSON report.
struct Delivery<'a> {
    config_path: Option<&'a Path>,
    json: Option<&'a Path>,
    quiet: bool,
    /// The fio JSON document goes to stdout, so nothing else may.
    fio_to_stdout: bool,
    output_format: plot::OutputFormat,
    output: Option<&'a Path>,
    /// Where the workload's requests go as a trace, and in which format.
    record: Option<(&'a Path, afa_workload::trace::TraceFormat)>,
}

impl Delivery<'_> {
    /// Writes `report` where it was asked for, with `device_line` (a WAFLASH or an OX SSD's
    /// own summary) after the human summary, and fails the run if any read came back wrong.
    fn deliver(
        &self,
        report: &RunReport,
        outcome: &afa_host::RunOutcome,
        device_line: Option<&str>,
    ) -> Result<(), String> {
        if self.output_format == plot::OutputFormat::FioJson {
            plot::write_fio_json(report, self.config_path, self.output)?;
        }
        if !self.quiet && !self.fio_to_stdout {
            print!("{}", report.human_summary());
            if let Some(line) = device_line {
                println!("{line}");
            }
        }
        if let Some(path) = self.json {
            std::fs::write(path, report.to_json_pretty())
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        }
        if let Some((path, format)) = self.record {
            // A format without trims or flushes (MSR, FIU, ASCII) gets the rest, and the
            // user is told what it left out rather than losing the whole trace.
            let (kept, left_out): (Vec<&TraceRecord>, Vec<&TraceRecord>) =
                outcome.issued.iter().partition(|r| format.holds(r.op));
            for op in [afa_workload::IoOp::Trim, afa_workload::IoOp::Flush] {
                let n = left_out.iter().filter(|r| r.op == op).count();
                if n > 0 {
                    eprintln!(
                        "note: the {format:?} trace {} leaves out {n} {op:?} requests, which \
                         the format cannot hold (iolog and blkparse can)",
                        path.display()
                    );
                }
            }
            let fua = kept.iter().filter(|r| r.fua).count();
            if fua > 0 && !format.holds_fua() {
                eprintln!(
                    "note: the {format:?} trace {} records {fua} FUA writes as plain writes; \
                     only blkparse holds the flag",
                    path.display()
                );
            }
            trace::write_records(kept, format, Some(path))?;
        }
        // fio's `write_iolog`: each job that asks gets its own requests as an iolog.
        for (path, requests) in &outcome.job_logs {
            trace::write_records(
                requests,
                afa_workload::trace::TraceFormat::Iolog,
                Some(Path::new(path)),
            )
            .map_err(|e| format!("write_iolog={path}: {e}"))?;
        }
        integrity_verdict(outcome)
    }
}

/// A run that read back any sector wrong fails, naming the first mismatches.
fn integrity_verdict(outcome: &afa_host::RunOutcome) -> Result<(), String> {
    if outcome.mismatches > 0 {
        return Err(format!(
            "{} of {} checked sectors read back wrong; first: {:?}",
            outcome.mismatches, outcome.reads_checked, outcome.first_mismatches
        ));
    }
    Ok(())
}

/// Host options of a run on one device from its configuration: the seed, the timeline, the
/// workload's background work and the progress bar.
pub fn device_run_options(cfg: &config::RunConfig, quiet: bool) -> RunOptions {
    RunOptions {
        seed: cfg.seed,
        timeline_interval_ns: (cfg.report.timeline_interval_ms * 1e6) as u64,
        preconditioned_sectors: 0,
        background_work: cfg.workload.background_work.unwrap_or(true),
        show_progress: !quiet,
        record_requests: false,
    }
}

/// Whether a run tells its user on stderr what it changed in the workload as given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notes {
    /// `afa run`: each note goes to stderr as `note: ...` once, before the run starts, so that
    /// the user reads it before any figure measured on the changed workload, and still reads
    /// it when the run then fails.
    Print,
    /// The reproductions: their jobs are the project's own, so a note on each of their many
    /// runs would tell the user nothing they can act on. The notes stay in the outcome.
    Keep,
}

/// Runs the workload on `device`, through the host CPU model when one is configured, and
/// returns the outcome and the CPU report.
pub fn run_on(
    device: &mut dyn BlockDevice,
    host: Option<&afa_host::CpuConfig>,
    workload: &Workload,
    options: &RunOptions,
    notes: Notes,
) -> Result<(afa_host::RunOutcome, Option<serde_json::Value>), String> {
    let start = |device: &mut dyn BlockDevice| -> Result<afa_host::RunOutcome, String> {
        let prepared =
            afa_host::PreparedRun::new(device, workload, options).map_err(|e| e.to_string())?;
        if notes == Notes::Print {
            for note in prepared.notes() {
                eprintln!("note: {note}");
            }
        }
        prepared.run().map_err(|e| e.to_string())
    };
    match host {
        Some(h) => {
            let mut front = afa_host::CpuFront::new(device, h)?;
            let outcome = start(&mut front)?;
            let cpu = serde_json::to_value(front.report(outcome.sim_time_ns)).ok();
            Ok((outcome, cpu))
        }
        None => Ok((start(device)?, None)),
    }
}

fn load_workload(w: &config::WorkloadConfig, base: &Path) -> Result<Workload, String> {
    // A job's `read_iolog` path counts from the directory of the file that names it: the
    // configuration's for an inline job, the job file's otherwise.
    if let Some(text) = &w.job {
        let mut jobs = parse_job_file(text).map_err(|e| format!("inline job: {e}"))?;
        afa_workload::fio::resolve_iologs(&mut jobs, base)
            .map_err(|e| format!("inline job: {e}"))?;
        return Ok(Workload::Jobs(jobs));
    }
    if let Some(path) = &w.job_file {
        let path = base.join(path);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read job file {}: {e}", path.display()))?;
        let mut jobs = parse_job_file(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let job_dir = path.parent().unwrap_or(base);
        afa_workload::fio::resolve_iologs(&mut jobs, job_dir)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        return Ok(Workload::Jobs(jobs));
    }
    let t = w.trace.as_ref().ok_or("[workload] names no job or trace")?;
    let records = trace::load_records(t, base)?;
    let replay = match t.replay.as_str() {
        "timed" => {
            if !(t.time_scale.is_finite() && t.time_scale >= 0.0) {
                return Err("workload.trace.time_scale must be a non-negative number".into());
            }
            // The replay issues each request at its scaled timestamp; past a quarter of the
            // u64 nanosecond clock (about 146 years) the completions that follow could
            // overflow it.
            let last_ns = records.iter().map(|r| r.timestamp_ns).max().unwrap_or(0);
            let span_ns = last_ns as f64 * t.time_scale;
            if span_ns >= (1u64 << 62) as f64 {
                return Err(format!(
                    "workload.trace.time_scale = {} stretches the trace's {last_ns} ns to {span_ns:e} ns, \
                     past the simulated clock's reach (2^62 ns, about 146 years)",
                    t.time_scale
                ));
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
