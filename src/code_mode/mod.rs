//! Code mode (docs/architecture.md §11): the operator's upstream MCP servers (`--tools-config`), which code in
//! a sandbox calls through `import mcp_tools`.
//!
//! The front is their MCP client (rmcp's): one connection per server, kept by a supervisor
//! task that connects, lists the tools (again on `notifications/tools/list_changed`), and
//! reconnects with a growing pause when the connection is lost. The tools allowed by each
//! server's `allowedTools` form the [`Catalog`]; nothing else exists inside the sandbox.
//!
//! A sandbox's tool call crosses the worker protocol as a typed frame bound to its running call
//! (`Reply::ToolCall`), and the front makes the upstream request here, under the call's
//! deadline and its [`ToolBudget`]. Credentials (a stdio server's env, an HTTP server's
//! headers) live only in this process: the workers are started with an empty environment and
//! never receive them. Every upstream request names the sandbox that made it in `_meta`
//! ([`SANDBOX_META_KEY`]), by a digest of its handle rather than the handle itself, which is a
//! capability.

pub mod catalog;
pub mod config;
mod connection;
pub mod functions;

use crate::protocol::{FunctionCall, ToolAnswer, ToolCall, ToolItem};
pub use catalog::Catalog;
use config::ServerConfig;
use connection::Connection;
pub use functions::FunctionCallError;
use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock, RequestMetaObject};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use tracing::Instrument as _;

/// The `_meta` key of an upstream request that names the sandbox it came from (a hex digest
/// of the sandbox's handle, 16 characters, as the state directory names it).
pub const SANDBOX_META_KEY: &str = "io.github.mcp-run-python/sandbox";

/// `--max-tool-calls` unless given: tool calls one `run_python_code` call may make.
pub const DEFAULT_MAX_TOOL_CALLS: usize = 1000;

/// `--max-tool-bytes` unless given: bytes of tool answers one `run_python_code` call may
/// receive (64 MiB).
pub const DEFAULT_MAX_TOOL_BYTES: usize = 64 << 20;

/// What one `run_python_code` call may spend on tool calls (`--max-tool-calls`,
/// `--max-tool-bytes`); the calls also count against its deadline (`--timeout`).
#[derive(Debug, Clone, Copy)]
pub struct ToolLimits {
    pub calls: usize,
    pub bytes: usize,
}

/// A run's tool calls reached one of its limits: the call is not made, or its answer is
/// dropped. User code sees the text (as `mcp_tools.ToolError` or
/// `mcp_run_python.FunctionError`), which names the option that sets the limit.
#[derive(Debug, thiserror::Error)]
pub enum BudgetExceeded {
    /// `--max-tool-calls`: `limit` calls were made already.
    #[error(
        "this run already made {limit} tool calls, the most one call may make (--max-tool-calls)"
    )]
    Calls { limit: usize },
    /// `--max-tool-bytes`: the answers passed `limit` bytes.
    #[error("the tools' answers in this run passed {limit} bytes, the most one call may receive (--max-tool-bytes)")]
    Bytes { limit: usize },
}

/// Why an upstream tool call of code mode failed. It is never an error of the run: user code
/// sees the text as `mcp_tools.ToolError` ([`ToolAnswer::Error`]).
#[derive(Debug, thiserror::Error)]
pub enum ToolCallError {
    /// No upstream server of that name (`--tools-config`).
    #[error("there is no MCP server {server:?}")]
    NoServer { server: String },
    /// The server has no allowed tool of that name now.
    #[error("MCP server {server:?} has no tool {tool:?}")]
    NoTool { server: String, tool: String },
    /// The run's tool calls reached a limit.
    #[error(transparent)]
    Budget(#[from] BudgetExceeded),
    /// The server's connection is lost; its supervisor is reconnecting.
    #[error("MCP server {server:?} is not connected now (reconnecting)")]
    NotConnected { server: String },
    /// The server asked for input (elicitation) or started a task instead of answering.
    #[error(
        "MCP server {server:?} asked for input or started a task, which code mode cannot answer"
    )]
    Unanswerable { server: String },
    /// The request failed (the server's error, a lost connection); rmcp's words follow.
    #[error("MCP server {server:?}: {source}")]
    Upstream {
        server: String,
        #[source]
        source: rmcp::ServiceError,
    },
}

