//! The WAFLASH SSD: host interface, the sector-granular write buffer and its four
//! replacement policies, and the FTL, behind the `BlockDevice` seam.

use afa_nand::{fill_unit, sector_token, HostReadFaults, Nand, NandCounters, PayloadMode};
use afa_sim::{transfer_ns, TimeNs};
use afa_ssd::{
    validate_command, BlockDevice, Command, Completion, DeviceError, DeviceInfo, HostWork, Opcode,
    ReadBuffers,
};
use serde::Serialize;

use crate::buffer::WriteBuffer;
use crate::config::{BufferPolicy, FifoDrain, WaflashConfig};
use crate::ftl::{FlashMeta, Ftl, FtlRecovery, FtlStats};
use crate::{WaflashError, WaflashImage};

/// Controller-level counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct DeviceStats {
    pub commands: u64,
    pub write_commands: u64,
    /// Write commands that begin or end inside a flash page.
    pub unaligned_writes: u64,
    /// Logical pages touched by host writes (a partial page counts as one).
    pub host_page_writes: u64,
    /// Host write spans that landed on a page already in the buffer.
    pub buffer_write_hits: u64,
    /// Host read spans served entirely from the buffer.
    pub buffer_read_hits: u64,
    pub evicted_full_pages: u64,
    pub evicted_partial_pages: u64,
    /// Eviction decisions, and the sum over them of the fraction of buffered pages that
    /// were partial (the mean is the "partial pages in the buffer" figure of §V-B).
    pub eviction_decisions: u64,
    pub partial_fraction_sum: f64,
    /// Evictions where PC-LRU or MCA passed over the bottom page.
    pub bottom_passed_over: u64,
    /// Requests destaged by the FIFO buffer's whole-buffer drain.
    pub drain_requests: u64,
    /// Of those, requests issued ahead of the present, while a write waited for them to
    /// free its space. Work booked ahead is what a host read arriving meanwhile finds on
    /// the dies.
    pub drain_requests_ahead: u64,
    /// The sum over the requests issued ahead of how far ahead of the present they were.
    pub drain_lead_ns_sum: u64,
    /// Host reads failed as uncorrectable (`faults.read_fail_probability`).
    pub uncorrectable_reads: u64,
}

/// Everything a run reports about the device.
#[derive(Debug, Clone, Serialize)]
pub struct WaflashReport {
    pub device: DeviceStats,
    pub ftl: FtlStats,
    pub flash_reads: u64,
    pub flash_programs: u64,
    pub flash_erases: u64,
    /// Mean fraction of buffered pages that were partial, sampled at each eviction.
    pub buffer_partial_fraction_mean: f64,
    /// Compaction header bytes per byte of compacted page.
    pub compaction_space_overhead: f64,
    pub multi_version_pages: u64,
    pub mapping_direct_entries: u64,
    pub mapping_indirect_entries: u64,
    pub mapping_ppn_bits: u32,
    pub mapping_ptf_bits: u32,
}

#[derive(Debug, Clone, Copy)]
struct Span {
    lpn: u32,
    first: u32,
    count: u32,
    /// Offset of the span within the command, in sectors.
    at: u32,
}

impl Span {
    fn mask(&self) -> u64 {
        let ones = if self.count >= 64 {
            u64::MAX
        } else {
            (1u64 << self.count) - 1
        };
        ones << self.first
    }
}

fn spans(lba: u64, sectors: u32, spp: u32) -> Vec<Span> {
    let end = lba + sectors as u64;
    let mut at = lba;
    let mut out = Vec::with_capacity(sectors.div_ceil(spp) as usize + 1);
    while at < end {
        let first = (at % spp as u64) as u32;
        let count = (spp - first).min((end - at) as u32);
        out.push(Span {
            lpn: (at / spp as u64) as u32,
            first,
            count,
            at: (at - lba) as u32,
        });
        at += count as u64;
    }
    out
}

/// What a WAFLASH SSD leaves when it loses power: its configuration, its flash medium and
/// what the medium's OOB areas and compacted pages hold.
#[derive(Debug)]
pub struct WaflashMedium {
    config: WaflashConfig,
    seed: u64,
    nand: Nand,
    meta: FlashMeta,
}

#[cfg(test)]
impl WaflashMedium {
    pub(crate) fn corrupt_oob_lpn(&mut self, ppn: u32, lpn: u32) {
        self.meta.corrupt_oob_lpn(ppn, lpn);
    }
}

