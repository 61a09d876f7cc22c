//! The sandbox worker process: one JavaScriptCore context, one Pyodide, requests on stdin.
//!
//! Started by the front as `mcp-run-python __worker`. It boots Pyodide once, sends
//! [`Reply::Ready`], then answers [`Request`]s until stdin closes. It has no network and reads
//! no host files: Pyodide's own files are embedded in the binary and package files arrive as
//! frame attachments.
//!
//! The runner's JavaScript functions are kept by the host (never on a global) and called with
//! the call id of each request; output is forwarded only while a `run` is in progress, tagged
//! with its call id.

use super::descriptors::inherited_descriptor;
use super::dirty_pages::{self, DirtyPages};
use super::linear_memory::{Pristine, Shadow};
use super::mount::MountPlan;
use super::net::{FetchRequest, FetchResponse};
use super::protocol::{
    read_frame, write_frame, BootAttachments, BootInstall, CallId, Frame, FrameError, FrameLimits,
    FunctionCall, OutputLine, Reply, Request, RunOutcome, RunStatus, SnapshotMode, ToolCall,
    MAX_SNAPSHOT_BYTES, SNAPSHOT_FD_ARG,
};
use crate::engine::{Arg, CallError, Engine, EngineError, JsFunction, MappedFile};
use anyhow::{anyhow, bail, Context, Result};
use include_dir::{include_dir, Dir};
use serde::Deserialize;
use std::cell::RefCell;
use std::io::{self, BufReader, BufWriter};
use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::time::{Duration, Instant};

mod checkpoint;

/// Pyodide 314.0.7 (docs/architecture.md §7), `pyodide.asm.mjs` already rewritten as a classic script.
pub static PYODIDE: Dir = include_dir!("$OUT_DIR/pyodide");
const BOOTSTRAP_JS: &str = include_str!("../../js/bootstrap.js");
const RUNNER_JS: &str = include_str!("../../js/runner.js");
const FETCH_JS: &str = include_str!("../../js/fetch.js");
const RUNNER_PY: &str = include_str!("../../python/runner.py");
const MCP_TOOLS_PY: &str = include_str!("../../python/mcp_tools.py");

/// The virtual file an upload's bytes wait in (`js/runner.js`, `UPLOAD`).
const UPLOAD_PATH: &str = "/upload";
/// The virtual file that holds the `--mount` files' bytes while the runner copies them (js/runner.js's
/// `MOUNT`).
const MOUNT_PATH: &str = "/mount";

/// The call id of the boot, which comes before any call of the front.
const BOOT_CALL: CallId = 0;

/// Identifies everything a memory snapshot depends on (the embedded Pyodide, our JavaScript
/// and Python, this version): a snapshot is only restored by the same runtime. Hex, 16 chars.
pub fn runtime_fingerprint() -> String {
    let mut all = Vec::new();
    // The embedded Pyodide's digest, made by build.rs as it embeds the files.
    all.extend_from_slice(env!("PYODIDE_ASSETS_SHA256").as_bytes());
    for text in [
        BOOTSTRAP_JS,
        RUNNER_JS,
        RUNNER_PY,
        MCP_TOOLS_PY,
        env!("CARGO_PKG_VERSION"),
    ] {
        all.extend_from_slice(text.as_bytes());
    }
    crate::packages::cache::sha256_hex(&all)[..16].to_owned()
}

/// How long booting Pyodide may take before the worker gives up (seconds).
const BOOT_TIMEOUT: Duration = Duration::from_secs(180);

/// Output bytes a run may send past its output cap before the front stops it (bytes). A
/// well-behaved run never gets there: the Python helper stops forwarding at the cap; output
/// written below Python (`os.write`) or by JavaScript is counted by the front, which kills the
/// worker past `cap + OUTPUT_SLACK`.
pub const OUTPUT_SLACK: usize = 64 << 10;

/// Runs the worker until stdin closes. Errors are also reported to the front as `Fatal`.
pub fn main() -> Result<()> {
    // Die with the front: a worker must never outlive the server that owns it.
    #[cfg(target_os = "linux")]
    // SAFETY: prctl with PR_SET_PDEATHSIG only sets a flag on this process.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    }
    let result = serve();
    if let Err(e) = &result {
        let reply = match e.downcast_ref::<super::confine::ConfineError>() {
            Some(strict @ super::confine::ConfineError::Strict { .. }) => Reply::Unconfined {
                reason: strict.to_string(),
            },
            _ => Reply::Fatal {
                error: format!("{e:#}"),
            },
        };
        let _ = send(&reply);
    }
    result
}

