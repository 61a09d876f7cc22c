//! How long JavaScriptCore's idle helper threads live, for the zygote
//! (`docs/fork-server-research.md`, "The helper threads' idle timeout").
//!
//! Every engine helper thread (wasm and JavaScript compilers, the garbage collector's collector
//! and markers) is a WTF `AutomaticThread`: started when work arrives, it ends once idle for
//! the timeout its constructor was given, 10 s for all of them. The zygote may fork only when it
//! has one thread, so it used to wait those 10 s after its last compile, most of its start.
//! No engine option sets that timeout, but both `AutomaticThread` constructors are exported by
//! libjavascriptcoregtk and every construction in the library calls them through its PLT (5 call
//! sites in 2.50.6). This binary exports constructors of the same names (build.rs), which the
//! dynamic linker binds those calls to when it opens the library (`library.rs`: this binary's
//! definitions come first in the lookup); each forwards to the library's own (found in the
//! library's handle) with the timeout shortened to [`set_idle_timeout`]'s, when one is set.
//! Nothing else about the threads changes: they end by the library's own timeout path, so their
//! state after it is the state after a natural 10 s timeout, and the zygote still forks only
//! once `/proc` shows a single thread.
//!
//! Where the library does not call these (another build, static binding), nothing is
//! shortened, [`shortened`] stays 0, and the zygote waits the full timeout as before.

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// The shortened idle timeout in seconds as `f64` bits; 0: the library's own.
static IDLE_TIMEOUT: AtomicU64 = AtomicU64::new(0);

/// How many helper threads were made with a shortened timeout (so far, in this process).
static SHORTENED: AtomicUsize = AtomicUsize::new(0);

/// Shortens the idle timeout of every engine helper thread made from now on, in this process
/// and in processes forked from it (which inherit the threads' objects, timeout included).
/// Call it after the engine's library is opened (`super::library::open`: the library's own
/// constructors are found then) and before the first engine is made: the compiler and
/// collector threads' objects are made with the first context and live for the process.
pub fn set_idle_timeout(timeout: Duration) {
    // Resolve the library's constructors now, not inside a helper's construction.
    let _ = real_constructors();
    IDLE_TIMEOUT.store(timeout.as_secs_f64().to_bits(), Ordering::Relaxed);
}

/// How many engine helper threads were made with the shortened timeout: 0 means the library
/// did not call the constructors here, and idle helpers live their 10 s.
pub fn shortened() -> usize {
    SHORTENED.load(Ordering::Relaxed)
}

/// `timeout` (seconds), or the shortened one if it is shorter.
fn chosen(timeout: f64) -> f64 {
    let bits = IDLE_TIMEOUT.load(Ordering::Relaxed);
    if bits == 0 {
        return timeout;
    }
    let short = f64::from_bits(bits);
    if short < timeout {
        SHORTENED.fetch_add(1, Ordering::Relaxed);
        short
    } else {
        timeout
    }
}

/// `AutomaticThread(const AbstractLocker&, Box<Lock>, Ref<AutomaticThreadCondition>&&,
/// Seconds)`, base-object constructor. The `Box` (non-trivial) and the `Ref&&` are passed by
/// address, `Seconds` (one `double`) in a floating-point register: in the C ABI, four pointers
/// and an `f64`.
const CONSTRUCTOR: &CStr = c"_ZN3WTF15AutomaticThreadC2ERKNS_14AbstractLockerENS_3BoxINS_4LockEEEONS_3RefINS_24AutomaticThreadConditionENS_12RawPtrTraitsIS8_EENS_21DefaultRefDerefTraitsIS8_EEEENS_7SecondsE";

/// The same with a `ThreadType` (a one-byte enum) before the timeout.
const TYPED_CONSTRUCTOR: &CStr = c"_ZN3WTF15AutomaticThreadC2ERKNS_14AbstractLockerENS_3BoxINS_4LockEEEONS_3RefINS_24AutomaticThreadConditionENS_12RawPtrTraitsIS8_EENS_21DefaultRefDerefTraitsIS8_EEEENS_10ThreadTypeENS_7SecondsE";

