//! The engine's shared library, JavaScriptCore (`libjavascriptcoregtk-4.1`), opened at run time
//! by the processes that run JavaScript: a Pyodide worker and the zygote that forks them
//! (docs/architecture.md §2.1). It is not linked into the binary, so the process that serves
//! MCP (the front), the zygote service and the scientific runtime's workers never map it, nor
//! ICU and GLib, which it brings (issue 49: the dynamic linker spent about 10 ms of every
//! front's start binding its symbols; `tests/sdk_v1/test_lean_front.py` checks the maps).
//!
//! A worker opens it before it confines itself ([`open`] reads the library's files, which
//! Landlock then forbids). The binary names it in an ELF note, [`DLOPEN_NOTE`], in the format
//! of the freedesktop.org "dlopen metadata" (<https://systemd.io/ELF_DLOPEN_METADATA/>), which
//! packaging tools read for the libraries a binary opens rather than links: the wheel's repair
//! step (`scripts/repair_wheel.py`) bundles what it names, and the binary finds the copy through
//! its run-path.

use super::ffi::{self, Functions};
use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
use std::ffi::{c_void, CStr};
use std::sync::OnceLock;
use thiserror::Error;

/// The library's soname as a literal, for [`SONAME`] and the note's JSON.
macro_rules! soname {
    () => {
        "libjavascriptcoregtk-4.1.so.0"
    };
}

/// The library's soname, as the loader looks it up (the run-path of the wheel's binary, then
/// the system's directories). Version 4.1 of the API is the one built with libsoup 3 (Debian
/// 12's `libjavascriptcoregtk-4.1-0`).
pub const SONAME: &str = soname!();

/// The dlopen metadata's JSON: one required feature, the engine.
const DLOPEN_JSON: &str = concat!(
    r#"[{"feature":"javascript-engine","description":"JavaScriptCore, the engine of the Pyodide workers","priority":"required","soname":[""#,
    soname!(),
    r#""]}]"#
);

/// The note's owner, `FDO` and its NUL.
const NOTE_OWNER: [u8; 4] = *b"FDO\0";
/// The note's type for dlopen metadata (`NT_FDO_DLOPEN_METADATA`).
const NT_FDO_DLOPEN_METADATA: u32 = 0x407c_0c0a;
/// An ELF note's fields and descriptor are padded to 4 bytes.
const NOTE_ALIGN: usize = 4;
/// The descriptor's length: the JSON, its NUL, padding.
const DLOPEN_DESC_LEN: usize = (DLOPEN_JSON.len() + 1).div_ceil(NOTE_ALIGN) * NOTE_ALIGN;

/// An ELF note (`Elf_Nhdr`, then the owner's name and the descriptor, each padded).
#[repr(C, align(4))]
pub struct ElfNote<const DESC: usize> {
    name_size: u32,
    desc_size: u32,
    kind: u32,
    name: [u8; 4],
    desc: [u8; DESC],
}

/// The JSON's bytes, NUL-terminated and zero-padded to the descriptor's length.
const fn dlopen_desc() -> [u8; DLOPEN_DESC_LEN] {
    let mut desc = [0u8; DLOPEN_DESC_LEN];
    let json = DLOPEN_JSON.as_bytes();
    let mut i = 0;
    while i < json.len() {
        desc[i] = json[i];
        i += 1;
    }
    desc
}

/// The binary's dlopen metadata note (section `.note.dlopen`), naming [`SONAME`]: kept by the
/// linker as every note section is, and by `strip`.
#[used]
#[link_section = ".note.dlopen"]
pub static DLOPEN_NOTE: ElfNote<DLOPEN_DESC_LEN> = ElfNote {
    name_size: NOTE_OWNER.len() as u32,
    desc_size: (DLOPEN_JSON.len() + 1) as u32,
    kind: NT_FDO_DLOPEN_METADATA,
    name: NOTE_OWNER,
    desc: dlopen_desc(),
};

/// The oldest release this engine runs on, as (major, minor): the first whose C API has
/// everything in `ffi.rs` and whose allocator is libpas (`pas_scavenger_*`).
const OLDEST_RELEASE: (u32, u32) = (2, 40);

/// Why the engine's library cannot be used.
#[derive(Debug, Error)]
pub enum LibraryError {
    /// The loader did not find or could not load it.
    #[error(
        "cannot load JavaScriptCore ({}): install Debian's libjavascriptcoregtk-4.1-0 (the \
         wheel bundles it)",
        SONAME
    )]
    Open(#[source] libloading::Error),
    /// It lacks a function the engine calls.
    #[error("JavaScriptCore ({}) has no function `{name}`", SONAME)]
    Missing {
        name: &'static str,
        #[source]
        source: libloading::Error,
    },
    /// It is older than [`OLDEST_RELEASE`].
    #[error(
        "JavaScriptCore {major}.{minor} is too old: this engine needs {}.{} or newer",
        OLDEST_RELEASE.0,
        OLDEST_RELEASE.1
    )]
    TooOld { major: u32, minor: u32 },
}

/// The open library, kept for the process's life: the functions' pointers (`ffi.rs`) are only
/// valid while it is open, and the engine's threads and objects outlive any scope.
static OPENED: OnceLock<Library> = OnceLock::new();

/// Opens the library and finds its functions, once per process; later calls only check its
/// release again. A forked child inherits it open.
///
/// Errors: [`LibraryError`], when it is missing, incomplete or too old.
pub fn open() -> Result<(), LibraryError> {
    if OPENED.get().is_some() {
        return check_release();
    }
    // Every symbol bound now, before a zygote forks (no child then binds one and dirties the
    // page it patches); local, since nothing else in the process looks its symbols up. The
    // library's own references still resolve to this binary's definitions first, which
    // `helper_threads` relies on.
    // SAFETY: opening JavaScriptCore runs its initializers, which only set up its own state.
    let library = unsafe { Library::open(Some(SONAME), RTLD_NOW | RTLD_LOCAL) }
        .map_err(LibraryError::Open)?;
    // SAFETY: `library` is JavaScriptCore's, found by its soname.
    let functions = unsafe { Functions::find(&library) }
        .map_err(|(name, source)| LibraryError::Missing { name, source })?;
    // Kept open from the moment its functions are installed, too old or not: their pointers
    // must never outlive the handle. A second thread opening it at the same time loses the
    // race and drops its handle, which only lowers the loader's count of the same library.
    ffi::install(functions);
    OPENED.get_or_init(|| library);
    check_release()
}

/// Whether this process has opened the library (a front, a zygote service and a scientific
/// worker never do), whatever its release.
pub fn is_open() -> bool {
    OPENED.get().is_some()
}

/// The address of the library's own definition of `name` (not an interposed one of this
/// binary's), or `None` when it is not open or has no such symbol.
pub(super) fn own_symbol(name: &CStr) -> Option<*mut c_void> {
    let library = OPENED.get()?;
    // SAFETY: the pointer is only looked up, not called or read, here; the caller gives it
    // its type.
    let symbol = unsafe { library.get::<*mut c_void>(name.to_bytes_with_nul()) }.ok()?;
    Some(symbol.into_raw())
}

/// Errors: [`LibraryError::TooOld`] below [`OLDEST_RELEASE`].
fn check_release() -> Result<(), LibraryError> {
    // SAFETY: both take no arguments and only return constants.
    let (major, minor) = unsafe { (ffi::jsc_get_major_version(), ffi::jsc_get_minor_version()) };
    if (major, minor) < OLDEST_RELEASE {
        return Err(LibraryError::TooOld { major, minor });
    }
    Ok(())
}
