//! OXBlock: the same controller behind a plain block interface (the paper's baseline).
//!
//! A logical block address is an LPID. A write arrives as transport packets, and each packet
//! is its own write context with its own RDESC and `done` record (`Request::WriteBlocks`);
//! nothing ties the packets of one write together, so a power loss may leave some of them.
//! `OxBlockDevice` puts the controller behind the workspace's `BlockDevice` seam so that the
//! host layer's jobs and oracle can drive it.

use afa_sim::TimeNs;
use std::collections::{BTreeMap, BTreeSet};

use afa_ssd::{
    validate_command, BlockDevice, Command, Completion, DeviceError, DeviceInfo, Opcode,
    QueuedCompletion, QueuedDevice, ReadBuffers,
};

use crate::{OxController, OxError, Request, RequestId};

/// The OX controller as a `BlockDevice` with 4 KiB sectors (one RBLOCK each) and 8-byte
/// token payloads.
///
/// `submit` runs the controller until the command completes, so commands are served one at
/// a time in the order submitted; a command submitted at a time the controller has already
/// passed starts at the controller's clock. A host that keeps several commands in flight
/// uses the queued interface instead (`BlockDevice::queued`): a block FLUSH there completes
/// once every write the write-back cache acknowledged before it is installed (at once with
/// the write-through cache, which acknowledges only installed writes).
#[derive(Debug)]
pub struct OxBlockDevice {
    ctrl: OxController,
    max_transfer_sectors: u32,
    /// Queued interface: the caller's tag of every request under way.
    tags: BTreeMap<RequestId, u64>,
    /// Queued interface: flushes whose completion time is known, by (time, tag).
    flushes: BTreeSet<(TimeNs, u64)>,
    /// Queued interface, write-back cache: flushes waiting for the commands the cache had
    /// acknowledged when they started, in start order.
    draining: Vec<DrainingFlush>,
    /// Queued interface, write-back cache: writes and trims sent with FUA that the cache has
    /// not acknowledged yet.
    fua: BTreeSet<RequestId>,
    /// Queued interface, write-back cache: FUA commands the cache acknowledged, whose
    /// completion is held until they are installed.
    fua_held: Vec<(RequestId, QueuedCompletion)>,
    /// With the controller capturing read bytes (a served device): the bytes of reads the
    /// queued interface completed, by tag, until `take_read_bytes` collects them.
    read_bytes: BTreeMap<u64, Result<Vec<u8>, DeviceError>>,
    /// The same for the last read `submit` served.
    last_read_bytes: Option<Result<Vec<u8>, DeviceError>>,
}

/// A FLUSH on the queued interface that waits for acknowledged writes to be installed.
#[derive(Debug)]
struct DrainingFlush {
    tag: u64,
    /// The commands it waits for, oldest first. Only the oldest is looked at until it
    /// completes: the flush cannot complete before it, and checking every one at every
    /// event made a deep queue of flushes quadratic.
    waiting_for: std::collections::VecDeque<RequestId>,
}

impl OxBlockDevice {
    pub fn new(ctrl: OxController) -> OxBlockDevice {
        OxBlockDevice {
            ctrl,
            max_transfer_sectors: 256,
            tags: BTreeMap::new(),
            flushes: BTreeSet::new(),
            draining: Vec::new(),
            fua: BTreeSet::new(),
            fua_held: Vec::new(),
            read_bytes: BTreeMap::new(),
            last_read_bytes: None,
        }
    }

    /// The bytes the controller captured for the queued read `tag` (see
    /// `OxController::capture_read_bytes`), once it has completed.
    pub fn take_read_bytes(&mut self, tag: u64) -> Option<Result<Vec<u8>, DeviceError>> {
        self.read_bytes.remove(&tag)
    }

    /// The bytes the controller captured for the last read `submit` served.
    pub fn take_last_read_bytes(&mut self) -> Option<Result<Vec<u8>, DeviceError>> {
        self.last_read_bytes.take()
    }

