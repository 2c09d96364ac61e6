//! Envoy resources from a routing plan: pure functions, no I/O.
//!
//! Every setting mirrors `envoy/static-cluster.yaml` and the filter entry of
//! `envoy/static-bootstrap.yaml`, where each one is explained; the static and the live mode must
//! configure Envoy identically (a test below pins the values). Each resource carries a version
//! that is the SHA-256 of its encoded `Any`: the same plan always gives the same versions,
//! across restarts of the control plane, which is what lets a reconnecting Envoy (reporting the
//! versions it holds) be resynced without a push.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::Path;

use envoy_types::pb::envoy::config::cluster::v3::{
    circuit_breakers::Thresholds,
    cluster::{ClusterDiscoveryType, DiscoveryType, LbPolicy},
    CircuitBreakers, Cluster, OutlierDetection, UpstreamConnectionOptions,
};
use envoy_types::pb::envoy::config::core::v3::{
    address, async_data_source, data_source, socket_address, Address as EnvoyAddress,
    AsyncDataSource, DataSource, Http1ProtocolOptions, Http2ProtocolOptions, RoutingPriority,
    SocketAddress, TcpKeepalive, TypedExtensionConfig,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    lb_endpoint::HostIdentifier, ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints,
};
use envoy_types::pb::envoy::extensions::filters::http::wasm::v3::Wasm;
use envoy_types::pb::envoy::extensions::upstreams::http::v3::{
    http_protocol_options::{UpstreamProtocolOptions, UseDownstreamHttpConfig},
    HttpProtocolOptions,
};
use envoy_types::pb::envoy::extensions::wasm::v3::{
    plugin_config::Vm, FailurePolicy, PluginConfig, VmConfig,
};
use envoy_types::pb::google::protobuf::{Any, Duration, StringValue, UInt32Value};
use envoy_types::util::pack_any;
use prost::Message;
use sha2::{Digest, Sha256};

use super::{XdsError, CLUSTER_TYPE_URL, EXTENSION_CONFIG_TYPE_URL, FILTER_NAME};
use crate::bootstrap::{Address, LOCAL_CLUSTER};
use crate::routing::RoutingPlan;

/// The Wasm VM's id and runtime, as in the static bootstrap.
pub const VM_ID: &str = "skewgate";
pub const WASM_RUNTIME: &str = "envoy.wasm.runtime.v8";
const HTTP_PROTOCOL_OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";

