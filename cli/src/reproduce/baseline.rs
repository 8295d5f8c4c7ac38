//! `afa reproduce … --baseline OLD.json`: what a change moved. Every label whose value
//! differs from the baseline run's is listed with both values, and every claim whose verdict
//! differs, so a before → after table comes from the tool instead of by hand.
//!
//! A simulation run is bit for bit the same for the same code, seed and scale, so any
//! difference at all is the change's doing; the comparison therefore lists every label that
//! moved, however little. The baseline's claims are judged again with today's rules
//! (`claims::evaluate` over its labels), not read from its file, so that a rule edited since
//! the baseline was written does not show up as a change of the model.

use std::collections::BTreeMap;
use std::path::Path;

use super::{claims, Reproduction};

/// Reads a baseline file as its JSON entries: the list's items, or the one object. `None`
/// when the text is not JSON. Shared with the `--seeds` baseline (`seeds_baseline`), which
/// names its own format when the entries are not its.
pub(super) fn read_entries(path: &Path) -> Result<Option<Vec<serde_json::Value>>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the baseline {}: {e}", path.display()))?;
    Ok(serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .map(|value| match value {
            serde_json::Value::Array(list) => list,
            one => vec![one],
        }))
}

/// Reads a file written by `afa reproduce --json`: one experiment, or a list from `--all`.
pub fn load(path: &Path) -> Result<BTreeMap<String, Reproduction>, String> {
    let not_ours = || {
        format!(
            "the baseline {} is not the JSON of `afa reproduce --json` (an object with id, \
             unit, paper and measured, or a list of them)",
            path.display()
        )
    };
    let entries = read_entries(path)?.ok_or_else(not_ours)?;
    // A `--seeds` file parses as runs too (its `measured` are means), but a mean over seeds
    // is no run that a rerun reproduces bit for bit.
    if entries.iter().any(|e| e.get("seeds").is_some()) {
        return Err(format!(
            "the baseline {} holds means over several seeds (`--seeds`); compare with it \
             using --seeds, or give the --json of a run with one seed",
            path.display()
        ));
    }
    entries
        .into_iter()
        .map(|e| {
            serde_json::from_value::<Reproduction>(e)
                .map(|r| (r.id.clone(), r))
                .map_err(|_| not_ours())
        })
        .collect()
}

/// One label that moved.
#[derive(Debug, Clone, PartialEq)]
pub struct Moved {
    pub label: String,
    pub before: Option<f64>,
    pub after: Option<f64>,
}

/// One claim whose verdict changed.
#[derive(Debug, Clone, PartialEq)]
pub struct Flipped {
    pub claim: String,
    pub before: &'static str,
    pub after: &'static str,
    pub values_before: String,
    pub values_after: String,
}

/// What moved between `before` and `after` (the same experiment).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Change {
    pub moved: Vec<Moved>,
    pub unchanged: usize,
    pub flipped: Vec<Flipped>,
}

fn labels(r: &Reproduction) -> BTreeMap<&str, f64> {
    r.measured
        .iter()
        .chain(&r.context)
        .map(|(l, &v)| (l.as_str(), v))
        .collect()
}

/// Compares two runs of one experiment.
pub fn compare(before: &Reproduction, after: &Reproduction) -> Change {
    let (old, new) = (labels(before), labels(after));
    let mut all: Vec<&str> = old.keys().chain(new.keys()).copied().collect();
    all.sort_unstable();
    all.dedup();
    let mut change = Change::default();
    for label in all {
        let (b, a) = (old.get(label).copied(), new.get(label).copied());
        // Bitwise: NaN equals NaN here, and -0.0 differs from 0.0, as a rerun would have it.
        if b.map(f64::to_bits) == a.map(f64::to_bits) {
            change.unchanged += 1;
        } else {
            change.moved.push(Moved {
                label: label.to_owned(),
                before: b,
                after: a,
            });
        }
    }
    let (old_claims, new_claims) = (claims::evaluate(before), claims::evaluate(after));
    for (b, a) in old_claims.iter().zip(&new_claims) {
        if b.holds != a.holds {
            change.flipped.push(Flipped {
                claim: a.claim.clone(),
                before: b.verdict(),
                after: a.verdict(),
                values_before: b.values.clone(),
                values_after: a.values.clone(),
            });
        }
    }
    change
}

fn show(x: Option<f64>) -> String {
    x.map_or("-".to_owned(), |v| format!("{v:.4}"))
}

/// Prints the change of one experiment under its table.
pub fn print(change: &Change) {
    if change.moved.is_empty() && change.flipped.is_empty() {
        println!(
            "against the baseline: all {} labels unchanged",
            change.unchanged
        );
        return;
    }
    println!(
        "against the baseline: {} labels moved, {} unchanged",
        change.moved.len(),
        change.unchanged
    );
    println!(
        "  {:<44} {:>12} {:>12} {:>8}",
        "label", "baseline", "now", "ratio"
    );
    for m in &change.moved {
        let ratio = match (m.before, m.after) {
            (Some(b), Some(a)) if b != 0.0 => format!("{:.3}", a / b),
            _ => "-".to_owned(),
        };
        println!(
            "  {:<44} {:>12} {:>12} {ratio:>8}",
            m.label,
            show(m.before),
            show(m.after)
        );
    }
    for f in &change.flipped {
        println!(
            "  claim {} → {}: {} [{} → {}]",
            f.before, f.after, f.claim, f.values_before, f.values_after
        );
    }
}

