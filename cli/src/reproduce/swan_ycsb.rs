//! SWAN §5.3 as the paper measured it: YCSB client threads in a closed loop over a
//! block-level model of RocksDB's I/O (docs/swan.md, "Sixth pass").
//!
//! The paper ran YCSB on RocksDB and reported operations per second. A client thread issues
//! its next operation only when the previous one has completed, so throughput is bounded by
//! how long operations take, not only by how many bytes the array can move. There is no
//! RocksDB here; each operation is replaced by the block I/O it causes, an approximation
//! whose every parameter is one of RocksDB's or YCSB's defaults or the paper's own figure:
//!
//! - A put (insert or update) appends its record to the write-ahead log. Puts that arrive
//!   while a log write is in flight join the next one (RocksDB's group commit), and a put
//!   completes when the log write holding it completes: the log write is its sync. The
//!   record then enters the memtable.
//! - A full memtable becomes immutable and is flushed by the flush thread as large
//!   sequential writes; with both memtables full, puts wait (RocksDB's memtable stall).
//! - Every flushed byte is later rewritten by leveled compaction: the compaction thread
//!   reads and writes large sequential chunks, and puts wait while its backlog reaches
//!   `level0_stop_writes_trigger` flushes (RocksDB's L0 stop).
//! - A get misses every cache and reads one block at random (YCSB's scrambled Zipfian key
//!   choice): Table 4 counts 50 million member reads in YCSB-A for its 32 million
//!   reads, so the paper's block cache absorbed few of them.

use afa_ox::ycsb::ScrambledZipfian;
use afa_sim::{EventQueue, SimRng, TimeNs};
use afa_ssd::{BlockDevice, Command, ReadBuffers};

/// The paper does not state YCSB's thread count. One client thread per core of the
/// paper's host (two Xeon E5-2609, 6 cores each in the v3 generation the Dell R730 shipped
/// with) is the stated choice.
pub const CLIENT_THREADS: u32 = 12;

/// YCSB's default record: 10 fields of 100 bytes, with its key and framing rounded up to
/// 1 KiB. Table 3's amounts are in these records (64 GB of inserts is 64 million records).
pub const RECORD_BYTES: u64 = 1024;

/// Host CPU of one YCSB operation (key search, record copy), outside any I/O wait: the
/// cost this workspace already uses for one YCSB operation in OX's key-value store
/// (`afa_ox::kv::HostCosts::op_cpu_ns`).
pub const OP_CPU_NS: u64 = 1_800;

/// A get's read: one 8 KiB block, the request size `swan-fig8`'s open-loop replay uses
/// (RocksDB's 4 KiB blocks read with their neighbour or index block come to about that).
pub const GET_READ_BYTES: u64 = 8192;

/// Table 3: the load phase inserts 64 GB. The model's RocksDB sizes (memtable, level 1)
/// are scaled by the data set over this, so the tree has the paper's shape at any scale.
const PAPER_DATASET_BYTES: f64 = 64e9;
/// RocksDB's default `write_buffer_size` (64 MiB) and `max_write_buffer_number` (2).
pub(super) const PAPER_MEMTABLE_BYTES: f64 = 64.0 * 1048576.0;
pub(super) const MAX_WRITE_BUFFERS: u32 = 2;
/// RocksDB's default `max_bytes_for_level_base` (256 MiB) and
/// `max_bytes_for_level_multiplier` (10).
pub(super) const PAPER_LEVEL1_BYTES: f64 = 256.0 * 1048576.0;
const LEVEL_MULTIPLIER: f64 = 10.0;
/// RocksDB's default `level0_stop_writes_trigger`.
pub(super) const L0_STOP_FLUSHES: f64 = 36.0;
/// Flush and compaction I/O size: RocksDB leaves the size of its buffered table writes to
/// the OS's writeback; 1 MiB is the paper's segment size (§4.1), the unit Log-RAID and SWAN
/// write in, so a table write neither splits nor pads a segment.
pub(super) const BACKGROUND_IO_BYTES: u64 = 1 << 20;

/// The sector size the volumes use.
pub(super) const SECTOR_BYTES: u64 = 4096;

