//! The recovery log (§4): its records and the log blocks that hold them.
//!
//! The log is logically sequential but not physically: each log block (one WBLOCK in the
//! META line) holds a back link to its predecessor and an ordered vector of forward links,
//! the WBLOCKs reserved for its successor. A failed log write retries at the next forward
//! link; recovery follows the links until they lead only to erased (or torn) WBLOCKs.
//!
//! A record is durable once its log block and every earlier one are on flash: the writer
//! keeps one log program in flight at a time, so a block's program end is its prefix-durable
//! time. Records that arrive while a log program runs are grouped into the next block (group
//! commit).

use afa_sim::TimeNs;

use crate::media::{Ppa, Ppn};
use crate::tables::TableId;

/// Bytes of a record's fixed part (the paper's log records are 64 bytes).
pub const RECORD_HEADER_BYTES: u32 = 64;
/// Bytes of a log block's header: sequence, first LSN, back link, count, check.
pub const LOG_BLOCK_HEADER_BYTES: u32 = 64;

/// One LPAGE of a write context: its LPID, where it was (the prior address, which makes the
/// log an undo log for GC information too, §4.3) and where the new version goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdescEntry {
    pub lpid: u64,
    pub prior: Ppa,
    /// `Ppa::NONE` for a trim.
    pub new: Ppa,
}

/// A page that GC moved and installed (the optimistic MAP check succeeded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcMove {
    pub lpid: u64,
    pub prior: Ppa,
    pub new: Ppa,
}

/// A record of the recovery log.
#[derive(Debug, Clone, PartialEq)]
pub enum LogRecord {
    /// Redo descriptor of a write context (§4.2.1), durable before its data is written.
    Rdesc { ctx: u64, entries: Vec<RdescEntry> },
    /// Amendment (§4.2.2): new addresses for entries (by index) whose writes failed.
    RdescA {
        ctx: u64,
        amendments: Vec<(u32, Ppa)>,
    },
    /// The context's MAP updates are installed.
    Done { ctx: u64 },
    /// A GC pass over one victim: the moves it installed. Durable before the victim is
    /// erased, so that recovery never follows MAP into an erased EBLOCK. `erase_count` is
    /// the victim's erase count once erased (carried in the record header): recovery sets
    /// WEAR to at least that, which is right however often it redoes the record, and also
    /// when a fuzzy checkpoint's WEAR page already counted the erase.
    Gc {
        victim: u32,
        erase_count: u32,
        moves: Vec<GcMove>,
    },
    /// A log or table EBLOCK reclaimed after a checkpoint truncated it (keeps WEAR exact),
    /// with its erase count once erased, as in `Gc`.
    Erase { block: u32, erase_count: u32 },
    /// The table pages a checkpoint wrote, logged before the checkpoint record (§6.2).
    CkptPages {
        ckpt: u64,
        pages: Vec<(TableId, u32, Ppn)>,
    },
}

impl LogRecord {
    /// Bytes the record takes in a log block.
    pub fn bytes(&self) -> u32 {
        RECORD_HEADER_BYTES
            + match self {
                LogRecord::Rdesc { entries, .. } => 24 * entries.len() as u32,
                LogRecord::RdescA { amendments, .. } => 12 * amendments.len() as u32,
                LogRecord::Done { .. } | LogRecord::Erase { .. } => 0,
                LogRecord::Gc { moves, .. } => 24 * moves.len() as u32,
                LogRecord::CkptPages { pages, .. } => 12 * pages.len() as u32,
            }
    }
}

/// The content of one log WBLOCK.
#[derive(Debug, Clone, PartialEq)]
pub struct LogBlock {
    /// Position of the block in the chain (0, 1, 2, …).
    pub seq: u64,
    /// Records with their log sequence numbers, in order.
    pub records: Vec<(u64, LogRecord)>,
    /// Back link: the WBLOCK of the predecessor.
    pub prev: Option<Ppn>,
    /// Forward links: the WBLOCKs reserved for the successor, tried in order.
    pub links: Vec<Ppn>,
}

impl LogBlock {
    pub fn last_lsn(&self) -> Option<u64> {
        self.records.last().map(|r| r.0)
    }
}

/// A log block being filled, not yet programmed.
#[derive(Debug, Clone)]
pub struct FormingBlock {
    pub seq: u64,
    pub records: Vec<(u64, LogRecord)>,
    pub bytes: u32,
    /// When it is programmed: the earliest time after the previous log program ended.
    pub issue_ns: TimeNs,
}

/// Where the log stands; the controller does the I/O.
#[derive(Debug, Clone)]
pub struct LogState {
    pub next_lsn: u64,
    pub next_block_seq: u64,
    /// WBLOCKs reserved for the next log block.
    pub links: Vec<Ppn>,
    /// WBLOCK of the last log block written, for the back link.
    pub last_ppn: Option<Ppn>,
    /// When the last log program ends (the next one starts no earlier).
    pub last_end_ns: TimeNs,
    /// Records with LSN below this are durable.
    pub durable_lsn: u64,
    /// Log blocks written, by sequence: (WBLOCK, first LSN, last LSN), for truncation.
    pub written: std::collections::BTreeMap<u64, (Ppn, u64, u64)>,
    pub capacity_bytes: u32,
}

impl LogState {
    pub fn new(next_lsn: u64, next_block_seq: u64, wblock_bytes: u32) -> LogState {
        LogState {
            next_lsn,
            next_block_seq,
            links: Vec::new(),
            last_ppn: None,
            last_end_ns: 0,
            durable_lsn: next_lsn,
            written: std::collections::BTreeMap::new(),
            capacity_bytes: wblock_bytes - LOG_BLOCK_HEADER_BYTES,
        }
    }
}
