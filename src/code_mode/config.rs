//! `--tools-config FILE`: the upstream MCP servers of code mode, in the `mcpServers` JSON format
//! MCP clients already use (Claude Desktop, VS Code, Cursor), read once at start (code mode, docs/architecture.md §11).
//!
//! ```json
//! {"mcpServers": {
//!   "everything": {"command": "npx", "args": ["@modelcontextprotocol/server-everything"],
//!                  "env": {"KEY": "…"}, "allowedTools": ["get-sum", "echo"]},
//!   "search": {"url": "https://…/mcp", "headers": {"Authorization": "Bearer …"}}
//! }}
//! ```
//!
//! A server has either `command` (stdio) or `url` (streamable HTTP). `allowedTools` (globs:
//! `*`, `?`, `[…]`) keeps only the tools it matches; without it every tool is kept. Unknown
//! fields are refused, so that a misspelt `allowedTools` cannot silently allow everything; the
//! fields other clients write for the same purpose (`type`, `disabled`, `cwd`) are understood.
//! The env and headers hold credentials: they stay in the front (docs/architecture.md §8).

use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Largest `--tools-config` file read (bytes).
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Most upstream servers one configuration names.
pub const MAX_SERVERS: usize = 64;

/// Why `--tools-config` cannot be used; each names the file, and the server when it is one's.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--tools-config {path}: cannot read it")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--tools-config {path}: it has more than {MAX_CONFIG_BYTES} bytes")]
    TooLarge { path: PathBuf },
    #[error("--tools-config {path}: not an {{\"mcpServers\": {{…}}}} document")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("--tools-config {path}: more than {MAX_SERVERS} servers")]
    TooMany { path: PathBuf },
    #[error("--tools-config {path}: server {server:?}: {why}")]
    Server {
        path: PathBuf,
        server: String,
        why: &'static str,
    },
    #[error("--tools-config {path}: server {server:?}: allowedTools pattern {pattern:?}")]
    Pattern {
        path: PathBuf,
        server: String,
        pattern: String,
        #[source]
        source: glob::PatternError,
    },
}

/// The document as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Document {
    mcp_servers: BTreeMap<String, Entry>,
}

/// One server as written; checked into a [`ServerConfig`].
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Entry {
    /// `stdio`, `http` or `streamable-http` (VS Code's spelling); inferred when absent.
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    cwd: Option<PathBuf>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    allowed_tools: Option<Vec<String>>,
    #[serde(default)]
    disabled: bool,
}

/// How the front reaches one upstream server.
#[derive(Clone)]
pub enum Transport {
    /// A child process speaking MCP on its stdin and stdout: `command args…`, with the front's
    /// environment plus `env`, in `cwd` when given.
    Stdio {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: Option<PathBuf>,
    },
    /// Streamable HTTP at `url`, every request carrying `headers`.
    Http {
        url: String,
        headers: BTreeMap<String, String>,
    },
}

/// What a log line or an error may say of a transport: never the env or the headers' values.
impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Transport::Stdio { command, env, .. } => f
                .debug_struct("Stdio")
                .field("command", command)
                .field("env", &env.keys().collect::<Vec<_>>())
                .finish_non_exhaustive(),
            Transport::Http { url, headers } => f
                .debug_struct("Http")
                .field("url", url)
                .field("headers", &headers.keys().collect::<Vec<_>>())
                .finish(),
        }
    }
}

/// One upstream server: its name (the configuration's key), how to reach it, and which of its
/// tools the sandbox may call.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub name: String,
    pub transport: Transport,
    /// `allowedTools`; `None`: all of them.
    pub allowed: Option<Vec<glob::Pattern>>,
}

impl ServerConfig {
    /// Whether tool `name` is on this server's allowlist (every tool is, without one).
    pub fn allows(&self, name: &str) -> bool {
        self.allowed
            .as_ref()
            .is_none_or(|patterns| patterns.iter().any(|p| p.matches(name)))
    }
}

/// Reads `--tools-config`: the servers not `disabled`, in name order.
///
/// Errors: [`ConfigError`] for a file that cannot be read, is over 1 MiB, is not the format,
/// or names a server without exactly one of `command` and `url` or with a bad pattern.
pub fn load(path: &Path) -> Result<Vec<ServerConfig>, ConfigError> {
    let read = |source| ConfigError::Read {
        path: path.to_owned(),
        source,
    };
    let size = std::fs::metadata(path).map_err(read)?.len();
    if size > MAX_CONFIG_BYTES {
        return Err(ConfigError::TooLarge {
            path: path.to_owned(),
        });
    }
    let text = std::fs::read(path).map_err(read)?;
    parse(path, &text)
}

