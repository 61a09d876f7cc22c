//! What a replica knows of its saves of one sandbox to the state directory (`--state-dir`,
//! docs/architecture.md §3.3): the generation it holds the sandbox under, which version of
//! the files it last wrote, and the turn that orders its saves. The saves themselves are the
//! registry's ([`super::registry`]); the checkpoint chain is [`super::kept::KeptState`]'s.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// One sandbox's save record (see the module's documentation).
#[derive(Default)]
pub struct SaveRecord {
    /// The generation this replica holds it under (0: never saved).
    generation: AtomicU64,
    /// The [`SandboxFiles::version`](super::files::SandboxFiles::version) last saved.
    files: Mutex<Option<u64>>,
    /// Held across a save, so that the sandbox's saves write in the order they took its
    /// state (each checkpoint delta follows the file the save before it wrote).
    pub turn: tokio::sync::Mutex<()>,
}

impl SaveRecord {
    /// A record of a sandbox restored under `generation`, with its files at `files_version`
    /// as saved.
    pub fn restored(generation: u64, files_version: u64) -> SaveRecord {
        SaveRecord {
            generation: AtomicU64::new(generation),
            files: Mutex::new(Some(files_version)),
            turn: tokio::sync::Mutex::new(()),
        }
    }

    /// The generation this replica holds the sandbox under (0: never saved).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Records a save under `generation`, of the files at `files_version` when they were
    /// written.
    pub fn saved(&self, generation: u64, files_version: Option<u64>) {
        self.generation.store(generation, Ordering::SeqCst);
        if let Some(version) = files_version {
            *self.files.lock().unwrap_or_else(|p| p.into_inner()) = Some(version);
        }
    }

    /// `files_version` when it is not the version last saved (`None`: nothing to write).
    pub fn unsaved(&self, files_version: u64) -> Option<u64> {
        let saved = *self.files.lock().unwrap_or_else(|p| p.into_inner());
        (saved != Some(files_version)).then_some(files_version)
    }
}
