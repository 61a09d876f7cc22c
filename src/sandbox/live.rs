//! One sandbox: a worker slot with its files and, with `--stateful`, its globals, the
//! arrival order of its calls, and its activity (docs/architecture.md §3).
//!
//! A sandbox gets a worker at its first call and keeps it for its whole life; calls to
//! one sandbox run one at a time, in the order they arrived, while different sandboxes run in
//! parallel. Transports that read a session's messages in order (stdio, SSE) stamp each call
//! with its [`Arrival`] in the sandbox it names as the message is read; a call then queues for
//! the worker (a fair mutex) only after every earlier stamped call has. [`Sandbox::end`] kills
//! the worker.

use super::activity::{Activity, InFlight};
use super::checkpoint::sealed::SealError;
use super::checkpoint::{file, CheckpointError, Kept, Resumable, Saved, Written};
use super::files::SandboxFiles;
use super::handle::{MintError, SandboxId};
use super::hibernation::{Hibernation, HibernationError};
use super::state_dir::{CheckpointWrite, MAX_CHAIN_FILES};
use crate::protocol::pages::{Pages, ZygoteId};
use crate::worker::client::Worker;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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

/// A call's place in its sandbox's arrival order, stamped by the transport as the request is
/// read (before rmcp hands it to a task of its own, where calls could overtake each other).
/// It counts only in the sandbox it was stamped for.
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

/// Why a sandbox's interpreter state cannot be forked ([`Sandbox::fork_state`]); its text is
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
    /// The worker, once the first call took one.
    worker: Arc<tokio::sync::Mutex<Option<Worker>>>,
    /// Whether the sandbox has had a worker (so a new one means its state was lost).
    had_interpreter: AtomicBool,
    /// `--stateful`: the `state` note for the sandbox's next call, when its worker was
    /// replaced since its last one (what was lost, which files were restored).
    new_interpreter_note: Mutex<Option<String>>,
    /// `--stateful`: the files in the interpreter's working directory after the last call (the
    /// sandbox's MCP resources), with the copies that outlive a stopped worker.
    files: Mutex<SandboxFiles>,
    /// Cancelled when the sandbox ends: a running call stops and sends no result.
    ended: CancellationToken,
    arrivals: Mutex<Arrivals>,
    /// Woken when a call leaves `arrivals`.
    queued: Notify,
    /// Its calls in flight and last use (for idle expiry and eviction).
    activity: Arc<Activity>,
    /// `--state-dir`: the generation this replica holds it under (0: never saved).
    generation: AtomicU64,
    /// `--state-dir`: the [`SandboxFiles::version`] last saved.
    saved_files: Mutex<Option<u64>>,
    /// `--state-dir`: held across a save, so that its saves write in the order they took its
    /// state (each checkpoint delta follows the file the save before it wrote).
    pub save_turn: tokio::sync::Mutex<()>,
    /// `--state-dir`: the first words of the `state` note of the first call after a restore
    /// from the state directory (what came back, what was lost).
    restored_note: Mutex<Option<String>>,
    /// `--stateful`: the interpreter's state as its last completed call left it (checkpoints, docs/architecture.md §3.4).
    saved: Mutex<Saved>,
    /// `--stateful`: why the state its last completed call left could not be captured, until
    /// a later call's can be or a new interpreter starts from scratch (locked after `saved`).
    uncaptured: Mutex<Option<String>>,
    /// `fork_sandbox`: the first words of the `state` note of a fork's first call.
    fork_note: Mutex<Option<String>>,
    /// Its next interpreter resumes its kept state without a note, since nothing was lost: it
    /// hibernated and its state was read back (by a fork), or its interpreter went to a fork.
    resume_quietly: AtomicBool,
    /// Notified as each `run_python_code` call of it ends (one permit kept when nobody waits).
    call_ended: Notify,
}

/// How many times its image's pages a sandbox's checkpoint deltas in the state directory may
/// hold before a save writes the image whole again: a call tends to change the same pages
/// (the allocator's, the interpreter's frames) as the call before it, so the chain grows by
/// about what a call changes, and a restore reads at most this many images more than one.
const MAX_DELTA_RATIO: u64 = 2;

