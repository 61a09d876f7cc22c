//! An HTTP request of user code and its answer, as the interpreter hands it to the front and
//! the front answers (`src/worker/net.rs` holds the policy that makes the request). On the
//! JavaScript side (`runtime/js/fetch.js`) they are `{method, url, headers}` in and `{status,
//! statusText, headers, url, redirected}` or `{error}` out.

use serde::{Deserialize, Serialize};

/// One HTTP request from user code: `{method, url, headers}` as `runtime/js/fetch.js` sends it; the
/// body travels beside it as bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FetchRequest {
    /// The HTTP method, e.g. `GET`.
    pub method: String,
    /// An absolute `http` or `https` URL.
    pub url: String,
    /// Header name and value pairs, in order.
    #[serde(default)]
    pub headers: Vec<(String, String)>,
}

/// The answer to a [`FetchRequest`], as `runtime/js/fetch.js` reads it: the response's metadata (the
/// body travels beside it as bytes), or why there is none. Serialized untagged, so JavaScript
/// sees `{status, statusText, headers, url, redirected}` or `{error}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged, deny_unknown_fields)]
pub enum FetchResponse {
    /// A response was received (whatever its status).
    #[serde(rename_all = "camelCase")]
    Ok {
        /// HTTP status code.
        status: u16,
        /// The status's canonical reason phrase (`OK`), empty when it has none.
        status_text: String,
        /// Response header name (lower case) and value pairs, in order.
        headers: Vec<(String, String)>,
        /// The URL that answered.
        url: String,
        /// Always `false`: redirects are not followed (each hop is checked against the
        /// policy by user code's next request).
        redirected: bool,
    },
    /// No response; JavaScript raises a network error with this text (never empty).
    Error {
        /// What went wrong, for the user.
        error: String,
    },
}
