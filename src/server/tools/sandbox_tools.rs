//! The tools of `--stateful` servers besides `run_python_code` (seed 002, SEP-2567):
//! `create_sandbox`, `list_sandbox_files`, `destroy_sandbox`, `upload_file`, `delete_file` and
//! `reset_session`. Arguments of the wrong shape are an MCP `invalid_params` error; a sandbox
//! that does not exist, a file name that leaves the working directory, or a file the
//! interpreter cannot write is a tool error (`isError`) that says why, so that the model can
//! act on it.

use crate::sandbox::live::Arrival;
use crate::server::handler::{tool_error, InUse, RunPythonServer, WithoutHandle};
use crate::server::tools::arguments::{
    self, CreateArguments, DestroyArguments, FileArguments, SandboxArguments, MAX_DEPENDENCIES,
};
use crate::server::tools::tool::{
    CREATE_TOOL_NAME, DESTROY_TOOL_NAME, LIST_FILES_TOOL_NAME, RESET_DONE, RESET_TOOL_NAME,
    UPLOAD_TOOL_NAME,
};
use rmcp::model::{CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer};
use serde_json::json;

/// A successful answer: `text`, and `structured` as `structuredContent` (the tool's output
/// schema).
fn answer(text: String, structured: serde_json::Value) -> CallToolResponse {
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = Some(structured);
    result.into()
}

/// How long a sandbox may go without a call, in words, for the answers that hand one out.
fn idle_words(idle: Option<std::time::Duration>) -> String {
    match idle {
        Some(idle) if idle.as_secs() >= 120 => format!("{} minutes", idle.as_secs() / 60),
        Some(idle) => format!("{} seconds", idle.as_secs_f64()),
        None => "ever".to_owned(),
    }
}

impl RunPythonServer {
    /// `create_sandbox`: a new sandbox with its interpreter and `dependencies` installed; the
    /// answer names its handle in text and in `structuredContent`.
    pub(crate) async fn create(
        &self,
        request: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let args: CreateArguments = arguments::parse(CREATE_TOOL_NAME, request.arguments)?;
        if args.dependencies.len() > MAX_DEPENDENCIES {
            return Err(McpError::invalid_params(
                format!("`dependencies` lists {} requirements, more than the limit of {MAX_DEPENDENCIES}", args.dependencies.len()),
                None,
            ));
        }
        let sandbox = match self.create_for(context, args.dependencies) {
            Ok(sandbox) => sandbox,
            Err(full) => return Ok(tool_error(full)),
        };
        let in_use = InUse::named(sandbox.clone());
        if let Err(why) = self.executor.prepare(&sandbox).await {
            self.registry.end(&sandbox.id);
            return Ok(tool_error(format!(
                "the sandbox could not be made ready: Error installing dependencies: {why}"
            )));
        }
        if let Some(note) = self.save(&in_use).await {
            tracing::warn!("sandbox {}: {note}", sandbox.id.short());
        }
        let id = &sandbox.id;
        let text = format!(
            "Created sandbox {id}. Pass \"sandbox_id\": \"{id}\" to run_python_code and the file tools to work in it: its variables, imports and files last from call to call until destroy_sandbox ends it, or until it has had no call for {}.",
            idle_words(self.registry.idle())
        );
        Ok(answer(text, json!({"sandbox_id": id.as_str()})))
    }

    /// `list_sandbox_files`: the sandbox's files as its last call left them.
    pub(crate) async fn list_files(
        &self,
        request: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let args: SandboxArguments = arguments::parse(LIST_FILES_TOOL_NAME, request.arguments)?;
        let in_use = match self
            .sandbox_for(args.sandbox_id.as_deref(), context, WithoutHandle::Refuse)
            .await
        {
            Ok(in_use) => in_use,
            Err(no) => return Ok(tool_error(no)),
        };
        let id = &in_use.sandbox.id;
        let files = in_use.sandbox.files();
        let mut text = match files.len() {
            0 => format!("Sandbox {id} has no files."),
            1 => format!("Sandbox {id} has 1 file:"),
            n => format!("Sandbox {id} has {n} files:"),
        };
        let mut listed = Vec::with_capacity(files.len());
        for (path, size) in &files {
            let uri = crate::server::tools::resources::uri(id.as_str(), path);
            text.push_str(&format!("\n{path} ({size} bytes) {uri}"));
            listed.push(json!({"path": path, "size": size, "uri": uri}));
        }
        Ok(answer(
            text,
            json!({"sandbox_id": id.as_str(), "files": listed}),
        ))
    }

