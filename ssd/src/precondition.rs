//! Preconditioning: bringing a device to a fill level and a steady state before measuring.
//!
//! Instead of simulating the history in time, the FTL replays it untimed: the mapping, the
//! block valid counts, the erase counts and the stored payload end up exactly as the writes
//! would leave them, but no NAND timing, event or counter is touched. A sequential fill is a
//! single pass; a random steady state adds uniform random overwrites of the filled range,
//! which is what drives the block valid-count distribution to its steady state under the
//! chosen GC policy.

use afa_nand::{fill_unit, sector_token};
use afa_sim::SimRng;
use serde::{Deserialize, Serialize};

use afa_nand::Nand;

use crate::ftl::Ftl;
use crate::{Ssd, SsdError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum PreconditionPattern {
    /// Logical pages written once, in order.
    #[default]
    Sequential,
    /// The steady state of uniform random overwrites, built directly from the GC policy's
    /// model (see `Ftl::construct_random_steady_state`), then settled by `overwrite_rounds`
    /// of simulated random overwrites.
    Random,
    /// A sequential fill followed by `overwrite_rounds` of simulated uniform random
    /// overwrites: slower, and free of any model.
    RandomSimulated,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Precondition {
    /// Fraction of the logical capacity written, from 0 to 1.
    pub fill_fraction: f64,
    pub pattern: PreconditionPattern,
    /// For the random patterns: simulated overwrites as a multiple of the filled pages.
    pub overwrite_rounds: f64,
}

impl Default for Precondition {
    fn default() -> Self {
        Self {
            fill_fraction: 0.0,
            pattern: PreconditionPattern::Sequential,
            overwrite_rounds: 0.25,
        }
    }
}

impl Precondition {
    pub fn validate(&self) -> Result<(), SsdError> {
        if !(0.0..=1.0).contains(&self.fill_fraction) {
            return Err(SsdError::Config(format!(
                "precondition.fill_fraction = {} must lie in [0, 1]",
                self.fill_fraction
            )));
        }
        if !(self.overwrite_rounds.is_finite() && self.overwrite_rounds >= 0.0) {
            return Err(SsdError::Config(format!(
                "precondition.overwrite_rounds = {} must be a non-negative number",
                self.overwrite_rounds
            )));
        }
        Ok(())
    }

    /// Logical pages this preconditioning fills on a device of `logical_pages`.
    pub fn filled_pages(&self, logical_pages: u32) -> u32 {
        (logical_pages as f64 * self.fill_fraction).floor() as u32
    }
}

/// Stores the preconditioning payload of logical page `lpn` into physical page `ppn`.
fn store_tokens(nand: &mut Nand, ppn: u32, lpn: u32, spp: u32, unit: usize) {
    if unit == 0 {
        return;
    }
    let page = nand.store_mut().page_mut(ppn);
    for s in 0..spp as usize {
        let lba = lpn as u64 * spp as u64 + s as u64;
        fill_unit(sector_token(lba, 0), &mut page[s * unit..(s + 1) * unit]);
    }
}

/// Writes logical page `lpn` whole, untimed, with its preconditioning payload.
fn write_untimed(
    ftl: &mut Ftl,
    nand: &mut Nand,
    lpn: u32,
    spp: u32,
    unit: usize,
) -> Result<(), SsdError> {
    let mut fill = |nand: &mut Nand, ppn: u32, _old: u32| store_tokens(nand, ppn, lpn, spp, unit);
    ftl.write_page(nand, lpn, true, 0, false, &mut fill)?;
    Ok(())
}

impl Ssd {
    /// Applies `p`. Every written sector holds `sector_token(lba, 0)`, so an oracle can know
    /// the content without having watched it being written. Counters are reset afterwards.
    pub fn precondition(&mut self, p: &Precondition, seed: u64) -> Result<(), SsdError> {
        p.validate()?;
        let filled = p.filled_pages(self.logical_pages());
        let (nand, ftl, spp, unit) = self.parts();
        ftl.set_untimed(true);
        let result = (|| -> Result<(), SsdError> {
            if p.pattern == PreconditionPattern::Random {
                let mut fill =
                    |nand: &mut Nand, ppn: u32, lpn: u32| store_tokens(nand, ppn, lpn, spp, unit);
                ftl.construct_random_steady_state(nand, filled, seed, &mut fill)?;
            } else {
                for lpn in 0..filled {
                    write_untimed(ftl, nand, lpn, spp, unit)?;
                }
            }
            if p.pattern != PreconditionPattern::Sequential && filled > 0 {
                let mut rng = SimRng::fork(seed, 0x5052_4543); // "PREC"
                let overwrites = (filled as f64 * p.overwrite_rounds) as u64;
                for _ in 0..overwrites {
                    write_untimed(ftl, nand, rng.below(filled as u64) as u32, spp, unit)?;
                }
            }
            Ok(())
        })();
        ftl.set_untimed(false);
        result?;
        // Every page below `filled` now holds data in all its sectors.
        self.forget_trimmed_below(filled);
        self.reset_counters();
        Ok(())
    }
}
