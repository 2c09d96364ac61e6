//! The routing table the filter consumes, computed from what the local apiserver and each live
//! peer serve.
//!
//! For every group-version anyone serves, every resource key anyone serves in it is listed:
//! `local: true` when the local apiserver serves it (the filter treats unknown keys as "not
//! served locally", so local keys are always listed), otherwise the Envoy cluster of the peers
//! that serve it. Peers serving the same key share one cluster, named after the sorted set of
//! their ids, so Envoy can fail over between them.

use std::collections::{BTreeMap, BTreeSet};

use sha2::{Digest, Sha256};
use skewgate_core::config::{
    DiscoveryConfig, FilterConfig, GroupVersionRoutes, OpenApiPeerEntry, ResourceRoute,
    SCHEMA_VERSION,
};
use skewgate_core::group_version::GroupVersion;

use crate::discovery::ServedApis;

/// Prefix of every peer cluster name; the rest is a hash of the peer ids.
pub const PEER_CLUSTER_PREFIX: &str = "skewgate-peers-";
/// Prefix of every failover cluster name (the local apiserver, then the peers of the same
/// hash); the rest is the hash of the peer ids, as for their peer cluster.
pub const FAILOVER_CLUSTER_PREFIX: &str = "skewgate-failover-";
/// Prefix of every departed cluster name (departed apiservers at their last address, for the
/// retained keys they served); the rest is the hash of their ids, as for a peer cluster. It
/// starts with [`PEER_CLUSTER_PREFIX`] so that Envoy's routes treat a departed set as a set of
/// peers: a retry on another of them after a `404 page not found` from one that came back
/// without the API.
pub const DEPARTED_CLUSTER_PREFIX: &str = "skewgate-peers-departed-";

/// A live peer apiserver and what it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Identity of the apiserver (its Lease name), as the bootstrap names its endpoint.
    pub id: String,
    pub served: ServedApis,
}

/// One Envoy cluster to create: the peers that serve some set of resources the local apiserver
/// does not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerCluster {
    /// `skewgate-peers-<12 hex>`, see [`peer_cluster_name`].
    pub name: String,
    /// Sorted, distinct.
    pub peer_ids: Vec<String>,
}

/// Where each resource key goes: what [`build`] decides. The filter configuration carrying it
/// is assembled from this table and the rest of the plan in one place, [`RoutingPlan::assemble`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingTable {
    pub local_apiserver: String,
    /// Sorted by (group, version), resources by key.
    pub group_versions: Vec<GroupVersionRoutes>,
    /// Every peer set the table routes to, by cluster name ([`peer_cluster_name`]).
    pub peer_clusters: BTreeMap<String, Vec<String>>,
    /// Every failover set, by cluster name ([`failover_cluster_name`]).
    pub failover_clusters: BTreeMap<String, Vec<String>>,
    /// The failover set of every live peer, if any.
    pub failover_all: Option<String>,
    /// Every set of departed apiservers a retained key goes to, by cluster name
    /// ([`departed_cluster_name`]).
    pub departed_clusters: BTreeMap<String, Vec<String>>,
}

impl RoutingTable {
    /// The cluster of exactly `peer_ids` (sorted, distinct), declared if it is not yet: for
    /// what is routed besides resources (OpenAPI v3 documents).
    pub fn peer_cluster(&mut self, peer_ids: Vec<String>) -> String {
        let name = peer_cluster_name(&peer_ids);
        self.peer_clusters.entry(name.clone()).or_insert(peer_ids);
        name
    }
}

/// What the filter configuration holds besides the routing table.
#[derive(Debug, Clone, Default)]
pub struct ConfigExtras {
    /// Live peers whose discovery is not known.
    pub pending_peers: Vec<String>,
    /// OpenAPI v3 entries of peer-only group-versions, each naming a cluster of the table.
    pub openapi_v3: BTreeMap<String, OpenApiPeerEntry>,
    /// Merged discovery, when it was built.
    pub discovery: Option<DiscoveryConfig>,
}

/// The filter configuration and the Envoy clusters it refers to (sorted by name; exactly the
/// keys of `config.peer_clusters`), and the failover sets (sorted by name; exactly the keys of
/// `config.failover_clusters`): each needs the peer cluster of its peers
/// ([`failover_peer_cluster`]) besides its own aggregate cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingPlan {
    pub config: FilterConfig,
    pub clusters: Vec<PeerCluster>,
    pub failover: Vec<PeerCluster>,
    /// The departed sets (sorted by name; exactly the keys of `config.departed_clusters`).
    pub departed: Vec<PeerCluster>,
}