/// One emulated WAFLASH SSD (or, configured so, its baselines).
#[derive(Debug)]
pub struct WaflashSsd {
    config: WaflashConfig,
    nand: Nand,
    ftl: Ftl,
    buffer: WriteBuffer,
    info: DeviceInfo,
    spp: u32,
    unit: usize,
    h2d_free_ns: TimeNs,
    d2h_free_ns: TimeNs,
    stats: DeviceStats,
    commands_taken: u64,
    /// FIFO with the whole-buffer drain: when the next drained request may be issued, the
    /// time the previous one's flash operations end (or the drain began).
    drain_next_ns: TimeNs,
    /// The time of the command (or idle call) being served.
    present_ns: TimeNs,
    /// When the last command completed: the host has had nothing outstanding since, when
    /// the device is given idle time.
    last_done_ns: TimeNs,
    /// The file the medium is kept in, when it must outlive the process (serve mode).
    image: Option<WaflashImage>,
    /// The uncorrectable host reads of `faults.read_fail_probability`.
    read_faults: HostReadFaults,
    /// The seed the device was made with: a device recovered after a power loss draws its
    /// read faults from the same stream.
    seed: u64,
}

impl WaflashSsd {
    pub fn new(config: WaflashConfig, seed: u64) -> Result<Self, WaflashError> {
        let nand = Self::medium(&config, seed)?;
        let ftl = Ftl::new(&config, nand.store().unit_bytes(), &nand)?;
        Ok(Self::assemble(config, seed, nand, ftl))
    }

    /// A blank medium for a valid `config`: every block erased (factory bad blocks aside).
    fn medium(config: &WaflashConfig, seed: u64) -> Result<Nand, WaflashError> {
        config.validate()?;
        Ok(Nand::new(
            config.geometry.clone(),
            config.timing.clone(),
            config.cell_mode,
            config.payload,
            config.faults.clone(),
            seed,
        )?)
    }

    /// A controller with an empty write buffer and zeroed counters over `nand` and `ftl`.
    fn assemble(config: WaflashConfig, seed: u64, nand: Nand, ftl: Ftl) -> Self {
        let read_faults = HostReadFaults::new(&config.faults, seed);
        let unit = nand.store().unit_bytes();
        let spp = config.sectors_per_page();
        let logical = config.logical_pages();
        let buffer = WriteBuffer::new(
            config.buffer_policy,
            config.buffer_sectors(),
            logical,
            spp,
            unit,
        );
        let info = DeviceInfo {
            sector_bytes: config.geometry.sector_bytes,
            capacity_sectors: logical as u64 * spp as u64,
            payload_unit_bytes: unit as u32,
            tag_bytes_per_sector: 0,
            max_queue_depth: config.host.queue_depth,
            max_transfer_sectors: config.host.max_transfer_sectors,
        };
        Self {
            config,
            nand,
            ftl,
            buffer,
            info,
            spp,
            unit,
            h2d_free_ns: 0,
            d2h_free_ns: 0,
            stats: DeviceStats::default(),
            commands_taken: 0,
            drain_next_ns: 0,
            present_ns: 0,
            last_done_ns: 0,
            image: None,
            read_faults,
            seed,
        }
    }

    /// Arms an injected power loss: the power goes when the controller starts its
    /// `flash_operations + 1`-th flash program or erase from now on. That program is torn;
    /// the command it serves fails, and so does every command after it, until
    /// [`WaflashSsd::power_loss`] and [`WaflashSsd::recover`].
    pub fn cut_power_after(&mut self, flash_operations: u64) {
        self.ftl.cut_power_after(flash_operations);
    }

    /// Whether an injected power loss has happened.
    pub fn power_lost(&self) -> bool {
        self.ftl.power_lost()
    }

    /// The power goes: the write buffer, the mapping table and every other structure in
    /// controller DRAM are lost; the flash medium, its OOB areas and the compacted pages'
    /// headers are what remains. The buffer has no power-loss protection, so writes are
    /// durable once a FLUSH (or their own FUA) has completed, not when acknowledged.
    pub fn power_loss(self) -> WaflashMedium {
        WaflashMedium {
            config: self.config,
            seed: self.seed,
            nand: self.nand,
            meta: self.ftl.into_flash_meta(),
        }
    }

    /// Powers a device up on a medium that lost power: the FTL is rebuilt from the OOB
    /// areas ([`FtlRecovery`] says what was found), the write buffer starts empty and the
    /// counters at zero (the medium's own counters go on).
    pub fn recover(
        medium: WaflashMedium,
        now_ns: TimeNs,
    ) -> Result<(Self, FtlRecovery), WaflashError> {
        let WaflashMedium {
            config,
            seed,
            mut nand,
            meta,
        } = medium;
        let unit = nand.store().unit_bytes();
        let (ftl, found) = Ftl::recover(&config, unit, &mut nand, meta, now_ns, false)?;
        let mut ssd = Self::assemble(config, seed, nand, ftl);
        ssd.present_ns = now_ns;
        ssd.last_done_ns = now_ns;
        ssd.h2d_free_ns = now_ns;
        ssd.d2h_free_ns = now_ns;
        ssd.drain_next_ns = now_ns;
        Ok((ssd, found))
    }

