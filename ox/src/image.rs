//! The flash image: the medium's content as bytes, so that a served OX device returns what
//! was written and, kept in a file, survives the process.
//!
//! In simulation the medium keeps an 8-byte token per RBLOCK and the metadata WBLOCKs as
//! structures (`Media`). A served device needs more: the 4 KiB a host wrote, at the
//! physical address (PPA) the controller put them, and — for a restart — every WBLOCK's
//! state, TAGs and content, and every EBLOCK's erase count and bad flag. The image holds
//! exactly that, laid out like the flash:
//!
//! ```text
//! offset 0                 header (4 KiB): magic, version, the shape of the medium
//! 4 KiB                    EBLOCK table: 16 bytes per EBLOCK (generation, erase count, bad)
//! 4 KiB + table            WBLOCK slots, in PPN order, each a 4 KiB slot header (state,
//!                          EBLOCK generation, content kind and length, checksum, TAGs and
//!                          tokens of its RBLOCKs: the out-of-band area) and `wblock_bytes`
//!                          of content (the RBLOCKs' bytes, or a metadata blob)
//! ```
//!
//! A metadata blob (log block, table page, checkpoint record, bad-block table) is serialized
//! into the WBLOCK's own bytes and must fit in them: that is what the flash page holds, and
//! the check keeps the model honest.
//!
//! Erasing an EBLOCK bumps its generation in the EBLOCK table; a slot stamped with another
//! generation reads as erased. So an erase is one small write, and a slot whose checksum does
//! not verify (a write cut short by a host crash) reads as a torn program: consumed, with
//! nothing readable — the medium's own fault model.
//!
//! Every write goes to the file (pwrite) when the medium programs or erases, before the
//! controller can acknowledge anything that depends on it; a process killed with SIGKILL
//! leaves it in the page cache, so nothing acknowledged is lost. `sync` (fdatasync) makes it
//! durable against a host crash; the image also syncs before every erase and every
//! checkpoint record, so that a host crash can never keep an erase or a checkpoint while
//! losing what they depend on.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::checkpoint::CheckpointRecord;
use crate::log::{GcMove, LogBlock, LogRecord, RdescEntry};
use crate::media::{MetaBlob, Ppa, Ppn, RblockWrite, Tag, TagKind};
use crate::tables::{TableId, TablePage};
use crate::{OxConfig, OxError};

const IMAGE_MAGIC: &[u8; 8] = b"AFAOXIMG";
const IMAGE_VERSION: u32 = 2;
const IMAGE_HEADER_BYTES: u64 = 4096;
const EBLOCK_RECORD_BYTES: u64 = 16;
const SLOT_HEADER_BYTES: usize = 4096;
const SLOT_MAGIC: &[u8; 8] = b"OXWBLOCK";
/// Bytes of the slot header before the TAGs: magic, generation, state, kind, length,
/// checksum, reserved.
const SLOT_FIXED_BYTES: usize = 64;
const TAG_BYTES: usize = 16;

const STATE_CONTENT: u8 = 1;
/// Consumed without content: a failed or torn program.
const STATE_CONSUMED: u8 = 2;

const KIND_RBLOCKS: u8 = 0;
const KIND_LOG: u8 = 1;
pub(crate) const KIND_TABLE: u8 = 2;
/// A table page of 4-byte words: WEAR, whose page holds `wblock_bytes / 4` erase counts
/// (`tables::Wear`), twice what 8-byte words fit in a WBLOCK. Images written before this
/// kind stored WEAR pages as `KIND_TABLE`, which still reads.
const KIND_TABLE_U32: u8 = 5;
const KIND_CHECKPOINT: u8 = 3;
const KIND_BBT: u8 = 4;

/// The shape of the medium the image was made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    rblock_bytes: u32,
    wblock_bytes: u32,
    wblocks_per_eblock: u32,
    eblocks: u32,
}

impl Layout {
    fn of(cfg: &OxConfig) -> Layout {
        Layout {
            rblock_bytes: cfg.terms.rblock_bytes,
            wblock_bytes: cfg.terms.wblock_bytes,
            wblocks_per_eblock: cfg.terms.wblocks_per_eblock(),
            eblocks: cfg.eblocks_total(),
        }
    }
    fn rblocks_per_wblock(&self) -> usize {
        (self.wblock_bytes / self.rblock_bytes) as usize
    }
    fn record_offset(&self, block: u32) -> u64 {
        IMAGE_HEADER_BYTES + block as u64 * EBLOCK_RECORD_BYTES
    }
    fn slots_offset(&self) -> u64 {
        let table = self.eblocks as u64 * EBLOCK_RECORD_BYTES;
        IMAGE_HEADER_BYTES + table.div_ceil(4096) * 4096
    }
    fn slot_bytes(&self) -> u64 {
        SLOT_HEADER_BYTES as u64 + self.wblock_bytes as u64
    }
    fn slot_offset(&self, ppn: Ppn) -> u64 {
        self.slots_offset() + ppn as u64 * self.slot_bytes()
    }
    fn total_bytes(&self) -> u64 {
        self.slot_offset(self.eblocks * self.wblocks_per_eblock)
    }
    fn header(&self) -> Vec<u8> {
        let mut h = vec![0u8; IMAGE_HEADER_BYTES as usize];
        h[..8].copy_from_slice(IMAGE_MAGIC);
        h[8..12].copy_from_slice(&IMAGE_VERSION.to_le_bytes());
        h[12..16].copy_from_slice(&self.rblock_bytes.to_le_bytes());
        h[16..20].copy_from_slice(&self.wblock_bytes.to_le_bytes());
        h[20..24].copy_from_slice(&self.wblocks_per_eblock.to_le_bytes());
        h[24..28].copy_from_slice(&self.eblocks.to_le_bytes());
        h
    }
    fn describe(&self) -> String {
        format!(
            "{} EBLOCKs of {} WBLOCKs of {} bytes, {}-byte RBLOCKs",
            self.eblocks, self.wblocks_per_eblock, self.wblock_bytes, self.rblock_bytes
        )
    }
}

