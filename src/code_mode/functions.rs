//! Host functions (code mode, docs/architecture.md §11): Python callables of the process that launched this binary
//! (`mcp_run_python.code_sandbox(functions=…)`), which sandboxed code awaits by name as
//! globals; a failure raises `mcp_run_python.FunctionError` inside.
//!
//! They travel over a private channel, never the MCP connection: a UNIX socket the launcher
//! listens on in a directory only its user can enter, named by `--functions-socket`, to which
//! the binary connects once at start. The launcher accepts one connection only. Messages are
//! JSON lines, declared here ([`FromLauncher`], [`ToLauncher`]) and in
//! pysrc/mcp_run_python/_functions.py: the launcher's `hello` names its functions; then each
//! call is `call` → `result` or `error` with the call's id, and `cancel` when the run that made
//! it ends first (its deadline, a cancelled MCP call).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::oneshot;

/// How long the launcher may take to say which functions it has (seconds).
const HELLO_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest `hello` line (bytes).
const MAX_HELLO_BYTES: u64 = 1 << 20;

/// Most functions one launcher offers.
const MAX_FUNCTIONS: usize = 256;

/// One host function as the launcher describes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionSpec {
    /// Its name, a Python identifier: the global sandboxed code calls.
    pub name: String,
    /// Its signature as Python writes it (`(a: int, b: int = 1) -> int`), for `help()`.
    #[serde(default)]
    pub signature: String,
    /// Its docstring.
    #[serde(default)]
    pub doc: String,
}

/// A line from the launcher.
#[derive(Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
enum FromLauncher {
    /// The first line: the functions it offers.
    Hello { functions: Vec<FunctionSpec> },
    /// Call `id` returned `value`.
    Result { id: u64, value: Value },
    /// Call `id` raised: the exception's type name and message.
    Error {
        id: u64,
        #[serde(rename = "type")]
        type_name: String,
        message: String,
    },
}

/// A line to the launcher.
#[derive(Debug, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum ToLauncher<'a> {
    /// Calls `function(*args, **kwargs)` for the sandbox tagged `sandbox`.
    Call {
        id: u64,
        function: &'a str,
        args: &'a [Value],
        kwargs: &'a Map<String, Value>,
        sandbox: &'a str,
    },
    /// The run that made call `id` ended first: the launcher cancels it.
    Cancel { id: u64 },
}

/// Why the channel could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    #[error("--functions-socket {path}: cannot connect")]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--functions-socket {path}: the launcher did not name its functions within {} s", HELLO_TIMEOUT.as_secs())]
    Silent { path: PathBuf },
    #[error("--functions-socket {path}: the launcher's first line is not a `hello` naming at most {MAX_FUNCTIONS} functions")]
    Hello { path: PathBuf },
}

