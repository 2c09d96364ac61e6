//! The filter's counters and their labels, bounded by the configuration.
//!
//! Names and labels are upstream's (KEP-4020) where the meaning matches:
//! `apiserver_rerouted_request_total{code,group,version,resource}`,
//! `apiserver_peer_proxy_errors_total{type,group,version,resource}`,
//! `aggregator_discovery_peer_aggregated_cache_hits_total` / `_misses_total`,
//! `aggregator_discovery_nopeer_requests_total`; `skewgate_` where upstream has none.
//!
//! A proxy-wasm metric is a name only, so the labels are written into it:
//! `apiserver_rerouted_request_total;code=200;group=apps;version=v1;resource=deployments`.
//! Envoy's `stats_config.stats_tags` (the bootstrap, `skewgate_control::envoy::bootstrap`: one regex per label, [`LABELS`])
//! turns every `;label=value` back into a tag, and its `/stats/prometheus` then shows
//! `apiserver_rerouted_request_total{code="200",group="apps",...}` (the `wasmcustom.` namespace
//! is stripped and no `envoy_` prefix is added).
//!
//! Cardinality is bounded by the configuration, never by a client: a group, version and
//! resource are label values only when the configuration lists them ([`MetricLabels`]);
//! anything else is [`OTHER`] in all three. Codes are three-digit HTTP statuses or `other`.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::config::FilterConfig;

/// The value of every label a client could otherwise choose, when the configuration does not
/// know it.
pub const OTHER: &str = "other";

/// The label names the filter writes into stat names, in the order Envoy's `stats_tags` list
/// them (`;name=value`, the value up to the next `;`).
pub const LABELS: [&str; 5] = ["code", "type", "group", "version", "resource"];

/// A group/version/resource label set the configuration knows: an index into
/// [`MetricLabels`]. [`GvrLabel::OTHER`] for anything else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct GvrLabel(u32);

impl GvrLabel {
    pub const OTHER: GvrLabel = GvrLabel(0);
}

/// Why a peer-bound request failed (`apiserver_peer_proxy_errors_total{type}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PeerError {
    /// No connection to any peer of the set was made (refused, unreachable, TLS handshake
    /// failed, no endpoint).
    Connect,
    /// The peer took the request and reset or closed the stream before answering.
    Reset,
    /// No response headers before the request timeout.
    Timeout,
    /// Envoy refused the request itself (too large, and the like).
    Rejected,
}

impl PeerError {
    pub fn label(self) -> &'static str {
        match self {
            PeerError::Connect => "connect",
            PeerError::Reset => "reset",
            PeerError::Timeout => "timeout",
            PeerError::Rejected => "rejected",
        }
    }
}

/// The filter's counters with their label values (the shell defines one Envoy metric per
/// distinct value, once per configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Counter {
    /// A discovery request answered from the merged documents.
    DiscoveryCacheHit,
    /// A discovery request we could not answer from them (forwarded to the local apiserver).
    DiscoveryCacheMiss,
    /// A `profile=nopeer` discovery request (forwarded to the local apiserver).
    DiscoveryNoPeer,
    /// A request routed to a peer, counted when its response starts, with the status the
    /// client got (upstream counts after the proxied response too).
    Rerouted { code: u16, gvr: GvrLabel },
    /// A peer-bound request Envoy could not complete (answered 503).
    PeerProxyError { kind: PeerError, gvr: GvrLabel },
    /// A request for a retained resource, or for a retained group-version's legacy discovery
    /// path, answered 503 by the filter (no live apiserver serves it now).
    Retained { gvr: GvrLabel },
    /// A request no known apiserver serves, answered 503 by the filter while a live peer's
    /// discovery is not known yet.
    PeerDiscoveryPending { gvr: GvrLabel },
    /// An apiserver answered `404 page not found` for what the routing table says it serves
    /// (our view of it is out of date): answered 503 instead.
    NotServed { gvr: GvrLabel },
}

impl Counter {
    /// One counter of each metric, for a host that defines every metric up front with its
    /// label names (the native shell); the label values here mean nothing.
    pub const KINDS: [Counter; 8] = [
        Counter::DiscoveryCacheHit,
        Counter::DiscoveryCacheMiss,
        Counter::DiscoveryNoPeer,
        Counter::Rerouted {
            code: 0,
            gvr: GvrLabel::OTHER,
        },
        Counter::PeerProxyError {
            kind: PeerError::Connect,
            gvr: GvrLabel::OTHER,
        },
        Counter::Retained {
            gvr: GvrLabel::OTHER,
        },
        Counter::PeerDiscoveryPending {
            gvr: GvrLabel::OTHER,
        },
        Counter::NotServed {
            gvr: GvrLabel::OTHER,
        },
    ];

