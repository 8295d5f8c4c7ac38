//! Analytic write-amplification models for log-structured flash translation layers.
//!
//! These closed-form (or nearly closed-form) models give the steady-state write amplification
//! (WA, also called WAF) of a page-mapped FTL under uniform random overwrites of the whole logical
//! space. The simulator uses them as a yardstick: a simulated device running a uniform random
//! workload should land close to these figures, and a large gap points at a bug or at an
//! effect (SLC cache, wear levelling, finite queue) that the models deliberately leave out.
//!
//! # Over-provisioning convention
//!
//! Throughout afa the over-provisioning ratio is `op = (physical − logical) / logical`, the figure
//! vendors quote: 7 % over-provisioning means 1.07 raw pages per logical page. The fraction of
//! physical pages that hold live data in steady state is then `alpha = 1 / (1 + op)`.

use std::fmt;

pub mod swan;

/// Why a model could not be evaluated. Every variant names the offending parameter so that the
/// message is actionable without a backtrace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ModelError {
    /// The over-provisioning ratio was zero, negative or not finite. With no spare space there is
    /// no steady state: the device would have to relocate every page to free a single one.
    InvalidOverProvisioning(f64),
    /// A utilisation was outside the open interval (0, 1) or not finite.
    InvalidUtilisation(f64),
    /// A block must hold at least one page.
    InvalidPagesPerBlock(u32),
    /// A named device or network figure was zero, negative or not finite.
    InvalidParameter(&'static str, f64),
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModelError::InvalidOverProvisioning(op) => write!(
                f,
                "over-provisioning ratio op = {op} is invalid: it must be finite and greater than 0"
            ),
            ModelError::InvalidUtilisation(u) => write!(
                f,
                "utilisation u_d = {u} is invalid: it must be finite and strictly between 0 and 1"
            ),
            ModelError::InvalidParameter(name, v) => {
                write!(
                    f,
                    "{name} = {v} is invalid: it must be finite and greater than 0"
                )
            }
            ModelError::InvalidPagesPerBlock(b) => write!(
                f,
                "pages_per_block = {b} is invalid: a block must hold at least one page"
            ),
        }
    }
}

impl std::error::Error for ModelError {}

/// Over-provisioning convention used throughout afa: `op = (physical − logical) / logical` (the
/// industry figure: 7 % means 1.07× raw pages per logical page). The logical utilisation is
/// `alpha = 1 / (1 + op)`.
///
/// This is a plain conversion and does not validate `op`; the WA models below do. For `op ≤ −1`
/// the result is meaningless (negative or infinite), and NaN propagates.
pub fn utilisation_from_op(op: f64) -> f64 {
    1.0 / (1.0 + op)
}

/// Checks that `op` is usable by the models and returns the matching utilisation `alpha`.
fn alpha_from_op(op: f64) -> Result<f64, ModelError> {
    if !op.is_finite() || op <= 0.0 {
        return Err(ModelError::InvalidOverProvisioning(op));
    }
    let alpha = utilisation_from_op(op);
    // A positive op so tiny that 1 + op rounds to 1 would give alpha = 1, where no steady state
    // exists; report it as the bad over-provisioning it is rather than failing later.
    if alpha >= 1.0 {
        return Err(ModelError::InvalidOverProvisioning(op));
    }
    Ok(alpha)
}

/// Relative width at which the bisections below stop. A relative width of 1e-12 on a quantity in
/// (0, 1/2] is also an absolute width of at most 1e-12, and stays meaningful for tiny quantities
/// (see [`segment_utilisation_from_disk_utilisation`]).
const BISECTION_TOLERANCE: f64 = 1e-12;

