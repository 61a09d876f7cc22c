//! The resolver policy (DESIGN §5): which files make up a call's requirements.
//!
//! A requirement whose name is in the lock file and whose specifier accepts the lock's version
//! is a Pyodide package: its file and its `depends` closure come from the packages URL, checked
//! against the lock's SHA-256; when that URL cannot be reached, a pure-Python wheel of the same
//! name and version comes from PyPI instead. Anything else comes from PyPI's JSON API: the
//! newest release that satisfies the specifier and has a wheel Pyodide can install, with its
//! `Requires-Dist` resolved the same way under Pyodide's markers.

use super::bounds;
use super::index::{FetchError, Fetcher, IndexFile};
use super::lock::{LockPackage, Lockfile};
use super::wheel::{requires_dist, target, WheelName};
use pep508_rs::pep440_rs::{Version, VersionSpecifiers};
use pep508_rs::{
    ExtraName, MarkerEnvironment, MarkerEnvironmentBuilder, PackageName, Requirement, VersionOrUrl,
};
use std::collections::{HashMap, VecDeque};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use thiserror::Error;

/// How long to stop trying the packages URL after it could not be reached.
const PACKAGES_URL_RETRY: Duration = Duration::from_secs(300);

/// Why a requirement could not be installed; every variant names the package.
#[derive(Debug, Error)]
pub enum ResolveError {
    #[error("{requirement}: invalid requirement: {reason}")]
    InvalidRequirement { requirement: String, reason: String },
    #[error("{package}: no such package on the index")]
    NotFound { package: String },
    #[error("{package}: no release matching `{specifier}` has a wheel that runs on Pyodide (pure Python or {platform})")]
    NoWheel {
        package: String,
        specifier: String,
        platform: &'static str,
    },
    #[error("{package}: {source}")]
    Fetch { package: String, source: FetchError },
    #[error("{package}: {reason}")]
    Unavailable { package: String, reason: String },
}

/// Where a planned package is installed from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// A lock-file package, loaded by name with `pyodide.loadPackage`.
    Lock,
    /// A wheel from the index, loaded by path.
    Wheel,
}

/// One package to install: its file name and bytes (already verified).
#[derive(Debug, Clone)]
pub struct Planned {
    /// Normalized name (PEP 503).
    pub name: String,
    pub source: Source,
    pub file_name: String,
    pub bytes: Arc<Vec<u8>>,
}

/// The resolver: lock file, index, packages URL and the download cache.
pub struct Resolver {
    lock: Arc<Lockfile>,
    fetcher: Fetcher,
    index_url: String,
    packages_url: String,
    markers: MarkerEnvironment,
    packages_url_down_since: Mutex<Option<Instant>>,
}

struct Pending {
    requirement: Requirement,
    /// Extras that were asked of the package that needs this one (for `extra == …` markers).
    parent_extras: Vec<ExtraName>,
}

/// Why a requirement string was not parsed.
#[derive(Debug, Error)]
enum BadRequirement {
    /// Over a bound of [`bounds::check_requirement`]; never handed to the parser.
    #[error(transparent)]
    Bounds(#[from] bounds::BoundsError),
    /// The parser's message.
    #[error("{0}")]
    Syntax(String),
}

/// Parses one PEP 508 requirement from untrusted text (user code, `--deps`, a wheel's
/// `Requires-Dist`), checking [`bounds::check_requirement`] first so that `pep508_rs`'s
/// recursive parser never sees text that could exhaust the stack or its decision diagram.
///
/// Errors: the bound broken, or the parser's message.
fn parse_requirement(text: &str) -> Result<Requirement, BadRequirement> {
    bounds::check_requirement(text)?;
    Requirement::from_str(text).map_err(|e| BadRequirement::Syntax(e.message.to_string()))
}

impl Resolver {
    /// A resolver for the given lock file, PyPI JSON API base (`index_url`) and Pyodide
    /// packages URL (`packages_url`, ending in `/`).
    pub fn new(
        lock: Arc<Lockfile>,
        fetcher: Fetcher,
        index_url: String,
        packages_url: String,
    ) -> Self {
        let markers = MarkerEnvironment::try_from(MarkerEnvironmentBuilder {
            implementation_name: "cpython",
            implementation_version: target::PYTHON_FULL_VERSION,
            os_name: "posix",
            platform_machine: "wasm32",
            platform_python_implementation: "CPython",
            platform_release: target::EMSCRIPTEN_VERSION,
            platform_system: "Emscripten",
            platform_version: "#1",
            python_full_version: target::PYTHON_FULL_VERSION,
            python_version: target::PYTHON_VERSION,
            sys_platform: "emscripten",
        })
        .expect("the Pyodide marker environment has valid versions");
        let mut packages_url = packages_url;
        if !packages_url.ends_with('/') {
            packages_url.push('/');
        }
        Resolver {
            lock,
            fetcher,
            index_url,
            packages_url,
            markers,
            packages_url_down_since: Mutex::new(None),
        }
    }

