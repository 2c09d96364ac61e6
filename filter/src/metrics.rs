//! The filter's own gauge as an Envoy metric (the per-request counters are counted by the core's
//! pipeline through the host, `skewgate_core::pipeline`).

use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;

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

fn define(kind: MetricType, name: &str) -> Option<u32> {
    match hostcalls::define_metric(kind, name) {
        Ok(id) => Some(id),
        Err(e) => {
            log::warn!("skewgate: cannot define metric {name}: {e:?}");
            None
        }
    }
}
