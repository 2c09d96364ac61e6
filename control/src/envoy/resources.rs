//! The Envoy resources skewgate renders, as protobuf: pure functions, no I/O.
//!
//! Every cluster the filter configuration names (`skewgate-local` and each peer set) exists
//! three times, once per [`UpstreamAuth`] variant (`<base>-identity`, `<base>-token`,
//! `<base>-anonymous`), so the three kinds of traffic never share an upstream connection; the
//! filter configuration is the ECDS resource named like the HTTP filter of the bootstrap
//! ([`super::bootstrap`]). This is the only place these settings are written: the live mode
//! serves them over ADS, the static mode writes them to files (`crate::xds::files`), and the
//! bootstrap's fallback holds static copies of the same messages ([`super::fallback`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;

use envoy_types::pb::envoy::config::cluster::v3::{
    circuit_breakers::Thresholds,
    cluster::{ClusterDiscoveryType, DiscoveryType, LbPolicy},
    CircuitBreakers, Cluster, OutlierDetection, UpstreamConnectionOptions,
};
use envoy_types::pb::envoy::config::core::v3::{
    address, async_data_source, data_source, socket_address, transport_socket,
    Address as EnvoyAddress, AsyncDataSource, DataSource, Http1ProtocolOptions,
    Http2ProtocolOptions, KeepaliveSettings, RoutingPriority, SocketAddress, TcpKeepalive,
    TransportSocket, TypedExtensionConfig,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    lb_endpoint::HostIdentifier, ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints,
};
use envoy_types::pb::envoy::extensions::filters::http::wasm::v3::Wasm;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    common_tls_context::{CombinedCertificateValidationContext, ValidationContextType},
    subject_alt_name_matcher::SanType,
    CertificateValidationContext, CommonTlsContext, SubjectAltNameMatcher, UpstreamTlsContext,
};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::{
    http_protocol_options::{
        explicit_http_config::ProtocolConfig, ExplicitHttpConfig, UpstreamProtocolOptions,
        UseDownstreamHttpConfig,
    },
    HttpProtocolOptions,
};
use envoy_types::pb::envoy::extensions::wasm::v3::{
    plugin_config::Vm, FailurePolicy, PluginConfig, VmConfig,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{string_matcher::MatchPattern, StringMatcher};
use envoy_types::pb::google::protobuf::{Duration, StringValue, UInt32Value};
use envoy_types::util::pack_any;

use skewgate_core::config::{UpstreamAuth, LOCAL_CLUSTER};

use super::secrets::{sds_secret_config, PEER_CA_SECRET, PROXY_CLIENT_SECRET};
use super::{Address, EnvoyError, APISERVER_TLS_NAME, FILTER_NAME};
use crate::routing::RoutingPlan;

/// The Wasm VM's id and runtime.
pub const VM_ID: &str = "skewgate";
pub const WASM_RUNTIME: &str = "envoy.wasm.runtime.v8";
/// The key of a cluster's upstream HTTP protocol options.
pub const HTTP_PROTOCOL_OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";
/// The type of the filter's ECDS resource: the Wasm HTTP filter.
pub const WASM_TYPE_URL: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";
const TLS_TRANSPORT_SOCKET: &str = "envoy.transport_sockets.tls";

/// Where the clusters of a routing plan point.
#[derive(Debug, Clone, Copy)]
pub struct ClusterInputs<'a> {
    /// The apiserver this Envoy fronts.
    pub local: &'a Address,
    /// TLS to the apiservers: the directory of the SDS files of the peer CA (verified with the
    /// name `kubernetes.default.svc`) and of the proxy-client certificate (on `-identity`
    /// clusters), [`super::secrets::upstream_secrets`]. `None`: plaintext, for tests and demos
    /// on loopback only.
    pub upstream_sds: Option<&'a Path>,
}

