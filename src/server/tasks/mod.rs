//! Long runs as tasks: the MCP tasks extension (`io.modelcontextprotocol/tasks`, SEP-2663;
//! repository `modelcontextprotocol/ext-tasks`, `specification/draft/tasks.md`).
//!
//! Task creation is server-directed. A `tools/call` of `run_python_code` or `create_sandbox`
//! whose client declared the extension (in the request's `_meta` client capabilities, or at
//! `initialize`) runs under `--task-timeout` rather than `--timeout`. If it answers within
//! [`TASK_AFTER`] the client gets the result at once (the spec's immediate-result shortcut);
//! otherwise it goes on as a task and the client gets `resultType: "task"` with the task's id,
//! then polls `tasks/get`. `tasks/cancel` stops the interpreter, as `notifications/cancelled`
//! does for a plain call. Every other client's calls run as before, and rmcp answers its
//! `tasks/*` with -32021.
//!
//! rmcp's [`TaskManager`] runs the tasks, keeps their state and sweeps them after their TTL.
//! This module adds what a multi-tenant server needs around it:
//! - **Public ids** ([`TaskId`]): minted before the call runs, so that the HTTP front can name
//!   the task in the `Task-Id` response header, from which a load balancer learns where the
//!   task's `tasks/get` must go (`deploy/haproxy.cfg`); rmcp's own ids stay inside.
//! - **Owners**: a task belongs to the principal that made it; anyone else's `tasks/*` gets
//!   the same words as for a task that does not exist ([`unknown_task`]).
//! - **Saving** ([`store`], with `--state-dir`): a task is recorded when it starts and its end
//!   when it ends, so that any replica answers `tasks/get` after the one that ran it is gone.

pub mod store;

use crate::sandbox::activity::InFlight;
use crate::sandbox::live::Principal;
use rmcp::model::{
    CallToolResponse, CallToolResult, CancelTaskParams, ClientCapabilities, CreateTaskResult,
    DetailedTask, GetTaskParams, UpdateTaskParams,
};
use rmcp::task_manager::{TaskExit, TaskManager, TaskOptions};
use rmcp::ErrorData as McpError;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use store::TaskStore;

/// How long a task-eligible call may run before it becomes a task: shorter calls answer as
/// plain results, so a client that declares the extension pays no polling for quick code.
pub const TASK_AFTER: Duration = Duration::from_secs(1);

/// The polling interval suggested to clients (`pollIntervalMs`), in milliseconds.
pub const POLL_INTERVAL_MS: u64 = 500;

/// The tools whose calls may become tasks: those that can run for minutes (code, and a
/// sandbox's dependencies being installed).
pub const TASK_TOOLS: [&str; 2] = ["run_python_code", "create_sandbox"];

/// Whether a call of tool `tool` from a client with `capabilities` may become a task: a tool
/// of [`TASK_TOOLS`], and a client that declared the extension (SEP-2663: a server MUST NOT
/// answer a task to any other).
pub fn may_become_task(tool: &str, capabilities: Option<ClientCapabilities>) -> bool {
    TASK_TOOLS.contains(&tool) && capabilities.is_some_and(|c| c.supports_tasks())
}

/// A task's public id: `task_` and 32 hex digits (128 random bits), a bearer name like a
/// sandbox handle when the server has no authentication.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TaskId(String);

/// The prefix of every [`TaskId`].
const TASK_ID_PREFIX: &str = "task_";

/// Random bytes in a [`TaskId`].
const TASK_ID_BYTES: usize = 16;

impl TaskId {
    /// A new random id.
    ///
    /// Errors: the system's random source failed.
    pub fn mint() -> Result<TaskId, getrandom::Error> {
        let mut bytes = [0u8; TASK_ID_BYTES];
        getrandom::fill(&mut bytes)?;
        Ok(TaskId(format!("{TASK_ID_PREFIX}{}", hex::encode(bytes))))
    }

    /// `text` as a task id, if it has the form of one (checked before it names a file).
    pub fn parse(text: &str) -> Option<TaskId> {
        let digits = text.strip_prefix(TASK_ID_PREFIX)?;
        (digits.len() == 2 * TASK_ID_BYTES && digits.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| TaskId(text.to_owned()))
    }

