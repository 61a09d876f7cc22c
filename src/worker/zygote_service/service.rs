//! The zygote service's process (`mcp-run-python … zygote-service`, started detached by the
//! first front that finds none): it holds the service's lock for its whole life, starts one
//! zygote of its own (`zygote_client.rs`, confined as every zygote is) and relays the fork requests of
//! every front of this user that connects, as Android's `ZygoteServer` does for apps.
//!
//! It never runs user code, and neither does its zygote. It trusts a peer no more than a
//! worker: a peer of another uid (`SO_PEERCRED`) is refused and logged; a message is typed,
//! size-bounded ([`control::receive`]) and answered on its own connection; the pidfds of
//! the workers forked for a front go to that front alone, and when its connection closes (the
//! front ended, even by SIGKILL) the service kills every worker it forked for it.

use super::place::{ServiceKey, ServicePlace};
use crate::protocol::control;
use crate::protocol::control::{Control, ServiceStatus};
use crate::worker::process::{pidfd_has_ended, pidfd_kill};
use crate::worker::zygote_client::{Zygote, ZygoteError};
use anyhow::{Context, Result};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{
    accept4, bind, getsockopt, listen, socket, sockopt, AddressFamily, Backlog, SockFlag, SockType,
    UnixAddr,
};
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often a connection looks for its service's zygote becoming ready, and the accept loop
/// for a stop (milliseconds): a front waits at most this long past the zygote's readiness.
const WAKE_MS: u16 = 50;

/// How often the service checks whether it should end (idle, stopped, zygote lost).
const CHECK_INTERVAL: Duration = Duration::from_millis(200);

/// Most connections served at once: far more fronts than one host runs; a peer that opens
/// more is refused rather than given a thread each.
const MAX_CONNECTIONS: usize = 1024;

/// Pending connections the kernel queues for the accept loop.
const LISTEN_BACKLOG: i32 = 128;

/// What the service's options say.
pub struct ServiceOptions {
    pub place: ServicePlace,
    pub key: ServiceKey,
    /// Seconds with no front connected after which the service ends.
    pub idle_exit: Duration,
}

/// Where the service's zygote stands.
enum Phase {
    /// Booting and warming up.
    Starting,
    /// Forks for fronts.
    Serving(Arc<Zygote>),
    /// Lost (it failed or ended): the service ends.
    Lost,
}

/// What the service's threads share.
struct State {
    key: ServiceKey,
    started: Instant,
    idle_exit: Duration,
    phase: Mutex<Phase>,
    /// Connections open now, and when the last one closed (or the service started).
    open: Mutex<(usize, Instant)>,
    /// Live workers by connection number: each pidfd a copy of the one its front got.
    workers: Mutex<HashMap<u64, Vec<OwnedFd>>>,
    next_connection: AtomicU64,
    /// Set by `zygote stop`.
    stop: AtomicBool,
}

impl State {
    fn zygote(&self) -> Option<Arc<Zygote>> {
        match &*self.phase.lock().unwrap_or_else(|p| p.into_inner()) {
            Phase::Serving(zygote) => Some(zygote.clone()),
            _ => None,
        }
    }

    fn lost(&self) -> bool {
        matches!(
            *self.phase.lock().unwrap_or_else(|p| p.into_inner()),
            Phase::Lost
        )
    }

    fn status(&self) -> ServiceStatus {
        let fronts = self.open.lock().unwrap_or_else(|p| p.into_inner()).0;
        let mut workers = self.workers.lock().unwrap_or_else(|p| p.into_inner());
        let live = workers
            .values_mut()
            .map(|fds| {
                fds.retain(|fd| !pidfd_has_ended(fd));
                fds.len()
            })
            .sum();
        ServiceStatus {
            ready: self.zygote().is_some(),
            fronts: fronts.saturating_sub(1),
            workers: live,
            uptime_s: self.started.elapsed().as_secs(),
            idle_exit_s: self.idle_exit.as_secs(),
        }
    }

