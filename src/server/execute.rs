//! One tool call from start to end: find the requirements, install them into a worker, run the
//! code there under the call's time limit, and collect the result. Every path ends in a
//! [`CallResult`]; nothing here returns an error to the client.

use super::format::{CallResult, Status};
use crate::packages::pep723::script_dependencies;
use crate::packages::resolver::{Planned, Resolver, Source};
use crate::sandbox::net::NetPolicy;
use crate::sandbox::pool::{Lease, Pool};
use crate::sandbox::protocol::Stream;
use crate::sandbox::worker::WorkerError;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OnceCell;

/// Per-call limits.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Wall-clock limit for running the code (installs excluded); `None` means no limit.
    pub timeout: Option<Duration>,
    /// Most output bytes kept per call.
    pub output_cap: usize,
    /// Resident memory a worker may use (bytes); above it the worker is killed.
    pub memory_limit: Option<u64>,
    /// Replace the worker after every call (a new interpreter per call).
    pub fresh_worker: bool,
}

/// How often a running call's worker memory is checked.
const MEMORY_POLL: Duration = Duration::from_millis(25);

/// Runs calls on the worker pool.
pub struct Executor {
    pub pool: Arc<Pool>,
    pub resolver: Arc<Resolver>,
    pub limits: Limits,
    /// `--deps`: installed into every worker before its first call.
    pub startup_deps: Vec<String>,
    /// Which hosts user code may reach (`--allow-net`).
    pub net: NetPolicy,
    startup_plan: OnceCell<Result<Vec<Planned>, String>>,
}

/// Receives each output line while the code runs (for streaming to the client).
pub type OutputSink = Box<dyn FnMut(Stream, &str) + Send>;

impl Executor {
    /// An executor over `pool` and `resolver`.
    pub fn new(
        pool: Arc<Pool>,
        resolver: Arc<Resolver>,
        limits: Limits,
        startup_deps: Vec<String>,
        net: NetPolicy,
    ) -> Self {
        Executor {
            net,
            pool,
            resolver,
            limits,
            startup_deps,
            startup_plan: OnceCell::new(),
        }
    }

    /// Resolves `--deps` once (downloads them into the cache); errors name the package.
    pub async fn startup_plan(&self) -> Result<Vec<Planned>, String> {
        self.startup_plan
            .get_or_init(|| async {
                if self.startup_deps.is_empty() {
                    return Ok(Vec::new());
                }
                self.resolver
                    .resolve(&self.startup_deps)
                    .await
                    .map_err(|e| e.to_string())
            })
            .await
            .clone()
    }

    /// Runs one call of `run_python_code`.
    pub async fn run(
        &self,
        code: &str,
        globals: serde_json::Map<String, serde_json::Value>,
        mut on_output: OutputSink,
    ) -> CallResult {
        let mut result = CallResult {
            status: Status::Success,
            dependencies: Vec::new(),
            output: Vec::new(),
            return_value: None,
            return_is_json: false,
            error: None,
        };
        let declared = match script_dependencies(code) {
            Ok(d) => d,
            Err(e) => return install_error(result, format!("invalid script metadata: {e}")),
        };
        let mut lease = match self.pool.acquire().await {
            Ok(l) => l,
            Err(e) => return run_error(result, e.to_string()),
        };
        let requirements = match declared {
            Some(deps) => deps,
            None => match lease.worker().find_imports(code).await {
                Ok(names) => names.iter().map(|n| self.package_for_import(n)).collect(),
                Err(e) => return self.fail(lease, result, e).await,
            },
        };
        result.dependencies = requirements.clone();

        if let Err(e) = self.install(&mut lease, &requirements).await {
            return match e {
                InstallFailure::Install(msg) => install_error(result, msg),
                InstallFailure::Worker(e) => self.fail(lease, result, e).await,
            };
        }

        let mut output = Vec::new();
        let mut collect = |stream: Stream, line: String| {
            on_output(stream, &line);
            output.push(line);
        };
        let pid = lease.worker().pid();
        let run = lease.worker().run(
            code,
            globals,
            self.limits.output_cap,
            &self.net,
            &mut collect,
        );
        let watch = watch_memory(pid, self.limits.memory_limit);
        let limited = async {
            tokio::select! {
                r = run => Ok(r),
                used = watch => Err(used),
            }
        };
        let outcome = match self.limits.timeout {
            Some(limit) => match tokio::time::timeout(limit, limited).await {
                Ok(r) => r,
                Err(_) => {
                    result.output = output;
                    lease.discard().await;
                    return run_error(
                        result,
                        format!(
                            "TimeoutError: the code timed out after {} s",
                            limit.as_secs_f64()
                        ),
                    );
                }
            },
            None => limited.await,
        };
        result.output = output;
        let outcome = match outcome {
            Ok(o) => o,
            Err(used) => {
                lease.discard().await;
                let limit = self.limits.memory_limit.unwrap_or_default() >> 20;
                return run_error(
                    result,
                    format!(
                        "MemoryError: the worker exceeded its memory limit of {limit} MiB (it used {} MiB) and was stopped",
                        used >> 20
                    ),
                );
            }
        };
        match outcome {
            Ok(o) => {
                if o.status == "success" {
                    result.return_is_json = o.return_kind.as_deref() == Some("json");
                    result.return_value = o.return_value;
                } else {
                    result.status = Status::RunError;
                    result.error = o.error;
                }
                // WebAssembly memory never shrinks: a worker that grew past the limit, or one
                // whose interpreter ended, is replaced before the next call.
                let over = self.limits.memory_limit.is_some_and(|max| {
                    lease.worker().resident_bytes().is_some_and(|rss| rss > max)
                });
                if o.fatal || over || self.limits.fresh_worker {
                    lease.discard().await;
                }
                result
            }
            Err(e) => self.fail(lease, result, e).await,
        }
    }

