//! The shared state directory (`--state-dir`): where every replica writes its
//! sandboxes' files and metadata after each completed call, so that a sandbox outlives the
//! replica that held it. A replica that gets a call for a sandbox it does not hold (the load
//! balancer moved it after its replica died or drained) restores it from here: a fresh
//! worker, its files back, its dependencies installed; its globals are lost, and the
//! call's `state` note says so.
//!
//! Layout, one directory per sandbox, named by the SHA-256 of its handle (the directory
//! reveals no handle: a handle is a bearer capability):
//!
//! ```text
//! DIR/<sha256 of the handle, hex>/lock        the lock taken around every read-modify-write
//! DIR/<…>/owner.json                          Ownership: generation, replica, times, and
//!                                             which of the files below are the state
//! DIR/<…>/state-<n>.zip                       manifest.json + files/<path>, stored uncompressed
//! DIR/<…>/checkpoint-<n>.bin                  the interpreter's state as a chain of files, each
//!                                             sealed for the handle: a whole image, then one
//!                                             delta per call (`crate::sandbox::checkpoint::file`;
//!                                             checkpoints, docs/architecture.md §3.4)
//! ```
//!
//! **`owner.json` is the commit point.** A save numbers itself (`n`, one more than the
//! record's last), writes its new files under names no record names yet, then replaces
//! `owner.json` whole (a temporary file, flushed, renamed over the old one: atomic on POSIX file
//! systems and NFS), and only then removes the files the old record named and the new one does
//! not. A replica killed anywhere in a save leaves the record of the last completed save and
//! every file it names, so a takeover restores exactly that call's files and interpreter state,
//! never a mix; files a cut save left behind are unnamed, and the next takeover removes them.
//! `owner.json` names the chain's files with their SHA-256, so a file put back from an earlier
//! save is refused. The archive (written only when the files changed) and the record are
//! flushed to disk; a checkpoint file, written after every call, is not (its digest catches a
//! file a host crash cut short, and the sandbox then comes back with its files and a note).
//!
//! **One owner at a time: a generation number, fenced under a lock.** Taking a sandbox over
//! ([`StateDir::claim`]) increments its generation under the sandbox's file lock (`flock`,
//! honoured by local file systems, NFSv4 and EFS). The replica that held it before learns it
//! has lost it before its next call ([`StateDir::generation`]: its own number is lower) and
//! drops its copy; if it was mid-call, its save after the call is refused
//! ([`StateError::Superseded`]) and its answer says so. The load balancer decides where calls
//! go; the state directory only makes sure a stale holder never writes over a newer owner.
//! On a split (two balancers sending one sandbox's calls to two replicas at once) each call
//! runs where it lands, each takeover restores the files of the last call saved, globals are
//! lost at every switch, and of two calls running at once the later save wins whole.

use super::handle::SandboxId;
use crate::atomic_file::{self, Durability};
use crate::protocol::launch::Runtime;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The ownership record's file name.
const OWNER_FILE: &str = "owner.json";

/// The files' archive's file name as builds before numbered saves wrote it (read when a
/// record names no numbered archive).
const LEGACY_STATE_FILE: &str = "state.zip";

/// The interpreter state's file name as builds before checkpoint chains wrote it (removed).
const LEGACY_CHECKPOINT_FILE: &str = "checkpoint.bin";

/// The lock file's name.
const LOCK_FILE: &str = "lock";

/// Largest checkpoint chain read, all its files together (bytes): a whole 4 GiB memory,
/// sealed, with its package list, and as much again of deltas (the front writes the image
/// whole again before its deltas outgrow it).
const MAX_CHAIN_BYTES: u64 = 2 * ((4 << 30) + (1 << 20));

/// Most files in a checkpoint chain (its first, then deltas): the front writes the image
/// whole again before it would pass this.
pub const MAX_CHAIN_FILES: usize = 64;

/// The manifest's name inside the archive.
const MANIFEST: &str = "manifest.json";

/// The folder of the sandbox's files inside the archive.
const FILES_PREFIX: &str = "files/";

/// Hex digits of a sandbox directory's name (a SHA-256).
const DIGEST_HEX_LEN: usize = 64;

/// The archive format this build writes and reads.
const FORMAT: u32 = 1;

/// Largest `owner.json` read (bytes): a few numbers, a replica name, and up to
/// [`MAX_CHAIN_FILES`] chain links of about 90 bytes each.
const MAX_OWNER_BYTES: u64 = 16 << 10;

/// Largest manifest read (bytes): the dependency list and the file names.
const MAX_MANIFEST_BYTES: u64 = 4 << 20;

/// Most sandbox directories one sweep looks at, so that a sweep stays short however large
/// the directory grows (later sweeps see the rest).
const SWEEP_BATCH: usize = 10_000;

/// Who owns a sandbox now (`owner.json`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct Ownership {
    /// Incremented by every takeover; a holder with a lower number has lost the sandbox.
    generation: u64,
    /// The replica that holds it (its random name, for logs).
    replica: String,
    /// When the sandbox was made (seconds since the Unix epoch): `--sandbox-max-lifetime`
    /// counts from here on every replica.
    created_unix: u64,
    /// When its last call completed (seconds since the Unix epoch): `--sandbox-idle-timeout`
    /// counts from here.
    last_used_unix: u64,
    /// The SHA-256 of the principal that owns it (hex), when the server authenticates: only
    /// that principal restores it. The principal itself is not written.
    #[serde(default)]
    principal_sha256: Option<String>,
    /// How many saves wrote here: the last one's number, which names the files it wrote.
    #[serde(default)]
    save: u64,
    /// The save whose `state-<n>.zip` holds the files; `None`: `state.zip` (a directory an
    /// older build wrote).
    #[serde(default)]
    state_save: Option<u64>,
    /// The interpreter state's chain, first file first (checkpoints, docs/architecture.md §3.4); empty: none.
    #[serde(default)]
    chain: Vec<Link>,
}

