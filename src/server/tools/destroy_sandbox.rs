//! `destroy_sandbox` (`--stateful`; mcp-python-code-interpreter's `clear_session`): once the calls that arrived
//! before it are done, ends the sandbox its required `sandbox_id` names. Destructive.

use super::reach::RemovedSandbox;
use super::schema::{object_schema, sandbox_id_property, sandbox_tool, Effect};
use super::{text_answer, McpTool, PlainArguments};
use crate::sandbox::arrival::Arrival;
use crate::server::handler::RunPythonServer;
use rmcp::model::{CallToolRequestParams, CallToolResponse, Tool};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer};
use serde::Deserialize;
use serde_json::json;

/// `destroy_sandbox`'s arguments.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DestroyArguments {
    pub sandbox_id: String,
}

impl PlainArguments for DestroyArguments {
    fn sandbox_id(&self) -> Option<&str> {
        Some(&self.sandbox_id)
    }
}

/// The tool (see the module's documentation).
pub struct DestroySandbox;

#[async_trait::async_trait]
impl McpTool for DestroySandbox {
    const NAME: &'static str = "destroy_sandbox";
    const STATEFUL_ONLY: bool = true;
    type Arguments = DestroyArguments;
    type Sandbox = RemovedSandbox;

    fn definition(_stateful: bool) -> Tool {
        sandbox_tool(
            Self::NAME,
            "Destroy a Python sandbox",
            "End a sandbox: its interpreter, variables and files are gone, and its id no longer works.",
            object_schema(
                json!({"sandbox_id": sandbox_id_property("The sandbox to destroy")}),
                &["sandbox_id"],
            ),
            Effect::Destructive,
        )
    }

    async fn call(
        server: &RunPythonServer,
        _arguments: DestroyArguments,
        RemovedSandbox(sandbox): RemovedSandbox,
        _request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        // Whether it is this session's own sandbox, the one `resources/list` shows.
        let default = server
            .session_of(context)
            .and_then(|s| s.current_default())
            .is_some_and(|d| d.id == sandbox.id);
        let arrival = context.extensions.get::<Arrival>();
        drop(sandbox.queue(arrival).await);
        sandbox.end();
        server.changes.files_changed(&sandbox);
        if default {
            let _ = context.peer.notify_resource_list_changed().await;
        }
        tracing::debug!("sandbox {} destroyed", sandbox.id.short());
        Ok(text_answer(format!(
            "Destroyed sandbox {}: its interpreter, variables and files are gone.",
            sandbox.id
        )))
    }
}
