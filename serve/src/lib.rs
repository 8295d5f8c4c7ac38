//! Serve mode: the volume as a real block device over NBD, for clients nobody here wrote
//! (qemu, libnbd's tools, fio, the kernel through nbdfuse).
//!
//! - [`proto`]: the NBD wire protocol without I/O (negotiation, request checks, replies).
//! - [`session`]: one connection's loops over any byte stream.
//! - [`engine`]: the thread that owns the device and paces replies in wall-clock time.
//! - [`server`]: the listener (TCP or unix socket) and the connection threads.
//! - [`SharedVolume`]: a volume that does its own concurrency, which connection threads
//!   apply requests to directly, with no lock of the server's.
//! - [`MemDevice`] and [`FileDevice`]: devices for serve mode besides the emulated SSD;
//!   [`StateDir`] keeps file-backed members across restarts, and [`FileNvram`] an
//!   engine's battery-backed host memory.
//!
//! See docs/serve.md for the protocol subset, limits, pacing and the persistence model.

pub mod engine;
mod file;
mod mem;
mod nvram;
pub mod proto;
mod queued;
pub mod server;
pub mod session;
mod shared;
mod state;

pub use engine::{EngineStats, Executor, Pace};
pub use file::{FileDevice, FileDeviceError};
pub use mem::MemDevice;
pub use nvram::FileNvram;
pub use server::{ListenAddr, RunningServer, ServeConfig, Server, DEFAULT_PORT};
pub use shared::{SharedVolume, Started};
pub use state::{MemberHealth, MemberRecord, StateDir};

/// Why serve mode could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("listen address {0}")]
    Listen(String),
    #[error("serve mode needs the device's full bytes (payload \"full\"), but it stores {unit_bytes} bytes per {sector_bytes}-byte sector")]
    PayloadNotFull { unit_bytes: u32, sector_bytes: u32 },
    #[error("the device has no capacity")]
    EmptyDevice,
    #[error("{0}")]
    Config(String),
    #[error("state directory: {0}")]
    State(String),
    #[error(transparent)]
    FileDevice(#[from] FileDeviceError),
    #[error("cannot start a thread: {0}")]
    Thread(std::io::Error),
}

/// Writes one line to stderr. Serve mode logs connection errors and refusals there, so an
/// operator sees why a client was dropped.
pub fn log(message: &str) {
    eprintln!("afa serve: {message}");
}

/// How many failed requests a server logs with their cause; later ones are only counted
/// (the count is printed when it stops), so a client that keeps sending a refused request
/// does not flood the log.
pub const LOGGED_REQUEST_FAILURES: u64 = 10;

/// Logs why a request failed. Its client sees an errno (and the message only with
/// structured replies); the operator should see the cause too. `earlier` is how many
/// requests failed before this one.
pub(crate) fn log_request_failure(earlier: u64, failure: &engine::Failure) {
    if earlier >= LOGGED_REQUEST_FAILURES {
        return;
    }
    let more = if earlier + 1 == LOGGED_REQUEST_FAILURES {
        " (later request failures are only counted)"
    } else {
        ""
    };
    log(&format!(
        "request failed with errno {}: {}{more}",
        failure.errno, failure.message
    ));
}

#[cfg(test)]
mod tests;
