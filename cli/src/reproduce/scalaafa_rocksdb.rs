//! ScalaAFA Fig. 14 (§6.4): RocksDB's db_bench over mdraid, the FusionRAID-style two-phase
//! engine and scalaafa on 4+1 Table 1 SSDs (docs/scalaafa.md, "Fig. 14").
//!
//! The paper ran db_bench (16-byte keys, 1 KiB values) on RocksDB over Ext4 for the two
//! kernel engines and over SPDK's BlobFS for ScalaAFA, and reported operations per second
//! of fillrandom, fillseq, overwrite and fillseekseq. There is no RocksDB here; as in
//! `swan-fig8-closed`, each operation is replaced by the CPU time and block I/O it causes,
//! and every parameter is one of db_bench's or RocksDB's defaults or a stated assumption:
//!
//! - db_bench runs one thread (`--threads=1`). Each operation costs that thread
//!   [`OP_CPU_NS`] of RocksDB's own work, plus the file system's share: a put appends its
//!   record to the write-ahead log with one file-system call (RocksDB flushes its log
//!   writer after every write batch; `--sync=0`, so nothing waits for the device), and a
//!   seek reads a data block through the file system whenever it crosses into the next
//!   one. A file-system call costs [`EXT4_CALL_NS`] on Ext4 (a system call into the page
//!   cache) and [`BLOBFS_CALL_NS`] on BlobFS (a copy into its user-space cache).
//! - The log reaches the array in the background, in 1 MiB writes.
//! - A full memtable is flushed as a sorted table in 1 MiB writes, and leveled compaction
//!   rewrites every flushed byte [`compaction_write_amplification`] times, also in 1 MiB
//!   writes. Puts wait while both memtables are full or compaction's backlog reaches
//!   `level0_stop_writes_trigger` flushes (RocksDB's stalls). Compaction reads its input
//!   from the host's cache: the data set (1 GB at db_bench's default 1,000,000 keys) fits
//!   the paper's 32 GB machine many times over, in the page cache as in BlobFS's cache.
//! - fillseq writes keys in order, so every flushed table moves down the tree without being
//!   rewritten (RocksDB's trivial move): it writes the log and the flushes only.
//!   fillrandom's compaction grows with the tree; overwrite runs on a full tree (db_bench
//!   needs an existing data base; it is filled first, and the fill is not measured).
//! - fillseekseq writes the keys in order and then seeks to each in turn; db_bench reports
//!   the seeks only. Their blocks come from the host's cache, so they cost CPU but no
//!   array I/O: the paper's reason for the small gain there ("absorbed by the DRAM cache").
//!
//! Beside the paper's runs, two variants give the context: each write benchmark with the
//! foreground's CPU taken away (how fast the array alone would let the puts go), and
//! fillrandom with `--sync=1` (each put waits for its log record's write and a flush), also
//! on the two two-phase engines writing pieces smaller than a chunk in place.

use std::collections::BTreeMap;

use afa_host::{CpuFront, StackProfile};
use afa_sim::parallel::map_in_parallel;
use afa_sim::{EventQueue, TimeNs};
use afa_ssd::{BlockDevice, Command, ReadBuffers};

use super::scalaafa::{blocks_for, member_write_sectors, stripes_converted};
use super::scalaafa_traces::{volume, Engine};
use super::swan_ycsb::{
    compaction_write_amplification, timing_write, BACKGROUND_IO_BYTES, L0_STOP_FLUSHES,
    MAX_WRITE_BUFFERS, OP_CPU_NS, PAPER_LEVEL1_BYTES, PAPER_MEMTABLE_BYTES, SECTOR_BYTES,
};
use super::{Entry, Reproduction};

pub const EXPERIMENTS: &[Entry] = &[(
    "scalaafa-fig14",
    "ScalaAFA Fig. 14: db_bench's fillrandom, fillseq, overwrite and fillseekseq (16 B keys, \
     1 KiB values, one thread) on a block-level model of RocksDB over mdraid and the \
     FusionRAID-style two-phase engine (Ext4) and scalaafa (BlobFS), 4+1 Table 1 SSDs",
    scalaafa_fig14,
)];

/// db_bench's default `--num`: the keys each benchmark writes or seeks.
const PAPER_KEYS: u64 = 1_000_000;
/// A quick run's keys: a quarter of the default, with RocksDB's sizes scaled alike.
const QUICK_KEYS: u64 = 250_000;
/// One entry: the paper's 16-byte key and 1 KiB value.
const ENTRY_BYTES: u64 = 16 + 1024;
/// Entries per 4 KiB data block, RocksDB's default `block_size`: a seek in key order reads
/// a new block once in this many seeks.
const ENTRIES_PER_BLOCK: u64 = 4096 / ENTRY_BYTES;

