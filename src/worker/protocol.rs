//! The worker protocol: framed messages between the front and a sandbox worker, over the
//! worker's stdin (requests) and stdout (replies). Declared once here, typed end to end.
//!
//! A frame is: `u32` little-endian length of a JSON header, the header (a [`Request`] or
//! [`Reply`]), a `u32` count of binary attachments, then each attachment as a `u64` length and
//! its bytes. Attachments carry package files and snapshots so that bytes are never
//! base64-inflated.
//!
//! Every request after `boot` carries a [`CallId`] chosen by the front, and every reply about it
//! repeats that id. The front treats the worker as hostile (docs/architecture.md §3): it reads replies under a
//! [`FrameLimits`] chosen per phase (so a worker cannot make the front allocate more than the
//! phase's caps), and a reply for another call, a second answer, or any frame outside a call is
//! a protocol violation that ends the worker.

use super::net::{FetchRequest, FetchResponse};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::io::{self, Read, Write};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Identifies one request of the front and the replies that belong to it.
pub type CallId = u64;

/// Most images one run hands to the front (`--stateful`: files the call made in its working
/// directory, shown to the model as `image` content).
pub const MAX_IMAGES: usize = 8;

/// Most files a run lists in its working directory (python/runner.py's `_MAX_SCANNED`); a
/// longer list is a protocol violation.
pub const MAX_LISTED_FILES: usize = 1000;

/// Largest header a worker accepts from the front (bytes); code is capped well below this.
pub const MAX_REQUEST_HEADER: usize = 256 << 20;
/// Largest single attachment a worker accepts from the front (bytes): a package file.
pub const MAX_REQUEST_ATTACHMENT: usize = 1 << 30;
/// Most attachments in one frame from the front (package files of one install).
pub const MAX_REQUEST_ATTACHMENTS: usize = 4096;

/// Bounds on one frame read: what the reader may allocate for it, checked before allocating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLimits {
    /// Largest JSON header (bytes).
    pub header: usize,
    /// Most attachments.
    pub attachments: usize,
    /// Largest single attachment (bytes).
    pub attachment: usize,
}

impl FrameLimits {
    /// What a worker accepts from the (trusted) front.
    pub const REQUEST: FrameLimits = FrameLimits {
        header: MAX_REQUEST_HEADER,
        attachments: MAX_REQUEST_ATTACHMENTS,
        attachment: MAX_REQUEST_ATTACHMENT,
    };

    /// Small control replies (`pong`, `imports`, `installed`, `fatal`): 1 MiB, no attachment.
    pub const CONTROL: FrameLimits = FrameLimits {
        header: 1 << 20,
        attachments: 0,
        attachment: 0,
    };
}

/// A request from the front to a worker.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// The first frame a worker reads: how to boot. With `snapshot` `load`, it restores the
    /// memory snapshot whose descriptor it was given ([`SNAPSHOT_FD_ARG`]); with `make`, it
    /// boots normally and sends a snapshot with [`Reply::Ready`].
    /// Its attachments are laid out as [`BootAttachments`] says: the `--mount` files' bytes,
    /// then `install`'s files (`--deps`), which the worker installs and imports once booted,
    /// before [`Reply::Ready`].
    Boot {
        snapshot: SnapshotMode,
        #[serde(default)]
        mount: super::mount::MountPlan,
        #[serde(default)]
        install: Option<BootInstall>,
    },
    /// A health check: the worker answers [`Reply::Pong`] at once.
    Ping { id: CallId },
    /// Top-level imports of `code`, minus the standard library (Pyodide's `find_imports`).
    FindImports { id: CallId, code: String },
    /// Makes `files` (attachment `i` at virtual path `files[i]`) available, then loads `items`
    /// with `pyodide.loadPackage` (lock-file package names or wheel paths).
    Install {
        id: CallId,
        files: Vec<String>,
        items: Vec<String>,
    },
    /// The bytes of file `path` under the working directory (`--stateful`: a session's files
    /// are its MCP resources), if it has at most `cap` bytes.
    ReadFile {
        id: CallId,
        path: String,
        cap: usize,
    },
    /// Writes attachment 0 to file `path` under the working directory (making its folders),
    /// or, with `delete`, removes that file (`--stateful`: `upload_file`, `delete_file`).
    /// Answered by [`Reply::File`] without bytes.
    WriteFile {
        id: CallId,
        path: String,
        #[serde(default)]
        delete: bool,
    },
    /// Takes a checkpoint of the interpreter between runs (issue 36): answered by
    /// [`Reply::Checkpoint`] with the pages of linear memory that changed since the last one
    /// (`src/worker/linear_memory.rs`), or why its state cannot be captured.
    Checkpoint { id: CallId },
    /// Makes this fresh interpreter hold a checkpoint's state: grows its linear memory to
    /// `memory_bytes` and writes the pages (attachment 0: their indexes, `u32` little-endian
    /// each, strictly increasing; attachment 1: the pages, 4,096 bytes each, XOR-ed with
    /// the zygote's), then, with `reseed`, makes the next run reseed Python's `random` (a
    /// fork, as `os.fork` does). Only into a child of zygote `zygote`; answered by
    /// [`Reply::Restored`].
    Restore {
        id: CallId,
        zygote: super::linear_memory::ZygoteId,
        memory_bytes: u64,
        #[serde(default)]
        reseed: bool,
    },
    /// Makes the next run reseed Python's `random`, as `os.fork` does in a child: sent to an
    /// interpreter handed to a fork (`fork_sandbox`, issue 36) that keeps running as the copy.
    /// Answered by [`Reply::Reseeded`].
    Reseed { id: CallId },
    /// Runs a throwaway call (fresh globals, nothing kept, no output) in an interpreter just
    /// restored off any caller's path (a fork's source resuming, issue 36), so that the
    /// engine's pages a call writes are already copied from the zygote when the next call
    /// comes (~500 copy-on-write faults, ~1 ms). Answered by [`Reply::WarmedUp`].
    WarmUp { id: CallId },
    /// Answer to [`Reply::Fetch`]; the body is attachment 0.
    FetchResult { id: CallId, response: FetchResponse },
    /// Answer to [`Reply::ToolCall`] and [`Reply::FunctionCall`] (code mode, issue 28):
    /// attachment `i` holds the bytes of the answer's `i`-th image.
    ToolResult { id: CallId, answer: ToolAnswer },
    /// Runs `code` with fresh globals plus `globals` (with `keep_globals`, in the globals the
    /// interpreter's earlier `keep_globals` runs left, plus `globals`: `--stateful`). Output
    /// beyond `output_cap` bytes is cut; a return value whose text is longer than
    /// `result_cap` bytes is replaced by an error.
    Run {
        id: CallId,
        code: String,
        globals: serde_json::Map<String, serde_json::Value>,
        output_cap: usize,
        result_cap: usize,
        #[serde(default)]
        keep_globals: bool,
        /// With `keep_globals`: the largest image (bytes) the run's [`RunOutcome::images`] may
        /// carry; 0 for none.
        #[serde(default)]
        image_cap: usize,
        /// Code mode: the tools `import mcp_tools` offers (`upstream::catalog::Catalog` as
        /// JSON), sent when they differ from what the interpreter was last given; `None`:
        /// unchanged.
        #[serde(default)]
        tools: Option<serde_json::Value>,
        /// The front takes a checkpoint once this run ends ([`Request::Checkpoint`]): a fresh
        /// fork's allocator scavenger waits for it (`worker_main.rs` `Scavenger`).
        #[serde(default)]
        checkpoint_follows: bool,
    },
}