    /// Whether the service has had no connection for its idle time.
    fn idle(&self) -> bool {
        let (open, since) = *self.open.lock().unwrap_or_else(|p| p.into_inner());
        open == 0 && since.elapsed() >= self.idle_exit
    }
}

/// Takes the service's lock, or `None` when another process holds it (a service of this key
/// runs, or is starting).
///
/// Errors: the lock file cannot be opened or locked.
pub fn take_lock(place: &ServicePlace) -> Result<Option<File>> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&place.lock)
        .with_context(|| format!("opening {}", place.lock.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("locking {}", place.lock.display()))
        }
    }
}

/// Binds the service's socket (replacing a stale socket file: the caller holds the lock, so
/// no live service owns it) and listens, readable and writable by this user alone.
///
/// Errors: the socket cannot be made, bound or listened on.
fn listen_at(place: &ServicePlace) -> Result<OwnedFd> {
    match std::fs::remove_file(&place.socket) {
        Ok(()) => tracing::info!("replaced a stale socket file {}", place.socket.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).context("removing a stale socket file"),
    }
    let listener = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .context("creating the service's socket")?;
    let address = UnixAddr::new(&place.socket).context("the socket's path")?;
    bind(listener.as_raw_fd(), &address).context("binding the service's socket")?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&place.socket, std::fs::Permissions::from_mode(0o600))
            .context("making the socket private")?;
    }
    let backlog = Backlog::new(LISTEN_BACKLOG).context("the listen backlog")?;
    listen(&listener, backlog).context("listening on the service's socket")?;
    Ok(listener)
}

/// Runs the service: takes `lock` (already held), listens at `options.place`, starts the
/// zygote with `start`, and serves until idle past `options.idle_exit`, stopped, or its
/// zygote is lost. Its zygote (and with it every worker it forked) ends with it.
///
/// Errors: the socket cannot be bound. A zygote that does not start ends the service (logged,
/// not an error: fronts boot their own interpreters meanwhile).
pub async fn serve<F>(options: ServiceOptions, lock: File, start: F) -> Result<()>
where
    F: std::future::Future<Output = Result<Zygote, ZygoteError>>,
{
    let listener = listen_at(&options.place)?;
    let state = Arc::new(State {
        key: options.key,
        started: Instant::now(),
        idle_exit: options.idle_exit,
        phase: Mutex::new(Phase::Starting),
        open: Mutex::new((0, Instant::now())),
        workers: Mutex::new(HashMap::new()),
        next_connection: AtomicU64::new(0),
        stop: AtomicBool::new(false),
    });
    tracing::info!(
        "zygote service {} listening at {} (pid {})",
        state.key.short(),
        options.place.socket.display(),
        std::process::id()
    );
    let accepting = state.clone();
    let accept_loop = std::thread::spawn(move || accept_connections(listener, accepting));
    stop_on_signals(state.clone())?;
    let zygote = tokio::select! {
        started = start => Some(started),
        () = wait_for_end(&state) => None,
    };
    match zygote {
        Some(Ok(zygote)) => {
            tracing::info!("zygote service ready: forks for every front of this user");
            *state.phase.lock().unwrap_or_else(|p| p.into_inner()) =
                Phase::Serving(Arc::new(zygote));
            wait_for_end(&state).await;
        }
        Some(Err(e)) => tracing::warn!(
            "the service's zygote did not start: {}",
            crate::protocol::error_words(&e)
        ),
        None => {}
    }
    let last = std::mem::replace(
        &mut *state.phase.lock().unwrap_or_else(|p| p.into_inner()),
        Phase::Lost,
    );
    state.stop.store(true, Ordering::SeqCst);
    let _ = std::fs::remove_file(&options.place.socket);
    if let Phase::Serving(zygote) = last {
        zygote.kill().await;
    }
    let _ = accept_loop.join();
    drop(lock);
    Ok(())
}

