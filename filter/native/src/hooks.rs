//! The event hooks Envoy calls (`envoy_dynamic_module_on_*`, exported by `#[no_mangle]`):
//! the module's side of the ABI whose host side is [`crate::ffi`]. They hand the module's own
//! objects ([`NativeConfig`], [`NativeFilter`]) to [`crate::filter`] by reference, and no panic
//! crosses the boundary: every hook runs its body under `catch_unwind` and answers as a failed
//! call would ([`guard`]). With [`crate::ffi`], the only module of the crate with `unsafe`.

use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::ffi::{
    copy, log, refusal, refusal_message, EnvoyBuffer, EnvoyHeader, Filter, FilterConfig,
    FilterConfigEnvoyPtr, FilterConfigModulePtr, FilterEnvoyPtr, FilterModulePtr, LogLevel,
    ABI_VERSION, BODY_STOP_AND_BUFFER, CONTINUE, HEADERS_STOP_ITERATION,
};
use crate::filter::{self, BodyPhase, NativeConfig, NativeFilter};

// Exported by `#[no_mangle]` (not `pub`: nothing in Rust calls them but `on_program_init`,
// which the refusal test does).

/// Runs `body`; a panic becomes `failed` (and a log line), never an unwind into Envoy.
fn guard<T>(hook: &str, failed: T, body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(_) => {
            log(
                LogLevel::Error,
                format_args!("skewgate: {hook} panicked; answering as a failed call"),
            );
            failed
        }
    }
}

