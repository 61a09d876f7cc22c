//! The MCP server handler (rmcp): `initialize`, `tools/list`, `tools/call`, the resources and
//! `logging/setLevel`; which sandbox a request works in; and `run_python_code` itself (the
//! sandbox tools are in [`crate::server::tools::sandbox_tools`]).
//!
//! MCP logging (`logging/setLevel`, `notifications/message`) is deprecated in the newest spec
//! revision, but PydanticAI's `log_level`/`log_handler` and the Deno original use it.
//!
//! `initialize` and `tools/list` never wait for a worker (docs/architecture.md §3): PydanticAI
//! gives `initialize` five seconds, and booting Pyodide takes longer.
#![allow(deprecated)]

use crate::sandbox::activity::{Activity, InFlight};
use crate::sandbox::handle::SandboxId;
use crate::sandbox::live::{Arrival, Owner, Principal, Sandbox};
use crate::sandbox::registry::Missing;
use crate::sandbox::registry::{OpenError, Registry, RegistryError};
use crate::sandbox::state_dir::StateError;
use crate::server::call::execute::{Executor, OutputSink};
use crate::server::call::result::CallResult;
use crate::server::sessions::{SessionGuard, Sessions, SessionsFull};
use crate::server::tools::arguments;
use crate::server::tools::format::{render, structured, ReturnMode};
use crate::server::tools::tool::{self, TOOL_NAME};
use crate::worker::protocol::Stream;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientJsonRpcMessage, ClientRequest,
    ContentBlock, GetExtensions, Implementation, ListResourceTemplatesResult, ListResourcesResult,
    ListToolsResult, LoggingLevel, LoggingMessageNotificationParam, PaginatedRequestParams,
    ProgressNotificationParam, ProgressToken, ReadResourceRequestParams, ReadResourceResponse,
    ReadResourceResult, ServerCapabilities, ServerConfig, SetLevelRequestParams, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use std::sync::{Arc, Mutex};

/// The header that names a streamable-HTTP session (MCP spec 2025-11-25, session management).
pub const SESSION_HEADER: &str = "mcp-session-id";

/// The MCP handler: shared settings plus, for a session, that session's state.
#[derive(Clone)]
pub struct RunPythonServer {
    pub executor: Arc<Executor>,
    /// Every live sandbox.
    pub registry: Arc<Registry>,
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
    /// Whether the server is draining, and its calls in flight (which a drain waits for).
    pub drain: Arc<crate::server::ops::drain::Drain>,
    /// The principal of this session's stream, for a transport whose messages carry no HTTP
    /// request of their own (SSE: the `GET /sse` that opened it).
    principal: Option<Principal>,
}

/// How a request came to its sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reached {
    /// By the `sandbox_id` it gave.
    Named,
    /// The session's default sandbox (no `sandbox_id`, a transport with a session).
    SessionDefault,
    /// Made for this call (`--stateful`, no `sandbox_id`, no session): the answer names it.
    Created,
    /// Made for this call and ended after it (the drop-in mode without a session).
    OneCall,
}

/// The sandbox a request works in, held in flight (neither evicted nor expired) while the
/// request runs; a [`Reached::OneCall`] sandbox ends when this is dropped.
pub(crate) struct InUse {
    pub sandbox: Arc<Sandbox>,
    pub reached: Reached,
    _in_flight: InFlight,
}

impl InUse {
    /// `sandbox`, reached by its handle, held in flight.
    pub(crate) fn named(sandbox: Arc<Sandbox>) -> InUse {
        let in_flight = sandbox.begin();
        InUse {
            sandbox,
            reached: Reached::Named,
            _in_flight: in_flight,
        }
    }
}

impl Drop for InUse {
    fn drop(&mut self) {
        if self.reached == Reached::OneCall {
            self.sandbox.end();
        }
    }
}

/// What a request without `sandbox_id` and without a session gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WithoutHandle {
    /// A new sandbox (`run_python_code`, seed 002's empty `session_id`).
    Create,
    /// A refusal that asks for the handle (the file tools: nothing is made behind the caller's
    /// back).
    Refuse,
}

/// Why a request has no sandbox to work in; answered as a tool error (`isError`), so that the
/// model reads the words and can act on them.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NoSandbox {
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("this request has no session, so it must name its sandbox: pass `sandbox_id` as a result or create_sandbox named it")]
    NeedsHandle,
}

