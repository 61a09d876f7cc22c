//! The MCP tasks extension (SEP-2663) as rmcp's own client sees it, against the real binary:
//! over streamable HTTP (MCP 2026-07-28, sessionless: the client declares the extension in
//! every request's `_meta`) and over stdio (declared at `initialize`). A long
//! `run_python_code` becomes a task that `tasks/get` follows to its result; `tasks/cancel`
//! stops the interpreter; a client that did not declare the extension gets plain results and
//! -32021 for `tasks/*`; an unknown task id gets -32602.

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ClientCapabilities,
    ClientConfig, CreateTaskResult, DetailedTask, GetTaskParams, Implementation, ProtocolVersion,
    TaskPayload, TaskStatus,
};
use rmcp::service::{RunningService, ServiceError};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientLifecycleMode, ClientServiceExt, RoleClient, ServiceExt};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

type Client = RunningService<RoleClient, ClientConfig>;

/// The first call of a server may wait for its worker to boot Pyodide (and, on a cold cache,
/// to build the snapshot).
const FIRST_CALL: Duration = Duration::from_secs(240);

/// Any later step.
const STEP: Duration = Duration::from_secs(60);

/// Prints a line and sleeps ~5 s before answering 42: longer than the second after which a
/// call becomes a task.
const SLOW_CODE: &str = "import time\nprint('slept')\ntime.sleep(5)\n6 * 7";

/// What [`SLOW_CODE`] answers.
const SLOW_ANSWER: &str =
    "<status>success</status>\n<output>\nslept\n</output>\n<return_value>\n42\n</return_value>";

/// Runs far longer than any test: only a cancel ends it.
const ENDLESS_CODE: &str = "import time\ntime.sleep(600)";

/// The binary, killed (and reaped) when dropped, also when the test panics; then its log is
/// printed.
struct Server {
    child: Child,
    log: tempfile::NamedTempFile,
}

impl Server {
    /// `mcp-run-python MODE ARGS…` with one worker (so that an interpreter a cancel left
    /// running would hold up every later call), no host zygote service, and the cache the
    /// other integration tests use; stdin and stdout as `stdio` says.
    fn start(mode: &str, args: &[&str], stdio: fn() -> Stdio) -> Server {
        let log = tempfile::NamedTempFile::new().expect("a temporary file for the server log");
        let cache = std::env::temp_dir().join("mcp-run-python-rust-tests");
        let child = Command::new(env!("CARGO_BIN_EXE_mcp-run-python"))
            .arg(mode)
            .args(args)
            // The host's zygote service would outlive the test.
            .args(["--workers", "1", "--no-shared-zygote", "--cache-dir"])
            .arg(&cache)
            .stdin(stdio())
            .stdout(stdio())
            .stderr(log.reopen().expect("the server log, reopened"))
            .spawn()
            .expect("the binary starts");
        Server { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- server log ---\n{}--- end ---", self.log());
        }
    }
}

fn client_config(tasks: bool) -> ClientConfig {
    let capabilities = if tasks {
        ClientCapabilities::builder().enable_tasks().build()
    } else {
        ClientCapabilities::default()
    };
    ClientConfig::new(capabilities, Implementation::new("tasks-rmcp-test", "1"))
}

fn run_python(code: &str) -> CallToolRequestParams {
    let mut arguments = serde_json::Map::new();
    arguments.insert("python_code".into(), code.into());
    CallToolRequestParams::new("run_python_code").with_arguments(arguments)
}

/// `what`, or a panic naming it after `limit`.
async fn within<T>(limit: Duration, what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer in {limit:?}"))
}

/// The JSON-RPC error code of a failed request.
fn error_code(error: &ServiceError) -> i32 {
    match error {
        ServiceError::McpError(data) => data.code.0,
        other => panic!("expected a JSON-RPC error, got {other:?}"),
    }
}

/// The text of a result's only content block.
fn text_of(result: &CallToolResult) -> &str {
    assert_eq!(result.content.len(), 1, "{result:?}");
    &result.content[0]
        .as_text()
        .unwrap_or_else(|| panic!("a text block: {result:?}"))
        .text
}

/// Calls `code` and expects a task for it.
async fn start_task(client: &Client, code: &str) -> CreateTaskResult {
    let answer = within(STEP, "tools/call", client.call_tool_once(run_python(code)))
        .await
        .expect("tools/call answers");
    let CallToolResponse::Task(created) = answer else {
        panic!("a long call from a tasks client becomes a task, got {answer:?}");
    };
    let id = &created.task.task_id;
    assert!(
        id.strip_prefix("task_")
            .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit())),
        "a public task id: {id}"
    );
    assert_eq!(created.task.status, TaskStatus::Working);
    assert_eq!(created.task.poll_interval_ms, Some(500));
    created
}