/// Makes SIGTERM and SIGINT stop the service as `zygote stop` does: its socket removed, its
/// zygote and workers ended (an operator's `kill`, or a test's clean-up).
///
/// Errors: the signal handlers cannot be installed.
fn stop_on_signals(state: Arc<State>) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("handling SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("handling SIGINT")?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = interrupt.recv() => {}
        }
        tracing::info!("zygote service stopped by a signal");
        state.stop.store(true, Ordering::SeqCst);
    });
    Ok(())
}

/// Returns once the service should end: stopped, idle past its time, or its zygote lost.
async fn wait_for_end(state: &State) {
    loop {
        if state.stop.load(Ordering::SeqCst) {
            tracing::info!("zygote service stopping");
            return;
        }
        if state.idle() {
            tracing::info!(
                "zygote service idle for {} s with no front: ending",
                state.idle_exit.as_secs()
            );
            return;
        }
        if state.lost() || state.zygote().is_some_and(|z| !z.is_alive()) {
            tracing::warn!("the service's zygote ended: ending the service");
            return;
        }
        tokio::time::sleep(CHECK_INTERVAL).await;
    }
}

/// Accepts connections until the service stops, each served on a thread of its own.
fn accept_connections(listener: OwnedFd, state: Arc<State>) {
    while !state.stop.load(Ordering::SeqCst) {
        let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(WAKE_MS)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!("the service's socket failed: {e}");
                return;
            }
        }
        let raw = match accept4(listener.as_raw_fd(), SockFlag::SOCK_CLOEXEC) {
            Ok(raw) => raw,
            Err(e) => {
                tracing::debug!("accept failed: {e}");
                continue;
            }
        };
        // SAFETY: accept4 just returned this descriptor; nothing else owns it.
        let conn = unsafe { OwnedFd::from_raw_fd(raw) };
        let full = state.open.lock().unwrap_or_else(|p| p.into_inner()).0 >= MAX_CONNECTIONS;
        if full {
            tracing::warn!("refused a connection: {MAX_CONNECTIONS} are open already");
            continue;
        }
        let serving = state.clone();
        std::thread::spawn(move || Connection::accept(conn, serving).map(Connection::serve));
    }
}

/// One peer's connection: a front (fork requests) or an operator (`zygote status`, `stop`).
struct Connection {
    conn: OwnedFd,
    state: Arc<State>,
    number: u64,
    /// The peer's pid, for the log.
    peer_pid: i32,
}

impl Connection {
    /// Checks the peer's uid (`SO_PEERCRED`, taken by the kernel at `connect`): only this
    /// service's own user is served; any other is refused and logged.
    fn accept(conn: OwnedFd, state: Arc<State>) -> Option<Connection> {
        let ours = nix::unistd::geteuid().as_raw();
        let peer = match getsockopt(&conn, sockopt::PeerCredentials) {
            Ok(peer) => peer,
            Err(e) => {
                tracing::warn!("refused a connection whose peer cannot be told: {e}");
                return None;
            }
        };
        if peer.uid() != ours {
            tracing::warn!(
                "refused a connection from uid {} (pid {}): only uid {ours} may use this service",
                peer.uid(),
                peer.pid()
            );
            return None;
        }
        let number = state.next_connection.fetch_add(1, Ordering::SeqCst);
        state.open.lock().unwrap_or_else(|p| p.into_inner()).0 += 1;
        Some(Connection {
            conn,
            state,
            number,
            peer_pid: peer.pid(),
        })
    }

    /// Says hello, then answers the peer's messages until it closes the connection or breaks
    /// the protocol, and says [`Control::Serving`] as soon as the zygote forks.
    fn serve(self) {
        let hello = Control::Hello {
            digest: self.state.key.digest.clone(),
            pid: std::process::id(),
        };
        let mut said_serving = false;
        if control::send(self.conn.as_fd(), &hello, &[]).is_ok() {
            loop {
                if !said_serving {
                    if let Some(zygote) = self.state.zygote() {
                        let installed: BTreeMap<String, String> = zygote
                            .installed()
                            .iter()
                            .map(|(k, v)| (k.clone(), v.clone()))
                            .collect();
                        if self.send(&Control::Serving { installed }, None).is_err() {
                            break;
                        }
                        said_serving = true;
                    }
                }
                if !self.answer_next(said_serving) {
                    break;
                }
            }
        }
    }

