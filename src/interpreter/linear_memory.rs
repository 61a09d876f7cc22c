//! The interpreter's WebAssembly linear memory as a checkpoint sees it (checkpoints, docs/architecture.md §3.4): the
//! zygote's pristine copy, and each forked interpreter's shadow of its last checkpoint.
//!
//! Python's whole state (globals, modules, the allocator, the import system) lives in
//! linear memory, and a copy of it into another interpreter forked from the same zygote
//! restores that state exactly (docs/checkpoint-research.md §5). Every child starts as the
//! zygote's memory byte for byte, so a checkpoint is only the pages that differ from it. The
//! kernel says which pages a child wrote only where it can (`dirty_pages.rs`, Linux 6.7+;
//! soft-dirty bits are absent here), so:
//!
//! - the zygote copies its memory once, just before it forks, into a read-only anonymous
//!   mapping ([`Pristine`]) that every child shares copy-on-write at no cost, and names it by
//!   its SHA-256 ([`ZygoteId`]);
//! - a child keeps a [`Shadow`]: what its memory held at its last checkpoint. A checkpoint
//!   compares with the shadow the pages the kernel says were written (`dirty_pages.rs`), or
//!   where it cannot say, every page (memory bandwidth: ~1.5 ms for 30 MiB), and sends the
//!   pages that changed, each XOR-ed with the pristine page, so that bytes equal to
//!   the zygote's become zeros and compress away;
//! - a restore writes pristine ⊕ image into a fresh child, page by page, where it differs.
//!
//! Runs in the worker process only; the front sees pages as bytes (`crate::sandbox`).

use sha2::{Digest, Sha256};
use std::sync::OnceLock;
use thiserror::Error;

use crate::protocol::pages::{
    encode_xor, xor_runs_into, Pages, ZygoteId, PAGE_BYTES, UNCHANGED_PAGE,
};

/// The zygote's linear memory as it forks, read-only, shared by all its children.
pub struct Pristine {
    /// Start of the anonymous mapping (read-only once filled).
    start: *const u8,
    /// Its length (bytes): the memory's size when copied.
    len: usize,
    /// SHA-256 of its bytes.
    id: ZygoteId,
}

// SAFETY: the mapping is made read-only once filled and never unmapped (it lives as long as the
// process), so sharing the pointer between threads is sharing immutable bytes.
unsafe impl Send for Pristine {}
// SAFETY: as above: only reads happen through it.
unsafe impl Sync for Pristine {}

/// The process's pristine memory, set once in the zygote and inherited by every fork.
static PRISTINE: OnceLock<Pristine> = OnceLock::new();

/// Why the zygote could not keep its pristine memory.
#[derive(Debug, Error)]
pub enum PristineError {
    #[error("could not map {bytes} bytes for the zygote's pristine memory")]
    Map {
        bytes: usize,
        #[source]
        source: std::io::Error,
    },
    #[error("the zygote's pristine memory was already kept")]
    AlreadyKept,
}

