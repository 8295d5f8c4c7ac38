//! The SWAN reproductions, end to end through the binary.

mod common;
use common::{afa_json, fixture};

use std::path::PathBuf;

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("afa-swan-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn reproduce(id: &str, seed: &str) -> serde_json::Value {
    let json = temp(&format!("{id}-{seed}.json"));
    afa_json(&["reproduce", id, "--quick", "--seed", seed], &json)
}

/// A measured value: one with a paper figure, or context the paper gives none for.
fn value(v: &serde_json::Value, label: &str) -> f64 {
    v["measured"][label]
        .as_f64()
        .or_else(|| v["context"][label].as_f64())
        .unwrap_or_else(|| panic!("no measured {label}"))
}

/// Figure 4a and Fig. 5: RAID0 (the SSDs' own GC over all their space) last, Log-RAID0
/// (array-level cleaning of 1 MiB segments on every SSD at once, each stripe waiting for its
/// slowest SSD) next, SWAN0 (cleaning in a back-end group while the front-end writes) first,
/// as fast as its front-end allows and level, while Log-RAID0 swings.
///
/// The order rests on the SSDs differing from one another (the 850 PRO preset's factory bad
/// blocks, drawn per SSD): with identical SSDs Log-RAID0's eight outrun SWAN0's front-end of
/// two (docs/swan.md, fourth and fifth passes).
#[test]
fn fig4a_orders_raid0_log_raid0_swan0_and_keeps_swan0_level_while_log_raid0_swings() {
    let v = reproduce("swan-fig4a", "1");
    let (raid0, log, swan) = (
        value(&v, "raid0"),
        value(&v, "log-raid0"),
        value(&v, "swan0"),
    );
    assert!(raid0 < log && log < swan, "{raid0} / {log} / {swan}");
    // SWAN0 writes through a front-end of two 400 MB/s SSDs: it cannot beat them, and it must
    // not collapse either.
    assert!(swan > 0.75 * 800.0 && swan <= 800.0, "{swan}");
    // Fig. 5: Log-RAID0's throughput swings as cleaning stalls every SSD at once, SWAN0's
    // stays level (100 ms buckets after the array filled). Since the writers all wait for a
    // synchronous cleaning (2026-12-02) Log-RAID0's slowest bucket is no longer below half
    // its mean (the paper's 300 against 750 MB/s is a claim of the experiment, not of this
    // test), but its range is still several times SWAN0's: 0.63 to 0.81 of its mean on seeds
    // 1 to 3, against 0.17 to 0.19.
    let swan_low = value(&v, "swan0_low");
    assert!(swan_low > 0.85 * swan, "{swan_low} against {swan}");
    let log_range = (value(&v, "log-raid0_high") - value(&v, "log-raid0_low")) / log;
    let swan_range = (value(&v, "swan0_high") - swan_low) / swan;
    assert!(
        log_range > 2.0 * swan_range,
        "Log-RAID0 swings over {log_range:.2} of its mean, SWAN0 over {swan_range:.2}"
    );
}

/// Figure 4b: SWAN0 grows with its R-group width, within 10% of in proportion to it (the
/// paper's 400 / 800 / 1,200 MB/s), and stays above Log-RAID0 at every width. The paper's
/// fall of Log-RAID0 as SSDs are added is not reproduced (it still rises, less than SWAN0;
/// docs/swan.md), so the test does not ask for it.
#[test]
fn fig4b_keeps_swan0_above_log_raid0_at_every_width_and_growing() {
    let v = reproduce("swan-fig4b", "1");
    let swan_3 = value(&v, "swan0_3");
    for n in [3, 6, 9] {
        let (log, swan) = (
            value(&v, &format!("log-raid0_{n}")),
            value(&v, &format!("swan0_{n}")),
        );
        assert!(log < swan, "{n} SSDs: Log-RAID0 {log}, SWAN0 {swan}");
        let proportional = swan_3 * n as f64 / 3.0;
        assert!(
            swan >= 0.9 * proportional,
            "{n} SSDs: SWAN0 {swan} MB/s, under 0.9 of {proportional} (3 SSDs' {swan_3} × {n}/3)"
        );
    }
}

/// Figures 8–10 and Table 4: every paper label is measured and no other is, SWAN4's load phase beats the
/// read-modify-write RAIDs, Table 4's split covers every read, and a seed reproduces the
/// whole result bit for bit.
#[test]
fn fig8_measures_every_label_and_a_seed_reproduces_it() {
    let v = reproduce("swan-fig8", "1");
    let paper = v["paper"].as_object().unwrap();
    for label in paper.keys() {
        assert!(value(&v, label).is_finite(), "{label}");
    }
    // The paper's labels and the measured ones are the same; the rest is context.
    let measured = v["measured"].as_object().unwrap();
    assert!(paper.keys().eq(measured.keys()));
    for phase in ["load", "a", "b", "c", "d"] {
        for engine in ["raid4", "raid5", "log-raid4", "swan4"] {
            assert!(value(&v, &format!("{phase}_{engine}_mb_s")) > 0.0);
        }
    }
    assert!(value(&v, "load_swan4_over_raid4") > 4.0);
    assert!(value(&v, "load_swan4_over_raid5") > 4.0);
    let fractions: f64 = ["front_end", "back_end_idle", "back_end_gc"]
        .iter()
        .map(|k| value(&v, &format!("table4_{k}_read_fraction")))
        .sum();
    assert!((fractions - 1.0).abs() < 1e-9, "{fractions}");
    let again = reproduce("swan-fig8", "1");
    assert_eq!(v["measured"], again["measured"]);
    assert_eq!(v["context"], again["context"]);
    let other = reproduce("swan-fig8", "2");
    assert_ne!(v["measured"], other["measured"]);
}

