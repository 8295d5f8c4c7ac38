//! WAFLASH (He et al.): an SSD controller that tames unaligned writes, and its baselines.
//!
//! * [`WaflashSsd`] implements [`afa_ssd::BlockDevice`] over the medium of `afa-nand`:
//!   a sector-granular DRAM write buffer with four replacement policies (FIFO as in VSSIM,
//!   LRU, MCA, PC-LRU), a page FTL that serves partial pages by read-modify-write, MV-FTL
//!   that keeps several versions of a logical page instead, compaction of small partial
//!   pages into shared physical pages, greedy GC that merges versions, and idle-time merging.
//! * [`filebench`] generates block-level request streams shaped like the Filebench
//!   personalities the paper ran (random write, fileserver, webserver, webproxy).
//!
//! The design and its approximations are written down in docs/waflash.md.

mod buffer;
pub mod config;
pub mod device;
pub mod experiment;
pub mod filebench;
mod ftl;
pub mod image;
mod mapping;

pub use config::{BufferPolicy, FifoDrain, FtlKind, WaflashConfig};
pub use device::{DeviceStats, WaflashMedium, WaflashReport, WaflashSsd};
pub use ftl::{
    decode_header, encode_header, FlashMeta, FtlRecovery, FtlStats, Piece, COMPACTED_MARKER,
};
pub use image::WaflashImage;

/// Errors building or driving a WAFLASH SSD outside the command path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WaflashError {
    #[error("invalid WAFLASH configuration: {0}")]
    Config(String),
    #[error("invalid compacted page header: {0}")]
    Header(String),
    /// The medium holds something recovery cannot make sense of (it names the page).
    #[error("recovery after power loss failed: {0}")]
    Recovery(String),
    /// The file a served device keeps its medium in could not be made, read or written.
    #[error("WAFLASH flash image: {0}")]
    Image(String),
    #[error("invalid workload: {0}")]
    Workload(String),
    #[error(transparent)]
    Nand(#[from] afa_nand::NandError),
    #[error(transparent)]
    Device(#[from] afa_ssd::DeviceError),
}

#[cfg(test)]
mod recovery_tests;
#[cfg(test)]
mod tests;
