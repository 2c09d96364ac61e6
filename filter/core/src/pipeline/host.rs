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

/// A request's headers as a host hands them over: each name with its raw value, in the host's
/// order. The pipeline reads them through [`pairs`](RequestHeaders::pairs), borrowed, so a host
/// may hold them however is cheapest for it.
pub trait RequestHeaders {
    /// Every header as (name, raw value), borrowed from `self`.
    fn pairs(&self) -> Vec<(&str, &[u8])>;
}

/// As proxy-wasm gives them: a name and a value per header, each its own allocation.
impl RequestHeaders for Vec<(String, Bytes)> {
    fn pairs(&self) -> Vec<(&str, &[u8])> {
        self.iter()
            .map(|(name, value)| (name.as_str(), value.as_slice()))
            .collect()
    }
}

/// Headers copied out of a host in one block: every name in one string, every value in one
/// buffer, their places in a third. Three allocations for a request instead of two per header
/// (the native shell copies Envoy's headers into one; Envoy lends its views only until the hook
/// returns or a header is set), and the names checked for UTF-8 in one pass.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct HeaderBlock {
    names: String,
    values: Vec<u8>,
    /// Where each header's name and value end in `names` and `values`; each starts where the
    /// previous one ended.
    ends: Vec<(usize, usize)>,
}

impl HeaderBlock {
    /// Copies `headers`, whose names take `name_bytes` and values `value_bytes` (for the
    /// capacities). A name that is not UTF-8 (an HTTP header name is ASCII, and Envoy's codecs
    /// refuse any other, so no request that reaches an apiserver has one) is kept with U+FFFD
    /// for each bad sequence: the native shell's views are bytes, and nothing here fails on
    /// them.
    pub fn copied<'h, I>(headers: I, name_bytes: usize, value_bytes: usize) -> HeaderBlock
    where
        I: IntoIterator<Item = (&'h [u8], &'h [u8])>,
        I::IntoIter: ExactSizeIterator,
    {
        let headers = headers.into_iter();
        let mut names = Vec::with_capacity(name_bytes);
        let mut values = Vec::with_capacity(value_bytes);
        let mut ends = Vec::with_capacity(headers.len());
        for (name, value) in headers {
            names.extend_from_slice(name);
            values.extend_from_slice(value);
            ends.push((names.len(), values.len()));
        }
        // One check for every name: all of them together are UTF-8 and each ends on a
        // character boundary exactly when each of them is UTF-8.
        let names = match String::from_utf8(names) {
            Ok(names) if ends.iter().all(|&(end, _)| names.is_char_boundary(end)) => names,
            Ok(names) => lossy_names(names.as_bytes(), &mut ends),
            Err(e) => lossy_names(e.as_bytes(), &mut ends),
        };
        HeaderBlock {
            names,
            values,
            ends,
        }
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }
}

/// The slow path, for names that are not all UTF-8: each name of `bytes` (ending at `ends`)
/// made text on its own, and `ends` moved to where the names end now.
fn lossy_names(bytes: &[u8], ends: &mut [(usize, usize)]) -> String {
    let mut names = String::with_capacity(bytes.len());
    let mut start = 0;
    for (end, _) in ends.iter_mut() {
        names.push_str(&String::from_utf8_lossy(
            bytes.get(start..*end).unwrap_or_default(),
        ));
        start = *end;
        *end = names.len();
    }
    names
}

impl RequestHeaders for HeaderBlock {
    fn pairs(&self) -> Vec<(&str, &[u8])> {
        let (mut name_start, mut value_start) = (0, 0);
        self.ends
            .iter()
            .map(|&(name_end, value_end)| {
                // In range by construction (`push`), and on char boundaries: each name was
                // appended whole.
                let name = self.names.get(name_start..name_end).unwrap_or_default();
                let value = self.values.get(value_start..value_end).unwrap_or_default();
                (name_start, value_start) = (name_end, value_end);
                (name, value)
            })
            .collect()
    }
}

/// Everything a request asks of the host. Each call but `log` crosses into the host.
pub trait Host {
    /// How this host holds a request's headers.
    type RequestHeaders: RequestHeaders;
    /// All request header names and raw values, in one crossing.
    fn request_headers(&mut self) -> Result<Self::RequestHeaders, HostError>;
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
    /// Whether a [`Action::Pause`] at the response headers holds them while the body keeps
    /// coming to the body callback, where the held headers can still be changed. Envoy's
    /// dynamic modules do; proxy-wasm does not (its host turns that pause into "stop
    /// everything", and no body callback comes until the filter resumes, which sends the
    /// headers), so there a JSON 404 that only its body tells apart passes as it came.
    fn holds_response_headers(&self) -> bool {
        false
    }
    /// Define a counter named `name` (Envoy: `wasmcustom.<name>`); its id.
    fn define_metric(&mut self, name: &str) -> Result<u32, HostError>;
    fn increment_metric(&mut self, id: u32) -> Result<(), HostError>;
    /// The host's clock, as time since the Unix epoch.
    fn now(&mut self) -> Result<Duration, HostError>;
    fn log(&mut self, level: Level, message: fmt::Arguments<'_>);
    /// Envoy's process-wide shared data, where merged discovery documents are kept.
    fn shared_data(&self) -> &dyn SharedData;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block gives back what went in, in order, repeats and empty values included, as the
    /// owned form does; a name that is not UTF-8 comes back with U+FFFD, also when the names
    /// together would be UTF-8 (a character split across two names).
    #[test]
    fn a_header_block_gives_back_what_went_in() {
        let cases: &[&[(&[u8], &[u8])]] = &[
            &[
                (b":method", b"GET"),
                (b":path", b"/api/v1/pods"),
                (b"x-remote-group", b"a"),
                (b"x-remote-group", b"b"),
                (b"empty", b""),
                (b"", b"no name"),
                (b"bad\xffname", b"\xfe\x00value"),
            ],
            // "\xc3\xa9" is é: split across two names, each is bad on its own.
            &[(b"a\xc3", b"1"), (b"\xa9b", b"2"), (b"ok", b"3")],
            &[(b"caf\xc3\xa9", b"\xc3\xa9"), (b"\xf0\x9f\x98\x80", b"")],
            &[],
        ];
        for headers in cases {
            let block = HeaderBlock::copied(headers.iter().copied(), 0, 0);
            let owned: Vec<(String, Bytes)> = headers
                .iter()
                .map(|(name, value)| (String::from_utf8_lossy(name).into_owned(), value.to_vec()))
                .collect();
            assert_eq!(block.len(), headers.len());
            assert_eq!(block.pairs(), owned.pairs(), "{headers:?}");
        }
        let split = HeaderBlock::copied(cases[1].iter().copied(), 0, 0);
        assert_eq!(
            split.pairs(),
            [("a\u{fffd}", &b"1"[..]), ("\u{fffd}b", b"2"), ("ok", b"3")]
        );
        assert!(HeaderBlock::default().pairs().is_empty());
    }
}
