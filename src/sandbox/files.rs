//! A `--stateful` sandbox's files as the front knows them (files, README "Sandboxes"): the listing its
//! worker reported after the last call (its MCP resources), and a copy of their bytes, up to
//! `--max-session-file-bytes` in all, so that they outlive a worker that is stopped (a
//! timeout, the memory limit, a crash) and are written into the sandbox's next one. Python
//! objects cannot be copied that way; files can.

use std::collections::BTreeMap;
use std::sync::Arc;

/// One file of the working directory: its size (bytes) and, when the front holds a copy, its
/// bytes as the worker last reported them.
#[derive(Debug, Clone)]
struct Entry {
    size: u64,
    bytes: Option<Arc<Vec<u8>>>,
}

/// The files of a sandbox's working directory (paths relative to it).
#[derive(Debug, Default)]
pub struct SandboxFiles {
    entries: BTreeMap<String, Entry>,
    /// Bumped by every change (`--state-dir` saves the files again only after one).
    version: u64,
}

/// What a kept call's worker said of its working directory (`--stateful`): every file with its
/// size in bytes, and the paths changed since the worker's previous call, whose copies the
/// front reads again.
#[derive(Debug)]
pub struct Listing {
    /// Every regular file under the working directory: path, size in bytes.
    pub files: Vec<(String, u64)>,
    /// Paths changed since the previous call's listing.
    pub refresh: Vec<String>,
}

/// What survived a worker that was stopped: the files whose copy the front holds (they go
/// into the next worker), and those it had none of (too large to keep, or changed by
/// the call that stopped it before the front could copy them).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Survivors {
    pub kept: Vec<String>,
    pub lost: Vec<String>,
}

/// Longest file path (bytes), and longest name within it (bytes, as Linux file systems allow).
const MAX_PATH_BYTES: usize = 1024;
const MAX_NAME_BYTES: usize = 255;

/// Why a file name (given by a client, or read from the shared state directory) cannot name a
/// file of a sandbox's working directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadName {
    #[error("the name is empty")]
    Empty,
    #[error("the name is longer than {MAX_PATH_BYTES} bytes, or a part of it longer than {MAX_NAME_BYTES}")]
    TooLong,
    #[error("the name is an absolute path; give a path relative to the working directory")]
    Absolute,
    #[error("the name holds a NUL character")]
    Nul,
    #[error("the name has an empty, `.` or `..` part: it must stay inside the working directory")]
    OutOfDirectory,
}

/// `name` as a path relative to the working directory, or why it cannot be one.
pub fn checked_name(name: &str) -> Result<&str, BadName> {
    if name.is_empty() {
        return Err(BadName::Empty);
    }
    if name.len() > MAX_PATH_BYTES || name.split('/').any(|s| s.len() > MAX_NAME_BYTES) {
        return Err(BadName::TooLong);
    }
    if name.starts_with('/') {
        return Err(BadName::Absolute);
    }
    if name.contains('\0') {
        return Err(BadName::Nul);
    }
    if name
        .split('/')
        .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return Err(BadName::OutOfDirectory);
    }
    Ok(name)
}

/// How many file names a `state` note spells out before it says how many more there are.
const NOTE_NAMES: usize = 10;

/// `names` as a short list for a `state` note.
pub fn name_list(names: &[String]) -> String {
    let mut text = names
        .iter()
        .take(NOTE_NAMES)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > NOTE_NAMES {
        text.push_str(&format!(" and {} more", names.len() - NOTE_NAMES));
    }
    text
}

impl SandboxFiles {
    /// A number that changes whenever the files or their copies do.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The files the front holds no copy of (path order).
    pub fn without_copy(&self) -> Vec<String> {
        self.entries
            .iter()
            .filter(|(_, e)| e.bytes.is_none())
            .map(|(path, _)| path.clone())
            .collect()
    }

    /// The files (path, size in bytes), in path order.
    pub fn listing(&self) -> Vec<(String, u64)> {
        self.entries
            .iter()
            .map(|(path, entry)| (path.clone(), entry.size))
            .collect()
    }

    /// Takes the worker's listing after a call: files no longer there are forgotten, and a
    /// file whose size changed loses its copy (until [`SandboxFiles::keep`] gives a new one).
    /// Whether the set of names or sizes changed.
    pub fn observe(&mut self, files: &[(String, u64)]) -> bool {
        let before = self.listing();
        let mut entries = BTreeMap::new();
        for (path, size) in files {
            let bytes = match self.entries.remove(path) {
                Some(Entry { size: old, bytes }) if old == *size => bytes,
                _ => None,
            };
            entries.insert(path.clone(), Entry { size: *size, bytes });
        }
        self.entries = entries;
        // Same names and sizes: every copy was kept, nothing to save again.
        let changed = before != self.listing();
        if changed {
            self.version += 1;
        }
        changed
    }

