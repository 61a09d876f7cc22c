//! The checkpoint file: one [`Checkpoint`] sealed for one sandbox, so that the shared state
//! directory can hold it although other replicas, possibly compromised, can write there.
//!
//! **Threat.** A forged or altered checkpoint must never be loaded: its pages would run the
//! writer's Python inside the victim's sandbox. Reading one must never reveal the sandbox's
//! memory. Digests of the build and the zygote catch accidents only; anyone can compute them.
//!
//! **Key.** Every sandbox has a secret handle (`sbx_` + 128 random bits, [`crate::sandbox::handle`])
//! that only its clients and the replica serving it know; the state directory names the
//! sandbox by the handle's SHA-256 and never holds the handle. The file is sealed with an AEAD
//! (XChaCha20-Poly1305) under a key derived from the handle ([`SealKey::for_handle`],
//! HKDF-SHA-256), so a replica that never saw the handle can neither read the file nor write
//! one that opens. (This departs from the per-deployment HMAC sketched in
//! docs/checkpoint-research.md §7: a key per sandbox also keeps one sandbox's file from being
//! moved under another's name, and encryption keeps the memory secret from the directory.)
//!
//! **Layout**, little-endian; the whole fixed-size header is the AEAD's associated data, so no
//! field of it can be altered:
//!
//! ```text
//! offset  bytes  field
//!      0      8  magic "MRPCKPT1"
//!      8      4  format version (u32) = 2
//!     12     32  binary digest: the build that wrote it
//!     44     32  zygote id (ZygoteId)
//!     76      8  generation (u64)
//!     84      8  memory size in bytes (u64)
//!     92      4  page count (u32)
//!     96     24  nonce (random)
//!    120    ...  AEAD(key, nonce, aad = bytes 0..120,
//!                     zstd(page indexes as u32 ++ pages, each a page encoding of
//!                          `crate::protocol::pages`)) ++ 16-byte tag
//! ```
//!
//! **Refused whole.** [`open`] checks the header (magic, version, digests, sizes against the
//! reader's bounds) before decrypting or decompressing anything, then the seal, then the body
//! (decompressed into a buffer no larger than the header's page count allows, one page
//! encoding per index, indexes strictly increasing and in range); the first failure refuses the file, and [`Refused`] names the
//! check without echoing anything of the file.

use super::{check_memory_bytes, Checkpoint, ZygoteId, PAGE_BYTES};
use crate::protocol::pages::{Pages, MAX_ENCODED_PAGE_BYTES};
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use hkdf::Hkdf;
use sha2::Sha256;
use std::fmt;

/// The first bytes of every checkpoint file.
pub const MAGIC: [u8; 8] = *b"MRPCKPT1";

/// The format this build writes and reads (2: pages as encodings, where 1 had whole pages).
pub const FORMAT_VERSION: u32 = 2;

/// Bytes of the AEAD's nonce (XChaCha20: 192 bits, random per file).
pub const NONCE_BYTES: usize = 24;

/// Bytes of the AEAD's tag, at the end of the ciphertext.
pub const TAG_BYTES: usize = 16;

/// Bytes of the fixed-size header, everything before the ciphertext (all of it is the AEAD's
/// associated data).
pub const HEADER_BYTES: usize = 8 + 4 + 32 + 32 + 8 + 8 + 4 + NONCE_BYTES;

/// zstd level of the body (the fastest: a checkpoint is written after calls).
const ZSTD_LEVEL: i32 = 1;

/// HKDF salt and info of [`SealKey::for_handle`]: change `INFO` with the key's use.
const KEY_SALT: &[u8] = b"mcp-run-python checkpoint";
const KEY_INFO: &[u8] = b"seal v1";

// Offsets of the header's fields.
const VERSION_AT: usize = 8;
const BINARY_AT: usize = 12;
const ZYGOTE_AT: usize = 44;
const GENERATION_AT: usize = 76;
const MEMORY_AT: usize = 84;
const COUNT_AT: usize = 92;
const NONCE_AT: usize = 96;

const _: () = assert!(NONCE_AT + NONCE_BYTES == HEADER_BYTES);

/// Bytes of one page index in the body.
const INDEX_BYTES: usize = 4;

/// The key a sandbox's checkpoints are sealed with, derived from its handle. Its `Debug` shows
/// no key bytes.
#[derive(Clone)]
pub struct SealKey([u8; 32]);

