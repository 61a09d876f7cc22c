//! One tool call from start to end: find the requirements, install them into the caller's
//! worker, run the code there, and collect the result — each phase under a deadline the
//! front enforces by killing the worker. Every path ends in a [`CallResult`], or in nothing
//! when the call was cancelled or its session ended (MCP spec, cancellation: no result is
//! sent for a cancelled request).
//!
//! Tenancy (docs/architecture.md §3; the rules in [`super::queue`]): with
//! [`Isolation::Sandbox`] a worker belongs to one [`Sandbox`] for its whole life and dies with
//! it; [`Isolation::Call`] gives every call a clean worker; [`Isolation::Shared`] reuses
//! workers across sandboxes. What packages to install comes from
//! [`crate::packages::install`]; how a run's end reads as a result, from [`super::outcome`].

use crate::metrics::KillReason;
use crate::packages::install::{self, InstallPlan, Wanted};
use crate::packages::pep723::script_dependencies;
use crate::packages::resolver::{Planned, ResolveError, Resolver};
use crate::packages::scientific::BuiltIn;
use crate::protocol::launch::Runtime;
use crate::protocol::{RunOutcome, Stream};
use crate::sandbox::arrival::Arrival;
use crate::sandbox::files::{Listing, SandboxFiles};
use crate::sandbox::live::Sandbox;
use crate::server::call::outcome::{failed, read_outcome, CheckpointWhen, Verdict};
use crate::server::call::queue::{Held, Isolation, Queue};
use crate::server::call::result::{CallResult, Outcome, RunErrorCause};
use crate::server::call::run_host::CallRunHost;
use crate::server::call::runtimes::{RuntimeKit, RuntimeUnavailable, Runtimes};
use crate::server::call::startup_deps::StartupPlan;
use crate::server::call::state_note::{lost_note, Restart};
use crate::traces;
use crate::worker::client::{
    AskedCheckpoint, Deadline, MemoryGauge, Phase, RunRequest, Worker, WorkerError,
};
use crate::worker::net::NetPolicy;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

/// How a run on a worker ended: the worker's answer (or its failure), or the memory watch
/// first.
enum RunEnd {
    /// The worker answered, or failed, before the memory watch fired (boxed: an outcome is
    /// large, the other variant a number).
    Ran(Box<Result<RunOutcome, WorkerError>>),
    /// Its resident memory passed `--memory` first: `used` bytes.
    OverMemory { used: u64 },
}

/// Per-call limits.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Wall-clock limit for scanning imports, running the code and converting its result;
    /// `None` means no limit.
    pub timeout: Option<Duration>,
    /// Wall-clock limit for resolving, fetching and installing a call's packages.
    pub install_timeout: Duration,
    /// Most output bytes kept per call.
    pub output_cap: usize,
    /// Longest return value text per call (bytes).
    pub result_cap: usize,
    /// Resident memory a worker may use (bytes); above it the worker is killed.
    pub memory_limit: Option<u64>,
    /// Calls that may wait for a worker at once; more are refused.
    pub max_queue: usize,
    /// Largest image returned as content (`--max-image-bytes`; with `--stateful` only).
    pub max_image_bytes: usize,
    /// Most bytes of a sandbox's files the front keeps copies of, to restore them into its
    /// next worker (`--max-session-file-bytes`; with `--stateful` only).
    pub max_session_file_bytes: u64,
}

/// The keyword of both import statements (`import x`, `from x import y`).
const IMPORT_KEYWORD: &str = "import";

/// How often a running call's worker memory is checked.
const MEMORY_POLL: Duration = Duration::from_millis(25);

/// Bytes below `--memory` that a worker must stay under after a call to be kept (32 MiB).
/// WebAssembly memory never shrinks, so a worker that ended a call near its limit (after a
/// MemoryError, say) would pass it in a later, innocent call through the engine's own
/// allocations, and be killed there.
const MEMORY_HEADROOM: u64 = 32 << 20;

/// Bytes in a MiB, the unit of `--memory` and of its refusal's figures.
const MIB: u64 = 1 << 20;

/// What "no limit" means for a deadline (seconds): ten years.
const NO_LIMIT: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Runs calls on workers.
pub struct Executor {
    /// What it was made with.
    pub settings: ExecutorSettings,
    /// Admission (`--max-queue`), the running slots (`--workers`) and the shared workers.
    queue: Queue,
}