/// A call of an upstream MCP tool by user code (code mode, issue 28): the server's name in
/// `--tools-config` and the tool's name upstream.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCall {
    pub server: String,
    pub tool: String,
    #[serde(default)]
    pub arguments: serde_json::Map<String, serde_json::Value>,
}

/// A call of a host function by user code (code mode's `code_sandbox(functions=…)`):
/// `function(*args, **kwargs)` in the process that launched the server. Answered by
/// [`Request::ToolResult`], with [`ToolAnswer::Structured`] (the return value) or
/// [`ToolAnswer::Error`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionCall {
    pub function: String,
    #[serde(default)]
    pub args: Vec<serde_json::Value>,
    #[serde(default)]
    pub kwargs: serde_json::Map<String, serde_json::Value>,
}

/// What a [`ToolCall`] gave, as the sandbox's `mcp_tools` turns it into Python values.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ToolAnswer {
    /// The tool's `structuredContent`.
    Structured { value: serde_json::Value },
    /// The tool's content blocks (without structured content).
    Content { items: Vec<ToolItem> },
    /// The tool failed (`isError`), could not be reached, or a limit of the call was reached:
    /// `mcp_tools.ToolError` with this message.
    Error { message: String },
}

/// One content block of a [`ToolAnswer::Content`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ToolItem {
    Text {
        text: String,
    },
    /// An image whose `size` bytes are the frame's next attachment.
    Image {
        mime_type: String,
        size: usize,
    },
    /// Any other block (audio, an embedded resource, a resource link), as MCP writes it.
    Other {
        value: serde_json::Value,
    },
}

/// The attachments of a [`Request::Boot`], in their declared order: the `--mount` files'
/// bytes one after another (one attachment, present only when the mount plan is not empty),
/// then one attachment per file of [`BootInstall::files`]. Both sides go through this type.
#[derive(Debug, Default)]
pub struct BootAttachments<B> {
    /// The `--mount` files' bytes.
    pub mount: Option<B>,
    /// The install files' bytes, in the order of [`BootInstall::files`].
    pub install: Vec<B>,
}

impl<B: AsRef<[u8]>> BootAttachments<B> {
    /// The frame's attachments, in order.
    pub fn to_frame(&self) -> Vec<&[u8]> {
        self.mount
            .iter()
            .chain(&self.install)
            .map(AsRef::as_ref)
            .collect()
    }
}

impl BootAttachments<Vec<u8>> {
    /// Takes a boot frame's attachments apart: `mounted` says whether the mount plan has
    /// files, `install_files` how many files the install names.
    ///
    /// Errors: [`BootLayoutError`] when the count does not match.
    pub fn from_frame(
        attachments: Vec<Vec<u8>>,
        mounted: bool,
        install_files: usize,
    ) -> Result<Self, BootLayoutError> {
        let expected = usize::from(mounted) + install_files;
        if attachments.len() != expected {
            return Err(BootLayoutError {
                got: attachments.len(),
                expected,
            });
        }
        let mut attachments = attachments.into_iter();
        let mount = if mounted { attachments.next() } else { None };
        Ok(BootAttachments {
            mount,
            install: attachments.collect(),
        })
    }
}