/// One file of a checkpoint chain, as `owner.json` names it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct Link {
    /// The save that wrote it: the file is `checkpoint-<save>.bin`.
    save: u64,
    /// Its SHA-256 (hex): a restore takes only that file, not one put back from another save.
    sha256: String,
}

/// The name of the archive save `n` wrote.
fn state_file(n: Option<u64>) -> String {
    match n {
        Some(n) => format!("state-{n}.zip"),
        None => LEGACY_STATE_FILE.to_owned(),
    }
}

/// The name of the checkpoint file save `n` wrote.
fn checkpoint_file(n: u64) -> String {
    format!("checkpoint-{n}.bin")
}

/// The record of `principal` in the state directory (SHA-256, hex; the name itself is never
/// written), as [`Ownership::principal_sha256`] and the tasks' records keep it.
pub fn principal_digest(principal: Option<&str>) -> Option<String> {
    principal.map(|p| hex::encode(Sha256::digest(p.as_bytes())))
}

/// What the archive says besides the files' bytes.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Manifest {
    format: u32,
    /// The sandbox's requirements (PEP 508), installed again into a restored sandbox's worker.
    dependencies: Vec<String>,
    /// The runtime `create_sandbox` asked for; left out for the server's own (and by servers
    /// before there were two).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    runtime: Option<Runtime>,
    /// The hosts `create_sandbox` narrowed the sandbox's network to (`allow_net`); left out
    /// when it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    allow_net: Option<Vec<String>>,
    /// Files the sandbox had but the front held no copy of (over `--max-session-file-bytes`):
    /// a restore says they are gone.
    not_kept: Vec<String>,
}

/// A sandbox's state as of its last completed call, to save.
#[derive(Debug, Clone)]
pub struct SavedFiles {
    pub dependencies: Vec<String>,
    /// [`Sandbox::runtime`](crate::sandbox::live::Sandbox::runtime).
    pub runtime: Option<Runtime>,
    /// [`Sandbox::allow_net`](crate::sandbox::live::Sandbox::allow_net).
    pub allow_net: Option<Vec<String>>,
    /// The files the front holds copies of (path relative to the working directory, bytes).
    pub files: Vec<(String, Arc<Vec<u8>>)>,
    /// Files without a copy.
    pub not_kept: Vec<String>,
}

/// What a save does with the sandbox's checkpoint chain.
#[derive(Debug)]
pub enum CheckpointWrite {
    /// Starts a new chain with `file` (`crate::sandbox::checkpoint::file::write`), whose
    /// SHA-256 is `sha256`.
    Whole { file: Vec<u8>, sha256: [u8; 32] },
    /// Appends `file` (`crate::sandbox::checkpoint::file::write_delta`), whose SHA-256 is
    /// `sha256`, to the chain whose last file's SHA-256 is `after`:
    /// [`StateError::ChainMoved`] when it is not.
    Delta {
        after: [u8; 32],
        file: Vec<u8>,
        sha256: [u8; 32],
    },
    /// Removes the chain: the sandbox's state is not current (it could not be captured), and
    /// an older one must not come back.
    Remove,
}

/// A sandbox's files: path relative to its working directory, bytes.
pub type Files = Vec<(String, Vec<u8>)>;

/// A sandbox taken over from the state directory.
#[derive(Debug)]
pub struct Restored {
    /// The generation this replica now holds it under.
    pub generation: u64,
    /// When it was made (seconds since the Unix epoch).
    pub created_unix: u64,
    pub dependencies: Vec<String>,
    /// The runtime it was made with (`None`: the server's own).
    pub runtime: Option<Runtime>,
    /// The hosts its network was narrowed to (`None`: the server's).
    pub allow_net: Option<Vec<String>>,
    pub files: Files,
    pub not_kept: Vec<String>,
    /// The replica that held it before (checked: letters, digits, `-` and `.`).
    pub previous_replica: String,
    /// Why its saved state was refused whole, when it was: it then comes back clean (no files,
    /// no dependencies), and the restore note says why.
    pub refused: Option<Refused>,
    /// Its checkpoint chain, unopened (the caller opens it with the handle's key).
    pub checkpoint: SavedCheckpoint,
}

/// The interpreter state a takeover found.
#[derive(Debug, Default)]
pub enum SavedCheckpoint {
    /// None was saved (the state could not be captured), or the entry was refused whole.
    #[default]
    None,
    /// The files of the chain the last save named, first first, to open with the handle's key.
    Chain(Vec<Vec<u8>>),
    /// A file that is not the one the last save wrote (missing, too large, unreadable, or
    /// put back from an earlier save): refused.
    NotTheLast,
}

/// What a takeover found.
#[derive(Debug)]
pub enum Claim {
    /// The sandbox, now held by this replica.
    Restored(Restored),
    /// No sandbox of that handle was saved, or it expired (and is removed now).
    Absent,
}

/// A state-directory operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The file system refused. The message names the file, never its host path (it reaches
    /// the model); logs give the path (`{:?}`).
    #[error(
        "the state directory could not {action} a sandbox's {}",
        file_name(path)
    )]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A saved file is not what this build writes.
    #[error("a sandbox's {} in the state directory is malformed", file_name(path))]
    Malformed {
        path: PathBuf,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The saved files are larger than this replica keeps (`--max-session-file-bytes`).
    #[error("a sandbox's {} in the state directory holds more than {max} bytes of files (--max-session-file-bytes)", file_name(path))]
    TooLarge { path: PathBuf, max: u64 },
    /// Another replica took the sandbox over since this one's generation.
    #[error("replica {replica} took this sandbox over (generation {generation})")]
    Superseded { replica: String, generation: u64 },
    /// A delta's chain is not the one the record names (another save started a new one, or
    /// the chain is full): the caller writes the state whole instead.
    #[error("a sandbox's checkpoint chain is not the one its delta follows")]
    ChainMoved,
}

