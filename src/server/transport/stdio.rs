//! The stdio transport: one MCP session over the process's stdin and stdout, one JSON-RPC
//! message per line.
//!
//! Lines are read here rather than by rmcp's own stdio transport so that bad input is
//! answered and the session goes on (docs/architecture.md §9): a line that is not UTF-8 or not JSON gets a
//! JSON-RPC parse error, JSON that is not a JSON-RPC message an invalid-request error, and a
//! line longer than the HTTP transports' body limit (read on to its end without being kept)
//! the same error as a too-large HTTP body ([`crate::server::errors`] words them all). Everything else
//! goes to the rmcp session over a channel pair, as for the SSE transport.
//!
//! A client may also start without `initialize`: the Deno original answers `tools/list` and
//! `tools/call` on such a connection (its own Python helper relies on it), and the MCP spec
//! (2025-11-25, lifecycle) only says the client SHOULD NOT send requests before initializing,
//! leaving the server free to answer. rmcp would refuse them, so the reader first feeds rmcp
//! an implicit `initialize` and `notifications/initialized` and hides the implicit
//! `initialize`'s response from the client (see [`Start`]).

use crate::server::errors::{self, Refusal};
use crate::server::handler::RunPythonServer;
use anyhow::{Context, Result};
use futures::channel::mpsc;
use futures::{SinkExt, StreamExt};
use rmcp::model::{
    ClientCapabilities, ClientJsonRpcMessage, ClientNotification, ClientRequest, GetMeta,
    Implementation, InitializeRequest, InitializeRequestParams, InitializedNotification,
    ProtocolVersion, RequestId, ServerJsonRpcMessage,
};
use rmcp::ServiceExt;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};

/// One line of the client's stream, as [`read_line`] found it.
#[derive(Debug, PartialEq)]
enum Line {
    /// A line of UTF-8 text, without its `\n` or `\r\n`.
    Text(String),
    /// A line that is not UTF-8; the byte offset where it stops being UTF-8.
    NotUtf8 { valid_up_to: usize },
    /// A line longer than the limit; it was read to its end and dropped. Its request id, when
    /// its first or last bytes show one ([`crate::server::transport::oversized`]).
    TooLong { id: Option<serde_json::Value> },
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
    let mut scan = crate::server::transport::oversized::IdScan::default();
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
                scan.feed(&line);
                line = Vec::new();
            } else {
                line.extend_from_slice(content);
            }
        }
        if too_long {
            scan.feed(content);
        }
        reader.consume(used);
        if ended {
            break;
        }
    }
    if too_long {
        return Ok(Line::TooLong { id: scan.id() });
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

/// The request id of the implicit `initialize` (see [`Start`]). Its response is the first
/// response rmcp sends after it and is dropped before the client sees it, so even a client that
/// happens to use the same id later gets its own answer.
const IMPLICIT_INITIALIZE_ID: &str = "mcp-run-python/implicit-initialize";

/// `clientInfo` of the implicit `initialize`: there is no client to name.
const IMPLICIT_CLIENT_NAME: &str = "implicit";
const IMPLICIT_CLIENT_VERSION: &str = "0";

/// How the client's first messages start the session (MCP spec 2025-11-25, lifecycle).
#[derive(Debug, PartialEq)]
enum Start {
    /// Not decided yet: a `ping` (answered before initialization, as the spec allows) or a
    /// `server/discover` probe, which rmcp answers without choosing a lifecycle.
    Undecided,
    /// The client initializes itself, or sends a request that carries its protocol version in
    /// `_meta` (the 2026-07-28 lifecycle without `initialize`): rmcp handles it.
    ByClient,
    /// Anything else before `initialize`: the session is initialized implicitly first.
    Implicit,
}

/// How `message`, the first message of the session but for pings, starts it.
fn start_of(message: &ClientJsonRpcMessage) -> Start {
    let ClientJsonRpcMessage::Request(request) = message else {
        return Start::Implicit;
    };
    match &request.request {
        ClientRequest::InitializeRequest(_) => Start::ByClient,
        ClientRequest::PingRequest(_) | ClientRequest::DiscoverRequest(_) => Start::Undecided,
        other
            if other
                .get_meta()
                .missing_required_keys(&ProtocolVersion::V_2026_07_28)
                .is_empty() =>
        {
            Start::ByClient
        }
        _ => Start::Implicit,
    }
}

/// The messages that initialize a session for a client that did not: `initialize` with the
/// newest protocol version that has the handshake, then `notifications/initialized`.
fn implicit_start() -> [ClientJsonRpcMessage; 2] {
    let params = InitializeRequestParams::new(
        ClientCapabilities::default(),
        Implementation::new(IMPLICIT_CLIENT_NAME, IMPLICIT_CLIENT_VERSION),
    )
    .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE);
    [
        ClientJsonRpcMessage::request(
            ClientRequest::InitializeRequest(InitializeRequest::new(params)),
            RequestId::String(IMPLICIT_INITIALIZE_ID.into()),
        ),
        ClientJsonRpcMessage::notification(ClientNotification::InitializedNotification(
            InitializedNotification::default(),
        )),
    ]
}

