//! Host functions: the only native capabilities JavaScript gets (DESIGN §2).
//!
//! They live on one object, `__host`, that `js/bootstrap.js` wraps into the standard globals
//! Pyodide expects (`setTimeout`, `performance.now`, `crypto.getRandomValues`, `console`, …) and
//! then deletes. Everything else a browser or Node would offer is absent on purpose: no network,
//! no host files. State is thread-local because a sandbox worker owns exactly one context on
//! one thread and the C callbacks carry no user pointer.

use super::ffi::*;
use super::value::*;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::ptr;
use std::time::{Duration, Instant};

/// The bytes of an owned virtual file: read into memory, or a file mapped.
pub enum OwnedBytes {
    Read(Vec<u8>),
    Mapped(super::mapped::MappedFile),
}

/// Receives messages that JavaScript sends to the embedder with `__host.emit(text)`.
pub type EmitSink = Box<dyn FnMut(&str)>;

/// Answers synchronous requests JavaScript makes with `__host.call(name, json, bytes)`:
/// `(name, json, bytes)` in, `(json, bytes)` out, or an error message that becomes a JS `Error`.
pub type CallHandler = Box<dyn FnMut(&str, &str, Vec<u8>) -> Result<(String, Vec<u8>), String>>;

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
pub(crate) struct HostState {
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
    pub start: Option<Instant>,
}

thread_local! {
    pub(crate) static STATE: RefCell<HostState> = RefCell::new(HostState::default());
}

type Callback = JSObjectCallAsFunctionCallback;

/// Largest call id JavaScript can hold exactly (2^53 - 1).
const MAX_SAFE_ID: f64 = 9_007_199_254_740_991.0;

/// Longest timer delay (milliseconds): 2^31 - 1, the largest delay browsers and Node honour.
const MAX_TIMER_DELAY_MS: f64 = 2_147_483_647.0;

