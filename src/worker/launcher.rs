//! Starting workers fast: a Pyodide memory snapshot taken after the first plain boot is kept in
//! the cache directory and restored by later workers, which then skip Python's start-up.

use super::client::{ConfinementReport, Preinstall, Worker, WorkerError};
use super::mount::Mounts;
use super::zygote_client::{Zygote, ZygoteError};
use super::zygote_service::front::{self as service, Reached, ServiceSpec};
use crate::atomic_file::{self, Durability};
use crate::protocol::launch::SCRATCH_ARG;
use futures::future::{BoxFuture, Shared};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// How long a stored snapshot may go unrestored before the next snapshot stored beside it
/// removes it (seven days). A snapshot's name is the digest of the binary and Pyodide that made
/// it, so after an upgrade the old one is never restored again: 30 MiB left for ever.
/// Restoring one refreshes its modification time, so a binary still in use keeps its own.
const STALE_SNAPSHOT_AGE: Duration = Duration::from_secs(7 * 24 * 3600);

/// How long a booting worker waits for `--deps` to be resolved and fetched (seconds) before
/// it boots without them. The resolution goes on (its result is shared), and a later worker
/// gets them.
const PREINSTALL_WAIT: Duration = Duration::from_secs(60);

/// How long after a zygote failed the next one is started (seconds), by itself, with no call
/// needed (an HTTP replica whose `/readyz` says 503 gets no calls behind a balancer); workers
/// are restored from the snapshot meanwhile. Each failure in a row doubles it, up to
/// [`ZYGOTE_RETRY_MAX`]: a zygote that can never start costs a boot every ten minutes.
const ZYGOTE_RETRY: Duration = Duration::from_secs(5);

/// The longest wait before the next zygote is started after failures in a row (seconds).
const ZYGOTE_RETRY_MAX: Duration = Duration::from_secs(600);

/// How often a ready zygote is looked at to see whether it still lives (seconds), so that one
/// that ended is replaced with no call needed.
const ZYGOTE_WATCH: Duration = Duration::from_secs(1);

/// How long a front's first contact with the zygote service waits for it to fork before the
/// front boots its first interpreter itself: a warm service answers within a millisecond or
/// two; one that is warming up takes seconds, which the first call should not wait for.
const FIRST_CONTACT_WAIT: Duration = Duration::from_millis(250);

/// How often [`Launcher::zygote_now`] looks whether the zygote forks yet.
const ZYGOTE_POLL: Duration = Duration::from_millis(20);

/// How long a front waits in the background for a warming zygote service (seconds): its boot
/// and warm-up, as for a zygote of its own.
const SERVICE_WARM_TIMEOUT: Duration = Duration::from_secs(120);

/// Where forked workers come from.
#[derive(Debug, Clone)]
pub enum ZygoteSource {
    /// A zygote of this process's own (`--no-shared-zygote`, or the service itself).
    Own,
    /// The per-host zygote service (`zygote_service/`), started when there is none.
    Shared(ServiceSpec),
}

/// Starts workers: forked from the zygote once it is ready, else from a snapshot when one is
/// known to work, else plainly.
pub struct Launcher {
    exe: PathBuf,
    args: Vec<String>,
    store: Option<SnapshotStore>,
    /// The last confinement report of a worker, logged whenever it changes.
    confinement: Mutex<Option<ConfinementReport>>,
    /// The fork server, when enabled (unless `--no-zygote`), and where it comes from.
    zygote: Option<(ZygoteSource, Mutex<ZygoteState>)>,
    /// `--mount`: the operator's data, handed to every worker as it boots.
    mounts: Arc<Mounts>,
    /// `--deps`: installed by every worker (and the zygote) as it boots.
    preinstall: Option<PreinstallSource>,
    /// Scientific workers: the folder where each one's scratch folder is made
    /// ([`SCRATCH_ARG`]), the zygote's included; removed at [`Launcher::shutdown`].
    scratch: Mutex<Option<tempfile::TempDir>>,
}

/// The packages every worker installs as it boots (`--deps`), resolved once, on the first
/// boot that waits for them: `None` when they could not be resolved (each call then says why).
pub type PreinstallSource = Shared<BoxFuture<'static, Option<Arc<Preinstall>>>>;

