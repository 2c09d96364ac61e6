//! A fake Envoy for the native shell's tests and its fuzz target: the callback table over one
//! stream held in a thread-local ([`FakeStream`]), so the shell's own code (the handles, the
//! body view, the metrics by label) runs as under Envoy, without Envoy.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void};
use std::marker::PhantomData;

use super::{
    copy, Callbacks, EnvoyBuffer, EnvoyHeader, Filter, FilterConfig, ModuleBuffer, ModuleHeader,
    METRICS_SUCCESS,
};

/// A local reply: status, headers, body.
pub type SentReply = (u32, Vec<(String, String)>, Vec<u8>);

/// One stream as the fake Envoy holds it; tests set the inputs and read the outputs.
#[derive(Debug, Default, Clone)]
pub struct FakeStream {
    /// By header type (0 request, 2 response; trailers unused).
    pub request_headers: Vec<(Vec<u8>, Vec<u8>)>,
    pub response_headers: Vec<(Vec<u8>, Vec<u8>)>,
    /// The piece received in the current body hook, and what was buffered before it.
    pub received: Vec<u8>,
    pub buffered: Vec<u8>,
    pub code_details: Option<Vec<u8>>,
    /// The local reply sent: status, headers, body.
    pub sent: Option<SentReply>,
    pub route_cache_cleared: usize,
    /// Metrics defined: name and label names; their index is the id.
    pub defined: Vec<(String, Vec<String>)>,
    /// Every increment or set: metric id, label values, value.
    pub recorded: Vec<(usize, Vec<String>, u64)>,
    pub logs: Vec<(c_int, String)>,
}

thread_local! {
    static STREAM: RefCell<FakeStream> = RefCell::new(FakeStream::default());
}

/// Runs `f` on this thread's fake stream.
pub fn with_stream<R>(f: impl FnOnce(&mut FakeStream) -> R) -> R {
    STREAM.with(|s| f(&mut s.borrow_mut()))
}

/// A handle on the fake stream, as `on_http_filter_new` gets one (any non-null pointer: the
/// fake's callbacks ignore it).
pub fn filter() -> Filter {
    Filter {
        ptr: std::ptr::NonNull::<u8>::dangling().as_ptr().cast(),
        _thread: PhantomData,
    }
}

/// A handle on a fake filter configuration, as `on_http_filter_config_new` gets one.
pub fn config() -> FilterConfig<'static> {
    FilterConfig {
        ptr: std::ptr::NonNull::<u8>::dangling().as_ptr().cast(),
        _hook: PhantomData,
    }
}

/// Makes the fake the host of this process (the first table installed stays).
pub fn install() {
    super::install(Callbacks {
        log,
        log_enabled,
        http_get_headers_size,
        http_get_headers,
        http_get_header,
        http_set_header,
        http_add_header,
        http_clear_route_cache,
        http_send_response,
        http_get_body_chunks_size,
        http_get_body_chunks,
        http_get_body_size,
        http_drain_body,
        http_append_body,
        http_received_buffered_response_body,
        http_filter_get_attribute_string,
        http_filter_config_define_counter,
        http_filter_config_define_gauge,
        http_filter_increment_counter,
        http_filter_config_increment_counter: http_filter_increment_counter,
        http_filter_config_set_gauge: http_filter_set_gauge,
    });
}

