//! An interpreter started as the zygote (`fork_server.rs`): it warms up with calls of its own,
//! keeps its pristine memory, says it booted, and then forks interpreters; each child confines
//! itself and says it is ready.

use super::boot::{send_ready, BootReport, BOOT_CALL};
use super::dirty_pages::{self, DirtyPages};
use super::host_calls::FrontInput;
use super::linear_memory::Pristine;
use super::runner::{call, parse_answer, Empty, RunArgs, Runner};
use crate::engine::{Arg, Engine};
use crate::protocol::RunOutcome;
use anyhow::{Context, Result};
use std::cell::RefCell;
use std::os::fd::OwnedFd;
use std::time::Instant;

/// Calls the zygote makes before it forks, so that its children inherit warm caches and
/// compiled code: the first call of a forked worker then costs about what a later one does.
/// Each also scans the code's imports, as a first call does. 50 instead of 200 saved ~0.2 s of
/// the zygote's start; forked workers' first calls measured the same (5-9 ms over HTTP).
pub(super) const WARM_UP_CALLS: usize = 50;

/// More calls the zygote makes after [`WARM_UP_CALLS`] (the same code, without the import
/// scan, which most calls skip too), so that its children inherit the per-call code compiled by
/// the engine's optimizing WebAssembly tier (OMG). That tier takes a function once its counter
/// reaches 50,000, and an entry adds 15: a function entered once per call tiers up after about
/// 3,300 calls, so the warm-up makes 4,050 (its compiles still running when the calls end are
/// waited for with the helper threads). With only 200 warm-up calls, every forked worker
/// compiled those functions itself around its 3,000th call, on a second thread, and `session`
/// throughput with 8 forked workers was 547–598 calls/s against 900–1,300 after 5,000 warm-up
/// calls. Lowering the threshold instead is no way out: the children inherit it
/// ([`crate::engine::configure_zygote`]). The price: about two seconds of the zygote's start.
pub(super) const TIER_UP_CALLS: usize = 4000;

/// Code of the warm-up calls: a trivial expression, output, a standard-library import, a loop
/// with a function call (tier-up of the interpreter's hot paths), an error with a traceback.
/// The loop is short: 20 iterations a call enter its per-iteration functions ~16,000 times over
/// the warm-up (the optimizing tier needs ~3,300), and longer loops only cost warm-up time.
pub(super) const WARM_UP_CODE: [&str; 5] = [
    "1 + 1",
    "print('warm')",
    "import json, re\njson.dumps({'a': re.sub('a', 'b', 'aaa')})",
    "def f(n):\n    return sum(i * i for i in range(n))\nf(20)",
    "undefined_name",
];

/// Code of the warm-up calls that use top-level `await`, each run [`AWAIT_WARM_UP_CALLS`]
/// times after the others: such a call goes through a coroutine, Pyodide's event loop and a
/// promise, which the code above never reaches. Without them, a forked worker's first such
/// call (every run of FastMCP's code mode is one: its snippet's `return` makes it the body of
/// an `async def` that is awaited, `pysrc/mcp_run_python/fastmcp.py`) imported and set up
/// what they need itself: about 6 ms of its code's time, against under 1 ms for `1 + 1`.
pub(super) const AWAIT_WARM_UP_CODE: [&str; 2] = [
    "import asyncio\nawait asyncio.sleep(0)",
    "async def f():\n    return 1\nawait f()",
];

/// How many times each of [`AWAIT_WARM_UP_CODE`] runs in the zygote.
pub(super) const AWAIT_WARM_UP_CALLS: usize = 5;

/// Warm-up calls that reseed first, as a forked interpreter's first run does
/// (`runtime/python/runner.py` `reseed`: 2,496 bytes from the OS for `random`, through
/// Emscripten's `random_get` and `crypto.getRandomValues`, ten calls of 256 bytes), a path the
/// zygote's other calls never take and a fork's first call would otherwise run cold (a warm
/// reseed takes 0.2-0.4 ms). Each costs the zygote's start about 0.2 ms.
pub(super) const RESEED_WARM_UP_CALLS: usize = 20;

/// Warm-up calls as a `--stateful` sandbox's and code mode's run them: in kept globals (the
/// working directory listed, its files reported), with a catalog of one host function. A
/// fork's first such call otherwise ran those paths cold: ~0.6 ms to take the catalog and
/// ~1 ms more to close the call. The zygote forgets these runs before it forks
/// (`runtime/python/runner.py` `forget_runs`, from `baseline`).
pub(super) const STATEFUL_WARM_UP_CALLS: usize = 20;