/// One EBLOCK's entry in the image's EBLOCK table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EblockRecord {
    /// Bumped by every erase: slots stamped with an older generation read as erased.
    pub generation: u64,
    pub erase_count: u32,
    pub bad: bool,
}

impl EblockRecord {
    fn encode(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.generation.to_le_bytes());
        b[8..12].copy_from_slice(&self.erase_count.to_le_bytes());
        b[12] = self.bad as u8;
        b
    }
    fn decode(b: &[u8]) -> EblockRecord {
        EblockRecord {
            generation: u64::from_le_bytes(b[..8].try_into().unwrap_or_default()),
            erase_count: u32::from_le_bytes(b[8..12].try_into().unwrap_or_default()),
            bad: b[12] != 0,
        }
    }
}

/// What a WBLOCK slot of the image holds.
#[derive(Debug, Clone, PartialEq)]
pub enum SlotContent {
    /// Never programmed since its EBLOCK's last erase.
    Erased,
    /// Consumed without anything readable: a failed program, or a write the checksum shows
    /// was cut short.
    Consumed { torn: bool },
    /// Programmed: the TAG and token of every RBLOCK, and the metadata blob if it is one.
    Programmed {
        rblocks: Vec<RblockWrite>,
        meta: Option<MetaBlob>,
    },
}

/// Where the image lives.
#[derive(Debug)]
enum Backing {
    File {
        file: File,
        path: PathBuf,
    },
    /// A served device without a state directory: the same layout, in memory, slot by slot
    /// (only programmed slots take memory).
    Memory {
        records: Vec<[u8; 16]>,
        slots: BTreeMap<Ppn, Vec<u8>>,
    },
}

/// The medium's bytes: the flash image, with the bytes of host writes staged until their
/// RBLOCKs are programmed.
#[derive(Debug)]
pub struct FlashImage {
    backing: Backing,
    layout: Layout,
    records: Vec<EblockRecord>,
    /// Bytes of host writes by token, from before the write is submitted until it
    /// completes: the controller stays token-driven and the image turns tokens into bytes
    /// when the RBLOCK is programmed.
    staged: BTreeMap<u64, Box<[u8]>>,
    /// The first I/O or encoding error: the image is no longer what the controller thinks,
    /// so the device must fail every command from then on.
    error: Option<String>,
    /// The largest token found in the image when it was opened.
    max_token: u64,
    /// How many times the image was made durable (`sync`), in memory or on a file.
    syncs: u64,
}

impl FlashImage {
    /// An image in memory, for a served device that need not survive the process.
    pub fn in_memory(cfg: &OxConfig) -> FlashImage {
        let layout = Layout::of(cfg);
        FlashImage {
            backing: Backing::Memory {
                records: vec![[0u8; 16]; layout.eblocks as usize],
                slots: BTreeMap::new(),
            },
            records: vec![EblockRecord::default(); layout.eblocks as usize],
            layout,
            staged: BTreeMap::new(),
            error: None,
            max_token: 0,
            syncs: 0,
        }
    }

    /// Creates an image file of an erased medium at `path` (which must not exist); the
    /// file is sparse, so only what is programmed takes space.
    pub fn create(path: &Path, cfg: &OxConfig) -> Result<FlashImage, OxError> {
        let layout = Layout::of(cfg);
        let err = |what: &str, e: std::io::Error| {
            OxError::Image(format!("cannot {what} {}: {e}", path.display()))
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| err("create", e))?;
        file.set_len(layout.total_bytes())
            .map_err(|e| err("size", e))?;
        file.write_all_at(&layout.header(), 0)
            .map_err(|e| err("write the header of", e))?;
        file.sync_all().map_err(|e| err("sync", e))?;
        Ok(FlashImage {
            backing: Backing::File {
                file,
                path: path.to_path_buf(),
            },
            records: vec![EblockRecord::default(); layout.eblocks as usize],
            layout,
            staged: BTreeMap::new(),
            error: None,
            max_token: 0,
            syncs: 0,
        })
    }

