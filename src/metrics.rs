//! Metrics in the Prometheus text format (README "Running many replicas"), through the `metrics` facade and
//! `metrics-exporter-prometheus`: every metric is named here, once, with its unit in its name
//! (Prometheus naming: `_total` for counters, `_seconds` for durations), and every label value
//! is one of a fixed set: nothing a client or user code sends becomes a label (a tool name a
//! client made up is counted as `other`).
//!
//! Counters and histograms are recorded where things happen; the gauges (workers,
//! queue depth, live sandboxes and sessions) are read at each scrape ([`Gauges`]), so they
//! cannot drift. Without an installed recorder (stdio, `warmup`) every call here is a no-op.

use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::time::Duration;

/// `tools/call` requests answered, by `tool` and `status`: for `run_python_code`, how its run
/// ended, from its outcome (`success`, `run-error`, `timeout`, `memory`, `refused`,
/// `worker-failed`, `install-error`); `success` or `error` for the other tools; `invalid` for
/// arguments refused with an MCP error. A call answered with a task (SEP-2663) is counted
/// when its run ends.
const TOOL_CALLS: &str = "mcp_run_python_tool_calls_total";
/// `tools/call` requests answered with a task (SEP-2663), by `tool`.
const TASKS: &str = "mcp_run_python_tasks_total";
/// Seconds from a `tools/call`'s arrival to its answer, by `tool`.
const TOOL_CALL_DURATION: &str = "mcp_run_python_tool_call_duration_seconds";
/// Workers by `state` (the metric's name says interpreters): `booting`, `spare` (ready,
/// unused), `idle` (a sandbox's, between calls), `busy` (running a call).
const INTERPRETERS: &str = "mcp_run_python_interpreters";
/// Calls waiting for a worker (`--max-queue` bounds it).
const QUEUE_DEPTH: &str = "mcp_run_python_queue_depth";
/// Seconds a call waited for its sandbox's worker and a running slot.
const QUEUE_WAIT: &str = "mcp_run_python_queue_wait_seconds";
/// Live sandboxes (sessions' own included).
const SANDBOXES: &str = "mcp_run_python_sandboxes";
/// Live protocol sessions.
const SESSIONS: &str = "mcp_run_python_sessions";
/// Sandboxes hibernating: their state on disk, no worker (`--hibernate-after`).
const HIBERNATED: &str = "mcp_run_python_sandboxes_hibernated";
/// Bytes of hibernated state on disk (`--max-hibernated-bytes` bounds it).
const HIBERNATED_BYTES: &str = "mcp_run_python_hibernated_bytes";
/// Sandboxes that hibernated (idle past `--hibernate-after`, or to make room at the cap).
const HIBERNATIONS: &str = "mcp_run_python_hibernations_total";
/// Workers the server stopped, by `reason`.
const WORKERS_KILLED: &str = "mcp_run_python_workers_killed_total";
/// Package installs into an interpreter, by `result` (`ok`, `error`).
const INSTALLS: &str = "mcp_run_python_package_installs_total";
/// Package files served from the download cache without network I/O.
const CACHE_HITS: &str = "mcp_run_python_package_cache_hits_total";
/// Package files downloaded because the cache did not have them.
const CACHE_MISSES: &str = "mcp_run_python_package_cache_misses_total";
/// Sandboxes restored from `--state-dir` after their replica stopped or drained.
const RESTORED: &str = "mcp_run_python_sandboxes_restored_total";
/// Forks (`fork_sandbox`), by how the copy got its interpreter state (`interpreter`:
/// `handed_over`, the source's interpreter; `restored`, restored at its first call; `none`,
/// the source had no state).
const FORKS: &str = "mcp_run_python_sandbox_forks_total";
/// Saves of sandboxes to `--state-dir`, by `result` (`ok`, `superseded`, `error`).
const STATE_SAVES: &str = "mcp_run_python_state_saves_total";

/// User code's HTTP requests through the front (`--allow-net`), by `allowed` (the `--allow-net`
/// entry that admitted the URL, as the operator wrote it; `none` when none did) and `outcome`
/// ([`EgressOutcome`]).
const EGRESS_REQUESTS: &str = "mcp_run_python_egress_requests_total";
/// Bytes user code's HTTP requests moved, by `allowed` and `direction` (`sent`: request bodies;
/// `received`: response bodies handed to the sandbox).
const EGRESS_BYTES: &str = "mcp_run_python_egress_bytes_total";

/// Histogram buckets for durations (seconds): from a warm call (~1 ms) to the longest
/// timeouts.
const DURATION_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0, 300.0,
];

