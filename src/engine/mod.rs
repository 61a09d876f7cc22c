//! The JavaScript engine seam: JavaScriptCore through its C API (docs/architecture.md §2).
//!
//! Everything engine-specific lives in this module; the rest of the program sees [`Engine`]:
//! evaluate a script, hand it files, and drive its event loop until the awaited work settles.
//! A `deno_core`/V8 backend could later implement the same surface behind a cargo feature.
//!
//! Every unsafe operation, inside an `unsafe fn` too, sits in its own `unsafe` block with the
//! reason it is sound (`unsafe_op_in_unsafe_fn` is denied crate-wide).

pub mod allocator;
mod ffi;
pub mod helper_threads;
mod host;
mod library;
mod mapped;
mod value;

use ffi::*;
pub use host::{CallError, CallHandler, EmitSink, Rejection};
use host::{Op, OpState, OwnedBytes};
pub use library::{open as open_library, LibraryError};
pub use mapped::MappedFile;
use std::cell::RefCell;
use std::ptr;
use std::time::Instant;
use thiserror::Error;
use value::*;

/// Errors from the engine. Messages carry the JavaScript text and stack where there is one.
#[derive(Debug, Error)]
pub enum EngineError {
    /// A script threw; `stack` is the JavaScript stack (may be empty).
    #[error("JavaScript error: {message}\n{stack}")]
    Thrown { message: String, stack: String },
    /// A promise was rejected and nothing handled it.
    #[error("unhandled promise rejection: {}", .0.text)]
    UnhandledRejection(Rejection),
    /// `__host.done` answered another call than the one awaited.
    #[error("the runtime answered call {got} while call {expected} was awaited")]
    WrongCall { expected: u64, got: u64 },
    /// A retained object has no function of this name.
    #[error("the script did not define the function `{0}`")]
    MissingFunction(String),
    /// Nothing is left to run (no timers) but the awaited work has not settled.
    #[error("the JavaScript event loop stalled: no pending timers and the work did not settle")]
    Stalled,
    /// The deadline passed before the work settled.
    #[error("deadline passed before the JavaScript work settled")]
    Deadline,
    /// A function expected to return a `Uint8Array` returned something else.
    #[error("the script returned no Uint8Array")]
    NotBytes,
    /// JavaScriptCore could not create a context.
    #[error("JavaScriptCore could not create a context")]
    NoContext,
    /// The engine's library cannot be used ([`open_library`]).
    #[error(transparent)]
    Library(#[from] LibraryError),
}

/// A JavaScript function the host keeps (protected from garbage collection) to call later with
/// [`Engine::call`], so that the host never assembles JavaScript source at run time and user
/// code never sees the function on any global. Valid only with the engine that made it.
pub struct JsFunction(JSObjectRef);

/// An argument for [`Engine::call`].
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    Str(&'a str),
    Num(f64),
    Bool(bool),
    Null,
}

/// One JavaScriptCore global context with our ops installed, and their state.
///
/// Not `Send`: a context is used from the thread that made it (a sandbox worker owns one
/// engine on one thread).
pub struct Engine {
    ctx: JSGlobalContextRef,
    /// The ops' state, at a stable address their objects point to.
    state: Box<RefCell<OpState>>,
    /// The op objects' private data, kept as long as the context.
    _host_fns: Box<[Op]>,
    _not_send: std::marker::PhantomData<*mut ()>,
}

/// Most threads JavaScriptCore compiles WebAssembly on (its `numberOfWasmCompilerThreads`, 1
/// by default here). Pyodide's module is compiled at every boot (`new WebAssembly.Module`,
/// ~9 MiB), and the engine spreads that compile over these threads: with 2 on the 2-core machine
/// it took 110-113 ms instead of 179-196 ms, a boot from the snapshot 0.43-0.44 s instead of
/// 0.50-0.55 s (the zygote, docs/architecture.md §3). More threads than cores gain nothing; the cap keeps a large machine,
/// which boots many workers at once anyway, from starting dozens per worker.
const MAX_WASM_COMPILER_THREADS: usize = 4;

/// Sets the engine's process-wide options once, before the first context: they are read when
/// the engine initializes. Workers get no `JSC_*` environment (it is cleared), so these are
/// the only options that differ from the library's defaults.
fn configure_engine() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(MAX_WASM_COMPILER_THREADS);
        // SAFETY: a NUL-terminated option name and a plain value; called before any context.
        let known =
            unsafe { jsc_options_set_uint(c"numberOfWasmCompilerThreads".as_ptr(), threads as _) };
        if known == 0 {
            tracing::warn!("JavaScriptCore has no option numberOfWasmCompilerThreads");
        }
    });
}

