//! Envoy 1.40's dynamic-module ABI, its host side: with [`crate::hooks`] (the event hooks
//! Envoy calls, the module's side), the only modules of the crate with `unsafe`.
//!
//! The declarations follow Envoy's ABI header (`source/extensions/dynamic_modules/abi/abi.h`):
//! the types both sides share and the callbacks Envoy exports
//! (`envoy_dynamic_module_callback_*`). The callbacks are not linked: they are looked up in the
//! host process once, when Envoy loads the module (`on_program_init`), into [`Callbacks`]. A
//! host that lacks one of them is not the Envoy this module was built for, and the module
//! refuses to load ([`refusal`]), naming the missing callback, instead of crashing on its first
//! call. A fake host (the tests, the fuzz target) fills the same table.
//!
//! Everything that leaves this module is safe: [`Filter`] and [`FilterConfig`] are handles
//! whose methods copy what Envoy lends into owned values. This module knows nothing of the
//! filter that uses them.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::marker::PhantomData;
use std::sync::OnceLock;

use skewgate_core::pipeline::HeaderBlock;

/// The ABI version this module was written against, returned to Envoy from
/// `on_program_init`: Envoy 1.40.0 logs "Dynamic module ABI version v0.2.0 matched." for it
/// (tests/tests/native.rs checks the line).
pub const ABI_VERSION: &CStr = c"v0.2.0";

#[cfg(any(test, feature = "fake-host"))]
pub mod fake;

// ---- Types of the ABI (abi.h, "Common Types" and "HTTP Filter" types). ----

/// `envoy_dynamic_module_type_envoy_buffer`: bytes owned by Envoy, lent for one hook.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EnvoyBuffer {
    pub ptr: *const c_char,
    pub length: usize,
}

impl EnvoyBuffer {
    const EMPTY: EnvoyBuffer = EnvoyBuffer {
        ptr: std::ptr::null(),
        length: 0,
    };
}

/// `envoy_dynamic_module_type_module_buffer`: bytes owned by the module, lent for one call.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ModuleBuffer {
    pub ptr: *const c_char,
    pub length: usize,
}

impl ModuleBuffer {
    fn of(bytes: &[u8]) -> Self {
        ModuleBuffer {
            ptr: bytes.as_ptr().cast(),
            length: bytes.len(),
        }
    }

    const NULL: ModuleBuffer = ModuleBuffer {
        ptr: std::ptr::null(),
        length: 0,
    };
}

/// `envoy_dynamic_module_type_envoy_http_header`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EnvoyHeader {
    pub key_ptr: *const c_char,
    pub key_length: usize,
    pub value_ptr: *const c_char,
    pub value_length: usize,
}

impl EnvoyHeader {
    const EMPTY: EnvoyHeader = EnvoyHeader {
        key_ptr: std::ptr::null(),
        key_length: 0,
        value_ptr: std::ptr::null(),
        value_length: 0,
    };
}

/// `envoy_dynamic_module_type_module_http_header`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ModuleHeader {
    pub key_ptr: *const c_char,
    pub key_length: usize,
    pub value_ptr: *const c_char,
    pub value_length: usize,
}

/// `envoy_dynamic_module_type_http_header_type` (a C enum: an `int`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum HeaderMap {
    Request = 0,
    // RequestTrailer = 1
    Response = 2,
    // ResponseTrailer = 3
}

/// `envoy_dynamic_module_type_http_body_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum Body {
    // ReceivedRequestBody = 0, BufferedRequestBody = 1
    /// The piece received in the current `on_http_filter_response_body`.
    ReceivedResponse = 2,
    /// What earlier hooks of this filter buffered (`StopIterationAndBuffer`).
    BufferedResponse = 3,
}

/// `envoy_dynamic_module_type_attribute_id_ResponseCodeDetails` (position 16 of the enum).
pub const ATTRIBUTE_RESPONSE_CODE_DETAILS: c_int = 16;

/// `envoy_dynamic_module_type_log_level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum LogLevel {
    Debug = 1,
    Info = 2,
    Warn = 3,
    Error = 4,
}

/// `envoy_dynamic_module_type_metrics_result_Success`.
const METRICS_SUCCESS: c_int = 0;

