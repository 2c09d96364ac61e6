//! The orchestrator's decisions, as plain functions over plain data (no I/O, no clock, no
//! tasks): which discovery watches to run, when the first sync is complete, what to publish, and
//! the skew matrix. The tokio glue in [`super::orchestrator`] only gathers the inputs and carries
//! the outputs out.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::discovery::ServedApis;
use crate::flags::Scheme;
use crate::peers::PeerSet;
use crate::routing::RoutingPlan;
use skewgate_core::group_version::GroupVersion;

// ---------------------------------------------------------------------------------------------
// Which discovery watches run.

/// The discovery URL of every live peer, by lease name.
pub fn peer_urls(set: &PeerSet, scheme: Scheme) -> BTreeMap<String, String> {
    set.peers
        .iter()
        .map(|p| (p.id.clone(), scheme.url(p.address)))
        .collect()
}

/// What to do with the running per-peer discovery watches.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct WatchChanges {
    /// New peers: (id, url).
    pub start: Vec<(String, String)>,
    /// Peers whose address changed: drop the old watch, start one at the new URL.
    pub restart: Vec<(String, String)>,
    /// Peers that left: drop the watch and forget its metrics.
    pub stop: Vec<String>,
}

impl WatchChanges {
    pub fn is_empty(&self) -> bool {
        self.start.is_empty() && self.restart.is_empty() && self.stop.is_empty()
    }
}

/// From the running watches (id → url) to the desired ones. Sorted by id.
pub fn reconcile(
    running: &BTreeMap<String, String>,
    desired: &BTreeMap<String, String>,
) -> WatchChanges {
    let mut changes = WatchChanges::default();
    for (id, url) in desired {
        match running.get(id) {
            None => changes.start.push((id.clone(), url.clone())),
            Some(old) if old != url => changes.restart.push((id.clone(), url.clone())),
            Some(_) => {}
        }
    }
    changes.stop = running
        .keys()
        .filter(|id| !desired.contains_key(*id))
        .cloned()
        .collect();
    changes
}

// ---------------------------------------------------------------------------------------------
// The first complete sync.

/// Where one apiserver's discovery stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    /// Finished attempts, good or not.
    pub attempts: u64,
    /// A good view exists.
    pub has_documents: bool,
}

/// Everything the first-sync rule looks at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncView {
    /// The identity-lease list completed.
    pub peers_synced: bool,
    /// The CRD and APIService lists completed.
    pub shared_storage_synced: bool,
    pub local: Progress,
    /// Every live peer.
    pub peers: Vec<(String, Progress)>,
    /// `--initial-sync-timeout` has passed since the start.
    pub deadline_passed: bool,
}

/// May the control plane publish its first snapshot?
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// Not yet; why (for `/readyz` and the log).
    Wait(Vec<String>),
    /// Yes; what is still missing when the deadline forced it (empty: a complete sync).
    Publish { incomplete: Vec<String> },
}

/// The first snapshot needs the local apiserver's discovery (without it nothing can be known
/// to be local, and an Envoy that stays closed sends clients to a healthy apiserver), and then
/// the identity leases and shared storage listed and every live peer tried once — or, after the
/// deadline, whatever is known by then (a peer never heard from is simply not routed to).
pub fn first_sync_gate(view: &SyncView) -> Gate {
    if !view.local.has_documents {
        let why = if view.local.attempts == 0 {
            "the local apiserver's discovery has not been fetched yet"
        } else {
            "the local apiserver's discovery could not be fetched yet"
        };
        return Gate::Wait(vec![why.to_string()]);
    }
    let mut missing = Vec::new();
    if !view.peers_synced {
        missing.push("the identity leases are not listed yet".to_string());
    }
    if !view.shared_storage_synced {
        missing.push("the CRDs and APIServices are not listed yet".to_string());
    }
    for (id, p) in &view.peers {
        if p.attempts == 0 {
            missing.push(format!("peer {id} has not been tried yet"));
        }
    }
    if missing.is_empty() {
        Gate::Publish {
            incomplete: Vec::new(),
        }
    } else if view.deadline_passed {
        Gate::Publish {
            incomplete: missing,
        }
    } else {
        Gate::Wait(missing)
    }
}

