//! Wheel file names (PEP 427 / binary distribution format) and the tags Pyodide installs.

/// Python and platform facts of the Pyodide runtime, for tags and markers.
pub mod target {
    /// The embedded Pyodide's version (`pyodide@314.0.7` on npm, docs/architecture.md §7).
    pub const PYODIDE_VERSION: &str = "314.0.7";
    /// CPython version inside Pyodide 314.0.7 (lock file `info.python`).
    pub const PYTHON_FULL_VERSION: &str = "3.14.2";
    /// `python_version` marker value.
    pub const PYTHON_VERSION: &str = "3.14";
    /// The minor version of that Python: wheels tagged for any Python 3 up to it install.
    pub const PYTHON_MINOR: u32 = 14;
    /// Platform tag of wheels built for this Pyodide ABI (lock file `info.abi_version`).
    pub const PLATFORM_TAG: &str = "pyemscripten_2026_0_wasm32";
    /// CPython ABI tag.
    pub const ABI_TAG: &str = "cp314";
    /// Emscripten version (lock file `info.platform`), the `platform_release` marker.
    pub const EMSCRIPTEN_VERSION: &str = "5.0.3";
}

/// Parts of a wheel file name without a build tag: distribution, version, and the three tags.
const PARTS: usize = 5;
/// Parts of a wheel file name with a build tag (between the version and the tags).
const PARTS_WITH_BUILD: usize = 6;

/// The parts of a wheel file name (PEP 427), as written; compressed tag sets (`py2.py3`) are
/// split on `.`.
#[derive(Debug, Clone, PartialEq)]
pub struct WheelName {
    /// The distribution name, escaped as in file names (`_` for `-`).
    pub distribution: String,
    /// The version (PEP 440 text, unchecked).
    pub version: String,
    /// Python tags (`py3`, `cp314`).
    pub python_tags: Vec<String>,
    /// ABI tags (`none`, `abi3`, `cp314`).
    pub abi_tags: Vec<String>,
    /// Platform tags (`any`, [`target::PLATFORM_TAG`]).
    pub platform_tags: Vec<String>,
}

impl WheelName {
    /// Parses `{distribution}-{version}(-{build})?-{python}-{abi}-{platform}.whl`; `None`
    /// for anything else.
    pub fn parse(file_name: &str) -> Option<Self> {
        let stem = file_name.strip_suffix(".whl")?;
        let parts: Vec<&str> = stem.split('-').collect();
        if parts.len() != PARTS && parts.len() != PARTS_WITH_BUILD {
            return None;
        }
        // The three tags are always the last parts, whether or not a build tag comes before.
        let n = parts.len();
        let split = |s: &str| s.split('.').map(str::to_owned).collect::<Vec<_>>();
        Some(WheelName {
            distribution: parts[0].to_owned(),
            version: parts[1].to_owned(),
            python_tags: split(parts[n - 3]),
            abi_tags: split(parts[n - 2]),
            platform_tags: split(parts[n - 1]),
        })
    }

    /// Whether the wheel is pure Python (platform tag `any`).
    pub fn is_pure(&self) -> bool {
        self.platform_tags.iter().any(|p| p == "any")
    }

    /// Whether Pyodide can install this wheel: pure Python for Python 3, or built for the
    /// Pyodide platform tag and CPython 3.14 ABI (or the stable ABI).
    pub fn is_compatible(&self) -> bool {
        let py3 = self.python_tags.iter().any(|t| {
            // Any Python 3, this CPython, or a Python 3 minor version up to this one (`py38`,
            // `cp312`, `py314`).
            t == "py3"
                || t == target::ABI_TAG
                || python_minor(t).is_some_and(|m| m <= target::PYTHON_MINOR)
        });
        if self.platform_tags.iter().any(|p| p == "any") {
            return py3 && self.abi_tags.iter().any(|a| a == "none");
        }
        let platform = self.platform_tags.iter().any(|p| p == target::PLATFORM_TAG);
        let abi = self
            .abi_tags
            .iter()
            .any(|a| a == target::ABI_TAG || a == "abi3" || a == "none");
        platform && abi && py3
    }
}

/// `py3N`/`cp3N` → N; `None` for other tags.
fn python_minor(tag: &str) -> Option<u32> {
    let rest = tag
        .strip_prefix("py3")
        .or_else(|| tag.strip_prefix("cp3"))?;
    if rest.is_empty() {
        return None;
    }
    rest.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pure_python_wheels_are_compatible() {
        assert!(WheelName::parse("rich-12.6.0-py3-none-any.whl")
            .unwrap()
            .is_compatible());
        assert!(WheelName::parse("six-1.17.0-py2.py3-none-any.whl")
            .unwrap()
            .is_compatible());
        assert!(WheelName::parse("foo-1.0-py314-none-any.whl")
            .unwrap()
            .is_compatible());
        assert!(!WheelName::parse("foo-1.0-py315-none-any.whl")
            .unwrap()
            .is_compatible());
        assert!(!WheelName::parse("foo-1.0-py2-none-any.whl")
            .unwrap()
            .is_compatible());
    }

    #[test]
    fn only_pyodide_binary_wheels_are_compatible() {
        let ok = "numpy-2.4.6-cp314-cp314-pyemscripten_2026_0_wasm32.whl";
        assert!(WheelName::parse(ok).unwrap().is_compatible());
        let linux = "numpy-2.4.6-cp314-cp314-manylinux_2_17_x86_64.whl";
        assert!(!WheelName::parse(linux).unwrap().is_compatible());
    }

    /// The target's versions are written out several ways; they must say the same.
    #[test]
    fn target_versions_agree() {
        assert_eq!(
            target::PYTHON_VERSION,
            format!("3.{}", target::PYTHON_MINOR)
        );
        assert!(target::PYTHON_FULL_VERSION.starts_with(&format!("{}.", target::PYTHON_VERSION)));
        assert_eq!(target::ABI_TAG, format!("cp3{}", target::PYTHON_MINOR));
    }

    #[test]
    fn parses_build_tag() {
        let w = WheelName::parse("pkg-1.0-1-py3-none-any.whl").unwrap();
        assert_eq!(w.version, "1.0");
        assert!(w.is_compatible());
    }
}