/// Where the fork server stands.
enum ZygoteState {
    /// Not started yet: started after the first worker booted (which made the snapshot).
    Idle,
    /// Booting and warming up in the background, after `failures` starts in a row failed.
    Starting { failures: u32 },
    /// Forks workers.
    Ready(Arc<Zygote>),
    /// `failures` starts in a row failed (a zygote that was ready and ended counts as one);
    /// the next starts at `retry_at` ([`retry_delay`]).
    Failed { retry_at: Instant, failures: u32 },
    /// Shut down.
    Closed,
}

/// How long to wait before the next zygote after `failures` failures in a row:
/// [`ZYGOTE_RETRY`], doubled for each failure after the first, at most [`ZYGOTE_RETRY_MAX`].
fn retry_delay(failures: u32) -> Duration {
    /// Past this many doublings the wait is at its cap (2^7 × 5 s > 600 s).
    const MAX_DOUBLINGS: u32 = 7;
    let doublings = failures.saturating_sub(1).min(MAX_DOUBLINGS);
    ZYGOTE_RETRY
        .saturating_mul(1 << doublings)
        .min(ZYGOTE_RETRY_MAX)
}

struct SnapshotStore {
    path: PathBuf,
    /// The snapshot file, opened read-only once; each worker gets its own descriptor of it
    /// and maps it (`None` until the first boot found or made it). When the file cannot be
    /// stored, a memory file holds the snapshot instead.
    file: Mutex<Option<File>>,
}

impl SnapshotStore {
    /// A descriptor of the snapshot to hand to one worker, if there is a snapshot.
    fn load(&self) -> Option<File> {
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if file.is_none() {
            *file = File::open(&self.path).ok();
            if file.is_some() {
                // In use: keep it from being pruned as stale.
                let touched = File::options()
                    .write(true)
                    .open(&self.path)
                    .and_then(|f| f.set_modified(SystemTime::now()));
                if let Err(e) = touched {
                    tracing::debug!("cannot refresh {}: {e}", self.path.display());
                }
            }
        }
        let handed = file.as_ref()?.try_clone();
        handed
            .map_err(|e| tracing::warn!("cannot hand out the memory snapshot: {e}"))
            .ok()
    }

    /// Stores `snapshot` (written to a new file, then renamed over the old one, so that a
    /// worker mapping the old one keeps it whole), or else keeps it in a memory file.
    fn save(&self, snapshot: Vec<u8>) {
        let stored = self.store(&snapshot).and_then(|()| File::open(&self.path));
        let file = match stored {
            Ok(file) => {
                if let Some(dir) = self.path.parent() {
                    prune_stale(dir, &self.path);
                }
                Some(file)
            }
            Err(e) => {
                tracing::warn!(
                    "cannot store the memory snapshot in {}: {e}",
                    self.path.display()
                );
                memory_file(&snapshot)
                    .map_err(|e| tracing::warn!("cannot keep the memory snapshot: {e}"))
                    .ok()
            }
        };
        *self.file.lock().unwrap_or_else(|p| p.into_inner()) = file;
    }