/// One YCSB phase of Table 3: its name and the share of gets in percent.
#[derive(Debug, Clone, Copy)]
pub struct ClosedPhase {
    pub name: &'static str,
    pub read_percent: u32,
}

/// Every phase of Table 3 moves the same 64 GB of records. Each phase here runs as many
/// operations as make the load phase write this many data sets in all (log, flushes and
/// compaction): the open-loop replay's load amount, enough that the log-structured
/// volumes fill and clean during the load.
pub const LOAD_DATASETS_WRITTEN: f64 = 1.5;

/// What a closed-loop phase measured.
#[derive(Debug, Clone, Copy, Default)]
pub struct ClosedPhaseResult {
    pub ops_s: f64,
    pub read_latency_us_mean: f64,
    pub read_latency_us_p999: f64,
    /// Time the phase's puts spent waiting on a memtable or L0 stall, summed over threads,
    /// as a fraction of the threads' time.
    pub stalled_fraction: f64,
    pub sim_time_ns: TimeNs,
}

/// Leveled compaction's bytes written per byte flushed, for a data set of `dataset_bytes`
/// with level 1 holding `level1_bytes`: L0 → L1 rewrites each byte once, and every deeper
/// level the byte passes through rewrites it (multiplier + 1) / 2 times on average (a
/// byte merged into a level meets on average half of the multiplier's worth of that
/// level's data; Dayan and Idreos, "Dostoevsky", SIGMOD 2018, §3, leveling's cost of T/2
/// per level).
pub fn compaction_write_amplification(dataset_bytes: f64, level1_bytes: f64) -> f64 {
    let mut levels = 1u32;
    let mut capacity = level1_bytes;
    let mut total = level1_bytes;
    while total < dataset_bytes && levels < 16 {
        capacity *= LEVEL_MULTIPLIER;
        total += capacity;
        levels += 1;
    }
    1.0 + (levels - 1) as f64 * (LEVEL_MULTIPLIER + 1.0) / 2.0
}

#[derive(Debug, Clone, Copy)]
enum Event {
    /// A client thread may start its next operation.
    ClientReady { client: u32 },
    /// The get of `client` completed.
    GetDone { client: u32 },
    /// The log write in flight completed.
    WalDone,
    /// The flush thread's write completed.
    FlushDone,
    /// The compaction thread's read or write completed.
    CompactionDone,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum CompactionStep {
    Idle,
    Reading,
    Writing,
}

/// The model's RocksDB: its volume layout, memtables and background threads.
struct Db {
    memtable_bytes: u64,
    compaction_wa: f64,
    /// The log occupies sectors `0..wal_sectors`, written as a ring; the sorted tables the
    /// rest of the data set, `sst_start_sector..sst_end_sector`, also written as a ring
    /// (compaction deletes old tables as it writes new ones).
    wal_sectors: u64,
    wal_pos_bytes: u64,
    sst_start_sector: u64,
    sst_sectors: u64,
    sst_head_sector: u64,
    active_bytes: u64,
    immutables: u32,
    wal_busy: bool,
    /// Clients whose puts the log write in flight holds, and those waiting for the next.
    wal_group: Vec<u32>,
    wal_pending: Vec<u32>,
    flush_remaining_bytes: u64,
    flushing: bool,
    /// The flush thread's write is in flight: it issues one at a time.
    flush_writing: bool,
    compaction_backlog_bytes: f64,
    compaction: CompactionStep,
    compaction_chunk_bytes: u64,
    /// Clients whose puts wait on a stall, with the time the wait began.
    stalled: Vec<(u32, TimeNs)>,
}

impl Db {
    fn stop_backlog_bytes(&self) -> f64 {
        L0_STOP_FLUSHES * self.memtable_bytes as f64 * self.compaction_wa
    }

