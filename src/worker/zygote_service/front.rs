//! A front's side of the zygote service: find this key's service, start one when there is none
//! (detached, so that it outlives the front), and turn its connection into a [`Zygote`] that
//! forks through it. Nothing here waits for long on the caller's behalf: a front whose service
//! is still warming up boots its own interpreters meanwhile (`launcher.rs`).

use super::place::{PlaceError, ServiceKey, ServicePlace};
use super::service::take_lock;
use crate::protocol::control::Control;
use crate::protocol::control::{self, ControlError};
use crate::worker::zygote_client::Zygote;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{connect, AddressFamily, SockFlag, SockType, UnixAddr};
use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a live service may take to say hello (it does so at once).
const HELLO_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a front tries to connect to a service it just started (or that another front is
/// starting): binding its socket is the service's first step, a few milliseconds in.
const START_TIMEOUT: Duration = Duration::from_secs(5);

/// Pause between connection attempts to a starting service.
const RETRY_PAUSE: Duration = Duration::from_millis(20);

/// How a front reaches its service: where, which, and how to start one.
#[derive(Debug, Clone)]
pub struct ServiceSpec {
    pub place: ServicePlace,
    pub key: ServiceKey,
    /// This executable.
    pub exe: PathBuf,
    /// The service's command line after the executable: the options that shape an
    /// interpreter, its socket and idle time, and the `zygote-service` mode.
    pub args: Vec<String>,
}

/// Why the service cannot be used now; the front boots its own interpreters.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error(transparent)]
    Place(#[from] PlaceError),
    #[error("cannot connect to the zygote service at {}", .0.display())]
    Connect(PathBuf, #[source] nix::Error),
    #[error("cannot start the zygote service")]
    Start(#[source] std::io::Error),
    #[error("no zygote service answered at {} within {} s", .0.display(), START_TIMEOUT.as_secs())]
    NotStarted(PathBuf),
    #[error("the zygote service closed the connection")]
    Closed,
    #[error("the zygote service did not answer within {} s", .0.as_secs())]
    Timeout(Duration),
    #[error("the zygote service's socket failed")]
    Control(#[source] ControlError),
    #[error("the service at {} serves other interpreters (digest {found}), not ours", .socket.display())]
    OtherService { socket: PathBuf, found: String },
    #[error("the zygote service sent {0:?} where it should not")]
    Unexpected(Control),
    #[error("cannot duplicate the connection to the zygote service")]
    Duplicate(#[source] std::io::Error),
}

/// A connection to a service that said hello but does not fork yet.
pub struct Warming {
    conn: OwnedFd,
    /// The service's pid.
    pid: u32,
    socket: PathBuf,
}

/// What the first contact found.
pub enum Reached {
    /// The service forks now.
    Serving(Box<Zygote>),
    /// The service warms up; [`Warming::serving`] waits for it.
    Warming(Warming),
}

/// Finds this key's service, starting one when none runs, and waits up to `wait` for it to
/// fork. Blocking: run it on a blocking thread.
///
/// Errors: [`ServiceError`].
pub fn reach(spec: &ServiceSpec, wait: Duration) -> Result<Reached, ServiceError> {
    spec.place.prepare()?;
    let (conn, pid) = match hello(spec) {
        Ok(hello) => hello,
        Err(ServiceError::Connect(..)) => {
            start(spec)?;
            connect_soon(spec)?
        }
        Err(e) => return Err(e),
    };
    wait_for(spec, conn, pid, wait)
}

/// [`reach`], but only a service that runs: `None` when none does (none is started).
///
/// Errors: [`ServiceError`], but for nothing listening.
pub fn reach_running(spec: &ServiceSpec, wait: Duration) -> Result<Option<Reached>, ServiceError> {
    spec.place.prepare()?;
    match hello(spec) {
        Ok((conn, pid)) => wait_for(spec, conn, pid, wait).map(Some),
        Err(ServiceError::Connect(..)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Waits up to `wait` for the service that said hello on `conn` to fork.
fn wait_for(
    spec: &ServiceSpec,
    conn: OwnedFd,
    pid: u32,
    wait: Duration,
) -> Result<Reached, ServiceError> {
    let warming = Warming {
        conn,
        pid,
        socket: spec.place.socket.clone(),
    };
    match warming.serving_within(wait) {
        Ok(zygote) => Ok(Reached::Serving(Box::new(zygote))),
        Err(ServiceError::Timeout(_)) => Ok(Reached::Warming(warming)),
        Err(e) => Err(e),
    }
}

impl Warming {
    /// Waits (blocking) up to `timeout` for the service to say it forks, and makes the
    /// [`Zygote`] that forks through it. On a timeout the connection is kept (`&self`), so
    /// that the wait can go on ([`Warming::serving`]).
    ///
    /// Errors: [`ServiceError::Timeout`], or the service closed, broke the protocol.
    fn serving_within(&self, timeout: Duration) -> Result<Zygote, ServiceError> {
        let message = receive_within(&self.conn, timeout)?;
        let conn = self.conn.try_clone().map_err(ServiceError::Duplicate)?;
        self.zygote(message, conn)
    }

    /// Waits, without blocking a thread, up to `timeout` for the service to say it forks, and
    /// makes the [`Zygote`] that forks through it.
    ///
    /// Errors: [`ServiceError::Timeout`], or the service closed, broke the protocol.
    pub async fn serving(self, timeout: Duration) -> Result<Zygote, ServiceError> {
        let conn = self.conn.try_clone().map_err(ServiceError::Duplicate)?;
        // SAFETY: `conn` is an open descriptor owned by the AsyncFd until it is dropped below.
        let watched = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(conn, tokio::io::Interest::READABLE)
        }
        .map_err(|e| ServiceError::Duplicate(e.into()))?;
        match tokio::time::timeout(timeout, watched.readable()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(ServiceError::Duplicate(e)),
            Err(_) => return Err(ServiceError::Timeout(timeout)),
        }
        drop(watched);
        self.serving_within(Duration::ZERO)
    }

    /// The [`Zygote`] of a service that said `message`, which must be [`Control::Serving`].
    fn zygote(&self, message: Control, conn: OwnedFd) -> Result<Zygote, ServiceError> {
        let Control::Serving { installed } = message else {
            return Err(ServiceError::Unexpected(message));
        };
        let installed: HashMap<String, String> = installed.into_iter().collect();
        Ok(Zygote::of_service(
            conn,
            self.pid,
            self.socket.clone(),
            installed,
        ))
    }
}

/// Connects to the service's socket and reads its hello, which must name our key.
///
/// Errors: [`ServiceError::Connect`] when nothing listens there (no socket file, or a stale
/// one); others when something else answers.
fn hello(spec: &ServiceSpec) -> Result<(OwnedFd, u32), ServiceError> {
    let (conn, digest, pid) = connect_to(&spec.place.socket)?;
    if digest != spec.key.digest {
        return Err(ServiceError::OtherService {
            socket: spec.place.socket.clone(),
            found: digest,
        });
    }
    Ok((conn, pid))
}

/// Connects to the service listening at `socket` and reads its hello: the connection, the
/// service's digest and its pid.
///
/// Errors: [`ServiceError::Connect`] when nothing listens there; others when something else
/// answers.
pub fn connect_to(socket: &Path) -> Result<(OwnedFd, String, u32), ServiceError> {
    let socket_error = |e| ServiceError::Connect(socket.to_owned(), e);
    let conn = nix::sys::socket::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(socket_error)?;
    let address = UnixAddr::new(socket).map_err(socket_error)?;
    connect(conn.as_raw_fd(), &address).map_err(socket_error)?;
    match receive_within(&conn, HELLO_TIMEOUT)? {
        Control::Hello { digest, pid } => Ok((conn, digest, pid)),
        other => Err(ServiceError::Unexpected(other)),
    }
}

/// Connects to a service that is starting, trying for [`START_TIMEOUT`].
fn connect_soon(spec: &ServiceSpec) -> Result<(OwnedFd, u32), ServiceError> {
    let until = Instant::now() + START_TIMEOUT;
    loop {
        match hello(spec) {
            Err(ServiceError::Connect(..)) if Instant::now() < until => {
                std::thread::sleep(RETRY_PAUSE)
            }
            Err(ServiceError::Connect(..)) => {
                return Err(ServiceError::NotStarted(spec.place.socket.clone()))
            }
            other => return other,
        }
    }
}

/// Starts the service, detached (its own session, no descriptor of ours but its log), unless
/// its lock is held: then a service is there or starting, and the caller connects to it. Two
/// fronts that start one at once make two processes, of which the one that does not get the
/// lock ends at once ([`super::service::take_lock`]).
///
/// Errors: [`ServiceError::Start`].
fn start(spec: &ServiceSpec) -> Result<(), ServiceError> {
    match take_lock(&spec.place) {
        Ok(Some(lock)) => drop(lock),
        Ok(None) => return Ok(()),
        Err(e) => return Err(ServiceError::Start(std::io::Error::other(e))),
    }
    let log = std::fs::File::options()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(&spec.place.log)
        .map_err(ServiceError::Start)?;
    let mut command = std::process::Command::new(&spec.exe);
    command
        .args(&spec.args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log);
    // SAFETY: `pre_exec` runs in the forked child before `exec` and makes only
    // async-signal-safe system calls (setsid, close_range): no allocation, no locks.
    unsafe {
        command.pre_exec(|| {
            // Its own session: no signal meant for the front's terminal or process group
            // (Ctrl-C, a hang-up) reaches the service.
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            crate::worker::spawn::pre_exec(&[])
        });
    }
    let mut child = command.spawn().map_err(ServiceError::Start)?;
    tracing::info!(
        "started the zygote service {} (pid {}), log: {}",
        spec.key.short(),
        child.id(),
        spec.place.log.display()
    );
    // Reaped should it end before this front does; usually it outlives it.
    std::thread::spawn(move || child.wait());
    Ok(())
}

/// Waits until `conn` has a message, for at most `timeout`, then reads it.
///
/// Errors: [`ServiceError::Timeout`], [`ServiceError::Closed`], [`ServiceError::Control`].
pub fn receive_within(conn: &OwnedFd, timeout: Duration) -> Result<Control, ServiceError> {
    let until = Instant::now() + timeout;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        let slice = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(conn.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(slice)) {
            Ok(0) if Instant::now() < until => continue,
            Ok(0) => return Err(ServiceError::Timeout(timeout)),
            Ok(_) => break,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(ServiceError::Control(ControlError::Io(e))),
        }
    }
    match control::receive(conn.as_fd()).map_err(ServiceError::Control)? {
        Some((message, _)) => Ok(message),
        None => Err(ServiceError::Closed),
    }
}
