//! Hibernation (`--hibernate-after`, `--max-hibernated-bytes`): a sandbox idle past
//! the limit gives its interpreter back and keeps its state on disk, and its next call resumes
//! it in a new worker from that state (`crate::server::call::checkpoints`).
//!
//! A live interpreter costs ~23 MiB of private memory even when idle (docs/checkpoint-research.md
//! §4); a hibernated sandbox costs the front its registry entry and its checkpoint on disk
//! (~0.2 MiB sealed for a sandbox with `import json` and 100 KiB of data). So `--max-sandboxes`
//! bounds live interpreters, and hibernated sandboxes are bounded by disk: past
//! `--max-hibernated-bytes` the sandbox that hibernated first ends.
//!
//! Where: one directory per front (`<cache dir>/hibernated/<replica>/`, 0700), emptied when
//! the front starts and removed when it stops cleanly; each file is the `checkpoint::file`
//! format, sealed for its sandbox's handle, named by the handle's SHA-256. Only the front that
//! wrote a file reads it.

use super::checkpoint::{file, Kept, Spilled};
use super::handle::SandboxId;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Where and when sandboxes hibernate (see the module's documentation).
#[derive(Debug)]
pub struct Hibernation {
    dir: PathBuf,
    /// Idle time after which a sandbox hibernates.
    pub after: Duration,
    /// Most bytes of hibernated state on disk.
    pub max_bytes: u64,
    /// Bytes of hibernated state on disk now.
    used: AtomicU64,
}

/// Why a state could not be written to or read from disk.
#[derive(Debug, thiserror::Error)]
pub enum HibernationError {
    #[error("could not {action} a hibernated sandbox's state: {source}")]
    Io {
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("could not seal a sandbox's state: {0}")]
    Seal(#[source] super::checkpoint::sealed::SealError),
    #[error("a hibernated sandbox's state was refused: {0}")]
    Refused(#[source] super::checkpoint::sealed::Refused),
    #[error("hibernated sandboxes fill --max-hibernated-bytes")]
    Full,
}

fn io(action: &'static str) -> impl FnOnce(std::io::Error) -> HibernationError {
    move |source| HibernationError::Io { action, source }
}

impl Hibernation {
    /// Hibernation into `root/<replica>/` (made 0700 and emptied), after `after` idle, within
    /// `max_bytes`.
    ///
    /// Errors: the directory cannot be made.
    pub fn open(
        root: &Path,
        replica: &str,
        after: Duration,
        max_bytes: u64,
    ) -> Result<Hibernation, HibernationError> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = root.join(replica);
        // A directory of an earlier front of the same name (a reused process id) holds
        // nothing this front can use, nor do those of fronts that ended without removing
        // theirs (SIGKILL).
        let _ = std::fs::remove_dir_all(&dir);
        remove_orphans(root, replica);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(io("make the directory of"))?;
        Ok(Hibernation {
            dir,
            after,
            max_bytes,
            used: AtomicU64::new(0),
        })
    }

    /// Bytes of hibernated state on disk now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::SeqCst)
    }

    /// Writes `kept`, the state of sandbox `id`, to disk.
    ///
    /// Errors: [`HibernationError::Full`] when it would pass `--max-hibernated-bytes`; the file
    /// system's; sealing's.
    pub fn spill(
        self: &Arc<Self>,
        id: &SandboxId,
        kept: &Kept,
    ) -> Result<Spilled, HibernationError> {
        let bytes = file::write(kept, 0, id.as_str()).map_err(HibernationError::Seal)?;
        let size = bytes.len() as u64;
        let before = self.used.fetch_add(size, Ordering::SeqCst);
        if before + size > self.max_bytes {
            self.used.fetch_sub(size, Ordering::SeqCst);
            return Err(HibernationError::Full);
        }
        let path = self
            .dir
            .join(hex::encode(Sha256::digest(id.as_str().as_bytes())));
        if let Err(e) = std::fs::write(&path, &bytes) {
            self.used.fetch_sub(size, Ordering::SeqCst);
            return Err(io("write")(e));
        }
        Ok(Spilled {
            path,
            bytes: size,
            home: self.clone(),
        })
    }

    /// Reads back the state of sandbox `id` that `spilled` holds, and removes the file.
    ///
    /// Errors: the file system's; a file that does not open for `id` (never expected: only
    /// this front writes here).
    pub fn take(&self, id: &SandboxId, spilled: &Spilled) -> Result<Kept, HibernationError> {
        let read = std::fs::read(&spilled.path).map_err(io("read"));
        self.forget(spilled);
        let (_, kept) = file::read(&read?, id.as_str(), super::checkpoint::MAX_MEMORY_BYTES)
            .map_err(HibernationError::Refused)?;
        Ok(kept)
    }

    /// Removes `spilled`'s file (its sandbox ended, or woke).
    pub fn forget(&self, spilled: &Spilled) {
        if std::fs::remove_file(&spilled.path).is_ok() {
            self.used.fetch_sub(spilled.bytes, Ordering::SeqCst);
        }
    }

    /// Removes the directory (the front stops).
    pub fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Removes the directories under `root` of fronts of this host (`replica`'s) that are no
/// longer running: a replica is named `<host>-<pid>` (`src/modes.rs`), and a front removes its
/// own directory when it stops cleanly but not when it is killed.
fn remove_orphans(root: &Path, replica: &str) {
    let Some((host, _)) = replica.rsplit_once('-') else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        // Only this host's: a cache directory shared with other machines holds theirs too.
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.rsplit_once('-'))
            .filter(|(theirs, _)| *theirs == host)
            .and_then(|(_, pid)| pid.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: signal 0 only checks that the process exists; nothing is sent.
        let gone = unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if pid > 0 && gone {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_this_hosts_directories_of_ended_fronts_are_removed() {
        let root = std::env::temp_dir().join(format!("hibernation-test-{}", std::process::id()));
        // Above the kernel's largest process id (4,194,304): never running.
        let names = [
            "h-9999999".to_owned(),
            format!("h-{}", std::process::id()),
            "other-9999999".to_owned(),
        ];
        for name in &names {
            std::fs::create_dir_all(root.join(name)).expect("made");
        }
        remove_orphans(&root, "h-1");
        let left: Vec<bool> = names.iter().map(|n| root.join(n).exists()).collect();
        let _ = std::fs::remove_dir_all(&root);
        assert_eq!(left, [false, true, true]);
    }
}
