//! Configuration of one SSD: the medium, the host interface, the write buffer, the FTL, the
//! SLC cache and wear levelling. Every key is listed with its unit and default in
//! docs/configuration.md.

use afa_nand::{CellMode, FaultConfig, Geometry, NandTiming, PayloadMode};
use serde::{Deserialize, Serialize};

use crate::SsdError;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SsdConfig {
    pub geometry: Geometry,
    pub timing: NandTiming,
    /// The cell mode of the bulk of the flash (MLC or TLC); the SLC cache uses SLC.
    pub cell_mode: CellMode,
    /// Over-provisioning as (physical − logical) / logical: 0.07 means 7% spare.
    pub over_provisioning: f64,
    pub payload: PayloadMode,
    pub host: HostInterfaceConfig,
    pub write_buffer: WriteBufferConfig,
    pub ftl: FtlConfig,
    pub gc: GcConfig,
    pub slc_cache: SlcCacheConfig,
    pub wear_leveling: WearLevelingConfig,
    pub faults: FaultConfig,
    /// The in-SSD XOR/RS engine that runs ScalaAFA's `convert` command.
    pub convert: ConvertEngineConfig,
}

impl Default for SsdConfig {
    fn default() -> Self {
        Self {
            geometry: Geometry::default(),
            timing: NandTiming::default(),
            cell_mode: CellMode::Mlc,
            over_provisioning: 0.07,
            payload: PayloadMode::Token,
            host: HostInterfaceConfig::default(),
            write_buffer: WriteBufferConfig::default(),
            ftl: FtlConfig::default(),
            gc: GcConfig::default(),
            slc_cache: SlcCacheConfig::default(),
            wear_leveling: WearLevelingConfig::default(),
            faults: FaultConfig::default(),
            convert: ConvertEngineConfig::default(),
        }
    }
}

/// The NVMe-like host interface.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HostInterfaceConfig {
    /// Commands the device accepts at once; the workload driver never exceeds it.
    pub queue_depth: u32,
    /// Link bandwidth per direction in MB/s (PCIe 4.0 x4 is about 7,880 MB/s).
    pub bandwidth_mb_s: f64,
    /// Firmware time to parse and dispatch one command, in ns.
    pub command_overhead_ns: u64,
    /// Largest command in sectors (MDTS).
    pub max_transfer_sectors: u32,
    /// Controller DRAM copy rate in MB/s, for write-buffer hits.
    pub dram_mb_s: f64,
    /// Whether the link carries both directions at once (PCIe) or one at a time (SATA).
    pub duplex: Duplex,
}

impl Default for HostInterfaceConfig {
    fn default() -> Self {
        Self {
            queue_depth: 1024,
            bandwidth_mb_s: 7_880.0,
            command_overhead_ns: 1_000,
            max_transfer_sectors: 65_536,
            dram_mb_s: 12_800.0,
            duplex: Duplex::Full,
        }
    }
}

/// How the host link shares its wires between the two directions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Duplex {
    /// Each direction has its own lanes (PCIe): a read's data going up does not delay a
    /// write's coming down.
    #[default]
    Full,
    /// One direction at a time (SATA: a FIS goes one way on the one pair of wires), so
    /// read and write data take turns at `bandwidth_mb_s` in total.
    Half,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BufferPolicy {
    /// Evicts in insertion order; rewriting a buffered page does not refresh it.
    Fifo,
    /// Evicts the least recently written or read page.
    Lru,
}

/// The DRAM write buffer (write-back). Capacity 0 turns it off: writes then complete when
/// their pages are programmed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WriteBufferConfig {
    pub capacity_bytes: u64,
    pub policy: BufferPolicy,
    /// Write-behind: once more than this fraction of the buffer's pages is dirty, each write
    /// that arrives starts programming the coldest pages (at most one program per plane in
    /// flight), so a buffer whose writes the flash keeps up with has room when they come.
    /// 1 programs a page only when a write needs its slot; 0 programs every page at once.
    pub destage_fraction: f64,
}

impl Default for WriteBufferConfig {
    fn default() -> Self {
        Self {
            capacity_bytes: 0,
            policy: BufferPolicy::Lru,
            destage_fraction: 0.5,
        }
    }
}

/// Page-level FTL allocation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FtlConfig {
    /// Order in which consecutive page writes visit the parallel units, fastest-varying first,
    /// in MQSim's letters: C(hannel), W(ay = chip), D(ie), P(lane). "CWDP" spreads consecutive
    /// pages over channels first.
    pub allocation_order: String,
    /// Dynamic allocation: a host page goes to whichever of the next `die_aware_window`
    /// planes in allocation order has its die free first (1 = strictly in order).
    pub die_aware_window: u32,
}

