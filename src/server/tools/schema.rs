//! What the tools' definitions share: the JSON Schema (draft-07) object shape of their
//! arguments, the `sandbox_id` argument mirrored into a header (SEP-2243), and the MCP tool
//! annotations of the `--stateful` tools. Each tool's own schema is written beside its handler.

use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use serde_json::json;

/// The header a client mirrors the `sandbox_id` argument into (`Mcp-Param-Sandbox-Id`, SEP-2243),
/// so that a load balancer can route a sandbox's calls without reading bodies.
pub const SANDBOX_HEADER: &str = "Sandbox-Id";

/// The description of an optional `sandbox_id` argument of the tools that work in a sandbox.
pub const OPTIONAL_SANDBOX: &str = "The sandbox, as a result or create_sandbox named it; may be left out by a client with a session, for the connection's own sandbox";

/// The `sandbox_id` argument: a string, mirrored into [`SANDBOX_HEADER`].
pub fn sandbox_id_property(description: &str) -> serde_json::Value {
    json!({"type": "string", "description": description, "x-mcp-header": SANDBOX_HEADER})
}

/// The object schema (draft-07) of a tool's arguments: `properties`, `required` (left out when
/// empty) and nothing else allowed.
pub fn object_schema(properties: serde_json::Value, required: &[&str]) -> JsonObject {
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

/// An output schema that lets later keys come: clients must not break on them.
pub fn open_ended(mut schema: JsonObject) -> JsonObject {
    schema.insert("additionalProperties".into(), json!(true));
    schema
}

/// What a sandbox tool does to the sandbox (MCP tool annotations; all are closed world).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Changes nothing (`list_sandbox_files`).
    ReadOnly,
    /// Makes something new and destroys nothing (`create_sandbox`).
    Additive,
    /// Replaces or removes what was there, the same way each time.
    Destructive,
}

/// A tool of `--stateful` servers, annotated with its `effect`.
pub fn sandbox_tool(
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
