//! Pages of linear memory as both sides of the worker protocol carry them: a checkpoint's
//! pages in a reply, a restore's in a request, and the id of the zygote they are relative to.
//! What the interpreter does with them (its pristine copy, its shadow) is in
//! `src/interpreter/linear_memory.rs`; the front keeps them as bytes (`src/sandbox/checkpoint/`).
//!
//! A page travels, and is kept, as its XOR with the zygote's page **encoded as runs**: most
//! of a page a call changed still equals the zygote's (a checkpoint's XOR pages were measured
//! at 2–5 % nonzero bytes, in 2–3 stretches a page), so only the stretches that differ are
//! written:
//!
//! ```text
//! u16 n (little-endian), then n runs: u16 offset, u16 length (1..=4096), length XOR bytes
//! ```
//!
//! Runs lie in increasing order within the page, each starts and ends with a nonzero byte, and
//! two runs are at least [`RUN_HEADER_BYTES`] apart (a shorter stretch of zeros is cheaper
//! inside a run than a new run's header). So each XOR page has exactly one encoding, and
//! `n == 0` is the zygote's page itself. [`encode_xor`] writes it, [`encoded_len`] checks one
//! that came from elsewhere, [`xor_runs_into`] applies one.

use std::fmt;
use thiserror::Error;

/// Bytes of one page as a checkpoint counts them: the kernel's base page, so that a page a
/// call did not touch is also one the fork still shares.
pub const PAGE_BYTES: usize = 4096;

/// A zygote's identity: the SHA-256 of its pristine linear memory. Checkpoints are XOR values
/// against that memory, so a checkpoint restores only into a child of a zygote with the same id.
///
/// Displayed as its first 12 hex digits (enough to tell zygotes apart in a log); serialized
/// (serde) as all 64 hex digits, lower case.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub struct ZygoteId(pub [u8; 32]);

/// Hex digits of a [`ZygoteId`] as [`fmt::Display`] shows it.
const ZYGOTE_SHORT_HEX: usize = 12;

impl ZygoteId {
    /// All 64 hex digits, lower case.
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }

    /// The id written as 64 hex digits (either case), or `None` when `text` is anything else
    /// (another length, a non-hex character).
    pub fn from_hex(text: &str) -> Option<ZygoteId> {
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(text, &mut bytes).ok()?;
        Some(ZygoteId(bytes))
    }
}

impl fmt::Display for ZygoteId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let full = self.hex();
        f.write_str(&full[..ZYGOTE_SHORT_HEX])
    }
}

impl serde::Serialize for ZygoteId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.hex())
    }
}

impl<'de> serde::Deserialize<'de> for ZygoteId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        // The error echoes nothing of the input: it may come from the shared state directory.
        ZygoteId::from_hex(&text)
            .ok_or_else(|| serde::de::Error::custom("a zygote id is 64 hex digits"))
    }
}
/// Bytes of a page's run count.
const COUNT_BYTES: usize = 2;

/// Bytes before each run's data: its offset and its length.
pub const RUN_HEADER_BYTES: usize = 4;

/// The longest encoding of one page: runs at least one byte long and [`RUN_HEADER_BYTES`]
/// apart cost at most the page plus one run header, plus the count.
pub const MAX_ENCODED_PAGE_BYTES: usize = PAGE_BYTES + RUN_HEADER_BYTES + COUNT_BYTES;

/// The encoding of a page equal to the zygote's (no runs).
pub const UNCHANGED_PAGE: [u8; COUNT_BYTES] = [0; COUNT_BYTES];

/// Bytes compared at a time while looking for where a page differs from its base: a cache
/// line, folded without an early exit so that the compiler compares it in vector registers.
const BLOCK_BYTES: usize = 64;

/// The most bytes the encodings of the pages of a `memory_bytes` linear memory can take:
/// what a checkpoint of it may send (it never sends a page twice).
pub fn max_encoded_bytes(memory_bytes: u64) -> u64 {
    (memory_bytes / PAGE_BYTES as u64).saturating_mul(MAX_ENCODED_PAGE_BYTES as u64)
}

