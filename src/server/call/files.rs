//! A sandbox's files across its workers (`--stateful`): the file tools' reads and
//! writes (`read_file`, `write_file`, `reset`), the copies the front keeps of what a call
//! wrote (`copy_files`, within `--max-session-file-bytes`); a new worker's adoption of them is
//! `adopt.rs`. They run through the sandbox's
//! queue like calls, so that a file operation sees the files of the calls that arrived before
//! it.

use crate::sandbox::arrival::Arrival;
use crate::sandbox::files::{Listing, SandboxFiles};
use crate::sandbox::live::Sandbox;
use crate::server::call::execute::Executor;
use crate::server::call::result::CallResult;
use crate::server::call::state_note::Restart;
use crate::worker::client::{self, Deadline, Phase, Worker, WorkerError};
use std::time::Duration;

/// How long reading, writing or removing one file in an interpreter may take (seconds).
pub(super) const FILE_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a file of a sandbox could not be read, written or removed.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// No such file, in the interpreter nor among the front's copies.
    #[error("the sandbox has no file {0:?}")]
    Missing(String),
    /// The interpreter refused: its own words (no such file, a directory, too large …).
    #[error("{0}")]
    Refused(String),
    /// The worker failed to answer (it is stopped; the copies of its files are kept).
    #[error(transparent)]
    Worker(#[from] WorkerError),
    /// No worker could be had to write into.
    #[error("no interpreter: {0}")]
    NoInterpreter(#[source] WorkerError),
}

/// A file operation's failure as the file tools word it: the worker's refusal in its own
/// words; a worker that failed to answer is stopped, and the copies the front holds of its
/// files are kept for the next one.
fn file_failure(
    slot: &mut Option<Worker>,
    sandbox: &Sandbox,
    error: client::FileError,
) -> FileError {
    match error {
        client::FileError::Refused { reason } => FileError::Refused(reason),
        client::FileError::Worker(e) => {
            if let Some(worker) = slot.take() {
                worker.kill_soon();
            }
            sandbox.with_files(SandboxFiles::survive);
            e.into()
        }
    }
}

impl Executor {
    /// `reset_session` (`--stateful`; despite its name it acts on a sandbox): once the
    /// sandbox's calls that arrived before it are done, stops its worker, so that its next
    /// call starts in a new one with fresh globals. That call has no `<state>` note: the client
    /// asked for the loss. Whether the sandbox's files (its resources) changed: they go too,
    /// copies included.
    pub async fn reset(&self, sandbox: &Sandbox, arrival: Option<&Arrival>) -> bool {
        let mut slot = sandbox.queue(arrival).await;
        if let Some(worker) = slot.take() {
            worker.kill_soon();
            self.replenish(sandbox);
        }
        sandbox.notes.forget_interpreters();
        sandbox.state.forget();
        sandbox.with_files(SandboxFiles::clear)
    }

    /// The bytes of file `path` in the sandbox's interpreter (a resource of `--stateful`), at
    /// most `--result-cap` of them, once the sandbox's running call is done; while it
    /// holds no worker, the front's copy. Errors say why in words: no such file, too large; a
    /// worker that fails to answer is stopped (its files' copies are kept).
    pub async fn read_file(&self, sandbox: &Sandbox, path: &str) -> Result<Vec<u8>, FileError> {
        let mut slot = sandbox.queue(None).await;
        let Some(worker) = slot.as_mut() else {
            return match sandbox.with_files(|f| f.copy_of(path)) {
                Some(bytes) => Ok(bytes.as_ref().clone()),
                None => Err(FileError::Missing(path.to_owned())),
            };
        };
        let deadline = Deadline::after(FILE_TIMEOUT, Phase::Reading);
        match worker
            .read_file(path, self.settings.limits.result_cap, deadline)
            .await
        {
            Ok(bytes) => Ok(bytes),
            Err(e) => Err(file_failure(&mut slot, sandbox, e)),
        }
    }

    /// `upload_file` / `delete_file` (`--stateful`): once the sandbox's earlier calls are done,
    /// writes `bytes` to file `path` of its working directory (taking a worker when it
    /// has none yet, with the sandbox's kept files), or removes that file when `bytes` is
    /// `None`. `Ok(changed)`: whether the sandbox's file list (its resources) changed. Errors
    /// say why in words; a worker that fails to answer is stopped (the copies the front holds
    /// of its files are kept).
    pub async fn write_file(
        &self,
        sandbox: &Sandbox,
        arrival: Option<&Arrival>,
        path: &str,
        bytes: Option<&[u8]>,
    ) -> Result<bool, FileError> {
        let mut slot = sandbox.queue(arrival).await;
        if slot.is_none() {
            if bytes.is_none() && sandbox.with_files(|f| f.copy_of(path)).is_none() {
                return Err(FileError::Missing(path.to_owned()));
            }
            let mut worker = self
                .take_worker(sandbox)
                .await
                .map_err(FileError::NoInterpreter)?;
            self.adopt(sandbox, &mut worker, Restart::Stopped).await;
            *slot = Some(worker);
        }
        let Some(worker) = slot.as_mut() else {
            return Err(FileError::NoInterpreter(WorkerError::Closed));
        };
        let deadline = Deadline::after(FILE_TIMEOUT, Phase::Writing);
        match worker.write_file(path, bytes, deadline).await {
            Ok(()) => Ok(sandbox.with_files(|f| match bytes {
                Some(bytes) => f.keep(
                    path,
                    bytes.to_vec(),
                    self.settings.limits.max_session_file_bytes,
                ),
                None => f.remove(path),
            })),
            Err(e) => Err(file_failure(&mut slot, sandbox, e)),
        }
    }

    /// After a call that kept its worker (`--stateful`): takes its listing of the working
    /// directory, and reads again the files that changed for the copies the front keeps (within
    /// `--max-session-file-bytes`).
    pub(super) async fn copy_files(
        &self,
        sandbox: &Sandbox,
        worker: &mut Worker,
        listing: Listing,
        result: &mut CallResult,
    ) {
        let cap = self.settings.limits.max_session_file_bytes;
        result.files_changed = sandbox.with_files(|f| f.observe(&listing.files));
        let listed: std::collections::HashMap<&str, u64> = listing
            .files
            .iter()
            .map(|(p, n)| (p.as_str(), *n))
            .collect();
        for path in listing.refresh {
            let Some(&size) = listed.get(path.as_str()) else {
                continue;
            };
            let room = sandbox.with_files(|f| f.room_for(&path, cap));
            if size > room {
                continue;
            }
            let deadline = Deadline::after(FILE_TIMEOUT, Phase::Reading);
            // A file the code changes again between the listing and this read is copied as
            // it is now; the next call's listing sees the change and reads it again.
            if let Ok(bytes) = worker.read_file(&path, room as usize, deadline).await {
                sandbox.with_files(|f| f.keep(&path, bytes, cap));
            }
        }
    }
}
