//! Raw declarations of the JavaScriptCore C API (`JavaScriptCore/JavaScript.h`), limited to what
//! the engine uses. Linked by `build.rs` (pkg-config `javascriptcoregtk-4.1`, or the macOS
//! framework). `JSGlobalContextSetUnhandledRejectionCallback` is exported by the library but
//! declared only in its private headers.
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

extern "C" {
    /// Sets a JavaScriptCore option (`JSC::Options`) by name; effective for contexts created
    /// afterwards. Returns whether the option exists and took the value. Public GLib API of
    /// the same library (`jsc/JSCOptions.h`).
    pub fn jsc_options_set_uint(option: *const c_char, value: c_uint) -> c_int;
    /// Reads a JavaScriptCore option into `value`; returns whether the option exists.
    pub fn jsc_options_get_uint(option: *const c_char, value: *mut c_uint) -> c_int;
    /// A full, synchronous garbage collection (JavaScriptCore's `JSBasePrivate.h`, exported
    /// by the GTK port); `JSGarbageCollect` only schedules one.
    pub fn JSSynchronousGarbageCollectForDebugging(ctx: JSContextRef);
    pub fn JSGlobalContextCreate(global_object_class: JSClassRef) -> JSGlobalContextRef;
    pub fn JSGlobalContextRelease(ctx: JSGlobalContextRef);
    pub fn JSContextGetGlobalObject(ctx: JSContextRef) -> JSObjectRef;
    pub fn JSGlobalContextSetUnhandledRejectionCallback(
        ctx: JSGlobalContextRef,
        function: JSObjectRef,
        exception: *mut JSValueRef,
    );

    pub fn JSEvaluateScript(
        ctx: JSContextRef,
        script: JSStringRef,
        this_object: JSObjectRef,
        source_url: JSStringRef,
        starting_line_number: i32,
        exception: *mut JSValueRef,
    ) -> JSValueRef;
    pub fn JSGarbageCollect(ctx: JSContextRef);

    pub fn JSStringCreateWithUTF8CString(string: *const c_char) -> JSStringRef;
    pub fn JSStringCreateWithCharacters(chars: *const JSChar, num_chars: usize) -> JSStringRef;
    pub fn JSStringRelease(string: JSStringRef);
    pub fn JSStringGetLength(string: JSStringRef) -> usize;
    pub fn JSStringGetCharactersPtr(string: JSStringRef) -> *const JSChar;

    pub fn JSValueGetType(ctx: JSContextRef, value: JSValueRef) -> u32;
    pub fn JSValueIsObject(ctx: JSContextRef, value: JSValueRef) -> bool;
    pub fn JSValueIsUndefined(ctx: JSContextRef, value: JSValueRef) -> bool;
    pub fn JSValueMakeUndefined(ctx: JSContextRef) -> JSValueRef;
    pub fn JSValueMakeNull(ctx: JSContextRef) -> JSValueRef;
    pub fn JSValueMakeBoolean(ctx: JSContextRef, boolean: bool) -> JSValueRef;
    pub fn JSValueMakeNumber(ctx: JSContextRef, number: f64) -> JSValueRef;
    pub fn JSValueMakeString(ctx: JSContextRef, string: JSStringRef) -> JSValueRef;
    pub fn JSValueToBoolean(ctx: JSContextRef, value: JSValueRef) -> bool;
    pub fn JSValueToNumber(ctx: JSContextRef, value: JSValueRef, exception: *mut JSValueRef)
        -> f64;
    pub fn JSValueToStringCopy(
        ctx: JSContextRef,
        value: JSValueRef,
        exception: *mut JSValueRef,
    ) -> JSStringRef;
    pub fn JSValueToObject(
        ctx: JSContextRef,
        value: JSValueRef,
        exception: *mut JSValueRef,
    ) -> JSObjectRef;
    pub fn JSValueProtect(ctx: JSContextRef, value: JSValueRef);
    pub fn JSValueUnprotect(ctx: JSContextRef, value: JSValueRef);
    pub fn JSValueGetTypedArrayType(
        ctx: JSContextRef,
        value: JSValueRef,
        exception: *mut JSValueRef,
    ) -> u32;

    pub fn JSClassCreate(definition: *const JSClassDefinition) -> JSClassRef;
    pub fn JSObjectMake(ctx: JSContextRef, js_class: JSClassRef, data: *mut c_void) -> JSObjectRef;
    pub fn JSObjectGetPrivate(object: JSObjectRef) -> *mut c_void;
    pub fn JSObjectSetPrototype(ctx: JSContextRef, object: JSObjectRef, value: JSValueRef);
    pub fn JSObjectMakeFunctionWithCallback(
        ctx: JSContextRef,
        name: JSStringRef,
        call_as_function: JSObjectCallAsFunctionCallback,
    ) -> JSObjectRef;
    pub fn JSObjectMakeError(
        ctx: JSContextRef,
        argument_count: usize,
        arguments: *const JSValueRef,
        exception: *mut JSValueRef,
    ) -> JSObjectRef;
    pub fn JSObjectGetProperty(
        ctx: JSContextRef,
        object: JSObjectRef,
        property_name: JSStringRef,
        exception: *mut JSValueRef,
    ) -> JSValueRef;
    pub fn JSObjectSetProperty(
        ctx: JSContextRef,
        object: JSObjectRef,
        property_name: JSStringRef,
        value: JSValueRef,
        attributes: u32,
        exception: *mut JSValueRef,
    );
    pub fn JSObjectIsFunction(ctx: JSContextRef, object: JSObjectRef) -> bool;
    pub fn JSObjectCallAsFunction(
        ctx: JSContextRef,
        object: JSObjectRef,
        this_object: JSObjectRef,
        argument_count: usize,
        arguments: *const JSValueRef,
        exception: *mut JSValueRef,
    ) -> JSValueRef;

    pub fn JSObjectMakeTypedArray(
        ctx: JSContextRef,
        array_type: u32,
        length: usize,
        exception: *mut JSValueRef,
    ) -> JSObjectRef;
    pub fn JSObjectMakeArrayBufferWithBytesNoCopy(
        ctx: JSContextRef,
        bytes: *mut c_void,
        byte_length: usize,
        bytes_deallocator: Option<JSTypedArrayBytesDeallocator>,
        deallocator_context: *mut c_void,
        exception: *mut JSValueRef,
    ) -> JSObjectRef;
    pub fn JSObjectGetTypedArrayBytesPtr(
        ctx: JSContextRef,
        object: JSObjectRef,
        exception: *mut JSValueRef,
    ) -> *mut c_void;
    pub fn JSObjectGetTypedArrayByteLength(
        ctx: JSContextRef,
        object: JSObjectRef,
        exception: *mut JSValueRef,
    ) -> usize;
    pub fn JSObjectGetTypedArrayByteOffset(
        ctx: JSContextRef,
        object: JSObjectRef,
        exception: *mut JSValueRef,
    ) -> usize;
    pub fn JSObjectGetArrayBufferBytesPtr(
        ctx: JSContextRef,
        object: JSObjectRef,
        exception: *mut JSValueRef,
    ) -> *mut c_void;
    pub fn JSObjectGetArrayBufferByteLength(
        ctx: JSContextRef,
        object: JSObjectRef,
        exception: *mut JSValueRef,
    ) -> usize;
}