/// A frame to the front could not be written (to standard output): the worker cannot go on.
#[derive(Debug, thiserror::Error)]
#[error("writing to the front")]
struct SendError(#[source] FrameError);

/// Writes one frame to the front (buffered; `write_frame` flushes at the end).
///
/// Errors: [`SendError`] when the frame cannot be encoded or the pipe fails.
fn send_with(reply: &Reply, attachments: &[&[u8]]) -> Result<(), SendError> {
    let mut out = BufWriter::new(io::stdout().lock());
    write_frame(&mut out, reply, attachments).map_err(SendError)
}

/// Writes one frame without attachments to the front ([`send_with`]).
fn send(reply: &Reply) -> Result<(), SendError> {
    send_with(reply, &[])
}

/// Why the worker's host could not answer a host call of its JavaScript (`__host.call`). The
/// text becomes the message of the JavaScript `Error` thrown (for a fetch or a tool call, what
/// user code sees), each worded as it always was.
#[derive(Debug, thiserror::Error)]
enum HostCallError {
    /// The message is not one the host knows: the parser's words.
    #[error("{0}")]
    Malformed(#[source] serde_json::Error),
    /// Anything but the memory snapshot, while booting.
    #[error("only the snapshot is taken while booting")]
    WhileBooting,
    /// A memory snapshot, once booted.
    #[error("a snapshot is only made while booting")]
    SnapshotAfterBoot,
    /// A request of user code (`what`, plural) while no run is in progress.
    #[error("{what} are only available while code runs")]
    NotRunning { what: &'static str },
    /// The front's next frame is not the answer to the request of kind `kind` (a
    /// [`Reply::kind`]) of the run.
    #[error("the front did not answer the {kind}")]
    Unanswered { kind: &'static str },
    /// The front's answer cannot be handed to JavaScript as JSON: the encoder's words.
    #[error("{0}")]
    Encode(#[source] serde_json::Error),
    /// The request could not be sent. The text is the whole chain, as the worker has always
    /// worded it (`writing to the front: the pipe failed: …`).
    #[error("{}", chain(.0))]
    Send(#[source] SendError),
    /// The front closed the worker's input instead of answering.
    #[error("the front closed the worker's input")]
    InputClosed,
    /// The front's answer could not be read.
    #[error("the front's answer could not be read: {0}")]
    Read(#[source] FrameError),
}

/// `error` and each of its sources, joined by `: ` (as `anyhow` shows a chain with `{:#}`).
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// `--wasm-max-mib=N` from the worker's arguments, in bytes.
fn wasm_max_bytes() -> Option<u64> {
    std::env::args()
        .filter_map(|a| {
            a.strip_prefix("--wasm-max-mib=")
                .and_then(|n| n.parse::<u64>().ok())
        })
        .next()
        .map(|mib| mib << 20)
}

/// The runner's functions (`js/runner.js`), kept by the host.
struct Runner {
    boot: JsFunction,
    find_imports: JsFunction,
    install: JsFunction,
    run: JsFunction,
    reseed: JsFunction,
    read_file: JsFunction,
    write_file: JsFunction,
    mount: JsFunction,
    memory: JsFunction,
    baseline: JsFunction,
    capturable: JsFunction,
    grow: JsFunction,
}

/// Every answer of the runner (`js/runner.js`, `ok` and `failed`): the operation's result, or
/// why it failed.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum RunnerAnswer<T> {
    Ok(T),
    Failed(RunnerFailure),
}

/// Why a runner operation failed (`js/runner.js`, `failure`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RunnerFailure {
    /// The interpreter ended and cannot be used again.
    #[serde(default)]
    ended: Option<Ended>,
    /// The JavaScript error, as text.
    #[serde(default)]
    error: Option<String>,
}

/// How an interpreter ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Ended {
    /// `os._exit(status)` (Emscripten's `ExitStatus`).
    Exit(i64),
    /// `os.abort()`, a trap or a fatal error in the runtime.
    Abort,
}

/// Why a runner operation failed.
#[derive(Debug, thiserror::Error)]
enum OperationError {
    #[error("{0}")]
    Failed(String),
    #[error("the interpreter ended ({0:?})")]
    Ended(Ended),
    #[error("the runner gave an answer of the wrong shape")]
    Shape(#[source] serde_json::Error),
}

/// The runner's `{}` result.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Empty {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Booted {
    version: String,
}

/// Calls a runner function for call `id` and drives the event loop until it answers.
fn call(
    engine: &mut Engine,
    f: &JsFunction,
    id: CallId,
    args: &[Arg],
    deadline: Option<Instant>,
) -> Result<String, EngineError> {
    let mut all = Vec::with_capacity(args.len() + 1);
    all.push(Arg::Num(id as f64));
    all.extend_from_slice(args);
    engine.call(f, &all)?;
    engine.run_until_done(id, deadline)
}

/// Parses a runner answer: its result as `T`, or its typed failure.
fn parse_answer<T: for<'de> Deserialize<'de>>(text: &str) -> Result<T, OperationError> {
    match serde_json::from_str::<RunnerAnswer<T>>(text) {
        Ok(RunnerAnswer::Ok(value)) => Ok(value),
        Ok(RunnerAnswer::Failed(RunnerFailure {
            ended: Some(ended), ..
        })) => Err(OperationError::Ended(ended)),
        Ok(RunnerAnswer::Failed(RunnerFailure { error, .. })) => Err(OperationError::Failed(
            error.unwrap_or_else(|| "unknown error".into()),
        )),
        Err(e) => Err(OperationError::Shape(e)),
    }
}

/// Maps the memory snapshot the front named by [`SNAPSHOT_FD_ARG`], and closes that
/// descriptor (the mapping stays): nothing of the file is left to reach once user code runs.
///
/// Errors: the argument is missing or names no open descriptor; the file cannot be mapped.
fn map_snapshot() -> Result<MappedFile> {
    let fd = inherited_descriptor(SNAPSHOT_FD_ARG)?
        .ok_or_else(|| anyhow!("a snapshot to restore, but no {SNAPSHOT_FD_ARG}"))?;
    let file = std::fs::File::from(fd);
    MappedFile::map(&file, MAX_SNAPSHOT_BYTES as u64).context("mapping the memory snapshot")
}

/// Boots Pyodide in a new engine (`mode`: plainly, making a memory snapshot, or restoring
/// `snapshot`): the engine, the runner's functions, Pyodide's version and the snapshot made, if
/// any.
///
/// Errors: the engine cannot be made, an embedded script fails, or Pyodide does not boot
/// within [`BOOT_TIMEOUT`].
fn boot(
    mode: SnapshotMode,
    snapshot: Option<MappedFile>,
) -> Result<(Engine, Runner, String, Option<Vec<u8>>)> {
    let mut engine = Engine::new()?;
    if let Some(mapped) = snapshot {
        engine.add_mapped_file("/snapshot.bin", mapped);
    }
    let made = catch_snapshot(&mut engine);
    for file in PYODIDE.files() {
        let name = file.path().to_string_lossy();
        engine.add_static_file(&format!("/pyodide/{name}"), file.contents());
    }
    let runner = load_runner(&mut engine)?;
    let version = boot_runner(&mut engine, &runner, mode)?;
    engine.clear_files();
    let snapshot = made.borrow_mut().take();
    Ok((engine, runner, version, snapshot))
}

/// Answers the host calls made while booting: only the memory snapshot Pyodide makes (with
/// [`SnapshotMode::Make`]), which lands in the returned cell.
fn catch_snapshot(engine: &mut Engine) -> Rc<RefCell<Option<Vec<u8>>>> {
    let made: Rc<RefCell<Option<Vec<u8>>>> = Rc::default();
    let made_in = made.clone();
    engine.set_call_handler(Box::new(
        move |json: &str, bytes: Vec<u8>| match serde_json::from_str::<HostRequest>(json) {
            Ok(HostRequest::Snapshot) => {
                *made_in.borrow_mut() = Some(bytes);
                Ok(("{}".to_owned(), Vec::new()))
            }
            _ => Err(CallError::from(HostCallError::WhileBooting)),
        },
    ));
    made
}

/// Evaluates the bootstrap, Pyodide's scripts and the runner (`js/runner.js`) in `engine`, and
/// keeps the runner's functions.
///
/// Errors: an embedded script is missing or fails.
fn load_runner(engine: &mut Engine) -> Result<Runner> {
    let text = |name: &str| -> Result<&'static str> {
        PYODIDE
            .get_file(name)
            .and_then(|f| f.contents_utf8())
            .ok_or_else(|| anyhow!("embedded asset {name} is missing"))
    };
    engine.eval(BOOTSTRAP_JS, "mcp:bootstrap.js")?;
    engine.eval(text("pyodide.js")?, "/pyodide/pyodide.js")?;
    engine.eval(text("pyodide.asm.mjs")?, "/pyodide/pyodide.asm.mjs")?;
    let mut functions = engine
        .eval_functions(
            RUNNER_JS,
            "mcp:runner.js",
            &[
                "boot",
                "findImports",
                "install",
                "run",
                "reseed",
                "readFile",
                "writeFile",
                "mount",
                "memory",
                "baseline",
                "capturable",
                "grow",
            ],
        )?
        .into_iter();
    let mut next = || {
        functions
            .next()
            .ok_or_else(|| anyhow!("runner.js is incomplete"))
    };
    Ok(Runner {
        boot: next()?,
        find_imports: next()?,
        install: next()?,
        run: next()?,
        reseed: next()?,
        read_file: next()?,
        write_file: next()?,
        mount: next()?,
        memory: next()?,
        baseline: next()?,
        capturable: next()?,
        grow: next()?,
    })
}

/// Boots Pyodide through the runner's `boot` (`mode`: how, as the front asked), within
/// [`BOOT_TIMEOUT`]: Pyodide's version.
///
/// Errors: the boot failed or took too long ("booting Pyodide").
fn boot_runner(engine: &mut Engine, runner: &Runner, mode: SnapshotMode) -> Result<String> {
    let env = r#"{"HOME":"/home/pyodide","USER":"pyodide","LANG":"C.UTF-8"}"#;
    let deadline = Some(Instant::now() + BOOT_TIMEOUT);
    let answer = call(
        engine,
        &runner.boot,
        BOOT_CALL,
        &[
            Arg::Str(RUNNER_PY),
            Arg::Str(MCP_TOOLS_PY),
            Arg::Str(env),
            wasm_max_bytes().map_or(Arg::Null, |b| Arg::Num(b as f64)),
            Arg::Str(match mode {
                SnapshotMode::None => "none",
                SnapshotMode::Make => "make",
                SnapshotMode::Load => "load",
            }),
        ],
        deadline,
    )
    .context("booting Pyodide")?;
    let booted: Booted = parse_answer(&answer).context("booting Pyodide")?;
    Ok(booted.version)
}

/// Writes the operator's `--mount` files into the interpreter's file system, read-only
/// (`js/runner.js` `mount`): `bytes` holds the plan's files one after another.
fn mount_files(engine: &mut Engine, runner: &Runner, mount: (MountPlan, Vec<u8>)) -> Result<()> {
    let (plan, bytes) = mount;
    if plan.is_empty() {
        return Ok(());
    }
    engine.add_file(MOUNT_PATH, bytes);
    let json = serde_json::to_string(&plan)?;
    let deadline = Some(Instant::now() + BOOT_TIMEOUT);
    let answer = call(
        engine,
        &runner.mount,
        BOOT_CALL,
        &[Arg::Str(&json)],
        deadline,
    )
    .context("mounting --mount files")?;
    engine.clear_files();
    parse_answer::<Empty>(&answer).context("mounting --mount files")?;
    Ok(())
}

/// The runner's answer to `install`: the modules that failed to import, each with why.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Installed {
    #[serde(default)]
    failed: Vec<String>,
}

/// Makes `files[i]` hold `bytes[i]`, loads `items` with the runner's `install` (lock package
/// names, wheel paths), then imports the top-level modules of the distributions `imports`; the
/// files are forgotten after. The call's `Install` and the boot's `--deps` both come here.
///
/// Errors: a package did not install, or the runner's answer has the wrong shape.
#[allow(clippy::too_many_arguments)]
fn install_packages(
    engine: &mut Engine,
    runner: &Runner,
    id: CallId,
    files: &[String],
    bytes: Vec<Vec<u8>>,
    items: &[String],
    imports: &[String],
    deadline: Option<Instant>,
) -> Result<Installed> {
    for (path, bytes) in files.iter().zip(bytes) {
        engine.add_file(path, bytes);
    }
    let items = serde_json::to_string(items)?;
    let imports = serde_json::to_string(imports)?;
    let args = [Arg::Str(&items), Arg::Str(&imports)];
    let answer = call(engine, &runner.install, id, &args, deadline);
    engine.clear_files();
    Ok(parse_answer::<Installed>(&answer?)?)
}

/// Installs `--deps` as the worker boots ([`BootInstall`]: `files[i]`'s bytes are `bytes[i]`),
/// then imports their top-level modules, so that the worker's calls (and, in the zygote, every
/// worker forked from it) find them ready. A module that fails to import is logged on
/// stderr and left for the calls to import.
///
/// Errors: a package did not install (the front then installs `--deps` at the first call, which
/// reports why in words).
fn preinstall(
    engine: &mut Engine,
    runner: &Runner,
    install: BootInstall,
    bytes: Vec<Vec<u8>>,
) -> Result<()> {
    let started = Instant::now();
    let deadline = Some(Instant::now() + BOOT_TIMEOUT);
    let installed = install_packages(
        engine,
        runner,
        BOOT_CALL,
        &install.files,
        bytes,
        &install.items,
        &install.imports,
        deadline,
    )?;
    for failed in installed.failed {
        eprintln!("--deps: not imported at boot: {failed}");
    }
    eprintln!(
        "--deps installed and imported in {} ms",
        started.elapsed().as_millis()
    );
    Ok(())
}

/// A run that failed with `error` (and nothing else to report); `fatal`: its interpreter
/// cannot be used again.
fn error_outcome(error: String, fatal: bool) -> RunOutcome {
    RunOutcome {
        status: RunStatus::RunError,
        return_value: None,
        error: Some(error),
        truncated: false,
        fatal,
        images: Vec::new(),
        files: Vec::new(),
        written: Vec::new(),
        refresh: Vec::new(),
        image_bytes: Vec::new(),
    }
}

/// The result of a run whose interpreter ended (the next call runs in a new worker).
fn ended_outcome(ended: Ended) -> RunOutcome {
    let error = match ended {
        Ended::Exit(code) => format!("SystemExit: the code ended the interpreter with exit({code}) (os._exit); the next call runs in a new interpreter"),
        Ended::Abort => "RuntimeError: the interpreter aborted (os.abort() or a fatal error in the runtime); the next call runs in a new interpreter".to_owned(),
    };
    error_outcome(error, true)
}

/// The result of a run that failed below Python (the runner did not answer with a result).
fn failed_outcome(e: OperationError) -> RunOutcome {
    match e {
        OperationError::Ended(ended) => ended_outcome(ended),
        // An ordinary JavaScript error from the runner: the interpreter is still usable.
        OperationError::Failed(text) => error_outcome(text, false),
        e @ OperationError::Shape(_) => error_outcome(format!("RuntimeError: {e}"), false),
    }
}

/// The result of a run during which the engine itself failed: the interpreter is ended.
fn engine_outcome(e: &EngineError) -> RunOutcome {
    if let EngineError::UnhandledRejection(r) = e {
        if r.fatal {
            return ended_outcome(r.exit_status.map_or(Ended::Abort, Ended::Exit));
        }
    }
    let text = e.to_string();
    let first = text.lines().next().unwrap_or_default();
    error_outcome(
        format!("RuntimeError: the JavaScript runtime failed: {first}; the next call runs in a new interpreter"),
        true,
    )
}

/// Output of the run in progress: its call id and cap, and what was forwarded so far.
#[derive(Default)]
struct Running {
    id: Option<CallId>,
    output_cap: usize,
}

impl Running {
    /// Largest line forwarded (bytes): one past the front's limit, enough to trip it.
    fn line_max(&self) -> usize {
        self.output_cap.saturating_add(OUTPUT_SLACK + 1)
    }
}

/// Cuts `text` to at most `max` bytes, on a character boundary.
fn cut(text: &mut String, max: usize) {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
}

/// Forwards output lines of the run in progress, in frames of at most about one line cap.
fn forward_output(running: &Running, text: &str) {
    let Some(id) = running.id else {
        // No run in progress (booting, scanning, installing): nothing is the call's output.
        return;
    };
    let Ok(lines) = serde_json::from_str::<Vec<OutputLine>>(text) else {
        return;
    };
    let max = running.line_max();
    let mut batch = Vec::new();
    let mut size = 0usize;
    for (stream, mut line) in lines {
        cut(&mut line, max);
        size += line.len() + 1;
        batch.push((stream, line));
        if size > max {
            let _ = send(&Reply::Output {
                id,
                lines: std::mem::take(&mut batch),
            });
            size = 0;
        }
    }
    if !batch.is_empty() {
        let _ = send(&Reply::Output { id, lines: batch });
    }
}

/// Reads the images `outcome` names (files the run made in its working directory), each of at
/// most `cap` bytes, through the runner's `readFile`; keeps in `outcome.images` only those read,
/// in the order of the returned bytes. None when `cap` is 0 (no `--stateful`).
fn read_images(
    engine: &mut Engine,
    runner: &Runner,
    file_in: &RefCell<Option<Vec<u8>>>,
    id: CallId,
    outcome: &mut RunOutcome,
    cap: usize,
) -> Vec<Vec<u8>> {
    let mut read = Vec::new();
    let mut kept = Vec::new();
    if cap > 0 {
        for path in outcome.images.iter().take(super::protocol::MAX_IMAGES) {
            if let Ok(bytes) = read_file(engine, runner, file_in, id, path, cap) {
                kept.push(path.clone());
                read.push(bytes);
            }
        }
    }
    outcome.images = kept;
    read
}

/// Why the runner could not read a file; its text goes to the front as the worker's own words
/// ([`Reply::File`]).
#[derive(Debug, thiserror::Error)]
enum ReadFileError {
    /// The runner said why (no such file, too large, a directory).
    #[error(transparent)]
    Runner(#[from] OperationError),
    /// The engine failed while the runner read it.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The runner answered, but handed no bytes to the host.
    #[error("the runner read no bytes")]
    NoBytes,
}

/// The bytes of file `path` under the working directory, read through the runner's
/// `readFile` (which hands them to the host into `file_in`) if it has at most `cap` bytes.
///
/// Errors: [`ReadFileError`], saying why not.
fn read_file(
    engine: &mut Engine,
    runner: &Runner,
    file_in: &RefCell<Option<Vec<u8>>>,
    id: CallId,
    path: &str,
    cap: usize,
) -> Result<Vec<u8>, ReadFileError> {
    let args = [Arg::Str(path), Arg::Num(cap as f64)];
    let answered = call(engine, &runner.read_file, id, &args, None);
    let bytes = file_in.borrow_mut().take();
    match (answered.map(|text| parse_answer::<Empty>(&text)), bytes) {
        (Ok(Ok(_)), Some(bytes)) => Ok(bytes),
        (Ok(Err(e)), _) => Err(e.into()),
        (Err(e), _) => Err(e.into()),
        (Ok(Ok(_)), None) => Err(ReadFileError::NoBytes),
    }
}

/// Calls the zygote makes before it forks, so that its children inherit warm caches and
/// compiled code: the first call of a forked worker then costs about what a later one does.
/// Each also scans the code's imports, as a first call does. 50 instead of 200 saved ~0.2 s of
/// the zygote's start; forked workers' first calls measured the same (5-9 ms over HTTP).
const WARM_UP_CALLS: usize = 50;

/// More calls the zygote makes after [`WARM_UP_CALLS`] (the same code, without the import
/// scan, which most calls skip too), so that its children inherit the per-call code compiled by
/// the engine's optimizing WebAssembly tier (OMG). That tier takes a function once its counter
/// reaches 50,000, and an entry adds 15: a function entered once per call tiers up after about
/// 3,300 calls, so the warm-up makes 4,050 (its compiles still running when the calls end are
/// waited for with the helper threads). With only 200 warm-up calls, every forked worker
/// compiled those functions itself around its 3,000th call, on a second thread, and `session`
/// throughput with 8 forked workers was 547–598 calls/s against 900–1,300 after 5,000 warm-up
/// calls. Lowering the threshold instead is no way out: the children inherit it
/// ([`crate::engine::configure_zygote`]). The price: about two seconds of the zygote's start.
const TIER_UP_CALLS: usize = 4000;

/// Code of the warm-up calls: a trivial expression, output, a standard-library import, a loop
/// with a function call (tier-up of the interpreter's hot paths), an error with a traceback.
/// The loop is short: 20 iterations a call enter its per-iteration functions ~16,000 times over
/// the warm-up (the optimizing tier needs ~3,300), and longer loops only cost warm-up time.
const WARM_UP_CODE: [&str; 5] = [
    "1 + 1",
    "print('warm')",
    "import json, re\njson.dumps({'a': re.sub('a', 'b', 'aaa')})",
    "def f(n):\n    return sum(i * i for i in range(n))\nf(20)",
    "undefined_name",
];

/// Runs [`WARM_UP_CALLS`] and then [`TIER_UP_CALLS`] calls in the zygote through the same
/// runner functions a real call uses (their output goes nowhere: no run is in progress for the
/// front).
fn warm_up(engine: &mut Engine, runner: &Runner) -> Result<()> {
    for i in 0..WARM_UP_CALLS {
        let code = WARM_UP_CODE[i % WARM_UP_CODE.len()];
        call(
            engine,
            &runner.find_imports,
            BOOT_CALL,
            &[Arg::Str(code)],
            None,
        )
        .context("warming up the zygote")?;
        zygote_run(engine, runner, code).context("warming up the zygote")?;
    }
    for i in 0..TIER_UP_CALLS {
        let code = WARM_UP_CODE[i % WARM_UP_CODE.len()];
        zygote_run(engine, runner, code).context("warming up the zygote")?;
    }
    zygote_run(engine, runner, FREEZE_CODE).context("freezing the zygote's objects")?;
    // The zygote's random state is every child's: each reseeds in its first run.
    let answer = call(engine, &runner.reseed, BOOT_CALL, &[], None)
        .context("preparing the reseed of forked interpreters")?;
    parse_answer::<Empty>(&answer).context("preparing the reseed of forked interpreters")?;
    engine.collect_garbage();
    Ok(())
}

/// Records, as the zygote's last steps before it forks, what it holds outside linear memory
/// (`js/runner.js` `baseline`) and a copy of its linear memory ([`Pristine`]): every child's
/// checkpoints are measured against both.
///
/// Errors: the runner fails, or the copy cannot be mapped.
fn keep_pristine(engine: &mut Engine, runner: &Runner) -> Result<()> {
    let answer = call(engine, &runner.baseline, BOOT_CALL, &[], None)
        .context("recording the zygote's baseline")?;
    parse_answer::<Empty>(&answer).context("recording the zygote's baseline")?;
    let started = Instant::now();
    let id = engine.with_bytes(&runner.memory, |memory| Pristine::keep(memory))??;
    tracing::debug!(
        "zygote {id}: pristine memory kept in {} ms",
        started.elapsed().as_millis()
    );
    Ok(())
}

/// The zygote's last call: every object alive now moves to the garbage collector's permanent
/// generation, which it never scans again (`gc.freeze`, meant for pre-fork servers), so that a
/// forked worker's collections do not write to (and copy) every page of the zygote's heap.
const FREEZE_CODE: &str = "import gc\ngc.collect()\ngc.freeze()";

/// Runs `code` in the zygote through the runner's `run`, as a call would, with fresh globals and
/// the warm-up caps; its output goes nowhere (no run is in progress for the front).
fn zygote_run(engine: &mut Engine, runner: &Runner, code: &str) -> Result<()> {
    let run = RunArgs {
        code,
        globals: "{}",
        output_cap: WARM_UP_CAP,
        result_cap: WARM_UP_CAP,
        keep_globals: false,
        tools: None,
    };
    let answer = call(engine, &runner.run, BOOT_CALL, &run.args(), None)?;
    parse_answer::<RunOutcome>(&answer)?;
    Ok(())
}

/// The code of [`Request::WarmUp`]: a value to format, as most calls return one.
const WARM_UP_AFTER_RESTORE: &str = "0";

/// Output and result caps of a warm-up call (bytes).
const WARM_UP_CAP: usize = 1 << 10;

/// What a worker tells the front once booted ([`Reply::Ready`]), but its confinement.
struct BootReport {
    /// Pyodide's version.
    version: String,
    /// How long the boot took (milliseconds; for a forked worker, the fork).
    boot_ms: u64,
    /// Whether the interpreter was restored from a memory snapshot (or forked from one).
    restored: bool,
    /// The memory snapshot the boot made, if any (sent as attachment 0).
    made: Option<Vec<u8>>,
    /// Why `--deps` did not install as it booted, if they did not.
    install_error: Option<String>,
}

impl BootReport {
    /// Sends [`Reply::Ready`] with this report and the confinement as `confined` has it
    /// (`all_on`: whether every layer is on, as far as the front is told).
    ///
    /// Errors: [`SendError`].
    fn send(self, confined: &super::confine::Status, all_on: bool) -> Result<(), SendError> {
        send_with(
            &Reply::Ready {
                pyodide_version: self.version,
                boot_ms: self.boot_ms,
                restored: self.restored,
                confinement: super::confine::describe(confined),
                confined: all_on,
                install_error: self.install_error,
            },
            &self.made.as_deref().into_iter().collect::<Vec<_>>(),
        )
    }
}

/// Seals the worker (seccomp, limits) and tells the front it is ready, with the memory
/// snapshot it made, if any. Ready only once sealed: the front hands out no worker that is not
/// yet confined.
fn send_ready(report: BootReport, confined: super::confine::Status) -> Result<()> {
    // The second wall, part two: seccomp and limits on every thread before the first call.
    let confined = super::confine::seal(confined)?;
    let all_on = confined.all_on();
    Ok(report.send(&confined, all_on)?)
}

/// What the worker's JavaScript asks of its host with `__mcpHostCall(json, bytes)`: one typed
/// message per kind (`js/runner.js`, `js/fetch.js`), parsed here once.
#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
enum HostRequest {
    /// The memory snapshot Pyodide just made (the bytes); only while booting.
    Snapshot,
    /// The bytes of a file the runner read for the front (an image of a run, or a resource).
    File,
    /// User code's HTTP request (the body is the bytes): the front performs or refuses it.
    Fetch { request: FetchRequest },
    /// User code's call of an upstream MCP tool (code mode): the front makes it.
    Tool { call: ToolCall },
    /// User code's call of a host function (code mode): the front forwards it to the launcher.
    Function { call: FunctionCall },
}

/// The worker's standard input, where the front's requests arrive.
type FrontInput = BufReader<io::StdinLock<'static>>;

/// The host side of the worker once booted: the state its host calls reach.
struct Host {
    /// The front's requests (a host call that asks the front reads its answer here).
    input: Rc<RefCell<FrontInput>>,
    /// The run in progress, if any.
    running: Rc<RefCell<Running>>,
    /// The bytes of a file the runner just read.
    file_in: Rc<RefCell<Option<Vec<u8>>>>,
}

impl Host {
    /// Answers one host call: `(json, bytes)` back to JavaScript, or the error it throws.
    fn answer(&self, json: &str, bytes: Vec<u8>) -> Result<(String, Vec<u8>), HostCallError> {
        match serde_json::from_str::<HostRequest>(json).map_err(HostCallError::Malformed)? {
            HostRequest::File => {
                // Only the runner's closure holds the host call (fetch.js took it off the global).
                *self.file_in.borrow_mut() = Some(bytes);
                Ok(("{}".to_owned(), Vec::new()))
            }
            HostRequest::Snapshot => Err(HostCallError::SnapshotAfterBoot),
            HostRequest::Fetch { request } => self.fetch(request, &bytes),
            HostRequest::Tool { call } => {
                let id = self.running_call("MCP tool calls")?;
                self.ask_tool(Reply::ToolCall { id, call }, id)
            }
            HostRequest::Function { call } => {
                let id = self.running_call("host functions")?;
                self.ask_tool(Reply::FunctionCall { id, call }, id)
            }
        }
    }

    /// Hands user code's HTTP request (`request`, its body `bytes`) to the front, which
    /// performs or refuses it: the response's JSON and its body (none for a refusal).
    fn fetch(
        &self,
        request: FetchRequest,
        bytes: &[u8],
    ) -> Result<(String, Vec<u8>), HostCallError> {
        let id = self.running_call("network requests")?;
        let reply = Reply::Fetch { id, request };
        match self.ask_front(&reply, &[bytes])? {
            Frame {
                header: Request::FetchResult { id: got, response },
                attachments,
            } if got == id => {
                let json = serde_json::to_string(&response).map_err(HostCallError::Encode)?;
                let body = match response {
                    FetchResponse::Error { .. } => Vec::new(),
                    _ => attachments.into_iter().next().unwrap_or_default(),
                };
                Ok((json, body))
            }
            _ => Err(HostCallError::Unanswered { kind: reply.kind() }),
        }
    }

    /// Sends a tool or function call of run `id` to the front: the answer's JSON and its
    /// images' bytes, one after another.
    fn ask_tool(&self, reply: Reply, id: CallId) -> Result<(String, Vec<u8>), HostCallError> {
        match self.ask_front(&reply, &[])? {
            Frame {
                header: Request::ToolResult { id: got, answer },
                attachments,
            } if got == id => {
                let json = serde_json::to_string(&answer).map_err(HostCallError::Encode)?;
                Ok((json, attachments.concat()))
            }
            _ => Err(HostCallError::Unanswered { kind: reply.kind() }),
        }
    }

    /// The call id of the run in progress; `what` (plural) is only available while code runs.
    fn running_call(&self, what: &'static str) -> Result<CallId, HostCallError> {
        self.running
            .borrow()
            .id
            .ok_or(HostCallError::NotRunning { what })
    }

    /// Sends `reply` to the front and reads its answer (the run waits meanwhile).
    fn ask_front(
        &self,
        reply: &Reply,
        attachments: &[&[u8]],
    ) -> Result<Frame<Request>, HostCallError> {
        send_with(reply, attachments).map_err(HostCallError::Send)?;
        match read_frame::<Request>(&mut *self.input.borrow_mut(), FrameLimits::REQUEST) {
            Ok(Some(frame)) => Ok(frame),
            Ok(None) => Err(HostCallError::InputClosed),
            Err(e) => Err(HostCallError::Read(e)),
        }
    }
}

/// What the boot frame asks: how to boot, the snapshot to restore, the `--mount` files with
/// their bytes, and the `--deps` to install with their files' bytes.
struct BootPlan {
    mode: SnapshotMode,
    snapshot: Option<MappedFile>,
    mount: (MountPlan, Vec<u8>),
    install: Option<(BootInstall, Vec<Vec<u8>>)>,
}

/// Reads the boot frame; `None` when the front closed the input first. Its attachments are
/// the mount's bytes (one, when `mount` is not empty), then one per install file.
fn read_boot(input: &mut impl io::Read) -> Result<Option<BootPlan>> {
    let Some(frame) = read_frame::<Request>(input, FrameLimits::REQUEST)? else {
        return Ok(None);
    };
    let Request::Boot {
        snapshot: mode,
        mount,
        install,
    } = frame.header
    else {
        bail!("the first request must be `boot`");
    };
    let snapshot = match mode {
        SnapshotMode::Load => Some(map_snapshot()?),
        SnapshotMode::None | SnapshotMode::Make => None,
    };
    let install_files = install.as_ref().map_or(0, |i| i.files.len());
    let layout = BootAttachments::from_frame(frame.attachments, !mount.is_empty(), install_files)?;
    let bytes = layout.mount.unwrap_or_default();
    if !mount.fits(&bytes) {
        bail!("the mounted files do not match their bytes");
    }
    let install = install.map(|install| (install, layout.install));
    Ok(Some(BootPlan {
        mode,
        snapshot,
        mount: (mount, bytes),
        install,
    }))
}

/// The worker's life: reads the boot frame, confines itself, boots Pyodide, and serves the
/// front's requests until stdin closes; a zygote forks workers instead, and each forked
/// child goes on serving.
///
/// Errors: the boot frame is not one, a confinement layer fails (`--confinement strict`), Pyodide
/// does not boot, or the front breaks the protocol.
fn serve() -> Result<()> {
    let control = super::fork_server::control_socket()?;
    // The zygote counts its threads before each fork; the file is opened before Landlock.
    let proc_status = match control {
        Some(_) => {
            Some(std::fs::File::open("/proc/self/status").context("opening /proc/self/status")?)
        }
        None => None,
    };
    if control.is_some() {
        // Before the engine exists: its helper threads are made with it.
        crate::engine::configure_zygote();
    }
    let input = Rc::new(RefCell::new(BufReader::new(io::stdin().lock())));
    let Some(plan) = read_boot(&mut *input.borrow_mut())? else {
        return Ok(());
    };
    // The second wall, part one: Landlock before the engine starts any thread (confine.rs).
    let domain = match control {
        Some(_) => super::confine::Domain::Zygote,
        None => super::confine::Domain::Worker,
    };
    let confined = super::confine::enter(super::confine::Mode::from_args()?, domain)?;
    let started = Instant::now();
    let (mut engine, runner, version, made) = boot(plan.mode, plan.snapshot)?;
    mount_files(&mut engine, &runner, plan.mount)?;
    let boot_ms = started.elapsed().as_millis() as u64;
    let host = attach_host(&mut engine, input.clone())?;
    let install_error = plan.install.and_then(|(install, files)| {
        let failed = preinstall(&mut engine, &runner, install, files).err()?;
        Some(format!("{failed:#}"))
    });
    let report = BootReport {
        version,
        boot_ms,
        restored: plan.mode == SnapshotMode::Load,
        made,
        install_error,
    };
    let (forked, dirty) = match (control, proc_status) {
        (Some(control), Some(proc_status)) => {
            let zygote = Zygote {
                control,
                proc_status,
                input: &input,
            };
            match zygote.fork_interpreters(&mut engine, &runner, report, confined)? {
                Forked::ZygoteDone => return Ok(()),
                Forked::Child(dirty) => (true, dirty),
            }
        }
        _ => {
            send_ready(report, confined)?;
            (false, None)
        }
    };
    #[cfg(feature = "escape-test")]
    super::confine::escape_test_if_requested();
    let worker = Serving {
        engine,
        runner,
        host,
        shadow: None,
        dirty,
    };
    serve_requests(worker, &input, forked)
}

/// Gives the booted engine its host: output lines of a run stream to the front as they are
/// written, `fetch.js` is installed, and host calls go to [`Host::answer`].
///
/// Errors: `js/fetch.js` fails.
fn attach_host(engine: &mut Engine, input: Rc<RefCell<FrontInput>>) -> Result<Rc<Host>> {
    let host = Rc::new(Host {
        input,
        running: Rc::default(),
        file_in: Rc::default(),
    });
    let sink = host.clone();
    engine.set_emit_sink(Box::new(move |text: &str| {
        forward_output(&sink.running.borrow(), text)
    }));
    engine.eval(FETCH_JS, "mcp:fetch.js")?;
    let calls = host.clone();
    engine.set_call_handler(Box::new(move |json: &str, bytes: Vec<u8>| {
        calls.answer(json, bytes).map_err(CallError::from)
    }));
    Ok(host)
}

/// Where [`Zygote::fork_interpreters`] returns.
enum Forked {
    /// In the zygote, done forking: it ends.
    ZygoteDone,
    /// In a forked child, confined and ready, with the kernel's record of the pages it
    /// writes where the kernel keeps one (`dirty_pages.rs`).
    Child(Option<DirtyPages>),
}

/// A worker started as the zygote ([`super::fork_server`]), once booted.
struct Zygote<'a> {
    /// The control socket the front asks for forks on.
    control: OwnedFd,
    /// `/proc/self/status`, opened before Landlock: the zygote counts its threads there.
    proc_status: std::fs::File,
    /// The front's requests: none may be left unread when the zygote forks.
    input: &'a RefCell<FrontInput>,
}

impl Zygote<'_> {
    /// Warms up, says it booted (`report`; its confinement, `confined`, is not sealed: the
    /// zygote runs no user code), then forks workers until the front is done. Returns
    /// [`Forked::ZygoteDone`] in the zygote when done, and [`Forked::Child`] in each forked
    /// child, which has confined itself and said it is ready; only the children go on, each
    /// with its own stdin, stdout and stderr.
    ///
    /// Errors: the warm-up fails, unread input is left, or the fork server fails.
    fn fork_interpreters(
        self,
        engine: &mut Engine,
        runner: &Runner,
        report: BootReport,
        confined: super::confine::Status,
    ) -> Result<Forked> {
        warm_up(engine, runner)?;
        keep_pristine(engine, runner)?;
        let version = report.version.clone();
        report.send(&confined, false)?;
        super::fork_server::check_drained(self.input.borrow().buffer().len())?;
        let Some(forked) = super::fork_server::serve(self.control, &self.proc_status)? else {
            return Ok(Forked::ZygoteDone);
        };
        drop(self.proc_status);
        // The page map is a file: opened before this child's own Landlock domain.
        let opened = DirtyPages::open();
        let mut confined = super::confine::enter_forked(confined)?;
        let dirty = track_writes(engine, runner, opened);
        if let Some(dirty) = &dirty {
            confined.allow_tracking(dirty.descriptors());
        }
        let child = BootReport {
            version,
            boot_ms: forked.requested.elapsed().as_millis() as u64,
            restored: true,
            made: None,
            install_error: None,
        };
        send_ready(child, confined)?;
        Ok(Forked::Child(dirty))
    }
}

/// Protects a forked child's linear memory so that the kernel records the pages it writes,
/// before anything has written them: `None` (checkpoints then compare the whole memory) when
/// the kernel cannot (`opened`'s error, or the arming's).
fn track_writes(
    engine: &mut Engine,
    runner: &Runner,
    opened: Result<dirty_pages::Opened, dirty_pages::TrackingError>,
) -> Option<DirtyPages> {
    let armed = opened.and_then(|opened| {
        engine
            .with_bytes(&runner.memory, |memory| DirtyPages::arm(opened, memory))
            .map_err(dirty_pages::TrackingError::Memory)?
    });
    armed
        .map_err(|e| tracing::debug!("checkpoints compare the whole memory: {e}"))
        .ok()
}

/// Serves the front's requests until it closes the input or the code ends the interpreter.
/// `forked`: a worker forked by the zygote, whose allocator's scavenger stays suspended
/// until its first run is over.
///
/// Errors: the front breaks the protocol, or the pipes fail.
fn serve_requests(mut worker: Serving, input: &RefCell<FrontInput>, forked: bool) -> Result<()> {
    let mut scavenger = if forked {
        Scavenger::Suspended
    } else {
        Scavenger::Running
    };
    loop {
        let Some(frame) = read_frame::<Request>(&mut *input.borrow_mut(), FrameLimits::REQUEST)?
        else {
            return Ok(());
        };
        let step = match &frame.header {
            Request::Run {
                checkpoint_follows, ..
            } => Step::Ran {
                checkpoint_follows: *checkpoint_follows,
            },
            Request::Checkpoint { .. } => Step::Checkpointed,
            _ => Step::Other,
        };
        match worker.serve(frame)? {
            Served::Ended => return Ok(()),
            Served::Answered | Served::Ran => scavenger.after(step),
        }
    }
}

/// A forked worker's allocator scavenger (`fork_server::resume_scavenger`): suspended in the
/// zygote, it resumes once the child's first call is over. Not at once after that call's run
/// when the front takes a checkpoint next: the scavenger's first pass, on the other core,
/// slowed that checkpoint, and so the call's answer, by 1–3 ms on a 2-core machine.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scavenger {
    /// Suspended since the fork, before the first run.
    Suspended,
    /// Suspended until the checkpoint that follows the first run.
    UntilCheckpoint,
    /// Running.
    Running,
}