/// The tool calls one run has left.
#[derive(Debug)]
pub struct ToolBudget {
    limits: ToolLimits,
    calls: usize,
    bytes: usize,
}

impl ToolBudget {
    pub fn new(limits: ToolLimits) -> ToolBudget {
        ToolBudget {
            limits,
            calls: 0,
            bytes: 0,
        }
    }

    /// Counts one more call.
    ///
    /// Errors: [`BudgetExceeded::Calls`] past the limit (the call is not made).
    fn spend_call(&mut self) -> Result<(), BudgetExceeded> {
        if self.calls >= self.limits.calls {
            return Err(BudgetExceeded::Calls {
                limit: self.limits.calls,
            });
        }
        self.calls += 1;
        Ok(())
    }

    /// Counts `bytes` of answer.
    ///
    /// Errors: [`BudgetExceeded::Bytes`] past the limit (the answer is dropped).
    fn spend_bytes(&mut self, bytes: usize) -> Result<(), BudgetExceeded> {
        self.bytes = self.bytes.saturating_add(bytes);
        if self.bytes > self.limits.bytes {
            return Err(BudgetExceeded::Bytes {
                limit: self.limits.bytes,
            });
        }
        Ok(())
    }
}

/// The catalog as each consumer needs it, made once per change.
pub struct Published {
    pub catalog: Catalog,
    /// What interpreters build `mcp_tools` from.
    pub for_worker: serde_json::Value,
    /// The code-mode section of the `run_python_code` description.
    pub summary: String,
    /// `mcp_tools.pyi` ([`catalog::STUB_URI`]).
    pub stub: String,
}

impl Published {
    fn new(catalog: Catalog) -> Published {
        Published {
            for_worker: serde_json::to_value(&catalog).unwrap_or_default(),
            summary: catalog.summary(),
            stub: catalog.stub(),
            catalog,
        }
    }
}

/// Every upstream server and the catalog of their allowed tools, and the launcher's host
/// functions.
pub struct Upstreams {
    connections: Vec<Arc<Connection>>,
    functions: Option<Arc<functions::Channel>>,
    published: RwLock<Arc<Published>>,
    version: AtomicU64,
    /// How many times the tools our clients see changed: `run_python_code`'s description,
    /// which lists the upstream tools (see [`Upstreams::watch_tools`]).
    tools_changed: tokio::sync::watch::Sender<u64>,
    pub limits: ToolLimits,
}

impl Upstreams {
    /// Starts a supervisor per server and waits until each has connected and listed its tools
    /// or failed once (it then goes on trying in the background).
    /// `functions`: the launcher's host functions (`--functions-socket`), when it has some.
    pub async fn start(
        servers: Vec<ServerConfig>,
        functions: Option<Arc<functions::Channel>>,
        limits: ToolLimits,
    ) -> Arc<Upstreams> {
        let upstreams = Arc::new_cyclic(|me: &std::sync::Weak<Upstreams>| Upstreams {
            connections: servers
                .into_iter()
                .map(|config| Arc::new(Connection::new(config, me.clone())))
                .collect(),
            functions,
            published: RwLock::new(Arc::new(Published::new(Catalog::default()))),
            version: AtomicU64::new(0),
            tools_changed: tokio::sync::watch::Sender::new(0),
            limits,
        });
        let first = upstreams
            .connections
            .iter()
            .map(|c| c.clone().supervise())
            .collect::<Vec<_>>();
        futures::future::join_all(first).await;
        upstreams.republish();
        upstreams
    }

