//! Readers (and writers) for recorded block traces, their statistics, transformations
//! (time scaling, volume remapping, wrapping into a device) and synthesized look-alikes.
//!
//! Eight text formats are supported, chosen by [`TraceFormat`]:
//!
//! * [`TraceFormat::MsrCsv`], the MSR Cambridge traces: one request per line,
//!   `Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime`, the timestamp in
//!   Windows FILETIME ticks of 100 ns, `Type` `Read` or `Write`, offset and size in bytes.
//! * [`TraceFormat::Blkparse`], the default text output of Linux `blkparse`:
//!   `dev cpu seq time pid action RWBS sector + count [process]`, time in seconds with
//!   nanosecond digits, sector and count in 512-byte units. Only one action is kept
//!   (queue events, `Q`, by default), and the statistics blkparse prints at the end are
//!   skipped.
//! * [`TraceFormat::Fiu`], the FIU IODedup traces ([`fiu`]).
//! * [`TraceFormat::Iolog`], fio's iolog versions 2 and 3 ([`iolog`]).
//! * [`TraceFormat::Ascii`], the five-column ASCII traces of SSDSim and MQSim ([`ascii`]).
//! * [`TraceFormat::Spc`], the Storage Performance Council traces of the UMass repository
//!   ([`spc`]).
//! * [`TraceFormat::Alibaba`], the Alibaba Cloud block traces of 2020 ([`alibaba`]).
//! * [`TraceFormat::Tencent`], the Tencent CBS block traces of 2018 ([`tencent`]).
//!
//! Every record carries the volume (device) it addressed, so that [`transform`] can select
//! and lay out volumes of multi-device traces. Readers never panic; a malformed line is a [`WorkloadError::TraceLine`] naming the
//! trace and the 1-based line number.

use std::borrow::Borrow;
use std::io::{BufRead, Write};
use std::str::FromStr;

use crate::{IoOp, WorkloadError};

pub mod alibaba;
pub mod ascii;
pub mod fiu;
pub mod iolog;
pub mod spc;
pub mod stats;
pub mod synth;
pub mod tencent;
pub mod transform;

/// One request from a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceRecord {
    /// When the request was issued, relative to the start of the trace.
    pub timestamp_ns: u64,
    /// What the request does.
    pub op: IoOp,
    /// Byte offset on the traced device.
    pub offset_bytes: u64,
    /// Length in bytes (0 for flushes).
    pub len_bytes: u64,
    /// The traced device the request addressed, as the format numbers it: MSR's disk
    /// number, `(major << 20) | minor` for blkparse and FIU, the device column of the ASCII
    /// format, the order of first appearance of the file name in an iolog, SPC's ASU,
    /// Alibaba's `device_id` and Tencent's `VolumeID`.
    pub volume: u32,
    /// The write asked for force unit access (blkparse's `F` after the `W`); only blkparse
    /// records it.
    pub fua: bool,
}

/// The supported trace formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TraceFormat {
    /// MSR Cambridge CSV.
    MsrCsv,
    /// `blkparse` default text output.
    Blkparse,
    /// FIU IODedup: `ts pid process lba size R|W major minor md5`.
    Fiu,
    /// fio iolog, version 2 or 3 (the header line says which).
    Iolog,
    /// SSDSim / MQSim ASCII: `time_ns device lsn sectors type`.
    Ascii,
    /// Storage Performance Council (UMass): `ASU,LBA,Size,Opcode,Timestamp[,...]`.
    Spc,
    /// Alibaba Cloud block traces 2020: `device_id,opcode,offset,length,timestamp`.
    Alibaba,
    /// Tencent CBS traces 2018: `Timestamp,Offset,Size,IOType,VolumeID`.
    Tencent,
}

impl TraceFormat {
    /// Whether the format can hold requests of `op`: every format holds reads and writes;
    /// only fio's iolog and blkparse hold trims and flushes.
    pub fn holds(self, op: IoOp) -> bool {
        match op {
            IoOp::Read | IoOp::Write => true,
            IoOp::Trim | IoOp::Flush => matches!(self, TraceFormat::Iolog | TraceFormat::Blkparse),
        }
    }