    /// A blank device (payload full) whose medium is kept in `image`, a new image file.
    pub fn create_in(
        mut config: WaflashConfig,
        seed: u64,
        image: WaflashImage,
    ) -> Result<Self, WaflashError> {
        config.payload = PayloadMode::Full;
        let mut ssd = Self::new(config, seed)?;
        ssd.ftl.track_changes();
        // The image's block records start out good; the factory bad blocks go in at once,
        // or a restart would find them good.
        let blocks = ssd.nand.geometry().blocks_total();
        for block in (0..blocks).filter(|&b| ssd.nand.is_bad(b)) {
            ssd.ftl.note_block_change(block);
        }
        ssd.image = Some(image);
        ssd.commit_image()
            .map_err(|e| WaflashError::Image(e.to_string()))?;
        Ok(ssd)
    }

    /// Powers a device up on the medium kept in the image file at `path`, as after a power
    /// loss: the FTL is rebuilt from the OOB areas the image holds ([`FtlRecovery`] says
    /// what was found), and the image goes on keeping the medium.
    pub fn open_image(
        mut config: WaflashConfig,
        seed: u64,
        path: &std::path::Path,
    ) -> Result<(Self, FtlRecovery), WaflashError> {
        config.payload = PayloadMode::Full;
        let mut nand = Self::medium(&config, seed)?;
        let (image, meta) = WaflashImage::open(path, &config, &mut nand)?;
        let unit = nand.store().unit_bytes();
        let (ftl, found) = Ftl::recover(&config, unit, &mut nand, meta, 0, true)?;
        let mut ssd = Self::assemble(config, seed, nand, ftl);
        ssd.image = Some(image);
        Ok((ssd, found))
    }

    /// The image the medium is kept in, for tests that cut a commit short.
    #[cfg(test)]
    pub(crate) fn image_mut(&mut self) -> Option<&mut WaflashImage> {
        self.image.as_mut()
    }

    /// Records that the image file was renamed.
    pub fn image_moved_to(&mut self, path: &std::path::Path) {
        if let Some(image) = &mut self.image {
            image.moved_to(path);
        }
    }

    /// Makes the image (if the medium is kept in one) hold the medium as it is now: what a
    /// completed FLUSH or FUA write promises.
    fn commit_image(&mut self) -> Result<(), DeviceError> {
        let Some(image) = &mut self.image else {
            return Ok(());
        };
        let changes = self.ftl.take_changes();
        if let Err(e) = image.commit(&self.nand, &changes, &self.ftl) {
            self.ftl.restore_changes(changes);
            return Err(DeviceError::Medium(e.to_string()));
        }
        Ok(())
    }

    pub fn config(&self) -> &WaflashConfig {
        &self.config
    }

    /// The flash medium, for the run report's reads, programs, erases and busy dies.
    pub fn nand(&self) -> &Nand {
        &self.nand
    }

    pub fn nand_counters(&self) -> &NandCounters {
        self.nand.counters()
    }

    pub fn stats(&self) -> &DeviceStats {
        &self.stats
    }

    pub fn ftl_stats(&self) -> &FtlStats {
        &self.ftl.stats
    }

    /// Blocks where a program failed that GC has not retired yet.
    pub fn retiring_blocks(&self) -> Vec<u32> {
        (0..self.nand.geometry().blocks_total())
            .filter(|&b| self.ftl.retiring(b))
            .collect()
    }

    /// Pages and partial pages now in the buffer.
    pub fn buffered_pages(&self) -> (u64, u64) {
        (self.buffer.pages(), self.buffer.partial_pages())
    }

    /// The raw 32-bit mapping entry of a logical page (PPN in the low bits, PT/F above).
    pub fn mapping_entry(&self, lpn: u32) -> u32 {
        self.ftl.map.entry(lpn)
    }

    /// Versions of a logical page on flash, newest first.
    pub fn versions(&self, lpn: u32) -> Vec<u32> {
        self.ftl.map.versions(lpn)
    }

    pub fn report(&self) -> WaflashReport {
        let c = self.nand.counters();
        let d = &self.stats;
        WaflashReport {
            device: *d,
            ftl: self.ftl.stats,
            flash_reads: c.reads.iter().sum(),
            flash_programs: c.programs.iter().sum(),
            flash_erases: c.erases.iter().sum(),
            buffer_partial_fraction_mean: if d.eviction_decisions == 0 {
                0.0
            } else {
                d.partial_fraction_sum / d.eviction_decisions as f64
            },
            compaction_space_overhead: self.ftl.compaction_space_overhead(),
            multi_version_pages: self.ftl.multi_version_pages() as u64,
            mapping_direct_entries: self.ftl.map.direct_entries,
            mapping_indirect_entries: self.ftl.map.indirect_entries,
            mapping_ppn_bits: self.ftl.map.ppn_bits(),
            mapping_ptf_bits: self.ftl.map.ptf_bits(),
        }
    }

