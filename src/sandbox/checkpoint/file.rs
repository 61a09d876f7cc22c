//! A sandbox's kept state ([`Kept`]) as files (checkpoints, docs/architecture.md §3.4): the state directory's chain
//! (`--state-dir`: a whole image, then one delta per call) and a hibernated sandbox's file
//! (a chain of one). Each file holds the packages a restore installs first, then the sealed
//! pages ([`super::sealed`]), whose seal also covers that package list and the digest of the
//! file before it in the chain, so that none of them can be altered, swapped, reordered or
//! spliced from another chain by whoever else writes the directory.
//!
//! ```text
//! u32 little-endian n, then n bytes of JSON: [["name", "version"], …] (at most MAX_LIST_BYTES)
//! the sealed pages (sealed::seal_pages with `bound` = those n bytes ++ the SHA-256 of the
//!   chain's previous file, or 32 zero bytes for its first)
//! ```
//!
//! The first file holds every page that differs from the zygote's ([`write()`]); each next one
//! the pages a call changed since the file before it ([`write_delta`]; a page equal to the
//! zygote's again is sent as zeros). A chain is written under one generation, and its last
//! file's package list is the state's. Read bounded, typed and checked whole
//! ([`read_chain`]): every list must parse and hold at most [`MAX_INSTALLED`] entries of plain
//! names and versions, every seal must open, and every delta must merge.

use super::sealed::{self, Expected, Refused, SealError, SealKey};
use super::Kept;
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;

/// Largest package list (bytes of JSON).
const MAX_LIST_BYTES: u32 = 64 << 10;

/// Most packages a kept state names.
pub const MAX_INSTALLED: usize = 1024;

/// Longest package name or version (characters).
const MAX_NAME_CHARS: usize = 128;

/// The link a chain's first file is sealed with: no file before it.
const NO_PREVIOUS: [u8; 32] = [0; 32];

/// The binary digest a checkpoint is stamped with: the runtime's fingerprint (the embedded
/// Pyodide, our JavaScript and Python, the crate version), hashed.
pub fn binary_digest() -> [u8; 32] {
    Sha256::digest(crate::assets::runtime_fingerprint().as_bytes()).into()
}

/// A chain file's SHA-256: what the next file's seal binds, and what the state directory's
/// record names.
pub fn digest(file: &[u8]) -> [u8; 32] {
    Sha256::digest(file).into()
}

/// The first file of a chain: all of `kept`, held under `generation`, sealed for the sandbox
/// of `handle`.
///
/// Errors: [`SealError`].
pub fn write(kept: &Kept, generation: u64, handle: &str) -> Result<Vec<u8>, SealError> {
    let list = package_list_bytes(&kept.installed);
    let bound = [list.as_slice(), &NO_PREVIOUS].concat();
    let key = SealKey::for_handle(handle);
    let sealed = sealed::seal(&kept.image, generation, &binary_digest(), &key, &bound)?;
    Ok(file_of(&list, &sealed))
}

/// A next file of a chain whose last file's digest is `previous`: the pages of `kept` at
/// `changed` (those changed since that file), held under `generation`, sealed for the
/// sandbox of `handle`.
///
/// Errors: [`SealError`].
pub fn write_delta(
    kept: &Kept,
    changed: &BTreeSet<u32>,
    generation: u64,
    handle: &str,
    previous: &[u8; 32],
) -> Result<Vec<u8>, SealError> {
    let list = package_list_bytes(&kept.installed);
    let bound = [list.as_slice(), previous].concat();
    let key = SealKey::for_handle(handle);
    let memory = (kept.image.zygote(), kept.image.memory_bytes());
    let pages = kept.image.pages_at(changed);
    let pages = pages.iter().copied();
    let sealed = sealed::seal_pages(memory, pages, generation, &binary_digest(), &key, &bound)?;
    Ok(file_of(&list, &sealed))
}

/// `installed` as a file's package list (JSON).
fn package_list_bytes(installed: &[(String, String)]) -> Vec<u8> {
    serde_json::to_vec(installed).unwrap_or_else(|_| b"[]".to_vec())
}

/// A file of `list` and `sealed` in the module's layout.
fn file_of(list: &[u8], sealed: &[u8]) -> Vec<u8> {
    let mut file = Vec::with_capacity(4 + list.len() + sealed.len());
    file.extend_from_slice(&(list.len() as u32).to_le_bytes());
    file.extend_from_slice(list);
    file.extend_from_slice(sealed);
    file
}

