//! `afa serve`: the configured volume as an NBD export, and `afa bench serve`: fio's nbd
//! engine against afa and against `nbdkit memory` in the same run.

use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use afa_array::{
    Array, ArrayConfig, HostMemory, LogRaid, NvramLog, ScalaAfa, Swan, TwoPhase, META_TAG_BYTES,
    TWO_PHASE_TAG_BYTES,
};
use afa_nand::PayloadMode;
use afa_ox::{FlashImage, OxServedDevice};
use afa_serve::{
    FileDevice, FileNvram, ListenAddr, MemberRecord, Pace, ServeConfig, Server, SharedVolume,
    StateDir,
};
use afa_sim::TimeNs;
use afa_ssd::{
    BlockDevice, Command as DeviceCommand, Completion, DeviceError, DeviceInfo, ReadBuffers, Ssd,
};
use afa_waflash::{WaflashConfig, WaflashImage, WaflashReport, WaflashSsd};
use clap::{Args, ValueEnum};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::config::RunConfig;
use crate::serve_members::{
    engine_files, positions_to_fail, swan_spare_files, FailableEngine, RecordedFailures,
};
use crate::volume::{ArraySpec, ArrayVolume, EngineChoice};

/// How replies are timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PaceArg {
    /// A reply leaves no earlier than the emulated device's completion time.
    Model,
    /// Replies leave as soon as the command is applied.
    None,
}

impl From<PaceArg> for Pace {
    fn from(p: PaceArg) -> Self {
        match p {
            PaceArg::Model => Pace::Model,
            PaceArg::None => Pace::None,
        }
    }
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The volume's configuration (`[ssd]`, `[array]`, `[ox]` for one OX SSD, or
    /// `[waflash]` for one WAFLASH SSD; other tables are ignored). The embedded default
    /// volume when absent.
    pub config: Option<PathBuf>,
    /// `IP:PORT` or `unix:/path/to.sock`.
    #[arg(long, default_value = "127.0.0.1:10809")]
    pub listen: String,
    /// `model`: replies are paced by the emulated devices' timing; `none`: at once.
    #[arg(long, value_enum, default_value_t = PaceArg::Model)]
    pub pace: PaceArg,
    /// Keep the volume in files under DIR (one per member, or the OX SSD's flash image),
    /// so it survives restarts.
    #[arg(long)]
    pub state: Option<PathBuf>,
    /// The export's name (clients may also ask for the default export, "").
    #[arg(long, default_value = "afa")]
    pub export: String,
    /// Connections served at once.
    #[arg(long, default_value_t = 16)]
    pub max_connections: usize,
    /// The largest read or write request in bytes.
    #[arg(long, default_value_t = 32 << 20)]
    pub max_request_bytes: u32,
    /// Overrides one key of the configuration, `array.level=raid6`; repeatable, applied in
    /// order.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<crate::config::Override>,
    /// Log every connection, not only errors.
    #[arg(long)]
    pub verbose: bool,
    /// Serve the volume read-only: the export says so, and writes, trims and
    /// write-zeroes get EPERM.
    #[arg(long)]
    pub read_only: bool,
}

/// Reads the volume tables of a run configuration. Unlike `afa run`, serve mode needs no
/// `[workload]`: the clients are the workload.
fn load_volume_config(
    path: Option<&Path>,
    overrides: &[crate::config::Override],
) -> Result<(RunConfig, String), String> {
    let (config, _, source) = crate::config::read_config(path, overrides, None)?;
    config
        .ssd
        .validate()
        .map_err(|e| format!("configuration {source}: {e}"))?;
    if let Some(a) = &config.array {
        if a.log.is_some() as u32 + a.two_phase.is_some() as u32 + a.scalaafa.is_some() as u32 > 1 {
            return Err(format!(
                "configuration {source}: [array.log], [array.two_phase] and [array.scalaafa] are separate engines; choose one"
            ));
        }
    }
    if let Some(ox) = &config.ox {
        // One OX SSD is the whole volume; an array over OX members is not wired, and
        // silently serving [ssd] or [array] instead would serve something else than asked.
        if config.array.is_some() {
            return Err(format!(
                "configuration {source}: [ox] serves one OX SSD and cannot be combined with [array]"
            ));
        }
        if config.waflash.is_some() {
            return Err(format!(
                "configuration {source}: [ox] and [waflash] are separate device kinds; choose one"
            ));
        }
        ox.validate()
            .map_err(|e| format!("configuration {source}: ox: {e}"))?;
        if ox.payload != PayloadMode::Token {
            return Err(format!(
                "configuration {source}: ox.payload must be \"token\" in serve mode: every read is checked against the version token of its RBLOCK"
            ));
        }
    }
    if let Some(waflash) = &config.waflash {
        // One WAFLASH SSD is the whole volume, as with [ox]; serving [ssd] or an array
        // instead would serve something else than asked.
        if config.array.is_some() {
            return Err(format!(
                "configuration {source}: [waflash] serves one WAFLASH SSD and cannot be combined with [array]"
            ));
        }
        waflash
            .ssd
            .validate()
            .map_err(|e| format!("configuration {source}: waflash.ssd: {e}"))?;
    }
    if config.precondition.fill_fraction > 0.0 {
        return Err(format!(
            "configuration {source}: [precondition] is not supported in serve mode (its fill carries no real bytes); set fill_fraction = 0"
        ));
    }
    Ok((config, source))
}

/// An array engine built by the shared volume builder, as one device the engine thread
/// can own.
struct ArrayDevice {
    volume: ArrayVolume,
    info: DeviceInfo,
}

impl std::fmt::Debug for ArrayDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArrayDevice")
            .field("info", &self.info)
            .finish()
    }
}

impl BlockDevice for ArrayDevice {
    fn info(&self) -> DeviceInfo {
        self.info
    }

    fn media_faults(&self) -> afa_nand::MediaFaults {
        self.volume.device_ref().media_faults()
    }
    fn submit(
        &mut self,
        now_ns: TimeNs,
        cmd: &DeviceCommand<'_>,
        out: ReadBuffers<'_>,
    ) -> Result<Completion, DeviceError> {
        self.volume.device().submit(now_ns, cmd, out)
    }
    fn background(&mut self, now_ns: TimeNs) -> Option<TimeNs> {
        self.volume.device().background(now_ns)
    }
    fn trim_is_durable(&self) -> bool {
        self.volume.device_ref().trim_is_durable()
    }
    fn allocation(&self, lba: u64, sectors: u32) -> Option<Vec<(u32, bool)>> {
        self.volume.device_ref().allocation(lba, sectors)
    }
}

/// A built volume: what the server drives, a description for clients and logs, and the
/// state directory's lock (held as long as the volume lives).
pub struct Volume {
    pub served: Served,
    pub description: String,
    pub state: Option<StateDir>,
    /// A WAFLASH SSD's report as of its last flush, printed when the server stops (the
    /// engine flushes the device as it stops, so it covers the whole run).
    pub waflash_report: Option<Arc<Mutex<Option<WaflashReport>>>>,
    /// Why the volume can only be read (an OX SSD that came up without free EBLOCKs);
    /// the export is then served read-only.
    pub read_only: Option<String>,
}

/// How the server drives a volume.
pub enum Served {
    /// One device, applied by the server's engine (behind its lock, or on its thread).
    Device(Box<dyn BlockDevice + Send>),
    /// A volume that runs threads of its own and takes requests from many at once:
    /// ScalaAFA, whose I/O threads, daemon and members run on OS threads (§5.2).
    Shared(Arc<dyn SharedVolume>),
}

impl Served {
    fn device(device: impl BlockDevice + Send + 'static) -> Self {
        Served::Device(Box::new(device))
    }

    #[cfg(test)]
    fn info(&self) -> DeviceInfo {
        match self {
            Served::Device(d) => d.info(),
            Served::Shared(v) => v.info(),
        }
    }
}

/// Serves ScalaAFA on its own threads, or, when it cannot run there (a member failed or
/// failures scheduled), as one device `fallback` wraps.
fn scalaafa_served<D, F>(engine: ScalaAfa<D>, fallback: F) -> Served
where
    D: BlockDevice + Send + std::fmt::Debug + 'static,
    F: FnOnce(ScalaAfa<D>) -> Served,
{
    match engine.into_threads() {
        Ok(threads) => {
            eprintln!(
                "afa serve: ScalaAFA runs {} I/O threads, its daemon and member agents on threads of their own",
                threads.io_threads()
            );
            Served::Shared(Arc::new(threads))
        }
        Err((engine, why)) => {
            eprintln!("afa serve: ScalaAFA runs on the server's engine thread: {why}");
            fallback(*engine)
        }
    }
}

