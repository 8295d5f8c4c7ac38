//! `afa reproduce ID`: rerun one of the papers' experiments and print the paper's figures
//! next to the measured ones, under the same labels, so anyone can compute the ratio.

use std::collections::BTreeMap;
use std::path::PathBuf;

use afa_array::{ArrayConfig, Level, LogRaidConfig, TwoPhaseConfig};
use afa_host::{CpuConfig, RunOptions, Workload};
use afa_nand::{CellMode, CellTiming, Geometry, NandTiming, PayloadMode};
use afa_ssd::{HostInterfaceConfig, SsdConfig, WriteBufferConfig};
use afa_workload::fio::parse_job_file;
use serde::Serialize;

use crate::volume::{ArraySpec, ArrayVolume, EngineChoice};

#[derive(Debug, clap::Args)]
pub struct ReproduceArgs {
    /// The experiment (see --list).
    pub id: Option<String>,
    /// A scaled-down run that finishes in about a minute.
    #[arg(long)]
    pub quick: bool,
    /// Writes the result as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Lists the experiments.
    #[arg(long)]
    pub list: bool,
}

/// The paper's figures and the measured ones, under the same labels.
#[derive(Debug, Clone, Serialize)]
pub struct Reproduction {
    pub id: String,
    pub unit: String,
    pub paper: BTreeMap<String, f64>,
    pub measured: BTreeMap<String, f64>,
}

type Experiment = fn(quick: bool, seed: u64) -> Result<Reproduction, String>;

/// Every experiment: id, what it reproduces, and the function that runs it.
const EXPERIMENTS: &[(&str, &str, Experiment)] = &[
    (
        "scalaafa-fig3",
        "ScalaAFA Fig. 3a/3b and §6.2: FusionRAID-style two-phase write on 4+1 Table 1 SSDs, \
     64 KiB writes: replication-phase GB/s with 1/2/8 kernel threads, GB/s once conversion \
     runs, and 64 KiB random-write throughput over RAID 5",
        scalaafa_fig3,
    ),
    (
        "swan-fig1",
        "SWAN Fig. 1: Log-RAID0 over eight SATA-class SSDs (about 140 MB/s of writes each) \
     under sustained 8 KiB random writes: MB/s before the array has been written once, \
     and the mean, low and high MB/s once segment cleaning runs",
        swan_fig1,
    ),
    (
        "ox-fig12",
        "OX Fig. 12: done records per MiB of host flush, block vs batch interface",
        |q, s| ox("ox-fig12", q, s),
    ),
    (
        "ox-fig13",
        "OX Fig. 13: YCSB throughput of the batch over the block interface at host cache 20% and 80%",
        |q, s| ox("ox-fig13", q, s),
    ),
    (
        "ox-table4",
        "OX Table 4: GC overhead and read amplification, block vs batch, host cache 20%",
        |q, s| ox("ox-table4", q, s),
    ),
];

/// The OX experiments live in `afa-ox`; the id is added here so every entry writes the same
/// JSON shape.
fn ox(id: &str, quick: bool, seed: u64) -> Result<Reproduction, String> {
    let r = afa_ox::reproduce::reproduce(id, quick, seed)?;
    Ok(Reproduction {
        id: id.into(),
        unit: r.unit,
        paper: r.paper,
        measured: r.measured,
    })
}

