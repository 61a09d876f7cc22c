//! Pages of linear memory as both sides of the worker protocol carry them: a checkpoint's
//! pages in a reply, a restore's in a request, and the id of the zygote they are relative to.
//! What the interpreter does with them (its pristine copy, its shadow) is in
//! `src/interpreter/linear_memory.rs`; the front keeps them as bytes (`src/sandbox/checkpoint/`).

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
/// The pages of a checkpoint: their indexes, in increasing order, and their bytes one after
/// another, each XOR-ed with the zygote's page (`PAGE_BYTES` each).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pages {
    /// Linear memory's size when taken (bytes; a multiple of 64 KiB).
    pub memory_bytes: u64,
    /// Page indexes, strictly increasing.
    pub indexes: Vec<u32>,
    /// `indexes.len() × PAGE_BYTES` bytes.
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

    /// Pages from attachment bytes: `indexes` as [`index_bytes`](Self::index_bytes) makes them.
    ///
    /// Errors: [`ShapeError`] when the lengths disagree or the indexes are not
    /// strictly increasing.
    pub fn from_parts(
        memory_bytes: u64,
        indexes: &[u8],
        bytes: Vec<u8>,
    ) -> Result<Pages, ShapeError> {
        if !indexes.len().is_multiple_of(4) || bytes.len() != indexes.len() / 4 * PAGE_BYTES {
            return Err(ShapeError);
        }
        let indexes: Vec<u32> = indexes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        if indexes.windows(2).any(|w| w[0] >= w[1]) {
            return Err(ShapeError);
        }
        Ok(Pages {
            memory_bytes,
            indexes,
            bytes,
        })
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

    #[test]
    fn pages_of_the_wrong_shape_are_refused() {
        assert_eq!(Pages::from_parts(0, &[1, 0, 0], vec![]), Err(ShapeError));
        assert_eq!(
            Pages::from_parts(0, &[1, 0, 0, 0, 0, 0, 0, 0], vec![0; 2 * PAGE_BYTES]),
            Err(ShapeError)
        );
        let one = Pages::from_parts(8192, &[3, 0, 0, 0], vec![7; PAGE_BYTES]);
        assert_eq!(one.map(|p| p.indexes), Ok(vec![3]));
    }
}
