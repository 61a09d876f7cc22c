//! The tools code can call (code mode, docs/architecture.md §11): every allowed tool of every connected upstream server,
//! with the Python face each gets inside the sandbox. One home for that face: the names, the
//! signature built from the tool's `inputSchema`, and the docstring are made here, once per
//! change of the upstream lists, and shown three ways: the `run_python_code` description
//! ([`Catalog::summary`]), the `.pyi` stub resource ([`Catalog::stub`]), and the `mcp_tools`
//! module the sandbox builds from the [`Catalog`] itself, serialized (runtime/python/mcp_tools.py), so that
//! `help()` tells what the description and the stub tell.

use rmcp::model::{JsonObject, Tool};
use serde::Serialize;
use serde_json::Value;
use std::collections::HashSet;
use std::fmt::Write;

/// Longest code-mode section of the `run_python_code` description (bytes): past it the
/// description names the servers and functions only, and points at the stub resource.
const SUMMARY_BUDGET: usize = 6 << 10;

/// Longest description line of one function in the summary (characters).
const SUMMARY_LINE_CHARS: usize = 120;

/// Most function names the short summary lists per server.
const SHORT_NAMES: usize = 40;

/// The URI of the `.pyi` stub of `mcp_tools` (a resource of this server whenever code mode is
/// on).
pub const STUB_URI: &str = "mcp-run-python://code-mode/mcp_tools.pyi";

/// Python's keywords and soft keywords that a parameter or function may not be named.
const PYTHON_KEYWORDS: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield",
];

/// Names `mcp_tools` itself uses, which a server may not take.
const MODULE_NAMES: &[&str] = &["call", "call_sync", "ToolError", "servers"];

/// One parameter of a tool's Python function.
#[derive(Debug, Clone, Serialize)]
pub struct Param {
    /// The Python name (an identifier, not a keyword).
    pub ident: String,
    /// The argument's name in the tool's `inputSchema`.
    pub name: String,
    /// The annotation, as Python source (`str`, `list[int] | None`, `Literal['a', 'b']`).
    pub annotation: String,
    /// The default as a Python literal (`None` for an optional one without a schema default);
    /// absent for a required parameter.
    pub default: Option<String>,
}

/// One tool as code sees it.
#[derive(Debug, Clone, Serialize)]
pub struct Function {
    /// The tool's name upstream.
    pub name: String,
    /// Its Python name on the server's namespace.
    pub ident: String,
    pub params: Vec<Param>,
    /// The return annotation (`dict[str, Any]` when the tool declares an output schema).
    pub returns: String,
    /// The tool's description, then one line per documented parameter.
    pub doc: String,
    /// The first sentence of the description, for the summary.
    #[serde(skip)]
    headline: String,
}

/// One upstream server's allowed tools.
#[derive(Debug, Clone, Serialize)]
pub struct Server {
    /// The server's name in `--tools-config`.
    pub name: String,
    /// Its Python name (`mcp_tools.<ident>`).
    pub ident: String,
    pub functions: Vec<Function>,
}

/// Every tool code can call now, with its Python face.
#[derive(Debug, Default, Serialize)]
pub struct Catalog {
    /// Changes whenever the catalog does (a server listed new tools, connected or was lost):
    /// an interpreter rebuilds `mcp_tools` when it differs from the one it has.
    pub version: u64,
    pub servers: Vec<Server>,
    /// The launcher's host functions (`code_sandbox(functions=…)`): globals of every run.
    pub functions: Vec<super::functions::FunctionSpec>,
}

