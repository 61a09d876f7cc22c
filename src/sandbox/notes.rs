//! The `state` notes a sandbox owes its next call (`--stateful`, docs/architecture.md §3.4):
//! what a new interpreter lost or got back, after a worker was replaced, a restore from the
//! state directory, or a fork. Apart from [`Sandbox`](super::live::Sandbox) so that when a note
//! is due reads in one place.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// One sandbox's due notes (see the module's documentation).
#[derive(Default)]
pub struct StateNotes {
    /// Whether the sandbox has had an interpreter (so a new one means its state was lost).
    had_interpreter: AtomicBool,
    /// The note for the next call, when its interpreter was replaced since its last one (what
    /// was lost, which files were restored).
    next: Mutex<Option<String>>,
    /// `fork_sandbox`: the first words of the note of a fork's first call.
    fork: Mutex<Option<String>>,
    /// `--state-dir`: the first words of the note of the first call after a restore from the
    /// state directory (what came back, what was lost).
    restored: Mutex<Option<String>>,
}

/// Takes what `slot` holds, whatever a panicking holder left.
fn take(slot: &Mutex<Option<String>>) -> Option<String> {
    slot.lock().unwrap_or_else(|p| p.into_inner()).take()
}

/// Puts `note` in `slot`.
fn put(slot: &Mutex<Option<String>>, note: String) {
    *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(note);
}

impl StateNotes {
    /// A new interpreter is taken: whether it is the sandbox's first (otherwise the state of
    /// an earlier one was lost).
    pub fn first_interpreter(&self) -> bool {
        !self.had_interpreter.swap(true, Ordering::SeqCst)
    }

    /// The sandbox's next interpreter is not its first: it starts from a kept state or files
    /// (a fork, a restore).
    pub fn had_interpreter(&self) {
        self.had_interpreter.store(true, Ordering::SeqCst);
    }

    /// The state was cleared on purpose (`reset_session`): the next interpreter counts as the
    /// first, with no note.
    pub fn forget_interpreters(&self) {
        self.had_interpreter.store(false, Ordering::SeqCst);
    }

    /// Sets the note of the sandbox's next call.
    pub fn set(&self, note: String) {
        put(&self.next, note);
    }

    /// Takes the note for this call, if any.
    pub fn take(&self) -> Option<String> {
        take(&self.next)
    }

    /// Sets the first words of a fork's first note.
    pub fn set_fork(&self, note: String) {
        put(&self.fork, note);
    }

    /// Takes the first words of the note due at a fork's first call, if any.
    pub fn take_fork(&self) -> Option<String> {
        take(&self.fork)
    }

    /// Sets the first words of the note due after a restore.
    pub fn set_restored(&self, note: String) {
        put(&self.restored, note);
    }

    /// Takes the first words of the note due after a restore, if any.
    pub fn take_restored(&self) -> Option<String> {
        take(&self.restored)
    }
}