/// The hooks' statuses: `Continue` is 0 in every status enum of the ABI.
pub(crate) const CONTINUE: c_int = 0;
/// `..._request_headers_status_StopIteration`.
pub(crate) const HEADERS_STOP_ITERATION: c_int = 1;
/// `..._response_body_status_StopIterationAndBuffer`.
pub(crate) const BODY_STOP_AND_BUFFER: c_int = 1;

pub(crate) type FilterConfigEnvoyPtr = *mut c_void;
pub(crate) type FilterConfigModulePtr = *const c_void;
pub(crate) type FilterEnvoyPtr = *mut c_void;
pub(crate) type FilterModulePtr = *const c_void;

// ---- The callbacks, looked up in the host once. ----

macro_rules! callbacks {
    ($($field:ident: fn($($arg:ty),*) $(-> $ret:ty)?;)*) => {
        /// Envoy's callbacks this module calls, each named `envoy_dynamic_module_callback_`
        /// followed by its field name.
        #[derive(Clone, Copy)]
        pub struct Callbacks {
            $(pub $field: unsafe extern "C" fn($($arg),*) $(-> $ret)?,)*
        }

        impl Callbacks {
            /// Every callback's exported name, for the symbol check against the Envoy binary.
            pub const NAMES: &'static [&'static str] =
                &[$(concat!("envoy_dynamic_module_callback_", stringify!($field))),*];

            /// Looks every callback up with `lookup` (a symbol's address, or null); the first
            /// missing one's name is the error.
            ///
            /// # Safety
            /// Every non-null address `lookup` returns for a name must be a function with the
            /// prototype abi.h declares for that name (the field's type here).
            pub unsafe fn resolve(
                lookup: impl Fn(&CStr) -> *mut c_void,
            ) -> Result<Self, &'static str> {
                Ok(Callbacks {
                    $($field: {
                        let name = concat!("envoy_dynamic_module_callback_", stringify!($field), "\0");
                        let Ok(symbol) = CStr::from_bytes_with_nul(name.as_bytes()) else {
                            return Err(name);
                        };
                        let address = lookup(symbol);
                        if address.is_null() {
                            return Err(name.trim_end_matches('\0'));
                        }
                        // SAFETY: non-null, and by the caller's contract a function of this
                        // field's prototype; a function pointer and a data pointer have the
                        // same size on every target Envoy runs on.
                        unsafe {
                            std::mem::transmute::<
                                *mut c_void,
                                unsafe extern "C" fn($($arg),*) $(-> $ret)?,
                            >(address)
                        }
                    },)*
                })
            }
        }
    };
}

callbacks! {
    log: fn(c_int, ModuleBuffer);
    log_enabled: fn(c_int) -> bool;
    http_get_headers_size: fn(FilterEnvoyPtr, c_int) -> usize;
    http_get_headers: fn(FilterEnvoyPtr, c_int, *mut EnvoyHeader) -> bool;
    http_get_header: fn(FilterEnvoyPtr, c_int, ModuleBuffer, *mut EnvoyBuffer, usize, *mut usize) -> bool;
    http_set_header: fn(FilterEnvoyPtr, c_int, ModuleBuffer, ModuleBuffer) -> bool;
    http_add_header: fn(FilterEnvoyPtr, c_int, ModuleBuffer, ModuleBuffer) -> bool;
    http_clear_route_cache: fn(FilterEnvoyPtr);
    http_send_response: fn(FilterEnvoyPtr, u32, *mut ModuleHeader, usize, ModuleBuffer, ModuleBuffer);
    http_get_body_chunks_size: fn(FilterEnvoyPtr, c_int) -> usize;
    http_get_body_chunks: fn(FilterEnvoyPtr, c_int, *mut EnvoyBuffer) -> bool;
    http_get_body_size: fn(FilterEnvoyPtr, c_int) -> usize;
    http_drain_body: fn(FilterEnvoyPtr, c_int, usize) -> bool;
    http_append_body: fn(FilterEnvoyPtr, c_int, ModuleBuffer) -> bool;
    http_received_buffered_response_body: fn(FilterEnvoyPtr) -> bool;
    http_filter_get_attribute_string: fn(FilterEnvoyPtr, c_int, *mut EnvoyBuffer) -> bool;
    http_filter_config_define_counter: fn(FilterConfigEnvoyPtr, ModuleBuffer, *mut ModuleBuffer, usize, *mut usize) -> c_int;
    http_filter_config_define_gauge: fn(FilterConfigEnvoyPtr, ModuleBuffer, *mut ModuleBuffer, usize, *mut usize) -> c_int;
    http_filter_increment_counter: fn(FilterEnvoyPtr, usize, *mut ModuleBuffer, usize, u64) -> c_int;
    // The configuration's own metric calls are not in the header version these declarations
    // follow; Envoy 1.40 exports them, and its machine code uses their arguments as the
    // filter's calls above do (the id, the label array and its length, the value), with the
    // configuration's pointer first (read with `objdump -d`; tests/tests/fallback.rs and
    // tests/tests/metrics.rs check the values they set).
    http_filter_config_increment_counter: fn(FilterConfigEnvoyPtr, usize, *mut ModuleBuffer, usize, u64) -> c_int;
    http_filter_config_set_gauge: fn(FilterConfigEnvoyPtr, usize, *mut ModuleBuffer, usize, u64) -> c_int;
}

