//! Interpreter checkpoints: a sandbox's Python state as the pages of its WebAssembly linear
//! memory that differ from the zygote's (checkpoints, docs/architecture.md §3.4; docs/checkpoint-research.md §5–§7).
//!
//! Python's whole state (globals, modules, the allocator, the import system, the random state)
//! lives in the interpreter's linear memory, and copying that memory into a fresh worker forked
//! from the same zygote restores it (§5). Every interpreter starts as a copy of the zygote's
//! pristine memory, and a call changes few pages of it, so a checkpoint need not hold the whole
//! memory (30–56 MiB): it holds, for each 4 KiB page that differs from the zygote's, that page
//! XOR the zygote's page at the same index (a page beyond the pristine memory's end XORs with
//! zeros), encoded as the runs where it differs (`crate::protocol::pages`: 2–5 % of a page's
//! bytes, measured). A worker reports after each call the pages it changed since its last
//! report, in the same form; [`Checkpoint::merge`] applies such a delta, and a page whose
//! encoding has no runs is dropped (it equals the zygote's again). A restore sends [`Checkpoint::pages`] to a
//! fresh child of the same zygote, which grows its memory to [`Checkpoint::memory_bytes`] and
//! XORs the pages in.
//!
//! A checkpoint is only meaningful against the zygote it was taken from ([`ZygoteId`], the
//! digest of that zygote's pristine memory): XOR values applied to another base give garbage.
//! Everything here checks its input whole before changing anything, because deltas come from
//! workers that run untrusted code and images come back from a shared directory
//! ([`sealed`] is the file format, sealed so that only the sandbox's own replica can read or
//! write it).

pub mod file;
pub mod saved;
pub mod sealed;

pub use saved::{Kept, Resumable, Saved, Spilled, Written};

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::protocol::pages::{split_encodings, UNCHANGED_PAGE};
pub use crate::protocol::pages::{ZygoteId, PAGE_BYTES};

/// Bytes in a WebAssembly page: linear memory grows by whole pages of this size, so every
/// memory size here is a multiple of it.
pub const WASM_PAGE_BYTES: u64 = 65536;

/// Largest linear memory a checkpoint may describe, in bytes: wasm32's limit (65,536 pages of
/// 64 KiB = 4 GiB).
pub const MAX_MEMORY_BYTES: u64 = 4 << 30;

/// [`PAGE_BYTES`] as a `u64`, for byte counts of whole memories.
const PAGE_BYTES_U64: u64 = PAGE_BYTES as u64;

/// Why a checkpoint or a delta was refused. Every variant carries numbers only, never bytes of
/// the input, so its words are safe to log and to show to a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    /// A memory size that is zero, not a multiple of [`WASM_PAGE_BYTES`], or above
    /// [`MAX_MEMORY_BYTES`].
    #[error("a linear memory of {bytes} bytes is not a nonzero multiple of 64 KiB up to 4 GiB")]
    BadMemorySize { bytes: u64 },
    /// A delta whose memory is smaller than the checkpoint's (linear memory never shrinks).
    #[error("the linear memory would shrink from {from} to {to} bytes")]
    Shrinks { from: u64, to: u64 },
    /// A page index at or beyond the end of the memory (memory bytes / [`PAGE_BYTES`]).
    #[error("page {index} lies beyond the end of the linear memory")]
    BadIndex { index: u32 },
    /// Page indexes that are not strictly increasing (unsorted or repeated).
    #[error("the page indexes are not strictly increasing")]
    NotIncreasing,
    /// Page bytes that are not one page encoding per index (`crate::protocol::pages`), the
    /// `index`-th (from 0) being the first that is not.
    #[error("page {index} of the delta is not a page encoding")]
    BadEncoding { index: usize },
}

/// `bytes` as a linear memory's size: nonzero, a multiple of [`WASM_PAGE_BYTES`], at most
/// [`MAX_MEMORY_BYTES`].
fn check_memory_bytes(bytes: u64) -> Result<(), CheckpointError> {
    if bytes == 0 || !bytes.is_multiple_of(WASM_PAGE_BYTES) || bytes > MAX_MEMORY_BYTES {
        return Err(CheckpointError::BadMemorySize { bytes });
    }
    Ok(())
}

/// A sandbox's interpreter as the pages that differ from its zygote's pristine memory.
///
/// Invariants (kept by [`Checkpoint::new`] and [`Checkpoint::merge`]): the memory size is a
/// nonzero multiple of [`WASM_PAGE_BYTES`] up to [`MAX_MEMORY_BYTES`]; every page index lies
/// below memory bytes / [`PAGE_BYTES`]; every stored page is an encoding
/// `crate::protocol::pages::encoded_len` accepts, with at least one run (a page without runs
/// is the zygote's, which is not stored).
///
/// `Debug` shows the sizes only, never the pages (they are the sandbox's memory).
#[derive(Clone, PartialEq, Eq)]
pub struct Checkpoint {
    zygote: ZygoteId,
    memory_bytes: u64,
    /// Shared, so that a copy (a fork's state, a restore's) costs a count per page, not its
    /// bytes.
    pages: BTreeMap<u32, Arc<[u8]>>,
}