    /// `destroy_sandbox`: once the calls that arrived before it are done, ends the sandbox.
    pub(crate) async fn destroy(
        &self,
        request: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let args: DestroyArguments = arguments::parse(DESTROY_TOOL_NAME, request.arguments)?;
        // Opened first, so that a sandbox saved by another replica is destroyed too.
        let principal = self.principal_of(context);
        if let Err(no) = self
            .registry
            .open(&args.sandbox_id, principal.as_ref())
            .await
        {
            return Ok(tool_error(no));
        }
        let sandbox = match self.registry.remove_named(&args.sandbox_id) {
            Ok(sandbox) => sandbox,
            Err(missing) => return Ok(tool_error(missing)),
        };
        // Whether it is this session's own sandbox, the one `resources/list` shows.
        let default = self
            .session_of(context)
            .and_then(|s| s.current_default())
            .is_some_and(|d| d.id == sandbox.id);
        let arrival = context.extensions.get::<Arrival>();
        drop(sandbox.queue(arrival).await);
        sandbox.end();
        if default {
            let _ = context.peer.notify_resource_list_changed().await;
        }
        tracing::debug!("sandbox {} destroyed", sandbox.id.short());
        let text = format!(
            "Destroyed sandbox {}: its interpreter, variables and files are gone.",
            sandbox.id
        );
        Ok(CallToolResult::success(vec![ContentBlock::text(text)]).into())
    }

    /// `reset_session`: after the sandbox's earlier calls, drops its interpreter and files.
    pub(crate) async fn reset(
        &self,
        request: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let args: SandboxArguments = arguments::parse(RESET_TOOL_NAME, request.arguments)?;
        let in_use = match self
            .sandbox_for(args.sandbox_id.as_deref(), context, WithoutHandle::Refuse)
            .await
        {
            Ok(in_use) => in_use,
            Err(no) => return Ok(tool_error(no)),
        };
        let arrival = context.extensions.get::<Arrival>();
        if self.executor.reset(&in_use.sandbox, arrival).await {
            self.files_changed(&in_use, context).await;
        }
        if let Some(note) = self.save(&in_use).await {
            return Ok(tool_error(note));
        }
        let done = format!("Sandbox {}: {RESET_DONE}", in_use.sandbox.id);
        Ok(CallToolResult::success(vec![ContentBlock::text(done)]).into())
    }

    /// `upload_file` and `delete_file`.
    pub(crate) async fn write_file(
        &self,
        request: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let upload = request.name == UPLOAD_TOOL_NAME;
        let args: FileArguments = arguments::parse(&request.name, request.arguments)?;
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
                    "`delete_file` takes only `name` and `sandbox_id`",
                    None,
                ))
            }
        };
        let path = match crate::server::tools::resources::checked_name(&args.name) {
            Ok(path) => path,
            Err(bad) => return Ok(tool_error(format!("{:?}: {bad}", args.name))),
        };
        let in_use = match self
            .sandbox_for(args.sandbox_id.as_deref(), context, WithoutHandle::Refuse)
            .await
        {
            Ok(in_use) => in_use,
            Err(no) => return Ok(tool_error(no)),
        };
        let arrival = context.extensions.get::<Arrival>();
        let written = self
            .executor
            .write_file(&in_use.sandbox, arrival, path, content.as_deref())
            .await;
        match written {
            Ok(changed) => {
                if let Some(note) = self.save(&in_use).await {
                    return Ok(tool_error(note));
                }
                if changed {
                    self.files_changed(&in_use, context).await;
                }
                let id = &in_use.sandbox.id;
                let done = match &content {
                    Some(bytes) => format!("wrote {path} ({} bytes) in sandbox {id}", bytes.len()),
                    None => format!("deleted {path} in sandbox {id}"),
                };
                Ok(CallToolResult::success(vec![ContentBlock::text(done)]).into())
            }
            Err(why) => Ok(tool_error(format!(
                "could not {} {path}: {why}",
                if upload { "write" } else { "delete" }
            ))),
        }
    }
}
