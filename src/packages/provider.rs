//! The resolver's questions answered for `pubgrub` (the solver uv's resolver is built on):
//! which versions a package has, which one to try first, and what each one requires.
//!
//! `pubgrub` asks synchronously; the answers need the network, so the solver runs on a
//! blocking thread and each answer is fetched on the runtime (`Handle::block_on`), remembered
//! for the rest of the resolution. A package with extras is a package of its own
//! (`rich[jupyter]`) that requires the base package at the same version, as in uv.

use super::bounds;
use super::bounds::BoundsError;
use super::requirement::{parse_requirement, BadRequirement};
use super::sources::{Origin, SourceError, Sources, Versions};
use super::wheel::target;
use pep508_rs::pep440_rs::{Version, VersionSpecifiers};
use pep508_rs::{ExtraName, MarkerEnvironment, PackageName, Requirement, VersionOrUrl};
use pubgrub::{
    Dependencies, DependencyConstraints, DependencyProvider, PackageResolutionStatistics, Ranges,
};
use std::cmp::Reverse;
use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use thiserror::Error;

/// How the root of the resolution is named in `pubgrub`'s report before it is put in words
/// ([`super::resolver`] replaces it).
pub const ROOT_NAME: &str = "⊤";

/// A node of the resolution.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pkg {
    /// The call's requirements.
    Root,
    /// A package.
    Name(PackageName),
    /// A package with one extra: the base at the same version, plus the extra's requirements.
    Extra(PackageName, ExtraName),
}

impl fmt::Display for Pkg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pkg::Root => f.write_str(ROOT_NAME),
            Pkg::Name(name) => write!(f, "{name}"),
            Pkg::Extra(name, extra) => write!(f, "{name}[{extra}]"),
        }
    }
}

/// Why the solver stopped without an answer (besides a conflict).
#[derive(Debug, Error)]
pub enum ProviderError {
    /// The install deadline passed (or the call went away) while resolving.
    #[error("resolving was stopped")]
    Cancelled,
}

/// How many older versions' metadata is read ahead at once while backtracking (count).
const PREFETCH_VERSIONS: usize = 8;

/// The try of a package's versions from which older ones are read ahead (the count of its
/// versions whose metadata was asked for): the second, since a package whose first choice
/// holds never needs another.
const PREFETCH_FROM_TRY: usize = 2;

/// What a version requires, or why that cannot be known (shown in conflict reports).
type Requires = Result<Arc<Vec<Requirement>>, Unavailable>;

/// Why a version cannot be used, in the words of a conflict report, where `pubgrub` puts them
/// right after the version (hence the parentheses). Cheap to clone: each version's answer is
/// remembered for the rest of the resolution.
#[derive(Debug, Clone, Error)]
enum Unavailable {
    /// A version listed by no source's file.
    #[error("(no file provides it)")]
    NoFile,
    /// Its core metadata could not be had.
    #[error("(its metadata could not be read: {0})")]
    Metadata(#[source] Arc<SourceError>),
    /// Its `Requires-Python` (the text, kept when under [`bounds::MAX_REQUIREMENT_BYTES`])
    /// excludes Pyodide's Python ([`target::PYTHON_FULL_VERSION`]).
    #[error("(it requires Python {0})")]
    Python(String),
    /// One of its `Requires-Dist` (quoted in excerpt, [`bounds::excerpt`]) is over a bound.
    #[error("(it requires `{requirement}`, which is {source})")]
    RequirementBounds {
        requirement: String,
        #[source]
        source: BoundsError,
    },
    /// It requires a package from a direct URL (PEP 508 `name @ url`).
    #[error("(it requires {0} from a direct URL, which is not supported)")]
    DirectUrl(PackageName),
}

/// Answers `pubgrub` for one resolution.
pub struct Provider {
    sources: Arc<Sources>,
    /// The runtime the answers are fetched on, from the solver's blocking thread.
    handle: tokio::runtime::Handle,
    /// Pyodide's, for the requirements' markers.
    markers: MarkerEnvironment,
    root: Vec<Requirement>,
    /// Each package's versions, asked once.
    versions: Mutex<HashMap<PackageName, Arc<Versions>>>,
    /// Each version's requirements (or why they cannot be had), read once.
    requires: Mutex<HashMap<(PackageName, Version), Requires>>,
    /// How many versions of each package have had their metadata read.
    tried: Mutex<HashMap<PackageName, usize>>,
    cancel: Arc<AtomicBool>,
}

impl Provider {
    /// A provider for the `root` requirements; it stops when `cancel` is set.
    pub fn new(
        sources: Arc<Sources>,
        handle: tokio::runtime::Handle,
        markers: MarkerEnvironment,
        root: Vec<Requirement>,
        cancel: Arc<AtomicBool>,
    ) -> Self {
        Provider {
            sources,
            handle,
            markers,
            root,
            versions: Mutex::new(HashMap::new()),
            requires: Mutex::new(HashMap::new()),
            tried: Mutex::new(HashMap::new()),
            cancel,
        }
    }

