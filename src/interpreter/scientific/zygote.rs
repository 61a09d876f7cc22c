//! The scientific runtime's zygote (docs/architecture.md §5.4): a scientific worker started with
//! a control socket imports numpy, pandas and matplotlib once, then forks a worker for every
//! request of the front (`fork_server.rs`, [`Control::ForkInto`]), as Pyodide's zygote does
//! (`src/interpreter/zygote.rs`). It never runs user code.
//!
//! Each child gets a scratch folder of its own, sent by the front with the request: its
//! descriptor takes the number of the zygote's root folder, which the guest's WASI context
//! holds open as its `/`, so the child's guest sees its own empty `/` (the guest side then
//! makes its folders again) and nothing of its siblings'. The child then nests a Landlock
//! domain of that folder and the artifacts only, seals itself and says it is ready.
//!
//! [`Control::ForkInto`]: crate::protocol::control::Control::ForkInto

use super::super::boot::{send_ready, BootReport};
use super::super::confine::{self, Domain, Folder, GuestFolders};
use super::super::dirty_pages::{self, DirtyPages};
use super::super::fork_server::{self, ZygoteEngine, FD_SCAN_MAX};
use super::super::host_calls::FrontInput;
use super::super::linear_memory::Pristine;
use super::{Paths, Scientific};
use anyhow::{anyhow, bail, Context, Result};
use std::cell::RefCell;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;

/// Where [`Zygote::fork_workers`] returns.
pub(super) enum Forked {
    /// In the zygote, done forking: it ends.
    ZygoteDone,
    /// In a forked child, confined and ready, with the kernel's record of the pages its
    /// guest writes where the kernel keeps one (`dirty_pages.rs`).
    Child(Option<DirtyPages>),
}

/// A scientific worker started as the zygote, once booted.
pub(super) struct Zygote<'a> {
    /// The control socket the front asks for forks on.
    pub control: OwnedFd,
    /// `/proc/self/status`, opened before Landlock: the zygote counts its threads there.
    pub proc_status: File,
    /// The front's requests: none may be left unread when the zygote forks.
    pub input: &'a RefCell<FrontInput>,
    /// The guest's files: `scratch` is the zygote's root folder.
    pub paths: &'a Paths,
}

impl Zygote<'_> {
    /// Warms `worker` up, says it booted (`report`; `confined` is not sealed: the zygote runs
    /// no user code), then forks workers until the front is done. Returns
    /// [`Forked::ZygoteDone`] in the zygote when done, and [`Forked::Child`] in each child,
    /// which has its own root folder, has confined itself and said it is ready.
    ///
    /// Errors: the root folder's descriptor cannot be found, the warm-up fails, unread input
    /// is left, the fork server fails, or a child cannot take its folder.
    pub(super) fn fork_workers(
        self,
        worker: &mut Scientific,
        report: BootReport,
        confined: confine::Status,
    ) -> Result<Forked> {
        let root = descriptor_of(&self.paths.scratch)?;
        worker
            .request("prepare_zygote")
            .context("warming up the scientific zygote")?;
        keep_pristine(worker)?;
        let version = report.version.clone();
        report.send(&confined, false)?;
        fork_server::check_drained(self.input.borrow().buffer().len())?;
        let Some(forked) =
            fork_server::serve(self.control, &self.proc_status, ZygoteEngine::Wasmtime)?
        else {
            return Ok(Forked::ZygoteDone);
        };
        drop(self.proc_status);
        let scratch = forked
            .scratch
            .ok_or_else(|| anyhow!("the front sent no scratch folder"))?;
        take_place(&scratch, root)?;
        drop(scratch);
        // The page map is a file: opened before this child's own Landlock domain.
        let opened = DirtyPages::open();
        let domain = Domain::Scientific(GuestFolders {
            read: self.paths.artifacts.clone(),
            write: Folder::Open(root),
        });
        let mut confined = confine::enter_forked(confined, &domain)?;
        let dirty = dirty_pages::armed_or_none(
            opened.and_then(|opened| DirtyPages::arm(opened, worker.guest.memory())),
        );
        if let Some(dirty) = &dirty {
            confined.allow_tracking(dirty.descriptors());
        }
        worker
            .request("make_root")
            .context("making the child's root folder")?;
        send_ready(BootReport::forked(version, forked.requested), confined)?;
        Ok(Forked::Child(dirty))
    }
}

/// Keeps a copy of the zygote's linear memory as its last step before it forks
/// ([`Pristine`]): every child's checkpoints are measured against it.
///
/// Errors: the copy cannot be mapped.
fn keep_pristine(worker: &Scientific) -> Result<()> {
    let started = std::time::Instant::now();
    let id = Pristine::keep(worker.guest.memory())?;
    tracing::debug!(
        "scientific zygote {id}: pristine memory kept in {} ms",
        started.elapsed().as_millis()
    );
    Ok(())
}

/// The one descriptor of this process open on `folder` (the guest's root, which its WASI
/// context opened): compared by device and inode, so no path of `/proc` is read.
///
/// Errors: `folder` cannot be read, or no descriptor, or more than one, is open on it.
fn descriptor_of(folder: &std::path::Path) -> Result<RawFd> {
    let wanted =
        std::fs::metadata(folder).with_context(|| format!("reading {}", folder.display()))?;
    let found: Vec<RawFd> = (0..FD_SCAN_MAX)
        .filter(|&fd| {
            let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
            // SAFETY: fstat writes a `stat` into the buffer it is given, or fails (a number
            // that is not open); the buffer is read only when it succeeded.
            if unsafe { libc::fstat(fd, stat.as_mut_ptr()) } != 0 {
                return false;
            }
            // SAFETY: fstat succeeded, so it filled the buffer.
            let stat = unsafe { stat.assume_init() };
            stat.st_dev == wanted.dev() && stat.st_ino == wanted.ino()
        })
        .collect();
    match found.as_slice() {
        [fd] => Ok(*fd),
        [] => bail!("no descriptor is open on the guest's root folder"),
        _ => bail!(
            "{} descriptors are open on the guest's root folder",
            found.len()
        ),
    }
}

/// Makes descriptor `root` (the zygote's root folder, held by the guest's WASI context) name
/// `scratch` instead, close-on-exec as before.
///
/// Errors: `dup3` fails.
fn take_place(scratch: &OwnedFd, root: RawFd) -> Result<()> {
    // SAFETY: both are descriptors of this process; dup3 atomically replaces `root` with a
    // copy of `scratch`, so no other open can take its number in between.
    if unsafe { libc::dup3(scratch.as_raw_fd(), root, libc::O_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error()).context("giving the child its root folder");
    }
    Ok(())
}
