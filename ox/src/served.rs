//! OXBlock with real bytes, for serve mode: the controller stays token-driven, and the
//! flash image turns tokens into the bytes a host wrote.
//!
//! A write gets a fresh token per RBLOCK (a version number no earlier write used); its
//! bytes are staged in the image under that token before the command is submitted, reach
//! the image when the controller programs the RBLOCK (a GC move copies them from the source
//! RBLOCK), and are dropped from the stage once the command completes — or, with the
//! write-back cache, once the version has left the cache (it is installed, so programmed).
//! A read takes its bytes when the controller looks MAP up for it
//! (`OxController::capture_read_bytes`): from the image at the RBLOCK MAP points at, checked
//! against the token and TAG the controller read there, so a mismatch is an error, never
//! wrong data; a version the write-back cache holds is still staged and its bytes come from
//! the stage. Taken then, not at the read's completion, because with commands side by side
//! (the queued interface) a later write may have moved MAP on by the time the read completes.

use std::collections::{BTreeMap, VecDeque};

use afa_nand::PayloadMode;
use afa_sim::TimeNs;
use afa_ssd::{
    validate_command, BlockDevice, Command, Completion, DeviceError, DeviceInfo, Opcode,
    QueuedCompletion, QueuedDevice, ReadBuffers,
};

use crate::{
    FlashImage, Media, OxBlockDevice, OxConfig, OxController, OxError, PoweredOff, RecoveryReport,
};

/// The OX controller behind a block interface that stores and returns full bytes.
#[derive(Debug)]
pub struct OxServedDevice {
    block: OxBlockDevice,
    /// The last token handed out; tokens identify versions, so none is ever reused.
    last_token: u64,
    /// Write-back cache: (LPID, token) of acknowledged writes whose bytes stay staged until
    /// the version leaves the cache, in the order they were acknowledged.
    cached: VecDeque<(u64, u64)>,
    /// Queued interface: what each command under way needs when it completes, by tag.
    queued: BTreeMap<u64, Queued>,
}

/// A command started on the queued interface.
#[derive(Debug)]
enum Queued {
    /// A write's LPIDs from `lba` on, the tokens its bytes are staged under, and FUA.
    Write {
        lba: u64,
        tokens: Vec<u64>,
        fua: bool,
    },
    Read,
    Trim,
    Flush,
}

fn image_error(e: String) -> DeviceError {
    DeviceError::Medium(e)
}

impl OxServedDevice {
    /// Formats a fresh medium kept in `image` (new: in memory, or a file just created).
    pub fn format(cfg: &OxConfig, seed: u64, image: FlashImage) -> Result<Self, OxError> {
        check_config(cfg)?;
        let media = Media::with_image(cfg, seed, image)?;
        let ctrl = OxController::format_media(media)?;
        let mut device = OxServedDevice::over(ctrl, 0);
        // The format's bad-block tables and first checkpoint are durable before anything
        // is served, so that a start that finds the image always finds a checkpoint.
        device.sync().map_err(|e| OxError::Image(e.to_string()))?;
        Ok(device)
    }

    /// Brings the controller up on a medium restored from `image`: OX's own recovery (the
    /// newest checkpoint, then redo of the log) runs, after a kill as after an orderly stop.
    pub fn recover(
        cfg: &OxConfig,
        seed: u64,
        image: FlashImage,
    ) -> Result<(Self, RecoveryReport), OxError> {
        check_config(cfg)?;
        let (media, torn_wblocks) = Media::restore(cfg, seed, image)?;
        let last_token = media.image().map_or(0, FlashImage::max_token);
        let off = PoweredOff {
            media,
            at_ns: 0,
            torn_wblocks,
            drain_ns: 0,
        };
        let (ctrl, report) = OxController::recover(off, 0)?;
        let mut device = OxServedDevice::over(ctrl, last_token);
        device.sync().map_err(|e| OxError::Image(e.to_string()))?;
        Ok((device, report))
    }