/// Appends to `out` the encoding of `page` XOR `base` (both [`PAGE_BYTES`] long); returns
/// whether any byte differs. A block at a time over equal stretches: the checkpoint runs it
/// over every page the call wrote.
pub fn encode_xor(page: &[u8], base: &[u8], out: &mut Vec<u8>) -> bool {
    debug_assert!(page.len() == PAGE_BYTES && base.len() == PAGE_BYTES);
    let start = out.len();
    out.extend_from_slice(&UNCHANGED_PAGE);
    let mut runs: u16 = 0;
    let mut at = 0;
    while let Some(first) = next_difference(page, base, at) {
        // The run goes on while the next differing byte is within a run header's length.
        let mut last = first;
        let mut probe = first + 1;
        while probe < PAGE_BYTES && probe <= last + RUN_HEADER_BYTES {
            if page[probe] != base[probe] {
                last = probe;
            }
            probe += 1;
        }
        // Offsets and lengths are below 2^13 (4096 bytes): they fit a u16.
        out.extend_from_slice(&(first as u16).to_le_bytes());
        out.extend_from_slice(&((last - first + 1) as u16).to_le_bytes());
        out.extend(
            page[first..=last]
                .iter()
                .zip(&base[first..=last])
                .map(|(p, b)| p ^ b),
        );
        runs += 1;
        at = last + 1;
    }
    out[start..start + COUNT_BYTES].copy_from_slice(&runs.to_le_bytes());
    runs > 0
}

/// The first index at or after `from` where `page` and `base` differ.
fn next_difference(page: &[u8], base: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    // Byte by byte up to a block boundary, then block by block over what is equal.
    while at < PAGE_BYTES && !at.is_multiple_of(BLOCK_BYTES) {
        if page[at] != base[at] {
            return Some(at);
        }
        at += 1;
    }
    while at < PAGE_BYTES && same_block(&page[at..at + BLOCK_BYTES], &base[at..at + BLOCK_BYTES]) {
        at += BLOCK_BYTES;
    }
    (at..PAGE_BYTES).find(|&i| page[i] != base[i])
}

/// Whether two blocks of [`BLOCK_BYTES`] are equal.
fn same_block(a: &[u8], b: &[u8]) -> bool {
    a.iter().zip(b).fold(0, |differ, (x, y)| differ | (x ^ y)) == 0
}

/// The length of the page encoding `bytes` starts with, if it is the one [`encode_xor`]
/// writes for some page (runs in order, within the page, each starting and ending with a
/// nonzero byte, with fewer than [`RUN_HEADER_BYTES`] zeros in a row, and at least that many
/// apart); `None` for anything else. Reads only what
/// the encoding announces, bounds first: the bytes may come from a worker or a shared
/// directory.
pub fn encoded_len(bytes: &[u8]) -> Option<usize> {
    let mut at = COUNT_BYTES;
    // Where the previous run ended, and so the least offset the next may have.
    let mut free_from = 0;
    for _ in 0..run_count(bytes)? {
        let (offset, data) = run_at(bytes, at)?;
        let len = data.len();
        if len == 0 || offset < free_from || offset + len > PAGE_BYTES {
            return None;
        }
        if data[0] == 0 || data[len - 1] == 0 || has_zeros_for_a_header(data) {
            return None;
        }
        free_from = offset + len + RUN_HEADER_BYTES;
        at += RUN_HEADER_BYTES + len;
    }
    Some(at)
}

/// The run count an encoding starts with, if `bytes` holds one.
fn run_count(bytes: &[u8]) -> Option<u16> {
    let count = bytes.get(..COUNT_BYTES)?;
    Some(u16::from_le_bytes([count[0], count[1]]))
}

/// The run whose header starts at `at` in `bytes`: its offset in the page and its data, if
/// `bytes` holds the header and all the data it announces.
fn run_at(bytes: &[u8], at: usize) -> Option<(usize, &[u8])> {
    let header = bytes.get(at..at + RUN_HEADER_BYTES)?;
    let offset = usize::from(u16::from_le_bytes([header[0], header[1]]));
    let len = usize::from(u16::from_le_bytes([header[2], header[3]]));
    let data = bytes.get(at + RUN_HEADER_BYTES..at + RUN_HEADER_BYTES + len)?;
    Some((offset, data))
}

/// `bytes` as `count` page encodings one after another, each one [`encoded_len`] accepts,
/// with nothing after the last: the one walk over a delta's or an image's pages.
///
/// Errors: the position (from 0) of the first that is not an encoding, `count` when bytes
/// are left over.
pub fn split_encodings(bytes: &[u8], count: usize) -> Result<Vec<&[u8]>, usize> {
    let mut pages = Vec::with_capacity(count);
    let mut rest = bytes;
    for position in 0..count {
        let len = encoded_len(rest).ok_or(position)?;
        let (page, after) = rest.split_at(len);
        pages.push(page);
        rest = after;
    }
    if rest.is_empty() {
        Ok(pages)
    } else {
        Err(count)
    }
}

/// Whether `data` holds [`RUN_HEADER_BYTES`] zeros in a row: where [`encode_xor`] would have
/// ended one run and started another.
fn has_zeros_for_a_header(data: &[u8]) -> bool {
    let mut zeros = 0;
    data.iter().any(|&b| {
        zeros = if b == 0 { zeros + 1 } else { 0 };
        zeros == RUN_HEADER_BYTES
    })
}

