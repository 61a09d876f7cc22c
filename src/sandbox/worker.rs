//! The front's handle on one sandbox worker process.

use super::net::NetPolicy;
use super::protocol::{
    read_frame_async, write_frame_async, Frame, Reply, Request, RunOutcome, SnapshotMode, Stream,
};
use std::collections::HashSet;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;
use tokio::io::BufReader;
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// How long a worker may take to boot Pyodide (seconds); a debug build on a busy machine
/// is the slow case.
pub const BOOT_TIMEOUT: Duration = Duration::from_secs(240);

/// Why talking to a worker failed. After any of these the worker is discarded.
#[derive(Debug, Error)]
pub enum WorkerError {
    #[error("could not start the sandbox worker: {0}")]
    Spawn(std::io::Error),
    #[error("the sandbox worker failed to boot Pyodide: {0}")]
    Boot(String),
    #[error("the sandbox worker did not boot within {0} s")]
    BootTimeout(u64),
    #[error("the sandbox worker stopped unexpectedly{0}")]
    Died(String),
    #[error("the sandbox worker was stopped from outside while booting{0}")]
    Stopped(String),
    #[error("the sandbox worker sent an unexpected message: {0}")]
    Protocol(String),
}

/// A running worker that has booted Pyodide.
pub struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// Normalized names of the packages installed in this worker.
    pub installed: HashSet<String>,
}

