//! Interpreters shared by every session (`--isolation shared`, which trusts every client):
//! a fixed number of slots; calls queue fairly (FIFO) for a free slot; an empty slot is filled
//! from the spares; a worker that died, crashed or timed out is discarded.

use super::client::Worker;
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedMutexGuard, OwnedSemaphorePermit, Semaphore};

type Slot = Arc<tokio::sync::Mutex<Option<Worker>>>;

/// A fixed number of worker slots, each holding a worker or nothing (yet).
pub struct Pool {
    slots: Vec<Slot>,
    free: Mutex<Vec<usize>>,
    permits: Arc<Semaphore>,
}

/// Exclusive use of one slot for one call; the slot is returned on drop.
pub struct Lease {
    pool: Arc<Pool>,
    index: usize,
    guard: OwnedMutexGuard<Option<Worker>>,
    _permit: OwnedSemaphorePermit,
}

impl Pool {
    /// A pool of `size` slots (at least 1).
    pub fn new(size: usize) -> Arc<Pool> {
        let size = size.max(1);
        Arc::new(Pool {
            slots: (0..size)
                .map(|_| Arc::new(tokio::sync::Mutex::new(None)))
                .collect(),
            free: Mutex::new((0..size).rev().collect()),
            permits: Arc::new(Semaphore::new(size)),
        })
    }

    /// Waits for a free slot (FIFO among callers). `None` when the pool is closed.
    pub async fn acquire(self: &Arc<Self>) -> Option<Lease> {
        let permit = self.permits.clone().acquire_owned().await.ok()?;
        // A permit guarantees a free index: there are as many permits as slots.
        let index = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop()?;
        let guard = self.slots[index].clone().lock_owned().await;
        Some(Lease {
            pool: self.clone(),
            index,
            guard,
            _permit: permit,
        })
    }

    /// Kills every worker and closes the pool (at shutdown).
    pub async fn shutdown(&self) {
        self.permits.close();
        for slot in &self.slots {
            if let Some(w) = slot.lock().await.take() {
                w.kill().await;
            }
        }
    }
}

impl Lease {
    /// The leased slot: a worker, or nothing when it must be filled.
    pub fn slot(&mut self) -> &mut Option<Worker> {
        &mut self.guard
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.pool
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(self.index);
    }
}
