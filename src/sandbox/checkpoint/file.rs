//! The state directory's `checkpoint.bin` (`--state-dir`, issue 36): a sandbox's kept state
//! ([`Kept`]) as one file: the packages a restore installs first, then the sealed checkpoint
//! ([`super::sealed`]), whose seal also covers that package list, so that neither can be
//! altered or swapped by whoever else writes the directory.
//!
//! ```text
//! u32 little-endian n, then n bytes of JSON: [["name", "version"], …] (at most MAX_LIST_BYTES)
//! the sealed checkpoint (sealed::seal with those n bytes as `bound`)
//! ```
//!
//! Read bounded, typed and checked whole: the list must parse, hold at most
//! [`MAX_INSTALLED`] entries of plain names and versions, and the seal must open.

use super::sealed::{self, Expected, Refused, SealError, SealKey};
use super::{Checkpoint, Kept};
use sha2::{Digest, Sha256};

/// Largest package list (bytes of JSON).
const MAX_LIST_BYTES: u32 = 64 << 10;

/// Most packages a kept state names.
pub const MAX_INSTALLED: usize = 1024;

/// Longest package name or version (characters).
const MAX_NAME_CHARS: usize = 128;

/// The binary digest a checkpoint is stamped with: the runtime's fingerprint (the embedded
/// Pyodide, our JavaScript and Python, the crate version), hashed.
pub fn binary_digest() -> [u8; 32] {
    Sha256::digest(crate::worker::worker_main::runtime_fingerprint().as_bytes()).into()
}

/// The file of `kept` held under `generation`, sealed for the sandbox of `handle`.
///
/// Errors: [`SealError`].
pub fn write(kept: &Kept, generation: u64, handle: &str) -> Result<Vec<u8>, SealError> {
    let list = serde_json::to_vec(&kept.installed).unwrap_or_else(|_| b"[]".to_vec());
    let key = SealKey::for_handle(handle);
    let sealed = sealed::seal(&kept.image, generation, &binary_digest(), &key, &list)?;
    let mut file = Vec::with_capacity(4 + list.len() + sealed.len());
    file.extend_from_slice(&(list.len() as u32).to_le_bytes());
    file.extend_from_slice(&list);
    file.extend_from_slice(&sealed);
    Ok(file)
}

/// The kept state in `file`, if it was written for the sandbox of `handle` by this build and
/// fits `max_memory_bytes`; the generation it was written under comes with it.
///
/// Errors: [`Refused`], naming the check, echoing nothing of the file.
pub fn read(file: &[u8], handle: &str, max_memory_bytes: u64) -> Result<(u64, Kept), Refused> {
    let (len, rest) = file.split_first_chunk::<4>().ok_or(Refused::TooShort)?;
    let len = u32::from_le_bytes(*len);
    if len > MAX_LIST_BYTES {
        return Err(Refused::TooLarge);
    }
    let (list, sealed) = rest
        .split_at_checked(len as usize)
        .ok_or(Refused::TooShort)?;
    let expected = Expected {
        binary: binary_digest(),
        zygote: None,
        max_memory_bytes,
        max_stored_bytes: max_memory_bytes,
    };
    let key = SealKey::for_handle(handle);
    let (generation, image): (u64, Checkpoint) = sealed::open(sealed, &key, &expected, list)?;
    // Sealed with the list, so written by this sandbox's replica; still checked, as any input.
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
    Ok((
        generation,
        Kept {
            image,
            installed,
            reseed: false,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::linear_memory::{ZygoteId, PAGE_BYTES};

    fn kept() -> Kept {
        let mut image = Checkpoint::new(ZygoteId([3; 32]), 65536).expect("size");
        image.merge(65536, &[2], &[9; PAGE_BYTES]).expect("fits");
        Kept {
            image,
            installed: vec![("humanize".into(), "4.9.0".into())],
            reseed: true,
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
}
