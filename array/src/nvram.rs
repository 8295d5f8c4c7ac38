//! A log-structured engine's battery-backed host memory as a log that outlives the host
//! (SWAN §4.1; Log-RAID's NVRAM). Every segment opened and every block appended to an open
//! segment (with its data) is recorded before the append returns; when a segment closes
//! (its summary is on the members) the engine replaces the log by its open segments alone.
//!
//! Frames: `len: u32 LE`, `checksum: u64 LE` (FNV-1a of the body), `body`. A frame cut short
//! or failing its checksum ends the log: it was being written when the crash came, and its
//! append had not returned, so its write was never acknowledged.

use std::sync::{Arc, Mutex};

use afa_ssd::DeviceError;

use crate::swan::fnv1a;

/// Durable storage for a log-structured engine's battery-backed host memory.
pub trait NvramLog: Send + std::fmt::Debug {
    /// Appends `bytes`; once this returns they survive a crash of the process.
    fn append(&mut self, bytes: &[u8]) -> Result<(), DeviceError>;
    /// Replaces the whole log with `bytes`, atomically: after a crash the log holds either
    /// the old contents or the new.
    fn replace(&mut self, bytes: &[u8]) -> Result<(), DeviceError>;
    /// Makes everything appended so far survive a power loss too.
    fn sync(&mut self) -> Result<(), DeviceError>;
    /// The log's contents, for recovery.
    fn contents(&self) -> Result<Vec<u8>, DeviceError>;
}

/// A log in memory, shared between clones: what a battery keeps when the host loses power.
/// Tests drop the engine (the crash) and recover a new one from a clone.
#[derive(Debug, Clone, Default)]
pub struct MemNvram {
    bytes: Arc<Mutex<Vec<u8>>>,
}

impl MemNvram {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        self.bytes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes held now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl NvramLog for MemNvram {
    fn append(&mut self, bytes: &[u8]) -> Result<(), DeviceError> {
        self.lock().extend_from_slice(bytes);
        Ok(())
    }
    fn replace(&mut self, bytes: &[u8]) -> Result<(), DeviceError> {
        *self.lock() = bytes.to_vec();
        Ok(())
    }
    fn sync(&mut self) -> Result<(), DeviceError> {
        Ok(())
    }
    fn contents(&self) -> Result<Vec<u8>, DeviceError> {
        Ok(self.lock().clone())
    }
}

const OPEN: u8 = 1;
const BLOCK: u8 = 2;
const FRAME_HEADER_BYTES: usize = 12;

/// One logged event. Stream 0 is the user stream, stream 1 + g group g's GC stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Record {
    Open {
        stream: u32,
        segment: u32,
        seq: u64,
    },
    /// The next block of the stream's open segment; `data` is empty when the block's stripe
    /// was already on the members when the log was last replaced.
    Block {
        stream: u32,
        lba: u32,
        wseq: u64,
        data: Vec<u8>,
    },
}

fn frame(body: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&fnv1a(body).to_le_bytes());
    out.extend_from_slice(body);
}

fn encode_open(stream: u32, segment: u32, seq: u64, out: &mut Vec<u8>) {
    let mut body = Vec::with_capacity(17);
    body.push(OPEN);
    body.extend_from_slice(&stream.to_le_bytes());
    body.extend_from_slice(&segment.to_le_bytes());
    body.extend_from_slice(&seq.to_le_bytes());
    frame(&body, out);
}

fn encode_block(stream: u32, lba: u32, wseq: u64, data: &[u8], out: &mut Vec<u8>) {
    let mut body = Vec::with_capacity(17 + data.len());
    body.push(BLOCK);
    body.extend_from_slice(&stream.to_le_bytes());
    body.extend_from_slice(&lba.to_le_bytes());
    body.extend_from_slice(&wseq.to_le_bytes());
    body.extend_from_slice(data);
    frame(&body, out);
}