    /// The controller's request for a read, write or trim, its tokens taken from the
    /// command's payload.
    fn request(&self, cmd: &Command<'_>) -> Request {
        let unit = self.info().payload_unit_bytes as usize;
        match cmd.opcode {
            Opcode::Read => Request::ReadBlocks {
                lba: cmd.lba,
                count: cmd.sectors,
            },
            Opcode::Write => {
                let tokens = (0..cmd.sectors as usize)
                    .map(|i| {
                        if unit == 0 {
                            return 0;
                        }
                        let mut w = [0u8; 8];
                        w[..unit].copy_from_slice(&cmd.data[i * unit..(i + 1) * unit]);
                        u64::from_le_bytes(w)
                    })
                    .collect();
                Request::WriteBlocks {
                    lba: cmd.lba,
                    tokens,
                }
            }
            Opcode::Trim => Request::TrimBlocks {
                lba: cmd.lba,
                count: cmd.sectors,
            },
            Opcode::Flush => unreachable!("a flush is no controller request"),
        }
    }

    /// The payload units of the tokens a read returned.
    fn read_units(&self, tokens: &[u64]) -> Vec<u8> {
        let unit = self.info().payload_unit_bytes as usize;
        tokens
            .iter()
            .flat_map(|t| t.to_le_bytes().into_iter().take(unit))
            .collect()
    }

    /// Runs the controller to `t_ns` and collects what completed: the controller's
    /// completions (a FUA command the write-back cache acknowledged is held until it is
    /// installed), then flushes and held FUA commands whose writes are installed by then.
    fn step_to(&mut self, t_ns: TimeNs, done: &mut Vec<QueuedCompletion>) {
        self.ctrl.advance_to(t_ns);
        for c in self.ctrl.take_completions() {
            let Some(tag) = self.tags.remove(&c.id) else {
                continue;
            };
            if let Some(bytes) = self.ctrl.take_read_bytes(c.id) {
                self.read_bytes
                    .insert(tag, bytes.map_err(DeviceError::Medium));
            }
            let result = c
                .result
                .map(|tokens| self.read_units(&tokens))
                .map_err(device_error);
            let completion = QueuedCompletion {
                tag,
                done_ns: c.done_ns,
                result,
            };
            if self.fua.remove(&c.id) && completion.result.is_ok() && self.ctrl.under_way(c.id) {
                self.fua_held.push((c.id, completion));
                continue;
            }
            done.push(completion);
        }
        self.settle_draining(t_ns, done);
        let fatal = self.ctrl.fatal_error().cloned();
        let ctrl = &self.ctrl;
        self.fua_held.retain_mut(|(id, c)| {
            if let Some(e) = &fatal {
                c.result = Err(device_error(e.clone()));
            } else if ctrl.under_way(*id) {
                return true;
            }
            c.done_ns = t_ns;
            done.push(c.clone());
            false
        });
    }

    /// Flushes whose writes have all completed by `now_ns` complete now; if the controller
    /// stopped, every waiting flush fails with its error.
    fn settle_draining(&mut self, now_ns: TimeNs, failed: &mut Vec<QueuedCompletion>) {
        if let Some(e) = self.ctrl.fatal_error() {
            for f in self.draining.drain(..) {
                failed.push(QueuedCompletion {
                    tag: f.tag,
                    done_ns: now_ns,
                    result: Err(device_error(e.clone())),
                });
            }
            return;
        }
        let ctrl = &self.ctrl;
        let flushes = &mut self.flushes;
        self.draining.retain_mut(|f| {
            while f.waiting_for.front().is_some_and(|&id| !ctrl.under_way(id)) {
                f.waiting_for.pop_front();
            }
            if f.waiting_for.is_empty() {
                // An acknowledged command completes in the controller the transport's
                // latency after its last context was installed, which is when the flush's
                // answer, sent as that install ends, reaches the host.
                flushes.insert((now_ns, f.tag));
                return false;
            }
            true
        });
    }

    pub fn controller(&self) -> &OxController {
        &self.ctrl
    }
    pub fn controller_mut(&mut self) -> &mut OxController {
        &mut self.ctrl
    }
    pub fn into_controller(self) -> OxController {
        self.ctrl
    }
}

/// Commands a host keeps in flight on the queued interface: the Linux NVMe-oF host's
/// default queue size.
const QUEUE_DEPTH: u32 = 128;

