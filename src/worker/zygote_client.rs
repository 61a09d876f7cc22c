//! The front's side of the fork server (the zygote, docs/architecture.md §3): one zygote process boots Pyodide once and
//! forks a fresh, confined worker each time the front asks for one, in milliseconds
//! instead of the ~0.9 s of a snapshot restore. The protocol and the zygote's side are in
//! `src/interpreter/fork_server.rs`; the reasons and measurements in `docs/fork-server-research.md`.
//!
//! The zygote is trusted no more than any worker for what it sends: the only thing the front
//! takes from it is a pid and a pidfd per fork, and the forked child is then a worker
//! like any other (its `Ready` frame, its pipes, its deadlines). It never runs user code.

use super::client::{BootRequest, Preinstall, Worker, WorkerError};
use super::mount::Mounts;
use super::process::Process;
use crate::protocol::control::{self, Control, ControlError, Message};
use crate::protocol::launch::{CONTROL_FD_ARG, SCRATCH_ARG};
use crate::protocol::SnapshotMode;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use thiserror::Error;

/// How long a zygote may take from booted to forkable (seconds): its idle engine threads end
/// after about 10 s (`src/interpreter/fork_server.rs` waits up to 60 s for them).
const FORKABLE_TIMEOUT: Duration = Duration::from_secs(90);

