//! The seam every engine is written against: a block device takes commands and tells when
//! each completes. The emulated SSD implements it here; file-backed devices and arrays of
//! devices implement it too, so the same engine and test bodies run over any of them.

use afa_nand::MediaFaults;
use afa_sim::TimeNs;

/// A host command's operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Opcode {
    Read,
    Write,
    /// Deallocate: trimmed sectors read back as zeroes.
    Trim,
    /// Make every completed write durable (drains the write buffer).
    Flush,
}

/// Per-command flags (NVMe-like extensions included).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommandFlags {
    /// Force unit access: the write completes only once it is on flash.
    pub fua: bool,
    /// The data is a transient replica that will be invalidated soon (ScalaAFA §5.5).
    pub transient: bool,
}

/// One host command. `data` holds the payload of a write (one unit per sector: nothing in
/// `none` mode, 8 bytes in `token` mode, the whole sector in `full` mode); `tags` optionally
/// holds per-sector OOB tag bytes, stored in the same program operation as the data.
#[derive(Debug, Clone, Copy)]
pub struct Command<'a> {
    pub opcode: Opcode,
    pub lba: u64,
    pub sectors: u32,
    pub data: &'a [u8],
    pub tags: Option<&'a [u8]>,
    pub flags: CommandFlags,
}

impl<'a> Command<'a> {
    pub fn read(lba: u64, sectors: u32) -> Self {
        Self {
            opcode: Opcode::Read,
            lba,
            sectors,
            data: &[],
            tags: None,
            flags: CommandFlags::default(),
        }
    }
    pub fn write(lba: u64, sectors: u32, data: &'a [u8]) -> Self {
        Self {
            opcode: Opcode::Write,
            lba,
            sectors,
            data,
            tags: None,
            flags: CommandFlags::default(),
        }
    }
    pub fn trim(lba: u64, sectors: u32) -> Self {
        Self {
            opcode: Opcode::Trim,
            ..Self::read(lba, sectors)
        }
    }
    pub fn flush() -> Self {
        Self {
            opcode: Opcode::Flush,
            ..Self::read(0, 0)
        }
    }
}

/// Where a read's results go: payload units, and optionally the sectors' tags.
#[derive(Debug)]
pub struct ReadBuffers<'a> {
    pub data: &'a mut [u8],
    pub tags: Option<&'a mut [u8]>,
}

impl ReadBuffers<'static> {
    /// No buffers: for commands that return no data (write, trim, flush).
    pub fn none() -> Self {
        Self {
            data: &mut [],
            tags: None,
        }
    }
}

/// What the device reports when a command completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    pub done_ns: TimeNs,
    /// Garbage collection was running in the device while this command was served; an
    /// array engine may steer later I/O away from it (ScalaAFA reads replicas then).
    pub gc_active: bool,
}

/// Host-side work an engine did since the last [`BlockDevice::take_host_work`] call: what
/// a host CPU model charges time for. Engines count it as they work, so that the same engine
/// code is timed by whichever host (kernel or user-space stack, one thread or many) runs it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostWork {
    /// Chunks the engine's logic handled for user requests (map lookups, allocation, stripe
    /// bookkeeping).
    pub chunks: u64,
    /// Commands sent to devices for user requests.
    pub member_commands: u64,
    /// Bytes of data the host ran through the parity code for user requests.
    pub parity_bytes: u64,
    /// Background work (conversion, cleaning, rebuild): commands sent to devices.
    pub background_commands: u64,
    /// Background work: bytes moved through host memory (read into and written from host
    /// buffers).
    pub background_bytes: u64,
    /// Background work: bytes of data run through the parity code.
    pub background_parity_bytes: u64,
    /// Messages the engine's I/O threads exchanged with a space manager (ScalaAFA §5.2:
    /// requests for heroes, grants, returns, recalls); each costs the thread a send or a
    /// receive.
    pub messages: u64,
}

impl HostWork {
    /// Adds `other` into `self`.
    pub fn add(&mut self, other: &HostWork) {
        self.chunks += other.chunks;
        self.member_commands += other.member_commands;
        self.parity_bytes += other.parity_bytes;
        self.background_commands += other.background_commands;
        self.background_bytes += other.background_bytes;
        self.background_parity_bytes += other.background_parity_bytes;
        self.messages += other.messages;
    }
}

/// Which parity a `convert` command computes: row `row` of the (k, `of`) erasure code the
/// array uses (ScalaAFA §5.3's *Ptype*: the row of the encoding matrix). `of` = 1 is XOR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParityType {
    pub row: u8,
    pub of: u8,
}

