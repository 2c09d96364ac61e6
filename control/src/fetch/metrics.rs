//! Discovery sync metrics: errors by type (upstream's name), and per apiserver the last
//! success, the last error and how many attempts in a row failed. Plain atomics and a mutex,
//! rendered in the Prometheus text format.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use super::error::{ErrorType, FetchError};

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

/// The most of an error message we keep (it becomes a label value).
const MAX_ERROR_CHARS: usize = 300;

impl DiscoveryMetrics {
    pub fn new() -> Self {
        Self::default()
    }

    fn with_status<R>(&self, id: &str, f: impl FnOnce(&mut ApiserverSyncStatus) -> R) -> R {
        let mut map = self.apiservers.lock().unwrap_or_else(|p| p.into_inner());
        f(map.entry(id.to_string()).or_default())
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

    /// The Prometheus text exposition of these metrics.
    pub fn render_prometheus(&self) -> String {
        let mut out = String::new();
        out.push_str(
            "# HELP apiserver_peer_discovery_sync_errors_total Failed discovery fetches from apiservers (the last good view is kept), by type.\n\
             # TYPE apiserver_peer_discovery_sync_errors_total counter\n",
        );
        for t in ErrorType::ALL {
            let _ = writeln!(
                out,
                "apiserver_peer_discovery_sync_errors_total{{type=\"{}\"}} {}",
                t.label(),
                self.errors_total(t)
            );
        }
        out.push_str(
            "# HELP skewgate_discovery_syncs_total Successful discovery fetches from apiservers, by result.\n\
             # TYPE skewgate_discovery_syncs_total counter\n",
        );
        for o in SyncOutcome::ALL {
            let _ = writeln!(
                out,
                "skewgate_discovery_syncs_total{{result=\"{}\"}} {}",
                o.label(),
                self.outcomes_total(o)
            );
        }
        let _ = write!(
            out,
            "# HELP skewgate_discovery_holder_refetches_coalesced_total Refetches asked for by a new holder identity within --holder-refetch-interval of the last one: deferred to its end and coalesced.\n\
             # TYPE skewgate_discovery_holder_refetches_coalesced_total counter\n\
             skewgate_discovery_holder_refetches_coalesced_total {}\n",
            self.coalesced_triggers_total()
        );
        let map = self
            .apiservers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        out.push_str(
            "# HELP skewgate_discovery_last_success_timestamp_seconds When an apiserver's discovery was last fetched successfully.\n\
             # TYPE skewgate_discovery_last_success_timestamp_seconds gauge\n",
        );
        for (id, s) in &map {
            if let Some(t) = s.last_success {
                let _ = writeln!(
                    out,
                    "skewgate_discovery_last_success_timestamp_seconds{{apiserver=\"{}\"}} {}",
                    escape(id),
                    seconds(t)
                );
            }
        }
        out.push_str(
            "# HELP skewgate_discovery_fetches_total Discovery fetches from an apiserver, good or not (its series goes when the peer leaves).\n\
             # TYPE skewgate_discovery_fetches_total counter\n",
        );
        for (id, s) in &map {
            let _ = writeln!(
                out,
                "skewgate_discovery_fetches_total{{apiserver=\"{}\"}} {}",
                escape(id),
                s.fetches
            );
        }
        out.push_str(
            "# HELP skewgate_discovery_consecutive_failures Failed discovery fetches from an apiserver since its last success.\n\
             # TYPE skewgate_discovery_consecutive_failures gauge\n",
        );
        for (id, s) in &map {
            let _ = writeln!(
                out,
                "skewgate_discovery_consecutive_failures{{apiserver=\"{}\"}} {}",
                escape(id),
                s.consecutive_failures
            );
        }
        out.push_str(
            "# HELP skewgate_discovery_stale_group_versions Legacy group-versions of an apiserver that answered with an error (kept as Stale).\n\
             # TYPE skewgate_discovery_stale_group_versions gauge\n",
        );
        for (id, s) in &map {
            let _ = writeln!(
                out,
                "skewgate_discovery_stale_group_versions{{apiserver=\"{}\"}} {}",
                escape(id),
                s.stale_group_versions
            );
        }
        out.push_str(
            "# HELP skewgate_discovery_last_error_timestamp_seconds When an apiserver's discovery fetch last failed.\n\
             # TYPE skewgate_discovery_last_error_timestamp_seconds gauge\n",
        );
        for (id, s) in &map {
            if let Some(t) = s.last_error_time {
                let _ = writeln!(
                    out,
                    "skewgate_discovery_last_error_timestamp_seconds{{apiserver=\"{}\"}} {}",
                    escape(id),
                    seconds(t)
                );
            }
        }
        out.push_str(
            "# HELP skewgate_discovery_last_error_info The last discovery fetch error of an apiserver (value 1).\n\
             # TYPE skewgate_discovery_last_error_info gauge\n",
        );
        for (id, s) in &map {
            if let (Some(e), Some(t)) = (&s.last_error, s.last_error_type) {
                let _ = writeln!(
                    out,
                    "skewgate_discovery_last_error_info{{apiserver=\"{}\",type=\"{}\",error=\"{}\"}} 1",
                    escape(id),
                    t.label(),
                    escape(e)
                );
            }
        }
        out
    }
}

fn seconds(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    format!("{}.{:03}", d.as_secs(), d.subsec_millis())
}

/// A Prometheus label value: `\`, `"` and newlines escaped.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_renders() {
        let m = DiscoveryMetrics::new();
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

        let text = m.render_prometheus();
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
        assert!(text.contains(
            "skewgate_discovery_last_error_info{apiserver=\"apiserver-b\",type=\"garbage\",error=\"GET https://10.0.0.2:6443/apis: bad\"} 1"
        ));
        // Every sample line is `name{labels} value` on one line.
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            let value = l.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "{l}");
        }

        // Escaping keeps a hostile message on one line.
        m.record_error(
            "apiserver-b",
            &FetchError::Connect {
                url: "u".into(),
                message: "a\"b\\c\nd".into(),
            },
        );
        let text = m.render_prometheus();
        assert!(
            text.contains(r#"error="GET u: cannot connect: a\"b\\c\nd"} 1"#),
            "{text}"
        );

        m.forget("apiserver-b");
        assert!(!m.render_prometheus().contains("apiserver-b"));
        assert_eq!(m.errors_total(ErrorType::Connect), 2, "counters stay");
    }
}
