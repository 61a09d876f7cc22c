//! The network policy for user code (docs/architecture.md §9): the front performs `fetch` requests from the
//! sandbox only for hosts named with `--allow-net`; everything else is refused. Responses are
//! capped while they stream, and user code cannot set headers that would let it speak for the
//! front (another `Host`, proxy credentials); those of the connection itself (its framing,
//! `Connection`, `Content-Length`), which the HTTP libraries send as a matter of course, are
//! left out without a word, as a browser leaves them out.
//!
//! The request and answer are typed here; on the JavaScript side (`runtime/js/fetch.js`) they are
//! `{method, url, headers}` in and `{status, statusText, headers, url, redirected}` or
//! `{error}` out.

pub mod allow_list;
pub mod resolve;
pub mod secrets;

use crate::metrics::EgressOutcome;
use crate::protocol::fetch::{FetchRequest, FetchResponse};
use allow_list::AllowList;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, InvalidHeaderName, InvalidHeaderValue};
use resolve::{AddressRefused, CheckedResolver};
use secrets::{EncodedAnswer, Secrets};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use thiserror::Error;

/// Default largest body, each way, of one fetch by user code (bytes); `--max-fetch-bytes`.
pub const DEFAULT_MAX_FETCH_BYTES: usize = 64 << 20;

/// Default longest time for one whole request of user code, body included; `--fetch-timeout`.
pub const DEFAULT_FETCH_TIMEOUT: Duration = Duration::from_secs(30);

/// Default most requests one call's code may make; `--max-fetches-per-call`.
pub const DEFAULT_MAX_FETCHES_PER_CALL: u32 = 256;

/// Default most requests a sandbox's code may have in flight at once (asyncio's);
/// `--max-concurrent-fetches`.
pub const DEFAULT_MAX_CONCURRENT_FETCHES: u32 = 8;

/// Longest wait for a connection to an allowed host (seconds).
const CONNECT_TIMEOUT_SECS: u64 = 10;

/// Request headers that belong to the front's own connection (lower case): the hop-by-hop and
/// framing headers (RFC 9110 §7.6.1, RFC 9112 §6–7), which reqwest writes itself. User code's are
/// left out without a word, as a browser's `fetch` and `XMLHttpRequest` leave out the Fetch
/// standard's forbidden request headers: the HTTP libraries send `Connection: keep-alive` or a
/// `Content-Length` of their own as a matter of course.
const CONNECTION_HEADERS: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "content-length",
];

/// Request headers user code may not set (lower case): proxy credentials are the operator's.
/// (`Host` is refused too, unless it names the URL's own host: see [`request_headers`].)
const FORBIDDEN_REQUEST_HEADERS: [&str; 2] = ["proxy-authorization", "proxy-authenticate"];

/// Methods user code may not use, as the Fetch standard forbids them ("forbidden method").
const FORBIDDEN_METHODS: [&str; 3] = ["CONNECT", "TRACE", "TRACK"];

/// Why a fetch of user code was refused or failed; its text (with its sources) is what user
/// code sees as the network error. So a variant has a `#[source]` only when its words are
/// meant to follow: the URL's and the method's parse errors are left out on purpose.
#[derive(Debug, Error)]
pub enum NetError {
    /// Not an absolute `http`/`https` URL.
    #[error("unsupported URL {0} (only absolute http and https URLs)")]
    BadUrl(String),
    /// The URL's host, `host`, is not named with `--allow-net`.
    #[error("network access to {host} is not allowed in the sandbox (the server admits hosts named with --allow-net)")]
    NotAllowed { host: String },
    /// The URL's host, `host`, is within `--allow-net` but not within the sandbox's own list
    /// (`create_sandbox`'s `allow_net`).
    #[error("network access to {host} is not allowed in this sandbox (create_sandbox's allow_net narrowed it to {within})")]
    NotAllowedHere { host: String, within: String },
    /// Not an HTTP method token.
    #[error("bad method {0}")]
    BadMethod(String),
    /// A method the Fetch standard forbids (`CONNECT`, `TRACE`, `TRACK`).
    #[error("the method {0} is not allowed")]
    ForbiddenMethod(String),
    /// A header of [`FORBIDDEN_REQUEST_HEADERS`].
    #[error("the header {0} cannot be set by user code")]
    ForbiddenHeader(String),
    /// A header name HTTP does not allow (`name` as user code wrote it).
    #[error("invalid header name {name:?}")]
    BadHeaderName {
        name: String,
        #[source]
        source: InvalidHeaderName,
    },
    /// A header value HTTP does not allow (e.g. with a line break); the value is not quoted.
    #[error("invalid value for header {name}")]
    BadHeaderValue {
        name: String,
        #[source]
        source: InvalidHeaderValue,
    },
    /// The request body is over the limit (bytes).
    #[error("the request body is larger than the limit of {limit} bytes (--max-fetch-bytes)")]
    RequestTooLarge { limit: usize },
    /// The response body is (or announces to be) over the limit (bytes).
    #[error("the response is larger than the limit of {limit} bytes (--max-fetch-bytes)")]
    ResponseTooLarge { limit: usize },
    /// A name `--allow-net` lists resolved only to addresses of a special class that it does
    /// not name (loopback, private, link-local, …).
    #[error(transparent)]
    AddressRefused(AddressRefused),
    /// The request took longer than `--fetch-timeout` (seconds), body included.
    #[error(
        "the request took longer than {seconds} s, the limit of one request (--fetch-timeout)"
    )]
    Timeout { seconds: f64 },
    /// The call's code made `limit` requests already (`--max-fetches-per-call`).
    #[error("this call's code has made {limit} requests, the most one call may make (--max-fetches-per-call)")]
    TooMany { limit: u32 },
    /// More requests at once than `limit` (`--max-concurrent-fetches`); the HTTP bridge sends
    /// at most that many, so only code that goes around it gets this.
    #[error("more than {limit} requests at once, the most a sandbox may make (--max-concurrent-fetches)")]
    TooManyAtOnce { limit: u32 },
    /// A response to a request that carried a secret came encoded (`--secret`).
    #[error(transparent)]
    EncodedAnswer(EncodedAnswer),
    /// The front's HTTP client could not be made (its TLS roots were refused).
    #[error("the server cannot make HTTP requests")]
    Client {
        #[source]
        source: Arc<reqwest::Error>,
    },
    /// Connecting, sending or reading failed.
    #[error("the request failed")]
    Http {
        #[source]
        source: reqwest::Error,
    },
}

