//! Ops: the ops of the engine, the only native capabilities JavaScript gets (docs/architecture.md §2).
//!
//! They live on one object, `__host`, that `runtime/js/bootstrap.js` wraps into the standard globals
//! Pyodide expects (`setTimeout`, `performance.now`, `crypto.getRandomValues`, `console`, …) and
//! then deletes. Everything else a browser or Node would offer is absent on purpose: no network,
//! no host files.
//!
//! The surface is declared in one place, [`OPS`]: each entry is a plain Rust
//! function over a [`OpCall`] (its engine's state, its arguments, a way to throw). Each is
//! installed as a callable object of one JavaScriptCore class whose private data names the
//! function and its engine's [`OpState`], so state is per engine (as deno_core's `OpState`
//! is per runtime), not per thread.

use super::ffi::*;
use super::value::*;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::ffi::c_void;
use std::ptr;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The bytes of an owned virtual file: read into memory, or a file mapped.
pub enum OwnedBytes {
    Read(Vec<u8>),
    Mapped(super::mapped::MappedFile),
}

/// Receives messages that JavaScript sends to the embedder with `__host.emit(text)`.
pub type EmitSink = Box<dyn FnMut(&str)>;

/// Answers synchronous requests JavaScript makes with `__host.call(json, bytes)`: a JSON
/// message (the embedder parses it into its typed requests) and bytes in, `(json, bytes)` out,
/// or the embedder's error, whose text becomes the message of a JS `Error`.
pub type CallHandler = Box<dyn FnMut(&str, Vec<u8>) -> Result<(String, Vec<u8>), CallError>>;

/// Why the embedder did not answer a host call: its own typed error (the engine knows nothing
/// of the embedder's requests), of which JavaScript gets the text (`Display`) as an `Error`.
pub type CallError = Box<dyn std::error::Error>;

/// An unhandled promise rejection: its text, and whether it ended the interpreter.
#[derive(Debug, Clone)]
pub struct Rejection {
    /// The reason's message and stack.
    pub text: String,
    /// Pyodide marked the reason as fatal (`pyodide_fatal_error`): the interpreter ended.
    pub fatal: bool,
    /// The exit status, when the interpreter ended with `exit(status)` (Emscripten's
    /// `ExitStatus` carries it as `status`).
    pub exit_status: Option<i64>,
}

pub(crate) struct Timer {
    pub callback: JSObjectRef,
}

#[derive(Default)]
pub(crate) struct OpState {
    /// Pending timers by (due time, id); id breaks ties in creation order.
    pub timers: BTreeMap<(Instant, u64), Timer>,
    pub timer_due: HashMap<u64, Instant>,
    pub next_timer: u64,
    /// Read-only virtual files served to `read`/`readbuffer` (Pyodide's "shell" runtime).
    pub files: HashMap<String, &'static [u8]>,
    /// Owned virtual files, each handed over to its first reader (`Engine::add_file`).
    pub owned_files: HashMap<String, OwnedBytes>,
    pub emit: Option<EmitSink>,
    pub call: Option<CallHandler>,
    /// Last `(id, text)` given to `__host.done(id, text)`: the awaited work has settled.
    pub done: Option<(u64, String)>,
    /// Unhandled promise rejections since the last check.
    pub rejections: Vec<Rejection>,
    /// When the engine was made (`__host.now()` counts from here).
    pub start: Option<Instant>,
}

/// One call of a op: its engine's state, its arguments and its exception slot.
pub(crate) struct OpCall<'a> {
    ctx: JSContextRef,
    state: &'a RefCell<OpState>,
    args: &'a [JSValueRef],
    exception: *mut JSValueRef,
}

impl OpCall<'_> {
    /// Argument `i`, or `undefined`.
    fn arg(&self, i: usize) -> JSValueRef {
        match self.args.get(i) {
            Some(v) => *v,
            // SAFETY: `ctx` is the live context this call came from.
            None => unsafe { JSValueMakeUndefined(self.ctx) },
        }
    }

    /// `String(argument i)`, or "" when that conversion throws.
    fn string(&self, i: usize) -> String {
        // SAFETY: a value of this call's context.
        unsafe { to_string(self.ctx, self.arg(i)) }.unwrap_or_default()
    }

    /// `Number(argument i)` (NaN when that conversion throws).
    fn number(&self, i: usize) -> f64 {
        // SAFETY: a value of this call's context; a conversion that throws gives NaN.
        unsafe { JSValueToNumber(self.ctx, self.arg(i), ptr::null_mut()) }
    }

    fn undefined(&self) -> JSValueRef {
        // SAFETY: `ctx` is the live context this call came from.
        unsafe { JSValueMakeUndefined(self.ctx) }
    }

    /// Throws a JavaScript `Error` with `message` from this call.
    fn throw(&self, message: &str) -> JSValueRef {
        if !self.exception.is_null() {
            // SAFETY: JavaScriptCore gave this call a writable exception slot.
            unsafe { *self.exception = make_error(self.ctx, message) };
        }
        self.undefined()
    }
}