/// A boot frame whose attachments do not match its mount plan and install.
#[derive(Debug, thiserror::Error)]
#[error("the boot frame has {got} attachments where its mount and packages declare {expected}")]
pub struct BootLayoutError {
    pub got: usize,
    pub expected: usize,
}

/// Packages a worker installs as it boots (`--deps`), so that its calls find them installed and
/// imported: [`Request::Install`]'s `files` and `items`, plus the distributions whose top-level
/// modules are imported then (`importlib.metadata.packages_distributions`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootInstall {
    pub files: Vec<String>,
    pub items: Vec<String>,
    pub imports: Vec<String>,
}

/// A message from a worker to the front.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Reply {
    /// Pyodide booted (`boot_ms` milliseconds, `restored` from a snapshot) and the worker sealed
    /// itself; sent once, after [`Request::Boot`]. When a snapshot was made it is attachment 0.
    /// `confinement` (`sandbox` on the wire) is the worker's one-line report of every
    /// confinement layer (`confine::describe`), `confined` whether all of them are on.
    Ready {
        pyodide_version: String,
        boot_ms: u64,
        restored: bool,
        /// Named `sandbox` on the wire since the first version of the protocol.
        #[serde(rename = "sandbox")]
        confinement: String,
        confined: bool,
        /// Why the boot's `install` failed (the worker then has none of its packages for
        /// sure); `None` when it succeeded or there was none.
        #[serde(default)]
        install_error: Option<String>,
    },
    /// Answer to [`Request::Ping`].
    Pong { id: CallId },
    /// Answer to [`Request::FindImports`].
    Imports { id: CallId, names: Vec<String> },
    /// Answer to [`Request::ReadFile`] (the bytes are attachment 0) and [`Request::WriteFile`]
    /// (no bytes), or `error` says why not.
    File { id: CallId, error: Option<String> },
    /// Answer to [`Request::Install`]: `error` is `None` on success.
    Installed { id: CallId, error: Option<String> },
    /// Lines written by user code (in order), sent while call `id` runs.
    Output { id: CallId, lines: Vec<OutputLine> },
    /// Answer to [`Request::Run`].
    Ran { id: CallId, outcome: RunOutcome },
    /// User code of call `id` asks for an HTTP request (body: attachment 0); the worker waits
    /// for [`Request::FetchResult`].
    Fetch { id: CallId, request: FetchRequest },
    /// User code of call `id` calls an upstream MCP tool (code mode); the worker waits for
    /// [`Request::ToolResult`].
    ToolCall { id: CallId, call: ToolCall },
    /// User code of call `id` calls a host function; the worker waits for
    /// [`Request::ToolResult`].
    FunctionCall { id: CallId, call: FunctionCall },
    /// Answer to [`Request::Checkpoint`].
    Checkpoint {
        id: CallId,
        outcome: CheckpointOutcome,
    },
    /// Answer to [`Request::Restore`]: `error` says why the state was not restored (the
    /// interpreter is then to be discarded).
    Restored { id: CallId, error: Option<String> },
    /// Answer to [`Request::Reseed`]: `error` says why not (the interpreter is then to be
    /// discarded).
    Reseeded { id: CallId, error: Option<String> },
    /// Answer to [`Request::WarmUp`]: `error` says why it failed (the interpreter is then to
    /// be discarded).
    WarmedUp { id: CallId, error: Option<String> },
    /// The worker cannot go on (boot failed, engine error); it exits after sending this.
    Fatal { error: String },
    /// Under `--confinement strict`, a confinement layer could not be applied (`reason` names it
    /// and says why); the worker exits after sending this, before running any code.
    Unconfined { reason: String },
}

impl Reply {
    /// The call this reply belongs to (`None` for `ready` and `fatal`).
    pub fn call_id(&self) -> Option<CallId> {
        match self {
            Reply::Ready { .. } | Reply::Fatal { .. } | Reply::Unconfined { .. } => None,
            Reply::Pong { id }
            | Reply::Imports { id, .. }
            | Reply::Installed { id, .. }
            | Reply::File { id, .. }
            | Reply::Output { id, .. }
            | Reply::Ran { id, .. }
            | Reply::Checkpoint { id, .. }
            | Reply::Restored { id, .. }
            | Reply::Reseeded { id, .. }
            | Reply::WarmedUp { id, .. }
            | Reply::Fetch { id, .. }
            | Reply::ToolCall { id, .. }
            | Reply::FunctionCall { id, .. } => Some(*id),
        }
    }

    /// The reply's kind, for error messages (never its content, which may be hostile).
    pub fn kind(&self) -> &'static str {
        match self {
            Reply::Ready { .. } => "ready",
            Reply::Pong { .. } => "pong",
            Reply::Imports { .. } => "imports",
            Reply::Installed { .. } => "installed",
            Reply::File { .. } => "file",
            Reply::Output { .. } => "output",
            Reply::Ran { .. } => "ran",
            Reply::Checkpoint { .. } => "checkpoint",
            Reply::Restored { .. } => "restored",
            Reply::Reseeded { .. } => "reseeded",
            Reply::WarmedUp { .. } => "warmed_up",
            Reply::Fetch { .. } => "fetch",
            Reply::ToolCall { .. } => "tool_call",
            Reply::FunctionCall { .. } => "function_call",
            Reply::Fatal { .. } => "fatal",
            Reply::Unconfined { .. } => "unconfined",
        }
    }
}

