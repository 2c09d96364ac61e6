//! The Envoy bootstrap of both modes, built as Envoy's own protobuf message and serialised once,
//! as YAML (`envoy -c <file>.yaml` reads it; `envoy::yaml`).
//!
//! Nothing here is text: every value (the node id, an address, a path, and above all the filter
//! configuration of the fallback, which holds strings from apiservers' discovery, Leases and
//! files) is a protobuf field, so no value can change the structure around it, whatever it
//! contains. [`Bootstrap::render`] decodes what it encoded and checks it before anyone writes
//! it. The clusters and the filter's extension entry are those of the live resources
//! ([`super::resources`]): one renderer per Envoy setting, whichever way it reaches Envoy.
//!
//! What is in it, each with the reason why:
//! - the listener clients connect to ([`Bootstrap::listen`]), its TLS, its HTTP connection
//!   manager and route table, and the HTTP filter chain (`/readyz`'s health check for the drain,
//!   [`super::drain`]; skewgate's filter, whose configuration comes over ECDS; the router);
//! - optionally the overload manager that draws kube-apiserver's GOAWAY chance
//!   ([`super::goaway`]);
//! - optionally the L4 peer port ([`PeerPassthrough`]);
//! - the admin interface ([`crate::local_channels`]);
//! - where the clusters (CDS) and the filter configuration (ECDS) come from ([`ConfigSource`]:
//!   the control plane's ADS stream, or files beside the bootstrap), and in the live mode how
//!   long Envoy waits for them before it serves its fallback ([`super::fallback`]).

use std::path::Path;
use std::time::Duration;

use envoy_types::pb::envoy::config::bootstrap::v3::{
    bootstrap, custom_inline_header::InlineHeaderType, Admin, Bootstrap as EnvoyBootstrap,
    CustomInlineHeader,
};
use envoy_types::pb::envoy::config::cluster::v3::{
    cluster::{ClusterDiscoveryType, DiscoveryType},
    Cluster, UpstreamConnectionOptions,
};
use envoy_types::pb::envoy::config::core::v3::{
    address, api_config_source::ApiType, config_source::ConfigSourceSpecifier, data_source,
    grpc_service, socket_address, socket_option, transport_socket, Address as EnvoyAddress,
    AggregatedConfigSource, ApiConfigSource, ApiVersion, BackoffStrategy, CidrRange,
    ConfigSource as ProtoConfigSource, DataSource, ExtensionConfigSource, GrpcService,
    Http2ProtocolOptions, HttpProtocolOptions as CoreHttpProtocolOptions, KeepaliveSettings, Node,
    PathConfigSource, Pipe, RetryPolicy as CoreRetryPolicy, SocketAddress, SocketOption,
    TcpKeepalive, TransportSocket,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    lb_endpoint::HostIdentifier, ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints,
};
use envoy_types::pb::envoy::config::listener::v3::{filter, Filter, FilterChain, Listener};
use envoy_types::pb::envoy::config::metrics::v3::{tag_specifier, StatsConfig, TagSpecifier};
use envoy_types::pb::envoy::config::rbac::v3::{
    permission, principal, rbac, Permission, Policy, Principal, Rbac as RbacRules,
};
use envoy_types::pb::envoy::config::route::v3::{
    header_matcher::HeaderMatchSpecifier, retry_policy::RetryHostPredicate, route,
    route_action::ClusterSpecifier, route_match::PathSpecifier, DirectResponseAction,
    HeaderMatcher, RetryPolicy, Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost,
};
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager::{
        CodecType, ForwardClientCertDetails, PathWithEscapedSlashesAction, RouteSpecifier,
        SetCurrentClientCertDetails, UpgradeConfig,
    },
    http_filter, HttpConnectionManager, HttpFilter,
};
use envoy_types::pb::envoy::extensions::filters::network::rbac::v3::Rbac;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{tcp_proxy, TcpProxy};
use envoy_types::pb::envoy::extensions::retry::host::previous_hosts::v3::PreviousHostsPredicate;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    common_tls_context::ValidationContextType, CommonTlsContext, DownstreamTlsContext,
};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::{
    http_protocol_options::{
        explicit_http_config::ProtocolConfig, ExplicitHttpConfig, UpstreamProtocolOptions,
    },
    HttpProtocolOptions,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{string_matcher::MatchPattern, StringMatcher};
use envoy_types::pb::google::protobuf::{BoolValue, Duration as ProtoDuration, UInt32Value};
use envoy_types::util::pack_any;
#[cfg(test)]
use prost::Message;

use super::fallback::{self, FallbackInputs, Waits, MIN_WAIT};
use super::goaway::GoawayFile;
use super::resources::{
    envoy_address, proto_duration, DYNAMIC_MODULE_TYPE_URL, HTTP_PROTOCOL_OPTIONS, WASM_TYPE_URL,
};
use super::secrets::{sds_secret_config, CLIENT_CA_SECRET, SERVING_SECRET};
use super::{checked_path, Address, EnvoyError, FILTER_NAME};
use crate::envoy::dialect::node_metadata;
use crate::local_channels::{LocalChannel, SOCKET_MODE};
use skewgate_core::config::FilterDialect;

/// The listener clients connect to, and its route table and virtual host.
pub const LISTENER_NAME: &str = "apiserver";
/// The L4 peer port's listener.
pub const PEER_LISTENER_NAME: &str = "peer";
/// The cluster behind the peer port: the apiserver this Envoy fronts.
pub const PASSTHROUGH_CLUSTER: &str = "skewgate-local-passthrough";
/// The control plane beside this Envoy (live mode).
pub const CONTROL_PLANE_CLUSTER: &str = "skewgate-control";
/// The header the filter writes its routing decision into: the cluster to use.
pub const UPSTREAM_CLUSTER_HEADER: &str = "x-skewgate-upstream-cluster";
/// The header the filter sets to `unbounded` on long-running requests (no route timeout).
pub const REQUEST_CLASS_HEADER: &str = "x-skewgate-request-class";
/// The body of the catch-all route: a request the filter did not route.
const NOT_ROUTED_STATUS: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the request was not routed by the skewgate filter","reason":"ServiceUnavailable","code":503}"#;

/// Where Envoy gets its clusters (CDS) and the filter configuration (ECDS).
#[derive(Debug, Clone, Copy)]
pub enum ConfigSource<'a> {
    /// The live mode: one delta ADS stream from the control plane beside Envoy, on this
    /// channel ([`crate::local_channels`]).
    Ads { xds: &'a LocalChannel },
    /// The static mode: files in this directory ([`crate::xds::files`]), which Envoy reads at
    /// start and re-reads when they are replaced.
    Files { dir: &'a Path },
}

/// What the bootstrap needs.
#[derive(Debug, Clone)]
pub struct Bootstrap<'a> {
    pub listen: &'a Address,
    /// Envoy's admin interface: a Unix socket Envoy creates with mode 0600, or loopback TCP.
    pub admin: &'a LocalChannel,
    pub config_source: ConfigSource<'a>,
    /// This Envoy's node id (for the control plane's logs).
    pub node_id: &'a str,
    /// The apiservers' `--request-timeout`: Envoy bounds non-long-running requests by
    /// [`super::REQUEST_TIMEOUT_MARGIN`] more ([`super::route_timeout::of`]).
    pub request_timeout: Duration,
    /// TLS for clients; `None` serves plaintext (tests and demos on loopback only).
    pub serving: Option<&'a super::ServingTls>,
    /// Where the SDS files of [`Bootstrap::serving`] are (absolute; written with
    /// [`super::secrets::serving_secrets`] and [`crate::xds::files::write_secrets`]). Needed
    /// with `serving`.
    pub sds_dir: Option<&'a Path>,
    /// The L4 peer port, if any.
    pub peer: Option<PeerPassthrough<'a>>,
    /// What Envoy serves when the control plane has not configured it within a bounded wait
    /// (live mode only); `None`: it waits for as long as it takes, its ports closed.
    pub fallback: Option<FallbackInputs<'a>>,
    /// The GOAWAY chance's file and the configured chance ([`super::goaway`]); `None`: no
    /// overload manager (no socket directory to keep the file in).
    pub goaway: Option<GoawayFile<'a>>,
}

/// The peer port: TLS passed through at L4 to the apiserver this Envoy fronts, so peers reach
/// the apiserver itself (docs/ARCHITECTURE.md "Deployment topology").
#[derive(Debug, Clone, Copy)]
pub struct PeerPassthrough<'a> {
    /// Where Envoy listens for peers (the peer-advertise address).
    pub listen: &'a Address,
    /// Where the apiserver listens (`127.0.0.1:6443` when it binds loopback).
    pub apiserver: &'a Address,
    /// Who may connect: the other control-plane nodes (never empty).
    pub allowed_sources: &'a [ipnet::IpNet],
}

