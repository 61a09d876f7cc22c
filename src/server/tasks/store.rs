//! Tasks saved in the shared state directory (`--state-dir`), so that any replica answers
//! `tasks/get` for a task whose replica is gone (README "Long runs: tasks").
//!
//! Layout, one directory per task, named by the SHA-256 of its id (the directory reveals no id:
//! without authentication an id is a bearer name):
//!
//! ```text
//! DIR/tasks/<sha256 of the task id, hex>/record.json   Record: owner, seed state, end
//! DIR/tasks/<…>/running                                locked (flock) while the task runs
//! ```
//!
//! **Is the task still running?** The replica that runs a task holds the `running` lock for
//! as long as the task runs; the kernel releases it when that process ends, however it ends.
//! A replica that reads a record with no end takes the lock without waiting: if it can, the
//! runner is gone and the task is reported `failed`, saying that nothing is known of its end;
//! if it cannot, the task is `working`.
//!
//! **Hostile input.** The directory is shared by replicas, one of which may be compromised: a
//! record is read up to [`MAX_RECORD_BYTES`], parsed into the typed [`Record`] (unknown fields
//! refused), and used only if it names the task asked for, is of the asking principal and has
//! not expired. Anything else is as if nothing were saved, and is logged without its content.
//! Errors here never reach a client: a task that cannot be saved is still served by the
//! replica that runs it, and the failure is logged.

use super::TaskId;
use crate::atomic_file::{self, Durability};
use crate::sandbox::live::Principal;
use crate::sandbox::state_dir::principal_digest;
use rmcp::model::{CallToolResult, DetailedTask, JsonObject, Task, TaskPayload, TaskStatus};
use rmcp::task_manager::TaskExit;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// The folder of the task records inside the state directory.
pub const TASKS_FOLDER: &str = "tasks";

/// A task's record file.
const RECORD_FILE: &str = "record.json";

/// The lock its runner holds while it runs.
const RUNNING_FILE: &str = "running";

/// The record format this build writes and reads.
const FORMAT: u32 = 1;

/// Largest record read (bytes): a result with its output, return value and images, each
/// capped by the call's own limits well below this.
const MAX_RECORD_BYTES: u64 = 64 << 20;

/// What a replica that is not the task's runner says of a task whose runner is gone.
pub const RUNNER_GONE: &str = "the replica that ran this task stopped before the task ended; nothing is known of its end (its code may or may not have finished)";

/// One task as saved.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Record {
    format: u32,
    /// SHA-256 (hex) of the owning principal's name; `None`: the server has no authentication.
    owner: Option<String>,
    /// The task's seed state, as `CreateTaskResult` gave it.
    task: Task,
    /// Its end; `None` while it runs.
    end: Option<End>,
}

/// How a saved task ended.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case", deny_unknown_fields)]
enum End {
    Completed { result: JsonObject },
    Failed { error: JsonObject },
    Cancelled,
}

/// The task records of one state directory.
pub struct TaskStore {
    root: PathBuf,
    /// How long after its creation a record is kept: the task's limit plus `--task-ttl`.
    keep: Duration,
    /// The `running` locks of the tasks this replica runs, held until each ends.
    running: Mutex<HashMap<TaskId, File>>,
}

/// The owner field of a record for `principal`: the digest the state directory keeps of every
/// owner.
fn owner_digest(principal: Option<&Principal>) -> Option<String> {
    principal_digest(principal.map(|p| p.0.as_str()))
}

impl TaskStore {
    /// The task records under `state_dir`, kept `keep` after each task's creation.
    ///
    /// Errors: the folder cannot be made.
    pub fn open(state_dir: &Path, keep: Duration) -> std::io::Result<TaskStore> {
        let root = state_dir.join(TASKS_FOLDER);
        std::fs::create_dir_all(&root)?;
        Ok(TaskStore {
            root,
            keep,
            running: Mutex::new(HashMap::new()),
        })
    }

