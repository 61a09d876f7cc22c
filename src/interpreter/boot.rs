//! Booting Pyodide in a new engine: the boot frame and what it asks, the memory snapshot made
//! or restored, the runner loaded, the `--mount` files written, and the [`Reply::Ready`] that
//! ends the boot once the interpreter is sealed.

use super::descriptors::inherited_descriptor;
use super::host_calls::{HostCallError, HostRequest};
use super::reply::{send_with, SendError};
use super::runner::{call, parse_answer, Booted, Empty, Runner};
use crate::assets::{
    runner_constants, BOOTSTRAP_JS, HTTP_BRIDGE_PY, MCP_TOOLS_PY, MOUNT_PATH, PYODIDE, RUNNER_JS,
    RUNNER_PY, WORKDIR,
};
use crate::engine::{Arg, CallError, Engine, MappedFile};
use crate::protocol::launch::SNAPSHOT_FD_ARG;
use crate::protocol::{
    read_frame, BootAttachments, BootInstall, CallId, FrameLimits, MountPlan, Reply, Request,
    SnapshotMode, MAX_SNAPSHOT_BYTES,
};
use anyhow::{anyhow, bail, Context, Result};
use std::cell::RefCell;
use std::io::{self};
use std::os::fd::RawFd;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// The call id of the boot, which comes before any call of the front.
pub(super) const BOOT_CALL: CallId = 0;

/// How long booting Pyodide may take before the worker gives up (seconds).
pub(super) const BOOT_TIMEOUT: Duration = Duration::from_secs(180);

/// Maps the memory snapshot the front handed over as `fd` ([`SNAPSHOT_FD_ARG`]), and closes that
/// descriptor (the mapping stays): nothing of the file is left to reach once user code runs.
///
/// Errors: the argument is missing or names no open descriptor; the file cannot be mapped.
pub(super) fn map_snapshot(fd: Option<RawFd>) -> Result<MappedFile> {
    let fd = inherited_descriptor(SNAPSHOT_FD_ARG, fd)?
        .ok_or_else(|| anyhow!("a snapshot to restore, but no {SNAPSHOT_FD_ARG}"))?;
    let file = std::fs::File::from(fd);
    MappedFile::map(&file, MAX_SNAPSHOT_BYTES as u64).context("mapping the memory snapshot")
}

/// Boots Pyodide in a new engine (`mode`: plainly, making a memory snapshot, or restoring
/// `snapshot`; WebAssembly memory capped at `wasm_max_bytes`): the engine, the runner's
/// functions, Pyodide's version and the snapshot made, if any.
///
/// Errors: the engine cannot be made, an embedded script fails, or Pyodide does not boot
/// within [`BOOT_TIMEOUT`].
pub(super) fn boot(
    mode: SnapshotMode,
    snapshot: Option<MappedFile>,
    wasm_max_bytes: Option<u64>,
) -> Result<(Engine, Runner, String, Option<Vec<u8>>)> {
    let mut engine = Engine::new()?;
    if let Some(mapped) = snapshot {
        engine.add_mapped_file("/snapshot.bin", mapped);
    }
    let made = catch_snapshot(&mut engine);
    for file in PYODIDE.files() {
        let name = file.path().to_string_lossy();
        engine.add_static_file(&format!("/pyodide/{name}"), file.contents());
    }
    let runner = load_runner(&mut engine)?;
    let version = boot_runner(&mut engine, &runner, mode, wasm_max_bytes)?;
    engine.clear_files();
    let snapshot = made.borrow_mut().take();
    Ok((engine, runner, version, snapshot))
}

/// Answers the host calls made while booting: only the memory snapshot Pyodide makes (with
/// [`SnapshotMode::Make`]), which lands in the returned cell.
pub(super) fn catch_snapshot(engine: &mut Engine) -> Rc<RefCell<Option<Vec<u8>>>> {
    let made: Rc<RefCell<Option<Vec<u8>>>> = Rc::default();
    let made_in = made.clone();
    engine.set_call_handler(Box::new(
        move |json: &str, bytes: Vec<u8>| match serde_json::from_str::<HostRequest>(json) {
            Ok(HostRequest::Snapshot) => {
                *made_in.borrow_mut() = Some(bytes);
                Ok(("{}".to_owned(), Vec::new()))
            }
            _ => Err(CallError::from(HostCallError::WhileBooting)),
        },
    ));
    made
}