/// A sandbox's own list of hosts (`create_sandbox`'s `allow_net`) that cannot narrow the
/// server's.
#[derive(Debug, Error)]
pub enum NarrowError {
    /// An entry of none of `--allow-net`'s forms.
    #[error(transparent)]
    Entry(allow_list::BadEntry),
    /// An entry the server's `--allow-net` does not hold whole: a sandbox may only narrow it.
    #[error("allow_net entry {entry:?} is not within the server's --allow-net ({server}); a sandbox may only narrow it")]
    Wider { entry: String, server: String },
}

/// Which hosts user code may reach, the largest body a fetch may move, and the client that
/// reaches them.
#[derive(Clone)]
pub struct NetPolicy {
    allow: Arc<AllowList>,
    max_bytes: usize,
    /// Longest time for one request, body included (`--fetch-timeout`); `None`: only the
    /// call's own `--timeout`.
    timeout: Option<Duration>,
    /// Most requests one call's code may make (`--max-fetches-per-call`).
    per_call: u32,
    /// Most requests a sandbox's code may have in flight at once (`--max-concurrent-fetches`).
    at_once: u32,
    /// Roots trusted besides the system's (`--ca-file`).
    extra_roots: Vec<reqwest::Certificate>,
    /// Put in requests to their hosts, masked in every answer (`--secret`).
    secrets: Arc<Secrets>,
    /// Made at the first fetch (most servers never make one): making it loads the system's
    /// root certificates (~8 ms), which would otherwise delay the server's start. A client
    /// that could not be made fails every request, rather than one without the policy's
    /// resolver and redirect rule.
    client: Arc<OnceLock<Result<reqwest::Client, Arc<reqwest::Error>>>>,
}

impl NetPolicy {
    /// A policy allowing what `allow` allows (empty: nothing), with request and response bodies
    /// of at most `max_response_bytes` bytes (`--max-fetch-bytes`, default
    /// [`DEFAULT_MAX_FETCH_BYTES`]).
    pub fn new(allow: AllowList, max_response_bytes: usize) -> Self {
        NetPolicy {
            allow: Arc::new(allow),
            max_bytes: max_response_bytes,
            timeout: Some(DEFAULT_FETCH_TIMEOUT),
            per_call: DEFAULT_MAX_FETCHES_PER_CALL,
            at_once: DEFAULT_MAX_CONCURRENT_FETCHES,
            extra_roots: Vec::new(),
            secrets: Arc::default(),
            client: Arc::default(),
        }
    }

    /// The same policy trusting `roots` besides the system's roots (`--ca-file`).
    pub fn with_roots(mut self, roots: Vec<reqwest::Certificate>) -> Self {
        self.extra_roots = roots;
        self
    }

    /// The same policy with each request limited to `timeout` (`--fetch-timeout`; `None`: no
    /// limit but the call's), each call to `per_call` requests (`--max-fetches-per-call`) and
    /// each sandbox to `at_once` in flight (`--max-concurrent-fetches`, at least 1).
    pub fn with_limits(mut self, timeout: Option<Duration>, per_call: u32, at_once: u32) -> Self {
        self.timeout = timeout;
        self.per_call = per_call;
        self.at_once = at_once.max(1);
        self
    }

    /// What a run's code may do on the network, for its interpreter's HTTP bridge; `None`
    /// when it may reach no host.
    pub fn run_network(&self) -> Option<crate::protocol::RunNetwork> {
        (!self.allow.is_empty()).then(|| crate::protocol::RunNetwork {
            environment: self.secrets.environment(),
            concurrency: self.at_once,
        })
    }

    /// Most requests a sandbox's code may have in flight at once (`--max-concurrent-fetches`).
    pub fn at_once(&self) -> usize {
        usize::try_from(self.at_once).unwrap_or(usize::MAX)
    }