/// What an [`Executor`] is made of, resolved once from the command line (`src/modes.rs`).
pub struct ExecutorSettings {
    /// Where each runtime's workers come from, and what the scientific one has built in.
    pub runtimes: Runtimes,
    /// Plans, fetches and installs a call's dependencies.
    pub resolver: Arc<Resolver>,
    /// Each call's deadlines and caps.
    pub limits: Limits,
    /// Who shares an interpreter (`--isolation`).
    pub isolation: Isolation,
    /// Calls running at once (`--workers`); with [`Isolation::Shared`], also the interpreters
    /// kept for everyone.
    pub workers: usize,
    /// `--deps`: installed into every worker before its first call, as `startup_plan` planned.
    pub startup_deps: Vec<String>,
    /// `--deps`, resolved once (shared with the launcher, whose workers install it as they boot).
    pub startup_plan: StartupPlan,
    /// Which hosts user code may reach (`--allow-net`).
    pub net: NetPolicy,
    /// Code mode (`--tools-config`): the upstream MCP servers whose tools code may call.
    pub upstreams: Option<Arc<crate::code_mode::Upstreams>>,
    /// `--stateful`: a sandbox's globals last from one call to the next (`Isolation::Sandbox`).
    pub stateful: bool,
    /// `--state-dir`: a sandbox reached by handle is saved with its checkpoint before each
    /// answer, so its checkpoint is taken before the answer too.
    pub saves_state: bool,
}

/// Receives each output line while the code runs (for streaming to the client).
pub type OutputSink = Box<dyn FnMut(Stream, &str) + Send>;

impl Executor {
    /// An executor as `settings` say: it takes workers from their spares (and, with
    /// `Isolation::Shared`, keeps `workers` of them for everyone); at most `workers` calls run
    /// at once, and every call has `startup_deps` installed.
    pub fn new(settings: ExecutorSettings) -> Self {
        Executor {
            queue: Queue::new(settings.isolation, settings.workers),
            settings,
        }
    }

    /// Calls waiting for their turn now.
    pub fn queue_depth(&self) -> usize {
        self.queue.depth()
    }

    /// Calls running now (holding a running slot of `--workers`).
    pub fn busy(&self) -> usize {
        self.queue.busy()
    }

    /// Whether calls keep their sandbox's state (`--stateful`, which needs
    /// `Isolation::Sandbox`).
    fn keeps_state(&self) -> bool {
        self.settings.stateful && self.settings.isolation == Isolation::Sandbox
    }

    /// Resolves `--deps` once (downloads them into the cache); errors name the package.
    pub async fn startup_plan(&self) -> Result<Arc<Vec<Planned>>, Arc<ResolveError>> {
        self.settings.startup_plan.clone().await
    }

    /// `create_sandbox` (`--stateful`): gives `sandbox` its worker now and installs its
    /// dependencies (with `--deps`) into it, under `--install-timeout`, so that it answers
    /// only once they are there (its first call then starts at once).
    ///
    /// Errors: the install failure in words (naming the package), or why no worker could be
    /// had; the worker is then stopped.
    pub async fn prepare(&self, sandbox: &Sandbox) -> Result<(), InstallError> {
        let mut slot = sandbox.queue(None).await;
        let _permit = self
            .queue
            .running_slot()
            .await
            .map_err(|_| WorkerError::Closed)?;
        if slot.is_none() {
            // Counted once the runtime is ready, so that its first sandbox counts too.
            let spares = &self.kit_of(sandbox).await?.spares;
            spares.sandbox_made();
            let mut worker = spares.take().await?;
            self.adopt(sandbox, &mut worker, Restart::Stopped).await;
            *slot = Some(worker);
        }
        let Some(worker) = slot.as_mut() else {
            return Err(WorkerError::Closed.into());
        };
        let deadline = Deadline::after(self.settings.limits.install_timeout, Phase::Installing);
        let installed = deadline
            .bound(self.install(
                worker,
                self.built_in(sandbox),
                &sandbox.dependencies,
                &[],
                deadline,
            ))
            .await
            .map_err(InstallError::Worker)
            .and_then(|r| r);
        if let Err(InstallError::Worker(_)) = &installed {
            if let Some(worker) = slot.take() {
                worker.kill_soon();
            }
        }
        installed
    }

    /// Kills every worker (at shutdown).
    pub async fn shutdown(&self) {
        for kit in self.settings.runtimes.kits() {
            kit.spares.shutdown().await;
        }
        self.queue.shutdown().await;
    }

    /// Makes `runtime` ready (`None`: the server's own, which is), for a sandbox about to be
    /// made of it (`create_sandbox`).
    ///
    /// Errors: [`RuntimeUnavailable`], which says why.
    pub async fn runtime_ready(&self, runtime: Option<Runtime>) -> Result<(), RuntimeUnavailable> {
        self.settings.runtimes.kit(runtime).await.map(|_| ())
    }

