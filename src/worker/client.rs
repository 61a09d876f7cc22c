//! The front's handle on one sandbox worker process.
//!
//! The worker is treated as hostile (docs/architecture.md §3): every read has a deadline, every frame is read
//! under limits chosen for the phase, every reply must carry the id of the request it answers,
//! and output is counted against the call's cap as it arrives. Any breach ends the worker.

use super::mount::Mounts;
use super::process::{Ended, Process};
use crate::protocol::fetch::{FetchRequest, FetchResponse};
use crate::protocol::launch::{SNAPSHOT_FD_ARG, WORKER_COMMAND};
use crate::protocol::pages::{max_encoded_bytes, Pages, ZygoteId};
use crate::protocol::{
    read_frame_async, write_frame_parts_async, BootAttachments, BootInstall, CallId,
    CheckpointOutcome, Frame, FrameError, FrameLimits, FunctionCall, OutputLine, Reply, Request,
    RunNetwork, RunOutcome, SnapshotMode, Stream, ToolAnswer, ToolCall, Uncapturable, MAX_IMAGES,
    MAX_LISTED_FILES, MAX_SNAPSHOT_BYTES, OUTPUT_SLACK,
};
use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, BufReader};
use tokio::process::Command;
use tokio::time::Instant;

/// How long a worker may take to boot Pyodide (seconds); a debug build on a busy machine
/// is the slow case.
pub const BOOT_TIMEOUT: Duration = Duration::from_secs(240);

/// How much larger than the text it carries a JSON header may be: `\u00XX` escapes of
/// control characters take 6 bytes for 1, and an astral character escaped as a surrogate
/// pair 12 bytes for 4.
const JSON_ESCAPE_FACTOR: usize = 12;

/// Room in a run frame beyond its caps, for the JSON around them and a traceback (bytes).
const RUN_FRAME_OVERHEAD: usize = 1 << 20;

/// Most bytes of one worker's stderr that reach the server's debug log, and the longest line.
const WORKER_LOG_MAX: usize = 64 << 10;
const WORKER_LOG_LINE_MAX: u64 = 1 << 10;

/// The phase of a call in which a worker failed to answer in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    HealthCheck,
    Scanning,
    Installing,
    Running,
    Reading,
    Writing,
    Checkpointing,
    Restoring,
    WarmingUp,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::HealthCheck => "answering a health check",
            Phase::Scanning => "scanning the code's imports",
            Phase::Installing => "installing packages",
            Phase::Running => "running the code",
            Phase::Reading => "reading a file",
            Phase::Writing => "writing or removing a file",
            Phase::Checkpointing => "taking a checkpoint of its state",
            Phase::Restoring => "restoring a checkpoint",
            Phase::WarmingUp => "running its warm-up call",
        })
    }
}

