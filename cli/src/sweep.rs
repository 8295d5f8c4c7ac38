//! `afa sweep GRID.toml`: runs a grid of simulations, one per combination of the grid's axis
//! values, as independent `afa run` processes on a pool of `--jobs` workers, and writes one
//! JSON line per point. `--emit slurm` writes a Slurm job-array script instead, whose tasks
//! each run one point with `--point I`. The grid format is documented in docs/sweep.md.
//!
//! Each point is a complete run configuration: the base configuration with the point's
//! values written over it, saved to a temporary file and run by a child `afa run`. Separate
//! processes keep the points independent (a simulation is single-threaded and
//! deterministic, so running points side by side changes none of their results), let the
//! operating system spread them over the cores, and make a point run exactly as the same
//! configuration would run by hand.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Instant;

use clap::{Args, ValueEnum};
use serde::Deserialize;
use serde_json::{json, Value as Json};
use toml::Value;

#[derive(Debug, Args)]
pub struct SweepArgs {
    /// The grid: a base configuration and the axes to sweep (docs/sweep.md).
    pub grid: PathBuf,
    /// Simultaneous simulations (default: the number of cores).
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Writes the JSON lines here instead of to standard output.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Runs only point I (0-based), as a Slurm array task does.
    #[arg(long, value_name = "I")]
    pub point: Option<usize>,
    /// Lists the points and their parameters without running them.
    #[arg(long, conflicts_with = "emit")]
    pub list: bool,
    /// Writes a batch script that runs the points elsewhere, instead of running them.
    #[arg(long, value_enum)]
    pub emit: Option<EmitKind>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum EmitKind {
    /// A Slurm job-array script (`sbatch SCRIPT`), one array task per point.
    Slurm,
}

/// The grid file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GridFile {
    /// The base run configuration, relative to the grid file.
    base: PathBuf,
    #[serde(default, rename = "axis")]
    axes: Vec<AxisFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AxisFile {
    /// The label of the axis in the JSON lines (default: the key).
    name: Option<String>,
    /// The dotted key every value is written to; without it, each value is a table of
    /// dotted keys and values, so that one axis value can set several keys.
    key: Option<String>,
    values: Vec<Value>,
    /// How each value is shown in the JSON lines (default: the value itself).
    labels: Option<Vec<Value>>,
}

/// A loaded grid.
#[derive(Debug, Clone)]
pub struct Grid {
    /// The grid file, for messages.
    pub source: String,
    /// The directory relative paths in the grid are resolved against.
    pub dir: PathBuf,
    pub base: PathBuf,
    pub axes: Vec<Axis>,
}

#[derive(Debug, Clone)]
pub struct Axis {
    pub name: String,
    /// Each value as the list of (dotted key, value) assignments it makes.
    pub values: Vec<Vec<(String, Value)>>,
    /// Each value as shown in the JSON lines.
    pub labels: Vec<Value>,
}

/// One combination of axis values.
#[derive(Debug, Clone)]
pub struct Point {
    pub index: usize,
    /// (axis name, value label) in axis order.
    pub params: Vec<(String, Value)>,
    /// (dotted key, value) in the order they are applied.
    pub assignments: Vec<(String, Value)>,
}

/// The key that chooses the base configuration itself rather than a key inside it.
const BASE_KEY: &str = "base";
/// Keys under this prefix are fio options, written into every job section of the workload.
pub const JOB_PREFIX: &str = "job.";

pub fn load_grid(path: &Path) -> Result<Grid, String> {
    let source = path.display().to_string();
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("cannot read grid {source}: {e}"))?;
    let file: GridFile = toml::from_str(&text).map_err(|e| format!("grid {source}: {e}"))?;
    let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut axes = Vec::new();
    for (index, axis) in file.axes.into_iter().enumerate() {
        let number = index + 1;
        let name = match (&axis.name, &axis.key) {
            (Some(name), _) => name.clone(),
            (None, Some(key)) => key.clone(),
            (None, None) => {
                return Err(format!(
                    "grid {source}: axis {number} has neither a name nor a key"
                ))
            }
        };
        if axis.values.is_empty() {
            return Err(format!("grid {source}: axis '{name}' has no values"));
        }
        let mut values = Vec::new();
        for value in &axis.values {
            let assignments = match (&axis.key, value) {
                (Some(key), value) => vec![(key.clone(), value.clone())],
                (None, Value::Table(table)) => table
                    .iter()
                    .map(|(key, value)| (key.clone(), value.clone()))
                    .collect(),
                (None, other) => {
                    return Err(format!(
                        "grid {source}: axis '{name}' has no key, so its values must be tables \
                         of dotted keys, found {other}"
                    ))
                }
            };
            for (key, _) in &assignments {
                check_key(key).map_err(|e| format!("grid {source}: axis '{name}': {e}"))?;
            }
            values.push(assignments);
        }
        let labels = match axis.labels {
            Some(labels) if labels.len() != axis.values.len() => {
                return Err(format!(
                    "grid {source}: axis '{name}' has {} labels for {} values",
                    labels.len(),
                    axis.values.len()
                ))
            }
            Some(labels) => labels,
            None => axis.values,
        };
        axes.push(Axis {
            name,
            values,
            labels,
        });
    }
    Ok(Grid {
        source,
        dir: dir.clone(),
        base: dir.join(file.base),
        axes,
    })
}

