//! Starting workers fast: a Pyodide memory snapshot taken after the first plain boot is kept in
//! the cache directory and restored by later workers, which then skip Python's start-up.

use super::worker::{SandboxReport, Worker, WorkerError};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// How long a stored snapshot may go unrestored before the next snapshot stored beside it
/// removes it (seven days). A snapshot's name is the digest of the binary and Pyodide that made
/// it, so after an upgrade the old one is never restored again: 30 MiB left for ever.
/// Restoring one refreshes its modification time, so a binary still in use keeps its own.
const STALE_SNAPSHOT_AGE: Duration = Duration::from_secs(7 * 24 * 3600);

/// Starts workers, from a snapshot when one is known to work.
pub struct Launcher {
    exe: PathBuf,
    args: Vec<String>,
    store: Option<SnapshotStore>,
    /// The last confinement report of a worker, logged whenever it changes.
    sandbox: Mutex<Option<SandboxReport>>,
}

struct SnapshotStore {
    path: PathBuf,
    bytes: Mutex<Option<Arc<Vec<u8>>>>,
}

impl SnapshotStore {
    fn load(&self) -> Option<Arc<Vec<u8>>> {
        let mut bytes = self.bytes.lock().unwrap_or_else(|p| p.into_inner());
        if bytes.is_none() {
            *bytes = std::fs::read(&self.path).ok().map(Arc::new);
            if bytes.is_some() {
                // In use: keep it from being pruned as stale.
                let touched = std::fs::File::options()
                    .write(true)
                    .open(&self.path)
                    .and_then(|f| f.set_modified(SystemTime::now()));
                if let Err(e) = touched {
                    tracing::debug!("cannot refresh {}: {e}", self.path.display());
                }
            }
        }
        bytes.clone()
    }

    fn save(&self, snapshot: Vec<u8>) {
        let snapshot = Arc::new(snapshot);
        if let Some(dir) = self.path.parent() {
            let tmp = self
                .path
                .with_extension(format!("tmp{}", std::process::id()));
            let written = std::fs::create_dir_all(dir)
                .and_then(|_| std::fs::write(&tmp, snapshot.as_slice()))
                .and_then(|_| std::fs::rename(&tmp, &self.path));
            match written {
                Ok(()) => prune_stale(dir, &self.path),
                Err(e) => tracing::warn!(
                    "cannot store the memory snapshot in {}: {e}",
                    self.path.display()
                ),
            }
        }
        *self.bytes.lock().unwrap_or_else(|p| p.into_inner()) = Some(snapshot);
    }

    fn discard(&self) {
        let _ = std::fs::remove_file(&self.path);
        *self.bytes.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

/// Removes the snapshots (and leftover temporary files) in `dir` other than `keep` that were
/// not restored or written for [`STALE_SNAPSHOT_AGE`].
fn prune_stale(dir: &Path, keep: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let now = SystemTime::now();
    for entry in entries.flatten() {
        let path = entry.path();
        let ours = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("pyodide-"));
        let age = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| now.duration_since(t).ok());
        if ours && path != keep && age.is_some_and(|a| a > STALE_SNAPSHOT_AGE) {
            match std::fs::remove_file(&path) {
                Ok(()) => tracing::info!("removed a stale memory snapshot: {}", path.display()),
                Err(e) => tracing::debug!("cannot remove {}: {e}", path.display()),
            }
        }
    }
}

impl Launcher {
    /// Workers run `exe __worker <args>`; with `snapshot_path`, snapshots are kept there.
    pub fn new(exe: PathBuf, args: Vec<String>, snapshot_path: Option<PathBuf>) -> Self {
        Launcher {
            exe,
            args,
            store: snapshot_path.map(|path| SnapshotStore {
                path,
                bytes: Mutex::new(None),
            }),
            sandbox: Mutex::new(None),
        }
    }

    /// The confinement report of the last worker booted (`None` before the first).
    pub fn sandbox_report(&self) -> Option<SandboxReport> {
        self.sandbox
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Logs `worker`'s confinement when it differs from the last one logged: at start-up,
    /// and should the kernel's answer change (a warning whenever a layer is off).
    fn note(&self, worker: Worker) -> Worker {
        let mut last = self.sandbox.lock().unwrap_or_else(|p| p.into_inner());
        if last.as_ref() != Some(&worker.sandbox) {
            if worker.sandbox.confined {
                tracing::info!("{}", worker.sandbox.line);
            } else {
                tracing::warn!("{}", worker.sandbox.line);
            }
            *last = Some(worker.sandbox.clone());
        }
        worker
    }

    /// Boots one worker: from the snapshot if there is one (a snapshot that fails is deleted
    /// and a plain boot follows), else plainly, making the snapshot for the next ones.
    ///
    /// Errors: the worker could not be started or booted, or it refused to serve unconfined
    /// ([`WorkerError::Unconfined`], `--sandbox strict`).
    pub async fn launch(&self) -> Result<Worker, WorkerError> {
        self.boot().await.map(|worker| self.note(worker))
    }

    async fn boot(&self) -> Result<Worker, WorkerError> {
        let Some(store) = &self.store else {
            return Ok(Worker::spawn(&self.exe, &self.args, None, false).await?.0);
        };
        if let Some(snapshot) = store.load() {
            match Worker::spawn(&self.exe, &self.args, Some(snapshot), false).await {
                Ok((worker, _)) => return Ok(worker),
                // Stopped by a shutdown, or unconfined: says nothing about the snapshot.
                Err(e @ (WorkerError::Stopped(_) | WorkerError::Unconfined(_))) => return Err(e),
                Err(e) => {
                    tracing::warn!("booting from the memory snapshot failed, booting plainly: {e}");
                    store.discard();
                }
            }
        }
        let (worker, made) = Worker::spawn(&self.exe, &self.args, None, true).await?;
        if let Some(snapshot) = made {
            store.save(snapshot);
        }
        Ok(worker)
    }
}
