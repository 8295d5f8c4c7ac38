//! The controller proper: command parsing, host-interface timing, the write buffer and the
//! FTL wired together.

use std::collections::BTreeMap;

use afa_nand::{HostReadFaults, MediaFaults, Nand, NandCounters, PayloadMode};
use afa_sim::{transfer_ns, Calendar, TimeNs};

use crate::buffer::WriteBuffer;
use crate::config::{Duplex, SsdConfig};
use crate::device::{
    push_allocation_run, validate_command, validate_convert, BlockDevice, Command, Completion,
    ConvertCommand, DeviceError, DeviceInfo, HostWork, Opcode, ReadBuffers,
};
use crate::ftl::{Ftl, FtlStats, NONE};
use crate::SsdError;

/// Controller-level counters beyond the FTL's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SsdStats {
    pub commands: u64,
    /// Logical pages touched by host write commands (a partial page counts as one): the
    /// denominator of write amplification, counted before the write buffer.
    pub host_page_writes: u64,
    pub buffer_read_hits: u64,
    pub buffer_write_hits: u64,
    pub buffer_evictions: u64,
    /// ScalaAFA `convert` commands served by the in-SSD parity engine.
    pub convert_commands: u64,
    /// Host reads failed as uncorrectable (`faults.read_fail_probability`).
    pub uncorrectable_reads: u64,
}

/// One emulated SSD.
#[derive(Debug)]
pub struct Ssd {
    config: SsdConfig,
    nand: Nand,
    ftl: Ftl,
    buffer: Option<WriteBuffer>,
    /// Dirty pages above which arriving writes start programming the coldest ones
    /// (`write_buffer.destage_fraction` of its capacity), and how many programs of
    /// theirs may be in flight at once (one per plane).
    destage_above_pages: usize,
    destage_in_flight_max: usize,
    info: DeviceInfo,
    sectors_per_page: u32,
    full_mask: u64,
    unit_bytes: usize,
    tag_bytes: usize,
    h2d_free_ns: TimeNs,
    d2h_free_ns: TimeNs,
    /// The one link of a half-duplex interface, booked by both directions. Read data is
    /// booked when its flash reads end, often after writes submitted later are ready to
    /// cross, so the link keeps its booked intervals and a transfer takes an idle gap that
    /// holds it (as the dies do).
    half_duplex_link: Calendar,
    stats: SsdStats,
    /// `stats.commands` at the last `take_host_work`.
    commands_taken: u64,
    /// When the last host command given to the device completes: from then on the host has
    /// nothing in flight, which idle-time work (`gc.idle_erase`) waits for.
    host_done_ns: TimeNs,
    /// The uncorrectable host reads of `faults.read_fail_probability`.
    read_faults: HostReadFaults,
    /// Sectors trimmed by sub-page trims, by logical page, for pages that still hold data
    /// (mapped or buffered). A trim of sectors already recorded here costs nothing, and the
    /// trim that completes a page drops the page instead of writing zeroes. Entries exist
    /// only after sub-page trims of written pages, so ordinary runs never touch the map.
    trimmed_sectors: BTreeMap<u32, u64>,
}

/// The sectors of one logical page that a command touches.
#[derive(Debug, Clone, Copy)]
struct PageSpan {
    lpn: u32,
    /// First sector within the page.
    first: u32,
    count: u32,
    /// Offset in sectors of this span within the command.
    cmd_offset: u32,
}

impl PageSpan {
    #[inline]
    fn mask(&self) -> u64 {
        let ones = if self.count >= 64 {
            u64::MAX
        } else {
            (1u64 << self.count) - 1
        };
        ones << self.first
    }
}

#[inline]
fn spans(lba: u64, sectors: u32, spp: u32) -> impl Iterator<Item = PageSpan> {
    let end = lba + sectors as u64;
    let mut at = lba;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let lpn = (at / spp as u64) as u32;
        let first = (at % spp as u64) as u32;
        let count = (spp - first).min((end - at) as u32);
        let span = PageSpan {
            lpn,
            first,
            count,
            cmd_offset: (at - lba) as u32,
        };
        at += count as u64;
        Some(span)
    })
}

