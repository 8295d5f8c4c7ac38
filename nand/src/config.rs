//! The shape and speed of the flash medium, as the user configures it.

use serde::{Deserialize, Deserializer, Serialize};

use crate::NandError;

/// How many bits a cell stores; it decides the timing, the endurance and how many pages a
/// block holds when it is programmed in that mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CellMode {
    Slc,
    Mlc,
    Tlc,
}

impl CellMode {
    pub fn bits_per_cell(self) -> u32 {
        match self {
            CellMode::Slc => 1,
            CellMode::Mlc => 2,
            CellMode::Tlc => 3,
        }
    }

    /// Index into per-mode tables: SLC 0, MLC 1, TLC 2.
    #[inline]
    pub fn index(self) -> usize {
        match self {
            CellMode::Slc => 0,
            CellMode::Mlc => 1,
            CellMode::Tlc => 2,
        }
    }
}

/// The physical organisation of one SSD's flash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Geometry {
    pub channels: u32,
    pub chips_per_channel: u32,
    pub dies_per_chip: u32,
    pub planes_per_die: u32,
    pub blocks_per_plane: u32,
    /// Pages per block when the block is programmed in the device's native (dense) mode.
    pub pages_per_block: u32,
    pub page_bytes: u32,
    /// The host-visible sector (logical block) size: 512 or 4096 bytes.
    pub sector_bytes: u32,
    pub oob_bytes_per_page: u32,
}

impl Default for Geometry {
    /// A small MLC device (8 GiB raw) that runs the embedded default job in well under a second.
    fn default() -> Self {
        Self {
            channels: 8,
            chips_per_channel: 2,
            dies_per_chip: 2,
            planes_per_die: 2,
            blocks_per_plane: 128,
            pages_per_block: 256,
            page_bytes: 4096,
            sector_bytes: 4096,
            oob_bytes_per_page: 64,
        }
    }
}

impl Geometry {
    /// The largest number of sectors per page that the per-page sector bitmaps (u64) can hold.
    pub const MAX_SECTORS_PER_PAGE: u32 = 64;
    /// The most planes a die may have: a die's planes are bits of a 32-bit mask.
    pub const MAX_PLANES_PER_DIE: u32 = 32;

    pub fn validate(&self) -> Result<(), NandError> {
        let fields = [
            ("channels", self.channels),
            ("chips_per_channel", self.chips_per_channel),
            ("dies_per_chip", self.dies_per_chip),
            ("planes_per_die", self.planes_per_die),
            ("blocks_per_plane", self.blocks_per_plane),
            ("pages_per_block", self.pages_per_block),
            ("page_bytes", self.page_bytes),
            ("sector_bytes", self.sector_bytes),
        ];
        for (name, value) in fields {
            if value == 0 {
                return Err(NandError::Config(format!(
                    "geometry.{name} must be positive"
                )));
            }
        }
        if !self.sector_bytes.is_power_of_two() || self.sector_bytes < 512 {
            return Err(NandError::Config(format!(
                "geometry.sector_bytes = {} must be a power of two of at least 512",
                self.sector_bytes
            )));
        }
        if self.page_bytes % self.sector_bytes != 0 {
            return Err(NandError::Config(format!(
                "geometry.page_bytes = {} is not a multiple of geometry.sector_bytes = {}",
                self.page_bytes, self.sector_bytes
            )));
        }
        if self.sectors_per_page() > Self::MAX_SECTORS_PER_PAGE {
            return Err(NandError::Config(format!(
                "geometry: {} sectors per page exceeds the supported {}",
                self.sectors_per_page(),
                Self::MAX_SECTORS_PER_PAGE
            )));
        }
        if self.pages_per_block > u16::MAX as u32 {
            return Err(NandError::Config(format!(
                "geometry.pages_per_block = {} exceeds {}",
                self.pages_per_block,
                u16::MAX
            )));
        }
        // A die's planes are bits of a 32-bit mask (the planes a multi-plane batch uses).
        if self.planes_per_die > Self::MAX_PLANES_PER_DIE {
            return Err(NandError::Config(format!(
                "geometry.planes_per_die = {} exceeds the supported {}",
                self.planes_per_die,
                Self::MAX_PLANES_PER_DIE
            )));
        }
        // The product is taken in u128 so that no field can overflow it; below 2^32 pages,
        // every count the u32 helpers form (dies, planes, blocks) fits too.
        let pages = [
            self.channels,
            self.chips_per_channel,
            self.dies_per_chip,
            self.planes_per_die,
            self.blocks_per_plane,
            self.pages_per_block,
        ]
        .iter()
        .fold(1u128, |product, &n| product * n as u128);
        // Page numbers are stored as u32 to keep per-page metadata small; u32::MAX is reserved.
        if pages >= u32::MAX as u128 {
            return Err(NandError::Config(format!(
                "geometry holds {pages} pages, more than the 2^32-1 a page number can address"
            )));
        }
        Ok(())
    }

