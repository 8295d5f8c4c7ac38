//! Block-level request streams shaped like the Filebench personalities of §V-B.
//!
//! These are approximations of Filebench at the block layer, not Filebench: there is no file
//! system, no page cache and no metadata I/O. Files are laid out one after another from
//! byte 0, each in an extent twice its mean size; the fileset is preallocated (the device is
//! preconditioned over `footprint_bytes`). Each thread runs its personality's loop of
//! flowops; file I/O at byte offsets becomes sector-granular block requests by rounding the
//! start down and the end up to whole sectors, which is what reaches a 4 KiB-sector device
//! when a 1–9 KiB request goes through the page cache. Within one whole-file read or write,
//! a sector that consecutive chunks share reaches the device once (the page cache holds it
//! between the two chunks), so each chunk's request starts after the sectors the flowop has
//! already covered, and a chunk inside them issues none. Threads are interleaved round-robin
//! into one request stream, replayed closed-loop with one request outstanding per thread
//! (queue depth = thread count).
//!
//! * random write: one file (5 GB), 3 threads, each writing `io_bytes` at a random offset
//!   aligned to `io_bytes`;
//! * fileserver: 10,000 files of mean 128 KB, 50 threads; loop: write a whole file anew,
//!   append a random amount (mean `io_bytes`) to another, read a third whole;
//! * webserver: 1,000 files of mean 16 KB, 100 threads; loop: read ten whole files, append a
//!   random amount (mean `io_bytes`) to a shared log (1 GiB × `scale`, wrapping around);
//! * webproxy: 10,000 files of mean 128 KB, 100 threads; loop: delete a file and create it
//!   anew with a random amount (mean `io_bytes`) appended, read five whole files.
//!
//! The loops follow Filebench's `fileserver.f`, `webserver.f` and `webproxy.f`: an
//! `appendfilerand` flowop writes a random amount up to its `iosize`, here uniform in
//! [1, 2·`io_bytes`] bytes so that the sweep's request size is its mean; `webproxy.f` has
//! no log file and writes no whole file (its only write is the `appendfilerand` to the file
//! it has just created, so the proxy's files shrink to the append size as they are
//! recreated). Whole-file reads and writes go in `io_bytes` chunks. File sizes are uniform
//! in [mean/2, 3·mean/2), rounded to 1 KiB. `scale` shrinks the file count (or the
//! random-write file) so that the fileset fits a scaled-down device.

use afa_sim::SimRng;
use afa_workload::trace::TraceRecord;
use afa_workload::IoOp;
use serde::{Deserialize, Serialize};

use crate::WaflashError;

const KIB: u64 = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Personality {
    RandomWrite,
    Fileserver,
    Webserver,
    Webproxy,
}

impl Personality {
    pub const ALL: [Personality; 4] = [
        Personality::RandomWrite,
        Personality::Fileserver,
        Personality::Webserver,
        Personality::Webproxy,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Personality::RandomWrite => "randomwrite",
            Personality::Fileserver => "fileserver",
            Personality::Webserver => "webserver",
            Personality::Webproxy => "webproxy",
        }
    }

    /// Threads of the paper's setting.
    pub fn threads(self) -> u32 {
        match self {
            Personality::RandomWrite => 3,
            Personality::Fileserver => 50,
            Personality::Webserver | Personality::Webproxy => 100,
        }
    }

    /// Files and their mean size in the paper's setting.
    pub fn fileset(self) -> (u64, u64) {
        match self {
            Personality::RandomWrite => (1, 5_000_000_000),
            Personality::Fileserver | Personality::Webproxy => (10_000, 128 * KIB),
            Personality::Webserver => (1_000, 16 * KIB),
        }
    }
}

/// One generated workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FilebenchSpec {
    pub personality: Personality,
    /// The request size of the sweep (1 KiB to 9 KiB in the paper).
    pub io_bytes: u64,
    /// Requests to generate.
    pub requests: u64,
    /// Fraction of the paper's file count (random write: of its file size), in (0, 1].
    pub scale: f64,
    /// Threads; None takes the paper's.
    pub threads: Option<u32>,
    pub seed: u64,
}

