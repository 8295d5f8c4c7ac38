//! Systematic Reed–Solomon over GF(2^8) for any number of parity shards.
//!
//! # Encoding matrix
//!
//! The parity rows form a normalised Cauchy matrix. Start from `C[r][j] = 1 / (x_r + y_j)` with
//! `y_j = j` for the k data columns and `x_r = k + r` for the m parity rows; all k + m values
//! are distinct, so every denominator is non-zero. Every square submatrix of a Cauchy matrix is
//! non-singular, and scaling whole rows or columns by non-zero constants keeps it so, which is
//! exactly the condition for the systematic code `[I; P]` to be MDS (any k of the k + m shards
//! determine the data). The columns are scaled so that row 0 is all ones, making parity 0 the
//! plain XOR of the data (the RAID-5 / RAID-6 P shard), and rows 1.. are scaled so that their
//! first coefficient is one, which lets the encoder XOR data shard 0 instead of multiplying it.
//!
//! Row 1 is therefore *not* the classic Linux RAID-6 `Q = Σ 2^i · D_i`. That syndrome is MDS
//! only for m = 2; the Cauchy construction is MDS for every m up to 255 − k with one code path,
//! and nothing in the simulator needs bit-compatibility with Linux md parity.

use crate::combine::{combine, combine_one};
use crate::gf256::{inv, mul, mul_group, mul_table};
use crate::matrix::{invert, row_times};
use crate::xor::xor_group;
use crate::{check_index, check_len, check_reconstruct_args, check_slices};
use crate::{ErasureCodec, ParityError, MAX_TOTAL_SHARDS};

/// Reed–Solomon code with k data and m parity shards, k + m ≤ 255.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReedSolomon {
    data_shards: usize,
    /// m rows of k coefficients: parity row r is `Σ_j parity_matrix[r][j] · D_j`.
    parity_matrix: Vec<Vec<u8>>,
}

impl ReedSolomon {
    /// Creates a k+m code; fails if k or m is zero or k + m exceeds 255.
    pub fn new(k: usize, m: usize) -> Result<Self, ParityError> {
        if k == 0 {
            return Err(ParityError::InvalidDataShards { k });
        }
        if m == 0 {
            return Err(ParityError::InvalidParityShards { m });
        }
        if k + m > MAX_TOTAL_SHARDS {
            return Err(ParityError::TooManyShards { k, m });
        }
        let parity_matrix =
            cauchy_parity_matrix(k, m).ok_or(ParityError::SingularMatrix { size: k.max(m) })?;
        Ok(Self {
            data_shards: k,
            parity_matrix,
        })
    }

    /// The m×k parity coefficient matrix, row by row.
    pub fn parity_matrix(&self) -> &[Vec<u8>] {
        &self.parity_matrix
    }

    /// Coefficient row of shard `index` in the full (k+m)×k generator matrix: a unit vector for
    /// a data shard, a parity row otherwise.
    fn generator_row(&self, index: usize) -> Vec<u8> {
        match index.checked_sub(self.data_shards) {
            Some(row) => self.parity_matrix[row].clone(),
            None => (0..self.data_shards)
                .map(|j| u8::from(j == index))
                .collect(),
        }
    }
}

/// Builds the normalised Cauchy parity matrix described in the module documentation. Returns
/// `None` only if k + m > 255 (an element would repeat) or k or m is zero, which callers have
/// excluded.
fn cauchy_parity_matrix(k: usize, m: usize) -> Option<Vec<Vec<u8>>> {
    let mut matrix = Vec::with_capacity(m);
    for r in 0..m {
        let x = u8::try_from(k + r).ok()?;
        let row = (0..k)
            .map(|j| inv(x ^ u8::try_from(j).ok()?))
            .collect::<Option<Vec<u8>>>()?;
        matrix.push(row);
    }
    // Scale each column so that row 0 becomes all ones.
    let column_scales = matrix
        .first()?
        .iter()
        .map(|&c| inv(c))
        .collect::<Option<Vec<u8>>>()?;
    for row in matrix.iter_mut() {
        for (value, &scale) in row.iter_mut().zip(&column_scales) {
            *value = mul(*value, scale);
        }
    }
    // Scale each later row so that its first coefficient becomes one.
    for row in matrix.iter_mut().skip(1) {
        let scale = inv(*row.first()?)?;
        for value in row.iter_mut() {
            *value = mul(*value, scale);
        }
    }
    Some(matrix)
}

impl ErasureCodec for ReedSolomon {
    fn data_shards(&self) -> usize {
        self.data_shards
    }

    fn parity_shards(&self) -> usize {
        self.parity_matrix.len()
    }