/// The handle the HTTP front minted for the sandbox a request will make, if it makes one
/// (a sessionless `run_python_code` without `sandbox_id`, or `create_sandbox`): named in the
/// response's `Sandbox-Id` header before the call runs, so that a load balancer learns where
/// the sandbox lives from the first answer (issue 27). Set in the HTTP request's extensions.
#[derive(Debug, Clone)]
pub struct MintedSandbox(pub SandboxId);

/// What the HTTP front left in the extensions of `context`'s HTTP request (a
/// [`MintedSandbox`], a [`Principal`]); `None` over stdio and SSE, whose messages have none.
fn http_extension<T: Send + Sync + 'static>(context: &RequestContext<RoleServer>) -> Option<&T> {
    context
        .extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<T>())
}

/// A tool error (`isError: true`) that says `why`.
pub(crate) fn tool_error(why: impl std::fmt::Display) -> CallToolResponse {
    CallToolResult::error(vec![ContentBlock::text(why.to_string())]).into()
}

/// The `state` note of a call that made its sandbox (seed 002: the answer returns the id "to
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

/// Whether a message at `level` passes the logging level `min` set by the client.
fn should_log(min: &Mutex<Option<LoggingLevel>>, level: LoggingLevel) -> bool {
    let current = *min.lock().unwrap_or_else(|p| p.into_inner());
    current.is_some_and(|min| severity(level) >= severity(min))
}

impl RunPythonServer {
    /// The template that sessions are made from.
    pub fn new(
        executor: Arc<Executor>,
        registry: Arc<Registry>,
        return_mode: ReturnMode,
        max_code_bytes: usize,
        sessions: Arc<Sessions>,
    ) -> Self {
        RunPythonServer {
            executor,
            registry,
            return_mode,
            max_code_bytes,
            sessions,
            log_level: Arc::default(),
            session: None,
            session_idle: None,
            activity: None,
            drain: crate::server::ops::drain::Drain::new(),
            principal: None,
        }
    }

    /// The server for a new session: shared settings, its own default sandbox (at its first
    /// use) and logging level.
    ///
    /// Errors: [`SessionsFull`] when `--max-sessions` sessions are live.
    pub fn for_new_session(&self) -> Result<Self, SessionsFull> {
        Ok(RunPythonServer {
            log_level: Arc::new(Mutex::new(None)),
            session: Some(Arc::new(self.sessions.open(self.registry.clone())?)),
            ..self.clone()
        })
    }

    /// This session's server with its calls held in flight against `activity` while they run
    /// (see [`crate::sandbox::activity`]).
    pub fn with_activity(self, activity: Arc<Activity>) -> Self {
        RunPythonServer {
            activity: Some(activity),
            ..self
        }
    }

    /// This session's server, for requests authenticated as `principal` (SSE: its stream's).
    pub fn with_principal(self, principal: Option<Principal>) -> Self {
        RunPythonServer { principal, ..self }
    }

    /// Whether a message authenticated as `principal` may use this session (SSE): the same
    /// principal as the stream's, or no authentication at all.
    pub fn opened_by(&self, principal: Option<&Principal>) -> bool {
        self.principal.as_ref() == principal
    }

    /// Who `context`'s request was authenticated as, when the server authenticates: the HTTP
    /// request's [`Principal`], else the session's.
    pub(crate) fn principal_of(&self, context: &RequestContext<RoleServer>) -> Option<Principal> {
        http_extension::<Principal>(context)
            .cloned()
            .or_else(|| self.principal.clone())
    }

    /// A new sandbox reached by its handle, belonging to `context`'s principal, with
    /// `dependencies`: under the handle the HTTP front minted for the request (and named in its
    /// response header), else a fresh one.
    ///
    /// Errors: [`RegistryError`] when no handle could be minted or `--max-sandboxes` leaves no
    /// room.
    pub(crate) fn create_for(
        &self,
        context: &RequestContext<RoleServer>,
        dependencies: Vec<String>,
    ) -> Result<Arc<Sandbox>, RegistryError> {
        let id = match http_extension::<MintedSandbox>(context) {
            Some(minted) => minted.0.clone(),
            None => SandboxId::mint()?,
        };
        let principal = self.principal_of(context);
        self.registry
            .create_as(id, Owner::Handle, dependencies, principal)
    }

