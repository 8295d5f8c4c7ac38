//! `[array] failures` with `afa serve --state`: member failures happen at their configured
//! times as in simulation, and each one is recorded in the state directory
//! (`DIR/members.txt`, [`MemberRecord`]) before the volume writes anything that would leave
//! the failed member's file stale; the end of a rebuild onto a spare's file is recorded too.
//! A restart reads the record: a failed member's file is never read again (the volume
//! serves degraded), and a rebuild that had not finished starts again from the beginning on
//! the same spare's file.

use std::collections::VecDeque;
use std::path::PathBuf;

use afa_array::{Array, ArrayError, LogRaid, ScalaAfa, Swan, TwoPhase};
use afa_serve::{FileDevice, MemberHealth, MemberRecord};
use afa_sim::TimeNs;
use afa_ssd::{BlockDevice, Command, Completion, DeviceError, DeviceInfo, HostWork, ReadBuffers};

/// An engine whose members can fail and be rebuilt onto spares.
pub trait FailableEngine: BlockDevice + Send + 'static {
    /// Fails member `i` now; the engine puts its first spare, if any, in its place.
    fn fail_member(&mut self, i: usize, now_ns: TimeNs) -> Result<(), ArrayError>;
    /// Whether a rebuild onto a spare is running.
    fn rebuilding(&self) -> bool;
    /// Which of the unused spare files (`spares`, in the record's order) the engine puts in
    /// place of `member` when it fails, as an index into `spares`; `None` when it has none
    /// for that member. Most engines take their first spare.
    fn spare_taken(&self, _member: usize, spares: &[usize]) -> Option<usize> {
        (!spares.is_empty()).then_some(0)
    }
}

impl FailableEngine for Array<FileDevice> {
    fn fail_member(&mut self, i: usize, now_ns: TimeNs) -> Result<(), ArrayError> {
        Array::fail_member(self, i, now_ns)
    }
    fn rebuilding(&self) -> bool {
        Array::rebuilding(self)
    }
}

impl FailableEngine for LogRaid<FileDevice> {
    fn fail_member(&mut self, i: usize, now_ns: TimeNs) -> Result<(), ArrayError> {
        self.array_mut().fail_member(i, now_ns)
    }
    fn rebuilding(&self) -> bool {
        self.array().rebuilding()
    }
}

impl FailableEngine for TwoPhase<FileDevice> {
    fn fail_member(&mut self, i: usize, now_ns: TimeNs) -> Result<(), ArrayError> {
        TwoPhase::fail_member(self, i, now_ns)
    }
    fn rebuilding(&self) -> bool {
        TwoPhase::rebuilding(self)
    }
}

impl FailableEngine for Swan<FileDevice> {
    fn fail_member(&mut self, i: usize, now_ns: TimeNs) -> Result<(), ArrayError> {
        Swan::fail_member(self, i, now_ns)
    }
    fn rebuilding(&self) -> bool {
        Swan::rebuilding(self)
    }
    /// SWAN dealt spare j (file `members + j`) to R-group j mod groups, and a failed member
    /// takes its own group's first spare.
    fn spare_taken(&self, member: usize, spares: &[usize]) -> Option<usize> {
        let width = self.group_width();
        let groups = self.groups().len();
        let members = width * groups;
        spares
            .iter()
            .position(|&f| f >= members && (f - members) % groups == member / width)
    }
}

/// SWAN's spare files at a restart, per R-group: the files of the group's rebuilding
/// positions (in position order, the order [`positions_to_fail`] fails them again, so each
/// takes its own file back), then the group's unused spares (spare j, file `members + j`,
/// belongs to group j mod groups).
pub fn swan_spare_files(record: &MemberRecord, groups: usize) -> Result<Vec<Vec<usize>>, String> {
    let members = record.positions.len();
    if groups == 0 || members % groups != 0 {
        return Err(format!(
            "{members} member positions do not split into {groups} R-groups"
        ));
    }
    let width = members / groups;
    let mut lists: Vec<Vec<usize>> = vec![Vec::new(); groups];
    for (position, &(file, health)) in record.positions.iter().enumerate() {
        if health == MemberHealth::Rebuilding {
            lists[position / width].push(file);
        }
    }
    for &f in &record.spares {
        let j = f.checked_sub(members).ok_or_else(|| {
            format!("spare file member-{f}.img is one of the {members} member files")
        })?;
        lists[j % groups].push(f);
    }
    Ok(lists)
}