    #[inline]
    pub fn sectors_per_page(&self) -> u32 {
        self.page_bytes / self.sector_bytes
    }
    #[inline]
    pub fn dies_total(&self) -> u32 {
        self.channels * self.chips_per_channel * self.dies_per_chip
    }
    #[inline]
    pub fn planes_total(&self) -> u32 {
        self.dies_total() * self.planes_per_die
    }
    #[inline]
    pub fn blocks_total(&self) -> u32 {
        self.planes_total() * self.blocks_per_plane
    }
    #[inline]
    pub fn pages_total(&self) -> u64 {
        self.blocks_total() as u64 * self.pages_per_block as u64
    }
    pub fn raw_bytes(&self) -> u64 {
        self.pages_total() * self.page_bytes as u64
    }
    /// The plane that holds `block`.
    ///
    /// Blocks are numbered across planes (block `i` of plane `p` is `i * planes + p`), so the
    /// blocks that the planes fill at the same time sit next to each other in every per-block
    /// and per-page table. Numbered plane by plane instead, hundreds of concurrently written
    /// blocks would lie megabytes apart and alias to the same cache sets.
    #[inline]
    pub fn plane_of_block(&self, block: u32) -> u32 {
        block % self.planes_total()
    }

    /// Block number of the `index`-th block of `plane`.
    #[inline]
    pub fn block_in_plane(&self, plane: u32, index: u32) -> u32 {
        index * self.planes_total() + plane
    }

    /// Every block of `plane`, in index order.
    pub fn blocks_of_plane(&self, plane: u32) -> impl Iterator<Item = u32> {
        let planes = self.planes_total();
        (0..self.blocks_per_plane).map(move |i| i * planes + plane)
    }
    #[inline]
    pub fn die_of_plane(&self, plane: u32) -> u32 {
        plane / self.planes_per_die
    }
    #[inline]
    pub fn channel_of_die(&self, die: u32) -> u32 {
        die / (self.chips_per_channel * self.dies_per_chip)
    }
    /// Global plane index from its coordinates.
    pub fn plane_index(&self, channel: u32, chip: u32, die: u32, plane: u32) -> u32 {
        ((channel * self.chips_per_channel + chip) * self.dies_per_chip + die) * self.planes_per_die
            + plane
    }
}

/// Latencies of one cell mode.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CellTiming {
    pub read_ns: u64,
    pub program_ns: u64,
    pub erase_ns: u64,
    /// Rated program/erase cycles of a block in this mode. The report compares the most worn
    /// block against it; wear levelling itself works on differences of erase counts.
    pub endurance_cycles: u32,
}

/// A cell mode's timing table as written in a configuration. A key left out keeps that
/// mode's default, so that `--set ssd.timing.mlc.program_ns=900000` (or a sweep of it) works
/// on a configuration that never wrote the table. The defaults differ per mode, which is
/// why [`CellTiming`] itself cannot carry `#[serde(default)]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CellTimingKeys {
    read_ns: Option<u64>,
    program_ns: Option<u64>,
    erase_ns: Option<u64>,
    endurance_cycles: Option<u32>,
}

impl CellTimingKeys {
    fn over(self, default: CellTiming) -> CellTiming {
        CellTiming {
            read_ns: self.read_ns.unwrap_or(default.read_ns),
            program_ns: self.program_ns.unwrap_or(default.program_ns),
            erase_ns: self.erase_ns.unwrap_or(default.erase_ns),
            endurance_cycles: self.endurance_cycles.unwrap_or(default.endurance_cycles),
        }
    }
}

fn slc_timing<'de, D: Deserializer<'de>>(d: D) -> Result<CellTiming, D::Error> {
    Ok(CellTimingKeys::deserialize(d)?.over(NandTiming::default().slc))
}

fn mlc_timing<'de, D: Deserializer<'de>>(d: D) -> Result<CellTiming, D::Error> {
    Ok(CellTimingKeys::deserialize(d)?.over(NandTiming::default().mlc))
}

fn tlc_timing<'de, D: Deserializer<'de>>(d: D) -> Result<CellTiming, D::Error> {
    Ok(CellTimingKeys::deserialize(d)?.over(NandTiming::default().tlc))
}