/// The kept state in a chain of one `file` ([`write()`]): see [`read_chain`].
///
/// Errors: [`Refused`], naming the check, echoing nothing of the file.
pub fn read(file: &[u8], handle: &str, max_memory_bytes: u64) -> Result<(u64, Kept), Refused> {
    read_chain(&[file], handle, max_memory_bytes)
}

/// The kept state in `files` (a chain, first file first), if each was written for the sandbox
/// of `handle` by this build, in this order, under one generation, and the memory fits
/// `max_memory_bytes`; the generation comes with it.
///
/// Errors: [`Refused`], naming the check, echoing nothing of the files:
/// [`Refused::TooShort`] for an empty chain; a file's own refusal; [`Refused::Sealed`] for a
/// file sealed under another generation than the first's; [`Refused::Body`] for a page set
/// that does not merge (or a first file that names a page equal to the zygote's).
pub fn read_chain(
    files: &[impl AsRef<[u8]>],
    handle: &str,
    max_memory_bytes: u64,
) -> Result<(u64, Kept), Refused> {
    let key = SealKey::for_handle(handle);
    let expected = |zygote| Expected {
        binary: binary_digest(),
        zygote,
        max_memory_bytes,
        max_stored_bytes: max_memory_bytes,
    };
    let (first, rest) = files.split_first().ok_or(Refused::TooShort)?;
    let (list, sealed) = split_file(first.as_ref())?;
    let bound = [list, &NO_PREVIOUS].concat();
    let (generation, mut image) = sealed::open(sealed, &key, &expected(None), &bound)?;
    let mut installed = package_list(list)?;
    let mut previous = digest(first.as_ref());
    for file in rest {
        let (list, sealed) = split_file(file.as_ref())?;
        let bound = [list, &previous].concat();
        let want = expected(Some(image.zygote()));
        let (g, _, pages) = sealed::open_pages(sealed, &key, &want, &bound)?;
        if g != generation {
            return Err(Refused::Sealed);
        }
        image
            .merge(pages.memory_bytes, &pages.indexes, &pages.bytes)
            .map_err(|_| Refused::Body)?;
        installed = package_list(list)?;
        previous = digest(file.as_ref());
    }
    let kept = Kept {
        image,
        installed,
        reseed: false,
        written: None,
    };
    Ok((generation, kept))
}

/// A file's package list bytes and sealed pages, its list's length checked.
fn split_file(file: &[u8]) -> Result<(&[u8], &[u8]), Refused> {
    let (len, rest) = file.split_first_chunk::<4>().ok_or(Refused::TooShort)?;
    let len = u32::from_le_bytes(*len);
    if len > MAX_LIST_BYTES {
        return Err(Refused::TooLarge);
    }
    rest.split_at_checked(len as usize).ok_or(Refused::TooShort)
}