/// ScalaAFA's extended NVMe command (§5.3): the device reads `k` chunks of `chunk_sectors`
/// each, laid out back to back from `src_lba` (a vertical hero), into its DRAM, computes one
/// parity chunk over their data and OOB tags with its XOR/RS engine, writes it (data and
/// tags) at `dst_lba`, and deallocates the source chunks if `trim_source`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvertCommand {
    pub src_lba: u64,
    pub dst_lba: u64,
    pub chunk_sectors: u32,
    pub k: u8,
    pub parity: ParityType,
    /// Deallocate the source once the parity is written (§5.3). An array whose members sit
    /// behind a volatile cache, with a member lost, clears it for a stripe that may hold
    /// flushed data: the deallocation could reach the medium before the parity does, and a
    /// host crash would then leave the lost member's chunks in neither, so the array trims
    /// the source itself after a flush.
    pub trim_source: bool,
}

/// Static facts about a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceInfo {
    pub sector_bytes: u32,
    pub capacity_sectors: u64,
    /// Bytes of payload per sector in the device's payload mode (0, 8 or sector_bytes).
    pub payload_unit_bytes: u32,
    /// OOB tag bytes the device can keep per sector.
    pub tag_bytes_per_sector: u32,
    pub max_queue_depth: u32,
    pub max_transfer_sectors: u32,
}

/// Why a device refused or failed a command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    #[error("command for sectors {lba}..{end} lies outside the device's {capacity} sectors", end = lba + *sectors as u64)]
    OutOfRange {
        lba: u64,
        sectors: u32,
        capacity: u64,
    },
    #[error("command of {sectors} sectors exceeds the device's maximum transfer of {max} sectors")]
    TooLarge { sectors: u32, max: u32 },
    #[error("command carries {got} payload bytes but {expected} were expected")]
    PayloadLength { expected: usize, got: usize },
    #[error(
        "command carries {got} tag bytes but {expected} were expected ({per_sector} per sector)"
    )]
    TagLength {
        expected: usize,
        got: usize,
        per_sector: u32,
    },
    #[error("the device is out of space: no block can be reclaimed in plane {plane}")]
    NoSpace { plane: u32 },
    /// A volume built over devices (an array engine, an FTL that is not plane-based) has
    /// no room left where its own layout needs it; the text says where.
    #[error("the volume is out of space: {0}")]
    VolumeFull(String),
    #[error("the device has failed")]
    Failed,
    /// A read the controller's ECC could not correct (the data of these sectors could not be
    /// returned this time); the device itself still works.
    #[error("sectors {lba}..{end} could not be read: the controller's ECC could not correct them", end = lba + *sectors as u64)]
    Uncorrectable { lba: u64, sectors: u32 },
    #[error("command not supported: {0}")]
    Unsupported(String),
    /// The device takes reads only (it came up without room to write); the text says why.
    #[error("the device is read-only: {0}")]
    ReadOnly(String),
    /// The device's backing medium failed or returned something it did not write (an I/O
    /// error of an image file, a stored version that does not match the device's map).
    #[error("the device's medium failed: {0}")]
    Medium(String),
}

/// A device that takes commands and computes when each completes.
///
/// `submit` applies the command's effect on the device state at once (so a later command
/// observes it) and returns the virtual time at which the host sees the completion. The
/// caller must not have more than `info().max_queue_depth` commands outstanding.
pub trait BlockDevice {
    fn info(&self) -> DeviceInfo;

    fn submit(
        &mut self,
        now_ns: TimeNs,
        cmd: &Command<'_>,
        out: ReadBuffers<'_>,
    ) -> Result<Completion, DeviceError>;

    /// A hint that a command touching `lba` will come soon, so the device can start
    /// fetching the metadata it will need. `stage` 0 is the earliest hint (the request after
    /// next), stage 1 the next request. It never changes the device state or timing; a
    /// simulator uses it to overlap the cache misses of consecutive requests.
    fn prefetch(&self, _lba: u64, _stage: u8) {}

    /// Gives the device a chance to do idle-time work (background GC) at `now_ns`, when the
    /// host has nothing outstanding. Returns when it would like to be called again.
    fn background(&mut self, now_ns: TimeNs) -> Option<TimeNs>;

