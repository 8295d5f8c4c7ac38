//! The configuration of a WAFLASH SSD: the medium, the write buffer, the FTL and the host
//! interface. Every field has a default, so a TOML `[waflash]` table only names what differs.

use afa_nand::{CellMode, FaultConfig, Geometry, NandTiming, PayloadMode};
use afa_ssd::HostInterfaceConfig;
use serde::{Deserialize, Serialize};

use crate::WaflashError;

/// How the DRAM write buffer chooses what to destage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BufferPolicy {
    /// VSSIM's circular queue of requests: when space runs out, the oldest request's pages
    /// are destaged together, whatever they hold.
    Fifo,
    /// The least recently written (or read) page goes first.
    Lru,
    /// Seol et al. (CASES '09): LRU, but a partial page whose read-modify-write read would
    /// wait on a busy chip is passed over for the next page nearer the bottom that would not.
    Mca,
    /// WAFLASH §III-A: one LRU stack of full and partial pages; when the target chips are
    /// idle the bottom page goes, when they are busy the full page nearest the bottom goes
    /// (or, when the buffer holds no full page, the page nearest the bottom whose target
    /// chips are idle).
    PcLru,
}

/// How the `fifo` buffer destages when a write does not fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FifoDrain {
    /// The oldest buffered request's pages leave, as many requests as the waiting write
    /// needs, all booked at the time of that write.
    #[default]
    OneRequest,
    /// VSSIM's drain (§IV: it "evicts the data of one request, until all requests in the
    /// buffer are destaged"): a write that does not fit marks every buffered request for
    /// destaging, and the controller destages them one after the other, each request's
    /// flash operations issued when the previous request's have ended (VSSIM's I/O thread
    /// waits in `WAIT_FLASH_IO` after each request). The write waits until enough of the
    /// drain has completed; host commands that arrive meanwhile take the dies between the
    /// drain's requests.
    Whole,
}

/// How the FTL serves a partial-page write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FtlKind {
    /// A page-level FTL that merges every partial page with its old version first
    /// (read-modify-write, the extra read queued on the chip like any other operation).
    PageRmw,
    /// MV-FTL (§III-B): a partial page covering more than `mv_threshold_sectors` goes to a
    /// new page as a new version, without reading the old one.
    MultiVersion,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WaflashConfig {
    /// A partial `geometry` table is laid over WAFLASH's default geometry (16 KiB pages),
    /// not the generic SSD's.
    #[serde(deserialize_with = "geometry_over_default")]
    pub geometry: Geometry,
    pub timing: NandTiming,
    pub cell_mode: CellMode,
    pub payload: PayloadMode,
    /// (physical − logical) / physical.
    pub over_provisioning: f64,
    /// Laid over WAFLASH's defaults as `geometry` is (up to 256 sectors per command).
    #[serde(deserialize_with = "host_over_default")]
    pub host: HostInterfaceConfig,
    pub buffer_policy: BufferPolicy,
    /// How `buffer_policy = "fifo"` destages: one request at a time as the waiting write
    /// needs (`one-request`), or VSSIM's drain of the whole buffer (`whole`).
    pub fifo_drain: FifoDrain,
    /// DRAM write buffer size; it is allocated sector by sector.
    pub buffer_bytes: u64,
    pub ftl: FtlKind,
    /// §III-C compaction of small partial pages (needs `ftl = "multi-version"`).
    pub compaction: bool,
    /// Logical pages per compaction region: only small partial pages of the same region
    /// share a physical page.
    pub region_pages: u32,
    /// A partial page with more valid sectors than this is a multi-version write; fewer is a
    /// read-modify-write (or a compaction piece). Default: half a page.
    pub mv_threshold_sectors: Option<u32>,
    /// Most versions a logical page may have before a write merges them in the foreground.
    pub max_versions: u32,
    /// Foreground GC runs in a plane when its free blocks drop below this.
    pub gc_threshold_blocks: u32,
    /// Logical pages merged per idle-time call.
    pub idle_merge_batch: u32,
    /// How long the host must have had no command outstanding before idle-time merging
    /// starts, in ns: the controller's idle timer. The default, 1 ms, is the quiet time
    /// after which serve mode gives member SSDs idle time. 0 merges in every gap between
    /// commands, which puts merges in front of a lightly loaded host's next command
    /// (docs/waflash.md, pass s18).
    pub idle_merge_after_ns: u64,
    /// How many pages from the bottom of the stack MCA looks at when it passes over
    /// partial pages. PC-LRU looks for the full page nearest the bottom in the whole stack.
    pub scan_window_pages: u32,
    /// Injected media faults: a failed program is retried on another page and its block
    /// retired at its next GC, a failed erase makes its block bad, and a host read that
    /// needs flash may fail as uncorrectable (docs/waflash.md, "Media faults").
    pub faults: FaultConfig,
}