/// A served request, as [`Scavenger::after`] tells them apart.
#[derive(Clone, Copy)]
enum Step {
    /// A run; `checkpoint_follows` as the front said.
    Ran { checkpoint_follows: bool },
    /// A checkpoint.
    Checkpointed,
    /// Anything else.
    Other,
}

impl Scavenger {
    /// After `step` was served.
    fn after(&mut self, step: Step) {
        let next = match (*self, step) {
            (Scavenger::Running, _) => return,
            (
                Scavenger::Suspended,
                Step::Ran {
                    checkpoint_follows: true,
                },
            ) => Scavenger::UntilCheckpoint,
            (Scavenger::Suspended, Step::Ran { .. })
            | (Scavenger::UntilCheckpoint, Step::Checkpointed | Step::Ran { .. }) => {
                super::fork_server::resume_scavenger();
                Scavenger::Running
            }
            (state, _) => state,
        };
        *self = next;
    }
}

/// How a request was served.
enum Served {
    /// Answered; the worker goes on.
    Answered,
    /// A run answered; the worker goes on.
    Ran,
    /// The code ended the interpreter; its result was sent and the worker ends.
    Ended,
}

/// A booted worker serving the front's requests.
struct Serving {
    engine: Engine,
    runner: Runner,
    host: Rc<Host>,
    /// Forked interpreters: what linear memory held at the last checkpoint (made at the
    /// first checkpoint or restore).
    shadow: Option<Shadow>,
    /// Forked interpreters where the kernel can say which pages were written since the last
    /// checkpoint; dropped (so that checkpoints compare every page) at its first error.
    dirty: Option<DirtyPages>,
}

