//! Virtual time for afa: nanosecond timestamps, the event queue ordered by (time, sequence),
//! the busy calendar of a resource, the seeded random number generator and the event-log
//! hash that proves determinism.
//!
//! Nothing on the simulated path may read the wall clock, depend on thread scheduling or
//! iterate a hash map: everything that varies comes from the one seed handed to [`SimRng`].

mod calendar;
pub mod mem;
pub mod parallel;
mod queue;
mod rng;

pub use calendar::Calendar;
pub use queue::EventQueue;
pub use rng::SimRng;

/// Virtual time in nanoseconds since the start of the simulation.
pub type TimeNs = u64;

/// Nanoseconds per microsecond, millisecond and second, so that unit conversions read as such.
pub const NS_PER_US: u64 = 1_000;
pub const NS_PER_MS: u64 = 1_000_000;
pub const NS_PER_S: u64 = 1_000_000_000;

/// The longest time a configuration may give one step of a model: an operation's latency,
/// a per-command overhead, an interval. Steps of at most an hour, summed over any run that
/// ends, stay far inside the u64 nanosecond clock (584 years), so time arithmetic on the
/// simulated path cannot overflow; a longer value is a mistyped unit, refused up front.
pub const MAX_STEP_NS: u64 = 3_600 * NS_PER_S;

/// The slowest bandwidth a configuration may give a link or an engine: 1 KB/s, a thousandth
/// of mdraid's default rebuild floor (`speed_limit_min`, 1 MB/s), so that tests may hold an
/// array degraded with a crawling rebuild. At this rate a 1 MiB chunk takes 17 minutes, within
/// [`MAX_STEP_NS`]; at 1e-9 MB/s it took 33 years, and the sums after it overflowed the clock.
pub const MIN_BANDWIDTH_MB_S: f64 = 0.001;

/// A short, stable checksum (FNV-1a 64) for what recovery must tell whole from torn:
/// segment summaries, NVRAM log frames, checkpoints, flash-image journals.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Damages a file's bytes as a bad sector, a stray write or a copy cut short would, for the
/// tests that feed damaged state files to recovery: XORs each `(position, mask)` into the
/// byte at that fraction of the length, then keeps only `cut_fraction` of the bytes.
pub fn damage_bytes(bytes: &mut Vec<u8>, flips: &[(f64, u8)], cut_fraction: Option<f64>) {
    if bytes.is_empty() {
        return;
    }
    for &(at, mask) in flips {
        let i = ((at.clamp(0.0, 1.0) * bytes.len() as f64) as usize).min(bytes.len() - 1);
        bytes[i] ^= mask;
    }
    if let Some(f) = cut_fraction {
        bytes.truncate((f.clamp(0.0, 1.0) * bytes.len() as f64) as usize);
    }
}

/// Checks a configured duration against [`MAX_STEP_NS`]; the error names the field.
pub fn check_step_ns(name: &str, ns: u64) -> Result<(), String> {
    if ns > MAX_STEP_NS {
        return Err(format!(
            "{name} = {ns} ns is longer than an hour ({MAX_STEP_NS} ns), the longest step a \
             model takes"
        ));
    }
    Ok(())
}

/// Checks a configured bandwidth: a finite number of MB/s, at least [`MIN_BANDWIDTH_MB_S`].
pub fn check_bandwidth_mb_s(name: &str, mb_s: f64) -> Result<(), String> {
    if !(mb_s.is_finite() && mb_s >= MIN_BANDWIDTH_MB_S) {
        return Err(format!(
            "{name} = {mb_s} must be a bandwidth of at least {MIN_BANDWIDTH_MB_S} MB/s"
        ));
    }
    Ok(())
}

/// The environment variable that multiplies every engine property test's case count.
pub const PROPTEST_SCALE_VAR: &str = "AFA_PROPTEST_SCALE";

/// The cases a property test of the engines runs: `base`, times the whole number in
/// `AFA_PROPTEST_SCALE` when it is set. The suite's counts keep CI within its time; a soak
/// (`AFA_PROPTEST_SCALE=20 cargo test --workspace --lib`) runs many more, with fresh random
/// inputs, and is how the power-loss tests found a recovery bug the base counts had missed
/// (docs/scalaafa.md). Only tests call this; a value that is not a positive whole number
/// stops the test with a message naming the variable.
pub fn proptest_cases(base: u32) -> u32 {
    scaled_cases(base, std::env::var(PROPTEST_SCALE_VAR).ok().as_deref())
        .unwrap_or_else(|e| panic!("{e}"))
}

/// `base` cases scaled by the factor `scale` spells, if any.
fn scaled_cases(base: u32, scale: Option<&str>) -> Result<u32, String> {
    let Some(text) = scale else {
        return Ok(base);
    };
    match text.trim().parse::<u32>() {
        Ok(factor) if factor > 0 => Ok(base.saturating_mul(factor)),
        _ => Err(format!(
            "{PROPTEST_SCALE_VAR} = {text:?} must be a positive whole number"
        )),
    }
}

