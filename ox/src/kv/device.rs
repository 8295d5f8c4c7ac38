//! The device under the key-value store: an OX controller (either interface), or a
//! conventional SSD behind the block interface, the sanity check of the paper's Figure 14.
//!
//! The store talks to its device through [`KvDevice`]: it submits requests at its own clock,
//! lets the device run up to that clock, and takes the completions that arrived. The OX
//! controller is event driven and implements it directly. A conventional SSD (`afa_ssd::Ssd`)
//! books every command on its dies, channels and link when it is submitted and returns the
//! completion time at once; [`ConventionalSsd`] holds those completions until the store's
//! clock reaches them, so the store keeps as many commands in flight on it as on OX.

use std::collections::BTreeMap;

use afa_sim::TimeNs;
use afa_ssd::{BlockDevice, Command, DeviceError, ReadBuffers, Ssd, SsdConfig};

use afa_nand::PayloadMode;

use crate::{CompletionRecord, OxConfig, OxController, OxError, OxStats, Request, RequestId};

/// What the key-value store needs of its device.
pub trait KvDevice {
    /// The device's clock.
    fn now_ns(&self) -> TimeNs;
    /// Submits a request at `now_ns`; bad input is refused at once.
    fn submit(&mut self, now_ns: TimeNs, request: Request) -> Result<RequestId, OxError>;
    /// Runs the device up to `t_ns`.
    fn advance_to(&mut self, t_ns: TimeNs);
    /// When the device next has something to do or to deliver.
    fn next_event_ns(&self) -> Option<TimeNs>;
    /// The completions delivered so far, in order.
    fn take_completions(&mut self) -> Vec<CompletionRecord>;
    /// Runs the device until request `id` completes and returns its completion; others
    /// that complete meanwhile stay for [`KvDevice::take_completions`].
    fn run_until_complete(&mut self, id: RequestId) -> Result<CompletionRecord, OxError>;
    /// Runs the device until nothing is under way.
    fn quiesce(&mut self);
    /// The device's counters (a conventional SSD fills the user read and write bytes, the
    /// read commands and its GC's runs and bytes moved).
    fn stats(&self) -> OxStats;
}

impl KvDevice for OxController {
    fn now_ns(&self) -> TimeNs {
        OxController::now_ns(self)
    }
    fn submit(&mut self, now_ns: TimeNs, request: Request) -> Result<RequestId, OxError> {
        OxController::submit(self, now_ns, request)
    }
    fn advance_to(&mut self, t_ns: TimeNs) {
        OxController::advance_to(self, t_ns)
    }
    fn next_event_ns(&self) -> Option<TimeNs> {
        OxController::next_event_ns(self)
    }
    fn take_completions(&mut self) -> Vec<CompletionRecord> {
        OxController::take_completions(self)
    }
    fn run_until_complete(&mut self, id: RequestId) -> Result<CompletionRecord, OxError> {
        OxController::run_until_complete(self, id)
    }
    fn quiesce(&mut self) {
        OxController::quiesce(self)
    }
    fn stats(&self) -> OxStats {
        *OxController::stats(self)
    }
}

/// A conventional SSD (the workspace's page-mapped `Ssd`, its FTL in firmware, on PCIe) as
/// a key-value store device. Block requests only: the batch interface is OX's.
#[derive(Debug)]
pub struct ConventionalSsd {
    ssd: Ssd,
    now_ns: TimeNs,
    next_id: RequestId,
    /// Completions not yet delivered, by (done time, id): the order they arrive in.
    pending: BTreeMap<(TimeNs, RequestId), CompletionRecord>,
    /// Delivered and not yet taken, in order.
    delivered: Vec<CompletionRecord>,
    stats: OxStats,
}

/// Payload bytes per sector the store checks: the 8-byte token.
const TOKEN_BYTES: usize = 8;

fn device_error(e: DeviceError) -> OxError {
    OxError::Config(format!("conventional SSD: {e}"))
}

impl ConventionalSsd {
    /// An SSD of `config` whose logical capacity must hold `logical_pages` 4 KiB pages.
    pub fn new(config: SsdConfig, logical_pages: u64, seed: u64) -> Result<Self, OxError> {
        let ssd = Ssd::new(config, seed)
            .map_err(|e| OxError::Config(format!("conventional SSD: {e}")))?;
        let info = ssd.info();
        if info.capacity_sectors < logical_pages {
            return Err(OxError::Config(format!(
                "conventional SSD: {} logical sectors, fewer than the {logical_pages} the store needs",
                info.capacity_sectors
            )));
        }
        if info.payload_unit_bytes as usize != TOKEN_BYTES {
            return Err(OxError::Config(format!(
                "conventional SSD: the store checks 8-byte tokens; the device stores {} bytes per sector (payload must be token)",
                info.payload_unit_bytes
            )));
        }
        Ok(ConventionalSsd {
            ssd,
            now_ns: 0,
            next_id: 1,
            pending: BTreeMap::new(),
            delivered: Vec::new(),
            stats: OxStats::default(),
        })
    }

