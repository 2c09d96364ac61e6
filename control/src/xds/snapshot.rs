//! One Envoy's complete configuration as xDS resources with content-hash versions: built once
//! from a routing plan, then served by the delta ADS server or written to files.
//!
//! Each resource carries a version that is the SHA-256 of its encoded `Any`: the same plan
//! always gives the same versions, across restarts of the control plane, which is what lets a
//! reconnecting Envoy (reporting the versions it holds) be resynced without a push.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
use envoy_types::pb::google::protobuf::Any;
use envoy_types::util::pack_any;
use prost::Message;
use sha2::{Digest, Sha256};

use super::{CLUSTER_TYPE_URL, EXTENSION_CONFIG_TYPE_URL};
use crate::envoy::fallback::AcknowledgedConfig;
use crate::envoy::resources::{
    clusters, failover_bases, filter_extension_config, peer_cluster_addresses, wasm_path,
    ClusterInputs,
};
use crate::envoy::{Address, EnvoyError};
use crate::routing::RoutingPlan;

/// What a snapshot needs besides the routing plan.
#[derive(Debug, Clone)]
pub struct SnapshotInputs<'a> {
    /// `skewgate_filter.wasm` on the Envoy host (Envoy reads it; it is not sent over xDS).
    pub wasm_path: &'a Path,
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
    /// not made from a routing plan.
    pub acknowledged: Option<Arc<AcknowledgedConfig>>,
}

impl PartialEq for Snapshot {
    fn eq(&self, other: &Self) -> bool {
        self.clusters == other.clusters && self.extension_configs == other.extension_configs
    }
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
            acknowledged: None,
        }
    }

    /// The resources for a routing plan: the three variants of `skewgate-local` and of each
    /// peer set, and the filter configuration (`plan.config` as JSON).
    pub fn from_plan(plan: &RoutingPlan, inputs: &SnapshotInputs<'_>) -> Result<Self, EnvoyError> {
        let wasm = wasm_path(inputs.wasm_path)?;
        // Resolved once: the clusters and the fallback record name the same addresses.
        let peer_clusters = peer_cluster_addresses(plan, inputs.peers)?;
        let cluster_inputs = ClusterInputs {
            local: inputs.local,
            upstream_sds: inputs.upstream_sds,
        };
        let snapshot = Self::new(
            clusters(&peer_clusters, &failover_bases(plan), &cluster_inputs)?,
            [filter_extension_config(wasm, &plan.config.to_json())],
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
            ..snapshot
        })
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

    use skewgate_core::config::{UpstreamAuth, LOCAL_CLUSTER};

    use super::*;
    use crate::envoy::FILTER_NAME;
    use crate::routing;
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
}