/// What a snapshot needs besides the routing plan (the same inputs as the static bootstrap).
#[derive(Debug, Clone)]
pub struct SnapshotInputs<'a> {
    /// `skewgate_filter.wasm` on the Envoy host (Envoy reads it; it is not sent over xDS).
    pub wasm_path: &'a Path,
    /// The apiserver this Envoy fronts.
    pub local: &'a Address,
    /// Address of every peer apiserver by id.
    pub peers: &'a [(String, Address)],
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
/// filter configuration in it names are in it).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// CDS: cluster name → cluster.
    pub clusters: BTreeMap<String, Versioned>,
    /// ECDS: extension config name → `TypedExtensionConfig`.
    pub extension_configs: BTreeMap<String, Versioned>,
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
        }
    }

    /// The resources for a routing plan: `skewgate-local`, one cluster per peer set, and the
    /// filter configuration (`plan.config` as JSON).
    pub fn from_plan(plan: &RoutingPlan, inputs: &SnapshotInputs<'_>) -> Result<Self, XdsError> {
        let wasm = wasm_path(inputs.wasm_path)?;
        Ok(Self::new(
            clusters(plan, inputs)?,
            [filter_extension_config(wasm, &plan.config.to_json())],
        ))
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

fn wasm_path(path: &Path) -> Result<&str, XdsError> {
    let wasm = path.to_str().ok_or(XdsError::Unsafe("the wasm path"))?;
    if wasm.is_empty() || wasm.chars().any(char::is_control) {
        return Err(XdsError::Unsafe("the wasm path"));
    }
    Ok(wasm)
}

/// `skewgate-local` first, then one cluster per peer set of the plan.
pub fn clusters(plan: &RoutingPlan, inputs: &SnapshotInputs<'_>) -> Result<Vec<Cluster>, XdsError> {
    let mut out = Vec::with_capacity(plan.clusters.len() + 1);
    out.push(cluster(LOCAL_CLUSTER, std::slice::from_ref(inputs.local)));
    for peer_cluster in &plan.clusters {
        let addresses = peer_cluster
            .peer_ids
            .iter()
            .map(|id| {
                inputs
                    .peers
                    .iter()
                    .find(|(peer, _)| peer == id)
                    .map(|(_, address)| address.clone())
                    .ok_or_else(|| XdsError::UnknownPeer(id.clone()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        out.push(cluster(&peer_cluster.name, &addresses));
    }
    Ok(out)
}

fn u32v(value: u32) -> Option<UInt32Value> {
    Some(UInt32Value { value })
}

fn seconds(seconds: i64) -> Option<Duration> {
    Some(Duration { seconds, nanos: 0 })
}

/// One upstream cluster: `envoy/static-cluster.yaml` as a resource (the reasons are there).
pub fn cluster(name: &str, addresses: &[Address]) -> Cluster {
    // All endpoints of one cluster resolve the same way; a mix of names and IPs needs DNS.
    let discovery_type = if addresses.iter().all(|a| a.host.parse::<IpAddr>().is_ok()) {
        DiscoveryType::Static
    } else {
        DiscoveryType::StrictDns
    };
    let lb_endpoints = addresses
        .iter()
        .map(|a| LbEndpoint {
            host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
                address: Some(EnvoyAddress {
                    address: Some(address::Address::SocketAddress(SocketAddress {
                        address: a.host.clone(),
                        port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(
                            a.port,
                        ))),
                        ..Default::default()
                    })),
                }),
                ..Default::default()
            })),
            ..Default::default()
        })
        .collect();
    let protocol_options = HttpProtocolOptions {
        upstream_protocol_options: Some(UpstreamProtocolOptions::UseDownstreamProtocolConfig(
            UseDownstreamHttpConfig {
                http_protocol_options: Some(Http1ProtocolOptions::default()),
                http2_protocol_options: Some(Http2ProtocolOptions::default()),
                ..Default::default()
            },
        )),
        ..Default::default()
    };
    Cluster {
        name: name.to_string(),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(discovery_type as i32)),
        connect_timeout: seconds(2),
        lb_policy: LbPolicy::RoundRobin as i32,
        load_assignment: Some(ClusterLoadAssignment {
            cluster_name: name.to_string(),
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints,
                ..Default::default()
            }],
            ..Default::default()
        }),
        circuit_breakers: Some(CircuitBreakers {
            thresholds: vec![Thresholds {
                priority: RoutingPriority::Default as i32,
                max_connections: u32v(100_000),
                max_pending_requests: u32v(100_000),
                max_requests: u32v(100_000),
                max_retries: u32v(1000),
                ..Default::default()
            }],
            ..Default::default()
        }),
        upstream_connection_options: Some(UpstreamConnectionOptions {
            tcp_keepalive: Some(TcpKeepalive {
                keepalive_time: u32v(60),
                keepalive_interval: u32v(10),
                keepalive_probes: u32v(3),
            }),
            ..Default::default()
        }),
        // One entry: prost encodes it deterministically, so the content hash is stable.
        typed_extension_protocol_options: HashMap::from([(
            HTTP_PROTOCOL_OPTIONS.to_string(),
            pack_any(protocol_options),
        )]),
        outlier_detection: Some(OutlierDetection {
            split_external_local_origin_errors: true,
            consecutive_local_origin_failure: u32v(2),
            enforcing_consecutive_5xx: u32v(0),
            enforcing_consecutive_gateway_failure: u32v(0),
            enforcing_success_rate: u32v(0),
            enforcing_local_origin_success_rate: u32v(0),
            interval: seconds(5),
            base_ejection_time: seconds(10),
            max_ejection_percent: u32v(100),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The filter configuration as the ECDS resource named like the HTTP filter: the Wasm filter
/// of the static bootstrap, with `configuration` a `google.protobuf.StringValue` holding
/// `configuration_json` (the filter parses and validates it in `on_configure`; a refusal is a
/// NACK).
pub fn filter_extension_config(wasm_path: &str, configuration_json: &str) -> TypedExtensionConfig {
    let wasm = Wasm {
        config: Some(PluginConfig {
            name: FILTER_NAME.to_string(),
            // A crashed VM is replaced for the next request; until then requests fail rather
            // than bypass the header hygiene.
            failure_policy: FailurePolicy::FailReload as i32,
            vm: Some(Vm::VmConfig(VmConfig {
                vm_id: VM_ID.to_string(),
                runtime: WASM_RUNTIME.to_string(),
                code: Some(AsyncDataSource {
                    specifier: Some(async_data_source::Specifier::Local(DataSource {
                        specifier: Some(data_source::Specifier::Filename(wasm_path.to_string())),
                        ..Default::default()
                    })),
                }),
                ..Default::default()
            })),
            configuration: Some(pack_any(StringValue {
                value: configuration_json.to_string(),
            })),
            ..Default::default()
        }),
    };
    TypedExtensionConfig {
        name: FILTER_NAME.to_string(),
        typed_config: Some(pack_any(wasm)),
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
    use std::collections::BTreeSet;

    use super::*;
    use crate::discovery::ServedApis;
    use crate::routing::{self, Peer};

    fn served(entries: &[(&str, &str, &str)]) -> ServedApis {
        let mut s = ServedApis::new();
        for (g, v, k) in entries {
            s.add_resource(g, v, k).expect("valid");
        }
        s
    }

    fn addr(s: &str) -> Address {
        Address::parse(s).expect("address")
    }

    struct World {
        local: Address,
        peers: Vec<(String, Address)>,
    }

    impl World {
        fn new() -> Self {
            World {
                local: addr("127.0.0.1:6443"),
                peers: vec![
                    ("b".to_string(), addr("10.0.0.2:6444")),
                    ("c".to_string(), addr("10.0.0.3:6444")),
                ],
            }
        }
        fn snapshot(&self, plan: &RoutingPlan) -> Snapshot {
            Snapshot::from_plan(
                plan,
                &SnapshotInputs {
                    wasm_path: Path::new("/opt/skewgate.wasm"),
                    local: &self.local,
                    peers: &self.peers,
                },
            )
            .expect("snapshot")
        }
    }

    fn plan(b: &[(&str, &str, &str)], c: &[(&str, &str, &str)]) -> RoutingPlan {
        routing::build(
            &served(&[("apps", "v1", "deployments")]),
            "a",
            &[
                Peer {
                    id: "b".into(),
                    served: served(b),
                },
                Peer {
                    id: "c".into(),
                    served: served(c),
                },
            ],
            &BTreeSet::new(),
        )
    }

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
        // skewgate-local plus one cluster per peer set, one filter configuration.
        assert_eq!(one.clusters.len(), 3);
        assert!(one.clusters.contains_key(LOCAL_CLUSTER));
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
        let local = &one.clusters[LOCAL_CLUSTER];
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
        let changed: Vec<&String> = before
            .clusters
            .iter()
            .filter(|(name, v)| after.clusters[*name].version != v.version)
            .map(|(name, _)| name)
            .collect();
        assert_eq!(changed, vec![&c]);
        assert_eq!(
            after.extension_configs[FILTER_NAME].version,
            before.extension_configs[FILTER_NAME].version
        );

        // b and c serve the same thing: their two clusters become one shared cluster.
        let shared = world.snapshot(&plan(
            &[("x.io", "v1", "widgets")],
            &[("x.io", "v1", "widgets")],
        ));
        let bc = routing::peer_cluster_name(&["b", "c"]);
        assert_eq!(
            shared.clusters.keys().cloned().collect::<Vec<_>>(),
            vec![LOCAL_CLUSTER.to_string(), bc]
        );
        assert_eq!(
            shared.clusters[LOCAL_CLUSTER].version,
            before.clusters[LOCAL_CLUSTER].version
        );
    }

    #[test]
    fn resources_match_the_static_configuration() {
        let world = World::new();
        let p = plan(&[("x.io", "v1", "widgets")], &[]);
        let snap = world.snapshot(&p);
        let b = routing::peer_cluster_name(&["b"]);
        let cluster =
            Cluster::decode(snap.clusters[&b].resource.value.as_slice()).expect("cluster");
        assert_eq!(cluster.name, b);
        assert_eq!(cluster.connect_timeout, seconds(2));
        assert_eq!(
            cluster.cluster_discovery_type,
            Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32))
        );
        let endpoint = &cluster
            .load_assignment
            .as_ref()
            .expect("endpoints")
            .endpoints[0]
            .lb_endpoints[0];
        let Some(HostIdentifier::Endpoint(Endpoint {
            address:
                Some(EnvoyAddress {
                    address: Some(address::Address::SocketAddress(socket)),
                }),
            ..
        })) = &endpoint.host_identifier
        else {
            panic!("endpoint address");
        };
        assert_eq!(socket.address, "10.0.0.2");
        assert_eq!(
            socket.port_specifier,
            Some(socket_address::PortSpecifier::PortValue(6444))
        );
        let thresholds = &cluster
            .circuit_breakers
            .as_ref()
            .expect("breakers")
            .thresholds[0];
        assert_eq!(thresholds.max_requests, u32v(100_000));
        let outlier = cluster.outlier_detection.as_ref().expect("outlier");
        assert!(outlier.split_external_local_origin_errors);
        assert_eq!(outlier.consecutive_local_origin_failure, u32v(2));
        assert_eq!(outlier.enforcing_consecutive_5xx, u32v(0));
        let options = &cluster.typed_extension_protocol_options[HTTP_PROTOCOL_OPTIONS];
        let options = HttpProtocolOptions::decode(options.value.as_slice()).expect("options");
        assert!(matches!(
            options.upstream_protocol_options,
            Some(UpstreamProtocolOptions::UseDownstreamProtocolConfig(_))
        ));

        // A host name needs DNS.
        let dns = super::cluster("n", &[addr("apiserver-b.example:6443")]);
        assert_eq!(
            dns.cluster_discovery_type,
            Some(ClusterDiscoveryType::Type(DiscoveryType::StrictDns as i32))
        );

        let ext = TypedExtensionConfig::decode(
            snap.extension_configs[FILTER_NAME]
                .resource
                .value
                .as_slice(),
        )
        .expect("extension config");
        assert_eq!(ext.name, FILTER_NAME);
        let any = ext.typed_config.expect("typed config");
        assert_eq!(
            any.type_url,
            "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
        );
        let plugin = Wasm::decode(any.value.as_slice())
            .expect("wasm")
            .config
            .expect("plugin config");
        assert_eq!(plugin.failure_policy, FailurePolicy::FailReload as i32);
        let Some(Vm::VmConfig(vm)) = plugin.vm else {
            panic!("vm config");
        };
        assert_eq!(
            (vm.vm_id.as_str(), vm.runtime.as_str()),
            (VM_ID, WASM_RUNTIME)
        );
        let configuration = plugin.configuration.expect("configuration");
        assert_eq!(
            configuration.type_url,
            "type.googleapis.com/google.protobuf.StringValue"
        );
        let json = StringValue::decode(configuration.value.as_slice())
            .expect("string")
            .value;
        assert_eq!(json, p.config.to_json());
    }

    #[test]
    fn unknown_peers_and_bad_paths_are_refused() {
        let world = World::new();
        let mut p = plan(&[("x.io", "v1", "widgets")], &[]);
        p.clusters[0].peer_ids = vec!["nobody".into()];
        let inputs = SnapshotInputs {
            wasm_path: Path::new("/x.wasm"),
            local: &world.local,
            peers: &world.peers,
        };
        assert!(matches!(
            Snapshot::from_plan(&p, &inputs),
            Err(XdsError::UnknownPeer(id)) if id == "nobody"
        ));
        let p = plan(&[], &[]);
        let inputs = SnapshotInputs {
            wasm_path: Path::new("/x\n.wasm"),
            ..inputs
        };
        assert!(matches!(
            Snapshot::from_plan(&p, &inputs),
            Err(XdsError::Unsafe(_))
        ));
    }
}