    /// Opens an existing image file, refusing one made for another shape of medium.
    pub fn open(path: &Path, cfg: &OxConfig) -> Result<FlashImage, OxError> {
        let layout = Layout::of(cfg);
        let err = |what: &str, e: std::io::Error| {
            OxError::Image(format!("cannot {what} {}: {e}", path.display()))
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| err("open", e))?;
        let mut header = vec![0u8; IMAGE_HEADER_BYTES as usize];
        file.read_exact_at(&mut header, 0)
            .map_err(|e| err("read the header of", e))?;
        if &header[..8] != IMAGE_MAGIC {
            return Err(OxError::Image(format!(
                "{} is not an OX flash image",
                path.display()
            )));
        }
        if header != layout.header() {
            let word = |i: usize| u32::from_le_bytes(header[i..i + 4].try_into().unwrap_or([0; 4]));
            let found = Layout {
                rblock_bytes: word(12),
                wblock_bytes: word(16),
                wblocks_per_eblock: word(20),
                eblocks: word(24),
            };
            return Err(OxError::Image(format!(
                "{} holds a medium of {} (image version {}), but the configuration gives {}",
                path.display(),
                found.describe(),
                word(8),
                layout.describe()
            )));
        }
        let len = file.metadata().map_err(|e| err("inspect", e))?.len();
        if len < layout.total_bytes() {
            return Err(OxError::Image(format!(
                "{} is {len} bytes, shorter than the {} bytes of its medium",
                path.display(),
                layout.total_bytes()
            )));
        }
        let mut table = vec![0u8; (layout.eblocks as u64 * EBLOCK_RECORD_BYTES) as usize];
        file.read_exact_at(&mut table, IMAGE_HEADER_BYTES)
            .map_err(|e| err("read the EBLOCK table of", e))?;
        let records = table
            .chunks_exact(EBLOCK_RECORD_BYTES as usize)
            .map(EblockRecord::decode)
            .collect();
        Ok(FlashImage {
            backing: Backing::File {
                file,
                path: path.to_path_buf(),
            },
            records,
            layout,
            staged: BTreeMap::new(),
            error: None,
            max_token: 0,
            syncs: 0,
        })
    }

    /// The file of the image, if it has one.
    pub fn path(&self) -> Option<&Path> {
        match &self.backing {
            Backing::File { path, .. } => Some(path),
            Backing::Memory { .. } => None,
        }
    }

    /// Records that the image file was renamed (it stays open), so that errors name it
    /// where it is.
    pub fn moved_to(&mut self, to: &Path) {
        if let Backing::File { path, .. } = &mut self.backing {
            *path = to.to_path_buf();
        }
    }

    /// The first error the image met, if any; after one, the image no longer follows the
    /// controller and the device must stop acknowledging.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// The largest token seen while the medium was restored from the image.
    pub fn max_token(&self) -> u64 {
        self.max_token
    }

    /// How many times `sync` made the image durable since it was created or opened.
    pub fn syncs(&self) -> u64 {
        self.syncs
    }

    pub fn record(&self, block: u32) -> EblockRecord {
        self.records[block as usize]
    }

    /// Stages the bytes of one RBLOCK of a host write under its token.
    pub fn stage(&mut self, token: u64, bytes: &[u8]) {
        self.staged.insert(token, bytes.into());
    }

    /// Drops staged bytes once their write completed (or failed).
    pub fn unstage(&mut self, token: u64) {
        self.staged.remove(&token);
    }

    /// The staged bytes of `token`, if they are staged (a write the write-back cache holds).
    pub fn staged(&self, token: u64) -> Option<&[u8]> {
        self.staged.get(&token).map(|b| &b[..])
    }

    fn fail(&mut self, message: String) {
        if self.error.is_none() {
            self.error = Some(message);
        }
    }

    fn write_at(&mut self, bytes: &[u8], offset: u64) -> Result<(), String> {
        match &mut self.backing {
            Backing::File { file, path } => file
                .write_all_at(bytes, offset)
                .map_err(|e| format!("cannot write {}: {e}", path.display())),
            Backing::Memory { .. } => Ok(()),
        }
    }

    fn read_at(&self, len: usize, offset: u64) -> Result<Vec<u8>, String> {
        let mut buf = vec![0u8; len];
        if let Backing::File { file, path } = &self.backing {
            file.read_exact_at(&mut buf, offset)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        }
        Ok(buf)
    }

