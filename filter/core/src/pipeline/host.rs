//! What the request pipeline asks of its host (Envoy, through one shell or another; a
//! recording fake in the tests), in the core's own types: a shell maps its host's errors, log
//! levels and filter statuses onto these.

use std::fmt;
use std::time::Duration;

use crate::shared_discovery::SharedData;

/// A header value or body piece as the host gives it: bytes, never assumed UTF-8.
pub type Bytes = Vec<u8>;

/// A host call that failed: the host's own status code, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostError(pub u32);

/// What the host does with the request or response after a callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Go on to the next filter (or upstream, or the client).
    Continue,
    /// Stop here: a local reply was sent, or the body is being buffered.
    Pause,
}

/// A log line's level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Error,
    Warn,
    Info,
    Debug,
}

/// Which header map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Headers {
    Request,
    Response,
}

/// Everything a request asks of the host. Each call but `log` crosses into the host.
pub trait Host {
    /// All request header names and raw values, in one crossing.
    fn request_headers(&mut self) -> Result<Vec<(String, Bytes)>, HostError>;
    fn response_header(&mut self, name: &str) -> Result<Option<Bytes>, HostError>;
    fn property(&mut self, path: &[&str]) -> Result<Option<Bytes>, HostError>;
    /// Sets the header to `value`, replacing every value; `None` removes it.
    fn set_header(
        &mut self,
        map: Headers,
        name: &str,
        value: Option<&str>,
    ) -> Result<(), HostError>;
    /// Adds a value (a header may repeat).
    fn add_header(&mut self, map: Headers, name: &str, value: &str) -> Result<(), HostError>;
    /// Make Envoy re-evaluate the route after we changed the headers it routes on.
    fn clear_route_cache(&mut self) -> Result<(), HostError>;
    /// Answer the request here; Envoy stops it from going upstream.
    fn send_response(
        &mut self,
        status: u32,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(), HostError>;
    /// Replace the first `size` bytes of the response body chunk at hand with `body`.
    fn replace_response_body(&mut self, size: usize, body: &[u8]) -> Result<(), HostError>;
    /// The first `size` bytes of the response body buffered so far.
    fn response_body(&mut self, size: usize) -> Result<Option<Bytes>, HostError>;
    /// Define a counter named `name` (Envoy: `wasmcustom.<name>`); its id.
    fn define_metric(&mut self, name: &str) -> Result<u32, HostError>;
    fn increment_metric(&mut self, id: u32) -> Result<(), HostError>;
    /// The host's clock, as time since the Unix epoch.
    fn now(&mut self) -> Result<Duration, HostError>;
    fn log(&mut self, level: Level, message: fmt::Arguments<'_>);
    /// Envoy's process-wide shared data, where merged discovery documents are kept.
    fn shared_data(&self) -> &dyn SharedData;
}