impl Worker {
    /// Starts `exe __worker <args>` and waits for Pyodide to boot, restoring `snapshot` when
    /// given, or else making one when `make_snapshot`. Returns the worker and the snapshot it
    /// made, if any.
    ///
    /// Errors: [`WorkerError::Spawn`], [`WorkerError::Boot`], [`WorkerError::BootTimeout`].
    pub async fn spawn(
        exe: &Path,
        args: &[String],
        snapshot: Option<Arc<Vec<u8>>>,
        make_snapshot: bool,
    ) -> Result<(Worker, Option<Vec<u8>>), WorkerError> {
        let mut child = Command::new(exe)
            .arg("__worker")
            .args(args)
            // The worker gets no host environment beyond what logging needs.
            .env_clear()
            .envs(std::env::var("RUST_LOG").ok().map(|v| ("RUST_LOG", v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(WorkerError::Spawn)?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(WorkerError::Protocol("worker pipes missing".into()));
        };
        let mut worker = Worker {
            child,
            stdin,
            stdout: BufReader::new(stdout),
            installed: HashSet::new(),
        };
        let (mode, attachments) = match (snapshot, make_snapshot) {
            (Some(bytes), _) => (SnapshotMode::Load, vec![bytes.as_ref().clone()]),
            (None, true) => (SnapshotMode::Make, Vec::new()),
            (None, false) => (SnapshotMode::None, Vec::new()),
        };
        let booted = async {
            worker
                .send(&Request::Boot { snapshot: mode }, &attachments)
                .await?;
            worker.next_frame().await
        };
        let ready = tokio::time::timeout(BOOT_TIMEOUT, booted).await;
        match ready {
            Err(_) => {
                worker.kill().await;
                Err(WorkerError::BootTimeout(BOOT_TIMEOUT.as_secs()))
            }
            Ok(Err(e)) => {
                let stopped_from_outside = worker.stopped_from_outside();
                worker.kill().await;
                Err(match e {
                    WorkerError::Died(why) if stopped_from_outside => WorkerError::Stopped(why),
                    WorkerError::Died(why) => WorkerError::Boot(format!("the worker exited{why}")),
                    e => e,
                })
            }
            Ok(Ok(Frame {
                header:
                    Reply::Ready {
                        boot_ms,
                        pyodide_version,
                        restored,
                    },
                attachments,
            })) => {
                let how = if restored {
                    " from a memory snapshot"
                } else {
                    ""
                };
                tracing::info!(
                    "sandbox worker ready: Pyodide {pyodide_version} booted{how} in {boot_ms} ms"
                );
                Ok((worker, attachments.into_iter().next()))
            }
            Ok(Ok(Frame {
                header: Reply::Fatal { error },
                ..
            })) => {
                worker.kill().await;
                Err(WorkerError::Boot(error))
            }
            Ok(Ok(other)) => {
                worker.kill().await;
                Err(WorkerError::Protocol(format!("{:?}", other.header)))
            }
        }
    }

    async fn next_reply(&mut self) -> Result<Reply, WorkerError> {
        Ok(self.next_frame().await?.header)
    }

    async fn next_frame(&mut self) -> Result<Frame<Reply>, WorkerError> {
        match read_frame_async::<Reply>(&mut self.stdout).await {
            Ok(Some(frame)) => Ok(frame),
            Ok(None) => Err(WorkerError::Died(self.exit_reason().await)),
            Err(e) => Err(WorkerError::Died(format!(": {e}"))),
        }
    }

    /// Whether the process was ended by a signal that comes from outside (a shutdown or an
    /// operator), rather than failing by itself.
    fn stopped_from_outside(&mut self) -> bool {
        use std::os::unix::process::ExitStatusExt;
        matches!(
            self.child
                .try_wait()
                .ok()
                .flatten()
                .and_then(|s| s.signal()),
            Some(libc::SIGTERM | libc::SIGKILL | libc::SIGINT | libc::SIGHUP)
        )
    }

    async fn exit_reason(&mut self) -> String {
        match tokio::time::timeout(Duration::from_secs(2), self.child.wait()).await {
            Ok(Ok(status)) => format!(" ({status})"),
            _ => String::new(),
        }
    }

    async fn send(
        &mut self,
        request: &Request,
        attachments: &[Vec<u8>],
    ) -> Result<(), WorkerError> {
        if let Err(e) = write_frame_async(&mut self.stdin, request, attachments).await {
            let why = self.exit_reason().await;
            return Err(WorkerError::Died(if why.is_empty() {
                format!(": {e}")
            } else {
                why
            }));
        }
        Ok(())
    }

    /// Top-level imports of `code`, minus the standard library.
    pub async fn find_imports(&mut self, code: &str) -> Result<Vec<String>, WorkerError> {
        self.send(
            &Request::FindImports {
                code: code.to_owned(),
            },
            &[],
        )
        .await?;
        match self.next_reply().await? {
            Reply::Imports { names } => Ok(names),
            other => Err(unexpected(other)),
        }
    }

    /// Hands `files` (virtual path, bytes) to the worker and loads `items` with
    /// `pyodide.loadPackage`. `Ok(Some(reason))` when Pyodide reported a failure.
    pub async fn install(
        &mut self,
        files: Vec<(String, Vec<u8>)>,
        items: Vec<String>,
    ) -> Result<Option<String>, WorkerError> {
        let (paths, bytes): (Vec<String>, Vec<Vec<u8>>) = files.into_iter().unzip();
        self.send(
            &Request::Install {
                files: paths,
                items,
            },
            &bytes,
        )
        .await?;
        match self.next_reply().await? {
            Reply::Installed { error } => Ok(error),
            other => Err(unexpected(other)),
        }
    }

    /// Runs `code`; each output line is passed to `on_output` as it arrives.
    pub async fn run(
        &mut self,
        code: &str,
        globals: serde_json::Map<String, serde_json::Value>,
        output_cap: usize,
        net: &NetPolicy,
        on_output: &mut (dyn FnMut(Stream, String) + Send),
    ) -> Result<RunOutcome, WorkerError> {
        let request = Request::Run {
            code: code.to_owned(),
            globals,
            output_cap,
        };
        self.send(&request, &[]).await?;
        loop {
            let frame = self.next_frame().await?;
            match frame.header {
                Reply::Fetch { request } => {
                    let body = frame.attachments.into_iter().next().unwrap_or_default();
                    let (response, body) = net.fetch(&request, body).await;
                    self.send(&Request::FetchResult { response }, &[body])
                        .await?;
                }
                Reply::Output { lines } => {
                    for (stream, text) in lines {
                        on_output(stream, text);
                    }
                }
                Reply::Ran(outcome) => return Ok(outcome),
                Reply::Fatal { error } => return Err(WorkerError::Died(format!(": {error}"))),
                other => return Err(unexpected(other)),
            }
        }
    }

    /// The worker's process id, if it is still running.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Resident memory of the worker process (bytes), read from `/proc/<pid>/statm`.
    pub fn resident_bytes(&self) -> Option<u64> {
        resident_bytes(self.pid()?)
    }

    /// Kills the process and reaps it.
    pub async fn kill(mut self) {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
    }
}

fn unexpected(reply: Reply) -> WorkerError {
    match reply {
        Reply::Fatal { error } => WorkerError::Died(format!(": {error}")),
        other => WorkerError::Protocol(format!("{other:?}")),
    }
}

/// Resident memory (bytes) of process `pid` from `/proc/<pid>/statm` (Linux); `None` elsewhere.
pub fn resident_bytes(pid: u32) -> Option<u64> {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).unwrap_or(4096))
}