    /// The lock file.
    pub fn lock(&self) -> &Lockfile {
        &self.lock
    }

    /// Resolves `requirements` (PEP 508 strings) to the files to install, dependencies first
    /// for lock packages. Errors name the package that failed and why.
    pub async fn resolve(&self, requirements: &[String]) -> Result<Vec<Planned>, ResolveError> {
        let mut queue: VecDeque<Pending> = VecDeque::new();
        for text in requirements {
            let requirement =
                parse_requirement(text).map_err(|e| ResolveError::InvalidRequirement {
                    requirement: bounds::excerpt(text),
                    reason: e.to_string(),
                })?;
            queue.push_back(Pending {
                requirement,
                parent_extras: Vec::new(),
            });
        }
        let mut planned: Vec<Planned> = Vec::new();
        let mut seen: HashMap<String, String> = HashMap::new();
        while let Some(Pending {
            requirement,
            parent_extras,
        }) = queue.pop_front()
        {
            if !requirement.evaluate_markers(&self.markers, &parent_extras) {
                continue;
            }
            let name = requirement.name.to_string();
            let specifier = match &requirement.version_or_url {
                None => VersionSpecifiers::empty(),
                Some(VersionOrUrl::VersionSpecifier(s)) => s.clone(),
                Some(VersionOrUrl::Url(_)) => {
                    return Err(ResolveError::Unavailable {
                        package: name,
                        reason: "direct URL requirements are not supported".into(),
                    })
                }
            };
            if let Some(version) = seen.get(&name) {
                if let Ok(v) = Version::from_str(version) {
                    if !specifier.contains(&v) {
                        tracing::warn!("{name} {version} is already chosen; `{requirement}` asks for another version");
                    }
                }
                continue;
            }
            if let Some(pkg) = self.lock_match(&requirement.name, &specifier) {
                for dep in self.lock_closure(pkg) {
                    let dep_name = super::lock::normalize(&dep.name);
                    if seen.contains_key(&dep_name) {
                        continue;
                    }
                    let bytes = self.lock_file(dep).await?;
                    seen.insert(dep_name.clone(), dep.version.clone());
                    planned.push(Planned {
                        name: dep_name,
                        source: Source::Lock,
                        file_name: dep.file_name.clone(),
                        bytes: Arc::new(bytes),
                    });
                }
                continue;
            }
            let (version, file) = self.choose_release(&name, &specifier).await?;
            let bytes = self
                .fetcher
                .download(&file.url, &file.digests.sha256)
                .await
                .map_err(|source| ResolveError::Fetch {
                    package: name.clone(),
                    source,
                })?;
            let requires = requires_dist(&bytes).map_err(|reason| ResolveError::Unavailable {
                package: name.clone(),
                reason,
            })?;
            for text in requires {
                // METADATA is as untrusted as user code: a requirement over the bounds fails the
                // install (naming the package), while one that merely does not parse is skipped
                // as before, since old wheels carry sloppy but harmless metadata.
                match parse_requirement(&text) {
                    Ok(dep) => queue.push_back(Pending {
                        requirement: dep,
                        parent_extras: requirement.extras.clone(),
                    }),
                    Err(e @ BadRequirement::Bounds(_)) => {
                        return Err(ResolveError::InvalidRequirement {
                            requirement: format!("{name} requires `{}`", bounds::excerpt(&text)),
                            reason: e.to_string(),
                        })
                    }
                    Err(BadRequirement::Syntax(reason)) => tracing::warn!(
                        "{name}: ignoring unparsable Requires-Dist `{}`: {reason}",
                        bounds::excerpt(&text)
                    ),
                }
            }
            seen.insert(name.clone(), version.to_string());
            planned.push(Planned {
                name,
                source: Source::Wheel,
                file_name: file.filename.clone(),
                bytes: Arc::new(bytes),
            });
        }
        Ok(planned)
    }

