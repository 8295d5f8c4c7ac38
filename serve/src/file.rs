//! A file-backed device: one plain file holds every sector, so a volume survives the
//! process. Optionally an emulated device (payload `none`) times each command, so a file
//! member still behaves like the modelled SSD while its bytes live on the host's disk.
//!
//! Durability: every write goes to the file with `pwrite` before it is acknowledged (there
//! is no cache in the server), so a crash of the server process (kill -9) loses nothing
//! that was acknowledged; FLUSH calls `fdatasync`, so a flushed write also survives a crash
//! of the host.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use afa_sim::TimeNs;
use afa_ssd::{
    validate_command, BlockDevice, Command, Completion, DeviceError, DeviceInfo, Opcode,
    ReadBuffers,
};
use rustix::fs::{fallocate, FallocateFlags};

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
    #[error("the timing model for {path} has {model_sectors} sectors of {model_sector_bytes} bytes, the file {sectors} of {sector_bytes}")]
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
        if !sector_bytes.is_power_of_two() || sector_bytes < 512 {
            return Err(FileDeviceError::SectorSize(sector_bytes));
        }
        let open_err = |source| FileDeviceError::Open {
            path: path.to_path_buf(),
            source,
        };
        let expected = capacity_sectors * sector_bytes as u64;
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
        let mut info = DeviceInfo {
            sector_bytes,
            capacity_sectors,
            payload_unit_bytes: sector_bytes,
            tag_bytes_per_sector: 0,
            max_queue_depth: 1024,
            max_transfer_sectors: (16 << 20) / sector_bytes,
        };
        if let Some(model) = &timing {
            let m = model.info();
            if m.capacity_sectors != capacity_sectors || m.sector_bytes != sector_bytes {
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
            info,
            timing,
            punch_holes: true,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
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
        let zeros = vec![0u8; len.min(1 << 20) as usize];
        let mut at = offset;
        while at < offset + len {
            let n = (offset + len - at).min(zeros.len() as u64) as usize;
            self.file.write_all_at(&zeros[..n], at)?;
            at += n as u64;
        }
        Ok(())
    }
}

impl BlockDevice for FileDevice {
    fn info(&self) -> DeviceInfo {
        self.info
    }

    fn submit(
        &mut self,
        now_ns: TimeNs,
        cmd: &Command<'_>,
        out: ReadBuffers<'_>,
    ) -> Result<Completion, DeviceError> {
        validate_command(&self.info, cmd, &out)?;
        let sector = self.info.sector_bytes as u64;
        let offset = cmd.lba * sector;
        let len = cmd.sectors as u64 * sector;
        let result = match cmd.opcode {
            Opcode::Read => self
                .file
                .read_exact_at(out.data, offset)
                .map_err(|e| self.io_failed("read", &e)),
            Opcode::Write => {
                let written = self.file.write_all_at(cmd.data, offset);
                let synced = written.and_then(|()| {
                    if cmd.flags.fua {
                        self.file.sync_data()
                    } else {
                        Ok(())
                    }
                });
                synced.map_err(|e| self.io_failed("write", &e))
            }
            Opcode::Trim => self
                .trim(offset, len)
                .map_err(|e| self.io_failed("trim", &e)),
            Opcode::Flush => self
                .file
                .sync_data()
                .map_err(|e| self.io_failed("fdatasync", &e)),
        };
        result?;
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
}
