//! `afa reproduce … --seeds N`: every experiment under N seeds, with each label's mean and
//! range over them and, for each claim, on how many seeds it holds.
//!
//! One seed reproduces one run bit for bit, so a single run cannot tell a conclusion that
//! holds from one that a lucky seed carried over its threshold. Running the same experiment
//! under consecutive seeds shows how far each figure moves with the random choices alone,
//! and a claim that holds on some seeds and misses on others is reported as such.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::seeds_baseline;
use super::workers::{self, Unit};
use super::{
    claims, print_claims, print_reproduction, Entry, Outcome, ReproduceArgs, Reproduction,
};

/// The seeds a `--seeds` run uses: `--seed` and the `--seeds − 1` after it.
pub(super) fn seed_list(first: u64, count: u64) -> Result<Vec<u64>, String> {
    if count == 0 {
        return Err("--seeds must be at least 1".to_string());
    }
    let last = first.checked_add(count - 1).ok_or_else(|| {
        format!(
            "--seed {first} with --seeds {count} runs past the largest seed, {}",
            u64::MAX
        )
    })?;
    Ok((first..=last).collect())
}

/// Where swan-fig6 writes the run report of one seed: `NAME.seedS.REST` for `NAME.REST`, so
/// that the seeds do not overwrite each other's reports.
fn seed_path(path: &Path, seed: u64) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let seeded = match name.split_once('.') {
        Some((stem, rest)) => format!("{stem}.seed{seed}.{rest}"),
        None => format!("{name}.seed{seed}"),
    };
    path.with_file_name(seeded)
}

/// How far one label moved over the seeds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Spread {
    pub min: f64,
    pub max: f64,
    /// The sample standard deviation (n − 1); 0 with one seed.
    pub stdev: f64,
    /// Seeds whose run measured the label with a number (JSON's null, NaN, is left out).
    pub seeds: usize,
}

/// One claim judged on every seed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeededClaim {
    pub claim: String,
    /// Seeds on which it holds, misses, and was not measured.
    pub holds_on: usize,
    pub misses_on: usize,
    pub not_measured_on: usize,
    /// The values each seed's verdict came from, in seed order.
    pub values: Vec<String>,
}

impl SeededClaim {
    /// `holds` on every measured seed, `MISS` on every one, `mixed` when the seeds disagree,
    /// `n/a` when no seed measured it.
    pub fn verdict(&self) -> &'static str {
        match (self.holds_on, self.misses_on) {
            (0, 0) => "n/a",
            (_, 0) => "holds",
            (0, _) => "MISS",
            _ => "mixed",
        }
    }
}

/// One experiment over several seeds: the paper's figures, the mean of each measured label,
/// its spread, every seed's own values, and the claims counted over the seeds.
#[derive(Debug, Clone, Serialize)]
pub struct OverSeeds {
    pub id: String,
    pub unit: String,
    pub seeds: Vec<u64>,
    pub paper: BTreeMap<String, f64>,
    /// The mean over the seeds, under the paper's labels.
    pub measured: BTreeMap<String, f64>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub context: BTreeMap<String, f64>,
    pub spread: BTreeMap<String, Spread>,
    pub claims: Vec<SeededClaim>,
    pub runs: Vec<SeedRun>,
}

/// What one seed measured.
#[derive(Debug, Clone, Serialize)]
pub struct SeedRun {
    pub seed: u64,
    pub measured: BTreeMap<String, f64>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub context: BTreeMap<String, f64>,
}

