//! OXBlock: the same controller behind a plain block interface (the paper's baseline).
//!
//! A logical block address is an LPID. A write arrives as transport packets, and each packet
//! is its own write context with its own RDESC and `done` record (`Request::WriteBlocks`);
//! nothing ties the packets of one write together, so a power loss may leave some of them.
//! `OxBlockDevice` puts the controller behind the workspace's `BlockDevice` seam so that the
//! host layer's jobs and oracle can drive it.

use afa_sim::TimeNs;
use afa_ssd::{
    validate_command, BlockDevice, Command, Completion, DeviceError, DeviceInfo, Opcode,
    ReadBuffers,
};

use crate::{OxController, OxError, Request};

/// The OX controller as a `BlockDevice` with 4 KiB sectors (one RBLOCK each) and 8-byte
/// token payloads.
///
/// `submit` runs the controller until the command completes, so commands are served one at
/// a time in the order submitted; a command submitted at a time the controller has already
/// passed starts at the controller's clock.
#[derive(Debug)]
pub struct OxBlockDevice {
    ctrl: OxController,
    max_transfer_sectors: u32,
}

impl OxBlockDevice {
    pub fn new(ctrl: OxController) -> OxBlockDevice {
        OxBlockDevice {
            ctrl,
            max_transfer_sectors: 256,
        }
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

fn device_error(e: OxError) -> DeviceError {
    match e {
        OxError::NoSpace => DeviceError::NoSpace { plane: 0 },
        OxError::LpidOutOfRange { lpid, capacity } => DeviceError::OutOfRange {
            lba: lpid,
            sectors: 1,
            capacity,
        },
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
            max_queue_depth: 1,
            max_transfer_sectors: self.max_transfer_sectors,
        }
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
        let unit = info.payload_unit_bytes as usize;
        let request = match cmd.opcode {
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
            // Without a write-back cache writes complete only once durable, so a flush has
            // nothing to drain; with one, it waits until the cache is empty.
            Opcode::Flush => {
                self.ctrl.advance_to(now);
                let drained = self.ctrl.drain_write_cache().max(now);
                return Ok(Completion {
                    done_ns: drained + self.ctrl.config().costs.transport_latency_ns,
                    gc_active: self.ctrl.gc_active(),
                });
            }
        };
        let id = self.ctrl.submit(now, request).map_err(device_error)?;
        let c = self.ctrl.run_until_complete(id).map_err(device_error)?;
        let tokens = c.result.map_err(device_error)?;
        if cmd.opcode == Opcode::Read && unit > 0 {
            for (i, t) in tokens.iter().enumerate() {
                out.data[i * unit..(i + 1) * unit].copy_from_slice(&t.to_le_bytes()[..unit]);
            }
        }
        Ok(Completion {
            done_ns: c.done_ns,
            gc_active: self.ctrl.gc_active(),
        })
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
