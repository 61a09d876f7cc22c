//! A sandbox's kept interpreter state (`--stateful`, docs/architecture.md §3.4): the
//! checkpoint its last completed call left, or why there is none, where it lives (in memory,
//! or on disk while the sandbox hibernates), and what the state directory's next checkpoint
//! file of it is. Apart from [`Sandbox`](super::live::Sandbox), which holds one, so that the
//! rules for the state read in one place.

use super::checkpoint::sealed::SealError;
use super::checkpoint::{file, CheckpointError, Kept, Resumable, Saved, Written};
use super::handle::SandboxId;
use super::hibernation::{Hibernation, HibernationError};
use super::state_dir::{CheckpointWrite, MAX_CHAIN_FILES};
use crate::protocol::pages::{Pages, ZygoteId};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// How many times its image's pages a sandbox's checkpoint deltas in the state directory may
/// hold before a save writes the image whole again: a call tends to change the same pages
/// (the allocator's, the interpreter's frames) as the call before it, so the chain grows by
/// about what a call changes, and a restore reads at most this many images more than one.
const MAX_DELTA_RATIO: u64 = 2;

/// Why a sandbox's interpreter state cannot be forked ([`KeptState::for_fork`]); its text is
/// for a model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unforkable {
    /// The state its last completed call left could not be captured: the worker's words
    /// (Python holds a JavaScript object, the interpreter was not forked from the zygote …).
    #[error("{0}")]
    Uncaptured(String),
    /// Its last checkpoint is older than its last completed call.
    #[error("its last checkpoint is out of date")]
    Stale,
}

/// One sandbox's kept state (see the module's documentation).
#[derive(Default)]
pub struct KeptState {
    /// The interpreter's state as its last completed call left it.
    saved: Mutex<Saved>,
    /// Why the state its last completed call left could not be captured, until a later
    /// call's can be or a new interpreter starts from scratch (locked after `saved`).
    uncaptured: Mutex<Option<String>>,
    /// Its next interpreter resumes the state without a note, since nothing was lost: it
    /// hibernated and its state was read back (by a fork), or its interpreter went to a fork.
    resume_quietly: AtomicBool,
}

impl KeptState {
    fn saved(&self) -> MutexGuard<'_, Saved> {
        self.saved.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn uncaptured(&self) -> MutexGuard<'_, Option<String>> {
        self.uncaptured.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps its worker's checkpoint ([`Saved::take`]); returns the bytes of pages kept.
    ///
    /// Errors: [`CheckpointError`] when the pages do not fit; the kept state is cleared.
    pub fn keep(
        &self,
        zygote: ZygoteId,
        pages: &Pages,
        installed: Vec<(String, String)>,
    ) -> Result<u64, CheckpointError> {
        let mut saved = self.saved();
        *self.uncaptured() = None;
        saved.take(zygote, pages, installed)
    }

    /// Whether it holds the state its last completed call left.
    pub fn is_current(&self) -> bool {
        matches!(*self.saved(), Saved::Current(_))
    }

    /// Its last call's state could not be captured ([`Saved::stale`]), for the reasons `why`
    /// (words for a model: what the interpreter holds that a checkpoint cannot).
    pub fn stale(&self, why: &str) {
        let mut saved = self.saved();
        saved.stale();
        *self.uncaptured() = Some(why.to_owned());
    }

    /// The state is gone (a restore failed, the state was reset, or a worker that was not
    /// restored took over).
    pub fn forget(&self) {
        let mut saved = self.saved();
        // A hibernated state's file goes too (and stops counting against the disk bound).
        if let Saved::Hibernated(spilled) = &*saved {
            spilled.home.forget(spilled);
        }
        *saved = Saved::Empty;
        *self.uncaptured() = None;
        self.resume_quietly.store(false, Ordering::SeqCst);
    }

    /// What a restore of the state into a new worker needs, when it is current.
    pub fn resumable(&self) -> Option<Resumable> {
        self.saved().resumable()
    }

    /// A copy of the current state (what a save writes), if there is one.
    pub fn current(&self) -> Option<Kept> {
        match &*self.saved() {
            Saved::Current(kept) => Some(kept.clone()),
            _ => None,
        }
    }

    /// Starts with `kept` as the current state (a fork's, or one read from the state
    /// directory).
    pub fn adopt(&self, kept: Kept) {
        *self.saved() = Saved::Current(kept);
    }

    /// The sandbox's interpreter went to a fork of it: its next one resumes quietly.
    pub fn lend_interpreter(&self) {
        self.resume_quietly.store(true, Ordering::SeqCst);
    }

    /// Whether the next interpreter resumes quietly (see [`KeptState::lend_interpreter`],
    /// [`KeptState::wake`]), and forgets it.
    pub fn take_resume_quietly(&self) -> bool {
        self.resume_quietly.swap(false, Ordering::SeqCst)
    }

    /// Moves the current state to disk through `hibernation`, for sandbox `id`. `Ok(false)`
    /// when there is no current state to move.
    ///
    /// Errors: [`HibernationError`] when the state could not be written (it stays in memory).
    pub fn spill(
        &self,
        id: &SandboxId,
        hibernation: &Arc<Hibernation>,
    ) -> Result<bool, HibernationError> {
        let Some(kept) = self.current() else {
            return Ok(false);
        };
        let spilled = hibernation.spill(id, &kept)?;
        *self.saved() = Saved::Hibernated(spilled);
        Ok(true)
    }