/// [`load`]'s parsing of the file's bytes (`path` names it in errors).
fn parse(path: &Path, text: &[u8]) -> Result<Vec<ServerConfig>, ConfigError> {
    let document: Document = serde_json::from_slice(text).map_err(|source| ConfigError::Parse {
        path: path.to_owned(),
        source,
    })?;
    if document.mcp_servers.len() > MAX_SERVERS {
        return Err(ConfigError::TooMany {
            path: path.to_owned(),
        });
    }
    let mut servers = Vec::new();
    for (name, entry) in document.mcp_servers {
        if entry.disabled {
            continue;
        }
        servers.push(check(path, name, entry)?);
    }
    Ok(servers)
}

/// One entry checked: exactly one transport, a `type` that agrees, patterns that compile.
fn check(path: &Path, name: String, entry: Entry) -> Result<ServerConfig, ConfigError> {
    let refuse = |why| ConfigError::Server {
        path: path.to_owned(),
        server: name.clone(),
        why,
    };
    if name.is_empty() {
        return Err(refuse("a server needs a name"));
    }
    let transport = match (entry.command, entry.url, entry.kind.as_deref()) {
        (Some(_), Some(_), _) => return Err(refuse("give `command` or `url`, not both")),
        (None, None, _) => return Err(refuse("give `command` (stdio) or `url` (streamable HTTP)")),
        (Some(command), None, None | Some("stdio")) => {
            if !entry.headers.is_empty() {
                return Err(refuse("`headers` are for a `url` server"));
            }
            Transport::Stdio {
                command,
                args: entry.args,
                env: entry.env,
                cwd: entry.cwd,
            }
        }
        (None, Some(url), None | Some("http" | "streamable-http" | "streamableHttp")) => {
            if !entry.env.is_empty() || !entry.args.is_empty() || entry.cwd.is_some() {
                return Err(refuse("`env`, `args` and `cwd` are for a `command` server"));
            }
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(refuse("`url` must be an http:// or https:// URL"));
            }
            Transport::Http {
                url,
                headers: entry.headers,
            }
        }
        (_, _, Some("sse")) => {
            return Err(refuse(
                "the deprecated SSE transport is not supported; use streamable HTTP",
            ))
        }
        _ => return Err(refuse("`type` does not match `command` or `url`")),
    };
    let allowed = match entry.allowed_tools {
        None => None,
        Some(patterns) => Some(
            patterns
                .into_iter()
                .map(|pattern| {
                    glob::Pattern::new(&pattern).map_err(|source| ConfigError::Pattern {
                        path: path.to_owned(),
                        server: name.clone(),
                        pattern,
                        source,
                    })
                })
                .collect::<Result<_, _>>()?,
        ),
    };
    Ok(ServerConfig {
        name,
        transport,
        allowed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(json: &str) -> Result<Vec<ServerConfig>, ConfigError> {
        parse(Path::new("tools.json"), json.as_bytes())
    }

    #[test]
    fn both_transports_and_the_allowlist() {
        let servers = parsed(
            r#"{"mcpServers": {
                "b": {"url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": "Bearer t"}},
                "a": {"command": "node", "args": ["x.js"], "env": {"K": "v"}, "allowedTools": ["get-sum", "search_*"]},
                "off": {"command": "x", "disabled": true}
            }}"#,
        )
        .unwrap();
        assert_eq!(servers.len(), 2);
        assert_eq!(servers[0].name, "a");
        assert!(
            matches!(servers[0].transport, Transport::Stdio { ref args, .. } if args == &["x.js"])
        );
        assert!(servers[0].allows("get-sum") && servers[0].allows("search_web"));
        assert!(!servers[0].allows("get-env") && !servers[0].allows("xsearch_"));
        assert!(matches!(servers[1].transport, Transport::Http { .. }));
        assert!(servers[1].allows("anything"));
    }

    #[test]
    fn credentials_are_not_shown_in_debug_output() {
        let servers = parsed(
            r#"{"mcpServers": {"s": {"url": "http://h/mcp", "headers": {"Authorization": "Bearer SECRET"}}, "t": {"command": "x", "env": {"TOKEN": "SECRET"}}}}"#,
        )
        .unwrap();
        let shown = format!("{servers:?}");
        assert!(!shown.contains("SECRET"), "{shown}");
        assert!(shown.contains("Authorization") && shown.contains("TOKEN"));
    }

    #[test]
    fn mistakes_are_refused_with_the_server_named() {
        for bad in [
            r#"{"mcpServers": {"s": {}}}"#,
            r#"{"mcpServers": {"s": {"command": "x", "url": "http://h"}}}"#,
            r#"{"mcpServers": {"s": {"command": "x", "allowedtools": ["a"]}}}"#,
            r#"{"mcpServers": {"s": {"url": "ftp://h"}}}"#,
            r#"{"mcpServers": {"s": {"url": "http://h", "type": "sse"}}}"#,
            r#"{"mcpServers": {"s": {"command": "x", "allowedTools": ["[a"]}}}"#,
            r#"{"servers": {}}"#,
        ] {
            assert!(parsed(bad).is_err(), "{bad}");
        }
    }
}
