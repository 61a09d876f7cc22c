//! `pyodide-lock.json`: the packages built for this Pyodide, their files, hashes, dependencies
//! and import names.

use pep508_rs::PackageName;
use serde::Deserialize;
use std::collections::HashMap;
use std::str::FromStr;

/// One package of the lock file (only the fields we use).
#[derive(Debug, Clone, Deserialize)]
pub struct LockPackage {
    /// The name as the lock writes it (e.g. `Pygments`).
    pub name: String,
    /// Its single version, as text (PEP 440).
    pub version: String,
    /// The wheel's file name, relative to the packages URL.
    pub file_name: String,
    /// Hex SHA-256 of that file.
    pub sha256: String,
    /// Names of lock packages it needs.
    #[serde(default)]
    pub depends: Vec<String>,
    /// Top-level import names it provides.
    #[serde(default)]
    pub imports: Vec<String>,
}

impl LockPackage {
    /// Whether the wheel is pure Python (platform tag `any`), so PyPI may serve the same file.
    pub fn is_pure_python(&self) -> bool {
        self.file_name.ends_with("-none-any.whl")
    }
}

/// The lock file as written: packages by (unnormalized) name.
#[derive(Deserialize)]
struct RawLock {
    packages: HashMap<String, LockPackage>,
}

/// The lock file, indexed by normalized package name and by import name.
#[derive(Debug, Default)]
pub struct Lockfile {
    packages: HashMap<PackageName, LockPackage>,
    by_import: HashMap<String, PackageName>,
}

/// PEP 503 normalization of a name that may not be valid (falls back to lower case).
pub fn normalize(name: &str) -> String {
    PackageName::from_str(name)
        .map(|n| n.to_string())
        .unwrap_or_else(|_| name.to_ascii_lowercase())
}

impl Lockfile {
    /// Parses the lock file's JSON text (`pyodide-lock.json`); packages whose name is not a
    /// valid package name are left out. Errors: the JSON error.
    pub fn parse(text: &str) -> Result<Self, serde_json::Error> {
        let raw: RawLock = serde_json::from_str(text)?;
        let mut lock = Lockfile::default();
        for (_, pkg) in raw.packages {
            let Ok(name) = PackageName::from_str(&pkg.name) else {
                continue;
            };
            for import in &pkg.imports {
                lock.by_import
                    .entry(import.clone())
                    .or_insert_with(|| name.clone());
            }
            lock.packages.insert(name, pkg);
        }
        Ok(lock)
    }

    /// The lock package called `name` (any spelling that normalizes the same).
    pub fn get(&self, name: &PackageName) -> Option<&LockPackage> {
        self.packages.get(name)
    }

    /// The package that provides top-level module `import` (`yaml` → `pyyaml`), if any.
    pub fn package_for_import(&self, import: &str) -> Option<&LockPackage> {
        self.by_import
            .get(import)
            .and_then(|n| self.packages.get(n))
    }
}