    /// Whether the state is on disk ([`KeptState::spill`]).
    pub fn is_hibernated(&self) -> bool {
        matches!(*self.saved(), Saved::Hibernated(_))
    }

    /// Brings a hibernated state of sandbox `id` back from disk (a blocking read of a few
    /// hundred KiB), so that it can be restored; nothing when it is not hibernated.
    ///
    /// Errors: [`HibernationError`]; the state is then gone.
    pub fn wake(&self, id: &SandboxId) -> Result<(), HibernationError> {
        let spilled = match &*self.saved() {
            Saved::Hibernated(spilled) => spilled.clone(),
            _ => return Ok(()),
        };
        *self.saved() = Saved::Empty;
        let kept = spilled.home.take(id, &spilled)?;
        *self.saved() = Saved::Current(kept);
        // Read back ahead of its next interpreter (a fork's copy took the state): that one
        // resumes it as after hibernation, quietly.
        self.resume_quietly.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// What a fork of sandbox `id` starts from (`fork_sandbox`; call it while holding the
    /// sandbox's queue, so that no call of it runs meanwhile): the state as its last completed
    /// call left it, marked so that the first restore reseeds `random` ([`Saved::for_fork`]);
    /// `None` when there is none to give (no call completed in its interpreter, or the
    /// interpreter that ran them is gone with its state). A hibernated state is read back
    /// first, and stays in memory until the next worker.
    ///
    /// Errors: [`Unforkable`]: why the state its last completed call left could not be
    /// captured, in words for a model.
    pub fn for_fork(&self, id: &SandboxId) -> Result<Option<Kept>, Unforkable> {
        if let Err(e) = self.wake(id) {
            tracing::warn!("sandbox {}: {e}", id.short());
        }
        if let Some(kept) = self.saved().for_fork() {
            return Ok(Some(kept));
        }
        let stale = matches!(*self.saved(), Saved::Stale(_));
        match (stale, self.uncaptured().clone()) {
            (_, Some(why)) => Err(Unforkable::Uncaptured(why)),
            (true, None) => Err(Unforkable::Stale),
            (false, None) => Ok(None),
        }
    }

    /// The current state of sandbox `id` as the state directory's next checkpoint file, sealed
    /// for its handle under `generation` ([`file`](mod@file)): a delta of the pages changed since the
    /// file this replica last wrote of it, while the chain's deltas hold at most
    /// [`MAX_DELTA_RATIO`] times the image's pages and it has fewer than [`MAX_CHAIN_FILES`]
    /// files; else the image whole. `None` when there is no current state (a save then removes
    /// the chain). The chain is recorded as written; a save that fails calls
    /// [`KeptState::chain_unwritten`]. Called under the sandbox's save turn.
    ///
    /// Errors: [`SealError`] (nothing is recorded as written then).
    pub fn next_file(
        &self,
        id: &SandboxId,
        generation: u64,
    ) -> Option<Result<CheckpointWrite, SealError>> {
        let mut saved = self.saved();
        let Saved::Current(kept) = &mut *saved else {
            return None;
        };
        let written = kept.written.take();
        let image_pages = kept.image.page_count() as u64;
        let delta = written.filter(|w| {
            w.files < MAX_CHAIN_FILES
                && w.delta_pages + w.changed.len() as u64 <= MAX_DELTA_RATIO * image_pages
        });
        tracing::debug!(
            "sandbox {}: checkpoint file: {}",
            id.short(),
            match &delta {
                Some(w) => format!("a delta of {} page(s)", w.changed.len()),
                None => format!("the image whole ({image_pages} page(s))"),
            }
        );
        let sealed = match &delta {
            Some(w) => file::write_delta(kept, &w.changed, generation, id.as_str(), &w.tail),
            None => file::write(kept, generation, id.as_str()),
        };
        Some(sealed.map(|bytes| record_written(kept, delta, bytes)))
    }

    /// A save of the state failed, or found another chain than the one it followed: the next
    /// save writes the image whole.
    pub fn chain_unwritten(&self) {
        if let Saved::Current(kept) | Saved::Stale(kept) = &mut *self.saved() {
            kept.written = None;
        }
    }
}

/// Records in `kept` that `bytes` were sealed as the chain's next file (after `delta`'s tail,
/// or as the image whole), and says how to write them.
fn record_written(kept: &mut Kept, delta: Option<Written>, bytes: Vec<u8>) -> CheckpointWrite {
    let sha256 = file::digest(&bytes);
    let (write, files, delta_pages) = match delta {
        Some(w) => {
            let delta_pages = w.delta_pages + w.changed.len() as u64;
            let write = CheckpointWrite::Delta {
                after: w.tail,
                file: bytes,
                sha256,
            };
            (write, w.files + 1, delta_pages)
        }
        None => (
            CheckpointWrite::Whole {
                file: bytes,
                sha256,
            },
            1,
            0,
        ),
    };
    kept.written = Some(Written {
        tail: sha256,
        files,
        delta_pages,
        changed: BTreeSet::new(),
    });
    write
}
