//! What the front does for a worker between `fork` and `exec` (`Command::pre_exec`), where
//! the child still has one thread.

/// First descriptor that a worker must not inherit: everything past stdin, stdout, stderr.
const FIRST_PRIVATE_FD: libc::c_uint = 3;

/// Runs in the forked child before `exec`. Each of `inherited` keeps its number and loses
/// close-on-exec (the zygote's control socket, named to it by `--control-fd=`, and the memory
/// snapshot to restore, by `--snapshot-fd=`): they are the only descriptors past stderr that
/// reach the worker. Not moved with `dup2`, which could close a
/// descriptor of the standard library's own. Only async-signal-safe system calls: no
/// allocation, no locks (the front is multi-threaded; see `fork(2)`, signal-safety(7)).
///
/// Marks every descriptor above stderr close-on-exec (`close_range(2)` with
/// `CLOSE_RANGE_CLOEXEC`, Linux 5.11): a descriptor the front opened without `O_CLOEXEC` (a
/// library's, a socket of the HTTP server) never reaches the worker. Marking rather than
/// closing keeps the standard library's own close-on-exec pipe, on which it reports a failed
/// `exec`, working. Namespaces are entered by the worker itself (`namespaces.rs`), where it
/// can tell what it got and report it.
///
/// # Errors
/// `fcntl` fails on an inherited descriptor.
pub fn pre_exec(inherited: &[std::os::fd::RawFd]) -> std::io::Result<()> {
    // SAFETY: close_range takes plain integers and touches no memory; marking descriptors
    // close-on-exec cannot invalidate anything this child still uses before `exec`. An old
    // kernel answers ENOSYS/EINVAL: then descriptors are not marked (std's own are CLOEXEC).
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            FIRST_PRIVATE_FD,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        );
    }
    for &fd in inherited {
        // SAFETY: integers only; clears close-on-exec on a descriptor this child holds.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
