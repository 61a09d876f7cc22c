//! The modes of the command line: building the server from options and running it.

use crate::cli::{Cli, Mode};
use crate::packages::cache::Cache;
use crate::packages::index::Fetcher;
use crate::packages::lock::Lockfile;
use crate::packages::resolver::Resolver;
use crate::sandbox::net::NetPolicy;
use crate::sandbox::pool::Pool;
use crate::sandbox::snapshot::Launcher;
use crate::sandbox::worker_main::PYODIDE;
use crate::server::execute::{Executor, Limits};
use crate::server::format::{render, Status};
use crate::server::handler::RunPythonServer;
use crate::server::http::HttpMode;
use anyhow::{anyhow, Context, Result};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

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

fn build(cli: &Cli) -> Result<RunPythonServer> {
    let lock_text = PYODIDE
        .get_file("pyodide-lock.json")
        .and_then(|f| f.contents_utf8())
        .ok_or_else(|| anyhow!("the embedded pyodide-lock.json is missing"))?;
    let lock = Lockfile::parse(lock_text).context("parsing the embedded pyodide-lock.json")?;
    let cache_dir = cli.cache_dir.clone().unwrap_or_else(Cache::default_dir);
    let cache = Cache::new(cache_dir.clone());
    let fetcher = Fetcher::new(cache, cli.offline);
    let resolver = Resolver::new(
        Arc::new(lock),
        fetcher,
        cli.index_url.clone(),
        cli.packages_url.clone(),
    );
    let exe = std::env::current_exe().context("locating our own executable")?;
    let workers = cli.workers.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let mut worker_args = Vec::new();
    if cli.memory > 0 {
        worker_args.push(format!("--wasm-max-mib={}", wasm_budget_mib(cli.memory)));
    }
    let snapshot_path = (!cli.no_snapshot).then(|| {
        cache_dir.join("snapshots").join(format!(
            "pyodide-{}.bin",
            crate::sandbox::worker_main::runtime_fingerprint()
        ))
    });
    let pool = Pool::new(Launcher::new(exe, worker_args, snapshot_path), workers);
    let limits = Limits {
        timeout: (cli.timeout > 0.0).then(|| Duration::from_secs_f64(cli.timeout)),
        output_cap: cli.output_cap,
        memory_limit: (cli.memory > 0).then_some(cli.memory << 20),
        fresh_worker: cli.fresh_worker,
    };
    let deps: Vec<String> = cli
        .deps
        .iter()
        .map(|d| d.trim().to_owned())
        .filter(|d| !d.is_empty())
        .collect();
    let net = NetPolicy::new(cli.allow_net.clone());
    let executor = Executor::new(pool, Arc::new(resolver), limits, deps, net);
    Ok(RunPythonServer {
        executor: Arc::new(executor),
        return_mode: cli.return_mode,
        max_code_bytes: cli.max_code_size,
        log_level: Default::default(),
    })
}

/// MiB of WebAssembly memory allowed under a worker limit of `memory` MiB: what is left after
/// the engine's own ~200 MiB (JavaScriptCore heap, compiled code), at least 64 MiB.
fn wasm_budget_mib(memory: u64) -> u64 {
    memory.saturating_sub(224).max(64)
}

/// Runs the chosen mode; returns the process exit code.
pub async fn run(cli: Cli) -> Result<i32> {
    let server = build(&cli)?;
    let pool = server.executor.pool.clone();
    let code = match cli.mode {
        Mode::Stdio => {
            pool.warm_up();
            tokio::select! {
                r = crate::server::stdio::serve(server) => r?,
                _ = shutdown_signal() => tracing::info!("shutting down"),
            }
            0
        }
        Mode::StreamableHttp | Mode::StreamableHttpStateless | Mode::Sse => {
            pool.warm_up();
            let mode = match cli.mode {
                Mode::StreamableHttp => HttpMode::Stateful,
                Mode::StreamableHttpStateless => HttpMode::Stateless,
                _ => HttpMode::Sse,
            };
            let shutdown = CancellationToken::new();
            let trigger = shutdown.clone();
            tokio::spawn(async move {
                shutdown_signal().await;
                tracing::info!("shutting down");
                trigger.cancel();
            });
            crate::server::http::serve(server, mode, &cli.host, cli.port, shutdown).await?;
            0
        }
        Mode::Warmup => warmup(&server).await,
        Mode::Example => example(&server).await,
    };
    pool.shutdown().await;
    Ok(code)
}

async fn warmup(server: &RunPythonServer) -> i32 {
    let started = Instant::now();
    let executor = &server.executor;
    if let Err(e) = executor.startup_plan().await {
        eprintln!("warmup failed: cannot install --deps: {e}");
        return 1;
    }
    let result = executor
        .run(
            "import sys\nsys.version",
            serde_json::Map::new(),
            Box::new(|_, _| {}),
        )
        .await;
    if result.status != Status::Success {
        eprintln!("warmup failed:\n{}", render(&result, server.return_mode));
        return 1;
    }
    let version = result.return_value.unwrap_or_default();
    println!("Pyodide booted: Python {version}");
    if !executor.startup_deps.is_empty() {
        println!("installed: {}", executor.startup_deps.join(", "));
    }
    println!("warmup done in {:.1} s", started.elapsed().as_secs_f64());
    0
}

async fn example(server: &RunPythonServer) -> i32 {
    println!("Running:\n{EXAMPLE_CODE}");
    let result = server
        .executor
        .run(EXAMPLE_CODE, serde_json::Map::new(), Box::new(|_, _| {}))
        .await;
    println!("Tool result:\n{}", render(&result, server.return_mode));
    if result.status == Status::Success {
        0
    } else {
        1
    }
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