impl fmt::Debug for SealKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SealKey(…)")
    }
}

impl SealKey {
    /// The key of the sandbox whose handle is `handle` (the full handle as clients hold it,
    /// `sbx_…`): HKDF-SHA-256 with salt `"mcp-run-python checkpoint"`, the handle's bytes as
    /// input key material, and info `"seal v1"`. Deterministic: every replica that holds the
    /// handle derives the same key; nothing else can.
    pub fn for_handle(handle: &str) -> SealKey {
        let hkdf = Hkdf::<Sha256>::new(Some(KEY_SALT), handle.as_bytes());
        let mut key = [0u8; 32];
        hkdf.expand(KEY_INFO, &mut key)
            .expect("32 bytes is a valid HKDF-SHA-256 output length");
        SealKey(key)
    }

    fn cipher(&self) -> XChaCha20Poly1305 {
        XChaCha20Poly1305::new(&self.0.into())
    }
}

/// What the reader requires of a file besides its seal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected {
    /// This build's digest: the file's must be equal.
    pub binary: [u8; 32],
    /// The zygote the checkpoint must have been taken from; `None` accepts any (the caller
    /// then checks [`Checkpoint::zygote`] itself).
    pub zygote: Option<ZygoteId>,
    /// Largest linear memory accepted, in bytes.
    pub max_memory_bytes: u64,
    /// Most bytes of pages accepted (page count × [`PAGE_BYTES`], decompressed).
    pub max_stored_bytes: u64,
}

/// Why a checkpoint could not be sealed (none of these depends on the checkpoint's content).
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// The operating system's random source failed, so no nonce could be drawn.
    #[error("could not draw a checkpoint's nonce from the operating system's random source")]
    Random(#[source] getrandom::Error),
    /// zstd failed to compress the pages.
    #[error("could not compress a checkpoint's pages")]
    Compress(#[source] std::io::Error),
    /// The AEAD refused to encrypt (only for bodies beyond its limit of 256 GiB).
    #[error("could not encrypt a checkpoint")]
    Encrypt,
}

/// Why a checkpoint file was refused. The whole file is refused on the first failed check.
/// The words name the check only, never a byte of the file: they are safe to log and to show
/// to a model.
#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone, Copy)]
pub enum Refused {
    #[error("it is too short to be a checkpoint")]
    TooShort,
    #[error("it is not a checkpoint")]
    Magic,
    #[error("it is in a checkpoint format this build does not read")]
    Version,
    #[error("it was made by another build of mcp-run-python")]
    Binary,
    #[error("it was made from another zygote")]
    Zygote,
    #[error("its sizes are malformed")]
    Header,
    #[error("it is larger than allowed")]
    TooLarge,
    #[error("it is damaged, or was not written for this sandbox")]
    Sealed,
    #[error("its pages do not check out")]
    Body,
}

/// The header's fields, before the nonce.
#[derive(Debug, Clone, Copy)]
struct Header {
    binary: [u8; 32],
    zygote: ZygoteId,
    generation: u64,
    memory_bytes: u64,
    page_count: u32,
}

impl Header {
    /// The header's bytes, version and magic included, with `nonce`.
    fn encode(&self, nonce: &[u8; NONCE_BYTES]) -> [u8; HEADER_BYTES] {
        let mut out = [0u8; HEADER_BYTES];
        out[..VERSION_AT].copy_from_slice(&MAGIC);
        out[VERSION_AT..BINARY_AT].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        out[BINARY_AT..ZYGOTE_AT].copy_from_slice(&self.binary);
        out[ZYGOTE_AT..GENERATION_AT].copy_from_slice(&self.zygote.0);
        out[GENERATION_AT..MEMORY_AT].copy_from_slice(&self.generation.to_le_bytes());
        out[MEMORY_AT..COUNT_AT].copy_from_slice(&self.memory_bytes.to_le_bytes());
        out[COUNT_AT..NONCE_AT].copy_from_slice(&self.page_count.to_le_bytes());
        out[NONCE_AT..].copy_from_slice(nonce);
        out
    }
}

/// `N` bytes of `header` from `at` (the offsets are constants within [`HEADER_BYTES`]).
fn field<const N: usize>(header: &[u8; HEADER_BYTES], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&header[at..at + N]);
    out
}