/// What a [`Request::Checkpoint`] found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case", deny_unknown_fields)]
pub enum CheckpointOutcome {
    /// The state was captured: `pages` pages changed since the last checkpoint (attachment 0:
    /// their indexes, attachment 1: their bytes XOR-ed with zygote `zygote`'s pages); linear
    /// memory is `memory_bytes` long.
    Taken {
        zygote: super::linear_memory::ZygoteId,
        memory_bytes: u64,
        pages: u32,
    },
    /// The state cannot be captured, for these reasons (at least one).
    Uncapturable { reasons: Vec<Uncapturable> },
}

/// Why an interpreter's state cannot be captured by a copy of its linear memory
/// (docs/checkpoint-research.md §5): what it holds lives elsewhere too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "why", rename_all = "snake_case", deny_unknown_fields)]
pub enum Uncapturable {
    /// It was not forked from a zygote (booted or restored from the snapshot): there is no
    /// pristine memory to measure it against.
    NotForked,
    /// Python holds `count` JavaScript objects (Pyodide's hiwire table is outside linear
    /// memory).
    JsObjects { count: u32 },
    /// `count` files are open (Emscripten's streams are JavaScript objects).
    OpenFiles { count: u32 },
    /// `count` shared libraries were loaded since the fork (their functions are in the
    /// WebAssembly table).
    LoadedLibraries { count: u32 },
    /// `count` callbacks are scheduled (asyncio tasks, timers) and have not run.
    PendingCallbacks { count: u32 },
    /// The interpreter could not say what it holds outside its memory (user code changed
    /// Pyodide's own objects).
    Unknown,
}

impl fmt::Display for Uncapturable {
    /// Words for the `state` note of a result (never the interpreter's content).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Uncapturable::NotForked => {
                f.write_str("the interpreter was not forked from the warm zygote")
            }
            Uncapturable::JsObjects { count } => {
                write!(
                    f,
                    "Python holds {count} JavaScript object(s) (for example from `import js`)"
                )
            }
            Uncapturable::OpenFiles { count } => write!(f, "{count} file(s) are open"),
            Uncapturable::LoadedLibraries { count } => write!(
                f,
                "{count} shared librar(y/ies) were loaded (a package with compiled code)"
            ),
            Uncapturable::Unknown => {
                f.write_str("the interpreter could not say what it holds outside its memory")
            }
            Uncapturable::PendingCallbacks { count } => write!(
                f,
                "{count} callback(s) are still scheduled (an asyncio task or timer not awaited)"
            ),
        }
    }
}

/// A message on a zygote's control socket (`fork_server.rs`, `zygote.rs`) or on the socket of
/// the per-host zygote service (`zygote_service/`): one JSON datagram of a `SOCK_SEQPACKET`
/// socket, its descriptors attached as `SCM_RIGHTS`, as many as [`Control::descriptors`] says.
/// The service relays `Fork`, `Forked` and `ForkFailed` between a front and its zygote
/// unchanged, so that a front forks the same way from either.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Control {
    /// Zygote → front, once: the zygote is single-threaded and serves fork requests.
    Forkable,
    /// Front → zygote (or service): fork one worker, whose stdin, stdout and stderr are attached.
    Fork,
    /// Zygote → front: the child's process id, its pidfd attached (the front kills it and
    /// sees it end by it; the zygote reaps it).
    Forked { pid: u32 },
    /// Zygote → front: the fork failed, and why.
    ForkFailed { reason: String },
    /// Service → front or operator, first on every connection: which service this is (the
    /// digest of what shapes its interpreters, `zygote_service::ServiceKey`) and its pid.
    Hello { digest: String, pid: u32 },
    /// Service → front, once its zygote is forkable: the packages every fork has (`--deps`,
    /// normalized name → version).
    Serving {
        installed: std::collections::BTreeMap<String, String>,
    },
    /// Operator → service: how it stands.
    Status,
    /// Service → operator: the answer to [`Control::Status`].
    StatusReport(ServiceStatus),
    /// Operator → service: end now (its zygote and every worker forked from it with it).
    Stop,
    /// Service → operator: the answer to [`Control::Stop`], sent before it ends.
    Stopping,
}

/// How a zygote service stands ([`Control::StatusReport`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceStatus {
    /// Whether its zygote forks (else it still warms up).
    pub ready: bool,
    /// Fronts connected (the asking connection not counted).
    pub fronts: usize,
    /// Workers forked for those fronts that still run.
    pub workers: usize,
    /// Seconds since the service started.
    pub uptime_s: u64,
    /// Seconds without a front after which it exits (`--zygote-idle-exit`).
    pub idle_exit_s: u64,
}

impl Control {
    /// How many descriptors the message carries.
    pub fn descriptors(&self) -> usize {
        match self {
            Control::Fork => 3,
            Control::Forked { .. } => 1,
            Control::Forkable
            | Control::ForkFailed { .. }
            | Control::Hello { .. }
            | Control::Serving { .. }
            | Control::Status
            | Control::StatusReport(_)
            | Control::Stop
            | Control::Stopping => 0,
        }
    }
}

/// Largest memory snapshot (bytes) a booting worker may hand over, or restore; Pyodide's is
/// ~30 MiB.
pub const MAX_SNAPSHOT_BYTES: usize = 512 << 20;

/// The worker argument that names the descriptor of the memory snapshot to restore
/// (`--snapshot-fd=N`, read-only, kept across `exec`): the worker maps the file instead of
/// receiving its bytes through its standard input.
pub const SNAPSHOT_FD_ARG: &str = "--snapshot-fd=";