    /// Whether the format can say that a write asked for force unit access: only
    /// blkparse's RWBS field can.
    pub fn holds_fua(self) -> bool {
        self == TraceFormat::Blkparse
    }

    /// The step of the timestamps the format's writer writes, in nanoseconds: a record's
    /// time is truncated to a multiple of it (100 ns FILETIME ticks for MSR, microseconds for
    /// fio's iolog v3 and Alibaba, whole seconds for Tencent, exact elsewhere).
    pub fn timestamp_step_ns(self) -> u64 {
        match self {
            TraceFormat::MsrCsv => MSR_TICK_NS,
            TraceFormat::Iolog | TraceFormat::Alibaba => 1_000,
            TraceFormat::Tencent => tencent::NS_PER_SECOND,
            TraceFormat::Blkparse | TraceFormat::Fiu | TraceFormat::Ascii | TraceFormat::Spc => 1,
        }
    }

    /// Every format, in the order the documentation lists them.
    pub const ALL: [TraceFormat; 8] = [
        TraceFormat::MsrCsv,
        TraceFormat::Blkparse,
        TraceFormat::Fiu,
        TraceFormat::Iolog,
        TraceFormat::Ascii,
        TraceFormat::Spc,
        TraceFormat::Alibaba,
        TraceFormat::Tencent,
    ];

    /// The canonical name, which [`FromStr`] accepts.
    pub fn name(self) -> &'static str {
        match self {
            TraceFormat::MsrCsv => "msr",
            TraceFormat::Blkparse => "blkparse",
            TraceFormat::Fiu => "fiu",
            TraceFormat::Iolog => "iolog",
            TraceFormat::Ascii => "ascii",
            TraceFormat::Spc => "spc",
            TraceFormat::Alibaba => "alibaba",
            TraceFormat::Tencent => "tencent",
        }
    }
}

impl std::fmt::Display for TraceFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for TraceFormat {
    type Err = WorkloadError;

    /// Accepts `msr` (also `msr-csv`, `msrcsv`), `blkparse`, `fiu` (also `iodedup`),
    /// `iolog` (also `fio-iolog`), `ascii` (also `ssdsim`, `mqsim`), `spc` (also `umass`),
    /// `alibaba` and `tencent` (also `tencent-cbs`), case-insensitively.
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name.trim().to_ascii_lowercase().as_str() {
            "msr" | "msr-csv" | "msrcsv" | "msr_csv" => Ok(TraceFormat::MsrCsv),
            "blkparse" => Ok(TraceFormat::Blkparse),
            "fiu" | "iodedup" | "fiu-iodedup" => Ok(TraceFormat::Fiu),
            "iolog" | "fio-iolog" | "fio_iolog" => Ok(TraceFormat::Iolog),
            "ascii" | "ssdsim" | "mqsim" => Ok(TraceFormat::Ascii),
            "spc" | "umass" => Ok(TraceFormat::Spc),
            "alibaba" => Ok(TraceFormat::Alibaba),
            "tencent" | "tencent-cbs" | "tencent_cbs" => Ok(TraceFormat::Tencent),
            _ => Err(WorkloadError::UnknownTraceFormat {
                name: name.to_string(),
            }),
        }
    }
}