/// One file-system call through Ext4: a system call (entry and exit with the kernel's
/// speculative-execution mitigations, a few hundred ns) and the buffered path (page-cache
/// lookup, copy, dirtying the page). An assumption of this model, not a figure of the
/// paper; docs/scalaafa.md gives the result's sensitivity to it.
const EXT4_CALL_NS: u64 = 1_000;
/// One file-system call through BlobFS: a copy into, or out of, its user-space cache.
const BLOBFS_CALL_NS: u64 = 100;

/// The benchmarks of Fig. 14, in the paper's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Bench {
    FillRandom,
    FillSeq,
    Overwrite,
    FillSeekSeq,
}

impl Bench {
    const ALL: [Bench; 4] = [
        Bench::FillRandom,
        Bench::FillSeq,
        Bench::Overwrite,
        Bench::FillSeekSeq,
    ];

    fn name(self) -> &'static str {
        match self {
            Bench::FillRandom => "fillrandom",
            Bench::FillSeq => "fillseq",
            Bench::Overwrite => "overwrite",
            Bench::FillSeekSeq => "fillseekseq",
        }
    }
}

/// How a phase's puts land in the tree.
#[derive(Debug, Clone, Copy, PartialEq)]
enum KeyOrder {
    /// Keys in order: flushed tables move down without compaction.
    Sequential,
    /// New keys at random: compaction grows with the tree.
    Random,
    /// Existing keys at random: compaction at the full tree's depth.
    Overwrite,
}

#[derive(Debug, Clone, Copy)]
enum Event {
    /// The foreground thread finished its operation's CPU work.
    Foreground,
    /// With the log synced on every put: the put's CPU work is done and its log write goes.
    SyncLog,
    /// The put's log write completed; the flush that makes it durable goes.
    SyncLogWritten,
    /// The flush completed: the record is durable.
    SyncLogDone,
    WalDone,
    FlushDone,
    CompactionDone,
    /// The device asked to be called again for idle-time work.
    Background,
}

/// What one measured phase took.
#[derive(Debug, Clone, Copy)]
struct PhaseResult {
    ops_s: f64,
    /// Time the foreground spent waiting on a memtable or L0 stall, as a fraction.
    stalled_fraction: f64,
}

/// The model's RocksDB over one volume: the foreground thread, its memtables, and the
/// background log writer, flush and compaction, one 1 MiB write in flight each.
struct DbBench {
    queue: EventQueue<Event>,
    now_ns: TimeNs,
    /// The foreground's CPU per operation (RocksDB's own work) and per file-system call.
    op_cpu_ns: u64,
    fs_call_ns: u64,
    /// `--sync=1`: every put writes and syncs its log record before the next begins.
    sync_log: bool,
    /// Where the next record goes in the log ring, in bytes, when the log is synced.
    log_pos_bytes: u64,
    keys: u64,
    memtable_bytes: u64,
    level1_bytes: f64,
    /// Bytes the tree holds: what has been flushed, up to the data set.
    tree_bytes: f64,
    order: KeyOrder,
    /// The log ring occupies sectors `0..wal_sectors`, the table ring the `sst_sectors`
    /// after it; both are written in order and wrap.
    wal_sectors: u64,
    wal_head_sector: u64,
    sst_sectors: u64,
    sst_head_sector: u64,
    active_bytes: u64,
    immutables: u32,
    wal_unwritten_bytes: u64,
    wal_writing: bool,
    flush_remaining_bytes: u64,
    flush_writing: bool,
    compaction_backlog_bytes: f64,
    compaction_writing_bytes: u64,
    /// Commands sent to the device and not yet completed.
    outstanding: u32,
    background_pending: bool,
    /// The foreground: puts left to start, whether its current operation's CPU is under
    /// way, and since when it has been stalled.
    puts_left: u64,
    foreground_busy: bool,
    stalled_since: Option<TimeNs>,
    stalled_ns: u64,
}