/// How a worker boots Pyodide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotMode {
    /// Plain boot.
    None,
    /// Plain boot, then hand a memory snapshot to the front.
    Make,
    /// Restore the memory snapshot named by [`SNAPSHOT_FD_ARG`] (much faster than a plain
    /// boot).
    Load,
}

/// Which stream a line of output was written to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdout,
    Stderr,
}

/// One line of output: the stream and the text (without its newline).
pub type OutputLine = (Stream, String);

/// How a run ended, as the Python helper reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunStatus {
    Success,
    RunError,
}

/// How the last expression's value was turned into text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReturnKind {
    /// A `str`, as is.
    Str,
    /// JSON text (indent 2).
    Json,
    /// `repr()`, because JSON could not hold the value.
    Repr,
}

/// The last expression's value, as text of a known kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReturnValue {
    pub kind: ReturnKind,
    pub text: String,
}

/// How a run ended. Made by the Python helper (`python/runner.py`) as one JSON object and
/// parsed once, here; or by the worker when the runtime itself failed.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunOutcome {
    pub status: RunStatus,
    /// The last expression's value; absent for `None` and on errors.
    #[serde(default)]
    pub return_value: Option<ReturnValue>,
    /// Traceback and message when `status` is `run-error`.
    #[serde(default)]
    pub error: Option<String>,
    /// Whether output was cut at the cap.
    #[serde(default)]
    pub truncated: bool,
    /// The interpreter cannot be used again (it exited or aborted); the worker is ending.
    #[serde(default)]
    pub fatal: bool,
    /// Image files the run created or changed (paths under the working directory), at most
    /// [`MAX_IMAGES`]; in [`Reply::Ran`], attachment `i` holds the bytes of `images[i]`.
    #[serde(default)]
    pub images: Vec<String>,
    /// `--stateful`: the regular files under the working directory after the run (path, size
    /// in bytes), at most 1,000: the session's MCP resources.
    #[serde(default)]
    pub files: Vec<(String, u64)>,
    /// `--stateful`: the paths of `files` the run created or changed (`resource_link` content
    /// after the text).
    #[serde(default)]
    pub written: Vec<String>,
    /// `--stateful`: the paths of `files` that changed since the worker's previous such
    /// run, between runs too: the front reads them again for the copy it restores from.
    #[serde(default)]
    pub refresh: Vec<String>,
    /// The bytes of `images`, taken from the frame's attachments by the front (never encoded).
    #[serde(skip)]
    pub image_bytes: Vec<Vec<u8>>,
}