pub(crate) fn device_error(e: OxError) -> DeviceError {
    match e {
        // OX reclaims whole EBLOCKs per channel, not blocks of a plane.
        OxError::NoSpace => DeviceError::VolumeFull("no EBLOCK can be reclaimed".into()),
        OxError::LpidOutOfRange { lpid, capacity } => DeviceError::OutOfRange {
            lba: lpid,
            sectors: 1,
            capacity,
        },
        OxError::PoweredOff => DeviceError::Failed,
        OxError::ReadOnly(why) => DeviceError::ReadOnly(why),
        // Flash that failed in a way the FTL could not absorb (an erase of a checkpoint
        // block, every forward link of a log block), an image file's I/O error, and the
        // controller's own faults stop the device: they are the medium's failure, not a
        // command it does not support, which is what they were reported as.
        e @ (OxError::Nand(_)
        | OxError::LogWriteFailed { .. }
        | OxError::SystemWriteFailed { .. }
        | OxError::Image(_)
        | OxError::Recovery(_)
        | OxError::Stuck(_)
        | OxError::WriteCacheInconsistent { .. }
        | OxError::AcknowledgedWriteFailed { .. }) => DeviceError::Medium(e.to_string()),
        other => DeviceError::Unsupported(other.to_string()),
    }
}

impl BlockDevice for OxBlockDevice {
    fn info(&self) -> DeviceInfo {
        let cfg = self.ctrl.config();
        DeviceInfo {
            sector_bytes: cfg.terms.rblock_bytes,
            capacity_sectors: cfg.logical_pages,
            payload_unit_bytes: cfg.payload.unit_bytes(cfg.terms.rblock_bytes).min(8),
            tag_bytes_per_sector: 0,
            // Queued, the host keeps as many commands in flight as an NVMe-oF queue takes.
            max_queue_depth: QUEUE_DEPTH,
            max_transfer_sectors: self.max_transfer_sectors,
        }
    }

    fn media_faults(&self) -> afa_nand::MediaFaults {
        self.ctrl.media().nand().media_faults()
    }

    fn submit(
        &mut self,
        now_ns: TimeNs,
        cmd: &Command<'_>,
        out: ReadBuffers<'_>,
    ) -> Result<Completion, DeviceError> {
        let info = self.info();
        validate_command(&info, cmd, &out)?;
        let now = now_ns.max(self.ctrl.now_ns());
        // Without a write-back cache writes complete only once durable, so a flush has
        // nothing to drain; with one, it waits until the cache is empty.
        if cmd.opcode == Opcode::Flush {
            self.ctrl.advance_to(now);
            let drained = self.ctrl.drain_write_cache().max(now);
            return Ok(Completion {
                done_ns: drained + self.ctrl.config().costs.transport_latency_ns,
                gc_active: self.ctrl.gc_active(),
            });
        }
        let id = self
            .ctrl
            .submit(now, self.request(cmd))
            .map_err(device_error)?;
        let c = self.ctrl.run_until_complete(id);
        // Taken whatever the outcome, so that a failed read leaves nothing behind.
        self.last_read_bytes = self
            .ctrl
            .take_read_bytes(id)
            .map(|b| b.map_err(DeviceError::Medium));
        let c = c.map_err(device_error)?;
        let tokens = c.result.map_err(device_error)?;
        if cmd.opcode == Opcode::Read && info.payload_unit_bytes > 0 {
            out.data.copy_from_slice(&self.read_units(&tokens));
        }
        let mut done_ns = c.done_ns;
        // Force unit access: a write the write-back cache acknowledged completes only once
        // it is installed (its `done` record is on flash), when the controller completes it.
        while cmd.flags.fua && self.ctrl.under_way(id) {
            let Some(t) = self.ctrl.next_event_ns() else {
                break;
            };
            self.ctrl.advance_to(t);
            done_ns = t;
            if let Some(e) = self.ctrl.fatal_error() {
                return Err(device_error(e.clone()));
            }
        }
        Ok(Completion {
            done_ns,
            gc_active: self.ctrl.gc_active(),
        })
    }

    fn queued(&mut self) -> Option<&mut dyn QueuedDevice> {
        Some(self)
    }

