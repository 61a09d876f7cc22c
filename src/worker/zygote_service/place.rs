//! Where a zygote service lives and which one a front may use: its socket, lock and log in a
//! private directory, named by the digest of everything that shapes the interpreters it forks
//! ([`ServiceKey`]), so that a front never takes forks from a service of another binary,
//! another Pyodide, or other options.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The folder of the services in `$XDG_RUNTIME_DIR` (a per-user, private, memory-backed
/// directory on systemd machines), or in the cache directory when it is not set.
const DIR_NAME: &str = "mcp-run-python";

/// The folder of the services inside the cache directory, when there is no
/// `$XDG_RUNTIME_DIR`.
const CACHE_SUBDIR: &str = "zygote";

/// Prefix and suffix of a service's socket file in its directory: `zygote-<digest>.sock`.
const SOCKET_PREFIX: &str = "zygote-";
const SOCKET_SUFFIX: &str = ".sock";

/// Characters of the digest kept in names (hex: 64 bits, more than enough against
/// accidental collisions; the full digest is checked on every connection).
const NAME_DIGEST_CHARS: usize = 16;

/// Longest path a UNIX socket can be bound to (`sun_path` is 108 bytes, with its NUL).
const MAX_SOCKET_PATH: usize = 107;

/// Permission bits a service directory must not have: anything for group or others.
const PRIVATE_MODE_MASK: u32 = 0o077;

/// Why no zygote service can be used at a place; the front then boots its own interpreters.
#[derive(Debug, thiserror::Error)]
pub enum PlaceError {
    #[error("cannot create or inspect the zygote service's directory {}", .0.display())]
    Dir(PathBuf, #[source] std::io::Error),
    #[error("{} belongs to uid {owner}, not to this user (uid {ours})", .path.display())]
    NotOurs {
        path: PathBuf,
        owner: u32,
        ours: u32,
    },
    #[error("{} is open to other users (mode {mode:o}); it must be 0700", .path.display())]
    NotPrivate { path: PathBuf, mode: u32 },
    #[error("the socket path {} is longer than {MAX_SOCKET_PATH} bytes", .0.display())]
    TooLong(PathBuf),
}

/// Where systemd-logind makes each logged-in user's runtime directory: `/run/user/<uid>`.
const LOGIND_RUNTIME_ROOT: &str = "/run/user";

/// This user's runtime directory: `$XDG_RUNTIME_DIR`, else `/run/user/<uid>` when it exists,
/// belongs to this user and is closed to others. The fallback matters because MCP clients
/// start a stdio server with a few variables only (the `mcp` SDK passes `HOME`, `LOGNAME`,
/// `PATH`, `SHELL`, `TERM` and `USER`), so a front they start would otherwise look elsewhere
/// than `mcp-run-python zygote status` typed in the user's shell.
fn runtime_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    let ours = nix::unistd::geteuid().as_raw();
    let dir = Path::new(LOGIND_RUNTIME_ROOT).join(ours.to_string());
    let meta = std::fs::metadata(&dir).ok()?;
    let private = meta.permissions().mode() & PRIVATE_MODE_MASK == 0;
    (meta.is_dir() && meta.uid() == ours && private).then_some(dir)
}

/// What makes one service's interpreters what they are: the digest of this executable (its
/// identity on disk), the embedded runtime, and the options that shape an interpreter. Two
/// fronts share a service exactly when their keys are equal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceKey {
    /// SHA-256, hex.
    pub digest: String,
}

impl ServiceKey {
    /// The key of this executable and runtime (`runtime`: `assets::runtime_fingerprint`)
    /// with `shaping` (the options that shape an interpreter, as command-line arguments, in a
    /// fixed order) and `mounts` (the `--mount` data every interpreter gets).
    ///
    /// The executable counts by its device, inode, size and modification time: an upgrade or
    /// a rebuild in place is another executable, without reading it all at every start.
    pub fn new(runtime: &str, shaping: &[String], mounts: &[u8]) -> ServiceKey {
        let exe = std::fs::metadata("/proc/self/exe")
            .map(|m| format!("{}:{}:{}:{}", m.dev(), m.ino(), m.size(), m.mtime_nsec()))
            .unwrap_or_default();
        let mut all = Vec::new();
        for part in [exe.as_str(), runtime]
            .into_iter()
            .chain(shaping.iter().map(String::as_str))
        {
            // Lengths first, so that no two different lists of parts make the same bytes.
            all.extend_from_slice(&(part.len() as u64).to_le_bytes());
            all.extend_from_slice(part.as_bytes());
        }
        all.extend_from_slice(crate::packages::cache::sha256_hex(mounts).as_bytes());
        ServiceKey {
            digest: crate::packages::cache::sha256_hex(&all),
        }
    }

    /// The part of the digest that names the service's files.
    pub fn short(&self) -> &str {
        &self.digest[..NAME_DIGEST_CHARS.min(self.digest.len())]
    }
}

/// A service's files: the socket fronts connect to, the lock its process holds for its whole
/// life (so that a socket file whose lock is free is stale), and its log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePlace {
    pub socket: PathBuf,
    pub lock: PathBuf,
    pub log: PathBuf,
}

