//! The zygote's memory, laid out so that forking it and ending a child are cheap (the zygote, docs/architecture.md §3).
//!
//! `fork(2)` copies one page-table entry per resident page of every private mapping and links
//! one `anon_vma` chain per mapping; a child's exit undoes both. With one fresh worker
//! per call (`--isolation call`) those two were half of a call's CPU time. Two things make
//! them smaller, done once in the zygote just before it starts forking:
//!
//! 1. **Fewer mappings.** JavaScriptCore's allocator marks memory it decommits
//!    `MADV_DONTDUMP` and memory it commits again `MADV_DODUMP`. Each flips a flag of the
//!    mapping, so the kernel splits it: a warmed-up zygote had ~1,600 anonymous mappings
//!    alternating between the two. Marking them all `MADV_DODUMP` lets the kernel merge them
//!    back (~200 mappings). The flag only decides what a core dump holds, and sandboxed
//!    processes write none (`RLIMIT_CORE` 0, not dumpable).
//! 2. **Huge pages.** Every aligned 2 MiB range of private anonymous memory that is mostly
//!    resident is collapsed into one transparent huge page (`MADV_COLLAPSE`, Linux 6.1): the
//!    fork then shares one page-table entry for it instead of copying 512, and an exit frees
//!    one. A child that writes to such a page gets the range split back into small pages and
//!    copies only the 4 KiB it writes, as before. Collapsing fills the range's missing pages
//!    with zeros in the zygote (shared by all its children); ranges less than
//!    [`COLLAPSE_MIN_RESIDENT`] resident are left alone so that this stays small.
//!
//! Measured on the 2-core machine with 8 HTTP clients and `--isolation call --workers 2`:
//! 88–91 → 101–110 calls/s with the first step, 139–155 with both (`bench/interpreters.py`).
//! Neither step is required: where the kernel refuses (no `MADV_COLLAPSE`, transparent huge
//! pages set to `never`), the zygote forks as before.

use std::time::Instant;

/// Size of a transparent huge page with 4 KiB base pages, as on x86-64 and aarch64 (bytes).
const HUGE_PAGE: usize = 2 << 20;

/// Base page size (bytes).
const PAGE: usize = 4 << 10;

/// Fraction of a huge page's base pages that must be resident for it to be collapsed: a
/// range that is mostly resident costs many page-table entries per fork and little memory
/// to fill. One half bounds the zeros added to the pages already there.
const COLLAPSE_MIN_RESIDENT: f64 = 0.5;

/// Largest mapping looked at for collapsing (bytes): the engine reserves tens of GiB of
/// address space (WebAssembly memories with their guard regions) of which only the start is
/// touched; scanning all of it page by page would cost more than it saves.
const COLLAPSE_MAX_MAPPING: usize = 1 << 30;

/// One line of `/proc/self/maps`: an address range, its permissions and what backs it.
#[derive(Debug)]
struct Mapping {
    /// First address (bytes).
    start: usize,
    /// One past the last address (bytes).
    end: usize,
    /// Readable, writable and private (copy-on-write) rather than shared.
    writable_private: bool,
    /// No file behind it and no kernel name (`[stack]`, `[vdso]`, …): plain anonymous memory.
    anonymous: bool,
}

/// Parses `/proc/<pid>/maps` text (`proc(5)`); lines it cannot read are skipped.
fn parse_maps(text: &str) -> Vec<Mapping> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (start, end) = fields.next()?.split_once('-')?;
            let perms = fields.next()?.as_bytes();
            // offset, device, inode, then the optional path.
            let path = fields.nth(3);
            Some(Mapping {
                start: usize::from_str_radix(start, 16).ok()?,
                end: usize::from_str_radix(end, 16).ok()?,
                writable_private: perms.len() == 4
                    && perms[0] == b'r'
                    && perms[1] == b'w'
                    && perms[3] == b'p',
                anonymous: path.is_none(),
            })
        })
        .collect()
}

/// The aligned huge-page ranges inside `mapping` (start addresses).
fn huge_ranges(mapping: &Mapping) -> impl Iterator<Item = usize> {
    let first = mapping.start.next_multiple_of(HUGE_PAGE);
    let last = mapping.end / HUGE_PAGE * HUGE_PAGE;
    (first..last.max(first)).step_by(HUGE_PAGE)
}

/// What [`prepare`] did, for the zygote's log.
#[derive(Debug, Default)]
pub struct Prepared {
    /// Mappings before and after marking them all dumpable.
    pub mappings: (usize, usize),
    /// Huge pages collapsed.
    pub collapsed: usize,
    /// Base pages that collapsing made resident (zeros), in KiB.
    pub filled_kib: usize,
    /// How long it took (milliseconds).
    pub took_ms: u128,
}

/// Reads this process's mappings; an empty list if `/proc/self/maps` cannot be read.
fn own_mappings() -> Vec<Mapping> {
    std::fs::read_to_string("/proc/self/maps")
        .map(|text| parse_maps(&text))
        .unwrap_or_default()
}

