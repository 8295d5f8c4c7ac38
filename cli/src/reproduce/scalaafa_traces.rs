//! ScalaAFA Figs. 12 and 13 (§6.3): mdraid, the FusionRAID-style two-phase engine and
//! ScalaAFA, both as they run by default (merging writes smaller than a chunk into whole
//! chunks) and writing such pieces in place (scalaafa as its public prototype does,
//! two-phase as FusionRAID's replicated writes do), on the six real workloads of Table 2,
//! here their synthesized stand-ins (`afa trace synth --like ROW`, docs/traces.md),
//! replayed at queue depth 32.

use std::collections::BTreeMap;

use afa_array::{ScalaAfaConfig, ScalaMode};
use afa_host::{CpuConfig, RunOptions, TraceReplay, Workload};
use afa_sim::parallel::map_in_parallel;
use afa_workload::trace::synth::{self, SynthOptions, Synthesizer};
use afa_workload::trace::TraceRecord;

use super::scalaafa::{self, blocks_for};
use super::{Entry, Reproduction};
use crate::volume::ArrayVolume;

pub const EXPERIMENTS: &[Entry] = &[(
    "scalaafa-fig12",
    "ScalaAFA Figs. 12 and 13: mdraid (RAID 5 with md's stripe cache), the FusionRAID-style \
     two-phase engine and scalaafa (merging sub-chunk writes, and both writing them in \
     place) on 4+1 Table 1 SSDs, replaying synthesized stand-ins for the six \
     Table 2 traces at iodepth 32: throughput, completion time and write latency",
    scalaafa_fig12,
)];

/// The engines of Figs. 12 and 13, in the order the paper plots them (Fig. 14 runs the
/// same ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Engine {
    Mdraid,
    TwoPhase,
    Scalaafa,
    /// The two-phase engine writing only what the user wrote into replicated chunks
    /// (`[array.two_phase] sub_chunk_writes = "in-place"`), as FusionRAID's replicated
    /// writes do.
    TwoPhaseInPlace,
    /// scalaafa with the public prototype's in-place updates of replicated chunks
    /// (`sub_chunk_writes = "in-place"`).
    ScalaafaInPlace,
}

impl Engine {
    /// Every engine replayed.
    const REPLAYED: [Engine; 5] = [
        Engine::Mdraid,
        Engine::TwoPhase,
        Engine::Scalaafa,
        Engine::TwoPhaseInPlace,
        Engine::ScalaafaInPlace,
    ];

    pub(super) fn name(self) -> &'static str {
        match self {
            Engine::Mdraid => "mdraid",
            Engine::TwoPhase => "two-phase",
            Engine::Scalaafa => "scalaafa",
            Engine::TwoPhaseInPlace => "two-phase-in-place",
            Engine::ScalaafaInPlace => "scalaafa-in-place",
        }
    }

    /// The same engine as the microbenchmark figures build it.
    pub(super) fn as_built(self) -> scalaafa::Engine {
        match self {
            Engine::Mdraid => scalaafa::Engine::Mdraid,
            Engine::TwoPhase => scalaafa::Engine::TwoPhase,
            Engine::Scalaafa => scalaafa::Engine::Scala(ScalaMode::Scalaafa),
            Engine::TwoPhaseInPlace => scalaafa::Engine::TwoPhaseInPlace,
            Engine::ScalaafaInPlace => scalaafa::Engine::ScalaInPlace,
        }
    }

    pub(super) fn host(self) -> CpuConfig {
        self.as_built().host(1)
    }
}

/// A fresh 4+1 array of `engine`, one I/O thread, ScalaAFA converting at its default
/// watermark.
pub(super) fn volume(engine: Engine, blocks: u32, seed: u64) -> Result<ArrayVolume, String> {
    let watermark = ScalaAfaConfig::default().convert_watermark_fraction;
    scalaafa::engine_volume(engine.as_built(), 4, 1, 1, blocks, seed, watermark)
}

/// The share of each Table 2 row a quick run replays: every row's request counts times
/// this, so the six traces keep their relative lengths. At full scale the share grows with
/// the SSDs (and their SLC caches), so both scales replay the same user bytes per byte of
/// SLC cache: about half a cache's worth for proxy0.
const QUICK_SHARE: f64 = 0.005;

