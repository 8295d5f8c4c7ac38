//! The paper's measurements at the scaled size. They take minutes in a release build, so
//! they are ignored by default:
//!
//! ```sh
//! cargo test --release -p afa-ox --test measurements -- --ignored --nocapture
//! ```

use afa_ox::kv::Interface;
use afa_ox::reproduce;
use afa_ox::reproduce::{measure, Scale, Table3Row};
use afa_ox::ycsb::Workload;

fn show(id: &str) {
    let r = reproduce(id, true, 42).unwrap();
    println!("{id} ({})", r.unit);
    for (label, paper) in &r.paper {
        let m = r.measured[label];
        println!(
            "  {label:24} paper {paper:8.3}  measured {m:8.3}  ratio {:6.3}",
            m / paper
        );
    }
}

#[test]
#[ignore]
fn ox_fig11() {
    show("ox-fig11");
}

#[test]
#[ignore]
fn ox_fig12() {
    show("ox-fig12");
}

#[test]
#[ignore]
fn ox_fig13() {
    show("ox-fig13");
}

#[test]
#[ignore]
fn ox_table4() {
    show("ox-table4");
}

#[test]
#[ignore]
fn ox_fig14() {
    show("ox-fig14");
}

#[test]
#[ignore]
fn ox_fig15() {
    show("ox-fig15");
}

/// Throughput and Table 3 rows for every cache size and both workloads.
#[test]
#[ignore]
fn ycsb_throughput_and_table3_at_20_50_80() {
    for w in [Workload::ReadHeavy, Workload::WriteHeavy] {
        for cache in [0.2, 0.5, 0.8] {
            let batch = measure(Interface::Batch, cache, w, Scale::QUICK, 42).unwrap();
            let block = measure(Interface::Block, cache, w, Scale::QUICK, 42).unwrap();
            assert_eq!(batch.host.mismatches + block.host.mismatches, 0);
            println!(
                "{w:?} cache {:.0}%: batch {:.0} ops/s, block {:.0} ops/s, ratio {:.2}",
                cache * 100.0,
                batch.ops_per_s,
                block.ops_per_s,
                batch.ops_per_s / block.ops_per_s
            );
            for (name, run, i) in [
                ("batch", &batch, Interface::Batch),
                ("block", &block, Interface::Block),
            ] {
                let t = Table3Row::of(run, i);
                println!(
                    "  {name}: user read {:.1} MB, user write {:.1} MB, GC read {:.1} MB, GC write {:.1} MB, reclaimed {:.1} MB (device GC {:.1}/{:.1}/{:.1} MB); read amp {:.3}, write amp {:.3}, GC overhead {:.3}; host cpu op {:.0} ms io {:.0} ms gc {:.0} ms ckpt {:.0} ms; wait flush {:.0} ms read {:.0} ms gc {:.0} ms",
                    t.user_read_bytes as f64 / 1e6,
                    t.user_write_bytes as f64 / 1e6,
                    t.gc_read_bytes as f64 / 1e6,
                    t.gc_write_bytes as f64 / 1e6,
                    t.reclaimed_bytes as f64 / 1e6,
                    t.device_gc_read_bytes as f64 / 1e6,
                    t.device_gc_write_bytes as f64 / 1e6,
                    t.device_reclaimed_bytes as f64 / 1e6,
                    t.read_amplification(),
                    t.write_amplification(),
                    t.gc_overhead(),
                    run.host.cpu_op_ns as f64 / 1e6,
                    run.host.cpu_io_ns as f64 / 1e6,
                    run.host.cpu_gc_ns as f64 / 1e6,
                    run.host.cpu_ckpt_ns as f64 / 1e6,
                    run.host.wait_flush_ns as f64 / 1e6,
                    run.host.wait_read_ns as f64 / 1e6,
                    run.host.wait_gc_ns as f64 / 1e6,
                );
            }
        }
    }
}

/// The host's recovery after a power loss on each interface, at the quick scale (100 K
/// records, 20% cache, after 20 K write-heavy operations): what the block host's LLAMA
/// checkpoint and log replay cost against the batch host reading its pages back by LPID.
#[test]
#[ignore]
fn kv_recovery() {
    use afa_ox::kv::{KvConfig, KvStore};
    for interface in [Interface::Batch, Interface::Block] {
        let mut cfg = KvConfig::scaled(100_000, interface, 0.2);
        cfg.page_images = true;
        let mut kv = KvStore::new(cfg, 42).unwrap();
        kv.load().unwrap();
        kv.run(Workload::WriteHeavy, 20_000, 7).unwrap();
        let now = kv.now_ns();
        let (back, r) = KvStore::recover(kv.power_loss(now), now).unwrap();
        println!(
            "{interface:?}: device recovery {:.1} ms, host recovery {:.1} ms; host read \
             {} commands, {} pages; checkpoint {:?}, {} segment headers, {} flushes replayed, \
             {} skipped as cleaned; {} pages, {} records",
            r.device_recovery_ns as f64 / 1e6,
            r.host_recovery_ns as f64 / 1e6,
            r.read_commands,
            r.pages_read,
            r.checkpoint_seq,
            r.segments_scanned,
            r.flushes_replayed,
            r.flushes_skipped_cleaned,
            back.pages(),
            r.records,
        );
    }
}