/// Solve `(u − 1) / ln u = u_d` for the segment utilisation `u ∈ (0, 1)`.
///
/// This is the relation between the fraction of live pages on the whole device (`u_d`, the disk
/// utilisation) and the live fraction of the segment (block) that FIFO cleaning selects, for
/// uniform random overwrites (Desnoyers 2012; SWAN §3.5 uses the same relation). Exported on its
/// own because SWAN's model reuses it.
///
/// `f(u) = (u − 1) / ln u` rises monotonically from 0 (as u → 0) to 1 (as u → 1), so the root is
/// unique and bisection always converges. Bisection stops when the bracket is narrower than 1e-12
/// relative to the quantity bisected, which also meets a 1e-12 absolute bound. Above `u = 1/2` it
/// runs on `w = 1 − u` (with `ln u = ln_1p(−w)`), because callers usually want `1 / (1 − u)` and
/// an absolute tolerance on `u` would lose all precision as `u → 1`; below `u = 1/2` it runs on
/// `u` itself so that the tiny roots of small `u_d` (`u ≈ e^(−1/u_d)`) keep their precision.
/// For `u_d` below roughly 1/745 the root is smaller than the smallest positive `f64`, and the
/// result underflows towards 0.
///
/// Returns an error unless `u_d` is finite and strictly between 0 and 1.
pub fn segment_utilisation_from_disk_utilisation(u_d: f64) -> Result<f64, ModelError> {
    if !u_d.is_finite() || u_d <= 0.0 || u_d >= 1.0 {
        return Err(ModelError::InvalidUtilisation(u_d));
    }
    // f(1/2) = 1 / (2 ln 2) decides which half of (0, 1) holds the root.
    let f_at_half = 0.5 / std::f64::consts::LN_2;
    if u_d < f_at_half {
        // f(u) is increasing in u: move the lower end up while f is still below u_d.
        let u = bisect_relative(0.5, |u| (u - 1.0) / u.ln() < u_d);
        Ok(u)
    } else {
        // f expressed in w = 1 − u is decreasing in w: move the lower end up while f exceeds u_d.
        let w = bisect_relative(0.5, |w| w / -(-w).ln_1p() > u_d);
        Ok(1.0 - w)
    }
}

