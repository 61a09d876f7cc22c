//! Files replaced whole, never seen half-written: the new bytes go to a temporary file beside
//! the old one, which a rename then puts in its place (atomic on POSIX file systems and on
//! NFS). The one way this program replaces a file that another process, or a later run, may
//! read: the state directory's records, a task's record, the download cache and the memory
//! snapshot.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Whether the new bytes reach the disk before the rename.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Flushed (`fsync`) first: after a crash the file is the old one or the new one, whole.
    /// For records that other replicas trust (the state directory, tasks).
    Synced,
    /// Not flushed: a reader never sees half a file, but a crash may lose the new one. For
    /// what can be made again (the download cache, the memory snapshot).
    Unsynced,
}

/// A step of a replacement failed: `action` (`create`, `write`, `flush`, `rename into`) on
/// `path` (the temporary file, or the file replaced for the rename).
#[derive(Debug, Error)]
#[error("cannot {action} {}", .path.display())]
pub struct ReplaceError {
    pub action: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

/// The temporary file that replaces `path`: `.NAME.TAG.tmp` beside it, where `tag` tells
/// writers apart (a process id, a replica's name), so that two never share one.
pub fn temporary_path(path: &Path, tag: &str) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.{tag}.tmp"))
}

/// Whether the file name `name` is one of [`temporary_path`]'s: what a writer that died left.
pub fn is_temporary(name: &str) -> bool {
    name.starts_with('.') && name.ends_with(".tmp")
}

/// Replaces `path` with what `write` writes, whole (see the module's documentation); `tag`
/// names this writer's temporary file ([`temporary_path`]). The folder must exist.
///
/// Errors: [`ReplaceError`], naming the step and the file.
pub fn replace_with(
    path: &Path,
    tag: &str,
    durability: Durability,
    write: impl FnOnce(&mut File) -> io::Result<()>,
) -> Result<(), ReplaceError> {
    let tmp = temporary_path(path, tag);
    let step = |action: &'static str, at: &Path| {
        let path = at.to_owned();
        move |source| ReplaceError {
            action,
            path,
            source,
        }
    };
    let mut file = File::create(&tmp).map_err(step("create", &tmp))?;
    write(&mut file).map_err(step("write", &tmp))?;
    if durability == Durability::Synced {
        file.sync_all().map_err(step("flush", &tmp))?;
    }
    drop(file);
    std::fs::rename(&tmp, path).map_err(step("rename into", path))
}

/// Replaces `path` with `bytes` ([`replace_with`]).
///
/// Errors: [`ReplaceError`].
pub fn replace(
    path: &Path,
    tag: &str,
    durability: Durability,
    bytes: &[u8],
) -> Result<(), ReplaceError> {
    replace_with(path, tag, durability, |file| file.write_all(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_replaced_whole_and_no_temporary_file_is_left() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("record.json");
        replace(&path, "7", Durability::Synced, b"old").expect("written");
        replace(&path, "7", Durability::Unsynced, b"new").expect("replaced");
        assert_eq!(std::fs::read(&path).expect("read"), b"new");
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .expect("listed")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["record.json"]);
        assert!(is_temporary(".record.json.7.tmp") && !is_temporary("record.json"));
    }

    #[test]
    fn a_failed_write_leaves_the_old_file_and_names_its_step() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("record.json");
        replace(&path, "a", Durability::Synced, b"old").expect("written");
        let failed = replace_with(&path, "a", Durability::Synced, |_| {
            Err(io::Error::other("disk full"))
        })
        .expect_err("refused");
        assert_eq!(failed.action, "write");
        assert_eq!(failed.path, temporary_path(&path, "a"));
        assert_eq!(std::fs::read(&path).expect("read"), b"old");
        let missing = dir.path().join("no-folder").join("x");
        let failed = replace(&missing, "a", Durability::Unsynced, b"x").expect_err("refused");
        assert_eq!(failed.action, "create");
    }
}