impl OverSeeds {
    /// Folds the runs of one experiment, one per seed, in seed order.
    pub fn new(runs: &[(u64, Reproduction)]) -> Option<Self> {
        let (_, first) = runs.first()?;
        // Paired and context labels are disjoint (`Reproduction::pair_labels`), so one map
        // holds the spread of both.
        let mut spread = BTreeMap::new();
        let mut mean_of = |labels: fn(&Reproduction) -> &BTreeMap<String, f64>| {
            let mut values: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
            for (_, r) in runs {
                for (label, &v) in labels(r) {
                    values.entry(label.as_str()).or_default().push(v);
                }
            }
            let mut means = BTreeMap::new();
            for (label, vs) in values {
                means.insert(label.to_owned(), mean(&vs));
                spread.insert(label.to_owned(), spread_of(&vs));
            }
            means
        };
        let measured = mean_of(|r| &r.measured);
        let context = mean_of(|r| &r.context);
        Some(Self {
            id: first.id.clone(),
            unit: first.unit.clone(),
            seeds: runs.iter().map(|(s, _)| *s).collect(),
            paper: first.paper.clone(),
            measured,
            context,
            spread,
            claims: count_claims(runs.iter().map(|(_, r)| claims::evaluate(r))),
            runs: runs
                .iter()
                .map(|(seed, r)| SeedRun {
                    seed: *seed,
                    measured: r.measured.clone(),
                    context: r.context.clone(),
                })
                .collect(),
        })
    }

    /// Writes `ID.svg` and `ID.png` into `dir`: the paper's figures next to the means, with
    /// each label's range over the seeds as a whisker.
    fn write_chart(&self, dir: &Path) -> Result<Vec<PathBuf>, String> {
        let means = Reproduction {
            id: self.id.clone(),
            unit: self.unit.clone(),
            paper: self.paper.clone(),
            measured: self.measured.clone(),
            context: self.context.clone(),
        };
        crate::plot::write_reproduction_chart_with_ranges(dir, &means, |label| {
            self.spread.get(label).map(|s| (s.min, s.max))
        })
    }
}

/// Writes `dir/README.md`, the gallery index of a run over several seeds: per experiment
/// its description and chart, each label's paper figure, mean, range, standard deviation and
/// the mean's ratio to the paper, and each claim with the seeds it holds on. Returns the
/// index's path.
fn write_gallery_index(
    dir: &Path,
    summaries: &[(&str, &OverSeeds)],
    quick: bool,
    seeds: &[u64],
) -> Result<PathBuf, String> {
    let (first, n) = (seeds[0], seeds.len());
    let mut text = String::from("# Reproduction gallery over seeds\n\n");
    text.push_str(&format!(
        "Generated by `afa reproduce --all{} --seed {first} --seeds {n} --plots DIR`; do not \
         edit by hand. Each chart puts the paper's figures (grey) next to the mean over seeds \
         {first}–{} (blue), with a whisker from the lowest to the highest seed's value.\n",
        if quick { " --quick" } else { "" },
        seeds[n - 1]
    ));
    text.push_str(&format!(
        "\nBelow each chart, the claims the experiment is judged by, each counted over the \
         seeds: {}.\n",
        verdict_tally(summaries.iter().flat_map(|(_, s)| &s.claims))
    ));
    for (what, s) in summaries {
        let id = &s.id;
        text.push_str(&format!("\n## `{id}`\n\n{what}\n\n![{id}]({id}.svg)\n\n"));
        let unit = crate::plot::markdown_unit(&s.unit);
        text.push_str(&format!(
            "| Label | Paper ({unit}) | Mean | Min–max | Stdev | Ratio of the mean |\n\
             |---|---|---|---|---|---|\n"
        ));
        for (label, paper) in &s.paper {
            let row = match (s.measured.get(label), s.spread.get(label)) {
                (Some(m), Some(sp)) if m.is_finite() => {
                    let ratio = if *paper == 0.0 {
                        "-".to_owned()
                    } else {
                        format!("{:.2}", m / paper)
                    };
                    format!(
                        "{m:.3} | {:.3}–{:.3} | {:.3} | {ratio}",
                        sp.min, sp.max, sp.stdev
                    )
                }
                _ => "not measured | - | - | -".to_owned(),
            };
            text.push_str(&format!("| `{label}` | {paper:.3} | {row} |\n"));
        }
        if !s.claims.is_empty() {
            text.push_str(
                "\n| Claim | Verdict | Holds on | Values, seed by seed |\n|---|---|---|---|\n",
            );
            for c in &s.claims {
                text.push_str(&format!(
                    "| {} | {} | {}/{} | {} |\n",
                    c.claim.replace('|', "\\|"),
                    c.verdict(),
                    c.holds_on,
                    c.holds_on + c.misses_on,
                    s.seeds
                        .iter()
                        .zip(&c.values)
                        .map(|(seed, v)| format!("{seed}: {v}"))
                        .collect::<Vec<_>>()
                        .join("; ")
                        .replace('|', "\\|")
                ));
            }
        }
    }
    crate::plot::write_index(dir, &text)
}