    fn writes_stalled(&self) -> bool {
        (self.active_bytes >= self.memtable_bytes && self.immutables + 1 >= MAX_WRITE_BUFFERS)
            || self.compaction_backlog_bytes >= self.stop_backlog_bytes()
    }
}

/// The closed-loop driver: clients and the model's RocksDB, carried from one phase to the
/// next; the device is lent to each phase.
pub struct ClosedLoop {
    queue: EventQueue<Event>,
    db: Db,
    rng: SimRng,
    zipf: ScrambledZipfian,
    get_blocks: u64,
    records: u64,
    now_ns: TimeNs,
    /// The phase being run and the operations it still has to start and to finish.
    read_percent: u32,
    ops_to_start: u64,
    ops_outstanding: u64,
    /// Per client: when its current get started.
    get_start_ns: Vec<TimeNs>,
    /// Clients that found no operation left to start, waiting for the next phase.
    parked: Vec<u32>,
    read_latencies_ns: Vec<u64>,
    stalled_ns: u64,
}

impl ClosedLoop {
    /// A loop of [`CLIENT_THREADS`] clients over a volume whose first `dataset_bytes` hold
    /// the model's log and tables.
    pub fn new(dataset_bytes: u64, seed: u64) -> Result<ClosedLoop, String> {
        let scale = dataset_bytes as f64 / PAPER_DATASET_BYTES;
        let memtable_bytes = (((PAPER_MEMTABLE_BYTES * scale) as u64).div_ceil(SECTOR_BYTES)
            * SECTOR_BYTES)
            .max(SECTOR_BYTES);
        // The log ring holds every memtable's records that may not yet be flushed.
        let wal_sectors = MAX_WRITE_BUFFERS as u64 * memtable_bytes / SECTOR_BYTES + 1;
        let dataset_sectors = dataset_bytes / SECTOR_BYTES;
        if dataset_sectors < wal_sectors + 2 * BACKGROUND_IO_BYTES / SECTOR_BYTES {
            return Err(format!(
                "the data set of {dataset_bytes} bytes is too small for the model's log and tables"
            ));
        }
        let sst_sectors = dataset_sectors - wal_sectors;
        let get_blocks = sst_sectors * SECTOR_BYTES / GET_READ_BYTES;
        Ok(ClosedLoop {
            queue: EventQueue::with_capacity(64),
            db: Db {
                memtable_bytes,
                compaction_wa: compaction_write_amplification(
                    dataset_bytes as f64,
                    PAPER_LEVEL1_BYTES * scale,
                ),
                wal_sectors,
                wal_pos_bytes: 0,
                sst_start_sector: wal_sectors,
                sst_sectors,
                sst_head_sector: 0,
                active_bytes: 0,
                immutables: 0,
                wal_busy: false,
                wal_group: Vec::new(),
                wal_pending: Vec::new(),
                flush_remaining_bytes: 0,
                flushing: false,
                flush_writing: false,
                compaction_backlog_bytes: 0.0,
                compaction: CompactionStep::Idle,
                compaction_chunk_bytes: 0,
                stalled: Vec::new(),
            },
            rng: SimRng::new(seed ^ 0xc105_ed10),
            zipf: ScrambledZipfian::new(get_blocks),
            get_blocks,
            records: dataset_bytes / RECORD_BYTES,
            now_ns: 0,
            read_percent: 0,
            ops_to_start: 0,
            ops_outstanding: 0,
            get_start_ns: vec![0; CLIENT_THREADS as usize],
            parked: (0..CLIENT_THREADS).collect(),
            read_latencies_ns: Vec::new(),
            stalled_ns: 0,
        })
    }

    /// Operations per phase: the load's inserts write each record to the log, flush it,
    /// and rewrite it by compaction, which makes [`LOAD_DATASETS_WRITTEN`] data sets.
    pub fn ops_per_phase(&self) -> u64 {
        (self.records as f64 * LOAD_DATASETS_WRITTEN / (2.0 + self.db.compaction_wa)) as u64
    }

    /// Compaction's bytes written per byte flushed in this model's tree.
    pub fn compaction_write_amplification(&self) -> f64 {
        self.db.compaction_wa
    }

