//! A file-backed device: one plain file holds every sector, so a volume survives the
//! process. Optionally an emulated device (payload `none`) times each command, so a file
//! member still behaves like the modelled SSD while its bytes live on the host's disk.
//!
//! Durability: every write goes to the file with `pwrite` before it is acknowledged (there
//! is no cache in the server), so a crash of the server process (kill -9) loses nothing
//! that was acknowledged; FLUSH calls `fdatasync`, so a flushed write also survives a crash
//! of the host.
//!
//! OOB tags: engines that recover from per-sector metadata (ScalaAFA's OOB scan) need the
//! tags an SSD programs with each sector to survive too. With `tag_bytes_per_sector > 0`
//! they live in a sidecar file beside the member (`NAME.tags`, that many bytes per sector),
//! and mean what they mean on the emulated SSD: a write stores its tags (zeroes when it
//! carries none), a trim zeroes them, a read returns them. An SSD programs data and OOB in
//! one operation; two files cannot be written atomically, so the tags are written after
//! the data and act as its commit: a crash between the two leaves new data under the old
//! tags, which describe an older, already superseded write, never new tags over old data.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use afa_sim::TimeNs;
use afa_ssd::{
    push_allocation_run, validate_command, validate_convert, BlockDevice, Command, Completion,
    ConvertCommand, DeviceError, DeviceInfo, Opcode, ReadBuffers,
};
use rustix::fs::{fallocate, seek, FallocateFlags, SeekFrom};

/// Why a file-backed device could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum FileDeviceError {
    #[error("cannot open {path}: {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("{path} is {actual} bytes but this volume needs {expected} bytes per member; it was created for another configuration")]
    SizeMismatch {
        path: PathBuf,
        actual: u64,
        expected: u64,
    },
    #[error("the timing model for {path} has {model_sectors} sectors of {model_sector_bytes} bytes, and the file {sectors} of {sector_bytes}: the model must have sectors of the file's size and at least as many")]
    TimingMismatch {
        path: PathBuf,
        model_sectors: u64,
        model_sector_bytes: u32,
        sectors: u64,
        sector_bytes: u32,
    },
    #[error("the timing model for {path} stores {unit_bytes} payload bytes per sector; it must use payload \"none\" (the file holds the data)")]
    TimingStoresData { path: PathBuf, unit_bytes: u32 },
    #[error("sector size {0} must be a power of two of at least 512")]
    SectorSize(u32),
}

/// A device whose sectors live in a plain file.
pub struct FileDevice {
    file: File,
    path: PathBuf,
    /// The sidecar file of OOB tags, when the device keeps tags.
    tags: Option<File>,
    info: DeviceInfo,
    timing: Option<Box<dyn BlockDevice + Send>>,
    /// Cleared when the file system cannot punch holes; trims then write zeroes.
    punch_holes: bool,
}

impl std::fmt::Debug for FileDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileDevice")
            .field("path", &self.path)
            .field("info", &self.info)
            .field("timed", &self.timing.is_some())
            .field("tags", &self.tags.is_some())
            .finish()
    }
}

impl FileDevice {
    /// Opens (or creates, sparse) the file at `path` for `capacity_sectors` sectors of
    /// `sector_bytes`. An existing file must have exactly that size. `timing`, if given,
    /// times every command and must have the same shape and store no payload.
    pub fn open(
        path: &Path,
        sector_bytes: u32,
        capacity_sectors: u64,
        timing: Option<Box<dyn BlockDevice + Send>>,
    ) -> Result<Self, FileDeviceError> {
        Self::open_with_tags(path, sector_bytes, capacity_sectors, 0, timing)
    }

