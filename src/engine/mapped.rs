//! A file's bytes mapped into memory instead of read: the memory snapshot a worker restores
//! (30 MiB) reaches JavaScript without a copy, its pages faulted in from the page cache as
//! Pyodide copies them into the WebAssembly memory.

use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};
use std::ffi::c_void;
use std::fs::File;
use std::num::NonZeroUsize;
use std::ptr::NonNull;
use thiserror::Error;

/// Why a file could not be mapped.
#[derive(Debug, Error)]
pub enum MapError {
    #[error("cannot read the file's size")]
    Metadata(#[source] std::io::Error),
    #[error("the file has {size} bytes, more than {max}")]
    TooLarge { size: u64, max: u64 },
    #[error("the file is empty")]
    Empty,
    #[error("mmap failed")]
    Map(#[source] nix::Error),
}

/// A whole file mapped private and writable (`MAP_PRIVATE`: a write copies the page and never
/// reaches the file), unmapped on drop. JavaScript may write to an `ArrayBuffer` over it.
pub struct MappedFile {
    start: NonNull<c_void>,
    len: usize,
}

// SAFETY: the mapping is owned by this value alone and is plain memory.
unsafe impl Send for MappedFile {}

impl MappedFile {
    /// Maps all of `file` (at most `max_len` bytes). The mapping outlives the descriptor,
    /// which the caller may close at once.
    ///
    /// Errors: [`MapError`].
    pub fn map(file: &File, max_len: u64) -> Result<MappedFile, MapError> {
        let size = file.metadata().map_err(MapError::Metadata)?.len();
        if size > max_len {
            return Err(MapError::TooLarge { size, max: max_len });
        }
        let len = NonZeroUsize::new(size as usize).ok_or(MapError::Empty)?;
        // SAFETY: a new private mapping of an open file, at an address the kernel picks; it
        // aliases no Rust memory, and is unmapped only by `drop`.
        let start = unsafe {
            mmap(
                None,
                len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE,
                file,
                0,
            )
        }
        .map_err(MapError::Map)?;
        Ok(MappedFile {
            start,
            len: len.get(),
        })
    }

    /// The mapping's first byte and its length in bytes.
    pub fn as_raw(&self) -> (*mut c_void, usize) {
        (self.start.as_ptr(), self.len)
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `map` made, once; nothing refers to it any more
        // (JavaScript's buffer over it is the owner that dropped it).
        if let Err(e) = unsafe { munmap(self.start, self.len) } {
            tracing::warn!("munmap of a mapped file failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn maps_a_whole_file_privately_within_its_bound() {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(b"snapshot bytes").unwrap();
        let mapped = MappedFile::map(&file, 64).unwrap();
        let (start, len) = mapped.as_raw();
        // SAFETY: the mapping is `len` readable and writable bytes, alive until `mapped` drops.
        let bytes = unsafe { std::slice::from_raw_parts_mut(start as *mut u8, len) };
        assert_eq!(bytes, b"snapshot bytes");
        // Private: a write to the mapping never reaches the file.
        bytes[0] = b'S';
        drop(mapped);
        let remapped = MappedFile::map(&file, 64).unwrap();
        // SAFETY: the mapping holds at least one readable byte, alive until `remapped` drops.
        let first = unsafe { *(remapped.as_raw().0 as *const u8) };
        assert_eq!(first, b's');
        assert!(matches!(
            MappedFile::map(&file, 4),
            Err(MapError::TooLarge { size: 14, max: 4 })
        ));
        let empty = tempfile::tempfile().unwrap();
        assert!(matches!(MappedFile::map(&empty, 64), Err(MapError::Empty)));
    }
}
