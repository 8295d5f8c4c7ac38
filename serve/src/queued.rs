//! Paced serving of a device with a queued interface (`BlockDevice::queued`; served here:
//! one OX SSD). Such a device cannot say when a command completes at the moment it takes it,
//! because its commands run side by side in its own event loop: its `submit` runs that loop
//! until the command completes, so a server that used it would serve one command at a time.
//! The paced engine therefore starts each request's commands on the queued interface, runs
//! the device to the wall clock's virtual time whenever the device has something to do, and
//! answers a request once its last command has completed.
//!
//! Only requests that are whole commands go this way: reads and writes of whole sectors,
//! flushes, and trims without FUA. The others (a partial sector's read-modify-write, which
//! needs the read's bytes before it can write, WRITE_ZEROES, block status, and a FUA trim,
//! which needs a flush once the trim is done) are applied whole by the executor once nothing
//! is under way on the queued interface, since the device's `submit` would run past the
//! queued commands.

use std::collections::BTreeMap;

use afa_sim::TimeNs;
use afa_ssd::{BlockDevice, Command, Opcode, QueuedCompletion};
use crossbeam_channel::Sender;

use crate::engine::{check_request, size_read_buffer, Executor, Failure, Job, Place, Reply};
use crate::proto::{Request, EIO};

/// Why requests under way fail when the device has no event left that could complete them.
pub(crate) const STALLED: &str = "the device stopped before completing the request";

/// Whether `request` goes to a queued interface as whole commands (module doc).
pub(crate) fn queueable(request: &Request, sector_bytes: u64) -> bool {
    match *request {
        Request::Read { offset, length } | Request::Write { offset, length, .. } => {
            offset % sector_bytes == 0 && length as u64 % sector_bytes == 0
        }
        Request::Flush => true,
        Request::Trim { fua, .. } => !fua,
        _ => false,
    }
}

/// One command of a request: what it does, where, and where its bytes lie in the request's
/// buffer.
struct Piece {
    opcode: Opcode,
    lba: u64,
    sectors: u32,
    offset_bytes: usize,
    fua: bool,
}

/// A command under way: the request it belongs to, where a read's bytes go in that
/// request's buffer, and what it was, for an error's message.
struct UnderWay {
    job: u64,
    offset_bytes: usize,
    opcode: Opcode,
    lba: u64,
}

/// A request whose commands are under way.
struct QueuedJob {
    handle: u64,
    read_offset: Option<u64>,
    /// A read's buffer, filled as its commands complete; a write's payload, handed back.
    data: Vec<u8>,
    reply_to: Sender<Vec<Reply>>,
    credits: u32,
    read_bytes: u64,
    write_bytes: u64,
    /// Commands not yet completed.
    left: usize,
    done_ns: TimeNs,
    failure: Option<Failure>,
}

/// A request answered: its reply, when it completed, and what it moved.
pub(crate) struct Finished {
    pub done_ns: TimeNs,
    pub reply: Reply,
    pub reply_to: Sender<Vec<Reply>>,
    pub read_bytes: u64,
    pub write_bytes: u64,
}

/// The requests under way on a device's queued interface and their commands by tag.
#[derive(Default)]
pub(crate) struct QueuedJobs {
    jobs: BTreeMap<u64, QueuedJob>,
    tags: BTreeMap<u64, UnderWay>,
    next_job: u64,
    next_tag: u64,
}

