//! Downloads: the PyPI JSON API (`{index}/{project}/json`) and package files, through the cache.

use super::cache::{sha256_hex, Cache};
use serde::Deserialize;
use std::collections::HashMap;
use std::time::Duration;
use thiserror::Error;

/// The default index: PyPI's JSON API base.
pub const DEFAULT_INDEX_URL: &str = "https://pypi.org/pypi";
/// How long an index answer is reused before asking again.
const INDEX_MAX_AGE: Duration = Duration::from_secs(3600);

/// Why a download failed.
#[derive(Debug, Error, Clone)]
pub enum FetchError {
    #[error("not found ({0})")]
    NotFound(String),
    #[error("network error fetching {url}: {reason}")]
    Network { url: String, reason: String },
    #[error("{url} does not match its SHA-256 (expected {expected}, got {actual})")]
    HashMismatch {
        url: String,
        expected: String,
        actual: String,
    },
    #[error("offline mode and {0} is not in the cache")]
    Offline(String),
}

/// One file of a release, as the JSON API describes it.
#[derive(Debug, Clone, Deserialize)]
pub struct IndexFile {
    pub filename: String,
    pub url: String,
    pub digests: Digests,
    #[serde(default)]
    pub yanked: bool,
    #[serde(default)]
    pub requires_python: Option<String>,
}

/// File digests; we use SHA-256.
#[derive(Debug, Clone, Deserialize)]
pub struct Digests {
    pub sha256: String,
}

/// A project's releases: version text → files.
#[derive(Debug, Clone, Deserialize)]
pub struct Project {
    #[serde(default)]
    pub releases: HashMap<String, Vec<IndexFile>>,
}

/// HTTP client plus cache; cheap to clone.
#[derive(Clone)]
pub struct Fetcher {
    client: reqwest::Client,
    cache: Cache,
    offline: bool,
}

impl Fetcher {
    /// A fetcher that stores into `cache`; with `offline`, it never touches the network.
    pub fn new(cache: Cache, offline: bool) -> Self {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(300))
            .user_agent(concat!("mcp-run-python/", env!("CARGO_PKG_VERSION")))
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
        Fetcher {
            client,
            cache,
            offline,
        }
    }

    /// The cache this fetcher uses.
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    async fn get(&self, url: &str) -> Result<Vec<u8>, FetchError> {
        if self.offline {
            return Err(FetchError::Offline(url.to_owned()));
        }
        let net = |e: reqwest::Error| FetchError::Network {
            url: url.to_owned(),
            reason: e.to_string(),
        };
        let resp = self.client.get(url).send().await.map_err(net)?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Err(FetchError::NotFound(url.to_owned()));
        }
        if !resp.status().is_success() {
            return Err(FetchError::Network {
                url: url.to_owned(),
                reason: format!("HTTP status {}", resp.status()),
            });
        }
        Ok(resp.bytes().await.map_err(net)?.to_vec())
    }

    /// The file at `url` whose SHA-256 must be `sha256`: from the cache when present (no
    /// network I/O), else downloaded, verified and cached.
    pub async fn download(&self, url: &str, sha256: &str) -> Result<Vec<u8>, FetchError> {
        if let Some(bytes) = self.cache.get(sha256) {
            return Ok(bytes);
        }
        let bytes = self.get(url).await?;
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

    /// The JSON API answer for `project` under `index_url`: a cached answer younger than an
    /// hour, else a fresh one; a stale cached answer when the index cannot be reached.
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
                match self.get(&url).await {
                    Ok(body) => {
                        if let Err(e) = self.cache.put_index(index_url, project, &body) {
                            tracing::warn!("cannot write the index cache: {e}");
                        }
                        body
                    }
                    Err(e @ (FetchError::Network { .. } | FetchError::Offline(_))) => {
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
                reason: format!("invalid JSON API answer: {e}"),
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
