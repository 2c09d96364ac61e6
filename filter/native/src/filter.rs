//! The filter configuration and one stream's filter, over the core's request pipeline
//! (`skewgate_core::pipeline::Request`) with Envoy's callbacks as its host ([`NativeHost`]).
//!
//! Envoy creates the configuration once, on its main thread, and every worker's streams share
//! it: the compiled routing table and the merged discovery documents are held once per Envoy
//! process, whatever `--concurrency` is (the proxy-wasm filter holds them per VM, or in shared
//! data). What the pipeline keeps per worker (its counters' ids, its log limits) is per thread
//! here too ([`ThreadState`]), so no request takes a lock.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use skewgate_core::config::{refused_message, ConfigError, FilterConfig, MAX_CONFIG_BYTES};
use skewgate_core::discovery::MergedDiscovery;
use skewgate_core::metrics::Counter;
use skewgate_core::pipeline::{
    Action, Bytes, Configured, HeaderBlock, Headers, Host, HostError, Level, Request, Worker,
};
use skewgate_core::plan::{CompiledConfig, LocalReply};
use skewgate_core::shared_discovery::{SharedData, StoreError, Versioned};

use crate::ffi::{self, Body, HeaderMap, LogLevel, MetricKind, Refused};

/// The gauge that is 1 while the filter runs the bootstrap's fallback configuration (the
/// proxy-wasm filter's `skewgate_fallback_configuration`).
pub const FALLBACK_GAUGE: &str = "skewgate_fallback_configuration";

/// What `on_http_filter_request_headers` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    Continue,
    Stop,
}

/// What `on_http_filter_response_body` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyPhase {
    Continue,
    /// Keep the body (the local `/openapi/v3` answer until complete).
    Buffer,
}

