//! The seccomp-bpf filters of a sealed worker (seccomp(2)), for x86-64 and aarch64.
//!
//! The lists name system calls by `libc::SYS_*` of the target, and the filter checks the
//! architecture first ([`ARCH`]: a call made in another ABI kills the worker). aarch64 has no
//! `open`, `creat`, `fork` or `vfork` (only `openat` and `clone`, both named here); every other
//! call and every rule means the same on both.
//!
//! The allowlist was derived by tracing real workers with `strace -f` from the moment they seal
//! themselves (`prctl(PR_SET_DUMPABLE, 0)`) to their end, through the Python client suites
//! `test_stdio_basics`, `test_limits` (timers, output floods, memory growth, time limits),
//! `test_dependencies` (PyPI installs) and `test_adversarial` (fetch with `--allow-net`,
//! `os.abort`, `os._exit`, escapes tried from Python): 63 workers, 28 distinct system calls
//! (`tests/sandbox_escape.rs` tries what lies outside). Each group below says what uses it.
//! A few calls that the trace did not show are allowed and marked as such, with the reason.
//!
//! Three filters are stacked; for every call the kernel takes the most severe answer of all
//! (seccomp(2), "the return value with the highest precedence": kill > errno > allow):
//! 1. [`FATAL`] (and `clone` without `CLONE_THREAD`, `kill`/`tgkill` of another process): the
//!    kernel kills the whole worker (`SECCOMP_RET_KILL_PROCESS`), which the front sees as a
//!    dead worker (the call gets a run error, the pool starts a new worker);
//! 2. `clone3` fails with `ENOSYS`: its flags sit in memory that BPF cannot read, and on
//!    `ENOSYS` glibc's `pthread_create` falls back to `clone(2)`, whose flags it can;
//! 3. [`ALLOWED`] (and the argument-checked rules of [`allow_rules`]): allowed; anything else
//!    fails with `EPERM`.
//!
//! All three are installed with `SECCOMP_FILTER_FLAG_TSYNC`, so every thread the engine
//! already has (the JIT workers, the heap helper) is covered, and every later one inherits
//! them (seccomp(2): filters are inherited across `clone`).

use super::{ConfineError, Layer};
use crate::interpreter::dirty_pages::{self, Descriptors};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use std::collections::BTreeMap;

/// System calls a sealed worker may make with any arguments, by what needs them.
pub const ALLOWED: &[(&str, &[libc::c_long])] = &[
    (
        // The protocol pipes (stdin, stdout), the log (stderr), and bmalloc's re-reads of
        // /proc/self/statm through the descriptor it opened before sealing.
        "protocol and already open descriptors",
        &[libc::SYS_read, libc::SYS_write, libc::SYS_pread64],
    ),
    (
        // WebAssembly memories and their growth, the JIT's executable memory (W^X flips),
        // the GC's heap, malloc. Not in the trace but part of the same allocators:
        // `mremap` (glibc realloc of large blocks).
        "memory",
        &[
            libc::SYS_mmap,
            libc::SYS_munmap,
            libc::SYS_mprotect,
            libc::SYS_madvise,
            libc::SYS_brk,
            libc::SYS_mremap,
        ],
    ),
    (
        // Locks and condition variables between the main thread and the JIT / GC helpers,
        // the event loop's sleeps until the next timer, yields of spin locks.
        "synchronization and sleeping",
        &[
            libc::SYS_futex,
            libc::SYS_sched_yield,
            libc::SYS_clock_nanosleep,
            libc::SYS_nanosleep,
        ],
    ),
    (
        // The GC stops and resumes the engine's threads with SIGUSR1 (tgkill is checked
        // separately: own process only) and waits in sigsuspend.
        "signals",
        &[
            libc::SYS_rt_sigprocmask,
            libc::SYS_rt_sigreturn,
            libc::SYS_rt_sigsuspend,
            libc::SYS_getpid,
            libc::SYS_gettid,
        ],
    ),
    (
        // Threads the engine starts after sealing (a second JIT worker, the heap helper on
        // the first large collection): glibc's pthread_create and thread start-up. `clone`
        // itself is checked separately (CLONE_THREAD only). `clone3` is allowed here only so
        // that the clone3 filter's ENOSYS is the answer (between two errno answers the last
        // installed filter's wins, seccomp(2)); it never succeeds.
        "thread start-up and end",
        &[
            libc::SYS_clone3,
            libc::SYS_set_robust_list,
            libc::SYS_rseq,
            libc::SYS_sched_getaffinity,
            libc::SYS_exit,
        ],
    ),
    (
        // Python's `os.urandom`/`random` seeds through Emscripten → crypto.getRandomValues,
        // WTF's random numbers.
        "randomness",
        &[libc::SYS_getrandom],
    ),
    (
        // Not in the trace, allowed by reason: `exit_group` ends the worker when stdin
        // closes (the traced workers were all killed by the front first); clock calls are
        // served by the vDSO and only reach the kernel when the clock source cannot be read
        // from user space; `restart_syscall` is the kernel's own restart of an interrupted
        // sleep after a signal.
        "process end and clocks (by reason)",
        &[
            libc::SYS_exit_group,
            libc::SYS_clock_gettime,
            libc::SYS_clock_getres,
            libc::SYS_gettimeofday,
            libc::SYS_restart_syscall,
        ],
    ),
];