impl DbBench {
    /// A data base of `keys` entries over a volume of `capacity_sectors`, an operation
    /// costing the foreground `op_cpu_ns` and its file system's calls `fs_call_ns`.
    /// RocksDB's memtable and level-1 sizes are scaled by the keys over db_bench's default,
    /// so the tree has the default's shape at any scale.
    fn new(
        keys: u64,
        capacity_sectors: u64,
        op_cpu_ns: u64,
        fs_call_ns: u64,
    ) -> Result<DbBench, String> {
        let scale = keys as f64 / PAPER_KEYS as f64;
        let memtable_bytes = (((PAPER_MEMTABLE_BYTES * scale) as u64)
            .div_ceil(BACKGROUND_IO_BYTES)
            * BACKGROUND_IO_BYTES)
            .max(BACKGROUND_IO_BYTES);
        // The log holds every memtable not yet flushed; a log is deleted with its flush.
        let wal_sectors =
            (MAX_WRITE_BUFFERS as u64 * memtable_bytes + BACKGROUND_IO_BYTES) / SECTOR_BYTES;
        // Compaction writes new tables before it deletes the old ones: room for two copies.
        let dataset_bytes = keys * ENTRY_BYTES;
        let sst_sectors =
            (2 * dataset_bytes).div_ceil(BACKGROUND_IO_BYTES) * BACKGROUND_IO_BYTES / SECTOR_BYTES;
        if wal_sectors + sst_sectors > capacity_sectors {
            return Err(format!(
                "{keys} keys need {} sectors of log and tables; the volume has {capacity_sectors}",
                wal_sectors + sst_sectors
            ));
        }
        Ok(DbBench {
            queue: EventQueue::with_capacity(16),
            now_ns: 0,
            op_cpu_ns,
            fs_call_ns,
            sync_log: false,
            log_pos_bytes: 0,
            keys,
            memtable_bytes,
            level1_bytes: PAPER_LEVEL1_BYTES * scale,
            tree_bytes: 0.0,
            order: KeyOrder::Sequential,
            wal_sectors,
            wal_head_sector: 0,
            sst_sectors,
            sst_head_sector: 0,
            active_bytes: 0,
            immutables: 0,
            wal_unwritten_bytes: 0,
            wal_writing: false,
            flush_remaining_bytes: 0,
            flush_writing: false,
            compaction_backlog_bytes: 0.0,
            compaction_writing_bytes: 0,
            outstanding: 0,
            background_pending: false,
            puts_left: 0,
            foreground_busy: false,
            stalled_since: None,
            stalled_ns: 0,
        })
    }

    fn dataset_bytes(&self) -> f64 {
        (self.keys * ENTRY_BYTES) as f64
    }

    /// Compaction's bytes written per byte flushed, for the next flush.
    fn compaction_wa(&self) -> f64 {
        match self.order {
            KeyOrder::Sequential => 0.0,
            KeyOrder::Random => compaction_write_amplification(
                (self.tree_bytes + self.memtable_bytes as f64).min(self.dataset_bytes()),
                self.level1_bytes,
            ),
            KeyOrder::Overwrite => {
                compaction_write_amplification(self.dataset_bytes(), self.level1_bytes)
            }
        }
    }

    fn writes_stalled(&self) -> bool {
        let memtables_full =
            self.active_bytes >= self.memtable_bytes && self.immutables + 1 >= MAX_WRITE_BUFFERS;
        let wa = self.compaction_wa();
        let l0_stop = wa > 0.0
            && self.compaction_backlog_bytes >= L0_STOP_FLUSHES * self.memtable_bytes as f64 * wa;
        memtables_full || l0_stop
    }

    /// Runs `keys` puts in `order` (the whole data set) and reports their throughput.
    fn puts(
        &mut self,
        device: &mut dyn BlockDevice,
        order: KeyOrder,
    ) -> Result<PhaseResult, String> {
        self.order = order;
        self.puts_left = self.keys;
        self.stalled_ns = 0;
        let start = self.now_ns;
        self.queue.push(start, Event::Foreground);
        self.foreground_busy = true;
        while self.puts_left > 0 || self.foreground_busy {
            self.step(device)?;
        }
        let elapsed = (self.now_ns - start).max(1);
        Ok(PhaseResult {
            ops_s: self.keys as f64 / elapsed as f64 * 1e9,
            stalled_fraction: self.stalled_ns as f64 / elapsed as f64,
        })
    }

    /// Flushes the active memtable and lets the background work finish, as a data base
    /// closed after its fill would be found by the next benchmark.
    fn settle(&mut self, device: &mut dyn BlockDevice) -> Result<(), String> {
        if self.active_bytes > 0 {
            while self.immutables + 1 >= MAX_WRITE_BUFFERS {
                self.step(device)?;
            }
            self.active_bytes = 0;
            self.immutables += 1;
            self.continue_flush(device)?;
        }
        self.wal_unwritten_bytes =
            self.wal_unwritten_bytes.div_ceil(BACKGROUND_IO_BYTES) * BACKGROUND_IO_BYTES;
        self.continue_wal(device)?;
        while self.outstanding > 0 {
            self.step(device)?;
        }
        // Pending idle-time calls belong to the settled state, not to the next phase.
        while self.queue.pop().is_some() {}
        self.background_pending = false;
        Ok(())
    }