    /// Performs `requests` (each with its body), made at once by user code, concurrently: a
    /// response and its body per request, in order (see [`NetPolicy::fetch`], whose `within`
    /// this takes). More than [`at_once`](Self::at_once) are each refused
    /// ([`NetError::TooManyAtOnce`]).
    pub async fn fetch_all(
        &self,
        requests: Vec<(FetchRequest, Vec<u8>)>,
        within: Option<&AllowList>,
    ) -> Vec<(FetchResponse, Vec<u8>)> {
        if requests.len() > self.at_once() {
            let limit = self.at_once;
            let refuse = |request: &FetchRequest| {
                (
                    self.refused(request, NetError::TooManyAtOnce { limit }),
                    Vec::new(),
                )
            };
            return requests
                .iter()
                .map(|(request, _)| refuse(request))
                .collect();
        }
        let each = requests
            .into_iter()
            .map(|(request, body)| async move { self.fetch(&request, body, within).await });
        futures::future::join_all(each).await
    }

    /// The same policy with `secrets` (`--secret`, each within the policy's hosts).
    pub fn with_secrets(mut self, secrets: Secrets) -> Self {
        self.secrets = Arc::new(secrets);
        self
    }

    /// For `run_python_code`'s description: the hosts user code may reach (with `libraries`,
    /// the runtime's words for what reaches them) and the secrets it may use (names,
    /// placeholders, hosts; never values); `None` when it may reach none.
    pub fn summary(&self, libraries: &str) -> Option<String> {
        if self.allow.is_empty() {
            return None;
        }
        let hosts: Vec<&str> = self.allow.entries().collect();
        let mut text = format!(
            "\n\nNetwork: the code may reach these hosts over HTTP and HTTPS, with {libraries}: {}.",
            hosts.join(", ")
        );
        if !self.secrets.is_empty() {
            text.push_str(&format!(
                "\n\nSecrets: these environment variables hold placeholders, which the server replaces with the real value in the headers (Authorization: Basic included) and the query string of requests to the hosts named; use them as the credential itself, for example headers={{\"Authorization\": f\"Bearer {{os.environ['NAME']}}\"}}. The real value never enters the sandbox, and comes back as the placeholder.\n{}",
                self.secrets.summary()
            ));
        }
        Some(text)
    }

    /// A sandbox's own list (`create_sandbox`'s `allow_net`), parsed: every entry of
    /// `--allow-net`'s forms and within the server's list ([`AllowList::outside`]), so that a
    /// sandbox narrows the server's network and never widens it.
    ///
    /// Errors: [`NarrowError`], naming the first entry refused.
    pub fn narrowed(&self, entries: &[String]) -> Result<AllowList, NarrowError> {
        let list = AllowList::parse(entries).map_err(NarrowError::Entry)?;
        match list.outside(&self.allow) {
            Some(entry) => {
                let server: Vec<&str> = self.allow.entries().collect();
                let server = if server.is_empty() {
                    "none".to_owned()
                } else {
                    server.join(", ")
                };
                Err(NarrowError::Wider {
                    entry: entry.to_owned(),
                    server,
                })
            }
            None => Ok(list),
        }
    }

    /// Most requests one call's code may make (`--max-fetches-per-call`).
    pub fn per_call(&self) -> u32 {
        self.per_call
    }

    /// The answer to `request`, past [`per_call`](Self::per_call): user code's network error,
    /// naming the flag (counted in the egress metrics).
    pub fn too_many(&self, request: &FetchRequest) -> FetchResponse {
        let limit = self.per_call;
        self.refused(request, NetError::TooMany { limit })
    }

    /// The answer to `request` refused before anything was sent, for `error` (counted in the
    /// egress metrics).
    fn refused(&self, request: &FetchRequest, error: NetError) -> FetchResponse {
        let allowed = self.entry_for(&request.url);
        crate::metrics::egress(allowed, error.outcome(), 0, 0);
        FetchResponse::Error {
            error: crate::protocol::error_words(&error),
        }
    }

    /// A failure of reqwest's as user code reads it: past `--fetch-timeout`, a name whose
    /// addresses `--allow-net` does not admit, or the connection's own.
    fn failed(&self, source: reqwest::Error) -> NetError {
        if let Some(refused) = address_refused(&source) {
            return NetError::AddressRefused(refused);
        }
        match self.timeout {
            Some(limit) if source.is_timeout() => NetError::Timeout {
                seconds: limit.as_secs_f64(),
            },
            _ => NetError::Http { source },
        }
    }