/// What a scientific worker adds to [`ALLOWED`] (docs/architecture.md §5.4): its guest's
/// WASI file calls, which wasmtime-wasi makes through cap-std beneath the folders the guest
/// was given (Landlock bounds them to its artifacts, read-only, and its scratch folder), and
/// the alternate signal stack wasmtime's trap handler runs on. `openat` leaves [`FATAL`] for
/// it; `openat2` fails with `ENOSYS`, on which cap-std resolves paths itself with `openat`.
pub const GUEST_FILES: &[(&str, &[libc::c_long])] = &[
    (
        "the guest's files: open, read, write, list, rename, remove beneath its folders",
        &[
            libc::SYS_openat,
            libc::SYS_close,
            libc::SYS_fstat,
            libc::SYS_newfstatat,
            libc::SYS_statx,
            libc::SYS_getdents64,
            libc::SYS_lseek,
            libc::SYS_fcntl,
            libc::SYS_pwrite64,
            libc::SYS_readv,
            libc::SYS_writev,
            libc::SYS_preadv,
            libc::SYS_pwritev,
            libc::SYS_mkdirat,
            libc::SYS_unlinkat,
            libc::SYS_renameat,
            libc::SYS_renameat2,
            libc::SYS_readlinkat,
            libc::SYS_symlinkat,
            libc::SYS_linkat,
            libc::SYS_faccessat,
            libc::SYS_faccessat2,
            libc::SYS_utimensat,
            libc::SYS_ftruncate,
            libc::SYS_fsync,
            libc::SYS_fdatasync,
            libc::SYS_fadvise64,
        ],
    ),
    (
        "wasmtime's trap handler: the alternate signal stack of each thread that runs the guest",
        &[libc::SYS_sigaltstack],
    ),
];

/// Which filter a worker gets: its runtime's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// A Pyodide worker: no files at all.
    Pyodide,
    /// A scientific worker: [`GUEST_FILES`] as well.
    Scientific,
}

/// The architecture the filters are built for: the target's.
#[cfg(target_arch = "x86_64")]
const ARCH: TargetArch = TargetArch::x86_64;
/// The architecture the filters are built for: the target's.
#[cfg(target_arch = "aarch64")]
const ARCH: TargetArch = TargetArch::aarch64;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("the seccomp filter is written for x86-64 and aarch64 only (filter.rs)");

/// `fork(2)` and `vfork(2)`, where the architecture has them; aarch64 makes processes only
/// with `clone`, whose process form [`fatal_rules`] kills.
#[cfg(target_arch = "x86_64")]
const LEGACY_PROCESS_CALLS: &[libc::c_long] = &[libc::SYS_fork, libc::SYS_vfork];
#[cfg(not(target_arch = "x86_64"))]
const LEGACY_PROCESS_CALLS: &[libc::c_long] = &[];

/// `open(2)` and `creat(2)`, where the architecture has them; aarch64 has only `openat`.
#[cfg(target_arch = "x86_64")]
const LEGACY_FILE_CALLS: &[libc::c_long] = &[libc::SYS_open, libc::SYS_creat];
#[cfg(not(target_arch = "x86_64"))]
const LEGACY_FILE_CALLS: &[libc::c_long] = &[];