/// Decodes frames up to the first one that is cut short or corrupt (module doc).
pub(crate) fn decode(mut bytes: &[u8]) -> Vec<Record> {
    let mut records = Vec::new();
    while bytes.len() >= FRAME_HEADER_BYTES {
        let len = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes")) as usize;
        let sum = u64::from_le_bytes(bytes[4..12].try_into().expect("8 bytes"));
        let Some(body) = bytes.get(FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + len) else {
            break;
        };
        if fnv1a(body) != sum || body.len() < 17 {
            break;
        }
        let u32_at = |i: usize| u32::from_le_bytes(body[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(body[i..i + 8].try_into().expect("8 bytes"));
        let record = match body[0] {
            OPEN => Record::Open {
                stream: u32_at(1),
                segment: u32_at(5),
                seq: u64_at(9),
            },
            BLOCK => Record::Block {
                stream: u32_at(1),
                lba: u32_at(5),
                wseq: u64_at(9),
                data: body[17..].to_vec(),
            },
            _ => break,
        };
        records.push(record);
        bytes = &bytes[FRAME_HEADER_BYTES + len..];
    }
    records
}

/// A stream's open segment as the log describes it.
#[derive(Debug, Default)]
pub(crate) struct LoggedStream {
    pub segment: u32,
    pub seq: u64,
    /// (logical address, write sequence number, data or nothing) in append order.
    pub blocks: Vec<(u32, u64, Vec<u8>)>,
}

/// The open segment of each of `streams` streams as the log describes it: the last segment
/// each stream opened, and the blocks appended to it since.
pub(crate) fn logged_streams(
    bytes: &[u8],
    streams: usize,
) -> Result<Vec<Option<LoggedStream>>, DeviceError> {
    let mut logged: Vec<Option<LoggedStream>> = (0..streams).map(|_| None).collect();
    for record in decode(bytes) {
        match record {
            Record::Open {
                stream,
                segment,
                seq,
            } => {
                let Some(slot) = logged.get_mut(stream as usize) else {
                    return Err(DeviceError::Unsupported(format!(
                        "the NVRAM log names stream {stream}, but this volume has {streams}"
                    )));
                };
                *slot = Some(LoggedStream {
                    segment,
                    seq,
                    blocks: Vec::new(),
                });
            }
            Record::Block {
                stream,
                lba,
                wseq,
                data,
            } => {
                if let Some(Some(s)) = logged.get_mut(stream as usize) {
                    s.blocks.push((lba, wseq, data));
                }
            }
        }
    }
    Ok(logged)
}

/// An engine's handle on its NVRAM log: without a log attached (the simulation, where the
/// engine's own memory is the battery-backed memory) every call does nothing.
#[derive(Debug, Default)]
pub(crate) struct Nvram(Option<Box<dyn NvramLog>>);

/// One stream's open segment, as the engine holds it in memory.
pub(crate) struct OpenSegment<'a> {
    pub stream: u32,
    pub segment: u32,
    pub seq: u64,
    /// Physical address of the segment's first sector, and where the next append goes.
    pub first: u32,
    pub head: u32,
    pub stripe_sectors: u32,
    /// (logical address, write sequence number) of every data sector appended so far.
    pub lbas: &'a [(u32, u64)],
    /// The open stripe's payload, `unit` bytes per sector.
    pub stripe_buf: &'a [u8],
    pub unit: usize,
}

impl Nvram {
    pub fn attach(&mut self, log: Box<dyn NvramLog>) {
        self.0 = Some(log);
    }

    /// The log's contents, or an error naming `engine` when no log is attached.
    pub fn contents(&self, engine: &str) -> Result<Vec<u8>, DeviceError> {
        match &self.0 {
            Some(log) => log.contents(),
            None => Err(DeviceError::Unsupported(format!(
                "recovering {engine} needs its NVRAM log attached"
            ))),
        }
    }

    pub fn open(&mut self, stream: u32, segment: u32, seq: u64) -> Result<(), DeviceError> {
        let Some(log) = self.0.as_mut() else {
            return Ok(());
        };
        let mut bytes = Vec::with_capacity(FRAME_HEADER_BYTES + 17);
        encode_open(stream, segment, seq, &mut bytes);
        log.append(&bytes)
    }

    pub fn block(
        &mut self,
        stream: u32,
        lba: u32,
        wseq: u64,
        data: &[u8],
    ) -> Result<(), DeviceError> {
        let Some(log) = self.0.as_mut() else {
            return Ok(());
        };
        let mut bytes = Vec::with_capacity(FRAME_HEADER_BYTES + 17 + data.len());
        encode_block(stream, lba, wseq, data, &mut bytes);
        log.append(&bytes)
    }

    pub fn sync(&mut self) -> Result<(), DeviceError> {
        match self.0.as_mut() {
            Some(log) => log.sync(),
            None => Ok(()),
        }
    }

    /// Replaces the log by the open segments alone: each one's block list, and the data of
    /// the sectors in its open stripe (the others are on the members already). Engines call
    /// it when a segment has closed, so the log stays as small as the open segments.
    pub fn replace_with<'a>(
        &mut self,
        segments: impl Iterator<Item = OpenSegment<'a>>,
    ) -> Result<(), DeviceError> {
        let Some(log) = self.0.as_mut() else {
            return Ok(());
        };
        let mut bytes = Vec::new();
        for s in segments {
            encode_open(s.stream, s.segment, s.seq, &mut bytes);
            let open_stripe = s.head / s.stripe_sectors;
            for (i, &(lba, wseq)) in s.lbas.iter().enumerate() {
                let physical = s.first + i as u32;
                let data = if physical / s.stripe_sectors == open_stripe {
                    let off = (physical % s.stripe_sectors) as usize * s.unit;
                    &s.stripe_buf[off..off + s.unit]
                } else {
                    &[][..]
                };
                encode_block(s.stream, lba, wseq, data, &mut bytes);
            }
        }
        log.replace(&bytes)?;
        log.sync()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record cut short by the crash ends the log; the records before it still count.
    #[test]
    fn a_torn_last_record_is_ignored() {
        let mut bytes = Vec::new();
        encode_open(0, 7, 3, &mut bytes);
        encode_block(0, 42, 9, &[1, 2, 3], &mut bytes);
        let whole = bytes.len();
        encode_block(0, 43, 10, &[4, 5, 6], &mut bytes);
        assert_eq!(decode(&bytes).len(), 3);
        assert_eq!(decode(&bytes[..whole + 5]).len(), 2, "cut short");
        let mut corrupt = bytes.clone();
        let last = corrupt.len() - 1;
        corrupt[last] ^= 0xff;
        assert_eq!(decode(&corrupt).len(), 2, "checksum");
        assert_eq!(
            decode(&bytes)[1],
            Record::Block {
                stream: 0,
                lba: 42,
                wseq: 9,
                data: vec![1, 2, 3]
            }
        );
    }
}
