//! Bad configuration values get an error naming them, never a panic, an abort or a run that
//! exhausts memory. Every numeric field of the fixture configurations (each field `afa run`
//! reports in its JSON, defaults included) is set in turn to hostile values (0, 1, −1, 2^32,
//! i64::MAX, 0.5, NaN, ±infinity, 1e300, 1e−9) and the run must end with status 0, 1 or 2.
//!
//! About 1,900 runs, most refused at once, spread over the machine's cores: about a minute
//! on two. A run still going after `DEADLINE` is killed and reported as slow, not failed: a
//! value can legitimately ask for a great deal of work (1e300 rounds of preconditioning), as
//! a fio `io_size` can.

mod common;
use common::{afa_json, fixture};

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use toml::Value;

const DEADLINE: Duration = Duration::from_secs(10);

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("afa-config-mutations-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// JSON to TOML: nulls (absent options) are dropped, as TOML has none.
fn to_toml(v: &serde_json::Value) -> Option<Value> {
    Some(match v {
        serde_json::Value::Null => return None,
        serde_json::Value::Bool(b) => Value::Boolean(*b),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => Value::Integer(i),
            None => Value::Float(n.as_f64().unwrap()),
        },
        serde_json::Value::String(s) => Value::String(s.clone()),
        serde_json::Value::Array(a) => Value::Array(a.iter().filter_map(to_toml).collect()),
        serde_json::Value::Object(o) => Value::Table(
            o.iter()
                .filter_map(|(k, v)| to_toml(v).map(|v| (k.clone(), v)))
                .collect(),
        ),
    })
}

/// The configuration a fixture's run reports, with its relative paths made absolute.
fn reported_config(config_path: &str, name: &str) -> Value {
    let json = scratch(&format!("{name}.json"));
    let report = afa_json(&["run", config_path, "--quiet"], &json);
    let mut config = to_toml(&report["config"]).unwrap();
    let fixtures = PathBuf::from(fixture(""));
    if let Some(w) = config.get_mut("workload").and_then(Value::as_table_mut) {
        if let Some(Value::String(p)) = w.get_mut("job_file") {
            *p = fixtures.join(&*p).display().to_string();
        }
        if let Some(Value::String(p)) = w
            .get_mut("trace")
            .and_then(Value::as_table_mut)
            .and_then(|t| t.get_mut("path"))
        {
            *p = fixtures.join(&*p).display().to_string();
        }
    }
    config
}

/// Paths (keys and array indices) of every numeric leaf.
fn numeric_leaves(v: &Value, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match v {
        Value::Integer(_) | Value::Float(_) => out.push(path.clone()),
        Value::Table(t) => {
            for (k, v) in t {
                path.push(k.clone());
                numeric_leaves(v, path, out);
                path.pop();
            }
        }
        Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                path.push(i.to_string());
                numeric_leaves(v, path, out);
                path.pop();
            }
        }
        _ => {}
    }
}

fn leaf_mut<'a>(v: &'a mut Value, path: &[String]) -> &'a mut Value {
    path.iter().fold(v, |v, k| match v {
        Value::Table(t) => t.get_mut(k).unwrap(),
        Value::Array(a) => &mut a[k.parse::<usize>().unwrap()],
        _ => unreachable!("a leaf's path goes through tables and arrays"),
    })
}

fn hostile(original: &Value) -> Vec<Value> {
    let floats = [0.0, -0.5, 1e300, f64::NAN, f64::INFINITY, 1.0, 2.0, 1e-9];
    match original {
        Value::Integer(_) => [0, 1, -1, 3, 1 << 32, i64::MAX]
            .into_iter()
            .map(Value::Integer)
            .chain([Value::Float(0.5)])
            .collect(),
        _ => floats.into_iter().map(Value::Float).collect(),
    }
}

enum Verdict {
    /// Ended with status 0, 1 or 2; its standard error.
    Ended(String),
    Slow,
    Broke(String),
}

fn run_mutant(path: &Path) -> Verdict {
    run_afa(&["run", path.to_str().unwrap(), "--quiet"])
}