pub fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() || key.split('.').any(str::is_empty) {
        return Err(format!("'{key}' is not a dotted key"));
    }
    if key.starts_with(JOB_PREFIX) && key[JOB_PREFIX.len()..].contains(['=', '\n', '[']) {
        return Err(format!("'{key}' is not a fio option name"));
    }
    Ok(())
}

impl Grid {
    /// The number of points: the product of the axes' lengths (1 without axes).
    pub fn point_count(&self) -> usize {
        self.axes.iter().map(|axis| axis.values.len()).product()
    }

    /// Point `index`, counting with the last axis varying fastest.
    pub fn point(&self, index: usize) -> Option<Point> {
        if index >= self.point_count() {
            return None;
        }
        let mut rest = index;
        let mut chosen = vec![0; self.axes.len()];
        for (slot, axis) in chosen.iter_mut().zip(&self.axes).rev() {
            *slot = rest % axis.values.len();
            rest /= axis.values.len();
        }
        let mut params = Vec::new();
        let mut assignments = Vec::new();
        for (axis, &choice) in self.axes.iter().zip(&chosen) {
            params.push((axis.name.clone(), axis.labels[choice].clone()));
            assignments.extend(axis.values[choice].iter().cloned());
        }
        Some(Point {
            index,
            params,
            assignments,
        })
    }

    /// The complete run configuration of `point`, as TOML text whose paths are absolute
    /// (so that it runs from anywhere).
    pub fn point_config(&self, point: &Point) -> Result<String, String> {
        let mut base = self.base.clone();
        for (key, value) in &point.assignments {
            if key == BASE_KEY {
                let Value::String(path) = value else {
                    return Err(format!("point {}: base must be a path", point.index));
                };
                base = self.dir.join(path);
            }
        }
        let base_source = base.display().to_string();
        let text = std::fs::read_to_string(&base)
            .map_err(|e| format!("cannot read configuration {base_source}: {e}"))?;
        let mut config: toml::Table =
            toml::from_str(&text).map_err(|e| format!("configuration {base_source}: {e}"))?;
        let base_dir = absolute(base.parent().unwrap_or(Path::new(".")))?;
        make_paths_absolute(&mut config, &base_dir);
        let mut job_options = Vec::new();
        for (key, value) in &point.assignments {
            if key == BASE_KEY {
                continue;
            }
            if let Some(option) = key.strip_prefix(JOB_PREFIX) {
                job_options.push((option.to_string(), fio_value(value)));
                continue;
            }
            set_dotted(&mut config, key, value.clone())
                .map_err(|e| format!("point {}: {e}", point.index))?;
        }
        if !job_options.is_empty() {
            let job = job_text(&config)?;
            let job = override_job_options(&job, &job_options);
            let workload = config
                .entry("workload")
                .or_insert_with(|| Value::Table(toml::Table::new()));
            if let Value::Table(workload) = workload {
                workload.remove("job_file");
                workload.insert("job".to_string(), Value::String(job));
            }
        }
        toml::to_string(&config).map_err(|e| format!("point {}: {e}", point.index))
    }
}

