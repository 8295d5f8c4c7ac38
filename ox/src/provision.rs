//! Block metadata and block provisioning (§7.2.2, §7.2.3): EBLOCK states and kinds, free
//! pools per LUN ordered by erase count (dynamic wear levelling), and the lines — one open
//! EBLOCK per LUN for each write stream, WBLOCKs striped across channels round-robin and
//! pipelined over the LUNs of a channel.
//!
//! The paper has three provisioning types, HOT (user writes), COLD (GC moves) and META. We
//! split META into two streams with their own open EBLOCKs, the log and the checkpointed
//! table pages, because the log reserves its successors' WBLOCKs ahead (forward links) and
//! nothing else may write into the EBLOCKs it reserved in.

use std::collections::BTreeSet;

use crate::media::{Media, Ppn, Tag, TagKind};
use crate::OxError;

/// The state of an EBLOCK (its 16-bit status field in OX).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockState {
    Free,
    Open,
    Full,
    Bad,
    /// A bad-block table or checkpoint block at a well-known location.
    System,
}

/// What an EBLOCK holds: HOT (user writes), COLD (GC moves), or META (log / tables).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stream {
    Hot,
    Cold,
    Log,
    Table,
}

impl Stream {
    pub const ALL: [Stream; 4] = [Stream::Hot, Stream::Cold, Stream::Log, Stream::Table];
    fn index(self) -> usize {
        match self {
            Stream::Hot => 0,
            Stream::Cold => 1,
            Stream::Log => 2,
            Stream::Table => 3,
        }
    }
}

/// Metadata of one EBLOCK.
#[derive(Debug, Clone, Copy)]
pub struct BlockMeta {
    pub state: BlockState,
    pub stream: Option<Stream>,
    /// WBLOCKs handed out (the controller's write pointer, ahead of the medium's while
    /// reserved WBLOCKs wait for their program).
    pub alloc_ptr: u32,
    /// LPAGEs written or reserved here by contexts not yet installed: GC must not take the
    /// EBLOCK while any remain.
    pub inflight: u32,
    /// A program failed here: GC moves the live pages out and the EBLOCK is retired.
    pub retire: bool,
    /// Highest LSN of a log record held here (log EBLOCKs stay until a checkpoint truncates
    /// the log past it).
    pub max_lsn: u64,
    /// Table pages here that the current tables point at.
    pub table_refs_current: u32,
    /// Table pages here that the last durable checkpoint reaches.
    pub table_refs_durable: u32,
    /// When the EBLOCK became FULL, for ageing.
    pub closed_seq: u64,
}

impl BlockMeta {
    fn free() -> BlockMeta {
        BlockMeta {
            state: BlockState::Free,
            stream: None,
            alloc_ptr: 0,
            inflight: 0,
            retire: false,
            max_lsn: 0,
            table_refs_current: 0,
            table_refs_durable: 0,
            closed_seq: 0,
        }
    }
}

/// The system EBLOCKs: one bad-block table per channel and two checkpoint blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemBlocks {
    pub bbt: Vec<u32>,
    pub checkpoint: [u32; 2],
}

