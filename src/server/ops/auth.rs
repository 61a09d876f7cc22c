//! Authentication for the HTTP modes (README "Running many replicas"): the server as an OAuth 2.1 resource server,
//! as the MCP authorization spec (2025-11-25, "Authorization") has it.
//!
//! With `--auth-jwks FILE|URL --auth-audience AUD` a request must carry `Authorization: Bearer
//! <JWT>` signed by one of those public keys (chosen by the token's `kid`, the algorithm bound to
//! the key's type, never the token's say alone), meant for that audience (`aud`, RFC 8707) and
//! not expired (`exp`, required). With `--auth-token-file FILE` a static bearer token (the
//! file's first line) is accepted instead, for small setups. Anything else gets 401 with
//! `WWW-Authenticate: Bearer resource_metadata="…/.well-known/oauth-protected-resource"`
//! (RFC 9728 §5.1, as the MCP spec requires), and that document is served.
//!
//! The token's principal (`iss` and `sub`) owns what it makes: a sandbox belongs to the
//! principal that created it, and another principal's call with its handle gets the same
//! "does not exist" answer as an unknown handle (SEP-2567: check the (id, principal) pair on
//! every call). `/healthz`, `/readyz`, `/metrics` and the metadata document need no token.

use crate::sandbox::live::Principal;
use crate::server::errors::{self, Refusal};
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;

/// The path of the protected resource metadata (RFC 9728 §3).
pub const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

/// The protected resource: the MCP endpoint (RFC 9728 §2, `resource`).
const MCP_PATH: &str = "/mcp";

/// Largest JWKS document or token file read (bytes).
const MAX_KEYS_BYTES: u64 = 1 << 20;

/// Largest bearer token looked at (bytes): larger ones are refused unread.
const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// The principal of the static token (`--auth-token-file`).
const STATIC_PRINCIPAL: &str = "static-token";

/// Where the keys come from.
#[derive(Debug, Clone)]
pub enum KeySource {
    File(PathBuf),
    Url(String),
}

impl KeySource {
    /// `--auth-jwks`: an `http(s)://` URL, else a file path.
    pub fn parse(value: &str) -> KeySource {
        if value.starts_with("https://") || value.starts_with("http://") {
            KeySource::Url(value.to_owned())
        } else {
            KeySource::File(PathBuf::from(value))
        }
    }
}

/// Why the authentication settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AuthSetupError {
    #[error("--auth-jwks {0}: cannot read it")]
    Read(String, #[source] std::io::Error),
    #[error("--auth-jwks {0}: cannot fetch it")]
    Fetch(String, #[source] reqwest::Error),
    #[error("--auth-jwks {0}: not a JWK set")]
    NotJwks(String, #[source] serde_json::Error),
    #[error(
        "--auth-jwks {0}: it has no public signing key this server can use (RSA, EC or Ed25519)"
    )]
    NoKeys(String),
    #[error("--auth-jwks needs --auth-audience (the tokens' `aud`: this server's resource URI)")]
    NoAudience,
    #[error("--auth-token-file {0}: cannot read it")]
    TokenFile(String, #[source] std::io::Error),
    #[error("--auth-token-file {0}: its first line is empty")]
    EmptyToken(String),
}

/// One usable public key.
pub struct Key {
    id: Option<String>,
    key: DecodingKey,
    algorithms: Vec<Algorithm>,
}

/// The algorithms a key may verify: its own `alg` when it names one, else those of its type.
/// Never an HMAC algorithm: a resource server holds no shared secret.
fn algorithms_for(jwk: &Jwk) -> Vec<Algorithm> {
    let named = jwk.common.key_algorithm.and_then(|alg| match alg {
        KeyAlgorithm::RS256 => Some(Algorithm::RS256),
        KeyAlgorithm::RS384 => Some(Algorithm::RS384),
        KeyAlgorithm::RS512 => Some(Algorithm::RS512),
        KeyAlgorithm::PS256 => Some(Algorithm::PS256),
        KeyAlgorithm::PS384 => Some(Algorithm::PS384),
        KeyAlgorithm::PS512 => Some(Algorithm::PS512),
        KeyAlgorithm::ES256 => Some(Algorithm::ES256),
        KeyAlgorithm::ES384 => Some(Algorithm::ES384),
        KeyAlgorithm::EdDSA => Some(Algorithm::EdDSA),
        _ => None,
    });
    if let Some(alg) = named {
        return vec![alg];
    }
    match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => vec![
            Algorithm::RS256,
            Algorithm::RS384,
            Algorithm::RS512,
            Algorithm::PS256,
            Algorithm::PS384,
            Algorithm::PS512,
        ],
        AlgorithmParameters::EllipticCurve(_) => vec![Algorithm::ES256, Algorithm::ES384],
        AlgorithmParameters::OctetKeyPair(_) => vec![Algorithm::EdDSA],
        AlgorithmParameters::OctetKey(_) => Vec::new(),
    }
}

