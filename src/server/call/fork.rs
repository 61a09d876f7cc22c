//! `fork_sandbox`'s copy ([`Executor::fork`]: files, state, metrics) and its hand-over (checkpoints, docs/architecture.md §3.4): the source's interpreter holds exactly the state a
//! fork starts from (its last completed call's, which its checkpoint keeps), so the copy takes
//! that interpreter, reseeded as `os.fork` reseeds a child, and its first call restores
//! nothing. The source keeps the checkpoint and resumes it into a new interpreter in the
//! background, once the copy's first call ended (or after [`COPY_GOES_FIRST`]); a call of the
//! source that comes first resumes it itself. Neither side's notes mention it: nothing was
//! lost.
//!
//! Without this, the copy's first call restores the state into a new interpreter: tens of MiB
//! through a pipe for a sandbox that holds a few MiB of data (docs/architecture.md §3.4).

use crate::metrics::ForkKind;
use crate::sandbox::checkpoint::Kept;
use crate::sandbox::files::name_list;
use crate::sandbox::live::Sandbox;
use crate::server::call::execute::Executor;
use crate::server::call::state_note::Restart;
use crate::worker::client::{Deadline, Phase, Worker};
use std::sync::Arc;
use std::time::Duration;

/// The first words of the `state` note of a fork's first call, when it got the source's
/// interpreter state.
pub const FORKED: &str = "forked: this sandbox started as a copy of another sandbox as its last completed call left it (variables, functions, imports and installed packages)";

/// The first words of that note when the source had no interpreter state to copy.
pub const FORKED_WITHOUT_STATE: &str = "forked: this sandbox started as a copy of another sandbox, which held no interpreter state to copy (no completed call in its current interpreter, or an interpreter not forked from a zygote, as with `--no-zygote`): only its files and dependencies were copied";

/// What a fork copied of its source ([`Executor::fork`]).
pub struct ForkCopy {
    /// The copy starts with the source's interpreter state (else files and dependencies only).
    pub had_state: bool,
    /// The copy took the source's interpreter ([`Executor::hand_over`]).
    pub handed_over: bool,
    /// The source's files that had no copy to give (over `--max-session-file-bytes`).
    pub not_copied: Vec<String>,
}

impl ForkCopy {
    /// How the copy got its state, as the metric counts it.
    pub fn kind(&self) -> ForkKind {
        match (self.had_state, self.handed_over) {
            (true, true) => ForkKind::HandedOver,
            (true, false) => ForkKind::Restored,
            (false, _) => ForkKind::NoState,
        }
    }

    /// The words that name the files not copied, if any.
    pub fn not_copied_words(&self) -> Option<String> {
        (!self.not_copied.is_empty()).then(|| {
            format!(
                "these files of the other sandbox could not be copied (over --max-session-file-bytes): {}",
                name_list(&self.not_copied)
            )
        })
    }

    /// The first words of the copy's first `state` note.
    fn note(&self) -> String {
        let mut note = if self.had_state {
            FORKED.to_owned()
        } else {
            FORKED_WITHOUT_STATE.to_owned()
        };
        if let Some(words) = self.not_copied_words() {
            note.push_str("; ");
            note.push_str(&words);
        }
        note
    }
}

/// How long the reseed of a handed-over interpreter may take (seconds): one round trip.
const RESEED_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the warm-up of a resumed source may take (`Request::WarmUp`; ~1 ms normally).
const WARM_UP_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the source's resume waits for the copy's first call to end (seconds): an agent
/// that forks usually runs code in the copy next, and on a small machine the two would compete
/// for the cores; a call of the source meanwhile resumes it itself.
const COPY_GOES_FIRST: Duration = Duration::from_secs(1);