impl Sandbox {
    /// A sandbox named `id`, held by `owner`, with no worker yet (it gets one at its first call)
    /// and `dependencies` to install into each of its workers.
    pub fn new(id: SandboxId, owner: Owner, dependencies: Vec<String>) -> Arc<Sandbox> {
        Sandbox::owned(id, owner, dependencies, None)
    }

    /// [`new`](Self::new), belonging to `principal`.
    pub fn owned(
        id: SandboxId,
        owner: Owner,
        dependencies: Vec<String>,
        principal: Option<Principal>,
    ) -> Arc<Sandbox> {
        Arc::new(Sandbox::fresh(id, owner, dependencies, principal))
    }

    /// A sandbox made now, not yet shared.
    fn fresh(
        id: SandboxId,
        owner: Owner,
        dependencies: Vec<String>,
        principal: Option<Principal>,
    ) -> Sandbox {
        Sandbox {
            id,
            owner,
            principal,
            created: Instant::now(),
            created_unix: crate::sandbox::state_dir::unix_now(),
            dependencies,
            worker: Arc::default(),
            had_interpreter: AtomicBool::new(false),
            new_interpreter_note: Mutex::default(),
            files: Mutex::default(),
            ended: CancellationToken::new(),
            arrivals: Mutex::default(),
            queued: Notify::new(),
            activity: Activity::new(),
            generation: AtomicU64::new(0),
            saved_files: Mutex::default(),
            save_turn: tokio::sync::Mutex::new(()),
            restored_note: Mutex::default(),
            saved: Mutex::default(),
            uncaptured: Mutex::default(),
            fork_note: Mutex::default(),
            resume_quietly: AtomicBool::new(false),
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
        let mut sandbox = Sandbox::fresh(id, Owner::Handle, restored.dependencies, principal);
        sandbox.created = Instant::now().checked_sub(age).unwrap_or_else(Instant::now);
        sandbox.created_unix = restored.created_unix;
        let files = sandbox.files.get_mut().unwrap_or_else(|p| p.into_inner());
        for (path, bytes) in restored.files {
            files.keep(&path, bytes, cap);
        }
        // Its files as saved count as saved.
        sandbox.saved_files = Mutex::new(Some(files.version()));
        sandbox.generation = AtomicU64::new(restored.generation);
        // Its first worker is not its first: the kept files go into it, with the note.
        sandbox.had_interpreter = AtomicBool::new(true);
        sandbox.restored_note = Mutex::new(Some(note));
        Arc::new(sandbox)
    }

    /// The generation this replica holds it under in the state directory (0: never saved).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Records a save under `generation`, of its files at `files_version` when they were
    /// written.
    pub fn saved(&self, generation: u64, files_version: Option<u64>) {
        self.generation.store(generation, Ordering::SeqCst);
        if let Some(version) = files_version {
            *self.saved_files.lock().unwrap_or_else(|p| p.into_inner()) = Some(version);
        }
    }

    /// The files' version if they changed since the last save (`None`: nothing to write).
    pub fn unsaved_files(&self) -> Option<u64> {
        let version = self.with_files(|f| f.version());
        let saved = *self.saved_files.lock().unwrap_or_else(|p| p.into_inner());
        (saved != Some(version)).then_some(version)
    }

    /// Takes the first words of the `state` note due after a restore, if any.
    pub fn take_restored_note(&self) -> Option<String> {
        self.restored_note
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    fn kept_state(&self) -> std::sync::MutexGuard<'_, Saved> {
        self.saved.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn uncaptured(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.uncaptured.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps its worker's checkpoint ([`Saved::take`]); returns the bytes of pages kept.
    ///
    /// Errors: [`CheckpointError`] when the pages do not fit; the kept state is cleared.
    pub fn keep_checkpoint(
        &self,
        zygote: ZygoteId,
        pages: &Pages,
        installed: Vec<(String, String)>,
    ) -> Result<u64, CheckpointError> {
        let mut saved = self.kept_state();
        *self.uncaptured() = None;
        saved.take(zygote, pages, installed)
    }

    /// Whether it keeps the state its last completed call left.
    pub fn has_current_state(&self) -> bool {
        matches!(*self.kept_state(), Saved::Current(_))
    }

    /// Its last call's state could not be captured ([`Saved::stale`]), for the reasons `why`
    /// (words for a model: what the interpreter holds that a checkpoint cannot).
    pub fn checkpoint_stale(&self, why: &str) {
        let mut saved = self.kept_state();
        saved.stale();
        *self.uncaptured() = Some(why.to_owned());
    }

    /// Its kept state is gone (a restore failed, the state was reset, or a worker that was
    /// not restored took over).
    pub fn forget_checkpoint(&self) {
        let mut saved = self.kept_state();
        // A hibernated state's file goes too (and stops counting against the disk bound).
        if let Saved::Hibernated(spilled) = &*saved {
            spilled.home.forget(spilled);
        }
        *saved = Saved::Empty;
        *self.uncaptured() = None;
        self.resume_quietly.store(false, Ordering::SeqCst);
    }

    /// What a restore of its state into a new worker needs, when it has a current state.
    pub fn resumable(&self) -> Option<Resumable> {
        self.kept_state().resumable()
    }

    /// Its current state as the state directory's next checkpoint file, sealed for its handle
    /// under `generation` (`crate::sandbox::checkpoint::file`): a delta of the pages changed
    /// since the file this replica last wrote of it, while the chain's deltas hold at most
    /// [`MAX_DELTA_RATIO`] times the image's pages and it has fewer than [`MAX_CHAIN_FILES`]
    /// files; else the image whole.
    /// `None` when it has no current state (a save then removes the chain). The chain is
    /// recorded as written; a save that fails calls [`Sandbox::chain_unwritten`]. Called
    /// under [`Sandbox::save_turn`].
    ///
    /// Errors: [`SealError`] (nothing is recorded as written then).
    pub fn state_write(&self, generation: u64) -> Option<Result<CheckpointWrite, SealError>> {
        let mut saved = self.kept_state();
        let Saved::Current(kept) = &mut *saved else {
            return None;
        };
        let handle = self.id.as_str();
        let written = kept.written.take();
        let image_pages = kept.image.page_count() as u64;
        let delta = written.filter(|w| {
            w.files < MAX_CHAIN_FILES
                && w.delta_pages + w.changed.len() as u64 <= MAX_DELTA_RATIO * image_pages
        });
        tracing::debug!(
            "sandbox {}: checkpoint file: {}",
            self.id.short(),
            match &delta {
                Some(w) => format!("a delta of {} page(s)", w.changed.len()),
                None => format!("the image whole ({image_pages} page(s))"),
            }
        );
        let sealed = match &delta {
            Some(w) => file::write_delta(kept, &w.changed, generation, handle, &w.tail),
            None => file::write(kept, generation, handle),
        };
        Some(sealed.map(|bytes| {
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
        }))
    }

    /// A save of its state failed, or found another chain than the one it followed: the next
    /// save writes the image whole.
    pub fn chain_unwritten(&self) {
        if let Saved::Current(kept) | Saved::Stale(kept) = &mut *self.kept_state() {
            kept.written = None;
        }
    }

    /// A copy of its current state (what a save writes), if it has one.
    pub fn current_state(&self) -> Option<Kept> {
        match &*self.kept_state() {
            Saved::Current(kept) => Some(kept.clone()),
            _ => None,
        }
    }

    /// Starts with `kept` as its state (a fork's): its first worker restores it.
    pub fn adopt_state(&self, kept: Kept) {
        *self.kept_state() = Saved::Current(kept);
        self.had_interpreter.store(true, Ordering::SeqCst);
    }

    /// Hibernates the sandbox when it holds an idle worker and a current state: the state
    /// goes to disk through `hibernation` and the worker is killed. `Ok(true)` when it did.
    ///
    /// Errors: [`HibernationError`] when the state could not be written (the worker stays).
    pub fn hibernate(&self, hibernation: &Arc<Hibernation>) -> Result<bool, HibernationError> {
        let Ok(mut slot) = self.worker.try_lock() else {
            return Ok(false);
        };
        if slot.is_none() || self.has_ended() {
            return Ok(false);
        }
        let Some(kept) = self.current_state() else {
            return Ok(false);
        };
        let spilled = hibernation.spill(&self.id, &kept)?;
        *self.kept_state() = Saved::Hibernated(spilled);
        if let Some(worker) = slot.take() {
            kill_in_background(worker);
        }
        Ok(true)
    }

    /// Whether its state is on disk, with no worker ([`hibernate`](Self::hibernate)).
    pub fn is_hibernated(&self) -> bool {
        matches!(*self.kept_state(), Saved::Hibernated(_))
    }

    /// Brings a hibernated state back from disk (a blocking read of a few hundred KiB), so
    /// that it can be restored; nothing when the sandbox is not hibernated.
    ///
    /// Errors: [`HibernationError`]; the state is then gone.
    pub fn wake(&self) -> Result<(), HibernationError> {
        let spilled = match &*self.kept_state() {
            Saved::Hibernated(spilled) => spilled.clone(),
            _ => return Ok(()),
        };
        *self.kept_state() = Saved::Empty;
        let kept = spilled.home.take(&self.id, &spilled)?;
        *self.kept_state() = Saved::Current(kept);
        // Read back ahead of its next interpreter (a fork's copy took the state): that one
        // resumes it as after hibernation, quietly.
        self.resume_quietly.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// What a fork of it starts from (`fork_sandbox`; call it while holding its queue, so that
    /// no call of it runs meanwhile): its state as its last completed call left it, marked so
    /// that the first restore reseeds `random` ([`Saved::for_fork`]); `None` when it has none
    /// to give (no call completed in its interpreter, or the interpreter that ran them is gone
    /// with its state). A hibernated state is read back first, and stays in memory until the
    /// next worker.
    ///
    /// Errors: [`Unforkable`]: why the state its last completed call left could not be
    /// captured, in words for a model.
    pub fn fork_state(&self) -> Result<Option<Kept>, Unforkable> {
        if let Err(e) = self.wake() {
            tracing::warn!("sandbox {}: {e}", self.id.short());
        }
        if let Some(kept) = self.kept_state().for_fork() {
            return Ok(Some(kept));
        }
        let stale = matches!(*self.kept_state(), Saved::Stale(_));
        match (stale, self.uncaptured().clone()) {
            (_, Some(why)) => Err(Unforkable::Uncaptured(why)),
            (true, None) => Err(Unforkable::Stale),
            (false, None) => Ok(None),
        }
    }

    /// Starts as a fork of another sandbox: with `kept` as its state when that had one (its
    /// first worker restores it, then gets its files), and `note` as the first words of its
    /// first call's `state` note.
    pub fn begin_as_fork(&self, kept: Option<Kept>, note: String) {
        if let Some(kept) = kept {
            self.adopt_state(kept);
        }
        // Its first worker is not its first: it gets the kept state and files, with the note.
        self.had_interpreter.store(true, Ordering::SeqCst);
        *self.fork_note.lock().unwrap_or_else(|p| p.into_inner()) = Some(note);
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
        if let Some(note) = self.take_fork_note() {
            self.set_note(format!("{note}{files_words}"));
        }
        true
    }

    /// A `run_python_code` call of it ended.
    pub fn end_call(&self) {
        self.call_ended.notify_one();
    }

    /// Resolves once a call of it has ended (at once when one ended since the last wait).
    pub async fn a_call_ended(&self) {
        self.call_ended.notified().await;
    }

    /// Its interpreter went to a fork of it: its next one resumes its kept state quietly.
    pub fn lend_interpreter(&self) {
        self.resume_quietly.store(true, Ordering::SeqCst);
    }

    /// Whether its next interpreter resumes quietly (see [`Sandbox::lend_interpreter`],
    /// [`Sandbox::wake`]), and forgets it.
    pub fn take_resume_quietly(&self) -> bool {
        self.resume_quietly.swap(false, Ordering::SeqCst)
    }

    /// Takes the first words of the `state` note due at a fork's first call, if any.
    pub fn take_fork_note(&self) -> Option<String> {
        self.fork_note
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
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
        let mut a = self.arrivals.lock().unwrap_or_else(|p| p.into_inner());
        let n = a.next;
        a.next += 1;
        a.pending.insert(n, Instant::now());
        Arrival {
            sandbox: self.id.clone(),
            n,
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

    /// Queues for the worker after every call stamped before `arrival` (when it was
    /// stamped for this sandbox; otherwise simply in the mutex's FIFO order).
    pub async fn queue(&self, arrival: Option<&Arrival>) -> OwnedMutexGuard<Option<Worker>> {
        let Some(n) = arrival.filter(|a| a.sandbox == self.id).map(|a| a.n) else {
            return self.worker.clone().lock_owned().await;
        };
        // Leaves the arrival order however this future ends (also when it is dropped).
        struct Leave<'a>(&'a Sandbox, u64);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                self.0.leave(self.1);
            }
        }
        let leave = Leave(self, n);
        loop {
            let queued = self.queued.notified();
            tokio::pin!(queued);
            queued.as_mut().enable();
            if self.is_next(n) {
                break;
            }
            // Wake up at least when an unclaimed earlier call expires.
            let _ = tokio::time::timeout(UNCLAIMED_ARRIVAL, queued).await;
        }
        let lock = self.worker.clone().lock_owned();
        tokio::pin!(lock);
        // Take a place in the mutex's FIFO queue before letting the next call queue.
        if let std::task::Poll::Ready(guard) = futures::poll!(lock.as_mut()) {
            return guard;
        }
        drop(leave);
        lock.await
    }

    /// The sandbox's files as the last call left them (path, size in bytes).
    pub fn files(&self) -> Vec<(String, u64)> {
        self.with_files(|f| f.listing())
    }

    /// Runs `f` on the sandbox's files (never across an `await`).
    pub(crate) fn with_files<T>(&self, f: impl FnOnce(&mut SandboxFiles) -> T) -> T {
        f(&mut self.files.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// A new worker is taken: whether it is the sandbox's first (otherwise the state of
    /// an earlier one was lost).
    pub fn first_interpreter(&self) -> bool {
        !self.had_interpreter.swap(true, Ordering::SeqCst)
    }

    /// The state was cleared on purpose (`reset_session`): the next worker counts as the
    /// first, with no note.
    pub fn forget_interpreters(&self) {
        self.had_interpreter.store(false, Ordering::SeqCst);
    }

    /// Sets the `state` note of the sandbox's next call.
    pub fn set_note(&self, note: String) {
        *self
            .new_interpreter_note
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(note);
    }

    /// Takes the `state` note for this call, if any.
    pub fn take_note(&self) -> Option<String> {
        self.new_interpreter_note
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
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
        if self.is_hibernated() {
            self.forget_checkpoint();
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

    fn sandbox() -> Arc<Sandbox> {
        Sandbox::new(SandboxId::mint().expect("mint"), Owner::Handle, Vec::new())
    }

    fn one_page() -> Pages {
        Pages {
            memory_bytes: 65536,
            indexes: vec![0],
            bytes: vec![7; PAGE_BYTES],
        }
    }

    #[test]
    fn a_fork_gets_the_current_state_or_why_there_is_none() {
        let source = sandbox();
        let zygote = ZygoteId([1; 32]);
        assert!(matches!(source.fork_state(), Ok(None)));
        // A first call whose state could not be captured: refused, with why.
        source.checkpoint_stale("Python holds 1 JavaScript object(s)");
        assert_eq!(
            source.fork_state().err(),
            Some(Unforkable::Uncaptured(
                "Python holds 1 JavaScript object(s)".to_owned()
            ))
        );
        // A later call's state is captured: it is the fork's, marked to reseed.
        source
            .keep_checkpoint(zygote, &one_page(), Vec::new())
            .expect("fits");
        let kept = source.fork_state().expect("current").expect("kept");
        assert!(kept.reseed);
        // Stale again: refused; a new interpreter from scratch: nothing to copy.
        source.checkpoint_stale("1 file(s) are open");
        assert!(source.fork_state().is_err());
        source.forget_checkpoint();
        assert!(matches!(source.fork_state(), Ok(None)));

        // The fork starts with the state, its first worker is not its first, and its note is
        // due.
        let fork = sandbox();
        fork.begin_as_fork(Some(kept), "forked: …".to_owned());
        assert!(fork.has_current_state() && !fork.first_interpreter());
        assert!(fork.resumable().expect("current").reseed);
        assert_eq!(fork.take_fork_note().as_deref(), Some("forked: …"));
        let empty = sandbox();
        empty.begin_as_fork(None, "forked".to_owned());
        assert!(!empty.has_current_state() && !empty.first_interpreter());
    }
}
