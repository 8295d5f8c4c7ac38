//! `afa reproduce ID`: rerun one of the papers' experiments and print the paper's figures
//! next to the measured ones, under the same labels, so anyone can compute the ratio.
//! Each paper has its own module with its experiments and SSD presets.

mod baseline;
pub mod claims;
mod ox;
pub mod scalaafa;
mod scalaafa_rocksdb;
mod scalaafa_traces;
mod seeds;
mod seeds_baseline;
pub mod swan;
mod swan_ycsb;
pub mod waflash;
mod workers;

use std::collections::BTreeMap;
use std::path::PathBuf;

use afa_host::{CpuConfig, RunOptions, Workload};
use afa_workload::fio::parse_job_file;
use serde::{Deserialize, Serialize};

#[derive(Debug, clap::Args)]
pub struct ReproduceArgs {
    /// The experiments (see --list): one, or several run one after the other.
    pub ids: Vec<String>,
    /// A scaled-down run that finishes in about a minute.
    #[arg(long)]
    pub quick: bool,
    /// Writes the result as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Runs every experiment under this many seeds (--seed and the ones after it) and
    /// reports each label's mean, range and standard deviation over them, and on how many
    /// seeds each claim holds.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub seeds: u64,
    /// Lists the experiments.
    #[arg(long)]
    pub list: bool,
    /// Runs every experiment; with --plots it also writes the gallery index DIR/README.md.
    #[arg(long, conflicts_with = "ids")]
    pub all: bool,
    /// Runs this many experiments at once, each in a worker process of its own; every
    /// experiment's output is still printed whole and in order, and its figures are the
    /// same as when it runs alone (each depends on its seed only).
    #[arg(long, default_value_t = 1)]
    pub jobs: usize,
    /// Where swan-fig6 writes its run report: how a `--jobs` run tells its workers the
    /// path it would have used itself.
    #[arg(long, hide = true, value_name = "PATH")]
    pub swan_fig6_report: Option<PathBuf>,
    /// Writes a paper-vs-measured chart per experiment into DIR as ID.svg and ID.png.
    #[arg(long, value_name = "DIR")]
    pub plots: Option<PathBuf>,
    /// Lists every label and claim that moved since an earlier run's --json file.
    #[arg(long, value_name = "OLD.json")]
    pub baseline: Option<PathBuf>,
}

/// The paper's figures and the measured ones, under the same labels.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Reproduction {
    pub id: String,
    pub unit: String,
    #[serde(deserialize_with = "labels_read_back")]
    pub paper: BTreeMap<String, f64>,
    #[serde(deserialize_with = "labels_read_back")]
    pub measured: BTreeMap<String, f64>,
    /// Measurements the paper gives no figure for (the detail behind a ranking, a load
    /// level the paper did not print), kept apart so that `paper` and `measured` hold the
    /// same labels.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "labels_read_back"
    )]
    pub context: BTreeMap<String, f64>,
}

/// Reads labels back from a JSON file an earlier run wrote (a baseline, a worker's result).
/// JSON has no NaN or infinity, so serde_json writes either as null; it reads back as NaN,
/// where refusing the file would lose every other label in it.
fn labels_read_back<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, f64>, D::Error> {
    let labels = BTreeMap::<String, Option<f64>>::deserialize(d)?;
    Ok(labels
        .into_iter()
        .map(|(label, value)| (label, value.unwrap_or(f64::NAN)))
        .collect())
}

impl Reproduction {
    /// Moves every measured label without a paper figure into `context`.
    fn pair_labels(mut self) -> Self {
        let unpaired: Vec<String> = self
            .measured
            .keys()
            .filter(|label| !self.paper.contains_key(*label))
            .cloned()
            .collect();
        for label in unpaired {
            if let Some(value) = self.measured.remove(&label) {
                self.context.insert(label, value);
            }
        }
        self
    }
}

pub type Experiment = fn(quick: bool, seed: u64) -> Result<Reproduction, String>;

/// One experiment: its id, what it reproduces, and the function that runs it.
pub type Entry = (&'static str, &'static str, Experiment);

/// Every experiment, paper by paper. Each paper's module owns its entries.
fn experiments() -> Vec<Entry> {
    [
        scalaafa::EXPERIMENTS,
        scalaafa_traces::EXPERIMENTS,
        scalaafa_rocksdb::EXPERIMENTS,
        swan::EXPERIMENTS,
        ox::EXPERIMENTS,
        waflash::EXPERIMENTS,
    ]
    .concat()
}

/// Figures and tables of the papers that the issues ask for and no experiment reproduces
/// yet: listed so that `--list` shows the whole registry, with what is missing.
const PLANNED: &[(&str, &str)] = &[];

