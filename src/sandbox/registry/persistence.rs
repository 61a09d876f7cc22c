//! The registry's side of the shared state directory (`--state-dir`, docs/architecture.md
//! §3.1): a sandbox saved after each completed call, and one that another replica held
//! restored when a call names it here.

use super::{Entered, Missing, OpenError, Registry};
use crate::metrics::SaveResult;
use crate::sandbox::checkpoint::{self, sealed, Kept};
use crate::sandbox::handle::SandboxId;
use crate::sandbox::live::{Owner, Principal, Sandbox};
use crate::sandbox::state_dir::{
    blocking, CheckpointWrite, Claim, SavedCheckpoint, SavedFiles, StateDir, StateError,
};
use std::sync::Arc;
use tracing::Instrument as _;

impl Registry {
    /// Restores the sandbox named by `id` from the state directory (see [`open`](Self::open)).
    pub(super) async fn restore(
        &self,
        id: &SandboxId,
        missing: Missing,
        principal: Option<&Principal>,
    ) -> Result<Entered, OpenError> {
        let Some(state) = &self.state else {
            return Err(missing.into());
        };
        let _one_at_a_time = self.restoring.lock().await;
        // Another call may have restored it while this one waited.
        if let Ok(entered) = self.enter(id) {
            return Ok(entered);
        }
        let claim = {
            let (state, id, expiry) = (state.clone(), id.clone(), self.expiry());
            let owner = principal.map(|p| p.0.clone());
            blocking(move || state.claim(&id, expiry, owner.as_deref())).await
        };
        let mut restored = match claim {
            Ok(Claim::Restored(restored)) => restored,
            Ok(Claim::Absent) => return Err(missing.into()),
            Err(source) => {
                return Err(OpenError::State {
                    short: id.short().to_string(),
                    source,
                })
            }
        };
        tracing::info!(
            "sandbox {} restored from the state directory (generation {}, held before by replica {})",
            id.short(),
            restored.generation,
            restored.previous_replica
        );
        let (kept, refused_checkpoint) = self.open_checkpoint(id, &mut restored);
        let note = restored_note(&restored, refused_checkpoint);
        let sandbox = Sandbox::restored(
            id.clone(),
            restored,
            principal.cloned(),
            self.file_cap,
            note,
        );
        if let Some(kept) = kept {
            sandbox.state.adopt(kept);
        }
        crate::metrics::sandbox_restored();
        // No room: the restored sandbox is dropped again; its saved state stays for a retry.
        if let Err(full) = self.insert(sandbox.clone()) {
            tracing::warn!("sandbox {}: {full}", sandbox.id.short());
            return Err(missing.into());
        }
        let in_flight = sandbox.begin();
        Ok(Entered { sandbox, in_flight })
    }

    /// Opens the checkpoint chain a takeover read (`restored.checkpoint`, taken): the kept
    /// state when its files were sealed for `id`, by this build, in this order, under the
    /// generation the takeover found;
    /// otherwise why not (the sandbox comes back with its files only).
    pub(super) fn open_checkpoint(
        &self,
        id: &SandboxId,
        restored: &mut crate::sandbox::state_dir::Restored,
    ) -> (Option<Kept>, Option<sealed::Refused>) {
        let files = match std::mem::take(&mut restored.checkpoint) {
            SavedCheckpoint::None => return (None, None),
            SavedCheckpoint::NotTheLast => return (None, Some(sealed::Refused::Sealed)),
            SavedCheckpoint::Chain(files) => files,
        };
        match checkpoint::file::read_chain(&files, id.as_str(), checkpoint::MAX_MEMORY_BYTES) {
            Ok((generation, kept)) if generation + 1 == restored.generation => (Some(kept), None),
            // Sealed for this sandbox, but not by its last save: an older file put back.
            Ok(_) => (None, Some(sealed::Refused::Sealed)),
            Err(refused) => {
                tracing::warn!(
                    "sandbox {}: its checkpoint is refused: {refused}",
                    id.short()
                );
                (None, Some(refused))
            }
        }
    }

