//! The tools: `run_python_code` (its name, description and input schema, docs/architecture.md
//! §4, seed 000) and, with `--stateful`, the sandbox and file tools (seed 002, SEP-2567).

use crate::packages::wheel::target;
use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use serde_json::json;
use std::sync::{Arc, OnceLock};

/// The tool's name, as in the Deno original.
pub const TOOL_NAME: &str = "run_python_code";

/// The tool's title, as in the Deno original.
pub const TITLE: &str = "Run Python code";

/// What the description adds with `--stateful`, so that a model knows it may rely on state and
/// how to keep it (seed 002: the answer names the id "to use in subsequent requests").
const STATEFUL_NOTE: &str = "

State persists between calls in the same sandbox, as in a notebook: variables, functions, imports and files of one call are there in the next. Every result names its sandbox (<sandbox_id>); pass that `sandbox_id` to later calls to continue in it, or make one first with create_sandbox. A call without `sandbox_id` runs in the connection's own sandbox where the client keeps a session, and otherwise in a new sandbox. A result with a <state> section says when that state was lost or is new (for example after a timeout stopped the interpreter), so that the setup can be run again.";
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
/// `global_variables` (optional object, default `{}`), nothing else — exactly the original's;
/// with `stateful` (`--stateful`), also the optional `sandbox_id`.
pub fn input_schema(stateful: bool) -> JsonObject {
    let mut properties = json!({
        "python_code": {"type": "string", "description": "Python code to run"},
        "global_variables": {
            "type": "object",
            "additionalProperties": {},
            "default": {},
            "description": "Map of global variables in context when the code is executed",
        },
    });
    if stateful {
        properties["sandbox_id"] = sandbox_id_property(
            "The sandbox to run in, as a result or create_sandbox named it; leave it out to use the connection's own sandbox or, without one, a new sandbox",
        );
    }
    object_schema(properties, &["python_code"])
}

/// The header a client mirrors the `sandbox_id` argument into (`Mcp-Param-Sandbox-Id`, SEP-2243),
/// so that a load balancer can route a sandbox's calls without reading bodies.
pub const SANDBOX_HEADER: &str = "Sandbox-Id";

/// The `sandbox_id` argument: a string, mirrored into [`SANDBOX_HEADER`].
fn sandbox_id_property(description: &str) -> serde_json::Value {
    json!({"type": "string", "description": description, "x-mcp-header": SANDBOX_HEADER})
}

/// The tool definition for `tools/list` (`stateful`: `--stateful`, which adds `sandbox_id` and
/// the structured result's output schema).
pub fn tool(stateful: bool) -> Tool {
    let tool =
        Tool::new(TOOL_NAME, description(stateful), input_schema(stateful)).with_title(TITLE);
    if stateful {
        tool.with_raw_output_schema(Arc::new(run_output_schema()))
    } else {
        tool
    }
}

/// The output schema (draft-07) of a `--stateful` call's structured result
/// ([`crate::server::tools::format::structured`]): the JSON mode's keys, plus `sandbox_id` and
/// `dependencies`.
pub fn run_output_schema() -> JsonObject {
    open(object_schema(
        json!({
            "status": {"type": "string", "enum": ["success", "install-error", "run-error"]},
            "sandbox_id": {"type": "string", "description": "The sandbox the code ran in: pass it to later calls to continue there"},
            "dependencies": {"type": "array", "items": {"type": "string"}, "description": "The requirements this call asked for"},
            "output": {"type": "array", "items": {"type": "string"}, "description": "stdout and stderr lines in the order written"},
            "return_value": {"description": "The last expression's value (JSON), on success"},
            "error": {"type": "string", "description": "The traceback and message, or the install failure"},
            "state": {"type": "string", "description": "Present when the sandbox's state was lost or is new, and why"},
        }),
        &["status", "sandbox_id", "output"],
    ))
}

/// `--stateful`: clears a sandbox's state (issue 14). A tool of its own rather than an argument
/// of `run_python_code`: it does one destructive thing, which MCP's tool annotations can say
/// (`destructiveHint`), so that a client may ask before it runs.
pub const RESET_TOOL_NAME: &str = "reset_session";