    /// Waits up to [`WAKE_MS`] for one message and answers it; `false` when the connection is
    /// done.
    fn answer_next(&self, serving: bool) -> bool {
        let mut fds = [PollFd::new(self.conn.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(WAKE_MS)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => {
                return !self.state.stop.load(Ordering::SeqCst)
            }
            Ok(_) => {}
            Err(_) => return false,
        }
        let (message, fds) = match control::receive(self.conn.as_fd()) {
            Ok(Some(message)) => message,
            Ok(None) => return false,
            Err(e) => {
                tracing::warn!("pid {} broke the service's protocol: {e}", self.peer_pid);
                return false;
            }
        };
        match message {
            Control::Fork => self.fork(fds, serving),
            Control::Status => self
                .send(&Control::StatusReport(self.state.status()), None)
                .is_ok(),
            Control::Stop => {
                tracing::info!("pid {} asked the service to stop", self.peer_pid);
                let _ = self.send(&Control::Stopping, None);
                self.state.stop.store(true, Ordering::SeqCst);
                false
            }
            other => {
                tracing::warn!("pid {} sent {other:?}, which no peer sends", self.peer_pid);
                false
            }
        }
    }

    /// Relays a fork request to the zygote, and its answer to the peer; the child's pidfd is
    /// kept (a copy) so that the child ends with this connection.
    fn fork(&self, fds: Vec<OwnedFd>, serving: bool) -> bool {
        let zygote = self.state.zygote().filter(|_| serving);
        let stdio: Option<[OwnedFd; 3]> = fds.try_into().ok();
        let (Some(zygote), Some(stdio)) = (zygote, stdio) else {
            let reason = "the service's zygote is not ready".to_owned();
            return self.send(&Control::ForkFailed { reason }, None).is_ok();
        };
        match zygote.request_fork(stdio) {
            Ok((pid, pidfd)) => {
                let sent = self.send(&Control::Forked { pid }, Some(&pidfd));
                let mut workers = self.state.workers.lock().unwrap_or_else(|p| p.into_inner());
                let mine = workers.entry(self.number).or_default();
                mine.retain(|fd| !pidfd_has_ended(fd));
                if sent.is_err() {
                    pidfd_kill(&pidfd);
                    return false;
                }
                mine.push(pidfd);
                true
            }
            Err(e) => {
                tracing::warn!(
                    "the service's zygote failed to fork: {}",
                    crate::protocol::error_words(&e)
                );
                if !matches!(e, ZygoteError::Refused(_)) {
                    *self.state.phase.lock().unwrap_or_else(|p| p.into_inner()) = Phase::Lost;
                }
                let reason = e.to_string();
                self.send(&Control::ForkFailed { reason }, None).is_ok()
            }
        }
    }

    fn send(&self, message: &Control, fd: Option<&OwnedFd>) -> Result<(), control::ControlError> {
        let fds: Vec<_> = fd.map(|fd| fd.as_raw_fd()).into_iter().collect();
        control::send(self.conn.as_fd(), message, &fds)
    }
}

impl Drop for Connection {
    /// The peer is gone (or broke the protocol): every worker forked for it is killed now.
    fn drop(&mut self) {
        let mine = self
            .state
            .workers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.number)
            .unwrap_or_default();
        let killed = mine.iter().filter(|fd| !pidfd_has_ended(fd)).count();
        for pidfd in &mine {
            pidfd_kill(pidfd);
        }
        if killed > 0 {
            tracing::info!(
                "pid {} disconnected: killed the {killed} workers forked for it",
                self.peer_pid
            );
        }
        let mut open = self.state.open.lock().unwrap_or_else(|p| p.into_inner());
        open.0 = open.0.saturating_sub(1);
        open.1 = Instant::now();
    }
}
