//! Conversions between Rust and JavaScriptCore values (strings, numbers, byte buffers, errors).

use super::ffi::*;
use std::ffi::{c_void, CString};
use std::ptr;

/// An owned `JSStringRef`, released on drop.
pub struct JsString(pub JSStringRef);

impl JsString {
    /// Creates a JS string from Rust text (UTF-16 internally, so any `&str` is accepted).
    pub fn new(s: &str) -> Self {
        let utf16: Vec<u16> = s.encode_utf16().collect();
        // SAFETY: the pointer and length describe `utf16`, which JSC copies.
        JsString(unsafe { JSStringCreateWithCharacters(utf16.as_ptr(), utf16.len()) })
    }

    /// Creates a JS string from a NUL-free ASCII name (property names).
    pub fn name(s: &str) -> Self {
        let c = CString::new(s).expect("property names contain no NUL");
        // SAFETY: `c` is a valid C string for the duration of the call.
        JsString(unsafe { JSStringCreateWithUTF8CString(c.as_ptr()) })
    }

    /// The text of a `JSStringRef` that the caller still owns.
    ///
    /// # Safety
    /// `s` must be a valid `JSStringRef`.
    pub unsafe fn to_rust(s: JSStringRef) -> String {
        // SAFETY: the caller promises a valid string; its characters are read within its length.
        unsafe {
            let len = JSStringGetLength(s);
            let chars = JSStringGetCharactersPtr(s);
            if len == 0 || chars.is_null() {
                return String::new();
            }
            String::from_utf16_lossy(std::slice::from_raw_parts(chars, len))
        }
    }
}

impl Drop for JsString {
    fn drop(&mut self) {
        // SAFETY: we own one reference to this string.
        unsafe { JSStringRelease(self.0) }
    }
}

/// `String(value)` in JavaScript; `None` if the conversion itself threw.
///
/// # Safety
/// `ctx` and `value` must be valid.
pub unsafe fn to_string(ctx: JSContextRef, value: JSValueRef) -> Option<String> {
    // SAFETY: the caller promises valid handles (# Safety); only they and values made
    // from them are used.
    unsafe {
        let mut exc: JSValueRef = ptr::null();
        let s = JSValueToStringCopy(ctx, value, &mut exc);
        if s.is_null() || !exc.is_null() {
            return None;
        }
        let out = JsString::to_rust(s);
        JSStringRelease(s);
        Some(out)
    }
}

/// Reads `object[name]`, or `undefined`.
///
/// # Safety
/// `ctx` and `object` must be valid.
pub unsafe fn get_property(ctx: JSContextRef, object: JSObjectRef, name: &str) -> JSValueRef {
    // SAFETY: the caller promises valid handles (# Safety); only they and values made
    // from them are used.
    unsafe {
        let key = JsString::name(name);
        let mut exc: JSValueRef = ptr::null();
        let v = JSObjectGetProperty(ctx, object, key.0, &mut exc);
        if v.is_null() || !exc.is_null() {
            JSValueMakeUndefined(ctx)
        } else {
            v
        }
    }
}

/// Sets `object[name] = value` (plain data property).
///
/// # Safety
/// `ctx`, `object` and `value` must be valid.
pub unsafe fn set_property(ctx: JSContextRef, object: JSObjectRef, name: &str, value: JSValueRef) {
    // SAFETY: the caller promises valid handles (# Safety); only they and values made
    // from them are used.
    unsafe {
        let key = JsString::name(name);
        JSObjectSetProperty(ctx, object, key.0, value, 0, ptr::null_mut());
    }
}

/// Makes a JS string value.
///
/// # Safety
/// `ctx` must be valid.
pub unsafe fn make_string(ctx: JSContextRef, s: &str) -> JSValueRef {
    // SAFETY: the caller promises valid handles (# Safety); only they and values made
    // from them are used.
    unsafe {
        let js = JsString::new(s);
        JSValueMakeString(ctx, js.0)
    }
}

