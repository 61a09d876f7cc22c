//! Where a package's versions come from (docs/architecture.md §5), and their metadata and files: Pyodide's
//! lock file (its files at the packages URL), the lock file of a mirror made by `packages
//! download` (at a `file://` packages URL), and the index's JSON API.
//!
//! Nothing here decides which version is used; that is the resolver's work
//! ([`super::provider`]). Everything read from the network is untrusted: digests name cache
//! paths only once checked ([`super::cache::is_sha256`]), file names are parsed as wheel names
//! and requirement texts are bounded where they are parsed.

use super::cache::is_sha256;
use super::index::{FetchError, Fetcher, IndexFile, Project};
use super::lock::{normalize, LockPackage, Lockfile};
use super::metadata::CoreMetadata;
use super::wheel::{target, WheelName};
use pep508_rs::pep440_rs::{Version, VersionSpecifiers};
use pep508_rs::PackageName;
use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use thiserror::Error;

/// How long to stop trying the packages URL after it could not be reached.
const PACKAGES_URL_RETRY: Duration = Duration::from_secs(300);

/// Longest `requires_python` text of an index file that is parsed (bytes); longer ones are
/// ignored, as pip ignores unparsable ones.
const MAX_REQUIRES_PYTHON_BYTES: usize = 256;

/// Where a distribution's file comes from, which also decides how the worker installs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Pyodide's lock file: loaded by name with `pyodide.loadPackage`, so that Pyodide applies
    /// its own lock metadata (shared libraries among them).
    Lock,
    /// A mirror's lock file (`packages download`): loaded by path.
    Mirror,
    /// The index: loaded by path.
    Index,
}

/// One version of one package, and the file that provides it.
#[derive(Debug, Clone)]
pub struct Dist {
    /// The package (PEP 503 normalized).
    pub name: PackageName,
    /// The version this file provides.
    pub version: Version,
    /// The wheel's file name (checked to parse as one).
    pub file_name: String,
    /// Where the file is downloaded from (`http(s)://` or `file://`).
    pub url: String,
    /// Hex SHA-256 of the file (64 hex digits, checked).
    pub sha256: String,
    /// Which source offers the file.
    pub origin: Origin,
    /// For [`Origin::Lock`]: the lock file's `depends`, which Pyodide loads with the package
    /// (they include shared libraries that no `Requires-Dist` names).
    pub lock_depends: Vec<String>,
    /// A wheel of the same version on the index (URL and SHA-256), whose metadata stands in
    /// for a lock package's so that its file is not downloaded just to read it.
    pub index_twin: Option<(String, String)>,
}

/// The versions of one package that can be installed, newest last.
#[derive(Debug, Default)]
pub struct Versions {
    /// Each installable version and the one file chosen for it.
    pub dists: BTreeMap<Version, Dist>,
    /// The version the lock file (a mirror's, else Pyodide's) ships, tried first when allowed.
    pub preferred: Option<Version>,
    /// Why versions one might expect are missing, in words (for error messages).
    pub notes: Vec<String>,
}

/// Why a distribution's metadata or file could not be had.
#[derive(Debug, Error)]
pub enum SourceError {
    /// The file (or, for metadata, the wheel) could not be downloaded or did not match.
    #[error("{name} {version}: {source}")]
    Fetch {
        name: String,
        version: String,
        #[source]
        source: FetchError,
    },
    /// Neither a `.metadata` file nor the wheel gave readable core metadata.
    #[error("{name} {version}: no readable metadata in {file_name}")]
    NoMetadata {
        name: String,
        version: String,
        file_name: String,
    },
}

/// Why a lock file's package file cannot be had (the end of a resolver note: "Pyodide's build
/// of … cannot be fetched: …").
#[derive(Debug, Error)]
enum LockFileMissing {
    /// The packages URL failed less than [`PACKAGES_URL_RETRY`] ago; it is not asked again yet.
    #[error("the packages URL {packages_url} could not be reached recently")]
    PackagesUrlDown { packages_url: String },
    /// The packages URL answered, without the file.
    #[error("{url} is not there")]
    Absent { url: String },
    /// Asking the packages URL failed.
    #[error(transparent)]
    Fetch(FetchError),
}

/// The three sources, the cache behind them, and what is known about the packages URL.
pub struct Sources {
    lock: Arc<Lockfile>,
    mirror: Option<Arc<Lockfile>>,
    fetcher: Fetcher,
    index_url: String,
    packages_url: String,
    packages_url_down_since: Mutex<Option<Instant>>,
}

impl Sources {
    /// Sources over Pyodide's `lock`, a mirror's lock file (`mirror`, found at the packages
    /// URL), the index's JSON API base `index_url` and the `packages_url` (a `/` is added).
    pub fn new(
        lock: Arc<Lockfile>,
        mirror: Option<Arc<Lockfile>>,
        fetcher: Fetcher,
        index_url: String,
        mut packages_url: String,
    ) -> Self {
        if !packages_url.ends_with('/') {
            packages_url.push('/');
        }
        Sources {
            lock,
            mirror,
            fetcher,
            index_url,
            packages_url,
            packages_url_down_since: Mutex::new(None),
        }
    }

