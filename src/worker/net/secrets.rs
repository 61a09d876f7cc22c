//! `--secret`: credentials user code may use but never holds (issue 47; Deno's Sandbox and
//! microsandbox do the same).
//!
//! `--secret NAME[=ENV_VAR]@host[,host…]` reads the value of `ENV_VAR` (`NAME` when it is left
//! out) once, as the server starts, and removes the variable from the server's environment, so
//! that no process it starts (workers, the zygote service, code mode's upstream servers)
//! inherits it. The sandbox's `os.environ[NAME]` holds only the placeholder
//! `MCP_SECRET_NAME` ([`placeholder`]). When a request of user code to one of the secret's
//! hosts (the forms of `--allow-net`, each within it) carries the placeholder in a header's
//! value (an `Authorization: Basic` header's decoded credentials included) or in the URL's
//! query, the front puts the value in its place; to any other host the placeholder goes out
//! as it is, useless there. The value comes back masked: wherever it appears (as is,
//! percent-encoded or in base64) in a response's body, headers or final URL, or in a failure's
//! words, the placeholder stands in its place.
//! A request that carried a value asks for an unencoded answer (`Accept-Encoding: identity`)
//! and refuses an encoded one ([`EncodedAnswer`]), since a compressed echo could not be
//! masked.
//!
//! The value lives only here, in the front's memory: never in a worker, a result, a log line,
//! a metric label, a task record or the state directory.

use super::allow_list::{AllowList, BadEntry};
use base64::Engine as _;
use memchr::memmem;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use thiserror::Error;

/// What every placeholder starts with: `os.environ[NAME]` is `MCP_SECRET_NAME`.
pub const PLACEHOLDER_PREFIX: &str = "MCP_SECRET_";

/// Shortest value a secret may have (bytes): a shorter one would be masked wherever those few
/// bytes happen to appear in a response, and is not a credential anyone issues.
pub const MIN_SECRET_BYTES: usize = 8;

/// What a value is percent-encoded with in a query: everything but RFC 3986's unreserved
/// characters.
const QUERY_VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A `--secret` that cannot be used, by the secret's name (never its value).
#[derive(Debug, Error)]
pub enum SecretError {
    /// Not `NAME[=ENV_VAR]@host[,host…]` with names of letters, digits and `_`.
    #[error("--secret {0:?} is not NAME[=ENV_VAR]@host[,host…] (NAME and ENV_VAR of letters, digits and _, not starting with a digit)")]
    Syntax(String),
    /// The same `NAME` twice.
    #[error("--secret {0} is given twice")]
    Twice(String),
    /// A host of the secret is none of `--allow-net`'s forms.
    #[error("--secret {name}: a host is not valid")]
    Host {
        name: String,
        #[source]
        source: BadEntry,
    },
    /// A host of the secret that `--allow-net` does not admit: the value could never be sent.
    #[error("--secret {name}: its host {host} is not within --allow-net, so the secret could never be used")]
    NotAllowed { name: String, host: String },
    /// The environment variable is not set, or not UTF-8.
    #[error("--secret {name}: the environment variable {var} is not set")]
    Unset { name: String, var: String },
    /// The value is shorter than [`MIN_SECRET_BYTES`].
    #[error("--secret {name}: the value of {var} is shorter than {MIN_SECRET_BYTES} bytes, too short to be masked in responses")]
    TooShort { name: String, var: String },
    /// The value has a byte an HTTP header cannot carry (a control character).
    #[error("--secret {name}: the value of {var} holds a control character, which a header cannot carry")]
    NotHeaderSafe { name: String, var: String },
}

/// A response to a request that carried a secret came with a `Content-Encoding`: an echo of
/// the value in it could not be masked, so the front does not hand it on.
#[derive(Debug, Error)]
#[error("the response to a request carrying the secret {name} came encoded ({encoding}), which the server cannot check for the secret; ask for an unencoded answer")]
pub struct EncodedAnswer {
    pub name: String,
    pub encoding: String,
}