type Constructor = unsafe extern "C" fn(*mut c_void, *const c_void, *mut c_void, *mut c_void, f64);
type TypedConstructor =
    unsafe extern "C" fn(*mut c_void, *const c_void, *mut c_void, *mut c_void, u8, f64);

/// The library's two constructors (the next definitions after this binary's).
struct Real {
    plain: Option<Constructor>,
    typed: Option<TypedConstructor>,
}

fn real_constructors() -> &'static Real {
    static REAL: OnceLock<Real> = OnceLock::new();
    REAL.get_or_init(|| {
        let plain = super::library::own_symbol(CONSTRUCTOR);
        let typed = super::library::own_symbol(TYPED_CONSTRUCTOR);
        // SAFETY: each non-null address is the library's named constructor, whose C ABI the
        // types above spell out.
        unsafe {
            Real {
                plain: plain
                    .filter(|p| !p.is_null())
                    .map(|p| std::mem::transmute::<*mut c_void, Constructor>(p)),
                typed: typed
                    .filter(|p| !p.is_null())
                    .map(|p| std::mem::transmute::<*mut c_void, TypedConstructor>(p)),
            }
        }
    })
}

/// This binary's `AutomaticThread(locker, lock, condition, timeout)`: the library's, with
/// [`chosen`]'s timeout.
///
/// # Safety
/// Called by libjavascriptcoregtk only, with the arguments of the constructor it names.
#[no_mangle]
pub unsafe extern "C" fn _ZN3WTF15AutomaticThreadC2ERKNS_14AbstractLockerENS_3BoxINS_4LockEEEONS_3RefINS_24AutomaticThreadConditionENS_12RawPtrTraitsIS8_EENS_21DefaultRefDerefTraitsIS8_EEEENS_7SecondsE(
    this: *mut c_void,
    locker: *const c_void,
    lock: *mut c_void,
    condition: *mut c_void,
    timeout: f64,
) {
    let Some(real) = real_constructors().plain else {
        // Only the library calls this, and it defines the constructor; without it no helper
        // thread can be made, and returning would leave an object unconstructed.
        std::process::abort();
    };
    // SAFETY: the caller's own arguments, forwarded unchanged to the constructor it meant to
    // call, but for a shorter timeout.
    unsafe { real(this, locker, lock, condition, chosen(timeout)) }
}

/// This binary's `AutomaticThread(locker, lock, condition, type, timeout)`: the library's,
/// with [`chosen`]'s timeout.
///
/// # Safety
/// Called by libjavascriptcoregtk only, with the arguments of the constructor it names.
#[no_mangle]
pub unsafe extern "C" fn _ZN3WTF15AutomaticThreadC2ERKNS_14AbstractLockerENS_3BoxINS_4LockEEEONS_3RefINS_24AutomaticThreadConditionENS_12RawPtrTraitsIS8_EENS_21DefaultRefDerefTraitsIS8_EEEENS_10ThreadTypeENS_7SecondsE(
    this: *mut c_void,
    locker: *const c_void,
    lock: *mut c_void,
    condition: *mut c_void,
    thread_type: u8,
    timeout: f64,
) {
    let Some(real) = real_constructors().typed else {
        // As above.
        std::process::abort();
    };
    // SAFETY: as above.
    unsafe { real(this, locker, lock, condition, thread_type, chosen(timeout)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a longer timeout is shortened, and only once a timeout is set; the library's
    /// constructors are found in the opened library.
    #[test]
    fn only_longer_timeouts_are_shortened() {
        super::super::library::open().expect("the engine's library");
        assert_eq!(chosen(10.0), 10.0);
        set_idle_timeout(Duration::from_millis(50));
        assert_eq!(chosen(10.0), 0.05);
        assert_eq!(chosen(0.01), 0.01);
        assert!(shortened() >= 1);
        let real = real_constructors();
        assert!(real.plain.is_some() && real.typed.is_some());
    }
}
