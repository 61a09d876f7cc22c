//! Downloads: the PyPI JSON API (`{index}/{project}/json`) and package files, through the cache.

use super::cache::{sha256_hex, Cache};
use super::metadata::{read_headers, wheel_headers, MAX_METADATA_HEADER_BYTES};
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use thiserror::Error;

/// The default index: PyPI's JSON API base.
pub const DEFAULT_INDEX_URL: &str = "https://pypi.org/pypi";
/// How long an index answer is reused before asking again.
const INDEX_MAX_AGE: Duration = Duration::from_secs(3600);

/// Largest package file downloaded (bytes); the largest Pyodide wheels are tens of MiB.
pub const MAX_FILE_BYTES: u64 = 512 << 20;
/// Largest JSON API answer read (bytes); projects with thousands of releases answer with a few
/// MiB.
pub const MAX_INDEX_ANSWER_BYTES: u64 = 64 << 20;
/// How long connecting to an index or packages URL may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one request may take in all.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(300);

/// Why a download failed. Every message names the URL (or path) it is about; the words are
/// those users see in install errors and resolver notes. Cheap to clone (the underlying
/// errors are shared), so that one failure can be remembered and reported more than once.
#[derive(Debug, Error, Clone)]
pub enum FetchError {
    /// The server answered `404 Not Found`, or a `file://` URL names no file.
    #[error("not found ({url})")]
    NotFound { url: String },
    /// The URL could not be read over the network, or its answer could not be used.
    #[error("network error fetching {url}: {reason}")]
    Network {
        url: String,
        #[source]
        reason: NetworkReason,
    },
    /// A `file://` URL's file exists but could not be read.
    #[error("cannot read {path}")]
    File {
        path: String,
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The file is over `limit` bytes ([`MAX_FILE_BYTES`] or [`MAX_INDEX_ANSWER_BYTES`]).
    #[error("{url} is larger than {limit} bytes")]
    TooLarge { url: String, limit: u64 },
    /// The file's SHA-256 (hex) is not the one the index or lock file gave.
    #[error("{url} does not match its SHA-256 (expected {expected}, got {actual})")]
    HashMismatch {
        url: String,
        expected: String,
        actual: String,
    },
    /// `--offline`, and the answer for `url` is not cached.
    #[error("offline mode and {url} is not in the cache")]
    Offline { url: String },
}

/// What went wrong in a [`FetchError::Network`].
#[derive(Debug, Error, Clone)]
pub enum NetworkReason {
    /// Connecting, sending or reading failed (`reqwest`'s words).
    #[error(transparent)]
    Request(Arc<reqwest::Error>),
    /// The server answered with a status that is neither a success nor `404 Not Found`.
    #[error("HTTP status {0}")]
    Status(reqwest::StatusCode),
    /// The JSON API answer does not parse as the JSON API's.
    #[error("invalid JSON API answer: {0}")]
    InvalidJson(#[source] Arc<serde_json::Error>),
}

/// One file of a release, as the JSON API describes it.
#[derive(Debug, Clone, Deserialize)]
pub struct IndexFile {
    /// The file's name (a wheel's is checked with `WheelName::parse` before use).
    pub filename: String,
    /// Where to download it; made absolute against the JSON document's URL
    /// ([`Fetcher::project`]).
    pub url: String,
    /// Its digests.
    pub digests: Digests,
    /// Whether the release was yanked (PEP 592); yanked files are not installed.
    #[serde(default)]
    pub yanked: bool,
    /// The file's `Requires-Python` (PEP 440 specifiers, unparsed), if any.
    #[serde(default)]
    pub requires_python: Option<String>,
}

/// File digests; we use SHA-256.
#[derive(Debug, Clone, Deserialize)]
pub struct Digests {
    /// Hex SHA-256, as the index sends it (checked with `is_sha256` before use).
    pub sha256: String,
}

/// A project's releases: version text → files.
#[derive(Debug, Clone, Deserialize)]
pub struct Project {
    /// Version text (PEP 440, unparsed) → the files of that release.
    #[serde(default)]
    pub releases: HashMap<String, Vec<IndexFile>>,
}

/// HTTP client plus cache; cheap to clone.
#[derive(Clone)]
pub struct Fetcher {
    /// Made at the first request: making one loads the system's root certificates (~8 ms),
    /// which would otherwise delay every server's start, and its first worker's boot.
    client: Arc<OnceLock<reqwest::Client>>,
    cache: Cache,
    offline: bool,
}

impl Fetcher {
    /// A fetcher that stores into `cache`; with `offline`, it never touches the network.
    pub fn new(cache: Cache, offline: bool) -> Self {
        Fetcher {
            client: Arc::default(),
            cache,
            offline,
        }
    }