    /// Runs one phase until all of its operations have completed. Background flushes and
    /// compactions still running carry over into the next phase, as in a real run.
    pub fn run_phase(
        &mut self,
        device: &mut dyn BlockDevice,
        phase: &ClosedPhase,
    ) -> Result<ClosedPhaseResult, String> {
        let ops = self.ops_per_phase();
        self.read_percent = phase.read_percent;
        self.ops_to_start = ops;
        self.read_latencies_ns.clear();
        self.stalled_ns = 0;
        let start = self.now_ns;
        for client in std::mem::take(&mut self.parked) {
            self.queue.push(start, Event::ClientReady { client });
        }
        while self.ops_to_start > 0 || self.ops_outstanding > 0 {
            let Some((t, event)) = self.queue.pop() else {
                return Err(format!(
                    "phase {}: the closed loop ran out of events with operations left",
                    phase.name
                ));
            };
            self.now_ns = t;
            self.handle(device, t, event)?;
        }
        let elapsed = self.now_ns - start;
        let lat = &mut self.read_latencies_ns;
        lat.sort_unstable();
        let mean = if lat.is_empty() {
            0.0
        } else {
            lat.iter().sum::<u64>() as f64 / lat.len() as f64 / 1e3
        };
        // The smallest latency at least 99.9% of the gets did not exceed.
        let p999 = lat
            .get(((lat.len() as f64 * 0.999).ceil() as usize).saturating_sub(1))
            .map_or(0.0, |&v| v as f64 / 1e3);
        let seconds = elapsed as f64 / 1e9;
        Ok(ClosedPhaseResult {
            ops_s: if elapsed > 0 {
                ops as f64 / seconds
            } else {
                0.0
            },
            read_latency_us_mean: mean,
            read_latency_us_p999: p999,
            stalled_fraction: if elapsed > 0 {
                self.stalled_ns as f64 / (elapsed as f64 * CLIENT_THREADS as f64)
            } else {
                0.0
            },
            sim_time_ns: elapsed,
        })
    }

    fn handle(
        &mut self,
        device: &mut dyn BlockDevice,
        now: TimeNs,
        event: Event,
    ) -> Result<(), String> {
        match event {
            Event::ClientReady { client } => self.start_op(device, now, client),
            Event::GetDone { client } => {
                self.read_latencies_ns
                    .push(now - self.get_start_ns[client as usize]);
                self.finish_op(now, client);
                Ok(())
            }
            Event::WalDone => {
                self.db.wal_busy = false;
                for client in std::mem::take(&mut self.db.wal_group) {
                    self.db.active_bytes += RECORD_BYTES;
                    self.finish_op(now, client);
                }
                self.switch_memtable(device, now)?;
                if !self.db.wal_pending.is_empty() {
                    self.write_wal(device, now)?;
                }
                Ok(())
            }
            Event::FlushDone => {
                self.db.flush_writing = false;
                self.db.flush_remaining_bytes = self
                    .db
                    .flush_remaining_bytes
                    .saturating_sub(BACKGROUND_IO_BYTES);
                if self.db.flush_remaining_bytes == 0 {
                    self.db.flushing = false;
                    self.db.immutables -= 1;
                    self.db.compaction_backlog_bytes +=
                        self.db.memtable_bytes as f64 * self.db.compaction_wa;
                    self.switch_memtable(device, now)?;
                    self.start_compaction(device, now)?;
                    self.wake_stalled(device, now)?;
                }
                self.continue_flush(device, now)
            }
            Event::CompactionDone => {
                match self.db.compaction {
                    CompactionStep::Reading => {
                        self.db.compaction = CompactionStep::Writing;
                        let sectors = self.db.compaction_chunk_bytes / SECTOR_BYTES;
                        let lba = self.sst_append(sectors);
                        self.write(device, now, lba, sectors, Event::CompactionDone)?;
                        return Ok(());
                    }
                    CompactionStep::Writing => {
                        self.db.compaction = CompactionStep::Idle;
                        self.db.compaction_backlog_bytes = (self.db.compaction_backlog_bytes
                            - self.db.compaction_chunk_bytes as f64)
                            .max(0.0);
                        self.wake_stalled(device, now)?;
                    }
                    CompactionStep::Idle => {}
                }
                self.start_compaction(device, now)
            }
        }
    }

