//! `afa reproduce … --seeds N --baseline OLD.json`: what a change moved beyond the seeds'
//! own spread. OLD.json is an earlier `--seeds` run's `--json`. Every label whose mean moved
//! is listed with both means and ranges, and flagged when the two ranges over the seeds do
//! not overlap: a move no seed of either run reaches by chance. Every claim whose count of
//! holding seeds changed is listed too.
//!
//! A single-seed baseline (`baseline.rs`) answers "did anything move at all", exactly; this
//! one answers "did it move further than the seeds move it", which is what a change to a
//! model must show before a figure is said to have improved.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use super::labels_read_back;
use super::seeds::OverSeeds;

/// A number JSON may hold as null (NaN or infinity when written): read back as NaN.
fn number_read_back<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// One label's range as a `--seeds` file holds it.
#[derive(Debug, Clone, Deserialize)]
struct SpreadRead {
    #[serde(deserialize_with = "number_read_back")]
    min: f64,
    #[serde(deserialize_with = "number_read_back")]
    max: f64,
}

/// One claim's counts as a `--seeds` file holds them.
#[derive(Debug, Clone, Deserialize)]
struct ClaimRead {
    claim: String,
    holds_on: usize,
    misses_on: usize,
}

/// One experiment of a `--seeds` file.
#[derive(Debug, Clone, Deserialize)]
pub struct SeedsRun {
    id: String,
    seeds: Vec<u64>,
    #[serde(deserialize_with = "labels_read_back")]
    measured: BTreeMap<String, f64>,
    #[serde(default, deserialize_with = "labels_read_back")]
    context: BTreeMap<String, f64>,
    spread: BTreeMap<String, SpreadRead>,
    #[serde(default)]
    claims: Vec<ClaimRead>,
}

/// Reads a file written by `afa reproduce --seeds N --json`: one experiment, or a list.
pub fn load(path: &Path) -> Result<BTreeMap<String, SeedsRun>, String> {
    let entries = super::baseline::read_entries(path)?
        .ok_or_else(|| format!("the baseline {} is not JSON", path.display()))?;
    if entries.iter().any(|e| e.get("seeds").is_none()) {
        return Err(format!(
            "the baseline {} holds one seed's run; compare with it without --seeds, or give \
             the --json of a run with --seeds",
            path.display()
        ));
    }
    entries
        .into_iter()
        .map(|e| {
            serde_json::from_value::<SeedsRun>(e)
                .map(|r| (r.id.clone(), r))
                .map_err(|e| {
                    format!(
                        "the baseline {} is not the JSON of `afa reproduce --seeds`: {e}",
                        path.display()
                    )
                })
        })
        .collect()
}

/// A label's mean and range over the seeds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Span {
    pub mean: f64,
    pub min: f64,
    pub max: f64,
}

/// One label whose mean moved.
#[derive(Debug, Clone, PartialEq)]
pub struct SpanMoved {
    pub label: String,
    pub before: Option<Span>,
    pub after: Option<Span>,
    /// The two ranges do not overlap: no seed of one run came as far as any of the other.
    pub beyond_spread: bool,
}

/// One claim whose count of holding seeds changed, as `holding/judged`.
#[derive(Debug, Clone, PartialEq)]
pub struct CountTurned {
    pub claim: String,
    pub before: String,
    pub after: String,
}

/// What moved between a `--seeds` baseline and this run, for one experiment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SeedsChange {
    pub moved: Vec<SpanMoved>,
    pub unchanged: usize,
    pub claims: Vec<CountTurned>,
    /// The baseline's seeds when they are not this run's.
    pub other_seeds: Option<Vec<u64>>,
}

impl SeedsChange {
    pub fn beyond_spread(&self) -> usize {
        self.moved.iter().filter(|m| m.beyond_spread).count()
    }
}

fn spans<'a>(
    means: impl Iterator<Item = (&'a String, &'a f64)>,
    range: impl Fn(&str) -> Option<(f64, f64)>,
) -> BTreeMap<&'a str, Span> {
    means
        .map(|(label, &mean)| {
            let (min, max) = range(label).unwrap_or((mean, mean));
            (label.as_str(), Span { mean, min, max })
        })
        .collect()
}

/// Compares the baseline's run of one experiment with this one.
pub fn compare(before: &SeedsRun, after: &OverSeeds) -> SeedsChange {
    let old = spans(before.measured.iter().chain(&before.context), |l| {
        before.spread.get(l).map(|s| (s.min, s.max))
    });
    let new = spans(after.measured.iter().chain(&after.context), |l| {
        after.spread.get(l).map(|s| (s.min, s.max))
    });
    let mut labels: Vec<&str> = old.keys().chain(new.keys()).copied().collect();
    labels.sort_unstable();
    labels.dedup();
    let mut change = SeedsChange {
        other_seeds: (before.seeds != after.seeds).then(|| before.seeds.clone()),
        ..SeedsChange::default()
    };
    for label in labels {
        let (b, a) = (old.get(label).copied(), new.get(label).copied());
        // Bitwise, as in the single-seed comparison: the same seeds give the same means.
        if b.map(|s| s.mean.to_bits()) == a.map(|s| s.mean.to_bits()) {
            change.unchanged += 1;
            continue;
        }
        let beyond_spread = match (b, a) {
            (Some(b), Some(a)) => a.min > b.max || a.max < b.min,
            _ => false,
        };
        change.moved.push(SpanMoved {
            label: label.to_owned(),
            before: b,
            after: a,
            beyond_spread,
        });
    }
    for c in &after.claims {
        let now = format!("{}/{}", c.holds_on, c.holds_on + c.misses_on);
        let then = before
            .claims
            .iter()
            .find(|o| o.claim == c.claim)
            .map_or("-".to_owned(), |o| {
                format!("{}/{}", o.holds_on, o.holds_on + o.misses_on)
            });
        if then != now {
            change.claims.push(CountTurned {
                claim: c.claim.clone(),
                before: then,
                after: now,
            });
        }
    }
    change
}