/// `out ^= ` the runs of `encoded`, a page encoding [`encoded_len`] accepted (anything else
/// is applied as far as it reads as runs that fit `out`, never past its end). With `out` the
/// zygote's page, it becomes the page the encoding describes; with zeros, the XOR itself.
pub fn xor_runs_into(encoded: &[u8], out: &mut [u8]) {
    let mut at = COUNT_BYTES;
    for _ in 0..run_count(encoded).unwrap_or(0) {
        let Some((offset, data)) = run_at(encoded, at) else {
            return;
        };
        let Some(target) = out.get_mut(offset..offset + data.len()) else {
            return;
        };
        target.iter_mut().zip(data).for_each(|(t, d)| *t ^= d);
        at += RUN_HEADER_BYTES + data.len();
    }
}

/// XOR pages written whole (`PAGE_BYTES` each, one after another) as their encodings, one
/// after another: for tests that write pages by hand.
#[cfg(test)]
pub fn encode_whole_pages(xor: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for page in xor.chunks_exact(PAGE_BYTES) {
        encode_xor(page, &[0; PAGE_BYTES], &mut out);
    }
    out
}

/// The pages of a checkpoint: their indexes, in increasing order, and their encodings one
/// after another, each the page XOR the zygote's page as runs (the module's layout).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pages {
    /// Linear memory's size when taken (bytes; a multiple of 64 KiB).
    pub memory_bytes: u64,
    /// Page indexes, strictly increasing.
    pub indexes: Vec<u32>,
    /// One page encoding per index, in the same order.
    pub bytes: Vec<u8>,
}

/// Page indexes as attachment bytes (`u32` little-endian each), as [`Pages::from_parts`]
/// reads them: a checkpoint's reply, a restore's request.
pub fn index_bytes(indexes: &[u32]) -> Vec<u8> {
    indexes.iter().flat_map(|i| i.to_le_bytes()).collect()
}

impl Pages {
    /// The indexes as attachment bytes ([`index_bytes`]).
    pub fn index_bytes(&self) -> Vec<u8> {
        index_bytes(&self.indexes)
    }

    /// Pages from attachment bytes: `indexes` as [`index_bytes`](Self::index_bytes) makes them,
    /// `bytes` one page encoding per index (the module's layout).
    ///
    /// Errors: [`ShapeError`] when the indexes are not whole `u32`s or not strictly
    /// increasing, or `bytes` is not exactly one encoding [`encoded_len`] accepts per index.
    pub fn from_parts(
        memory_bytes: u64,
        indexes: &[u8],
        bytes: Vec<u8>,
    ) -> Result<Pages, ShapeError> {
        if !indexes.len().is_multiple_of(4) {
            return Err(ShapeError);
        }
        let indexes: Vec<u32> = indexes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let pages = Pages {
            memory_bytes,
            indexes,
            bytes,
        };
        pages.check()?;
        Ok(pages)
    }

    /// Whether these pages are in the module's layout ([`Pages::encodings`]).
    ///
    /// Errors: [`ShapeError`] when they are not.
    pub fn check(&self) -> Result<(), ShapeError> {
        self.encodings().map(drop)
    }

    /// Each index's page encoding, in order, if these pages are in the module's layout:
    /// indexes strictly increasing, and `bytes` exactly one encoding [`encoded_len`] accepts
    /// per index ([`split_encodings`]).
    ///
    /// Errors: [`ShapeError`] when they are not.
    pub fn encodings(&self) -> Result<Vec<&[u8]>, ShapeError> {
        if self.indexes.windows(2).any(|w| w[0] >= w[1]) {
            return Err(ShapeError);
        }
        split_encodings(&self.bytes, self.indexes.len()).map_err(|_| ShapeError)
    }
}

