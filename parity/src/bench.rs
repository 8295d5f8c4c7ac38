//! Throughput measurement for the CLI's benchmark command (not a test): XOR 4+1 encode,
//! Reed–Solomon 6+2 encode and Reed–Solomon 6+2 decode with two data shards lost.
//!
//! Throughput is reported in GB/s with GB = 10^9 bytes of *data* processed, i.e. k × chunk per
//! stripe, so encode and decode figures are directly comparable with each other.

use std::hint::black_box;
use std::time::Instant;

use serde_json::{json, Value};

use crate::{ErasureCodec, ParityError, ReedSolomon, XorCodec};

/// Runs the three measurements on `chunk_bytes`-byte shards, `iterations` stripes each after a
/// warm-up of a tenth as many (at least one), and returns
/// `{"chunk_bytes", "iterations", "xor_4+1_encode_gb_s", "rs_6+2_encode_gb_s",
/// "rs_6+2_decode_2_erasures_gb_s", "decode_verified"}`. Zero arguments are raised to one so
/// that every figure is finite. A codec error (which would be a bug) is reported under
/// `"error"` with the affected figure set to null.
pub fn run(chunk_bytes: usize, iterations: usize) -> Value {
    let chunk_bytes = chunk_bytes.max(1);
    let iterations = iterations.max(1);
    let warmup_iterations = (iterations / 10).max(1);
    let mut errors: Vec<String> = Vec::new();
    let mut record = |result: Result<f64, ParityError>| match result {
        Ok(gb_s) => Some(gb_s),
        Err(error) => {
            errors.push(error.to_string());
            None
        }
    };

    let xor_encode_gb_s = record(encode_gb_s(
        &XorCodec::new(4),
        chunk_bytes,
        iterations,
        warmup_iterations,
    ));
    let rs_encode_gb_s = record(encode_gb_s(
        &ReedSolomon::new(6, 2),
        chunk_bytes,
        iterations,
        warmup_iterations,
    ));
    let decode = decode_gb_s(chunk_bytes, iterations, warmup_iterations);
    let decode_verified = decode.as_ref().is_ok_and(|&(_, verified)| verified);
    let rs_decode_gb_s = record(decode.map(|(gb_s, _)| gb_s));

    let mut report = json!({
        "chunk_bytes": chunk_bytes,
        "iterations": iterations,
        "xor_4+1_encode_gb_s": xor_encode_gb_s,
        "rs_6+2_encode_gb_s": rs_encode_gb_s,
        "rs_6+2_decode_2_erasures_gb_s": rs_decode_gb_s,
        "decode_verified": decode_verified,
    });
    if !errors.is_empty() {
        report["error"] = json!(errors.join("; "));
    }
    report
}

/// Times `iterations` full-stripe encodes after `warmup_iterations` untimed ones.
fn encode_gb_s<C: ErasureCodec>(
    codec: &Result<C, ParityError>,
    chunk_bytes: usize,
    iterations: usize,
    warmup_iterations: usize,
) -> Result<f64, ParityError> {
    let codec = codec.as_ref().map_err(Clone::clone)?;
    let data = random_shards(codec.data_shards(), chunk_bytes, 1);
    let data_refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let mut parity = vec![vec![0u8; chunk_bytes]; codec.parity_shards()];
    let mut encode = || -> Result<(), ParityError> {
        let mut parity_refs: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
        codec.encode(black_box(&data_refs), &mut parity_refs)?;
        black_box(&parity_refs);
        Ok(())
    };
    for _ in 0..warmup_iterations {
        encode()?;
    }
    let start = Instant::now();
    for _ in 0..iterations {
        encode()?;
    }
    Ok(gb_per_s(
        codec.data_shards() * chunk_bytes * iterations,
        start,
    ))
}

/// Times `iterations` 6+2 reconstructions of data shards 0 and 1 and reports whether the last
/// one reproduced the original data.
fn decode_gb_s(
    chunk_bytes: usize,
    iterations: usize,
    warmup_iterations: usize,
) -> Result<(f64, bool), ParityError> {
    let codec = ReedSolomon::new(6, 2)?;
    let total = codec.data_shards() + codec.parity_shards();
    let original = random_shards(codec.data_shards(), chunk_bytes, 2);
    let mut shards = original.clone();
    shards.resize(total, vec![0u8; chunk_bytes]);
    {
        let (data, parity) = shards.split_at_mut(codec.data_shards());
        let data_refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let mut parity_refs: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
        codec.encode(&data_refs, &mut parity_refs)?;
    }
    let mut present = vec![true; total];
    present[0] = false;
    present[1] = false;
    let mut decode = || -> Result<(), ParityError> {
        let mut shard_refs: Vec<&mut [u8]> = shards.iter_mut().map(Vec::as_mut_slice).collect();
        codec.reconstruct(black_box(&mut shard_refs), &present)?;
        black_box(&shard_refs);
        Ok(())
    };
    for _ in 0..warmup_iterations {
        decode()?;
    }
    let start = Instant::now();
    for _ in 0..iterations {
        decode()?;
    }
    let gb_s = gb_per_s(codec.data_shards() * chunk_bytes * iterations, start);
    Ok((gb_s, shards[..codec.data_shards()] == original[..]))
}

/// Converts bytes processed since `start` into GB/s (10^9 bytes per second).
fn gb_per_s(bytes: usize, start: Instant) -> f64 {
    // Clamp to a nanosecond so that an absurdly fast run still yields a finite figure.
    let seconds = start.elapsed().as_secs_f64().max(1e-9);
    bytes as f64 / seconds / 1e9
}

/// Deterministic pseudo-random shards from a xorshift generator, so the benchmark needs no
/// random-number crate and runs on identical data every time.
fn random_shards(count: usize, chunk_bytes: usize, seed: u64) -> Vec<Vec<u8>> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..count)
        .map(|_| {
            (0..chunk_bytes)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state.to_le_bytes()[0]
                })
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_has_all_fields_and_decodes_correctly() {
        let report = run(1000, 2);
        assert_eq!(report["chunk_bytes"], 1000);
        for key in [
            "xor_4+1_encode_gb_s",
            "rs_6+2_encode_gb_s",
            "rs_6+2_decode_2_erasures_gb_s",
        ] {
            assert!(report[key].as_f64().is_some_and(|v| v > 0.0), "{key}");
        }
        assert_eq!(report["decode_verified"], true);
        assert!(report.get("error").is_none());
        // Degenerate arguments are raised rather than producing NaN or infinity.
        assert!(run(0, 0)["xor_4+1_encode_gb_s"].as_f64().is_some());
    }
}