/// Why a host function call failed. It is never an error of the run: user code sees the text
/// as `mcp_run_python.FunctionError` (a `ToolAnswer::Error`).
#[derive(Debug, thiserror::Error)]
pub enum FunctionCallError {
    /// The launcher offers no host functions (no `--functions-socket`).
    #[error("this server has no host functions")]
    NoFunctions,
    /// The launcher offers no function of that name.
    #[error("there is no host function {name:?}")]
    NoSuchFunction { name: String },
    /// The run's tool calls reached a limit (host function calls count as tool calls).
    #[error(transparent)]
    Budget(#[from] super::BudgetExceeded),
    /// The call could not be put in a line: the encoder's words.
    #[error("{0}")]
    Encode(#[source] serde_json::Error),
    /// Writing to the launcher failed.
    #[error("the launcher's function channel failed: {0}")]
    Write(#[source] std::io::Error),
    /// The channel closed before the answer came.
    #[error("the launcher's function channel closed")]
    Closed,
    /// The function raised: the exception's type name and message, in the launcher's words.
    #[error("{type_name}: {message}")]
    Raised { type_name: String, message: String },
}

/// How a call ended, as the launcher said.
type Answer = Result<Value, FunctionCallError>;

/// Calls waiting for their answer, by id.
type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Answer>>>>;

/// The open channel to the launcher.
pub struct Channel {
    pub functions: Vec<FunctionSpec>,
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    pending: Pending,
    next_id: AtomicU64,
}

impl Channel {
    /// Connects to the launcher at `path` and reads its `hello`; answers are then read in the
    /// background, each at most `max_line` bytes (a longer one ends the channel).
    ///
    /// Errors: [`ChannelError`] when the socket cannot be reached or the first line is not a
    /// well-formed `hello`.
    pub async fn open(path: &Path, max_line: usize) -> Result<Arc<Channel>, ChannelError> {
        let stream = tokio::net::UnixStream::connect(path)
            .await
            .map_err(|source| ChannelError::Connect {
                path: path.to_owned(),
                source,
            })?;
        let (read, write) = stream.into_split();
        let mut reader = BufReader::new(read);
        let hello = tokio::time::timeout(HELLO_TIMEOUT, read_line(&mut reader, MAX_HELLO_BYTES))
            .await
            .map_err(|_| ChannelError::Silent {
                path: path.to_owned(),
            })?;
        let functions = match hello.map(|l| serde_json::from_slice::<FromLauncher>(&l)) {
            Some(Ok(FromLauncher::Hello { functions })) if functions.len() <= MAX_FUNCTIONS => {
                functions
            }
            _ => {
                return Err(ChannelError::Hello {
                    path: path.to_owned(),
                })
            }
        };
        let pending: Pending = Arc::default();
        tokio::spawn(read_answers(reader, pending.clone(), max_line as u64));
        Ok(Arc::new(Channel {
            functions,
            writer: tokio::sync::Mutex::new(write),
            pending,
            next_id: AtomicU64::new(1),
        }))
    }

    /// Calls `function(*args, **kwargs)` in the launcher for the sandbox tagged `sandbox`:
    /// its JSON result. Dropping the future cancels the call in the launcher.
    ///
    /// Errors: [`FunctionCallError`]: no such function, the channel failed or closed, or the
    /// function raised ([`FunctionCallError::Raised`], `TypeName: message`).
    pub async fn call(
        self: &Arc<Self>,
        function: &str,
        args: &[Value],
        kwargs: &Map<String, Value>,
        sandbox: &str,
    ) -> Answer {
        if !self.functions.iter().any(|f| f.name == function) {
            return Err(FunctionCallError::NoSuchFunction {
                name: function.to_owned(),
            });
        }
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, tx);
        let mut cancel = CancelOnDrop {
            channel: self.clone(),
            id: Some(id),
        };
        let line = ToLauncher::Call {
            id,
            function,
            args,
            kwargs,
            sandbox,
        };
        self.send(&line).await?;
        let answer = rx.await.unwrap_or_else(|_| Err(FunctionCallError::Closed));
        cancel.id = None;
        answer
    }

    /// Writes `line` to the launcher, whole (the writer's lock keeps lines apart).
    ///
    /// Errors: [`FunctionCallError::Encode`], [`FunctionCallError::Write`].
    async fn send(&self, line: &ToLauncher<'_>) -> Result<(), FunctionCallError> {
        let mut text = serde_json::to_vec(line).map_err(FunctionCallError::Encode)?;
        text.push(b'\n');
        let mut writer = self.writer.lock().await;
        writer
            .write_all(&text)
            .await
            .map_err(FunctionCallError::Write)
    }
}

/// Cancels a call in the launcher when its future is dropped before the answer.
struct CancelOnDrop {
    channel: Arc<Channel>,
    id: Option<u64>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(id) = self.id else { return };
        self.channel
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        // Sent after the drop, through the writer's lock, so that lines never interleave.
        let channel = self.channel.clone();
        tokio::spawn(async move {
            let _ = channel.send(&ToLauncher::Cancel { id }).await;
        });
    }
}

/// One line of at most `max` bytes (without its newline); `None` at the end of the stream, on
/// an error, or for a longer line.
async fn read_line(reader: &mut (impl AsyncBufRead + Unpin), max: u64) -> Option<Vec<u8>> {
    let mut line = Vec::new();
    match (&mut *reader)
        .take(max + 1)
        .read_until(b'\n', &mut line)
        .await
    {
        Ok(0) | Err(_) => None,
        Ok(_) if line.last() != Some(&b'\n') => None,
        Ok(_) => {
            line.pop();
            Some(line)
        }
    }
}

/// Hands each answer to its waiting call until the channel ends; then every waiting call gets
/// an error (its sender is dropped).
async fn read_answers(
    mut reader: BufReader<tokio::net::unix::OwnedReadHalf>,
    pending: Pending,
    max_line: u64,
) {
    while let Some(line) = read_line(&mut reader, max_line).await {
        let (id, answer) = match serde_json::from_slice::<FromLauncher>(&line) {
            Ok(FromLauncher::Result { id, value }) => (id, Ok(value)),
            Ok(FromLauncher::Error {
                id,
                type_name,
                message,
            }) => (id, Err(FunctionCallError::Raised { type_name, message })),
            _ => {
                tracing::warn!("the launcher's function channel sent a malformed line; closing it");
                break;
            }
        };
        let waiting = pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        if let Some(waiting) = waiting {
            let _ = waiting.send(answer);
        }
    }
    pending.lock().unwrap_or_else(|p| p.into_inner()).clear();
}
