//! Counters of the xDS server, kept as atomics and listed as metric families when scraped.
//!
//! - `skewgate_xds_nacks_total{type_url}`: responses Envoy refused. Each refused version is
//!   counted once: it is never pushed again (the next push comes with the next snapshot).
//! - `skewgate_xds_acks_total{type_url}`: responses Envoy accepted.
//! - `skewgate_xds_responses_total{type_url}`: responses sent.
//! - `skewgate_xds_last_push_timestamp_seconds{type_url}`, `..._last_ack_...`: when the last
//!   response was sent and accepted; `skewgate_xds_push_age_seconds{type_url}`: how long ago
//!   the last one was sent.
//! - `skewgate_xds_streams`: ADS streams open now.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::SystemTime;

use crate::metrics::{unix_seconds, Families};

use super::{CLUSTER_TYPE_URL, EXTENSION_CONFIG_TYPE_URL};

/// The type URLs the counters are kept for, in exposition order.
const TYPE_URLS: [&str; 2] = [CLUSTER_TYPE_URL, EXTENSION_CONFIG_TYPE_URL];

#[derive(Debug, Default)]
struct PerType {
    nacks: AtomicU64,
    acks: AtomicU64,
    responses: AtomicU64,
    last_push: Mutex<Option<SystemTime>>,
    last_ack: Mutex<Option<SystemTime>>,
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
            if let Ok(mut t) = slot.last_push.lock() {
                *t = Some(SystemTime::now());
            }
        }
    }

    pub(crate) fn acked(&self, type_url: &str) {
        if let Some(slot) = self.slot(type_url) {
            slot.acks.fetch_add(1, Ordering::Relaxed);
            if let Ok(mut t) = slot.last_ack.lock() {
                *t = Some(SystemTime::now());
            }
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

    /// These metrics, for `/metrics`.
    pub fn families(&self) -> Families {
        let now = SystemTime::now();
        let per_type = |f: &dyn Fn(&PerType) -> Option<f64>| {
            TYPE_URLS
                .iter()
                .zip(&self.per_type)
                .filter_map(|(t, slot)| Some(([*t], f(slot)?)))
                .collect::<Vec<_>>()
        };
        let count = |f: fn(&PerType) -> &AtomicU64| {
            TYPE_URLS
                .iter()
                .zip(&self.per_type)
                .map(|(t, slot)| ([*t], f(slot).load(Ordering::Relaxed)))
                .collect::<Vec<_>>()
        };
        let time = |m: &Mutex<Option<SystemTime>>| m.lock().ok().and_then(|t| *t);
        let mut f = Families::new();
        f.counters(
            "skewgate_xds_nacks_total",
            "xDS responses Envoy refused (NACKed).",
            &["type_url"],
            count(|s| &s.nacks),
        );
        f.counters(
            "skewgate_xds_acks_total",
            "xDS responses Envoy accepted (ACKed).",
            &["type_url"],
            count(|s| &s.acks),
        );
        f.counters(
            "skewgate_xds_responses_total",
            "xDS responses sent.",
            &["type_url"],
            count(|s| &s.responses),
        );
        f.gauges(
            "skewgate_xds_last_push_timestamp_seconds",
            "When the last xDS response of this type was sent.",
            &["type_url"],
            per_type(&|s| time(&s.last_push).map(unix_seconds)),
        );
        f.gauges(
            "skewgate_xds_last_ack_timestamp_seconds",
            "When Envoy last accepted an xDS response of this type.",
            &["type_url"],
            per_type(&|s| time(&s.last_ack).map(unix_seconds)),
        );
        f.gauges(
            "skewgate_xds_push_age_seconds",
            "Seconds since the last xDS response of this type was sent.",
            &["type_url"],
            per_type(&|s| {
                let t = time(&s.last_push)?;
                Some(now.duration_since(t).unwrap_or_default().as_secs_f64())
            }),
        );
        f.gauge(
            "skewgate_xds_streams",
            "ADS streams open.",
            self.streams() as f64,
        );
        f
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
        m.acked(CLUSTER_TYPE_URL);
        assert_eq!(m.nacks(EXTENSION_CONFIG_TYPE_URL), 1);
        assert_eq!(m.nacks(CLUSTER_TYPE_URL), 0);
        assert_eq!(m.responses(CLUSTER_TYPE_URL), 2);
        let text = crate::metrics::encode(&m.families());
        assert!(text.contains(&format!(
            "skewgate_xds_nacks_total{{type_url=\"{EXTENSION_CONFIG_TYPE_URL}\"}} 1\n"
        )));
        assert!(text.contains(&format!(
            "skewgate_xds_responses_total{{type_url=\"{CLUSTER_TYPE_URL}\"}} 2\n"
        )));
        assert!(text.contains(&format!(
            "skewgate_xds_acks_total{{type_url=\"{CLUSTER_TYPE_URL}\"}} 1\n"
        )));
        assert!(text.contains(&format!(
            "skewgate_xds_push_age_seconds{{type_url=\"{CLUSTER_TYPE_URL}\"}} "
        )));
        assert!(!text.contains(&format!(
            "skewgate_xds_push_age_seconds{{type_url=\"{EXTENSION_CONFIG_TYPE_URL}\"}}"
        )));
    }
}
