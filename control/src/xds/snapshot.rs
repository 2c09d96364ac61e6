//! One Envoy's complete configuration as xDS resources with content-hash versions: built once
//! from a routing plan, then served by the delta ADS server or written to files.
//!
//! Each resource carries a version that is the SHA-256 of its encoded `Any`: the same plan
//! always gives the same versions, across restarts of the control plane, which is what lets a
//! reconnecting Envoy (reporting the versions it holds) be resynced without a push.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
use envoy_types::pb::google::protobuf::Any;
use envoy_types::util::pack_any;
use prost::Message;
use sha2::{Digest, Sha256};
use skewgate_core::config::{FilterDialect, FilterFeature, Unreadable};

use super::{CLUSTER_TYPE_URL, EXTENSION_CONFIG_TYPE_URL};
use crate::envoy::fallback::AcknowledgedConfig;
use crate::envoy::resources::{
    clusters, departed_cluster_addresses, failover_bases, filter_extension_config,
    peer_cluster_addresses, ClusterInputs, FilterCode,
};
use crate::envoy::{Address, EnvoyError};
use crate::routing::RoutingPlan;

/// What a snapshot needs besides the routing plan.
#[derive(Debug, Clone)]
pub struct SnapshotInputs<'a> {
    /// The filter's code on the Envoy host (Envoy reads it; it is not sent over xDS).
    pub filter_code: &'a FilterCode,
    /// The apiserver this Envoy fronts.
    pub local: &'a Address,
    /// Address of every peer apiserver by id.
    pub peers: &'a [(String, Address)],
    /// TLS to the apiservers: the directory of the SDS files of the peer CA and the
    /// proxy-client certificate ([`crate::envoy::secrets`]). `None`: plaintext, for tests and
    /// demos on loopback only.
    pub upstream_sds: Option<&'a Path>,
}

/// One resource with its content-hash version.
#[derive(Debug, Clone, PartialEq)]
pub struct Versioned {
    /// Lowercase hex SHA-256 of the encoded `Any`.
    pub version: String,
    pub resource: Any,
}

impl Versioned {
    pub fn new(resource: Any) -> Self {
        Versioned {
            version: content_hash(&resource.encode_to_vec()),
            resource,
        }
    }
}

/// Everything one Envoy should hold, by type: a complete, consistent view (the clusters every
/// filter configuration in it names are in it). Two snapshots are equal when their resources
/// are: the fallback record is derived from them.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// CDS: cluster name → cluster.
    pub clusters: BTreeMap<String, Versioned>,
    /// ECDS: extension config name → `TypedExtensionConfig`.
    pub extension_configs: BTreeMap<String, Versioned>,
    /// This snapshot as Envoy's bootstrap fallback needs it, kept in `run --state-dir` once
    /// Envoy has acknowledged all of it ([`crate::envoy::fallback`]). `None` for snapshots
    /// not made from a routing plan. Its `filter_config` is the one the filter configuration
    /// was rendered from, and with [`Snapshot::filter_code`] renders it again for a filter of
    /// another dialect ([`Snapshot::for_filter`]).
    pub acknowledged: Option<Arc<AcknowledgedConfig>>,
    /// The filter's code as the filter configuration names it; `None` for snapshots not made
    /// from a routing plan.
    pub filter_code: Option<FilterCode>,
    /// Set on a stream's view of a snapshot whose filter configuration that stream's filter
    /// cannot read ([`Snapshot::for_filter`]): the filter configuration is neither sent nor
    /// removed (Envoy keeps what it holds), and the clusters it may name stay.
    pub filter_withheld: bool,
}

impl PartialEq for Snapshot {
    fn eq(&self, other: &Self) -> bool {
        self.clusters == other.clusters
            && self.extension_configs == other.extension_configs
            && self.filter_withheld == other.filter_withheld
    }
}

/// How a snapshot's filter configuration reaches a filter of some dialect
/// ([`Snapshot::for_filter`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FilterDelivery {
    /// As rendered: the filter reads all of it.
    AsRendered,
    /// Rendered again without these optional features, which the filter does not read.
    Without(BTreeSet<FilterFeature>),
    /// Not sent: the filter reads none of the schemas it can be written in.
    Withheld(Unreadable),
}

