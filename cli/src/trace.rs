//! `afa trace …`: statistics of a trace in the columns of ScalaAFA's Table 2, synthesized
//! look-alikes of Table 2's traces, and conversion between formats with the transformations
//! of `afa_workload::trace::transform`. Also loads the trace of a run's `[workload.trace]`.

use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};

use afa_workload::trace::stats::TraceStats;
use afa_workload::trace::synth::{self, SynthOptions, Synthesizer};
use afa_workload::trace::transform::TraceTransform;
use afa_workload::trace::{guess_format, read_trace, write_trace, TraceFormat, TraceRecord};

use crate::config::TraceConfig;

#[derive(Debug, Subcommand)]
pub enum TraceCommand {
    /// Prints a trace's write/read counts, average sizes and data volumes (Table 2's columns).
    Stats(StatsArgs),
    /// Writes a synthetic trace with the statistics of one of Table 2's traces.
    Synth(SynthArgs),
    /// Rewrites a trace in another format, optionally scaling time, remapping volumes and
    /// wrapping addresses into a device.
    Convert(ConvertArgs),
}

#[derive(Debug, Args)]
pub struct StatsArgs {
    pub file: PathBuf,
    /// msr, blkparse, fiu, iolog, ascii, spc, alibaba or tencent (default: guessed from the
    /// first line).
    #[arg(long)]
    pub format: Option<String>,
    /// Also prints this Table 2 row (proxy0, prn, src2, CFS, DAP, webmail) and the ratios of
    /// the trace's figures to it, counts and data divided by the trace's share of the row's
    /// requests.
    #[arg(long, value_name = "ROW")]
    pub against: Option<String>,
    /// Prints JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct SynthArgs {
    /// The Table 2 row to imitate: proxy0, prn, src2, CFS, DAP or webmail.
    #[arg(long)]
    pub like: String,
    /// Fraction of the row's request counts (1: the full trace, e.g. 12.5 million requests
    /// for proxy0).
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Output format (msr, blkparse, fiu, iolog, ascii, spc, alibaba or tencent).
    #[arg(long, default_value = "msr")]
    pub format: String,
    /// Output file (default: standard output).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Size of the address space in bytes (a multiple of 4 KiB, at least 1 MiB).
    #[arg(long, default_value_t = 16 << 30)]
    pub volume_bytes: u64,
    /// Mean arrival rate (default: the full row spread over one week).
    #[arg(long)]
    pub iops: Option<f64>,
    /// Probability that a request continues the previous request of its kind.
    #[arg(long, default_value_t = 0.3)]
    pub sequential: f64,
    /// Probability that a jump lands in the hot set.
    #[arg(long, default_value_t = 0.8)]
    pub hot_access: f64,
    /// Fraction of the volume in the hot set.
    #[arg(long, default_value_t = 0.2)]
    pub hot_space: f64,
    /// Zipf exponent of the hot extents' popularity.
    #[arg(long, default_value_t = 0.9)]
    pub zipf: f64,
}

#[derive(Debug, Args)]
pub struct ConvertArgs {
    pub input: PathBuf,
    pub output: PathBuf,
    /// Input format (default: guessed from the first line).
    #[arg(long)]
    pub from: Option<String>,
    /// Output format.
    #[arg(long)]
    pub to: String,
    /// Multiplier on timestamps (0.5: twice as fast).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Keeps only these volumes and lays them side by side, in this order (e.g. 0,2).
    #[arg(long, value_delimiter = ',')]
    pub volumes: Vec<u32>,
    /// Distance between the laid-out volumes (default: the largest end offset, rounded up
    /// to 1 MiB).
    #[arg(long)]
    pub volume_stride_bytes: Option<u64>,
    /// Wraps offsets into a device of this many bytes.
    #[arg(long)]
    pub wrap_bytes: Option<u64>,
    /// Alignment of wrapped requests.
    #[arg(long, default_value_t = 512)]
    pub align_bytes: u64,
}

pub fn run(command: TraceCommand) -> Result<(), String> {
    match command {
        TraceCommand::Stats(args) => stats(args),
        TraceCommand::Synth(args) => synthesize(args),
        TraceCommand::Convert(args) => convert(args),
    }
}

pub fn parse_format(name: &str) -> Result<TraceFormat, String> {
    name.parse()
        .map_err(|e: afa_workload::WorkloadError| e.to_string())
}

