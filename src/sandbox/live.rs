//! One sandbox: a worker slot with its files and, with `--stateful`, its globals, the
//! arrival order of its calls, and its activity (docs/architecture.md §3).
//!
//! A sandbox gets a worker at its first call and keeps it for its whole life; calls to
//! one sandbox run one at a time, in the order they arrived ([`super::arrival`]), while
//! different sandboxes run in parallel. [`Sandbox::end`] kills the worker. What it keeps
//! between calls lives in parts of their own, each with its rules: the interpreter state
//! ([`super::kept`]), the `state` notes its next call is owed ([`super::notes`]) and its saves
//! to the state directory ([`super::saves`]); this file holds what ties them to the worker.

use super::activity::{Activity, InFlight};
use super::arrival::{Arrival, ArrivalOrder};
use super::checkpoint::Kept;
use super::files::SandboxFiles;
use super::handle::{MintError, SandboxId};
use super::hibernation::{Hibernation, HibernationError};
use super::kept::KeptState;
use super::notes::StateNotes;
use super::saves::SaveRecord;
use crate::protocol::launch::Runtime;
use crate::worker::client::Worker;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, OwnedMutexGuard};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Who holds a sandbox, which decides how it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// The default sandbox of a session (a stdio connection, a 2025-11-25 streamable-HTTP
    /// session, an SSE stream): it ends with the session, and the registry neither evicts nor
    /// expires it (the session's own idle time bounds it).
    Session,
    /// A sandbox reached by its handle alone (`create_sandbox`, or a call without a session):
    /// it ends when destroyed, idle past `--sandbox-idle-timeout`, older than
    /// `--sandbox-max-lifetime`, or evicted at `--max-sandboxes`. Whoever holds the handle may
    /// use it while there is no authentication; the scale-out issue binds it to a principal.
    Handle,
    /// A sandbox for one call only, never registered (a sessionless call of the drop-in
    /// mode, `warmup`, `example`).
    Call,
}

/// Who a request was authenticated as (`--auth-jwks`: the token's `iss` and `sub`;
/// `--auth-token-file`: the static token): a sandbox belongs to the principal that made it, and
/// only that principal reaches it (SEP-2567). Set by the HTTP front in the request's extensions.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Principal(pub String);

/// What a sandbox is made of, as `create_sandbox` asked (and a fork copies): each of its
/// workers is of `runtime` and has `dependencies` installed.
#[derive(Debug, Clone, Default)]
pub struct Makeup {
    /// PEP 508 requirements.
    pub dependencies: Vec<String>,
    /// `None`: the server's own runtime (`--runtime`).
    pub runtime: Option<Runtime>,
    /// The hosts its code may reach, within the server's `--allow-net`; `None`: all of those.
    pub allow_net: Option<Vec<String>>,
}

impl Makeup {
    /// `dependencies` in the server's own runtime.
    pub fn plain(dependencies: Vec<String>) -> Makeup {
        Makeup {
            dependencies,
            runtime: None,
            allow_net: None,
        }
    }
}

/// One sandbox (see the module's documentation).
pub struct Sandbox {
    /// Its handle, as clients name it.
    pub id: SandboxId,
    /// Who holds it.
    pub owner: Owner,
    /// The principal that made it, when the server authenticates callers: nobody else
    /// reaches it.
    pub principal: Option<Principal>,
    /// When it was made.
    pub created: Instant,
    /// When it was made, in seconds since the Unix epoch (on the replica that made it, for a
    /// restored sandbox): what the state directory records.
    pub created_unix: u64,
    /// Requirements given to `create_sandbox` (PEP 508): installed before it answered, and
    /// again into every later worker of the sandbox.
    pub dependencies: Vec<String>,
    /// The runtime `create_sandbox` asked for (`runtime`); `None`: the server's own
    /// (`--runtime`). Every worker of the sandbox is of it.
    pub runtime: Option<Runtime>,
    /// The hosts `create_sandbox` narrowed its code's network to (`allow_net`: entries of
    /// `--allow-net`'s forms, each within it, checked when it was made); `None`: the server's.
    pub allow_net: Option<Vec<String>>,
    /// `--stateful`: the interpreter's state as its last completed call left it.
    pub state: KeptState,
    /// `--stateful`: the `state` notes its next call is owed.
    pub notes: StateNotes,
    /// `--state-dir`: this replica's record of its saves.
    pub saves: SaveRecord,
    /// The worker, once the first call took one.
    worker: Arc<tokio::sync::Mutex<Option<Worker>>>,
    /// `--stateful`: the files in the interpreter's working directory after the last call (the
    /// sandbox's MCP resources), with the copies that outlive a stopped worker.
    files: Mutex<SandboxFiles>,
    /// Cancelled when the sandbox ends: a running call stops and sends no result.
    ended: CancellationToken,
    /// The order its calls were read in.
    order: ArrivalOrder,
    /// Its calls in flight and last use (for idle expiry and eviction).
    activity: Arc<Activity>,
    /// Notified as each `run_python_code` call of it ends (one permit kept when nobody waits).
    call_ended: Notify,
    /// Set while its last call's checkpoint is read after that call's answer
    /// ([`Sandbox::checkpointing`]): it holds its worker, though no call does.
    checkpointing: AtomicBool,
    /// Notified when such a checkpoint is kept and the worker given back.
    checkpoint_kept: Notify,
}

