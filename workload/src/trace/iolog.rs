//! fio's I/O logs (`write_iolog` / `read_iolog`), versions 2 and 3.
//!
//! The first line names the version: `fio version 2 iolog` or `fio version 3 iolog`. Then:
//!
//! * version 2: `file action` for file actions (`add`, `open`, `close`) and
//!   `file action offset length` for I/O actions (`read`, `write`, `trim`, `sync`,
//!   `datasync`, `wait`). Version 2 has no timestamps; `wait` (whose offset field is a delay
//!   in microseconds, relative to the previous wait, as fio's HOWTO documents) advances the
//!   clock, and every request is stamped with the clock.
//! * version 3: the same with a leading timestamp in microseconds since the start of the run
//!   (what current fio writes): `ts file action [offset length]`. `wait` is not allowed in
//!   version 3; fio ignores it, and so does this reader.
//!
//! Offsets and lengths are in bytes. `sync` and `datasync` become flushes. Each distinct file
//! name is a volume, numbered in order of first appearance. Timestamps become relative to
//! the earliest request. Blank lines are skipped.

use std::borrow::Borrow;
use std::io::{BufRead, Write};

use super::{for_each_line, invalid_input, rebase_timestamps, TraceRecord};
use crate::{IoOp, WorkloadError};

const HEADER_V2: &str = "fio version 2 iolog";
const HEADER_V3: &str = "fio version 3 iolog";
const NS_PER_US: u64 = 1_000;

/// Reads a fio iolog of version 2 or 3.
pub fn read_iolog(
    reader: impl BufRead,
    source_name: &str,
) -> Result<Vec<TraceRecord>, WorkloadError> {
    let mut records = Vec::new();
    let mut version: Option<u8> = None;
    let mut files: Vec<String> = Vec::new();
    // Version 2's clock, advanced by `wait`.
    let mut clock_ns: u64 = 0;
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
        let Some(version) = version else {
            // fio compares the header as a prefix, so trailing text is tolerated here too.
            let line = line.trim();
            version = if line.starts_with(HEADER_V2) {
                Some(2)
            } else if line.starts_with(HEADER_V3) {
                Some(3)
            } else {
                return Err(bad(format!(
                    "expected the header '{HEADER_V2}' or '{HEADER_V3}'"
                )));
            };
            return Ok(());
        };
        let number = |name: &str, text: &str| {
            text.parse::<u64>()
                .map_err(|_| bad(format!("{name} '{text}' is not an unsigned integer")))
        };
        let (timestamp_ns, rest) = if version == 3 {
            let [ts, rest @ ..] = &fields[..] else {
                return Ok(());
            };
            let us = number("timestamp", ts)?;
            let ns = us
                .checked_mul(NS_PER_US)
                .ok_or_else(|| bad(format!("timestamp '{ts}' is too large")))?;
            (Some(ns), rest)
        } else {
            (None, &fields[..])
        };
        let (file, action, range) = match rest {
            [file, action] => (*file, *action, None),
            [file, action, offset, length] => (*file, *action, Some((*offset, *length))),
            _ => {
                let expected = if version == 3 {
                    "ts file action [offset length]"
                } else {
                    "file action [offset length]"
                };
                return Err(bad(format!(
                    "expected {expected}, found {} fields",
                    fields.len()
                )));
            }
        };
        let volume = match files.iter().position(|name| name == file) {
            Some(index) => index,
            None => {
                files.push(file.to_string());
                files.len() - 1
            }
        };
        let volume = u32::try_from(volume).map_err(|_| bad("too many files".to_string()))?;
        let Some((offset_text, length_text)) = range else {
            return match action {
                "add" | "open" | "close" => Ok(()),
                other => Err(bad(format!(
                    "file action '{other}' is not add, open or close (or lacks offset and length)"
                ))),
            };
        };
        let offset = number("offset", offset_text)?;
        let length = number("length", length_text)?;
        let op = match action {
            "read" => IoOp::Read,
            "write" => IoOp::Write,
            "trim" => IoOp::Trim,
            "sync" | "datasync" => IoOp::Flush,
            "wait" if version == 2 => {
                let delay_ns = offset
                    .checked_mul(NS_PER_US)
                    .ok_or_else(|| bad(format!("wait '{offset_text}' is too long")))?;
                clock_ns = clock_ns
                    .checked_add(delay_ns)
                    .ok_or_else(|| bad("waits add up beyond 2^64 ns".to_string()))?;
                return Ok(());
            }
            "wait" => return Ok(()),
            other => {
                return Err(bad(format!(
                    "action '{other}' is not read, write, trim, sync, datasync or wait"
                )))
            }
        };
        let (offset_bytes, len_bytes) = if op == IoOp::Flush {
            (0, 0)
        } else {
            if length == 0 {
                return Err(bad("length is zero".to_string()));
            }
            if offset.checked_add(length).is_none() {
                return Err(bad("offset + length overflows".to_string()));
            }
            (offset, length)
        };
        records.push(TraceRecord {
            timestamp_ns: timestamp_ns.unwrap_or(clock_ns),
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

/// Writes records as a version 3 iolog: timestamps in whole microseconds (finer ones are
/// truncated), file `volN` for volume N, added and opened when first used and closed at the
/// end. A reader numbers volumes in order of first appearance, so volumes survive a round
/// trip when they first appear in increasing order from 0.
pub(crate) fn write_iolog<I>(records: I, out: &mut impl Write) -> std::io::Result<()>
where
    I: Iterator,
    I::Item: Borrow<TraceRecord>,
{
    writeln!(out, "{HEADER_V3}")?;
    let mut opened: Vec<u32> = Vec::new();
    let mut last_us = 0;
    for record in records {
        let record = record.borrow();
        let us = record.timestamp_ns / NS_PER_US;
        last_us = last_us.max(us);
        let volume = record.volume;
        if !opened.contains(&volume) {
            writeln!(out, "{us} vol{volume} add")?;
            writeln!(out, "{us} vol{volume} open")?;
            opened.push(volume);
        }
        let action = match record.op {
            IoOp::Read => "read",
            IoOp::Write => "write",
            IoOp::Trim => "trim",
            IoOp::Flush => "sync",
        };
        if record.op != IoOp::Flush && record.len_bytes == 0 {
            return Err(invalid_input(
                "iolog requests other than sync need a positive length".to_string(),
            ));
        }
        writeln!(
            out,
            "{us} vol{volume} {action} {} {}",
            record.offset_bytes, record.len_bytes
        )?;
    }
    for volume in opened {
        writeln!(out, "{last_us} vol{volume} close")?;
    }
    Ok(())
}