/// A file's package list: sealed with the pages, so written by this sandbox's replica; still
/// checked, as any input.
fn package_list(list: &[u8]) -> Result<Vec<(String, String)>, Refused> {
    let installed: Vec<(String, String)> =
        serde_json::from_slice(list).map_err(|_| Refused::Body)?;
    let plain = |s: &str| {
        !s.is_empty()
            && s.len() <= MAX_NAME_CHARS
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-+!".contains(c))
    };
    if installed.len() > MAX_INSTALLED || !installed.iter().all(|(n, v)| plain(n) && plain(v)) {
        return Err(Refused::Body);
    }
    Ok(installed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::pages::{encode_whole_pages, ZygoteId, PAGE_BYTES};
    use crate::sandbox::checkpoint::Checkpoint;

    const GIB: u64 = 1 << 30;

    fn kept() -> Kept {
        let mut image = Checkpoint::new(ZygoteId([3; 32]), 65536).expect("size");
        image
            .merge(65536, &[2], &encode_whole_pages(&[9; PAGE_BYTES]))
            .expect("fits");
        Kept {
            image,
            installed: vec![("humanize".into(), "4.9.0".into())],
            reseed: true,
            written: None,
        }
    }

    #[test]
    fn a_written_state_reads_back_for_its_handle_only() {
        let file = write(&kept(), 5, "sbx_a").expect("seals");
        let (generation, back) = read(&file, "sbx_a", 1 << 30).expect("opens");
        assert_eq!(generation, 5);
        assert_eq!(back.image, kept().image);
        assert_eq!(back.installed, kept().installed);
        assert!(!back.reseed, "a restore is not a fork");
        assert_eq!(read(&file, "sbx_b", 1 << 30).err(), Some(Refused::Sealed));
    }

    #[test]
    fn an_altered_package_list_is_refused_by_the_seal() {
        let file = write(&kept(), 5, "sbx_a").expect("seals");
        let text = String::from_utf8_lossy(&file);
        let at = text.find("humanize").expect("listed");
        let mut bad = file.clone();
        bad[at] = b'H';
        assert_eq!(read(&bad, "sbx_a", 1 << 30).err(), Some(Refused::Sealed));
        let mut long = file.clone();
        long[..4].copy_from_slice(&(MAX_LIST_BYTES + 1).to_le_bytes());
        assert_eq!(read(&long, "sbx_a", 1 << 30).err(), Some(Refused::TooLarge));
        for len in 0..8 {
            assert!(read(&file[..len], "sbx_a", 1 << 30).is_err());
        }
    }

    /// `kept` after a call that grew memory to two WebAssembly pages, changed page 20, and put
    /// page 2 back as the zygote's (its XOR all zeros); returns the pages that changed.
    fn after_a_call(kept: &mut Kept) -> BTreeSet<u32> {
        let mut pages = vec![0; PAGE_BYTES];
        pages.extend_from_slice(&[7; PAGE_BYTES]);
        kept.image
            .merge(131072, &[2, 20], &encode_whole_pages(&pages))
            .expect("fits");
        kept.installed.push(("attrs".into(), "25.1.0".into()));
        BTreeSet::from([2, 20])
    }

    #[test]
    fn a_chain_of_a_whole_image_and_deltas_reads_back_as_the_last_state() {
        let mut state = kept();
        let first = write(&state, 5, "sbx_a").expect("seals");
        let changed = after_a_call(&mut state);
        let second = write_delta(&state, &changed, 5, "sbx_a", &digest(&first)).expect("seals");
        state
            .image
            .merge(131072, &[21], &encode_whole_pages(&[1; PAGE_BYTES]))
            .expect("fits");
        let third = write_delta(&state, &BTreeSet::from([21]), 5, "sbx_a", &digest(&second))
            .expect("seals");
        let (generation, back) =
            read_chain(&[&first, &second, &third], "sbx_a", GIB).expect("opens");
        assert_eq!(generation, 5);
        assert_eq!(back.image, state.image);
        assert_eq!(back.image.page_count(), 2, "page 2 is the zygote's again");
        assert_eq!(back.installed, state.installed);
        // Any prefix is a state too; a chain cut short is the record's to catch (it names
        // every file).
        let (_, earlier) = read_chain(&[&first, &second], "sbx_a", GIB).expect("opens");
        assert_eq!(earlier.image.memory_bytes(), 131072);
    }

    #[test]
    fn a_chain_reordered_spliced_or_mixed_across_generations_is_refused() {
        let mut state = kept();
        let first = write(&state, 5, "sbx_a").expect("seals");
        let other_first = write(&state, 5, "sbx_a").expect("seals");
        let changed = after_a_call(&mut state);
        let delta = write_delta(&state, &changed, 5, "sbx_a", &digest(&first)).expect("seals");
        let other =
            write_delta(&state, &changed, 5, "sbx_a", &digest(&other_first)).expect("seals");
        let later = write_delta(&state, &changed, 6, "sbx_a", &digest(&first)).expect("seals");
        let sealed = Some(Refused::Sealed);
        // A delta of another chain of the same sandbox (same key, other link).
        assert_eq!(read_chain(&[&first, &other], "sbx_a", GIB).err(), sealed);
        // A delta first, or the first file twice.
        assert_eq!(read_chain(&[&delta, &first], "sbx_a", GIB).err(), sealed);
        assert_eq!(read_chain(&[&first, &first], "sbx_a", GIB).err(), sealed);
        // A delta written under another generation.
        assert_eq!(read_chain(&[&first, &later], "sbx_a", GIB).err(), sealed);
        // Another sandbox's key.
        assert_eq!(read_chain(&[&first, &delta], "sbx_b", GIB).err(), sealed);
        let none: [&[u8]; 0] = [];
        assert_eq!(
            read_chain(&none, "sbx_a", GIB).err(),
            Some(Refused::TooShort)
        );
    }
}