/// The last part of `path` (`state.zip`, `owner.json`, …): what an error may say of a file in
/// the state directory without naming the host's directories.
fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".to_owned())
}

/// Why a saved sandbox was refused whole (checkpoints, docs/architecture.md §3.4): the shared directory may have been
/// written by a compromised replica, so nothing of an entry that fails a check is used. The
/// words name the check, never a string from the entry nor a host path: they reach the model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("its archive could not be read or is not of this version's format")]
    Unreadable,
    #[error(
        "its files are larger than this replica keeps (--max-session-file-bytes, {max} bytes)"
    )]
    TooLarge { max: u64 },
    #[error("a file name in it would leave the working directory or is malformed")]
    FileName,
    #[error("it names a file twice")]
    Duplicate,
    #[error("a dependency in it is not a requirement of a package index (PEP 508, no direct URL)")]
    Dependency,
    #[error("it lists more than {max} dependencies")]
    TooManyDependencies { max: usize },
    #[error("its record of the replica that held it is malformed")]
    Replica,
}

/// Longest replica name accepted from an ownership record (characters).
const MAX_REPLICA_CHARS: usize = 128;

/// Checks a saved sandbox whole before any of it is used: every file name (the files and
/// those not kept) stays inside the working directory and appears once, every dependency is
/// a PEP 508 requirement of a package index (a direct URL such as `file:///etc/passwd` would
/// fail every later install), at most [`super::MAX_DEPENDENCIES`] of them, and the previous
/// replica's name is one this program writes (it is shown in the restore note).
///
/// Errors: the first [`Refused`] check failed.
fn check_entry(manifest: &Manifest, files: &Files, replica: &str) -> Result<(), Refused> {
    if manifest.format != FORMAT {
        return Err(Refused::Unreadable);
    }
    let mut seen = std::collections::HashSet::new();
    for name in files.iter().map(|(n, _)| n).chain(&manifest.not_kept) {
        super::files::checked_name(name).map_err(|_| Refused::FileName)?;
        if !seen.insert(name.as_str()) {
            return Err(Refused::Duplicate);
        }
    }
    if manifest.dependencies.len() > super::MAX_DEPENDENCIES {
        return Err(Refused::TooManyDependencies {
            max: super::MAX_DEPENDENCIES,
        });
    }
    for dependency in &manifest.dependencies {
        let requirement = crate::packages::requirement::parse_requirement(dependency)
            .map_err(|_| Refused::Dependency)?;
        if matches!(
            requirement.version_or_url,
            Some(pep508_rs::VersionOrUrl::Url(_))
        ) {
            return Err(Refused::Dependency);
        }
    }
    let replica_ok = !replica.is_empty()
        && replica.chars().count() <= MAX_REPLICA_CHARS
        && replica
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.'));
    if !replica_ok {
        return Err(Refused::Replica);
    }
    Ok(())
}

/// Limits a takeover checks: a sandbox idle or old past them is gone, as it would be on the
/// replica that held it.
#[derive(Debug, Clone, Copy)]
pub struct Expiry {
    pub idle: Option<Duration>,
    pub lifetime: Option<Duration>,
}

impl Expiry {
    fn expired(&self, owner: &Ownership, now: u64) -> bool {
        let idle = self
            .idle
            .is_some_and(|d| now.saturating_sub(owner.last_used_unix) >= d.as_secs());
        let old = self
            .lifetime
            .is_some_and(|d| now.saturating_sub(owner.created_unix) >= d.as_secs());
        idle || old
    }
}

/// Seconds since the Unix epoch now.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The shared state directory (see the module's documentation).
#[derive(Debug)]
pub struct StateDir {
    root: PathBuf,
    /// This replica's name in ownership records: random per process.
    replica: String,
    /// Most bytes of files restored into one sandbox (`--max-session-file-bytes`).
    max_file_bytes: u64,
}

/// `result`'s I/O error as a [`StateError`] about `path`.
fn io<T>(result: std::io::Result<T>, action: &'static str, path: &Path) -> Result<T, StateError> {
    result.map_err(|source| StateError::Io {
        action,
        path: path.to_owned(),
        source,
    })
}

/// The JSON document `reader` holds, read up to `max` bytes (a longer one is cut, so it does
/// not parse); `path` names it in errors.
fn read_json<T: serde::de::DeserializeOwned>(
    reader: impl Read,
    max: u64,
    path: &Path,
) -> Result<T, StateError> {
    let mut text = Vec::new();
    io(reader.take(max).read_to_end(&mut text), "read", path)?;
    serde_json::from_slice(&text).map_err(|e| StateError::Malformed {
        path: path.to_owned(),
        source: e.into(),
    })
}

/// The exclusive lock of one sandbox's directory, released when dropped.
struct Locked(File);

impl Drop for Locked {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}

impl StateDir {
    /// The state directory at `root` (made if missing) for a replica named `replica`, restoring
    /// at most `max_file_bytes` of files per sandbox.
    ///
    /// Errors: [`StateError::Io`] when `root` cannot be made or written.
    pub fn open(root: &Path, replica: String, max_file_bytes: u64) -> Result<StateDir, StateError> {
        io(std::fs::create_dir_all(root), "create", root)?;
        let probe = root.join(format!(".probe-{replica}"));
        io(std::fs::write(&probe, b""), "write in", root)?;
        let _ = std::fs::remove_file(&probe);
        Ok(StateDir {
            root: root.to_owned(),
            replica,
            max_file_bytes,
        })
    }

    /// The directory of sandbox `id`.
    fn dir_of(&self, id: &SandboxId) -> PathBuf {
        self.root
            .join(hex::encode(Sha256::digest(id.as_str().as_bytes())))
    }

