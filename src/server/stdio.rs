//! The stdio transport: one MCP session over the process's stdin and stdout, one JSON-RPC
//! message per line.
//!
//! Lines are read here rather than by rmcp's own stdio transport so that bad input is
//! answered (DESIGN §9): a line that is not JSON gets a JSON-RPC parse error (-32700), and
//! JSON that is not a JSON-RPC message gets an invalid-request error (-32600). Everything
//! else goes to the rmcp session over a channel pair, as for the SSE transport.

use super::handler::RunPythonServer;
use anyhow::{Context, Result};
use futures::channel::mpsc;
use futures::{SinkExt, StreamExt};
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::ServiceExt;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

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
    let reader = tokio::spawn(async move {
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if line.trim().is_empty() {
                continue;
            }
            match bad_input_reply(&line) {
                Ok(message) => {
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
}
