//! The tools, each declared once (rmcp's `#[tool_router]` is the model): a type per tool
//! implements [`McpTool`] beside its handler, in a file named for it, and says there its name,
//! its definition (title, description, the hand-written input schema that the drop-in must keep
//! exactly), its argument type, whether only `--stateful` servers offer it, and how a call
//! reaches its sandbox ([`McpTool::Sandbox`]). Everything else is derived from that one
//! declaration through [`TOOLS`]: `tools/list`, the tool rmcp checks `Mcp-Param-*` headers
//! against, dispatch, metric labels, the unknown-tool error, and what a transport must know
//! before a call runs (whether it makes a sandbox: [`Reach`]).
//!
//! Every call opens the same way, in one place ([`handle_call`]): the arguments are parsed and
//! checked (a malformed one is an MCP `invalid_params` error), then the sandbox is found
//! (one that does not exist is a tool error the model reads), then the tool's handler runs.
//!
//! Also here: how a result is rendered ([`format`](mod@format)) and a sandbox's files as resources
//! ([`resources`]).

pub mod create_sandbox;
pub mod destroy_sandbox;
pub mod file_tools;
pub mod fork_sandbox;
pub mod format;
pub mod list_sandbox_files;
pub mod reach;
pub mod reset_session;
pub mod resources;
pub mod run_python_code;
pub mod schema;

use crate::server::handler::RunPythonServer;
use futures::future::BoxFuture;
use reach::Opening;
use rmcp::model::{CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock};
use rmcp::model::{JsonObject, Tool};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer};
use serde::de::DeserializeOwned;
use std::sync::OnceLock;

/// One tool's declaration: everything the server knows of it, in the tool's own file.
#[async_trait::async_trait]
pub trait McpTool: Send + Sync + 'static {
    /// The name clients call it by (`tools/call`'s `name`).
    const NAME: &'static str;
    /// Whether only `--stateful` servers offer it (the drop-in offers `run_python_code` only).
    const STATEFUL_ONLY: bool;
    /// Its arguments once parsed and checked.
    type Arguments: ToolArguments;
    /// What a call is handed besides its arguments: the sandbox it works in, found by
    /// [`handle_call`] before the handler runs, or nothing for a tool that makes or ends one by
    /// itself. Its [`Opening::REACH`] is what transports learn of the tool.
    type Sandbox: Opening;

    /// The definition `tools/list` shows (`stateful`: `--stateful`).
    fn definition(stateful: bool) -> Tool;

    /// Runs the call: `request` is the `tools/call` (its arguments taken out), `sandbox` what
    /// [`Self::Sandbox`] found.
    ///
    /// Errors: an MCP error for a call that cannot be answered with a result (cancelled, the
    /// server failing); a refusal the model should read is `Ok` with `isError` ([`tool_error`]).
    async fn call(
        server: &RunPythonServer,
        arguments: Self::Arguments,
        sandbox: Self::Sandbox,
        request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError>;
}

/// A tool's arguments: how a call's JSON becomes them, and the sandbox they name.
pub trait ToolArguments: Sized + Send {
    /// The arguments of a call of `tool` on `server`, parsed and checked before any sandbox is
    /// touched.
    ///
    /// Errors: [`Refusal::Invalid`] (`invalid_params`) for arguments of the wrong shape, or
    /// [`Refusal::Tool`] for a value the model should correct.
    fn parse(
        tool: &str,
        server: &RunPythonServer,
        raw: Option<JsonObject>,
    ) -> Result<Self, Refusal>;

    /// The sandbox they name (`sandbox_id`), as the caller gave it.
    fn sandbox_id(&self) -> Option<&str>;
}

/// Arguments checked by their shape alone (serde, `deny_unknown_fields`).
pub trait PlainArguments: DeserializeOwned + Send {
    /// The sandbox they name (`sandbox_id`), as the caller gave it.
    fn sandbox_id(&self) -> Option<&str> {
        None
    }
}

impl<T: PlainArguments> ToolArguments for T {
    fn parse(
        tool: &str,
        _server: &RunPythonServer,
        raw: Option<JsonObject>,
    ) -> Result<Self, Refusal> {
        Ok(parse(tool, raw)?)
    }