fn engine_name(choice: &EngineChoice, level: afa_array::Level) -> String {
    let level = format!("{level:?}").to_lowercase();
    match choice {
        EngineChoice::Raid => level,
        EngineChoice::Log(_) => format!("log-raid over {level}"),
        EngineChoice::TwoPhase(_) => format!("two-phase over {level}"),
        EngineChoice::Swan(_) => format!("swan over {level} R-groups"),
        EngineChoice::ScalaAfa(_) => format!("scalaafa over {level}"),
    }
}

/// Builds the configured volume for serve mode: emulated SSDs that keep full bytes in
/// memory, or, with a state directory, file-backed members timed by the emulated SSDs.
pub fn build_volume(cfg: &RunConfig, state_dir: Option<&Path>) -> Result<Volume, String> {
    let seed = cfg.seed;
    if let Some(ox) = &cfg.ox {
        return build_ox_volume(ox, seed, state_dir);
    }
    if let Some(waflash) = &cfg.waflash {
        return build_waflash_volume(&waflash.ssd, seed, state_dir);
    }
    let Some(state_dir) = state_dir else {
        let mut ssd = cfg.ssd.clone();
        ssd.payload = PayloadMode::Full;
        let Some(array_cfg) = &cfg.array else {
            let device = Ssd::new(ssd, seed).map_err(|e| e.to_string())?;
            return Ok(Volume {
                served: Served::device(device),
                description: "afa: one emulated SSD in memory".into(),
                state: None,
                waflash_report: None,
                read_only: None,
            });
        };
        let spec = ArraySpec::from_config(array_cfg);
        let mut volume = ArrayVolume::build(&spec, &ssd, seed, 0)?;
        let info = volume.device().info();
        let description = format!(
            "afa: {} over {} emulated SSDs in memory",
            engine_name(&spec.choice, spec.engine.level),
            spec.engine.members
        );
        let served = match volume {
            ArrayVolume::ScalaAfa(engine) => scalaafa_served(*engine, |engine| {
                let volume = ArrayVolume::ScalaAfa(Box::new(engine));
                Served::device(ArrayDevice { volume, info })
            }),
            volume => Served::device(ArrayDevice { volume, info }),
        };
        return Ok(Volume {
            served,
            description,
            state: None,
            waflash_report: None,
            read_only: None,
        });
    };
    // File-backed members keep their bytes; the emulated SSD beside each keeps only the
    // timing (payload none), rebuilt empty at every start.
    let mut timing = cfg.ssd.clone();
    timing.payload = PayloadMode::None;
    let model = |seed: u64| Ssd::new(timing.clone(), seed).map_err(|e| e.to_string());
    let probe = model(seed)?.info();
    let (sector_bytes, member_sectors) = (probe.sector_bytes, probe.capacity_sectors);
    let Some(array_cfg) = &cfg.array else {
        let fingerprint =
            format!("afa volume: one SSD of {member_sectors} sectors of {sector_bytes} bytes");
        let state = StateDir::open(state_dir, &fingerprint).map_err(|e| e.to_string())?;
        let device = FileDevice::open(
            &state.member_path(0),
            sector_bytes,
            member_sectors,
            Some(Box::new(model(seed)?)),
        )
        .map_err(|e| e.to_string())?;
        return Ok(Volume {
            served: Served::device(device),
            description: format!("afa: one emulated SSD kept in {}", state_dir.display()),
            state: Some(state),
            waflash_report: None,
            read_only: None,
        });
    };
    let spec = ArraySpec::from_config(array_cfg);
    if spec.engine.stripe_cache_stripes > 0 {
        return Err(
            "--state cannot be combined with [array] stripe_cache_stripes: the stripe cache holds acknowledged writes in the server's memory, which a kill -9 would lose; set it to 0"
                .into(),
        );
    }
    if let EngineChoice::Swan(swan) = &spec.choice {
        if swan.age_fraction > 0.0 {
            return Err(
                "--state cannot be combined with [array.swan] age_fraction: aging is a measuring procedure that writes random data over the volume; set it to 0"
                    .into(),
            );
        }
    }
    let scala = match &spec.choice {
        EngineChoice::ScalaAfa(scala) => Some(scala.clone()),
        _ => None,
    };
    if scala
        .as_ref()
        .is_some_and(|s| s.sub_chunk_writes == afa_array::SubChunkWrites::InPlace)
    {
        return Err(
            "--state cannot be combined with [array.scalaafa] sub_chunk_writes = \"in-place\": --state recovers the volume as after a host crash over members with volatile caches, and an in-place update overwrites the only copy of its sectors the last flush made durable; use \"merge\""
                .into(),
        );
    }
    let engine: ArrayConfig = spec.engine.clone();
    // Member files, then spare files, each with an SSD of its own seed, as in simulation.
    let member_seed = |index: u64| {
        if index < engine.members as u64 {
            seed.wrapping_add(index)
        } else {
            seed.wrapping_add(1000 + index - engine.members as u64)
        }
    };
    // Each file holds what the smallest SSD exports, as the engines use of every member:
    // with factory bad blocks the SSDs differ in size, and every file sized by the first
    // one's model kept the volume from starting at all.
    let mut member_sectors = member_sectors;
    for index in 0..(engine.members + spec.spares) as u64 {
        member_sectors = member_sectors.min(model(member_seed(index))?.info().capacity_sectors);
    }
    let two_phase = match &spec.choice {
        EngineChoice::TwoPhase(t) => Some(t.clone()),
        _ => None,
    };
    // ScalaAFA (§5.4) and the two-phase engine keep their metadata in the OOB tags of every
    // chunk copy, so their members keep tags beside their bytes; RAID members need none.
    let needed_tag_bytes = match (&scala, &two_phase) {
        (Some(_), _) => Some(("ScalaAFA", META_TAG_BYTES)),
        (_, Some(_)) => Some(("two-phase", TWO_PHASE_TAG_BYTES)),
        _ => None,
    };
    let tag_bytes = match needed_tag_bytes {
        Some((name, needed)) if (probe.tag_bytes_per_sector as usize) < needed => {
            return Err(format!(
                "{name} with --state needs {needed} bytes of OOB tag per sector, but the SSD leaves {} (raise [ssd.geometry] oob_bytes_per_page)",
                probe.tag_bytes_per_sector
            ));
        }
        Some(_) => probe.tag_bytes_per_sector,
        None => 0,
    };
    let mut fingerprint = format!(
        "afa volume: {:?} over {} members and {} spares, chunk {} bytes, {member_sectors} sectors of {sector_bytes} bytes per member",
        engine.level, engine.members, spec.spares, engine.chunk_bytes
    );
    if let Some(scala) = &scala {
        // The tag format is part of the layout: tags written before the checksums existed,
        // or with another checksum, would all read as torn.
        fingerprint.push_str(&format!(
            ", {scala:?}, {tag_bytes} tag bytes per sector holding {META_TAG_BYTES} of metadata, data checksums {}",
            afa_array::scalaafa::PAYLOAD_CHECKSUM
        ));
    }
    match &spec.choice {
        EngineChoice::Swan(swan) => fingerprint.push_str(&format!(", {swan:?}")),
        EngineChoice::Log(log) => fingerprint.push_str(&format!(", {log:?}")),
        // The tags' data checksum is CRC-32 (it was FNV-1a): a directory written before
        // would read every copy as torn after an unclean stop.
        EngineChoice::TwoPhase(t) => fingerprint.push_str(&format!(
            ", {t:?}, {tag_bytes} tag bytes per sector with CRC-32 data checksums"
        )),
        _ => {}
    }
    if !spec.failures.is_empty() {
        fingerprint.push_str(&format!(", failures {:?}", spec.failures));
    }
    let state = StateDir::open(state_dir, &fingerprint).map_err(|e| e.to_string())?;
    // Which file serves each member position, after failures and rebuilds
    // (serve_members.rs).
    let record = MemberRecord::load(state.dir(), engine.members as usize, spec.spares as usize)
        .map_err(|e| e.to_string())?;
    let file_member = |index: u64| -> Result<FileDevice, String> {
        let seed = member_seed(index);
        FileDevice::open_with_tags(
            &state.member_path(index as usize),
            sector_bytes,
            member_sectors,
            tag_bytes,
            Some(Box::new(model(seed)?)),
        )
        .map_err(|e| e.to_string())
    };
    let (member_files, spare_files) = engine_files(&record);
    let open_files = |files: &[usize]| -> Result<Vec<FileDevice>, String> {
        files.iter().map(|&f| file_member(f as u64)).collect()
    };
    let members = open_files(&member_files)?;
    // SWAN deals its spares to its R-groups (below); every other engine takes one list.
    let spares = match &spec.choice {
        EngineChoice::Swan(_) => Vec::new(),
        _ => open_files(&spare_files)?,
    };
    // Positions whose member failed: the engines that recover from their members read
    // nothing from such a position's file. ScalaAFA and the two-phase engine recover with
    // up to m of them, and refuse more, naming them.
    let lost = positions_to_fail(&record);
    let description = format!(
        "afa: {} over {} emulated SSDs kept in {}",
        engine_name(&spec.choice, engine.level),
        engine.members,
        state_dir.display()
    );
    if let Some(scala) = scala {
        let engine_members = engine.members;
        // The AMT and HGMT live in host memory only, so every start but the first rebuilds
        // them from the members' OOB tags (§5.4), after an orderly stop as after a kill.
        // After an unclean stop every copy's data is checked against the checksums in its
        // tags and every striped stripe's parity computed again: a host crash may have kept a
        // sidecar's tags without the member file's data. The member files sit under the
        // page cache, so the engine keeps a dead row that may hold a flushed version until a
        // flush has made the newer copies durable.
        let mut volume = if state.fresh() {
            ScalaAfa::new(engine, scala, members, spares)
        } else {
            ScalaAfa::recover_with(engine, scala, members, spares, &lost, state.unclean())
        }
        .map_err(|e| e.to_string())?;
        volume.keep_flushed_writes();
        if state.unclean() {
            let st = volume.stats();
            eprintln!(
                "afa serve: ScalaAFA after an unclean stop: {} copies whose data missed their checksums dropped, {} torn chunks dropped, {} stripes' parity computed again",
                st.recovery_unwhole_copies, st.recovery_torn_chunks, st.recovery_resynced_stripes
            );
        }
        if !state.fresh() {
            let st = volume.stats();
            match st.recovered_checkpoint_seq {
                Some(seq) => eprintln!(
                    "afa serve: rebuilt ScalaAFA's AMT and HGMT from checkpoint {seq} and the \
                     OOB tags of {} chunk copies on {engine_members} members",
                    st.recovery_tag_reads
                ),
                None => eprintln!(
                    "afa serve: rebuilt ScalaAFA's AMT and HGMT from the OOB tags of {} chunk \
                     copies on {engine_members} members",
                    st.recovery_tag_reads
                ),
            }
        }
        // Configured failures still to come, and rebuilds, are the single-owner engine's
        // to apply and record. Otherwise the engine runs on threads of its own, degraded
        // if a member failed before this start (and no spare took its place).
        if record.failures_applied < spec.failures.len() {
            eprintln!(
                "afa serve: ScalaAFA runs on the server's engine thread: member failures are configured"
            );
            return Ok(recorded(volume, state, record, &spec.failures, description));
        }
        match lost.as_slice() {
            [] => {}
            [p] => eprintln!("afa serve: ScalaAFA serves without member {p}, which failed"),
            more => eprintln!("afa serve: ScalaAFA serves without members {more:?}, which failed"),
        }
        let dir = state.dir().to_path_buf();
        let failures = spec.failures.clone();
        let served = scalaafa_served(volume, move |volume| {
            Served::device(RecordedFailures::new(volume, dir, record, &failures))
        });
        return Ok(Volume {
            served,
            description,
            state: Some(state),
            waflash_report: None,
            read_only: None,
        });
    }
    if let Some(two_phase) = two_phase {
        let engine_members = engine.members;
        // The map lives in host memory only, so every start but the first rebuilds it from
        // the members' OOB tags, after an orderly stop as after a kill.
        // After an unclean stop every copy's data is checked against the checksum in its
        // tags: a host crash may have kept a sidecar's tags without the member file's data.
        let volume = if state.fresh() {
            TwoPhase::new(engine, two_phase, members, spares).and_then(|mut v| {
                v.make_recoverable()?;
                Ok(v)
            })
        } else {
            let verify = state.unclean();
            TwoPhase::recover_with(engine, two_phase, members, spares, &lost, verify)
        }
        .map_err(|e| e.to_string())?;
        if let Some(r) = volume.recovery() {
            eprintln!(
                "afa serve: rebuilt the two-phase map from the OOB tags of {} chunk slots on {engine_members} members: {} replicated and {} striped chunks, {} stripes cut short by a crash dropped, {} copies whose data missed their checksum dropped, {} stale slots trimmed",
                r.tag_reads, r.replicated_chunks, r.striped_chunks, r.incomplete_stripes, r.torn_copies, r.stale_slots
            );
        }
        return Ok(recorded(volume, state, record, &spec.failures, description));
    }
    if let EngineChoice::Swan(swan) = &spec.choice {
        // SWAN deals its spares to its R-groups, so each group gets its own spare files
        // back, first those its rebuilding members were being rebuilt onto.
        let spare_lists = swan_spare_files(&record, swan.groups as usize)
            .map_err(|e| format!("{}: {e}", state.dir().join("members.txt").display()))?
            .iter()
            .map(|files| open_files(files))
            .collect::<Result<Vec<_>, _>>()?;
        let mut volume = Swan::with_group_spares(engine, swan.clone(), members, spare_lists)
            .map_err(|e| e.to_string())?;
        // The recorded failures first, so that recovery reads what a lost member held
        // through degraded reads of its group, never from its file.
        for &p in &lost {
            volume
                .fail_member(p, 0)
                .map_err(|e| format!("{}: {e}", state.dir().join("members.txt").display()))?;
        }
        restore_map(&mut volume, swan.host_memory, "SWAN", &state)?;
        return Ok(recorded(volume, state, record, &spec.failures, description));
    }
    let mut array = Array::new(engine, members, spares).map_err(|e| e.to_string())?;
    if let EngineChoice::Log(log_config) = &spec.choice {
        let mut volume = LogRaid::new(array, log_config.clone())
            .map_err(|e| crate::volume::engine_config_error("array.log", e))?;
        // The recorded failures first, so that recovery reads what a lost member held
        // through degraded reads of the others, never from its file.
        for &p in &lost {
            volume
                .array_mut()
                .fail_member(p, 0)
                .map_err(|e| format!("{}: {e}", state.dir().join("members.txt").display()))?;
        }
        restore_map(&mut volume, log_config.host_memory, "Log-RAID", &state)?;
        return Ok(recorded(volume, state, record, &spec.failures, description));
    }
    if state.unclean() && lost.is_empty() {
        // The last server was killed or crashed: a write may have reached some members and
        // not others, so redundancy is made to match the data before anything is served
        // (md resyncs after an unclean shutdown the same way, in the background).
        let (stripes, _) = array.resync(0).map_err(|e| e.to_string())?;
        if stripes > 0 {
            eprintln!(
                "afa serve: the last server did not stop in order; resynced the redundancy of {stripes} stripes"
            );
        }
    } else if state.unclean() {
        // md starts a dirty degraded array only when forced, for the same reason.
        eprintln!(
            "afa serve: the last server did not stop in order and member positions {lost:?} are failed or rebuilding: a degraded array cannot be resynced, so a stripe whose last write was cut off may reconstruct wrong bytes for its lost member"
        );
    }
    // The recorded failures again: a failed position's file is never read, a rebuilding
    // one is rebuilt from the start onto the same spare's file.
    for &p in &lost {
        array
            .fail_member(p, 0)
            .map_err(|e| format!("{}: {e}", state.dir().join("members.txt").display()))?;
    }
    Ok(recorded(array, state, record, &spec.failures, description))
}

