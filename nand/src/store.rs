//! The bytes the medium holds: the payload of every sector of every page, and the host's
//! per-sector OOB tag bytes.
//!
//! Both live in flat zero-initialised vectors. The allocator hands such vectors out as
//! untouched zero pages, so a 64 GiB device costs resident memory only for the pages that
//! were actually written.

use serde::{Deserialize, Serialize};

use crate::{Geometry, NandError};

/// What a write carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum PayloadMode {
    /// Timing only: nothing is stored and nothing can be checked.
    None,
    /// An 8-byte fingerprint per sector, enough to prove every read returns the right version.
    #[default]
    Token,
    /// Every byte.
    Full,
}

impl PayloadMode {
    /// Bytes stored per sector in this mode.
    pub fn unit_bytes(self, sector_bytes: u32) -> u32 {
        match self {
            PayloadMode::None => 0,
            PayloadMode::Token => 8,
            PayloadMode::Full => sector_bytes,
        }
    }

    /// The mode's name in configuration files.
    pub fn name(self) -> &'static str {
        match self {
            PayloadMode::None => "none",
            PayloadMode::Token => "token",
            PayloadMode::Full => "full",
        }
    }
}

/// Payload and OOB tag storage for one medium.
#[derive(Debug)]
pub struct PageStore {
    mode: PayloadMode,
    unit_bytes: usize,
    sectors_per_page: usize,
    pages: usize,
    data: Vec<u8>,
    tag_bytes_per_sector: usize,
    tags: Vec<u8>,
}

/// Bytes of each page's OOB area the controller keeps for itself (the logical page number
/// and flags), so they are not available for host tags.
pub const CONTROLLER_OOB_BYTES: u32 = 8;

/// Bytes the FTLs keep per flash page besides the payload (mapping entries both ways and
/// flags, about nine), for the memory estimate of [`PageStore::check_fits_in_memory`].
const METADATA_BYTES_PER_PAGE: u64 = 9;

impl PageStore {
    /// Refuses a medium whose payload store and per-page metadata could not be allocated on
    /// this machine at all. The store is allocated as untouched zero pages, so a device
    /// larger than what the run writes costs only what it writes, but the kernel still
    /// refuses an allocation beyond its memory and swap, and the process then aborted in the
    /// allocator, naming a byte count but no setting (65,535 channels, found by mutating
    /// soak configurations). Where the limit cannot be read, nothing is refused.
    pub fn check_fits_in_memory(geometry: &Geometry, mode: PayloadMode) -> Result<(), NandError> {
        let pages = geometry.pages_total();
        let payload_bytes = pages
            * geometry.sectors_per_page() as u64
            * mode.unit_bytes(geometry.sector_bytes) as u64;
        let needed_bytes = payload_bytes + pages * METADATA_BYTES_PER_PAGE;
        let Some(memory_bytes) = memory_limit_bytes() else {
            return Ok(());
        };
        if needed_bytes <= memory_bytes {
            return Ok(());
        }
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        Err(NandError::Config(format!(
            "the geometry's {pages} pages need {:.1} GiB of memory with payload = \"{}\" \
             ({:.1} GiB of payload), more than this machine's {:.1} GiB of memory and swap: \
             use a smaller geometry{}",
            gib(needed_bytes),
            mode.name(),
            gib(payload_bytes),
            gib(memory_bytes),
            match mode {
                PayloadMode::Full => ", or payload = \"token\" or \"none\"",
                PayloadMode::Token => ", or payload = \"none\"",
                PayloadMode::None => "",
            }
        )))
    }

    pub fn new(geometry: &Geometry, mode: PayloadMode) -> Self {
        let unit_bytes = mode.unit_bytes(geometry.sector_bytes) as usize;
        let spp = geometry.sectors_per_page() as usize;
        let pages = geometry.pages_total() as usize;
        let host_oob = geometry
            .oob_bytes_per_page
            .saturating_sub(CONTROLLER_OOB_BYTES) as usize;
        Self {
            mode,
            unit_bytes,
            sectors_per_page: spp,
            pages,
            data: vec![0u8; pages * spp * unit_bytes],
            tag_bytes_per_sector: host_oob / spp,
            tags: Vec::new(),
        }
    }

    pub fn mode(&self) -> PayloadMode {
        self.mode
    }
    /// Bytes stored per sector.
    pub fn unit_bytes(&self) -> usize {
        self.unit_bytes
    }
    /// Bytes of host tag each sector's share of the OOB area can hold.
    pub fn tag_bytes_per_sector(&self) -> usize {
        self.tag_bytes_per_sector
    }
    pub fn page_payload_bytes(&self) -> usize {
        self.unit_bytes * self.sectors_per_page
    }