/// Installs `__host` on the global object of `ctx`.
///
/// # Safety
/// `ctx` must be a valid global context.
pub unsafe fn install(ctx: JSGlobalContextRef) {
    STATE.with(|s| s.borrow_mut().start = Some(Instant::now()));
    let global = JSContextGetGlobalObject(ctx);
    let host = JSObjectMake(ctx, ptr::null_mut(), ptr::null_mut());
    let functions: [(&str, Callback); 9] = [
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
    for (name, cb) in functions {
        let n = JsString::name(name);
        let f = JSObjectMakeFunctionWithCallback(ctx, n.0, cb);
        set_property(ctx, host, name, f);
    }
    set_property(ctx, global, "__host", host);
}

unsafe fn arg(args: *const JSValueRef, count: usize, i: usize, ctx: JSContextRef) -> JSValueRef {
    if i < count {
        *args.add(i)
    } else {
        JSValueMakeUndefined(ctx)
    }
}

unsafe fn throw(ctx: JSContextRef, exception: *mut JSValueRef, msg: &str) -> JSValueRef {
    if !exception.is_null() {
        *exception = make_error(ctx, msg);
    }
    JSValueMakeUndefined(ctx)
}

/// `__host.now()`: milliseconds (fractional) since the engine started, monotonic.
unsafe extern "C" fn host_now(
    ctx: JSContextRef,
    _f: JSObjectRef,
    _this: JSObjectRef,
    _argc: usize,
    _argv: *const JSValueRef,
    _exc: *mut JSValueRef,
) -> JSValueRef {
    let ms = STATE.with(|s| {
        s.borrow()
            .start
            .map(|t| t.elapsed().as_secs_f64() * 1000.0)
            .unwrap_or(0.0)
    });
    JSValueMakeNumber(ctx, ms)
}

/// `__host.setTimer(fn, ms) -> id`: runs `fn` once after `ms` milliseconds.
unsafe extern "C" fn host_set_timer(
    ctx: JSContextRef,
    _f: JSObjectRef,
    _this: JSObjectRef,
    argc: usize,
    argv: *const JSValueRef,
    exc: *mut JSValueRef,
) -> JSValueRef {
    let cb = arg(argv, argc, 0, ctx);
    if !JSValueIsObject(ctx, cb) || !JSObjectIsFunction(ctx, cb as JSObjectRef) {
        return throw(ctx, exc, "setTimer: callback is not a function");
    }
    let ms = JSValueToNumber(ctx, arg(argv, argc, 1, ctx), ptr::null_mut());
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
    JSValueProtect(ctx, cb);
    let id = STATE.with(|s| {
        let mut s = s.borrow_mut();
        s.next_timer += 1;
        let id = s.next_timer;
        s.timers.insert(
            (due, id),
            Timer {
                callback: cb as JSObjectRef,
            },
        );
        s.timer_due.insert(id, due);
        id
    });
    JSValueMakeNumber(ctx, id as f64)
}

/// `__host.clearTimer(id)`: cancels a pending timer; unknown ids are ignored.
unsafe extern "C" fn host_clear_timer(
    ctx: JSContextRef,
    _f: JSObjectRef,
    _this: JSObjectRef,
    argc: usize,
    argv: *const JSValueRef,
    _exc: *mut JSValueRef,
) -> JSValueRef {
    let id = JSValueToNumber(ctx, arg(argv, argc, 0, ctx), ptr::null_mut());
    if id.is_finite() && id >= 0.0 {
        let id = id as u64;
        let timer = STATE.with(|s| {
            let mut s = s.borrow_mut();
            let due = s.timer_due.remove(&id)?;
            s.timers.remove(&(due, id))
        });
        if let Some(t) = timer {
            JSValueUnprotect(ctx, t.callback);
        }
    }
    JSValueMakeUndefined(ctx)
}

/// `__host.randomBytes(n) -> ArrayBuffer`: `n` bytes (at most 65536) from the OS.
unsafe extern "C" fn host_random_bytes(
    ctx: JSContextRef,
    _f: JSObjectRef,
    _this: JSObjectRef,
    argc: usize,
    argv: *const JSValueRef,
    exc: *mut JSValueRef,
) -> JSValueRef {
    let n = JSValueToNumber(ctx, arg(argv, argc, 0, ctx), ptr::null_mut());
    if !(0.0..=65536.0).contains(&n) {
        return throw(ctx, exc, "randomBytes: length must be between 0 and 65536");
    }
    let mut buf = vec![0u8; n as usize];
    if let Err(e) = getrandom::fill(&mut buf) {
        return throw(
            ctx,
            exc,
            &format!("randomBytes: the OS gave no randomness: {e}"),
        );
    }
    make_array_buffer(ctx, buf)
}

/// `__host.readFile(path) -> ArrayBuffer`: a copy of a virtual file; throws if absent.
unsafe extern "C" fn host_read_file(
    ctx: JSContextRef,
    _f: JSObjectRef,
    _this: JSObjectRef,
    argc: usize,
    argv: *const JSValueRef,
    exc: *mut JSValueRef,
) -> JSValueRef {
    let path = to_string(ctx, arg(argv, argc, 0, ctx)).unwrap_or_default();
    // A static file is copied (its bytes are read-only, and JavaScript may write to the
    // buffer); an owned one is handed over (`Engine::add_file`: read once).
    let bytes = STATE.with(|s| {
        let mut s = s.borrow_mut();
        match s.files.get(&path) {
            Some(b) => Some(OwnedBytes::Read(b.to_vec())),
            None => s.owned_files.remove(&path),
        }
    });
    match bytes {
        Some(OwnedBytes::Read(b)) => make_array_buffer(ctx, b),
        Some(OwnedBytes::Mapped(m)) => make_mapped_array_buffer(ctx, m),
        None => throw(ctx, exc, &format!("No such file: {path}")),
    }
}

/// `__host.emit(text)`: hands a message to the embedder (streamed output, events).
unsafe extern "C" fn host_emit(
    ctx: JSContextRef,
    _f: JSObjectRef,
    _this: JSObjectRef,
    argc: usize,
    argv: *const JSValueRef,
    _exc: *mut JSValueRef,
) -> JSValueRef {
    let text = to_string(ctx, arg(argv, argc, 0, ctx)).unwrap_or_default();
    // Take the sink out while calling it so that it may not re-enter the state.
    let sink = STATE.with(|s| s.borrow_mut().emit.take());
    if let Some(mut sink) = sink {
        sink(&text);
        STATE.with(|s| s.borrow_mut().emit = Some(sink));
    }
    JSValueMakeUndefined(ctx)
}

/// `__host.done(id, text)`: the work of call `id` settled with `text` (see
/// `Engine::run_until_done`).
unsafe extern "C" fn host_done(
    ctx: JSContextRef,
    _f: JSObjectRef,
    _this: JSObjectRef,
    argc: usize,
    argv: *const JSValueRef,
    exc: *mut JSValueRef,
) -> JSValueRef {
    let id = JSValueToNumber(ctx, arg(argv, argc, 0, ctx), ptr::null_mut());
    if !(0.0..=MAX_SAFE_ID).contains(&id) {
        return throw(ctx, exc, "done: the call id must be a non-negative integer");
    }
    let text = to_string(ctx, arg(argv, argc, 1, ctx)).unwrap_or_default();
    STATE.with(|s| s.borrow_mut().done = Some((id as u64, text)));
    JSValueMakeUndefined(ctx)
}

/// Unhandled-rejection callback `(promise, reason)`: recorded so that a failure inside a promise
/// chain surfaces as an error instead of looking like a hang (DESIGN §2).
unsafe extern "C" fn host_rejected(
    ctx: JSContextRef,
    _f: JSObjectRef,
    _this: JSObjectRef,
    argc: usize,
    argv: *const JSValueRef,
    _exc: *mut JSValueRef,
) -> JSValueRef {
    let reason = arg(argv, argc, 1, ctx);
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
    let rejection = Rejection {
        text,
        fatal,
        exit_status,
    };
    STATE.with(|s| s.borrow_mut().rejections.push(rejection));
    JSValueMakeUndefined(ctx)
}

/// `__host.call(name, json, bytes?) -> {json, body: ArrayBuffer}`: a synchronous request to the
/// embedder (used for `fetch`, which the front performs under its network policy). `bytes`
/// must be a `Uint8Array` that JavaScript created for this call (never a view of WebAssembly
/// memory, whose buffer must not be pinned).
unsafe extern "C" fn host_call(
    ctx: JSContextRef,
    _f: JSObjectRef,
    _this: JSObjectRef,
    argc: usize,
    argv: *const JSValueRef,
    exc: *mut JSValueRef,
) -> JSValueRef {
    let name = to_string(ctx, arg(argv, argc, 0, ctx)).unwrap_or_default();
    let json = to_string(ctx, arg(argv, argc, 1, ctx)).unwrap_or_default();
    let bytes_arg = arg(argv, argc, 2, ctx);
    let mut bytes = Vec::new();
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
    let handler = STATE.with(|s| s.borrow_mut().call.take());
    let Some(mut handler) = handler else {
        return throw(ctx, exc, "host calls are not available");
    };
    let answer = handler(&name, &json, bytes);
    STATE.with(|s| s.borrow_mut().call = Some(handler));
    match answer {
        Ok((json, body)) => {
            let out = JSObjectMake(ctx, ptr::null_mut(), ptr::null_mut());
            set_property(ctx, out, "json", make_string(ctx, &json));
            set_property(ctx, out, "body", make_array_buffer(ctx, body));
            out
        }
        Err(msg) => throw(ctx, exc, &msg),
    }
}