/// Runs `afa` with `args` until it ends or `DEADLINE` passes.
fn run_afa(args: &[&str]) -> Verdict {
    let mut child = Command::new(env!("CARGO_BIN_EXE_afa"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            return match status.code() {
                Some(0..=2) if !stderr.contains("panicked") => Verdict::Ended(stderr),
                code => Verdict::Broke(format!("status {code:?}: {stderr}")),
            };
        }
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            return Verdict::Slow;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn every_numeric_field_set_to_a_hostile_value_is_refused_or_run_never_panicked_on() {
    let waflash = scratch("waflash.toml");
    std::fs::write(
        &waflash,
        "seed = 3\n[waflash.ssd]\nbuffer_policy = \"pc-lru\"\nftl = \"multi-version\"\n\
         compaction = true\nbuffer_bytes = 2097152\n[waflash.filebench]\n\
         personality = \"fileserver\"\nio_bytes = 5120\nrequests = 4000\nscale = 0.005\nseed = 3\n",
    )
    .unwrap();
    let default = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/default.toml");
    // (configuration, the top-level sections whose fields are mutated). `[ssd]` is mutated
    // in full once for one SSD and once under an array; its checks are the same elsewhere.
    let cases: Vec<(String, &str, &[&str])> = vec![
        (
            default.display().to_string(),
            "default",
            &["ssd", "precondition", "report", "workload", "seed"],
        ),
        (fixture("swan.toml"), "swan", &["array", "ssd"]),
        (fixture("raid5.toml"), "raid5", &["array"]),
        (
            fixture("scalaafa.toml"),
            "scalaafa",
            &["array", "host", "precondition"],
        ),
        (fixture("lograid.toml"), "lograid", &["array"]),
        (
            fixture("two_phase.toml"),
            "two_phase",
            &["array", "host", "precondition"],
        ),
        (fixture("trace.toml"), "trace", &["workload"]),
        (
            fixture("trace_volumes.toml"),
            "trace_volumes",
            &["workload"],
        ),
        (
            fixture("jobfile.toml"),
            "jobfile",
            &["host", "precondition"],
        ),
        (waflash.display().to_string(), "waflash", &["waflash"]),
        (fixture("ox_run.toml"), "ox_run", &["ox"]),
    ];
    // Every mutant first, then the runs spread over the machine's cores: each is its own
    // process, so one at a time would leave all but one core idle for the minute they take.
    let mut mutants = Vec::new();
    for (config_path, name, sections) in &cases {
        let base = reported_config(config_path, name);
        let mut leaves = Vec::new();
        numeric_leaves(&base, &mut Vec::new(), &mut leaves);
        leaves.retain(|p| sections.contains(&p[0].as_str()));
        assert!(
            !leaves.is_empty(),
            "{name}: no numeric field in {sections:?}"
        );
        for leaf in &leaves {
            let original = leaf_mut(&mut base.clone(), leaf).clone();
            for value in hostile(&original) {
                let mut mutant = base.clone();
                *leaf_mut(&mut mutant, leaf) = value.clone();
                let what = format!("{name}: {} = {value}", leaf.join("."));
                mutants.push((what, toml::to_string(&mutant).unwrap()));
            }
        }
    }
    let runs = mutants.len();
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let next = AtomicUsize::new(0);
    let (slow, broke) = (Mutex::new(Vec::new()), Mutex::new(Vec::new()));
    std::thread::scope(|scope| {
        for worker in 0..workers {
            let (mutants, next, slow, broke) = (&mutants, &next, &slow, &broke);
            scope.spawn(move || {
                let mutant_path = scratch(&format!("mutant-{worker}.toml"));
                while let Some((what, text)) = mutants.get(next.fetch_add(1, Ordering::Relaxed)) {
                    std::fs::write(&mutant_path, text).unwrap();
                    match run_mutant(&mutant_path) {
                        Verdict::Ended(_) => {}
                        Verdict::Slow => slow.lock().unwrap().push(what.clone()),
                        Verdict::Broke(why) => broke.lock().unwrap().push(format!("{what}: {why}")),
                    }
                }
            });
        }
    });
    let (mut slow, mut broke) = (slow.into_inner().unwrap(), broke.into_inner().unwrap());
    // Sorted, so that the report does not depend on which worker finished first.
    slow.sort();
    broke.sort();
    eprintln!(
        "{runs} mutated configurations: {} broke, {} still running after {DEADLINE:?}",
        broke.len(),
        slow.len()
    );
    for s in &slow {
        eprintln!("  slow: {s}");
    }
    assert!(broke.is_empty(), "{}", broke.join("\n"));
}

/// The same for an OX SSD's `[ox]` table, which `afa serve` takes. The server is pointed at a
/// socket path that cannot exist, so it ends right after building the device (or refusing
/// its configuration); nothing listens, so nothing needs a client.
#[test]
fn every_numeric_field_of_a_served_ox_ssd_set_to_a_hostile_value_is_refused_or_built() {
    let base: Value = toml::from_str(include_str!("fixtures/ox_serve.toml")).unwrap();
    let mut leaves = Vec::new();
    numeric_leaves(&base, &mut Vec::new(), &mut leaves);
    assert!(leaves.len() >= 10, "{leaves:?}");
    let path = scratch("ox-mutant.toml");
    let listen = format!("unix:{}", scratch("no-such-dir/ox.sock").display());
    // The unchanged configuration gets as far as the socket: the device was built.
    std::fs::write(&path, toml::to_string(&base).unwrap()).unwrap();
    let args = ["serve", path.to_str().unwrap(), "--listen", &listen];
    match run_afa(&args) {
        Verdict::Ended(stderr) => assert!(stderr.contains("cannot listen"), "{stderr}"),
        _ => panic!("the unchanged OX configuration did not end at the socket"),
    }
    let (mut broke, mut refused) = (Vec::new(), 0);
    for leaf in &leaves {
        let original = leaf_mut(&mut base.clone(), leaf).clone();
        for value in hostile(&original) {
            let mut mutant = base.clone();
            *leaf_mut(&mut mutant, leaf) = value.clone();
            std::fs::write(&path, toml::to_string(&mutant).unwrap()).unwrap();
            match run_afa(&args) {
                Verdict::Ended(stderr) if !stderr.contains("cannot listen") => refused += 1,
                Verdict::Ended(_) | Verdict::Slow => {}
                Verdict::Broke(why) => broke.push(format!("{} = {value}: {why}", leaf.join("."))),
            }
        }
    }
    assert!(broke.is_empty(), "{}", broke.join("\n"));
    // Most hostile values are refused before the socket; a test that refused none would
    // not be reaching the configuration at all.
    assert!(
        refused > leaves.len(),
        "only {refused} mutants were refused"
    );
}