impl Ssd {
    pub fn new(config: SsdConfig, seed: u64) -> Result<Self, SsdError> {
        config.validate()?;
        let mut nand = Nand::new(
            config.geometry.clone(),
            config.timing.clone(),
            config.cell_mode,
            config.payload,
            config.faults.clone(),
            seed,
        )?;
        let ftl = Ftl::new(&config, &mut nand)?;
        let g = &config.geometry;
        let spp = g.sectors_per_page();
        let unit_bytes = nand.store().unit_bytes();
        let tag_bytes = nand.store().tag_bytes_per_sector();
        // A buffer larger than the device could never fill, and its slots are allocated up
        // front: a mistyped size must be an error, not an allocation that aborts.
        let logical_bytes = ftl.logical_pages() as u64 * g.page_bytes as u64;
        if config.write_buffer.capacity_bytes > logical_bytes {
            return Err(SsdError::Config(format!(
                "write_buffer.capacity_bytes = {} is larger than the device's {logical_bytes} \
                 logical bytes",
                config.write_buffer.capacity_bytes
            )));
        }
        let destage = config.write_buffer.destage_fraction;
        if !(0.0..=1.0).contains(&destage) {
            return Err(SsdError::Config(format!(
                "write_buffer.destage_fraction = {destage} must be between 0 and 1"
            )));
        }
        let buffer_pages = (config.write_buffer.capacity_bytes / g.page_bytes as u64) as usize;
        let destage_above_pages = (buffer_pages as f64 * destage).floor() as usize;
        let destage_in_flight_max =
            (g.channels * g.chips_per_channel * g.dies_per_chip * g.planes_per_die) as usize;
        let buffer = (config.write_buffer.capacity_bytes > 0).then(|| {
            WriteBuffer::new(
                buffer_pages,
                config.write_buffer.policy,
                ftl.logical_pages(),
                unit_bytes * spp as usize,
                tag_bytes * spp as usize,
            )
        });
        let info = DeviceInfo {
            sector_bytes: g.sector_bytes,
            capacity_sectors: ftl.logical_pages() as u64 * spp as u64,
            payload_unit_bytes: unit_bytes as u32,
            tag_bytes_per_sector: tag_bytes as u32,
            max_queue_depth: config.host.queue_depth,
            max_transfer_sectors: config.host.max_transfer_sectors,
        };
        let read_faults = HostReadFaults::new(&config.faults, seed);
        Ok(Self {
            full_mask: if spp == 64 {
                u64::MAX
            } else {
                (1u64 << spp) - 1
            },
            sectors_per_page: spp,
            unit_bytes,
            tag_bytes,
            config,
            nand,
            ftl,
            buffer,
            destage_above_pages,
            destage_in_flight_max,
            info,
            h2d_free_ns: 0,
            d2h_free_ns: 0,
            half_duplex_link: Calendar::default(),
            stats: SsdStats::default(),
            commands_taken: 0,
            host_done_ns: 0,
            read_faults,
            trimmed_sectors: BTreeMap::new(),
        })
    }

    pub fn config(&self) -> &SsdConfig {
        &self.config
    }
    pub fn nand(&self) -> &Nand {
        &self.nand
    }
    pub fn nand_counters(&self) -> &NandCounters {
        self.nand.counters()
    }
    pub fn ftl_stats(&self) -> &FtlStats {
        &self.ftl.stats
    }
    pub fn stats(&self) -> &SsdStats {
        &self.stats
    }
    pub fn payload_mode(&self) -> PayloadMode {
        self.config.payload
    }
    pub fn logical_pages(&self) -> u32 {
        self.ftl.logical_pages()
    }
    /// Blocks set aside as the SLC cache (0 without one).
    pub fn slc_blocks(&self) -> u64 {
        self.ftl.slc_blocks()
    }

    /// Pages programmed into dense (MLC/TLC) blocks so far: host writes that bypassed the
    /// SLC cache, SLC evictions and GC moves. ScalaAFA Figure 16 counts these.
    pub fn dense_page_programs(&self) -> u64 {
        let c = self.nand.counters();
        c.programs[afa_nand::CellMode::Mlc.index()] + c.programs[afa_nand::CellMode::Tlc.index()]
    }

    /// NAND page programs per host page write so far.
    pub fn write_amplification(&self) -> f64 {
        let host = self.stats.host_page_writes;
        if host == 0 {
            return 0.0;
        }
        self.nand.counters().programs.iter().sum::<u64>() as f64 / host as f64
    }

    /// Forgets every counter (after preconditioning, so that measurements start clean).
    pub fn reset_counters(&mut self) {
        self.ftl.stats = FtlStats::default();
        self.stats = SsdStats::default();
        self.nand.reset_counters();
    }

