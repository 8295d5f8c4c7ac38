//! `afa run` on a WAFLASH SSD: the `[waflash]` table of the run configuration.
//!
//! `[waflash.ssd]` is an `afa_waflash::WaflashConfig` (geometry, timing, buffer policy, FTL,
//! compaction); `[waflash.filebench]`, when present, replaces `[workload]` with one of the
//! Filebench-like generators. Either way the host driver checks every read.

use std::path::Path;

use afa_host::RunOptions;
use afa_ssd::BlockDevice;
use afa_waflash::experiment::run_filebench;
use afa_waflash::filebench::FilebenchSpec;
use afa_waflash::{WaflashConfig, WaflashSsd};
use serde::{Deserialize, Serialize};

use crate::config::RunConfig;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaflashRunConfig {
    #[serde(default)]
    pub ssd: WaflashConfig,
    /// A Filebench-like generator instead of `[workload]`.
    pub filebench: Option<FilebenchSpec>,
}

pub fn run(
    cfg: &RunConfig,
    w: &WaflashRunConfig,
    base_dir: &Path,
    json: Option<&Path>,
    quiet: bool,
) -> Result<(), String> {
    if cfg.array.is_some() {
        return Err("[waflash] and [array] are two devices; choose one".into());
    }
    let (outcome, report) = match &w.filebench {
        Some(spec) => {
            let r = run_filebench(&w.ssd, spec, cfg.seed)?;
            (r.outcome, r.report)
        }
        None => {
            let workload = crate::load_workload(&cfg.workload, base_dir)?;
            let mut ssd = WaflashSsd::new(w.ssd.clone(), cfg.seed).map_err(|e| e.to_string())?;
            let options = RunOptions {
                seed: cfg.seed,
                timeline_interval_ns: (cfg.report.timeline_interval_ms * 1e6) as u64,
                preconditioned_sectors: 0,
                background_work: cfg.workload.background_work.unwrap_or(true),
                show_progress: !quiet,
            };
            let device: &mut dyn BlockDevice = &mut ssd;
            let (outcome, _) = crate::run_on(device, cfg.host.as_ref(), &workload, &options)?;
            (outcome, ssd.report())
        }
    };
    let m = &outcome.measurements;
    if !quiet {
        println!(
            "simulated {:.3} ms, {} requests, {} reads checked, {} mismatches",
            outcome.sim_time_ns as f64 / 1e6,
            outcome.requests,
            outcome.reads_checked,
            outcome.mismatches
        );
        for (name, op) in [("read", &m.read), ("write", &m.write)] {
            println!(
                "{name:<5} {:>9} ios {:>9.1} MB/s  mean {:>9.1} µs  p99 {:>9.1} µs",
                op.ios, op.bandwidth_mb_s, op.latency_us.mean, op.latency_us.p99
            );
        }
        println!(
            "flash: {} reads, {} programs, {} erases; unaligned writes {}, partial pages to FTL {}, \
             extra reads {}, version writes {}, compacted pages {}",
            report.flash_reads,
            report.flash_programs,
            report.flash_erases,
            report.device.unaligned_writes,
            report.ftl.partial_page_writes,
            report.ftl.extra_reads,
            report.ftl.version_writes,
            report.ftl.compacted_pages
        );
    }
    if let Some(path) = json {
        let value = serde_json::json!({
            "seed": cfg.seed,
            "sim_time_ns": outcome.sim_time_ns,
            "read": m.read,
            "write": m.write,
            "integrity": {
                "reads_checked": outcome.reads_checked,
                "mismatches": outcome.mismatches,
            },
            "waflash": report,
            "config": w,
        });
        let text = serde_json::to_string_pretty(&value).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n")
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
