//! `afa run` on one OX SSD: the `[ox]` table of the run configuration behind its block
//! interface (OXBlock), driven by `[workload]` (a fio job file, an inline job or a trace)
//! with every read checked, as `[ssd]` and `[waflash]` runs are.
//!
//! With the write cache write-through (the default), the host keeps as many commands in
//! flight as the job's iodepth says (up to 128) through OXBlock's queued interface, and the
//! controller runs them side by side; with a write-back cache a block FLUSH must drain it,
//! which only the one-command-at-a-time path does, so the device then serves one command at
//! a time whatever the iodepth; so it does behind the host CPU model (`[host]`), which times
//! each command it passes on. The summary line says which.

use std::path::Path;

use afa_host::RunOutcome;
use afa_ox::{OxBlockDevice, OxController};
use afa_report::{GcReport, RunReport};
use afa_ssd::BlockDevice;

use crate::config::RunConfig;

/// Runs one OX SSD behind OXBlock and returns its run report (the controller's counters
/// under `ox`, its GC in `gc`; `waf` counts every WBLOCK programmed, LPAGEs, padding, GC
/// copies, log and table pages, per WBLOCK of LPAGEs the host wrote), the outcome and the
/// controller's summary line.
pub fn run(
    cfg: &RunConfig,
    ox: &afa_ox::OxConfig,
    base_dir: &Path,
    config_json: serde_json::Value,
    options: &afa_host::RunOptions,
) -> Result<(RunReport, RunOutcome, String), String> {
    let workload = crate::load_workload(&cfg.workload, base_dir)?;
    let ctrl = OxController::format(ox, cfg.seed).map_err(|e| format!("ox: {e}"))?;
    let mut device = OxBlockDevice::new(ctrl);
    let host_start = std::time::Instant::now();
    let (outcome, cpu) = {
        let dev: &mut dyn BlockDevice = &mut device;
        crate::run_on(
            dev,
            cfg.host.as_ref(),
            &workload,
            options,
            crate::Notes::Print,
        )
        .map_err(|e| device.media_faults().explain(e))?
    };
    let host_time_s = host_start.elapsed().as_secs_f64();
    // A controller can stop after the last command completed, in work it does on its own
    // (GC, a checkpoint, writing what a write-back cache acknowledged). No command reports
    // that, so the run does: a device that failed is not a result.
    if let Some(e) = device.controller().fatal_error() {
        return Err(device.media_faults().explain(format!(
            "ox: the device stopped after the workload's last command completed: {e}"
        )));
    }
    let stats = *device.controller().stats();
    let nand = device.controller().media().nand();
    let wblock_bytes = ox.terms.wblock_bytes as u64;
    // The medium's counters include the format's few programs (bad-block tables and the
    // first checkpoint), as a drive's own counters would.
    let mut report = crate::report::build_from_media(
        &[nand],
        stats.user_write_bytes.div_ceil(wblock_bytes),
        &outcome,
        cfg.seed,
        host_time_s,
        config_json,
    );
    report.gc = GcReport {
        runs: stats.gc_victims,
        foreground_runs: stats.gc_victims,
        pages_moved: stats.gc_write_bytes / ox.terms.rblock_bytes as u64,
        ..GcReport::default()
    };
    report.cpu = cpu;
    let cache = if ox.write_cache.write_back {
        "write-back cache, "
    } else {
        ""
    };
    // Media faults are named only when some happened, so that a run without them reads
    // as before and one with them shows what the FTL absorbed.
    let media = device.controller().media().counters();
    let faults = if media.program_failures + media.erase_failures + stats.eblocks_retired > 0 {
        format!(
            "; media faults: {} failed programs, {} failed erases, {} EBLOCKs retired \
             ({} bad-block table or checkpoint EBLOCKs replaced, {} log blocks bridged)",
            media.program_failures,
            media.erase_failures,
            stats.eblocks_retired,
            stats.system_eblocks_replaced,
            stats.log_bridges
        )
    } else {
        String::new()
    };
    let line = format!(
        "ox (OXBlock, {cache}up to {} commands outstanding): {} write contexts, {} done records, \
         {} RDESC_A, {} checkpoints, {} GC victims ({:.1} MB moved, {:.1} MB reclaimed), \
         {} MAP page loads{faults}",
        device.info().max_queue_depth,
        stats.contexts,
        stats.done_records,
        stats.rdesc_a_records,
        stats.checkpoints,
        stats.gc_victims,
        stats.gc_write_bytes as f64 / 1e6,
        stats.gc_reclaimed_bytes as f64 / 1e6,
        stats.map_page_loads,
    );
    report.device.insert(
        "ox".into(),
        serde_json::to_value(stats).map_err(|e| e.to_string())?,
    );
    Ok((report, outcome, line))
}
