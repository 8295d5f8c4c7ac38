//! The flash image: a WAFLASH SSD's medium kept in a file, so that a served device survives
//! the process as a real SSD survives a power cycle.
//!
//! ```text
//! offset 0                 header (4 KiB): magic, version, the shape of the medium and
//!                          the logical space (`WaflashConfig::medium_shape`)
//! 4 KiB                    block table: 12 bytes per block (write pointer, erase count,
//!                          bad flag)
//! 4 KiB + table            page slots in PPN order, each 512 bytes of OOB (logical page,
//!                          written-sector pattern, sequence number, compaction header) and
//!                          the page's bytes
//! ```
//!
//! The image holds the medium as it was at the last [`WaflashImage::commit`], which the
//! served device calls when a FLUSH (or a FUA write) completes: what a power loss at that
//! moment would have left. Writes acknowledged after it are in the device's DRAM buffer, or
//! on flash pages not yet committed, and a kill loses them as a power loss would; that is
//! the durability a volatile write cache promises. A commit writes every page programmed and
//! every block erased since the last one to a journal next to the image, syncs it, applies
//! it to the image, syncs the image and empties the journal; opening an image replays a
//! whole journal and ignores a torn one, so a kill or a host crash in the middle of a
//! commit leaves the previous or the new state, never a mixture.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use afa_nand::{Nand, PayloadMode};
use afa_sim::fnv1a;

use crate::ftl::{Changes, FlashMeta, Ftl};
use crate::{WaflashConfig, WaflashError};

const IMAGE_MAGIC: &[u8; 8] = b"AFAWFIMG";
const JOURNAL_MAGIC: &[u8; 8] = b"AFAWFJNL";
const IMAGE_VERSION: u32 = 1;
const HEADER_BYTES: u64 = 4096;
const BLOCK_RECORD_BYTES: u64 = 12;
/// The OOB part of a page slot: logical page (4), pattern (8), sequence number (8), header
/// length (2) and the header, at most 3 + 7 bytes per sector of a 64-sector page.
const SLOT_META_BYTES: usize = 512;
const SLOT_FIXED_BYTES: usize = 22;

/// A WAFLASH medium kept in a file.
#[derive(Debug)]
pub struct WaflashImage {
    path: PathBuf,
    file: File,
    blocks: u32,
    pages_per_block: u32,
    page_bytes: usize,
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

impl WaflashImage {
    fn journal_path(path: &Path) -> PathBuf {
        let mut name = path.as_os_str().to_owned();
        name.push(".journal");
        PathBuf::from(name)
    }

    fn shape(path: &Path, file: File, config: &WaflashConfig) -> Self {
        let g = &config.geometry;
        Self {
            path: path.to_path_buf(),
            file,
            blocks: g.blocks_total(),
            pages_per_block: g.pages_per_block,
            page_bytes: g.page_bytes as usize,
        }
    }

    fn slot_bytes(&self) -> u64 {
        (SLOT_META_BYTES + self.page_bytes) as u64
    }

    fn block_offset(&self, block: u32) -> u64 {
        HEADER_BYTES + block as u64 * BLOCK_RECORD_BYTES
    }

    fn slot_offset(&self, ppn: u32) -> u64 {
        HEADER_BYTES + self.blocks as u64 * BLOCK_RECORD_BYTES + ppn as u64 * self.slot_bytes()
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
        let len = image.slot_offset(image.blocks * image.pages_per_block);
        image
            .file
            .write_all_at(&header(config), 0)
            .and_then(|()| image.file.set_len(len))
            .and_then(|()| image.file.sync_all())
            .map_err(|e| io_error("write the flash image", path, e))?;
        Ok(image)
    }