    /// The id as clients see it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The id the HTTP front minted for a `tools/call` that may become a task (and named in the
/// `Task-Id` response header); in the request's extensions.
#[derive(Debug, Clone)]
pub struct MintedTask(pub TaskId);

/// The limit of a call's code that replaces `--timeout` (a task-eligible call:
/// `--task-timeout`); `None` inside: no limit. In the call's `RequestContext` extensions.
#[derive(Debug, Clone, Copy)]
pub struct CallTimeout(pub Option<Duration>);

/// The task options: `--task-timeout`, `--task-ttl`.
#[derive(Debug, Clone, Copy)]
pub struct TaskLimits {
    /// The limit of a task's code; `None`: none.
    pub timeout: Option<Duration>,
    /// How long a finished task's result is kept.
    pub ttl: Duration,
    /// Most tasks kept at once (`--max-tasks`).
    pub max: usize,
}

/// A task this replica runs or ran, as its public id knows it.
struct Known {
    /// rmcp's id of it, in [`Tasks::manager`].
    inner: String,
    /// The principal that made it.
    owner: Option<Principal>,
    /// Held until its client has read its end (or cancelled it): a draining replica waits for
    /// it (up to `--drain-timeout`), so that a result finished during the drain is not lost
    /// with the replica.
    unread: Option<InFlight>,
}

/// The server's tasks.
pub struct Tasks {
    manager: TaskManager,
    known: Mutex<HashMap<TaskId, Known>>,
    pub limits: TaskLimits,
    store: Option<Arc<TaskStore>>,
}

/// The error for a task id that is not known to `principal`: the same words whether it never
/// existed, has expired or belongs to someone else (SEP-2663, protocol errors: -32602).
pub fn unknown_task(id: &str) -> McpError {
    McpError::invalid_params(
        format!("no task {id:?}: it does not exist, or it expired, or it is not yours"),
        None,
    )
}

/// The error for a `tasks/*` request whose params rmcp could not read (it hands such a request
/// on as a custom one): `invalid_params` with what is wrong, rather than "method not found" for
/// a method the server has. `None` for any other method.
pub fn malformed(method: &str, params: Option<serde_json::Value>) -> Option<McpError> {
    let params = params.unwrap_or(serde_json::Value::Null);
    let why = match method {
        "tasks/get" => serde_json::from_value::<GetTaskParams>(params).err(),
        "tasks/update" => serde_json::from_value::<UpdateTaskParams>(params).err(),
        "tasks/cancel" => serde_json::from_value::<CancelTaskParams>(params).err(),
        _ => return None,
    };
    let why = why.map_or_else(|| "they could not be read".to_owned(), |e| e.to_string());
    Some(McpError::invalid_params(
        format!("malformed {method} params: {why}"),
        None,
    ))
}

impl Tasks {
    /// The tasks of a server with `limits`, saved in `store` (`--state-dir`) when given.
    pub fn new(limits: TaskLimits, store: Option<Arc<TaskStore>>) -> Tasks {
        Tasks {
            manager: TaskManager::new(),
            known: Mutex::new(HashMap::new()),
            limits,
            store,
        }
    }

    /// The `ttlMs` a new task is given: its limit plus how long its result is kept (`None`,
    /// unlimited, for a task without a limit: rmcp would fail it at its TTL).
    fn ttl_ms(&self) -> Option<u64> {
        let limit = self.limits.timeout?;
        Some((limit + self.limits.ttl).as_millis() as u64)
    }

    /// Waits for `run` (a call already running) up to [`TASK_AFTER`]: its answer if it came,
    /// else a task for it under `id`, owned by `owner`. `cancel` stops the run (the client's
    /// `notifications/cancelled` before the task exists, `tasks/cancel` after).
    ///
    /// Errors: the call's own error when it answered in time with one.
    pub async fn answer_or_task(
        &self,
        id: TaskId,
        owner: Option<Principal>,
        mut run: tokio::task::JoinHandle<Result<CallToolResponse, McpError>>,
        cancel: tokio_util::sync::CancellationToken,
        unread: InFlight,
    ) -> Result<CallToolResponse, McpError> {
        match tokio::time::timeout(TASK_AFTER, &mut run).await {
            Ok(answer) => return answer.map_err(failed_run)?,
            Err(_elapsed) => {}
        }
        self.sweep();
        if self.known_mut().len() >= self.limits.max {
            // No room for another task: the call runs to its end as a plain call, as it would
            // for a client without the extension.
            tracing::warn!(
                "{} tasks are kept (--max-tasks): a long call runs as a plain call",
                self.limits.max
            );
            return run.await.map_err(failed_run)?;
        }
        let options = TaskOptions::new()
            .with_ttl_ms(self.ttl_ms())
            .with_poll_interval_ms(POLL_INTERVAL_MS);
        let store = self.store.clone();
        let saved_as = id.clone();
        let saved_owner = owner.clone();
        let mut task = self.manager.spawn(options, move |context| {
            Box::pin(async move {
                let end = tokio::select! {
                    answer = &mut run => settle(answer),
                    _ = context.cancelled() => {
                        cancel.cancel();
                        let _ = run.await;
                        Err(TaskExit::Cancelled)
                    }
                };
                if let Some(store) = store {
                    store.finish(&saved_as, saved_owner.as_ref(), &end).await;
                }
                end
            })
        });
        let inner = std::mem::replace(&mut task.task_id, id.as_str().to_owned());
        if let Some(store) = &self.store {
            store.start(&id, owner.as_ref(), &task).await;
        }
        let known = Known {
            inner,
            owner,
            unread: Some(unread),
        };
        self.known_mut().insert(id, known);
        Ok(CallToolResponse::Task(CreateTaskResult::new(task)))
    }

