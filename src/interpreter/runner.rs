//! The runner (`runtime/js/runner.js`): the JavaScript functions the host keeps (never on a global)
//! and calls with the call id of each request, and how their answers are typed.

use crate::engine::{Arg, Engine, EngineError, JsFunction};
use crate::protocol::CallId;
use anyhow::Result;
use serde::Deserialize;
use std::time::Instant;

/// The runner's functions (`runtime/js/runner.js`), kept by the host.
pub(super) struct Runner {
    pub(super) boot: JsFunction,
    pub(super) find_imports: JsFunction,
    pub(super) install: JsFunction,
    pub(super) run: JsFunction,
    pub(super) reseed: JsFunction,
    pub(super) read_file: JsFunction,
    pub(super) write_file: JsFunction,
    pub(super) mount: JsFunction,
    pub(super) memory: JsFunction,
    pub(super) baseline: JsFunction,
    pub(super) capturable: JsFunction,
    pub(super) grow: JsFunction,
}

/// Every answer of the runner (`runtime/js/runner.js`, `ok` and `failed`): the operation's result, or
/// why it failed.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub(super) enum RunnerAnswer<T> {
    Ok(T),
    Failed(RunnerFailure),
}

/// Why a runner operation failed (`runtime/js/runner.js`, `failure`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RunnerFailure {
    /// The interpreter ended and cannot be used again.
    #[serde(default)]
    pub ended: Option<Ended>,
    /// The JavaScript error, as text.
    #[serde(default)]
    pub error: Option<String>,
}

/// How an interpreter ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Ended {
    /// `os._exit(status)` (Emscripten's `ExitStatus`).
    Exit(i64),
    /// `os.abort()`, a trap or a fatal error in the runtime.
    Abort,
}

/// Why a runner operation failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum OperationError {
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
pub(super) struct Empty {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Booted {
    pub version: String,
}

/// Calls a runner function for call `id` and drives the event loop until it answers.
pub(super) fn call(
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
pub(super) fn parse_answer<T: for<'de> Deserialize<'de>>(text: &str) -> Result<T, OperationError> {
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

/// The runner's `run` arguments (`runtime/js/runner.js`), in one place for a call and the zygote's
/// warm-up.
pub(super) struct RunArgs<'a> {
    pub code: &'a str,
    /// The globals, as a JSON object's text.
    pub globals: &'a str,
    pub output_cap: usize,
    pub result_cap: usize,
    pub keep_globals: bool,
    /// Code mode: the tool catalog as JSON text, when it changed.
    pub tools: Option<String>,
    /// What the code may do on the network (`protocol::RunNetwork` as JSON text): the
    /// placeholders to set in `os.environ` and the requests it may make at once; `None`: no
    /// network.
    pub network: Option<String>,
}

impl RunArgs<'_> {
    pub(super) fn args(&self) -> [Arg<'_>; 7] {
        [
            Arg::Str(self.code),
            Arg::Str(self.globals),
            Arg::Num(self.output_cap as f64),
            Arg::Num(self.result_cap as f64),
            Arg::Bool(self.keep_globals),
            self.tools.as_deref().map_or(Arg::Null, Arg::Str),
            self.network.as_deref().map_or(Arg::Null, Arg::Str),
        ]
    }
}