    /// The versions of `name` (asked of the sources once per resolution).
    pub fn versions(&self, name: &PackageName) -> Arc<Versions> {
        if let Some(v) = lock(&self.versions).get(name) {
            return v.clone();
        }
        let versions = Arc::new(self.handle.block_on(self.sources.versions(name)));
        lock(&self.versions).insert(name.clone(), versions.clone());
        versions
    }

    /// The root requirements.
    pub fn root(&self) -> &[Requirement] {
        &self.root
    }

    /// The versions already known (for the report's notes), without asking the sources.
    pub fn known_versions(&self, name: &PackageName) -> Option<Arc<Versions>> {
        lock(&self.versions).get(name).cloned()
    }

    /// What `name` `version` requires, from its core metadata.
    fn requires(&self, name: &PackageName, version: &Version) -> Requires {
        let key = (name.clone(), version.clone());
        if let Some(r) = lock(&self.requires).get(&key) {
            return r.clone();
        }
        let versions = self.versions(name);
        self.prefetch_older(name, version, &versions);
        let result = match versions.dists.get(version) {
            None => Err(Unavailable::NoFile),
            Some(dist) => match self.handle.block_on(self.sources.metadata(dist)) {
                Err(e) => Err(Unavailable::Metadata(Arc::new(e))),
                Ok(meta) => self.parse_requires(name, &meta).map(|mut reqs| {
                    if dist.origin == Origin::Lock {
                        // Pyodide loads a lock package's `depends` with it, whatever the wheel
                        // says; some (shared libraries) are named nowhere else.
                        reqs.extend(dist.lock_depends.iter().filter_map(|d| {
                            Requirement::from_str(&super::lock::normalize(d)).ok()
                        }));
                    }
                    Arc::new(reqs)
                }),
            },
        };
        lock(&self.requires).insert(key, result.clone());
        result
    }

    /// Once a second version of a package is tried (the solver is backtracking through it),
    /// reads the metadata of the next [`PREFETCH_VERSIONS`] older ones in the background, so
    /// that walking down a long release history waits for one round trip per batch rather
    /// than per version. The answers land in the metadata cache, where `requires` finds them.
    fn prefetch_older(&self, name: &PackageName, version: &Version, versions: &Versions) {
        let tried = {
            let mut tried = lock(&self.tried);
            let n = tried.entry(name.clone()).or_default();
            *n += 1;
            *n
        };
        if tried < PREFETCH_FROM_TRY
            || !(tried - PREFETCH_FROM_TRY).is_multiple_of(PREFETCH_VERSIONS)
        {
            return;
        }
        for dist in versions
            .dists
            .range(..version.clone())
            .rev()
            .take(PREFETCH_VERSIONS)
            .map(|(_, d)| d.clone())
        {
            let sources = self.sources.clone();
            self.handle.spawn(async move {
                let _ = sources.metadata(&dist).await;
            });
        }
    }