    /// Seeks to every key in order: CPU only, the blocks coming from the host's cache.
    fn seeks(&self) -> PhaseResult {
        let per_seek_ns = self.op_cpu_ns as f64 + self.fs_call_ns as f64 / ENTRIES_PER_BLOCK as f64;
        PhaseResult {
            ops_s: 1e9 / per_seek_ns,
            stalled_fraction: 0.0,
        }
    }

    fn step(&mut self, device: &mut dyn BlockDevice) -> Result<(), String> {
        let (t, event) = self
            .queue
            .pop()
            .ok_or("the db_bench model ran out of events with work left")?;
        self.now_ns = t;
        match event {
            Event::Foreground => {
                self.foreground_busy = false;
                self.next_put(device)?;
            }
            Event::SyncLog => self.write_synced_record(device)?,
            Event::SyncLogWritten => {
                // fdatasync ends with a cache flush: a write the array holds in host memory
                // (md's stripe cache) or the members in theirs is durable only after it.
                let c = device
                    .submit(self.now_ns, &Command::flush(), ReadBuffers::none())
                    .map_err(|e| format!("flush after a log write: {e}"))?;
                self.queue
                    .push(c.done_ns.max(self.now_ns), Event::SyncLogDone);
            }
            Event::SyncLogDone => {
                self.outstanding -= 1;
                // The sync itself is one more file-system call.
                self.queue
                    .push(self.now_ns + self.fs_call_ns, Event::Foreground);
            }
            Event::WalDone => {
                self.outstanding -= 1;
                self.wal_writing = false;
                self.wal_unwritten_bytes -= BACKGROUND_IO_BYTES;
                self.continue_wal(device)?;
            }
            Event::FlushDone => {
                self.outstanding -= 1;
                self.flush_writing = false;
                self.flush_remaining_bytes -= BACKGROUND_IO_BYTES;
                if self.flush_remaining_bytes == 0 {
                    self.compaction_backlog_bytes +=
                        self.memtable_bytes as f64 * self.compaction_wa();
                    self.tree_bytes =
                        (self.tree_bytes + self.memtable_bytes as f64).min(self.dataset_bytes());
                    self.immutables -= 1;
                    self.continue_compaction(device)?;
                }
                self.continue_flush(device)?;
                self.wake(device)?;
            }
            Event::CompactionDone => {
                self.outstanding -= 1;
                self.compaction_backlog_bytes =
                    (self.compaction_backlog_bytes - self.compaction_writing_bytes as f64).max(0.0);
                self.compaction_writing_bytes = 0;
                self.continue_compaction(device)?;
                self.wake(device)?;
            }
            Event::Background => self.background_pending = false,
        }
        self.maybe_background(device);
        Ok(())
    }

    /// Starts the foreground's next put, or stalls it.
    fn next_put(&mut self, device: &mut dyn BlockDevice) -> Result<(), String> {
        if self.puts_left == 0 {
            return Ok(());
        }
        if self.writes_stalled() {
            self.stalled_since.get_or_insert(self.now_ns);
            return Ok(());
        }
        self.puts_left -= 1;
        self.active_bytes += ENTRY_BYTES;
        self.foreground_busy = true;
        let cpu_done_ns = self.now_ns + self.op_cpu_ns + self.fs_call_ns;
        if self.sync_log {
            self.queue.push(cpu_done_ns, Event::SyncLog);
        } else {
            self.wal_unwritten_bytes += ENTRY_BYTES;
            self.queue.push(cpu_done_ns, Event::Foreground);
        }
        if self.active_bytes >= self.memtable_bytes && self.immutables + 1 < MAX_WRITE_BUFFERS {
            self.active_bytes = 0;
            self.immutables += 1;
        }
        self.continue_flush(device)?;
        self.continue_wal(device)
    }

    /// Lets a stalled foreground go on once the stall has cleared.
    fn wake(&mut self, device: &mut dyn BlockDevice) -> Result<(), String> {
        // A full memtable waits for the flush that frees a slot for it.
        if self.active_bytes >= self.memtable_bytes && self.immutables + 1 < MAX_WRITE_BUFFERS {
            self.active_bytes = 0;
            self.immutables += 1;
            self.continue_flush(device)?;
        }
        if self.writes_stalled() {
            return Ok(());
        }
        if let Some(since) = self.stalled_since.take() {
            self.stalled_ns += self.now_ns - since;
            self.next_put(device)?;
        }
        Ok(())
    }