/// The host's callbacks, set once by `on_program_init` (or a test's [`install`]).
static CALLBACKS: OnceLock<Callbacks> = OnceLock::new();

fn callbacks() -> Option<&'static Callbacks> {
    CALLBACKS.get()
}

/// Use `callbacks` as the host (a fake host in tests; Envoy's are found by `on_program_init`).
/// The first table installed stays.
fn install(callbacks: Callbacks) -> bool {
    CALLBACKS.set(callbacks).is_ok()
}

/// Why this host cannot run the module: the callback it lacks. Looked up in the process
/// (`dlsym(RTLD_DEFAULT)`): the Envoy executable exports its callbacks.
pub fn refusal() -> Option<&'static str> {
    if callbacks().is_some() {
        return None;
    }
    let lookup = |name: &CStr| {
        // SAFETY: `name` is a NUL-terminated string; RTLD_DEFAULT searches the process's
        // global symbols and returns null for a missing one.
        unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }
    };
    // SAFETY: every `envoy_dynamic_module_callback_*` symbol of an Envoy whose ABI this module
    // was written against has the prototype `Callbacks` declares (abi.h); a host of another ABI
    // is what the version check and this lookup are there to refuse, as far as names show it.
    match unsafe { Callbacks::resolve(lookup) } {
        Ok(found) => {
            install(found);
            None
        }
        Err(missing) => Some(missing),
    }
}

// ---- Safe handles. ----

/// Bytes Envoy lent, copied.
///
/// # Safety
/// `ptr` is null (then `length` is ignored) or valid for `length` bytes.
pub(crate) unsafe fn copy(ptr: *const c_char, length: usize) -> Vec<u8> {
    // SAFETY: the caller's contract.
    unsafe { lent(ptr, length) }.to_vec()
}

/// Bytes Envoy lent, as a slice for as long as the caller says.
///
/// # Safety
/// `ptr` is null (then `length` is ignored) or valid for `length` bytes for all of `'a`.
unsafe fn lent<'a>(ptr: *const c_char, length: usize) -> &'a [u8] {
    if ptr.is_null() || length == 0 {
        return &[];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), length) }
}

/// Up to this many headers, Envoy's views of them are read into an array on the stack (a
/// kubectl request has about ten; a request may have up to the listener's 500).
const SMALL_HEADER_COUNT: usize = 64;

/// Writes one log line through Envoy's `dynamic_modules` logger, if that level is on.
pub fn log(level: LogLevel, message: std::fmt::Arguments<'_>) {
    let Some(cb) = callbacks() else {
        return;
    };
    // SAFETY: plain values; Envoy's callback reads nothing else.
    if !unsafe { (cb.log_enabled)(level as c_int) } {
        return;
    }
    let line = message.to_string();
    // SAFETY: the buffer points into `line`, alive for the call; Envoy copies it.
    unsafe { (cb.log)(level as c_int, ModuleBuffer::of(line.as_bytes())) }
}

/// One stream's filter in Envoy, valid from `on_http_filter_new` until
/// `on_http_filter_destroy`; only the hooks of that stream, on its worker thread, hold one.
#[derive(Debug)]
pub struct Filter {
    ptr: FilterEnvoyPtr,
    // Not Send: the stream belongs to one worker thread.
    _thread: PhantomData<*mut ()>,
}

