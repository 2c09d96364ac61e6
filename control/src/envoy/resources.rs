//! The Envoy resources skewgate renders, as protobuf: pure functions, no I/O.
//!
//! Every cluster the filter configuration names (`skewgate-local` and each peer set) exists
//! three times, once per [`UpstreamAuth`] variant (`<base>-identity`, `<base>-token`,
//! `<base>-anonymous`), so the three kinds of traffic never share an upstream connection; the
//! filter configuration is the ECDS resource named like the HTTP filter of the bootstrap
//! ([`super::bootstrap`]). This is the only place these settings are written: the live mode
//! serves them over ADS, the static mode writes them to files (`crate::xds::files`), and the
//! bootstrap's fallback holds static copies of the same messages ([`super::fallback`]).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::Path;

use envoy_types::pb::envoy::config::cluster::v3::{
    circuit_breakers::Thresholds,
    cluster::{
        ClusterDiscoveryType, CommonLbConfig, CustomClusterType, DiscoveryType, LbPolicy,
        TransportSocketMatch,
    },
    CircuitBreakers, Cluster, OutlierDetection, UpstreamConnectionOptions,
};
use envoy_types::pb::envoy::config::common::mutation_rules::v3::{
    header_mutation::Action as MutationAction, HeaderMutation,
};
use envoy_types::pb::envoy::config::core::v3::{
    address, async_data_source, data_source, socket_address, transport_socket,
    Address as EnvoyAddress, AsyncDataSource, DataSource, Http1ProtocolOptions,
    Http2ProtocolOptions, KeepaliveSettings, RoutingPriority, SocketAddress, TcpKeepalive,
    TransportSocket, TypedExtensionConfig,
};
use envoy_types::pb::envoy::config::core::v3::{
    header_value_option::HeaderAppendAction, health_check, HeaderValue, HeaderValueOption,
    HealthCheck, Metadata,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    lb_endpoint::HostIdentifier, ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints,
};
use envoy_types::pb::envoy::extensions::clusters::aggregate::v3::ClusterConfig as AggregateConfig;
use envoy_types::pb::envoy::extensions::dynamic_modules::v3::DynamicModuleConfig;
use envoy_types::pb::envoy::extensions::filters::http::dynamic_modules::v3::DynamicModuleFilter;
use envoy_types::pb::envoy::extensions::filters::http::header_mutation::v3::{
    HeaderMutation as HeaderMutationFilter, Mutations,
};
use envoy_types::pb::envoy::extensions::filters::http::upstream_codec::v3::UpstreamCodec;
use envoy_types::pb::envoy::extensions::filters::http::wasm::v3::Wasm;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_filter, HttpFilter,
};
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
use envoy_types::pb::envoy::r#type::v3::Int64Range;
use envoy_types::pb::envoy::r#type::v3::Percent;
use envoy_types::pb::google::protobuf::{
    value::Kind, Duration, StringValue, Struct, UInt32Value, Value,
};
use envoy_types::util::pack_any;

use skewgate_core::config::{UpstreamAuth, LOCAL_CLUSTER};

use super::secrets::{sds_secret_config, PEER_CA_SECRET, PROXY_CLIENT_SECRET};
use super::{Address, EnvoyError, APISERVER_TLS_NAME, FILTER_NAME};
use crate::routing::{failover_peer_cluster, RoutingPlan};

/// The Wasm VM's id and runtime.
pub const VM_ID: &str = "skewgate";
pub const WASM_RUNTIME: &str = "envoy.wasm.runtime.v8";
/// The key of a cluster's upstream HTTP protocol options.
pub const HTTP_PROTOCOL_OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";
/// The type of the filter's ECDS resource: the Wasm HTTP filter.
pub const WASM_TYPE_URL: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";
/// The type of the filter's ECDS resource with `--data-plane native`.
pub const DYNAMIC_MODULE_TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter";
/// Where the native filter's metrics are named: proxy-wasm's namespace, so that both data
/// planes' metrics have one name.
pub const NATIVE_METRICS_NAMESPACE: &str = "wasmcustom";
const TLS_TRANSPORT_SOCKET: &str = "envoy.transport_sockets.tls";