/// The mean of the values that are numbers; NaN when none is.
fn mean(values: &[f64]) -> f64 {
    let numbers: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
    if numbers.is_empty() {
        return f64::NAN;
    }
    numbers.iter().sum::<f64>() / numbers.len() as f64
}

fn spread_of(values: &[f64]) -> Spread {
    let numbers: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
    let m = mean(&numbers);
    let n = numbers.len();
    let stdev = if n > 1 {
        (numbers.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / (n - 1) as f64).sqrt()
    } else {
        0.0
    };
    Spread {
        min: numbers.iter().copied().fold(f64::NAN, f64::min),
        max: numbers.iter().copied().fold(f64::NAN, f64::max),
        stdev,
        seeds: n,
    }
}

/// Counts each claim's verdicts over the seeds, in the order the first seed judged them.
/// Claims are matched by their text, which carries their threshold.
fn count_claims(per_seed: impl IntoIterator<Item = Vec<claims::Claim>>) -> Vec<SeededClaim> {
    let mut counted: Vec<SeededClaim> = Vec::new();
    for judged in per_seed {
        for c in judged {
            let at = match counted.iter().position(|s| s.claim == c.claim) {
                Some(at) => at,
                None => {
                    counted.push(SeededClaim {
                        claim: c.claim.clone(),
                        holds_on: 0,
                        misses_on: 0,
                        not_measured_on: 0,
                        values: Vec::new(),
                    });
                    counted.len() - 1
                }
            };
            let s = &mut counted[at];
            match c.holds {
                Some(true) => s.holds_on += 1,
                Some(false) => s.misses_on += 1,
                None => s.not_measured_on += 1,
            }
            s.values.push(c.values);
        }
    }
    counted
}

