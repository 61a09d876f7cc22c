//! Command line (DESIGN §6).

use crate::server::format::ReturnMode;
use clap::{Parser, ValueEnum};
use std::path::PathBuf;

/// The default Pyodide packages URL: the Pyodide CDN for the pinned version.
pub const DEFAULT_PACKAGES_URL: &str = "https://cdn.jsdelivr.net/pyodide/v314.0.7/full/";

/// MCP server that runs Python code in a sandbox: Pyodide 314 (CPython 3.14 in WebAssembly)
/// inside an embedded JavaScriptCore, one worker process per interpreter.
#[derive(Debug, Parser)]
#[command(name = "mcp-run-python", version)]
pub struct Cli {
    /// What to run.
    #[arg(value_enum)]
    pub mode: Mode,

    /// Port for the HTTP modes.
    #[arg(long, default_value_t = 3001)]
    pub port: u16,

    /// Address to listen on for the HTTP modes.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,

    /// Requirements installed once into every worker before its first call (comma-separated,
    /// PEP 508, e.g. `numpy,rich<13`).
    #[arg(long, value_delimiter = ',')]
    pub deps: Vec<String>,

    /// Result format of the tool: XML sections or one JSON object.
    #[arg(long, value_enum, default_value_t = ReturnMode::Xml)]
    pub return_mode: ReturnMode,

    /// Time limit for running one call's code, in seconds (0 = no limit). Installs do not count.
    #[arg(long, default_value_t = 60.0)]
    pub timeout: f64,

    /// Number of sandbox worker processes (default: the number of CPU cores).
    #[arg(long)]
    pub workers: Option<usize>,

    /// Memory per worker in MiB (0 = no limit). WebAssembly memory stops growing below it (so
    /// Python raises MemoryError), and a worker whose resident memory passes it is killed.
    #[arg(long, default_value_t = 2048)]
    pub memory: u64,

    /// Give every call a new interpreter: the worker is replaced after each call.
    #[arg(long)]
    pub fresh_worker: bool,

    /// Hosts user code may reach over HTTP(S) with `pyodide.http.pyfetch` or `open_url`
    /// (comma-separated `host` or `host:port`); none by default. Package downloads by the
    /// server itself are not affected.
    #[arg(long, value_delimiter = ',')]
    pub allow_net: Vec<String>,

    /// Most output kept per call, in bytes; more is cut with a marker line.
    #[arg(long, default_value_t = 1 << 20)]
    pub output_cap: usize,

    /// Largest `python_code` accepted, in bytes; larger calls get an MCP error.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_code_size: usize,

    /// Where Pyodide's own packages (the lock file's wheels) are downloaded from.
    #[arg(long, default_value = DEFAULT_PACKAGES_URL)]
    pub packages_url: String,

    /// PyPI JSON API base URL for packages that Pyodide does not ship.
    #[arg(long, default_value = crate::packages::index::DEFAULT_INDEX_URL)]
    pub index_url: String,

    /// Download cache directory [default: the user cache dir + `mcp-run-python`].
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,

    /// Always boot workers plainly: no Pyodide memory snapshot is made or restored (by default
    /// one is kept in the cache directory, which makes later boots several times faster).
    #[arg(long)]
    pub no_snapshot: bool,

    /// Never use the network for packages: install only what the cache holds.
    #[arg(long)]
    pub offline: bool,
}

/// Modes, named as in the Deno original.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Serve MCP over stdin/stdout (for `MCPServerStdio`).
    Stdio,
    /// Serve streamable HTTP with sessions at `http://HOST:PORT/mcp` (for `MCPServerStreamableHTTP`).
    #[value(name = "streamable_http")]
    StreamableHttp,
    /// Serve streamable HTTP without sessions at `http://HOST:PORT/mcp`.
    #[value(name = "streamable_http_stateless")]
    StreamableHttpStateless,
    /// Serve the legacy HTTP+SSE transport at `http://HOST:PORT/sse` (for `MCPServerSSE`).
    Sse,
    /// Boot Pyodide, install `--deps`, run a tiny script, report and exit (health check).
    Warmup,
    /// Run an example script that needs a package from PyPI and print the tool result.
    Example,
}
