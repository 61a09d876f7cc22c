//! The zygote's side of the fork server (`docs/fork-server-research.md`): an interpreter
//! started with a control socket ([`CONTROL_FD_ARG`]) boots Pyodide once, warms it up, and
//! then, instead of serving calls, forks a ready interpreter for every request of the front. It
//! never runs user code.
//!
//! The control socket's messages ([`Control`]: `Forkable`, then `Fork` answered by `Forked` or
//! `ForkFailed`) and how they travel are declared with the worker protocol
//! (`src/protocol/control.rs`), which the front's side (`src/worker/zygote_client.rs`) shares.
//!
//! Why one thread: JavaScriptCore's helper threads (JIT, wasm compilers, GC, the libpas
//! scavenger) would be missing in the child while their state says they exist, and the child
//! could wait for them for ever. Once idle for a while they exit (the zygote shortens that
//! while from ten seconds, [`crate::engine::configure_zygote`]); the scavenger is suspended by
//! hand ([`crate::engine::allocator::suspend_scavenger`]).

use super::descriptors::{inherited_descriptor, DescriptorError};
use crate::protocol::control::{receive, send, Control, ControlError};
use crate::protocol::launch::CONTROL_FD_ARG;
use anyhow::{anyhow, bail, Context, Result};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// A fork request's descriptors that become the child's stdin, stdout and stderr.
const STDIO_FDS: usize = 3;

/// Longest reason of a [`Control::ForkFailed`] (bytes), so that the message fits.
const REASON_MAX: usize = 512;

/// How long the zygote waits for its helper threads to end after warming up (seconds). They
/// end once idle for [`crate::engine::ZYGOTE_HELPER_IDLE`] after their last compile (10 s, the
/// library's own timeout, where it cannot be shortened); a busy machine may take longer.
const SINGLE_THREAD_WAIT: Duration = Duration::from_secs(60);

/// How often the zygote looks at its thread count while it waits for one thread: a small
/// part of the ~50-200 ms the helpers take to end (one read of `/proc/self/status` each).
const THREAD_POLL: Duration = Duration::from_millis(5);

/// How often the zygote reaps its ended children while no request comes (milliseconds): an
/// ended worker stays a zombie at most this long. A wake-up costs one `poll` and one
/// `waitpid` and touches no engine memory.
const REAP_INTERVAL_MS: u16 = 100;

/// Gives free memory back to the system before the zygote forks: fewer resident pages make
/// a faster `fork` (page tables are copied) and less to share. Runs after the engine's last
/// garbage collection.
fn release_free_memory() {
    crate::engine::allocator::release_free_memory();
}

/// What a forked child needs to know.
pub struct Forked {
    /// When the fork request arrived.
    pub requested: Instant,
    /// A scientific child's scratch folder ([`Control::ForkInto`]): its guest's `/`.
    pub scratch: Option<OwnedFd>,
}

/// Which engine the zygote holds: what it must quiet before it forks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZygoteEngine {
    /// JavaScriptCore (Pyodide): its allocator's scavenger is suspended and its helper threads
    /// waited for.
    JavaScriptCore,
    /// wasmtime (the scientific runtime): it starts no thread of its own here (no compile, no
    /// epoch ticker), so there is nothing to quiet.
    Wasmtime,
}

/// Lets the allocator's scavenger run again in a forked child (the zygote's suspension is
/// inherited). Called after the child's first call, not at once: while the child has a single
/// thread, a copy-on-write fault flushes only the local TLB; with the scavenger's thread alive
/// on the other core, each of the first call's thousand or so faults also costs an
/// inter-processor interrupt, which made that call several times slower.
///
/// First it gives back what that call freed (libpas's and glibc's free pages): the call
/// touched and then freed about 1.3 MiB of glibc's heap, which an idle sandbox otherwise kept
/// as private memory (2.26 MiB of heap pages private after the first call, 0.99 MiB with
/// this; issue 49, measured with `smaps`). It takes about 0.2 ms, after the answer was sent.
pub fn resume_scavenger() {
    crate::engine::allocator::release_free_memory();
    crate::engine::allocator::resume_scavenger();
}

/// Waits until the process has one thread, with JavaScriptCore's scavenger suspended.
fn wait_single_threaded(proc_status: &File, engine: ZygoteEngine) -> Result<()> {
    if engine == ZygoteEngine::JavaScriptCore {
        release_free_memory();
        crate::engine::allocator::suspend_scavenger();
    } else {
        // SAFETY: takes an integer; only returns glibc's free memory to the system.
        unsafe { libc::malloc_trim(0) };
    }
    let started = Instant::now();
    let until = started + SINGLE_THREAD_WAIT;
    if engine == ZygoteEngine::JavaScriptCore && crate::engine::helper_threads::shortened() == 0 {
        tracing::info!(
            "the engine's helper threads keep their 10 s idle timeout: the zygote waits for them"
        );
    }
    loop {
        match super::confine::thread_count(proc_status) {
            Some(1) => {
                let waited = started.elapsed().as_millis();
                tracing::info!("the zygote has one thread after {waited} ms");
                return Ok(());
            }
            Some(n) if Instant::now() > until => {
                bail!(
                    "the zygote still has {n} threads after {} s",
                    SINGLE_THREAD_WAIT.as_secs()
                )
            }
            None => bail!("the zygote cannot count its threads"),
            Some(_) => std::thread::sleep(THREAD_POLL),
        }
    }
}

