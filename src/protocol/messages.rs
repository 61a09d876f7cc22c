//! The messages of the worker protocol: each [`Request`] of the front, each [`Reply`] of a
//! worker, and what they carry. Declared once here, typed end to end; both sides refuse a
//! field or a kind they do not know.
//!
//! Every request after `boot` carries a [`CallId`] chosen by the front, and every reply about it
//! repeats that id.

use super::fetch::{FetchRequest, FetchResponse};
use super::pages::ZygoteId;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Identifies one request of the front and the replies that belong to it.
pub type CallId = u64;

/// Output bytes a run may send past its output cap before the front stops it (bytes). A
/// well-behaved run never gets there: the Python helper stops forwarding at the cap; output
/// written below Python (`os.write`) or by JavaScript is counted by the front, which kills the
/// worker past `cap + OUTPUT_SLACK`.
pub const OUTPUT_SLACK: usize = 64 << 10;

/// Most images one run hands to the front (`--stateful`: files the call made in its working
/// directory, shown to the model as `image` content).
pub const MAX_IMAGES: usize = 8;

/// Most files a run lists in its working directory (runtime/python/runner.py's `_MAX_SCANNED`); a
/// longer list is a protocol violation.
pub const MAX_LISTED_FILES: usize = 1000;

/// A request from the front to a worker.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// The first frame a worker reads: how to boot. With `snapshot` `load`, it restores the
    /// memory snapshot whose descriptor it was given ([`SNAPSHOT_FD_ARG`](super::launch::SNAPSHOT_FD_ARG)); with `make`, it
    /// boots normally and sends a snapshot with [`Reply::Ready`].
    /// Its attachments are laid out as [`BootAttachments`] says: the `--mount` files' bytes,
    /// then `install`'s files (`--deps`), which the worker installs and imports once booted,
    /// before [`Reply::Ready`].
    Boot {
        snapshot: SnapshotMode,
        #[serde(default)]
        mount: MountPlan,
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
    /// Takes a checkpoint of the interpreter between runs (checkpoints, docs/architecture.md §3.4): answered by
    /// [`Reply::Checkpoint`] with the pages of linear memory that changed since the last one
    /// (`src/interpreter/linear_memory.rs`), or why its state cannot be captured.
    Checkpoint { id: CallId },
    /// Makes this fresh interpreter hold a checkpoint's state: grows its linear memory to
    /// `memory_bytes` and writes the pages (attachment 0: their indexes, `u32` little-endian
    /// each, strictly increasing; attachment 1: the pages, 4,096 bytes each, XOR-ed with
    /// the zygote's), then, with `reseed`, makes the next run reseed Python's `random` (a
    /// fork, as `os.fork` does). Only into a child of zygote `zygote`; answered by
    /// [`Reply::Restored`].
    Restore {
        id: CallId,
        zygote: ZygoteId,
        memory_bytes: u64,
        #[serde(default)]
        reseed: bool,
    },
    /// Makes the next run reseed Python's `random`, as `os.fork` does in a child: sent to an
    /// interpreter handed to a fork (`fork_sandbox`) that keeps running as the copy.
    /// Answered by [`Reply::Reseeded`].
    Reseed { id: CallId },
    /// Runs a throwaway call (fresh globals, nothing kept, no output) in an interpreter just
    /// restored off any caller's path (a fork's source resuming), so that the
    /// engine's pages a call writes are already copied from the zygote when the next call
    /// comes (~500 copy-on-write faults, ~1 ms). Answered by [`Reply::WarmedUp`].
    WarmUp { id: CallId },
    /// Answer to [`Reply::Fetch`]: a response per request, in order; attachment `i` is the
    /// `i`-th response's body (empty for a refusal).
    FetchResult {
        id: CallId,
        responses: Vec<FetchResponse>,
    },
    /// Answer to [`Reply::ToolCall`] and [`Reply::FunctionCall`] (code mode):
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
        /// What the run's code may do on the network (`--allow-net`); `None`: nothing. Sent
        /// with every run, since the interpreter may come from a zygote that other servers'
        /// calls share.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        network: Option<RunNetwork>,
        /// The front takes a checkpoint once this run ends ([`Request::Checkpoint`]): a fresh
        /// fork's allocator scavenger waits for it (`worker_main.rs` `Scavenger`).
        #[serde(default)]
        checkpoint_follows: bool,
    },
}