fn absolute(path: &Path) -> Result<PathBuf, String> {
    let path = if path.as_os_str().is_empty() {
        Path::new(".")
    } else {
        path
    };
    std::path::absolute(path).map_err(|e| format!("cannot resolve {}: {e}", path.display()))
}

/// Rewrites the configuration's relative paths (the job file and the trace) against the
/// directory of the configuration they came from.
fn make_paths_absolute(config: &mut toml::Table, base_dir: &Path) {
    let Some(Value::Table(workload)) = config.get_mut("workload") else {
        return;
    };
    let fix = |value: &mut Value| {
        if let Value::String(path) = value {
            *path = base_dir.join(&*path).display().to_string();
        }
    };
    if let Some(value) = workload.get_mut("job_file") {
        fix(value);
    }
    if let Some(Value::Table(trace)) = workload.get_mut("trace") {
        if let Some(value) = trace.get_mut("path") {
            fix(value);
        }
    }
}

/// Sets `a.b.c = value`, creating tables on the way.
pub fn set_dotted(config: &mut toml::Table, key: &str, value: Value) -> Result<(), String> {
    let mut parts: Vec<&str> = key.split('.').collect();
    let last = parts.pop().unwrap_or(key);
    let mut table = config;
    for (depth, part) in parts.iter().enumerate() {
        let entry = table
            .entry(part.to_string())
            .or_insert_with(|| Value::Table(toml::Table::new()));
        table = match entry {
            Value::Table(inner) => inner,
            _ => {
                return Err(format!(
                    "cannot set '{key}': '{}' is not a table",
                    parts[..=depth].join(".")
                ))
            }
        };
    }
    table.insert(last.to_string(), value);
    Ok(())
}

/// A TOML value as a fio option value: strings bare, numbers and booleans as written.
pub fn fio_value(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Boolean(flag) => u8::from(*flag).to_string(),
        other => other.to_string(),
    }
}

/// The workload's fio job text, inline or from its (already absolute) job file.
fn job_text(config: &toml::Table) -> Result<String, String> {
    let workload = config.get("workload").and_then(Value::as_table);
    if let Some(text) = workload.and_then(|w| w.get("job")).and_then(Value::as_str) {
        return Ok(text.to_string());
    }
    if let Some(path) = workload
        .and_then(|w| w.get("job_file"))
        .and_then(Value::as_str)
    {
        return std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read job file {path}: {e}"));
    }
    Err("job.* axes need a fio workload (workload.job or workload.job_file)".to_string())
}

/// Appends `option=value` lines to the end of every job section of a fio job file, so that
/// they win over anything the section or `[global]` says (fio applies options in order).
pub fn override_job_options(text: &str, options: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut in_job = false;
    let append = |out: &mut String| {
        for (option, value) in options {
            out.push_str(&format!("{option}={value}\n"));
        }
    };
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('[') && trimmed.ends_with(']') {
            if in_job {
                append(&mut out);
            }
            in_job = trimmed[1..trimmed.len() - 1].trim() != "global";
        }
        out.push_str(line);
        out.push('\n');
    }
    if in_job {
        append(&mut out);
    }
    out
}

/// A scratch directory (a sweep's point configurations, reproduce workers' JSON files);
/// removed when dropped.
#[derive(Debug)]
pub(crate) struct ScratchDir(pub(crate) PathBuf);