    /// The HTTP client, made on first use: it follows no redirects, resolves names through the
    /// policy ([`CheckedResolver`]), verifies TLS against the system's roots and
    /// `--ca-file`'s, and gives up after `--fetch-timeout`.
    ///
    /// Errors: [`NetError::Client`] when it could not be made (no TLS backend, roots refused).
    fn client(&self) -> Result<&reqwest::Client, NetError> {
        let made = self.client.get_or_init(|| {
            let builder = reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(CONNECT_TIMEOUT_SECS))
                .redirect(reqwest::redirect::Policy::none())
                .dns_resolver(Arc::new(CheckedResolver::new(self.allow.clone())))
                .tls_certs_merge(self.extra_roots.iter().cloned());
            let builder = match self.timeout {
                Some(limit) => builder.timeout(limit),
                None => builder,
            };
            builder.build().map_err(Arc::new)
        });
        made.as_ref().map_err(|source| NetError::Client {
            source: source.clone(),
        })
    }

    /// Largest request body user code may send with one fetch (bytes): the same limit as for
    /// responses, so that one flag bounds what a fetch moves either way. The front reads a
    /// worker's fetch frame under this bound.
    pub fn max_request_bytes(&self) -> usize {
        self.max_bytes
    }

    /// Performs one request from user code with `body`; returns the response metadata and
    /// body, or [`FetchResponse::Error`] (with an empty body) when the request is refused or
    /// fails. Redirects are not followed, so each hop is checked against the policy. The
    /// response body is read chunk by chunk and given up as soon as it passes the limit, so
    /// the front never holds more than the limit of it.
    ///
    /// Each request is counted in the egress metrics and logged at debug level, by its URL
    /// without the query (which may carry what only its host should see).
    ///
    /// `within`: the sandbox's own list (`create_sandbox`'s `allow_net`, [`Self::narrowed`]),
    /// which the URL must pass too; `None`: the server's list alone.
    pub async fn fetch(
        &self,
        request: &FetchRequest,
        body: Vec<u8>,
        within: Option<&AllowList>,
    ) -> (FetchResponse, Vec<u8>) {
        let started = std::time::Instant::now();
        let sent = body.len();
        let (answer, outcome) = match self.try_fetch(request, body, within).await {
            Ok(answer) => (answer, EgressOutcome::Ok),
            Err(e) => {
                let words = crate::protocol::error_words(&e);
                (
                    (FetchResponse::Error { error: words }, Vec::new()),
                    e.outcome(),
                )
            }
        };
        let answer = self.masked(answer);
        let allowed = self.entry_for(&request.url);
        crate::metrics::egress(allowed, outcome, sent, answer.1.len());
        tracing::debug!(
            "user code's {} {} (allowed by {}): {}, {} bytes sent, {} received, {} ms",
            request.method,
            without_query(&request.url),
            allowed.unwrap_or("none"),
            match &answer.0 {
                FetchResponse::Ok { status, .. } => status.to_string(),
                FetchResponse::Error { error } => error.clone(),
            },
            sent,
            answer.1.len(),
            started.elapsed().as_millis()
        );
        answer
    }

    /// `answer` with every secret's value in it (body, headers, final URL, failure's words)
    /// replaced by its placeholder ([`Secrets::mask`]).
    fn masked(&self, answer: (FetchResponse, Vec<u8>)) -> (FetchResponse, Vec<u8>) {
        if self.secrets.is_empty() {
            return answer;
        }
        let (meta, body) = answer;
        let mask = |text: String| self.secrets.mask_text(text);
        let meta = match meta {
            FetchResponse::Ok {
                status,
                status_text,
                headers,
                url,
                redirected,
            } => FetchResponse::Ok {
                status,
                status_text,
                headers: headers.into_iter().map(|(k, v)| (k, mask(v))).collect(),
                url: mask(url),
                redirected,
            },
            FetchResponse::Error { error } => FetchResponse::Error { error: mask(error) },
        };
        (meta, self.secrets.mask(body))
    }

    /// The `--allow-net` entry that admits `url` (unparsed, as user code gave it), as the
    /// operator wrote it.
    fn entry_for(&self, url: &str) -> Option<&str> {
        self.entry_for_url(&reqwest::Url::parse(url).ok()?)
    }

    /// The `--allow-net` entry that admits `url`'s host and port, as the operator wrote it
    /// ([`AllowList::entry_for_url`]).
    fn entry_for_url(&self, url: &reqwest::Url) -> Option<&str> {
        self.allow.entry_for_url(url)
    }

    /// [`NetPolicy::fetch`] with the refusal or failure as a value: the request is checked
    /// ([`NetPolicy::check`]), sent, and its answer read under the limit
    /// ([`NetPolicy::read_response`]).
    ///
    /// Errors: the first [`NetError`] met, in that order.
    async fn try_fetch(
        &self,
        request: &FetchRequest,
        body: Vec<u8>,
        within: Option<&AllowList>,
    ) -> Result<(FetchResponse, Vec<u8>), NetError> {
        let mut checked = self.check(request, body.len(), within)?;
        let carried = self.secrets.put_in(&mut checked.url, &mut checked.headers);
        let mut builder = self
            .client()?
            .request(checked.method, checked.url)
            .headers(checked.headers);
        if !body.is_empty() {
            builder = builder.body(body);
        }
        let resp = builder.send().await.map_err(|source| self.failed(source))?;
        if let Some(name) = carried.into_iter().next() {
            unencoded(&resp, name)?;
        }
        self.read_response(resp).await
    }

    /// Checks `request` (with a body of `body_len` bytes) against the policy before anything
    /// is sent: an `http`/`https` URL whose host is allowed (by `within` too, when given), a method HTTP accepts and the
    /// Fetch standard does not forbid, headers user code may set, a body within the limit.
    ///
    /// Errors: the first check failed, in that order.
    fn check(
        &self,
        request: &FetchRequest,
        body_len: usize,
        within: Option<&AllowList>,
    ) -> Result<Checked, NetError> {
        let url = match reqwest::Url::parse(&request.url) {
            Ok(u) if u.scheme() == "http" || u.scheme() == "https" => u,
            _ => return Err(NetError::BadUrl(request.url.clone())),
        };
        let host = || url.host_str().unwrap_or_default().to_owned();
        if self.entry_for_url(&url).is_none() {
            return Err(NetError::NotAllowed { host: host() });
        }
        if let Some(within) = within {
            if within.entry_for_url(&url).is_none() {
                let listed: Vec<&str> = within.entries().collect();
                return Err(NetError::NotAllowedHere {
                    host: host(),
                    within: if listed.is_empty() {
                        "no host".to_owned()
                    } else {
                        listed.join(", ")
                    },
                });
            }
        }
        let method = reqwest::Method::from_bytes(request.method.as_bytes())
            .map_err(|_| NetError::BadMethod(request.method.clone()))?;
        if FORBIDDEN_METHODS
            .iter()
            .any(|m| m.eq_ignore_ascii_case(method.as_str()))
        {
            return Err(NetError::ForbiddenMethod(request.method.clone()));
        }
        let headers = request_headers(&url, &request.headers)?;
        if body_len > self.max_bytes {
            return Err(NetError::RequestTooLarge {
                limit: self.max_bytes,
            });
        }
        Ok(Checked {
            url,
            method,
            headers,
        })
    }

    /// The metadata and body of `resp`, refused before reading when the length it announces
    /// is over the limit (see [`NetPolicy::read_body`] for the body).
    ///
    /// Errors: [`NetError::ResponseTooLarge`], or reading failed ([`NetError::Http`]).
    async fn read_response(
        &self,
        resp: reqwest::Response,
    ) -> Result<(FetchResponse, Vec<u8>), NetError> {
        // Refuse before reading anything when the announced length is already over.
        if resp
            .content_length()
            .is_some_and(|n| n > self.max_bytes as u64)
        {
            return Err(self.response_too_large());
        }
        let status = resp.status();
        let headers: Vec<(String, String)> = resp
            .headers()
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        let final_url = resp.url().to_string();
        let bytes = self.read_body(resp).await?;
        let meta = FetchResponse::Ok {
            status: status.as_u16(),
            status_text: status.canonical_reason().unwrap_or("").to_owned(),
            headers,
            url: final_url,
            redirected: false,
        };
        Ok((meta, bytes))
    }

    /// The body of `resp`, read chunk by chunk and given up as soon as it passes the limit,
    /// so that the front never holds more than the limit of it.
    ///
    /// Errors: [`NetError::ResponseTooLarge`], or reading failed ([`NetError::Http`]).
    async fn read_body(&self, mut resp: reqwest::Response) -> Result<Vec<u8>, NetError> {
        let mut bytes: Vec<u8> = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|source| self.failed(source))? {
            let total = bytes.len().saturating_add(chunk.len());
            if total > self.max_bytes {
                // Dropping `resp` closes the connection: the rest is never read.
                return Err(self.response_too_large());
            }
            // Grow by doubling but never past the limit, so the buffer stays within it.
            if total > bytes.capacity() {
                let target = total
                    .max(bytes.capacity().saturating_mul(2))
                    .min(self.max_bytes);
                bytes.reserve_exact(target - bytes.len());
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(bytes)
    }

    /// The refusal of a response over the limit.
    fn response_too_large(&self) -> NetError {
        NetError::ResponseTooLarge {
            limit: self.max_bytes,
        }
    }
}

