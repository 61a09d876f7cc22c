//! The pool of sandbox workers: calls queue fairly (FIFO) for a free worker; a worker that
//! died, crashed or timed out is discarded and replaced in the background.

use super::snapshot::Launcher;
use super::worker::{Worker, WorkerError};
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedMutexGuard, OwnedSemaphorePermit, Semaphore};

type Slot = Arc<tokio::sync::Mutex<Option<Worker>>>;

/// A fixed number of worker slots, each holding a booted worker or nothing (yet).
pub struct Pool {
    launcher: Arc<Launcher>,
    slots: Vec<Slot>,
    free: Mutex<Vec<usize>>,
    permits: Arc<Semaphore>,
}

/// Exclusive use of one worker for one call; the slot is returned on drop.
pub struct Lease {
    pool: Arc<Pool>,
    index: usize,
    guard: Option<OwnedMutexGuard<Option<Worker>>>,
    _permit: OwnedSemaphorePermit,
}

impl Pool {
    /// A pool of `size` slots (at least 1) whose workers `launcher` starts.
    pub fn new(launcher: Launcher, size: usize) -> Arc<Pool> {
        let size = size.max(1);
        Arc::new(Pool {
            launcher: Arc::new(launcher),
            slots: (0..size)
                .map(|_| Arc::new(tokio::sync::Mutex::new(None)))
                .collect(),
            free: Mutex::new((0..size).rev().collect()),
            permits: Arc::new(Semaphore::new(size)),
        })
    }

    /// Boots every empty slot in the background, so that the first calls do not wait for it.
    pub fn warm_up(self: &Arc<Self>) {
        for index in 0..self.slots.len() {
            self.refill(index);
        }
    }

    fn refill(self: &Arc<Self>, index: usize) {
        let slot = self.slots[index].clone();
        let launcher = self.launcher.clone();
        tokio::spawn(async move {
            let mut guard = slot.lock().await;
            if guard.is_none() {
                match launcher.launch().await {
                    Ok(w) => *guard = Some(w),
                    Err(e) => tracing::error!("worker {index}: {e}"),
                }
            }
        });
    }

    /// Waits for a free worker (FIFO among callers), booting one if its slot is empty.
    ///
    /// Errors: the worker could not be started or booted.
    pub async fn acquire(self: &Arc<Self>) -> Result<Lease, WorkerError> {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| WorkerError::Protocol("the pool is closed".into()))?;
        let index = self
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()
            .ok_or_else(|| WorkerError::Protocol("no free worker slot".into()))?;
        let mut lease = Lease {
            pool: self.clone(),
            index,
            guard: None,
            _permit: permit,
        };
        let mut guard = self.slots[index].clone().lock_owned().await;
        if guard.is_none() {
            *guard = Some(self.launcher.launch().await?);
        }
        lease.guard = Some(guard);
        Ok(lease)
    }

    /// Kills every worker (at shutdown).
    pub async fn shutdown(&self) {
        for slot in &self.slots {
            if let Some(w) = slot.lock().await.take() {
                w.kill().await;
            }
        }
    }
}

impl Lease {
    /// The leased worker.
    pub fn worker(&mut self) -> &mut Worker {
        self.guard
            .as_mut()
            .and_then(|g| g.as_mut())
            .expect("a lease always holds a booted worker")
    }

    /// Kills the leased worker (it timed out, crashed or cannot be trusted) and boots a
    /// replacement in the background.
    pub async fn discard(mut self) {
        if let Some(mut guard) = self.guard.take() {
            if let Some(w) = guard.take() {
                w.kill().await;
            }
        }
        self.pool.refill(self.index);
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // Release the slot's lock before its index becomes free again.
        self.guard.take();
        self.pool
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(self.index);
    }
}
