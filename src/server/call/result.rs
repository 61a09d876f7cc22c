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
    /// The status named by its word in results.
    pub fn parse(word: &str) -> Option<Status> {
        [Status::Success, Status::InstallError, Status::RunError]
            .into_iter()
            .find(|s| s.as_str() == word)
    }

    /// The status word used in results.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Success => "success",
            Status::InstallError => "install-error",
            Status::RunError => "run-error",
        }
    }
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
    /// The code raised, or a limit stopped it: the traceback and message, or the limit's words.
    RunError(String),
}

impl Outcome {
    /// The `status` of this outcome.
    pub fn status(&self) -> Status {
        match self {
            Outcome::Success(_) => Status::Success,
            Outcome::InstallError(_) => Status::InstallError,
            Outcome::RunError(_) => Status::RunError,
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