impl Catalog {
    /// The catalog of `servers` (name and allowed tools, in configuration order) and the
    /// launcher's host `functions`.
    pub fn new(
        version: u64,
        servers: &[(String, Vec<Tool>)],
        functions: Vec<super::functions::FunctionSpec>,
    ) -> Catalog {
        let mut taken: HashSet<String> = MODULE_NAMES.iter().map(|s| s.to_string()).collect();
        let servers = servers
            .iter()
            .map(|(name, tools)| {
                let ident = unique(identifier(name), &mut taken);
                let mut names = HashSet::new();
                let functions = tools
                    .iter()
                    .map(|tool| function(tool, &mut names))
                    .collect();
                Server {
                    name: name.clone(),
                    ident,
                    functions,
                }
            })
            .collect();
        Catalog {
            version,
            servers,
            functions,
        }
    }

    /// The code-mode section of the `run_python_code` description: every function with its
    /// signature and first sentence; when that is longer than [`SUMMARY_BUDGET`], the servers
    /// and function names only, pointing at [`STUB_URI`].
    pub fn summary(&self) -> String {
        let mut text = String::from(
            "\n\nThe code can call MCP tools of other servers: `import mcp_tools`, then `await mcp_tools.<server>.<tool>(...)` (`mcp_tools.<server>.<tool>.sync(...)` in synchronous code, or `await mcp_tools.call(server, tool, arguments)`). A tool returns its structured content as Python objects, else its text (decoded when it is JSON), and images as bytes; a failure raises `mcp_tools.ToolError`. Looping over tools in one call keeps intermediate results out of the conversation. Available:",
        );
        let intro = text.len();
        for server in &self.servers {
            for f in &server.functions {
                let _ = write!(
                    text,
                    "\n- `mcp_tools.{}.{}({})`",
                    server.ident,
                    f.ident,
                    signature(&f.params)
                );
                if !f.headline.is_empty() {
                    let _ = write!(text, ": {}", f.headline);
                }
            }
        }
        if text.len() - intro <= SUMMARY_BUDGET {
            return text;
        }
        text.truncate(intro);
        for server in &self.servers {
            let names: Vec<&str> = server
                .functions
                .iter()
                .take(SHORT_NAMES)
                .map(|f| f.ident.as_str())
                .collect();
            let more = server.functions.len().saturating_sub(SHORT_NAMES);
            let _ = write!(
                text,
                "\n- `mcp_tools.{}`: {}",
                server.ident,
                names.join(", ")
            );
            if more > 0 {
                let _ = write!(text, " and {more} more");
            }
        }
        let _ = write!(
            text,
            "\nSignatures and descriptions: the resource {STUB_URI}, or `help(mcp_tools.<server>)` in the code."
        );
        text
    }

    /// `mcp_tools.pyi`: the module as a type stub, every function with its signature and
    /// docstring.
    pub fn stub(&self) -> String {
        let mut text = String::from(
            "\"\"\"MCP tools of other servers, callable from the sandbox's code (mcp-run-python code mode).\"\"\"\n\nfrom typing import Any, Literal\n\n\nclass ToolError(Exception):\n    \"\"\"An upstream tool failed, or a limit of the call was reached; the message says which.\"\"\"\n\n\nasync def call(server: str, tool: str, arguments: dict[str, Any] | None = None) -> Any:\n    \"\"\"Calls `tool` of `server` (their names as configured and listed upstream).\"\"\"\n\n\ndef call_sync(server: str, tool: str, arguments: dict[str, Any] | None = None) -> Any:\n    \"\"\"`call`, blocking: for synchronous code.\"\"\"\n",
        );
        for server in &self.servers {
            let _ = write!(
                text,
                "\n\nclass {}:\n    \"\"\"The tools of MCP server {:?}.\"\"\"\n",
                server.ident, server.name
            );
            for f in &server.functions {
                let _ = write!(
                    text,
                    "\n    @staticmethod\n    async def {}({}) -> {}:\n        {}\n",
                    f.ident,
                    signature(&f.params),
                    f.returns,
                    docstring(&f.doc, "        ")
                );
            }
        }
        text
    }
}