    /// Makes everything written so far durable (fdatasync of the file).
    pub fn sync(&mut self) -> Result<(), String> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        self.syncs += 1;
        if let Backing::File { file, path } = &self.backing {
            if let Err(e) = file.sync_data() {
                let message = format!("cannot sync {}: {e}", path.display());
                self.fail(message.clone());
                return Err(message);
            }
        }
        Ok(())
    }

    /// Writes an EBLOCK's record.
    pub fn write_record(&mut self, block: u32, record: EblockRecord) {
        self.records[block as usize] = record;
        let bytes = record.encode();
        let result = match &mut self.backing {
            Backing::Memory { records, .. } => {
                records[block as usize] = bytes;
                Ok(())
            }
            Backing::File { .. } => self.write_at(&bytes, self.layout.record_offset(block)),
        };
        if let Err(e) = result {
            self.fail(e);
        }
    }

    /// An EBLOCK was erased (or its erase failed; it is then bad): its slots read as erased
    /// from now on. Everything before is made durable first, so that a host crash never
    /// keeps the erase and loses what let the controller erase (a GC record, a checkpoint).
    pub fn erase(&mut self, block: u32, erase_count: u32, bad: bool) {
        if self.sync().is_err() {
            return;
        }
        let generation = self.records[block as usize].generation + 1;
        self.write_record(
            block,
            EblockRecord {
                generation,
                erase_count,
                bad,
            },
        );
        if let Backing::Memory { slots, .. } = &mut self.backing {
            let first = block * self.layout.wblocks_per_eblock;
            for ppn in first..first + self.layout.wblocks_per_eblock {
                slots.remove(&ppn);
            }
        }
    }

    /// A WBLOCK was consumed without content (its program failed or was torn).
    pub fn consume(&mut self, ppn: Ppn) {
        let block = ppn / self.layout.wblocks_per_eblock;
        let mut header = vec![0u8; SLOT_HEADER_BYTES];
        self.fill_fixed(&mut header, block, STATE_CONSUMED, KIND_RBLOCKS, 0);
        self.seal(&mut header, &[]);
        self.write_slot(ppn, header);
    }

    /// A WBLOCK was programmed with `rblocks` (shorter than a WBLOCK: padding follows) and,
    /// for a metadata WBLOCK, `meta`. A user RBLOCK's bytes come from the staged bytes of its
    /// token, a GC copy's from its source RBLOCK.
    pub fn program(&mut self, ppn: Ppn, rblocks: &[RblockWrite], meta: Option<&MetaBlob>) {
        if let Err(e) = self.try_program(ppn, rblocks, meta) {
            self.fail(e);
        }
    }

    fn try_program(
        &mut self,
        ppn: Ppn,
        rblocks: &[RblockWrite],
        meta: Option<&MetaBlob>,
    ) -> Result<(), String> {
        let layout = self.layout;
        let spp = layout.rblocks_per_wblock();
        let rb = layout.rblock_bytes as usize;
        let block = ppn / layout.wblocks_per_eblock;
        // The content is built in the slot itself: a separate buffer copied in afterwards
        // cost a served device a tenth of its time in zeroing and copying.
        let (kind, mut slot) = match meta {
            Some(m) => {
                let (kind, body) = encode_meta(m, layout.wblock_bytes)
                    .map_err(|e| format!("WBLOCK {ppn}: {e}"))?;
                if matches!(m, MetaBlob::Checkpoint(_)) {
                    // A checkpoint record points at table pages and log blocks written
                    // before it: they must be durable before it can be.
                    self.sync()?;
                }
                let mut slot = vec![0u8; SLOT_HEADER_BYTES + body.len()];
                slot[SLOT_HEADER_BYTES..].copy_from_slice(&body);
                (kind, slot)
            }
            None => {
                let mut slot = vec![0u8; SLOT_HEADER_BYTES + spp * rb];
                let content = &mut slot[SLOT_HEADER_BYTES..];
                for (i, r) in rblocks.iter().enumerate().take(spp) {
                    let dst = &mut content[i * rb..(i + 1) * rb];
                    match (r.tag.kind, r.source) {
                        (TagKind::User, _) => match self.staged.get(&r.token) {
                            Some(bytes) if bytes.len() == rb => dst.copy_from_slice(bytes),
                            _ => {
                                return Err(format!(
                                    "the bytes of token {:#x} (LPID {}) were not staged before its RBLOCK was programmed",
                                    r.token, r.tag.lpid
                                ))
                            }
                        },
                        (TagKind::Gc, Some(src)) => {
                            // The copy must come from the version GC read: the image's token
                            // at the source is checked like a host read's.
                            let (tag, token, bytes) = self.read_user(src)?;
                            if token != r.token || tag.lpid != r.tag.lpid {
                                return Err(format!(
                                    "GC copy of LPID {} with token {:#x} from RBLOCK {}, which holds LPID {} with token {token:#x} in the image",
                                    r.tag.lpid, r.token, src.0, tag.lpid
                                ));
                            }
                            dst.copy_from_slice(&bytes);
                        }
                        _ => {}
                    }
                }
                (KIND_RBLOCKS, slot)
            }
        };
        let content_bytes = slot.len() - SLOT_HEADER_BYTES;
        self.fill_fixed(&mut slot, block, STATE_CONTENT, kind, content_bytes as u32);
        let tags_at = SLOT_FIXED_BYTES;
        let tokens_at = tags_at + spp * TAG_BYTES;
        for i in 0..spp {
            let (tag, token) = rblocks
                .get(i)
                .map_or((Tag::new(TagKind::Padding, 0, 0), 0), |r| (r.tag, r.token));
            tag.encode(&mut slot[tags_at + i * TAG_BYTES..tags_at + (i + 1) * TAG_BYTES]);
            slot[tokens_at + i * 8..tokens_at + (i + 1) * 8].copy_from_slice(&token.to_le_bytes());
        }
        let (header, body) = slot.split_at_mut(SLOT_HEADER_BYTES);
        self.seal(header, body);
        self.write_slot(ppn, slot);
        match self.error.clone() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn fill_fixed(&self, header: &mut [u8], block: u32, state: u8, kind: u8, len: u32) {
        header[..8].copy_from_slice(SLOT_MAGIC);
        header[8..16].copy_from_slice(&self.records[block as usize].generation.to_le_bytes());
        header[16] = state;
        header[17] = kind;
        header[20..24].copy_from_slice(&len.to_le_bytes());
    }

    /// Stores the checksum of the slot (header without the checksum field, and content).
    fn seal(&self, header: &mut [u8], content: &[u8]) {
        let sum = slot_checksum(header, content);
        header[24..32].copy_from_slice(&sum.to_le_bytes());
    }

    fn write_slot(&mut self, ppn: Ppn, slot: Vec<u8>) {
        let result = match &mut self.backing {
            Backing::Memory { slots, .. } => {
                slots.insert(ppn, slot);
                Ok(())
            }
            Backing::File { .. } => self.write_at(&slot, self.layout.slot_offset(ppn)),
        };
        if let Err(e) = result {
            self.fail(e);
        }
    }

    /// The bytes of one RBLOCK, from its slot's content.
    /// An RBLOCK's bytes: borrowed from an image in memory (a served read copies them
    /// once, into its answer), read from a file.
    fn rblock_bytes(&self, ppa: Ppa) -> Result<Cow<'_, [u8]>, String> {
        let spp = self.layout.rblocks_per_wblock() as u64;
        let rb = self.layout.rblock_bytes as usize;
        let ppn = (ppa.0 / spp) as Ppn;
        let i = (ppa.0 % spp) as usize;
        let at = SLOT_HEADER_BYTES + i * rb;
        match &self.backing {
            Backing::Memory { slots, .. } => Ok(slots
                .get(&ppn)
                .and_then(|s| s.get(at..at + rb))
                .map_or_else(|| Cow::Owned(vec![0u8; rb]), Cow::Borrowed)),
            Backing::File { .. } => self
                .read_at(rb, self.layout.slot_offset(ppn) + at as u64)
                .map(Cow::Owned),
        }
    }

    /// A slot's header, borrowed from an image in memory, read from a file.
    fn slot_header(&self, ppn: Ppn) -> Result<Cow<'_, [u8]>, String> {
        match &self.backing {
            Backing::Memory { slots, .. } => Ok(slots.get(&ppn).map_or_else(
                || Cow::Owned(vec![0u8; SLOT_HEADER_BYTES]),
                |s| Cow::Borrowed(&s[..SLOT_HEADER_BYTES]),
            )),
            Backing::File { .. } => self
                .read_at(SLOT_HEADER_BYTES, self.layout.slot_offset(ppn))
                .map(Cow::Owned),
        }
    }

    /// Reads a user RBLOCK back for a host read: its TAG, token and bytes as the image holds
    /// them. The caller checks them against what the controller's MAP and read returned.
    pub fn read_user(&self, ppa: Ppa) -> Result<(Tag, u64, Vec<u8>), String> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        let spp = self.layout.rblocks_per_wblock();
        let ppn = (ppa.0 / spp as u64) as Ppn;
        let i = (ppa.0 % spp as u64) as usize;
        let block = ppn / self.layout.wblocks_per_eblock;
        if block >= self.layout.eblocks {
            return Err(format!("RBLOCK {} lies outside the medium", ppa.0));
        }
        let header = self.slot_header(ppn)?;
        let generation = u64::from_le_bytes(header[8..16].try_into().unwrap_or_default());
        if &header[..8] != SLOT_MAGIC
            || header[16] != STATE_CONTENT
            || header[17] != KIND_RBLOCKS
            || generation != self.records[block as usize].generation
        {
            return Err(format!(
                "WBLOCK {ppn} holds no user data in the image (RBLOCK {})",
                ppa.0
            ));
        }
        let tags_at = SLOT_FIXED_BYTES;
        let tokens_at = tags_at + spp * TAG_BYTES;
        let tag = Tag::decode(&header[tags_at + i * TAG_BYTES..tags_at + (i + 1) * TAG_BYTES]);
        let token = u64::from_le_bytes(
            header[tokens_at + i * 8..tokens_at + (i + 1) * 8]
                .try_into()
                .unwrap_or_default(),
        );
        Ok((tag, token, self.rblock_bytes(ppa)?.into_owned()))
    }

    /// What slot `ppn` holds, for restoring the medium. A slot with a bad checksum is a
    /// torn program; one stamped with an older generation of its EBLOCK is erased.
    pub fn load(&mut self, ppn: Ppn) -> Result<SlotContent, OxError> {
        let layout = self.layout;
        let spp = layout.rblocks_per_wblock();
        let block = ppn / layout.wblocks_per_eblock;
        // Owned: the load updates the image's largest token while it reads the header.
        let header = self.slot_header(ppn).map_err(OxError::Image)?.into_owned();
        let generation = u64::from_le_bytes(header[8..16].try_into().unwrap_or_default());
        if &header[..8] != SLOT_MAGIC || generation != self.records[block as usize].generation {
            return Ok(SlotContent::Erased);
        }
        let len = u32::from_le_bytes(header[20..24].try_into().unwrap_or_default()) as usize;
        let len_ok = match header[17] {
            KIND_RBLOCKS => len == 0 || len == spp * layout.rblock_bytes as usize,
            _ => len <= layout.wblock_bytes as usize,
        };
        if !len_ok {
            return Ok(SlotContent::Consumed { torn: true });
        }
        let content = match &self.backing {
            Backing::Memory { slots, .. } => slots
                .get(&ppn)
                .map_or_else(Vec::new, |s| s[SLOT_HEADER_BYTES..].to_vec()),
            Backing::File { .. } => self
                .read_at(len, layout.slot_offset(ppn) + SLOT_HEADER_BYTES as u64)
                .map_err(OxError::Image)?,
        };
        let sum = u64::from_le_bytes(header[24..32].try_into().unwrap_or_default());
        if content.len() != len || slot_checksum(&header, &content) != sum {
            return Ok(SlotContent::Consumed { torn: true });
        }
        match header[16] {
            STATE_CONSUMED => return Ok(SlotContent::Consumed { torn: false }),
            STATE_CONTENT => {}
            _ => return Ok(SlotContent::Consumed { torn: true }),
        }
        let tags_at = SLOT_FIXED_BYTES;
        let tokens_at = tags_at + spp * TAG_BYTES;
        let rblocks: Vec<RblockWrite> = (0..spp)
            .map(|i| RblockWrite {
                tag: Tag::decode(&header[tags_at + i * TAG_BYTES..tags_at + (i + 1) * TAG_BYTES]),
                token: u64::from_le_bytes(
                    header[tokens_at + i * 8..tokens_at + (i + 1) * 8]
                        .try_into()
                        .unwrap_or_default(),
                ),
                source: None,
            })
            .collect();
        for r in &rblocks {
            if matches!(r.tag.kind, TagKind::User | TagKind::Gc) {
                self.max_token = self.max_token.max(r.token);
            }
        }
        let meta = match header[17] {
            KIND_RBLOCKS => None,
            kind => Some(decode_meta(kind, &content, rblocks[0].tag).map_err(|e| {
                OxError::Image(format!("WBLOCK {ppn} holds a malformed metadata blob: {e}"))
            })?),
        };
        Ok(SlotContent::Programmed { rblocks, meta })
    }
}

