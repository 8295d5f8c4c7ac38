//! The SSD controller: an NVMe-like host interface over a DRAM write buffer, a page-level
//! FTL with an SLC cache, garbage collection and wear levelling, on the flash medium of
//! `afa-nand`. It implements [`BlockDevice`], the seam every engine is written against.

mod buffer;
pub mod config;
pub mod device;
mod ftl;
mod precondition;
mod ssd;

pub use config::{
    BufferPolicy, ConvertEngineConfig, Duplex, FtlConfig, GcConfig, HostInterfaceConfig,
    SlcCacheConfig, SlcEvictionPolicy, SsdConfig, VictimPolicy, WearLevelingConfig,
    WriteBufferConfig,
};
pub use device::{
    push_allocation_run, validate_command, validate_convert, BlockDevice, Command, CommandFlags,
    Completion, ConvertCommand, DeviceError, DeviceInfo, HostWork, Opcode, ParityType,
    QueuedCompletion, QueuedDevice, ReadBuffers,
};
pub use ftl::FtlStats;
pub use precondition::{Precondition, PreconditionPattern};
pub use ssd::{Ssd, SsdStats};

/// Errors building an SSD.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SsdError {
    #[error("invalid SSD configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Nand(#[from] afa_nand::NandError),
    #[error(transparent)]
    Device(#[from] DeviceError),
}

#[cfg(test)]
mod tests;