impl RoutingPlan {
    /// The one place the filter configuration is put together.
    pub fn assemble(table: RoutingTable, extras: ConfigExtras) -> RoutingPlan {
        let as_clusters = |sets: &BTreeMap<String, Vec<String>>| {
            sets.iter()
                .map(|(name, ids)| PeerCluster {
                    name: name.clone(),
                    peer_ids: ids.clone(),
                })
                .collect()
        };
        let clusters = as_clusters(&table.peer_clusters);
        let failover = as_clusters(&table.failover_clusters);
        let departed = as_clusters(&table.departed_clusters);
        RoutingPlan {
            config: FilterConfig {
                schema: SCHEMA_VERSION,
                local_apiserver: table.local_apiserver,
                peer_clusters: table.peer_clusters,
                group_versions: table.group_versions,
                discovery: extras.discovery,
                pending_peers: extras.pending_peers,
                openapi_v3: extras.openapi_v3,
                failover_clusters: table.failover_clusters,
                failover_all: table.failover_all,
                departed_clusters: table.departed_clusters,
                // Only the bootstrap's copy has one (`crate::envoy::fallback`).
                fallback: None,
            },
            clusters,
            failover,
            departed,
        }
    }

    /// The table alone, as the filter configuration carries it (tests).
    pub fn of_table(table: RoutingTable) -> RoutingPlan {
        Self::assemble(table, ConfigExtras::default())
    }
}

/// The cluster name for a set of peers: `skewgate-peers-` and the first 12 hex characters of the
/// SHA-256 of the sorted, distinct ids joined with `"\n"`. Stable across runs and independent of
/// the order the ids are given in.
pub fn peer_cluster_name<S: AsRef<str>>(peer_ids: &[S]) -> String {
    set_name(PEER_CLUSTER_PREFIX, peer_ids)
}

/// The failover cluster name for a set of peers: [`FAILOVER_CLUSTER_PREFIX`] and the same hash
/// as [`peer_cluster_name`].
pub fn failover_cluster_name<S: AsRef<str>>(peer_ids: &[S]) -> String {
    set_name(FAILOVER_CLUSTER_PREFIX, peer_ids)
}

/// The departed cluster name for a set of departed apiservers: [`DEPARTED_CLUSTER_PREFIX`] and
/// the same hash as [`peer_cluster_name`].
pub fn departed_cluster_name<S: AsRef<str>>(departed_ids: &[S]) -> String {
    set_name(DEPARTED_CLUSTER_PREFIX, departed_ids)
}

/// The peer cluster a failover cluster falls back to (the same set of peers).
pub fn failover_peer_cluster(failover: &PeerCluster) -> PeerCluster {
    PeerCluster {
        name: peer_cluster_name(&failover.peer_ids),
        peer_ids: failover.peer_ids.clone(),
    }
}

fn set_name<S: AsRef<str>>(prefix: &str, peer_ids: &[S]) -> String {
    let ids: BTreeSet<&str> = peer_ids.iter().map(AsRef::as_ref).collect();
    let joined = ids.into_iter().collect::<Vec<_>>().join("\n");
    let digest = Sha256::digest(joined.as_bytes());
    let mut name = String::with_capacity(prefix.len() + 12);
    name.push_str(prefix);
    for byte in digest.iter().take(6) {
        name.push_str(&format!("{byte:02x}"));
    }
    name
}

/// The cluster of exactly `ids`, named by `name` and declared in `sets` if it is not yet.
fn declare(
    sets: &mut BTreeMap<String, Vec<String>>,
    name: fn(&[String]) -> String,
    ids: &BTreeSet<&str>,
) -> String {
    let ids: Vec<String> = ids.iter().map(|id| (*id).to_owned()).collect();
    let name = name(&ids);
    sets.entry(name.clone()).or_insert(ids);
    name
}

/// Whether the local apiserver's discovery is what it serves now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LocalFreshness {
    /// Its last discovery fetch succeeded.
    #[default]
    Current,
    /// Its last discovery fetch failed: it is down or restarting, and may come back on another
    /// version, answering `404 page not found` for what it served until it is read again. A
    /// resource a live peer serves too then goes to the peers (their own cluster, not the
    /// failover cluster, which would try the local apiserver first); only what no live peer
    /// serves stays local first. While it is down, failover sends those requests to the same
    /// peers anyway; in the second or so between its return and the next fetch, this keeps
    /// them off an apiserver whose answers are not known.
    Unconfirmed,
}