/// Why talking to a worker failed. After any of these the worker is discarded.
#[derive(Debug, Error)]
pub enum WorkerError {
    #[error("could not start the sandbox worker: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("the sandbox worker failed to boot its interpreter: {0}")]
    Boot(#[source] BootFailure),
    #[error("the sandbox worker did not boot within {0} s")]
    BootTimeout(u64),
    #[error("the sandbox worker stopped unexpectedly{0}")]
    Died(#[source] Exit),
    #[error("the sandbox worker was stopped from outside while booting{0}")]
    Stopped(#[source] Exit),
    #[error("the sandbox broke its protocol ({0}); its interpreter was stopped")]
    Protocol(#[source] Violation),
    #[error("the sandbox worker did not finish {phase} within {} s", seconds.as_secs_f64())]
    Deadline { phase: Phase, seconds: Duration },
    #[error("the code wrote more than {limit} bytes of output (the output cap plus {OUTPUT_SLACK} bytes) and its interpreter was stopped")]
    OutputFlood { limit: usize },
    #[error("the server is shutting down")]
    Closed,
    /// `--confinement strict` and a layer is off; the text names it and says why.
    #[error("the sandbox worker refused to serve: {0}")]
    Unconfined(String),
    /// A warm-up call failed in its interpreter (the interpreter's words).
    #[error("the sandbox worker's warm-up call failed: {0}")]
    WarmUp(String),
    /// No worker of the sandbox's runtime can be had on this server (the executor's
    /// `RuntimeUnavailable`, whose words say which runtime and why).
    #[error("{0}")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl WorkerError {
    /// Whether the interpreter failed by itself as it booted (an engine trap, a crash, a
    /// fatal error while restoring the snapshot or installing `--deps`): before any user code
    /// ran, so another interpreter may well boot. Not a stop from outside, a shutdown, a
    /// refusal of confinement or a missing executable, which another boot would meet again.
    pub fn failed_as_it_booted(&self) -> bool {
        matches!(self, WorkerError::Boot(_))
    }
}

/// Why a file under an interpreter's working directory could not be read, written or removed
/// ([`Worker::read_file`], [`Worker::write_file`]).
#[derive(Debug, Error)]
pub enum FileError {
    /// The worker could not: its own words (no such file, too large, a directory, no memory
    /// left, a folder in the way). The worker goes on serving.
    #[error("{reason}")]
    Refused { reason: String },
    /// Talking to the worker failed; it must be discarded.
    #[error(transparent)]
    Worker(#[from] WorkerError),
}

/// How the front saw a worker end. Each wording starts with its own separator, so that it
/// follows "stopped unexpectedly" as a clause (or says nothing when nothing is known).
#[derive(Debug, Error)]
pub enum Exit {
    /// Its exit status (the front's own child).
    #[error(" ({0})")]
    Status(std::process::ExitStatus),
    /// The pipe to or from it failed before an exit status could be had.
    #[error(": {0}")]
    Pipe(#[source] FrameError),
    /// It reported a fatal error as it ended: its own words.
    #[error(": {0}")]
    Fatal(String),
    /// It ended; only its parent knows how (a forked worker, reaped by the zygote).
    #[error("")]
    Unknown,
}

/// Why a worker did not boot.
#[derive(Debug, Error)]
pub enum BootFailure {
    /// It said why: its own words (the engine's or Pyodide's error).
    #[error("{0}")]
    Reported(String),
    /// It ended before it was ready.
    #[error("the worker exited{0}")]
    Exited(#[source] Exit),
}

/// A message from a worker that breaks the protocol (the worker is then killed).
#[derive(Debug, Error)]
pub enum Violation {
    #[error("worker pipes missing")]
    NoPipes,
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("a `{0}` message while booting")]
    WhileBooting(&'static str),
    #[error("a `{kind}` message for call {got} while call {awaited} was awaited")]
    OtherCall {
        kind: &'static str,
        got: String,
        awaited: CallId,
    },
    #[error("an unexpected `{0}` message")]
    Unexpected(&'static str),
    #[error("a file answer without its bytes")]
    FileWithoutBytes,
    #[error("an answer with {images} images for {names} names (at most {MAX_IMAGES} of {cap} bytes each)")]
    Images {
        images: usize,
        names: usize,
        cap: usize,
    },
    #[error("an answer that lists {0} files (at most {MAX_LISTED_FILES})")]
    TooManyFiles(usize),
    #[error("a checkpoint whose pages do not match what it declares")]
    Checkpoint,
}

/// What a checkpoint request found ([`Worker::checkpoint_taken`]).
#[derive(Debug)]
pub enum Checkpointed {
    /// The pages that changed since the last checkpoint, measured against zygote `.0`.
    Taken(ZygoteId, Pages),
    /// Why the state cannot be captured (at least one reason).
    Uncapturable(Vec<Uncapturable>),
}

/// The pages of a `taken` checkpoint reply, checked against what it declares.
fn taken_pages(
    zygote: ZygoteId,
    memory_bytes: u64,
    pages: u32,
    attachments: Vec<Vec<u8>>,
) -> Result<Checkpointed, Violation> {
    let mut parts = attachments.into_iter();
    let (Some(indexes), Some(bytes), None) = (parts.next(), parts.next(), parts.next()) else {
        return Err(Violation::Checkpoint);
    };
    if indexes.len() != pages as usize * 4 {
        return Err(Violation::Checkpoint);
    }
    let pages =
        Pages::from_parts(memory_bytes, &indexes, bytes).map_err(|_| Violation::Checkpoint)?;
    Ok(Checkpointed::Taken(zygote, pages))
}

/// What one `run` asks of a worker, and the caps it runs under.
pub struct RunRequest<'a> {
    pub code: &'a str,
    pub globals: &'a serde_json::Map<String, serde_json::Value>,
    /// Most output bytes kept (`--output-cap`).
    pub output_cap: usize,
    /// Longest return value text, in bytes (`--result-cap`).
    pub result_cap: usize,
    /// Run in the globals earlier calls left (`--stateful`).
    pub keep_globals: bool,
    /// Largest image (bytes) handed back from the run (`--max-image-bytes` with
    /// `--stateful`); 0 for none.
    pub image_cap: usize,
    /// A checkpoint is taken once the run ends (`Request::Run`'s `checkpoint_follows`).
    pub checkpoint_follows: bool,
}

/// The host side of one run: what the code asks of the process that serves it while it runs
/// (its fetches; in code mode, its upstream tool calls, its host function calls and
/// the tool catalog its interpreter builds `mcp_tools` from). [`Worker::run`] forwards each such
/// request of the worker here, under the run's deadline, and sends the answer back.
///
/// The front implements it for each call (its `--allow-net` policy, the upstream servers and
/// the call's budget), so that workers know nothing of the layers above them. Every method
/// answers: a refusal or a failure is an answer the code sees (a fetch error, a `ToolError`),
/// never an error of the run.
#[async_trait::async_trait]
pub trait RunHost: Send {
    /// The largest request body one fetch of the code may send (bytes): a run's frames are
    /// read with room for it.
    fn max_request_bytes(&self) -> usize;

    /// Most HTTP requests the code may make at once (`--max-concurrent-fetches`): the most
    /// one fetch frame of the worker may carry.
    fn fetches_at_once(&self) -> usize;

    /// Performs or refuses HTTP requests the code made at once (each with its body): a
    /// response and its body per request, in order.
    async fn fetch(
        &mut self,
        requests: Vec<(FetchRequest, Vec<u8>)>,
    ) -> Vec<(FetchResponse, Vec<u8>)>;

    /// The code-mode tool catalog as the run publishes it to an interpreter that has version
    /// `known` of it (0: none yet); `None` without code mode.
    fn catalog(&self, known: u64) -> Option<CatalogUpdate>;

    /// What the run's code may do on the network (`--allow-net`: the placeholders of
    /// `--secret`, the requests it may make at once); `None` (the default): nothing.
    fn network(&self) -> Option<RunNetwork> {
        None
    }

    /// Makes the code's call of an upstream MCP tool: the answer and its images' bytes, in the
    /// order the answer names them.
    async fn call_tool(&mut self, call: ToolCall) -> (ToolAnswer, Vec<Vec<u8>>);

    /// Makes the code's call of a host function (the launcher's): its answer.
    async fn call_function(&mut self, call: FunctionCall) -> ToolAnswer;
}

/// The code-mode tool catalog as one run hands it to its interpreter ([`RunHost::catalog`]).
#[derive(Debug, Clone)]
pub struct CatalogUpdate {
    /// The catalog's version now: the interpreter has it once the run is sent.
    pub version: u64,
    /// What the interpreter builds `mcp_tools` from (JSON); `None` when it already has this
    /// version.
    pub tools: Option<serde_json::Value>,
}

/// The front's end of a worker's standard input: a pipe of a spawned or a forked process.
type WorkerIn = Box<dyn RequestPipe>;

/// The front's end of a worker's standard input: an async writer whose descriptor also
/// tells how many bytes of the requests written to it the worker has not read
/// ([`Worker::ended_before_taking_request`]).
pub trait RequestPipe: AsyncWrite + AsRawFd + Send + Unpin {}

impl<T: AsyncWrite + AsRawFd + Send + Unpin> RequestPipe for T {}
/// The front's end of a worker's standard output or error.
type WorkerOut = Box<dyn AsyncRead + Send + Unpin>;

/// A running worker that has booted Pyodide.
pub struct Worker {
    process: Process,
    stdin: WorkerIn,
    stdout: BufReader<WorkerOut>,
    next_id: CallId,
    /// The packages installed in this worker: normalized name → version.
    pub installed: HashMap<String, String>,
    /// What the worker reported of its confinement when it was ready.
    pub confinement: ConfinementReport,
    /// The version of the tool catalog its interpreter builds `mcp_tools` from (0: none yet).
    tools_version: u64,
    /// How many reply frames the front has read from it.
    replies_read: u64,
    /// How its pipes last showed it gone, if they did.
    gone: Option<Gone>,
    /// A scientific worker's scratch folder (its guest's `/`), removed when the worker is
    /// dropped, after its process (fields drop in order).
    scratch: Option<tempfile::TempDir>,
    /// Its resident memory when it said it was ready (bytes), before any call's code ran: what
    /// [`Worker::taken_bytes`] counts from.
    ready_resident: u64,
    /// Why it stands in for an interpreter that failed as it booted for the call that takes
    /// it (the spares' one retry, issue 48): said in that call's result, once.
    pub stand_in_for: Option<String>,
}

/// A checkpoint asked of a worker and not yet read ([`Worker::ask_checkpoint`]): the request's
/// id, which its answer must carry.
#[derive(Debug)]
#[must_use = "the worker answers the checkpoint whether or not it is read"]
pub struct AskedCheckpoint(CallId);

/// How a worker's pipes showed that it had ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gone {
    /// Its replies ended (end of file): every copy of its end of the pipe is closed.
    RepliesEnded,
    /// A request could not be written: no reader is left (`EPIPE`), so none of it was taken.
    RequestRefused,
}

/// A worker's report of its confinement layers (the second wall), from [`Reply::Ready`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfinementReport {
    /// One line naming every layer and whether it is on (`confinement default: seccomp: on, …`).
    pub line: String,
    /// Whether every layer is on.
    pub confined: bool,
}

/// Logs a worker's stderr at debug level, escaped and bounded: its text may come from user
/// code, and must never pass for the server's own log lines.
fn drain_stderr(pid: Option<u32>, stderr: WorkerOut) {
    tokio::spawn(async move {
        let mut reader = BufReader::new(stderr);
        let mut logged = 0usize;
        let mut line = Vec::new();
        loop {
            line.clear();
            match (&mut reader)
                .take(WORKER_LOG_LINE_MAX)
                .read_until(b'\n', &mut line)
                .await
            {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if logged < WORKER_LOG_MAX {
                        logged += n;
                        let text = String::from_utf8_lossy(&line);
                        tracing::debug!(target: "mcp_run_python::worker_log", pid, "{:?}", text.trim_end());
                    }
                }
            }
        }
    });
}

/// What a worker boots with: how (`mode`; with `Load`, the snapshot's descriptor was given to
/// [`Worker::start`]), the operator's `--mount` data, and the packages to install (`--deps`).
pub struct BootRequest<'a> {
    pub mode: SnapshotMode,
    pub mounts: &'a Mounts,
    pub preinstall: Option<&'a Preinstall>,
}

/// Files handed to a worker to install: virtual path and bytes (a wheel, or a lock package's file).
pub type InstallFiles = Vec<(String, Arc<Vec<u8>>)>;

/// Packages every worker installs, and imports, as it boots (`--deps`): the zygote does it once
/// for all the workers it forks. Made by the front from the resolver's plan.
#[derive(Debug, Default)]
pub struct Preinstall {
    /// The files to install, as in [`Worker::install`].
    pub files: InstallFiles,
    /// What `loadPackage` loads: lock package names and wheel paths.
    pub items: Vec<String>,
    /// The distributions (the requirements' names) whose top-level modules are imported.
    pub imports: Vec<String>,
    /// What the worker has once they are installed: normalized name → version.
    pub installed: HashMap<String, String>,
}

impl Worker {
    /// Starts `exe __worker <args>` and waits for Pyodide to boot, restoring the `snapshot` file
    /// when given (the worker maps it), or else making one when `make_snapshot`, and to install
    /// `preinstall`. Returns the
    /// worker and the snapshot it made, if any.
    ///
    /// Errors: [`WorkerError::Spawn`], [`WorkerError::Boot`], [`WorkerError::BootTimeout`],
    /// [`WorkerError::Stopped`], [`WorkerError::Protocol`].
    pub async fn spawn(
        exe: &Path,
        args: &[String],
        snapshot: Option<&File>,
        make_snapshot: bool,
        mounts: &Mounts,
        preinstall: Option<&Preinstall>,
    ) -> Result<(Worker, Option<Vec<u8>>), WorkerError> {
        let worker = Worker::start(exe, args, None, snapshot)?;
        let mode = match (snapshot, make_snapshot) {
            (Some(_), _) => SnapshotMode::Load,
            (None, true) => SnapshotMode::Make,
            (None, false) => SnapshotMode::None,
        };
        worker
            .boot(Some(BootRequest {
                mode,
                mounts,
                preinstall,
            }))
            .await
    }

    /// Starts `exe __worker <args>` with piped stdin, stdout and stderr and no environment
    /// but `RUST_LOG`; `control` (the zygote's control socket, `src/interpreter/fork_server.rs`) and
    /// `snapshot` (the memory snapshot to restore, [`SNAPSHOT_FD_ARG`]), when given, are
    /// inherited under the numbers its arguments name. Does not wait for it to boot.
    ///
    /// Errors: [`WorkerError::Spawn`], [`WorkerError::Protocol`] (pipes missing).
    pub fn start(
        exe: &Path,
        args: &[String],
        control: Option<&OwnedFd>,
        snapshot: Option<&File>,
    ) -> Result<Worker, WorkerError> {
        let mut command = Command::new(exe);
        let snapshot = snapshot.map(|f| f.as_raw_fd());
        let inherited: Vec<RawFd> = control
            .map(|fd| fd.as_raw_fd())
            .into_iter()
            .chain(snapshot)
            .collect();
        // SAFETY: `pre_exec` runs in the forked child before `exec` and makes only
        // async-signal-safe system calls (close_range, fcntl) over a slice made before the
        // fork: no allocation, no locks.
        unsafe {
            command.pre_exec(move || super::spawn::pre_exec(&inherited));
        }
        let mut child = command
            .arg(WORKER_COMMAND)
            .args(args)
            .args(snapshot.map(|fd| format!("{SNAPSHOT_FD_ARG}{fd}")))
            // The worker gets no host environment beyond what logging needs.
            .env_clear()
            .envs(std::env::var("RUST_LOG").ok().map(|v| ("RUST_LOG", v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(WorkerError::Spawn)?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(WorkerError::Protocol(Violation::NoPipes));
        };
        drain_stderr(child.id(), Box::new(stderr));
        Ok(Worker::new(
            Process::Spawned(child),
            Box::new(stdin),
            Box::new(stdout),
        ))
    }

    /// A worker on a process forked by the zygote (`zygote_client.rs`), through the front's ends of
    /// its pipes. Does not wait for it to be ready.
    pub fn forked(
        process: Process,
        stdin: WorkerIn,
        stdout: WorkerOut,
        stderr: WorkerOut,
    ) -> Worker {
        drain_stderr(process.id(), stderr);
        Worker::new(process, stdin, stdout)
    }

    fn new(process: Process, stdin: WorkerIn, stdout: WorkerOut) -> Worker {
        Worker {
            process,
            stdin,
            stdout: BufReader::new(stdout),
            next_id: 1,
            installed: HashMap::new(),
            confinement: ConfinementReport::default(),
            tools_version: 0,
            replies_read: 0,
            gone: None,
            scratch: None,
            ready_resident: 0,
            stand_in_for: None,
        }
    }

    /// A new scientific worker's scratch folder (its guest's `/`), made empty in `root`, the
    /// launcher's folder of them; removed when the returned directory is dropped.
    ///
    /// Errors: the folder cannot be made.
    pub fn new_scratch(root: &Path) -> std::io::Result<tempfile::TempDir> {
        tempfile::Builder::new().prefix("worker-").tempdir_in(root)
    }

    /// Keeps `scratch`, the worker's scratch folder, until the worker is dropped.
    pub fn keep_scratch(&mut self, scratch: tempfile::TempDir) {
        self.scratch = Some(scratch);
    }

    /// Sends `boot` (the snapshot mode, the snapshot and the mounts), if given, and waits for
    /// the worker to say it is ready (a forked worker says so by itself), at most
    /// [`BOOT_TIMEOUT`]. Returns the worker and the snapshot it made, if any. A worker that
    /// does not become ready is killed.
    ///
    /// Errors: [`WorkerError::Boot`], [`WorkerError::BootTimeout`], [`WorkerError::Stopped`],
    /// [`WorkerError::Protocol`], [`WorkerError::Unconfined`].
    pub async fn boot(
        self,
        boot: Option<BootRequest<'_>>,
    ) -> Result<(Worker, Option<Vec<u8>>), WorkerError> {
        let mut worker = self;
        let limits = FrameLimits {
            attachments: 1,
            attachment: MAX_SNAPSHOT_BYTES,
            ..FrameLimits::CONTROL
        };
        let preinstalled = boot.as_ref().and_then(|b| b.preinstall);
        let booted = async {
            if let Some(boot) = boot {
                worker.send_boot(boot).await?;
            }
            worker.next_frame(limits).await
        };
        let ready = tokio::time::timeout(BOOT_TIMEOUT, booted).await;
        match ready {
            Err(_) => {
                worker.kill().await;
                Err(WorkerError::BootTimeout(BOOT_TIMEOUT.as_secs()))
            }
            Ok(Err(e)) => {
                let stopped_from_outside = worker.stopped_from_outside();
                worker.kill().await;
                Err(match e {
                    WorkerError::Died(why) if stopped_from_outside => WorkerError::Stopped(why),
                    WorkerError::Died(why) => WorkerError::Boot(BootFailure::Exited(why)),
                    e => e,
                })
            }
            Ok(Ok(frame)) => worker.take_ready(frame, preinstalled).await,
        }
    }

    /// Sends the boot frame of `boot`: the request, then the mount's bytes and the install
    /// files' bytes as attachments ([`BootAttachments`]).
    async fn send_boot(&mut self, boot: BootRequest<'_>) -> Result<(), WorkerError> {
        let layout = BootAttachments {
            mount: (!boot.mounts.plan.is_empty()).then_some(boot.mounts.bytes.as_slice()),
            install: boot
                .preinstall
                .iter()
                .flat_map(|p| p.files.iter().map(|(_, bytes)| bytes.as_slice()))
                .collect(),
        };
        let install = boot.preinstall.map(|p| BootInstall {
            files: p.files.iter().map(|(path, _)| path.clone()).collect(),
            items: p.items.clone(),
            imports: p.imports.clone(),
        });
        let request = Request::Boot {
            snapshot: boot.mode,
            mount: boot.mounts.plan.clone(),
            install,
        };
        self.send(&request, &layout.to_frame()).await
    }

    /// Takes the worker's first frame apart: [`Reply::Ready`] (its confinement report is kept,
    /// and `preinstalled`'s packages when they installed) gives the worker and the snapshot it
    /// made, if any; anything else kills it.
    ///
    /// Errors: [`WorkerError::Boot`] (it reported a fatal error), [`WorkerError::Unconfined`],
    /// [`WorkerError::Protocol`] (another reply).
    async fn take_ready(
        mut self,
        frame: Frame<Reply>,
        preinstalled: Option<&Preinstall>,
    ) -> Result<(Worker, Option<Vec<u8>>), WorkerError> {
        let error = match frame.header {
            Reply::Ready {
                boot_ms,
                pyodide_version,
                restored,
                confinement,
                confined,
                install_error,
            } => {
                let how = match (self.process.is_forked(), restored) {
                    (true, _) => "forked from the zygote",
                    (false, true) => "booted from a memory snapshot",
                    (false, false) => "booted",
                };
                tracing::info!(
                    "sandbox worker ready: interpreter {pyodide_version:?} {how} in {boot_ms} ms"
                );
                self.confinement = ConfinementReport {
                    line: confinement,
                    confined,
                };
                match (preinstalled, install_error) {
                    (Some(p), None) => self.installed = p.installed.clone(),
                    (Some(_), Some(e)) => {
                        tracing::warn!("--deps did not install as the worker booted: {e}")
                    }
                    (None, _) => {}
                }
                self.ready_resident = self.resident_bytes().unwrap_or(0);
                return Ok((self, frame.attachments.into_iter().next()));
            }
            Reply::Fatal { error } => WorkerError::Boot(BootFailure::Reported(error)),
            Reply::Unconfined { reason } => WorkerError::Unconfined(reason),
            other => WorkerError::Protocol(Violation::WhileBooting(other.kind())),
        };
        self.kill().await;
        Err(error)
    }

    async fn next_frame(&mut self, limits: FrameLimits) -> Result<Frame<Reply>, WorkerError> {
        match read_frame_async::<Reply>(&mut self.stdout, limits).await {
            Ok(Some(frame)) => {
                self.replies_read += 1;
                Ok(frame)
            }
            Ok(None) => self.replies_ended().await,
            Err(e) if e.is_eof() => self.replies_ended().await,
            Err(e @ FrameError::Io(_)) => Err(WorkerError::Died(Exit::Pipe(e))),
            Err(e) => Err(WorkerError::Protocol(Violation::Frame(e))),
        }
    }

    /// The next frame of call `id`, read before `deadline` (the phase's limit, `phase`).
    /// `Fatal` becomes [`WorkerError::Died`]; a frame of another call is a violation.
    async fn expect(
        &mut self,
        id: CallId,
        limits: FrameLimits,
        deadline: Deadline,
    ) -> Result<Frame<Reply>, WorkerError> {
        let frame = deadline.bound(self.next_frame(limits)).await??;
        match (&frame.header, frame.header.call_id()) {
            (Reply::Fatal { error }, _) => Err(WorkerError::Died(Exit::Fatal(error.clone()))),
            (_, Some(got)) if got == id => Ok(frame),
            (reply, got) => Err(WorkerError::Protocol(Violation::OtherCall {
                kind: reply.kind(),
                got: got.map_or("none".to_owned(), |g| g.to_string()),
                awaited: id,
            })),
        }
    }

    /// Whether the process was ended by a signal that comes from outside (a shutdown or an
    /// operator), rather than failing by itself.
    fn stopped_from_outside(&mut self) -> bool {
        matches!(
            self.process.signal(),
            Some(libc::SIGTERM | libc::SIGKILL | libc::SIGINT | libc::SIGHUP)
        )
    }

    /// How the process ended, waiting for it at most two seconds.
    async fn exit_reason(&mut self) -> Exit {
        match tokio::time::timeout(Duration::from_secs(2), self.process.wait()).await {
            Ok(Some(Ended::Status(status))) => Exit::Status(status),
            // Only the zygote sees how a forked worker ended.
            _ => Exit::Unknown,
        }
    }

    /// The worker's replies ended: it is gone ([`WorkerError::Died`]).
    async fn replies_ended<T>(&mut self) -> Result<T, WorkerError> {
        self.gone = Some(Gone::RepliesEnded);
        Err(WorkerError::Died(self.exit_reason().await))
    }

    async fn send(&mut self, request: &Request, attachments: &[&[u8]]) -> Result<(), WorkerError> {
        let parts: Vec<[&[u8]; 1]> = attachments.iter().map(|a| [*a]).collect();
        let parts: Vec<&[&[u8]]> = parts.iter().map(|p| p.as_slice()).collect();
        self.send_parts(request, &parts).await
    }

    /// [`Worker::send`] with each attachment given as parts (see `write_frame_parts_async`).
    async fn send_parts(
        &mut self,
        request: &Request,
        attachments: &[&[&[u8]]],
    ) -> Result<(), WorkerError> {
        if let Err(e) = write_frame_parts_async(&mut self.stdin, request, attachments).await {
            if matches!(&e, FrameError::Io(io) if io.kind() == std::io::ErrorKind::BrokenPipe) {
                self.gone = Some(Gone::RequestRefused);
            }
            return Err(WorkerError::Died(match self.exit_reason().await {
                Exit::Unknown => Exit::Pipe(e),
                known => known,
            }));
        }
        Ok(())
    }

    /// Sends `request` (made for a fresh call id) before `deadline`.
    async fn send_before(
        &mut self,
        request: &Request,
        attachments: &[&[u8]],
        deadline: Deadline,
    ) -> Result<(), WorkerError> {
        deadline.bound(self.send(request, attachments)).await?
    }

    fn new_id(&mut self) -> CallId {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// One request and its one answer: sends the request `make` builds for a fresh call id,
    /// before `deadline`, reads the reply of that id under `limits`, and takes it apart with
    /// `take` (`None` for a reply of another kind: a violation).
    async fn call<T>(
        &mut self,
        make: impl FnOnce(CallId) -> Request,
        attachments: &[&[u8]],
        limits: FrameLimits,
        deadline: Deadline,
        take: impl FnOnce(Frame<Reply>) -> Option<Result<T, Violation>>,
    ) -> Result<T, WorkerError> {
        let id = self.new_id();
        self.send_before(&make(id), attachments, deadline).await?;
        self.answer(id, limits, deadline, take).await
    }

    /// The one answer to call `id`, read under `limits` before `deadline` and taken apart with
    /// `take` (`None` for a reply of another kind: a violation): [`Worker::call`]'s second
    /// half, alone for a request whose answer is read later ([`Worker::checkpoint_taken`]).
    async fn answer<T>(
        &mut self,
        id: CallId,
        limits: FrameLimits,
        deadline: Deadline,
        take: impl FnOnce(Frame<Reply>) -> Option<Result<T, Violation>>,
    ) -> Result<T, WorkerError> {
        let frame = self.expect(id, limits, deadline).await?;
        let kind = frame.header.kind();
        match take(frame) {
            Some(answer) => answer.map_err(WorkerError::Protocol),
            None => Err(WorkerError::Protocol(Violation::Unexpected(kind))),
        }
    }

    /// A health check: the worker must answer before `deadline`.
    pub async fn ping(&mut self, deadline: Deadline) -> Result<(), WorkerError> {
        let take = |frame: Frame<Reply>| match frame.header {
            Reply::Pong { .. } => Some(Ok(())),
            _ => None,
        };
        let ping = |id| Request::Ping { id };
        self.call(ping, &[], FrameLimits::CONTROL, deadline, take)
            .await
    }

    /// Top-level imports of `code`, minus the standard library.
    pub async fn find_imports(
        &mut self,
        code: &str,
        deadline: Deadline,
    ) -> Result<Vec<String>, WorkerError> {
        let make = |id| Request::FindImports {
            id,
            code: code.to_owned(),
        };
        let take = |frame: Frame<Reply>| match frame.header {
            Reply::Imports { names, .. } => Some(Ok(names)),
            _ => None,
        };
        self.call(make, &[], FrameLimits::CONTROL, deadline, take)
            .await
    }

    /// The bytes of file `path` under the interpreter's working directory, if it has at most
    /// `cap` bytes.
    ///
    /// Errors: [`FileError::Refused`] when the worker could not read it (no such file, too
    /// large, a directory); [`FileError::Worker`] when talking to it failed.
    pub async fn read_file(
        &mut self,
        path: &str,
        cap: usize,
        deadline: Deadline,
    ) -> Result<Vec<u8>, FileError> {
        let make = |id| Request::ReadFile {
            id,
            path: path.to_owned(),
            cap,
        };
        let limits = FrameLimits {
            attachments: 1,
            attachment: cap,
            ..FrameLimits::CONTROL
        };
        let take = |frame: Frame<Reply>| match frame.header {
            Reply::File { error: Some(e), .. } => Some(Ok(Err(e))),
            Reply::File { error: None, .. } => Some(
                frame
                    .attachments
                    .into_iter()
                    .next()
                    .map(Ok)
                    .ok_or(Violation::FileWithoutBytes),
            ),
            _ => None,
        };
        let read = self.call(make, &[], limits, deadline, take).await?;
        read.map_err(|reason| FileError::Refused { reason })
    }

    /// Writes `bytes` to file `path` under the working directory, or removes it when `bytes`
    /// is `None`.
    ///
    /// Errors: [`FileError::Refused`] when the worker could not (no such file, no memory left,
    /// a folder in the way); [`FileError::Worker`] when talking to it failed.
    pub async fn write_file(
        &mut self,
        path: &str,
        bytes: Option<&[u8]>,
        deadline: Deadline,
    ) -> Result<(), FileError> {
        let make = |id| Request::WriteFile {
            id,
            path: path.to_owned(),
            delete: bytes.is_none(),
        };
        let attachments: Vec<&[u8]> = bytes.into_iter().collect();
        let take = |frame: Frame<Reply>| match frame.header {
            Reply::File { error, .. } => Some(Ok(error)),
            _ => None,
        };
        let refused = self
            .call(make, &attachments, FrameLimits::CONTROL, deadline, take)
            .await?;
        refused.map_or(Ok(()), |reason| Err(FileError::Refused { reason }))
    }

    /// The packages installed in this worker (name, version), sorted: what a restore of its
    /// state installs first.
    pub fn installed_pins(&self) -> Vec<(String, String)> {
        let mut pins: Vec<(String, String)> = self
            .installed
            .iter()
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect();
        pins.sort();
        pins
    }

    /// Asks the worker for a checkpoint of its interpreter between runs (checkpoints,
    /// docs/architecture.md §3.4) without waiting for it: it begins at once, and
    /// [`Worker::checkpoint_taken`] reads it (a call's answer may go out meanwhile).
    ///
    /// Errors: [`WorkerError`] when the request could not be written.
    pub async fn ask_checkpoint(
        &mut self,
        deadline: Deadline,
    ) -> Result<AskedCheckpoint, WorkerError> {
        let id = self.new_id();
        self.send_before(&Request::Checkpoint { id }, &[], deadline)
            .await?;
        Ok(AskedCheckpoint(id))
    }

    /// The checkpoint `asked` for: the pages of linear memory that changed since the last
    /// one, or why its state cannot be captured. A page attachment may be as large as the
    /// encodings of every page of `max_memory_bytes` (the worker's memory bound) can be
    /// ([`crate::protocol::pages::max_encoded_bytes`]).
    ///
    /// Errors: [`WorkerError`]; a checkpoint whose attachments do not match what it declares
    /// is [`Violation::Checkpoint`].
    pub async fn checkpoint_taken(
        &mut self,
        AskedCheckpoint(id): AskedCheckpoint,
        max_memory_bytes: u64,
        deadline: Deadline,
    ) -> Result<Checkpointed, WorkerError> {
        let limits = FrameLimits {
            attachments: 2,
            attachment: usize::try_from(max_encoded_bytes(max_memory_bytes)).unwrap_or(usize::MAX),
            ..FrameLimits::CONTROL
        };
        let take = |frame: Frame<Reply>| match frame.header {
            Reply::Checkpoint {
                outcome: CheckpointOutcome::Uncapturable { reasons },
                ..
            } if frame.attachments.is_empty() && !reasons.is_empty() => {
                Some(Ok(Checkpointed::Uncapturable(reasons)))
            }
            Reply::Checkpoint {
                outcome:
                    CheckpointOutcome::Taken {
                        zygote,
                        memory_bytes,
                        pages,
                    },
                ..
            } => Some(taken_pages(zygote, memory_bytes, pages, frame.attachments)),
            Reply::Checkpoint { .. } => Some(Err(Violation::Checkpoint)),
            _ => None,
        };
        self.answer(id, limits, deadline, take).await
    }

    /// Restores a checkpoint into this fresh child of zygote `zygote`: its linear memory grows
    /// to `memory_bytes`, and the pages at `indexes` (`u32` little-endian each, strictly
    /// increasing) become the zygote's XOR `pages` (each a page encoding,
    /// [`crate::protocol::pages`], written from where they are, never copied into one buffer); with `reseed`, its
    /// next run reseeds `random`. `Ok(Some(reason))` when the worker refused.
    ///
    /// Errors: [`WorkerError`] (the worker is then to be discarded).
    pub async fn restore(
        &mut self,
        zygote: ZygoteId,
        memory_bytes: u64,
        (indexes, pages): (&[u8], &[&[u8]]),
        reseed: bool,
        deadline: Deadline,
    ) -> Result<Option<String>, WorkerError> {
        let id = self.new_id();
        let request = Request::Restore {
            id,
            zygote,
            memory_bytes,
            reseed,
        };
        let attachments: [&[&[u8]]; 2] = [&[indexes], pages];
        deadline
            .bound(self.send_parts(&request, &attachments))
            .await??;
        let frame = self.expect(id, FrameLimits::CONTROL, deadline).await?;
        match frame.header {
            Reply::Restored { error, .. } => Ok(error),
            other => Err(unexpected(&other)),
        }
    }

    /// Makes the worker's next run reseed Python's `random`, as `os.fork` does in a child (an
    /// interpreter handed to a fork, checkpoints, docs/architecture.md §3.4). `Ok(Some(reason))` when the worker could not.
    ///
    /// Errors: [`WorkerError`] (the worker is then to be discarded).
    pub async fn reseed(&mut self, deadline: Deadline) -> Result<Option<String>, WorkerError> {
        let make = |id| Request::Reseed { id };
        let take = |frame: Frame<Reply>| match frame.header {
            Reply::Reseeded { error, .. } => Some(Ok(error)),
            _ => None,
        };
        self.call(make, &[], FrameLimits::CONTROL, deadline, take)
            .await
    }

    /// Runs a throwaway call in the worker ([`Request::WarmUp`]).
    ///
    /// Errors: [`WorkerError::WarmUp`] when it failed in the worker (the interpreter's words);
    /// any other [`WorkerError`]. The worker is then to be discarded.
    pub async fn warm_up(&mut self, deadline: Deadline) -> Result<(), WorkerError> {
        let make = |id| Request::WarmUp { id };
        let take = |frame: Frame<Reply>| match frame.header {
            Reply::WarmedUp { error, .. } => Some(Ok(error)),
            _ => None,
        };
        match self
            .call(make, &[], FrameLimits::CONTROL, deadline, take)
            .await?
        {
            None => Ok(()),
            Some(why) => Err(WorkerError::WarmUp(why)),
        }
    }

    /// Hands `files` (virtual path, bytes) to the worker and loads `items` with
    /// `pyodide.loadPackage`. `Ok(Some(reason))` when Pyodide reported a failure.
    pub async fn install(
        &mut self,
        files: InstallFiles,
        items: Vec<String>,
        deadline: Deadline,
    ) -> Result<Option<String>, WorkerError> {
        let paths = files.iter().map(|(p, _)| p.clone()).collect();
        let bytes: Vec<&[u8]> = files.iter().map(|(_, b)| b.as_slice()).collect();
        let make = |id| Request::Install {
            id,
            files: paths,
            items,
        };
        let take = |frame: Frame<Reply>| match frame.header {
            Reply::Installed { error, .. } => Some(Ok(error)),
            _ => None,
        };
        self.call(make, &bytes, FrameLimits::CONTROL, deadline, take)
            .await
    }

    /// Runs the code of `request` before `deadline`. Output lines are counted against the
    /// output cap as they arrive: lines within it go to `on_output`, then one marker line;
    /// past the cap plus [`OUTPUT_SLACK`] the run is stopped ([`WorkerError::OutputFlood`]).
    /// What the code asks of its host (fetches, code mode's tool calls) goes to `host`, and
    /// its answer back to the worker, until the worker says the run is over.
    ///
    /// Errors: [`WorkerError::Deadline`] (phase of `deadline`), [`WorkerError::OutputFlood`],
    /// [`WorkerError::Died`], [`WorkerError::Protocol`].
    pub async fn run(
        &mut self,
        request: RunRequest<'_>,
        deadline: Deadline,
        host: &mut dyn RunHost,
        on_output: &mut (dyn FnMut(Stream, String) + Send),
    ) -> Result<RunOutcome, WorkerError> {
        let limits = run_limits(&request, host.max_request_bytes(), host.fetches_at_once());
        let image_cap = request.image_cap;
        let mut output = OutputCount::new(request.output_cap);
        let id = self.send_run(request, deadline, host).await?;
        loop {
            let frame = self.expect(id, limits, deadline).await?;
            match frame.header {
                Reply::Fetch { requests, .. } => {
                    let bodies = frame
                        .attachments
                        .into_iter()
                        .chain(std::iter::repeat(Vec::new()));
                    let requests = requests.into_iter().zip(bodies).collect();
                    self.answer_fetch(id, requests, host, deadline).await?;
                }
                Reply::ToolCall { call, .. } => {
                    self.answer_tool_call(id, call, host, deadline).await?;
                }
                Reply::FunctionCall { call, .. } => {
                    self.answer_function_call(id, call, host, deadline).await?;
                }
                Reply::Output { lines, .. } => output.take(lines, on_output)?,
                Reply::Ran { outcome, .. } => return ran(outcome, frame.attachments, image_cap),
                other => return Err(unexpected(&other)),
            }
        }
    }

    /// Sends the `run` request of `request` for a fresh call id before `deadline`, with the
    /// code-mode catalog when the interpreter does not have its version yet; returns the id.
    async fn send_run(
        &mut self,
        request: RunRequest<'_>,
        deadline: Deadline,
        host: &mut dyn RunHost,
    ) -> Result<CallId, WorkerError> {
        let id = self.new_id();
        let (catalog_version, tools) = match host.catalog(self.tools_version) {
            Some(CatalogUpdate { version, tools }) => (Some(version), tools),
            None => (None, None),
        };
        let message = Request::Run {
            id,
            code: request.code.to_owned(),
            globals: request.globals.clone(),
            output_cap: request.output_cap,
            result_cap: request.result_cap,
            keep_globals: request.keep_globals,
            image_cap: request.image_cap,
            tools,
            network: host.network(),
            checkpoint_follows: request.checkpoint_follows,
        };
        self.send_before(&message, &[], deadline).await?;
        if let Some(version) = catalog_version {
            self.tools_version = version;
        }
        Ok(id)
    }

    /// Answers a fetch of run `id` (`requests`, each with its body) with what `host` made of
    /// them, the responses' bodies attached in order.
    async fn answer_fetch(
        &mut self,
        id: CallId,
        requests: Vec<(FetchRequest, Vec<u8>)>,
        host: &mut dyn RunHost,
        deadline: Deadline,
    ) -> Result<(), WorkerError> {
        let answers = deadline.bound(host.fetch(requests)).await?;
        let (responses, bodies): (Vec<FetchResponse>, Vec<Vec<u8>>) = answers.into_iter().unzip();
        let attachments: Vec<&[u8]> = bodies.iter().map(Vec::as_slice).collect();
        self.send_before(
            &Request::FetchResult { id, responses },
            &attachments,
            deadline,
        )
        .await
    }

    /// Answers an upstream tool call of run `id` (code mode) with `host`'s answer, its images'
    /// bytes attached in order.
    async fn answer_tool_call(
        &mut self,
        id: CallId,
        call: ToolCall,
        host: &mut dyn RunHost,
        deadline: Deadline,
    ) -> Result<(), WorkerError> {
        let (answer, images) = deadline.bound(host.call_tool(call)).await?;
        let attachments: Vec<&[u8]> = images.iter().map(Vec::as_slice).collect();
        let reply = Request::ToolResult { id, answer };
        self.send_before(&reply, &attachments, deadline).await
    }

    /// Answers a host function call of run `id` (code mode) with `host`'s answer.
    async fn answer_function_call(
        &mut self,
        id: CallId,
        call: FunctionCall,
        host: &mut dyn RunHost,
        deadline: Deadline,
    ) -> Result<(), WorkerError> {
        let answer = deadline.bound(host.call_function(call)).await?;
        let reply = Request::ToolResult { id, answer };
        self.send_before(&reply, &[], deadline).await
    }

    /// Whether the zygote forked this worker (it then shares the zygote's compiled code; a
    /// booted one compiles its own as it runs).
    pub fn is_forked(&self) -> bool {
        self.process.is_forked()
    }

    /// How many reply frames have been read from the worker so far: a mark to pass to
    /// [`Worker::ended_before_taking_request`].
    pub fn replies_read(&self) -> u64 {
        self.replies_read
    }

    /// Whether the worker ended before it took the one request sent since `mark`
    /// ([`Worker::replies_read`] then): it sent no reply since, and either the request could
    /// not be written (no reader left) or bytes of it are still unread in its pipe. Such a
    /// worker never began that request, so running it again elsewhere repeats nothing: it is
    /// how a worker killed between calls (the OOM killer, an operator) is told apart from one
    /// that died running the code, even when its threads were still exiting as the call came.
    pub fn ended_before_taking_request(&self, mark: u64) -> bool {
        self.replies_read == mark
            && match self.gone {
                None => false,
                Some(Gone::RequestRefused) => true,
                Some(Gone::RepliesEnded) => self.request_bytes_unread() > 0,
            }
    }

    /// Bytes written to the worker's standard input that it has not read (0 when unknown).
    fn request_bytes_unread(&self) -> usize {
        let mut unread: libc::c_int = 0;
        // SAFETY: FIONREAD stores one c_int through the pointer, which points to a local that
        // outlives the call; the descriptor is the open write end `self.stdin` owns (on a
        // pipe, FIONREAD counts the buffered bytes from either end, even with no reader left).
        let rc = unsafe { libc::ioctl(self.stdin.as_raw_fd(), libc::FIONREAD, &mut unread) };
        if rc == 0 {
            usize::try_from(unread).unwrap_or(0)
        } else {
            0
        }
    }

    /// Whether the worker's process has ended (killed from outside, the OOM killer, a crash),
    /// told without waiting.
    pub fn has_ended(&mut self) -> bool {
        self.process.has_ended()
    }

    /// The worker's process id, if it is still running.
    pub fn pid(&self) -> Option<u32> {
        self.process.id()
    }

    /// Resident memory of the worker process (bytes), read from `/proc/<pid>/statm`.
    pub fn resident_bytes(&self) -> Option<u64> {
        resident_bytes(self.pid()?)
    }

    /// The memory the worker took since it was ready (bytes): what calls' code, packages and
    /// data added to a fresh interpreter, which `--memory` limits; see [`MemoryGauge`].
    pub fn taken_bytes(&self) -> Option<u64> {
        self.memory_gauge()?.taken()
    }

    /// How to read the worker's taken memory from outside it, while a call holds the worker.
    pub fn memory_gauge(&self) -> Option<MemoryGauge> {
        Some(MemoryGauge {
            pid: self.pid()?,
            ready_resident: self.ready_resident,
        })
    }

    /// Kills the process now and reaps it in the background: the caller (a call's answer)
    /// does not wait for the kernel to tear down a large address space.
    pub fn kill_soon(mut self) {
        self.process.start_kill();
        tokio::spawn(self.kill());
    }

    /// Kills the process and reaps it.
    pub async fn kill(mut self) {
        self.process.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.process.wait()).await;
    }
}

/// Output bytes kept beyond the cap so that the Python helper's own truncation marker line
/// (written after the cap is reached) is kept rather than replaced (bytes).
const MARKER_ALLOWANCE: usize = 256;

/// The limits of the frames of a run of `request`: a header with room for the output and the
/// return value (escaped as JSON), and attachments for the bodies of the requests made at once
/// (`fetches_at_once` of at most `max_request_bytes`) or the images of the answer.
fn run_limits(
    request: &RunRequest<'_>,
    max_request_bytes: usize,
    fetches_at_once: usize,
) -> FrameLimits {
    FrameLimits {
        header: JSON_ESCAPE_FACTOR
            .saturating_mul(
                request
                    .output_cap
                    .saturating_add(OUTPUT_SLACK + 1)
                    .max(request.result_cap),
            )
            .saturating_add(RUN_FRAME_OVERHEAD),
        // The bodies of the requests made at once, or the images of the answer.
        attachments: MAX_IMAGES.max(fetches_at_once).max(1),
        attachment: max_request_bytes.max(request.image_cap),
    }
}

/// A run's output as the front counts it against the output cap (bytes, a newline counted per
/// line).
struct OutputCount {
    /// The output cap (`--output-cap`).
    cap: usize,
    /// Bytes written so far.
    used: usize,
    /// Whether the truncation marker was handed on.
    marked: bool,
}

impl OutputCount {
    fn new(cap: usize) -> OutputCount {
        OutputCount {
            cap,
            used: 0,
            marked: false,
        }
    }

    /// Counts `lines`: those within the cap go to `on_output`, then one marker line, then
    /// nothing.
    ///
    /// Errors: [`WorkerError::OutputFlood`] once the run wrote more than the cap plus
    /// [`OUTPUT_SLACK`].
    fn take(
        &mut self,
        lines: Vec<OutputLine>,
        on_output: &mut (dyn FnMut(Stream, String) + Send),
    ) -> Result<(), WorkerError> {
        for (stream, text) in lines {
            self.used = self.used.saturating_add(text.len() + 1);
            if self.used <= self.cap.saturating_add(MARKER_ALLOWANCE) {
                on_output(stream, text);
            } else if !self.marked {
                self.marked = true;
                on_output(stream, truncation_marker(self.cap));
            }
        }
        let flood_limit = self.cap.saturating_add(OUTPUT_SLACK);
        if self.used > flood_limit {
            return Err(WorkerError::OutputFlood { limit: flood_limit });
        }
        Ok(())
    }
}

/// The outcome of a run as the worker reported it, with its images' bytes (`images`, the
/// frame's attachments): exactly one per image named, each of at most `image_cap` bytes.
///
/// Errors: [`WorkerError::Protocol`] for images that break that rule, or more files listed
/// than [`MAX_LISTED_FILES`].
fn ran(
    mut outcome: RunOutcome,
    images: Vec<Vec<u8>>,
    image_cap: usize,
) -> Result<RunOutcome, WorkerError> {
    if images.len() != outcome.images.len()
        || images.len() > MAX_IMAGES
        || images.iter().any(|b| b.len() > image_cap)
    {
        return Err(WorkerError::Protocol(Violation::Images {
            images: images.len(),
            names: outcome.images.len(),
            cap: image_cap,
        }));
    }
    let listed = outcome
        .files
        .len()
        .max(outcome.written.len())
        .max(outcome.refresh.len());
    if listed > MAX_LISTED_FILES {
        return Err(WorkerError::Protocol(Violation::TooManyFiles(listed)));
    }
    outcome.image_bytes = images;
    Ok(outcome)
}

/// The line that replaces output past the cap (the same text the Python helper writes).
pub fn truncation_marker(cap: usize) -> String {
    format!("[output truncated: more than {cap} bytes were written]")
}

/// When a phase must be over: the instant, and the limit and phase for the error message.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    pub at: Instant,
    pub limit: Duration,
    pub phase: Phase,
}

impl Deadline {
    /// `limit` from now, for `phase`.
    pub fn after(limit: Duration, phase: Phase) -> Deadline {
        Deadline {
            at: Instant::now() + limit,
            limit,
            phase,
        }
    }

    /// Runs `work` until this deadline; past it, [`WorkerError::Deadline`] for its phase (the
    /// one place that error is made, so every phase reports its limit the same way).
    pub async fn bound<T>(
        self,
        work: impl std::future::Future<Output = T>,
    ) -> Result<T, WorkerError> {
        tokio::time::timeout_at(self.at, work)
            .await
            .map_err(|_| WorkerError::Deadline {
                phase: self.phase,
                seconds: self.limit,
            })
    }
}

fn unexpected(reply: &Reply) -> WorkerError {
    WorkerError::Protocol(Violation::Unexpected(reply.kind()))
}

/// The memory a worker took since it was ready: its resident memory now less its resident memory
/// then (README "Limits the front enforces").
///
/// Why not its private memory (USS, `/proc/<pid>/smaps_rollup`): a forked worker shares the
/// zygote's pages until it writes them, and a booted one owns all of its own, so the same code
/// measured 258 MiB of USS forked and 431 MiB booted, where what it took since it was ready was
/// 268 and 262 MiB. USS also needs ptrace access to the worker, which is not dumpable, so an
/// unprivileged front could not read it (proc(5)); `statm` is readable by the worker's user.
/// A cgroup v2 limit needs a delegated cgroup, which desktop sessions and CI runners do not
/// always give.
#[derive(Debug, Clone, Copy)]
pub struct MemoryGauge {
    pid: u32,
    ready_resident: u64,
}

impl MemoryGauge {
    /// Bytes taken since the worker was ready; `None` when its process is gone.
    pub fn taken(&self) -> Option<u64> {
        Some(resident_bytes(self.pid)?.saturating_sub(self.ready_resident))
    }
}

/// Resident memory (bytes) of process `pid` from `/proc/<pid>/statm` (Linux); `None` elsewhere.
pub fn resident_bytes(pid: u32) -> Option<u64> {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).unwrap_or(4096))
}

#[cfg(test)]
mod tests {
    //! The front against hostile workers: real processes over real pipes that speak the frame
    //! format but break the protocol (a stand-in for a compromised sandbox, not a mock of the
    //! engine, which the Python client tests drive for real).

    use super::*;
    use crate::worker::net::NetPolicy;
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;

    /// A run's host with a network policy and no code mode.
    struct NetOnly(NetPolicy);

    #[async_trait::async_trait]
    impl RunHost for NetOnly {
        fn max_request_bytes(&self) -> usize {
            self.0.max_request_bytes()
        }

        fn fetches_at_once(&self) -> usize {
            self.0.at_once()
        }

        async fn fetch(
            &mut self,
            requests: Vec<(FetchRequest, Vec<u8>)>,
        ) -> Vec<(FetchResponse, Vec<u8>)> {
            self.0.fetch_all(requests, None).await
        }

        fn catalog(&self, _known: u64) -> Option<CatalogUpdate> {
            None
        }

        async fn call_tool(&mut self, _call: ToolCall) -> (ToolAnswer, Vec<Vec<u8>>) {
            let message = "no code mode in this test".to_owned();
            (ToolAnswer::Error { message }, Vec::new())
        }

        async fn call_function(&mut self, _call: FunctionCall) -> ToolAnswer {
            let message = "no code mode in this test".to_owned();
            ToolAnswer::Error { message }
        }
    }

    /// A Python program that boots like a worker, then answers every request with `answer`
    /// (Python code computing `reply`, a dict, from `req`, the request) and `extra` frames.
    fn fake_worker(dir: &Path, body: &str) -> std::path::PathBuf {
        let python = std::env::var_os("PATH")
            .and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|p| p.join("python3"))
                    .find(|p| p.is_file())
            })
            .expect("python3 on PATH");
        let script = format!(
            r#"#!{python}
import json, struct, sys, time
inp, out = sys.stdin.buffer, sys.stdout.buffer
def read():
    n = inp.read(4)
    if len(n) < 4: sys.exit(0)
    head = json.loads(inp.read(struct.unpack('<I', n)[0]))
    for _ in range(struct.unpack('<I', inp.read(4))[0]):
        inp.read(struct.unpack('<Q', inp.read(8))[0])
    return head
def send(reply, raw=None):
    data = raw if raw is not None else json.dumps(reply).encode()
    out.write(struct.pack('<I', len(data)) + data + struct.pack('<I', 0)); out.flush()
read()
send({{'kind': 'ready', 'pyodide_version': 'fake', 'boot_ms': 0, 'restored': False, 'sandbox': 'confinement off', 'confined': False}})
while True:
    req = read()
{body}
"#,
            python = python.display()
        );
        let path = dir.join("fake-worker");
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(script.as_bytes()).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    async fn start(body: &str) -> (Worker, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let exe = fake_worker(dir.path(), body);
        let (worker, _) = Worker::spawn(&exe, &[], None, false, &Mounts::default(), None)
            .await
            .unwrap();
        (worker, dir)
    }

