//! `afa reproduce --jobs N`: experiments in worker processes, N at a time.
//!
//! A worker is this binary running one experiment with `--json` into a scratch directory.
//! Experiments print their own tables as they go, so running them on threads of one process
//! would interleave their output; a process each keeps it apart, and its memory too. What a
//! worker printed is handed back whole and in registry order, so the printout reads as a
//! run one after the other would, and each experiment's figures depend on its seed alone.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;

use super::{Entry, Outcome, ReproduceArgs, Reproduction};
use crate::sweep::ScratchDir;

/// One run of one experiment: the experiment, its seed, and where swan-fig6 writes its run
/// report in that run.
#[derive(Clone)]
pub(super) struct Unit {
    pub entry: Entry,
    pub seed: u64,
    pub fig6_report: Option<PathBuf>,
}

/// Runs `units` on `args.jobs` workers and calls `handle` with each outcome in the order
/// of `units`. Stops starting runs once `handle` fails, and returns its error.
pub(super) fn run_in_order(
    units: &[Unit],
    args: &ReproduceArgs,
    handle: &mut impl FnMut(&Unit, Outcome) -> Result<(), String>,
) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the afa binary: {e}"))?;
    let scratch = ScratchDir::new("reproduce")?;
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let (sender, receiver) = mpsc::channel();
    let workers = args.jobs.clamp(1, units.len().max(1));
    std::thread::scope(|scope| {
        for _ in 0..workers {
            let sender = sender.clone();
            let (next, stop, exe, scratch) = (&next, &stop, &exe, &scratch.0);
            scope.spawn(move || loop {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let slot = next.fetch_add(1, Ordering::Relaxed);
                let Some(unit) = units.get(slot) else {
                    return;
                };
                let outcome = run_worker(exe, unit, args.quick, scratch);
                if sender.send((slot, outcome)).is_err() {
                    return;
                }
            });
        }
        drop(sender);
        let mut pending = BTreeMap::new();
        let mut done = 0;
        let mut result = Ok(());
        for (slot, outcome) in receiver {
            pending.insert(slot, outcome);
            while let Some(outcome) = pending.remove(&done) {
                if result.is_ok() {
                    result = handle(&units[done], Outcome::Worker(outcome));
                    if result.is_err() {
                        stop.store(true, Ordering::Relaxed);
                    }
                }
                done += 1;
            }
        }
        result
    })
}

/// Runs one experiment in a worker process: what it printed (less the seed line, which the
/// parent prints once) and the reproduction its JSON holds, or the error it ended with.
fn run_worker(
    exe: &Path,
    unit: &Unit,
    quick: bool,
    scratch: &Path,
) -> Result<(String, Reproduction), String> {
    let id = unit.entry.0;
    let json = scratch.join(format!("{id}.seed{}.json", unit.seed));
    let mut command = Command::new(exe);
    command
        .arg("reproduce")
        .arg(id)
        .arg("--seed")
        .arg(unit.seed.to_string())
        .arg("--json")
        .arg(&json);
    if quick {
        command.arg("--quick");
    }
    if let Some(path) = &unit.fig6_report {
        command.arg("--swan-fig6-report").arg(path);
    }
    let output = command
        .output()
        .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        // The worker's own error line, as the experiment would have given it here.
        let message = stderr
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("error: "))
            .unwrap_or_else(|| stderr.trim());
        return Err(format!("{message} (worker exited with {})", output.status));
    }
    eprint!("{stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let printed = match stdout.split_once('\n') {
        Some((first, rest)) if first.starts_with("seed: ") => rest.to_string(),
        _ => stdout.into_owned(),
    };
    let text = std::fs::read_to_string(&json)
        .map_err(|e| format!("cannot read the worker's {}: {e}", json.display()))?;
    let reproduction = serde_json::from_str::<Reproduction>(&text)
        .map_err(|e| format!("the worker's {} does not parse: {e}", json.display()))?;
    Ok((printed, reproduction))
}