/// A decoded frame: its header and attachments.
pub struct Frame<T> {
    pub header: T,
    pub attachments: Vec<Vec<u8>>,
}

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("the pipe failed")]
    Io(#[from] io::Error),
    #[error("the frame's {what} ({size} bytes or items) is over its limit of {limit}")]
    TooLarge {
        what: &'static str,
        size: u64,
        limit: usize,
    },
    #[error("the frame header is not a valid message")]
    BadHeader(#[source] serde_json::Error),
    #[error("the message cannot be encoded")]
    Encode(#[source] serde_json::Error),
}

impl FrameError {
    /// Whether the stream ended (the peer closed its end or exited).
    pub fn is_eof(&self) -> bool {
        matches!(self, FrameError::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof)
    }
}

/// The frame's beginning: header length, header JSON and attachment count.
fn encode_head<T: Serialize>(header: &T, attachments: usize) -> Result<Vec<u8>, FrameError> {
    let json = serde_json::to_vec(header).map_err(FrameError::Encode)?;
    let len = u32::try_from(json.len()).map_err(|_| FrameError::TooLarge {
        what: "header",
        size: json.len() as u64,
        limit: u32::MAX as usize,
    })?;
    let mut head = Vec::with_capacity(json.len() + 8);
    head.extend_from_slice(&len.to_le_bytes());
    head.extend_from_slice(&json);
    let count = u32::try_from(attachments).map_err(|_| FrameError::TooLarge {
        what: "attachment count",
        size: attachments as u64,
        limit: u32::MAX as usize,
    })?;
    head.extend_from_slice(&count.to_le_bytes());
    Ok(head)
}

fn check(what: &'static str, size: u64, limit: usize) -> Result<usize, FrameError> {
    if size > limit as u64 {
        return Err(FrameError::TooLarge { what, size, limit });
    }
    Ok(size as usize)
}

/// `Ok(None)` for an end of stream before a frame starts.
fn at_frame_start(r: io::Result<()>) -> Result<Option<()>, FrameError> {
    match r {
        Ok(()) => Ok(Some(())),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Width of the header's length and of the attachment count (bytes, little-endian `u32`).
const U32_BYTES: usize = 4;
/// Width of an attachment's length (bytes, little-endian `u64`).
const U64_BYTES: usize = 8;

/// What a [`FrameDecoder`]'s buffer holds once filled.
#[derive(Clone, Copy)]
enum Step {
    HeaderLen,
    Header,
    Count,
    AttachmentLen,
    Attachment,
}

/// Decodes one frame from bytes its caller reads, without I/O of its own, so that the
/// blocking worker and the async front share one decoder. Each step names the exact bytes it
/// needs next ([`buffer`](Self::buffer)); the caller fills them (`read_exact`) and calls
/// [`filled`](Self::filled), which checks every length against the limits before the next
/// buffer is allocated. The header and attachments are read into their own buffers and move
/// into the [`Frame`] without a copy; lengths are read into a fixed scratch array.
struct FrameDecoder {
    limits: FrameLimits,
    step: Step,
    /// A length or count being read (its first `step.width()` bytes).
    scratch: [u8; U64_BYTES],
    /// The header or attachment being read.
    payload: Vec<u8>,
    json: Vec<u8>,
    /// Attachments still to read.
    remaining: usize,
    attachments: Vec<Vec<u8>>,
}

impl Step {
    /// Bytes of the length or count this step reads; `None` for a payload.
    fn width(self) -> Option<usize> {
        match self {
            Step::HeaderLen | Step::Count => Some(U32_BYTES),
            Step::AttachmentLen => Some(U64_BYTES),
            Step::Header | Step::Attachment => None,
        }
    }
}

impl FrameDecoder {
    fn new(limits: FrameLimits) -> Self {
        FrameDecoder {
            limits,
            step: Step::HeaderLen,
            scratch: [0; U64_BYTES],
            payload: Vec::new(),
            json: Vec::new(),
            remaining: 0,
            attachments: Vec::new(),
        }
    }

    /// The bytes to fill next.
    fn buffer(&mut self) -> &mut [u8] {
        match self.step.width() {
            Some(width) => &mut self.scratch[..width],
            None => &mut self.payload,
        }
    }

    /// The length or count just read (little-endian).
    fn number(&self) -> u64 {
        let mut b = [0u8; U64_BYTES];
        let width = self.step.width().unwrap_or(0);
        b[..width].copy_from_slice(&self.scratch[..width]);
        u64::from_le_bytes(b)
    }

    /// Takes the filled buffer in; `Ok(true)` once the frame is complete.
    fn filled(&mut self) -> Result<bool, FrameError> {
        match self.step {
            Step::HeaderLen => {
                self.payload = vec![0; check("header", self.number(), self.limits.header)?];
                self.step = Step::Header;
            }
            Step::Header => {
                self.json = std::mem::take(&mut self.payload);
                self.step = Step::Count;
            }
            Step::Count => {
                let count = check("attachment count", self.number(), self.limits.attachments)?;
                self.attachments = Vec::with_capacity(count);
                self.remaining = count;
                return Ok(self.next_attachment());
            }
            Step::AttachmentLen => {
                self.payload = vec![0; check("attachment", self.number(), self.limits.attachment)?];
                self.step = Step::Attachment;
            }
            Step::Attachment => {
                self.attachments.push(std::mem::take(&mut self.payload));
                self.remaining -= 1;
                return Ok(self.next_attachment());
            }
        }
        Ok(false)
    }

    /// Asks for the next attachment's length; `true` when there is none left.
    fn next_attachment(&mut self) -> bool {
        self.step = Step::AttachmentLen;
        self.remaining == 0
    }

    /// The complete frame, its header decoded.
    fn finish<T: for<'de> Deserialize<'de>>(self) -> Result<Frame<T>, FrameError> {
        Ok(Frame {
            header: serde_json::from_slice(&self.json).map_err(FrameError::BadHeader)?,
            attachments: self.attachments,
        })
    }
}

/// Writes one frame (blocking; used by the worker).
pub fn write_frame<T: Serialize>(
    w: &mut impl Write,
    header: &T,
    attachments: &[&[u8]],
) -> Result<(), FrameError> {
    w.write_all(&encode_head(header, attachments.len())?)?;
    for a in attachments {
        w.write_all(&(a.len() as u64).to_le_bytes())?;
        w.write_all(a)?;
    }
    Ok(w.flush()?)
}

/// Reads one frame within `limits` (blocking). `Ok(None)` at a clean end of stream.
pub fn read_frame<T: for<'de> Deserialize<'de>>(
    r: &mut impl Read,
    limits: FrameLimits,
) -> Result<Option<Frame<T>>, FrameError> {
    let mut decoder = FrameDecoder::new(limits);
    if at_frame_start(r.read_exact(decoder.buffer()))?.is_none() {
        return Ok(None);
    }
    while !decoder.filled()? {
        r.read_exact(decoder.buffer())?;
    }
    decoder.finish().map(Some)
}

/// Writes one frame (async; used by the front toward a worker): the header, then each
/// attachment, given as parts written one after another (the pages of a checkpoint, shared with
/// the front's copy of it, are parts): on the wire, the same frame as [`write_frame`] writes of
/// their concatenation, with vectored writes, never copied into one buffer.
pub async fn write_frame_parts_async<T: Serialize>(
    w: &mut (impl tokio::io::AsyncWrite + Unpin),
    header: &T,
    attachments: &[&[&[u8]]],
) -> Result<(), FrameError> {
    w.write_all(&encode_head(header, attachments.len())?)
        .await?;
    for parts in attachments {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        w.write_all(&(len as u64).to_le_bytes()).await?;
        write_all_vectored(w, parts).await?;
    }
    Ok(w.flush().await?)
}

/// Most slices one vectored write is given (Linux's `IOV_MAX`).
const MAX_IO_SLICES: usize = 1024;

/// Writes `parts` whole, in order, [`MAX_IO_SLICES`] at a time.
async fn write_all_vectored(
    w: &mut (impl tokio::io::AsyncWrite + Unpin),
    parts: &[&[u8]],
) -> io::Result<()> {
    // Empty parts are left out: a vectored write of only empty slices writes nothing.
    let mut slices: Vec<io::IoSlice<'_>> = parts
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| io::IoSlice::new(p))
        .collect();
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        let batch = rest.len().min(MAX_IO_SLICES);
        let written = w.write_vectored(&rest[..batch]).await?;
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        io::IoSlice::advance_slices(&mut rest, written);
    }
    Ok(())
}

/// Reads one frame within `limits` (async; used by the front on a hostile worker's stdout).
/// Every length is checked before anything is allocated for it. `Ok(None)` at a clean end of
/// stream.
pub async fn read_frame_async<T: for<'de> Deserialize<'de>>(
    r: &mut (impl tokio::io::AsyncRead + Unpin),
    limits: FrameLimits,
) -> Result<Option<Frame<T>>, FrameError> {
    let mut decoder = FrameDecoder::new(limits);
    if at_frame_start(r.read_exact(decoder.buffer()).await.map(|_| ()))?.is_none() {
        return Ok(None);
    }
    while !decoder.filled()? {
        r.read_exact(decoder.buffer()).await?;
    }
    decoder.finish().map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attachment_count_past_the_frame_format_is_refused() {
        assert!(encode_head(&"x", 3).is_ok());
        if let Ok(too_many) = usize::try_from(u64::from(u32::MAX) + 1) {
            assert!(matches!(
                encode_head(&"x", too_many),
                Err(FrameError::TooLarge {
                    what: "attachment count",
                    ..
                })
            ));
        }
    }

    #[test]
    fn a_boot_carries_its_packages_or_none() {
        let plain: Request = serde_json::from_str(r#"{"op":"boot","snapshot":"load"}"#).unwrap();
        assert!(matches!(plain, Request::Boot { install: None, .. }));
        let with: Request = serde_json::from_str(
            r#"{"op":"boot","snapshot":"none","install":{"files":["/packages/a.whl"],"items":["/packages/a.whl"],"imports":["a"]}}"#,
        )
        .unwrap();
        assert!(
            matches!(with, Request::Boot { install: Some(ref i), .. } if i.imports == ["a"] && i.files.len() == 1)
        );
        // An unknown field in the packages is refused, as everywhere in the protocol.
        assert!(serde_json::from_str::<Request>(
            r#"{"op":"boot","snapshot":"none","install":{"files":[],"items":[],"imports":[],"run":"x"}}"#
        )
        .is_err());
    }

    #[test]
    fn a_boot_frame_lays_out_its_attachments_as_declared() {
        let sent = BootAttachments {
            mount: Some(b"mounted".as_slice()),
            install: vec![b"a.whl".as_slice(), b"b.whl".as_slice()],
        };
        let frame: Vec<Vec<u8>> = sent.to_frame().iter().map(|a| a.to_vec()).collect();
        let got = BootAttachments::from_frame(frame.clone(), true, 2).unwrap();
        assert_eq!(got.mount.as_deref(), Some(b"mounted".as_slice()));
        assert_eq!(got.install, vec![b"a.whl".to_vec(), b"b.whl".to_vec()]);
        // Without a mount, the first attachment is the first install file.
        let got = BootAttachments::from_frame(frame[1..].to_vec(), false, 2).unwrap();
        assert_eq!((got.mount, got.install.len()), (None, 2));
        // Any other count is refused.
        assert!(BootAttachments::from_frame(frame.clone(), false, 2).is_err());
        assert!(BootAttachments::from_frame(frame, true, 1).is_err());
    }

    #[test]
    fn control_messages_declare_their_descriptors() {
        for (message, fds) in [
            (Control::Forkable, 0),
            (Control::Fork, 3),
            (Control::Forked { pid: 7 }, 1),
            (Control::ForkFailed { reason: "x".into() }, 0),
        ] {
            assert_eq!(message.descriptors(), fds);
            let json = serde_json::to_string(&message).unwrap();
            assert_eq!(serde_json::from_str::<Control>(&json).unwrap(), message);
        }
        assert!(serde_json::from_str::<Control>(r#"{"kind":"forked"}"#).is_err());
        assert!(serde_json::from_str::<Control>(r#"{"kind":"exec"}"#).is_err());
    }

    #[test]
    fn frames_round_trip_with_attachments() {
        let mut buf = Vec::new();
        let request = Request::Install {
            id: 7,
            files: vec!["/packages/a.whl".into()],
            items: vec!["a".into()],
        };
        write_frame(&mut buf, &request, &[b"wheel bytes"]).unwrap();
        let frame: Frame<Request> = read_frame(&mut buf.as_slice(), FrameLimits::REQUEST)
            .unwrap()
            .unwrap();
        assert!(
            matches!(frame.header, Request::Install { id: 7, ref items, .. } if items == &["a".to_string()])
        );
        assert_eq!(frame.attachments, vec![b"wheel bytes".to_vec()]);
        assert!(
            read_frame::<Request>(&mut &buf[buf.len()..], FrameLimits::REQUEST)
                .unwrap()
                .is_none()
        );
    }

    #[tokio::test]
    async fn the_blocking_and_async_readers_agree_frame_by_frame() {
        let mut buf = Vec::new();
        let attachments: [&[u8]; 3] = [b"first", b"", b"third"];
        write_frame(&mut buf, &Reply::Pong { id: 1 }, &[]).unwrap();
        let install = Request::Install {
            id: 2,
            files: vec!["/a.whl".into(), "/b.whl".into(), "/c.whl".into()],
            items: vec![],
        };
        write_frame(&mut buf, &install, &attachments).unwrap();
        let (mut sync_r, mut async_r) = (buf.as_slice(), buf.as_slice());
        let limits = FrameLimits::REQUEST;
        let first: Frame<Reply> = read_frame(&mut sync_r, limits).unwrap().unwrap();
        let first_async: Frame<Reply> = read_frame_async(&mut async_r, limits)
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(first.header, Reply::Pong { id: 1 }) && first.attachments.is_empty());
        assert!(
            matches!(first_async.header, Reply::Pong { id: 1 })
                && first_async.attachments.is_empty()
        );
        let second: Frame<Request> = read_frame(&mut sync_r, limits).unwrap().unwrap();
        let second_async: Frame<Request> = read_frame_async(&mut async_r, limits)
            .await
            .unwrap()
            .unwrap();
        let expected: Vec<Vec<u8>> = attachments.iter().map(|a| a.to_vec()).collect();
        assert_eq!(second.attachments, expected);
        assert_eq!(second_async.attachments, expected);
        assert!(read_frame::<Reply>(&mut sync_r, limits).unwrap().is_none());
        assert!(read_frame_async::<Reply>(&mut async_r, limits)
            .await
            .unwrap()
            .is_none());
    }

    #[tokio::test]
    async fn a_frame_cut_short_is_an_error_not_an_end() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &Reply::Pong { id: 1 }, &[b"attachment"]).unwrap();
        let limits = FrameLimits::REQUEST;
        // A stream that ends within the header's length counts as ended (read_exact does not
        // say how much it read); from there on, the frame is cut.
        for cut in U32_BYTES..buf.len() {
            let short = &buf[..cut];
            let err = read_frame::<Reply>(&mut &short[..], limits)
                .err()
                .expect("cut frame");
            assert!(err.is_eof(), "{cut}: {err}");
            let err = read_frame_async::<Reply>(&mut &short[..], limits)
                .await
                .err()
                .expect("cut frame");
            assert!(err.is_eof(), "{cut}: {err}");
        }
    }

    #[test]
    fn lengths_over_the_limits_are_refused_before_allocating() {
        // A header claiming 4 GiB - 1 bytes must be refused, not allocated.
        let mut buf = u32::MAX.to_le_bytes().to_vec();
        buf.extend_from_slice(&[0; 16]);
        assert!(matches!(
            read_frame::<Reply>(&mut buf.as_slice(), FrameLimits::CONTROL),
            Err(FrameError::TooLarge { what: "header", .. })
        ));
        // An attachment on a control reply is refused too.
        let mut buf = Vec::new();
        write_frame(&mut buf, &Reply::Pong { id: 1 }, &[b"x"]).unwrap();
        assert!(matches!(
            read_frame::<Reply>(&mut buf.as_slice(), FrameLimits::CONTROL),
            Err(FrameError::TooLarge { .. })
        ));
    }

    #[test]
    fn unknown_fields_and_kinds_are_refused() {
        let json = br#"{"kind":"pong","id":1,"extra":true}"#;
        assert!(serde_json::from_slice::<Reply>(json).is_err());
        let json = br#"{"kind":"surprise"}"#;
        assert!(serde_json::from_slice::<Reply>(json).is_err());
    }

    #[test]
    fn the_ready_reply_names_its_confinement_report_sandbox_on_the_wire() {
        let json = br#"{"kind":"ready","pyodide_version":"v","boot_ms":1,"restored":false,"sandbox":"confinement off","confined":false}"#;
        let ready: Reply = serde_json::from_slice(json).unwrap();
        assert!(
            matches!(ready, Reply::Ready { ref confinement, .. } if confinement == "confinement off")
        );
        let back = serde_json::to_value(&ready).unwrap();
        assert_eq!(back["sandbox"], "confinement off");
    }

    #[test]
    fn outcomes_parse_from_the_helpers_json() {
        let json =
            r#"{"status":"success","return_value":{"kind":"json","text":"[1]"},"truncated":false}"#;
        let o: RunOutcome = serde_json::from_str(json).unwrap();
        assert_eq!(o.status, RunStatus::Success);
        assert_eq!(o.return_value.unwrap().kind, ReturnKind::Json);
    }

    #[test]
    fn the_zygote_services_messages_keep_their_wire_shape_and_carry_no_descriptors() {
        let status = Control::StatusReport(ServiceStatus {
            ready: true,
            fronts: 2,
            workers: 3,
            uptime_s: 4,
            idle_exit_s: 600,
        });
        let wire = serde_json::to_value(&status).unwrap();
        assert_eq!(wire["kind"], "status_report");
        assert_eq!(wire["fronts"], 2);
        let back: Control = serde_json::from_value(wire).unwrap();
        assert_eq!(back, status);
        let hello: Control =
            serde_json::from_str(r#"{"kind":"hello","digest":"ab","pid":7}"#).unwrap();
        assert_eq!(
            hello,
            Control::Hello {
                digest: "ab".into(),
                pid: 7
            }
        );
        for message in [
            hello,
            status,
            Control::Status,
            Control::Stop,
            Control::Stopping,
        ] {
            assert_eq!(message.descriptors(), 0, "{message:?}");
        }
        assert_eq!(Control::Fork.descriptors(), 3);
        // A peer cannot smuggle fields into a message that has fields.
        let smuggled = r#"{"kind":"hello","digest":"ab","pid":7,"more":1}"#;
        assert!(serde_json::from_str::<Control>(smuggled).is_err());
    }
}