    fn soon() -> Deadline {
        Deadline::after(Duration::from_secs(5), Phase::HealthCheck)
    }

    #[tokio::test]
    async fn an_answer_for_another_call_is_a_violation() {
        let (mut w, _dir) = start("    send({'kind': 'pong', 'id': req['id'] + 1})").await;
        assert!(matches!(
            w.ping(soon()).await,
            Err(WorkerError::Protocol(_))
        ));
    }

    #[tokio::test]
    async fn a_huge_length_is_refused_before_allocating() {
        let (mut w, _dir) =
            start("    out.write(struct.pack('<I', 0xFFFFFFF0)); out.flush(); time.sleep(30)")
                .await;
        let e = w.ping(soon()).await.unwrap_err();
        assert!(
            matches!(
                e,
                WorkerError::Protocol(Violation::Frame(FrameError::TooLarge { .. }))
            ),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_worker_that_does_not_answer_meets_the_deadline() {
        let (mut w, _dir) = start("    time.sleep(30)").await;
        let started = Instant::now();
        let deadline = Deadline::after(Duration::from_millis(300), Phase::Scanning);
        let e = w.find_imports("import x", deadline).await.unwrap_err();
        assert!(
            matches!(
                e,
                WorkerError::Deadline {
                    phase: Phase::Scanning,
                    ..
                }
            ),
            "{e}"
        );
        assert!(started.elapsed() < Duration::from_secs(3));
    }

    #[tokio::test]
    async fn output_past_the_cap_stops_the_run() {
        let (mut w, _dir) = start(
            "    while True: send({'kind': 'output', 'id': req['id'], 'lines': [['stdout', 'x' * 1000]] * 100})",
        )
        .await;
        let mut kept = Vec::new();
        let request = RunRequest {
            code: "",
            globals: &serde_json::Map::new(),
            output_cap: 10_000,
            result_cap: 1000,
            keep_globals: false,
            image_cap: 0,
            checkpoint_follows: false,
        };
        let mut host = NetOnly(NetPolicy::new(Default::default(), 1 << 20));
        let deadline = Deadline::after(Duration::from_secs(20), Phase::Running);
        let e = w
            .run(request, deadline, &mut host, &mut |_, line| kept.push(line))
            .await
            .unwrap_err();
        assert!(matches!(e, WorkerError::OutputFlood { .. }), "{e}");
        let bytes: usize = kept.iter().map(|l| l.len() + 1).sum();
        assert!(bytes < 10_000 + 2_000, "{bytes}");
        assert_eq!(kept.last().unwrap(), &truncation_marker(10_000));
    }

    #[tokio::test]
    async fn a_second_answer_is_a_violation() {
        let (mut w, _dir) = start(
            "    send({'kind': 'pong', 'id': req['id']}); send({'kind': 'pong', 'id': req['id']})",
        )
        .await;
        w.ping(soon()).await.unwrap();
        assert!(matches!(
            w.ping(soon()).await,
            Err(WorkerError::Protocol(_))
        ));
    }
}