/// Each configuration's number, for the per-thread state made from it.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// Every labelled series counted in this Envoy so far (metric and label values), at most
/// [`MAX_SERIES`]. Envoy keeps a module's metrics in its configuration's scope: a series no
/// configuration names is dropped with the configuration that counted it. Each new
/// configuration names them all (adding 0) while the one it replaces still holds them, so a
/// series keeps its value across configurations, as the proxy-wasm filter's do.
static SERIES: Mutex<BTreeSet<(&'static str, Vec<String>)>> = Mutex::new(BTreeSet::new());

/// Bounds [`SERIES`]: the pipeline's own cap per configuration and worker is 4096 as well.
const MAX_SERIES: usize = 4096;

/// One accepted filter configuration, shared by every worker.
#[derive(Debug)]
pub struct NativeConfig {
    generation: u64,
    /// Dropped with the configuration: a worker's state made from it goes at that worker's
    /// next stream (no worker keeps a configuration Envoy has destroyed past that).
    alive: Arc<()>,
    compiled: Arc<CompiledConfig>,
    /// Envoy's metric id of each counter's metric, by metric name.
    counters: HashMap<&'static str, usize>,
}

impl NativeConfig {
    /// Parses, validates and compiles `config` (the filter configuration JSON the control plane
    /// renders for both data planes); defines the metrics. `None` refuses the configuration:
    /// Envoy rejects it (a NACK over xDS) and keeps the previous one.
    pub fn new(envoy: &ffi::FilterConfig<'_>, name: &[u8], config: &[u8]) -> Option<NativeConfig> {
        let started = Instant::now();
        if config.len() > MAX_CONFIG_BYTES {
            ffi::log(
                LogLevel::Error,
                format_args!(
                    "{}",
                    refused_message(ConfigError::TooLarge {
                        bytes: config.len()
                    })
                ),
            );
            return None;
        }
        let parsed = match FilterConfig::from_json(config) {
            Ok(parsed) => parsed,
            Err(e) => {
                ffi::log(LogLevel::Error, format_args!("{}", refused_message(e)));
                return None;
            }
        };
        let discovery = parsed.discovery.as_ref().map(MergedDiscovery::compile);
        let how = match &parsed.discovery {
            Some(d) => format!("{} (held once by this Envoy)", d.version),
            None => "off".to_string(),
        };
        let compiled = CompiledConfig::with_discovery(&parsed, discovery);
        let mut counters = HashMap::new();
        for kind in Counter::KINDS {
            match envoy.define(MetricKind::Counter, kind.metric_name(), kind.label_names()) {
                Ok(id) => {
                    counters.insert(kind.metric_name(), id);
                }
                Err(Refused) => ffi::log(
                    LogLevel::Warn,
                    format_args!("skewgate: cannot define metric {}", kind.metric_name()),
                ),
            }
        }
        let series = SERIES
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        for (metric, values) in &series {
            if let Some(id) = counters.get(metric) {
                // A failure costs that series its value, not the configuration.
                let _ = envoy.add_counter(*id, values, 0);
            }
        }
        let fallback = u64::from(compiled.fallback.is_some());
        match envoy.define(MetricKind::Gauge, FALLBACK_GAUGE, &[]) {
            Ok(gauge) if envoy.set_gauge(gauge, fallback).is_ok() => {}
            _ => ffi::log(
                LogLevel::Warn,
                format_args!("skewgate: cannot set metric {FALLBACK_GAUGE}"),
            ),
        }
        ffi::log(
            LogLevel::Info,
            format_args!(
                "skewgate: configured ({}) for apiserver {:?}: {} group-versions, {} peer clusters, merged discovery {how}; {} bytes in {} ms",
                String::from_utf8_lossy(name),
                parsed.local_apiserver,
                parsed.group_versions.len(),
                parsed.peer_clusters.len(),
                config.len(),
                started.elapsed().as_millis(),
            ),
        );
        if let Some(mode) = compiled.fallback {
            ffi::log(LogLevel::Warn, format_args!("{}", mode.loaded_message()));
        }
        Some(NativeConfig {
            generation: GENERATION.fetch_add(1, Ordering::Relaxed),
            alive: Arc::new(()),
            compiled: Arc::new(compiled),
            counters,
        })
    }

    /// This worker thread's state for this configuration, made on its first stream here.
    fn thread_state(&self) -> Rc<ThreadState> {
        THREAD_STATES.with(|states| {
            let mut states = states.borrow_mut();
            // States of configurations Envoy destroyed go (at most KEEP_STATES atomic loads).
            states.retain(|(_, alive, _)| alive.strong_count() > 0);
            if let Some((_, _, state)) = states.iter().find(|(g, _, _)| *g == self.generation) {
                return state.clone();
            }
            // Envoy creates a stream's filter from the configuration current when the stream
            // starts, so a few streams of older ones may still come (they get a fresh state
            // if theirs went); at most KEEP_STATES generations are kept.
            states.retain(|(g, _, _)| g.saturating_add(KEEP_STATES) > self.generation);
            let state = Rc::new(ThreadState {
                configured: Rc::new(Configured::new(self.compiled.clone())),
                worker: Rc::new(Worker::new()),
                counters: self.counters.clone(),
                series: RefCell::new(Vec::new()),
            });
            states.push((self.generation, Arc::downgrade(&self.alive), state.clone()));
            state
        })
    }
}

// Envoy calls `on_http_filter_new` with the configuration on every worker thread: it must be
// shareable across threads, which the compiler checks only here (it crosses as a pointer).
const _: fn() = || {
    fn shared_by_workers<T: Send + Sync>() {}
    shared_by_workers::<NativeConfig>();
};

/// Per-thread states kept for configurations this many generations back.
const KEEP_STATES: u64 = 4;

thread_local! {
    static THREAD_STATES: RefCell<Vec<ThreadEntry>> = const { RefCell::new(Vec::new()) };
}

/// A worker's state for one configuration: its generation, whether Envoy still holds it.
type ThreadEntry = (u64, Weak<()>, Rc<ThreadState>);

/// What one worker thread keeps for one configuration.
#[derive(Debug)]
struct ThreadState {
    configured: Rc<Configured>,
    worker: Rc<Worker>,
    counters: HashMap<&'static str, usize>,
    /// Each label set the pipeline defined (its metric id is the index): the metric's id and
    /// the label values, bounded by the pipeline's own series cap.
    series: RefCell<Vec<(usize, Vec<String>)>>,
}

/// Answers a request the filter could not plan with the pipeline's host-failure 503.
pub fn fail_closed(filter: &ffi::Filter) {
    let reply = LocalReply::host_failure();
    let _ = filter.send_response(
        u32::from(reply.code),
        &reply.headers(),
        reply.body.as_bytes(),
        "skewgate",
    );
}

/// One stream's filter.
pub struct NativeFilter {
    request: Request<NativeHost>,
    /// The request went through the filter. Envoy runs a filter's response hooks also for a
    /// stream an earlier filter answered (the health check's `/readyz` during a drain): that
    /// answer is not ours to map (the proxy-wasm filter never sees it).
    decoded: bool,
}

impl NativeFilter {
    pub fn new(config: &NativeConfig, filter: ffi::Filter) -> NativeFilter {
        let state = config.thread_state();
        let host = NativeHost {
            filter,
            state: state.clone(),
            body: BodyView::default(),
        };
        NativeFilter {
            request: Request::new(host, state.configured.clone(), state.worker.clone()),
            decoded: false,
        }
    }

    pub fn on_request_headers(&mut self) -> Next {
        self.decoded = true;
        match self.request.on_request_headers() {
            Action::Continue => Next::Continue,
            Action::Pause => Next::Stop,
        }
    }

    /// Stops only to read a JSON 404's body with its headers held (the core decides).
    pub fn on_response_headers(&mut self, end_of_stream: bool) -> Next {
        if !self.decoded {
            return Next::Continue;
        }
        match self.request.on_response_headers(end_of_stream) {
            Action::Continue => Next::Continue,
            Action::Pause => Next::Stop,
        }
    }

    /// The body at hand is what this filter buffered so far plus the piece just received
    /// (proxy-wasm gives its size the same way).
    pub fn on_response_body(&mut self, end_of_stream: bool) -> BodyPhase {
        // Most responses pass as they are: no body callbacks for them.
        if !self.decoded || !self.request.wants_response_body() {
            return BodyPhase::Continue;
        }
        let size = self.request.host_mut().measure_body();
        match self.request.on_response_body(size, end_of_stream) {
            Action::Continue => BodyPhase::Continue,
            Action::Pause => BodyPhase::Buffer,
        }
    }
}

/// The response body as one stream's hook sees it: the buffered part and the received piece.
#[derive(Debug, Default, Clone, Copy)]
struct BodyView {
    buffered: usize,
    received: usize,
}

impl BodyView {
    fn measure(&mut self, filter: &ffi::Filter) -> usize {
        let received = filter.body_size(Body::ReceivedResponse).unwrap_or(0);
        // When the piece received is the buffer itself (an earlier filter buffered the whole
        // body), it counts once.
        let buffered = if filter.received_is_buffered().unwrap_or(false) {
            0
        } else {
            filter.body_size(Body::BufferedResponse).unwrap_or(0)
        };
        *self = BodyView { buffered, received };
        buffered.saturating_add(received)
    }
}

/// The core's [`Host`] by Envoy's dynamic-module callbacks.
pub struct NativeHost {
    filter: ffi::Filter,
    state: Rc<ThreadState>,
    body: BodyView,
}

impl NativeHost {
    fn measure_body(&mut self) -> usize {
        self.body.measure(&self.filter)
    }
}

/// A refused callback, in the core's terms (Envoy gives no code: 1 is "refused").
fn refused(_: Refused) -> HostError {
    HostError(1)
}

fn header_map(map: Headers) -> HeaderMap {
    match map {
        Headers::Request => HeaderMap::Request,
        Headers::Response => HeaderMap::Response,
    }
}

impl Host for NativeHost {
    type RequestHeaders = HeaderBlock;

    fn request_headers(&mut self) -> Result<HeaderBlock, HostError> {
        self.filter.headers(HeaderMap::Request).map_err(refused)
    }

    fn response_header(&mut self, name: &str) -> Result<Option<Bytes>, HostError> {
        self.filter
            .header(HeaderMap::Response, name)
            .map_err(refused)
    }

    /// The one property the pipeline reads; any other is unknown here.
    fn property(&mut self, path: &[&str]) -> Result<Option<Bytes>, HostError> {
        match path {
            ["response", "code_details"] => self.filter.response_code_details().map_err(refused),
            _ => Ok(None),
        }
    }

    fn set_header(
        &mut self,
        map: Headers,
        name: &str,
        value: Option<&str>,
    ) -> Result<(), HostError> {
        self.filter
            .set_header(header_map(map), name, value.map(str::as_bytes))
            .map_err(refused)
    }

    fn add_header(&mut self, map: Headers, name: &str, value: &str) -> Result<(), HostError> {
        self.filter
            .add_header(header_map(map), name, value.as_bytes())
            .map_err(refused)
    }

    fn clear_route_cache(&mut self) -> Result<(), HostError> {
        self.filter.clear_route_cache().map_err(refused)
    }

    fn send_response(
        &mut self,
        status: u32,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(), HostError> {
        self.filter
            .send_response(status, headers, body, "skewgate")
            .map_err(refused)
    }

    /// Replaces everything at hand (the pipeline passes the size [`BodyView::measure`] gave):
    /// the buffered part and the received piece go, `body` takes the received piece's place.
    fn replace_response_body(&mut self, _size: usize, body: &[u8]) -> Result<(), HostError> {
        if self.body.buffered > 0 {
            self.filter
                .drain_body(Body::BufferedResponse, self.body.buffered)
                .map_err(refused)?;
        }
        if self.body.received > 0 {
            self.filter
                .drain_body(Body::ReceivedResponse, self.body.received)
                .map_err(refused)?;
        }
        self.body = BodyView::default();
        self.filter
            .append_body(Body::ReceivedResponse, body)
            .map_err(refused)
    }

    fn response_body(&mut self, size: usize) -> Result<Option<Bytes>, HostError> {
        let mut body = if self.body.buffered > 0 {
            self.filter.body(Body::BufferedResponse).map_err(refused)?
        } else {
            Vec::new()
        };
        body.extend(self.filter.body(Body::ReceivedResponse).map_err(refused)?);
        body.truncate(size);
        Ok(Some(body))
    }

    /// Envoy's dynamic modules keep calling the body hook while the response headers are
    /// stopped, and the headers stay the filter's to change until it continues.
    fn holds_response_headers(&self) -> bool {
        true
    }

    /// `name` is the pipeline's stat name, `metric;label=value;...`: the metric was defined
    /// with its label names when the configuration came; this label set gets an id here.
    fn define_metric(&mut self, name: &str) -> Result<u32, HostError> {
        let mut parts = name.split(';');
        let metric = parts.next().unwrap_or_default();
        let Some(id) = self.state.counters.get(metric) else {
            return Err(HostError(2));
        };
        let values: Vec<String> = parts
            .map(|pair| pair.split_once('=').map_or("", |(_, v)| v).to_string())
            .collect();
        // Once per series, worker and configuration: the lock is not on the request path.
        if let Some(metric) = Counter::KINDS
            .iter()
            .map(|k| k.metric_name())
            .find(|m| *m == metric)
        {
            let mut seen = SERIES.lock().unwrap_or_else(PoisonError::into_inner);
            if seen.len() < MAX_SERIES {
                seen.insert((metric, values.clone()));
            }
        }
        let mut series = self.state.series.borrow_mut();
        series.push((*id, values));
        u32::try_from(series.len().saturating_sub(1)).map_err(|_| HostError(3))
    }

    fn increment_metric(&mut self, id: u32) -> Result<(), HostError> {
        let series = self.state.series.borrow();
        let Some((metric, values)) = usize::try_from(id).ok().and_then(|i| series.get(i)) else {
            return Err(HostError(2));
        };
        self.filter
            .increment_counter(*metric, values)
            .map_err(refused)
    }

    fn now(&mut self) -> Result<Duration, HostError> {
        Ok(SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default())
    }

    fn log(&mut self, level: Level, message: std::fmt::Arguments<'_>) {
        let level = match level {
            Level::Error => LogLevel::Error,
            Level::Warn => LogLevel::Warn,
            Level::Info => LogLevel::Info,
            Level::Debug => LogLevel::Debug,
        };
        ffi::log(level, message);
    }

    fn shared_data(&self) -> &dyn SharedData {
        &NoSharedData
    }
}

/// The native filter holds merged discovery in its configuration, never in shared data: a
/// request never asks for a stored document (the documents it compiles are inline).
struct NoSharedData;

impl SharedData for NoSharedData {
    fn get(&self, _key: &str) -> Result<Option<Versioned>, StoreError> {
        Ok(None)
    }

    fn set(&self, _key: &str, _value: &[u8], _cas: Option<u32>) -> Result<(), StoreError> {
        Err(StoreError::Host(
            "no shared data in the native filter".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::fake::{self, with_stream, FakeStream};
    use skewgate_core::hygiene::UPSTREAM_CLUSTER;

    /// A filter configuration as the control plane renders it (no merged discovery): a 1.30
    /// local apiserver, `resource.k8s.io/v1alpha3` served by a 1.33 peer only.
    const CONFIG: &str = r#"{"schema":1,"local_apiserver":"apiserver-a",
        "peer_clusters":{"skewgate-peers-16b25d540f7c":["apiserver-b"]},
        "group_versions":[{"group":"resource.k8s.io","version":"v1alpha3","resources":[
            {"resource":"resourceclaims","peer_cluster":"skewgate-peers-16b25d540f7c"}]}],
        "failover_clusters":{"skewgate-failover-16b25d540f7c":["apiserver-b"]},
        "failover_all":"skewgate-failover-16b25d540f7c"}"#;
    const CLAIMS: &str = "/apis/resource.k8s.io/v1alpha3/namespaces/default/resourceclaims";

    /// A fresh fake stream, and the configuration accepted on it (its metrics defined there).
    fn configured() -> NativeConfig {
        fake::install();
        with_stream(|s| *s = FakeStream::default());
        NativeConfig::new(&fake::config(), b"skewgate", CONFIG.as_bytes()).expect("accepted")
    }

    fn get(path: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
        [
            (":method", "GET"),
            (":path", path),
            (":authority", "a"),
            (":scheme", "https"),
        ]
        .iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
    }

    fn header(headers: &[(Vec<u8>, Vec<u8>)], name: &str) -> Option<String> {
        headers
            .iter()
            .find(|(n, _)| n == name.as_bytes())
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }

    #[test]
    fn a_bad_configuration_is_refused_and_logged() {
        fake::install();
        with_stream(|s| *s = FakeStream::default());
        assert!(NativeConfig::new(&fake::config(), b"skewgate", b"{\"schema\":1").is_none());
        assert!(NativeConfig::new(&fake::config(), b"skewgate", &[0xff; 3]).is_none());
        let logs = with_stream(|s| s.logs.clone());
        assert!(
            logs.iter()
                .filter(|(level, line)| *level == LogLevel::Error as i32
                    && line.contains("keeping the previous configuration"))
                .count()
                == 2,
            "{logs:?}"
        );
    }

    /// The shell's whole request path on the fake Envoy: routed to the peer (header set,
    /// route cache cleared), Envoy's own 503 for the peer made a Status through the body
    /// hook, and the counter counted with its four labels as Envoy labels.
    #[test]
    fn a_peer_only_request_is_routed_and_envoys_reply_becomes_a_status() {
        let config = configured();
        with_stream(|s| s.request_headers = get(CLAIMS));
        let mut filter = NativeFilter::new(&config, fake::filter());
        assert_eq!(filter.on_request_headers(), Next::Continue);
        let (routed, cleared) = with_stream(|s| {
            (
                header(&s.request_headers, UPSTREAM_CLUSTER),
                s.route_cache_cleared,
            )
        });
        assert_eq!(
            routed.as_deref(),
            Some("skewgate-peers-16b25d540f7c-anonymous")
        );
        assert_eq!(cleared, 1);

        with_stream(|s| {
            s.response_headers = vec![
                (b":status".to_vec(), b"503".to_vec()),
                (b"content-type".to_vec(), b"text/plain".to_vec()),
            ];
            s.code_details =
                Some(b"upstream_reset_before_response_started{connection_failure}".to_vec());
        });
        filter.on_response_headers(false);
        with_stream(|s| {
            s.received = b"upstream connect error or disconnect/reset before headers".to_vec()
        });
        assert_eq!(filter.on_response_body(true), BodyPhase::Continue);
        let (status, content_type, body) = with_stream(|s| {
            (
                header(&s.response_headers, ":status"),
                header(&s.response_headers, "content-type"),
                String::from_utf8_lossy(&s.received).into_owned(),
            )
        });
        assert_eq!(status.as_deref(), Some("503"));
        assert_eq!(content_type.as_deref(), Some("application/json"));
        assert!(body.contains("\"kind\":\"Status\""), "{body}");

        let (defined, recorded) = with_stream(|s| (s.defined.clone(), s.recorded.clone()));
        let (id, values) = recorded
            .iter()
            .find(|(id, _, _)| defined[*id].0 == "apiserver_peer_proxy_errors_total")
            .map(|(id, values, _)| (*id, values.clone()))
            .expect("a peer proxy error counted");
        assert_eq!(defined[id].1, ["type", "group", "version", "resource"]);
        assert_eq!(
            values,
            ["connect", "resource.k8s.io", "v1alpha3", "resourceclaims"]
        );
    }

    /// Envoy drops a module's series with the configuration that counted it: the next
    /// configuration names every series counted before (adding 0) while the previous one still
    /// holds it. And the fallback gauge is set when the configuration comes, before any request.
    #[test]
    fn a_new_configuration_keeps_every_series_and_sets_the_fallback_gauge() {
        let config = configured();
        with_stream(|s| s.request_headers = get(CLAIMS));
        let mut filter = NativeFilter::new(&config, fake::filter());
        assert_eq!(filter.on_request_headers(), Next::Continue);
        with_stream(|s| {
            s.response_headers = vec![(b":status".to_vec(), b"200".to_vec())];
            s.code_details = Some(b"via_upstream".to_vec());
        });
        filter.on_response_headers(true);
        let labels = ["200", "resource.k8s.io", "v1alpha3", "resourceclaims"];
        let counted = with_stream(|s| {
            s.recorded.iter().any(|(id, values, n)| {
                s.defined[*id].0 == "apiserver_rerouted_request_total"
                    && values == &labels
                    && *n == 1
            })
        });
        assert!(counted);

        with_stream(|s| s.recorded.clear());
        let _next = NativeConfig::new(&fake::config(), b"skewgate", CONFIG.as_bytes()).unwrap();
        let (defined, recorded) = with_stream(|s| (s.defined.clone(), s.recorded.clone()));
        let named = |metric: &str, values: &[&str], value: u64| {
            recorded.iter().any(|(id, v, n)| {
                // The id of the newest definition of `metric`: the new configuration's.
                let newest = defined.iter().rposition(|(name, _)| name == metric);
                Some(*id) == newest && v == values && *n == value
            })
        };
        assert!(
            named("apiserver_rerouted_request_total", &labels, 0),
            "{recorded:?}"
        );
        assert!(named(FALLBACK_GAUGE, &[], 0), "{recorded:?}");
    }

    /// A body buffered over several hooks is read and replaced whole: the buffered part and
    /// the piece received count once each.
    #[test]
    fn the_body_at_hand_is_the_buffered_part_and_the_received_piece() {
        let config = configured();
        with_stream(|s| {
            s.buffered = b"hello ".to_vec();
            s.received = b"world".to_vec();
        });
        let mut filter = NativeFilter::new(&config, fake::filter());
        let host = filter.request.host_mut();
        assert_eq!(host.measure_body(), 11);
        assert_eq!(
            host.response_body(11).unwrap().as_deref(),
            Some(&b"hello world"[..])
        );
        host.replace_response_body(11, b"{}").unwrap();
        let (buffered, received) = with_stream(|s| (s.buffered.clone(), s.received.clone()));
        assert!(buffered.is_empty());
        assert_eq!(received, b"{}");
    }

    /// A stream an earlier filter answered (the health check's `/readyz` 503 while Envoy
    /// drains) passes untouched: only requests that went through the filter are mapped.
    #[test]
    fn a_reply_to_a_request_the_filter_never_saw_passes_untouched() {
        let config = configured();
        let mut filter = NativeFilter::new(&config, fake::filter());
        with_stream(|s| {
            s.response_headers = vec![(b":status".to_vec(), b"503".to_vec())];
            s.code_details = Some(b"health_check_failed".to_vec());
            s.received = b"draining".to_vec();
        });
        filter.on_response_headers(false);
        assert_eq!(filter.on_response_body(true), BodyPhase::Continue);
        let (headers, body) = with_stream(|s| (s.response_headers.clone(), s.received.clone()));
        assert_eq!(headers, vec![(b":status".to_vec(), b"503".to_vec())]);
        assert_eq!(body, b"draining");
    }

    /// What the request hook does when the filter cannot plan a request (a panic caught at
    /// the hook): the pipeline's host-failure 503, never the request passed on unfiltered.
    #[test]
    fn a_request_that_cannot_be_planned_is_answered_503() {
        let _config = configured();
        fail_closed(&fake::filter());
        let sent = with_stream(|s| s.sent.clone()).expect("answered");
        assert_eq!(sent.0, 503);
        assert!(String::from_utf8_lossy(&sent.2).contains("\"kind\":\"Status\""));
    }

    /// Header values are bytes: obs-text from a client never panics the shell.
    #[test]
    fn non_utf8_headers_are_handled_as_bytes() {
        let config = configured();
        with_stream(|s| {
            s.request_headers = get(CLAIMS);
            s.request_headers
                .push((b"x-obs".to_vec(), vec![0xff, 0xfe, 0x80]));
            s.request_headers.push((vec![0xc3, 0x28], b"v".to_vec()));
        });
        let mut filter = NativeFilter::new(&config, fake::filter());
        assert_eq!(filter.on_request_headers(), Next::Continue);
    }
}