/// Authentication of the HTTP modes: the verifier, and the authorization servers the metadata
/// names (`--auth-server`).
pub struct Auth {
    pub verifier: Verifier,
    pub authorization_servers: Vec<String>,
}

/// How requests are authenticated.
pub enum Verifier {
    /// JWTs signed by `keys`, for `audience`.
    Jwt { keys: Vec<Key>, audience: String },
    /// One static bearer token.
    Static { token: String },
}

/// The claims read from a token (the rest is checked by `jsonwebtoken`'s validation).
#[derive(Debug, Deserialize)]
struct Claims {
    #[serde(default)]
    iss: Option<String>,
    #[serde(default)]
    sub: Option<String>,
}

/// Why a request was not authenticated (the `error` of `WWW-Authenticate`, RFC 6750 §3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// No bearer token: no `error` attribute (RFC 6750 §3.1).
    Missing,
    /// A token that is malformed, unsigned by the keys, expired or for another audience.
    Invalid,
}

impl Verifier {
    /// The verifier for `--auth-jwks` (with `--auth-audience`) or `--auth-token-file`.
    ///
    /// Errors: [`AuthSetupError`] when the keys or the token cannot be read or used.
    pub async fn load(
        jwks: Option<&str>,
        audience: Option<&str>,
        token_file: Option<&std::path::Path>,
    ) -> Result<Option<Verifier>, AuthSetupError> {
        if let Some(path) = token_file {
            let shown = path.display().to_string();
            let text =
                read_bounded(path).map_err(|e| AuthSetupError::TokenFile(shown.clone(), e))?;
            let token = text.lines().next().unwrap_or("").trim().to_owned();
            if token.is_empty() {
                return Err(AuthSetupError::EmptyToken(shown));
            }
            return Ok(Some(Verifier::Static { token }));
        }
        let Some(source) = jwks else {
            return Ok(None);
        };
        let audience = audience.ok_or(AuthSetupError::NoAudience)?.to_owned();
        let text = match KeySource::parse(source) {
            KeySource::File(path) => {
                read_bounded(&path).map_err(|e| AuthSetupError::Read(source.to_owned(), e))?
            }
            KeySource::Url(url) => fetch(&url)
                .await
                .map_err(|e| AuthSetupError::Fetch(source.to_owned(), e))?,
        };
        let set: JwkSet = serde_json::from_str(&text)
            .map_err(|e| AuthSetupError::NotJwks(source.to_owned(), e))?;
        let keys: Vec<Key> = set
            .keys
            .iter()
            .filter_map(|jwk| {
                let algorithms = algorithms_for(jwk);
                let key = DecodingKey::from_jwk(jwk).ok()?;
                (!algorithms.is_empty()).then(|| Key {
                    id: jwk.common.key_id.clone(),
                    key,
                    algorithms,
                })
            })
            .collect();
        if keys.is_empty() {
            return Err(AuthSetupError::NoKeys(source.to_owned()));
        }
        Ok(Some(Verifier::Jwt { keys, audience }))
    }

    /// The principal of a request with `headers`.
    ///
    /// Errors: [`Denied`].
    pub fn verify(&self, headers: &HeaderMap) -> Result<Principal, Denied> {
        let value = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .ok_or(Denied::Missing)?;
        let (scheme, token) = value.split_once(' ').ok_or(Denied::Missing)?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(Denied::Missing);
        }
        let token = token.trim();
        if token.is_empty() || token.len() > MAX_TOKEN_BYTES {
            return Err(Denied::Invalid);
        }
        match self {
            Verifier::Static { token: expected } => {
                constant_time_eq(token.as_bytes(), expected.as_bytes())
                    .then(|| Principal(STATIC_PRINCIPAL.to_owned()))
                    .ok_or(Denied::Invalid)
            }
            Verifier::Jwt { keys, audience } => verify_jwt(token, keys, audience),
        }
    }
}

