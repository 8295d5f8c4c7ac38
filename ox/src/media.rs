//! The media manager: OX's view of the open-channel medium (`afa_nand::Nand`) in the flash
//! terms of Table 1, with the TAG of every RBLOCK, the bytes of metadata WBLOCKs, and the
//! bookkeeping that tells written from durable when power fails.
//!
//! A WBLOCK is the medium's page (`Ppn`), an RBLOCK its sector (`Ppa`), an EBLOCK its block.
//! User pages carry an 8-byte token (a fingerprint of LPID and version) in the medium's
//! payload store. Metadata WBLOCKs (log blocks, table pages, checkpoint records, bad-block
//! tables) carry structured content, kept here per WBLOCK: it is what the flash holds, so a
//! program that did not finish before a power loss takes it away, and an erase clears it.
//!
//! A served device gives the medium a flash image (`crate::image`) as well: every program,
//! failed program, erase and retirement is mirrored into it, so it holds the bytes of every
//! user RBLOCK and everything needed to rebuild the medium (`Media::restore`). Without one,
//! nothing here changes.

use std::collections::BTreeMap;

use afa_nand::{Nand, NandError, PayloadMode};
use afa_sim::TimeNs;

use crate::image::{EblockRecord, FlashImage, SlotContent};
use crate::log::LogBlock;
use crate::tables::TablePage;
use crate::{CheckpointRecord, OxConfig, OxError};

/// A WBLOCK address: the medium's page number.
pub type Ppn = u32;

/// An RBLOCK address: `ppn × RBLOCKs per WBLOCK + index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ppa(pub u64);

impl Ppa {
    /// No address: an unmapped LPID.
    pub const NONE: Ppa = Ppa(u64::MAX >> 1);

    pub fn is_none(self) -> bool {
        self == Ppa::NONE
    }
}

/// What kind of content a TAG says its RBLOCK holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TagKind {
    /// Erased, torn, or a failed program: nothing readable.
    Empty,
    /// A user LPAGE written by a host write (batch or block).
    User,
    /// A user LPAGE moved by garbage collection.
    Gc,
    /// Part of a log block.
    Log,
    /// Part of a checkpointed table page (MAP, MAP_S, GBITV, GBITV_S, WEAR).
    Table,
    /// Part of a checkpoint record in a well-known block.
    Checkpoint,
    /// Part of a bad-block table.
    Bbt,
    /// Filler of a WBLOCK that had fewer LPAGEs than RBLOCKs.
    Padding,
}

impl TagKind {
    fn code(self) -> u8 {
        match self {
            TagKind::Empty => 0,
            TagKind::User => 1,
            TagKind::Gc => 2,
            TagKind::Log => 3,
            TagKind::Table => 4,
            TagKind::Checkpoint => 5,
            TagKind::Bbt => 6,
            TagKind::Padding => 7,
        }
    }
    fn from_code(code: u8) -> TagKind {
        match code {
            1 => TagKind::User,
            2 => TagKind::Gc,
            3 => TagKind::Log,
            4 => TagKind::Table,
            5 => TagKind::Checkpoint,
            6 => TagKind::Bbt,
            7 => TagKind::Padding,
            _ => TagKind::Empty,
        }
    }
}

/// The controller metadata in the out-of-band area of one RBLOCK (16 bytes, §5.1): the LPID
/// that lets GC find the MAP entry without reading the page, the sequence number of the
/// writer (the write context or GC pass) that lets recovery tell this write from an older one,
/// and the kind. A check byte makes an all-zero (erased) TAG invalid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tag {
    pub lpid: u64,
    /// Writer sequence, 48 bits.
    pub seq: u64,
    pub kind: TagKind,
}

impl Tag {
    pub const EMPTY: Tag = Tag {
        lpid: 0,
        seq: 0,
        kind: TagKind::Empty,
    };

    pub fn new(kind: TagKind, lpid: u64, seq: u64) -> Tag {
        Tag {
            lpid,
            seq: seq & 0xffff_ffff_ffff,
            kind,
        }
    }

    pub(crate) fn encode(self, out: &mut [u8]) {
        out.fill(0);
        if self.kind == TagKind::Empty {
            return;
        }
        out[..8].copy_from_slice(&self.lpid.to_le_bytes());
        out[8..14].copy_from_slice(&self.seq.to_le_bytes()[..6]);
        out[14] = self.kind.code();
        out[15] = check_byte(&out[..15]);
    }