/// What `reset_session` answers.
pub const RESET_DONE: &str = "its state was cleared: its interpreter was stopped, and its next run_python_code call starts in a new one with fresh globals and no files.";

/// `--stateful`: makes a sandbox and names its handle (SEP-2567's pattern).
pub const CREATE_TOOL_NAME: &str = "create_sandbox";

/// `--stateful`: lists a sandbox's files (seed 002's `list_session_files`).
pub const LIST_FILES_TOOL_NAME: &str = "list_sandbox_files";

/// `--stateful`: ends a sandbox (seed 002's `clear_session`).
pub const DESTROY_TOOL_NAME: &str = "destroy_sandbox";

/// `--stateful`: puts a file into a sandbox's working directory (a CSV to analyse), as the
/// original's development line's `upload_file` does.
pub const UPLOAD_TOOL_NAME: &str = "upload_file";

/// `--stateful`: removes a file from a sandbox's working directory.
pub const DELETE_TOOL_NAME: &str = "delete_file";

/// Every tool's name, in the order `tools/list` gives them (`stateful`: `--stateful`).
pub fn tool_names(stateful: bool) -> &'static [&'static str] {
    if stateful {
        &[
            TOOL_NAME,
            CREATE_TOOL_NAME,
            LIST_FILES_TOOL_NAME,
            DESTROY_TOOL_NAME,
            UPLOAD_TOOL_NAME,
            DELETE_TOOL_NAME,
            RESET_TOOL_NAME,
        ]
    } else {
        &[TOOL_NAME]
    }
}

/// Every tool, in the order of [`tool_names`], built once per server kind: `tools/list` reads
/// them, and so does every 2026-07-28 `tools/call`, whose `Mcp-Param-*` headers rmcp checks
/// against the tool's schema ([`find`]).
pub fn tools(stateful: bool) -> &'static [Tool] {
    static DROP_IN: OnceLock<Vec<Tool>> = OnceLock::new();
    static STATEFUL: OnceLock<Vec<Tool>> = OnceLock::new();
    if stateful {
        STATEFUL.get_or_init(|| {
            vec![
                tool(true),
                create_tool(),
                list_files_tool(),
                destroy_tool(),
                upload_tool(),
                delete_tool(),
                reset_tool(),
            ]
        })
    } else {
        DROP_IN.get_or_init(|| vec![tool(false)])
    }
}

/// Every tool, as [`tools`] gives them, with code mode's section (`upstream::Catalog::summary`:
/// the MCP tools the code can call) after `run_python_code`'s description.
pub fn tools_with_code_mode(stateful: bool, code_mode: &str) -> Vec<Tool> {
    let mut all = tools(stateful).to_vec();
    if let Some(run) = all.iter_mut().find(|t| t.name == TOOL_NAME) {
        run.description = Some(format!("{}{code_mode}", description(stateful)).into());
    }
    all
}

/// `name` as one of this server's tool names (`stateful`: `--stateful`), a fixed string fit
/// for a metric label; `None` for a name the server does not have.
pub fn known_name(name: &str, stateful: bool) -> Option<&'static str> {
    tool_names(stateful).iter().copied().find(|n| *n == name)
}

/// The description of an optional `sandbox_id` argument of the file tools.
const OPTIONAL_SANDBOX: &str = "The sandbox, as a result or create_sandbox named it; may be left out by a client with a session, for the connection's own sandbox";

/// The `reset_session` tool: an optional `sandbox_id`; destructive, idempotent, closed world.
pub fn reset_tool() -> Tool {
    sandbox_tool(
        RESET_TOOL_NAME,
        "Reset a Python sandbox",
        "Clear a sandbox's Python state: variables, functions, imports, installed packages and files are dropped, and its next run_python_code call starts in a new interpreter. The sandbox and its id remain.",
        object_schema(json!({"sandbox_id": sandbox_id_property(OPTIONAL_SANDBOX)}), &[]),
        Effect::Destructive,
    )
}