impl Serving {
    /// Serves one request of the front, sending its answer.
    fn serve(&mut self, frame: Frame<Request>) -> Result<Served> {
        let reply = match frame.header {
            Request::FetchResult { .. } | Request::ToolResult { .. } | Request::Boot { .. } => {
                bail!("the front sent a request out of order")
            }
            Request::Ping { id } => Reply::Pong { id },
            Request::FindImports { id, code } => Reply::Imports {
                id,
                names: self.find_imports(id, &code),
            },
            Request::ReadFile { id, path, cap } => {
                match read_file(
                    &mut self.engine,
                    &self.runner,
                    &self.host.file_in,
                    id,
                    &path,
                    cap,
                ) {
                    Ok(bytes) => {
                        send_with(&Reply::File { id, error: None }, &[&bytes])?;
                        return Ok(Served::Answered);
                    }
                    Err(error) => Reply::File {
                        id,
                        error: Some(error.to_string()),
                    },
                }
            }
            Request::WriteFile { id, path, delete } => {
                let bytes = frame.attachments.into_iter().next();
                let error = self.write_file(id, &path, delete, bytes);
                Reply::File { id, error }
            }
            Request::Install { id, files, items } => {
                // A call imports what it needs itself.
                let installed = install_packages(
                    &mut self.engine,
                    &self.runner,
                    id,
                    &files,
                    frame.attachments,
                    &items,
                    &[],
                    None,
                );
                let error = installed.err().map(|e| e.to_string());
                Reply::Installed { id, error }
            }
            Request::Checkpoint { id } => return self.checkpoint(id),
            Request::Reseed { id } => Reply::Reseeded {
                id,
                error: self.reseed(id),
            },
            Request::WarmUp { id: call } => Reply::WarmedUp {
                id: call,
                error: zygote_run(&mut self.engine, &self.runner, WARM_UP_AFTER_RESTORE)
                    .err()
                    .map(|e| format!("{e:#}")),
            },
            Request::Restore {
                id,
                zygote,
                memory_bytes,
                reseed,
            } => Reply::Restored {
                id,
                error: self.restore(id, zygote, memory_bytes, reseed, frame.attachments),
            },
            Request::Run {
                id,
                code,
                globals,
                output_cap,
                result_cap,
                keep_globals,
                image_cap,
                tools,
                checkpoint_follows: _,
            } => {
                let run = RunArgs {
                    code: &code,
                    globals: &serde_json::to_string(&globals)?,
                    output_cap,
                    result_cap,
                    keep_globals,
                    tools: tools.map(|t| t.to_string()),
                };
                return self.run(id, run, image_cap);
            }
        };
        send(&reply)?;
        Ok(Served::Answered)
    }