impl SystemBlocks {
    /// Finds them on the medium without any other state, so that recovery finds them again.
    ///
    /// An EBLOCK that holds a bad-block table or a checkpoint record is known by the TAG of
    /// its first written WBLOCK: tables and records carry their kind, and a table its
    /// channel. That is how a system EBLOCK that replaced one whose erase failed is found.
    /// A role no EBLOCK holds yet (a fresh medium, or a replacement the power failed before
    /// its first record reached) takes its well-known EBLOCK by a fixed rule over the
    /// bad-block markers, when that one is good and holds nothing: each channel's BBT is the
    /// first good EBLOCK of its LUN 0, the checkpoint blocks the next good EBLOCKs of LUN 0
    /// of channels 0 and 1. Otherwise it takes the first good EBLOCK that holds nothing, of
    /// its own channel for a BBT.
    pub fn locate(media: &Media) -> Result<SystemBlocks, OxError> {
        let cfg = media.config();
        let channels = cfg.channels as usize;
        let held = |b: u32| -> Option<Tag> {
            let first = media.first_ppn(b);
            (0..media.write_pointer(b))
                .map(|p| media.tag_of(media.ppa(first + p, 0)))
                .find(|t| t.kind != TagKind::Empty)
        };
        // (version or sequence of the first record, EBLOCK) of every role found by its TAG.
        let mut bbt: Vec<Option<(u64, u32)>> = vec![None; channels];
        let mut checkpoint: Vec<(u64, u32)> = Vec::new();
        for b in 0..media.eblocks_total() {
            if media.is_bad(b) {
                continue;
            }
            match held(b) {
                Some(t) if t.kind == TagKind::Bbt && (t.lpid as usize) < channels => {
                    let slot = &mut bbt[t.lpid as usize];
                    if slot.is_none_or(|(v, _)| t.seq > v) {
                        *slot = Some((t.seq, b));
                    }
                }
                Some(t) if t.kind == TagKind::Checkpoint => checkpoint.push((t.seq, b)),
                _ => {}
            }
        }
        // Two checkpoint EBLOCKs at most hold records: one replaced goes bad first.
        checkpoint.sort_by_key(|&(seq, b)| (std::cmp::Reverse(seq), b));
        checkpoint.truncate(2);
        let mut taken: BTreeSet<u32> = bbt
            .iter()
            .flatten()
            .map(|&(_, b)| b)
            .chain(checkpoint.iter().map(|&(_, b)| b))
            .collect();
        let good_in_lun0 = |ch: u32, skip: usize| -> Option<u32> {
            (0..cfg.eblocks_per_lun)
                .map(|i| media.block_at(ch, 0, i))
                .filter(|&b| !media.is_bad(b))
                .nth(skip)
        };
        let mut fill = |well_known: Option<u32>, channel: Option<u32>| -> Option<u32> {
            let unused = |b: u32, taken: &BTreeSet<u32>| {
                !media.is_bad(b) && !taken.contains(&b) && held(b).is_none()
            };
            let b = well_known.filter(|&b| unused(b, &taken)).or_else(|| {
                (0..media.eblocks_total()).find(|&b| {
                    channel.is_none_or(|ch| media.channel_of(b) == ch) && unused(b, &taken)
                })
            })?;
            taken.insert(b);
            Some(b)
        };
        let mut bbt_blocks = Vec::with_capacity(channels);
        for ch in 0..cfg.channels {
            let b = match bbt[ch as usize] {
                Some((_, b)) => b,
                None => fill(good_in_lun0(ch, 0), Some(ch)).ok_or_else(|| {
                    OxError::Config(format!(
                        "channel {ch} has no good EBLOCK for its bad-block table"
                    ))
                })?,
            };
            bbt_blocks.push(b);
        }
        let well_known = [
            good_in_lun0(0, 1),
            good_in_lun0(1 % cfg.channels, if cfg.channels == 1 { 2 } else { 1 }),
        ];
        let mut found = checkpoint.iter().map(|&(_, b)| b);
        let mut ckpt = [0u32; 2];
        for (i, slot) in ckpt.iter_mut().enumerate() {
            *slot = match found.next() {
                Some(b) => b,
                None => fill(well_known[i], None).ok_or_else(|| {
                    OxError::Config("no good EBLOCK for a checkpoint block".into())
                })?,
            };
        }
        Ok(SystemBlocks {
            bbt: bbt_blocks,
            checkpoint: ckpt,
        })
    }

    pub fn contains(&self, block: u32) -> bool {
        self.bbt.contains(&block) || self.checkpoint.contains(&block)
    }
}

