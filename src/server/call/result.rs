//! What one call produced (docs/architecture.md §4): how it ended, its output, and with
//! `--stateful` what it did to its sandbox. The pipeline ([`crate::server::call::execute`])
//! builds it; [`crate::server::tools::format`] renders it as the tool's answer, and nothing
//! here knows how.

/// How a call ended, as the result's `status` words it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// `success`: the code ran to its end.
    Success,
    /// `install-error`: a requirement could not be installed.
    InstallError,
    /// `run-error`: the code raised, or a limit stopped it.
    RunError,
}

impl Status {
    /// The status word used in results.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Success => "success",
            Status::InstallError => "install-error",
            Status::RunError => "run-error",
        }
    }
}

tokio::task_local! {
    /// How the `run_python_code` call that the current `tools/call` ran ended
    /// ([`Outcome::ending`]): set as its result is rendered, read where the call is counted
    /// (`handler.rs` `call_tool`, and a task's runner), so that the metric comes from the
    /// outcome, never from the result's words.
    pub static CALL_ENDING: std::cell::Cell<Option<&'static str>>;
}

/// Notes how the current `tools/call`'s run ended ([`CALL_ENDING`]); nothing outside a scope.
pub fn note_ending(outcome: &Outcome) {
    let ending = outcome.ending();
    // Outside a counted scope (warmup, example) there is nothing to note.
    let _ = CALL_ENDING.try_with(|slot| slot.set(Some(ending)));
}

/// Notes `ending`, noted in another task (a call run as a task may end in its own), as the
/// current `tools/call`'s.
pub fn note_ending_of(ending: Option<&'static str>) {
    let _ = CALL_ENDING.try_with(|slot| slot.set(ending));
}

/// Runs `call` in a scope where its run's ending can be noted; returns what it returned and
/// the ending noted, if any.
pub async fn with_ending<T>(
    call: impl std::future::Future<Output = T>,
) -> (T, Option<&'static str>) {
    CALL_ENDING
        .scope(std::cell::Cell::new(None), async move {
            let answer = call.await;
            (answer, CALL_ENDING.with(std::cell::Cell::get))
        })
        .await
}

/// The last expression's value as the worker rendered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReturnValue {
    /// JSON text (indent 2), embedded as a value by the JSON mode.
    Json(String),
    /// A `str` as is, or a repr: text.
    Text(String),
}

impl ReturnValue {
    /// The value's text, as the XML mode shows it.
    pub fn text(&self) -> &str {
        match self {
            ReturnValue::Json(text) | ReturnValue::Text(text) => text,
        }
    }
}

/// How a call ended, with what belongs to that ending alone: a success has a return value (or
/// none), a failure an error text; never both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The code ran to its end.
    Success(Option<ReturnValue>),
    /// A requirement could not be installed: why, naming the package.
    InstallError(String),
    /// The code raised, or a limit stopped it: the traceback and message, or the limit's words
    /// (`error`), and which of those it was (`cause`).
    RunError { error: String, cause: RunErrorCause },
}

/// Why a call ended in `run-error`, for operators (issue 48: the metrics count it by this, never
/// by the result's words).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunErrorCause {
    /// The code raised (or its interpreter ended: `sys.exit`, `os._exit`).
    Raised,
    /// The call's deadline (`--timeout`) stopped it.
    Timeout,
    /// The worker passed `--memory` and was stopped.
    Memory,
    /// It never ran: no worker could be had, or the queue was full.
    Refused,
    /// The worker failed (broke the protocol, flooded its output, died).
    Worker,
}

impl Outcome {
    /// The `status` of this outcome.
    pub fn status(&self) -> Status {
        match self {
            Outcome::Success(_) => Status::Success,
            Outcome::InstallError(_) => Status::InstallError,
            Outcome::RunError { .. } => Status::RunError,
        }
    }

    /// A run error of `cause`, worded `error`.
    pub fn run_error(cause: RunErrorCause, error: impl Into<String>) -> Outcome {
        Outcome::RunError {
            error: error.into(),
            cause,
        }
    }

    /// How the call ended, as the metrics count it: its status, a run error by its cause.
    pub fn ending(&self) -> &'static str {
        match self {
            Outcome::Success(_) => "success",
            Outcome::InstallError(_) => "install-error",
            Outcome::RunError { cause, .. } => match cause {
                RunErrorCause::Raised => "run-error",
                RunErrorCause::Timeout => "timeout",
                RunErrorCause::Memory => "memory",
                RunErrorCause::Refused => "refused",
                RunErrorCause::Worker => "worker-failed",
            },
        }
    }

    /// An install failure, in the original's words (`Error installing dependencies: …`).
    pub fn install_error(why: impl std::fmt::Display) -> Outcome {
        Outcome::InstallError(format!("Error installing dependencies: {why}"))
    }
}

/// Everything a call produced.
#[derive(Debug, Clone)]
pub struct CallResult {
    /// How it ended.
    pub outcome: Outcome,
    /// The requirements this call asked for, as written (PEP 723) or inferred.
    pub dependencies: Vec<String>,
    /// stdout and stderr lines in the order written.
    pub output: Vec<String>,
    /// `--stateful` only: the sandbox's files (its resources) changed with this call.
    pub files_changed: bool,
    /// `--stateful` only: the files this call created or changed (path, size in bytes),
    /// returned as `resource_link` content after the text.
    pub written: Vec<(String, u64)>,
    /// `--stateful` only: images the call made in its working directory, returned as `image`
    /// content after the text (which does not change).
    pub images: Vec<Image>,
    /// `--stateful` only: why the sandbox's state is gone or new (its worker was stopped
    /// by this call, this call ran in a new one, or made the sandbox). `None` otherwise, and
    /// always without the flag.
    pub state: Option<String>,
    /// What the front did for the call that the caller should know of: it ran in a stand-in
    /// interpreter, the first having failed as it booted. `None` almost always.
    pub note: Option<String>,
}

impl CallResult {
    /// A result that ended with `outcome` and has nothing else yet.
    pub fn new(outcome: Outcome) -> CallResult {
        CallResult {
            outcome,
            dependencies: Vec::new(),
            output: Vec::new(),
            files_changed: false,
            written: Vec::new(),
            images: Vec::new(),
            state: None,
            note: None,
        }
    }

    /// The status of its outcome.
    pub fn status(&self) -> Status {
        self.outcome.status()
    }
}

/// An image file a call made: its MIME type (from its bytes) and its bytes.
#[derive(Debug, Clone)]
pub struct Image {
    /// `image/png`, `image/jpeg`, `image/gif`, `image/webp` or `image/svg+xml`.
    pub mime: &'static str,
    /// The file's bytes, at most `--max-image-bytes`.
    pub bytes: Vec<u8>,
}