    /// The code's top-level imports that are packages. A scanner that fails (user code may
    /// have broken its own interpreter's modules) finds nothing; the code then runs without
    /// installs.
    fn find_imports(&mut self, id: CallId, code: &str) -> Vec<String> {
        call(
            &mut self.engine,
            &self.runner.find_imports,
            id,
            &[Arg::Str(code)],
            None,
        )
        .ok()
        .and_then(|text| parse_answer::<Vec<String>>(&text).ok())
        .unwrap_or_default()
    }

    /// Writes `bytes` to `path` under the working directory, or removes it with `delete`;
    /// `Some(why)` when it could not.
    fn write_file(
        &mut self,
        id: CallId,
        path: &str,
        delete: bool,
        bytes: Option<Vec<u8>>,
    ) -> Option<String> {
        if let Some(bytes) = bytes {
            self.engine.add_file(UPLOAD_PATH, bytes);
        }
        let args = [Arg::Str(path), Arg::Bool(delete)];
        let answered = call(&mut self.engine, &self.runner.write_file, id, &args, None);
        self.engine.clear_files();
        match answered {
            Ok(text) => parse_answer::<Empty>(&text).err().map(|e| e.to_string()),
            Err(e) => Some(e.to_string()),
        }
    }

    /// Runs code for call `id` and sends its result with the images it made (at most
    /// `image_cap` bytes each).
    fn run(&mut self, id: CallId, run: RunArgs<'_>, image_cap: usize) -> Result<Served> {
        *self.host.running.borrow_mut() = Running {
            id: Some(id),
            output_cap: run.output_cap,
        };
        let answer = call(&mut self.engine, &self.runner.run, id, &run.args(), None);
        self.host.running.borrow_mut().id = None;
        let mut outcome = match answer {
            Ok(text) => parse_answer::<RunOutcome>(&text).unwrap_or_else(failed_outcome),
            Err(e) => engine_outcome(&e),
        };
        if outcome.fatal {
            // The code ended the runtime (os._exit, os.abort, a fatal runtime error): report
            // it as the call's result, then stop; the front starts a new worker.
            send(&Reply::Ran { id, outcome })?;
            return Ok(Served::Ended);
        }
        let images = read_images(
            &mut self.engine,
            &self.runner,
            &self.host.file_in,
            id,
            &mut outcome,
            image_cap,
        );
        let attachments: Vec<&[u8]> = images.iter().map(Vec::as_slice).collect();
        send_with(&Reply::Ran { id, outcome }, &attachments)?;
        Ok(Served::Ran)
    }
}

