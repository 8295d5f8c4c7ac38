//! XOR parity: the fused XOR kernels shared with the Reed–Solomon code, the public
//! [`xor_into`] / [`xor_accumulate`] helpers and the m = 1 codec.

use crate::combine::{BLOCK_BYTES, MAX_GROUP_SOURCES};
use crate::{check_index, check_len, check_reconstruct_args, check_slices};
use crate::{ErasureCodec, ParityError};

/// Bytes per machine word that the kernels load and XOR at once.
const WORD_BYTES: usize = 8;

/// Computes `dst = s0 ^ s1 ^ ...`.
///
/// The sources are combined in groups of up to four per pass over a cache-sized block of
/// `dst`, so `dst` is read and written once per group rather than once per source, and a block
/// of `dst` stays in L1 across groups. With no sources `dst` is zeroed, the XOR of nothing.
///
/// # Panics
///
/// Panics if a source's length differs from `dst.len()`: the signature leaves no room for an
/// error, and silently combining a prefix would corrupt parity. The codecs check lengths and
/// return [`ParityError::LengthMismatch`] before they get here.
pub fn xor_into(dst: &mut [u8], sources: &[&[u8]]) {
    for (index, source) in sources.iter().enumerate() {
        assert_eq!(
            source.len(),
            dst.len(),
            "xor_into: source {index} is {} bytes long but dst is {} bytes",
            source.len(),
            dst.len()
        );
    }
    if sources.is_empty() {
        dst.fill(0);
        return;
    }
    let len_bytes = dst.len();
    let mut start = 0;
    while start < len_bytes {
        let end = (start + BLOCK_BYTES).min(len_bytes);
        let block = &mut dst[start..end];
        for (group_index, group) in sources.chunks(MAX_GROUP_SOURCES).enumerate() {
            xor_group(block, group, start, group_index == 0);
        }
        start = end;
    }
}

/// Computes `dst ^= src`, the read-modify-write parity step.
///
/// # Panics
///
/// Panics if `src.len() != dst.len()`, for the same reason as [`xor_into`].
pub fn xor_accumulate(dst: &mut [u8], src: &[u8]) {
    assert_eq!(
        src.len(),
        dst.len(),
        "xor_accumulate: src is {} bytes long but dst is {} bytes",
        src.len(),
        dst.len()
    );
    xor_kernel::<1, false>(dst, [src]);
}

/// XORs the bytes `offset..offset + dst.len()` of one to four sources into `dst`, or assigns
/// their XOR to `dst` when `assign` is set. Callers guarantee the sources are long enough.
pub(crate) fn xor_group(dst: &mut [u8], group: &[&[u8]], offset: usize, assign: bool) {
    let range = offset..offset + dst.len();
    match (group, assign) {
        ([a], true) => xor_kernel::<1, true>(dst, [&a[range]]),
        ([a], false) => xor_kernel::<1, false>(dst, [&a[range]]),
        ([a, b], true) => xor_kernel::<2, true>(dst, [&a[range.clone()], &b[range]]),
        ([a, b], false) => xor_kernel::<2, false>(dst, [&a[range.clone()], &b[range]]),
        ([a, b, c], true) => {
            xor_kernel::<3, true>(dst, [&a[range.clone()], &b[range.clone()], &c[range]])
        }
        ([a, b, c], false) => {
            xor_kernel::<3, false>(dst, [&a[range.clone()], &b[range.clone()], &c[range]])
        }
        ([a, b, c, d], true) => xor_kernel::<4, true>(
            dst,
            [
                &a[range.clone()],
                &b[range.clone()],
                &c[range.clone()],
                &d[range],
            ],
        ),
        ([a, b, c, d], false) => xor_kernel::<4, false>(
            dst,
            [
                &a[range.clone()],
                &b[range.clone()],
                &c[range.clone()],
                &d[range],
            ],
        ),
        // Callers split sources with `chunks(MAX_GROUP_SOURCES)`, so other sizes never occur;
        // still, an empty group is the sum of nothing, and larger ones are split, not dropped.
        ([], true) => dst.fill(0),
        ([], false) => {}
        (_, _) => {
            for (i, chunk) in group.chunks(MAX_GROUP_SOURCES).enumerate() {
                xor_group(dst, chunk, offset, assign && i == 0);
            }
        }
    }
}

