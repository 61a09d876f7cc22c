//! What one call produced (docs/architecture.md §4): how it ended, its output, and with
//! `--stateful` what it did to its sandbox. The pipeline ([`crate::server::call::execute`])
//! builds it; [`crate::server::tools::format`] renders it as the tool's answer, and nothing
//! here knows how.

use std::time::Duration;

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
    /// Where the call's time went, for the debug line (never in the result).
    pub timing: CallTiming,
}

/// Where a call's time went, in the front and in its worker: the debug line `call timing`
/// ([`CallTiming::line`], target [`TIMING_TARGET`]; issue 49, the call path measured before it
/// is cut). A part the call did not reach is zero. The worker's two figures are its own word
/// (`RunOutcome::worker_us`, `code_us`): only ever printed, and bounded by what the front
/// measured around them.
#[derive(Debug, Clone, Copy, Default)]
pub struct CallTiming {
    /// Waiting for the call's turn: the sandbox's worker slot, then a running slot.
    pub queue: Duration,
    /// Getting a live interpreter: a spare, a fork, a restore.
    pub interpreter: Duration,
    /// Finding the code's imports (a round trip to the worker, or none).
    pub scan: Duration,
    /// Installing its requirements.
    pub install: Duration,
    /// The run's round trip as the front saw it: the request's encoding and write, the
    /// worker's read and decode, its run, the reply's encoding, read and decode.
    pub run: Duration,
    /// Of `run`, the worker's own time on it: the engine's entry into the runtime and back,
    /// the runner, the code.
    pub worker: Duration,
    /// Of `worker`, the code's, with its result's text.
    pub code: Duration,
    /// The checkpoint of a stateful sandbox's interpreter after the run (checkpoints,
    /// docs/architecture.md §3.4), before the answer.
    pub checkpoint: Duration,
}

/// The log target of the `call timing` line: `RUST_LOG=mcp_run_python::timing=debug` shows it
/// alone.
pub const TIMING_TARGET: &str = "mcp_run_python::timing";

impl CallTiming {
    /// The worker's figures, as the outcome gives them in microseconds.
    pub fn set_worker(&mut self, worker_us: u64, code_us: u64) {
        self.worker = Duration::from_micros(worker_us);
        self.code = Duration::from_micros(code_us);
    }

    /// The line, in microseconds, for a call that took `total` in the front's tool handler:
    /// `call timing (µs): total T = queue Q + interpreter I + scan S + install N + run R
    /// (frames and pipes F + worker W (runtime entry and exit E + code C)) + checkpoint K +
    /// rest O`, where the rest is the handler's own work (the sandbox's files, its state, the
    /// result's rendering).
    pub fn line(&self, total: Duration) -> String {
        let us = |d: Duration| d.as_micros();
        let worker = self.worker.min(self.run);
        let code = self.code.min(worker);
        let parts =
            self.queue + self.interpreter + self.scan + self.install + self.run + self.checkpoint;
        format!(
            "call timing (µs): total {} = queue {} + interpreter {} + scan {} + install {} + run {} (frames and pipes {} + worker {} (runtime entry and exit {} + code {})) + checkpoint {} + rest {}",
            us(total),
            us(self.queue),
            us(self.interpreter),
            us(self.scan),
            us(self.install),
            us(self.run),
            us(self.run - worker),
            us(worker),
            us(worker - code),
            us(code),
            us(self.checkpoint),
            us(total.saturating_sub(parts)),
        )
    }
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
            timing: CallTiming::default(),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The parts add up to the total, and a worker that claims more time than the front saw
    /// around it is bounded by it: the line never underflows.
    #[test]
    fn the_timing_line_adds_up_and_bounds_the_workers_word() {
        let mut timing = CallTiming {
            queue: Duration::from_micros(10),
            interpreter: Duration::from_micros(5),
            run: Duration::from_micros(400),
            ..CallTiming::default()
        };
        timing.set_worker(300, 100);
        assert_eq!(
            timing.line(Duration::from_micros(500)),
            "call timing (µs): total 500 = queue 10 + interpreter 5 + scan 0 + install 0 + run 400 (frames and pipes 100 + worker 300 (runtime entry and exit 200 + code 100)) + checkpoint 0 + rest 85"
        );
        timing.set_worker(u64::MAX / 2_000_000, u64::MAX / 1_000_000);
        let line = timing.line(Duration::from_micros(1));
        assert!(
            line.contains(
                "run 400 (frames and pipes 0 + worker 400 (runtime entry and exit 0 + code 400))"
            ),
            "{line}"
        );
        assert!(line.ends_with("+ rest 0"), "{line}");
    }
}