    /// As [`FileDevice::open`], and keeps `tag_bytes_per_sector` bytes of OOB tags per
    /// sector in the sidecar file `path` + `.tags` (none when 0).
    pub fn open_with_tags(
        path: &Path,
        sector_bytes: u32,
        capacity_sectors: u64,
        tag_bytes_per_sector: u32,
        timing: Option<Box<dyn BlockDevice + Send>>,
    ) -> Result<Self, FileDeviceError> {
        if !sector_bytes.is_power_of_two() || sector_bytes < 512 {
            return Err(FileDeviceError::SectorSize(sector_bytes));
        }
        let file = open_sized(path, capacity_sectors * sector_bytes as u64)?;
        let tags = match tag_bytes_per_sector {
            0 => None,
            n => Some(open_sized(&tags_path(path), capacity_sectors * n as u64)?),
        };
        let mut info = DeviceInfo {
            sector_bytes,
            capacity_sectors,
            payload_unit_bytes: sector_bytes,
            tag_bytes_per_sector,
            max_queue_depth: 1024,
            max_transfer_sectors: (16 << 20) / sector_bytes,
        };
        if let Some(model) = &timing {
            let m = model.info();
            // A model larger than the file is fine: an array's members differ in size (their
            // factory bad blocks differ) and each file holds what the smallest exports.
            if m.capacity_sectors < capacity_sectors || m.sector_bytes != sector_bytes {
                return Err(FileDeviceError::TimingMismatch {
                    path: path.to_path_buf(),
                    model_sectors: m.capacity_sectors,
                    model_sector_bytes: m.sector_bytes,
                    sectors: capacity_sectors,
                    sector_bytes,
                });
            }
            if m.payload_unit_bytes != 0 {
                return Err(FileDeviceError::TimingStoresData {
                    path: path.to_path_buf(),
                    unit_bytes: m.payload_unit_bytes,
                });
            }
            info.max_queue_depth = m.max_queue_depth;
            info.max_transfer_sectors = m.max_transfer_sectors;
        }
        Ok(Self {
            file,
            path: path.to_path_buf(),
            tags,
            info,
            timing,
            punch_holes: true,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Makes the data, then the tags, durable.
    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()?;
        match &self.tags {
            Some(file) => file.sync_data(),
            None => Ok(()),
        }
    }

    /// Applies a validated command to the files (no timing).
    fn file_io(&mut self, cmd: &Command<'_>, out: &mut ReadBuffers<'_>) -> Result<(), DeviceError> {
        let sector = self.info.sector_bytes as u64;
        let offset = cmd.lba * sector;
        let len = cmd.sectors as u64 * sector;
        let tag = self.info.tag_bytes_per_sector as u64;
        let (tag_offset, tag_len) = (cmd.lba * tag, cmd.sectors as u64 * tag);
        match cmd.opcode {
            Opcode::Read => {
                let read = self.file.read_exact_at(&mut *out.data, offset);
                let read = read.and_then(|()| match (&self.tags, out.tags.as_deref_mut()) {
                    (Some(file), Some(t)) => file.read_exact_at(t, tag_offset),
                    _ => Ok(()),
                });
                read.map_err(|e| self.io_failed("read", &e))
            }
            Opcode::Write => {
                // Data first, then its tags: the tags are the write's commit (module doc).
                let written = self.file.write_all_at(cmd.data, offset);
                let written = written.and_then(|()| match (&self.tags, cmd.tags) {
                    (Some(file), Some(t)) => file.write_all_at(t, tag_offset),
                    (Some(file), None) => write_zeroes(file, tag_offset, tag_len),
                    _ => Ok(()),
                });
                let synced =
                    written.and_then(|()| if cmd.flags.fua { self.sync() } else { Ok(()) });
                synced.map_err(|e| self.io_failed("write", &e))
            }
            Opcode::Trim => {
                let trimmed = self.trim(offset, len).and_then(|()| match &self.tags {
                    Some(file) => write_zeroes(file, tag_offset, tag_len),
                    None => Ok(()),
                });
                trimmed.map_err(|e| self.io_failed("trim", &e))
            }
            Opcode::Flush => self.sync().map_err(|e| self.io_failed("fdatasync", &e)),
        }
    }

    fn io_failed(&self, what: &str, e: &io::Error) -> DeviceError {
        // The seam's error enum has no room for the cause, so it is logged here.
        crate::log(&format!("{what} on {} failed: {e}", self.path.display()));
        DeviceError::Failed
    }

    fn trim(&mut self, offset: u64, len: u64) -> io::Result<()> {
        if self.punch_holes {
            match fallocate(
                &self.file,
                FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
                offset,
                len,
            ) {
                Ok(()) => return Ok(()),
                Err(e) if e == rustix::io::Errno::OPNOTSUPP || e == rustix::io::Errno::NOSYS => {
                    self.punch_holes = false;
                }
                Err(e) => return Err(e.into()),
            }
        }
        // Trimmed sectors must read back as zeroes, so without hole punching they are
        // written with zeroes.
        write_zeroes(&self.file, offset, len)
    }
}

/// The sidecar file of a member's OOB tags.
pub fn tags_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".tags");
    PathBuf::from(name)
}