    /// Whether a TRIM is as durable as a write of zeroes: once a flush after it completes,
    /// the trimmed sectors read back as zeroes even after a power loss. TRIM itself promises
    /// no more than that the data may go, and engines that rebuild their map from what the
    /// media hold (OOB tags, segment summaries) can bring trimmed data back after a crash; a
    /// server that would answer a WRITE_ZEROES with a TRIM writes zeroes to those instead.
    fn trim_is_durable(&self) -> bool {
        false
    }

    /// Which of the `sectors` sectors from `lba` hold data, as runs of (sectors, allocated)
    /// that cover them in order. A sector that is not allocated (never written, or
    /// trimmed) reads back as zeroes. `None` when the device cannot tell; every sector then
    /// counts as allocated, which is always a correct answer (NBD's block status reports
    /// it so).
    fn allocation(&self, _lba: u64, _sectors: u32) -> Option<Vec<(u32, bool)>> {
        None
    }

    /// Returns and resets the host-side work done since the last call. A plain device does
    /// no host work of its own beyond the commands it was sent, which it counts as one
    /// member command each.
    fn take_host_work(&mut self) -> HostWork {
        HostWork::default()
    }

    /// Runs a ScalaAFA conversion inside the device ([`ConvertCommand`]). Devices without a
    /// conversion engine refuse it.
    fn convert(
        &mut self,
        _now_ns: TimeNs,
        _cmd: &ConvertCommand,
    ) -> Result<Completion, DeviceError> {
        Err(DeviceError::Unsupported(
            "convert (the device has no conversion engine)".into(),
        ))
    }

    /// Host-tag bytes of the sectors `lba..lba + sectors` as they are on the medium now,
    /// without timing: the out-of-band scan of recovery (ScalaAFA §5.4), which reads OOB
    /// areas only. Devices without tags return `None`.
    fn scan_tags(&self, _lba: u64, _sectors: u32) -> Option<Vec<u8>> {
        None
    }

    /// The device's queued interface, for a device that cannot say when a command completes
    /// as it takes it ([`QueuedDevice`]); `None` for the devices that can. A host that gets
    /// one starts its commands through it instead of `submit`.
    fn queued(&mut self) -> Option<&mut dyn QueuedDevice> {
        None
    }

    /// The bad blocks and failed programs and erases of the flash behind the device (an
    /// array sums its members'), so that an error such as running out of space can name
    /// them. Devices without flash of their own report none.
    fn media_faults(&self) -> MediaFaults {
        MediaFaults::default()
    }
}

/// Appends `sectors` sectors of one allocation state to runs of (sectors, allocated),
/// merging with the last run when it has the same state.
pub fn push_allocation_run(runs: &mut Vec<(u32, bool)>, sectors: u32, allocated: bool) {
    match runs.last_mut() {
        Some((n, a)) if *a == allocated => *n += sectors,
        _ if sectors > 0 => runs.push((sectors, allocated)),
        _ => {}
    }
}

/// A command a [`QueuedDevice`] completed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedCompletion {
    /// The caller's tag of the command.
    pub tag: u64,
    pub done_ns: TimeNs,
    /// The payload units read (empty for other commands), or why the command failed.
    pub result: Result<Vec<u8>, DeviceError>,
}