/// Attachment bytes that are not pages: lengths that disagree, or indexes that are not
/// strictly increasing.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
#[error("the checkpoint's pages do not fit its memory")]
pub struct ShapeError;

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(page: &[u8], base: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_xor(page, base, &mut out);
        out
    }

    #[test]
    fn pages_of_the_wrong_shape_are_refused() {
        assert_eq!(Pages::from_parts(0, &[1, 0, 0], vec![]), Err(ShapeError));
        let seven = encoded(&[7; PAGE_BYTES], &[0; PAGE_BYTES]);
        assert_eq!(
            Pages::from_parts(0, &[1, 0, 0, 0, 2, 0, 0, 0], seven.clone()),
            Err(ShapeError)
        );
        let mut trailing = seven.clone();
        trailing.push(0);
        assert_eq!(
            Pages::from_parts(0, &[1, 0, 0, 0], trailing),
            Err(ShapeError)
        );
        let one = Pages::from_parts(8192, &[3, 0, 0, 0], seven.clone()).unwrap();
        assert_eq!(one.indexes, vec![3]);
        assert_eq!(one.encodings(), Ok(vec![seven.as_slice()]));
    }

    #[test]
    fn a_page_is_its_differences_and_decodes_back() {
        let base: Vec<u8> = (0..PAGE_BYTES).map(|i| (i * 7 % 251) as u8).collect();
        assert_eq!(encoded(&base, &base), UNCHANGED_PAGE);
        assert!(!encode_xor(&base, &base, &mut Vec::new()));

        let mut page = base.clone();
        // Two changes 4 bytes apart share a run; one 5 apart starts another; the last byte.
        page[100] ^= 1;
        page[104] ^= 2;
        page[110] ^= 3;
        page[PAGE_BYTES - 1] ^= 4;
        let runs = encoded(&page, &base);
        assert_eq!(encoded_len(&runs), Some(runs.len()));
        assert_eq!(u16::from_le_bytes([runs[0], runs[1]]), 3);
        assert_eq!(&runs[2..6], &[100, 0, 5, 0]);
        assert_eq!(runs.len(), COUNT_BYTES + 3 * RUN_HEADER_BYTES + 5 + 1 + 1);

        let mut back = base.clone();
        xor_runs_into(&runs, &mut back);
        assert_eq!(back, page);
        let mut xor = vec![0; PAGE_BYTES];
        xor_runs_into(&runs, &mut xor);
        assert!(xor
            .iter()
            .zip(&page)
            .zip(&base)
            .all(|((x, p), b)| *x == p ^ b));
    }

    #[test]
    fn scattered_changes_round_trip_and_their_encoding_is_accepted() {
        // A fixed pseudo-random sequence (an LCG): changes of every length and spacing, at
        // block edges and page ends.
        let mut state: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = |bound: usize| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            (state >> 33) as usize % bound
        };
        let base: Vec<u8> = (0..PAGE_BYTES).map(|_| next(256) as u8).collect();
        for _ in 0..500 {
            let mut page = base.clone();
            for _ in 0..next(40) {
                let at = next(PAGE_BYTES);
                let end = (at + 1 + next(70)).min(PAGE_BYTES);
                page[at..end].iter_mut().for_each(|b| *b = next(256) as u8);
            }
            let runs = encoded(&page, &base);
            assert!(runs.len() <= MAX_ENCODED_PAGE_BYTES);
            assert_eq!(encoded_len(&runs), Some(runs.len()));
            let mut back = base.clone();
            xor_runs_into(&runs, &mut back);
            assert_eq!(back, page);
        }
    }

    #[test]
    fn the_longest_encoding_fits_its_bound() {
        // A change every fifth byte: every run is one byte, each a header apart.
        let base = vec![0; PAGE_BYTES];
        let page: Vec<u8> = (0..PAGE_BYTES).map(|i| u8::from(i % 5 == 0)).collect();
        let runs = encoded(&page, &base);
        assert!(runs.len() <= MAX_ENCODED_PAGE_BYTES, "{}", runs.len());
        let all = encoded(&[9; PAGE_BYTES], &base);
        assert!(all.len() <= MAX_ENCODED_PAGE_BYTES);
        assert_eq!(encoded_len(&all), Some(all.len()));
    }

    #[test]
    fn encodings_that_could_not_have_been_written_are_refused() {
        let run = |offset: u16, data: &[u8]| {
            let mut r = offset.to_le_bytes().to_vec();
            r.extend_from_slice(&(data.len() as u16).to_le_bytes());
            r.extend_from_slice(data);
            r
        };
        let page = |runs: &[Vec<u8>]| {
            let mut p = (runs.len() as u16).to_le_bytes().to_vec();
            runs.iter().for_each(|r| p.extend_from_slice(r));
            p
        };
        assert_eq!(encoded_len(&page(&[run(8, &[1, 0, 2])])), Some(9));
        assert_eq!(encoded_len(&page(&[run(8, &[1]), run(13, &[1])])), Some(12));
        for bad in [
            vec![1],                              // a count cut short
            page(&[run(8, &[])]),                 // an empty run
            page(&[run(8, &[0, 1])]),             // a run starting with zero
            page(&[run(8, &[1, 0])]),             // a run ending with zero
            page(&[run(8, &[1, 0, 0, 0, 0, 1])]), // two runs written as one
            page(&[run(4095, &[1, 1])]),          // past the page's end
            page(&[run(8, &[1]), run(12, &[1])]), // two runs less than a header apart
            page(&[run(20, &[1]), run(8, &[1])]), // out of order
            page(&[run(8, &[1])])[..6].to_vec(),  // data cut short
            (2u16).to_le_bytes().to_vec(),        // runs announced, none there
        ] {
            assert_eq!(encoded_len(&bad), None, "{bad:?}");
        }
    }
}
