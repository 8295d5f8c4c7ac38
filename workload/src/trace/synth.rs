//! Synthetic traces with the statistics of ScalaAFA's Table 2, for experiments where the
//! real trace cannot be shipped.
//!
//! A [`Synthesizer`] yields exactly `round(scale × count)` writes and reads of the chosen
//! row, in a seeded order, and reproduces the row's average request sizes; the data written
//! and read then follow (count × average). Everything Table 2 does not state is a model,
//! documented here and in docs/traces.md, with every parameter in [`SynthOptions`]:
//!
//! * **Order.** Each request is a write with probability (writes left) / (requests left),
//!   so the counts are exact and the two kinds are evenly interleaved.
//! * **Sizes.** A request is `unit × (1 + G)` bytes, `G` geometric with mean
//!   `average / unit − 1`, where the unit is 4 KiB when the row's average for that kind is
//!   at least 4 KiB and 512 bytes otherwise. The geometric law is the maximum-entropy law on
//!   whole units with that mean: mostly single units, with a tail of large requests, as in
//!   the real traces. So that short (scaled) traces match the average too, the law's mean
//!   is nudged by the running deficit: each draw's mean is the row's average plus 1/16 of
//!   the bytes the trace is short of (count so far × average − bytes so far). The deficit
//!   then reverts to zero and the sample mean converges like 1/n instead of 1/√n.
//! * **Arrivals.** A Poisson process. Table 2 gives no durations; the default rate spreads
//!   the full row over one week (the span of the MSR Cambridge traces) and is kept when the
//!   counts are scaled, so a scaled trace is a shorter slice of the same load.
//! * **Locality.** With probability `sequential_fraction` a request continues the run of
//!   the previous request of the same kind (it starts where that one ended). Otherwise it
//!   jumps: with probability `hot_access_fraction` into the hot set, `hot_space_fraction` of
//!   the volume cut into 1 MiB extents, the extent picked by a Zipf law of exponent
//!   `zipf_exponent` over the extents' popularity ranks (ranks scattered over the volume by a
//!   fixed bijection), and else uniformly over the whole volume. Jumps land on unit
//!   boundaries. Reads and writes share the model, so reads find recently written data.
//!
//! A seed reproduces a trace exactly.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::stats::Table2Row;
use super::TraceRecord;
use crate::generator::{scatter, uniform_unit, ZipfSampler};
use crate::IoOp;

/// The rows of ScalaAFA's Table 2: name, write and read counts (thousands), average write and
/// read sizes (KiB), data written and read (GiB).
const TABLE2: [(&str, [f64; 6]); 6] = [
    ("proxy0", [12135.4, 383.5, 4.6, 8.3, 53.8, 3.1]),
    ("prn", [7753.0, 9066.3, 10.4, 22.5, 76.8, 194.5]),
    ("src2", [2201.1, 1171.3, 23.2, 54.8, 48.8, 61.2]),
    ("CFS", [1173.0, 3304.1, 12.6, 8.7, 14.1, 27.3]),
    ("DAP", [475.3, 610.4, 97.2, 62.1, 44.1, 36.2]),
    ("webmail", [6381.9, 1413.8, 4.0, 4.0, 24.3, 5.4]),
];

/// The names of Table 2's rows, in the table's order.
pub fn profile_names() -> Vec<&'static str> {
    TABLE2.iter().map(|(name, _)| *name).collect()
}

/// The Table 2 row called `name` (case-insensitive).
pub fn profile(name: &str) -> Option<Table2Row> {
    TABLE2
        .iter()
        .find(|(row, _)| row.eq_ignore_ascii_case(name))
        .map(|(row, values)| Table2Row {
            name: row.to_string(),
            write_kops: values[0],
            read_kops: values[1],
            write_avg_kib: values[2],
            read_avg_kib: values[3],
            written_gib: values[4],
            read_gib: values[5],
        })
}

/// One week, the span of the MSR Cambridge traces, over which the default arrival rate
/// spreads a full row.
pub const DEFAULT_SPAN_NS: u64 = 7 * 24 * 3600 * 1_000_000_000;

/// Everything that decides a synthesized trace.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthOptions {
    /// The Table 2 row to imitate.
    pub profile: Table2Row,
    /// Fraction of the row's request counts to generate (1 is the full trace).
    pub scale: f64,
    pub seed: u64,
    /// Size of the address space; a multiple of 4 KiB and at least one extent (1 MiB).
    pub volume_bytes: u64,
    /// Mean arrival rate; `None` spreads the full row over [`DEFAULT_SPAN_NS`].
    pub rate_iops: Option<f64>,
    pub sequential_fraction: f64,
    pub hot_access_fraction: f64,
    pub hot_space_fraction: f64,
    pub zipf_exponent: f64,
}

