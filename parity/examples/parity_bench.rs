//! Prints the parity benchmark report as JSON.
//!
//! Usage: `cargo run --release --example parity_bench [chunk_bytes] [iterations]`, defaulting
//! to 64 KiB chunks and 20 000 stripes.

fn main() {
    let mut args = std::env::args().skip(1);
    let chunk_bytes = args.next().and_then(|a| a.parse().ok()).unwrap_or(65536);
    let iterations = args.next().and_then(|a| a.parse().ok()).unwrap_or(20_000);
    println!("{}", afa_parity::bench::run(chunk_bytes, iterations));
}