/// An engine whose configured member failures serve mode applies and records in the state
/// directory (serve_members.rs).
fn recorded<E: FailableEngine>(
    volume: E,
    state: StateDir,
    record: MemberRecord,
    failures: &[(u32, TimeNs)],
    description: String,
) -> Volume {
    let dir = state.dir().to_path_buf();
    Volume {
        served: Served::device(RecordedFailures::new(volume, dir, record, failures)),
        description,
        state: Some(state),
        waflash_report: None,
        read_only: None,
    }
}

/// One OX SSD behind its block interface (OXBlock) with real bytes: in memory, or with a
/// state directory in a flash image file that every start but the first recovers through
/// OX's own recovery (the newest checkpoint, then redo of the WAL).
fn build_ox_volume(
    ox: &afa_ox::OxConfig,
    seed: u64,
    state_dir: Option<&Path>,
) -> Result<Volume, String> {
    let Some(state_dir) = state_dir else {
        let device = OxServedDevice::format(ox, seed, FlashImage::in_memory(ox))
            .map_err(|e| format!("ox: {e}"))?;
        return Ok(Volume {
            served: Served::device(device),
            description: "afa: one OX SSD (OXBlock) in memory".into(),
            state: None,
            waflash_report: None,
            read_only: None,
        });
    };
    let t = &ox.terms;
    // The image only makes sense under the medium's shape and the logical space's size;
    // timing, GC and checkpoint settings may change between starts.
    let fingerprint = format!(
        "afa volume: one OX SSD of {} channels x {} LUNs x {} EBLOCKs of {} bytes, WBLOCK {} bytes, RBLOCK {} bytes, TAG {} bytes, {} logical pages",
        ox.channels,
        ox.luns_per_channel,
        ox.eblocks_per_lun,
        t.eblock_bytes,
        t.wblock_bytes,
        t.rblock_bytes,
        t.tag_bytes,
        ox.logical_pages
    );
    let state = StateDir::open(state_dir, &fingerprint).map_err(|e| e.to_string())?;
    let path = state.ox_image_path();
    let description = format!("afa: one OX SSD (OXBlock) kept in {}", state_dir.display());
    let mut read_only = None;
    let device = if path.exists() {
        let image = FlashImage::open(&path, ox).map_err(|e| format!("ox: {e}"))?;
        let (device, report) =
            OxServedDevice::recover(ox, seed, image).map_err(|e| format!("ox: {e}"))?;
        let media = device.controller().media();
        let erases: u64 = (0..media.eblocks_total())
            .map(|b| media.erase_count(b) as u64)
            .sum();
        eprintln!(
            "afa serve: OX recovered {} after {} stop: checkpoint {}, {} log blocks read, {} records redone, {} contexts redone from their done record, {} verified by their TAGs, {} dropped, {} GC moves redone, {} torn WBLOCKs; {erases} EBLOCK erases in the medium's life",
            path.display(),
            if state.unclean() { "an unclean" } else { "an orderly" },
            report.checkpoint_seq,
            report.log_blocks_read,
            report.records_redone,
            report.contexts_redone,
            report.contexts_verified,
            report.contexts_dropped,
            report.gc_moves_redone,
            report.torn_wblocks
        );
        read_only = device.controller().read_only().map(str::to_string);
        if let Some(why) = &read_only {
            eprintln!(
                "afa serve: OX came up read-only: {why}; every acknowledged write can be read, and writes, trims and write-zeroes get EPERM"
            );
        }
        device
    } else {
        // Formatted under a temporary name and renamed once the format is durable, so that
        // an image under the real name always holds a checkpoint to recover from.
        let tmp = path.with_extension("img.tmp");
        let _ = std::fs::remove_file(&tmp);
        let image = FlashImage::create(&tmp, ox).map_err(|e| format!("ox: {e}"))?;
        let mut device = OxServedDevice::format(ox, seed, image).map_err(|e| format!("ox: {e}"))?;
        publish_image(&tmp, &path, state_dir, "OX")?;
        device.image_moved_to(&path);
        device
    };
    Ok(Volume {
        served: Served::device(device),
        description,
        state: Some(state),
        waflash_report: None,
        read_only,
    })
}