impl SynthOptions {
    /// The documented defaults for `profile`.
    pub fn new(profile: Table2Row) -> SynthOptions {
        SynthOptions {
            profile,
            scale: 1.0,
            seed: 1,
            volume_bytes: 16 << 30,
            rate_iops: None,
            sequential_fraction: 0.3,
            hot_access_fraction: 0.8,
            hot_space_fraction: 0.2,
            zipf_exponent: 0.9,
        }
    }

    /// Checks the options, naming the first bad one.
    pub fn validate(&self) -> Result<(), String> {
        let fraction = |name: &str, value: f64| {
            if (0.0..=1.0).contains(&value) {
                Ok(())
            } else {
                Err(format!("{name} {value} is not a fraction in [0, 1]"))
            }
        };
        if !(self.scale.is_finite() && self.scale > 0.0) {
            return Err(format!("scale {} is not a positive number", self.scale));
        }
        if self.volume_bytes < EXTENT_BYTES || self.volume_bytes % LARGE_UNIT_BYTES != 0 {
            return Err(format!(
                "volume size {} bytes is not a multiple of 4 KiB of at least 1 MiB",
                self.volume_bytes
            ));
        }
        if let Some(rate) = self.rate_iops {
            if !(rate.is_finite() && rate > 0.0) {
                return Err(format!("rate {rate} IOPS is not a positive number"));
            }
        }
        fraction("sequential fraction", self.sequential_fraction)?;
        fraction("hot access fraction", self.hot_access_fraction)?;
        fraction("hot space fraction", self.hot_space_fraction)?;
        if !(self.zipf_exponent.is_finite() && self.zipf_exponent > 0.0) {
            return Err(format!(
                "zipf exponent {} is not a positive number",
                self.zipf_exponent
            ));
        }
        let p = &self.profile;
        for (name, value) in [
            ("write count", p.write_kops),
            ("read count", p.read_kops),
            ("average write size", p.write_avg_kib),
            ("average read size", p.read_avg_kib),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(format!("profile {}: {name} {value} is negative", p.name));
            }
        }
        for (name, average_kib) in [("write", p.write_avg_kib), ("read", p.read_avg_kib)] {
            if average_kib * 1024.0 < SMALL_UNIT_BYTES as f64 && average_kib > 0.0 {
                return Err(format!(
                    "profile {}: average {name} size {average_kib} KiB is below one sector",
                    p.name
                ));
            }
        }
        Ok(())
    }

    /// Writes and reads the trace will hold.
    pub fn counts(&self) -> (u64, u64) {
        let count = |kops: f64| (kops * 1000.0 * self.scale).round() as u64;
        (
            count(self.profile.write_kops),
            count(self.profile.read_kops),
        )
    }
}

const SMALL_UNIT_BYTES: u64 = 512;
const LARGE_UNIT_BYTES: u64 = 4096;
const EXTENT_BYTES: u64 = 1 << 20;

/// How much of the running size deficit one draw makes up.
const DEFICIT_FEEDBACK: f64 = 1.0 / 16.0;

/// How sizes of one kind of request are drawn.
#[derive(Debug, Clone, Copy)]
struct SizeLaw {
    unit_bytes: u64,
    average_bytes: f64,
    /// Bytes the requests drawn so far are short of their count times the average.
    deficit_bytes: f64,
}

impl SizeLaw {
    fn new(average_kib: f64) -> SizeLaw {
        let average_bytes = average_kib * 1024.0;
        let unit_bytes = if average_bytes >= LARGE_UNIT_BYTES as f64 {
            LARGE_UNIT_BYTES
        } else {
            SMALL_UNIT_BYTES
        };
        SizeLaw {
            unit_bytes,
            average_bytes,
            deficit_bytes: 0.0,
        }
    }

    fn sample(&mut self, rng: &mut ChaCha8Rng) -> u64 {
        let unit = self.unit_bytes as f64;
        let mean_bytes = self.average_bytes + self.deficit_bytes * DEFICIT_FEEDBACK;
        let extra_units_mean = (mean_bytes / unit - 1.0).max(0.0);
        let extra = if extra_units_mean <= 0.0 {
            0
        } else {
            // Inversion of the geometric law on {0, 1, ...} with success probability
            // p = 1 / (1 + mean): floor(ln U / ln(1 − p)), U uniform in (0, 1].
            let p = 1.0 / (1.0 + extra_units_mean);
            let u = 1.0 - uniform_unit(rng);
            (u.ln() / (1.0 - p).ln()).floor() as u64
        };
        let bytes = self.unit_bytes.saturating_mul(extra.saturating_add(1));
        self.deficit_bytes += self.average_bytes - bytes as f64;
        bytes
    }
}

