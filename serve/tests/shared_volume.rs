//! A shared volume (one that does its own concurrency) served over TCP, paced and unpaced:
//! the same requests get the same answers as from a device, FLUSH and FUA reach the
//! volume's `flush`, stopping shuts it down once, and requests from different connections
//! reach it at the same time, which no lock of the server's may prevent.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use afa_serve::proto::*;
use afa_serve::{Pace, RunningServer, ServeConfig, Server, SharedVolume};
use afa_sim::TimeNs;
use afa_ssd::{DeviceError, DeviceInfo};
use common::{pattern, RawClient};

const SECTOR_BYTES: u32 = 512;
const CAPACITY_SECTORS: u64 = 8192;
const SIZE_BYTES: u64 = CAPACITY_SECTORS * SECTOR_BYTES as u64;
const MIB: u64 = 1 << 20;

/// How long a write waits for its partner at the rendezvous before it gives up: long
/// enough for a loaded machine, short enough that a server that serialises requests fails
/// the test instead of hanging it.
const RENDEZVOUS_TIMEOUT: Duration = Duration::from_secs(5);

/// A RAM volume that counts what it is asked. The mutex guards only its bytes and is never
/// held while a call waits, so it serialises nothing the test looks at.
struct TestVolume {
    bytes: Mutex<Vec<u8>>,
    epoch: Instant,
    /// Every command completes this long after it is applied, on the volume's clock.
    latency_ns: u64,
    /// Writes wait until two of them are inside `write` at once (see `rendezvous`).
    rendezvous_writes: bool,
    /// A write completes its first byte times `WRITE_LATENCY_STEP` later than the rest,
    /// so a test can choose the order in which writes complete.
    write_latency_by_first_byte: bool,
    writes_arrived: AtomicU64,
    calls_in_flight: AtomicU64,
    max_calls_in_flight: AtomicU64,
    writes: AtomicU64,
    largest_write_bytes: AtomicU64,
    trims: AtomicU64,
    /// What `trim_is_durable` answers (a test turns it off to see zeroes written instead).
    durable_trims: AtomicBool,
    flushes: AtomicU64,
    shutdowns: AtomicU64,
    /// Set by `shutdown`; any later call is counted in `calls_after_shutdown`.
    shut_down: AtomicBool,
    calls_after_shutdown: AtomicU64,
}

impl TestVolume {
    fn new(latency_ns: u64, rendezvous_writes: bool) -> Arc<Self> {
        Self::with_write_latency(latency_ns, rendezvous_writes, false)
    }

    fn with_write_latency(
        latency_ns: u64,
        rendezvous_writes: bool,
        write_latency_by_first_byte: bool,
    ) -> Arc<Self> {
        Arc::new(Self {
            bytes: Mutex::new(vec![0; SIZE_BYTES as usize]),
            epoch: Instant::now(),
            latency_ns,
            rendezvous_writes,
            write_latency_by_first_byte,
            writes_arrived: AtomicU64::new(0),
            calls_in_flight: AtomicU64::new(0),
            max_calls_in_flight: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            largest_write_bytes: AtomicU64::new(0),
            trims: AtomicU64::new(0),
            durable_trims: AtomicBool::new(true),
            flushes: AtomicU64::new(0),
            shutdowns: AtomicU64::new(0),
            shut_down: AtomicBool::new(false),
            calls_after_shutdown: AtomicU64::new(0),
        })
    }

