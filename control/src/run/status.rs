//! What the orchestrator shows: its own counters (Prometheus text) and the status behind
//! `/readyz` and `/debug/skew`.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::metrics::{unix_seconds, Families};

use serde::Serialize;

use crate::discovery::ServedApis;
use crate::routing::RoutingPlan;

use skewgate_core::group_version::GroupVersion;

use super::state::skew_matrix;
use crate::plan::Unrouted;

/// The orchestrator's counters and gauges.
#[derive(Debug, Default)]
pub struct AppMetrics {
    published: AtomicU64,
    compose_errors: AtomicU64,
    merged_skipped: AtomicU64,
    merged_bytes: AtomicU64,
    routed_peers: AtomicU64,
    unrouted_peers: AtomicU64,
    ready: AtomicU64,
    /// Milliseconds from the start to the first publish.
    first_sync_ms: AtomicU64,
    last_publish: Mutex<Option<SystemTime>>,
    pending_peers: AtomicU64,
    /// Departed apiservers dropped from a full retention.
    retention_evicted: AtomicU64,
    /// Retained apiservers: id, when their retention ends, how many group-version-resources.
    retained: Mutex<Vec<RetainedStatus>>,
}

impl AppMetrics {
    pub fn published(&self) {
        self.published.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut t) = self.last_publish.lock() {
            *t = Some(SystemTime::now());
        }
    }

    pub fn published_total(&self) -> u64 {
        self.published.load(Ordering::Relaxed)
    }

    pub fn compose_error(&self) {
        self.compose_errors.fetch_add(1, Ordering::Relaxed);
    }

    pub fn merged(&self, bytes: Option<usize>) {
        match bytes {
            Some(b) => self.merged_bytes.store(b as u64, Ordering::Relaxed),
            None => {
                self.merged_skipped.fetch_add(1, Ordering::Relaxed);
                self.merged_bytes.store(0, Ordering::Relaxed);
            }
        }
    }

    pub fn peers(&self, routed: usize, unrouted: usize) {
        self.routed_peers.store(routed as u64, Ordering::Relaxed);
        self.unrouted_peers
            .store(unrouted as u64, Ordering::Relaxed);
    }

    /// What the last plan retained and which peers it waits for.
    pub fn fail_safe(&self, retained: Vec<RetainedStatus>, pending: usize) {
        self.pending_peers.store(pending as u64, Ordering::Relaxed);
        if let Ok(mut r) = self.retained.lock() {
            *r = retained;
        }
    }

    /// A departed apiserver's discovery was dropped because the retention was full.
    pub fn retention_evicted(&self) {
        self.retention_evicted.fetch_add(1, Ordering::Relaxed);
    }

    pub fn set_ready(&self, after_ms: u64) {
        self.ready.store(1, Ordering::Relaxed);
        self.first_sync_ms.store(after_ms, Ordering::Relaxed);
    }

    /// These metrics, for `/metrics`.
    pub fn families(&self) -> Families {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut f = Families::new();
        f.gauge(
            "skewgate_control_ready",
            "1 once the first complete sync was published to Envoy.",
            load(&self.ready) as f64,
        );
        f.gauge(
            "skewgate_control_first_sync_seconds",
            "Time from the start to the first published snapshot.",
            load(&self.first_sync_ms) as f64 / 1000.0,
        );
        f.counter(
            "skewgate_control_snapshots_published_total",
            "Snapshots (routing table, merged discovery, clusters) handed to the xDS server.",
            self.published_total(),
        );
        f.counter(
            "skewgate_control_compose_errors_total",
            "Failures to build a snapshot (the last one stays).",
            load(&self.compose_errors),
        );
        f.counter(
            "skewgate_control_merged_discovery_skipped_total",
            "Snapshots without merged discovery (too large).",
            load(&self.merged_skipped),
        );
        f.gauge(
            "skewgate_control_merged_discovery_bytes",
            "Size of the merged discovery in the filter configuration.",
            load(&self.merged_bytes) as f64,
        );
        f.gauges(
            "skewgate_control_peers",
            "Live peers by whether requests are routed to them (unrouted: no discovery view).",
            &["state"],
            [
                (["routed"], load(&self.routed_peers) as f64),
                (["unrouted"], load(&self.unrouted_peers) as f64),
            ],
        );
        f.gauge(
            "skewgate_control_pending_peers",
            "Live peers whose discovery is not known yet (requests nobody known serves get 503).",
            load(&self.pending_peers) as f64,
        );
        f.counter(
            "skewgate_control_retention_evicted_total",
            "Departed apiservers whose discovery was dropped before the retention window passed: more than --max-peers had departed (the one first seen most recently goes first).",
            load(&self.retention_evicted),
        );
        let retained = self.retained.lock().map(|r| r.clone()).unwrap_or_default();
        f.gauges(
            "skewgate_control_retained_resources",
            "Resources no live apiserver serves, kept from an apiserver that left (answered 503, Stale in discovery).",
            &["apiserver"],
            retained
                .iter()
                .map(|r| ([r.id.as_str()], r.resources.len() as f64)),
        );
        f.gauges(
            "skewgate_control_retained_expiry_timestamp_seconds",
            "When the retention of an apiserver's APIs ends.",
            &["apiserver"],
            retained
                .iter()
                .map(|r| ([r.id.as_str()], r.expires_unix_seconds as f64)),
        );
        if let Some(t) = self.last_publish.lock().ok().and_then(|t| *t) {
            f.gauge(
                "skewgate_control_last_publish_timestamp_seconds",
                "When the last snapshot was published.",
                unix_seconds(t),
            );
        }
        f
    }
}

