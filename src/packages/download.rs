//! `mcp-run-python packages download REQ… --dest DIR`: fills a directory that
//! `--packages-url file://DIR` serves on a machine without a network, with the lock file that
//! describes it (Pyodide's `pyodide-lock.json` format).
//!
//! The directory gets every file of the resolution and a `pyodide-lock.json` whose `info` is
//! the embedded Pyodide's and whose `packages` are the files in it (merged with what an earlier
//! run put there). A server started on it reads that lock file as a mirror's
//! ([`super::sources::Origin::Mirror`]).

use super::resolver::{Planned, ResolveError, Resolver};
use super::sources::Origin;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// The lock file's name in a packages directory (as in a Pyodide distribution).
pub const LOCK_FILE_NAME: &str = "pyodide-lock.json";

/// Why the directory could not be filled.
#[derive(Debug, Error)]
pub enum DownloadError {
    /// Resolving or downloading failed.
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    /// Creating the directory or writing a file in it failed.
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The directory's lock file (or the embedded one) is not JSON this program can read.
    #[error("{path} is not a lock file this program can extend")]
    BadLock {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// A file name that would reach outside the directory (a `/`, a `\`, a leading `.`).
    #[error("a file name from the index is not a plain file name: {0:?}")]
    BadFileName(String),
}

/// Resolves `requirements`, writes their files into `dest` and (re)writes its lock file.
/// `embedded_lock` is the embedded `pyodide-lock.json` text (for its `info` and `imports`).
///
/// Errors: resolution, a download, or writing the directory.
pub async fn download(
    resolver: &Resolver,
    embedded_lock: &str,
    requirements: &[String],
    dest: &Path,
) -> Result<Vec<Planned>, DownloadError> {
    let planned = resolver.plan(requirements, &[]).await?;
    let write = |path: PathBuf, bytes: &[u8]| {
        std::fs::write(&path, bytes).map_err(|source| DownloadError::Write { path, source })
    };
    std::fs::create_dir_all(dest).map_err(|source| DownloadError::Write {
        path: dest.to_owned(),
        source,
    })?;
    let embedded: serde_json::Value =
        serde_json::from_str(embedded_lock).map_err(|source| DownloadError::BadLock {
            path: PathBuf::from("(embedded)"),
            source,
        })?;
    let lock_path = dest.join(LOCK_FILE_NAME);
    let mut lock = match std::fs::read_to_string(&lock_path) {
        Ok(text) => serde_json::from_str::<serde_json::Value>(&text).map_err(|source| {
            DownloadError::BadLock {
                path: lock_path.clone(),
                source,
            }
        })?,
        Err(_) => serde_json::json!({ "info": embedded["info"].clone(), "packages": {} }),
    };
    for p in &planned {
        // The name comes from an index: it must not reach outside the directory.
        if p.file_name.contains('/') || p.file_name.contains('\\') || p.file_name.starts_with('.') {
            return Err(DownloadError::BadFileName(p.file_name.clone()));
        }
        write(dest.join(&p.file_name), &p.bytes)?;
        let known = &embedded["packages"][&p.name];
        let entry = serde_json::json!({
            "name": p.name,
            "version": p.version,
            "file_name": p.file_name,
            "sha256": super::cache::sha256_hex(&p.bytes),
            "depends": if p.origin == Origin::Lock { known["depends"].clone() } else { serde_json::json!([]) },
            "imports": known.get("imports").cloned().unwrap_or_else(|| serde_json::json!([])),
            "package_type": known.get("package_type").cloned().unwrap_or_else(|| serde_json::json!("package")),
            "install_dir": "site",
        });
        if let Some(packages) = lock["packages"].as_object_mut() {
            packages.insert(p.name.clone(), entry);
        }
    }
    let text = serde_json::to_vec_pretty(&lock).map_err(|source| DownloadError::BadLock {
        path: lock_path.clone(),
        source,
    })?;
    write(lock_path, &text)?;
    Ok(planned)
}
