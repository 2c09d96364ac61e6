//! The filter's counters, named like upstream's where the meaning matches. Envoy lists them
//! under `wasmcustom.` in its stats.

use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;

pub struct Metrics {
    /// A discovery request answered from the merged documents.
    pub discovery_cache_hits: Option<u32>,
    /// A discovery request we could not answer from them (forwarded to the local apiserver).
    pub discovery_cache_misses: Option<u32>,
    /// A `profile=nopeer` discovery request (forwarded to the local apiserver).
    pub discovery_nopeer: Option<u32>,
    /// A request routed to a peer.
    pub rerouted: Option<u32>,
    /// A peer-bound request Envoy could not complete (answered 503).
    pub peer_proxy_errors: Option<u32>,
}

fn counter(name: &str) -> Option<u32> {
    match hostcalls::define_metric(MetricType::Counter, name) {
        Ok(id) => Some(id),
        Err(e) => {
            log::warn!("skewgate: cannot define metric {name}: {e:?}");
            None
        }
    }
}

impl Metrics {
    pub fn define() -> Self {
        Metrics {
            discovery_cache_hits: counter("aggregator_discovery_peer_aggregated_cache_hits_total"),
            discovery_cache_misses: counter(
                "aggregator_discovery_peer_aggregated_cache_misses_total",
            ),
            discovery_nopeer: counter("aggregator_discovery_nopeer_requests_total"),
            rerouted: counter("apiserver_rerouted_request_total"),
            peer_proxy_errors: counter("apiserver_peer_proxy_errors_total"),
        }
    }

    pub fn inc(id: Option<u32>) {
        if let Some(id) = id {
            let _ = hostcalls::increment_metric(id, 1);
        }
    }
}