    /// Opens an image made for `config` and restores its medium into `nand` (new, blank,
    /// holding full bytes): the blocks' write pointers and erase counts, the programmed
    /// pages' bytes, and the OOB areas, which it returns for recovery. A journal left by a
    /// commit that completed is applied first; one cut short is dropped.
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
        let image = Self::shape(path, file, config);
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
        if found != header(config) {
            return Err(WaflashError::Image(format!(
                "{} holds a WAFLASH medium of another shape (geometry or logical size) than \
                 the configuration gives",
                path.display()
            )));
        }
        image.replay_journal()?;
        let geometry_pages = (image.blocks * image.pages_per_block) as usize;
        let mut meta = FlashMeta::blank(geometry_pages);
        let mut record = [0u8; BLOCK_RECORD_BYTES as usize];
        let slot = image.slot_bytes() as usize;
        for block in 0..image.blocks {
            image
                .file
                .read_exact_at(&mut record, image.block_offset(block))
                .map_err(|e| io_error("read the block table of", path, e))?;
            let word = |i: usize| u32::from_le_bytes(record[i..i + 4].try_into().expect("4 bytes"));
            let (next_page, erase_count, bad) = (word(0), word(4), word(8) != 0);
            nand.restore_block(block, next_page, erase_count, bad)
                .map_err(|e| WaflashError::Image(format!("block {block}: {e}")))?;
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

    /// Applies the journal a completed commit left, drops one cut short, and empties it.
    fn replay_journal(&self) -> Result<(), WaflashError> {
        let jpath = Self::journal_path(&self.path);
        let bytes = match std::fs::read(&jpath) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_error("read the journal", &jpath, e)),
        };
        if let Some(entries) = decode_journal(&bytes) {
            for (offset, data) in entries {
                self.file
                    .write_all_at(data, offset)
                    .map_err(|e| io_error("apply the journal to", &self.path, e))?;
            }
            self.file
                .sync_data()
                .map_err(|e| io_error("sync", &self.path, e))?;
        }
        std::fs::remove_file(&jpath).map_err(|e| io_error("remove the journal", &jpath, e))
    }

    /// Makes the image hold the medium as it is now: every page in `changes.pages` still
    /// programmed (its OOB and bytes), and the block record of every block changed.
    pub(crate) fn commit(
        &mut self,
        nand: &Nand,
        changes: &Changes,
        ftl: &Ftl,
    ) -> Result<(), WaflashError> {
        if changes.pages.is_empty() && changes.blocks.is_empty() {
            return Ok(());
        }
        let mut entries: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut blocks: Vec<u32> = changes
            .blocks
            .iter()
            .copied()
            .chain(changes.pages.iter().map(|&p| p / self.pages_per_block))
            .collect();
        blocks.sort_unstable();
        blocks.dedup();
        for &b in &blocks {
            let mut record = Vec::with_capacity(BLOCK_RECORD_BYTES as usize);
            record.extend_from_slice(&nand.next_page(b).to_le_bytes());
            record.extend_from_slice(&nand.erase_count(b).to_le_bytes());
            record.extend_from_slice(&(nand.is_bad(b) as u32).to_le_bytes());
            entries.push((self.block_offset(b), record));
        }
        for &ppn in &changes.pages {
            let block = ppn / self.pages_per_block;
            if ppn - block * self.pages_per_block >= nand.next_page(block) {
                // Programmed, then erased with its block: nothing of it is left.
                continue;
            }
            let (lpn, mask, seq, header) = ftl.page_meta(ppn);
            let mut slot = encode_slot(lpn, mask, seq, header)?;
            slot.extend_from_slice(nand.store().page(ppn));
            entries.push((self.slot_offset(ppn), slot));
        }
        let jpath = Self::journal_path(&self.path);
        let journal = encode_journal(&entries);
        let write_journal = || -> std::io::Result<()> {
            let f = File::create(&jpath)?;
            f.write_all_at(&journal, 0)?;
            f.sync_data()
        };
        write_journal().map_err(|e| io_error("write the journal", &jpath, e))?;
        for (offset, data) in &entries {
            self.file
                .write_all_at(data, *offset)
                .map_err(|e| io_error("write the flash image", &self.path, e))?;
        }
        self.file
            .sync_data()
            .map_err(|e| io_error("sync", &self.path, e))?;
        std::fs::remove_file(&jpath).map_err(|e| io_error("remove the journal", &jpath, e))
    }