    pub(crate) fn decode(bytes: &[u8]) -> Tag {
        if bytes.len() < 16 || bytes[15] != check_byte(&bytes[..15]) || bytes[14] == 0 {
            return Tag::EMPTY;
        }
        let mut lpid = [0u8; 8];
        lpid.copy_from_slice(&bytes[..8]);
        let mut seq = [0u8; 8];
        seq[..6].copy_from_slice(&bytes[8..14]);
        Tag {
            lpid: u64::from_le_bytes(lpid),
            seq: u64::from_le_bytes(seq),
            kind: TagKind::from_code(bytes[14]),
        }
    }
}

fn check_byte(bytes: &[u8]) -> u8 {
    // Any non-trivial function of the other bytes will do; 0x5a keeps all-zero invalid.
    bytes
        .iter()
        .fold(0x5au8, |acc, b| acc.rotate_left(3) ^ b.wrapping_add(0x11))
}

/// Structured content of a metadata WBLOCK.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaBlob {
    Log(LogBlock),
    Table(TablePage),
    Checkpoint(Box<CheckpointRecord>),
    /// One channel's bad-block table: the bad EBLOCKs of the channel, with its version.
    Bbt {
        version: u64,
        bad: Vec<u32>,
    },
}

/// One RBLOCK of a WBLOCK to be programmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RblockWrite {
    pub tag: Tag,
    /// The payload token (zero for metadata and padding).
    pub token: u64,
    /// For a GC copy, the RBLOCK it copies: a medium with a byte plane copies the bytes
    /// from there.
    pub source: Option<Ppa>,
}

impl RblockWrite {
    /// An RBLOCK of metadata or padding: a TAG, no payload.
    pub fn meta(tag: Tag) -> RblockWrite {
        RblockWrite {
            tag,
            token: 0,
            source: None,
        }
    }
}

/// Counters of the medium in flash terms.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MediaCounters {
    pub wblock_programs: u64,
    pub rblock_reads: u64,
    pub wblock_reads: u64,
    pub erases: u64,
    pub program_failures: u64,
    pub erase_failures: u64,
}

/// The medium as the controller sees it.
#[derive(Debug)]
pub struct Media {
    nand: Nand,
    cfg: OxConfig,
    rblocks_per_wblock: u32,
    wblocks_per_eblock: u32,
    planes_total: u32,
    meta: BTreeMap<Ppn, MetaBlob>,
    /// Programs that may still be running: (end, WBLOCK). What a power loss takes away.
    inflight_programs: Vec<(TimeNs, Ppn)>,
    counters: MediaCounters,
    /// The byte plane of a served device (the flash image); `None` in simulation, which
    /// then runs exactly as without it.
    image: Option<FlashImage>,
    /// EBLOCKs whose next erase fails, for tests that need a given EBLOCK to fail (the
    /// fault probabilities choose their victims at random).
    #[cfg(test)]
    pub(crate) erase_fails: std::collections::BTreeSet<u32>,
    /// WBLOCKs whose next program fails, likewise.
    #[cfg(test)]
    pub(crate) program_fails: std::collections::BTreeSet<Ppn>,
}

impl Media {
    pub fn new(cfg: &OxConfig, seed: u64) -> Result<Media, OxError> {
        cfg.validate()?;
        let geometry = cfg.geometry();
        let nand = Nand::new(
            geometry.clone(),
            cfg.timing.clone(),
            cfg.cell_mode,
            cfg.payload,
            cfg.faults.clone(),
            seed,
        )?;
        if nand.store().tag_bytes_per_sector() < 16 {
            return Err(OxError::Config(
                "the medium's OOB area leaves less than 16 bytes of TAG per RBLOCK".into(),
            ));
        }
        Ok(Media {
            nand,
            cfg: cfg.clone(),
            rblocks_per_wblock: cfg.terms.rblocks_per_wblock(),
            wblocks_per_eblock: cfg.terms.wblocks_per_eblock(),
            planes_total: geometry.planes_total(),
            meta: BTreeMap::new(),
            inflight_programs: Vec::new(),
            counters: MediaCounters::default(),
            image: None,
            #[cfg(test)]
            erase_fails: Default::default(),
            #[cfg(test)]
            program_fails: Default::default(),
        })
    }

    /// A fresh (erased) medium whose content is also kept in `image`, which must be new:
    /// the EBLOCK table records the medium's factory bad blocks.
    pub fn with_image(cfg: &OxConfig, seed: u64, mut image: FlashImage) -> Result<Media, OxError> {
        let mut m = Media::new(cfg, seed)?;
        for block in 0..m.eblocks_total() {
            image.write_record(
                block,
                EblockRecord {
                    generation: 0,
                    erase_count: m.nand.erase_count(block),
                    bad: m.nand.is_bad(block),
                },
            );
        }
        image.sync().map_err(OxError::Image)?;
        m.image = Some(image);
        Ok(m)
    }