/// A op's body.
type OpBody = fn(&OpCall<'_>) -> JSValueRef;

/// The whole host surface: `__host.<name>` for each entry.
const OPS: [(&str, OpBody); 9] = [
    ("call", host_call),
    ("now", host_now),
    ("setTimer", host_set_timer),
    ("clearTimer", host_clear_timer),
    ("randomBytes", host_random_bytes),
    ("readFile", host_read_file),
    ("emit", host_emit),
    ("done", host_done),
    ("rejected", host_rejected),
];

/// The private data of a op's object: the body and its engine's state. The engine
/// keeps these (in one boxed slice that never moves) for as long as its context lives.
pub(crate) struct Op {
    body: OpBody,
    state: *const RefCell<OpState>,
}

/// The JavaScriptCore class of op objects: callable, through [`dispatch`].
struct OpClass(JSClassRef);
// SAFETY: a class is immutable once made, and JavaScriptCore's classes may be used from any
// thread that has a context.
unsafe impl Send for OpClass {}
// SAFETY: as above.
unsafe impl Sync for OpClass {}

fn host_fn_class() -> JSClassRef {
    static CLASS: OnceLock<OpClass> = OnceLock::new();
    CLASS
        .get_or_init(|| {
            let definition = JSClassDefinition {
                class_name: c"HostFunction".as_ptr(),
                call_as_function: Some(dispatch),
                ..JSClassDefinition::EMPTY
            };
            // SAFETY: a valid definition whose strings are static; the class is never released.
            OpClass(unsafe { JSClassCreate(&definition) })
        })
        .0
}

/// Calls the body of the op object `function` (JavaScriptCore's `callAsFunction`).
unsafe extern "C" fn dispatch(
    ctx: JSContextRef,
    function: JSObjectRef,
    _this: JSObjectRef,
    argc: usize,
    argv: *const JSValueRef,
    exception: *mut JSValueRef,
) -> JSValueRef {
    // SAFETY: objects of the op class are made only by `install`, with a `Op`
    // as private data that the engine keeps alive, with its state, as long as the context.
    let host_fn = unsafe { &*(JSObjectGetPrivate(function) as *const Op) };
    let args = if argc == 0 || argv.is_null() {
        &[][..]
    } else {
        // SAFETY: JavaScriptCore passes `argc` arguments at `argv`.
        unsafe { std::slice::from_raw_parts(argv, argc) }
    };
    let call = OpCall {
        ctx,
        // SAFETY: see above.
        state: unsafe { &*host_fn.state },
        args,
        exception,
    };
    (host_fn.body)(&call)
}

/// Largest call id JavaScript can hold exactly (2^53 - 1).
const MAX_SAFE_ID: f64 = 9_007_199_254_740_991.0;

/// Longest timer delay (milliseconds): 2^31 - 1, the largest delay browsers and Node honour.
const MAX_TIMER_DELAY_MS: f64 = 2_147_483_647.0;

/// Installs `__host` on the global object of `ctx`, its functions bound to `state`; returns
/// the functions' private data, which the caller must keep as long as the context (and
/// `state` at its address).
///
/// # Safety
/// `ctx` must be a valid global context.
pub unsafe fn install(ctx: JSGlobalContextRef, state: &RefCell<OpState>) -> Box<[Op]> {
    state.borrow_mut().start = Some(Instant::now());
    let class = host_fn_class();
    // Made whole before any object points into it: the slice never moves afterwards.
    let kept: Box<[Op]> = OPS.iter().map(|&(_, body)| Op { body, state }).collect();
    // SAFETY: `ctx` is valid (the caller's promise); every object is made in it.
    unsafe {
        let global = JSContextGetGlobalObject(ctx);
        let function = get_property(ctx, global, "Function") as JSObjectRef;
        let function_prototype = get_property(ctx, function, "prototype");
        let host = JSObjectMake(ctx, ptr::null_mut(), ptr::null_mut());
        for ((name, _), host_fn) in OPS.iter().zip(kept.iter()) {
            let f = JSObjectMake(ctx, class, host_fn as *const Op as *mut c_void);
            // A function like any other for JavaScript (`call`, `apply`, `bind`).
            JSObjectSetPrototype(ctx, f, function_prototype);
            set_property(ctx, host, name, f);
        }
        set_property(ctx, global, "__host", host);
    }
    kept
}

/// `__host.now()`: milliseconds (fractional) since the engine started, monotonic.
fn host_now(call: &OpCall<'_>) -> JSValueRef {
    let ms = call
        .state
        .borrow()
        .start
        .map_or(0.0, |t| t.elapsed().as_secs_f64() * 1000.0);
    // SAFETY: the call's live context.
    unsafe { JSValueMakeNumber(call.ctx, ms) }
}

/// `__host.setTimer(fn, ms) -> id`: runs `fn` once after `ms` milliseconds.
fn host_set_timer(call: &OpCall<'_>) -> JSValueRef {
    let cb = call.arg(0);
    // SAFETY: a value of the call's context, used as an object only once known to be one.
    let callable =
        unsafe { JSValueIsObject(call.ctx, cb) && JSObjectIsFunction(call.ctx, cb as JSObjectRef) };
    if !callable {
        return call.throw("setTimer: callback is not a function");
    }
    let ms = call.number(1);
    // Clamped as browsers and Node clamp delays: NaN and negatives are 0, and nothing waits
    // longer than MAX_TIMER_DELAY_MS (so `setTimeout(f, 1e23)` cannot overflow an `Instant`).
    let ms = if ms.is_finite() && ms > 0.0 {
        ms.min(MAX_TIMER_DELAY_MS)
    } else {
        0.0
    };
    let now = Instant::now();
    let due = now
        .checked_add(Duration::from_secs_f64(ms / 1000.0))
        .unwrap_or(now);
    // SAFETY: kept from collection until the timer runs or is cleared (then unprotected).
    unsafe { JSValueProtect(call.ctx, cb) };
    let mut s = call.state.borrow_mut();
    s.next_timer += 1;
    let id = s.next_timer;
    s.timers.insert(
        (due, id),
        Timer {
            callback: cb as JSObjectRef,
        },
    );
    s.timer_due.insert(id, due);
    // SAFETY: the call's live context.
    unsafe { JSValueMakeNumber(call.ctx, id as f64) }
}

/// `__host.clearTimer(id)`: cancels a pending timer; unknown ids are ignored.
fn host_clear_timer(call: &OpCall<'_>) -> JSValueRef {
    let id = call.number(0);
    if id.is_finite() && id >= 0.0 {
        let id = id as u64;
        let timer = {
            let mut s = call.state.borrow_mut();
            s.timer_due
                .remove(&id)
                .and_then(|due| s.timers.remove(&(due, id)))
        };
        if let Some(t) = timer {
            // SAFETY: protected when the timer was set.
            unsafe { JSValueUnprotect(call.ctx, t.callback) };
        }
    }
    call.undefined()
}

/// Most bytes one `__host.randomBytes(n)` gives (the Web Crypto API's limit for
/// `getRandomValues`).
const MAX_RANDOM_BYTES: f64 = 65536.0;

/// `__host.randomBytes(n) -> ArrayBuffer`: `n` bytes (at most 65536) from the OS.
fn host_random_bytes(call: &OpCall<'_>) -> JSValueRef {
    let n = call.number(0);
    if !(0.0..=MAX_RANDOM_BYTES).contains(&n) {
        return call.throw("randomBytes: length must be between 0 and 65536");
    }
    let mut buf = vec![0u8; n as usize];
    if let Err(e) = getrandom::fill(&mut buf) {
        return call.throw(&format!("randomBytes: the OS gave no randomness: {e}"));
    }
    // SAFETY: the call's live context.
    unsafe { make_array_buffer(call.ctx, buf) }
}

/// `__host.readFile(path) -> ArrayBuffer`: a copy of a virtual file; throws if absent.
fn host_read_file(call: &OpCall<'_>) -> JSValueRef {
    let path = call.string(0);
    // A static file is copied (its bytes are read-only, and JavaScript may write to the
    // buffer); an owned one is handed over (`Engine::add_file`: read once).
    let bytes = {
        let mut s = call.state.borrow_mut();
        match s.files.get(&path) {
            Some(b) => Some(OwnedBytes::Read(b.to_vec())),
            None => s.owned_files.remove(&path),
        }
    };
    match bytes {
        // SAFETY: the call's live context.
        Some(OwnedBytes::Read(b)) => unsafe { make_array_buffer(call.ctx, b) },
        // SAFETY: as above.
        Some(OwnedBytes::Mapped(m)) => unsafe { make_mapped_array_buffer(call.ctx, m) },
        None => call.throw(&format!("No such file: {path}")),
    }
}

/// `__host.emit(text)`: hands a message to the embedder (streamed output, events).
fn host_emit(call: &OpCall<'_>) -> JSValueRef {
    let text = call.string(0);
    // Take the sink out while calling it so that it may not re-enter the state.
    let sink = call.state.borrow_mut().emit.take();
    if let Some(mut sink) = sink {
        sink(&text);
        call.state.borrow_mut().emit = Some(sink);
    }
    call.undefined()
}

/// `__host.done(id, text)`: the work of call `id` settled with `text` (see
/// `Engine::run_until_done`).
fn host_done(call: &OpCall<'_>) -> JSValueRef {
    let id = call.number(0);
    if !(0.0..=MAX_SAFE_ID).contains(&id) {
        return call.throw("done: the call id must be a non-negative integer");
    }
    let text = call.string(1);
    call.state.borrow_mut().done = Some((id as u64, text));
    call.undefined()
}

/// Unhandled-rejection callback `(promise, reason)`: recorded so that a failure inside a promise
/// chain surfaces as an error instead of looking like a hang (docs/architecture.md §2).
fn host_rejected(call: &OpCall<'_>) -> JSValueRef {
    let ctx = call.ctx;
    let reason = call.arg(1);
    // SAFETY: values of the call's context, used as objects only once known to be ones.
    let rejection = unsafe {
        let (message, stack) = describe_exception(ctx, reason);
        let text = if stack.is_empty() {
            message
        } else {
            format!("{message}\n{stack}")
        };
        let (mut fatal, mut exit_status) = (false, None);
        if JSValueIsObject(ctx, reason) {
            let object = reason as JSObjectRef;
            fatal = JSValueToBoolean(ctx, get_property(ctx, object, "pyodide_fatal_error"));
            let status = get_property(ctx, object, "status");
            if fatal && JSValueGetType(ctx, status) == K_JS_TYPE_NUMBER {
                let n = JSValueToNumber(ctx, status, ptr::null_mut());
                if n.is_finite() && n.fract() == 0.0 && n.abs() <= i64::MAX as f64 {
                    exit_status = Some(n as i64);
                }
            }
        }
        Rejection {
            text,
            fatal,
            exit_status,
        }
    };
    call.state.borrow_mut().rejections.push(rejection);
    call.undefined()
}

/// `__host.call(name, json, bytes?) -> {json, body: ArrayBuffer}`: a synchronous request to the
/// embedder (used for `fetch`, which the front performs under its network policy). `bytes`
/// must be a `Uint8Array` that JavaScript created for this call (never a view of WebAssembly
/// memory, whose buffer must not be pinned).
fn host_call(call: &OpCall<'_>) -> JSValueRef {
    let ctx = call.ctx;
    let json = call.string(0);
    let bytes_arg = call.arg(1);
    let mut bytes = Vec::new();
    // SAFETY: a value of the call's context, read as a typed array only once known to be a
    // `Uint8Array`, within its own offset and length.
    unsafe {
        if JSValueIsObject(ctx, bytes_arg)
            && JSValueGetTypedArrayType(ctx, bytes_arg, ptr::null_mut())
                == K_JS_TYPED_ARRAY_TYPE_UINT8_ARRAY
        {
            let obj = bytes_arg as JSObjectRef;
            let len = JSObjectGetTypedArrayByteLength(ctx, obj, ptr::null_mut());
            let data = JSObjectGetTypedArrayBytesPtr(ctx, obj, ptr::null_mut()) as *const u8;
            if !data.is_null() && len > 0 {
                let offset = JSObjectGetTypedArrayByteOffset(ctx, obj, ptr::null_mut());
                bytes = std::slice::from_raw_parts(data.add(offset), len).to_vec();
            }
        }
    }
    let handler = call.state.borrow_mut().call.take();
    let Some(mut handler) = handler else {
        return call.throw("host calls are not available");
    };
    let answer = handler(&json, bytes);
    call.state.borrow_mut().call = Some(handler);
    match answer {
        // SAFETY: objects and values made in the call's live context.
        Ok((json, body)) => unsafe {
            let out = JSObjectMake(ctx, ptr::null_mut(), ptr::null_mut());
            set_property(ctx, out, "json", make_string(ctx, &json));
            set_property(ctx, out, "body", make_array_buffer(ctx, body));
            out
        },
        Err(error) => call.throw(&error.to_string()),
    }
}
