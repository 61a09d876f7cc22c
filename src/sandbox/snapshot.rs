//! Starting workers fast: a Pyodide memory snapshot taken after the first plain boot is kept in
//! the cache directory and restored by later workers, which then skip Python's start-up.

use super::worker::{SandboxReport, Worker, WorkerError};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

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
            if let Err(e) = written {
                tracing::warn!(
                    "cannot store the memory snapshot in {}: {e}",
                    self.path.display()
                );
            }
        }
        *self.bytes.lock().unwrap_or_else(|p| p.into_inner()) = Some(snapshot);
    }

    fn discard(&self) {
        let _ = std::fs::remove_file(&self.path);
        *self.bytes.lock().unwrap_or_else(|p| p.into_inner()) = None;
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