/// The gzip format's first two bytes (RFC 1952).
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Opens the trace at `path` for reading, decompressing it on the fly when it is gzipped
/// (recognized by its first bytes, whatever its name): the public releases of the MSR,
/// Alibaba and Tencent traces are, and unpacked they take tens to hundreds of gigabytes.
/// A tar archive (Tencent's `.tgz` hours) is refused by name, since its members must be
/// taken out first.
pub fn open_trace(path: &Path) -> Result<Box<dyn BufRead>, String> {
    let source = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open trace {source}: {e}"))?;
    let mut raw = BufReader::new(file);
    let head = raw
        .fill_buf()
        .map_err(|e| format!("cannot read trace {source}: {e}"))?;
    let mut reader: Box<dyn BufRead> = if head.starts_with(&GZIP_MAGIC) {
        // Multi-member: gzip files joined with `cat` decompress as one stream, as gunzip
        // reads them.
        Box::new(BufReader::new(flate2::bufread::MultiGzDecoder::new(raw)))
    } else {
        Box::new(raw)
    };
    let head = reader
        .fill_buf()
        .map_err(|e| format!("cannot read trace {source}: {e}"))?;
    // A tar header carries "ustar" at byte 257 (POSIX.1-1988 and GNU alike).
    if head.get(257..262) == Some(b"ustar".as_slice()) {
        return Err(format!(
            "trace {source} is a tar archive: extract its files (tar -xf) and give one of them"
        ));
    }
    Ok(reader)
}

/// Reads the trace at `path` (gzipped or not), in `format` or the guessed one.
pub fn read_file(path: &Path, format: Option<&str>) -> Result<Vec<TraceRecord>, String> {
    let source = path.display().to_string();
    let mut reader = open_trace(path)?;
    let format = match format {
        Some(name) => parse_format(name)?,
        None => {
            // The first few KiB are enough to see the first line of any format.
            let head = reader
                .fill_buf()
                .map_err(|e| format!("cannot read trace {source}: {e}"))?;
            let head = String::from_utf8_lossy(head);
            guess_format(&head).ok_or_else(|| {
                format!("cannot tell the format of trace {source}; give it with --format")
            })?
        }
    };
    read_trace(reader, format, &source).map_err(|e| e.to_string())
}