impl fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checkpoint")
            .field("zygote", &format_args!("{}", self.zygote))
            .field("memory_bytes", &self.memory_bytes)
            .field("page_count", &self.pages.len())
            .finish()
    }
}

impl Checkpoint {
    /// An interpreter identical to `zygote`'s pristine one (no page differs), with a linear
    /// memory of `memory_bytes` bytes.
    ///
    /// Errors: [`CheckpointError::BadMemorySize`] unless `memory_bytes` is a nonzero multiple
    /// of [`WASM_PAGE_BYTES`] no larger than [`MAX_MEMORY_BYTES`].
    pub fn new(zygote: ZygoteId, memory_bytes: u64) -> Result<Checkpoint, CheckpointError> {
        check_memory_bytes(memory_bytes)?;
        Ok(Checkpoint {
            zygote,
            memory_bytes,
            pages: BTreeMap::new(),
        })
    }

    /// Applies a worker's delta: its memory is now `memory_bytes` bytes long, and page
    /// `indexes[i]` XOR the zygote's page is the `i`-th page encoding in `bytes`. A page
    /// without runs equals the zygote's again and is removed; any other replaces what was
    /// stored for its index. Pages the delta does not name are kept.
    ///
    /// Atomic: the whole delta is checked first, and on an error nothing changes.
    ///
    /// Errors, in the order checked:
    /// - [`CheckpointError::BadMemorySize`]: `memory_bytes` is zero, not a multiple of
    ///   [`WASM_PAGE_BYTES`], or above [`MAX_MEMORY_BYTES`];
    /// - [`CheckpointError::Shrinks`]: `memory_bytes` is below the current size;
    /// - [`CheckpointError::BadEncoding`]: `bytes` is not exactly one page encoding per index;
    /// - [`CheckpointError::BadIndex`]: an index at or beyond `memory_bytes / PAGE_BYTES`;
    /// - [`CheckpointError::NotIncreasing`]: indexes not strictly increasing.
    pub fn merge(
        &mut self,
        memory_bytes: u64,
        indexes: &[u32],
        bytes: &[u8],
    ) -> Result<(), CheckpointError> {
        check_memory_bytes(memory_bytes)?;
        if memory_bytes < self.memory_bytes {
            return Err(CheckpointError::Shrinks {
                from: self.memory_bytes,
                to: memory_bytes,
            });
        }
        let encoded = split_encodings(bytes, indexes.len())
            .map_err(|index| CheckpointError::BadEncoding { index })?;
        let page_limit = memory_bytes / PAGE_BYTES_U64;
        let mut previous: Option<u32> = None;
        for &index in indexes {
            if u64::from(index) >= page_limit {
                return Err(CheckpointError::BadIndex { index });
            }
            if previous.is_some_and(|p| index <= p) {
                return Err(CheckpointError::NotIncreasing);
            }
            previous = Some(index);
        }

        self.memory_bytes = memory_bytes;
        for (&index, page) in indexes.iter().zip(encoded) {
            if page == UNCHANGED_PAGE {
                self.pages.remove(&index);
            } else {
                self.pages.insert(index, Arc::from(page));
            }
        }
        Ok(())
    }

    /// The zygote whose pristine memory the pages are XORed with.
    pub fn zygote(&self) -> ZygoteId {
        self.zygote
    }

    /// The linear memory's size, in bytes (a multiple of [`WASM_PAGE_BYTES`]).
    pub fn memory_bytes(&self) -> u64 {
        self.memory_bytes
    }

    /// How many pages differ from the zygote's (the number stored).
    pub fn page_count(&self) -> usize {
        self.pages.len()
    }

    /// Bytes of page data held: the stored encodings' lengths (the maps' own overhead is not
    /// counted).
    pub fn stored_bytes(&self) -> u64 {
        self.pages.values().map(|page| page.len() as u64).sum()
    }

