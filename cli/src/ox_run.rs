//! `afa run` on one OX SSD: the `[ox]` table of the run configuration behind its block
//! interface (OXBlock), driven by `[workload]` (a fio job file, an inline job or a trace)
//! with every read checked, as `[ssd]` and `[waflash]` runs are.
//!
//! OXBlock serves one command at a time (each packet of a write is its own WAL context, so
//! the controller runs every command to completion before it takes the next), so the host
//! keeps one command outstanding whatever the job's iodepth says; the report says so.

use std::path::Path;

use afa_ox::{OxBlockDevice, OxController, OxStats};
use afa_ssd::BlockDevice;

use crate::config::RunConfig;

/// Write amplification inside the controller: every byte it programmed (user LPAGEs, WBLOCK
/// padding, GC copies, log blocks and table pages, each of the latter a WBLOCK) per byte of
/// LPAGEs the host wrote.
fn write_amplification(s: &OxStats, wblock_bytes: u64) -> f64 {
    if s.user_write_bytes == 0 {
        return 0.0;
    }
    let programmed = s.user_write_bytes
        + s.padding_bytes
        + s.gc_write_bytes
        + (s.log_blocks_written + s.table_pages_written) * wblock_bytes;
    programmed as f64 / s.user_write_bytes as f64
}

pub fn run(
    cfg: &RunConfig,
    ox: &afa_ox::OxConfig,
    base_dir: &Path,
    json: Option<&Path>,
    quiet: bool,
) -> Result<(), String> {
    let workload = crate::load_workload(&cfg.workload, base_dir)?;
    let ctrl = OxController::format(ox, cfg.seed).map_err(|e| format!("ox: {e}"))?;
    let mut device = OxBlockDevice::new(ctrl);
    let options = crate::device_run_options(cfg, quiet);
    let (outcome, cpu) = {
        let dev: &mut dyn BlockDevice = &mut device;
        crate::run_on(dev, cfg.host.as_ref(), &workload, &options)?
    };
    let stats = *device.controller().stats();
    let wblock_bytes = ox.terms.wblock_bytes as u64;
    let waf = write_amplification(&stats, wblock_bytes);
    if !quiet {
        crate::print_device_run(&outcome, " (OXBlock: one command outstanding)");
        println!(
            "ox: {} write contexts, {} done records, {} RDESC_A, {} checkpoints, {} GC victims \
             ({:.1} MB moved, {:.1} MB reclaimed), {} MAP page loads, write amplification {:.3}",
            stats.contexts,
            stats.done_records,
            stats.rdesc_a_records,
            stats.checkpoints,
            stats.gc_victims,
            stats.gc_write_bytes as f64 / 1e6,
            stats.gc_reclaimed_bytes as f64 / 1e6,
            stats.map_page_loads,
            waf
        );
    }
    if let Some(path) = json {
        let device = serde_json::json!({
            "ox": stats,
            "ox_write_amplification": waf,
            "host_cpu": cpu,
            "config": cfg,
        });
        crate::write_device_json(path, cfg.seed, &outcome, device)?;
    }
    crate::integrity_verdict(&outcome)
}