    /// A conventional SSD on the medium of `ox`: the same channels, LUNs, EBLOCKs (as
    /// blocks of WBLOCK pages) and NAND timing, exposing OX's logical pages with the rest
    /// of the flash as its spare (OX keeps part of its own for log, tables and system
    /// blocks), its page-mapped FTL in firmware (1 µs a command) behind PCIe (7,880 MB/s,
    /// no fabric latency), and no write buffer, so a write completes once programmed, as
    /// on OX.
    pub fn config_like(ox: &OxConfig) -> SsdConfig {
        let geometry = ox.geometry();
        let physical_pages = geometry.channels as f64
            * geometry.chips_per_channel as f64
            * geometry.blocks_per_plane as f64
            * geometry.pages_per_block as f64;
        let logical_pages = ox
            .logical_pages
            .div_ceil(ox.terms.rblocks_per_wblock() as u64) as f64;
        // A hair under the exact ratio, so that rounding leaves at least OX's logical pages.
        let over_provisioning = physical_pages / logical_pages * (1.0 - 1e-9) - 1.0;
        let mut cfg = SsdConfig {
            geometry,
            timing: ox.timing.clone(),
            cell_mode: ox.cell_mode,
            over_provisioning,
            payload: PayloadMode::Token,
            ..SsdConfig::default()
        };
        cfg.write_buffer.capacity_bytes = 0;
        cfg
    }

    pub fn ssd(&self) -> &Ssd {
        &self.ssd
    }

    /// Moves the completions due by the clock to the delivered list, in time order.
    fn deliver_due(&mut self) {
        while let Some(entry) = self.pending.first_entry() {
            if entry.key().0 > self.now_ns {
                break;
            }
            self.delivered.push(entry.remove());
        }
    }

    fn execute(
        &mut self,
        now_ns: TimeNs,
        request: &Request,
    ) -> Result<(TimeNs, Vec<u64>), OxError> {
        let sector = afa_ssd::BlockDevice::info(&self.ssd).sector_bytes as u64;
        let unit = TOKEN_BYTES;
        match request {
            Request::ReadBlocks { lba, count } => {
                let mut data = vec![0u8; *count as usize * unit];
                let done = self
                    .ssd
                    .submit(
                        now_ns,
                        &Command::read(*lba, *count),
                        ReadBuffers {
                            data: &mut data,
                            tags: None,
                        },
                    )
                    .map_err(device_error)?;
                self.stats.user_read_bytes += *count as u64 * sector;
                self.stats.read_commands += 1;
                let tokens = data
                    .chunks_exact(unit)
                    .map(|c| u64::from_le_bytes(c.try_into().expect("8-byte tokens")))
                    .collect();
                Ok((done.done_ns, tokens))
            }
            Request::WriteBlocks { lba, tokens } => {
                let data: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
                let done = self
                    .ssd
                    .submit(
                        now_ns,
                        &Command::write(*lba, tokens.len() as u32, &data),
                        ReadBuffers::none(),
                    )
                    .map_err(device_error)?;
                self.stats.user_write_bytes += tokens.len() as u64 * sector;
                self.stats.write_command_bytes += tokens.len() as u64 * sector;
                Ok((done.done_ns, Vec::new()))
            }
            Request::TrimBlocks { lba, count } => {
                let done = self
                    .ssd
                    .submit(now_ns, &Command::trim(*lba, *count), ReadBuffers::none())
                    .map_err(device_error)?;
                Ok((done.done_ns, Vec::new()))
            }
            Request::FlushBatch(_) | Request::ReadLpid(_) | Request::ReadBatch(_) => {
                Err(OxError::Config(
                    "conventional SSD: the batch interface is OX's; a conventional SSD takes block requests only".into(),
                ))
            }
        }
    }
}

impl KvDevice for ConventionalSsd {
    fn now_ns(&self) -> TimeNs {
        self.now_ns
    }

    fn submit(&mut self, now_ns: TimeNs, request: Request) -> Result<RequestId, OxError> {
        let now = now_ns.max(self.now_ns);
        self.advance_to(now);
        let (done_ns, tokens) = self.execute(now, &request)?;
        let id = self.next_id;
        self.next_id += 1;
        self.pending.insert(
            (done_ns, id),
            CompletionRecord {
                id,
                submitted_ns: now,
                done_ns,
                result: Ok(tokens),
            },
        );
        Ok(id)
    }

    fn advance_to(&mut self, t_ns: TimeNs) {
        // Idle-time work (background GC) gets its chance whenever the host's clock moves.
        if t_ns > self.now_ns && self.pending.is_empty() {
            self.ssd.background(self.now_ns);
        }
        self.now_ns = self.now_ns.max(t_ns);
        self.deliver_due();
    }

    fn next_event_ns(&self) -> Option<TimeNs> {
        self.pending.keys().next().map(|&(t, _)| t)
    }

    fn take_completions(&mut self) -> Vec<CompletionRecord> {
        std::mem::take(&mut self.delivered)
    }

    fn run_until_complete(&mut self, id: RequestId) -> Result<CompletionRecord, OxError> {
        if let Some(pos) = self.delivered.iter().position(|c| c.id == id) {
            return Ok(self.delivered.remove(pos));
        }
        let key = self
            .pending
            .keys()
            .find(|&&(_, i)| i == id)
            .copied()
            .ok_or(OxError::UnknownRequest(id))?;
        self.advance_to(key.0);
        let pos = self
            .delivered
            .iter()
            .position(|c| c.id == id)
            .expect("a completion due by the clock is delivered");
        Ok(self.delivered.remove(pos))
    }

    fn quiesce(&mut self) {
        if let Some(&(t, _)) = self.pending.keys().next_back() {
            self.advance_to(t);
        }
    }

    /// The host-side counters, and the FTL's GC in OX's terms: victims are GC runs, and a
    /// moved page is read and written whole.
    fn stats(&self) -> OxStats {
        let ftl = self.ssd.ftl_stats();
        let page_bytes = self.ssd.config().geometry.page_bytes as u64;
        OxStats {
            gc_victims: ftl.gc_foreground_runs + ftl.gc_background_runs,
            gc_read_bytes: ftl.gc_pages_moved * page_bytes,
            gc_write_bytes: ftl.gc_pages_moved * page_bytes,
            ..self.stats
        }
    }
}
