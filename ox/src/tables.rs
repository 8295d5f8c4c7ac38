//! The controller's recoverable tables (Table 2 of the paper) and their hierarchies: MAP
//! with MAP_S and MAP_T, GBITV with GBITV_S and GBITV_T, WEAR with WEAR_S.
//!
//! Every large table is cut into WBLOCK-sized pages. A small table ("_S") holds the flash
//! address of every page of the large one, and a tiny table ("_T") the flash address of every
//! page of the small one, so that a checkpoint writes only the pages that changed and the
//! checkpoint record holds only the tiny tables (§6.2).

use std::collections::{BTreeMap, BTreeSet};

use crate::media::{Ppa, Ppn};

/// No flash address: a table page never written (all its entries are empty).
pub const NO_PPN: Ppn = u32::MAX;

/// Which table a table page belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TableId {
    Map,
    MapS,
    Gbitv,
    GbitvS,
    Wear,
}

/// One page of a table as written to flash.
#[derive(Debug, Clone, PartialEq)]
pub struct TablePage {
    pub table: TableId,
    pub index: u32,
    pub words: Vec<u64>,
}

/// A MAP entry (8 bytes): the RBLOCK address of an LPAGE and, in the top bit, whether the
/// LPAGE's latest version sits in the controller's write cache (§3.2.2). OX here acknowledges
/// writes only once they are on flash (the paper's write-through mode), so the flag is never
/// set on the install path; the encoding keeps room for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapEntry(pub u64);

impl MapEntry {
    const CACHED: u64 = 1 << 63;
    pub const UNMAPPED: MapEntry = MapEntry(Ppa::NONE.0);

    pub fn new(ppa: Ppa) -> MapEntry {
        MapEntry(ppa.0 & !Self::CACHED)
    }
    pub fn ppa(self) -> Ppa {
        Ppa(self.0 & !Self::CACHED)
    }
    pub fn cached(self) -> bool {
        self.0 & Self::CACHED != 0
    }
    /// The entry with its cached flag set or cleared.
    pub fn with_cached(self, cached: bool) -> MapEntry {
        if cached {
            MapEntry(self.0 | Self::CACHED)
        } else {
            MapEntry(self.0 & !Self::CACHED)
        }
    }
    /// The word the entry has on flash: the cached flag describes the controller's DRAM and
    /// is never written (a page loaded again gets its flags back from the side table).
    pub fn durable_word(self) -> u64 {
        self.0 & !Self::CACHED
    }
}

/// A small table indexing the pages of a larger one: the flash address of each page, and
/// which of its own pages changed since they were last written.
#[derive(Debug, Clone, PartialEq)]
pub struct Directory {
    pub ppns: Vec<Ppn>,
    /// Entries per page of this directory (16-byte entries for MAP_S as in the paper, 8 for
    /// GBITV_S and WEAR_S).
    pub entries_per_page: usize,
    pub dirty_pages: BTreeSet<u32>,
}

impl Directory {
    pub fn new(entries: usize, entries_per_page: usize) -> Directory {
        Directory {
            ppns: vec![NO_PPN; entries],
            entries_per_page,
            dirty_pages: BTreeSet::new(),
        }
    }
    pub fn pages(&self) -> u32 {
        self.ppns.len().div_ceil(self.entries_per_page) as u32
    }
    /// Points entry `i` at `ppn` and returns the previous address.
    pub fn set(&mut self, i: usize, ppn: Ppn) -> Ppn {
        let old = std::mem::replace(&mut self.ppns[i], ppn);
        if old != ppn {
            self.dirty_pages.insert((i / self.entries_per_page) as u32);
        }
        old
    }
    /// The words of directory page `page` as written to flash.
    pub fn page_words(&self, page: u32) -> Vec<u64> {
        let s = page as usize * self.entries_per_page;
        let e = (s + self.entries_per_page).min(self.ppns.len());
        self.ppns[s..e].iter().map(|&p| p as u64).collect()
    }
    /// Loads directory page `page` from the words read from flash.
    pub fn load_page(&mut self, page: u32, words: &[u64]) {
        let s = page as usize * self.entries_per_page;
        for (i, w) in words.iter().enumerate() {
            if let Some(slot) = self.ppns.get_mut(s + i) {
                *slot = *w as Ppn;
            }
        }
    }
}

#[derive(Debug, Clone)]
struct CachedMapPage {
    entries: Vec<MapEntry>,
    dirty: bool,
    last_use: u64,
    /// When the page is in controller DRAM: a page still being read from flash is in the
    /// cache (so it is not loaded twice) but whoever needs it waits for the read, as behind
    /// OX's per-page lock (§7.2.5).
    ready_ns: u64,
}