    /// The catalog now.
    pub fn published(&self) -> Arc<Published> {
        self.published
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The tool-list change signal: its value counts the changes of the code-mode section of
    /// `run_python_code`'s description (an upstream tool added, removed or redescribed; a
    /// server connected or lost), and a receiver wakes at each. What tells our clients
    /// `notifications/tools/list_changed` (MCP spec, tools: list changed; SEP-2575's
    /// `subscriptions/listen` for 2026-07-28 clients).
    pub fn watch_tools(&self) -> tokio::sync::watch::Receiver<u64> {
        self.tools_changed.subscribe()
    }

    /// Rebuilds the catalog from every connection's tools (after a listing, a connection or a
    /// loss), and signals [`Upstreams::watch_tools`] when the description changed.
    fn republish(&self) {
        let version = self.version.fetch_add(1, Ordering::SeqCst) + 1;
        let servers: Vec<(String, Vec<rmcp::model::Tool>)> = self
            .connections
            .iter()
            .map(|c| (c.config.name.clone(), c.tools()))
            .collect();
        let functions = self
            .functions
            .as_ref()
            .map(|f| f.functions.clone())
            .unwrap_or_default();
        let published = Arc::new(Published::new(Catalog::new(version, &servers, functions)));
        let changed = {
            let mut slot = self.published.write().unwrap_or_else(|p| p.into_inner());
            let changed = slot.summary != published.summary;
            *slot = published;
            changed
        };
        if changed {
            self.tools_changed.send_modify(|n| *n += 1);
        }
    }

    /// Makes `call` upstream for the sandbox whose handle digests to `sandbox` (for `_meta`),
    /// within `budget`. Never fails: every failure is a [`ToolAnswer::Error`] that user code
    /// sees as `mcp_tools.ToolError`. Returns the answer and its images' bytes. Dropping the
    /// future (the call's deadline, a cancelled call) cancels the upstream request
    /// (`notifications/cancelled`).
    pub async fn call(
        &self,
        call: ToolCall,
        sandbox: &str,
        budget: &mut ToolBudget,
    ) -> (ToolAnswer, Vec<Vec<u8>>) {
        let error = |e: ToolCallError| {
            let message = e.to_string();
            (ToolAnswer::Error { message }, Vec::new())
        };
        let Some(connection) = self
            .connections
            .iter()
            .find(|c| c.config.name == call.server)
        else {
            return error(ToolCallError::NoServer {
                server: call.server,
            });
        };
        let Some(tool) = connection.tool(&call.tool) else {
            return error(ToolCallError::NoTool {
                server: call.server,
                tool: call.tool,
            });
        };
        if let Err(exceeded) = budget.spend_call() {
            return error(exceeded.into());
        }
        let span = upstream_span(&call.server, &call.tool);
        let mut meta = RequestMetaObject::new();
        meta.insert(SANDBOX_META_KEY.to_owned(), sandbox.into());
        // The call's trace goes on to the upstream server (SEP-414).
        for (key, value) in crate::traces::context_of(&span) {
            meta.insert(key, value.into());
        }
        let mut params = CallToolRequestParams::new(call.tool.clone());
        params.arguments = Some(call.arguments);
        params.meta = Some(meta);
        let answer = match connection.call(params).instrument(span.clone()).await {
            Ok(result) => answer_of(result, catalog::wraps_result(&tool)),
            Err(failed) => {
                crate::traces::record_error(&span, "upstream_error");
                error(failed)
            }
        };
        let size = serde_json::to_vec(&answer.0).map_or(0, |j| j.len())
            + answer.1.iter().map(Vec::len).sum::<usize>();
        match budget.spend_bytes(size) {
            Ok(()) => answer,
            Err(exceeded) => error(exceeded.into()),
        }
    }
}

/// The span of a `tools/call` of `tool` on the upstream server `server` (OpenTelemetry's
/// semantic conventions for MCP: of kind client), a child of the current span (the run's).
fn upstream_span(server: &str, tool: &str) -> tracing::Span {
    tracing::info_span!(
        target: crate::traces::TARGET,
        "upstream tools/call",
        otel.name = format!("tools/call {tool}"),
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
        "error.type" = tracing::field::Empty,
        mcp.method.name = "tools/call",
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = tool,
        "server.name" = server,
    )
}

impl Upstreams {
    /// Calls a host function in the launcher for the sandbox tagged `sandbox`, within
    /// `budget`: its return value, or [`ToolAnswer::Error`] (`mcp_run_python.FunctionError`
    /// inside). Dropping the future cancels the call in the launcher.
    pub async fn call_function(
        &self,
        call: FunctionCall,
        sandbox: &str,
        budget: &mut ToolBudget,
    ) -> ToolAnswer {
        let error = |e: FunctionCallError| ToolAnswer::Error {
            message: e.to_string(),
        };
        let Some(channel) = &self.functions else {
            return error(FunctionCallError::NoFunctions);
        };
        if let Err(exceeded) = budget.spend_call() {
            return error(exceeded.into());
        }
        let span = crate::traces::step("host function");
        span.record("otel.name", format!("host function {}", call.function));
        let answer = match channel
            .call(&call.function, &call.args, &call.kwargs, sandbox)
            .instrument(span)
            .await
        {
            Ok(value) => ToolAnswer::Structured { value },
            Err(failed) => error(failed),
        };
        let size = serde_json::to_vec(&answer).map_or(0, |j| j.len());
        match budget.spend_bytes(size) {
            Ok(()) => answer,
            Err(exceeded) => error(exceeded.into()),
        }
    }
}

/// A tool's result as the sandbox gets it: an error's text, the structured content (its
/// `result` alone when the tool `wraps` a plain value, FastMCP's convention), or the content
/// blocks (images' bytes decoded out of base64, in order).
fn answer_of(result: CallToolResult, wraps: bool) -> (ToolAnswer, Vec<Vec<u8>>) {
    use base64::Engine as _;
    if result.is_error == Some(true) {
        let message = result
            .content
            .iter()
            .filter_map(|c| match c {
                ContentBlock::Text(t) => Some(t.text.as_str()),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n");
        return (ToolAnswer::Error { message }, Vec::new());
    }
    if let Some(mut value) = result.structured_content {
        if let (true, Some(inner)) = (wraps, value.get_mut("result")) {
            value = inner.take();
        }
        return (ToolAnswer::Structured { value }, Vec::new());
    }
    let mut images = Vec::new();
    let items = result
        .content
        .into_iter()
        .map(|block| match block {
            ContentBlock::Text(t) => ToolItem::Text { text: t.text },
            ContentBlock::Image(image) => {
                match base64::engine::general_purpose::STANDARD.decode(image.data.as_bytes()) {
                    Ok(bytes) => {
                        let size = bytes.len();
                        images.push(bytes);
                        ToolItem::Image {
                            mime_type: image.mime_type,
                            size,
                        }
                    }
                    Err(_) => ToolItem::Text {
                        text: "[an image whose data is not base64]".into(),
                    },
                }
            }
            other => ToolItem::Other {
                value: serde_json::to_value(&other).unwrap_or_default(),
            },
        })
        .collect();
    (ToolAnswer::Content { items }, images)
}

/// The digest that names sandbox `handle` upstream: 16 hex characters of its SHA-256.
pub fn sandbox_tag(handle: &str) -> String {
    crate::packages::cache::sha256_hex(handle.as_bytes())[..16].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// User code reads these words (`mcp_tools.ToolError`), and the client tests match them.
    #[test]
    fn a_spent_budget_says_which_limit_in_the_words_users_read() {
        let mut budget = ToolBudget::new(ToolLimits {
            calls: 1,
            bytes: 10,
        });
        assert!(budget.spend_call().is_ok());
        let calls = ToolCallError::from(budget.spend_call().unwrap_err()).to_string();
        assert_eq!(
            calls,
            "this run already made 1 tool calls, the most one call may make (--max-tool-calls)"
        );
        let bytes = FunctionCallError::from(budget.spend_bytes(11).unwrap_err()).to_string();
        assert_eq!(
            bytes,
            "the tools' answers in this run passed 10 bytes, the most one call may receive (--max-tool-bytes)"
        );
        let missing = ToolCallError::NoTool {
            server: "upstream".into(),
            tool: "hidden".into(),
        };
        assert_eq!(
            missing.to_string(),
            r#"MCP server "upstream" has no tool "hidden""#
        );
    }
}
