//! JavaScriptCore's allocator (libpas) as the fork server needs it: its scavenger thread
//! suspended while the zygote forks and resumed in a child, and free memory returned to the
//! system before a fork. The functions are libjavascriptcoregtk's (`ffi.rs`); they stay in the
//! engine seam with the rest of what is JavaScriptCore's. In a process that never opened the
//! library (a scientific zygote, whose engine is wasmtime) there is no libpas, and only glibc's
//! part is done.

use super::{ffi, library};

/// Gives libpas's (when the engine's library is open) and glibc's free memory back to the
/// system now.
pub fn release_free_memory() {
    if library::is_open() {
        // SAFETY: no arguments; only returns libpas's free memory to the system.
        unsafe { ffi::pas_scavenger_run_synchronously_now() };
    }
    // SAFETY: no arguments; only returns glibc's free memory to the system.
    unsafe { libc::malloc_trim(0) };
}

/// Stops the allocator's scavenger thread and waits until it has exited (nothing to stop where
/// the engine's library is not open).
pub fn suspend_scavenger() {
    if library::is_open() {
        // SAFETY: takes no arguments; waits for the scavenger thread to exit.
        unsafe { ffi::pas_scavenger_suspend() };
    }
}

/// Lets the allocator's scavenger run again (undoes [`suspend_scavenger`], also one inherited
/// from the zygote).
pub fn resume_scavenger() {
    if library::is_open() {
        // SAFETY: takes no arguments; undoes a suspension in this process.
        unsafe { ffi::pas_scavenger_resume() };
    }
}