    /// The device over a controller that is up, whose reads keep their bytes.
    fn over(mut ctrl: OxController, last_token: u64) -> Self {
        ctrl.capture_read_bytes();
        OxServedDevice {
            block: OxBlockDevice::new(ctrl),
            last_token,
            cached: VecDeque::new(),
            queued: BTreeMap::new(),
        }
    }

    pub fn controller(&self) -> &OxController {
        self.block.controller()
    }

    /// Consumes the device without any orderly stop: what a killed process leaves behind
    /// is what the image holds now.
    pub fn into_controller(self) -> OxController {
        self.block.into_controller()
    }

    /// Records that the image file was renamed (a fresh image is formatted under a
    /// temporary name and renamed once the format is durable).
    pub fn image_moved_to(&mut self, path: &std::path::Path) {
        if let Ok(image) = self.image() {
            image.moved_to(path);
        }
    }

    fn image(&mut self) -> Result<&mut FlashImage, DeviceError> {
        self.block
            .controller_mut()
            .image_mut()
            .ok_or_else(|| DeviceError::Medium("the medium has no flash image".into()))
    }

    fn check(&mut self) -> Result<(), DeviceError> {
        match self.image()?.error() {
            Some(e) => Err(image_error(e.to_string())),
            None => Ok(()),
        }
    }

    fn sync(&mut self) -> Result<(), DeviceError> {
        self.image()?.sync().map_err(image_error)
    }

    /// Stages a write's bytes under fresh tokens (one per RBLOCK, never reused) and returns
    /// the tokens with the token payload the controller takes.
    fn stage_write(
        &mut self,
        cmd: &Command<'_>,
        sector_bytes: usize,
    ) -> Result<(Vec<u64>, Vec<u8>), DeviceError> {
        let first = self.last_token + 1;
        self.last_token += cmd.sectors as u64;
        let tokens: Vec<u64> = (first..=self.last_token).collect();
        let image = self.image()?;
        for (i, &t) in tokens.iter().enumerate() {
            image.stage(t, &cmd.data[i * sector_bytes..(i + 1) * sector_bytes]);
        }
        let words = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        Ok((tokens, words))
    }

    /// A write completed (`ok`) or failed: with the write-back cache its bytes stay staged
    /// until the version leaves the cache, otherwise they are in the image (or nowhere) and
    /// leave the stage now. A FUA write is installed (the controller waited for it,
    /// write-back cache or not), so its programs are in the image, and the sync makes them
    /// survive a host crash, which is what force unit access promises beyond an
    /// acknowledgement. Fails if the image did not take every program the write depends on.
    fn finish_write(
        &mut self,
        lba: u64,
        tokens: Vec<u64>,
        fua: bool,
        ok: bool,
    ) -> Result<(), DeviceError> {
        if ok && self.block.controller().config().write_cache.write_back {
            self.cached.extend((lba..).zip(tokens));
        } else {
            let image = self.image()?;
            for t in tokens {
                image.unstage(t);
            }
        }
        self.unstage_installed()?;
        self.check()?;
        if fua && ok {
            self.sync()?;
        }
        Ok(())
    }

    fn write(
        &mut self,
        now_ns: TimeNs,
        cmd: &Command<'_>,
        sector_bytes: usize,
    ) -> Result<Completion, DeviceError> {
        let (tokens, words) = self.stage_write(cmd, sector_bytes)?;
        let token_cmd = Command {
            data: &words,
            ..*cmd
        };
        let result = self.block.submit(now_ns, &token_cmd, ReadBuffers::none());
        self.finish_write(cmd.lba, tokens, cmd.flags.fua, result.is_ok())?;
        result
    }

