//! The request id of a message too large to parse (README "Running many replicas", "every request answered"): a stdio
//! line or an HTTP body over the cap is dropped unread, yet its client waits for an answer
//! bound to its own id (JSON-RPC 2.0 §5: the error response carries the request's id when it
//! can be read). [`IdScan`] keeps only the first and the last [`SCAN_BYTES`] of the message
//! as it streams past, and finds the top-level `"id"` in either: at the start where clients
//! write it before `params` (the Python SDKs), at the end where they write it last (the
//! TypeScript SDK's `{...request, jsonrpc, id}`). Nothing else of the message is parsed.

use serde_json::Value;

/// Bytes kept from each end of an oversized message (a request id is a short string or a
/// number, and sits next to the envelope's start or end).
pub const SCAN_BYTES: usize = 4096;

/// The two ends of a message seen so far.
#[derive(Debug, Default)]
pub struct IdScan {
    head: Vec<u8>,
    tail: std::collections::VecDeque<u8>,
}

impl IdScan {
    /// Takes the next bytes of the message.
    pub fn feed(&mut self, bytes: &[u8]) {
        let room = SCAN_BYTES.saturating_sub(self.head.len());
        let (to_head, rest) = bytes.split_at(room.min(bytes.len()));
        self.head.extend_from_slice(to_head);
        let rest = &rest[rest.len().saturating_sub(SCAN_BYTES)..];
        self.tail.extend(rest);
        let over = self.tail.len().saturating_sub(SCAN_BYTES);
        self.tail.drain(..over);
    }

    /// The request id, when one end shows a top-level `"id"` whose value is a string or a
    /// number (JSON-RPC 2.0 §4: anything else is no request id).
    pub fn id(&self) -> Option<Value> {
        let tail: Vec<u8> = self.tail.iter().copied().collect();
        id_in_head(&self.head).or_else(|| id_in_tail(&tail))
    }
}

/// Whether `value` may be a request id.
fn is_id(value: &Value) -> bool {
    matches!(value, Value::String(_) | Value::Number(_))
}

/// Skips a JSON string starting at `bytes[i]` (its opening quote); the index after its closing
/// quote, or `None` when it does not end within `bytes`.
fn skip_string(bytes: &[u8], mut i: usize) -> Option<usize> {
    i += 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
    None
}