impl Default for WaflashConfig {
    fn default() -> Self {
        Self {
            geometry: Geometry {
                channels: 4,
                chips_per_channel: 2,
                dies_per_chip: 1,
                planes_per_die: 2,
                blocks_per_plane: 64,
                pages_per_block: 64,
                page_bytes: 16_384,
                sector_bytes: 4096,
                oob_bytes_per_page: 128,
            },
            timing: NandTiming::default(),
            cell_mode: CellMode::Mlc,
            payload: PayloadMode::Token,
            over_provisioning: 0.12,
            host: HostInterfaceConfig {
                max_transfer_sectors: 256,
                ..HostInterfaceConfig::default()
            },
            buffer_policy: BufferPolicy::PcLru,
            fifo_drain: FifoDrain::OneRequest,
            buffer_bytes: 4 << 20,
            ftl: FtlKind::MultiVersion,
            compaction: true,
            region_pages: 64,
            mv_threshold_sectors: None,
            max_versions: 4,
            gc_threshold_blocks: 3,
            idle_merge_batch: 16,
            idle_merge_after_ns: 1_000_000,
            scan_window_pages: 256,
            faults: FaultConfig::default(),
        }
    }
}

/// Defines `$name`, which deserializes a table of some of `$ty`'s fields (unknown ones are
/// refused by name) and takes the others from `WaflashConfig::default()`'s `$field`. A
/// nested table would otherwise get the defaults of `$ty` itself, which for the geometry
/// are the generic SSD's 4 KiB pages.
macro_rules! over_waflash_default {
    ($name:ident, $ty:ident, $field:ident, { $($f:ident: $fty:ty),* $(,)? }) => {
        fn $name<'de, D: serde::Deserializer<'de>>(d: D) -> Result<$ty, D::Error> {
            #[derive(Deserialize)]
            #[serde(deny_unknown_fields)]
            struct Partial {
                $($f: Option<$fty>,)*
            }
            let p = Partial::deserialize(d)?;
            let base = WaflashConfig::default().$field;
            Ok($ty {
                $($f: p.$f.unwrap_or(base.$f),)*
            })
        }
    };
}

over_waflash_default!(geometry_over_default, Geometry, geometry, {
    channels: u32,
    chips_per_channel: u32,
    dies_per_chip: u32,
    planes_per_die: u32,
    blocks_per_plane: u32,
    pages_per_block: u32,
    page_bytes: u32,
    sector_bytes: u32,
    oob_bytes_per_page: u32,
});

over_waflash_default!(host_over_default, HostInterfaceConfig, host, {
    queue_depth: u32,
    bandwidth_mb_s: f64,
    command_overhead_ns: u64,
    max_transfer_sectors: u32,
    dram_mb_s: f64,
    duplex: afa_ssd::Duplex,
});

impl WaflashConfig {
    /// The baseline of the paper: VSSIM's FIFO request buffer over a page FTL that serves
    /// partial pages by read-modify-write.
    pub fn baseline(mut self) -> Self {
        self.buffer_policy = BufferPolicy::Fifo;
        self.ftl = FtlKind::PageRmw;
        self.compaction = false;
        self
    }

    /// WAFLASH: PC-LRU over MV-FTL with compaction.
    pub fn waflash(mut self) -> Self {
        self.buffer_policy = BufferPolicy::PcLru;
        self.fifo_drain = FifoDrain::OneRequest;
        self.ftl = FtlKind::MultiVersion;
        self.compaction = true;
        self
    }

    pub fn sectors_per_page(&self) -> u32 {
        self.geometry.sectors_per_page()
    }

    /// Sectors above which a partial page is written as a new version.
    pub fn mv_threshold(&self) -> u32 {
        self.mv_threshold_sectors
            .unwrap_or(self.sectors_per_page() / 2)
    }

    pub fn buffer_sectors(&self) -> u64 {
        self.buffer_bytes / self.geometry.sector_bytes as u64
    }