    /// Rebuilds the medium from an image a previous process left: every EBLOCK's write
    /// pointer, erase count and bad flag, every WBLOCK's TAGs, tokens and metadata. Returns
    /// the medium and the number of WBLOCKs whose write was cut short (torn programs).
    pub fn restore(
        cfg: &OxConfig,
        seed: u64,
        mut image: FlashImage,
    ) -> Result<(Media, u64), OxError> {
        let mut m = Media::new(cfg, seed)?;
        let wpe = m.wblocks_per_eblock;
        let mut torn = 0;
        for block in 0..m.eblocks_total() {
            let record = image.record(block);
            let first = m.first_ppn(block);
            let slots = (first..first + wpe)
                .map(|ppn| image.load(ppn))
                .collect::<Result<Vec<_>, _>>()?;
            // WBLOCKs are programmed in order, so everything below the last one that is not
            // erased was consumed; a hole there is a program a host crash lost.
            let write_pointer = slots
                .iter()
                .rposition(|s| *s != SlotContent::Erased)
                .map_or(0, |i| i + 1);
            m.nand
                .restore_block(block, write_pointer as u32, record.erase_count, record.bad)?;
            for (i, slot) in slots.into_iter().enumerate().take(write_pointer) {
                let ppn = first + i as u32;
                match slot {
                    SlotContent::Programmed { rblocks, meta } => {
                        m.store_content(ppn, &rblocks);
                        if let Some(blob) = meta {
                            m.meta.insert(ppn, blob);
                        }
                    }
                    SlotContent::Consumed { torn: true } | SlotContent::Erased => torn += 1,
                    SlotContent::Consumed { torn: false } => {}
                }
            }
        }
        m.image = Some(image);
        Ok((m, torn))
    }

    /// The byte plane, if the medium has one.
    pub fn image(&self) -> Option<&FlashImage> {
        self.image.as_ref()
    }
    pub fn image_mut(&mut self) -> Option<&mut FlashImage> {
        self.image.as_mut()
    }

    pub fn config(&self) -> &OxConfig {
        &self.cfg
    }
    pub fn counters(&self) -> &MediaCounters {
        &self.counters
    }
    pub fn nand(&self) -> &Nand {
        &self.nand
    }
    pub fn rblocks_per_wblock(&self) -> u32 {
        self.rblocks_per_wblock
    }
    pub fn wblocks_per_eblock(&self) -> u32 {
        self.wblocks_per_eblock
    }
    pub fn eblocks_total(&self) -> u32 {
        self.cfg.eblocks_total()
    }

    /// The channel of an EBLOCK.
    pub fn channel_of(&self, block: u32) -> u32 {
        (block % self.planes_total) / self.cfg.luns_per_channel
    }
    /// The LUN (within its channel) of an EBLOCK.
    pub fn lun_of(&self, block: u32) -> u32 {
        (block % self.planes_total) % self.cfg.luns_per_channel
    }
    /// The `index`-th EBLOCK of a LUN.
    pub fn block_at(&self, channel: u32, lun: u32, index: u32) -> u32 {
        index * self.planes_total + channel * self.cfg.luns_per_channel + lun
    }
    pub fn block_of_ppn(&self, ppn: Ppn) -> u32 {
        ppn / self.wblocks_per_eblock
    }
    pub fn first_ppn(&self, block: u32) -> Ppn {
        block * self.wblocks_per_eblock
    }
    pub fn ppn_of(&self, ppa: Ppa) -> Ppn {
        (ppa.0 / self.rblocks_per_wblock as u64) as Ppn
    }
    pub fn block_of_ppa(&self, ppa: Ppa) -> u32 {
        self.block_of_ppn(self.ppn_of(ppa))
    }
    pub fn ppa(&self, ppn: Ppn, index: u32) -> Ppa {
        Ppa(ppn as u64 * self.rblocks_per_wblock as u64 + index as u64)
    }
    /// Index of an RBLOCK within its EBLOCK.
    pub fn rblock_in_eblock(&self, ppa: Ppa) -> u32 {
        (ppa.0 % (self.rblocks_per_wblock as u64 * self.wblocks_per_eblock as u64)) as u32
    }

