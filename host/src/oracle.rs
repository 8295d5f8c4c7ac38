//! The oracle: what every sector should hold, so that every read is checked.

use afa_nand::{sector_token, unit_matches, unit_token};
use afa_sim::TimeNs;

/// One wrong read, for the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mismatch {
    pub lba: u64,
    pub expected_token: u64,
    pub found_token: u64,
    pub at_ns: TimeNs,
}

/// The expected token of every sector (0 = never written or trimmed). Sectors below
/// `preconditioned` start with their preconditioning token, version 0.
#[derive(Debug)]
pub struct Oracle {
    tokens: Vec<u64>,
    version: u64,
    reads_checked: u64,
    mismatches: u64,
    first: Vec<Mismatch>,
}

impl Oracle {
    const KEPT_MISMATCHES: usize = 16;

    pub fn new(capacity_sectors: u64, preconditioned: u64) -> Self {
        let mut tokens = vec![0u64; capacity_sectors as usize];
        for (lba, t) in tokens.iter_mut().enumerate().take(preconditioned as usize) {
            *t = sector_token(lba as u64, 0);
        }
        Self {
            tokens,
            version: 0,
            reads_checked: 0,
            mismatches: 0,
            first: Vec::new(),
        }
    }

    /// A fresh version number for the next write.
    pub fn next_version(&mut self) -> u64 {
        self.version += 1;
        self.version
    }

    #[inline]
    pub fn set(&mut self, lba: u64, token: u64) {
        self.tokens[lba as usize] = token;
    }

    /// Checks a read of consecutive sectors from `lba`, `unit` payload bytes each.
    pub fn check(&mut self, lba: u64, data: &[u8], unit: usize, now_ns: TimeNs) {
        for (i, got) in data.chunks_exact(unit).enumerate() {
            let want = self.tokens[lba as usize + i];
            self.reads_checked += 1;
            if !unit_matches(want, got) {
                self.mismatches += 1;
                if self.first.len() < Self::KEPT_MISMATCHES {
                    self.first.push(Mismatch {
                        lba: lba + i as u64,
                        expected_token: want,
                        found_token: unit_token(got),
                        at_ns: now_ns,
                    });
                }
            }
        }
    }

    pub fn reads_checked(&self) -> u64 {
        self.reads_checked
    }
    pub fn mismatches(&self) -> u64 {
        self.mismatches
    }
    pub fn first_mismatches(&self) -> &[Mismatch] {
        &self.first
    }
}
