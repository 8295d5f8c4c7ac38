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
    let mut ssd = WaflashSsd::new(config.clone(), seed).map_err(|e| e.to_string())?;
    run_filebench_on(&mut ssd, spec, quiet_options(seed))
}

/// A run's options without a timeline or a progress bar, as the reproductions run them.
fn quiet_options(seed: u64) -> RunOptions {
    RunOptions {
        seed,
        timeline_interval_ns: 0,
        preconditioned_sectors: 0,
        background_work: true,
        show_progress: false,
        record_requests: false,
    }
}

/// What the device holds before a trace is replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precondition {
    /// Every sector of bytes `0..footprint_bytes`: a volume in use, so that every partial-page
    /// overwrite finds an old version to read.
    Footprint,
    /// Only the sectors below the footprint that the trace reads, as SSDSim's
    /// `pre_process_page` maps them before a replay (so that reads find data); a page the
    /// trace only writes starts unwritten, and a partial write needs a read only where an old
    /// version holds sectors it does not cover.
    ReadSectors,
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
    run_trace_preconditioned(
        config,
        records,
        replay,
        footprint_bytes,
        Precondition::Footprint,
        seed,
    )
}

/// Replays `records` as `run_trace` does, with the device preconditioned as `precondition`
/// says. The host's oracle expects version-0 content on every sector below the footprint:
/// under `ReadSectors` a sector the trace never reads is never checked, and every sector it
/// reads is either preconditioned or written first, so every check stays exact.
pub fn run_trace_preconditioned(
    config: &WaflashConfig,
    records: Vec<TraceRecord>,
    replay: TraceReplay,
    footprint_bytes: u64,
    precondition: Precondition,
    seed: u64,
) -> Result<RunResult, String> {
    let mut ssd = WaflashSsd::new(config.clone(), seed).map_err(|e| e.to_string())?;
    run_trace_on(
        &mut ssd,
        records,
        replay,
        footprint_bytes,
        precondition,
        quiet_options(seed),
    )
}

/// Runs `spec` as `run_filebench` does, on `ssd` (fresh from `WaflashSsd::new`), which the
/// caller keeps to look at its flash afterwards; `options` gives the seed, the timeline and
/// the progress bar (the preconditioned sectors are set here).
pub fn run_filebench_on(
    ssd: &mut WaflashSsd,
    spec: &FilebenchSpec,
    options: RunOptions,
) -> Result<RunResult, String> {
    let config = ssd.config();
    let sector = config.geometry.sector_bytes as u64;
    let capacity_bytes = config.logical_pages() as u64 * config.sectors_per_page() as u64 * sector;
    let generated = generate(spec, capacity_bytes, sector).map_err(|e| e.to_string())?;
    let replay = TraceReplay::Closed {
        iodepth: generated.iodepth,
    };
    run_trace_on(
        ssd,
        generated.records,
        replay,
        generated.footprint_bytes,
        Precondition::Footprint,
        options,
    )
}

/// The body of `run_trace_preconditioned` on a given SSD.
fn run_trace_on(
    ssd: &mut WaflashSsd,
    records: Vec<TraceRecord>,
    replay: TraceReplay,
    footprint_bytes: u64,
    precondition: Precondition,
    mut options: RunOptions,
) -> Result<RunResult, String> {
    let sector = ssd.info().sector_bytes as u64;
    let preconditioned = footprint_bytes.div_ceil(sector);
    match precondition {
        Precondition::Footprint => ssd.precondition(preconditioned),
        Precondition::ReadSectors => {
            let spp = ssd.config().sectors_per_page() as u64;
            // One mask per page of the footprint, filled a page at a time: a trace's reads
            // cover most of it many times over.
            let mut masks = vec![0u64; preconditioned.div_ceil(spp) as usize];
            for r in records.iter().filter(|r| r.op == afa_workload::IoOp::Read) {
                let first = r.offset_bytes / sector;
                let end = (r.offset_bytes + r.len_bytes)
                    .div_ceil(sector)
                    .min(preconditioned);
                let mut lba = first;
                while lba < end {
                    let page = lba / spp;
                    let page_end = ((page + 1) * spp).min(end);
                    let (from, count) = ((lba % spp) as u32, (page_end - lba) as u32);
                    let run = if count >= 64 {
                        u64::MAX
                    } else {
                        ((1u64 << count) - 1) << from
                    };
                    masks[page as usize] |= run;
                    lba = page_end;
                }
            }
            let pages: Vec<(u32, u64)> = masks
                .into_iter()
                .enumerate()
                .filter(|&(_, mask)| mask != 0)
                .map(|(page, mask)| (page as u32, mask))
                .collect();
            ssd.precondition_sectors(&pages)
        }
    }
    .map_err(|e| e.to_string())?;
    ssd.reset_counters();
    let workload = Workload::Trace { records, replay };
    options.preconditioned_sectors = preconditioned;
    let outcome = afa_host::run(ssd, &workload, &options).map_err(|e| e.to_string())?;
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