    /// Whether calls keep state and the sandbox tools are offered (`--stateful`).
    fn stateful(&self) -> bool {
        self.executor.stateful
    }

    /// This server's tools: with code mode (`--tools-config`), `run_python_code`'s description
    /// lists the MCP tools the code can call now.
    fn tools(&self) -> std::borrow::Cow<'static, [Tool]> {
        match &self.executor.upstreams {
            Some(upstreams) => std::borrow::Cow::Owned(tool::tools_with_code_mode(
                self.stateful(),
                &upstreams.published().summary,
            )),
            None => std::borrow::Cow::Borrowed(tool::tools(self.stateful())),
        }
    }

    /// The session a request belongs to. Over streamable HTTP a request belongs to a session
    /// only when it names one (`Mcp-Session-Id`): MCP 2026-07-28 requests and
    /// `streamable-http-stateless` ones have none (SEP-2567). Over stdio and SSE the connection
    /// is the session.
    pub(crate) fn session_of(&self, context: &RequestContext<RoleServer>) -> Option<&SessionGuard> {
        let session = self.session.as_deref()?;
        match context.extensions.get::<axum::http::request::Parts>() {
            Some(parts) => parts
                .headers
                .contains_key(SESSION_HEADER)
                .then_some(session),
            None => Some(session),
        }
    }

    /// Stamps a `tools/call` read from a session's ordered stream (stdio, SSE) with its arrival
    /// in the sandbox it names (or the session's default), so that a sandbox's calls run in
    /// the order they were sent.
    pub fn stamp_arrival(&self, message: &mut ClientJsonRpcMessage) {
        let ClientJsonRpcMessage::Request(request) = message else {
            return;
        };
        let ClientRequest::CallToolRequest(call) = &request.request else {
            return;
        };
        if call.params.name == tool::CREATE_TOOL_NAME {
            // It makes a sandbox rather than working in one.
            return;
        }
        let sandbox = match arguments::named_sandbox(&call.params) {
            Some(text) => self.registry.peek(text),
            None => self
                .session
                .as_ref()
                .and_then(|s| s.default_sandbox(self.principal.clone()).ok()),
        };
        if let Some(sandbox) = sandbox {
            let arrival = sandbox.arrive();
            request.request.extensions_mut().insert(arrival);
        }
    }

    /// The sandbox a request works in: the one `given` names, else the session's default, else
    /// (`without`) a new one or a refusal. Without `--stateful` a sessionless call gets a
    /// sandbox of its own that ends with it.
    ///
    /// Errors: [`NoSandbox`]: an unknown, ended or expired handle; no room under
    /// `--max-sandboxes`; no handle where one is needed.
    pub(crate) async fn sandbox_for(
        &self,
        given: Option<&str>,
        context: &RequestContext<RoleServer>,
        without: WithoutHandle,
    ) -> Result<InUse, NoSandbox> {
        let principal = self.principal_of(context);
        if let Some(text) = given {
            let entered = self.registry.open(text, principal.as_ref()).await?;
            return Ok(InUse {
                sandbox: entered.sandbox,
                reached: Reached::Named,
                _in_flight: entered.in_flight,
            });
        }
        let (sandbox, reached) = match (self.session_of(context), self.stateful(), without) {
            (Some(session), _, _) => {
                let sandbox = session.default_sandbox(principal.clone())?;
                if !sandbox.belongs_to(principal.as_ref()) {
                    return Err(OpenError::from(Missing::of(sandbox.id.as_str())).into());
                }
                (sandbox, Reached::SessionDefault)
            }
            (None, true, WithoutHandle::Create) => {
                (self.create_for(context, Vec::new())?, Reached::Created)
            }
            (None, true, WithoutHandle::Refuse) => return Err(NoSandbox::NeedsHandle),
            (None, false, _) => (
                Sandbox::for_one_call().map_err(RegistryError::from)?,
                Reached::OneCall,
            ),
        };
        let in_flight = sandbox.begin();
        Ok(InUse {
            sandbox,
            reached,
            _in_flight: in_flight,
        })
    }

    /// After a completed call or file operation in `in_use`: saves its sandbox to the state
    /// directory (`--state-dir`), before the answer goes out, so that another replica that
    /// gets its next call finds this call's files. A `state` note when the save failed.
    pub(crate) async fn save(&self, in_use: &InUse) -> Option<String> {
        if in_use.reached == Reached::OneCall {
            return None;
        }
        match self.registry.save(&in_use.sandbox).await {
            Ok(()) => None,
            Err(e @ StateError::Superseded { .. }) => Some(format!(
                "moved: {e} while this call ran, so this call's changes to its files are not kept there; its next call runs on that replica"
            )),
            Err(e) => {
                tracing::error!("sandbox {}: {e}", in_use.sandbox.id.short());
                Some(format!("unsaved: {e}; this call's files are kept on this replica only"))
            }
        }
    }

    /// Tells a session's client that its resources changed, when `in_use` is its default
    /// sandbox (the only one `resources/list` shows; MCP spec, resources: `list_changed`).
    pub(crate) async fn files_changed(&self, in_use: &InUse, context: &RequestContext<RoleServer>) {
        if in_use.reached == Reached::SessionDefault {
            let _ = context.peer.notify_resource_list_changed().await;
        }
    }

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
        let text = render(&result, self.return_mode, stateful.then_some(id));
        let mut content = vec![ContentBlock::text(text)];
        for image in &result.images {
            use base64::Engine as _;
            let data = base64::engine::general_purpose::STANDARD.encode(&image.bytes);
            content.push(ContentBlock::image(data, image.mime));
        }
        // Files the call created or changed, as links to the sandbox's resources.
        for (path, size) in &result.written {
            let link = crate::server::tools::resources::describe(id.as_str(), path, *size);
            content.push(ContentBlock::resource_link(link));
        }
        let mut answer = CallToolResult::success(content);
        if stateful {
            answer.structured_content = Some(structured(&result, id));
        }
        answer
    }

    /// `run_python_code`: runs the code in its sandbox and answers with the result's text
    /// (and, with `--stateful`, its structured form, images and links to the files it wrote).
    async fn run_code(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let stateful = self.stateful();
        let args = arguments::run(
            TOOL_NAME,
            request.arguments.clone(),
            stateful,
            self.max_code_bytes,
        )?;
        let in_use = match self
            .sandbox_for(args.sandbox_id.as_deref(), &context, WithoutHandle::Create)
            .await
        {
            Ok(in_use) => in_use,
            Err(no) => return Ok(tool_error(no)),
        };
        let (on_output, forward) = self.forward_output(&request, &context);
        let token = request
            .meta
            .as_ref()
            .and_then(|m| m.get_progress_token())
            .or_else(|| context.meta.get_progress_token());
        let progress = token.map(|t| report_progress(context.peer.clone(), t));
        // The call runs on its own task, which holds the sandbox but not the session: when the
        // session or the sandbox ends, or the client cancels the request
        // (`notifications/cancelled`), the interpreter is killed at once and no result is sent.
        let executor = self.executor.clone();
        let cancel = context.ct.clone();
        let arrival = context.extensions.get::<Arrival>().cloned();
        let sandbox = in_use.sandbox.clone();
        let result = tokio::spawn(async move {
            executor
                .run(
                    &sandbox,
                    arrival.as_ref(),
                    &args.code,
                    args.globals,
                    on_output,
                    &cancel,
                )
                .await
        })
        .await
        .map_err(|e| McpError::internal_error(format!("the call failed: {e}"), None));
        if let Some(progress) = progress {
            progress.abort();
        }
        let result = result?;
        let _ = forward.await;
        let Some(mut result) = result else {
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
            self.files_changed(&in_use, &context).await;
        }
        Ok(self.answer(result, &in_use).into())
    }

    /// Runs the tool `request` names.
    async fn dispatch(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        use crate::server::tools::tool::{
            CREATE_TOOL_NAME, DELETE_TOOL_NAME, DESTROY_TOOL_NAME, LIST_FILES_TOOL_NAME,
            RESET_TOOL_NAME, UPLOAD_TOOL_NAME,
        };
        match request.name.as_ref() {
            TOOL_NAME => return self.run_code(request, context).await,
            _ if !self.stateful() => {}
            CREATE_TOOL_NAME => return self.create(request, &context).await,
            LIST_FILES_TOOL_NAME => return self.list_files(request, &context).await,
            DESTROY_TOOL_NAME => return self.destroy(request, &context).await,
            UPLOAD_TOOL_NAME | DELETE_TOOL_NAME => return self.write_file(request, &context).await,
            RESET_TOOL_NAME => return self.reset(request, &context).await,
            _ => {}
        }
        let names = tool::tool_names(self.stateful())
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ");
        Err(McpError::invalid_params(
            format!("unknown tool `{}`: this server has {names}", request.name),
            None,
        ))
    }
}