    /// The directory of task `id`.
    fn dir_of(&self, id: &TaskId) -> PathBuf {
        self.root
            .join(hex::encode(Sha256::digest(id.as_str().as_bytes())))
    }

    /// Records task `id` (seed state `task`, owned by `owner`) as running on this replica, and
    /// takes its `running` lock until [`Self::finish`]. Also removes expired records.
    pub async fn start(&self, id: &TaskId, owner: Option<&Principal>, task: &Task) {
        let record = Record {
            format: FORMAT,
            owner: owner_digest(owner),
            task: task.clone(),
            end: None,
        };
        let dir = self.dir_of(id);
        let held = tokio::task::block_in_place(|| {
            std::fs::create_dir_all(&dir)?;
            let lock = File::create(dir.join(RUNNING_FILE))?;
            lock.lock()?;
            write_record(&dir, &record)?;
            self.sweep();
            Ok::<_, std::io::Error>(lock)
        });
        match held {
            Ok(lock) => {
                self.running_mut().insert(id.clone(), lock);
            }
            Err(e) => tracing::error!("task {}: could not save it: {e}", short(id)),
        }
    }

    /// Records the end of task `id` and lets go of its `running` lock.
    pub async fn finish(
        &self,
        id: &TaskId,
        owner: Option<&Principal>,
        end: &Result<CallToolResult, TaskExit>,
    ) {
        let end = match end {
            Ok(result) => End::Completed {
                result: to_object(result),
            },
            Err(TaskExit::Cancelled) => End::Cancelled,
            Err(TaskExit::Error(error)) => End::Failed {
                error: to_object(error),
            },
        };
        let dir = self.dir_of(id);
        let saved = tokio::task::block_in_place(|| {
            let mut record = read_record(&dir)?;
            if record.owner != owner_digest(owner) {
                return Err(std::io::Error::other("the record names another owner"));
            }
            record.end = Some(end);
            record.task.last_updated_at = rmcp::task_manager::current_timestamp();
            write_record(&dir, &record)
        });
        if let Err(e) = saved {
            tracing::error!("task {}: could not save its end: {e}", short(id));
        }
        self.running_mut().remove(id);
    }

    /// Task `id` as saved, for `principal`; `None` when nothing usable is saved for them.
    pub async fn load(&self, id: &TaskId, principal: Option<&Principal>) -> Option<DetailedTask> {
        let dir = self.dir_of(id);
        let record = tokio::task::block_in_place(|| read_record(&dir));
        let record = match record {
            Ok(record) => record,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::warn!("task {}: its saved record is refused: {e}", short(id));
                return None;
            }
        };
        if record.format != FORMAT
            || record.task.task_id != id.as_str()
            || record.owner != owner_digest(principal)
        {
            return None;
        }
        let payload = match record.end {
            Some(End::Completed { result }) => TaskPayload::Completed { result },
            Some(End::Failed { error }) => TaskPayload::Failed { error },
            Some(End::Cancelled) => TaskPayload::Cancelled,
            None if tokio::task::block_in_place(|| runner_is_gone(&dir)) => TaskPayload::Failed {
                error: runner_gone(),
            },
            None => TaskPayload::Working,
        };
        let mut task = record.task;
        task.status = TaskStatus::Working;
        Some(DetailedTask::new(task, payload))
    }

    /// Removes the records older than [`Self::keep`] whose task no replica runs.
    fn sweep(&self) {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return;
        };
        let now = SystemTime::now();
        for entry in entries.flatten() {
            let dir = entry.path();
            let age = std::fs::metadata(dir.join(RECORD_FILE))
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| now.duration_since(t).ok());
            if age.is_some_and(|age| age > self.keep) && runner_is_gone(&dir) {
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
    }

    /// The running locks, whatever a panicking holder left.
    fn running_mut(&self) -> std::sync::MutexGuard<'_, HashMap<TaskId, File>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Whether no replica holds `dir`'s `running` lock (its runner ended, however it ended).