/// Guesses the format of a trace from its first non-blank line, for tools that read traces
/// of any format; `None` when the line matches no format. The guess looks only at the line's
/// shape, so it can be wrong for a corrupt file, which the reader then reports.
///
/// The comma-separated formats are told apart by their fields (trimmed of spaces): SPC has
/// at least five, the first three unsigned integers and the fourth `r` or `w` in either
/// case; MSR has exactly seven (its `Type` is a word, `Read` or `Write`, never one letter,
/// so SPC lines with two optional fields are not taken for MSR); Alibaba has exactly five
/// with `R` or `W` second and integers elsewhere; Tencent has exactly five integers, the
/// fourth `0` or `1`. No line fits two of these shapes.
pub fn guess_format(text: &str) -> Option<TraceFormat> {
    let line = text.lines().map(str::trim).find(|line| !line.is_empty())?;
    if line.starts_with("fio version") {
        return Some(TraceFormat::Iolog);
    }
    let comma_fields: Vec<&str> = line.split(',').map(str::trim).collect();
    if spc::looks_like(&comma_fields) {
        return Some(TraceFormat::Spc);
    }
    if comma_fields.len() == 7 {
        return Some(TraceFormat::MsrCsv);
    }
    if alibaba::looks_like(&comma_fields) {
        return Some(TraceFormat::Alibaba);
    }
    if tencent::looks_like(&comma_fields) {
        return Some(TraceFormat::Tencent);
    }
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields
        .first()
        .is_some_and(|first| parse_device_number(first).is_some())
    {
        return Some(TraceFormat::Blkparse);
    }
    match fields.len() {
        9 => Some(TraceFormat::Fiu),
        5 => Some(TraceFormat::Ascii),
        _ => None,
    }
}

/// Reads a whole trace. `source_name` (usually the path) appears in error messages.
/// Blkparse traces keep queue (`Q`) events; use [`read_blkparse`] to pick another action.
pub fn read_trace(
    reader: impl BufRead,
    format: TraceFormat,
    source_name: &str,
) -> Result<Vec<TraceRecord>, WorkloadError> {
    match format {
        TraceFormat::MsrCsv => read_msr_csv(reader, source_name),
        TraceFormat::Blkparse => read_blkparse(reader, source_name, 'Q'),
        TraceFormat::Fiu => fiu::read_fiu(reader, source_name),
        TraceFormat::Iolog => iolog::read_iolog(reader, source_name),
        TraceFormat::Ascii => ascii::read_ascii(reader, source_name),
        TraceFormat::Spc => spc::read_spc(reader, source_name),
        TraceFormat::Alibaba => alibaba::read_alibaba(reader, source_name),
        TraceFormat::Tencent => tencent::read_tencent(reader, source_name),
    }
}