/// The `create_sandbox` tool: optional `dependencies`; answers with the handle in text and in
/// `structuredContent` (`{"sandbox_id": …}`).
pub fn create_tool() -> Tool {
    let schema = object_schema(
        json!({
            "dependencies": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Packages to install before the sandbox is handed out (PEP 508 requirements, e.g. `pandas` or `rich<13`)",
            },
        }),
        &[],
    );
    let output = object_schema(
        json!({"sandbox_id": {"type": "string", "description": "Pass it as `sandbox_id` to the other tools"}}),
        &["sandbox_id"],
    );
    sandbox_tool(
        CREATE_TOOL_NAME,
        "Create a Python sandbox",
        "Create a new, empty Python sandbox (its own interpreter and files) and return its id. Pass the id as `sandbox_id` to run_python_code and the file tools to work in it; its variables and files persist between those calls. A sandbox ends when destroyed or after a while without calls; using it then says so.",
        schema,
        Effect::Additive,
    )
    .with_raw_output_schema(Arc::new(open(output)))
}

/// The `list_sandbox_files` tool: an optional `sandbox_id`; read-only.
pub fn list_files_tool() -> Tool {
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
        LIST_FILES_TOOL_NAME,
        "List a Python sandbox's files",
        "List the files in a sandbox's working directory, with their sizes and their resource URIs (sandbox://{sandbox_id}/{path}, readable with resources/read).",
        object_schema(json!({"sandbox_id": sandbox_id_property(OPTIONAL_SANDBOX)}), &[]),
        Effect::ReadOnly,
    )
    .with_raw_output_schema(Arc::new(open(output)))
}

/// The `destroy_sandbox` tool: `sandbox_id`; destructive.
pub fn destroy_tool() -> Tool {
    sandbox_tool(
        DESTROY_TOOL_NAME,
        "Destroy a Python sandbox",
        "End a sandbox: its interpreter, variables and files are gone, and its id no longer works.",
        object_schema(
            json!({"sandbox_id": sandbox_id_property("The sandbox to destroy")}),
            &["sandbox_id"],
        ),
        Effect::Destructive,
    )
}

/// An output schema that lets later keys come: clients must not break on them.
fn open(mut schema: JsonObject) -> JsonObject {
    schema.insert("additionalProperties".into(), json!(true));
    schema
}

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

/// What a sandbox tool does to the sandbox (MCP tool annotations; all are closed world).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Effect {
    /// Changes nothing (`list_sandbox_files`).
    ReadOnly,
    /// Makes something new and destroys nothing (`create_sandbox`).
    Additive,
    /// Replaces or removes what was there, the same way each time.
    Destructive,
}

/// A tool of `--stateful` servers, annotated with its `effect`.
fn sandbox_tool(
    name: &'static str,
    title: &str,
    description: &'static str,
    schema: JsonObject,
    effect: Effect,
) -> Tool {
    let annotations = ToolAnnotations::new()
        .read_only(effect == Effect::ReadOnly)
        .destructive(effect == Effect::Destructive)
        .idempotent(effect != Effect::Additive)
        .open_world(false);
    Tool::new(name, description, schema)
        .with_title(title)
        .with_annotations(annotations)
}

/// The description of the `name` argument of both file tools.
const NAME_DESCRIPTION: &str = "Path of the file relative to the working directory (the code's current directory), e.g. `data.csv` or `in/data.csv`; no `..`, no absolute path";

/// The `upload_file` tool: `name`, the content as `text` (UTF-8) or `base64` (any bytes), and
/// an optional `sandbox_id`.
pub fn upload_tool() -> Tool {
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
        UPLOAD_TOOL_NAME,
        "Upload a file to a Python sandbox",
        "Write a file into a sandbox's working directory (replacing one of the same name), so that run_python_code can open it by its name.",
        schema,
        Effect::Destructive,
    )
}

/// The `delete_file` tool: `name` and an optional `sandbox_id`.
pub fn delete_tool() -> Tool {
    let schema = object_schema(
        json!({
            "name": {"type": "string", "description": NAME_DESCRIPTION},
            "sandbox_id": sandbox_id_property(OPTIONAL_SANDBOX),
        }),
        &["name"],
    );
    sandbox_tool(
        DELETE_TOOL_NAME,
        "Delete a file of a Python sandbox",
        "Remove a file from a sandbox's working directory.",
        schema,
        Effect::Destructive,
    )
}