/// Whether `message` answers the implicit `initialize`.
fn answers_implicit_start(message: &ServerJsonRpcMessage) -> bool {
    let id = match message {
        ServerJsonRpcMessage::Response(response) => Some(&response.id),
        ServerJsonRpcMessage::Error(error) => error.id.as_ref(),
        _ => None,
    };
    matches!(id, Some(RequestId::String(id)) if &**id == IMPLICIT_INITIALIZE_ID)
}

/// The message on a line of text, or the error reply to it.
fn decode_line(line: &str) -> Result<ClientJsonRpcMessage, Refusal> {
    errors::decode(line.as_bytes())
}

/// Messages buffered each way between the lines and the rmcp session; a sender waits beyond
/// that, so a client that floods stdin is read no faster than the session takes its messages.
const MESSAGE_BUFFER: usize = 64;

/// Serves one session on stdin/stdout until the client closes stdin.
///
/// Errors: the transport failed to start or broke down.
pub async fn serve(server: RunPythonServer) -> Result<()> {
    let (to_server, from_client) = mpsc::channel::<ClientJsonRpcMessage>(MESSAGE_BUFFER);
    let (to_client, from_server) = mpsc::channel::<ServerJsonRpcMessage>(MESSAGE_BUFFER);
    let (out, out_rx) = tokio::sync::mpsc::unbounded_channel::<String>();

    let writer = tokio::spawn(write_lines(out_rx));
    // Set by the reader before it sends the implicit `initialize`, cleared by the forwarder
    // when it drops the response: the client never asked, so it must not see it.
    let hide_implicit_start = Arc::new(AtomicBool::new(false));
    let forward = tokio::spawn(forward_replies(
        from_server,
        hide_implicit_start.clone(),
        out.clone(),
    ));
    let reader = tokio::spawn(read_messages(
        to_server,
        out,
        hide_implicit_start,
        server.clone(),
    ));

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

/// Where this process's standard input and output are found again as pipes: opening one of
/// these gives a new open file description of the same pipe, non-blocking, so that the
/// original descriptions (which the client's side may share) keep their flags.
const STDIN_PIPE: &str = "/proc/self/fd/0";
const STDOUT_PIPE: &str = "/proc/self/fd/1";

/// Standard input to read lines from: when it is a pipe (what MCP clients give a stdio server)
/// a non-blocking description of it ([`STDIN_PIPE`]), read through tokio's reactor; else (a
/// socket, a terminal, a file) tokio's `stdin`, whose every read is a trip to a blocking
/// thread and back, tens of microseconds of each call (issue 49).
fn stdin_reader() -> Box<dyn tokio::io::AsyncRead + Unpin + Send> {
    match tokio::net::unix::pipe::OpenOptions::new().open_receiver(STDIN_PIPE) {
        Ok(pipe) => Box::new(pipe),
        Err(_) => Box::new(tokio::io::stdin()),
    }
}

/// Standard output to write lines to, as [`stdin_reader`] finds standard input.
fn stdout_writer() -> Box<dyn tokio::io::AsyncWrite + Unpin + Send> {
    match tokio::net::unix::pipe::OpenOptions::new().open_sender(STDOUT_PIPE) {
        Ok(pipe) => Box::new(pipe),
        Err(_) => Box::new(tokio::io::stdout()),
    }
}

/// Writes each line of `lines` to stdout, with its newline, until the channel closes or
/// stdout fails.
async fn write_lines(mut lines: tokio::sync::mpsc::UnboundedReceiver<String>) {
    let mut stdout = stdout_writer();
    while let Some(mut line) = lines.recv().await {
        // One write per message: where stdout is not a pipe, each write of tokio's stdout is
        // a trip to a blocking thread, and the client waits for the newline.
        line.push('\n');
        let written = async {
            stdout.write_all(line.as_bytes()).await?;
            stdout.flush().await
        };
        if written.await.is_err() {
            break;
        }
    }
}

/// Hands each message of the session to the writer as one line of JSON (`replies`), but for
/// the answer to the implicit `initialize` while `hide` is set (it then clears `hide`).
async fn forward_replies(
    mut from_server: mpsc::Receiver<ServerJsonRpcMessage>,
    hide: Arc<AtomicBool>,
    replies: tokio::sync::mpsc::UnboundedSender<String>,
) {
    while let Some(message) = from_server.next().await {
        if hide.load(Ordering::SeqCst) && answers_implicit_start(&message) {
            hide.store(false, Ordering::SeqCst);
            continue;
        }
        let Ok(line) = serde_json::to_string(&message) else {
            continue;
        };
        if replies.send(line).is_err() {
            break;
        }
    }
}

/// Reads the client's lines from stdin until it ends (or breaks), and sends each message to
/// the session (`to_server`), stamped with its arrival by `stamper`; a bad line is answered
/// with its error on `out`. Before the first message that does not initialize the session
/// itself, sends the implicit start and sets `hide_implicit_start` (see [`Start`]).
async fn read_messages(
    mut to_server: mpsc::Sender<ClientJsonRpcMessage>,
    out: tokio::sync::mpsc::UnboundedSender<String>,
    hide_implicit_start: Arc<AtomicBool>,
    stamper: RunPythonServer,
) {
    // The same bound as an HTTP request body: a line carries one message with the code in it.
    let max_line_bytes = crate::server::transport::http::max_body_bytes(stamper.max_code_bytes);
    let mut stdin = BufReader::new(stdin_reader());
    let mut start = Start::Undecided;
    // A read error (stdin gone bad) ends the session like the end of the stream.
    while let Ok(read) = read_line(&mut stdin, max_line_bytes).await {
        let decoded = match read {
            Line::Eof => break,
            Line::Text(line) if line.trim().is_empty() => continue,
            Line::Text(line) => decode_line(&line),
            Line::NotUtf8 { valid_up_to } => Err(errors::not_utf8(valid_up_to)),
            Line::TooLong { id } => {
                Err(errors::too_large(max_line_bytes).with_id(id.unwrap_or_default()))
            }
        };
        let mut message = match decoded {
            Ok(message) => message,
            Err(refusal) => {
                let _ = out.send(refusal.to_line());
                continue;
            }
        };
        if start == Start::Undecided {
            start = start_of(&message);
            if start == Start::Implicit {
                hide_implicit_start.store(true, Ordering::SeqCst);
                for implicit in implicit_start() {
                    if to_server.send(implicit).await.is_err() {
                        return;
                    }
                }
            }
        }
        stamper.stamp_arrival(&mut message);
        if to_server.send(message).await.is_err() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::ErrorCode;
    use serde_json::Value;

    #[test]
    fn bad_lines_get_json_rpc_errors() {
        let parse = decode_line("{not json").unwrap_err();
        assert_eq!(parse.error.code, ErrorCode::PARSE_ERROR);
        assert_eq!(parse.id, Value::Null);
        let invalid = decode_line(r#"{"jsonrpc":"2.0","id":7,"method":5}"#).unwrap_err();
        assert_eq!(invalid.error.code, ErrorCode::INVALID_REQUEST);
        assert_eq!(invalid.id, 7);
        assert!(decode_line(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#).is_ok());
    }

    fn message(line: &str) -> ClientJsonRpcMessage {
        decode_line(line).expect("a client message")
    }

    #[test]
    fn requests_before_initialize_start_the_session_implicitly() {
        let list = message(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
        assert_eq!(start_of(&list), Start::Implicit);
        let call = message(
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"run_python_code","arguments":{"python_code":"1"}}}"#,
        );
        assert_eq!(start_of(&call), Start::Implicit);
        let initialized = message(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        assert_eq!(start_of(&initialized), Start::Implicit);
        let init = message(
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}"#,
        );
        assert_eq!(start_of(&init), Start::ByClient);
        let ping = message(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#);
        assert_eq!(start_of(&ping), Start::Undecided);
    }

    #[test]
    fn the_implicit_start_is_initialize_then_initialized() {
        let [init, initialized] = implicit_start();
        let init = serde_json::to_value(&init).expect("serializable");
        assert_eq!(init["method"], "initialize");
        assert_eq!(init["id"], IMPLICIT_INITIALIZE_ID);
        assert_eq!(
            init["params"]["protocolVersion"],
            ProtocolVersion::LATEST_WITH_INITIALIZE.as_str()
        );
        assert_eq!(init["params"]["clientInfo"]["name"], IMPLICIT_CLIENT_NAME);
        let initialized = serde_json::to_value(&initialized).expect("serializable");
        assert_eq!(initialized["method"], "notifications/initialized");
        // Only the answer to the implicit id is hidden.
        let hidden: ServerJsonRpcMessage = serde_json::from_value(serde_json::json!(
            {"jsonrpc": "2.0", "id": IMPLICIT_INITIALIZE_ID, "result": {}}
        ))
        .expect("a response");
        assert!(answers_implicit_start(&hidden));
        let shown: ServerJsonRpcMessage = serde_json::from_value(serde_json::json!(
            {"jsonrpc": "2.0", "id": 1, "result": {}}
        ))
        .expect("a response");
        assert!(!answers_implicit_start(&shown));
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
        assert_eq!(
            lines,
            vec![
                Line::TooLong { id: None },
                text("short"),
                Line::TooLong { id: None }
            ]
        );
        // Exactly the limit is accepted: the newline is not counted, a `\r` before it is.
        let lines = read_all(b"0123456789\n0123456789\r\n", 10, 4).await;
        assert_eq!(lines, vec![text("0123456789"), Line::TooLong { id: None }]);
    }
}