    pub(crate) fn parts(&mut self) -> (&mut Nand, &mut Ftl, u32, usize) {
        (
            &mut self.nand,
            &mut self.ftl,
            self.sectors_per_page,
            self.unit_bytes,
        )
    }

    /// Forgets the sub-page trims of pages `0..lpn_end`, which preconditioning has just
    /// written whole.
    pub(crate) fn forget_trimmed_below(&mut self, lpn_end: u32) {
        self.trimmed_sectors.retain(|&lpn, _| lpn >= lpn_end);
    }

    /// Checks the FTL's structural invariants (tests).
    pub fn check_invariants(&self) {
        self.ftl.check_invariants(&self.nand);
    }

    /// A block the FTL could still clean with the room of all its planes (see
    /// `Ftl::reclaimable_block`), as (plane, block).
    #[cfg(test)]
    pub(crate) fn reclaimable_block(&self) -> Option<(u32, u32)> {
        self.ftl.reclaimable_block()
    }

    #[inline]
    fn host_to_device(&mut self, ready_ns: TimeNs, bytes: u64) -> TimeNs {
        let duration_ns = transfer_ns(bytes, self.config.host.bandwidth_mb_s);
        if self.config.host.duplex == Duplex::Half {
            return self.half_duplex_link.book(ready_ns, duration_ns);
        }
        let start = ready_ns.max(self.h2d_free_ns);
        self.h2d_free_ns = start + duration_ns;
        self.h2d_free_ns
    }

    #[inline]
    fn device_to_host(&mut self, ready_ns: TimeNs, bytes: u64) -> TimeNs {
        let duration_ns = transfer_ns(bytes, self.config.host.bandwidth_mb_s);
        if self.config.host.duplex == Duplex::Half {
            return self.half_duplex_link.book(ready_ns, duration_ns);
        }
        let start = ready_ns.max(self.d2h_free_ns);
        self.d2h_free_ns = start + duration_ns;
        self.d2h_free_ns
    }

    #[inline]
    fn dram_ns(&self, bytes: u64) -> u64 {
        transfer_ns(bytes, self.config.host.dram_mb_s)
    }

    fn write(&mut self, now_ns: TimeNs, cmd: &Command<'_>) -> Result<TimeNs, DeviceError> {
        let bytes = cmd.sectors as u64 * self.info.sector_bytes as u64;
        let arrived = self.host_to_device(now_ns + self.config.host.command_overhead_ns, bytes);
        self.write_arrived(arrived, cmd)
    }

    /// Writes a command whose data is in the controller at `arrived` (from the host link,
    /// or from the conversion engine).
    fn write_arrived(&mut self, arrived: TimeNs, cmd: &Command<'_>) -> Result<TimeNs, DeviceError> {
        let mut done = arrived;
        let spp = self.sectors_per_page;
        for span in spans(cmd.lba, cmd.sectors, spp) {
            self.forget_trimmed(span.lpn, span.mask());
            let page_done = if self.buffer.is_some() {
                self.buffer_write(span, cmd, arrived)?
            } else {
                self.direct_write(span, cmd, arrived)?
            };
            done = done.max(page_done);
        }
        if self.buffer.is_some() {
            self.destage(arrived)?;
        }
        if cmd.flags.fua && self.buffer.is_some() {
            for span in spans(cmd.lba, cmd.sectors, spp) {
                let buffer = self.buffer.as_ref().expect("buffer checked above");
                if let Some(slot) = buffer.lookup(span.lpn) {
                    done = done.max(self.evict_slot(slot, arrived)?);
                }
            }
        }
        Ok(done)
    }

    /// Writes one page's span straight to flash (no write buffer).
    fn direct_write(
        &mut self,
        span: PageSpan,
        cmd: &Command<'_>,
        ready_ns: TimeNs,
    ) -> Result<TimeNs, DeviceError> {
        let unit = self.unit_bytes;
        let tag = self.tag_bytes;
        let full = span.count == self.sectors_per_page;
        let src_units = &cmd.data[span.cmd_offset as usize * unit..][..span.count as usize * unit];
        let src_tags = cmd
            .tags
            .map(|t| &t[span.cmd_offset as usize * tag..][..span.count as usize * tag]);
        let mut fill = |nand: &mut Nand, ppn: u32, old: u32| {
            store_span(
                nand, ppn, old, full, span.first, src_units, src_tags, unit, tag,
            );
        };
        self.ftl.write_page(
            &mut self.nand,
            span.lpn,
            full,
            ready_ns,
            cmd.flags.transient,
            &mut fill,
        )
    }

