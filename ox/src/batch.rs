//! The batch I/O interface (§3): the host buffer of a `flush_batch` — a DESC block listing
//! the LPIDs of the LPAGEs that follow — and the requests and completions of the controller.

use afa_sim::TimeNs;

use crate::OxError;

/// The DESC block: the first RBLOCK of a batch buffer, an 8-byte little-endian count
/// followed by one 8-byte LPID per LPAGE of the buffer, in buffer order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desc {
    pub lpids: Vec<u64>,
}

impl Desc {
    /// Encodes the DESC as one RBLOCK of `rblock_bytes`.
    pub fn encode(&self, rblock_bytes: u32) -> Result<Vec<u8>, OxError> {
        let max = (rblock_bytes as usize - 8) / 8;
        if self.lpids.len() > max {
            return Err(OxError::BatchTooLarge {
                pages: self.lpids.len(),
                max,
            });
        }
        let mut out = vec![0u8; rblock_bytes as usize];
        out[..8].copy_from_slice(&(self.lpids.len() as u64).to_le_bytes());
        for (i, l) in self.lpids.iter().enumerate() {
            out[8 + 8 * i..16 + 8 * i].copy_from_slice(&l.to_le_bytes());
        }
        Ok(out)
    }

    /// Parses a DESC block; a count that does not fit the block is refused.
    pub fn parse(block: &[u8]) -> Result<Desc, OxError> {
        if block.len() < 8 {
            return Err(OxError::MalformedDesc(format!(
                "{} bytes cannot hold the count",
                block.len()
            )));
        }
        let mut word = [0u8; 8];
        word.copy_from_slice(&block[..8]);
        let count = u64::from_le_bytes(word);
        let room = (block.len() as u64 - 8) / 8;
        if count > room {
            return Err(OxError::MalformedDesc(format!(
                "count {count} exceeds the {room} LPIDs the block can hold"
            )));
        }
        let lpids = (0..count as usize)
            .map(|i| {
                word.copy_from_slice(&block[8 + 8 * i..16 + 8 * i]);
                u64::from_le_bytes(word)
            })
            .collect();
        Ok(Desc { lpids })
    }
}

/// A host buffer for `flush_batch`: the DESC block and the payload token of every LPAGE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchBuffer {
    pub desc_block: Vec<u8>,
    pub tokens: Vec<u64>,
}

impl BatchBuffer {
    /// Builds a buffer from (LPID, token) pairs in time order.
    pub fn new(pages: &[(u64, u64)], rblock_bytes: u32) -> Result<BatchBuffer, OxError> {
        let desc = Desc {
            lpids: pages.iter().map(|p| p.0).collect(),
        };
        Ok(BatchBuffer {
            desc_block: desc.encode(rblock_bytes)?,
            tokens: pages.iter().map(|p| p.1).collect(),
        })
    }
}

/// Identifies a submitted request.
pub type RequestId = u64;

/// A host command to the controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Batch interface: write every LPAGE of the buffer atomically.
    FlushBatch(BatchBuffer),
    /// Batch interface: read one LPAGE by LPID.
    ReadLpid(u64),
    /// Batch interface: read a set of LPAGEs in one command.
    ReadBatch(Vec<u64>),
    /// Block interface (OXBlock): write consecutive logical pages starting at `lba`; the
    /// write arrives as transport packets and each packet is its own write context.
    WriteBlocks { lba: u64, tokens: Vec<u64> },
    /// Block interface: read consecutive logical pages.
    ReadBlocks { lba: u64, count: u32 },
    /// Block interface: deallocate consecutive logical pages (they read back as zero).
    TrimBlocks { lba: u64, count: u32 },
}

impl Request {
    /// Whether the command only reads (a read-only device still takes it).
    pub fn is_read(&self) -> bool {
        matches!(
            self,
            Request::ReadLpid(_) | Request::ReadBatch(_) | Request::ReadBlocks { .. }
        )
    }
}

/// What the host sees when a request completes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompletionRecord {
    pub id: RequestId,
    pub submitted_ns: TimeNs,
    pub done_ns: TimeNs,
    /// The tokens read (one per LPAGE; zero for an unmapped one), empty for writes.
    pub result: Result<Vec<u64>, OxError>,
}