    /// The stored pages in increasing index order, each as its index and its encoding.
    pub fn pages(&self) -> impl ExactSizeIterator<Item = (u32, &[u8])> + Clone + '_ {
        self.pages.iter().map(|(&index, page)| (index, &page[..]))
    }

    /// The pages at `indexes` as a delta against this checkpoint's last written state (the
    /// state directory's chain, [`file::write_delta`]): in increasing index order, each with
    /// its stored encoding, or one without runs where the page equals the zygote's again (a
    /// merge of the delta then removes it). Indexes at or beyond the memory's end are left out (none are:
    /// memory never shrinks, and every index came from a merge).
    pub fn pages_at(&self, indexes: &std::collections::BTreeSet<u32>) -> Vec<(u32, &[u8])> {
        let page_limit = self.memory_bytes / PAGE_BYTES_U64;
        indexes
            .iter()
            .filter(|&&i| u64::from(i) < page_limit)
            .map(|&i| {
                (
                    i,
                    self.pages.get(&i).map_or(&UNCHANGED_PAGE[..], |p| &p[..]),
                )
            })
            .collect()
    }

    /// Every stored page as one delta (for the tests; a restore sends [`Checkpoint::pages`]
    /// from where they are): the indexes in increasing order, and their encodings concatenated
    /// in the same order ([`Checkpoint::stored_bytes`] bytes). Merging it into a new checkpoint of
    /// the same zygote and memory size gives this one back.
    #[cfg(test)]
    pub fn to_delta(&self) -> (Vec<u32>, Vec<u8>) {
        let mut indexes = Vec::with_capacity(self.pages.len());
        let mut bytes = Vec::with_capacity(self.stored_bytes() as usize);
        for (index, page) in self.pages() {
            indexes.push(index);
            bytes.extend_from_slice(page);
        }
        (indexes, bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn zygote() -> ZygoteId {
        ZygoteId([7; 32])
    }

    /// The encoding of a page of `fill` bytes against a zygote page of zeros.
    fn page(fill: u8) -> Vec<u8> {
        let mut out = Vec::new();
        crate::protocol::pages::encode_xor(&[fill; PAGE_BYTES], &[0; PAGE_BYTES], &mut out);
        out
    }

    fn pages(fills: &[u8]) -> Vec<u8> {
        fills.iter().flat_map(|&f| page(f)).collect()
    }

    #[test]
    fn new_checks_the_memory_size() {
        assert!(Checkpoint::new(zygote(), WASM_PAGE_BYTES).is_ok());
        assert!(Checkpoint::new(zygote(), MAX_MEMORY_BYTES).is_ok());
        for bytes in [
            0,
            4096,
            WASM_PAGE_BYTES + 4096,
            MAX_MEMORY_BYTES + WASM_PAGE_BYTES,
        ] {
            assert_eq!(
                Checkpoint::new(zygote(), bytes),
                Err(CheckpointError::BadMemorySize { bytes })
            );
        }
        let c = Checkpoint::new(zygote(), 30 * MIB).unwrap();
        assert_eq!(c.zygote(), zygote());
        assert_eq!(c.memory_bytes(), 30 * MIB);
        assert_eq!(c.page_count(), 0);
        assert_eq!(c.stored_bytes(), 0);
        assert_eq!(c.to_delta(), (vec![], vec![]));
    }

    #[test]
    fn merge_inserts_replaces_and_removes_zero_pages() {
        let mut c = Checkpoint::new(zygote(), MIB).unwrap();
        c.merge(MIB, &[1, 5, 9], &pages(&[1, 5, 9])).unwrap();
        assert_eq!(c.page_count(), 3);
        assert_eq!(c.stored_bytes(), 3 * page(1).len() as u64);

        // 5 goes back to the zygote's page, 9 changes, 12 is new, 1 is untouched.
        c.merge(2 * MIB, &[5, 9, 12], &pages(&[0, 90, 12])).unwrap();
        assert_eq!(c.memory_bytes(), 2 * MIB);
        let (indexes, bytes) = c.to_delta();
        assert_eq!(indexes, vec![1, 9, 12]);
        assert_eq!(bytes, pages(&[1, 90, 12]));

        // A page that is zero only in part is kept.
        let mut partly = vec![0; PAGE_BYTES];
        partly[4095] = 1;
        let mut encoded = Vec::new();
        crate::protocol::pages::encode_xor(&partly, &[0; PAGE_BYTES], &mut encoded);
        c.merge(2 * MIB, &[3], &encoded).unwrap();
        assert_eq!(c.pages().map(|(i, _)| i).collect::<Vec<_>>(), [1, 3, 9, 12]);

        // Zero pages that were never stored are fine too.
        c.merge(2 * MIB, &[0, 2], &pages(&[0, 0])).unwrap();
        assert_eq!(c.page_count(), 4);
    }

    #[test]
    fn to_delta_round_trips() {
        let mut c = Checkpoint::new(zygote(), 4 * MIB).unwrap();
        c.merge(4 * MIB, &[0, 17, 1023], &pages(&[3, 4, 5]))
            .unwrap();
        let (indexes, bytes) = c.to_delta();
        let mut copy = Checkpoint::new(zygote(), 4 * MIB).unwrap();
        copy.merge(4 * MIB, &indexes, &bytes).unwrap();
        assert_eq!(copy, c);
    }

    /// Memory sizes a merge into a 1 MiB checkpoint refuses, each with its error.
    fn bad_memory_sizes() -> Vec<(u64, Vec<u32>, Vec<u8>, CheckpointError)> {
        vec![
            (
                MIB + 1,
                vec![3],
                page(3),
                CheckpointError::BadMemorySize { bytes: MIB + 1 },
            ),
            (
                0,
                vec![],
                vec![],
                CheckpointError::BadMemorySize { bytes: 0 },
            ),
            (
                MAX_MEMORY_BYTES + WASM_PAGE_BYTES,
                vec![],
                vec![],
                CheckpointError::BadMemorySize {
                    bytes: MAX_MEMORY_BYTES + WASM_PAGE_BYTES,
                },
            ),
            (
                MIB - WASM_PAGE_BYTES,
                vec![],
                vec![],
                CheckpointError::Shrinks {
                    from: MIB,
                    to: MIB - WASM_PAGE_BYTES,
                },
            ),
        ]
    }

    /// Lengths and indexes a merge into a 1 MiB checkpoint refuses, each with its error.
    fn bad_pages() -> Vec<(u64, Vec<u32>, Vec<u8>, CheckpointError)> {
        let last = (MIB / 4096) as u32 - 1;
        vec![
            (
                MIB,
                vec![3, 4],
                page(3),
                CheckpointError::BadEncoding { index: 1 },
            ),
            (
                MIB,
                vec![3],
                [page(3), vec![0]].concat(),
                CheckpointError::BadEncoding { index: 1 },
            ),
            (
                MIB,
                vec![3],
                vec![1; 4097],
                CheckpointError::BadEncoding { index: 0 },
            ),
            (
                MIB,
                vec![3, last + 1],
                pages(&[3, 4]),
                CheckpointError::BadIndex { index: last + 1 },
            ),
            (
                MIB,
                vec![3, u32::MAX],
                pages(&[3, 4]),
                CheckpointError::BadIndex { index: u32::MAX },
            ),
            (
                MIB,
                vec![4, 3],
                pages(&[4, 3]),
                CheckpointError::NotIncreasing,
            ),
            (
                MIB,
                vec![3, 3],
                pages(&[3, 3]),
                CheckpointError::NotIncreasing,
            ),
        ]
    }

    #[test]
    fn merge_refuses_bad_deltas_and_changes_nothing() {
        let mut c = Checkpoint::new(zygote(), MIB).unwrap();
        c.merge(MIB, &[2], &page(2)).unwrap();
        let before = c.clone();
        let last = (MIB / 4096) as u32 - 1;
        for (memory, indexes, bytes, error) in bad_memory_sizes().into_iter().chain(bad_pages()) {
            assert_eq!(c.merge(memory, &indexes, &bytes), Err(error));
            assert_eq!(c, before, "a refused delta changed the checkpoint");
        }

        // The last page of the memory is in range; after growing, the next one is too.
        c.merge(MIB, &[last], &page(9)).unwrap();
        c.merge(MIB + WASM_PAGE_BYTES, &[last + 1], &page(9))
            .unwrap();
        assert_eq!(c.page_count(), 3);
    }

    #[test]
    fn debug_shows_no_page_bytes() {
        let mut c = Checkpoint::new(zygote(), MIB).unwrap();
        c.merge(MIB, &[1], &page(b'Z')).unwrap();
        let shown = format!("{c:?}");
        assert!(!shown.contains("90"), "{shown}");
        assert!(!shown.contains('Z'), "{shown}");
        assert!(shown.contains("page_count: 1"), "{shown}");
    }

    #[test]
    fn zygote_id_text_forms() {
        let mut bytes = [0u8; 32];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = i as u8 * 8 + 1;
        }
        let id = ZygoteId(bytes);
        let hex = id.hex();
        assert_eq!(hex.len(), 64);
        assert!(hex.starts_with("0109111921293139"));
        assert_eq!(id.to_string(), "010911192129");
        assert_eq!(ZygoteId::from_hex(&hex), Some(id));
        assert_eq!(ZygoteId::from_hex(&hex.to_uppercase()), Some(id));
        assert_eq!(ZygoteId::from_hex(&hex[..62]), None);
        assert_eq!(ZygoteId::from_hex(&format!("{hex}00")), None);
        assert_eq!(ZygoteId::from_hex(&format!("{}zz", &hex[..62])), None);
        assert_eq!(ZygoteId::from_hex(""), None);

        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, format!("\"{hex}\""));
        assert_eq!(serde_json::from_str::<ZygoteId>(&json).unwrap(), id);
        let error = serde_json::from_str::<ZygoteId>("\"secret-words\"").unwrap_err();
        assert!(!error.to_string().contains("secret"), "{error}");
        assert!(serde_json::from_str::<ZygoteId>("17").is_err());
    }
}
