//! Parity for the array engines: plain XOR (RAID 4/5) and systematic Reed–Solomon over
//! GF(2^8) (RAID 6 and wider codes, and ScalaAFA's in-SSD conversion, which asks each parity
//! SSD for one parity row).
//!
//! Payloads are bytes in every payload mode: `full` mode carries whole sectors and `token`
//! mode carries an 8-byte fingerprint per sector. Every routine here therefore works bytewise
//! on byte slices of any equal length, so the same code serves both modes and lengths need not
//! be multiples of eight.
//!
//! Everything is written in-house without `unsafe`: the XOR loops are shaped so that the
//! compiler vectorises them, and GF(2^8) multiplication uses one 256-byte lookup table per
//! coefficient. Long chunks are processed in cache-sized blocks so that a block of every source
//! and output stays in L1 while all sources and parity rows are combined.

#![forbid(unsafe_code)]
#![warn(missing_debug_implementations)]
#![warn(missing_docs)]
#![warn(clippy::dbg_macro, clippy::todo, clippy::unimplemented)]

pub mod bench;
mod combine;
mod gf256;
mod matrix;
mod rs;
mod xor;

pub use rs::ReedSolomon;
pub use xor::{xor_accumulate, xor_into, XorCodec};

/// The largest total shard count a GF(2^8) code supports: the field has 255 non-zero elements,
/// and the Cauchy construction needs k + m distinct field elements.
pub const MAX_TOTAL_SHARDS: usize = 255;

/// Errors of the codecs. All of them describe bad input from the caller; none is a transient
/// condition, and each message names the offending value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParityError {
    /// The number of data shards was zero.
    #[error("invalid number of data shards k = {k}: need at least 1")]
    InvalidDataShards {
        /// The rejected data shard count.
        k: usize,
    },
    /// The number of parity shards was zero.
    #[error("invalid number of parity shards m = {m}: need at least 1")]
    InvalidParityShards {
        /// The rejected parity shard count.
        m: usize,
    },
    /// k + m exceeds what GF(2^8) supports.
    #[error("k + m = {k} + {m} = {} exceeds the GF(2^8) limit of 255 shards", k + m)]
    TooManyShards {
        /// The requested data shard count.
        k: usize,
        /// The requested parity shard count.
        m: usize,
    },
    /// A list of shards (or of presence flags) had the wrong number of entries.
    #[error("expected {expected} {what}, got {actual}")]
    ShardCount {
        /// Which list was wrong, e.g. "data shards".
        what: &'static str,
        /// The number of entries the codec needs.
        expected: usize,
        /// The number of entries supplied.
        actual: usize,
    },
    /// A shard's length differs from the length of the first shard.
    #[error("{what} {index} is {actual_bytes} bytes long, expected {expected_bytes} bytes")]
    LengthMismatch {
        /// Which kind of buffer was wrong, e.g. "data shard".
        what: &'static str,
        /// Position of the buffer within its list.
        index: usize,
        /// The length every buffer must have.
        expected_bytes: usize,
        /// The length of the offending buffer.
        actual_bytes: usize,
    },
    /// More shards are missing than the code can rebuild.
    #[error("{missing} shards are missing but the code tolerates at most {max}")]
    TooManyErasures {
        /// The number of missing shards.
        missing: usize,
        /// The number of parity shards, i.e. the most that can be rebuilt.
        max: usize,
    },
    /// A parity row or data shard index is out of range.
    #[error("{what} index {index} is out of range: must be below {limit}")]
    BadIndex {
        /// Which index was wrong, e.g. "parity row".
        what: &'static str,
        /// The rejected index.
        index: usize,
        /// The exclusive upper bound.
        limit: usize,
    },
    /// The decoding matrix could not be inverted. This cannot happen for the MDS matrices this
    /// crate builds; it exists so that a broken invariant surfaces as an error, not a panic.
    #[error("internal error: the {size}x{size} decoding matrix is singular")]
    SingularMatrix {
        /// The dimension of the matrix.
        size: usize,
    },
}

