//! The flash image: a WAFLASH SSD's medium kept in a file, so that a served device survives
//! the process as a real SSD survives a power cycle.
//!
//! ```text
//! offset 0                 header (4 KiB): magic, version, the shape of the medium and
//!                          the logical space (`WaflashConfig::medium_shape`)
//! 4 KiB                    two commit pointers, 4 KiB each: where the record of one of the
//!                          last two commits lies in the journal area, its sequence number,
//!                          its length and a checksum
//! 12 KiB                   block table: 12 bytes per block (write pointer, erase count,
//!                          state: 0 in service, 1 bad, 2 a program failed and GC has not
//!                          retired it yet)
//! 12 KiB + table           page slots in PPN order, each 512 bytes of OOB (logical page,
//!                          written-sector pattern, sequence number, compaction header) and
//!                          the page's bytes
//! after the last slot      the journal area: commit records
//! ```
//!
//! The image holds the medium as it was at the last completed [`WaflashImage::commit`],
//! which the served device calls when a FLUSH (or a FUA write) completes: what a power loss
//! at that moment would have left. Writes acknowledged after it are in the device's DRAM
//! buffer, or on flash pages not yet committed, and a kill loses them as a power loss would;
//! that is the durability a volatile write cache promises.
//!
//! A slot is part of the medium only below its block's write pointer in the block table, so
//! a slot at or above the committed write pointer may be written at any time without
//! changing the medium. A commit uses that to write most pages once:
//!
//! 1. every page programmed since the last commit whose slot is at or above its block's
//!    committed write pointer is written straight to its slot (flash fills a block in
//!    order, so that is every page except those of a block erased and rewritten since the
//!    last commit, below the write pointer the block had before its erase);
//! 2. a commit record goes to the journal area, where it overlaps no record a recovery may
//!    still need: the changed blocks' records, the slots of the other pages (whose old
//!    contents the committed medium still holds), and a checksum of every slot of step 1;
//!    then a pointer to it goes to the pointer the previous commit did not use;
//! 3. one sync of the image; the commit is complete when it returns;
//! 4. the record is applied: its block records and slots are written in place, unsynced.
//!    The next commit's sync makes them durable, and until then this commit's record, which
//!    the next commit does not overwrite, can redo them.
//!
//! Opening an image redoes the records its pointers name, older first, each one that is
//! whole and whose slot checksums match, and then clears the pointers. The sync of step 3
//! orders nothing, so a crash inside it may leave a whole record whose slots are not all
//! written: their checksums catch it, that record is dropped, and the one before it (whose
//! commit completed) is redone, so the image holds the previous medium. A kill or a host
//! crash at any point of a commit thus leaves the previous medium or the new one.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use afa_nand::{Nand, PayloadMode};
use afa_sim::fnv1a;

use crate::ftl::{Changes, FlashMeta, Ftl};
use crate::{WaflashConfig, WaflashError};

const IMAGE_MAGIC: &[u8; 8] = b"AFAWFIMG";
const POINTER_MAGIC: &[u8; 8] = b"AFAWFPTR";
const RECORD_MAGIC: &[u8; 8] = b"AFAWFREC";
/// Version 1 kept its journal in a file of its own and wrote every page twice; its block
/// table starts elsewhere, so this version cannot read it. Version 2 had no block state 2
/// (retiring); it reads as version 3 and is marked version 3 when opened, so that an afa
/// reading only version 2 does not take a retiring block for a bad one.
const IMAGE_VERSION: u32 = 3;
const IMAGE_VERSION_WITHOUT_RETIRING: u32 = 2;
const BLOCK_IN_SERVICE: u32 = 0;
const BLOCK_BAD: u32 = 1;
const BLOCK_RETIRING: u32 = 2;
const HEADER_BYTES: u64 = 4096;
/// Each commit pointer has a 4 KiB page of its own, so that writing one never rewrites the
/// other's sectors.
const POINTER_BYTES: u64 = 4096;
const POINTER_COUNT: u64 = 2;
/// Magic, sequence number, offset, length, checksum.
const POINTER_USED_BYTES: usize = 40;
const BLOCK_RECORD_BYTES: u64 = 12;
/// The OOB part of a page slot: logical page (4), pattern (8), sequence number (8), header
/// length (2) and the header, at most 3 + 7 bytes per sector of a 64-sector page.
const SLOT_META_BYTES: usize = 512;
const SLOT_FIXED_BYTES: usize = 22;
/// Commit records start on 4 KiB boundaries.
const RECORD_ALIGN_BYTES: u64 = 4096;

/// What a write of a commit is, for the errors that name it (and the tests that cut a
/// commit at one of them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// A page straight to its slot, at or above its block's committed write pointer.
    Direct,
    /// The commit record, in the journal area.
    Record,
    /// The pointer to the commit record.
    Pointer,
    /// The sync that completes the commit.
    Sync,
    /// The record's block records and slots, in place.
    Apply,
}

impl Stage {
    fn what(self) -> &'static str {
        match self {
            Stage::Direct => "write a page slot to",
            Stage::Record => "write a commit record to",
            Stage::Pointer => "write a commit pointer to",
            Stage::Sync => "sync",
            Stage::Apply => "apply a commit record to",
        }
    }
}

/// Test hooks: a commit cut short as a kill would cut it, and the writes a commit made.
#[cfg(test)]
#[derive(Debug, Default)]
pub(crate) struct CommitHooks {
    /// The next commit stops, with an error, before its first step of this stage.
    pub cut_before: Option<Stage>,
    /// Every write of the commits made while this is set, in order, with its stage.
    pub trace: Option<Vec<(Stage, u64, Vec<u8>)>>,
}

/// A WAFLASH medium kept in a file.
#[derive(Debug)]
pub struct WaflashImage {
    path: PathBuf,
    file: File,
    blocks: u32,
    pages_per_block: u32,
    page_bytes: usize,
    /// Each block's write pointer in the committed medium: slots at or above it hold
    /// nothing the medium needs, so a commit writes pages there straight to their slots.
    committed_next_page: Vec<u32>,
    /// The sequence number of the last commit (0 when the pointers are clear).
    seq: u64,
    /// Where the last commit's record lies (start, end): the next record must not overlap
    /// it, since a crash in the next commit needs it to redo the last one.
    last_record: Option<(u64, u64)>,
    #[cfg(test)]
    pub(crate) hooks: CommitHooks,
}

fn io_error(what: &str, path: &Path, e: std::io::Error) -> WaflashError {
    WaflashError::Image(format!("cannot {what} {}: {e}", path.display()))
}