/// A request of user code that passed [`NetPolicy::check`]: what is sent (the body travels
/// beside it).
struct Checked {
    /// An `http` or `https` URL whose host the policy allows.
    url: reqwest::Url,
    /// Neither of [`FORBIDDEN_METHODS`].
    method: reqwest::Method,
    /// None of [`FORBIDDEN_REQUEST_HEADERS`] or [`CONNECTION_HEADERS`].
    headers: HeaderMap,
}

/// The request headers user code asked for, checked, for a request to `url`: those of the
/// connection ([`CONNECTION_HEADERS`]) left out, a `Host` naming the URL's own host (with its
/// port when the URL gives one, as HTTP clients write it) left out too, since reqwest writes
/// it; none of [`FORBIDDEN_REQUEST_HEADERS`] nor another `Host` (either would let user code
/// speak for the front or reach another virtual host than the allowed one); every name and
/// value valid for HTTP.
///
/// Errors: the first header refused, by name.
fn request_headers(url: &reqwest::Url, pairs: &[(String, String)]) -> Result<HeaderMap, NetError> {
    let mut headers = HeaderMap::new();
    for (name, value) in pairs {
        let is = |names: &[&str]| names.iter().any(|f| f.eq_ignore_ascii_case(name));
        if is(&CONNECTION_HEADERS) || is(&["host"]) && names_own_host(url, value) {
            continue;
        }
        if is(&FORBIDDEN_REQUEST_HEADERS) || is(&["host"]) {
            return Err(NetError::ForbiddenHeader(name.clone()));
        }
        let header =
            HeaderName::from_bytes(name.as_bytes()).map_err(|source| NetError::BadHeaderName {
                name: name.clone(),
                source,
            })?;
        let value = HeaderValue::from_bytes(value.as_bytes()).map_err(|source| {
            NetError::BadHeaderValue {
                name: name.clone(),
                source,
            }
        })?;
        headers.append(header, value);
    }
    Ok(headers)
}