impl FailableEngine for ScalaAfa<FileDevice> {
    fn fail_member(&mut self, i: usize, now_ns: TimeNs) -> Result<(), ArrayError> {
        ScalaAfa::fail_member(self, i, now_ns)
    }
    fn rebuilding(&self) -> bool {
        ScalaAfa::rebuilding(self)
    }
}

/// The positions a restart must fail, in the order that gives each rebuilding position its
/// own file: rebuilding positions first (each takes the next spare the engine holds, which
/// [`engine_spares`] put there in position order), then failed ones (no spare is left).
pub fn positions_to_fail(record: &MemberRecord) -> Vec<usize> {
    let with = |health: MemberHealth| {
        record
            .positions
            .iter()
            .enumerate()
            .filter(move |(_, &(_, h))| h == health)
            .map(|(i, _)| i)
    };
    with(MemberHealth::Rebuilding)
        .chain(with(MemberHealth::Failed))
        .collect()
}

/// The files an engine is built with at a restart: `members` (one per position, whatever
/// its health: a failed position's file is handed over but never read) and `spares` (the
/// files of the rebuilding positions, in position order, then the unused spares).
pub fn engine_files(record: &MemberRecord) -> (Vec<usize>, Vec<usize>) {
    let members = record.positions.iter().map(|&(file, _)| file).collect();
    let spares = engine_spares(record);
    (members, spares)
}

fn engine_spares(record: &MemberRecord) -> Vec<usize> {
    record
        .positions
        .iter()
        .filter(|&&(_, h)| h == MemberHealth::Rebuilding)
        .map(|&(file, _)| file)
        .chain(record.spares.iter().copied())
        .collect()
}

/// An engine whose configured member failures are applied, and recorded, by serve mode.
pub struct RecordedFailures<E> {
    engine: E,
    dir: PathBuf,
    record: MemberRecord,
    /// Configured failures not yet applied, as (time since this server started, member).
    due: VecDeque<(TimeNs, usize)>,
}

impl<E: FailableEngine> RecordedFailures<E> {
    /// `failures` are the configured (member, time) pairs; those the record counts as
    /// applied are skipped, the others happen at their times after this start.
    pub fn new(engine: E, dir: PathBuf, record: MemberRecord, failures: &[(u32, TimeNs)]) -> Self {
        let mut ordered: Vec<(TimeNs, usize)> =
            failures.iter().map(|&(m, at)| (at, m as usize)).collect();
        ordered.sort_by_key(|&(at, _)| at);
        let due = ordered.into_iter().skip(record.failures_applied).collect();
        Self {
            engine,
            dir,
            record,
            due,
        }
    }

    /// Fails every member whose time has come, recording each failure durably before the
    /// volume is written again.
    fn apply_due(&mut self, now_ns: TimeNs) -> Result<(), DeviceError> {
        while let Some(&(at, member)) = self.due.front() {
            if at > now_ns {
                break;
            }
            self.due.pop_front();
            self.record.failures_applied += 1;
            let at_ms = at as f64 / 1e6;
            match self.engine.fail_member(member, at) {
                Ok(()) => {
                    // The engine took its first spare, if it had one; the record's spares
                    // are the engine's, in the same order.
                    let taken = self.engine.spare_taken(member, &self.record.spares);
                    let position = &mut self.record.positions[member];
                    if let Some(index) = taken {
                        let spare = self.record.spares.remove(index);
                        afa_serve::log(&format!(
                            "member {member} failed (configured at {at_ms} ms); rebuilding it onto member-{spare}.img in place of member-{}.img",
                            position.0
                        ));
                        *position = (spare, MemberHealth::Rebuilding);
                    } else {
                        position.1 = MemberHealth::Failed;
                        afa_serve::log(&format!(
                            "member {member} failed (configured at {at_ms} ms); no spare is left, so the volume serves degraded and member-{}.img is no longer read",
                            position.0
                        ));
                    }
                }
                Err(e) => afa_serve::log(&format!(
                    "the failure of member {member} configured at {at_ms} ms was not applied: {e}"
                )),
            }
            self.store()?;
        }
        Ok(())
    }

