//! `[precondition]` with `[array]`: the fill is written through the engine before the
//! measured run, which then reads it back through the oracle and reports only itself.

mod common;
use common::{afa, fixture};

use std::path::PathBuf;

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("afa-precondition-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// A fixture's configuration with its scheduled failures removed and its workload replaced
/// by `precondition` and a random-read job over the whole volume.
fn with_fill(name: &str, precondition: &str) -> String {
    let text = std::fs::read_to_string(fixture(name)).unwrap();
    let head = &text[..text
        .find("[workload]")
        .expect("fixtures end with [workload]")];
    let head: String = head
        .lines()
        .filter(|l| !l.starts_with("failures"))
        .map(|l| format!("{l}\n"))
        .collect();
    format!(
        "{head}[precondition]\n{precondition}\n\n[workload]\njob = \"\"\"\n[reads]\n\
         rw=randread\nbs=4k\niodepth=16\nio_size=16m\n\"\"\"\n"
    )
}

/// Runs `afa run` on `text`; returns the exit status, stderr and the JSON when it ran.
fn run(name: &str, text: &str) -> (bool, String, Option<serde_json::Value>) {
    let config = temp(name);
    std::fs::write(&config, text).unwrap();
    let json = temp(&format!("{name}.json"));
    let _ = std::fs::remove_file(&json);
    let out = afa(&[
        "run",
        config.to_str().unwrap(),
        "--quiet",
        "--json",
        json.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let v = std::fs::read_to_string(&json)
        .ok()
        .map(|s| serde_json::from_str(&s).unwrap());
    (out.status.success(), stderr, v)
}

const RANDOM_FILL: &str =
    "fill_fraction = 0.8\npattern = \"random-simulated\"\noverwrite_rounds = 0.5";

/// Every read of the filled range must return the fill's version-0 token: an engine that
/// was not filled returns zeroes there, and the oracle counts each as a mismatch.
#[test]
fn every_array_engine_reads_back_its_preconditioned_fill() {
    for name in [
        "raid5.toml",
        "lograid.toml",
        "two_phase.toml",
        "scalaafa.toml",
    ] {
        let (ok, stderr, v) = run(name, &with_fill(name, RANDOM_FILL));
        assert!(ok, "{name}: {stderr}");
        let v = v.unwrap();
        assert_eq!(v["integrity"]["mismatches"], 0, "{name}");
        assert_eq!(v["read"]["ios"], 4096, "{name}: {}", v["read"]);
        assert!(
            v["integrity"]["reads_checked"].as_u64().unwrap() >= 4096,
            "{name}: {}",
            v["integrity"]
        );
        // The fill is not the run's: the engine saw no user write.
        let array = &v["array"];
        let user = array["log"]["user_sectors"]
            .as_u64()
            .or(array["user_write_sectors"].as_u64())
            .unwrap();
        assert_eq!(user, 0, "{name}: {array}");
        assert_eq!(v["write"]["bytes"], 0, "{name}");
    }
}

/// With RAID 5 nothing but the run's own reads reaches the members, so their counters and
/// timelines show the read-only run and none of the fill's writes.
#[test]
fn members_report_the_measured_run_only() {
    let (ok, stderr, v) = run(
        "raid5-members.toml",
        &with_fill("raid5.toml", "fill_fraction = 0.5"),
    );
    assert!(ok, "{stderr}");
    let v = v.unwrap();
    for m in v["members"].as_array().unwrap() {
        assert_eq!(m["write_bytes"], 0, "{m}");
        assert!(m["read_bytes"].as_u64().unwrap() > 0, "{m}");
        let timeline = m["timeline"].as_array().unwrap();
        let written: f64 = timeline
            .iter()
            .map(|p| p["write_mb_s"].as_f64().unwrap())
            .sum();
        assert_eq!(written, 0.0, "{m}");
        assert!(!timeline.is_empty());
    }
    assert_eq!(v["nand"]["page_programs"], 0, "{}", v["nand"]);
}

#[test]
fn a_preconditioned_array_run_is_deterministic() {
    let text = with_fill("raid5.toml", RANDOM_FILL);
    let runs: Vec<serde_json::Value> = ["det-a.toml", "det-b.toml"]
        .iter()
        .map(|n| {
            let (ok, stderr, v) = run(n, &text);
            assert!(ok, "{stderr}");
            let mut v = v.unwrap();
            v.as_object_mut().unwrap().remove("host_time_s");
            v
        })
        .collect();
    assert_eq!(runs[0], runs[1]);
}

#[test]
fn array_preconditioning_refuses_what_it_cannot_build() {
    let random = with_fill("raid5.toml", "fill_fraction = 0.5\npattern = \"random\"");
    let (ok, stderr, _) = run("refuse-random.toml", &random);
    assert!(!ok);
    assert!(
        stderr.contains("precondition.pattern = \"random\"") && stderr.contains("random-simulated"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    let swan = with_fill("swan.toml", "fill_fraction = 0.5");
    let (ok, stderr, _) = run("refuse-swan.toml", &swan);
    assert!(!ok);
    assert!(stderr.contains("age_fraction"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
