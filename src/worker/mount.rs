//! Operator data for every worker (`--mount HOST_DIR:SANDBOX_DIR`): the front
//! reads each host directory once, at start, under a size cap, and hands the bytes to every
//! worker with its `boot` request; the worker writes them into its own in-memory file system,
//! read-only (`runtime/js/runner.js` `mount`). Workers never see the host directory (Landlock leaves
//! them no files), and nothing written in a sandbox reaches the host: each worker holds a
//! copy, and a forked one shares its zygote's copy until it writes.

use crate::protocol::MountPlan;
use std::path::{Path, PathBuf};

/// Most files (and folders) all mounts may hold together.
pub const MAX_MOUNT_ENTRIES: usize = 10_000;

/// `--max-mount-bytes` unless given: 64 MiB for all mounts together.
pub const DEFAULT_MAX_MOUNT_BYTES: u64 = 64 << 20;

/// Sandbox folders a mount may not be at or under: the session's working directory (whose
/// files are its resources), the interpreter's own folders (the standard library at /lib, the
/// device and process folders) and the worker's virtual paths.
const RESERVED: &[&str] = &[
    "/home/pyodide",
    "/lib",
    "/dev",
    "/proc",
    "/sys",
    "/usr",
    "/bin",
    "/etc",
    "/packages",
    "/pyodide",
];

/// One `--mount` argument: a host directory and where it appears in every sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountSpec {
    pub host: PathBuf,
    pub sandbox: String,
}

/// Why a `--mount` argument, or the directory it names, cannot be mounted.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("--mount takes HOST_DIR:SANDBOX_DIR, got {0:?}")]
    Shape(String),
    #[error("the sandbox folder {0:?} must be an absolute path without empty, `.` or `..` parts")]
    NotAbsolute(String),
    #[error("the sandbox folder {path:?} is at or under {reserved}, which the interpreter uses itself; choose another, such as /data")]
    Reserved {
        path: String,
        reserved: &'static str,
    },
    #[error("the sandbox folders {0:?} and {1:?} overlap")]
    Overlap(String, String),
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a directory")]
    NotADirectory { path: PathBuf },
    #[error("the name {0:?} is not UTF-8")]
    NotUtf8(PathBuf),
    #[error("the mounted files come to more than {cap} bytes (--max-mount-bytes)")]
    TooLarge { cap: u64 },
    #[error("the mounts hold more than {MAX_MOUNT_ENTRIES} files and folders")]
    TooMany,
}

impl std::str::FromStr for MountSpec {
    type Err = MountError;

    /// `HOST_DIR:SANDBOX_DIR`; the sandbox folder is checked here, the host one when read.
    fn from_str(arg: &str) -> Result<MountSpec, MountError> {
        let (host, sandbox) = arg
            .rsplit_once(':')
            .filter(|(h, s)| !h.is_empty() && !s.is_empty())
            .ok_or_else(|| MountError::Shape(arg.to_owned()))?;
        let sandbox = sandbox.trim_end_matches('/');
        let parts_ok = sandbox.strip_prefix('/').is_some_and(|rest| {
            rest.split('/')
                .all(|p| !p.is_empty() && p != "." && p != "..")
        });
        if !parts_ok || sandbox.contains('\0') {
            return Err(MountError::NotAbsolute(sandbox.to_owned()));
        }
        if let Some(reserved) = RESERVED
            .iter()
            .find(|r| within(sandbox, r) || within(r, sandbox))
        {
            return Err(MountError::Reserved {
                path: sandbox.to_owned(),
                reserved,
            });
        }
        Ok(MountSpec {
            host: PathBuf::from(host),
            sandbox: sandbox.to_owned(),
        })
    }
}

