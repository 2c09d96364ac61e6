//! The one pipeline from what the apiservers serve to what Envoy holds:
//!
//! ```text
//! discovery views ─► served APIs ─► routing table ─┬─► filter configuration ─► Envoy resources
//!                 └─► merged discovery ────────────┘      (validated)             (Snapshot)
//! ```
//!
//! [`plan`] is used by every mode: the live control plane (`skewgate-control run`, after each
//! change), the static renderer (`skewgate-control render-static`) and the integration tests'
//! Envoy harness, so what the tests exercise is what production runs. Pure: no I/O, no clock.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Serialize;
use skewgate_core::config::{DiscoveryConfig, FilterFeature, OpenApiPeerEntry, MAX_CONFIG_BYTES};
use skewgate_core::group_version::GroupVersion;

use crate::discovery::documents::DiscoveryDocuments;
use crate::discovery::openapi::{self, PeerRoot};
use crate::discovery::payload;
use crate::discovery::ServedApis;
use crate::envoy::resources::FilterCode;
use crate::envoy::{Address, EnvoyError};
use crate::retained;
pub use crate::retained::RetainedView;
use crate::routing::{self, ConfigExtras, Peer, RetainedRoutes, RoutingPlan, RoutingTable};
use crate::xds::{Snapshot, SnapshotInputs};

/// One apiserver as composition sees it.
#[derive(Debug, Clone, Copy)]
pub struct ApiserverView<'a> {
    /// Lease name (the local apiserver: its lease name when known).
    pub id: &'a str,
    pub address: &'a Address,
    /// The last good discovery, if any.
    pub documents: Option<&'a DiscoveryDocuments>,
}

#[derive(Debug, Clone, Copy)]
pub struct PlanInputs<'a> {
    pub local: ApiserverView<'a>,
    /// The live peers.
    pub peers: &'a [ApiserverView<'a>],
    /// Peers whose APIs are retained ([`crate::retained`]); empty in the static mode.
    pub retained: &'a [RetainedView<'a>],
    pub shared_storage: &'a BTreeSet<GroupVersion>,
    /// Whether `local.documents` is what the local apiserver serves now
    /// ([`routing::LocalFreshness`]); always current in the static mode.
    pub local_freshness: routing::LocalFreshness,
    pub filter_code: &'a FilterCode,
    /// TLS to the apiservers: the directory of the SDS files of the peer CA and the
    /// proxy-client certificate ([`crate::envoy::secrets`]); `None`: plaintext.
    pub upstream_sds: Option<&'a Path>,
}

/// Whether merged discovery made it into the filter configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MergedOutcome {
    Included {
        bytes: usize,
    },
    /// Left out (too large, or a bug): discovery is then each apiserver's own.
    Skipped {
        reason: String,
    },
}

/// A live peer that is not routed to, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unrouted {
    pub id: String,
    pub reason: String,
}

/// Everything decided for one view of the cluster.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The routing table and the filter configuration (with merged discovery, when included).
    pub routing: RoutingPlan,
    /// The Envoy resources carrying it: served over ADS, or written to files.
    pub snapshot: Snapshot,
    /// Peers in the plan (serving something), sorted.
    pub routed: Vec<String>,
    pub unrouted: Vec<Unrouted>,
    pub merged: MergedOutcome,
    /// What each apiserver with a view serves: the local one first, then peers by id.
    pub served: Vec<(String, ServedApis)>,
    /// What no live apiserver serves but departed ones did, by departed apiserver (a returning
    /// one is routed, and pending).
    pub retained: Vec<(String, ServedApis)>,
    /// Live peers whose discovery is not known: requests nobody known serves get 503.
    pub pending: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("the local apiserver's discovery is not known yet")]
    NoLocalDiscovery,
    #[error("the local apiserver's discovery is unusable: {0}")]
    LocalDiscovery(String),
    #[error("the filter configuration does not validate (a bug): {0}")]
    Invalid(String),
    #[error(
        "the routing table alone is {bytes} bytes, more than the filter's {limit}: nothing is \
         pushed, Envoy keeps its configuration"
    )]
    TooLarge { bytes: usize, limit: usize },
    #[error(transparent)]
    Envoy(#[from] EnvoyError),
}