impl ServicePlace {
    /// The default directory of this user's services: `<runtime dir>/mcp-run-python`, else
    /// `<cache_dir>/zygote`.
    pub fn default_dir(cache_dir: &Path) -> PathBuf {
        match runtime_dir() {
            Some(dir) => dir.join(DIR_NAME),
            None => cache_dir.join(CACHE_SUBDIR),
        }
    }

    /// Every directory a default service of this user may be in (the runtime directory's and
    /// the cache directory's), for `zygote status` and `zygote stop`: a front started without
    /// the runtime directory (see [`runtime_dir`]) uses the cache directory's.
    pub fn default_dirs(cache_dir: &Path) -> Vec<PathBuf> {
        let mut dirs = vec![ServicePlace::default_dir(cache_dir)];
        let cached = cache_dir.join(CACHE_SUBDIR);
        if !dirs.contains(&cached) {
            dirs.push(cached);
        }
        dirs
    }

    /// The place of the service with `key` in `dir`.
    pub fn in_dir(dir: &Path, key: &ServiceKey) -> ServicePlace {
        ServicePlace::at(dir.join(format!("{SOCKET_PREFIX}{}{SOCKET_SUFFIX}", key.short())))
    }

    /// The place whose socket is `socket` (`--zygote-socket`): lock and log beside it, named
    /// as the socket with the extension `.lock` and `.log` in place of its own.
    pub fn at(socket: PathBuf) -> ServicePlace {
        let beside = |ext: &str| {
            let named = socket.with_extension(ext);
            if named == socket {
                // The socket itself is named `*.lock` or `*.log`: append instead.
                let mut name = socket.as_os_str().to_owned();
                name.push(".");
                name.push(ext);
                PathBuf::from(name)
            } else {
                named
            }
        };
        ServicePlace {
            lock: beside("lock"),
            log: beside("log"),
            socket,
        }
    }

    /// Every service socket in `dir` (for `zygote status` and `zygote stop`), sorted.
    pub fn all_in(dir: &Path) -> Vec<ServicePlace> {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        let mut places: Vec<ServicePlace> = entries
            .flatten()
            .filter(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.starts_with(SOCKET_PREFIX) && name.ends_with(SOCKET_SUFFIX)
            })
            .map(|e| ServicePlace::at(e.path()))
            .collect();
        places.sort_by(|a, b| a.socket.cmp(&b.socket));
        places
    }

    /// Makes sure the socket's directory exists and is this user's alone: created 0700 when
    /// missing; an existing one must belong to this user and grant nothing to others. The
    /// socket is then reachable by this user only; the service checks each peer's uid too.
    ///
    /// Errors: [`PlaceError`].
    pub fn prepare(&self) -> Result<(), PlaceError> {
        if self.socket.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(PlaceError::TooLong(self.socket.clone()));
        }
        let dir = self.socket.parent().unwrap_or(Path::new("."));
        let dir_error = |e| PlaceError::Dir(dir.to_owned(), e);
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(dir_error)?;
        }
        let meta = std::fs::metadata(dir).map_err(dir_error)?;
        let ours = nix::unistd::geteuid().as_raw();
        if meta.uid() != ours {
            return Err(PlaceError::NotOurs {
                path: dir.to_owned(),
                owner: meta.uid(),
                ours,
            });
        }
        let mode = meta.permissions().mode() & 0o7777;
        if mode & PRIVATE_MODE_MASK != 0 {
            return Err(PlaceError::NotPrivate {
                path: dir.to_owned(),
                mode,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_differ_by_every_part_and_never_by_how_parts_are_cut() {
        let a = ServiceKey::new("rt", &["--deps".into(), "numpy".into()], b"");
        assert_eq!(
            a,
            ServiceKey::new("rt", &["--deps".into(), "numpy".into()], b"")
        );
        assert_ne!(
            a,
            ServiceKey::new("rt2", &["--deps".into(), "numpy".into()], b"")
        );
        assert_ne!(
            a,
            ServiceKey::new("rt", &["--deps".into(), "rich".into()], b"")
        );
        assert_ne!(a, ServiceKey::new("rt", &["--depsnumpy".into()], b""));
        assert_ne!(
            a,
            ServiceKey::new("rt", &["--deps".into(), "numpy".into()], b"x")
        );
    }

    #[test]
    fn a_directory_open_to_others_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let key = ServiceKey::new("rt", &[], b"");
        let place = ServicePlace::in_dir(&dir.path().join("svc"), &key);
        place.prepare().unwrap();
        let svc = dir.path().join("svc");
        assert_eq!(
            std::fs::metadata(&svc).unwrap().permissions().mode() & 0o777,
            0o700
        );
        std::fs::set_permissions(&svc, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(matches!(
            place.prepare(),
            Err(PlaceError::NotPrivate { .. })
        ));
    }

    #[test]
    fn a_socket_path_too_long_to_bind_is_refused() {
        let long = PathBuf::from(format!("/tmp/{}/z.sock", "d".repeat(120)));
        assert!(matches!(
            ServicePlace::at(long).prepare(),
            Err(PlaceError::TooLong(_))
        ));
    }
}