    /// Counts a call in flight for as long as the returned guard lives.
    fn enter(&self) -> InFlight<'_> {
        if self.shut_down.load(Ordering::SeqCst) {
            self.calls_after_shutdown.fetch_add(1, Ordering::SeqCst);
        }
        let now = self.calls_in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_calls_in_flight.fetch_max(now, Ordering::SeqCst);
        InFlight(&self.calls_in_flight)
    }

    fn done_ns(&self) -> TimeNs {
        self.epoch.elapsed().as_nanos() as u64 + self.latency_ns
    }

    /// Waits until a second write has arrived. A server that applied one connection's
    /// requests at a time would never let the second in while the first waits here.
    fn rendezvous(&self) -> Result<(), DeviceError> {
        self.writes_arrived.fetch_add(1, Ordering::SeqCst);
        let deadline = Instant::now() + RENDEZVOUS_TIMEOUT;
        while self.writes_arrived.load(Ordering::SeqCst) < 2 {
            if Instant::now() > deadline {
                return Err(DeviceError::Medium(
                    "no second write arrived while the first waited".into(),
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    fn count(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::SeqCst)
    }
}

struct InFlight<'a>(&'a AtomicU64);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The unit of the extra latency a write's first byte chooses.
const WRITE_LATENCY_STEP: Duration = Duration::from_millis(100);

/// The last sector fails every write with NoSpace, to check the errno mapping.
const FULL_SECTOR_OFFSET: u64 = SIZE_BYTES - SECTOR_BYTES as u64;

impl SharedVolume for TestVolume {
    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            sector_bytes: SECTOR_BYTES,
            capacity_sectors: CAPACITY_SECTORS,
            payload_unit_bytes: SECTOR_BYTES,
            tag_bytes_per_sector: 0,
            max_queue_depth: 32,
            max_transfer_sectors: 256,
        }
    }

    fn epoch(&self) -> Instant {
        self.epoch
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<TimeNs, DeviceError> {
        let _in_flight = self.enter();
        let bytes = self.bytes.lock().unwrap();
        out.copy_from_slice(&bytes[offset as usize..offset as usize + out.len()]);
        Ok(self.done_ns())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<TimeNs, DeviceError> {
        let _in_flight = self.enter();
        if self.rendezvous_writes {
            self.rendezvous()?;
        }
        if offset + data.len() as u64 > FULL_SECTOR_OFFSET {
            return Err(DeviceError::NoSpace { plane: 0 });
        }
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.largest_write_bytes
            .fetch_max(data.len() as u64, Ordering::SeqCst);
        let mut bytes = self.bytes.lock().unwrap();
        bytes[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        let extra_ns = match data.first() {
            Some(&first) if self.write_latency_by_first_byte => {
                first as u64 * WRITE_LATENCY_STEP.as_nanos() as u64
            }
            _ => 0,
        };
        Ok(self.done_ns() + extra_ns)
    }

    fn trim(&self, offset: u64, length: u64) -> Result<TimeNs, DeviceError> {
        let _in_flight = self.enter();
        self.trims.fetch_add(1, Ordering::SeqCst);
        let mut bytes = self.bytes.lock().unwrap();
        bytes[offset as usize..(offset + length) as usize].fill(0);
        Ok(self.done_ns())
    }

    fn trim_is_durable(&self) -> bool {
        self.durable_trims.load(Ordering::SeqCst)
    }

    fn flush(&self) -> Result<TimeNs, DeviceError> {
        let _in_flight = self.enter();
        self.flushes.fetch_add(1, Ordering::SeqCst);
        Ok(self.done_ns())
    }

    fn shutdown(&self) -> Result<(), DeviceError> {
        self.shutdowns.fetch_add(1, Ordering::SeqCst);
        self.shut_down.store(true, Ordering::SeqCst);
        // A call still running when the volume is shut down breaks the promise too.
        if self.calls_in_flight.load(Ordering::SeqCst) > 0 {
            self.calls_after_shutdown.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    }
}

/// A server on an ephemeral loopback port over `volume`.
fn serve_shared(volume: &Arc<TestVolume>, pace: Pace) -> RunningServer {
    let config = ServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        pace,
        ..ServeConfig::default()
    };
    let volume: Arc<dyn SharedVolume> = volume.clone();
    Server::bind_shared(config, volume)
        .unwrap()
        .spawn()
        .unwrap()
}

#[test]
fn a_shared_volume_serves_every_request_kind_paced_and_unpaced() {
    for pace in [Pace::Model, Pace::None] {
        for structured in [false, true] {
            every_request_kind(pace, structured);
        }
    }
}

fn every_request_kind(pace: Pace, structured: bool) {
    let volume = TestVolume::new(1_000_000, false);
    let server = serve_shared(&volume, pace);
    assert_eq!(server.size_bytes(), SIZE_BYTES);
    let mut c = RawClient::open(&server, structured);
    let mut expected = vec![0u8; 65536];

    // Patterns written and read back, aligned and not.
    let data = pattern(65536, 1);
    c.send_request(0, CMD_WRITE, 1, 0, 65536, &data);
    assert_eq!(c.read_reply(0).errno, 0);
    expected.copy_from_slice(&data);
    let odd = pattern(3000, 2);
    c.send_request(0, CMD_WRITE, 2, 1000, 3000, &odd);
    assert_eq!(c.read_reply(0).errno, 0);
    expected[1000..4000].copy_from_slice(&odd);
    c.send_request(0, CMD_READ, 3, 0, 65536, &[]);
    let r = c.read_reply(65536);
    assert_eq!((r.handle, r.errno), (3, 0));
    assert_eq!(r.data, expected);
    c.send_request(0, CMD_READ, 4, 999, 3002, &[]);
    assert_eq!(c.read_reply(3002).data, expected[999..4001]);

    // Out of range: EINVAL from the server's checks, and the volume never sees it.
    let writes_before = TestVolume::count(&volume.writes);
    c.send_request(0, CMD_READ, 5, SIZE_BYTES - 4096, 8192, &[]);
    let r = c.read_reply(8192);
    assert_eq!(r.errno, EINVAL);
    if structured {
        assert!(r.message.contains("past the export"), "{}", r.message);
    }
    c.send_request(0, CMD_WRITE, 6, SIZE_BYTES, 512, &[7u8; 512]);
    assert_eq!(c.read_reply(0).errno, EINVAL);
    assert_eq!(TestVolume::count(&volume.writes), writes_before);

    // A volume's error reaches the client with the device engine's errno.
    c.send_request(0, CMD_WRITE, 7, FULL_SECTOR_OFFSET, 512, &[7u8; 512]);
    let r = c.read_reply(0);
    assert_eq!(r.errno, ENOSPC);
    if structured {
        assert!(r.message.contains("volume write at byte"), "{}", r.message);
    }

    // On a volume whose trims a power loss could undo, WRITE_ZEROES writes zeroes.
    volume.durable_trims.store(false, Ordering::SeqCst);
    let (trims, writes) = (
        TestVolume::count(&volume.trims),
        TestVolume::count(&volume.writes),
    );
    c.send_request(0, CMD_WRITE_ZEROES, 40, 50000, 5000, &[]);
    assert_eq!(c.read_reply(0).errno, 0);
    expected[50000..55000].fill(0);
    assert_eq!(TestVolume::count(&volume.trims), trims);
    assert_eq!(TestVolume::count(&volume.writes), writes + 1);
    volume.durable_trims.store(true, Ordering::SeqCst);

    // TRIM goes to `trim`, at any alignment, and reads back as zeroes.
    let trims = TestVolume::count(&volume.trims);
    c.send_request(0, CMD_TRIM, 8, 4100, 5000, &[]);
    assert_eq!(c.read_reply(0).errno, 0);
    expected[4100..9100].fill(0);
    assert_eq!(TestVolume::count(&volume.trims), trims + 1);

    // WRITE_ZEROES without NO_HOLE deallocates; with it, zeroes are written.
    let writes = TestVolume::count(&volume.writes);
    c.send_request(0, CMD_WRITE_ZEROES, 9, 20000, 10000, &[]);
    assert_eq!(c.read_reply(0).errno, 0);
    expected[20000..30000].fill(0);
    assert_eq!(TestVolume::count(&volume.trims), trims + 2);
    assert_eq!(TestVolume::count(&volume.writes), writes);
    c.send_request(CMD_FLAG_NO_HOLE, CMD_WRITE_ZEROES, 10, 40001, 3000, &[]);
    assert_eq!(c.read_reply(0).errno, 0);
    expected[40001..43001].fill(0);
    assert_eq!(TestVolume::count(&volume.trims), trims + 2);
    assert_eq!(TestVolume::count(&volume.writes), writes + 1);
    c.send_request(0, CMD_READ, 11, 0, 65536, &[]);
    assert_eq!(c.read_reply(65536).data, expected);

    // A large NO_HOLE request is written in pieces of at most 1 MiB.
    let big = 3 * MIB as u32 + 1000;
    c.send_request(CMD_FLAG_NO_HOLE, CMD_WRITE_ZEROES, 12, 65536, big, &[]);
    assert_eq!(c.read_reply(0).errno, 0);
    assert_eq!(TestVolume::count(&volume.writes), writes + 1 + 4);
    assert!(TestVolume::count(&volume.largest_write_bytes) <= MIB);

    // FLUSH, and FUA on a write, a trim and a write-zeroes, each reach `flush` once.
    let flushes = TestVolume::count(&volume.flushes);
    c.send_request(0, CMD_FLUSH, 13, 0, 0, &[]);
    assert_eq!(c.read_reply(0).errno, 0);
    assert_eq!(TestVolume::count(&volume.flushes), flushes + 1);
    c.send_request(CMD_FLAG_FUA, CMD_WRITE, 14, 512, 512, &[3u8; 512]);
    assert_eq!(c.read_reply(0).errno, 0);
    c.send_request(CMD_FLAG_FUA, CMD_TRIM, 15, 1024, 512, &[]);
    assert_eq!(c.read_reply(0).errno, 0);
    c.send_request(
        CMD_FLAG_FUA | CMD_FLAG_NO_HOLE,
        CMD_WRITE_ZEROES,
        16,
        2048,
        512,
        &[],
    );
    assert_eq!(c.read_reply(0).errno, 0);
    assert_eq!(TestVolume::count(&volume.flushes), flushes + 4);

    c.send_request(0, CMD_DISC, 17, 0, 0, &[]);
    assert!(c.is_closed());
    assert_eq!(TestVolume::count(&volume.shutdowns), 0);
    let stats = server.stop();
    assert_eq!(
        TestVolume::count(&volume.shutdowns),
        1,
        "stop shuts the volume down exactly once"
    );
    assert_eq!(TestVolume::count(&volume.calls_after_shutdown), 0);
    // Fifteen requests reached the volume (the parser answered the two out of range),
    // and the volume failed one of them.
    assert_eq!(stats.requests, 15, "{stats:?}");
    assert_eq!(stats.errors, 1, "{stats:?}");
    assert_eq!(stats.write_bytes, 65536 + 3000 + 512, "{stats:?}");
    assert_eq!(stats.read_bytes, 65536 + 3002 + 65536, "{stats:?}");
}

#[test]
fn paced_replies_wait_for_the_volumes_completion_time_and_unpaced_ones_do_not() {
    let latency = Duration::from_millis(300);
    for pace in [Pace::Model, Pace::None] {
        let volume = TestVolume::new(latency.as_nanos() as u64, false);
        let server = serve_shared(&volume, pace);
        let mut c = RawClient::open(&server, false);
        let start = Instant::now();
        c.send_request(0, CMD_WRITE, 1, 0, 4096, &[1u8; 4096]);
        assert_eq!(c.read_reply(0).errno, 0);
        let elapsed = start.elapsed();
        match pace {
            Pace::Model => assert!(elapsed >= latency, "paced reply after {elapsed:?}"),
            Pace::None => assert!(elapsed < latency, "unpaced reply after {elapsed:?}"),
        }
        server.stop();
        assert_eq!(TestVolume::count(&volume.shutdowns), 1);
    }
}

/// Paced replies leave earliest completion first, whatever order the requests came in.
#[test]
fn paced_replies_leave_in_order_of_completion_time() {
    let volume = TestVolume::with_write_latency(0, false, true);
    let server = serve_shared(&volume, Pace::Model);
    let mut c = RawClient::open(&server, false);
    // Sent in one burst, completing 300, 200 and 100 ms later: the last is answered first.
    for (handle, steps) in [(1u64, 3u8), (2, 2), (3, 1)] {
        c.send_request(0, CMD_WRITE, handle, handle * 512, 512, &[steps; 512]);
    }
    let handles: Vec<u64> = (0..3).map(|_| c.read_reply(0).handle).collect();
    assert_eq!(handles, [3, 2, 1]);
    let stats = server.stop();
    assert_eq!(stats.requests, 3);
}

#[test]
fn requests_from_two_connections_reach_the_volume_at_the_same_time() {
    for pace in [Pace::Model, Pace::None] {
        two_connections_at_once(pace);
    }
}

/// Each write waits inside the volume until the other connection's write has arrived; a
/// server that held a lock around the volume would keep the second out until the first
/// gave up, and both writes would fail.
fn two_connections_at_once(pace: Pace) {
    let volume = TestVolume::new(0, true);
    let server = serve_shared(&volume, pace);
    let clients: Vec<_> = (0..2u64)
        .map(|i| {
            let mut c = RawClient::open(&server, true);
            std::thread::spawn(move || {
                c.send_request(0, CMD_WRITE, i, i * 4096, 4096, &[i as u8 + 1; 4096]);
                c.read_reply(0)
            })
        })
        .collect();
    for client in clients {
        let r = client.join().unwrap();
        assert_eq!(r.errno, 0, "{pace:?}: {}", r.message);
    }
    assert!(
        TestVolume::count(&volume.max_calls_in_flight) >= 2,
        "{pace:?}: the writes never overlapped"
    );
    let stats = server.stop();
    assert_eq!(stats.write_bytes, 8192);
    assert_eq!(TestVolume::count(&volume.shutdowns), 1);
}

/// Stopping with connections still open answers or refuses what they send, and no call
/// reaches the volume after its shutdown.
#[test]
fn stopping_under_load_shuts_the_volume_down_once_and_last() {
    for pace in [Pace::Model, Pace::None] {
        let volume = TestVolume::new(50_000, false);
        let server = serve_shared(&volume, pace);
        let writers: Vec<_> = (0..3u64)
            .map(|t| {
                let mut c = RawClient::open(&server, false);
                std::thread::spawn(move || {
                    for i in 0..200u64 {
                        c.send_request(0, CMD_WRITE, i, (t * 200 + i) * 512, 512, &[1; 512]);
                        // The server closes the connection when it stops.
                        let mut magic = [0u8; 16];
                        if std::io::Read::read_exact(&mut c.stream, &mut magic).is_err() {
                            return;
                        }
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(20));
        server.stop();
        for w in writers {
            w.join().unwrap();
        }
        assert_eq!(TestVolume::count(&volume.shutdowns), 1, "{pace:?}");
        assert_eq!(
            TestVolume::count(&volume.calls_after_shutdown),
            0,
            "{pace:?}"
        );
    }
}
