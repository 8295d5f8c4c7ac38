//! Transformations applied to a trace before it is replayed: scaling time, selecting and
//! laying out volumes, and wrapping addresses into a device.
//!
//! They are applied in that order by [`TraceTransform::apply`]:
//!
//! 1. **Time.** Every timestamp is multiplied by `time_scale` (0.5 replays twice as fast).
//! 2. **Volumes.** When `volumes` lists volume numbers, only their requests are kept and the
//!    i-th listed volume is placed at `i × stride` bytes of one merged volume 0, where the
//!    stride is `volume_stride_bytes` or, by default, the largest end offset among the kept
//!    volumes rounded up to 1 MiB, so that the volumes lie side by side without overlap.
//!    When `volumes` is empty the volumes are left as they are (a replay then overlays them).
//! 3. **Wrap.** When `wrap_bytes` is set, offsets are taken modulo that capacity and both
//!    ends are rounded outwards to `align_bytes`; a request that would cross the end is moved
//!    back to end there, and one longer than the capacity is cut to it. (The host applies the
//!    same wrap when it replays a trace on a smaller device; this makes it explicit, e.g. for
//!    `afa trace convert`.)

use super::TraceRecord;
use crate::IoOp;

/// What to do to a trace; the default changes nothing.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceTransform {
    pub time_scale: f64,
    pub volumes: Vec<u32>,
    pub volume_stride_bytes: Option<u64>,
    pub wrap_bytes: Option<u64>,
    pub align_bytes: u64,
}

impl Default for TraceTransform {
    fn default() -> Self {
        TraceTransform {
            time_scale: 1.0,
            volumes: Vec::new(),
            volume_stride_bytes: None,
            wrap_bytes: None,
            align_bytes: 512,
        }
    }
}

const MIB: u64 = 1 << 20;

impl TraceTransform {
    /// Checks the parameters, naming the first bad one.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.time_scale.is_finite() && self.time_scale >= 0.0) {
            return Err(format!(
                "time scale {} is not a non-negative number",
                self.time_scale
            ));
        }
        if self.align_bytes == 0 {
            return Err("alignment must be at least one byte".to_string());
        }
        if let Some(stride) = self.volume_stride_bytes {
            if stride == 0 || stride % self.align_bytes != 0 {
                return Err(format!(
                    "volume stride {stride} bytes is not a positive multiple of {} bytes",
                    self.align_bytes
                ));
            }
        }
        if let Some(capacity) = self.wrap_bytes {
            if capacity == 0 || capacity % self.align_bytes != 0 {
                return Err(format!(
                    "wrap capacity {capacity} bytes is not a positive multiple of {} bytes",
                    self.align_bytes
                ));
            }
        }
        for (index, volume) in self.volumes.iter().enumerate() {
            if self.volumes[..index].contains(volume) {
                return Err(format!("volume {volume} is listed twice"));
            }
        }
        Ok(())
    }

    /// Applies the transformation; fails when [`TraceTransform::validate`] does, or when a
    /// remapped offset would overflow.
    pub fn apply(&self, records: Vec<TraceRecord>) -> Result<Vec<TraceRecord>, String> {
        self.validate()?;
        let mut records = records;
        if self.time_scale != 1.0 {
            for record in &mut records {
                // The cast saturates, so absurd scales cannot wrap around.
                record.timestamp_ns = (record.timestamp_ns as f64 * self.time_scale) as u64;
            }
        }
        if !self.volumes.is_empty() {
            records.retain(|record| self.volumes.contains(&record.volume));
            let stride = match self.volume_stride_bytes {
                Some(stride) => stride,
                None => {
                    let end = records
                        .iter()
                        .map(|r| r.offset_bytes.saturating_add(r.len_bytes))
                        .max()
                        .unwrap_or(0);
                    end.div_ceil(MIB).max(1).saturating_mul(MIB)
                }
            };
            for record in &mut records {
                let position = self
                    .volumes
                    .iter()
                    .position(|volume| *volume == record.volume)
                    .unwrap_or(0) as u64;
                let base = position.checked_mul(stride);
                record.offset_bytes = base
                    .and_then(|base| base.checked_add(record.offset_bytes))
                    .filter(|offset| offset.checked_add(record.len_bytes).is_some())
                    .ok_or_else(|| {
                        format!(
                            "volume {} placed at {position} × {stride} bytes overflows",
                            record.volume
                        )
                    })?;
                record.volume = 0;
            }
        }
        if let Some(capacity) = self.wrap_bytes {
            for record in &mut records {
                *record = wrap(*record, capacity, self.align_bytes);
            }
        }
        Ok(records)
    }
}

/// Maps one request into `capacity` bytes, as [`TraceTransform`] describes.
fn wrap(record: TraceRecord, capacity: u64, align: u64) -> TraceRecord {
    if record.op == IoOp::Flush {
        return TraceRecord {
            offset_bytes: 0,
            len_bytes: 0,
            ..record
        };
    }
    let start = record.offset_bytes / align * align;
    let end = record
        .offset_bytes
        .saturating_add(record.len_bytes.max(1))
        .div_ceil(align)
        .saturating_mul(align);
    let len = (end - start).min(capacity);
    let offset = start % capacity;
    let offset = if offset + len > capacity {
        capacity - len
    } else {
        offset
    };
    TraceRecord {
        offset_bytes: offset,
        len_bytes: len,
        ..record
    }
}