/// Highest descriptor number a zygote looks at when it scans its own descriptors (the
/// engine's event descriptors, a scientific guest's root folder): a worker opens a handful.
pub const FD_SCAN_MAX: RawFd = 256;

/// An event descriptor of the zygote (`eventfd(2)`; GLib's main-context wake-up, opened by the
/// engine): its number, file status flags and descriptor flags.
struct EventFd {
    fd: RawFd,
    status_flags: libc::c_int,
    fd_flags: libc::c_int,
}

/// The zygote's event descriptors. A forked child would share each with the zygote and with
/// every sibling (one kernel object behind inherited descriptors): a channel between sessions.
/// Each child replaces them with new ones of its own ([`replace_event_fds`]).
fn event_fds() -> Vec<EventFd> {
    (0..FD_SCAN_MAX)
        .filter_map(|fd| {
            // SAFETY: fcntl on a number that may not be open only reads flags or fails.
            let fd_flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
            if fd_flags < 0 {
                return None;
            }
            let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
            (link.as_os_str() == "anon_inode:[eventfd]").then(|| EventFd {
                fd,
                // SAFETY: as above, on an open descriptor.
                status_flags: unsafe { libc::fcntl(fd, libc::F_GETFL) },
                fd_flags,
            })
        })
        .collect()
}

/// In a forked child: a new, empty event descriptor in place of each of the zygote's, with the
/// same flags, so that nothing the child signals reaches another process.
fn replace_event_fds(shared: &[EventFd]) -> Result<()> {
    for event in shared {
        let mut flags = 0;
        if event.status_flags & libc::O_NONBLOCK != 0 {
            flags |= libc::EFD_NONBLOCK;
        }
        let cloexec = if event.fd_flags & libc::FD_CLOEXEC != 0 {
            libc::O_CLOEXEC
        } else {
            0
        };
        // SAFETY: eventfd, dup3 and close take integers; `fresh` is ours until closed, and
        // dup3 atomically replaces the shared descriptor's number with the new object.
        unsafe {
            let fresh = libc::eventfd(0, flags | libc::EFD_CLOEXEC);
            if fresh < 0 || libc::dup3(fresh, event.fd, cloexec) < 0 {
                return Err(std::io::Error::last_os_error())
                    .context("replacing the zygote's event descriptor");
            }
            libc::close(fresh);
        }
    }
    Ok(())
}

/// Reaps every ended child (their pidfds, held by the front, stay valid), and logs how each
/// ended at debug level (the front sees only that it ended; tests read the signal here).
fn reap() {
    while let Ok(status) = waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
        match status {
            WaitStatus::StillAlive => break,
            WaitStatus::Exited(pid, code) => {
                tracing::debug!("interpreter {pid} ended: exit status {code}")
            }
            WaitStatus::Signaled(pid, signal, _) => {
                tracing::debug!("interpreter {pid} ended: signal {}", signal as i32)
            }
            _ => {}
        }
    }
}

/// `pidfd_open(2)` (Linux 5.3): a descriptor that names `pid` for good.
fn pidfd_open(pid: Pid) -> std::io::Result<OwnedFd> {
    // SAFETY: plain integers in, a new descriptor (or -1) out.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = RawFd::try_from(fd).map_err(|_| std::io::Error::other("pidfd out of range"))?;
    // SAFETY: the kernel just gave us this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Answers a fork request with [`Control::ForkFailed`] and the reason (cut to fit).
fn refuse(control: BorrowedFd<'_>, why: &str) -> Result<(), ControlError> {
    let mut end = why.len().min(REASON_MAX);
    while !why.is_char_boundary(end) {
        end -= 1;
    }
    let reason = why[..end].to_owned();
    send(control, &Control::ForkFailed { reason }, &[])
}

/// Serves fork requests on `control` until the front closes it. Returns `Ok(None)` in the
/// zygote when done, and `Ok(Some(_))` in each forked child, whose stdin, stdout and stderr are
/// then the descriptors the front sent. A zygote of `engine` [`ZygoteEngine::Wasmtime`] takes
/// [`Control::ForkInto`] (a scratch folder too), one of JavaScriptCore [`Control::Fork`].
///
/// Errors: the zygote cannot become single-threaded, or its control socket fails.
pub fn serve(control: OwnedFd, proc_status: &File, engine: ZygoteEngine) -> Result<Option<Forked>> {
    wait_single_threaded(proc_status, engine)?;
    prepare_memory();
    let shared = event_fds();
    send(control.as_fd(), &Control::Forkable, &[])?;
    loop {
        let mut fds = [PollFd::new(control.as_fd(), PollFlags::POLLIN)];
        let ready = poll(&mut fds, PollTimeout::from(REAP_INTERVAL_MS));
        reap();
        match ready {
            Ok(0) => continue,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e).context("waiting for the front"),
            Ok(_) => {}
        }
        let Some((message, fds)) = receive(control.as_fd())? else {
            return Ok(None);
        };
        let requested = Instant::now();
        let expected = match engine {
            ZygoteEngine::JavaScriptCore => Control::Fork,
            ZygoteEngine::Wasmtime => Control::ForkInto,
        };
        if message != expected {
            bail!("the front sent {message:?} on the control socket");
        }
        let threads = super::confine::thread_count(proc_status);
        if threads != Some(1) {
            // Something started a thread (it must not: the zygote runs no JavaScript now).
            let why = format!("the zygote has {threads:?} threads");
            refuse(control.as_fd(), &why)?;
            continue;
        }
        // SAFETY: the process has one thread (checked just above), so no lock can be held by
        // a thread the child would not have; the child only calls async-signal-safe functions
        // until it has its own descriptors, and is a whole copy of this process afterwards.
        match unsafe { fork() } {
            Ok(ForkResult::Child) => {
                drop(control);
                return become_child(fds, &shared, requested).map(Some);
            }
            Ok(ForkResult::Parent { child }) => {
                drop(fds);
                hand_over(control.as_fd(), child)?;
            }
            Err(e) => {
                let why = format!("fork failed: {e}");
                refuse(control.as_fd(), &why)?;
            }
        }
    }
}

