//! The network policy for user code (DESIGN §9): the front performs `fetch` requests from the
//! sandbox only for hosts named with `--allow-net`; everything else is refused.

use serde::Deserialize;
use serde_json::json;
use std::time::Duration;

/// Largest response body handed to user code (bytes).
const MAX_RESPONSE_BYTES: usize = 64 << 20;

/// Which hosts user code may reach, and the client that reaches them.
#[derive(Clone)]
pub struct NetPolicy {
    allowed: Vec<String>,
    client: reqwest::Client,
}

#[derive(Deserialize)]
struct FetchRequest {
    method: String,
    url: String,
    #[serde(default)]
    headers: Vec<(String, String)>,
}

impl NetPolicy {
    /// A policy allowing `hosts` (`host` for any port, or `host:port`); empty allows nothing.
    pub fn new(hosts: Vec<String>) -> Self {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
        NetPolicy {
            allowed: hosts
                .into_iter()
                .map(|h| h.trim().to_ascii_lowercase())
                .filter(|h| !h.is_empty())
                .collect(),
            client,
        }
    }

    fn allows(&self, url: &reqwest::Url) -> bool {
        let Some(host) = url
            .host_str()
            .map(|h| h.trim_matches(['[', ']']).to_ascii_lowercase())
        else {
            return false;
        };
        let port = url.port_or_known_default().unwrap_or(0);
        self.allowed
            .iter()
            .any(|a| *a == host || *a == format!("{host}:{port}"))
    }

    /// Performs one request from user code; returns the response metadata (or `{error}`) and
    /// the body. Redirects are not followed, so each hop is checked against the policy.
    pub async fn fetch(
        &self,
        request: &serde_json::Value,
        body: Vec<u8>,
    ) -> (serde_json::Value, Vec<u8>) {
        let error = |msg: String| (json!({ "error": msg }), Vec::new());
        let req: FetchRequest = match serde_json::from_value(request.clone()) {
            Ok(r) => r,
            Err(e) => return error(format!("bad request: {e}")),
        };
        let url = match reqwest::Url::parse(&req.url) {
            Ok(u) if u.scheme() == "http" || u.scheme() == "https" => u,
            _ => return error(format!("unsupported URL {}", req.url)),
        };
        if !self.allows(&url) {
            let host = url.host_str().unwrap_or_default().to_owned();
            return error(format!(
                "network access to {host} is not allowed in the sandbox (the server admits hosts named with --allow-net)"
            ));
        }
        let method = match reqwest::Method::from_bytes(req.method.as_bytes()) {
            Ok(m) => m,
            Err(_) => return error(format!("bad method {}", req.method)),
        };
        let mut builder = self.client.request(method, url.clone());
        for (k, v) in &req.headers {
            builder = builder.header(k, v);
        }
        if !body.is_empty() {
            builder = builder.body(body);
        }
        let resp = match builder.send().await {
            Ok(r) => r,
            Err(e) => return error(e.to_string()),
        };
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
        let bytes = match resp.bytes().await {
            Ok(b) if b.len() <= MAX_RESPONSE_BYTES => b.to_vec(),
            Ok(_) => return error(format!("response larger than {MAX_RESPONSE_BYTES} bytes")),
            Err(e) => return error(e.to_string()),
        };
        let meta = json!({
            "status": status.as_u16(),
            "statusText": status.canonical_reason().unwrap_or(""),
            "headers": headers,
            "url": final_url,
            "redirected": false,
        });
        (meta, bytes)
    }
}