/// After `--all --baseline`: how many experiments moved, and the claims that turned.
pub fn print_tally(changes: &[Change]) {
    let moved = changes.iter().filter(|c| !c.moved.is_empty()).count();
    let turned = |from: &str, to: &str| {
        changes
            .iter()
            .flat_map(|c| &c.flipped)
            .filter(|f| f.before == from && f.after == to)
            .count()
    };
    println!(
        "against the baseline: {moved} of {} experiments moved; claims turned MISS → holds: {}, \
         holds → MISS: {}, other changes: {}",
        changes.len(),
        turned("MISS", "holds"),
        turned("holds", "MISS"),
        changes.iter().map(|c| c.flipped.len()).sum::<usize>()
            - turned("MISS", "holds")
            - turned("holds", "MISS")
    );
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A run of swan-fig4b with the Log-RAID0 labels only (shared with the seeds tests).
    pub(in crate::reproduce) fn fig4b(log: [f64; 3]) -> Reproduction {
        let labels = ["log-raid0_3", "log-raid0_6", "log-raid0_9"];
        Reproduction {
            id: "swan-fig4b".into(),
            unit: "MB/s".into(),
            paper: labels.iter().map(|l| (l.to_string(), 500.0)).collect(),
            measured: labels
                .iter()
                .zip(log)
                .map(|(l, v)| (l.to_string(), v))
                .collect(),
            context: BTreeMap::new(),
        }
    }

    #[test]
    fn a_rerun_of_the_same_values_moves_nothing() {
        let r = fig4b([240.0, 397.0, 630.0]);
        let change = compare(&r, &r.clone());
        assert_eq!(change.unchanged, 3);
        assert!(change.moved.is_empty() && change.flipped.is_empty());
    }

    #[test]
    fn moved_labels_and_flipped_claims_are_listed() {
        let before = fig4b([240.0, 397.0, 630.0]);
        let mut after = fig4b([640.0, 397.0, 230.0]);
        after.context.insert("extra".into(), 1.0);
        let change = compare(&before, &after);
        assert_eq!(change.unchanged, 1);
        let moved: Vec<&str> = change.moved.iter().map(|m| m.label.as_str()).collect();
        assert_eq!(moved, ["extra", "log-raid0_3", "log-raid0_9"]);
        assert_eq!(change.moved[0].before, None);
        assert_eq!(change.flipped.len(), 1);
        let flip = &change.flipped[0];
        assert_eq!((flip.before, flip.after), ("MISS", "holds"));
        assert!(flip.claim.contains("Log-RAID0 falls"), "{flip:?}");
    }

    #[test]
    fn a_baseline_file_holds_one_run_or_a_list_and_anything_else_is_named() {
        let dir = std::env::temp_dir();
        let one = dir.join(format!("afa-baseline-one-{}.json", std::process::id()));
        let r = fig4b([1.0, 2.0, 3.0]);
        std::fs::write(&one, serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(load(&one).unwrap()["swan-fig4b"].measured, r.measured);
        let list = dir.join(format!("afa-baseline-list-{}.json", std::process::id()));
        std::fs::write(&list, serde_json::to_string(&[&r, &r]).unwrap()).unwrap();
        assert_eq!(load(&list).unwrap().len(), 1);
        std::fs::write(&list, "{\"id\": 3}").unwrap();
        let err = load(&list).unwrap_err();
        assert!(
            err.contains("is not the JSON of `afa reproduce --json`"),
            "{err}"
        );
        let missing = dir.join("afa-baseline-that-does-not-exist.json");
        assert!(load(&missing)
            .unwrap_err()
            .contains("cannot read the baseline"));
        std::fs::remove_file(&one).unwrap();
        std::fs::remove_file(&list).unwrap();
    }

    #[test]
    fn a_value_json_could_not_hold_reads_back_as_nan_and_keeps_the_others() {
        let mut r = fig4b([1.0, 2.0, 3.0]);
        r.measured.insert("log-raid0_6".into(), f64::NAN);
        r.context.insert("swan0_low".into(), f64::INFINITY);
        let text = serde_json::to_string(&r).unwrap();
        // serde_json writes both as null, which a plain f64 field would refuse.
        assert!(text.contains("null"), "{text}");
        let back: Reproduction = serde_json::from_str(&text).unwrap();
        assert!(back.measured["log-raid0_6"].is_nan());
        assert!(back.context["swan0_low"].is_nan());
        assert_eq!(back.measured["log-raid0_3"], 1.0);
        assert_eq!(back.measured["log-raid0_9"], 3.0);
    }
}