    fn sandbox_id(&self) -> Option<&str> {
        PlainArguments::sandbox_id(self)
    }
}

/// How a tool's call comes to a sandbox, as a transport needs to know it before the call runs
/// (to stamp its arrival in the sandbox, or to mint the handle of the sandbox it will make and
/// name it in a response header for a load balancer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// It works in the sandbox its `sandbox_id` names, else in the session's; with neither, it
    /// makes one (`run_python_code`) or is refused, as [`reach::WithoutHandle`] says.
    Uses(reach::WithoutHandle),
    /// It makes a new sandbox and names none (`create_sandbox`).
    Makes,
    /// It makes a new sandbox as a copy of the one its `sandbox_id` names, else of the
    /// session's, and waits for that one's earlier calls (`fork_sandbox`): the transport
    /// stamps its arrival in the source, and names the new one in a response header.
    Forks,
    /// It names, by a required `sandbox_id`, the sandbox it ends (`destroy_sandbox`).
    Ends,
}

impl Reach {
    /// Whether a call of this reach that names no sandbox makes one (`in_session`: the request
    /// belongs to a protocol session, whose own sandbox it would use instead).
    pub fn makes_one(self, in_session: bool) -> bool {
        match self {
            Reach::Makes | Reach::Forks => true,
            Reach::Uses(reach::WithoutHandle::Create) => !in_session,
            Reach::Uses(reach::WithoutHandle::Refuse) | Reach::Ends => false,
        }
    }
}

/// Why a call is refused before it runs.
#[derive(Debug)]
pub enum Refusal {
    /// Arguments of the wrong shape or over a limit: an MCP `invalid_params` error.
    Invalid(McpError),
    /// A value the model can correct (a file name that leaves the working directory): a tool
    /// error (`isError`) with these words.
    Tool(String),
}

impl From<McpError> for Refusal {
    fn from(e: McpError) -> Refusal {
        Refusal::Invalid(e)
    }
}

/// A handler as the table holds it: any tool's [`handle_call`], behind one function type.
type Handler = for<'a> fn(
    &'a RunPythonServer,
    CallToolRequestParams,
    &'a RequestContext<RoleServer>,
) -> BoxFuture<'a, Result<CallToolResponse, McpError>>;

/// One row of [`TOOLS`]: a tool's declaration, reduced to what the server looks up by name.
pub struct ToolEntry {
    /// [`McpTool::NAME`].
    pub name: &'static str,
    /// [`McpTool::STATEFUL_ONLY`].
    pub stateful_only: bool,
    /// [`Opening::REACH`] of [`McpTool::Sandbox`].
    pub reach: Reach,
    /// [`McpTool::definition`].
    definition: fn(bool) -> Tool,
    /// [`handle_call`] for the tool.
    handler: Handler,
}

impl ToolEntry {
    /// The row of tool `T`.
    const fn of<T: McpTool>() -> ToolEntry {
        ToolEntry {
            name: T::NAME,
            stateful_only: T::STATEFUL_ONLY,
            reach: <T::Sandbox as Opening>::REACH,
            definition: T::definition,
            handler: boxed_handle_call::<T>,
        }
    }

    /// Whether a server (`stateful`: `--stateful`) offers it.
    fn offered(&self, stateful: bool) -> bool {
        stateful || !self.stateful_only
    }
}

/// Every tool, in the order `tools/list` gives them.
pub static TOOLS: [ToolEntry; 8] = [
    ToolEntry::of::<run_python_code::RunPythonCode>(),
    ToolEntry::of::<create_sandbox::CreateSandbox>(),
    ToolEntry::of::<fork_sandbox::ForkSandbox>(),
    ToolEntry::of::<list_sandbox_files::ListSandboxFiles>(),
    ToolEntry::of::<destroy_sandbox::DestroySandbox>(),
    ToolEntry::of::<file_tools::UploadFile>(),
    ToolEntry::of::<file_tools::DeleteFile>(),
    ToolEntry::of::<reset_session::ResetSession>(),
];

