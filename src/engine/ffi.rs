//! Raw declarations of the JavaScriptCore C API (`JavaScriptCore/JavaScript.h`), limited to what
//! the engine uses, and of the few functions of the same library's GLib API and allocator
//! (libpas) it calls. `JSGlobalContextSetUnhandledRejectionCallback` is exported by the library
//! but declared only in its private headers.
//!
//! The library is not linked: it is opened at run time ([`super::library`]), by the processes
//! that run JavaScript only. Each function is declared once, in the list given to
//! `library_functions!` below, which makes from it both a field of [`Functions`] (the pointer
//! found in the library) and a function of the same name and signature that calls through it,
//! so that the engine's code reads as calls of the C API.
#![allow(non_camel_case_types, non_snake_case, dead_code)]

use std::ffi::{c_char, c_int, c_uint, c_void};

#[repr(C)]
pub struct OpaqueJSContext {
    _p: [u8; 0],
}
#[repr(C)]
pub struct OpaqueJSValue {
    _p: [u8; 0],
}
#[repr(C)]
pub struct OpaqueJSString {
    _p: [u8; 0],
}
#[repr(C)]
pub struct OpaqueJSClass {
    _p: [u8; 0],
}

pub type JSContextRef = *const OpaqueJSContext;
pub type JSGlobalContextRef = *mut OpaqueJSContext;
pub type JSValueRef = *const OpaqueJSValue;
pub type JSObjectRef = *mut OpaqueJSValue;
pub type JSStringRef = *mut OpaqueJSString;
pub type JSClassRef = *mut OpaqueJSClass;
pub type JSChar = u16;

pub type JSObjectCallAsFunctionCallback = unsafe extern "C" fn(
    ctx: JSContextRef,
    function: JSObjectRef,
    this_object: JSObjectRef,
    argument_count: usize,
    arguments: *const JSValueRef,
    exception: *mut JSValueRef,
) -> JSValueRef;

/// A class callback this engine never sets (its real signature does not matter here).
pub type UnusedClassCallback = Option<unsafe extern "C" fn()>;

/// `JSClassDefinition` (`JSObjectRef.h`, version 0): how objects of a class behave.
#[repr(C)]
pub struct JSClassDefinition {
    pub version: c_int,
    pub attributes: c_uint,
    pub class_name: *const c_char,
    pub parent_class: JSClassRef,
    pub static_values: *const c_void,
    pub static_functions: *const c_void,
    pub initialize: UnusedClassCallback,
    pub finalize: UnusedClassCallback,
    pub has_property: UnusedClassCallback,
    pub get_property: UnusedClassCallback,
    pub set_property: UnusedClassCallback,
    pub delete_property: UnusedClassCallback,
    pub get_property_names: UnusedClassCallback,
    pub call_as_function: Option<JSObjectCallAsFunctionCallback>,
    pub call_as_constructor: UnusedClassCallback,
    pub has_instance: UnusedClassCallback,
    pub convert_to_type: UnusedClassCallback,
}

impl JSClassDefinition {
    /// `kJSClassDefinitionEmpty`: no name, no parent, no callbacks.
    pub const EMPTY: JSClassDefinition = JSClassDefinition {
        version: 0,
        attributes: 0,
        class_name: std::ptr::null(),
        parent_class: std::ptr::null_mut(),
        static_values: std::ptr::null(),
        static_functions: std::ptr::null(),
        initialize: None,
        finalize: None,
        has_property: None,
        get_property: None,
        set_property: None,
        delete_property: None,
        get_property_names: None,
        call_as_function: None,
        call_as_constructor: None,
        has_instance: None,
        convert_to_type: None,
    };
}

pub type JSTypedArrayBytesDeallocator = unsafe extern "C" fn(bytes: *mut c_void, ctx: *mut c_void);

/// `JSTypedArrayType` values used here.
pub const K_JS_TYPED_ARRAY_TYPE_UINT8_ARRAY: u32 = 3;
pub const K_JS_TYPED_ARRAY_TYPE_ARRAY_BUFFER: u32 = 9;
pub const K_JS_TYPED_ARRAY_TYPE_NONE: u32 = 10;

/// `JSType` values.
pub const K_JS_TYPE_UNDEFINED: u32 = 0;
pub const K_JS_TYPE_NULL: u32 = 1;
pub const K_JS_TYPE_BOOLEAN: u32 = 2;
pub const K_JS_TYPE_NUMBER: u32 = 3;
pub const K_JS_TYPE_STRING: u32 = 4;
pub const K_JS_TYPE_OBJECT: u32 = 5;

