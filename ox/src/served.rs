//! OXBlock with real bytes, for serve mode: the controller stays token-driven, and the
//! flash image turns tokens into the bytes a host wrote.
//!
//! A write gets a fresh token per RBLOCK (a version number no earlier write used); its
//! bytes are staged in the image under that token before the command is submitted, reach
//! the image when the controller programs the RBLOCK (a GC move copies them from the source
//! RBLOCK), and are dropped from the stage once the command completes — or, with the
//! write-back cache, once the version has left the cache (it is installed, so programmed).
//! A read returns the tokens the controller read; the device then fetches the bytes at the
//! RBLOCK MAP points at and checks that the image's token and TAG there are the ones the
//! controller returned, so a mismatch is an error, never wrong data. A token the write-back
//! cache returned is still staged and its bytes come from the stage.

use afa_nand::PayloadMode;
use afa_sim::TimeNs;
use afa_ssd::{
    validate_command, BlockDevice, Command, Completion, DeviceError, DeviceInfo, Opcode,
    ReadBuffers,
};

use crate::{
    FlashImage, Media, OxBlockDevice, OxConfig, OxController, OxError, PoweredOff, RecoveryReport,
    TagKind,
};

/// The OX controller behind a block interface that stores and returns full bytes.
#[derive(Debug)]
pub struct OxServedDevice {
    block: OxBlockDevice,
    /// The last token handed out; tokens identify versions, so none is ever reused.
    last_token: u64,
    /// Write-back cache: (LPID, token) of acknowledged writes whose bytes stay staged until
    /// the version leaves the cache.
    cached: Vec<(u64, u64)>,
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
        let mut device = OxServedDevice {
            block: OxBlockDevice::new(ctrl),
            last_token: 0,
            cached: Vec::new(),
        };
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
        let mut device = OxServedDevice {
            block: OxBlockDevice::new(ctrl),
            last_token,
            cached: Vec::new(),
        };
        device.sync().map_err(|e| OxError::Image(e.to_string()))?;
        Ok((device, report))
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

    fn write(
        &mut self,
        now_ns: TimeNs,
        cmd: &Command<'_>,
        sector_bytes: usize,
    ) -> Result<Completion, DeviceError> {
        let first = self.last_token + 1;
        self.last_token += cmd.sectors as u64;
        let tokens: Vec<u64> = (first..=self.last_token).collect();
        let image = self.image()?;
        for (i, &t) in tokens.iter().enumerate() {
            image.stage(t, &cmd.data[i * sector_bytes..(i + 1) * sector_bytes]);
        }
        let words: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        let token_cmd = Command {
            opcode: Opcode::Write,
            lba: cmd.lba,
            sectors: cmd.sectors,
            data: &words,
            tags: None,
            flags: cmd.flags,
        };
        let result = self.block.submit(now_ns, &token_cmd, ReadBuffers::none());
        if result.is_ok() && self.block.controller().config().write_cache.write_back {
            self.cached.extend((cmd.lba..).zip(tokens.iter().copied()));
        } else {
            let image = self.image()?;
            for &t in &tokens {
                image.unstage(t);
            }
        }
        self.unstage_installed()?;
        // The completion goes out only if the image took every program it depends on.
        self.check()?;
        // A FUA write is installed (the controller waited for it, write-back cache or
        // not), so its programs are in the image; the sync makes them survive a host crash,
        // which is what force unit access promises beyond an acknowledgement.
        if cmd.flags.fua && result.is_ok() {
            self.sync()?;
        }
        result
    }

    /// Drops the staged bytes of versions that have left the write-back cache: installed,
    /// so their RBLOCKs were programmed (the image has their bytes), or failed.
    fn unstage_installed(&mut self) -> Result<(), DeviceError> {
        if self.cached.is_empty() {
            return Ok(());
        }
        let ctrl = self.block.controller();
        let (keep, gone): (Vec<_>, Vec<_>) = std::mem::take(&mut self.cached)
            .into_iter()
            .partition(|&(lpid, token)| ctrl.write_cache_holds(lpid, token));
        self.cached = keep;
        let image = self.image()?;
        for (_, t) in gone {
            image.unstage(t);
        }
        Ok(())
    }

    fn read(
        &mut self,
        now_ns: TimeNs,
        cmd: &Command<'_>,
        out: ReadBuffers<'_>,
        sector_bytes: usize,
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
        let ctrl = self.block.controller();
        let image = ctrl
            .media()
            .image()
            .ok_or_else(|| DeviceError::Medium("the medium has no flash image".into()))?;
        for i in 0..cmd.sectors as usize {
            let lpid = cmd.lba + i as u64;
            let token =
                u64::from_le_bytes(words[i * 8..(i + 1) * 8].try_into().unwrap_or_default());
            let dst = &mut out.data[i * sector_bytes..(i + 1) * sector_bytes];
            if ctrl.write_cache_holds(lpid, token) {
                if token == 0 {
                    // A trim waits in the write-back cache; MAP still points at the data.
                    dst.fill(0);
                    continue;
                }
                // The newest version waits in the write-back cache: its bytes are staged.
                let staged = image.staged(token).ok_or_else(|| {
                    DeviceError::Medium(format!(
                        "LPID {lpid}: the write cache returned token {token:#x}, whose bytes are not staged"
                    ))
                })?;
                dst.copy_from_slice(staged);
                continue;
            }
            let ppa = ctrl.peek_mapping(lpid);
            if ppa.is_none() {
                if token != 0 {
                    return Err(DeviceError::Medium(format!(
                        "LPID {lpid} read token {token:#x} but is not mapped"
                    )));
                }
                dst.fill(0);
                continue;
            }
            let (tag, stored, bytes) = image.read_user(ppa).map_err(image_error)?;
            if stored != token
                || tag.lpid != lpid
                || !matches!(tag.kind, TagKind::User | TagKind::Gc)
            {
                return Err(DeviceError::Medium(format!(
                    "LPID {lpid}: the controller read token {token:#x}, but RBLOCK {} of the image holds token {stored:#x} with TAG {tag:?}",
                    ppa.0
                )));
            }
            dst.copy_from_slice(&bytes);
        }
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

    fn submit(
        &mut self,
        now_ns: TimeNs,
        cmd: &Command<'_>,
        out: ReadBuffers<'_>,
    ) -> Result<Completion, DeviceError> {
        self.check()?;
        let info = self.info();
        validate_command(&info, cmd, &out)?;
        let sector_bytes = info.sector_bytes as usize;
        match cmd.opcode {
            Opcode::Write => self.write(now_ns, cmd, sector_bytes),
            Opcode::Read => self.read(now_ns, cmd, out, sector_bytes),
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
