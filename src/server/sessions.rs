//! Protocol sessions, where a transport still has them (a stdio connection, a 2025-11-25
//! streamable-HTTP session, an SSE stream), bounded by `--max-sessions`: each owns a default
//! sandbox, made at its first use, that calls without `sandbox_id` run in and that ends with the
//! session (docs/architecture.md §3).

use crate::sandbox::handle::SandboxId;
use crate::sandbox::live::{Makeup, Owner, Principal, Sandbox};
use crate::sandbox::registry::{Registry, RegistryError};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

/// The live sessions, bounded by `--max-sessions`: every live session may hold a worker,
/// so the bound is what keeps the server's memory finite.
pub struct Sessions {
    live: AtomicUsize,
    /// Most live sessions.
    pub max: usize,
}

/// Refused because `--max-sessions` sessions are live.
#[derive(Debug, thiserror::Error)]
#[error("the server has reached its limit of {max} live sessions (--max-sessions); close a session or try again later")]
pub struct SessionsFull {
    pub max: usize,
}

impl Sessions {
    /// Room for `max` live sessions (at least 1).
    pub fn new(max: usize) -> Arc<Sessions> {
        Arc::new(Sessions {
            live: AtomicUsize::new(0),
            max: max.max(1),
        })
    }

    /// How many sessions are live.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }

    /// Whether a new session would be refused now.
    pub fn is_full(&self) -> bool {
        self.live.load(Ordering::SeqCst) >= self.max
    }

    /// Opens a session whose default sandbox will live in `registry`, or refuses when `max`
    /// are live.
    ///
    /// Errors: [`SessionsFull`].
    pub fn open(self: &Arc<Self>, registry: Arc<Registry>) -> Result<SessionGuard, SessionsFull> {
        let mut live = self.live.load(Ordering::SeqCst);
        loop {
            if live >= self.max {
                return Err(SessionsFull { max: self.max });
            }
            match self
                .live
                .compare_exchange(live, live + 1, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => break,
                Err(now) => live = now,
            }
        }
        Ok(SessionGuard {
            ended: CancellationToken::new(),
            default: Mutex::default(),
            registry,
            sessions: self.clone(),
        })
    }
}

/// One live session. Held only by the session's handler (never by a call's task), so that
/// when the transport drops the handler (stdio EOF, `DELETE /mcp`, idle expiry, SSE
/// disconnect, a sessionless request answered) the session ends and so does its default
/// sandbox, worker and all.
pub struct SessionGuard {
    /// Cancelled when the session ends: what stops the tasks that tell its client of changes.
    ended: CancellationToken,
    default: Mutex<Option<Arc<Sandbox>>>,
    registry: Arc<Registry>,
    sessions: Arc<Sessions>,
}

impl SessionGuard {
    /// The session's default sandbox, made at its first use (and again after
    /// `destroy_sandbox` ended it), belonging to `principal` when it is made.
    ///
    /// Errors: [`RegistryError`] when `--max-sandboxes` leaves no room.
    pub fn default_sandbox(
        &self,
        principal: Option<Principal>,
    ) -> Result<Arc<Sandbox>, RegistryError> {
        let mut slot = self.default.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(live) = slot.as_ref().filter(|s| !s.has_ended()) {
            return Ok(live.clone());
        }
        let made = self.registry.create_as(
            SandboxId::mint()?,
            Owner::Session,
            Makeup::default(),
            principal,
        )?;
        *slot = Some(made.clone());
        Ok(made)
    }

    /// A token cancelled when the session ends.
    pub fn ended(&self) -> CancellationToken {
        self.ended.clone()
    }

    /// The default sandbox if the session has made one and it is live.
    pub fn current_default(&self) -> Option<Arc<Sandbox>> {
        let slot = self.default.lock().unwrap_or_else(|p| p.into_inner());
        slot.as_ref().filter(|s| !s.has_ended()).cloned()
    }
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.ended.cancel();
        let default = self
            .default
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(sandbox) = default {
            self.registry.end(&sandbox.id);
        }
        self.sessions.live.fetch_sub(1, Ordering::SeqCst);
    }
}
