//! The stdio transport: one MCP session over the process's stdin and stdout, one JSON-RPC
//! message per line.
//!
//! Lines are read here rather than by rmcp's own stdio transport so that bad input is
//! answered and the session goes on (DESIGN §9): a line that is not UTF-8 or not JSON gets a
//! JSON-RPC parse error (-32700); JSON that is not a JSON-RPC message, and a line longer than
//! the HTTP transports' body limit (read on to its end without being kept), get an
//! invalid-request error (-32600). Everything else goes to the rmcp session over a channel
//! pair, as for the SSE transport.

use super::handler::{stamp_arrival, RunPythonServer};
use anyhow::{Context, Result};
use futures::channel::mpsc;
use futures::{SinkExt, StreamExt};
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::ServiceExt;
use serde_json::{json, Value};
use std::io;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};

/// One line of the client's stream, as [`read_line`] found it.
#[derive(Debug, PartialEq)]
enum Line {
    /// A line of UTF-8 text, without its `\n` or `\r\n`.
    Text(String),
    /// A line that is not UTF-8; the byte offset where it stops being UTF-8.
    NotUtf8 { valid_up_to: usize },
    /// A line longer than the limit; it was read to its end and dropped.
    TooLong,
    /// The stream ended.
    Eof,
}

/// Reads the next line of `reader`, keeping at most `max_bytes` of it (its `\n` not counted):
/// a longer line is read on to its newline (or the end of the stream) in the reader's own
/// buffer-sized steps and given up, so that one huge line costs no memory.
///
/// Errors: the reader's.
async fn read_line(reader: &mut (impl AsyncBufRead + Unpin), max_bytes: usize) -> io::Result<Line> {
    let mut line: Vec<u8> = Vec::new();
    let mut too_long = false;
    let mut read_any = false;
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            // The end of the stream: a last line without a newline still counts.
            if !read_any {
                return Ok(Line::Eof);
            }
            break;
        }
        read_any = true;
        let (content, used, ended) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (&available[..i], i + 1, true),
            None => (available, available.len(), false),
        };
        if !too_long {
            if line.len().saturating_add(content.len()) > max_bytes {
                too_long = true;
                line = Vec::new();
            } else {
                line.extend_from_slice(content);
            }
        }
        reader.consume(used);
        if ended {
            break;
        }
    }
    if too_long {
        return Ok(Line::TooLong);
    }
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    match String::from_utf8(line) {
        Ok(text) => Ok(Line::Text(text)),
        Err(e) => Ok(Line::NotUtf8 {
            valid_up_to: e.utf8_error().valid_up_to(),
        }),
    }
}

/// A JSON-RPC error reply with `id: null`: the line had no usable id.
fn error_reply(code: i64, message: String) -> Value {
    json!({"jsonrpc": "2.0", "id": null, "error": {"code": code, "message": message}})
}

/// The answer to a line that is not a JSON-RPC message, if it deserves one.
fn bad_input_reply(line: &str) -> Result<ClientJsonRpcMessage, Value> {
    let value: Value = serde_json::from_str(line).map_err(|e| {
        json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32700, "message": format!("Parse error: {e}")}})
    })?;
    serde_json::from_value::<ClientJsonRpcMessage>(value.clone()).map_err(|e| {
        let id = value.get("id").cloned().unwrap_or(Value::Null);
        json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32600, "message": format!("Invalid Request: {e}")}})
    })
}