/// What API retention adds to the live apiservers' routes ([`crate::retained`]).
#[derive(Debug, Clone, Copy)]
pub struct RetainedRoutes<'a> {
    /// Live peers whose discovery is not read yet, with what they alone served before: routed
    /// like peers, but never part of a failover set (what they serve now is not known).
    pub returning: &'a [Peer],
    /// Keys retained apiservers served; those no live apiserver serves are emitted `retained`
    /// (never the local 404).
    pub keys: &'a ServedApis,
    /// Departed apiservers with a known last address, with the retained keys they served: such
    /// a key goes to their cluster ([`DEPARTED_CLUSTER_PREFIX`]), so one of them that is back
    /// and ready serves it; while none is, the answer is the retained 503.
    pub departed: &'a [Peer],
}

static NOTHING_SERVED: ServedApis = ServedApis::new();

impl RetainedRoutes<'static> {
    /// Nothing retained (the static mode, tests).
    pub const NONE: RetainedRoutes<'static> = RetainedRoutes {
        returning: &[],
        keys: &NOTHING_SERVED,
        departed: &[],
    };
}

/// Who serves one resource key.
#[derive(Default)]
struct Servers<'a> {
    local: bool,
    peers: BTreeSet<&'a str>,
    /// Only a retained apiserver (gone, within the retention) served it.
    retained: bool,
    /// With `retained`: the departed apiservers with a known address that served it.
    departed: BTreeSet<&'a str>,
}

