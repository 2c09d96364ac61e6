//! Counters of the xDS server, kept as atomics and rendered in the Prometheus text format.
//!
//! - `skewgate_xds_nacks_total{type_url}`: responses Envoy refused. Each refused version is
//!   counted once: it is never pushed again (the next push comes with the next snapshot).
//! - `skewgate_xds_responses_total{type_url}`: responses sent.
//! - `skewgate_xds_streams`: ADS streams open now.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;

use super::{CLUSTER_TYPE_URL, EXTENSION_CONFIG_TYPE_URL};

/// The type URLs the counters are kept for, in exposition order.
const TYPE_URLS: [&str; 2] = [CLUSTER_TYPE_URL, EXTENSION_CONFIG_TYPE_URL];

#[derive(Debug, Default)]
struct PerType {
    nacks: AtomicU64,
    responses: AtomicU64,
}

/// The server's counters; share one `Arc<XdsMetrics>` between the server and `/metrics`.
#[derive(Debug, Default)]
pub struct XdsMetrics {
    per_type: [PerType; 2],
    streams: AtomicI64,
    last_nack: Mutex<Option<(String, String)>>,
}

impl XdsMetrics {
    pub fn new() -> Self {
        Self::default()
    }

    fn slot(&self, type_url: &str) -> Option<&PerType> {
        TYPE_URLS
            .iter()
            .position(|t| *t == type_url)
            .map(|i| &self.per_type[i])
    }

    pub(crate) fn nacked(&self, type_url: &str, message: &str) {
        if let Some(slot) = self.slot(type_url) {
            slot.nacks.fetch_add(1, Ordering::Relaxed);
        }
        if let Ok(mut last) = self.last_nack.lock() {
            *last = Some((type_url.to_string(), message.to_string()));
        }
    }

    pub(crate) fn sent(&self, type_url: &str) {
        if let Some(slot) = self.slot(type_url) {
            slot.responses.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn stream_opened(&self) {
        self.streams.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn stream_closed(&self) {
        self.streams.fetch_sub(1, Ordering::Relaxed);
    }

    /// `skewgate_xds_nacks_total{type_url}`.
    pub fn nacks(&self, type_url: &str) -> u64 {
        self.slot(type_url)
            .map_or(0, |s| s.nacks.load(Ordering::Relaxed))
    }

    /// `skewgate_xds_responses_total{type_url}`.
    pub fn responses(&self, type_url: &str) -> u64 {
        self.slot(type_url)
            .map_or(0, |s| s.responses.load(Ordering::Relaxed))
    }

    /// ADS streams open now.
    pub fn streams(&self) -> i64 {
        self.streams.load(Ordering::Relaxed)
    }

    /// The type URL and Envoy's message of the latest NACK.
    pub fn last_nack(&self) -> Option<(String, String)> {
        self.last_nack.lock().ok().and_then(|l| l.clone())
    }

    /// The Prometheus text exposition of these counters.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP skewgate_xds_nacks_total xDS responses Envoy refused (NACKed).\n");
        out.push_str("# TYPE skewgate_xds_nacks_total counter\n");
        for t in TYPE_URLS {
            out.push_str(&format!(
                "skewgate_xds_nacks_total{{type_url=\"{t}\"}} {}\n",
                self.nacks(t)
            ));
        }
        out.push_str("# HELP skewgate_xds_responses_total xDS responses sent.\n");
        out.push_str("# TYPE skewgate_xds_responses_total counter\n");
        for t in TYPE_URLS {
            out.push_str(&format!(
                "skewgate_xds_responses_total{{type_url=\"{t}\"}} {}\n",
                self.responses(t)
            ));
        }
        out.push_str("# HELP skewgate_xds_streams ADS streams open.\n");
        out.push_str("# TYPE skewgate_xds_streams gauge\n");
        out.push_str(&format!("skewgate_xds_streams {}\n", self.streams()));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_type_and_renders() {
        let m = XdsMetrics::new();
        m.nacked(EXTENSION_CONFIG_TYPE_URL, "bad config");
        m.sent(CLUSTER_TYPE_URL);
        m.sent(CLUSTER_TYPE_URL);
        m.nacked("type.googleapis.com/unknown", "ignored in counters");
        assert_eq!(m.nacks(EXTENSION_CONFIG_TYPE_URL), 1);
        assert_eq!(m.nacks(CLUSTER_TYPE_URL), 0);
        assert_eq!(m.responses(CLUSTER_TYPE_URL), 2);
        let text = m.render();
        assert!(text.contains(&format!(
            "skewgate_xds_nacks_total{{type_url=\"{EXTENSION_CONFIG_TYPE_URL}\"}} 1\n"
        )));
        assert!(text.contains(&format!(
            "skewgate_xds_responses_total{{type_url=\"{CLUSTER_TYPE_URL}\"}} 2\n"
        )));
    }
}