/// The module's object behind a module pointer.
///
/// # Safety
/// `ptr` came from `Box::into_raw` of a `T` in this module and is not yet destroyed.
unsafe fn object<'a, T>(ptr: *const c_void) -> Option<&'a T> {
    // SAFETY: the caller's contract; null is None.
    unsafe { ptr.cast::<T>().as_ref() }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const c_char {
    guard("on_program_init", std::ptr::null(), || match refusal() {
        None => ABI_VERSION.as_ptr(),
        Some(missing) => {
            // No Envoy logger without the callbacks: stderr, which is where Envoy logs too.
            eprintln!("{}", refusal_message(missing));
            std::ptr::null()
        }
    })
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    config_envoy: FilterConfigEnvoyPtr,
    name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> FilterConfigModulePtr {
    guard("on_http_filter_config_new", std::ptr::null(), || {
        // SAFETY: Envoy lends both buffers for this hook.
        let (name, config) =
            unsafe { (copy(name.ptr, name.length), copy(config.ptr, config.length)) };
        let handle = FilterConfig::from_envoy(config_envoy);
        match NativeConfig::new(&handle, &name, &config) {
            Some(config) => Box::into_raw(Box::new(config)).cast_const().cast(),
            None => std::ptr::null(),
        }
    })
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(config: FilterConfigModulePtr) {
    guard("on_http_filter_config_destroy", (), || {
        if !config.is_null() {
            // SAFETY: made by `Box::into_raw` in config_new; Envoy destroys it once, after the
            // last filter made from it.
            drop(unsafe { Box::from_raw(config.cast::<NativeConfig>().cast_mut()) });
        }
    })
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_new(
    config: FilterConfigModulePtr,
    filter_envoy: FilterEnvoyPtr,
) -> FilterModulePtr {
    guard("on_http_filter_new", std::ptr::null(), || {
        // SAFETY: `config` is ours (config_new) and lives until config_destroy, after this.
        let Some(config) = (unsafe { object::<NativeConfig>(config) }) else {
            return std::ptr::null();
        };
        let filter = Filter::from_envoy(filter_envoy);
        Box::into_raw(Box::new(NativeFilter::new(config, filter)))
            .cast_const()
            .cast()
    })
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_destroy(filter: FilterModulePtr) {
    guard("on_http_filter_destroy", (), || {
        if !filter.is_null() {
            // SAFETY: made by `Box::into_raw` in filter_new; Envoy destroys it once.
            drop(unsafe { Box::from_raw(filter.cast::<NativeFilter>().cast_mut()) });
        }
    })
}

/// The stream's filter object: hooks of one stream run on its worker thread one at a time.
///
/// # Safety
/// `filter` came from `on_http_filter_new` and is not destroyed yet.
unsafe fn stream<'a>(filter: FilterModulePtr) -> Option<&'a mut NativeFilter> {
    // SAFETY: the caller's contract; Envoy never runs two hooks of one stream at once, so this
    // is the only reference while the hook runs.
    unsafe { filter.cast::<NativeFilter>().cast_mut().as_mut() }
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    filter_envoy: FilterEnvoyPtr,
    filter: FilterModulePtr,
    _end_of_stream: bool,
) -> c_int {
    let planned = guard("on_http_filter_request_headers", None, || {
        // SAFETY: a live stream's object (Envoy's contract for this hook).
        let filter = unsafe { stream(filter) }?;
        Some(match filter.on_request_headers() {
            filter::Next::Continue => CONTINUE,
            filter::Next::Stop => HEADERS_STOP_ITERATION,
        })
    });
    planned.unwrap_or_else(|| {
        // A request the filter could not plan must not reach an apiserver unfiltered, nor
        // wait for a timeout: the same 503 as when a host call fails (the wasm filter's
        // fail-closed reply).
        guard("on_http_filter_request_headers", (), || {
            filter::fail_closed(&Filter::from_envoy(filter_envoy))
        });
        HEADERS_STOP_ITERATION
    })
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    _filter_envoy: FilterEnvoyPtr,
    filter: FilterModulePtr,
    end_of_stream: bool,
) -> c_int {
    guard("on_http_filter_response_headers", CONTINUE, || {
        // SAFETY: a live stream's object.
        match unsafe { stream(filter) } {
            Some(filter) => match filter.on_response_headers(end_of_stream) {
                filter::Next::Continue => CONTINUE,
                filter::Next::Stop => HEADERS_STOP_ITERATION,
            },
            None => CONTINUE,
        }
    })
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    _filter_envoy: FilterEnvoyPtr,
    filter: FilterModulePtr,
    end_of_stream: bool,
) -> c_int {
    guard("on_http_filter_response_body", CONTINUE, || {
        // SAFETY: a live stream's object.
        match unsafe { stream(filter) } {
            Some(filter) => match filter.on_response_body(end_of_stream) {
                BodyPhase::Continue => CONTINUE,
                BodyPhase::Buffer => BODY_STOP_AND_BUFFER,
            },
            None => CONTINUE,
        }
    })
}

// Hooks of the ABI this filter has no use for: Envoy looks every one up when it loads the
// module, so each is exported, and each does nothing.

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    _: FilterEnvoyPtr,
    _: FilterModulePtr,
    _: bool,
) -> c_int {
    CONTINUE
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    _: FilterEnvoyPtr,
    _: FilterModulePtr,
) -> c_int {
    CONTINUE
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    _: FilterEnvoyPtr,
    _: FilterModulePtr,
) -> c_int {
    CONTINUE
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(
    _: FilterEnvoyPtr,
    _: FilterModulePtr,
) {
}

/// `Continue`: Envoy's local replies are mapped in the response phase, like the upstream's.
#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_local_reply(
    _: FilterEnvoyPtr,
    _: FilterModulePtr,
    _response_code: u32,
    _details: EnvoyBuffer,
    _reset_imminent: bool,
) -> c_int {
    CONTINUE
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    _: FilterEnvoyPtr,
    _: FilterModulePtr,
    _event_id: u64,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_config_scheduled(
    _: FilterConfigEnvoyPtr,
    _: FilterConfigModulePtr,
    _event_id: u64,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    _: FilterEnvoyPtr,
    _: FilterModulePtr,
    _callout_id: u64,
    _result: c_int,
    _headers: *mut EnvoyHeader,
    _headers_size: usize,
    _body_chunks: *mut EnvoyBuffer,
    _body_chunks_size: usize,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_config_http_callout_done(
    _: FilterConfigEnvoyPtr,
    _: FilterConfigModulePtr,
    _callout_id: u64,
    _result: c_int,
    _headers: *mut EnvoyHeader,
    _headers_size: usize,
    _body_chunks: *mut EnvoyBuffer,
    _body_chunks_size: usize,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_headers(
    _: FilterEnvoyPtr,
    _: FilterModulePtr,
    _stream_id: u64,
    _headers: *mut EnvoyHeader,
    _headers_size: usize,
    _end_stream: bool,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_data(
    _: FilterEnvoyPtr,
    _: FilterModulePtr,
    _stream_id: u64,
    _data: *const EnvoyBuffer,
    _data_count: usize,
    _end_stream: bool,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_trailers(
    _: FilterEnvoyPtr,
    _: FilterModulePtr,
    _stream_id: u64,
    _trailers: *mut EnvoyHeader,
    _trailers_size: usize,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_complete(
    _: FilterEnvoyPtr,
    _: FilterModulePtr,
    _stream_id: u64,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_reset(
    _: FilterEnvoyPtr,
    _: FilterModulePtr,
    _stream_id: u64,
    _reason: c_int,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_headers(
    _: FilterConfigEnvoyPtr,
    _: FilterConfigModulePtr,
    _stream_id: u64,
    _headers: *mut EnvoyHeader,
    _headers_size: usize,
    _end_stream: bool,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_data(
    _: FilterConfigEnvoyPtr,
    _: FilterConfigModulePtr,
    _stream_id: u64,
    _data: *const EnvoyBuffer,
    _data_count: usize,
    _end_stream: bool,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_trailers(
    _: FilterConfigEnvoyPtr,
    _: FilterConfigModulePtr,
    _stream_id: u64,
    _trailers: *mut EnvoyHeader,
    _trailers_size: usize,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_complete(
    _: FilterConfigEnvoyPtr,
    _: FilterConfigModulePtr,
    _stream_id: u64,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_reset(
    _: FilterConfigEnvoyPtr,
    _: FilterConfigModulePtr,
    _stream_id: u64,
    _reason: c_int,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
    _: FilterEnvoyPtr,
    _: FilterModulePtr,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
    _: FilterEnvoyPtr,
    _: FilterModulePtr,
) {
}

/// No per-route configuration: null refuses one, which skewgate never renders.
#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_new(
    _name: EnvoyBuffer,
    _config: EnvoyBuffer,
) -> *const c_void {
    std::ptr::null()
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_destroy(_: *const c_void) {}
