//! `afa bench …`: measurements of the simulator itself (speed, memory) and of its agreement
//! with the analytic models. Timings are measured here, never asserted in tests.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Subcommand;
use serde_json::json;

use afa_host::{RunOptions, Workload};
use afa_nand::{Geometry, PayloadMode};
use afa_ssd::{BlockDevice, Precondition, PreconditionPattern, Ssd, SsdConfig, VictimPolicy};
use afa_workload::fio::parse_job_file;

use crate::{model_waf_value, GcPolicyArg};

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Serve mode: fio's nbd engine against afa and nbdkit memory.
    Serve(crate::serve::bench_serve::BenchServeArgs),
    /// Simulated steady-state write amplification of uniform random 4 KiB writes beside the
    /// analytic model.
    Waf {
        #[arg(long, value_enum)]
        policy: GcPolicyArg,
        #[arg(long)]
        op: f64,
        #[arg(long, default_value_t = 64)]
        pages_per_block: u32,
        /// Host writes in the measured window, as a multiple of the logical capacity.
        #[arg(long, default_value_t = 1.0)]
        rounds: f64,
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Simulator speed: requests per host second for 4 KiB random writes on a 64 GiB SSD at
    /// steady state with GC running.
    Sim {
        /// Requests in the measured window.
        #[arg(long, default_value_t = 4_000_000)]
        requests: u64,
        /// Simulated random overwrites after the steady state is built, as a multiple of
        /// the logical capacity.
        #[arg(long, default_value_t = 0.1)]
        settle_rounds: f64,
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Parity speed: XOR 4+1 encode, Reed-Solomon 6+2 encode and two-erasure decode, in GB/s
    /// of data (10^9 bytes).
    Parity {
        #[arg(long, default_value_t = 65_536)]
        chunk_bytes: usize,
        #[arg(long, default_value_t = 2_000)]
        iterations: usize,
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// `afa sweep` speed-up: a grid of similar simulations run on one worker, then on
    /// `--jobs` workers (default: the cores).
    Sweep {
        #[arg(long, default_value_t = 16)]
        points: usize,
        #[arg(long)]
        jobs: Option<usize>,
        /// 4 KiB random writes per point.
        #[arg(long, default_value_t = 1_000_000)]
        requests: u64,
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Preconditioning speed and memory on a 512 GiB device filled to 75%.
    Precondition {
        #[arg(long, default_value_t = 0.75)]
        fill: f64,
        #[arg(long, value_enum, default_value = "random")]
        pattern: PatternArg,
        /// Simulated random overwrites after the steady state is built (random pattern) or
        /// after the sequential fill (random-simulated), as a multiple of the filled pages.
        #[arg(long, default_value_t = 0.05)]
        overwrite_rounds: f64,
        #[arg(long)]
        json: Option<PathBuf>,
    },
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum PatternArg {
    Sequential,
    Random,
    RandomSimulated,
}

pub fn run(cmd: BenchCommand) -> Result<(), String> {
    match cmd {
        BenchCommand::Serve(args) => crate::serve::bench_serve::bench(args),
        BenchCommand::Waf {
            policy,
            op,
            pages_per_block,
            rounds,
            json,
        } => bench_waf(policy, op, pages_per_block, rounds, json.as_deref()),
        BenchCommand::Sim {
            requests,
            settle_rounds,
            json,
        } => bench_sim(requests, settle_rounds, json.as_deref()),
        BenchCommand::Parity {
            chunk_bytes,
            iterations,
            json,
        } => {
            if chunk_bytes == 0 || iterations == 0 {
                return Err("--chunk-bytes and --iterations must be positive".into());
            }
            write_json(
                json.as_deref(),
                &afa_parity::bench::run(chunk_bytes, iterations),
            )
        }
        BenchCommand::Precondition {
            fill,
            pattern,
            overwrite_rounds,
            json,
        } => bench_precondition(fill, pattern, overwrite_rounds, json.as_deref()),
        BenchCommand::Sweep {
            points,
            jobs,
            requests,
            json,
        } => {
            let cores = std::thread::available_parallelism().map_or(1, usize::from);
            let result = crate::sweep::bench(points, jobs.unwrap_or(cores), requests)?;
            write_json(json.as_deref(), &result)
        }
    }
}

fn write_json(path: Option<&Path>, value: &serde_json::Value) -> Result<(), String> {
    let text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    println!("{text}");
    if let Some(p) = path {
        std::fs::write(p, text + "\n").map_err(|e| format!("cannot write {}: {e}", p.display()))?;
    }
    Ok(())
}

/// Runs `requests` uniform random 4 KiB writes at queue depth 32 and returns the outcome,
/// the write amplification inside the window and the host seconds spent.
fn random_writes(
    ssd: &mut Ssd,
    requests: u64,
    seed: u64,
) -> Result<(afa_host::RunOutcome, f64, f64), String> {
    let job = format!("[w]\nrw=randwrite\nbs=4k\niodepth=32\nnumber_ios={requests}\nio_size=1p\n");
    let jobs = parse_job_file(&job).map_err(|e| e.to_string())?;
    let programs_before: u64 = ssd.nand_counters().programs.iter().sum();
    let host_before = ssd.stats().host_page_writes;
    let options = RunOptions {
        seed,
        timeline_interval_ns: 0,
        preconditioned_sectors: 0,
        background_work: false,
        show_progress: false,
        record_requests: false,
    };
    let start = Instant::now();
    let outcome = afa_host::run(ssd, &Workload::Jobs(jobs), &options).map_err(|e| e.to_string())?;
    let host_s = start.elapsed().as_secs_f64();
    let programs: u64 = ssd.nand_counters().programs.iter().sum::<u64>() - programs_before;
    let host = ssd.stats().host_page_writes - host_before;
    Ok((outcome, programs as f64 / host.max(1) as f64, host_s))
}

fn bench_waf(
    policy: GcPolicyArg,
    op: f64,
    pages_per_block: u32,
    rounds: f64,
    json: Option<&Path>,
) -> Result<(), String> {
    let waf_model = model_waf_value(policy, op, pages_per_block)?;
    // Many blocks per plane, so that the few blocks GC holds in reserve do not change the
    // utilisation the model assumes; one plane per channel keeps GC per plane equal to GC
    // over the whole device.
    let mut cfg = SsdConfig {
        geometry: Geometry {
            channels: 4,
            chips_per_channel: 1,
            dies_per_chip: 1,
            planes_per_die: 1,
            blocks_per_plane: 8192,
            pages_per_block,
            page_bytes: 4096,
            sector_bytes: 4096,
            oob_bytes_per_page: 64,
        },
        payload: PayloadMode::None,
        over_provisioning: op,
        ..SsdConfig::default()
    };
    cfg.gc.victim = match policy {
        GcPolicyArg::Fifo => VictimPolicy::Fifo,
        GcPolicyArg::Greedy => VictimPolicy::Greedy,
    };
    cfg.gc.background = false;
    let mut ssd = Ssd::new(cfg, 1).map_err(|e| e.to_string())?;
    let start = Instant::now();
    ssd.precondition(
        &Precondition {
            fill_fraction: 1.0,
            // Simulated history, not the model-built state: this bench checks the
            // simulator against the model, so the model must not shape its starting point.
            pattern: PreconditionPattern::RandomSimulated,
            overwrite_rounds: 3.0,
        },
        1,
    )
    .map_err(|e| e.to_string())?;
    let requests = (ssd.logical_pages() as f64 * rounds) as u64;
    let (_, waf_simulated, _) = random_writes(&mut ssd, requests, 2)?;
    let error = (waf_simulated - waf_model) / waf_model;
    write_json(
        json,
        &json!({
            "policy": format!("{policy:?}").to_lowercase(),
            "op": op,
            "pages_per_block": pages_per_block,
            "logical_pages": ssd.logical_pages(),
            "measured_host_writes": requests,
            "waf_simulated": waf_simulated,
            "waf_model": waf_model,
            "relative_error": error,
            "host_time_s": start.elapsed().as_secs_f64(),
        }),
    )
}

/// The 64 GiB SSD of `bench sim`: 8 channels × 4 chips × 2 dies × 2 planes, 512 blocks of
/// 256 4 KiB pages per plane.
fn sim_device(payload: PayloadMode) -> Result<Ssd, String> {
    let cfg = SsdConfig {
        geometry: Geometry {
            channels: 8,
            chips_per_channel: 4,
            dies_per_chip: 2,
            planes_per_die: 2,
            blocks_per_plane: 512,
            pages_per_block: 256,
            page_bytes: 4096,
            sector_bytes: 4096,
            oob_bytes_per_page: 64,
        },
        payload,
        over_provisioning: 0.07,
        ..SsdConfig::default()
    };
    Ssd::new(cfg, 1).map_err(|e| e.to_string())
}

fn bench_sim(requests: u64, settle_rounds: f64, json: Option<&Path>) -> Result<(), String> {
    let mut figures = serde_json::Map::new();
    for payload in [PayloadMode::None, PayloadMode::Token] {
        let mut ssd = sim_device(payload)?;
        let start = Instant::now();
        ssd.precondition(
            &Precondition {
                fill_fraction: 1.0,
                pattern: PreconditionPattern::Random,
                overwrite_rounds: settle_rounds,
            },
            1,
        )
        .map_err(|e| e.to_string())?;
        let precondition_s = start.elapsed().as_secs_f64();
        let (outcome, waf, host_s) = random_writes(&mut ssd, requests, 3)?;
        let label = payload.name();
        figures.insert(
            label.into(),
            json!({
                "requests": outcome.requests,
                "host_time_s": host_s,
                "requests_per_host_second": outcome.requests as f64 / host_s,
                "precondition_host_time_s": precondition_s,
                "sim_time_ns": outcome.sim_time_ns,
                "waf": waf,
                "gc_runs": ssd.ftl_stats().gc_foreground_runs + ssd.ftl_stats().gc_background_runs,
                "gc_pages_moved": ssd.ftl_stats().gc_pages_moved,
                "write_iops_simulated": outcome.measurements.write.iops,
            }),
        );
    }
    let none = figures["none"]["requests_per_host_second"].clone();
    let token = figures["token"]["requests_per_host_second"].clone();
    write_json(
        json,
        &json!({
            "device": "64 GiB raw, 8 ch x 4 chips x 2 dies x 2 planes, 256 x 4 KiB pages per block, 7% OP, preconditioned full (random)",
            "workload": "4 KiB uniform random writes, iodepth 32, buffer off",
            "requests_per_host_second": none,
            "requests_per_host_second_token": token,
            "payload": figures,
        }),
    )
}

/// Peak resident set of this process, from /proc (Linux); 0 where it is unavailable.
fn peak_rss_bytes() -> u64 {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn bench_precondition(
    fill: f64,
    pattern: PatternArg,
    overwrite_rounds: f64,
    json: Option<&Path>,
) -> Result<(), String> {
    let cfg = SsdConfig {
        geometry: Geometry {
            channels: 8,
            chips_per_channel: 4,
            dies_per_chip: 2,
            planes_per_die: 2,
            blocks_per_plane: 2048,
            pages_per_block: 256,
            page_bytes: 8192,
            sector_bytes: 4096,
            oob_bytes_per_page: 128,
        },
        payload: PayloadMode::None,
        over_provisioning: 0.07,
        ..SsdConfig::default()
    };
    let raw = cfg.geometry.raw_bytes();
    let start = Instant::now();
    let mut ssd = Ssd::new(cfg, 1).map_err(|e| e.to_string())?;
    let p = Precondition {
        fill_fraction: fill,
        pattern: match pattern {
            PatternArg::Sequential => PreconditionPattern::Sequential,
            PatternArg::Random => PreconditionPattern::Random,
            PatternArg::RandomSimulated => PreconditionPattern::RandomSimulated,
        },
        overwrite_rounds,
    };
    ssd.precondition(&p, 1).map_err(|e| e.to_string())?;
    let host_time_s = start.elapsed().as_secs_f64();
    let filled = p.filled_pages(ssd.logical_pages());
    write_json(
        json,
        &json!({
            "raw_bytes": raw,
            "logical_bytes": ssd.info().capacity_sectors * ssd.info().sector_bytes as u64,
            "fill_fraction": fill,
            "pattern": p.pattern,
            "overwrite_rounds": overwrite_rounds,
            "pages_filled": filled,
            "host_time_s": host_time_s,
            "peak_rss_bytes": peak_rss_bytes(),
        }),
    )
}