pub fn run(args: ReproduceArgs) -> Result<(), String> {
    if args.list || (args.ids.is_empty() && !args.all) {
        for (id, what, _) in experiments() {
            println!("{id}  [runs]\n    {what}");
        }
        for (id, what) in PLANNED {
            println!("{id}  [planned: not implemented yet]\n    {what}");
        }
        return Ok(());
    }
    if args.jobs == 0 {
        return Err("--jobs must be at least 1".to_string());
    }
    if let Some((id, _)) = PLANNED
        .iter()
        .find(|(id, _)| args.ids.iter().any(|wanted| wanted == id))
    {
        return Err(format!(
            "experiment {id} is planned but not implemented yet"
        ));
    }
    let all = experiments();
    let selected: Vec<Entry> = if args.all {
        all.clone()
    } else {
        let mut selected = Vec::new();
        for id in &args.ids {
            let entry = all.iter().find(|(name, _, _)| name == id).ok_or_else(|| {
                let known: Vec<&str> = all.iter().map(|e| e.0).collect();
                format!("unknown experiment {id:?}; known: {}", known.join(", "))
            })?;
            selected.push(*entry);
        }
        selected
    };
    // Several experiments are reported as --all reports them: one failing does not hide
    // the others, the claims are tallied, and the JSON is a list.
    let many = selected.len() > 1;
    // Read first, so that a wrong path fails before minutes of simulation. With --seeds the
    // baseline is an earlier --seeds run (`seeds_baseline`), read by `seeds::run`.
    let baseline = if args.seeds == 1 {
        args.baseline.as_deref().map(baseline::load).transpose()?
    } else {
        None
    };
    println!("seed: {}", args.seed);
    // swan-fig6's run report goes beside the JSON, else beside the plots, else into the
    // working directory.
    let fig6_report = match (&args.swan_fig6_report, &args.json, &args.plots) {
        (Some(path), _, _) => Some(path.clone()),
        (None, Some(json), _) => Some(json.with_extension("report.json")),
        (None, None, Some(dir)) => {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            Some(dir.join("swan-fig6.report.json"))
        }
        (None, None, None) => None,
    };
    if args.seeds != 1 {
        return seeds::run(&selected, &args, fig6_report.as_deref());
    }
    if let (Some(report), Ok(mut path)) = (fig6_report.clone(), swan::FIG6_REPORT_PATH.lock()) {
        *path = Some(report);
    }
    let mut results = Vec::new();
    let mut failures = Vec::new();
    let mut changes = Vec::new();
    let mut handle = |unit: &workers::Unit, outcome: Outcome| -> Result<(), String> {
        let (id, what, _) = unit.entry;
        let r = match outcome {
            Outcome::Here(Ok(r)) => {
                let r = r.pair_labels();
                print_reproduction(&r);
                print_claims(&claims::evaluate(&r));
                r
            }
            Outcome::Worker(Ok((printed, r))) => {
                // The worker printed the table and the claims, as the run above does.
                print!("{printed}");
                r
            }
            Outcome::Here(Err(e)) | Outcome::Worker(Err(e)) if many => {
                eprintln!("{id}: {e}");
                failures.push(format!("{id}: {e}"));
                return Ok(());
            }
            Outcome::Here(Err(e)) | Outcome::Worker(Err(e)) => return Err(e),
        };
        if let Some(before) = &baseline {
            match before.get(id) {
                Some(old) => {
                    let change = baseline::compare(old, &r);
                    baseline::print(&change);
                    changes.push(change);
                }
                None => println!("against the baseline: it holds no run of {id}"),
            }
        }
        if let Some(dir) = &args.plots {
            for path in crate::plot::write_reproduction_chart(dir, &r)? {
                println!("{}", path.display());
            }
        }
        results.push((id, what, r));
        Ok(())
    };
    let units: Vec<workers::Unit> = selected
        .iter()
        .map(|&entry| workers::Unit {
            entry,
            seed: args.seed,
            fig6_report: fig6_report.clone(),
        })
        .collect();
    if args.jobs > 1 && many {
        workers::run_in_order(&units, &args, &mut handle)?;
    } else {
        for unit in &units {
            handle(unit, Outcome::Here(unit.entry.2(args.quick, unit.seed)))?;
        }
    }
    if many {
        print_claim_tally(&results);
        if baseline.is_some() {
            baseline::print_tally(&changes);
        }
    }
    if let (Some(dir), true) = (&args.plots, args.all) {
        let index = crate::plot::write_gallery_index(dir, &results, args.quick, args.seed)?;
        println!("{}", index.display());
    }
    if let Some(path) = args.json {
        let text = if many {
            let all: Vec<Judged> = results.iter().map(|(_, _, r)| Judged::new(r)).collect();
            serde_json::to_string_pretty(&all)
        } else {
            results.first().map_or(Ok(String::new()), |(_, _, r)| {
                serde_json::to_string_pretty(&Judged::new(r))
            })
        }
        .map_err(|e| e.to_string())?;
        std::fs::write(&path, text + "\n")
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!("experiments failed: {}", failures.join("; ")))
    }
}

