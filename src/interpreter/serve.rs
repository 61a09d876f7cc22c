//! Serving the front's requests once booted: one handler per [`Request`] variant, as
//! Chromium's zygote has one per command; [`serve`] only dispatches. The handlers are the
//! runtime seam ([`Interpreter`], docs/architecture.md §5.4): Pyodide's are here ([`Serving`];
//! checkpoint, restore and reseed in `checkpoint.rs`), the scientific runtime's in
//! `scientific/`. The worker protocol, the loop and the scavenger are the same for both.

use super::dirty_pages::DirtyPages;
use super::files::{read_file, read_images};
use super::host_calls::{FrontInput, Host};
use super::install::install_packages;
use super::linear_memory::Shadow;
use super::outcome::{engine_outcome, failed_outcome};
use super::output::Running;
use super::reply::{send, send_with};
use super::runner::{call, parse_answer, Empty, RunArgs, Runner};
use super::scavenger::{Scavenger, Step};
use super::zygote::{zygote_run, WARM_UP_AFTER_RESTORE};
use crate::assets::UPLOAD_PATH;
use crate::engine::{Arg, Engine};
use crate::protocol::pages::ZygoteId;
use crate::protocol::{
    read_frame, CallId, Frame, FrameLimits, Reply, Request, RunOutcome, Uncapturable,
};
use anyhow::{bail, Result};
use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// `duration` in whole microseconds, saturated.
fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// Serves the front's requests until it closes the input or the code ends the interpreter.
/// `forked`: a worker forked by the zygote, whose allocator's scavenger stays suspended
/// until its first run is over.
///
/// Errors: the front breaks the protocol, or the pipes fail.
pub(super) fn serve_requests(
    worker: &mut impl Interpreter,
    input: &RefCell<FrontInput>,
    forked: bool,
) -> Result<()> {
    let mut scavenger = if forked {
        Scavenger::Suspended
    } else {
        Scavenger::Running
    };
    loop {
        let Some(frame) = read_frame::<Request>(&mut *input.borrow_mut(), FrameLimits::REQUEST)?
        else {
            return Ok(());
        };
        let step = match &frame.header {
            Request::Run {
                checkpoint_follows, ..
            } => Step::Ran {
                checkpoint_follows: *checkpoint_follows,
            },
            Request::Checkpoint { .. } => Step::Checkpointed,
            _ => Step::Other,
        };
        match serve(worker, frame)? {
            Served::Ended => return Ok(()),
            Served::Answered | Served::Ran => scavenger.after(step),
        }
    }
}

/// Sends `reply`, the whole answer to a request.
///
/// Errors: the reply cannot be sent.
pub(super) fn answered(reply: &Reply) -> Result<Served> {
    send(reply)?;
    Ok(Served::Answered)
}

/// How a request was served.
pub(super) enum Served {
    /// Answered; the worker goes on.
    Answered,
    /// A run answered; the worker goes on.
    Ran,
    /// The code ended the interpreter; its result was sent and the worker ends.
    Ended,
}

/// A booted worker serving the front's requests.
pub(super) struct Serving {
    /// The engine, with Pyodide booted in it.
    pub(super) engine: Engine,
    /// The runner's functions, kept by the host.
    pub(super) runner: Runner,
    /// What the engine's host calls reach: the front's input and the run in progress.
    pub(super) host: Rc<Host>,
    /// Forked interpreters: what linear memory held at the last checkpoint (made at the
    /// first checkpoint or restore).
    pub(super) shadow: Option<Shadow>,
    /// Forked interpreters where the kernel can say which pages were written since the last
    /// checkpoint; dropped (so that checkpoints compare every page) at its first error.
    pub(super) dirty: Option<DirtyPages>,
}

