//! Property tests of both codecs through the public API: round trips through erasure and
//! reconstruction, per-row encoding, read-modify-write updates and error handling.

use afa_parity::{codec, ErasureCodec, ParityError, ReedSolomon, XorCodec};
use proptest::prelude::*;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The codecs under test for (k, m): whatever `codec` picks, plus Reed–Solomon for m = 1 so
/// that its single XOR row is exercised as well as `XorCodec`.
fn codecs_for(k: usize, m: usize) -> Vec<Box<dyn ErasureCodec>> {
    let mut codecs = vec![codec(k, m).expect("parameters are in range")];
    if m == 1 {
        codecs.push(Box::new(
            ReedSolomon::new(k, m).expect("parameters are in range"),
        ));
    }
    codecs
}

fn random_shards(rng: &mut ChaCha8Rng, count: usize, len_bytes: usize) -> Vec<Vec<u8>> {
    (0..count)
        .map(|_| {
            let mut shard = vec![0u8; len_bytes];
            rng.fill(&mut shard[..]);
            shard
        })
        .collect()
}

/// Encodes `data` and returns the m parity shards.
fn encode(codec: &dyn ErasureCodec, data: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let len_bytes = data[0].len();
    let data_refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let mut parity = vec![vec![0u8; len_bytes]; codec.parity_shards()];
    let mut parity_refs: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
    codec
        .encode(&data_refs, &mut parity_refs)
        .expect("shards are well formed");
    parity
}

/// Erases the shards at `lost` (filling them with garbage, which reconstruction must ignore)
/// and reconstructs.
fn erase_and_reconstruct(
    codec: &dyn ErasureCodec,
    shards: &mut [Vec<u8>],
    lost: &[usize],
) -> Result<(), ParityError> {
    let mut present = vec![true; shards.len()];
    for &index in lost {
        present[index] = false;
        shards[index].fill(0xa5);
    }
    let mut shard_refs: Vec<&mut [u8]> = shards.iter_mut().map(Vec::as_mut_slice).collect();
    codec.reconstruct(&mut shard_refs, &present)
}

/// Random stripe parameters: k data shards, m parity shards, a shard length (often not a
/// multiple of eight) and a seed for the data and the erasure pattern.
fn stripe() -> impl Strategy<Value = (usize, usize, usize, u64)> {
    (1usize..=12, 1usize..=4, 1usize..=300, any::<u64>())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    #[test]
    fn reconstruct_recovers_any_m_erasures((k, m, len_bytes, seed) in stripe()) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for codec in codecs_for(k, m) {
            let data = random_shards(&mut rng, k, len_bytes);
            let mut original = data.clone();
            original.extend(encode(codec.as_ref(), &data));
            let erasures = rng.gen_range(0..=m);
            let mut indices: Vec<usize> = (0..k + m).collect();
            indices.shuffle(&mut rng);
            let lost = &indices[..erasures];
            let mut shards = original.clone();
            erase_and_reconstruct(codec.as_ref(), &mut shards, lost)
                .map_err(|e| TestCaseError::fail(format!("{codec:?} lost {lost:?}: {e}")))?;
            prop_assert_eq!(&shards, &original, "{:?} lost {:?}", codec, lost);
        }
    }

    #[test]
    fn encode_row_matches_encode((k, m, len_bytes, seed) in stripe()) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for codec in codecs_for(k, m) {
            let data = random_shards(&mut rng, k, len_bytes);
            let parity = encode(codec.as_ref(), &data);
            let data_refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
            for (row, expected) in parity.iter().enumerate() {
                let mut out = vec![0x5au8; len_bytes];
                codec.encode_row(row, &data_refs, &mut out).expect("valid row");
                prop_assert_eq!(&out, expected, "{:?} row {}", codec, row);
            }
        }
    }

    #[test]
    fn update_parity_matches_reencoding((k, m, len_bytes, seed) in stripe()) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for codec in codecs_for(k, m) {
            let mut data = random_shards(&mut rng, k, len_bytes);
            let mut parity = encode(codec.as_ref(), &data);
            let index = rng.gen_range(0..k);
            let new = random_shards(&mut rng, 1, len_bytes).remove(0);
            for (row, parity_row) in parity.iter_mut().enumerate() {
                codec
                    .update_parity(row, index, &data[index], &new, parity_row)
                    .expect("valid update");
            }
            data[index] = new;
            prop_assert_eq!(&parity, &encode(codec.as_ref(), &data), "{:?} index {}", codec, index);
        }
    }

    #[test]
    fn too_many_erasures_is_an_error((k, m, len_bytes, seed) in stripe()) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for codec in codecs_for(k, m) {
            let data = random_shards(&mut rng, k, len_bytes);
            let mut shards = data.clone();
            shards.extend(encode(codec.as_ref(), &data));
            let mut indices: Vec<usize> = (0..k + m).collect();
            indices.shuffle(&mut rng);
            // k ≥ 1, so there are always at least m + 1 shards to lose.
            let erasures = m + 1;
            let result = erase_and_reconstruct(codec.as_ref(), &mut shards, &indices[..erasures]);
            prop_assert_eq!(result, Err(ParityError::TooManyErasures { missing: erasures, max: m }));
        }
    }
}

