//! Landlock (landlock(7)): no file system, no TCP, no signals or abstract UNIX sockets
//! beyond the worker.

use super::{ConfineError, Layer};
use ::landlock::{
    Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, LandlockStatus, PathBeneath,
    PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};

/// The newest ABI this crate knows: every access right of it is handled (denied), and on an
/// older kernel the crate drops what the kernel does not know (best effort, reported).
const TARGET_ABI: ABI = ABI::V10;

/// The only files the worker may open after Landlock, read-only: the engine opens them while it
/// starts, after [`restrict`] (traced with strace, JavaScriptCore 2.48 / glibc 2.36):
/// - `/dev/urandom`: WTF's random source (it aborts when it cannot open it);
/// - `/sys/devices/system/cpu/online`: glibc's `get_nprocs`, sizing the JIT and GC threads;
/// - `/proc/self/maps`: glibc's `pthread_getattr_np` on the main thread (stack bounds, which
///   the engine needs for its stack-overflow checks);
/// - `/proc/self/statm`: bmalloc's memory footprint.
///
/// None leaks anything but the worker's own state or public facts, and none can be opened at
/// all once the seccomp filter is on (no `open`/`openat`).
const BOOT_READS: [&str; 4] = [
    "/dev/urandom",
    "/sys/devices/system/cpu/online",
    "/proc/self/maps",
    "/proc/self/statm",
];

/// Whose domain [`restrict`] makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Domain {
    /// A worker's: it runs user code.
    Worker,
    /// The zygote's, which runs no user code, and in which each forked child lives until it
    /// nests its own [`Domain::Worker`] (`enter_forked`): it may also read files beneath
    /// `/proc`, so that the child can open its own page map in that moment
    /// (`src/interpreter/dirty_pages.rs`; a rule on `/proc/self` would name the zygote's entry).
    Zygote,
}

/// Where a forked child opens its page map ([`Domain::Zygote`]).
const PROC: &str = "/proc";

/// Restricts the calling thread and every thread it creates later (landlock(7): a domain is
/// inherited by threads and children created after `landlock_restrict_self(2)`; threads that
/// exist already keep theirs). `threads` is the thread count now, for the report.
pub fn restrict(threads: Option<usize>, domain: Domain) -> Result<Layer, ConfineError> {
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(TARGET_ABI))
        .map_err(ConfineError::Landlock)?
        .handle_access(AccessNet::from_all(TARGET_ABI))
        .map_err(ConfineError::Landlock)?
        .scope(Scope::from_all(TARGET_ABI))
        .map_err(ConfineError::Landlock)?
        .create()
        .map_err(ConfineError::Landlock)?;
    let children_reads: &[&str] = match domain {
        Domain::Worker => &[],
        Domain::Zygote => &[PROC],
    };
    for path in BOOT_READS.iter().chain(children_reads) {
        // A file that does not exist here needs no rule (the engine copes without it).
        if let Ok(fd) = PathFd::new(path) {
            ruleset = ruleset
                .add_rule(PathBeneath::new(fd, AccessFs::ReadFile))
                .map_err(ConfineError::Landlock)?;
        }
    }
    let status = ruleset.restrict_self().map_err(ConfineError::Landlock)?;
    let abi = match status.landlock {
        LandlockStatus::Available { effective_abi, .. } => effective_abi,
        other => return Err(ConfineError::LandlockUnavailable(format!("{other:?}"))),
    };
    let how = match status.ruleset {
        RulesetStatus::FullyEnforced => "full",
        // Expected whenever the kernel's ABI is older than TARGET_ABI: what it lacks, it
        // cannot grant either.
        RulesetStatus::PartiallyEnforced => "every right the kernel knows",
        RulesetStatus::NotEnforced => {
            return Err(ConfineError::LandlockUnavailable(format!(
                "ruleset not enforced (abi {abi})"
            )))
        }
    };
    let net = if AccessNet::from_all(abi) != BitFlags::EMPTY {
        "no tcp"
    } else {
        "tcp allowed: abi < 4"
    };
    let scope = if Scope::from_all(abi) != BitFlags::EMPTY {
        "signals and abstract sockets scoped"
    } else {
        "no scoping: abi < 6"
    };
    let threads = threads.map_or("?".to_owned(), |n| n.to_string());
    let files = match domain {
        Domain::Worker => "no files",
        Domain::Zygote => "no files but /proc read",
    };
    Ok(Layer::On(format!(
        "abi {}, {how}, {files}, {net}, {scope}, before engine threads: {threads} thread(s)",
        abi as i32
    )))
}