/// What the seal authenticates besides the body: the whole header, then `bound` (bytes kept
/// outside the file, see [`seal`]).
fn associated_data(head: &[u8; HEADER_BYTES], bound: &[u8]) -> Vec<u8> {
    [head.as_slice(), bound].concat()
}

/// The file of `checkpoint`, sealed with `key` (the sandbox's, [`SealKey::for_handle`]),
/// stamped with the writer's `generation` (the state directory's fence) and `binary` digest.
/// The seal also covers `bound`, bytes kept elsewhere (the packages a restore installs first,
/// and the link to the file before it in a chain: `super::file`): [`open`] refuses the file
/// unless given the same bytes.
///
/// Errors: [`SealError`] when the random source, zstd or the AEAD fails.
pub fn seal(
    checkpoint: &Checkpoint,
    generation: u64,
    binary: &[u8; 32],
    key: &SealKey,
    bound: &[u8],
) -> Result<Vec<u8>, SealError> {
    let memory = (checkpoint.zygote(), checkpoint.memory_bytes());
    seal_pages(memory, checkpoint.pages(), generation, binary, key, bound)
}

/// [`seal`] for any pages of the memory of `(zygote, memory bytes)`: a whole checkpoint's, or a
/// delta's (whose pages may have no runs: equal to the zygote's again). `pages` yields indexes
/// in increasing order, each with its page encoding.
///
/// Errors: [`SealError`] when the random source, zstd or the AEAD fails.
pub fn seal_pages<'a>(
    (zygote, memory_bytes): (ZygoteId, u64),
    pages: impl ExactSizeIterator<Item = (u32, &'a [u8])> + Clone,
    generation: u64,
    binary: &[u8; 32],
    key: &SealKey,
    bound: &[u8],
) -> Result<Vec<u8>, SealError> {
    let count = pages.len();
    let encoded: usize = pages.clone().map(|(_, page)| page.len()).sum();
    let mut body = Vec::with_capacity(count * INDEX_BYTES + encoded);
    for (index, _) in pages.clone() {
        body.extend_from_slice(&index.to_le_bytes());
    }
    for (_, page) in pages {
        body.extend_from_slice(page);
    }
    let compressed = zstd::bulk::compress(&body, ZSTD_LEVEL).map_err(SealError::Compress)?;
    let header = Header {
        binary: *binary,
        zygote,
        generation,
        memory_bytes,
        // Pages of a linear memory lie below 4 GiB / PAGE_BYTES = 2^20: the count fits.
        page_count: u32::try_from(count).expect("a memory holds at most 2^20 pages"),
    };
    seal_compressed(&header, &compressed, key, bound)
}

/// Seals an already compressed body under `header`: [`seal`]'s last step, and the tests' way
/// to seal bodies [`seal`] would never write.
fn seal_compressed(
    header: &Header,
    compressed: &[u8],
    key: &SealKey,
    bound: &[u8],
) -> Result<Vec<u8>, SealError> {
    let mut nonce = [0u8; NONCE_BYTES];
    getrandom::fill(&mut nonce).map_err(SealError::Random)?;
    let head = header.encode(&nonce);
    let aad = associated_data(&head, bound);
    let ciphertext = key
        .cipher()
        .encrypt(
            XNonce::from_slice(&nonce),
            Payload {
                msg: compressed,
                aad: &aad,
            },
        )
        .map_err(|_| SealError::Encrypt)?;
    let mut file = Vec::with_capacity(HEADER_BYTES + ciphertext.len());
    file.extend_from_slice(&head);
    file.extend_from_slice(&ciphertext);
    Ok(file)
}

/// The generation and checkpoint sealed in `file`, if it is a file [`seal`] wrote with `key`
/// and it meets `expected`.
///
/// Checks, in order, each refusing the whole file: those of [`open_pages`]; then the body
/// ([`Refused::Body`]: its indexes must be strictly increasing, in range, and name no page
/// equal to the zygote's).
pub fn open(
    file: &[u8],
    key: &SealKey,
    expected: &Expected,
    bound: &[u8],
) -> Result<(u64, Checkpoint), Refused> {
    let (generation, zygote, pages) = open_pages(file, key, expected, bound)?;
    let mut checkpoint =
        Checkpoint::new(zygote, pages.memory_bytes).map_err(|_| Refused::Header)?;
    checkpoint
        .merge(pages.memory_bytes, &pages.indexes, &pages.bytes)
        .map_err(|_| Refused::Body)?;
    // `seal` never writes a page equal to the zygote's (merge dropped it): one means another
    // writer.
    if checkpoint.page_count() != pages.indexes.len() {
        return Err(Refused::Body);
    }
    Ok((generation, checkpoint))
}