    /// The HTTP client, made on first use. A builder that fails (no TLS backend) falls back to
    /// reqwest's default client rather than failing every download.
    fn client(&self) -> &reqwest::Client {
        self.client.get_or_init(|| {
            reqwest::Client::builder()
                .connect_timeout(CONNECT_TIMEOUT)
                .timeout(REQUEST_TIMEOUT)
                .user_agent(concat!("mcp-run-python/", env!("CARGO_PKG_VERSION")))
                .build()
                .unwrap_or_else(|_| reqwest::Client::new())
        })
    }

    /// The cache this fetcher uses.
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// The first `limit` bytes at most of `url` (`http(s)://` or `file://`); with `whole`, a
    /// longer answer is [`FetchError::TooLarge`] instead of cut. `file://` URLs are read even
    /// offline: they are local mirrors.
    async fn get(&self, url: &str, limit: u64, whole: bool) -> Result<Vec<u8>, FetchError> {
        if let Some(path) = file_url_path(url) {
            return read_local(&path, url, limit, whole).await;
        }
        if self.offline {
            return Err(FetchError::Offline {
                url: url.to_owned(),
            });
        }
        let net = |e| network_error(url, e);
        let mut resp = self.client().get(url).send().await.map_err(net)?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Err(FetchError::NotFound {
                url: url.to_owned(),
            });
        }
        if !resp.status().is_success() {
            return Err(FetchError::Network {
                url: url.to_owned(),
                reason: NetworkReason::Status(resp.status()),
            });
        }
        let too_large = || FetchError::TooLarge {
            url: url.to_owned(),
            limit,
        };
        if whole && resp.content_length().is_some_and(|n| n > limit) {
            return Err(too_large());
        }
        // Read chunk by chunk, so that a hostile server cannot make the front hold more than
        // `limit` bytes whatever it announces.
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(net)? {
            let room = (limit as usize).saturating_sub(body.len());
            if chunk.len() > room {
                if whole {
                    return Err(too_large());
                }
                body.extend_from_slice(&chunk[..room]);
                break;
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    /// Whether the file at `url` can be had: present in a `file://` directory, or answered
    /// with success to a `HEAD` request. Errors: the network (offline: [`FetchError::Offline`]).
    pub async fn exists(&self, url: &str) -> Result<bool, FetchError> {
        if let Some(path) = file_url_path(url) {
            return Ok(tokio::fs::metadata(&path).await.is_ok_and(|m| m.is_file()));
        }
        if self.offline {
            return Err(FetchError::Offline {
                url: url.to_owned(),
            });
        }
        let resp = self
            .client()
            .head(url)
            .send()
            .await
            .map_err(|e| network_error(url, e))?;
        Ok(resp.status().is_success())
    }

    /// The header section of the core metadata of the wheel at `wheel_url` (SHA-256
    /// `sha256`) from the PEP 658 file `{wheel_url}.metadata` (only its first
    /// [`MAX_METADATA_HEADER_BYTES`] + 1 bytes are read), remembered in the cache under
    /// `sha256`; `Ok(None)` when the index has no such file, so that the caller may read the
    /// wheel itself. The caller looks in the cache first (`Sources::metadata`).
    ///
    /// The `.metadata` file is not checked against a hash (the JSON API gives none); it only
    /// decides what to download, and every download is checked by its own SHA-256.
    pub async fn metadata_headers(
        &self,
        wheel_url: &str,
        sha256: &str,
    ) -> Result<Option<String>, FetchError> {
        let url = format!("{wheel_url}.metadata");
        let prefix = match self
            .get(&url, MAX_METADATA_HEADER_BYTES as u64 + 1, false)
            .await
        {
            Ok(prefix) => prefix,
            Err(FetchError::NotFound { .. }) => return Ok(None),
            Err(FetchError::File { .. }) if file_url_path(&url).is_some() => return Ok(None),
            Err(e) => return Err(e),
        };
        match read_headers(prefix.as_slice()) {
            Ok(headers) => {
                self.remember_metadata(sha256, &headers);
                Ok(Some(headers))
            }
            Err(e) => {
                tracing::warn!("{url}: {e}; reading the wheel instead");
                Ok(None)
            }
        }
    }

    /// The header section of a wheel's `METADATA`, remembered under the wheel's SHA-256;
    /// `None` (logged) when the wheel has none that can be read.
    pub fn headers_from_wheel(&self, url: &str, sha256: &str, wheel: &[u8]) -> Option<String> {
        match wheel_headers(wheel) {
            Ok(headers) => {
                self.remember_metadata(sha256, &headers);
                Some(headers)
            }
            Err(e) => {
                tracing::warn!("{url}: {e}");
                None
            }
        }
    }

    /// Puts `headers` in the metadata cache under `sha256`; a failure is logged, not fatal:
    /// the metadata can be read again.
    fn remember_metadata(&self, sha256: &str, headers: &str) {
        if let Err(e) = self.cache.put_metadata(sha256, headers) {
            tracing::warn!("cannot write the metadata cache: {e}");
        }
    }

    /// The file at `url` whose SHA-256 must be `sha256`: from the cache when present (no
    /// network I/O), else downloaded (at most [`MAX_FILE_BYTES`]), verified and cached.
    ///
    /// Errors: the download's, or [`FetchError::HashMismatch`].
    pub async fn download(&self, url: &str, sha256: &str) -> Result<Vec<u8>, FetchError> {
        if let Some(bytes) = self.cache.get(sha256) {
            crate::metrics::package_file(true);
            return Ok(bytes);
        }
        crate::metrics::package_file(false);
        let bytes = self.get(url, MAX_FILE_BYTES, true).await?;
        let actual = sha256_hex(&bytes);
        if !actual.eq_ignore_ascii_case(sha256) {
            return Err(FetchError::HashMismatch {
                url: url.to_owned(),
                expected: sha256.to_owned(),
                actual,
            });
        }
        if let Err(e) = self.cache.put(&bytes) {
            tracing::warn!("cannot write the download cache: {e}");
        }
        Ok(bytes)
    }

    /// The JSON API answer for `project` under `index_url`: a cached answer younger than
    /// [`INDEX_MAX_AGE`], else a fresh one; a stale cached answer when the index cannot be
    /// reached (or offline).
    ///
    /// Errors: [`FetchError::NotFound`] for an unknown project, the download's error when no
    /// answer is cached, or an answer that is not the JSON API's.
    pub async fn project(&self, index_url: &str, project: &str) -> Result<Project, FetchError> {
        let fresh = if self.offline {
            None
        } else {
            Some(INDEX_MAX_AGE)
        };
        let body = match self.cache.get_index(index_url, project, fresh) {
            Some(body) => body,
            None => {
                let url = format!("{}/{project}/json", index_url.trim_end_matches('/'));
                match self.get(&url, MAX_INDEX_ANSWER_BYTES, true).await {
                    Ok(body) => {
                        if let Err(e) = self.cache.put_index(index_url, project, &body) {
                            tracing::warn!("cannot write the index cache: {e}");
                        }
                        body
                    }
                    Err(e @ (FetchError::Network { .. } | FetchError::Offline { .. })) => {
                        self.cache.get_index(index_url, project, None).ok_or(e)?
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        let url = format!("{}/{project}/json", index_url.trim_end_matches('/'));
        let mut parsed: Project =
            serde_json::from_slice(&body).map_err(|e| FetchError::Network {
                url: url.clone(),
                reason: NetworkReason::InvalidJson(Arc::new(e)),
            })?;
        // Mirrors may answer with file URLs relative to the JSON document.
        if let Ok(base) = reqwest::Url::parse(&url) {
            for file in parsed.releases.values_mut().flatten() {
                if let Ok(absolute) = base.join(&file.url) {
                    file.url = absolute.to_string();
                }
            }
        }
        Ok(parsed)
    }
}

/// The failure of a request for `url`, as a [`FetchError::Network`].
fn network_error(url: &str, e: reqwest::Error) -> FetchError {
    FetchError::Network {
        url: url.to_owned(),
        reason: NetworkReason::Request(Arc::new(e)),
    }
}

/// The local path of a `file://` URL, if `url` is one.
pub fn file_url_path(url: &str) -> Option<std::path::PathBuf> {
    let parsed = reqwest::Url::parse(url).ok()?;
    (parsed.scheme() == "file")
        .then(|| parsed.to_file_path().ok())
        .flatten()
}

/// Reads a local mirror's file, at most `limit` bytes (see [`Fetcher::get`]).
async fn read_local(
    path: &std::path::Path,
    url: &str,
    limit: u64,
    whole: bool,
) -> Result<Vec<u8>, FetchError> {
    use tokio::io::AsyncReadExt;
    let file_error = |e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::NotFound {
            FetchError::NotFound {
                url: url.to_owned(),
            }
        } else {
            FetchError::File {
                path: path.display().to_string(),
                source: Arc::new(e),
            }
        }
    };
    let file = tokio::fs::File::open(path).await.map_err(file_error)?;
    let mut body = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut body)
        .await
        .map_err(file_error)?;
    if body.len() as u64 > limit {
        if whole {
            return Err(FetchError::TooLarge {
                url: url.to_owned(),
                limit,
            });
        }
        body.truncate(limit as usize);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The words of each network reason are those the `String` reasons had.
    #[test]
    fn network_errors_say_what_they_said() {
        let status = FetchError::Network {
            url: "https://pypi.org/pypi/x/json".into(),
            reason: NetworkReason::Status(reqwest::StatusCode::FORBIDDEN),
        };
        assert_eq!(
            status.to_string(),
            "network error fetching https://pypi.org/pypi/x/json: HTTP status 403 Forbidden"
        );
        let dir = tempfile::tempdir().expect("a temporary directory");
        std::fs::create_dir_all(dir.path().join("index/x")).expect("mkdir");
        std::fs::write(dir.path().join("index/x/json"), b"not json").expect("write");
        let fetcher = Fetcher::new(Cache::new(dir.path().join("cache")), true);
        let index = format!("file://{}/index", dir.path().display());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        let Err(e) = runtime.block_on(fetcher.project(&index, "x")) else {
            panic!("expected invalid JSON");
        };
        assert!(matches!(
            e,
            FetchError::Network {
                reason: NetworkReason::InvalidJson(_),
                ..
            }
        ));
        assert_eq!(
            e.to_string(),
            format!("network error fetching {index}/x/json: invalid JSON API answer: expected ident at line 1 column 2")
        );
        let Err(missing) = runtime.block_on(fetcher.project(&index, "y")) else {
            panic!("expected not found");
        };
        assert_eq!(missing.to_string(), format!("not found ({index}/y/json)"));
    }
}