/// Routing plan, merged discovery and xDS snapshot for one view of the cluster. Peers without a
/// good view (never fetched) are left out and reported; so are peers claiming the local id.
pub fn plan(inputs: &PlanInputs<'_>) -> Result<Plan, PlanError> {
    let local_docs = inputs.local.documents.ok_or(PlanError::NoLocalDiscovery)?;
    let local_served = local_docs
        .served()
        .map_err(|e| PlanError::LocalDiscovery(e.to_string()))?;
    let Known {
        mut unrouted,
        routing_peers,
        mut addresses,
        mut servers,
        served,
        openapi_roots,
    } = known(inputs, local_docs, &local_served);
    // Retention (`crate::retained`): what departed apiservers served that no live one does
    // answers 503 and stays listed; what a returning one alone served goes to it.
    let mut live = ServedApis::new();
    for (_, s) in &served {
        live.merge(s.clone());
    }
    let live_ids: BTreeSet<&str> = served.iter().map(|(id, _)| id.as_str()).collect();
    let unknown: BTreeSet<&str> = inputs
        .peers
        .iter()
        .map(|p| p.id)
        .filter(|id| *id != inputs.local.id && !live_ids.contains(id))
        .collect();
    // Returning: a live peer with no discovery read since it came back (one whose discovery
    // was read but is unusable is not: it stays unrouted, as any other).
    let unread: BTreeSet<&str> = inputs
        .peers
        .iter()
        .filter(|p| p.documents.is_none() && unknown.contains(p.id))
        .map(|p| p.id)
        .collect();
    let mut kept = retained::retained(&live, &live_ids, &unread, inputs.retained);
    let mut returning_peers = Vec::new();
    for (id, alone) in &kept.returning {
        match inputs.peers.iter().find(|p| p.id == id) {
            Some(view) => {
                returning_peers.push(Peer {
                    id: id.clone(),
                    served: alone.clone(),
                });
                addresses.push((id.clone(), view.address.clone()));
            }
            // Not a live peer after all (`unread` says it is): what it served answers 503.
            None => kept.keys.merge(alone.clone()),
        }
    }
    // A departed apiserver with a known address gets what it alone served sent there.
    let mut departed_peers = Vec::new();
    for (id, alone) in &kept.departed {
        let address = inputs
            .retained
            .iter()
            .find(|r| r.id == id)
            .and_then(|r| r.address);
        if let Some(address) = address {
            departed_peers.push(Peer {
                id: id.clone(),
                served: alone.clone(),
            });
            addresses.push((id.clone(), address.clone()));
        }
    }
    servers.extend(kept.documents.iter().map(|(id, d)| (id.clone(), d)));
    // A returning apiserver is routed (what it alone served) and pending (its discovery).
    unrouted.retain(|u| !returning_peers.iter().any(|p| p.id == u.id));
    let pending: Vec<String> = unknown.iter().map(|id| id.to_string()).collect();

    let mut table = routing::build(
        &local_served,
        inputs.local.id,
        &routing_peers,
        RetainedRoutes {
            returning: &returning_peers,
            keys: &kept.keys,
            departed: &departed_peers,
        },
        inputs.shared_storage,
        inputs.local_freshness,
    );
    let openapi_v3 = openapi_entries(
        &mut table,
        &local_served,
        inputs.shared_storage,
        &openapi_roots,
    );
    let (discovery, merged) = merged_discovery(inputs.local.id, &servers, &kept.stale);
    let mut routing = RoutingPlan::assemble(
        table,
        ConfigExtras {
            pending_peers: pending.clone(),
            openapi_v3,
            discovery,
        },
    );
    let routed: BTreeSet<String> = routing
        .clusters
        .iter()
        .flat_map(|c| c.peer_ids.iter().cloned())
        .collect();
    let merged = fit(&mut routing, merged, MAX_CONFIG_BYTES)?;
    routing
        .config
        .validate()
        .map_err(|e| PlanError::Invalid(e.to_string()))?;
    let snapshot = Snapshot::from_plan(
        &routing,
        &SnapshotInputs {
            filter_code: inputs.filter_code,
            local: inputs.local.address,
            peers: &addresses,
            upstream_sds: inputs.upstream_sds,
        },
    )?;
    Ok(Plan {
        routing,
        snapshot,
        routed: routed.into_iter().collect(),
        unrouted,
        merged,
        served,
        retained: kept.departed,
        pending,
    })
}