    /// Writes the record just appended, with the log's partly filled last sector it shares,
    /// as a sync of the log does; the foreground waits for it.
    fn write_synced_record(&mut self, device: &mut dyn BlockDevice) -> Result<(), String> {
        let ring_bytes = self.wal_sectors * SECTOR_BYTES;
        if self.log_pos_bytes + ENTRY_BYTES > ring_bytes {
            self.log_pos_bytes = 0;
        }
        let first = self.log_pos_bytes / SECTOR_BYTES;
        self.log_pos_bytes += ENTRY_BYTES;
        let end = self.log_pos_bytes.div_ceil(SECTOR_BYTES);
        self.write(device, first, end - first, Event::SyncLogWritten)
    }

    fn continue_wal(&mut self, device: &mut dyn BlockDevice) -> Result<(), String> {
        if self.wal_writing || self.wal_unwritten_bytes < BACKGROUND_IO_BYTES {
            return Ok(());
        }
        let sectors = BACKGROUND_IO_BYTES / SECTOR_BYTES;
        if self.wal_head_sector + sectors > self.wal_sectors {
            self.wal_head_sector = 0;
        }
        let lba = self.wal_head_sector;
        self.wal_head_sector += sectors;
        self.wal_writing = true;
        self.write(device, lba, sectors, Event::WalDone)
    }

    fn continue_flush(&mut self, device: &mut dyn BlockDevice) -> Result<(), String> {
        if self.flush_remaining_bytes == 0 && self.immutables > 0 {
            self.flush_remaining_bytes = self.memtable_bytes;
        }
        if self.flush_writing || self.flush_remaining_bytes == 0 {
            return Ok(());
        }
        self.flush_writing = true;
        let lba = self.sst_append();
        self.write(
            device,
            lba,
            BACKGROUND_IO_BYTES / SECTOR_BYTES,
            Event::FlushDone,
        )
    }

    fn continue_compaction(&mut self, device: &mut dyn BlockDevice) -> Result<(), String> {
        if self.compaction_writing_bytes > 0 || self.compaction_backlog_bytes <= 0.0 {
            return Ok(());
        }
        self.compaction_writing_bytes = BACKGROUND_IO_BYTES;
        let lba = self.sst_append();
        self.write(
            device,
            lba,
            BACKGROUND_IO_BYTES / SECTOR_BYTES,
            Event::CompactionDone,
        )
    }

    /// The next 1 MiB of the table ring.
    fn sst_append(&mut self) -> u64 {
        let sectors = BACKGROUND_IO_BYTES / SECTOR_BYTES;
        if self.sst_head_sector + sectors > self.sst_sectors {
            self.sst_head_sector = 0;
        }
        let lba = self.wal_sectors + self.sst_head_sector;
        self.sst_head_sector += sectors;
        lba
    }

    fn write(
        &mut self,
        device: &mut dyn BlockDevice,
        lba: u64,
        sectors: u64,
        done: Event,
    ) -> Result<(), String> {
        let done_ns = timing_write(device, self.now_ns, lba, sectors)?;
        self.outstanding += 1;
        self.queue.push(done_ns, done);
        Ok(())
    }

    /// Gives the device idle time (conversion, GC) when nothing is outstanding on it.
    fn maybe_background(&mut self, device: &mut dyn BlockDevice) {
        if self.outstanding > 0 || self.background_pending {
            return;
        }
        if let Some(next) = device.background(self.now_ns) {
            if next > self.now_ns && self.queue.peek_time().is_none_or(|t| t > next) {
                self.background_pending = true;
                self.queue.push(next, Event::Background);
            }
        }
    }
}

/// The engines of Fig. 14, in the paper's order. The two writing in place run with the log
/// synced only, where every log write is a piece smaller than a chunk.
const PAPER_ENGINES: [Engine; 3] = [Engine::Mdraid, Engine::TwoPhase, Engine::Scalaafa];

/// The file system each engine ran under in the paper: Ext4 on the kernel's stack, BlobFS
/// on SPDK's.
fn fs_call_ns(engine: Engine) -> u64 {
    match engine.host().profile {
        StackProfile::Kernel => EXT4_CALL_NS,
        StackProfile::Userspace => BLOBFS_CALL_NS,
    }
}

/// What one benchmark measured on one engine.
#[derive(Debug, Clone, Copy)]
struct BenchRun {
    ops_s: f64,
    stalled_fraction: f64,
    /// Bytes the members were sent to write per byte of the benchmark's entries.
    member_write_amplification: f64,
    stripes_converted: u64,
}

/// How a benchmark is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Variant {
    /// As the paper ran db_bench.
    AsRun,
    /// With the foreground's CPU taken away, so that only the array holds the puts back.
    ArrayBound,
    /// With `--sync=1`: every put waits for its log record to be written and synced.
    SyncLog,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::AsRun => "db_bench",
            Variant::ArrayBound => "array-bound",
            Variant::SyncLog => "sync=1",
        }
    }
}