/// A module buffer's bytes.
///
/// # Safety
/// As [`copy`]: the module lends `length` bytes at `ptr` for the call.
unsafe fn bytes(buffer: ModuleBuffer) -> Vec<u8> {
    // SAFETY: the caller's contract.
    unsafe { copy(buffer.ptr, buffer.length) }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// # Safety
/// `labels` points to `length` module buffers (or is null with 0).
unsafe fn labels(labels: *mut ModuleBuffer, length: usize) -> Vec<String> {
    if labels.is_null() || length == 0 {
        return Vec::new();
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(labels, length) }
        .iter()
        // SAFETY: each buffer is lent for the call.
        .map(|b| text(&unsafe { bytes(*b) }))
        .collect()
}

fn map(stream: &mut FakeStream, header_type: c_int) -> &mut Vec<(Vec<u8>, Vec<u8>)> {
    if header_type == 0 {
        &mut stream.request_headers
    } else {
        &mut stream.response_headers
    }
}

fn body(stream: &mut FakeStream, body_type: c_int) -> &mut Vec<u8> {
    if body_type == 3 {
        &mut stream.buffered
    } else {
        &mut stream.received
    }
}

unsafe extern "C" fn log(level: c_int, message: ModuleBuffer) {
    // SAFETY: lent for the call.
    let line = text(&unsafe { bytes(message) });
    with_stream(|s| s.logs.push((level, line)));
}

unsafe extern "C" fn log_enabled(_: c_int) -> bool {
    true
}

unsafe extern "C" fn http_get_headers_size(_: *mut c_void, header_type: c_int) -> usize {
    with_stream(|s| map(s, header_type).len())
}

unsafe extern "C" fn http_get_headers(
    _: *mut c_void,
    header_type: c_int,
    out: *mut EnvoyHeader,
) -> bool {
    with_stream(|s| {
        for (i, (name, value)) in map(s, header_type).iter().enumerate() {
            // SAFETY: the module gave room for `get_headers_size` entries; the views point
            // into the thread-local stream, untouched until the module's next call.
            unsafe {
                out.add(i).write(EnvoyHeader {
                    key_ptr: name.as_ptr().cast::<c_char>(),
                    key_length: name.len(),
                    value_ptr: value.as_ptr().cast::<c_char>(),
                    value_length: value.len(),
                })
            };
        }
        true
    })
}

unsafe extern "C" fn http_get_header(
    _: *mut c_void,
    header_type: c_int,
    key: ModuleBuffer,
    out: *mut EnvoyBuffer,
    index: usize,
    count: *mut usize,
) -> bool {
    // SAFETY: lent for the call.
    let key = unsafe { bytes(key) };
    with_stream(|s| {
        let values: Vec<&Vec<u8>> = map(s, header_type)
            .iter()
            .filter(|(name, _)| name.eq_ignore_ascii_case(&key))
            .map(|(_, value)| value)
            .collect();
        if !count.is_null() {
            // SAFETY: the module's own variable.
            unsafe { count.write(values.len()) };
        }
        let view = values
            .get(index)
            .map_or(EnvoyBuffer::EMPTY, |v| EnvoyBuffer {
                ptr: v.as_ptr().cast(),
                length: v.len(),
            });
        // SAFETY: the module's own variable.
        unsafe { out.write(view) };
        true
    })
}

unsafe extern "C" fn http_set_header(
    _: *mut c_void,
    header_type: c_int,
    key: ModuleBuffer,
    value: ModuleBuffer,
) -> bool {
    // SAFETY: lent for the call; a null value is an empty copy, and means removal.
    let (key, remove, value) = unsafe { (bytes(key), value.ptr.is_null(), bytes(value)) };
    with_stream(|s| {
        let headers = map(s, header_type);
        headers.retain(|(name, _)| !name.eq_ignore_ascii_case(&key));
        if !remove {
            headers.push((key, value));
        }
        true
    })
}

unsafe extern "C" fn http_add_header(
    _: *mut c_void,
    header_type: c_int,
    key: ModuleBuffer,
    value: ModuleBuffer,
) -> bool {
    // SAFETY: lent for the call.
    let (key, value) = unsafe { (bytes(key), bytes(value)) };
    with_stream(|s| map(s, header_type).push((key, value)));
    true
}

unsafe extern "C" fn http_clear_route_cache(_: *mut c_void) {
    with_stream(|s| s.route_cache_cleared += 1);
}

unsafe extern "C" fn http_send_response(
    _: *mut c_void,
    status: u32,
    headers: *mut ModuleHeader,
    count: usize,
    body: ModuleBuffer,
    _details: ModuleBuffer,
) {
    let headers = if headers.is_null() || count == 0 {
        Vec::new()
    } else {
        // SAFETY: the module lends `count` headers for the call.
        unsafe { std::slice::from_raw_parts(headers, count) }
            .iter()
            .map(|h| {
                // SAFETY: each view is lent for the call.
                let (name, value) = unsafe {
                    (
                        copy(h.key_ptr, h.key_length),
                        copy(h.value_ptr, h.value_length),
                    )
                };
                (text(&name), text(&value))
            })
            .collect()
    };
    // SAFETY: lent for the call.
    let body = unsafe { bytes(body) };
    with_stream(|s| s.sent = Some((status, headers, body)));
}

unsafe extern "C" fn http_get_body_chunks_size(_: *mut c_void, body_type: c_int) -> usize {
    with_stream(|s| usize::from(!body(s, body_type).is_empty()))
}

unsafe extern "C" fn http_get_body_chunks(
    _: *mut c_void,
    body_type: c_int,
    out: *mut EnvoyBuffer,
) -> bool {
    with_stream(|s| {
        let b = body(s, body_type);
        if !b.is_empty() {
            // SAFETY: room for the one chunk `get_body_chunks_size` reported.
            unsafe {
                out.write(EnvoyBuffer {
                    ptr: b.as_ptr().cast(),
                    length: b.len(),
                })
            };
        }
        true
    })
}

unsafe extern "C" fn http_get_body_size(_: *mut c_void, body_type: c_int) -> usize {
    with_stream(|s| body(s, body_type).len())
}

unsafe extern "C" fn http_drain_body(_: *mut c_void, body_type: c_int, n: usize) -> bool {
    with_stream(|s| {
        let b = body(s, body_type);
        let n = n.min(b.len());
        b.drain(..n);
        true
    })
}

unsafe extern "C" fn http_append_body(
    _: *mut c_void,
    body_type: c_int,
    data: ModuleBuffer,
) -> bool {
    // SAFETY: lent for the call.
    let data = unsafe { bytes(data) };
    with_stream(|s| body(s, body_type).extend(data));
    true
}

unsafe extern "C" fn http_received_buffered_response_body(_: *mut c_void) -> bool {
    false
}

unsafe extern "C" fn http_filter_get_attribute_string(
    _: *mut c_void,
    attribute: c_int,
    out: *mut EnvoyBuffer,
) -> bool {
    with_stream(|s| match (&s.code_details, attribute) {
        (Some(details), super::ATTRIBUTE_RESPONSE_CODE_DETAILS) => {
            // SAFETY: the module's own variable; the view points into the thread-local.
            unsafe {
                out.write(EnvoyBuffer {
                    ptr: details.as_ptr().cast(),
                    length: details.len(),
                })
            };
            true
        }
        _ => false,
    })
}

unsafe fn define(
    name: ModuleBuffer,
    names: *mut ModuleBuffer,
    count: usize,
    id: *mut usize,
) -> c_int {
    // SAFETY: lent for the call.
    let (name, names) = unsafe { (text(&bytes(name)), labels(names, count)) };
    with_stream(|s| {
        // SAFETY: the module's own variable.
        unsafe { id.write(s.defined.len()) };
        s.defined.push((name, names));
    });
    METRICS_SUCCESS
}

unsafe extern "C" fn http_filter_config_define_counter(
    _: *mut c_void,
    name: ModuleBuffer,
    names: *mut ModuleBuffer,
    count: usize,
    id: *mut usize,
) -> c_int {
    // SAFETY: this callback's own contract.
    unsafe { define(name, names, count, id) }
}

unsafe extern "C" fn http_filter_config_define_gauge(
    _: *mut c_void,
    name: ModuleBuffer,
    names: *mut ModuleBuffer,
    count: usize,
    id: *mut usize,
) -> c_int {
    // SAFETY: this callback's own contract.
    unsafe { define(name, names, count, id) }
}

unsafe fn record(id: usize, values: *mut ModuleBuffer, count: usize, value: u64) -> c_int {
    // SAFETY: lent for the call.
    let values = unsafe { labels(values, count) };
    with_stream(|s| {
        // Envoy refuses label values that do not match the definition's label names.
        match s.defined.get(id) {
            Some((_, names)) if names.len() == values.len() => {
                s.recorded.push((id, values, value));
                METRICS_SUCCESS
            }
            Some(_) => 2,
            None => 1,
        }
    })
}

unsafe extern "C" fn http_filter_increment_counter(
    _: *mut c_void,
    id: usize,
    values: *mut ModuleBuffer,
    count: usize,
    value: u64,
) -> c_int {
    // SAFETY: this callback's own contract.
    unsafe { record(id, values, count, value) }
}

unsafe extern "C" fn http_filter_set_gauge(
    _: *mut c_void,
    id: usize,
    values: *mut ModuleBuffer,
    count: usize,
    value: u64,
) -> c_int {
    // SAFETY: this callback's own contract.
    unsafe { record(id, values, count, value) }
}
