//! Clean spare workers, booted ahead (from the memory snapshot) so that a new session or a
//! fresh-per-call worker rarely waits for a boot (docs/architecture.md §3). A spare booted in
//! the background has run one warm-up call ([`Worker::warm_up`]: the literal `0`, in fresh
//! globals) and no user code; it is handed out once and never comes back.

use super::client::{Deadline, Phase, Worker, WorkerError};
use super::launcher::Launcher;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// How long an idle spare may take to answer the health check made when it is handed out
/// (seconds). A healthy idle worker answers in well under a millisecond; one that is stopped
/// (SIGSTOP) or wedged is replaced.
pub const HEALTH_CHECK_TIMEOUT: Duration = Duration::from_secs(3);

/// How long a new spare's warm-up call may take (seconds): a few milliseconds normally.
const WARM_UP_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a new worker is not cheap now ([`Spares::readiness`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotReady {
    /// The zygote is starting (or restarting after a failure): new workers are restored
    /// from the memory snapshot meanwhile, ~0.5 s and ~170 MiB each instead of a fork's ~10 ms.
    #[error("the zygote is not ready: new interpreters are restored from the snapshot (slow) until it is")]
    Zygote,
    /// Every spare was handed out and none is ready yet.
    #[error("no spare interpreter is ready")]
    NoSpare,
    /// The server is draining or stopping.
    #[error("the server is draining before it stops")]
    Closed,
}

/// The sandbox whose making turns [`SpareCounts::when_reused`] on: the second.
const REUSED_FROM_SANDBOX: usize = 2;

/// How many spares a runtime keeps ([`Spares::new`]; chosen by `src/modes.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpareCounts {
    /// Kept ready (0 = boot on demand, and after a loss, only).
    pub target: usize,
    /// Booted at start-up ([`Spares::prefill`]).
    pub initial: usize,
    /// Kept ready instead of `target`, when more, once a second sandbox is made
    /// ([`Spares::sandbox_made`]): a client that makes sandboxes one after another (code
    /// mode's, over one stdio connection) gets each from a warm spare, and one that keeps a
    /// single sandbox pays for no spare, even when its worker is replaced.
    pub when_reused: usize,
}

/// Keeps up to `target` booted, unused workers ready.
pub struct Spares {
    launcher: Arc<Launcher>,
    counts: SpareCounts,
    /// Sandboxes made so far ([`Spares::sandbox_made`]).
    sandboxes: AtomicUsize,
    ready: Mutex<VecDeque<Worker>>,
    booting: AtomicUsize,
    /// Woken whenever a background boot ends (with a spare or not).
    booted: Notify,
    closed: AtomicBool,
}

impl Spares {
    /// Spares started by `launcher`, as many as `counts` says.
    pub fn new(launcher: Arc<Launcher>, counts: SpareCounts) -> Arc<Spares> {
        Arc::new(Spares {
            launcher,
            counts,
            sandboxes: AtomicUsize::new(0),
            ready: Mutex::new(VecDeque::new()),
            booting: AtomicUsize::new(0),
            booted: Notify::new(),
            closed: AtomicBool::new(false),
        })
    }

    /// Spares booting now.
    pub fn booting_count(&self) -> usize {
        self.booting.load(Ordering::SeqCst)
    }

    /// Spares ready now.
    pub fn ready_count(&self) -> usize {
        self.ready.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Boots the start-up spares in the background.
    pub fn prefill(self: &Arc<Self>) {
        self.fill_to(self.counts.initial);
    }

    /// Boots spares in the background until as many as wanted now are ready or booting.
    pub fn fill(self: &Arc<Self>) {
        self.fill_to(self.target());
    }

    /// Counts a sandbox being made (`create_sandbox`), before it takes its worker: from the
    /// second on, [`SpareCounts::when_reused`] spares are kept.
    pub fn sandbox_made(&self) {
        self.sandboxes.fetch_add(1, Ordering::SeqCst);
    }

    /// How many spares are wanted now: [`SpareCounts::when_reused`] once a second sandbox was
    /// made, else [`SpareCounts::target`].
    fn target(&self) -> usize {
        let SpareCounts {
            target,
            when_reused,
            ..
        } = self.counts;
        if self.sandboxes.load(Ordering::SeqCst) >= REUSED_FROM_SANDBOX {
            target.max(when_reused)
        } else {
            target
        }
    }

    /// Boots one spare in the background unless one is ready or booting already: after a
    /// worker was lost (or at start-up), so that its replacement is likely ready before
    /// it is needed, even with a `target` of 0.
    pub fn replenish(self: &Arc<Self>) {
        self.fill_to(self.target().max(1));
    }

    fn fill_to(self: &Arc<Self>, target: usize) {
        loop {
            if self.closed.load(Ordering::SeqCst) {
                return;
            }
            let booting = self.booting.load(Ordering::SeqCst);
            if self.ready_count() + booting >= target {
                return;
            }
            if self
                .booting
                .compare_exchange(booting, booting + 1, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
            {
                continue;
            }
            let spares = self.clone();
            tokio::spawn(async move {
                let booted = match spares.launcher.launch().await {
                    Ok(worker) => warmed(worker).await,
                    Err(e) => Err(e),
                };
                match booted {
                    Ok(worker) if !spares.closed.load(Ordering::SeqCst) => spares
                        .ready
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push_back(worker),
                    Ok(worker) => worker.kill().await,
                    Err(e) => tracing::error!("booting a spare interpreter failed: {e}"),
                }
                spares.booting.fetch_sub(1, Ordering::SeqCst);
                spares.booted.notify_waiters();
            });
        }
    }

    /// A clean worker: a ready spare that passes a health check, else the next one to
    /// finish booting, else one booted now. Starts booting a replacement.
    ///
    /// Errors: a worker could not be booted; [`WorkerError::Closed`] after shutdown.
    pub async fn take(self: &Arc<Self>) -> Result<Worker, WorkerError> {
        loop {
            if self.closed.load(Ordering::SeqCst) {
                return Err(WorkerError::Closed);
            }
            let booted = self.booted.notified();
            tokio::pin!(booted);
            booted.as_mut().enable();
            let spare = self
                .ready
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pop_front();
            if let Some(mut worker) = spare {
                self.fill();
                if self.outdated(&worker) {
                    // Booted before the zygote was ready: a fork (milliseconds) inherits the
                    // zygote's compiled code, which a booted worker would spend its first
                    // thousands of calls compiling, slower all the while.
                    worker.kill_soon();
                    continue;
                }
                match worker
                    .ping(Deadline::after(HEALTH_CHECK_TIMEOUT, Phase::HealthCheck))
                    .await
                {
                    Ok(()) => return Ok(worker),
                    Err(e) => {
                        tracing::warn!(
                            "replacing a spare interpreter that failed its health check: {e}"
                        );
                        worker.kill().await;
                        continue;
                    }
                }
            }
            if self.booting.load(Ordering::SeqCst) > 0 {
                booted.await;
                continue;
            }
            let worker = self.launch_for_a_call().await;
            self.fill();
            return worker;
        }
    }

    /// Launches an interpreter for a call that waits for it, and once more when the first
    /// failed as it booted ([`WorkerError::failed_as_it_booted`]): a rare engine trap before
    /// user code runs must not lose the call (issue 48). The stand-in says so
    /// ([`Worker::stand_in_for`]).
    ///
    /// Errors: as [`Launcher::launch`], the second attempt's.
    async fn launch_for_a_call(&self) -> Result<Worker, WorkerError> {
        match self.launcher.launch().await {
            Err(first) if first.failed_as_it_booted() => {
                tracing::warn!(
                    "an interpreter failed as it booted ({first}); booting another for the call"
                );
                let mut worker = self.launcher.launch().await?;
                worker.stand_in_for = Some(format!(
                    "the first interpreter for this call failed as it booted ({first}); the call ran in a fresh one"
                ));
                Ok(worker)
            }
            other => other,
        }
    }

    /// Boots one spare now and keeps it ready: the start-up check of `--confinement strict` and
    /// `warmup`, which must know before serving that a worker boots and confines itself.
    ///
    /// Errors: as [`Launcher::launch`].
    pub async fn boot_now(&self) -> Result<(), WorkerError> {
        let worker = self.launcher.launch().await?;
        self.ready
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(worker);
        self.booted.notify_waiters();
        Ok(())
    }

    /// Whether `worker` should give way to a forked worker: it was booted (restored)
    /// before the zygote was ready, and the zygote is ready now. A booted worker compiles
    /// the per-call code anew for thousands of calls, slower all the while, which a fork
    /// inherits compiled (`--isolation shared` keeps its workers for the server's life).
    pub fn outdated(&self, worker: &Worker) -> bool {
        !worker.is_forked() && self.launcher.forks()
    }

    /// Whether a new worker is cheap now (`GET /readyz`): the zygote, where the server
    /// uses one, is ready to fork, and a spare is ready where spares are kept.
    ///
    /// Errors: [`NotReady`], which says why not.
    pub fn readiness(&self) -> Result<(), NotReady> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(NotReady::Closed);
        }
        if self.launcher.uses_zygote() && !self.launcher.forks() {
            return Err(NotReady::Zygote);
        }
        if self.target() > 0 && self.ready_count() == 0 {
            return Err(NotReady::NoSpare);
        }
        Ok(())
    }

    /// The confinement report of the last worker booted (`None` before the first).
    pub fn confinement_report(&self) -> Option<super::client::ConfinementReport> {
        self.launcher.confinement_report()
    }

    /// Kills every spare and stops booting new ones.
    pub async fn shutdown(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.launcher.shutdown().await;
        let spares: Vec<Worker> = self
            .ready
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
            .collect();
        for worker in spares {
            worker.kill().await;
        }
        self.booted.notify_waiters();
    }
}

/// `worker`, a new spare, after its warm-up call, run here in the background: a fresh fork's
/// first call otherwise copies every page the runtime writes from the zygote, and finds its
/// allocator's and the engine's caches cold (4–6 ms of a first call's 6–8 ms in the front's
/// timing line, against 0.3 ms warm); a call that takes the spare then starts warm
/// (`create_sandbox` → first result, `--isolation call`).
///
/// Errors: the worker failed its warm-up (it is killed); [`WorkerError`] as the call's.
async fn warmed(mut worker: Worker) -> Result<Worker, WorkerError> {
    let deadline = Deadline::after(WARM_UP_TIMEOUT, Phase::WarmingUp);
    match worker.warm_up(deadline).await {
        Ok(()) => Ok(worker),
        Err(e) => {
            worker.kill_soon();
            Err(e)
        }
    }
}
