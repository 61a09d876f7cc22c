//! The MCP server handler (rmcp): `initialize`, `tools/list`, `tools/call` and
//! `logging/setLevel`.
//!
//! MCP logging (`logging/setLevel`, `notifications/message`) is deprecated in the newest spec
//! revision, but PydanticAI's `log_level`/`log_handler` and the Deno original use it.
//!
//! `initialize` and `tools/list` never wait for a worker (DESIGN §3): PydanticAI gives
//! `initialize` five seconds, and booting Pyodide takes longer.
#![allow(deprecated)]

use super::execute::{Arrival, Executor, Tenant};
use super::format::{render, ReturnMode};
use super::idle::Activity;
use super::tool::{
    delete_tool, reset_tool, tool, upload_tool, DELETE_TOOL_NAME, RESET_DONE, RESET_TOOL_NAME,
    TOOL_NAME, UPLOAD_TOOL_NAME,
};
use crate::sandbox::protocol::Stream;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientJsonRpcMessage, ClientRequest,
    ContentBlock, GetExtensions, Implementation, ListResourceTemplatesResult, ListResourcesResult,
    ListToolsResult, LoggingLevel, LoggingMessageNotificationParam, PaginatedRequestParams,
    ProgressNotificationParam, ProgressToken, ReadResourceRequestParams, ReadResourceResponse,
    ReadResourceResult, ServerCapabilities, ServerConfig, SetLevelRequestParams,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The live MCP sessions, bounded by `--max-sessions`: every live session may hold an
/// interpreter, so the bound is what keeps the server's memory finite.
pub struct Sessions {
    live: AtomicUsize,
    /// Most live sessions.
    pub max: usize,
}

/// Refused because `--max-sessions` sessions are live.
#[derive(Debug, thiserror::Error)]
#[error("the server has reached its limit of {max} live sessions (--max-sessions); close a session or try again later")]
pub struct SessionsFull {
    pub max: usize,
}

impl Sessions {
    /// Room for `max` live sessions (at least 1).
    pub fn new(max: usize) -> Arc<Sessions> {
        Arc::new(Sessions {
            live: AtomicUsize::new(0),
            max: max.max(1),
        })
    }

    /// Whether a new session would be refused now.
    pub fn is_full(&self) -> bool {
        self.live.load(Ordering::SeqCst) >= self.max
    }

    /// Opens a session, or refuses when `max` are live.
    fn open(self: &Arc<Self>) -> Result<SessionGuard, SessionsFull> {
        let mut live = self.live.load(Ordering::SeqCst);
        loop {
            if live >= self.max {
                return Err(SessionsFull { max: self.max });
            }
            match self
                .live
                .compare_exchange(live, live + 1, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => break,
                Err(now) => live = now,
            }
        }
        Ok(SessionGuard {
            tenant: Tenant::new(),
            sessions: self.clone(),
        })
    }
}

/// One live session. Held only by the session's handler (never by a call's task), so that
/// when the transport drops the handler — stdio EOF, `DELETE /mcp`, idle expiry, SSE
/// disconnect, a stateless request answered — the session ends and its interpreter is killed.
pub struct SessionGuard {
    tenant: Arc<Tenant>,
    sessions: Arc<Sessions>,
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.tenant.end();
        self.sessions.live.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The MCP handler: shared settings plus, for a session, that session's state.
#[derive(Clone)]
pub struct RunPythonServer {
    pub executor: Arc<Executor>,
    pub return_mode: ReturnMode,
    /// Largest `python_code` accepted (bytes).
    pub max_code_bytes: usize,
    /// The live sessions (`--max-sessions`).
    pub sessions: Arc<Sessions>,
    /// This session's `logging/setLevel` level; `None` until the client sets one, which
    /// means nothing is sent (the default is `emergency`, and output is never that severe).
    pub log_level: Arc<Mutex<Option<LoggingLevel>>>,
    /// This session; `None` in the template that sessions are made from.
    session: Option<Arc<SessionGuard>>,
    /// How long a streamable-HTTP or SSE session may go without a message before it ends
    /// (`--session-idle-timeout`, seconds); `None`: never.
    pub session_idle: Option<std::time::Duration>,
    /// This session's activity, for a transport that expires idle sessions itself (SSE): a
    /// call holds it in flight while it runs.
    activity: Option<Arc<Activity>>,
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

/// Stamps a `tools/call` read from a session's ordered stream with its arrival in `tenant`, so
/// that the session's calls run in the order they were sent.
pub fn stamp_arrival(message: &mut ClientJsonRpcMessage, tenant: &Tenant) {
    if let ClientJsonRpcMessage::Request(request) = message {
        if let ClientRequest::CallToolRequest(_) = request.request {
            let arrival = tenant.arrive();
            request.request.extensions_mut().insert(arrival);
        }
    }
}

/// Whether a message at `level` passes the logging level `min` set by the client.
fn should_log(min: &Mutex<Option<LoggingLevel>>, level: LoggingLevel) -> bool {
    let current = *min.lock().unwrap_or_else(|p| p.into_inner());
    current.is_some_and(|min| severity(level) >= severity(min))
}

impl RunPythonServer {
    /// The template that sessions are made from.
    pub fn new(
        executor: Arc<Executor>,
        return_mode: ReturnMode,
        max_code_bytes: usize,
        sessions: Arc<Sessions>,
    ) -> Self {
        RunPythonServer {
            executor,
            return_mode,
            max_code_bytes,
            sessions,
            log_level: Arc::default(),
            session: None,
            session_idle: None,
            activity: None,
        }
    }