    /// Zeroes every counter (after preconditioning).
    pub fn reset_counters(&mut self) {
        self.stats = DeviceStats::default();
        self.ftl.stats = FtlStats::default();
        self.nand.reset_counters();
    }

    /// Checks the FTL's invariants (tests).
    pub fn check_invariants(&self) {
        self.ftl.check_invariants();
    }

    /// Writes sectors `0..sectors` (rounded up to whole pages) with their preconditioning
    /// content, `sector_token(lba, 0)`, straight to flash without timing, as a file system's
    /// preallocated files would be. The host's oracle expects exactly that content.
    pub fn precondition(&mut self, sectors: u64) -> Result<(), WaflashError> {
        let pages = sectors.div_ceil(self.spp as u64);
        if pages > self.config.logical_pages() as u64 {
            return Err(WaflashError::Config(format!(
                "preconditioning {sectors} sectors exceeds the device's {} sectors",
                self.info.capacity_sectors
            )));
        }
        let u = self.unit;
        let mut image = vec![0u8; self.spp as usize * u];
        for lpn in 0..pages as u32 {
            if u > 0 {
                for s in 0..self.spp as usize {
                    let lba = lpn as u64 * self.spp as u64 + s as u64;
                    let token = if lba < sectors {
                        sector_token(lba, 0)
                    } else {
                        0
                    };
                    fill_unit(token, &mut image[s * u..(s + 1) * u]);
                }
            }
            self.ftl
                .fill_untimed(&mut self.nand, lpn, self.ftl.full_mask(), &image)?;
        }
        Ok(())
    }

    /// Writes, straight to flash and without timing, sectors `mask` of each listed logical
    /// page with their preconditioning content `sector_token(lba, 0)`, leaving the other
    /// sectors unwritten: the data a traced volume is known to hold before the trace begins.
    pub fn precondition_sectors(&mut self, pages: &[(u32, u64)]) -> Result<(), WaflashError> {
        let u = self.unit;
        let mut image = vec![0u8; self.spp as usize * u];
        for &(lpn, mask) in pages {
            if lpn >= self.config.logical_pages() || mask == 0 || mask & !self.ftl.full_mask() != 0
            {
                return Err(WaflashError::Config(format!(
                    "cannot precondition sectors {mask:#x} of logical page {lpn}"
                )));
            }
            if u > 0 {
                for s in 0..self.spp as usize {
                    let lba = lpn as u64 * self.spp as u64 + s as u64;
                    let token = if mask >> s & 1 == 1 {
                        sector_token(lba, 0)
                    } else {
                        0
                    };
                    fill_unit(token, &mut image[s * u..(s + 1) * u]);
                }
            }
            self.ftl.fill_untimed(&mut self.nand, lpn, mask, &image)?;
        }
        Ok(())
    }

    fn host_to_device(&mut self, ready_ns: TimeNs, bytes: u64) -> TimeNs {
        let start = ready_ns.max(self.h2d_free_ns);
        self.h2d_free_ns = start + transfer_ns(bytes, self.config.host.bandwidth_mb_s);
        self.h2d_free_ns
    }

    fn device_to_host(&mut self, ready_ns: TimeNs, bytes: u64) -> TimeNs {
        let start = ready_ns.max(self.d2h_free_ns);
        self.d2h_free_ns = start + transfer_ns(bytes, self.config.host.bandwidth_mb_s);
        self.d2h_free_ns
    }

    fn dram_ns(&self, bytes: u64) -> u64 {
        transfer_ns(bytes, self.config.host.dram_mb_s)
    }

    fn die_busy(&self, die: u32, now_ns: TimeNs) -> bool {
        self.nand.die_free_ns(die) > now_ns
    }

    /// Whether the target chips of a buffered page are busy at `now_ns` (PC-LRU's test):
    /// the die its program goes to (`write_die`, the allocator's next die, for every page)
    /// and, for a partial page whose old data it does not cover, the die of its old
    /// version: its read-modify-write read on the RMW FTL. Under MV-FTL a partial page is
    /// still costlier than a full one (a second version to read and merge later, or a
    /// compacted piece to read and rewrite), and §V-B finds PC-LRU keeping more partial
    /// pages in the buffer with MV-FTL, so the old version's die counts there too.
    fn target_busy(&self, lpn: u32, mask: u64, write_die: u32, now_ns: TimeNs) -> bool {
        self.die_busy(write_die, now_ns)
            || (mask != self.ftl.full_mask()
                && self.ftl.holds_sectors_outside(lpn, mask)
                && self
                    .ftl
                    .read_die(lpn)
                    .is_some_and(|d| self.die_busy(d, now_ns)))
    }