impl ServerHandler for RunPythonServer {
    fn get_info(&self) -> ServerConfig {
        // A sandbox's files are resources only with `--stateful`: the drop-in offers tools only.
        // Code mode serves `mcp_tools.pyi` as a resource.
        let capabilities = if self.stateful() {
            ServerCapabilities::builder()
                .enable_tools()
                .enable_logging()
                .enable_resources()
                .enable_resources_list_changed()
                .build()
        } else if self.executor.upstreams.is_some() {
            ServerCapabilities::builder()
                .enable_tools()
                .enable_logging()
                .enable_resources()
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
        Ok(ListToolsResult::with_all_items(self.tools().into_owned()))
    }

    /// The tool `name` (rmcp checks `Mcp-Param-*` headers against its input schema, SEP-2243).
    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools().iter().find(|t| t.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let _in_flight = self.activity.as_ref().map(|a| a.begin());
        let _call = self.drain.begin_call();
        let started = std::time::Instant::now();
        let tool = tool::known_name(&request.name, self.stateful());
        let answer = self.dispatch(request, context).await;
        let status = match &answer {
            Err(_) => "invalid",
            Ok(CallToolResponse::Complete(result)) if result.is_error == Some(true) => "error",
            Ok(CallToolResponse::Complete(result)) => result
                .structured_content
                .as_ref()
                .and_then(|s| s.get("status"))
                .and_then(|s| s.as_str())
                .and_then(crate::server::call::result::Status::parse)
                .map(crate::server::call::result::Status::as_str)
                .unwrap_or("success"),
            Ok(_) => "success",
        };
        crate::metrics::tool_call(tool.unwrap_or("other"), status, started.elapsed());
        answer
    }

    /// The default sandbox's files, for a session that has one. Sandboxes reached by handle
    /// are never listed: for 2026-07-28 requests `resources/list` must not vary per caller
    /// (SEP-2567), and a handle is not to be shown to anyone but its holder.
    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let principal = self.principal_of(&context);
        let mut resources: Vec<rmcp::model::Resource> = self
            .executor
            .upstreams
            .iter()
            .map(|_| crate::server::tools::resources::code_mode_stub())
            .collect();
        let default = self
            .session_of(&context)
            .filter(|_| self.stateful())
            .and_then(SessionGuard::current_default)
            .filter(|sandbox| sandbox.belongs_to(principal.as_ref()));
        if let Some(sandbox) = default {
            resources.extend(sandbox.files().into_iter().map(|(path, size)| {
                crate::server::tools::resources::describe(sandbox.id.as_str(), &path, size)
            }));
        }
        Ok(ListResourcesResult::with_all_items(resources))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        let templates = if self.stateful() {
            vec![crate::server::tools::resources::template()]
        } else {
            Vec::new()
        };
        Ok(ListResourceTemplatesResult::with_all_items(templates))
    }