    /// Drops the staged bytes of versions that have left the write-back cache: installed,
    /// so their RBLOCKs were programmed (the image has their bytes), or failed.
    ///
    /// Versions leave the cache in about the order they entered it, since contexts install
    /// in admission order, so only the oldest are looked up: the scan stops at the first
    /// version the cache still holds. One that left out of order (a failed context, or a
    /// queued write acknowledged after a later one) is unstaged once every version before it
    /// has left; until then its bytes only take memory, and a read never asks for them,
    /// since the controller no longer maps that version. Looking up every cached version
    /// after every command held a served OX device with a 27 MB cache to about 2,500 writes
    /// per second (2026-12-03, tools/serve_soak.py seed 20121).
    fn unstage_installed(&mut self) -> Result<(), DeviceError> {
        let ctrl = self.block.controller();
        let mut gone = Vec::new();
        while let Some(&(lpid, token)) = self.cached.front() {
            if ctrl.write_cache_holds(lpid, token) {
                break;
            }
            gone.push(token);
            self.cached.pop_front();
        }
        if gone.is_empty() {
            return Ok(());
        }
        let image = self.image()?;
        for t in gone {
            image.unstage(t);
        }
        Ok(())
    }

    /// A read: the controller reads tokens, and the bytes it captured from the image when
    /// it looked MAP up (checked against those tokens and TAGs there) are the answer.
    fn read(
        &mut self,
        now_ns: TimeNs,
        cmd: &Command<'_>,
        out: ReadBuffers<'_>,
    ) -> Result<Completion, DeviceError> {
        let mut words = vec![0u8; cmd.sectors as usize * 8];
        let completion = self.block.submit(
            now_ns,
            &Command::read(cmd.lba, cmd.sectors),
            ReadBuffers {
                data: &mut words,
                tags: None,
            },
        )?;
        self.check()?;
        let bytes = self.block.take_last_read_bytes().unwrap_or_else(|| {
            Err(DeviceError::Medium(
                "the controller kept no bytes for the read".into(),
            ))
        })?;
        out.data.copy_from_slice(&bytes);
        Ok(completion)
    }
}

/// A served device keeps a token per RBLOCK (the integrity check of every read).
fn check_config(cfg: &OxConfig) -> Result<(), OxError> {
    if cfg.payload != PayloadMode::Token {
        return Err(OxError::Config(format!(
            "a served OX device needs payload = \"token\" (a version per RBLOCK that every read is checked against), not {:?}",
            cfg.payload
        )));
    }
    cfg.validate()
}

impl BlockDevice for OxServedDevice {
    fn info(&self) -> DeviceInfo {
        let inner = self.block.info();
        DeviceInfo {
            payload_unit_bytes: inner.sector_bytes,
            ..inner
        }
    }

    fn media_faults(&self) -> afa_nand::MediaFaults {
        self.block.media_faults()
    }

    fn submit(
        &mut self,
        now_ns: TimeNs,
        cmd: &Command<'_>,
        out: ReadBuffers<'_>,
    ) -> Result<Completion, DeviceError> {
        self.check()?;
        if !self.queued.is_empty() {
            // `submit` runs the controller until its command completes, which would take
            // the queued commands' completions with it.
            return Err(DeviceError::Unsupported(
                "a command submitted while queued commands are under way".into(),
            ));
        }
        let info = self.info();
        validate_command(&info, cmd, &out)?;
        let sector_bytes = info.sector_bytes as usize;
        match cmd.opcode {
            Opcode::Write => self.write(now_ns, cmd, sector_bytes),
            Opcode::Read => self.read(now_ns, cmd, out),
            Opcode::Trim => {
                let r = self.block.submit(now_ns, cmd, ReadBuffers::none());
                self.unstage_installed()?;
                self.check()?;
                r
            }
            Opcode::Flush => {
                // With the write-back cache the flush drains it first; then every
                // acknowledged write is in the image, and the sync makes the image durable
                // against a host crash.
                let c = self.block.submit(now_ns, cmd, ReadBuffers::none())?;
                self.unstage_installed()?;
                self.sync()?;
                Ok(c)
            }
        }
    }

    fn queued(&mut self) -> Option<&mut dyn QueuedDevice> {
        Some(self)
    }

