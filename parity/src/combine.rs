//! The linear-combination engine behind encoding, decoding and parity updates: every output
//! shard is `Σ c_j · source_j` over GF(2^8) for its own row of coefficients.

use crate::gf256::{mul_add_bitplanes, mul_group, mul_table, Planes, PLANE_BYTES};
use crate::xor::xor_group;

/// Bytes of each shard processed together. For stripes of up to about six shards the blocks of
/// every source and output fit in a 32 KiB L1 data cache (and in L2 for wider ones), so each
/// source byte is fetched from memory once even though every parity row reads it.
pub(crate) const BLOCK_BYTES: usize = 4096;

/// Sources combined per pass over an output block. Four keeps the loads per pass within the
/// register budget of the fused loops while cutting output traffic fourfold.
pub(crate) const MAX_GROUP_SOURCES: usize = 4;

/// From this many sources with a coefficient other than zero or one, a row is multiplied by bit
/// planes rather than product tables. Bit planes cost a fixed seven doublings per output byte
/// plus cheap vectorised XORs, tables one unvectorisable lookup per source byte; measured on
/// 64 KiB chunks, planes win clearly from three sources on.
const BITPLANE_MIN_SOURCES: usize = 3;

/// How one output is built: the sources whose coefficient is one are XORed (the fast path that
/// makes Reed–Solomon row 0 as cheap as plain parity), the others are multiplied by product
/// tables or bit planes, and sources with coefficient zero are skipped.
struct RowPlan<'a> {
    ones: Vec<&'a [u8]>,
    general: Vec<(&'a [u8], &'static [u8; 256])>,
    /// The same sources as `general` with their coefficients, for the bit-plane kernel.
    general_coefficients: Vec<(&'a [u8], u8)>,
}

impl<'a> RowPlan<'a> {
    fn new(coefficients: &[u8], sources: &[&'a [u8]]) -> Self {
        let mut plan = Self {
            ones: Vec::new(),
            general: Vec::new(),
            general_coefficients: Vec::new(),
        };
        for (&coefficient, &source) in coefficients.iter().zip(sources) {
            match coefficient {
                0 => {}
                1 => plan.ones.push(source),
                _ => {
                    plan.general.push((source, mul_table(coefficient)));
                    plan.general_coefficients.push((source, coefficient));
                }
            }
        }
        plan
    }

    fn uses_bitplanes(&self) -> bool {
        self.general.len() >= BITPLANE_MIN_SOURCES
    }

    /// Writes this row's combination of bytes `offset..offset + dst.len()` into `dst`, using
    /// `planes` as scratch space when the row uses bit planes.
    fn apply(&self, dst: &mut [u8], offset: usize, planes: &mut Option<Box<Planes>>) {
        let mut assigned = false;
        for group in self.ones.chunks(MAX_GROUP_SOURCES) {
            xor_group(dst, group, offset, !assigned);
            assigned = true;
        }
        if self.uses_bitplanes() {
            let planes = planes.get_or_insert_with(|| Box::new([[0u8; PLANE_BYTES]; 8]));
            mul_add_bitplanes(dst, &self.general_coefficients, offset, !assigned, planes);
            assigned = true;
        } else {
            for group in self.general.chunks(MAX_GROUP_SOURCES) {
                mul_group(dst, group, offset, !assigned);
                assigned = true;
            }
        }
        if !assigned {
            dst.fill(0);
        }
    }
}

/// Sets `outputs[r] = Σ_j coefficient_rows[r][j] · sources[j]` for every r.
///
/// Callers have checked that every source and output has the same length and that each row has
/// one coefficient per source; the loop walks the shards block by block so that all outputs
/// are built from the same cached block of the sources.
pub(crate) fn combine<R: AsRef<[u8]>>(
    coefficient_rows: &[R],
    sources: &[&[u8]],
    outputs: &mut [&mut [u8]],
) {
    let plans: Vec<RowPlan<'_>> = coefficient_rows
        .iter()
        .map(|row| RowPlan::new(row.as_ref(), sources))
        .collect();
    let len_bytes = outputs.first().map_or(0, |o| o.len());
    // Allocated on first use only, so that short token-mode shards and XOR-only rows never pay
    // for the 8 KiB of planes.
    let mut planes: Option<Box<Planes>> = None;
    let mut start = 0;
    while start < len_bytes {
        let end = (start + BLOCK_BYTES).min(len_bytes);
        for (plan, output) in plans.iter().zip(outputs.iter_mut()) {
            plan.apply(&mut output[start..end], start, &mut planes);
        }
        start = end;
    }
}

/// Sets `output = Σ_j coefficients[j] · sources[j]`; the single-row case of [`combine`].
pub(crate) fn combine_one(coefficients: &[u8], sources: &[&[u8]], output: &mut [u8]) {
    combine(&[coefficients], sources, &mut [output]);
}