/// One secret. Its `Debug` leaves the value out.
struct Secret {
    /// `NAME`: the key in the sandbox's `os.environ`.
    name: String,
    /// `MCP_SECRET_NAME`.
    placeholder: String,
    value: String,
    /// Where the value may go (each entry within `--allow-net`).
    hosts: AllowList,
    /// The forms of the value a response may echo (as is, percent-encoded, in base64 at each
    /// alignment: [`base64_cores`]), longest first.
    echoes: Vec<Vec<u8>>,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secret")
            .field("name", &self.name)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

/// Every `--secret` of the server (see the module's documentation).
#[derive(Debug, Default)]
pub struct Secrets {
    /// Longest placeholder first, so that `MCP_SECRET_KEY_2` is never taken for
    /// `MCP_SECRET_KEY` followed by `_2`.
    list: Vec<Secret>,
}

/// The placeholder user code sees for the secret `name`.
pub fn placeholder(name: &str) -> String {
    format!("{PLACEHOLDER_PREFIX}{name}")
}

impl Secrets {
    /// The secrets `specs` name (`--secret`), their values read from the environment and the
    /// variables then removed from it (see the module's documentation); each host must be
    /// within `allow` (`--allow-net`).
    ///
    /// Call it before any other thread runs: it changes the process's environment.
    ///
    /// Errors: the first [`SecretError`] met, by the secret's name.
    pub fn take_from_environment(
        specs: &[String],
        allow: &AllowList,
    ) -> Result<Secrets, SecretError> {
        let mut list: Vec<Secret> = Vec::new();
        for spec in specs {
            let (name, var, hosts) = parse(spec)?;
            if list.iter().any(|s| s.name == name) {
                return Err(SecretError::Twice(name));
            }
            let hosts = AllowList::parse(&hosts).map_err(|source| SecretError::Host {
                name: name.clone(),
                source,
            })?;
            if let Some(host) = hosts.outside(allow) {
                let host = host.to_owned();
                return Err(SecretError::NotAllowed { name, host });
            }
            let value = read_value(&name, &var)?;
            scrub(&var);
            list.push(Secret::new(name, value, hosts));
        }
        list.sort_by_key(|s| std::cmp::Reverse(s.placeholder.len()));
        Ok(Secrets { list })
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// What the sandbox's `os.environ` gets: each secret's name and placeholder.
    pub fn environment(&self) -> Vec<(String, String)> {
        self.list
            .iter()
            .map(|s| (s.name.clone(), s.placeholder.clone()))
            .collect()
    }

    /// For the tool's description: each secret's name, placeholder and hosts, one line each
    /// (never a value).
    pub fn summary(&self) -> String {
        let mut names: Vec<&Secret> = self.list.iter().collect();
        names.sort_by(|a, b| a.name.cmp(&b.name));
        names
            .iter()
            .map(|s| {
                let hosts: Vec<&str> = s.hosts.entries().collect();
                format!(
                    "- os.environ[\"{}\"] (the placeholder {}), for {}",
                    s.name,
                    s.placeholder,
                    hosts.join(", ")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Puts, in a request to `url` (host and port checked against each secret's hosts), the
    /// value of every secret whose placeholder its query or a header's value carries; returns
    /// the names of those put in, and then asks for an unencoded answer.
    pub fn put_in(&self, url: &mut reqwest::Url, headers: &mut HeaderMap) -> Vec<String> {
        let mut carried = Vec::new();
        for secret in &self.list {
            if secret.hosts.entry_for_url(url).is_none() {
                continue;
            }
            let in_query = secret.put_in_query(url);
            let in_headers = secret.put_in_headers(headers);
            if in_query || in_headers {
                carried.push(secret.name.clone());
            }
        }
        if !carried.is_empty() {
            headers.insert(
                reqwest::header::ACCEPT_ENCODING,
                HeaderValue::from_static("identity"),
            );
        }
        carried
    }

    /// `bytes` with every secret's value (as is, percent-encoded or in base64) replaced by its
    /// placeholder: a base64 text that held the value no longer decodes to it.
    pub fn mask(&self, bytes: Vec<u8>) -> Vec<u8> {
        self.list.iter().fold(bytes, |bytes, secret| {
            secret.echoes.iter().fold(bytes, |b, echo| {
                // Copied only where an echo is found: a body (up to --max-fetch-bytes) is
                // otherwise searched once per form and never rewritten.
                if memmem::find(&b, echo).is_none() {
                    return b;
                }
                replace(&b, echo, secret.placeholder.as_bytes(), false)
            })
        })
    }

    /// [`mask`](Self::mask) of a text.
    pub fn mask_text(&self, text: String) -> String {
        if self.list.is_empty() {
            return text;
        }
        let masked = self.mask(text.into_bytes());
        String::from_utf8_lossy(&masked).into_owned()
    }
}

impl Secret {
    fn new(name: String, value: String, hosts: AllowList) -> Secret {
        let mut echoes = vec![value.as_bytes().to_vec()];
        let encoded = utf8_percent_encode(&value, QUERY_VALUE).to_string();
        if encoded != value {
            echoes.push(encoded.into_bytes());
        }
        echoes.extend(base64_cores(value.as_bytes()));
        echoes.sort_by_key(|e| std::cmp::Reverse(e.len()));
        echoes.dedup();
        Secret {
            placeholder: placeholder(&name),
            name,
            value,
            hosts,
            echoes,
        }
    }

    /// Puts the value, percent-encoded, where the query carries the placeholder.
    fn put_in_query(&self, url: &mut reqwest::Url) -> bool {
        let Some(query) = url.query() else {
            return false;
        };
        let encoded = utf8_percent_encode(&self.value, QUERY_VALUE).to_string();
        let replaced = replace(
            query.as_bytes(),
            self.placeholder.as_bytes(),
            encoded.as_bytes(),
            true,
        );
        if replaced == query.as_bytes() {
            return false;
        }
        url.set_query(Some(&String::from_utf8_lossy(&replaced)));
        true
    }

    /// Puts the value where a header's value carries the placeholder, in an
    /// `Authorization: Basic` header's decoded credentials too.
    fn put_in_headers(&self, headers: &mut HeaderMap) -> bool {
        let mut any = false;
        for (name, value) in headers.iter_mut() {
            let basic = name == AUTHORIZATION;
            let put = self
                .put_in_value(value.as_bytes())
                .or_else(|| basic.then(|| self.put_in_basic(value.as_bytes())).flatten());
            // The value was checked to be header-safe at start, and so is the placeholder.
            if let Some(Ok(new)) = put.map(|bytes| HeaderValue::from_bytes(&bytes)) {
                *value = new;
                any = true;
            }
        }
        any
    }

    /// `value` with the placeholder replaced, when it carries it.
    fn put_in_value(&self, value: &[u8]) -> Option<Vec<u8>> {
        let replaced = replace(
            value,
            self.placeholder.as_bytes(),
            self.value.as_bytes(),
            true,
        );
        (replaced != value).then_some(replaced)
    }

    /// An `Authorization: Basic` value whose decoded `user:password` carries the placeholder,
    /// with the value in its place, encoded again (RFC 7617).
    fn put_in_basic(&self, value: &[u8]) -> Option<Vec<u8>> {
        const SCHEME: &[u8] = b"basic ";
        let head = value.get(..SCHEME.len())?;
        if !head.eq_ignore_ascii_case(SCHEME) {
            return None;
        }
        let engine = base64::engine::general_purpose::STANDARD;
        let decoded = engine.decode(value[SCHEME.len()..].trim_ascii()).ok()?;
        let credentials = self.put_in_value(&decoded)?;
        let mut out = b"Basic ".to_vec();
        out.extend_from_slice(engine.encode(credentials).as_bytes());
        Some(out)
    }
}

/// The characters every base64 text (standard and URL-safe alphabets) holding `value` has,
/// whatever precedes it: for each of the three alignments of `value` in the encoded bytes, the
/// characters that only `value`'s bits make (an `Authorization: Basic` echo carries
/// `user:value` so).
fn base64_cores(value: &[u8]) -> Vec<Vec<u8>> {
    use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
    const BITS_PER_BYTE: usize = 8;
    const BITS_PER_CHAR: usize = 6;
    let mut cores = Vec::new();
    for before in 0..3 {
        let mut bytes = vec![0u8; before];
        bytes.extend_from_slice(value);
        let first = (before * BITS_PER_BYTE).div_ceil(BITS_PER_CHAR);
        let end = bytes.len() * BITS_PER_BYTE / BITS_PER_CHAR;
        for engine in [STANDARD_NO_PAD, URL_SAFE_NO_PAD] {
            let text = engine.encode(&bytes);
            cores.push(text.as_bytes()[first..end].to_vec());
        }
    }
    cores
}

/// `NAME`, `ENV_VAR` and the hosts of one `--secret`.
///
/// Errors: [`SecretError::Syntax`].
fn parse(spec: &str) -> Result<(String, String, Vec<String>), SecretError> {
    let bad = || SecretError::Syntax(spec.to_owned());
    let (names, hosts) = spec.trim().split_once('@').ok_or_else(bad)?;
    let (name, var) = names.split_once('=').unwrap_or((names, names));
    let identifier = |s: &str| {
        s.chars().next().is_some_and(|c| !c.is_ascii_digit())
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let hosts: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(str::to_owned)
        .collect();
    if !identifier(name) || !identifier(var) || hosts.is_empty() {
        return Err(bad());
    }
    Ok((name.to_owned(), var.to_owned(), hosts))
}

/// The value of `var` for the secret `name`.
///
/// Errors: [`SecretError::Unset`], [`SecretError::TooShort`], [`SecretError::NotHeaderSafe`].
fn read_value(name: &str, var: &str) -> Result<String, SecretError> {
    let words = || (name.to_owned(), var.to_owned());
    let value = std::env::var(var).map_err(|_| {
        let (name, var) = words();
        SecretError::Unset { name, var }
    })?;
    if value.len() < MIN_SECRET_BYTES {
        let (name, var) = words();
        return Err(SecretError::TooShort { name, var });
    }
    if value.bytes().any(|b| b.is_ascii_control()) {
        let (name, var) = words();
        return Err(SecretError::NotHeaderSafe { name, var });
    }
    Ok(value)
}

/// Removes `var` from the environment, its value's bytes first overwritten with zeros where
/// the process was given them, so that `/proc/<pid>/environ` (which reads that first copy) no
/// longer shows it either. Call it while no other thread runs.
fn scrub(var: &str) {
    if let Ok(name) = std::ffi::CString::new(var) {
        // SAFETY: no other thread runs (the caller's contract), so nothing reads or changes
        // the environment meanwhile; `getenv` gives the value's NUL-terminated bytes inside the
        // process's own environment block, which is writable, and exactly `strlen` of them are
        // overwritten, the terminator kept.
        unsafe {
            let value = libc::getenv(name.as_ptr());
            if !value.is_null() {
                std::ptr::write_bytes(value, 0, libc::strlen(value));
            }
        }
    }
    std::env::remove_var(var);
}

/// `haystack` with each `needle` replaced by `with`; with `whole`, only where the needle is
/// not followed by a letter, digit or `_` (a placeholder is a whole word: `MCP_SECRET_KEY` in
/// `MCP_SECRET_KEY_2` is not one).
fn replace(haystack: &[u8], needle: &[u8], with: &[u8], whole: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(haystack.len());
    let mut rest = 0;
    for at in memmem::find_iter(haystack, needle) {
        let end = at + needle.len();
        let ends_word = haystack
            .get(end)
            .is_none_or(|b| !(b.is_ascii_alphanumeric() || *b == b'_'));
        if at < rest || (whole && !ends_word) {
            continue;
        }
        out.extend_from_slice(&haystack[rest..at]);
        out.extend_from_slice(with);
        rest = end;
    }
    out.extend_from_slice(&haystack[rest..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALUE: &str = "s3cr3t/value+with=signs";

    fn secrets(hosts: &[&str]) -> Secrets {
        let hosts: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
        let mut list = vec![
            Secret::new(
                "KEY".into(),
                VALUE.into(),
                AllowList::parse(&hosts).expect("hosts"),
            ),
            Secret::new(
                "KEY_2".into(),
                "another-long-value".into(),
                AllowList::parse(&["other.test".to_owned()]).expect("hosts"),
            ),
        ];
        list.sort_by_key(|s| std::cmp::Reverse(s.placeholder.len()));
        Secrets { list }
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(*k, HeaderValue::from_str(v).expect("value"));
        }
        map
    }

    #[test]
    fn the_value_goes_only_to_its_hosts_in_headers_and_the_query() {
        let all = secrets(&["api.test"]);
        let mut url =
            reqwest::Url::parse("https://api.test/x?key=MCP_SECRET_KEY&n=1").expect("url");
        let mut h = headers(&[
            ("authorization", "Bearer MCP_SECRET_KEY"),
            ("x-other", "MCP_SECRET_KEY_2"),
        ]);
        assert_eq!(all.put_in(&mut url, &mut h), ["KEY"]);
        assert_eq!(url.query(), Some("key=s3cr3t%2Fvalue%2Bwith%3Dsigns&n=1"));
        assert_eq!(h["authorization"], format!("Bearer {VALUE}").as_str());
        // Another secret's placeholder, for another host, goes out as it is.
        assert_eq!(h["x-other"], "MCP_SECRET_KEY_2");
        assert_eq!(h["accept-encoding"], "identity");

        let mut url =
            reqwest::Url::parse("https://elsewhere.test/?key=MCP_SECRET_KEY").expect("url");
        let mut h = headers(&[("authorization", "Bearer MCP_SECRET_KEY")]);
        assert!(all.put_in(&mut url, &mut h).is_empty());
        assert_eq!(h["authorization"], "Bearer MCP_SECRET_KEY");
        assert_eq!(url.query(), Some("key=MCP_SECRET_KEY"));
    }

    #[test]
    fn basic_credentials_carry_the_value_encoded_again() {
        let all = secrets(&["api.test:443"]);
        let engine = base64::engine::general_purpose::STANDARD;
        let sent = format!("Basic {}", engine.encode("user:MCP_SECRET_KEY"));
        let mut url = reqwest::Url::parse("https://api.test/").expect("url");
        let mut h = headers(&[("authorization", &sent)]);
        assert_eq!(all.put_in(&mut url, &mut h), ["KEY"]);
        let expected = format!("Basic {}", engine.encode(format!("user:{VALUE}")));
        assert_eq!(h["authorization"], expected.as_str());
    }

    #[test]
    fn echoes_come_back_as_the_placeholder() {
        let all = secrets(&["api.test"]);
        let body = format!("{{\"seen\": \"{VALUE}\", \"q\": \"s3cr3t%2Fvalue%2Bwith%3Dsigns\"}}");
        let masked = all.mask(body.into_bytes());
        assert_eq!(
            String::from_utf8(masked).expect("utf-8"),
            "{\"seen\": \"MCP_SECRET_KEY\", \"q\": \"MCP_SECRET_KEY\"}"
        );
        assert_eq!(all.mask_text("no secret".into()), "no secret");
        let engine = base64::engine::general_purpose::STANDARD;
        for user in ["", "a:", "ab:", "abc:"] {
            let echoed = engine.encode(format!("{user}{VALUE}"));
            let masked = all.mask_text(echoed.clone());
            assert!(masked.contains("MCP_SECRET_KEY"), "{user}: {masked}");
            let decoded = engine
                .decode(masked.replace("MCP_SECRET_KEY", ""))
                .unwrap_or_default();
            assert!(!String::from_utf8_lossy(&decoded).contains(VALUE), "{user}");
        }
    }

    #[test]
    fn specs_are_parsed_and_checked_against_allow_net() {
        assert_eq!(
            parse("TOKEN=GH_TOKEN@api.github.com, *.github.com").expect("spec"),
            (
                "TOKEN".into(),
                "GH_TOKEN".into(),
                vec!["api.github.com".into(), "*.github.com".into()]
            )
        );
        assert_eq!(parse("TOKEN@h").expect("spec").1, "TOKEN");
        for bad in ["TOKEN", "1X@h", "A-B@h", "A=@h", "A@"] {
            assert!(matches!(parse(bad), Err(SecretError::Syntax(_))), "{bad}");
        }
        let allow = AllowList::parse(&["api.test".to_owned()]).expect("allow");
        let refused = Secrets::take_from_environment(&["K@other.test".into()], &allow);
        assert!(matches!(refused, Err(SecretError::NotAllowed { .. })));
        let unset = Secrets::take_from_environment(
            &["K=MCP_RUN_PYTHON_UNSET_TEST_VAR@api.test".into()],
            &allow,
        );
        assert!(matches!(unset, Err(SecretError::Unset { .. })));
    }

    #[test]
    fn a_placeholder_is_a_whole_word() {
        assert_eq!(
            replace(b"A_B A_BC A_B_", b"A_B", b"x", true),
            b"x A_BC A_B_".to_vec()
        );
        assert_eq!(replace(b"aaaa", b"aa", b"b", false), b"bb".to_vec());
    }
}
