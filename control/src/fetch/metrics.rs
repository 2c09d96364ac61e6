//! Discovery sync metrics: errors by type (upstream's name), and per apiserver the last
//! success, the last error and how many attempts in a row failed. Plain atomics and a mutex,
//! rendered in the Prometheus text format.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::SystemTime;

use super::error::{ErrorType, FetchError};
use crate::metrics::{unix_seconds, Families};

/// How a successful attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncOutcome {
    /// New documents, different from the last good view.
    Updated,
    /// Fetched in full (or partly 304), equal to the last good view.
    Unchanged,
    /// 304 for both documents: nothing parsed.
    NotModified,
}

impl SyncOutcome {
    const ALL: [SyncOutcome; 3] = [
        SyncOutcome::Updated,
        SyncOutcome::Unchanged,
        SyncOutcome::NotModified,
    ];

    pub fn label(self) -> &'static str {
        match self {
            SyncOutcome::Updated => "updated",
            SyncOutcome::Unchanged => "unchanged",
            SyncOutcome::NotModified => "not_modified",
        }
    }
}

/// The sync state of one apiserver.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApiserverSyncStatus {
    pub last_success: Option<SystemTime>,
    pub last_error: Option<String>,
    pub last_error_type: Option<ErrorType>,
    pub last_error_time: Option<SystemTime>,
    /// Failed attempts since the last success.
    pub consecutive_failures: u64,
    /// Legacy group-versions that answered with an HTTP error in the last success.
    pub stale_group_versions: usize,
    /// Fetches finished, good or not, since this apiserver was first fetched (or came back).
    pub fetches: u64,
}

#[derive(Debug, Default)]
pub struct DiscoveryMetrics {
    errors: [AtomicU64; ErrorType::ALL.len()],
    outcomes: [AtomicU64; SyncOutcome::ALL.len()],
    coalesced_triggers: AtomicU64,
    apiservers: Mutex<BTreeMap<String, ApiserverSyncStatus>>,
}

/// The most of an error message we keep (for `/debug/skew`; never a label value).
const MAX_ERROR_CHARS: usize = 300;

impl DiscoveryMetrics {
    pub fn new() -> Self {
        Self::default()
    }

    /// Keep series for `id` from now on (its watch starts), until [`DiscoveryMetrics::forget`].
    pub fn register(&self, id: &str) {
        let mut map = self.apiservers.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(id.to_string()).or_default();
    }

    /// Only a registered apiserver has series: a fetch that ends after its peer left (an
    /// aborted task runs on until its next await) cannot bring them back, so the per-apiserver
    /// series are exactly the running watches, however many peers come and go.
    fn with_status(&self, id: &str, f: impl FnOnce(&mut ApiserverSyncStatus)) {
        let mut map = self.apiservers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(status) = map.get_mut(id) {
            f(status);
        }
    }

    pub fn record_success(&self, id: &str, outcome: SyncOutcome, stale_group_versions: usize) {
        let idx = SyncOutcome::ALL
            .iter()
            .position(|o| *o == outcome)
            .unwrap_or(0);
        self.outcomes[idx].fetch_add(1, Ordering::Relaxed);
        self.with_status(id, |s| {
            s.last_success = Some(SystemTime::now());
            s.consecutive_failures = 0;
            s.fetches += 1;
            s.stale_group_versions = stale_group_versions;
        });
    }

    pub fn record_error(&self, id: &str, error: &FetchError) {
        let t = error.error_type();
        self.errors[t.index()].fetch_add(1, Ordering::Relaxed);
        let message: String = error.to_string().chars().take(MAX_ERROR_CHARS).collect();
        self.with_status(id, |s| {
            s.last_error = Some(message);
            s.last_error_type = Some(t);
            s.last_error_time = Some(SystemTime::now());
            s.consecutive_failures += 1;
            s.fetches += 1;
        });
    }

    /// A holder-identity refetch trigger came within the rate limit and was deferred or
    /// coalesced.
    pub fn record_coalesced_trigger(&self) {
        self.coalesced_triggers.fetch_add(1, Ordering::Relaxed);
    }

