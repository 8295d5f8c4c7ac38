//! End-to-end tests of `afa sweep`: the grid's points, their JSON lines, independence of the
//! number of workers, single points for Slurm tasks, the Slurm script and grid errors.

mod common;
use common::{afa, fixture};

use std::path::PathBuf;

fn temp_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("afa-sweep-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The JSON lines of a successful sweep, without the host timings (which vary).
fn sweep_lines(args: &[&str]) -> Vec<serde_json::Value> {
    let out = afa(args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .map(|line| {
            let mut value: serde_json::Value = serde_json::from_str(line).unwrap();
            value.as_object_mut().unwrap().remove("wall_s");
            value["summary"]
                .as_object_mut()
                .expect("every point has a summary")
                .remove("host_time_s");
            value
        })
        .collect()
}

#[test]
fn a_grid_runs_every_point_in_order_whatever_the_number_of_workers() {
    let grid = fixture("sweep_grid.toml");
    let parallel = sweep_lines(&["sweep", &grid, "--jobs", "2"]);
    assert_eq!(parallel.len(), 8);
    for (index, line) in parallel.iter().enumerate() {
        assert_eq!(line["point"], index);
        assert!(line.get("error").is_none(), "{line}");
        assert_eq!(line["summary"]["mismatches"], 0.0);
        assert!(
            line["summary"]["write_iops"].as_f64().unwrap() > 0.0,
            "{line}"
        );
        assert!(
            line["summary"]["write_p99_us"].as_f64().unwrap() > 0.0,
            "{line}"
        );
        assert!(line["summary"]["waf"].as_f64().unwrap() >= 1.0, "{line}");
    }
    // The last axis varies fastest.
    assert_eq!(parallel[0]["params"]["job.bs"], "4k");
    assert_eq!(parallel[4]["params"]["job.bs"], "16k");
    assert_eq!(parallel[2]["params"]["ssd.over_provisioning"], 0.28);
    assert_eq!(parallel[1]["params"]["host"], "kernel, 2 threads");
    // The job's block size reaches the simulation: 16 KiB writes move more bytes each.
    let mb_per_io = |line: &serde_json::Value| {
        line["summary"]["mb_s"].as_f64().unwrap() / line["summary"]["iops"].as_f64().unwrap()
    };
    assert!((mb_per_io(&parallel[4]) / mb_per_io(&parallel[0]) - 4.0).abs() < 1e-6);
    // Points are independent simulations: one worker gives the same lines.
    assert_eq!(sweep_lines(&["sweep", &grid, "--jobs", "1"]), parallel);
    // So does a single point, as a Slurm array task runs it.
    assert_eq!(
        sweep_lines(&["sweep", &grid, "--point", "5"]),
        vec![parallel[5].clone()]
    );
}

#[test]
fn list_and_slurm_script_describe_the_points_without_running_them() {
    let grid = fixture("sweep_grid.toml");
    let out = afa(&["sweep", &grid, "--list"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed = text(&out.stdout);
    assert_eq!(listed.lines().count(), 8);
    assert!(!listed.contains("summary"), "{listed}");
    let script = temp_dir().join("sweep.sbatch");
    let out = afa(&[
        "sweep",
        &grid,
        "--emit",
        "slurm",
        "--out",
        script.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let script = std::fs::read_to_string(script).unwrap();
    assert!(script.starts_with("#!/bin/bash\n"), "{script}");
    assert!(script.contains("#SBATCH --array=0-7\n"), "{script}");
    assert!(
        script.contains("--point \"$SLURM_ARRAY_TASK_ID\""),
        "{script}"
    );
    assert!(script.contains(&grid), "{script}");
}

#[test]
fn grid_errors_are_reported_before_anything_runs() {
    let dir = temp_dir();
    let base = fixture("sweep_base.toml");
    let cases = [
        (
            "unknown_key.toml",
            format!("base = \"{base}\"\n[[axis]]\nkey = \"ssd.no_such_key\"\nvalues = [1]\n"),
            "point 0",
        ),
        (
            "missing_base.toml",
            "base = \"nowhere.toml\"\n".to_string(),
            "nowhere.toml",
        ),
        (
            "empty_axis.toml",
            format!("base = \"{base}\"\n[[axis]]\nkey = \"seed\"\nvalues = []\n"),
            "no values",
        ),
        (
            "scalar_without_key.toml",
            format!("base = \"{base}\"\n[[axis]]\nname = \"x\"\nvalues = [1]\n"),
            "must be tables",
        ),
        (
            "bad_job_option.toml",
            format!("base = \"{base}\"\n[[axis]]\nkey = \"job.iodeph\"\nvalues = [4]\n"),
            "iodeph",
        ),
        (
            "typo.toml",
            format!("base = \"{base}\"\naxes = 3\n"),
            "axes",
        ),
    ];
    for (name, grid, expected) in cases {
        let path = dir.join(name);
        std::fs::write(&path, grid).unwrap();
        let out = afa(&["sweep", path.to_str().unwrap()]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains(expected), "{name}: {err}");
        assert!(!err.contains("panicked"), "{name}: {err}");
        assert!(out.stdout.is_empty(), "{name}: nothing runs");
    }
    let out = afa(&["sweep", &fixture("sweep_grid.toml"), "--point", "8"]);
    assert!(
        text(&out.stderr).contains("8 points"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_base_axis_switches_configurations_and_keeps_their_relative_paths() {
    let path = temp_dir().join("bases.toml");
    // trace.toml names its trace relative to its own directory, which is not the grid's.
    std::fs::write(
        &path,
        format!(
            "base = \"{}\"\n[[axis]]\nkey = \"base\"\nvalues = [\"{}\", \"{}\"]\n\
             labels = [\"fio\", \"trace\"]\n",
            fixture("sweep_base.toml"),
            fixture("sweep_base.toml"),
            fixture("trace.toml")
        ),
    )
    .unwrap();
    let lines = sweep_lines(&["sweep", path.to_str().unwrap()]);
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[1]["params"]["base"], "trace");
    // The trace fixture holds 3 reads and 2 writes; the fio base only writes.
    assert_eq!(lines[0]["summary"]["read_iops"], 0.0);
    assert!(lines[1]["summary"]["read_iops"].as_f64().unwrap() > 0.0);
}