/// A 64-bit checksum of a slot: its header without the checksum field, and its content.
pub(crate) fn slot_checksum(header: &[u8], content: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut step = |word: u64| {
        h = (h ^ word).wrapping_mul(0x0000_0100_0000_01b3);
        h ^= h >> 29;
    };
    // Whole words first, then the tail zero-padded to a word. Padding every chunk through a
    // copy (as this did until 2026-12-03) gave the same sums but took 44% of a served OX
    // device's CPU time under random writes.
    let mut mix = |bytes: &[u8]| {
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            step(u64::from_le_bytes(word.try_into().unwrap_or_default()));
        }
        let tail = words.remainder();
        if !tail.is_empty() {
            let mut w = [0u8; 8];
            w[..tail.len()].copy_from_slice(tail);
            step(u64::from_le_bytes(w));
        }
    };
    mix(&header[..24]);
    mix(&header[32..]);
    mix(content);
    h
}

// ----- metadata blobs as bytes ----------------------------------------------------------

struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn len(&mut self, n: usize) -> Result<(), String> {
        let n = u32::try_from(n).map_err(|_| format!("a list of {n} items is too long"))?;
        self.u32(n);
        Ok(())
    }
    fn ppns(&mut self, v: &[Ppn]) -> Result<(), String> {
        self.len(v.len())?;
        v.iter().for_each(|&p| self.u32(p));
        Ok(())
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(format!(
                "{n} bytes wanted at offset {} of a {}-byte blob",
                self.at,
                self.bytes.len()
            ));
        };
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().map_err(|_| "short")?,
        ))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().map_err(|_| "short")?,
        ))
    }
    /// A list length, bounded by the bytes left so that a corrupt length cannot make a huge
    /// allocation.
    fn len(&mut self, item_bytes: usize) -> Result<usize, String> {
        let n = self.u32()? as usize;
        if n.saturating_mul(item_bytes) > self.bytes.len() - self.at {
            return Err(format!("a list of {n} items overruns the blob"));
        }
        Ok(n)
    }
    fn ppns(&mut self) -> Result<Vec<Ppn>, String> {
        let n = self.len(4)?;
        (0..n).map(|_| self.u32()).collect()
    }
    fn at_end(&self) -> bool {
        self.at == self.bytes.len()
    }
    fn done(&self) -> Result<(), String> {
        if self.at_end() {
            Ok(())
        } else {
            Err(format!(
                "{} bytes left over after the blob",
                self.bytes.len() - self.at
            ))
        }
    }
}