impl ScratchDir {
    /// A fresh directory under the system's temporary one, named `afa-{purpose}-…`.
    pub(crate) fn new(purpose: &str) -> Result<ScratchDir, String> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let path =
            std::env::temp_dir().join(format!("afa-{purpose}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        Ok(ScratchDir(path))
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes point `index`'s configuration and checks that `afa run` would accept it.
fn prepare_point(grid: &Grid, point: &Point, scratch: &Path) -> Result<PathBuf, String> {
    let text = grid.point_config(point)?;
    let path = scratch.join(format!("point-{}.toml", point.index));
    std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    let loaded = crate::config::load(Some(&path), &[], None)
        .map_err(|e| format!("point {}: {e}", point.index))?;
    // The job is parsed too, since fio options written by `job.*` axes are not TOML keys
    // that loading the configuration would check.
    if let Some(job) = &loaded.config.workload.job {
        afa_workload::fio::parse_job_file(job)
            .map_err(|e| format!("point {}: workload.job: {e}", point.index))?;
    }
    Ok(path)
}

/// Runs one prepared point with a child `afa run` and returns its JSON line.
fn run_point(exe: &Path, point: &Point, config: &Path) -> Json {
    let report_path = config.with_extension("json");
    let started = Instant::now();
    let output = Command::new(exe)
        .arg("run")
        .arg(config)
        .arg("--quiet")
        .arg("--json")
        .arg(&report_path)
        .output();
    let wall_s = started.elapsed().as_secs_f64();
    let params: serde_json::Map<String, Json> = point
        .params
        .iter()
        .map(|(name, value)| (name.clone(), toml_to_json(value)))
        .collect();
    let mut line = json!({ "point": point.index, "params": params });
    let failure = match output {
        Err(e) => Some(format!("cannot start {}: {e}", exe.display())),
        Ok(output) => {
            let report = std::fs::read_to_string(&report_path)
                .ok()
                .and_then(|text| serde_json::from_str::<Json>(&text).ok());
            if let Some(report) = &report {
                line["summary"] = summarize(report);
            }
            let _ = std::fs::remove_file(&report_path);
            if output.status.success() && report.is_some() {
                None
            } else {
                let stderr = String::from_utf8_lossy(&output.stderr);
                let message = stderr
                    .lines()
                    .rev()
                    .find(|l| l.starts_with("error:"))
                    .unwrap_or_else(|| stderr.trim());
                Some(format!("afa run exited with {}: {message}", output.status))
            }
        }
    };
    line["wall_s"] = json!(wall_s);
    if let Some(error) = failure {
        line["error"] = json!(error);
    }
    line
}

fn toml_to_json(value: &Value) -> Json {
    serde_json::to_value(value).unwrap_or(Json::Null)
}

/// The headline figures of a run report.
fn summarize(report: &Json) -> Json {
    let number = |path: &[&str]| {
        path.iter()
            .try_fold(report, |node, key| node.get(key))
            .and_then(Json::as_f64)
            .unwrap_or(0.0)
    };
    let ops = ["read", "write", "trim"];
    let iops: f64 = ops.iter().map(|op| number(&[op, "iops"])).sum();
    let mb_s: f64 = ops.iter().map(|op| number(&[op, "bandwidth_mb_s"])).sum();
    json!({
        "iops": iops,
        "mb_s": mb_s,
        "read_iops": number(&["read", "iops"]),
        "write_iops": number(&["write", "iops"]),
        "read_p50_us": number(&["read", "latency_us", "p50"]),
        "read_p99_us": number(&["read", "latency_us", "p99"]),
        "write_p50_us": number(&["write", "latency_us", "p50"]),
        "write_p99_us": number(&["write", "latency_us", "p99"]),
        "waf": number(&["waf"]),
        "sim_time_s": number(&["sim_time_ns"]) / 1e9,
        "host_time_s": number(&["host_time_s"]),
        "mismatches": number(&["integrity", "mismatches"]),
    })
}

/// The outcome of running a grid.
#[derive(Debug)]
pub struct SweepOutcome {
    pub lines: Vec<Json>,
    pub failed: usize,
    pub wall_s: f64,
}

/// Runs points `indices` of `grid` on `jobs` workers, calling `emit` with each JSON line in
/// point order (a line waits for the points before it, so the output does not depend on
/// which worker finished first).
pub fn run_grid(
    grid: &Grid,
    indices: &[usize],
    jobs: usize,
    show_progress: bool,
    mut emit: impl FnMut(&Json) -> Result<(), String>,
) -> Result<SweepOutcome, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the afa binary: {e}"))?;
    let scratch = ScratchDir::new("sweep")?;
    // Every point is checked before any runs, so that a typo in the grid costs nothing.
    let mut prepared = Vec::new();
    for &index in indices {
        let point = grid
            .point(index)
            .ok_or_else(|| format!("grid {} has no point {index}", grid.source))?;
        let config = prepare_point(grid, &point, &scratch.0)
            .map_err(|e| format!("grid {}: {e}", grid.source))?;
        prepared.push((point, config));
    }
    // indicatif draws on stderr only when it is a terminal, so pipes and tests stay clean.
    let progress = if show_progress {
        let bar = indicatif::ProgressBar::new(prepared.len() as u64);
        // The template is a constant; should it ever be edited badly, indicatif's default
        // look is better than a panic.
        let style = indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{wide_bar}] {pos}/{len} points (eta {eta})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
        bar.set_style(style);
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    let started = Instant::now();
    let next = AtomicUsize::new(0);
    let (sender, receiver) = mpsc::channel::<(usize, Json)>();
    let workers = jobs.clamp(1, prepared.len().max(1));
    let mut lines = Vec::new();
    let mut failed = 0;
    let mut emit_error = None;
    std::thread::scope(|scope| {
        for _ in 0..workers {
            let sender = sender.clone();
            let (next, prepared, exe) = (&next, &prepared, &exe);
            scope.spawn(move || loop {
                let slot = next.fetch_add(1, Ordering::Relaxed);
                let Some((point, config)) = prepared.get(slot) else {
                    return;
                };
                if sender.send((slot, run_point(exe, point, config))).is_err() {
                    return;
                }
            });
        }
        drop(sender);
        let mut pending = BTreeMap::new();
        let mut done = 0;
        for (slot, line) in receiver {
            pending.insert(slot, line);
            while let Some(line) = pending.remove(&lines.len()) {
                if line.get("error").is_some() {
                    failed += 1;
                }
                if emit_error.is_none() {
                    emit_error = emit(&line).err();
                }
                lines.push(line);
            }
            done += 1;
            progress.set_position(done);
        }
    });
    progress.finish_and_clear();
    if let Some(error) = emit_error {
        return Err(error);
    }
    Ok(SweepOutcome {
        lines,
        failed,
        wall_s: started.elapsed().as_secs_f64(),
    })
}

pub fn run(args: SweepArgs) -> Result<(), String> {
    let grid = load_grid(&args.grid)?;
    let count = grid.point_count();
    if let Some(EmitKind::Slurm) = args.emit {
        let script = slurm_script(&grid, &args.grid)?;
        return match &args.out {
            Some(path) => std::fs::write(path, script)
                .map_err(|e| format!("cannot write {}: {e}", path.display())),
            None => {
                print!("{script}");
                Ok(())
            }
        };
    }
    if args.list {
        for index in 0..count {
            let point = grid.point(index).expect("index is below the point count");
            let params: serde_json::Map<String, Json> = point
                .params
                .iter()
                .map(|(name, value)| (name.clone(), toml_to_json(value)))
                .collect();
            println!("{}", json!({ "point": index, "params": params }));
        }
        return Ok(());
    }
    let indices: Vec<usize> = match args.point {
        Some(index) if index >= count => {
            return Err(format!(
                "grid {} has {count} points (0 to {}); there is no point {index}",
                grid.source,
                count.saturating_sub(1)
            ))
        }
        Some(index) => vec![index],
        None => (0..count).collect(),
    };
    let jobs = args.jobs.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(usize::from)
            .unwrap_or(1)
    });
    if jobs == 0 {
        return Err("--jobs must be at least 1".to_string());
    }
    let mut out: Box<dyn Write> = match &args.out {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path)
                .map_err(|e| format!("cannot create {}: {e}", path.display()))?,
        )),
        None => Box::new(std::io::stdout().lock()),
    };
    let out_name = args
        .out
        .as_ref()
        .map_or("standard output".to_string(), |p| p.display().to_string());
    let outcome = run_grid(&grid, &indices, jobs, args.point.is_none(), |line| {
        writeln!(out, "{line}")
            .and_then(|()| out.flush())
            .map_err(|e| format!("cannot write {out_name}: {e}"))
    })?;
    eprintln!(
        "sweep: {} points on {} workers in {:.1} s, {} failed",
        outcome.lines.len(),
        jobs.min(indices.len()),
        outcome.wall_s,
        outcome.failed
    );
    if outcome.failed > 0 {
        return Err(format!(
            "{} of {} points failed (see their \"error\" fields)",
            outcome.failed,
            outcome.lines.len()
        ));
    }
    Ok(())
}