    #[inline]
    fn range(&self, ppn: u32) -> std::ops::Range<usize> {
        let len = self.page_payload_bytes();
        let start = ppn as usize * len;
        start..start + len
    }

    /// The stored payload of a page (empty in `none` mode).
    #[inline]
    pub fn page(&self, ppn: u32) -> &[u8] {
        &self.data[self.range(ppn)]
    }

    #[inline]
    pub fn page_mut(&mut self, ppn: u32) -> &mut [u8] {
        let r = self.range(ppn);
        &mut self.data[r]
    }

    /// Copies a page's payload and tags to another page (garbage collection, eviction).
    #[inline]
    pub fn copy_page(&mut self, src: u32, dst: u32) {
        if self.unit_bytes > 0 {
            let s = self.range(src);
            let d = self.range(dst).start;
            self.data.copy_within(s, d);
        }
        if !self.tags.is_empty() {
            let len = self.tag_bytes_per_sector * self.sectors_per_page;
            let s = src as usize * len;
            self.tags.copy_within(s..s + len, dst as usize * len);
        }
    }

    /// Forgets a page's content (a failed program leaves nothing readable).
    pub fn clear_page(&mut self, ppn: u32) {
        if self.unit_bytes > 0 {
            self.page_mut(ppn).fill(0);
        }
        if !self.tags.is_empty() {
            self.page_tags_mut(ppn).fill(0);
        }
    }

    /// A page's host tags, or None when no write ever carried tags.
    pub fn page_tags(&self, ppn: u32) -> Option<&[u8]> {
        if self.tags.is_empty() {
            return None;
        }
        let len = self.tag_bytes_per_sector * self.sectors_per_page;
        let s = ppn as usize * len;
        Some(&self.tags[s..s + len])
    }

    /// A page's host tags for writing; the tag area is allocated on first use.
    pub fn page_tags_mut(&mut self, ppn: u32) -> &mut [u8] {
        let len = self.tag_bytes_per_sector * self.sectors_per_page;
        if self.tags.is_empty() {
            self.tags = vec![0u8; self.pages * len];
        }
        let s = ppn as usize * len;
        &mut self.tags[s..s + len]
    }
}

/// The fingerprint of version `version` of sector `lba`: what a `token`-mode write stores and
/// what a `full`-mode write expands into bytes. Never zero, because zero means "never written
/// or trimmed" (the device reads back zeroes there).
#[inline]
pub fn sector_token(lba: u64, version: u64) -> u64 {
    let mut x = lba
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(version.wrapping_mul(0xc2b2_ae3d_27d4_eb4f));
    x ^= x >> 31;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 29;
    x | 1
}

/// The `i`-th 8-byte word of a full-mode sector carrying `token` (word 0 is the token itself,
/// so a reader can tell which version it got).
#[inline]
fn unit_word(token: u64, i: usize) -> u64 {
    if i == 0 {
        return token;
    }
    let mut z = token.wrapping_add((i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Writes the payload unit of one sector carrying `token`: the token itself in `token` mode,
/// or a whole sector of bytes derived from it in `full` mode (every 8-byte word differs, so a
/// misplaced or torn sector is caught). Token zero is all zeroes, as an unwritten sector reads.
#[inline]
pub fn fill_unit(token: u64, out: &mut [u8]) {
    if token == 0 {
        out.fill(0);
        return;
    }
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        let bytes = unit_word(token, i).to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
}

/// Whether a stored unit is exactly what `fill_unit(token)` writes.
#[inline]
pub fn unit_matches(token: u64, unit: &[u8]) -> bool {
    unit.chunks(8).enumerate().all(|(i, chunk)| {
        let word = if token == 0 { 0 } else { unit_word(token, i) };
        chunk == &word.to_le_bytes()[..chunk.len()]
    })
}

/// The token a stored unit carries (its first eight bytes), for reporting mismatches.
#[inline]
pub fn unit_token(unit: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&unit[..8]);
    u64::from_le_bytes(word)
}

/// The most memory one allocation may ask for: the machine's memory and swap (`MemTotal` and
/// `SwapTotal` of `/proc/meminfo`), which is what Linux's default overcommit policy lets a
/// single allocation reserve, untouched pages included. None if it cannot be read.
fn memory_limit_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = meminfo.lines().find(|l| l.starts_with(name))?;
        line.split_whitespace().nth(1)?.parse::<u64>().ok()
    };
    Some((field("MemTotal:")? + field("SwapTotal:").unwrap_or(0)) * 1024)
}