    /// Locks `dir` (made if `create`), or `None` when it does not exist and `create` is false.
    fn lock(&self, dir: &Path, create: bool) -> Result<Option<Locked>, StateError> {
        if create {
            io(std::fs::create_dir_all(dir), "create", dir)?;
        } else if !dir.is_dir() {
            return Ok(None);
        }
        let path = dir.join(LOCK_FILE);
        let file = io(
            File::options()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path),
            "open",
            &path,
        )?;
        io(file.lock(), "lock", &path)?;
        Ok(Some(Locked(file)))
    }

    /// `dir`'s ownership record, if it has one.
    fn read_owner(dir: &Path) -> Result<Option<Ownership>, StateError> {
        let path = dir.join(OWNER_FILE);
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return io(Err(e), "open", &path),
        };
        read_json(file, MAX_OWNER_BYTES, &path).map(Some)
    }

    /// Writes `bytes` to `dir/name` whole: a temporary file, flushed, renamed over the old one.
    fn replace(
        &self,
        dir: &Path,
        name: &str,
        write: impl FnOnce(&mut File) -> std::io::Result<()>,
    ) -> Result<(), StateError> {
        let path = dir.join(name);
        atomic_file::replace_with(&path, &self.replica, Durability::Synced, write).map_err(|e| {
            StateError::Io {
                action: e.action,
                path: e.path,
                source: e.source,
            }
        })
    }

    fn write_owner(&self, dir: &Path, owner: &Ownership) -> Result<(), StateError> {
        let text = serde_json::to_vec(owner).map_err(|e| StateError::Malformed {
            path: dir.join(OWNER_FILE),
            source: e.into(),
        })?;
        self.replace(dir, OWNER_FILE, |f| f.write_all(&text))
    }

    /// Writes `dir/name`, a name no record names yet, flushed to disk when `flush`.
    fn write_new(
        dir: &Path,
        name: &str,
        flush: bool,
        write: impl FnOnce(&mut File) -> std::io::Result<()>,
    ) -> Result<(), StateError> {
        let path = dir.join(name);
        let mut file = io(File::create(&path), "create", &path)?;
        io(write(&mut file), "write", &path)?;
        if flush {
            io(file.sync_all(), "flush", &path)?;
        }
        Ok(())
    }

    /// Writes `snapshot` as `dir/name` (flushed: it is written only when the files changed).
    fn write_state(dir: &Path, name: &str, snapshot: &SavedFiles) -> Result<(), StateError> {
        let manifest = Manifest {
            format: FORMAT,
            dependencies: snapshot.dependencies.clone(),
            runtime: snapshot.runtime,
            allow_net: snapshot.allow_net.clone(),
            not_kept: snapshot.not_kept.clone(),
        };
        Self::write_new(dir, name, true, |file| {
            let mut zip = zip::ZipWriter::new(file);
            // Stored: the files are written after every call that changed them, and most are
            // small or already compressed.
            let options = zip::write::SimpleFileOptions::default()
                .compression_method(zip::CompressionMethod::Stored)
                .large_file(true);
            zip.start_file(MANIFEST, options)
                .map_err(std::io::Error::other)?;
            serde_json::to_writer(&mut zip, &manifest).map_err(std::io::Error::other)?;
            for (path, bytes) in &snapshot.files {
                zip.start_file(format!("{FILES_PREFIX}{path}"), options)
                    .map_err(std::io::Error::other)?;
                zip.write_all(bytes)?;
            }
            zip.finish().map_err(std::io::Error::other)?;
            Ok(())
        })
    }

    /// Writes save `n`'s checkpoint file (not flushed: its digest in the record catches a file
    /// a host crash cut short) and returns the chain the record names once it is committed.
    ///
    /// Errors: [`StateError::ChainMoved`] for a delta that does not follow `chain`'s last file,
    /// or would make it longer than [`MAX_CHAIN_FILES`]; the file system's.
    fn write_checkpoint(
        dir: &Path,
        n: u64,
        mut chain: Vec<Link>,
        checkpoint: CheckpointWrite,
    ) -> Result<Vec<Link>, StateError> {
        let (file, sha256, appends) = match checkpoint {
            CheckpointWrite::Remove => return Ok(Vec::new()),
            CheckpointWrite::Whole { file, sha256 } => (file, sha256, false),
            CheckpointWrite::Delta {
                after,
                file,
                sha256,
            } => {
                let follows = chain.last().is_some_and(|l| l.sha256 == hex::encode(after));
                if !follows || chain.len() >= MAX_CHAIN_FILES {
                    return Err(StateError::ChainMoved);
                }
                (file, sha256, true)
            }
        };
        Self::write_new(dir, &checkpoint_file(n), false, |f| f.write_all(&file))?;
        if !appends {
            chain.clear();
        }
        chain.push(Link {
            save: n,
            sha256: hex::encode(sha256),
        });
        Ok(chain)
    }

    /// Removes the files `old` named that `new` does not (after `new` is committed), and
    /// those of older builds' layout; a file that cannot be removed is left for the next
    /// takeover's cleanup.
    fn remove_replaced(dir: &Path, old: Option<&Ownership>, new: &Ownership) {
        let mut gone: Vec<String> = Vec::new();
        if old.is_none_or(|o| o.save == 0) {
            gone.push(LEGACY_CHECKPOINT_FILE.to_owned());
        }
        if let Some(old) = old {
            if old.state_save != new.state_save {
                gone.push(state_file(old.state_save));
            }
            let kept: Vec<u64> = new.chain.iter().map(|l| l.save).collect();
            gone.extend(
                old.chain
                    .iter()
                    .filter(|l| !kept.contains(&l.save))
                    .map(|l| checkpoint_file(l.save)),
            );
        }
        for name in gone {
            let _ = std::fs::remove_file(dir.join(name));
        }
    }

    /// Removes from `dir` every file of a save that `owner` does not name: what a save cut
    /// short (its replica killed before its record was committed) left behind, and temporary
    /// files. Run by a takeover, under the lock.
    fn remove_unnamed(dir: &Path, owner: &Ownership) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        let state = state_file(owner.state_save);
        let named = |name: &str| {
            name == state
                || name == OWNER_FILE
                || name == LOCK_FILE
                || owner.chain.iter().any(|l| name == checkpoint_file(l.save))
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                continue;
            };
            let ours = name.starts_with("state")
                || name.starts_with("checkpoint")
                || atomic_file::is_temporary(name);
            if ours && !named(name) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }

    /// Saves sandbox `id` as of a completed call, held under `generation` (0: never saved, so
    /// this save makes it generation 1); `snapshot` is `None` when its files did not change
    /// since the last save; `checkpoint` what to do with its interpreter state (`None`:
    /// nothing). `created_unix` is when it was made. The record is the commit point (see the
    /// module's documentation). Returns the generation it is held under.
    ///
    /// Errors: [`StateError::Superseded`] when another replica took it over since;
    /// [`StateError::ChainMoved`] for a delta that does not follow the saved chain (nothing is
    /// written then); the file system's.
    pub fn save(
        &self,
        id: &SandboxId,
        generation: u64,
        created_unix: u64,
        principal: Option<&str>,
        snapshot: Option<&SavedFiles>,
        checkpoint: Option<CheckpointWrite>,
    ) -> Result<u64, StateError> {
        let dir = self.dir_of(id);
        let _lock = self.lock(&dir, true)?;
        let current = Self::read_owner(&dir)?;
        let generation = match &current {
            Some(owner) if owner.generation > generation => {
                return Err(StateError::Superseded {
                    replica: owner.replica.clone(),
                    generation: owner.generation,
                })
            }
            _ => generation.max(1),
        };
        let n = current.as_ref().map_or(0, |o| o.save) + 1;
        let mut next = Ownership {
            generation,
            replica: self.replica.clone(),
            created_unix,
            last_used_unix: unix_now(),
            principal_sha256: principal_digest(principal),
            save: n,
            state_save: current.as_ref().and_then(|o| o.state_save),
            chain: current
                .as_ref()
                .map(|o| o.chain.clone())
                .unwrap_or_default(),
        };
        if let Some(checkpoint) = checkpoint {
            next.chain = Self::write_checkpoint(&dir, n, next.chain, checkpoint)?;
        }
        if let Some(snapshot) = snapshot {
            Self::write_state(&dir, &state_file(Some(n)), snapshot)?;
            next.state_save = Some(n);
        }
        self.write_owner(&dir, &next)?;
        Self::remove_replaced(&dir, current.as_ref(), &next);
        Ok(generation)
    }

    /// The generation sandbox `id` is held under now, if it was saved.
    ///
    /// Errors: the file system's, or a malformed record.
    pub fn generation(&self, id: &SandboxId) -> Result<Option<u64>, StateError> {
        Ok(Self::read_owner(&self.dir_of(id))?.map(|o| o.generation))
    }

    /// Takes sandbox `id` over for `principal`: increments its generation under its lock, makes
    /// this replica its owner and reads its files. A sandbox past `expiry` is removed instead;
    /// one of another principal is [`Claim::Absent`] and left as it is.
    ///
    /// Errors: the file system's; a malformed or oversized archive.
    pub fn claim(
        &self,
        id: &SandboxId,
        expiry: Expiry,
        principal: Option<&str>,
    ) -> Result<Claim, StateError> {
        let dir = self.dir_of(id);
        let Some(lock) = self.lock(&dir, false)? else {
            return Ok(Claim::Absent);
        };
        let Some(owner) = Self::read_owner(&dir)? else {
            return Ok(Claim::Absent);
        };
        if owner.principal_sha256.is_some() && owner.principal_sha256 != principal_digest(principal)
        {
            return Ok(Claim::Absent);
        }
        let now = unix_now();
        if expiry.expired(&owner, now) {
            drop(lock);
            let _ = std::fs::remove_dir_all(&dir);
            return Ok(Claim::Absent);
        }
        let checked = self
            .read_state(&dir.join(state_file(owner.state_save)))
            .map_err(|e| {
                tracing::warn!("a saved sandbox's state is refused: {e:?}");
                match e {
                    StateError::TooLarge { max, .. } => Refused::TooLarge { max },
                    _ => Refused::Unreadable,
                }
            })
            .and_then(|(manifest, files)| {
                check_entry(&manifest, &files, &owner.replica).map(|()| (manifest, files))
            });
        let (manifest, files, refused) = match checked {
            Ok((manifest, files)) => (manifest, files, None),
            Err(refused) => {
                tracing::warn!("a saved sandbox is refused whole and starts clean: {refused}");
                let clean = Manifest {
                    format: FORMAT,
                    dependencies: Vec::new(),
                    runtime: None,
                    // A sandbox refused whole comes back clean, without the network.
                    allow_net: Some(Vec::new()),
                    not_kept: Vec::new(),
                };
                (clean, Vec::new(), Some(refused))
            }
        };
        let checkpoint = match &refused {
            None if !owner.chain.is_empty() => Self::read_chain(&dir, &owner.chain),
            _ => SavedCheckpoint::None,
        };
        let generation = owner.generation + 1;
        let taken = Ownership {
            generation,
            replica: self.replica.clone(),
            last_used_unix: now,
            ..owner.clone()
        };
        self.write_owner(&dir, &taken)?;
        Self::remove_unnamed(&dir, &taken);
        Ok(Claim::Restored(Restored {
            generation,
            created_unix: owner.created_unix,
            dependencies: manifest.dependencies,
            runtime: manifest.runtime,
            allow_net: manifest.allow_net,
            files,
            not_kept: manifest.not_kept,
            previous_replica: if refused.is_some() {
                String::new()
            } else {
                owner.replica
            },
            refused,
            checkpoint,
        }))
    }

    /// The files of `chain` in `dir`, at most [`MAX_CHAIN_FILES`] of them and
    /// [`MAX_CHAIN_BYTES`] in all, when each is the file the record names (its SHA-256).
    fn read_chain(dir: &Path, chain: &[Link]) -> SavedCheckpoint {
        if chain.len() > MAX_CHAIN_FILES {
            return SavedCheckpoint::NotTheLast;
        }
        let mut files = Vec::with_capacity(chain.len());
        let mut room = MAX_CHAIN_BYTES;
        for link in chain {
            let path = dir.join(checkpoint_file(link.save));
            let Ok(file) = File::open(&path) else {
                return SavedCheckpoint::NotTheLast;
            };
            let mut bytes = Vec::new();
            match file.take(room + 1).read_to_end(&mut bytes) {
                Ok(n) if (n as u64) <= room => room -= n as u64,
                Ok(_) => return SavedCheckpoint::NotTheLast,
                Err(e) => {
                    tracing::warn!("a saved sandbox's checkpoint file could not be read: {e}");
                    return SavedCheckpoint::NotTheLast;
                }
            }
            if hex::encode(Sha256::digest(&bytes)) != link.sha256 {
                tracing::warn!("a saved sandbox's checkpoint file is not the one its record names");
                return SavedCheckpoint::NotTheLast;
            }
            files.push(bytes);
        }
        SavedCheckpoint::Chain(files)
    }

    /// The archive's manifest and files, bounded by `max_file_bytes`.
    fn read_state(&self, path: &Path) -> Result<(Manifest, Files), StateError> {
        let path = path.to_path_buf();
        let malformed = |e: zip::result::ZipError| StateError::Malformed {
            path: path.clone(),
            source: e.into(),
        };
        let file = io(File::open(&path), "open", &path)?;
        let mut archive = zip::ZipArchive::new(file).map_err(malformed)?;
        let manifest: Manifest = read_json(
            archive.by_name(MANIFEST).map_err(malformed)?,
            MAX_MANIFEST_BYTES,
            &path,
        )?;
        let mut files = Vec::new();
        let mut total: u64 = 0;
        for i in 0..archive.len() {
            let entry = archive.by_index(i).map_err(malformed)?;
            let Some(name) = entry.name().strip_prefix(FILES_PREFIX).map(str::to_owned) else {
                continue;
            };
            // Bounded by what is left under the cap, whatever the entry claims its size is.
            let room = self.max_file_bytes.saturating_sub(total);
            let mut bytes = Vec::new();
            io(
                entry.take(room.saturating_add(1)).read_to_end(&mut bytes),
                "read",
                &path,
            )?;
            total = total.saturating_add(bytes.len() as u64);
            if total > self.max_file_bytes {
                return Err(StateError::TooLarge {
                    path,
                    max: self.max_file_bytes,
                });
            }
            files.push((name, bytes));
        }
        Ok((manifest, files))
    }

    /// Removes sandbox `id` (destroyed, expired, evicted), unless another replica holds it
    /// under a newer generation than `generation`.
    ///
    /// Errors: the file system's.
    pub fn remove(&self, id: &SandboxId, generation: u64) -> Result<(), StateError> {
        let dir = self.dir_of(id);
        let Some(lock) = self.lock(&dir, false)? else {
            return Ok(());
        };
        if Self::read_owner(&dir)?.is_some_and(|o| o.generation > generation) {
            return Ok(());
        }
        drop(lock);
        io(std::fs::remove_dir_all(&dir), "remove", &dir)
    }

    /// Removes the saved sandboxes past `expiry` (those whose replica is gone are nobody
    /// else's to remove); at most [`SWEEP_BATCH`] directories a sweep. Returns how many went.
    ///
    /// Errors: the root cannot be listed.
    pub fn sweep(&self, expiry: Expiry) -> Result<usize, StateError> {
        let entries = io(std::fs::read_dir(&self.root), "list", &self.root)?;
        let now = unix_now();
        let mut removed = 0;
        for entry in entries.flatten().take(SWEEP_BATCH) {
            let dir = entry.path();
            // Only sandboxes' directories (named by a digest): others (the tasks' folder) are
            // not this sweep's.
            let named_by_digest = entry.file_name().to_str().is_some_and(|n| {
                n.len() == DIGEST_HEX_LEN && n.bytes().all(|b| b.is_ascii_hexdigit())
            });
            if !dir.is_dir() || !named_by_digest {
                continue;
            }
            let Ok(Some(lock)) = self.lock(&dir, false) else {
                continue;
            };
            if let Ok(Some(owner)) = Self::read_owner(&dir) {
                if expiry.expired(&owner, now) {
                    drop(lock);
                    if std::fs::remove_dir_all(&dir).is_ok() {
                        removed += 1;
                    }
                }
            }
        }
        Ok(removed)
    }
}