/// Installs the Prometheus recorder for this process and returns the handle that renders it.
///
/// Errors: a recorder was installed already, or the buckets are refused.
pub fn install() -> anyhow::Result<PrometheusHandle> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &DURATION_BUCKETS)?
        .install_recorder()?;
    describe();
    Ok(handle)
}

/// The `# HELP` lines.
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        TOOL_CALLS,
        "tools/call requests answered, by tool and status"
    );
    describe_counter!(TASKS, "tools/call requests answered with a task, by tool");
    describe_histogram!(
        TOOL_CALL_DURATION,
        Unit::Seconds,
        "time from a tools/call's arrival to its answer"
    );
    describe_gauge!(INTERPRETERS, "interpreters by state");
    describe_gauge!(QUEUE_DEPTH, "calls waiting for an interpreter");
    describe_histogram!(
        QUEUE_WAIT,
        Unit::Seconds,
        "time a call waited for its interpreter"
    );
    describe_gauge!(SANDBOXES, "live sandboxes");
    describe_gauge!(SESSIONS, "live protocol sessions");
    describe_gauge!(HIBERNATED, "sandboxes hibernating, their state on disk");
    describe_gauge!(
        HIBERNATED_BYTES,
        Unit::Bytes,
        "bytes of hibernated state on disk"
    );
    describe_counter!(HIBERNATIONS, "sandboxes that hibernated");
    describe_counter!(
        WORKERS_KILLED,
        "interpreters stopped by the server, by reason"
    );
    describe_counter!(INSTALLS, "package installs into an interpreter, by result");
    describe_counter!(CACHE_HITS, "package files served from the download cache");
    describe_counter!(CACHE_MISSES, "package files downloaded");
    describe_counter!(RESTORED, "sandboxes restored from the state directory");
    describe_counter!(STATE_SAVES, "saves to the state directory, by result");
    describe_counter!(
        EGRESS_REQUESTS,
        "user code's HTTP requests through the server, by allow-list entry and outcome"
    );
    describe_counter!(
        EGRESS_BYTES,
        Unit::Bytes,
        "bytes of user code's HTTP requests and responses, by allow-list entry and direction"
    );
    describe_counter!(
        FORKS,
        "forks, by how the copy got its interpreter state (handed_over, restored, none)"
    );
}

/// A `tools/call` answered.
pub fn tool_call(tool: &'static str, status: &'static str, took: Duration) {
    counter!(TOOL_CALLS, "tool" => tool, "status" => status).increment(1);
    histogram!(TOOL_CALL_DURATION, "tool" => tool).record(took.as_secs_f64());
}

/// A `tools/call` of `tool` was answered with a task.
pub fn task_made(tool: &'static str) {
    counter!(TASKS, "tool" => tool).increment(1);
}

/// A call had its turn after waiting `waited`.
pub fn queue_wait(waited: Duration) {
    histogram!(QUEUE_WAIT).record(waited.as_secs_f64());
}

/// Why the server stopped a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillReason {
    /// The call's deadline (`--timeout`).
    Timeout,
    /// The install deadline (`--install-timeout`).
    InstallTimeout,
    /// Over `--memory`, or too close to it to serve another call.
    Memory,
    /// Output past the cap.
    Output,
    /// The worker broke the protocol.
    Protocol,
    /// The worker died or failed otherwise.
    Failed,
    /// The interpreter ended in a way it cannot serve another call from (`SystemExit`, a
    /// fatal error).
    Fatal,
    /// The client cancelled the call, or its sandbox ended while it ran.
    Cancelled,
}

impl KillReason {
    fn label(self) -> &'static str {
        match self {
            KillReason::Timeout => "timeout",
            KillReason::InstallTimeout => "install_timeout",
            KillReason::Memory => "memory",
            KillReason::Output => "output",
            KillReason::Protocol => "protocol",
            KillReason::Failed => "failed",
            KillReason::Fatal => "fatal",
            KillReason::Cancelled => "cancelled",
        }
    }
}

/// The server stopped a worker.
pub fn worker_killed(reason: KillReason) {
    counter!(WORKERS_KILLED, "reason" => reason.label()).increment(1);
}

/// Packages were installed into an interpreter (`ok`), or the install failed.
pub fn install_finished(ok: bool) {
    counter!(INSTALLS, "result" => if ok { "ok" } else { "error" }).increment(1);
}