    /// Puts one page's span into the write buffer, evicting first if it is full.
    fn buffer_write(
        &mut self,
        span: PageSpan,
        cmd: &Command<'_>,
        ready_ns: TimeNs,
    ) -> Result<TimeNs, DeviceError> {
        let unit = self.unit_bytes;
        let tag = self.tag_bytes;
        let buffer = self
            .buffer
            .as_mut()
            .expect("buffered write without a buffer");
        let (slot, slot_ready) = match buffer.lookup(span.lpn) {
            Some(slot) => {
                self.stats.buffer_write_hits += 1;
                buffer.touch(slot);
                (slot, ready_ns)
            }
            None => {
                if buffer.is_full(ready_ns) {
                    if let Some(victim) = buffer.eviction_candidate() {
                        self.evict_slot(victim, ready_ns)?;
                    }
                }
                let buffer = self.buffer.as_mut().expect("buffer exists");
                buffer.insert(span.lpn, ready_ns)
            }
        };
        let buffer = self.buffer.as_mut().expect("buffer exists");
        let off = span.cmd_offset as usize;
        let n = span.count as usize;
        let first = span.first as usize;
        if unit > 0 {
            buffer.slot_data_mut(slot)[first * unit..(first + n) * unit]
                .copy_from_slice(&cmd.data[off * unit..(off + n) * unit]);
        }
        if tag > 0 && (cmd.tags.is_some() || buffer.has_tags()) {
            let dst = &mut buffer.slot_tags_mut(slot)[first * tag..(first + n) * tag];
            match cmd.tags {
                Some(t) => dst.copy_from_slice(&t[off * tag..(off + n) * tag]),
                None => dst.fill(0),
            }
        }
        buffer.mark(slot, span.mask(), cmd.flags.transient);
        let copy = self.dram_ns(n as u64 * self.info.sector_bytes as u64);
        Ok(slot_ready + copy)
    }

    /// Write-behind: while more pages are dirty than `destage_above_pages`, programs the
    /// coldest ones from `now_ns`, keeping at most one program per plane in flight. A real
    /// controller does not wait for its buffer to fill before it programs; without this, a
    /// full buffer made every write wait for a whole program even at queue depth 1, with the
    /// flash idle between writes.
    fn destage(&mut self, now_ns: TimeNs) -> Result<(), DeviceError> {
        loop {
            let buffer = self.buffer.as_mut().expect("destage without a buffer");
            if buffer.dirty_pages() <= self.destage_above_pages
                || buffer.programs_in_flight(now_ns) >= self.destage_in_flight_max
            {
                return Ok(());
            }
            let Some(victim) = buffer.eviction_candidate() else {
                return Ok(());
            };
            self.evict_slot(victim, now_ns)?;
        }
    }

    /// Programs a buffered page to flash, starting at `now_ns`; returns when the program ends.
    fn evict_slot(&mut self, slot: u32, now_ns: TimeNs) -> Result<TimeNs, DeviceError> {
        let unit = self.unit_bytes;
        let tag = self.tag_bytes;
        let full_mask = self.full_mask;
        let buffer = self.buffer.as_mut().expect("eviction without a buffer");
        let s = *buffer.slot(slot);
        let full = s.mask == full_mask;
        let data = buffer.slot_data(slot);
        let tags = buffer.has_tags().then(|| buffer.slot_tags(slot));
        let mut fill = |nand: &mut Nand, ppn: u32, old: u32| {
            store_masked(nand, ppn, old, full, s.mask, data, tags, unit, tag);
        };
        let done =
            self.ftl
                .write_page(&mut self.nand, s.lpn, full, now_ns, s.transient, &mut fill)?;
        self.buffer
            .as_mut()
            .expect("buffer exists")
            .remove_evicted(slot, done);
        self.stats.buffer_evictions += 1;
        Ok(done)
    }

    fn read(
        &mut self,
        now_ns: TimeNs,
        cmd: &Command<'_>,
        out: ReadBuffers<'_>,
    ) -> Result<TimeNs, DeviceError> {
        let start = now_ns + self.config.host.command_overhead_ns;
        let (ready, flash_pages) = self.read_into_controller(start, cmd, out);
        if self.read_faults.read_fails(flash_pages) {
            self.stats.uncorrectable_reads += 1;
            return Err(DeviceError::Uncorrectable {
                lba: cmd.lba,
                sectors: cmd.sectors,
            });
        }
        let sector_bytes = self.info.sector_bytes as u64;
        Ok(self.device_to_host(ready, cmd.sectors as u64 * sector_bytes))
    }