    /// Starts a client's next operation, if the phase has one left.
    fn start_op(
        &mut self,
        device: &mut dyn BlockDevice,
        now: TimeNs,
        client: u32,
    ) -> Result<(), String> {
        if self.ops_to_start == 0 {
            self.parked.push(client);
            return Ok(());
        }
        self.ops_to_start -= 1;
        self.ops_outstanding += 1;
        let is_get = self.rng.below(100) < self.read_percent as u64;
        if is_get {
            let block = self.zipf.next(&mut self.rng) % self.get_blocks;
            let lba = self.db.sst_start_sector + block * GET_READ_BYTES / SECTOR_BYTES;
            self.get_start_ns[client as usize] = now;
            let c = device
                .submit(
                    now,
                    &Command::read(lba, (GET_READ_BYTES / SECTOR_BYTES) as u32),
                    ReadBuffers::none(),
                )
                .map_err(|e| format!("get at sector {lba}: {e}"))?;
            self.queue
                .push(c.done_ns.max(now), Event::GetDone { client });
            return Ok(());
        }
        self.put(device, now, client)
    }

    fn put(
        &mut self,
        device: &mut dyn BlockDevice,
        now: TimeNs,
        client: u32,
    ) -> Result<(), String> {
        if self.db.writes_stalled() {
            self.db.stalled.push((client, now));
            return Ok(());
        }
        self.db.wal_pending.push(client);
        if !self.db.wal_busy {
            self.write_wal(device, now)?;
        }
        Ok(())
    }

    fn finish_op(&mut self, now: TimeNs, client: u32) {
        self.ops_outstanding -= 1;
        self.queue
            .push(now + OP_CPU_NS, Event::ClientReady { client });
    }

    /// Writes every pending put's record to the log in one append. The append rewrites the
    /// log's partly filled last sector, as a sync of a partly filled page does.
    fn write_wal(&mut self, device: &mut dyn BlockDevice, now: TimeNs) -> Result<(), String> {
        let group = std::mem::take(&mut self.db.wal_pending);
        let bytes = group.len() as u64 * RECORD_BYTES;
        let ring_bytes = self.db.wal_sectors * SECTOR_BYTES;
        if self.db.wal_pos_bytes + bytes > ring_bytes {
            self.db.wal_pos_bytes = 0;
        }
        let first = self.db.wal_pos_bytes / SECTOR_BYTES;
        let end = (self.db.wal_pos_bytes + bytes)
            .div_ceil(SECTOR_BYTES)
            .min(self.db.wal_sectors);
        self.db.wal_pos_bytes += bytes;
        self.db.wal_busy = true;
        self.db.wal_group = group;
        self.write(device, now, first, (end - first).max(1), Event::WalDone)
    }

    /// Turns a full memtable into an immutable one when a slot is free, and starts its flush.
    fn switch_memtable(&mut self, device: &mut dyn BlockDevice, now: TimeNs) -> Result<(), String> {
        if self.db.active_bytes >= self.db.memtable_bytes
            && self.db.immutables + 1 < MAX_WRITE_BUFFERS
        {
            self.db.active_bytes = 0;
            self.db.immutables += 1;
            self.wake_stalled(device, now)?;
        }
        self.continue_flush(device, now)
    }

    fn continue_flush(&mut self, device: &mut dyn BlockDevice, now: TimeNs) -> Result<(), String> {
        if !self.db.flushing {
            if self.db.immutables == 0 {
                return Ok(());
            }
            self.db.flushing = true;
            self.db.flush_remaining_bytes = self.db.memtable_bytes;
        }
        if self.db.flush_writing || self.db.flush_remaining_bytes == 0 {
            return Ok(());
        }
        self.db.flush_writing = true;
        let sectors = self.db.flush_remaining_bytes.min(BACKGROUND_IO_BYTES) / SECTOR_BYTES;
        let lba = self.sst_append(sectors);
        self.write(device, now, lba, sectors, Event::FlushDone)
    }