/// A host call that failed (Envoy answered false, or no callbacks are installed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused;

impl Filter {
    /// The handle on the stream Envoy's `filter_envoy` pointer names.
    ///
    /// Only the hooks make one, from the pointer Envoy passes them for this stream.
    pub(crate) fn from_envoy(ptr: FilterEnvoyPtr) -> Filter {
        Filter {
            ptr,
            _thread: PhantomData,
        }
    }

    fn cb(&self) -> Result<&'static Callbacks, Refused> {
        callbacks().ok_or(Refused)
    }

    /// Every header of `map`, names and raw values copied.
    pub fn headers(&self, map: HeaderMap) -> Result<HeaderBlock, Refused> {
        let cb = self.cb()?;
        // SAFETY: `self.ptr` is this stream's filter (see `Filter`).
        let count = unsafe { (cb.http_get_headers_size)(self.ptr, map as c_int) };
        // Envoy's views go on the stack for a request of ordinary size.
        let mut small = [EnvoyHeader::EMPTY; SMALL_HEADER_COUNT];
        let mut large = Vec::new();
        let raw: &mut [EnvoyHeader] = match small.get_mut(..count) {
            Some(small) => small,
            None => {
                large.resize(count, EnvoyHeader::EMPTY);
                &mut large
            }
        };
        // SAFETY: `raw` has room for `count` entries, the size Envoy just gave.
        if count > 0 && !unsafe { (cb.http_get_headers)(self.ptr, map as c_int, raw.as_mut_ptr()) }
        {
            return Err(Refused);
        }
        let (names, values) = raw.iter().fold((0usize, 0usize), |(n, v), h| {
            (
                n.saturating_add(h.key_length),
                v.saturating_add(h.value_length),
            )
        });
        let lent_pairs = raw.iter().map(|h| {
            // SAFETY: Envoy filled each entry with views valid until this hook returns and no
            // setter ran since; they are copied before this function returns.
            unsafe {
                (
                    lent(h.key_ptr, h.key_length),
                    lent(h.value_ptr, h.value_length),
                )
            }
        });
        Ok(HeaderBlock::copied(lent_pairs, names, values))
    }

    /// The first value of header `name` in `map`.
    pub fn header(&self, map: HeaderMap, name: &str) -> Result<Option<Vec<u8>>, Refused> {
        let cb = self.cb()?;
        let mut value = EnvoyBuffer::EMPTY;
        let mut count = 0usize;
        // SAFETY: the key points into `name` for the call; `value` and `count` are ours.
        let ok = unsafe {
            (cb.http_get_header)(
                self.ptr,
                map as c_int,
                ModuleBuffer::of(name.as_bytes()),
                &mut value,
                0,
                &mut count,
            )
        };
        if !ok || count == 0 || value.ptr.is_null() {
            return Ok(None);
        }
        // SAFETY: Envoy set `value` to a view valid until this hook returns.
        Ok(Some(unsafe { copy(value.ptr, value.length) }))
    }

    /// Sets header `name` in `map` to `value`, replacing every value; `None` removes it.
    pub fn set_header(
        &self,
        map: HeaderMap,
        name: &str,
        value: Option<&[u8]>,
    ) -> Result<(), Refused> {
        let cb = self.cb()?;
        let value = value.map_or(ModuleBuffer::NULL, ModuleBuffer::of);
        // SAFETY: both buffers point into borrowed data alive for the call.
        let ok = unsafe {
            (cb.http_set_header)(
                self.ptr,
                map as c_int,
                ModuleBuffer::of(name.as_bytes()),
                value,
            )
        };
        ok.then_some(()).ok_or(Refused)
    }

    pub fn add_header(&self, map: HeaderMap, name: &str, value: &[u8]) -> Result<(), Refused> {
        let cb = self.cb()?;
        // SAFETY: both buffers point into borrowed data alive for the call.
        let ok = unsafe {
            (cb.http_add_header)(
                self.ptr,
                map as c_int,
                ModuleBuffer::of(name.as_bytes()),
                ModuleBuffer::of(value),
            )
        };
        ok.then_some(()).ok_or(Refused)
    }

    pub fn clear_route_cache(&self) -> Result<(), Refused> {
        let cb = self.cb()?;
        // SAFETY: `self.ptr` is this stream's filter.
        unsafe { (cb.http_clear_route_cache)(self.ptr) };
        Ok(())
    }

    /// Answers the request from here.
    pub fn send_response(
        &self,
        status: u32,
        headers: &[(&str, &str)],
        body: &[u8],
        details: &str,
    ) -> Result<(), Refused> {
        let cb = self.cb()?;
        let mut raw: Vec<ModuleHeader> = headers
            .iter()
            .map(|(name, value)| ModuleHeader {
                key_ptr: name.as_ptr().cast(),
                key_length: name.len(),
                value_ptr: value.as_ptr().cast(),
                value_length: value.len(),
            })
            .collect();
        // SAFETY: every buffer points into `headers`, `body` or `details`, alive for the call;
        // Envoy copies them.
        unsafe {
            (cb.http_send_response)(
                self.ptr,
                status,
                raw.as_mut_ptr(),
                raw.len(),
                ModuleBuffer::of(body),
                ModuleBuffer::of(details.as_bytes()),
            )
        };
        Ok(())
    }

    pub fn body_size(&self, body: Body) -> Result<usize, Refused> {
        let cb = self.cb()?;
        // SAFETY: `self.ptr` is this stream's filter.
        Ok(unsafe { (cb.http_get_body_size)(self.ptr, body as c_int) })
    }

    /// The whole of `body`, its pieces copied in order.
    pub fn body(&self, body: Body) -> Result<Vec<u8>, Refused> {
        let cb = self.cb()?;
        // SAFETY: `self.ptr` is this stream's filter.
        let count = unsafe { (cb.http_get_body_chunks_size)(self.ptr, body as c_int) };
        if count == 0 {
            return Ok(Vec::new());
        }
        let mut chunks = vec![EnvoyBuffer::EMPTY; count];
        // SAFETY: `chunks` has room for the `count` entries Envoy just reported.
        if !unsafe { (cb.http_get_body_chunks)(self.ptr, body as c_int, chunks.as_mut_ptr()) } {
            return Err(Refused);
        }
        let mut out = Vec::new();
        for chunk in &chunks {
            // SAFETY: Envoy filled each entry with a view valid until this hook returns.
            out.extend_from_slice(&unsafe { copy(chunk.ptr, chunk.length) });
        }
        Ok(out)
    }

    /// Removes the first `bytes` bytes of `body` (all of it if shorter).
    pub fn drain_body(&self, body: Body, bytes: usize) -> Result<(), Refused> {
        let cb = self.cb()?;
        // SAFETY: `self.ptr` is this stream's filter.
        let ok = unsafe { (cb.http_drain_body)(self.ptr, body as c_int, bytes) };
        ok.then_some(()).ok_or(Refused)
    }

    pub fn append_body(&self, body: Body, data: &[u8]) -> Result<(), Refused> {
        let cb = self.cb()?;
        // SAFETY: the buffer points into `data` for the call; Envoy copies it.
        let ok = unsafe { (cb.http_append_body)(self.ptr, body as c_int, ModuleBuffer::of(data)) };
        ok.then_some(()).ok_or(Refused)
    }

    /// Whether the piece "received" now is the body an earlier filter buffered (then it must
    /// not be counted twice).
    pub fn received_is_buffered(&self) -> Result<bool, Refused> {
        let cb = self.cb()?;
        // SAFETY: `self.ptr` is this stream's filter.
        Ok(unsafe { (cb.http_received_buffered_response_body)(self.ptr) })
    }

    /// Envoy's `response.code_details`.
    pub fn response_code_details(&self) -> Result<Option<Vec<u8>>, Refused> {
        let cb = self.cb()?;
        let mut value = EnvoyBuffer::EMPTY;
        // SAFETY: `value` is ours; Envoy sets it to a view valid for this hook.
        let ok = unsafe {
            (cb.http_filter_get_attribute_string)(
                self.ptr,
                ATTRIBUTE_RESPONSE_CODE_DETAILS,
                &mut value,
            )
        };
        if !ok {
            return Ok(None);
        }
        // SAFETY: as above.
        Ok(Some(unsafe { copy(value.ptr, value.length) }))
    }

    /// Adds one to counter `id` with `labels` (as many as it was defined with).
    pub fn increment_counter<S: AsRef<str>>(&self, id: usize, labels: &[S]) -> Result<(), Refused> {
        let cb = self.cb()?;
        let mut values = module_buffers(labels);
        // SAFETY: `values` points into `labels` for the call.
        let result = unsafe {
            (cb.http_filter_increment_counter)(self.ptr, id, values.as_mut_ptr(), values.len(), 1)
        };
        (result == METRICS_SUCCESS).then_some(()).ok_or(Refused)
    }
}