/// Each peer set of the plan: its cluster's base name and the addresses of the apiservers
/// behind it.
pub fn peer_cluster_addresses(
    plan: &RoutingPlan,
    peers: &[(String, Address)],
) -> Result<Vec<(String, Vec<Address>)>, EnvoyError> {
    plan.clusters
        .iter()
        .map(|peer_cluster| {
            let addresses = peer_cluster
                .peer_ids
                .iter()
                .map(|id| {
                    peers
                        .iter()
                        .find(|(peer, _)| peer == id)
                        .map(|(_, address)| address.clone())
                        .ok_or_else(|| EnvoyError::UnknownPeer(id.clone()))
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok((peer_cluster.name.clone(), addresses))
        })
        .collect()
}

/// Every cluster variant ([`UpstreamAuth::ALL`]) of each base, rendered by `render`.
pub fn variants<T>(
    bases: &[(String, Vec<Address>)],
    mut render: impl FnMut(&str, &[Address], UpstreamAuth) -> Result<T, EnvoyError>,
) -> Result<Vec<T>, EnvoyError> {
    let mut out = Vec::with_capacity(bases.len() * UpstreamAuth::ALL.len());
    for (base, addresses) in bases {
        for auth in UpstreamAuth::ALL {
            out.push(render(&auth.cluster(base), addresses, auth)?);
        }
    }
    Ok(out)
}

/// The three variants of `skewgate-local`, then those of each peer set (`peer_clusters`, from
/// [`peer_cluster_addresses`]).
pub fn clusters(
    peer_clusters: &[(String, Vec<Address>)],
    inputs: &ClusterInputs<'_>,
) -> Result<Vec<Cluster>, EnvoyError> {
    let mut bases = Vec::with_capacity(peer_clusters.len() + 1);
    bases.push((LOCAL_CLUSTER.to_string(), vec![inputs.local.clone()]));
    bases.extend_from_slice(peer_clusters);
    variants(&bases, |name, addresses, auth| {
        cluster(name, addresses, auth, inputs.upstream_sds)
    })
}

fn u32v(value: u32) -> Option<UInt32Value> {
    Some(UInt32Value { value })
}

fn seconds(seconds: i64) -> Option<Duration> {
    Some(Duration { seconds, nanos: 0 })
}

/// A protobuf duration.
pub fn proto_duration(d: std::time::Duration) -> Duration {
    Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

/// An apiserver's address as an Envoy socket address.
pub fn envoy_address(a: &Address) -> EnvoyAddress {
    EnvoyAddress {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: a.host.clone(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(a.port))),
            ..Default::default()
        })),
    }
}

