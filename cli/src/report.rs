//! Joins a run's measurements with the device's counters into the run report.

use afa_host::Monitored;
use afa_host::RunOutcome;
use afa_nand::{Nand, NandCounters};
use afa_report::{GcReport, IntegrityReport, MemberReport, NandReport, RunReport, WearReport};
use afa_ssd::{FtlStats, Ssd};

/// `devices` are the SSDs behind the volume (one, or an array's members); their counters are
/// summed. `host_page_writes` is the volume's user page writes, the WAF denominator.
pub fn build(
    devices: &[&Ssd],
    host_page_writes: u64,
    outcome: &RunOutcome,
    seed: u64,
    host_time_s: f64,
    config: serde_json::Value,
) -> RunReport {
    let mut gc = GcReport::default();
    let mut static_wl_moves = 0;
    for d in devices {
        let g = gc_report(d.ftl_stats());
        gc.runs += g.runs;
        gc.foreground_runs += g.foreground_runs;
        gc.background_runs += g.background_runs;
        gc.pages_moved += g.pages_moved;
        gc.slc_evictions += g.slc_evictions;
        gc.idle_erases += g.idle_erases;
        static_wl_moves += d.ftl_stats().static_wl_moves;
    }
    let nands: Vec<&Nand> = devices.iter().map(|d| d.nand()).collect();
    let mut report = build_from_media(&nands, host_page_writes, outcome, seed, host_time_s, config);
    report.gc = gc;
    report.wear.static_wl_moves = static_wl_moves;
    report
}

/// The run report of a volume over the flash media `nands`, from what the media count
/// (reads, programs, erases, wear, busy dies); GC and wear levelling, which only an FTL
/// knows, are left empty for the caller to fill. A WAFLASH or an OX SSD reports through
/// this with its own counters added under `device`.
pub fn build_from_media(
    nands: &[&Nand],
    host_page_writes: u64,
    outcome: &RunOutcome,
    seed: u64,
    host_time_s: f64,
    config: serde_json::Value,
) -> RunReport {
    let mut n = NandCounters::default();
    for nand in nands {
        let c = nand.counters();
        for i in 0..3 {
            n.reads[i] += c.reads[i];
            n.programs[i] += c.programs[i];
            n.erases[i] += c.erases[i];
        }
        n.read_suspends += c.read_suspends;
    }
    let programs: u64 = n.programs.iter().sum();
    let m = &outcome.measurements;
    let nand = nand_report(&n);
    let mut erase_min = u64::MAX;
    let mut erase_max = 0u64;
    let mut erase_sum = 0u64;
    let mut good = 0u64;
    for nand in nands {
        for block in 0..nand.geometry().blocks_total() {
            if nand.is_bad(block) {
                continue;
            }
            let e = nand.erase_count(block) as u64;
            erase_min = erase_min.min(e);
            erase_max = erase_max.max(e);
            erase_sum += e;
            good += 1;
        }
    }
    let faults: afa_nand::MediaFaults = nands.iter().map(|n| n.media_faults()).sum();
    let endurance = nands
        .first()
        .map_or(1, |n| n.timing().of(n.dense_mode()).endurance_cycles);
    let sim = outcome.sim_time_ns.max(1) as f64;
    RunReport {
        seed,
        sim_time_ns: outcome.sim_time_ns,
        host_time_s,
        config,
        read: m.read.clone(),
        write: m.write.clone(),
        trim: m.trim.clone(),
        flush: m.flush.clone(),
        waf: if host_page_writes == 0 {
            0.0
        } else {
            programs as f64 / host_page_writes as f64
        },
        host_page_writes,
        nand,
        gc: GcReport::default(),
        wear: WearReport {
            erase_count_min: if good == 0 { 0 } else { erase_min },
            erase_count_max: erase_max,
            erase_count_mean: if good == 0 {
                0.0
            } else {
                erase_sum as f64 / good as f64
            },
            static_wl_moves: 0,
            life_used_fraction: erase_max as f64 / endurance as f64,
            bad_blocks: faults.bad_blocks,
            program_failures: faults.program_failures,
            erase_failures: faults.erase_failures,
        },
        integrity: IntegrityReport {
            reads_checked: outcome.reads_checked,
            mismatches: outcome.mismatches,
        },
        die_busy_fraction: nands
            .iter()
            .flat_map(|n| n.die_busy_ns())
            .map(|b| b as f64 / sim)
            .collect(),
        array: None,
        members: Vec::new(),
        cpu: None,
        timeline: m.timeline.clone(),
        device: serde_json::Map::new(),
        steady_state: outcome.steady_state.clone(),
        latency_target: outcome.latency_target.clone(),
    }
}

fn nand_report(n: &NandCounters) -> NandReport {
    NandReport {
        page_reads: n.reads.iter().sum(),
        page_programs: n.programs.iter().sum(),
        block_erases: n.erases.iter().sum(),
        slc_reads: n.reads[0],
        slc_programs: n.programs[0],
        slc_erases: n.erases[0],
        mlc_reads: n.reads[1] + n.reads[2],
        mlc_programs: n.programs[1] + n.programs[2],
        mlc_erases: n.erases[1] + n.erases[2],
        read_suspends: n.read_suspends,
    }
}

fn gc_report(f: &FtlStats) -> GcReport {
    GcReport {
        runs: f.gc_foreground_runs + f.gc_background_runs,
        foreground_runs: f.gc_foreground_runs,
        background_runs: f.gc_background_runs,
        pages_moved: f.gc_pages_moved,
        slc_evictions: f.slc_evictions,
        idle_erases: f.idle_erases,
        pages_moved_across_planes: f.gc_pages_moved_across_planes,
    }
}

/// Per-member counters and bandwidth timelines of an array's members.
pub fn member_reports(members: &[&Monitored<Ssd>], end_ns: u64) -> Vec<MemberReport> {
    members
        .iter()
        .map(|m| MemberReport {
            read_bytes: m.read_bytes,
            write_bytes: m.write_bytes,
            nand: nand_report(m.inner().nand_counters()),
            gc: gc_report(m.inner().ftl_stats()),
            timeline: m.timeline(end_ns),
        })
        .collect()
}