fn show(span: Option<Span>) -> String {
    span.map_or("-".to_owned(), |s| {
        format!("{:.4} [{:.4}–{:.4}]", s.mean, s.min, s.max)
    })
}

/// Prints the change of one experiment under its summary.
pub fn print(change: &SeedsChange) {
    if let Some(seeds) = &change.other_seeds {
        println!(
            "against the baseline: it ran other seeds ({}), so the means differ by their seeds too",
            seeds
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if change.moved.is_empty() && change.claims.is_empty() {
        println!(
            "against the baseline: all {} label means unchanged",
            change.unchanged
        );
        return;
    }
    println!(
        "against the baseline: {} label means moved ({} beyond the seeds' spread), {} unchanged",
        change.moved.len(),
        change.beyond_spread(),
        change.unchanged
    );
    println!(
        "  {:<40} {:>30} {:>30} {:>7}",
        "label", "baseline mean [range]", "now mean [range]", "ratio"
    );
    for m in &change.moved {
        let ratio = match (m.before, m.after) {
            (Some(b), Some(a)) if b.mean != 0.0 => format!("{:.3}", a.mean / b.mean),
            _ => "-".to_owned(),
        };
        let flag = if m.beyond_spread {
            "  beyond the spread"
        } else {
            ""
        };
        println!(
            "  {:<40} {:>30} {:>30} {ratio:>7}{flag}",
            m.label,
            show(m.before),
            show(m.after)
        );
    }
    for c in &change.claims {
        println!(
            "  claim holds on {} → {} seeds: {}",
            c.before, c.after, c.claim
        );
    }
}

/// After several experiments: how many moved, and how many beyond the seeds' spread.
pub fn print_tally(changes: &[SeedsChange]) {
    let moved = changes.iter().filter(|c| !c.moved.is_empty()).count();
    let beyond = changes.iter().filter(|c| c.beyond_spread() > 0).count();
    let claims: usize = changes.iter().map(|c| c.claims.len()).sum();
    println!(
        "against the baseline: {moved} of {} experiments moved, {beyond} beyond the seeds' \
         spread; {claims} claims hold on another number of seeds",
        changes.len()
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reproduce::baseline::tests::fig4b;

    fn over(runs: &[[f64; 3]]) -> OverSeeds {
        let runs: Vec<(u64, _)> = runs
            .iter()
            .enumerate()
            .map(|(i, &log)| (i as u64 + 1, fig4b(log)))
            .collect();
        OverSeeds::new(&runs).unwrap()
    }

    fn read_back(s: &OverSeeds) -> SeedsRun {
        serde_json::from_str(&serde_json::to_string(s).unwrap()).unwrap()
    }

    #[test]
    fn a_move_inside_the_seeds_spread_is_told_from_one_beyond_it() {
        let before = over(&[[600.0, 500.0, 400.0], [640.0, 520.0, 420.0]]);
        let after = over(&[[610.0, 800.0, 400.0], [650.0, 900.0, 420.0]]);
        let change = compare(&read_back(&before), &after);
        assert_eq!(change.unchanged, 1, "{change:?}");
        let moved: Vec<(&str, bool)> = change
            .moved
            .iter()
            .map(|m| (m.label.as_str(), m.beyond_spread))
            .collect();
        // log-raid0_3's ranges [600, 640] and [610, 650] overlap; log-raid0_6's do not.
        assert_eq!(moved, [("log-raid0_3", false), ("log-raid0_6", true)]);
        assert_eq!(change.beyond_spread(), 1);
        assert_eq!(
            change.moved[1].after,
            Some(Span {
                mean: 850.0,
                min: 800.0,
                max: 900.0
            })
        );
        // "Log-RAID0 falls" held on both seeds and now on none.
        assert_eq!(change.claims.len(), 1, "{change:?}");
        assert_eq!(
            (
                change.claims[0].before.as_str(),
                change.claims[0].after.as_str()
            ),
            ("2/2", "0/2")
        );
        assert_eq!(change.other_seeds, None);
        let same = compare(&read_back(&after), &after);
        assert!(same.moved.is_empty() && same.claims.is_empty());
    }

    #[test]
    fn a_single_seed_file_is_no_seeds_baseline() {
        let dir = std::env::temp_dir();
        let path = dir.join(format!("afa-seeds-baseline-{}.json", std::process::id()));
        std::fs::write(
            &path,
            serde_json::to_string(&fig4b([1.0, 2.0, 3.0])).unwrap(),
        )
        .unwrap();
        let err = load(&path).unwrap_err();
        assert!(err.contains("holds one seed's run"), "{err}");
        let s = over(&[[1.0, 2.0, 3.0]]);
        std::fs::write(&path, serde_json::to_string(&[&s, &s]).unwrap()).unwrap();
        assert_eq!(load(&path).unwrap()["swan-fig4b"].seeds, [1]);
        std::fs::remove_file(&path).unwrap();
    }
}