    fn encode(&self, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<(), ParityError> {
        let len_bytes = data.first().map_or(0, |d| d.len());
        check_slices("data shard", data, self.data_shards, len_bytes)?;
        check_slices("parity shard", parity, self.parity_shards(), len_bytes)?;
        combine(&self.parity_matrix, data, parity);
        Ok(())
    }

    fn encode_row(&self, row: usize, data: &[&[u8]], out: &mut [u8]) -> Result<(), ParityError> {
        check_index("parity row", row, self.parity_shards())?;
        check_slices("data shard", data, self.data_shards, out.len())?;
        combine_one(&self.parity_matrix[row], data, out);
        Ok(())
    }

    fn reconstruct(&self, shards: &mut [&mut [u8]], present: &[bool]) -> Result<(), ParityError> {
        let k = self.data_shards;
        let total = k + self.parity_shards();
        let missing = check_reconstruct_args(total, self.parity_shards(), shards, present)?;
        if missing == 0 {
            return Ok(());
        }
        // Decode from the first k surviving shards. Data shards come first, so surviving data
        // is used as-is (unit rows) and parity only fills the gaps, which keeps the decoding
        // matrix as sparse as possible.
        let chosen: Vec<usize> = (0..total).filter(|&i| present[i]).take(k).collect();
        let chosen_rows: Vec<Vec<u8>> = chosen.iter().map(|&i| self.generator_row(i)).collect();
        // chosen = G_chosen · D, so D = G_chosen⁻¹ · chosen, and any shard t, which is
        // G_t · D, equals (G_t · G_chosen⁻¹) · chosen: one combination of the survivors each.
        let decoder = invert(&chosen_rows).ok_or(ParityError::SingularMatrix { size: k })?;
        let missing_rows: Vec<Vec<u8>> = (0..total)
            .filter(|&i| !present[i])
            .map(|i| row_times(&self.generator_row(i), &decoder))
            .collect();

        let mut sources: Vec<&[u8]> = Vec::with_capacity(k);
        let mut outputs: Vec<&mut [u8]> = Vec::with_capacity(missing);
        for (index, shard) in shards.iter_mut().enumerate() {
            if !present[index] {
                outputs.push(&mut **shard);
            } else if sources.len() < k {
                sources.push(&**shard);
            }
        }
        combine(&missing_rows, &sources, &mut outputs);
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
        check_index("parity row", row, self.parity_shards())?;
        check_index("data shard", index, self.data_shards)?;
        check_len("old data", index, old, parity.len())?;
        check_len("new data", index, new, parity.len())?;
        // Parity is linear in each data shard, so it moves by c · (new − old) = c·old ^ c·new.
        match self.parity_matrix[row][index] {
            0 => {}
            1 => xor_group(parity, &[old, new], 0, false),
            coefficient => {
                let table = mul_table(coefficient);
                mul_group(parity, &[(old, table), (new, table)], 0, false);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gf256::exp;

    #[test]
    fn row_zero_is_all_ones_and_column_zero_is_all_ones() {
        for (k, m) in [(1, 1), (2, 2), (6, 2), (10, 4), (200, 55)] {
            let code = ReedSolomon::new(k, m).expect("valid parameters");
            assert!(code.parity_matrix()[0].iter().all(|&c| c == 1), "{k}+{m}");
            assert!(
                code.parity_matrix().iter().all(|row| row[0] == 1),
                "{k}+{m}"
            );
            assert!(code.parity_matrix().iter().flatten().all(|&c| c != 0));
        }
    }

    #[test]
    fn row_zero_parity_equals_xor() {
        let data: Vec<Vec<u8>> = (0..5u8)
            .map(|j| {
                (0..21u8)
                    .map(|i| i.wrapping_mul(17).wrapping_add(j * 40))
                    .collect()
            })
            .collect();
        let data_refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        let code = ReedSolomon::new(5, 3).expect("valid parameters");
        let mut row_zero = vec![0u8; 21];
        code.encode_row(0, &data_refs, &mut row_zero)
            .expect("valid shards");
        let mut xor = vec![0u8; 21];
        crate::xor_into(&mut xor, &data_refs);
        assert_eq!(row_zero, xor);
    }

    /// The 2+2 code worked by hand in GF(2^8)/0x11d.
    ///
    /// With k = 2, m = 2: y = (0, 1) and x = (2, 3), so C = [[1/2, 1/3], [1/3, 1/2]], where
    /// 1/2 = 0x8e (2 · 0x8e = 0x11c, which reduces to 0x11c ^ 0x11d = 1) and 1/3 = 0xf4.
    /// Scaling the columns by (2, 3) gives row 0 = (1, 1) and row 1 = (2/3, 3/2); scaling row 1
    /// by 3/2 gives row 1 = (1, (3/2)^2) = (1, 5/4), because 3 · 3 = 3 ^ 6 = 5 and 2 · 2 = 4.
    /// 1/4 = 0x47 (4 · 0x47 = 0x11c, reduced 1), and 5 · 0x47 = 0x47 ^ (4 · 0x47) = 0x47 ^ 1
    /// = 0x46. So P = D0 ^ D1 and Q = D0 ^ 0x46 · D1.
    ///
    /// For D0 = (0x01, 0x80) and D1 = (0x02, 0xff): P = (0x03, 0x7f);
    /// Q[0] = 0x01 ^ 0x46 · 2 = 0x01 ^ 0x8c = 0x8d, and Q[1] = 0x80 ^ 0x46 · 0xff
    /// = 0x80 ^ 0x09 = 0x89.
    #[test]
    fn two_plus_two_worked_example() {
        let code = ReedSolomon::new(2, 2).expect("valid parameters");
        assert_eq!(inv(2), Some(0x8e));
        assert_eq!(inv(3), Some(0xf4));
        assert_eq!(inv(4), Some(0x47));
        assert_eq!(code.parity_matrix(), &[vec![1, 1], vec![1, 0x46]]);

        let d0 = [0x01u8, 0x80];
        let d1 = [0x02u8, 0xff];
        let mut p = [0u8; 2];
        let mut q = [0u8; 2];
        code.encode(&[&d0, &d1], &mut [&mut p, &mut q])
            .expect("valid shards");
        assert_eq!(p, [0x03, 0x7f]);
        assert_eq!(q, [0x8d, 0x89]);

        // Lose both data shards and rebuild them from P and Q alone.
        let mut lost0 = [0u8; 2];
        let mut lost1 = [0u8; 2];
        code.reconstruct(
            &mut [&mut lost0, &mut lost1, &mut p, &mut q],
            &[false, false, true, true],
        )
        .expect("two erasures are within m = 2");
        assert_eq!((lost0, lost1), (d0, d1));
    }

    #[test]
    fn exp_helper_matches_generator_powers() {
        assert_eq!(exp(0), 1);
        assert_eq!(exp(1), 2);
    }
}