/// Describes a thrown JavaScript value as text: `String(e)` followed by its `stack`, if any.
///
/// # Safety
/// `ctx` and `exception` must be valid.
pub unsafe fn describe_exception(ctx: JSContextRef, exception: JSValueRef) -> (String, String) {
    // SAFETY: the caller promises valid handles (# Safety); only they and values made
    // from them are used.
    unsafe {
        let message = to_string(ctx, exception).unwrap_or_else(|| "<unprintable exception>".into());
        let mut stack = String::new();
        if JSValueIsObject(ctx, exception) {
            let obj = JSValueToObject(ctx, exception, ptr::null_mut());
            let s = get_property(ctx, obj, "stack");
            if !JSValueIsUndefined(ctx, s) {
                stack = to_string(ctx, s).unwrap_or_default();
            }
        }
        (message, stack)
    }
}

/// Makes a JS `Error` with `message`, for throwing from ops.
///
/// # Safety
/// `ctx` must be valid.
pub unsafe fn make_error(ctx: JSContextRef, message: &str) -> JSValueRef {
    // SAFETY: the caller promises valid handles (# Safety); only they and values made
    // from them are used.
    unsafe {
        let arg = make_string(ctx, message);
        JSObjectMakeError(ctx, 1, &arg, ptr::null_mut())
    }
}

unsafe extern "C" fn free_vec(bytes: *mut c_void, ctx: *mut c_void) {
    // SAFETY: JavaScriptCore calls this once, with the boxed slice and the length that
    // `make_array_buffer` handed over.
    unsafe {
        // Rebuild the boxed slice handed over in `make_array_buffer`.
        let len = ctx as usize;
        drop(Box::from_raw(ptr::slice_from_raw_parts_mut(
            bytes as *mut u8,
            len,
        )));
    }
}

/// Rebuilds the box of a [`super::mapped::MappedFile`] handed over in
/// [`make_mapped_array_buffer`] and drops it (unmapping the file).
unsafe extern "C" fn free_mapping(_bytes: *mut c_void, ctx: *mut c_void) {
    // SAFETY: JavaScriptCore calls this once, with the box `make_mapped_array_buffer` handed over.
    unsafe {
        drop(Box::from_raw(ctx as *mut super::mapped::MappedFile));
    }
}

/// Moves `mapped` into a new `ArrayBuffer` over its pages; JSC unmaps them when collected.
///
/// # Safety
/// `ctx` must be valid.
pub unsafe fn make_mapped_array_buffer(
    ctx: JSContextRef,
    mapped: super::mapped::MappedFile,
) -> JSValueRef {
    // SAFETY: the caller promises valid handles (# Safety); only they and values made
    // from them are used.
    unsafe {
        let (start, len) = mapped.as_raw();
        let owner = Box::into_raw(Box::new(mapped)) as *mut c_void;
        JSObjectMakeArrayBufferWithBytesNoCopy(
            ctx,
            start,
            len,
            Some(free_mapping),
            owner,
            ptr::null_mut(),
        )
    }
}

/// Moves `bytes` into a new `ArrayBuffer` without copying; JSC frees them when collected.
///
/// # Safety
/// `ctx` must be valid.
pub unsafe fn make_array_buffer(ctx: JSContextRef, bytes: Vec<u8>) -> JSValueRef {
    // SAFETY: the caller promises valid handles (# Safety); only they and values made
    // from them are used.
    unsafe {
        let boxed = bytes.into_boxed_slice();
        let len = boxed.len();
        if len == 0 {
            // A zero-length buffer needs no backing store.
            let empty = JsString::new("new ArrayBuffer(0)");
            return JSEvaluateScript(
                ctx,
                empty.0,
                ptr::null_mut(),
                ptr::null_mut(),
                1,
                ptr::null_mut(),
            );
        }
        let raw = Box::into_raw(boxed) as *mut u8;
        JSObjectMakeArrayBufferWithBytesNoCopy(
            ctx,
            raw as *mut c_void,
            len,
            Some(free_vec),
            len as *mut c_void,
            ptr::null_mut(),
        )
    }
}