    /// Room left for copies under `cap` (bytes), once the copy of `path`, if any, is dropped.
    pub fn room_for(&mut self, path: &str, cap: u64) -> u64 {
        if let Some(entry) = self.entries.get_mut(path) {
            entry.bytes = None;
            self.version += 1;
        }
        cap.saturating_sub(self.held())
    }

    /// Records file `path` with `bytes` (an upload, or a copy read after a call), keeping the
    /// copy only while all copies stay within `cap` bytes. Whether the listing changed.
    pub fn keep(&mut self, path: &str, bytes: Vec<u8>, cap: u64) -> bool {
        let size = bytes.len() as u64;
        let changed = self.entries.get(path).map(|e| e.size) != Some(size);
        let room = self.room_for(path, cap);
        let bytes = (size <= room).then(|| Arc::new(bytes));
        self.entries.insert(path.to_owned(), Entry { size, bytes });
        self.version += 1;
        changed
    }

    /// Forgets file `path`; whether it was there.
    pub fn remove(&mut self, path: &str) -> bool {
        self.version += 1;
        self.entries.remove(path).is_some()
    }

    /// Forgets every file (`reset_session`); whether there were any.
    pub fn clear(&mut self) -> bool {
        let had = !self.entries.is_empty();
        self.entries.clear();
        self.version += 1;
        had
    }

    /// The worker was stopped: files without a copy are gone with it. Returns which files
    /// survive and which were lost (in path order).
    pub fn survive(&mut self) -> Survivors {
        self.version += 1;
        let mut survivors = Survivors::default();
        self.entries.retain(|path, entry| {
            let kept = entry.bytes.is_some();
            if kept {
                survivors.kept.push(path.clone());
            } else {
                survivors.lost.push(path.clone());
            }
            kept
        });
        survivors
    }

    /// The held copies (path, bytes), to write into a new worker.
    pub fn copies(&self) -> Vec<(String, Arc<Vec<u8>>)> {
        self.entries
            .iter()
            .filter_map(|(path, e)| e.bytes.clone().map(|b| (path.clone(), b)))
            .collect()
    }

    /// The held copy of `path`, if any.
    pub fn copy_of(&self, path: &str) -> Option<Arc<Vec<u8>>> {
        self.entries.get(path).and_then(|e| e.bytes.clone())
    }

    /// Bytes held in copies.
    fn held(&self) -> u64 {
        self.entries
            .values()
            .filter_map(|e| e.bytes.as_ref())
            .map(|b| b.len() as u64)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_stay_in_the_working_directory() {
        assert_eq!(checked_name("data/a.csv"), Ok("data/a.csv"));
        assert_eq!(checked_name(""), Err(BadName::Empty));
        assert_eq!(checked_name("/etc/passwd"), Err(BadName::Absolute));
        assert_eq!(checked_name("../x"), Err(BadName::OutOfDirectory));
        assert_eq!(checked_name("a/./b"), Err(BadName::OutOfDirectory));
        assert_eq!(checked_name("a\0b"), Err(BadName::Nul));
        assert_eq!(checked_name(&"x".repeat(256)), Err(BadName::TooLong));
    }

    #[test]
    fn copies_stay_within_the_cap_and_survive_a_stopped_interpreter() {
        let mut files = SandboxFiles::default();
        assert!(files.keep("a.csv", vec![1; 6], 10));
        assert!(files.keep("b.bin", vec![2; 6], 10)); // over the cap: listed, not copied
        assert_eq!(files.copies().len(), 1);
        // The worker reports a changed size for a.csv: its copy is stale.
        assert!(files.observe(&[("a.csv".into(), 7), ("b.bin".into(), 6)]));
        assert!(files.copy_of("a.csv").is_none());
        assert!(!files.keep("a.csv", vec![3; 7], 10));
        assert_eq!(
            files.survive(),
            Survivors {
                kept: vec!["a.csv".into()],
                lost: vec!["b.bin".into()],
            }
        );
        assert_eq!(files.listing(), vec![("a.csv".to_owned(), 7)]);
        assert!(files.clear());
        assert!(files.copies().is_empty());
    }
}
