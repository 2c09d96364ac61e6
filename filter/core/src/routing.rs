//! Where a request goes: the local apiserver, a peer cluster, or nowhere (a 503 from the filter
//! itself) (docs/ARCHITECTURE.md "Request path", steps 4-8).
//!
//! The configuration is compiled once per push into nested maps keyed by `&str`, so a request
//! costs a parse and at most four hash lookups, with no allocation beyond the parse.

use std::collections::HashMap;

use crate::config::FilterConfig;
use crate::request_info::{self, RequestInfo};

/// Longest `:path` the filter parses whole. Envoy accepts up to 1 MiB of headers (as
/// kube-apiserver does) and parsing costs about 6 ms per MiB of path (BENCHMARKS.md), all
/// before any authentication; no real resource path comes near 64 KiB (names are at most 253
/// bytes). A query can (a label selector listing thousands of values): past this bound the
/// request is routed on its path alone ([`RoutingTable::route`]).
pub const MAX_ROUTED_PATH: usize = 64 * 1024;

/// Whether [`RoutingTable::route`] reads the query of `path_and_query`. When it does not, the
/// request may be a watch (`?watch=true` is in the query): it is unbounded.
pub fn query_read(path_and_query: &str) -> bool {
    path_and_query.len() <= MAX_ROUTED_PATH
}

/// Where the request is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upstream<'a> {
    /// The apiserver this Envoy fronts (the route's default cluster).
    Local,
    /// The apiserver this Envoy fronts while it can be reached, else one of the peers of this
    /// failover cluster ([`FilterConfig::failover_clusters`]), which serve it too: Envoy's
    /// aggregate cluster with a health check on the local apiserver decides, per attempt.
    LocalFirst { failover: &'a str },
    /// An Envoy cluster whose endpoints are the peer apiservers serving the resource.
    Peer { cluster: &'a str },
    /// An Envoy cluster of the departed apiservers that served a retained key, at their last
    /// address ([`FilterConfig::departed_clusters`]): one that is back and ready answers (its
    /// Lease may not be seen yet); while none is, Envoy answers itself and the filter makes
    /// that the retained 503.
    Departed { cluster: &'a str },
    /// Nowhere: no live apiserver is known to serve it now, but one may (a retained resource,
    /// or a peer whose discovery is not known yet). The filter answers 503 with `Retry-After`
    /// itself: a retryable 503 is always safer than a false 404.
    Unavailable,
}

/// Why: for logs and metrics, and so tests can assert the rule that fired, not just the result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// `/healthz`, `/version`, discovery documents, `/openapi/...`.
    NonResourceRequest,
    /// kube-apiserver would refuse it too (bad escape, `watch` with nothing after it); the
    /// local apiserver answers with its own error.
    Unparseable,
    ServedLocally,
    /// A CRD or service-backed APIService group-version: every apiserver serves it from
    /// shared storage, so upstream never proxies it and neither do we.
    SharedStorage,
    ServedByPeer,
    /// Nobody serves it; the local 404 is the truth.
    ServedByNobody,
    /// No live apiserver serves it now, but one that did is gone or not re-read yet
    /// ([`ResourceRoute::retained`](crate::config::ResourceRoute::retained)): 503, or the
    /// departed apiservers that served it if they answer ([`Upstream::Departed`]).
    Retained,
    /// No known apiserver serves it, but a live peer's discovery is not known yet
    /// ([`FilterConfig::pending_peers`]): that peer may serve it, so 503 rather than the local
    /// 404.
    PeerDiscoveryPending,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision<'a> {
    pub upstream: Upstream<'a>,
    pub reason: Reason,
}

impl Decision<'_> {
    const fn local(reason: Reason) -> Self {
        Decision {
            upstream: Upstream::Local,
            reason,
        }
    }
}

/// Who serves one resource key.
#[derive(Debug, Clone, Copy, Default)]
struct Served {
    local: bool,
    /// With `local`: index into [`RoutingTable::failover_clusters`].
    failover: Option<usize>,
    /// Index into [`RoutingTable::clusters`].
    peer: Option<usize>,
    /// Nobody now, but a server that did is gone or not re-read yet.
    retained: bool,
    /// With `retained`: index into [`RoutingTable::departed_clusters`].
    departed: Option<usize>,
}