impl Executor {
    /// Makes `copy` (a sandbox just made) a fork of `source`, whose queue the caller holds in
    /// `slot`: the source's files (those with a copy), `kept` (its [`KeptState::for_fork`](crate::sandbox::kept::KeptState::for_fork)) as
    /// the copy's state, and its interpreter when it can be handed over. Nothing awaits before
    /// the copy is whole, so no call of it can queue first. Counted in the metrics.
    pub async fn fork(
        self: &Arc<Self>,
        slot: &mut Option<Worker>,
        source: &Arc<Sandbox>,
        copy: &Arc<Sandbox>,
        kept: Option<Kept>,
    ) -> ForkCopy {
        let cap = self.settings.limits.max_session_file_bytes;
        let (copies, not_copied) = source.with_files(|f| (f.copies(), f.without_copy()));
        copy.with_files(|f| {
            for (path, bytes) in copies {
                f.keep(&path, bytes.as_ref().clone(), cap);
            }
        });
        let mut forked = ForkCopy {
            had_state: kept.is_some(),
            handed_over: false,
            not_copied,
        };
        copy.begin_as_fork(kept, forked.note());
        forked.handed_over = forked.had_state
            && forked.not_copied.is_empty()
            && self.hand_over(slot, source, copy).await;
        crate::metrics::sandbox_forked(forked.kind());
        tracing::debug!(
            "sandbox {} forked ({})",
            copy.id.short(),
            match forked.kind() {
                ForkKind::HandedOver => "with its interpreter state, in the source's interpreter",
                ForkKind::Restored => "with its interpreter state",
                ForkKind::NoState => "files and dependencies",
            }
        );
        forked
    }

    /// Gives the interpreter in the source's `slot` (held: the source's calls wait) to `copy`,
    /// a fork of `source` just made with the source's state, and starts resuming the source's
    /// kept state into a new interpreter. The caller checks that the state is current and that
    /// every file of the source has a copy (an interpreter resumed from the copies has them
    /// all). `false` when nothing was handed over (no interpreter, one that ended, a reseed
    /// that failed): the copy then restores the state at its first call.
    pub async fn hand_over(
        self: &Arc<Self>,
        slot: &mut Option<Worker>,
        source: &Arc<Sandbox>,
        copy: &Arc<Sandbox>,
    ) -> bool {
        if !self.checkpoints(source) || !source.state.is_current() {
            return false;
        }
        let Some(worker) = slot.as_mut() else {
            return false;
        };
        if worker.has_ended() {
            return false;
        }
        match worker
            .reseed(Deadline::after(RESEED_TIMEOUT, Phase::Restoring))
            .await
        {
            Ok(None) => {}
            Ok(Some(why)) => {
                tracing::warn!("sandbox {}: reseed refused: {why}", source.id.short());
                return false;
            }
            Err(e) => {
                tracing::warn!("sandbox {}: reseed failed: {e}", source.id.short());
                if let Some(worker) = slot.take() {
                    worker.kill_soon();
                }
                return false;
            }
        }
        let files: Vec<String> =
            copy.with_files(|f| f.copies().into_iter().map(|(path, _)| path).collect());
        if !copy.take_worker(slot, &files_words(&files)) {
            return false;
        }
        source.state.lend_interpreter();
        let executor = Arc::clone(self);
        let (source, copy) = (Arc::clone(source), Arc::clone(copy));
        tokio::spawn(async move {
            let _ = tokio::time::timeout(COPY_GOES_FIRST, copy.a_call_ended()).await;
            executor.resume_lender(&source).await;
        });
        true
    }

    /// Resumes the kept state of `sandbox`, whose interpreter went to a fork, into a new one,
    /// unless a call of it got there first or it ended.
    async fn resume_lender(&self, sandbox: &Sandbox) {
        let mut slot = sandbox.queue(None).await;
        if slot.is_some() || sandbox.has_ended() {
            return;
        }
        let Ok(mut worker) = self.take_worker(sandbox).await else {
            return;
        };
        self.adopt(sandbox, &mut worker, Restart::Stopped).await;
        // Off every caller's path: the next call (often the next fork's copy) then finds the
        // engine's pages copied from the zygote already.
        let deadline = Deadline::after(WARM_UP_TIMEOUT, Phase::Restoring);
        if let Err(e) = worker.warm_up(deadline).await {
            // Its next call resumes the kept state into another interpreter.
            tracing::warn!("sandbox {}: {e}", sandbox.id.short());
            worker.kill_soon();
            return;
        }
        *slot = Some(worker);
    }
}

/// What a handed-over copy's note says of its files.
fn files_words(files: &[String]) -> String {
    if files.is_empty() {
        String::new()
    } else {
        format!("; the sandbox's files were copied: {}", name_list(files))
    }
}