/// How long an idle engine helper thread lives in a zygote and in the interpreters forked from
/// it, instead of the library's 10 s ([`helper_threads`]). The zygote forks only once its last
/// helper has ended, which after its warm-up is this long after the last compile ends (the wait
/// went from 10.0-10.3 s to 50-180 ms, docs/fork-server-research.md, 2026-11-27). A helper that
/// ends early costs one thread start (~0.1 ms) at the next compile; forked interpreters'
/// warm calls measured the same with 50 ms and 2 s.
pub const ZYGOTE_HELPER_IDLE: std::time::Duration = std::time::Duration::from_millis(50);

/// Engine settings of a zygote, the process that warms up once and forks interpreters
/// (`worker::fork_server`): idle helper threads end after [`ZYGOTE_HELPER_IDLE`]. Call it
/// after [`open_library`] and before the first engine, which makes the helpers' objects;
/// forked interpreters inherit them, and so the timeout.
///
/// The engine's options stay the library's: they become read-only once the first context
/// exists (writing one then faults) and every forked interpreter inherits them. A lower
/// optimizing-tier threshold (`thresholdForOMGOptimizeAfterWarmUp` 5,000-20,000 instead of
/// 50,000) shortened the warm-up but made the children optimize on their own: their first
/// thousand warm calls had a p99 of 2-7 ms instead of 0.8-1.8 ms.
pub fn configure_zygote() {
    helper_threads::set_idle_timeout(ZYGOTE_HELPER_IDLE);
}

impl Engine {
    /// Creates a context, installs `__host` and the unhandled-rejection hook; opens the
    /// engine's library first if this process has not ([`open_library`]).
    ///
    /// Errors: [`EngineError::Library`] when the library cannot be used,
    /// [`EngineError::NoContext`] if JavaScriptCore fails to create a context.
    pub fn new() -> Result<Self, EngineError> {
        open_library()?;
        configure_engine();
        // SAFETY: plain C API calls on a context we own for our lifetime.
        unsafe {
            let ctx = JSGlobalContextCreate(ptr::null_mut());
            if ctx.is_null() {
                return Err(EngineError::NoContext);
            }
            let state = Box::new(RefCell::new(OpState::default()));
            let host_fns = host::install(ctx, &state);
            let global = JSContextGetGlobalObject(ctx);
            let host_obj = get_property(ctx, global, "__host") as JSObjectRef;
            let rejected = get_property(ctx, host_obj, "rejected") as JSObjectRef;
            JSGlobalContextSetUnhandledRejectionCallback(ctx, rejected, ptr::null_mut());
            Ok(Engine {
                ctx,
                state,
                _host_fns: host_fns,
                _not_send: std::marker::PhantomData,
            })
        }
    }

    /// Serves `bytes` to JavaScript at virtual `path` (`__host.readFile`), without copying.
    pub fn add_static_file(&mut self, path: &str, bytes: &'static [u8]) {
        self.state.borrow_mut().files.insert(path.to_owned(), bytes);
    }

    /// Serves owned `bytes` to JavaScript at virtual `path` once, replacing any earlier file:
    /// the first read takes them into its `ArrayBuffer` without a copy (a 30 MiB memory
    /// snapshot, a wheel, an upload are each read once), and the path is gone after it.
    pub fn add_file(&mut self, path: &str, bytes: Vec<u8>) {
        let bytes = OwnedBytes::Read(bytes);
        self.state
            .borrow_mut()
            .owned_files
            .insert(path.to_owned(), bytes);
    }