#[derive(Debug, Default)]
struct ResourceEntry {
    served: Served,
    subresources: HashMap<String, Served>,
}

#[derive(Debug)]
enum GroupVersionEntry {
    SharedStorage,
    Resources(HashMap<String, ResourceEntry>),
}

/// The compiled, request-time form of a [`FilterConfig`].
#[derive(Debug, Default)]
pub struct RoutingTable {
    local_apiserver: String,
    clusters: Vec<String>,
    /// [`FilterConfig::failover_clusters`], by name.
    failover_clusters: Vec<String>,
    /// Index into `failover_clusters` of [`FilterConfig::failover_all`].
    failover_all: Option<usize>,
    /// [`FilterConfig::departed_clusters`], by name.
    departed_clusters: Vec<String>,
    groups: HashMap<String, HashMap<String, GroupVersionEntry>>,
    /// [`FilterConfig::pending_peers`]: while any is listed, "served by nobody" is not known.
    pending_peers: Vec<String>,
}

impl RoutingTable {
    /// Compile a validated configuration. (Validation guarantees every referenced cluster
    /// exists; an unknown one would simply never route.)
    pub fn compile(config: &FilterConfig) -> Self {
        let clusters: Vec<String> = config.peer_clusters.keys().cloned().collect();
        let cluster_index = |name: &str| clusters.iter().position(|c| c == name);
        let failover_clusters: Vec<String> = config.failover_clusters.keys().cloned().collect();
        let failover_index = |name: &str| failover_clusters.iter().position(|c| c == name);
        let departed_clusters: Vec<String> = config.departed_clusters.keys().cloned().collect();
        let departed_index = |name: &str| departed_clusters.iter().position(|c| c == name);
        let mut groups: HashMap<String, HashMap<String, GroupVersionEntry>> = HashMap::new();
        for gv in &config.group_versions {
            let entry = if gv.shared_storage {
                GroupVersionEntry::SharedStorage
            } else {
                let mut resources: HashMap<String, ResourceEntry> = HashMap::new();
                for r in &gv.resources {
                    let served = Served {
                        local: r.local,
                        failover: r.failover_cluster.as_deref().and_then(failover_index),
                        peer: r.peer_cluster.as_deref().and_then(cluster_index),
                        retained: r.retained,
                        departed: r.departed_cluster.as_deref().and_then(departed_index),
                    };
                    match r.resource.split_once('/') {
                        Some((res, sub)) => {
                            resources
                                .entry(res.to_string())
                                .or_default()
                                .subresources
                                .insert(sub.to_string(), served);
                        }
                        None => {
                            resources.entry(r.resource.clone()).or_default().served = served;
                        }
                    }
                }
                GroupVersionEntry::Resources(resources)
            };
            groups
                .entry(gv.group.clone())
                .or_default()
                .insert(gv.version.clone(), entry);
        }
        let failover_all = config.failover_all.as_deref().and_then(failover_index);
        RoutingTable {
            local_apiserver: config.local_apiserver.clone(),
            clusters,
            failover_clusters,
            failover_all,
            departed_clusters,
            groups,
            pending_peers: config.pending_peers.clone(),
        }
    }

    pub fn local_apiserver(&self) -> &str {
        &self.local_apiserver
    }

    /// Live peers whose discovery is not known yet (for the 503 message).
    pub fn pending_peers(&self) -> &[String] {
        &self.pending_peers
    }