    /// `tasks/get`: the task `id` as `principal` may see it, from this replica or, with
    /// `--state-dir`, as saved by the replica that ran it.
    ///
    /// Errors: [`unknown_task`].
    pub async fn get(
        &self,
        id: &str,
        principal: Option<&Principal>,
    ) -> Result<DetailedTask, McpError> {
        match self.inner_id(id, principal) {
            Some(inner) => {
                let mut task = self
                    .manager
                    .get_task(&inner)
                    .map_err(|_| unknown_task(id))?;
                task.task.task_id = id.to_owned();
                if task.status().is_terminal() {
                    self.read(id);
                }
                Ok(task)
            }
            None => self.saved(id, principal).await,
        }
    }

    /// `tasks/cancel`: asks the task `id` to stop (its interpreter is killed). A task that has
    /// ended is acknowledged again (the suite's `tasks-cancel-terminal-idempotent-ack`).
    ///
    /// Errors: [`unknown_task`]; a task run by a replica that is gone cannot be stopped from
    /// here (`invalid_params` saying so).
    pub async fn cancel(&self, id: &str, principal: Option<&Principal>) -> Result<(), McpError> {
        match self.inner_id(id, principal) {
            Some(inner) => {
                self.manager
                    .cancel_task(&inner)
                    .map_err(|_| unknown_task(id))?;
                // The client has said it no longer waits for the end.
                self.read(id);
                Ok(())
            }
            None => match self.saved(id, principal).await?.status() {
                status if status.is_terminal() => Ok(()),
                _ => Err(McpError::invalid_params(
                    format!("task {id:?} runs on another replica; cancel it there"),
                    None,
                )),
            },
        }
    }

    /// `tasks/update`: our tasks never ask for input, so there is nothing to deliver; the
    /// update is acknowledged for a task `principal` may see (the spec ignores unknown keys).
    ///
    /// Errors: [`unknown_task`].
    pub async fn update(&self, id: &str, principal: Option<&Principal>) -> Result<(), McpError> {
        self.get(id, principal).await.map(|_| ())
    }

    /// rmcp's id of task `id`, when this replica has it and `principal` owns it.
    fn inner_id(&self, id: &str, principal: Option<&Principal>) -> Option<String> {
        let id = TaskId::parse(id)?;
        let known = self.known_mut();
        let entry = known.get(&id)?;
        (entry.owner.as_ref() == principal).then(|| entry.inner.clone())
    }

    /// Task `id` as saved in the state directory, for `principal`.
    ///
    /// Errors: [`unknown_task`] without a state directory, or when nothing (readable, of this
    /// principal, unexpired) is saved under it.
    async fn saved(
        &self,
        id: &str,
        principal: Option<&Principal>,
    ) -> Result<DetailedTask, McpError> {
        let (Some(store), Some(task_id)) = (&self.store, TaskId::parse(id)) else {
            return Err(unknown_task(id));
        };
        store
            .load(&task_id, principal)
            .await
            .ok_or_else(|| unknown_task(id))
    }

    /// Notes that the client of task `id` has what it waited for (its end, or its cancel).
    fn read(&self, id: &str) {
        let Some(id) = TaskId::parse(id) else {
            return;
        };
        if let Some(known) = self.known_mut().get_mut(&id) {
            known.unread = None;
        }
    }

    /// The id map, whatever a panicking holder left.
    fn known_mut(&self) -> std::sync::MutexGuard<'_, HashMap<TaskId, Known>> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forgets the ids of tasks rmcp has swept (past their TTL), so the map does not grow
    /// without bound.
    fn sweep(&self) {
        let mut known = self.known_mut();
        known.retain(|_, k| self.manager.get_task(&k.inner).is_ok());
    }
}

/// A task's end as rmcp records it, from the call's answer.
fn settle(
    answer: Result<Result<CallToolResponse, McpError>, tokio::task::JoinError>,
) -> Result<CallToolResult, TaskExit> {
    match answer {
        Ok(Ok(CallToolResponse::Complete(result))) => Ok(result),
        Ok(Ok(_)) => Err(TaskExit::Error(McpError::internal_error(
            "the call answered with something other than a result",
            None,
        ))),
        Ok(Err(error)) => Err(TaskExit::Error(error)),
        Err(join) => Err(TaskExit::Error(failed_run(join))),
    }
}

/// The error for a call whose own task failed (it panicked, or the server is stopping).
fn failed_run(join: tokio::task::JoinError) -> McpError {
    McpError::internal_error(format!("the call failed: {join}"), None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_ids_are_checked_before_use() {
        let id = TaskId::mint().expect("random");
        assert_eq!(TaskId::parse(id.as_str()), Some(id.clone()));
        assert!(id.as_str().starts_with("task_"));
        for bad in ["", "task_", "task_zz", "../../etc/passwd", "sbx_00"] {
            assert_eq!(TaskId::parse(bad), None, "{bad}");
        }
        let long = format!("task_{}", "a".repeat(33));
        assert_eq!(TaskId::parse(&long), None);
    }
}