#[test]
fn constructors_reject_bad_parameters() {
    assert_eq!(
        XorCodec::new(0).unwrap_err(),
        ParityError::InvalidDataShards { k: 0 }
    );
    assert_eq!(
        ReedSolomon::new(0, 2).unwrap_err(),
        ParityError::InvalidDataShards { k: 0 }
    );
    assert_eq!(
        ReedSolomon::new(3, 0).unwrap_err(),
        ParityError::InvalidParityShards { m: 0 }
    );
    assert_eq!(
        codec(3, 0).unwrap_err(),
        ParityError::InvalidParityShards { m: 0 }
    );
    assert_eq!(
        ReedSolomon::new(250, 6).unwrap_err(),
        ParityError::TooManyShards { k: 250, m: 6 }
    );
    assert!(ReedSolomon::new(251, 4).is_ok());
    assert!(ReedSolomon::new(1, 254).is_ok());
    let message = ReedSolomon::new(250, 6).unwrap_err().to_string();
    assert!(message.contains("256"), "{message}");
    assert!(XorCodec::new(1000).is_ok(), "XOR has no field-size limit");
}

#[test]
fn malformed_calls_return_errors_not_panics() {
    for codec in [codec(3, 1).unwrap(), codec(3, 2).unwrap()] {
        let m = codec.parity_shards();
        let a = [1u8; 8];
        let short = [1u8; 7];
        let mut out = [0u8; 8];
        let mut out2 = [0u8; 8];
        assert!(matches!(
            codec.encode(&[&a, &a], &mut [&mut out]),
            Err(ParityError::ShardCount {
                expected: 3,
                actual: 2,
                ..
            })
        ));
        assert_eq!(
            codec.encode_row(0, &[&a, &short, &a], &mut out),
            Err(ParityError::LengthMismatch {
                what: "data shard",
                index: 1,
                expected_bytes: 8,
                actual_bytes: 7,
            })
        );
        assert_eq!(
            codec.encode_row(m, &[&a, &a, &a], &mut out),
            Err(ParityError::BadIndex {
                what: "parity row",
                index: m,
                limit: m
            })
        );
        assert_eq!(
            codec.update_parity(0, 3, &a, &a, &mut out),
            Err(ParityError::BadIndex {
                what: "data shard",
                index: 3,
                limit: 3
            })
        );
        assert!(matches!(
            codec.update_parity(0, 0, &a, &short, &mut out),
            Err(ParityError::LengthMismatch {
                actual_bytes: 7,
                ..
            })
        ));
        let (mut s0, mut s1, mut s2) = ([0u8; 8], [0u8; 8], [0u8; 8]);
        let mut s3 = [0u8; 7];
        let mut shards: Vec<&mut [u8]> = vec![&mut s0, &mut s1, &mut s2, &mut s3];
        if m == 2 {
            shards.push(&mut out2);
        }
        let present = vec![true; 3 + m];
        assert!(matches!(
            codec.reconstruct(&mut shards, &present),
            Err(ParityError::LengthMismatch {
                index: 3,
                actual_bytes: 7,
                ..
            })
        ));
        assert!(matches!(
            codec.reconstruct(&mut shards, &present[1..]),
            Err(ParityError::ShardCount {
                what: "presence flags",
                ..
            })
        ));
        // Error messages name the offending value.
        let message = codec
            .encode_row(9, &[&a, &a, &a], &mut out)
            .unwrap_err()
            .to_string();
        assert!(message.contains('9'), "{message}");
    }
}

#[test]
fn zero_length_shards_are_fine() {
    for codec in [codec(2, 1).unwrap(), codec(2, 3).unwrap()] {
        let mut shards = vec![Vec::new(); 2 + codec.parity_shards()];
        let mut present = vec![true; shards.len()];
        present[0] = false;
        let mut refs: Vec<&mut [u8]> = shards.iter_mut().map(Vec::as_mut_slice).collect();
        assert_eq!(codec.reconstruct(&mut refs, &present), Ok(()));
    }
}

#[test]
fn xor_helpers_on_long_and_odd_lengths() {
    // Longer than one cache block and not a multiple of eight, with more than one group of
    // sources, to cover the block loop, the group split and the byte tail.
    let len_bytes = 3 * 4096 + 5;
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let sources = random_shards(&mut rng, 9, len_bytes);
    let refs: Vec<&[u8]> = sources.iter().map(Vec::as_slice).collect();
    let mut dst = vec![0xffu8; len_bytes];
    afa_parity::xor_into(&mut dst, &refs);
    let mut expected = vec![0u8; len_bytes];
    for source in &sources {
        afa_parity::xor_accumulate(&mut expected, source);
    }
    assert_eq!(dst, expected);
    for (at, &byte) in dst.iter().enumerate() {
        assert_eq!(
            byte,
            sources.iter().fold(0, |acc, s| acc ^ s[at]),
            "byte {at}"
        );
    }
    afa_parity::xor_into(&mut dst, &[]);
    assert!(dst.iter().all(|&b| b == 0), "XOR of no sources is zero");
}