fn bool_value(value: bool) -> Option<BoolValue> {
    Some(BoolValue { value })
}

fn u32_value(value: u32) -> Option<UInt32Value> {
    Some(UInt32Value { value })
}

fn seconds(seconds: i64) -> Option<ProtoDuration> {
    Some(ProtoDuration { seconds, nanos: 0 })
}

/// SO_KEEPALIVE (SOL_SOCKET) on accepted connections: watches and exec sessions can be silent
/// for a long time, and dead clients must not pin upstream streams forever.
fn keepalive_socket_option() -> SocketOption {
    SocketOption {
        level: 1, // SOL_SOCKET
        name: 9,  // SO_KEEPALIVE
        value: Some(socket_option::Value::IntValue(1)),
        state: socket_option::SocketState::StatePrebind as i32,
        ..Default::default()
    }
}

/// A local channel as an Envoy address. `bind`: Envoy listens on it, and creates the socket
/// with mode [`SOCKET_MODE`] (only its own user and root may connect).
fn local_address(channel: &LocalChannel, bind: bool) -> Result<EnvoyAddress, EnvoyError> {
    Ok(match channel {
        LocalChannel::Unix(path) => EnvoyAddress {
            address: Some(address::Address::Pipe(Pipe {
                path: checked_path(path, "the socket path")?.to_string(),
                mode: if bind { SOCKET_MODE } else { 0 },
            })),
        },
        LocalChannel::Tcp(socket) => EnvoyAddress {
            address: Some(address::Address::SocketAddress(SocketAddress {
                address: socket.ip().to_string(),
                port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(
                    socket.port(),
                ))),
                ..Default::default()
            })),
        },
    })
}

/// A config source: the ADS stream, or one file of `dir`. Both speak the v3 API.
fn config_source(
    source: ConfigSource<'_>,
    file: &str,
    initial_fetch_timeout: Duration,
) -> Result<ProtoConfigSource, EnvoyError> {
    let specifier = match source {
        ConfigSource::Ads { .. } => ConfigSourceSpecifier::Ads(AggregatedConfigSource {}),
        ConfigSource::Files { dir } => {
            let dir = checked_path(dir, "the configuration directory")?;
            ConfigSourceSpecifier::PathConfigSource(PathConfigSource {
                path: format!("{}/{file}", dir.trim_end_matches('/')),
                ..Default::default()
            })
        }
    };
    Ok(ProtoConfigSource {
        resource_api_version: ApiVersion::V3 as i32,
        config_source_specifier: Some(specifier),
        initial_fetch_timeout: Some(proto_duration(initial_fetch_timeout)),
        ..Default::default()
    })
}

/// The listener's TLS: the apiserver's own serving certificate (clients verify Envoy as the
/// apiserver), ALPN h2 and http/1.1 like kube-apiserver, and with a client CA, client
/// certificates requested but optional (token and anonymous clients present none) and verified
/// against it; a presented certificate that does not verify fails the handshake. The
/// certificate, key and client CA come through SDS from the files in `sds_dir`
/// ([`super::secrets`]), which Envoy watches: a renewal takes effect without a restart.
fn downstream_tls(
    serving: &super::ServingTls,
    sds_dir: Option<&Path>,
) -> Result<TransportSocket, EnvoyError> {
    let dir = sds_dir.ok_or(EnvoyError::NoSdsDir)?;
    let validation_context_type = serving
        .client_ca_file
        .as_ref()
        .map(|_| sds_secret_config(dir, CLIENT_CA_SECRET))
        .transpose()?
        .map(ValidationContextType::ValidationContextSdsSecretConfig);
    let context = DownstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            alpn_protocols: vec!["h2".into(), "http/1.1".into()],
            tls_certificate_sds_secret_configs: vec![sds_secret_config(dir, SERVING_SECRET)?],
            validation_context_type,
            ..Default::default()
        }),
        // Optional, as on kube-apiserver.
        require_client_certificate: bool_value(false),
        ..Default::default()
    };
    Ok(TransportSocket {
        name: "envoy.transport_sockets.tls".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack_any(context))),
    })
}

/// What a route retries on: a request whose method is safe to repeat (GET and HEAD, so LIST
/// and WATCH too) also when the connection was reset after it was sent (it may have reached
/// the apiserver; repeating it elsewhere does no harm), any other only when it cannot have
/// been processed (the connection was never established, or was reset before the request
/// was sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Repeatable {
    Safe,
    Unsafe,
}

/// Where the filter sent a request, as far as retries care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// A set of peers that serve a resource the local apiserver does not
    /// ([`crate::routing::PEER_CLUSTER_PREFIX`]).
    Peers,
    /// The local apiserver, or a failover cluster (the local apiserver first).
    LocalFirst,
}

/// Fail over to another host (another peer serving the same resource) or, through a failover
/// cluster, from the local apiserver to the peers: up to twice, never to a host tried before
/// (`previous_hosts`), and never back to a priority tried before (`previous_priorities`: a
/// failover cluster's priority 0 is the local apiserver, 1 its peers; without it a retry picks
/// the local apiserver again). The back-off is short: these retries only follow failures that
/// took no apiserver time (Envoy's default 25 ms base added about 15 ms to every failover).
///
/// A request for a set of peers is retried on a 404 too, whatever its method: a peer that
/// restarted on another version answers `404 page not found` for what it served until its
/// control plane re-reads its discovery, while another peer of the set still serves it (the
/// rolling upgrade's avoidable 503s, BENCHMARKS.md). Envoy cannot tell that 404 from a missing
/// object's by status code, but no 404 changed anything on the apiserver, so repeating it is
/// safe; a missing object costs another peer's answer, and only for what the local apiserver
/// does not serve (a version skew). Not for the local apiserver: most 404s there are missing
/// objects, and a peer would only say so again.
fn retry_policy(repeatable: Repeatable, target: Target) -> RetryPolicy {
    use envoy_types::pb::envoy::config::route::v3::retry_policy::{
        retry_host_predicate, retry_priority, RetryBackOff, RetryPriority,
    };
    use envoy_types::pb::envoy::extensions::retry::priority::previous_priorities::v3::PreviousPrioritiesConfig;
    let mut retry_on = match repeatable {
        Repeatable::Safe => "connect-failure,reset",
        Repeatable::Unsafe => "connect-failure,reset-before-request",
    }
    .to_string();
    let mut retriable_status_codes = Vec::new();
    if target == Target::Peers {
        retry_on.push_str(",retriable-status-codes");
        retriable_status_codes.push(404);
    }
    RetryPolicy {
        retry_on,
        retriable_status_codes,
        num_retries: u32_value(2),
        retry_host_predicate: vec![RetryHostPredicate {
            name: "envoy.retry_host_predicates.previous_hosts".into(),
            config_type: Some(retry_host_predicate::ConfigType::TypedConfig(pack_any(
                PreviousHostsPredicate::default(),
            ))),
        }],
        host_selection_retry_max_attempts: 3,
        retry_priority: Some(RetryPriority {
            name: "envoy.retry_priorities.previous_priorities".into(),
            config_type: Some(retry_priority::ConfigType::TypedConfig(pack_any(
                PreviousPrioritiesConfig {
                    update_frequency: 1,
                },
            ))),
        }),
        retry_back_off: Some(RetryBackOff {
            base_interval: Some(ProtoDuration {
                seconds: 0,
                nanos: 1_000_000,
            }),
            max_interval: Some(ProtoDuration {
                seconds: 0,
                nanos: 10_000_000,
            }),
        }),
        ..Default::default()
    }
}