/// The fused XOR loop: one pass over `dst` for all `N` sources, on whole u64 words with a
/// bytewise tail. `N` and `ASSIGN` are compile-time constants so that the inner loop over the
/// sources unrolls completely and the word loop vectorises.
fn xor_kernel<const N: usize, const ASSIGN: bool>(dst: &mut [u8], sources: [&[u8]; N]) {
    let len_bytes = dst.len();
    // Re-slicing to exactly `len_bytes` lets the compiler drop the per-access bounds checks.
    let sources = sources.map(|s| &s[..len_bytes]);
    let word_bytes = len_bytes - len_bytes % WORD_BYTES;
    let (dst_words, dst_tail) = dst.split_at_mut(word_bytes);
    for (word_index, dst_word) in dst_words.chunks_exact_mut(WORD_BYTES).enumerate() {
        let at = word_index * WORD_BYTES;
        let mut acc = if ASSIGN { 0 } else { load_word(dst_word) };
        for source in &sources {
            acc ^= load_word(&source[at..at + WORD_BYTES]);
        }
        dst_word.copy_from_slice(&acc.to_ne_bytes());
    }
    for (tail_index, dst_byte) in dst_tail.iter_mut().enumerate() {
        let at = word_bytes + tail_index;
        let mut acc = if ASSIGN { 0 } else { *dst_byte };
        for source in &sources {
            acc ^= source[at];
        }
        *dst_byte = acc;
    }
}

/// Reads eight bytes as a native-endian word; endianness is irrelevant to XOR.
#[inline(always)]
fn load_word(bytes: &[u8]) -> u64 {
    let mut word = [0u8; WORD_BYTES];
    word.copy_from_slice(bytes);
    u64::from_ne_bytes(word)
}

/// Single-parity XOR code (RAID 4/5): the parity shard is the XOR of the k data shards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XorCodec {
    data_shards: usize,
}

impl XorCodec {
    /// Creates a k+1 XOR code. Any k ≥ 1 is accepted, since XOR has no field-size limit.
    pub fn new(k: usize) -> Result<Self, ParityError> {
        if k == 0 {
            return Err(ParityError::InvalidDataShards { k });
        }
        Ok(Self { data_shards: k })
    }
}

impl ErasureCodec for XorCodec {
    fn data_shards(&self) -> usize {
        self.data_shards
    }

    fn parity_shards(&self) -> usize {
        1
    }

    fn encode(&self, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<(), ParityError> {
        let len_bytes = data.first().map_or(0, |d| d.len());
        check_slices("data shard", data, self.data_shards, len_bytes)?;
        check_slices("parity shard", parity, 1, len_bytes)?;
        if let [out] = parity {
            xor_into(out, data);
        }
        Ok(())
    }

    fn encode_row(&self, row: usize, data: &[&[u8]], out: &mut [u8]) -> Result<(), ParityError> {
        check_index("parity row", row, 1)?;
        check_slices("data shard", data, self.data_shards, out.len())?;
        xor_into(out, data);
        Ok(())
    }

    fn reconstruct(&self, shards: &mut [&mut [u8]], present: &[bool]) -> Result<(), ParityError> {
        let total = self.data_shards + 1;
        check_reconstruct_args(total, 1, shards, present)?;
        let Some(missing) = present.iter().position(|&p| !p) else {
            return Ok(());
        };
        // Every shard, parity included, is the XOR of all the others, so the lost one is the
        // XOR of the survivors whether it held data or parity.
        let (before, rest) = shards.split_at_mut(missing);
        let Some((target, after)) = rest.split_first_mut() else {
            return Ok(());
        };
        let survivors: Vec<&[u8]> = before.iter().chain(after.iter()).map(|s| &**s).collect();
        xor_into(target, &survivors);
        Ok(())
    }

    fn update_parity(
        &self,
        row: usize,
        index: usize,
        old: &[u8],
        new: &[u8],
        parity: &mut [u8],
    ) -> Result<(), ParityError> {
        check_index("parity row", row, 1)?;
        check_index("data shard", index, self.data_shards)?;
        check_len("old data", index, old, parity.len())?;
        check_len("new data", index, new, parity.len())?;
        xor_group(parity, &[old, new], 0, false);
        Ok(())
    }
}
