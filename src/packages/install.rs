//! Getting packages into an interpreter, in uv's three steps: [`plan`] resolves what the
//! interpreter must hold for the requirements wanted, together with what it already has
//! (pinned), so that the answer is one consistent set or a conflict in words; [`fetch`]
//! downloads the plan's files (read from the cache when there); [`to_install`] chooses what
//! the interpreter does not have yet and lays it out as an [`InstallPlan`], the files and
//! items a worker loads.
//!
//! Nothing here knows workers (packages sit below them, docs/architecture.md §5): the call
//! pipeline hands the [`InstallPlan`] to the worker and records what it then has.

use crate::packages::resolver::{Planned, ResolveError, Resolver};
use crate::packages::sources::{Dist, Origin};
use std::collections::HashMap;
use std::sync::Arc;

/// What an interpreter has installed: normalized name (PEP 503) → version (PEP 440 text).
pub type Installed = HashMap<String, String>;

/// The requirements (PEP 508 text) an interpreter must meet for one call, by where they come
/// from.
#[derive(Debug, Clone, Copy)]
pub struct Wanted<'a> {
    /// `--deps`: every interpreter has them.
    pub startup: &'a [String],
    /// The sandbox's own (`create_sandbox`'s `dependencies`).
    pub sandbox: &'a [String],
    /// The call's: declared in its script metadata (PEP 723) or inferred from its imports.
    pub call: &'a [String],
}

/// The files an interpreter is handed, and what it loads from them.
#[derive(Debug, Default)]
pub struct InstallPlan {
    /// (where the file goes, its bytes): a lock package's bare file name, or a wheel's path
    /// under [`WHEEL_DIR`].
    pub files: Vec<(String, Arc<Vec<u8>>)>,
    /// What `loadPackage` loads: lock package names and wheel paths.
    pub items: Vec<String>,
    /// The packages these are, in the order given.
    pub packages: Vec<Package>,
}

/// One package of an [`InstallPlan`].
#[derive(Debug, Clone)]
pub struct Package {
    /// Normalized name (PEP 503).
    pub name: String,
    /// The version chosen (PEP 440 text).
    pub version: String,
    /// The file it is installed from.
    pub file_name: String,
}

/// The directory of the interpreter's file system that index and mirror wheels are written
/// to, and loaded from by path.
pub const WHEEL_DIR: &str = "/packages";

impl InstallPlan {
    /// The plan that installs `packages`. Lock packages load by name so that Pyodide applies
    /// its own lock metadata; in its "shell" runtime it reads them by bare file name (no base
    /// URL is applied). Index and mirror wheels load by path under [`WHEEL_DIR`].
    pub fn of<'a>(packages: impl IntoIterator<Item = &'a Planned>) -> InstallPlan {
        let mut plan = InstallPlan::default();
        for p in packages {
            match p.origin {
                Origin::Lock => {
                    plan.files.push((p.file_name.clone(), p.bytes.clone()));
                    plan.items.push(p.name.clone());
                }
                Origin::Index | Origin::Mirror => {
                    let path = format!("{WHEEL_DIR}/{}", p.file_name);
                    plan.files.push((path.clone(), p.bytes.clone()));
                    plan.items.push(path);
                }
            }
            plan.packages.push(Package {
                name: p.name.clone(),
                version: p.version.clone(),
                file_name: p.file_name.clone(),
            });
        }
        plan
    }
}

/// Step 1, plan: the distributions an interpreter that has `installed` must hold for
/// `wanted`, all requirements resolved together with what it has, pinned. `None` when nothing
/// beyond `--deps` is wanted: their own plan, resolved and fetched once at start, is the
/// answer then.
///
/// Errors: the resolver's ([`Resolver::resolve`]): a requirement that does not parse, a
/// conflict (in words), an index that cannot be read.
pub async fn plan(
    resolver: &Resolver,
    wanted: Wanted<'_>,
    installed: &Installed,
) -> Result<Option<Vec<Dist>>, ResolveError> {
    if wanted.call.is_empty() && wanted.sandbox.is_empty() {
        return Ok(None);
    }
    let requirements: Vec<String> = wanted
        .startup
        .iter()
        .chain(wanted.sandbox)
        .chain(wanted.call)
        .cloned()
        .collect();
    let pins: Vec<String> = installed
        .iter()
        .map(|(name, version)| format!("{name}=={version}"))
        .collect();
    resolver.resolve(&requirements, &pins).await.map(Some)
}

/// Step 2, fetch: the files of every distribution of a plan, in its order (those the
/// interpreter has already are read too, from the cache, as the plan holds them whole).
///
/// Errors: the first download that failed, naming its package and version.
pub async fn fetch(resolver: &Resolver, dists: &[Dist]) -> Result<Vec<Planned>, ResolveError> {
    resolver.fetch(dists).await
}

/// Step 3, install: what of the fetched plan `planned` an interpreter that has `installed`
/// lacks, as it loads it; `None` when it lacks nothing.
pub fn to_install(planned: &[Planned], installed: &Installed) -> Option<InstallPlan> {
    let todo: Vec<&Planned> = planned
        .iter()
        .filter(|p| !installed.contains_key(&p.name))
        .collect();
    (!todo.is_empty()).then(|| InstallPlan::of(todo))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planned(name: &str, origin: Origin) -> Planned {
        Planned {
            name: name.to_owned(),
            version: "1.0".to_owned(),
            origin,
            file_name: format!("{name}-1.0-py3-none-any.whl"),
            bytes: Arc::new(name.as_bytes().to_vec()),
        }
    }

    #[test]
    fn lock_packages_load_by_name_and_wheels_by_path() {
        let plan = InstallPlan::of(&[
            planned("numpy", Origin::Lock),
            planned("humanize", Origin::Index),
        ]);
        assert_eq!(
            plan.items,
            ["numpy", "/packages/humanize-1.0-py3-none-any.whl"]
        );
        let paths: Vec<&str> = plan.files.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            [
                "numpy-1.0-py3-none-any.whl",
                "/packages/humanize-1.0-py3-none-any.whl"
            ]
        );
        assert_eq!(plan.packages[1].name, "humanize");
    }

    #[test]
    fn what_the_interpreter_has_is_not_installed_again() {
        let fetched = [
            planned("numpy", Origin::Lock),
            planned("humanize", Origin::Index),
        ];
        let mut installed = Installed::new();
        installed.insert("numpy".to_owned(), "1.0".to_owned());
        let plan = to_install(&fetched, &installed).expect("humanize is missing");
        assert_eq!(plan.items, ["/packages/humanize-1.0-py3-none-any.whl"]);
        installed.insert("humanize".to_owned(), "1.0".to_owned());
        assert!(to_install(&fetched, &installed).is_none());
    }
}
