//! Workload sources for the `afa` simulator.
//!
//! The crate turns user-facing workload descriptions into streams of block I/O requests:
//!
//! * [`fio`] parses fio's INI job-file language into [`fio::JobSpec`] values;
//! * [`generator`] turns one `JobSpec` into a deterministic stream of [`IoRequest`]s;
//! * [`trace`] reads (and writes) recorded block traces in the MSR Cambridge CSV, blkparse,
//!   FIU IODedup, fio iolog and SSDSim/MQSim ASCII formats, computes their ScalaAFA Table 2
//!   statistics, transforms them and synthesizes look-alikes of Table 2's traces;
//! * [`size`] parses fio-style sizes and durations.
//!
//! Everything here is deterministic: the same inputs and seed always produce the same
//! requests, and no input, however malformed, makes the parsers panic.

pub mod fio;
pub mod generator;
pub mod size;
pub mod trace;

mod error;
pub use error::WorkloadError;

/// The kind of a block I/O request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum IoOp {
    /// Read `len_bytes` starting at `offset_bytes`.
    Read,
    /// Write `len_bytes` starting at `offset_bytes`.
    Write,
    /// Discard (TRIM / deallocate) the given range.
    Trim,
    /// Flush the volatile write cache; offset and length carry no meaning.
    Flush,
}

/// One block I/O request addressed to the target volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoRequest {
    /// What the request does.
    pub op: IoOp,
    /// Byte offset of the first byte addressed, from the start of the volume.
    pub offset_bytes: u64,
    /// Number of bytes addressed.
    pub len_bytes: u64,
    /// Force unit access (writes only): the write completes only once it is durable, as
    /// fio's `sync=1` and a traced write's FUA flag ask.
    pub fua: bool,
    /// The request waits until everything its stream issued before it has completed, as
    /// fio's verify pass waits for the writes it reads back.
    pub drain_first: bool,
    /// The request waits until no request its stream has in flight overlaps it, as a read
    /// of fio's `verify_backlog` waits for the write it reads back.
    pub after_overlapping: bool,
}
