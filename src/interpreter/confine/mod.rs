//! The second wall (docs/architecture.md §3.2 "Two walls"): the operating system confines each
//! sandbox worker, so that native code running inside one (a JavaScriptCore JIT bug, a bug in
//! our `unsafe` ops) can only speak to the front over the pipes it was given.
//!
//! The layers, in the order they are applied:
//!
//! 1. at spawn, by the front, in the child between `fork` and `exec` ([`crate::worker::spawn::pre_exec`]):
//!    every inherited descriptor but 0, 1, 2 is marked close-on-exec;
//! 2. in the worker, after it read the `boot` request (and the snapshot that comes with it)
//!    and **before** the engine starts its helper threads ([`enter`]): user, network, mount,
//!    IPC and UTS namespaces of its own ([`namespaces`]), every capability dropped
//!    ([`capabilities`]), and Landlock, with every
//!    file-system right handled and none granted but reading four files the engine reads while
//!    it starts, every TCP bind/connect denied, and signals and abstract UNIX sockets scoped to
//!    the worker. Landlock binds only the calling thread and the threads it creates later
//!    (landlock(7), "Thread safety"; whole-process `LANDLOCK_RESTRICT_SELF_TSYNC` is ABI 8), so
//!    applied here it covers every thread the engine will ever have. The zygote's domain
//!    also lets it read beneath `/proc` ([`Domain::Zygote`]): it runs no user code, and each
//!    child it forks opens its own page map, then nests a worker's domain ([`enter_forked`]);
//! 3. in the worker, after Pyodide booted and before the first call ([`seal`]):
//!    `PR_SET_NO_NEW_PRIVS`, `PR_SET_DUMPABLE 0`, resource limits ([`limits`]), and a
//!    seccomp-bpf allowlist installed with `SECCOMP_FILTER_FLAG_TSYNC` on every thread
//!    ([`filter`]); a forked worker that tracks its dirty pages may `ioctl` its two tracking
//!    descriptors, and nothing else (`src/interpreter/dirty_pages.rs`).
//!
//! Each layer is reported as on or off with the reason ([`Status`], [`describe`]); under
//! [`ConfinementMode::Strict`] a layer that cannot be applied is an error and the worker refuses to serve.

mod capabilities;
mod filter;
mod landlock;
mod limits;
mod namespaces;

pub use landlock::{Domain, Folder, GuestFolders};
pub use limits::GUEST_NOFILE_MAX;

#[cfg(feature = "escape-test")]
mod escape;

use crate::interpreter::dirty_pages::Descriptors;
use crate::protocol::launch::ConfinementMode;
use std::fmt;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use thiserror::Error;