async fn get_task(client: &Client, id: &str) -> DetailedTask {
    let got = within(STEP, "tasks/get", client.get_task(GetTaskParams::new(id)))
        .await
        .expect("tasks/get answers");
    assert_eq!(
        got.task.task.task_id, id,
        "tasks/get names the task it was asked for"
    );
    got.task
}

/// Polls task `id` until it ends (within `limit`).
async fn poll_to_end(client: &Client, id: &str, limit: Duration) -> DetailedTask {
    let deadline = Instant::now() + limit;
    loop {
        let task = get_task(client, id).await;
        if task.status().is_terminal() {
            return task;
        }
        assert!(
            Instant::now() < deadline,
            "task {id} still {task:?} after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn completed_result(task: DetailedTask) -> CallToolResult {
    match task.payload {
        TaskPayload::Completed { result } => serde_json::from_value(result.into())
            .expect("a completed task's result is a CallToolResult"),
        other => panic!("expected a completed task, got {other:?}"),
    }
}

/// A slow call becomes a task, `working` at first, then `completed` with the call's result.
/// `limit`: how long it may take in all (the first call of a server boots its worker).
async fn slow_call_becomes_a_task(client: &Client, limit: Duration) {
    let created = start_task(client, SLOW_CODE).await;
    let id = created.task.task_id;
    let started = Instant::now();
    let first = get_task(client, &id).await;
    assert_eq!(first.status(), TaskStatus::Working, "{first:?}");
    assert_eq!(first.payload, TaskPayload::Working);
    let done = poll_to_end(client, &id, limit).await;
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "the task ended before the code could have slept: {done:?}"
    );
    let result = completed_result(done);
    assert_ne!(result.is_error, Some(true), "{result:?}");
    assert_eq!(text_of(&result), SLOW_ANSWER);
    // A finished task still answers.
    assert_eq!(get_task(client, &id).await.status(), TaskStatus::Completed);
}

/// `tasks/cancel` of an endless call: the task ends `cancelled` (which it does only once the
/// run has ended: its interpreter was stopped).
async fn endless_call_is_cancelled(client: &Client) {
    let created = start_task(client, ENDLESS_CODE).await;
    let id = created.task.task_id;
    assert_eq!(get_task(client, &id).await.status(), TaskStatus::Working);
    within(
        STEP,
        "tasks/cancel",
        client.cancel_task(CancelTaskParams::new(id.clone())),
    )
    .await
    .expect("tasks/cancel is acknowledged");
    let ended = poll_to_end(client, &id, STEP).await;
    assert_eq!(ended.payload, TaskPayload::Cancelled, "{ended:?}");
    // Cancelling an ended task is acknowledged again.
    within(
        STEP,
        "tasks/cancel",
        client.cancel_task(CancelTaskParams::new(id.clone())),
    )
    .await
    .expect("tasks/cancel of an ended task is acknowledged");
    assert_eq!(get_task(client, &id).await.status(), TaskStatus::Cancelled);
}

/// Unknown task ids, well-formed or not, get -32602 from `tasks/get` and `tasks/cancel`.
async fn unknown_ids_are_invalid_params(client: &Client) {
    let well_formed = format!("task_{}", "0123456789abcdef".repeat(2));
    for id in [well_formed.as_str(), "garbage", "", "../../etc/passwd"] {
        let got = within(STEP, "tasks/get", client.get_task(GetTaskParams::new(id)))
            .await
            .expect_err("an unknown task is an error");
        assert_eq!(error_code(&got), -32602, "tasks/get {id:?}: {got:?}");
        let cancelled = within(
            STEP,
            "tasks/cancel",
            client.cancel_task(CancelTaskParams::new(id)),
        )
        .await
        .expect_err("an unknown task is an error");
        assert_eq!(
            error_code(&cancelled),
            -32602,
            "tasks/cancel {id:?}: {cancelled:?}"
        );
    }
}

/// A client that did not declare the extension: the slow call answers as a plain result
/// (within `limit`), and `tasks/*` gets -32021.
async fn client_without_tasks(client: &Client, limit: Duration) {
    let answer = within(
        limit,
        "tools/call",
        client.call_tool_once(run_python(SLOW_CODE)),
    )
    .await
    .expect("tools/call answers");
    let CallToolResponse::Complete(result) = answer else {
        panic!("a client without tasks gets a plain result, got {answer:?}");
    };
    assert_eq!(text_of(&result), SLOW_ANSWER);
    let well_formed = format!("task_{}", "ab".repeat(16));
    let got = within(
        STEP,
        "tasks/get",
        client.get_task(GetTaskParams::new(well_formed)),
    )
    .await
    .expect_err("tasks/get without the extension is an error");
    assert_eq!(error_code(&got), -32021, "{got:?}");
}

/// A free TCP port on the loopback interface (free when this returns).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

/// `streamable-http` on a free port, once it accepts connections; and its `/mcp` URL.
async fn http_server() -> (Server, String) {
    let port = free_port().to_string();
    let mut server = Server::start("streamable-http", &["--port", &port], Stdio::null);
    let address = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + STEP;
    while tokio::net::TcpStream::connect(&address).await.is_err() {
        if let Ok(Some(status)) = server.child.try_wait() {
            panic!("the server exited ({status}): {}", server.log());
        }
        assert!(
            Instant::now() < deadline,
            "the server never listened on {address}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (server, format!("http://{address}/mcp"))
}

/// A client of `url` speaking MCP 2026-07-28 (no session; `server/discover`, then every
/// request carries the client's capabilities).
async fn http_client(url: &str, tasks: bool) -> Client {
    let transport = StreamableHttpClientTransport::from_uri(url.to_owned());
    let lifecycle = ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    };
    within(
        STEP,
        "server/discover",
        client_config(tasks).serve_with_lifecycle(transport, lifecycle),
    )
    .await
    .expect("the client starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_over_streamable_http() {
    let (_server, url) = http_server().await;
    let tasks = http_client(&url, true).await;
    slow_call_becomes_a_task(&tasks, FIRST_CALL).await;
    endless_call_is_cancelled(&tasks).await;
    unknown_ids_are_invalid_params(&tasks).await;
    // A fresh client's call still works: with one worker, it would wait behind an
    // interpreter the cancel had left running.
    let plain = http_client(&url, false).await;
    client_without_tasks(&plain, STEP).await;
    plain.cancel().await.expect("the plain client closes");
    tasks.cancel().await.expect("the tasks client closes");
}

/// The binary over stdio, and a client of it (declaring `tasks` at `initialize` if `tasks`).
async fn stdio_client(tasks: bool) -> (Server, Client) {
    let mut server = Server::start("stdio", &[], Stdio::piped);
    let stdin = server.child.stdin.take().expect("the server's stdin");
    let stdout = server.child.stdout.take().expect("the server's stdout");
    let transport = (
        tokio::process::ChildStdout::from_std(stdout).expect("stdout, async"),
        tokio::process::ChildStdin::from_std(stdin).expect("stdin, async"),
    );
    let client = within(STEP, "initialize", client_config(tasks).serve(transport))
        .await
        .expect("the client initializes");
    (server, client)
}

/// A session declaring `tasks`: its slow call becomes a task, its endless one is cancelled, and
/// its next call gets a fresh interpreter.
async fn stdio_with_tasks() {
    let (_server, tasks) = stdio_client(true).await;
    slow_call_becomes_a_task(&tasks, FIRST_CALL).await;
    endless_call_is_cancelled(&tasks).await;
    // The next call may take long enough (booting the new interpreter) to become a task.
    let answer = within(
        STEP,
        "tools/call",
        tasks.call_tool_once(run_python("6 * 7")),
    )
    .await
    .expect("tools/call answers");
    let result = match answer {
        CallToolResponse::Complete(result) => result,
        CallToolResponse::Task(created) => {
            completed_result(poll_to_end(&tasks, &created.task.task_id, STEP).await)
        }
        other => panic!("expected a result or a task, got {other:?}"),
    };
    assert_eq!(
        text_of(&result),
        "<status>success</status>\n<return_value>\n42\n</return_value>"
    );
    unknown_ids_are_invalid_params(&tasks).await;
    tasks.cancel().await.expect("the tasks client closes");
}

/// A session that did not declare `tasks`.
async fn stdio_without_tasks() {
    let (_server, plain) = stdio_client(false).await;
    client_without_tasks(&plain, FIRST_CALL).await;
    plain.cancel().await.expect("the plain client closes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_over_stdio() {
    tokio::join!(stdio_with_tasks(), stdio_without_tasks());
}