/// What a run's code may do on the network, as the interpreter's HTTP bridge needs it
/// (`runtime/python/http_bridge.py`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunNetwork {
    /// Put in the sandbox's `os.environ` before the code runs: each `--secret`'s name and
    /// placeholder (never a value; `src/worker/net/secrets.rs`).
    pub environment: Vec<(String, String)>,
    /// Most requests the code may have in flight at once (`--max-concurrent-fetches`): the
    /// most one [`Reply::Fetch`] may carry.
    pub concurrency: u32,
}

/// A call of an upstream MCP tool by user code (code mode): the server's name in
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

/// What the worker makes: folders, then files (absolute sandbox paths); the files' bytes follow
/// each other in one attachment, in this order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MountPlan {
    /// Folders to make (each mount's root first), made read-only once filled.
    pub folders: Vec<String>,
    /// Files (path, length in bytes).
    pub files: Vec<(String, u64)>,
}

impl MountPlan {
    /// Whether there is nothing to mount.
    pub fn is_empty(&self) -> bool {
        self.folders.is_empty()
    }

    /// Checks a plan against the bytes that came with it (a worker's check of its boot
    /// request): the lengths add up, and every path is absolute.
    pub fn fits(&self, bytes: &[u8]) -> bool {
        let total = self
            .files
            .iter()
            .try_fold(0u64, |sum, (_, n)| sum.checked_add(*n));
        total == Some(bytes.len() as u64)
            && self
                .folders
                .iter()
                .chain(self.files.iter().map(|(p, _)| p))
                .all(|p| p.starts_with('/'))
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
    /// User code of call `id` asks for HTTP requests, made at once (at most the run's
    /// [`RunNetwork::concurrency`]; one for the blocking libraries); attachment `i` is the
    /// `i`-th request's body. The worker waits for [`Request::FetchResult`].
    Fetch {
        id: CallId,
        requests: Vec<FetchRequest>,
    },
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
        zygote: ZygoteId,
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
    /// `count` files are open (Emscripten's streams are JavaScript objects; WASI's descriptors
    /// are the scientific worker's own, outside the guest's memory).
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

/// Largest memory snapshot (bytes) a booting worker may hand over, or restore; Pyodide's is
/// ~30 MiB.
pub const MAX_SNAPSHOT_BYTES: usize = 512 << 20;

/// How a worker boots Pyodide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotMode {
    /// Plain boot.
    None,
    /// Plain boot, then hand a memory snapshot to the front.
    Make,
    /// Restore the memory snapshot named by [`SNAPSHOT_FD_ARG`](super::launch::SNAPSHOT_FD_ARG) (much faster than a plain
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

/// How a run ended. Made by the Python helper (`runtime/python/runner.py`) as one JSON object and
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
    /// Microseconds the code took, with its result's text, as the runner measured them: for
    /// the per-call timing line (`call::CallTiming`, issue 49). 0 when the runtime failed
    /// before the code ran.
    #[serde(default)]
    pub code_us: u64,
    /// Microseconds the worker spent on the run, from the decoded request to this outcome
    /// (the engine's entry into the runtime and back, the runner, the code); set by the worker
    /// before it encodes the reply. Timing only: never trusted for anything else.
    #[serde(default)]
    pub worker_us: u64,
    /// When the run's request said a checkpoint follows (`checkpoint_follows`): why the state
    /// the run left cannot be captured (empty: it can), checked by the worker once the run
    /// ended, so that the front words the call's `state` note with its answer and asks for no
    /// checkpoint that would say the same. `None` otherwise. Set by the worker, never by the
    /// runtime's own answer; the checkpoint itself checks again.
    #[serde(default)]
    pub uncapturable: Option<Vec<Uncapturable>>,
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