/// Runs `selected` under every seed of `args` and prints, after each experiment's runs, the
/// mean and range of its labels and its claims counted over the seeds.
pub(super) fn run(
    selected: &[Entry],
    args: &ReproduceArgs,
    fig6_report: Option<&Path>,
) -> Result<(), String> {
    let seeds = seed_list(args.seed, args.seeds)?;
    let baseline = args
        .baseline
        .as_deref()
        .map(seeds_baseline::load)
        .transpose()?;
    println!(
        "seeds: {} ({} to {})",
        seeds.len(),
        seeds[0],
        seeds[seeds.len() - 1]
    );
    // swan-fig6 writes a run report per seed, beside --json or --plots as a one-seed run
    // does, else into the working directory, each under its seed's name.
    let fig6_report = fig6_report.unwrap_or(Path::new("swan-fig6.report.json"));
    let units: Vec<Unit> = selected
        .iter()
        .flat_map(|&entry| {
            seeds.iter().map(move |&seed| Unit {
                entry,
                seed,
                fig6_report: Some(seed_path(fig6_report, seed)),
            })
        })
        .collect();
    let last_seed = seeds[seeds.len() - 1];
    let mut collected: Vec<(u64, Reproduction)> = Vec::new();
    let mut summaries: Vec<OverSeeds> = Vec::new();
    let mut failures: Vec<String> = Vec::new();
    let mut changes = Vec::new();
    let mut handle = |unit: &Unit, outcome: Outcome| -> Result<(), String> {
        let id = unit.entry.0;
        match outcome {
            Outcome::Here(Ok(r)) => {
                let r = r.pair_labels();
                print_reproduction(&r);
                print_claims(&claims::evaluate(&r));
                collected.push((unit.seed, r));
            }
            Outcome::Worker(Ok((printed, r))) => {
                println!("{id} with seed {}", unit.seed);
                print!("{printed}");
                collected.push((unit.seed, r));
            }
            Outcome::Here(Err(e)) | Outcome::Worker(Err(e)) => {
                eprintln!("{id} with seed {}: {e}", unit.seed);
                failures.push(format!("{id} with seed {}: {e}", unit.seed));
            }
        }
        if unit.seed == last_seed {
            if let Some(summary) = OverSeeds::new(&collected) {
                print_over_seeds(&summary);
                if let Some(before) = &baseline {
                    match before.get(id) {
                        Some(old) => {
                            let change = seeds_baseline::compare(old, &summary);
                            seeds_baseline::print(&change);
                            changes.push(change);
                        }
                        None => println!("against the baseline: it holds no run of {id}"),
                    }
                }
                if let Some(dir) = &args.plots {
                    for path in summary.write_chart(dir)? {
                        println!("{}", path.display());
                    }
                }
                summaries.push(summary);
            }
            collected.clear();
        }
        Ok(())
    };
    if args.jobs > 1 && units.len() > 1 {
        workers::run_in_order(&units, args, &mut handle)?;
    } else {
        for unit in &units {
            println!("{} with seed {}", unit.entry.0, unit.seed);
            if let (Some(report), Ok(mut path)) = (
                unit.fig6_report.clone(),
                super::swan::FIG6_REPORT_PATH.lock(),
            ) {
                *path = Some(report);
            }
            handle(unit, Outcome::Here(unit.entry.2(args.quick, unit.seed)))?;
        }
    }
    if selected.len() > 1 {
        print_tally(&summaries, seeds.len());
        if baseline.is_some() {
            seeds_baseline::print_tally(&changes);
        }
    }
    if let (Some(dir), true) = (&args.plots, args.all) {
        let described: Vec<(&str, &OverSeeds)> = summaries
            .iter()
            .map(|s| {
                let what = selected.iter().find(|e| e.0 == s.id).map_or("", |e| e.1);
                (what, s)
            })
            .collect();
        let index = write_gallery_index(dir, &described, args.quick, &seeds)?;
        println!("{}", index.display());
    }
    if let Some(path) = &args.json {
        let text = if selected.len() > 1 {
            serde_json::to_string_pretty(&summaries)
        } else {
            summaries
                .first()
                .map_or(Ok(String::new()), serde_json::to_string_pretty)
        }
        .map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n")
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!("runs failed: {}", failures.join("; ")))
    }
}

fn print_over_seeds(s: &OverSeeds) {
    let n = s.seeds.len();
    println!("{} over {n} seeds ({})", s.id, s.unit);
    println!(
        "{:<28} {:>10} {:>10} {:>10} {:>10} {:>10} {:>7}",
        "label", "paper", "mean", "min", "max", "stdev", "ratio"
    );
    for (label, paper) in &s.paper {
        let m = s.measured.get(label).copied().unwrap_or(f64::NAN);
        let spread = s.spread.get(label);
        let (lo, hi, sd) = spread.map_or((f64::NAN, f64::NAN, f64::NAN), |sp| {
            (sp.min, sp.max, sp.stdev)
        });
        println!(
            "{label:<28} {paper:>10.3} {m:>10.3} {lo:>10.3} {hi:>10.3} {sd:>10.3} {:>7.2}",
            m / paper
        );
    }
    if s.claims.is_empty() {
        return;
    }
    println!("claims over {n} seeds (seeds on which each holds)");
    for c in &s.claims {
        println!(
            "  {:<6} {}/{} {}",
            c.verdict(),
            c.holds_on,
            c.holds_on + c.misses_on,
            c.claim
        );
    }
}

