//! `mcp-run-python zygote status` and `zygote stop`: what an operator sees of this user's
//! zygote services, and how one ends them. Each asks a service over its own socket, as a
//! front does; a socket file without a live service behind it is reported as stale.

use super::front::{connect_to, receive_within, ServiceError};
use super::place::ServicePlace;
use crate::protocol::control;
use crate::protocol::control::{Control, ServiceStatus};
use std::os::fd::AsFd;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long a service may take to answer `status` or `stop`.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// How long `stop` waits for a stopped service's socket file to go (it ends its zygote and
/// workers first).
const STOP_WAIT: Duration = Duration::from_secs(10);

/// Pause between looks at a stopping service's socket file.
const STOP_POLL: Duration = Duration::from_millis(20);

/// One service as `zygote status` sees it.
pub enum Seen {
    /// It answered: its digest, pid and status.
    Live {
        digest: String,
        pid: u32,
        status: ServiceStatus,
    },
    /// Nothing answers at its socket (a stale file, left by a service that was killed).
    Stale,
    /// Something answered, but not as a service does.
    Broken(ServiceError),
}

/// Asks the service at `place` how it stands.
pub fn status(place: &ServicePlace) -> Seen {
    let (conn, digest, pid) = match connect_to(&place.socket) {
        Ok(hello) => hello,
        Err(ServiceError::Connect(..)) => return Seen::Stale,
        Err(e) => return Seen::Broken(e),
    };
    if let Err(e) = control::send(conn.as_fd(), &Control::Status, &[]) {
        return Seen::Broken(ServiceError::Control(e));
    }
    loop {
        match receive_within(&conn, ANSWER_TIMEOUT) {
            Ok(Control::StatusReport(status)) => {
                return Seen::Live {
                    digest,
                    pid,
                    status,
                }
            }
            // A service that became ready meanwhile says so first.
            Ok(Control::Serving { .. }) => continue,
            Ok(other) => return Seen::Broken(ServiceError::Unexpected(other)),
            Err(e) => return Seen::Broken(e),
        }
    }
}

/// Stops the service at `place` and waits (up to [`STOP_WAIT`]) until its process has ended
/// (its socket file is gone by then). Returns its pid, or `None` when no service answered
/// there (a stale socket file is removed).
///
/// Errors: [`ServiceError`] when the service does not confirm, or does not end in time.
pub fn stop(place: &ServicePlace) -> Result<Option<u32>, ServiceError> {
    let (conn, _, pid) = match connect_to(&place.socket) {
        Ok(hello) => hello,
        Err(ServiceError::Connect(..)) => {
            remove_if_stale(place);
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    control::send(conn.as_fd(), &Control::Stop, &[]).map_err(ServiceError::Control)?;
    loop {
        match receive_within(&conn, ANSWER_TIMEOUT) {
            Ok(Control::Stopping) | Err(ServiceError::Closed) => break,
            Ok(Control::Serving { .. }) => continue,
            Ok(other) => return Err(ServiceError::Unexpected(other)),
            Err(e) => return Err(e),
        }
    }
    let until = Instant::now() + STOP_WAIT;
    while place.socket.exists() || !has_ended(pid) {
        if Instant::now() > until {
            return Err(ServiceError::Timeout(STOP_WAIT));
        }
        std::thread::sleep(STOP_POLL);
    }
    Ok(Some(pid))
}

/// Whether process `pid` has ended: gone from `/proc`, or a zombie waiting for its parent.
fn has_ended(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the first field after the command name, which ends with the last `)`.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

/// Removes a socket file no service listens at, if its lock is free (no service is starting).
fn remove_if_stale(place: &ServicePlace) {
    if let Ok(Some(_lock)) = super::service::take_lock(place) {
        let _ = std::fs::remove_file(&place.socket);
    }
}

/// The places `zygote status` and `zygote stop` look at: `socket` alone when given
/// (`--zygote-socket`), else every service in `dirs`.
pub fn places(socket: Option<&Path>, dirs: &[std::path::PathBuf]) -> Vec<ServicePlace> {
    match socket {
        Some(socket) => vec![ServicePlace::at(socket.to_owned())],
        None => dirs.iter().flat_map(|d| ServicePlace::all_in(d)).collect(),
    }
}
