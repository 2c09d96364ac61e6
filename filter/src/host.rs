//! Host calls that cannot panic.
//!
//! proxy-wasm's trait helpers `unwrap()` every host result and decode header values as UTF-8
//! with `unwrap()`: a client sending one obs-text byte in a header would crash the VM for every
//! request on that worker. We call `hostcalls` directly and work on bytes.

use proxy_wasm::hostcalls;
use proxy_wasm::types::{Bytes, MapType, Status};

/// All request header names and raw values, in one crossing of the VM boundary.
pub fn request_headers() -> Result<Vec<(String, Bytes)>, Status> {
    hostcalls::get_map_bytes(MapType::HttpRequestHeaders)
}

pub fn set_request_header(name: &str, value: &str) -> Result<(), Status> {
    hostcalls::set_map_value_bytes(MapType::HttpRequestHeaders, name, Some(value.as_bytes()))
}

pub fn remove_request_header(name: &str) -> Result<(), Status> {
    hostcalls::set_map_value_bytes(MapType::HttpRequestHeaders, name, None)
}

pub fn response_header(name: &str) -> Result<Option<Bytes>, Status> {
    hostcalls::get_map_value_bytes(MapType::HttpResponseHeaders, name)
}

pub fn set_response_header(name: &str, value: &str) -> Result<(), Status> {
    hostcalls::set_map_value_bytes(MapType::HttpResponseHeaders, name, Some(value.as_bytes()))
}

pub fn remove_response_header(name: &str) -> Result<(), Status> {
    hostcalls::set_map_value_bytes(MapType::HttpResponseHeaders, name, None)
}

pub fn replace_response_body(size: usize, body: &[u8]) -> Result<(), Status> {
    hostcalls::set_buffer(
        proxy_wasm::types::BufferType::HttpResponseBody,
        0,
        size,
        body,
    )
}

pub fn property(path: &[&str]) -> Result<Option<Bytes>, Status> {
    hostcalls::get_property(path.to_vec())
}

/// Make Envoy re-evaluate the route after we changed the headers it routes on. proxy-wasm
/// 0.2.5 has no helper; Envoy registers this foreign function for exactly that.
pub fn clear_route_cache() -> Result<(), Status> {
    hostcalls::call_foreign_function("clear_route_cache", None).map(|_| ())
}

pub fn plugin_configuration() -> Result<Option<Bytes>, Status> {
    hostcalls::get_buffer(
        proxy_wasm::types::BufferType::PluginConfiguration,
        0,
        usize::MAX,
    )
}

/// Adds a value (a header may repeat: one `X-Remote-Group` per group).
pub fn add_request_header(name: &str, value: &str) -> Result<(), Status> {
    hostcalls::add_map_value_bytes(MapType::HttpRequestHeaders, name, value.as_bytes())
}

pub fn add_response_header(name: &str, value: &str) -> Result<(), Status> {
    hostcalls::add_map_value_bytes(MapType::HttpResponseHeaders, name, value.as_bytes())
}

/// Answer the request here; Envoy stops it from going upstream.
pub fn send_response(status: u32, headers: &[(&str, &str)], body: &[u8]) -> Result<(), Status> {
    hostcalls::send_http_response(status, headers.to_vec(), Some(body))
}