impl QueuedJobs {
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    /// Starts `job`'s commands at `now_ns`. Returns the answer at once when the request
    /// needs no command (a trim of no whole sector) or none of its commands started.
    pub fn start<D: BlockDevice + ?Sized>(
        &mut self,
        exec: &mut Executor<D>,
        now_ns: TimeNs,
        job: Job,
    ) -> Option<Finished> {
        let Job {
            handle,
            request,
            mut data,
            reply_to,
            credits,
        } = job;
        let (read_offset, read_bytes, write_bytes) = match request {
            Request::Read { offset, length } => (Some(offset), length as u64, 0),
            Request::Write { length, .. } => (None, 0, length as u64),
            _ => (None, 0, 0),
        };
        let mut queued = QueuedJob {
            handle,
            read_offset,
            data: Vec::new(),
            reply_to,
            credits,
            read_bytes,
            write_bytes,
            left: 0,
            done_ns: now_ns,
            failure: None,
        };
        if let Request::Read { length, .. } = request {
            size_read_buffer(&mut data, length);
        }
        let id = self.next_job;
        self.next_job += 1;
        match self.commands(exec, &request, data.len()) {
            Err(f) => queued.failure = Some(f),
            Ok(commands) => {
                for Piece {
                    opcode,
                    lba,
                    sectors,
                    offset_bytes,
                    fua,
                } in commands
                {
                    let sector = exec.info().sector_bytes as usize;
                    let payload = match opcode {
                        Opcode::Write => {
                            &data[offset_bytes..offset_bytes + sectors as usize * sector]
                        }
                        _ => &[][..],
                    };
                    let mut cmd = Command {
                        opcode,
                        lba,
                        sectors,
                        data: payload,
                        tags: None,
                        flags: Default::default(),
                    };
                    cmd.flags.fua = fua;
                    let tag = self.next_tag;
                    let started = match exec.device_mut().queued() {
                        Some(q) => q.start(now_ns, &cmd, tag),
                        None => Err(afa_ssd::DeviceError::Unsupported(
                            "the device has no queued interface".into(),
                        )),
                    };
                    if let Err(e) = started {
                        // Commands already started still complete; the request fails once
                        // they have.
                        queued.failure = Some(exec.failure(opcode, Place::Sector(lba), &e));
                        break;
                    }
                    self.next_tag += 1;
                    self.tags.insert(
                        tag,
                        UnderWay {
                            job: id,
                            offset_bytes,
                            opcode,
                            lba,
                        },
                    );
                    queued.left += 1;
                }
            }
        }
        queued.data = data;
        if queued.left == 0 {
            return Some(finish(queued));
        }
        self.jobs.insert(id, queued);
        None
    }

    /// The commands a queueable request makes, writes and reads in pieces of the
    /// executor's command size.
    fn commands<D: BlockDevice + ?Sized>(
        &self,
        exec: &Executor<D>,
        request: &Request,
        payload_bytes: usize,
    ) -> Result<Vec<Piece>, Failure> {
        check_request(request, exec.size_bytes(), payload_bytes)?;
        let sector = exec.info().sector_bytes as u64;
        let pieces = |opcode: Opcode, offset: u64, length: u32, fua: bool| {
            let chunk = exec.chunk_sectors() as u64;
            let (first, sectors) = (offset / sector, length as u64 / sector);
            (0..sectors)
                .step_by(chunk as usize)
                .map(|at| {
                    let n = chunk.min(sectors - at) as u32;
                    Piece {
                        opcode,
                        lba: first + at,
                        sectors: n,
                        offset_bytes: (at * sector) as usize,
                        fua,
                    }
                })
                .collect()
        };
        Ok(match *request {
            Request::Read { offset, length } => pieces(Opcode::Read, offset, length, false),
            Request::Write {
                offset,
                length,
                fua,
            } => pieces(Opcode::Write, offset, length, fua),
            Request::Flush => vec![Piece {
                opcode: Opcode::Flush,
                lba: 0,
                sectors: 0,
                offset_bytes: 0,
                fua: false,
            }],
            Request::Trim { offset, length, .. } => {
                // TRIM is advisory: only whole sectors inside the range are deallocated.
                let first = offset.div_ceil(sector);
                let last = (offset + length as u64) / sector;
                if first < last {
                    vec![Piece {
                        opcode: Opcode::Trim,
                        lba: first,
                        sectors: (last - first) as u32,
                        offset_bytes: 0,
                        fua: false,
                    }]
                } else {
                    Vec::new()
                }
            }
            _ => {
                return Err(Failure {
                    errno: EIO,
                    message: "the request cannot be queued".into(),
                })
            }
        })
    }

