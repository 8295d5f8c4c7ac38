//! `afa run` on a WAFLASH SSD and the WAFLASH reproductions, end to end through the binary.

mod common;
use common::afa;

use std::path::PathBuf;

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("afa-waflash-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn read_json(path: &PathBuf) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

const CONFIG: &str = r#"
seed = 3
[waflash.ssd]
buffer_policy = "pc-lru"
ftl = "multi-version"
compaction = true
buffer_bytes = 2097152
[waflash.filebench]
personality = "fileserver"
io_bytes = 5120
requests = 4000
scale = 0.005
seed = 3
"#;

#[test]
fn a_waflash_run_under_media_faults_keeps_every_write_and_counts_the_faults() {
    // Failing programs and erases while 8 KiB random writes cover 800 MiB of the default
    // 1 GiB medium, at rates far above a real drive's so that a short run meets some.
    let config = temp("faults.toml");
    std::fs::write(
        &config,
        r#"
seed = 5
[waflash.ssd]
buffer_bytes = 2097152
[waflash.ssd.faults]
program_fail_probability = 0.001
erase_fail_probability = 0.01
[workload]
job = """
[w]
rw=randrw
rwmixread=30
bs=8k
size=800m
"""
"#,
    )
    .unwrap();
    let json = temp("faults.json");
    let out = afa(&[
        "run",
        config.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = read_json(&json);
    assert_eq!(v["integrity"]["mismatches"], 0);
    let ftl = &v["waflash"]["ftl"];
    assert!(ftl["program_failures"].as_u64().unwrap() > 0, "{ftl}");
    assert!(ftl["blocks_retired"].as_u64().unwrap() > 0, "{ftl}");
    assert!(stdout.contains("media faults: "), "{stdout}");
}

/// Runs `afa reproduce ID --quick --json` and returns the JSON, after checking that it has
/// the same labels in its paper and measured maps.
fn reproduce_quick(id: &str) -> serde_json::Value {
    let json = temp(&format!("{id}.json"));
    let out = afa(&["reproduce", id, "--quick", "--json", json.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = read_json(&json);
    let paper: Vec<&String> = v["paper"].as_object().unwrap().keys().collect();
    let measured: Vec<&String> = v["measured"].as_object().unwrap().keys().collect();
    assert_eq!(paper, measured, "{id}");
    v
}

#[test]
fn run_with_a_waflash_table_checks_integrity_and_writes_json() {
    let config = temp("waflash.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let json = temp("waflash.json");
    let out = afa(&[
        "run",
        config.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = read_json(&json);
    assert_eq!(v["integrity"]["mismatches"], 0);
    assert!(v["integrity"]["reads_checked"].as_u64().unwrap() > 0);
    assert!(v["waflash"]["device"]["unaligned_writes"].as_u64().unwrap() > 0);
    // The run report is the one every `afa run` writes: the flash counts are the WAFLASH
    // SSD's, its GC is in `gc`, and the plotting tools take it.
    assert_eq!(
        v["nand"]["page_programs"], v["waflash"]["flash_programs"],
        "{}",
        v["nand"]
    );
    assert_eq!(v["gc"]["runs"], v["waflash"]["ftl"]["gc_runs"]);
    let plots = temp("waflash-plots");
    let out = afa(&[
        "plot",
        json.to_str().unwrap(),
        "-o",
        plots.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(plots.join("latency_cdf.svg").exists());
    // Bad input is a named error, not a panic.
    let bad = temp("bad.toml");
    std::fs::write(
        &bad,
        CONFIG.replace("ftl = \"multi-version\"", "ftl = \"page-rmw\""),
    )
    .unwrap();
    let out = afa(&["run", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("compaction"));
}

#[test]
fn waflash_fig10_writes_the_same_labels_in_both_maps() {
    let v = reproduce_quick("waflash-fig10");
    assert_eq!(v["id"], "waflash-fig10");
    let labels: Vec<&String> = v["measured"].as_object().unwrap().keys().collect();
    assert_eq!(labels, ["mca", "pc-lru"]);
    // The issue's ranking, at the quick scale: PC-LRU's latency reduction is larger than
    // MCA's (0.026 against 0.020 when written; at full scale the two are level,
    // docs/waflash.md).
    let gain = |label: &str| v["measured"][label].as_f64().unwrap();
    assert!(gain("pc-lru") > gain("mca"), "{}", v["measured"]);
    // The whole design (PC-LRU over MV-FTL with compaction, which Fig. 10's caption names)
    // is in the context, and gains more than the buffer policy alone (0.263 against 0.026
    // when written).
    let waflash = v["context"]["waflash"].as_f64().unwrap();
    assert!(waflash > gain("pc-lru"), "{waflash} {}", v["measured"]);
}

/// Fig. 1: the more writes are unaligned, the longer the read and write tails, and a seed
/// reproduces the run bit for bit.
#[test]
fn waflash_fig1_tails_grow_with_the_unaligned_share() {
    let v = reproduce_quick("waflash-fig1");
    let p95 = |op: &str, percent: u64| {
        v["context"][format!("{op}_p95_us_{percent}")]
            .as_f64()
            .unwrap_or_else(|| panic!("{op} {percent}% missing"))
    };
    for op in ["read", "write"] {
        assert!(p95(op, 0) < p95(op, 50), "{op}: {}", v["context"]);
        assert!(p95(op, 50) < p95(op, 100), "{op}: {}", v["context"]);
    }
    assert!(v["measured"]["write_p95_x_at_50"].as_f64().unwrap() > 1.0);
    let again = reproduce_quick("waflash-fig1");
    assert_eq!(v["measured"], again["measured"]);
    assert_eq!(v["context"], again["context"]);
}

/// Fig. 11 on the Cosmos+-like board: WAFLASH's mean latency is lower at every request
/// size, most at the smallest (1 KiB: every write is a partial page), and the best
/// reduction is the one label.
#[test]
fn waflash_fig11_gains_most_on_the_smallest_writes_and_at_every_size() {
    let v = reproduce_quick("waflash-fig11");
    let context = &v["context"];
    let reduction = |kib: u64| {
        context[format!("randomwrite_latency_reduction_{kib}kib")]
            .as_f64()
            .unwrap_or_else(|| panic!("{kib} KiB missing"))
    };
    let best = v["measured"]["randomwrite"].as_f64().unwrap();
    assert_eq!(best, reduction(1), "{context}");
    for kib in [3, 5, 7, 9] {
        assert!(0.0 < reduction(kib) && reduction(kib) < best, "{context}");
    }
    assert_eq!(context["randomwrite_best_io_kib"], 1.0);
}

#[test]
fn waflash_fig7_reports_the_side_results_of_section_v_b() {
    let v = reproduce_quick("waflash-fig7");
    let context = v["context"].as_object().unwrap();
    let get = |label: &str| {
        context[label]
            .as_f64()
            .unwrap_or_else(|| panic!("{label} missing"))
    };
    // The issue's checks on fileserver: WAFLASH keeps more partial pages in the buffer,
    // writes fewer partial pages to flash, compaction saves programs, and reads are no
    // slower than on the baseline.
    assert!(get("fileserver_partial_pages_to_ftl_change") < 0.0);
    assert!(
        get("fileserver_buffer_partial_fraction_waflash")
            > get("fileserver_buffer_partial_fraction_baseline")
    );
    assert!(get("fileserver_compaction_program_change") < 0.0);
    assert!(get("fileserver_read_latency_mean_change") <= 0.0);
    // Random write's tail is a claim the entry evaluates, not a property of the code: since
    // versions count the logical pages still unwritten (docs/waflash.md, "Versions"), the
    // quick run's p99 is 9.7% longer than the baseline's and the claim misses (README).
    assert!(get("randomwrite_p99_latency_change").is_finite());
}

#[test]
fn a_waflash_table_cannot_be_combined_with_an_array() {
    let config = temp("waflash-array.toml");
    std::fs::write(
        &config,
        format!("{CONFIG}[array]\nlevel = \"raid5\"\nmembers = 3\n"),
    )
    .unwrap();
    let out = afa(&["run", config.to_str().unwrap(), "--quiet"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot be combined with [array]"),
        "{stderr}"
    );
}

#[test]
fn run_with_vssims_whole_buffer_drain_checks_integrity_and_counts_the_drain() {
    let whole = CONFIG.replace(
        "buffer_policy = \"pc-lru\"\nftl = \"multi-version\"\ncompaction = true",
        "buffer_policy = \"fifo\"\nfifo_drain = \"whole\"\nftl = \"page-rmw\"\ncompaction = false",
    );
    assert_ne!(whole, CONFIG, "the replacement must apply");
    let config = temp("waflash-drain.toml");
    std::fs::write(&config, &whole).unwrap();
    let json = temp("waflash-drain.json");
    let out = afa(&[
        "run",
        config.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = read_json(&json);
    assert_eq!(v["integrity"]["mismatches"], 0);
    assert!(v["integrity"]["reads_checked"].as_u64().unwrap() > 0);
    let device = &v["waflash"]["device"];
    let drained = device["drain_requests"].as_u64().unwrap();
    assert!(drained > 0, "nothing was drained: {device}");
    assert!(device["drain_requests_ahead"].as_u64().unwrap() <= drained);
    // The drain belongs to the FIFO buffer; with another policy it is a named error.
    let bad = temp("bad-drain.toml");
    std::fs::write(
        &bad,
        whole.replace("buffer_policy = \"fifo\"", "buffer_policy = \"lru\""),
    )
    .unwrap();
    let out = afa(&["run", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("fifo_drain"));
}