    /// A clean worker of `sandbox`'s runtime, from its spares (that runtime made ready first
    /// when it is not the server's own and no sandbox asked for it before).
    ///
    /// Errors: [`WorkerError::Unavailable`] when the runtime cannot be had; the spares'.
    pub(super) async fn take_worker(&self, sandbox: &Sandbox) -> Result<Worker, WorkerError> {
        self.kit_of(sandbox).await?.spares.take().await
    }

    /// `sandbox`'s runtime's kit, that runtime made ready first when it is not the server's
    /// own and no sandbox asked for it before.
    ///
    /// Errors: [`WorkerError::Unavailable`] when the runtime cannot be had.
    async fn kit_of(&self, sandbox: &Sandbox) -> Result<&RuntimeKit, WorkerError> {
        self.settings
            .runtimes
            .kit(sandbox.runtime)
            .await
            .map_err(|e| WorkerError::Unavailable(Box::new(e)))
    }

    /// Asks `sandbox`'s runtime's spares to boot one more for its next call.
    pub(super) fn replenish(&self, sandbox: &Sandbox) {
        if let Some(kit) = self.settings.runtimes.ready_kit(sandbox.runtime) {
            kit.spares.replenish();
        }
    }

    /// Runs one call of `run_python_code` for `sandbox`, after the sandbox's calls that arrived
    /// before it (`arrival`, when the transport stamped one). `None` when `cancel` fired or the
    /// sandbox ended first: the worker was killed and no result is due.
    #[allow(clippy::too_many_arguments)]
    pub async fn run(
        &self,
        sandbox: &Arc<Sandbox>,
        arrival: Option<&Arrival>,
        code: &str,
        globals: serde_json::Map<String, serde_json::Value>,
        timeout: Option<Duration>,
        on_output: OutputSink,
        cancel: &CancellationToken,
    ) -> Option<CallResult> {
        let declared = match script_dependencies(code) {
            Ok(d) => d,
            Err(e) => {
                return Some(CallResult::new(Outcome::install_error(format!(
                    "invalid script metadata: {e}"
                ))))
            }
        };
        let stop = async {
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = sandbox.until_ended() => {}
            }
        };
        tokio::pin!(stop);
        let turn = self
            .take_turn(sandbox, arrival, stop.as_mut())
            .instrument(traces::step("queue"))
            .await;
        let (mut held, permit, queued) = match turn {
            Ok(turn) => turn,
            Err(early) => return early.into_result().map(|result| *result),
        };
        let mut on_output = on_output;
        // A worker that turns out to have ended before it took the call (killed between
        // calls while its threads were still exiting) is replaced, and the call sent again,
        // once: it never began there.
        let mut vanished = false;
        loop {
            let call = Call {
                code,
                declared: declared.clone(),
                globals: &globals,
                timeout,
                on_output: &mut on_output,
            };
            match self
                .attempt(&mut held, sandbox, call, vanished, stop.as_mut())
                .await
            {
                // `attempt` says so only of a first attempt.
                Attempt::Vanished => vanished = true,
                Attempt::Done(result) => {
                    sandbox.end_call();
                    return result.map(|mut result| {
                        result.timing.queue = queued;
                        *result
                    });
                }
                Attempt::Owing(mut result, asked) => {
                    self.checkpoint_after_answer(held, permit, sandbox.clone(), asked);
                    result.timing.queue = queued;
                    return Some(*result);
                }
            }
        }
    }

    /// One attempt at `call` in `held`'s worker (replaced first when it ended, or when
    /// `vanished`: the last attempt's worker had ended before it took the call).
    async fn attempt(
        &self,
        held: &mut Held,
        sandbox: &Sandbox,
        call: Call<'_>,
        vanished: bool,
        mut stop: Pin<&mut impl Future<Output = ()>>,
    ) -> Attempt {
        let mut result = CallResult::new(Outcome::Success(None));
        let stateful = self.keeps_state();
        let started = std::time::Instant::now();
        if let Err(early) = self
            .ready_worker(held, sandbox, stateful, vanished, stop.as_mut())
            .await
        {
            return Attempt::Done(early.into_result());
        }
        result.timing.interpreter = started.elapsed();
        if stateful {
            result.state = sandbox.notes.take();
        }
        let Some(worker) = held.slot().as_mut() else {
            return Attempt::Done(Some(Box::new(run_error(WorkerError::Closed))));
        };
        result.note = worker.stand_in_for.take();
        let mark = worker.replies_read();
        let ran = self
            .run_on(worker, sandbox, call, stateful, &mut result, stop)
            .await;
        let (verdict, when) = match ran {
            Some((verdict, when)) => (Some(verdict), when),
            None => (None, CheckpointWhen::Done),
        };
        if !vanished
            && verdict == Some(Verdict::Discard)
            && worker.ended_before_taking_request(mark)
        {
            tracing::info!(
                "sandbox {}: its interpreter had ended before it took the call; sending the call to a new one",
                sandbox.id.short()
            );
            return Attempt::Vanished;
        }
        self.settle(held, sandbox, stateful, verdict, &mut result)
            .await;
        match (verdict, when) {
            (Some(Verdict::Keep), CheckpointWhen::AfterAnswer(asked, deadline)) => {
                Attempt::Owing(Box::new(result), (asked, deadline))
            }
            _ => Attempt::Done(verdict.map(|_| Box::new(result))),
        }
    }

    /// Waits for the call's turn ([`Queue::turn`]), counted as waiting meanwhile: the
    /// sandbox's worker slot (in arrival order), then a running slot. With the turn, how long
    /// it waited (the `queue_wait` metric's figure, and the timing line's).
    ///
    /// Errors: [`Early::Failed`] when `--max-queue` calls already wait or the server is
    /// shutting down; [`Early::Stopped`] when `stop` fired first.
    async fn take_turn(
        &self,
        sandbox: &Sandbox,
        arrival: Option<&Arrival>,
        mut stop: Pin<&mut impl Future<Output = ()>>,
    ) -> Result<(Held, OwnedSemaphorePermit, Duration), Early> {
        let waiting = match self.queue.admit(self.settings.limits.max_queue) {
            Ok(waiting) => waiting,
            Err(full) => return Err(Early::Failed(Box::new(run_error(full)))),
        };
        let turn = self.queue.turn(sandbox, arrival);
        let queued_at = std::time::Instant::now();
        let (held, permit) = tokio::select! {
            t = turn => match t {
                Some(t) => t,
                None => return Err(Early::Failed(Box::new(run_error(WorkerError::Closed)))),
            },
            _ = &mut stop => return Err(Early::Stopped),
        };
        drop(waiting);
        let waited = queued_at.elapsed();
        crate::metrics::queue_wait(waited);
        Ok((held, permit, waited))
    }

    /// Gives `held` a live worker for the call: a shared one restored before the zygote
    /// was ready gives way to a fork, one that ended since the last call is replaced, and an
    /// empty slot gets a clean one (with `stateful`, given the sandbox's kept files).
    ///
    /// Errors: [`Early::Failed`] when no worker can be had; [`Early::Stopped`] when
    /// `stop` fired first.
    async fn ready_worker(
        &self,
        held: &mut Held,
        sandbox: &Sandbox,
        stateful: bool,
        vanished: bool,
        mut stop: Pin<&mut impl Future<Output = ()>>,
    ) -> Result<(), Early> {
        if let Held::Shared(lease) = held {
            // A shared worker restored before the zygote was ready gives way to a fork
            // once it is, a single time per slot, between calls.
            let spares = &self.settings.runtimes.own_kit().spares;
            if let Some(worker) = lease.slot().take_if(|w| spares.outdated(w)) {
                worker.kill_soon();
            }
        }
        // A worker that ended between calls (killed from outside, the OOM killer, a crash while
        // idle) is replaced before the code is sent, rather than failing a call that
        // never ran; so is one that was found to have ended before it took the call.
        let died = held
            .slot()
            .as_mut()
            .is_some_and(|w| vanished || w.has_ended());
        if died {
            tracing::info!(
                "sandbox {}: its interpreter had ended since its last call; starting a new one",
                sandbox.id.short()
            );
            held.discard().await;
            if stateful {
                sandbox.with_files(SandboxFiles::survive);
            }
        }
        if held.slot().is_some() {
            return Ok(());
        }
        let fresh = tokio::select! {
            w = self.take_worker(sandbox).instrument(traces::step("interpreter")) => w,
            _ = &mut stop => return Err(Early::Stopped),
        };
        let mut w = fresh.map_err(|e| Early::Failed(Box::new(run_error(e))))?;
        if stateful {
            let why = if died {
                Restart::Died
            } else {
                Restart::Stopped
            };
            self.adopt(sandbox, &mut w, why)
                .instrument(traces::step("restore"))
                .await;
        }
        *held.slot() = Some(w);
        Ok(())
    }

    /// Runs `call` on `worker`, filling `result`, and with `stateful`, when the worker is
    /// kept, copies the files it changed and sees to its checkpoint ([`Executor::after_run`]).
    /// The verdict on the worker, and when its checkpoint is due. `None` when `stop` fired
    /// first: the call was cancelled and its worker is to be killed.
    async fn run_on(
        &self,
        worker: &mut Worker,
        sandbox: &Sandbox,
        call: Call<'_>,
        stateful: bool,
        result: &mut CallResult,
        stop: Pin<&mut impl Future<Output = ()>>,
    ) -> Option<(Verdict, CheckpointWhen)> {
        tokio::select! {
            v = async {
                let mut ran = Ran::default();
                let verdict = self.phases(worker, sandbox, call, result, &mut ran).await;
                if !stateful || verdict == Verdict::Discard {
                    return (verdict, CheckpointWhen::Done);
                }
                if let Some(listing) = ran.listing {
                    self.copy_files(sandbox, worker, listing, result).await;
                }
                if !self.checkpoints(sandbox) {
                    return (verdict, CheckpointWhen::Done);
                }
                match self.after_run(sandbox, worker, ran.uncapturable, result).await {
                    Ok(when) => (verdict, when),
                    Err(e) => {
                        tracing::warn!("sandbox {}: checkpoint failed: {e}", sandbox.id.short());
                        (Verdict::Discard, CheckpointWhen::Done)
                    }
                }
            } => Some(v),
            _ = stop => {
                crate::metrics::worker_killed(KillReason::Cancelled);
                None
            }
        }
    }

    /// After the call (`verdict`, `None` when it was cancelled): keeps `held`'s worker
    /// when the verdict and the isolation allow; otherwise kills it, with `stateful` says in
    /// `result` what of the sandbox's state survives, and asks for a spare for the next call.
    async fn settle(
        &self,
        held: &mut Held,
        sandbox: &Sandbox,
        stateful: bool,
        verdict: Option<Verdict>,
        result: &mut CallResult,
    ) {
        let keep = verdict
            .is_some_and(|v| v == Verdict::Keep && self.settings.isolation.reuses_interpreters());
        if keep {
            return;
        }
        if stateful {
            // Files the front holds copies of outlive the worker; the rest go.
            let survivors = sandbox.with_files(SandboxFiles::survive);
            result.files_changed = !survivors.lost.is_empty();
            result.written.clear();
            if verdict.is_some() {
                let kept = self.checkpoints(sandbox) && sandbox.state.is_current();
                result.state = Some(lost_note(&survivors, kept));
            }
        }
        held.discard().await;
        if self.settings.isolation.reuses_interpreters() && !sandbox.has_ended() {
            // The sandbox's (or the shared slot's) next call will want a clean worker.
            self.replenish(sandbox);
        }
    }

    /// Whether `sandbox`'s state is checkpointed after each call (checkpoints, docs/architecture.md §3.4): with
    /// `--stateful`, an interpreter per sandbox (`--isolation session`), for sandboxes that
    /// outlive their call.
    pub(super) fn checkpoints(&self, sandbox: &Sandbox) -> bool {
        self.keeps_state()
            && self.settings.isolation == Isolation::Sandbox
            && sandbox.owner != crate::sandbox::live::Owner::Call
    }

    /// Scans, installs and runs on `worker`, filling `result`, and `ran` with what the worker
    /// said after the code ran.
    async fn phases(
        &self,
        worker: &mut Worker,
        sandbox: &Sandbox,
        call: Call<'_>,
        result: &mut CallResult,
        ran: &mut Ran,
    ) -> Verdict {
        let Call {
            code,
            declared,
            globals,
            timeout,
            on_output,
        } = call;
        let sandbox_deps = &sandbox.dependencies;
        let timeout = timeout.unwrap_or(NO_LIMIT);
        // `--timeout` covers scanning and running; installing has its own limit.
        let scan_started = tokio::time::Instant::now();
        let inferred = declared.is_none();
        let requirements = match self
            .requirements(worker, code, declared, timeout)
            .instrument(traces::step("scan imports"))
            .await
        {
            Ok(requirements) => requirements,
            Err(e) => return failed(result, e),
        };
        let scanned = scan_started.elapsed();
        result.timing.scan = scanned;
        result.dependencies = if inferred {
            self.not_given(&requirements, sandbox_deps).await
        } else {
            requirements.clone()
        };
        let install_started = std::time::Instant::now();
        let installed = self
            .install_phase(worker, sandbox, &requirements, result)
            .instrument(traces::step("install"))
            .await;
        result.timing.install = install_started.elapsed();
        if let Some(verdict) = installed {
            return verdict;
        }

        let mut output = Vec::new();
        let collect = |stream: Stream, line: String| {
            on_output(stream, &line);
            output.push(line);
        };
        let run_deadline = Deadline {
            at: tokio::time::Instant::now() + timeout.saturating_sub(scanned),
            limit: timeout,
            phase: Phase::Running,
        };
        let run_started = std::time::Instant::now();
        let outcome = self
            .run_code(worker, sandbox, code, globals, run_deadline, collect)
            .instrument(traces::step("run"))
            .await;
        result.timing.run = run_started.elapsed();
        result.output = output;
        match outcome {
            RunEnd::Ran(answer) => match *answer {
                Ok(mut outcome) => {
                    result.timing.set_worker(outcome.worker_us, outcome.code_us);
                    ran.uncapturable = outcome.uncapturable.take();
                    let fatal = read_outcome(outcome, result, &mut ran.listing);
                    self.verdict(worker, fatal)
                }
                Err(e) => failed(result, e),
            },
            RunEnd::OverMemory { used } => {
                let limit = self.settings.limits.memory_limit.unwrap_or_default() / MIB;
                // Rounded up: a worker stopped for passing 512 MiB by a few pages took 513
                // MiB begun, never "512", which would read as within the limit.
                let taken = used.div_ceil(MIB);
                result.outcome = Outcome::run_error(
                    RunErrorCause::Memory,
                    format!(
                        "MemoryError: the worker exceeded its memory limit of {limit} MiB (it took {taken} MiB beyond a fresh interpreter) and was stopped"
                    ),
                );
                crate::metrics::worker_killed(KillReason::Memory);
                Verdict::Discard
            }
        }
    }

    /// The call's requirements: those its script metadata declares (`declared`), else the
    /// packages of the modules its `code` imports, which `worker` finds within `timeout`.
    ///
    /// Errors: the worker failed while scanning (it is to be discarded).
    async fn requirements(
        &self,
        worker: &mut Worker,
        code: &str,
        declared: Option<Vec<String>>,
        timeout: Duration,
    ) -> Result<Vec<String>, WorkerError> {
        Ok(match declared {
            Some(deps) => deps,
            // Every import statement spells the keyword `import` (Python has no other way to
            // write it), so code without the word has none: no round trip to scan it.
            None if !code.contains(IMPORT_KEYWORD) => Vec::new(),
            None => worker
                .find_imports(code, Deadline::after(timeout, Phase::Scanning))
                .await?
                .iter()
                .map(|n| self.package_for_import(n))
                .collect(),
        })
    }

    /// The inferred `requirements` a call's result names: imports that `--deps` (what they
    /// install, dependencies included) or the sandbox's own dependencies (`sandbox_deps`)
    /// already satisfy are no requirement of this call's: the Deno original prints none for
    /// them.
    async fn not_given(&self, requirements: &[String], sandbox_deps: &[String]) -> Vec<String> {
        let mut given = given_names(self.settings.startup_deps.iter().chain(sandbox_deps));
        if let Ok(startup) = self.startup_plan().await {
            given.extend(
                startup
                    .iter()
                    .map(|p| crate::packages::lock::normalize(&p.name)),
            );
        }
        requirements
            .iter()
            .filter(|r| !given.contains(&crate::packages::lock::normalize(r)))
            .cloned()
            .collect()
    }

    /// Installs what the call needs into `worker`, under `--install-timeout`. `None` when all
    /// is there and the code may run; otherwise the verdict, `result` saying why the call ends
    /// here: a refused install keeps the worker, a failed or late one is discarded.
    async fn install_phase(
        &self,
        worker: &mut Worker,
        sandbox: &Sandbox,
        requirements: &[String],
        result: &mut CallResult,
    ) -> Option<Verdict> {
        let install_deadline =
            Deadline::after(self.settings.limits.install_timeout, Phase::Installing);
        let install = self.install(
            worker,
            self.built_in(sandbox),
            &sandbox.dependencies,
            requirements,
            install_deadline,
        );
        let installed = install_deadline.bound(install).await;
        match installed {
            Ok(Ok(())) => None,
            Ok(Err(InstallError::Worker(e))) | Err(e) => Some(failed(result, e)),
            Ok(Err(refused)) => {
                result.outcome = Outcome::install_error(refused);
                Some(Verdict::Keep)
            }
        }
    }

    /// Runs `code` with `globals` on `worker` before `run_deadline`, each output line to
    /// `collect`, while the worker's memory is watched: [`RunEnd::OverMemory`] when it passed
    /// `--memory` first (the run is then abandoned and the worker is to be killed).
    async fn run_code(
        &self,
        worker: &mut Worker,
        sandbox: &Sandbox,
        code: &str,
        globals: &serde_json::Map<String, serde_json::Value>,
        run_deadline: Deadline,
        mut collect: impl FnMut(Stream, String) + Send,
    ) -> RunEnd {
        let gauge = worker.memory_gauge();
        let request = RunRequest {
            code,
            globals,
            output_cap: self.settings.limits.output_cap,
            result_cap: self.settings.limits.result_cap,
            keep_globals: self.keeps_state(),
            image_cap: if self.keeps_state() {
                self.settings.limits.max_image_bytes
            } else {
                0
            },
            checkpoint_follows: self.checkpoints(sandbox),
        };
        let upstreams = self.settings.upstreams.as_deref();
        // A list that no longer narrows the server's (a replica with another --allow-net took the
        // sandbox over) reaches nothing rather than more.
        let within = sandbox.allow_net.as_ref().map(|entries| {
            let narrowed = self.settings.net.narrowed(entries);
            narrowed.unwrap_or_default()
        });
        let net = (&self.settings.net, within);
        let mut host = CallRunHost::new(net, upstreams, sandbox.id.as_str());
        let run = worker.run(request, run_deadline, &mut host, &mut collect);
        let watch = watch_memory(gauge, self.settings.limits.memory_limit);
        tokio::select! {
            r = run => RunEnd::Ran(Box::new(r)),
            used = watch => RunEnd::OverMemory { used },
        }
    }

    /// Whether `worker` may serve another call after one that ran: not when its interpreter
    /// ended (`fatal`), nor when it grew within [`MEMORY_HEADROOM`] of `--memory`.
    fn verdict(&self, worker: &Worker, fatal: bool) -> Verdict {
        // WebAssembly memory never shrinks: a worker that grew to within MEMORY_HEADROOM of the
        // limit, or one whose interpreter ended, is replaced before the next call.
        let over = self.settings.limits.memory_limit.is_some_and(|max| {
            worker
                .taken_bytes()
                .is_some_and(|taken| taken > max.saturating_sub(MEMORY_HEADROOM))
        });
        if fatal || over {
            crate::metrics::worker_killed(if over {
                KillReason::Memory
            } else {
                KillReason::Fatal
            });
            Verdict::Discard
        } else {
            Verdict::Keep
        }
    }

    /// Package that provides `import_name`: the lock file's mapping, else the same name.
    fn package_for_import(&self, import_name: &str) -> String {
        self.settings.resolver.package_for_import(import_name)
    }

    /// What `sandbox`'s runtime has built in: `None` for Pyodide's, which installs (and for a
    /// runtime not made ready, which has no worker to install into).
    pub(super) fn built_in(&self, sandbox: &Sandbox) -> Option<&BuiltIn> {
        let kit = self.settings.runtimes.ready_kit(sandbox.runtime)?;
        kit.built_in.as_deref()
    }

    /// Installs into `worker` what `--deps`, the sandbox's own dependencies (`sandbox_deps`)
    /// and the call's `requirements` need and it does not have yet; in a runtime with its
    /// packages `built_in`, installs nothing and checks that it has them all.
    pub(super) async fn install(
        &self,
        worker: &mut Worker,
        built_in: Option<&BuiltIn>,
        sandbox_deps: &[String],
        requirements: &[String],
        deadline: Deadline,
    ) -> Result<(), InstallError> {
        if let Some(built_in) = built_in {
            return built_in_only(built_in, sandbox_deps.iter().chain(requirements));
        }
        let startup = self
            .startup_plan()
            .await
            .map_err(InstallError::StartupDeps)?;
        let wanted = Wanted {
            startup: &self.settings.startup_deps,
            sandbox: sandbox_deps,
            call: requirements,
        };
        // The call's requirements are resolved together with `--deps`, the sandbox's own and
        // what the interpreter already has, pinned: one consistent set, or a conflict in words.
        let planned =
            match install::plan(&self.settings.resolver, wanted, &worker.installed).await? {
                None => startup,
                Some(dists) => Arc::new(install::fetch(&self.settings.resolver, &dists).await?),
            };
        let Some(plan) = install::to_install(&planned, &worker.installed) else {
            return Ok(());
        };
        let InstallPlan {
            files,
            items,
            packages,
        } = plan;
        let installed = worker.install(files, items, deadline).await;
        crate::metrics::install_finished(matches!(installed, Ok(None)));
        match installed? {
            Some(reason) => Err(InstallError::Refused(reason)),
            None => {
                for p in packages {
                    // One line per package (shown with --verbose); names are escaped, as they
                    // come from user code's requirements.
                    tracing::debug!(
                        "install: {:?} {:?} from {:?}",
                        p.name,
                        p.version,
                        p.file_name
                    );
                    worker.installed.insert(p.name, p.version);
                }
                Ok(())
            }
        }
    }
}

