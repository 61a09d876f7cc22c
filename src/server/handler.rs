//! The MCP server handler (rmcp): `initialize`, `tools/list` and `tools/call`.
//!
//! `initialize` and `tools/list` never wait for a worker (DESIGN §3): PydanticAI gives
//! `initialize` five seconds, and booting Pyodide takes longer.

use super::execute::Executor;
use super::format::{render, ReturnMode};
use super::tool::{tool, TOOL_NAME};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use std::sync::Arc;

/// Shared state of all sessions.
#[derive(Clone)]
pub struct RunPythonServer {
    pub executor: Arc<Executor>,
    pub return_mode: ReturnMode,
    /// Largest `python_code` accepted (bytes).
    pub max_code_bytes: usize,
}

impl RunPythonServer {
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
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
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
        Ok(ListToolsResult::with_all_items(vec![tool()]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        if request.name != TOOL_NAME {
            return Err(McpError::invalid_params(
                format!(
                    "unknown tool `{}`: this server has only `{TOOL_NAME}`",
                    request.name
                ),
                None,
            ));
        }
        let (code, globals) = self.parse_arguments(request.arguments)?;
        let result = self.executor.run(&code, globals, Box::new(|_, _| {})).await;
        let text = render(&result, self.return_mode);
        Ok(CallToolResult::success(vec![ContentBlock::text(text)]).into())
    }
}