impl Pristine {
    /// Copies `memory` (the zygote's linear memory, just before it forks) into a new read-only
    /// mapping and keeps it for the process and its forks. Returns its identity.
    ///
    /// Errors: [`PristineError::Map`] when the mapping cannot be made; [`PristineError::AlreadyKept`]
    /// when called twice.
    pub fn keep(memory: &[u8]) -> Result<ZygoteId, PristineError> {
        let len = memory.len().max(PAGE_BYTES);
        let map_error = |source| PristineError::Map { bytes: len, source };
        // SAFETY: a fresh private anonymous mapping of `len` bytes, which nothing else refers to;
        // `memory` is a valid slice of at most `len` bytes, copied into it before it is made
        // read-only. Failure is checked before the pointer is used.
        let start = unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if p == libc::MAP_FAILED {
                return Err(map_error(std::io::Error::last_os_error()));
            }
            std::ptr::copy_nonoverlapping(memory.as_ptr(), p.cast::<u8>(), memory.len());
            if libc::mprotect(p, len, libc::PROT_READ) != 0 {
                return Err(map_error(std::io::Error::last_os_error()));
            }
            p.cast::<u8>().cast_const()
        };
        let id = ZygoteId(Sha256::digest(memory).into());
        let pristine = Pristine {
            start,
            len: memory.len(),
            id,
        };
        PRISTINE
            .set(pristine)
            .map_err(|_| PristineError::AlreadyKept)?;
        Ok(id)
    }

    /// The pristine memory this process (a zygote's child) inherited; `None` in an interpreter
    /// that was not forked from a zygote.
    pub fn inherited() -> Option<&'static Pristine> {
        PRISTINE.get()
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `start` maps `len` readable bytes for the life of the process (never
        // unmapped, never written after `keep`).
        unsafe { std::slice::from_raw_parts(self.start, self.len) }
    }

    /// Page `index` of the pristine memory; `None` past its end (where memory grown since
    /// reads as zeros).
    fn page(&self, index: usize) -> Option<&[u8]> {
        self.bytes().get(index * PAGE_BYTES..)?.get(..PAGE_BYTES)
    }
}

/// Why a restore was refused; the interpreter is then left as it was or, past the first
/// written page, is to be discarded.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum RestoreError {
    #[error("this interpreter was not forked from a zygote")]
    NotForked,
    #[error("the checkpoint was taken in an interpreter of another zygote")]
    OtherZygote,
    #[error("the checkpoint's pages do not fit its memory")]
    Shape,
    #[error("the interpreter's memory is smaller than the checkpoint's")]
    TooSmall,
}

/// What a forked interpreter's memory held at its last checkpoint: the pristine page, or the
/// page as it was then where it differed, kept as its encoding (XOR the pristine page, as
/// runs: `crate::protocol::pages`), a few hundred bytes where the page would be 4 KiB.
pub struct Shadow {
    pristine: &'static Pristine,
    /// By page index: the encoding of the page at the last checkpoint where it differed from
    /// the pristine page (or lay past its end and was not all zeros).
    pages: Vec<Option<Box<[u8]>>>,
}

impl Shadow {
    /// The shadow `slot` holds, made equal to the pristine memory at its first use (a forked
    /// interpreter's first checkpoint or restore); `None` in an interpreter that was not forked
    /// from a zygote.
    pub fn in_slot(slot: &mut Option<Shadow>) -> Option<&mut Shadow> {
        if slot.is_none() {
            *slot = Pristine::inherited().map(Shadow::new);
        }
        slot.as_mut()
    }

    /// A shadow equal to the pristine memory: what a fresh child holds.
    pub fn new(pristine: &'static Pristine) -> Shadow {
        Shadow {
            pristine,
            pages: Vec::new(),
        }
    }

    /// The zygote the shadow measures against.
    pub fn zygote(&self) -> ZygoteId {
        self.pristine.id
    }

    /// The encoding of what page `index` held at the last checkpoint.
    fn expected(&self, index: usize) -> &[u8] {
        match self.pages.get(index) {
            Some(Some(encoded)) => encoded,
            _ => &UNCHANGED_PAGE,
        }
    }

    /// The pages of `memory` that changed since the last checkpoint (XOR-ed with the pristine
    /// pages, encoded), which become the shadow. `memory`'s length is a multiple of 64 KiB
    /// (WebAssembly memory always is). Compares every page: memory bandwidth, for when the
    /// kernel cannot say which pages were written (`dirty_pages.rs`).
    pub fn changes(&mut self, memory: &[u8]) -> Pages {
        self.changes_among(memory, 0..(memory.len() / PAGE_BYTES) as u32)
    }