    /// The server for a new session: shared settings, its own interpreter (at its first call)
    /// and logging level.
    ///
    /// Errors: [`SessionsFull`] when `--max-sessions` sessions are live.
    pub fn for_new_session(&self) -> Result<Self, SessionsFull> {
        Ok(RunPythonServer {
            log_level: Arc::new(Mutex::new(None)),
            session: Some(Arc::new(self.sessions.open()?)),
            ..self.clone()
        })
    }

    /// This session's server with its calls held in flight against `activity` while they run
    /// (see [`idle`](super::idle)).
    pub fn with_activity(self, activity: Arc<Activity>) -> Self {
        RunPythonServer {
            activity: Some(activity),
            ..self
        }
    }

    /// This session's tenant (`None` in the template), for transports that stamp the arrival
    /// order of its calls.
    pub fn tenant(&self) -> Option<Arc<Tenant>> {
        self.session.as_ref().map(|s| s.tenant.clone())
    }

    /// `reset_session` (`--stateful`): after the session's earlier calls, drops its interpreter.
    /// It takes no arguments; any is an `invalid_params` error.
    async fn reset(
        &self,
        request: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        if let Some(name) = request.arguments.as_ref().and_then(|a| a.keys().next()) {
            return Err(McpError::invalid_params(
                format!("`{RESET_TOOL_NAME}` takes no arguments, and got `{name}`"),
                None,
            ));
        }
        let Some(session) = &self.session else {
            return Err(McpError::internal_error("no session for this call", None));
        };
        let arrival = context.extensions.get::<Arrival>().copied();
        if self.executor.reset(&session.tenant, arrival).await {
            let _ = context.peer.notify_resource_list_changed().await;
        }
        Ok(CallToolResult::success(vec![ContentBlock::text(RESET_DONE)]).into())
    }

    /// `upload_file` and `delete_file` (`--stateful`). Arguments of the wrong shape are an
    /// `invalid_params` error; a name that leaves the working directory, or a file the
    /// interpreter cannot write or remove, is a tool error (`isError`) that says why, so that
    /// the model can correct it.
    async fn write_file(
        &self,
        request: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct FileArguments {
            name: String,
            #[serde(default)]
            text: Option<String>,
            #[serde(default)]
            base64: Option<String>,
        }
        let upload = request.name == UPLOAD_TOOL_NAME;
        let arguments = serde_json::Value::Object(request.arguments.unwrap_or_default());
        let args: FileArguments = serde_json::from_value(arguments)
            .map_err(|e| McpError::invalid_params(format!("`{}`: {e}", request.name), None))?;
        let content = match (upload, args.text, args.base64) {
            (false, None, None) => None,
            (true, Some(text), None) => Some(text.into_bytes()),
            (true, None, Some(encoded)) => {
                use base64::Engine as _;
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(encoded.trim())
                    .map_err(|e| {
                        McpError::invalid_params(format!("`base64` is not base64: {e}"), None)
                    })?;
                Some(bytes)
            }
            (true, _, _) => {
                return Err(McpError::invalid_params(
                    "`upload_file` takes the content as exactly one of `text` and `base64`",
                    None,
                ))
            }
            (false, _, _) => {
                return Err(McpError::invalid_params(
                    "`delete_file` takes only `name`",
                    None,
                ))
            }
        };
        let refused = |why: String| Ok(CallToolResult::error(vec![ContentBlock::text(why)]).into());
        let path = match super::resources::checked_name(&args.name) {
            Ok(path) => path,
            Err(bad) => return refused(format!("{:?}: {bad}", args.name)),
        };
        let Some(session) = &self.session else {
            return Err(McpError::internal_error("no session for this call", None));
        };
        let arrival = context.extensions.get::<Arrival>().copied();
        let written = self
            .executor
            .write_file(&session.tenant, arrival, path, content.as_deref())
            .await;
        match written {
            Ok(changed) => {
                if changed {
                    let _ = context.peer.notify_resource_list_changed().await;
                }
                let done = match &content {
                    Some(bytes) => format!("wrote {path} ({} bytes)", bytes.len()),
                    None => format!("deleted {path}"),
                };
                Ok(CallToolResult::success(vec![ContentBlock::text(done)]).into())
            }
            Err(why) => refused(format!(
                "could not {} {path}: {why}",
                if upload { "write" } else { "delete" }
            )),
        }
    }