/// Whether `path` is `folder` or under it.
fn within(path: &str, folder: &str) -> bool {
    path == folder
        || path
            .strip_prefix(folder)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// Every mount, read: the plan and the files' bytes.
#[derive(Debug, Default)]
pub struct Mounts {
    pub plan: MountPlan,
    pub bytes: Vec<u8>,
}

impl Mounts {
    /// Reads every `specs` directory (regular files and folders; symbolic links and other
    /// kinds of files are skipped, so that a mount never reaches outside its directory), at
    /// most `cap` bytes and [`MAX_MOUNT_ENTRIES`] entries in all.
    ///
    /// Errors: [`MountError`]: overlapping sandbox folders, a host path that is no directory
    /// or cannot be read, a name that is not UTF-8, over a cap.
    pub fn load(specs: &[MountSpec], cap: u64) -> Result<Mounts, MountError> {
        for (i, a) in specs.iter().enumerate() {
            for b in &specs[i + 1..] {
                if within(&a.sandbox, &b.sandbox) || within(&b.sandbox, &a.sandbox) {
                    return Err(MountError::Overlap(a.sandbox.clone(), b.sandbox.clone()));
                }
            }
        }
        let mut mounts = Mounts::default();
        for spec in specs {
            let meta = std::fs::metadata(&spec.host).map_err(|source| MountError::Read {
                path: spec.host.clone(),
                source,
            })?;
            if !meta.is_dir() {
                return Err(MountError::NotADirectory {
                    path: spec.host.clone(),
                });
            }
            mounts.add_folder(&spec.host, spec.sandbox.clone(), cap)?;
        }
        Ok(mounts)
    }

    fn add_folder(&mut self, host: &Path, sandbox: String, cap: u64) -> Result<(), MountError> {
        let read = |e| MountError::Read {
            path: host.to_owned(),
            source: e,
        };
        self.count()?;
        self.plan.folders.push(sandbox.clone());
        let mut entries = std::fs::read_dir(host)
            .map_err(read)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(read)?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let path = entry.path();
            let name = entry
                .file_name()
                .into_string()
                .map_err(|_| MountError::NotUtf8(path.clone()))?;
            let inside = format!("{sandbox}/{name}");
            let kind = entry.file_type().map_err(|source| MountError::Read {
                path: path.clone(),
                source,
            })?;
            if kind.is_dir() {
                self.add_folder(&path, inside, cap)?;
            } else if kind.is_file() {
                self.count()?;
                let bytes = std::fs::read(&path).map_err(|source| MountError::Read {
                    path: path.clone(),
                    source,
                })?;
                if (self.bytes.len() + bytes.len()) as u64 > cap {
                    return Err(MountError::TooLarge { cap });
                }
                self.plan.files.push((inside, bytes.len() as u64));
                self.bytes.extend_from_slice(&bytes);
            }
        }
        Ok(())
    }

    fn count(&self) -> Result<(), MountError> {
        if self.plan.folders.len() + self.plan.files.len() >= MAX_MOUNT_ENTRIES {
            return Err(MountError::TooMany);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_folders_are_absolute_and_clear_of_the_interpreters_own() {
        let spec: MountSpec = "/srv/data:/data/".parse().unwrap();
        assert_eq!(spec.sandbox, "/data");
        assert_eq!(spec.host, PathBuf::from("/srv/data"));
        for bad in [
            "/srv:data",
            "/srv:/",
            "/srv:/a/../b",
            "/srv",
            ":/data",
            "/srv:/home/pyodide/x",
            "/srv:/home",
            "/srv:/lib/python3.14",
        ] {
            assert!(bad.parse::<MountSpec>().is_err(), "{bad}");
        }
        assert!("/srv:/library".parse::<MountSpec>().is_ok());
    }

    #[test]
    fn a_directory_is_read_within_its_caps() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("a.csv"), b"x,y\n").unwrap();
        std::fs::write(dir.path().join("sub/b.txt"), b"bee").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("link")).unwrap();
        let spec = MountSpec {
            host: dir.path().to_owned(),
            sandbox: "/data".into(),
        };
        let mounts = Mounts::load(std::slice::from_ref(&spec), 100).unwrap();
        assert_eq!(mounts.plan.folders, ["/data", "/data/sub"]);
        assert_eq!(
            mounts.plan.files,
            [
                ("/data/a.csv".to_owned(), 4),
                ("/data/sub/b.txt".to_owned(), 3)
            ]
        );
        assert_eq!(mounts.bytes, b"x,y\nbee");
        assert!(mounts.plan.fits(&mounts.bytes));
        assert!(matches!(
            Mounts::load(std::slice::from_ref(&spec), 5),
            Err(MountError::TooLarge { cap: 5 })
        ));
        let nested = MountSpec {
            sandbox: "/data/sub".into(),
            ..spec.clone()
        };
        assert!(matches!(
            Mounts::load(&[spec, nested], 100),
            Err(MountError::Overlap(..))
        ));
    }
}
