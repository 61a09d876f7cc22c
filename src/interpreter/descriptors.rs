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

/// Why an inherited descriptor's argument names no descriptor this process may take.
#[derive(Debug, thiserror::Error)]
pub enum DescriptorError {
    /// The argument's value is not a number. The parse error is left out on purpose: the
    /// text (which the front reads in a `Fatal` reply) has always been this one line.
    #[error("{prefix}{value} is not a descriptor")]
    NotANumber { prefix: String, value: String },
    /// The number is a standard stream's, or no descriptor of this process is open under it.
    #[error("{prefix}{value} is not an open descriptor")]
    NotOpen { prefix: String, value: String },
}

/// The descriptor the front handed this worker under the argument `prefix` (`--name=N`: its
/// number, kept across `exec`; `Worker::start`), or `None` without that argument.
///
/// Errors: [`DescriptorError`] when the argument names no open descriptor past stderr.
pub fn inherited_descriptor(prefix: &str) -> Result<Option<OwnedFd>, DescriptorError> {
    let Some(value) = std::env::args().find_map(|a| a.strip_prefix(prefix).map(str::to_owned))
    else {
        return Ok(None);
    };
    let Ok(fd) = value.parse::<RawFd>() else {
        return Err(DescriptorError::NotANumber {
            prefix: prefix.to_owned(),
            value,
        });
    };
    // SAFETY: F_GETFD only reads the descriptor's flags; it fails with EBADF if it is not open.
    if fd <= LAST_STANDARD_FD || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(DescriptorError::NotOpen {
            prefix: prefix.to_owned(),
            value,
        });
    }
    // SAFETY: the front passed this descriptor for this one use (`Worker::start`); it is open
    // (checked above), and nothing else in this process owns it.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
}
