//! What a sandbox keeps of its interpreter's state between workers (checkpoints, docs/architecture.md §3.4): the last
//! checkpoint, whether it is the state the last completed call left, and what a restore of it
//! needs.
//!
//! The kept image is always the base the sandbox's current worker measures its next
//! checkpoint against (its shadow, `src/interpreter/linear_memory.rs`): a fresh worker's first
//! checkpoint is whole (everything that differs from the zygote) and replaces it; a restored
//! worker's checkpoints are deltas merged into it. A call whose state cannot be captured leaves
//! the image as the worker's base but no longer the sandbox's state ([`Saved::Stale`]): it is
//! merged into again, never restored.

use super::{Checkpoint, CheckpointError};
use crate::protocol::pages::{Pages, ZygoteId};
use std::collections::BTreeSet;

/// A sandbox's kept state (see the module's documentation).
#[derive(Debug, Default)]
pub enum Saved {
    /// Nothing: no call completed in this worker yet, or the state was cleared.
    #[default]
    Empty,
    /// The state as the last completed call left it.
    Current(Kept),
    /// The last call's state could not be captured; `Kept` is only the worker's base.
    Stale(Kept),
    /// The state is current but kept on disk, and the sandbox has no worker
    /// (`crate::sandbox::hibernation`).
    Hibernated(Spilled),
}

/// A current state written to disk while its sandbox hibernates.
#[derive(Debug, Clone)]
pub struct Spilled {
    /// The file (`checkpoint::file` format, sealed for the sandbox's handle).
    pub path: std::path::PathBuf,
    /// Its size (bytes), counted against `--max-hibernated-bytes`.
    pub bytes: u64,
    /// Where it is kept, which reads it back and counts it.
    pub home: std::sync::Arc<crate::sandbox::hibernation::Hibernation>,
}

/// A checkpoint and what restoring it needs.
#[derive(Debug, Clone)]
pub struct Kept {
    /// The pages that differ from the zygote's.
    pub image: Checkpoint,
    /// Packages installed after the fork (name, version), installed again before a restore.
    pub installed: Vec<(String, String)>,
    /// The next restore is a fork's: `random` is reseeded after it, as `os.fork` does.
    pub reseed: bool,
    /// What the state directory holds of this image, as this replica wrote it; `None` when
    /// nothing it wrote holds the image so far, so the next save writes it whole.
    pub written: Option<Written>,
}

/// The state directory's checkpoint chain of a [`Kept`] image as this replica last wrote it
/// (`super::file`), and what changed since.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// The SHA-256 of the chain's last file: the next delta's link.
    pub tail: [u8; 32],
    /// Files in the chain (its first, then deltas).
    pub files: usize,
    /// Pages in its deltas, all together.
    pub delta_pages: u64,
    /// Pages changed since its last file: what the next delta holds.
    pub changed: BTreeSet<u32>,
}

/// What [`Saved::resumable`] hands a restore.
pub struct Resumable {
    /// The image, its pages shared with the kept state (a copy costs a count per page).
    pub image: Checkpoint,
    pub installed: Vec<(String, String)>,
    pub reseed: bool,
}

impl Saved {
    /// Takes a worker's checkpoint (`pages` measured against `zygote`) with the packages
    /// it had installed: merged into the kept image when that is the worker's base, else the
    /// start of a new one.
    ///
    /// Returns the bytes of pages the state now keeps.
    ///
    /// Errors: [`CheckpointError`] when the pages do not fit (a broken or hostile worker);
    /// the kept state is then cleared.
    pub fn take(
        &mut self,
        zygote: ZygoteId,
        pages: &Pages,
        installed: Vec<(String, String)>,
    ) -> Result<u64, CheckpointError> {
        let base = match std::mem::take(self) {
            Saved::Current(kept) | Saved::Stale(kept) if kept.image.zygote() == zygote => {
                Some((kept.image, kept.written))
            }
            _ => None,
        };
        let (mut image, mut written) = match base {
            Some(base) => base,
            None => (Checkpoint::new(zygote, pages.memory_bytes)?, None),
        };
        image.merge(pages.memory_bytes, &pages.indexes, &pages.bytes)?;
        if let Some(written) = &mut written {
            written.changed.extend(&pages.indexes);
        }
        let stored = image.stored_bytes();
        *self = Saved::Current(Kept {
            image,
            installed,
            reseed: false,
            written,
        });
        Ok(stored)
    }