/// The tool a server (`stateful`: `--stateful`) offers under `name`; `None` for a name it
/// does not have. Its `name` is a fixed string, fit for a metric label.
pub fn find(name: &str, stateful: bool) -> Option<&'static ToolEntry> {
    TOOLS.iter().find(|t| t.name == name && t.offered(stateful))
}

/// How calls of the tool `name` reach their sandbox, whether or not this server offers it
/// (a transport asks before the call is parsed); `None` for a name no server has.
pub fn reach_of(name: &str) -> Option<Reach> {
    TOOLS.iter().find(|t| t.name == name).map(|t| t.reach)
}

/// Every tool a server offers (`stateful`: `--stateful`), in the order of [`TOOLS`], built once
/// per server kind: `tools/list` reads them, and so does every 2026-07-28 `tools/call`, whose
/// `Mcp-Param-*` headers rmcp checks against the tool's schema.
pub fn definitions(stateful: bool) -> &'static [Tool] {
    static DROP_IN: OnceLock<Vec<Tool>> = OnceLock::new();
    static STATEFUL: OnceLock<Vec<Tool>> = OnceLock::new();
    let build = || {
        TOOLS
            .iter()
            .filter(|t| t.offered(stateful))
            .map(|t| (t.definition)(stateful))
            .collect()
    };
    if stateful {
        STATEFUL.get_or_init(build)
    } else {
        DROP_IN.get_or_init(build)
    }
}

/// Every tool of a server: as [`definitions`] gives them, with `run_python_code`'s description
/// naming the scientific runtime and its packages (`built_in`, `--runtime scientific`), or
/// ending with the network's section (`network`: `NetPolicy::summary`, the hosts the code may
/// reach and the secrets it may use) and code mode's (`code_mode`: `upstream::Catalog::summary`,
/// the MCP tools the code can call now).
pub fn definitions_for(
    stateful: bool,
    built_in: Option<&crate::packages::scientific::BuiltIn>,
    network: Option<&str>,
    code_mode: Option<&str>,
) -> std::borrow::Cow<'static, [Tool]> {
    let base = match (built_in, network, code_mode) {
        (None, None, None) => return std::borrow::Cow::Borrowed(definitions(stateful)),
        (Some(built_in), network, _) => {
            let networked = network.is_some();
            run_python_code::scientific_description(stateful, built_in, networked)
                + network.unwrap_or_default()
        }
        (None, None, Some(_)) => run_python_code::description(stateful),
        (None, Some(network), _) => run_python_code::networked_description(stateful) + network,
    };
    let description = base + code_mode.unwrap_or_default();
    std::borrow::Cow::Owned(definitions_with(stateful, description))
}

/// Every tool, as [`definitions`] gives them, with `description` as `run_python_code`'s.
fn definitions_with(stateful: bool, description: String) -> Vec<Tool> {
    let mut all = definitions(stateful).to_vec();
    if let Some(run) = all
        .iter_mut()
        .find(|t| t.name == run_python_code::RunPythonCode::NAME)
    {
        run.description = Some(description.into());
    }
    all
}

/// Runs the call `request` names on `server`.
///
/// Errors: `invalid_params` naming every tool the server has, for a name it does not have;
/// else what the tool's call returns.
pub async fn dispatch(
    server: &RunPythonServer,
    request: CallToolRequestParams,
    context: &RequestContext<RoleServer>,
) -> Result<CallToolResponse, McpError> {
    let stateful = server.stateful();
    match find(&request.name, stateful) {
        Some(tool) => (tool.handler)(server, request, context).await,
        None => {
            let names = TOOLS
                .iter()
                .filter(|t| t.offered(stateful))
                .map(|t| format!("`{}`", t.name))
                .collect::<Vec<_>>()
                .join(", ");
            Err(McpError::invalid_params(
                format!("unknown tool `{}`: this server has {names}", request.name),
                None,
            ))
        }
    }
}

/// [`handle_call`] as the table's [`Handler`].
fn boxed_handle_call<'a, T: McpTool>(
    server: &'a RunPythonServer,
    request: CallToolRequestParams,
    context: &'a RequestContext<RoleServer>,
) -> BoxFuture<'a, Result<CallToolResponse, McpError>> {
    Box::pin(handle_call::<T>(server, request, context))
}