/// A Slurm job-array script: one array task per point, each writing its JSON line to
/// `RESULTS/point-I.jsonl` beside the grid.
fn slurm_script(grid: &Grid, grid_path: &Path) -> Result<String, String> {
    let count = grid.point_count();
    let grid_abs = absolute(grid_path)?;
    let stem = grid_path
        .file_stem()
        .map_or("sweep".to_string(), |s| s.to_string_lossy().into_owned());
    let results = absolute(&grid.dir)?.join(format!("{stem}-results"));
    let exe = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "afa".to_string());
    Ok(format!(
        "#!/bin/bash
# Runs the {count} points of {grid} as a Slurm job array, one simulation per task (a
# simulation is single-threaded). Submit with `sbatch THIS_SCRIPT`; afterwards
#   cat $(ls {results}/point-*.jsonl | sort -V) > {stem}.jsonl
# gives the same lines, in the same order, as `afa sweep {grid}` on one machine.
#SBATCH --job-name=afa-{stem}
#SBATCH --array=0-{last}
#SBATCH --cpus-per-task=1
#SBATCH --output={logs}/{stem}-%A_%a.log
set -euo pipefail
AFA=\"${{AFA:-{exe}}}\"
mkdir -p {results}
\"$AFA\" sweep {grid} --point \"$SLURM_ARRAY_TASK_ID\" --out {results}/point-\"$SLURM_ARRAY_TASK_ID\".jsonl
",
        grid = shell_quote(&grid_abs.display().to_string()),
        results = shell_quote(&results.display().to_string()),
        // Slurm opens the log before the script runs, so it goes in a directory that exists.
        logs = shell_quote(&absolute(&grid.dir)?.display().to_string()),
        last = count.saturating_sub(1),
    ))
}