/// Evaluates the bootstrap, Pyodide's scripts and the runner (`runtime/js/runner.js`) in `engine`, and
/// keeps the runner's functions.
///
/// Errors: an embedded script is missing or fails.
pub(super) fn load_runner(engine: &mut Engine) -> Result<Runner> {
    let text = |name: &str| -> Result<&'static str> {
        PYODIDE
            .get_file(name)
            .and_then(|f| f.contents_utf8())
            .ok_or_else(|| anyhow!("embedded asset {name} is missing"))
    };
    engine.eval(BOOTSTRAP_JS, "mcp:bootstrap.js")?;
    engine.eval(text("pyodide.js")?, "/pyodide/pyodide.js")?;
    engine.eval(text("pyodide.asm.mjs")?, "/pyodide/pyodide.asm.mjs")?;
    let mut functions = engine
        .eval_functions(
            RUNNER_JS,
            "mcp:runner.js",
            &[
                "boot",
                "findImports",
                "install",
                "run",
                "reseed",
                "readFile",
                "writeFile",
                "mount",
                "memory",
                "baseline",
                "capturable",
                "grow",
            ],
        )?
        .into_iter();
    let mut next = || {
        functions
            .next()
            .ok_or_else(|| anyhow!("runner.js is incomplete"))
    };
    Ok(Runner {
        boot: next()?,
        find_imports: next()?,
        install: next()?,
        run: next()?,
        reseed: next()?,
        read_file: next()?,
        write_file: next()?,
        mount: next()?,
        memory: next()?,
        baseline: next()?,
        capturable: next()?,
        grow: next()?,
    })
}

/// Boots Pyodide through the runner's `boot` (`mode`: how, as the front asked; memory capped at
/// `wasm_max_bytes`), within [`BOOT_TIMEOUT`]: Pyodide's version.
///
/// Errors: the boot failed or took too long ("booting Pyodide").
pub(super) fn boot_runner(
    engine: &mut Engine,
    runner: &Runner,
    mode: SnapshotMode,
    wasm_max_bytes: Option<u64>,
) -> Result<String> {
    let env =
        serde_json::json!({"HOME": WORKDIR, "USER": "pyodide", "LANG": "C.UTF-8"}).to_string();
    let constants = runner_constants();
    let deadline = Some(Instant::now() + BOOT_TIMEOUT);
    let answer = call(
        engine,
        &runner.boot,
        BOOT_CALL,
        &[
            Arg::Str(RUNNER_PY),
            Arg::Str(MCP_TOOLS_PY),
            Arg::Str(HTTP_BRIDGE_PY),
            Arg::Str(&constants),
            Arg::Str(&env),
            wasm_max_bytes.map_or(Arg::Null, |b| Arg::Num(b as f64)),
            Arg::Str(match mode {
                SnapshotMode::None => "none",
                SnapshotMode::Make => "make",
                SnapshotMode::Load => "load",
            }),
        ],
        deadline,
    )
    .context("booting Pyodide")?;
    let booted: Booted = parse_answer(&answer).context("booting Pyodide")?;
    Ok(booted.version)
}

/// Writes the operator's `--mount` files into the interpreter's file system, read-only
/// (`runtime/js/runner.js` `mount`): `bytes` holds the plan's files one after another.
pub(super) fn mount_files(
    engine: &mut Engine,
    runner: &Runner,
    mount: (MountPlan, Vec<u8>),
) -> Result<()> {
    let (plan, bytes) = mount;
    if plan.is_empty() {
        return Ok(());
    }
    engine.add_file(MOUNT_PATH, bytes);
    let json = serde_json::to_string(&plan)?;
    let deadline = Some(Instant::now() + BOOT_TIMEOUT);
    let answer = call(
        engine,
        &runner.mount,
        BOOT_CALL,
        &[Arg::Str(&json)],
        deadline,
    )
    .context("mounting --mount files")?;
    engine.clear_files();
    parse_answer::<Empty>(&answer).context("mounting --mount files")?;
    Ok(())
}

/// What the boot frame asks: how to boot, the snapshot to restore, the `--mount` files with
/// their bytes, and the `--deps` to install with their files' bytes.
pub(super) struct BootPlan {
    pub mode: SnapshotMode,
    pub snapshot: Option<MappedFile>,
    pub mount: (MountPlan, Vec<u8>),
    pub install: Option<(BootInstall, Vec<Vec<u8>>)>,
}

/// Reads the boot frame; `None` when the front closed the input first. Its attachments are
/// the mount's bytes (one, when `mount` is not empty), then one per install file; a restore
/// maps the snapshot handed over as `snapshot_fd`.
pub(super) fn read_boot(
    input: &mut impl io::Read,
    snapshot_fd: Option<RawFd>,
) -> Result<Option<BootPlan>> {
    let Some(frame) = read_frame::<Request>(input, FrameLimits::REQUEST)? else {
        return Ok(None);
    };
    let Request::Boot {
        snapshot: mode,
        mount,
        install,
    } = frame.header
    else {
        bail!("the first request must be `boot`");
    };
    let snapshot = match mode {
        SnapshotMode::Load => Some(map_snapshot(snapshot_fd)?),
        SnapshotMode::None | SnapshotMode::Make => None,
    };
    let install_files = install.as_ref().map_or(0, |i| i.files.len());
    let layout = BootAttachments::from_frame(frame.attachments, !mount.is_empty(), install_files)?;
    let bytes = layout.mount.unwrap_or_default();
    if !mount.fits(&bytes) {
        bail!("the mounted files do not match their bytes");
    }
    let install = install.map(|install| (install, layout.install));
    Ok(Some(BootPlan {
        mode,
        snapshot,
        mount: (mount, bytes),
        install,
    }))
}