/// How long the zygote may take to answer one fork request (seconds); a fork takes about a
/// millisecond.
const FORK_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the zygote could not be started or could not fork.
#[derive(Debug, Error)]
pub enum ZygoteError {
    #[error("creating the zygote's control socket or a worker's pipes failed")]
    Io(#[source] nix::Error),
    #[error("the zygote did not boot")]
    Boot(#[source] WorkerError),
    #[error("the zygote's control socket failed")]
    Control(#[source] ControlError),
    #[error("the zygote did not answer within {} s", .0.as_secs())]
    Timeout(Duration),
    #[error("the zygote closed its control socket")]
    Closed,
    #[error("the zygote refused to fork: {0}")]
    Refused(String),
    #[error("the zygote sent {0:?} where it should not")]
    Unexpected(Control),
    #[error("a forked interpreter could not be set up")]
    Setup(#[source] std::io::Error),
    #[error("a forked interpreter did not get ready")]
    Ready(#[source] WorkerError),
}

impl ZygoteError {
    /// Whether the control socket can no longer be trusted (it failed, closed, timed out or
    /// carried something unexpected), as against a zygote that answered and refused, or a
    /// forked child that did not get ready. Through the zygote service, only the former ends
    /// the connection, which the workers already forked through it live by.
    pub fn ends_connection(&self) -> bool {
        match self {
            ZygoteError::Io(_)
            | ZygoteError::Control(_)
            | ZygoteError::Timeout(_)
            | ZygoteError::Closed
            | ZygoteError::Unexpected(_) => true,
            ZygoteError::Boot(_)
            | ZygoteError::Refused(_)
            | ZygoteError::Setup(_)
            | ZygoteError::Ready(_) => false,
        }
    }
}

/// A running zygote that serves fork requests: this process's own, or the per-host service's
/// (`zygote_service/`), which relays the same fork requests to its own zygote.
pub struct Zygote {
    /// Whose zygote it is.
    owner: Owner,
    /// The front's end of the control socket (to its own zygote, or its connection to the
    /// service); one fork request at a time.
    control: Arc<Mutex<OwnedFd>>,
    /// The packages the zygote installed as it booted (`--deps`), which every worker it
    /// forks has: normalized name → version.
    installed: HashMap<String, String>,
    /// A scientific zygote's: where each child's scratch folder is made (the zygote's own is
    /// beside them), sent with [`Control::ForkInto`]; `None` for Pyodide's.
    scratch_root: Option<PathBuf>,
}

/// Whose zygote a [`Zygote`] is.
enum Owner {
    /// This process started it: the zygote process (killed when this is dropped; its
    /// children die with it).
    Own(Box<Mutex<Option<Worker>>>),
    /// The per-host service (`zygote_service/`) at `socket`, whose process is `pid`.
    Service {
        pid: u32,
        socket: std::path::PathBuf,
    },
}

/// Longest single wait of [`receive_within`] (milliseconds): `poll` takes at most a `u16`.
const POLL_SLICE_MS: u16 = 1000;

/// Waits until `control` has a message, for at most `timeout`, then reads it.
fn receive_within(control: &OwnedFd, timeout: Duration) -> Result<Message, ZygoteError> {
    let until = std::time::Instant::now() + timeout;
    loop {
        let mut fds = [PollFd::new(control.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(POLL_SLICE_MS)) {
            Ok(0) if std::time::Instant::now() < until => continue,
            Ok(0) => return Err(ZygoteError::Timeout(timeout)),
            Ok(_) => break,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(ZygoteError::Io(e)),
        }
    }
    control::receive(control.as_fd())
        .map_err(ZygoteError::Control)?
        .ok_or(ZygoteError::Closed)
}

impl Zygote {
    /// Starts `exe __worker <args> --control-fd=N`, boots it (from `snapshot` when given, with
    /// `mounts` and `preinstall`, which its children inherit) and waits until it can fork:
    /// about the boot, plus ten seconds for its engine threads to end.
    ///
    /// Errors: [`ZygoteError::Io`], [`ZygoteError::Boot`], then anything its first message
    /// can fail with ([`ZygoteError::Timeout`] past [`FORKABLE_TIMEOUT`]).
    ///
    /// With `scratch_root` (a scientific zygote), its own scratch folder is made there and each
    /// child's too.
    pub async fn start(
        exe: &Path,
        args: &[String],
        snapshot: Option<File>,
        mounts: &Mounts,
        preinstall: Option<&Preinstall>,
        scratch_root: Option<PathBuf>,
    ) -> Result<Zygote, ZygoteError> {
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(ZygoteError::Io)?;
        let mut args = args.to_vec();
        args.push(format!("{CONTROL_FD_ARG}{}", theirs.as_raw_fd()));
        if let Some(root) = &scratch_root {
            let own = root.join(ZYGOTE_SCRATCH);
            std::fs::create_dir_all(&own).map_err(ZygoteError::Setup)?;
            args.push(format!("{SCRATCH_ARG}{}", own.display()));
        }
        let worker = Worker::start(exe, &args, Some(&theirs), snapshot.as_ref())
            .map_err(ZygoteError::Boot)?;
        let mode = match snapshot {
            Some(_) => SnapshotMode::Load,
            None => SnapshotMode::None,
        };
        // The zygote has its copies (spawn returns once it has run `exec`).
        drop((theirs, snapshot));
        let request = BootRequest {
            mode,
            mounts,
            preinstall,
        };
        let (worker, _) = worker
            .boot(Some(request))
            .await
            .map_err(ZygoteError::Boot)?;
        let control = Arc::new(Mutex::new(ours));
        let waiting = control.clone();
        let first = tokio::task::spawn_blocking(move || {
            let control = waiting.lock().unwrap_or_else(|p| p.into_inner());
            receive_within(&control, FORKABLE_TIMEOUT)
        })
        .await
        .map_err(|e| ZygoteError::Setup(std::io::Error::other(e)))??;
        match first {
            (Control::Forkable, _) => Ok(Zygote {
                installed: worker.installed.clone(),
                owner: Owner::Own(Box::new(Mutex::new(Some(worker)))),
                control,
                scratch_root,
            }),
            (other, _) => Err(ZygoteError::Unexpected(other)),
        }
    }

    /// The zygote of the per-host service reached over `control` (a connected socket on which
    /// the service said [`Control::Serving`]): `pid` is the service's, `socket` its path,
    /// `installed` what its forks have.
    pub fn of_service(
        control: OwnedFd,
        pid: u32,
        socket: std::path::PathBuf,
        installed: HashMap<String, String>,
    ) -> Zygote {
        Zygote {
            owner: Owner::Service { pid, socket },
            control: Arc::new(Mutex::new(control)),
            installed,
            scratch_root: None,
        }
    }

    /// The service's pid and socket, when this is the per-host service's zygote.
    pub fn service(&self) -> Option<(u32, &Path)> {
        match &self.owner {
            Owner::Service { pid, socket } => Some((*pid, socket)),
            Owner::Own(_) => None,
        }
    }

    /// Asks the zygote for one child whose stdin, stdout and stderr are `stdio`, and waits
    /// (blocking, at most [`FORK_TIMEOUT`]) for its pid and pidfd. The per-host service relays
    /// its fronts' requests with this.
    ///
    /// Errors: [`ZygoteError::Control`], [`ZygoteError::Timeout`], [`ZygoteError::Closed`],
    /// [`ZygoteError::Refused`], [`ZygoteError::Unexpected`].
    pub fn request_fork(&self, stdio: [OwnedFd; 3]) -> Result<(u32, OwnedFd), ZygoteError> {
        self.request(Control::Fork, stdio.into())
    }

    /// Sends `request` with `fds` and waits (blocking, at most [`FORK_TIMEOUT`]) for the
    /// child's pid and pidfd.
    fn request(&self, request: Control, fds: Vec<OwnedFd>) -> Result<(u32, OwnedFd), ZygoteError> {
        let control = self.control.lock().unwrap_or_else(|p| p.into_inner());
        let raw: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
        control::send(control.as_fd(), &request, &raw).map_err(ZygoteError::Control)?;
        // The zygote has them now; this process keeps none.
        drop(fds);
        match receive_within(&control, FORK_TIMEOUT)? {
            (Control::ForkFailed { reason }, _) => Err(ZygoteError::Refused(reason)),
            (Control::Forked { pid }, fds) => match fds.into_iter().next() {
                Some(pidfd) => Ok((pid, pidfd)),
                None => Err(ZygoteError::Unexpected(Control::Forked { pid })),
            },
            (other, _) => Err(ZygoteError::Unexpected(other)),
        }
    }

    /// Forks a fresh worker and waits until it is ready (confined, reseeded). Its request and
    /// reply pipes are widened ([`widen_pipe`]).
    ///
    /// Errors: [`ZygoteError`]; after any, this zygote should be replaced.
    pub async fn fork(self: &Arc<Self>) -> Result<Worker, ZygoteError> {
        let zygote = self.clone();
        let (pid, pidfd, stdin, stdout, stderr, scratch) = tokio::task::spawn_blocking(move || {
            let (in_r, in_w) =
                nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(ZygoteError::Io)?;
            let (out_r, out_w) =
                nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(ZygoteError::Io)?;
            let (err_r, err_w) =
                nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(ZygoteError::Io)?;
            widen_pipe(&in_w);
            widen_pipe(&out_r);
            let mut fds: Vec<OwnedFd> = vec![in_r, out_w, err_w];
            let (request, scratch) = match &zygote.scratch_root {
                Some(root) => {
                    let (scratch, folder) = child_scratch(root)?;
                    fds.push(folder);
                    (Control::ForkInto, Some(scratch))
                }
                None => (Control::Fork, None),
            };
            let (pid, pidfd) = zygote.request(request, fds)?;
            Ok::<_, ZygoteError>((pid, pidfd, in_w, out_r, err_r, scratch))
        })
        .await
        .map_err(|e| ZygoteError::Setup(std::io::Error::other(e)))??;
        let process = Process::forked(pid, pidfd).map_err(ZygoteError::Setup)?;
        let stdin =
            tokio::net::unix::pipe::Sender::from_owned_fd(stdin).map_err(ZygoteError::Setup)?;
        let stdout =
            tokio::net::unix::pipe::Receiver::from_owned_fd(stdout).map_err(ZygoteError::Setup)?;
        let stderr =
            tokio::net::unix::pipe::Receiver::from_owned_fd(stderr).map_err(ZygoteError::Setup)?;
        let worker = Worker::forked(process, Box::new(stdin), Box::new(stdout), Box::new(stderr));
        let (mut worker, _) = worker.boot(None).await.map_err(ZygoteError::Ready)?;
        worker.installed = self.installed.clone();
        if let Some(scratch) = scratch {
            worker.keep_scratch(scratch);
        }
        Ok(worker)
    }

    /// What every fork has installed (`--deps`): normalized name → version.
    pub fn installed(&self) -> &HashMap<String, String> {
        &self.installed
    }

    /// Whether the zygote is still there: its process not killed from outside or crashed, or
    /// the service's connection not closed.
    pub fn is_alive(&self) -> bool {
        match &self.owner {
            Owner::Own(process) => process
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_mut()
                .is_some_and(|worker| !worker.has_ended()),
            Owner::Service { .. } => {
                // The service sends nothing unasked once it serves: anything to read, or a
                // hang-up, means it closed the connection (it ended, or was stopped).
                let control = self.control.lock().unwrap_or_else(|p| p.into_inner());
                let mut fds = [PollFd::new(control.as_fd(), PollFlags::POLLIN)];
                matches!(poll(&mut fds, PollTimeout::ZERO), Ok(0))
            }
        }
    }

    /// Kills this process's own zygote (the workers it forked die with it:
    /// `PR_SET_PDEATHSIG`). A service's zygote is left alone: it outlives this front, and the
    /// workers it forked for this front end when this front's connection closes.
    pub async fn kill(&self) {
        let Owner::Own(process) = &self.owner else {
            return;
        };
        let process = process.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(worker) = process {
            worker.kill().await;
        }
    }
}

/// The folder a scientific zygote's own scratch folder is, in its scratch root.
const ZYGOTE_SCRATCH: &str = "zygote";

/// A forked scientific child's scratch folder, made in `root` (removed when the returned
/// directory is dropped), and a descriptor of it to send.
///
/// Errors: [`ZygoteError::Setup`]: the folder cannot be made or opened.
fn child_scratch(root: &Path) -> Result<(tempfile::TempDir, OwnedFd), ZygoteError> {
    let scratch = Worker::new_scratch(root).map_err(ZygoteError::Setup)?;
    let folder = File::open(scratch.path()).map_err(ZygoteError::Setup)?;
    Ok((scratch, OwnedFd::from(folder)))
}

/// Bytes a forked worker's request and reply pipes hold (`F_SETPIPE_SZ`, pipe(7)): a
/// checkpoint's reply (80–250 changed pages, up to 1 MiB) and a restore's pages then cross
/// without a wake-up of the other side per 64 KiB (the default), each of which costs ~0.2 ms
/// on a busy 2-core machine. `/proc/sys/fs/pipe-max-size` is 1 MiB by default.
const PIPE_BYTES: libc::c_int = 1 << 20;

/// Widens the pipe `fd` is an end of to [`PIPE_BYTES`], where the kernel allows it: an
/// unprivileged user past `/proc/sys/fs/pipe-user-pages-soft` keeps the default (pipe(7)),
/// which only costs speed.
fn widen_pipe(fd: &OwnedFd) {
    if let Err(e) = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_BYTES)) {
        tracing::debug!("a worker pipe keeps its default size: {e}");
    }
}
