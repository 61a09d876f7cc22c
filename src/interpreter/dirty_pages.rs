//! Which pages of linear memory a forked interpreter wrote since its last checkpoint, told by
//! the kernel (checkpoints, docs/architecture.md §3.4): a userfaultfd in asynchronous write-protect mode over the memory, and
//! the `PAGEMAP_SCAN` ioctl of `/proc/self/pagemap`, which lists the pages written since they
//! were last protected and protects them again, in one walk of the page table.
//!
//! Without it a checkpoint compares the whole memory with its shadow (`linear_memory.rs`):
//! memory bandwidth, 3–9 ms for the 56 MiB of a sandbox holding 10 MiB, on every call. With it
//! the checkpoint compares only the pages written (~35 µs for the scan, then ~130 pages), so its
//! cost follows what the call changed, as docs/architecture.md §3.4 asks; a first write to a protected page costs
//! one minor fault (~2 µs here, with its copy-on-write copy), which the kernel resolves itself
//! (`UFFD_FEATURE_WP_ASYNC`: no thread of ours handles faults).
//!
//! Kernel support: write-protect on anonymous memory, `UFFD_FEATURE_WP_UNPOPULATED` (6.4: pages
//! never touched are protected too) and `UFFD_FEATURE_WP_ASYNC` with `PAGEMAP_SCAN` (6.7).
//! Where any of it is missing, [`DirtyPages::open`] says so and checkpoints compare the whole
//! memory as before: the scan only narrows which pages are compared, never decides alone.
//!
//! What it asks of the walls (`confine/`):
//! - the page map is opened by the child itself, between its fork and its own Landlock domain
//!   (the zygote's domain lets it read beneath `/proc` for that moment; no user code runs under
//!   the zygote's domain alone), so it names the child's memory and, opened without
//!   `CAP_SYS_ADMIN`, shows no physical frame numbers;
//! - the userfaultfd is made before the seccomp filter, which still kills `userfaultfd(2)`;
//!   it is `UFFD_USER_MODE_ONLY`, so it can never hold the kernel inside a fault (the
//!   exploitation technique userfaultfd is known for);
//! - once sealed, the filter allows `ioctl` only on these two descriptors and only with the
//!   three requests used here, and no `read` of the page map ([`Descriptors`]).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use thiserror::Error;

use crate::protocol::pages::PAGE_BYTES;

/// `_IOWR(type, number, size)` (include/uapi/asm-generic/ioctl.h; the same on x86-64 and
/// aarch64).
const fn iowr(kind: u8, number: u8, size: usize) -> u32 {
    const READ_WRITE: u32 = 3;
    (READ_WRITE << 30) | ((size as u32) << 16) | ((kind as u32) << 8) | number as u32
}

/// include/uapi/linux/userfaultfd.h: the API version, `UFFD_USER_MODE_ONLY`, the features.
const UFFD_API: u64 = 0xAA;
const UFFD_USER_MODE_ONLY: libc::c_int = 1;
const UFFD_FEATURE_WP_UNPOPULATED: u64 = 1 << 13;
const UFFD_FEATURE_WP_ASYNC: u64 = 1 << 15;
const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;
const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1 << 0;

/// `struct uffdio_range`.
#[repr(C)]
struct Range {
    start: u64,
    len: u64,
}

/// `struct uffdio_api`.
#[repr(C)]
struct Api {
    api: u64,
    features: u64,
    ioctls: u64,
}

/// `struct uffdio_register`.
#[repr(C)]
struct Register {
    range: Range,
    mode: u64,
    ioctls: u64,
}

/// `struct uffdio_writeprotect`.
#[repr(C)]
struct WriteProtect {
    range: Range,
    mode: u64,
}

const UFFDIO_API: u32 = iowr(0xAA, 0x3F, std::mem::size_of::<Api>());
/// Allowed after sealing: memory grown since the last scan is registered then.
pub const UFFDIO_REGISTER: u32 = iowr(0xAA, 0x00, std::mem::size_of::<Register>());
/// Allowed after sealing: grown memory is protected when registered.
pub const UFFDIO_WRITEPROTECT: u32 = iowr(0xAA, 0x06, std::mem::size_of::<WriteProtect>());