/// A synthesized Table 2 trace, `share` of the row, over `volume_bytes`.
fn trace(name: &str, share: f64, volume_bytes: u64, seed: u64) -> Result<Vec<TraceRecord>, String> {
    let row = synth::profile(name).ok_or_else(|| format!("no trace profile {name}"))?;
    let mut options = SynthOptions::new(row);
    options.scale = share;
    options.seed = seed;
    options.volume_bytes = volume_bytes;
    Ok(Synthesizer::new(options)?.collect())
}

/// What one replay measured.
#[derive(Debug, Clone, Copy)]
struct TraceRun {
    /// Bytes read and written over the completion time, MB/s.
    mb_s: f64,
    completion_ns: u64,
    write_mean_us: f64,
    write_p99_us: f64,
    /// Bytes the members programmed or were sent per byte the trace wrote.
    member_write_amplification: f64,
    stripes_converted: u64,
}

fn replay(
    engine: Engine,
    records: &[TraceRecord],
    blocks: u32,
    seed: u64,
) -> Result<TraceRun, String> {
    let mut v = volume(engine, blocks, seed)?;
    let workload = Workload::Trace {
        records: records.to_vec(),
        replay: TraceReplay::Closed { iodepth: 32 },
    };
    let options = RunOptions {
        seed,
        timeline_interval_ns: 0,
        preconditioned_sectors: 0,
        background_work: true,
        show_progress: false,
        record_requests: false,
    };
    let (outcome, _) = crate::run_on(
        v.device(),
        Some(&engine.host()),
        &workload,
        &options,
        crate::Notes::Keep,
    )?;
    let m = &outcome.measurements;
    let member_write_sectors = scalaafa::member_write_sectors(&v);
    let stripes_converted = scalaafa::stripes_converted(&v);
    Ok(TraceRun {
        mb_s: (m.read.bytes + m.write.bytes) as f64 / outcome.sim_time_ns.max(1) as f64 * 1e3,
        completion_ns: outcome.sim_time_ns,
        write_mean_us: m.write.latency_us.mean,
        write_p99_us: m.write.latency_us.p99,
        member_write_amplification: member_write_sectors as f64 * 4096.0
            / m.write.bytes.max(1) as f64,
        stripes_converted,
    })
}