    /// Reads a command's sectors into controller DRAM (`out`) starting at `start`; returns
    /// when they are all there, and how many pages came from flash (rather than from the
    /// write buffer, or unwritten). The host transfer is the caller's.
    fn read_into_controller(
        &mut self,
        start: TimeNs,
        cmd: &Command<'_>,
        out: ReadBuffers<'_>,
    ) -> (TimeNs, u32) {
        let unit = self.unit_bytes;
        let tag = self.tag_bytes;
        let sector_bytes = self.info.sector_bytes as u64;
        let mut ready = start;
        let mut flash_pages = 0;
        let ReadBuffers {
            data: out_data,
            tags: mut out_tags,
        } = out;
        for span in spans(cmd.lba, cmd.sectors, self.sectors_per_page) {
            let off = span.cmd_offset as usize;
            let n = span.count as usize;
            let first = span.first as usize;
            let mut need = span.mask();
            let slot = self.buffer.as_ref().and_then(|b| b.lookup(span.lpn));
            if let Some(slot) = slot {
                let present = self
                    .buffer
                    .as_ref()
                    .expect("slot implies buffer")
                    .slot(slot)
                    .mask;
                need &= !present;
            }
            if need != 0 {
                let (ppn, t) = self.ftl.read_page(
                    &mut self.nand,
                    span.lpn,
                    start,
                    n as u32 * sector_bytes as u32,
                );
                ready = ready.max(t);
                flash_pages += u32::from(ppn != NONE);
                copy_out(
                    &self.nand,
                    ppn,
                    first,
                    n,
                    unit,
                    tag,
                    &mut out_data[off * unit..(off + n) * unit],
                    out_tags
                        .as_deref_mut()
                        .map(|t| &mut t[off * tag..(off + n) * tag]),
                );
            }
            if let Some(slot) = slot {
                let buffer = self.buffer.as_mut().expect("slot implies buffer");
                buffer.touch(slot);
                let present = buffer.slot(slot).mask;
                if need == 0 {
                    self.stats.buffer_read_hits += 1;
                }
                for s in 0..n {
                    if present >> (first + s) & 1 == 0 {
                        continue;
                    }
                    let idx = first + s;
                    if unit > 0 {
                        out_data[(off + s) * unit..(off + s + 1) * unit]
                            .copy_from_slice(&buffer.slot_data(slot)[idx * unit..(idx + 1) * unit]);
                    }
                    if let Some(t) = out_tags.as_deref_mut() {
                        let dst = &mut t[(off + s) * tag..(off + s + 1) * tag];
                        if buffer.has_tags() {
                            dst.copy_from_slice(
                                &buffer.slot_tags(slot)[idx * tag..(idx + 1) * tag],
                            );
                        } else {
                            dst.fill(0);
                        }
                    }
                }
                ready = ready
                    .max(start + transfer_ns(n as u64 * sector_bytes, self.config.host.dram_mb_s));
            }
        }
        (ready, flash_pages)
    }

