//! The interpreter process's entry (`mcp-run-python __worker`, [`WORKER_COMMAND`]): one
//! JavaScriptCore context, one Pyodide, requests on stdin.
//!
//! It reads the boot frame, confines itself, boots Pyodide once, says [`Reply::Ready`], then
//! answers [`Request`]s until stdin closes (`serve.rs`); a zygote forks interpreters instead
//! (`zygote.rs`). It has no network and reads no host files: Pyodide's own files are embedded
//! in the binary (`src/assets.rs`) and package files arrive as frame attachments.
//!
//! [`WORKER_COMMAND`]: crate::protocol::launch::WORKER_COMMAND
//! [`Request`]: crate::protocol::Request

use super::boot::{boot, mount_files, read_boot, send_ready, BootReport};
use super::host_calls::attach_host;
use super::install::preinstall;
use super::reply::send;
use super::serve::{serve_requests, Serving};
use super::zygote::{Forked, Zygote};
use crate::protocol::launch::{Runtime, WorkerArgs};
use crate::protocol::{Reply, SnapshotMode};
use anyhow::{Context, Result};
use std::cell::RefCell;
use std::io::{self, BufReader};
use std::rc::Rc;
use std::time::Instant;

/// Runs the worker until stdin closes. Errors are also reported to the front as `Fatal`.
pub fn main(args: WorkerArgs) -> Result<()> {
    // Die with the front: a worker must never outlive the server that owns it.
    #[cfg(target_os = "linux")]
    // SAFETY: prctl with PR_SET_PDEATHSIG only sets a flag on this process.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    }
    let result = match args.runtime {
        Runtime::Pyodide => live(args),
        Runtime::Scientific => super::scientific::live(args),
    };
    if let Err(e) = &result {
        let reply = match e.downcast_ref::<super::confine::ConfineError>() {
            Some(strict @ super::confine::ConfineError::Strict { .. }) => Reply::Unconfined {
                reason: strict.to_string(),
            },
            _ => Reply::Fatal {
                error: format!("{e:#}"),
            },
        };
        let _ = send(&reply);
    }
    result
}

/// The worker's life: reads the boot frame, confines itself, boots Pyodide, and serves the
/// front's requests until stdin closes; a zygote forks workers instead, and each forked
/// child goes on serving.
///
/// Errors: the boot frame is not one, a confinement layer fails (`--confinement strict`), Pyodide
/// does not boot, or the front breaks the protocol.
pub(super) fn live(args: WorkerArgs) -> Result<()> {
    #[cfg(feature = "escape-test")]
    super::confine::request_escape_test(args.escape_test.as_deref());
    // Before Landlock, which forbids reading the library's files; only this runtime's
    // processes open it (`engine::open_library`).
    crate::engine::open_library()?;
    let control = super::fork_server::control_socket(args.control_fd)?;
    // The zygote counts its threads before each fork; the file is opened before Landlock.
    let proc_status = match control {
        Some(_) => {
            Some(std::fs::File::open("/proc/self/status").context("opening /proc/self/status")?)
        }
        None => None,
    };
    if control.is_some() {
        // Before the engine exists: its helper threads are made with it.
        crate::engine::configure_zygote();
    }
    let input = Rc::new(RefCell::new(BufReader::new(io::stdin().lock())));
    let Some(plan) = read_boot(&mut *input.borrow_mut(), args.snapshot_fd)? else {
        return Ok(());
    };
    // The second wall, part one: Landlock before the engine starts any thread (confine.rs).
    let domain = match control {
        Some(_) => super::confine::Domain::Zygote,
        None => super::confine::Domain::Worker,
    };
    let confined = super::confine::enter(args.confinement, &domain)?;
    let started = Instant::now();
    let (mut engine, runner, version, made) =
        boot(plan.mode, plan.snapshot, args.wasm_max_bytes())?;
    mount_files(&mut engine, &runner, plan.mount)?;
    let boot_ms = started.elapsed().as_millis() as u64;
    let host = attach_host(&mut engine, input.clone())?;
    let install_error = plan.install.and_then(|(install, files)| {
        let failed = preinstall(&mut engine, &runner, install, files).err()?;
        Some(format!("{failed:#}"))
    });
    let report = BootReport {
        version,
        boot_ms,
        restored: plan.mode == SnapshotMode::Load,
        made,
        install_error,
    };
    let (forked, dirty) = match (control, proc_status) {
        (Some(control), Some(proc_status)) => {
            let zygote = Zygote {
                control,
                proc_status,
                input: &input,
            };
            match zygote.fork_interpreters(&mut engine, &runner, report, confined)? {
                Forked::ZygoteDone => return Ok(()),
                Forked::Child(dirty) => (true, dirty),
            }
        }
        _ => {
            send_ready(report, confined)?;
            (false, None)
        }
    };
    #[cfg(feature = "escape-test")]
    super::confine::escape_test_if_requested();
    let mut worker = Serving {
        engine,
        runner,
        host,
        shadow: None,
        dirty,
    };
    serve_requests(&mut worker, &input, forked)
}
