//! `list_sandbox_files` (`--stateful`; mcp-python-code-interpreter's `list_session_files`): a sandbox's files as
//! its last call left them, with their sizes and resource URIs. Read-only.

use super::reach::ExistingSandbox;
use super::schema::{
    object_schema, open_ended, sandbox_id_property, sandbox_tool, Effect, OPTIONAL_SANDBOX,
};
use super::{structured_answer, McpTool, PlainArguments};
use crate::server::handler::RunPythonServer;
use rmcp::model::{CallToolRequestParams, CallToolResponse, Tool};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer};
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;

/// The arguments of the tools that only name a sandbox (`list_sandbox_files`,
/// `reset_session`): the sandbox, when not the session's own.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxArguments {
    #[serde(default)]
    pub sandbox_id: Option<String>,
}

impl PlainArguments for SandboxArguments {
    fn sandbox_id(&self) -> Option<&str> {
        self.sandbox_id.as_deref()
    }
}

/// The tool (see the module's documentation).
pub struct ListSandboxFiles;

#[async_trait::async_trait]
impl McpTool for ListSandboxFiles {
    const NAME: &'static str = "list_sandbox_files";
    const STATEFUL_ONLY: bool = true;
    type Arguments = SandboxArguments;
    type Sandbox = ExistingSandbox;

    fn definition(_stateful: bool) -> Tool {
        let output = object_schema(
            json!({
                "sandbox_id": {"type": "string"},
                "files": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "path": {"type": "string"},
                            "size": {"type": "integer", "description": "bytes"},
                            "uri": {"type": "string", "description": "The file as a resource"},
                        },
                        "required": ["path", "size", "uri"],
                    },
                },
            }),
            &["sandbox_id", "files"],
        );
        sandbox_tool(
            Self::NAME,
            "List a Python sandbox's files",
            "List the files in a sandbox's working directory, with their sizes and their resource URIs (sandbox://{sandbox_id}/{path}, readable with resources/read).",
            object_schema(json!({"sandbox_id": sandbox_id_property(OPTIONAL_SANDBOX)}), &[]),
            Effect::ReadOnly,
        )
        .with_raw_output_schema(Arc::new(open_ended(output)))
    }

    async fn call(
        _server: &RunPythonServer,
        _arguments: SandboxArguments,
        ExistingSandbox(in_use): ExistingSandbox,
        _request: &CallToolRequestParams,
        _context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let id = &in_use.sandbox.id;
        let files = in_use.sandbox.files();
        let mut text = match files.len() {
            0 => format!("Sandbox {id} has no files."),
            1 => format!("Sandbox {id} has 1 file:"),
            n => format!("Sandbox {id} has {n} files:"),
        };
        let mut listed = Vec::with_capacity(files.len());
        for (path, size) in &files {
            let uri = super::resources::uri(id.as_str(), path);
            text.push_str(&format!("\n{path} ({size} bytes) {uri}"));
            listed.push(json!({"path": path, "size": size, "uri": uri}));
        }
        Ok(structured_answer(
            text,
            json!({"sandbox_id": id.as_str(), "files": listed}),
        ))
    }
}