/// Whether a `Host` header's `value` names `url`'s own host: `host`, or `host:port` with the
/// URL's port (given, or its scheme's default).
fn names_own_host(url: &reqwest::Url, value: &str) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    let value = value.trim();
    let port = url.port_or_known_default();
    value.eq_ignore_ascii_case(host)
        || port.is_some_and(|port| value.eq_ignore_ascii_case(&format!("{host}:{port}")))
}

/// Refuses `resp`, the answer to a request that carried the secret `name`, when it came
/// with a `Content-Encoding` other than `identity`: an echo of the value in it could not be
/// masked.
///
/// Errors: [`NetError::EncodedAnswer`].
fn unencoded(resp: &reqwest::Response, name: String) -> Result<(), NetError> {
    let encoding = resp
        .headers()
        .get(reqwest::header::CONTENT_ENCODING)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).trim().to_owned())
        .filter(|e| !e.is_empty() && !e.eq_ignore_ascii_case("identity"));
    match encoding {
        Some(encoding) => Err(NetError::EncodedAnswer(EncodedAnswer { name, encoding })),
        None => Ok(()),
    }
}

/// `url` without its query and fragment, for the log.
fn without_query(url: &str) -> &str {
    url.split(['?', '#']).next().unwrap_or(url)
}

impl NetError {
    /// What the egress metrics call it.
    fn outcome(&self) -> EgressOutcome {
        match self {
            NetError::NotAllowed { .. } | NetError::NotAllowedHere { .. } => {
                EgressOutcome::NotAllowed
            }
            NetError::AddressRefused(_) => EgressOutcome::AddressRefused,
            NetError::RequestTooLarge { .. } | NetError::ResponseTooLarge { .. } => {
                EgressOutcome::TooLarge
            }
            NetError::Timeout { .. } => EgressOutcome::Timeout,
            NetError::TooMany { .. } | NetError::TooManyAtOnce { .. } => EgressOutcome::TooMany,
            NetError::BadUrl(_)
            | NetError::BadMethod(_)
            | NetError::ForbiddenMethod(_)
            | NetError::ForbiddenHeader(_)
            | NetError::BadHeaderName { .. }
            | NetError::BadHeaderValue { .. }
            | NetError::EncodedAnswer(_) => EgressOutcome::Refused,
            NetError::Client { .. } | NetError::Http { .. } => EgressOutcome::Failed,
        }
    }
}

