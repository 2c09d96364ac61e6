//! The core pipeline's [`Host`] trait by the proxy-wasm host calls ([`ProxyHost`]); the core's
//! tests use a recording fake.
//!
//! proxy-wasm's trait helpers `unwrap()` every host result and decode header values as UTF-8
//! with `unwrap()`: a client sending one obs-text byte in a header would crash the VM for every
//! request on that worker. We call `hostcalls` directly and work on bytes, so no value a client
//! sends can panic here. What `hostcalls` itself still panics on (proxy-wasm 0.2.5) is not
//! reachable through Envoy: a status other than those it maps (Envoy answers these calls `Ok`
//! in the phases the filter makes them), and a header name that is not UTF-8 (Envoy's HTTP/1,
//! HTTP/2 and HTTP/3 codecs refuse any name that is not a token). The `HostError` branches are
//! for the statuses `hostcalls` does map.

use std::fmt;
use std::time::{Duration, UNIX_EPOCH};

use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, Bytes, MapType, MetricType, Status};
use skewgate_core::pipeline::{Headers, Host, HostError, Level};
use skewgate_core::shared_discovery::{SharedData, StoreError, Versioned};

/// The host's status code, for the core.
fn host_error(status: Status) -> HostError {
    HostError(status as u32)
}

fn map_type(map: Headers) -> MapType {
    match map {
        Headers::Request => MapType::HttpRequestHeaders,
        Headers::Response => MapType::HttpResponseHeaders,
    }
}

/// The Envoy host, through proxy-wasm's `hostcalls`.
#[derive(Debug, Default, Clone, Copy)]
pub struct ProxyHost;

impl Host for ProxyHost {
    type RequestHeaders = Vec<(String, Bytes)>;

    fn request_headers(&mut self) -> Result<Self::RequestHeaders, HostError> {
        hostcalls::get_map_bytes(MapType::HttpRequestHeaders).map_err(host_error)
    }

    fn response_header(&mut self, name: &str) -> Result<Option<Bytes>, HostError> {
        hostcalls::get_map_value_bytes(MapType::HttpResponseHeaders, name).map_err(host_error)
    }

    fn property(&mut self, path: &[&str]) -> Result<Option<Bytes>, HostError> {
        hostcalls::get_property(path.to_vec()).map_err(host_error)
    }

    fn set_header(
        &mut self,
        map: Headers,
        name: &str,
        value: Option<&str>,
    ) -> Result<(), HostError> {
        hostcalls::set_map_value_bytes(map_type(map), name, value.map(str::as_bytes))
            .map_err(host_error)
    }

    fn add_header(&mut self, map: Headers, name: &str, value: &str) -> Result<(), HostError> {
        hostcalls::add_map_value_bytes(map_type(map), name, value.as_bytes()).map_err(host_error)
    }

    /// proxy-wasm 0.2.5 has no helper; Envoy registers this foreign function for exactly that.
    fn clear_route_cache(&mut self) -> Result<(), HostError> {
        hostcalls::call_foreign_function("clear_route_cache", None)
            .map(|_| ())
            .map_err(host_error)
    }

    fn send_response(
        &mut self,
        status: u32,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(), HostError> {
        hostcalls::send_http_response(status, headers.to_vec(), Some(body)).map_err(host_error)
    }

    fn replace_response_body(&mut self, size: usize, body: &[u8]) -> Result<(), HostError> {
        hostcalls::set_buffer(BufferType::HttpResponseBody, 0, size, body).map_err(host_error)
    }

    fn response_body(&mut self, size: usize) -> Result<Option<Bytes>, HostError> {
        hostcalls::get_buffer(BufferType::HttpResponseBody, 0, size).map_err(host_error)
    }

    fn define_metric(&mut self, name: &str) -> Result<u32, HostError> {
        hostcalls::define_metric(MetricType::Counter, name).map_err(host_error)
    }

    fn increment_metric(&mut self, id: u32) -> Result<(), HostError> {
        hostcalls::increment_metric(id, 1).map_err(host_error)
    }

    fn now(&mut self) -> Result<Duration, HostError> {
        // Before the epoch cannot happen (the host counts nanoseconds from it); 0 if it did.
        hostcalls::get_current_time()
            .map_err(host_error)
            .map(|t| t.duration_since(UNIX_EPOCH).unwrap_or_default())
    }

    fn log(&mut self, level: Level, message: fmt::Arguments<'_>) {
        let level = match level {
            Level::Error => log::Level::Error,
            Level::Warn => log::Level::Warn,
            Level::Info => log::Level::Info,
            Level::Debug => log::Level::Debug,
        };
        // Through the `log` facade proxy-wasm installed: filtered by level before formatting.
        log::log!(level, "{message}");
    }

    fn shared_data(&self) -> &dyn SharedData {
        &HostSharedData
    }
}

/// The plugin configuration (root context only).
pub fn plugin_configuration() -> Result<Option<Bytes>, Status> {
    hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
}

/// The plugin configuration as a stream (root context only, during `on_configure`): each read
/// copies only the next piece into the VM, so a VM that skips the discovery documents never
/// holds them (docs/ARCHITECTURE.md, "Merged discovery").
#[derive(Debug)]
pub struct PluginConfigurationReader {
    offset: usize,
    size: usize,
}

impl PluginConfigurationReader {
    /// `size` is what Envoy passed to `on_configure`.
    pub fn new(size: usize) -> Self {
        PluginConfigurationReader { offset: 0, size }
    }
}

impl std::io::Read for PluginConfigurationReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let want = buf.len().min(self.size.saturating_sub(self.offset));
        if want == 0 {
            return Ok(0);
        }
        let piece = hostcalls::get_buffer(BufferType::PluginConfiguration, self.offset, want)
            .map_err(|status| std::io::Error::other(format!("{status:?}")))?
            .unwrap_or_default();
        let n = piece.len().min(want);
        let (Some(dst), Some(src)) = (buf.get_mut(..n), piece.get(..n)) else {
            return Ok(0);
        };
        dst.copy_from_slice(src);
        self.offset += n;
        Ok(n)
    }
}

/// Envoy's process-wide shared data (per `vm_id`), for the merged discovery documents.
#[derive(Debug, Default, Clone, Copy)]
pub struct HostSharedData;

impl SharedData for HostSharedData {
    fn get(&self, key: &str) -> Result<Option<Versioned>, StoreError> {
        match hostcalls::get_shared_data(key) {
            Ok((Some(value), cas)) => Ok(Some((value, cas))),
            Ok((None, _)) => Ok(None),
            Err(status) => Err(StoreError::Host(format!("{status:?}"))),
        }
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        match hostcalls::set_shared_data(key, Some(value), cas) {
            Ok(()) => Ok(()),
            Err(Status::CasMismatch) => Err(StoreError::CasMismatch),
            Err(status) => Err(StoreError::Host(format!("{status:?}"))),
        }
    }
}