    pub fn coalesced_triggers_total(&self) -> u64 {
        self.coalesced_triggers.load(Ordering::Relaxed)
    }

    /// Drop an apiserver's series (it left the cluster).
    pub fn forget(&self, id: &str) {
        let mut map = self.apiservers.lock().unwrap_or_else(|p| p.into_inner());
        map.remove(id);
    }

    pub fn errors_total(&self, t: ErrorType) -> u64 {
        self.errors[t.index()].load(Ordering::Relaxed)
    }

    pub fn outcomes_total(&self, outcome: SyncOutcome) -> u64 {
        SyncOutcome::ALL
            .iter()
            .position(|o| *o == outcome)
            .map(|i| self.outcomes[i].load(Ordering::Relaxed))
            .unwrap_or(0)
    }

    pub fn status(&self, id: &str) -> Option<ApiserverSyncStatus> {
        let map = self.apiservers.lock().unwrap_or_else(|p| p.into_inner());
        map.get(id).cloned()
    }

    /// These metrics, for `/metrics`.
    pub fn families(&self) -> Families {
        let now = SystemTime::now();
        let mut f = Families::new();
        f.counters(
            "apiserver_peer_discovery_sync_errors_total",
            "Failed discovery fetches from apiservers (the last good view is kept), by type.",
            &["type"],
            ErrorType::ALL
                .iter()
                .map(|t| ([t.label()], self.errors_total(*t))),
        );
        f.counters(
            "skewgate_discovery_syncs_total",
            "Successful discovery fetches from apiservers, by result.",
            &["result"],
            SyncOutcome::ALL
                .iter()
                .map(|o| ([o.label()], self.outcomes_total(*o))),
        );
        f.counter(
            "skewgate_discovery_holder_refetches_coalesced_total",
            "Refetches asked for by a new holder identity within --holder-refetch-interval of the last one: deferred to its end and coalesced.",
            self.coalesced_triggers_total(),
        );
        let map = self
            .apiservers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let per = |value: &dyn Fn(&ApiserverSyncStatus) -> Option<f64>| {
            map.iter()
                .filter_map(|(id, s)| Some(([id.as_str()], value(s)?)))
                .collect::<Vec<_>>()
        };
        f.gauges(
            "skewgate_discovery_last_success_timestamp_seconds",
            "When an apiserver's discovery was last fetched successfully.",
            &["apiserver"],
            per(&|s| s.last_success.map(unix_seconds)),
        );
        f.gauges(
            "skewgate_discovery_age_seconds",
            "Seconds since an apiserver's discovery was last fetched successfully (how old the view routing uses is).",
            &["apiserver"],
            per(&|s| {
                let t = s.last_success?;
                Some(now.duration_since(t).unwrap_or_default().as_secs_f64())
            }),
        );
        f.counters(
            "skewgate_discovery_fetches_total",
            "Discovery fetches from an apiserver, good or not (its series goes when the peer leaves).",
            &["apiserver"],
            map.iter().map(|(id, s)| ([id.as_str()], s.fetches)),
        );
        f.gauges(
            "skewgate_discovery_consecutive_failures",
            "Failed discovery fetches from an apiserver since its last success.",
            &["apiserver"],
            per(&|s| Some(s.consecutive_failures as f64)),
        );
        f.gauges(
            "skewgate_discovery_stale_group_versions",
            "Legacy group-versions of an apiserver that answered with an error (kept as Stale).",
            &["apiserver"],
            per(&|s| Some(s.stale_group_versions as f64)),
        );
        f.gauges(
            "skewgate_discovery_last_error_timestamp_seconds",
            "When an apiserver's discovery fetch last failed.",
            &["apiserver"],
            per(&|s| s.last_error_time.map(unix_seconds)),
        );
        // The type only: the message is free text (an apiserver's, a URL's), and a label of it
        // would make a series per distinct error, unbounded. It is on `/debug/skew` and in
        // the log.
        f.gauges(
            "skewgate_discovery_last_error_info",
            "The type of the last discovery fetch error of an apiserver (value 1); the message is on /debug/skew.",
            &["apiserver", "type"],
            map.iter().filter_map(|(id, s)| {
                s.last_error.as_ref()?;
                Some(([id.as_str(), s.last_error_type?.label()], 1.0))
            }),
        );
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_renders() {
        let m = DiscoveryMetrics::new();
        m.register("apiserver-a");
        m.register("apiserver-b");
        m.record_error(
            "apiserver-b",
            &FetchError::Connect {
                url: "https://10.0.0.2:6443/apis".into(),
                message: "connection refused \"x\"\nmore".into(),
            },
        );
        m.record_error(
            "apiserver-b",
            &FetchError::invalid("https://10.0.0.2:6443/apis", "bad"),
        );
        m.record_success("apiserver-a", SyncOutcome::Updated, 0);
        m.record_success("apiserver-a", SyncOutcome::NotModified, 0);
        assert_eq!(m.errors_total(ErrorType::Connect), 1);
        assert_eq!(m.errors_total(ErrorType::Garbage), 1);
        assert_eq!(m.errors_total(ErrorType::Timeout), 0);
        assert_eq!(m.outcomes_total(SyncOutcome::NotModified), 1);
        let b = m.status("apiserver-b").unwrap();
        assert_eq!(b.consecutive_failures, 2);
        assert_eq!(b.last_error_type, Some(ErrorType::Garbage));
        assert!(b.last_success.is_none());
        let a = m.status("apiserver-a").unwrap();
        assert!(a.last_success.is_some() && a.last_error.is_none());

        let text = crate::metrics::encode(&m.families());
        for line in [
            "apiserver_peer_discovery_sync_errors_total{type=\"connect\"} 1",
            "apiserver_peer_discovery_sync_errors_total{type=\"garbage\"} 1",
            "apiserver_peer_discovery_sync_errors_total{type=\"too_large\"} 0",
            "skewgate_discovery_syncs_total{result=\"not_modified\"} 1",
            "skewgate_discovery_consecutive_failures{apiserver=\"apiserver-b\"} 2",
            "skewgate_discovery_consecutive_failures{apiserver=\"apiserver-a\"} 0",
            "# TYPE apiserver_peer_discovery_sync_errors_total counter",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
        }
        assert!(text.contains(
            "skewgate_discovery_last_success_timestamp_seconds{apiserver=\"apiserver-a\"} "
        ));
        assert!(!text.contains(
            "skewgate_discovery_last_success_timestamp_seconds{apiserver=\"apiserver-b\"}"
        ));
        assert!(
            text.lines().any(|l| l
                == "skewgate_discovery_last_error_info{apiserver=\"apiserver-b\",type=\"garbage\"} 1"),
            "{text}"
        );
        // Every sample line is `name{labels} value` on one line.
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            let value = l.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "{l}");
        }