/// The generation, zygote and pages sealed in `file`, if it is a file [`seal`] or
/// [`seal_pages`] wrote with `key` and it meets `expected`. The pages' indexes are not checked
/// here: merging them ([`Checkpoint::merge`]) does, whole, before it changes anything.
///
/// Checks, in order, each refusing the whole file: length ([`Refused::TooShort`]), magic
/// ([`Refused::Magic`]), format version ([`Refused::Version`]), binary digest
/// ([`Refused::Binary`]), zygote when `expected.zygote` is set ([`Refused::Zygote`]); the
/// memory size (a valid linear memory size, else [`Refused::Header`]; at most
/// `expected.max_memory_bytes`, else [`Refused::TooLarge`]) and the page count (its pages fit in
/// the memory, else [`Refused::Header`]; at most `expected.max_stored_bytes`, and a ciphertext
/// no longer than zstd's bound for that body, else [`Refused::TooLarge`]), all before anything
/// is decrypted or allocated; then the seal ([`Refused::Sealed`]: altered, truncated, or sealed
/// with another key or `bound`); then the body ([`Refused::Body`]: it must decompress within
/// what the page count allows, without ever allocating more, into the page count's indexes and
/// exactly one page encoding each).
pub fn open_pages(
    file: &[u8],
    key: &SealKey,
    expected: &Expected,
    bound: &[u8],
) -> Result<(u64, ZygoteId, Pages), Refused> {
    let (head, ciphertext) = file
        .split_first_chunk::<HEADER_BYTES>()
        .ok_or(Refused::TooShort)?;
    let header = check_header(head, ciphertext, expected)?;
    let nonce: [u8; NONCE_BYTES] = field(head, NONCE_AT);
    // At most 2^20 pages (4 GiB of memory), so this fits a 64-bit usize; refuse elsewhere.
    let body_bytes = usize::try_from(
        u64::from(header.page_count) * (INDEX_BYTES + MAX_ENCODED_PAGE_BYTES) as u64,
    )
    .map_err(|_| Refused::TooLarge)?;
    if ciphertext.len() - TAG_BYTES > zstd::zstd_safe::compress_bound(body_bytes) {
        return Err(Refused::TooLarge);
    }
    let compressed = key
        .cipher()
        .decrypt(
            XNonce::from_slice(&nonce),
            Payload {
                msg: ciphertext,
                aad: &associated_data(head, bound),
            },
        )
        .map_err(|_| Refused::Sealed)?;
    // Into a buffer no larger than the page count allows: a body that would decompress to more
    // fails there, one that is not the count's indexes and encodings fails `from_parts`.
    let mut body = zstd::bulk::decompress(&compressed, body_bytes).map_err(|_| Refused::Body)?;
    let index_bytes = header.page_count as usize * INDEX_BYTES;
    if body.len() < index_bytes {
        return Err(Refused::Body);
    }
    let bytes = body.split_off(index_bytes);
    let pages = Pages::from_parts(header.memory_bytes, &body, bytes).map_err(|_| Refused::Body)?;
    Ok((header.generation, header.zygote, pages))
}