/// Why a layer could not be applied.
#[derive(Debug, Error)]
pub enum ConfineError {
    #[error("prctl({what}) failed")]
    Prctl {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("setting {what} failed")]
    Rlimit {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("Landlock could not be applied")]
    Landlock(#[source] ::landlock::RulesetError),
    #[error("Landlock cannot open the guest's folder {}", path.display())]
    GuestFolder {
        path: std::path::PathBuf,
        #[source]
        source: ::landlock::PathFdError,
    },
    #[error("Landlock cannot use the scratch folder's descriptor")]
    FolderDescriptor(#[source] std::io::Error),
    #[error("Landlock is not enforced by this kernel ({0})")]
    LandlockUnavailable(String),
    #[error("the seccomp filter could not be built")]
    SeccompBuild(#[source] seccompiler::BackendError),
    #[error("the seccomp filter could not be installed")]
    SeccompInstall(#[source] seccompiler::Error),
    #[error("the {what} capability set could not be emptied")]
    Capabilities {
        what: &'static str,
        #[source]
        source: caps::errors::CapsError,
    },
    #[error("confinement layer {layer} is off under --confinement strict: {reason}")]
    Strict { layer: &'static str, reason: String },
}

/// Whether one layer is in force, and what it does or why it is not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layer {
    /// In force; the detail says how (an ABI, a count).
    On(String),
    /// Not in force, and why.
    Off(String),
}

impl Layer {
    fn is_on(&self) -> bool {
        matches!(self, Layer::On(_))
    }
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Layer::On(d) if d.is_empty() => f.write_str("on"),
            Layer::On(d) => write!(f, "on ({d})"),
            Layer::Off(why) => write!(f, "off ({why})"),
        }
    }
}

/// The state of every layer of one worker.
#[derive(Debug, Clone)]
pub struct Status {
    pub mode: ConfinementMode,
    pub seccomp: Layer,
    pub landlock: Layer,
    pub userns: Layer,
    pub netns: Layer,
    pub mntns: Layer,
    pub ipcns: Layer,
    pub utsns: Layer,
    pub capabilities: Layer,
    pub rlimits: Layer,
    pub no_new_privs: Layer,
    pub not_dumpable: Layer,
    /// `/proc/self/status`, opened before Landlock, to count threads when sealing.
    proc_status: Option<Arc<File>>,
    /// The seccomp filter's profile: a scientific worker's guest opens files beneath the
    /// folders its Landlock domain grants ([`Domain::Scientific`]).
    profile: filter::Profile,
    /// The descriptors of the worker's dirty-page tracking, which the seccomp filter lets it
    /// `ioctl` (`src/interpreter/dirty_pages.rs`); set by [`Status::allow_tracking`].
    tracked: Option<Descriptors>,
}

impl Status {
    fn all_off(why: &str) -> Status {
        let off = || Layer::Off(why.to_owned());
        Status {
            mode: ConfinementMode::Off,
            seccomp: off(),
            landlock: off(),
            userns: off(),
            netns: off(),
            mntns: off(),
            ipcns: off(),
            utsns: off(),
            capabilities: off(),
            rlimits: off(),
            no_new_privs: off(),
            not_dumpable: off(),
            proc_status: None,
            profile: filter::Profile::Pyodide,
            tracked: None,
        }
    }

    /// Lets the sealed worker use its dirty-page tracking on `fds` ([`seal`]'s filter).
    pub fn allow_tracking(&mut self, fds: Descriptors) {
        self.tracked = Some(fds);
    }

    /// The namespace layers by name, in the order they are reported. [`enter`] checks them on
    /// their own under [`ConfinementMode::Strict`]: they are reported on or off rather than failing (so
    /// [`settle`] never refuses them), and the later layers are still pending then.
    fn namespaces(&self) -> [(&'static str, &Layer); 5] {
        [
            ("userns", &self.userns),
            ("netns", &self.netns),
            ("mntns", &self.mntns),
            ("ipcns", &self.ipcns),
            ("utsns", &self.utsns),
        ]
    }

    /// The layers by name, in the order they are reported.
    fn layers(&self) -> [(&'static str, &Layer); 11] {
        let [userns, netns, mntns, ipcns, utsns] = self.namespaces();
        [
            ("seccomp", &self.seccomp),
            ("landlock", &self.landlock),
            userns,
            netns,
            mntns,
            ipcns,
            utsns,
            ("capabilities", &self.capabilities),
            ("rlimits", &self.rlimits),
            ("no_new_privs", &self.no_new_privs),
            ("not_dumpable", &self.not_dumpable),
        ]
    }

    /// Whether every layer is on.
    pub fn all_on(&self) -> bool {
        self.layers().iter().all(|(_, l)| l.is_on())
    }

    /// Under [`ConfinementMode::Strict`], the first of `layers` (some of this status's, by name) that is
    /// off, as an error. A chosen set, because [`enter`] checks the namespaces before the
    /// later layers exist, and [`seal`] checks them all.
    fn check_strict<'a>(
        &self,
        layers: impl IntoIterator<Item = (&'static str, &'a Layer)>,
    ) -> Result<(), ConfineError> {
        if self.mode != ConfinementMode::Strict {
            return Ok(());
        }
        match layers.into_iter().find(|(_, l)| !l.is_on()) {
            Some((layer, Layer::Off(reason))) => Err(ConfineError::Strict {
                layer,
                reason: reason.clone(),
            }),
            _ => Ok(()),
        }
    }
}

/// One line that says which layers are on: `seccomp: on (…), landlock: on (abi 7, …), …`.
/// Logged by the worker; meant for `Reply::Ready` and the front's `warmup` line as well.
pub fn describe(status: &Status) -> String {
    if status.mode == ConfinementMode::Off {
        return "confinement off (debugging only): the worker is NOT confined by the operating system"
            .to_owned();
    }
    let layers: Vec<String> = status
        .layers()
        .iter()
        .map(|(name, layer)| format!("{name}: {layer}"))
        .collect();
    let mode = match status.mode {
        ConfinementMode::Strict => "strict",
        ConfinementMode::Default => "default",
        ConfinementMode::Off => "off",
    };
    format!("confinement {mode}: {}", layers.join(", "))
}

/// Largest `/proc/self/status` read for the thread count (bytes; it is about 1.5 KiB).
const PROC_STATUS_MAX_BYTES: usize = 8 << 10;

/// Threads of this process now, from the `Threads:` line of an open `/proc/self/status`
/// (proc(5)); `None` where unreadable. Read with `pread` at offset 0: procfs renders the file
/// afresh, and no path is opened (Landlock and seccomp forbid that by then).
pub(crate) fn thread_count(proc_status: &File) -> Option<usize> {
    let mut buf = vec![0u8; PROC_STATUS_MAX_BYTES];
    let n = proc_status.read_at(&mut buf, 0).ok()?;
    let text = std::str::from_utf8(buf.get(..n)?).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The time zone of every worker: UTC, whatever the host's (no host detail leaks to user code).
const TIME_ZONE: &str = "UTC";

/// Sets `TZ` and loads it now, while files may still be read. Without `TZ`, glibc re-reads
/// `/etc/localtime` on every `localtime()` (tzset(3): the zone is re-checked when `TZ` is
/// unset), which JavaScriptCore calls on the first local-time `Date` operation after sealing;
/// the seccomp filter kills a worker that opens a file (found by the `example` mode test:
/// `humanize.precisedelta`). With `TZ` set, glibc loads `/usr/share/zoneinfo/UTC` here once
/// and never again while `TZ` stays the same; ICU takes the zone from `TZ` as well.
fn fix_time_zone() {
    extern "C" {
        /// tzset(3), POSIX; not bound by the `libc` crate.
        fn tzset();
    }
    // SAFETY: the worker has one thread here (`enter` runs before the engine starts any; the
    // report shows the count), so nothing reads the environment concurrently; tzset has no
    // preconditions.
    unsafe {
        std::env::set_var("TZ", TIME_ZONE);
        tzset();
    }
}

/// Layers applied before the engine starts: namespaces, capabilities, Landlock. Call once,
/// single-threaded, after the `boot` request (and its snapshot) has been read and before
/// [`crate::engine::Engine::new`].
///
/// Errors: under [`ConfinementMode::Strict`], the first of these layers that cannot be applied.
pub fn enter(mode: ConfinementMode, domain: &Domain) -> Result<Status, ConfineError> {
    if mode == ConfinementMode::Off {
        return Ok(Status::all_off("--confinement=off"));
    }
    let proc_status = File::open("/proc/self/status").ok().map(Arc::new);
    let threads = proc_status.as_deref().and_then(thread_count);
    let ns = namespaces::enter(threads);
    fix_time_zone();
    let capabilities = settle(mode, "capabilities", capabilities::drop_all())?;
    let landlock = settle(mode, "landlock", landlock::restrict(threads, domain))?;
    let profile = match domain {
        Domain::Scientific(_) | Domain::ScientificZygote(_) => filter::Profile::Scientific,
        Domain::Worker | Domain::Zygote => filter::Profile::Pyodide,
    };
    let pending = || Layer::Off("not applied yet".to_owned());
    let status = Status {
        mode,
        seccomp: pending(),
        landlock,
        userns: ns.user,
        netns: ns.net,
        mntns: ns.mnt,
        ipcns: ns.ipc,
        utsns: ns.uts,
        capabilities,
        rlimits: pending(),
        no_new_privs: pending(),
        not_dumpable: pending(),
        proc_status,
        profile,
        tracked: None,
    };
    // Capabilities and Landlock were settled above; the rest are still pending.
    status.check_strict(status.namespaces())?;
    Ok(status)
}

/// Layers applied once the engine has booted and before the first call: no new privileges,
/// not dumpable, resource limits, seccomp on every thread. Logs [`describe`] at info level.
pub fn seal(mut status: Status) -> Result<Status, ConfineError> {
    if status.mode == ConfinementMode::Off {
        tracing::debug!("{}", describe(&status));
        return Ok(status);
    }
    let mode = status.mode;
    status.no_new_privs = settle(mode, "no_new_privs", limits::no_new_privs())?;
    status.not_dumpable = settle(mode, "not_dumpable", limits::not_dumpable())?;
    status.rlimits = settle(
        mode,
        "rlimits",
        limits::apply(status.profile == filter::Profile::Scientific),
    )?;
    let threads = status.proc_status.take().as_deref().and_then(thread_count);
    #[cfg(feature = "escape-test")]
    if escape::without_seccomp() {
        status.seccomp = Layer::Off("left out by the escape test".to_owned());
        return Ok(status);
    }
    status.seccomp = settle(
        mode,
        "seccomp",
        filter::install(threads, status.tracked, status.profile),
    )?;
    status.check_strict(status.layers())?;
    tracing::debug!("{}", describe(&status));
    Ok(status)
}

/// In a worker forked by the zygote (`fork_server.rs`), before [`seal`]: a Landlock
/// domain of its own, nested in the zygote's, so that Landlock's scoping of signals and
/// abstract UNIX sockets keeps it from its sibling workers as well as from the host. The
/// namespaces and the empty capability sets are the zygote's (entered by [`enter`] before it
/// booted), shared by its workers; the seccomp filter kills every system call that could
/// reach a sibling through them (sockets, System V IPC, `ptrace`, other processes' signals).
///
/// Errors: under [`ConfinementMode::Strict`], Landlock cannot be applied.
pub fn enter_forked(mut status: Status, domain: &Domain) -> Result<Status, ConfineError> {
    // The open file names the zygote's /proc entry, not this process's.
    status.proc_status = None;
    if status.mode == ConfinementMode::Off {
        return Ok(status);
    }
    status.landlock = settle(status.mode, "landlock", landlock::restrict(Some(1), domain))?;
    for layer in [
        &mut status.userns,
        &mut status.netns,
        &mut status.mntns,
        &mut status.ipcns,
        &mut status.utsns,
    ] {
        if layer.is_on() {
            *layer = Layer::On("the zygote's".to_owned());
        }
    }
    Ok(status)
}

/// Test-only (cargo feature `escape-test`): once the worker has sealed itself and said it is
/// ready, tries what an exploit would (`escape.rs`) when the test asked for it, then exits.
#[cfg(feature = "escape-test")]
pub fn escape_test_if_requested() {
    escape::run_if_requested();
}

/// Test-only (cargo feature `escape-test`): records the worker's `--escape-test` spec, read
/// when sealing and once ready ([`escape_test_if_requested`]).
#[cfg(feature = "escape-test")]
pub fn request_escape_test(spec: Option<&str>) {
    escape::request(spec);
}

/// The outcome of applying `layer`: its state, or under [`ConfinementMode::Strict`] the refusal.
fn settle(
    mode: ConfinementMode,
    layer: &'static str,
    applied: Result<Layer, ConfineError>,
) -> Result<Layer, ConfineError> {
    match applied {
        Ok(state) => Ok(state),
        Err(e) if mode == ConfinementMode::Strict => Err(ConfineError::Strict {
            layer,
            reason: crate::protocol::error_words(&e),
        }),
        Err(e) => Ok(Layer::Off(crate::protocol::error_words(&e))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describe_lists_every_layer() {
        let mut s = Status::all_off("x");
        s.mode = ConfinementMode::Default;
        s.landlock = Layer::On("abi 7".into());
        let line = describe(&s);
        assert!(line.starts_with("confinement default: seccomp: off (x), landlock: on (abi 7)"));
        assert!(line.contains("netns: off (x)"));
    }

    #[test]
    fn strict_refuses_an_off_layer() {
        let mut s = Status::all_off("EPERM");
        s.mode = ConfinementMode::Strict;
        let e = s.check_strict(s.layers()).unwrap_err();
        assert!(e.to_string().contains("seccomp"), "{e}");
    }

    #[test]
    fn strict_checks_only_the_chosen_layers() {
        let mut s = Status::all_off("pending");
        s.mode = ConfinementMode::Strict;
        for layer in [
            &mut s.userns,
            &mut s.netns,
            &mut s.mntns,
            &mut s.ipcns,
            &mut s.utsns,
        ] {
            *layer = Layer::On(String::new());
        }
        assert!(s.check_strict(s.namespaces()).is_ok());
        s.mntns = Layer::Off("EPERM".into());
        let e = s.check_strict(s.namespaces()).unwrap_err();
        assert!(e.to_string().contains("mntns"), "{e}");
    }
}
