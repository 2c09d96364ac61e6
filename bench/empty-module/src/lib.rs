//! An Envoy 1.40 dynamic-module HTTP filter that does nothing: every hook Envoy looks up is
//! exported, every one continues at once and calls nothing back. What Envoy spends on it is what
//! any dynamic-module filter costs per request (Envoy's per-stream filter object and one call per
//! hook), the floor for skewgate's native filter as `bench/empty-filter` is for the wasm one.
//!
//! Built with `--features design-floor` it does, and only does, the host calls skewgate's
//! design needs for a local GET, with no decision of its own: it reads the request's headers
//! (Envoy's views, not copied), sets the routing header to the local apiserver's cluster and
//! makes Envoy match the route again, and reads the response's `:status`. What Envoy spends on
//! that build is the floor for skewgate's native filter on a local GET, however cheap its own
//! decisions were.
//!
//! Built with `--features read-floor` it reads the same headers and `:status` but writes
//! nothing: the floor of a design in which Envoy routes a local GET without the filter setting
//! the routing header (the client sends it in the benchmark, as for the empty build).
//!
//! The empty build reads no pointer Envoy passes, so has no `unsafe` block; `#[no_mangle]` is
//! the only thing the `unsafe_code` lint would name, and it is what a dynamic module is. The
//! design-floor build's calls into Envoy are in [`design_floor`], each with its invariant.
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

#[cfg(not(feature = "design-floor"))]
continue_hooks! {
    envoy_dynamic_module_on_http_filter_request_headers(bool);
    envoy_dynamic_module_on_http_filter_response_headers(bool);
}

continue_hooks! {
    envoy_dynamic_module_on_http_filter_request_body(bool);
    envoy_dynamic_module_on_http_filter_request_trailers();
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

/// The host calls a skewgate-like filter cannot do without on a local GET (the
/// `design-floor` build), declared from Envoy 1.40's `abi.h`; Envoy's executable exports them.
#[cfg(feature = "design-floor")]
mod design_floor {
    use super::{EnvoyBuffer, EnvoyHeader, Ptr, CONTINUE};
    use std::ffi::{c_char, c_int};

    /// `envoy_dynamic_module_type_module_buffer`.
    #[repr(C)]
    struct ModuleBuffer {
        ptr: *const c_char,
        length: usize,
    }

    impl ModuleBuffer {
        fn of(bytes: &'static [u8]) -> ModuleBuffer {
            ModuleBuffer {
                ptr: bytes.as_ptr().cast(),
                length: bytes.len(),
            }
        }
    }

    /// `envoy_dynamic_module_type_http_header_type`: request and response headers.
    const REQUEST: c_int = 0;
    const RESPONSE: c_int = 2;
    /// As the native filter: Envoy's views of up to this many headers go on the stack.
    const SMALL_HEADER_COUNT: usize = 64;
    /// A view for Envoy to fill in.
    const UNSET: EnvoyBuffer = EnvoyBuffer {
        ptr: std::ptr::null(),
        length: 0,
    };

    extern "C" {
        fn envoy_dynamic_module_callback_http_get_headers_size(filter: Ptr, map: c_int) -> usize;
        fn envoy_dynamic_module_callback_http_get_headers(
            filter: Ptr,
            map: c_int,
            headers: *mut EnvoyHeader,
        ) -> bool;
        fn envoy_dynamic_module_callback_http_get_header(
            filter: Ptr,
            map: c_int,
            name: ModuleBuffer,
            value: *mut EnvoyBuffer,
            index: usize,
            count: *mut usize,
        ) -> bool;
        #[cfg(not(feature = "read-floor"))]
        fn envoy_dynamic_module_callback_http_set_header(
            filter: Ptr,
            map: c_int,
            name: ModuleBuffer,
            value: ModuleBuffer,
        ) -> bool;
        #[cfg(not(feature = "read-floor"))]
        fn envoy_dynamic_module_callback_http_clear_route_cache(filter: Ptr);
    }

    /// Reads every request header (views), routes to the local apiserver's cluster.
    #[no_mangle]
    pub extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
        filter: Ptr,
        _: Ptr,
        _: bool,
    ) -> c_int {
        // SAFETY: `filter` is the stream's filter Envoy passed to this hook.
        let count = unsafe { envoy_dynamic_module_callback_http_get_headers_size(filter, REQUEST) };
        if count <= SMALL_HEADER_COUNT {
            let mut views = [const {
                EnvoyHeader {
                    key: UNSET,
                    value: UNSET,
                }
            }; SMALL_HEADER_COUNT];
            // SAFETY: `views` has room for `count` headers, the number Envoy just gave.
            unsafe {
                envoy_dynamic_module_callback_http_get_headers(filter, REQUEST, views.as_mut_ptr())
            };
            // What a filter does with them at the least: look at every name once.
            let names: usize = views.iter().take(count).map(|h| h.key.length).sum();
            std::hint::black_box(names);
        }
        #[cfg(not(feature = "read-floor"))]
        // SAFETY: both buffers are static; Envoy copies them.
        unsafe {
            envoy_dynamic_module_callback_http_set_header(
                filter,
                REQUEST,
                ModuleBuffer::of(b"x-skewgate-upstream-cluster"),
                ModuleBuffer::of(b"skewgate-local-anonymous"),
            )
        };
        #[cfg(not(feature = "read-floor"))]
        // SAFETY: `filter` is the stream's filter Envoy passed to this hook.
        unsafe {
            envoy_dynamic_module_callback_http_clear_route_cache(filter)
        };
        CONTINUE
    }

    /// Reads the response's status, as the 404 safety net must.
    #[no_mangle]
    pub extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
        filter: Ptr,
        _: Ptr,
        _: bool,
    ) -> c_int {
        let mut value = UNSET;
        let mut count = 0;
        // SAFETY: `filter` is the stream's filter; the name is static; `value` and `count` are
        // this frame's, written by Envoy before it returns.
        unsafe {
            envoy_dynamic_module_callback_http_get_header(
                filter,
                RESPONSE,
                ModuleBuffer::of(b":status"),
                &mut value,
                0,
                &mut count,
            )
        };
        std::hint::black_box(value.length);
        CONTINUE
    }
}