/// The header that names the medium's shape, so that an image is only ever opened under
/// the configuration it was made for.
fn header(config: &WaflashConfig) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER_BYTES as usize);
    h.extend_from_slice(IMAGE_MAGIC);
    h.extend_from_slice(&IMAGE_VERSION.to_le_bytes());
    h.extend_from_slice(config.medium_shape().as_bytes());
    h.resize(HEADER_BYTES as usize, 0);
    h
}

/// One commit pointer: the record of commit `seq` is `len` bytes at `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pointer {
    seq: u64,
    offset: u64,
    len: u64,
}

/// What one commit writes, in the order it writes it.
#[derive(Debug)]
struct CommitPlan {
    seq: u64,
    /// Pages whose slots are at or above their block's committed write pointer.
    direct: Vec<(u64, Vec<u8>)>,
    record_offset: u64,
    record: Vec<u8>,
    /// The block records, and the slots of pages below their block's committed write
    /// pointer: written in place once the record is durable.
    apply: Vec<(u64, Vec<u8>)>,
    /// Each changed block's write pointer once the commit is complete.
    next_pages: Vec<(u32, u32)>,
}

/// A decoded commit record: the writes it redoes, and the (offset, length, checksum) of
/// each slot its commit wrote straight to the image.
#[derive(Debug)]
struct Record<'a> {
    seq: u64,
    writes: Vec<(u64, &'a [u8])>,
    checks: Vec<(u64, u32, u64)>,
}

impl WaflashImage {
    fn shape(path: &Path, file: File, config: &WaflashConfig) -> Self {
        let g = &config.geometry;
        Self {
            path: path.to_path_buf(),
            file,
            blocks: g.blocks_total(),
            pages_per_block: g.pages_per_block,
            page_bytes: g.page_bytes as usize,
            committed_next_page: vec![0; g.blocks_total() as usize],
            seq: 0,
            last_record: None,
            #[cfg(test)]
            hooks: CommitHooks::default(),
        }
    }

    fn slot_bytes(&self) -> u64 {
        (SLOT_META_BYTES + self.page_bytes) as u64
    }

    fn pointer_offset(slot: u64) -> u64 {
        HEADER_BYTES + slot * POINTER_BYTES
    }

    fn table_offset() -> u64 {
        HEADER_BYTES + POINTER_COUNT * POINTER_BYTES
    }

    fn block_offset(&self, block: u32) -> u64 {
        Self::table_offset() + block as u64 * BLOCK_RECORD_BYTES
    }

    fn slot_offset(&self, ppn: u32) -> u64 {
        Self::table_offset()
            + self.blocks as u64 * BLOCK_RECORD_BYTES
            + ppn as u64 * self.slot_bytes()
    }

    fn journal_offset(&self) -> u64 {
        self.slot_offset(self.blocks * self.pages_per_block)
    }