/// The runner's `run` arguments (`js/runner.js`), in one place for a call and the zygote's
/// warm-up.
struct RunArgs<'a> {
    code: &'a str,
    /// The globals, as a JSON object's text.
    globals: &'a str,
    output_cap: usize,
    result_cap: usize,
    keep_globals: bool,
    /// Code mode: the tool catalog as JSON text, when it changed.
    tools: Option<String>,
}

impl RunArgs<'_> {
    fn args(&self) -> [Arg<'_>; 6] {
        [
            Arg::Str(self.code),
            Arg::Str(self.globals),
            Arg::Num(self.output_cap as f64),
            Arg::Num(self.result_cap as f64),
            Arg::Bool(self.keep_globals),
            self.tools.as_deref().map_or(Arg::Null, Arg::Str),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `js/bootstrap.js` grows WebAssembly tables with room ahead while Pyodide boots:
    /// JavaScript must still see exactly the indexes, lengths and bounds a plain table has (a
    /// memory snapshot holds the indexes Emscripten handed out), until the room is ended.
    #[test]
    fn tables_grown_with_room_look_exactly_grown() {
        let mut engine = Engine::new().expect("an engine");
        engine
            .eval(BOOTSTRAP_JS, "mcp:bootstrap.js")
            .expect("bootstrap");
        let checks = r#"
            const bytes = new Uint8Array([0,97,115,109,1,0,0,0,1,4,1,96,0,0,3,2,1,0,7,5,1,1,102,0,0,10,4,1,2,0,11]);
            const f = new WebAssembly.Instance(new WebAssembly.Module(bytes)).exports.f;
            const rangeError = (thunk) => { try { thunk(); return false; } catch (e) { return e instanceof RangeError; } };
            const t = new WebAssembly.Table({ initial: 3, element: "anyfunc" });
            const out = [];
            for (let i = 0; i < 5; i++) out.push(t.grow(1));
            out.push(t.length, rangeError(() => t.get(8)), rangeError(() => t.set(8, f)), t.get(7));
            t.set(7, f);
            out.push(t.get(7) === f, t.grow(2, f), t.length, t.get(9) === f, t.get(10 - 1) === f);
            const capped = new WebAssembly.Table({ initial: 2, maximum: 3, element: "anyfunc" });
            out.push(capped.grow(1), rangeError(() => capped.grow(1)), capped.length);
            // Once the boot is done the plain methods are back and the room is plain entries.
            globalThis.__mcpHost.endTableRoom();
            const native = ["grow", "get", "set"].every((m) => String(WebAssembly.Table.prototype[m]).includes("[native code]"));
            out.push(native, t.length, t.grow(1), t.get(11));
            JSON.stringify(out)
        "#;
        let got = engine.eval(checks, "mcp:test.js").expect("the checks");
        assert_eq!(
            got,
            "[3,4,5,6,7,8,true,true,null,true,8,10,true,true,2,true,3,true,12,12,null]"
        );
    }

    #[test]
    fn a_failed_send_is_worded_as_its_whole_chain() {
        let failed = || FrameError::Io(io::Error::other("broken"));
        let typed = HostCallError::Send(SendError(failed())).to_string();
        let chained = format!(
            "{:#}",
            anyhow::Error::new(failed()).context("writing to the front")
        );
        assert_eq!(typed, chained);
        assert_eq!(typed, "writing to the front: the pipe failed: broken");
    }

    #[test]
    fn cut_keeps_characters_whole() {
        let mut s = "aé".to_owned();
        cut(&mut s, 2);
        assert_eq!(s, "a");
    }

    #[test]
    fn runner_failures_are_typed() {
        let o = parse_answer::<RunOutcome>(r#"{"failed":{"ended":{"exit":3}}}"#).unwrap_err();
        let o = failed_outcome(o);
        assert!(o.fatal);
        assert!(o.error.unwrap().contains("exit(3)"));
        let o =
            parse_answer::<RunOutcome>(r#"{"failed":{"ended":"abort","error":"x"}}"#).unwrap_err();
        assert!(failed_outcome(o).fatal);
        let o = parse_answer::<RunOutcome>(r#"{"failed":{"error":"TypeError: x"}}"#).unwrap_err();
        assert!(!failed_outcome(o).fatal);
        // A result of the wrong shape is not read as a failure, nor the other way round.
        assert!(matches!(
            parse_answer::<RunOutcome>(r#"{"ok":{"error":"x"}}"#),
            Err(OperationError::Shape(_))
        ));
        assert!(matches!(
            parse_answer::<RunOutcome>(r#"{"error":"x"}"#),
            Err(OperationError::Shape(_))
        ));
    }
}