    fn allocation(&self, lba: u64, sectors: u32) -> Option<Vec<(u32, bool)>> {
        self.block.allocation(lba, sectors)
    }

    fn background(&mut self, now_ns: TimeNs) -> Option<TimeNs> {
        let next = self.block.background(now_ns);
        // A failure to reach the image shows at the next command (`check`).
        let _ = self.unstage_installed();
        next
    }
}

/// The queued interface: commands run side by side in the controller (OXBlock's queued
/// interface), so a client with many requests in flight sees the controller's parallelism.
/// A write's bytes are staged under its tokens when it starts; a read is answered with the
/// bytes the controller took from the image when it looked MAP up, since by its completion a
/// later write may have moved MAP on.
impl QueuedDevice for OxServedDevice {
    fn start(&mut self, now_ns: TimeNs, cmd: &Command<'_>, tag: u64) -> Result<(), DeviceError> {
        self.check()?;
        if self.queued.contains_key(&tag) {
            return Err(DeviceError::Unsupported(format!(
                "tag {tag} is already under way"
            )));
        }
        let info = self.info();
        // A read's bytes come back in its completion, so it is checked without a buffer.
        let checked_as = match cmd.opcode {
            Opcode::Read => DeviceInfo {
                payload_unit_bytes: 0,
                ..info
            },
            _ => info,
        };
        validate_command(&checked_as, cmd, &ReadBuffers::none())?;
        let kind = match cmd.opcode {
            Opcode::Write => {
                let (tokens, words) = self.stage_write(cmd, info.sector_bytes as usize)?;
                let token_cmd = Command {
                    data: &words,
                    ..*cmd
                };
                if let Err(e) = self.block.start(now_ns, &token_cmd, tag) {
                    let image = self.image()?;
                    for t in tokens {
                        image.unstage(t);
                    }
                    return Err(e);
                }
                Queued::Write {
                    lba: cmd.lba,
                    tokens,
                    fua: cmd.flags.fua,
                }
            }
            Opcode::Read => {
                self.block
                    .start(now_ns, &Command::read(cmd.lba, cmd.sectors), tag)?;
                Queued::Read
            }
            Opcode::Trim => {
                self.block.start(now_ns, cmd, tag)?;
                Queued::Trim
            }
            Opcode::Flush => {
                self.block.start(now_ns, cmd, tag)?;
                Queued::Flush
            }
        };
        self.queued.insert(tag, kind);
        Ok(())
    }

    fn next_event_ns(&self) -> Option<TimeNs> {
        self.block.next_event_ns()
    }

    fn advance_to(&mut self, t_ns: TimeNs) -> Vec<QueuedCompletion> {
        let mut done = QueuedDevice::advance_to(&mut self.block, t_ns);
        for c in &mut done {
            let Some(kind) = self.queued.remove(&c.tag) else {
                continue;
            };
            let ok = c.result.is_ok();
            let finished = match kind {
                Queued::Write { lba, tokens, fua } => self.finish_write(lba, tokens, fua, ok),
                Queued::Read => match self.block.take_read_bytes(c.tag) {
                    Some(Ok(bytes)) if ok => {
                        c.result = Ok(bytes);
                        Ok(())
                    }
                    Some(Err(e)) => Err(e),
                    _ if ok => Err(DeviceError::Medium(
                        "the controller kept no bytes for the read".into(),
                    )),
                    _ => Ok(()),
                },
                Queued::Trim => self.unstage_installed(),
                // With the write-back cache the flush waited for every write acknowledged
                // before it to be installed, so they are in the image; the sync makes the
                // image durable against a host crash.
                Queued::Flush if ok => self.unstage_installed().and_then(|()| self.sync()),
                Queued::Flush => Ok(()),
            };
            // The completion goes out only if the image took every program it depends on.
            if let Err(e) = finished.and_then(|()| self.check()) {
                c.result = Err(e);
            }
        }
        done
    }
}
