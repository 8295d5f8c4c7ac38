//! `afa run` on a WAFLASH SSD: the `[waflash]` table of the run configuration.
//!
//! `[waflash.ssd]` is an `afa_waflash::WaflashConfig` (geometry, timing, buffer policy, FTL,
//! compaction); `[waflash.filebench]`, when present, replaces `[workload]` with one of the
//! Filebench-like generators. Either way the host driver checks every read.

use std::path::Path;

use afa_host::RunOutcome;
use afa_report::{GcReport, RunReport};
use afa_ssd::BlockDevice;
use afa_waflash::experiment::run_filebench_on;
use afa_waflash::filebench::FilebenchSpec;
use afa_waflash::{WaflashConfig, WaflashReport, WaflashSsd};
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

/// One line of what the device did with the writes it was given: how many were unaligned,
/// how the FTL served the partial pages (read-modify-write reads, versions, compacted
/// pages, merges) and what reached the flash. `afa run` prints it after a run, `afa serve`
/// when it stops.
pub fn summary(r: &WaflashReport) -> String {
    let mut line = format!(
        "WAFLASH: {} commands, {} unaligned writes, {} partial pages to the FTL, {} read-modify-write reads, {} version writes, {} compacted pages, {} version merges (foreground, GC, idle); flash {} reads, {} programs, {} erases",
        r.device.commands,
        r.device.unaligned_writes,
        r.ftl.partial_page_writes,
        r.ftl.extra_reads,
        r.ftl.version_writes,
        r.ftl.compacted_pages,
        r.ftl.forced_merges + r.ftl.gc_merges + r.ftl.idle_merges,
        r.flash_reads,
        r.flash_programs,
        r.flash_erases
    );
    // Media faults only when there were some, so that the line of a run without them reads
    // as before.
    let faults = [
        (r.ftl.program_failures, "failed programs"),
        (r.ftl.blocks_retired, "blocks retired"),
        (r.device.uncorrectable_reads, "uncorrectable reads"),
    ];
    if faults.iter().any(|&(n, _)| n > 0) {
        let parts: Vec<String> = faults
            .iter()
            .map(|(n, what)| format!("{n} {what}"))
            .collect();
        line.push_str(&format!("; media faults: {}", parts.join(", ")));
    }
    line
}

/// Runs one WAFLASH SSD and returns its run report (the device's own report under
/// `waflash`, its GC in `gc`), the outcome and the device's summary line.
pub fn run(
    cfg: &RunConfig,
    w: &WaflashRunConfig,
    base_dir: &Path,
    config_json: serde_json::Value,
    options: &afa_host::RunOptions,
) -> Result<(RunReport, RunOutcome, String), String> {
    if cfg.array.is_some() {
        return Err("[waflash] and [array] are two devices; choose one".into());
    }
    let mut ssd = WaflashSsd::new(w.ssd.clone(), cfg.seed).map_err(|e| e.to_string())?;
    let host_start = std::time::Instant::now();
    let (outcome, cpu) = match &w.filebench {
        Some(spec) => (
            run_filebench_on(&mut ssd, spec, options.clone())
                .map_err(|e| ssd.media_faults().explain(e))?
                .outcome,
            None,
        ),
        None => {
            let workload = crate::load_workload(&cfg.workload, base_dir)?;
            let device: &mut dyn BlockDevice = &mut ssd;
            crate::run_on(
                device,
                cfg.host.as_ref(),
                &workload,
                options,
                crate::Notes::Print,
            )
            .map_err(|e| ssd.media_faults().explain(e))?
        }
    };
    let host_time_s = host_start.elapsed().as_secs_f64();
    let device = ssd.report();
    let mut report = crate::report::build_from_media(
        &[ssd.nand()],
        device.device.host_page_writes,
        &outcome,
        cfg.seed,
        host_time_s,
        config_json,
    );
    report.gc = GcReport {
        runs: device.ftl.gc_runs,
        foreground_runs: device.ftl.gc_runs,
        pages_moved: device.ftl.gc_pages_moved,
        ..GcReport::default()
    };
    report.cpu = cpu;
    let line = summary(&device);
    report.device.insert(
        "waflash".into(),
        serde_json::to_value(&device).map_err(|e| e.to_string())?,
    );
    Ok((report, outcome, line))
}
