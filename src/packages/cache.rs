//! The download cache: files kept by content (SHA-256) and index answers kept for a while.
//!
//! Layout under the cache directory: `files/<sha256 hex>` for every downloaded file,
//! `metadata/<sha256 hex of the wheel>` for the core metadata headers of wheels, and
//! `index/<hash of index URL>/<project>.json` for PyPI JSON API answers.

use crate::atomic_file::{self, Durability};
use sha2::{Digest, Sha256};
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// A content-addressed cache rooted at one directory.
#[derive(Debug, Clone)]
pub struct Cache {
    root: PathBuf,
}

/// Length of a SHA-256 digest in hex digits.
const SHA256_HEX_LEN: usize = 64;

/// Hex digits of an index URL's SHA-256 that name its directory under `index/`: 64 bits, enough
/// to tell apart the few index URLs one machine uses, short enough to read in a listing.
const INDEX_KEY_HEX_LEN: usize = 16;

/// Whether `text` is a hex SHA-256 digest (and so safe as a file name).
pub fn is_sha256(text: &str) -> bool {
    text.len() == SHA256_HEX_LEN && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

impl Cache {
    /// A cache in `root` (created on first write).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Cache { root: root.into() }
    }

    /// Its root directory (what [`Cache::new`] was given).
    pub fn root(&self) -> &std::path::Path {
        &self.root
    }

    /// The default location: the user's cache directory (`$XDG_CACHE_HOME` or `~/.cache`)
    /// joined with `mcp-run-python`.
    pub fn default_dir() -> PathBuf {
        dirs::cache_dir()
            .unwrap_or_else(std::env::temp_dir)
            .join("mcp-run-python")
    }

    /// `files/<sha256>`; `None` unless `sha256` is 64 hex digits, since the digest comes from
    /// an index and must not name any other path.
    fn file_path(&self, sha256: &str) -> Option<PathBuf> {
        is_sha256(sha256).then(|| self.root.join("files").join(sha256.to_ascii_lowercase()))
    }

    /// The file whose SHA-256 is `sha256`, if cached and intact (re-hashed on every read; a
    /// corrupt entry is removed and reported as absent).
    pub fn get(&self, sha256: &str) -> Option<Vec<u8>> {
        let path = self.file_path(sha256)?;
        let bytes = std::fs::read(&path).ok()?;
        if sha256_hex(&bytes).eq_ignore_ascii_case(sha256) {
            Some(bytes)
        } else {
            let _ = std::fs::remove_file(&path);
            None
        }
    }

    /// Stores `bytes` under their SHA-256 (atomically: write then rename); returns the hash
    /// (hex). Errors: creating the directory or writing the file.
    pub fn put(&self, bytes: &[u8]) -> io::Result<String> {
        let sha = sha256_hex(bytes);
        let path = self.root.join("files").join(&sha);
        write_atomic(&path, bytes)?;
        Ok(sha)
    }

    /// Whether the file whose SHA-256 is `sha256` is cached (not re-hashed; [`Cache::get`]
    /// checks it when it is read).
    pub fn contains(&self, sha256: &str) -> bool {
        self.file_path(sha256).is_some_and(|p| p.is_file())
    }

    /// `metadata/<sha256>`; `None` unless `sha256` is 64 hex digits (see `file_path`).
    fn metadata_path(&self, sha256: &str) -> Option<PathBuf> {
        is_sha256(sha256).then(|| self.root.join("metadata").join(sha256.to_ascii_lowercase()))
    }

    /// The core metadata headers remembered for the wheel whose SHA-256 is `sha256`.
    pub fn get_metadata(&self, sha256: &str) -> Option<String> {
        std::fs::read_to_string(self.metadata_path(sha256)?).ok()
    }

    /// Remembers the core metadata headers of the wheel whose SHA-256 is `sha256`.
    /// Errors: `sha256` is not 64 hex digits (`InvalidInput`), or writing failed.
    pub fn put_metadata(&self, sha256: &str, headers: &str) -> io::Result<()> {
        let path = self
            .metadata_path(sha256)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a SHA-256 digest"))?;
        write_atomic(&path, headers.as_bytes())
    }

    /// `index/<key of index_url>/<project>.json` (see [`INDEX_KEY_HEX_LEN`]).
    fn index_path(&self, index_url: &str, project: &str) -> PathBuf {
        let key = &sha256_hex(index_url.as_bytes())[..INDEX_KEY_HEX_LEN];
        self.root
            .join("index")
            .join(key)
            .join(format!("{project}.json"))
    }

    /// A cached index answer for `project`, if younger than `max_age` (`None`: any age).
    pub fn get_index(
        &self,
        index_url: &str,
        project: &str,
        max_age: Option<Duration>,
    ) -> Option<Vec<u8>> {
        let path = self.index_path(index_url, project);
        if let Some(max_age) = max_age {
            let modified = std::fs::metadata(&path).and_then(|m| m.modified()).ok()?;
            let age = SystemTime::now()
                .duration_since(modified)
                .unwrap_or_default();
            if age > max_age {
                return None;
            }
        }
        std::fs::read(path).ok()
    }

    /// Stores an index answer for `project` (the JSON API's bytes). Errors: writing failed.
    pub fn put_index(&self, index_url: &str, project: &str, body: &[u8]) -> io::Result<()> {
        write_atomic(&self.index_path(index_url, project), body)
    }
}

/// Writes `bytes` to `path` through a temporary file beside it and a rename, so that a reader
/// (another server on the same cache) never sees half a file.
fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tag = std::process::id().to_string();
    atomic_file::replace(path, &tag, Durability::Unsynced, bytes).map_err(io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_by_content_and_rejects_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::new(dir.path());
        let sha = cache.put(b"hello").unwrap();
        assert_eq!(sha, sha256_hex(b"hello"));
        assert_eq!(cache.get(&sha).as_deref(), Some(&b"hello"[..]));
        std::fs::write(dir.path().join("files").join(&sha), b"tampered").unwrap();
        assert_eq!(cache.get(&sha), None);
        // A digest from an index never names another path.
        assert!(!is_sha256("../../../etc/passwd"));
        assert_eq!(cache.get("../files/x"), None);
        assert!(cache.put_metadata("../x", "Name: x").is_err());
    }
}
