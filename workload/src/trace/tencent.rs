//! The Tencent Cloud Block Storage (CBS) traces of 2018.
//!
//! One request per line, five comma-separated fields: `Timestamp,Offset,Size,IOType,VolumeID`,
//! where `Timestamp` is in whole seconds since the Unix epoch, `Offset` and `Size` count
//! 512-byte sectors, `IOType` is `0` for a read and `1` for a write, and `VolumeID` (an
//! unsigned 32-bit integer) is the volume. Spaces around fields are tolerated. Timestamps
//! become relative to the earliest record; blank lines are skipped.
//!
//! The format has no finer clock than a second, so the writer truncates each record's time
//! to whole seconds, as the MSR and iolog writers truncate to their own units (see
//! [`super::TraceFormat::timestamp_step_ns`]): a converted or recorded trace keeps the
//! order and second of every request, not its sub-second spacing.

use std::borrow::Borrow;
use std::io::{BufRead, Write};

use super::{
    for_each_line, invalid_input, is_unsigned_integer, rebase_scaled_timestamps, sector_range,
    unheld_op, TraceRecord, BLKPARSE_SECTOR_BYTES,
};
use crate::{IoOp, WorkloadError};

/// The traces' timestamps count seconds.
pub(crate) const NS_PER_SECOND: u64 = 1_000_000_000;

/// Whether `fields` (a line split at commas, each trimmed) has the shape of a Tencent
/// record: exactly five unsigned integers, the fourth `0` or `1`.
pub(crate) fn looks_like(fields: &[&str]) -> bool {
    fields.len() == 5
        && fields.iter().all(|field| is_unsigned_integer(field))
        && matches!(fields[3], "0" | "1")
}

/// Reads a Tencent CBS trace.
pub fn read_tencent(
    reader: impl BufRead,
    source_name: &str,
) -> Result<Vec<TraceRecord>, WorkloadError> {
    // Timestamps are collected in seconds with their line numbers, and rebased and converted
    // to nanoseconds once the earliest is known.
    let mut records = Vec::new();
    let mut timestamps_s = Vec::new();
    for_each_line(reader, source_name, |line_number, line| {
        let bad = |reason: String| WorkloadError::TraceLine {
            source: source_name.to_string(),
            line: line_number,
            reason,
        };
        if line.trim().is_empty() {
            return Ok(());
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let [timestamp, offset, size, io_type, volume_id] = fields[..] else {
            return Err(bad(format!(
                "expected 5 comma-separated fields (Timestamp,Offset,Size,IOType,VolumeID), \
                 found {}",
                fields.len()
            )));
        };
        let number = |name: &str, text: &str| {
            text.parse::<u64>()
                .map_err(|_| bad(format!("{name} '{text}' is not an unsigned integer")))
        };
        let timestamp_s = number("Timestamp", timestamp)?;
        let offset_sectors = number("Offset", offset)?;
        let size_sectors = number("Size", size)?;
        let op = match io_type {
            "0" => IoOp::Read,
            "1" => IoOp::Write,
            other => {
                return Err(bad(format!(
                    "IOType '{other}' is neither 0 (read) nor 1 (write)"
                )))
            }
        };
        let volume = volume_id.parse::<u32>().map_err(|_| {
            bad(format!(
                "VolumeID '{volume_id}' is not an unsigned 32-bit integer"
            ))
        })?;
        let (offset_bytes, len_bytes) =
            sector_range(offset_sectors, size_sectors, "Offset").map_err(bad)?;
        timestamps_s.push((timestamp_s, line_number));
        records.push(TraceRecord {
            timestamp_ns: 0,
            op,
            offset_bytes,
            len_bytes,
            volume,
            fua: false,
        });
        Ok(())
    })?;
    rebase_scaled_timestamps(&mut records, &timestamps_s, NS_PER_SECOND, source_name)?;
    Ok(records)
}

/// Writes records as Tencent lines, timestamps in whole seconds from 0 (truncated). Only
/// reads and writes of whole 512-byte sectors can be written.
pub(crate) fn write_tencent<I>(records: I, out: &mut impl Write) -> std::io::Result<()>
where
    I: Iterator,
    I::Item: Borrow<TraceRecord>,
{
    for record in records {
        let record = record.borrow();
        let io_type = match record.op {
            IoOp::Read => 0,
            IoOp::Write => 1,
            IoOp::Trim | IoOp::Flush => return Err(unheld_op("Tencent", record.op)),
        };
        if record.offset_bytes % BLKPARSE_SECTOR_BYTES != 0
            || record.len_bytes % BLKPARSE_SECTOR_BYTES != 0
            || record.len_bytes == 0
        {
            return Err(invalid_input(format!(
                "Tencent traces address whole 512-byte sectors; offset {} or length {} is not \
                 a positive multiple",
                record.offset_bytes, record.len_bytes
            )));
        }
        writeln!(
            out,
            "{},{},{},{io_type},{}",
            record.timestamp_ns / NS_PER_SECOND,
            record.offset_bytes / BLKPARSE_SECTOR_BYTES,
            record.len_bytes / BLKPARSE_SECTOR_BYTES,
            record.volume,
        )?;
    }
    Ok(())
}
