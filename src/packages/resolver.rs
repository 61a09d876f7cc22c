//! The resolver policy (docs/architecture.md §5): which files make up a call's requirements, in three
//! separate steps as uv splits them: resolve (metadata only, with backtracking, on `pubgrub`
//! over the sources of [`super::sources`]), then fetch (every chosen file at once, bounded,
//! verified by SHA-256 into the cache), then install (the worker, given the files as they are).
//!
//! Every version's requirements come from its own core metadata (`Requires-Dist` under
//! Pyodide's markers and the extras asked); the lock file's `depends` only adds what Pyodide
//! loads with a lock package anyway. The lock file's version is tried first; when its file
//! cannot be had, another version with a WebAssembly or pure-Python wheel may be taken from
//! the index, and whatever depends on it is backtracked as needed.

use super::bounds;
use super::provider::{root_version, specifier_range, Pkg, Provider, ProviderError, ROOT_NAME};
use super::requirement::{parse_requirement, BadRequirement};
use super::sources::{Dist, Origin, SourceError, Sources};
use super::wheel::target;
use futures::{StreamExt, TryStreamExt};
use pep508_rs::pep440_rs::Version;
use pep508_rs::{MarkerEnvironment, MarkerEnvironmentBuilder, Requirement, VersionOrUrl};
use pubgrub::{DefaultStringReporter, External, PubGrubError, Ranges, Reporter, Term};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use thiserror::Error;

/// Most package files downloaded at once (count).
pub const MAX_CONCURRENT_DOWNLOADS: usize = 4;

