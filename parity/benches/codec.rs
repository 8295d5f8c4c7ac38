//! Micro-benchmarks of the erasure codes on 64 KiB chunks (in cache): XOR 4+1 encode, and
//! Reed–Solomon 6+2 encode and two-erasure decode. `afa bench parity` measures the same
//! kernels as one figure per code; this is the criterion view with confidence intervals.
//! Run with `cargo bench -p afa-parity`.

use std::hint::black_box;

use afa_parity::codec;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

const CHUNK_BYTES: usize = 64 * 1024;

/// `count` chunks of deterministic, non-repeating bytes.
fn chunks(count: usize) -> Vec<Vec<u8>> {
    (0..count)
        .map(|c| {
            (0..CHUNK_BYTES)
                .map(|i| (i.wrapping_mul(31) ^ c.wrapping_mul(131) ^ (i >> 8)) as u8)
                .collect()
        })
        .collect()
}

fn encode(c: &mut Criterion, k: usize, m: usize) {
    let code = codec(k, m).expect("a valid shape");
    let data = chunks(k);
    let mut parity = vec![vec![0u8; CHUNK_BYTES]; m];
    let mut group = c.benchmark_group("encode");
    group.throughput(Throughput::Bytes((k * CHUNK_BYTES) as u64));
    group.bench_function(format!("{k}+{m}_64KiB"), |b| {
        let sources: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        b.iter(|| {
            let mut outs: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
            code.encode(black_box(&sources), &mut outs)
                .expect("encode succeeds");
        });
    });
    group.finish();
}

fn xor_encode(c: &mut Criterion) {
    encode(c, 4, 1);
}

fn rs_encode(c: &mut Criterion) {
    encode(c, 6, 2);
}

fn rs_decode_two_erasures(c: &mut Criterion) {
    let (k, m) = (6, 2);
    let code = codec(k, m).expect("a valid shape");
    let mut shards = chunks(k);
    shards.extend(vec![vec![0u8; CHUNK_BYTES]; m]);
    {
        let (data, parity) = shards.split_at_mut(k);
        let sources: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let mut outs: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
        code.encode(&sources, &mut outs).expect("encode succeeds");
    }
    // Two data chunks lost: the decode inverts the code's submatrix and rebuilds both.
    let mut present = vec![true; k + m];
    present[1] = false;
    present[4] = false;
    let mut group = c.benchmark_group("decode");
    group.throughput(Throughput::Bytes((k * CHUNK_BYTES) as u64));
    group.bench_function("6+2_two_data_chunks_lost_64KiB", |b| {
        b.iter(|| {
            let mut views: Vec<&mut [u8]> = shards.iter_mut().map(Vec::as_mut_slice).collect();
            code.reconstruct(&mut views, black_box(&present))
                .expect("two erasures are recoverable");
        });
    });
    group.finish();
}

criterion_group!(benches, xor_encode, rs_encode, rs_decode_two_erasures);
criterion_main!(benches);