    /// As [`changes`](Self::changes), comparing only the pages `written` names (increasing
    /// indexes; those past the memory's end are ignored): every other page must hold what it
    /// held at the last checkpoint, as the kernel's record of written pages guarantees. A
    /// page's encoding is unique, so a page is unchanged exactly when its encoding is the
    /// shadow's.
    pub fn changes_among(
        &mut self,
        memory: &[u8],
        written: impl IntoIterator<Item = u32>,
    ) -> Pages {
        let count = memory.len() / PAGE_BYTES;
        if self.pages.len() < count {
            self.pages.resize_with(count, || None);
        }
        let mut changed = Pages {
            memory_bytes: memory.len() as u64,
            ..Pages::default()
        };
        for index in written.into_iter().map(|i| i as usize) {
            let Some(page) = memory.get(index * PAGE_BYTES..(index + 1) * PAGE_BYTES) else {
                break;
            };
            let base = self.pristine.page(index).unwrap_or(&ZERO_PAGE);
            let at = changed.bytes.len();
            let differs = encode_xor(page, base, &mut changed.bytes);
            let encoded = &changed.bytes[at..];
            if encoded == self.expected(index) {
                changed.bytes.truncate(at);
                continue;
            }
            self.pages[index] = differs.then(|| encoded.into());
            changed.indexes.push(index as u32);
        }
        changed
    }

    /// Makes `memory` hold pristine ⊕ `image` (pages not in the image: the pristine page, zeros
    /// past its end), writing only pages that differ; the shadow becomes the image.
    /// `memory` must already be at least `image.memory_bytes` long.
    ///
    /// Errors: [`RestoreError::TooSmall`], [`RestoreError::Shape`] (checked before any write).
    pub fn restore(&mut self, memory: &mut [u8], image: &Pages) -> Result<(), RestoreError> {
        if (memory.len() as u64) < image.memory_bytes {
            return Err(RestoreError::TooSmall);
        }
        let count = memory.len() / PAGE_BYTES;
        let encodings = image.encodings().map_err(|_| RestoreError::Shape)?;
        if image.indexes.last().is_some_and(|&i| i as usize >= count) {
            return Err(RestoreError::Shape);
        }
        self.pages.clear();
        self.pages.resize_with(count, || None);
        let mut next = image.indexes.iter().copied().zip(encodings).peekable();
        let mut target = vec![0u8; PAGE_BYTES];
        for (index, page) in memory.chunks_exact_mut(PAGE_BYTES).enumerate() {
            let base = self.pristine.page(index).unwrap_or(&ZERO_PAGE);
            let encoded = next.next_if(|(i, _)| *i as usize == index).map(|(_, e)| e);
            let want: &[u8] = match encoded {
                Some(encoded) if encoded != UNCHANGED_PAGE => {
                    target.copy_from_slice(base);
                    xor_runs_into(encoded, &mut target);
                    self.pages[index] = Some(encoded.into());
                    &target
                }
                _ => base,
            };
            if page != want {
                page.copy_from_slice(want);
            }
        }
        Ok(())
    }
}

/// A page of zeros: what memory grown past the pristine copy's end starts as.
static ZERO_PAGE: [u8; PAGE_BYTES] = [0; PAGE_BYTES];

#[cfg(test)]
mod tests {
    use super::*;