pub fn run(args: ReproduceArgs) -> Result<(), String> {
    if args.list || args.id.is_none() {
        for (id, what, _) in EXPERIMENTS {
            println!("{id}\n    {what}");
        }
        return Ok(());
    }
    let id = args.id.unwrap_or_default();
    let (_, _, experiment) = EXPERIMENTS
        .iter()
        .find(|(name, _, _)| *name == id)
        .ok_or_else(|| {
            let known: Vec<&str> = EXPERIMENTS.iter().map(|e| e.0).collect();
            format!("unknown experiment {id:?}; known: {}", known.join(", "))
        })?;
    println!("seed: {}", args.seed);
    let r = experiment(args.quick, args.seed)?;
    println!("{} ({})", r.id, r.unit);
    println!(
        "{:<28} {:>10} {:>10} {:>7}",
        "label", "paper", "measured", "ratio"
    );
    for (label, paper) in &r.paper {
        let measured = r.measured.get(label).copied().unwrap_or(f64::NAN);
        println!(
            "{label:<28} {paper:>10.3} {measured:>10.3} {:>7.2}",
            measured / paper
        );
    }
    if let Some(path) = args.json {
        let text = serde_json::to_string_pretty(&r).map_err(|e| e.to_string())?;
        std::fs::write(&path, text + "\n")
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

/// The FEMU SSD of ScalaAFA Table 1: 8 channels of 12 dies, 1 plane, 352 blocks of 512
/// pages of 4 KiB, 7,500 / 4,890 MB/s read / write. The latencies are chosen so that the
/// dies, not the link, bound writes at 4,890 MB/s (96 dies × 4 KiB / 80 µs) and the 7,500
/// MB/s link bounds reads. `blocks_per_plane` scales the capacity down for quick runs.
pub fn scalaafa_table1_ssd(blocks_per_plane: u32, payload: PayloadMode) -> SsdConfig {
    SsdConfig {
        geometry: Geometry {
            channels: 8,
            chips_per_channel: 12,
            dies_per_chip: 1,
            planes_per_die: 1,
            blocks_per_plane,
            pages_per_block: 512,
            page_bytes: 4096,
            sector_bytes: 4096,
            oob_bytes_per_page: 128,
        },
        timing: NandTiming {
            mlc: CellTiming {
                read_ns: 40_000,
                program_ns: 78_000,
                erase_ns: 2_000_000,
                endurance_cycles: 3_000,
            },
            channel_mb_s: 1_200.0,
            ..NandTiming::default()
        },
        cell_mode: CellMode::Mlc,
        // FEMU's default spare is enough for the GC reserve even at the quick scale.
        over_provisioning: 0.12,
        payload,
        host: HostInterfaceConfig {
            bandwidth_mb_s: 7_500.0,
            ..HostInterfaceConfig::default()
        },
        write_buffer: WriteBufferConfig {
            capacity_bytes: 0,
            ..WriteBufferConfig::default()
        },
        ..SsdConfig::default()
    }
}

/// Runs an inline fio job file on `device` through the host CPU model.
fn run_jobs(
    device: &mut dyn afa_ssd::BlockDevice,
    host: &CpuConfig,
    job: &str,
    seed: u64,
    timeline_interval_ns: u64,
) -> Result<(afa_host::RunOutcome, serde_json::Value), String> {
    let jobs = parse_job_file(job).map_err(|e| format!("experiment job: {e}"))?;
    let options = RunOptions {
        seed,
        timeline_interval_ns,
        preconditioned_sectors: 0,
        background_work: true,
        show_progress: false,
    };
    let (outcome, cpu) = crate::run_on(device, Some(host), &Workload::Jobs(jobs), &options)?;
    if outcome.mismatches > 0 {
        return Err(format!(
            "{} sectors read back wrong in the experiment",
            outcome.mismatches
        ));
    }
    Ok((outcome, cpu.unwrap_or_default()))
}

/// `threads` fio jobs, each writing its own `bytes_per_job` region sequentially in 64 KiB
/// requests at queue depth 32 (fio's default `numjobs` layout, one region per thread).
fn sequential_jobs(threads: u32, bytes_per_job: u64) -> String {
    let mut job = String::from("[global]\nrw=write\nbs=64k\niodepth=32\n");
    for t in 0..threads {
        job.push_str(&format!(
            "[writer{t}]\noffset={}\nsize={bytes_per_job}\n",
            t as u64 * bytes_per_job
        ));
    }
    job
}

fn fig3_volume(
    level: Level,
    two_phase: bool,
    blocks: u32,
    seed: u64,
    interval_ns: u64,
) -> Result<ArrayVolume, String> {
    let spec = ArraySpec {
        engine: ArrayConfig {
            level,
            members: 5,
            chunk_bytes: 64 * 1024,
            // The host CPU model charges parity time; the engine's own parity delay uses
            // the same kernel rate.
            parity_mb_s: afa_host::cpu::CpuCosts::of(afa_host::StackProfile::Kernel).parity_mb_s,
            ..ArrayConfig::default()
        },
        choice: if two_phase {
            EngineChoice::TwoPhase(TwoPhaseConfig::default())
        } else {
            EngineChoice::Raid
        },
        spares: 0,
        failures: Vec::new(),
    };
    let ssd = scalaafa_table1_ssd(blocks, PayloadMode::None);
    ArrayVolume::build(&spec, &ssd, seed, interval_ns)
}

fn scalaafa_fig3(quick: bool, seed: u64) -> Result<Reproduction, String> {
    let blocks = if quick { 48 } else { 352 };
    let kernel = |threads| CpuConfig {
        threads,
        ..CpuConfig::default()
    };
    let mut measured = BTreeMap::new();
    // Replication phase: write 80% of the watermark, so that no conversion runs.
    for threads in [1u32, 2, 8] {
        let mut v = fig3_volume(Level::Raid5, true, blocks, seed, 0)?;
        let ArrayVolume::TwoPhase(tp) = &v else {
            unreachable!("built as two-phase")
        };
        let budget = tp.watermark_chunks() * 64 * 1024 * 8 / 10;
        let per_job = budget / threads as u64 / (64 * 1024) * (64 * 1024);
        let (outcome, _) = run_jobs(
            v.device(),
            &kernel(threads),
            &sequential_jobs(threads, per_job),
            seed,
            0,
        )?;
        let ArrayVolume::TwoPhase(tp) = &v else {
            unreachable!("built as two-phase")
        };
        if tp.stats().stripes_converted != 0 {
            return Err("the replication-phase run reached the watermark".into());
        }
        measured.insert(
            format!("rep_{threads}t_gbps"),
            outcome.measurements.write.bandwidth_mb_s / 1e3,
        );
    }
    // Conversion: one thread writes three watermarks' worth; throughput is taken from the
    // timeline once conversion has run for a while.
    let interval_ns = 10_000_000;
    let mut v = fig3_volume(Level::Raid5, true, blocks, seed, interval_ns)?;
    let ArrayVolume::TwoPhase(tp) = &v else {
        unreachable!("built as two-phase")
    };
    let total = tp.watermark_chunks() * 64 * 1024 * 3;
    let (outcome, _) = run_jobs(
        v.device(),
        &kernel(1),
        &sequential_jobs(1, total),
        seed,
        interval_ns,
    )?;
    let ArrayVolume::TwoPhase(tp) = &v else {
        unreachable!("built as two-phase")
    };
    let start_ns = tp
        .stats()
        .first_conversion_ns
        .ok_or("conversion never started")?;
    let end_ns = outcome.sim_time_ns;
    let from_ms = (start_ns + 5 * interval_ns) as f64 / 1e6;
    let to_ms = end_ns.saturating_sub(interval_ns) as f64 / 1e6;
    let points: Vec<f64> = outcome
        .measurements
        .timeline
        .iter()
        .filter(|p| p.t_ms >= from_ms && p.t_ms < to_ms)
        .map(|p| p.write_mb_s)
        .collect();
    if points.is_empty() {
        return Err("the conversion phase was too short to measure".into());
    }
    measured.insert(
        "conv_gbps".into(),
        points.iter().sum::<f64>() / points.len() as f64 / 1e3,
    );
    // 64 KiB random writes, one thread: two-phase (replication phase) against RAID 5
    // (read-modify-write per chunk, no stripe cache: stRAID's case).
    let mut random = BTreeMap::new();
    for (name, two_phase) in [("two-phase", true), ("raid5", false)] {
        let mut v = fig3_volume(Level::Raid5, two_phase, blocks, seed, 0)?;
        let capacity = v.device().info().capacity_sectors * 4096;
        let budget = match &v {
            ArrayVolume::TwoPhase(tp) => tp.watermark_chunks() * 64 * 1024 * 8 / 10,
            _ => capacity / 8,
        };
        let budget = budget.min(capacity / 8) / (64 * 1024) * (64 * 1024);
        let job = format!(
            "[randwrite]\nrw=randwrite\nbs=64k\niodepth=32\nsize={capacity}\nio_size={budget}\n"
        );
        let (outcome, _) = run_jobs(v.device(), &kernel(1), &job, seed, 0)?;
        random.insert(name, outcome.measurements.write.bandwidth_mb_s);
    }
    measured.insert(
        "randwrite_two-phase/raid5".into(),
        random["two-phase"] / random["raid5"],
    );
    let paper = BTreeMap::from([
        ("rep_1t_gbps".to_string(), 4.8),
        ("rep_2t_gbps".to_string(), 7.2),
        ("rep_8t_gbps".to_string(), 12.2),
        ("conv_gbps".to_string(), 0.55),
        ("randwrite_two-phase/raid5".to_string(), 3.6),
    ]);
    Ok(Reproduction {
        id: "scalaafa-fig3".into(),
        unit: "GB/s (10^9 B/s) for *_gbps; ratio for randwrite".into(),
        paper,
        measured,
    })
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use afa_ssd::Ssd;

    /// One Table 1 SSD alone: 64 KiB sequential writes reach the paper's 4,890 MB/s and
    /// reads its 7,500 MB/s, within 10%.
    #[test]
    fn table1_ssd_has_the_papers_bandwidth() {
        let mut ssd = Ssd::new(scalaafa_table1_ssd(48, PayloadMode::None), 1).unwrap();
        let job = "[w]\nrw=write\nbs=64k\niodepth=32\nsize=512m\n\
                   [r]\nstonewall\nrw=read\nbs=64k\niodepth=32\nsize=512m\n";
        let options = RunOptions {
            seed: 1,
            timeline_interval_ns: 0,
            preconditioned_sectors: 0,
            background_work: true,
            show_progress: false,
        };
        let jobs = parse_job_file(job).unwrap();
        let out = afa_host::run(&mut ssd, &Workload::Jobs(jobs), &options).unwrap();
        let w = out.measurements.write.bandwidth_mb_s;
        let r = out.measurements.read.bandwidth_mb_s;
        assert!((w / 4_890.0 - 1.0).abs() < 0.1, "write {w} MB/s");
        assert!((r / 7_500.0 - 1.0).abs() < 0.1, "read {r} MB/s");
    }
}
