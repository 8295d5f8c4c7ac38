//! The MV-FTL mapping table (§III-B, Fig. 4).
//!
//! One 32-bit entry per logical page. The `ppn_bits` least significant bits hold the
//! physical page of the newest version (`page_size * 2^ppn_bits` covers the medium); the
//! remaining `ptf_bits` are PT/F:
//!
//! * all zeroes: the page has one version (a full page, or the only partial one);
//! * top bit clear, value `d > 0` (direct indexing): exactly two versions, the older at
//!   `(newest − d) mod 2^ppn_bits`;
//! * top bit set (indirect indexing): the other bits index a chain of older versions in
//!   the version table of the page's group of `2^(ptf_bits−1) − 1` logical pages, so every
//!   page of a group can have a chain with the same few bits.
//!
//! An entry of all ones is unmapped. Which sectors each version holds is not here: it is the
//! written-sector pattern in the OOB area of the version's physical page (see `ftl.rs`).

use std::collections::BTreeMap;

use crate::WaflashError;

pub(crate) const UNMAPPED: u32 = u32::MAX;

#[derive(Debug, Default)]
struct ChainSlab {
    chains: Vec<Vec<u32>>,
    free: Vec<u32>,
    used: u32,
}

#[derive(Debug)]
pub(crate) struct MappingTable {
    ppn_bits: u32,
    ppn_mask: u32,
    ptf_bits: u32,
    entries: Vec<u32>,
    slabs: BTreeMap<u32, ChainSlab>,
    /// Entries currently using direct and indirect indexing.
    pub direct_entries: u64,
    pub indirect_entries: u64,
}

impl MappingTable {
    pub fn new(logical_pages: u32, physical_pages: u64) -> Result<Self, WaflashError> {
        // The smallest width with 2^bits > pages, so the all-ones PPN is never a real page
        // and an all-ones entry can mean unmapped.
        let ppn_bits = (64 - physical_pages.leading_zeros()).max(1);
        if ppn_bits > 30 {
            return Err(WaflashError::Config(format!(
                "{physical_pages} physical pages need {ppn_bits} bits, leaving fewer than 2 \
                 PT/F bits in a 32-bit mapping entry"
            )));
        }
        Ok(Self {
            ppn_bits,
            ppn_mask: (1u32 << ppn_bits) - 1,
            ptf_bits: 32 - ppn_bits,
            entries: vec![UNMAPPED; logical_pages as usize],
            slabs: BTreeMap::new(),
            direct_entries: 0,
            indirect_entries: 0,
        })
    }

    pub fn logical_pages(&self) -> u32 {
        self.entries.len() as u32
    }

    pub fn ppn_bits(&self) -> u32 {
        self.ppn_bits
    }

    pub fn ptf_bits(&self) -> u32 {
        self.ptf_bits
    }

    fn top(&self) -> u32 {
        1u32 << (self.ptf_bits - 1)
    }

    /// A group holds as many logical pages as its version table holds chains, so a chain
    /// can always be found and `set_versions` never fails.
    fn group_of(&self, lpn: u32) -> u32 {
        lpn / (self.top() - 1)
    }

    /// The raw entry (for tests and the documentation of the layout).
    pub fn entry(&self, lpn: u32) -> u32 {
        self.entries[lpn as usize]
    }

    /// Newest version, if mapped.
    #[inline]
    pub fn newest(&self, lpn: u32) -> Option<u32> {
        let e = self.entries[lpn as usize];
        (e != UNMAPPED).then_some(e & self.ppn_mask)
    }

    /// Whether the page has more than one version.
    #[inline]
    pub fn is_multi(&self, lpn: u32) -> bool {
        let e = self.entries[lpn as usize];
        e != UNMAPPED && e >> self.ppn_bits != 0
    }

    /// Every version, newest first (empty when unmapped).
    pub fn versions(&self, lpn: u32) -> Vec<u32> {
        self.iter_versions(lpn).collect()
    }