/// The index of the first byte at or after `i` that is not JSON whitespace.
fn skip_space(bytes: &[u8], mut i: usize) -> usize {
    while i < bytes.len() && matches!(bytes[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

/// The value starting at `bytes[i]` if it is a string or a number that ends within `bytes`.
fn scalar_at(bytes: &[u8], i: usize) -> Option<Value> {
    let end = match bytes.get(i)? {
        b'"' => skip_string(bytes, i)?,
        b'-' | b'0'..=b'9' => {
            let len = bytes[i..]
                .iter()
                .position(|b| !matches!(b, b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'))?;
            i + len
        }
        _ => return None,
    };
    serde_json::from_slice(&bytes[i..end]).ok().filter(is_id)
}

/// The top-level `"id"` in the first bytes of an object: walks its keys at depth 1, skipping
/// strings and nested values.
fn id_in_head(bytes: &[u8]) -> Option<Value> {
    let mut i = skip_space(bytes, 0);
    if bytes.get(i) != Some(&b'{') {
        return None;
    }
    i += 1;
    let mut depth = 1usize;
    // Whether the next string at depth 1 is a key (after `{` or `,`), not a value.
    let mut expect_key = true;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                let end = skip_string(bytes, i)?;
                if depth == 1 && expect_key {
                    let key = &bytes[i..end];
                    let colon = skip_space(bytes, end);
                    if bytes.get(colon) != Some(&b':') {
                        return None;
                    }
                    if key == b"\"id\"" {
                        return scalar_at(bytes, skip_space(bytes, colon + 1));
                    }
                    expect_key = false;
                    i = colon + 1;
                    continue;
                }
                i = end;
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.checked_sub(1)?,
            b',' if depth == 1 => expect_key = true,
            _ => {}
        }
        i += 1;
    }
    None
}

/// The top-level `"id"` as the last member of an object: the message ends with
/// `"id": <string or number> }`; a single closing brace after the value means it is the
/// top-level object's own member.
fn id_in_tail(bytes: &[u8]) -> Option<Value> {
    let text = std::str::from_utf8(bytes).ok().or_else(|| {
        // The tail may start inside a multi-byte character: drop its first bytes.
        (1..4).find_map(|skip| std::str::from_utf8(bytes.get(skip..)?).ok())
    })?;
    let body = text.trim_end().strip_suffix('}')?.trim_end();
    let value_start = if let Some(inner) = body.strip_suffix('"') {
        // The string's opening quote: the last unescaped quote before the closing one.
        let mut start = None;
        for (i, _) in inner.match_indices('"').rev() {
            let backslashes = inner[..i].bytes().rev().take_while(|b| *b == b'\\').count();
            if backslashes % 2 == 0 {
                start = Some(i);
                break;
            }
        }
        start?
    } else {
        body.rfind(|c: char| !matches!(c, '-' | '+' | '.' | 'e' | 'E' | '0'..='9'))? + 1
    };
    let before = body[..value_start].trim_end().strip_suffix(':')?.trim_end();
    if !before.ends_with("\"id\"") {
        return None;
    }
    // `"id"` must be a key of its own, after `,` or `{`.
    let key_start = before.len() - "\"id\"".len();
    let lead = before[..key_start].trim_end();
    if !(lead.ends_with(',') || lead.ends_with('{')) {
        return None;
    }
    serde_json::from_str(&body[value_start..])
        .ok()
        .filter(is_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn scan(message: &str) -> Option<Value> {
        let mut scan = IdScan::default();
        for chunk in message.as_bytes().chunks(1000) {
            scan.feed(chunk);
        }
        scan.id()
    }

    fn big(code_bytes: usize) -> String {
        "x".repeat(code_bytes)
    }

    #[test]
    fn the_id_is_found_first_or_last_however_large_the_message() {
        let code = big(1 << 20);
        let first = format!(
            r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"run_python_code","arguments":{{"python_code":"{code}","id":99}}}}}}"#
        );
        assert_eq!(scan(&first), Some(json!(7)));
        let last = format!(
            r#"{{"method":"tools/call","params":{{"arguments":{{"id":99,"python_code":"{code}"}}}},"jsonrpc":"2.0","id":"req-\"8\""}}"#
        );
        assert_eq!(scan(&last), Some(json!("req-\"8\"")));
        let spaced =
            format!("{{ \"method\" : \"x\", \"params\": {{\"c\": \"{code}\"}}, \"id\" : -3 }}\n");
        assert_eq!(scan(&spaced), Some(json!(-3)));
    }

    #[test]
    fn a_nested_id_or_a_missing_one_is_no_id() {
        let code = big(1 << 16);
        let nested_last = format!(r#"{{"method":"x","params":{{"c":"{code}","id":5}}}}"#);
        assert_eq!(scan(&nested_last), None);
        let none = format!(r#"{{"method":"x","params":{{"c":"{code}"}}}}"#);
        assert_eq!(scan(&none), None);
        assert_eq!(scan(r#"{"id":null,"method":"x"}"#), None);
        assert_eq!(scan(r#"{"id":{"a":1}}"#), None);
        assert_eq!(scan("not json at all"), None);
        // A key that merely ends in `id` is not `id`.
        let lookalike = format!(r#"{{"params":{{"c":"{code}"}},"xid":4}}"#);
        assert_eq!(scan(&lookalike), None);
        // A value string containing `"id":` is skipped at the head.
        assert_eq!(scan(r#"{"method":"\"id\":1","id":2}"#), Some(json!(2)));
    }
}