// ---------------------------------------------------------------------------------------------
// The skew matrix.

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MatrixResource {
    /// `resource` or `resource/subresource`.
    pub resource: String,
    pub served_by: Vec<String>,
    /// Where a request for it goes from here: `local` or the peer cluster (before its
    /// authentication suffix).
    pub route: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MatrixGroupVersion {
    pub group: String,
    pub version: String,
    /// A CRD or service-backed APIService group-version: always local.
    pub shared_storage: bool,
    /// Apiservers serving at least one resource of it.
    pub served_by: Vec<String>,
    pub resources: Vec<MatrixResource>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkewMatrix {
    pub local: String,
    /// The apiservers compared (those with a discovery view), local first.
    pub apiservers: Vec<String>,
    /// Only what not every apiserver serves, unless asked for everything.
    pub complete: bool,
    pub group_versions: Vec<MatrixGroupVersion>,
}

/// Which apiserver serves which group-version-resource, and where requests for it go.
pub fn skew_matrix(
    served: &[(String, ServedApis)],
    plan: &RoutingPlan,
    shared_storage: &BTreeSet<GroupVersion>,
    complete: bool,
) -> SkewMatrix {
    let local = plan.config.local_apiserver.clone();
    let apiservers: Vec<String> = served.iter().map(|(id, _)| id.clone()).collect();
    // (group, version) -> resource -> servers.
    let mut table: BTreeMap<(&str, &str), BTreeMap<&str, Vec<&str>>> = BTreeMap::new();
    for (id, s) in served {
        for (group, version, keys) in s.iter() {
            let gv = table.entry((group, version)).or_default();
            for key in keys {
                gv.entry(key.as_str()).or_default().push(id.as_str());
            }
        }
    }
    let routes: BTreeMap<(&str, &str, &str), String> = plan
        .config
        .group_versions
        .iter()
        .flat_map(|gv| {
            gv.resources.iter().map(move |r| {
                let route = if r.local {
                    "local".to_string()
                } else {
                    r.peer_cluster
                        .clone()
                        .unwrap_or_else(|| "local".to_string())
                };
                (
                    (gv.group.as_str(), gv.version.as_str(), r.resource.as_str()),
                    route,
                )
            })
        })
        .collect();
    let mut group_versions = Vec::new();
    for ((group, version), resources) in table {
        let shared = shared_storage.contains(&GroupVersion::new(group, version));
        let mut gv_servers: BTreeSet<&str> = BTreeSet::new();
        let mut rows = Vec::new();
        for (resource, servers) in resources {
            gv_servers.extend(servers.iter().copied());
            if !complete && servers.len() == apiservers.len() {
                continue;
            }
            let route = if shared {
                "local".to_string()
            } else {
                routes
                    .get(&(group, version, resource))
                    .cloned()
                    .unwrap_or_else(|| "local".to_string())
            };
            rows.push(MatrixResource {
                resource: resource.to_string(),
                served_by: servers.iter().map(|s| s.to_string()).collect(),
                route,
            });
        }
        if rows.is_empty() {
            continue;
        }
        // Servers in the order given (local first).
        let served_by = apiservers
            .iter()
            .filter(|a| gv_servers.contains(a.as_str()))
            .cloned()
            .collect();
        group_versions.push(MatrixGroupVersion {
            group: group.to_string(),
            version: version.to_string(),
            shared_storage: shared,
            served_by,
            resources: rows,
        });
    }
    SkewMatrix {
        local,
        apiservers,
        complete,
        group_versions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::documents::DiscoveryDocuments;
    use crate::envoy::Address;
    use crate::peers::{AddressSource, Peer as LivePeer};
    use crate::plan::{plan, ApiserverView, MergedOutcome, Plan, PlanError, PlanInputs};
    use crate::routing;
    use skewgate_core::config::{UpstreamAuth, LOCAL_CLUSTER};
    use std::time::SystemTime;

    use crate::test_fixtures::{K130, K133};

    fn docs(dir: &str) -> DiscoveryDocuments {
        DiscoveryDocuments::from_dir(dir).expect("fixture")
    }

    fn addr(s: &str) -> Address {
        Address::parse(s).expect("address")
    }

    fn live(id: &str, address: &str) -> LivePeer {
        LivePeer {
            id: id.into(),
            holder_identity: format!("{id}_1"),
            hostname: None,
            renew_time: SystemTime::UNIX_EPOCH,
            address: address.parse().expect("socket address"),
            address_source: AddressSource::Annotation,
            generation: 1,
            first_seen: Default::default(),
        }
    }

    fn map(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
        entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn watches_follow_the_peer_set() {
        let set = PeerSet {
            synced: true,
            peers: vec![
                live("apiserver-b", "10.0.0.2:6443"),
                live("apiserver-c", "[fd00::3]:6443"),
            ],
            ..Default::default()
        };
        assert_eq!(
            peer_urls(&set, Scheme::Https),
            map(&[
                ("apiserver-b", "https://10.0.0.2:6443"),
                ("apiserver-c", "https://[fd00::3]:6443")
            ])
        );
        assert_eq!(
            peer_urls(&set, Scheme::Http)["apiserver-b"],
            "http://10.0.0.2:6443"
        );

        type Urls<'a> = &'a [(&'a str, &'a str)];
        let cases: &[(Urls<'_>, Urls<'_>, WatchChanges)] = &[
            (&[], &[], WatchChanges::default()),
            (
                &[],
                &[("b", "https://b:1")],
                WatchChanges {
                    start: vec![("b".into(), "https://b:1".into())],
                    ..Default::default()
                },
            ),
            // Unchanged: nothing (a restart is the RefetchTrigger's business, not a new watch).
            (
                &[("b", "https://b:1")],
                &[("b", "https://b:1")],
                WatchChanges::default(),
            ),
            (
                &[("b", "https://b:1"), ("c", "https://c:1")],
                &[("b", "https://b:2"), ("d", "https://d:1")],
                WatchChanges {
                    start: vec![("d".into(), "https://d:1".into())],
                    restart: vec![("b".into(), "https://b:2".into())],
                    stop: vec!["c".into()],
                },
            ),
            (
                &[("b", "https://b:1")],
                &[],
                WatchChanges {
                    stop: vec!["b".into()],
                    ..Default::default()
                },
            ),
        ];
        for (running, desired, want) in cases {
            assert_eq!(
                &reconcile(&map(running), &map(desired)),
                want,
                "{running:?} -> {desired:?}"
            );
        }
    }

    fn tried(ok: bool) -> Progress {
        Progress {
            attempts: 1,
            has_documents: ok,
        }
    }

    #[test]
    fn first_sync_table() {
        let complete = SyncView {
            peers_synced: true,
            shared_storage_synced: true,
            local: tried(true),
            peers: vec![("b".into(), tried(true)), ("c".into(), tried(false))],
            deadline_passed: false,
        };
        // Every live peer tried (one failed: it is simply not routed to).
        assert_eq!(
            first_sync_gate(&complete),
            Gate::Publish { incomplete: vec![] }
        );
        let cases: Vec<(&str, SyncView, bool, usize)> = vec![
            (
                "local not fetched",
                SyncView {
                    local: Progress::default(),
                    ..complete.clone()
                },
                false,
                1,
            ),
            (
                "local failing, even after the deadline",
                SyncView {
                    local: tried(false),
                    deadline_passed: true,
                    ..complete.clone()
                },
                false,
                1,
            ),
            (
                "leases not listed",
                SyncView {
                    peers_synced: false,
                    ..complete.clone()
                },
                false,
                1,
            ),
            (
                "shared storage not listed",
                SyncView {
                    shared_storage_synced: false,
                    ..complete.clone()
                },
                false,
                1,
            ),
            (
                "a peer not tried",
                SyncView {
                    peers: vec![("b".into(), tried(true)), ("c".into(), Progress::default())],
                    ..complete.clone()
                },
                false,
                1,
            ),
            (
                "a peer not tried, deadline passed",
                SyncView {
                    peers: vec![("b".into(), Progress::default())],
                    peers_synced: false,
                    deadline_passed: true,
                    ..complete.clone()
                },
                true,
                2,
            ),
            (
                "no peers at all",
                SyncView {
                    peers: vec![],
                    ..complete.clone()
                },
                true,
                0,
            ),
        ];
        for (what, view, publish, reasons) in cases {
            match first_sync_gate(&view) {
                Gate::Wait(r) => {
                    assert!(!publish, "{what}: waits for {r:?}");
                    assert_eq!(r.len(), reasons, "{what}: {r:?}");
                }
                Gate::Publish { incomplete } => {
                    assert!(publish, "{what}: publishes");
                    assert_eq!(incomplete.len(), reasons, "{what}: {incomplete:?}");
                }
            }
        }
    }

    struct World {
        a: DiscoveryDocuments,
        b: DiscoveryDocuments,
        local: Address,
        b_addr: Address,
        c_addr: Address,
    }

    impl World {
        fn new() -> Self {
            World {
                a: docs(K130),
                b: docs(K133),
                local: addr("127.0.0.1:6443"),
                b_addr: addr("10.0.0.2:6443"),
                c_addr: addr("10.0.0.3:6443"),
            }
        }

        fn compose(
            &self,
            peers: &[ApiserverView<'_>],
            shared: &BTreeSet<GroupVersion>,
        ) -> Result<Plan, PlanError> {
            plan(&PlanInputs {
                local: ApiserverView {
                    id: "apiserver-a",
                    address: &self.local,
                    documents: Some(&self.a),
                },
                peers,
                retained: &[],
                shared_storage: shared,
                local_freshness: crate::routing::LocalFreshness::Current,
                filter_code: &crate::test_fixtures::wasm_code("/opt/skewgate.wasm"),
                upstream_sds: None,
            })
        }
    }

    fn route<'a>(c: &'a Plan, g: &str, v: &str, r: &str) -> Option<&'a str> {
        let gv = c
            .routing
            .config
            .group_versions
            .iter()
            .find(|x| x.group == g && x.version == v)?;
        let res = gv.resources.iter().find(|x| x.resource == r)?;
        if res.local {
            Some("local")
        } else {
            res.peer_cluster.as_deref()
        }
    }

    #[test]
    fn composition_routes_only_peers_with_a_view() {
        let w = World::new();
        let none = BTreeSet::new();
        let b = ApiserverView {
            id: "apiserver-b",
            address: &w.b_addr,
            documents: Some(&w.b),
        };
        let c = ApiserverView {
            id: "apiserver-c",
            address: &w.c_addr,
            documents: None,
        };
        let comp = w.compose(&[b, c], &none).expect("composes");
        assert_eq!(comp.routed, vec!["apiserver-b".to_string()]);
        assert_eq!(comp.unrouted.len(), 1);
        assert_eq!(comp.unrouted[0].id, "apiserver-c");
        let b_cluster = routing::peer_cluster_name(&["apiserver-b"]);
        assert_eq!(
            route(&comp, "resource.k8s.io", "v1beta2", "resourceclaims"),
            Some(b_cluster.as_str())
        );
        assert_eq!(route(&comp, "apps", "v1", "deployments"), Some("local"));
        assert!(matches!(comp.merged, MergedOutcome::Included { bytes } if bytes > 1000));
        let discovery = comp.routing.config.discovery.as_ref().expect("merged");
        assert!(discovery.apis.get().contains("\"v1beta2\""));
        // Every cluster in three variants (the local apiserver's, b's, and the failover from
        // the local apiserver to b), the filter configuration once.
        let b_failover = routing::failover_cluster_name(&["apiserver-b"]);
        let mut want: Vec<String> = [LOCAL_CLUSTER, b_cluster.as_str(), b_failover.as_str()]
            .iter()
            .flat_map(|base| UpstreamAuth::ALL.iter().map(|a| a.cluster(base)))
            .collect();
        want.sort();
        assert_eq!(
            comp.snapshot.clusters.keys().cloned().collect::<Vec<_>>(),
            want
        );
        assert_eq!(comp.snapshot.extension_configs.len(), 1);

        // Deterministic: the same inputs, the same versions (a restarted control plane
        // resyncs Envoy without a push).
        let again = w.compose(&[b, c], &none).expect("composes");
        assert_eq!(again.snapshot.version(), comp.snapshot.version());

        // Without the peer: local view only, its clusters gone, discovery shrinks back.
        let solo = w.compose(&[c], &none).expect("composes");
        assert!(solo.routed.is_empty());
        assert_eq!(
            route(&solo, "resource.k8s.io", "v1beta2", "resourceclaims"),
            None
        );
        assert_eq!(solo.snapshot.clusters.len(), 3);
        let solo_apis = solo
            .routing
            .config
            .discovery
            .as_ref()
            .expect("merged")
            .apis
            .get();
        assert!(!solo_apis.contains("\"v1beta2\""));

        // A peer claiming the local id is never routed to.
        let imposter = ApiserverView {
            id: "apiserver-a",
            address: &w.b_addr,
            documents: Some(&w.b),
        };
        let comp = w.compose(&[imposter], &none).expect("composes");
        assert!(comp.routed.is_empty());
        assert_eq!(comp.unrouted[0].id, "apiserver-a");
    }

    #[test]
    fn shared_storage_stays_local_and_no_local_view_means_nothing() {
        let w = World::new();
        let b = ApiserverView {
            id: "apiserver-b",
            address: &w.b_addr,
            documents: Some(&w.b),
        };
        let shared: BTreeSet<GroupVersion> =
            [GroupVersion::new("resource.k8s.io", "v1beta2")].into();
        let comp = w.compose(&[b], &shared).expect("composes");
        let gv = comp
            .routing
            .config
            .group_versions
            .iter()
            .find(|x| x.group == "resource.k8s.io" && x.version == "v1beta2")
            .expect("listed");
        assert!(gv.shared_storage && gv.resources.is_empty());

        let err = plan(&PlanInputs {
            local: ApiserverView {
                id: "apiserver-a",
                address: &w.local,
                documents: None,
            },
            peers: &[b],
            retained: &[],
            shared_storage: &BTreeSet::new(),
            local_freshness: crate::routing::LocalFreshness::Current,
            filter_code: &crate::test_fixtures::wasm_code("/opt/skewgate.wasm"),
            upstream_sds: None,
        });
        assert!(matches!(err, Err(PlanError::NoLocalDiscovery)));
    }

    #[test]
    fn the_skew_matrix_lists_what_differs_and_where_it_goes() {
        let w = World::new();
        let b = ApiserverView {
            id: "apiserver-b",
            address: &w.b_addr,
            documents: Some(&w.b),
        };
        let none = BTreeSet::new();
        let comp = w.compose(&[b], &none).expect("composes");
        let m = skew_matrix(&comp.served, &comp.routing, &none, false);
        assert_eq!(m.local, "apiserver-a");
        assert_eq!(m.apiservers, vec!["apiserver-a", "apiserver-b"]);
        let find = |g: &str, v: &str| {
            m.group_versions
                .iter()
                .find(|x| x.group == g && x.version == v)
        };
        // Served by both: not listed.
        assert!(find("apps", "v1").is_none());
        let v1beta2 = find("resource.k8s.io", "v1beta2").expect("1.33 only");
        assert_eq!(v1beta2.served_by, vec!["apiserver-b"]);
        let claims = v1beta2
            .resources
            .iter()
            .find(|r| r.resource == "resourceclaims")
            .expect("claims");
        assert_eq!(claims.route, routing::peer_cluster_name(&["apiserver-b"]));
        let v1alpha2 = find("resource.k8s.io", "v1alpha2").expect("1.30 only");
        assert_eq!(v1alpha2.served_by, vec!["apiserver-a"]);
        assert!(v1alpha2.resources.iter().all(|r| r.route == "local"));
        // core/v1 grows by subresources between versions.
        let core = find("", "v1").expect("core differs");
        assert!(core.resources.iter().any(|r| r.resource == "pods/resize"));

        let all = skew_matrix(&comp.served, &comp.routing, &none, true);
        let apps = all
            .group_versions
            .iter()
            .find(|x| x.group == "apps" && x.version == "v1")
            .expect("everything");
        assert_eq!(apps.served_by, vec!["apiserver-a", "apiserver-b"]);
        assert!(serde_json::to_string(&all).expect("JSON").len() > 1000);
    }
}
