//! The seeded random number generator every simulated component draws from.

use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// ChaCha8 seeded from one `u64`: portable across platforms and versions of the standard
/// library, which `StdRng` does not promise.
#[derive(Debug, Clone)]
pub struct SimRng {
    inner: ChaCha8Rng,
}

impl SimRng {
    pub fn new(seed: u64) -> Self {
        Self {
            inner: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    /// A generator for a sub-component, derived from this seed and a stream number, so that
    /// adding draws in one component does not shift the numbers another one sees.
    pub fn fork(seed: u64, stream: u64) -> Self {
        let mut inner = ChaCha8Rng::seed_from_u64(seed);
        inner.set_stream(stream);
        Self { inner }
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.inner.next_u64()
    }

    /// Uniform in `0..n`; `n` must be positive.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        self.inner.gen_range(0..n)
    }

    /// Uniform in `[0, 1)`.
    #[inline]
    pub fn unit_f64(&mut self) -> f64 {
        self.inner.gen::<f64>()
    }

    /// An exponentially distributed draw of mean `mean`, by inverse transform: the gap
    /// between arrivals of a Poisson process. `1 − U` lies in (0, 1], so the logarithm is
    /// finite.
    #[inline]
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -(1.0 - self.unit_f64()).ln() * mean
    }

    /// True with probability `p`.
    #[inline]
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit_f64() < p
    }
}

impl RngCore for SimRng {
    fn next_u32(&mut self) -> u32 {
        self.inner.next_u32()
    }
    fn next_u64(&mut self) -> u64 {
        self.inner.next_u64()
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        self.inner.fill_bytes(dest)
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        self.inner.try_fill_bytes(dest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_numbers() {
        let mut a = SimRng::new(42);
        let mut b = SimRng::new(42);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        let mut c = SimRng::new(43);
        assert_ne!(SimRng::new(42).next_u64(), c.next_u64());
    }

    #[test]
    fn forks_are_independent_streams() {
        let mut a = SimRng::fork(1, 0);
        let mut b = SimRng::fork(1, 1);
        assert_ne!(a.next_u64(), b.next_u64());
    }

    /// Exponential draws are finite and non-negative, and their mean is the one asked for.
    #[test]
    fn exponential_draws_have_the_mean_asked_for() {
        let mut r = SimRng::new(7);
        let n = 200_000;
        let mut sum = 0.0;
        for _ in 0..n {
            let x = r.exponential(250.0);
            assert!(x.is_finite() && x >= 0.0, "{x}");
            sum += x;
        }
        let mean = sum / n as f64;
        assert!((mean / 250.0 - 1.0).abs() < 0.01, "mean {mean}");
    }
}