/// An erasure code over k data and m parity shards of equal length.
///
/// Shards are plain byte slices; all shards passed to one call must have the same length, which
/// may be any value including zero.
pub trait ErasureCodec: Send + Sync + std::fmt::Debug {
    /// The number of data shards, k.
    fn data_shards(&self) -> usize;

    /// The number of parity shards, m.
    fn parity_shards(&self) -> usize;

    /// Computes all m parity shards from the k data shards.
    fn encode(&self, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<(), ParityError>;

    /// Computes parity row `row` (0..m) only. ScalaAFA's in-SSD conversion asks each parity SSD
    /// for one row (its "parity type").
    fn encode_row(&self, row: usize, data: &[&[u8]], out: &mut [u8]) -> Result<(), ParityError>;

    /// Rebuilds the missing shards in place. `shards` has k + m entries (data first);
    /// `present[i]` says whether shard i holds valid bytes. Up to m shards may be missing; the
    /// buffers of missing shards must already have the common length and are overwritten.
    fn reconstruct(&self, shards: &mut [&mut [u8]], present: &[bool]) -> Result<(), ParityError>;

    /// Read-modify-write delta update: given the old and new bytes of data shard `index`,
    /// updates parity row `row` in place (for XOR this is parity ^= old ^ new; for Reed–Solomon
    /// it adds the row's coefficient times old ^ new).
    fn update_parity(
        &self,
        row: usize,
        index: usize,
        old: &[u8],
        new: &[u8],
        parity: &mut [u8],
    ) -> Result<(), ParityError>;
}

/// Chooses [`XorCodec`] for m = 1 and [`ReedSolomon`] otherwise.
///
/// Both produce the same parity for m = 1 (Reed–Solomon row 0 is plain XOR), so the choice is
/// only about speed. Note that XOR has no field-size limit, so `codec(k, 1)` accepts k > 254.
pub fn codec(k: usize, m: usize) -> Result<Box<dyn ErasureCodec>, ParityError> {
    match m {
        0 => Err(ParityError::InvalidParityShards { m }),
        1 => Ok(Box::new(XorCodec::new(k)?)),
        _ => Ok(Box::new(ReedSolomon::new(k, m)?)),
    }
}

/// Checks that `slices` has `expected` entries, all `len_bytes` long.
fn check_slices<S: AsRef<[u8]>>(
    what: &'static str,
    slices: &[S],
    expected: usize,
    len_bytes: usize,
) -> Result<(), ParityError> {
    if slices.len() != expected {
        return Err(ParityError::ShardCount {
            what,
            expected,
            actual: slices.len(),
        });
    }
    for (index, slice) in slices.iter().enumerate() {
        check_len(what, index, slice.as_ref(), len_bytes)?;
    }
    Ok(())
}

/// Checks that one buffer is `len_bytes` long.
fn check_len(
    what: &'static str,
    index: usize,
    slice: &[u8],
    len_bytes: usize,
) -> Result<(), ParityError> {
    if slice.len() == len_bytes {
        Ok(())
    } else {
        Err(ParityError::LengthMismatch {
            what,
            index,
            expected_bytes: len_bytes,
            actual_bytes: slice.len(),
        })
    }
}

/// Checks a parity row or data shard index against its exclusive bound.
fn check_index(what: &'static str, index: usize, limit: usize) -> Result<(), ParityError> {
    if index < limit {
        Ok(())
    } else {
        Err(ParityError::BadIndex { what, index, limit })
    }
}

/// Checks the shard list and presence flags of a reconstruct call and returns the number of
/// missing shards.
fn check_reconstruct_args(
    total: usize,
    max_missing: usize,
    shards: &[&mut [u8]],
    present: &[bool],
) -> Result<usize, ParityError> {
    if present.len() != total {
        return Err(ParityError::ShardCount {
            what: "presence flags",
            expected: total,
            actual: present.len(),
        });
    }
    let len_bytes = shards.first().map_or(0, |s| s.len());
    check_slices("shard", shards, total, len_bytes)?;
    let missing = present.iter().filter(|&&p| !p).count();
    if missing > max_missing {
        return Err(ParityError::TooManyErasures {
            missing,
            max: max_missing,
        });
    }
    Ok(missing)
}
