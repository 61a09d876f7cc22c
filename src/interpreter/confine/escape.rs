//! Test-only (cargo feature `escape-test`, never in release builds): after sealing, the worker
//! does what native code that took it over would try, and reports each result on stderr, one
//! line per attempt, for `tests/sandbox_escape.rs`:
//!
//! ```text
//! escape-probe <index> <name> trying
//! escape-probe <index> <name> blocked errno <n>      (or: ALLOWED <what>)
//! ```
//!
//! A probe that kills the worker (seccomp `SECCOMP_RET_KILL_PROCESS`) leaves a `trying` line
//! without its result; the test starts a new worker from the next probe.

use std::ffi::CString;
use std::sync::OnceLock;

/// The worker's `--escape-test=<port>,<first probe>[,without-seccomp]`
/// ([`WorkerArgs::escape_test`](crate::protocol::launch::WorkerArgs::escape_test)): the port of
/// the test's listener on 127.0.0.1, the probe to start from (its index or its name, or
/// `stdin`), and whether to leave the seccomp filter out (to show what the other layers hold
/// alone, as if the filter had a hole). Set once at the worker's start ([`request`]); a worker
/// forked from a zygote inherits the zygote's.
static SPEC: OnceLock<String> = OnceLock::new();

/// The third field of the spec that leaves the seccomp filter out.
const WITHOUT_SECCOMP: &str = "without-seccomp";

/// Records the worker's escape-test spec, when it was given one.
pub fn request(spec: Option<&str>) {
    if let Some(spec) = spec {
        let _ = SPEC.set(spec.to_owned());
    }
}

/// Whether the test asked for a worker without its seccomp filter.
pub fn without_seccomp() -> bool {
    SPEC.get()
        .is_some_and(|spec| spec.split(',').nth(2) == Some(WITHOUT_SECCOMP))
}

/// One attempt: `Ok(what)` when it succeeded (an escape), or the errno it failed with.
type Probe = fn(&Target) -> Result<String, i32>;

/// The attempts, in order.
const PROBES: &[(&str, Probe)] = &[
    ("open_etc_passwd", |_| open("/etc/passwd", libc::O_RDONLY)),
    ("list_root", |_| {
        open("/", libc::O_RDONLY | libc::O_DIRECTORY)
    }),
    ("read_front_environ", |t| {
        open(&format!("/proc/{}/environ", t.front), libc::O_RDONLY)
    }),
    ("write_file", |_| {
        open(
            "/tmp/mcp-run-python-escape-test",
            libc::O_WRONLY | libc::O_CREAT,
        )
    }),
    ("tcp_connect_listener", |t| tcp(t.port, true)),
    ("tcp_bind", |_| tcp(0, false)),
    ("execve_bin_sh", |_| execve()),
    ("fork", |_| fork()),
    ("ptrace_front", |t| {
        // SAFETY: PTRACE_ATTACH takes a pid and no memory.
        check(unsafe {
            libc::ptrace(
                libc::PTRACE_ATTACH,
                t.front,
                std::ptr::null_mut::<libc::c_void>(),
                std::ptr::null_mut::<libc::c_void>(),
            )
        })
    }),
    ("kill_front", |t| {
        // SAFETY: kill takes two integers. Signal 0 only checks permission: if the filter
        // had a hole, the test process is not hurt, and success is reported as an escape.
        check(unsafe { libc::kill(t.front, 0) }.into())
    }),
    ("tgkill_front", |t| {
        // SAFETY: as above, signal 0.
        check(unsafe { libc::syscall(libc::SYS_tgkill, t.front, t.front, 0) })
    }),
    ("raise_nofile_limit", |_| {
        let high = libc::rlimit {
            rlim_cur: 1 << 20,
            rlim_max: 1 << 20,
        };
        // SAFETY: `high` outlives the call, which only reads it.
        check(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &high) }.into())
    }),
    ("unshare_user_namespace", |_| {
        // SAFETY: unshare takes one integer.
        check(unsafe { libc::unshare(libc::CLONE_NEWUSER) }.into())
    }),
    ("io_uring_setup", |_| {
        let mut params = [0u8; 120];
        // SAFETY: `params` is a zeroed io_uring_params (120 bytes) that outlives the call.
        check(unsafe { libc::syscall(libc::SYS_io_uring_setup, 4, params.as_mut_ptr()) })
    }),
    ("userfaultfd_with_kernel_faults", |_| {
        // SAFETY: userfaultfd takes flags only; a descriptor it returned is left open (the
        // worker exits after the probes).
        check(unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC) })
    }),
    ("ioctl_other_descriptor", |_| {
        let mut unread: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int into `unread`, which outlives the call.
        check(unsafe { libc::ioctl(0, libc::FIONREAD, &mut unread) }.into())
    }),
    ("read_page_map", |_| {
        // The page map's entries say which pages are shared; only its scan is allowed.
        let fd = crate::interpreter::dirty_pages::page_map_fd().unwrap_or(-1);
        let mut entry = [0u8; 8];
        // SAFETY: reads 8 bytes into `entry`, which outlives the call.
        check(unsafe { libc::pread(fd, entry.as_mut_ptr().cast(), entry.len(), 0) } as i64)
    }),
    ("process_vm_readv_front", |t| {
        let mut byte = 0u8;
        let local = libc::iovec {
            iov_base: (&mut byte as *mut u8).cast(),
            iov_len: 1,
        };
        let remote = libc::iovec {
            iov_base: 0x1000 as *mut libc::c_void,
            iov_len: 1,
        };
        // SAFETY: `local` points at one writable byte that outlives the call.
        check(unsafe { libc::process_vm_readv(t.front, &local, 1, &remote, 1, 0) } as i64)
    }),
];