fn table_id_code(t: TableId) -> u8 {
    match t {
        TableId::Map => 1,
        TableId::MapS => 2,
        TableId::Gbitv => 3,
        TableId::GbitvS => 4,
        TableId::Wear => 5,
    }
}

fn table_id_of(code: u64) -> Result<TableId, String> {
    Ok(match code {
        1 => TableId::Map,
        2 => TableId::MapS,
        3 => TableId::Gbitv,
        4 => TableId::GbitvS,
        5 => TableId::Wear,
        _ => return Err(format!("unknown table code {code}")),
    })
}

/// Serializes a metadata blob into the bytes of its WBLOCK, with the content kind the slot
/// header records. A table page's table and index are not repeated in the bytes: its TAG
/// (out of band) carries them, as OX's does. Fails if the blob does not fit in
/// `wblock_bytes`.
pub fn encode_meta(blob: &MetaBlob, wblock_bytes: u32) -> Result<(u8, Vec<u8>), String> {
    let mut w = Writer(Vec::new());
    let kind = match blob {
        MetaBlob::Log(lb) => {
            w.u64(lb.seq);
            match lb.prev {
                Some(p) => {
                    w.u8(1);
                    w.u32(p);
                }
                None => {
                    w.u8(0);
                    w.u32(0);
                }
            }
            w.ppns(&lb.links)?;
            w.len(lb.records.len())?;
            for (lsn, r) in &lb.records {
                w.u64(*lsn);
                encode_record(&mut w, r)?;
            }
            KIND_LOG
        }
        MetaBlob::Table(page) if page.table == TableId::Wear => {
            for &x in &page.words {
                let count = u32::try_from(x).map_err(|_| {
                    format!("an erase count of {x} in a WEAR page overflows 32 bits")
                })?;
                w.u32(count);
            }
            KIND_TABLE_U32
        }
        MetaBlob::Table(page) => {
            page.words.iter().for_each(|&x| w.u64(x));
            KIND_TABLE
        }
        MetaBlob::Checkpoint(rec) => {
            for v in [
                rec.seq,
                rec.timestamp_ns,
                rec.rssp_lsn,
                rec.rssp_block_seq,
                rec.next_ctx,
                rec.next_gc_seq,
            ] {
                w.u64(v);
            }
            for c in rec.channel_cursors {
                w.u32(c);
            }
            w.ppns(&rec.rssp_links)?;
            w.ppns(&rec.map_t)?;
            w.ppns(&rec.gbitv_t)?;
            w.ppns(&rec.wear_s)?;
            // Revision and bridges come last, so that an image of the version before them
            // (whose records end here) still reads: revision 0, no bridges.
            w.u32(rec.revision);
            w.len(rec.log_bridges.len())?;
            for (seq, links) in &rec.log_bridges {
                w.u64(*seq);
                w.ppns(links)?;
            }
            KIND_CHECKPOINT
        }
        MetaBlob::Bbt { version, bad } => {
            w.u64(*version);
            w.ppns(bad)?;
            KIND_BBT
        }
    };
    if w.0.len() > wblock_bytes as usize {
        return Err(format!(
            "a {} blob of {} bytes does not fit in a {wblock_bytes}-byte WBLOCK",
            match kind {
                KIND_LOG => "log block",
                KIND_TABLE | KIND_TABLE_U32 => "table page",
                KIND_CHECKPOINT => "checkpoint record",
                _ => "bad-block table",
            },
            w.0.len()
        ));
    }
    Ok((kind, w.0))
}

