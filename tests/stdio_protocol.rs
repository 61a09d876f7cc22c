//! The real binary over real pipes, speaking raw JSON-RPC: the handshake does not wait for
//! Pyodide, bad input gets errors, and a call still works afterwards.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

struct Server {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    log: tempfile::NamedTempFile,
}

impl Server {
    fn start() -> Server {
        let log = tempfile::NamedTempFile::new().unwrap();
        let cache = std::env::temp_dir().join("mcp-run-python-rust-tests");
        let mut child = Command::new(env!("CARGO_BIN_EXE_mcp-run-python"))
            // The host's zygote service would outlive the test (test_zygote_service.py covers it).
            .args([
                "stdio",
                "--workers",
                "1",
                "--no-shared-zygote",
                "--cache-dir",
            ])
            .arg(&cache)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log.reopen().unwrap())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Server {
            child,
            stdin,
            lines,
            log,
        }
    }

    fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
    }

    fn request(&mut self, id: u64, method: &str, params: Value) -> Value {
        self.send(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string(),
        );
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(300))
                .expect("the server answers");
            let msg: Value = serde_json::from_str(&line).expect("the server writes JSON");
            if msg["id"] == json!(id) {
                return msg;
            }
        }
    }

    fn next_line(&self) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(60))
            .expect("the server answers")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn handshake_errors_and_a_call_over_raw_pipes() {
    let mut server = Server::start();
    let init = server.request(
        1,
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}),
    );
    assert_eq!(init["result"]["serverInfo"]["name"], "mcp-run-python");
    // The handshake was answered before the worker finished booting Pyodide.
    assert!(
        !server.log().contains("booted in"),
        "initialize waited for the boot"
    );
    server.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);

    let tools = server.request(2, "tools/list", json!({}));
    assert_eq!(tools["result"]["tools"].as_array().unwrap().len(), 1);
    assert_eq!(tools["result"]["tools"][0]["name"], "run_python_code");

    // Malformed input is answered with JSON-RPC errors and does not break the session.
    server.send("this is not json");
    let parse_error: Value = serde_json::from_str(&server.next_line()).unwrap();
    assert_eq!(parse_error["error"]["code"], -32700);
    assert_eq!(parse_error["id"], Value::Null);
    server.send(r#"{"jsonrpc":"2.0","id":9,"method":5}"#);
    let invalid: Value = serde_json::from_str(&server.next_line()).unwrap();
    assert_eq!(invalid["error"]["code"], -32600);
    assert_eq!(invalid["id"], 9);
    let unknown = server.request(3, "no/such/method", json!({}));
    assert!(unknown["error"]["code"].is_i64());
    let wrong_type = server.request(
        4,
        "tools/call",
        json!({"name": "run_python_code", "arguments": {"python_code": 1}}),
    );
    assert!(wrong_type["error"]["message"]
        .as_str()
        .unwrap()
        .contains("expected a string"));

    let call = server.request(
        5,
        "tools/call",
        json!({"name": "run_python_code", "arguments": {"python_code": "print('hi')\n6 * 7"}}),
    );
    assert_eq!(
        call["result"]["content"][0]["text"],
        "<status>success</status>\n<output>\nhi\n</output>\n<return_value>\n42\n</return_value>"
    );
}

/// The next JSON-RPC message the server writes.
fn next_message(server: &Server, timeout: Duration) -> Value {
    let line = server
        .lines
        .recv_timeout(timeout)
        .expect("the server answers");
    serde_json::from_str(&line).expect("the server writes JSON")
}

/// The drop-in (README "Differences from the Deno original"): like the Deno original, the server answers `tools/list` and `tools/call`
/// from a client that never sent `initialize`, in order, with their own ids, and the
/// implicit handshake it performs for them is never shown to the client.
#[test]
fn tools_are_answered_without_initialize() {
    let mut server = Server::start();
    server.send(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
    server.send(
        &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "run_python_code", "arguments": {"python_code": "print('hi')\n6 * 7"}}})
        .to_string(),
    );
    let listed = next_message(&server, Duration::from_secs(60));
    assert_eq!(listed["id"], 1, "{listed}");
    assert_eq!(listed["result"]["tools"][0]["name"], "run_python_code");
    let called = next_message(&server, Duration::from_secs(300));
    assert_eq!(called["id"], 2, "{called}");
    assert_eq!(
        called["result"]["content"][0]["text"],
        "<status>success</status>\n<output>\nhi\n</output>\n<return_value>\n42\n</return_value>"
    );
    // Bad lines are still answered, and a later request too.
    server.send("{not json");
    let parse_error = next_message(&server, Duration::from_secs(60));
    assert_eq!(parse_error["error"]["code"], -32700);
    let ping = server.request(3, "ping", json!({}));
    assert_eq!(ping["result"], json!({}));
}
