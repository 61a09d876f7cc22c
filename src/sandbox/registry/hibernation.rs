//! The registry's side of hibernation (`--hibernate-after`, docs/architecture.md §3.4): a
//! sandbox idle past the bound, or the least recently used one at `--max-sandboxes`, has its
//! state written to disk and its worker killed; its next call restores it.

use super::Registry;
use crate::sandbox::handle::SandboxId;
use crate::sandbox::hibernation::HibernationError;
use crate::sandbox::live::Sandbox;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::time::Instant;

impl Registry {
    /// At the cap: hibernates the least recently used idle sandbox that can (it holds a worker
    /// and a current state), rather than end one; whether one did. Writes a few hundred KiB
    /// while the registry is locked: rare (only at the cap), and shorter than a new worker.
    pub(super) fn hibernate_one(&self, live: &HashMap<SandboxId, Arc<Sandbox>>) -> bool {
        let Some(hibernation) = &self.hibernation else {
            return false;
        };
        let mut idle: Vec<_> = live
            .values()
            .filter(|s| s.state.is_current() && s.has_idle_interpreter())
            .filter_map(|s| s.activity().idle_since().map(|since| (since, s.clone())))
            .collect();
        idle.sort_by_key(|(since, _)| *since);
        for (_, sandbox) in idle {
            match sandbox.hibernate(hibernation) {
                Ok(true) => {
                    tracing::info!(
                        "sandbox {} hibernated to make room (--max-sandboxes {})",
                        sandbox.id.short(),
                        self.limits.max
                    );
                    crate::metrics::sandbox_hibernated();
                    return true;
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!("sandbox {}: {e}", sandbox.id.short());
                    return false;
                }
            }
        }
        false
    }

    /// Hibernates the sandboxes idle past `--hibernate-after` (their state goes to disk, their
    /// worker is killed), outside the registry's lock.
    pub(super) async fn hibernate_idle(&self) {
        let Some(hibernation) = &self.hibernation else {
            return;
        };
        let due: Vec<Arc<Sandbox>> = self
            .live()
            .values()
            .filter(|s| {
                s.activity()
                    .idle_at(hibernation.after)
                    .is_some_and(|at| at <= Instant::now())
            })
            .filter(|s| s.state.is_current() && s.has_idle_interpreter())
            .cloned()
            .collect();
        for sandbox in due {
            let home = hibernation.clone();
            let short = sandbox.id.short().to_string();
            match tokio::task::spawn_blocking(move || sandbox.hibernate(&home)).await {
                Ok(Ok(true)) => {
                    tracing::debug!("sandbox {short} hibernated");
                    crate::metrics::sandbox_hibernated();
                }
                Ok(Ok(false)) => {}
                Ok(Err(HibernationError::Full)) => {
                    tracing::info!(
                        "sandbox {short} stays awake: --max-hibernated-bytes is reached"
                    );
                }
                Ok(Err(e)) => tracing::warn!("sandbox {short}: {e}"),
                Err(e) => tracing::warn!("sandbox {short}: hibernation stopped: {e}"),
            }
        }
    }
}
