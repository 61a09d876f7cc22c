//! The tools' arguments as typed values: one serde struct per tool, `deny_unknown_fields`, so
//! that an argument of the wrong name or type is an MCP `invalid_params` error naming it, and
//! the handler never walks JSON by hand (the input schemas are in [`crate::server::tools::tool`]).

use rmcp::model::{CallToolRequestParams, JsonObject};
use rmcp::ErrorData as McpError;
use serde::de::DeserializeOwned;
use serde::Deserialize;

/// `run_python_code` of the drop-in (without `--stateful`): exactly the original's arguments.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DropInRun {
    python_code: String,
    #[serde(default)]
    global_variables: Option<JsonObject>,
}

/// `run_python_code` with `--stateful`: the original's arguments and `sandbox_id`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StatefulRun {
    python_code: String,
    #[serde(default)]
    global_variables: Option<JsonObject>,
    #[serde(default)]
    sandbox_id: Option<String>,
}

/// A `run_python_code` call's arguments, checked.
pub struct RunArguments {
    pub code: String,
    /// Names bound in the code's globals (every key a Python identifier).
    pub globals: JsonObject,
    /// The sandbox named, with `--stateful`.
    pub sandbox_id: Option<String>,
}

/// `upload_file` and `delete_file`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileArguments {
    pub name: String,
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub base64: Option<String>,
    #[serde(default)]
    pub sandbox_id: Option<String>,
}

/// `reset_session` and `list_sandbox_files`: the sandbox, when not the session's own.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxArguments {
    #[serde(default)]
    pub sandbox_id: Option<String>,
}

/// `destroy_sandbox`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DestroyArguments {
    pub sandbox_id: String,
}

/// `create_sandbox`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateArguments {
    /// PEP 508 requirements to install before the sandbox is handed out.
    #[serde(default)]
    pub dependencies: Vec<String>,
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

/// Most requirements `create_sandbox` takes.
pub const MAX_DEPENDENCIES: usize = 64;

/// The arguments of a call of `tool` as `T`.
///
/// Errors: an `invalid_params` error naming the tool and what is wrong (serde's words: the
/// unknown or missing field, the type expected).
#[allow(clippy::result_large_err)]
pub fn parse<T: DeserializeOwned>(tool: &str, args: Option<JsonObject>) -> Result<T, McpError> {
    serde_json::from_value(serde_json::Value::Object(args.unwrap_or_default()))
        .map_err(|e| McpError::invalid_params(format!("invalid arguments for `{tool}`: {e}"), None))
}

/// The arguments of a `run_python_code` call (`stateful`: `--stateful`, which adds
/// `sandbox_id`), with `python_code` at most `max_code_bytes` long.
///
/// Errors: an `invalid_params` error that says which argument is wrong and how.
#[allow(clippy::result_large_err)]
pub fn run(
    tool: &str,
    args: Option<JsonObject>,
    stateful: bool,
    max_code_bytes: usize,
) -> Result<RunArguments, McpError> {
    let (code, globals, sandbox_id) = if stateful {
        let a: StatefulRun = parse(tool, args)?;
        (a.python_code, a.global_variables, a.sandbox_id)
    } else {
        let a: DropInRun = parse(tool, args)?;
        (a.python_code, a.global_variables, None)
    };
    if code.len() > max_code_bytes {
        return Err(McpError::invalid_params(
            format!(
                "`python_code` is {} bytes, more than the limit of {max_code_bytes} bytes",
                code.len()
            ),
            None,
        ));
    }
    let globals = globals.unwrap_or_default();
    if let Some(bad) = globals.keys().find(|k| !is_identifier(k)) {
        return Err(McpError::invalid_params(
            format!("`global_variables` key `{bad}` is not a valid Python identifier"),
            None,
        ));
    }
    Ok(RunArguments {
        code,
        globals,
        sandbox_id,
    })
}

/// Whether `s` is a Python identifier (letters, digits and `_`, not starting with a digit).
fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c == '_' || c.is_alphabetic())
        && chars.all(|c| c == '_' || c.is_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(v: serde_json::Value) -> Option<JsonObject> {
        v.as_object().cloned()
    }

    #[test]
    fn wrong_arguments_are_named() {
        let words = |v, stateful| {
            run("run_python_code", object(v), stateful, 100)
                .err()
                .map(|e| e.message.to_string())
                .unwrap_or_default()
        };
        assert!(words(json!({"python_code": 5}), false).contains("expected a string"));
        assert!(words(json!({}), false).contains("missing field `python_code`"));
        assert!(
            words(json!({"python_code": "1", "other": 1}), false).contains("unknown field `other`")
        );
        assert!(words(json!({"python_code": "1", "sandbox_id": "x"}), false)
            .contains("unknown field `sandbox_id`"));
        assert!(
            words(json!({"python_code": "1", "global_variables": [1]}), false)
                .contains("expected a map")
        );
        assert!(words(
            json!({"python_code": "1", "global_variables": {"1x": 1}}),
            false
        )
        .contains("not a valid Python identifier"));
        assert!(
            words(json!({"python_code": "x".repeat(101)}), false).contains("more than the limit")
        );
        let ok = run(
            "run_python_code",
            object(json!({"python_code": "1", "sandbox_id": "sbx_x", "global_variables": null})),
            true,
            100,
        )
        .expect("valid");
        assert_eq!(ok.sandbox_id.as_deref(), Some("sbx_x"));
        assert!(ok.globals.is_empty());
    }
}
