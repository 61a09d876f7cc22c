//! The MCP server handler (rmcp's `ServerHandler`): `initialize`, `tools/list`, `tools/call`
//! (through the tool table, [`crate::server::tools`]), the resources and `logging/setLevel`;
//! the server's state, per session where a transport has sessions; and what a request's
//! transport tells of it (its session, its principal, its arrival in a sandbox).
//!
//! MCP logging (`logging/setLevel`, `notifications/message`) is deprecated in the newest spec
//! revision, but PydanticAI's `log_level`/`log_handler` and the Deno original use it.
//!
//! `initialize` and `tools/list` never wait for a worker (docs/architecture.md §3): PydanticAI
//! gives `initialize` five seconds, and booting Pyodide takes longer.
#![allow(deprecated)]

use crate::sandbox::activity::Activity;
use crate::sandbox::handle::SandboxId;
use crate::sandbox::live::Principal;
use crate::sandbox::registry::{self, Registry};
use crate::server::call::execute::Executor;
use crate::server::listen;
use crate::server::sessions::{SessionGuard, Sessions, SessionsFull};
use crate::server::tasks::{may_become_task, CallTimeout, MintedTask, TaskId, Tasks};
use crate::server::tools::format::ReturnMode;
use crate::server::tools::{self, Reach};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, ClientJsonRpcMessage, ClientRequest,
    CustomRequest, CustomResult, GetExtensions, GetTaskParams, GetTaskResult, Implementation,
    ListPromptsRequestMethod, ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult,
    ListToolsResult, LoggingLevel, PaginatedRequestParams, ReadResourceRequestParams,
    ReadResourceResponse, ReadResourceResult, ServerCapabilities, ServerConfig,
    SetLevelRequestParams, SubscriptionFilter, Tool, UpdateTaskParams,
};
use rmcp::service::{NotificationContext, RequestContext, SubscriptionContext};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use std::sync::{Arc, Mutex};
use tracing::Instrument as _;

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
    /// Long calls as tasks (the MCP tasks extension, SEP-2663); `None`: the extension is not
    /// offered.
    pub tasks: Option<Arc<Tasks>>,
    /// The sandboxes' file changes, told to `subscriptions/listen` streams.
    pub changes: Arc<crate::server::listen::Changes>,
}

/// The count of a call that may become a task: its run's ending, kept until it is known
/// whether the call was answered (counted by `call_tool`) or became a task (counted here, when
/// the run ends, whichever comes last).
#[derive(Default)]
struct TaskCount(std::sync::Mutex<TaskCountState>);

#[derive(Default)]
struct TaskCountState {
    /// The run's ending (its status), once it ended.
    ended: Option<(&'static str, &'static str, std::time::Duration)>,
    /// The call was answered with a task.
    task: bool,
}

impl TaskCount {
    /// The run of `tool` ended with `status`, `started` ago.
    fn ended(&self, tool: &'static str, status: &'static str, started: std::time::Instant) {
        let took = started.elapsed();
        let mut state = self.0.lock().unwrap_or_else(|p| p.into_inner());
        state.ended = Some((tool, status, took));
        if state.task {
            crate::metrics::tool_call(tool, status, took);
        }
    }

    /// The call became a task: counted now if its run already ended, else when it does.
    fn became_task(&self) {
        let mut state = self.0.lock().unwrap_or_else(|p| p.into_inner());
        state.task = true;
        if let Some((tool, status, took)) = state.ended {
            crate::metrics::tool_call(tool, status, took);
        }
    }

    /// The run's ending, for a call answered without a task.
    fn ending(&self) -> Option<&'static str> {
        let state = self.0.lock().unwrap_or_else(|p| p.into_inner());
        state.ended.map(|(_, status, _)| status)
    }
}

/// How a `tools/call` is counted (`mcp_run_python_tool_calls_total`'s `status`): a run's
/// ending as its outcome noted it ([`Outcome::ending`](crate::server::call::result::Outcome::ending)),
/// else `invalid` (a protocol error), `error` (a tool error), `task` (the call became a task;
/// never counted under it) or `success`.
pub(crate) fn call_status(
    answer: &Result<CallToolResponse, McpError>,
    ending: Option<&'static str>,
) -> &'static str {
    match (answer, ending) {
        (Err(_), _) => "invalid",
        (Ok(CallToolResponse::Task(_)), _) => "task",
        (Ok(_), Some(ending)) => ending,
        (Ok(CallToolResponse::Complete(result)), None) if result.is_error == Some(true) => "error",
        (Ok(_), None) => "success",
    }
}

