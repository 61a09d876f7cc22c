//! `reset_session` (`--stateful`): clears a sandbox's state once its earlier calls
//! are done. The name is the drop-in line's and stays, though it acts on a sandbox, not a
//! protocol session. A tool of its own rather than an argument of `run_python_code`: it does
//! one destructive thing, which MCP's tool annotations can say (`destructiveHint`), so that a
//! client may ask before it runs.

use super::list_sandbox_files::SandboxArguments;
use super::reach::ExistingSandbox;
use super::schema::{object_schema, sandbox_id_property, sandbox_tool, Effect, OPTIONAL_SANDBOX};
use super::{text_answer, tool_error, McpTool};
use crate::sandbox::arrival::Arrival;
use crate::server::handler::RunPythonServer;
use rmcp::model::{CallToolRequestParams, CallToolResponse, Tool};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer};
use serde_json::json;

/// What `reset_session` answers, after the sandbox's name.
pub const RESET_DONE: &str = "its state was cleared: its interpreter was stopped, and its next run_python_code call starts in a new one with fresh globals and no files.";

/// The tool (see the module's documentation).
pub struct ResetSession;

#[async_trait::async_trait]
impl McpTool for ResetSession {
    const NAME: &'static str = "reset_session";
    const STATEFUL_ONLY: bool = true;
    type Arguments = SandboxArguments;
    type Sandbox = ExistingSandbox;

    /// An optional `sandbox_id`; destructive, idempotent, closed world.
    fn definition(_stateful: bool) -> Tool {
        sandbox_tool(
            Self::NAME,
            "Reset a Python sandbox",
            "Clear a sandbox's Python state: variables, functions, imports, installed packages and files are dropped, and its next run_python_code call starts in a new interpreter. The sandbox and its id remain.",
            object_schema(json!({"sandbox_id": sandbox_id_property(OPTIONAL_SANDBOX)}), &[]),
            Effect::Destructive,
        )
    }

    /// After the sandbox's earlier calls, drops its worker and files.
    async fn call(
        server: &RunPythonServer,
        _arguments: SandboxArguments,
        ExistingSandbox(in_use): ExistingSandbox,
        _request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let arrival = context.extensions.get::<Arrival>();
        if server.executor.reset(&in_use.sandbox, arrival).await {
            server.files_changed(&in_use, context).await;
        }
        if let Some(note) = server.save(&in_use).await {
            return Ok(tool_error(note));
        }
        Ok(text_answer(format!(
            "Sandbox {}: {RESET_DONE}",
            in_use.sandbox.id
        )))
    }
}
