//! JavaScriptCore's allocator (libpas) as the fork server needs it: its scavenger thread
//! suspended while the zygote forks and resumed in a child, and free memory returned to the
//! system before a fork. The externs are libjavascriptcoregtk's
//! (`bmalloc/libpas/src/libpas/pas_scavenger.h`); they stay in the engine seam with the rest of
//! what is JavaScriptCore's.

extern "C" {
    /// Stops the scavenger thread and waits until it has exited; the suspension is inherited
    /// by a forked child.
    fn pas_scavenger_suspend();
    /// Lets the scavenger run again (it starts its thread when there is work).
    fn pas_scavenger_resume();
    /// Returns libpas's free memory to the system now, on the calling thread.
    fn pas_scavenger_run_synchronously_now();
}

/// Gives libpas's and glibc's free memory back to the system now.
pub fn release_free_memory() {
    // SAFETY: no arguments; both only return free memory (libpas's, glibc's) to the system.
    unsafe {
        pas_scavenger_run_synchronously_now();
        libc::malloc_trim(0);
    }
}

/// Stops the allocator's scavenger thread and waits until it has exited.
pub fn suspend_scavenger() {
    // SAFETY: takes no arguments; waits for the scavenger thread to exit.
    unsafe { pas_scavenger_suspend() };
}

/// Lets the allocator's scavenger run again (undoes [`suspend_scavenger`], also one inherited
/// from the zygote).
pub fn resume_scavenger() {
    // SAFETY: takes no arguments; undoes a suspension in this process.
    unsafe { pas_scavenger_resume() };
}
