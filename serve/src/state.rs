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

    /// The flash image of a served WAFLASH SSD: its medium's pages, OOB areas and blocks.
    pub fn waflash_image_path(&self) -> PathBuf {
        self.dir.join("waflash-flash.img")
    }

    /// The file of member `index` (spares count after the members).
    pub fn member_path(&self, index: usize) -> PathBuf {
        self.dir.join(format!("member-{index}.img"))
    }
}

const MEMBERS_FILE: &str = "members.txt";

/// How one member position of the volume is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberHealth {
    /// The position's file holds its member's whole content.
    Serving,
    /// The position's file (a former spare) is being rebuilt from the other members; a
    /// restart rebuilds it again from the start.
    Rebuilding,
    /// The position's member failed with no spare left: its file is stale and is never read.
    Failed,
}

impl MemberHealth {
    fn name(self) -> &'static str {
        match self {
            MemberHealth::Serving => "serving",
            MemberHealth::Rebuilding => "rebuilding",
            MemberHealth::Failed => "failed",
        }
    }
}

/// Which file (`member-N.img`, by N) serves each member position, the spare files not yet
/// used, and how many of the configured member failures have happened: what a restart needs
/// to know after a member failed or was rebuilt (`DIR/members.txt`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberRecord {
    /// Configured failures (in time order) that have happened.
    pub failures_applied: usize,
    /// Per position: the file's number and how it is served.
    pub positions: Vec<(usize, MemberHealth)>,
    /// Spare files not yet used, by number, in the order they are taken.
    pub spares: Vec<usize>,
}

impl MemberRecord {
    /// A volume nothing has happened to: member i in `member-i.img`, the spares after.
    pub fn initial(members: usize, spares: usize) -> Self {
        Self {
            failures_applied: 0,
            positions: (0..members).map(|i| (i, MemberHealth::Serving)).collect(),
            spares: (members..members + spares).collect(),
        }
    }

    /// Reads `DIR/members.txt` for a volume of `members` members and `spares` spares, or
    /// the initial record when there is none.
    pub fn load(dir: &Path, members: usize, spares: usize) -> Result<Self, ServeError> {
        let path = dir.join(MEMBERS_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Self::initial(members, spares))
            }
            Err(e) => {
                return Err(ServeError::State(format!(
                    "cannot read {}: {e}",
                    path.display()
                )))
            }
        };
        Self::parse(&text, members, spares)
            .map_err(|e| ServeError::State(format!("{}: {e}", path.display())))
    }

    fn parse(text: &str, members: usize, spares: usize) -> Result<Self, String> {
        let files = members + spares;
        let mut record = Self {
            failures_applied: 0,
            positions: Vec::new(),
            spares: Vec::new(),
        };
        let mut used = vec![false; files];
        let mut take = |name: &str, line: usize| -> Result<usize, String> {
            let n = name
                .strip_prefix("member-")
                .and_then(|s| s.strip_suffix(".img"))
                .and_then(|s| s.parse::<usize>().ok())
                .filter(|&n| n < files)
                .ok_or_else(|| {
                    format!(
                        "line {line}: {name:?} is not one of member-0.img .. member-{}.img",
                        files - 1
                    )
                })?;
            if std::mem::replace(&mut used[n], true) {
                return Err(format!("line {line}: {name} is named twice"));
            }
            Ok(n)
        };
        for (i, line) in text.lines().enumerate() {
            let line_no = i + 1;
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                [] => {}
                [first, ..] if first.starts_with('#') => {}
                ["failures_applied", n] => {
                    record.failures_applied = n
                        .parse()
                        .map_err(|_| format!("line {line_no}: {n:?} is not a count"))?;
                }
                ["member", position, file, health] => {
                    if position.parse::<usize>().ok() != Some(record.positions.len()) {
                        return Err(format!(
                            "line {line_no}: member {position} is out of order (expected {})",
                            record.positions.len()
                        ));
                    }
                    let health = match *health {
                        "serving" => MemberHealth::Serving,
                        "rebuilding" => MemberHealth::Rebuilding,
                        "failed" => MemberHealth::Failed,
                        other => {
                            return Err(format!(
                                "line {line_no}: {other:?} is not serving, rebuilding or failed"
                            ))
                        }
                    };
                    record.positions.push((take(file, line_no)?, health));
                }
                ["spare", file] => record.spares.push(take(file, line_no)?),
                _ => return Err(format!("line {line_no}: cannot read {line:?}")),
            }
        }
        if record.positions.len() != members {
            return Err(format!(
                "it names {} member positions, but the volume has {members}",
                record.positions.len()
            ));
        }
        Ok(record)
    }

    fn render(&self) -> String {
        let mut text = String::from(
            "# afa serve: the file serving each member position, and the spare files left\n",
        );
        text.push_str(&format!("failures_applied {}\n", self.failures_applied));
        for (position, (file, health)) in self.positions.iter().enumerate() {
            text.push_str(&format!(
                "member {position} member-{file}.img {}\n",
                health.name()
            ));
        }
        for file in &self.spares {
            text.push_str(&format!("spare member-{file}.img\n"));
        }
        text
    }

    /// Replaces `DIR/members.txt` atomically and durably (a temporary file, synced, renamed
    /// over it, the directory synced), so a crash leaves the old record or the new one.
    pub fn store(&self, dir: &Path) -> Result<(), ServeError> {
        let path = dir.join(MEMBERS_FILE);
        let tmp = dir.join(format!("{MEMBERS_FILE}.tmp"));
        let err =
            |e: std::io::Error| ServeError::State(format!("cannot write {}: {e}", path.display()));
        let mut f = File::create(&tmp).map_err(err)?;
        f.write_all(self.render().as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(err)?;
        std::fs::rename(&tmp, &path).map_err(err)?;
        File::open(dir).and_then(|d| d.sync_all()).map_err(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_record_round_trips_and_bad_ones_are_named() {
        let dir = std::env::temp_dir().join(format!("afa-members-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let _ = std::fs::remove_file(dir.join(MEMBERS_FILE));
        assert_eq!(
            MemberRecord::load(&dir, 3, 2).unwrap(),
            MemberRecord::initial(3, 2)
        );
        let record = MemberRecord {
            failures_applied: 1,
            positions: vec![
                (0, MemberHealth::Serving),
                (3, MemberHealth::Rebuilding),
                (2, MemberHealth::Failed),
            ],
            spares: vec![4],
        };
        record.store(&dir).unwrap();
        assert_eq!(MemberRecord::load(&dir, 3, 2).unwrap(), record);
        for (text, named) in [
            (
                "member 0 member-0.img serving\n",
                "names 1 member positions",
            ),
            ("member 1 member-0.img serving\n", "out of order"),
            ("member 0 member-9.img serving\n", "member-9.img"),
            ("member 0 member-0.img gone\n", "\"gone\""),
            (
                "member 0 member-0.img serving\nspare member-0.img\n",
                "named twice",
            ),
            ("failures_applied x\n", "not a count"),
        ] {
            let err = MemberRecord::parse(text, 3, 2).unwrap_err();
            assert!(err.contains(named), "{text}: {err}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
