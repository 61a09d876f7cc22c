//! `prctl(2)` flags and resource limits (`setrlimit(2)`) of a sealed worker.

use super::{ConfineError, Layer};

/// Most descriptors a sealed worker may hold. A booted worker holds 7 (measured through
/// `/proc/<pid>/fd`: the three protocol pipes, two `/dev/urandom`, an eventfd and
/// `/proc/self/statm`, the last three the engine's); the rest is room for what the engine may
/// still create (an eventfd or a pipe), never for files: seccomp forbids opening any.
pub const NOFILE_MAX: libc::rlim_t = 16;

/// Largest core file (bytes): none, a core holds the worker's memory (user data).
pub const CORE_MAX_BYTES: libc::rlim_t = 0;

/// Largest file the worker may write (bytes): none, it has no business writing files.
/// Pipes are not files here: `RLIMIT_FSIZE` applies to regular files only (setrlimit(2)).
pub const FSIZE_MAX_BYTES: libc::rlim_t = 0;

/// Most descriptors a sealed scientific worker may hold: its guest's preopened folders and the
/// files its code keeps open (WASI's descriptors are the host's, one for one), beside the
/// protocol's.
pub const GUEST_NOFILE_MAX: libc::rlim_t = 256;

/// Largest file a scientific worker's guest may write in its scratch folder (bytes, 256 MiB):
/// past it the write fails with `EFBIG` (an `OSError` in Python), as `SIGXFSZ` is ignored.
pub const GUEST_FSIZE_MAX_BYTES: libc::rlim_t = 256 << 20;

/// `PR_SET_NO_NEW_PRIVS` (prctl(2)): `execve` can never grant privileges again (set-user-ID
/// bits, file capabilities), and unprivileged seccomp becomes possible (seccomp(2)).
pub fn no_new_privs() -> Result<Layer, ConfineError> {
    prctl(libc::PR_SET_NO_NEW_PRIVS, 1, "PR_SET_NO_NEW_PRIVS")?;
    Ok(Layer::On(String::new()))
}

/// `PR_SET_DUMPABLE 0` (prctl(2)): no core dump, and processes of the same user that lack
/// `CAP_SYS_PTRACE` cannot attach to the worker nor read its `/proc/<pid>/mem`, `environ`, `fd`
/// (proc(5), ptrace(2) "Ptrace access mode checking").
pub fn not_dumpable() -> Result<Layer, ConfineError> {
    prctl(libc::PR_SET_DUMPABLE, 0, "PR_SET_DUMPABLE")?;
    Ok(Layer::On(String::new()))
}

fn prctl(
    option: libc::c_int,
    value: libc::c_ulong,
    what: &'static str,
) -> Result<(), ConfineError> {
    // SAFETY: PR_SET_NO_NEW_PRIVS and PR_SET_DUMPABLE take one integer argument and the rest
    // zero (prctl(2)); they touch no memory of ours.
    let rc = unsafe {
        libc::prctl(
            option,
            value,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if rc != 0 {
        return Err(ConfineError::Prctl {
            what,
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// Sets soft and hard limit of `resource` to `max`. Lowering a hard limit is irreversible
/// without `CAP_SYS_RESOURCE`, and the seccomp filter forbids setting limits at all.
fn limit(
    resource: libc::__rlimit_resource_t,
    max: libc::rlim_t,
    what: &'static str,
) -> Result<(), ConfineError> {
    let value = libc::rlimit {
        rlim_cur: max,
        rlim_max: max,
    };
    // SAFETY: `value` is a valid rlimit that outlives the call, which only reads it.
    let rc = unsafe { libc::setrlimit(resource, &value) };
    if rc != 0 {
        return Err(ConfineError::Rlimit {
            what,
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// `RLIMIT_CORE 0`, `RLIMIT_FSIZE 0`, `RLIMIT_NOFILE` [`NOFILE_MAX`] (setrlimit(2)).
///
/// Not set, on purpose:
/// - `RLIMIT_NPROC` counts every process *and thread* of the real user ID, across the whole
///   system (setrlimit(2)): a limit low enough to forbid `fork` would stop JavaScriptCore from
///   starting the JIT and GC threads it creates lazily after boot (measured: a worker goes from
///   5 to 6 threads on its first calls), and it depends on what else the user runs. The
///   seccomp filter forbids new processes instead (`clone` without `CLONE_THREAD`, `fork`,
///   `vfork` kill the worker), for every thread.
/// - `RLIMIT_AS`: JavaScriptCore reserves tens of GiB of address space for WebAssembly
///   memories (guard regions); memory is capped by the WebAssembly maximum and the front's
///   resident-memory watch instead.
///
/// A scientific worker (`guest_files`) writes its guest's files: [`GUEST_FSIZE_MAX_BYTES`] and
/// [`GUEST_NOFILE_MAX`] instead, with `SIGXFSZ` ignored so that a file past the limit is an
/// error of the write, not the worker's end.
pub fn apply(guest_files: bool) -> Result<Layer, ConfineError> {
    let (fsize, nofile) = match guest_files {
        false => (FSIZE_MAX_BYTES, NOFILE_MAX),
        true => {
            // SAFETY: sets the disposition of one signal to "ignore"; no handler runs.
            unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
            (GUEST_FSIZE_MAX_BYTES, GUEST_NOFILE_MAX)
        }
    };
    limit(libc::RLIMIT_CORE, CORE_MAX_BYTES, "RLIMIT_CORE")?;
    limit(libc::RLIMIT_FSIZE, fsize, "RLIMIT_FSIZE")?;
    limit(libc::RLIMIT_NOFILE, nofile, "RLIMIT_NOFILE")?;
    Ok(Layer::On(format!(
        "core {CORE_MAX_BYTES}, fsize {fsize}, nofile {nofile}; no nproc: seccomp forbids new processes"
    )))
}