    /// The `Requires-Dist` of a version, parsed under the bounds; checks `Requires-Python`.
    ///
    /// Errors: [`Unavailable::Python`] or [`Unavailable::RequirementBounds`].
    fn parse_requires(
        &self,
        name: &PackageName,
        meta: &super::metadata::CoreMetadata,
    ) -> Result<Vec<Requirement>, Unavailable> {
        if let Some(requires_python) = &meta.requires_python {
            let python = Version::from_str(target::PYTHON_FULL_VERSION);
            if requires_python.len() <= bounds::MAX_REQUIREMENT_BYTES {
                if let (Ok(spec), Ok(python)) =
                    (VersionSpecifiers::from_str(requires_python), python)
                {
                    if !spec.contains(&python) {
                        return Err(Unavailable::Python(requires_python.clone()));
                    }
                }
            }
        }
        let mut out = Vec::new();
        for text in &meta.requires_dist {
            // METADATA is as untrusted as user code: a requirement over the bounds makes the
            // version unusable, while one that merely does not parse is skipped, since old
            // wheels carry sloppy but harmless metadata.
            match parse_requirement(text) {
                Ok(req) => out.push(req),
                Err(BadRequirement::Bounds(source)) => {
                    return Err(Unavailable::RequirementBounds {
                        requirement: bounds::excerpt(text),
                        source,
                    })
                }
                Err(BadRequirement::Syntax(reason)) => tracing::warn!(
                    "{name}: ignoring unparsable Requires-Dist `{}`: {reason}",
                    bounds::excerpt(text)
                ),
            }
        }
        Ok(out)
    }

    /// The constraints of `requirements` whose markers hold with `extras` asked, leaving out
    /// `skip` (the package itself, for an extra's base).
    ///
    /// Errors: [`Unavailable::DirectUrl`], naming a requirement that cannot be met at all.
    fn constraints<'a>(
        &self,
        requirements: impl IntoIterator<Item = &'a Requirement>,
        extras: &[ExtraName],
        skip: Option<&PackageName>,
    ) -> Result<DependencyConstraints<Pkg, Ranges<Version>>, Unavailable> {
        let mut out: DependencyConstraints<Pkg, Ranges<Version>> = Default::default();
        for req in requirements {
            if !req.evaluate_markers(&self.markers, extras) {
                continue;
            }
            let Some(range) = specifier_range(req) else {
                return Err(Unavailable::DirectUrl(req.name.clone()));
            };
            let mut add = |pkg: Pkg| {
                let merged = match out.get(&pkg) {
                    Some(existing) => existing.intersection(&range),
                    None => range.clone(),
                };
                out.insert(pkg, merged);
            };
            if skip != Some(&req.name) {
                add(Pkg::Name(req.name.clone()));
            }
            for extra in &req.extras {
                add(Pkg::Extra(req.name.clone(), extra.clone()));
            }
        }
        Ok(out)
    }

    /// Whether the resolution was stopped (see `CancelOnDrop` in the resolver).
    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }
}

/// Locks `m`, even poisoned: its maps only memoize answers, and a panic while one was held
/// leaves them consistent.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The root's single version.
pub fn root_version() -> Version {
    Version::new([0u64])
}

impl DependencyProvider for Provider {
    type P = Pkg;
    type V = Version;
    type VS = Ranges<Version>;
    /// The words of an [`Unavailable`] (see `get_dependencies`).
    type M = String;
    type Err = ProviderError;
    /// Conflicts first, then the package with the fewest versions left (as pubgrub's own
    /// offline provider does); extras right after their base.
    type Priority = (u32, Reverse<usize>);

    fn prioritize(
        &self,
        package: &Pkg,
        range: &Ranges<Version>,
        stats: &PackageResolutionStatistics,
    ) -> Self::Priority {
        let name = match package {
            Pkg::Root | Pkg::Extra(..) => return (u32::MAX, Reverse(0)),
            Pkg::Name(name) => name,
        };
        let count = self
            .versions(name)
            .dists
            .keys()
            .filter(|v| range.contains(v))
            .count();
        if count == 0 {
            return (u32::MAX, Reverse(0));
        }
        (stats.conflict_count(), Reverse(count))
    }