/// Gives a flash image made under the temporary name `tmp` its name `path` and syncs the
/// state directory, so that an image under the real name is always whole.
fn publish_image(tmp: &Path, path: &Path, state_dir: &Path, what: &str) -> Result<(), String> {
    std::fs::rename(tmp, path)
        .and_then(|()| std::fs::File::open(state_dir)?.sync_all())
        .map_err(|e| {
            format!(
                "cannot put the {what} flash image at {}: {e}",
                path.display()
            )
        })
}

/// A WAFLASH SSD served over NBD, which keeps a copy of its report up to date at every
/// flush, so that the server can print what the clients' writes did inside the device
/// (unaligned writes, partial pages, read-modify-write reads, versions, compaction) after
/// the engine thread, which owns the device, has stopped.
#[derive(Debug)]
struct ServedWaflash {
    ssd: WaflashSsd,
    report: Arc<Mutex<Option<WaflashReport>>>,
}

impl BlockDevice for ServedWaflash {
    fn info(&self) -> DeviceInfo {
        self.ssd.info()
    }

    fn media_faults(&self) -> afa_nand::MediaFaults {
        self.ssd.media_faults()
    }
    fn submit(
        &mut self,
        now_ns: TimeNs,
        cmd: &DeviceCommand<'_>,
        out: ReadBuffers<'_>,
    ) -> Result<Completion, DeviceError> {
        let flush = cmd.opcode == afa_ssd::Opcode::Flush;
        let done = self.ssd.submit(now_ns, cmd, out)?;
        if flush {
            *self.report.lock().unwrap_or_else(|e| e.into_inner()) = Some(self.ssd.report());
        }
        Ok(done)
    }
    fn background(&mut self, now_ns: TimeNs) -> Option<TimeNs> {
        self.ssd.background(now_ns)
    }
    fn allocation(&self, lba: u64, sectors: u32) -> Option<Vec<(u32, bool)>> {
        self.ssd.allocation(lba, sectors)
    }
}

/// One WAFLASH SSD (`[waflash.ssd]`) with real bytes: clients' unaligned writes go through
/// its write buffer, MV-FTL and compaction as the simulation's do. In memory, or with
/// `--state` kept in a flash image that each completed FLUSH (or FUA write) brings up to
/// date, from which a restart recovers the FTL as after a power loss.
fn build_waflash_volume(
    config: &WaflashConfig,
    seed: u64,
    state_dir: Option<&Path>,
) -> Result<Volume, String> {
    let mut config = config.clone();
    config.payload = PayloadMode::Full;
    let kind = format!(
        "one WAFLASH SSD ({} buffer, {} FTL{})",
        serde_plain_name(&config.buffer_policy),
        serde_plain_name(&config.ftl),
        if config.compaction {
            ", compaction"
        } else {
            ""
        }
    );
    let report = Arc::new(Mutex::new(None));
    let Some(state_dir) = state_dir else {
        let ssd = WaflashSsd::new(config, seed).map_err(|e| format!("waflash: {e}"))?;
        return Ok(Volume {
            served: Served::device(ServedWaflash {
                ssd,
                report: Arc::clone(&report),
            }),
            description: format!("afa: {kind} in memory"),
            state: None,
            waflash_report: Some(report),
            read_only: None,
        });
    };
    // The image only makes sense under the medium's shape and the logical space's size; the
    // buffer, the FTL's policies and the timing may change between starts, since recovery
    // reads versions and compacted pages whatever wrote them.
    let fingerprint = format!("afa volume: one WAFLASH SSD of {}", config.medium_shape());
    let state = StateDir::open(state_dir, &fingerprint).map_err(|e| e.to_string())?;
    let path = state.waflash_image_path();
    let ssd = if path.exists() {
        let (ssd, found) =
            WaflashSsd::open_image(config, seed, &path).map_err(|e| format!("waflash: {e}"))?;
        eprintln!(
            "afa serve: WAFLASH recovered {} after {} stop from the OOB areas of {} pages ({} compacted, {} torn): {} logical pages mapped, {} with several versions, {} live pages, {} open blocks, {} pages merged",
            path.display(),
            if state.unclean() { "an unclean" } else { "an orderly" },
            found.pages_scanned,
            found.compacted_pages_scanned,
            found.torn_pages,
            found.mapped_pages,
            found.multi_version_pages,
            found.live_pages,
            found.open_blocks,
            found.merges
        );
        ssd
    } else {
        // Made under a temporary name and renamed once whole, so that an image under the
        // real name always has its header and block table.
        let tmp = path.with_extension("img.tmp");
        let _ = std::fs::remove_file(&tmp);
        let image = WaflashImage::create(&tmp, &config).map_err(|e| format!("waflash: {e}"))?;
        let mut ssd =
            WaflashSsd::create_in(config, seed, image).map_err(|e| format!("waflash: {e}"))?;
        publish_image(&tmp, &path, state_dir, "WAFLASH")?;
        ssd.image_moved_to(&path);
        ssd
    };
    Ok(Volume {
        served: Served::device(ServedWaflash {
            ssd,
            report: Arc::clone(&report),
        }),
        description: format!("afa: {kind} kept in {}", state_dir.display()),
        state: Some(state),
        waflash_report: Some(report),
        read_only: None,
    })
}