/// What the MAP cache needs before an entry can be touched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MapMiss {
    /// The page is cached, or being loaded: it is in DRAM at `ready_ns`.
    Hit { ready_ns: u64 },
    /// The page must be read from `ppn` (or created empty when `ppn` is `NO_PPN`).
    Load { page: u32, ppn: Ppn },
}

/// A MAP page pushed out of the cache that must be written before it is dropped.
#[derive(Debug, Clone, PartialEq)]
pub struct EvictedMapPage {
    pub page: u32,
    pub words: Vec<u64>,
}

/// MAP, its on-demand page cache, MAP_S (a `Directory` of MAP pages) and MAP_T (the flash
/// addresses of MAP_S pages).
#[derive(Debug, Clone)]
pub struct Map {
    pub entries_per_page: u64,
    cache: BTreeMap<u32, CachedMapPage>,
    lru: BTreeMap<u64, u32>,
    capacity_pages: usize,
    tick: u64,
    pub map_s: Directory,
    pub map_t: Vec<Ppn>,
    /// Cache statistics.
    pub hits: u64,
    pub misses: u64,
}

impl Map {
    pub fn new(lpids: u64, entries_per_page: u64, capacity_pages: usize) -> Map {
        let pages = lpids.div_ceil(entries_per_page) as usize;
        // MAP_S entries are 16 bytes in the paper (flash and cache address), so a WBLOCK of
        // MAP_S holds half as many entries as a MAP page.
        let map_s = Directory::new(pages, (entries_per_page / 2).max(1) as usize);
        let map_t = vec![NO_PPN; map_s.pages() as usize];
        Map {
            entries_per_page,
            cache: BTreeMap::new(),
            lru: BTreeMap::new(),
            capacity_pages: capacity_pages.max(1),
            tick: 0,
            map_s,
            map_t,
            hits: 0,
            misses: 0,
        }
    }

    pub fn pages(&self) -> u32 {
        self.map_s.ppns.len() as u32
    }
    pub fn page_of(&self, lpid: u64) -> u32 {
        (lpid / self.entries_per_page) as u32
    }

    /// Whether the MAP page holding `lpid` is cached; if not, where to load it from.
    pub fn probe(&mut self, lpid: u64) -> MapMiss {
        let page = self.page_of(lpid);
        if let Some(c) = self.cache.get(&page) {
            self.hits += 1;
            MapMiss::Hit {
                ready_ns: c.ready_ns,
            }
        } else {
            self.misses += 1;
            MapMiss::Load {
                page,
                ppn: self.map_s.ppns[page as usize],
            }
        }
    }

    /// Lets the cache keep every page it loads: a read-only device cannot write a dirty
    /// page out, so none may be pushed out.
    pub fn grow_without_bound(&mut self) {
        self.capacity_pages = usize::MAX;
    }

    /// Frees a cache slot for a page about to be loaded, when the cache is full: the least
    /// recently used page leaves, and is returned if it is dirty (it must be written before
    /// its slot is reused).
    pub fn make_room(&mut self) -> Option<EvictedMapPage> {
        if self.cache.len() < self.capacity_pages {
            return None;
        }
        let (_, victim) = self.lru.pop_first()?;
        let v = self.cache.remove(&victim)?;
        v.dirty.then(|| EvictedMapPage {
            page: victim,
            words: v.entries.iter().map(|e| e.durable_word()).collect(),
        })
    }

    /// Puts a page (its words, or `None` for a page never written) in the cache, in DRAM from
    /// `ready_ns` on, and returns the dirty page it pushed out, if any.
    pub fn insert_page(
        &mut self,
        page: u32,
        words: Option<&[u64]>,
        ready_ns: u64,
    ) -> Option<EvictedMapPage> {
        let n = self.entries_per_page as usize;
        let entries = match words {
            Some(w) => (0..n)
                .map(|i| w.get(i).map_or(MapEntry::UNMAPPED, |&x| MapEntry(x)))
                .collect(),
            None => vec![MapEntry::UNMAPPED; n],
        };
        let evicted = if self.cache.contains_key(&page) {
            None
        } else {
            self.make_room()
        };
        self.tick += 1;
        if let Some(old) = self.cache.insert(
            page,
            CachedMapPage {
                entries,
                dirty: false,
                last_use: self.tick,
                ready_ns,
            },
        ) {
            self.lru.remove(&old.last_use);
        }
        self.lru.insert(self.tick, page);
        evicted
    }

    fn touch(&mut self, page: u32) -> Option<&mut CachedMapPage> {
        self.tick += 1;
        let tick = self.tick;
        let c = self.cache.get_mut(&page)?;
        self.lru.remove(&c.last_use);
        c.last_use = tick;
        self.lru.insert(tick, page);
        self.cache.get_mut(&page)
    }