/// EBLOCK metadata, free pools and lines.
#[derive(Debug, Clone)]
pub struct Provisioner {
    pub blocks: Vec<BlockMeta>,
    /// Free EBLOCKs per (channel, LUN), least erased first.
    free: Vec<BTreeSet<(u32, u32)>>,
    /// Open EBLOCK per (stream, channel, LUN).
    open: Vec<Option<u32>>,
    lun_cursor: Vec<u32>,
    channel_cursor: [u32; 4],
    /// Channels under GC: closed to user writes (§7.2.8).
    pub gc_channels: Vec<bool>,
    /// Channels that needed GC but were refused a turn because `max_gc_channels` channels
    /// held one; the next turn to end wakes them.
    pub gc_turn_waiting: Vec<bool>,
    /// Data-capable EBLOCKs per channel (not system, not factory bad).
    pub usable_per_channel: Vec<u32>,
    channels: u32,
    luns: u32,
    wblocks_per_eblock: u32,
    close_seq: u64,
}

impl Provisioner {
    /// All EBLOCKs free except the system ones and the bad ones.
    pub fn new(media: &Media, system: &SystemBlocks) -> Provisioner {
        let cfg = media.config();
        let (channels, luns) = (cfg.channels, cfg.luns_per_channel);
        let mut p = Provisioner {
            blocks: vec![BlockMeta::free(); media.eblocks_total() as usize],
            free: vec![BTreeSet::new(); (channels * luns) as usize],
            open: vec![None; 4 * (channels * luns) as usize],
            lun_cursor: vec![0; 4 * channels as usize],
            channel_cursor: [0; 4],
            gc_channels: vec![false; channels as usize],
            gc_turn_waiting: vec![false; channels as usize],
            usable_per_channel: vec![0; channels as usize],
            channels,
            luns,
            wblocks_per_eblock: media.wblocks_per_eblock(),
            close_seq: 0,
        };
        for b in 0..media.eblocks_total() {
            if system.contains(b) {
                p.blocks[b as usize].state = BlockState::System;
            } else if media.is_bad(b) {
                p.blocks[b as usize].state = BlockState::Bad;
            } else {
                p.usable_per_channel[media.channel_of(b) as usize] += 1;
                p.add_free(media, b);
            }
        }
        p
    }

    fn pool(&self, channel: u32, lun: u32) -> usize {
        (channel * self.luns + lun) as usize
    }

    /// Returns an erased EBLOCK to its pool.
    pub fn add_free(&mut self, media: &Media, block: u32) {
        let m = &mut self.blocks[block as usize];
        *m = BlockMeta::free();
        let pool = self.pool(media.channel_of(block), media.lun_of(block));
        self.free[pool].insert((media.erase_count(block), block));
    }

    /// Takes an EBLOCK out of the pools (recovery found it written, or it went bad).
    pub fn remove_free(&mut self, media: &Media, block: u32) {
        let pool = self.pool(media.channel_of(block), media.lun_of(block));
        self.free[pool].retain(|&(_, b)| b != block);
    }

    pub fn free_in_channel(&self, channel: u32) -> u32 {
        (0..self.luns)
            .map(|l| self.free[self.pool(channel, l)].len() as u32)
            .sum()
    }

    /// Fraction of a channel's usable EBLOCKs not free.
    pub fn used_fraction(&self, channel: u32) -> f64 {
        let usable = self.usable_per_channel[channel as usize].max(1);
        1.0 - self.free_in_channel(channel) as f64 / usable as f64
    }

    /// Free EBLOCKs a channel keeps back from `stream`: user writes stop at 2 × LUNs + 2,
    /// GC copies at LUNs + 2, and the last two are for the log and the tables.
    pub fn reserve_eblocks(&self, stream: Stream) -> u32 {
        match stream {
            Stream::Hot => 2 * self.luns + 2,
            Stream::Cold => self.luns + 2,
            Stream::Log | Stream::Table => 0,
        }
    }

    pub fn is_gc_channel(&self, channel: u32) -> bool {
        self.gc_channels[channel as usize]
    }

    fn open_slot(&self, stream: Stream, channel: u32, lun: u32) -> usize {
        (stream.index() * (self.channels * self.luns) as usize) + self.pool(channel, lun)
    }