fn stats(args: StatsArgs) -> Result<(), String> {
    let records = read_file(&args.file, args.format.as_deref())?;
    let stats = TraceStats::of(&records);
    let mut row = stats.table2_row();
    row.name = args
        .file
        .file_stem()
        .map_or("trace".to_string(), |s| s.to_string_lossy().into_owned());
    let reference = match &args.against {
        Some(name) => Some(synth::profile(name).ok_or_else(|| {
            format!(
                "no Table 2 row '{name}' (rows: {})",
                synth::profile_names().join(", ")
            )
        })?),
        None => None,
    };
    // The trace's share of the row's requests, so that a scaled synthesized trace compares
    // with the full row.
    let share = reference.as_ref().map(|reference| {
        (row.write_kops + row.read_kops) / (reference.write_kops + reference.read_kops)
    });
    let ratios = reference.as_ref().zip(share).map(|(reference, share)| {
        let ratio = |got: f64, want: f64| if want == 0.0 { 0.0 } else { got / want };
        afa_workload::trace::stats::Table2Row {
            name: "ratio".to_string(),
            write_kops: ratio(row.write_kops / share, reference.write_kops),
            read_kops: ratio(row.read_kops / share, reference.read_kops),
            write_avg_kib: ratio(row.write_avg_kib, reference.write_avg_kib),
            read_avg_kib: ratio(row.read_avg_kib, reference.read_avg_kib),
            written_gib: ratio(row.written_gib / share, reference.written_gib),
            read_gib: ratio(row.read_gib / share, reference.read_gib),
        }
    });
    if args.json {
        let value = serde_json::json!({
            "file": args.file.display().to_string(),
            "stats": stats,
            "table2": row,
            "against": reference,
            "share": share,
            "ratio": ratios,
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&value).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    println!("{}", afa_workload::trace::stats::Table2Row::header());
    println!("{}", row.format());
    if let (Some(reference), Some(ratios), Some(share)) = (&reference, &ratios, share) {
        println!("{}", reference.format());
        println!(
            "{:<12} {:>12.3} {:>12.3} {:>14.3} {:>14.3} {:>10.3} {:>10.3}",
            "ratio",
            ratios.write_kops,
            ratios.read_kops,
            ratios.write_avg_kib,
            ratios.read_avg_kib,
            ratios.written_gib,
            ratios.read_gib
        );
        println!(
            "(counts and data of the trace divided by its share {share:.6} of the row's requests)"
        );
    }
    println!(
        "trims {}, flushes {}, duration {:.3} s, highest offset {} bytes, volumes {}",
        stats.trim_count,
        stats.flush_count,
        stats.duration_ns as f64 / 1e9,
        stats.end_offset_bytes,
        stats.volumes
    );
    Ok(())
}

fn synthesize(args: SynthArgs) -> Result<(), String> {
    let profile = synth::profile(&args.like).ok_or_else(|| {
        format!(
            "no Table 2 row '{}' (rows: {})",
            args.like,
            synth::profile_names().join(", ")
        )
    })?;
    let format = parse_format(&args.format)?;
    let mut options = SynthOptions::new(profile);
    options.scale = args.scale;
    options.seed = args.seed;
    options.volume_bytes = args.volume_bytes;
    options.rate_iops = args.iops;
    options.sequential_fraction = args.sequential;
    options.hot_access_fraction = args.hot_access;
    options.hot_space_fraction = args.hot_space;
    options.zipf_exponent = args.zipf;
    let synthesizer = Synthesizer::new(options)?;
    write_records(synthesizer, format, args.out.as_deref())
}

/// Writes `records` as a `format` trace to `out` (gzipped when its name ends in `.gz`), or
/// to standard output.
pub fn write_records<I>(records: I, format: TraceFormat, out: Option<&Path>) -> Result<(), String>
where
    I: IntoIterator,
    I::Item: std::borrow::Borrow<TraceRecord>,
{
    if let Some(path) = out.filter(|p| p.extension().is_some_and(|e| e == "gz")) {
        // A `.gz` output is gzipped, so a converted trace can stay as compact as the
        // releases it came from; the encoder's trailer is written, and its errors seen, by
        // `finish`.
        let name = path.display().to_string();
        let failed = |e: std::io::Error| format!("writing {format} trace to {name}: {e}");
        let file = std::fs::File::create(path).map_err(|e| format!("cannot create {name}: {e}"))?;
        let mut encoder = flate2::write::GzEncoder::new(file, flate2::Compression::default());
        write_trace(records, format, BufWriter::new(&mut encoder)).map_err(failed)?;
        encoder.finish().map_err(failed)?;
        return Ok(());
    }
    let (writer, name): (Box<dyn Write>, String) = match out {
        Some(path) => (
            Box::new(
                std::fs::File::create(path)
                    .map_err(|e| format!("cannot create {}: {e}", path.display()))?,
            ),
            path.display().to_string(),
        ),
        None => (Box::new(std::io::stdout().lock()), "standard output".into()),
    };
    write_trace(records, format, BufWriter::new(writer))
        .map_err(|e| format!("writing {format} trace to {name}: {e}"))
}

fn convert(args: ConvertArgs) -> Result<(), String> {
    let records = read_file(&args.input, args.from.as_deref())?;
    let format = parse_format(&args.to)?;
    let transform = TraceTransform {
        time_scale: args.time_scale,
        volumes: args.volumes,
        volume_stride_bytes: args.volume_stride_bytes,
        wrap_bytes: args.wrap_bytes,
        align_bytes: args.align_bytes,
    };
    let records = transform.apply(records)?;
    write_records(records, format, Some(&args.output))
}

/// Reads the trace of a run's `[workload.trace]` table and applies its volume options
/// (its `time_scale` is applied by the replay itself).
pub fn load_records(t: &TraceConfig, base: &Path) -> Result<Vec<TraceRecord>, String> {
    let path = base.join(&t.path);
    let format = parse_format(&t.format).map_err(|e| format!("workload.trace.format: {e}"))?;
    let source = path.display().to_string();
    let records = read_trace(open_trace(&path)?, format, &source).map_err(|e| e.to_string())?;
    let transform = TraceTransform {
        volumes: t.volumes.clone(),
        volume_stride_bytes: t.volume_stride_bytes,
        ..TraceTransform::default()
    };
    transform
        .apply(records)
        .map_err(|e| format!("workload.trace: {e}"))
}