/// One benchmark on a fresh 4+1 array of `engine` with one I/O thread, run as `variant`.
fn bench_run(
    engine: Engine,
    bench: Bench,
    keys: u64,
    blocks: u32,
    seed: u64,
    variant: Variant,
) -> Result<BenchRun, String> {
    let mut v = volume(engine, blocks, seed)?;
    let host = engine.host();
    let mut front = CpuFront::new(v.device(), &host)?;
    let capacity = front.info().capacity_sectors;
    let mut db = if variant == Variant::ArrayBound {
        DbBench::new(keys, capacity, 0, 0)?
    } else {
        DbBench::new(keys, capacity, OP_CPU_NS, fs_call_ns(engine))?
    };
    db.sync_log = variant == Variant::SyncLog;
    let result = match bench {
        Bench::FillRandom => db.puts(&mut front, KeyOrder::Random)?,
        Bench::FillSeq => db.puts(&mut front, KeyOrder::Sequential)?,
        Bench::Overwrite => {
            db.puts(&mut front, KeyOrder::Sequential)?;
            db.settle(&mut front)?;
            db.puts(&mut front, KeyOrder::Overwrite)?
        }
        Bench::FillSeekSeq => {
            db.puts(&mut front, KeyOrder::Sequential)?;
            db.seeks()
        }
    };
    drop(front);
    Ok(BenchRun {
        ops_s: result.ops_s,
        stalled_fraction: result.stalled_fraction,
        member_write_amplification: member_write_sectors(&v) as f64 * SECTOR_BYTES as f64
            / (keys * ENTRY_BYTES) as f64,
        stripes_converted: stripes_converted(&v),
    })
}

