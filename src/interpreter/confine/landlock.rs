//! Landlock (landlock(7)): no file system, no TCP, no signals or abstract UNIX sockets
//! beyond the worker.

use super::{ConfineError, Layer};
use ::landlock::{
    Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, LandlockStatus, PathBeneath,
    PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Domain {
    /// A worker's: it runs user code.
    Worker,
    /// The zygote's, which runs no user code, and in which each forked child lives until it
    /// nests its own [`Domain::Worker`] (`enter_forked`): it may also read files beneath
    /// `/proc`, so that the child can open its own page map in that moment
    /// (`src/interpreter/dirty_pages.rs`; a rule on `/proc/self` would name the zygote's entry).
    Zygote,
    /// A scientific worker's (docs/architecture.md §5.4): its guest's file system calls reach
    /// the host's, beneath these folders only.
    Scientific(GuestFolders),
    /// The scientific zygote's: its folders (`write` is the parent of its children's scratch
    /// folders), and files beneath `/proc` read, as [`Domain::Zygote`], for the same reason;
    /// each child nests its own [`Domain::Scientific`].
    ScientificZygote(GuestFolders),
}

/// The host folders a scientific worker's guest reaches through WASI: its artifacts (the
/// standard library, matplotlib's data and the compiled module), read-only, and its scratch
/// folder (the guest's `/`), read and written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestFolders {
    /// Read beneath (`AccessFs::from_read`).
    pub read: std::path::PathBuf,
    /// Read and written beneath (every file right but executing).
    pub write: Folder,
}

/// A folder a rule names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Folder {
    /// By its path (opened here).
    Path(std::path::PathBuf),
    /// By a descriptor of it that stays open while the rule is made (a forked scientific
    /// child's scratch folder, which the front sent; its path may not be reachable).
    Open(std::os::fd::RawFd),
}

/// The folder a rule names, opened.
enum RuleFd {
    /// Opened here by its path (`O_PATH`).
    Path(PathFd),
    /// A duplicate of a descriptor the caller holds.
    Open(OwnedFd),
}

impl AsFd for RuleFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            RuleFd::Path(fd) => fd.as_fd(),
            RuleFd::Open(fd) => fd.as_fd(),
        }
    }
}

/// The rules of `domain`'s folders beyond the engine's boot reads.
///
/// Errors: a folder cannot be opened ([`ConfineError::Landlock`]).
fn folder_rules(domain: &Domain) -> Result<Vec<PathBeneath<RuleFd>>, ConfineError> {
    let rule = |folder: &Folder, access| -> Result<_, ConfineError> {
        let fd = match folder {
            Folder::Path(path) => {
                RuleFd::Path(
                    PathFd::new(path).map_err(|source| ConfineError::GuestFolder {
                        path: path.to_owned(),
                        source,
                    })?,
                )
            }
            // SAFETY: the caller keeps the descriptor open while the rule is made; the
            // borrow only lives for the duplication.
            Folder::Open(fd) => RuleFd::Open(
                unsafe { BorrowedFd::borrow_raw(*fd) }
                    .try_clone_to_owned()
                    .map_err(ConfineError::FolderDescriptor)?,
            ),
        };
        Ok(PathBeneath::new(fd, access))
    };
    match domain {
        Domain::Worker => Ok(Vec::new()),
        Domain::Zygote => Ok(proc_rule().into_iter().collect()),
        Domain::ScientificZygote(folders) => {
            let mut rules = folder_rules(&Domain::Scientific(folders.clone()))?;
            rules.extend(proc_rule());
            Ok(rules)
        }
        Domain::Scientific(folders) => {
            // Files and folders made, written, renamed and removed: no devices, sockets or
            // pipes, nothing executed.
            let written = AccessFs::from_read(TARGET_ABI)
                | AccessFs::WriteFile
                | AccessFs::RemoveDir
                | AccessFs::RemoveFile
                | AccessFs::MakeDir
                | AccessFs::MakeReg
                | AccessFs::MakeSym
                | AccessFs::Truncate
                | AccessFs::Refer;
            let read = Folder::Path(folders.read.clone());
            Ok(vec![
                rule(&read, AccessFs::from_read(TARGET_ABI))?,
                rule(&folders.write, written)?,
            ])
        }
    }
}

/// Where a forked child opens its page map ([`Domain::Zygote`]).
const PROC: &str = "/proc";

/// The zygotes' rule: files beneath [`PROC`] read (none where it does not exist here).
fn proc_rule() -> Option<PathBeneath<RuleFd>> {
    PathFd::new(PROC)
        .ok()
        .map(|fd| PathBeneath::new(RuleFd::Path(fd), BitFlags::from(AccessFs::ReadFile)))
}

/// Restricts the calling thread and every thread it creates later (landlock(7): a domain is
/// inherited by threads and children created after `landlock_restrict_self(2)`; threads that
/// exist already keep theirs). `threads` is the thread count now, for the report.
pub fn restrict(threads: Option<usize>, domain: &Domain) -> Result<Layer, ConfineError> {
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
    for path in BOOT_READS {
        // A file that does not exist here needs no rule (the engine copes without it).
        if let Ok(fd) = PathFd::new(path) {
            ruleset = ruleset
                .add_rule(PathBeneath::new(fd, AccessFs::ReadFile))
                .map_err(ConfineError::Landlock)?;
        }
    }
    for rule in folder_rules(domain)? {
        ruleset = ruleset.add_rule(rule).map_err(ConfineError::Landlock)?;
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
        Domain::Scientific(_) => "no files but the guest's folders",
        Domain::ScientificZygote(_) => "no files but the guest's folders and /proc read",
    };
    Ok(Layer::On(format!(
        "abi {}, {how}, {files}, {net}, {scope}, before engine threads: {threads} thread(s)",
        abi as i32
    )))
}