/// The catalog of the stateful warm-up calls (`src/code_mode/catalog.rs`'s JSON): no upstream
/// server and one host function, never called.
const WARM_UP_CATALOG: &str =
    r#"{"version":0,"servers":[],"functions":[{"name":"warm_up","signature":"()","doc":""}]}"#;

/// Runs [`WARM_UP_CALLS`], then [`AWAIT_WARM_UP_CODE`]'s, [`RESEED_WARM_UP_CALLS`],
/// [`STATEFUL_WARM_UP_CALLS`] and [`TIER_UP_CALLS`] calls in the zygote through the same runner
/// functions a real call uses (their output goes nowhere: no run is in progress for the
/// front).
pub(super) fn warm_up(engine: &mut Engine, runner: &Runner) -> Result<()> {
    for i in 0..WARM_UP_CALLS {
        let code = WARM_UP_CODE[i % WARM_UP_CODE.len()];
        call(
            engine,
            &runner.find_imports,
            BOOT_CALL,
            &[Arg::Str(code)],
            None,
        )
        .context("warming up the zygote")?;
        zygote_run(engine, runner, code).context("warming up the zygote")?;
    }
    for code in AWAIT_WARM_UP_CODE.repeat(AWAIT_WARM_UP_CALLS) {
        zygote_run(engine, runner, code).context("warming up the zygote")?;
    }
    for _ in 0..RESEED_WARM_UP_CALLS {
        reseed_next_run(engine, runner)?;
        zygote_run(engine, runner, WARM_UP_CODE[0]).context("warming up the zygote")?;
    }
    for i in 0..STATEFUL_WARM_UP_CALLS {
        let run = RunArgs {
            keep_globals: true,
            tools: Some(WARM_UP_CATALOG.to_owned()),
            ..warm_up_args(WARM_UP_CODE[i % WARM_UP_CODE.len()])
        };
        zygote_run_with(engine, runner, &run).context("warming up the zygote")?;
    }
    for i in 0..TIER_UP_CALLS {
        let code = WARM_UP_CODE[i % WARM_UP_CODE.len()];
        zygote_run(engine, runner, code).context("warming up the zygote")?;
    }
    zygote_run(engine, runner, FREEZE_CODE).context("freezing the zygote's objects")?;
    // The zygote's random state is every child's: each reseeds in its first run.
    reseed_next_run(engine, runner)?;
    engine.collect_garbage();
    Ok(())
}

/// Makes the zygote's next run reseed Python's random state first (`runtime/js/runner.js`
/// `reseed`).
fn reseed_next_run(engine: &mut Engine, runner: &Runner) -> Result<()> {
    let answer = call(engine, &runner.reseed, BOOT_CALL, &[], None)
        .context("preparing the reseed of forked interpreters")?;
    parse_answer::<Empty>(&answer).context("preparing the reseed of forked interpreters")?;
    Ok(())
}

/// Records, as the zygote's last steps before it forks, what it holds outside linear memory
/// (`runtime/js/runner.js` `baseline`) and a copy of its linear memory ([`Pristine`]): every child's
/// checkpoints are measured against both.
///
/// Errors: the runner fails, or the copy cannot be mapped.
pub(super) fn keep_pristine(engine: &mut Engine, runner: &Runner) -> Result<()> {
    let answer = call(engine, &runner.baseline, BOOT_CALL, &[], None)
        .context("recording the zygote's baseline")?;
    parse_answer::<Empty>(&answer).context("recording the zygote's baseline")?;
    let started = Instant::now();
    let id = engine.with_bytes(&runner.memory, |memory| Pristine::keep(memory))??;
    tracing::debug!(
        "zygote {id}: pristine memory kept in {} ms",
        started.elapsed().as_millis()
    );
    Ok(())
}

/// The zygote's last call: every object alive now moves to the garbage collector's permanent
/// generation, which it never scans again (`gc.freeze`, meant for pre-fork servers), so that a
/// forked worker's collections do not write to (and copy) every page of the zygote's heap.
pub(super) const FREEZE_CODE: &str = "import gc\ngc.collect()\ngc.freeze()";