    /// Every version of `name` that some source can provide, with notes on what is missing.
    /// Never fails: an unreachable source is a note, so that the others still count.
    pub async fn versions(&self, name: &PackageName) -> Versions {
        let mut versions = Versions::default();
        let project = self.project(name, &mut versions.notes).await;
        if let Some(project) = &project {
            self.index_versions(name, project, &mut versions);
        }
        let mirrored = self.mirror.as_ref().and_then(|m| m.get(name));
        let locked = self.lock.get(name);
        if let Some(pkg) = mirrored {
            let same_as_lock = locked.is_some_and(|l| l.sha256.eq_ignore_ascii_case(&pkg.sha256));
            let origin = if same_as_lock {
                Origin::Lock
            } else {
                Origin::Mirror
            };
            self.add_lock_package(name, pkg, origin, project.as_ref(), &mut versions)
                .await;
        }
        if let Some(pkg) = locked {
            if mirrored.is_none() {
                self.add_lock_package(name, pkg, Origin::Lock, project.as_ref(), &mut versions)
                    .await;
            }
        }
        versions
    }

    /// The index's answer for `name`, or a note saying why there is none.
    async fn project(&self, name: &PackageName, notes: &mut Vec<String>) -> Option<Project> {
        match self.fetcher.project(&self.index_url, name.as_ref()).await {
            Ok(project) => Some(project),
            Err(FetchError::NotFound { .. }) => {
                if self.lock.get(name).is_none() {
                    notes.push(format!("{name}: no such package on the index"));
                }
                None
            }
            Err(e) => {
                notes.push(format!("{name}: the index could not be read: {e}"));
                None
            }
        }
    }

    /// Adds the index's installable versions of `name` (one wheel each: the Pyodide build
    /// when there is one, else the pure-Python wheel).
    fn index_versions(&self, name: &PackageName, project: &Project, versions: &mut Versions) {
        let mut releases = 0usize;
        for (text, files) in &project.releases {
            let Ok(version) = Version::from_str(text) else {
                continue;
            };
            if !files.is_empty() {
                releases += 1;
            }
            let best = files
                .iter()
                .filter(|f| installable(f))
                .filter_map(|f| WheelName::parse(&f.filename).map(|w| (w, f)))
                .filter(|(w, _)| w.is_compatible())
                .max_by_key(|(w, _)| !w.is_pure());
            if let Some((_, file)) = best {
                versions.dists.insert(
                    version.clone(),
                    Dist {
                        name: name.clone(),
                        version,
                        file_name: file.filename.clone(),
                        url: file.url.clone(),
                        sha256: file.digests.sha256.clone(),
                        origin: Origin::Index,
                        lock_depends: Vec::new(),
                        index_twin: None,
                    },
                );
            }
        }
        if releases > 0 && versions.dists.is_empty() {
            versions.notes.push(format!(
                "{name}: no release has a wheel that runs on Pyodide (pure Python or {})",
                target::PLATFORM_TAG
            ));
        }
    }

    /// Adds a lock file's package when its file can be had; else notes why not (a
    /// pure-Python wheel of the same version from the index stays in its place).
    async fn add_lock_package(
        &self,
        name: &PackageName,
        pkg: &LockPackage,
        origin: Origin,
        project: Option<&Project>,
        versions: &mut Versions,
    ) {
        let Ok(version) = Version::from_str(&pkg.version) else {
            return;
        };
        if !is_sha256(&pkg.sha256) || WheelName::parse(&pkg.file_name).is_none() {
            return;
        }
        versions.preferred = Some(version.clone());
        let url = format!("{}{}", self.packages_url, pkg.file_name);
        if let Err(why) = self.lock_file_available(&url, &pkg.sha256).await {
            if !versions.dists.contains_key(&version) {
                let kind = if pkg.is_pure_python() {
                    "pure Python, but the index has no wheel of that version"
                } else {
                    "not pure Python"
                };
                versions.notes.push(format!(
                    "{name}: Pyodide's build of {name} {version} ({kind}) cannot be fetched: {why}"
                ));
            }
            return;
        }
        let index_twin = project
            .and_then(|p| p.releases.get(&pkg.version))
            .and_then(|files| {
                files
                    .iter()
                    .find(|f| f.filename.ends_with(".whl") && is_sha256(&f.digests.sha256))
                    .map(|f| (f.url.clone(), f.digests.sha256.clone()))
            });
        versions.dists.insert(
            version.clone(),
            Dist {
                name: name.clone(),
                version,
                file_name: pkg.file_name.clone(),
                url,
                sha256: pkg.sha256.clone(),
                origin,
                lock_depends: pkg.depends.clone(),
                index_twin,
            },
        );
    }