fn scalaafa_fig14(quick: bool, seed: u64) -> Result<Reproduction, String> {
    let blocks = blocks_for(quick);
    let keys = if quick { QUICK_KEYS } else { PAPER_KEYS };
    // Every benchmark as db_bench runs it; but for fillseekseq (whose measured seeks send
    // the array nothing), as fast as the array alone lets its puts go; and fillrandom with
    // its log synced on every put, on a tenth of the keys (each put waits for a small write,
    // so the rate settles within far fewer).
    let mut work: Vec<(Bench, Engine, Variant)> = Vec::new();
    for b in Bench::ALL {
        for e in PAPER_ENGINES {
            work.push((b, e, Variant::AsRun));
            if b != Bench::FillSeekSeq {
                work.push((b, e, Variant::ArrayBound));
            }
            if b == Bench::FillRandom {
                work.push((b, e, Variant::SyncLog));
            }
        }
    }
    for e in [Engine::TwoPhaseInPlace, Engine::ScalaafaInPlace] {
        work.push((Bench::FillRandom, e, Variant::SyncLog));
    }
    // The runs are independent: they run on every core, and are reported in order.
    let results = map_in_parallel(&work, |&(bench, engine, variant)| {
        let keys = if variant == Variant::SyncLog {
            keys / 10
        } else {
            keys
        };
        bench_run(engine, bench, keys, blocks, seed, variant)
    });
    let mut all = BTreeMap::new();
    for (&(bench, engine, variant), run) in work.iter().zip(results) {
        let run = run.map_err(|e| {
            format!(
                "{} on {} ({}): {e}",
                bench.name(),
                engine.name(),
                variant.name()
            )
        })?;
        println!(
            "{:<12} {:<18} {:<11} {:>9.0} ops/s, stalled {:>5.1}% of the time, members wrote \
             {:>5.1}× the entries, {} stripes converted",
            bench.name(),
            engine.name(),
            variant.name(),
            run.ops_s,
            run.stalled_fraction * 100.0,
            run.member_write_amplification,
            run.stripes_converted,
        );
        all.insert((variant, bench, engine), run);
    }
    let runs: BTreeMap<(Bench, Engine), BenchRun> = all
        .iter()
        .filter(|((v, _, _), _)| *v == Variant::AsRun)
        .map(|(&(_, b, e), &run)| ((b, e), run))
        .collect();
    let ops = |b: Bench, e: Engine| runs[&(b, e)].ops_s;
    let mut measured = BTreeMap::new();
    let mut context = BTreeMap::new();
    for b in Bench::ALL {
        measured.insert(
            b.name().to_string(),
            ops(b, Engine::Scalaafa) / ops(b, Engine::TwoPhase),
        );
        context.insert(
            format!("{}_scalaafa/mdraid", b.name()),
            ops(b, Engine::Scalaafa) / ops(b, Engine::Mdraid),
        );
        for e in PAPER_ENGINES {
            context.insert(format!("{}_{}_kops_s", b.name(), e.name()), ops(b, e) / 1e3);
            context.insert(
                format!("{}_{}_stalled_fraction", b.name(), e.name()),
                runs[&(b, e)].stalled_fraction,
            );
        }
    }
    let n = Bench::ALL.len() as f64;
    measured.insert(
        "scalaafa/mdraid_mean".into(),
        Bench::ALL
            .iter()
            .map(|&b| ops(b, Engine::Scalaafa) / ops(b, Engine::Mdraid))
            .sum::<f64>()
            / n,
    );
    measured.insert(
        "benchmarks_scalaafa_fastest".into(),
        Bench::ALL
            .iter()
            .filter(|&&b| {
                ops(b, Engine::Scalaafa) > ops(b, Engine::Mdraid)
                    && ops(b, Engine::Scalaafa) > ops(b, Engine::TwoPhase)
            })
            .count() as f64,
    );
    let gain = |b: Bench| ops(b, Engine::Scalaafa) / ops(b, Engine::TwoPhase);
    measured.insert(
        "fillseekseq_smallest_gain".into(),
        f64::from(u8::from(
            Bench::ALL
                .iter()
                .all(|&b| gain(Bench::FillSeekSeq) <= gain(b)),
        )),
    );
    for ((variant, b, e), run) in &all {
        let what = match variant {
            Variant::AsRun => continue,
            Variant::ArrayBound => "array_bound",
            Variant::SyncLog => "sync",
        };
        context.insert(
            format!("{}_{}_{what}_kops_s", b.name(), e.name()),
            run.ops_s / 1e3,
        );
    }
    let synced = |e: Engine| all[&(Variant::SyncLog, Bench::FillRandom, e)].ops_s;
    for (label, over, under) in [
        ("scalaafa/two-phase", Engine::Scalaafa, Engine::TwoPhase),
        ("scalaafa/mdraid", Engine::Scalaafa, Engine::Mdraid),
        (
            "scalaafa/two-phase_in_place",
            Engine::ScalaafaInPlace,
            Engine::TwoPhaseInPlace,
        ),
        (
            "scalaafa/mdraid_in_place",
            Engine::ScalaafaInPlace,
            Engine::Mdraid,
        ),
    ] {
        context.insert(
            format!("fillrandom_sync_{label}"),
            synced(over) / synced(under),
        );
    }
    context.insert("keys".into(), keys as f64);
    let paper = BTreeMap::from(
        [
            ("fillrandom", 1.319),
            ("fillseq", 1.411),
            ("overwrite", 1.238),
            ("fillseekseq", 1.081),
            ("scalaafa/mdraid_mean", 1.414),
            ("benchmarks_scalaafa_fastest", 4.0),
            ("fillseekseq_smallest_gain", 1.0),
        ]
        .map(|(label, value)| (label.to_string(), value)),
    );
    Ok(Reproduction {
        id: "scalaafa-fig14".into(),
        unit: "ops/s ratios (scalaafa ÷ two-phase per benchmark; ÷ mdraid on average)".into(),
        paper,
        measured,
        context,
    }
    .pair_labels())
}

#[cfg(test)]
mod tests {
    use super::super::swan_ycsb::tests::device;
    use super::*;

    /// Keys small enough for a test: 20 MiB of entries, a memtable of 2 MiB.
    const TEST_KEYS: u64 = 20_000;

    /// With an array that takes no time, nothing stalls: every put costs the foreground
    /// RocksDB's work and one file-system call, and fillseq sends the array its log and
    /// its flushes, each entry twice, and nothing for compaction.
    #[test]
    fn an_instant_array_leaves_fillseq_to_the_cpu() {
        let mut d = device(0, 1 << 30);
        let mut db =
            DbBench::new(TEST_KEYS, (1 << 30) / SECTOR_BYTES, OP_CPU_NS, EXT4_CALL_NS).unwrap();
        let r = db.puts(&mut d, KeyOrder::Sequential).unwrap();
        let expected = 1e9 / (OP_CPU_NS + EXT4_CALL_NS) as f64;
        assert!(
            (r.ops_s / expected - 1.0).abs() < 1e-3,
            "{} / {expected}",
            r.ops_s
        );
        assert_eq!(r.stalled_fraction, 0.0);
        db.settle(&mut d).unwrap();
        let written = d.written_sectors * SECTOR_BYTES;
        let entries = TEST_KEYS * ENTRY_BYTES;
        // Every byte is written once to the log and once in a table, each rounded up to
        // whole 1 MiB writes.
        assert!(
            written >= 2 * entries && written <= 2 * entries + 4 * BACKGROUND_IO_BYTES,
            "{written} bytes written for {entries} bytes of entries"
        );
    }