/// What an interpreter does for each request of the front, whichever runtime it runs: the
/// runtime seam (docs/architecture.md §5.4). A text error is the wire's own field (the reply's
/// `error`), worded by the runtime.
pub(super) trait Interpreter {
    /// [`Request::FindImports`]: the code's top-level imports that are packages to install.
    fn find_imports(&mut self, id: CallId, code: &str) -> Vec<String>;
    /// [`Request::ReadFile`]: sends [`Reply::File`] with the bytes, or why not.
    fn read_file(&mut self, id: CallId, path: &str, cap: usize) -> Result<Served>;
    /// [`Request::WriteFile`]: why the file was not written or removed, if it was not.
    fn write_file(
        &mut self,
        id: CallId,
        path: &str,
        delete: bool,
        bytes: Option<Vec<u8>>,
    ) -> Option<String>;
    /// [`Request::Install`]: why the packages were not installed, if they were not.
    fn install(
        &mut self,
        id: CallId,
        files: &[String],
        bytes: Vec<Vec<u8>>,
        items: &[String],
    ) -> Option<String>;
    /// [`Request::Checkpoint`]: sends [`Reply::Checkpoint`].
    fn checkpoint(&mut self, id: CallId) -> Result<Served>;
    /// Why the interpreter's state cannot be captured now (empty: it can): what a checkpoint
    /// would answer instead of pages, checked without taking one.
    fn uncapturable(&mut self) -> Vec<Uncapturable>;
    /// [`Request::Restore`]: why the state was not restored, if it was not.
    fn restore(
        &mut self,
        id: CallId,
        zygote: ZygoteId,
        memory_bytes: u64,
        reseed: bool,
        attachments: Vec<Vec<u8>>,
    ) -> Option<String>;
    /// [`Request::Reseed`]: why not, if the next run will not reseed.
    fn reseed(&mut self, id: CallId) -> Option<String>;
    /// [`Request::WarmUp`]: why the warm-up call failed, if it did.
    fn warm_up(&mut self, id: CallId) -> Option<String>;
    /// [`Request::Run`]: runs the code and sends [`Reply::Ran`] with the images it made (at
    /// most `image_cap` bytes each), and with `checkpoint_follows` whether its state can be
    /// captured ([`RunOutcome::uncapturable`], through [`send_ran`]).
    fn run(&mut self, id: CallId, run: RunArgs<'_>, reply: RanReply) -> Result<Served>;
}

/// Serves one request of the front on `interpreter`, sending its answer: only dispatches, to
/// the handler of the request's variant. A request that only comes as the answer to a host
/// call, or the boot, is out of order here.
///
/// Errors: a request out of order; the answer cannot be sent.
pub(super) fn serve(interpreter: &mut impl Interpreter, frame: Frame<Request>) -> Result<Served> {
    let Frame {
        header,
        attachments,
    } = frame;
    match header {
        Request::FetchResult { .. } | Request::ToolResult { .. } | Request::Boot { .. } => {
            bail!("the front sent a request out of order")
        }
        Request::Ping { id } => answered(&Reply::Pong { id }),
        Request::FindImports { id, code } => {
            let names = interpreter.find_imports(id, &code);
            answered(&Reply::Imports { id, names })
        }
        Request::ReadFile { id, path, cap } => interpreter.read_file(id, &path, cap),
        Request::WriteFile { id, path, delete } => {
            let bytes = attachments.into_iter().next();
            let error = interpreter.write_file(id, &path, delete, bytes);
            answered(&Reply::File { id, error })
        }
        Request::Install { id, files, items } => {
            let error = interpreter.install(id, &files, attachments, &items);
            answered(&Reply::Installed { id, error })
        }
        Request::Checkpoint { id } => interpreter.checkpoint(id),
        Request::Reseed { id } => {
            let error = interpreter.reseed(id);
            answered(&Reply::Reseeded { id, error })
        }
        Request::WarmUp { id } => {
            let error = interpreter.warm_up(id);
            answered(&Reply::WarmedUp { id, error })
        }
        Request::Restore {
            id,
            zygote,
            memory_bytes,
            reseed,
        } => {
            let error = interpreter.restore(id, zygote, memory_bytes, reseed, attachments);
            answered(&Reply::Restored { id, error })
        }
        Request::Run {
            id,
            code,
            globals,
            output_cap,
            result_cap,
            keep_globals,
            image_cap,
            tools,
            network,
            checkpoint_follows,
        } => {
            let run = RunArgs {
                code: &code,
                globals: &serde_json::to_string(&globals)?,
                output_cap,
                result_cap,
                keep_globals,
                tools: tools.map(|t| t.to_string()),
                network: network.map(|n| serde_json::to_string(&n)).transpose()?,
            };
            let reply = RanReply {
                image_cap,
                checkpoint_follows,
            };
            interpreter.run(id, run, reply)
        }
    }
}

/// What [`Reply::Ran`] carries besides the outcome, as [`Request::Run`] asked.
#[derive(Clone, Copy)]
pub(super) struct RanReply {
    /// Most bytes of each image sent.
    pub(super) image_cap: usize,
    /// The front takes a checkpoint next: the reply says whether the state can be captured.
    pub(super) checkpoint_follows: bool,
}

/// Sends `outcome`, the run of call `id` begun at `started`, with the images it made, each read
/// by `read` (at most `reply.image_cap` bytes): [`Served::Ran`]. The outcome carries the time
/// since `started` ([`RunOutcome::worker_us`]) and, when `reply.checkpoint_follows`, what
/// [`Interpreter::uncapturable`] says once the images are read ([`RunOutcome::uncapturable`]; whatever the
/// runtime's own answer said there is replaced). An outcome that ended the interpreter
/// (os._exit, os.abort, a fatal runtime error) is sent alone, as the call's result, and the
/// worker stops ([`Served::Ended`]); the front starts a new one.
///
/// Errors: the reply cannot be sent.
pub(super) fn send_ran<W: Interpreter>(
    worker: &mut W,
    id: CallId,
    (mut outcome, started): (RunOutcome, Instant),
    reply: RanReply,
    mut read: impl FnMut(&mut W, &str, usize) -> Option<Vec<u8>>,
) -> Result<Served> {
    outcome.uncapturable = None;
    outcome.worker_us = micros(started.elapsed());
    if outcome.fatal {
        send(&Reply::Ran { id, outcome })?;
        return Ok(Served::Ended);
    }
    let images = read_images(&mut outcome, reply.image_cap, |path, cap| {
        read(worker, path, cap)
    });
    if reply.checkpoint_follows {
        outcome.uncapturable = Some(worker.uncapturable());
    }
    let attachments: Vec<&[u8]> = images.iter().map(Vec::as_slice).collect();
    send_with(&Reply::Ran { id, outcome }, &attachments)?;
    Ok(Served::Ran)
}

/// Sends [`Reply::File`] for call `id`: the file's bytes as its attachment, or why not.
///
/// Errors: the reply cannot be sent.
pub(super) fn send_file(
    id: CallId,
    read: Result<Vec<u8>, impl std::fmt::Display>,
) -> Result<Served> {
    match read {
        Ok(bytes) => {
            send_with(&Reply::File { id, error: None }, &[&bytes])?;
            Ok(Served::Answered)
        }
        Err(error) => answered(&Reply::File {
            id,
            error: Some(error.to_string()),
        }),
    }
}

impl Interpreter for Serving {
    /// The code's top-level imports that are packages. A scanner that fails (user code may
    /// have broken its own interpreter's modules) finds nothing; the code then runs without
    /// installs.
    fn find_imports(&mut self, id: CallId, code: &str) -> Vec<String> {
        call(
            &mut self.engine,
            &self.runner.find_imports,
            id,
            &[Arg::Str(code)],
            None,
        )
        .ok()
        .and_then(|text| parse_answer::<Vec<String>>(&text).ok())
        .unwrap_or_default()
    }

