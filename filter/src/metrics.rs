//! The filter's counters as Envoy metrics: one Envoy counter per counter and label values
//! (`skewgate_core::metrics` names them and bounds the label values by the configuration).
//! Envoy lists them under `wasmcustom.`; its `stats_tags` turn the labels in the name into
//! Prometheus labels.
//!
//! Each distinct counter is defined with the host once per configuration and its id cached,
//! so a request costs one hash lookup and one host call per counter, never a formatted name.

use std::cell::RefCell;
use std::collections::HashMap;

use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;

use skewgate_core::metrics::{Counter, MetricLabels};

use crate::host::Host;

/// Most distinct counters one configuration defines per worker; past it a new label set is
/// counted under `other` ([`Counter::collapsed`]). Labels are bounded by the configuration
/// already; this bounds the status codes too.
const MAX_SERIES: usize = 4096;

/// The metric ids of one configuration (`None` where the host refused to define one).
#[derive(Debug, Default)]
pub struct Metrics {
    ids: RefCell<HashMap<Counter, Option<u32>>>,
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
    /// Increment `counter` by one. A counter that cannot be defined or incremented is not worth
    /// failing the request for.
    pub fn count<H: Host>(&self, host: &mut H, labels: &MetricLabels, counter: Counter) {
        // Single-threaded VM and no re-entry: the borrow cannot fail; if it did, skip.
        let Ok(mut ids) = self.ids.try_borrow_mut() else {
            return;
        };
        let counter = if ids.len() >= MAX_SERIES && !ids.contains_key(&counter) {
            counter.collapsed()
        } else {
            counter
        };
        let id = match ids.get(&counter) {
            Some(id) => *id,
            None => {
                let name = counter.stat_name(labels);
                let id = match host.define_metric(&name) {
                    Ok(id) => Some(id),
                    Err(e) => {
                        host.log(
                            log::Level::Warn,
                            format_args!("skewgate: cannot define metric {name}: {e:?}"),
                        );
                        None
                    }
                };
                ids.insert(counter, id);
                id
            }
        };
        if let Some(id) = id {
            let _ = host.increment_metric(id);
        }
    }
}