/// The metadata namespace of skewgate's endpoint metadata.
pub const METADATA_NAMESPACE: &str = "skewgate";
/// The key, in a peer endpoint's metadata, of the loop guard's value for requests that reach
/// it through a failover cluster (`true`; absent on the local apiserver's endpoint).
pub const PEER_PROXIED_KEY: &str = "peer_proxied";
/// The path the local apiserver's health is checked on: kube-apiserver's readiness, which
/// fails (500) as soon as it starts shutting down.
pub const HEALTH_CHECK_PATH: &str = "/readyz";

/// What a cluster's endpoints are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The apiserver this Envoy fronts: its health is checked, so that a failover cluster
    /// skips it as soon as it stops answering (or is not ready).
    Local,
    /// Peer apiservers: each endpoint carries the loop guard's value for failover clusters.
    Peer,
    /// Departed apiservers at their last address, for the retained keys they served: a
    /// request goes to one only while its readiness check passes ([`departed_health_check`];
    /// none ready: Envoy answers at once, `no_healthy_upstream`, which the filter makes the
    /// retained 503), with a short connect timeout ([`DEPARTED_CONNECT_TIMEOUT`]).
    Departed,
}

/// How long a connection to a departed apiserver may take to open: its node may be off the
/// network (no reset comes back). Its readiness check keeps requests off it while it does not
/// answer; this bounds the requests between its last good check and the failed one. A live
/// apiserver on the control plane's network connects in milliseconds.
pub const DEPARTED_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(250);

/// How often a departed apiserver's readiness is checked: the longest it serves nothing after
/// it is ready again (when its new Lease has not become a route before that), and the longest
/// requests may still reach it after it stopped being ready.
pub const DEPARTED_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_millis(250);

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

/// Each peer set of the plan, and the peer set of each of its failover clusters: its cluster's
/// base name and the addresses of the apiservers behind it (each set once, sorted by name).
pub fn peer_cluster_addresses(
    plan: &RoutingPlan,
    peers: &[(String, Address)],
) -> Result<Vec<(String, Vec<Address>)>, EnvoyError> {
    let sets: BTreeMap<String, &[String]> = plan
        .clusters
        .iter()
        .map(|c| (c.name.clone(), c.peer_ids.as_slice()))
        .chain(plan.failover.iter().map(|f| {
            let peer_cluster = failover_peer_cluster(f);
            (peer_cluster.name, f.peer_ids.as_slice())
        }))
        .collect();
    sets.into_iter()
        .map(|(name, ids)| Ok((name, addresses_of(ids, peers)?)))
        .collect()
}

/// Each departed set of the plan: its cluster's base name and the last addresses of the
/// departed apiservers behind it.
pub fn departed_cluster_addresses(
    plan: &RoutingPlan,
    peers: &[(String, Address)],
) -> Result<Vec<(String, Vec<Address>)>, EnvoyError> {
    plan.departed
        .iter()
        .map(|set| Ok((set.name.clone(), addresses_of(&set.peer_ids, peers)?)))
        .collect()
}

fn addresses_of(ids: &[String], peers: &[(String, Address)]) -> Result<Vec<Address>, EnvoyError> {
    ids.iter()
        .map(|id| {
            peers
                .iter()
                .find(|(peer, _)| peer == id)
                .map(|(_, address)| address.clone())
                .ok_or_else(|| EnvoyError::UnknownPeer(id.clone()))
        })
        .collect()
}