    /// A file of any live sandbox whose handle the URI carries (the handle is the capability).
    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let not_found = |why: &dyn std::fmt::Display| {
            McpError::resource_not_found(
                format!("resource {:?} not found: {why}", request.uri),
                None,
            )
        };
        if let (Some(upstreams), crate::upstream::catalog::STUB_URI) =
            (&self.executor.upstreams, request.uri.as_str())
        {
            let stub = upstreams.published().stub.clone();
            let contents = rmcp::model::ResourceContents::text(stub, request.uri.clone())
                .with_mime_type(crate::server::tools::resources::STUB_MIME_TYPE);
            return Ok(ReadResourceResult::new(vec![contents]).into());
        }
        if !self.stateful() {
            return Err(not_found(&"this server has resources only with --stateful"));
        }
        let (handle, path) = crate::server::tools::resources::parse(&request.uri)
            .ok_or_else(|| not_found(&"it is not a sandbox://{sandbox_id}/{path} URI of a file"))?;
        let principal = self.principal_of(&context);
        let entered = self
            .registry
            .open(handle, principal.as_ref())
            .await
            .map_err(|m| not_found(&m))?;
        let bytes = self
            .executor
            .read_file(&entered.sandbox, &path)
            .await
            .map_err(|why| not_found(&why))?;
        let contents = crate::server::tools::resources::contents(&request.uri, &path, bytes);
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