    fn lock_match(
        &self,
        name: &PackageName,
        specifier: &VersionSpecifiers,
    ) -> Option<&LockPackage> {
        let pkg = self.lock.get(name)?;
        let version = Version::from_str(&pkg.version).ok()?;
        specifier.contains(&version).then_some(pkg)
    }

    /// `pkg` and everything it depends on in the lock file, dependencies first.
    fn lock_closure<'a>(&'a self, pkg: &'a LockPackage) -> Vec<&'a LockPackage> {
        fn visit<'a>(lock: &'a Lockfile, pkg: &'a LockPackage, out: &mut Vec<&'a LockPackage>) {
            if out.iter().any(|p| p.name == pkg.name) {
                return;
            }
            out.push(pkg);
            for dep in &pkg.depends {
                match PackageName::from_str(dep).ok().and_then(|n| lock.get(&n)) {
                    Some(d) => visit(lock, d, out),
                    None => tracing::warn!("lock package {} depends on unknown {dep}", pkg.name),
                }
            }
        }
        let mut out = Vec::new();
        visit(&self.lock, pkg, &mut out);
        out.reverse();
        out
    }

    /// The file of lock package `pkg`: cache, then the packages URL, then (pure Python only)
    /// the same wheel from the index.
    async fn lock_file(&self, pkg: &LockPackage) -> Result<Vec<u8>, ResolveError> {
        if let Some(bytes) = self.fetcher.cache().get(&pkg.sha256) {
            return Ok(bytes);
        }
        let why;
        if !self.packages_url_down() {
            let url = format!("{}{}", self.packages_url, pkg.file_name);
            match self.fetcher.download(&url, &pkg.sha256).await {
                Ok(bytes) => return Ok(bytes),
                Err(e @ FetchError::Network { .. }) => {
                    tracing::info!("packages URL unreachable, trying the index instead: {e}");
                    *self
                        .packages_url_down_since
                        .lock()
                        .unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
                    why = e.to_string();
                }
                Err(e @ FetchError::Offline(_)) => why = e.to_string(),
                Err(e) => why = e.to_string(),
            }
        } else {
            why = format!(
                "the packages URL {} could not be reached recently",
                self.packages_url
            );
        }
        if !pkg.is_pure_python() {
            return Err(ResolveError::Unavailable {
                package: pkg.name.clone(),
                reason: format!(
                    "Pyodide package {} {} is not pure Python and its file cannot be fetched: {why}",
                    pkg.name, pkg.version
                ),
            });
        }
        let project = self.project(&pkg.name).await?;
        let files = project
            .releases
            .get(&pkg.version)
            .cloned()
            .unwrap_or_default();
        let Some(file) = files.iter().find(|f| f.filename == pkg.file_name) else {
            return Err(ResolveError::Unavailable {
                package: pkg.name.clone(),
                reason: format!("{why}; and the index has no {}", pkg.file_name),
            });
        };
        // Prefer the very file the lock names; a rebuilt lock wheel of the same pure-Python
        // release differs only in its hash, so the index's own digest is checked instead.
        if !file.digests.sha256.eq_ignore_ascii_case(&pkg.sha256) {
            tracing::info!(
                "{}: the index's {} differs from the lock's build; using the index's (verified by its SHA-256)",
                pkg.name,
                pkg.file_name
            );
        }
        self.fetcher
            .download(&file.url, &file.digests.sha256)
            .await
            .map_err(|source| ResolveError::Fetch {
                package: pkg.name.clone(),
                source,
            })
    }

    fn packages_url_down(&self) -> bool {
        let guard = self
            .packages_url_down_since
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        guard.is_some_and(|t| t.elapsed() < PACKAGES_URL_RETRY)
    }

