//! The five-column ASCII traces of SSDSim and MQSim.
//!
//! One request per line: `time_ns device lsn sectors type`, whitespace-separated, where
//! `time_ns` is the arrival time in nanoseconds, `device` the device number (the record's
//! volume), `lsn` the first logical sector and `sectors` the length, both in 512-byte
//! sectors, and `type` is `1` for a read and `0` for a write (MQSim's convention, which
//! SSDSim shares). Timestamps become relative to the earliest record. Blank lines are
//! skipped.

use std::borrow::Borrow;
use std::io::{BufRead, Write};

use super::{
    for_each_line, invalid_input, rebase_timestamps, sector_range, unheld_op, TraceRecord,
    BLKPARSE_SECTOR_BYTES,
};
use crate::{IoOp, WorkloadError};

/// Reads an SSDSim / MQSim ASCII trace.
pub fn read_ascii(
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
        let [time, device, lsn, sectors, kind] = fields[..] else {
            return Err(bad(format!(
                "expected 5 fields (time_ns device lsn sectors type), found {}",
                fields.len()
            )));
        };
        let number = |name: &str, text: &str| {
            text.parse::<u64>()
                .map_err(|_| bad(format!("{name} '{text}' is not an unsigned integer")))
        };
        let timestamp_ns = number("time", time)?;
        let volume = device.parse::<u32>().map_err(|_| {
            bad(format!(
                "device '{device}' is not an unsigned 32-bit integer"
            ))
        })?;
        let lsn = number("lsn", lsn)?;
        let sectors = number("size", sectors)?;
        let op = match kind {
            "0" => IoOp::Write,
            "1" => IoOp::Read,
            other => {
                return Err(bad(format!(
                    "type '{other}' is neither 0 (write) nor 1 (read)"
                )))
            }
        };
        let (offset_bytes, len_bytes) = sector_range(lsn, sectors, "lsn").map_err(bad)?;
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

/// Writes records as ASCII lines. Only reads and writes of whole 512-byte sectors can be
/// written.
pub(crate) fn write_ascii<I>(records: I, out: &mut impl Write) -> std::io::Result<()>
where
    I: Iterator,
    I::Item: Borrow<TraceRecord>,
{
    for record in records {
        let record = record.borrow();
        let kind = match record.op {
            IoOp::Write => 0,
            IoOp::Read => 1,
            IoOp::Trim | IoOp::Flush => return Err(unheld_op("ASCII", record.op)),
        };
        if record.offset_bytes % BLKPARSE_SECTOR_BYTES != 0
            || record.len_bytes % BLKPARSE_SECTOR_BYTES != 0
            || record.len_bytes == 0
        {
            return Err(invalid_input(format!(
                "ASCII traces address whole 512-byte sectors; offset {} or length {} is not a \
                 positive multiple",
                record.offset_bytes, record.len_bytes
            )));
        }
        writeln!(
            out,
            "{} {} {} {} {kind}",
            record.timestamp_ns,
            record.volume,
            record.offset_bytes / BLKPARSE_SECTOR_BYTES,
            record.len_bytes / BLKPARSE_SECTOR_BYTES,
        )?;
    }
    Ok(())
}
