//! The arrival order of a sandbox's calls: transports that read a session's messages in order
//! (stdio, SSE) stamp each call with its [`Arrival`] as the message is read, and a call queues
//! for the sandbox's worker only after every earlier stamped call has (docs/architecture.md
//! §3). Apart from the sandbox so that the rule reads in one place: rmcp hands each request to
//! a task of its own, where calls could otherwise overtake each other.

use super::handle::SandboxId;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, OwnedMutexGuard};
use tokio::time::Instant;

/// A call's place in its sandbox's arrival order, stamped by the transport as the request is
/// read. It counts only in the sandbox it was stamped for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrival {
    sandbox: SandboxId,
    n: u64,
}

/// How long a stamped call may take to reach its turn before later calls stop waiting for it
/// (seconds): a request the MCP layer answers without calling the tool never claims its turn.
const UNCLAIMED_ARRIVAL: Duration = Duration::from_secs(2);

/// Calls of a sandbox that were read but have not yet queued for its worker.
#[derive(Default)]
struct Arrivals {
    next: u64,
    /// Arrival number → when it was stamped.
    pending: BTreeMap<u64, Instant>,
}

/// One sandbox's arrival order.
#[derive(Default)]
pub struct ArrivalOrder {
    arrivals: Mutex<Arrivals>,
    /// Woken when a call leaves `arrivals`.
    queued: Notify,
}

impl ArrivalOrder {
    /// Stamps a call to sandbox `id` as it is read: it will queue after every call stamped
    /// before it.
    pub fn stamp(&self, id: &SandboxId) -> Arrival {
        let mut a = self.arrivals.lock().unwrap_or_else(|p| p.into_inner());
        let n = a.next;
        a.next += 1;
        a.pending.insert(n, Instant::now());
        Arrival {
            sandbox: id.clone(),
            n,
        }
    }

    /// Locks `slot` (the worker of sandbox `id`) after every call stamped before `arrival`
    /// (when it was stamped for `id`; otherwise simply in the mutex's FIFO order).
    pub async fn queue<T>(
        &self,
        id: &SandboxId,
        arrival: Option<&Arrival>,
        slot: &Arc<tokio::sync::Mutex<T>>,
    ) -> OwnedMutexGuard<T> {
        let Some(n) = arrival.filter(|a| a.sandbox == *id).map(|a| a.n) else {
            return slot.clone().lock_owned().await;
        };
        // Leaves the arrival order however this future ends (also when it is dropped).
        struct Leave<'a>(&'a ArrivalOrder, u64);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                self.0.leave(self.1);
            }
        }
        let leave = Leave(self, n);
        self.until_next(n).await;
        let lock = slot.clone().lock_owned();
        tokio::pin!(lock);
        // Take a place in the mutex's FIFO queue before letting the next call queue.
        if let std::task::Poll::Ready(guard) = futures::poll!(lock.as_mut()) {
            return guard;
        }
        drop(leave);
        lock.await
    }

    /// Resolves once arrival `n` is the earliest call still to queue.
    async fn until_next(&self, n: u64) {
        loop {
            let queued = self.queued.notified();
            tokio::pin!(queued);
            queued.as_mut().enable();
            if self.is_next(n) {
                return;
            }
            // Wake up at least when an unclaimed earlier call expires.
            let _ = tokio::time::timeout(UNCLAIMED_ARRIVAL, queued).await;
        }
    }

    /// Whether arrival `n` is the earliest call still to queue (forgetting calls stamped long
    /// ago that never came to queue).
    fn is_next(&self, n: u64) -> bool {
        let mut a = self.arrivals.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        a.pending
            .retain(|m, at| *m >= n || now.duration_since(*at) < UNCLAIMED_ARRIVAL);
        a.pending.keys().next().is_none_or(|first| *first >= n)
    }

    /// Arrival `n` has queued (or gave up): the next call may queue.
    fn leave(&self, n: u64) {
        self.arrivals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pending
            .remove(&n);
        self.queued.notify_waiters();
    }
}
