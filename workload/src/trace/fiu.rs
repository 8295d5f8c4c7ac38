//! The FIU IODedup traces (homes, web-vm, mail; Koller and Rangaswami, FAST 2010).
//!
//! One request per line, nine whitespace-separated fields:
//! `ts pid process lba size R|W major minor md5`, where `ts` is in nanoseconds (from an
//! arbitrary origin), `lba` and `size` count 512-byte sectors, `major minor` name the traced
//! device and `md5` is the content hash of the request's data. Timestamps become relative to
//! the earliest record; the device becomes the record's volume (`(major << 20) | minor`).
//! Blank lines are skipped. The content hash is checked to be hexadecimal but otherwise
//! ignored, since the simulator's payloads are its own.

use std::borrow::Borrow;
use std::io::{BufRead, Write};

use super::{
    for_each_line, invalid_input, join_device, rebase_timestamps, sector_range, split_device,
    unheld_op, TraceRecord, BLKPARSE_SECTOR_BYTES,
};
use crate::{IoOp, WorkloadError};

/// What the writer puts in the hash column: it has no data to hash, and a fixed value says
/// so plainly rather than inventing one.
const NO_HASH: &str = "00000000000000000000000000000000";

/// Reads an FIU IODedup trace.
pub fn read_fiu(
    reader: impl BufRead,
    source_name: &str,
) -> Result<Vec<TraceRecord>, WorkloadError> {
    let mut records = Vec::new();
    for_each_line(reader, source_name, |line_number, line| {
        let bad = |reason: String| WorkloadError::TraceLine {
            source: source_name.to_string(),
            line: line_number,
            reason,
        };
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.is_empty() {
            return Ok(());
        }
        let [ts, pid, _process, lba, size, kind, major, minor, md5] = fields[..] else {
            return Err(bad(format!(
                "expected 9 fields (ts pid process lba size R|W major minor md5), found {}",
                fields.len()
            )));
        };
        let number = |name: &str, text: &str| {
            text.parse::<u64>()
                .map_err(|_| bad(format!("{name} '{text}' is not an unsigned integer")))
        };
        let timestamp_ns = number("timestamp", ts)?;
        number("pid", pid)?;
        let lba = number("lba", lba)?;
        let sectors = number("size", size)?;
        let op = match kind {
            "R" | "r" => IoOp::Read,
            "W" | "w" => IoOp::Write,
            other => return Err(bad(format!("operation '{other}' is neither R nor W"))),
        };
        let device = |name: &str, text: &str| {
            text.parse::<u32>()
                .map_err(|_| bad(format!("{name} '{text}' is not a device number")))
        };
        let volume = join_device(device("major", major)?, device("minor", minor)?)
            .ok_or_else(|| bad(format!("device {major},{minor} is too large")))?;
        if !md5.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad(format!("hash '{md5}' is not hexadecimal")));
        }
        let (offset_bytes, len_bytes) = sector_range(lba, sectors, "lba").map_err(bad)?;
        records.push(TraceRecord {
            timestamp_ns,
            op,
            offset_bytes,
            len_bytes,
            volume,
            fua: false,
        });
        Ok(())
    })?;
    rebase_timestamps(&mut records);
    Ok(records)
}

/// Writes records as FIU IODedup lines. Only reads and writes of whole 512-byte sectors can
/// be written; the pid is 0, the process `afa` and the hash all zeros.
pub(crate) fn write_fiu<I>(records: I, out: &mut impl Write) -> std::io::Result<()>
where
    I: Iterator,
    I::Item: Borrow<TraceRecord>,
{
    for record in records {
        let record = record.borrow();
        let kind = match record.op {
            IoOp::Read => "R",
            IoOp::Write => "W",
            IoOp::Trim | IoOp::Flush => return Err(unheld_op("FIU", record.op)),
        };
        if record.offset_bytes % BLKPARSE_SECTOR_BYTES != 0
            || record.len_bytes % BLKPARSE_SECTOR_BYTES != 0
            || record.len_bytes == 0
        {
            return Err(invalid_input(format!(
                "FIU traces address whole 512-byte sectors; offset {} or length {} is not a \
                 positive multiple",
                record.offset_bytes, record.len_bytes
            )));
        }
        let (major, minor) = split_device(record.volume);
        writeln!(
            out,
            "{} 0 afa {} {} {kind} {major} {minor} {NO_HASH}",
            record.timestamp_ns,
            record.offset_bytes / BLKPARSE_SECTOR_BYTES,
            record.len_bytes / BLKPARSE_SECTOR_BYTES,
        )?;
    }
    Ok(())
}
