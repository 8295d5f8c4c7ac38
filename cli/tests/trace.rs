//! End-to-end tests of `afa trace stats|synth|convert` and of replaying the new trace formats
//! through `afa run`.

mod common;
use common::{afa, fixture};

use std::path::PathBuf;

fn workload_fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../workload/tests/fixtures")
        .join(name)
        .display()
        .to_string()
}

fn temp(name: &str) -> String {
    let dir = std::env::temp_dir().join(format!("afa-trace-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name).display().to_string()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn json_stats(path: &str, against: &str) -> serde_json::Value {
    let out = afa(&["trace", "stats", path, "--against", against, "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn synthesized_traces_match_table2_within_five_percent_in_every_format() {
    let rows = ["proxy0", "prn", "src2", "CFS", "DAP", "webmail"];
    // Six rows, so the first six formats; whole-second Tencent timestamps would move the
    // short synthesized traces' rates (their stats have tests of their own).
    let formats = ["msr", "blkparse", "fiu", "iolog", "ascii", "spc"];
    for (index, row) in rows.iter().enumerate() {
        // About 20 000 requests per row keeps the test fast; counts and data scale.
        let out = afa(&["trace", "synth", "--like", row, "--scale", "0.002"]);
        assert!(out.status.success(), "{row}: {}", text(&out.stderr));
        let format = formats[index % formats.len()];
        let path = temp(&format!("{row}.{format}"));
        let out = afa(&[
            "trace", "synth", "--like", row, "--scale", "0.002", "--format", format, "--out", &path,
        ]);
        assert!(out.status.success(), "{row}: {}", text(&out.stderr));
        let stats = json_stats(&path, row);
        let ratio = &stats["ratio"];
        for column in [
            "write_kops",
            "read_kops",
            "write_avg_kib",
            "read_avg_kib",
            "written_gib",
            "read_gib",
        ] {
            let value = ratio[column].as_f64().unwrap();
            assert!(
                (value - 1.0).abs() <= 0.05,
                "{row} as {format}: {column} ratio {value}"
            );
        }
        assert!((stats["share"].as_f64().unwrap() - 0.002).abs() < 1e-5);
    }
}

#[test]
fn a_seed_reproduces_a_synthesized_trace_byte_for_byte() {
    let synth = |seed: &str| {
        let out = afa(&[
            "trace", "synth", "--like", "DAP", "--scale", "0.001", "--seed", seed,
        ]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        out.stdout
    };
    let first = synth("9");
    assert!(!first.is_empty());
    assert_eq!(first, synth("9"));
    assert_ne!(first, synth("10"));
}

#[test]
fn stats_prints_table2_columns_and_guesses_formats() {
    for (name, writes, reads) in [
        ("fiu_small.txt", 7, 5),
        ("iolog_v3.log", 4, 2),
        ("ascii_small.trace", 5, 5),
        ("msr_small.csv", 12, 8),
        ("blkparse_small.txt", 4, 3),
        ("spc_small.csv", 7, 3),
        ("alibaba_small.csv", 4, 4),
        ("tencent_small.csv", 4, 4),
    ] {
        let out = afa(&["trace", "stats", &workload_fixture(name), "--json"]);
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
        let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(stats["stats"]["write_count"], writes, "{name}");
        assert_eq!(stats["stats"]["read_count"], reads, "{name}");
    }
    let out = afa(&["trace", "stats", &workload_fixture("fiu_small.txt")]);
    let table = text(&out.stdout);
    for column in [
        "wr_kops",
        "rd_kops",
        "wr_avg_kib",
        "rd_avg_kib",
        "wr_gib",
        "rd_gib",
    ] {
        assert!(table.contains(column), "{table}");
    }
}

#[test]
fn a_corrupt_line_is_reported_with_file_and_line_in_every_format() {
    for (format, first, second, bad) in [
        (
            "msr",
            "1,h,0,Read,0,512,1",
            "1,h,0,Read,0,512,1",
            "1,h,0,Read,0,x,1",
        ),
        (
            "blkparse",
            "8,0 0 1 0.1 1 Q W 0 + 8 [p]",
            "8,0 0 1 0.1 1 Q W 0 + 8 [p]",
            "8,0 0 1 0.1 1 Q W 0 + x [p]",
        ),
        (
            "fiu",
            "1 2 p 3 8 W 6 0 ab",
            "1 2 p 3 8 W 6 0 ab",
            "1 2 p 3 8 Q 6 0 ab",
        ),
        (
            "iolog",
            "fio version 3 iolog",
            "1 f write 0 512",
            "5 f write 0",
        ),
        ("ascii", "0 0 0 8 1", "0 0 0 8 1", "0 0 0 8 7"),
        ("spc", "0,0,512,r,0.0", "0,0,512,r,0.0", "0,0,512,x,0.0"),
        ("alibaba", "0,R,0,512,1", "0,R,0,512,1", "0,R,0,x,1"),
        ("tencent", "1,0,8,1,0", "1,0,8,1,0", "1,0,8,7,0"),
    ] {
        let path = temp(&format!("corrupt.{format}"));
        std::fs::write(&path, format!("{first}\n{second}\n{bad}\n")).unwrap();
        let out = afa(&["trace", "stats", &path, "--format", format]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{format}: {err}");
        assert!(err.contains(&format!("{path} line 3")), "{format}: {err}");
        assert!(!err.contains("panicked"), "{format}: {err}");
    }
}

#[test]
fn convert_scales_time_remaps_volumes_and_wraps() {
    let out_path = temp("converted.trace");
    let out = afa(&[
        "trace",
        "convert",
        &workload_fixture("ascii_small.trace"),
        &out_path,
        "--to",
        "ascii",
        "--time-scale",
        "2",
        "--volumes",
        "1,0",
        "--wrap-bytes",
        "4194304",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines: Vec<String> = std::fs::read_to_string(&out_path)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    // Volume 2 is dropped; volume 1 comes first and volume 0 one stride after it, the stride
    // being the largest end offset of the kept volumes (sector 5000256) rounded up to 1 MiB,
    // 2442 MiB; everything is then wrapped into 4 MiB (8192 sectors) on device 0.
    assert_eq!(lines.len(), 9, "{lines:?}");
    assert_eq!(
        lines[0], "0 0 5120 8 0",
        "sector 1024 + 2442 MiB, modulo 4 MiB"
    );
    assert_eq!(
        lines[3], "8400 0 4096 64 1",
        "77824 mod 8192 sectors, time doubled"
    );
}

#[test]
fn run_replays_fiu_volumes_side_by_side() {
    let json = temp("volumes.json");
    let out = afa(&[
        "run",
        &fixture("trace_volumes.toml"),
        "--quiet",
        "--json",
        &json,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["write"]["ios"], 7);
    assert_eq!(report["read"]["ios"], 5);
    assert_eq!(report["integrity"]["mismatches"], 0);
}

/// `bytes` gzipped, as one member.
fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

/// Gzipped traces are read as their text, whatever their name, for `afa trace` and for a
/// run's `[workload.trace]`: the same statistics, guessed formats included; two gzip members
/// joined with `cat` read as one trace; a gzip file cut short and a tar archive are refused
/// with a message that says so.
#[test]
fn gzipped_traces_read_as_their_text() {
    let stats_of = |path: &str| {
        let out = afa(&["trace", "stats", path, "--json"]);
        assert!(out.status.success(), "{path}: {}", text(&out.stderr));
        let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        stats["stats"].clone()
    };
    for name in [
        "msr_small.csv",
        "tencent_small.csv",
        "spc_small.csv",
        "iolog_v3.log",
    ] {
        let plain = std::fs::read(workload_fixture(name)).unwrap();
        let zipped = temp(&format!("{name}.gz"));
        std::fs::write(&zipped, gzip(&plain)).unwrap();
        assert_eq!(
            stats_of(&zipped),
            stats_of(&workload_fixture(name)),
            "{name}"
        );
    }
    // Two members: the reader goes on past the first, as gunzip does.
    let plain = std::fs::read(workload_fixture("msr_small.csv")).unwrap();
    let twice = temp("twice.csv.gz");
    std::fs::write(&twice, [gzip(&plain), gzip(&plain)].concat()).unwrap();
    let once = stats_of(&workload_fixture("msr_small.csv"));
    let both = stats_of(&twice);
    assert_eq!(
        both["write_count"],
        2 * once["write_count"].as_u64().unwrap()
    );
    // Cut short: an error naming the file, never a panic or a partial trace taken as whole.
    let whole = gzip(&plain);
    let cut = temp("cut.csv.gz");
    std::fs::write(&cut, &whole[..whole.len() - 12]).unwrap();
    let out = afa(&["trace", "stats", &cut, "--format", "msr"]);
    let err = text(&out.stderr);
    assert!(
        !out.status.success(),
        "a truncated gzip file was read whole"
    );
    assert!(err.contains(&cut) && !err.contains("panicked"), "{err}");
    // A tar archive, gzipped or not, is refused by name.
    let mut tar = vec![0u8; 1024];
    tar[..8].copy_from_slice(b"trace.cs");
    tar[257..263].copy_from_slice(b"ustar\0");
    for (name, bytes) in [("hour.tar", tar.clone()), ("hour.tgz", gzip(&tar))] {
        let path = temp(name);
        std::fs::write(&path, bytes).unwrap();
        let out = afa(&["trace", "stats", &path]);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{name}");
        assert!(err.contains("tar archive"), "{name}: {err}");
    }
    // `convert` to a `.gz` output writes it gzipped, and it reads back to the same trace.
    let converted = temp("converted.spc.gz");
    let out = afa(&[
        "trace",
        "convert",
        &workload_fixture("msr_small.csv"),
        &converted,
        "--to",
        "spc",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(std::fs::read(&converted)
        .unwrap()
        .starts_with(&[0x1f, 0x8b]));
    assert_eq!(stats_of(&converted), once);
    // A run replays a gzipped trace as it replays the text.
    let fiu = temp("fiu_small.txt.gz");
    std::fs::write(
        &fiu,
        gzip(&std::fs::read(workload_fixture("fiu_small.txt")).unwrap()),
    )
    .unwrap();
    let config = std::fs::read_to_string(fixture("trace_volumes.toml"))
        .unwrap()
        .replace(
            "path = \"../../../workload/tests/fixtures/fiu_small.txt\"",
            &format!("path = {fiu:?}"),
        );
    assert!(config.contains(".gz"), "the fixture's trace path moved");
    let toml = temp("gz_volumes.toml");
    std::fs::write(&toml, config).unwrap();
    let json = temp("gz_volumes.json");
    let out = afa(&["run", &toml, "--quiet", "--json", &json]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["write"]["ios"], 7);
    assert_eq!(report["read"]["ios"], 5);
    assert_eq!(report["integrity"]["mismatches"], 0);
}