/// Marks a sandbox's checkpoint as being read after its call's answer, until dropped
/// ([`Sandbox::checkpointing`]).
pub struct Checkpointing(Arc<Sandbox>);

impl Drop for Checkpointing {
    fn drop(&mut self) {
        self.0.checkpointing.store(false, Ordering::SeqCst);
        self.0.checkpoint_kept.notify_waiters();
    }
}

impl Sandbox {
    /// A sandbox named `id`, held by `owner`, with no worker yet (it gets one at its first call)
    /// and `dependencies` to install into each of its workers.
    pub fn new(id: SandboxId, owner: Owner, dependencies: Vec<String>) -> Arc<Sandbox> {
        Sandbox::owned(id, owner, Makeup::plain(dependencies), None)
    }

    /// [`new`](Self::new), of `makeup` and belonging to `principal`.
    pub fn owned(
        id: SandboxId,
        owner: Owner,
        makeup: Makeup,
        principal: Option<Principal>,
    ) -> Arc<Sandbox> {
        Arc::new(Sandbox::fresh(id, owner, makeup, principal))
    }

    /// A sandbox made now, not yet shared.
    fn fresh(id: SandboxId, owner: Owner, makeup: Makeup, principal: Option<Principal>) -> Sandbox {
        Sandbox {
            id,
            owner,
            principal,
            created: Instant::now(),
            created_unix: crate::sandbox::state_dir::unix_now(),
            dependencies: makeup.dependencies,
            runtime: makeup.runtime,
            allow_net: makeup.allow_net,
            state: KeptState::default(),
            notes: StateNotes::default(),
            saves: SaveRecord::default(),
            worker: Arc::default(),
            checkpointing: AtomicBool::new(false),
            checkpoint_kept: Notify::new(),
            files: Mutex::default(),
            ended: CancellationToken::new(),
            order: ArrivalOrder::default(),
            activity: Activity::new(),
            call_ended: Notify::new(),
        }
    }

    /// A sandbox taken over from the state directory: named `id`, made at `created_unix` (seconds
    /// since the Unix epoch) on another replica, held under `generation`, with `files` (path,
    /// bytes, kept within `cap` bytes in all) as copies that its first worker gets, and
    /// `note` as the first words of that call's `state` note.
    pub fn restored(
        id: SandboxId,
        restored: crate::sandbox::state_dir::Restored,
        principal: Option<Principal>,
        cap: u64,
        note: String,
    ) -> Arc<Sandbox> {
        let now_unix = crate::sandbox::state_dir::unix_now();
        let age = Duration::from_secs(now_unix.saturating_sub(restored.created_unix));
        let makeup = Makeup {
            dependencies: restored.dependencies,
            runtime: restored.runtime,
            allow_net: restored.allow_net,
        };
        let mut sandbox = Sandbox::fresh(id, Owner::Handle, makeup, principal);
        sandbox.created = Instant::now().checked_sub(age).unwrap_or_else(Instant::now);
        sandbox.created_unix = restored.created_unix;
        let files = sandbox.files.get_mut().unwrap_or_else(|p| p.into_inner());
        for (path, bytes) in restored.files {
            files.keep(&path, bytes, cap);
        }
        // Its files as saved count as saved.
        sandbox.saves = SaveRecord::restored(restored.generation, files.version());
        // Its first worker is not its first: the kept files go into it, with the note.
        sandbox.notes.had_interpreter();
        sandbox.notes.set_restored(note);
        Arc::new(sandbox)
    }

    /// What it is made of, for a copy of it (`fork_sandbox`).
    pub fn makeup(&self) -> Makeup {
        Makeup {
            dependencies: self.dependencies.clone(),
            runtime: self.runtime,
            allow_net: self.allow_net.clone(),
        }
    }