    pub fn validate(&self) -> Result<(), WaflashError> {
        self.geometry.validate()?;
        self.timing.validate()?;
        self.faults.validate()?;
        let bad = |m: String| Err(WaflashError::Config(m));
        if !(0.0..0.9).contains(&self.over_provisioning) || self.over_provisioning.is_nan() {
            return bad(format!(
                "over_provisioning = {} must lie in [0, 0.9)",
                self.over_provisioning
            ));
        }
        let spp = self.sectors_per_page();
        self.host.validate().map_err(|e| match e {
            afa_ssd::SsdError::Config(m) => WaflashError::Config(m),
            other => WaflashError::Config(other.to_string()),
        })?;
        // A write must always fit in the buffer next to one page being destaged, or it
        // could wait for space forever.
        let needed = self.host.max_transfer_sectors as u64 + 2 * spp as u64;
        if self.buffer_sectors() < needed {
            return bad(format!(
                "buffer_bytes = {} holds {} sectors; it must hold at least {needed} \
                 (host.max_transfer_sectors plus two pages)",
                self.buffer_bytes,
                self.buffer_sectors()
            ));
        }
        if self.compaction && self.ftl != FtlKind::MultiVersion {
            return bad("compaction = true needs ftl = \"multi-version\"".into());
        }
        if self.fifo_drain != FifoDrain::OneRequest && self.buffer_policy != BufferPolicy::Fifo {
            return bad("fifo_drain = \"whole\" needs buffer_policy = \"fifo\"".into());
        }
        if self.region_pages == 0 {
            return bad("region_pages must be positive".into());
        }
        if self.mv_threshold() >= spp {
            return bad(format!(
                "mv_threshold_sectors = {} must be below the {spp} sectors of a page",
                self.mv_threshold()
            ));
        }
        // A threshold of 0 sends every partial page to a new version, so none is ever small
        // enough to compact: compaction would be on in the configuration and off in the
        // run. Only a threshold the user set can be 0 with compaction on; the default is
        // half a page, 0 only on a one-sector page, which has no partial pages anyway.
        if self.compaction && self.mv_threshold_sectors == Some(0) {
            return bad(
                "mv_threshold_sectors = 0 leaves no partial page small enough to compact, so \
                 compaction = true would do nothing; set compaction = false or a threshold of \
                 at least 1"
                    .into(),
            );
        }
        if self.max_versions < 2 {
            return bad(format!(
                "max_versions = {} must be at least 2",
                self.max_versions
            ));
        }
        if self.gc_threshold_blocks < 2 {
            return bad("gc_threshold_blocks must be at least 2".into());
        }
        if self.gc_threshold_blocks + 2 >= self.geometry.blocks_per_plane {
            return bad(format!(
                "geometry.blocks_per_plane = {} leaves no room above gc_threshold_blocks = {}",
                self.geometry.blocks_per_plane, self.gc_threshold_blocks
            ));
        }
        if self.scan_window_pages == 0 || self.idle_merge_batch == 0 {
            return bad("scan_window_pages and idle_merge_batch must be positive".into());
        }
        if let Err(m) = afa_sim::check_step_ns("idle_merge_after_ns", self.idle_merge_after_ns) {
            return bad(m);
        }
        let usable_blocks = (self.geometry.blocks_per_plane - self.gc_threshold_blocks - 1) as u64
            * self.geometry.planes_total() as u64;
        if self.logical_pages() as u64 >= usable_blocks * self.geometry.pages_per_block as u64 {
            return bad(format!(
                "over_provisioning = {} leaves too little spare space for GC: raise it",
                self.over_provisioning
            ));
        }
        if self.logical_pages() == 0 {
            return bad("the device has no logical pages".into());
        }
        // The buffer holds at most one dirty copy of each logical page, so room past the
        // logical space could hold nothing but pages on their way to flash. A value that
        // large is a slip (a size meant for another device, or a unit too many) rather than
        // a device worth measuring.
        let logical_bytes = self.logical_pages() as u64 * self.geometry.page_bytes as u64;
        if self.buffer_bytes > logical_bytes {
            return bad(format!(
                "buffer_bytes = {} is larger than the device's logical space; it can be at \
                 most {logical_bytes} bytes ({} logical pages of {} bytes)",
                self.buffer_bytes,
                self.logical_pages(),
                self.geometry.page_bytes
            ));
        }
        Ok(())
    }

    /// Logical pages the host sees.
    /// The shape of the medium and the logical space, which a medium kept in a file must
    /// be opened under: "4 channels x 2 chips x 1 dies x 2 planes x 64 blocks x 64 pages of
    /// 16384 bytes, sectors of 4096 bytes, 57671 logical pages".
    pub fn medium_shape(&self) -> String {
        let g = &self.geometry;
        format!(
            "{} channels x {} chips x {} dies x {} planes x {} blocks x {} pages of {} bytes, sectors of {} bytes, {} logical pages",
            g.channels,
            g.chips_per_channel,
            g.dies_per_chip,
            g.planes_per_die,
            g.blocks_per_plane,
            g.pages_per_block,
            g.page_bytes,
            g.sector_bytes,
            self.logical_pages()
        )
    }

    pub fn logical_pages(&self) -> u32 {
        (self.geometry.pages_total() as f64 * (1.0 - self.over_provisioning)) as u32
    }
}