/// One apiserver on the status page.
#[derive(Debug, Clone, Serialize)]
pub struct ApiserverStatus {
    pub id: String,
    /// The Lease's `kubernetes.io/hostname`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    pub local: bool,
    pub url: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder_identity: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// Requests may be routed to it (the local one always).
    pub routed: bool,
    pub discovery_attempts: u64,
    pub consecutive_failures: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// An apiserver whose APIs are retained, for `/debug/skew` and `/metrics`.
#[derive(Debug, Clone, Serialize)]
pub struct RetainedStatus {
    pub id: String,
    pub left_unix_seconds: u64,
    pub expires_unix_seconds: u64,
    /// Where requests for what it retained are sent (its last address, `host:port`): served
    /// there while it is ready, else the retained 503. `None`: not known (this control plane has
    /// not seen it live since it started), only the 503.
    pub sent_to: Option<String>,
    /// `group/version, Resource=resource` of what only it served.
    pub resources: Vec<String>,
}

/// A lease that is not a peer, and why.
#[derive(Debug, Clone, Serialize)]
pub struct ExcludedLease {
    pub id: String,
    pub reason: String,
}

/// The last published view, for `/debug/skew`.
#[derive(Debug, Clone)]
pub struct View {
    pub snapshot_version: String,
    pub published_at: SystemTime,
    pub served: Vec<(String, ServedApis)>,
    pub plan: RoutingPlan,
    pub shared_storage: BTreeSet<GroupVersion>,
    pub unrouted: Vec<Unrouted>,
    pub merged_discovery: String,
    pub retained: Vec<RetainedStatus>,
    /// Live peers whose discovery is not known yet.
    pub pending: Vec<String>,
}

/// What `/readyz` and `/debug/skew` read.
#[derive(Debug, Default)]
pub struct Status {
    inner: RwLock<StatusInner>,
}

#[derive(Debug, Default)]
struct StatusInner {
    ready: bool,
    waiting_for: Vec<String>,
    view: Option<View>,
    apiservers: Vec<ApiserverStatus>,
    excluded: Vec<ExcludedLease>,
}

impl Status {
    pub fn waiting(&self, reasons: Vec<String>) {
        if let Ok(mut s) = self.inner.write() {
            s.waiting_for = reasons;
        }
    }

    pub fn published(&self, view: View) {
        if let Ok(mut s) = self.inner.write() {
            s.ready = true;
            s.waiting_for.clear();
            s.view = Some(view);
        }
    }

    /// Where every apiserver's discovery stands (refreshed on every change, published or not).
    pub fn apiservers(&self, apiservers: Vec<ApiserverStatus>, excluded: Vec<ExcludedLease>) {
        if let Ok(mut s) = self.inner.write() {
            s.apiservers = apiservers;
            s.excluded = excluded;
        }
    }

    pub fn is_ready(&self) -> bool {
        self.inner.read().map(|s| s.ready).unwrap_or(false)
    }

    /// `Ok` with notes once ready (peers whose discovery is not known yet: requests only they
    /// might serve get 503 meanwhile), or why not.
    pub fn ready(&self) -> Result<Vec<String>, Vec<String>> {
        let s = self
            .inner
            .read()
            .map_err(|_| vec!["status unavailable".to_string()])?;
        if s.ready {
            Ok(s.view
                .as_ref()
                .map(|v| {
                    v.pending
                        .iter()
                        .map(|id| format!("peer {id}: discovery not known yet (503 for what nobody known serves)"))
                        .collect()
                })
                .unwrap_or_default())
        } else if s.waiting_for.is_empty() {
            Err(vec!["starting".to_string()])
        } else {
            Err(s.waiting_for.clone())
        }
    }

    /// The `/debug/skew` document.
    pub fn skew_json(&self, all: bool) -> serde_json::Value {
        let Ok(s) = self.inner.read() else {
            return serde_json::json!({ "error": "status unavailable" });
        };
        let Some(v) = &s.view else {
            return serde_json::json!({
                "ready": false,
                "waiting_for": s.waiting_for,
                "apiservers": s.apiservers,
                "excluded_leases": s.excluded,
            });
        };
        let matrix = skew_matrix(&v.served, &v.plan, &v.shared_storage, all);
        let published = v
            .published_at
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        serde_json::json!({
            "ready": s.ready,
            "snapshot_version": v.snapshot_version,
            "published_unix_seconds": published,
            "merged_discovery": v.merged_discovery,
            "apiservers": s.apiservers,
            "unrouted_peers": v.unrouted,
            "pending_peers": v.pending,
            "retained": v.retained,
            "excluded_leases": s.excluded,
            "shared_storage": v.shared_storage.iter().map(GroupVersion::to_string).collect::<Vec<_>>(),
            "matrix": matrix,
        })
    }
}