    /// Counts one eviction decision and samples the partial fraction of the buffer for it.
    fn count_eviction_decision(&mut self) {
        let pages = self.buffer.pages();
        self.stats.eviction_decisions += 1;
        if pages > 0 {
            self.stats.partial_fraction_sum += self.buffer.partial_pages() as f64 / pages as f64;
        }
    }

    /// Issues the drained requests whose turn has come by `now_ns`, each at the time the
    /// previous one's flash operations ended. Called before every command and at idle time,
    /// so a request is booked before any command submitted after its turn and after every
    /// command submitted before it, as VSSIM's I/O thread would issue it; host reads that
    /// arrive between two drained requests find the dies free between them.
    fn advance_drain(&mut self, now_ns: TimeNs) -> Result<(), DeviceError> {
        while self.buffer.draining() && self.drain_next_ns <= now_ns {
            let at = self.drain_next_ns;
            let Some(lpns) = self.buffer.pop_draining() else {
                break;
            };
            self.count_eviction_decision();
            self.stats.drain_requests += 1;
            if at > self.present_ns {
                self.stats.drain_requests_ahead += 1;
                self.stats.drain_lead_ns_sum += at - self.present_ns;
            }
            let done = self.destage(&lpns, at)?;
            self.drain_next_ns = done.max(at);
        }
        Ok(())
    }

    /// Picks the pages to destage next under the buffer policy.
    fn choose_victims(&mut self, now_ns: TimeNs) -> Vec<u32> {
        self.count_eviction_decision();
        let window = self.config.scan_window_pages as usize;
        let Some((bottom, bottom_mask)) = self.buffer.bottom_up().next() else {
            return Vec::new();
        };
        let victim = match self.config.buffer_policy {
            BufferPolicy::Fifo => {
                return self.buffer.pop_request().unwrap_or_else(|| vec![bottom]);
            }
            BufferPolicy::Lru => bottom,
            BufferPolicy::Mca => {
                // Pass over partial pages whose read-modify-write read would wait on a busy
                // chip; take the first page nearer the top that would not.
                let pick = self
                    .buffer
                    .bottom_up()
                    .take(window)
                    .find(|&(lpn, mask)| {
                        !(self.ftl.needs_read(lpn, mask)
                            && self
                                .ftl
                                .read_die(lpn)
                                .is_some_and(|d| self.die_busy(d, now_ns)))
                    })
                    .map(|(lpn, _)| lpn);
                pick.unwrap_or(bottom)
            }
            BufferPolicy::PcLru => {
                let write_die = self.ftl.next_write_die(&self.nand, now_ns);
                if !self.target_busy(bottom, bottom_mask, write_die, now_ns) {
                    // Idle chips: the bottom page, as LRU.
                    bottom
                } else if let Some(lpn) = self.buffer.bottom_full() {
                    // Congestion: "the full page closest to the bottom of L" leaves, however
                    // far up it is (the paper sets no window; MCA's window does not apply),
                    // and partial pages stay to be filled up by later writes.
                    lpn
                } else if self.die_busy(write_die, now_ns) {
                    // Every page's program would go to the busy die, so no page has idle
                    // target chips: the bottom page, as the search below would find.
                    bottom
                } else {
                    // Congestion and no full page in the buffer, a case §III-A leaves open.
                    // The rule's aim, no partial page written onto a congested chip, still
                    // applies: the page nearest the bottom whose target chips are idle
                    // leaves, and the bottom page only when every page's chips are busy.
                    self.buffer
                        .bottom_up()
                        .find(|&(lpn, mask)| !self.target_busy(lpn, mask, write_die, now_ns))
                        .map_or(bottom, |(lpn, _)| lpn)
                }
            }
        };
        if victim != bottom {
            self.stats.bottom_passed_over += 1;
        }
        let mut victims = vec![victim];
        let mask = self.buffer.mask(victim);
        if self.ftl.compaction() && self.ftl.is_small(mask) {
            // Destage a batch: other small partial pages of the same region fill the rest of
            // the compacted page.
            let region = self.config.region_pages;
            let start = victim / region * region;
            let end = (start + region).min(self.config.logical_pages());
            let mut used = mask.count_ones();
            for lpn in start..end {
                if used >= self.spp {
                    break;
                }
                let m = self.buffer.mask(lpn);
                if lpn == victim || m == 0 || !self.ftl.is_small(m) {
                    continue;
                }
                if used + m.count_ones() <= self.spp {
                    used += m.count_ones();
                    victims.push(lpn);
                }
            }
        }
        victims
    }