    /// Saves `sandbox` to the state directory after a completed call (its files only when they
    /// changed); nothing without `--state-dir` or for a sandbox that is not reached by handle.
    ///
    /// Errors: [`StateError::Superseded`] when another replica took it over while the call
    /// ran (this replica's copy is then dropped); the file system's.
    pub async fn save(&self, sandbox: &Arc<Sandbox>) -> Result<(), StateError> {
        let Some(state) = &self.state else {
            return Ok(());
        };
        if sandbox.owner != Owner::Handle || sandbox.has_ended() {
            return Ok(());
        }
        let version = sandbox.unsaved_files();
        // Copies and the files without one, read together: one state of the files.
        let snapshot = version.map(|_| {
            let (files, not_kept) = sandbox.with_files(|f| (f.copies(), f.without_copy()));
            SavedFiles {
                dependencies: sandbox.dependencies.clone(),
                runtime: sandbox.runtime,
                allow_net: sandbox.allow_net.clone(),
                files,
                not_kept,
            }
        });
        let (state, holder) = (state.clone(), sandbox.clone());
        // Saves of one sandbox write in turn: each delta follows the file the one before wrote.
        let _turn = sandbox.saves.turn.lock().await;
        let saved = blocking(move || write_save(&state, &holder, snapshot.as_ref()))
            .instrument(crate::traces::step("state save"))
            .await;
        match saved {
            Ok(generation) => {
                crate::metrics::state_saved(SaveResult::Ok);
                sandbox.saves.saved(generation, version);
                Ok(())
            }
            Err(e) => {
                sandbox.state.chain_unwritten();
                crate::metrics::state_saved(match e {
                    StateError::Superseded { .. } => SaveResult::Superseded,
                    _ => SaveResult::Error,
                });
                if let StateError::Superseded { .. } = e {
                    self.drop_stale(sandbox);
                }
                Err(e)
            }
        }
    }
}

/// Writes one save of `sandbox` into `state` (blocking): its files when `snapshot` has them, and
/// its checkpoint, sealed in place under the generation the save holds it under (see
/// [`StateDir::save`]). When another chain than the one this replica wrote is found, the image
/// goes whole. The generation saved.
///
/// Errors: [`StateError`], as [`StateDir::save`] has them.
fn write_save(
    state: &StateDir,
    sandbox: &Sandbox,
    snapshot: Option<&SavedFiles>,
) -> Result<u64, StateError> {
    let id = &sandbox.id;
    let (generation, created) = (sandbox.saves.generation(), sandbox.created_unix);
    let principal = sandbox.principal.as_ref().map(|p| p.0.as_str());
    let save = |checkpoint| {
        state.save(
            id,
            generation,
            created,
            principal,
            snapshot,
            Some(checkpoint),
        )
    };
    let write = || match sandbox.state.next_file(&sandbox.id, generation.max(1)) {
        Some(Ok(write)) => write,
        Some(Err(e)) => {
            tracing::warn!("sandbox {}: checkpoint not sealed: {e}", id.short());
            CheckpointWrite::Remove
        }
        None => CheckpointWrite::Remove,
    };
    let started = std::time::Instant::now();
    let checkpoint = write();
    let sealed = started.elapsed();
    let saved = match save(checkpoint) {
        Err(StateError::ChainMoved) => {
            sandbox.state.chain_unwritten();
            save(write())
        }
        saved => saved,
    };
    tracing::debug!(
        "sandbox {}: saved to the state directory in {} µs (its checkpoint file sealed in {} µs)",
        id.short(),
        started.elapsed().as_micros(),
        sealed.as_micros()
    );
    saved
}

/// What the `state` note of a restored sandbox's first call says of the takeover (the note's
/// first word and what became of the interpreter's state are added when its worker is
/// ready: `crate::server::call::files`); `refused_checkpoint`: why its saved interpreter state
/// was refused.
fn restored_note(
    restored: &crate::sandbox::state_dir::Restored,
    refused_checkpoint: Option<sealed::Refused>,
) -> String {
    if let Some(refused) = &restored.refused {
        return format!(
            "this sandbox's saved state in the shared state directory was refused whole ({refused}); it starts clean, without files or dependencies"
        );
    }
    let mut note = format!(
        "this sandbox was restored from the shared state directory on another replica (replica {} that held it stopped, was drained or lost it)",
        restored.previous_replica
    );
    if let Some(refused) = refused_checkpoint {
        note.push_str(&format!(
            "; its saved interpreter state was refused ({refused})"
        ));
    }
    if !restored.dependencies.is_empty() {
        note.push_str("; its dependencies are installed again: ");
        note.push_str(&restored.dependencies.join(", "));
    }
    if !restored.not_kept.is_empty() {
        note.push_str("; these files were too large to keep and are gone: ");
        note.push_str(&crate::sandbox::files::name_list(&restored.not_kept));
    }
    note
}
