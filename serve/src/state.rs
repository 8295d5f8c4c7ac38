//! The state directory (`--state DIR`): one file per member device, a description of the
//! volume the files were made for, and a lock so two servers never share the files.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use rustix::fs::{flock, FlockOperation};

use crate::ServeError;

const VOLUME_FILE: &str = "volume.txt";
const LOCK_FILE: &str = "lock";

/// An opened, locked state directory.
#[derive(Debug)]
pub struct StateDir {
    dir: PathBuf,
    /// Holds an exclusive `flock` for as long as the server runs; the kernel drops it when
    /// the process dies, even by kill -9, so a restart never finds a stale lock.
    _lock: File,
}

impl StateDir {
    /// Opens `dir` (creating it) for a volume described by `description`: a first run
    /// records the description, later runs must present the same one, because the member
    /// files only make sense under the layout they were written with.
    pub fn open(dir: &Path, description: &str) -> Result<Self, ServeError> {
        let err = |what: &str, e: std::io::Error| {
            ServeError::State(format!("{what} {}: {e}", dir.display()))
        };
        std::fs::create_dir_all(dir).map_err(|e| err("cannot create", e))?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(LOCK_FILE))
            .map_err(|e| err("cannot open the lock file in", e))?;
        if flock(&lock, FlockOperation::NonBlockingLockExclusive).is_err() {
            return Err(ServeError::State(format!(
                "{} is in use by another afa serve",
                dir.display()
            )));
        }
        let recorded_path = dir.join(VOLUME_FILE);
        match std::fs::read_to_string(&recorded_path) {
            Ok(recorded) => {
                if recorded.trim_end() != description.trim_end() {
                    return Err(ServeError::State(format!(
                        "{} holds a volume made as\n  {}\nbut the configuration now gives\n  {}\nuse another directory or the original configuration",
                        dir.display(),
                        recorded.trim_end(),
                        description.trim_end()
                    )));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // Written to a temporary name and renamed, so a crash never leaves half a
                // description behind.
                let tmp = dir.join(format!("{VOLUME_FILE}.tmp"));
                let mut f = File::create(&tmp).map_err(|e| err("cannot write to", e))?;
                f.write_all(format!("{}\n", description.trim_end()).as_bytes())
                    .and_then(|()| f.sync_all())
                    .map_err(|e| err("cannot write to", e))?;
                std::fs::rename(&tmp, &recorded_path).map_err(|e| err("cannot write to", e))?;
                File::open(dir)
                    .and_then(|d| d.sync_all())
                    .map_err(|e| err("cannot sync", e))?;
            }
            Err(e) => return Err(err("cannot read the volume description in", e)),
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            _lock: lock,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file of member `index` (spares count after the members).
    pub fn member_path(&self, index: usize) -> PathBuf {
        self.dir.join(format!("member-{index}.img"))
    }
}