    /// The last call's state could not be captured.
    /// A save then removes the state directory's chain, so the image is no longer written.
    pub fn stale(&mut self) {
        *self = match std::mem::take(self) {
            Saved::Current(kept) | Saved::Stale(kept) => Saved::Stale(Kept {
                written: None,
                ..kept
            }),
            Saved::Empty | Saved::Hibernated(_) => Saved::Empty,
        };
    }

    /// What a restore into a new worker needs, when the state is current. Once handed out,
    /// the next restore is no longer a fork's.
    pub fn resumable(&mut self) -> Option<Resumable> {
        let Saved::Current(kept) = self else {
            return None;
        };
        let resumable = Resumable {
            image: kept.image.clone(),
            installed: kept.installed.clone(),
            reseed: kept.reseed,
        };
        kept.reseed = false;
        Some(resumable)
    }

    /// A copy for a fork: the current state, marked so that its first restore reseeds
    /// `random`; `None` when the state is not current.
    pub fn for_fork(&self) -> Option<Kept> {
        match self {
            Saved::Current(kept) => Some(Kept {
                image: kept.image.clone(),
                installed: kept.installed.clone(),
                reseed: true,
                written: None,
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::pages::{encode_whole_pages, PAGE_BYTES};

    fn pages(memory_pages: u64, changed: &[(u32, u8)]) -> Pages {
        Pages {
            memory_bytes: memory_pages * 65536,
            indexes: changed.iter().map(|(i, _)| *i).collect(),
            bytes: encode_whole_pages(
                &changed
                    .iter()
                    .flat_map(|(_, b)| vec![*b; PAGE_BYTES])
                    .collect::<Vec<_>>(),
            ),
        }
    }

    #[test]
    fn deltas_merge_into_the_current_state_and_a_stale_one_is_never_resumed() {
        let z = ZygoteId([1; 32]);
        let mut saved = Saved::default();
        assert!(saved.resumable().is_none());
        saved
            .take(z, &pages(1, &[(0, 1), (3, 2)]), vec![])
            .expect("fits");
        saved
            .take(z, &pages(2, &[(3, 0), (20, 5)]), vec![])
            .expect("fits");
        let r = saved.resumable().expect("current");
        assert_eq!(r.image.to_delta().0, vec![0, 20]);
        assert_eq!(r.image.memory_bytes(), 2 * 65536);
        saved.stale();
        assert!(saved.resumable().is_none());
        saved.take(z, &pages(2, &[(1, 9)]), vec![]).expect("fits");
        assert_eq!(
            saved.resumable().expect("current").image.to_delta().0,
            vec![0, 1, 20]
        );
    }

    #[test]
    fn another_zygotes_pages_start_a_new_image_and_a_fork_reseeds_once() {
        let mut saved = Saved::default();
        saved
            .take(ZygoteId([1; 32]), &pages(1, &[(0, 1)]), vec![])
            .expect("fits");
        saved
            .take(ZygoteId([2; 32]), &pages(1, &[(2, 1)]), vec![])
            .expect("fits");
        assert_eq!(
            saved.resumable().expect("current").image.to_delta().0,
            vec![2]
        );
        let mut fork = Saved::Current(saved.for_fork().expect("current"));
        assert!(fork.resumable().expect("current").reseed);
        assert!(!fork.resumable().expect("current").reseed);
        assert!(!saved.resumable().expect("current").reseed);
    }

    #[test]
    fn pages_that_do_not_fit_clear_the_state() {
        let z = ZygoteId([1; 32]);
        let mut saved = Saved::default();
        saved.take(z, &pages(1, &[(0, 1)]), vec![]).expect("fits");
        let bad = pages(1, &[(99, 1)]);
        assert!(saved.take(z, &bad, vec![]).is_err());
        assert!(saved.resumable().is_none());
    }
}