/// The one opening of every call: parse and check the arguments, find the sandbox, run the
/// tool's handler.
async fn handle_call<T: McpTool>(
    server: &RunPythonServer,
    mut request: CallToolRequestParams,
    context: &RequestContext<RoleServer>,
) -> Result<CallToolResponse, McpError> {
    let raw = request.arguments.take();
    let arguments = match T::Arguments::parse(T::NAME, server, raw) {
        Ok(arguments) => arguments,
        Err(Refusal::Invalid(e)) => return Err(e),
        Err(Refusal::Tool(why)) => return Ok(tool_error(why)),
    };
    let sandbox = match T::Sandbox::open(server, arguments.sandbox_id(), context).await {
        Ok(sandbox) => sandbox,
        Err(no) => return Ok(tool_error(no)),
    };
    T::call(server, arguments, sandbox, &request, context).await
}

/// The argument that names a sandbox, in every tool that takes one.
pub const SANDBOX_ARGUMENT: &str = "sandbox_id";

/// The sandbox a `tools/call` names in its arguments, read before the call is parsed (a
/// transport stamping its arrival, the `Mcp-Param-Sandbox-Id` check); `None` when it names
/// none, or not as a string.
pub fn named_sandbox(call: &CallToolRequestParams) -> Option<&str> {
    call.arguments
        .as_ref()
        .and_then(|a| a.get(SANDBOX_ARGUMENT))
        .and_then(|v| v.as_str())
}

/// The arguments of a call of `tool` as `T` (serde, `deny_unknown_fields` on every argument
/// type, so that an argument of the wrong name or type is named).
///
/// Errors: an `invalid_params` error naming the tool and what is wrong (serde's words: the
/// unknown or missing field, the type expected).
pub fn parse<T: DeserializeOwned>(tool: &str, args: Option<JsonObject>) -> Result<T, McpError> {
    serde_json::from_value(serde_json::Value::Object(args.unwrap_or_default()))
        .map_err(|e| McpError::invalid_params(format!("invalid arguments for `{tool}`: {e}"), None))
}

/// A tool error (`isError: true`) that says `why`.
pub fn tool_error(why: impl std::fmt::Display) -> CallToolResponse {
    CallToolResult::error(vec![ContentBlock::text(why.to_string())]).into()
}

/// A successful answer: `text`, and `structured` as `structuredContent` (the tool's output
/// schema).
pub fn structured_answer(text: String, structured: serde_json::Value) -> CallToolResponse {
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = Some(structured);
    result.into()
}

/// A successful answer of one text.
pub fn text_answer(text: String) -> CallToolResponse {
    CallToolResult::success(vec![ContentBlock::text(text)]).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drop_in_offers_run_python_code_only_and_stateful_servers_all_eight() {
        let names = |stateful| {
            definitions(stateful)
                .iter()
                .map(|t| t.name.to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(false), ["run_python_code"]);
        assert_eq!(
            names(true),
            [
                "run_python_code",
                "create_sandbox",
                "fork_sandbox",
                "list_sandbox_files",
                "destroy_sandbox",
                "upload_file",
                "delete_file",
                "reset_session"
            ]
        );
        assert!(find("create_sandbox", false).is_none());
        assert_eq!(
            find("create_sandbox", true).map(|t| t.reach),
            Some(Reach::Makes)
        );
        assert_eq!(
            find("fork_sandbox", true).map(|t| t.reach),
            Some(Reach::Forks)
        );
        assert!(find("fork_sandbox", false).is_none());
    }

    #[test]
    fn only_create_sandbox_fork_sandbox_and_a_sessionless_run_make_a_sandbox() {
        let makes =
            |name, in_session| find(name, true).is_some_and(|t| t.reach.makes_one(in_session));
        assert!(makes("create_sandbox", true) && makes("create_sandbox", false));
        assert!(makes("fork_sandbox", true) && makes("fork_sandbox", false));
        assert!(makes("run_python_code", false) && !makes("run_python_code", true));
        for name in [
            "list_sandbox_files",
            "destroy_sandbox",
            "upload_file",
            "delete_file",
            "reset_session",
        ] {
            assert!(!makes(name, false), "{name}");
        }
    }
}