impl Snapshot {
    /// A snapshot of exactly these resources.
    pub fn new(
        clusters: impl IntoIterator<Item = Cluster>,
        extension_configs: impl IntoIterator<Item = TypedExtensionConfig>,
    ) -> Self {
        Snapshot {
            clusters: clusters
                .into_iter()
                .map(|c| (c.name.clone(), Versioned::new(pack_any(c))))
                .collect(),
            extension_configs: extension_configs
                .into_iter()
                .map(|e| (e.name.clone(), Versioned::new(pack_any(e))))
                .collect(),
            acknowledged: None,
            filter_code: None,
            filter_withheld: false,
        }
    }

    /// A snapshot of resources that already carry their versions.
    pub fn from_versioned(
        clusters: impl IntoIterator<Item = Versioned>,
        extension_configs: impl IntoIterator<Item = Versioned>,
    ) -> Self {
        let by_name = |v: Versioned| -> Option<(String, Versioned)> {
            let name = match v.resource.type_url.as_str() {
                CLUSTER_TYPE_URL => Cluster::decode(v.resource.value.as_slice()).ok()?.name,
                _ => {
                    TypedExtensionConfig::decode(v.resource.value.as_slice())
                        .ok()?
                        .name
                }
            };
            Some((name, v))
        };
        Snapshot {
            clusters: clusters.into_iter().filter_map(by_name).collect(),
            extension_configs: extension_configs.into_iter().filter_map(by_name).collect(),
            ..Default::default()
        }
    }

    /// The resources for a routing plan: the three variants of `skewgate-local` and of each
    /// peer set, and the filter configuration (`plan.config` as JSON).
    pub fn from_plan(plan: &RoutingPlan, inputs: &SnapshotInputs<'_>) -> Result<Self, EnvoyError> {
        // Resolved once: the clusters and the fallback record name the same addresses.
        let peer_clusters = peer_cluster_addresses(plan, inputs.peers)?;
        let cluster_inputs = ClusterInputs {
            local: inputs.local,
            upstream_sds: inputs.upstream_sds,
        };
        let snapshot = Self::new(
            clusters(
                &peer_clusters,
                &departed_cluster_addresses(plan, inputs.peers)?,
                &failover_bases(plan),
                &cluster_inputs,
            )?,
            [filter_extension_config(
                inputs.filter_code,
                &plan.config.to_json(),
            )],
        );
        let acknowledged = AcknowledgedConfig {
            filter_config: plan.config.clone(),
            peer_clusters: peer_clusters
                .into_iter()
                .map(|(name, addresses)| (name, addresses.iter().map(Address::to_string).collect()))
                .collect(),
        };
        Ok(Snapshot {
            acknowledged: Some(Arc::new(acknowledged)),
            filter_code: Some(inputs.filter_code.clone()),
            ..snapshot
        })
    }

    /// This snapshot as the Envoy whose filter reads `dialect` gets it (docs/ARCHITECTURE.md,
    /// "skewgate's own upgrades"): the same snapshot when the filter reads its filter
    /// configuration as it is (the usual case, no copy); with the filter configuration
    /// rendered again without what the filter does not read
    /// ([`FilterConfig::for_dialect`](skewgate_core::config::FilterConfig::for_dialect)); or,
    /// when the filter cannot read it at all, with the filter configuration withheld. The
    /// fallback record of a view is what that filter would hold. A snapshot not made from a
    /// routing plan is the same for every dialect.
    pub fn for_filter(
        self: &Arc<Self>,
        dialect: &FilterDialect,
    ) -> (Arc<Snapshot>, FilterDelivery) {
        let (Some(acknowledged), Some(code)) = (&self.acknowledged, &self.filter_code) else {
            return (self.clone(), FilterDelivery::AsRendered);
        };
        let config = match acknowledged.filter_config.for_dialect(dialect) {
            Ok(Cow::Borrowed(_)) => return (self.clone(), FilterDelivery::AsRendered),
            Ok(Cow::Owned(config)) => config,
            Err(unreadable) => {
                let withheld = Snapshot {
                    clusters: self.clusters.clone(),
                    extension_configs: BTreeMap::new(),
                    acknowledged: None,
                    filter_code: None,
                    filter_withheld: true,
                };
                return (Arc::new(withheld), FilterDelivery::Withheld(unreadable));
            }
        };
        let dropped = acknowledged
            .filter_config
            .uses()
            .difference(&config.uses())
            .copied()
            .collect();
        let rendered = Self::new([], [filter_extension_config(code, &config.to_json())]);
        let view = Snapshot {
            clusters: self.clusters.clone(),
            extension_configs: rendered.extension_configs,
            acknowledged: Some(Arc::new(AcknowledgedConfig {
                filter_config: config,
                peer_clusters: acknowledged.peer_clusters.clone(),
            })),
            filter_code: self.filter_code.clone(),
            filter_withheld: false,
        };
        (Arc::new(view), FilterDelivery::Without(dropped))
    }

