//! SWAN (ATC '19) experiments and a SATA-class SSD like the paper's Samsung 850 PRO.

use std::collections::BTreeMap;

use afa_array::{ArrayConfig, Level, LogRaidConfig};
use afa_host::{RunOptions, Workload};
use afa_nand::{CellMode, CellTiming, Geometry, NandTiming, PayloadMode};
use afa_ssd::{HostInterfaceConfig, SsdConfig, WriteBufferConfig};
use afa_workload::fio::parse_job_file;

use super::{Entry, Reproduction};
use crate::volume::{ArraySpec, ArrayVolume, EngineChoice};

pub const EXPERIMENTS: &[Entry] = &[(
    "swan-fig1",
    "SWAN Fig. 1: Log-RAID0 over eight SATA-class SSDs (about 140 MB/s of writes each) \
     under sustained 8 KiB random writes: MB/s before the array has been written once, \
     and the mean, low and high MB/s once segment cleaning runs",
    swan_fig1,
)];

/// A SATA-class SSD whose dies bound 8 KiB writes at about 145 MB/s (8 dies × 8 KiB per
/// 450 µs), standing in for SWAN's Samsung 850 PRO at its effective 140 MB/s.
/// `blocks_per_plane` sets the capacity.
pub fn swan_sata_ssd(blocks_per_plane: u32) -> SsdConfig {
    SsdConfig {
        geometry: Geometry {
            channels: 4,
            chips_per_channel: 1,
            dies_per_chip: 2,
            planes_per_die: 1,
            blocks_per_plane,
            pages_per_block: 128,
            page_bytes: 8192,
            sector_bytes: 4096,
            oob_bytes_per_page: 128,
        },
        timing: NandTiming {
            mlc: CellTiming {
                read_ns: 60_000,
                program_ns: 450_000,
                erase_ns: 3_000_000,
                endurance_cycles: 3_000,
            },
            channel_mb_s: 400.0,
            ..NandTiming::default()
        },
        cell_mode: CellMode::Mlc,
        over_provisioning: 0.07,
        payload: PayloadMode::None,
        host: HostInterfaceConfig {
            bandwidth_mb_s: 550.0,
            ..HostInterfaceConfig::default()
        },
        write_buffer: WriteBufferConfig {
            capacity_bytes: 0,
            ..WriteBufferConfig::default()
        },
        ..SsdConfig::default()
    }
}

fn swan_fig1(quick: bool, seed: u64) -> Result<Reproduction, String> {
    let blocks = if quick { 96 } else { 512 };
    let interval_ns: u64 = 100_000_000;
    let spec = ArraySpec {
        engine: ArrayConfig {
            level: Level::Raid0,
            members: 8,
            chunk_bytes: 64 * 1024,
            ..ArrayConfig::default()
        },
        choice: EngineChoice::Log(LogRaidConfig::default()),
        spares: 0,
        failures: Vec::new(),
    };
    let mut v = ArrayVolume::build(&spec, &swan_sata_ssd(blocks), seed, interval_ns)?;
    let capacity = v.device().info().capacity_sectors * 4096;
    let total = capacity * 3;
    let job =
        format!("[randwrite]\nrw=randwrite\nbs=8k\niodepth=64\nsize={capacity}\nio_size={total}\n");
    let jobs = parse_job_file(&job).map_err(|e| format!("experiment job: {e}"))?;
    let options = RunOptions {
        seed,
        timeline_interval_ns: interval_ns,
        preconditioned_sectors: 0,
        background_work: true,
        show_progress: false,
    };
    let outcome =
        afa_host::run(v.device(), &Workload::Jobs(jobs), &options).map_err(|e| e.to_string())?;
    // The interval in which the user has written the volume's capacity once.
    let seconds = interval_ns as f64 / 1e9;
    let timeline = &outcome.measurements.timeline;
    let mut written = 0.0;
    let mut filled_at = timeline.len();
    for (i, p) in timeline.iter().enumerate() {
        written += p.write_mb_s * 1e6 * seconds;
        if written >= capacity as f64 {
            filled_at = i;
            break;
        }
    }
    let before: Vec<f64> = timeline[..filled_at * 8 / 10]
        .iter()
        .map(|p| p.write_mb_s)
        .collect();
    // After a second capacity's worth, cleaning is in its steady rhythm; the last partial
    // interval is left out.
    let after_start = (filled_at * 2).min(timeline.len());
    let after: Vec<f64> = timeline[after_start..timeline.len().saturating_sub(1)]
        .iter()
        .map(|p| p.write_mb_s)
        .collect();
    if before.is_empty() || after.len() < 4 {
        return Err("the run was too short to see both phases".into());
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let measured = BTreeMap::from([
        ("before_fill_mb_s".to_string(), mean(&before)),
        ("after_fill_mean_mb_s".to_string(), mean(&after)),
        (
            "after_fill_low_mb_s".to_string(),
            after.iter().copied().fold(f64::INFINITY, f64::min),
        ),
        (
            "after_fill_high_mb_s".to_string(),
            after.iter().copied().fold(0.0, f64::max),
        ),
    ]);
    // Read off Figure 1: about the eight SSDs' 8 × 140 MB/s before, oscillating between 300
    // and 750 MB/s after.
    let paper = BTreeMap::from([
        ("before_fill_mb_s".to_string(), 1120.0),
        ("after_fill_mean_mb_s".to_string(), 525.0),
        ("after_fill_low_mb_s".to_string(), 300.0),
        ("after_fill_high_mb_s".to_string(), 750.0),
    ]);
    Ok(Reproduction {
        id: "swan-fig1".into(),
        unit: "MB/s (10^6 B/s) of user writes".into(),
        paper,
        measured,
    })
}