/// The resolver's refusal in `error`'s chain of sources, if it is one.
fn address_refused(error: &reqwest::Error) -> Option<AddressRefused> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if let Some(refused) = e.downcast_ref::<AddressRefused>() {
            return Some(refused.clone());
        }
        source = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::sync::mpsc;

    /// The cap the tests fetch under (bytes).
    const TEST_CAP_BYTES: usize = 1 << 20;
    /// Size of each chunk of the endless body (bytes).
    const ENDLESS_CHUNK_BYTES: usize = 64 << 10;
    /// Longest a capped fetch may take (seconds): far below the client's own timeout.
    const QUICK_SECS: u64 = 10;

    /// What the test server answers.
    #[derive(Clone, Copy)]
    enum Answer {
        /// `200 OK`, `X-Test: yes`, body `hello`.
        Small,
        /// A chunked body that never ends.
        Endless,
        /// Announces a body twice the cap, then sends nothing.
        Announced,
    }

    /// What the server saw of one connection: the request head (and `Small`'s body), and for
    /// `Endless` how many bytes it wrote before the client went away.
    struct Seen {
        head: String,
        body: Vec<u8>,
        written: usize,
    }

    /// A real HTTP/1.1 server on 127.0.0.1 answering every connection with `answer`.
    async fn server(answer: Answer) -> (u16, mpsc::UnboundedReceiver<Seen>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    if let Some(seen) = handle(stream, answer).await {
                        let _ = tx.send(seen);
                    }
                });
            }
        });
        (port, rx)
    }

    async fn handle(mut stream: TcpStream, answer: Answer) -> Option<Seen> {
        let mut data = Vec::new();
        let mut buf = [0u8; 4096];
        let head_end = loop {
            let n = stream.read(&mut buf).await.ok()?;
            if n == 0 {
                return None;
            }
            data.extend_from_slice(&buf[..n]);
            if let Some(i) = data.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
        };
        let head = String::from_utf8_lossy(&data[..head_end]).into_owned();
        let length = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse::<usize>().unwrap_or(0))
            })
            .unwrap_or(0);
        while data.len() < head_end + length {
            let n = stream.read(&mut buf).await.ok()?;
            if n == 0 {
                break;
            }
            data.extend_from_slice(&buf[..n]);
        }
        let body = data[head_end..].to_vec();
        let mut written = 0;
        match answer {
            Answer::Small => {
                let reply = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Test: yes\r\nConnection: close\r\n\r\nhello";
                stream.write_all(reply).await.ok()?;
            }
            Answer::Endless => {
                let head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
                stream.write_all(head).await.ok()?;
                let mut chunk = format!("{ENDLESS_CHUNK_BYTES:x}\r\n").into_bytes();
                chunk.extend(std::iter::repeat_n(b'x', ENDLESS_CHUNK_BYTES));
                chunk.extend_from_slice(b"\r\n");
                // Until the client closes the connection.
                while stream.write_all(&chunk).await.is_ok() {
                    written += chunk.len();
                }
            }
            Answer::Announced => {
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
                    2 * TEST_CAP_BYTES
                );
                stream.write_all(head.as_bytes()).await.ok()?;
                // Send nothing more; the client must not wait for it.
                let _ = stream.read(&mut buf).await;
            }
        }
        Some(Seen {
            head,
            body,
            written,
        })
    }

    /// The allow-list of `entries`.
    fn allow(entries: &[String]) -> AllowList {
        AllowList::parse(entries).expect("valid entries")
    }

    fn get(url: String, headers: &[(&str, &str)]) -> FetchRequest {
        FetchRequest {
            method: "GET".into(),
            url,
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    fn error_of(answer: &FetchResponse) -> &str {
        match answer {
            FetchResponse::Error { error } => error,
            FetchResponse::Ok { status, .. } => panic!("expected an error, got status {status}"),
        }
    }

    #[tokio::test]
    async fn endless_body_stops_at_the_cap_quickly() {
        let (port, mut seen) = server(Answer::Endless).await;
        let policy = NetPolicy::new(allow(&[format!("127.0.0.1:{port}")]), TEST_CAP_BYTES);
        let started = Instant::now();
        let (answer, body) = policy
            .fetch(
                &get(format!("http://127.0.0.1:{port}/big"), &[]),
                Vec::new(),
                None,
            )
            .await;
        assert_eq!(
            error_of(&answer),
            "the response is larger than the limit of 1048576 bytes (--max-fetch-bytes)"
        );
        assert!(body.is_empty());
        assert!(started.elapsed() < Duration::from_secs(QUICK_SECS));
        // The connection was closed: the server stopped writing soon after the cap (the rest
        // is what the sockets' buffers took).
        let seen = tokio::time::timeout(Duration::from_secs(QUICK_SECS), seen.recv())
            .await
            .expect("the server saw the client go")
            .expect("one connection");
        assert!(seen.written < 32 * TEST_CAP_BYTES, "{} bytes", seen.written);
    }

    #[tokio::test]
    async fn announced_length_over_the_cap_is_refused_before_reading() {
        let (port, _seen) = server(Answer::Announced).await;
        let policy = NetPolicy::new(allow(&["127.0.0.1".into()]), TEST_CAP_BYTES);
        let started = Instant::now();
        let (answer, _) = policy
            .fetch(
                &get(format!("http://127.0.0.1:{port}/"), &[]),
                Vec::new(),
                None,
            )
            .await;
        assert!(error_of(&answer).contains("larger than the limit of 1048576 bytes"));
        assert!(started.elapsed() < Duration::from_secs(QUICK_SECS));
    }

    #[tokio::test]
    async fn small_body_is_returned_with_its_metadata() {
        let (port, mut seen) = server(Answer::Small).await;
        let policy = NetPolicy::new(allow(&[format!("127.0.0.1:{port}")]), TEST_CAP_BYTES);
        let url = format!("http://127.0.0.1:{port}/small?q=1");
        let request = FetchRequest {
            method: "POST".into(),
            url: url.clone(),
            headers: vec![("X-Custom".into(), "42".into())],
        };
        let (answer, body) = policy.fetch(&request, b"payload".to_vec(), None).await;
        assert_eq!(body, b"hello");
        let FetchResponse::Ok {
            status,
            status_text,
            headers,
            url: answered,
            redirected,
        } = answer
        else {
            panic!("expected a response, got {answer:?}");
        };
        assert_eq!((status, status_text.as_str()), (200, "OK"));
        assert!(headers.contains(&("x-test".into(), "yes".into())));
        assert_eq!(answered, url);
        assert!(!redirected);
        let seen = seen.recv().await.expect("one connection");
        assert!(seen.head.starts_with("POST /small?q=1 HTTP/1.1\r\n"));
        assert!(seen.head.to_ascii_lowercase().contains("x-custom: 42\r\n"));
        assert_eq!(seen.body, b"payload");
    }

    #[tokio::test]
    async fn forbidden_headers_are_refused_and_never_sent() {
        let (port, mut seen) = server(Answer::Small).await;
        let policy = NetPolicy::new(allow(&[format!("127.0.0.1:{port}")]), TEST_CAP_BYTES);
        let url = format!("http://127.0.0.1:{port}/");
        let (answer, _) = policy
            .fetch(
                &get(url.clone(), &[("Host", "internal.example")]),
                Vec::new(),
                None,
            )
            .await;
        assert_eq!(
            error_of(&answer),
            "the header Host cannot be set by user code"
        );
        for name in FORBIDDEN_REQUEST_HEADERS {
            let upper = name.to_ascii_uppercase();
            let (answer, _) = policy
                .fetch(
                    &get(url.clone(), &[("Accept", "*/*"), (&upper, "1")]),
                    Vec::new(),
                    None,
                )
                .await;
            assert!(error_of(&answer).contains(&upper), "{name}");
        }
        let (answer, _) = policy
            .fetch(
                &get(url.clone(), &[("X-Evil", "a\r\nHost: b")]),
                Vec::new(),
                None,
            )
            .await;
        assert!(error_of(&answer).starts_with("invalid value for header X-Evil"));
        let (answer, _) = policy
            .fetch(&get(url.clone(), &[("bad name", "1")]), Vec::new(), None)
            .await;
        assert!(error_of(&answer).starts_with("invalid header name \"bad name\""));
        let mut trace = get(url.clone(), &[]);
        trace.method = "TRACE".into();
        assert!(error_of(&policy.fetch(&trace, Vec::new(), None).await.0).contains("TRACE"));
        // None of those reached the server: the first request it sees is this one.
        let (answer, _) = policy
            .fetch(&get(format!("{url}after"), &[]), Vec::new(), None)
            .await;
        assert!(matches!(answer, FetchResponse::Ok { status: 200, .. }));
        let first = seen.recv().await.expect("one connection");
        assert!(first.head.starts_with("GET /after "), "{}", first.head);
    }

    #[tokio::test]
    async fn connection_headers_and_the_own_host_are_left_out_as_a_browser_does() {
        let (port, mut seen) = server(Answer::Small).await;
        let policy = NetPolicy::new(allow(&[format!("127.0.0.1:{port}")]), TEST_CAP_BYTES);
        let url = format!("http://127.0.0.1:{port}/");
        let mut asked = vec![
            ("X-Kept", "1".to_owned()),
            ("Host", format!("127.0.0.1:{port}")),
        ];
        asked.extend(CONNECTION_HEADERS.map(|h| (h, "x-sent".to_owned())));
        let pairs: Vec<(&str, &str)> = asked.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (answer, _) = policy.fetch(&get(url, &pairs), Vec::new(), None).await;
        assert!(
            matches!(answer, FetchResponse::Ok { status: 200, .. }),
            "{answer:?}"
        );
        let head = seen
            .recv()
            .await
            .expect("one connection")
            .head
            .to_ascii_lowercase();
        assert!(head.contains("x-kept: 1\r\n"), "{head}");
        assert!(!head.contains("x-sent"), "{head}");
        assert_eq!(head.matches("host: ").count(), 1, "{head}");
    }

    #[tokio::test]
    async fn hosts_not_allowed_are_refused_without_connecting() {
        let (port, mut seen) = server(Answer::Small).await;
        let other_port = port.wrapping_add(1);
        let policy = NetPolicy::new(allow(&[format!("127.0.0.1:{other_port}")]), TEST_CAP_BYTES);
        let (answer, _) = policy
            .fetch(
                &get(format!("http://127.0.0.1:{port}/"), &[]),
                Vec::new(),
                None,
            )
            .await;
        assert!(
            error_of(&answer).starts_with("network access to 127.0.0.1 is not allowed"),
            "{answer:?}"
        );
        let (answer, _) = policy
            .fetch(
                &get(format!("http://localhost:{port}/"), &[]),
                Vec::new(),
                None,
            )
            .await;
        assert!(error_of(&answer).contains("localhost is not allowed"));
        let (answer, _) = policy
            .fetch(&get("file:///etc/passwd".into(), &[]), Vec::new(), None)
            .await;
        assert!(error_of(&answer).starts_with("unsupported URL file:///etc/passwd"));
        let nothing = tokio::time::timeout(Duration::from_millis(200), seen.recv()).await;
        assert!(nothing.is_err(), "the server saw a connection");
    }

    #[tokio::test]
    async fn request_bodies_over_the_cap_are_refused() {
        let (port, _seen) = server(Answer::Small).await;
        let policy = NetPolicy::new(allow(&[format!("127.0.0.1:{port}")]), TEST_CAP_BYTES);
        let (answer, _) = policy
            .fetch(
                &get(format!("http://127.0.0.1:{port}/"), &[]),
                vec![0; TEST_CAP_BYTES + 1],
                None,
            )
            .await;
        assert!(error_of(&answer).starts_with("the request body is larger than the limit"));
        assert_eq!(policy.max_request_bytes(), TEST_CAP_BYTES);
    }

    #[test]
    fn javascript_sees_todays_shapes() {
        let ok = FetchResponse::Ok {
            status: 404,
            status_text: "Not Found".into(),
            headers: vec![("a".into(), "b".into())],
            url: "http://h/".into(),
            redirected: false,
        };
        let json = serde_json::to_value(&ok).expect("serializes");
        assert_eq!(
            json,
            serde_json::json!({"status": 404, "statusText": "Not Found", "headers": [["a", "b"]],
                "url": "http://h/", "redirected": false})
        );
        assert_eq!(serde_json::from_value::<FetchResponse>(json).ok(), Some(ok));
        let error = FetchResponse::Error { error: "no".into() };
        let json = serde_json::to_value(&error).expect("serializes");
        assert_eq!(json, serde_json::json!({"error": "no"}));
        assert_eq!(
            serde_json::from_value::<FetchResponse>(json).ok(),
            Some(error)
        );

        // What runtime/js/fetch.js sends.
        let request: FetchRequest = serde_json::from_str(
            r#"{"method":"GET","url":"http://h/","headers":[["accept","*/*"]]}"#,
        )
        .expect("parses");
        assert_eq!(request.headers, vec![("accept".into(), "*/*".into())]);
        assert!(serde_json::from_str::<FetchRequest>(
            r#"{"method":"GET","url":"http://h/","headers":[],"extra":1}"#
        )
        .is_err());
    }
}
