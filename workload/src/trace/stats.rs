//! Summary statistics of a trace, in the columns of ScalaAFA's Table 2 (write and read
//! counts, average request sizes, data written and read) plus what Table 2 leaves out.
//!
//! Table 2's units are binary: its sizes are KiB and its volumes GiB (for every row,
//! count × average size matches the data column only in those units), and counts are in
//! thousands of requests.

use std::borrow::Borrow;

use super::TraceRecord;
use crate::IoOp;

/// Counters over a trace.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct TraceStats {
    pub write_count: u64,
    pub read_count: u64,
    pub trim_count: u64,
    pub flush_count: u64,
    pub write_bytes: u64,
    pub read_bytes: u64,
    pub trim_bytes: u64,
    /// Time from the first to the last request.
    pub duration_ns: u64,
    /// The highest byte addressed plus one, over all volumes.
    pub end_offset_bytes: u64,
    /// The number of distinct volumes.
    pub volumes: u64,
}

const KIB: f64 = 1024.0;
const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

impl TraceStats {
    /// Computes the statistics of `records`.
    pub fn of<I>(records: I) -> TraceStats
    where
        I: IntoIterator,
        I::Item: Borrow<TraceRecord>,
    {
        let mut stats = TraceStats::default();
        let mut first_ns = u64::MAX;
        let mut last_ns = 0;
        let mut volumes = std::collections::BTreeSet::new();
        for record in records {
            let record = record.borrow();
            match record.op {
                IoOp::Write => {
                    stats.write_count += 1;
                    stats.write_bytes += record.len_bytes;
                }
                IoOp::Read => {
                    stats.read_count += 1;
                    stats.read_bytes += record.len_bytes;
                }
                IoOp::Trim => {
                    stats.trim_count += 1;
                    stats.trim_bytes += record.len_bytes;
                }
                IoOp::Flush => stats.flush_count += 1,
            }
            first_ns = first_ns.min(record.timestamp_ns);
            last_ns = last_ns.max(record.timestamp_ns);
            stats.end_offset_bytes = stats
                .end_offset_bytes
                .max(record.offset_bytes.saturating_add(record.len_bytes));
            volumes.insert(record.volume);
        }
        stats.duration_ns = last_ns.saturating_sub(first_ns.min(last_ns));
        stats.volumes = volumes.len() as u64;
        stats
    }

    /// Writes in thousands of requests (Table 2's "Wr. cnt. (Kops)").
    pub fn write_kops(&self) -> f64 {
        self.write_count as f64 / 1000.0
    }

    /// Reads in thousands of requests.
    pub fn read_kops(&self) -> f64 {
        self.read_count as f64 / 1000.0
    }

    /// Average write size in KiB (0 without writes).
    pub fn write_avg_kib(&self) -> f64 {
        average(self.write_bytes, self.write_count) / KIB
    }

    /// Average read size in KiB (0 without reads).
    pub fn read_avg_kib(&self) -> f64 {
        average(self.read_bytes, self.read_count) / KIB
    }

    /// Data written in GiB.
    pub fn written_gib(&self) -> f64 {
        self.write_bytes as f64 / GIB
    }

    /// Data read in GiB.
    pub fn read_gib(&self) -> f64 {
        self.read_bytes as f64 / GIB
    }

    /// The statistics as one row in Table 2's columns.
    pub fn table2_row(&self) -> Table2Row {
        Table2Row {
            name: String::new(),
            write_kops: self.write_kops(),
            read_kops: self.read_kops(),
            write_avg_kib: self.write_avg_kib(),
            read_avg_kib: self.read_avg_kib(),
            written_gib: self.written_gib(),
            read_gib: self.read_gib(),
        }
    }
}

fn average(bytes: u64, count: u64) -> f64 {
    if count == 0 {
        0.0
    } else {
        bytes as f64 / count as f64
    }
}

/// One row of ScalaAFA's Table 2.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Table2Row {
    pub name: String,
    pub write_kops: f64,
    pub read_kops: f64,
    pub write_avg_kib: f64,
    pub read_avg_kib: f64,
    pub written_gib: f64,
    pub read_gib: f64,
}

impl Table2Row {
    /// The header line of [`Table2Row::format`].
    pub fn header() -> String {
        format!(
            "{:<12} {:>12} {:>12} {:>14} {:>14} {:>10} {:>10}",
            "trace", "wr_kops", "rd_kops", "wr_avg_kib", "rd_avg_kib", "wr_gib", "rd_gib"
        )
    }

    /// The row aligned under [`Table2Row::header`], with Table 2's precision.
    pub fn format(&self) -> String {
        format!(
            "{:<12} {:>12.1} {:>12.1} {:>14.1} {:>14.1} {:>10.1} {:>10.1}",
            self.name,
            self.write_kops,
            self.read_kops,
            self.write_avg_kib,
            self.read_avg_kib,
            self.written_gib,
            self.read_gib
        )
    }
}