/// Each failover cluster of the plan: its base name and its peer cluster's.
pub fn failover_bases(plan: &RoutingPlan) -> Vec<(String, String)> {
    plan.failover
        .iter()
        .map(|f| (f.name.clone(), failover_peer_cluster(f).name))
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
/// [`peer_cluster_addresses`]), then those of each departed set (`departed`, from
/// [`departed_cluster_addresses`]), then those of each failover cluster (`failover`: its base
/// name and the base name of its peer cluster, one of `peer_clusters`).
pub fn clusters(
    peer_clusters: &[(String, Vec<Address>)],
    departed: &[(String, Vec<Address>)],
    failover: &[(String, String)],
    inputs: &ClusterInputs<'_>,
) -> Result<Vec<Cluster>, EnvoyError> {
    let mut out = variants(
        &[(LOCAL_CLUSTER.to_string(), vec![inputs.local.clone()])],
        |name, addresses, auth| cluster(name, addresses, auth, Role::Local, inputs.upstream_sds),
    )?;
    out.extend(variants(peer_clusters, |name, addresses, auth| {
        cluster(name, addresses, auth, Role::Peer, inputs.upstream_sds)
    })?);
    out.extend(variants(departed, |name, addresses, auth| {
        cluster(name, addresses, auth, Role::Departed, inputs.upstream_sds)
    })?);
    for (name, peers) in failover {
        for auth in UpstreamAuth::ALL {
            out.push(failover_cluster(name, LOCAL_CLUSTER, peers, auth));
        }
    }
    Ok(out)
}

/// One variant of a failover cluster: Envoy's aggregate cluster of the local apiserver's
/// cluster (priority 0) and then the peer cluster (priority 1) of the same variant, so that a
/// request goes to the local apiserver while its health check passes and to the peers when it
/// does not, or when a connection to it fails (the route's retries, with
/// `previous_priorities`, move to the peers). Each attempt keeps the TLS and protocol of the
/// cluster it goes to. The loop guard is added per attempt by the aggregate's own upstream
/// filter from the chosen endpoint's metadata (upstream filters of the member clusters do not
/// run through an aggregate, envoyproxy/envoy#29318): `true` on a peer, nothing on the local
/// apiserver. The identity headers are the same for both.
pub fn failover_cluster(
    base: &str,
    local_base: &str,
    peer_base: &str,
    auth: UpstreamAuth,
) -> Cluster {
    let name = auth.cluster(base);
    let guard = HeaderMutation {
        action: Some(MutationAction::Append(HeaderValueOption {
            header: Some(HeaderValue {
                key: skewgate_core::hygiene::PEER_PROXIED.to_string(),
                value: format!("%UPSTREAM_METADATA({METADATA_NAMESPACE}:{PEER_PROXIED_KEY})%"),
                ..Default::default()
            }),
            // Empty (the local apiserver): not added.
            append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
            ..Default::default()
        })),
    };
    let filters = vec![
        HttpFilter {
            name: "envoy.filters.http.header_mutation".to_string(),
            config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(
                HeaderMutationFilter {
                    mutations: Some(Mutations {
                        request_mutations: vec![guard],
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ))),
            ..Default::default()
        },
        HttpFilter {
            name: "envoy.filters.http.upstream_codec".to_string(),
            config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(
                UpstreamCodec::default(),
            ))),
            ..Default::default()
        },
    ];
    let options = HttpProtocolOptions {
        // Required with upstream filters; each attempt uses its member cluster's protocol.
        upstream_protocol_options: Some(UpstreamProtocolOptions::ExplicitHttpConfig(
            ExplicitHttpConfig {
                protocol_config: Some(ProtocolConfig::HttpProtocolOptions(
                    Http1ProtocolOptions::default(),
                )),
            },
        )),
        http_filters: filters,
        ..Default::default()
    };
    Cluster {
        name,
        cluster_discovery_type: Some(ClusterDiscoveryType::ClusterType(CustomClusterType {
            name: "envoy.clusters.aggregate".to_string(),
            typed_config: Some(pack_any(AggregateConfig {
                clusters: vec![auth.cluster(local_base), auth.cluster(peer_base)],
            })),
        })),
        connect_timeout: seconds(2),
        lb_policy: LbPolicy::ClusterProvided as i32,
        // The aggregate's own retry budget caps concurrent failovers (Envoy's default of 3
        // refused 17 of 20 concurrent retries while the local apiserver was down).
        circuit_breakers: Some(circuit_breakers()),
        typed_extension_protocol_options: HashMap::from([(
            HTTP_PROTOCOL_OPTIONS.to_string(),
            pack_any(options),
        )]),
        ..Default::default()
    }
}