/// The header `head` of a file whose ciphertext is `ciphertext`, checked against `expected`
/// in [`open_pages`]'s order, up to the seal (which it does not check).
fn check_header(
    head: &[u8; HEADER_BYTES],
    ciphertext: &[u8],
    expected: &Expected,
) -> Result<Header, Refused> {
    if ciphertext.len() < TAG_BYTES {
        return Err(Refused::TooShort);
    }
    if field::<8>(head, 0) != MAGIC {
        return Err(Refused::Magic);
    }
    if u32::from_le_bytes(field(head, VERSION_AT)) != FORMAT_VERSION {
        return Err(Refused::Version);
    }
    if field::<32>(head, BINARY_AT) != expected.binary {
        return Err(Refused::Binary);
    }
    let zygote = ZygoteId(field(head, ZYGOTE_AT));
    if expected.zygote.is_some_and(|z| z != zygote) {
        return Err(Refused::Zygote);
    }
    let header = Header {
        binary: expected.binary,
        zygote,
        generation: u64::from_le_bytes(field(head, GENERATION_AT)),
        memory_bytes: u64::from_le_bytes(field(head, MEMORY_AT)),
        page_count: u32::from_le_bytes(field(head, COUNT_AT)),
    };
    // Sizes, before a byte is decrypted or allocated.
    check_memory_bytes(header.memory_bytes).map_err(|_| Refused::Header)?;
    if header.memory_bytes > expected.max_memory_bytes {
        return Err(Refused::TooLarge);
    }
    let stored_bytes = u64::from(header.page_count) * PAGE_BYTES as u64;
    if stored_bytes > header.memory_bytes {
        return Err(Refused::Header);
    }
    if stored_bytes > expected.max_stored_bytes {
        return Err(Refused::TooLarge);
    }
    Ok(header)
}

#[cfg(test)]
mod tests {
    use super::super::{MAX_MEMORY_BYTES, WASM_PAGE_BYTES};
    use super::*;
    use crate::protocol::pages::encode_whole_pages;

    const MIB: u64 = 1 << 20;
    /// The most a body of one page may take: its index and its longest encoding.
    const ONE_PAGE_BODY: usize = INDEX_BYTES + MAX_ENCODED_PAGE_BYTES;
    const HANDLE: &str = "sbx_AAAAAAAAAAAAAAAAAAAAAA";
    const BINARY: [u8; 32] = [0xb1; 32];
    const ZYGOTE: ZygoteId = ZygoteId([0x2e; 32]);

    fn key() -> SealKey {
        SealKey::for_handle(HANDLE)
    }

    fn expected() -> Expected {
        Expected {
            binary: BINARY,
            zygote: Some(ZYGOTE),
            max_memory_bytes: MAX_MEMORY_BYTES,
            max_stored_bytes: 64 * MIB,
        }
    }

    /// A checkpoint of `memory` bytes with pages at `indexes`, each filled with a pattern.
    fn checkpoint(memory: u64, indexes: &[u32]) -> Checkpoint {
        let mut bytes = Vec::new();
        for &i in indexes {
            bytes.extend((0..PAGE_BYTES).map(|j| (j as u32 ^ i.wrapping_mul(31)) as u8 | 1));
        }
        let mut c = Checkpoint::new(ZYGOTE, memory).unwrap();
        c.merge(memory, indexes, &encode_whole_pages(&bytes))
            .unwrap();
        c
    }

    fn header(memory_bytes: u64, page_count: u32) -> Header {
        Header {
            binary: BINARY,
            zygote: ZYGOTE,
            generation: 3,
            memory_bytes,
            page_count,
        }
    }

    /// A file whose body is `body` (indexes ++ pages, not compressed), sealed with the right
    /// key under a header of `memory_bytes` and `page_count`: what only a holder of the handle
    /// could write.
    fn sealed_body(memory_bytes: u64, page_count: u32, body: &[u8]) -> Vec<u8> {
        let compressed = zstd::bulk::compress(body, 1).unwrap();
        seal_compressed(&header(memory_bytes, page_count), &compressed, &key(), &[]).unwrap()
    }

    /// The encoding of a page of `fill` bytes (against zeros).
    fn page(fill: u8) -> Vec<u8> {
        encode_whole_pages(&[fill; PAGE_BYTES])
    }

    #[test]
    fn header_offsets() {
        assert_eq!(HEADER_BYTES, 120);
        let head = header(2 * MIB, 5).encode(&[0x99; NONCE_BYTES]);
        assert_eq!(&head[..8], b"MRPCKPT1");
        assert_eq!(&head[8..12], &FORMAT_VERSION.to_le_bytes());
        assert_eq!(&head[12..44], &BINARY);
        assert_eq!(&head[44..76], &ZYGOTE.0);
        assert_eq!(&head[76..84], &3u64.to_le_bytes());
        assert_eq!(&head[84..92], &(2 * MIB).to_le_bytes());
        assert_eq!(&head[92..96], &5u32.to_le_bytes());
        assert_eq!(&head[96..120], &[0x99; NONCE_BYTES]);
    }