/// How many of `claims` hold on every seed, on some, on none, and on no seed that measured
/// them, in words.
fn verdict_tally<'a>(claims: impl IntoIterator<Item = &'a SeededClaim>) -> String {
    let mut counts = BTreeMap::new();
    for c in claims {
        *counts.entry(c.verdict()).or_insert(0usize) += 1;
    }
    let count = |verdict: &str| counts.get(verdict).copied().unwrap_or(0);
    format!(
        "{} hold on every seed, {} on some (mixed), {} on none, {} not measured",
        count("holds"),
        count("mixed"),
        count("MISS"),
        count("n/a")
    )
}

/// After several experiments: how many claims hold on every seed, on some, on none.
fn print_tally(summaries: &[OverSeeds], seeds: usize) {
    let claims: Vec<(&str, &SeededClaim)> = summaries
        .iter()
        .flat_map(|s| s.claims.iter().map(move |c| (s.id.as_str(), c)))
        .collect();
    let n = summaries.len();
    let experiments = if n == 1 { "experiment" } else { "experiments" };
    println!(
        "claims over {n} {experiments} × {seeds} seeds: {}",
        verdict_tally(claims.iter().map(|(_, c)| *c))
    );
    for (id, c) in claims
        .iter()
        .filter(|(_, c)| matches!(c.verdict(), "mixed" | "MISS"))
    {
        println!(
            "  {:<6} {}/{} {id}: {}",
            c.verdict(),
            c.holds_on,
            c.holds_on + c.misses_on,
            c.claim
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fig4b(seed: u64, log: [f64; 3]) -> (u64, Reproduction) {
        let mut r = crate::reproduce::baseline::tests::fig4b(log);
        r.context.insert("detail".to_string(), seed as f64);
        (seed, r)
    }

    #[test]
    fn labels_are_averaged_with_their_range_and_claims_counted_per_seed() {
        let runs = [
            fig4b(1, [600.0, 550.0, 500.0]),
            fig4b(2, [500.0, 550.0, 600.0]),
            fig4b(3, [700.0, 550.0, 0.0]),
        ];
        let mut runs = runs.to_vec();
        // The third seed did not measure the last width.
        runs[2].1.measured.remove("log-raid0_9");
        let s = OverSeeds::new(&runs).unwrap();
        assert_eq!(s.seeds, [1, 2, 3]);
        assert_eq!(s.measured["log-raid0_3"], 600.0);
        let sp = &s.spread["log-raid0_3"];
        assert_eq!((sp.min, sp.max, sp.seeds), (500.0, 700.0, 3));
        assert!((sp.stdev - 100.0).abs() < 1e-9, "{sp:?}");
        assert_eq!(s.spread["log-raid0_6"].stdev, 0.0);
        // A seed that did not measure a label is left out of its mean and range.
        assert_eq!(s.measured["log-raid0_9"], 550.0);
        assert_eq!(s.spread["log-raid0_9"].seeds, 2);
        assert_eq!(s.context["detail"], 2.0);
        assert_eq!(s.runs.len(), 3);
        // "Log-RAID0 falls as SSDs are added" holds on the first seed only; the third seed
        // cannot judge it.
        let falls = s
            .claims
            .iter()
            .find(|c| c.claim.contains("Log-RAID0 falls"))
            .expect("the fig4b claim");
        assert_eq!(
            (falls.holds_on, falls.misses_on, falls.not_measured_on),
            (1, 1, 1),
            "{falls:?}"
        );
        assert_eq!(falls.verdict(), "mixed");
        assert_eq!(falls.values.len(), 3);
    }

    #[test]
    fn the_gallery_index_over_seeds_has_means_ranges_and_claims_counted() {
        let runs = [
            fig4b(3, [600.0, 550.0, 500.0]),
            fig4b(4, [500.0, 550.0, f64::NAN]),
        ];
        let s = OverSeeds::new(&runs).unwrap();
        let dir = std::env::temp_dir().join(format!("afa-seeds-index-{}", std::process::id()));
        let path = write_gallery_index(&dir, &[("Fig. 4b of SWAN", &s)], true, &[3, 4]).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        for wanted in [
            "`afa reproduce --all --quick --seed 3 --seeds 2 --plots DIR`",
            "mean over seeds 3–4",
            "## `swan-fig4b`\n\nFig. 4b of SWAN\n\n![swan-fig4b](swan-fig4b.svg)",
            "| Label | Paper (MB/s) | Mean | Min–max | Stdev | Ratio of the mean |",
            // Mean 550 of 600 and 500, sample standard deviation 70.7, 1.10 of the paper.
            "| `log-raid0_3` | 500.000 | 550.000 | 500.000–600.000 | 70.711 | 1.10 |",
            "| `log-raid0_6` | 500.000 | 550.000 | 550.000–550.000 | 0.000 | 1.10 |",
            // The second seed's value was JSON's null: the first seed's alone.
            "| `log-raid0_9` | 500.000 | 500.000 | 500.000–500.000 | 0.000 | 1.00 |",
            "| Claim | Verdict | Holds on | Values, seed by seed |",
            // Log-RAID0 falls on seed 3, not on seed 4; SWAN0 is not measured.
            "0 hold on every seed, 1 on some (mixed), 0 on none, 1 not measured",
        ] {
            assert!(text.contains(wanted), "{wanted:?} in {text}");
        }
        let falls = s
            .claims
            .iter()
            .find(|c| c.claim.contains("Log-RAID0 falls"))
            .unwrap();
        assert!(
            text.contains(&format!(
                "| {} | mixed | 1/2 | 3: 600 > 550 > 500; 4: 500 > 550 > NaN |",
                falls.claim
            )),
            "{text}"
        );
    }

    #[test]
    fn a_value_json_could_not_hold_is_left_out_of_the_mean_and_the_range() {
        let s = spread_of(&[1.0, f64::NAN, 3.0]);
        assert_eq!((s.min, s.max, s.seeds), (1.0, 3.0, 2));
        assert_eq!(mean(&[1.0, f64::NAN, 3.0]), 2.0);
        assert!(mean(&[f64::NAN]).is_nan());
    }

    #[test]
    fn a_verdict_names_agreement_and_disagreement_between_seeds() {
        let claim = |holds_on, misses_on| SeededClaim {
            claim: String::new(),
            holds_on,
            misses_on,
            not_measured_on: 0,
            values: Vec::new(),
        };
        assert_eq!(claim(3, 0).verdict(), "holds");
        assert_eq!(claim(0, 3).verdict(), "MISS");
        assert_eq!(claim(2, 1).verdict(), "mixed");
        assert_eq!(claim(0, 0).verdict(), "n/a");
    }

    #[test]
    fn seeds_follow_the_first_and_are_refused_past_the_last_or_when_none() {
        assert_eq!(seed_list(7, 3).unwrap(), [7, 8, 9]);
        assert_eq!(seed_list(u64::MAX, 1).unwrap(), [u64::MAX]);
        assert!(seed_list(u64::MAX, 2)
            .unwrap_err()
            .contains("past the largest seed"));
        assert!(seed_list(1, 0)
            .unwrap_err()
            .contains("--seeds must be at least 1"));
    }

    #[test]
    fn each_seed_gets_its_own_report_path() {
        let p = Path::new("/tmp/x/swan-fig6.report.json");
        assert_eq!(
            seed_path(p, 4),
            Path::new("/tmp/x/swan-fig6.seed4.report.json")
        );
        assert_eq!(seed_path(Path::new("report"), 2), Path::new("report.seed2"));
    }
}
