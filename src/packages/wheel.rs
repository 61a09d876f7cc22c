//! Wheel file names (PEP 427 / binary distribution format) and their `METADATA`.

use std::io::{BufRead, BufReader, Cursor, Read};

/// Python and platform facts of the Pyodide runtime, for tags and markers.
pub mod target {
    /// The embedded Pyodide's version (`pyodide@314.0.7` on npm, DESIGN §7).
    pub const PYODIDE_VERSION: &str = "314.0.7";
    /// CPython version inside Pyodide 314.0.7 (lock file `info.python`).
    pub const PYTHON_FULL_VERSION: &str = "3.14.2";
    /// `python_version` marker value.
    pub const PYTHON_VERSION: &str = "3.14";
    /// Platform tag of wheels built for this Pyodide ABI (lock file `info.abi_version`).
    pub const PLATFORM_TAG: &str = "pyemscripten_2026_0_wasm32";
    /// CPython ABI tag.
    pub const ABI_TAG: &str = "cp314";
    /// Emscripten version (lock file `info.platform`), the `platform_release` marker.
    pub const EMSCRIPTEN_VERSION: &str = "5.0.3";
}

/// The parts of a wheel file name.
#[derive(Debug, Clone, PartialEq)]
pub struct WheelName {
    pub distribution: String,
    pub version: String,
    pub python_tags: Vec<String>,
    pub abi_tags: Vec<String>,
    pub platform_tags: Vec<String>,
}

impl WheelName {
    /// Parses `{distribution}-{version}(-{build})?-{python}-{abi}-{platform}.whl`.
    pub fn parse(file_name: &str) -> Option<Self> {
        let stem = file_name.strip_suffix(".whl")?;
        let parts: Vec<&str> = stem.split('-').collect();
        if parts.len() != 5 && parts.len() != 6 {
            return None;
        }
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

    /// Whether Pyodide can install this wheel: pure Python for Python 3, or built for the
    /// Pyodide platform tag and CPython 3.14 ABI (or the stable ABI).
    pub fn is_compatible(&self) -> bool {
        let py3 = self.python_tags.iter().any(|t| {
            t == "py3"
                || t == "py314"
                || t == target::ABI_TAG
                || python_minor(t).is_some_and(|m| m <= 14)
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

/// `py3N`/`cp3N` → N.
fn python_minor(tag: &str) -> Option<u32> {
    let rest = tag
        .strip_prefix("py3")
        .or_else(|| tag.strip_prefix("cp3"))?;
    if rest.is_empty() {
        return None;
    }
    rest.parse().ok()
}

/// Largest header section of a wheel's `METADATA` read (bytes). The headers of real wheels are
/// a few KiB (the long description comes after them and is not read); the file itself is
/// compressed and could otherwise inflate to gigabytes in the front.
pub const MAX_METADATA_HEADER_BYTES: usize = 1 << 20;

/// The `Requires-Dist` lines of the wheel's `*.dist-info/METADATA`, read from its header
/// section only (up to the first blank line), as untrusted text: each is bounded by
/// [`super::bounds::check_requirement`] where it is parsed.
///
/// Errors: the wheel is not a readable zip, has no `METADATA`, its headers are not UTF-8, or
/// they are longer than [`MAX_METADATA_HEADER_BYTES`].
pub fn requires_dist(wheel: &[u8]) -> Result<Vec<String>, String> {
    let mut archive =
        zip::ZipArchive::new(Cursor::new(wheel)).map_err(|e| format!("not a valid wheel: {e}"))?;
    let name = archive
        .file_names()
        .find(|n| n.ends_with(".dist-info/METADATA") && n.matches('/').count() == 1)
        .map(str::to_owned)
        .ok_or_else(|| "the wheel has no .dist-info/METADATA".to_owned())?;
    let entry = archive.by_name(&name).map_err(|e| e.to_string())?;
    // One byte past the limit, so that a header section that fills it is told from one that
    // ends exactly there; no line read can be longer than that.
    let mut reader = BufReader::new(entry.take(MAX_METADATA_HEADER_BYTES as u64 + 1));
    let mut headers: Vec<u8> = Vec::new();
    let mut line: Vec<u8> = Vec::new();
    loop {
        line.clear();
        let read = reader
            .read_until(b'\n', &mut line)
            .map_err(|e| format!("cannot read METADATA: {e}"))?;
        // Headers end at the first blank line (or with the file); the body is the long
        // description.
        if read == 0 || line == b"\n" || line == b"\r\n" {
            break;
        }
        if headers.len() + line.len() > MAX_METADATA_HEADER_BYTES {
            return Err(format!(
                "the METADATA headers are longer than {MAX_METADATA_HEADER_BYTES} bytes"
            ));
        }
        headers.extend_from_slice(&line);
    }
    let text = String::from_utf8(headers)
        .map_err(|e| format!("METADATA is not UTF-8 text: {}", e.utf8_error()))?;
    Ok(text
        .lines()
        .filter_map(|l| l.strip_prefix("Requires-Dist:"))
        .map(|v| v.trim().to_owned())
        .collect())
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

    /// A wheel (zip) holding `pkg-1.0.dist-info/METADATA` with `metadata` as its text.
    fn wheel_with_metadata(metadata: &[u8]) -> Vec<u8> {
        use std::io::Write;
        let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        zip.start_file("pkg-1.0.dist-info/METADATA", options)
            .expect("start METADATA");
        zip.write_all(metadata).expect("write METADATA");
        zip.finish().expect("finish the zip").into_inner()
    }

    #[test]
    fn requires_dist_reads_the_headers_only() {
        let metadata = b"Metadata-Version: 2.1\r\nName: pkg\r\nRequires-Dist: attrs>=22\r\nRequires-Dist: tomli; python_version < \"3.11\"\r\n\r\nRequires-Dist: not-a-header\r\n\xff\xfe body need not be UTF-8\n";
        assert_eq!(
            requires_dist(&wheel_with_metadata(metadata)),
            Ok(vec![
                "attrs>=22".to_owned(),
                "tomli; python_version < \"3.11\"".to_owned()
            ])
        );
    }

    #[test]
    fn huge_metadata_headers_are_refused() {
        // Compresses to a few KiB, inflates past the limit: the front reads no more than it.
        let mut metadata = b"Name: pkg\n".to_vec();
        let line =
            b"X-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n";
        while metadata.len() <= MAX_METADATA_HEADER_BYTES {
            metadata.extend_from_slice(line);
        }
        let err = requires_dist(&wheel_with_metadata(&metadata)).unwrap_err();
        assert_eq!(err, "the METADATA headers are longer than 1048576 bytes");
        // One endless line is cut the same way.
        let endless = vec![b'a'; 2 * MAX_METADATA_HEADER_BYTES];
        assert!(requires_dist(&wheel_with_metadata(&endless)).is_err());
    }

    #[test]
    fn parses_build_tag() {
        let w = WheelName::parse("pkg-1.0-1-py3-none-any.whl").unwrap();
        assert_eq!(w.version, "1.0");
        assert!(w.is_compatible());
    }
}
