//! Runs one scaled YCSB phase on each interface and prints throughput and the Table 3 row:
//! `cargo run --release -p afa-ox --example ox_probe -- RECORDS OPS CACHE read|write [conventional|convbuffer=MIB|nodevgc|nohostgc|nondurable|nockpt|gcstart=X|gcchannels=N|erase=NS|erasesuspend|serial|syncreads|oneflush|writeback|devwriteback|timeline|gcpage=NS|mapcache=N|ratio=X|firstcome|readthreads=N]`,
//! or `-- lat` for the 1 MiB flush latency of each interface, write-through and write-back.

use afa_ox::kv::{ConventionalSsd, Interface, KvConfig, KvStore};
use afa_ox::reproduce::{load_and_run, Scale, Table3Row};
use afa_ox::ycsb::Workload;

fn flush_latency() {
    use afa_nand::sector_token;
    use afa_ox::{BatchBuffer, OxConfig, OxController, Request};
    for (write_back, block) in [(false, false), (false, true), (true, false), (true, true)] {
        let mut cfg = OxConfig::default();
        cfg.write_cache.write_back = write_back;
        let mut c = OxController::format(&cfg, 1).unwrap();
        let mut t = 0;
        let mut total = 0;
        let mut first = 0;
        for i in 0..64u64 {
            let req = if block {
                Request::WriteBlocks {
                    lba: i * 256,
                    tokens: (0..256).map(|k| sector_token(i * 256 + k, 1)).collect(),
                }
            } else {
                let pages: Vec<(u64, u64)> = (0..255)
                    .map(|k| (i * 256 + k, sector_token(i * 256 + k, 1)))
                    .collect();
                Request::FlushBatch(BatchBuffer::new(&pages, 4096).unwrap())
            };
            let id = c.submit(t, req).unwrap();
            let d = c.run_until_complete(id).unwrap();
            if i == 0 {
                first = d.done_ns - t;
            }
            total += d.done_ns - t;
            t = d.done_ns;
        }
        println!(
            "write_back={write_back} block={block}: first 1 MiB flush {} us, mean of 64 back to back {} us, {:?}",
            first / 1000,
            total / 64 / 1000,
            c.stats()
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("lat") {
        flush_latency();
        return;
    }
    let records = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let ops = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let cache: f64 = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(0.2);
    let w = match args.get(4).map(String::as_str) {
        Some("read") => Workload::ReadHeavy,
        _ => Workload::WriteHeavy,
    };
    let scale = Scale { records, ops };
    for i in [Interface::Batch, Interface::Block] {
        let start = std::time::Instant::now();
        let ratio = args
            .iter()
            .skip(5)
            .find_map(|f| f.strip_prefix("ratio=").and_then(|r| r.parse().ok()))
            .unwrap_or(afa_ox::kv::DEVICE_TO_DATA_SET_RATIO);
        let mut cfg = if i == Interface::Block && args.iter().any(|a| a == "nondurable") {
            KvConfig::non_durable(scale.records, cache, scale.ops)
        } else {
            KvConfig::scaled_with_ratio(scale.records, i, cache, ratio)
        };
        for flag in args.iter().skip(5) {
            match flag.as_str() {
                "nodevgc" => cfg.device.gc.enabled = false,
                "nohostgc" => {
                    cfg.host_gc_start_used_fraction = 0.99;
                    cfg.host_gc_stop_used_fraction = 0.98;
                }
                "serial" => cfg.device.costs.block_packet_contexts = 1,
                "syncreads" => cfg.max_outstanding_reads = 1,
                "oneflush" => cfg.max_outstanding_flushes = 1,
                "writeback" => cfg.write_back = true,
                "devwriteback" => cfg.device.write_cache.write_back = true,
                f if f.starts_with("readthreads=") => {
                    cfg.device.costs.read_lookup_threads =
                        f["readthreads=".len()..].parse().unwrap_or(1)
                }
                f if f.starts_with("gcpage=") => {
                    cfg.costs.gc_page_cpu_ns = f["gcpage=".len()..].parse().unwrap_or(1_200)
                }
                f if f.starts_with("mapcache=") => {
                    cfg.device.map_cache_pages = f["mapcache=".len()..].parse().unwrap_or(4)
                }
                f if f.starts_with("gcstart=") => {
                    let start: f64 = f["gcstart=".len()..].parse().unwrap_or(0.5);
                    cfg.device.gc.start_used_fraction = start;
                    cfg.device.gc.stop_used_fraction = start - 0.05;
                    cfg.host_gc_start_used_fraction = start;
                    cfg.host_gc_stop_used_fraction = start - 0.05;
                }
                f if f.starts_with("gcchannels=") => {
                    cfg.device.gc.max_gc_channels = f["gcchannels=".len()..].parse().unwrap_or(4)
                }
                f if f.starts_with("erase=") => {
                    let erase_ns = f["erase=".len()..].parse().unwrap_or(3_000_000);
                    let t = &mut cfg.device.timing;
                    for cell in [&mut t.slc, &mut t.mlc, &mut t.tlc] {
                        cell.erase_ns = erase_ns;
                    }
                }
                "erasesuspend" => cfg.device.timing.erase_suspend = true,
                "firstcome" => cfg.device.timing.scheduling = afa_nand::Scheduling::FirstCome,
                "nockpt" => {
                    cfg.device.checkpoint.enabled = false;
                    cfg.host_checkpoint_interval_ns = 0;
                }
                _ => {}
            }
        }
        let conventional = i == Interface::Block && args.iter().any(|a| a == "conventional");
        let run = if conventional {
            let mut ssd = ConventionalSsd::config_like(&cfg.device);
            if let Some(mib) = args.iter().find_map(|f| {
                f.strip_prefix("convbuffer=")
                    .and_then(|m| m.parse::<u64>().ok())
            }) {
                ssd.write_buffer.capacity_bytes = mib << 20;
            }
            KvStore::on_conventional(cfg, ssd, 42).and_then(|kv| load_and_run(kv, w, scale.ops, 42))
        } else {
            KvStore::new(cfg, 42).and_then(|kv| load_and_run(kv, w, scale.ops, 42))
        };
        match &run {
            Ok(r) => {
                let t = Table3Row::of(r, i);
                println!(
                    "{i:?}: {:.0} ops/s in {:.1} s host; GC {:.3} of host CPU, throughput variation {:.3}; mismatches {}; read amp {:.3} write amp {:.3} GC overhead {:.3}; {t:?}\n  host {:?}\n  device {:?}",
                    r.ops_per_s,
                    start.elapsed().as_secs_f64(),
                    r.gc_cpu_share(),
                    r.throughput_variation().unwrap_or(0.0),
                    r.host.mismatches,
                    t.read_amplification(),
                    t.write_amplification(),
                    t.gc_overhead(),
                    r.host,
                    r.device
                );
            }
            Err(e) => println!("{i:?}: error {e}"),
        }
        if let (Ok(r), true) = (&run, args.iter().any(|a| a == "timeline")) {
            println!("  ops per 100 ms: {:?}", r.ops_per_interval);
        }
    }
}