    /// Every version, newest first, without collecting them (the read path and the
    /// buffer's congestion test ask on every access).
    pub fn iter_versions(&self, lpn: u32) -> impl Iterator<Item = u32> + '_ {
        let e = self.entries[lpn as usize];
        let newest = e & self.ppn_mask;
        let ptf = e >> self.ppn_bits;
        let (first, older, chain): (Option<u32>, Option<u32>, &[u32]) = if e == UNMAPPED {
            (None, None, &[])
        } else if ptf == 0 {
            (Some(newest), None, &[])
        } else if ptf & self.top() == 0 {
            (
                Some(newest),
                Some(newest.wrapping_sub(ptf) & self.ppn_mask),
                &[],
            )
        } else {
            let slot = ptf & (self.top() - 1);
            let slab = &self.slabs[&self.group_of(lpn)];
            (Some(newest), None, &slab.chains[slot as usize])
        };
        first.into_iter().chain(older).chain(chain.iter().copied())
    }

    fn release_chain(&mut self, lpn: u32) {
        let e = self.entries[lpn as usize];
        if e == UNMAPPED {
            return;
        }
        let ptf = e >> self.ppn_bits;
        if ptf == 0 {
            return;
        }
        if ptf & self.top() == 0 {
            self.direct_entries -= 1;
            return;
        }
        self.indirect_entries -= 1;
        let group = self.group_of(lpn);
        let slot = ptf & (self.top() - 1);
        let slab = self
            .slabs
            .get_mut(&group)
            .expect("indirect entry has a slab");
        slab.chains[slot as usize].clear();
        slab.free.push(slot);
        slab.used -= 1;
        if slab.used == 0 {
            self.slabs.remove(&group);
        }
    }

    /// Sets every version of `lpn`, newest first (empty unmaps it).
    pub fn set_versions(&mut self, lpn: u32, versions: &[u32]) {
        let Some((&newest, older)) = versions.split_first() else {
            self.release_chain(lpn);
            self.entries[lpn as usize] = UNMAPPED;
            return;
        };
        debug_assert!(newest <= self.ppn_mask);
        if older.len() == 1 {
            let d = newest.wrapping_sub(older[0]) & self.ppn_mask;
            if d != 0 && d < self.top() {
                self.release_chain(lpn);
                self.entries[lpn as usize] = newest | d << self.ppn_bits;
                self.direct_entries += 1;
                return;
            }
        }
        if older.is_empty() {
            self.release_chain(lpn);
            self.entries[lpn as usize] = newest;
            return;
        }
        // Indirect: reuse the page's own chain if it has one.
        let e = self.entries[lpn as usize];
        let group = self.group_of(lpn);
        let ptf = if e == UNMAPPED { 0 } else { e >> self.ppn_bits };
        if ptf & self.top() != 0 {
            let slot = ptf & (self.top() - 1);
            let slab = self
                .slabs
                .get_mut(&group)
                .expect("indirect entry has a slab");
            slab.chains[slot as usize].clear();
            slab.chains[slot as usize].extend_from_slice(older);
            self.entries[lpn as usize] = newest | ptf << self.ppn_bits;
            return;
        }
        let capacity = self.top() - 1;
        let slab = self.slabs.entry(group).or_default();
        let slot = match slab.free.pop() {
            Some(s) => s,
            None => {
                assert!(
                    (slab.chains.len() as u32) < capacity,
                    "a group has no more pages than chains"
                );
                slab.chains.push(Vec::new());
                slab.chains.len() as u32 - 1
            }
        };
        slab.used += 1;
        slab.chains[slot as usize].extend_from_slice(older);
        let top = self.top();
        self.release_chain(lpn);
        self.entries[lpn as usize] = newest | (top | slot) << self.ppn_bits;
        self.indirect_entries += 1;
    }
}