/// Writes records in the given format, so that [`read_trace`] reads them back.
///
/// MSR CSV stores timestamps in 100 ns ticks (finer timestamps are truncated) and only
/// reads and writes; blkparse, FIU, ASCII and Tencent store offsets and lengths in 512-byte
/// sectors, SPC offsets; timestamps are truncated to the step of
/// [`TraceFormat::timestamp_step_ns`] (whole seconds for Tencent); see each module for the
/// others' limits. A record the format cannot represent is an
/// [`std::io::ErrorKind::InvalidInput`] error. Readers make timestamps relative to the
/// earliest record, so records whose first timestamp is 0 survive a round trip unchanged.
///
/// `records` may be a slice or any iterator, so that long synthesized traces are written
/// without being held in memory.
pub fn write_trace<I>(records: I, format: TraceFormat, mut out: impl Write) -> std::io::Result<()>
where
    I: IntoIterator,
    I::Item: Borrow<TraceRecord>,
{
    let records = records.into_iter();
    match format {
        TraceFormat::Fiu => fiu::write_fiu(records, &mut out)?,
        TraceFormat::Iolog => iolog::write_iolog(records, &mut out)?,
        TraceFormat::Ascii => ascii::write_ascii(records, &mut out)?,
        TraceFormat::Spc => spc::write_spc(records, &mut out)?,
        TraceFormat::Alibaba => alibaba::write_alibaba(records, &mut out)?,
        TraceFormat::Tencent => tencent::write_tencent(records, &mut out)?,
        TraceFormat::MsrCsv => {
            for record in records {
                let record = record.borrow();
                let op = match record.op {
                    IoOp::Read => "Read",
                    IoOp::Write => "Write",
                    IoOp::Trim | IoOp::Flush => return Err(unheld_op("MSR", record.op)),
                };
                writeln!(
                    out,
                    "{},afa,{},{op},{},{},0",
                    record.timestamp_ns / MSR_TICK_NS,
                    record.volume,
                    record.offset_bytes,
                    record.len_bytes
                )?;
            }
        }
        TraceFormat::Blkparse => {
            for (index, record) in records.enumerate() {
                let record = record.borrow();
                let seconds = record.timestamp_ns / 1_000_000_000;
                let nanos = record.timestamp_ns % 1_000_000_000;
                let sequence = index + 1;
                let (major, minor) = split_device(record.volume);
                let device = format!("{major},{minor}");
                let prefix =
                    format!("{device:>5}    0 {sequence:8} {seconds:5}.{nanos:09}     0  Q");
                if record.op == IoOp::Flush && record.len_bytes == 0 {
                    writeln!(out, "{prefix}  FN [afa]")?;
                    continue;
                }
                if record.offset_bytes % BLKPARSE_SECTOR_BYTES != 0
                    || record.len_bytes % BLKPARSE_SECTOR_BYTES != 0
                {
                    return Err(invalid_input(format!(
                        "blkparse traces address 512-byte sectors; offset {} or length {} is \
                         not a multiple",
                        record.offset_bytes, record.len_bytes
                    )));
                }
                let rwbs = match record.op {
                    IoOp::Read => "R",
                    IoOp::Write if record.fua => "WFS",
                    IoOp::Write => "W",
                    IoOp::Trim => "D",
                    IoOp::Flush => "FN",
                };
                writeln!(
                    out,
                    "{prefix} {rwbs:>3} {} + {} [afa]",
                    record.offset_bytes / BLKPARSE_SECTOR_BYTES,
                    record.len_bytes / BLKPARSE_SECTOR_BYTES
                )?;
            }
        }
    }
    out.flush()
}

pub(crate) fn invalid_input(message: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, message)
}

/// The refusal of a writer whose format (`format` names it) holds only reads and writes.
pub(crate) fn unheld_op(format: &str, op: IoOp) -> std::io::Error {
    invalid_input(format!("{format} traces cannot hold {op:?} requests"))
}

