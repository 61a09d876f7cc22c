//! A `--stateful` sandbox's files as MCP resources (files, README "Sandboxes", sandboxes, docs/architecture.md §3.1; MCP spec, server
//! features, resources): the regular files under its interpreter's working directory, named
//! `sandbox://{sandbox_id}/{path}`, where `path` is relative to the working directory,
//! percent-encoded per segment (RFC 3986). The URI carries the sandbox's handle, so that any
//! client holding the handle may read it, with or without a session (SEP-2567). A path that
//! leaves the directory names nothing.

use base64::Engine as _;
use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use rmcp::model::{Resource, ResourceContents, ResourceTemplate};

/// The URI scheme of a sandbox's files.
const SCHEME: &str = "sandbox://";

/// What stays unescaped in a path: RFC 3986's unreserved characters, and `/` between segments.
const PATH: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

use crate::sandbox::files::checked_name;

/// The URI of file `path` of sandbox `sandbox` (its handle).
pub fn uri(sandbox: &str, path: &str) -> String {
    format!("{SCHEME}{sandbox}/{}", utf8_percent_encode(path, PATH))
}

/// The resource for file `path` (`size` bytes) of sandbox `sandbox`, its MIME type guessed from
/// its name.
pub fn describe(sandbox: &str, path: &str, size: u64) -> Resource {
    Resource::new(uri(sandbox, path), path)
        .with_mime_type(mime_type(path))
        .with_size(size)
}

/// The media type of code mode's `mcp_tools.pyi`.
pub const STUB_MIME_TYPE: &str = "text/x-python";

/// Code mode's `mcp_tools.pyi` (`upstream::catalog::STUB_URI`): every MCP tool the code can
/// call, with its signature and docstring.
pub fn code_mode_stub() -> Resource {
    Resource::new(crate::code_mode::catalog::STUB_URI, "mcp_tools.pyi")
        .with_description("The MCP tools that run_python_code's code can call (`import mcp_tools`), as a Python type stub")
        .with_mime_type(STUB_MIME_TYPE)
}

/// The template that describes the URIs (RFC 6570: `{+path}` keeps its slashes).
pub fn template() -> ResourceTemplate {
    ResourceTemplate::new(format!("{SCHEME}{{sandbox_id}}/{{+path}}"), "sandbox-file")
        .with_title("A file in a sandbox's working directory")
        .with_description(
            "Files in a sandbox's working directory (its code's current directory, \
             /home/pyodide); `sandbox_id` is the sandbox's handle, as results and \
             create_sandbox name it, and `path` the file's path relative to that directory.",
        )
}

/// The sandbox handle (as written, unchecked) and the path that `uri` names, or `None`: not
/// this scheme, no path, a path not UTF-8 once decoded, empty, absolute, with `.`/`..`
/// segments or NUL, too long.
pub fn parse(uri: &str) -> Option<(&str, String)> {
    let (sandbox, rest) = uri.strip_prefix(SCHEME)?.split_once('/')?;
    let path = percent_decode_str(rest).decode_utf8().ok()?;
    checked_name(&path).ok().map(|p| (sandbox, p.to_owned()))
}

/// The MIME type of `path`, from its name (`application/octet-stream` when unknown).
fn mime_type(path: &str) -> String {
    mime_guess::from_path(path)
        .first_or_octet_stream()
        .essence_str()
        .to_owned()
}

/// A file's contents for `resources/read`: text when the type is textual and the bytes are
/// UTF-8, otherwise a base64 blob.
pub fn contents(uri: &str, path: &str, bytes: Vec<u8>) -> ResourceContents {
    let mime = mime_type(path);
    let textual = mime.starts_with("text/")
        || matches!(
            mime.as_str(),
            "application/json" | "application/xml" | "application/javascript" | "image/svg+xml"
        );
    if textual {
        if let Ok(text) = String::from_utf8(bytes.clone()) {
            return ResourceContents::text(text, uri).with_mime_type(mime);
        }
    }
    let blob = base64::engine::general_purpose::STANDARD.encode(&bytes);
    ResourceContents::blob(blob, uri).with_mime_type(mime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_name_a_sandbox_and_a_path_inside_it() {
        let u = uri("sbx_abc", "data/my file.csv");
        assert_eq!(u, "sandbox://sbx_abc/data/my%20file.csv");
        assert_eq!(parse(&u), Some(("sbx_abc", "data/my file.csv".to_owned())));
        assert_eq!(parse("sandbox://sbx_abc/../etc/passwd"), None);
        assert_eq!(parse("sandbox://sbx_abc/%2e%2e/x"), None);
        assert_eq!(parse("sandbox://sbx_abc//etc"), None);
        assert_eq!(parse("sandbox://sbx_abc/a%00b"), None);
        assert_eq!(parse("sandbox://sbx_abc"), None);
        assert_eq!(parse("file:///abc/x"), None);
    }

    #[test]
    fn text_is_text_and_the_rest_is_a_blob() {
        let ResourceContents::TextResourceContents {
            text, mime_type, ..
        } = contents("u", "a.csv", b"x,y\n1,2\n".to_vec())
        else {
            panic!("a CSV is text");
        };
        assert_eq!(text, "x,y\n1,2\n");
        assert_eq!(mime_type.as_deref(), Some("text/csv"));
        assert!(matches!(
            contents("u", "a.png", vec![0x89, b'P']),
            ResourceContents::BlobResourceContents { .. }
        ));
        assert!(matches!(
            contents("u", "a.txt", vec![0xff, 0xfe]),
            ResourceContents::BlobResourceContents { .. }
        ));
    }
}