    #[test]
    fn round_trip() {
        for c in [
            checkpoint(MIB, &[]),
            checkpoint(MIB, &[0]),
            checkpoint(30 * MIB, &[1, 2, 3, 900, 7679]),
        ] {
            let file = seal(&c, 42, &BINARY, &key(), &[]).unwrap();
            let (generation, back) = open(&file, &key(), &expected(), &[]).unwrap();
            assert_eq!(generation, 42);
            assert_eq!(back, c);
            // Any zygote accepted when none is expected.
            let any = Expected {
                zygote: None,
                ..expected()
            };
            assert_eq!(open(&file, &key(), &any, &[]).unwrap().1, c);
        }
    }

    #[test]
    fn the_body_is_encrypted_and_the_nonce_fresh() {
        let mut c = Checkpoint::new(ZYGOTE, MIB).unwrap();
        let secret: Vec<u8> = b"the sandbox's secret "
            .iter()
            .copied()
            .cycle()
            .take(PAGE_BYTES)
            .collect();
        c.merge(MIB, &[4], &encode_whole_pages(&secret)).unwrap();
        let a = seal(&c, 1, &BINARY, &key(), &[]).unwrap();
        let b = seal(&c, 1, &BINARY, &key(), &[]).unwrap();
        assert_ne!(a[NONCE_AT..HEADER_BYTES], b[NONCE_AT..HEADER_BYTES]);
        assert_ne!(a[HEADER_BYTES..], b[HEADER_BYTES..]);
        for file in [a, b] {
            assert!(!file.windows(6).any(|w| w == b"secret"));
            assert!(!file.windows(6).any(|w| w == b"sandbo"));
        }
    }

    #[test]
    fn every_single_byte_flip_is_refused() {
        let c = checkpoint(MIB, &[3, 200]);
        let file = seal(&c, 7, &BINARY, &key(), &[]).unwrap();
        assert!(file.len() > HEADER_BYTES + TAG_BYTES);
        let any_zygote = Expected {
            zygote: None,
            ..expected()
        };
        for at in 0..file.len() {
            for mask in [0x01u8, 0x80, 0xff] {
                let mut bad = file.clone();
                bad[at] ^= mask;
                for want in [expected(), any_zygote] {
                    assert!(
                        open(&bad, &key(), &want, &[]).is_err(),
                        "a flip of {mask:#x} at byte {at} was accepted"
                    );
                }
            }
        }
        // Flips behind the header reach the seal.
        let mut bad = file.clone();
        bad[HEADER_BYTES] ^= 1;
        assert_eq!(open(&bad, &key(), &expected(), &[]), Err(Refused::Sealed));
        let mut bad = file.clone();
        bad[NONCE_AT] ^= 1;
        assert_eq!(open(&bad, &key(), &expected(), &[]), Err(Refused::Sealed));
        let mut bad = file.clone();
        bad[GENERATION_AT] ^= 1;
        assert_eq!(open(&bad, &key(), &expected(), &[]), Err(Refused::Sealed));
    }

    #[test]
    fn every_truncation_and_extension_is_refused() {
        let file = seal(&checkpoint(MIB, &[3, 200]), 7, &BINARY, &key(), &[]).unwrap();
        for len in 0..file.len() {
            let got = open(&file[..len], &key(), &expected(), &[]);
            assert!(got.is_err(), "{len} bytes were accepted");
            if len < HEADER_BYTES + TAG_BYTES {
                assert_eq!(got, Err(Refused::TooShort));
            }
        }
        let mut longer = file.clone();
        longer.push(0);
        assert_eq!(
            open(&longer, &key(), &expected(), &[]),
            Err(Refused::Sealed)
        );
    }

    #[test]
    fn another_handles_key_is_refused() {
        let file = seal(&checkpoint(MIB, &[3]), 7, &BINARY, &key(), &[]).unwrap();
        let other = SealKey::for_handle("sbx_AAAAAAAAAAAAAAAAAAAAAB");
        assert_eq!(open(&file, &other, &expected(), &[]), Err(Refused::Sealed));
        assert_ne!(SealKey::for_handle(HANDLE).0, other.0);
        assert_eq!(SealKey::for_handle(HANDLE).0, key().0);
        assert_eq!(format!("{:?}", key()), "SealKey(…)");
    }