    /// The labels of this counter's metric, in the order [`Counter::stat_name`] writes them.
    pub fn label_names(self) -> &'static [&'static str] {
        match self {
            Counter::Rerouted { .. } => &["code", "group", "version", "resource"],
            Counter::PeerProxyError { .. } => &["type", "group", "version", "resource"],
            Counter::Retained { .. }
            | Counter::PeerDiscoveryPending { .. }
            | Counter::NotServed { .. } => &["group", "version", "resource"],
            Counter::DiscoveryCacheHit | Counter::DiscoveryCacheMiss | Counter::DiscoveryNoPeer => {
                &[]
            }
        }
    }

    pub fn metric_name(self) -> &'static str {
        match self {
            Counter::DiscoveryCacheHit => "aggregator_discovery_peer_aggregated_cache_hits_total",
            Counter::DiscoveryCacheMiss => {
                "aggregator_discovery_peer_aggregated_cache_misses_total"
            }
            Counter::DiscoveryNoPeer => "aggregator_discovery_nopeer_requests_total",
            Counter::Rerouted { .. } => "apiserver_rerouted_request_total",
            Counter::PeerProxyError { .. } => "apiserver_peer_proxy_errors_total",
            Counter::Retained { .. } => "skewgate_retained_unavailable_total",
            Counter::PeerDiscoveryPending { .. } => "skewgate_peer_discovery_pending_total",
            Counter::NotServed { .. } => "skewgate_not_served_404_total",
        }
    }

    /// The same counter with every label `other`: where a worker's series cap is reached.
    pub fn collapsed(self) -> Counter {
        let gvr = GvrLabel::OTHER;
        match self {
            Counter::Rerouted { .. } => Counter::Rerouted { code: 0, gvr },
            Counter::PeerProxyError { kind, .. } => Counter::PeerProxyError { kind, gvr },
            Counter::Retained { .. } => Counter::Retained { gvr },
            Counter::PeerDiscoveryPending { .. } => Counter::PeerDiscoveryPending { gvr },
            Counter::NotServed { .. } => Counter::NotServed { gvr },
            other => other,
        }
    }

    /// The Envoy stat name: the metric name and `;label=value` for each label (formatted once
    /// per counter and configuration, never per request).
    pub fn stat_name(self, labels: &MetricLabels) -> String {
        let mut name = String::from(self.metric_name());
        let gvr = match self {
            Counter::Rerouted { code, gvr } => {
                if (100..=599).contains(&code) {
                    let _ = write!(name, ";code={code}");
                } else {
                    let _ = write!(name, ";code={OTHER}");
                }
                Some(gvr)
            }
            Counter::PeerProxyError { kind, gvr } => {
                let _ = write!(name, ";type={}", kind.label());
                Some(gvr)
            }
            Counter::Retained { gvr }
            | Counter::PeerDiscoveryPending { gvr }
            | Counter::NotServed { gvr } => Some(gvr),
            Counter::DiscoveryCacheHit | Counter::DiscoveryCacheMiss | Counter::DiscoveryNoPeer => {
                None
            }
        };
        if let Some(gvr) = gvr {
            let (group, version, resource) = labels.values(gvr);
            let _ = write!(name, ";group={group};version={version};resource={resource}");
        }
        name
    }
}

/// The group/version/resource label sets of one configuration: every resource of every
/// group-version it lists (subresources count as their resource), and each group-version
/// itself with an empty resource (its legacy discovery path).
#[derive(Debug)]
pub struct MetricLabels {
    /// `values[0]` is `other`.
    values: Vec<(String, String, String)>,
    index: HashMap<String, HashMap<String, HashMap<String, u32>>>,
}

impl Default for MetricLabels {
    fn default() -> Self {
        MetricLabels {
            values: vec![(OTHER.into(), OTHER.into(), OTHER.into())],
            index: HashMap::new(),
        }
    }
}

/// A configuration value usable in a stat name and as a Prometheus label: what kube allows in
/// group, version and resource names. Validation allows more (any non-space segment); such a
/// value is never a label.
fn label_safe(value: &str) -> bool {
    value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
}

impl MetricLabels {
    pub fn compile(config: &FilterConfig) -> Self {
        let mut labels = MetricLabels::default();
        for gv in &config.group_versions {
            if !label_safe(&gv.group) || !label_safe(&gv.version) {
                continue;
            }
            labels.add(&gv.group, &gv.version, "");
            for r in &gv.resources {
                let resource = r.resource.split_once('/').map_or(&*r.resource, |(r, _)| r);
                if label_safe(resource) {
                    labels.add(&gv.group, &gv.version, resource);
                }
            }
        }
        labels
    }

    fn add(&mut self, group: &str, version: &str, resource: &str) {
        let next = u32::try_from(self.values.len()).unwrap_or(0);
        let slot = self
            .index
            .entry(group.to_string())
            .or_default()
            .entry(version.to_string())
            .or_default();
        if !slot.contains_key(resource) && next != 0 {
            slot.insert(resource.to_string(), next);
            self.values
                .push((group.to_string(), version.to_string(), resource.to_string()));
        }
    }