/// Why a call's requirements could not be installed; every variant names the package.
#[derive(Debug, Error)]
pub enum ResolveError {
    /// A requirement (quoted in excerpt, [`bounds::excerpt`]) that does not parse.
    #[error("{requirement}: invalid requirement: {reason}")]
    InvalidRequirement {
        requirement: String,
        /// Not a `#[source]`: the message already ends with its words, and `packages
        /// download` prints each source on a line of its own, which would repeat them.
        reason: BadRequirement,
    },
    /// A PEP 508 `name @ url` requirement (quoted in excerpt).
    #[error("{requirement}: direct URL requirements are not supported")]
    DirectUrl { requirement: String },
    /// No set of versions meets every requirement: the notes on missing versions, then
    /// pubgrub's derivation in words.
    #[error("{0}")]
    NoSolution(String),
    /// A chosen version's metadata or file could not be had.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The call went away, or its install deadline passed, while resolving.
    #[error("resolving was stopped")]
    Cancelled,
    /// The solver's thread panicked.
    #[error("the resolver failed")]
    Panicked(#[source] tokio::task::JoinError),
}

/// One package to install: its file name and bytes (verified by SHA-256).
#[derive(Debug, Clone)]
pub struct Planned {
    /// Normalized name (PEP 503).
    pub name: String,
    /// The version chosen (PEP 440 text).
    pub version: String,
    /// How the worker installs it: [`Origin::Lock`] by name, the others by path.
    pub origin: Origin,
    /// The wheel's file name (a plain name: checked where it is written to disk).
    pub file_name: String,
    /// The file's bytes, shared with whoever else holds this plan.
    pub bytes: Arc<Vec<u8>>,
}

/// The marker environment of the embedded Pyodide (PEP 508 markers).
pub fn pyodide_markers() -> MarkerEnvironment {
    MarkerEnvironment::try_from(MarkerEnvironmentBuilder {
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
    .expect("the Pyodide marker environment has valid versions")
}

/// Sets the flag when dropped: a resolution whose call went away (or whose install deadline
/// passed) stops at the solver's next step instead of running on in its thread.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The resolver: the sources and Pyodide's markers.
pub struct Resolver {
    sources: Arc<Sources>,
    markers: MarkerEnvironment,
}

impl Resolver {
    /// A resolver over `sources`.
    pub fn new(sources: Sources) -> Self {
        Resolver {
            sources: Arc::new(sources),
            markers: pyodide_markers(),
        }
    }

    /// The package that provides top-level module `import_name`: the lock files' mapping,
    /// else the same name.
    pub fn package_for_import(&self, import_name: &str) -> String {
        self.sources
            .package_for_import(import_name)
            .unwrap_or_else(|| import_name.to_owned())
    }

    /// Resolves, then fetches: the files to install for `requirements` (PEP 508 strings) and
    /// `pins` (`name==version` of what the interpreter already has).
    ///
    /// Errors: a requirement that does not parse, a conflict (in words), a failed download.
    pub async fn plan(
        &self,
        requirements: &[String],
        pins: &[String],
    ) -> Result<Vec<Planned>, ResolveError> {
        let chosen = self.resolve(requirements, pins).await?;
        self.fetch(&chosen).await
    }

    /// The distributions that meet `requirements` and `pins` together, from metadata alone.
    ///
    /// Errors: see [`Resolver::plan`].
    pub async fn resolve(
        &self,
        requirements: &[String],
        pins: &[String],
    ) -> Result<Vec<Dist>, ResolveError> {
        let root = root_requirements(requirements, pins)?;
        if root.is_empty() {
            return Ok(Vec::new());
        }
        check_root(&root, requirements.len(), &self.markers)?;
        let cancel = Arc::new(AtomicBool::new(false));
        let _cancel_on_drop = CancelOnDrop(cancel.clone());
        let provider = Provider::new(
            self.sources.clone(),
            tokio::runtime::Handle::current(),
            self.markers.clone(),
            root,
            cancel,
        );
        tokio::task::spawn_blocking(move || solve(&provider))
            .await
            .map_err(ResolveError::Panicked)?
    }

    /// Downloads the files of `dists` ([`MAX_CONCURRENT_DOWNLOADS`] at once; cached ones are
    /// read from the cache), in the order given.
    ///
    /// Errors: the first download that failed, naming its package and version.
    pub async fn fetch(&self, dists: &[Dist]) -> Result<Vec<Planned>, ResolveError> {
        // Owned futures (an `Arc` and a clone each), so that the stream is `Send` for any
        // caller's lifetime.
        let sources = self.sources.clone();
        futures::stream::iter(dists.iter().cloned().map(move |dist: Dist| {
            let sources = sources.clone();
            async move {
                let bytes = sources.file(&dist).await?;
                Ok::<_, ResolveError>(Planned {
                    name: dist.name.to_string(),
                    version: dist.version.to_string(),
                    origin: dist.origin,
                    file_name: dist.file_name.clone(),
                    bytes,
                })
            }
        }))
        .buffered(MAX_CONCURRENT_DOWNLOADS)
        .try_collect()
        .await
    }
}

/// The root of a resolution: `requirements` then `pins`, each parsed under the bounds.
///
/// Errors: the first that does not parse ([`ResolveError::InvalidRequirement`]) or is a
/// direct URL ([`ResolveError::DirectUrl`]), quoted in excerpt.
fn root_requirements(
    requirements: &[String],
    pins: &[String],
) -> Result<Vec<Requirement>, ResolveError> {
    let mut root = Vec::new();
    for text in requirements.iter().chain(pins) {
        let requirement =
            parse_requirement(text).map_err(|reason| ResolveError::InvalidRequirement {
                requirement: bounds::excerpt(text),
                reason,
            })?;
        if matches!(requirement.version_or_url, Some(VersionOrUrl::Url(_))) {
            return Err(ResolveError::DirectUrl {
                requirement: bounds::excerpt(text),
            });
        }
        root.push(requirement);
    }
    Ok(root)
}

/// Runs `pubgrub` over `provider` (blocking: each answer may wait for the network) and puts
/// its outcome in our terms.
///
/// Errors: a conflict ([`ResolveError::NoSolution`], see [`no_solution`]), or
/// [`ResolveError::Cancelled`] when the provider stopped (its only error).
fn solve(provider: &Provider) -> Result<Vec<Dist>, ResolveError> {
    match pubgrub::resolve(provider, Pkg::Root, root_version()) {
        Ok(selected) => Ok(chosen_dists(provider, selected)),
        Err(PubGrubError::NoSolution(tree)) => Err(no_solution(tree, provider)),
        Err(PubGrubError::ErrorInShouldCancel(ProviderError::Cancelled))
        | Err(PubGrubError::ErrorChoosingVersion { .. })
        | Err(PubGrubError::ErrorRetrievingDependencies { .. }) => Err(ResolveError::Cancelled),
    }
}

/// The distributions of the packages `pubgrub` selected (extras and the root are not
/// packages of their own), sorted by name.
fn chosen_dists(
    provider: &Provider,
    selected: pubgrub::SelectedDependencies<Provider>,
) -> Vec<Dist> {
    let mut dists: Vec<Dist> = selected
        .into_iter()
        .filter_map(|(pkg, version)| match pkg {
            Pkg::Name(name) => provider.versions(&name).dists.get(&version).cloned(),
            Pkg::Root | Pkg::Extra(..) => None,
        })
        .collect();
    dists.sort_by(|a, b| a.name.cmp(&b.name));
    dists
}

/// A conflict in words: the notes on missing versions of the packages involved, then
/// `pubgrub`'s derivation over the versions that exist, with the root put in words.
fn no_solution(mut tree: Tree, provider: &Provider) -> ResolveError {
    // The "no version in …" steps are the gaps between releases the solver walked through;
    // the notes say what matters about missing versions.
    tree.collapse_no_versions();
    let mut notes: Vec<String> = Vec::new();
    let mut packages: Vec<&Pkg> = tree.packages().into_iter().collect();
    packages.sort();
    for pkg in packages {
        if let Pkg::Name(name) = pkg {
            if let Some(v) = provider.known_versions(name) {
                notes.extend(v.notes.iter().cloned());
                if v.notes.is_empty() {
                    notes.extend(no_match_note(name, &v, provider.root()));
                }
            }
        }
    }
    simplify(&mut tree, provider);
    let report = plain_words(&DefaultStringReporter::report(&tree));
    // A report without a derivation is a bare requirement: say it fails.
    notes.push(if report.starts_with("Because") {
        report
    } else {
        format!("{report}, which cannot be installed")
    });
    ResolveError::NoSolution(notes.join("\n"))
}

/// Finds requirements of the root that contradict each other outright (the first
/// `asked` are the call's, the rest pins of what the interpreter has), which `pubgrub` would
/// only report as an empty range.
fn check_root(
    root: &[Requirement],
    asked: usize,
    markers: &MarkerEnvironment,
) -> Result<(), ResolveError> {
    let applies: Vec<(usize, &Requirement)> = root
        .iter()
        .enumerate()
        .filter(|(_, r)| r.evaluate_markers(markers, &[]))
        .collect();
    for (i, (at, req)) in applies.iter().enumerate() {
        let mut range: Ranges<Version> = allowed(req);
        for (other_at, other) in &applies[..i] {
            if other.name != req.name {
                continue;
            }
            range = range.intersection(&allowed(other));
            if range.is_empty() {
                let (pin, wanted) = match (*at >= asked, *other_at >= asked) {
                    (true, false) => (Some(*req), *other),
                    (false, true) => (Some(*other), *req),
                    _ => (None, *req),
                };
                return Err(ResolveError::NoSolution(match pin {
                    Some(pin) => format!(
                        "`{wanted}` cannot be met: this sandbox's interpreter already has `{pin}` installed (start a new sandbox or session for another version)"
                    ),
                    None => format!("`{other}` and `{req}` cannot both be met"),
                }));
            }
        }
    }
    Ok(())
}

/// "`name`: no version matches …" when a root requirement of `name` allows none of its
/// versions (the newest one is named).
fn no_match_note(
    name: &pep508_rs::PackageName,
    versions: &super::sources::Versions,
    root: &[Requirement],
) -> Option<String> {
    let req = root.iter().find(|r| &r.name == name)?;
    let range = allowed(req);
    if versions.dists.keys().any(|v| range.contains(v)) {
        return None;
    }
    let newest = versions.dists.keys().next_back()?;
    Some(format!(
        "{name}: no version matches {range} (the newest is {newest})"
    ))
}

/// The versions a requirement's specifier allows; all of them for a direct URL, which
/// resolution refuses later with its own message.
fn allowed(req: &Requirement) -> Ranges<Version> {
    specifier_range(req).unwrap_or_else(Ranges::full)
}

/// `pubgrub`'s account of a conflict, over our packages and with `String` reasons (see
/// `Provider::get_dependencies`).
type Tree = pubgrub::DerivationTree<Pkg, Ranges<Version>, String>;

/// Rewrites every range in the report's tree over the versions that exist: `pubgrub` knows
/// only those it tried, so "textual >=1, <6.3 | >6.3, <6.4 | …" becomes "textual >=1"
/// (as uv does before reporting).
fn simplify(tree: &mut Tree, provider: &Provider) {
    let simpler = |pkg: &Pkg, range: &Ranges<Version>| -> Ranges<Version> {
        match pkg {
            Pkg::Name(name) | Pkg::Extra(name, _) => match provider.known_versions(name) {
                Some(versions) => range.simplify(versions.dists.keys()),
                None => range.clone(),
            },
            Pkg::Root => range.clone(),
        }
    };
    match tree {
        pubgrub::DerivationTree::External(external) => match external {
            External::NotRoot(..) => {}
            External::NoVersions(p, r) | External::Custom(p, r, _) => *r = simpler(p, r),
            External::FromDependencyOf(p, r, dep, dep_range) => {
                *r = simpler(p, r);
                *dep_range = simpler(dep, dep_range);
            }
        },
        pubgrub::DerivationTree::Derived(derived) => {
            for (pkg, term) in derived.terms.iter_mut() {
                *term = match term {
                    Term::Positive(r) => Term::Positive(simpler(pkg, r)),
                    Term::Negative(r) => Term::Negative(simpler(pkg, r)),
                };
            }
            simplify(Arc::make_mut(&mut derived.cause1), provider);
            simplify(Arc::make_mut(&mut derived.cause2), provider);
        }
    }
}

/// `pubgrub`'s report with the root put in words.
fn plain_words(report: &str) -> String {
    let root = format!("{ROOT_NAME} {}", root_version());
    report
        .replace(
            &format!("{root} is forbidden"),
            "the requirements cannot all be met",
        )
        .replace(&format!("{root} depends on"), "the call requires")
        .replace(&root, "the call")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packages::cache::Cache;
    use crate::packages::index::Fetcher;
    use crate::packages::lock::Lockfile;

    use crate::packages::bounds::tests::{nested, on_small_stack};

    /// Offline, with an empty lock and nothing cached: no network I/O whatever happens.
    fn offline_resolver(cache_root: std::path::PathBuf) -> Resolver {
        Resolver::new(Sources::new(
            Arc::new(Lockfile::default()),
            None,
            Fetcher::new(Cache::new(cache_root), true),
            "http://127.0.0.1:9/pypi".into(),
            "http://127.0.0.1:9/".into(),
        ))
    }

    /// A wheel of `name` `version` whose METADATA requires `requires`.
    fn wheel(name: &str, version: &str, requires: &[&str]) -> Vec<u8> {
        let mut metadata = format!("Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n");
        for r in requires {
            metadata.push_str(&format!("Requires-Dist: {r}\n"));
        }
        crate::packages::metadata::tests::wheel_with_metadata(metadata.as_bytes())
    }

    /// A local index (the JSON API as files under `dir/index`, read through `file://`) and a
    /// packages directory, offline: the two sources of a real resolution without a network.
    struct Fixture {
        dir: tempfile::TempDir,
        releases: std::collections::BTreeMap<String, serde_json::Map<String, serde_json::Value>>,
        lock: serde_json::Map<String, serde_json::Value>,
    }

    impl Fixture {
        fn new() -> Self {
            Fixture {
                dir: tempfile::tempdir().expect("a temporary directory"),
                releases: Default::default(),
                lock: Default::default(),
            }
        }

        fn url(&self, sub: &str) -> String {
            format!("file://{}/{sub}", self.dir.path().display())
        }

        fn write(&self, sub: &str, bytes: &[u8]) {
            let path = self.dir.path().join(sub);
            std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
            std::fs::write(path, bytes).expect("write");
        }

        fn index(&mut self, file_name: &str, name: &str, version: &str, requires: &[&str]) {
            let bytes = wheel(name, version, requires);
            self.write(&format!("files/{file_name}"), &bytes);
            let file = serde_json::json!({
                "filename": file_name,
                "url": self.url(&format!("files/{file_name}")),
                "digests": {"sha256": crate::packages::cache::sha256_hex(&bytes)},
            });
            let releases = self.releases.entry(name.to_owned()).or_default();
            releases
                .entry(version.to_owned())
                .or_insert_with(|| serde_json::json!([]))
                .as_array_mut()
                .expect("a list")
                .push(file);
        }

        /// A Pyodide lock package; its file is put in the packages directory when `present`.
        fn lock(
            &mut self,
            file_name: &str,
            name: &str,
            version: &str,
            requires: &[&str],
            present: bool,
        ) {
            let bytes = wheel(name, version, requires);
            if present {
                self.write(&format!("packages/{file_name}"), &bytes);
            }
            self.lock.insert(
                name.to_owned(),
                serde_json::json!({
                    "name": name, "version": version, "file_name": file_name,
                    "sha256": crate::packages::cache::sha256_hex(&bytes), "depends": [], "imports": [name],
                }),
            );
        }

        fn resolver(&self) -> Resolver {
            for (name, releases) in &self.releases {
                let body = serde_json::json!({ "releases": releases });
                self.write(&format!("index/{name}/json"), body.to_string().as_bytes());
            }
            let lock = Lockfile::parse(&serde_json::json!({ "packages": self.lock }).to_string())
                .expect("a lock file");
            Resolver::new(Sources::new(
                Arc::new(lock),
                None,
                Fetcher::new(Cache::new(self.dir.path().join("cache")), true),
                self.url("index"),
                self.url("packages"),
            ))
        }
    }

    fn chosen(resolver: &Resolver, requirements: &[&str]) -> Result<Vec<String>, ResolveError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        let requirements: Vec<String> = requirements.iter().map(|r| r.to_string()).collect();
        let dists = runtime.block_on(resolver.resolve(&requirements, &[]))?;
        Ok(dists
            .iter()
            .map(|d| format!("{} {} {:?}", d.name, d.version, d.origin))
            .collect())
    }

    /// The seed's pydantic case in miniature: the lock's `app` pins the lock's native `core`,
    /// whose file cannot be had; the index's newer `app` needs a `core` with a WebAssembly
    /// wheel. The resolver backtracks from the lock's versions to the index's.
    fn two_sources(core_file_present: bool) -> Fixture {
        let mut f = Fixture::new();
        f.lock(
            "app-1.0-py3-none-any.whl",
            "app",
            "1.0",
            &["core==1.0"],
            true,
        );
        f.lock(
            "core-1.0-cp314-cp314-pyemscripten_2026_0_wasm32.whl",
            "core",
            "1.0",
            &[],
            core_file_present,
        );
        f.index("app-1.0-py3-none-any.whl", "app", "1.0", &["core==1.0"]);
        f.index(
            "app-2.0-py3-none-any.whl",
            "app",
            "2.0",
            &["core==2.0", "extra-dep; extra == 'fast'"],
        );
        f.index(
            "core-1.0-cp314-cp314-manylinux_2_17_x86_64.whl",
            "core",
            "1.0",
            &[],
        );
        f.index(
            "core-2.0-cp314-cp314-pyemscripten_2026_0_wasm32.whl",
            "core",
            "2.0",
            &[],
        );
        f.index(
            "core-2.0-cp314-cp314-manylinux_2_17_x86_64.whl",
            "core",
            "2.0",
            &[],
        );
        f
    }

    #[test]
    fn backtracks_from_the_lock_to_the_index() {
        let f = two_sources(false);
        assert_eq!(
            chosen(&f.resolver(), &["app"]).expect("a resolution"),
            ["app 2.0 Index", "core 2.0 Index"]
        );
        // With the lock's file at hand, the lock's versions are preferred.
        let f = two_sources(true);
        assert_eq!(
            chosen(&f.resolver(), &["app"]).expect("a resolution"),
            ["app 1.0 Lock", "core 1.0 Lock"]
        );
    }

    #[test]
    fn conflicts_are_reported_in_words() {
        let f = two_sources(false);
        let Err(ResolveError::NoSolution(text)) = chosen(&f.resolver(), &["app", "core<2"]) else {
            panic!("expected a conflict");
        };
        assert!(
            text.contains("core: Pyodide's build of core 1.0 (not pure Python) cannot be fetched"),
            "{text}"
        );
        assert!(text.contains("the call requires core <2"), "{text}");
        assert!(text.contains("which cannot be installed"), "{text}");
        assert!(!text.contains(ROOT_NAME), "{text}");
    }

    #[test]
    fn extras_bring_their_requirements() {
        let mut f = two_sources(false);
        f.index("extra_dep-0.1-py3-none-any.whl", "extra-dep", "0.1", &[]);
        assert_eq!(
            chosen(&f.resolver(), &["app[fast]"]).expect("a resolution"),
            ["app 2.0 Index", "core 2.0 Index", "extra-dep 0.1 Index"]
        );
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
            runtime
                .block_on(resolver.resolve(&[nested(3000)], &[]))
                .err()
        });
        let Some(ResolveError::InvalidRequirement {
            requirement,
            reason,
        }) = outcome
        else {
            panic!("expected an invalid requirement, got {outcome:?}");
        };
        assert_eq!(
            reason.to_string(),
            format!("longer than 4096 bytes ({} bytes)", nested(3000).len())
        );
        assert!(requirement.len() < 120, "{requirement}");
        assert!(requirement.starts_with("a ; ((("));
    }

    #[test]
    fn parsed_requirements_meet_pyodides_markers() {
        let ok = parse_requirement("rich<13; python_version >= \"3.8\"").expect("parses");
        let dir = tempfile::tempdir().expect("a temporary directory");
        let resolver = offline_resolver(dir.path().to_owned());
        assert!(ok.evaluate_markers(&resolver.markers, &[]));
    }
}