/// Envoy's default of 1024 concurrent requests per cluster would refuse watches.
fn circuit_breakers() -> CircuitBreakers {
    CircuitBreakers {
        thresholds: vec![Thresholds {
            priority: RoutingPriority::Default as i32,
            max_connections: u32v(100_000),
            max_pending_requests: u32v(100_000),
            max_requests: u32v(100_000),
            max_retries: u32v(1000),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// HTTP/2 PINGs on every upstream connection: every second, and one unanswered for a second
/// closes the connection (Envoy adds up to 15 % jitter to the interval).
fn keepalive() -> KeepaliveSettings {
    KeepaliveSettings {
        interval: seconds(1),
        timeout: seconds(1),
        ..Default::default()
    }
}

/// The `/readyz` answers that mean "ready", half-open ranges: any below 500 but 403. A 5xx is
/// what kube-apiserver's `/readyz` answers while not ready or shutting down; a 403 is its
/// answer to an anonymous `/readyz` in its first second or so, before its RBAC bootstrap
/// policy exists (seen on a real 1.36 and 1.37, `tests/tests/conformance.rs`), when it would
/// refuse every other client too. A 401 (`--anonymous-auth=false`) still means the apiserver
/// is there and past that point.
pub const READY_STATUSES: [(i64, i64); 2] = [(200, 403), (404, 500)];

/// An apiserver's health (the local one's, and each peer's through its peer port), checked
/// every second on [`HEALTH_CHECK_PATH`] (anonymously: see [`cluster`]): down after one failure
/// (a refused or reset connection, a timeout of a second, or an answer outside
/// [`READY_STATUSES`]), up again after one success. A peer cut off from this node (while it
/// still renews its Lease, so it is not departed) is out of its sets within two seconds (the
/// next check, then its timeout), before the HTTP/2 PINGs end the requests in flight on it, so
/// their retries find it out and answer at once instead of waiting on a connect to it
/// (`tests/compose/silent-peer`: with two failures the check needed up to 4 s and a request
/// sent at the cut up to 5.2 s). One slow `/readyz` (over a second: kube-apiserver's own etcd
/// check takes up to 2 s when etcd is slow) takes a peer out for a second: its requests go to
/// another peer serving the same or get a 503 with `Retry-After`; requests in flight on it
/// are left alone.
fn local_health_check() -> HealthCheck {
    HealthCheck {
        timeout: seconds(1),
        interval: seconds(1),
        // The default (60 s) would apply to a cluster no request has used yet.
        no_traffic_interval: seconds(1),
        unhealthy_threshold: u32v(1),
        healthy_threshold: u32v(1),
        health_checker: Some(health_check::HealthChecker::HttpHealthCheck(
            health_check::HttpHealthCheck {
                path: HEALTH_CHECK_PATH.to_string(),
                expected_statuses: READY_STATUSES
                    .iter()
                    .map(|&(start, end)| Int64Range { start, end })
                    .collect(),
                ..Default::default()
            },
        )),
        ..Default::default()
    }
}

/// The transport socket a proxy-identity cluster's health checks use (no client certificate),
/// and the criteria that select it: only health checks ask for it, no endpoint's metadata does.
const HEALTH_CHECK_SOCKET: &str = "health-check";

/// One field: prost encodes it deterministically, so the content hash stays stable.
fn health_check_socket_criteria() -> Struct {
    Struct {
        fields: HashMap::from([(
            "skewgate.health_check".to_string(),
            Value {
                kind: Some(Kind::BoolValue(true)),
            },
        )]),
    }
}

/// A departed apiserver's readiness, as [`local_health_check`] judges it (a refused, reset or
/// timed-out connection, or an answer outside [`READY_STATUSES`]: not ready),
/// every [`DEPARTED_CHECK_INTERVAL`], ready or not: one that was ready and restarts must be
/// seen not ready before requests reach it half started; not ready after one failure, ready
/// after one success.
fn departed_health_check() -> HealthCheck {
    let every = Some(proto_duration(DEPARTED_CHECK_INTERVAL));
    HealthCheck {
        timeout: seconds(1),
        interval: every,
        // The defaults (60 s) apply to a cluster no request has used yet: most departed
        // clusters until someone asks for what the apiserver retained.
        no_traffic_interval: every,
        no_traffic_healthy_interval: every,
        unhealthy_threshold: u32v(1),
        healthy_threshold: u32v(1),
        ..local_health_check()
    }
}

/// A peer endpoint's metadata: the loop guard's value for failover clusters.
fn peer_metadata() -> Metadata {
    Metadata {
        filter_metadata: HashMap::from([(
            METADATA_NAMESPACE.to_string(),
            Struct {
                fields: HashMap::from([(
                    PEER_PROXIED_KEY.to_string(),
                    Value {
                        kind: Some(Kind::StringValue("true".to_string())),
                    },
                )]),
            },
        )]),
        ..Default::default()
    }
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
    role: Role,
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
            metadata: (role == Role::Peer).then(peer_metadata),
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
                // neither answers nor resets: a PING every second, and a connection that has not
                // answered one within a second is closed, so the requests on it fail within
                // about two seconds (the safe ones are retried on another peer) instead of
                // waiting out the request timeout, and its watches end for their clients to
                // start again. An apiserver answers PINGs from its connection's read loop,
                // whatever its requests are doing: a slow LIST is not silence.
                connection_keepalive: Some(keepalive()),
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
    let mut health_checks = match role {
        Role::Local | Role::Peer => vec![local_health_check()],
        Role::Departed => vec![departed_health_check()],
    };
    // A health check presents no client certificate: the proxy-client certificate without the
    // X-Remote-User header authenticates nobody, and kube-apiserver logs "Unable to
    // authenticate the request" for each such request (every second, per cluster). Without a
    // certificate `/readyz` is an anonymous request, as the kubelet's probes are.
    let mut transport_socket_matches = Vec::new();
    if let (UpstreamAuth::ProxyIdentity, Some(dir), false) =
        (auth, upstream_sds, health_checks.is_empty())
    {
        transport_socket_matches.push(TransportSocketMatch {
            name: HEALTH_CHECK_SOCKET.to_string(),
            r#match: Some(health_check_socket_criteria()),
            transport_socket: Some(upstream_transport_socket(dir, UpstreamAuth::Anonymous)?),
        });
        for check in &mut health_checks {
            check.transport_socket_match_criteria = Some(health_check_socket_criteria());
        }
    }
    Ok(Cluster {
        name: name.to_string(),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(discovery_type as i32)),
        connect_timeout: match role {
            Role::Departed => Some(proto_duration(DEPARTED_CONNECT_TIMEOUT)),
            // A peer is another control-plane node: a connect takes milliseconds, and a
            // request whose connection a silent peer's PINGs ended (two seconds) waits on a
            // new connect to it until its health check has failed. A lost SYN (retransmitted
            // after a second) fails the connect, which is retried (`connect-failure`).
            Role::Peer => seconds(1),
            Role::Local => seconds(2),
        },
        lb_policy: LbPolicy::RoundRobin as i32,
        load_assignment: Some(ClusterLoadAssignment {
            cluster_name: name.to_string(),
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints,
                ..Default::default()
            }],
            ..Default::default()
        }),
        circuit_breakers: Some(circuit_breakers()),
        health_checks,
        transport_socket_matches,
        // A peer or a departed apiserver that is not ready, or silent, gets nothing: Envoy's
        // default (a panic threshold of 50 %) would send requests to it anyway once none of
        // the set is healthy. A request whose only servers are all silent then gets Envoy's
        // `no_healthy_upstream` at once, which the filter answers 503 with `Retry-After` (it
        // reached no apiserver). The local apiserver keeps the default: its cluster is the
        // last resort for what only it serves.
        common_lb_config: (role != Role::Local).then(|| CommonLbConfig {
            healthy_panic_threshold: Some(Percent { value: 0.0 }),
            ..Default::default()
        }),
        // HTTP/1.1 connections (the `-anonymous` variant, WebSocket and SPDY upgrades) have no
        // PINGs: the kernel's probes find a silent apiserver after 5 s of silence, 3 probes a
        // second apart.
        upstream_connection_options: Some(UpstreamConnectionOptions {
            tcp_keepalive: Some(TcpKeepalive {
                keepalive_time: u32v(5),
                keepalive_interval: u32v(1),
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

/// Which build of the filter Envoy runs (`--data-plane`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum DataPlane {
    /// The proxy-wasm filter (`skewgate_filter.wasm`) in Envoy's V8 sandbox: portable, and a
    /// crash is the VM's, replaced for the next request.
    #[default]
    Wasm,
    /// The Envoy 1.40 dynamic module (`libskewgate_native.so`) in Envoy's own process: the
    /// same core at Envoy's speed, without a sandbox (a crash is Envoy's), and only for the
    /// Envoy version it was built for.
    Native,
}

impl DataPlane {
    /// The type of the filter's ECDS resource.
    pub fn type_url(self) -> &'static str {
        match self {
            DataPlane::Wasm => WASM_TYPE_URL,
            DataPlane::Native => DYNAMIC_MODULE_TYPE_URL,
        }
    }

    /// Its `--data-plane` value.
    pub fn name(self) -> &'static str {
        match self {
            DataPlane::Wasm => "wasm",
            DataPlane::Native => "native",
        }
    }

    /// The flag that names this data plane's file.
    pub fn path_flag(self) -> &'static str {
        match self {
            DataPlane::Wasm => "--wasm",
            DataPlane::Native => "--native-module",
        }
    }
}

/// The filter's code as Envoy loads it: the data plane and its file on the Envoy host (Envoy
/// reads it; it is not sent over xDS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterCode {
    pub data_plane: DataPlane,
    path: String,
}

impl FilterCode {
    /// A path Envoy's configuration can carry: UTF-8, not empty, no control characters.
    pub fn new(data_plane: DataPlane, path: &Path) -> Result<Self, EnvoyError> {
        let what = match data_plane {
            DataPlane::Wasm => "the wasm path",
            DataPlane::Native => "the native module path",
        };
        let text = path.to_str().ok_or(EnvoyError::Unsafe(what))?;
        if text.is_empty() || text.chars().any(char::is_control) {
            return Err(EnvoyError::Unsafe(what));
        }
        Ok(FilterCode {
            data_plane,
            path: text.to_string(),
        })
    }

    pub fn path(&self) -> &str {
        &self.path
    }
}

/// The filter configuration as the ECDS resource named like the HTTP filter, for either data
/// plane, with the same filter configuration (`configuration_json`, a
/// `google.protobuf.StringValue`; the filter parses and validates it, and a refusal is a NACK).
pub fn filter_extension_config(
    code: &FilterCode,
    configuration_json: &str,
) -> TypedExtensionConfig {
    let configuration = Some(pack_any(StringValue {
        value: configuration_json.to_string(),
    }));
    let local_file = |path: &str| AsyncDataSource {
        specifier: Some(async_data_source::Specifier::Local(DataSource {
            specifier: Some(data_source::Specifier::Filename(path.to_string())),
            ..Default::default()
        })),
    };
    let typed_config = match code.data_plane {
        DataPlane::Wasm => pack_any(Wasm {
            config: Some(PluginConfig {
                name: FILTER_NAME.to_string(),
                // A crashed VM is replaced for the next request; until then requests fail
                // rather than bypass the header hygiene.
                failure_policy: FailurePolicy::FailReload as i32,
                vm: Some(Vm::VmConfig(VmConfig {
                    vm_id: VM_ID.to_string(),
                    runtime: WASM_RUNTIME.to_string(),
                    code: Some(local_file(code.path())),
                    ..Default::default()
                })),
                configuration,
                ..Default::default()
            }),
        }),
        DataPlane::Native => pack_any(DynamicModuleFilter {
            dynamic_module_config: Some(DynamicModuleConfig {
                module: Some(local_file(code.path())),
                // The module keeps no state across loads worth unloading for; an unload under
                // a stream still running would be a crash.
                do_not_close: true,
                // The proxy-wasm filter's namespace: the same stat names, the same tags
                // (`stats_config`), the same Prometheus names.
                metrics_namespace: NATIVE_METRICS_NAMESPACE.to_string(),
                ..Default::default()
            }),
            filter_name: FILTER_NAME.to_string(),
            filter_config: configuration,
            ..Default::default()
        }),
    };
    TypedExtensionConfig {
        name: FILTER_NAME.to_string(),
        typed_config: Some(typed_config),
    }
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

    /// Both data planes get the same filter configuration; the native one as the dynamic
    /// module at its path, never unloaded, its metrics in the proxy-wasm filter's namespace.
    #[test]
    fn the_native_filter_gets_the_same_configuration_as_a_dynamic_module() {
        use envoy_types::pb::google::protobuf::StringValue;
        let json = r#"{"schema":1}"#;
        let code = FilterCode::new(DataPlane::Native, Path::new("/opt/libskewgate_native.so"))
            .expect("path");
        let ext = filter_extension_config(&code, json);
        assert_eq!(ext.name, FILTER_NAME);
        let any = ext.typed_config.expect("typed");
        assert_eq!(any.type_url, DYNAMIC_MODULE_TYPE_URL);
        assert_eq!(any.type_url, DataPlane::Native.type_url());
        let filter = DynamicModuleFilter::decode(any.value.as_slice()).expect("decodes");
        assert_eq!(filter.filter_name, FILTER_NAME);
        let module = filter.dynamic_module_config.expect("module");
        assert!(module.do_not_close);
        assert_eq!(module.metrics_namespace, NATIVE_METRICS_NAMESPACE);
        let Some(async_data_source::Specifier::Local(DataSource {
            specifier: Some(data_source::Specifier::Filename(path)),
            ..
        })) = module.module.and_then(|m| m.specifier)
        else {
            panic!("a local file");
        };
        assert_eq!(path, "/opt/libskewgate_native.so");
        let config = StringValue::decode(filter.filter_config.expect("config").value.as_slice())
            .expect("a string");
        assert_eq!(config.value, json);

        let wasm = filter_extension_config(&crate::test_fixtures::wasm_code("/x.wasm"), json);
        assert_eq!(wasm.typed_config.expect("typed").type_url, WASM_TYPE_URL);
    }

    #[test]
    fn resources_carry_the_documented_settings() {
        let world = World::new();
        let p = plan(&[("x.io", "v1", "widgets")], &[]);
        let snap = world.snapshot(&p);
        let b = UpstreamAuth::Token.cluster(&routing::peer_cluster_name(&["b"]));
        let cluster =
            Cluster::decode(snap.clusters[&b].resource.value.as_slice()).expect("cluster");
        assert_eq!(cluster.name, b);
        assert_eq!(cluster.connect_timeout, seconds(1));
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
            Role::Peer,
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
                filter_code: &crate::test_fixtures::wasm_code("/opt/skewgate.wasm"),
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
                            path: "/var/lib/skewgate/sds/skewgate-proxy-client.yaml".into(),
                            ..Default::default()
                        }))
                    );
                } else {
                    assert!(
                        common.tls_certificate_sds_secret_configs.is_empty(),
                        "{name}"
                    );
                }
                // Every apiserver's cluster is health checked (a silent peer is out within
                // about two seconds), and its checks present no certificate (kube-apiserver
                // would log every certificate-only request as a failed authentication): an
                // -identity cluster checks through a second socket, the anonymous one, which
                // only its health check selects.
                assert_eq!(cluster.health_checks.len(), 1, "{name}");
                let check = &cluster.health_checks[0];
                assert_eq!(
                    (check.interval, check.timeout, check.unhealthy_threshold),
                    (seconds(1), seconds(1), u32v(1)),
                    "{name}"
                );
                // A peer that is not ready or silent gets nothing, even when none of its set is
                // left; the local apiserver stays the last resort for what only it serves.
                let panic = cluster
                    .common_lb_config
                    .as_ref()
                    .and_then(|c| c.healthy_panic_threshold.as_ref())
                    .map(|p| p.value);
                assert_eq!(panic, (base != LOCAL_CLUSTER).then_some(0.0), "{name}");
                // PINGs every second, a second to answer; TCP keepalive for HTTP/1.1.
                if auth != UpstreamAuth::Anonymous {
                    let options = &cluster.typed_extension_protocol_options[HTTP_PROTOCOL_OPTIONS];
                    let options =
                        HttpProtocolOptions::decode(options.value.as_slice()).expect("options");
                    let Some(UpstreamProtocolOptions::UseDownstreamProtocolConfig(d)) =
                        options.upstream_protocol_options
                    else {
                        panic!("{name}: the client's protocol");
                    };
                    assert_eq!(
                        d.http2_protocol_options
                            .and_then(|h| h.connection_keepalive),
                        Some(keepalive()),
                        "{name}"
                    );
                }
                let keep = cluster
                    .upstream_connection_options
                    .as_ref()
                    .and_then(|o| o.tcp_keepalive.as_ref())
                    .expect("TCP keepalive");
                assert_eq!(
                    (
                        keep.keepalive_time,
                        keep.keepalive_interval,
                        keep.keepalive_probes
                    ),
                    (u32v(5), u32v(1), u32v(3)),
                    "{name}"
                );
                if auth == UpstreamAuth::ProxyIdentity {
                    assert_eq!(cluster.transport_socket_matches.len(), 1, "{name}");
                    let m = &cluster.transport_socket_matches[0];
                    assert_eq!(m.r#match, Some(health_check_socket_criteria()));
                    assert_eq!(
                        m.transport_socket,
                        Some(
                            upstream_transport_socket(sds_dir, UpstreamAuth::Anonymous)
                                .expect("socket")
                        )
                    );
                    for check in &cluster.health_checks {
                        assert_eq!(
                            check.transport_socket_match_criteria,
                            Some(health_check_socket_criteria())
                        );
                    }
                } else {
                    assert!(cluster.transport_socket_matches.is_empty(), "{name}");
                    assert!(cluster
                        .health_checks
                        .iter()
                        .all(|c| c.transport_socket_match_criteria.is_none()));
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
            filter_code: &crate::test_fixtures::wasm_code("/x.wasm"),
            local: &world.local,
            peers: &world.peers,
            upstream_sds: None,
        };
        assert!(matches!(
            Snapshot::from_plan(&p, &inputs),
            Err(EnvoyError::UnknownPeer(id)) if id == "nobody"
        ));
        for data_plane in [DataPlane::Wasm, DataPlane::Native] {
            for path in ["/x\n.so", ""] {
                assert!(matches!(
                    FilterCode::new(data_plane, Path::new(path)),
                    Err(EnvoyError::Unsafe(_))
                ));
            }
        }
    }

    /// The failover clusters: an aggregate of the local apiserver's cluster and the peers' of
    /// the same variant, adding the loop guard from the chosen endpoint's metadata, which only
    /// peer endpoints carry; the local apiserver's clusters are health checked.
    #[test]
    fn failover_clusters_try_the_local_apiserver_first_then_the_peers() {
        let world = World::new();
        let p = plan(&[("x.io", "v1", "widgets")], &[]);
        let snap = world.snapshot(&p);
        // Every live peer: b and c (c serves nothing, but it is live).
        let all = routing::failover_cluster_name(&["b", "c"]);
        let peers = routing::peer_cluster_name(&["b", "c"]);
        assert_eq!(p.config.failover_all.as_deref(), Some(all.as_str()));
        for auth in UpstreamAuth::ALL {
            let cluster = decode_cluster(&snap, &auth.cluster(&all));
            let Some(ClusterDiscoveryType::ClusterType(custom)) = &cluster.cluster_discovery_type
            else {
                panic!("a custom cluster type");
            };
            assert_eq!(custom.name, "envoy.clusters.aggregate");
            let members = AggregateConfig::decode(
                custom
                    .typed_config
                    .as_ref()
                    .expect("config")
                    .value
                    .as_slice(),
            )
            .expect("aggregate");
            assert_eq!(
                members.clusters,
                [auth.cluster(LOCAL_CLUSTER), auth.cluster(&peers)],
                "the local apiserver first"
            );
            assert_eq!(cluster.lb_policy, LbPolicy::ClusterProvided as i32);
            assert_eq!(
                cluster
                    .circuit_breakers
                    .as_ref()
                    .expect("breakers")
                    .thresholds[0]
                    .max_retries,
                u32v(1000)
            );
            let options = HttpProtocolOptions::decode(
                cluster.typed_extension_protocol_options[HTTP_PROTOCOL_OPTIONS]
                    .value
                    .as_slice(),
            )
            .expect("options");
            let names: Vec<&str> = options
                .http_filters
                .iter()
                .map(|f| f.name.as_str())
                .collect();
            assert_eq!(
                names,
                [
                    "envoy.filters.http.header_mutation",
                    "envoy.filters.http.upstream_codec"
                ]
            );
            let Some(http_filter::ConfigType::TypedConfig(any)) =
                &options.http_filters[0].config_type
            else {
                panic!("typed config");
            };
            let mutation = HeaderMutationFilter::decode(any.value.as_slice()).expect("mutation");
            let Some(MutationAction::Append(append)) =
                &mutation.mutations.expect("mutations").request_mutations[0].action
            else {
                panic!("an append");
            };
            let header = append.header.as_ref().expect("header");
            assert_eq!(header.key, "x-kubernetes-peer-proxied");
            assert_eq!(header.value, "%UPSTREAM_METADATA(skewgate:peer_proxied)%");
            // The peer cluster it falls back to exists.
            assert!(snap.clusters.contains_key(&auth.cluster(&peers)));

            // The local apiserver's cluster is health checked on /readyz; its endpoint
            // carries no loop guard, the peers' do.
            let local = decode_cluster(&snap, &auth.cluster(LOCAL_CLUSTER));
            assert_eq!(local.health_checks.len(), 1);
            let Some(health_check::HealthChecker::HttpHealthCheck(http)) =
                &local.health_checks[0].health_checker
            else {
                panic!("an HTTP health check");
            };
            assert_eq!(http.path, "/readyz");
            assert_eq!(
                http.expected_statuses,
                [
                    Int64Range {
                        start: 200,
                        end: 403
                    },
                    Int64Range {
                        start: 404,
                        end: 500
                    }
                ]
            );
            let metadata = |c: &Cluster| {
                c.load_assignment.as_ref().expect("endpoints").endpoints[0].lb_endpoints[0]
                    .metadata
                    .clone()
            };
            assert_eq!(metadata(&local), None);
            let peer = decode_cluster(&snap, &auth.cluster(&peers));
            assert_eq!(peer.health_checks, local.health_checks);
            assert_eq!(metadata(&peer), Some(peer_metadata()));
        }
    }
}
