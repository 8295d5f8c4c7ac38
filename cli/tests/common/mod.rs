//! What every end-to-end test of the `afa` binary needs: running it and finding fixtures.
//! Each test binary includes this module and uses part of it, hence the allowance.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// Runs the `afa` binary built for these tests with `args`.
pub fn afa(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_afa"))
        .args(args)
        .output()
        .expect("the afa binary runs")
}

/// The path of `cli/tests/fixtures/NAME`.
pub fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
        .display()
        .to_string()
}