/// The name a configuration file uses for a unit enum variant (`"pc-lru"`, `"multi-version"`).
fn serde_plain_name<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(name)) => name,
        _ => serde_json::to_string(value).unwrap_or_default(),
    }
}

/// A log-structured engine whose battery-backed host memory is kept in an NVRAM log, or
/// whose map is rebuilt from the members alone when its host memory is volatile.
trait NvramEngine: BlockDevice + Send + 'static {
    fn attach_nvram(&mut self, log: Box<dyn NvramLog>);
    fn recover_from_nvram(&mut self, now_ns: TimeNs) -> Result<TimeNs, DeviceError>;
    fn recover_volatile(&mut self, now_ns: TimeNs) -> Result<TimeNs, DeviceError>;
}

impl NvramEngine for Swan<FileDevice> {
    fn attach_nvram(&mut self, log: Box<dyn NvramLog>) {
        Swan::attach_nvram(self, log);
    }
    fn recover_from_nvram(&mut self, now_ns: TimeNs) -> Result<TimeNs, DeviceError> {
        Swan::recover_from_nvram(self, now_ns)
    }
    fn recover_volatile(&mut self, now_ns: TimeNs) -> Result<TimeNs, DeviceError> {
        Swan::recover_volatile(self, now_ns)
    }
}

impl NvramEngine for LogRaid<FileDevice> {
    fn attach_nvram(&mut self, log: Box<dyn NvramLog>) {
        LogRaid::attach_nvram(self, log);
    }
    fn recover_from_nvram(&mut self, now_ns: TimeNs) -> Result<TimeNs, DeviceError> {
        LogRaid::recover_from_nvram(self, now_ns)
    }
    fn recover_volatile(&mut self, now_ns: TimeNs) -> Result<TimeNs, DeviceError> {
        LogRaid::recover_volatile(self, now_ns)
    }
}

/// Restores a log-structured engine's map on every start but the first: from the segment
/// summaries and the NVRAM log in the state directory with battery-backed host memory (the
/// log is attached on the first start too), from the summaries and the partial summaries of
/// the last server's FLUSHes alone with volatile host memory, since nothing of the host's
/// memory is kept then.
fn restore_map<E: NvramEngine>(
    volume: &mut E,
    memory: HostMemory,
    name: &str,
    state: &StateDir,
) -> Result<(), String> {
    if memory != HostMemory::Volatile {
        return attach_nvram(volume, name, state);
    }
    if !state.fresh() {
        volume
            .recover_volatile(0)
            .map_err(|e| format!("{name} recovery failed: {e}"))?;
        eprintln!(
            "afa serve: rebuilt {name}'s map from the segment summaries and the partial summaries of the last server's flushes"
        );
    }
    Ok(())
}

/// Attaches the NVRAM log in the state directory and, on every start but the first,
/// recovers the engine's map from the summaries and the log.
fn attach_nvram<E: NvramEngine>(
    volume: &mut E,
    name: &str,
    state: &StateDir,
) -> Result<(), String> {
    let path = state.nvram_path();
    let nvram =
        FileNvram::open(&path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    volume.attach_nvram(Box::new(nvram));
    if !state.fresh() {
        volume
            .recover_from_nvram(0)
            .map_err(|e| format!("{name} recovery failed: {e}"))?;
        eprintln!(
            "afa serve: rebuilt {name}'s map from the segment summaries and {}",
            path.display()
        );
    }
    Ok(())
}

pub fn run(args: ServeArgs) -> Result<(), String> {
    let (cfg, source) = load_volume_config(args.config.as_deref(), &args.set)?;
    let listen: ListenAddr = args
        .listen
        .parse()
        .map_err(|e: afa_serve::ServeError| e.to_string())?;
    if let ListenAddr::Tcp(addr) = &listen {
        if !addr.ip().is_loopback() {
            eprintln!(
                "warning: serving on {addr}, which is not loopback: NBD has no authentication here, so anyone who can reach it can read and write the volume"
            );
        }
    }
    // Not every failure here is the configuration's (a state directory made for another
    // volume, an image that cannot be recovered), so the message says what was being done.
    let volume = build_volume(&cfg, args.state.as_deref())
        .map_err(|e| format!("cannot start the volume of configuration {source}: {e}"))?;
    let pace: Pace = args.pace.into();
    let read_only = args.read_only || volume.read_only.is_some();
    let config = ServeConfig {
        listen,
        export_name: args.export,
        description: volume.description.clone(),
        pace,
        max_connections: args.max_connections,
        max_request_bytes: args.max_request_bytes,
        verbose: args.verbose,
        read_only,
        ..ServeConfig::default()
    };
    // Registered before the socket listens, so a stop signal never finds the default
    // action (which would end the process without the final flush).
    let mut signals = Signals::new([SIGTERM, SIGINT, SIGHUP])
        .map_err(|e| format!("cannot handle stop signals: {e}"))?;
    // A panic on any of the server's threads is a bug. Left to unwind, it ended that thread
    // only, and its clients waited for ever on a connection nobody answered (found when an
    // engine's debug assertion fired under a crash soak). The process ends at once instead,
    // as a kill -9 would end it: what reached the members stays, the state directory is
    // left unclean, and the next start recovers.
    let report_panic = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report_panic(info);
        eprintln!(
            "afa serve: a thread panicked: stopping at once, as a kill -9 would stop the server; the next start recovers"
        );
        std::process::exit(70);
    }));
    let server = match volume.served {
        Served::Device(device) => Server::bind(config, device),
        Served::Shared(shared) => Server::bind_shared(config, shared),
    }
    .map_err(|e| e.to_string())?;
    // One line on stdout once the socket listens, so scripts and tests know when to start.
    println!(
        "serving {} ({} bytes, pace {}{}) at {}",
        volume.description,
        server.size_bytes(),
        match pace {
            Pace::Model => "model",
            Pace::None => "none",
        },
        if read_only { ", read-only" } else { "" },
        server.uri()
    );
    let _ = std::io::stdout().flush();
    let running = server.spawn().map_err(|e| e.to_string())?;
    let signal = signals.forever().next().unwrap_or(SIGTERM);
    eprintln!("afa serve: signal {signal}: stopping (a second signal exits at once)");
    // The orderly stop waits for the engine to answer what it holds and flush every member,
    // which a slow or failing member can draw out. A second signal is the operator's way
    // out: the process ends as a kill -9 would end it, with what was written before then
    // on the members and the state left unclean, so the next start recovers. The lock
    // keeps the two apart: a second signal that comes while the stop is being recorded
    // waits for it and then lets the process end as the orderly stop it was, so an exit
    // status of 128 + the signal always means a stop the next start recovers from.
    let stop_recorded = Arc::new(Mutex::new(false));
    let watcher_recorded = Arc::clone(&stop_recorded);
    std::thread::Builder::new()
        .name("afa-second-signal".into())
        .spawn(move || {
            if let Some(second) = signals.forever().next() {
                let recorded = watcher_recorded.lock().unwrap_or_else(|e| e.into_inner());
                if *recorded {
                    return;
                }
                eprintln!(
                    "afa serve: signal {second} while stopping: exiting without waiting for the \
                     orderly stop"
                );
                // 128 + the signal's number, as a shell reports a process the signal ended;
                // the lock is held, so the stop can no longer be recorded as clean.
                std::process::exit(128 + second);
            }
        })
        .map_err(|e| format!("cannot watch for a second stop signal: {e}"))?;
    // Stops accepting, closes the connections, lets the engine answer what it holds and
    // flush the volume; only then is the stop recorded as clean.
    let stats = running.stop();
    {
        let mut recorded = stop_recorded.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(state) = &volume.state {
            state.mark_clean().map_err(|e| e.to_string())?;
        }
        *recorded = true;
    }
    eprintln!(
        "afa serve: stopped after {} requests ({} bytes read, {} written, {} errors)",
        stats.requests, stats.read_bytes, stats.write_bytes, stats.errors
    );
    if let Some(report) = &volume.waflash_report {
        if let Some(report) = &*report.lock().unwrap_or_else(|e| e.into_inner()) {
            eprintln!("afa serve: {}", crate::waflash::summary(report));
        }
    }
    Ok(())
}

/// `afa bench serve`.
pub mod bench_serve {
    use super::*;

