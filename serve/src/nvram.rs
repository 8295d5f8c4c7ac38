//! A file that stands in for an engine's battery-backed host memory (SWAN's NVRAM, §4.1),
//! so that what the engine acknowledged from that memory survives a crash of the process.
//!
//! Appends are `pwrite`s at the end, so a kill -9 keeps them; `sync` calls `fdatasync`, so a
//! FLUSH also survives a power loss of the host. `replace` writes the new contents to a
//! temporary file, syncs it, and renames it over the log, then syncs the directory: a crash
//! leaves the old log or the new one, never a mix.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use afa_array::NvramLog;
use afa_ssd::DeviceError;

/// An NVRAM log kept in one file.
#[derive(Debug)]
pub struct FileNvram {
    path: PathBuf,
    file: File,
    /// Bytes in the file: where the next append goes.
    end_bytes: u64,
}

impl FileNvram {
    /// Opens (or creates, empty) the log at `path`.
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let end_bytes = file.metadata()?.len();
        Ok(Self {
            path: path.to_path_buf(),
            file,
            end_bytes,
        })
    }

    fn failed(&self, what: &str, e: &io::Error) -> DeviceError {
        // The seam's error enum has no room for the cause, so it is logged here.
        crate::log(&format!("{what} of {} failed: {e}", self.path.display()));
        DeviceError::Failed
    }

    fn write_new(&self, bytes: &[u8]) -> io::Result<File> {
        let mut tmp = self.path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        file.write_all_at(bytes, 0)?;
        file.sync_data()?;
        std::fs::rename(&tmp, &self.path)?;
        if let Some(dir) = self.path.parent() {
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            };
            File::open(dir)?.sync_all()?;
        }
        Ok(file)
    }
}

impl NvramLog for FileNvram {
    fn append(&mut self, bytes: &[u8]) -> Result<(), DeviceError> {
        self.file
            .write_all_at(bytes, self.end_bytes)
            .map_err(|e| self.failed("append", &e))?;
        self.end_bytes += bytes.len() as u64;
        Ok(())
    }

    fn replace(&mut self, bytes: &[u8]) -> Result<(), DeviceError> {
        self.file = self
            .write_new(bytes)
            .map_err(|e| self.failed("replacement", &e))?;
        self.end_bytes = bytes.len() as u64;
        Ok(())
    }

    fn sync(&mut self) -> Result<(), DeviceError> {
        self.file
            .sync_data()
            .map_err(|e| self.failed("fdatasync", &e))
    }

    fn contents(&self) -> Result<Vec<u8>, DeviceError> {
        let mut out = vec![0u8; self.end_bytes as usize];
        self.file
            .read_exact_at(&mut out, 0)
            .map_err(|e| self.failed("read", &e))?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_and_replacements_survive_a_reopen() {
        let dir = std::env::temp_dir().join(format!("afa-nvram-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("nvram.log");
        let mut log = FileNvram::open(&path).unwrap();
        log.append(b"abc").unwrap();
        log.append(b"def").unwrap();
        drop(log);
        let mut log = FileNvram::open(&path).unwrap();
        assert_eq!(log.contents().unwrap(), b"abcdef");
        log.replace(b"xy").unwrap();
        log.append(b"z").unwrap();
        log.sync().unwrap();
        drop(log);
        let log = FileNvram::open(&path).unwrap();
        assert_eq!(log.contents().unwrap(), b"xyz");
        assert!(!dir.join("nvram.log.tmp").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
