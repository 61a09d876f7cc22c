//! Rendering a call's result as the tool's text content (docs/architecture.md §4): XML sections
//! in a fixed order, or one JSON object with `--return-mode json`; and, with `--stateful`, as
//! the structured result (`structuredContent`) that the tool's output schema declares.

use crate::sandbox::handle::SandboxId;
use crate::server::call::result::{CallResult, Outcome, ReturnValue};
use serde_json::json;

/// The result format chosen with `--return-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReturnMode {
    Xml,
    Json,
}

/// Escapes opening and closing tags of `tag` inside section text (`</output>` →
/// `&lt;/output&gt;`), so a section cannot be ended early by its own content.
fn escape_tag(text: &str, tag: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        if text.as_bytes()[i] == b'<' {
            let mut j = i + 1;
            if lower.as_bytes().get(j) == Some(&b'/') {
                j += 1;
            }
            while lower
                .as_bytes()
                .get(j)
                .is_some_and(|b| b.is_ascii_whitespace())
            {
                j += 1;
            }
            if lower[j..].starts_with(tag) {
                let end = lower[j + tag.len()..]
                    .find('>')
                    .map(|k| j + tag.len() + k + 1);
                let stop = end.unwrap_or(j + tag.len());
                out.push_str(&text[i..stop].replace('<', "&lt;").replace('>', "&gt;"));
                i = stop;
                continue;
            }
        }
        let ch = text[i..].chars().next().unwrap_or('\u{fffd}');
        out.push(ch);
        i += ch.len_utf8().max(1);
    }
    out
}

/// Renders `result` in `mode`; with `--stateful`, naming the `sandbox` it ran in (a
/// `<sandbox_id>` line after the status, or a `"sandbox_id"` key after `"status"`).
pub fn render(result: &CallResult, mode: ReturnMode, sandbox: Option<&SandboxId>) -> String {
    match mode {
        ReturnMode::Xml => render_xml(result, sandbox),
        ReturnMode::Json => render_json(result, sandbox),
    }
}

fn render_xml(r: &CallResult, sandbox: Option<&SandboxId>) -> String {
    let mut lines = vec![format!("<status>{}</status>", r.status().as_str())];
    if let Some(id) = sandbox {
        // A handle is `sbx_` and URL-safe base64: nothing in it to escape.
        lines.push(format!("<sandbox_id>{id}</sandbox_id>"));
    }
    if let Some(state) = &r.state {
        lines.push(format!("<state>{}</state>", escape_tag(state, "state")));
    }
    if let Some(note) = &r.note {
        lines.push(format!("<note>{}</note>", escape_tag(note, "note")));
    }
    if !r.dependencies.is_empty() {
        let deps = serde_json::to_string(&r.dependencies).unwrap_or_default();
        lines.push(format!(
            "<dependencies>{}</dependencies>",
            escape_tag(&deps, "dependencies")
        ));
    }
    if !r.output.is_empty() {
        lines.push("<output>".into());
        lines.extend(r.output.iter().map(|l| escape_tag(l, "output")));
        lines.push("</output>".into());
    }
    match &r.outcome {
        Outcome::Success(None) => {}
        Outcome::Success(Some(value)) => {
            lines.push("<return_value>".into());
            lines.push(escape_tag(value.text(), "return_value"));
            lines.push("</return_value>".into());
        }
        Outcome::InstallError(error) | Outcome::RunError { error, .. } => {
            lines.push("<error>".into());
            lines.push(escape_tag(error, "error"));
            lines.push("</error>".into());
        }
    }
    lines.join("\n")
}

/// The Deno original's JSON, keys in its order: `status`, `output`, then `return_value` (on
/// success, `null` when there is none) or `error`; with `--stateful`, `sandbox_id` after
/// `status`, `state` at the end when the sandbox's state was lost or is new, and `note` after it
/// when the call ran in a stand-in interpreter ([`CallResult::note`]). The structured
/// result has the same keys, plus `dependencies` when the call had any.
#[derive(serde::Serialize)]
#[serde(untagged)]
enum JsonResult<'a> {
    Success {
        status: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        sandbox_id: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        dependencies: Option<&'a [String]>,
        output: &'a [String],
        return_value: serde_json::Value,
        #[serde(skip_serializing_if = "Option::is_none")]
        state: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        note: Option<&'a str>,
    },
    Failure {
        status: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        sandbox_id: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        dependencies: Option<&'a [String]>,
        output: &'a [String],
        error: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        state: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        note: Option<&'a str>,
    },
}

/// `r` as [`JsonResult`], with `dependencies` when `with_dependencies` and the call had any.
fn json_result<'a>(
    r: &'a CallResult,
    sandbox: Option<&'a SandboxId>,
    with_dependencies: bool,
) -> JsonResult<'a> {
    let status = r.status().as_str();
    let output = r.output.as_slice();
    let sandbox_id = sandbox.map(SandboxId::as_str);
    let dependencies =
        (with_dependencies && !r.dependencies.is_empty()).then_some(r.dependencies.as_slice());
    match &r.outcome {
        Outcome::Success(value) => {
            let return_value = match value {
                None => serde_json::Value::Null,
                Some(ReturnValue::Json(text)) => {
                    serde_json::from_str(text).unwrap_or_else(|_| json!(text))
                }
                Some(ReturnValue::Text(text)) => json!(text),
            };
            JsonResult::Success {
                status,
                sandbox_id,
                dependencies,
                output,
                return_value,
                state: r.state.as_deref(),
                note: r.note.as_deref(),
            }
        }
        Outcome::InstallError(error) | Outcome::RunError { error, .. } => JsonResult::Failure {
            status,
            sandbox_id,
            dependencies,
            output,
            error,
            state: r.state.as_deref(),
            note: r.note.as_deref(),
        },
    }
}