    /// Parse the request like kube-apiserver and decide. A target longer than
    /// [`MAX_ROUTED_PATH`] is parsed without its query (which decides only list or watch, and
    /// a name from a field selector, never where a request goes; see [`query_read`]); a path
    /// longer than that is not parsed: it goes to the local apiserver, which answers it as it
    /// would without us.
    pub fn route<'p>(
        &self,
        method: &str,
        path_and_query: &'p str,
    ) -> (Option<RequestInfo<'p>>, Decision<'_>) {
        let target = if query_read(path_and_query) {
            path_and_query
        } else {
            match path_and_query.split_once('?') {
                Some((path, _)) if path.len() <= MAX_ROUTED_PATH => path,
                _ => return (None, Decision::local(Reason::Unparseable)),
            }
        };
        match request_info::parse(method, target) {
            Ok(info) => {
                let decision = self.decide(&info);
                (Some(info), decision)
            }
            Err(_) => (None, Decision::local(Reason::Unparseable)),
        }
    }

    pub fn decide(&self, info: &RequestInfo<'_>) -> Decision<'_> {
        if !info.is_resource_request {
            if is_node_local(&info.path) {
                return Decision::local(Reason::NonResourceRequest);
            }
            return self.local_first(self.failover_all, Reason::NonResourceRequest);
        }
        let Some(gv) = self
            .groups
            .get(&*info.api_group)
            .and_then(|versions| versions.get(&*info.api_version))
        else {
            return self.served_by_nobody();
        };
        let resources = match gv {
            GroupVersionEntry::SharedStorage => {
                return self.local_first(self.failover_all, Reason::SharedStorage)
            }
            GroupVersionEntry::Resources(resources) => resources,
        };
        let Some(resource) = resources.get(&*info.resource) else {
            return self.served_by_nobody();
        };
        // The subresource decides first: core/v1 grows by subresources (`pods/resize`), which
        // upstream, looking at the resource only, would send to an apiserver that 404s them.
        if !info.subresource.is_empty() {
            if let Some(decision) = resource
                .subresources
                .get(&*info.subresource)
                .and_then(|served| self.target(*served))
            {
                return decision;
            }
        }
        // No entry for the subresource (discovery does not list every one, e.g. `pods/proxy`
        // on old servers): whoever serves the resource handles it.
        self.target(resource.served)
            .unwrap_or_else(|| self.served_by_nobody())
    }

    /// No known apiserver serves the key: the local 404 is the truth, unless a live peer's
    /// discovery is not known yet. Every live peer's 404 is the same truth, so while the local
    /// apiserver cannot be reached (restarting in an upgrade) a peer says it, through the
    /// failover cluster of every live peer, rather than the client getting a 503.
    fn served_by_nobody(&self) -> Decision<'_> {
        if self.pending_peers.is_empty() {
            self.local_first(self.failover_all, Reason::ServedByNobody)
        } else {
            Decision {
                upstream: Upstream::Unavailable,
                reason: Reason::PeerDiscoveryPending,
            }
        }
    }

    /// The failover cluster of every live peer, for requests every apiserver serves.
    pub fn failover_all(&self) -> Option<&str> {
        self.failover_all
            .and_then(|i| self.failover_clusters.get(i))
            .map(String::as_str)
    }

    /// Local, failing over to the peers of `failover` (an index into `failover_clusters`).
    fn local_first(&self, failover: Option<usize>, reason: Reason) -> Decision<'_> {
        match failover.and_then(|i| self.failover_clusters.get(i)) {
            Some(failover) => Decision {
                upstream: Upstream::LocalFirst { failover },
                reason,
            },
            None => Decision::local(reason),
        }
    }

    fn target(&self, served: Served) -> Option<Decision<'_>> {
        if served.local {
            return Some(self.local_first(served.failover, Reason::ServedLocally));
        }
        if served.retained {
            let upstream = match served.departed.and_then(|i| self.departed_clusters.get(i)) {
                Some(cluster) => Upstream::Departed { cluster },
                None => Upstream::Unavailable,
            };
            return Some(Decision {
                upstream,
                reason: Reason::Retained,
            });
        }
        let cluster = self.clusters.get(served.peer?)?;
        Some(Decision {
            upstream: Upstream::Peer { cluster },
            reason: Reason::ServedByPeer,
        })
    }
}