/// Lays the zygote's memory out for cheap forks (`fork_memory.rs`), with one thread, so that
/// nothing changes it meanwhile, and logs what that did.
fn prepare_memory() {
    let prepared = super::fork_memory::prepare();
    tracing::info!(
        "memory prepared for forking in {} ms: {} mappings merged into {}, {} huge pages collapsed ({} KiB filled)",
        prepared.took_ms,
        prepared.mappings.0,
        prepared.mappings.1,
        prepared.collapsed,
        prepared.filled_kib
    );
}

/// In a forked child: makes `fds` (the descriptors the front sent) its stdin, stdout and
/// stderr (a fourth is its scratch folder), gives it event descriptors of its own in place of
/// the zygote's (`shared`), and makes it die with the zygote. `requested`: when the fork
/// request arrived.
///
/// Errors: a descriptor cannot be installed or replaced.
fn become_child(mut fds: Vec<OwnedFd>, shared: &[EventFd], requested: Instant) -> Result<Forked> {
    let scratch = (fds.len() > STDIO_FDS).then(|| fds.remove(STDIO_FDS));
    for (fd, target) in fds.iter().zip(0..) {
        // SAFETY: both are descriptors of this process; dup2 replaces `target`
        // (stdin, stdout, stderr) atomically and leaves it without close-on-exec.
        if unsafe { libc::dup2(fd.as_raw_fd(), target) } < 0 {
            return Err(std::io::Error::last_os_error())
                .context("installing the child's descriptors");
        }
    }
    drop(fds);
    replace_event_fds(shared)?;
    // Die with the zygote, which dies with the front.
    // SAFETY: prctl with PR_SET_PDEATHSIG only sets a flag on this process.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    Ok(Forked { requested, scratch })
}

/// In the zygote, after a fork: hands the front `child`'s pidfd ([`Control::Forked`]), by
/// which it kills it and sees it end; or, when none can be had, kills the child and answers
/// [`Control::ForkFailed`].
///
/// Errors: [`ControlError`] when the control socket fails.
fn hand_over(control: BorrowedFd<'_>, child: Pid) -> Result<(), ControlError> {
    match pidfd_open(child) {
        Ok(pidfd) => {
            let pid = u32::try_from(child.as_raw()).unwrap_or_default();
            let forked = Control::Forked { pid };
            send(control, &forked, &[pidfd.as_raw_fd()])
        }
        Err(e) => {
            // SAFETY: kill takes plain integers; `child` is our own child, not yet
            // reaped, so its pid cannot name another process.
            unsafe { libc::kill(child.as_raw(), libc::SIGKILL) };
            let why = format!("pidfd_open failed: {e}");
            refuse(control, &why)
        }
    }
}

/// The control socket, when this worker was started as a zygote ([`CONTROL_FD_ARG`]).
///
/// Errors: [`DescriptorError`]: the argument is not a descriptor number, or names a
/// descriptor that is not open.
pub fn control_socket(fd: Option<RawFd>) -> Result<Option<OwnedFd>, DescriptorError> {
    inherited_descriptor(CONTROL_FD_ARG, fd)
}

/// Fails unless `buffered` (bytes of standard input read but not consumed) is 0: the zygote's
/// standard input must hold no unread bytes when it forks, or the child would read the
/// zygote's instead of its own.
pub fn check_drained(buffered: usize) -> Result<()> {
    if buffered != 0 {
        return Err(anyhow!(
            "the zygote has {buffered} unread bytes of standard input"
        ));
    }
    Ok(())
}
