//! The `run_python_code` tool: its name, description and input schema (DESIGN §4, seed 000).

use crate::packages::wheel::target;
use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use serde_json::json;

/// The tool's name, as in the Deno original.
pub const TOOL_NAME: &str = "run_python_code";

/// The tool's title, as in the Deno original.
pub const TITLE: &str = "Run Python code";

/// What the description adds with `--stateful`, so that a model knows it may rely on state.
const STATEFUL_NOTE: &str = "

State persists between calls in this session, as in a notebook: variables, functions and imports defined by one call are there in the next. A result with a <state> section says when that state was lost (the interpreter was stopped, for example after a timeout), so that the setup can be run again.";

/// The tool description shown to models: the original's first sentences, then the real
/// Python version (the one the embedded Pyodide runs) and what this server adds; with
/// `stateful` (`--stateful`), that state persists within a session.
pub fn description(stateful: bool) -> String {
    let base = format!(
        "Tool to execute Python code and return stdout, stderr, and return value.

The code may be async, and the value on the last line will be returned as the return value.

The code will be executed with Python {python} (Pyodide {pyodide}, in a WebAssembly sandbox without network or host file access).

Dependencies are installed automatically: either from the imports in the code, or from PEP 723 inline script metadata (`# /// script` … `dependencies = [...]` … `# ///`).",
        python = target::PYTHON_VERSION,
        pyodide = target::PYODIDE_VERSION,
    );
    if stateful {
        base + STATEFUL_NOTE
    } else {
        base
    }
}

/// JSON Schema (draft-07) of the arguments: `python_code` (required string) and
/// `global_variables` (optional object, default `{}`), nothing else — exactly the original's.
pub fn input_schema() -> JsonObject {
    object_schema(
        json!({
            "python_code": {"type": "string", "description": "Python code to run"},
            "global_variables": {
                "type": "object",
                "additionalProperties": {},
                "default": {},
                "description": "Map of global variables in context when the code is executed",
            },
        }),
        &["python_code"],
    )
}

/// The tool definition for `tools/list` (`stateful`: `--stateful`).
pub fn tool(stateful: bool) -> Tool {
    Tool::new(TOOL_NAME, description(stateful), input_schema()).with_title(TITLE)
}

/// The second tool with `--stateful`: clears the session's state (issue 14). A tool of its own
/// rather than an argument of `run_python_code`: it does one destructive thing, which MCP's tool
/// annotations can say (`destructiveHint`), so that a client may ask before it runs, and the
/// drop-in's input schema stays as it is.
pub const RESET_TOOL_NAME: &str = "reset_session";

/// What `reset_session` answers.
pub const RESET_DONE: &str = "The session's state was cleared: its interpreter was stopped, and the next call of run_python_code starts in a new one with fresh globals.";

/// The `reset_session` tool: no arguments; destructive, idempotent, closed world.
pub fn reset_tool() -> Tool {
    session_tool(
        RESET_TOOL_NAME,
        "Reset the Python session",
        "Clear this session's Python state: variables, functions, imports and installed packages are dropped, and the next run_python_code call starts in a new interpreter.",
        object_schema(json!({}), &[]),
    )
}

/// `--stateful`: puts a file into the session's working directory (a CSV to analyse), as the
/// original's development line's `upload_file` does.
pub const UPLOAD_TOOL_NAME: &str = "upload_file";

/// `--stateful`: removes a file from the session's working directory.
pub const DELETE_TOOL_NAME: &str = "delete_file";

/// The object schema (draft-07) of a tool's arguments: `properties`, `required` (left out when
/// empty) and nothing else allowed.
fn object_schema(properties: serde_json::Value, required: &[&str]) -> JsonObject {
    let mut schema = JsonObject::new();
    schema.insert("type".into(), json!("object"));
    schema.insert("properties".into(), properties);
    if !required.is_empty() {
        schema.insert("required".into(), json!(required));
    }
    schema.insert("additionalProperties".into(), json!(false));
    schema.insert(
        "$schema".into(),
        json!("http://json-schema.org/draft-07/schema#"),
    );
    schema
}

/// A tool of `--stateful` sessions: it changes the session's state and nothing outside it,
/// the same way each time (MCP tool annotations: destructive, idempotent, closed world).
fn session_tool(
    name: &'static str,
    title: &str,
    description: &'static str,
    schema: JsonObject,
) -> Tool {
    Tool::new(name, description, schema)
        .with_title(title)
        .with_annotations(
            ToolAnnotations::new()
                .read_only(false)
                .destructive(true)
                .idempotent(true)
                .open_world(false),
        )
}

/// The description of the `name` argument of both file tools.
const NAME_DESCRIPTION: &str = "Path of the file relative to the working directory (the code's current directory), e.g. `data.csv` or `in/data.csv`; no `..`, no absolute path";

/// The `upload_file` tool: `name`, and the content as `text` (UTF-8) or `base64` (any bytes).
pub fn upload_tool() -> Tool {
    let schema = object_schema(
        json!({
            "name": {"type": "string", "description": NAME_DESCRIPTION},
            "text": {"type": "string", "description": "The file's content as text (written as UTF-8); give this or `base64`"},
            "base64": {"type": "string", "description": "The file's content as base64 (any bytes); give this or `text`"},
        }),
        &["name"],
    );
    session_tool(
        UPLOAD_TOOL_NAME,
        "Upload a file to the Python session",
        "Write a file into this session's working directory (replacing one of the same name), so that run_python_code can open it by its name.",
        schema,
    )
}

/// The `delete_file` tool: `name`.
pub fn delete_tool() -> Tool {
    let schema = object_schema(
        json!({"name": {"type": "string", "description": NAME_DESCRIPTION}}),
        &["name"],
    );
    session_tool(
        DELETE_TOOL_NAME,
        "Delete a file of the Python session",
        "Remove a file from this session's working directory.",
        schema,
    )
}