    /// When the device next has something to do, while requests are under way.
    pub fn next_event_ns<D: BlockDevice + ?Sized>(&self, exec: &mut Executor<D>) -> Option<TimeNs> {
        if self.jobs.is_empty() {
            return None;
        }
        exec.device_mut().queued()?.next_event_ns()
    }

    /// Runs the device to `now_ns` and returns the requests whose last command completed.
    pub fn advance<D: BlockDevice + ?Sized>(
        &mut self,
        exec: &mut Executor<D>,
        now_ns: TimeNs,
    ) -> Vec<Finished> {
        if self.jobs.is_empty() {
            return Vec::new();
        }
        let Some(q) = exec.device_mut().queued() else {
            return self.fail_all(now_ns, "the device lost its queued interface");
        };
        let completions = q.advance_to(now_ns);
        let stalled = q.next_event_ns().is_none();
        let mut finished = Vec::new();
        for c in completions {
            if let Some(done) = self.complete(c, exec) {
                finished.push(done);
            }
        }
        if stalled && !self.jobs.is_empty() {
            // A device with nothing more to do would never complete these: they fail
            // rather than leave their clients waiting forever.
            finished.extend(self.fail_all(now_ns, STALLED));
        }
        finished
    }

    fn complete<D: BlockDevice + ?Sized>(
        &mut self,
        c: QueuedCompletion,
        exec: &Executor<D>,
    ) -> Option<Finished> {
        let under_way = self.tags.remove(&c.tag)?;
        let job = self.jobs.get_mut(&under_way.job)?;
        job.done_ns = job.done_ns.max(c.done_ns);
        match c.result {
            Ok(bytes) if under_way.opcode == Opcode::Read => {
                let at = under_way.offset_bytes;
                match job.data.get_mut(at..at + bytes.len()) {
                    Some(dst) => dst.copy_from_slice(&bytes),
                    None => {
                        job.failure.get_or_insert(Failure {
                            errno: EIO,
                            message: format!(
                                "device read at sector {} returned {} bytes past the request",
                                under_way.lba,
                                bytes.len()
                            ),
                        });
                    }
                }
            }
            Ok(_) => {}
            Err(e) => {
                job.failure.get_or_insert_with(|| {
                    exec.failure(under_way.opcode, Place::Sector(under_way.lba), &e)
                });
            }
        }
        job.left -= 1;
        if job.left > 0 {
            return None;
        }
        let job = self.jobs.remove(&under_way.job)?;
        Some(finish(job))
    }

    /// Fails every request under way (a device that stopped delivering completions).
    pub fn fail_all(&mut self, now_ns: TimeNs, why: &str) -> Vec<Finished> {
        self.tags.clear();
        std::mem::take(&mut self.jobs)
            .into_values()
            .map(|mut job| {
                job.done_ns = job.done_ns.max(now_ns);
                job.failure.get_or_insert(Failure {
                    errno: EIO,
                    message: why.to_string(),
                });
                finish(job)
            })
            .collect()
    }
}

/// The reply of a request whose commands have all completed.
fn finish(job: QueuedJob) -> Finished {
    let failed = job.failure.is_some();
    Finished {
        done_ns: job.done_ns,
        reply: Reply {
            handle: job.handle,
            read_offset: job.read_offset,
            block_status: false,
            result: job.failure.map_or(Ok(()), Err),
            data: job.data,
            credits: job.credits,
        },
        reply_to: job.reply_to,
        read_bytes: if failed { 0 } else { job.read_bytes },
        write_bytes: if failed { 0 } else { job.write_bytes },
    }
}