    #[derive(Debug, Args)]
    pub struct BenchServeArgs {
        /// Seconds each fio run lasts.
        #[arg(long, default_value_t = 5)]
        pub runtime_s: u64,
        /// Runs per job and server, interleaved across the servers; the median is reported,
        /// so that load from other processes hits every server alike.
        #[arg(long, default_value_t = 3)]
        pub rounds: u32,
        /// Bytes of the export the jobs touch, in MiB.
        #[arg(long, default_value_t = 1024)]
        pub size_mib: u64,
        #[arg(long)]
        pub json: Option<PathBuf>,
    }

    /// One fio job's write figures, and the CPU time the server spent in the run.
    #[derive(Debug, Clone, Copy, serde::Serialize)]
    struct FioFigures {
        iops: f64,
        mb_s: f64,
        /// The server process's CPU time (user + system, every thread) per request, over
        /// the whole fio run: requests are counted as IOPS × (runtime + the 1 s ramp).
        /// Unlike IOPS it hardly depends on what else the machine runs, so it compares the
        /// servers' efficiency even on a loaded host.
        server_cpu_us_per_request: f64,
        /// fio's own CPU time (its job thread, user + system) per request, from the
        /// `usr_cpu` and `sys_cpu` percentages it reports. On a two-core machine fio takes
        /// about a core, so what a server makes the client spend per request bounds the
        /// throughput as much as what the server spends itself.
        client_cpu_us_per_request: f64,
    }

    /// CPU seconds (user + system, all threads) a process has used so far, from
    /// `/proc/PID/stat`; `None` where there is no procfs.
    fn process_cpu_s(pid: &str) -> Option<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The fields after the command name (which may hold spaces) start after its ')':
        // utime and stime are the 14th and 15th fields of the line, in USER_HZ ticks,
        // which Linux reports at 100 per second on every architecture.
        let rest = &stat[stat.rfind(')')? + 2..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
        Some(ticks / 100.0)
    }

    /// Seconds at the start of each fio run that its figures leave out.
    const RAMP_S: u64 = 1;

    /// The run with the median IOPS.
    fn median(mut runs: Vec<FioFigures>) -> FioFigures {
        runs.sort_by(|a, b| a.iops.total_cmp(&b.iops));
        runs[runs.len() / 2]
    }