    /// Records that the image file was renamed (a fresh image is made under a temporary
    /// name and renamed once it is whole).
    pub fn moved_to(&mut self, path: &Path) {
        self.path = path.to_path_buf();
    }
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

/// The journal: magic, entry count, then (offset, length, bytes) per entry, then the
/// checksum of everything before it.
fn encode_journal(entries: &[(u64, Vec<u8>)]) -> Vec<u8> {
    let body: usize = entries.iter().map(|(_, d)| 12 + d.len()).sum();
    let mut j = Vec::with_capacity(20 + body + 8);
    j.extend_from_slice(JOURNAL_MAGIC);
    j.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    for (offset, data) in entries {
        j.extend_from_slice(&offset.to_le_bytes());
        j.extend_from_slice(&(data.len() as u32).to_le_bytes());
        j.extend_from_slice(data);
    }
    let sum = fnv1a(&j);
    j.extend_from_slice(&sum.to_le_bytes());
    j
}

/// The entries of a whole journal; `None` for one cut short or damaged.
fn decode_journal(j: &[u8]) -> Option<Vec<(u64, &[u8])>> {
    let (body, sum) = j.split_at_checked(j.len().checked_sub(8)?)?;
    if body.get(..8)? != JOURNAL_MAGIC || fnv1a(body).to_le_bytes() != sum {
        return None;
    }
    let count = u64::from_le_bytes(body.get(8..16)?.try_into().ok()?);
    let mut at = 16;
    let mut out = Vec::new();
    for _ in 0..count {
        let offset = u64::from_le_bytes(body.get(at..at + 8)?.try_into().ok()?);
        let len = u32::from_le_bytes(body.get(at + 8..at + 12)?.try_into().ok()?) as usize;
        out.push((offset, body.get(at + 12..at + 12 + len)?));
        at += 12 + len;
    }
    (at == body.len()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_journal_round_trips_and_a_cut_or_damaged_one_is_refused() {
        let entries = vec![(4096u64, vec![1u8, 2, 3]), (1 << 40, vec![9u8; 600])];
        let j = encode_journal(&entries);
        let back = decode_journal(&j).expect("whole journal");
        assert_eq!(back.len(), 2);
        assert_eq!(back[0], (4096, &[1u8, 2, 3][..]));
        assert_eq!(back[1].0, 1 << 40);
        for cut in [0, 7, 20, j.len() / 2, j.len() - 1] {
            assert!(decode_journal(&j[..cut]).is_none(), "cut at {cut}");
        }
        let mut damaged = j.clone();
        damaged[30] ^= 1;
        assert!(decode_journal(&damaged).is_none());
    }

    #[test]
    fn opening_an_image_applies_a_whole_journal_a_commit_left() {
        use afa_ssd::{BlockDevice, Command, ReadBuffers};
        let dir = std::env::temp_dir().join(format!("afa-waflash-journal-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("waflash.img");
        let config = crate::tests::tiny(
            crate::BufferPolicy::Lru,
            crate::FtlKind::MultiVersion,
            false,
        );
        let image = WaflashImage::create(&path, &config).unwrap();
        let shape = WaflashImage::shape(&path, File::open(&path).unwrap(), &config);
        let mut ssd = crate::WaflashSsd::create_in(config.clone(), 1, image).unwrap();
        let data = vec![0xA5u8; 4 * 4096];
        ssd.submit(0, &Command::write(0, 4, &data), ReadBuffers::none())
            .unwrap();
        ssd.submit(10, &Command::flush(), ReadBuffers::none())
            .unwrap();
        drop(ssd);
        // A commit that wrote its journal and was cut before it reached the image: here, one
        // that erases every block.
        let entries: Vec<(u64, Vec<u8>)> = (0..shape.blocks)
            .map(|b| {
                (
                    shape.block_offset(b),
                    vec![0u8; BLOCK_RECORD_BYTES as usize],
                )
            })
            .collect();
        let journal = WaflashImage::journal_path(&path);
        std::fs::write(&journal, encode_journal(&entries)).unwrap();
        let (mut ssd, found) = crate::WaflashSsd::open_image(config, 1, &path).unwrap();
        assert!(!journal.exists());
        assert_eq!(found.mapped_pages, 0, "{found:?}");
        let mut out = vec![1u8; 4 * 4096];
        ssd.submit(
            20,
            &Command::read(0, 4),
            ReadBuffers {
                data: &mut out,
                tags: None,
            },
        )
        .unwrap();
        assert!(out.iter().all(|&b| b == 0));
        let _ = std::fs::remove_dir_all(&dir);
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
}