/// The upstream TLS of one cluster variant: the
/// apiserver's serving certificate must chain to the peer CA and carry the DNS name
/// `kubernetes.default.svc` (what upstream's peer proxy verifies; Envoy checks no name unless
/// told to), SNI is that name, and only `-identity` presents the proxy-client certificate.
/// The CA and the certificate come through SDS from the files in `sds_dir`
/// ([`super::secrets`]: renewed files take effect without a restart); the name check stays
/// here, merged with the CA of the secret. ALPN is left to Envoy: each connection pool offers
/// its own protocol (`h2` or `http/1.1`).
pub fn upstream_transport_socket(
    sds_dir: &Path,
    auth: UpstreamAuth,
) -> Result<TransportSocket, EnvoyError> {
    let tls_certificate_sds_secret_configs = if auth == UpstreamAuth::ProxyIdentity {
        vec![sds_secret_config(sds_dir, PROXY_CLIENT_SECRET)?]
    } else {
        Vec::new()
    };
    let names = CertificateValidationContext {
        match_typed_subject_alt_names: vec![SubjectAltNameMatcher {
            san_type: SanType::Dns as i32,
            matcher: Some(StringMatcher {
                match_pattern: Some(MatchPattern::Exact(APISERVER_TLS_NAME.to_string())),
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    };
    let context = UpstreamTlsContext {
        sni: APISERVER_TLS_NAME.to_string(),
        common_tls_context: Some(CommonTlsContext {
            tls_certificate_sds_secret_configs,
            validation_context_type: Some(ValidationContextType::CombinedValidationContext(
                CombinedCertificateValidationContext {
                    default_validation_context: Some(names),
                    validation_context_sds_secret_config: Some(sds_secret_config(
                        sds_dir,
                        PEER_CA_SECRET,
                    )?),
                    ..Default::default()
                },
            )),
            ..Default::default()
        }),
        ..Default::default()
    };
    Ok(TransportSocket {
        name: TLS_TRANSPORT_SOCKET.to_string(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack_any(context))),
    })
}

/// One upstream cluster variant. `-anonymous` speaks HTTP/1.1 only and has a pool of its own:
/// kube-apiserver's HTTP/2 DoS mitigation may close a connection after an unauthenticated
/// request, which would cut every other stream sharing it. The others keep the client's
/// protocol (HTTP/2 has no Upgrade, so WebSocket and SPDY upgrades arriving over HTTP/1.1 stay
/// HTTP/1.1 to the apiserver).
pub fn cluster(
    name: &str,
    addresses: &[Address],
    auth: UpstreamAuth,
    upstream_sds: Option<&Path>,
) -> Result<Cluster, EnvoyError> {
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
                address: Some(envoy_address(a)),
                ..Default::default()
            })),
            ..Default::default()
        })
        .collect();
    let upstream_protocol_options = if auth == UpstreamAuth::Anonymous {
        UpstreamProtocolOptions::ExplicitHttpConfig(ExplicitHttpConfig {
            protocol_config: Some(ProtocolConfig::HttpProtocolOptions(
                Http1ProtocolOptions::default(),
            )),
        })
    } else {
        UpstreamProtocolOptions::UseDownstreamProtocolConfig(UseDownstreamHttpConfig {
            http_protocol_options: Some(Http1ProtocolOptions::default()),
            http2_protocol_options: Some(Http2ProtocolOptions {
                // An apiserver cut off the network leaves a pooled HTTP/2 connection that
                // neither answers nor resets: PINGs find it within 15 s, instead of every
                // request on it waiting out the request timeout.
                connection_keepalive: Some(KeepaliveSettings {
                    interval: seconds(10),
                    timeout: seconds(5),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        })
    };
    let protocol_options = HttpProtocolOptions {
        upstream_protocol_options: Some(upstream_protocol_options),
        ..Default::default()
    };
    let transport_socket = upstream_sds
        .map(|dir| upstream_transport_socket(dir, auth))
        .transpose()?;
    Ok(Cluster {
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
        transport_socket,
        // Detection without ejection. Envoy's router reports an upstream stream reset to outlier
        // detection exactly like a connection failure (`LocalOriginConnectFailed`; its own
        // TODO says a reset from the wire should be external), so no setting ejects on connect
        // failures only: `consecutive_local_origin_failure` would eject a peer that resets the
        // requests it refuses (measured on Envoy 1.40: concurrent resets eject it), taking
        // every other resource it serves with it. A peer that refuses connections is failed
        // over per request by the route's retries instead (`connect-failure` on another host,
        // `previous_hosts`), and dropped from the cluster when its Lease lapses. Detection
        // stays on (`split_external_local_origin_errors`, nothing enforced) for the
        // `outlier_detection.ejections_detected_*` stats; 5xx never count.
        outlier_detection: Some(OutlierDetection {
            split_external_local_origin_errors: true,
            consecutive_local_origin_failure: u32v(2),
            enforcing_consecutive_local_origin_failure: u32v(0),
            enforcing_failure_percentage_local_origin: u32v(0),
            enforcing_failure_percentage: u32v(0),
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
    })
}

/// The filter configuration as the ECDS resource named like the HTTP filter: the Wasm filter,
/// with `configuration` a `google.protobuf.StringValue` holding
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

pub(crate) fn wasm_path(path: &Path) -> Result<&str, EnvoyError> {
    let wasm = path.to_str().ok_or(EnvoyError::Unsafe("the wasm path"))?;
    if wasm.is_empty() || wasm.chars().any(char::is_control) {
        return Err(EnvoyError::Unsafe("the wasm path"));
    }
    Ok(wasm)
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::routing;
    use crate::test_fixtures::world::{addr, plan, World};
    use crate::xds::{Snapshot, SnapshotInputs};
    use envoy_types::pb::envoy::config::core::v3::{
        config_source::ConfigSourceSpecifier, PathConfigSource,
    };
    use prost::Message;

    #[test]
    fn resources_carry_the_documented_settings() {
        let world = World::new();
        let p = plan(&[("x.io", "v1", "widgets")], &[]);
        let snap = world.snapshot(&p);
        let b = UpstreamAuth::Token.cluster(&routing::peer_cluster_name(&["b"]));
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
        // Nothing ejects: a reset is reported like a connect failure (see `cluster`).
        for enforcing in [
            &outlier.enforcing_consecutive_local_origin_failure,
            &outlier.enforcing_consecutive_gateway_failure,
            &outlier.enforcing_success_rate,
            &outlier.enforcing_local_origin_success_rate,
            &outlier.enforcing_failure_percentage,
            &outlier.enforcing_failure_percentage_local_origin,
        ] {
            assert_eq!(*enforcing, u32v(0));
        }
        let options = &cluster.typed_extension_protocol_options[HTTP_PROTOCOL_OPTIONS];
        let options = HttpProtocolOptions::decode(options.value.as_slice()).expect("options");
        assert!(matches!(
            options.upstream_protocol_options,
            Some(UpstreamProtocolOptions::UseDownstreamProtocolConfig(_))
        ));

        // A host name needs DNS.
        let dns = super::cluster(
            "n",
            &[addr("apiserver-b.example:6443")],
            UpstreamAuth::Token,
            None,
        )
        .expect("cluster");
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

    fn decode_cluster(snap: &Snapshot, name: &str) -> Cluster {
        Cluster::decode(snap.clusters[name].resource.value.as_slice()).expect("cluster")
    }

    fn tls_context(cluster: &Cluster) -> Option<UpstreamTlsContext> {
        let socket = cluster.transport_socket.as_ref()?;
        assert_eq!(socket.name, TLS_TRANSPORT_SOCKET);
        let Some(transport_socket::ConfigType::TypedConfig(any)) = &socket.config_type else {
            panic!("typed config");
        };
        assert_eq!(
            any.type_url,
            "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
        );
        Some(UpstreamTlsContext::decode(any.value.as_slice()).expect("tls context"))
    }

    #[test]
    fn three_variants_per_cluster_with_their_own_tls_and_protocols() {
        let world = World::new();
        let p = plan(&[("x.io", "v1", "widgets")], &[]);
        let sds_dir = Path::new("/var/lib/skewgate/sds");
        let secure = Snapshot::from_plan(
            &p,
            &SnapshotInputs {
                wasm_path: Path::new("/opt/skewgate.wasm"),
                local: &world.local,
                peers: &world.peers,
                upstream_sds: Some(sds_dir),
            },
        )
        .expect("snapshot");
        let plain = world.snapshot(&p);
        let b = routing::peer_cluster_name(&["b"]);
        for base in [LOCAL_CLUSTER, b.as_str()] {
            for auth in UpstreamAuth::ALL {
                let name = auth.cluster(base);
                // Plaintext (tests): no transport socket at all.
                assert!(decode_cluster(&plain, &name).transport_socket.is_none());
                let cluster = decode_cluster(&secure, &name);
                assert_eq!(cluster.name, name);
                let ctx = tls_context(&cluster).expect("TLS");
                assert_eq!(ctx.sni, "kubernetes.default.svc");
                let common = ctx.common_tls_context.expect("common");
                // The peer CA through SDS from its file (rotation without a restart), merged
                // with the name check, which stays in the cluster.
                let Some(ValidationContextType::CombinedValidationContext(combined)) =
                    common.validation_context_type
                else {
                    panic!("a combined validation context");
                };
                assert_eq!(
                    combined.validation_context_sds_secret_config,
                    Some(sds_secret_config(sds_dir, PEER_CA_SECRET).expect("sds"))
                );
                let v = combined.default_validation_context.expect("names");
                assert!(v.trusted_ca.is_none(), "the CA comes from the secret");
                assert_eq!(v.match_typed_subject_alt_names.len(), 1);
                let san = &v.match_typed_subject_alt_names[0];
                assert_eq!(san.san_type, SanType::Dns as i32);
                assert_eq!(
                    san.matcher.as_ref().and_then(|m| m.match_pattern.clone()),
                    Some(MatchPattern::Exact("kubernetes.default.svc".into()))
                );
                // No file named inline: Envoy would read it once and never again.
                assert!(common.tls_certificates.is_empty(), "{name}");
                // Only -identity presents the proxy-client certificate.
                if auth == UpstreamAuth::ProxyIdentity {
                    assert_eq!(
                        common.tls_certificate_sds_secret_configs,
                        vec![sds_secret_config(sds_dir, PROXY_CLIENT_SECRET).expect("sds")],
                        "{name}"
                    );
                    assert_eq!(
                        common.tls_certificate_sds_secret_configs[0]
                            .sds_config
                            .as_ref()
                            .and_then(|c| c.config_source_specifier.clone()),
                        Some(ConfigSourceSpecifier::PathConfigSource(PathConfigSource {
                            path: "/var/lib/skewgate/sds/skewgate-proxy-client.pb".into(),
                            ..Default::default()
                        }))
                    );
                } else {
                    assert!(
                        common.tls_certificate_sds_secret_configs.is_empty(),
                        "{name}"
                    );
                }
                // -anonymous: HTTP/1.1 only; the others keep the client's protocol.
                let options = &cluster.typed_extension_protocol_options[HTTP_PROTOCOL_OPTIONS];
                let options =
                    HttpProtocolOptions::decode(options.value.as_slice()).expect("options");
                match (auth, options.upstream_protocol_options) {
                    (
                        UpstreamAuth::Anonymous,
                        Some(UpstreamProtocolOptions::ExplicitHttpConfig(ExplicitHttpConfig {
                            protocol_config: Some(ProtocolConfig::HttpProtocolOptions(_)),
                        })),
                    ) => {}
                    (
                        UpstreamAuth::ProxyIdentity | UpstreamAuth::Token,
                        Some(UpstreamProtocolOptions::UseDownstreamProtocolConfig(_)),
                    ) => {}
                    (auth, other) => panic!("{auth:?}: {other:?}"),
                }
            }
        }
        // A path Envoy could misread is refused.
        assert!(matches!(
            upstream_transport_socket(Path::new("/sds\n"), UpstreamAuth::Token),
            Err(EnvoyError::Unsafe(_))
        ));
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
            upstream_sds: None,
        };
        assert!(matches!(
            Snapshot::from_plan(&p, &inputs),
            Err(EnvoyError::UnknownPeer(id)) if id == "nobody"
        ));
        let p = plan(&[], &[]);
        let inputs = SnapshotInputs {
            wasm_path: Path::new("/x\n.wasm"),
            ..inputs
        };
        assert!(matches!(
            Snapshot::from_plan(&p, &inputs),
            Err(EnvoyError::Unsafe(_))
        ));
    }
}