    pub fn is_bad(&self, block: u32) -> bool {
        self.nand.is_bad(block)
    }
    pub fn erase_count(&self, block: u32) -> u32 {
        self.nand.erase_count(block)
    }
    /// The next programmable WBLOCK of an EBLOCK (its write pointer).
    pub fn write_pointer(&self, block: u32) -> u32 {
        self.nand.next_page(block)
    }

    /// Programs one WBLOCK. `rblocks` may be shorter than a WBLOCK; the rest is padding.
    /// On an injected failure the WBLOCK is consumed and holds nothing.
    pub fn program(
        &mut self,
        ppn: Ppn,
        ready_ns: TimeNs,
        rblocks: &[RblockWrite],
        meta: Option<MetaBlob>,
    ) -> Result<TimeNs, NandError> {
        self.counters.wblock_programs += 1;
        let result = self.nand.program(ppn, ready_ns);
        #[cfg(test)]
        let result = match result {
            Ok(_) if self.program_fails.remove(&ppn) => {
                self.nand.store_mut().clear_page(ppn);
                let block = self.block_of_ppn(ppn);
                let page = ppn - block * self.wblocks_per_eblock;
                Err(NandError::ProgramFailed { block, page })
            }
            other => other,
        };
        match result {
            Ok(end) => {
                self.store_content(ppn, rblocks);
                if let Some(image) = &mut self.image {
                    image.program(ppn, rblocks, meta.as_ref());
                }
                match meta {
                    Some(m) => {
                        self.meta.insert(ppn, m);
                    }
                    None => {
                        self.meta.remove(&ppn);
                    }
                }
                self.inflight_programs.push((end, ppn));
                Ok(end)
            }
            Err(e) => {
                if matches!(e, NandError::ProgramFailed { .. }) {
                    self.counters.program_failures += 1;
                    self.meta.remove(&ppn);
                    if let Some(image) = &mut self.image {
                        image.consume(ppn);
                    }
                }
                Err(e)
            }
        }
    }

    fn store_content(&mut self, ppn: Ppn, rblocks: &[RblockWrite]) {
        let spp = self.rblocks_per_wblock as usize;
        let unit = self.nand.store().unit_bytes();
        let tag_len = self.nand.store().tag_bytes_per_sector();
        if unit > 0 {
            let page = self.nand.store_mut().page_mut(ppn);
            for i in 0..spp {
                let token = rblocks.get(i).map_or(0, |r| r.token);
                let bytes = token.to_le_bytes();
                let dst = &mut page[i * unit..(i + 1) * unit];
                dst.fill(0);
                let n = unit.min(8);
                dst[..n].copy_from_slice(&bytes[..n]);
            }
        }
        let tags = self.nand.store_mut().page_tags_mut(ppn);
        for i in 0..spp {
            let tag = rblocks
                .get(i)
                .map_or(Tag::new(TagKind::Padding, 0, 0), |r| r.tag);
            tag.encode(&mut tags[i * tag_len..(i + 1) * tag_len]);
        }
    }

    /// Reads one RBLOCK (array read of its WBLOCK, transfer of the RBLOCK). Returns when the
    /// data is in controller memory, the token and the TAG.
    pub fn read_rblock(&mut self, ppa: Ppa, ready_ns: TimeNs) -> (TimeNs, u64, Tag) {
        let ppn = self.ppn_of(ppa);
        self.counters.rblock_reads += 1;
        let end = self.nand.read(ppn, ready_ns, self.cfg.terms.rblock_bytes);
        (end, self.token_of(ppa), self.tag_of(ppa))
    }

    /// Reads several RBLOCKs of one WBLOCK: the page is sensed once and the RBLOCKs are
    /// transferred together, as an open-channel vector read of sectors in one page is.
    /// Returns when the data is in controller memory, and the tokens.
    pub fn read_rblocks_of_wblock(&mut self, ppas: &[Ppa], ready_ns: TimeNs) -> (TimeNs, Vec<u64>) {
        let Some(&first) = ppas.first() else {
            return (ready_ns, Vec::new());
        };
        let ppn = self.ppn_of(first);
        self.counters.rblock_reads += ppas.len() as u64;
        let bytes = self.cfg.terms.rblock_bytes * ppas.len() as u32;
        let end = self.nand.read(ppn, ready_ns, bytes);
        (end, ppas.iter().map(|&p| self.token_of(p)).collect())
    }

    /// Reads a whole WBLOCK (a log block, a table page, a checkpoint record).
    pub fn read_wblock(&mut self, ppn: Ppn, ready_ns: TimeNs) -> (TimeNs, Option<&MetaBlob>) {
        self.counters.wblock_reads += 1;
        let end = self.nand.read(ppn, ready_ns, self.cfg.terms.wblock_bytes);
        (end, self.meta.get(&ppn))
    }