    /// Hands pages to the FTL at `now_ns`; their buffer space is held until programmed.
    /// Returns when the last of their programs ends.
    fn destage(&mut self, lpns: &[u32], now_ns: TimeNs) -> Result<TimeNs, DeviceError> {
        let full = self.ftl.full_mask();
        let mut small = Vec::new();
        let mut last_ns = now_ns;
        for &lpn in lpns {
            let (mask, image) = self.buffer.take(lpn);
            if mask == full {
                self.stats.evicted_full_pages += 1;
            } else {
                self.stats.evicted_partial_pages += 1;
            }
            if self.ftl.compaction() && self.ftl.is_small(mask) {
                small.push((lpn, mask, image));
                continue;
            }
            match self.ftl.write(&mut self.nand, lpn, mask, &image, now_ns) {
                Ok(done) => {
                    self.buffer.hold(done, mask.count_ones() as u64);
                    last_ns = last_ns.max(done);
                }
                Err(e) => {
                    small.push((lpn, mask, image));
                    self.give_back(&small);
                    return Err(e);
                }
            }
        }
        if !small.is_empty() {
            // Pieces of one region next to each other, so they share compacted pages.
            small.sort_by_key(|(lpn, _, _)| *lpn);
            let sectors: u64 = small.iter().map(|(_, m, _)| m.count_ones() as u64).sum();
            match self.ftl.write_compacted(&mut self.nand, &small, now_ns) {
                Ok(done) => {
                    self.buffer.hold(done, sectors);
                    last_ns = last_ns.max(done);
                }
                Err(e) => {
                    self.give_back(&small);
                    return Err(e);
                }
            }
        }
        Ok(last_ns)
    }

    /// Puts pages a failed destage took back into the buffer. The FTL refused them (no
    /// block left to write them to, or the power is gone); they were acknowledged, so they
    /// stay readable from the buffer while the device refuses writes. A page some of whose
    /// data did reach flash before the failure is written again later, as a newer version.
    fn give_back(&mut self, pages: &[(u32, u64, Vec<u8>)]) {
        let u = self.unit;
        for (lpn, mask, image) in pages {
            for s in (0..self.spp as usize).filter(|&s| mask >> s & 1 == 1) {
                self.buffer.put(*lpn, s, 1, &image[s * u..(s + 1) * u]);
            }
        }
    }

    /// Whether the buffer destages by VSSIM's drain of every buffered request.
    fn whole_drain(&self) -> bool {
        self.config.buffer_policy == BufferPolicy::Fifo
            && self.config.fifo_drain == FifoDrain::Whole
    }

    /// One step of a write's wait for buffer space under VSSIM's drain, from `t` (when the
    /// write does not fit): starts a drain of every buffered request if none is under way
    /// and space must be freed, otherwise moves to the next time space is released or the
    /// drain issues its next request. Returns the new time of the wait.
    fn wait_for_drain(&mut self, t: TimeNs, need: u64) -> Result<TimeNs, DeviceError> {
        if !self.buffer.draining() && self.buffer.must_evict(need) {
            self.buffer.start_drain();
            if !self.buffer.draining() {
                // Dirty pages that no request recorded (none are written that way, but the
                // wait must not depend on it): destage the bottom one as FIFO would.
                let victims = self.choose_victims(t);
                self.destage(&victims, t)?;
                return Ok(t);
            }
            // Drained requests follow each other, also across drains: the first one starts
            // when the previous drain's last request has ended.
            self.drain_next_ns = self.drain_next_ns.max(t);
            self.advance_drain(t)?;
            return Ok(t);
        }
        let next_step_ns = self.buffer.draining().then_some(self.drain_next_ns);
        match (self.buffer.next_release(), next_step_ns) {
            // Released space first: the write may fit before the drain issues more.
            (Some(release_ns), step) if step.is_none_or(|s| release_ns <= s) => {
                Ok(t.max(release_ns))
            }
            (_, Some(step_ns)) => {
                let t = t.max(step_ns);
                self.advance_drain(t)?;
                Ok(t)
            }
            _ => Err(DeviceError::Unsupported(format!(
                "a write of {need} new sectors does not fit in the write buffer"
            ))),
        }
    }