/// What the probes aim at.
struct Target {
    /// The process that started the worker (the front, or the test).
    front: libc::pid_t,
    /// A TCP port on 127.0.0.1 where the test listens.
    port: u16,
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn check(rc: i64) -> Result<String, i32> {
    if rc < 0 {
        Err(errno())
    } else {
        Ok(format!("returned {rc}"))
    }
}

fn open(path: &str, flags: libc::c_int) -> Result<String, i32> {
    let path = CString::new(path).map_err(|_| libc::EINVAL)?;
    // SAFETY: `path` is a NUL-terminated string that outlives the call; mode for O_CREAT.
    let fd = unsafe { libc::open(path.as_ptr(), flags, 0o600 as libc::c_uint) };
    check(fd.into()).map(|_| format!("opened fd {fd}"))
}

fn tcp(port: u16, connect: bool) -> Result<String, i32> {
    // SAFETY: socket takes integers.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
    check(fd.into())?;
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let ptr = (&addr as *const libc::sockaddr_in).cast::<libc::sockaddr>();
    // SAFETY: `addr` is a valid sockaddr_in of `len` bytes that outlives the call.
    let rc = unsafe {
        if connect {
            libc::connect(fd, ptr, len)
        } else {
            libc::bind(fd, ptr, len)
        }
    };
    check(rc.into()).map(|_| format!("{} on fd {fd}", if connect { "connected" } else { "bound" }))
}

fn execve() -> Result<String, i32> {
    let sh = CString::new("/bin/sh").map_err(|_| libc::EINVAL)?;
    let argv = [sh.as_ptr(), std::ptr::null()];
    let envp = [std::ptr::null()];
    // SAFETY: `argv` and `envp` are NULL-terminated arrays of valid strings.
    let rc = unsafe { libc::execve(sh.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    check(rc.into())
}

fn fork() -> Result<String, i32> {
    // SAFETY: the child does nothing but `_exit`, which is async-signal-safe.
    match unsafe { libc::fork() } {
        // SAFETY: `_exit` ends the child at once, running nothing of this process.
        0 => unsafe { libc::_exit(0) },
        pid if pid > 0 => Ok(format!("forked pid {pid}")),
        _ => Err(errno()),
    }
}

/// One decimal line read from stdin byte by byte (no buffer that the worker's own reader of
/// stdin could lose bytes to); 0 if there is none.
fn first_from_stdin() -> usize {
    let mut line = Vec::new();
    let mut byte = 0u8;
    // SAFETY: reads one byte into a live local.
    while unsafe { libc::read(0, (&mut byte as *mut u8).cast(), 1) } == 1 && byte != b'\n' {
        line.push(byte);
    }
    String::from_utf8_lossy(&line).trim().parse().unwrap_or(0)
}

/// How many times a probe is tried again when a signal interrupted it (`EINTR`).
const INTERRUPTED_RETRIES: usize = 16;

/// One probe, tried again while a signal interrupts it, as code that wanted out would: `EINTR`
/// says nothing of the confinement. (The engine's threads signal each other, for example to
/// suspend one for its garbage collector; under an emulated CPU, slow enough for one to land
/// during a probe, the aarch64 test once read `EINTR` where Landlock answers `EACCES`.)
fn attempt(probe: Probe, target: &Target) -> Result<String, i32> {
    let mut outcome = probe(target);
    for _ in 0..INTERRUPTED_RETRIES {
        if outcome != Err(libc::EINTR) {
            break;
        }
        outcome = probe(target);
    }
    outcome
}

/// Runs the probes when the worker was started with a spec ([`SPEC`]), then exits.
pub fn run_if_requested() {
    let Some(spec) = SPEC.get() else {
        return;
    };
    let mut parts = spec.split(',');
    let port = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    // `stdin`: a worker forked from a zygote shares the zygote's arguments, so the test
    // writes the first probe's index on its stdin instead (one decimal line).
    // A probe's name also names it (tests/aarch64 starts at `fork`); an unknown one runs none.
    let first: usize = match parts.next() {
        Some("stdin") => first_from_stdin(),
        Some(p) => p.parse().unwrap_or_else(|_| {
            PROBES
                .iter()
                .position(|(name, _)| *name == p)
                .unwrap_or(PROBES.len())
        }),
        None => 0,
    };
    // SAFETY: getppid has no preconditions.
    let front = unsafe { libc::getppid() };
    let target = Target { front, port };
    for (index, (name, probe)) in PROBES.iter().enumerate().skip(first) {
        eprintln!("escape-probe {index} {name} trying");
        match attempt(*probe, &target) {
            Ok(what) => eprintln!("escape-probe {index} {name} ALLOWED {what}"),
            Err(errno) => eprintln!("escape-probe {index} {name} blocked errno {errno}"),
        }
    }
    eprintln!("escape-probe done {}", PROBES.len());
    std::process::exit(0);
}