fn runner_is_gone(dir: &Path) -> bool {
    let Ok(file) = File::options().write(true).open(dir.join(RUNNING_FILE)) else {
        return true;
    };
    match file.try_lock() {
        Ok(()) => {
            let _ = file.unlock();
            true
        }
        Err(_) => false,
    }
}

/// The `error` of a task whose runner is gone.
fn runner_gone() -> JsonObject {
    let error = rmcp::ErrorData::internal_error(RUNNER_GONE, None);
    to_object(&error)
}

/// `value` as a JSON object (an empty one if it is not one).
fn to_object(value: &impl Serialize) -> JsonObject {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::Object(object)) => object,
        _ => JsonObject::new(),
    }
}

/// `dir`'s record, read up to [`MAX_RECORD_BYTES`].
///
/// Errors: it cannot be read, or is not a [`Record`] (too long, malformed, unknown fields).
fn read_record(dir: &Path) -> std::io::Result<Record> {
    let mut text = Vec::new();
    File::open(dir.join(RECORD_FILE))?
        .take(MAX_RECORD_BYTES)
        .read_to_end(&mut text)?;
    serde_json::from_slice(&text).map_err(std::io::Error::other)
}

/// Writes `record` into `dir` whole: a temporary file, flushed, renamed over the old one.
fn write_record(dir: &Path, record: &Record) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(record).map_err(std::io::Error::other)?;
    let tag = std::process::id().to_string();
    atomic_file::replace(&dir.join(RECORD_FILE), &tag, Durability::Synced, &bytes)
        .map_err(std::io::Error::other)
}

/// The first characters of task `id`, for logs (the id itself is a bearer name).
fn short(id: &TaskId) -> &str {
    id.as_str().get(..12).unwrap_or(id.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed(id: &TaskId) -> Task {
        Task::new(id.as_str(), TaskStatus::Working, "t0", "t0")
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_saved_task_is_read_back_by_its_owner_only() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = TaskStore::open(dir.path(), Duration::from_secs(60)).expect("open");
        let id = TaskId::mint().expect("id");
        let alice = Principal("alice".into());
        store.start(&id, Some(&alice), &seed(&id)).await;
        let Some(task) = store.load(&id, Some(&alice)).await else {
            panic!("saved");
        };
        // This replica still holds the running lock: the task is working.
        assert_eq!(task.status(), TaskStatus::Working);
        assert!(store.load(&id, None).await.is_none());
        assert!(store
            .load(&id, Some(&Principal("bob".into())))
            .await
            .is_none());
        let done = Ok(CallToolResult::success(vec![]));
        store.finish(&id, Some(&alice), &done).await;
        let Some(task) = store.load(&id, Some(&alice)).await else {
            panic!("saved");
        };
        assert_eq!(task.status(), TaskStatus::Completed);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_task_whose_runner_is_gone_has_failed_and_a_forged_record_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = TaskStore::open(dir.path(), Duration::from_secs(60)).expect("open");
        let id = TaskId::mint().expect("id");
        store.start(&id, None, &seed(&id)).await;
        // The runner's lock goes as its process would.
        store.running_mut().clear();
        let Some(task) = store.load(&id, None).await else {
            panic!("saved");
        };
        assert_eq!(task.status(), TaskStatus::Failed);
        // A record under another task's name is refused.
        let other = TaskId::mint().expect("id");
        let forged = dir
            .path()
            .join(TASKS_FOLDER)
            .join(hex::encode(Sha256::digest(other.as_str())));
        std::fs::create_dir_all(&forged).expect("dir");
        std::fs::copy(
            store.dir_of(&id).join(RECORD_FILE),
            forged.join(RECORD_FILE),
        )
        .expect("copy");
        assert!(store.load(&other, None).await.is_none());
        std::fs::write(forged.join(RECORD_FILE), b"{\"format\":1,\"evil\":1}").expect("write");
        assert!(store.load(&other, None).await.is_none());
    }
}