/// `afa bench sweep`: runs a grid of `points` similar simulations (fio random writes of
/// `requests` requests, iodepth 1, 4, 16 and 32 × distinct seeds) once on one worker and once
/// on `jobs` workers, and reports both wall times, the speed-up, and whether both runs gave
/// the same results.
pub fn bench(points: usize, jobs: usize, requests: u64) -> Result<Json, String> {
    const DEPTHS: [u32; 4] = [1, 4, 16, 32];
    if points == 0 || points % DEPTHS.len() != 0 || jobs == 0 || requests == 0 {
        return Err(format!(
            "--points must be a positive multiple of {}, --jobs and --requests positive",
            DEPTHS.len()
        ));
    }
    let scratch = ScratchDir::new("sweep")?;
    let base = format!(
        "seed = 1

[ssd]
payload = \"token\"

[workload]
job = \"\"\"
[w]
rw=randwrite
         bs=4k
iodepth=1
number_ios={requests}
\"\"\"
"
    );
    let seeds: Vec<String> = (1..=points / DEPTHS.len()).map(|s| s.to_string()).collect();
    let grid_text = format!(
        "base = \"base.toml\"

[[axis]]
key = \"job.iodepth\"
values = {DEPTHS:?}

         [[axis]]
key = \"seed\"
values = [{}]
",
        seeds.join(", ")
    );
    let write = |name: &str, text: &str| {
        let path = scratch.0.join(name);
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
    };
    write("base.toml", &base)?;
    write("grid.toml", &grid_text)?;
    let grid = load_grid(&scratch.0.join("grid.toml"))?;
    let indices: Vec<usize> = (0..grid.point_count()).collect();
    let sequential = run_grid(&grid, &indices, 1, true, |_| Ok(()))?;
    let parallel = run_grid(&grid, &indices, jobs, true, |_| Ok(()))?;
    let failed = sequential.failed + parallel.failed;
    if failed > 0 {
        let first = sequential
            .lines
            .iter()
            .chain(&parallel.lines)
            .find_map(|line| line.get("error"))
            .cloned()
            .unwrap_or(Json::Null);
        return Err(format!("{failed} bench points failed; first: {first}"));
    }
    // Points are deterministic, so both runs must agree on everything but host timings.
    let simulated = |lines: &[Json]| -> Vec<Json> {
        lines
            .iter()
            .map(|line| {
                let mut line = line.clone();
                if let Some(map) = line.as_object_mut() {
                    map.remove("wall_s");
                }
                if let Some(summary) = line.get_mut("summary").and_then(Json::as_object_mut) {
                    summary.remove("host_time_s");
                }
                line
            })
            .collect()
    };
    let identical = simulated(&sequential.lines) == simulated(&parallel.lines);
    // The points' summed wall times over the sweep's: how many ran at once on average. It
    // shows the pool at work even when other load on the machine leaves no idle core to
    // turn concurrency into speed.
    let in_flight = |outcome: &SweepOutcome| {
        let points_s: f64 = outcome
            .lines
            .iter()
            .filter_map(|line| line["wall_s"].as_f64())
            .sum();
        points_s / outcome.wall_s
    };
    Ok(json!({
        "points": points,
        "requests_per_point": requests,
        "jobs": jobs,
        "cores": std::thread::available_parallelism().map(usize::from).unwrap_or(1),
        "sequential_wall_s": sequential.wall_s,
        "parallel_wall_s": parallel.wall_s,
        "parallel_over_sequential": parallel.wall_s / sequential.wall_s,
        "speedup": sequential.wall_s / parallel.wall_s,
        "identical_results": identical,
        "sequential_points_in_flight": in_flight(&sequential),
        "parallel_points_in_flight": in_flight(&parallel),
    }))
}

/// Quotes `text` for a POSIX shell when it holds anything but safe characters.
fn shell_quote(text: &str) -> String {
    if text
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"/._-+,:=".contains(&b))
    {
        text.to_string()
    } else {
        format!("'{}'", text.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_options_go_at_the_end_of_every_job_section() {
        let text = "[global]\nbs=4k\n[a]\nrw=randwrite\nbs=8k\n\n[b]\nstonewall\n";
        let out = override_job_options(text, &[("bs".into(), "64k".into())]);
        assert_eq!(
            out,
            "[global]\nbs=4k\n[a]\nrw=randwrite\nbs=8k\n\nbs=64k\n[b]\nstonewall\nbs=64k\n"
        );
    }

    #[test]
    fn dotted_keys_create_tables_and_refuse_to_descend_into_values() {
        let mut table = toml::Table::new();
        set_dotted(&mut table, "host.threads", Value::Integer(4)).unwrap();
        assert_eq!(table["host"]["threads"].as_integer(), Some(4));
        let error = set_dotted(&mut table, "host.threads.x", Value::Integer(1)).unwrap_err();
        assert!(error.contains("'host.threads' is not a table"), "{error}");
    }
}