    /// An array slower than the foreground stalls the puts behind full memtables, and
    /// fillrandom's compaction makes it write more than fillseq does. (This device gives
    /// every writer its own latency, so compaction does not slow the flushes here.)
    #[test]
    fn a_slow_array_stalls_the_puts_and_random_keys_cost_compaction() {
        let run = |order| {
            // 20 ms per 1 MiB write: 50 MB/s for each of the three background writers.
            let mut d = device(20_000_000, 1 << 30);
            let mut db = DbBench::new(
                TEST_KEYS,
                (1 << 30) / SECTOR_BYTES,
                OP_CPU_NS,
                BLOBFS_CALL_NS,
            )
            .unwrap();
            let r = db.puts(&mut d, order).unwrap();
            db.settle(&mut d).unwrap();
            (r, d.written_sectors)
        };
        let (seq, seq_sectors) = run(KeyOrder::Sequential);
        let (random, random_sectors) = run(KeyOrder::Random);
        let cpu_bound = 1e9 / (OP_CPU_NS + BLOBFS_CALL_NS) as f64;
        for (name, r) in [("fillseq", seq), ("fillrandom", random)] {
            assert!(r.stalled_fraction > 0.5, "{name}: {r:?}");
            assert!(r.ops_s < cpu_bound / 2.0, "{name}: {r:?}");
        }
        assert!(
            random_sectors > seq_sectors * 3 / 2,
            "fillrandom wrote {random_sectors} sectors, fillseq {seq_sectors}"
        );
    }

    /// With the log synced, each put waits for its record's write and the flush after it,
    /// and a sync is one more file-system call; the records share their log sectors, so the
    /// log's writes cover each record's one or two sectors.
    #[test]
    fn a_synced_log_puts_each_write_and_flush_on_the_foreground() {
        let latency_ns = 50_000;
        let mut d = device(latency_ns, 1 << 30);
        let keys = 2_000;
        let mut db = DbBench::new(keys, (1 << 30) / SECTOR_BYTES, OP_CPU_NS, EXT4_CALL_NS).unwrap();
        db.sync_log = true;
        let r = db.puts(&mut d, KeyOrder::Sequential).unwrap();
        let per_put_ns = OP_CPU_NS + EXT4_CALL_NS + 2 * latency_ns + EXT4_CALL_NS;
        let expected = 1e9 / per_put_ns as f64;
        assert!(
            (r.ops_s / expected - 1.0).abs() < 1e-3,
            "{} / {expected}",
            r.ops_s
        );
        // Nothing went to the background log writer.
        assert_eq!(db.wal_unwritten_bytes, 0);
        assert!(d.writes >= keys, "{} writes for {keys} puts", d.writes);
    }

    /// Seeks cost CPU only: one operation plus a file-system call per block of entries.
    #[test]
    fn seeks_read_a_block_through_the_file_system_every_few_entries() {
        let db = DbBench::new(TEST_KEYS, 1 << 20, OP_CPU_NS, EXT4_CALL_NS).unwrap();
        let expected = 1e9 / (OP_CPU_NS as f64 + EXT4_CALL_NS as f64 / 3.0);
        assert_eq!(ENTRIES_PER_BLOCK, 3);
        assert!((db.seeks().ops_s / expected - 1.0).abs() < 1e-9);
    }

    /// A data base that does not fit is refused with the sizes in the message.
    #[test]
    fn a_volume_too_small_for_the_data_base_is_refused() {
        let e = DbBench::new(TEST_KEYS, 1_000, OP_CPU_NS, EXT4_CALL_NS)
            .err()
            .unwrap();
        assert!(e.contains("20000 keys") && e.contains("1000"), "{e}");
    }

    /// On the real engines: the arrays absorb fillrandom's writes without stalling the
    /// one db_bench thread, scalaafa's file system makes it the fastest, and the two
    /// two-phase engines convert only what their watermarks call for.
    #[test]
    fn on_the_engines_scalaafa_is_fastest_and_nothing_stalls() {
        let runs: Vec<BenchRun> = PAPER_ENGINES
            .iter()
            .map(|&e| bench_run(e, Bench::FillRandom, TEST_KEYS, 48, 1, Variant::AsRun).unwrap())
            .collect();
        for (e, r) in PAPER_ENGINES.iter().zip(&runs) {
            assert_eq!(r.stalled_fraction, 0.0, "{}: {r:?}", e.name());
            assert!(r.member_write_amplification > 2.0, "{}: {r:?}", e.name());
        }
        assert!(runs[2].ops_s > runs[0].ops_s && runs[2].ops_s > runs[1].ops_s);
    }
}