    /// The entry of `lpid`; its page must be cached.
    pub fn get(&mut self, lpid: u64) -> Option<MapEntry> {
        let page = self.page_of(lpid);
        let i = (lpid % self.entries_per_page) as usize;
        self.touch(page).map(|c| c.entries[i])
    }

    /// Sets the entry of `lpid` and returns the old one; its page must be cached.
    pub fn set(&mut self, lpid: u64, entry: MapEntry) -> Option<MapEntry> {
        let page = self.page_of(lpid);
        let i = (lpid % self.entries_per_page) as usize;
        let c = self.touch(page)?;
        let old = std::mem::replace(&mut c.entries[i], entry);
        c.dirty = true;
        Some(old)
    }

    /// Sets or clears the cached flag of `lpid`'s entry; its page must be cached. The flag is
    /// not durable state, so the page does not become dirty.
    pub fn set_cached(&mut self, lpid: u64, cached: bool) -> Option<()> {
        let page = self.page_of(lpid);
        let i = (lpid % self.entries_per_page) as usize;
        let c = self.cache.get_mut(&page)?;
        c.entries[i] = c.entries[i].with_cached(cached);
        Some(())
    }

    /// Cached pages that changed since they were last written.
    pub fn dirty_cached_pages(&self) -> Vec<u32> {
        self.cache
            .iter()
            .filter(|(_, c)| c.dirty)
            .map(|(&p, _)| p)
            .collect()
    }

    /// One entry of a cached page as flash would hold it, if the page is cached (no LRU
    /// update: an inspection).
    pub fn cached_entry(&self, page: u32, index: usize) -> Option<u64> {
        self.cache
            .get(&page)
            .and_then(|c| c.entries.get(index))
            .map(|e| e.durable_word())
    }

    /// The words of a cached page as flash would hold them, if cached.
    pub fn cached_words(&self, page: u32) -> Option<Vec<u64>> {
        self.cache
            .get(&page)
            .map(|c| c.entries.iter().map(|e| e.durable_word()).collect())
    }

    /// Records that a page was written to `ppn` (by a checkpoint or an eviction) and returns
    /// the previous address; a cached copy becomes clean.
    pub fn page_written(&mut self, page: u32, ppn: Ppn) -> Ppn {
        if let Some(c) = self.cache.get_mut(&page) {
            c.dirty = false;
        }
        self.map_s.set(page as usize, ppn)
    }
}

/// GBITV: one bit per RBLOCK, set while the RBLOCK holds a live LPAGE (the paper keeps the
/// complement, the garbage bit; for a written RBLOCK the two carry the same information),
/// with a per-EBLOCK count, GBITV_S (a `Directory` of GBITV pages) and GBITV_T.
#[derive(Debug, Clone)]
pub struct Gbitv {
    words_per_eblock: usize,
    bits: Vec<u64>,
    valid: Vec<u32>,
    eblocks_per_page: usize,
    dirty_pages: BTreeSet<u32>,
    pub gbitv_s: Directory,
    pub gbitv_t: Vec<Ppn>,
}

impl Gbitv {
    pub fn new(eblocks: u32, rblocks_per_eblock: u32, wblock_bytes: u32) -> Gbitv {
        let words_per_eblock = (rblocks_per_eblock as usize).div_ceil(64);
        let eblocks_per_page = ((wblock_bytes as usize / 8) / words_per_eblock).max(1);
        let pages = (eblocks as usize).div_ceil(eblocks_per_page);
        let gbitv_s = Directory::new(pages, wblock_bytes as usize / 8);
        let gbitv_t = vec![NO_PPN; gbitv_s.pages() as usize];
        Gbitv {
            words_per_eblock,
            bits: vec![0; eblocks as usize * words_per_eblock],
            valid: vec![0; eblocks as usize],
            eblocks_per_page,
            dirty_pages: BTreeSet::new(),
            gbitv_s,
            gbitv_t,
        }
    }

    pub fn pages(&self) -> u32 {
        self.gbitv_s.ppns.len() as u32
    }

    /// Sets the bit of one RBLOCK; returns whether it changed.
    pub fn set(&mut self, block: u32, rblock: u32, live: bool) -> bool {
        let w = block as usize * self.words_per_eblock + rblock as usize / 64;
        let mask = 1u64 << (rblock % 64);
        let was = self.bits[w] & mask != 0;
        if was == live {
            return false;
        }
        if live {
            self.bits[w] |= mask;
            self.valid[block as usize] += 1;
        } else {
            self.bits[w] &= !mask;
            self.valid[block as usize] -= 1;
        }
        self.dirty_pages
            .insert((block as usize / self.eblocks_per_page) as u32);
        true
    }