impl Default for FtlConfig {
    fn default() -> Self {
        Self {
            allocation_order: "CWDP".to_string(),
            die_aware_window: 1,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VictimPolicy {
    /// The block with the fewest valid pages.
    Greedy,
    /// The block that was filled longest ago.
    Fifo,
    /// Highest (1 − u) · age / (1 + u): free space gained times its age over the cost of
    /// reading and rewriting the valid part (the cleaning policy of Sprite LFS, Rosenblum and
    /// Ousterhout, 1992).
    CostBenefit,
}

/// Garbage collection, per plane.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GcConfig {
    pub victim: VictimPolicy,
    /// Background GC cleans a plane while the device is idle and the plane has fewer free
    /// blocks than this.
    pub soft_threshold_blocks: u32,
    /// Foreground GC runs inside a write when a plane has fewer free blocks than this.
    pub hard_threshold_blocks: u32,
    pub background: bool,
    /// Below the soft threshold, clean incrementally: each host page written to the plane
    /// relocates a share of the current victim's pages (set by the victim's valid/invalid
    /// ratio) instead of the host waiting for whole blocks at the hard threshold.
    pub incremental: bool,
    /// Idle-time erase: while no host command is in flight, erase every full block that
    /// holds no valid page (a TRIMmed or wholly overwritten block), one per idle die at a
    /// time, so that later writes find erased blocks instead of paying the erase in their
    /// own time. Off by default: the simulated SSDs of the other papers' presets erase only
    /// when a write needs a block, and turning this on moves their figures.
    pub idle_erase: bool,
}

impl Default for GcConfig {
    fn default() -> Self {
        Self {
            victim: VictimPolicy::Greedy,
            soft_threshold_blocks: 4,
            hard_threshold_blocks: 2,
            background: true,
            incremental: false,
            idle_erase: false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SlcEvictionPolicy {
    /// The SLC block with the most invalid pages (fewest pages to migrate).
    Greedy,
    /// The SLC block filled longest ago.
    Fifo,
    /// ScalaAFA §5.5: highest invalid − factor · transient, so transient replicas die in SLC.
    Transient,
}

/// The SLC cache: a pool of blocks run in SLC mode in front of the dense blocks. Host writes
/// land there; the evictor migrates valid pages to dense blocks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SlcCacheConfig {
    /// SLC capacity in bytes (0 turns the cache off). Its blocks come out of the raw flash,
    /// so they do not count toward the logical capacity.
    pub capacity_bytes: u64,
    pub eviction: SlcEvictionPolicy,
    /// The weight of transient pages in the `transient` policy's score.
    pub transient_factor: f64,
}

impl Default for SlcCacheConfig {
    fn default() -> Self {
        Self {
            capacity_bytes: 0,
            eviction: SlcEvictionPolicy::Greedy,
            transient_factor: 1.0,
        }
    }
}

/// The controller's parity engine (ScalaAFA §6.1: an FPGA XOR engine at 200 MHz takes
/// 20 µs to compute a 64 KiB parity chunk from 6 data chunks). Its time scales linearly with
/// the bytes it reads, i.e. with k and the chunk size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConvertEngineConfig {
    /// Engine time for one 64 KiB parity chunk from 6 data chunks, in ns.
    pub ns_per_64k_from_6: u64,
}

impl Default for ConvertEngineConfig {
    fn default() -> Self {
        Self {
            ns_per_64k_from_6: 20_000,
        }
    }
}

impl ConvertEngineConfig {
    /// Engine time to compute one parity chunk of `chunk_bytes` from `k` data chunks.
    pub fn engine_ns(&self, k: u32, chunk_bytes: u64) -> u64 {
        (self.ns_per_64k_from_6 as u128 * k as u128 * chunk_bytes as u128 / (6 * 65_536)) as u64
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WearLevelingConfig {
    /// Dynamic wear levelling: a new block is the least-erased free block of its plane.
    pub dynamic: bool,
    /// Static wear levelling: when a plane's erase counts spread by more than this, the
    /// coldest block's data is moved so the block returns to use. 0 turns it off.
    pub static_threshold_erases: u32,
}

impl Default for WearLevelingConfig {
    fn default() -> Self {
        Self {
            dynamic: true,
            static_threshold_erases: 0,
        }
    }
}

impl HostInterfaceConfig {
    /// Checks the link's fields; shared by every controller that has this host interface.
    pub fn validate(&self) -> Result<(), SsdError> {
        if self.queue_depth == 0 {
            return Err(SsdError::Config("host.queue_depth must be positive".into()));
        }
        if self.max_transfer_sectors == 0 {
            return Err(SsdError::Config(
                "host.max_transfer_sectors must be positive".into(),
            ));
        }
        for (name, v) in [
            ("host.bandwidth_mb_s", self.bandwidth_mb_s),
            ("host.dram_mb_s", self.dram_mb_s),
        ] {
            afa_sim::check_bandwidth_mb_s(name, v).map_err(SsdError::Config)?;
        }
        afa_sim::check_step_ns("host.command_overhead_ns", self.command_overhead_ns)
            .map_err(SsdError::Config)
    }
}

impl SsdConfig {
    pub fn validate(&self) -> Result<(), SsdError> {
        self.geometry.validate()?;
        self.timing.validate()?;
        self.faults.validate()?;
        if self.cell_mode == CellMode::Slc && self.slc_cache.capacity_bytes > 0 {
            return Err(SsdError::Config(
                "slc_cache.capacity_bytes must be 0 when cell_mode is slc".into(),
            ));
        }
        if !(self.over_provisioning.is_finite() && self.over_provisioning > 0.0) {
            return Err(SsdError::Config(format!(
                "over_provisioning = {} must be a positive fraction such as 0.07",
                self.over_provisioning
            )));
        }
        self.host.validate()?;
        if self.gc.hard_threshold_blocks < 2 {
            return Err(SsdError::Config(format!(
                "gc.hard_threshold_blocks = {} must be at least 2 (GC needs a block to move \
                 pages into)",
                self.gc.hard_threshold_blocks
            )));
        }
        // Before the soft threshold is compared with the hard one: a hard threshold too
        // large for the plane must be named as such, not as a soft threshold below it.
        self.validate_plane_budget()?;
        if self.gc.soft_threshold_blocks < self.gc.hard_threshold_blocks {
            return Err(SsdError::Config(format!(
                "gc.soft_threshold_blocks = {} is below gc.hard_threshold_blocks = {}",
                self.gc.soft_threshold_blocks, self.gc.hard_threshold_blocks
            )));
        }
        if self.slc_cache.transient_factor < 0.0 || !self.slc_cache.transient_factor.is_finite() {
            return Err(SsdError::Config(
                "slc_cache.transient_factor must be a non-negative number".into(),
            ));
        }
        parse_allocation_order(&self.ftl.allocation_order)?;
        if self.ftl.die_aware_window == 0 {
            return Err(SsdError::Config(
                "ftl.die_aware_window must be at least 1".into(),
            ));
        }
        Ok(())
    }

    /// Checks that every plane holds its SLC cache blocks, the GC reserve and at least one
    /// block of data, and that over-provisioning leaves room for the reserve, as the FTL
    /// lays the blocks out (docs/configuration.md, "Capacity"). The FTL checks the same
    /// when it is built, but its messages cannot tell the keys apart (it blamed
    /// `slc_cache.capacity_bytes` for a plane too small for the GC reserve even with no
    /// cache at all), so the checks are made here first, each naming the key at fault and
    /// the bound it breaks. Factory bad blocks are drawn only when the flash is built, so
    /// these checks assume none: a configuration they pass can still fail in the FTL when
    /// bad blocks take a plane's spare, and one they refuse would fail there too.
    fn validate_plane_budget(&self) -> Result<(), SsdError> {
        let g = &self.geometry;
        let blocks_per_plane = u64::from(g.blocks_per_plane);
        let planes = u64::from(g.planes_total());
        let hard = u64::from(self.gc.hard_threshold_blocks);
        // A plane that may see a failed program or erase keeps one free block more (see the
        // FTL's `failure_spare`).
        let spare = u64::from(self.faults.media_can_fail());
        let reserve = hard + 2 + spare;
        // What the reserve is made of, for the messages below.
        let reserve_parts = format!(
            "gc.hard_threshold_blocks = {hard} free blocks plus the 2 open blocks of host and \
             GC{}",
            if spare > 0 {
                " plus 1 spare for failed programs and erases, as \
                 faults.program_fail_probability or faults.erase_fail_probability > 0"
            } else {
                ""
            }
        );
        if reserve >= blocks_per_plane {
            // The threshold is at fault when a smaller one (at least 2) would fit; otherwise
            // the plane is too small for any GC reserve.
            let largest_threshold = blocks_per_plane.saturating_sub(3 + spare);
            return Err(SsdError::Config(if largest_threshold >= 2 {
                format!(
                    "gc.hard_threshold_blocks = {hard} is too large for a plane of \
                     geometry.blocks_per_plane = {blocks_per_plane}: each plane sets aside \
                     {reserve} blocks for GC ({reserve_parts}) and needs at least one block \
                     more for data, so the threshold can be at most {largest_threshold}"
                )
            } else {
                format!(
                    "geometry.blocks_per_plane = {blocks_per_plane} is too small: each plane \
                     sets aside {reserve} blocks for GC ({reserve_parts}) and needs at least \
                     one block more for data, so blocks_per_plane must be at least {}",
                    reserve + 1
                )
            }));
        }
        // As the FTL does: the cache is rounded up to whole SLC blocks, which are spread
        // evenly over the planes (rounded up again). A dense block run as SLC keeps one bit
        // per cell, so it holds 1/bits of its pages (at least one).
        let slc_block_pages =
            (g.pages_per_block / self.cell_mode.bits_per_cell().max(1)).max(1) as u64;
        let slc_block_bytes = slc_block_pages * u64::from(g.page_bytes);
        let slc_capacity = self.slc_cache.capacity_bytes;
        let slc_per_plane = slc_capacity.div_ceil(slc_block_bytes).div_ceil(planes);
        if slc_per_plane == 1 {
            return Err(SsdError::Config(format!(
                "slc_cache.capacity_bytes = {slc_capacity} gives each plane only one SLC block \
                 ({slc_block_bytes}-byte SLC blocks over {planes} planes); every plane needs at \
                 least two, so the cache must be 0 or more than {} bytes",
                planes * slc_block_bytes
            )));
        }
        if slc_per_plane + reserve >= blocks_per_plane {
            let largest_per_plane = blocks_per_plane - reserve - 1;
            let bound = if largest_per_plane >= 2 {
                format!(
                    "the cache can be at most {} bytes ({largest_per_plane} SLC blocks per \
                     plane)",
                    largest_per_plane * planes * slc_block_bytes
                )
            } else {
                format!(
                    "there is no room for a cache (at least 2 SLC blocks per plane): set it to 0 \
                     or make geometry.blocks_per_plane at least {}",
                    reserve + 3
                )
            };
            return Err(SsdError::Config(format!(
                "slc_cache.capacity_bytes = {slc_capacity} takes {slc_per_plane} SLC blocks in \
                 each plane ({slc_block_bytes}-byte SLC blocks over {planes} planes), which \
                 leaves no dense block for data in a plane of geometry.blocks_per_plane = \
                 {blocks_per_plane} that also sets aside {reserve} blocks for GC \
                 ({reserve_parts}); {bound}"
            )));
        }
        // The logical capacity, as the FTL computes it, must be positive and fit in the dense
        // pages outside the GC reserve.
        let pages_per_block = u64::from(g.pages_per_block);
        let dense_blocks = (blocks_per_plane - slc_per_plane) * planes;
        let dense_pages = dense_blocks * pages_per_block;
        let unreserved_pages = (dense_blocks - reserve * planes) * pages_per_block;
        let op = self.over_provisioning;
        let logical_pages = (dense_pages as f64 / (1.0 + op)).floor() as u64;
        if logical_pages == 0 {
            return Err(SsdError::Config(format!(
                "over_provisioning = {op} leaves no logical page of the {dense_pages} dense \
                 pages: it can be at most {}",
                dense_pages - 1
            )));
        }
        if logical_pages > unreserved_pages {
            // Any value of at least dense / unreserved − 1 fits; it is rounded up to four
            // decimals so that the printed bound is itself enough.
            let least = (dense_pages as f64 / unreserved_pages as f64 - 1.0) * 1e4;
            return Err(SsdError::Config(format!(
                "over_provisioning = {op} leaves {logical_pages} logical pages, more than the \
                 {unreserved_pages} dense pages outside the GC reserve of {reserve} blocks \
                 per plane ({reserve_parts}): over_provisioning must be at least {}",
                least.ceil() / 1e4
            )));
        }
        Ok(())
    }
}

/// Parses an allocation order such as "CWDP" into the dimension indices (0 channel, 1 chip,
/// 2 die, 3 plane), fastest-varying first.
pub fn parse_allocation_order(order: &str) -> Result<[usize; 4], SsdError> {
    let bad = || {
        SsdError::Config(format!(
            "ftl.allocation_order = {order:?} must be a permutation of the letters C, W, D, P"
        ))
    };
    let mut dims = [0usize; 4];
    let mut seen = [false; 4];
    let letters: Vec<char> = order.chars().collect();
    if letters.len() != 4 {
        return Err(bad());
    }
    for (i, c) in letters.iter().enumerate() {
        let d = match c.to_ascii_uppercase() {
            'C' => 0,
            'W' => 1,
            'D' => 2,
            'P' => 3,
            _ => return Err(bad()),
        };
        if seen[d] {
            return Err(bad());
        }
        seen[d] = true;
        dims[i] = d;
    }
    Ok(dims)
}