    /// The files' version if they changed since the last save (`None`: nothing to write).
    pub fn unsaved_files(&self) -> Option<u64> {
        self.saves.unsaved(self.with_files(|f| f.version()))
    }

    /// Hibernates the sandbox when it holds an idle worker and a current state: the state
    /// goes to disk through `hibernation` and the worker is killed. `Ok(true)` when it did.
    ///
    /// Errors: [`HibernationError`] when the state could not be written (the worker stays).
    pub fn hibernate(&self, hibernation: &Arc<Hibernation>) -> Result<bool, HibernationError> {
        let Ok(mut slot) = self.worker.try_lock() else {
            return Ok(false);
        };
        if slot.is_none() || self.has_ended() || !self.state.spill(&self.id, hibernation)? {
            return Ok(false);
        }
        if let Some(worker) = slot.take() {
            kill_in_background(worker);
        }
        Ok(true)
    }

    /// Starts as a fork of another sandbox: with `kept` as its state when that had one (its
    /// first worker restores it, then gets its files), and `note` as the first words of its
    /// first call's `state` note.
    pub fn begin_as_fork(&self, kept: Option<Kept>, note: String) {
        if let Some(kept) = kept {
            self.state.adopt(kept);
        }
        // Its first worker is not its first: it gets the kept state and files, with the note.
        self.notes.had_interpreter();
        self.notes.set_fork(note);
    }

    /// Takes the worker in `from`, the interpreter of the sandbox it was forked from, which
    /// holds the state it starts with ([`Sandbox::begin_as_fork`]): its first call then
    /// restores nothing, and says the fork's note followed by `files_words`. Call it before its
    /// handle is given out. `false` (and `from` untouched) when it holds a worker already (it
    /// never does then).
    pub fn take_worker(&self, from: &mut Option<Worker>, files_words: &str) -> bool {
        let Ok(mut slot) = self.worker.try_lock() else {
            return false;
        };
        if slot.is_some() || from.is_none() {
            return false;
        }
        *slot = from.take();
        if let Some(note) = self.notes.take_fork() {
            self.notes.set(format!("{note}{files_words}"));
        }
        true
    }

    /// Its last call's checkpoint is read after that call's answer, with its worker held
    /// (`server::call::checkpoints`), until the guard is dropped: take it before the answer
    /// goes out, and drop it after the worker's guard, so that whoever
    /// [`settled`](Self::settled) waits finds the worker free.
    pub fn checkpointing(self: &Arc<Self>) -> Checkpointing {
        self.checkpointing.store(true, Ordering::SeqCst);
        Checkpointing(self.clone())
    }

    /// Resolves once a checkpoint being read after a call's answer is kept and its worker
    /// given back (about a millisecond): at once when none is; never waits for a call.
    pub async fn settled(&self) {
        let kept = self.checkpoint_kept.notified();
        tokio::pin!(kept);
        // Registered before the flag is read: a guard dropped in between still wakes it.
        kept.as_mut().enable();
        if self.checkpointing.load(Ordering::SeqCst) {
            kept.await;
        }
    }

    /// Whether a checkpoint is being read after a call's answer ([`Sandbox::checkpointing`]).
    pub fn is_checkpointing(&self) -> bool {
        self.checkpointing.load(Ordering::SeqCst)
    }

    /// A `run_python_code` call of it ended.
    pub fn end_call(&self) {
        self.call_ended.notify_one();
    }

    /// Resolves once a call of it has ended (at once when one ended since the last wait).
    pub async fn a_call_ended(&self) {
        self.call_ended.notified().await;
    }

    /// A sandbox for one call, never registered ([`Owner::Call`]): the caller ends it.
    ///
    /// Errors: [`MintError`] when the OS random source fails.
    pub fn for_one_call() -> Result<Arc<Sandbox>, MintError> {
        Ok(Sandbox::new(SandboxId::mint()?, Owner::Call, Vec::new()))
    }

    /// Whether `principal` may reach it: its own principal, or anyone when it has none.
    pub fn belongs_to(&self, principal: Option<&Principal>) -> bool {
        self.principal.is_none() || self.principal.as_ref() == principal
    }

    /// Its activity: in flight while a call of it runs or waits, idle since the last one.
    pub fn activity(&self) -> &Arc<Activity> {
        &self.activity
    }