    /// Live RBLOCKs of an EBLOCK.
    pub fn valid(&self, block: u32) -> u32 {
        self.valid[block as usize]
    }

    /// Clears an EBLOCK's bits (it was erased).
    pub fn clear_block(&mut self, block: u32) {
        let s = block as usize * self.words_per_eblock;
        if self.bits[s..s + self.words_per_eblock]
            .iter()
            .any(|&w| w != 0)
        {
            self.bits[s..s + self.words_per_eblock].fill(0);
            self.dirty_pages
                .insert((block as usize / self.eblocks_per_page) as u32);
        }
        self.valid[block as usize] = 0;
    }

    /// The live RBLOCK indices of an EBLOCK, in order.
    pub fn live_rblocks(&self, block: u32) -> Vec<u32> {
        let s = block as usize * self.words_per_eblock;
        let mut out = Vec::new();
        for (wi, &w) in self.bits[s..s + self.words_per_eblock].iter().enumerate() {
            let mut w = w;
            while w != 0 {
                let b = w.trailing_zeros();
                out.push(wi as u32 * 64 + b);
                w &= w - 1;
            }
        }
        out
    }

    pub fn take_dirty_pages(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.dirty_pages).into_iter().collect()
    }
    pub fn mark_dirty(&mut self, page: u32) {
        self.dirty_pages.insert(page);
    }

    /// The words of GBITV page `page`.
    pub fn page_words(&self, page: u32) -> Vec<u64> {
        let s = page as usize * self.eblocks_per_page * self.words_per_eblock;
        let e = (s + self.eblocks_per_page * self.words_per_eblock).min(self.bits.len());
        self.bits[s..e].to_vec()
    }

    /// Loads GBITV page `page` from flash and recounts its EBLOCKs.
    pub fn load_page(&mut self, page: u32, words: &[u64]) {
        let s = page as usize * self.eblocks_per_page * self.words_per_eblock;
        for (i, &w) in words.iter().enumerate() {
            if let Some(slot) = self.bits.get_mut(s + i) {
                *slot = w;
            }
        }
        let first = page as usize * self.eblocks_per_page;
        for b in first..(first + self.eblocks_per_page).min(self.valid.len()) {
            let s = b * self.words_per_eblock;
            self.valid[b] = self.bits[s..s + self.words_per_eblock]
                .iter()
                .map(|w| w.count_ones())
                .sum();
        }
    }

    /// Every bit, for comparisons in tests.
    pub fn raw_bits(&self) -> &[u64] {
        &self.bits
    }
}

/// WEAR: the erase count of every EBLOCK, with WEAR_S (a `Directory` of WEAR pages, small
/// enough to sit in the checkpoint record).
#[derive(Debug, Clone)]
pub struct Wear {
    counts: Vec<u32>,
    per_page: usize,
    dirty_pages: BTreeSet<u32>,
    pub wear_s: Directory,
}

impl Wear {
    pub fn new(eblocks: u32, wblock_bytes: u32) -> Wear {
        let per_page = wblock_bytes as usize / 4;
        let pages = (eblocks as usize).div_ceil(per_page);
        Wear {
            counts: vec![0; eblocks as usize],
            per_page,
            dirty_pages: BTreeSet::new(),
            wear_s: Directory::new(pages, usize::MAX >> 1),
        }
    }
    pub fn get(&self, block: u32) -> u32 {
        self.counts[block as usize]
    }
    pub fn set(&mut self, block: u32, count: u32) {
        if self.counts[block as usize] != count {
            self.counts[block as usize] = count;
            self.dirty_pages
                .insert((block as usize / self.per_page) as u32);
        }
    }
    pub fn pages(&self) -> u32 {
        self.wear_s.ppns.len() as u32
    }
    pub fn take_dirty_pages(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.dirty_pages).into_iter().collect()
    }
    pub fn mark_dirty(&mut self, page: u32) {
        self.dirty_pages.insert(page);
    }
    pub fn page_words(&self, page: u32) -> Vec<u64> {
        let s = page as usize * self.per_page;
        let e = (s + self.per_page).min(self.counts.len());
        self.counts[s..e].iter().map(|&c| c as u64).collect()
    }
    pub fn load_page(&mut self, page: u32, words: &[u64]) {
        let s = page as usize * self.per_page;
        for (i, &w) in words.iter().enumerate() {
            if let Some(slot) = self.counts.get_mut(s + i) {
                *slot = w as u32;
            }
        }
    }
}