    fn store(&self, snapshot: &[u8]) -> std::io::Result<()> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        let tag = std::process::id().to_string();
        atomic_file::replace(&self.path, &tag, Durability::Unsynced, snapshot)
            .map_err(std::io::Error::other)
    }

    fn discard(&self) {
        let _ = std::fs::remove_file(&self.path);
        *self.file.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

/// `bytes` in an anonymous memory file (`memfd_create`), which workers map as they do the
/// stored file.
fn memory_file(bytes: &[u8]) -> std::io::Result<File> {
    use nix::sys::memfd::{memfd_create, MFdFlags};
    let fd = memfd_create(c"mcp-run-python-snapshot", MFdFlags::MFD_CLOEXEC)?;
    let mut file = File::from(fd);
    std::io::Write::write_all(&mut file, bytes)?;
    Ok(file)
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
            .is_some_and(|n| n.starts_with("pyodide-") || n.starts_with(".pyodide-"));
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
    /// With `zygote`, workers are forked from a zygote once it is ready (`zygote_client.rs`), its own
    /// or the host's service. Every worker (the zygote too) boots with `mounts`, and installs
    /// what `preinstall` gives.
    pub fn new(
        exe: PathBuf,
        args: Vec<String>,
        snapshot_path: Option<PathBuf>,
        zygote: Option<ZygoteSource>,
        mounts: Mounts,
        preinstall: Option<PreinstallSource>,
    ) -> Self {
        Launcher {
            exe,
            args,
            store: snapshot_path.map(|path| SnapshotStore {
                path,
                file: Mutex::new(None),
            }),
            confinement: Mutex::new(None),
            zygote: zygote.map(|source| (source, Mutex::new(ZygoteState::Idle))),
            mounts: Arc::new(mounts),
            preinstall,
            scratch: Mutex::new(None),
        }
    }

    /// Workers get `args` too.
    pub fn with_args(mut self, args: &[String]) -> Self {
        self.args.extend(args.iter().cloned());
        self
    }

    /// Workers never boot from nor make a memory snapshot (Pyodide's).
    pub fn without_snapshot(mut self) -> Self {
        self.store = None;
        self
    }

    /// Workers of the scientific runtime: each gets a scratch folder of its own, made in a
    /// folder of this launcher's under `parent` and removed with the worker.
    ///
    /// Errors: the folder cannot be made.
    pub fn with_scratch(self, parent: &Path) -> std::io::Result<Self> {
        let root = tempfile::Builder::new()
            .prefix("mcp-run-python-scientific-")
            .tempdir_in(parent)?;
        *self.scratch.lock().unwrap_or_else(|p| p.into_inner()) = Some(root);
        Ok(self)
    }

    /// The folder where scientific workers' scratch folders are made, if this launcher
    /// starts scientific workers and has not shut down.
    fn scratch_root(&self) -> Option<PathBuf> {
        let root = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        root.as_ref().map(|root| root.path().to_owned())
    }

    /// The packages to install as a worker boots, once resolved (`None` without `--deps`, or
    /// when they are not resolved within [`PREINSTALL_WAIT`]: the worker then boots without
    /// them, and its first call installs them under `--install-timeout`).
    async fn preinstall(&self) -> Option<Arc<Preinstall>> {
        let source = self.preinstall.clone()?;
        match tokio::time::timeout(PREINSTALL_WAIT, source).await {
            Ok(preinstall) => preinstall,
            Err(_) => {
                tracing::warn!(
                    "--deps not resolved within {} s: a worker boots without them",
                    PREINSTALL_WAIT.as_secs()
                );
                None
            }
        }
    }

    /// Whether this launcher forks workers from a zygote once one is ready.
    pub fn uses_zygote(&self) -> bool {
        self.zygote.is_some()
    }

    /// Whether new workers are forked now (the zygote is ready, and alive).
    pub fn forks(&self) -> bool {
        self.ready_zygote().is_some_and(|zygote| zygote.is_alive())
    }

    /// The zygote, when it is ready to fork.
    fn ready_zygote(&self) -> Option<Arc<Zygote>> {
        let state = self
            .zygote
            .as_ref()?
            .1
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match &*state {
            ZygoteState::Ready(zygote) => Some(zygote.clone()),
            _ => None,
        }
    }

    /// Starts this process's own zygote: restored from the snapshot when there is one, with
    /// `--deps` installed. The zygote service runs its zygote with this.
    ///
    /// Errors: [`ZygoteError`].
    pub async fn own_zygote(&self) -> Result<Zygote, ZygoteError> {
        let snapshot = self.store.as_ref().and_then(SnapshotStore::load);
        let preinstall = self.preinstall().await;
        Zygote::start(
            &self.exe,
            &self.args,
            snapshot,
            &self.mounts,
            preinstall.as_deref(),
            self.scratch_root(),
        )
        .await
    }

    /// First contact with the zygote service, at start-up: when it forks already, the first
    /// worker is a fork; when it warms up, it is waited for in the background. When none
    /// runs, none is started yet: the first boot starts it ([`Launcher::launch`]), so that its
    /// own boot and warm-up, which take both cores of a small machine for seconds, do not
    /// slow the restore of this front's first interpreter (issue 49: the first call of the
    /// day took 1.75 times as long as without the service). Nothing for a zygote of this
    /// process's own, which starts after the first boot.
    pub async fn prepare(self: &Arc<Self>) {
        let Some((ZygoteSource::Shared(spec), slot)) = &self.zygote else {
            return;
        };
        *slot.lock().unwrap_or_else(|p| p.into_inner()) = ZygoteState::Starting { failures: 0 };
        let first = spec.clone();
        let reached =
            tokio::task::spawn_blocking(move || service::reach_running(&first, FIRST_CONTACT_WAIT))
                .await;
        let reached =
            reached.unwrap_or_else(|e| Err(service::ServiceError::Start(std::io::Error::other(e))));
        match reached {
            Ok(None) => *slot.lock().unwrap_or_else(|p| p.into_inner()) = ZygoteState::Idle,
            Ok(Some(Reached::Serving(zygote))) => self.zygote_started(Some(*zygote)).await,
            Ok(Some(Reached::Warming(warming))) => {
                let launcher = self.clone();
                tokio::spawn(async move {
                    let ready = warming.serving(SERVICE_WARM_TIMEOUT).await;
                    launcher.service_reached(ready).await;
                });
            }
            Err(e) => self.service_reached(Err(e)).await,
        }
    }

    /// Starts the zygote now, unless it runs or starts, and waits up to `wait` for it to fork:
    /// for a runtime made ready while a caller waits (the first sandbox of a runtime that is
    /// not the server's own), whose sandboxes should be forked (checkpoints and `fork_sandbox`
    /// need that) rather than booted. Whether new workers are forked now.
    pub async fn zygote_now(self: &Arc<Self>, wait: Duration) -> bool {
        let Some((_, slot)) = &self.zygote else {
            return false;
        };
        self.start_zygote();
        let deadline = Instant::now() + wait;
        loop {
            if self.forks() {
                return true;
            }
            let failed = matches!(
                *slot.lock().unwrap_or_else(|p| p.into_inner()),
                ZygoteState::Failed { .. } | ZygoteState::Closed
            );
            if failed || Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(ZYGOTE_POLL).await;
        }
    }

    /// Records the outcome of reaching the zygote service (one log line either way).
    async fn service_reached(self: &Arc<Self>, reached: Result<Zygote, service::ServiceError>) {
        match reached {
            Ok(zygote) => self.zygote_started(Some(zygote)).await,
            Err(e) => {
                tracing::warn!(
                    "the zygote service cannot be used (interpreters are booted meanwhile): {e}"
                );
                self.zygote_started(None).await
            }
        }
    }

    /// Starts the zygote in the background unless it runs, starts, or failed recently: this
    /// process's own, or the service (reached, or started when none runs).
    fn start_zygote(self: &Arc<Self>) {
        let Some((source, slot)) = &self.zygote else {
            return;
        };
        {
            let mut state = slot.lock().unwrap_or_else(|p| p.into_inner());
            let failures = match &*state {
                ZygoteState::Idle => 0,
                ZygoteState::Failed { retry_at, failures } if Instant::now() >= *retry_at => {
                    *failures
                }
                _ => return,
            };
            *state = ZygoteState::Starting { failures };
        }
        let launcher = self.clone();
        let source = source.clone();
        tokio::spawn(async move {
            match source {
                ZygoteSource::Own => {
                    let started = launcher.own_zygote().await;
                    let started = started
                        .map_err(|e| {
                            tracing::warn!(
                                "the zygote did not start (interpreters are booted meanwhile): {}",
                                crate::protocol::error_words(&e)
                            )
                        })
                        .ok();
                    launcher.zygote_started(started).await
                }
                ZygoteSource::Shared(spec) => {
                    let reached =
                        tokio::task::spawn_blocking(move || service::reach(&spec, Duration::ZERO))
                            .await
                            .unwrap_or_else(|e| {
                                Err(service::ServiceError::Start(std::io::Error::other(e)))
                            });
                    let ready = match reached {
                        Ok(Reached::Serving(zygote)) => Ok(*zygote),
                        Ok(Reached::Warming(warming)) => {
                            warming.serving(SERVICE_WARM_TIMEOUT).await
                        }
                        Err(e) => Err(e),
                    };
                    launcher.service_reached(ready).await
                }
            }
        });
    }

    /// Makes `started` the zygote (unless the launcher was shut down meanwhile) and watches it
    /// ([`Launcher::watch`]), or notes the failure (`None`, logged by the caller), after which
    /// the next start is tried by itself [`retry_delay`] later.
    async fn zygote_started(self: &Arc<Self>, started: Option<Zygote>) {
        let Some((_, slot)) = &self.zygote else {
            return;
        };
        match started {
            // Both see to a launcher shut down meanwhile.
            Some(zygote) => self.make_ready(zygote).await,
            None => {
                let failures = match &*slot.lock().unwrap_or_else(|p| p.into_inner()) {
                    ZygoteState::Starting { failures } => *failures,
                    _ => 0,
                };
                self.fail(failures + 1);
            }
        }
    }

    /// Makes `zygote` the ready one and watches it, unless the launcher shut down meanwhile.
    async fn make_ready(self: &Arc<Self>, zygote: Zygote) {
        let Some((_, slot)) = &self.zygote else {
            return;
        };
        let zygote = Arc::new(zygote);
        let unwanted = {
            let mut state = slot.lock().unwrap_or_else(|p| p.into_inner());
            if matches!(*state, ZygoteState::Closed) {
                true
            } else {
                *state = ZygoteState::Ready(zygote.clone());
                false
            }
        };
        if unwanted {
            zygote.kill().await;
            return;
        }
        match zygote.service() {
            Some((pid, socket)) => tracing::info!(
                "the zygote is ready (the zygote service at {}, pid {pid}): new interpreters are forked from it",
                socket.display()
            ),
            None => tracing::info!("the zygote is ready: new interpreters are forked from it"),
        }
        self.watch(zygote);
    }

    /// Notes that the zygote failed for the `failures`-th time in a row and starts the next one
    /// by itself after [`retry_delay`], unless one was started or the launcher shut down by
    /// then.
    fn fail(self: &Arc<Self>, failures: u32) {
        let Some((_, slot)) = &self.zygote else {
            return;
        };
        let delay = retry_delay(failures);
        {
            let mut state = slot.lock().unwrap_or_else(|p| p.into_inner());
            if matches!(*state, ZygoteState::Closed) {
                return;
            }
            *state = ZygoteState::Failed {
                retry_at: Instant::now() + delay,
                failures,
            };
        }
        // Weak: a pending retry does not keep a launcher that is done with alive.
        let launcher = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            if let Some(launcher) = launcher.upgrade() {
                launcher.start_zygote();
            }
        });
    }

    /// Looks every [`ZYGOTE_WATCH`] whether `zygote`, while it is the ready one, still lives,
    /// and replaces it when it ended: otherwise a server with no calls coming (an HTTP replica
    /// whose `/readyz` says 503 behind a balancer) would never replace it.
    fn watch(self: &Arc<Self>, zygote: Arc<Zygote>) {
        let launcher = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(ZYGOTE_WATCH).await;
                let Some(launcher) = launcher.upgrade() else {
                    return;
                };
                if !launcher.is_ready_zygote(&zygote) {
                    return;
                }
                if !zygote.is_alive() {
                    tracing::warn!(
                        "the zygote ended: interpreters are booted until it is replaced"
                    );
                    launcher.zygote_failed(zygote).await;
                    return;
                }
            }
        });
    }

    /// Whether `zygote` is the ready zygote.
    fn is_ready_zygote(&self, zygote: &Arc<Zygote>) -> bool {
        self.ready_zygote()
            .is_some_and(|ready| Arc::ptr_eq(&ready, zygote))
    }

    /// Drops `zygote` after it failed, when it is still the ready one, and starts a new one
    /// by itself after [`ZYGOTE_RETRY`].
    async fn zygote_failed(self: &Arc<Self>, zygote: Arc<Zygote>) {
        if self.is_ready_zygote(&zygote) {
            self.fail(1);
        }
        zygote.kill().await;
    }

    /// Kills the zygote and starts none again (at shutdown).
    pub async fn shutdown(&self) {
        let root = self
            .scratch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        // Every worker's folder goes with it (a worker still running keeps its open ones).
        drop(root);
        let Some((_, slot)) = &self.zygote else {
            return;
        };
        let old = std::mem::replace(
            &mut *slot.lock().unwrap_or_else(|p| p.into_inner()),
            ZygoteState::Closed,
        );
        if let ZygoteState::Ready(zygote) = old {
            zygote.kill().await;
        }
    }

    /// The confinement report of the last worker booted (`None` before the first).
    pub fn confinement_report(&self) -> Option<ConfinementReport> {
        self.confinement
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Logs `worker`'s confinement when it differs from the last one logged: at start-up,
    /// and should the kernel's answer change (a warning whenever a layer is off).
    fn note(&self, worker: Worker) -> Worker {
        let mut last = self.confinement.lock().unwrap_or_else(|p| p.into_inner());
        if last.as_ref() != Some(&worker.confinement) {
            if worker.confinement.confined {
                tracing::info!("{}", worker.confinement.line);
            } else {
                tracing::warn!("{}", worker.confinement.line);
            }
            *last = Some(worker.confinement.clone());
        }
        worker
    }

    /// Starts one worker: forked from the zygote when it is ready (a zygote that fails is
    /// replaced later), else booted from the snapshot if there is one (a snapshot that fails
    /// is deleted and a plain boot follows), else plainly, making the snapshot for the next
    /// ones. The first boot starts the zygote in the background.
    ///
    /// Errors: the worker could not be started or booted, or it refused to serve unconfined
    /// ([`WorkerError::Unconfined`], `--confinement strict`).
    pub async fn launch(self: &Arc<Self>) -> Result<Worker, WorkerError> {
        if let Some(zygote) = self.ready_zygote() {
            match zygote.fork().await {
                Ok(worker) => return Ok(self.note(worker)),
                Err(super::zygote_client::ZygoteError::Ready(e @ WorkerError::Unconfined(_))) => {
                    return Err(e)
                }
                // The service answered but this fork did not work out: the connection, which
                // the workers already forked through it live by, is kept.
                Err(e) if zygote.service().is_some() && !e.ends_connection() => {
                    tracing::warn!(
                        "a fork through the zygote service failed (booting one): {}",
                        crate::protocol::error_words(&e)
                    );
                }
                Err(e) => {
                    tracing::warn!(
                        "the zygote failed, booting interpreters until it is replaced: {}",
                        crate::protocol::error_words(&e)
                    );
                    self.zygote_failed(zygote).await;
                }
            }
        }
        let worker = self.boot().await?;
        self.start_zygote();
        Ok(self.note(worker))
    }

    async fn boot(&self) -> Result<Worker, WorkerError> {
        let preinstall = self.preinstall().await;
        let preinstall = preinstall.as_deref();
        let (exe, args, mounts) = (&self.exe, &self.args, &self.mounts);
        if let Some(root) = self.scratch_root() {
            let scratch = Worker::new_scratch(&root).map_err(WorkerError::Spawn)?;
            let mut args = args.clone();
            args.push(format!("{SCRATCH_ARG}{}", scratch.path().display()));
            let (mut worker, _) =
                Worker::spawn(exe, &args, None, false, mounts, preinstall).await?;
            worker.keep_scratch(scratch);
            return Ok(worker);
        }
        let Some(store) = &self.store else {
            return Ok(Worker::spawn(exe, args, None, false, mounts, preinstall)
                .await?
                .0);
        };
        if let Some(snapshot) = store.load() {
            match Worker::spawn(exe, args, Some(&snapshot), false, mounts, preinstall).await {
                Ok((worker, _)) => return Ok(worker),
                // Stopped by a shutdown, or unconfined: says nothing about the snapshot.
                Err(e @ (WorkerError::Stopped(_) | WorkerError::Unconfined(_))) => return Err(e),
                Err(e) => {
                    tracing::warn!(
                        "booting from the memory snapshot failed, booting plainly: {}",
                        crate::protocol::error_words(&e)
                    );
                    store.discard();
                }
            }
        }
        let (worker, made) = Worker::spawn(exe, args, None, true, mounts, preinstall).await?;
        if let Some(snapshot) = made {
            store.save(snapshot);
        }
        Ok(worker)
    }
}

#[cfg(test)]
mod tests {
    use super::{retry_delay, ZYGOTE_RETRY, ZYGOTE_RETRY_MAX};

    #[test]
    fn the_retry_wait_doubles_up_to_its_cap() {
        assert_eq!(retry_delay(1), ZYGOTE_RETRY);
        assert_eq!(retry_delay(2), ZYGOTE_RETRY * 2);
        assert_eq!(retry_delay(3), ZYGOTE_RETRY * 4);
        assert_eq!(retry_delay(100), ZYGOTE_RETRY_MAX);
        assert_eq!(retry_delay(u32::MAX), ZYGOTE_RETRY_MAX);
    }
}
