//! An in-memory device: a RAM disk behind the `BlockDevice` seam, with an optional fixed
//! latency so pacing can be observed without a flash model.

use afa_sim::TimeNs;
use afa_ssd::{
    validate_command, BlockDevice, Command, Completion, DeviceError, DeviceInfo, Opcode,
    ReadBuffers,
};

/// Memory is allocated in chunks of this many bytes on first write, so a large export
/// costs only what was written.
const CHUNK_BYTES: usize = 1 << 20;

/// A sparse RAM disk. Trimmed sectors read back as zeroes.
#[derive(Debug)]
pub struct MemDevice {
    info: DeviceInfo,
    chunks: Vec<Option<Box<[u8]>>>,
    latency_ns: u64,
}

impl MemDevice {
    /// A device of `capacity_sectors` sectors of `sector_bytes` bytes (a power of two
    /// between 512 and 64 KiB). Commands complete at once.
    pub fn new(sector_bytes: u32, capacity_sectors: u64) -> Result<Self, DeviceError> {
        if !sector_bytes.is_power_of_two() || !(512..=65536).contains(&sector_bytes) {
            return Err(DeviceError::Unsupported(format!(
                "sector size {sector_bytes} (must be a power of two from 512 to 65536)"
            )));
        }
        let bytes = capacity_sectors
            .checked_mul(sector_bytes as u64)
            .filter(|&b| b > 0 && b <= isize::MAX as u64)
            .ok_or_else(|| {
                DeviceError::Unsupported(format!(
                    "capacity of {capacity_sectors} sectors of {sector_bytes} bytes"
                ))
            })?;
        Ok(Self {
            info: DeviceInfo {
                sector_bytes,
                capacity_sectors,
                payload_unit_bytes: sector_bytes,
                tag_bytes_per_sector: 0,
                max_queue_depth: 1024,
                max_transfer_sectors: (16 << 20) / sector_bytes,
            },
            chunks: vec![None; (bytes as usize).div_ceil(CHUNK_BYTES)],
            latency_ns: 0,
        })
    }

    /// Every command completes `latency_ns` after it was submitted.
    pub fn with_latency_ns(mut self, latency_ns: u64) -> Self {
        self.latency_ns = latency_ns;
        self
    }

    /// Visits the byte ranges of `offset..offset + len` chunk by chunk.
    fn for_each_piece(offset: usize, len: usize, mut f: impl FnMut(usize, usize, usize, usize)) {
        let mut done = 0;
        while done < len {
            let at = offset + done;
            let chunk = at / CHUNK_BYTES;
            let within = at % CHUNK_BYTES;
            let n = (CHUNK_BYTES - within).min(len - done);
            f(chunk, within, done, n);
            done += n;
        }
    }
}

impl BlockDevice for MemDevice {
    fn info(&self) -> DeviceInfo {
        self.info
    }

    /// A trim zeroes the sectors in memory, and nothing outlives the process anyway.
    fn trim_is_durable(&self) -> bool {
        true
    }

    fn submit(
        &mut self,
        now_ns: TimeNs,
        cmd: &Command<'_>,
        out: ReadBuffers<'_>,
    ) -> Result<Completion, DeviceError> {
        validate_command(&self.info, cmd, &out)?;
        let sector = self.info.sector_bytes as usize;
        let offset = cmd.lba as usize * sector;
        let len = cmd.sectors as usize * sector;
        let chunks = &mut self.chunks;
        match cmd.opcode {
            Opcode::Read => Self::for_each_piece(offset, len, |c, within, at, n| {
                let dst = &mut out.data[at..at + n];
                match &chunks[c] {
                    Some(buf) => dst.copy_from_slice(&buf[within..within + n]),
                    None => dst.fill(0),
                }
            }),
            Opcode::Write => Self::for_each_piece(offset, len, |c, within, at, n| {
                let buf = chunks[c].get_or_insert_with(|| vec![0u8; CHUNK_BYTES].into());
                buf[within..within + n].copy_from_slice(&cmd.data[at..at + n]);
            }),
            Opcode::Trim => Self::for_each_piece(offset, len, |c, within, _, n| {
                if n == CHUNK_BYTES {
                    chunks[c] = None;
                } else if let Some(buf) = &mut chunks[c] {
                    buf[within..within + n].fill(0);
                }
            }),
            Opcode::Flush => {}
        }
        Ok(Completion {
            done_ns: now_ns + self.latency_ns,
            gc_active: false,
        })
    }

    fn background(&mut self, _now_ns: TimeNs) -> Option<TimeNs> {
        None
    }
}
