//! The `state` notes of `--stateful` results (files, README "Sandboxes"): a result says when its sandbox's
//! interpreter state was lost or is new, and which files survived, so that an agent knows to
//! run its setup again.

use crate::sandbox::files::{name_list, Survivors};

/// The `state` note of a `--stateful` call whose worker was stopped (files, README "Sandboxes": the result
/// says when state was lost, so that an agent knows to run its setup again).
const STATE_LOST: &str = "lost: this sandbox's interpreter was stopped after this call, and the variables, functions and imports of its earlier calls are gone; the next call starts in a new interpreter";

/// The `state` note of a call that stopped its sandbox's worker when the sandbox keeps a
/// checkpoint of the state its last completed call left (checkpoints, docs/architecture.md §3.4).
const STATE_ROLLED_BACK: &str = "lost: this sandbox's interpreter was stopped after this call, and what this call changed is gone; the next call starts in a new interpreter with the variables, functions and imports as the last completed call left them";

/// Why a `--stateful` sandbox's next call runs in a new worker: the first words of that
/// call's `state` note.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restart {
    /// The front stopped the previous one (a timeout, the memory limit, a failed worker).
    Stopped,
    /// The previous one ended by itself between calls (killed from outside, the OOM killer, a
    /// crash while idle).
    Died,
}

impl Restart {
    /// The first words of the `state` note of the call that runs in the new worker.
    pub fn note(self) -> &'static str {
        match self {
            Restart::Stopped => "new: this call ran in a new interpreter (the previous one was stopped); the variables, functions and imports of earlier calls are gone",
            Restart::Died => "new: this call ran in a new interpreter (the previous one had ended since the last call: it was killed from outside, ran out of memory or crashed); the variables, functions and imports of earlier calls are gone",
        }
    }

    /// The first words of the `state` note of a call whose new worker got the sandbox's
    /// state back from its last checkpoint (checkpoints, docs/architecture.md §3.4).
    pub fn restored_note(self) -> &'static str {
        match self {
            Restart::Stopped => "restored: this call ran in a new interpreter (the previous one was stopped); the variables, functions and imports are back as the last completed call left them",
            Restart::Died => "restored: this call ran in a new interpreter (the previous one had ended since the last call: it was killed from outside, ran out of memory or crashed); the variables, functions and imports are back as the last completed call left them",
        }
    }
}

/// The `state` note of a call that stopped its sandbox's worker: what is lost, which files
/// the next worker will have again, which are gone.
/// `checkpointed`: the sandbox keeps the state its last completed call left (checkpoints, docs/architecture.md §3.4),
/// which the next worker gets back.
pub fn lost_note(survivors: &Survivors, checkpointed: bool) -> String {
    let mut note = if checkpointed {
        STATE_ROLLED_BACK.to_owned()
    } else {
        STATE_LOST.to_owned()
    };
    append_files(
        &mut note,
        "the sandbox's files as its last completed call left them are kept and will be in the new interpreter",
        &survivors.kept,
    );
    append_files(
        &mut note,
        "these files are gone (over --max-session-file-bytes, or changed by this call before they could be copied)",
        &survivors.lost,
    );
    note
}

/// Appends `; {words}: {files}` to `note`, nothing when `files` is empty: how every `state`
/// note names files.
pub fn append_files(note: &mut String, words: &str, files: &[String]) {
    if !files.is_empty() {
        note.push_str("; ");
        note.push_str(words);
        note.push_str(": ");
        note.push_str(&name_list(files));
    }
}
