//! The filter's counters, named like upstream's where the meaning matches (`skewgate_` where
//! upstream has none). Envoy lists them under `wasmcustom.` in its stats.

use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;
use skewgate_core::plan::Counter;

/// The metric id of each [`Counter`]; `None` where the host refused to define it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Metrics {
    pub discovery_cache_hits: Option<u32>,
    pub discovery_cache_misses: Option<u32>,
    pub discovery_nopeer: Option<u32>,
    pub rerouted: Option<u32>,
    pub peer_proxy_errors: Option<u32>,
    pub retained: Option<u32>,
    pub peer_discovery_pending: Option<u32>,
    pub not_served: Option<u32>,
}

/// A gauge: 1 while the filter runs the bootstrap's fallback configuration (its control plane
/// has not configured it yet), 0 once a configuration from the control plane replaced it.
pub const FALLBACK_GAUGE: &str = "skewgate_fallback_configuration";

/// Set [`FALLBACK_GAUGE`]. Every VM sets the same gauge (Envoy shares stats by name) on each
/// configuration it accepts; a refused configuration leaves it as it was.
pub fn set_fallback(on: bool) {
    let Some(id) = define(MetricType::Gauge, FALLBACK_GAUGE) else {
        return;
    };
    if let Err(e) = hostcalls::record_metric(id, u64::from(on)) {
        log::warn!("skewgate: cannot set metric {FALLBACK_GAUGE}: {e:?}");
    }
}

fn counter(name: &str) -> Option<u32> {
    define(MetricType::Counter, name)
}

fn define(kind: MetricType, name: &str) -> Option<u32> {
    match hostcalls::define_metric(kind, name) {
        Ok(id) => Some(id),
        Err(e) => {
            log::warn!("skewgate: cannot define metric {name}: {e:?}");
            None
        }
    }
}

impl Metrics {
    /// Defines the counters with the host (root context, once per VM).
    pub fn define() -> Self {
        Metrics {
            discovery_cache_hits: counter("aggregator_discovery_peer_aggregated_cache_hits_total"),
            discovery_cache_misses: counter(
                "aggregator_discovery_peer_aggregated_cache_misses_total",
            ),
            discovery_nopeer: counter("aggregator_discovery_nopeer_requests_total"),
            rerouted: counter("apiserver_rerouted_request_total"),
            peer_proxy_errors: counter("apiserver_peer_proxy_errors_total"),
            retained: counter("skewgate_retained_unavailable_total"),
            peer_discovery_pending: counter("skewgate_peer_discovery_pending_total"),
            not_served: counter("skewgate_not_served_404_total"),
        }
    }

    pub fn id(&self, counter: Counter) -> Option<u32> {
        match counter {
            Counter::DiscoveryCacheHit => self.discovery_cache_hits,
            Counter::DiscoveryCacheMiss => self.discovery_cache_misses,
            Counter::DiscoveryNoPeer => self.discovery_nopeer,
            Counter::Rerouted => self.rerouted,
            Counter::PeerProxyError => self.peer_proxy_errors,
            Counter::Retained => self.retained,
            Counter::PeerDiscoveryPending => self.peer_discovery_pending,
            Counter::NotServed => self.not_served,
        }
    }
}