/// `a: float, b: float = 1` for a parameter list.
fn signature(params: &[Param]) -> String {
    params
        .iter()
        .map(|p| match &p.default {
            Some(default) => format!("{}: {} = {default}", p.ident, p.annotation),
            None => format!("{}: {}", p.ident, p.annotation),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `doc` as a triple-quoted docstring indented by `indent` after its first line.
fn docstring(doc: &str, indent: &str) -> String {
    let body = doc.replace('\\', "\\\\").replace("\"\"\"", "\\\"\\\"\\\"");
    let body = body
        .lines()
        .enumerate()
        .map(|(i, line)| match (i, line.is_empty()) {
            (0, _) | (_, true) => line.to_owned(),
            _ => format!("{indent}{line}"),
        })
        .collect::<Vec<_>>()
        .join("\n");
    format!("\"\"\"{body}\"\"\"")
}

/// The Python face of `tool`; its name is made unique among `taken`.
fn function(tool: &Tool, taken: &mut HashSet<String>) -> Function {
    let ident = unique(identifier(&tool.name), taken);
    let schema: &JsonObject = &tool.input_schema;
    let properties = schema.get("properties").and_then(Value::as_object);
    let required: HashSet<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut params = Vec::new();
    let mut param_names = HashSet::new();
    let mut documented = Vec::new();
    // Required parameters first: Python allows no required parameter after a default.
    for want_required in [true, false] {
        for (name, property) in properties.into_iter().flatten() {
            let is_required = required.contains(name.as_str());
            if is_required != want_required {
                continue;
            }
            let ident = unique(identifier(name), &mut param_names);
            let default = (!is_required).then(|| {
                property
                    .get("default")
                    .and_then(python_literal)
                    .unwrap_or_else(|| "None".to_owned())
            });
            let mut annotation = annotation(property);
            let admits_none = annotation == "Any" || annotation.split(" | ").any(|t| t == "None");
            if default.as_deref() == Some("None") && !admits_none {
                annotation.push_str(" | None");
            }
            if let Some(text) = property.get("description").and_then(Value::as_str) {
                documented.push(format!("{ident}: {}", one_line(text)));
            }
            params.push(Param {
                ident,
                name: name.clone(),
                annotation,
                default,
            });
        }
    }
    let description = tool.description.as_deref().unwrap_or_default().trim();
    let mut doc = description.to_owned();
    if !documented.is_empty() {
        if !doc.is_empty() {
            doc.push_str("\n\n");
        }
        doc.push_str("Args:\n");
        doc.push_str(
            &documented
                .iter()
                .map(|line| format!("    {line}"))
                .collect::<Vec<_>>()
                .join("\n"),
        );
    }
    Function {
        name: tool.name.to_string(),
        ident,
        params,
        returns: match &tool.output_schema {
            Some(schema) if wraps_result(tool) => schema
                .get("properties")
                .and_then(|p| p.get("result"))
                .map_or_else(|| "Any".into(), annotation),
            Some(_) => "dict[str, Any]".into(),
            None => "Any".into(),
        },
        doc,
        headline: headline(description),
    }
}

/// Whether `tool` wraps a plain return value in `{"result": …}` (FastMCP marks its output
/// schema `x-fastmcp-wrap-result`): the sandbox then gets the value itself.
pub fn wraps_result(tool: &Tool) -> bool {
    tool.output_schema
        .as_ref()
        .and_then(|s| s.get("x-fastmcp-wrap-result"))
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

/// The description's first sentence on one line, at most [`SUMMARY_LINE_CHARS`] characters.
fn headline(description: &str) -> String {
    let line = one_line(description);
    let sentence = match line.find(". ") {
        Some(end) => &line[..=end],
        None => &line,
    };
    if sentence.chars().count() <= SUMMARY_LINE_CHARS {
        return sentence.trim_end().to_owned();
    }
    let cut: String = sentence.chars().take(SUMMARY_LINE_CHARS - 1).collect();
    format!("{}…", cut.trim_end())
}

/// `text` with every run of whitespace as one space.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The Python annotation of a JSON Schema.
fn annotation(schema: &Value) -> String {
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        let literals: Option<Vec<String>> = values.iter().map(python_literal).collect();
        if let Some(literals) = literals.filter(|l| !l.is_empty()) {
            return format!("Literal[{}]", literals.join(", "));
        }
    }
    if let Some(value) = schema.get("const").and_then(python_literal) {
        return format!("Literal[{value}]");
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(options) = schema.get(key).and_then(Value::as_array) {
            return union(options.iter().map(annotation));
        }
    }
    match schema.get("type") {
        Some(Value::String(kind)) => type_name(kind, schema),
        Some(Value::Array(kinds)) => union(
            kinds
                .iter()
                .filter_map(Value::as_str)
                .map(|k| type_name(k, schema)),
        ),
        _ => "Any".into(),
    }
}

/// The Python type of JSON Schema type `kind` (`items` of an array from `schema`).
fn type_name(kind: &str, schema: &Value) -> String {
    match kind {
        "string" => "str".into(),
        "integer" => "int".into(),
        "number" => "float".into(),
        "boolean" => "bool".into(),
        "null" => "None".into(),
        "object" => "dict[str, Any]".into(),
        "array" => match schema.get("items") {
            Some(items) if items.is_object() => format!("list[{}]", annotation(items)),
            _ => "list[Any]".into(),
        },
        _ => "Any".into(),
    }
}

/// `A | B`, each once; `Any` when any part is.
fn union(parts: impl Iterator<Item = String>) -> String {
    let mut seen: Vec<String> = Vec::new();
    for part in parts {
        if part == "Any" {
            return part;
        }
        if !seen.contains(&part) {
            seen.push(part);
        }
    }
    if seen.is_empty() {
        return "Any".into();
    }
    seen.join(" | ")
}

/// A JSON scalar, list or object as a Python literal (`None` for nothing Python can write).
fn python_literal(value: &Value) -> Option<String> {
    Some(match value {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Number(n) => n.to_string(),
        // JSON's string escapes are Python's, but for `\/`, which serde never writes.
        Value::String(_) => serde_json::to_string(value).ok()?,
        Value::Array(items) => format!(
            "[{}]",
            items
                .iter()
                .map(python_literal)
                .collect::<Option<Vec<_>>>()?
                .join(", ")
        ),
        Value::Object(map) => format!(
            "{{{}}}",
            map.iter()
                .map(|(k, v)| Some(format!(
                    "{}: {}",
                    serde_json::to_string(k).ok()?,
                    python_literal(v)?
                )))
                .collect::<Option<Vec<_>>>()?
                .join(", ")
        ),
    })
}

/// `name` as a Python identifier: other characters become `_`, a leading digit or a keyword
/// gets `_` added, and an empty name becomes `_`.
pub fn identifier(name: &str) -> String {
    let mut ident: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if ident.is_empty() || ident.starts_with(|c: char| c.is_ascii_digit()) {
        ident.insert(0, '_');
    }
    if PYTHON_KEYWORDS.contains(&ident.as_str()) {
        ident.push('_');
    }
    ident
}

/// `ident`, or `ident_2`, `ident_3`… when taken; the result is taken from then on.
fn unique(ident: String, taken: &mut HashSet<String>) -> String {
    let mut candidate = ident.clone();
    let mut n = 2;
    while taken.contains(&candidate) {
        candidate = format!("{ident}_{n}");
        n += 1;
    }
    taken.insert(candidate.clone());
    candidate
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool(name: &str, description: &str, schema: Value) -> Tool {
        let schema = match schema {
            Value::Object(map) => map,
            _ => unreachable!(),
        };
        Tool::new(
            name.to_owned(),
            description.to_owned(),
            std::sync::Arc::new(schema),
        )
    }

    #[test]
    fn names_become_identifiers_without_collisions() {
        assert_eq!(identifier("get-sum"), "get_sum");
        assert_eq!(identifier("2fa"), "_2fa");
        assert_eq!(identifier("class"), "class_");
        assert_eq!(identifier(""), "_");
        let catalog = Catalog::new(
            1,
            &[
                ("call".into(), vec![]),
                (
                    "my server".into(),
                    vec![tool("a-b", "", json!({})), tool("a_b", "", json!({}))],
                ),
            ],
            Vec::new(),
        );
        assert_eq!(catalog.servers[0].ident, "call_2");
        assert_eq!(catalog.servers[1].ident, "my_server");
        let idents: Vec<_> = catalog.servers[1]
            .functions
            .iter()
            .map(|f| f.ident.as_str())
            .collect();
        assert_eq!(idents, ["a_b", "a_b_2"]);
    }

    #[test]
    fn signatures_follow_the_input_schema() {
        let t = tool(
            "search",
            "Searches the web. Slowly.",
            json!({"type": "object", "properties": {
                "limit": {"type": "integer", "default": 10, "description": "Most results"},
                "query": {"type": "string", "description": "What to find"},
                "kind": {"type": "string", "enum": ["news", "web"]},
                "from": {"type": ["string", "null"]},
                "tags": {"type": "array", "items": {"type": "string"}}
            }, "required": ["query"]}),
        );
        let catalog = Catalog::new(1, &[("s".into(), vec![t])], Vec::new());
        let f = &catalog.servers[0].functions[0];
        assert_eq!(
            signature(&f.params),
            "query: str, limit: int = 10, kind: Literal[\"news\", \"web\"] | None = None, from_: str | None = None, tags: list[str] | None = None"
        );
        assert_eq!(f.params[3].name, "from");
        assert!(f
            .doc
            .starts_with("Searches the web. Slowly.\n\nArgs:\n    query: What to find"));
        let summary = catalog.summary();
        assert!(
            summary.contains("- `mcp_tools.s.search(query: str, limit: int = 10"),
            "{summary}"
        );
        assert!(summary.ends_with(": Searches the web."), "{summary}");
        let stub = catalog.stub();
        assert!(stub.contains("class s:\n"), "{stub}");
        assert!(
            stub.contains("    async def search(query: str, limit: int = 10, "),
            "{stub}"
        );
    }

    #[test]
    fn a_wrapped_plain_result_is_typed_as_its_value() {
        let wrapped = tool("count", "", json!({})).with_raw_output_schema(std::sync::Arc::new(
            json!({"type": "object", "properties": {"result": {"type": "integer"}}, "x-fastmcp-wrap-result": true})
                .as_object()
                .cloned()
                .unwrap_or_default(),
        ));
        let plain = tool("info", "", json!({})).with_raw_output_schema(std::sync::Arc::new(
            json!({"type": "object"})
                .as_object()
                .cloned()
                .unwrap_or_default(),
        ));
        assert!(wraps_result(&wrapped) && !wraps_result(&plain));
        let catalog = Catalog::new(1, &[("s".into(), vec![wrapped, plain])], Vec::new());
        let returns: Vec<_> = catalog.servers[0]
            .functions
            .iter()
            .map(|f| f.returns.as_str())
            .collect();
        assert_eq!(returns, ["int", "dict[str, Any]"]);
    }

    #[test]
    fn a_long_catalog_points_at_the_stub() {
        let tools: Vec<Tool> = (0..200)
            .map(|i| tool(&format!("tool{i}"), &"word ".repeat(30), json!({})))
            .collect();
        let summary = Catalog::new(1, &[("big".into(), tools)], Vec::new()).summary();
        assert!(summary.contains(STUB_URI), "{summary}");
        assert!(summary.contains("and 160 more"), "{summary}");
        assert!(summary.len() < SUMMARY_BUDGET, "{}", summary.len());
    }
}
