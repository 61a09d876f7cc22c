//! Descriptors a worker inherits from the process that started it, each named by an argument
//! (`--name=N`: its number, kept across `exec`; `Worker::start`): the memory snapshot to
//! restore and, in a zygote, its control socket.
//!
//! Both the interpreter's boot (`boot.rs`) and the zygote's side of the fork server
//! (`fork_server.rs`) take theirs here, so that neither has to reach into the other.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// Highest descriptor number of the standard streams (stdin 0, stdout 1, stderr 2): an
/// inherited descriptor is always past them.
const LAST_STANDARD_FD: RawFd = 2;

/// Why an inherited descriptor's argument names no descriptor this process may take: the
/// number is a standard stream's, or no descriptor of this process is open under it.
#[derive(Debug, thiserror::Error)]
#[error("{prefix}{fd} is not an open descriptor")]
pub struct DescriptorError {
    prefix: &'static str,
    fd: RawFd,
}

/// The descriptor the front handed this worker as `fd` under the argument `prefix` (`--name=N`:
/// its number, kept across `exec`; `Worker::start`), or `None` without that argument.
///
/// Errors: [`DescriptorError`] when `fd` is no open descriptor past stderr.
pub fn inherited_descriptor(
    prefix: &'static str,
    fd: Option<RawFd>,
) -> Result<Option<OwnedFd>, DescriptorError> {
    let Some(fd) = fd else {
        return Ok(None);
    };
    // SAFETY: F_GETFD only reads the descriptor's flags; it fails with EBADF if it is not open.
    if fd <= LAST_STANDARD_FD || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(DescriptorError { prefix, fd });
    }
    // SAFETY: the front passed this descriptor for this one use (`Worker::start`); it is open
    // (checked above), and nothing else in this process owns it.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
}