/// System calls that no legitimate path of a sealed worker makes and that only serve an
/// escape: the worker is killed on the spot.
pub const FATAL: &[(&str, &[libc::c_long])] = &[
    ("new programs", &[libc::SYS_execve, libc::SYS_execveat]),
    (
        "new processes (threads go through clone with CLONE_THREAD)",
        LEGACY_PROCESS_CALLS,
    ),
    (
        "files (Landlock also forbids them; the engine opens nothing after sealing)",
        &[
            libc::SYS_openat,
            libc::SYS_openat2,
            libc::SYS_open_by_handle_at,
            libc::SYS_name_to_handle_at,
        ],
    ),
    ("files, the older calls", LEGACY_FILE_CALLS),
    (
        "network (the front performs every fetch)",
        &[
            libc::SYS_socket,
            libc::SYS_socketpair,
            libc::SYS_connect,
            libc::SYS_bind,
            libc::SYS_listen,
            libc::SYS_accept,
            libc::SYS_accept4,
        ],
    ),
    (
        "other processes' memory and control",
        &[
            libc::SYS_ptrace,
            libc::SYS_process_vm_readv,
            libc::SYS_process_vm_writev,
            libc::SYS_pidfd_open,
            libc::SYS_pidfd_getfd,
            libc::SYS_pidfd_send_signal,
            libc::SYS_kcmp,
        ],
    ),
    (
        "namespaces, mounts, kernel facilities",
        &[
            libc::SYS_unshare,
            libc::SYS_setns,
            libc::SYS_mount,
            libc::SYS_umount2,
            libc::SYS_pivot_root,
            libc::SYS_chroot,
            libc::SYS_bpf,
            libc::SYS_keyctl,
            libc::SYS_add_key,
            libc::SYS_request_key,
            libc::SYS_perf_event_open,
            libc::SYS_userfaultfd,
            libc::SYS_io_uring_setup,
            libc::SYS_io_uring_enter,
            libc::SYS_io_uring_register,
            libc::SYS_init_module,
            libc::SYS_finit_module,
            libc::SYS_delete_module,
            libc::SYS_kexec_load,
            libc::SYS_kexec_file_load,
            libc::SYS_memfd_create,
        ],
    ),
];

/// `prctl(PR_SET_NAME, …)`: new engine threads name themselves (`JITWorker`, `HeapHelper`).
/// Every other option (`PR_SET_DUMPABLE 1`, …) fails with `EPERM`.
const PRCTL_SET_NAME: u64 = libc::PR_SET_NAME as u64;

/// `prlimit64(pid, resource, NULL, &old)`: glibc's `pthread_getattr_np` reads the stack limit;
/// setting any limit (a non-NULL `new_limit`, argument 2) fails with `EPERM`.
const NULL_POINTER: u64 = 0;

/// `CLONE_THREAD` (clone(2)): a new thread of this process, never a new process.
const CLONE_THREAD: u64 = libc::CLONE_THREAD as u64;

fn condition(
    arg: u8,
    op: SeccompCmpOp,
    value: u64,
) -> Result<SeccompCondition, seccompiler::BackendError> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Qword, op, value)
}

fn rule(conditions: Vec<SeccompCondition>) -> Result<SeccompRule, seccompiler::BackendError> {
    SeccompRule::new(conditions)
}

/// Whose process an argument-checked rule matches: the worker's own, or any other.
#[derive(Clone, Copy)]
enum Process {
    /// A thread of this process, a signal to this process.
    Own,
    /// A new process, a signal to another process.
    Other,
}

/// The rules on `clone`, `tgkill` and `kill` that match `process`: `clone` by its
/// `CLONE_THREAD` flag, the signals by their target (argument 0: `pid` of kill(2), `tgid` of
/// tgkill(2)). The allowlist takes [`Process::Own`] and the fatal filter [`Process::Other`],
/// so that the two are exact complements.
fn process_rules(
    pid: u64,
    process: Process,
) -> Result<Vec<(libc::c_long, Vec<SeccompRule>)>, seccompiler::BackendError> {
    // The `CLONE_THREAD` bit of `clone`'s flags (set: a thread; clear: a process) and how the
    // signal's target compares with `pid`.
    let (clone_thread, target) = match process {
        Process::Own => (CLONE_THREAD, SeccompCmpOp::Eq),
        Process::Other => (0, SeccompCmpOp::Ne),
    };
    let clone = condition(0, SeccompCmpOp::MaskedEq(CLONE_THREAD), clone_thread)?;
    let signal = || -> Result<Vec<SeccompRule>, seccompiler::BackendError> {
        Ok(vec![rule(vec![condition(0, target.clone(), pid)?])?])
    };
    Ok(vec![
        (libc::SYS_clone, vec![rule(vec![clone])?]),
        (libc::SYS_tgkill, signal()?),
        (libc::SYS_kill, signal()?),
    ])
}

