//! How the front starts an interpreter: the hidden command and the arguments both sides read.
//! The front writes them (`src/worker/client.rs`, `src/worker/zygote_client.rs`); the interpreter
//! reads them (`src/interpreter/`). Declared once here so that the two cannot drift.

/// The hidden first argument that makes the binary an interpreter instead of a front.
pub const WORKER_COMMAND: &str = "__worker";

/// The worker argument that names the descriptor of the memory snapshot to restore
/// (`--snapshot-fd=N`, read-only, kept across `exec`): the worker maps the file instead of
/// receiving its bytes through its standard input.
pub const SNAPSHOT_FD_ARG: &str = "--snapshot-fd=";

/// The worker argument that makes it a zygote and names its control socket's descriptor
/// (`--control-fd=N`: the number it has in the front, kept across `exec`).
pub const CONTROL_FD_ARG: &str = "--control-fd=";

/// The worker argument that caps its WebAssembly memory (`--wasm-max-mib=N`, MiB), as the
/// front derives it from `--memory`.
pub const WASM_MAX_MIB_ARG: &str = "--wasm-max-mib=";

/// The worker argument that selects the [`ConfinementMode`] (`--confinement=strict|default|off`), as the
/// front passes its own `--confinement` on.
pub const MODE_ARG: &str = "--confinement=";

/// How hard the worker insists on its confinement (`--confinement`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ConfinementMode {
    /// Every layer must be applied; one that cannot be is an error.
    Strict,
    /// Apply what the kernel allows and report what is off.
    #[default]
    Default,
    /// Apply nothing (debugging only).
    Off,
}

impl ConfinementMode {
    /// The worker argument that selects this mode (`--confinement=strict`).
    pub fn worker_arg(self) -> String {
        format!("{MODE_ARG}{}", self.name())
    }

    /// The mode's name on the command line (`--confinement NAME`).
    pub fn name(self) -> &'static str {
        match self {
            ConfinementMode::Strict => "strict",
            ConfinementMode::Default => "default",
            ConfinementMode::Off => "off",
        }
    }

    /// The mode named by `--confinement=` among the worker's arguments (default: [`ConfinementMode::Default`]).
    pub fn from_args() -> Result<ConfinementMode, UnknownConfinementMode> {
        match std::env::args().find_map(|a| a.strip_prefix(MODE_ARG).map(str::to_owned)) {
            None => Ok(ConfinementMode::Default),
            Some(name) => match name.as_str() {
                "strict" => Ok(ConfinementMode::Strict),
                "default" => Ok(ConfinementMode::Default),
                "off" => Ok(ConfinementMode::Off),
                _ => Err(UnknownConfinementMode(name)),
            },
        }
    }
}

/// A `--confinement=` worker argument that names no [`ConfinementMode`].
#[derive(Debug, thiserror::Error)]
#[error("unknown confinement mode {0:?} (expected strict, default or off)")]
pub struct UnknownConfinementMode(pub String);
