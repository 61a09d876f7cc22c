//! `upload_file` and `delete_file` (`--stateful`): put a file into a sandbox's working
//! directory (a CSV to analyse, as the original's development line's `upload_file` does), or
//! remove one. They share their argument type and the checks of a file's name; a name that
//! leaves the working directory, or a file the interpreter cannot write, is a tool error that
//! says why, so that the model can act on it.

use super::reach::{ExistingSandbox, InUse};
use super::schema::{object_schema, sandbox_id_property, sandbox_tool, Effect, OPTIONAL_SANDBOX};
use super::{parse, text_answer, tool_error, McpTool, Refusal, ToolArguments};
use crate::sandbox::arrival::Arrival;
use crate::server::handler::RunPythonServer;
use rmcp::model::{CallToolRequestParams, CallToolResponse, JsonObject, Tool};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer};
use serde::Deserialize;
use serde_json::json;

/// The description of the `name` argument of both file tools.
const NAME_DESCRIPTION: &str = "Path of the file relative to the working directory (the code's current directory), e.g. `data.csv` or `in/data.csv`; no `..`, no absolute path";

/// `upload_file` and `delete_file`, as clients send them.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileArguments {
    name: String,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    base64: Option<String>,
    #[serde(default)]
    sandbox_id: Option<String>,
}

/// A file tool's call, checked: the file's path relative to the working directory, what to
/// write there (`None`: remove it), and the sandbox named.
pub struct FileChange {
    path: String,
    content: Option<Vec<u8>>,
    sandbox_id: Option<String>,
}

impl ToolArguments for FileChange {
    /// `upload_file` needs exactly one of `text` and `base64`; `delete_file` takes neither.
    ///
    /// Errors: also [`Refusal::Invalid`] for content that is not base64, and [`Refusal::Tool`]
    /// for a name that cannot name a file of the working directory.
    fn parse(
        tool: &str,
        _server: &RunPythonServer,
        raw: Option<JsonObject>,
    ) -> Result<FileChange, Refusal> {
        let args: FileArguments = parse(tool, raw)?;
        let content = content(tool == UploadFile::NAME, args.text, args.base64)?;
        let path = crate::sandbox::files::checked_name(&args.name)
            .map_err(|bad| Refusal::Tool(format!("{:?}: {bad}", args.name)))?
            .to_owned();
        Ok(FileChange {
            path,
            content,
            sandbox_id: args.sandbox_id,
        })
    }

    fn sandbox_id(&self) -> Option<&str> {
        self.sandbox_id.as_deref()
    }
}

/// What a file tool writes (`upload`: `upload_file`) from its `text` or `base64` argument;
/// `None` for `delete_file`.
///
/// Errors: `invalid_params` for content that is not base64, or the wrong arguments given.
#[allow(clippy::result_large_err)]
fn content(
    upload: bool,
    text: Option<String>,
    base64: Option<String>,
) -> Result<Option<Vec<u8>>, McpError> {
    match (upload, text, base64) {
        (false, None, None) => Ok(None),
        (true, Some(text), None) => Ok(Some(text.into_bytes())),
        (true, None, Some(encoded)) => {
            use base64::Engine as _;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(encoded.trim())
                .map_err(|e| {
                    McpError::invalid_params(format!("`base64` is not base64: {e}"), None)
                })?;
            Ok(Some(bytes))
        }
        (true, _, _) => Err(McpError::invalid_params(
            "`upload_file` takes the content as exactly one of `text` and `base64`",
            None,
        )),
        (false, _, _) => Err(McpError::invalid_params(
            "`delete_file` takes only `name` and `sandbox_id`",
            None,
        )),
    }
}

/// Writes or removes the file of `change` in `in_use` once the sandbox's earlier calls are
/// done, saves the sandbox, and tells a session's client its resources changed.
async fn change_file(
    server: &RunPythonServer,
    change: FileChange,
    in_use: InUse,
    context: &RequestContext<RoleServer>,
) -> Result<CallToolResponse, McpError> {
    let FileChange { path, content, .. } = change;
    let arrival = context.extensions.get::<Arrival>();
    let written = server
        .executor
        .write_file(&in_use.sandbox, arrival, &path, content.as_deref())
        .await;
    let changed = match written {
        Ok(changed) => changed,
        Err(why) => {
            let verb = if content.is_some() { "write" } else { "delete" };
            return Ok(tool_error(format!("could not {verb} {path}: {why}")));
        }
    };
    if let Some(note) = server.save(&in_use).await {
        return Ok(tool_error(note));
    }
    if changed {
        server.files_changed(&in_use, context).await;
    }
    let id = &in_use.sandbox.id;
    Ok(text_answer(match &content {
        Some(bytes) => format!("wrote {path} ({} bytes) in sandbox {id}", bytes.len()),
        None => format!("deleted {path} in sandbox {id}"),
    }))
}

/// The two file tools, told apart by `UPLOAD`: they share their arguments, their checks and
/// their handler.
pub struct FileTool<const UPLOAD: bool>;

/// `upload_file`: `name`, the content as `text` (UTF-8) or `base64` (any bytes), and an
/// optional `sandbox_id`.
pub type UploadFile = FileTool<true>;

/// `delete_file`: `name` and an optional `sandbox_id`.
pub type DeleteFile = FileTool<false>;

/// `upload_file`'s definition.
fn upload_definition() -> Tool {
    let schema = object_schema(
        json!({
            "name": {"type": "string", "description": NAME_DESCRIPTION},
            "text": {"type": "string", "description": "The file's content as text (written as UTF-8); give this or `base64`"},
            "base64": {"type": "string", "description": "The file's content as base64 (any bytes); give this or `text`"},
            "sandbox_id": sandbox_id_property(OPTIONAL_SANDBOX),
        }),
        &["name"],
    );
    sandbox_tool(
        UploadFile::NAME,
        "Upload a file to a Python sandbox",
        "Write a file into a sandbox's working directory (replacing one of the same name), so that run_python_code can open it by its name.",
        schema,
        Effect::Destructive,
    )
}

/// `delete_file`'s definition.
fn delete_definition() -> Tool {
    let schema = object_schema(
        json!({
            "name": {"type": "string", "description": NAME_DESCRIPTION},
            "sandbox_id": sandbox_id_property(OPTIONAL_SANDBOX),
        }),
        &["name"],
    );
    sandbox_tool(
        DeleteFile::NAME,
        "Delete a file of a Python sandbox",
        "Remove a file from a sandbox's working directory.",
        schema,
        Effect::Destructive,
    )
}

#[async_trait::async_trait]
impl<const UPLOAD: bool> McpTool for FileTool<UPLOAD> {
    const NAME: &'static str = if UPLOAD { "upload_file" } else { "delete_file" };
    const STATEFUL_ONLY: bool = true;
    type Arguments = FileChange;
    type Sandbox = ExistingSandbox;

    fn definition(_stateful: bool) -> Tool {
        if UPLOAD {
            upload_definition()
        } else {
            delete_definition()
        }
    }

    async fn call(
        server: &RunPythonServer,
        arguments: FileChange,
        ExistingSandbox(in_use): ExistingSandbox,
        _request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        change_file(server, arguments, in_use, context).await
    }
}