    /// Serves a mapped file at virtual `path` once, as [`Engine::add_file`] does bytes: its
    /// reader's `ArrayBuffer` is the mapping itself.
    pub fn add_mapped_file(&mut self, path: &str, mapped: MappedFile) {
        let bytes = OwnedBytes::Mapped(mapped);
        self.state
            .borrow_mut()
            .owned_files
            .insert(path.to_owned(), bytes);
    }

    /// Collects every unreachable JavaScript object now (a full collection), so that a zygote
    /// forks no garbage into its children.
    pub fn collect_garbage(&mut self) {
        // SAFETY: `ctx` is this engine's live context, used from its own thread.
        unsafe { ffi::JSSynchronousGarbageCollectForDebugging(self.ctx) };
    }

    /// Forgets the owned virtual files not read yet (after an install, a mount, an upload),
    /// freeing their memory.
    pub fn clear_files(&mut self) {
        self.state.borrow_mut().owned_files.clear();
    }

    /// Sets where `__host.emit(text)` messages go.
    pub fn set_emit_sink(&mut self, sink: EmitSink) {
        self.state.borrow_mut().emit = Some(sink);
    }

    /// Sets who answers `__host.call(name, json, bytes)`.
    pub fn set_call_handler(&mut self, handler: CallHandler) {
        self.state.borrow_mut().call = Some(handler);
    }

    /// Evaluates `source` as a classic script named `url`; returns `String(result)`.
    ///
    /// Errors: [`EngineError::Thrown`] with the message and stack if the script throws.
    pub fn eval(&mut self, source: &str, url: &str) -> Result<String, EngineError> {
        let script = JsString::new(source);
        let url = JsString::new(url);
        let mut exc: JSValueRef = ptr::null();
        // SAFETY: valid context and strings; the exception out-pointer is ours.
        unsafe {
            let v = JSEvaluateScript(self.ctx, script.0, ptr::null_mut(), url.0, 1, &mut exc);
            self.thrown(exc)?;
            Ok(to_string(self.ctx, v).unwrap_or_default())
        }
    }

    /// `Err(Thrown)` with the message and stack of `exc`, if a call set it.
    ///
    /// # Safety
    /// `exc` must be null or a value of this context.
    unsafe fn thrown(&self, exc: JSValueRef) -> Result<(), EngineError> {
        if exc.is_null() {
            return Ok(());
        }
        // SAFETY: the caller guarantees `exc` belongs to this context.
        let (message, stack) = unsafe { describe_exception(self.ctx, exc) };
        Err(EngineError::Thrown { message, stack })
    }

    /// Evaluates `source` (a classic script whose completion value is an object) and keeps the
    /// functions `names` of that object, in that order.
    ///
    /// Errors: [`EngineError::Thrown`] if the script throws, [`EngineError::MissingFunction`]
    /// if the object lacks one of the functions.
    pub fn eval_functions(
        &mut self,
        source: &str,
        url: &str,
        names: &[&str],
    ) -> Result<Vec<JsFunction>, EngineError> {
        let script = JsString::new(source);
        let url = JsString::new(url);
        let mut exc: JSValueRef = ptr::null();
        // SAFETY: valid context and strings; every value is checked before it is used as an
        // object, and kept functions are protected for the life of the context.
        unsafe {
            let v = JSEvaluateScript(self.ctx, script.0, ptr::null_mut(), url.0, 1, &mut exc);
            self.thrown(exc)?;
            if v.is_null() || !JSValueIsObject(self.ctx, v) {
                return Err(EngineError::MissingFunction(names.join(", ")));
            }
            let object = v as JSObjectRef;
            let mut out = Vec::with_capacity(names.len());
            for name in names {
                let f = get_property(self.ctx, object, name);
                if !JSValueIsObject(self.ctx, f) || !JSObjectIsFunction(self.ctx, f as JSObjectRef)
                {
                    return Err(EngineError::MissingFunction((*name).to_owned()));
                }
                JSValueProtect(self.ctx, f);
                out.push(JsFunction(f as JSObjectRef));
            }
            Ok(out)
        }
    }