    /// The token stored in an RBLOCK, without timing (the caller charged the read).
    pub fn token_of(&self, ppa: Ppa) -> u64 {
        let store = self.nand.store();
        if store.mode() == PayloadMode::None {
            return 0;
        }
        let unit = store.unit_bytes();
        let i = (ppa.0 % self.rblocks_per_wblock as u64) as usize;
        let page = store.page(self.ppn_of(ppa));
        let mut word = [0u8; 8];
        let n = unit.min(8);
        word[..n].copy_from_slice(&page[i * unit..i * unit + n]);
        u64::from_le_bytes(word)
    }

    /// The TAG of an RBLOCK, without timing.
    pub fn tag_of(&self, ppa: Ppa) -> Tag {
        let store = self.nand.store();
        let tag_len = store.tag_bytes_per_sector();
        let i = (ppa.0 % self.rblocks_per_wblock as u64) as usize;
        match store.page_tags(self.ppn_of(ppa)) {
            Some(tags) => Tag::decode(&tags[i * tag_len..(i + 1) * tag_len]),
            None => Tag::EMPTY,
        }
    }

    /// The metadata content of a WBLOCK, without timing.
    pub fn meta_of(&self, ppn: Ppn) -> Option<&MetaBlob> {
        self.meta.get(&ppn)
    }

    /// Erases an EBLOCK: its content, TAGs and metadata go. On a failure the EBLOCK is bad.
    pub fn erase(&mut self, block: u32, ready_ns: TimeNs) -> Result<TimeNs, NandError> {
        self.counters.erases += 1;
        let first = self.first_ppn(block);
        for ppn in first..first + self.wblocks_per_eblock {
            self.nand.store_mut().clear_page(ppn);
            self.meta.remove(&ppn);
        }
        #[allow(unused_mut)]
        let mut r = self.nand.erase(block, ready_ns);
        #[cfg(test)]
        if r.is_ok() && self.erase_fails.remove(&block) {
            self.nand.retire_block(block);
            r = Err(NandError::EraseFailed { block });
        }
        if matches!(r, Err(NandError::EraseFailed { .. })) {
            self.counters.erase_failures += 1;
        }
        if let Some(image) = &mut self.image {
            image.erase(block, self.nand.erase_count(block), self.nand.is_bad(block));
        }
        r
    }

    /// Marks an EBLOCK bad (retired after a program failure).
    pub fn retire(&mut self, block: u32) {
        self.nand.retire_block(block);
        if let Some(image) = &mut self.image {
            let mut record = image.record(block);
            record.bad = true;
            image.write_record(block, record);
        }
    }

    /// Retires every free EBLOCK that no system table (bad-block table, checkpoint) holds:
    /// the fault of a device at the end of its life, whose grown bad blocks took all the
    /// spare space. Returns how many were retired.
    pub fn retire_every_free_eblock(&mut self) -> Result<u32, OxError> {
        let system = crate::provision::SystemBlocks::locate(self)?;
        let mut retired = 0;
        for b in 0..self.eblocks_total() {
            if self.write_pointer(b) == 0 && !self.is_bad(b) && !system.contains(b) {
                self.retire(b);
                retired += 1;
            }
        }
        Ok(retired)
    }

    /// Forgets programs that ended by `now_ns`: they are durable.
    pub fn settle(&mut self, now_ns: TimeNs) {
        if self.inflight_programs.len() > 4096 {
            self.inflight_programs.retain(|&(end, _)| end > now_ns);
        }
    }

    /// Power fails at `at_ns`: every program that had not ended is torn — its WBLOCK is
    /// consumed and holds nothing readable (see the fault model in the crate docs).
    pub fn power_loss(&mut self, at_ns: TimeNs) -> u64 {
        let mut torn = 0;
        let inflight = std::mem::take(&mut self.inflight_programs);
        for (end, ppn) in inflight {
            if end > at_ns {
                self.nand.store_mut().clear_page(ppn);
                self.meta.remove(&ppn);
                if let Some(image) = &mut self.image {
                    image.consume(ppn);
                }
                torn += 1;
            }
        }
        torn
    }

    /// Time when the die of an EBLOCK is next free (used to spread work over idle LUNs).
    pub fn die_free_ns(&self, block: u32) -> TimeNs {
        self.nand.die_free_ns_of_block(block)
    }
}