/// How operations are placed on a die's and a channel's time (docs/models.md, "Timing of the
/// medium").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scheduling {
    /// An operation starts at the earliest idle gap after its input is ready that holds it
    /// whole, even before work booked earlier for later (a die's queue runs what is ready).
    #[default]
    FillGaps,
    /// An operation starts after everything booked before it (FEMU's and MQSim's next-free
    /// time): submission order is execution order on every resource.
    FirstCome,
}

/// Timing of the medium: per-mode latencies and the channel (bus) rate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NandTiming {
    #[serde(deserialize_with = "slc_timing")]
    pub slc: CellTiming,
    #[serde(deserialize_with = "mlc_timing")]
    pub mlc: CellTiming,
    #[serde(deserialize_with = "tlc_timing")]
    pub tlc: CellTiming,
    /// Bus rate of one channel in MB/s (10^6 bytes per second).
    pub channel_mb_s: f64,
    /// Whether operations of the same kind on different planes of one die run together.
    pub multi_plane: bool,
    /// Whether an operation may use an idle gap before work booked earlier for later
    /// (`fill-gaps`), or always waits for everything booked before it (`first-come`).
    pub scheduling: Scheduling,
    /// Whether a read goes ahead of program and erase work on its die, suspending an
    /// operation in progress (program/erase suspend, docs/models.md "Reads ahead of programs
    /// and erases"). Off by default: the other papers' figures were measured without it.
    pub read_suspend: bool,
    /// Whether a read goes ahead of erase work on its die (erase suspend) while programs
    /// still finish first: the older and more common half of program/erase suspend. Implied
    /// by `read_suspend`. Off by default.
    pub erase_suspend: bool,
    /// What suspending a program or erase costs before the read can start, in nanoseconds.
    pub suspend_ns: u64,
}

impl Default for NandTiming {
    /// Typical figures of current NAND (datasheet-like; SLC from MQSim's defaults, MLC/TLC
    /// from FEMU's and WAFLASH's tables), documented in docs/configuration.md.
    fn default() -> Self {
        Self {
            slc: CellTiming {
                read_ns: 25_000,
                program_ns: 200_000,
                erase_ns: 1_500_000,
                endurance_cycles: 50_000,
            },
            mlc: CellTiming {
                read_ns: 50_000,
                program_ns: 600_000,
                erase_ns: 3_000_000,
                endurance_cycles: 3_000,
            },
            tlc: CellTiming {
                read_ns: 75_000,
                program_ns: 1_000_000,
                erase_ns: 5_000_000,
                endurance_cycles: 1_000,
            },
            channel_mb_s: 800.0,
            multi_plane: true,
            scheduling: Scheduling::FillGaps,
            read_suspend: false,
            erase_suspend: false,
            suspend_ns: 20_000,
        }
    }
}

impl NandTiming {
    /// Whether reads may go ahead of booked work at all (program/erase or erase suspend).
    #[inline]
    pub fn reads_go_ahead(&self) -> bool {
        self.read_suspend || self.erase_suspend
    }

    #[inline]
    pub fn of(&self, mode: CellMode) -> &CellTiming {
        match mode {
            CellMode::Slc => &self.slc,
            CellMode::Mlc => &self.mlc,
            CellMode::Tlc => &self.tlc,
        }
    }

    pub fn validate(&self) -> Result<(), NandError> {
        afa_sim::check_bandwidth_mb_s("timing.channel_mb_s", self.channel_mb_s)
            .map_err(NandError::Config)?;
        afa_sim::check_step_ns("timing.suspend_ns", self.suspend_ns).map_err(NandError::Config)?;
        for (name, t) in [("slc", &self.slc), ("mlc", &self.mlc), ("tlc", &self.tlc)] {
            for (op, ns) in [
                ("read_ns", t.read_ns),
                ("program_ns", t.program_ns),
                ("erase_ns", t.erase_ns),
            ] {
                afa_sim::check_step_ns(&format!("timing.{name}.{op}"), ns)
                    .map_err(NandError::Config)?;
            }
            if t.endurance_cycles == 0 {
                return Err(NandError::Config(format!(
                    "timing.{name}.endurance_cycles must be positive"
                )));
            }
            if self.read_suspend && self.suspend_ns >= t.program_ns {
                return Err(NandError::Config(format!(
                    "timing.suspend_ns = {} must be shorter than timing.{name}.program_ns = {}: \
                     suspending an operation takes a fraction of it",
                    self.suspend_ns, t.program_ns
                )));
            }
            if self.erase_suspend && self.suspend_ns >= t.erase_ns {
                return Err(NandError::Config(format!(
                    "timing.suspend_ns = {} must be shorter than timing.{name}.erase_ns = {}: \
                     suspending an erase takes a fraction of it",
                    self.suspend_ns, t.erase_ns
                )));
            }
        }
        Ok(())
    }
}