    /// Calls a kept function with `args`; returns `String(result)`. Microtasks drain when it
    /// returns.
    ///
    /// Errors: [`EngineError::Thrown`] with the message and stack if the function throws.
    pub fn call(&mut self, f: &JsFunction, args: &[Arg]) -> Result<String, EngineError> {
        // SAFETY: `f` was protected by this engine; argument values are made in this context
        // and live on the stack for the duration of the call.
        unsafe {
            let values: Vec<JSValueRef> = args
                .iter()
                .map(|a| match a {
                    Arg::Str(s) => make_string(self.ctx, s),
                    Arg::Num(n) => JSValueMakeNumber(self.ctx, *n),
                    Arg::Bool(b) => JSValueMakeBoolean(self.ctx, *b),
                    Arg::Null => JSValueMakeNull(self.ctx),
                })
                .collect();
            let mut exc: JSValueRef = ptr::null();
            let v = JSObjectCallAsFunction(
                self.ctx,
                f.0,
                ptr::null_mut(),
                values.len(),
                values.as_ptr(),
                &mut exc,
            );
            self.thrown(exc)?;
            Ok(to_string(self.ctx, v).unwrap_or_default())
        }
    }

    /// Calls a kept function that returns a `Uint8Array` and lends its bytes to `lend` for the
    /// duration of the closure: how the worker reads and writes the interpreter's WebAssembly
    /// linear memory in place (a sandbox's checkpoint, docs/checkpoint-research.md), without a
    /// copy through JavaScript. No JavaScript runs while `lend` holds the bytes, so the memory
    /// can neither grow nor move meanwhile.
    ///
    /// Errors: [`EngineError::Thrown`] if the function throws, [`EngineError::NotBytes`] if it
    /// returned anything but a `Uint8Array`.
    pub fn with_bytes<T>(
        &mut self,
        f: &JsFunction,
        lend: impl FnOnce(&mut [u8]) -> T,
    ) -> Result<T, EngineError> {
        let mut exc: JSValueRef = ptr::null();
        // SAFETY: `f` was protected by this engine and is called without arguments in its
        // context. The result is read as a typed array only once known to be a `Uint8Array`,
        // within its own offset and length. JSC pins the buffer for the pointer it returns; the
        // slice is used only inside `lend`, while no JavaScript runs on this (the engine's only)
        // thread, so nothing can grow, detach or collect the buffer meanwhile.
        unsafe {
            let v =
                JSObjectCallAsFunction(self.ctx, f.0, ptr::null_mut(), 0, ptr::null(), &mut exc);
            self.thrown(exc)?;
            if v.is_null()
                || !JSValueIsObject(self.ctx, v)
                || JSValueGetTypedArrayType(self.ctx, v, ptr::null_mut())
                    != K_JS_TYPED_ARRAY_TYPE_UINT8_ARRAY
            {
                return Err(EngineError::NotBytes);
            }
            let object = v as JSObjectRef;
            let len = JSObjectGetTypedArrayByteLength(self.ctx, object, ptr::null_mut());
            let data = JSObjectGetTypedArrayBytesPtr(self.ctx, object, ptr::null_mut()) as *mut u8;
            if data.is_null() || len == 0 {
                return Ok(lend(&mut []));
            }
            let offset = JSObjectGetTypedArrayByteOffset(self.ctx, object, ptr::null_mut());
            Ok(lend(std::slice::from_raw_parts_mut(data.add(offset), len)))
        }
    }

    /// How many timers are pending: callbacks JavaScript (Pyodide's event loop, user code's
    /// `asyncio` tasks) scheduled and that have not run yet.
    pub fn pending_timers(&self) -> usize {
        self.state.borrow().timers.len()
    }