/// Runs file-system work off the async threads; a task that panicked counts as an I/O error.
pub async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, StateError> + Send + 'static,
) -> Result<T, StateError> {
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|e| {
        Err(StateError::Io {
            action: "finish work in",
            path: std::path::PathBuf::from("--state-dir"),
            source: std::io::Error::other(e.to_string()),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_EXPIRY: Expiry = Expiry {
        idle: None,
        lifetime: None,
    };

    fn snapshot() -> SavedFiles {
        SavedFiles {
            dependencies: vec!["humanize".into()],
            runtime: Some(Runtime::Scientific),
            allow_net: Some(vec!["api.example.org".into()]),
            files: vec![
                ("a.txt".into(), Arc::new(b"one".to_vec())),
                ("d/b.bin".into(), Arc::new(vec![0, 1, 2])),
            ],
            not_kept: vec!["big.dat".into()],
        }
    }

    /// Saves `snapshot` as replica `a`, then claims it as replica `b`: what `b` restores.
    fn crafted(snapshot: SavedFiles, max_file_bytes: u64) -> Restored {
        let root = tempfile::tempdir().expect("a temp dir");
        let a = StateDir::open(root.path(), "a".into(), 1 << 20).expect("open");
        let b = StateDir::open(root.path(), "b".into(), max_file_bytes).expect("open");
        let id = SandboxId::mint().expect("random");
        a.save(&id, 0, unix_now(), None, Some(&snapshot), None)
            .expect("saved");
        match b.claim(&id, NO_EXPIRY, None).expect("claimed") {
            Claim::Restored(r) => r,
            Claim::Absent => panic!("absent"),
        }
    }

    #[test]
    fn an_entry_that_fails_a_check_is_refused_whole_and_the_sandbox_starts_clean() {
        let cases = [
            (
                SavedFiles {
                    files: vec![("files/../../../../tmp/x".into(), Arc::new(b"x".to_vec()))],
                    ..snapshot()
                },
                Refused::FileName,
            ),
            (
                SavedFiles {
                    files: vec![("../../../../tmp/x".into(), Arc::new(b"x".to_vec()))],
                    ..snapshot()
                },
                Refused::FileName,
            ),
            (
                SavedFiles {
                    dependencies: vec!["evil @ file:///etc/passwd".into()],
                    ..snapshot()
                },
                Refused::Dependency,
            ),
            (
                SavedFiles {
                    dependencies: vec!["not a requirement ((".into()],
                    ..snapshot()
                },
                Refused::Dependency,
            ),
            (
                SavedFiles {
                    not_kept: vec!["/etc/shadow".into()],
                    ..snapshot()
                },
                Refused::FileName,
            ),
            (
                SavedFiles {
                    files: vec![("a".into(), Arc::new(b"1".to_vec()))],
                    not_kept: vec!["a".into()],
                    ..snapshot()
                },
                Refused::Duplicate,
            ),
        ];
        for (snapshot, why) in cases {
            let r = crafted(snapshot, 1 << 20);
            assert_eq!(r.refused, Some(why.clone()), "{why}");
            assert!(r.files.is_empty() && r.dependencies.is_empty() && r.not_kept.is_empty());
            assert_eq!(r.generation, 2, "the claim still takes the sandbox over");
        }
        // Larger than this replica keeps: refused whole, in words without a host path.
        let r = crafted(snapshot(), 2);
        assert_eq!(r.refused, Some(Refused::TooLarge { max: 2 }));
        let words = r.refused.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            !words.contains('/') || words.contains("--max-session-file-bytes"),
            "{words}"
        );
        assert!(!words.contains("tmp"), "{words}");
    }

    #[test]
    fn errors_name_a_file_but_never_its_host_path() {
        let error = StateError::Io {
            action: "open",
            path: PathBuf::from("/srv/secret/state/abcd/state.zip"),
            source: std::io::Error::other("denied"),
        };
        assert_eq!(
            error.to_string(),
            "the state directory could not open a sandbox's state.zip"
        );
        let error = StateError::TooLarge {
            path: PathBuf::from("/srv/secret/state/abcd/state.zip"),
            max: 5,
        };
        assert!(!error.to_string().contains("/srv"), "{error}");
    }

    #[test]
    fn a_saved_sandbox_is_restored_by_another_replica_which_then_owns_it() {
        let root = tempfile::tempdir().expect("a temp dir");
        let a = StateDir::open(root.path(), "a".into(), 1 << 20).expect("open");
        let b = StateDir::open(root.path(), "b".into(), 1 << 20).expect("open");
        let id = SandboxId::mint().expect("random");
        let created = unix_now();
        let generation = a
            .save(&id, 0, created, Some("alice"), Some(&snapshot()), None)
            .expect("saved");
        assert_eq!(generation, 1);
        // A later save without changed files keeps the files.
        assert_eq!(
            a.save(&id, generation, created, Some("alice"), None, None)
                .expect("saved"),
            1
        );
        // Another principal finds nothing, and takes nothing over.
        assert!(matches!(
            b.claim(&id, NO_EXPIRY, Some("mallory")),
            Ok(Claim::Absent)
        ));
        assert!(matches!(b.claim(&id, NO_EXPIRY, None), Ok(Claim::Absent)));
        let Claim::Restored(r) = b.claim(&id, NO_EXPIRY, Some("alice")).expect("claimed") else {
            panic!("absent");
        };
        assert_eq!(r.generation, 2);
        assert_eq!(r.previous_replica, "a");
        assert_eq!(r.created_unix, created);
        assert_eq!(r.dependencies, ["humanize"]);
        assert_eq!(r.runtime, Some(Runtime::Scientific));
        assert_eq!(r.allow_net, Some(vec!["api.example.org".to_owned()]));
        assert_eq!(r.not_kept, ["big.dat"]);
        assert_eq!(
            r.files,
            [
                ("a.txt".to_owned(), b"one".to_vec()),
                ("d/b.bin".to_owned(), vec![0, 1, 2])
            ]
        );
        // The old holder is fenced off: its save is refused, and it can tell before a call.
        assert!(matches!(
            a.save(&id, 1, created, Some("alice"), None, None),
            Err(StateError::Superseded { generation: 2, .. })
        ));
        assert_eq!(a.generation(&id).expect("read"), Some(2));
        // Nor may it remove what the new owner holds.
        a.remove(&id, 1).expect("removed nothing");
        assert_eq!(b.generation(&id).expect("read"), Some(2));
        b.remove(&id, 2).expect("removed");
        assert!(matches!(
            b.claim(&id, NO_EXPIRY, Some("alice")),
            Ok(Claim::Absent)
        ));
    }

    #[test]
    fn the_directory_names_no_handle_and_expired_sandboxes_are_gone() {
        let root = tempfile::tempdir().expect("a temp dir");
        let a = StateDir::open(root.path(), "a".into(), 1 << 20).expect("open");
        let id = SandboxId::mint().expect("random");
        a.save(&id, 0, unix_now() - 100, None, Some(&snapshot()), None)
            .expect("saved");
        let names: Vec<String> = std::fs::read_dir(root.path())
            .expect("listed")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names.iter().all(|n| !n.contains(&id.as_str()[4..])),
            "{names:?}"
        );
        let old = Expiry {
            idle: None,
            lifetime: Some(Duration::from_secs(50)),
        };
        assert_eq!(a.sweep(NO_EXPIRY).expect("swept"), 0);
        assert!(matches!(a.claim(&id, old, None), Ok(Claim::Absent)));
        assert!(matches!(a.claim(&id, NO_EXPIRY, None), Ok(Claim::Absent)));
    }

    #[test]
    fn files_over_the_cap_are_not_restored() {
        let root = tempfile::tempdir().expect("a temp dir");
        let a = StateDir::open(root.path(), "a".into(), 4).expect("open");
        let id = SandboxId::mint().expect("random");
        a.save(&id, 0, unix_now(), None, Some(&snapshot()), None)
            .expect("saved");
        let Ok(Claim::Restored(r)) = a.claim(&id, NO_EXPIRY, None) else {
            panic!("the sandbox is taken over, clean");
        };
        assert_eq!(r.refused, Some(Refused::TooLarge { max: 4 }));
        assert!(r.files.is_empty());
    }

    /// A chain file of `bytes`, whole or following `after`.
    fn whole(bytes: &[u8]) -> CheckpointWrite {
        let sha256 = Sha256::digest(bytes).into();
        CheckpointWrite::Whole {
            file: bytes.to_vec(),
            sha256,
        }
    }

    fn delta(after: &[u8], bytes: &[u8]) -> CheckpointWrite {
        CheckpointWrite::Delta {
            after: Sha256::digest(after).into(),
            file: bytes.to_vec(),
            sha256: Sha256::digest(bytes).into(),
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .expect("listed")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_chain_grows_by_deltas_and_a_whole_image_replaces_it() {
        let root = tempfile::tempdir().expect("a temp dir");
        let a = StateDir::open(root.path(), "a".into(), 1 << 20).expect("open");
        let id = SandboxId::mint().expect("random");
        let (now, snap) = (unix_now(), snapshot());
        let g = a.save(&id, 0, now, None, Some(&snap), Some(whole(b"one")));
        assert_eq!(g.expect("saved"), 1);
        a.save(&id, 1, now, None, None, Some(delta(b"one", b"two")))
            .expect("saved");
        let dir = a.dir_of(&id);
        let files = ["checkpoint-1.bin", "checkpoint-2.bin", "lock", "owner.json"];
        assert_eq!(names(&dir), [&files[..], &["state-1.zip"]].concat());
        // A delta that does not follow the chain's last file writes nothing.
        assert!(matches!(
            a.save(
                &id,
                1,
                now,
                None,
                Some(&snap),
                Some(delta(b"one", b"three"))
            ),
            Err(StateError::ChainMoved)
        ));
        assert_eq!(names(&dir), [&files[..], &["state-1.zip"]].concat());
        // A whole image replaces the chain; new files replace the archive.
        a.save(&id, 1, now, None, Some(&snap), Some(whole(b"four")))
            .expect("saved");
        let files = ["checkpoint-3.bin", "lock", "owner.json", "state-3.zip"];
        assert_eq!(names(&dir), files);
        let b = StateDir::open(root.path(), "b".into(), 1 << 20).expect("open");
        let Ok(Claim::Restored(r)) = b.claim(&id, NO_EXPIRY, None) else {
            panic!("restored");
        };
        assert!(matches!(r.checkpoint, SavedCheckpoint::Chain(c) if c == [b"four".to_vec()]));
        // A save that removes the chain removes its files.
        b.save(&id, 2, now, None, None, Some(CheckpointWrite::Remove))
            .expect("saved");
        assert_eq!(names(&dir), ["lock", "owner.json", "state-3.zip"]);
    }

    #[test]
    fn a_save_cut_before_its_record_leaves_the_last_completed_save_whole() {
        let root = tempfile::tempdir().expect("a temp dir");
        let a = StateDir::open(root.path(), "a".into(), 1 << 20).expect("open");
        let id = SandboxId::mint().expect("random");
        let now = unix_now();
        a.save(&id, 0, now, None, Some(&snapshot()), Some(whole(b"one")))
            .expect("saved");
        a.save(&id, 1, now, None, None, Some(delta(b"one", b"two")))
            .expect("saved");
        // Replica `a` is killed in its third save, after writing its files, before its record.
        let dir = a.dir_of(&id);
        std::fs::write(dir.join("state-3.zip"), b"half an archive").expect("written");
        std::fs::write(dir.join("checkpoint-3.bin"), b"three").expect("written");
        std::fs::write(dir.join(".owner.json.a.tmp"), b"{").expect("written");
        let b = StateDir::open(root.path(), "b".into(), 1 << 20).expect("open");
        let Ok(Claim::Restored(r)) = b.claim(&id, NO_EXPIRY, None) else {
            panic!("restored");
        };
        assert_eq!(r.refused, None);
        assert_eq!(r.files.len(), 2);
        let chain = [b"one".to_vec(), b"two".to_vec()];
        assert!(matches!(r.checkpoint, SavedCheckpoint::Chain(c) if c == chain));
        // What the cut save left is gone; what the record names stays.
        let files = ["checkpoint-1.bin", "checkpoint-2.bin", "lock", "owner.json"];
        assert_eq!(names(&dir), [&files[..], &["state-1.zip"]].concat());
        // A chain file put back from another save is refused by its digest.
        std::fs::write(dir.join("checkpoint-2.bin"), b"TWO").expect("written");
        let Ok(Claim::Restored(r)) = a.claim(&id, NO_EXPIRY, None) else {
            panic!("restored");
        };
        assert!(matches!(r.checkpoint, SavedCheckpoint::NotTheLast));
    }
}