    /// A use of the sandbox starts (a call, a file operation): it is neither evicted nor
    /// expired until the guard is dropped.
    pub fn begin(&self) -> InFlight {
        self.activity.begin()
    }

    /// Stamps a call as it is read: it will queue after every call stamped before it.
    pub fn arrive(&self) -> Arrival {
        self.order.stamp(&self.id)
    }

    /// Queues for the worker after every call stamped before `arrival` (when it was
    /// stamped for this sandbox; otherwise simply in the mutex's FIFO order).
    pub async fn queue(&self, arrival: Option<&Arrival>) -> OwnedMutexGuard<Option<Worker>> {
        self.order.queue(&self.id, arrival, &self.worker).await
    }

    /// The sandbox's files as the last call left them (path, size in bytes).
    pub fn files(&self) -> Vec<(String, u64)> {
        self.with_files(|f| f.listing())
    }

    /// Runs `f` on the sandbox's files (never across an `await`).
    pub(crate) fn with_files<T>(&self, f: impl FnOnce(&mut SandboxFiles) -> T) -> T {
        f(&mut self.files.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Whether it holds a worker that is not running a call now (for metrics).
    pub fn has_idle_interpreter(&self) -> bool {
        self.worker.try_lock().is_ok_and(|slot| slot.is_some())
    }

    /// Resolves once the sandbox has ended.
    pub async fn until_ended(&self) {
        self.ended.cancelled().await
    }

    /// Whether the sandbox has ended (destroyed, expired, evicted, or its session ended).
    pub fn has_ended(&self) -> bool {
        self.ended.is_cancelled()
    }

    /// Ends the sandbox: its worker is killed now if idle, or by the running call, which
    /// then sends no result.
    pub fn end(&self) {
        self.ended.cancel();
        let idle = match self.worker.try_lock() {
            Ok(mut slot) => slot.take(),
            // A call holds it: the call sees `ended` and kills it.
            Err(_) => None,
        };
        if let Some(worker) = idle {
            kill_in_background(worker);
        }
        if self.state.is_hibernated() {
            self.state.forget();
        }
    }
}

/// Kills `worker` and reaps it now rather than leave a zombie until tokio's orphan reaper
/// (outside a runtime, dropping it kills it).
fn kill_in_background(worker: Worker) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn(worker.kill())),
        Err(_) => drop(worker),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::pages::PAGE_BYTES;
    use crate::protocol::pages::{Pages, ZygoteId};
    use crate::sandbox::kept::Unforkable;

    fn sandbox() -> Arc<Sandbox> {
        Sandbox::new(SandboxId::mint().expect("mint"), Owner::Handle, Vec::new())
    }

    fn one_page() -> Pages {
        Pages {
            memory_bytes: 65536,
            indexes: vec![0],
            bytes: crate::protocol::pages::encode_whole_pages(&[7; PAGE_BYTES]),
        }
    }

    #[test]
    fn a_fork_gets_the_current_state_or_why_there_is_none() {
        let source = sandbox();
        let zygote = ZygoteId([1; 32]);
        assert!(matches!(source.state.for_fork(&source.id), Ok(None)));
        // A first call whose state could not be captured: refused, with why.
        source.state.stale("Python holds 1 JavaScript object(s)");
        assert_eq!(
            source.state.for_fork(&source.id).err(),
            Some(Unforkable::Uncaptured(
                "Python holds 1 JavaScript object(s)".to_owned()
            ))
        );
        // A later call's state is captured: it is the fork's, marked to reseed.
        source
            .state
            .keep(zygote, &one_page(), Vec::new())
            .expect("fits");
        let kept = source
            .state
            .for_fork(&source.id)
            .expect("current")
            .expect("kept");
        assert!(kept.reseed);
        // Stale again: refused; a new interpreter from scratch: nothing to copy.
        source.state.stale("1 file(s) are open");
        assert!(source.state.for_fork(&source.id).is_err());
        source.state.forget();
        assert!(matches!(source.state.for_fork(&source.id), Ok(None)));

        // The fork starts with the state, its first worker is not its first, and its note is
        // due.
        let fork = sandbox();
        fork.begin_as_fork(Some(kept), "forked: …".to_owned());
        assert!(fork.state.is_current() && !fork.notes.first_interpreter());
        assert!(fork.state.resumable().expect("current").reseed);
        assert_eq!(fork.notes.take_fork().as_deref(), Some("forked: …"));
        let empty = sandbox();
        empty.begin_as_fork(None, "forked".to_owned());
        assert!(!empty.state.is_current() && !empty.notes.first_interpreter());
    }
}