/// The request stream and what the device must hold before it runs.
#[derive(Debug, Clone)]
pub struct Generated {
    pub records: Vec<TraceRecord>,
    /// Closed-loop queue depth: one outstanding request per thread.
    pub iodepth: u32,
    /// Bytes from 0 that the preallocated fileset occupies.
    pub footprint_bytes: u64,
}

#[derive(Debug, Clone, Copy)]
struct File {
    start: u64,
    extent: u64,
    len: u64,
}

struct Thread {
    rng: SimRng,
    pending: std::collections::VecDeque<(IoOp, u64, u64)>,
}

/// The most requests one generated stream holds. The stream is built whole before it is
/// replayed, so this bounds its memory (about 5 GiB of records) instead of letting a
/// mistyped count exhaust the machine.
pub const MAX_REQUESTS: u64 = 1 << 27;

/// The most generator threads (each keeps its own RNG and queue of pending requests).
pub const MAX_THREADS: u32 = 1 << 16;

/// Generates the stream for a device of `capacity_bytes` with `sector_bytes` sectors.
pub fn generate(
    spec: &FilebenchSpec,
    capacity_bytes: u64,
    sector_bytes: u64,
) -> Result<Generated, WaflashError> {
    let bad = |m: String| Err(WaflashError::Workload(m));
    if spec.io_bytes == 0 || spec.io_bytes > 1 << 20 {
        return bad(format!(
            "io_bytes = {} must lie in 1..=1 MiB",
            spec.io_bytes
        ));
    }
    if !(spec.scale > 0.0 && spec.scale <= 1.0) {
        return bad(format!("scale = {} must lie in (0, 1]", spec.scale));
    }
    if spec.requests > MAX_REQUESTS {
        return bad(format!(
            "requests = {} is more than the {MAX_REQUESTS} a generated stream may hold: it is \
             generated whole before the run, {} bytes a request",
            spec.requests,
            std::mem::size_of::<TraceRecord>()
        ));
    }
    match spec.threads {
        Some(0) => return bad("threads must be positive".into()),
        Some(t) if t > MAX_THREADS => {
            return bad(format!(
                "threads = {t} is more than {MAX_THREADS} (Filebench's personalities use 3 to 100)"
            ))
        }
        _ => {}
    }
    let p = spec.personality;
    let threads = spec.threads.unwrap_or(p.threads());
    let mut rng = SimRng::fork(spec.seed, 0x4649_4c45); // "FILE"
    let (count, mean) = p.fileset();
    let mut files = Vec::new();
    let mut at = 0u64;
    let round = |x: u64| x.div_ceil(sector_bytes) * sector_bytes;
    if p == Personality::RandomWrite {
        let size = round(((mean as f64 * spec.scale) as u64).max(spec.io_bytes));
        files.push(File {
            start: 0,
            extent: size,
            len: size,
        });
        at = size;
    } else {
        let n = ((count as f64 * spec.scale).round() as u64).max(threads as u64);
        for _ in 0..n {
            let extent = round(2 * mean);
            let len = ((mean / 2 + rng.below(mean)) / KIB * KIB).max(KIB);
            files.push(File {
                start: at,
                extent,
                len,
            });
            at += extent;
        }
    }
    // The web server appends to one shared log file after the fileset. Its extent (1 GiB at
    // full scale) is far larger than any write buffer, so appends reach the flash instead of
    // wrapping around inside the buffer.
    let log_extent = if p == Personality::Webserver {
        round(((1u64 << 30) as f64 * spec.scale) as u64).max(round(16 << 20))
    } else {
        0
    };
    let mut log = File {
        start: at,
        extent: log_extent,
        len: 0,
    };
    let footprint = at + log_extent;
    if footprint > capacity_bytes * 9 / 10 {
        return bad(format!(
            "the {} fileset needs {footprint} bytes, more than 90% of the device's \
             {capacity_bytes}: lower the scale",
            p.label()
        ));
    }
    let mut ts: Vec<Thread> = (0..threads)
        .map(|t| Thread {
            rng: SimRng::fork(spec.seed, 1 + t as u64),
            pending: Default::default(),
        })
        .collect();
    let io = spec.io_bytes;
    let mut records = Vec::with_capacity(spec.requests as usize);
    // One whole-file read or write in `io`-sized chunks. Through the page cache a sector that
    // two consecutive chunks share reaches the device once, so each chunk's request covers
    // only the sectors that no earlier chunk of the same flowop covered, and a chunk that
    // lies entirely within them issues no request.
    let chunks = |op: IoOp, start: u64, len: u64, out: &mut std::collections::VecDeque<_>| {
        let mut off = 0;
        let mut covered = start / sector_bytes * sector_bytes;
        while off < len {
            let n = io.min(len - off);
            let end = (start + off + n).div_ceil(sector_bytes) * sector_bytes;
            if end > covered {
                out.push_back((op, covered, end - covered));
                covered = end;
            }
            off += n;
        }
    };
    let nfiles = files.len() as u64;
    let mut turn = 0usize;
    while (records.len() as u64) < spec.requests {
        let t = &mut ts[turn % threads as usize];
        turn += 1;
        if t.pending.is_empty() {
            // The thread's next loop of flowops.
            match p {
                Personality::RandomWrite => {
                    let f = files[0];
                    let slots = (f.len / io).max(1);
                    let off = t.rng.below(slots) * io;
                    t.pending
                        .push_back((IoOp::Write, f.start + off, io.min(f.len - off)));
                }
                Personality::Fileserver => {
                    let a = t.rng.below(nfiles) as usize;
                    let len =
                        ((mean / 2 + t.rng.below(mean)) / KIB * KIB).clamp(KIB, files[a].extent);
                    files[a].len = len;
                    chunks(IoOp::Write, files[a].start, len, &mut t.pending);
                    let b = t.rng.below(nfiles) as usize;
                    let add = 1 + t.rng.below(2 * io);
                    let f = &mut files[b];
                    if f.len + add > f.extent {
                        f.len = 0;
                    }
                    t.pending.push_back((IoOp::Write, f.start + f.len, add));
                    f.len += add;
                    let c = t.rng.below(nfiles) as usize;
                    chunks(IoOp::Read, files[c].start, files[c].len, &mut t.pending);
                }
                Personality::Webserver => {
                    for _ in 0..10 {
                        let c = t.rng.below(nfiles) as usize;
                        chunks(IoOp::Read, files[c].start, files[c].len, &mut t.pending);
                    }
                    // `appendfilerand` to the log.
                    let add = 1 + t.rng.below(2 * io);
                    if log.len + add > log.extent {
                        log.len = 0;
                    }
                    t.pending.push_back((IoOp::Write, log.start + log.len, add));
                    log.len += add;
                }
                Personality::Webproxy => {
                    // `deletefile`, `createfile` and `appendfilerand`: the file is recreated
                    // holding only the appended bytes, written at its start in one request.
                    let a = t.rng.below(nfiles) as usize;
                    let add = 1 + t.rng.below(2 * io).min(files[a].extent - 1);
                    files[a].len = add;
                    t.pending.push_back((IoOp::Write, files[a].start, add));
                    for _ in 0..5 {
                        let c = t.rng.below(nfiles) as usize;
                        chunks(IoOp::Read, files[c].start, files[c].len, &mut t.pending);
                    }
                }
            }
        }
        let (op, off, len) = t.pending.pop_front().expect("a loop emits requests");
        // Sector-granular: the block layer sees whole sectors covering the bytes.
        let start = off / sector_bytes * sector_bytes;
        let end = (off + len.max(1)).div_ceil(sector_bytes) * sector_bytes;
        records.push(TraceRecord {
            timestamp_ns: 0,
            op,
            offset_bytes: start,
            len_bytes: end - start,
            volume: 0,
            fua: false,
        });
    }
    Ok(Generated {
        records,
        iodepth: threads,
        footprint_bytes: footprint,
    })
}
