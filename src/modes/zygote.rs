//! Wiring the per-host zygote service (`src/worker/zygote_service/`) from the command line:
//! which zygote a front forks from, the options that key a service, the service's own mode
//! (`zygote-service`, started by a front), and `mcp-run-python zygote status|stop`.

use super::{resolver, snapshot_path, worker_args};
use crate::cli::{Mode, Serve, ZygoteCommand};
use crate::packages::cache::Cache;
use crate::server::call::queue::Isolation;
use crate::server::call::startup_deps;
use crate::worker::launcher::{Launcher, ZygoteSource};
use crate::worker::mount::Mounts;
use crate::worker::zygote_service::front::ServiceSpec;
use crate::worker::zygote_service::operator::{self, Seen};
use crate::worker::zygote_service::place::{ServiceKey, ServicePlace};
use crate::worker::zygote_service::service::{self, ServiceOptions};
use anyhow::{Context, Result};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Where this front's workers are forked from, if anywhere (`--no-zygote`: nowhere).
///
/// - the service mode forks from a zygote of its own;
/// - by default every serving mode forks from the host's service, unless its place cannot be
///   used (logged once): then as with `--no-shared-zygote`;
/// - `--no-shared-zygote`: the HTTP modes and `--isolation call`, which need a new interpreter
///   per session or per call, keep a zygote of their own; stdio keeps one interpreter for its
///   one session and boots it. `warmup` and `example` are one-shot checks and never start a
///   service that would outlive them.
pub fn source(cli: &Serve, isolation: Isolation, mounts: &Mounts) -> Option<ZygoteSource> {
    if cli.startup.no_zygote {
        return None;
    }
    let one_shot = matches!(cli.mode, Mode::Warmup | Mode::Example);
    let own = isolation == Isolation::Call || !matches!(cli.mode, Mode::Stdio) && !one_shot;
    let own = own.then_some(ZygoteSource::Own);
    if cli.mode == Mode::ZygoteService {
        return Some(ZygoteSource::Own);
    }
    if cli.startup.no_shared_zygote || one_shot {
        return own;
    }
    let spec = spec(cli, mounts);
    match spec.place.prepare() {
        Ok(()) => Some(ZygoteSource::Shared(spec)),
        Err(e) => {
            tracing::warn!("not using a zygote service: {e}");
            own
        }
    }
}

/// Where forked scientific workers come from (`--runtime scientific`): a zygote of this
/// process's own (the per-host service forks only Pyodide) for the HTTP modes and
/// `--isolation call`, and over stdio with `--stateful`, whose sandboxes are checkpointed,
/// forked and hibernated only from forked workers (docs/architecture.md §3.4); not for one
/// plain session over stdio or a one-shot mode; none with `--no-zygote`.
pub fn scientific_source(cli: &Serve, isolation: Isolation) -> Option<ZygoteSource> {
    let one_shot = matches!(cli.mode, Mode::Warmup | Mode::Example);
    let stdio_state = matches!(cli.mode, Mode::Stdio) && cli.options.sandboxes.stateful;
    let forks = isolation == Isolation::Call
        || stdio_state
        || !matches!(cli.mode, Mode::Stdio) && !one_shot;
    (forks && !cli.startup.no_zygote).then_some(ZygoteSource::Own)
}

/// The options that shape an interpreter, as arguments in a fixed order: their digest keys a
/// service. Options that only the front applies (time limits, caps, transports, the tool set)
/// are left out, so that fronts differing in them share a service; the network policy is kept
/// in, although the front applies it, so that a service never serves fronts of two policies
/// should workers ever apply it themselves. The cache directory is left out too: it holds files
/// named by their digests (the snapshot by the runtime's), which are the same in any cache.
fn shaping_args(cli: &Serve) -> Vec<String> {
    let mut args = vec![
        format!("--confinement={}", cli.confinement.confinement.name()),
        format!("--memory={}", cli.limits.memory),
        format!("--max-mount-bytes={}", cli.files.max_mount_bytes),
        format!("--packages-url={}", cli.packages.packages_url),
        format!("--index-url={}", cli.packages.index_url),
    ];
    args.extend(super::deps(cli).iter().map(|d| format!("--deps={d}")));
    args.extend(cli.files.mount.iter().map(|m| {
        let host = std::fs::canonicalize(&m.host).unwrap_or_else(|_| m.host.clone());
        format!("--mount={}:{}", host.display(), m.sandbox)
    }));
    args.extend(
        cli.confinement
            .allow_net
            .iter()
            .map(|h| format!("--allow-net={h}")),
    );
    for (on, flag) in [
        (cli.packages.offline, "--offline"),
        (cli.startup.no_snapshot, "--no-snapshot"),
        (cli.confinement.disable_networking, "--disable-networking"),
    ] {
        if on {
            args.push(flag.to_owned());
        }
    }
    args
}

/// The cache directory of the options.
fn cache_dir(option: &Option<PathBuf>) -> PathBuf {
    option.clone().unwrap_or_else(Cache::default_dir)
}

