//! Namespaces of a worker (namespaces(7)), entered by the worker itself right after it started,
//! while it still has one thread (`unshare(2)`: `CLONE_NEWUSER` fails with `EINVAL` in a
//! multi-threaded process), so that what it does is invisible to the host even if a filter has
//! a hole:
//!
//! - **user**: the worker keeps no capability on the host (its capabilities, if any, are those
//!   of a namespace that owns nothing of the host's), and no user ID is mapped into it;
//! - **net**: no interface but a loopback that is down, so no socket can reach anything even if
//!   `socket` were allowed (network is the front's job, through the fetch protocol);
//! - **mount**: a private copy of the mount table (propagation set to private), so that nothing
//!   mounted inside reaches the host;
//! - **ipc**: no System V IPC objects or POSIX message queues of the host;
//! - **uts**: its own host name (set to [`HOST_NAME`]), so the host's is not seen.
//!
//! Without user namespaces (a kernel or container that forbids them) the others need
//! `CAP_SYS_ADMIN`, which a server run as root has; each is then tried alone, and each is
//! reported as it really is, by comparing `/proc/self/ns/*` before and after.
//!
//! A PID namespace is not entered: `unshare(CLONE_NEWPID)` moves only the caller's later
//! children, and a worker can have none (the seccomp filter kills `fork` and process `clone`);
//! entering one would take a second process per worker. Other processes are out of its reach
//! through Landlock's signal scoping and the filter's own-process-only `kill`/`tgkill`.

use super::Layer;

/// The host name inside the worker's UTS namespace.
pub const HOST_NAME: &str = "sandbox";

/// The namespaces entered besides the user namespace, in the order of [`NAMES`] after
/// "user", each tried alone when the user namespace is refused.
const OTHERS: [libc::c_int; 4] = [
    libc::CLONE_NEWNET,
    libc::CLONE_NEWNS,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUTS,
];

/// Names under `/proc/self/ns`: the user namespace, then those of [`OTHERS`].
const NAMES: [&str; 5] = ["user", "net", "mnt", "ipc", "uts"];

/// Whether each namespace was entered.
pub struct Namespaces {
    pub user: Layer,
    pub net: Layer,
    pub mnt: Layer,
    pub ipc: Layer,
    pub uts: Layer,
}

/// The namespace link of this process (`user:[4026531837]`), if readable.
fn link(name: &str) -> Option<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/self/ns/{name}")).ok()
}

/// `unshare(flags)`, with the errno on failure.
fn unshare(flags: libc::c_int) -> Result<(), std::io::Error> {
    // SAFETY: unshare takes one integer and touches no memory of ours.
    if unsafe { libc::unshare(flags) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Enters every namespace it can. `threads` is the thread count now (user namespaces need 1).
pub fn enter(threads: Option<usize>) -> Namespaces {
    let before = NAMES.map(link);
    let others = OTHERS.iter().fold(0, |flags, flag| flags | flag);
    let mut why_not: [Option<String>; 5] = Default::default();
    if let Err(e) = unshare(libc::CLONE_NEWUSER | others) {
        why_not[0] = Some(match (e.raw_os_error(), threads) {
            (Some(libc::EINVAL), Some(n)) if n > 1 => {
                format!("{e}: the worker has {n} threads already")
            }
            (Some(libc::EPERM | libc::ENOSPC), _) => format!(
                "{e}: user namespaces are not permitted here (a container's seccomp profile, \
                 user.max_user_namespaces = 0 or kernel.unprivileged_userns_clone = 0)"
            ),
            _ => e.to_string(),
        });
        // Without a user namespace each of the others needs CAP_SYS_ADMIN: try them one by
        // one, so that what can be had is had.
        for (i, flag) in OTHERS.into_iter().enumerate() {
            if let Err(e) = unshare(flag) {
                why_not[i + 1] = Some(match e.raw_os_error() {
                    Some(libc::EPERM) => format!("{e}: needs CAP_SYS_ADMIN or user namespaces"),
                    _ => e.to_string(),
                });
            }
        }
    }
    let after = NAMES.map(link);
    let mut layers = NAMES.iter().enumerate().map(|(i, name)| {
        let entered = match (&before[i], &after[i]) {
            (Some(a), Some(b)) => a != b,
            _ => false,
        };
        match (entered, why_not[i].take()) {
            (true, _) => Layer::On(String::new()),
            (false, Some(why)) => Layer::Off(why),
            (false, None) => Layer::Off(format!("cannot read /proc/self/ns/{name}")),
        }
    });
    let mut next = || layers.next().unwrap_or(Layer::Off(String::new()));
    let ns = Namespaces {
        user: next(),
        net: next(),
        mnt: next(),
        ipc: next(),
        uts: next(),
    };
    ns.settle()
}

impl Namespaces {
    /// Finishes the namespaces entered: private mount propagation, the host name.
    fn settle(mut self) -> Namespaces {
        if self.mnt.is_on() {
            // Like `unshare --mount`: without this, a mount made inside would propagate to the
            // host's mount namespace when / is a shared mount (systemd makes it one).
            // SAFETY: every pointer is a NUL-terminated literal or null; mount(2) only reads them.
            let rc = unsafe {
                libc::mount(
                    c"none".as_ptr(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                )
            };
            if rc != 0 {
                let e = std::io::Error::last_os_error();
                self.mnt = Layer::Off(format!("making mounts private failed: {e}"));
            }
        }
        if self.uts.is_on() {
            // SAFETY: the pointer and length describe HOST_NAME, which outlives the call.
            let rc = unsafe { libc::sethostname(HOST_NAME.as_ptr().cast(), HOST_NAME.len()) };
            if rc != 0 {
                let e = std::io::Error::last_os_error();
                self.uts = Layer::On(format!("host name unchanged: {e}"));
            }
        }
        self
    }
}
