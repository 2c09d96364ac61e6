//! The filter's counters through the host: one host counter per counter and label values
//! ([`crate::metrics`] names them and bounds the label values by the configuration).
//!
//! Each distinct counter is defined with the host once per configuration and its id cached,
//! so a request costs one hash lookup and one host call per counter, never a formatted name.

use std::cell::RefCell;
use std::collections::HashMap;

use super::host::{Host, Level};
use crate::metrics::{Counter, MetricLabels};

/// Most distinct counters one configuration defines per worker; past it a new label set is
/// counted under `other` ([`Counter::collapsed`]). Labels are bounded by the configuration
/// already; this bounds the status codes too.
const MAX_SERIES: usize = 4096;

/// The metric ids of one configuration (`None` where the host refused to define one).
#[derive(Debug, Default)]
pub struct Metrics {
    ids: RefCell<HashMap<Counter, Option<u32>>>,
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
                            Level::Warn,
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
