//! One WAFLASH run: build the SSD, generate a Filebench-like stream for it (or take a block
//! trace), precondition the data it finds on the device, and drive the stream through the
//! host driver, which checks every read.

use afa_host::{RunOptions, RunOutcome, TraceReplay, Workload};
use afa_ssd::BlockDevice;
use afa_workload::trace::TraceRecord;

use crate::filebench::{generate, FilebenchSpec};
use crate::{WaflashConfig, WaflashReport, WaflashSsd};

/// What one run measured.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub outcome: RunOutcome,
    pub report: WaflashReport,
}

impl RunResult {
    /// Bytes read and written per second, in MB/s, over the time until the last request
    /// completed (idle-time merging after the last request does not count).
    pub fn throughput_mb_s(&self) -> f64 {
        let m = &self.outcome.measurements;
        let duration_s = [&m.read, &m.write]
            .iter()
            .filter(|op| op.bandwidth_mb_s > 0.0)
            .map(|op| op.bytes as f64 / (op.bandwidth_mb_s * 1e6))
            .fold(0.0, f64::max);
        if duration_s == 0.0 {
            return 0.0;
        }
        (m.read.bytes + m.write.bytes) as f64 / duration_s / 1e6
    }

    /// Mean latency over reads and writes, in microseconds.
    pub fn latency_us_mean(&self) -> f64 {
        let m = &self.outcome.measurements;
        let n = (m.read.ios + m.write.ios) as f64;
        if n == 0.0 {
            return 0.0;
        }
        (m.read.latency_us.mean * m.read.ios as f64 + m.write.latency_us.mean * m.write.ios as f64)
            / n
    }
}

/// Runs `spec` on a fresh SSD built from `config` and `seed`. Fails on any device error or
/// any read that does not return what was written.
pub fn run_filebench(
    config: &WaflashConfig,
    spec: &FilebenchSpec,
    seed: u64,
) -> Result<RunResult, String> {
    config.validate().map_err(|e| e.to_string())?;
    let sector = config.geometry.sector_bytes as u64;
    let capacity_bytes = config.logical_pages() as u64 * config.sectors_per_page() as u64 * sector;
    let generated = generate(spec, capacity_bytes, sector).map_err(|e| e.to_string())?;
    let replay = TraceReplay::Closed {
        iodepth: generated.iodepth,
    };
    run_trace(
        config,
        generated.records,
        replay,
        generated.footprint_bytes,
        seed,
    )
}

/// Replays `records` on a fresh SSD built from `config` and `seed`, after preconditioning
/// bytes `0..footprint_bytes` (the data a real volume already holds, so partial-page
/// overwrites find an old version to read). Fails on any device error or any read that
/// does not return what was written.
pub fn run_trace(
    config: &WaflashConfig,
    records: Vec<TraceRecord>,
    replay: TraceReplay,
    footprint_bytes: u64,
    seed: u64,
) -> Result<RunResult, String> {
    let mut ssd = WaflashSsd::new(config.clone(), seed).map_err(|e| e.to_string())?;
    let sector = ssd.info().sector_bytes as u64;
    let preconditioned = footprint_bytes.div_ceil(sector);
    ssd.precondition(preconditioned)
        .map_err(|e| e.to_string())?;
    ssd.reset_counters();
    let workload = Workload::Trace { records, replay };
    let options = RunOptions {
        seed,
        timeline_interval_ns: 0,
        preconditioned_sectors: preconditioned,
        background_work: true,
        show_progress: false,
    };
    let outcome = afa_host::run(&mut ssd, &workload, &options).map_err(|e| e.to_string())?;
    if outcome.mismatches > 0 {
        return Err(format!(
            "{} of {} checked sectors read back wrong; first: {:?}",
            outcome.mismatches, outcome.reads_checked, outcome.first_mismatches
        ));
    }
    Ok(RunResult {
        report: ssd.report(),
        outcome,
    })
}