    /// Whether a lock file's package file can be had: cached, or present at the packages URL.
    ///
    /// Errors: why not ([`LockFileMissing`]); a network error also marks the packages URL
    /// down for [`PACKAGES_URL_RETRY`].
    async fn lock_file_available(&self, url: &str, sha256: &str) -> Result<(), LockFileMissing> {
        if self.fetcher.cache().contains(sha256) {
            return Ok(());
        }
        if self.packages_url_down() {
            return Err(LockFileMissing::PackagesUrlDown {
                packages_url: self.packages_url.clone(),
            });
        }
        match self.fetcher.exists(url).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(LockFileMissing::Absent {
                url: url.to_owned(),
            }),
            Err(e) => {
                if matches!(e, FetchError::Network { .. }) {
                    tracing::info!("packages URL unreachable, using the index alone: {e}");
                    *self
                        .packages_url_down_since
                        .lock()
                        .unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
                }
                Err(LockFileMissing::Fetch(e))
            }
        }
    }

    /// Whether the packages URL failed less than [`PACKAGES_URL_RETRY`] ago.
    fn packages_url_down(&self) -> bool {
        let guard = self
            .packages_url_down_since
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        guard.is_some_and(|t| t.elapsed() < PACKAGES_URL_RETRY)
    }

    /// The core metadata of `dist`, downloading as little as possible: remembered headers,
    /// then a PEP 658 `.metadata` file (the index twin's, for a lock package), then the wheel
    /// itself (which is kept in the cache for installing).
    ///
    /// Errors: the wheel cannot be downloaded or has no readable metadata.
    pub async fn metadata(&self, dist: &Dist) -> Result<CoreMetadata, SourceError> {
        // Each source once, cheapest first: headers remembered for this wheel, the wheel
        // itself when it is cached, the PEP 658 `.metadata` file (for a lock package, that of
        // the same version on the index), and last the wheel downloaded.
        let cache = self.fetcher.cache();
        let mut headers = cache.get_metadata(&dist.sha256);
        if headers.is_none() {
            if let Some(wheel) = cache.get(&dist.sha256) {
                headers = self
                    .fetcher
                    .headers_from_wheel(&dist.url, &dist.sha256, &wheel);
            }
        }
        if headers.is_none() {
            let (url, sha) = match (&dist.origin, &dist.index_twin) {
                (Origin::Lock, Some((url, sha))) => (url.as_str(), sha.as_str()),
                _ => (dist.url.as_str(), dist.sha256.as_str()),
            };
            // Headers remembered under the index twin's digest (this wheel's own were looked
            // up above).
            let remembered = (sha != dist.sha256)
                .then(|| cache.get_metadata(sha))
                .flatten();
            headers = match remembered {
                Some(remembered) => Some(remembered),
                // A missing or unreachable `.metadata` file is not fatal: the wheel may still
                // be had.
                None => self
                    .fetcher
                    .metadata_headers(url, sha)
                    .await
                    .unwrap_or_else(|e| {
                        tracing::debug!("{}: {e}", dist.name);
                        None
                    }),
            };
        }
        if headers.is_none() {
            let wheel = self.file(dist).await?;
            headers = self
                .fetcher
                .headers_from_wheel(&dist.url, &dist.sha256, &wheel);
        }
        headers
            .map(|h| CoreMetadata::parse(&h))
            .ok_or_else(|| SourceError::NoMetadata {
                name: dist.name.to_string(),
                version: dist.version.to_string(),
                file_name: dist.file_name.clone(),
            })
    }

    /// The file of `dist`, verified by its SHA-256 (from the cache when there).
    ///
    /// Errors: the download failed or the file does not match.
    pub async fn file(&self, dist: &Dist) -> Result<Arc<Vec<u8>>, SourceError> {
        self.fetcher
            .download(&dist.url, &dist.sha256)
            .await
            .map(Arc::new)
            .map_err(|source| SourceError::Fetch {
                name: dist.name.to_string(),
                version: dist.version.to_string(),
                source,
            })
    }

    /// The package that provides top-level module `import`: a mirror's lock, then Pyodide's.
    pub fn package_for_import(&self, import: &str) -> Option<String> {
        self.mirror
            .as_ref()
            .and_then(|m| m.package_for_import(import))
            .or_else(|| self.lock.package_for_import(import))
            .map(|p| normalize(&p.name))
    }
}

/// Whether an index file may be installed at all: a wheel, not yanked, with a digest that is a
/// SHA-256, and a `requires_python` that admits Pyodide's Python (an unparsable one is
/// ignored, as pip does).
fn installable(file: &IndexFile) -> bool {
    if file.yanked || !file.filename.ends_with(".whl") || !is_sha256(&file.digests.sha256) {
        return false;
    }
    let Some(requires) = file.requires_python.as_deref() else {
        return true;
    };
    if requires.len() > MAX_REQUIRES_PYTHON_BYTES {
        return true;
    }
    match (
        VersionSpecifiers::from_str(requires),
        Version::from_str(target::PYTHON_FULL_VERSION),
    ) {
        (Ok(specifiers), Ok(python)) => specifiers.contains(&python),
        _ => true,
    }
}