/// Whether a call counted as `status` ([`call_status`]) failed: its span then carries the
/// error status. A call that became a task has not ended yet.
fn call_failed(status: &str) -> bool {
    !matches!(status, "success" | "task")
}

/// The span of a `tools/call` (OpenTelemetry's semantic conventions for MCP: named
/// `tools/call <tool>`, of kind server), the child of the trace context its client sent in
/// `params._meta` (SEP-414), else in its HTTP request's headers ([`crate::traces`]).
fn call_span(
    request: &CallToolRequestParams,
    context: &RequestContext<RoleServer>,
) -> tracing::Span {
    let parts = context.extensions.get::<axum::http::request::Parts>();
    let header = |name: &str| {
        parts
            .and_then(|p| p.headers.get(name))
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let span = tracing::info_span!(
        target: crate::traces::TARGET,
        "tools/call",
        otel.name = format!("tools/call {}", request.name),
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        "error.type" = tracing::field::Empty,
        mcp.method.name = "tools/call",
        mcp.session.id = header(SESSION_HEADER),
        mcp.protocol.version = header("mcp-protocol-version"),
        jsonrpc.request.id = %context.id,
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %request.name,
        network.transport = if parts.is_some() { "tcp" } else { "pipe" },
    );
    let sent_in_meta = [request.meta.as_ref(), Some(&context.meta)]
        .into_iter()
        .flatten()
        .find(|meta| meta.get_traceparent().is_some());
    match (sent_in_meta, parts) {
        (Some(meta), _) => {
            crate::traces::set_parent(&span, &crate::traces::MetaCarrier(&meta.0 .0))
        }
        (None, Some(parts)) => {
            crate::traces::set_parent(&span, &crate::traces::HeaderCarrier(&parts.headers))
        }
        (None, None) => {}
    }
    span
}

/// What the HTTP front left in the extensions of `context`'s HTTP request (a
/// [`MintedSandbox`](tools::reach::MintedSandbox), a [`Principal`]); `None` over
/// stdio and SSE, whose messages have none.
pub fn http_extension<T: Send + Sync + 'static>(
    context: &RequestContext<RoleServer>,
) -> Option<&T> {
    context
        .extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<T>())
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
            tasks: None,
            changes: Arc::default(),
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

    /// Whether calls keep state and the sandbox tools are offered (`--stateful`).
    pub fn stateful(&self) -> bool {
        self.executor.settings.stateful
    }

    /// This server's tools: `run_python_code`'s description names the hosts the code may reach
    /// and its secrets (`--allow-net`, `--secret`); with code mode (`--tools-config`), it lists
    /// the MCP tools the code can call now; with `--runtime scientific`, it names that runtime
    /// and its packages.
    fn tools(&self) -> std::borrow::Cow<'static, [Tool]> {
        let settings = &self.executor.settings;
        let code_mode = settings.upstreams.as_ref().map(|u| u.published());
        let built_in = settings.runtimes.own_kit().built_in.as_deref();
        let network = settings.net.summary(match built_in {
            Some(_) => tools::run_python_code::SCIENTIFIC_HTTP,
            None => tools::run_python_code::PYODIDE_HTTP,
        });
        tools::definitions_for(
            self.stateful(),
            built_in,
            network.as_deref(),
            code_mode.as_ref().map(|p| p.summary.as_str()),
        )
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
        if tools::reach_of(&call.params.name) == Some(Reach::Makes) {
            // It makes a sandbox rather than working in one.
            return;
        }
        let sandbox = match tools::named_sandbox(&call.params) {
            // A malformed handle names no sandbox; the call itself says so.
            Some(text) => SandboxId::parse(text).and_then(|id| self.registry.peek(&id)),
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

    /// The tasks, when `request` may become one: a tool that can run long, called by a client
    /// that declared the tasks extension (SEP-2663: in the request's `_meta`, or at
    /// `initialize`).
    fn tasks_for(
        &self,
        request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Option<Arc<Tasks>> {
        let tasks = self.tasks.as_ref()?;
        may_become_task(&request.name, context.client_capabilities()).then(|| tasks.clone())
    }

    /// Runs `request` under `--task-timeout` on a task of its own: its answer if it comes
    /// within [`crate::server::tasks::TASK_AFTER`], else a task the client polls.
    ///
    /// Errors: the call's own error when it answered in time; `internal_error` when no task
    /// id could be made.
    async fn call_as_task(
        &self,
        tasks: Arc<Tasks>,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let id = match http_extension::<MintedTask>(&context) {
            Some(minted) => minted.0.clone(),
            None => TaskId::mint()
                .map_err(|e| McpError::internal_error(format!("no task id: {e}"), None))?,
        };
        let principal = self.principal_of(&context);
        let cancel = tokio_util::sync::CancellationToken::new();
        let mut inner = context.clone();
        inner.ct = cancel.clone();
        inner.extensions.insert(CallTimeout(tasks.limits.timeout));
        let server = self.clone();
        let in_flight = self.drain.begin_call();
        let counted = Arc::new(TaskCount::default());
        let counting = counted.clone();
        let tool = tools::find(&request.name, self.stateful()).map_or("other", |t| t.name);
        let started = std::time::Instant::now();
        // The run's span outlives the request's, which ends once the task is made.
        let run_span = crate::traces::step("task run");
        let run = tokio::spawn(
            async move {
                let _in_flight = in_flight;
                let (answer, ending) = crate::server::call::result::with_ending(tools::dispatch(
                    &server, request, &inner,
                ))
                .await;
                let status = call_status(&answer, ending);
                if call_failed(status) {
                    crate::traces::record_error(&tracing::Span::current(), status);
                }
                counting.ended(tool, status, started);
                answer
            }
            .instrument(run_span),
        );
        // Until the task exists, the client cancels the call as any other
        // (`notifications/cancelled`); afterwards only `tasks/cancel` does.
        let forward = {
            let (asked, cancel) = (context.ct.clone(), cancel.clone());
            tokio::spawn(async move {
                asked.cancelled().await;
                cancel.cancel();
            })
        };
        let unread = self.drain.begin_call();
        let answer = tasks
            .answer_or_task(id, principal, run, cancel, unread)
            .await;
        forward.abort();
        match &answer {
            // Counted when its run ends, by how it ended.
            Ok(CallToolResponse::Task(_)) => {
                crate::metrics::task_made(tool);
                counted.became_task();
            }
            // The run ended: counted by `call_tool`, with the ending it noted.
            _ => crate::server::call::result::note_ending_of(counted.ending()),
        }
        answer
    }

    /// The tasks, for a `tasks/*` request (rmcp has checked the client declared the
    /// extension, else -32021).
    fn tasks(&self) -> Result<&Tasks, McpError> {
        self.tasks
            .as_deref()
            .ok_or_else(|| McpError::internal_error("this server runs no tasks", None))
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
        } else if self.executor.settings.upstreams.is_some() {
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
        let mut capabilities =
            listen::with_list_changed(capabilities, self.executor.settings.upstreams.is_some());
        if self.tasks.is_some() {
            capabilities
                .extensions
                .get_or_insert_with(Default::default)
                .insert(
                    rmcp::model::TASKS_EXTENSION_ID.to_owned(),
                    Default::default(),
                );
        }
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
        let tool = tools::find(&request.name, self.stateful()).map(|t| t.name);
        let span = call_span(&request, &context);
        let (answer, ending) = crate::server::call::result::with_ending(
            async {
                match self.tasks_for(&request, &context) {
                    Some(tasks) => self.call_as_task(tasks, request, context).await,
                    None => tools::dispatch(self, request, &context).await,
                }
            }
            .instrument(span.clone()),
        )
        .await;
        let status = call_status(&answer, ending);
        if call_failed(status) {
            crate::traces::record_error(&span, status);
        }
        // A call that became a task is counted when its run ends (`TaskCount`).
        if !matches!(answer, Ok(CallToolResponse::Task(_))) {
            crate::metrics::tool_call(tool.unwrap_or("other"), status, started.elapsed());
        }
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
            .settings
            .upstreams
            .iter()
            .map(|_| tools::resources::code_mode_stub())
            .collect();
        let default = self
            .session_of(&context)
            .filter(|_| self.stateful())
            .and_then(SessionGuard::current_default)
            .filter(|sandbox| sandbox.belongs_to(principal.as_ref()));
        if let Some(sandbox) = default {
            resources.extend(
                sandbox.files().into_iter().map(|(path, size)| {
                    tools::resources::describe(sandbox.id.as_str(), &path, size)
                }),
            );
        }
        Ok(ListResourcesResult::with_all_items(resources))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        let templates = if self.stateful() {
            vec![tools::resources::template()]
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
        // SEP-2164: the error names the URI it did not find in `data.uri`.
        let not_found = |why: &dyn std::fmt::Display| {
            McpError::resource_not_found(
                format!("resource {:?} not found: {why}", request.uri),
                Some(serde_json::json!({"uri": request.uri})),
            )
        };
        if let (Some(upstreams), crate::code_mode::catalog::STUB_URI) =
            (&self.executor.settings.upstreams, request.uri.as_str())
        {
            let stub = upstreams.published().stub.clone();
            let contents = rmcp::model::ResourceContents::text(stub, request.uri.clone())
                .with_mime_type(tools::resources::STUB_MIME_TYPE);
            return Ok(ReadResourceResult::new(vec![contents]).into());
        }
        if !self.stateful() {
            return Err(not_found(&"this server has resources only with --stateful"));
        }
        let (handle, path) = tools::resources::parse(&request.uri)
            .ok_or_else(|| not_found(&"it is not a sandbox://{sandbox_id}/{path} URI of a file"))?;
        let id = registry::named(handle).map_err(|m| not_found(&m))?;
        let principal = self.principal_of(&context);
        let entered = self
            .registry
            .open(&id, principal.as_ref())
            .await
            .map_err(|m| not_found(&m))?;
        let bytes = self
            .executor
            .read_file(&entered.sandbox, &path)
            .await
            .map_err(|why| not_found(&why))?;
        let contents = tools::resources::contents(&request.uri, &path, bytes);
        Ok(ReadResourceResult::new(vec![contents]).into())
    }

    /// `tasks/get` (SEP-2663): the task as its owner may see it.
    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        let principal = self.principal_of(&context);
        let task = self
            .tasks()?
            .get(&request.task_id, principal.as_ref())
            .await?;
        Ok(GetTaskResult::new(task))
    }

    /// `tasks/update` (SEP-2663): our tasks never ask for input; acknowledged for a task the
    /// caller may see.
    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let principal = self.principal_of(&context);
        self.tasks()?
            .update(&request.task_id, principal.as_ref())
            .await
    }

    /// `tasks/cancel` (SEP-2663): stops the task's interpreter.
    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let principal = self.principal_of(&context);
        self.tasks()?
            .cancel(&request.task_id, principal.as_ref())
            .await
    }

    /// A request rmcp could not read as one it knows: a `tasks/*` with malformed params gets
    /// `invalid_params` saying what is wrong (-32021 first for a client that did not declare
    /// the extension); anything else is an unknown method.
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, McpError> {
        let Some(malformed) = crate::server::tasks::malformed(&request.method, request.params)
        else {
            return Err(McpError::new(
                rmcp::model::ErrorCode::METHOD_NOT_FOUND,
                request.method,
                None,
            ));
        };
        let declared = context
            .client_capabilities()
            .is_some_and(|c| c.supports_tasks());
        if self.tasks.is_some() && !declared {
            return Err(McpError::missing_required_client_capability(
                rmcp::model::ClientCapabilities::builder()
                    .enable_tasks()
                    .build(),
            ));
        }
        Err(malformed)
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        *self.log_level.lock().unwrap_or_else(|p| p.into_inner()) = Some(request.level);
        Ok(())
    }

    /// Prompts are not served: `prompts/list` is an unknown method (-32601), as the prompts
    /// capability is not declared (SEP-2575: a server that handles prompts declares them).
    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        Err(McpError::method_not_found::<ListPromptsRequestMethod>())
    }

    /// The changes a `subscriptions/listen` stream can hear of (SEP-2575; see [`listen`]).
    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        let code_mode = self.executor.settings.upstreams.is_some();
        Some(listen::accepted_filter(
            requested,
            code_mode,
            self.stateful(),
        ))
    }

    /// One `subscriptions/listen` stream, acknowledged already (see [`listen::serve`]).
    async fn listen(&self, subscription: SubscriptionContext) -> Result<(), McpError> {
        // Held like a call, so that a drain, which ends the stream, waits for its final result
        // to go out before the server stops.
        let _in_flight = self.drain.begin_call();
        let sources = listen::Sources {
            changes: &self.changes,
            tools: self
                .executor
                .settings
                .upstreams
                .as_ref()
                .map(|u| u.watch_tools()),
            stateful: self.stateful(),
            principal: self.principal_of(subscription.request_context()),
            draining: self.drain.draining_token(),
        };
        listen::serve(subscription, sources).await
    }

    /// A 2025-11-25 session is open: its client hears `notifications/tools/list_changed`
    /// when code mode's tools change, until the session ends.
    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        let has_session = match context.extensions.get::<axum::http::request::Parts>() {
            Some(parts) => parts.headers.contains_key(SESSION_HEADER),
            None => true,
        };
        if let (Some(upstreams), Some(session), true) = (
            &self.executor.settings.upstreams,
            &self.session,
            has_session,
        ) {
            listen::tell_session(context.peer, upstreams.watch_tools(), session.ended());
        }
    }
}