/// A device whose completion times depend on what is submitted after a command: an
/// event-driven controller (OX's write contexts, log writer and GC share its cores, dies and
/// link), which learns when a command completes only by running. The host starts commands
/// at its clock and moves the device's clock forward; completions come back as the device's
/// clock passes them, so the host can keep many commands in flight.
pub trait QueuedDevice {
    /// Starts `cmd` at `now_ns`, at or after every time the device has been moved to. Bad
    /// input is refused at once; a failure found later comes back in the completion.
    fn start(&mut self, now_ns: TimeNs, cmd: &Command<'_>, tag: u64) -> Result<(), DeviceError>;
    /// When the device next has something to do or to deliver, if anything.
    fn next_event_ns(&self) -> Option<TimeNs>;
    /// Runs the device up to `t_ns` and returns the commands completed by then, in order.
    fn advance_to(&mut self, t_ns: TimeNs) -> Vec<QueuedCompletion>;
}

/// A borrowed device is a device, so wrappers (the host CPU model, monitors) can sit in front
/// of an engine the caller keeps owning.
impl<T: BlockDevice + ?Sized> BlockDevice for &mut T {
    fn info(&self) -> DeviceInfo {
        (**self).info()
    }
    fn submit(
        &mut self,
        now_ns: TimeNs,
        cmd: &Command<'_>,
        out: ReadBuffers<'_>,
    ) -> Result<Completion, DeviceError> {
        (**self).submit(now_ns, cmd, out)
    }
    fn prefetch(&self, lba: u64, stage: u8) {
        (**self).prefetch(lba, stage)
    }
    fn background(&mut self, now_ns: TimeNs) -> Option<TimeNs> {
        (**self).background(now_ns)
    }
    fn take_host_work(&mut self) -> HostWork {
        (**self).take_host_work()
    }
    fn convert(&mut self, now_ns: TimeNs, cmd: &ConvertCommand) -> Result<Completion, DeviceError> {
        (**self).convert(now_ns, cmd)
    }
    fn scan_tags(&self, lba: u64, sectors: u32) -> Option<Vec<u8>> {
        (**self).scan_tags(lba, sectors)
    }
    fn trim_is_durable(&self) -> bool {
        (**self).trim_is_durable()
    }
    fn allocation(&self, lba: u64, sectors: u32) -> Option<Vec<(u32, bool)>> {
        (**self).allocation(lba, sectors)
    }
    fn queued(&mut self) -> Option<&mut dyn QueuedDevice> {
        (**self).queued()
    }
    fn media_faults(&self) -> MediaFaults {
        (**self).media_faults()
    }
}

/// Checks a conversion command against a device's facts (k and the chunk size positive,
/// the parity row one of the code's rows, source and destination inside the device) and
/// returns the codec that computes its parity row.
pub fn validate_convert(
    info: &DeviceInfo,
    cmd: &ConvertCommand,
) -> Result<Box<dyn afa_parity::ErasureCodec>, DeviceError> {
    let (k, cs) = (cmd.k as u32, cmd.chunk_sectors);
    let bad = |what: String| DeviceError::Unsupported(format!("convert: {what}"));
    if k == 0 || cs == 0 {
        return Err(bad(format!(
            "k = {k} and chunk_sectors = {cs} must be positive"
        )));
    }
    if cmd.parity.of == 0 || cmd.parity.row >= cmd.parity.of {
        return Err(bad(format!(
            "parity row {} of {} parity chunks does not exist",
            cmd.parity.row, cmd.parity.of
        )));
    }
    let source = k
        .checked_mul(cs)
        .ok_or_else(|| bad(format!("{k} chunks of {cs} sectors overflow")))?;
    let capacity = info.capacity_sectors;
    for (lba, sectors) in [(cmd.src_lba, source), (cmd.dst_lba, cs)] {
        if lba.checked_add(sectors as u64).is_none_or(|e| e > capacity) {
            return Err(DeviceError::OutOfRange {
                lba,
                sectors,
                capacity,
            });
        }
    }
    afa_parity::codec(k as usize, cmd.parity.of as usize).map_err(|e| bad(e.to_string()))
}

/// Checks a command's range, size and payload lengths (the write's data, or the read
/// buffer `out` that must take the read's data) against a device's facts.
pub fn validate_command(
    info: &DeviceInfo,
    cmd: &Command<'_>,
    out: &ReadBuffers<'_>,
) -> Result<(), DeviceError> {
    if cmd.opcode == Opcode::Flush {
        return Ok(());
    }
    let end = cmd.lba.checked_add(cmd.sectors as u64);
    if cmd.sectors == 0 || end.is_none_or(|e| e > info.capacity_sectors) {
        return Err(DeviceError::OutOfRange {
            lba: cmd.lba,
            sectors: cmd.sectors,
            capacity: info.capacity_sectors,
        });
    }
    if cmd.sectors > info.max_transfer_sectors && cmd.opcode != Opcode::Trim {
        return Err(DeviceError::TooLarge {
            sectors: cmd.sectors,
            max: info.max_transfer_sectors,
        });
    }
    if cmd.opcode == Opcode::Read {
        let expected = cmd.sectors as usize * info.payload_unit_bytes as usize;
        if out.data.len() != expected {
            return Err(DeviceError::PayloadLength {
                expected,
                got: out.data.len(),
            });
        }
    }
    if cmd.opcode == Opcode::Write {
        let expected = cmd.sectors as usize * info.payload_unit_bytes as usize;
        if cmd.data.len() != expected {
            return Err(DeviceError::PayloadLength {
                expected,
                got: cmd.data.len(),
            });
        }
        if let Some(tags) = cmd.tags {
            let expected = cmd.sectors as usize * info.tag_bytes_per_sector as usize;
            if tags.len() != expected {
                return Err(DeviceError::TagLength {
                    expected,
                    got: tags.len(),
                    per_sector: info.tag_bytes_per_sector,
                });
            }
        }
    }
    Ok(())
}