/// Finds the boundary in `(0, upper]` where `root_is_above(x)` switches from true to false, to a
/// relative width of [`BISECTION_TOLERANCE`].
fn bisect_relative(upper: f64, root_is_above: impl Fn(f64) -> bool) -> f64 {
    let mut lo = 0.0_f64;
    let mut hi = upper;
    // Each halving gains one bit; 2100 iterations exceed the ~1100 needed to reach the smallest
    // subnormal, so the loop always ends even if the tolerance test never fires.
    for _ in 0..2100 {
        let mid = 0.5 * (lo + hi);
        if mid <= lo || mid >= hi {
            break;
        }
        if root_is_above(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
        if hi - lo <= BISECTION_TOLERANCE * hi {
            break;
        }
    }
    0.5 * (lo + hi)
}

/// FIFO cleaning (identical to LRU for uniform random writes): `WA = 1 / (1 − u)` where
/// `u ∈ (0, 1)` solves `(u − 1) / ln u = alpha` (Desnoyers 2012; the same relation SWAN §3.5 uses
/// between disk utilisation `u_d` and segment utilisation `u`).
///
/// Why: under uniform random overwrites a page survives each host write with probability
/// `1 − 1/U`, so a block that has lived through the whole FIFO cycle keeps a fraction
/// `u = exp(−t)` of its pages, while the device-average live fraction is the time average
/// `alpha = (1 − u) / (−ln u)`. Cleaning a block with `u·b` live pages frees `(1 − u)·b` pages for
/// host data at the cost of writing `b` pages in total, hence `WA = 1 / (1 − u)`.
///
/// Returns an error for `op ≤ 0` or a non-finite `op`.
pub fn waf_fifo(op: f64) -> Result<f64, ModelError> {
    let alpha = alpha_from_op(op)?;
    let u = segment_utilisation_from_disk_utilisation(alpha)?;
    Ok(1.0 / (1.0 - u))
}

/// Greedy cleaning, mean-field model for a finite number of pages per block `b` (in the spirit of
/// Van Houdt 2013, "A mean field model for a class of garbage collection algorithms in flash-based
/// SSDs", SIGMETRICS).
///
/// # Derivation
///
/// Take `N` blocks of `b` pages and `U = ρ·N·b` live pages with `ρ = alpha`, and uniform random
/// overwrites. Each host write invalidates one uniformly random live page, so a block holding `j`
/// valid pages loses one with probability `j / U` per host write. Let `A` be the write
/// amplification: every host write causes `A` page programs, so `A / b` blocks are filled (born
/// at level `b`) and, in steady state, `A / b` blocks are cleaned per host write.
///
/// *Levels above the cleaning level.* In the mean-field limit (`N → ∞`) the occupancy is
/// deterministic. Every block born at level `b` walks down one level at a time until greedy
/// cleans it, so every level `j` above the cleaning level `j*` carries the same downward flux,
/// the birth rate `A / b`. The flux out of level `j` is `n_j · j / U`, hence
/// `n_j / N = ρ·A / j` for `j* < j ≤ b`.
///
/// *The cleaning level.* Greedy always cleans the lowest occupied level, so all levels below `j*`
/// are empty. Level `j*` holds `m·N` blocks with `0 ≤ m`; those of its blocks that lose another
/// page drop to `j* − 1` and are cleaned at once, at a rate
/// `q = m·N·j* / U = m·j* / (ρ·b)` per host write. The remaining `A / b − q` cleanings pick blocks
/// at level `j*`. That remainder cannot be negative, so `q ≤ A / b`, i.e. `m ≤ ρ·A / j*`.
///
/// *Block count.* `1 = Σ_{j=j*+1}^{b} ρ·A / j + m = ρ·A·(H_b − H_{j*}) + m`, with `H` the
/// harmonic numbers (free and open blocks are O(1), negligible as `N → ∞`).
///
/// *Page balance.* Relocation writes per host write equal the valid pages of the cleaned blocks:
/// `A − 1 = q·(j* − 1) + (A / b − q)·j* = A·j* / b − q`, i.e. `A = 1 + A·j* / b − q`.
///
/// *Eliminating m.* Substituting `m = 1 − ρ·A·(H_b − H_{j*})` into `q` gives
/// `q = j* / (ρ·b) − A·(j* / b)·(H_b − H_{j*})`, and the page balance becomes
///
/// ```text
/// A = (1 − j* / (ρ·b)) / (1 − (j* / b)·(1 + H_b − H_{j*}))
/// ```
///
/// which is the formula this function evaluates (the tests check it against a Monte-Carlo
/// simulation of greedy cleaning). The integer `j* ∈ [0, b)` is the one whose implied `m` lies in `[0, ρ·A / j*]`.
/// For `j* = 0` the formula gives `A = 1` (fully invalid blocks are always available) and the
/// upper bound on `m` is void, so `j* = 0` applies exactly when `ρ·H_b ≤ 1`.
///
/// *Checks.* For `b → ∞` with `x = j* / b`, `H_b − H_{j*} → −ln x` and `m → 0`, so
/// `A = −1 / (ρ ln x)` and the page balance reduces to `(x − 1) / ln x = ρ`: the FIFO relation,
/// with `A = 1 / (1 − x)`. Greedy and FIFO therefore agree for large blocks, and for finite `b`
/// greedy is strictly better. For `b = 1` a fully invalid block always exists and `A = 1`.
///
/// As `ρ·A / j` is a density per level, `m` sweeps continuously from 0 to `ρ·A / j*` and then
/// on to the next level, so exactly one `j*` is consistent (ties at the boundary give the same
/// `A` from both sides). Floating-point rounding at such a boundary is handled by falling back to
/// the candidate whose constraint is violated least.
///
/// Returns an error for `op ≤ 0`, a non-finite `op`, or `pages_per_block = 0`.
pub fn waf_greedy(op: f64, pages_per_block: u32) -> Result<f64, ModelError> {
    let rho = alpha_from_op(op)?;
    if pages_per_block > MAX_TABULATED_PAGES {
        return waf_fifo(op);
    }
    greedy_steady_state(rho, pages_per_block).map(|s| s.waf)
}

/// Above this many pages per block the harmonic table would be huge and greedy is within
/// rounding of FIFO anyway.
const MAX_TABULATED_PAGES: u32 = 1 << 20;

/// The mean-field steady state of greedy cleaning (see [`waf_greedy`] for the derivation).
#[derive(Debug, Clone, PartialEq)]
pub struct GreedySteadyState {
    pub waf: f64,
    /// The cleaning level j*.
    pub cleaning_level: u32,
    /// Fraction of blocks holding exactly j valid pages, for j = 0..=b.
    pub level_fractions: Vec<f64>,
}

/// Solves the greedy mean-field model at logical utilisation `rho` (0 < rho < 1) with
/// `pages_per_block` pages per block. Preconditioning uses the level fractions to build a
/// steady state directly instead of simulating the writes that lead to it.
pub fn greedy_steady_state(
    rho: f64,
    pages_per_block: u32,
) -> Result<GreedySteadyState, ModelError> {
    if !(rho > 0.0 && rho < 1.0) {
        return Err(ModelError::InvalidUtilisation(rho));
    }
    if pages_per_block == 0 || pages_per_block > MAX_TABULATED_PAGES {
        return Err(ModelError::InvalidPagesPerBlock(pages_per_block));
    }
    let b = f64::from(pages_per_block);
    let harmonic: Vec<f64> = std::iter::once(0.0)
        .chain((1..=pages_per_block).scan(0.0_f64, |sum, j| {
            *sum += 1.0 / f64::from(j);
            Some(*sum)
        }))
        .collect();
    let h_b = harmonic[pages_per_block as usize];

    // (violation, A, j*, m): the exact solution has violation 0; otherwise the closest.
    let mut best: Option<(f64, f64, u32, f64)> = None;
    for j_star in 0..pages_per_block {
        let j = f64::from(j_star);
        let tail = h_b - harmonic[j_star as usize];
        let denominator = 1.0 - (j / b) * (1.0 + tail);
        let numerator = 1.0 - j / (rho * b);
        if denominator <= 0.0 || numerator <= 0.0 {
            break;
        }
        let amplification = numerator / denominator;
        let m = 1.0 - rho * amplification * tail;
        let m_upper = if j_star == 0 {
            f64::INFINITY
        } else {
            rho * amplification / j
        };
        let violation = if m < 0.0 {
            -m
        } else if m > m_upper {
            m - m_upper
        } else {
            0.0
        };
        if best.is_none() || violation < best.map_or(f64::INFINITY, |b| b.0) {
            best = Some((violation, amplification, j_star, m.max(0.0)));
        }
        if violation == 0.0 {
            break;
        }
    }
    let (_, waf, j_star, m) = best.unwrap_or((0.0, 1.0, 0, 1.0));
    let mut level_fractions = vec![0.0; pages_per_block as usize + 1];
    level_fractions[j_star as usize] = m;
    for (j, f) in level_fractions
        .iter_mut()
        .enumerate()
        .skip(j_star as usize + 1)
    {
        *f = rho * waf / j as f64;
    }
    Ok(GreedySteadyState {
        waf,
        cleaning_level: j_star,
        level_fractions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPS: [f64; 3] = [0.07, 0.15, 0.28];

    #[test]
    fn utilisation_matches_convention() {
        assert!((utilisation_from_op(0.07) - 1.0 / 1.07).abs() < 1e-15);
        assert_eq!(utilisation_from_op(0.0), 1.0);
    }

    #[test]
    fn bad_parameters_are_errors_not_panics() {
        for op in [
            0.0,
            -0.1,
            -1.0,
            -2.0,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            1e-300,
        ] {
            assert!(waf_fifo(op).is_err(), "op {op}");
            assert!(waf_greedy(op, 64).is_err(), "op {op}");
        }
        assert_eq!(
            waf_greedy(0.07, 0),
            Err(ModelError::InvalidPagesPerBlock(0))
        );
        for u in [0.0, 1.0, -0.5, 1.5, f64::NAN, f64::INFINITY] {
            assert!(
                segment_utilisation_from_disk_utilisation(u).is_err(),
                "u {u}"
            );
        }
        let message = waf_fifo(-1.0).unwrap_err().to_string();
        assert!(message.contains("op"), "{message}");
        let message = waf_greedy(0.1, 0).unwrap_err().to_string();
        assert!(message.contains("pages_per_block"), "{message}");
        let message = segment_utilisation_from_disk_utilisation(2.0)
            .unwrap_err()
            .to_string();
        assert!(message.contains("u_d"), "{message}");
    }

    #[test]
    fn segment_utilisation_solves_its_equation() {
        for u_d in [0.01, 0.1, 0.3, 0.5, 0.72, 0.73, 0.8, 0.93, 0.99, 0.999_999] {
            let u = segment_utilisation_from_disk_utilisation(u_d).unwrap();
            assert!(u > 0.0 && u < 1.0, "u_d {u_d}: u {u}");
            let residual = (u - 1.0) / u.ln() - u_d;
            assert!(residual.abs() < 1e-11, "u_d {u_d}: residual {residual}");
        }
        // Below about 1/745 the root underflows; the answer must still be a valid number.
        let u = segment_utilisation_from_disk_utilisation(1e-6).unwrap();
        assert!((0.0..1e-300).contains(&u), "{u}");
    }

    #[test]
    fn fifo_known_values() {
        // Independent check: WA = 1/(1 − u) with u from the relation, re-solved here by Newton's
        // method on g(u) = u − 1 − alpha·ln u (g' = 1 − alpha/u) starting below the root.
        for op in OPS {
            let alpha = utilisation_from_op(op);
            let mut u = 0.5_f64;
            for _ in 0..100 {
                u -= (u - 1.0 - alpha * u.ln()) / (1.0 - alpha / u);
            }
            let expected = 1.0 / (1.0 - u);
            let got = waf_fifo(op).unwrap();
            assert!(
                (got - expected).abs() < 1e-8 * expected,
                "op {op}: {got} vs {expected}"
            );
        }
        // Anchor against the widely quoted figure: 28 % spare gives a FIFO WA of about 2.3.
        let wa = waf_fifo(0.28).unwrap();
        assert!((2.2..2.5).contains(&wa), "{wa}");
        // More spare space always helps, and huge spare space approaches WA = 1.
        assert!(waf_fifo(0.07).unwrap() > waf_fifo(0.15).unwrap());
        assert!(waf_fifo(100.0).unwrap() < 1.01);
        // Tiny spare space: WA ≈ 1/(1−u) with 1−u ≈ 2·op blows up but stays finite.
        let wa = waf_fifo(1e-6).unwrap();
        assert!(wa.is_finite() && (wa - 0.5e6).abs() < 0.01 * 0.5e6, "{wa}");
    }

    #[test]
    fn greedy_is_below_fifo_and_approaches_it_for_large_blocks() {
        for op in OPS {
            let fifo = waf_fifo(op).unwrap();
            let mut previous = 0.0;
            for b in [64, 96, 128, 192, 256] {
                let greedy = waf_greedy(op, b).unwrap();
                assert!(
                    greedy > 1.0 && greedy < fifo,
                    "op {op} b {b}: {greedy} vs {fifo}"
                );
                // Larger blocks make greedy's choice less selective, so WA rises towards FIFO.
                assert!(greedy >= previous, "op {op} b {b}");
                previous = greedy;
            }
            let huge = waf_greedy(op, 1 << 20).unwrap();
            assert!(
                (huge - fifo).abs() < 1e-3 * fifo,
                "op {op}: {huge} vs {fifo}"
            );
        }
    }

    #[test]
    fn greedy_small_block_sanity() {
        // A single-page block is either fully valid or fully invalid, so cleaning is free.
        for op in [0.01, 0.07, 0.28, 3.0] {
            assert_eq!(waf_greedy(op, 1).unwrap(), 1.0);
        }
        // Lots of spare space: ρ·H_b ≤ 1 means fully invalid blocks always exist.
        assert_eq!(waf_greedy(4.0, 4).unwrap(), 1.0);
        // Every block size gives a finite WA of at least 1.
        for b in 1..=300 {
            for op in [0.001, 0.07, 0.15, 0.28, 1.0] {
                let wa = waf_greedy(op, b).unwrap();
                assert!(wa.is_finite() && wa >= 1.0, "op {op} b {b}: {wa}");
            }
        }
    }

    #[test]
    fn greedy_has_exactly_one_consistent_cleaning_level() {
        for op in [0.01, 0.07, 0.15, 0.28, 0.5] {
            for b in [2, 8, 32, 64, 256] {
                let rho = utilisation_from_op(op);
                let bf = f64::from(b);
                let h = |n: u32| (1..=n).map(|k| 1.0 / f64::from(k)).sum::<f64>();
                let consistent = (0..b)
                    .filter(|&j_star| {
                        let j = f64::from(j_star);
                        let tail = h(b) - h(j_star);
                        let a = (1.0 - j / (rho * bf)) / (1.0 - (j / bf) * (1.0 + tail));
                        let m = 1.0 - rho * a * tail;
                        a > 0.0 && m >= -1e-12 && (j_star == 0 || m <= rho * a / j + 1e-12)
                    })
                    .count();
                // Exactly at a boundary two neighbours may both qualify, with equal A.
                assert!((1..=2).contains(&consistent), "op {op} b {b}: {consistent}");
            }
        }
    }

    /// Xorshift64* — deterministic and dependency-free, good enough to drive a Monte-Carlo check.
    struct XorShift(u64);

    impl XorShift {
        fn next_u64(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        /// Uniform in `0..n` by multiply-shift; the bias is below 2^-32 for the sizes used here.
        fn below(&mut self, n: usize) -> usize {
            ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
        }
    }

    /// Simulates a page-mapped FTL with greedy cleaning under uniform random overwrites and returns
    /// the measured write amplification.
    ///
    /// The cleaned block becomes the next write frontier: its valid pages are rewritten first and
    /// host writes fill the rest. This is how the mean-field model counts (a cleaned block with j
    /// valid pages costs j relocations and yields b − j host pages) and needs no spare free block.
    fn simulate_greedy(op: f64, blocks: usize, pages_per_block: usize, seed: u64) -> f64 {
        let logical_pages = (utilisation_from_op(op) * (blocks * pages_per_block) as f64) as usize;
        let mut rng = XorShift(seed);
        // location[l] = block holding logical page l; pages[blk] = logical pages written there.
        let mut location = vec![usize::MAX; logical_pages];
        let mut valid_pages = vec![0_usize; blocks];
        let mut contents: Vec<Vec<u32>> = vec![Vec::with_capacity(pages_per_block); blocks];
        let mut free_blocks: Vec<usize> = (0..blocks).rev().collect();
        let mut frontier = free_blocks.pop().unwrap_or(0);
        let mut relocations = 0_u64;

        // Appends one page to the frontier, opening a new frontier first when it is full.
        let mut write = |logical: usize,
                         location: &mut Vec<usize>,
                         relocations: &mut u64,
                         free_blocks: &mut Vec<usize>,
                         frontier: &mut usize| {
            if contents[*frontier].len() == pages_per_block {
                let next = if let Some(free) = free_blocks.pop() {
                    free
                } else {
                    // Greedy: the closed block with the fewest valid pages.
                    let victim = (0..blocks)
                        .filter(|&blk| blk != *frontier)
                        .min_by_key(|&blk| valid_pages[blk])
                        .unwrap_or(*frontier);
                    let survivors: Vec<u32> = contents[victim]
                        .iter()
                        .copied()
                        .filter(|&l| location[l as usize] == victim)
                        .collect();
                    contents[victim].clear();
                    *relocations += survivors.len() as u64;
                    contents[victim].extend_from_slice(&survivors);
                    victim
                };
                *frontier = next;
            }
            if let Some(old) = location.get(logical).copied().filter(|&o| o != usize::MAX) {
                valid_pages[old] -= 1;
            }
            location[logical] = *frontier;
            valid_pages[*frontier] += 1;
            contents[*frontier].push(logical as u32);
        };

        for logical in 0..logical_pages {
            write(
                logical,
                &mut location,
                &mut relocations,
                &mut free_blocks,
                &mut frontier,
            );
        }
        let warmup_writes = 10 * logical_pages;
        let measured_writes = 30 * logical_pages;
        for _ in 0..warmup_writes {
            let logical = rng.below(logical_pages);
            write(
                logical,
                &mut location,
                &mut relocations,
                &mut free_blocks,
                &mut frontier,
            );
        }
        let relocations_before = relocations;
        for _ in 0..measured_writes {
            let logical = rng.below(logical_pages);
            write(
                logical,
                &mut location,
                &mut relocations,
                &mut free_blocks,
                &mut frontier,
            );
        }
        let measured_relocations = relocations - relocations_before;
        (measured_writes as f64 + measured_relocations as f64) / measured_writes as f64
    }

    #[test]
    fn greedy_model_matches_monte_carlo() {
        const BLOCKS: usize = 512;
        const PAGES_PER_BLOCK: u32 = 32;
        for (i, op) in OPS.into_iter().enumerate() {
            let simulated =
                simulate_greedy(op, BLOCKS, PAGES_PER_BLOCK as usize, 0x9e37_79b9 + i as u64);
            let model = waf_greedy(op, PAGES_PER_BLOCK).unwrap();
            let relative_error = (model - simulated).abs() / simulated;
            eprintln!(
                "op {op}: model {model:.4}, simulated {simulated:.4}, fifo {:.4}",
                waf_fifo(op).unwrap()
            );
            assert!(
                relative_error < 0.05,
                "op {op}: model {model} vs simulated {simulated} ({:.1} %)",
                relative_error * 100.0
            );
        }
    }
}