/// A 64-bit FNV-1a style running hash of the events a simulation processed.
///
/// Two runs with the same seed must feed it the same sequence of values; comparing the final
/// hash is the cheapest proof that the simulated path is deterministic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventLogHash {
    state: u64,
    events: u64,
}

impl Default for EventLogHash {
    fn default() -> Self {
        Self::new()
    }
}

impl EventLogHash {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    pub fn new() -> Self {
        Self {
            state: Self::OFFSET_BASIS,
            events: 0,
        }
    }

    /// Mixes one event, described by its time and two words of detail, into the hash.
    #[inline]
    pub fn record(&mut self, time_ns: TimeNs, kind: u64, detail: u64) {
        // Mixing whole words (rather than bytes) keeps this cheap enough for the hot path;
        // the multiply-xorshift step spreads every input bit over the state.
        for word in [time_ns, kind, detail] {
            self.state ^= word;
            self.state = self.state.wrapping_mul(Self::PRIME);
            self.state ^= self.state >> 29;
        }
        self.events += 1;
    }

    pub fn value(&self) -> u64 {
        self.state
    }

    pub fn events(&self) -> u64 {
        self.events
    }
}

/// The source of "now". Simulation advances a virtual clock; serve mode reads the wall clock.
/// Engines ask this trait, never `Instant::now()`, so the same code runs in both modes.
pub trait Clock {
    fn now_ns(&self) -> TimeNs;
}

/// A clock that only moves when the simulation moves it.
#[derive(Debug, Default, Clone, Copy)]
pub struct VirtualClock {
    now_ns: TimeNs,
}

impl VirtualClock {
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward. Time never runs backwards: an event in the past is a bug
    /// in whoever scheduled it, and the assertion makes it loud.
    pub fn advance_to(&mut self, t_ns: TimeNs) {
        assert!(
            t_ns >= self.now_ns,
            "virtual time ran backwards: {t_ns} < {}",
            self.now_ns
        );
        self.now_ns = t_ns;
    }
}

impl Clock for VirtualClock {
    fn now_ns(&self) -> TimeNs {
        self.now_ns
    }
}

/// Converts a byte count moved at `mb_per_s` (10^6 bytes per second) into nanoseconds, rounded up
/// so that a transfer never takes zero time.
#[inline]
pub fn transfer_ns(bytes: u64, mb_per_s: f64) -> u64 {
    if mb_per_s <= 0.0 || bytes == 0 {
        return 0;
    }
    let ns = bytes as f64 * 1_000.0 / mb_per_s;
    ns.ceil() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_hash_depends_on_order() {
        let mut a = EventLogHash::new();
        a.record(1, 2, 3);
        a.record(4, 5, 6);
        let mut b = EventLogHash::new();
        b.record(4, 5, 6);
        b.record(1, 2, 3);
        assert_ne!(a.value(), b.value());
        assert_eq!(a.events(), 2);
    }

    #[test]
    fn damage_flips_the_bytes_at_their_positions_and_cuts_the_rest() {
        let mut bytes = vec![0u8; 10];
        damage_bytes(&mut bytes, &[(0.0, 0xff), (0.55, 1), (1.0, 2)], None);
        assert_eq!(bytes, [0xff, 0, 0, 0, 0, 1, 0, 0, 0, 2]);
        damage_bytes(&mut bytes, &[(0.0, 0xff)], Some(0.5));
        assert_eq!(bytes, [0, 0, 0, 0, 0]);
        let mut empty = Vec::new();
        damage_bytes(&mut empty, &[(0.5, 1)], Some(0.5));
        assert!(empty.is_empty());
    }

    #[test]
    fn property_test_cases_scale_by_a_positive_whole_factor_only() {
        assert_eq!(scaled_cases(16, None), Ok(16));
        assert_eq!(scaled_cases(16, Some("20")), Ok(320));
        assert_eq!(scaled_cases(16, Some(" 3 ")), Ok(48));
        assert_eq!(scaled_cases(u32::MAX, Some("2")), Ok(u32::MAX));
        for bad in ["0", "-1", "2.5", "", "many"] {
            let e = scaled_cases(16, Some(bad)).unwrap_err();
            assert!(e.contains(PROPTEST_SCALE_VAR), "{e}");
        }
    }

    #[test]
    fn transfer_time_of_a_page() {
        // 4096 bytes at 800 MB/s is 5.12 µs.
        assert_eq!(transfer_ns(4096, 800.0), 5120);
        assert_eq!(transfer_ns(0, 800.0), 0);
    }

    #[test]
    #[should_panic(expected = "virtual time ran backwards")]
    fn clock_refuses_to_go_back() {
        let mut c = VirtualClock::new();
        c.advance_to(10);
        c.advance_to(5);
    }
}
