//! The JavaScript engine seam: JavaScriptCore through its C API (DESIGN §2).
//!
//! Everything engine-specific lives in this module; the rest of the program sees [`Engine`]:
//! evaluate a script, hand it files, and drive its event loop until the awaited work settles.
//! A `deno_core`/V8 backend could later implement the same surface behind a cargo feature.

mod ffi;
mod host;
mod value;

use ffi::*;
use host::STATE;
pub use host::{CallHandler, EmitSink};
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
    #[error("unhandled promise rejection: {0}")]
    UnhandledRejection(String),
    /// Nothing is left to run (no timers) but the awaited work has not settled.
    #[error("the JavaScript event loop stalled: no pending timers and the work did not settle")]
    Stalled,
    /// The deadline passed before the work settled.
    #[error("deadline passed before the JavaScript work settled")]
    Deadline,
    /// JavaScriptCore could not create a context.
    #[error("JavaScriptCore could not create a context")]
    NoContext,
}

/// One JavaScriptCore global context with our host functions installed.
///
/// Not `Send`: host state is per thread, and a sandbox worker owns one engine on one thread.
pub struct Engine {
    ctx: JSGlobalContextRef,
    _not_send: std::marker::PhantomData<*mut ()>,
}

impl Engine {
    /// Creates a context, installs `__host` and the unhandled-rejection hook.
    ///
    /// Errors: [`EngineError::NoContext`] if JavaScriptCore fails to create one.
    pub fn new() -> Result<Self, EngineError> {
        // SAFETY: plain C API calls on a context we own for our lifetime.
        unsafe {
            let ctx = JSGlobalContextCreate(ptr::null_mut());
            if ctx.is_null() {
                return Err(EngineError::NoContext);
            }
            host::install(ctx);
            let global = JSContextGetGlobalObject(ctx);
            let host_obj = get_property(ctx, global, "__host") as JSObjectRef;
            let rejected = get_property(ctx, host_obj, "rejected") as JSObjectRef;
            JSGlobalContextSetUnhandledRejectionCallback(ctx, rejected, ptr::null_mut());
            Ok(Engine {
                ctx,
                _not_send: std::marker::PhantomData,
            })
        }
    }

    /// Serves `bytes` to JavaScript at virtual `path` (`__host.readFile`), without copying.
    pub fn add_static_file(&mut self, path: &str, bytes: &'static [u8]) {
        STATE.with(|s| s.borrow_mut().files.insert(path.to_owned(), bytes));
    }

    /// Serves owned `bytes` to JavaScript at virtual `path`, replacing any earlier file.
    pub fn add_file(&mut self, path: &str, bytes: Vec<u8>) {
        STATE.with(|s| s.borrow_mut().owned_files.insert(path.to_owned(), bytes));
    }

    /// Forgets the owned virtual files (after they were installed), freeing their memory.
    pub fn clear_files(&mut self) {
        STATE.with(|s| s.borrow_mut().owned_files.clear());
    }

    /// Sets where `__host.emit(text)` messages go.
    pub fn set_emit_sink(&mut self, sink: EmitSink) {
        STATE.with(|s| s.borrow_mut().emit = Some(sink));
    }

    /// Sets who answers `__host.call(name, json, bytes)`.
    pub fn set_call_handler(&mut self, handler: CallHandler) {
        STATE.with(|s| s.borrow_mut().call = Some(handler));
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
            if !exc.is_null() {
                let (message, stack) = describe_exception(self.ctx, exc);
                return Err(EngineError::Thrown { message, stack });
            }
            Ok(to_string(self.ctx, v).unwrap_or_default())
        }
    }

    /// Runs the event loop until JavaScript calls `__host.done(text)`, then returns `text`.
    ///
    /// Due timers run in order; between them the thread sleeps. Microtasks drain whenever a
    /// call into JavaScript returns. Errors: [`EngineError::Stalled`] if no timer is left and
    /// nothing settled, [`EngineError::Deadline`] past `deadline`,
    /// [`EngineError::UnhandledRejection`] for a rejection nothing handled.
    pub fn run_until_done(&mut self, deadline: Option<Instant>) -> Result<String, EngineError> {
        loop {
            if let Some(e) = STATE.with(|s| s.borrow_mut().rejections.pop()) {
                STATE.with(|s| s.borrow_mut().done = None);
                return Err(EngineError::UnhandledRejection(e));
            }
            if let Some(text) = STATE.with(|s| s.borrow_mut().done.take()) {
                return Ok(text);
            }
            let next = STATE.with(|s| s.borrow().timers.keys().next().copied());
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
            let timer = STATE.with(|s| {
                let mut s = s.borrow_mut();
                s.timer_due.remove(&id);
                s.timers.remove(&(due, id))
            });
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
