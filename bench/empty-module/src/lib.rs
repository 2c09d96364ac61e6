//! An Envoy 1.40 dynamic-module HTTP filter that does nothing: every hook Envoy looks up is
//! exported, every one continues at once and calls nothing back. What Envoy spends on it is what
//! any dynamic-module filter costs per request (Envoy's per-stream filter object and one call per
//! hook), the floor for skewgate's native filter as `bench/empty-filter` is for the wasm one.
//!
//! No pointer Envoy passes is read, so there is no `unsafe` block; `#[no_mangle]` is the only
//! thing the `unsafe_code` lint would name, and it is what a dynamic module is.
#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_void, CStr};

/// The ABI Envoy 1.40 speaks (`abi_version.h`): Envoy refuses a module that names another.
const ABI_VERSION: &CStr = c"v0.2.0";
/// `envoy_dynamic_module_type_on_http_filter_*_status`: continue, for every phase.
const CONTINUE: c_int = 0;

/// A configuration and every stream are this one byte: Envoy wants a non-null pointer back and
/// never reads it.
static NOTHING: u8 = 0;

fn nothing() -> *const c_void {
    std::ptr::addr_of!(NOTHING).cast()
}

type Ptr = *const c_void;

/// `envoy_dynamic_module_type_envoy_buffer`.
#[repr(C)]
pub struct EnvoyBuffer {
    ptr: *const c_char,
    length: usize,
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const c_char {
    ABI_VERSION.as_ptr()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    _: Ptr,
    _: EnvoyBuffer,
    _: EnvoyBuffer,
) -> Ptr {
    nothing()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(_: Ptr) {}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_new(
    _: EnvoyBuffer,
    _: EnvoyBuffer,
) -> Ptr {
    std::ptr::null()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_destroy(_: Ptr) {}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_new(_: Ptr, _: Ptr) -> Ptr {
    nothing()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_destroy(_: Ptr) {}

/// The six stream phases that return a status: headers and bodies take `end_of_stream`.
macro_rules! continue_hooks {
    ($($name:ident ($($arg:ty),*);)*) => {$(
        #[no_mangle]
        pub extern "C" fn $name(_: Ptr, _: Ptr $(, _: $arg)*) -> c_int {
            CONTINUE
        }
    )*};
}

continue_hooks! {
    envoy_dynamic_module_on_http_filter_request_headers(bool);
    envoy_dynamic_module_on_http_filter_request_body(bool);
    envoy_dynamic_module_on_http_filter_request_trailers();
    envoy_dynamic_module_on_http_filter_response_headers(bool);
    envoy_dynamic_module_on_http_filter_response_body(bool);
    envoy_dynamic_module_on_http_filter_response_trailers();
    envoy_dynamic_module_on_http_filter_local_reply(u32, EnvoyBuffer, bool);
}

/// The hooks that return nothing, with the arguments `abi.h` gives them (none is called for a
/// filter that starts no callout, stream or timer; they must exist for Envoy to load it).
macro_rules! silent_hooks {
    ($($name:ident ($($arg:ty),*);)*) => {$(
        #[no_mangle]
        pub extern "C" fn $name(_: Ptr, _: Ptr $(, _: $arg)*) {}
    )*};
}

/// `envoy_dynamic_module_type_envoy_http_header`.
#[repr(C)]
pub struct EnvoyHeader {
    key: EnvoyBuffer,
    value: EnvoyBuffer,
}

silent_hooks! {
    envoy_dynamic_module_on_http_filter_stream_complete();
    envoy_dynamic_module_on_http_filter_scheduled(u64);
    envoy_dynamic_module_on_http_filter_config_scheduled(u64);
    envoy_dynamic_module_on_http_filter_http_callout_done(u64, c_int, *mut EnvoyHeader, usize, *mut EnvoyBuffer, usize);
    envoy_dynamic_module_on_http_filter_config_http_callout_done(u64, c_int, *mut EnvoyHeader, usize, *mut EnvoyBuffer, usize);
    envoy_dynamic_module_on_http_filter_http_stream_headers(u64, *mut EnvoyHeader, usize, bool);
    envoy_dynamic_module_on_http_filter_http_stream_data(u64, *const EnvoyBuffer, usize, bool);
    envoy_dynamic_module_on_http_filter_http_stream_trailers(u64, *mut EnvoyHeader, usize);
    envoy_dynamic_module_on_http_filter_http_stream_complete(u64);
    envoy_dynamic_module_on_http_filter_http_stream_reset(u64, c_int);
    envoy_dynamic_module_on_http_filter_config_http_stream_headers(u64, *mut EnvoyHeader, usize, bool);
    envoy_dynamic_module_on_http_filter_config_http_stream_data(u64, *const EnvoyBuffer, usize, bool);
    envoy_dynamic_module_on_http_filter_config_http_stream_trailers(u64, *mut EnvoyHeader, usize);
    envoy_dynamic_module_on_http_filter_config_http_stream_complete(u64);
    envoy_dynamic_module_on_http_filter_config_http_stream_reset(u64, c_int);
    envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark();
    envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark();
}