/// Merges the zygote's mappings and collapses its mostly resident memory into huge pages
/// (see the module documentation). Call it with one thread, after the engine's last garbage
/// collection and after free memory was given back, right before the first fork. Failures
/// of single steps are not errors: that step is skipped.
pub fn prepare() -> Prepared {
    let started = Instant::now();
    let before = own_mappings();
    for mapping in before.iter().filter(|m| m.anonymous) {
        // SAFETY: advice on a range of this process's own mapping; MADV_DODUMP changes only
        // which pages a core dump would hold, never their contents.
        unsafe {
            advise(
                mapping.start,
                mapping.end - mapping.start,
                libc::MADV_DODUMP,
            )
        };
    }
    let after = own_mappings();
    let mut prepared = Prepared {
        mappings: (before.len(), after.len()),
        ..Prepared::default()
    };
    let mut residency = vec![0u8; HUGE_PAGE / PAGE];
    for mapping in after
        .iter()
        .filter(|m| m.anonymous && m.writable_private && m.end - m.start <= COLLAPSE_MAX_MAPPING)
    {
        for range in huge_ranges(mapping) {
            let Some(resident) = resident_pages(range, &mut residency) else {
                continue;
            };
            if (resident as f64) < COLLAPSE_MIN_RESIDENT * residency.len() as f64 {
                continue;
            }
            // SAFETY: the range is inside one of this process's private anonymous mappings;
            // MADV_COLLAPSE moves its contents into a huge page without changing them.
            if unsafe { advise(range, HUGE_PAGE, libc::MADV_COLLAPSE) } {
                prepared.collapsed += 1;
                prepared.filled_kib += (residency.len() - resident) * PAGE / 1024;
            }
        }
    }
    prepared.took_ms = started.elapsed().as_millis();
    prepared
}

/// `madvise(2)` on `len` bytes at `start`; whether the kernel accepted it.
///
/// # Safety
/// The range must belong to this process, and `advice` must not change what it holds.
unsafe fn advise(start: usize, len: usize, advice: libc::c_int) -> bool {
    // SAFETY: the caller vouches for the range and the advice.
    unsafe { libc::madvise(start as *mut libc::c_void, len, advice) == 0 }
}

/// How many base pages of the huge page at `start` are resident (`mincore(2)`), with
/// `buffer` holding one byte per base page; `None` if the kernel does not say.
fn resident_pages(start: usize, buffer: &mut [u8]) -> Option<usize> {
    // SAFETY: `start` is page-aligned and inside a mapping of this process; the kernel
    // writes one byte per base page of the range, which is `buffer.len()` bytes.
    let status = unsafe {
        libc::mincore(
            start as *mut libc::c_void,
            buffer.len() * PAGE,
            buffer.as_mut_ptr(),
        )
    };
    (status == 0).then(|| buffer.iter().filter(|&&b| b & 1 != 0).count())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
559fb28e9000-559fb3a4b000 r--p 00000000 fe:01 1234   /usr/bin/x
7f900c400000-7f901a400000 rw-p 00000000 00:00 0 
7f9020400000-7f9020500000 rw-p 00000000 00:00 0
7f9031d72000-7f90335a9000 r-xp 00000000 fe:01 99     /usr/lib/libjavascriptcoregtk-4.1.so
7ffe82f68000-7ffe82f89000 rw-p 00000000 00:00 0      [stack]
7f9040000000-7f9040400000 rw-s 00000000 00:01 7      /memfd:x (deleted)
garbage
";

    #[test]
    fn maps_are_read_with_their_kind() {
        let maps = parse_maps(MAPS);
        assert_eq!(maps.len(), 6);
        assert!(!maps[0].anonymous && !maps[0].writable_private);
        assert!(maps[1].anonymous && maps[1].writable_private);
        assert_eq!(maps[1].start, 0x7f900c400000);
        assert!(maps[2].anonymous);
        assert!(!maps[4].anonymous, "[stack] is named");
        assert!(!maps[5].writable_private, "shared");
    }

    #[test]
    fn huge_ranges_are_aligned_and_inside() {
        let m = Mapping {
            start: 0x1000,
            end: 3 * HUGE_PAGE + 0x1000,
            writable_private: true,
            anonymous: true,
        };
        let ranges: Vec<_> = huge_ranges(&m).collect();
        assert_eq!(ranges, vec![HUGE_PAGE, 2 * HUGE_PAGE]);
        let small = Mapping {
            start: HUGE_PAGE + 0x1000,
            end: 2 * HUGE_PAGE + 0x1000,
            ..m
        };
        assert_eq!(huge_ranges(&small).count(), 0);
    }

    #[test]
    fn residency_is_counted() {
        // Two huge pages' worth, so that one aligned range lies inside.
        let len = 2 * HUGE_PAGE;
        // SAFETY: a new private anonymous mapping of our own, unmapped below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let start = (base as usize).next_multiple_of(HUGE_PAGE);
        // SAFETY: no huge pages for this range, so that touching 10 pages makes 10 resident.
        unsafe { advise(start, HUGE_PAGE, libc::MADV_NOHUGEPAGE) };
        for page in 0..10 {
            // SAFETY: inside the mapping made above.
            unsafe { *((start + page * PAGE) as *mut u8) = 1 };
        }
        let mut buffer = vec![0u8; HUGE_PAGE / PAGE];
        assert_eq!(resident_pages(start, &mut buffer), Some(10));
        // SAFETY: the mapping made above, no longer used.
        unsafe { libc::munmap(base, len) };
    }
}