/// The apiservers whose discovery is known (the local one first), and the live peers left
/// out, with why.
struct Known<'a> {
    unrouted: Vec<Unrouted>,
    routing_peers: Vec<Peer>,
    addresses: Vec<(String, Address)>,
    servers: Vec<(String, &'a DiscoveryDocuments)>,
    served: Vec<(String, ServedApis)>,
    openapi_roots: Vec<(&'a str, ServedApis, Option<&'a openapi::OpenApiRoot>)>,
}

fn known<'a>(
    inputs: &PlanInputs<'a>,
    local_docs: &'a DiscoveryDocuments,
    local_served: &ServedApis,
) -> Known<'a> {
    let mut known = Known {
        unrouted: Vec::new(),
        routing_peers: Vec::new(),
        addresses: Vec::new(),
        servers: vec![(inputs.local.id.to_string(), local_docs)],
        served: vec![(inputs.local.id.to_string(), local_served.clone())],
        openapi_roots: Vec::new(),
    };
    for peer in inputs.peers {
        let unrouted = |reason: String| Unrouted {
            id: peer.id.to_string(),
            reason,
        };
        if peer.id == inputs.local.id {
            known
                .unrouted
                .push(unrouted("it has the local apiserver's id".to_string()));
            continue;
        }
        let Some(docs) = peer.documents else {
            known.unrouted.push(unrouted(
                "its discovery has never been fetched successfully".to_string(),
            ));
            continue;
        };
        match docs.served() {
            Ok(s) => {
                known.routing_peers.push(Peer {
                    id: peer.id.to_string(),
                    served: s.clone(),
                });
                known
                    .addresses
                    .push((peer.id.to_string(), peer.address.clone()));
                known.servers.push((peer.id.to_string(), docs));
                known
                    .openapi_roots
                    .push((peer.id, s.clone(), docs.openapi.as_ref()));
                known.served.push((peer.id.to_string(), s));
            }
            Err(e) => known
                .unrouted
                .push(unrouted(format!("its discovery is unusable: {e}"))),
        }
    }
    known
}

/// Merged discovery of `servers` (the local apiserver first), with the `stale` group-versions'
/// legacy documents answering 503; or why it is left out.
fn merged_discovery(
    local_id: &str,
    servers: &[(String, &DiscoveryDocuments)],
    stale: &BTreeSet<GroupVersion>,
) -> (Option<DiscoveryConfig>, MergedOutcome) {
    match payload::discovery_config(local_id, servers) {
        Ok(mut discovery) => {
            discovery.unavailable = stale.iter().map(GroupVersion::api_path).collect();
            payload::set_content_version(&mut discovery);
            let bytes = discovery.apis.get().len()
                + discovery.api.get().len()
                + discovery
                    .legacy
                    .values()
                    .map(|d| d.get().len())
                    .sum::<usize>();
            (Some(discovery), MergedOutcome::Included { bytes })
        }
        Err(e) => (
            None,
            MergedOutcome::Skipped {
                reason: e.to_string(),
            },
        ),
    }
}

/// Leave out what is optional until the filter configuration fits the filter's `limit` (it
/// refuses a larger one: a NACK, and routing would stay on the previous configuration): first
/// merged discovery (discovery is then each apiserver's own), then the OpenAPI v3 entries (the
/// local apiserver's `/openapi/v3` stands). A routing table that does not fit by itself is an
/// error: nothing is pushed and the control plane reports it.
fn fit(
    routing: &mut RoutingPlan,
    merged: MergedOutcome,
    limit: usize,
) -> Result<MergedOutcome, PlanError> {
    let size = |routing: &RoutingPlan| routing.config.to_json().len();
    let bytes = size(routing);
    if bytes <= limit {
        return Ok(merged);
    }
    let left_out =
        format!("the filter configuration would be {bytes} bytes, more than its {limit}");
    if routing.config.discovery.take().is_some() && size(routing) <= limit {
        return Ok(MergedOutcome::Skipped {
            reason: format!("{left_out}: merged discovery left out"),
        });
    }
    routing.config.openapi_v3.clear();
    let bytes = size(routing);
    if bytes <= limit {
        return Ok(MergedOutcome::Skipped {
            reason: format!("{left_out}: merged discovery and the peers' OpenAPI entries left out"),
        });
    }
    // Departed routes are optional too: without them a retained key is the filter's own 503.
    routing.config.without(FilterFeature::DepartedRoutes);
    let bytes = size(routing);
    if bytes <= limit {
        return Ok(MergedOutcome::Skipped {
            reason: format!(
                "{left_out}: merged discovery, the peers' OpenAPI entries and the departed routes left out"
            ),
        });
    }
    Err(PlanError::TooLarge { bytes, limit })
}