        // No label holds error text: a hostile or merely varying message makes no series.
        for message in ["a\"b\\c\nd", "connection refused by 10.0.0.2", "x"] {
            m.record_error(
                "apiserver-b",
                &FetchError::Connect {
                    url: "https://hostile.example/apis".into(),
                    message: message.into(),
                },
            );
            let text = crate::metrics::encode(&m.families());
            assert!(!text.contains("hostile.example"), "{text}");
            assert!(!text.contains(message), "{message:?} in\n{text}");
            assert!(text.lines().any(|l| l
                == "skewgate_discovery_last_error_info{apiserver=\"apiserver-b\",type=\"connect\"} 1"));
        }

        m.forget("apiserver-b");
        assert!(!crate::metrics::encode(&m.families()).contains("apiserver-b"));
        assert_eq!(m.errors_total(ErrorType::Connect), 4, "counters stay");
        // A fetch that ends after its peer was forgotten counts, but brings no series back.
        m.record_success("apiserver-b", SyncOutcome::Updated, 0);
        m.record_error("apiserver-b", &FetchError::invalid("u", "late"));
        assert!(!crate::metrics::encode(&m.families()).contains("apiserver-b"));
        assert!(m.status("apiserver-b").is_none());
        assert_eq!(m.outcomes_total(SyncOutcome::Updated), 2);
    }
}