    /// ScalaAFA's in-SSD conversion (§5.3): read the vertical hero's k chunks into DRAM,
    /// compute parity row `cmd.parity.row` over their data and tags with the engine, write it
    /// at the destination and deallocate the source. No byte crosses the host link.
    fn convert_stripe(
        &mut self,
        now_ns: TimeNs,
        cmd: &ConvertCommand,
    ) -> Result<TimeNs, DeviceError> {
        let codec = validate_convert(&self.info, cmd)?;
        let (k, cs) = (cmd.k as u32, cmd.chunk_sectors);
        let bad = |what: String| DeviceError::Unsupported(format!("convert: {what}"));
        self.stats.convert_commands += 1;
        let unit = self.unit_bytes;
        let tag = self.tag_bytes;
        let chunk_units = cs as usize * unit;
        let chunk_tags = cs as usize * tag;
        let mut data = vec![0u8; k as usize * chunk_units];
        let mut tags = vec![0u8; k as usize * chunk_tags];
        let start = now_ns + self.config.host.command_overhead_ns;
        let mut ready = start;
        for i in 0..k as usize {
            let read = Command::read(cmd.src_lba + (i * cs as usize) as u64, cs);
            let out = ReadBuffers {
                data: &mut data[i * chunk_units..(i + 1) * chunk_units],
                tags: (tag > 0).then(|| &mut tags[i * chunk_tags..(i + 1) * chunk_tags]),
            };
            // The controller retries its own reads until they correct: injected read faults
            // fail host reads only.
            ready = ready.max(self.read_into_controller(start, &read, out).0);
        }
        let mut parity = vec![0u8; chunk_units];
        let mut parity_tags = vec![0u8; chunk_tags];
        let encode = |all: &[u8], len: usize, out: &mut [u8]| {
            let refs: Vec<&[u8]> = all.chunks(len.max(1)).take(k as usize).collect();
            if len > 0 {
                codec
                    .encode_row(cmd.parity.row as usize, &refs, out)
                    .map_err(|e| bad(e.to_string()))
            } else {
                Ok(())
            }
        };
        encode(&data, chunk_units, &mut parity)?;
        encode(&tags, chunk_tags, &mut parity_tags)?;
        let chunk_bytes = cs as u64 * self.info.sector_bytes as u64;
        let computed = ready + self.config.convert.engine_ns(k, chunk_bytes);
        let write = Command {
            opcode: Opcode::Write,
            lba: cmd.dst_lba,
            sectors: cs,
            data: &parity,
            tags: (tag > 0).then_some(&parity_tags[..]),
            flags: Default::default(),
        };
        self.stats.host_page_writes += spans(cmd.dst_lba, cs, self.sectors_per_page).count() as u64;
        let written = self.write_arrived(computed, &write)?;
        // The replicas are dead now: deallocating them lets the SLC evictor and GC drop them
        // without migration.
        if cmd.trim_source {
            self.trim(written, &Command::trim(cmd.src_lba, k * cs))?;
        }
        Ok(written)
    }

    /// Whether logical page `lpn` holds any data: mapped in flash or waiting in the buffer.
    fn holds_data(&self, lpn: u32) -> bool {
        self.ftl.mapped(lpn) != NONE
            || self
                .buffer
                .as_ref()
                .is_some_and(|b| b.lookup(lpn).is_some())
    }

    /// Host data now fills the sectors of `mask` of page `lpn`: they are no longer trimmed.
    #[inline]
    fn forget_trimmed(&mut self, lpn: u32, mask: u64) {
        if self.trimmed_sectors.is_empty() {
            return;
        }
        if let Some(trimmed) = self.trimmed_sectors.get_mut(&lpn) {
            *trimmed &= !mask;
            if *trimmed == 0 {
                self.trimmed_sectors.remove(&lpn);
            }
        }
    }

    /// Drops a whole logical page: out of the buffer, unmapped, no trimmed sectors left.
    fn drop_page(&mut self, lpn: u32) {
        if let Some(buffer) = self.buffer.as_mut() {
            if let Some(slot) = buffer.lookup(lpn) {
                buffer.remove(slot);
            }
        }
        self.ftl.unmap(lpn);
        self.trimmed_sectors.remove(&lpn);
    }

    fn trim(&mut self, now_ns: TimeNs, cmd: &Command<'_>) -> Result<TimeNs, DeviceError> {
        let start = now_ns + self.config.host.command_overhead_ns;
        let mut done = start;
        let zeros = vec![0u8; self.sectors_per_page as usize * self.unit_bytes];
        for span in spans(cmd.lba, cmd.sectors, self.sectors_per_page) {
            // A page that holds no data (never written, or trimmed whole) already reads as
            // zeroes: trimming any of its sectors is free of flash work.
            if !self.holds_data(span.lpn) {
                continue;
            }
            let before = self.trimmed_sectors.get(&span.lpn).copied().unwrap_or(0);
            let trimmed = before | span.mask();
            if trimmed == self.full_mask {
                // This trim, alone or with earlier sub-page trims, covers the whole page.
                self.drop_page(span.lpn);
                continue;
            }
            if trimmed == before {
                // These sectors were trimmed already and still read as zeroes.
                continue;
            }
            // A partial-page trim zeroes its sectors with a write of zeroes, so that every
            // trimmed sector reads back as zero (deterministic read-zero after trim).
            let zero_cmd = Command {
                opcode: Opcode::Write,
                lba: span.lpn as u64 * self.sectors_per_page as u64 + span.first as u64,
                sectors: span.count,
                data: &zeros[..span.count as usize * self.unit_bytes],
                tags: None,
                flags: Default::default(),
            };
            let sub = PageSpan {
                cmd_offset: 0,
                ..span
            };
            let t = if self.buffer.is_some() {
                self.buffer_write(sub, &zero_cmd, start)?
            } else {
                self.direct_write(sub, &zero_cmd, start)?
            };
            self.trimmed_sectors.insert(span.lpn, trimmed);
            done = done.max(t);
        }
        Ok(done)
    }