/// Opens (or creates, sparse and durably) a file of exactly `expected` bytes.
fn open_sized(path: &Path, expected: u64) -> Result<File, FileDeviceError> {
    let open_err = |source| FileDeviceError::Open {
        path: path.to_path_buf(),
        source,
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(open_err)?;
    let actual = file.metadata().map_err(open_err)?.len();
    if actual == 0 {
        file.set_len(expected).map_err(open_err)?;
        file.sync_all().map_err(open_err)?;
        // The new file's directory entry must be durable too.
        if let Some(dir) = path.parent() {
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            };
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(open_err)?;
        }
    } else if actual != expected {
        return Err(FileDeviceError::SizeMismatch {
            path: path.to_path_buf(),
            actual,
            expected,
        });
    }
    Ok(file)
}

/// Writes `len` zero bytes at `offset`, a megabyte at a time.
fn write_zeroes(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let zeros = vec![0u8; len.min(1 << 20) as usize];
    let mut at = offset;
    while at < offset + len {
        let n = (offset + len - at).min(zeros.len() as u64) as usize;
        file.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

impl BlockDevice for FileDevice {
    fn info(&self) -> DeviceInfo {
        self.info
    }

    /// A trim punches a hole in the file (or writes zeroes into it), which the flush's
    /// fsync makes as durable as a write.
    fn trim_is_durable(&self) -> bool {
        true
    }

    /// The file's holes (`SEEK_DATA` / `SEEK_HOLE`): sectors never written, or trimmed
    /// where the file system punches holes, read as zeroes. A sector only partly in a hole
    /// counts as allocated. A file system without hole tracking reports all data, which is
    /// still a correct answer.
    fn allocation(&self, lba: u64, sectors: u32) -> Option<Vec<(u32, bool)>> {
        let sector = self.info.sector_bytes as u64;
        let end_sector = lba.checked_add(sectors as u64)?;
        if end_sector > self.info.capacity_sectors {
            return None;
        }
        let mut runs = Vec::new();
        let mut at = lba;
        while at < end_sector {
            // The first byte of data at or after `at`; none means a hole to the end.
            let data_byte = match seek(&self.file, SeekFrom::Data(at * sector)) {
                Ok(byte) => byte,
                Err(e) if e == rustix::io::Errno::NXIO => end_sector * sector,
                Err(_) => return None,
            };
            let data_sector = (data_byte / sector).clamp(at, end_sector);
            push_allocation_run(&mut runs, (data_sector - at) as u32, false);
            at = data_sector;
            if at >= end_sector {
                break;
            }
            let hole_byte = match seek(&self.file, SeekFrom::Hole(at * sector)) {
                Ok(byte) => byte,
                Err(_) => return None,
            };
            let hole_sector = hole_byte.div_ceil(sector).clamp(at + 1, end_sector);
            push_allocation_run(&mut runs, (hole_sector - at) as u32, true);
            at = hole_sector;
        }
        Some(runs)
    }

    fn submit(
        &mut self,
        now_ns: TimeNs,
        cmd: &Command<'_>,
        out: ReadBuffers<'_>,
    ) -> Result<Completion, DeviceError> {
        validate_command(&self.info, cmd, &out)?;
        let mut out = out;
        self.file_io(cmd, &mut out)?;
        let completion = match &mut self.timing {
            Some(model) => {
                let timed = Command {
                    data: &[],
                    tags: None,
                    ..*cmd
                };
                model.submit(now_ns, &timed, ReadBuffers::none())?
            }
            None => Completion {
                done_ns: now_ns,
                gc_active: false,
            },
        };
        Ok(completion)
    }

    fn background(&mut self, now_ns: TimeNs) -> Option<TimeNs> {
        self.timing.as_mut().and_then(|m| m.background(now_ns))
    }

    /// ScalaAFA's conversion (§5.3) done by the file device itself, as an SSD's XOR engine
    /// would: the vertical hero's k chunks and their tags are read from the files, parity
    /// row `cmd.parity.row` is computed over both, and the parity is written at the
    /// destination (data, then tags) before the source is trimmed. A crash before the trim
    /// leaves both the parity and the replicas, which recovery reads as a converted stripe;
    /// a crash before the parity's tags leaves tags that do not match the data's parity,
    /// which recovery reads as a stripe still in replication. The timing model, when there
    /// is one, times the same command.
    fn convert(&mut self, now_ns: TimeNs, cmd: &ConvertCommand) -> Result<Completion, DeviceError> {
        let codec = validate_convert(&self.info, cmd)?;
        let (k, cs) = (cmd.k as u32, cmd.chunk_sectors);
        let bad = |what: String| DeviceError::Unsupported(format!("convert: {what}"));
        let source = k * cs;
        let tag = self.info.tag_bytes_per_sector as usize;
        let chunk_bytes = cs as usize * self.info.sector_bytes as usize;
        let mut data = vec![0u8; k as usize * chunk_bytes];
        let mut tags = vec![0u8; k as usize * cs as usize * tag];
        let mut out = ReadBuffers {
            data: &mut data,
            tags: (tag > 0).then_some(&mut tags[..]),
        };
        self.file_io(&Command::read(cmd.src_lba, source), &mut out)?;
        let encode = |all: &[u8], out: &mut [u8]| -> Result<(), DeviceError> {
            if out.is_empty() {
                return Ok(());
            }
            let refs: Vec<&[u8]> = all.chunks(out.len()).collect();
            codec
                .encode_row(cmd.parity.row as usize, &refs, out)
                .map_err(|e| bad(e.to_string()))
        };
        let mut parity = vec![0u8; chunk_bytes];
        let mut parity_tags = vec![0u8; cs as usize * tag];
        encode(&data, &mut parity)?;
        encode(&tags, &mut parity_tags)?;
        let write = Command {
            tags: (tag > 0).then_some(&parity_tags[..]),
            ..Command::write(cmd.dst_lba, cs, &parity)
        };
        self.file_io(&write, &mut ReadBuffers::none())?;
        if cmd.trim_source {
            self.file_io(
                &Command::trim(cmd.src_lba, source),
                &mut ReadBuffers::none(),
            )?;
        }
        match &mut self.timing {
            Some(model) => model.convert(now_ns, cmd),
            None => Ok(Completion {
                done_ns: now_ns,
                gc_active: false,
            }),
        }
    }

    /// The recovery scan of OOB tags (ScalaAFA §5.4) reads the sidecar file.
    fn scan_tags(&self, lba: u64, sectors: u32) -> Option<Vec<u8>> {
        let file = self.tags.as_ref()?;
        let tag = self.info.tag_bytes_per_sector as u64;
        let end = lba.checked_add(sectors as u64)?;
        if end > self.info.capacity_sectors {
            return None;
        }
        let mut out = vec![0u8; (sectors as u64 * tag) as usize];
        match file.read_exact_at(&mut out, lba * tag) {
            Ok(()) => Some(out),
            Err(e) => {
                crate::log(&format!(
                    "OOB tag scan of {} failed: {e}",
                    tags_path(&self.path).display()
                ));
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("afa-file-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("member-0.img")
    }

    fn write(d: &mut FileDevice, lba: u64, data: &[u8], tags: Option<&[u8]>) {
        let cmd = Command {
            tags,
            ..Command::write(lba, (data.len() / 512) as u32, data)
        };
        d.submit(0, &cmd, ReadBuffers::none()).unwrap();
    }

    fn read(d: &mut FileDevice, lba: u64, sectors: u32) -> (Vec<u8>, Vec<u8>) {
        let mut data = vec![0u8; sectors as usize * 512];
        let mut tags = vec![0u8; sectors as usize * d.info().tag_bytes_per_sector as usize];
        let out = ReadBuffers {
            data: &mut data,
            tags: Some(&mut tags),
        };
        d.submit(0, &Command::read(lba, sectors), out).unwrap();
        (data, tags)
    }

    /// A new member file is sparse: all holes; a write makes its sectors data (to the file
    /// system's block), and a trim punches them out again where the file system can.
    #[test]
    fn allocation_follows_the_files_holes() {
        let path = scratch("allocation");
        let mut d = FileDevice::open(&path, 512, 1024, None).unwrap();
        assert_eq!(d.allocation(0, 1024), Some(vec![(1024, false)]));
        write(&mut d, 100, &[7u8; 512], None);
        let runs = d.allocation(0, 1024).unwrap();
        assert_eq!(runs.iter().map(|r| r.0).sum::<u32>(), 1024);
        let data: Vec<u64> = runs
            .iter()
            .scan(0u64, |at, &(n, a)| {
                let start = *at;
                *at += n as u64;
                Some((start, n, a))
            })
            .filter(|&(_, _, a)| a)
            .map(|(start, n, _)| start + n as u64)
            .collect();
        assert_eq!(data.len(), 1, "{runs:?}");
        assert!(runs[0].0 <= 100 && data[0] > 100, "{runs:?}");
        assert_eq!(d.allocation(200, 824), Some(vec![(824, false)]));
        d.submit(0, &Command::trim(96, 8), ReadBuffers::none())
            .unwrap();
        if d.punch_holes {
            assert_eq!(d.allocation(0, 1024), Some(vec![(1024, false)]));
        }
        assert_eq!(d.allocation(1000, 100), None, "past the end");
    }

    #[test]
    fn tags_are_kept_with_their_sectors_across_a_reopen() {
        let path = scratch("tags");
        let mut d = FileDevice::open_with_tags(&path, 512, 64, 9, None).unwrap();
        write(
            &mut d,
            3,
            &[7u8; 1024],
            Some(&[
                1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 15, 16, 17, 18, 19,
            ]),
        );
        drop(d);
        let mut d = FileDevice::open_with_tags(&path, 512, 64, 9, None).unwrap();
        let (data, tags) = read(&mut d, 2, 3);
        assert_eq!(d.scan_tags(2, 3).as_deref(), Some(&tags[..]));
        assert_eq!(
            d.scan_tags(63, 2),
            None,
            "a scan past the end finds nothing"
        );
        assert_eq!(&data[..512], &[0u8; 512][..]);
        assert_eq!(&data[512..], &[7u8; 1024][..]);
        assert_eq!(&tags[..9], &[0u8; 9]);
        assert_eq!(
            &tags[9..],
            &[1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 15, 16, 17, 18, 19]
        );
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    /// As on the emulated SSD: a write without tags and a trim both leave zero tags.
    #[test]
    fn untagged_writes_and_trims_clear_the_tags() {
        let path = scratch("clear");
        let mut d = FileDevice::open_with_tags(&path, 512, 64, 4, None).unwrap();
        write(&mut d, 0, &[1u8; 1024], Some(&[9u8; 8]));
        write(&mut d, 0, &[2u8; 512], None);
        assert_eq!(read(&mut d, 0, 2).1, [0, 0, 0, 0, 9, 9, 9, 9]);
        d.submit(0, &Command::trim(1, 1), ReadBuffers::none())
            .unwrap();
        let (data, tags) = read(&mut d, 0, 2);
        assert_eq!(tags, [0u8; 8]);
        assert_eq!(&data[512..], &[0u8; 512][..]);
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    /// The file device's conversion writes what the parity codec computes over the
    /// vertical hero's data and tags, and deallocates the hero, for both parity rows of m = 2.
    #[test]
    fn convert_writes_the_parity_of_data_and_tags_and_trims_the_source() {
        use afa_ssd::ParityType;
        let path = scratch("convert");
        let mut d = FileDevice::open_with_tags(&path, 512, 64, 4, None).unwrap();
        let (k, cs) = (3usize, 2u32);
        let chunk = |i: usize| -> Vec<u8> { (0..1024).map(|b| (b * 7 + i * 31) as u8).collect() };
        let chunk_tags = |i: usize| -> Vec<u8> { (0..8).map(|b| (b + 10 * i + 1) as u8).collect() };
        let codec = afa_parity::codec(k, 2).unwrap();
        for row in 0..2u8 {
            for i in 0..k {
                write(
                    &mut d,
                    (i as u64) * cs as u64,
                    &chunk(i),
                    Some(&chunk_tags(i)),
                );
            }
            let cmd = ConvertCommand {
                src_lba: 0,
                dst_lba: 40,
                chunk_sectors: cs,
                k: k as u8,
                parity: ParityType { row, of: 2 },
                trim_source: true,
            };
            d.convert(5, &cmd).unwrap();
            let data: Vec<Vec<u8>> = (0..k).map(chunk).collect();
            let tags: Vec<Vec<u8>> = (0..k).map(chunk_tags).collect();
            let (mut want, mut want_tags) = (vec![0u8; 1024], vec![0u8; 8]);
            let refs: Vec<&[u8]> = data.iter().map(|c| c.as_slice()).collect();
            codec.encode_row(row as usize, &refs, &mut want).unwrap();
            let refs: Vec<&[u8]> = tags.iter().map(|c| c.as_slice()).collect();
            codec
                .encode_row(row as usize, &refs, &mut want_tags)
                .unwrap();
            assert_eq!(read(&mut d, 40, cs), (want, want_tags), "parity row {row}");
            let (src, src_tags) = read(&mut d, 0, k as u32 * cs);
            assert!(
                src.iter().chain(&src_tags).all(|&b| b == 0),
                "source trimmed"
            );
        }
        let beyond = ConvertCommand {
            src_lba: 60,
            dst_lba: 0,
            chunk_sectors: cs,
            k: k as u8,
            parity: ParityType { row: 0, of: 1 },
            trim_source: true,
        };
        assert!(matches!(
            d.convert(0, &beyond),
            Err(DeviceError::OutOfRange { lba: 60, .. })
        ));
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn tags_are_refused_without_a_tag_file_and_a_wrong_sized_one_is_named() {
        let path = scratch("refuse");
        let mut d = FileDevice::open(&path, 512, 64, None).unwrap();
        assert_eq!(d.scan_tags(0, 1), None, "no tag file, no tags");
        let cmd = Command {
            tags: Some(&[1u8; 4]),
            ..Command::write(0, 1, &[0u8; 512])
        };
        let err = d.submit(0, &cmd, ReadBuffers::none()).unwrap_err();
        assert!(matches!(err, DeviceError::TagLength { .. }), "{err}");
        drop(d);
        drop(FileDevice::open_with_tags(&path, 512, 64, 4, None).unwrap());
        let err = FileDevice::open_with_tags(&path, 512, 64, 8, None).unwrap_err();
        assert!(err.to_string().contains(".tags"), "{err}");
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }
}