    #[test]
    fn other_binary_or_zygote_or_format_is_refused() {
        let file = seal(&checkpoint(MIB, &[3]), 7, &BINARY, &key(), &[]).unwrap();
        let other_binary = Expected {
            binary: [0; 32],
            ..expected()
        };
        assert_eq!(
            open(&file, &key(), &other_binary, &[]),
            Err(Refused::Binary)
        );
        let other_zygote = Expected {
            zygote: Some(ZygoteId([0; 32])),
            ..expected()
        };
        assert_eq!(
            open(&file, &key(), &other_zygote, &[]),
            Err(Refused::Zygote)
        );

        let mut bad = file.clone();
        bad[0] = b'X';
        assert_eq!(open(&bad, &key(), &expected(), &[]), Err(Refused::Magic));
        let mut bad = file.clone();
        for other in [1u32, FORMAT_VERSION + 1] {
            bad[VERSION_AT..BINARY_AT].copy_from_slice(&other.to_le_bytes());
            assert_eq!(open(&bad, &key(), &expected(), &[]), Err(Refused::Version));
        }
    }

    #[test]
    fn the_readers_bounds_apply() {
        let c = checkpoint(4 * MIB, &[1, 2, 3]);
        let file = seal(&c, 7, &BINARY, &key(), &[]).unwrap();
        let small_memory = Expected {
            max_memory_bytes: 2 * MIB,
            ..expected()
        };
        assert_eq!(
            open(&file, &key(), &small_memory, &[]),
            Err(Refused::TooLarge)
        );
        let few_pages = Expected {
            max_stored_bytes: 2 * PAGE_BYTES as u64,
            ..expected()
        };
        assert_eq!(open(&file, &key(), &few_pages, &[]), Err(Refused::TooLarge));
        let just_enough = Expected {
            max_memory_bytes: 4 * MIB,
            max_stored_bytes: 3 * PAGE_BYTES as u64,
            ..expected()
        };
        assert_eq!(open(&file, &key(), &just_enough, &[]).unwrap().1, c);
    }

    #[test]
    fn huge_sizes_are_refused_before_decrypting() {
        // A tiny file (random ciphertext: no key) whose header announces everything: each is
        // refused by its sizes, not by the seal, so nothing of the announced size was made.
        let craft = |memory_bytes: u64, page_count: u32| {
            let mut file = header(memory_bytes, page_count)
                .encode(&[0; NONCE_BYTES])
                .to_vec();
            file.extend_from_slice(&[0x5a; 64]);
            file
        };
        let generous = Expected {
            max_stored_bytes: MAX_MEMORY_BYTES,
            ..expected()
        };
        let small_memory = Expected {
            max_memory_bytes: 64 * MIB,
            ..expected()
        };
        let cases = [
            (u64::MAX, 1, expected(), Refused::Header),
            (0, 0, expected(), Refused::Header),
            (
                MAX_MEMORY_BYTES + WASM_PAGE_BYTES,
                0,
                expected(),
                Refused::Header,
            ),
            (MIB + 1, 0, expected(), Refused::Header),
            (MIB, u32::MAX, expected(), Refused::Header),
            (MIB, (MIB / 4096) as u32 + 1, expected(), Refused::Header),
            // More memory, or more pages, than the reader keeps.
            (MAX_MEMORY_BYTES, 1, small_memory, Refused::TooLarge),
            (MAX_MEMORY_BYTES, 1 << 20, expected(), Refused::TooLarge),
            // 4 GiB of pages announced and allowed: the seal refuses it, before decompressing.
            (MAX_MEMORY_BYTES, 1 << 20, generous, Refused::Sealed),
        ];
        for (memory, count, bounds, want) in cases {
            assert_eq!(open(&craft(memory, count), &key(), &bounds, &[]), Err(want));
        }
        // A ciphertext longer than any body of the announced size could compress to.
        let mut file = header(MIB, 1).encode(&[0; NONCE_BYTES]).to_vec();
        file.extend(vec![
            0;
            zstd::zstd_safe::compress_bound(ONE_PAGE_BODY)
                + TAG_BYTES
                + 1
        ]);
        assert_eq!(
            open(&file, &key(), &expected(), &[]),
            Err(Refused::TooLarge)
        );
    }