/// Whether a field is an unsigned decimal integer (digits only), as the comma-separated
/// formats' shape tests ask.
pub(crate) fn is_unsigned_integer(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

/// Length of one Windows FILETIME tick.
const MSR_TICK_NS: u64 = 100;
/// blkparse (like the FIU and ASCII formats) always counts in 512-byte sectors, whatever the
/// device's sector size.
pub(crate) const BLKPARSE_SECTOR_BYTES: u64 = 512;

/// Bits of the minor number in a volume built from a Linux `major,minor` pair, as in the
/// kernel's `MKDEV`.
const MINOR_BITS: u32 = 20;

/// The volume number of a Linux device `major,minor`, or `None` when it does not fit.
pub(crate) fn join_device(major: u32, minor: u32) -> Option<u32> {
    if minor >= 1 << MINOR_BITS || major >= 1 << (32 - MINOR_BITS) {
        return None;
    }
    Some(major << MINOR_BITS | minor)
}

/// The Linux `major,minor` pair of a volume number made by [`join_device`].
pub(crate) fn split_device(volume: u32) -> (u32, u32) {
    (volume >> MINOR_BITS, volume & ((1 << MINOR_BITS) - 1))
}

/// The byte range of `count` 512-byte sectors from sector `start` (`start_name` names the
/// start column in errors): the zero size and every overflow are refused.
pub(crate) fn sector_range(start: u64, count: u64, start_name: &str) -> Result<(u64, u64), String> {
    if count == 0 {
        return Err("size is zero".to_string());
    }
    let offset_bytes = start
        .checked_mul(BLKPARSE_SECTOR_BYTES)
        .ok_or_else(|| format!("{start_name} is too large"))?;
    let len_bytes = count
        .checked_mul(BLKPARSE_SECTOR_BYTES)
        .filter(|len| offset_bytes.checked_add(*len).is_some())
        .ok_or_else(|| "size is too large".to_string())?;
    Ok((offset_bytes, len_bytes))
}

/// Rebases raw timestamps (in nanoseconds, collected with their line numbers) to the earliest
/// one. Used by the formats whose timestamps are absolute.
pub(crate) fn rebase_timestamps(records: &mut [TraceRecord]) {
    let first = records.iter().map(|r| r.timestamp_ns).min().unwrap_or(0);
    for record in records {
        record.timestamp_ns -= first;
    }
}

/// Sets each record's timestamp from its raw one in units of `unit_ns` (`raw[i]` is record
/// `i`'s, with its line number), relative to the earliest. The raw values are rebased before
/// they are scaled, so that absolute clocks (FILETIME ticks, Unix microseconds or seconds)
/// far from zero do not overflow; a record too far from the earliest to count in 64-bit
/// nanoseconds is refused on its line.
pub(crate) fn rebase_scaled_timestamps(
    records: &mut [TraceRecord],
    raw: &[(u64, usize)],
    unit_ns: u64,
    source_name: &str,
) -> Result<(), WorkloadError> {
    let first = raw.iter().map(|(value, _)| *value).min().unwrap_or(0);
    for (record, (value, line_number)) in records.iter_mut().zip(raw) {
        record.timestamp_ns =
            (value - first)
                .checked_mul(unit_ns)
                .ok_or_else(|| WorkloadError::TraceLine {
                    source: source_name.to_string(),
                    line: *line_number,
                    reason: "timestamp is too far from the first record".to_string(),
                })?;
    }
    Ok(())
}

/// Calls `handle(line_number, line)` for every line of `reader`, with line endings removed.
/// Invalid UTF-8 is reported as a malformed line rather than an I/O error, since it is a
/// property of the trace's content.
pub(crate) fn for_each_line(
    mut reader: impl BufRead,
    source_name: &str,
    mut handle: impl FnMut(usize, &str) -> Result<(), WorkloadError>,
) -> Result<(), WorkloadError> {
    let mut buffer = Vec::new();
    let mut line_number = 0;
    loop {
        buffer.clear();
        let read = reader
            .read_until(b'\n', &mut buffer)
            .map_err(|error| WorkloadError::Io {
                source: source_name.to_string(),
                error,
            })?;
        if read == 0 {
            return Ok(());
        }
        line_number += 1;
        let line = std::str::from_utf8(&buffer).map_err(|_| WorkloadError::TraceLine {
            source: source_name.to_string(),
            line: line_number,
            reason: "line is not valid UTF-8".to_string(),
        })?;
        handle(line_number, line.trim_end_matches(['\n', '\r']))?;
    }
}

/// Reads an MSR Cambridge CSV trace.
///
/// Blank lines and a leading header line starting with `Timestamp` are skipped. Timestamps
/// become nanoseconds relative to the earliest record (the first one, in the sorted MSR
/// traces). Sizes must be greater than zero.
pub fn read_msr_csv(
    reader: impl BufRead,
    source_name: &str,
) -> Result<Vec<TraceRecord>, WorkloadError> {
    // Timestamps are collected as raw ticks first, then rebased once the earliest is known.
    let mut records = Vec::new();
    let mut ticks = Vec::new();
    for_each_line(reader, source_name, |line_number, line| {
        let line = line.trim();
        if line.is_empty() {
            return Ok(());
        }
        if records.is_empty()
            && line
                .get(..9)
                .is_some_and(|start| start.eq_ignore_ascii_case("timestamp"))
        {
            return Ok(());
        }
        let bad = |reason: String| WorkloadError::TraceLine {
            source: source_name.to_string(),
            line: line_number,
            reason,
        };
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let [timestamp, _host, disk, kind, offset, size, _response] = fields[..] else {
            return Err(bad(format!(
                "expected 7 comma-separated fields, found {}",
                fields.len()
            )));
        };
        let number = |name: &str, text: &str| {
            text.parse::<u64>()
                .map_err(|_| bad(format!("{name} '{text}' is not an unsigned integer")))
        };
        let tick = number("timestamp", timestamp)?;
        let volume = disk.parse::<u32>().map_err(|_| {
            bad(format!(
                "disk number '{disk}' is not an unsigned 32-bit integer"
            ))
        })?;
        let op = if kind.eq_ignore_ascii_case("read") {
            IoOp::Read
        } else if kind.eq_ignore_ascii_case("write") {
            IoOp::Write
        } else {
            return Err(bad(format!("type '{kind}' is neither Read nor Write")));
        };
        let offset_bytes = number("offset", offset)?;
        let len_bytes = number("size", size)?;
        if len_bytes == 0 {
            return Err(bad("size is zero".to_string()));
        }
        if offset_bytes.checked_add(len_bytes).is_none() {
            return Err(bad("offset + size overflows".to_string()));
        }
        ticks.push((tick, line_number));
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
    rebase_scaled_timestamps(&mut records, &ticks, MSR_TICK_NS, source_name)?;
    Ok(records)
}

/// Reads `blkparse` default text output, keeping the events whose action is `action`
/// (`'Q'` for queued requests, `'D'` for issued, `'C'` for completed, ...).
///
/// The RWBS field decides the operation: `D` (discard) is a trim, otherwise `W` a write,
/// `R` a read, and a lone `F` (a flush without data) a flush with offset and length 0.
/// Events without data (`N`) are skipped, as are events of other actions and everything
/// from blkparse's closing statistics (which start with a `CPUn (...)` or `Total (...)`
/// line). Timestamps are kept as printed, which is already relative to the trace start.
pub fn read_blkparse(
    reader: impl BufRead,
    source_name: &str,
    action: char,
) -> Result<Vec<TraceRecord>, WorkloadError> {
    let mut records = Vec::new();
    let mut in_summary = false;
    for_each_line(reader, source_name, |line_number, line| {
        let bad = |reason: String| WorkloadError::TraceLine {
            source: source_name.to_string(),
            line: line_number,
            reason,
        };
        let mut tokens = line.split_whitespace();
        let Some(first) = tokens.next() else {
            return Ok(());
        };
        let Some(volume) = parse_device_number(first) else {
            if in_summary || is_summary_start(line) {
                in_summary = true;
                return Ok(());
            }
            return Err(bad(format!(
                "expected an event line starting with 'major,minor', found '{first}'"
            )));
        };
        let mut field = |name: &str| {
            tokens
                .next()
                .ok_or_else(|| bad(format!("line ends before the {name} field")))
        };
        let cpu = field("cpu")?;
        let sequence = field("sequence")?;
        let time = field("time")?;
        let pid = field("pid")?;
        let event_action = field("action")?;
        for (name, text) in [("cpu", cpu), ("sequence", sequence), ("pid", pid)] {
            if text.parse::<u64>().is_err() {
                return Err(bad(format!("{name} '{text}' is not an unsigned integer")));
            }
        }
        let timestamp_ns = parse_seconds_ns(time)
            .ok_or_else(|| bad(format!("time '{time}' is not seconds.nanoseconds")))?;
        let mut action_chars = event_action.chars();
        if action_chars.next() != Some(action) || action_chars.next().is_some() {
            return Ok(());
        }
        let rwbs = field("RWBS")?;
        // blktrace spells a request's flags around its direction: a leading `F` is a
        // preflush (flush the cache before the request), an `F` after the direction is
        // force unit access (the data is durable when the request completes).
        let direction = rwbs.find(['D', 'W', 'R']);
        let preflush = direction.is_some_and(|at| rwbs[..at].contains('F'));
        let fua = direction.is_some_and(|at| rwbs[at + 1..].contains('F'));
        let op = if rwbs.contains('D') {
            IoOp::Trim
        } else if rwbs.contains('W') {
            IoOp::Write
        } else if rwbs.contains('R') {
            IoOp::Read
        } else if rwbs.contains('F') {
            IoOp::Flush
        } else {
            // Requests without data (RWBS `N`) say nothing about the device's workload.
            return Ok(());
        };
        let sector_text = tokens.next();
        // blkparse prints no range for a flush that carries no data, whether on its own or
        // as the preflush of an empty write.
        let flush_without_range = (op == IoOp::Flush || preflush)
            && match sector_text {
                None => true,
                Some(text) => text.starts_with('['),
            };
        let (offset_bytes, len_bytes) = match sector_text {
            _ if flush_without_range => (0, 0),
            None => return Err(bad("line ends before the sector field".to_string())),
            Some(sector_text) => {
                let sector = sector_text.parse::<u64>().map_err(|_| {
                    bad(format!("sector '{sector_text}' is not an unsigned integer"))
                })?;
                if tokens.next() != Some("+") {
                    return Err(bad("expected '+' after the sector".to_string()));
                }
                let count_text = tokens
                    .next()
                    .ok_or_else(|| bad("line ends before the sector count".to_string()))?;
                let count = count_text.parse::<u64>().map_err(|_| {
                    bad(format!(
                        "sector count '{count_text}' is not an unsigned integer"
                    ))
                })?;
                let offset_bytes = sector
                    .checked_mul(BLKPARSE_SECTOR_BYTES)
                    .ok_or_else(|| bad("sector is too large".to_string()))?;
                let len_bytes = count
                    .checked_mul(BLKPARSE_SECTOR_BYTES)
                    .filter(|len| offset_bytes.checked_add(*len).is_some())
                    .ok_or_else(|| bad("sector count is too large".to_string()))?;
                (offset_bytes, len_bytes)
            }
        };
        if preflush {
            records.push(TraceRecord {
                timestamp_ns,
                op: IoOp::Flush,
                offset_bytes: 0,
                len_bytes: 0,
                volume,
                fua: false,
            });
            if len_bytes == 0 {
                // An empty write that carries a preflush is how the kernel sends a flush.
                return Ok(());
            }
        }
        records.push(TraceRecord {
            timestamp_ns,
            op,
            offset_bytes,
            len_bytes,
            volume,
            fua: fua && op == IoOp::Write,
        });
        Ok(())
    })?;
    Ok(records)
}

/// The volume of blkparse's `major,minor` device field, or `None` when `token` is not one
/// (or names a device number too large for a Linux `dev_t`).
fn parse_device_number(token: &str) -> Option<u32> {
    let (major, minor) = token.split_once(',')?;
    let digits = |text: &str| !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
    if !digits(major) || !digits(minor) {
        return None;
    }
    join_device(major.parse().ok()?, minor.parse().ok()?)
}

/// Whether `line` starts blkparse's closing statistics: `CPU0 (8,0):` or `Total (8,0):`.
fn is_summary_start(line: &str) -> bool {
    let line = line.trim_start();
    if line.starts_with("Total (") {
        return true;
    }
    line.strip_prefix("CPU").is_some_and(|rest| {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        digits > 0 && rest[digits..].trim_start().starts_with('(')
    })
}

/// Parses blkparse's `seconds.nanoseconds` time into nanoseconds, exactly.
pub(crate) fn parse_seconds_ns(text: &str) -> Option<u64> {
    let (seconds_text, fraction_text) = text.split_once('.').unwrap_or((text, ""));
    if seconds_text.is_empty()
        || fraction_text.len() > 9
        || !seconds_text.bytes().all(|b| b.is_ascii_digit())
        || !fraction_text.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let seconds: u64 = seconds_text.parse().ok()?;
    let mut nanos: u64 = 0;
    for position in 0..9 {
        let digit = fraction_text
            .as_bytes()
            .get(position)
            .map_or(0, |b| u64::from(b - b'0'));
        nanos = nanos * 10 + digit;
    }
    seconds.checked_mul(1_000_000_000)?.checked_add(nanos)
}

#[cfg(test)]
mod tests;