fn encode_record(w: &mut Writer, r: &LogRecord) -> Result<(), String> {
    match r {
        LogRecord::Rdesc { ctx, entries } => {
            w.u8(1);
            w.u64(*ctx);
            w.len(entries.len())?;
            for e in entries {
                w.u64(e.lpid);
                w.u64(e.prior.0);
                w.u64(e.new.0);
            }
        }
        LogRecord::RdescA { ctx, amendments } => {
            w.u8(2);
            w.u64(*ctx);
            w.len(amendments.len())?;
            for &(i, p) in amendments {
                w.u32(i);
                w.u64(p.0);
            }
        }
        LogRecord::Done { ctx } => {
            w.u8(3);
            w.u64(*ctx);
        }
        LogRecord::Gc {
            victim,
            erase_count,
            moves,
        } => {
            w.u8(4);
            w.u32(*victim);
            w.u32(*erase_count);
            w.len(moves.len())?;
            for m in moves {
                w.u64(m.lpid);
                w.u64(m.prior.0);
                w.u64(m.new.0);
            }
        }
        LogRecord::Erase { block, erase_count } => {
            w.u8(5);
            w.u32(*block);
            w.u32(*erase_count);
        }
        LogRecord::CkptPages { ckpt, pages } => {
            w.u8(6);
            w.u64(*ckpt);
            w.len(pages.len())?;
            for &(t, index, ppn) in pages {
                w.u8(table_id_code(t));
                w.u32(index);
                w.u32(ppn);
            }
        }
    }
    Ok(())
}

