//! Small dense matrices over GF(2^8): just enough to invert the k×k decoding matrix of a
//! Reed–Solomon reconstruction. They are at most 255×255, so plain Gauss–Jordan is ample.

use crate::gf256::{inv, mul};

/// Inverts a square matrix given as rows, or returns `None` if it is singular (or not square).
pub(crate) fn invert(matrix: &[Vec<u8>]) -> Option<Vec<Vec<u8>>> {
    let size = matrix.len();
    if matrix.iter().any(|row| row.len() != size) {
        return None;
    }
    // Augment with the identity and reduce the left half to the identity; the right half then
    // holds the inverse.
    let mut work: Vec<Vec<u8>> = matrix
        .iter()
        .enumerate()
        .map(|(r, row)| {
            let mut augmented = row.clone();
            augmented.extend((0..size).map(|c| u8::from(c == r)));
            augmented
        })
        .collect();
    for col in 0..size {
        let pivot_row = (col..size).find(|&r| work[r][col] != 0)?;
        work.swap(col, pivot_row);
        let pivot_inverse = inv(work[col][col])?;
        for value in work[col].iter_mut() {
            *value = mul(*value, pivot_inverse);
        }
        let pivot = work[col].clone();
        for (r, row) in work.iter_mut().enumerate() {
            let factor = row[col];
            if r == col || factor == 0 {
                continue;
            }
            // Subtraction is XOR in characteristic 2.
            for (value, &p) in row.iter_mut().zip(&pivot) {
                *value ^= mul(factor, p);
            }
        }
    }
    Some(work.into_iter().map(|row| row[size..].to_vec()).collect())
}

/// Row vector times matrix: `result[j] = Σ_l row[l] · matrix[l][j]`.
pub(crate) fn row_times(row: &[u8], matrix: &[Vec<u8>]) -> Vec<u8> {
    let cols = matrix.first().map_or(0, Vec::len);
    let mut result = vec![0u8; cols];
    for (&factor, matrix_row) in row.iter().zip(matrix) {
        for (out, &value) in result.iter_mut().zip(matrix_row) {
            *out ^= mul(factor, value);
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inverse_times_matrix_is_identity() {
        let matrix = vec![vec![1, 1, 1], vec![1, 2, 4], vec![1, 3, 5]];
        let inverse = invert(&matrix).expect("this Vandermonde-like matrix is invertible");
        for (r, inverse_row) in inverse.iter().enumerate() {
            let product = row_times(inverse_row, &matrix);
            let identity_row: Vec<u8> = (0..3).map(|c| u8::from(c == r)).collect();
            assert_eq!(product, identity_row, "row {r}");
        }
    }

    #[test]
    fn singular_and_non_square_matrices_are_rejected() {
        assert_eq!(invert(&[vec![1, 2], vec![1, 2]]), None);
        assert_eq!(invert(&[vec![1, 2]]), None);
        assert_eq!(invert(&[]), Some(vec![]));
    }
}
