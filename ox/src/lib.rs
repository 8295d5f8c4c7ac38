//! OX/OXBatch: the controller software of a programmable SSD with an in-SSD log-structured
//! FTL behind an atomic batch write interface (Do, Picoli, Bonnet, Lomet, "Better Database
//! Cost/Performance via Batched I/O on Programmable SSD"), the OXBlock baseline behind a
//! block interface, a host key-value store on both, and a YCSB generator.
//!
//! The crate's tree follows the controller:
//!
//! | Module | What it holds |
//! |---|---|
//! | `config` | flash terms (RBLOCK, WBLOCK, EBLOCK, TAG), medium shape, controller costs, GC, checkpoints |
//! | `media` | the media manager over `afa_nand::Nand`: TAGs, metadata WBLOCKs, written vs durable |
//! | `tables` | MAP with MAP_S/MAP_T and the on-demand MAP cache, GBITV (+S, T), WEAR (+S) |
//! | `provision` | block metadata, HOT/COLD/META lines striped over channels, free pools by wear |
//! | `log` | RDESC, RDESC_A, `done`, GC and checkpoint records; the doubly linked log |
//! | `controller` | the event-driven FTL: commands, write contexts, the WAL protocol, reads |
//! | `gc` | per-channel GC with the optimistic MAP check, static wear levelling |
//! | `checkpoint` | fuzzy incremental checkpoints and log truncation |
//! | `recovery` | power loss and recovery from the checkpoint record |
//! | `block` | OXBlock: the block interface and the `BlockDevice` seam |
//! | `image` | the flash image: the medium's bytes, TAGs and metadata as a file (serve mode) |
//! | `served` | OXBlock with real bytes over the flash image, for `afa serve` |
//! | `kv` | the host key-value store (B-tree, page cache, write buffer, LLAMA on block) |
//! | `ycsb` | YCSB workloads with a scrambled zipfian key choice |
//! | `reproduce` | the paper's measurements (`ox-fig12`, `ox-fig13`, `ox-table4`, `ox-fig14`, `ox-fig15`) |
//!
//! # Fault model
//!
//! Written down before any fault is injected; the recovery tests check each rule.
//!
//! **Power loss at time T.** Everything that happened in virtual time up to and including T
//! happened. Then:
//!
//! - *Durable*: a WBLOCK program whose end time is at most T. Its RBLOCKs, TAGs and metadata
//!   read back exactly.
//! - *Written but not durable*: a WBLOCK program that had started or was queued on its die
//!   and ends after T is torn. The WBLOCK is consumed (the EBLOCK's write pointer is past it)
//!   and reads back nothing valid: its TAGs are invalid and its metadata is gone, as after a
//!   failed program. Torn WBLOCKs are never repaired; the EBLOCK is closed and collected.
//! - An erase that ends after T is treated as done (the EBLOCK reads back erased): OX only
//!   erases EBLOCKs with nothing live in them (GC victims after their GC record is durable,
//!   log and table EBLOCKs after a durable checkpoint truncated them), so either outcome is
//!   safe.
//! - All controller DRAM is lost: MAP cache, MAP_S, GBITV, WEAR, block metadata, contexts,
//!   the log's forming block, queued commands. A command whose completion the host received
//!   by T was acknowledged; every other one was not.
//!
//! **What recovery guarantees.**
//!
//! 1. Every acknowledged batch is fully present (its RDESC was durable before its data, its
//!    data before its MAP install, its install before the acknowledgement).
//! 2. No unacknowledged batch is partly present: a batch without a durable `done` is
//!    installed only if every one of its RBLOCKs verifies by its TAG, and later batches are
//!    dropped after the first one that does not.
//! 3. Reads after recovery return, for every LPID, the newest present version.
//! 4. GBITV marks exactly the RBLOCKs MAP points at.
//!
//! On the block interface (OXBlock) each packet is its own context, so rules 1–2 hold per
//! packet, not per write — which is the paper's point.
//!
//! **Media faults.** A page program fails with `faults.program_fail_probability`: the WBLOCK
//! is consumed, nothing is stored, the EBLOCK is closed and retired once its live pages have
//! moved. A failed data program is amended by an RDESC_A (durable before the retry); a failed
//! log program retries at the next forward link, and a log block whose every link failed is
//! bridged: it goes to fresh WBLOCKs that a reissued checkpoint record names for recovery.
//! An erase fails with
//! `faults.erase_fail_probability`: the EBLOCK becomes bad and the bad-block table of its
//! channel is rewritten. A bad-block table or checkpoint EBLOCK whose erase fails is replaced
//! by a free EBLOCK, which recovery finds by the TAG of its first record. Factory bad EBLOCKs
//! are never provisioned.

mod batch;
mod block;
mod checkpoint;
mod config;
mod controller;
mod error;
mod gc;
mod image;
pub mod kv;
mod log;
mod media;
mod page_lru;
mod provision;
mod recovery;
pub mod reproduce;
mod served;
mod tables;
mod write_cache;
pub mod ycsb;

pub use batch::{BatchBuffer, CompletionRecord, Desc, Request, RequestId};
pub use block::OxBlockDevice;
pub use checkpoint::CheckpointRecord;
pub use config::{
    ControllerCosts, FlashTerms, OxCheckpointConfig, OxConfig, OxGcConfig, OxWriteCacheConfig,
};
pub use controller::{OxController, OxStats};
pub use error::OxError;
pub use image::{decode_meta, encode_meta, EblockRecord, FlashImage, SlotContent};
pub use log::{GcMove, LogBlock, LogRecord, RdescEntry};
pub use media::{Media, MediaCounters, MetaBlob, Ppa, Ppn, RblockWrite, Tag, TagKind};
pub use recovery::{PoweredOff, RecoveryReport};
pub use reproduce::{reproduce, Reproduction};
pub use served::OxServedDevice;
pub use tables::{MapEntry, TableId, TablePage};

#[cfg(test)]
mod image_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod write_cache_tests;
