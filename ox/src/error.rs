//! The errors of the OX controller, its front ends and the host key-value store.

use afa_nand::NandError;

/// Why the controller refused a configuration or a command, or could not go on.
///
/// Bad input from a host (an LPID out of range, an empty batch, a DESC that does not match
/// its pages) is refused with a typed error, never a panic. Media failures that the FTL
/// absorbs (a failed program retried elsewhere through RDESC_A, a failed erase retiring a
/// block) are not errors; the ones it cannot absorb are.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OxError {
    #[error("invalid OX configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Nand(#[from] NandError),
    #[error("LPID {lpid} lies outside the device's {capacity} logical pages")]
    LpidOutOfRange { lpid: u64, capacity: u64 },
    #[error("a batch must carry at least one page")]
    EmptyBatch,
    #[error("the batch holds {pages} pages but the largest batch is {max} pages")]
    BatchTooLarge { pages: usize, max: usize },
    #[error("the DESC lists {listed} LPIDs but the buffer carries {carried} pages")]
    DescMismatch { listed: usize, carried: usize },
    #[error("the DESC block is malformed: {0}")]
    MalformedDesc(String),
    #[error("the device is out of space: no EBLOCK can be reclaimed")]
    NoSpace,
    /// The device came up read-only; the text says why.
    #[error("the device is read-only: {0}")]
    ReadOnly(String),
    /// Every forward link of the log block failed, and so did every bridge tried for it.
    #[error("the log could not be written: every forward link of log block {block_seq} failed")]
    LogWriteFailed { block_seq: u64 },
    /// Programs of a system EBLOCK (a checkpoint or bad-block-table EBLOCK, and of the
    /// EBLOCKs that replaced it) kept failing.
    #[error("no {what} could be written: {attempts} programs in a row failed")]
    SystemWriteFailed { what: String, attempts: u32 },
    #[error("recovery failed: {0}")]
    Recovery(String),
    #[error("the controller has lost power; recover it before submitting commands")]
    PoweredOff,
    #[error("command time {now_ns} ns lies before the controller's clock {clock_ns} ns")]
    TimeWentBackwards { now_ns: u64, clock_ns: u64 },
    #[error("unknown request {0}")]
    UnknownRequest(u64),
    /// The controller has no event left while the request is still under way: nothing
    /// can ever complete it. A liveness fault of the controller, never of the request.
    #[error("request {0} can never complete: the controller has nothing left to do")]
    Stuck(u64),
    #[error("invalid key-value store configuration: {0}")]
    KvConfig(String),
    #[error("flash image: {0}")]
    Image(String),
    #[error("the MAP entry of LPID {lpid} is flagged as cached but the write cache holds no version of it")]
    WriteCacheInconsistent { lpid: u64 },
    #[error("write {request} failed after the write-back cache acknowledged it ({reason}); the controller stopped")]
    AcknowledgedWriteFailed { request: u64, reason: String },
    #[error("unknown experiment {0:?}")]
    UnknownExperiment(String),
}