/// Figures 8–10 as the paper measured them, with YCSB's client threads in a closed loop over
/// the block-level RocksDB model: every paper label is measured, SWAN4's load phase beats
/// the read-modify-write RAIDs by the paper's "over 4×", the model's load phase is bound by
/// compaction on both log-structured engines (their puts spend most of the time in RocksDB's
/// write stalls, docs/swan.md, sixth pass), and a seed reproduces the result.
#[test]
fn fig8_closed_loop_is_compaction_bound_in_the_load_phase() {
    let v = reproduce("swan-fig8-closed", "1");
    let paper = v["paper"].as_object().unwrap();
    let measured = v["measured"].as_object().unwrap();
    assert!(paper.keys().eq(measured.keys()));
    for phase in ["load", "a", "b", "c", "d"] {
        for engine in ["raid4", "raid5", "log-raid4", "swan4"] {
            assert!(value(&v, &format!("{phase}_{engine}_ops_s")) > 0.0);
        }
    }
    assert!(value(&v, "load_swan4_over_raid4") > 4.0);
    assert!(value(&v, "load_swan4_over_raid5") > 4.0);
    for engine in ["log-raid4", "swan4"] {
        let stalled = value(&v, &format!("load_{engine}_stalled_fraction"));
        assert!(stalled > 0.5, "{engine}: {stalled}");
    }
    // The load ratio against Log-RAID4 (0.19 at seed 1, the paper's 1.17) is measured and
    // reported but not pinned here: a test must not hold the model to a result that misses
    // the paper (docs/swan.md, "Sixth pass").
    let ratio = value(&v, "load_swan4_over_log-raid4");
    assert!(ratio.is_finite() && ratio > 0.0, "{ratio}");
    let fractions: f64 = ["front_end", "back_end_idle", "back_end_gc"]
        .iter()
        .map(|k| value(&v, &format!("table4_{k}_read_fraction")))
        .sum();
    assert!((fractions - 1.0).abs() < 1e-9, "{fractions}");
    let again = reproduce("swan-fig8-closed", "1");
    assert_eq!(v["measured"], again["measured"]);
    assert_eq!(v["context"], again["context"]);
}

/// Figure 12: at one offered load, SWAN0's SSDs copy no valid page in their own GC while
/// RAID0's copy many, SWAN0's member latency has the far shorter tail in both directions,
/// the run writes the CDF figure beside its JSON, and a seed reproduces it bit for bit.
#[test]
fn fig12_swan0_members_copy_nothing_and_have_the_shorter_tail() {
    let v = reproduce("swan-fig12", "1");
    assert_eq!(value(&v, "swan0_gc_pages_moved_per_100_written"), 0.0);
    assert!(value(&v, "raid0_gc_pages_moved_per_100_written") > 10.0);
    for op in ["read", "write"] {
        let (raid0, swan0) = (
            value(&v, &format!("raid0_{op}_p999_us")),
            value(&v, &format!("swan0_{op}_p999_us")),
        );
        assert!(
            10.0 * swan0 < raid0,
            "{op} p99.9: SWAN0 {swan0}, RAID0 {raid0}"
        );
    }
    // Both arrays carried the same offered load, which is what makes their latencies
    // comparable: their user throughput agrees within 2%.
    let (raid0, swan0) = (value(&v, "raid0_user_mb_s"), value(&v, "swan0_user_mb_s"));
    assert!((swan0 / raid0 - 1.0).abs() < 0.02, "{raid0} / {swan0} MB/s");
    for ext in ["svg", "png"] {
        let figure = temp(&format!("swan-fig12.latency_cdf.{ext}"));
        assert!(figure.exists(), "{}", figure.display());
    }
    let again = reproduce("swan-fig12", "1");
    assert_eq!(v["measured"], again["measured"]);
    assert_eq!(v["context"], again["context"]);
}

/// The SWAN fixture (RAID 5 groups, aging, a member failing mid-run, a verifying read of
/// everything) with 4 MiB segments of 4 KiB blocks, whose summaries take their last four
/// blocks, in `full` and `token` payload mode: every read checks out, the groups clean
/// segments, and the report says how many blocks a summary takes.
#[test]
fn the_fixture_runs_with_summaries_of_several_blocks() {
    for payload in ["full", "token"] {
        let json = temp(&format!("fixture-4mib-{payload}.json"));
        let v = afa_json(
            &[
                "run",
                &fixture("swan.toml"),
                "--quiet",
                "--set",
                "array.swan.segment_bytes=4194304",
                "--set",
                &format!("ssd.payload={payload}"),
            ],
            &json,
        );
        let a = &v["array"];
        assert_eq!(v["integrity"]["mismatches"], 0, "{payload}");
        assert!(v["integrity"]["reads_checked"].as_u64().unwrap() > 0);
        assert_eq!(
            (&a["segment_blocks"], &a["summary_blocks_per_segment"]),
            (&serde_json::json!(1024), &serde_json::json!(4)),
            "{payload}"
        );
        assert!(a["segments_cleaned"].as_u64().unwrap() > 0, "{payload}");
        assert!(a["degraded_reads"].as_u64().unwrap() > 0, "{payload}");
    }
}