/// The filter configuration's handle in Envoy, during `on_http_filter_config_new` only
/// (metrics are defined there).
#[derive(Debug)]
pub struct FilterConfig<'hook> {
    ptr: FilterConfigEnvoyPtr,
    _hook: PhantomData<&'hook ()>,
}

/// Views of `labels` for one call (label names or values), in their order.
fn module_buffers<S: AsRef<str>>(labels: &[S]) -> Vec<ModuleBuffer> {
    labels
        .iter()
        .map(|l| ModuleBuffer::of(l.as_ref().as_bytes()))
        .collect()
}

/// What kind of metric to define.
#[derive(Debug, Clone, Copy)]
pub enum MetricKind {
    Counter,
    Gauge,
}

impl FilterConfig<'_> {
    /// The handle on the configuration Envoy's pointer names, for one hook.
    pub(crate) fn from_envoy(ptr: FilterConfigEnvoyPtr) -> Self {
        FilterConfig {
            ptr,
            _hook: PhantomData,
        }
    }

    /// Defines a metric named `name` with `labels`; its id.
    pub fn define(&self, kind: MetricKind, name: &str, labels: &[&str]) -> Result<usize, Refused> {
        let cb = callbacks().ok_or(Refused)?;
        let mut names = module_buffers(labels);
        let mut id = 0usize;
        let define = match kind {
            MetricKind::Counter => cb.http_filter_config_define_counter,
            MetricKind::Gauge => cb.http_filter_config_define_gauge,
        };
        // SAFETY: `self.ptr` is the configuration Envoy is creating now; the buffers point into
        // `name` and `labels` for the call; `id` is ours.
        let result = unsafe {
            define(
                self.ptr,
                ModuleBuffer::of(name.as_bytes()),
                names.as_mut_ptr(),
                names.len(),
                &mut id,
            )
        };
        (result == METRICS_SUCCESS).then_some(id).ok_or(Refused)
    }

    /// Adds `value` to counter `id` with `labels`; 0 only makes the series exist in this
    /// configuration (see `filter::NativeConfig::new`).
    pub fn add_counter<S: AsRef<str>>(
        &self,
        id: usize,
        labels: &[S],
        value: u64,
    ) -> Result<(), Refused> {
        let cb = callbacks().ok_or(Refused)?;
        let mut values = module_buffers(labels);
        // SAFETY: `self.ptr` is the configuration Envoy is creating now; `values` points into
        // `labels` for the call.
        let result = unsafe {
            (cb.http_filter_config_increment_counter)(
                self.ptr,
                id,
                values.as_mut_ptr(),
                values.len(),
                value,
            )
        };
        (result == METRICS_SUCCESS).then_some(()).ok_or(Refused)
    }

    pub fn set_gauge(&self, id: usize, value: u64) -> Result<(), Refused> {
        let cb = callbacks().ok_or(Refused)?;
        // SAFETY: no labels: a null array of length 0, as the ABI allows.
        let result = unsafe {
            (cb.http_filter_config_set_gauge)(self.ptr, id, std::ptr::null_mut(), 0, value)
        };
        (result == METRICS_SUCCESS).then_some(()).ok_or(Refused)
    }
}

/// What the module says when it refuses a host: Envoy loads modules with no check of its own
/// beyond a warning, so this line is what an operator sees.
pub fn refusal_message(missing: &str) -> String {
    format!(
        "skewgate native filter: refusing to load: this Envoy does not export {missing}; the \
         module was built for Envoy 1.40 (dynamic-module ABI {}) and runs only in the Envoy it \
         was built for: use that Envoy, or --data-plane wasm",
        ABI_VERSION.to_string_lossy()
    )
}