    /// Runs the event loop until JavaScript calls `__host.done(id, text)` for call `id`, then
    /// returns `text`.
    ///
    /// Due timers run in order; between them the thread sleeps. Microtasks drain whenever a
    /// call into JavaScript returns. Errors: [`EngineError::Stalled`] if no timer is left and
    /// nothing settled, [`EngineError::Deadline`] past `deadline`,
    /// [`EngineError::UnhandledRejection`] for a rejection nothing handled.
    pub fn run_until_done(
        &mut self,
        id: u64,
        deadline: Option<Instant>,
    ) -> Result<String, EngineError> {
        loop {
            let rejection = self.state.borrow_mut().rejections.pop();
            if let Some(e) = rejection {
                self.state.borrow_mut().done = None;
                return Err(EngineError::UnhandledRejection(e));
            }
            let done = self.state.borrow_mut().done.take();
            if let Some((got, text)) = done {
                if got != id {
                    return Err(EngineError::WrongCall { expected: id, got });
                }
                return Ok(text);
            }
            let next = self.state.borrow().timers.keys().next().copied();
            let Some((due, id)) = next else {
                return Err(EngineError::Stalled);
            };
            let now = Instant::now();
            if let Some(d) = deadline {
                if d <= now || d < due {
                    if d > now {
                        std::thread::sleep(d - now);
                    }
                    return Err(EngineError::Deadline);
                }
            }
            if due > now {
                std::thread::sleep(due - now);
            }
            let timer = {
                let mut s = self.state.borrow_mut();
                s.timer_due.remove(&id);
                s.timers.remove(&(due, id))
            };
            if let Some(t) = timer {
                // SAFETY: the callback was protected when the timer was set.
                unsafe {
                    let mut exc: JSValueRef = ptr::null();
                    JSObjectCallAsFunction(
                        self.ctx,
                        t.callback,
                        ptr::null_mut(),
                        0,
                        ptr::null(),
                        &mut exc,
                    );
                    JSValueUnprotect(self.ctx, t.callback);
                    if !exc.is_null() {
                        let (message, stack) = describe_exception(self.ctx, exc);
                        tracing::warn!(target: "js", "uncaught exception in a timer: {message}\n{stack}");
                    }
                }
            }
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // SAFETY: we own the context.
        unsafe { JSGlobalContextRelease(self.ctx) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webassembly_compiles_on_every_core_up_to_the_cap() {
        configure_engine();
        let mut threads = 0;
        // SAFETY: a NUL-terminated option name and a valid place for the value.
        let known =
            unsafe { jsc_options_get_uint(c"numberOfWasmCompilerThreads".as_ptr(), &mut threads) };
        assert_ne!(known, 0);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(threads as usize, cores.min(MAX_WASM_COMPILER_THREADS));
    }

    /// Host state belongs to its engine: two engines on one thread see their own files, and
    /// the ops behave as functions (`typeof`, `bind`, thrown errors).
    #[test]
    fn each_engine_has_its_own_host_state() {
        let mut a = Engine::new().expect("engine a");
        let mut b = Engine::new().expect("engine b");
        a.add_static_file("/only-a", b"from a");
        let read = "(() => { try { return new Uint8Array(__host.readFile('/only-a')).length; } \
                    catch (e) { return e instanceof Error ? 'absent' : 'odd'; } })()";
        assert_eq!(a.eval(read, "a.js").expect("a reads"), "6");
        assert_eq!(b.eval(read, "b.js").expect("b reads"), "absent");
        let shape = "[typeof __host.now, __host.now.bind(null)() >= 0, \
                     __host.now.call(null) >= 0].join()";
        assert_eq!(
            a.eval(shape, "shape.js").expect("shape"),
            "function,true,true"
        );
        // A settled call is seen by its own engine only.
        let done = a.eval("__host.done(7, 'seven'); 1", "done.js");
        assert!(done.is_ok());
        assert!(matches!(
            b.run_until_done(7, None),
            Err(EngineError::Stalled)
        ));
        assert_eq!(a.run_until_done(7, None).expect("a's answer"), "seven");
    }
}