    fn flush(&mut self, now_ns: TimeNs) -> Result<TimeNs, DeviceError> {
        let start = now_ns + self.config.host.command_overhead_ns;
        let mut done = start;
        while let Some(slot) = self.buffer.as_ref().and_then(|b| b.eviction_candidate()) {
            done = done.max(self.evict_slot(slot, start)?);
        }
        if let Some(buffer) = self.buffer.as_ref() {
            done = done.max(buffer.drained_at());
        }
        Ok(done)
    }

    /// Dirty pages waiting in the write buffer.
    pub fn buffered_pages(&self) -> usize {
        self.buffer.as_ref().map_or(0, |b| b.dirty_pages())
    }
}

/// Stores a contiguous span of sectors into a newly programmed page, taking the rest of the
/// page from its previous version (or zeroes).
#[allow(clippy::too_many_arguments)]
#[inline]
fn store_span(
    nand: &mut Nand,
    ppn: u32,
    old: u32,
    full: bool,
    first: u32,
    units: &[u8],
    tags: Option<&[u8]>,
    unit: usize,
    tag: usize,
) {
    let store = nand.store_mut();
    if !full {
        if old != NONE {
            store.copy_page(old, ppn);
        } else {
            store.clear_page(ppn);
        }
    }
    let first = first as usize;
    if unit > 0 {
        store.page_mut(ppn)[first * unit..first * unit + units.len()].copy_from_slice(units);
    }
    if tag > 0 {
        match tags {
            Some(t) => {
                store.page_tags_mut(ppn)[first * tag..first * tag + t.len()].copy_from_slice(t)
            }
            None => {
                if store.page_tags(ppn).is_some() {
                    let len = units.len() / unit.max(1) * tag;
                    store.page_tags_mut(ppn)[first * tag..first * tag + len].fill(0);
                }
            }
        }
    }
}

/// Stores the sectors in `mask` from a buffer slot's page image into a newly programmed page.
#[allow(clippy::too_many_arguments)]
#[inline]
fn store_masked(
    nand: &mut Nand,
    ppn: u32,
    old: u32,
    full: bool,
    mask: u64,
    units: &[u8],
    tags: Option<&[u8]>,
    unit: usize,
    tag: usize,
) {
    let store = nand.store_mut();
    if full {
        if unit > 0 {
            store.page_mut(ppn).copy_from_slice(units);
        }
        match tags {
            Some(t) => store.page_tags_mut(ppn).copy_from_slice(t),
            None => {
                if store.page_tags(ppn).is_some() {
                    store.page_tags_mut(ppn).fill(0);
                }
            }
        }
        return;
    }
    if old != NONE {
        store.copy_page(old, ppn);
    } else {
        store.clear_page(ppn);
    }
    let mut m = mask;
    while m != 0 {
        let s = m.trailing_zeros() as usize;
        m &= m - 1;
        if unit > 0 {
            store.page_mut(ppn)[s * unit..(s + 1) * unit]
                .copy_from_slice(&units[s * unit..(s + 1) * unit]);
        }
        if let Some(t) = tags {
            store.page_tags_mut(ppn)[s * tag..(s + 1) * tag]
                .copy_from_slice(&t[s * tag..(s + 1) * tag]);
        }
    }
}

/// Copies sectors `first..first+n` of physical page `ppn` (NONE reads as zeroes) out.
#[allow(clippy::too_many_arguments)]
#[inline]
fn copy_out(
    nand: &Nand,
    ppn: u32,
    first: usize,
    n: usize,
    unit: usize,
    tag: usize,
    out: &mut [u8],
    out_tags: Option<&mut [u8]>,
) {
    let store = nand.store();
    if unit > 0 {
        if ppn == NONE {
            out.fill(0);
        } else {
            out.copy_from_slice(&store.page(ppn)[first * unit..(first + n) * unit]);
        }
    }
    if let Some(t) = out_tags {
        match (ppn != NONE).then(|| store.page_tags(ppn)).flatten() {
            Some(src) => t.copy_from_slice(&src[first * tag..(first + n) * tag]),
            None => t.fill(0),
        }
    }
}

impl BlockDevice for Ssd {
    fn info(&self) -> DeviceInfo {
        self.info
    }