    /// Creates the image of a blank medium (every block erased, nothing programmed).
    pub fn create(path: &Path, config: &WaflashConfig) -> Result<Self, WaflashError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| io_error("create the flash image", path, e))?;
        let image = Self::shape(path, file, config);
        image
            .file
            .write_all_at(&header(config), 0)
            .and_then(|()| image.file.set_len(image.journal_offset()))
            .and_then(|()| image.file.sync_all())
            .map_err(|e| io_error("write the flash image", path, e))?;
        Ok(image)
    }

    /// Opens an image made for `config` and restores its medium into `nand` (new, blank,
    /// holding full bytes): the blocks' write pointers and erase counts, the programmed
    /// pages' bytes, and the OOB areas, which it returns for recovery. The records of the
    /// last commits are redone first; one cut short is dropped.
    pub fn open(
        path: &Path,
        config: &WaflashConfig,
        nand: &mut Nand,
    ) -> Result<(Self, FlashMeta), WaflashError> {
        if nand.store().mode() != PayloadMode::Full {
            return Err(WaflashError::Image(
                "a flash image holds bytes: the medium must keep payload full".into(),
            ));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| io_error("open the flash image", path, e))?;
        let mut image = Self::shape(path, file, config);
        let mut found = vec![0u8; HEADER_BYTES as usize];
        image
            .file
            .read_exact_at(&mut found, 0)
            .map_err(|e| io_error("read the header of", path, e))?;
        if &found[..8] != IMAGE_MAGIC {
            return Err(WaflashError::Image(format!(
                "{} is not a WAFLASH flash image",
                path.display()
            )));
        }
        let version = u32::from_le_bytes([found[8], found[9], found[10], found[11]]);
        if version != IMAGE_VERSION && version != IMAGE_VERSION_WITHOUT_RETIRING {
            return Err(WaflashError::Image(format!(
                "{} is a version {version} WAFLASH flash image; this afa reads versions \
                 {IMAGE_VERSION_WITHOUT_RETIRING} and {IMAGE_VERSION} only: serve it with the afa \
                 that made it, or start from a new state directory",
                path.display()
            )));
        }
        found[8..12].copy_from_slice(&IMAGE_VERSION.to_le_bytes());
        if found != header(config) {
            return Err(WaflashError::Image(format!(
                "{} holds a WAFLASH medium of another shape (geometry or logical size) than \
                 the configuration gives",
                path.display()
            )));
        }
        if version == IMAGE_VERSION_WITHOUT_RETIRING {
            image
                .file
                .write_all_at(&found, 0)
                .and_then(|()| image.file.sync_data())
                .map_err(|e| io_error("mark version 3 in the header of", path, e))?;
        }
        image.redo_commits()?;
        let table = image.read_block_table()?;
        let geometry_pages = (image.blocks * image.pages_per_block) as usize;
        let mut meta = FlashMeta::blank(geometry_pages);
        let slot = image.slot_bytes() as usize;
        for (block, record) in
            (0..image.blocks).zip(table.chunks_exact(BLOCK_RECORD_BYTES as usize))
        {
            let (next_page, erase_count, state) = decode_block_record(record);
            let bad = match state {
                BLOCK_IN_SERVICE => false,
                BLOCK_BAD => true,
                BLOCK_RETIRING => {
                    meta.mark_retiring(block, image.blocks);
                    false
                }
                other => {
                    return Err(WaflashError::Image(format!(
                        "block {block}'s record in {} has state {other}, not 0 (in service), \
                         1 (bad) or 2 (retiring)",
                        path.display()
                    )))
                }
            };
            nand.restore_block(block, next_page, erase_count, bad)
                .map_err(|e| WaflashError::Image(format!("block {block}: {e}")))?;
            image.committed_next_page[block as usize] = next_page;
            if next_page == 0 || bad {
                continue;
            }
            let first = block * image.pages_per_block;
            let mut bytes = vec![0u8; next_page as usize * slot];
            image
                .file
                .read_exact_at(&mut bytes, image.slot_offset(first))
                .map_err(|e| io_error("read the pages of", path, e))?;
            for (i, s) in bytes.chunks_exact(slot).enumerate() {
                let ppn = first + i as u32;
                let (lpn, mask, seq, header) = decode_slot(s).ok_or_else(|| {
                    WaflashError::Image(format!(
                        "page {ppn}'s OOB record in {} is cut short",
                        path.display()
                    ))
                })?;
                meta.restore(ppn, lpn, mask, seq, header);
                nand.store_mut()
                    .page_mut(ppn)
                    .copy_from_slice(&s[SLOT_META_BYTES..]);
            }
        }
        Ok((image, meta))
    }

    fn read_block_table(&self) -> Result<Vec<u8>, WaflashError> {
        let mut table = vec![0u8; self.blocks as usize * BLOCK_RECORD_BYTES as usize];
        self.file
            .read_exact_at(&mut table, Self::table_offset())
            .map_err(|e| io_error("read the block table of", &self.path, e))?;
        Ok(table)
    }

    /// Redoes the records the commit pointers name (older first, each that is whole and
    /// whose slots check), syncs, and clears the pointers, so that the block table and the
    /// slots alone hold the medium of the last completed commit.
    fn redo_commits(&mut self) -> Result<(), WaflashError> {
        let mut pointers = Vec::new();
        for slot in 0..POINTER_COUNT {
            let mut p = [0u8; POINTER_USED_BYTES];
            self.file
                .read_exact_at(&mut p, Self::pointer_offset(slot))
                .map_err(|e| io_error("read the commit pointers of", &self.path, e))?;
            pointers.extend(decode_pointer(&p));
        }
        self.seq = 0;
        self.last_record = None;
        if pointers.is_empty() {
            return Ok(());
        }
        pointers.sort_by_key(|p| p.seq);
        let mut bytes = Vec::with_capacity(pointers.len());
        for p in &pointers {
            bytes.push(self.read_record(p)?);
        }
        let records: Vec<Option<Record>> = pointers
            .iter()
            .zip(&bytes)
            .map(|(p, b)| {
                b.as_deref()
                    .and_then(decode_record)
                    .filter(|r| r.seq == p.seq)
            })
            .collect();
        let checked: Vec<bool> = records
            .iter()
            .map(|r| r.as_ref().map_or(Ok(false), |r| self.record_checks(r)))
            .collect::<Result<_, _>>()?;
        // A newest record that does not check was cut short: its commit never completed,
        // so the one before it did, and nothing since has touched what that one wrote (the
        // next commit writes only above its write pointers until its own record is whole).
        // Both failing means the file was changed outside a commit.
        if checked.len() == 2 && !checked[0] && !checked[1] {
            return Err(WaflashError::Image(format!(
                "{}: neither of the last two commit records (sequence numbers {} and {}) \
                 matches the slots it names, so the medium cannot be told",
                self.path.display(),
                pointers[0].seq,
                pointers[1].seq
            )));
        }
        // Older first: a record the newer one follows may not have reached the block table
        // yet, and what the newer one writes must win.
        let journal = self.journal_offset();
        for (record, ok) in records.iter().zip(&checked) {
            let (Some(record), true) = (record, ok) else {
                continue;
            };
            for &(offset, data) in &record.writes {
                if offset.saturating_add(data.len() as u64) > journal {
                    return Err(WaflashError::Image(format!(
                        "{}: commit record {} writes past the page slots (offset {offset})",
                        self.path.display(),
                        record.seq
                    )));
                }
                self.file
                    .write_all_at(data, offset)
                    .map_err(|e| io_error("redo a commit record in", &self.path, e))?;
            }
        }
        self.file
            .sync_data()
            .map_err(|e| io_error("sync", &self.path, e))?;
        for slot in 0..POINTER_COUNT {
            self.file
                .write_all_at(&[0u8; POINTER_USED_BYTES], Self::pointer_offset(slot))
                .map_err(|e| io_error("clear the commit pointers of", &self.path, e))?;
        }
        self.file
            .sync_data()
            .map_err(|e| io_error("sync", &self.path, e))
    }

    /// The bytes `p` names, or `None` when they are not all in the journal area.
    fn read_record(&self, p: &Pointer) -> Result<Option<Vec<u8>>, WaflashError> {
        let len = self
            .file
            .metadata()
            .map_err(|e| io_error("read the size of", &self.path, e))?
            .len();
        if p.offset < self.journal_offset() || p.offset.saturating_add(p.len) > len {
            return Ok(None);
        }
        let Ok(size) = usize::try_from(p.len) else {
            return Ok(None);
        };
        let mut bytes = vec![0u8; size];
        self.file
            .read_exact_at(&mut bytes, p.offset)
            .map_err(|e| io_error("read a commit record of", &self.path, e))?;
        Ok(Some(bytes))
    }

    /// Whether every slot the record's commit wrote straight to the image holds what it
    /// wrote.
    fn record_checks(&self, record: &Record) -> Result<bool, WaflashError> {
        let mut slot = Vec::new();
        for &(offset, len, sum) in &record.checks {
            slot.resize(len as usize, 0);
            match self.file.read_exact_at(&mut slot, offset) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(false),
                Err(e) => return Err(io_error("read a page slot of", &self.path, e)),
            }
            if checksum(&slot) != sum {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Writes `data` at `offset` as part of `stage` of a commit.
    fn put(&mut self, stage: Stage, offset: u64, data: &[u8]) -> Result<(), WaflashError> {
        #[cfg(test)]
        {
            self.hook(stage)?;
            if let Some(trace) = &mut self.hooks.trace {
                trace.push((stage, offset, data.to_vec()));
            }
        }
        self.file
            .write_all_at(data, offset)
            .map_err(|e| io_error(stage.what(), &self.path, e))
    }

    /// Stops a commit where a test cuts it; the stage cut is reported once.
    #[cfg(test)]
    fn hook(&mut self, stage: Stage) -> Result<(), WaflashError> {
        if self.hooks.cut_before == Some(stage) {
            self.hooks.cut_before = None;
            return Err(WaflashError::Image(format!("commit cut before {stage:?}")));
        }
        Ok(())
    }

    /// Makes the image hold the medium as it is now: every page in `changes.pages` still
    /// programmed (its OOB and bytes), and the block record of every block changed.
    ///
    /// A commit that fails leaves the file as a crash at that point would, and the caller
    /// must hand the same changes (with any made since) to the next commit, which writes
    /// them all again: a failure after the sync leaves a complete commit whose record was
    /// not applied in place, and the next commit's record, which replaces it as the one a
    /// crash redoes, must then hold everything it held.
    pub(crate) fn commit(
        &mut self,
        nand: &Nand,
        changes: &Changes,
        ftl: &Ftl,
    ) -> Result<(), WaflashError> {
        if changes.pages.is_empty() && changes.blocks.is_empty() {
            return Ok(());
        }
        let plan = self.plan(nand, changes, ftl)?;
        for (offset, slot) in &plan.direct {
            self.put(Stage::Direct, *offset, slot)?;
        }
        self.put(Stage::Record, plan.record_offset, &plan.record)?;
        let pointer = encode_pointer(&Pointer {
            seq: plan.seq,
            offset: plan.record_offset,
            len: plan.record.len() as u64,
        });
        self.put(
            Stage::Pointer,
            Self::pointer_offset(plan.seq % POINTER_COUNT),
            &pointer,
        )?;
        #[cfg(test)]
        self.hook(Stage::Sync)?;
        self.file
            .sync_data()
            .map_err(|e| io_error(Stage::Sync.what(), &self.path, e))?;
        // The commit is complete: from here on, opening the image gives the new medium.
        self.seq = plan.seq;
        self.last_record = Some((
            plan.record_offset,
            plan.record_offset + plan.record.len() as u64,
        ));
        for &(block, next_page) in &plan.next_pages {
            self.committed_next_page[block as usize] = next_page;
        }
        for (offset, data) in &plan.apply {
            self.put(Stage::Apply, *offset, data)?;
        }
        Ok(())
    }

    /// Sorts the changes into the writes of one commit (see the module's documentation).
    fn plan(&self, nand: &Nand, changes: &Changes, ftl: &Ftl) -> Result<CommitPlan, WaflashError> {
        let mut blocks: Vec<u32> = changes
            .blocks
            .iter()
            .copied()
            .chain(changes.pages.iter().map(|&p| p / self.pages_per_block))
            .collect();
        blocks.sort_unstable();
        blocks.dedup();
        let mut apply: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut next_pages = Vec::with_capacity(blocks.len());
        for &b in &blocks {
            let mut record = Vec::with_capacity(BLOCK_RECORD_BYTES as usize);
            record.extend_from_slice(&nand.next_page(b).to_le_bytes());
            record.extend_from_slice(&nand.erase_count(b).to_le_bytes());
            let state = if nand.is_bad(b) {
                BLOCK_BAD
            } else if ftl.retiring(b) {
                BLOCK_RETIRING
            } else {
                BLOCK_IN_SERVICE
            };
            record.extend_from_slice(&state.to_le_bytes());
            apply.push((self.block_offset(b), record));
            next_pages.push((b, nand.next_page(b)));
        }
        let mut direct = Vec::new();
        let mut checks = Vec::new();
        for &ppn in &changes.pages {
            let block = ppn / self.pages_per_block;
            let index = ppn - block * self.pages_per_block;
            if index >= nand.next_page(block) {
                // Programmed, then erased with its block: nothing of it is left.
                continue;
            }
            let (lpn, mask, seq, header) = ftl.page_meta(ppn);
            let mut slot = encode_slot(lpn, mask, seq, header)?;
            slot.extend_from_slice(nand.store().page(ppn));
            let offset = self.slot_offset(ppn);
            if index >= self.committed_next_page[block as usize] {
                checks.push((offset, slot.len() as u32, checksum(&slot)));
                direct.push((offset, slot));
            } else {
                // The block was erased since the last commit, and the committed medium
                // still holds this slot's old contents: it goes through the record.
                apply.push((offset, slot));
            }
        }
        let seq = self.seq + 1;
        let record = encode_record(seq, &apply, &checks);
        // At the start of the journal area when it fits before the last commit's record,
        // else after it: never over the record a crash in this commit would need.
        let journal = self.journal_offset();
        let record_offset = match self.last_record {
            Some((start, end)) if journal + record.len() as u64 > start => {
                end.div_ceil(RECORD_ALIGN_BYTES) * RECORD_ALIGN_BYTES
            }
            _ => journal,
        };
        Ok(CommitPlan {
            seq,
            direct,
            record_offset,
            record,
            apply,
            next_pages,
        })
    }

    /// Records that the image file was renamed (a fresh image is made under a temporary
    /// name and renamed once it is whole).
    pub fn moved_to(&mut self, path: &Path) {
        self.path = path.to_path_buf();
    }
}

/// The checksum of a commit record or of a slot written straight to the image, which tells
/// them from whatever those bytes held before. FNV-1a byte by byte (`afa_sim::fnv1a`) took a
/// quarter of a served device's CPU time under 5 KiB random writes, so this mixes 64-bit
/// words in four lanes whose multiplications overlap. Each product's high half is folded
/// into its low half, because a multiplication only carries a change towards the high bits:
/// a change in a word's top bit would stay there, and one in the lane's next word would
/// cancel it. The lanes, the last bytes and the length are then folded by FNV-1a.
fn checksum(bytes: &[u8]) -> u64 {
    const MULTIPLIER: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut lanes = [1u64, 2, 3, 4].map(|i| 0xcbf2_9ce4_8422_2325u64.wrapping_mul(i));
    let mut blocks = bytes.chunks_exact(32);
    for block in &mut blocks {
        for (lane, word) in lanes.iter_mut().zip(block.chunks_exact(8)) {
            let mut w = [0u8; 8];
            w.copy_from_slice(word);
            let h = (*lane ^ u64::from_le_bytes(w)).wrapping_mul(MULTIPLIER);
            *lane = h ^ (h >> 32);
        }
    }
    let mut tail = Vec::with_capacity(72);
    for lane in lanes {
        tail.extend_from_slice(&lane.to_le_bytes());
    }
    tail.extend_from_slice(blocks.remainder());
    tail.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    fnv1a(&tail)
}

fn decode_block_record(r: &[u8]) -> (u32, u32, u32) {
    let word = |i: usize| u32::from_le_bytes([r[i], r[i + 1], r[i + 2], r[i + 3]]);
    (word(0), word(4), word(8))
}

fn encode_slot(lpn: u32, mask: u64, seq: u64, header: &[u8]) -> Result<Vec<u8>, WaflashError> {
    if SLOT_FIXED_BYTES + header.len() > SLOT_META_BYTES {
        return Err(WaflashError::Image(format!(
            "a compaction header of {} bytes does not fit a page slot's OOB record",
            header.len()
        )));
    }
    let mut s = Vec::with_capacity(SLOT_META_BYTES);
    s.extend_from_slice(&lpn.to_le_bytes());
    s.extend_from_slice(&mask.to_le_bytes());
    s.extend_from_slice(&seq.to_le_bytes());
    s.extend_from_slice(&(header.len() as u16).to_le_bytes());
    s.extend_from_slice(header);
    s.resize(SLOT_META_BYTES, 0);
    Ok(s)
}

fn decode_slot(s: &[u8]) -> Option<(u32, u64, u64, &[u8])> {
    let lpn = u32::from_le_bytes(s.get(0..4)?.try_into().ok()?);
    let mask = u64::from_le_bytes(s.get(4..12)?.try_into().ok()?);
    let seq = u64::from_le_bytes(s.get(12..20)?.try_into().ok()?);
    let len = u16::from_le_bytes(s.get(20..22)?.try_into().ok()?) as usize;
    if SLOT_FIXED_BYTES + len > SLOT_META_BYTES {
        return None;
    }
    Some((
        lpn,
        mask,
        seq,
        s.get(SLOT_FIXED_BYTES..SLOT_FIXED_BYTES + len)?,
    ))
}

/// A commit pointer: magic, sequence number, offset, length, then the checksum of those.
fn encode_pointer(p: &Pointer) -> Vec<u8> {
    let mut b = Vec::with_capacity(POINTER_USED_BYTES);
    b.extend_from_slice(POINTER_MAGIC);
    b.extend_from_slice(&p.seq.to_le_bytes());
    b.extend_from_slice(&p.offset.to_le_bytes());
    b.extend_from_slice(&p.len.to_le_bytes());
    let sum = fnv1a(&b);
    b.extend_from_slice(&sum.to_le_bytes());
    b
}

/// The pointer `b` holds; `None` for a cleared, torn or damaged one.
fn decode_pointer(b: &[u8]) -> Option<Pointer> {
    let word =
        |i: usize| -> Option<u64> { Some(u64::from_le_bytes(b.get(i..i + 8)?.try_into().ok()?)) };
    if b.get(..8)? != POINTER_MAGIC || fnv1a(b.get(..32)?) != word(32)? {
        return None;
    }
    Some(Pointer {
        seq: word(8)?,
        offset: word(16)?,
        len: word(24)?,
    })
}

/// A commit record: magic, sequence number, write count, check count, then (offset,
/// length, bytes) per write and (offset, length, checksum) per check, then the checksum
/// of everything before it.
fn encode_record(seq: u64, writes: &[(u64, Vec<u8>)], checks: &[(u64, u32, u64)]) -> Vec<u8> {
    let body: usize = writes.iter().map(|(_, d)| 12 + d.len()).sum::<usize>() + checks.len() * 20;
    let mut r = Vec::with_capacity(32 + body + 8);
    r.extend_from_slice(RECORD_MAGIC);
    r.extend_from_slice(&seq.to_le_bytes());
    r.extend_from_slice(&(writes.len() as u64).to_le_bytes());
    r.extend_from_slice(&(checks.len() as u64).to_le_bytes());
    for (offset, data) in writes {
        r.extend_from_slice(&offset.to_le_bytes());
        r.extend_from_slice(&(data.len() as u32).to_le_bytes());
        r.extend_from_slice(data);
    }
    for (offset, len, sum) in checks {
        r.extend_from_slice(&offset.to_le_bytes());
        r.extend_from_slice(&len.to_le_bytes());
        r.extend_from_slice(&sum.to_le_bytes());
    }
    let sum = checksum(&r);
    r.extend_from_slice(&sum.to_le_bytes());
    r
}

/// The record `r` holds; `None` for one cut short or damaged.
fn decode_record(r: &[u8]) -> Option<Record<'_>> {
    let (body, sum) = r.split_at_checked(r.len().checked_sub(8)?)?;
    if body.get(..8)? != RECORD_MAGIC || checksum(body).to_le_bytes() != sum {
        return None;
    }
    let u64_at = |at: usize| -> Option<u64> {
        Some(u64::from_le_bytes(body.get(at..at + 8)?.try_into().ok()?))
    };
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(body.get(at..at + 4)?.try_into().ok()?))
    };
    let seq = u64_at(8)?;
    let write_count = u64_at(16)?;
    let check_count = u64_at(24)?;
    let mut at = 32;
    let mut writes = Vec::new();
    for _ in 0..write_count {
        let offset = u64_at(at)?;
        let len = u32_at(at + 8)? as usize;
        writes.push((offset, body.get(at + 12..at + 12 + len)?));
        at += 12 + len;
    }
    let mut checks = Vec::new();
    for _ in 0..check_count {
        checks.push((u64_at(at)?, u32_at(at + 8)?, u64_at(at + 12)?));
        at += 20;
    }
    (at == body.len()).then_some(Record {
        seq,
        writes,
        checks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{flush, tiny, units};
    use crate::{BufferPolicy, FtlKind, WaflashSsd};
    use afa_ssd::{BlockDevice, Command, ReadBuffers};

    use crate::recovery_tests::Scratch;

    type Trace = Vec<(Stage, u64, Vec<u8>)>;

    /// Sector contents no write produced: what a sector never written reads as.
    const NEVER: u64 = u64::MAX;

    fn config() -> WaflashConfig {
        tiny(BufferPolicy::Lru, FtlKind::MultiVersion, false)
    }

    /// A device on a new image at `path`.
    fn create(path: &Path) -> WaflashSsd {
        let image = WaflashImage::create(path, &config()).unwrap();
        WaflashSsd::create_in(config(), 1, image).unwrap()
    }

    fn reopen(path: &Path) -> WaflashSsd {
        WaflashSsd::open_image(config(), 1, path).unwrap().0
    }

    /// Writes `sectors` sectors from `lba` with `version`, in commands of 16 sectors.
    fn write_all(ssd: &mut WaflashSsd, lba: u64, sectors: u64, version: u64) {
        for at in (lba..lba + sectors).step_by(16) {
            let n = (lba + sectors - at).min(16) as u32;
            let data = units(at, n, version, 4096);
            ssd.submit(at, &Command::write(at, n, &data), ReadBuffers::none())
                .unwrap();
        }
    }

    /// Whether sectors `lba..lba + sectors` read back as written with `version` (as zeros
    /// for `NEVER`).
    fn holds(ssd: &mut WaflashSsd, lba: u64, sectors: u64, version: u64) -> bool {
        (lba..lba + sectors).step_by(16).all(|at| {
            let n = (lba + sectors - at).min(16) as u32;
            let mut out = vec![1u8; n as usize * 4096];
            let read = ssd.submit(
                at,
                &Command::read(at, n),
                ReadBuffers {
                    data: &mut out,
                    tags: None,
                },
            );
            read.is_ok()
                && if version == NEVER {
                    out.iter().all(|&b| b == 0)
                } else {
                    out == units(at, n, version, 4096)
                }
        })
    }

    /// Starts recording the writes of the device's commits.
    fn traced(ssd: &mut WaflashSsd) -> &mut CommitHooks {
        let hooks = &mut ssd.image_mut().expect("kept in an image").hooks;
        hooks.trace = Some(Vec::new());
        hooks
    }

    fn take_trace(ssd: &mut WaflashSsd) -> Trace {
        let hooks = &mut ssd.image_mut().expect("kept in an image").hooks;
        hooks.trace.take().expect("traced")
    }

    /// Puts at `path` the file `base` with the writes of `trace` that `keep` keeps: what a
    /// host crash leaves when only those reached the disk.
    fn crashed(
        path: &Path,
        base: &[u8],
        trace: &[(Stage, u64, Vec<u8>)],
        keep: impl Fn(usize, Stage) -> bool,
    ) {
        let mut file = base.to_vec();
        for (i, (stage, offset, data)) in trace.iter().enumerate() {
            if keep(i, *stage) {
                let at = *offset as usize;
                if file.len() < at + data.len() {
                    file.resize(at + data.len(), 0);
                }
                file[at..at + data.len()].copy_from_slice(data);
            }
        }
        std::fs::write(path, file).unwrap();
    }

    /// How many page slots the commit record in `trace` carries (writes past the block
    /// table).
    fn record_slots(trace: &[(Stage, u64, Vec<u8>)], ssd: &mut WaflashSsd) -> usize {
        let first_slot = ssd.image_mut().expect("kept in an image").slot_offset(0);
        let (_, _, bytes) = trace
            .iter()
            .find(|(s, _, _)| *s == Stage::Record)
            .expect("a commit record");
        decode_record(bytes)
            .expect("a whole record")
            .writes
            .iter()
            .filter(|(offset, _)| *offset >= first_slot)
            .count()
    }

    /// A host crash: which writes reached the disk, and which medium opening must give.
    struct Crash {
        name: String,
        /// Whether the first commit's in-place writes reached the disk.
        first_applied: bool,
        /// Which of the second commit's writes (by index and stage) reached the disk.
        keep: Box<dyn Fn(usize, Stage) -> bool>,
        /// Whether the second commit's medium must come back (else the first's).
        new: bool,
    }

    fn count(trace: &[(Stage, u64, Vec<u8>)], stage: Stage) -> usize {
        trace.iter().filter(|(s, _, _)| *s == stage).count()
    }

    /// A block where a program failed keeps its mark in the image's block table until GC
    /// retires it, so that a restart does not put it back in service.
    #[test]
    fn a_retiring_block_keeps_its_mark_across_a_restart() {
        let dir = Scratch::new("retiring");
        let path = dir.0.join("waflash.img");
        let mut cfg = config();
        cfg.faults.program_fail_probability = 0.02;
        let image = WaflashImage::create(&path, &cfg).unwrap();
        let mut ssd = WaflashSsd::create_in(cfg.clone(), 1, image).unwrap();
        let mut round = 0;
        while ssd.retiring_blocks().is_empty() {
            round += 1;
            assert!(round < 50, "no program failed");
            write_all(&mut ssd, 0, 256, round);
        }
        flush(&mut ssd, 10);
        let retiring = ssd.retiring_blocks();
        let pointers: Vec<u32> = retiring.iter().map(|&b| ssd.nand().next_page(b)).collect();
        drop(ssd);
        let (back, _) = WaflashSsd::open_image(cfg, 1, &path).unwrap();
        assert_eq!(back.retiring_blocks(), retiring);
        for (&b, &p) in retiring.iter().zip(&pointers) {
            assert_eq!(back.nand().next_page(b), p, "block {b}");
            assert!(
                !back.nand().is_bad(b),
                "block {b}: its pages are still read"
            );
        }
    }

    /// A version 2 image (no retiring state) is read, and marked version 3 so that an afa
    /// that reads version 2 only refuses it once it may hold a retiring block.
    #[test]
    fn a_version_2_image_is_read_and_marked_version_3() {
        let dir = Scratch::new("version-2");
        let path = dir.0.join("waflash.img");
        let mut ssd = create(&path);
        write_all(&mut ssd, 0, 64, 1);
        flush(&mut ssd, 10);
        drop(ssd);
        // The version 1 refusal is tested with the image's other refusals
        // (recovery_tests.rs).
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        file.write_all_at(&2u32.to_le_bytes(), 8).unwrap();
        let mut ssd = reopen(&path);
        assert!(holds(&mut ssd, 0, 64, 1));
        let mut version = [0u8; 4];
        file.read_exact_at(&mut version, 8).unwrap();
        assert_eq!(u32::from_le_bytes(version), IMAGE_VERSION);
    }

    #[test]
    fn a_record_and_a_pointer_round_trip_and_cut_or_damaged_ones_are_refused() {
        let writes = vec![(4096u64, vec![1u8, 2, 3]), (1 << 40, vec![9u8; 600])];
        let checks = vec![(1u64 << 20, 16_896u32, 77u64)];
        let r = encode_record(5, &writes, &checks);
        let back = decode_record(&r).expect("whole record");
        assert_eq!(back.seq, 5);
        assert_eq!(back.writes.len(), 2);
        assert_eq!(back.writes[0], (4096, &[1u8, 2, 3][..]));
        assert_eq!(back.writes[1].0, 1 << 40);
        assert_eq!(back.checks, checks);
        for cut in [0, 7, 20, r.len() / 2, r.len() - 1] {
            assert!(decode_record(&r[..cut]).is_none(), "cut at {cut}");
        }
        let mut damaged = r.clone();
        damaged[40] ^= 1;
        assert!(decode_record(&damaged).is_none());
        let p = Pointer {
            seq: 3,
            offset: 1 << 33,
            len: 12_345,
        };
        let b = encode_pointer(&p);
        assert_eq!(b.len(), POINTER_USED_BYTES);
        assert_eq!(decode_pointer(&b), Some(p));
        assert_eq!(decode_pointer(&[0u8; POINTER_USED_BYTES]), None);
        for at in [0, 9, 20, 35] {
            let mut damaged = b.clone();
            damaged[at] ^= 1;
            assert_eq!(decode_pointer(&damaged), None, "byte {at} damaged");
        }
    }

    #[test]
    fn the_checksum_sees_every_bit_and_the_length() {
        let mut slot = vec![0u8; SLOT_META_BYTES + 16_384];
        for (i, b) in slot.iter_mut().enumerate() {
            *b = (i * 7 % 251) as u8;
        }
        let sum = checksum(&slot);
        for bit in [0, 7, 63, 64 * 8 - 1, 4096 * 8 + 5, slot.len() * 8 - 1] {
            let mut other = slot.clone();
            other[bit / 8] ^= 1 << (bit % 8);
            assert_ne!(checksum(&other), sum, "bit {bit} flipped");
        }
        // The top bit of two words flipped: a multiplication alone carries it nowhere, so
        // without the fold the two changes would cancel.
        let mut other = slot.clone();
        other[7] ^= 0x80;
        other[39] ^= 0x80;
        assert_ne!(checksum(&other), sum);
        // A slot cut short, or one that held zeros, is told apart.
        assert_ne!(checksum(&slot[..slot.len() - 1]), sum);
        assert_ne!(checksum(&[0u8; 64]), checksum(&[0u8; 65]));
        assert_ne!(checksum(&vec![0u8; slot.len()]), sum);
    }

    #[test]
    fn a_slot_round_trips_and_an_oversized_header_is_refused() {
        let s = encode_slot(7, 0b1011, 99, &[0xFF, 0xFF, 1, 7, 0, 0, 0, 0, 1, 2]).unwrap();
        assert_eq!(s.len(), SLOT_META_BYTES);
        let (lpn, mask, seq, header) = decode_slot(&s).unwrap();
        assert_eq!((lpn, mask, seq), (7, 0b1011, 99));
        assert_eq!(header.len(), 10);
        assert!(encode_slot(1, 1, 1, &[0; SLOT_META_BYTES]).is_err());
    }

    #[test]
    fn opening_an_image_redoes_a_whole_record_a_commit_left_and_clears_the_pointers() {
        let dir = Scratch::new("redo");
        let path = dir.0.join("waflash.img");
        let mut ssd = create(&path);
        write_all(&mut ssd, 0, 16, 1);
        flush(&mut ssd, 10);
        drop(ssd);
        // A commit that wrote its record and pointer and was cut before it applied them:
        // here, one that erases every block.
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        let shape = WaflashImage::shape(&path, file, &config());
        let writes: Vec<(u64, Vec<u8>)> = (0..shape.blocks)
            .map(|b| {
                (
                    shape.block_offset(b),
                    vec![0u8; BLOCK_RECORD_BYTES as usize],
                )
            })
            .collect();
        let record = encode_record(7, &writes, &[]);
        let at = shape.journal_offset() + 64 * RECORD_ALIGN_BYTES;
        let pointer = encode_pointer(&Pointer {
            seq: 7,
            offset: at,
            len: record.len() as u64,
        });
        shape.file.write_all_at(&record, at).unwrap();
        shape
            .file
            .write_all_at(&pointer, WaflashImage::pointer_offset(1))
            .unwrap();
        drop(shape);
        let (mut ssd, found) = WaflashSsd::open_image(config(), 1, &path).unwrap();
        assert_eq!(found.mapped_pages, 0, "{found:?}");
        assert!(holds(&mut ssd, 0, 16, NEVER));
        let mut p = [0u8; POINTER_USED_BYTES];
        let file = File::open(&path).unwrap();
        for slot in 0..POINTER_COUNT {
            file.read_exact_at(&mut p, WaflashImage::pointer_offset(slot))
                .unwrap();
            assert_eq!(decode_pointer(&p), None, "pointer {slot}");
        }
    }

    #[test]
    fn a_page_written_straight_to_its_slot_then_committed_survives_reopening() {
        let dir = Scratch::new("direct");
        let path = dir.0.join("waflash.img");
        let mut ssd = create(&path);
        traced(&mut ssd);
        write_all(&mut ssd, 0, 256, 1);
        flush(&mut ssd, 10);
        let trace = take_trace(&mut ssd);
        // Every page went straight to its slot, once: the record holds block records only.
        let programs: u64 = ssd.nand_counters().programs.iter().sum();
        assert!(programs >= 64, "{programs} programs");
        assert_eq!(count(&trace, Stage::Direct) as u64, programs);
        assert_eq!(record_slots(&trace, &mut ssd), 0);
        drop(ssd);
        let mut ssd = reopen(&path);
        assert!(holds(&mut ssd, 0, 256, 1));
        // The reopened device goes on writing straight to slots above the write pointers.
        traced(&mut ssd);
        write_all(&mut ssd, 0, 64, 2);
        flush(&mut ssd, 20);
        let trace = take_trace(&mut ssd);
        assert!(count(&trace, Stage::Direct) >= 16);
        assert_eq!(record_slots(&trace, &mut ssd), 0);
        drop(ssd);
        let mut ssd = reopen(&path);
        assert!(holds(&mut ssd, 0, 64, 2));
        assert!(holds(&mut ssd, 64, 192, 1));
    }

    #[test]
    fn a_commit_cut_after_its_direct_page_writes_opens_to_the_previous_medium() {
        let dir = Scratch::new("cut");
        let path = dir.0.join("waflash.img");
        let mut ssd = create(&path);
        write_all(&mut ssd, 0, 128, 1);
        flush(&mut ssd, 10);
        write_all(&mut ssd, 0, 128, 2);
        write_all(&mut ssd, 128, 64, 2);
        traced(&mut ssd).cut_before = Some(Stage::Record);
        assert!(ssd
            .submit(20, &Command::flush(), ReadBuffers::none())
            .is_err());
        let trace = take_trace(&mut ssd);
        drop(ssd);
        // The new pages are in their slots, above the committed write pointers...
        assert!(count(&trace, Stage::Direct) >= 48, "{}", trace.len());
        assert_eq!(count(&trace, Stage::Direct), trace.len());
        let file = std::fs::read(&path).unwrap();
        for (_, offset, data) in &trace {
            let at = *offset as usize;
            assert_eq!(&file[at..at + data.len()], &data[..]);
        }
        // ...and not part of the medium: the image opens to the last commit's.
        let mut ssd = reopen(&path);
        assert!(holds(&mut ssd, 0, 128, 1));
        assert!(holds(&mut ssd, 128, 64, NEVER));
    }

    #[test]
    fn a_block_erased_and_rewritten_since_the_last_commit_is_still_protected() {
        let dir = Scratch::new("erased");
        let path = dir.0.join("waflash.img");
        let mut ssd = create(&path);
        let sectors = ssd.info().capacity_sectors;
        write_all(&mut ssd, 0, sectors, 1);
        flush(&mut ssd, 10);
        let committed = std::fs::read(&path).unwrap();
        // Rewriting the whole logical space twice without a flush makes GC erase blocks
        // the last commit filled and program them again.
        let erases = |ssd: &WaflashSsd| -> u64 { ssd.nand_counters().erases.iter().sum() };
        let erased_before = erases(&ssd);
        write_all(&mut ssd, 0, sectors, 2);
        write_all(&mut ssd, 0, sectors, 3);
        assert!(erases(&ssd) > erased_before + 4);
        traced(&mut ssd).cut_before = Some(Stage::Sync);
        assert!(ssd
            .submit(20, &Command::flush(), ReadBuffers::none())
            .is_err());
        let trace = take_trace(&mut ssd);
        drop(ssd);
        // Pages below an erased block's committed write pointer went into the record, not
        // over the slots the committed medium still holds.
        let journaled = {
            let mut ssd = reopen(&path);
            record_slots(&trace, &mut ssd)
        };
        assert!(journaled >= 16, "{journaled} slots in the record");
        assert!(count(&trace, Stage::Direct) >= 1);
        // A host crash before the sync that kept the direct page writes and lost the record
        // opens to the last commit's medium.
        crashed(&path, &committed, &trace, |_, s| s == Stage::Direct);
        let mut ssd = reopen(&path);
        assert!(holds(&mut ssd, 0, sectors, 1));
        drop(ssd);
        // With the record, the image opens to the new medium.
        crashed(&path, &committed, &trace, |_, _| true);
        let mut ssd = reopen(&path);
        assert!(holds(&mut ssd, 0, sectors, 3));
    }

    #[test]
    fn a_host_crash_inside_a_commit_leaves_the_previous_medium_or_the_new_one() {
        let dir = Scratch::new("crash");
        let path = dir.0.join("waflash.img");
        let mut ssd = create(&path);
        let before_first = std::fs::read(&path).unwrap();
        traced(&mut ssd);
        write_all(&mut ssd, 0, 256, 1);
        flush(&mut ssd, 10);
        let first = take_trace(&mut ssd);
        traced(&mut ssd);
        write_all(&mut ssd, 0, 64, 2);
        flush(&mut ssd, 20);
        let second = take_trace(&mut ssd);
        drop(ssd);
        assert!(count(&first, Stage::Apply) > 0 && count(&second, Stage::Direct) > 1);
        // What the first commit's sync made durable: everything it wrote before the sync.
        let mut durable = before_first.clone();
        for (stage, offset, data) in &first {
            if *stage != Stage::Apply {
                let at = *offset as usize;
                if durable.len() < at + data.len() {
                    durable.resize(at + data.len(), 0);
                }
                durable[at..at + data.len()].copy_from_slice(data);
            }
        }
        let first_apply: Vec<_> = first
            .iter()
            .filter(|(s, _, _)| *s == Stage::Apply)
            .cloned()
            .collect();
        // Before the second commit's sync returns, any of the first commit's in-place
        // writes and any of the second's writes may have reached the disk; the second
        // commit's medium must come back only when all of its writes did.
        let mut cases: Vec<Crash> = Vec::new();
        for mask in 0..16u32 {
            cases.push(Crash {
                name: format!("writes kept {mask:04b} (first applied, pointer, record, direct)"),
                first_applied: mask & 8 != 0,
                keep: Box::new(move |_, s| match s {
                    Stage::Direct => mask & 1 != 0,
                    Stage::Record => mask & 2 != 0,
                    Stage::Pointer => mask & 4 != 0,
                    Stage::Sync | Stage::Apply => false,
                }),
                new: mask & 7 == 7,
            });
        }
        for lost in 0..count(&second, Stage::Direct) {
            cases.push(Crash {
                name: format!("direct write {lost} lost"),
                first_applied: true,
                keep: Box::new(move |i, s| s != Stage::Apply && i != lost),
                new: false,
            });
        }
        // Once the sync has returned, any of the second commit's in-place writes may be
        // lost.
        for kept in [0, 2] {
            cases.push(Crash {
                name: format!("one in {kept} of the in-place writes kept"),
                first_applied: true,
                keep: Box::new(move |i, s| s != Stage::Apply || kept > 0 && i % kept == 0),
                new: true,
            });
        }
        for Crash {
            name,
            first_applied,
            keep,
            new,
        } in cases
        {
            let mut base = durable.clone();
            if first_applied {
                for (_, offset, data) in &first_apply {
                    let at = *offset as usize;
                    base[at..at + data.len()].copy_from_slice(data);
                }
            }
            crashed(&path, &base, &second, keep);
            let mut ssd = reopen(&path);
            if new {
                assert!(holds(&mut ssd, 0, 64, 2), "{name}: new data");
            } else {
                assert!(holds(&mut ssd, 0, 64, 1), "{name}: old data");
            }
            assert!(holds(&mut ssd, 64, 192, 1), "{name}: data the commit kept");
        }
        // A slot of each commit changed behind their backs leaves no record to trust: the
        // image is refused rather than opened to a mixture.
        let mut base = durable.clone();
        for (_, offset, data) in &first_apply {
            let at = *offset as usize;
            base[at..at + data.len()].copy_from_slice(data);
        }
        crashed(&path, &base, &second, |_, s| s != Stage::Apply);
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        for trace in [&first, &second] {
            let (_, offset, _) = trace.iter().find(|(s, _, _)| *s == Stage::Direct).unwrap();
            file.write_all_at(&[0xEE; 8], offset + 600).unwrap();
        }
        let e = WaflashSsd::open_image(config(), 1, &path).unwrap_err();
        assert!(
            e.to_string()
                .contains("neither of the last two commit records"),
            "{e}"
        );
    }

    #[test]
    fn a_commit_that_failed_after_its_sync_is_written_again_by_the_next() {
        let dir = Scratch::new("settle");
        let path = dir.0.join("waflash.img");
        let mut ssd = create(&path);
        write_all(&mut ssd, 0, 256, 1);
        // The commit is complete but none of its block records reach the table: the next
        // commit writes them again, before the record that holds them is overwritten.
        traced(&mut ssd).cut_before = Some(Stage::Apply);
        assert!(ssd
            .submit(10, &Command::flush(), ReadBuffers::none())
            .is_err());
        for (i, lba) in [512u64, 528, 544].into_iter().enumerate() {
            write_all(&mut ssd, lba, 16, 2);
            flush(&mut ssd, 20 + i as u64);
        }
        drop(ssd);
        let mut ssd = reopen(&path);
        assert!(holds(&mut ssd, 0, 256, 1));
        assert!(holds(&mut ssd, 512, 48, 2));
    }
}