    /// Records the end of the rebuilds once the engine has none running.
    fn note_rebuilt(&mut self) -> Result<(), DeviceError> {
        let rebuilding = |r: &MemberRecord| {
            r.positions
                .iter()
                .any(|&(_, h)| h == MemberHealth::Rebuilding)
        };
        if !rebuilding(&self.record) || self.engine.rebuilding() {
            return Ok(());
        }
        for (position, (file, health)) in self.record.positions.iter_mut().enumerate() {
            if *health == MemberHealth::Rebuilding {
                *health = MemberHealth::Serving;
                afa_serve::log(&format!(
                    "the rebuild of member {position} onto member-{file}.img is done"
                ));
            }
        }
        self.store()
    }

    fn store(&self) -> Result<(), DeviceError> {
        self.record.store(&self.dir).map_err(|e| {
            // The seam's error enum has no room for the cause, so it is logged here.
            afa_serve::log(&e.to_string());
            DeviceError::Failed
        })
    }
}

impl<E: FailableEngine> BlockDevice for RecordedFailures<E> {
    fn info(&self) -> DeviceInfo {
        self.engine.info()
    }

    fn media_faults(&self) -> afa_nand::MediaFaults {
        self.engine.media_faults()
    }

    fn submit(
        &mut self,
        now_ns: TimeNs,
        cmd: &Command<'_>,
        out: ReadBuffers<'_>,
    ) -> Result<Completion, DeviceError> {
        self.apply_due(now_ns)?;
        let completion = self.engine.submit(now_ns, cmd, out)?;
        self.note_rebuilt()?;
        Ok(completion)
    }

    fn prefetch(&self, lba: u64, stage: u8) {
        self.engine.prefetch(lba, stage)
    }

    fn trim_is_durable(&self) -> bool {
        self.engine.trim_is_durable()
    }

    fn allocation(&self, lba: u64, sectors: u32) -> Option<Vec<(u32, bool)>> {
        self.engine.allocation(lba, sectors)
    }

    fn background(&mut self, now_ns: TimeNs) -> Option<TimeNs> {
        if self.apply_due(now_ns).is_err() {
            return None;
        }
        let next = self.engine.background(now_ns);
        if self.note_rebuilt().is_err() {
            return None;
        }
        match (next, self.due.front().map(|&(at, _)| at)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn take_host_work(&mut self) -> HostWork {
        self.engine.take_host_work()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A restart hands each rebuilding position's own file to the engine as the spare that
    /// position takes, in the order the positions are failed again.
    #[test]
    fn rebuilding_positions_take_their_own_files_at_a_restart() {
        let record = MemberRecord {
            failures_applied: 2,
            positions: vec![
                (0, MemberHealth::Serving),
                (2, MemberHealth::Failed),
                (5, MemberHealth::Rebuilding),
                (4, MemberHealth::Rebuilding),
            ],
            spares: vec![],
        };
        assert_eq!(positions_to_fail(&record), vec![2, 3, 1]);
        let (members, spares) = engine_files(&record);
        assert_eq!(members, vec![0, 2, 5, 4]);
        assert_eq!(spares, vec![5, 4]);
        let fresh = MemberRecord::initial(3, 1);
        assert_eq!(positions_to_fail(&fresh), Vec::<usize>::new());
        assert!(positions_to_fail(&fresh).is_empty());
        assert_eq!(engine_files(&fresh), (vec![0, 1, 2], vec![3]));
    }

    /// SWAN's spares belong to R-groups (spare j, file `members + j`, to group j mod
    /// groups): a restart hands each group its rebuilding members' files first, then its
    /// unused spares, and a failure takes a spare of the failed member's own group.
    #[test]
    fn swan_spares_stay_with_their_r_groups() {
        // Six members in two groups of three, four spares (files 6..10): files 6 and 8
        // belong to group 0, 7 and 9 to group 1. Member 4 (group 1) was rebuilding onto 7.
        let record = MemberRecord {
            failures_applied: 1,
            positions: vec![
                (0, MemberHealth::Serving),
                (1, MemberHealth::Serving),
                (2, MemberHealth::Serving),
                (3, MemberHealth::Serving),
                (7, MemberHealth::Rebuilding),
                (5, MemberHealth::Serving),
            ],
            spares: vec![6, 8, 9],
        };
        assert_eq!(
            swan_spare_files(&record, 2).unwrap(),
            vec![vec![6, 8], vec![7, 9]]
        );
        assert!(swan_spare_files(&record, 4).is_err());
        let bad = MemberRecord {
            spares: vec![2],
            ..record.clone()
        };
        assert!(swan_spare_files(&bad, 2)
            .unwrap_err()
            .contains("member-2.img"));
    }
}