/// Runs `code` in the zygote through the runner's `run`, as a call would, with fresh globals and
/// the warm-up caps; its output goes nowhere (no run is in progress for the front).
pub(super) fn zygote_run(engine: &mut Engine, runner: &Runner, code: &str) -> Result<()> {
    zygote_run_with(engine, runner, &warm_up_args(code))
}

/// The arguments of a warm-up call of `code`: fresh globals, the warm-up caps, no catalog.
fn warm_up_args(code: &str) -> RunArgs<'_> {
    RunArgs {
        code,
        globals: "{}",
        output_cap: WARM_UP_CAP,
        result_cap: WARM_UP_CAP,
        keep_globals: false,
        tools: None,
        network: None,
    }
}

/// Runs `run` in the zygote through the runner's `run`; its output goes nowhere.
fn zygote_run_with(engine: &mut Engine, runner: &Runner, run: &RunArgs) -> Result<()> {
    let answer = call(engine, &runner.run, BOOT_CALL, &run.args(), None)?;
    parse_answer::<RunOutcome>(&answer)?;
    Ok(())
}

/// The code of [`crate::protocol::messages::Request::WarmUp`]: a value to format, as most calls return one.
pub(super) const WARM_UP_AFTER_RESTORE: &str = "0";

/// Output and result caps of a warm-up call (bytes).
pub(super) const WARM_UP_CAP: usize = 1 << 10;

/// Where [`Zygote::fork_interpreters`] returns.
pub(super) enum Forked {
    /// In the zygote, done forking: it ends.
    ZygoteDone,
    /// In a forked child, confined and ready, with the kernel's record of the pages it
    /// writes where the kernel keeps one (`dirty_pages.rs`).
    Child(Option<DirtyPages>),
}

/// A worker started as the zygote ([`super::fork_server`]), once booted.
pub(super) struct Zygote<'a> {
    /// The control socket the front asks for forks on.
    pub control: OwnedFd,
    /// `/proc/self/status`, opened before Landlock: the zygote counts its threads there.
    pub proc_status: std::fs::File,
    /// The front's requests: none may be left unread when the zygote forks.
    pub input: &'a RefCell<FrontInput>,
}

impl Zygote<'_> {
    /// Warms up, says it booted (`report`; its confinement, `confined`, is not sealed: the
    /// zygote runs no user code), then forks workers until the front is done. Returns
    /// [`Forked::ZygoteDone`] in the zygote when done, and [`Forked::Child`] in each forked
    /// child, which has confined itself and said it is ready; only the children go on, each
    /// with its own stdin, stdout and stderr.
    ///
    /// Errors: the warm-up fails, unread input is left, or the fork server fails.
    pub(super) fn fork_interpreters(
        self,
        engine: &mut Engine,
        runner: &Runner,
        report: BootReport,
        confined: super::confine::Status,
    ) -> Result<Forked> {
        warm_up(engine, runner)?;
        keep_pristine(engine, runner)?;
        let version = report.version.clone();
        report.send(&confined, false)?;
        super::fork_server::check_drained(self.input.borrow().buffer().len())?;
        let kind = super::fork_server::ZygoteEngine::JavaScriptCore;
        let Some(forked) = super::fork_server::serve(self.control, &self.proc_status, kind)? else {
            return Ok(Forked::ZygoteDone);
        };
        drop(self.proc_status);
        // The page map is a file: opened before this child's own Landlock domain.
        let opened = DirtyPages::open();
        let mut confined = super::confine::enter_forked(confined, &super::confine::Domain::Worker)?;
        let dirty = track_writes(engine, runner, opened);
        if let Some(dirty) = &dirty {
            confined.allow_tracking(dirty.descriptors());
        }
        send_ready(BootReport::forked(version, forked.requested), confined)?;
        Ok(Forked::Child(dirty))
    }
}

/// Protects a forked child's linear memory so that the kernel records the pages it writes,
/// before anything has written them: `None` (checkpoints then compare the whole memory) when
/// the kernel cannot (`opened`'s error, or the arming's).
pub(super) fn track_writes(
    engine: &mut Engine,
    runner: &Runner,
    opened: Result<dirty_pages::Opened, dirty_pages::TrackingError>,
) -> Option<DirtyPages> {
    dirty_pages::armed_or_none(opened.and_then(|opened| {
        engine
            .with_bytes(&runner.memory, |memory| DirtyPages::arm(opened, memory))
            .map_err(dirty_pages::TrackingError::Memory)?
    }))
}