/// What a worker tells the front once booted ([`Reply::Ready`]), but its confinement.
pub(super) struct BootReport {
    /// Pyodide's version.
    pub version: String,
    /// How long the boot took (milliseconds; for a forked worker, the fork).
    pub boot_ms: u64,
    /// Whether the interpreter was restored from a memory snapshot (or forked from one).
    pub restored: bool,
    /// The memory snapshot the boot made, if any (sent as attachment 0).
    pub made: Option<Vec<u8>>,
    /// Why `--deps` did not install as it booted, if they did not.
    pub install_error: Option<String>,
}

impl BootReport {
    /// The report of a child forked from a zygote that booted `version`, whose fork was
    /// `requested` then: nothing made, nothing installed.
    pub(super) fn forked(version: String, requested: Instant) -> BootReport {
        BootReport {
            version,
            boot_ms: requested.elapsed().as_millis() as u64,
            restored: true,
            made: None,
            install_error: None,
        }
    }

    /// Sends [`Reply::Ready`] with this report and the confinement as `confined` has it
    /// (`all_on`: whether every layer is on, as far as the front is told).
    ///
    /// Errors: [`SendError`].
    pub(super) fn send(
        self,
        confined: &super::confine::Status,
        all_on: bool,
    ) -> Result<(), SendError> {
        send_with(
            &Reply::Ready {
                pyodide_version: self.version,
                boot_ms: self.boot_ms,
                restored: self.restored,
                confinement: super::confine::describe(confined),
                confined: all_on,
                install_error: self.install_error,
            },
            &self.made.as_deref().into_iter().collect::<Vec<_>>(),
        )
    }
}

/// Seals the worker (seccomp, limits) and tells the front it is ready, with the memory
/// snapshot it made, if any. Ready only once sealed: the front hands out no worker that is not
/// yet confined.
pub(super) fn send_ready(report: BootReport, confined: super::confine::Status) -> Result<()> {
    // The second wall, part two: seccomp and limits on every thread before the first call.
    let confined = super::confine::seal(confined)?;
    let all_on = confined.all_on();
    Ok(report.send(&confined, all_on)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `runtime/js/bootstrap.js` grows WebAssembly tables with room ahead while Pyodide boots:
    /// JavaScript must still see exactly the indexes, lengths and bounds a plain table has (a
    /// memory snapshot holds the indexes Emscripten handed out), until the room is ended.
    #[test]
    fn tables_grown_with_room_look_exactly_grown() {
        let mut engine = Engine::new().expect("an engine");
        engine
            .eval(BOOTSTRAP_JS, "mcp:bootstrap.js")
            .expect("bootstrap");
        let checks = r#"
            const bytes = new Uint8Array([0,97,115,109,1,0,0,0,1,4,1,96,0,0,3,2,1,0,7,5,1,1,102,0,0,10,4,1,2,0,11]);
            const f = new WebAssembly.Instance(new WebAssembly.Module(bytes)).exports.f;
            const rangeError = (thunk) => { try { thunk(); return false; } catch (e) { return e instanceof RangeError; } };
            const t = new WebAssembly.Table({ initial: 3, element: "anyfunc" });
            const out = [];
            for (let i = 0; i < 5; i++) out.push(t.grow(1));
            out.push(t.length, rangeError(() => t.get(8)), rangeError(() => t.set(8, f)), t.get(7));
            t.set(7, f);
            out.push(t.get(7) === f, t.grow(2, f), t.length, t.get(9) === f, t.get(10 - 1) === f);
            const capped = new WebAssembly.Table({ initial: 2, maximum: 3, element: "anyfunc" });
            out.push(capped.grow(1), rangeError(() => capped.grow(1)), capped.length);
            // Once the boot is done the plain methods are back and the room is plain entries.
            globalThis.__mcpHost.endTableRoom();
            const native = ["grow", "get", "set"].every((m) => String(WebAssembly.Table.prototype[m]).includes("[native code]"));
            out.push(native, t.length, t.grow(1), t.get(11));
            JSON.stringify(out)
        "#;
        let got = engine.eval(checks, "mcp:test.js").expect("the checks");
        assert_eq!(
            got,
            "[3,4,5,6,7,8,true,true,null,true,8,10,true,true,2,true,3,true,12,12,null]"
        );
    }
}
