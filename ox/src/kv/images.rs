//! What the host's pages hold on the device, beside the tokens the device stores.
//!
//! The controller moves 8-byte tokens, not page bytes (docs/ox.md, "Not built"). A host that
//! must rebuild itself after a power loss needs the bytes its pages held: the B-tree node, the
//! LLAMA page header, a map page of its host checkpoint, the checkpoint record. `PageImages`
//! keeps them keyed by the address the host wrote them at (an LBA on the block interface, an
//! LPID on the batch interface) and by the token they were written with, so a read after a
//! power loss returns exactly what the device holds there: the image whose token the device
//! returned, or nothing when the device returns a token the host never wrote there (a torn
//! or trimmed page).
//!
//! A write that a power loss tears leaves the previous image readable on the device (OX only
//! installs a context whose pages are all on flash), so each address keeps its last
//! [`IMAGES_PER_ADDRESS`] images: the durable one and the writes that may still be in flight
//! after it.

use std::collections::VecDeque;

use super::Node;

/// Images kept per address: the newest durable one plus as many writes in flight after it as
/// the store ever has (two flushes, or a checkpoint's map page overwritten once more).
pub const IMAGES_PER_ADDRESS: usize = 4;

/// The LLAMA flush header every page of a flush carries: which flush wrote it and what the
/// B-tree was at the operation boundary the flush was taken at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlushHeader {
    /// The flush's number (flushes are numbered in the order they are submitted).
    pub flush: u64,
    /// Pages the flush carries (block interface: the segment's written pages).
    pub pages_in_flush: u32,
    /// The B-tree's root LPID and its number of pages at the flush.
    pub root: u64,
    pub pages: u64,
    /// Block interface: every flush numbered below this one had been cleaned by host GC
    /// before this flush was submitted (the log is cleaned in flush order), so a missing
    /// flush below it is a cleaned one, not one the power loss cut off.
    pub log_head_flush: u64,
}

/// The block host's checkpoint record, at one of two well-known LBAs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointRecord {
    /// The checkpoint's number; the newest readable record wins.
    pub seq: u64,
    /// Replay the log from this flush number: every flush below it is in the map pages.
    pub replay_from_flush: u64,
    /// The flush header as of the newest flush below `replay_from_flush` (root and page
    /// count when no flush is replayed).
    pub root: u64,
    pub pages: u64,
    pub log_head_flush: u64,
    /// For each map page, the half of the checkpoint area that holds its newest copy
    /// (`None`: never written, every entry unmapped).
    pub halves: Vec<Option<u8>>,
}

/// One image.
#[derive(Debug, Clone)]
pub enum PageImage {
    /// A B-tree page as a flush wrote it.
    Node {
        lpid: u64,
        version: u64,
        header: FlushHeader,
        node: Node,
    },
    /// A page of the block host's LPID → LBA map (`PAGE_BYTES / 8` entries).
    MapPage {
        index: u64,
        lbas: Vec<u64>,
    },
    Record(CheckpointRecord),
}

/// The images, per address, newest last.
#[derive(Debug, Default)]
pub struct PageImages {
    at: Vec<VecDeque<(u64, PageImage)>>,
}

impl PageImages {
    pub fn new(addresses: u64) -> PageImages {
        PageImages {
            at: (0..addresses).map(|_| VecDeque::new()).collect(),
        }
    }

    /// The host writes `image` with `token` at `address`.
    pub fn write(&mut self, address: u64, token: u64, image: PageImage) {
        let slot = &mut self.at[address as usize];
        slot.retain(|(t, _)| *t != token);
        if slot.len() == IMAGES_PER_ADDRESS {
            slot.pop_front();
        }
        slot.push_back((token, image));
    }

    /// What a read of `address` that returned `token` holds.
    pub fn read(&self, address: u64, token: u64) -> Option<&PageImage> {
        self.at
            .get(address as usize)?
            .iter()
            .rev()
            .find(|(t, _)| *t == token)
            .map(|(_, i)| i)
    }
}