/// This node's own health and metrics endpoints: they describe the local apiserver, so they
/// never fail over (a load balancer must see this node's apiserver down, and a scrape must not
/// get another apiserver's metrics under this node's name).
pub const NODE_LOCAL_PATHS: [&str; 5] = ["/healthz", "/livez", "/readyz", "/metrics", "/debug"];

/// Whether a non-resource path is one of [`NODE_LOCAL_PATHS`] or below one.
pub fn is_node_local(path: &str) -> bool {
    NODE_LOCAL_PATHS.iter().any(|p| {
        path.strip_prefix(p)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{GroupVersionRoutes, ResourceRoute, SCHEMA_VERSION};
    use std::collections::BTreeMap;

    fn route(resource: &str, local: bool, peer: Option<&str>) -> ResourceRoute {
        ResourceRoute {
            departed_cluster: None,
            retained: false,
            failover_cluster: None,
            resource: resource.into(),
            local,
            peer_cluster: peer.map(str::to_string),
        }
    }

    fn gv(group: &str, version: &str, resources: Vec<ResourceRoute>) -> GroupVersionRoutes {
        GroupVersionRoutes {
            group: group.into(),
            version: version.into(),
            shared_storage: false,
            resources,
        }
    }

    /// A 1.30 local apiserver with a 1.33 peer (cluster "p133") and a second peer set.
    fn table() -> RoutingTable {
        let config = FilterConfig {
            departed_clusters: Default::default(),
            fallback: None,
            pending_peers: Vec::new(),
            openapi_v3: Default::default(),
            failover_clusters: Default::default(),
            failover_all: None,
            schema: SCHEMA_VERSION,
            local_apiserver: "apiserver-a".into(),
            peer_clusters: BTreeMap::from([
                ("p133".to_string(), vec!["apiserver-b".to_string()]),
                (
                    "pboth".to_string(),
                    vec!["apiserver-b".to_string(), "apiserver-c".to_string()],
                ),
            ]),
            group_versions: vec![
                gv(
                    "",
                    "v1",
                    vec![
                        route("pods", true, None),
                        route("pods/status", true, None),
                        route("pods/resize", false, Some("p133")),
                        route("namespaces", true, None),
                        route("namespaces/finalize", true, None),
                    ],
                ),
                gv("apps", "v1", vec![route("deployments", true, None)]),
                gv(
                    "resource.k8s.io",
                    "v1beta2",
                    vec![
                        route("resourceclaims", false, Some("pboth")),
                        route("resourceclaims/status", false, Some("pboth")),
                    ],
                ),
                gv(
                    "admissionregistration.k8s.io",
                    "v1alpha1",
                    vec![
                        route("validatingadmissionpolicies", true, None),
                        route("mutatingadmissionpolicies", false, Some("p133")),
                    ],
                ),
                GroupVersionRoutes {
                    group: "stable.example.com".into(),
                    version: "v1".into(),
                    shared_storage: true,
                    resources: vec![],
                },
                // A peer-only subresource of a resource nobody else lists (defensive).
                gv(
                    "odd.example.com",
                    "v1",
                    vec![route("things/scale", false, Some("p133"))],
                ),
            ],
            discovery: None,
        };
        config.validate().unwrap();
        RoutingTable::compile(&config)
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn decides_like_design_md() {
        use Reason::*;
        let peer = |cluster| Upstream::Peer { cluster };
        let local = Upstream::Local;
        let t = table();
        let cases: Vec<(&str, &str, Upstream, Reason)> = vec![
            // Non-resource paths and discovery go local.
            ("GET", "/healthz", local, NonResourceRequest),
            ("GET", "/version", local, NonResourceRequest),
            ("GET", "/apis", local, NonResourceRequest),
            (
                "GET",
                "/apis/resource.k8s.io/v1beta2",
                local,
                NonResourceRequest,
            ),
            ("GET", "/api/v1", local, NonResourceRequest),
            // Served locally.
            ("GET", "/api/v1/pods", local, ServedLocally),
            ("GET", "/api/v1/namespaces/ns/pods/p", local, ServedLocally),
            (
                "GET",
                "/api/v1/namespaces/ns/pods/p/status",
                local,
                ServedLocally,
            ),
            (
                "PUT",
                "/api/v1/namespaces/ns/finalize",
                local,
                ServedLocally,
            ),
            (
                "GET",
                "/apis/apps/v1/watch/namespaces/ns/deployments",
                local,
                ServedLocally,
            ),
            // Subresource only a peer serves.
            (
                "PATCH",
                "/api/v1/namespaces/ns/pods/p/resize",
                peer("p133"),
                ServedByPeer,
            ),
            // Subresource nobody lists: whoever serves the resource.
            (
                "GET",
                "/api/v1/namespaces/ns/pods/p/log",
                local,
                ServedLocally,
            ),
            (
                "POST",
                "/api/v1/namespaces/ns/pods/p/exec",
                local,
                ServedLocally,
            ),
            (
                "GET",
                "/apis/resource.k8s.io/v1beta2/namespaces/ns/resourceclaims/c/unknown",
                peer("pboth"),
                ServedByPeer,
            ),
            // Peer-only resources, any verb and shape.
            (
                "GET",
                "/apis/resource.k8s.io/v1beta2/resourceclaims",
                peer("pboth"),
                ServedByPeer,
            ),
            (
                "POST",
                "/apis/resource.k8s.io/v1beta2/namespaces/default/resourceclaims",
                peer("pboth"),
                ServedByPeer,
            ),
            (
                "GET",
                "/apis/resource.k8s.io/v1beta2/namespaces/default/resourceclaims?watch=true",
                peer("pboth"),
                ServedByPeer,
            ),
            (
                "GET",
                "/apis/resource.k8s.io/v1beta2/watch/resourceclaims",
                peer("pboth"),
                ServedByPeer,
            ),
            (
                "PUT",
                "/apis/resource.k8s.io/v1beta2/namespaces/d/resourceclaims/c/status",
                peer("pboth"),
                ServedByPeer,
            ),
            (
                "DELETE",
                "/apis/resource.k8s.io/v1beta2/namespaces/d/resourceclaims",
                peer("pboth"),
                ServedByPeer,
            ),
            // Same GV, different resources on each side.
            (
                "GET",
                "/apis/admissionregistration.k8s.io/v1alpha1/validatingadmissionpolicies",
                local,
                ServedLocally,
            ),
            (
                "GET",
                "/apis/admissionregistration.k8s.io/v1alpha1/mutatingadmissionpolicies",
                peer("p133"),
                ServedByPeer,
            ),
            // Shared storage is never proxied.
            (
                "GET",
                "/apis/stable.example.com/v1/widgets",
                local,
                SharedStorage,
            ),
            // Nobody serves it: the local 404 is the truth.
            (
                "GET",
                "/apis/resource.k8s.io/v1/resourceclaims",
                local,
                ServedByNobody,
            ),
            (
                "GET",
                "/apis/nope.example.com/v1/things",
                local,
                ServedByNobody,
            ),
            ("GET", "/apis/apps/v1/replicasets", local, ServedByNobody),
            (
                "GET",
                "/apis/odd.example.com/v1/things",
                local,
                ServedByNobody,
            ),
            (
                "GET",
                "/apis/odd.example.com/v1/namespaces/n/things/t/scale",
                peer("p133"),
                ServedByPeer,
            ),
            (
                "GET",
                "/apis/odd.example.com/v1/namespaces/n/things/t/status",
                local,
                ServedByNobody,
            ),
            // Percent-encoded path routes like its decoded form, as Go decodes URL.Path.
            (
                "GET",
                "/apis/resource.k8s.io/v1beta2/resource%63laims",
                peer("pboth"),
                ServedByPeer,
            ),
            // Unparseable and oversized requests go local, which answers with kube's own error.
            ("GET", "/api/v1/watch", local, Unparseable),
            (
                "GET",
                "/apis/resource.k8s.io/v1beta2/%zz",
                local,
                Unparseable,
            ),
        ];
        let long = format!(
            "/apis/resource.k8s.io/v1beta2/{}",
            "a".repeat(MAX_ROUTED_PATH)
        );
        // A query past the bound (a label selector of thousands of values) is not read, and
        // the path still decides: the peer-only resource goes to its peers, not to a local
        // apiserver that answers 404.
        let selector = format!("?labelSelector=app+in+({})", "a1,".repeat(30_000));
        let long_query = format!("/apis/resource.k8s.io/v1beta2/resourceclaims{selector}");
        let long_both = format!(
            "/apis/resource.k8s.io/v1beta2/{}{selector}",
            "a".repeat(MAX_ROUTED_PATH)
        );
        let cases = cases.into_iter().chain([
            ("GET", long.as_str(), Upstream::Local, Unparseable),
            ("GET", long_query.as_str(), peer("pboth"), ServedByPeer),
            ("DELETE", long_query.as_str(), peer("pboth"), ServedByPeer),
            ("GET", long_both.as_str(), Upstream::Local, Unparseable),
        ]);
        for (method, path, upstream, reason) in cases {
            let (_, d) = t.route(method, path);
            assert_eq!(d, Decision { upstream, reason }, "{method} {path}");
        }
    }

    fn retained(resource: &str) -> ResourceRoute {
        ResourceRoute {
            retained: true,
            failover_cluster: None,
            ..route(resource, false, None)
        }
    }

    /// A local apiserver whose peer "b" (cluster "pb") serves `resource.k8s.io/v1beta2`, while
    /// the apiserver that served `v1beta3` is gone (retained); `pending` peers are live but
    /// their discovery is not known yet.
    fn failsafe_table(pending: &[&str]) -> RoutingTable {
        let config = FilterConfig {
            departed_clusters: Default::default(),
            fallback: None,
            pending_peers: pending.iter().map(|p| p.to_string()).collect(),
            openapi_v3: Default::default(),
            failover_clusters: Default::default(),
            failover_all: None,
            schema: SCHEMA_VERSION,
            local_apiserver: "apiserver-a".into(),
            peer_clusters: BTreeMap::from([("pb".to_string(), vec!["apiserver-b".to_string()])]),
            group_versions: vec![
                gv(
                    "",
                    "v1",
                    vec![
                        route("pods", true, None),
                        // A retained subresource of a served resource.
                        retained("pods/resize"),
                    ],
                ),
                gv(
                    "batch",
                    "v1",
                    vec![
                        // A retained resource with a served subresource.
                        retained("cronjobs"),
                        route("cronjobs/status", true, None),
                        route("jobs", true, None),
                    ],
                ),
                gv(
                    "resource.k8s.io",
                    "v1beta2",
                    vec![route("resourceclaims", false, Some("pb"))],
                ),
                gv(
                    "resource.k8s.io",
                    "v1beta3",
                    vec![
                        retained("resourceclaims"),
                        retained("resourceclaims/status"),
                    ],
                ),
                GroupVersionRoutes {
                    group: "stable.example.com".into(),
                    version: "v1".into(),
                    shared_storage: true,
                    resources: vec![],
                },
            ],
            discovery: None,
        };
        config.validate().unwrap();
        RoutingTable::compile(&config)
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn retained_keys_and_pending_peers_are_unavailable_not_404() {
        use Reason::*;
        let peer = Upstream::Peer { cluster: "pb" };
        let local = Upstream::Local;
        let none = Upstream::Unavailable;
        // (path, without pending peers, with pending peers)
        type Case<'a> = (&'a str, (Upstream<'a>, Reason), (Upstream<'a>, Reason));
        let cases: Vec<Case> = vec![
            // A retained resource, any shape, and its subresources listed or not.
            (
                "/apis/resource.k8s.io/v1beta3/namespaces/d/resourceclaims/c",
                (none, Retained),
                (none, Retained),
            ),
            (
                "/apis/resource.k8s.io/v1beta3/resourceclaims?watch=1",
                (none, Retained),
                (none, Retained),
            ),
            (
                "/apis/resource.k8s.io/v1beta3/namespaces/d/resourceclaims/c/status",
                (none, Retained),
                (none, Retained),
            ),
            (
                "/apis/resource.k8s.io/v1beta3/namespaces/d/resourceclaims/c/other",
                (none, Retained),
                (none, Retained),
            ),
            // A retained subresource of a served resource: the subresource decides first.
            (
                "/api/v1/namespaces/d/pods/p/resize",
                (none, Retained),
                (none, Retained),
            ),
            (
                "/api/v1/namespaces/d/pods/p",
                (local, ServedLocally),
                (local, ServedLocally),
            ),
            (
                "/api/v1/namespaces/d/pods/p/log",
                (local, ServedLocally),
                (local, ServedLocally),
            ),
            // And the other way round: a served subresource of a retained resource.
            (
                "/apis/batch/v1/namespaces/d/cronjobs/c/status",
                (local, ServedLocally),
                (local, ServedLocally),
            ),
            (
                "/apis/batch/v1/namespaces/d/cronjobs/c",
                (none, Retained),
                (none, Retained),
            ),
            (
                "/apis/batch/v1/namespaces/d/cronjobs/c/scale",
                (none, Retained),
                (none, Retained),
            ),
            // Served by a peer, shared storage, non-resource, unparseable: pending peers or not.
            (
                "/apis/resource.k8s.io/v1beta2/resourceclaims",
                (peer, ServedByPeer),
                (peer, ServedByPeer),
            ),
            (
                "/apis/stable.example.com/v1/widgets",
                (local, SharedStorage),
                (local, SharedStorage),
            ),
            (
                "/healthz",
                (local, NonResourceRequest),
                (local, NonResourceRequest),
            ),
            (
                "/apis/nope.example.com/v1",
                (local, NonResourceRequest),
                (local, NonResourceRequest),
            ),
            ("/api/v1/watch", (local, Unparseable), (local, Unparseable)),
            // Served by nobody known: the local 404, unless a peer's discovery is pending.
            (
                "/apis/nope.example.com/v1/things",
                (local, ServedByNobody),
                (none, PeerDiscoveryPending),
            ),
            (
                "/apis/batch/v1/namespaces/d/widgets/w",
                (local, ServedByNobody),
                (none, PeerDiscoveryPending),
            ),
            (
                "/api/v2/namespaces/d/pods",
                (local, ServedByNobody),
                (none, PeerDiscoveryPending),
            ),
        ];
        let settled = failsafe_table(&[]);
        let pending = failsafe_table(&["apiserver-c", "apiserver-d"]);
        assert!(settled.pending_peers().is_empty());
        assert_eq!(pending.pending_peers(), ["apiserver-c", "apiserver-d"]);
        for (path, (upstream, reason), (pending_upstream, pending_reason)) in cases {
            for method in ["GET", "DELETE"] {
                let (_, d) = settled.route(method, path);
                assert_eq!(d, Decision { upstream, reason }, "{method} {path}");
                let (_, d) = pending.route(method, path);
                let want = Decision {
                    upstream: pending_upstream,
                    reason: pending_reason,
                };
                assert_eq!(d, want, "{method} {path} (pending peers)");
            }
        }
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn empty_table_sends_everything_local() {
        let t = RoutingTable::default();
        for path in ["/api/v1/pods", "/apis/x/v1/y", "/", ""] {
            assert_eq!(t.route("GET", path).1.upstream, Upstream::Local, "{path}");
        }
    }

    /// Failover from the local apiserver: a key it serves that live peers serve too goes to
    /// its failover cluster (the local apiserver first), what every apiserver serves to the
    /// failover cluster of every live peer, and what only the local apiserver serves, what
    /// nobody serves, this node's health endpoints and unparsable requests stay local.
    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn keys_other_apiservers_serve_fail_over_to_them() {
        use Reason::*;
        let mut pods = route("pods", true, None);
        pods.failover_cluster = Some("fall-b".into());
        let config = FilterConfig {
            departed_clusters: Default::default(),
            fallback: None,
            pending_peers: Vec::new(),
            openapi_v3: Default::default(),
            failover_clusters: BTreeMap::from([
                ("fall-b".to_string(), vec!["apiserver-b".to_string()]),
                (
                    "fall-all".to_string(),
                    vec!["apiserver-b".to_string(), "apiserver-c".to_string()],
                ),
            ]),
            failover_all: Some("fall-all".into()),
            schema: SCHEMA_VERSION,
            local_apiserver: "apiserver-a".into(),
            peer_clusters: BTreeMap::from([("p133".to_string(), vec!["apiserver-b".to_string()])]),
            group_versions: vec![
                gv(
                    "",
                    "v1",
                    vec![
                        pods,
                        route("pods/resize", false, Some("p133")),
                        route("namespaces", true, None),
                    ],
                ),
                GroupVersionRoutes {
                    group: "stable.example.com".into(),
                    version: "v1".into(),
                    shared_storage: true,
                    resources: Vec::new(),
                },
            ],
            discovery: None,
        };
        config.validate().expect("valid");
        let t = RoutingTable::compile(&config);
        let first = |failover| Upstream::LocalFirst { failover };
        let cases: Vec<(&str, &str, Upstream, Reason)> = vec![
            (
                "GET",
                "/api/v1/namespaces/ns/pods",
                first("fall-b"),
                ServedLocally,
            ),
            (
                "POST",
                "/api/v1/namespaces/ns/pods",
                first("fall-b"),
                ServedLocally,
            ),
            // A subresource nobody lists follows its resource.
            (
                "GET",
                "/api/v1/namespaces/ns/pods/p/log",
                first("fall-b"),
                ServedLocally,
            ),
            (
                "PATCH",
                "/api/v1/namespaces/ns/pods/p/resize",
                Upstream::Peer { cluster: "p133" },
                ServedByPeer,
            ),
            // Only the local apiserver serves it: nowhere else to go.
            ("GET", "/api/v1/namespaces", Upstream::Local, ServedLocally),
            // Nobody serves it: the local 404 is the truth, and any live peer's while the
            // local apiserver cannot be reached.
            ("GET", "/api/v1/nothings", first("fall-all"), ServedByNobody),
            // Every apiserver serves these.
            (
                "GET",
                "/apis/stable.example.com/v1/crontabs",
                first("fall-all"),
                SharedStorage,
            ),
            ("GET", "/version", first("fall-all"), NonResourceRequest),
            ("GET", "/openapi/v2", first("fall-all"), NonResourceRequest),
            ("GET", "/apis", first("fall-all"), NonResourceRequest),
            // This node's own health and metrics never leave it.
            ("GET", "/readyz", Upstream::Local, NonResourceRequest),
            ("GET", "/readyz/etcd", Upstream::Local, NonResourceRequest),
            ("GET", "/livez?verbose", Upstream::Local, NonResourceRequest),
            ("GET", "/healthz", Upstream::Local, NonResourceRequest),
            ("GET", "/metrics", Upstream::Local, NonResourceRequest),
            ("GET", "/debug/pprof/", Upstream::Local, NonResourceRequest),
            // Not a health endpoint, only a look-alike.
            ("GET", "/readyzz", first("fall-all"), NonResourceRequest),
            (
                "GET",
                "/api/v1/namespaces/%zz",
                Upstream::Local,
                Unparseable,
            ),
        ];
        for (method, path, upstream, reason) in cases {
            assert_eq!(
                t.route(method, path).1,
                Decision { upstream, reason },
                "{method} {path}"
            );
        }
        assert_eq!(t.failover_all(), Some("fall-all"));

        // A failover cluster that is not declared, or on a key the local apiserver does not
        // serve, is refused.
        let mut bad = config.clone();
        bad.failover_all = Some("nope".into());
        assert!(bad.validate().is_err());
        let mut bad = config.clone();
        bad.group_versions[0].resources[1].failover_cluster = Some("fall-b".into());
        assert!(bad.validate().is_err());
        let mut bad = config;
        bad.failover_clusters
            .insert("p133".into(), vec!["apiserver-b".into()]);
        assert!(
            bad.validate().is_err(),
            "a failover cluster named like a peer cluster"
        );
    }
}