/// The code of one call and what comes with it.
struct Call<'a> {
    /// The Python source.
    code: &'a str,
    /// The requirements its script metadata declares (PEP 723); `None`: inferred from its
    /// imports.
    declared: Option<Vec<String>>,
    /// Globals set before it runs.
    globals: &'a serde_json::Map<String, serde_json::Value>,
    /// Its limit for scanning and running (`--timeout`, or `--task-timeout` for a call that
    /// may become a task); `None`: none.
    timeout: Option<Duration>,
    /// Receives its output lines as they come.
    on_output: &'a mut OutputSink,
}

/// How one attempt at a call ended ([`Executor::attempt`]).
enum Attempt {
    /// Its worker had ended before it took the call: the call is to be sent to a new one.
    Vanished,
    /// What [`Executor::run`] answers (boxed: a result is large, the other variant empty).
    Done(Option<Box<CallResult>>),
    /// The call's result, with its kept worker's checkpoint asked for and owed until it is
    /// answered ([`CheckpointWhen::AfterAnswer`]).
    Owing(Box<CallResult>, (AskedCheckpoint, Deadline)),
}

/// What the worker said after a run, besides the result ([`Executor::phases`]).
#[derive(Default)]
struct Ran {
    /// Its working directory.
    listing: Option<Listing>,
    /// Why the state it left cannot be captured, when a checkpoint follows
    /// ([`crate::protocol::RunOutcome::uncapturable`]).
    uncapturable: Option<Vec<crate::protocol::Uncapturable>>,
}