    /// An LPID is data when a read of it now would return a version (MAP points at an
    /// RBLOCK, or a write waits in the write-back cache), a hole when it was never written
    /// or its newest command was a trim. A controller that has failed does not say.
    fn allocation(&self, lba: u64, sectors: u32) -> Option<Vec<(u32, bool)>> {
        let end = lba.checked_add(sectors as u64)?;
        if end > self.ctrl.config().logical_pages || self.ctrl.fatal_error().is_some() {
            return None;
        }
        let mut runs = Vec::new();
        for lpid in lba..end {
            afa_ssd::push_allocation_run(&mut runs, 1, self.ctrl.peek_holds_data(lpid));
        }
        Some(runs)
    }

    fn background(&mut self, now_ns: TimeNs) -> Option<TimeNs> {
        if now_ns >= self.ctrl.now_ns() {
            self.ctrl.advance_to(now_ns);
        }
        // Periodic checkpoints are always scheduled; only work under way asks for a call.
        if self.ctrl.busy() {
            self.ctrl.next_event_ns()
        } else {
            None
        }
    }
}

/// The queued interface: commands run side by side in the controller as its own host
/// interface would take them, so a host with many commands in flight sees the controller's
/// parallelism.
impl QueuedDevice for OxBlockDevice {
    fn start(&mut self, now_ns: TimeNs, cmd: &Command<'_>, tag: u64) -> Result<(), DeviceError> {
        let info = self.info();
        // The read's data comes back in its completion; validation sees a buffer of the
        // length it will have.
        let units = match cmd.opcode {
            Opcode::Read => cmd.sectors as usize * info.payload_unit_bytes as usize,
            _ => 0,
        };
        let mut room = vec![0u8; units];
        validate_command(
            &info,
            cmd,
            &ReadBuffers {
                data: &mut room,
                tags: None,
            },
        )?;
        let now = now_ns.max(self.ctrl.now_ns());
        // Whatever the controller has to do before the command arrives comes first.
        self.ctrl.advance_to(now);
        if cmd.opcode == Opcode::Flush {
            // Every write acknowledged before the flush must be durable when it completes:
            // write-through, they are already; write-back, the flush waits for those the
            // cache acknowledged and has not installed yet, and for nothing acknowledged
            // after it (NVMe's FLUSH covers the commands completed before it).
            let waiting_for: std::collections::VecDeque<RequestId> =
                self.ctrl.acknowledged_not_durable().into();
            if waiting_for.is_empty() {
                let done = now + self.ctrl.config().costs.transport_latency_ns;
                self.flushes.insert((done, tag));
            } else {
                self.draining.push(DrainingFlush { tag, waiting_for });
            }
            return Ok(());
        }
        let id = self
            .ctrl
            .submit(now, self.request(cmd))
            .map_err(device_error)?;
        self.tags.insert(id, tag);
        // Write-through, a command completes once installed, FUA or not; write-back, a FUA
        // command's early acknowledgement is held back (`step_to`).
        if cmd.flags.fua && self.ctrl.config().write_cache.write_back {
            self.fua.insert(id);
        }
        Ok(())
    }

    fn next_event_ns(&self) -> Option<TimeNs> {
        let flush = self.flushes.first().map(|&(t, _)| t);
        match (self.ctrl.next_event_ns(), flush) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn advance_to(&mut self, t_ns: TimeNs) -> Vec<QueuedCompletion> {
        let mut done: Vec<QueuedCompletion> = Vec::new();
        // With flushes or FUA writes waiting for installs the controller runs one event time
        // at a time, so that each completes at the time its last write was installed.
        while !self.draining.is_empty() || !self.fua.is_empty() || !self.fua_held.is_empty() {
            match self.ctrl.next_event_ns() {
                Some(t) if t <= t_ns => self.step_to(t, &mut done),
                _ => break,
            }
        }
        self.step_to(t_ns, &mut done);
        while let Some(&(t, tag)) = self.flushes.first() {
            if t > t_ns {
                break;
            }
            self.flushes.pop_first();
            done.push(QueuedCompletion {
                tag,
                done_ns: t,
                result: Ok(Vec::new()),
            });
        }
        // In completion order; ties keep the controller's order before flushes'.
        done.sort_by_key(|c| c.done_ns);
        done
    }
}