    fn start_compaction(
        &mut self,
        device: &mut dyn BlockDevice,
        now: TimeNs,
    ) -> Result<(), String> {
        if self.db.compaction != CompactionStep::Idle || self.db.compaction_backlog_bytes <= 0.0 {
            return Ok(());
        }
        let chunk = (self.db.compaction_backlog_bytes.ceil() as u64)
            .min(BACKGROUND_IO_BYTES)
            .div_ceil(SECTOR_BYTES)
            * SECTOR_BYTES;
        self.db.compaction_chunk_bytes = chunk;
        self.db.compaction = CompactionStep::Reading;
        // Compaction's input is older data: the tables half a ring behind the head.
        let sectors = chunk / SECTOR_BYTES;
        let ring = self.db.sst_sectors;
        let behind = (self.db.sst_head_sector + ring / 2) % ring;
        let offset = behind.min(ring - sectors);
        let lba = self.db.sst_start_sector + offset;
        let c = device
            .submit(
                now,
                &Command::read(lba, sectors as u32),
                ReadBuffers::none(),
            )
            .map_err(|e| format!("compaction read at sector {lba}: {e}"))?;
        self.queue.push(c.done_ns.max(now), Event::CompactionDone);
        Ok(())
    }

    /// Lets stalled puts go on once the stall has cleared, in the order they stalled.
    fn wake_stalled(&mut self, device: &mut dyn BlockDevice, now: TimeNs) -> Result<(), String> {
        if self.db.writes_stalled() || self.db.stalled.is_empty() {
            return Ok(());
        }
        for (client, since) in std::mem::take(&mut self.db.stalled) {
            self.stalled_ns += now - since;
            self.put(device, now, client)?;
        }
        Ok(())
    }

    /// The next `sectors` of the table ring, wrapping to its start when they do not fit.
    fn sst_append(&mut self, sectors: u64) -> u64 {
        if self.db.sst_head_sector + sectors > self.db.sst_sectors {
            self.db.sst_head_sector = 0;
        }
        let lba = self.db.sst_start_sector + self.db.sst_head_sector;
        self.db.sst_head_sector += sectors;
        lba
    }