    fn pristine(bytes: Vec<u8>) -> &'static Pristine {
        let leaked: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        Box::leak(Box::new(Pristine {
            start: leaked.as_ptr(),
            len: leaked.len(),
            id: ZygoteId(Sha256::digest(leaked).into()),
        }))
    }

    fn memory(pages: usize, fill: impl Fn(usize) -> u8) -> Vec<u8> {
        (0..pages * PAGE_BYTES)
            .map(|i| fill(i / PAGE_BYTES))
            .collect()
    }

    #[test]
    fn a_fresh_child_has_no_changes_and_a_written_page_is_sent_once_as_xor() {
        let base = pristine(memory(4, |p| p as u8 + 1));
        let mut shadow = Shadow::new(base);
        let mut mem = memory(4, |p| p as u8 + 1);
        assert!(shadow.changes(&mem).indexes.is_empty());
        mem[2 * PAGE_BYTES + 5] ^= 0xff;
        let changed = shadow.changes(&mem);
        assert_eq!(changed.indexes, vec![2]);
        // One run: at offset 5, one byte, 0xff.
        assert_eq!(changed.bytes, [1, 0, 5, 0, 1, 0, 0xff]);
        assert!(shadow.changes(&mem).indexes.is_empty(), "unchanged since");
        // Back to the pristine bytes: sent again (no runs), and forgotten by the shadow.
        mem[2 * PAGE_BYTES + 5] ^= 0xff;
        let back = shadow.changes(&mem);
        assert_eq!(back.indexes, vec![2]);
        assert_eq!(back.bytes, UNCHANGED_PAGE);
        assert!(shadow.pages.iter().all(Option::is_none));
    }

    #[test]
    fn only_the_pages_named_written_are_compared() {
        let base = pristine(memory(4, |_| 1));
        let mut shadow = Shadow::new(base);
        let mut mem = memory(4, |_| 1);
        mem[PAGE_BYTES] = 5;
        mem[3 * PAGE_BYTES] = 5;
        let changed = shadow.changes_among(&mem, [1, 2, 9]);
        assert_eq!(
            changed.indexes,
            vec![1],
            "page 3 was not named, page 9 lies past the end"
        );
        assert_eq!(shadow.changes(&mem).indexes, vec![3]);
    }

    #[test]
    fn grown_memory_is_measured_against_zeros() {
        let base = pristine(memory(2, |_| 7));
        let mut shadow = Shadow::new(base);
        let mut mem = memory(4, |p| if p < 2 { 7 } else { 0 });
        assert!(shadow.changes(&mem).indexes.is_empty());
        mem[3 * PAGE_BYTES] = 9;
        let changed = shadow.changes(&mem);
        assert_eq!(changed.indexes, vec![3]);
        assert_eq!(changed.memory_bytes, 4 * PAGE_BYTES as u64);
        assert_eq!(changed.bytes, [1, 0, 0, 0, 1, 0, 9]);
    }

    #[test]
    fn a_restore_brings_another_childs_memory_back_exactly() {
        let base = pristine(memory(4, |p| p as u8));
        let mut source = Shadow::new(base);
        let mut theirs = memory(6, |p| if p < 4 { p as u8 } else { 0 });
        theirs[PAGE_BYTES] = 42;
        theirs[5 * PAGE_BYTES + 1] = 43;
        let image = source.changes(&theirs);
        // A fresh child that already changed a page the image does not hold (an install).
        let mut target = Shadow::new(base);
        let mut ours = memory(6, |p| if p < 4 { p as u8 } else { 0 });
        ours[3 * PAGE_BYTES] = 99;
        target.restore(&mut ours, &image).expect("restores");
        assert_eq!(ours, theirs);
        assert!(
            target.changes(&ours).indexes.is_empty(),
            "the shadow is the image"
        );
    }

    #[test]
    fn a_misshapen_image_is_refused_before_any_write() {
        let base = pristine(memory(2, |_| 1));
        let mut shadow = Shadow::new(base);
        let mut mem = memory(2, |_| 1);
        let bad = [
            Pages {
                memory_bytes: 8 * PAGE_BYTES as u64,
                ..Pages::default()
            },
            Pages {
                memory_bytes: 0,
                indexes: vec![5],
                bytes: UNCHANGED_PAGE.to_vec(),
            },
            Pages {
                memory_bytes: 0,
                indexes: vec![1, 0],
                bytes: [UNCHANGED_PAGE, UNCHANGED_PAGE].concat(),
            },
            Pages {
                memory_bytes: 0,
                indexes: vec![0],
                bytes: vec![0; 3],
            },
        ];
        for image in bad {
            assert!(shadow.restore(&mut mem, &image).is_err(), "{image:?}");
            assert_eq!(mem, memory(2, |_| 1));
        }
    }
}