/// How a call ended before its code ran.
enum Early {
    /// It was cancelled, or its sandbox ended: no result is due.
    Stopped,
    /// It could not run: the result says why (boxed: a result is large, the other variant
    /// empty).
    Failed(Box<CallResult>),
}

impl Early {
    /// What [`Executor::run`] answers for it.
    fn into_result(self) -> Option<Box<CallResult>> {
        match self {
            Early::Stopped => None,
            Early::Failed(result) => Some(result),
        }
    }
}

/// The normalized names of `requirements` (PEP 508, bounded first: `create_sandbox`'s come
/// from clients; PEP 503 normalization); those that do not parse name nothing.
fn given_names<'a>(
    requirements: impl Iterator<Item = &'a String>,
) -> std::collections::HashSet<String> {
    requirements
        .filter_map(|r| crate::packages::requirement::parse_requirement(r).ok())
        .map(|r| crate::packages::lock::normalize(r.name.as_ref()))
        .collect()
}

/// Why packages could not be installed into an interpreter.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// `--deps` could not be resolved or fetched.
    #[error("error installing --deps: {0}")]
    StartupDeps(#[source] Arc<ResolveError>),
    /// The requirements could not be resolved or fetched (the error names the package).
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    /// The interpreter could not install a file: its own words.
    #[error("{0}")]
    Refused(String),
    /// The worker failed while installing (it is stopped).
    #[error(transparent)]
    Worker(#[from] WorkerError),
    /// The scientific runtime installs nothing, and these requirements name packages it does
    /// not have built in (`built_in`: the list of those it has).
    #[error("the scientific runtime installs nothing, and has no {}; its packages are built in: {built_in}", missing.join(", "))]
    NotBuiltIn {
        missing: Vec<String>,
        built_in: String,
    },
}

/// A sandbox's and a call's `requirements` in the scientific runtime: satisfied when each
/// names a package built in (its version specifier is not checked: there is one version of
/// each).
///
/// Errors: [`InstallError::NotBuiltIn`], naming each requirement that is not built in (or is
/// not a PEP 508 requirement) and every package that is.
fn built_in_only<'a>(
    built_in: &BuiltIn,
    requirements: impl Iterator<Item = &'a String>,
) -> Result<(), InstallError> {
    let missing: Vec<String> = requirements
        .filter(|r| {
            let name = crate::packages::requirement::parse_requirement(r)
                .map(|parsed| parsed.name.to_string());
            !name.is_ok_and(|name| built_in.has(&name))
        })
        .cloned()
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(InstallError::NotBuiltIn {
        missing,
        built_in: built_in.listed(),
    })
}

/// A call that ended before its code ran, for `why` (no worker, a full queue).
fn run_error(why: impl std::fmt::Display) -> CallResult {
    CallResult::new(Outcome::run_error(RunErrorCause::Refused, why.to_string()))
}

/// Resolves with the bytes the worker of `gauge` took since it was ready, once they pass
/// `limit`; never without a limit.
async fn watch_memory(gauge: Option<MemoryGauge>, limit: Option<u64>) -> u64 {
    let (Some(gauge), Some(limit)) = (gauge, limit) else {
        return std::future::pending().await;
    };
    // The first check is one period in: a call that ends sooner costs no read of `/proc`.
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + MEMORY_POLL, MEMORY_POLL);
    loop {
        tick.tick().await;
        if let Some(taken) = gauge.taken() {
            if taken > limit {
                return taken;
            }
        }
    }
}
