//! A worker's process as the front sees it: spawned by the front itself (a child it reaps), or
//! forked by the zygote (a grandchild, reaped by the zygote, which the front holds by a pidfd).

use std::os::fd::{AsRawFd, OwnedFd};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::process::Child;

/// How a worker process ended, as far as the front can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The front's own child: its exit status.
    Status(std::process::ExitStatus),
    /// A forked worker: it ended, but only its parent (the zygote) sees the status.
    Forked,
}

/// A worker process. Dropping it kills the process.
pub enum Process {
    /// Started by the front (`exe __worker`); killed on drop by tokio.
    Spawned(Child),
    /// Forked by the zygote: its pid, and a pidfd that names it for good (pidfd_open(2)):
    /// readable once it has ended, and a target for `pidfd_send_signal` that can never be
    /// another process, even after the pid is reused.
    Forked { pid: u32, pidfd: AsyncFd<OwnedFd> },
}

impl Process {
    /// A process forked by the zygote.
    ///
    /// Errors: the pidfd cannot be registered with the runtime.
    pub fn forked(pid: u32, pidfd: OwnedFd) -> std::io::Result<Process> {
        // SAFETY: an OwnedFd is open and refers to the same pidfd until it is dropped, which
        // happens only with the AsyncFd.
        let pidfd = unsafe { AsyncFd::register_with_interest(pidfd, Interest::READABLE) }
            .map_err(std::io::Error::from)?;
        Ok(Process::Forked { pid, pidfd })
    }

    /// Whether the zygote forked it.
    pub fn is_forked(&self) -> bool {
        matches!(self, Process::Forked { .. })
    }

    /// The process id while it may still run; `None` once it is known to have ended.
    pub fn id(&self) -> Option<u32> {
        match self {
            Process::Spawned(child) => child.id(),
            Process::Forked { pid, pidfd } => (!pidfd_has_ended(pidfd.get_ref())).then_some(*pid),
        }
    }

    /// Whether the process is known to have ended (without waiting).
    pub fn has_ended(&mut self) -> bool {
        match self {
            Process::Spawned(child) => !matches!(child.try_wait(), Ok(None)),
            Process::Forked { pidfd, .. } => pidfd_has_ended(pidfd.get_ref()),
        }
    }

    /// The signal that ended the process, if it ended by one and the front can tell (only
    /// for its own children).
    pub fn signal(&mut self) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        match self {
            Process::Spawned(child) => child.try_wait().ok().flatten().and_then(|s| s.signal()),
            Process::Forked { .. } => None,
        }
    }

    /// Sends SIGKILL (nothing if it has ended).
    pub fn start_kill(&mut self) {
        match self {
            Process::Spawned(child) => {
                let _ = child.start_kill();
            }
            Process::Forked { pidfd, .. } => pidfd_kill(pidfd.get_ref()),
        }
    }

    /// Waits until the process has ended; `None` if that cannot be told.
    pub async fn wait(&mut self) -> Option<Ended> {
        match self {
            Process::Spawned(child) => child.wait().await.ok().map(Ended::Status),
            Process::Forked { pidfd, .. } => {
                // A pidfd polls readable once the process has ended (pidfd_open(2)).
                let mut guard = pidfd.readable().await.ok()?;
                guard.retain_ready();
                Some(Ended::Forked)
            }
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Process::Forked { pidfd, .. } = self {
            pidfd_kill(pidfd.get_ref());
        }
    }
}

/// `pidfd_send_signal(pidfd, SIGKILL)`; an ended process (ESRCH) is fine.
pub fn pidfd_kill(pidfd: &OwnedFd) {
    // SAFETY: plain integers and a null siginfo (the kernel fills in a default one).
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        );
    }
}

/// Whether the process behind `pidfd` has ended: the pidfd polls readable.
pub fn pidfd_has_ended(pidfd: &OwnedFd) -> bool {
    let mut fds = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, a zero timeout.
    let n = unsafe { libc::poll(&mut fds, 1, 0) };
    n > 0 && fds.revents & libc::POLLIN != 0
}