/// A package file came from the download cache (`hit`) or the network.
pub fn package_file(hit: bool) {
    if hit {
        counter!(CACHE_HITS).increment(1);
    } else {
        counter!(CACHE_MISSES).increment(1);
    }
}

/// A sandbox hibernated.
pub fn sandbox_hibernated() {
    counter!(HIBERNATIONS).increment(1);
}

/// A sandbox was restored from the state directory.
pub fn sandbox_restored() {
    counter!(RESTORED).increment(1);
}

/// How a fork's copy got its interpreter state ([`sandbox_forked`]).
#[derive(Debug, Clone, Copy)]
pub enum ForkKind {
    /// It took the source's interpreter.
    HandedOver,
    /// Its first call restores the state into a new interpreter.
    Restored,
    /// The source had no state: files and dependencies only.
    NoState,
}

/// A sandbox was forked.
pub fn sandbox_forked(kind: ForkKind) {
    let label = match kind {
        ForkKind::HandedOver => "handed_over",
        ForkKind::Restored => "restored",
        ForkKind::NoState => "none",
    };
    counter!(FORKS, "interpreter" => label).increment(1);
}

/// The result of a save to the state directory.
#[derive(Debug, Clone, Copy)]
pub enum SaveResult {
    Ok,
    /// Another replica took the sandbox over.
    Superseded,
    Error,
}

/// A save to the state directory ended.
pub fn state_saved(result: SaveResult) {
    let label = match result {
        SaveResult::Ok => "ok",
        SaveResult::Superseded => "superseded",
        SaveResult::Error => "error",
    };
    counter!(STATE_SAVES, "result" => label).increment(1);
}

/// The gauges, read at each scrape.
#[derive(Debug, Clone, Copy, Default)]
pub struct Gauges {
    pub booting: usize,
    pub spare: usize,
    pub idle: usize,
    pub busy: usize,
    pub queue_depth: usize,
    pub sandboxes: usize,
    pub hibernated: usize,
    pub hibernated_bytes: u64,
    pub sessions: usize,
}

/// Sets the gauges to `now`.
pub fn set_gauges(now: Gauges) {
    for (state, n) in [
        ("booting", now.booting),
        ("spare", now.spare),
        ("idle", now.idle),
        ("busy", now.busy),
    ] {
        gauge!(INTERPRETERS, "state" => state).set(n as f64);
    }
    gauge!(QUEUE_DEPTH).set(now.queue_depth as f64);
    gauge!(SANDBOXES).set(now.sandboxes as f64);
    gauge!(HIBERNATED).set(now.hibernated as f64);
    gauge!(HIBERNATED_BYTES).set(now.hibernated_bytes as f64);
    gauge!(SESSIONS).set(now.sessions as f64);
}

/// How a request of user code through the front ended ([`egress`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EgressOutcome {
    /// A response came (whatever its status).
    Ok,
    /// Its host and port are not in `--allow-net`.
    NotAllowed,
    /// Its name resolved only to special addresses `--allow-net` does not name.
    AddressRefused,
    /// A body over `--max-fetch-bytes`.
    TooLarge,
    /// Longer than `--fetch-timeout`.
    Timeout,
    /// Past `--max-fetches-per-call`.
    TooMany,
    /// A URL, method or header the front refuses.
    Refused,
    /// Connecting, TLS, sending or reading failed.
    Failed,
}

impl EgressOutcome {
    fn label(self) -> &'static str {
        match self {
            EgressOutcome::Ok => "ok",
            EgressOutcome::NotAllowed => "not_allowed",
            EgressOutcome::AddressRefused => "address_refused",
            EgressOutcome::TooLarge => "too_large",
            EgressOutcome::Timeout => "timeout",
            EgressOutcome::TooMany => "too_many",
            EgressOutcome::Refused => "refused",
            EgressOutcome::Failed => "failed",
        }
    }
}

/// A request of user code ended as `outcome`, admitted by the `--allow-net` entry `allowed`
/// (`None`: by none), having sent `sent` and received `received` body bytes.
pub fn egress(allowed: Option<&str>, outcome: EgressOutcome, sent: usize, received: usize) {
    let allowed = allowed.unwrap_or("none").to_owned();
    let outcome = outcome.label();
    counter!(EGRESS_REQUESTS, "allowed" => allowed.clone(), "outcome" => outcome).increment(1);
    counter!(EGRESS_BYTES, "allowed" => allowed.clone(), "direction" => "sent")
        .increment(sent as u64);
    counter!(EGRESS_BYTES, "allowed" => allowed, "direction" => "received")
        .increment(received as u64);
}