/// The key of this front's service, and how to reach or start it.
fn spec(cli: &Serve, mounts: &Mounts) -> ServiceSpec {
    let shaping = shaping_args(cli);
    let runtime = crate::assets::runtime_fingerprint();
    let key = ServiceKey::new(&runtime, &shaping, &mounts.bytes);
    let place = match &cli.startup.zygote_socket {
        Some(socket) => ServicePlace::at(socket.clone()),
        None => ServicePlace::in_dir(
            &ServicePlace::default_dir(&cache_dir(&cli.packages.cache_dir)),
            &key,
        ),
    };
    let mut args = shaping;
    if let Some(dir) = &cli.packages.cache_dir {
        args.push(format!("--cache-dir={}", dir.display()));
    }
    args.push(format!("--zygote-socket={}", place.socket.display()));
    args.push(format!(
        "--zygote-idle-exit={}",
        cli.startup.zygote_idle_exit
    ));
    if cli.verbose {
        args.push("--verbose".to_owned());
    }
    args.push("zygote-service".to_owned());
    ServiceSpec {
        place,
        key,
        exe: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/proc/self/exe")),
        args,
    }
}

/// The `zygote-service` mode: takes the service's lock (another process holding it means a
/// service of this key runs or starts: this one ends at once, status 0), then serves until
/// idle, stopped, or its zygote is lost.
///
/// Errors: the options are unusable (packages, mounts), or the socket cannot be bound.
pub async fn serve(cli: &Serve) -> Result<i32> {
    let mounts = Mounts::load(&cli.files.mount, cli.files.max_mount_bytes).context("--mount")?;
    let spec = spec(cli, &mounts);
    spec.place.prepare()?;
    let Some(lock) = service::take_lock(&spec.place)? else {
        tracing::info!(
            "another zygote service holds {}: not starting a second one",
            spec.place.lock.display()
        );
        return Ok(0);
    };
    let (resolver, _) = resolver(&cli.packages)?;
    let deps = super::deps(cli);
    let startup_plan = startup_deps::startup_plan(Arc::new(resolver), deps.clone());
    let launcher = Launcher::new(
        spec.exe.clone(),
        worker_args(cli),
        snapshot_path(cli),
        Some(ZygoteSource::Own),
        mounts,
        startup_deps::preinstall_source(&startup_plan, &deps),
    );
    let options = ServiceOptions {
        place: spec.place,
        key: spec.key,
        idle_exit: Duration::from_secs(cli.startup.zygote_idle_exit),
    };
    service::serve(options, lock, launcher.own_zygote()).await?;
    Ok(0)
}

/// `mcp-run-python zygote status|stop`; the exit status.
pub fn operate(command: ZygoteCommand) -> i32 {
    let (ZygoteCommand::Status(at) | ZygoteCommand::Stop(at)) = &command;
    let dirs = ServicePlace::default_dirs(&cache_dir(&at.cache_dir));
    let places = operator::places(at.zygote_socket.as_deref(), &dirs);
    let dir = dirs
        .first()
        .map(|d| d.display().to_string())
        .unwrap_or_default();
    match command {
        ZygoteCommand::Status(_) => status(&places, &dir),
        ZygoteCommand::Stop(_) => stop(&places, &dir),
    }
}

/// Prints one line per service; 0 when one runs, 1 when none does.
fn status(places: &[ServicePlace], dir: &str) -> i32 {
    let mut live = 0;
    for place in places {
        let socket = place.socket.display();
        match operator::status(place) {
            Seen::Live {
                digest,
                pid,
                status,
            } => {
                live += 1;
                let short = &digest[..digest.len().min(16)];
                let readiness = if status.ready { "ready" } else { "warming up" };
                println!(
                    "{socket}: pid {pid}, {readiness}, {} fronts, {} workers, up {} s, ends after {} s without fronts, digest {short}",
                    status.fronts, status.workers, status.uptime_s, status.idle_exit_s
                );
            }
            Seen::Stale => println!("{socket}: stale (no service answers)"),
            Seen::Broken(e) => println!("{socket}: not a zygote service ({e})"),
        }
    }
    if live == 0 {
        println!("no zygote service is running in {dir}");
        return 1;
    }
    0
}

/// Stops every service; 0 unless one did not stop.
fn stop(places: &[ServicePlace], dir: &str) -> i32 {
    let mut code = 0;
    let mut stopped = 0;
    for place in places {
        match operator::stop(place) {
            Ok(Some(pid)) => {
                stopped += 1;
                println!(
                    "stopped the zygote service at {} (pid {pid})",
                    place.socket.display()
                );
            }
            Ok(None) => {}
            Err(e) => {
                eprintln!("error: {}: {e}", place.socket.display());
                code = 1;
            }
        }
    }
    if stopped == 0 && code == 0 {
        println!("no zygote service is running in {dir}");
    }
    code
}