    /// Package that provides `import_name`: the lock file's mapping, else the same name.
    fn package_for_import(&self, import_name: &str) -> String {
        match self.resolver.lock().package_for_import(import_name) {
            Some(pkg) => pkg.name.clone(),
            None => import_name.to_owned(),
        }
    }

    async fn install(
        &self,
        lease: &mut Lease,
        requirements: &[String],
    ) -> Result<(), InstallFailure> {
        let mut plan = self
            .startup_plan()
            .await
            .map_err(|e| InstallFailure::Install(format!("error installing --deps: {e}")))?;
        if !requirements.is_empty() {
            let more = self
                .resolver
                .resolve(requirements)
                .await
                .map_err(|e| InstallFailure::Install(e.to_string()))?;
            plan.extend(more);
        }
        let worker = lease.worker();
        let todo: Vec<&Planned> = plan
            .iter()
            .filter(|p| !worker.installed.contains(&p.name))
            .collect();
        if todo.is_empty() {
            return Ok(());
        }
        let mut files = Vec::new();
        let mut items = Vec::new();
        for p in &todo {
            match p.source {
                // Lock packages load by name so Pyodide applies its own lock metadata; in its
                // "shell" runtime it reads them by bare file name (no base URL is applied).
                Source::Lock => {
                    files.push((p.file_name.clone(), p.bytes.as_ref().clone()));
                    items.push(p.name.clone());
                }
                Source::Wheel => {
                    let path = format!("/packages/{}", p.file_name);
                    files.push((path.clone(), p.bytes.as_ref().clone()));
                    items.push(path);
                }
            }
        }
        match worker
            .install(files, items)
            .await
            .map_err(InstallFailure::Worker)?
        {
            Some(reason) => Err(InstallFailure::Install(reason)),
            None => {
                for p in todo {
                    worker.installed.insert(p.name.clone());
                }
                Ok(())
            }
        }
    }

    async fn fail(&self, lease: Lease, result: CallResult, e: WorkerError) -> CallResult {
        lease.discard().await;
        run_error(
            result,
            format!("the sandbox worker failed while running the code: {e}"),
        )
    }
}

enum InstallFailure {
    Install(String),
    Worker(WorkerError),
}

fn install_error(mut r: CallResult, msg: String) -> CallResult {
    r.status = Status::InstallError;
    r.error = Some(format!("Error installing dependencies: {msg}"));
    r
}

fn run_error(mut r: CallResult, msg: String) -> CallResult {
    r.status = Status::RunError;
    r.error = Some(msg);
    r
}

/// Resolves with the resident bytes once worker `pid` uses more than `limit`; never without one.
async fn watch_memory(pid: Option<u32>, limit: Option<u64>) -> u64 {
    let (Some(pid), Some(limit)) = (pid, limit) else {
        return std::future::pending().await;
    };
    let mut tick = tokio::time::interval(MEMORY_POLL);
    loop {
        tick.tick().await;
        if let Some(rss) = crate::sandbox::worker::resident_bytes(pid) {
            if rss > limit {
                return rss;
            }
        }
    }
}
