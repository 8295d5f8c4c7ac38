//! The Storage Performance Council (SPC) trace format, in which the UMass Trace Repository
//! publishes its OLTP (Financial1, Financial2) and search-engine (WebSearch1-3) traces.
//!
//! One request per line, comma-separated, spaces around fields allowed:
//! `ASU,LBA,Size,Opcode,Timestamp[,optional fields...]`, where `ASU` (application specific
//! unit) is the volume, `LBA` the first 512-byte block, `Size` the length in bytes, `Opcode`
//! `r` or `w` (either case) and `Timestamp` the time in seconds as a decimal
//! (`12.345678`). Optional fields after the fifth are accepted and ignored, since the
//! specification lets each trace add its own. Blank lines are skipped.
//!
//! Timestamps are read exactly, without going through floating point: the integer and
//! fractional digits are taken apart, so up to nine decimal places (nanoseconds) are kept as
//! written. More than nine decimal places would have to be rounded, so they are refused, as
//! are negative numbers, exponents and anything else that is not plain decimal digits with
//! at most one point. Timestamps become relative to the earliest record.

use std::borrow::Borrow;
use std::io::{BufRead, Write};

use super::{
    for_each_line, invalid_input, is_unsigned_integer, parse_seconds_ns, rebase_timestamps,
    unheld_op, TraceRecord, BLKPARSE_SECTOR_BYTES,
};
use crate::{IoOp, WorkloadError};

/// The number of fields before the optional ones.
const REQUIRED_FIELDS: usize = 5;

/// Whether `fields` (a line split at commas, each trimmed) has the shape of an SPC record:
/// at least five fields, the first three unsigned integers and the fourth an `r` or `w`.
pub(crate) fn looks_like(fields: &[&str]) -> bool {
    fields.len() >= REQUIRED_FIELDS
        && fields[..3].iter().all(|field| is_unsigned_integer(field))
        && matches!(fields[3], "r" | "R" | "w" | "W")
}

/// Reads an SPC trace.
pub fn read_spc(
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
        if line.trim().is_empty() {
            return Ok(());
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let [asu, lba, size, opcode, timestamp, ..] = fields[..] else {
            return Err(bad(format!(
                "expected at least 5 comma-separated fields (ASU,LBA,Size,Opcode,Timestamp), \
                 found {}",
                fields.len()
            )));
        };
        let volume = asu
            .parse::<u32>()
            .map_err(|_| bad(format!("ASU '{asu}' is not an unsigned 32-bit integer")))?;
        let lba_sectors = lba
            .parse::<u64>()
            .map_err(|_| bad(format!("LBA '{lba}' is not an unsigned integer")))?;
        let len_bytes = size
            .parse::<u64>()
            .map_err(|_| bad(format!("size '{size}' is not an unsigned integer")))?;
        let op = match opcode {
            "r" | "R" => IoOp::Read,
            "w" | "W" => IoOp::Write,
            other => return Err(bad(format!("opcode '{other}' is neither r nor w"))),
        };
        let timestamp_ns = parse_timestamp_ns(timestamp).map_err(bad)?;
        if len_bytes == 0 {
            return Err(bad("size is zero".to_string()));
        }
        let offset_bytes = lba_sectors
            .checked_mul(BLKPARSE_SECTOR_BYTES)
            .ok_or_else(|| bad(format!("LBA '{lba}' is too large")))?;
        if offset_bytes.checked_add(len_bytes).is_none() {
            return Err(bad("offset + size overflows".to_string()));
        }
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

/// Parses SPC's decimal seconds into nanoseconds exactly, or says what is wrong with them.
fn parse_timestamp_ns(text: &str) -> Result<u64, String> {
    if let Some(nanos) = parse_seconds_ns(text) {
        return Ok(nanos);
    }
    // The exact parser only says no; tell the user which rule the text broke.
    let is_digits = |part: &str| part.bytes().all(|b| b.is_ascii_digit());
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    if text.starts_with('-') {
        Err(format!("timestamp '{text}' is negative"))
    } else if whole.is_empty() || !is_digits(whole) || !is_digits(fraction) {
        Err(format!(
            "timestamp '{text}' is not a decimal number of seconds (digits, at most one '.')"
        ))
    } else if fraction.len() > 9 {
        Err(format!(
            "timestamp '{text}' has more than 9 decimal places (finer than a nanosecond)"
        ))
    } else {
        Err(format!(
            "timestamp '{text}' is too large (more than 2^64 ns)"
        ))
    }
}

/// Writes records as SPC lines: the volume as ASU, lowercase opcodes and the timestamp in
/// seconds with nine decimal places, so that nanoseconds survive a round trip. Only reads
/// and writes of at least one byte at 512-byte aligned offsets (the LBA counts 512-byte
/// blocks) can be written; the size, in bytes, need not be whole sectors.
pub(crate) fn write_spc<I>(records: I, out: &mut impl Write) -> std::io::Result<()>
where
    I: Iterator,
    I::Item: Borrow<TraceRecord>,
{
    for record in records {
        let record = record.borrow();
        let opcode = match record.op {
            IoOp::Read => "r",
            IoOp::Write => "w",
            IoOp::Trim | IoOp::Flush => return Err(unheld_op("SPC", record.op)),
        };
        if record.offset_bytes % BLKPARSE_SECTOR_BYTES != 0 {
            return Err(invalid_input(format!(
                "SPC traces address 512-byte blocks; offset {} is not a multiple of 512",
                record.offset_bytes
            )));
        }
        if record.len_bytes == 0 {
            return Err(invalid_input(
                "SPC traces cannot hold requests of zero bytes".to_string(),
            ));
        }
        writeln!(
            out,
            "{},{},{},{opcode},{}.{:09}",
            record.volume,
            record.offset_bytes / BLKPARSE_SECTOR_BYTES,
            record.len_bytes,
            record.timestamp_ns / 1_000_000_000,
            record.timestamp_ns % 1_000_000_000,
        )?;
    }
    Ok(())
}