/// Serves one session on stdin/stdout until the client closes stdin.
///
/// Errors: the transport failed to start or broke down.
pub async fn serve(server: RunPythonServer) -> Result<()> {
    let (mut to_server, from_client) = mpsc::channel::<ClientJsonRpcMessage>(64);
    let (to_client, mut from_server) = mpsc::channel::<ServerJsonRpcMessage>(64);
    let (out, mut out_rx) = tokio::sync::mpsc::unbounded_channel::<String>();

    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(line) = out_rx.recv().await {
            let written = async {
                stdout.write_all(line.as_bytes()).await?;
                stdout.write_all(b"\n").await?;
                stdout.flush().await
            };
            if written.await.is_err() {
                break;
            }
        }
    });
    let replies = out.clone();
    let forward = tokio::spawn(async move {
        while let Some(message) = from_server.next().await {
            let Ok(line) = serde_json::to_string(&message) else {
                continue;
            };
            if replies.send(line).is_err() {
                break;
            }
        }
    });
    // The same bound as an HTTP request body: a line carries one message with the code in it.
    let max_line_bytes = super::http::max_body_bytes(server.max_code_bytes);
    let tenant = server.tenant();
    let reader = tokio::spawn(async move {
        let mut stdin = BufReader::new(tokio::io::stdin());
        // A read error (stdin gone bad) ends the session like the end of the stream.
        while let Ok(read) = read_line(&mut stdin, max_line_bytes).await {
            let line = match read {
                Line::Eof => break,
                Line::Text(line) => line,
                Line::NotUtf8 { valid_up_to } => {
                    let message = format!(
                        "Parse error: the line is not valid UTF-8 (invalid byte at offset {valid_up_to})"
                    );
                    let _ = out.send(error_reply(-32700, message).to_string());
                    continue;
                }
                Line::TooLong => {
                    let message =
                        format!("Invalid Request: request larger than {max_line_bytes} bytes");
                    let _ = out.send(error_reply(-32600, message).to_string());
                    continue;
                }
            };
            if line.trim().is_empty() {
                continue;
            }
            match bad_input_reply(&line) {
                Ok(mut message) => {
                    if let Some(tenant) = &tenant {
                        stamp_arrival(&mut message, tenant);
                    }
                    if to_server.send(message).await.is_err() {
                        break;
                    }
                }
                Err(reply) => {
                    let _ = out.send(reply.to_string());
                }
            }
        }
    });

    let running = server
        .serve((to_client, from_client))
        .await
        .context("starting the MCP session on stdio")?;
    running.waiting().await.context("serving MCP on stdio")?;
    reader.abort();
    let _ = forward.await;
    let _ = writer.await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_lines_get_json_rpc_errors() {
        let parse = bad_input_reply("this is not json").unwrap_err();
        assert_eq!(parse["error"]["code"], -32700);
        assert_eq!(parse["id"], Value::Null);
        let invalid = bad_input_reply(r#"{"jsonrpc":"2.0","id":7,"method":5}"#).unwrap_err();
        assert_eq!(invalid["error"]["code"], -32600);
        assert_eq!(invalid["id"], 7);
        assert!(bad_input_reply(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#).is_ok());
    }

    /// Every line of `input` as [`read_line`] reads it with limit `max`, up to the end.
    async fn read_all(input: &[u8], max: usize, buffer: usize) -> Vec<Line> {
        let mut reader = BufReader::with_capacity(buffer, input);
        let mut lines = Vec::new();
        loop {
            match read_line(&mut reader, max).await.expect("reading a slice") {
                Line::Eof => return lines,
                line => lines.push(line),
            }
        }
    }

    fn text(s: &str) -> Line {
        Line::Text(s.to_owned())
    }

    #[tokio::test]
    async fn lines_are_split_and_end_of_stream_is_seen() {
        let lines = read_all(b"one\ntwo\r\n\nlast", 100, 8192).await;
        assert_eq!(
            lines,
            vec![text("one"), text("two"), text(""), text("last")]
        );
        assert_eq!(read_all(b"", 100, 8192).await, vec![]);
        assert_eq!(read_all(b"x\n", 100, 8192).await, vec![text("x")]);
    }

    #[tokio::test]
    async fn invalid_utf8_is_one_bad_line_and_reading_goes_on() {
        let lines = read_all(b"{\"a\":\"\xff\"}\nnext\n", 100, 8192).await;
        assert_eq!(lines, vec![Line::NotUtf8 { valid_up_to: 6 }, text("next")]);
        // A multi-byte character split across buffer refills is still UTF-8.
        let lines = read_all("héé\n".as_bytes(), 100, 2).await;
        assert_eq!(lines, vec![text("héé")]);
    }

    #[tokio::test]
    async fn long_lines_are_dropped_whole_and_reading_goes_on() {
        // Small buffers: the long line arrives in many pieces and none of it is kept.
        let mut input = vec![b'x'; 10_000];
        input.extend_from_slice(b"\nshort\n");
        input.extend(vec![b'y'; 11]);
        let lines = read_all(&input, 10, 64).await;
        assert_eq!(lines, vec![Line::TooLong, text("short"), Line::TooLong]);
        // Exactly the limit is accepted: the newline is not counted, a `\r` before it is.
        let lines = read_all(b"0123456789\n0123456789\r\n", 10, 4).await;
        assert_eq!(lines, vec![text("0123456789"), Line::TooLong]);
    }

    #[test]
    fn error_replies_have_a_null_id() {
        let reply = error_reply(
            -32600,
            "Invalid Request: request larger than 10 bytes".into(),
        );
        assert_eq!(reply["id"], Value::Null);
        assert_eq!(reply["error"]["code"], -32600);
        assert_eq!(reply["jsonrpc"], "2.0");
    }
}
