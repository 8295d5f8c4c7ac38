//! The state directory (`--state DIR`): one file per member device, a description of the
//! volume the files were made for, a lock so two servers never share the files, and a
//! clean-stop marker that tells a restart whether the last server stopped in order.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use rustix::fs::{flock, FlockOperation};

use crate::ServeError;

const VOLUME_FILE: &str = "volume.txt";
const LOCK_FILE: &str = "lock";
/// Present only between an orderly stop (after the final flush) and the next start, which
/// removes it before serving: a start that does not find it follows a crash or a kill.
const CLEAN_FILE: &str = "clean";

/// An opened, locked state directory.
#[derive(Debug)]
pub struct StateDir {
    dir: PathBuf,
    /// The member files existed before and the last server did not stop in order: writes
    /// may have been cut off between members (md's "unclean shutdown").
    unclean: bool,
    /// This start made the directory's volume: no member file holds anything yet.
    fresh: bool,
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
        let clean_path = dir.join(CLEAN_FILE);
        let mut unclean = false;
        let mut fresh = false;
        match std::fs::read_to_string(&recorded_path) {
            Ok(recorded) => {
                unclean = !clean_path.exists();
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
                fresh = true;
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
        // The marker goes before anything is served, durably, so that a crash from here on
        // is seen as one by the next start.
        match std::fs::remove_file(&clean_path) {
            Ok(()) => File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| err("cannot sync", e))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(err("cannot remove the clean-stop marker in", e)),
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            unclean,
            fresh,
            _lock: lock,
        })
    }

    /// Whether the member files come from a server that did not stop in order.
    pub fn unclean(&self) -> bool {
        self.unclean
    }

    /// Whether this start made the volume (the member files are new and empty), so an
    /// engine that keeps its map in memory starts empty instead of recovering it.
    pub fn fresh(&self) -> bool {
        self.fresh
    }

    /// Records an orderly stop; call it only once every acknowledged write is durable in
    /// the member files.
    pub fn mark_clean(&self) -> Result<(), ServeError> {
        let err = |e: std::io::Error| {
            ServeError::State(format!(
                "cannot record the clean stop in {}: {e}",
                self.dir.display()
            ))
        };
        File::create(self.dir.join(CLEAN_FILE))
            .and_then(|f| f.sync_all())
            .map_err(err)?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(err)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file that keeps the engine's battery-backed host memory (SWAN's NVRAM).
    pub fn nvram_path(&self) -> PathBuf {
        self.dir.join("nvram.log")
    }

    /// The flash image of a served OX SSD: its medium's bytes, TAGs and metadata.
    pub fn ox_image_path(&self) -> PathBuf {
        self.dir.join("ox-flash.img")
    }

    /// The file of member `index` (spares count after the members).
    pub fn member_path(&self, index: usize) -> PathBuf {
        self.dir.join(format!("member-{index}.img"))
    }
}