/// Allowed only with checked arguments: threads (not processes), signals to this process,
/// limits read (not set), thread names; with `tracked` (`src/interpreter/dirty_pages.rs`), `ioctl`
/// on its two descriptors with its three requests, and `read`/`pread64` on any descriptor
/// but the page map (its entries say which pages are shared; the scan says only which were
/// written). A call named here and in [`ALLOWED`] is allowed only as named here ([`program`]).
fn allow_rules(
    pid: u64,
    tracked: Option<Descriptors>,
) -> Result<Vec<(libc::c_long, Vec<SeccompRule>)>, seccompiler::BackendError> {
    let mut rules = process_rules(pid, Process::Own)?;
    rules.extend([
        (
            libc::SYS_prlimit64,
            vec![rule(vec![condition(2, SeccompCmpOp::Eq, NULL_POINTER)?])?],
        ),
        (
            libc::SYS_prctl,
            vec![rule(vec![condition(0, SeccompCmpOp::Eq, PRCTL_SET_NAME)?])?],
        ),
    ]);
    if let Some(fds) = tracked {
        rules.extend(tracking_rules(fds)?);
    }
    Ok(rules)
}

/// The rules of [`allow_rules`] for dirty-page tracking on `fds`.
fn tracking_rules(
    fds: Descriptors,
) -> Result<Vec<(libc::c_long, Vec<SeccompRule>)>, seccompiler::BackendError> {
    // ioctl(2)'s descriptor and request are `unsigned int` in the kernel: compare 32 bits.
    let on = |fd: i32, request: u32| -> Result<SeccompRule, seccompiler::BackendError> {
        rule(vec![
            SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, fd as u64)?,
            SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, request.into())?,
        ])
    };
    let not_page_map = || -> Result<Vec<SeccompRule>, seccompiler::BackendError> {
        Ok(vec![rule(vec![SeccompCondition::new(
            0,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Ne,
            fds.page_map as u64,
        )?])?])
    };
    Ok(vec![
        (
            libc::SYS_ioctl,
            vec![
                on(fds.userfaultfd, dirty_pages::UFFDIO_REGISTER)?,
                on(fds.userfaultfd, dirty_pages::UFFDIO_WRITEPROTECT)?,
                on(fds.page_map, dirty_pages::PAGEMAP_SCAN)?,
            ],
        ),
        (libc::SYS_read, not_page_map()?),
        (libc::SYS_pread64, not_page_map()?),
    ])
}

/// [`FATAL`] for `profile`: a scientific worker's guest opens files (`openat`, bounded by
/// Landlock) and tries `openat2` first (answered `ENOSYS`).
fn fatal_calls(profile: Profile) -> Vec<(&'static str, Vec<libc::c_long>)> {
    let opens = [libc::SYS_openat, libc::SYS_openat2];
    FATAL
        .iter()
        .map(|(why, calls)| {
            let kept = calls
                .iter()
                .copied()
                .filter(|call| profile == Profile::Pyodide || !opens.contains(call));
            (*why, kept.collect())
        })
        .collect()
}

/// The calls that fail with `ENOSYS` so that the caller falls back: `clone3` (to `clone`),
/// and for a scientific worker `openat2` (to cap-std's own resolution with `openat`).
fn fallback_calls(profile: Profile) -> Vec<(&'static str, Vec<libc::c_long>)> {
    let mut calls = vec![("clone3: fall back to clone", vec![libc::SYS_clone3])];
    if profile == Profile::Scientific {
        calls.push(("openat2: fall back to openat", vec![libc::SYS_openat2]));
    }
    calls
}

/// The unconditional allowlist of `profile`.
fn allowed_calls(profile: Profile) -> Vec<(&'static str, Vec<libc::c_long>)> {
    let extra: &[(&str, &[libc::c_long])] = match profile {
        Profile::Pyodide => &[],
        Profile::Scientific => GUEST_FILES,
    };
    ALLOWED
        .iter()
        .chain(extra)
        .map(|(why, calls)| (*why, calls.to_vec()))
        .collect()
}

/// Killed when the arguments say escape: a new process, a signal to another process.
fn fatal_rules(
    pid: u64,
) -> Result<Vec<(libc::c_long, Vec<SeccompRule>)>, seccompiler::BackendError> {
    process_rules(pid, Process::Other)
}

fn program(
    unconditional: &[(&str, Vec<libc::c_long>)],
    conditional: Vec<(libc::c_long, Vec<SeccompRule>)>,
    mismatch: SeccompAction,
    matched: SeccompAction,
) -> Result<BpfProgram, seccompiler::BackendError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for (_, calls) in unconditional {
        for &call in calls {
            rules.insert(call, Vec::new());
        }
    }
    // An unconditional call that also has rules becomes conditional: seccompiler allows a
    // call with an empty rule list whatever its arguments, and one with rules only when one
    // matches (how `tracking_rules` narrows `read`).
    for (call, list) in conditional {
        rules.entry(call).or_default().extend(list);
    }
    SeccompFilter::new(rules, mismatch, matched, ARCH)?.try_into()
}