    /// The lock file's version when allowed, else the newest final release, else the newest
    /// pre-release (PEP 440: pre-releases only when nothing else will do).
    fn choose_version(
        &self,
        package: &Pkg,
        range: &Ranges<Version>,
    ) -> Result<Option<Version>, ProviderError> {
        if self.cancelled() {
            return Err(ProviderError::Cancelled);
        }
        let name = match package {
            Pkg::Root => return Ok(Some(root_version()).filter(|v| range.contains(v))),
            Pkg::Name(name) | Pkg::Extra(name, _) => name,
        };
        let versions = self.versions(name);
        if let Some(preferred) = &versions.preferred {
            if range.contains(preferred) && versions.dists.contains_key(preferred) {
                return Ok(Some(preferred.clone()));
            }
        }
        let mut allowed = versions.dists.keys().rev().filter(|v| range.contains(v));
        let newest_final = allowed.clone().find(|v| !v.any_prerelease());
        Ok(newest_final.or_else(|| allowed.next()).cloned())
    }

    fn get_dependencies(
        &self,
        package: &Pkg,
        version: &Version,
    ) -> Result<Dependencies<Pkg, Ranges<Version>, String>, ProviderError> {
        if self.cancelled() {
            return Err(ProviderError::Cancelled);
        }
        let constraints = match package {
            Pkg::Root => self.constraints(&self.root, &[], None),
            Pkg::Name(name) => match self.requires(name, version) {
                Ok(reqs) => self.constraints(reqs.iter(), &[], Some(name)),
                Err(why) => Err(why),
            },
            Pkg::Extra(name, extra) => match self.requires(name, version) {
                Ok(reqs) => self
                    .constraints(reqs.iter(), std::slice::from_ref(extra), Some(name))
                    .map(|mut c| {
                        c.insert(Pkg::Name(name.clone()), Ranges::singleton(version.clone()));
                        c
                    }),
                Err(why) => Err(why),
            },
        };
        Ok(match constraints {
            Ok(c) => Dependencies::Available(c),
            // `pubgrub` keeps the reason in its derivation tree, whose message type must be
            // `Eq` (`DependencyProvider::M`); a fetch error is not, so the reason goes in as
            // its words.
            Err(why) => Dependencies::Unavailable(why.to_string()),
        })
    }

    fn should_cancel(&self) -> Result<(), ProviderError> {
        if self.cancelled() {
            return Err(ProviderError::Cancelled);
        }
        Ok(())
    }
}

/// The versions a requirement's specifier allows (all of them for no specifier); `None` for a
/// direct URL (PEP 508 `name @ url`), which resolution does not support.
pub(super) fn specifier_range(req: &Requirement) -> Option<Ranges<Version>> {
    match &req.version_or_url {
        None => Some(Ranges::full()),
        Some(VersionOrUrl::VersionSpecifier(s)) => Some(s.clone().into()),
        Some(VersionOrUrl::Url(_)) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reasons read as the `String`s they replaced did, in conflict reports.
    #[test]
    fn unavailable_versions_say_why_in_parentheses() {
        let name = PackageName::from_str("core").expect("a name");
        let cases = [
            (Unavailable::NoFile, "(no file provides it)"),
            (
                Unavailable::Python(">=3.15".into()),
                "(it requires Python >=3.15)",
            ),
            (
                Unavailable::RequirementBounds {
                    requirement: "a ; (((".into(),
                    source: BoundsError::Depth {
                        limit: bounds::MAX_NESTING,
                    },
                },
                "(it requires `a ; (((`, which is nested more than 32 levels deep)",
            ),
            (
                Unavailable::DirectUrl(name),
                "(it requires core from a direct URL, which is not supported)",
            ),
        ];
        for (why, words) in cases {
            assert_eq!(why.to_string(), words);
        }
    }
}