    fn write(
        &mut self,
        device: &mut dyn BlockDevice,
        now: TimeNs,
        lba: u64,
        sectors: u64,
        done: Event,
    ) -> Result<(), String> {
        let done_ns = timing_write(device, now, lba, sectors)?;
        self.queue.push(done_ns, done);
        Ok(())
    }
}

/// Sends `device` a write of `sectors` at `lba` that carries no payload (the models here
/// time their I/O; no oracle reads it back) and returns when it completes, never before
/// `now`.
pub(super) fn timing_write(
    device: &mut dyn BlockDevice,
    now: TimeNs,
    lba: u64,
    sectors: u64,
) -> Result<TimeNs, String> {
    let c = device
        .submit(
            now,
            &Command::write(lba, sectors as u32, &[]),
            ReadBuffers::none(),
        )
        .map_err(|e| format!("write of {sectors} sectors at {lba}: {e}"))?;
    Ok(c.done_ns.max(now))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use afa_ssd::{Completion, DeviceError, DeviceInfo, Opcode};

    /// A device that completes every command `latency_ns` after it was submitted and
    /// counts what it was sent, so the loop's own behaviour can be checked in isolation.
    pub(in crate::reproduce) struct FixedLatency {
        latency_ns: u64,
        capacity_sectors: u64,
        pub(in crate::reproduce) writes: u64,
        pub(in crate::reproduce) written_sectors: u64,
        pub(in crate::reproduce) reads: u64,
    }

    impl BlockDevice for FixedLatency {
        fn info(&self) -> DeviceInfo {
            DeviceInfo {
                sector_bytes: SECTOR_BYTES as u32,
                capacity_sectors: self.capacity_sectors,
                payload_unit_bytes: 0,
                tag_bytes_per_sector: 0,
                max_queue_depth: 1024,
                max_transfer_sectors: 1024,
            }
        }

        fn submit(
            &mut self,
            now_ns: TimeNs,
            cmd: &Command<'_>,
            _out: ReadBuffers<'_>,
        ) -> Result<Completion, DeviceError> {
            if cmd.lba + cmd.sectors as u64 > self.capacity_sectors {
                return Err(DeviceError::OutOfRange {
                    lba: cmd.lba,
                    sectors: cmd.sectors,
                    capacity: self.capacity_sectors,
                });
            }
            match cmd.opcode {
                Opcode::Write => {
                    self.writes += 1;
                    self.written_sectors += cmd.sectors as u64;
                }
                Opcode::Read => self.reads += 1,
                Opcode::Trim | Opcode::Flush => {}
            }
            Ok(Completion {
                done_ns: now_ns + self.latency_ns,
                gc_active: false,
            })
        }

        fn background(&mut self, _now_ns: TimeNs) -> Option<TimeNs> {
            None
        }
    }

    pub(in crate::reproduce) fn device(latency_ns: u64, dataset_bytes: u64) -> FixedLatency {
        FixedLatency {
            latency_ns,
            capacity_sectors: dataset_bytes / SECTOR_BYTES,
            writes: 0,
            written_sectors: 0,
            reads: 0,
        }
    }

    /// Gets are bounded by latency, not bandwidth: each of the threads has one outstanding,
    /// so the phase runs at threads / (latency + CPU) operations per second, and every get
    /// is one read whose latency is the device's.
    #[test]
    fn gets_run_at_threads_over_latency() {
        let dataset_bytes = 256 << 20;
        let mut d = device(100_000, dataset_bytes);
        let mut l = ClosedLoop::new(dataset_bytes, 1).unwrap();
        let phase = ClosedPhase {
            name: "c",
            read_percent: 100,
        };
        let r = l.run_phase(&mut d, &phase).unwrap();
        let expected = CLIENT_THREADS as f64 / ((100_000 + OP_CPU_NS) as f64 / 1e9);
        assert!(
            (r.ops_s / expected - 1.0).abs() < 0.01,
            "{} / {expected}",
            r.ops_s
        );
        assert_eq!(d.reads, l.ops_per_phase());
        assert_eq!(d.writes, 0);
        assert!((r.read_latency_us_p999 - 100.0).abs() < 1e-9);
    }

    /// Puts that arrive while a log write is in flight share the next one: with a slow
    /// device, the threads' puts go out in groups, far fewer log writes than puts; and the
    /// load's bytes written are the log, the flushes and compaction's rewrites.
    #[test]
    fn puts_are_group_committed_and_flushed_and_compacted() {
        let dataset_bytes = 256 << 20;
        let mut d = device(1_000_000, dataset_bytes);
        let mut l = ClosedLoop::new(dataset_bytes, 1).unwrap();
        let phase = ClosedPhase {
            name: "load",
            read_percent: 0,
        };
        let r = l.run_phase(&mut d, &phase).unwrap();
        let ops = l.ops_per_phase();
        let log_writes = d.writes;
        assert!(
            log_writes < ops / 4,
            "{log_writes} writes for {ops} puts: no group commit"
        );
        // One log write at a time, of about every thread's put: never faster than that.
        let bound = CLIENT_THREADS as f64 / (1_000_000.0 / 1e9);
        assert!(r.ops_s <= bound, "{} > {bound}", r.ops_s);
        // Flushed and compacted data was written too: more than the log alone.
        let log_bytes = ops * RECORD_BYTES;
        assert!(
            d.written_sectors * SECTOR_BYTES > 2 * log_bytes,
            "{} sectors for {log_bytes} bytes of records",
            d.written_sectors
        );
    }

    /// The paper's data set (64 GB, level 1 of 256 MiB) needs levels 1 to 4 (256 MiB,
    /// 2.5 GiB, 25 GiB, 250 GiB): one rewrite into level 1 and 5.5 into each of the three
    /// below it.
    #[test]
    fn the_papers_tree_has_four_levels_and_a_write_amplification_of_17_5() {
        let wa = compaction_write_amplification(PAPER_DATASET_BYTES, PAPER_LEVEL1_BYTES);
        assert!((wa - 17.5).abs() < 1e-9, "{wa}");
        // Scaling both sizes by the same factor keeps the shape.
        let wa =
            compaction_write_amplification(PAPER_DATASET_BYTES / 30.0, PAPER_LEVEL1_BYTES / 30.0);
        assert!((wa - 17.5).abs() < 1e-9, "{wa}");
        // A data set that fits in level 1 is rewritten once.
        assert_eq!(compaction_write_amplification(1e6, PAPER_LEVEL1_BYTES), 1.0);
    }
}