    fn free_port() -> Result<u16, String> {
        TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| format!("cannot find a free port: {e}"))
    }

    fn require(program: &str, package: &str) -> Result<(), String> {
        let found = Command::new("sh")
            .arg("-c")
            .arg(format!("command -v {program}"))
            .stdout(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if found {
            Ok(())
        } else {
            Err(format!(
                "{program} is needed for afa bench serve (Debian package {package})"
            ))
        }
    }

    /// Runs one fio job against `uri`, served by the process `server_pid` (for its CPU
    /// time).
    fn run_fio(
        uri: &str,
        server_pid: &str,
        job: &str,
        rw: &str,
        bs: &str,
        args: &BenchServeArgs,
    ) -> Result<FioFigures, String> {
        let cpu_before = process_cpu_s(server_pid);
        let out = Command::new("fio")
            .args([
                format!("--name={job}"),
                "--ioengine=nbd".into(),
                format!("--uri={uri}"),
                format!("--rw={rw}"),
                format!("--bs={bs}"),
                "--iodepth=32".into(),
                format!("--size={}m", args.size_mib),
                "--time_based".into(),
                format!("--runtime={}", args.runtime_s),
                format!("--ramp_time={RAMP_S}"),
                "--output-format=json".into(),
            ])
            .output()
            .map_err(|e| format!("cannot run fio: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(format!(
                "fio {job} against {uri} failed: {}{}",
                text,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let start = text
            .find('{')
            .ok_or_else(|| format!("fio printed no JSON: {text}"))?;
        let report: serde_json::Value =
            serde_json::from_str(&text[start..]).map_err(|e| format!("fio JSON: {e}"))?;
        let write = &report["jobs"][0]["write"];
        if report["jobs"][0]["error"].as_u64() != Some(0) {
            return Err(format!("fio {job} against {uri} reported an error: {text}"));
        }
        let iops = write["iops"].as_f64().unwrap_or(0.0);
        let requests = iops * (args.runtime_s + RAMP_S) as f64;
        let server_cpu_us_per_request = match (cpu_before, process_cpu_s(server_pid)) {
            (Some(a), Some(b)) if requests > 0.0 => (b - a) * 1e6 / requests,
            _ => f64::NAN,
        };
        let client_cpu_fraction = (report["jobs"][0]["usr_cpu"].as_f64().unwrap_or(f64::NAN)
            + report["jobs"][0]["sys_cpu"].as_f64().unwrap_or(f64::NAN))
            / 100.0;
        Ok(FioFigures {
            iops,
            mb_s: write["bw_bytes"].as_f64().unwrap_or(0.0) / 1e6,
            server_cpu_us_per_request,
            client_cpu_us_per_request: client_cpu_fraction * 1e6 / iops.max(f64::MIN_POSITIVE),
        })
    }

    /// `nbdkit memory` on a free loopback port, stopped when dropped.
    struct Nbdkit {
        child: Child,
        uri: String,
    }

    impl Nbdkit {
        fn start(size_mib: u64) -> Result<Self, String> {
            let port = free_port()?;
            let pidfile =
                std::env::temp_dir().join(format!("afa-bench-nbdkit-{}.pid", std::process::id()));
            let _ = std::fs::remove_file(&pidfile);
            let child = Command::new("nbdkit")
                .args(["--foreground", "--exit-with-parent", "-i", "127.0.0.1"])
                .arg("-p")
                .arg(port.to_string())
                .arg("-P")
                .arg(&pidfile)
                .arg("memory")
                .arg(format!("size={size_mib}M"))
                .stdout(Stdio::null())
                .spawn()
                .map_err(|e| format!("cannot start nbdkit: {e}"))?;
            let mut kit = Nbdkit {
                child,
                uri: format!("nbd://127.0.0.1:{port}/"),
            };
            // nbdkit writes its pid file once it listens.
            let deadline = Instant::now() + Duration::from_secs(10);
            while !pidfile.exists() {
                if let Ok(Some(status)) = kit.child.try_wait() {
                    return Err(format!("nbdkit exited early: {status}"));
                }
                if Instant::now() > deadline {
                    return Err("nbdkit did not start listening within 10 s".into());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = std::fs::remove_file(&pidfile);
            Ok(kit)
        }
    }

    impl Drop for Nbdkit {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// Starts an unpaced afa server over `device` on a free loopback port, in this process.
    fn start_afa(
        device: Box<dyn BlockDevice + Send>,
        description: &str,
        size_mib: u64,
    ) -> Result<afa_serve::RunningServer, String> {
        let config = ServeConfig {
            listen: ListenAddr::Tcp(SocketAddr::from(([127, 0, 0, 1], 0))),
            description: description.into(),
            pace: Pace::None,
            ..ServeConfig::default()
        };
        let server = Server::bind(config, device)
            .map_err(|e| e.to_string())?
            .spawn()
            .map_err(|e| e.to_string())?;
        if server.size_bytes() < size_mib << 20 {
            return Err(format!(
                "--size-mib {size_mib} exceeds the {description} export's {} MiB",
                server.size_bytes() >> 20
            ));
        }
        Ok(server)
    }

    pub fn bench(args: BenchServeArgs) -> Result<(), String> {
        require("fio", "fio")?;
        require("nbdkit", "nbdkit")?;
        if args.runtime_s == 0 || args.size_mib == 0 || args.rounds == 0 {
            return Err("--runtime-s, --size-mib and --rounds must be positive".into());
        }
        // The comparison the target is set on: afa's in-memory device against nbdkit's
        // memory plugin, both plain RAM disks, so the figures compare the servers.
        let memory =
            afa_serve::MemDevice::new(4096, args.size_mib << 8).map_err(|e| e.to_string())?;
        let afa_memory = start_afa(Box::new(memory), "afa in-memory device", args.size_mib)?;
        // For information: the embedded default volume, one emulated SSD holding full bytes
        // in memory, whose FTL writes out of place and so touches fresh memory on every
        // write.
        let (cfg, _) = load_volume_config(None, &[])?;
        let volume = build_volume(&cfg, None)?;
        let Served::Device(device) = volume.served else {
            return Err("the embedded default volume is one emulated SSD".into());
        };
        let afa_ssd = start_afa(device, &volume.description, args.size_mib)?;
        let kit = Nbdkit::start(args.size_mib)?;
        let jobs = [
            ("4k-randwrite-qd32", "randwrite", "4k"),
            ("64k-seqwrite-qd32", "write", "64k"),
        ];
        println!(
            "fio nbd engine, median of {} interleaved runs of {} s, {} MiB region, TCP loopback, afa --pace none",
            args.rounds, args.runtime_s, args.size_mib
        );
        println!(
            "{:<18} {:<14} {:>10} {:>10} {:>7} {:>9} {:>9} {:>7}",
            "job", "afa device", "afa IOPS", "nbdkit", "ratio", "afa MB/s", "nbdkit", "ratio"
        );
        let mut results = Vec::new();
        let mut worst = f64::INFINITY;
        // Both afa servers run in this process; while one serves fio the other is idle.
        let kit_pid = kit.child.id().to_string();
        let servers = [
            (kit.uri.as_str(), kit_pid.as_str()),
            (afa_memory.uri(), "self"),
            (afa_ssd.uri(), "self"),
        ];
        let mut cpu_lines = Vec::new();
        for (job, rw, bs) in jobs {
            let mut runs: [Vec<FioFigures>; 3] = Default::default();
            for _ in 0..args.rounds {
                for (i, (uri, pid)) in servers.iter().enumerate() {
                    runs[i].push(run_fio(uri, pid, job, rw, bs, &args)?);
                }
            }
            let [nbdkit, memory, ssd] = runs.map(median);
            for (device, afa) in [("memory", memory), ("emulated SSD", ssd)] {
                let iops_ratio = afa.iops / nbdkit.iops.max(f64::MIN_POSITIVE);
                let mb_ratio = afa.mb_s / nbdkit.mb_s.max(f64::MIN_POSITIVE);
                if device == "memory" {
                    worst = worst.min(iops_ratio).min(mb_ratio);
                }
                println!(
                    "{job:<18} {device:<14} {:>10.0} {:>10.0} {:>6.2}x {:>9.1} {:>9.1} {:>6.2}x",
                    afa.iops, nbdkit.iops, iops_ratio, afa.mb_s, nbdkit.mb_s, mb_ratio
                );
                cpu_lines.push(format!(
                    "{job:<18} {device:<14} {:>10.1} {:>10.1} {:>6.2}x {:>10.1} {:>10.1} {:>6.2}x",
                    afa.server_cpu_us_per_request,
                    nbdkit.server_cpu_us_per_request,
                    afa.server_cpu_us_per_request / nbdkit.server_cpu_us_per_request,
                    afa.client_cpu_us_per_request,
                    nbdkit.client_cpu_us_per_request,
                    afa.client_cpu_us_per_request / nbdkit.client_cpu_us_per_request
                ));
                results.push(serde_json::json!({
                    "job": job,
                    "afa_device": device,
                    "afa": afa,
                    "nbdkit": nbdkit,
                    "iops_ratio": iops_ratio,
                    "mb_s_ratio": mb_ratio,
                }));
            }
        }
        println!(
            "worst ratio afa in-memory device / nbdkit memory: {worst:.2}x (target at least 1.00x)"
        );
        println!(
            "CPU per request (user + system; median-IOPS run), µs: the server (all its threads), then fio against it:"
        );
        println!(
            "{:<18} {:<14} {:>10} {:>10} {:>7} {:>10} {:>10} {:>7}",
            "job", "afa device", "afa", "nbdkit", "ratio", "fio→afa", "fio→nbdkit", "ratio"
        );
        for line in cpu_lines {
            println!("{line}");
        }
        drop(kit);
        afa_memory.stop();
        afa_ssd.stop();
        if let Some(path) = &args.json {
            let json = serde_json::json!({
                "runtime_s": args.runtime_s,
                "rounds": args.rounds,
                "size_mib": args.size_mib,
                "jobs": results,
                "worst_ratio": worst,
            });
            std::fs::write(
                path,
                serde_json::to_string_pretty(&json).unwrap_or_default(),
            )
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_default_volume_builds_with_full_bytes() {
        let (cfg, _) = load_volume_config(None, &[]).unwrap();
        let volume = build_volume(&cfg, None).unwrap();
        let info = volume.served.info();
        assert_eq!(info.payload_unit_bytes, info.sector_bytes);
    }

    #[test]
    fn state_refuses_two_phase_on_ssds_with_too_little_oob() {
        let text = "[ssd.geometry]\nblocks_per_plane = 64\noob_bytes_per_page = 16\n[array]\nlevel = \"raid5\"\nmembers = 3\n[array.two_phase]\n";
        let cfg: RunConfig = toml::from_str(text).unwrap();
        let dir = std::env::temp_dir().join(format!("afa-serve-unit-{}", std::process::id()));
        let err = build_volume(&cfg, Some(&dir)).err().unwrap();
        assert!(
            err.contains("two-phase with --state needs 14 bytes"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn state_refuses_a_stripe_cache_swan_aging_and_in_place_writes() {
        let dir = std::env::temp_dir().join(format!("afa-serve-refuse-{}", std::process::id()));
        let base =
            "[ssd.geometry]\nblocks_per_plane = 64\n[array]\nlevel = \"raid5\"\nmembers = 4\n";
        for (extra, named) in [
            ("stripe_cache_stripes = 8\n", "stripe_cache_stripes"),
            (
                "[array.swan]\ngroups = 2\nage_fraction = 0.6\n",
                "age_fraction",
            ),
            // In-place writes: scalaafa's cannot be recovered after a host crash, two-phase's
            // carry no tags at all.
            (
                "[array.scalaafa]\nsub_chunk_writes = \"in-place\"\n",
                "sub_chunk_writes",
            ),
            (
                "[array.two_phase]\nsub_chunk_writes = \"in-place\"\n",
                "sub_chunk_writes",
            ),
        ] {
            let cfg: RunConfig = toml::from_str(&format!("{base}{extra}")).unwrap();
            let err = build_volume(&cfg, Some(&dir)).err().unwrap();
            assert!(err.contains(named), "{err}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// `afa serve --set` changes the volume as `afa run --set` does, and a key serve mode
    /// does not know is refused by name.
    #[test]
    fn set_overrides_the_served_volume() {
        let set = |text: &str| text.parse::<crate::config::Override>().unwrap();
        let (cfg, _) = load_volume_config(
            None,
            &[
                set("ssd.over_provisioning=0.3"),
                set("array.level=raid6"),
                set("array.members=5"),
            ],
        )
        .unwrap();
        assert_eq!(cfg.ssd.over_provisioning, 0.3);
        assert_eq!(cfg.array.expect("an array").members, 5);
        let err = load_volume_config(None, &[set("array.bogus=1")]).unwrap_err();
        assert!(err.contains("bogus"), "{err}");
    }

    #[test]
    fn an_ox_volume_serves_full_bytes_and_refuses_an_array_or_tokenless_payload() {
        let dir = std::env::temp_dir().join(format!("afa-serve-ox-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("v.toml");
        let small = "[ox]\nchannels = 2\nluns_per_channel = 1\neblocks_per_lun = 32\nlogical_pages = 1000\nlog_forward_links = 1\n[ox.terms]\neblock_bytes = 262144\n";
        std::fs::write(&path, small).unwrap();
        let (cfg, _) = load_volume_config(Some(&path), &[]).unwrap();
        let volume = build_volume(&cfg, None).unwrap();
        let info = volume.served.info();
        assert_eq!(info.payload_unit_bytes, info.sector_bytes);
        assert_eq!(info.capacity_sectors, 1000);
        for (extra, named) in [
            ("[array]\nlevel = \"raid5\"\nmembers = 3\n", "[array]"),
            ("payload = \"none\"\n", "token"),
            ("bogus_key = 1\n", "bogus_key"),
        ] {
            let text = match extra.strip_prefix('[') {
                Some(_) => format!("{small}{extra}"),
                None => small.replace("[ox]\n", &format!("[ox]\n{extra}")),
            };
            std::fs::write(&path, text).unwrap();
            let err = load_volume_config(Some(&path), &[]).unwrap_err();
            assert!(err.contains(named), "{err}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A served volume whose failed programs retire its blocks until a write finds no room
    /// fails that write with ENOSPC, and the message names the flash's faults (summed over
    /// the members of an array), as `afa run` does; before, it said only that a plane was
    /// out of space.
    #[test]
    fn a_served_volume_out_of_space_names_its_media_faults() {
        let ssd = "[ssd]\nover_provisioning = 0.2\n[ssd.geometry]\nchannels = 1\n\
                   chips_per_channel = 1\ndies_per_chip = 1\nplanes_per_die = 1\n\
                   blocks_per_plane = 64\npages_per_block = 32\npage_bytes = 4096\n\
                   [ssd.faults]\nprogram_fail_probability = 0.01\n";
        for array in [
            "",
            "[array]\nlevel = \"raid5\"\nmembers = 3\nchunk_bytes = 16384\n",
        ] {
            let cfg: RunConfig = toml::from_str(&format!("seed = 3\n{ssd}{array}")).unwrap();
            let volume = build_volume(&cfg, None).unwrap();
            let Served::Device(device) = volume.served else {
                panic!("an SSD or an md-style array is served as one device");
            };
            let blocks = device.info().capacity_sectors * device.info().sector_bytes as u64 / 4096;
            let mut executor = afa_serve::Executor::new(device).unwrap();
            let data = vec![0x5au8; 4096];
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            let mut now_ns = 0;
            let failure = (0..blocks * 64)
                .find_map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let request = afa_serve::proto::Request::Write {
                        offset: x % blocks * 4096,
                        length: 4096,
                        fua: false,
                    };
                    match executor.execute(now_ns, &request, &data) {
                        Ok((done, _)) => {
                            now_ns = done;
                            None
                        }
                        Err(f) => Some(f),
                    }
                })
                .unwrap_or_else(|| panic!("{array:?}: no write ran out of space"));
            assert_eq!(
                failure.errno,
                afa_serve::proto::ENOSPC,
                "{}",
                failure.message
            );
            assert!(
                failure.message.contains("media faults by then: ")
                    && failure.message.contains("failed programs"),
                "{array:?}: {}",
                failure.message
            );
        }
    }

    /// A small WAFLASH SSD: the default geometry (1 GiB raw) with a 2 MiB buffer.
    const WAFLASH: &str = "seed = 5\n[waflash.ssd]\nbuffer_bytes = 2097152\n";

    fn waflash_config(text: &str, name: &str) -> Result<RunConfig, String> {
        let dir = std::env::temp_dir().join(format!("afa-serve-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("v.toml");
        std::fs::write(&path, text).unwrap();
        let loaded = load_volume_config(Some(&path), &[]).map(|(cfg, _)| cfg);
        let _ = std::fs::remove_dir_all(&dir);
        loaded
    }

    /// Byte-granular writes anywhere in the first `expected.len()` bytes, most of them
    /// covering part of a 16 KiB page, with the expected bytes kept beside them; every
    /// third request a read, compared; a flush every 97 requests and at the end. Returns the
    /// time after the final flush.
    fn drive_waflash(
        executor: &mut afa_serve::Executor<dyn BlockDevice + Send>,
        expected: &mut [u8],
        requests: u64,
        mut x: u64,
        mut now_ns: TimeNs,
    ) -> TimeNs {
        let region = expected.len();
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for i in 0..requests {
            let offset = next(region as u64 - 20_000) as usize;
            let length = 1 + next(20_000) as usize;
            if i % 3 == 2 {
                now_ns = read_and_compare(executor, now_ns, offset, length, expected);
                continue;
            }
            let fill = (i % 251) as u8 + 1;
            expected[offset..offset + length].fill(fill);
            let request = afa_serve::proto::Request::Write {
                offset: offset as u64,
                length: length as u32,
                fua: false,
            };
            now_ns = executor
                .execute(now_ns, &request, &expected[offset..offset + length])
                .unwrap()
                .0;
            if i % 97 == 0 {
                now_ns = executor
                    .execute(now_ns, &afa_serve::proto::Request::Flush, &[])
                    .unwrap()
                    .0;
            }
        }
        executor
            .execute(now_ns, &afa_serve::proto::Request::Flush, &[])
            .unwrap()
            .0
    }

    #[test]
    fn a_waflash_volume_keeps_every_unaligned_write_and_counts_what_it_did() {
        let cfg = waflash_config(WAFLASH, "waflash").unwrap();
        let volume = build_volume(&cfg, None).unwrap();
        assert!(
            volume
                .description
                .contains("WAFLASH SSD (pc-lru buffer, multi-version FTL, compaction) in memory"),
            "{}",
            volume.description
        );
        let Served::Device(device) = volume.served else {
            panic!("a WAFLASH SSD is served as one device");
        };
        let info = device.info();
        assert_eq!(info.payload_unit_bytes, info.sector_bytes);
        let mut executor = afa_serve::Executor::new(device).unwrap();
        let mut expected = vec![0u8; 4 << 20];
        drive_waflash(&mut executor, &mut expected, 3000, 0x9e37_79b9_7f4a_7c15, 0);
        let report = volume
            .waflash_report
            .unwrap()
            .lock()
            .unwrap()
            .clone()
            .unwrap();
        // The report as of the last flush: unaligned writes reached the FTL as partial
        // pages, and MV-FTL and compaction served some of them without reading.
        assert!(report.device.unaligned_writes > 1000, "{report:?}");
        assert!(report.ftl.partial_page_writes > 0, "{report:?}");
        assert!(report.ftl.version_writes > 0, "{report:?}");
        assert!(report.ftl.compacted_pages > 0, "{report:?}");
    }

    /// Reads the first `expected.len()` bytes back in 64 KiB requests and compares them.
    fn check_waflash(
        executor: &mut afa_serve::Executor<dyn BlockDevice + Send>,
        expected: &[u8],
        now_ns: TimeNs,
    ) {
        for offset in (0..expected.len()).step_by(1 << 16) {
            let length = (1usize << 16).min(expected.len() - offset);
            read_and_compare(executor, now_ns, offset, length, expected);
        }
    }

    /// Reads `length` bytes at `offset` and compares them with `expected`; returns when the
    /// read completed.
    fn read_and_compare(
        executor: &mut afa_serve::Executor<dyn BlockDevice + Send>,
        now_ns: TimeNs,
        offset: usize,
        length: usize,
        expected: &[u8],
    ) -> TimeNs {
        let (done, data) = executor
            .execute(
                now_ns,
                &afa_serve::proto::Request::Read {
                    offset: offset as u64,
                    length: length as u32,
                },
                &[],
            )
            .unwrap();
        assert!(
            data == expected[offset..offset + length],
            "read of {length} bytes at {offset} differs"
        );
        done
    }

    #[test]
    fn a_waflash_volume_kept_in_state_recovers_every_flushed_write_after_a_kill() {
        let cfg = waflash_config(WAFLASH, "waflash-state").unwrap();
        let dir = std::env::temp_dir().join(format!("afa-serve-wfs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut expected = vec![0u8; 4 << 20];
        let mut now_ns = 0;
        for round in 0..3u64 {
            let volume = build_volume(&cfg, Some(&dir)).unwrap();
            assert!(
                volume.description.contains("kept in"),
                "{}",
                volume.description
            );
            let Served::Device(device) = volume.served else {
                panic!("a WAFLASH SSD is served as one device");
            };
            let mut executor = afa_serve::Executor::new(device).unwrap();
            // What the last round flushed is there, whether it stopped in order or not.
            check_waflash(&mut executor, &expected, now_ns);
            now_ns = drive_waflash(&mut executor, &mut expected, 1500, 17 + round, now_ns);
            if round == 1 {
                volume.state.as_ref().unwrap().mark_clean().unwrap();
            }
            // Round 0 and 2 end as a kill would: no orderly stop, the image as the last
            // flush left it.
            drop(executor);
        }
        assert!(dir.join("waflash-flash.img").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_waflash_volume_refuses_an_array_and_a_buffer_below_a_page() {
        let err = waflash_config(
            &format!("{WAFLASH}[array]\nlevel = \"raid5\"\nmembers = 3\n"),
            "waflash-array",
        )
        .unwrap_err();
        assert!(err.contains("[waflash] serves one WAFLASH SSD"), "{err}");
        let err = waflash_config(
            "[waflash.ssd]\nbuffer_bytes = 4096\n",
            "waflash-small-buffer",
        )
        .unwrap_err();
        assert!(
            err.contains("waflash.ssd: ") && err.contains("buffer_bytes"),
            "{err}"
        );
    }

    #[test]
    fn serve_configs_need_no_workload_but_refuse_preconditioning() {
        let dir = std::env::temp_dir().join(format!("afa-serve-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("v.toml");
        std::fs::write(&path, "seed = 3\n[ssd]\nover_provisioning = 0.1\n").unwrap();
        assert!(load_volume_config(Some(&path), &[]).is_ok());
        std::fs::write(&path, "[precondition]\nfill_fraction = 0.5\n").unwrap();
        let err = load_volume_config(Some(&path), &[]).unwrap_err();
        assert!(err.contains("precondition"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
