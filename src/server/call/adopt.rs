//! A new worker's adoption of its sandbox (`--stateful`, docs/architecture.md §3.4): the kept
//! interpreter state resumed into it (or a clean worker when that fails), the front's copies of
//! the sandbox's files written into it, and the `state` note of its next call, which says what
//! came back and what is gone.

use crate::sandbox::live::Sandbox;
use crate::server::call::checkpoints::Resumed;
use crate::server::call::execute::Executor;
use crate::server::call::files::FILE_TIMEOUT;
use crate::server::call::state_note::{append_files, Restart};
use crate::worker::client::{Deadline, Phase, Worker};

/// What a restored sandbox's note says when its interpreter state came back.
const BACK: &str =
    "the variables, functions and imports are back as its last completed call left them";

/// What it says when they did not.
const GONE: &str = "the variables, functions and imports of earlier calls are gone";

/// The sandbox's files as written into a new worker: those written, and those lost (removed
/// from the front's copies too).
struct FilesBack {
    restored: Vec<String>,
    lost: Vec<String>,
}

impl Executor {
    /// A new worker for `sandbox` (`--stateful`): when the sandbox had one before, its kept
    /// state is resumed and its kept files are written into it, and its next call gets a
    /// `state` note that says so (nothing when a hibernated or lending sandbox got all back).
    pub(super) async fn adopt(&self, sandbox: &Sandbox, worker: &mut Worker, why: Restart) {
        if sandbox.notes.first_interpreter() {
            return;
        }
        let hibernated = sandbox.state.is_hibernated();
        let resumed = self.resume_or_replace(sandbox, worker).await;
        // A sandbox that hibernated, or lent its interpreter to a fork, lost nothing: it says
        // nothing when all came back. (Taken after the resume, whose wake sets it.)
        let quiet = sandbox.state.take_resume_quietly() || hibernated;
        let files = write_files_back(sandbox, worker).await;
        // Worded even when it is not said: the fork's and the restore's first words are taken
        // by this adoption, never left for a later one.
        let note = adoption_note(sandbox, &resumed, why, &files);
        if quiet && matches!(resumed, Resumed::Restored) && files.lost.is_empty() {
            return;
        }
        sandbox.notes.set(note);
    }

    /// Restores the sandbox's kept state into `worker` ([`Executor::resume`]); a worker whose
    /// restore failed is replaced by a clean one. A worker that was not restored is not what
    /// the kept state measures against, so the state is forgotten.
    async fn resume_or_replace(&self, sandbox: &Sandbox, worker: &mut Worker) -> Resumed {
        let resumed = if self.checkpoints(sandbox) {
            self.resume(sandbox, worker).await
        } else {
            Resumed::Nothing
        };
        if let Resumed::Failed(why) = &resumed {
            tracing::warn!("sandbox {}: restore failed: {why}", sandbox.id.short());
            if let Ok(fresh) = self.take_worker(sandbox).await {
                std::mem::replace(worker, fresh).kill_soon();
            }
        }
        if !matches!(resumed, Resumed::Restored) {
            sandbox.state.forget();
        }
        resumed
    }
}

/// Writes the front's copies of the sandbox's files into `worker`; a file that cannot be
/// written is lost.
async fn write_files_back(sandbox: &Sandbox, worker: &mut Worker) -> FilesBack {
    let mut files = FilesBack {
        restored: Vec::new(),
        lost: Vec::new(),
    };
    for (path, bytes) in sandbox.with_files(|f| f.copies()) {
        let deadline = Deadline::after(FILE_TIMEOUT, Phase::Writing);
        match worker.write_file(&path, Some(&bytes), deadline).await {
            Ok(()) => files.restored.push(path),
            _ => {
                sandbox.with_files(|f| f.remove(&path));
                files.lost.push(path);
            }
        }
    }
    files
}

/// The `state` note of the adopting worker's next call. A fork, or a sandbox restored from the
/// state directory, says so rather than why a restart.
fn adoption_note(sandbox: &Sandbox, resumed: &Resumed, why: Restart, files: &FilesBack) -> String {
    let fork_note = sandbox.notes.take_fork();
    let mut note = match (fork_note, sandbox.notes.take_restored(), resumed) {
        (Some(forked), _, Resumed::Failed(failed)) => format!(
            "{forked}; but the interpreter state it was given could not be restored ({failed}), so its variables, functions and imports are gone"
        ),
        (Some(forked), _, _) => forked,
        (None, Some(taken_over), Resumed::Restored) => format!("restored: {taken_over}; {BACK}"),
        (None, Some(taken_over), Resumed::Nothing) => format!("new: {taken_over}; {GONE}"),
        (None, Some(taken_over), Resumed::Failed(failed)) => {
            format!("new: {taken_over}; its saved interpreter state could not be loaded here ({failed}); {GONE}")
        }
        (None, None, Resumed::Restored) => why.restored_note().to_owned(),
        (None, None, Resumed::Nothing) => why.note().to_owned(),
        (None, None, Resumed::Failed(failed)) => format!(
            "{}; its last checkpoint could not be restored: {failed}",
            why.note()
        ),
    };
    append_files(
        &mut note,
        "the sandbox's files were restored",
        &files.restored,
    );
    append_files(&mut note, "these files could not be restored", &files.lost);
    note
}