/// The three programs, in the order they are installed. The allowlist comes last: once it is
/// in force, `prctl` and `seccomp` themselves are forbidden.
fn programs(
    pid: u64,
    tracked: Option<Descriptors>,
    profile: Profile,
) -> Result<[BpfProgram; 3], seccompiler::BackendError> {
    Ok([
        program(
            &fatal_calls(profile),
            fatal_rules(pid)?,
            SeccompAction::Allow,
            SeccompAction::KillProcess,
        )?,
        program(
            &fallback_calls(profile),
            Vec::new(),
            SeccompAction::Allow,
            SeccompAction::Errno(libc::ENOSYS as u32),
        )?,
        program(
            &allowed_calls(profile),
            allow_rules(pid, tracked)?,
            SeccompAction::Errno(libc::EPERM as u32),
            SeccompAction::Allow,
        )?,
    ])
}

/// Number of system calls the allowlist names (unconditional and argument-checked).
///
/// Errors: the rules cannot be built (as [`install`] would fail).
fn allowed_count(
    tracked: Option<Descriptors>,
    profile: Profile,
) -> Result<usize, seccompiler::BackendError> {
    let conditional = allow_rules(0, tracked)?;
    let calls: std::collections::BTreeSet<libc::c_long> = allowed_calls(profile)
        .into_iter()
        .flat_map(|(_, calls)| calls)
        .chain(conditional.iter().map(|(call, _)| *call))
        .collect();
    Ok(calls.len())
}

/// Builds and installs the filters on every thread. `threads` is the thread count now;
/// `tracked`, the descriptors of the worker's dirty-page tracking, if it has them; `profile`,
/// the worker's runtime's.
pub fn install(
    threads: Option<usize>,
    tracked: Option<Descriptors>,
    profile: Profile,
) -> Result<Layer, ConfineError> {
    let pid = u64::from(std::process::id());
    for program in programs(pid, tracked, profile).map_err(ConfineError::SeccompBuild)? {
        seccompiler::apply_filter_all_threads(&program).map_err(ConfineError::SeccompInstall)?;
    }
    let threads = threads.map_or("?".to_owned(), |n| n.to_string());
    let count = allowed_count(tracked, profile).map_err(ConfineError::SeccompBuild)?;
    let ioctl = match tracked {
        Some(_) => ", ioctl on 2 page-tracking descriptors only",
        None => "",
    };
    let files = match profile {
        Profile::Pyodide => "",
        Profile::Scientific => ", the guest's file calls beneath its folders",
    };
    Ok(Layer::On(format!(
        "{count} calls allowed{ioctl}{files}, tsync over {threads} thread(s)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROFILES: [Profile; 2] = [Profile::Pyodide, Profile::Scientific];

    #[test]
    fn the_filters_compile() {
        let tracked = Descriptors {
            userfaultfd: 5,
            page_map: 6,
        };
        for (fds, profile) in [None, Some(tracked)].into_iter().zip(PROFILES) {
            let [a, b, c] = programs(1, fds, profile).unwrap();
            assert!(!a.is_empty() && !b.is_empty() && !c.is_empty());
        }
        // Tracking adds ioctl and nothing else (read and pread64 are narrowed, not added).
        assert_eq!(
            allowed_count(Some(tracked), Profile::Pyodide).unwrap(),
            allowed_count(None, Profile::Pyodide).unwrap() + 1
        );
    }

    #[test]
    fn nothing_is_both_allowed_and_fatal() {
        for profile in PROFILES {
            let allowed = allowed_calls(profile);
            for (_, fatal) in fatal_calls(profile) {
                for call in fatal {
                    assert!(
                        allowed.iter().all(|(_, a)| !a.contains(&call)),
                        "syscall {call} in {profile:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn only_a_scientific_worker_opens_files() {
        let allows = |profile: Profile, call| {
            allowed_calls(profile)
                .iter()
                .any(|(_, calls)| calls.contains(&call))
        };
        assert!(!allows(Profile::Pyodide, libc::SYS_openat));
        assert!(allows(Profile::Scientific, libc::SYS_openat));
        let fatal = |profile: Profile, call| {
            fatal_calls(profile)
                .iter()
                .any(|(_, calls)| calls.contains(&call))
        };
        assert!(fatal(Profile::Pyodide, libc::SYS_openat2));
        assert!(!fatal(Profile::Scientific, libc::SYS_openat2));
        // Every other fatal call stays fatal for both.
        assert!(fatal(Profile::Scientific, libc::SYS_execve));
        assert!(fatal(Profile::Scientific, libc::SYS_socket));
    }
}