    /// The label set of a request for `resource` (no subresource) of `group/version`; an empty
    /// resource for the group-version itself.
    pub fn of(&self, group: &str, version: &str, resource: &str) -> GvrLabel {
        self.index
            .get(group)
            .and_then(|versions| versions.get(version))
            .and_then(|resources| resources.get(resource))
            .map_or(GvrLabel::OTHER, |i| GvrLabel(*i))
    }

    /// (group, version, resource) of a label set; `other` for an index it does not know.
    pub fn values(&self, label: GvrLabel) -> (&str, &str, &str) {
        let index = usize::try_from(label.0).unwrap_or(0);
        self.values
            .get(index)
            .map_or((OTHER, OTHER, OTHER), |(g, v, r)| {
                (g.as_str(), v.as_str(), r.as_str())
            })
    }

    /// How many label sets (with `other`).
    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{GroupVersionRoutes, ResourceRoute, SCHEMA_VERSION};
    use std::collections::BTreeMap;

    fn config() -> FilterConfig {
        let r = |resource: &str| ResourceRoute {
            departed_cluster: None,
            resource: resource.into(),
            local: false,
            peer_cluster: None,
            retained: true,
            failover_cluster: None,
        };
        FilterConfig {
            departed_clusters: Default::default(),
            pending_peers: Vec::new(),
            openapi_v3: Default::default(),
            failover_clusters: Default::default(),
            failover_all: None,
            schema: SCHEMA_VERSION,
            local_apiserver: "a".into(),
            peer_clusters: BTreeMap::new(),
            group_versions: vec![
                GroupVersionRoutes {
                    group: "".into(),
                    version: "v1".into(),
                    shared_storage: false,
                    resources: vec![r("pods"), r("pods/resize")],
                },
                GroupVersionRoutes {
                    group: "resource.k8s.io".into(),
                    version: "v1beta2".into(),
                    shared_storage: false,
                    resources: vec![r("resourceclaims"), r("bad;name")],
                },
            ],
            discovery: None,
            fallback: None,
        }
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn only_what_the_configuration_lists_is_a_label() {
        let labels = MetricLabels::compile(&config());
        // other, v1, pods, resource.k8s.io/v1beta2, resourceclaims.
        assert_eq!(labels.len(), 5);
        let pods = labels.of("", "v1", "pods");
        assert_ne!(pods, GvrLabel::OTHER);
        assert_eq!(labels.values(pods), ("", "v1", "pods"));
        assert_ne!(labels.of("resource.k8s.io", "v1beta2", ""), GvrLabel::OTHER);
        for (g, v, r) in [
            ("", "v1", "widgets"),
            ("nobody.example.com", "v1", "widgets"),
            ("resource.k8s.io", "v1beta2", "bad;name"),
            ("", "v2", "pods"),
        ] {
            assert_eq!(labels.of(g, v, r), GvrLabel::OTHER, "{g}/{v}/{r}");
        }
        assert_eq!(labels.values(GvrLabel(99)), (OTHER, OTHER, OTHER));
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn stat_names_carry_the_labels() {
        let labels = MetricLabels::compile(&config());
        let claims = labels.of("resource.k8s.io", "v1beta2", "resourceclaims");
        let pods = labels.of("", "v1", "pods");
        let cases = [
            (
                Counter::Rerouted {
                    code: 200,
                    gvr: claims,
                },
                "apiserver_rerouted_request_total;code=200;group=resource.k8s.io;version=v1beta2;resource=resourceclaims",
            ),
            (
                Counter::Rerouted { code: 7, gvr: pods },
                "apiserver_rerouted_request_total;code=other;group=;version=v1;resource=pods",
            ),
            (
                Counter::PeerProxyError {
                    kind: PeerError::Connect,
                    gvr: claims,
                },
                "apiserver_peer_proxy_errors_total;type=connect;group=resource.k8s.io;version=v1beta2;resource=resourceclaims",
            ),
            (
                Counter::PeerDiscoveryPending {
                    gvr: GvrLabel::OTHER,
                },
                "skewgate_peer_discovery_pending_total;group=other;version=other;resource=other",
            ),
            (
                Counter::DiscoveryNoPeer,
                "aggregator_discovery_nopeer_requests_total",
            ),
        ];
        for (counter, want) in cases {
            assert_eq!(counter.stat_name(&labels), want);
            // A host defining metrics up front (the native shell) reads the same labels.
            let written: Vec<&str> = want
                .split(';')
                .skip(1)
                .filter_map(|pair| pair.split_once('=').map(|(name, _)| name))
                .collect();
            assert_eq!(written, counter.label_names(), "{want}");
            assert!(Counter::KINDS
                .iter()
                .any(|kind| kind.metric_name() == counter.metric_name()
                    && kind.label_names() == counter.label_names()));
        }
        assert_eq!(
            Counter::Rerouted {
                code: 200,
                gvr: claims
            }
            .collapsed()
            .stat_name(&labels),
            "apiserver_rerouted_request_total;code=other;group=other;version=other;resource=other"
        );
    }
}