    /// The open EBLOCK of a stream in a LUN, opening one from the pool if the channel has
    /// more than `reserve` free EBLOCKs.
    fn open_block(
        &mut self,
        media: &Media,
        stream: Stream,
        channel: u32,
        lun: u32,
        reserve: u32,
    ) -> Option<u32> {
        let slot = self.open_slot(stream, channel, lun);
        if let Some(b) = self.open[slot] {
            let m = &self.blocks[b as usize];
            if m.alloc_ptr < self.wblocks_per_eblock && !m.retire {
                return Some(b);
            }
            self.close(b);
            self.open[slot] = None;
        }
        if self.free_in_channel(channel) <= reserve {
            return None;
        }
        let pool = self.pool(channel, lun);
        let (_, b) = self.free[pool].pop_first()?;
        let _ = media;
        let m = &mut self.blocks[b as usize];
        m.state = BlockState::Open;
        m.stream = Some(stream);
        m.alloc_ptr = 0;
        self.open[slot] = Some(b);
        Some(b)
    }

    fn close(&mut self, block: u32) {
        self.close_seq += 1;
        let m = &mut self.blocks[block as usize];
        if m.state == BlockState::Open {
            m.state = BlockState::Full;
            m.closed_seq = self.close_seq;
        }
    }

    /// Closes every open EBLOCK of a stream that sits in `block`'s slot (after a failure).
    pub fn close_block(&mut self, block: u32) {
        for slot in self.open.iter_mut() {
            if *slot == Some(block) {
                *slot = None;
            }
        }
        self.close(block);
    }

    /// Hands out the next WBLOCK of a stream in one channel, pipelining over its LUNs.
    ///
    /// Each stream leaves a reserve of free EBLOCKs in the channel for the ones that free
    /// space (`reserve_eblocks`): user writes stop first, GC copies next; the last two
    /// EBLOCKs are for the log and the tables, which a checkpoint needs before it can
    /// truncate anything.
    pub fn alloc_in_channel(&mut self, media: &Media, stream: Stream, channel: u32) -> Option<Ppn> {
        self.alloc_in_channel_above(media, stream, channel, self.reserve_eblocks(stream))
    }

    /// Hands out the next WBLOCK for a copy of a GC victim's page in the victim's own
    /// channel. A pass there gives an EBLOCK of the channel back, so its copies may go down
    /// to the log and table streams' last two free EBLOCKs, below the reserve GC copies keep
    /// elsewhere: when the channels waiting for a GC turn had been drained to that reserve
    /// by the log and table streams, their turn came and no copy could be placed, however
    /// invalid their victims were.
    pub fn alloc_gc_copy_in_channel(&mut self, media: &Media, channel: u32) -> Option<Ppn> {
        self.alloc_in_channel_above(media, Stream::Cold, channel, 2)
    }

    fn alloc_in_channel_above(
        &mut self,
        media: &Media,
        stream: Stream,
        channel: u32,
        reserve: u32,
    ) -> Option<Ppn> {
        let cursor_slot = stream.index() * self.channels as usize + channel as usize;
        for k in 0..self.luns {
            let lun = (self.lun_cursor[cursor_slot] + k) % self.luns;
            if let Some(b) = self.open_block(media, stream, channel, lun, reserve) {
                self.lun_cursor[cursor_slot] = (lun + 1) % self.luns;
                let m = &mut self.blocks[b as usize];
                let ppn = media.first_ppn(b) + m.alloc_ptr;
                m.alloc_ptr += 1;
                if m.alloc_ptr == self.wblocks_per_eblock {
                    let slot = self.open_slot(stream, channel, lun);
                    self.open[slot] = None;
                    self.close(b);
                }
                return Some(ppn);
            }
        }
        None
    }

    /// Hands out the next WBLOCK of a stream, striping over channels round-robin. User
    /// writes (HOT) skip channels under GC.
    pub fn alloc(&mut self, media: &Media, stream: Stream) -> Option<Ppn> {
        let s = stream.index();
        for k in 0..self.channels {
            let ch = (self.channel_cursor[s] + k) % self.channels;
            if stream == Stream::Hot && self.gc_channels[ch as usize] {
                continue;
            }
            if let Some(ppn) = self.alloc_in_channel(media, stream, ch) {
                self.channel_cursor[s] = (ch + 1) % self.channels;
                return Some(ppn);
            }
        }
        None
    }