    /// Checks the arguments of a `run_python_code` call against the input schema.
    ///
    /// Errors: an MCP `invalid_params` error that says which argument is wrong and how.
    #[allow(clippy::result_large_err)]
    fn parse_arguments(
        &self,
        args: Option<serde_json::Map<String, serde_json::Value>>,
    ) -> Result<(String, serde_json::Map<String, serde_json::Value>), McpError> {
        let args = args.unwrap_or_default();
        if let Some(extra) = args
            .keys()
            .find(|k| *k != "python_code" && *k != "global_variables")
        {
            return Err(McpError::invalid_params(
                format!("unknown argument `{extra}`: run_python_code takes `python_code` and `global_variables`"),
                None,
            ));
        }
        let code = match args.get("python_code") {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(other) => {
                return Err(McpError::invalid_params(
                    format!("`python_code` must be a string, not {}", json_type(other)),
                    None,
                ))
            }
            None => {
                return Err(McpError::invalid_params(
                    "missing required argument `python_code`",
                    None,
                ))
            }
        };
        if code.len() > self.max_code_bytes {
            return Err(McpError::invalid_params(
                format!(
                    "`python_code` is {} bytes, more than the limit of {} bytes",
                    code.len(),
                    self.max_code_bytes
                ),
                None,
            ));
        }
        let globals = match args.get("global_variables") {
            None | Some(serde_json::Value::Null) => serde_json::Map::new(),
            Some(serde_json::Value::Object(m)) => m.clone(),
            Some(other) => {
                return Err(McpError::invalid_params(
                    format!(
                        "`global_variables` must be an object, not {}",
                        json_type(other)
                    ),
                    None,
                ))
            }
        };
        if let Some(bad) = globals.keys().find(|k| !is_identifier(k)) {
            return Err(McpError::invalid_params(
                format!("`global_variables` key `{bad}` is not a valid Python identifier"),
                None,
            ));
        }
        Ok((code, globals))
    }
}

fn json_type(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c == '_' || c.is_alphabetic())
        && chars.all(|c| c == '_' || c.is_alphanumeric())
}

impl ServerHandler for RunPythonServer {
    fn get_info(&self) -> ServerConfig {
        // A session's files are resources only with `--stateful`: the drop-in offers tools only.
        let capabilities = if self.executor.stateful {
            ServerCapabilities::builder()
                .enable_tools()
                .enable_logging()
                .enable_resources()
                .enable_resources_list_changed()
                .build()
        } else {
            ServerCapabilities::builder()
                .enable_tools()
                .enable_logging()
                .build()
        };
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new(
                "mcp-run-python",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions("Call run_python_code to run Python 3.14 code in a sandbox.")
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let mut tools = vec![tool(self.executor.stateful)];
        if self.executor.stateful {
            tools.extend([upload_tool(), delete_tool(), reset_tool()]);
        }
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let _in_flight = self.activity.as_ref().map(|a| a.begin());
        let stateful = self.executor.stateful;
        if stateful && request.name == RESET_TOOL_NAME {
            return self.reset(request, &context).await;
        }
        if stateful && (request.name == UPLOAD_TOOL_NAME || request.name == DELETE_TOOL_NAME) {
            return self.write_file(request, &context).await;
        }
        if request.name != TOOL_NAME {
            let tools = if stateful {
                format!("`{TOOL_NAME}`, `{UPLOAD_TOOL_NAME}`, `{DELETE_TOOL_NAME}` and `{RESET_TOOL_NAME}`")
            } else {
                format!("only `{TOOL_NAME}`")
            };
            return Err(McpError::invalid_params(
                format!("unknown tool `{}`: this server has {tools}", request.name),
                None,
            ));
        }
        let (code, globals) = self.parse_arguments(request.arguments)?;
        let Some(session) = &self.session else {
            return Err(McpError::internal_error("no session for this call", None));
        };
        let tenant = session.tenant.clone();
        // Output lines become `notifications/message` (stdout at `info`, stderr at `warning`)
        // as they are written; a task sends them in order while the code runs. The channel
        // holds at most the call's output, which the front caps.
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
        let token = request
            .meta
            .as_ref()
            .and_then(|m| m.get_progress_token())
            .or_else(|| context.meta.get_progress_token());
        let progress = token.map(|t| report_progress(context.peer.clone(), t));
        let peer = context.peer.clone();
        let forward = tokio::spawn(async move {
            while let Some((level, line)) = rx.recv().await {
                let param =
                    LoggingMessageNotificationParam::new(level, serde_json::Value::String(line))
                        .with_logger("run_python_code");
                if peer.notify_logging_message(param).await.is_err() {
                    break;
                }
            }
        });
        // The call runs on its own task, which holds the tenant but not the session: when the
        // session ends, or the client cancels the request (`notifications/cancelled`), the
        // interpreter is killed at once and no result is sent.
        let executor = self.executor.clone();
        let cancel = context.ct.clone();
        let arrival = context.extensions.get::<Arrival>().copied();
        let result = tokio::spawn(async move {
            executor
                .run(&tenant, arrival, &code, globals, on_output, &cancel)
                .await
        })
        .await
        .map_err(|e| McpError::internal_error(format!("the call failed: {e}"), None));
        if let Some(progress) = progress {
            progress.abort();
        }
        let result = result?;
        let _ = forward.await;
        let Some(result) = result else {
            return Err(McpError::internal_error(
                "the call was cancelled (its interpreter was stopped)",
                None,
            ));
        };
        if result.files_changed {
            // The session's resources changed (MCP spec, resources: list_changed).
            let _ = context.peer.notify_resource_list_changed().await;
        }
        let text = render(&result, self.return_mode);
        let mut content = vec![ContentBlock::text(text)];
        for image in &result.images {
            use base64::Engine as _;
            let data = base64::engine::general_purpose::STANDARD.encode(&image.bytes);
            content.push(ContentBlock::image(data, image.mime));
        }
        // Files the call created or changed, as links to the session's resources.
        for (path, size) in &result.written {
            let link = super::resources::describe(&session.tenant.id, path, *size);
            content.push(ContentBlock::resource_link(link));
        }
        Ok(CallToolResult::success(content).into())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let Some(session) = self.session.as_ref().filter(|_| self.executor.stateful) else {
            return Ok(ListResourcesResult::default());
        };
        let tenant = &session.tenant;
        let resources = tenant
            .files()
            .into_iter()
            .map(|(path, size)| super::resources::describe(&tenant.id, &path, size))
            .collect();
        Ok(ListResourcesResult::with_all_items(resources))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        let templates = if self.executor.stateful {
            vec![super::resources::template()]
        } else {
            Vec::new()
        };
        Ok(ListResourceTemplatesResult::with_all_items(templates))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let not_found = |why: &str| {
            McpError::resource_not_found(
                format!("resource {:?} not found: {why}", request.uri),
                None,
            )
        };
        let Some(session) = self.session.as_ref().filter(|_| self.executor.stateful) else {
            return Err(not_found("this server has resources only with --stateful"));
        };
        let tenant = &session.tenant;
        let path = super::resources::path_of(&request.uri, &tenant.id)
            .ok_or_else(|| not_found("it is not a file of this session"))?;
        let bytes = self
            .executor
            .read_file(tenant, &path)
            .await
            .map_err(|why| not_found(&why))?;
        let contents = super::resources::contents(&request.uri, &path, bytes);
        Ok(ReadResourceResult::new(vec![contents]).into())
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        *self.log_level.lock().unwrap_or_else(|p| p.into_inner()) = Some(request.level);
        Ok(())
    }
}