    /// Puts the spans of one write into the buffer, destaging (and waiting for space) first.
    /// Returns when the data is in the buffer.
    fn admit(
        &mut self,
        spans: &[Span],
        data: &[u8],
        arrived_ns: TimeNs,
    ) -> Result<TimeNs, DeviceError> {
        // The write is at the controller from its arrival on: drained requests issued then
        // are issued on time, later ones (while it waits) ahead of the present.
        self.present_ns = arrived_ns;
        let mut t = arrived_ns;
        loop {
            let need: u64 = spans
                .iter()
                .map(|s| (s.mask() & !self.buffer.mask(s.lpn)).count_ones() as u64)
                .sum();
            if self.buffer.fits(t, need) {
                break;
            }
            if self.whole_drain() {
                t = self.wait_for_drain(t, need)?;
                continue;
            }
            if self.buffer.must_evict(need) {
                let victims = self.choose_victims(t);
                self.destage(&victims, t)?;
                continue;
            }
            match self.buffer.next_release() {
                Some(r) => t = t.max(r),
                None => {
                    return Err(DeviceError::Unsupported(format!(
                        "a write of {need} new sectors does not fit in the write buffer"
                    )))
                }
            }
        }
        let u = self.unit;
        for s in spans {
            if self.buffer.mask(s.lpn) != 0 {
                self.stats.buffer_write_hits += 1;
            }
            let units = &data[s.at as usize * u..(s.at + s.count) as usize * u];
            self.buffer
                .put(s.lpn, s.first as usize, s.count as usize, units);
        }
        self.buffer
            .record_request(spans.iter().map(|s| s.lpn).collect());
        Ok(t)
    }

    fn write(&mut self, now_ns: TimeNs, cmd: &Command<'_>) -> Result<TimeNs, DeviceError> {
        let bytes = cmd.sectors as u64 * self.info.sector_bytes as u64;
        let arrived = self.host_to_device(now_ns + self.config.host.command_overhead_ns, bytes);
        let spp = self.spp as u64;
        self.stats.write_commands += 1;
        if cmd.lba % spp != 0 || (cmd.lba + cmd.sectors as u64) % spp != 0 {
            self.stats.unaligned_writes += 1;
        }
        let spans = spans(cmd.lba, cmd.sectors, self.spp);
        self.stats.host_page_writes += spans.len() as u64;
        let t = self.admit(&spans, cmd.data, arrived)?;
        let mut done = t + self.dram_ns(bytes);
        if cmd.flags.fua {
            let lpns: Vec<u32> = spans.iter().map(|s| s.lpn).collect();
            self.destage(&lpns, t)?;
            self.commit_image()?;
            done = done.max(self.buffer.drained_at());
        }
        Ok(done)
    }

    fn read(
        &mut self,
        now_ns: TimeNs,
        cmd: &Command<'_>,
        out: ReadBuffers<'_>,
    ) -> Result<TimeNs, DeviceError> {
        let start = now_ns + self.config.host.command_overhead_ns;
        let u = self.unit;
        let sector_bytes = self.info.sector_bytes as u64;
        let mut ready = start;
        let mut flash_pages = 0;
        let mut image = vec![0u8; self.spp as usize * u];
        for s in spans(cmd.lba, cmd.sectors, self.spp) {
            let present = self.buffer.mask(s.lpn) & s.mask();
            let need = s.mask() & !present;
            if need != 0 {
                let (t, reads) = self
                    .ftl
                    .read(&mut self.nand, s.lpn, need, start, &mut image);
                ready = ready.max(t);
                flash_pages += reads;
            } else {
                self.stats.buffer_read_hits += 1;
            }
            if present != 0 {
                self.buffer.touch(s.lpn);
                ready = ready.max(start + self.dram_ns(present.count_ones() as u64 * sector_bytes));
            }
            if u > 0 {
                for i in 0..s.count as usize {
                    let sector = s.first as usize + i;
                    let dst = &mut out.data[(s.at as usize + i) * u..(s.at as usize + i + 1) * u];
                    if present >> sector & 1 == 1 {
                        dst.copy_from_slice(self.buffer.sector(s.lpn, sector));
                    } else {
                        dst.copy_from_slice(&image[sector * u..(sector + 1) * u]);
                    }
                }
            }
        }
        if let Some(tags) = out.tags {
            tags.fill(0);
        }
        if self.read_faults.read_fails(flash_pages) {
            // The ECC could not correct a page this time; the data stays as it was, so a
            // retry may succeed.
            self.stats.uncorrectable_reads += 1;
            return Err(DeviceError::Uncorrectable {
                lba: cmd.lba,
                sectors: cmd.sectors,
            });
        }
        Ok(self.device_to_host(ready, cmd.sectors as u64 * sector_bytes))
    }