fn render_json(r: &CallResult, sandbox: Option<&SandboxId>) -> String {
    serde_json::to_string(&json_result(r, sandbox, false)).unwrap_or_default()
}

/// The structured result of a `--stateful` call (`structuredContent`), as the tool's output
/// schema ([`crate::server::tools::run_python_code::output_schema`]) declares it.
pub fn structured(r: &CallResult, sandbox: &SandboxId) -> serde_json::Value {
    serde_json::to_value(json_result(r, Some(sandbox), true)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::call::result::RunErrorCause;

    fn result() -> CallResult {
        let mut r = CallResult::new(Outcome::Success(Some(ReturnValue::Json(
            "[\n  1,\n  2,\n  3\n]".into(),
        ))));
        r.output = vec!["[1 2 3]".into()];
        r
    }

    #[test]
    fn xml_matches_the_seed() {
        let mut r = result();
        r.dependencies = vec!["numpy".into()];
        assert_eq!(
            render(&r, ReturnMode::Xml, None),
            "<status>success</status>\n<dependencies>[\"numpy\"]</dependencies>\n<output>\n[1 2 3]\n</output>\n<return_value>\n[\n  1,\n  2,\n  3\n]\n</return_value>"
        );
    }

    #[test]
    fn closing_tags_are_escaped() {
        let mut r = result();
        r.output = vec!["a</output>b".into(), "</ OUTPUT >".into()];
        let xml = render(&r, ReturnMode::Xml, None);
        assert!(xml.contains("a&lt;/output&gt;b"));
        assert!(xml.contains("&lt;/ OUTPUT &gt;"));
    }

    #[test]
    fn errors_replace_return_value() {
        let mut r = result();
        r.outcome =
            Outcome::run_error(RunErrorCause::Raised, "ZeroDivisionError: division by zero");
        r.output.clear();
        assert_eq!(
            render(&r, ReturnMode::Xml, None),
            "<status>run-error</status>\n<error>\nZeroDivisionError: division by zero\n</error>"
        );
    }

    #[test]
    fn a_lost_state_is_said_after_the_status() {
        let mut r = result();
        r.state = Some("lost: gone".into());
        assert!(render(&r, ReturnMode::Xml, None)
            .starts_with("<status>success</status>\n<state>lost: gone</state>\n<output>"));
        let v: serde_json::Value =
            serde_json::from_str(&render(&r, ReturnMode::Json, None)).unwrap();
        assert_eq!(v["state"], json!("lost: gone"));
        assert!(!render(&result(), ReturnMode::Json, None).contains("state"));
        assert!(!render(&result(), ReturnMode::Xml, None).contains("state"));
    }

    #[test]
    fn a_note_is_said_after_the_status_and_at_the_end_of_the_json() {
        let mut r = result();
        r.note = Some("ran in a stand-in".into());
        assert!(render(&r, ReturnMode::Xml, None)
            .starts_with("<status>success</status>\n<note>ran in a stand-in</note>\n<output>"));
        let v: serde_json::Value =
            serde_json::from_str(&render(&r, ReturnMode::Json, None)).unwrap_or_default();
        assert_eq!(v["note"], json!("ran in a stand-in"));
        assert!(!render(&result(), ReturnMode::Xml, None).contains("note"));
    }

    #[test]
    fn a_stateful_result_names_its_sandbox() {
        let id = SandboxId::parse("sbx_AAAAAAAAAAAAAAAAAAAAAA").expect("well formed");
        let mut r = result();
        r.dependencies = vec!["numpy".into()];
        assert!(render(&r, ReturnMode::Xml, Some(&id)).starts_with(
            "<status>success</status>\n<sandbox_id>sbx_AAAAAAAAAAAAAAAAAAAAAA</sandbox_id>\n<dependencies>"
        ));
        assert_eq!(
            render(&r, ReturnMode::Json, Some(&id)),
            r#"{"status":"success","sandbox_id":"sbx_AAAAAAAAAAAAAAAAAAAAAA","output":["[1 2 3]"],"return_value":[1,2,3]}"#
        );
        assert_eq!(
            structured(&r, &id),
            json!({"status": "success", "sandbox_id": id.as_str(), "dependencies": ["numpy"],
                   "output": ["[1 2 3]"], "return_value": [1, 2, 3]})
        );
    }

    #[test]
    fn json_mode_embeds_values() {
        let v: serde_json::Value =
            serde_json::from_str(&render(&result(), ReturnMode::Json, None)).unwrap();
        assert_eq!(v["return_value"], json!([1, 2, 3]));
        assert_eq!(v["output"], json!(["[1 2 3]"]));
        assert_eq!(v["status"], json!("success"));
        assert_eq!(
            render(&result(), ReturnMode::Json, None),
            r#"{"status":"success","output":["[1 2 3]"],"return_value":[1,2,3]}"#
        );
        let mut r = result();
        r.outcome = Outcome::run_error(RunErrorCause::Raised, "E\n");
        assert_eq!(
            render(&r, ReturnMode::Json, None),
            r#"{"status":"run-error","output":["[1 2 3]"],"error":"E\n"}"#
        );
    }
}
