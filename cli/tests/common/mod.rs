//! What every end-to-end test of the `afa` binary needs: running it and finding fixtures.
//! Each test binary includes this module and uses part of it, hence the allowance.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Runs the `afa` binary built for these tests with `args`.
pub fn afa(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_afa"))
        .args(args)
        .output()
        .expect("the afa binary runs")
}

/// Runs `afa` with `args` and `--json JSON`, insists it succeeds, and returns the JSON it
/// wrote.
pub fn afa_json(args: &[&str], json: &Path) -> serde_json::Value {
    let mut all = args.to_vec();
    all.extend(["--json", json.to_str().expect("a UTF-8 path")]);
    let out = afa(&all);
    assert!(
        out.status.success(),
        "afa {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap()
}

/// The path of `cli/tests/fixtures/NAME`.
pub fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
        .display()
        .to_string()
}

/// Whether a program is installed. Under CI=true a missing program is a failure; elsewhere
/// the test is skipped with a note.
pub fn have(program: &str, check: &str) -> bool {
    let found = Command::new("sh")
        .arg("-c")
        .arg(check)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !found {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("{program} is not installed, and CI=true requires it (see .ci/run)");
        }
        eprintln!("skipping: {program} is not installed (install it to run this test)");
    }
    found
}

/// The tests of `afa serve` as a process (serve.rs, serve_ox.rs, serve_two_phase.rs).
pub mod serve;