    async fn project(&self, name: &str) -> Result<super::index::Project, ResolveError> {
        self.fetcher
            .project(&self.index_url, &super::lock::normalize(name))
            .await
            .map_err(|source| match source {
                FetchError::NotFound(_) => ResolveError::NotFound {
                    package: name.to_owned(),
                },
                source => ResolveError::Fetch {
                    package: name.to_owned(),
                    source,
                },
            })
    }

    /// The newest release of `name` matching `specifier` that has an installable wheel.
    async fn choose_release(
        &self,
        name: &str,
        specifier: &VersionSpecifiers,
    ) -> Result<(Version, IndexFile), ResolveError> {
        let project = self.project(name).await?;
        let python = Version::from_str(target::PYTHON_FULL_VERSION).expect("valid version");
        let allow_pre = specifier.iter().any(|s| s.any_prerelease());
        let mut releases: Vec<(Version, &Vec<IndexFile>)> = project
            .releases
            .iter()
            .filter_map(|(v, files)| Some((Version::from_str(v).ok()?, files)))
            .filter(|(v, _)| specifier.contains(v) && (allow_pre || !v.any_prerelease()))
            .collect();
        releases.sort_by(|a, b| b.0.cmp(&a.0));
        let any_release = !releases.is_empty();
        for (version, files) in releases {
            let wheel = files.iter().find(|f| {
                !f.yanked
                    && WheelName::parse(&f.filename).is_some_and(|w| w.is_compatible())
                    && f.requires_python.as_deref().is_none_or(|rp| {
                        VersionSpecifiers::from_str(rp)
                            .map(|s| s.contains(&python))
                            .unwrap_or(true)
                    })
            });
            if let Some(file) = wheel {
                return Ok((version, file.clone()));
            }
        }
        if !any_release && specifier.is_empty() {
            return Err(ResolveError::NotFound {
                package: name.to_owned(),
            });
        }
        Err(ResolveError::NoWheel {
            package: name.to_owned(),
            specifier: if specifier.is_empty() {
                "any version".into()
            } else {
                specifier.to_string()
            },
            platform: target::PLATFORM_TAG,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packages::cache::Cache;

    use crate::packages::bounds::tests::{nested, on_small_stack};

    /// Offline, with an empty lock and nothing cached: no network I/O whatever happens.
    fn offline_resolver(cache_root: std::path::PathBuf) -> Resolver {
        Resolver::new(
            Arc::new(Lockfile::default()),
            Fetcher::new(Cache::new(cache_root), true),
            "http://127.0.0.1:9/pypi".into(),
            "http://127.0.0.1:9/".into(),
        )
    }

    #[test]
    fn requirements_over_the_bounds_are_invalid_and_not_echoed_whole() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let root = dir.path().to_owned();
        // Resolving must not recurse on the requirement's nesting.
        let outcome = on_small_stack(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            let resolver = offline_resolver(root);
            runtime.block_on(resolver.resolve(&[nested(3000)])).err()
        });
        let Some(ResolveError::InvalidRequirement {
            requirement,
            reason,
        }) = outcome
        else {
            panic!("expected an invalid requirement, got {outcome:?}");
        };
        assert_eq!(
            reason,
            format!("longer than 4096 bytes ({} bytes)", nested(3000).len())
        );
        assert!(requirement.len() < 120, "{requirement}");
        assert!(requirement.starts_with("a ; ((("));
    }

    #[test]
    fn parse_requirement_bounds_before_parsing() {
        assert!(matches!(
            parse_requirement(&nested(1000)),
            Err(BadRequirement::Bounds(bounds::BoundsError::Depth { .. }))
        ));
        assert_eq!(
            parse_requirement(&nested(1000))
                .err()
                .map(|e| e.to_string()),
            Some("nested more than 32 levels deep".to_owned())
        );
        assert!(matches!(
            parse_requirement("rich <<< 13"),
            Err(BadRequirement::Syntax(_))
        ));
        let ok = parse_requirement("rich<13; python_version >= \"3.8\"").expect("parses");
        assert_eq!(ok.name.to_string(), "rich");
        let dir = tempfile::tempdir().expect("a temporary directory");
        let resolver = offline_resolver(dir.path().to_owned());
        assert!(ok.evaluate_markers(&resolver.markers, &[]));
    }
}