/// An iterator over a synthesized trace; see the module documentation for the model.
#[derive(Debug)]
pub struct Synthesizer {
    options: SynthOptions,
    rng: ChaCha8Rng,
    writes_left: u64,
    reads_left: u64,
    write_size: SizeLaw,
    read_size: SizeLaw,
    zipf: ZipfSampler,
    extents: u64,
    mean_gap_ns: f64,
    clock_ns: f64,
    /// Where the last write and the last read ended, for sequential runs.
    run_end_bytes: [Option<u64>; 2],
}

impl Synthesizer {
    /// Starts a trace; fails when [`SynthOptions::validate`] does.
    pub fn new(options: SynthOptions) -> Result<Synthesizer, String> {
        options.validate()?;
        let (writes, reads) = options.counts();
        let extents = options.volume_bytes / EXTENT_BYTES;
        let hot_extents = ((extents as f64 * options.hot_space_fraction) as u64).clamp(1, extents);
        let full_requests = (options.profile.write_kops + options.profile.read_kops) * 1000.0;
        let rate_iops = options
            .rate_iops
            .unwrap_or(full_requests / (DEFAULT_SPAN_NS as f64 / 1e9));
        let mean_gap_ns = if rate_iops > 0.0 {
            1e9 / rate_iops
        } else {
            0.0
        };
        Ok(Synthesizer {
            rng: ChaCha8Rng::seed_from_u64(options.seed),
            writes_left: writes,
            reads_left: reads,
            write_size: SizeLaw::new(options.profile.write_avg_kib),
            read_size: SizeLaw::new(options.profile.read_avg_kib),
            zipf: ZipfSampler::new(hot_extents, options.zipf_exponent),
            extents,
            mean_gap_ns,
            clock_ns: 0.0,
            run_end_bytes: [None, None],
            options,
        })
    }

    /// Requests not yet yielded.
    pub fn remaining(&self) -> u64 {
        self.writes_left + self.reads_left
    }

    fn jump(&mut self, unit_bytes: u64, len_bytes: u64) -> u64 {
        let volume = self.options.volume_bytes;
        let start = if uniform_unit(&mut self.rng) < self.options.hot_access_fraction {
            let rank = self.zipf.sample(&mut self.rng) - 1;
            let extent = scatter(rank, self.extents);
            let within = (uniform_unit(&mut self.rng) * EXTENT_BYTES as f64) as u64;
            extent * EXTENT_BYTES + within
        } else {
            (uniform_unit(&mut self.rng) * volume as f64) as u64
        };
        let start = start / unit_bytes * unit_bytes;
        start.min(volume - len_bytes)
    }
}

impl Iterator for Synthesizer {
    type Item = TraceRecord;

    fn next(&mut self) -> Option<TraceRecord> {
        let total = self.remaining();
        if total == 0 {
            return None;
        }
        let is_write = (uniform_unit(&mut self.rng) * total as f64) < self.writes_left as f64;
        // Rounding could pick a kind that is used up; the other kind is then left.
        let is_write = if is_write {
            self.writes_left > 0
        } else {
            self.reads_left == 0
        };
        let (op, law, kind) = if is_write {
            self.writes_left -= 1;
            (IoOp::Write, &mut self.write_size, 0)
        } else {
            self.reads_left -= 1;
            (IoOp::Read, &mut self.read_size, 1)
        };
        let unit_bytes = law.unit_bytes;
        let len_bytes = law.sample(&mut self.rng).min(self.options.volume_bytes);
        let sequential = uniform_unit(&mut self.rng) < self.options.sequential_fraction;
        let offset_bytes = match self.run_end_bytes[kind] {
            Some(end) if sequential && end + len_bytes <= self.options.volume_bytes => end,
            _ => self.jump(unit_bytes, len_bytes),
        };
        self.run_end_bytes[kind] = Some(offset_bytes + len_bytes);
        let timestamp_ns = self.clock_ns as u64;
        // Exponential gaps make the arrivals a Poisson process.
        let u = 1.0 - uniform_unit(&mut self.rng);
        self.clock_ns += -u.ln() * self.mean_gap_ns;
        Some(TraceRecord {
            timestamp_ns,
            op,
            offset_bytes,
            len_bytes,
            volume: 0,
            fua: false,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = usize::try_from(self.remaining()).unwrap_or(usize::MAX);
        (left, Some(left))
    }
}