fn decode_record(r: &mut Reader<'_>) -> Result<LogRecord, String> {
    Ok(match r.u8()? {
        1 => {
            let ctx = r.u64()?;
            let n = r.len(24)?;
            let entries = (0..n)
                .map(|_| {
                    Ok(RdescEntry {
                        lpid: r.u64()?,
                        prior: Ppa(r.u64()?),
                        new: Ppa(r.u64()?),
                    })
                })
                .collect::<Result<_, String>>()?;
            LogRecord::Rdesc { ctx, entries }
        }
        2 => {
            let ctx = r.u64()?;
            let n = r.len(12)?;
            let amendments = (0..n)
                .map(|_| Ok((r.u32()?, Ppa(r.u64()?))))
                .collect::<Result<_, String>>()?;
            LogRecord::RdescA { ctx, amendments }
        }
        3 => LogRecord::Done { ctx: r.u64()? },
        4 => {
            let victim = r.u32()?;
            let erase_count = r.u32()?;
            let n = r.len(24)?;
            let moves = (0..n)
                .map(|_| {
                    Ok(GcMove {
                        lpid: r.u64()?,
                        prior: Ppa(r.u64()?),
                        new: Ppa(r.u64()?),
                    })
                })
                .collect::<Result<_, String>>()?;
            LogRecord::Gc {
                victim,
                erase_count,
                moves,
            }
        }
        5 => LogRecord::Erase {
            block: r.u32()?,
            erase_count: r.u32()?,
        },
        6 => {
            let ckpt = r.u64()?;
            let n = r.len(9)?;
            let pages = (0..n)
                .map(|_| Ok((table_id_of(r.u8()? as u64)?, r.u32()?, r.u32()?)))
                .collect::<Result<_, String>>()?;
            LogRecord::CkptPages { ckpt, pages }
        }
        code => return Err(format!("unknown log record code {code}")),
    })
}

/// Reads a metadata blob back from its WBLOCK's bytes; `tag` is the TAG of the WBLOCK's
/// first RBLOCK (a table page's table and index).
pub fn decode_meta(kind: u8, bytes: &[u8], tag: Tag) -> Result<MetaBlob, String> {
    let mut r = Reader { bytes, at: 0 };
    let blob = match kind {
        KIND_LOG => {
            let seq = r.u64()?;
            let has_prev = r.u8()? != 0;
            let prev = r.u32()?;
            let links = r.ppns()?;
            let n = r.len(10)?;
            let records = (0..n)
                .map(|_| Ok((r.u64()?, decode_record(&mut r)?)))
                .collect::<Result<_, String>>()?;
            MetaBlob::Log(LogBlock {
                seq,
                records,
                prev: has_prev.then_some(prev),
                links,
            })
        }
        KIND_TABLE | KIND_TABLE_U32 => {
            if tag.kind != TagKind::Table {
                return Err(format!("a table page whose TAG says {:?}", tag.kind));
            }
            let word_bytes = if kind == KIND_TABLE_U32 { 4 } else { 8 };
            if bytes.len() % word_bytes != 0 {
                return Err(format!("a table page of {} bytes", bytes.len()));
            }
            let words = bytes
                .chunks_exact(word_bytes)
                .map(|c| {
                    let mut word = [0u8; 8];
                    word[..word_bytes].copy_from_slice(c);
                    u64::from_le_bytes(word)
                })
                .collect();
            r.at = bytes.len();
            MetaBlob::Table(TablePage {
                table: table_id_of(tag.lpid >> 32)?,
                index: tag.lpid as u32,
                words,
            })
        }
        KIND_CHECKPOINT => {
            let seq = r.u64()?;
            let timestamp_ns = r.u64()?;
            let rssp_lsn = r.u64()?;
            let rssp_block_seq = r.u64()?;
            let next_ctx = r.u64()?;
            let next_gc_seq = r.u64()?;
            let mut channel_cursors = [0u32; 4];
            for c in channel_cursors.iter_mut() {
                *c = r.u32()?;
            }
            let rssp_links = r.ppns()?;
            let map_t = r.ppns()?;
            let gbitv_t = r.ppns()?;
            let wear_s = r.ppns()?;
            let (mut revision, mut log_bridges) = (0, Vec::new());
            if !r.at_end() {
                revision = r.u32()?;
                // A bridge is at least its sequence and its list's length.
                for _ in 0..r.len(12)? {
                    let seq = r.u64()?;
                    log_bridges.push((seq, r.ppns()?));
                }
            }
            MetaBlob::Checkpoint(Box::new(CheckpointRecord {
                seq,
                timestamp_ns,
                rssp_lsn,
                rssp_block_seq,
                rssp_links,
                map_t,
                gbitv_t,
                wear_s,
                channel_cursors,
                next_ctx,
                next_gc_seq,
                revision,
                log_bridges,
            }))
        }
        KIND_BBT => MetaBlob::Bbt {
            version: r.u64()?,
            bad: r.ppns()?,
        },
        other => return Err(format!("unknown content kind {other}")),
    };
    r.done()?;
    Ok(blob)
}