    /// Like `alloc`, but also in channels closed for GC.
    pub fn alloc_any(&mut self, media: &Media, stream: Stream) -> Option<Ppn> {
        self.alloc_any_above(media, stream, self.reserve_eblocks(stream))
    }

    /// Hands out the next WBLOCK of a stream in any channel that has more than `reserve`
    /// free EBLOCKs, whatever the stream's own reserve (see `alloc_in_channel`).
    pub fn alloc_any_above(&mut self, media: &Media, stream: Stream, reserve: u32) -> Option<Ppn> {
        let s = stream.index();
        for k in 0..self.channels {
            let ch = (self.channel_cursor[s] + k) % self.channels;
            if let Some(ppn) = self.alloc_in_channel_above(media, stream, ch, reserve) {
                self.channel_cursor[s] = (ch + 1) % self.channels;
                return Some(ppn);
            }
        }
        None
    }

    /// The channel cursor of a stream (saved in the checkpoint record so that provisioning
    /// continues its round-robin after recovery).
    pub fn channel_cursor(&self, stream: Stream) -> u32 {
        self.channel_cursor[stream.index()]
    }
    pub fn set_channel_cursor(&mut self, stream: Stream, ch: u32) {
        self.channel_cursor[stream.index()] = ch % self.channels;
    }

    /// Marks an EBLOCK recovery found written, holding `stream`.
    pub fn mark_recovered(&mut self, media: &Media, block: u32, stream: Stream) {
        self.remove_free(media, block);
        self.close_seq += 1;
        let m = &mut self.blocks[block as usize];
        m.state = BlockState::Full;
        m.stream = Some(stream);
        // A partly written EBLOCK found at recovery is closed: the WBLOCKs after a torn one
        // are not trusted, and its pages are garbage-collected like any other.
        m.alloc_ptr = self.wblocks_per_eblock;
        m.closed_seq = self.close_seq;
    }

    /// Takes the least-erased free EBLOCK of `channel`, or of the channel with the most free
    /// EBLOCKs when it has none, for a system role: it leaves the data pools for good.
    pub fn take_for_system(&mut self, media: &Media, channel: u32) -> Option<u32> {
        let ch = if self.free_in_channel(channel) > 0 {
            channel
        } else {
            (0..self.channels)
                .filter(|&c| self.free_in_channel(c) > 0)
                .max_by_key(|&c| (self.free_in_channel(c), std::cmp::Reverse(c)))?
        };
        let (_, block) = (0..self.luns)
            .filter_map(|l| self.free[self.pool(ch, l)].first().copied())
            .min()?;
        self.remove_free(media, block);
        self.usable_per_channel[ch as usize] =
            self.usable_per_channel[ch as usize].saturating_sub(1);
        let m = &mut self.blocks[block as usize];
        m.state = BlockState::System;
        m.stream = None;
        Some(block)
    }

    /// Marks an EBLOCK bad and out of every pool and line.
    pub fn mark_bad(&mut self, media: &Media, block: u32) {
        self.remove_free(media, block);
        self.close_block(block);
        let ch = media.channel_of(block) as usize;
        // A system EBLOCK was never counted as usable for data.
        if !matches!(
            self.blocks[block as usize].state,
            BlockState::Bad | BlockState::System
        ) {
            self.usable_per_channel[ch] = self.usable_per_channel[ch].saturating_sub(1);
        }
        let m = &mut self.blocks[block as usize];
        m.state = BlockState::Bad;
        m.stream = None;
    }

    /// Every EBLOCK of a channel.
    pub fn blocks_of_channel<'a>(
        &'a self,
        media: &'a Media,
        channel: u32,
    ) -> impl Iterator<Item = u32> + 'a {
        (0..self.blocks.len() as u32).filter(move |&b| media.channel_of(b) == channel)
    }
}