/// Requests whose method is safe to repeat: GET and HEAD.
fn safe_method() -> HeaderMatcher {
    use envoy_types::pb::envoy::r#type::matcher::v3::RegexMatcher;
    HeaderMatcher {
        name: ":method".into(),
        header_match_specifier: Some(HeaderMatchSpecifier::StringMatch(StringMatcher {
            match_pattern: Some(MatchPattern::SafeRegex(RegexMatcher {
                regex: "GET|HEAD".into(),
                ..Default::default()
            })),
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn header_present(name: &str) -> HeaderMatcher {
    HeaderMatcher {
        name: name.into(),
        header_match_specifier: Some(HeaderMatchSpecifier::PresentMatch(true)),
        ..Default::default()
    }
}

/// The filter chose a set of peers (any variant of a `skewgate-peers-` cluster).
fn peer_cluster() -> HeaderMatcher {
    HeaderMatcher {
        name: UPSTREAM_CLUSTER_HEADER.into(),
        header_match_specifier: Some(HeaderMatchSpecifier::StringMatch(StringMatcher {
            match_pattern: Some(MatchPattern::Prefix(
                crate::routing::PEER_CLUSTER_PREFIX.into(),
            )),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// A route to the cluster the filter chose, with `timeout` (zero: none). A bounded request
/// safe to repeat that went to a set of peers gets `try_idle` too
/// ([`super::route_timeout::peer_try_idle`]): a try its peer leaves unanswered that long is
/// repeated on another peer (the `reset` retry condition covers a try's timeout).
fn routed(
    mut headers: Vec<HeaderMatcher>,
    timeout: Duration,
    try_idle: Duration,
    repeatable: Repeatable,
    target: Target,
) -> Route {
    let mut retry = retry_policy(repeatable, target);
    if !timeout.is_zero() && repeatable == Repeatable::Safe && target == Target::Peers {
        retry.per_try_idle_timeout = Some(proto_duration(try_idle));
    }
    if repeatable == Repeatable::Safe {
        headers.push(safe_method());
    }
    if target == Target::Peers {
        headers.push(peer_cluster());
    }
    Route {
        r#match: Some(RouteMatch {
            path_specifier: Some(PathSpecifier::Prefix("/".into())),
            headers,
            ..Default::default()
        }),
        action: Some(route::Action::Route(RouteAction {
            cluster_specifier: Some(ClusterSpecifier::ClusterHeader(
                UPSTREAM_CLUSTER_HEADER.into(),
            )),
            timeout: Some(proto_duration(timeout)),
            retry_policy: Some(retry),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// The routes to the cluster the filter chose, most specific first: watches, exec, attach,
/// port-forward, logs and proxy (`unbounded`) have no route timeout, they stream for as long as
/// the apiserver keeps them; every other request gets one longer than the apiserver's own
/// `--request-timeout`, so a live apiserver's 504 Timeout Status wins and one that never
/// answers becomes a 503. Each in four variants: to a set of peers or local first
/// ([`Target`]), and safe to repeat or not ([`Repeatable`]).
fn routed_routes(unbounded: HeaderMatcher, request_timeout: Duration) -> Vec<Route> {
    let mut routes = Vec::with_capacity(8);
    for (class, timeout) in [
        (Some(unbounded), Duration::ZERO),
        (None, super::route_timeout::of(request_timeout)),
    ] {
        for target in [Target::Peers, Target::LocalFirst] {
            for repeatable in [Repeatable::Safe, Repeatable::Unsafe] {
                let headers = std::iter::once(header_present(UPSTREAM_CLUSTER_HEADER))
                    .chain(class.clone())
                    .collect();
                routes.push(routed(
                    headers,
                    timeout,
                    super::route_timeout::peer_try_idle(request_timeout),
                    repeatable,
                    target,
                ));
            }
        }
    }
    routes
}

/// The route table. The filter's routing decision travels in two internal headers (a client's
/// copies are stripped by the filter): [`UPSTREAM_CLUSTER_HEADER`] names the cluster (the local
/// apiserver or a set of peers, in the variant that matches how the request authenticates),
/// [`REQUEST_CLASS_HEADER`]`: unbounded` marks the requests kube-apiserver does not bound by its
/// `--request-timeout` (the rare long-running ones carry the header, so the common short
/// request costs one header write less). Neither reaches an apiserver, nor does the client
/// certificate's subject (the identity travels as X-Remote-User/X-Remote-Group).
fn route_config(request_timeout: Duration) -> RouteConfiguration {
    let unbounded = HeaderMatcher {
        name: REQUEST_CLASS_HEADER.into(),
        header_match_specifier: Some(HeaderMatchSpecifier::StringMatch(StringMatcher {
            match_pattern: Some(MatchPattern::Exact("unbounded".into())),
            ..Default::default()
        })),
        ..Default::default()
    };
    RouteConfiguration {
        name: LISTENER_NAME.into(),
        virtual_hosts: vec![VirtualHost {
            name: LISTENER_NAME.into(),
            domains: vec!["*".into()],
            request_headers_to_remove: vec![
                UPSTREAM_CLUSTER_HEADER.into(),
                REQUEST_CLASS_HEADER.into(),
                "x-forwarded-client-cert".into(),
            ],
            routes: routed_routes(unbounded, request_timeout)
                .into_iter()
                .chain([
                    // The filter routes every request it lets through; without its header a
                    // request has not been sanitised (the filter did not run), so it goes nowhere.
                    Route {
                        r#match: Some(RouteMatch {
                            path_specifier: Some(PathSpecifier::Prefix("/".into())),
                            ..Default::default()
                        }),
                        action: Some(route::Action::DirectResponse(DirectResponseAction {
                            status: 503,
                            body: Some(DataSource {
                                specifier: Some(data_source::Specifier::InlineString(
                                    NOT_ROUTED_STATUS.into(),
                                )),
                                ..Default::default()
                            }),
                            ..Default::default()
                        })),
                        ..Default::default()
                    },
                ])
                .collect(),
            ..Default::default()
        }],
        // Every cluster comes over CDS (or is a static fallback cluster), after this static
        // route table is loaded: do not check at load time that the clusters it names exist.
        // Requests cannot arrive before they do: the listener opens only with the first filter
        // configuration, which the control plane sends only after every cluster was
        // acknowledged (or the fallback, which names only static clusters).
        validate_clusters: bool_value(false),
        ..Default::default()
    }
}

/// The two headers every request is routed on, registered as Envoy's inline headers: Envoy then
/// finds them in a request in one step instead of comparing them with every header the client
/// sent, once per header matcher of every route it tries (BENCHMARKS.md, "Counted": the route
/// table's matchers were the largest part of a request's cost
/// in Envoy that the filter adds). Only a bootstrap can register them, for the whole process.
fn routing_inline_headers() -> Vec<CustomInlineHeader> {
    [UPSTREAM_CLUSTER_HEADER, REQUEST_CLASS_HEADER]
        .into_iter()
        .map(|name| CustomInlineHeader {
            inline_header_name: name.into(),
            inline_header_type: InlineHeaderType::RequestHeader as i32,
        })
        .collect()
}

/// The HTTP connection manager of the client listener.
fn http_connection_manager(
    request_timeout: Duration,
    filter_source: ProtoConfigSource,
    default_filter: Option<envoy_types::pb::google::protobuf::Any>,
) -> HttpConnectionManager {
    HttpConnectionManager {
        stat_prefix: LISTENER_NAME.into(),
        codec_type: CodecType::Auto as i32,
        // Every client is external: Envoy then strips client-sent x-envoy-* headers, so no
        // client can steer retries, timeouts or internal redirects.
        use_remote_address: bool_value(true),
        // The filter reads the verified client certificate's subject from
        // x-forwarded-client-cert, in the request headers it reads anyway (a property call per
        // request costs more, BENCHMARKS.md, "Per-request cost"). SANITIZE_SET: before any
        // filter runs, Envoy removes every client copy of that header and, on a connection that
        // presented a verified certificate, sets it to Hash=...;Subject="<RFC 2253 subject>"
        // (`skewgate_core::client_cert`). A client can never choose the subject.
        forward_client_cert_details: ForwardClientCertDetails::SanitizeSet as i32,
        set_current_client_cert_details: Some(SetCurrentClientCertDetails {
            subject: bool_value(true),
            ..Default::default()
        }),
        // Watches last up to an hour server-side (kube-apiserver --min-request-timeout, doubled
        // at random), exec and attach sessions can idle for longer, and kube-apiserver applies
        // its own request timeouts. A stream idle timeout would cut `kubectl logs -f`, quiet
        // watches and idle shells, so it is off; dead peers are found by TCP keepalive.
        stream_idle_timeout: seconds(0),
        request_timeout: seconds(0),
        // kube-apiserver accepts 1 MiB of request headers (Go's MaxHeaderBytes); OIDC tokens
        // and impersonation extras get large. Envoy's 60 KiB default would 431 them.
        max_request_headers_kb: u32_value(1024),
        common_http_protocol_options: Some(CoreHttpProtocolOptions {
            max_headers_count: u32_value(500),
            // Header names with underscores are dropped: `X_Remote_User` is not
            // `X-Remote-User` to the filter's hygiene, but servers that fold `_` into `-`
            // (CGI-style, some extension apiservers) would read it as one.
            headers_with_underscores_action:
                envoy_types::pb::envoy::config::core::v3::http_protocol_options::HeadersWithUnderscoresAction::DropHeader
                    as i32,
            // Idle client connections (no stream open) are closed after an hour.
            idle_timeout: seconds(3600),
            ..Default::default()
        }),
        // The path reaches the apiserver exactly as the client sent it, and the filter parses
        // it exactly as kube-apiserver does: no normalisation that could make the two disagree.
        normalize_path: bool_value(false),
        merge_slashes: false,
        path_with_escaped_slashes_action: PathWithEscapedSlashesAction::KeepUnchanged as i32,
        // kubectl >= 1.31 uses WebSockets for exec/attach/cp/port-forward; older clients use
        // SPDY/3.1. Envoy drops any Upgrade not listed here.
        upgrade_configs: ["websocket", "spdy/3.1"]
            .into_iter()
            .map(|upgrade_type| UpgradeConfig {
                upgrade_type: upgrade_type.into(),
                ..Default::default()
            })
            .collect(),
        route_specifier: Some(RouteSpecifier::RouteConfig(route_config(request_timeout))),
        http_filters: vec![
            // `/readyz` fails once the drain starts; until then it passes to the filter.
            super::drain::readyz_health_check_filter(),
            // The filter's configuration (the code, the VM and the routing table) comes as the
            // ECDS resource named exactly like this filter ([`super::resources`]). A
            // configuration the filter refuses is NACKed (live) or ignored (static): Envoy keeps
            // what it had.
            HttpFilter {
                name: FILTER_NAME.into(),
                config_type: Some(http_filter::ConfigType::ConfigDiscovery(
                    ExtensionConfigSource {
                        config_source: Some(filter_source),
                        default_config: default_filter,
                        // Either data plane: `run --data-plane` chooses, and switching it
                        // needs no new bootstrap.
                        type_urls: vec![WASM_TYPE_URL.into(), DYNAMIC_MODULE_TYPE_URL.into()],
                        ..Default::default()
                    },
                )),
                ..Default::default()
            },
            HttpFilter {
                name: "envoy.filters.http.router".into(),
                config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(Router {
                    // Apiservers gain nothing from x-envoy-expected-rq-timeout-ms and friends.
                    suppress_envoy_headers: true,
                    ..Default::default()
                }))),
                ..Default::default()
            },
        ],
        ..Default::default()
    }
}

/// The peer port (`skewgate-control bootstrap --peer-listen`): other apiservers' Envoys reach
/// this apiserver itself through it, so that the apiserver authenticates their proxy-client
/// certificate and the X-Remote-* headers it carries. TLS passes straight through at L4: no
/// termination, no filter, the apiserver sees the peer's own handshake. Only the other
/// control-plane nodes (`--peer-cidr`, judged on the connection's own source address) may
/// connect: a client reaching it could skip the header hygiene and the routing. Like every
/// listener it opens once the first filter configuration has arrived.
fn peer_listener(peer: &PeerPassthrough<'_>) -> Result<(Listener, Cluster), EnvoyError> {
    if peer.allowed_sources.is_empty() {
        return Err(EnvoyError::Unsafe("a peer port open to every source"));
    }
    let principals = peer
        .allowed_sources
        .iter()
        .map(|net| Principal {
            identifier: Some(principal::Identifier::DirectRemoteIp(CidrRange {
                address_prefix: net.network().to_string(),
                prefix_len: u32_value(u32::from(net.prefix_len())),
            })),
        })
        .collect();
    let rules = RbacRules {
        action: rbac::Action::Allow as i32,
        policies: [(
            "peers".to_string(),
            Policy {
                permissions: vec![Permission {
                    rule: Some(permission::Rule::Any(true)),
                }],
                principals,
                ..Default::default()
            },
        )]
        .into(),
        ..Default::default()
    };
    let filters = vec![
        Filter {
            name: "envoy.filters.network.rbac".into(),
            config_type: Some(filter::ConfigType::TypedConfig(pack_any(Rbac {
                stat_prefix: PEER_LISTENER_NAME.into(),
                rules: Some(rules),
                ..Default::default()
            }))),
        },
        Filter {
            name: "envoy.filters.network.tcp_proxy".into(),
            config_type: Some(filter::ConfigType::TypedConfig(pack_any(TcpProxy {
                stat_prefix: PEER_LISTENER_NAME.into(),
                cluster_specifier: Some(tcp_proxy::ClusterSpecifier::Cluster(
                    PASSTHROUGH_CLUSTER.into(),
                )),
                // Proxied watches and exec sessions can be quiet for a long time; TCP keepalive
                // finds dead ends instead.
                idle_timeout: seconds(0),
                ..Default::default()
            }))),
        },
    ];
    let listener = Listener {
        name: PEER_LISTENER_NAME.into(),
        address: Some(envoy_address(peer.listen)),
        socket_options: vec![keepalive_socket_option()],
        filter_chains: vec![FilterChain {
            filters,
            ..Default::default()
        }],
        ..Default::default()
    };
    let discovery_type = if peer.apiserver.is_ip() {
        DiscoveryType::Static
    } else {
        DiscoveryType::StrictDns
    };
    // Where the peer port goes: the apiserver this Envoy fronts (--local-apiserver-url).
    let cluster = Cluster {
        name: PASSTHROUGH_CLUSTER.into(),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(discovery_type as i32)),
        connect_timeout: seconds(2),
        load_assignment: Some(single_endpoint(
            PASSTHROUGH_CLUSTER,
            envoy_address(peer.apiserver),
        )),
        upstream_connection_options: Some(UpstreamConnectionOptions {
            tcp_keepalive: Some(TcpKeepalive {
                keepalive_time: u32_value(60),
                keepalive_interval: u32_value(10),
                keepalive_probes: u32_value(3),
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    Ok((listener, cluster))
}

fn single_endpoint(cluster: &str, address: EnvoyAddress) -> ClusterLoadAssignment {
    ClusterLoadAssignment {
        cluster_name: cluster.into(),
        endpoints: vec![LocalityLbEndpoints {
            lb_endpoints: vec![LbEndpoint {
                host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
                    address: Some(address),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// The control plane beside this Envoy: one gRPC connection carrying ADS, on the Unix socket
/// `--socket-dir/xds.sock` (mode 0600: no other user can serve or read this Envoy's
/// configuration there), or loopback TCP with `--insecure-tcp-local-channels`. gRPC needs
/// HTTP/2; the keepalive finds a control plane that hung without closing the connection, and
/// Envoy then reconnects and keeps serving with what it holds meanwhile.
fn control_plane_cluster(xds: &LocalChannel) -> Result<Cluster, EnvoyError> {
    let options = HttpProtocolOptions {
        upstream_protocol_options: Some(UpstreamProtocolOptions::ExplicitHttpConfig(
            ExplicitHttpConfig {
                protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(Http2ProtocolOptions {
                    connection_keepalive: Some(KeepaliveSettings {
                        interval: seconds(30),
                        timeout: seconds(10),
                        ..Default::default()
                    }),
                    ..Default::default()
                })),
            },
        )),
        ..Default::default()
    };
    Ok(Cluster {
        name: CONTROL_PLANE_CLUSTER.into(),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32)),
        connect_timeout: seconds(1),
        load_assignment: Some(single_endpoint(
            CONTROL_PLANE_CLUSTER,
            local_address(xds, false)?,
        )),
        typed_extension_protocol_options: [(HTTP_PROTOCOL_OPTIONS.to_string(), pack_any(options))]
            .into(),
        ..Default::default()
    })
}

/// Delta ADS: only changed resources travel, and a reconnecting Envoy reports the versions it
/// holds (`initial_resource_versions`), so a control-plane restart resyncs without a push. The
/// control plane is beside this Envoy: reconnect quickly after it restarts (the default backs
/// off up to 30 s); Envoy serves with its last configuration meanwhile.
fn ads_config() -> ApiConfigSource {
    ApiConfigSource {
        api_type: ApiType::DeltaGrpc as i32,
        transport_api_version: ApiVersion::V3 as i32,
        grpc_services: vec![GrpcService {
            target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(
                grpc_service::EnvoyGrpc {
                    cluster_name: CONTROL_PLANE_CLUSTER.into(),
                    retry_policy: Some(CoreRetryPolicy {
                        retry_back_off: Some(BackoffStrategy {
                            base_interval: Some(ProtoDuration {
                                seconds: 0,
                                nanos: 250_000_000,
                            }),
                            max_interval: seconds(5),
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            )),
            ..Default::default()
        }],
        set_node_on_first_message_only: true,
        ..Default::default()
    }
}

/// The filter's counters carry their labels in the stat name
/// (`apiserver_rerouted_request_total;code=200;group=apps;...`: proxy-wasm metrics have no
/// tags, `skewgate_core::metrics`). One regex per label makes each `;label=value` a tag again,
/// so `/stats/prometheus` shows upstream's names with real labels (Envoy strips the
/// `wasmcustom.` namespace and adds no `envoy_` prefix there). Only the filter's names contain
/// `;`; every label value is bounded by the filter configuration.
fn stats_config() -> StatsConfig {
    StatsConfig {
        stats_tags: skewgate_core::metrics::LABELS
            .iter()
            .map(|label| TagSpecifier {
                tag_name: (*label).to_string(),
                tag_value: Some(tag_specifier::TagValue::Regex(format!(
                    "(;{label}=([^;]*))"
                ))),
            })
            .collect(),
        ..Default::default()
    }
}

/// `a` with the fields of each struct of `more` added to `a`'s struct of the same key.
fn merge_metadata(
    mut a: envoy_types::pb::google::protobuf::Struct,
    more: impl IntoIterator<Item = envoy_types::pb::google::protobuf::Struct>,
) -> envoy_types::pb::google::protobuf::Struct {
    use envoy_types::pb::google::protobuf::value::Kind;
    for (key, value) in more.into_iter().flat_map(|b| b.fields) {
        match (a.fields.get_mut(&key), value.kind) {
            (
                Some(envoy_types::pb::google::protobuf::Value {
                    kind: Some(Kind::StructValue(into)),
                }),
                Some(Kind::StructValue(from)),
            ) => into.fields.extend(from.fields),
            (_, kind) => {
                a.fields
                    .insert(key, envoy_types::pb::google::protobuf::Value { kind });
            }
        }
    }
    a
}

impl Bootstrap<'_> {
    /// The bootstrap as Envoy's message.
    pub fn build(&self) -> Result<EnvoyBootstrap, EnvoyError> {
        let node_ok = !self.node_id.is_empty()
            && self.node_id.len() <= 253
            && self
                .node_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | ':'));
        if !node_ok {
            return Err(EnvoyError::Unsafe("the node id"));
        }
        let is_ads = matches!(self.config_source, ConfigSource::Ads { .. });
        let mut clusters = Vec::new();
        let (waits, default_filter) = match &self.fallback {
            None => (Waits::FOREVER, None),
            Some(fallback) => {
                if !is_ads {
                    return Err(EnvoyError::Fallback(
                        "the static mode has no control plane to wait for",
                    ));
                }
                if fallback.wait < MIN_WAIT {
                    return Err(EnvoyError::Fallback(
                        "the wait must be at least 2ms (0: no fallback)",
                    ));
                }
                let rendered = fallback::render(fallback)?;
                clusters.extend(rendered.clusters);
                (Waits::split(fallback.wait), Some(rendered.filter))
            }
        };
        let filter_source =
            config_source(self.config_source, super::files::FILTER_FILE, waits.filter)?;
        let transport_socket = self
            .serving
            .map(|serving| downstream_tls(serving, self.sds_dir))
            .transpose()?;
        let hcm = http_connection_manager(self.request_timeout, filter_source, default_filter);
        let mut listeners = vec![Listener {
            name: LISTENER_NAME.into(),
            address: Some(envoy_address(self.listen)),
            socket_options: vec![keepalive_socket_option()],
            filter_chains: vec![FilterChain {
                // Plaintext (no transport socket) only with --insecure-plaintext-listener.
                name: if transport_socket.is_some() {
                    "tls"
                } else {
                    "plaintext"
                }
                .into(),
                transport_socket,
                filters: vec![Filter {
                    name: "envoy.filters.network.http_connection_manager".into(),
                    config_type: Some(filter::ConfigType::TypedConfig(pack_any(hcm))),
                }],
                ..Default::default()
            }],
            ..Default::default()
        }];
        if let Some(peer) = &self.peer {
            let (listener, cluster) = peer_listener(peer)?;
            listeners.push(listener);
            clusters.push(cluster);
        }
        let mut dynamic = bootstrap::DynamicResources {
            // The first part of the wait for the control plane (the filter's
            // initial_fetch_timeout is the second: Envoy waits for the clusters, then for the
            // filter configuration). 0s ("forever") without a fallback: without a
            // configuration Envoy would answer every request with a 500 once a finite wait
            // expired, a broken apiserver that still looks alive.
            cds_config: Some(config_source(
                self.config_source,
                super::files::CLUSTERS_FILE,
                waits.clusters,
            )?),
            ..Default::default()
        };
        if let ConfigSource::Ads { xds } = self.config_source {
            clusters.push(control_plane_cluster(xds)?);
            dynamic.ads_config = Some(ads_config());
        }
        Ok(EnvoyBootstrap {
            // Identifies this Envoy to the control plane (logs, and one stream per Envoy);
            // Envoy also requires a node for file-based xDS. Its metadata says what the filter
            // this bootstrap loads reads (this binary is the filter's release): the control
            // plane renders the filter configuration for it (docs/ARCHITECTURE.md,
            // "skewgate's own upgrades").
            node: Some(Node {
                id: self.node_id.into(),
                cluster: "skewgate".into(),
                // What the filter reads (the control plane renders for it), a short request's
                // route timeout (how long the control plane keeps a cluster a request may
                // still retry on) and the configured GOAWAY chance, side by side under
                // `skewgate`.
                metadata: Some(merge_metadata(
                    node_metadata(&FilterDialect::this_filter()),
                    std::iter::once(super::route_timeout::node_metadata(
                        super::route_timeout::of(self.request_timeout),
                    ))
                    .chain(
                        self.goaway
                            .map(|goaway| super::goaway::node_metadata(goaway.configured)),
                    ),
                )),
                ..Default::default()
            }),
            overload_manager: self
                .goaway
                .map(|goaway| super::goaway::overload_manager(goaway.path))
                .transpose()?,
            // Admin can stop Envoy, drain its listeners, dump its configuration and raise its
            // logging until bearer tokens are logged: a Unix socket of mode 0600 by default.
            admin: Some(Admin {
                address: Some(local_address(self.admin, true)?),
                ..Default::default()
            }),
            stats_config: Some(stats_config()),
            inline_headers: routing_inline_headers(),
            static_resources: Some(bootstrap::StaticResources {
                listeners,
                clusters,
                ..Default::default()
            }),
            dynamic_resources: Some(dynamic),
            ..Default::default()
        })
    }

    /// The bootstrap as Envoy reads it from a file named `*.yaml` ([`super::yaml`]), its first
    /// line naming `writer`: built, written, read back and written again, which must give the
    /// same text (the YAML holds every field that was built: [`super::yaml::to_yaml`] refuses
    /// a field its descriptors lack).
    pub fn render(&self, writer: &str) -> Result<String, EnvoyError> {
        Ok(super::yaml::round_trip(&self.build()?, writer)?)
    }
}

/// Reading a built bootstrap back, for tests here and elsewhere in the crate.
#[cfg(test)]
pub(crate) mod inspect {
    use super::*;
    use envoy_types::pb::envoy::extensions::filters::http::wasm::v3::Wasm;
    use envoy_types::pb::google::protobuf::StringValue;

    pub(crate) fn decode<M: Message + Default>(any: &envoy_types::pb::google::protobuf::Any) -> M {
        M::decode(any.value.as_slice()).expect("decodes")
    }

    pub(crate) fn listener<'b>(b: &'b EnvoyBootstrap, name: &str) -> Option<&'b Listener> {
        b.static_resources
            .as_ref()?
            .listeners
            .iter()
            .find(|l| l.name == name)
    }

    pub(crate) fn cluster_names(b: &EnvoyBootstrap) -> Vec<&str> {
        b.static_resources
            .as_ref()
            .map(|s| s.clusters.iter().map(|c| c.name.as_str()).collect())
            .unwrap_or_default()
    }

    pub(crate) fn hcm(b: &EnvoyBootstrap) -> HttpConnectionManager {
        let chain = &listener(b, LISTENER_NAME).expect("listener").filter_chains[0];
        let Some(filter::ConfigType::TypedConfig(any)) = &chain.filters[0].config_type else {
            panic!("typed config");
        };
        decode(any)
    }

    pub(crate) fn filter_discovery(b: &EnvoyBootstrap) -> ExtensionConfigSource {
        let hcm = hcm(b);
        let names: Vec<&str> = hcm.http_filters.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "envoy.filters.http.health_check",
                FILTER_NAME,
                "envoy.filters.http.router"
            ]
        );
        let Some(http_filter::ConfigType::ConfigDiscovery(source)) =
            &hcm.http_filters[1].config_type
        else {
            panic!("the filter comes over ECDS");
        };
        source.clone()
    }

    pub(crate) fn routes(b: &EnvoyBootstrap) -> Vec<Route> {
        let Some(RouteSpecifier::RouteConfig(config)) = hcm(b).route_specifier else {
            panic!("an inline route table");
        };
        assert_eq!(config.validate_clusters, bool_value(false));
        config.virtual_hosts[0].routes.clone()
    }

    pub(crate) fn address_of(a: &Option<EnvoyAddress>) -> Option<address::Address> {
        a.as_ref().and_then(|a| a.address.clone())
    }

    pub(crate) fn socket(host: &str, port: u32) -> Option<address::Address> {
        Some(address::Address::SocketAddress(SocketAddress {
            address: host.into(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(port)),
            ..Default::default()
        }))
    }

    /// The filter configuration of the fallback, as Envoy will read it.
    pub(crate) fn default_filter_config(b: &EnvoyBootstrap) -> String {
        let any = filter_discovery(b)
            .default_config
            .expect("a default_config");
        assert_eq!(any.type_url, WASM_TYPE_URL);
        let wasm: Wasm = decode(&any);
        let configuration = wasm
            .config
            .expect("plugin")
            .configuration
            .expect("configuration");
        decode::<StringValue>(&configuration).value
    }

    /// The route timeouts of the two routed routes (long-running, short).
    pub(crate) fn route_timeouts(b: &EnvoyBootstrap) -> Vec<Option<ProtoDuration>> {
        routes(b)
            .iter()
            .filter_map(|r| match &r.action {
                Some(route::Action::Route(action)) => Some(action.timeout),
                _ => None,
            })
            .collect()
    }

    /// The CDS and ECDS waits.
    pub(crate) fn waits(b: &EnvoyBootstrap) -> [Option<ProtoDuration>; 2] {
        let cds = b
            .dynamic_resources
            .as_ref()
            .and_then(|d| d.cds_config.as_ref())
            .and_then(|c| c.initial_fetch_timeout);
        let ecds = filter_discovery(b)
            .config_source
            .and_then(|c| c.initial_fetch_timeout);
        [cds, ecds]
    }

    /// The listener's downstream TLS context, if any.
    pub(crate) fn downstream_tls_context(b: &EnvoyBootstrap) -> Option<DownstreamTlsContext> {
        let chain = &listener(b, LISTENER_NAME)?.filter_chains[0];
        match &chain.transport_socket.as_ref()?.config_type {
            Some(transport_socket::ConfigType::TypedConfig(any)) => Some(decode(any)),
            _ => None,
        }
    }

    /// The UpstreamTlsContext of a static cluster, if it has one.
    pub(crate) fn upstream_tls_context(
        b: &EnvoyBootstrap,
        cluster: &str,
    ) -> Option<envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext>
    {
        let c = b
            .static_resources
            .as_ref()?
            .clusters
            .iter()
            .find(|c| c.name == cluster)?;
        match &c.transport_socket.as_ref()?.config_type {
            Some(transport_socket::ConfigType::TypedConfig(any)) => Some(decode(any)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::inspect::*;
    use super::*;
    use crate::envoy::fallback::{AcknowledgedConfig, FALLBACK_PREFIX};
    use crate::envoy::ServingTls;
    use crate::local_channels::LocalChannels;
    use skewgate_core::config::{FilterConfig, FALLBACK_LOCAL_CLUSTER};
    use std::collections::BTreeMap;

    fn live<'a>(listen: &'a Address, channels: &'a LocalChannels) -> Bootstrap<'a> {
        Bootstrap {
            listen,
            admin: channels.admin(),
            config_source: ConfigSource::Ads {
                xds: channels.xds(),
            },
            node_id: "apiserver-a",
            request_timeout: Duration::from_secs(60),
            serving: None,
            sds_dir: None,
            peer: None,
            fallback: None,
            goaway: None,
        }
    }

    #[test]
    fn the_live_bootstrap_carries_every_setting() {
        let listen = Address::parse_listen("10.0.0.11:6443").expect("listen");
        let channels = LocalChannels::unix(Path::new("/run/skewgate")).expect("channels");
        let rendered = live(&listen, &channels).render("test").expect("renders");
        let b = crate::envoy::yaml::from_yaml::<EnvoyBootstrap>(&rendered).expect("reads back");
        assert_eq!(b.node.as_ref().map(|n| n.id.as_str()), Some("apiserver-a"));
        // The node says what this release's filter reads, as the xDS server reads it back.
        assert_eq!(
            crate::envoy::dialect::negotiate(b.node.as_ref()),
            crate::envoy::dialect::Negotiated {
                dialect: FilterDialect::this_filter(),
                advertised: crate::envoy::dialect::Advertised::Yes,
            }
        );
        // Admin and xDS on Unix sockets only the owner may open; Envoy binds admin.
        assert_eq!(
            address_of(&b.admin.as_ref().expect("admin").address),
            Some(address::Address::Pipe(Pipe {
                path: "/run/skewgate/envoy-admin.sock".into(),
                mode: 0o600
            }))
        );
        let control = b.static_resources.as_ref().expect("static").clusters
            [cluster_names(&b).len() - 1]
            .clone();
        assert_eq!(control.name, CONTROL_PLANE_CLUSTER);
        let endpoint = &control.load_assignment.expect("endpoints").endpoints[0].lb_endpoints[0];
        let Some(HostIdentifier::Endpoint(endpoint)) = &endpoint.host_identifier else {
            panic!("an endpoint");
        };
        assert_eq!(
            address_of(&endpoint.address),
            Some(address::Address::Pipe(Pipe {
                path: "/run/skewgate/xds.sock".into(),
                mode: 0
            }))
        );
        let apiserver = listener(&b, LISTENER_NAME).expect("listener");
        assert_eq!(address_of(&apiserver.address), socket("10.0.0.11", 6443));
        assert_eq!(apiserver.filter_chains.len(), 1);
        assert_eq!(apiserver.filter_chains[0].name, "plaintext");
        assert!(apiserver.filter_chains[0].transport_socket.is_none());
        // No peer port unless asked for; the only clusters: the control plane's.
        assert!(listener(&b, PEER_LISTENER_NAME).is_none());
        assert_eq!(cluster_names(&b), [CONTROL_PLANE_CLUSTER]);

        let dynamic = b.dynamic_resources.as_ref().expect("dynamic");
        let ads = dynamic.ads_config.as_ref().expect("ADS");
        assert_eq!(ads.api_type, ApiType::DeltaGrpc as i32);
        let ads_source = |timeout| ProtoConfigSource {
            resource_api_version: ApiVersion::V3 as i32,
            config_source_specifier: Some(ConfigSourceSpecifier::Ads(AggregatedConfigSource {})),
            initial_fetch_timeout: Some(proto_duration(timeout)),
            ..Default::default()
        };
        // No fallback: both waits are "forever" (0s).
        assert_eq!(dynamic.cds_config, Some(ads_source(Duration::ZERO)));
        let ecds = filter_discovery(&b);
        assert_eq!(ecds.config_source, Some(ads_source(Duration::ZERO)));
        assert_eq!(ecds.type_urls, [WASM_TYPE_URL, DYNAMIC_MODULE_TYPE_URL]);
        assert!(ecds.default_config.is_none());

        let hcm = hcm(&b);
        assert_eq!(hcm.use_remote_address, bool_value(true));
        assert_eq!(
            hcm.forward_client_cert_details,
            ForwardClientCertDetails::SanitizeSet as i32
        );
        assert_eq!(hcm.normalize_path, bool_value(false));
        assert!(!hcm.merge_slashes);
        assert_eq!(hcm.stream_idle_timeout, seconds(0));
        assert_eq!(hcm.max_request_headers_kb, u32_value(1024));
        let upgrades: Vec<&str> = hcm
            .upgrade_configs
            .iter()
            .map(|u| u.upgrade_type.as_str())
            .collect();
        assert_eq!(upgrades, ["websocket", "spdy/3.1"]);

        // Every route goes through the filter's header, the catch-all answers 503 itself.
        let routes = routes(&b);
        assert_eq!(routes.len(), 9);
        #[allow(clippy::type_complexity)]
        let routed: Vec<(
            Option<ProtoDuration>,
            String,
            bool,
            Vec<u32>,
            Option<ProtoDuration>,
        )> = routes[..8]
            .iter()
            .map(|r| {
                let Some(route::Action::Route(action)) = &r.action else {
                    panic!("a route");
                };
                assert_eq!(
                    action.cluster_specifier,
                    Some(ClusterSpecifier::ClusterHeader(
                        UPSTREAM_CLUSTER_HEADER.into()
                    ))
                );
                let retry = action.retry_policy.as_ref().expect("retries");
                // Never back to the local apiserver once a failover cluster left it.
                assert_eq!(
                    retry.retry_priority.as_ref().map(|p| p.name.as_str()),
                    Some("envoy.retry_priorities.previous_priorities")
                );
                let headers = &r.r#match.as_ref().expect("a match").headers;
                let safe = headers.iter().any(|h| h.name == ":method");
                // Only the routes to a set of peers retry on a 404, and only those match the
                // cluster header's prefix.
                let to_peers = headers.iter().any(|h| {
                    h.header_match_specifier
                        == Some(HeaderMatchSpecifier::StringMatch(StringMatcher {
                            match_pattern: Some(MatchPattern::Prefix(
                                crate::routing::PEER_CLUSTER_PREFIX.into(),
                            )),
                            ..Default::default()
                        }))
                });
                assert_eq!(to_peers, !retry.retriable_status_codes.is_empty());
                (
                    action.timeout,
                    retry.retry_on.clone(),
                    safe,
                    retry.retriable_status_codes.clone(),
                    retry.per_try_idle_timeout,
                )
            })
            .collect();
        let safe = "connect-failure,reset".to_string();
        let unsafe_ = "connect-failure,reset-before-request".to_string();
        let peers = |on: &str| format!("{on},retriable-status-codes");
        let mut expected = Vec::new();
        // Only a bounded GET or HEAD to peers has a per-try idle timeout: a third of the
        // 60 s --request-timeout; never a watch (no route timeout), a write, or the local
        // apiserver.
        for (timeout, try_idle) in [(seconds(0), None), (seconds(70), seconds(20))] {
            expected.extend([
                (timeout, peers(&safe), true, vec![404], try_idle),
                (timeout, peers(&unsafe_), false, vec![404], None),
                (timeout, safe.clone(), true, vec![], None),
                (timeout, unsafe_.clone(), false, vec![], None),
            ]);
        }
        assert_eq!(routed, expected);
        let Some(route::Action::DirectResponse(reply)) = &routes[8].action else {
            panic!("the catch-all answers itself");
        };
        assert_eq!(reply.status, 503);
        let Some(DataSource {
            specifier: Some(data_source::Specifier::InlineString(body)),
            ..
        }) = &reply.body
        else {
            panic!("an inline body");
        };
        let status: serde_json::Value = serde_json::from_str(body).expect("a Status");
        assert_eq!(
            (status["kind"].as_str(), status["code"].as_u64()),
            (Some("Status"), Some(503))
        );

        // One tag regex per label the filter writes into a stat name.
        let tags: Vec<(String, Option<tag_specifier::TagValue>)> = b
            .stats_config
            .expect("stats")
            .stats_tags
            .into_iter()
            .map(|t| (t.tag_name, t.tag_value))
            .collect();
        assert_eq!(tags.len(), skewgate_core::metrics::LABELS.len());
        assert_eq!(
            tags[0],
            (
                "code".to_string(),
                Some(tag_specifier::TagValue::Regex("(;code=([^;]*))".into()))
            )
        );
    }

    #[test]
    fn the_static_mode_reads_the_same_resources_from_files() {
        let listen = Address::parse_listen("127.0.0.1:0").expect("listen");
        let admin = LocalChannel::Unix("/var/lib/skewgate/envoy-admin.sock".into());
        let render = |dir: &str| {
            Bootstrap {
                listen: &listen,
                admin: &admin,
                config_source: ConfigSource::Files {
                    dir: Path::new(dir),
                },
                node_id: "skewgate-static",
                request_timeout: Duration::from_secs(60),
                serving: None,
                sds_dir: None,
                peer: None,
                fallback: None,
                goaway: None,
            }
            .build()
        };
        let b = render("/var/lib/skewgate/").expect("renders");
        let file = |name: &str| ProtoConfigSource {
            resource_api_version: ApiVersion::V3 as i32,
            config_source_specifier: Some(ConfigSourceSpecifier::PathConfigSource(
                PathConfigSource {
                    path: format!("/var/lib/skewgate/{name}"),
                    ..Default::default()
                },
            )),
            initial_fetch_timeout: Some(proto_duration(Duration::ZERO)),
            ..Default::default()
        };
        let dynamic = b.dynamic_resources.as_ref().expect("dynamic");
        assert_eq!(dynamic.cds_config, Some(file("clusters.yaml")));
        assert_eq!(
            filter_discovery(&b).config_source,
            Some(file("filter.yaml"))
        );
        // No control plane: no ADS stream, no cluster for it.
        assert!(dynamic.ads_config.is_none());
        assert!(cluster_names(&b).is_empty());
        assert!(matches!(render("/a\nb"), Err(EnvoyError::Unsafe(_))));
    }

    #[test]
    fn refuses_unsafe_node_ids() {
        let a = Address::parse("127.0.0.1:1").expect("address");
        let channel = LocalChannel::Tcp("127.0.0.1:1".parse().expect("address"));
        for bad in ["", "a b", "a\"b", "a\nb", "{{node_id}}", &"a".repeat(254)] {
            let r = Bootstrap {
                listen: &a,
                admin: &channel,
                config_source: ConfigSource::Ads { xds: &channel },
                node_id: bad,
                request_timeout: Duration::from_secs(60),
                serving: None,
                sds_dir: None,
                peer: None,
                fallback: None,
                goaway: None,
            }
            .render("test");
            assert!(matches!(r, Err(EnvoyError::Unsafe(_))), "{bad:?}");
        }
    }

    #[test]
    fn serves_tls_with_optional_client_certificates() {
        let listen = Address::parse_listen("10.0.0.11:6443").expect("listen");
        let channels = LocalChannels::tcp(9901, "127.0.0.1:18000".parse().expect("xds"));
        let mut serving = ServingTls {
            cert_file: "/etc/kubernetes/pki/apiserver.crt".into(),
            key_file: "/etc/kubernetes/pki/apiserver.key".into(),
            client_ca_file: Some("/etc/kubernetes/pki/ca.crt".into()),
        };
        let render = |serving: &ServingTls, sds_dir: Option<&str>| {
            Bootstrap {
                serving: Some(serving),
                sds_dir: sds_dir.map(Path::new),
                ..live(&listen, &channels)
            }
            .build()
        };
        let b = render(&serving, Some("/var/lib/skewgate/sds")).expect("renders");
        // --insecure-tcp-local-channels: admin on loopback TCP.
        assert_eq!(
            address_of(&b.admin.as_ref().expect("admin").address),
            socket("127.0.0.1", 9901)
        );
        let chain = &listener(&b, LISTENER_NAME).expect("listener").filter_chains[0];
        assert_eq!(chain.name, "tls");
        let socket = chain.transport_socket.as_ref().expect("TLS");
        let Some(transport_socket::ConfigType::TypedConfig(any)) = &socket.config_type else {
            panic!("typed config");
        };
        assert_eq!(
            any.type_url,
            "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext"
        );
        let context: DownstreamTlsContext = decode(any);
        assert_eq!(context.require_client_certificate, bool_value(false));
        let common = context.common_tls_context.expect("common");
        assert_eq!(common.alpn_protocols, ["h2", "http/1.1"]);
        // The certificate and the client CA come through SDS from files (rotation without a
        // restart), exactly as the clusters name theirs; no file is named inline.
        let sds = |name| sds_secret_config(Path::new("/var/lib/skewgate/sds"), name).expect("sds");
        assert_eq!(
            common.tls_certificate_sds_secret_configs,
            [sds(SERVING_SECRET)]
        );
        assert_eq!(
            common.validation_context_type,
            Some(ValidationContextType::ValidationContextSdsSecretConfig(
                sds(CLIENT_CA_SECRET)
            ))
        );
        assert!(common.tls_certificates.is_empty());

        // Without a client CA no certificate is requested.
        serving.client_ca_file = None;
        let b = render(&serving, Some("/sds")).expect("renders");
        let chain = &listener(&b, LISTENER_NAME).expect("listener").filter_chains[0];
        let Some(transport_socket::ConfigType::TypedConfig(any)) =
            &chain.transport_socket.as_ref().expect("TLS").config_type
        else {
            panic!("typed config");
        };
        let context: DownstreamTlsContext = decode(any);
        assert!(context
            .common_tls_context
            .expect("common")
            .validation_context_type
            .is_none());

        assert!(matches!(render(&serving, None), Err(EnvoyError::NoSdsDir)));
        assert!(matches!(
            render(&serving, Some("/sds\n")),
            Err(EnvoyError::Unsafe(_))
        ));
    }

    #[test]
    fn the_peer_port_passes_tls_through_to_the_apiserver() {
        let listen = Address::parse_listen("10.0.0.11:6443").expect("listen");
        let peer_listen = Address::parse_listen("10.0.0.11:6444").expect("peer");
        let apiserver = Address::parse("127.0.0.1:6443").expect("apiserver");
        let channels = LocalChannels::unix(Path::new("/run/skewgate")).expect("channels");
        let cidrs: [ipnet::IpNet; 1] = ["10.0.0.0/24".parse().expect("cidr")];
        let with_sources = |allowed_sources| Bootstrap {
            peer: Some(PeerPassthrough {
                listen: &peer_listen,
                apiserver: &apiserver,
                allowed_sources,
            }),
            ..live(&listen, &channels)
        };
        let b = with_sources(&cidrs).build().expect("renders");
        let peer = listener(&b, PEER_LISTENER_NAME).expect("the peer port");
        assert_eq!(address_of(&peer.address), socket("10.0.0.11", 6444));
        let filters = &peer.filter_chains[0].filters;
        let names: Vec<&str> = filters.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "envoy.filters.network.rbac",
                "envoy.filters.network.tcp_proxy"
            ]
        );
        let Some(filter::ConfigType::TypedConfig(any)) = &filters[0].config_type else {
            panic!("typed config");
        };
        let rbac: Rbac = decode(any);
        let rules = rbac.rules.expect("rules");
        assert_eq!(rules.action, rbac::Action::Allow as i32);
        assert_eq!(
            rules.policies["peers"].principals,
            [Principal {
                identifier: Some(principal::Identifier::DirectRemoteIp(CidrRange {
                    address_prefix: "10.0.0.0".into(),
                    prefix_len: u32_value(24),
                })),
            }]
        );
        let Some(filter::ConfigType::TypedConfig(any)) = &filters[1].config_type else {
            panic!("typed config");
        };
        let proxy: TcpProxy = decode(any);
        assert_eq!(
            proxy.cluster_specifier,
            Some(tcp_proxy::ClusterSpecifier::Cluster(
                PASSTHROUGH_CLUSTER.into()
            ))
        );
        let passthrough = b
            .static_resources
            .as_ref()
            .expect("static")
            .clusters
            .iter()
            .find(|c| c.name == PASSTHROUGH_CLUSTER)
            .expect("the passthrough cluster");
        assert_eq!(
            passthrough.cluster_discovery_type,
            Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32))
        );
        // A peer port open to everyone would skip the filter: refused.
        assert!(matches!(
            with_sources(&[]).build(),
            Err(EnvoyError::Unsafe(_))
        ));
    }

    fn fallback_inputs<'a>(
        local: &'a Address,
        acknowledged: Option<&'a AcknowledgedConfig>,
        wait: Duration,
    ) -> FallbackInputs<'a> {
        FallbackInputs {
            wait,
            filter_code: &crate::test_fixtures::OPT_WASM,
            local,
            upstream_sds: None,
            local_apiserver: "cp-1",
            acknowledged,
        }
    }

    #[test]
    fn the_fallback_is_rendered_only_with_a_control_plane_to_wait_for() {
        let listen = Address::parse_listen("127.0.0.1:0").expect("listen");
        let channels = LocalChannels::unix(Path::new("/run/skewgate")).expect("channels");
        let local = Address::parse("127.0.0.1:6443").expect("local");
        let b = Bootstrap {
            fallback: Some(fallback_inputs(&local, None, Duration::from_secs(3))),
            ..live(&listen, &channels)
        }
        .build()
        .expect("renders");
        let half = Some(proto_duration(Duration::from_millis(1500)));
        let dynamic = b.dynamic_resources.as_ref().expect("dynamic");
        assert_eq!(
            dynamic
                .cds_config
                .as_ref()
                .expect("cds")
                .initial_fetch_timeout,
            half
        );
        let ecds = filter_discovery(&b);
        assert_eq!(
            ecds.config_source.expect("source").initial_fetch_timeout,
            half
        );
        assert_eq!(
            cluster_names(&b),
            [
                "skewgate-fallback-local-identity",
                "skewgate-fallback-local-token",
                "skewgate-fallback-local-anonymous",
                CONTROL_PLANE_CLUSTER,
            ]
        );
        assert_eq!(
            FilterConfig::from_json(default_filter_config(&b).as_bytes()).expect("valid"),
            fallback::local_only_config("cp-1")
        );
        // No control plane to wait for, or a wait Envoy would read as "forever": refused.
        let admin = LocalChannel::Unix("/run/skewgate/envoy-admin.sock".into());
        let files = Bootstrap {
            listen: &listen,
            admin: &admin,
            config_source: ConfigSource::Files {
                dir: Path::new("/var/lib/skewgate"),
            },
            node_id: "cp-1",
            request_timeout: Duration::from_secs(60),
            serving: None,
            sds_dir: None,
            peer: None,
            fallback: Some(fallback_inputs(&local, None, Duration::from_secs(3))),
            goaway: None,
        };
        assert!(matches!(files.build(), Err(EnvoyError::Fallback(_))));
        let short = Bootstrap {
            fallback: Some(fallback_inputs(&local, None, Duration::from_millis(1))),
            ..live(&listen, &channels)
        };
        assert!(matches!(short.build(), Err(EnvoyError::Fallback(_))));
    }

    /// Strings an apiserver, a Lease or a file could carry into the kept configuration: template
    /// syntax, quotes, backslashes, control characters, NUL, YAML/JSON syntax, HTML, non-ASCII,
    /// and very long ones.
    pub(crate) fn hostile_strings() -> Vec<String> {
        vec![
            "{{node_id}}".into(),
            "{{#fallback}}{{/fallback}}".into(),
            "\"".into(),
            "'".into(),
            "\\".into(),
            "\\\"\\n".into(),
            "\u{0}".into(),
            "\n- name: evil\n".into(),
            "\r\n\t\u{7}\u{1b}[31m".into(),
            "]}}{{".into(),
            "key: value".into(),
            "&anchor *alias !!binary |".into(),
            "{\"@type\":\"x\"}".into(),
            "</script><script>alert(1)</script>".into(),
            "Ünïcødé ✓ 日本 \u{202e}".into(),
            "x".repeat(70_000),
        ]
    }

    /// A kept configuration whose merged discovery carries every hostile string in every string
    /// field a resource has: the bootstrap keeps its structure, and the filter reads exactly
    /// the configuration that was kept.
    #[test]
    fn hostile_strings_in_the_kept_configuration_cannot_change_the_bootstrap() {
        let hostile = hostile_strings();
        let resource = serde_json::json!({
            "resource": "widgets",
            "responseKind": {"group": hostile[0], "version": "v1", "kind": hostile[7]},
            "scope": "Namespaced",
            "singularResource": hostile[1],
            "verbs": ["get", "list"],
            "shortNames": hostile,
            "categories": hostile,
        });
        let apis = serde_json::json!({
            "kind": "APIGroupDiscoveryList",
            "apiVersion": "apidiscovery.k8s.io/v2",
            "metadata": {},
            "items": [{"metadata": {"name": "x.io"}, "versions": [
                {"version": "v1", "resources": [resource], "freshness": "Current"}]}],
        });
        let filter_config = format!(
            r#"{{"schema":1,"local_apiserver":"cp-1",
                 "peer_clusters":{{"skewgate-peers-b":["apiserver-b"]}},
                 "group_versions":[{{"group":"x.io","version":"v1","resources":[
                   {{"resource":"widgets","peer_cluster":"skewgate-peers-b"}}]}}],
                 "discovery":{{"apis":{apis},"apis_etag":"e1","api":{api},"api_etag":"e2"}}}}"#,
            api = serde_json::json!({"kind": "APIGroupDiscoveryList", "items": []}),
        );
        let record = AcknowledgedConfig {
            filter_config: FilterConfig::from_json(filter_config.as_bytes()).expect("valid"),
            peer_clusters: BTreeMap::from([(
                "skewgate-peers-b".to_string(),
                vec!["10.0.0.12:6444".to_string()],
            )]),
        };
        let listen = Address::parse_listen("10.0.0.11:6443").expect("listen");
        let channels = LocalChannels::unix(Path::new("/run/skewgate")).expect("channels");
        let local = Address::parse("127.0.0.1:6443").expect("local");
        let rendered = Bootstrap {
            fallback: Some(fallback_inputs(
                &local,
                Some(&record),
                Duration::from_secs(30),
            )),
            ..live(&listen, &channels)
        }
        .render("test")
        .expect("renders");
        let b = crate::envoy::yaml::from_yaml::<EnvoyBootstrap>(&rendered).expect("reads back");
        assert_eq!(b.node.as_ref().map(|n| n.id.as_str()), Some("apiserver-a"));
        let listeners: Vec<&str> = b
            .static_resources
            .as_ref()
            .expect("static")
            .listeners
            .iter()
            .map(|l| l.name.as_str())
            .collect();
        assert_eq!(listeners, [LISTENER_NAME]);
        assert_eq!(
            cluster_names(&b),
            [
                "skewgate-fallback-local-identity",
                "skewgate-fallback-local-token",
                "skewgate-fallback-local-anonymous",
                "skewgate-fallback-skewgate-peers-b-identity",
                "skewgate-fallback-skewgate-peers-b-token",
                "skewgate-fallback-skewgate-peers-b-anonymous",
                CONTROL_PLANE_CLUSTER,
            ]
        );
        // Byte for byte the configuration that was kept, renamed to the static clusters.
        let config = default_filter_config(&b);
        assert_eq!(
            config,
            fallback::last_acknowledged_config(&record).to_json()
        );
        let back = FilterConfig::from_json(config.as_bytes()).expect("the filter accepts it");
        assert!(back
            .peer_clusters
            .contains_key(&format!("{FALLBACK_PREFIX}skewgate-peers-b")));
        for s in &hostile {
            let escaped = serde_json::to_string(s).expect("json");
            assert!(
                config.contains(escaped.trim_matches('"')),
                "{:?} kept",
                &s[..s.len().min(20)]
            );
        }
        assert_eq!(
            back.fallback.map(|f| f.local_cluster),
            Some(FALLBACK_LOCAL_CLUSTER.to_string())
        );
    }
}