    fn read_file(&mut self, id: CallId, path: &str, cap: usize) -> Result<Served> {
        let file_in = &self.host.file_in;
        send_file(
            id,
            read_file(&mut self.engine, &self.runner, file_in, id, path, cap),
        )
    }

    /// `bytes` written to `path` under the working directory through the upload file, or the
    /// file removed with `delete`.
    fn write_file(
        &mut self,
        id: CallId,
        path: &str,
        delete: bool,
        bytes: Option<Vec<u8>>,
    ) -> Option<String> {
        if let Some(bytes) = bytes {
            self.engine.add_file(UPLOAD_PATH, bytes);
        }
        let args = [Arg::Str(path), Arg::Bool(delete)];
        let written = call(&mut self.engine, &self.runner.write_file, id, &args, None);
        self.engine.clear_files();
        match written {
            Ok(text) => parse_answer::<Empty>(&text).err().map(|e| e.to_string()),
            Err(e) => Some(e.to_string()),
        }
    }

    fn install(
        &mut self,
        id: CallId,
        files: &[String],
        bytes: Vec<Vec<u8>>,
        items: &[String],
    ) -> Option<String> {
        let (engine, runner) = (&mut self.engine, &self.runner);
        let installed = install_packages(engine, runner, id, files, bytes, items, &[], None);
        installed.err().map(|e| e.to_string())
    }

    fn checkpoint(&mut self, id: CallId) -> Result<Served> {
        Serving::checkpoint(self, id)
    }

    fn uncapturable(&mut self) -> Vec<Uncapturable> {
        Serving::uncapturable(self)
    }

    fn restore(
        &mut self,
        id: CallId,
        zygote: ZygoteId,
        memory_bytes: u64,
        reseed: bool,
        attachments: Vec<Vec<u8>>,
    ) -> Option<String> {
        Serving::restore(self, id, zygote, memory_bytes, reseed, attachments)
    }

    fn reseed(&mut self, id: CallId) -> Option<String> {
        Serving::reseed(self, id)
    }

    fn warm_up(&mut self, _id: CallId) -> Option<String> {
        zygote_run(&mut self.engine, &self.runner, WARM_UP_AFTER_RESTORE)
            .err()
            .map(|e| format!("{e:#}"))
    }

    fn run(&mut self, id: CallId, run: RunArgs<'_>, reply: RanReply) -> Result<Served> {
        let started = Instant::now();
        *self.host.running.borrow_mut() = Running {
            id: Some(id),
            output_cap: run.output_cap,
        };
        let answer = call(&mut self.engine, &self.runner.run, id, &run.args(), None);
        self.host.running.borrow_mut().id = None;
        let outcome = match answer {
            Ok(text) => parse_answer::<RunOutcome>(&text).unwrap_or_else(failed_outcome),
            Err(e) => engine_outcome(&e),
        };
        send_ran(self, id, (outcome, started), reply, |serving, path, cap| {
            let file_in = &serving.host.file_in;
            read_file(&mut serving.engine, &serving.runner, file_in, id, path, cap).ok()
        })
    }
}