/// The OpenAPI v3 entries of peer-only group-versions (docs/ARCHITECTURE.md "OpenAPI v3"),
/// each with the cluster of exactly the peers that list it (declared in `table` if no resource
/// needs it).
fn openapi_entries(
    table: &mut RoutingTable,
    local: &ServedApis,
    shared_storage: &BTreeSet<GroupVersion>,
    roots: &[(&str, ServedApis, Option<&openapi::OpenApiRoot>)],
) -> BTreeMap<String, OpenApiPeerEntry> {
    let peers: Vec<PeerRoot<'_>> = roots
        .iter()
        .map(|(id, served, root)| PeerRoot {
            id,
            served,
            root: *root,
        })
        .collect();
    openapi::peer_entries(local, shared_storage, &peers)
        .into_iter()
        .map(|(path, entry)| {
            let peer_cluster = table.peer_cluster(entry.peer_ids);
            (
                path,
                OpenApiPeerEntry {
                    server_relative_url: entry.server_relative_url,
                    peer_cluster,
                    replaces_local: entry.replaces_local,
                },
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::APIGroupDiscoveryList;
    use crate::test_fixtures::documents;

    fn addr(s: &str) -> Address {
        Address::parse(s).expect("address")
    }

    /// Local 1.30 with the given live peers and retained servers.
    fn plan_with(peers: &[ApiserverView<'_>], retained: &[RetainedView<'_>]) -> Plan {
        let local_docs = documents("k8s-1.30");
        let local = addr("127.0.0.1:6443");
        plan(&PlanInputs {
            local: ApiserverView {
                id: "apiserver-a",
                address: &local,
                documents: Some(&local_docs),
            },
            peers,
            retained,
            shared_storage: &BTreeSet::new(),
            local_freshness: routing::LocalFreshness::Current,
            filter_code: &crate::test_fixtures::wasm_code("/opt/skewgate.wasm"),
            upstream_sds: None,
        })
        .expect("plans")
    }

    fn route<'a>(p: &'a Plan, g: &str, v: &str, r: &str) -> Option<&'a ResourceRoute> {
        p.routing
            .config
            .group_versions
            .iter()
            .find(|x| x.group == g && x.version == v)?
            .resources
            .iter()
            .find(|x| x.resource == r)
    }

    /// `(group, version, freshness)` of the merged `/apis`.
    fn merged(p: &Plan) -> Vec<(String, String, Option<String>)> {
        let d = p.routing.config.discovery.as_ref().expect("merged");
        let list: APIGroupDiscoveryList = serde_json::from_str(d.apis.get()).expect("json");
        list.items
            .iter()
            .flat_map(|g| {
                g.versions.iter().map(|v| {
                    (
                        g.metadata.name.clone(),
                        v.version.clone(),
                        v.freshness.clone(),
                    )
                })
            })
            .collect()
    }

    use skewgate_core::config::ResourceRoute;

    #[test]
    fn what_only_a_retained_server_served_stays_stale_and_unavailable() {
        let b_docs = documents("k8s-1.33");
        let gone = [RetainedView {
            address: None,
            id: "apiserver-b",
            documents: &b_docs,
        }];
        let p = plan_with(&[], &gone);
        // Routing: retained, never local, never a peer.
        let claims = route(&p, "resource.k8s.io", "v1beta2", "resourceclaims").expect("listed");
        assert!(claims.retained && !claims.local && claims.peer_cluster.is_none());
        // A subresource only 1.33 has under a resource 1.30 serves: retained, the parent local.
        let resize = route(&p, "", "v1", "pods/resize").expect("listed");
        assert!(resize.retained);
        assert!(route(&p, "", "v1", "pods").expect("pods").local);
        // Discovery: the group-version nobody live serves is Stale; what the local serves is not.
        let m = merged(&p);
        assert!(m.contains(&(
            "resource.k8s.io".into(),
            "v1beta2".into(),
            Some("Stale".into())
        )));
        assert!(m
            .iter()
            .any(|(g, v, f)| g == "apps" && v == "v1" && f.as_deref() != Some("Stale")));
        let discovery = p.routing.config.discovery.as_ref().expect("merged");
        assert!(discovery
            .unavailable
            .contains("/apis/resource.k8s.io/v1beta2"));
        assert!(!discovery.unavailable.contains("/apis/apps/v1"));
        assert_eq!(p.retained.len(), 1);
        p.routing.config.validate().expect("valid");

        // The same server live again: served by it, nothing retained, nothing Stale.
        let b_addr = addr("10.0.0.2:6443");
        let live = [ApiserverView {
            id: "apiserver-b",
            address: &b_addr,
            documents: Some(&b_docs),
        }];
        let p = plan_with(&live, &gone);
        let claims = route(&p, "resource.k8s.io", "v1beta2", "resourceclaims").expect("listed");
        assert!(!claims.retained && claims.peer_cluster.is_some());
        assert!(merged(&p)
            .iter()
            .all(|(_, _, f)| f.as_deref() != Some("Stale")));
        assert!(p.retained.is_empty());

        // Without retention the group-version is simply gone (the old behaviour).
        let p = plan_with(&[], &[]);
        assert!(route(&p, "resource.k8s.io", "v1beta2", "resourceclaims").is_none());
        assert!(!merged(&p)
            .iter()
            .any(|(g, v, _)| g == "resource.k8s.io" && v == "v1beta2"));
    }

    /// A departed apiserver whose last address is known: what it alone served goes there (a
    /// readiness-checked cluster of its own), still retained, still Stale.
    #[test]
    fn a_departed_apiserver_with_a_known_address_gets_what_it_retained_sent_there() {
        use envoy_types::pb::envoy::config::cluster::v3::Cluster;
        use prost::Message;
        let b_docs = documents("k8s-1.33");
        let b_addr = addr("10.0.0.2:6443");
        let gone = [RetainedView {
            address: Some(&b_addr),
            id: "apiserver-b",
            documents: &b_docs,
        }];
        let p = plan_with(&[], &gone);
        let name = routing::departed_cluster_name(&["apiserver-b"]);
        let claims = route(&p, "resource.k8s.io", "v1beta2", "resourceclaims").expect("listed");
        assert!(claims.retained && !claims.local && claims.peer_cluster.is_none());
        assert_eq!(claims.departed_cluster.as_deref(), Some(name.as_str()));
        let resize = route(&p, "", "v1", "pods/resize").expect("listed");
        assert_eq!(resize.departed_cluster.as_deref(), Some(name.as_str()));
        assert!(
            route(&p, "", "v1", "pods")
                .expect("pods")
                .departed_cluster
                .is_none(),
            "what a live apiserver serves stays with it"
        );
        assert_eq!(
            p.routing.config.departed_clusters,
            BTreeMap::from([(name.clone(), vec!["apiserver-b".to_string()])])
        );
        // Still retained (reported, counted) and Stale: its discovery is not confirmed.
        assert_eq!(p.retained.len(), 1);
        assert!(merged(&p).contains(&(
            "resource.k8s.io".into(),
            "v1beta2".into(),
            Some("Stale".into())
        )));
        assert!(
            p.routed.is_empty(),
            "a departed apiserver is not a routed peer"
        );
        // Its clusters: its last address, the short connect timeout.
        for auth in skewgate_core::config::UpstreamAuth::ALL {
            let cluster = p
                .snapshot
                .clusters
                .get(&auth.cluster(&name))
                .expect("departed cluster");
            let cluster = Cluster::decode(cluster.resource.value.as_slice()).expect("cluster");
            assert_eq!(
                cluster.connect_timeout,
                Some(crate::envoy::resources::proto_duration(
                    crate::envoy::resources::DEPARTED_CONNECT_TIMEOUT
                ))
            );
            let endpoints = format!("{:?}", cluster.load_assignment);
            assert!(endpoints.contains("10.0.0.2") && endpoints.contains("6443"));
            // Only while its readiness check passes; none ready: no request (no panic mode).
            let check = cluster.health_checks.first().expect("a readiness check");
            let every = Some(crate::envoy::resources::proto_duration(
                crate::envoy::resources::DEPARTED_CHECK_INTERVAL,
            ));
            assert_eq!((check.interval, check.no_traffic_interval), (every, every));
            assert_eq!(
                cluster
                    .common_lb_config
                    .as_ref()
                    .and_then(|c| c.healthy_panic_threshold.as_ref())
                    .map(|p| p.value),
                Some(0.0)
            );
        }
        // The bootstrap's fallback keeps no departed route: its keys answer 503 there.
        let acknowledged = p.snapshot.acknowledged.as_ref().expect("record");
        let fallback = crate::envoy::fallback::last_acknowledged_config(acknowledged);
        assert!(fallback.departed_clusters.is_empty());
        fallback.validate().expect("valid");
    }

    #[test]
    fn a_retained_peer_live_again_gets_what_it_alone_served_before_its_discovery_is_read() {
        let b_docs = documents("k8s-1.33");
        let gone = [RetainedView {
            address: None,
            id: "apiserver-b",
            documents: &b_docs,
        }];
        let b_addr = addr("10.0.0.2:6443");
        let back = [ApiserverView {
            id: "apiserver-b",
            address: &b_addr,
            documents: None,
        }];
        let p = plan_with(&back, &gone);
        let claims = route(&p, "resource.k8s.io", "v1beta2", "resourceclaims").expect("listed");
        assert!(!claims.retained && !claims.local, "{claims:?}");
        let cluster = claims.peer_cluster.as_deref().expect("routed to a peer");
        assert_eq!(p.routing.config.peer_clusters[cluster], ["apiserver-b"]);
        // What the local apiserver serves stays local.
        assert!(
            route(&p, "apps", "v1", "deployments")
                .expect("listed")
                .local
        );
        // Its cluster has its address (from its Lease).
        assert!(p.snapshot.clusters.keys().any(|k| k.starts_with(cluster)));
        // Its discovery is still to be read: pending, routed, not unrouted, nothing departed;
        // merged discovery as for a departed apiserver until then.
        assert_eq!(p.pending, ["apiserver-b"]);
        assert_eq!(p.routed, ["apiserver-b"]);
        assert!(p.unrouted.is_empty() && p.retained.is_empty());
        assert!(merged(&p).contains(&(
            "resource.k8s.io".into(),
            "v1beta2".into(),
            Some("Stale".into())
        )));
        // What it serves now is not known: never a failover target.
        assert_eq!(p.routing.config.failover_all, None);
        assert!(p.routing.config.failover_clusters.is_empty());
        p.routing.config.validate().expect("valid");

        // Its discovery read but unusable: unrouted as any such peer, its keys retained.
        let mut unusable = documents("k8s-1.33");
        unusable.apis.items[0].metadata.name = "not/a-group".to_string();
        assert!(unusable.served().is_err());
        let back = [ApiserverView {
            documents: Some(&unusable),
            ..back[0]
        }];
        let p = plan_with(&back, &gone);
        let claims = route(&p, "resource.k8s.io", "v1beta2", "resourceclaims").expect("listed");
        assert!(
            claims.retained && claims.peer_cluster.is_none(),
            "{claims:?}"
        );
        assert_eq!(p.unrouted.len(), 1);
        assert!(p.routed.is_empty());
    }

    #[test]
    fn a_live_peer_without_discovery_is_pending() {
        let b_addr = addr("10.0.0.2:6443");
        let unknown = [ApiserverView {
            id: "apiserver-b",
            address: &b_addr,
            documents: None,
        }];
        let p = plan_with(&unknown, &[]);
        assert_eq!(p.pending, ["apiserver-b"]);
        assert_eq!(p.routing.config.pending_peers, ["apiserver-b"]);
        // Known again: nothing pending.
        let b_docs = documents("k8s-1.33");
        let known = [ApiserverView {
            documents: Some(&b_docs),
            ..unknown[0]
        }];
        assert!(plan_with(&known, &[])
            .routing
            .config
            .pending_peers
            .is_empty());
    }

    #[test]
    fn peer_only_openapi_entries_go_into_the_config_with_their_cluster() {
        let url = "/openapi/v3/apis/coordination.k8s.io/v1beta1?hash=AB";
        let mut peer_docs = documents("k8s-1.33");
        peer_docs.openapi = Some(openapi::OpenApiRoot {
            paths: [
                ("apis/coordination.k8s.io/v1beta1", url),
                // The local 1.30 apiserver serves apps/v1: its own entry stands.
                ("apis/apps/v1", "/openapi/v3/apis/apps/v1?hash=CD"),
            ]
            .into_iter()
            .map(|(p, u)| (p.to_string(), u.to_string()))
            .collect(),
        });
        let address = addr("127.0.0.2:6443");
        let p = plan_with(
            &[ApiserverView {
                id: "apiserver-b",
                address: &address,
                documents: Some(&peer_docs),
            }],
            &[],
        );
        let config = &p.routing.config;
        assert_eq!(
            config.openapi_v3.keys().collect::<Vec<_>>(),
            ["apis/coordination.k8s.io/v1beta1"]
        );
        let entry = &config.openapi_v3["apis/coordination.k8s.io/v1beta1"];
        assert_eq!(entry.server_relative_url, url);
        assert_eq!(
            config.peer_clusters[&entry.peer_cluster],
            ["apiserver-b".to_string()]
        );
        assert!(p
            .routing
            .clusters
            .iter()
            .any(|c| c.name == entry.peer_cluster));
        // Without the peer's root there is nothing to add.
        peer_docs.openapi = None;
        let p = plan_with(
            &[ApiserverView {
                id: "apiserver-b",
                address: &address,
                documents: Some(&peer_docs),
            }],
            &[],
        );
        assert!(p.routing.config.openapi_v3.is_empty());
    }

    /// A configuration over the filter's limit loses merged discovery first, then the peers'
    /// OpenAPI entries; a routing table over it alone is an error, never a push the filter
    /// would refuse (found with 4,096 OpenAPI entries of long group names: 19.9 MB, NACKed,
    /// routing frozen).
    #[test]
    fn a_configuration_over_the_filters_limit_sheds_what_is_optional() {
        let b_docs = documents("k8s-1.33");
        let b = addr("10.0.0.12:6444");
        let full = plan_with(
            &[ApiserverView {
                id: "apiserver-b",
                address: &b,
                documents: Some(&b_docs),
            }],
            &[],
        );
        assert!(full.routing.config.discovery.is_some());
        let size = |r: &RoutingPlan| r.config.to_json().len();
        let with_openapi = |mut r: RoutingPlan| {
            r.config.openapi_v3.insert(
                "apis/x.example.com/v1".into(),
                OpenApiPeerEntry {
                    server_relative_url: format!(
                        "/openapi/v3/apis/x.example.com/v1?hash={}",
                        "A".repeat(4000)
                    ),
                    peer_cluster: r
                        .config
                        .peer_clusters
                        .keys()
                        .next()
                        .expect("a peer cluster")
                        .clone(),
                    replaces_local: false,
                },
            );
            r
        };
        let routing = with_openapi(full.routing.clone());
        let mut no_discovery = routing.clone();
        no_discovery.config.discovery = None;
        let mut table_only = no_discovery.clone();
        table_only.config.openapi_v3.clear();
        let included = MergedOutcome::Included { bytes: 1 };

        // Fits: unchanged.
        let mut r = routing.clone();
        assert_eq!(
            fit(&mut r, included.clone(), size(&routing)).expect("fits"),
            included
        );
        assert_eq!(r, routing);
        // Without merged discovery it fits.
        let mut r = routing.clone();
        let outcome = fit(&mut r, included.clone(), size(&no_discovery)).expect("fits");
        assert!(matches!(outcome, MergedOutcome::Skipped { .. }));
        assert_eq!(r, no_discovery);
        // Only without the OpenAPI entries too.
        let mut r = routing.clone();
        fit(&mut r, included.clone(), size(&table_only)).expect("fits");
        assert_eq!(r, table_only);
        // The table alone is too large.
        let mut r = routing;
        assert!(matches!(
            fit(&mut r, included, size(&table_only) - 1),
            Err(PlanError::TooLarge { .. })
        ));
    }
}
