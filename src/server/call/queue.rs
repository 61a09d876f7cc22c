//! Who waits, and who shares a worker (docs/architecture.md §3). A call is admitted
//! only while fewer than `--max-queue` calls wait; it then takes the worker slot
//! that [`Isolation`] gives it (its sandbox's, a clean one, or one of the shared pool), then
//! one of the `--workers` running slots, both in FIFO order. The pipeline
//! ([`super::execute`]) runs the call once it holds both. Kept apart from the pipeline so
//! that the tenancy rules are read in one place.

use crate::sandbox::arrival::Arrival;
use crate::sandbox::live::Sandbox;
use crate::worker::client::Worker;
use crate::worker::pool::{Lease, Pool};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::{AcquireError, OwnedMutexGuard, OwnedSemaphorePermit, Semaphore};

/// Which callers share a worker (`--isolation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Isolation {
    /// One interpreter per sandbox (an MCP session's own, or with `--stateful` one reached by
    /// its `sandbox_id`), killed with it (the default).
    // Named `session` on the command line, as it was before sandboxes outlived sessions.
    #[value(name = "session")]
    Sandbox,
    /// A clean interpreter for every call.
    Call,
    /// Interpreters are reused across sessions: trusts every client (single-tenant speed).
    Shared,
}

impl Isolation {
    /// Whether a worker may serve another call after one that went well: always but
    /// with [`Isolation::Call`], whose calls each get a clean one.
    pub fn reuses_interpreters(self) -> bool {
        self != Isolation::Call
    }
}

/// The worker slot a call uses, as its [`Isolation`] gives it.
pub(super) enum Held {
    /// The sandbox's own slot, held in arrival order.
    Sandbox(OwnedMutexGuard<Option<Worker>>),
    /// A slot of this call alone, empty until a clean worker is taken.
    Call(Box<Option<Worker>>),
    /// A slot of the shared pool.
    Shared(Lease),
}

impl Held {
    /// The slot's worker, if it has one.
    pub(super) fn slot(&mut self) -> &mut Option<Worker> {
        match self {
            Held::Sandbox(guard) => guard,
            Held::Call(slot) => slot.as_mut(),
            Held::Shared(lease) => lease.slot(),
        }
    }

    /// Empties the slot; its worker is killed.
    pub(super) async fn discard(&mut self) {
        if let Some(worker) = self.slot().take() {
            worker.kill_soon();
        }
    }
}

/// Counts a waiting call in [`Queue::depth`] until dropped.
pub(super) struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A call refused at once because `--max-queue` calls already wait (its text is the call's
/// `run-error`).
#[derive(Debug, thiserror::Error)]
#[error("the server is busy: {waiting} calls are already waiting for an interpreter (--max-queue {max_queue}); try again later")]
pub struct QueueFull {
    /// Calls that were waiting when this one came.
    pub waiting: usize,
    /// `--max-queue`.
    pub max_queue: usize,
}

/// The waiting room and the running slots of an executor.
pub(super) struct Queue {
    /// Which callers share a worker.
    isolation: Isolation,
    /// The workers of `--isolation shared`.
    shared: Option<Arc<Pool>>,
    /// Bounds the calls running at once (`--workers`); FIFO.
    running: Arc<Semaphore>,
    /// `--workers`: the running slots.
    workers: usize,
    /// Calls waiting for their turn (bounded by `--max-queue`).
    waiting: AtomicUsize,
}

impl Queue {
    /// A queue with `workers` running slots (at least one), and as many shared workers
    /// with [`Isolation::Shared`].
    pub(super) fn new(isolation: Isolation, workers: usize) -> Queue {
        let workers = workers.max(1);
        Queue {
            isolation,
            shared: (isolation == Isolation::Shared).then(|| Pool::new(workers)),
            running: Arc::new(Semaphore::new(workers)),
            workers,
            waiting: AtomicUsize::new(0),
        }
    }

    /// Calls waiting for their turn now.
    pub(super) fn depth(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Calls running now (holding a running slot of `--workers`).
    pub(super) fn busy(&self) -> usize {
        self.workers
            .saturating_sub(self.running.available_permits())
    }

    /// Counts a new call as waiting, until the returned guard is dropped.
    ///
    /// Errors: [`QueueFull`] when `max_queue` calls already wait (the call is not counted).
    pub(super) fn admit(&self, max_queue: usize) -> Result<Waiting<'_>, QueueFull> {
        let queued = self.waiting.fetch_add(1, Ordering::SeqCst);
        let waiting = Waiting(&self.waiting);
        if queued >= max_queue {
            return Err(QueueFull {
                waiting: queued,
                max_queue,
            });
        }
        Ok(waiting)
    }

    /// Waits for the call's turn: its worker slot (for `sandbox`'s own, after the calls
    /// stamped before `arrival`), then a running slot, which it holds until the permit is
    /// dropped. `None` once the queue was shut down.
    pub(super) async fn turn(
        &self,
        sandbox: &Sandbox,
        arrival: Option<&Arrival>,
    ) -> Option<(Held, OwnedSemaphorePermit)> {
        let held = match self.isolation {
            Isolation::Sandbox => Held::Sandbox(sandbox.queue(arrival).await),
            Isolation::Call => Held::Call(Box::new(None)),
            Isolation::Shared => Held::Shared(self.shared.as_ref()?.acquire().await?),
        };
        let permit = self.running.clone().acquire_owned().await.ok()?;
        Some((held, permit))
    }

    /// A running slot alone, for work that already holds its sandbox's worker
    /// (`create_sandbox`'s install).
    ///
    /// Errors: the queue was shut down.
    pub(super) async fn running_slot(&self) -> Result<OwnedSemaphorePermit, AcquireError> {
        self.running.clone().acquire_owned().await
    }

    /// Kills the shared workers and hands out no more turns (at shutdown).
    pub(super) async fn shutdown(&self) {
        if let Some(pool) = &self.shared {
            pool.shutdown().await;
        }
        self.running.close();
    }
}