/// include/uapi/linux/fs.h: `struct page_region`, one run of pages in a scan's answer.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

/// `struct pm_scan_arg`.
#[repr(C)]
#[derive(Default)]
struct ScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

/// Allowed after sealing: the scan itself.
pub const PAGEMAP_SCAN: u32 = iowr(b'f', 16, std::mem::size_of::<ScanArg>());
/// `PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC`: protect again what the scan reports, and
/// fail unless the range is under asynchronous write-protect.
const SCAN_PROTECT_AGAIN: u64 = 0b11;
/// `PAGE_IS_WRITTEN`.
const PAGE_IS_WRITTEN: u64 = 1 << 1;
/// Runs of written pages one scan call reports; a longer answer takes more calls.
const REGIONS_PER_SCAN: usize = 512;

/// Why the kernel cannot tell this interpreter which pages it wrote: checkpoints then compare
/// the whole memory.
#[derive(Debug, Error)]
pub enum TrackingError {
    #[error("/proc/self/pagemap could not be opened")]
    PageMap(#[source] std::io::Error),
    #[error("userfaultfd(2) failed")]
    Create(#[source] std::io::Error),
    #[error("the kernel lacks asynchronous write-protect of unpopulated memory (Linux 6.7+)")]
    Features(#[source] std::io::Error),
    #[error("write-protecting {bytes} bytes of linear memory failed")]
    Protect {
        bytes: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("the page-map scan failed")]
    Scan(#[source] std::io::Error),
    #[error("linear memory moved or shrank since it was protected")]
    Moved,
    #[error("the engine could not lend linear memory")]
    Memory(#[source] crate::engine::EngineError),
}

/// The two descriptors the seccomp filter lets the sealed worker `ioctl`
/// (`confine/filter.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descriptors {
    pub userfaultfd: RawFd,
    pub page_map: RawFd,
}

/// A userfaultfd and page map, opened; [`DirtyPages::arm`] protects the memory.
pub struct Opened {
    userfaultfd: OwnedFd,
    page_map: OwnedFd,
}

/// The kernel's record of the pages written in `[start, start + len)`, linear memory as last
/// protected.
pub struct DirtyPages {
    userfaultfd: OwnedFd,
    page_map: OwnedFd,
    start: u64,
    len: u64,
}

/// The page map's descriptor once armed, for the escape test's probe that tries to read it.
#[cfg(feature = "escape-test")]
static PAGE_MAP_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

/// Test-only (cargo feature `escape-test`): the page map's descriptor, once armed.
#[cfg(feature = "escape-test")]
pub fn page_map_fd() -> Option<RawFd> {
    let fd = PAGE_MAP_FD.load(std::sync::atomic::Ordering::Relaxed);
    (fd >= 0).then_some(fd)
}

/// `ioctl(fd, request, arg)`, its error as an `io::Error`.
fn ioctl<T>(fd: &OwnedFd, request: u32, arg: &mut T) -> std::io::Result<libc::c_int> {
    // SAFETY: `arg` is the `#[repr(C)]` struct the kernel's definition of `request` names
    // (sizes are part of the request number), valid and exclusively borrowed for the call.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), request as _, arg as *mut T) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(r)
}

/// The tracking `armed` (a forked child's, [`DirtyPages::arm`] of [`DirtyPages::open`]'s), or
/// `None` when the kernel cannot track its memory: checkpoints then compare every page (said
/// in the debug log). Both runtimes' children take it so.
pub fn armed_or_none(armed: Result<DirtyPages, TrackingError>) -> Option<DirtyPages> {
    armed
        .map_err(|e| tracing::debug!("checkpoints compare the whole memory: {e}"))
        .ok()
}

impl DirtyPages {
    /// Opens this process's page map and a userfaultfd with the features the tracking needs.
    /// Call in a forked child before its own Landlock domain (the page map is a file) and
    /// before the seccomp filter (which kills `userfaultfd(2)`).
    ///
    /// Errors: [`TrackingError::PageMap`], [`TrackingError::Create`],
    /// [`TrackingError::Features`] (an older kernel).
    pub fn open() -> Result<Opened, TrackingError> {
        let page_map = std::fs::File::open("/proc/self/pagemap").map_err(TrackingError::PageMap)?;
        // SAFETY: userfaultfd(2) takes only flags; the result is checked before use.
        let fd =
            unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | UFFD_USER_MODE_ONLY) };
        if fd < 0 {
            return Err(TrackingError::Create(std::io::Error::last_os_error()));
        }
        // SAFETY: a descriptor the kernel just returned to this process, owned by nothing else.
        let userfaultfd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        let mut api = Api {
            api: UFFD_API,
            features: UFFD_FEATURE_WP_UNPOPULATED | UFFD_FEATURE_WP_ASYNC,
            ioctls: 0,
        };
        ioctl(&userfaultfd, UFFDIO_API, &mut api).map_err(TrackingError::Features)?;
        Ok(Opened {
            userfaultfd,
            page_map: page_map.into(),
        })
    }

    /// Registers and write-protects `memory` (linear memory, before anything writes it in this
    /// process): from now on the kernel records each page written.
    ///
    /// Errors: [`TrackingError::Protect`] (memory the kernel cannot track this way).
    pub fn arm(opened: Opened, memory: &[u8]) -> Result<DirtyPages, TrackingError> {
        #[cfg(feature = "escape-test")]
        PAGE_MAP_FD.store(
            opened.page_map.as_raw_fd(),
            std::sync::atomic::Ordering::Relaxed,
        );
        let mut tracked = DirtyPages {
            userfaultfd: opened.userfaultfd,
            page_map: opened.page_map,
            start: memory.as_ptr() as u64,
            len: 0,
        };
        tracked.protect_grown(memory.len() as u64)?;
        Ok(tracked)
    }

    /// The descriptors the seccomp filter is to allow `ioctl` on.
    pub fn descriptors(&self) -> Descriptors {
        Descriptors {
            userfaultfd: self.userfaultfd.as_raw_fd(),
            page_map: self.page_map.as_raw_fd(),
        }
    }

    /// The indexes (increasing) of the pages of `memory` written since the last call (or
    /// since [`arm`](Self::arm)), which are protected again, plus every page of memory grown
    /// since, which is registered and protected now. Call only while nothing runs that writes
    /// the memory (between calls, on the engine's thread).
    ///
    /// Errors: [`TrackingError::Moved`] (the memory is elsewhere or smaller),
    /// [`TrackingError::Scan`], [`TrackingError::Protect`]: the pages written are then unknown.
    pub fn written(&mut self, memory: &[u8]) -> Result<Vec<u32>, TrackingError> {
        let len = memory.len() as u64;
        if memory.as_ptr() as u64 != self.start || len < self.len {
            return Err(TrackingError::Moved);
        }
        let mut pages = self.scan()?;
        let page = PAGE_BYTES as u64;
        pages.extend((self.len / page..len / page).map(|i| i as u32));
        self.protect_grown(len)?;
        Ok(pages)
    }

    /// Written pages in `[start, start + len)`, protected again by the same walk.
    fn scan(&mut self) -> Result<Vec<u32>, TrackingError> {
        let mut regions = [PageRegion::default(); REGIONS_PER_SCAN];
        let mut pages = Vec::new();
        let end = self.start + self.len;
        let mut from = self.start;
        while from < end {
            let mut arg = ScanArg {
                size: std::mem::size_of::<ScanArg>() as u64,
                flags: SCAN_PROTECT_AGAIN,
                start: from,
                end,
                vec: regions.as_mut_ptr() as u64,
                vec_len: REGIONS_PER_SCAN as u64,
                category_mask: PAGE_IS_WRITTEN,
                return_mask: PAGE_IS_WRITTEN,
                ..ScanArg::default()
            };
            let found =
                ioctl(&self.page_map, PAGEMAP_SCAN, &mut arg).map_err(TrackingError::Scan)?;
            let found = usize::try_from(found).unwrap_or(0).min(REGIONS_PER_SCAN);
            for region in &regions[..found] {
                let first = (region.start.max(self.start) - self.start) / PAGE_BYTES as u64;
                let last = (region.end.min(end) - self.start).div_ceil(PAGE_BYTES as u64);
                pages.extend((first..last).map(|i| i as u32));
            }
            if arg.walk_end <= from {
                return Err(TrackingError::Scan(std::io::Error::other(
                    "the scan did not advance",
                )));
            }
            from = arg.walk_end;
        }
        Ok(pages)
    }

    /// Registers and protects memory past `self.len` up to `len` bytes (WebAssembly memory
    /// grows in place, in 64 KiB steps).
    fn protect_grown(&mut self, len: u64) -> Result<(), TrackingError> {
        if len <= self.len {
            return Ok(());
        }
        let range = || Range {
            start: self.start + self.len,
            len: len - self.len,
        };
        let protect_error = |source| TrackingError::Protect {
            bytes: len - self.len,
            source,
        };
        let mut register = Register {
            range: range(),
            mode: UFFDIO_REGISTER_MODE_WP,
            ioctls: 0,
        };
        ioctl(&self.userfaultfd, UFFDIO_REGISTER, &mut register).map_err(protect_error)?;
        let mut protect = WriteProtect {
            range: range(),
            mode: UFFDIO_WRITEPROTECT_MODE_WP,
        };
        ioctl(&self.userfaultfd, UFFDIO_WRITEPROTECT, &mut protect).map_err(protect_error)?;
        self.len = len;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The request numbers as the kernel's headers spell them (x86-64 and aarch64 alike).
    #[test]
    fn request_numbers_match_the_kernel_headers() {
        assert_eq!(UFFDIO_API, 0xC018_AA3F);
        assert_eq!(UFFDIO_REGISTER, 0xC020_AA00);
        assert_eq!(UFFDIO_WRITEPROTECT, 0xC018_AA06);
        assert_eq!(PAGEMAP_SCAN, 0xC060_6610);
    }

    /// On a mapping of its own (a large `Vec`, which no other test thread touches): writes are
    /// reported once, untouched pages never, grown memory whole. The kernel must have the
    /// features (CI's does); there is no silent skip.
    #[test]
    fn the_kernel_reports_each_written_page_once() {
        const PAGES: usize = 64;
        let opened = match DirtyPages::open() {
            Ok(opened) => opened,
            Err(e) => panic!("this kernel cannot track written pages: {e}"),
        };
        let mut memory = vec![0u8; (PAGES + 16) * PAGE_BYTES + PAGE_BYTES];
        let at = memory.as_ptr().align_offset(PAGE_BYTES);
        let region = &mut memory[at..at + (PAGES + 16) * PAGE_BYTES];
        region[..PAGES / 2 * PAGE_BYTES].fill(1);
        let mut tracked = DirtyPages::arm(opened, &region[..PAGES * PAGE_BYTES]).expect("arms");
        region[3 * PAGE_BYTES] = 7;
        region[40 * PAGE_BYTES + 9] = 7; // never touched before: protected all the same
        region[41 * PAGE_BYTES] = 7;
        assert_eq!(
            tracked.written(&region[..PAGES * PAGE_BYTES]).unwrap(),
            vec![3, 40, 41]
        );
        assert!(tracked
            .written(&region[..PAGES * PAGE_BYTES])
            .unwrap()
            .is_empty());
        region[41 * PAGE_BYTES] = 8;
        let grown = tracked
            .written(&region[..(PAGES + 2) * PAGE_BYTES])
            .unwrap();
        assert_eq!(grown, vec![41, 64, 65]);
        region[65 * PAGE_BYTES] = 1;
        assert_eq!(
            tracked
                .written(&region[..(PAGES + 2) * PAGE_BYTES])
                .unwrap(),
            vec![65]
        );
        assert!(matches!(
            tracked.written(&region[..PAGES * PAGE_BYTES]),
            Err(TrackingError::Moved)
        ));
    }
}