/// Declares the library's functions (see the module's documentation): for each
/// `fn name(arg: Type, ...) -> Return;`, a field `name` of [`Functions`] and an `unsafe fn name`
/// that calls it. The library must be open ([`super::library::open`], which [`install`]s the
/// table) before the first call.
macro_rules! library_functions {
    ($(
        $(#[$doc:meta])*
        fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?;
    )*) => {
        /// The library's functions, found by name once, when it is opened.
        pub struct Functions {
            $($name: unsafe extern "C" fn($($ty),*) $(-> $ret)?,)*
        }

        impl Functions {
            /// Finds every function in `library`.
            ///
            /// Errors: the name of the first function the library does not export, with the
            /// loader's error.
            ///
            /// # Safety
            /// `library` is JavaScriptCore's (`javascriptcoregtk-4.1`), whose functions of
            /// these names have the C signatures declared here.
            pub(super) unsafe fn find(
                library: &libloading::os::unix::Library,
            ) -> Result<Self, (&'static str, libloading::Error)> {
                Ok(Self {
                    $($name: {
                        let name = concat!(stringify!($name), "\0").as_bytes();
                        // SAFETY: the caller vouches that the library's function of this name
                        // has this signature; the pointer is copied out of the symbol and
                        // stays valid while the library is open, which is for the process's
                        // life (`super::library`).
                        unsafe { *library.get(name).map_err(|e| (stringify!($name), e))? }
                    },)*
                })
            }
        }

        $(
            $(#[$doc])*
            #[inline]
            pub unsafe fn $name($($arg: $ty),*) $(-> $ret)? {
                // SAFETY: the caller upholds the C function's own contract; the pointer is the
                // library's function of this name (`Functions::find`).
                unsafe { (functions().$name)($($arg),*) }
            }
        )*
    };
}

/// The table the functions above call through, once the library is open.
static FUNCTIONS: std::sync::OnceLock<Functions> = std::sync::OnceLock::new();

/// Makes `found` the table the functions call through; a second table (a second opening of the
/// same library) is dropped.
pub(super) fn install(found: Functions) {
    let _ = FUNCTIONS.set(found);
}

/// The table.
///
/// Panics when the library is not open: the engine opens it before its first call
/// (`Engine::new`), so that would be this program's mistake, never an input's.
fn functions() -> &'static Functions {
    FUNCTIONS
        .get()
        .expect("the engine's library is opened before its first call (Engine::new)")
}

library_functions! {
    /// Sets a JavaScriptCore option (`JSC::Options`) by name; effective for contexts created
    /// afterwards. Returns whether the option exists and took the value. Public GLib API of
    /// the same library (`jsc/JSCOptions.h`).
    fn jsc_options_set_uint(option: *const c_char, value: c_uint) -> c_int;
    /// Reads a JavaScriptCore option into `value`; returns whether the option exists.
    fn jsc_options_get_uint(option: *const c_char, value: *mut c_uint) -> c_int;
    /// A full, synchronous garbage collection (JavaScriptCore's `JSBasePrivate.h`, exported
    /// by the GTK port); `JSGarbageCollect` only schedules one.
    fn JSSynchronousGarbageCollectForDebugging(ctx: JSContextRef);
    fn JSGlobalContextCreate(global_object_class: JSClassRef) -> JSGlobalContextRef;
    fn JSGlobalContextRelease(ctx: JSGlobalContextRef);
    fn JSContextGetGlobalObject(ctx: JSContextRef) -> JSObjectRef;
    fn JSGlobalContextSetUnhandledRejectionCallback(
        ctx: JSGlobalContextRef,
        function: JSObjectRef,
        exception: *mut JSValueRef,
    );

    fn JSEvaluateScript(
        ctx: JSContextRef,
        script: JSStringRef,
        this_object: JSObjectRef,
        source_url: JSStringRef,
        starting_line_number: i32,
        exception: *mut JSValueRef,
    ) -> JSValueRef;
    fn JSGarbageCollect(ctx: JSContextRef);

    fn JSStringCreateWithUTF8CString(string: *const c_char) -> JSStringRef;
    fn JSStringCreateWithCharacters(chars: *const JSChar, num_chars: usize) -> JSStringRef;
    fn JSStringRelease(string: JSStringRef);
    fn JSStringGetLength(string: JSStringRef) -> usize;
    fn JSStringGetCharactersPtr(string: JSStringRef) -> *const JSChar;

    fn JSValueGetType(ctx: JSContextRef, value: JSValueRef) -> u32;
    fn JSValueIsObject(ctx: JSContextRef, value: JSValueRef) -> bool;
    fn JSValueIsUndefined(ctx: JSContextRef, value: JSValueRef) -> bool;
    fn JSValueMakeUndefined(ctx: JSContextRef) -> JSValueRef;
    fn JSValueMakeNull(ctx: JSContextRef) -> JSValueRef;
    fn JSValueMakeBoolean(ctx: JSContextRef, boolean: bool) -> JSValueRef;
    fn JSValueMakeNumber(ctx: JSContextRef, number: f64) -> JSValueRef;
    fn JSValueMakeString(ctx: JSContextRef, string: JSStringRef) -> JSValueRef;
    fn JSValueToBoolean(ctx: JSContextRef, value: JSValueRef) -> bool;
    fn JSValueToNumber(ctx: JSContextRef, value: JSValueRef, exception: *mut JSValueRef)
        -> f64;
    fn JSValueToStringCopy(
        ctx: JSContextRef,
        value: JSValueRef,
        exception: *mut JSValueRef,
    ) -> JSStringRef;
    fn JSValueToObject(
        ctx: JSContextRef,
        value: JSValueRef,
        exception: *mut JSValueRef,
    ) -> JSObjectRef;
    fn JSValueProtect(ctx: JSContextRef, value: JSValueRef);
    fn JSValueUnprotect(ctx: JSContextRef, value: JSValueRef);
    fn JSValueGetTypedArrayType(
        ctx: JSContextRef,
        value: JSValueRef,
        exception: *mut JSValueRef,
    ) -> u32;

    fn JSClassCreate(definition: *const JSClassDefinition) -> JSClassRef;
    fn JSObjectMake(ctx: JSContextRef, js_class: JSClassRef, data: *mut c_void) -> JSObjectRef;
    fn JSObjectGetPrivate(object: JSObjectRef) -> *mut c_void;
    fn JSObjectSetPrototype(ctx: JSContextRef, object: JSObjectRef, value: JSValueRef);
    fn JSObjectMakeFunctionWithCallback(
        ctx: JSContextRef,
        name: JSStringRef,
        call_as_function: JSObjectCallAsFunctionCallback,
    ) -> JSObjectRef;
    fn JSObjectMakeError(
        ctx: JSContextRef,
        argument_count: usize,
        arguments: *const JSValueRef,
        exception: *mut JSValueRef,
    ) -> JSObjectRef;
    fn JSObjectGetProperty(
        ctx: JSContextRef,
        object: JSObjectRef,
        property_name: JSStringRef,
        exception: *mut JSValueRef,
    ) -> JSValueRef;
    fn JSObjectSetProperty(
        ctx: JSContextRef,
        object: JSObjectRef,
        property_name: JSStringRef,
        value: JSValueRef,
        attributes: u32,
        exception: *mut JSValueRef,
    );
    fn JSObjectIsFunction(ctx: JSContextRef, object: JSObjectRef) -> bool;
    fn JSObjectCallAsFunction(
        ctx: JSContextRef,
        object: JSObjectRef,
        this_object: JSObjectRef,
        argument_count: usize,
        arguments: *const JSValueRef,
        exception: *mut JSValueRef,
    ) -> JSValueRef;

    fn JSObjectMakeTypedArray(
        ctx: JSContextRef,
        array_type: u32,
        length: usize,
        exception: *mut JSValueRef,
    ) -> JSObjectRef;
    fn JSObjectMakeArrayBufferWithBytesNoCopy(
        ctx: JSContextRef,
        bytes: *mut c_void,
        byte_length: usize,
        bytes_deallocator: Option<JSTypedArrayBytesDeallocator>,
        deallocator_context: *mut c_void,
        exception: *mut JSValueRef,
    ) -> JSObjectRef;
    fn JSObjectGetTypedArrayBytesPtr(
        ctx: JSContextRef,
        object: JSObjectRef,
        exception: *mut JSValueRef,
    ) -> *mut c_void;
    fn JSObjectGetTypedArrayByteLength(
        ctx: JSContextRef,
        object: JSObjectRef,
        exception: *mut JSValueRef,
    ) -> usize;
    fn JSObjectGetTypedArrayByteOffset(
        ctx: JSContextRef,
        object: JSObjectRef,
        exception: *mut JSValueRef,
    ) -> usize;
    fn JSObjectGetArrayBufferBytesPtr(
        ctx: JSContextRef,
        object: JSObjectRef,
        exception: *mut JSValueRef,
    ) -> *mut c_void;
    fn JSObjectGetArrayBufferByteLength(
        ctx: JSContextRef,
        object: JSObjectRef,
        exception: *mut JSValueRef,
    ) -> usize;

    /// The library's version (`jsc/JSCVersion.h`), checked when it is opened.
    fn jsc_get_major_version() -> c_uint;
    fn jsc_get_minor_version() -> c_uint;

    /// Stops libpas's scavenger thread and waits until it has exited; the suspension is
    /// inherited by a forked child (`bmalloc/libpas/src/libpas/pas_scavenger.h`).
    fn pas_scavenger_suspend();
    /// Lets the scavenger run again (it starts its thread when there is work).
    fn pas_scavenger_resume();
    /// Returns libpas's free memory to the system now, on the calling thread.
    fn pas_scavenger_run_synchronously_now();
}