/// Every engine's replay of every trace, by (trace, engine).
type Runs = BTreeMap<(&'static str, Engine), TraceRun>;

fn replay_all(share: f64, blocks: u32, seed: u64) -> Result<Runs, String> {
    // Every engine replays the same requests, over half of what the smallest volume
    // (ScalaAFA's, whose transient areas are not user space) holds.
    let capacity_bytes = volume(Engine::Scalaafa, blocks, seed)?
        .device()
        .info()
        .capacity_sectors
        * 4096;
    let volume_bytes = capacity_bytes / 2 / (1 << 20) * (1 << 20);
    let mut work = Vec::new();
    for name in synth::profile_names() {
        let records = trace(name, share, volume_bytes, seed)?;
        for engine in Engine::REPLAYED {
            work.push((name, engine, records.clone()));
        }
    }
    // The replays are independent: they run on every core, and are reported in order.
    let results = map_in_parallel(&work, |(_, engine, records)| {
        replay(*engine, records, blocks, seed)
    });
    let mut runs = Runs::new();
    for ((name, engine, records), run) in work.iter().zip(results) {
        let run = run.map_err(|e| format!("{name} on {}: {e}", engine.name()))?;
        println!(
            "{name:<8} {:<18} {:>7} requests {:>7.0} MB/s in {:>6.3} s, writes mean {:>7.0} µs \
             p99 {:>7.0} µs, members write {:>5.1}× the user bytes, {} stripes converted",
            engine.name(),
            records.len(),
            run.mb_s,
            run.completion_ns as f64 / 1e9,
            run.write_mean_us,
            run.write_p99_us,
            run.member_write_amplification,
            run.stripes_converted,
        );
        runs.insert((*name, *engine), run);
    }
    Ok(runs)
}

/// Of mdraid, `two` and `scala`, the engine with the highest `score` on `name`.
fn best(
    runs: &Runs,
    name: &str,
    [two, scala]: [Engine; 2],
    score: impl Fn(&TraceRun) -> f64,
) -> Engine {
    [Engine::Mdraid, two, scala]
        .into_iter()
        .max_by(|a, b| score(&runs[&(name, *a)]).total_cmp(&score(&runs[&(name, *b)])))
        .expect("three engines")
}

/// The paper's orderings for one pair of two-phase and ScalaAFA variants (writing sub-chunk
/// pieces the same way) against mdraid, as counts over the six traces (the claims want all
/// six), into `context` under labels ending in `suffix`.
fn orderings(
    runs: &Runs,
    [two, scala]: [Engine; 2],
    suffix: &str,
    context: &mut BTreeMap<String, f64>,
) {
    let names = synth::profile_names();
    let run = |name: &str, engine: Engine| runs[&(name, engine)];
    let count = |f: &dyn Fn(&str) -> bool| names.iter().filter(|n| f(n)).count() as f64;
    let mut put = |label: &str, value: f64| context.insert(format!("{label}{suffix}"), value);
    put(
        "traces_scalaafa_over_two-phase",
        count(&|n| run(n, scala).mb_s > run(n, two).mb_s),
    );
    put(
        "traces_scalaafa_fastest",
        count(&|n| best(runs, n, [two, scala], |r| r.mb_s) == scala),
    );
    put(
        "traces_scalaafa_lowest_mean_latency",
        count(&|n| best(runs, n, [two, scala], |r| -r.write_mean_us) == scala),
    );
    put(
        "traces_scalaafa_lowest_p99",
        count(&|n| best(runs, n, [two, scala], |r| -r.write_p99_us) == scala),
    );
    let slowest_trace = |engine: Engine| {
        names
            .iter()
            .min_by(|a, b| run(a, engine).mb_s.total_cmp(&run(b, engine).mb_s))
            .copied()
    };
    put(
        "engines_slowest_on_webmail",
        [Engine::Mdraid, two, scala]
            .into_iter()
            .filter(|&e| slowest_trace(e) == Some("webmail"))
            .count() as f64,
    );
    let fastest_trace = names
        .iter()
        .max_by(|a, b| run(a, scala).mb_s.total_cmp(&run(b, scala).mb_s))
        .copied();
    put(
        "scalaafa_fastest_on_dap",
        f64::from(u8::from(fastest_trace == Some("DAP"))),
    );
}

fn scalaafa_fig12(quick: bool, seed: u64) -> Result<Reproduction, String> {
    let blocks = blocks_for(quick);
    let share = QUICK_SHARE * blocks as f64 / blocks_for(true) as f64;
    let runs = replay_all(share, blocks, seed)?;
    let names = synth::profile_names();
    let run = |name: &str, engine: Engine| runs[&(name, engine)];
    let mean =
        |f: &dyn Fn(&str) -> f64| names.iter().map(|n| f(n)).sum::<f64>() / names.len() as f64;
    let mut measured = BTreeMap::new();
    let mut context = BTreeMap::new();
    for &name in &names {
        let (s, t) = (run(name, Engine::Scalaafa), run(name, Engine::TwoPhase));
        measured.insert(name.to_string(), s.mb_s / t.mb_s);
        measured.insert(
            format!("{name}_mean_latency_fraction"),
            s.write_mean_us / t.write_mean_us,
        );
        measured.insert(
            format!("{name}_p99_reduction"),
            1.0 - s.write_p99_us / t.write_p99_us,
        );
        for engine in Engine::REPLAYED {
            let r = run(name, engine);
            context.insert(format!("{name}_{}_mb_s", engine.name()), r.mb_s);
            context.insert(
                format!("{name}_{}_member_write_amplification", engine.name()),
                r.member_write_amplification,
            );
        }
    }
    measured.insert(
        "two-phase/mdraid_mean".into(),
        mean(&|n| run(n, Engine::TwoPhase).mb_s / run(n, Engine::Mdraid).mb_s),
    );
    measured.insert(
        "completion_fraction_mean".into(),
        mean(&|n| {
            run(n, Engine::Scalaafa).completion_ns as f64
                / run(n, Engine::TwoPhase).completion_ns as f64
        }),
    );
    measured.insert(
        "DAP_scalaafa_gb_s".into(),
        run("DAP", Engine::Scalaafa).mb_s / 1e3,
    );
    // A two-phase engine's write latency reduction against mdraid's, averaged over traces.
    let reduction = |two: Engine, stat: fn(&TraceRun) -> f64| {
        1.0 - mean(&|n| stat(&run(n, two)) / stat(&run(n, Engine::Mdraid)))
    };
    let mean_us: fn(&TraceRun) -> f64 = |r| r.write_mean_us;
    let p99_us: fn(&TraceRun) -> f64 = |r| r.write_p99_us;
    measured.insert(
        "two-phase_mean_latency_reduction".into(),
        reduction(Engine::TwoPhase, mean_us),
    );
    measured.insert(
        "two-phase_p99_reduction".into(),
        reduction(Engine::TwoPhase, p99_us),
    );
    orderings(
        &runs,
        [Engine::TwoPhase, Engine::Scalaafa],
        "",
        &mut context,
    );
    // The same with both two-phase engines writing sub-chunk pieces in place (scalaafa as
    // its public prototype does, two-phase as FusionRAID's replicated writes do), and
    // their throughput ratios per trace and against mdraid.
    let in_place = [Engine::TwoPhaseInPlace, Engine::ScalaafaInPlace];
    orderings(&runs, in_place, "_in_place", &mut context);
    for &name in &names {
        context.insert(
            format!("{name}_in_place"),
            run(name, Engine::ScalaafaInPlace).mb_s / run(name, Engine::TwoPhaseInPlace).mb_s,
        );
    }
    context.insert(
        "two-phase/mdraid_mean_in_place".into(),
        mean(&|n| run(n, Engine::TwoPhaseInPlace).mb_s / run(n, Engine::Mdraid).mb_s),
    );
    context.insert(
        "two-phase_mean_latency_reduction_in_place".into(),
        reduction(Engine::TwoPhaseInPlace, mean_us),
    );
    context.insert(
        "two-phase_p99_reduction_in_place".into(),
        reduction(Engine::TwoPhaseInPlace, p99_us),
    );
    context.insert("share_of_each_trace".into(), share);
    let paper = BTreeMap::from(
        [
            ("prn", 2.9),
            ("src2", 2.2),
            ("DAP", 1.2),
            ("webmail", 2.8),
            ("two-phase/mdraid_mean", 1.341),
            ("completion_fraction_mean", 0.300),
            ("DAP_scalaafa_gb_s", 4.8),
            ("proxy0_mean_latency_fraction", 0.242),
            ("prn_mean_latency_fraction", 0.269),
            ("src2_p99_reduction", 0.591),
            ("CFS_p99_reduction", 0.651),
            ("webmail_p99_reduction", 0.725),
            ("two-phase_mean_latency_reduction", 0.138),
            ("two-phase_p99_reduction", 0.597),
        ]
        .map(|(label, value)| (label.to_string(), value)),
    );
    Ok(Reproduction {
        id: "scalaafa-fig12".into(),
        unit: "throughput and latency ratios; reductions as fractions; GB/s".into(),
        paper,
        measured,
        context,
    }
    .pair_labels())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both two-phase engines, as they run by default, replicate whole chunks and merge a
    /// write smaller than a chunk into its chunk, so webmail's 4 KiB writes cost them a chunk
    /// per copy, where mdraid, and scalaafa with the prototype's in-place updates, write
    /// only the sectors (and their parity, or their backup); DAP's large writes leave
    /// nothing to merge, and there scalaafa is ahead of two-phase.
    #[test]
    fn sub_chunk_writes_cost_the_two_phase_engines_whole_chunks() {
        let runs = replay_all(0.001, 48, 1).unwrap();
        assert_eq!(runs.len(), 30, "six traces on five engines");
        let amplification = |name, engine| runs[&(name, engine)].member_write_amplification;
        for engine in [Engine::Scalaafa, Engine::TwoPhase] {
            let a = amplification("webmail", engine);
            assert!(
                a > 16.0,
                "{}: members wrote {a} × webmail's bytes",
                engine.name()
            );
        }
        // mdraid writes the sectors and their parity; in-place updates write the sectors on
        // each of the two copies.
        for engine in [
            Engine::Mdraid,
            Engine::TwoPhaseInPlace,
            Engine::ScalaafaInPlace,
        ] {
            let a = amplification("webmail", engine);
            assert!(
                a < 4.0,
                "{}: members wrote {a} × webmail's bytes",
                engine.name()
            );
        }
        let (s, t) = (
            runs[&("DAP", Engine::Scalaafa)].mb_s,
            runs[&("DAP", Engine::TwoPhase)].mb_s,
        );
        assert!(s > t, "DAP: scalaafa {s} MB/s, two-phase {t} MB/s");
    }
}