/// Checks a JWT against `keys` (the one its `kid` names, else each) and `audience`.
fn verify_jwt(token: &str, keys: &[Key], audience: &str) -> Result<Principal, Denied> {
    let header = jsonwebtoken::decode_header(token).map_err(|_| Denied::Invalid)?;
    let candidates = keys
        .iter()
        .filter(|k| header.kid.is_none() || k.id == header.kid)
        .filter(|k| k.algorithms.contains(&header.alg));
    for key in candidates {
        let mut validation = Validation::new(header.alg);
        validation.algorithms = key.algorithms.clone();
        validation.set_audience(&[audience]);
        validation.set_required_spec_claims(&["exp", "aud"]);
        if let Ok(data) = jsonwebtoken::decode::<Claims>(token, &key.key, &validation) {
            let claims = data.claims;
            let principal = format!(
                "{}|{}",
                claims.iss.unwrap_or_default(),
                claims.sub.unwrap_or_default()
            );
            return Ok(Principal(principal));
        }
    }
    Err(Denied::Invalid)
}

/// Equality that takes as long whatever the first difference (a static token is a secret).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A file's text, at most [`MAX_KEYS_BYTES`].
fn read_bounded(path: &std::path::Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(MAX_KEYS_BYTES)
        .read_to_string(&mut text)?;
    Ok(text)
}

/// A JWKS document from `url`, at most [`MAX_KEYS_BYTES`].
async fn fetch(url: &str) -> Result<String, reqwest::Error> {
    let response = reqwest::get(url).await?.error_for_status()?;
    let bytes = response.bytes().await?;
    let end = bytes.len().min(MAX_KEYS_BYTES as usize);
    Ok(String::from_utf8_lossy(&bytes[..end]).into_owned())
}

/// This server's URL as a request with `headers` reached it, without a path (scheme from
/// `X-Forwarded-Proto` behind a TLS-terminating balancer, else `http`).
fn base_url(headers: &HeaderMap) -> String {
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("localhost");
    let scheme = match headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
    {
        Some("https") => "https",
        _ => "http",
    };
    format!("{scheme}://{host}")
}

/// The 401 answer: the JSON-RPC error body and `WWW-Authenticate` naming the metadata.
fn unauthorized(denied: Denied, headers: &HeaderMap) -> Response {
    let mut challenge = format!(
        "Bearer resource_metadata=\"{}{METADATA_PATH}\"",
        base_url(headers)
    );
    if denied == Denied::Invalid {
        challenge.push_str(", error=\"invalid_token\"");
    }
    let refusal: Refusal = errors::unauthorized(denied == Denied::Invalid);
    let mut response = refusal.into_response();
    if let Ok(value) = HeaderValue::from_str(&challenge) {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, value);
    }
    response
}

/// The middleware in front of the MCP routes: the request's principal in its extensions, or
/// 401.
pub async fn require(mut req: Request, next: Next, auth: Arc<Auth>) -> Response {
    match auth.verifier.verify(req.headers()) {
        Ok(principal) => {
            req.extensions_mut().insert(principal);
            next.run(req).await
        }
        Err(denied) => unauthorized(denied, req.headers()),
    }
}

/// The protected resource metadata (RFC 9728 §2): this server as the resource, the
/// authorization servers given with `--auth-server`, bearer tokens in the header only.
pub fn metadata_router(authorization_servers: Vec<String>) -> Router {
    Router::new().route(
        METADATA_PATH,
        get(move |headers: HeaderMap| {
            let servers = authorization_servers.clone();
            async move {
                let resource = format!("{}{MCP_PATH}", base_url(&headers));
                Json(json!({
                    "resource": resource,
                    "authorization_servers": servers,
                    "bearer_methods_supported": ["header"],
                }))
            }
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_static_token_is_compared_whole() {
        let v = Verifier::Static {
            token: "secret-token".into(),
        };
        let with = |value: &str| {
            let mut h = HeaderMap::new();
            h.insert(
                header::AUTHORIZATION,
                HeaderValue::from_str(value).expect("ascii"),
            );
            v.verify(&h)
        };
        assert_eq!(
            with("Bearer secret-token"),
            Ok(Principal(STATIC_PRINCIPAL.into()))
        );
        assert_eq!(
            with("bearer secret-token"),
            Ok(Principal(STATIC_PRINCIPAL.into()))
        );
        assert_eq!(with("Bearer secret-toke"), Err(Denied::Invalid));
        assert_eq!(with("Basic secret-token"), Err(Denied::Missing));
        assert_eq!(v.verify(&HeaderMap::new()), Err(Denied::Missing));
    }
}