    /// The resources of one type URL; `None` for a type this control plane does not serve.
    pub fn resources(&self, type_url: &str) -> Option<&BTreeMap<String, Versioned>> {
        match type_url {
            CLUSTER_TYPE_URL => Some(&self.clusters),
            EXTENSION_CONFIG_TYPE_URL => Some(&self.extension_configs),
            _ => None,
        }
    }

    /// A short digest of every (type, name, version): for logs and `system_version_info`.
    pub fn version(&self) -> String {
        let mut hasher = Sha256::new();
        for (type_url, resources) in [
            (CLUSTER_TYPE_URL, &self.clusters),
            (EXTENSION_CONFIG_TYPE_URL, &self.extension_configs),
        ] {
            for (name, v) in resources {
                hasher.update(type_url.as_bytes());
                hasher.update([0]);
                hasher.update(name.as_bytes());
                hasher.update([0]);
                hasher.update(v.version.as_bytes());
                hasher.update([0]);
            }
        }
        hex(&hasher.finalize()[..8])
    }
}

/// Lowercase hex SHA-256.
pub fn content_hash(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

#[cfg(test)]
mod tests {

    use skewgate_core::config::{UpstreamAuth, LOCAL_CLUSTER, SCHEMA_VERSION};

    use super::*;
    use crate::envoy::FILTER_NAME;
    use crate::routing;
    use crate::test_fixtures::rolling_upgrade;
    use crate::test_fixtures::world::{addr, plan, World};

    fn versions(m: &BTreeMap<String, Versioned>) -> BTreeMap<String, String> {
        m.iter()
            .map(|(k, v)| (k.clone(), v.version.clone()))
            .collect()
    }

    #[test]
    fn versions_are_stable_content_hashes() {
        let world = World::new();
        let p = plan(&[("x.io", "v1", "widgets")], &[("y.io", "v1", "gadgets")]);
        let one = world.snapshot(&p);
        let two = world.snapshot(&p.clone());
        assert_eq!(one, two);
        assert_eq!(one.version(), two.version());
        // skewgate-local, one cluster per peer set ({b}, {c}, and {b, c} for the failover of
        // what every apiserver serves) and the failover cluster of {b, c}, each in three
        // variants; one filter configuration.
        assert_eq!(one.clusters.len(), 15);
        for auth in UpstreamAuth::ALL {
            assert!(one.clusters.contains_key(&auth.cluster(LOCAL_CLUSTER)));
        }
        assert_eq!(
            one.extension_configs.keys().collect::<Vec<_>>(),
            vec![FILTER_NAME]
        );
        for v in one.clusters.values().chain(one.extension_configs.values()) {
            assert_eq!(v.version, content_hash(&v.resource.encode_to_vec()));
            assert_eq!(v.version.len(), 64);
            assert!(v.version.bytes().all(|b| b.is_ascii_hexdigit()));
        }
        // Pinned: a change here changes what every running Envoy holds (harmless, but it
        // should be deliberate).
        let local = &one.clusters[&UpstreamAuth::Token.cluster(LOCAL_CLUSTER)];
        assert_eq!(local.resource.type_url, CLUSTER_TYPE_URL);
        assert_eq!(
            one.extension_configs[FILTER_NAME].resource.type_url,
            EXTENSION_CONFIG_TYPE_URL
        );
    }

    #[test]
    fn a_changed_plan_changes_exactly_the_affected_versions() {
        let world = World::new();
        let before = world.snapshot(&plan(
            &[("x.io", "v1", "widgets")],
            &[("y.io", "v1", "gadgets")],
        ));

        // c serves one more resource: the filter configuration changes, no cluster does.
        let more = world.snapshot(&plan(
            &[("x.io", "v1", "widgets")],
            &[("y.io", "v1", "gadgets"), ("y.io", "v1", "doohickeys")],
        ));
        assert_eq!(versions(&more.clusters), versions(&before.clusters));
        assert_ne!(
            more.extension_configs[FILTER_NAME].version,
            before.extension_configs[FILTER_NAME].version
        );

        // c moves: only c's cluster changes (the filter configuration names clusters, not
        // addresses).
        let mut moved = World::new();
        moved.peers[1].1 = addr("10.0.0.33:6444");
        let after = moved.snapshot(&plan(
            &[("x.io", "v1", "widgets")],
            &[("y.io", "v1", "gadgets")],
        ));
        let c = routing::peer_cluster_name(&["c"]);
        let bc = routing::peer_cluster_name(&["b", "c"]);
        let changed: Vec<&String> = before
            .clusters
            .iter()
            .filter(|(name, v)| after.clusters[*name].version != v.version)
            .map(|(name, _)| name)
            .collect();
        // (and the set of every live peer, which has c too; the failover cluster names clusters,
        // not addresses, so it does not change either).
        let c_variants: Vec<String> = [&c, &bc]
            .iter()
            .flat_map(|base| UpstreamAuth::ALL.iter().map(|a| a.cluster(base)))
            .collect();
        let mut want: Vec<&String> = c_variants.iter().collect();
        want.sort();
        assert_eq!(changed, want);
        assert_eq!(
            after.extension_configs[FILTER_NAME].version,
            before.extension_configs[FILTER_NAME].version
        );

        // b and c serve the same thing: their two clusters become one shared cluster.
        let shared = world.snapshot(&plan(
            &[("x.io", "v1", "widgets")],
            &[("x.io", "v1", "widgets")],
        ));
        let bc_failover = routing::failover_cluster_name(&["b", "c"]);
        let mut want: Vec<String> = [LOCAL_CLUSTER, bc.as_str(), bc_failover.as_str()]
            .iter()
            .flat_map(|base| UpstreamAuth::ALL.iter().map(|a| a.cluster(base)))
            .collect();
        want.sort();
        assert_eq!(shared.clusters.keys().cloned().collect::<Vec<_>>(), want);
        let local = UpstreamAuth::ProxyIdentity.cluster(LOCAL_CLUSTER);
        assert_eq!(
            shared.clusters[&local].version,
            before.clusters[&local].version
        );
    }

    /// The filter configuration a snapshot sends, as JSON (what Envoy hands the filter).
    fn filter_json(s: &Snapshot) -> String {
        use envoy_types::pb::envoy::extensions::filters::http::wasm::v3::Wasm;
        use envoy_types::pb::google::protobuf::StringValue;
        let ext = TypedExtensionConfig::decode(
            s.extension_configs[FILTER_NAME].resource.value.as_slice(),
        )
        .expect("extension config");
        let wasm = Wasm::decode(ext.typed_config.expect("typed").value.as_slice()).expect("wasm");
        let configuration = wasm.config.expect("plugin").configuration.expect("config");
        StringValue::decode(configuration.value.as_slice())
            .expect("string")
            .value
    }

    /// The previous release's filter configuration of the rolling-upgrade world.
    const PREVIOUS_RELEASE: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../filter/core/tests/fixtures/previous-release/filter-config.json"
    );

    /// Every key path of a filter configuration: `a.b`, `[]` for a list's items, `*` for the
    /// keys of a map; the discovery documents are kube's, not the schema's, and not entered.
    fn key_paths(json: &serde_json::Value) -> BTreeSet<String> {
        const MAPS: [&str; 3] = ["peer_clusters", "openapi_v3", "discovery.legacy"];
        const DOCUMENTS: [&str; 3] = ["discovery.apis", "discovery.api", "discovery.legacy.*"];
        fn walk(path: &str, v: &serde_json::Value, out: &mut BTreeSet<String>) {
            if !path.is_empty() {
                out.insert(path.to_string());
            }
            if DOCUMENTS.contains(&path) {
                return;
            }
            match v {
                serde_json::Value::Object(o) => {
                    for (k, v) in o {
                        let k = if MAPS.contains(&path) {
                            "*"
                        } else {
                            k.as_str()
                        };
                        let p = if path.is_empty() {
                            k.to_string()
                        } else {
                            format!("{path}.{k}")
                        };
                        walk(&p, v, out);
                    }
                }
                serde_json::Value::Array(a) => {
                    for v in a {
                        walk(&format!("{path}[]"), v, out);
                    }
                }
                _ => {}
            }
        }
        let mut out = BTreeSet::new();
        walk("", json, &mut out);
        out
    }

    #[test]
    fn a_filter_of_this_release_gets_the_snapshot_as_rendered() {
        let plan = rolling_upgrade::plan_it();
        let snapshot = Arc::new(plan.snapshot);
        let (view, delivery) = snapshot.for_filter(&FilterDialect::this_filter());
        assert_eq!(delivery, FilterDelivery::AsRendered);
        assert!(Arc::ptr_eq(&view, &snapshot), "no copy");
        assert_eq!(filter_json(&view), plan.routing.config.to_json());
    }

    #[test]
    fn a_filter_that_advertises_nothing_gets_nothing_the_previous_release_does_not_know() {
        let plan = rolling_upgrade::plan_it();
        let snapshot = Arc::new(plan.snapshot);
        let (view, _) = snapshot.for_filter(&FilterDialect::unadvertised());
        let sent: serde_json::Value = serde_json::from_str(&filter_json(&view)).expect("json");
        let previous: serde_json::Value =
            serde_json::from_slice(&std::fs::read(PREVIOUS_RELEASE).expect("fixture"))
                .expect("json");
        let (sent, known) = (key_paths(&sent), key_paths(&previous));
        let unknown: Vec<&String> = sent.difference(&known).collect();
        assert!(
            unknown.is_empty(),
            "the previous release's filter would refuse {unknown:?}"
        );
        // The fixture has every part a configuration from the control plane can have, so the
        // comparison means something.
        for path in [
            "schema",
            "local_apiserver",
            "peer_clusters.*",
            "group_versions[].shared_storage",
            "group_versions[].resources[].local",
            "group_versions[].resources[].peer_cluster",
            "group_versions[].resources[].retained",
            "discovery.version",
            "discovery.legacy.*",
            "discovery.unavailable[]",
            "pending_peers[]",
            "openapi_v3.*.server_relative_url",
            "openapi_v3.*.peer_cluster",
        ] {
            assert!(known.contains(path), "the fixture has no {path}: {known:?}");
        }
        // The view's fallback record is what that filter holds.
        let record = view.acknowledged.as_ref().expect("record");
        assert_eq!(record.filter_config.to_json(), filter_json(&view));
    }

    #[test]
    fn a_filter_that_reads_no_schema_this_release_writes_is_sent_no_filter_configuration() {
        let plan = rolling_upgrade::plan_it();
        let snapshot = Arc::new(plan.snapshot);
        let future = FilterDialect {
            schemas: BTreeSet::from([SCHEMA_VERSION + 1, SCHEMA_VERSION + 2]),
            features: BTreeSet::new(),
        };
        let (view, delivery) = snapshot.for_filter(&future);
        assert_eq!(
            delivery,
            FilterDelivery::Withheld(Unreadable {
                filter_reads: future.schemas.clone(),
                written_in: BTreeSet::from([SCHEMA_VERSION]),
            })
        );
        assert!(view.filter_withheld);
        assert!(view.extension_configs.is_empty());
        assert_eq!(view.clusters, snapshot.clusters, "clusters as usual");
        assert!(
            view.acknowledged.is_none(),
            "nothing new to keep for the fallback"
        );
        // A snapshot not made from a plan is the same for every filter.
        let bare = Arc::new(Snapshot::new([], []));
        let (view, delivery) = bare.for_filter(&future);
        assert!(Arc::ptr_eq(&view, &bare));
        assert_eq!(delivery, FilterDelivery::AsRendered);
    }

    /// Writes the fixture from this release's rendering: run once when a release is cut
    /// (`cargo test -p skewgate-control write_the_release_fixture -- --ignored`), so that the
    /// next release tests against it. See the fixture's PROVENANCE.md.
    #[test]
    #[ignore]
    fn write_the_release_fixture() {
        let plan = rolling_upgrade::plan_it();
        let out = std::env::var("SKEWGATE_FIXTURE_OUT").unwrap_or(PREVIOUS_RELEASE.to_string());
        std::fs::write(&out, plan.routing.config.to_json()).expect("write");
        eprintln!("wrote {out}");
    }
}