/// How one experiment ran: in this process (its output not yet printed), or in a worker
/// process, with what the worker printed.
enum Outcome {
    Here(Result<Reproduction, String>),
    Worker(Result<(String, Reproduction), String>),
}

/// A reproduction as its JSON carries it: the labels, then the claims judged on them.
#[derive(Serialize)]
struct Judged<'a> {
    #[serde(flatten)]
    reproduction: &'a Reproduction,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    claims: Vec<claims::Claim>,
}

impl<'a> Judged<'a> {
    fn new(reproduction: &'a Reproduction) -> Self {
        Self {
            reproduction,
            claims: claims::evaluate(reproduction),
        }
    }
}

fn print_claims(claims: &[claims::Claim]) {
    if claims.is_empty() {
        return;
    }
    println!("claims");
    for c in claims {
        println!("  {:<6} {} [{}]", c.verdict(), c.claim, c.values);
    }
}

/// After `--all`: how many claims hold over every experiment, and which miss.
fn print_claim_tally(results: &[(&str, &str, Reproduction)]) {
    let judged: Vec<(&str, claims::Claim)> = results
        .iter()
        .flat_map(|(id, _, r)| claims::evaluate(r).into_iter().map(move |c| (*id, c)))
        .collect();
    let (holding, missing, unmeasured) = claims::tally(judged.iter().map(|(_, c)| c));
    let n = results.len();
    let experiments = if n == 1 { "experiment" } else { "experiments" };
    println!(
        "claims over {n} {experiments}: {holding} hold, {missing} miss, {unmeasured} not measured"
    );
    for (id, c) in judged.iter().filter(|(_, c)| c.holds == Some(false)) {
        println!("  MISS   {id}: {} [{}]", c.claim, c.values);
    }
}

fn print_reproduction(r: &Reproduction) {
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
}

/// Runs an inline fio job file on `device` through the host CPU model.
pub(crate) fn run_jobs(
    device: &mut dyn afa_ssd::BlockDevice,
    host: &CpuConfig,
    job: &str,
    seed: u64,
    timeline_interval_ns: u64,
) -> Result<(afa_host::RunOutcome, serde_json::Value), String> {
    let (outcome, cpu) = run_job_file(device, Some(host), job, seed, timeline_interval_ns, true)?;
    Ok((outcome, cpu.unwrap_or_default()))
}

/// Runs the fio job file `job` on `device`, through `host`'s CPU model when there is one
/// (whose report comes back beside the outcome), without a progress bar or a request log;
/// `background_work` gives the device the host's idle time. A sector read back wrong fails
/// the experiment.
pub(crate) fn run_job_file(
    device: &mut dyn afa_ssd::BlockDevice,
    host: Option<&CpuConfig>,
    job: &str,
    seed: u64,
    timeline_interval_ns: u64,
    background_work: bool,
) -> Result<(afa_host::RunOutcome, Option<serde_json::Value>), String> {
    let jobs = parse_job_file(job).map_err(|e| format!("experiment job: {e}"))?;
    let options = RunOptions {
        seed,
        timeline_interval_ns,
        preconditioned_sectors: 0,
        background_work,
        show_progress: false,
        record_requests: false,
    };
    let (outcome, cpu) = crate::run_on(
        device,
        host,
        &Workload::Jobs(jobs),
        &options,
        crate::Notes::Keep,
    )?;
    if outcome.mismatches > 0 {
        return Err(format!(
            "{} sectors read back wrong in the experiment",
            outcome.mismatches
        ));
    }
    Ok((outcome, cpu))
}

/// `threads` fio jobs, each writing its own `bytes_per_job` region sequentially in 64 KiB
/// requests at queue depth 32 (fio's default `numjobs` layout, one region per thread).
pub(crate) fn sequential_jobs(threads: u32, bytes_per_job: u64) -> String {
    let mut job = String::from("[global]\nrw=write\nbs=64k\niodepth=32\n");
    for t in 0..threads {
        job.push_str(&format!(
            "[writer{t}]\noffset={}\nsize={bytes_per_job}\n",
            t as u64 * bytes_per_job
        ));
    }
    job
}
