//! The Alibaba Cloud block traces of 2020 (`io_traces.csv` of the alibaba/block-traces
//! release, recorded on the virtual disks of Alibaba Cloud's block storage).
//!
//! One request per line, five comma-separated fields: `device_id,opcode,offset,length,timestamp`,
//! where `device_id` (an unsigned 32-bit integer) is the volume, `opcode` `R` or `W` (either
//! case is accepted), `offset` and `length` are in bytes (`length` an unsigned 32-bit integer,
//! as the release defines it) and `timestamp` is in microseconds since the Unix epoch.
//! Spaces around fields are tolerated. Timestamps become relative to the earliest record;
//! blank lines are skipped.

use std::borrow::Borrow;
use std::io::{BufRead, Write};

use super::{
    for_each_line, invalid_input, is_unsigned_integer, rebase_scaled_timestamps, unheld_op,
    TraceRecord,
};
use crate::{IoOp, WorkloadError};

/// The release's timestamps count microseconds.
const NS_PER_US: u64 = 1_000;

/// Whether `fields` (a line split at commas, each trimmed) has the shape of an Alibaba
/// record: exactly five fields, `R` or `W` second and unsigned integers elsewhere.
pub(crate) fn looks_like(fields: &[&str]) -> bool {
    match fields {
        [device, opcode, offset, length, timestamp] => {
            matches!(*opcode, "R" | "r" | "W" | "w")
                && [device, offset, length, timestamp]
                    .iter()
                    .all(|field| is_unsigned_integer(field))
        }
        _ => false,
    }
}

/// Reads an Alibaba block trace.
pub fn read_alibaba(
    reader: impl BufRead,
    source_name: &str,
) -> Result<Vec<TraceRecord>, WorkloadError> {
    // Timestamps are collected in microseconds with their line numbers, and rebased and
    // converted to nanoseconds once the earliest is known.
    let mut records = Vec::new();
    let mut timestamps_us = Vec::new();
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
        let [device, opcode, offset, length, timestamp] = fields[..] else {
            return Err(bad(format!(
                "expected 5 comma-separated fields (device_id,opcode,offset,length,timestamp), \
                 found {}",
                fields.len()
            )));
        };
        let volume = device.parse::<u32>().map_err(|_| {
            bad(format!(
                "device_id '{device}' is not an unsigned 32-bit integer"
            ))
        })?;
        let op = match opcode {
            "R" | "r" => IoOp::Read,
            "W" | "w" => IoOp::Write,
            other => return Err(bad(format!("opcode '{other}' is neither R nor W"))),
        };
        let offset_bytes = offset
            .parse::<u64>()
            .map_err(|_| bad(format!("offset '{offset}' is not an unsigned integer")))?;
        let len_bytes = length.parse::<u32>().map_err(|_| {
            bad(format!(
                "length '{length}' is not an unsigned 32-bit integer"
            ))
        })?;
        let timestamp_us = timestamp.parse::<u64>().map_err(|_| {
            bad(format!(
                "timestamp '{timestamp}' is not an unsigned integer"
            ))
        })?;
        if len_bytes == 0 {
            return Err(bad("length is zero".to_string()));
        }
        if offset_bytes.checked_add(u64::from(len_bytes)).is_none() {
            return Err(bad("offset + length overflows".to_string()));
        }
        timestamps_us.push((timestamp_us, line_number));
        records.push(TraceRecord {
            timestamp_ns: 0,
            op,
            offset_bytes,
            len_bytes: u64::from(len_bytes),
            volume,
            fua: false,
        });
        Ok(())
    })?;
    rebase_scaled_timestamps(&mut records, &timestamps_us, NS_PER_US, source_name)?;
    Ok(records)
}

/// Writes records as Alibaba lines, timestamps in whole microseconds from 0 (finer ones are
/// truncated, as in fio's iolog). Only reads and writes of 1 byte to 4 GiB - 1 (the release's
/// unsigned 32-bit length) can be written.
pub(crate) fn write_alibaba<I>(records: I, out: &mut impl Write) -> std::io::Result<()>
where
    I: Iterator,
    I::Item: Borrow<TraceRecord>,
{
    for record in records {
        let record = record.borrow();
        let opcode = match record.op {
            IoOp::Read => "R",
            IoOp::Write => "W",
            IoOp::Trim | IoOp::Flush => return Err(unheld_op("Alibaba", record.op)),
        };
        if record.len_bytes == 0 || u32::try_from(record.len_bytes).is_err() {
            return Err(invalid_input(format!(
                "Alibaba traces hold lengths of 1 to {} bytes, not {}",
                u32::MAX,
                record.len_bytes
            )));
        }
        writeln!(
            out,
            "{},{opcode},{},{},{}",
            record.volume,
            record.offset_bytes,
            record.len_bytes,
            record.timestamp_ns / NS_PER_US,
        )?;
    }
    Ok(())
}