/// Compute the routing table.
///
/// - `local`, `local_id`: the apiserver this Envoy fronts.
/// - `peers`: the live peers only. A peer whose id equals `local_id` is ignored (we never route
///   to ourselves as a peer); two entries with the same id are merged.
/// - `retained`: what retention adds ([`RetainedRoutes`]).
/// - `shared_storage`: (group, version) pairs served from shared storage (CRDs, APIServices):
///   emitted with `shared_storage: true` and no resources, so the filter always keeps them
///   local. Pairs nobody serves are not emitted (the filter keeps unknown group-versions local
///   anyway).
/// - `local_freshness`: see [`LocalFreshness`].
///
/// Output is deterministic: group-versions sorted by (group, version), resources by key,
/// clusters by name.
pub fn build(
    local: &ServedApis,
    local_id: &str,
    peers: &[Peer],
    retained: RetainedRoutes<'_>,
    shared_storage: &BTreeSet<GroupVersion>,
    local_freshness: LocalFreshness,
) -> RoutingTable {
    let RetainedRoutes {
        returning,
        keys: retained,
        departed,
    } = retained;
    // (group, version) -> key -> who serves it.
    let mut table: BTreeMap<(&str, &str), BTreeMap<&str, Servers<'_>>> = BTreeMap::new();
    for (group, version, keys) in local.iter() {
        let gv = table.entry((group, version)).or_default();
        for key in keys {
            gv.entry(key.as_str()).or_default().local = true;
        }
    }
    for peer in peers.iter().chain(returning).filter(|p| p.id != local_id) {
        for (group, version, keys) in peer.served.iter() {
            let gv = table.entry((group, version)).or_default();
            for key in keys {
                gv.entry(key.as_str())
                    .or_default()
                    .peers
                    .insert(peer.id.as_str());
            }
        }
    }

    for (group, version, keys) in retained.iter() {
        let gv = table.entry((group, version)).or_default();
        for key in keys {
            let servers = gv.entry(key.as_str()).or_default();
            servers.retained = !servers.local && servers.peers.is_empty();
        }
    }
    for gone in departed.iter().filter(|p| p.id != local_id) {
        for (group, version, keys) in gone.served.iter() {
            let Some(gv) = table.get_mut(&(group, version)) else {
                continue;
            };
            for key in keys {
                if let Some(servers) = gv.get_mut(key.as_str()).filter(|s| s.retained) {
                    servers.departed.insert(gone.id.as_str());
                }
            }
        }
    }

    let mut peer_clusters: BTreeMap<String, Vec<String>> = BTreeMap::new();
    // Failover: while the local apiserver cannot be reached, a key it serves goes to the live
    // peers that serve it too; what every apiserver serves (non-resource paths, discovery,
    // shared storage) to every live peer.
    let mut failover_clusters: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut departed_clusters: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let live: BTreeSet<&str> = peers
        .iter()
        .filter(|p| p.id != local_id)
        .map(|p| p.id.as_str())
        .collect();
    let failover_all =
        (!live.is_empty()).then(|| declare(&mut failover_clusters, failover_cluster_name, &live));
    let mut group_versions = Vec::with_capacity(table.len());
    for ((group, version), keys) in table {
        if shared_storage.contains(&GroupVersion::new(group, version)) {
            group_versions.push(GroupVersionRoutes {
                group: group.to_owned(),
                version: version.to_owned(),
                shared_storage: true,
                resources: Vec::new(),
            });
            continue;
        }
        let resources = keys
            .into_iter()
            .map(|(key, mut servers)| {
                if local_freshness == LocalFreshness::Unconfirmed && !servers.peers.is_empty() {
                    servers.local = false;
                }
                let peer_cluster = (!servers.local && !servers.peers.is_empty())
                    .then(|| declare(&mut peer_clusters, peer_cluster_name, &servers.peers));
                let failover_cluster = (servers.local && !servers.peers.is_empty()).then(|| {
                    declare(
                        &mut failover_clusters,
                        failover_cluster_name,
                        &servers.peers,
                    )
                });
                let departed_cluster =
                    (servers.retained && !servers.departed.is_empty()).then(|| {
                        declare(
                            &mut departed_clusters,
                            departed_cluster_name,
                            &servers.departed,
                        )
                    });
                ResourceRoute {
                    retained: servers.retained,
                    departed_cluster,
                    failover_cluster,
                    resource: key.to_owned(),
                    local: servers.local,
                    peer_cluster,
                }
            })
            .collect();
        group_versions.push(GroupVersionRoutes {
            group: group.to_owned(),
            version: version.to_owned(),
            shared_storage: false,
            resources,
        });
    }

    RoutingTable {
        local_apiserver: local_id.to_owned(),
        group_versions,
        peer_clusters,
        failover_clusters,
        failover_all,
        departed_clusters,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`super::build`], as the filter configuration carries it.
    fn build(
        local: &ServedApis,
        local_id: &str,
        peers: &[Peer],
        retained: &ServedApis,
        shared_storage: &BTreeSet<GroupVersion>,
        local_freshness: LocalFreshness,
    ) -> RoutingPlan {
        RoutingPlan::of_table(super::build(
            local,
            local_id,
            peers,
            RetainedRoutes {
                keys: retained,
                ..RetainedRoutes::NONE
            },
            shared_storage,
            local_freshness,
        ))
    }

    use crate::test_fixtures::{K130, K133};

    fn load(dir: &str) -> ServedApis {
        ServedApis::from_dir(dir).expect("fixture loads")
    }

    fn peer(id: &str, served: ServedApis) -> Peer {
        Peer {
            id: id.to_owned(),
            served,
        }
    }

    fn route<'a>(plan: &'a RoutingPlan, gvr: &str) -> Option<&'a ResourceRoute> {
        let (group, rest) = gvr.split_once('/')?;
        let (version, key) = rest.split_once('/')?;
        plan.config
            .group_versions
            .iter()
            .find(|gv| gv.group == group && gv.version == version)?
            .resources
            .iter()
            .find(|r| r.resource == key)
    }

    fn synthetic(entries: &[(&str, &str, &str)]) -> ServedApis {
        let mut served = ServedApis::new();
        for (g, v, k) in entries {
            served.add_resource(g, v, k).expect("valid");
        }
        served
    }

    /// Where a route goes, in a form easy to tabulate.
    #[derive(Debug, PartialEq, Eq)]
    enum To {
        Local,
        Peers(Vec<String>),
        Missing,
    }

    fn peers_of(ids: &[&str]) -> To {
        To::Peers(ids.iter().map(|id| (*id).to_owned()).collect())
    }

    fn to(plan: &RoutingPlan, gvr: &str) -> To {
        match route(plan, gvr) {
            None => To::Missing,
            Some(r) if r.local => {
                assert_eq!(r.peer_cluster, None, "{gvr}: local routes name no cluster");
                To::Local
            }
            Some(r) => {
                let name = r
                    .peer_cluster
                    .as_ref()
                    .expect("non-local routes name a cluster");
                To::Peers(
                    plan.config
                        .peer_clusters
                        .get(name)
                        .expect("declared")
                        .clone(),
                )
            }
        }
    }

    fn check_invariants(plan: &RoutingPlan) {
        plan.config.validate().expect("plan validates");
        let json = plan.config.to_json();
        assert_eq!(
            FilterConfig::from_json(json.as_bytes()).as_ref(),
            Ok(&plan.config),
            "round-trips through the filter's parser"
        );
        let gvs: Vec<_> = plan
            .config
            .group_versions
            .iter()
            .map(|gv| (gv.group.as_str(), gv.version.as_str()))
            .collect();
        assert!(gvs.windows(2).all(|w| w[0] < w[1]), "GVs sorted");
        for gv in &plan.config.group_versions {
            assert!(
                gv.resources
                    .windows(2)
                    .all(|w| w[0].resource < w[1].resource),
                "resources sorted"
            );
        }
        let names: Vec<_> = plan.clusters.iter().map(|c| c.name.as_str()).collect();
        assert!(names.windows(2).all(|w| w[0] < w[1]), "clusters sorted");
        let declared: BTreeMap<String, Vec<String>> = plan
            .clusters
            .iter()
            .map(|c| (c.name.clone(), c.peer_ids.clone()))
            .collect();
        assert_eq!(declared, plan.config.peer_clusters);
        let referenced: BTreeSet<&str> = plan
            .config
            .group_versions
            .iter()
            .flat_map(|gv| gv.resources.iter())
            .filter_map(|r| r.peer_cluster.as_deref())
            .collect();
        assert_eq!(
            referenced,
            declared.keys().map(String::as_str).collect::<BTreeSet<_>>(),
            "only referenced clusters are emitted"
        );
        for c in &plan.clusters {
            assert!(c.peer_ids.windows(2).all(|w| w[0] < w[1]), "ids sorted");
            assert_eq!(c.name, peer_cluster_name(&c.peer_ids));
        }
    }

    /// The local apiserver's last fetch failed: what the peer serves too goes to the peer (it
    /// may come back on 1.33 and answer 404 for 1.30's resources before it is read again);
    /// only what nobody else serves stays local first.
    #[test]
    fn an_unconfirmed_local_apiserver_keeps_only_what_no_peer_serves() {
        let build_with = |freshness| {
            build(
                &load(K130),
                "local-130",
                &[peer("peer-133", load(K133))],
                &ServedApis::new(),
                &BTreeSet::new(),
                freshness,
            )
        };
        let plan = build_with(LocalFreshness::Unconfirmed);
        check_invariants(&plan);
        let p133 = peers_of(&["peer-133"]);
        for (gvr, want) in [
            ("apps/v1/deployments", &p133),
            ("apps/v1/deployments/scale", &p133),
            ("/v1/pods", &p133),
            ("/v1/pods/exec", &p133),
            ("resource.k8s.io/v1beta2/resourceclaims", &p133),
            ("resource.k8s.io/v1alpha2/resourceclaims", &To::Local),
            ("networking.k8s.io/v1alpha1/servicecidrs", &To::Local),
            ("apps/v1/nonexistent", &To::Missing),
        ] {
            assert_eq!(&to(&plan, gvr), want, "{gvr}");
        }
        // What stays local has no peer to fail over to; what moved needs no failover.
        assert!(plan
            .config
            .group_versions
            .iter()
            .flat_map(|gv| &gv.resources)
            .all(|r| r.failover_cluster.is_none()));
        // Once read again, as before.
        let current = build_with(LocalFreshness::Current);
        assert_eq!(to(&current, "apps/v1/deployments"), To::Local);
        assert_ne!(plan.config, current.config);
    }

    #[test]
    fn local_130_with_peer_133() {
        let plan = build(
            &load(K130),
            "local-130",
            &[peer("peer-133", load(K133))],
            &ServedApis::new(),
            &BTreeSet::new(),
            LocalFreshness::Current,
        );
        check_invariants(&plan);
        let p133 = peers_of(&["peer-133"]);
        let cases = [
            ("resource.k8s.io/v1beta2/resourceclaims", &p133),
            ("resource.k8s.io/v1beta2/resourceclaims/status", &p133),
            ("apps/v1/deployments", &To::Local),
            ("apps/v1/deployments/scale", &To::Local),
            ("resource.k8s.io/v1alpha2/resourceclaims", &To::Local),
            (
                "admissionregistration.k8s.io/v1alpha1/mutatingadmissionpolicies",
                &p133,
            ),
            (
                "admissionregistration.k8s.io/v1alpha1/validatingadmissionpolicies",
                &To::Local,
            ),
            ("networking.k8s.io/v1/servicecidrs", &p133),
            ("networking.k8s.io/v1alpha1/servicecidrs", &To::Local),
            ("/v1/pods/resize", &p133),
            ("/v1/pods", &To::Local),
            ("/v1/pods/exec", &To::Local),
            ("apps/v1/nonexistent", &To::Missing),
        ];
        for (gvr, want) in cases {
            assert_eq!(&to(&plan, gvr), want, "{gvr}");
        }
        assert_eq!(plan.clusters.len(), 1);
        assert_eq!(plan.clusters[0].peer_ids, vec!["peer-133".to_string()]);
        assert_eq!(plan.config.local_apiserver, "local-130");
        // Failover: what both serve goes to the peer while the local apiserver is down; what
        // only the local one serves (removed in 1.33) has nowhere else to go.
        let failover = failover_cluster_name(&["peer-133"]);
        let failover_of = |gvr: &str| route(&plan, gvr).and_then(|r| r.failover_cluster.clone());
        assert_eq!(failover_of("apps/v1/deployments"), Some(failover.clone()));
        assert_eq!(failover_of("/v1/pods/exec"), Some(failover.clone()));
        assert_eq!(failover_of("resource.k8s.io/v1alpha2/resourceclaims"), None);
        assert_eq!(
            failover_of("networking.k8s.io/v1/servicecidrs"),
            None,
            "peer-only"
        );
        assert_eq!(plan.config.failover_all, Some(failover.clone()));
        assert_eq!(
            plan.failover,
            [PeerCluster {
                name: failover.clone(),
                peer_ids: vec!["peer-133".to_string()]
            }]
        );
        assert_eq!(
            failover_peer_cluster(&plan.failover[0]).name,
            peer_cluster_name(&["peer-133"])
        );
        assert_eq!(plan.config.schema, SCHEMA_VERSION);

        // Every key served by either side is listed, local ones with local: true.
        let local = load(K130);
        let peer133 = load(K133);
        let listed: usize = plan
            .config
            .group_versions
            .iter()
            .map(|gv| gv.resources.len())
            .sum();
        let mut union = local.clone();
        union.merge(peer133);
        let union_keys: usize = union.iter().map(|(_, _, keys)| keys.len()).sum();
        assert_eq!(listed, union_keys);
        for (g, v, keys) in local.iter() {
            for key in keys {
                let gvr = format!("{g}/{v}/{key}");
                assert_eq!(to(&plan, &gvr), To::Local, "{gvr}");
            }
        }
    }

    #[test]
    fn local_133_with_peer_130_is_the_mirror() {
        let plan = build(
            &load(K133),
            "local-133",
            &[peer("a", load(K130))],
            &ServedApis::new(),
            &BTreeSet::new(),
            LocalFreshness::Current,
        );
        check_invariants(&plan);
        let a = peers_of(&["a"]);
        let cases = [
            ("resource.k8s.io/v1alpha2/resourceclaims", &a),
            ("resource.k8s.io/v1beta2/resourceclaims", &To::Local),
            ("flowcontrol.apiserver.k8s.io/v1beta3/flowschemas", &a),
            ("/v1/pods/resize", &To::Local),
        ];
        for (gvr, want) in cases {
            assert_eq!(&to(&plan, gvr), want, "{gvr}");
        }
    }

    #[test]
    fn peers_serving_the_same_keys_share_a_stable_cluster() {
        let local = synthetic(&[("apps", "v1", "deployments")]);
        let peers = [
            peer(
                "b",
                synthetic(&[("x.io", "v1", "widgets"), ("y.io", "v1", "gadgets")]),
            ),
            peer(
                "a",
                synthetic(&[("x.io", "v1", "widgets"), ("z.io", "v1", "things")]),
            ),
            peer("c", synthetic(&[("y.io", "v1", "gadgets")])),
        ];
        let plan = build(
            &local,
            "local",
            &peers,
            &ServedApis::new(),
            &BTreeSet::new(),
            LocalFreshness::Current,
        );
        check_invariants(&plan);
        let cases = [
            ("apps/v1/deployments", To::Local),
            ("x.io/v1/widgets", peers_of(&["a", "b"])),
            ("y.io/v1/gadgets", peers_of(&["b", "c"])),
            ("z.io/v1/things", peers_of(&["a"])),
        ];
        for (gvr, want) in cases {
            assert_eq!(to(&plan, gvr), want, "{gvr}");
        }
        assert_eq!(plan.clusters.len(), 3);

        // Stable: independent of peer order, and pinned for a known set.
        let mut reversed = peers.to_vec();
        reversed.reverse();
        assert_eq!(
            build(
                &local,
                "local",
                &reversed,
                &ServedApis::new(),
                &BTreeSet::new(),
                LocalFreshness::Current
            ),
            plan
        );
        assert_eq!(
            peer_cluster_name(&["b", "a"]),
            peer_cluster_name(&["a", "b"])
        );
        // sha256("a") = ca978112ca1b..., sha256("a\nb") = 7e18f737311b... (`sha256sum`).
        assert_eq!(peer_cluster_name(&["a"]), "skewgate-peers-ca978112ca1b");
        let ab = peer_cluster_name(&["a", "b"]);
        assert_eq!(ab, "skewgate-peers-7e18f737311b");
        assert_eq!(peer_cluster_name(&["b", "a", "b"]), ab);
        assert_eq!(
            route(&plan, "x.io/v1/widgets").and_then(|r| r.peer_cluster.clone()),
            Some(ab)
        );
    }

    #[test]
    fn shared_storage_group_versions_stay_local() {
        let local = synthetic(&[("apps", "v1", "deployments"), ("crd.io", "v1", "widgets")]);
        let peers = [peer(
            "a",
            synthetic(&[("crd.io", "v1", "widgets"), ("crd.io", "v2", "widgets")]),
        )];
        let shared: BTreeSet<GroupVersion> = [
            GroupVersion::new("crd.io", "v1"),
            GroupVersion::new("crd.io", "v2"),
            GroupVersion::new("gone.io", "v1"),
        ]
        .into();
        let plan = build(
            &local,
            "local",
            &peers,
            &ServedApis::new(),
            &shared,
            LocalFreshness::Current,
        );
        check_invariants(&plan);
        let gvs: Vec<_> = plan
            .config
            .group_versions
            .iter()
            .map(|gv| {
                (
                    gv.group.as_str(),
                    gv.version.as_str(),
                    gv.shared_storage,
                    gv.resources.len(),
                )
            })
            .collect();
        assert_eq!(
            gvs,
            vec![
                ("apps", "v1", false, 1),
                ("crd.io", "v1", true, 0),
                ("crd.io", "v2", true, 0)
            ]
        );
        assert!(plan.clusters.is_empty(), "no route references a cluster");
        assert!(plan.config.peer_clusters.is_empty());
    }

    #[test]
    fn edge_cases() {
        let local = synthetic(&[("", "v1", "pods")]);
        // No peers: everything local, no clusters.
        let plan = build(
            &local,
            "local",
            &[],
            &ServedApis::new(),
            &BTreeSet::new(),
            LocalFreshness::Current,
        );
        check_invariants(&plan);
        assert!(plan.clusters.is_empty());
        assert_eq!(to(&plan, "/v1/pods"), To::Local);

        // The local apiserver listed among the peers is ignored; duplicate peers merge.
        let peers = [
            peer("local", synthetic(&[("", "v1", "pods/resize")])),
            peer("a", synthetic(&[("", "v1", "pods/resize")])),
            peer("a", synthetic(&[("", "v1", "pods/ephemeralcontainers")])),
        ];
        let plan = build(
            &local,
            "local",
            &peers,
            &ServedApis::new(),
            &BTreeSet::new(),
            LocalFreshness::Current,
        );
        check_invariants(&plan);
        assert_eq!(to(&plan, "/v1/pods/resize"), peers_of(&["a"]));
        assert_eq!(to(&plan, "/v1/pods/ephemeralcontainers"), peers_of(&["a"]));
        assert_eq!(plan.clusters.len(), 1);

        // A group-version served with no resources (a stale aggregated API) is still listed.
        let mut empty_gv = ServedApis::new();
        empty_gv
            .add_group_version("metrics.k8s.io", "v1beta1")
            .expect("valid");
        let plan = build(
            &empty_gv,
            "local",
            &[],
            &ServedApis::new(),
            &BTreeSet::new(),
            LocalFreshness::Current,
        );
        check_invariants(&plan);
        assert_eq!(plan.config.group_versions.len(), 1);
    }
}