    #[test]
    fn sealed_but_malformed_bodies_are_refused() {
        let indexes =
            |list: &[u32]| -> Vec<u8> { list.iter().flat_map(|i| i.to_le_bytes()).collect() };
        let body = |list: &[u32], fills: &[u8]| -> Vec<u8> {
            let mut b = indexes(list);
            for &f in fills {
                b.extend(page(f));
            }
            b
        };
        // The sealing path works for a well-formed body.
        let good = sealed_body(MIB, 2, &body(&[3, 4], &[1, 2]));
        assert_eq!(
            open(&good, &key(), &expected(), &[])
                .unwrap()
                .1
                .page_count(),
            2
        );

        let cases: Vec<(u32, Vec<u8>)> = vec![
            // Unsorted, repeated, beyond the memory.
            (2, body(&[4, 3], &[1, 2])),
            (2, body(&[3, 3], &[1, 2])),
            (2, body(&[3, 256], &[1, 2])),
            // A page equal to the zygote's (seal never writes one).
            (2, body(&[3, 4], &[1, 0])),
            // Shorter and longer than announced.
            (2, body(&[3, 4], &[1])),
            (1, body(&[3], &[1, 1])),
            (0, vec![0]),
        ];
        for (count, plain) in cases {
            let file = sealed_body(MIB, count, &plain);
            assert_eq!(open(&file, &key(), &expected(), &[]), Err(Refused::Body));
        }

        // Not zstd at all.
        let file = seal_compressed(&header(MIB, 1), b"not zstd", &key(), &[]).unwrap();
        assert_eq!(open(&file, &key(), &expected(), &[]), Err(Refused::Body));

        // A bomb: 1 page announced, 32 MiB of zeros inside (about 1 KiB compressed); refused
        // without being decompressed past what 1 page may take.
        let bomb = zstd::bulk::compress(&vec![0u8; 32 << 20], 1).unwrap();
        assert!(bomb.len() < zstd::zstd_safe::compress_bound(ONE_PAGE_BODY));
        let file = seal_compressed(&header(MIB, 1), &bomb, &key(), &[]).unwrap();
        assert_eq!(open(&file, &key(), &expected(), &[]), Err(Refused::Body));
    }

    #[test]
    fn refusals_echo_nothing_of_the_file() {
        let all = [
            Refused::TooShort,
            Refused::Magic,
            Refused::Version,
            Refused::Binary,
            Refused::Zygote,
            Refused::Header,
            Refused::TooLarge,
            Refused::Sealed,
            Refused::Body,
        ];
        // Files made of words, refused at every step: no word reaches the message.
        let words = b"EVILWORDS-";
        let wordy = |len: usize| -> Vec<u8> { words.iter().copied().cycle().take(len).collect() };
        let mut files = vec![wordy(10), wordy(400)];
        let mut f = wordy(400);
        f[..8].copy_from_slice(&MAGIC);
        files.push(f.clone());
        f[VERSION_AT..BINARY_AT].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        files.push(f.clone());
        f[BINARY_AT..ZYGOTE_AT].copy_from_slice(&BINARY);
        files.push(f.clone());
        f[ZYGOTE_AT..GENERATION_AT].copy_from_slice(&ZYGOTE.0);
        files.push(f.clone());
        f[MEMORY_AT..COUNT_AT].copy_from_slice(&MIB.to_le_bytes());
        f[COUNT_AT..NONCE_AT].copy_from_slice(&1u32.to_le_bytes());
        files.push(f.clone());
        let mut seen = Vec::new();
        for file in &files {
            let refused = open(file, &key(), &expected(), &[]).unwrap_err();
            seen.push(refused);
            let text = format!("{refused} {refused:?}");
            for w in ["EVIL", "WORDS", "VILW", "ORDS-", "5249"] {
                assert!(!text.contains(w), "{text}");
            }
        }
        assert_eq!(
            seen,
            [
                Refused::TooShort,
                Refused::Magic,
                Refused::Version,
                Refused::Binary,
                Refused::Zygote,
                Refused::Header,
                Refused::Sealed
            ]
        );
        for refused in all {
            let text = refused.to_string();
            assert!(text.starts_with("it"), "{text}");
            assert!(text.len() < 60 && text.is_ascii(), "{text}");
        }
    }
}