    fn media_faults(&self) -> MediaFaults {
        self.nand.media_faults()
    }

    fn submit(
        &mut self,
        now_ns: TimeNs,
        cmd: &Command<'_>,
        out: ReadBuffers<'_>,
    ) -> Result<Completion, DeviceError> {
        validate_command(&self.info, cmd, &out)?;
        self.stats.commands += 1;
        let done_ns = match cmd.opcode {
            Opcode::Read => self.read(now_ns, cmd, out)?,
            Opcode::Write => {
                self.stats.host_page_writes +=
                    spans(cmd.lba, cmd.sectors, self.sectors_per_page).count() as u64;
                self.write(now_ns, cmd)?
            }
            Opcode::Trim => self.trim(now_ns, cmd)?,
            Opcode::Flush => self.flush(now_ns)?,
        };
        self.host_done_ns = self.host_done_ns.max(done_ns);
        Ok(Completion {
            done_ns,
            gc_active: self.ftl.gc_busy_until_ns() > now_ns,
        })
    }

    fn prefetch(&self, lba: u64, stage: u8) {
        self.ftl
            .prefetch((lba / self.sectors_per_page as u64) as u32, stage);
    }

    fn background(&mut self, now_ns: TimeNs) -> Option<TimeNs> {
        // Background GC failing means the device is out of space; the next foreground
        // write reports that to the host, so idle work just stops here.
        self.ftl
            .background(&mut self.nand, now_ns, self.host_done_ns)
            .ok()
            .flatten()
    }

    fn convert(&mut self, now_ns: TimeNs, cmd: &ConvertCommand) -> Result<Completion, DeviceError> {
        self.stats.commands += 1;
        let done_ns = self.convert_stripe(now_ns, cmd)?;
        self.host_done_ns = self.host_done_ns.max(done_ns);
        Ok(Completion {
            done_ns,
            gc_active: self.ftl.gc_busy_until_ns() > now_ns,
        })
    }

    /// A logical page the FTL maps, or that waits in the write buffer, is allocated as a
    /// whole (its unwritten sectors read as zeroes, but a page is the unit the FTL keeps).
    fn allocation(&self, lba: u64, sectors: u32) -> Option<Vec<(u32, bool)>> {
        if lba + sectors as u64 > self.info.capacity_sectors {
            return None;
        }
        let mut runs = Vec::new();
        for span in spans(lba, sectors, self.sectors_per_page) {
            let buffered = self
                .buffer
                .as_ref()
                .is_some_and(|b| b.lookup(span.lpn).is_some());
            let allocated = buffered || self.ftl.mapped(span.lpn) != NONE;
            push_allocation_run(&mut runs, span.count, allocated);
        }
        Some(runs)
    }

    fn scan_tags(&self, lba: u64, sectors: u32) -> Option<Vec<u8>> {
        let tag = self.tag_bytes;
        if tag == 0 || lba + sectors as u64 > self.info.capacity_sectors {
            return None;
        }
        let mut out = vec![0u8; sectors as usize * tag];
        let store = self.nand.store();
        for span in spans(lba, sectors, self.sectors_per_page) {
            let off = span.cmd_offset as usize * tag;
            let n = span.count as usize * tag;
            let first = span.first as usize * tag;
            let ppn = self.ftl.mapped(span.lpn);
            if ppn != NONE {
                if let Some(src) = store.page_tags(ppn) {
                    out[off..off + n].copy_from_slice(&src[first..first + n]);
                }
            }
            // A page still in the write buffer has its newest tags there, but only for the
            // sectors the buffer holds: the rest are the flash page's, as a read merges
            // them. Taking the whole slot returned, for a partly buffered page, tags the
            // slot kept from the page it buffered before (the config soak found a ScalaAFA
            // decode that failed its checksums on one such tag).
            let Some(b) = self.buffer.as_ref() else {
                continue;
            };
            let Some(slot) = b.lookup(span.lpn) else {
                continue;
            };
            let present = b.slot(slot).mask;
            for s in 0..span.count as usize {
                let idx = span.first as usize + s;
                if present >> idx & 1 == 0 {
                    continue;
                }
                let dst = &mut out[off + s * tag..off + (s + 1) * tag];
                if b.has_tags() {
                    dst.copy_from_slice(&b.slot_tags(slot)[idx * tag..(idx + 1) * tag]);
                } else {
                    dst.fill(0);
                }
            }
        }
        Some(out)
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