    fn trim(&mut self, now_ns: TimeNs, cmd: &Command<'_>) -> Result<TimeNs, DeviceError> {
        let start = now_ns + self.config.host.command_overhead_ns;
        let mut done = start;
        let zeros = vec![0u8; self.spp as usize * self.unit];
        for s in spans(cmd.lba, cmd.sectors, self.spp) {
            self.buffer.discard(s.lpn, s.mask());
            if s.count == self.spp {
                self.ftl.unmap(s.lpn);
            } else if self.ftl_has_data(s.lpn) {
                // A partial trim writes zeroes, so every trimmed sector reads back as zero.
                let sub = Span { at: 0, ..s };
                let t = self.admit(&[sub], &zeros[..s.count as usize * self.unit], start)?;
                done = done.max(t);
            }
        }
        Ok(done)
    }

    fn ftl_has_data(&self, lpn: u32) -> bool {
        self.ftl.map.newest(lpn).is_some() || self.buffer.mask(lpn) != 0
    }

    fn flush(&mut self, now_ns: TimeNs) -> Result<TimeNs, DeviceError> {
        let start = now_ns + self.config.host.command_overhead_ns;
        let all: Vec<u32> = self.buffer.bottom_up().map(|(lpn, _)| lpn).collect();
        self.destage(&all, start)?;
        self.commit_image()?;
        self.buffer.clear_requests();
        Ok(self.buffer.drained_at().max(start))
    }
}

impl BlockDevice for WaflashSsd {
    fn info(&self) -> DeviceInfo {
        self.info
    }

    fn media_faults(&self) -> afa_nand::MediaFaults {
        self.nand.media_faults()
    }

    fn submit(
        &mut self,
        now_ns: TimeNs,
        cmd: &Command<'_>,
        out: ReadBuffers<'_>,
    ) -> Result<Completion, DeviceError> {
        if self.ftl.power_lost() {
            return Err(DeviceError::Failed);
        }
        validate_command(&self.info, cmd, &out)?;
        if cmd.tags.is_some_and(|t| !t.is_empty()) {
            return Err(DeviceError::Unsupported(
                "the WAFLASH SSD keeps no host tags".into(),
            ));
        }
        self.stats.commands += 1;
        // The drain's requests whose turn came before this command go first.
        self.present_ns = now_ns;
        self.advance_drain(now_ns)?;
        let done_ns = match cmd.opcode {
            Opcode::Read => self.read(now_ns, cmd, out)?,
            Opcode::Write => self.write(now_ns, cmd)?,
            Opcode::Trim => self.trim(now_ns, cmd)?,
            Opcode::Flush => self.flush(now_ns)?,
        };
        self.last_done_ns = self.last_done_ns.max(done_ns);
        Ok(Completion {
            done_ns,
            gc_active: false,
        })
    }

    /// A sector is data when the write buffer holds it or a version of its logical page on
    /// flash (a whole page, a partial version or a compacted piece) covers it; the read
    /// path fills every other sector with zeroes, so those are holes. A partial trim writes
    /// zeroes, which stay data.
    fn allocation(&self, lba: u64, sectors: u32) -> Option<Vec<(u32, bool)>> {
        let end = lba.checked_add(sectors as u64)?;
        if end > self.info.capacity_sectors || self.ftl.power_lost() {
            return None;
        }
        let mut runs = Vec::new();
        for s in spans(lba, sectors, self.spp) {
            let held = self.buffer.mask(s.lpn) | self.ftl.sectors_on_flash(s.lpn);
            for sector in s.first..s.first + s.count {
                afa_ssd::push_allocation_run(&mut runs, 1, held >> sector & 1 == 1);
            }
        }
        Some(runs)
    }

    fn background(&mut self, now_ns: TimeNs) -> Option<TimeNs> {
        // A drain goes on while the host is idle: its next request is issued on time, so the
        // device asks to be called then. A failure means the device is out of space; the
        // next foreground write reports it, so idle work just stops.
        self.present_ns = now_ns;
        if self.ftl.power_lost() || self.advance_drain(now_ns).is_err() {
            return None;
        }
        let next_step_ns = self.buffer.draining().then_some(self.drain_next_ns);
        // Idle time merges versions (§III-B), once the host has been quiet for the idle
        // timer: merging in every short gap between commands puts a merge's program in front
        // of the next command.
        let idle_at_ns = self.last_done_ns + self.config.idle_merge_after_ns;
        let merge_ns = if !self.ftl.has_versions_to_merge() {
            None
        } else if now_ns < idle_at_ns {
            Some(idle_at_ns)
        } else {
            self.ftl
                .idle_merge(&mut self.nand, now_ns, self.config.idle_merge_batch)
                .ok()
                .flatten()
        };
        match (merge_ns, next_step_ns) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn take_host_work(&mut self) -> HostWork {
        let commands = self.stats.commands - self.commands_taken;
        self.commands_taken = self.stats.commands;
        HostWork {
            member_commands: commands,
            ..HostWork::default()
        }
    }
}
