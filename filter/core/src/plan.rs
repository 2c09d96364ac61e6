//! The filter's whole per-request decision, as data (docs/ARCHITECTURE.md "Request path",
//! steps 1-9).
//!
//! [`plan_request`] takes what the filter reads when the request headers arrive (the headers,
//! the client certificate's subject) and the compiled configuration, and returns a
//! [`RequestPlan`]: answer here (401 for an unmappable certificate, 503 for what no live
//! apiserver is known to serve now), or forward with these header changes to that cluster,
//! keeping a [`ResponsePlan`] for the answer. [`ResponsePlan::decide`] does the same for the
//! response: pass it, replace it with the merged discovery answer, replace Envoy's own reply with
//! a Status, or make an apiserver's `404 page not found` for what it should serve a 503. The
//! proxy-wasm shell only reads what these functions need, applies what they return, and counts;
//! it decides nothing.

use std::borrow::Cow;
use std::fmt;

use crate::config::{FallbackMode, FilterConfig, UpstreamAuth, LOCAL_CLUSTER};
use crate::discovery::{DiscoveryChoice, DiscoveryHeaders, MergedDiscovery, PassReason};
use crate::group_version::GroupVersion;
use crate::hygiene::{self, PEER_PROXIED, REQUEST_CLASS, UNBOUNDED_REQUEST, UPSTREAM_CLUSTER};
use crate::identity::{self, ClientIdentity, IdentityError};
use crate::local_reply::{self, RoutedTo};
pub use crate::metrics::{Counter, GvrLabel, MetricLabels, PeerError};
use crate::openapi::{self, OpenApiRoute, OpenApiUnion};
use crate::request_info::RequestInfo;
use crate::routing::{self, Decision, Reason, RoutingTable, Upstream};
use crate::shared_discovery::{self, SharedData, StoreError};
use crate::status;

/// One accepted configuration, compiled for request time and shared by every request.
#[derive(Debug)]
pub struct CompiledConfig {
    pub table: RoutingTable,
    /// `None` when the control plane sent no merged discovery: discovery goes to local.
    pub discovery: Option<MergedDiscovery>,
    /// The peer-only OpenAPI v3 entries (empty: every OpenAPI request is the local apiserver's).
    pub openapi: OpenApiUnion,
    /// The base name of the local apiserver's clusters: [`LOCAL_CLUSTER`] (from the control
    /// plane, CDS), or the bootstrap's static ones in a fallback configuration.
    pub local_cluster: String,
    /// Set when this is the bootstrap's fallback configuration.
    pub fallback: Option<FallbackMode>,
    /// The label values the counters may carry.
    pub labels: MetricLabels,
}

impl CompiledConfig {
    pub fn compile(config: &FilterConfig) -> Self {
        Self::with_discovery(
            config,
            config.discovery.as_ref().map(MergedDiscovery::compile),
        )
    }

    /// `config`'s routing with merged discovery compiled elsewhere (the documents kept in
    /// shared data: [`crate::shared_discovery`]); `config.discovery` is not looked at.
    pub fn with_discovery(config: &FilterConfig, discovery: Option<MergedDiscovery>) -> Self {
        CompiledConfig {
            table: RoutingTable::compile(config),
            discovery,
            openapi: OpenApiUnion::compile(&config.openapi_v3),
            local_cluster: config
                .fallback
                .as_ref()
                .map_or(LOCAL_CLUSTER, |f| f.local_cluster.as_str())
                .to_string(),
            fallback: config.fallback.as_ref().map(|f| f.mode),
            labels: MetricLabels::compile(config),
        }
    }

    /// The base name of the cluster for requests every live apiserver serves: the local
    /// apiserver's, failing over to every live peer when there are some.
    pub fn local_first_cluster(&self) -> &str {
        self.table
            .failover_all()
            .unwrap_or(self.local_cluster.as_str())
    }
}

/// One change to a header map, applied in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderOp<'a> {
    /// Remove every value of the header.
    Remove(&'a str),
    /// Replace every value of the header with this one.
    Set(&'a str, Cow<'a, str>),
    /// Add a value (a header may repeat: one `X-Remote-Group` per group).
    Add(&'a str, Cow<'a, str>),
}

/// A reply the filter sends itself, instead of forwarding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalReply {
    pub code: u16,
    pub content_type: &'static str,
    /// The `Retry-After` header (seconds), for a 503 the client should retry.
    pub retry_after: Option<&'static str>,
    /// A `metav1.Status` document.
    pub body: String,
}

impl LocalReply {
    fn failure(code: u16, message: &str) -> Self {
        LocalReply {
            code,
            content_type: status::CONTENT_TYPE,
            retry_after: None,
            body: status::failure(code, message),
        }
    }

    /// 503 `ServiceUnavailable` with `Retry-After` ([`status::unavailable`]).
    fn unavailable(message: &str) -> Self {
        LocalReply {
            code: 503,
            content_type: status::CONTENT_TYPE,
            retry_after: Some(status::RETRY_AFTER),
            body: status::unavailable(message),
        }
    }

    /// The reply's headers: `content-type`, and `retry-after` when set.
    pub fn headers(&self) -> Vec<(&'static str, &'static str)> {
        let mut headers = vec![("content-type", self.content_type)];
        if let Some(seconds) = self.retry_after {
            headers.push(("retry-after", seconds));
        }
        headers
    }

    /// The reply when the host failed us mid-request: a request we could not sanitise must not
    /// reach an apiserver, so it fails closed.
    pub fn host_failure() -> Self {
        LocalReply::failure(503, "the proxy could not process the request")
    }
}

/// How the forwarded request authenticates to the apiserver (see [`UpstreamAuth`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    /// A verified client certificate, forwarded as `X-Remote-User`/`X-Remote-Group`.
    ProxyIdentity(ClientIdentity),
    /// The client sent `Authorization`: the apiserver authenticates it.
    Token,
    Anonymous,
}

impl Auth {
    pub fn upstream(&self) -> UpstreamAuth {
        match self {
            Auth::ProxyIdentity(_) => UpstreamAuth::ProxyIdentity,
            Auth::Token => UpstreamAuth::Token,
            Auth::Anonymous => UpstreamAuth::Anonymous,
        }
    }
}

/// How long the request may take upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestClass {
    /// Bounded by the apiserver's `--request-timeout`, and so by Envoy's route: an apiserver
    /// that accepts the connection but never answers yields a 503.
    Short,
    /// Not bounded: watches, exec, logs and the like stream for as long as they last; and a
    /// request we could not parse, which the local apiserver answers as it would without us.
    Unbounded,
}

/// Where the request goes, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route<'a> {
    /// A discovery request we answer from the merged documents once the local apiserver has
    /// authorized it: it gets a plain JSON request for its own document.
    MergedDiscovery,
    /// `GET /openapi/v3` with peer-only entries to add: the local apiserver answers (and
    /// authorizes) it, in full and unconditionally, so its 200 can get the entries added.
    OpenApiRoot,
    /// What the routing table decided (steps 4-8), or for the OpenAPI document of a peer-only
    /// group-version, the peers that listed it (routed like a resource they serve).
    Table(Decision<'a>),
}

/// What to do with a request, decided when its headers arrive.
// Forward is what nearly every request gets: boxing it would allocate per request to save
// stack in the rare 401/503 answers.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestPlan<'a> {
    /// Send it on to an apiserver.
    Forward(Forward<'a>),
    /// A client certificate kube-apiserver's x509 authenticator would fail too: answer 401 and
    /// forward nothing.
    RefuseCertificate {
        subject: Cow<'a, str>,
        error: IdentityError,
        reply: LocalReply,
    },
    /// No live apiserver is known to serve what the request asks for now, but one may: answer
    /// 503 with `Retry-After` and forward nothing (a retryable 503 is always safer than a
    /// false 404).
    Unavailable {
        /// Envoy's `:method` and `:path` (lossy UTF-8), for logs.
        method: Cow<'a, str>,
        path: Cow<'a, str>,
        cause: Unavailable,
        reply: LocalReply,
        counter: Counter,
    },
}

/// Why the filter answers a request 503 itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unavailable {
    /// A retained resource or subresource ([`Reason::Retained`]).
    Retained,
    /// Served by no known apiserver while a live peer's discovery is not known yet
    /// ([`Reason::PeerDiscoveryPending`]).
    PeerDiscoveryPending,
    /// The legacy discovery path of a retained group-version
    /// ([`MergedDiscovery::unavailable`]).
    RetainedDiscovery,
    /// The OpenAPI v3 document of a retained group-version.
    RetainedOpenApi,
}

/// A request to forward.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forward<'a> {
    /// Envoy's `:method` and `:path` (lossy UTF-8), for logs.
    pub method: Cow<'a, str>,
    pub path: Cow<'a, str>,
    /// Every header a client must not control (step 1), each name once, as the client sent it.
    pub strip: Vec<&'a str>,
    pub auth: Auth,
    /// The Envoy cluster, with its [`UpstreamAuth`] suffix.
    pub cluster: String,
    pub class: RequestClass,
    pub route: Route<'a>,
    /// The counters this request increments now.
    pub counters: Vec<Counter>,
    /// What the response phase needs.
    pub response: ResponsePlan,
}

impl Forward<'_> {
    /// The request header changes, in the order to apply them. Envoy routes on
    /// [`UPSTREAM_CLUSTER`], so the shell clears the route cache after applying them.
    pub fn header_ops(&self) -> Vec<HeaderOp<'_>> {
        let identity = match &self.auth {
            Auth::ProxyIdentity(id) => Some(id),
            Auth::Token | Auth::Anonymous => None,
        };
        let groups = identity.map_or(0, |id| id.groups.len());
        let mut ops = Vec::with_capacity(self.strip.len() + groups + 6);
        // Step 1: strip every header a client must not control, before anything else.
        ops.extend(self.strip.iter().map(|name| HeaderOp::Remove(name)));
        // Step 2: the identity. Every client copy is gone, so adding is setting.
        if let Some(id) = identity {
            ops.extend(
                identity::remote_headers(id)
                    .into_iter()
                    .map(|(name, value)| HeaderOp::Add(name, Cow::Borrowed(value))),
            );
        }
        match self.route {
            // Step 3: the local apiserver answers its own document in plain JSON; we answer
            // with the merged one if it authorized the request.
            Route::MergedDiscovery => ops.extend([
                HeaderOp::Set("accept", Cow::Borrowed("application/json")),
                HeaderOp::Remove("if-none-match"),
                HeaderOp::Remove("accept-encoding"),
            ]),
            // The answer must be a full 200 to add entries to: no 304, no compression.
            Route::OpenApiRoot => ops.extend([
                HeaderOp::Remove("if-none-match"),
                HeaderOp::Remove("if-modified-since"),
                HeaderOp::Remove("accept-encoding"),
            ]),
            Route::Table(Decision {
                upstream: Upstream::Peer { .. } | Upstream::Departed { .. },
                ..
            }) => {
                // The loop guard: the peer apiserver must serve this itself, never re-proxy.
                ops.push(HeaderOp::Set(PEER_PROXIED, Cow::Borrowed("true")));
            }
            Route::Table(_) => {}
        }
        if self.class == RequestClass::Unbounded {
            ops.push(HeaderOp::Set(
                REQUEST_CLASS,
                Cow::Borrowed(UNBOUNDED_REQUEST),
            ));
        }
        ops.push(HeaderOp::Set(
            UPSTREAM_CLUSTER,
            Cow::Borrowed(self.cluster.as_str()),
        ));
        ops
    }
}

/// The first value of a request header (Envoy gives names in lower case; the first value
/// counts, as Go's `Header.Get`).
fn first<'a, N: AsRef<str>, V: AsRef<[u8]>>(headers: &'a [(N, V)], name: &str) -> Option<&'a [u8]> {
    headers
        .iter()
        .find(|(n, _)| n.as_ref() == name)
        .map(|(_, v)| v.as_ref())
}

/// `bytes` as text, each sequence that is not UTF-8 replaced by U+FFFD. Borrowed when it is
/// UTF-8, found by the standard library's word-at-a-time check: `String::from_utf8_lossy`
/// walks every byte on its own, which on every request's `:path` costs more than the check.
fn lossy(bytes: &[u8]) -> Cow<'_, str> {
    match std::str::from_utf8(bytes) {
        Ok(text) => Cow::Borrowed(text),
        Err(_) => String::from_utf8_lossy(bytes),
    }
}

/// Decide everything about a request from its headers (names and raw values, as Envoy gives
/// them), the subject of its verified client certificate (from Envoy's `x-forwarded-client-cert`,
/// [`client_cert::subject`](crate::client_cert::subject); empty or `None` without one), and the
/// compiled configuration.
pub fn plan_request<'a, N: AsRef<str>, V: AsRef<[u8]>>(
    headers: &'a [(N, V)],
    subject: Option<&'a [u8]>,
    compiled: &'a CompiledConfig,
) -> RequestPlan<'a> {
    let strip = hygiene::forbidden_names(headers.iter().map(|(n, _)| n.as_ref()));
    let method = lossy(first(headers, ":method").unwrap_or_default());
    let path = lossy(first(headers, ":path").unwrap_or_default());

    // Step 2: identity.
    let auth = match subject {
        Some(subject) if !subject.is_empty() => {
            let subject = lossy(subject);
            match identity::identity_from_subject(&subject) {
                Ok(id) => Auth::ProxyIdentity(id),
                Err(error) => {
                    // kube-apiserver's x509 authenticator fails such a certificate too.
                    let reply = LocalReply::failure(
                        401,
                        &format!("client certificate cannot be used to authenticate: {error}"),
                    );
                    return RequestPlan::RefuseCertificate {
                        subject,
                        error,
                        reply,
                    };
                }
            }
        }
        _ if first(headers, "authorization").is_some() => Auth::Token,
        _ => Auth::Anonymous,
    };
    let upstream_auth = auth.upstream();

    // Step 3: discovery. The local apiserver still authenticates and authorizes the request
    // (anonymous users may not read /apis by default): it gets a plain request for its own
    // document, and only an authorized answer is replaced by the merged one.
    let mut counters = Vec::new();
    if let Some(discovery) = &compiled.discovery {
        if let Some(gv) = discovery.unavailable(&method, &path) {
            let gvr = compiled.labels.of(&gv.group, &gv.version, "");
            let reply = LocalReply::unavailable(&retained_message(gv));
            return RequestPlan::Unavailable {
                method,
                path,
                cause: Unavailable::RetainedDiscovery,
                reply,
                counter: Counter::Retained { gvr },
            };
        }
        let discovery_headers = DiscoveryHeaders {
            accept: first(headers, "accept"),
            if_none_match: first(headers, "if-none-match"),
            accept_encoding: first(headers, "accept-encoding"),
        };
        let (choice, reason) = discovery.negotiate(&method, &path, discovery_headers);
        match reason {
            PassReason::NoPeer => counters.push(Counter::DiscoveryNoPeer),
            PassReason::Local => counters.push(Counter::DiscoveryCacheMiss),
            PassReason::NotDiscovery => {}
        }
        if let Some(choice) = choice {
            return RequestPlan::Forward(Forward {
                method,
                path,
                strip,
                auth,
                // Any live apiserver may authorize it while the local one cannot be reached.
                cluster: upstream_auth.cluster(compiled.local_first_cluster()),
                class: RequestClass::Short,
                route: Route::MergedDiscovery,
                counters,
                response: ResponsePlan {
                    discovery: Some(choice),
                    ..ResponsePlan::default()
                },
            });
        }
    }

    // OpenAPI v3 (docs/ARCHITECTURE.md "OpenAPI v3"): the root gets the peer-only entries, the
    // document of a peer-only group-version goes to the peers that listed it, and a retained
    // group-version's document answers 503 like its resources.
    if let Some(plan) = plan_openapi(&method, &path, compiled) {
        return match plan {
            OpenApiPlan::Unavailable { gv } => {
                let gvr = compiled.labels.of(&gv.group, &gv.version, "");
                let reply = LocalReply::unavailable(&retained_message(&gv));
                RequestPlan::Unavailable {
                    method,
                    path,
                    cause: Unavailable::RetainedOpenApi,
                    reply,
                    counter: Counter::Retained { gvr },
                }
            }
            OpenApiPlan::Root => RequestPlan::Forward(Forward {
                method,
                path,
                strip,
                auth,
                cluster: upstream_auth.cluster(compiled.local_first_cluster()),
                class: RequestClass::Short,
                route: Route::OpenApiRoot,
                counters,
                response: ResponsePlan {
                    openapi_root: true,
                    ..ResponsePlan::default()
                },
            }),
            OpenApiPlan::Peer { cluster, gv } => RequestPlan::Forward(Forward {
                method,
                path,
                strip,
                auth,
                cluster: upstream_auth.cluster(cluster),
                class: RequestClass::Short,
                route: Route::Table(Decision {
                    upstream: Upstream::Peer { cluster },
                    reason: Reason::ServedByPeer,
                }),
                counters,
                response: ResponsePlan {
                    served: Some(Served {
                        by: ServedBy::Peer,
                        target: Target::new(&gv.group, &gv.version, "", ""),
                        relayed: false,
                        collection: false,
                    }),
                    uncacheable: true,
                    ..ResponsePlan::default()
                },
            }),
        };
    }

    // Steps 4-8.
    let (info, decision) = compiled.table.route(&method, &path);
    let class = match &info {
        // A query too long to read may hold `watch=true`.
        Some(info) if !info.is_long_running() && routing::query_read(&path) => RequestClass::Short,
        _ => RequestClass::Unbounded,
    };
    let local_first = |base: &'a str| {
        let resource = info.as_ref().is_some_and(|i| i.is_resource_request);
        let by = if compiled.fallback == Some(FallbackMode::LocalOnly) && resource {
            // Without the control plane's view a local `404 page not found` may be a
            // resource only a peer serves: a retryable 503, never a 404 clients act on.
            Some(ServedBy::Unknown)
        } else {
            (decision.reason == Reason::ServedLocally).then_some(ServedBy::Local)
        };
        (base, by)
    };
    let (base, by) = match decision.upstream {
        Upstream::Local => local_first(compiled.local_cluster.as_str()),
        // Whoever answers, local or a peer of the failover set, serves the key: the 404
        // safety net applies as for the local apiserver.
        Upstream::LocalFirst { failover } => local_first(failover),
        Upstream::Peer { cluster } => (cluster, Some(ServedBy::Peer)),
        Upstream::Departed { cluster } => (cluster, Some(ServedBy::Departed)),
        Upstream::Unavailable => {
            // Owned before `path` moves into the plan: `info` borrows from it.
            let target = info.map(Target::of);
            return unavailable(method, path, target, decision.reason, compiled);
        }
    };
    let served = by.zip(info).map(|(by, info)| Served::new(by, info));
    RequestPlan::Forward(Forward {
        method,
        path,
        strip,
        auth,
        cluster: upstream_auth.cluster(base),
        class,
        route: Route::Table(decision),
        counters,
        response: ResponsePlan {
            served,
            ..ResponsePlan::default()
        },
    })
}

/// What the filter does with an OpenAPI v3 request, if anything.
#[derive(Debug, Clone, PartialEq, Eq)]
enum OpenApiPlan<'a> {
    Root,
    Peer {
        cluster: &'a str,
        gv: &'a GroupVersion,
    },
    Unavailable {
        gv: GroupVersion,
    },
}

fn plan_openapi<'a>(
    method: &str,
    path: &str,
    compiled: &'a CompiledConfig,
) -> Option<OpenApiPlan<'a>> {
    // Every request passes here: anything outside /openapi/v3 leaves after one prefix test.
    if !path.starts_with(openapi::ROOT_PATH) {
        return None;
    }
    match compiled.openapi.route(method, path) {
        OpenApiRoute::Root => return Some(OpenApiPlan::Root),
        OpenApiRoute::Peer {
            cluster,
            group_version,
        } => {
            return Some(OpenApiPlan::Peer {
                cluster,
                gv: group_version,
            })
        }
        OpenApiRoute::NotOurs => {}
    }
    // A retained group-version (its legacy discovery path answers 503 too): a retryable 503,
    // never the local apiserver's 404 for a document a restarting peer serves again soon.
    let discovery = compiled.discovery.as_ref()?;
    let document = path
        .split_once('?')
        .map_or(path, |(p, _)| p)
        .strip_prefix(openapi::DOCUMENT_PREFIX)?;
    openapi::group_version_of(document)?;
    discovery
        .unavailable(method, &format!("/{document}"))
        .map(|gv| OpenApiPlan::Unavailable { gv: gv.clone() })
}

/// The message of every retained 503: the filter's own, and Envoy's reply for a request sent
/// to departed apiservers none of which answered ([`ServedBy::Departed`]).
fn retained_message(what: &dyn fmt::Display) -> String {
    format!(
        "no live apiserver serves {what} now; the apiserver that served it is gone or \
         restarting (retry)"
    )
}

/// The 503 for a request the routing table sends nowhere ([`Upstream::Unavailable`]).
fn unavailable<'a>(
    method: Cow<'a, str>,
    path: Cow<'a, str>,
    target: Option<Target>,
    reason: Reason,
    compiled: &CompiledConfig,
) -> RequestPlan<'a> {
    let gvr = target
        .as_ref()
        .map_or(GvrLabel::OTHER, |target| target.label(&compiled.labels));
    // Only resource requests are sent nowhere, so `target` is there; the path says it otherwise.
    let target = target.map_or_else(|| path.to_string(), |target| target.to_string());
    let (cause, counter, message) = match reason {
        Reason::PeerDiscoveryPending => (
            Unavailable::PeerDiscoveryPending,
            Counter::PeerDiscoveryPending { gvr },
            // No peer names: this answer comes before any authentication (the apiserver
            // authenticates, the filter cannot), so an anonymous client must not learn the
            // cluster's apiserver identities from it. Operators see them on /debug/skew.
            format!(
                "no known apiserver serves {target}, and the discovery of a peer apiserver is \
                 not known yet (retry)"
            ),
        ),
        _ => (
            Unavailable::Retained,
            Counter::Retained { gvr },
            retained_message(&target),
        ),
    };
    RequestPlan::Unavailable {
        method,
        path,
        cause,
        reply: LocalReply::unavailable(&message),
        counter,
    }
}

/// What a resource request asked for, as kube names it in messages
/// (`resource.k8s.io/v1beta2, Resource=resourceclaims`, [`Display`](fmt::Display)). Kept from
/// the request to its response, for the 503 messages and the 404 safety net: its four names
/// are copied out of the request's [`RequestInfo`] into one string (one allocation per
/// request, not one per name); the text is formatted only for a message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Target {
    /// The group, version, resource and subresource, one after the other.
    names: String,
    /// Where the group, the version and the resource end in `names`.
    ends: [usize; 3],
}

impl Target {
    /// `resource` empty for a group-version's own document, `subresource` for the resource
    /// itself.
    pub fn new(group: &str, version: &str, resource: &str, subresource: &str) -> Self {
        let mut names =
            String::with_capacity(group.len() + version.len() + resource.len() + subresource.len());
        let mut ends = [0; 3];
        for (end, name) in ends.iter_mut().zip([group, version, resource]) {
            names.push_str(name);
            *end = names.len();
        }
        names.push_str(subresource);
        Target { names, ends }
    }

    pub fn of(info: RequestInfo<'_>) -> Self {
        Target::new(
            &info.api_group,
            &info.api_version,
            &info.resource,
            &info.subresource,
        )
    }

    /// The `n`th name (0 group, 1 version, 2 resource, 3 subresource).
    fn name(&self, n: usize) -> &str {
        let start = n
            .checked_sub(1)
            .and_then(|previous| self.ends.get(previous))
            .copied()
            .unwrap_or(0);
        let end = self.ends.get(n).copied().unwrap_or(self.names.len());
        // In range and on char boundaries by construction (`new` appends whole names).
        self.names.get(start..end).unwrap_or_default()
    }

    pub fn group(&self) -> &str {
        self.name(0)
    }

    pub fn version(&self) -> &str {
        self.name(1)
    }

    /// Empty for a group-version's own document.
    pub fn resource(&self) -> &str {
        self.name(2)
    }

    /// Empty for the resource itself.
    pub fn subresource(&self) -> &str {
        self.name(3)
    }

    /// Its group/version/resource as a counter label, bounded by the configuration.
    fn label(&self, labels: &MetricLabels) -> GvrLabel {
        labels.of(self.group(), self.version(), self.resource())
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // As `GroupVersion` writes it: the core group is its version alone.
        if self.group().is_empty() {
            f.write_str(self.version())?;
        } else {
            write!(f, "{}/{}", self.group(), self.version())?;
        }
        if self.resource().is_empty() {
            // Not a resource: the group-version's OpenAPI document.
            return f.write_str(" (OpenAPI v3)");
        }
        write!(f, ", Resource={}", self.resource())?;
        if !self.subresource().is_empty() {
            write!(f, "/{}", self.subresource())?;
        }
        Ok(())
    }
}

/// Which apiserver the routing table says serves a forwarded request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServedBy {
    /// [`Reason::ServedLocally`].
    Local,
    /// [`Reason::ServedByPeer`].
    Peer,
    /// [`Reason::Retained`], sent to the departed apiservers that served it
    /// ([`Upstream::Departed`]): Envoy's own reply (no connection) is the retained 503.
    Departed,
    /// Sent to the local apiserver by a fallback configuration: this Envoy has had no
    /// configuration from its control plane yet, so nobody knows whether a peer serves it.
    Unknown,
}

/// A request routed to an apiserver the routing table says serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    pub by: ServedBy,
    pub target: Target,
    /// Its answer may come from behind the apiserver (the `proxy` verb; the `proxy`, `exec`,
    /// `attach`, `log` and `portforward` subresources): a `404 page not found` there may be
    /// the pod's or the kubelet's, not the apiserver's.
    pub relayed: bool,
    /// A list, watch or deletecollection: kube answers none of them NotFound for a route it
    /// has (a missing namespace lists empty), so a JSON 404 is its generic NotFound, no body
    /// needed to tell.
    pub collection: bool,
}

impl Served {
    /// Its group/version/resource as a counter label, bounded by the configuration. Looked
    /// up only when a counter needs it: most requests are served locally and count nothing.
    pub fn label(&self, labels: &MetricLabels) -> GvrLabel {
        self.target.label(labels)
    }

    fn new(by: ServedBy, info: RequestInfo<'_>) -> Self {
        let relayed = info.verb == "proxy"
            || matches!(
                &*info.subresource,
                "proxy" | "exec" | "attach" | "log" | "portforward"
            );
        let collection = matches!(&*info.verb, "list" | "watch" | "deletecollection");
        Served {
            by,
            target: Target::of(info),
            relayed,
            collection,
        }
    }
}

/// What the response phase needs of a forwarded request. The default is a request nobody is
/// known to serve, with nothing pending.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResponsePlan {
    /// A discovery request answered from the merged documents if the local apiserver lets the
    /// client read discovery at all: the negotiated answer.
    pub discovery: Option<DiscoveryChoice>,
    /// A resource request routed to an apiserver that serves it (served locally, or by a
    /// peer): for the 503 messages, and the 404 safety net. `None` for every other route
    /// (shared storage, served by nobody, non-resource, unparseable, discovery).
    pub served: Option<Served>,
    /// `GET /openapi/v3` with peer-only entries to add to a 200 answer.
    pub openapi_root: bool,
    /// The OpenAPI v3 document of a peer-only group-version: whatever the answer, it reaches
    /// the client with [`UNCACHEABLE`] (docs/ARCHITECTURE.md "OpenAPI v3", "Caching").
    pub uncacheable: bool,
}

/// The response header changes that keep an answer out of every client cache. kube-openapi
/// sends a document fetched with `?hash=` as `Cache-Control: public, immutable` with `Expires`
/// a year ahead, and kubectl keeps it that long in its disk cache under that URL, trusting the
/// hash to name the document. Nothing checks that a peer's document has the hash its URL
/// names (the filter cannot hold a multi-MB document to hash it), and the same URL is later
/// the local apiserver's, so a peer's answer is never stored: `no-store`, no `Expires`, and no
/// `ETag` or `Last-Modified` (with them a cache that kept it anyway would have the local
/// apiserver confirm it with a 304).
pub const UNCACHEABLE: [HeaderOp<'static>; 4] = [
    HeaderOp::Set("cache-control", Cow::Borrowed("no-store")),
    HeaderOp::Remove("expires"),
    HeaderOp::Remove("etag"),
    HeaderOp::Remove("last-modified"),
];

/// What replaces the response body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplacementBody {
    /// The merged discovery document.
    Discovery(DiscoveryChoice),
    /// A merged discovery document copied out of shared data
    /// ([`Replacement::fetch_stored`]).
    Fetched(Vec<u8>),
    /// A `metav1.Status` document.
    Status(String),
}

impl ReplacementBody {
    /// The bytes to send (`compiled` is the configuration the request was planned with).
    pub fn bytes<'s>(&'s self, compiled: &'s CompiledConfig) -> &'s [u8] {
        match self {
            ReplacementBody::Status(body) => body.as_bytes(),
            ReplacementBody::Fetched(body) => body,
            ReplacementBody::Discovery(choice) => compiled
                .discovery
                .as_ref()
                .and_then(|merged| merged.respond(*choice))
                .map_or(&[][..], |response| response.body),
        }
    }
}

/// Why a response is replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplaceCause {
    /// The local apiserver authorized a discovery request: the merged document answers it.
    MergedDiscovery,
    /// Envoy replied `envoy_code` itself; the client gets a Status with `code` (503 for a peer
    /// that could not answer).
    EnvoyReply { envoy_code: u16, code: u16 },
    /// The apiserver answered `404 page not found` for what the routing table says it
    /// serves: our view of it is out of date (it restarted on another version), so the
    /// client gets a 503 with `Retry-After` to retry, not a 404 to read as "gone".
    NotServed { by: ServedBy },
    /// A retained key went to the departed apiservers that served it and Envoy replied
    /// `envoy_code` itself (none of them answered): the client gets the retained 503.
    DepartedUnreachable { envoy_code: u16 },
}

/// A response to replace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replacement<'a> {
    pub cause: ReplaceCause,
    /// The status the client gets.
    pub status: u16,
    /// The response header changes, in order.
    pub headers: Vec<HeaderOp<'a>>,
    pub body: ReplacementBody,
    pub counter: Option<Counter>,
}

impl<'a> Replacement<'a> {
    /// A merged discovery answer whose document is kept in shared data
    /// ([`crate::shared_discovery`]): copy it into the VM now, before any header is sent, so
    /// that a document no longer there (its configuration version was evicted: this VM lags
    /// [`KEEP_VERSIONS`](crate::shared_discovery::KEEP_VERSIONS) configurations behind) becomes
    /// a retryable 503 instead of a merged answer without a body. Anything else is returned
    /// as it is. The copy lives until the body is sent.
    pub fn fetch_stored(
        self,
        compiled: &CompiledConfig,
        store: &(impl SharedData + ?Sized),
    ) -> Result<Replacement<'a>, (Replacement<'a>, StoreError)> {
        let ReplacementBody::Discovery(choice) = &self.body else {
            return Ok(self);
        };
        let Some(response) = compiled
            .discovery
            .as_ref()
            .and_then(|merged| merged.respond(*choice))
        else {
            return Ok(self);
        };
        let Some(key) = response.stored else {
            return Ok(self);
        };
        match shared_discovery::body(store, key, response.gzip) {
            Ok(Some(bytes)) => Ok(Replacement {
                body: ReplacementBody::Fetched(bytes),
                ..self
            }),
            Ok(None) => Ok(discovery_evicted(self)),
            Err(e) => Err((discovery_evicted(self), e)),
        }
    }
}

/// The 503 for a merged discovery document that is no longer in shared data.
fn discovery_evicted(replacement: Replacement<'_>) -> Replacement<'_> {
    let body = status::unavailable(
        "the merged discovery document of this configuration is being replaced; retry",
    );
    Replacement {
        cause: replacement.cause,
        status: 503,
        headers: vec![
            HeaderOp::Set(":status", Cow::Borrowed("503")),
            HeaderOp::Set("content-type", Cow::Borrowed(status::CONTENT_TYPE)),
            HeaderOp::Remove("content-length"),
            HeaderOp::Remove("content-encoding"),
            HeaderOp::Remove("etag"),
            HeaderOp::Remove("cache-control"),
            HeaderOp::Set("retry-after", Cow::Borrowed(status::RETRY_AFTER)),
        ],
        body: ReplacementBody::Status(body),
        counter: None,
    }
}

/// The response header changes for an answer replaced by a retryable `metav1.Status` with
/// `code`: the 404 safety net's and the departed apiservers' retained 503.
fn retryable_status_headers(code: u16) -> Vec<HeaderOp<'static>> {
    vec![
        HeaderOp::Set(":status", Cow::Owned(code.to_string())),
        HeaderOp::Set("content-type", Cow::Borrowed(status::CONTENT_TYPE)),
        HeaderOp::Remove("content-length"),
        HeaderOp::Remove("content-encoding"),
        HeaderOp::Set("retry-after", Cow::Borrowed(status::RETRY_AFTER)),
    ]
}

/// What to do with the response, decided when its headers arrive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponseDecision<'a> {
    Pass,
    /// The body passes; these response header changes apply.
    Rewrite(Vec<HeaderOp<'a>>),
    Replace(Replacement<'a>),
    /// The local apiserver's 200 for `/openapi/v3`: apply these header changes now, buffer the
    /// body (at most [`openapi::MAX_ROOT_BYTES`]) and send [`openapi::union_root`] of it.
    AddOpenApiEntries(Vec<HeaderOp<'a>>),
    /// A JSON 404 from an apiserver the routing table says serves the request, for an object
    /// (a collection's is decided at once): hold the headers, buffer the body (at most
    /// [`local_reply::MAX_NOT_FOUND_BODY`]) and decide on it with
    /// [`ResponsePlan::decide_not_found_body`]. A host that cannot hold response headers while
    /// it reads the body passes it as it came.
    ReadNotFound,
}

/// The `:status` of a response; 0 when absent or unreadable.
pub fn status_code(status: Option<&[u8]>) -> u16 {
    status
        .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u16>().ok())
        .unwrap_or(0)
}

impl ResponsePlan {
    /// The counter of a request routed to a peer, once its response starts: `code` is the
    /// status the client gets (after any replacement), as upstream counts it.
    pub fn rerouted(&self, compiled: &CompiledConfig, code: u16) -> Option<Counter> {
        match &self.served {
            Some(served) if matches!(served.by, ServedBy::Peer | ServedBy::Departed) => {
                Some(Counter::Rerouted {
                    code,
                    gvr: served.label(&compiled.labels),
                })
            }
            _ => None,
        }
    }

    /// Whether [`decide`](Self::decide) needs Envoy's `response.code_details` for a response
    /// with this status (the shell reads it only then).
    pub fn needs_details(&self, code: u16) -> bool {
        code >= 400 && !self.answers_discovery(code)
    }

    /// Whether [`decide`](Self::decide) needs the response's `content-type` (the shell reads
    /// it only then): a 404 for a request routed to an apiserver that serves it, which may be
    /// that apiserver's `404 page not found` (the 404 safety net).
    pub fn needs_content_type(&self, code: u16, details: &str) -> bool {
        code == 404
            && (details == local_reply::VIA_UPSTREAM || details.is_empty())
            && self.served.as_ref().is_some_and(|served| !served.relayed)
    }

    /// The local apiserver authorized a discovery request we answer: 200, or 404 for a legacy
    /// path it does not serve itself (kube authorizes before routing). 401, 403 and the rest:
    /// the apiserver's own answer stands.
    fn answers_discovery(&self, code: u16) -> bool {
        self.discovery.is_some() && (code == 200 || code == 404)
    }

    /// Step 9: answer an authorized discovery request with the merged document, make an
    /// apiserver's `404 page not found` for what it serves a 503, give Envoy's own replies a
    /// Status body, and make an unreachable peer a 503. `details` is Envoy's
    /// `response.code_details`, empty when not read; `content_type` the response's, read only
    /// when [`needs_content_type`](Self::needs_content_type).
    ///
    /// Every answer to an [`uncacheable`](Self::uncacheable) request, passed or replaced,
    /// gets [`UNCACHEABLE`] last.
    pub fn decide<'c>(
        &self,
        compiled: &'c CompiledConfig,
        code: u16,
        details: &str,
        content_type: Option<&[u8]>,
    ) -> ResponseDecision<'c> {
        self.uncacheable_if_asked(self.decide_cacheable(compiled, code, details, content_type))
    }

    /// The body of a JSON 404 [`decide`](Self::decide) asked to read
    /// ([`ResponseDecision::ReadNotFound`]): kube's generic NotFound means the apiserver has no
    /// route for the request, although the routing table says it serves it, the same as its
    /// `404 page not found`: a 503. A missing object's NotFound, or a body past
    /// [`local_reply::MAX_NOT_FOUND_BODY`] (`None`), passes.
    pub fn decide_not_found_body<'c>(
        &self,
        compiled: &'c CompiledConfig,
        body: Option<&[u8]>,
    ) -> ResponseDecision<'c> {
        let decision = match body.filter(|b| local_reply::is_no_route(b)) {
            Some(_) => self
                .not_served_replacement(compiled)
                .map_or(ResponseDecision::Pass, ResponseDecision::Replace),
            None => ResponseDecision::Pass,
        };
        self.uncacheable_if_asked(decision)
    }

    /// Every answer to an [`uncacheable`](Self::uncacheable) request gets [`UNCACHEABLE`] last.
    fn uncacheable_if_asked<'c>(&self, decision: ResponseDecision<'c>) -> ResponseDecision<'c> {
        if !self.uncacheable {
            return decision;
        }
        match decision {
            ResponseDecision::Pass => ResponseDecision::Rewrite(UNCACHEABLE.to_vec()),
            ResponseDecision::Rewrite(mut headers) => {
                headers.extend(UNCACHEABLE);
                ResponseDecision::Rewrite(headers)
            }
            ResponseDecision::Replace(mut replacement) => {
                replacement.headers.extend(UNCACHEABLE);
                ResponseDecision::Replace(replacement)
            }
            ResponseDecision::AddOpenApiEntries(mut headers) => {
                headers.extend(UNCACHEABLE);
                ResponseDecision::AddOpenApiEntries(headers)
            }
            // Decided once the body is read, where this applies again.
            ResponseDecision::ReadNotFound => ResponseDecision::ReadNotFound,
        }
    }

    fn decide_cacheable<'c>(
        &self,
        compiled: &'c CompiledConfig,
        code: u16,
        details: &str,
        content_type: Option<&[u8]>,
    ) -> ResponseDecision<'c> {
        if let Some(replacement) = self.discovery_answer(compiled, code) {
            return ResponseDecision::Replace(replacement);
        }
        // Only the apiserver's own 200 (a 401 or 403 stands). The body changes: its length,
        // ETag and Last-Modified no longer describe it.
        if self.openapi_root && code == 200 {
            return ResponseDecision::AddOpenApiEntries(vec![
                HeaderOp::Remove("content-length"),
                HeaderOp::Remove("etag"),
                HeaderOp::Remove("last-modified"),
            ]);
        }
        if code < 400 {
            return ResponseDecision::Pass;
        }
        if let Some(replacement) = self.not_served(compiled, code, details, content_type) {
            return ResponseDecision::Replace(replacement);
        }
        if self.needs_content_type(code, details)
            && local_reply::is_json_not_found(code, details, content_type)
        {
            if self.served.as_ref().is_some_and(|s| s.collection) {
                if let Some(replacement) = self.not_served_replacement(compiled) {
                    return ResponseDecision::Replace(replacement);
                }
            }
            return ResponseDecision::ReadNotFound;
        }
        if let Some(replacement) = self.departed_unreachable(compiled, code, details) {
            return ResponseDecision::Replace(replacement);
        }
        // Formatted only for a reply Envoy made for a peer-bound request.
        let peer_target = match &self.served {
            Some(
                served @ Served {
                    by: ServedBy::Peer | ServedBy::Departed,
                    target,
                    ..
                },
            ) if !details.is_empty() && details != local_reply::VIA_UPSTREAM => {
                Some((target.to_string(), served.label(&compiled.labels)))
            }
            _ => None,
        };
        let routed = match &peer_target {
            Some((target, _)) => RoutedTo::Peer { target },
            None => RoutedTo::Local,
        };
        let Some(rewrite) = local_reply::rewrite(routed, code, details) else {
            return ResponseDecision::Pass;
        };
        // A peer-bound request that reached no peer: retryable, with `Retry-After`.
        let headers = if peer_target.is_some() && local_reply::never_connected(details) {
            retryable_status_headers(rewrite.code)
        } else {
            vec![
                HeaderOp::Set(":status", Cow::Owned(rewrite.code.to_string())),
                HeaderOp::Set("content-type", Cow::Borrowed(status::CONTENT_TYPE)),
                HeaderOp::Remove("content-length"),
            ]
        };
        ResponseDecision::Replace(Replacement {
            cause: ReplaceCause::EnvoyReply {
                envoy_code: code,
                code: rewrite.code,
            },
            status: rewrite.code,
            headers,
            body: ReplacementBody::Status(rewrite.body),
            counter: peer_target.map(|(_, gvr)| Counter::PeerProxyError {
                kind: local_reply::peer_error(code, details),
                gvr,
            }),
        })
    }

    /// A retained key sent to the departed apiservers that served it, and Envoy answered
    /// itself without ever reaching one (none ready, refused, no cluster): none of them is
    /// back, so the answer is the retained 503 with `Retry-After`, as if the filter had sent
    /// it nowhere. A reset or a timeout after the request went out is not this: that apiserver
    /// may have acted on it, so it gets a peer's answer (503 without `Retry-After`, which
    /// client-go would otherwise repeat for any method).
    fn departed_unreachable<'c>(
        &self,
        compiled: &CompiledConfig,
        code: u16,
        details: &str,
    ) -> Option<Replacement<'c>> {
        let served = self.served.as_ref()?;
        let not_processed =
            local_reply::never_connected(details) || details.contains("cluster_not_found");
        if served.by != ServedBy::Departed || !not_processed {
            return None;
        }
        Some(Replacement {
            cause: ReplaceCause::DepartedUnreachable { envoy_code: code },
            status: 503,
            headers: retryable_status_headers(503),
            body: ReplacementBody::Status(status::unavailable(&retained_message(&served.target))),
            counter: Some(Counter::Retained {
                gvr: served.label(&compiled.labels),
            }),
        })
    }

    /// The 404 safety net: an apiserver the routing table says serves the request answered
    /// `404 page not found`.
    fn not_served<'c>(
        &self,
        compiled: &CompiledConfig,
        code: u16,
        details: &str,
        content_type: Option<&[u8]>,
    ) -> Option<Replacement<'c>> {
        if !self.needs_content_type(code, details)
            || !local_reply::is_page_not_found(code, details, content_type)
        {
            return None;
        }
        self.not_served_replacement(compiled)
    }

    /// The 503 of the 404 safety net, for an apiserver that said it has no route for what the
    /// routing table says it serves (its `404 page not found`, or kube's generic NotFound).
    fn not_served_replacement<'c>(&self, compiled: &CompiledConfig) -> Option<Replacement<'c>> {
        let served = self.served.as_ref()?;
        let rewrite = match served.by {
            ServedBy::Unknown => local_reply::not_known(&served.target.to_string()),
            ServedBy::Local | ServedBy::Peer | ServedBy::Departed => {
                local_reply::not_served(&served.target.to_string())
            }
        };
        Some(Replacement {
            cause: ReplaceCause::NotServed { by: served.by },
            status: rewrite.code,
            headers: retryable_status_headers(rewrite.code),
            body: ReplacementBody::Status(rewrite.body),
            counter: Some(Counter::NotServed {
                gvr: served.label(&compiled.labels),
            }),
        })
    }

    /// The merged discovery answer, if the local apiserver authorized the request.
    fn discovery_answer<'c>(
        &self,
        compiled: &'c CompiledConfig,
        code: u16,
    ) -> Option<Replacement<'c>> {
        let choice = self.discovery?;
        if !self.answers_discovery(code) {
            return None;
        }
        let response = compiled.discovery.as_ref()?.respond(choice)?;
        // kube-apiserver's headers for a discovery answer, over the local apiserver's.
        let mut headers = vec![
            HeaderOp::Set(":status", Cow::Owned(response.status.to_string())),
            HeaderOp::Set("content-type", Cow::Borrowed(response.content_type)),
            HeaderOp::Remove("content-length"),
        ];
        match response.etag {
            Some(etag) => headers.extend([
                // Aggregated discovery is cacheable and varies by Accept (v2, v2beta1, legacy).
                HeaderOp::Set("etag", Cow::Borrowed(etag)),
                HeaderOp::Set("vary", Cow::Borrowed("Accept")),
                HeaderOp::Set("cache-control", Cow::Borrowed("public")),
            ]),
            None => headers.push(HeaderOp::Remove("etag")),
        }
        if response.gzip {
            headers.extend([
                HeaderOp::Set("content-encoding", Cow::Borrowed("gzip")),
                HeaderOp::Add("vary", Cow::Borrowed("Accept-Encoding")),
            ]);
        } else {
            headers.push(HeaderOp::Remove("content-encoding"));
        }
        Some(Replacement {
            cause: ReplaceCause::MergedDiscovery,
            status: response.status,
            headers,
            body: ReplacementBody::Discovery(choice),
            counter: Some(Counter::DiscoveryCacheHit),
        })
    }
}

#[cfg(test)]
mod tests {
    /// A missing object's NotFound, as kube-apiserver answers it.
    const MISSING_OBJECT: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"deployments.apps \"gone\" not found","reason":"NotFound","details":{"name":"gone","group":"apps","kind":"deployments"},"code":404}"#;

    use super::*;
    use crate::config::SCHEMA_VERSION;
    use crate::config::{DiscoveryConfig, GroupVersionRoutes, JsonDocument, ResourceRoute};
    use crate::routing::Reason;
    use std::collections::BTreeMap;

    const CLAIM: &str = "/apis/resource.k8s.io/v1beta2/namespaces/default/resourceclaims/gpu";
    const RESIZE: &str = "/api/v1/namespaces/default/pods/web/resize";
    const V2: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
    const APIS: &str = r#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","metadata":{},"items":[]}"#;

    fn compiled(discovery: bool) -> CompiledConfig {
        let route = |resource: &str, local: bool, peer: Option<&str>| ResourceRoute {
            departed_cluster: None,
            retained: false,
            failover_cluster: None,
            resource: resource.into(),
            local,
            peer_cluster: peer.map(str::to_string),
        };
        let gv = |group: &str, version: &str, resources| GroupVersionRoutes {
            group: group.into(),
            version: version.into(),
            shared_storage: false,
            resources,
        };
        CompiledConfig::compile(&FilterConfig {
            departed_clusters: Default::default(),
            fallback: None,
            pending_peers: Vec::new(),
            openapi_v3: Default::default(),
            failover_clusters: Default::default(),
            failover_all: None,
            schema: SCHEMA_VERSION,
            local_apiserver: "apiserver-a".into(),
            peer_clusters: BTreeMap::from([("p133".to_string(), vec!["b".to_string()])]),
            group_versions: vec![
                gv(
                    "",
                    "v1",
                    vec![
                        route("pods", true, None),
                        route("pods/resize", false, Some("p133")),
                    ],
                ),
                gv(
                    "resource.k8s.io",
                    "v1beta2",
                    vec![route("resourceclaims", false, Some("p133"))],
                ),
            ],
            discovery: discovery.then(|| DiscoveryConfig {
                version: String::new(),
                unavailable: Default::default(),
                apis: JsonDocument::from_str(APIS).unwrap(),
                apis_etag: "aaa".into(),
                api: JsonDocument::from_str(APIS).unwrap(),
                api_etag: "bbb".into(),
                legacy: BTreeMap::new(),
            }),
        })
    }

    fn headers(method: &str, path: &str, extra: &[(&str, &[u8])]) -> Vec<(String, Vec<u8>)> {
        let mut h = vec![
            (":method".to_string(), method.as_bytes().to_vec()),
            (":path".to_string(), path.as_bytes().to_vec()),
        ];
        h.extend(extra.iter().map(|(n, v)| (n.to_string(), v.to_vec())));
        h
    }

    fn forward(plan: RequestPlan<'_>) -> Forward<'_> {
        match plan {
            RequestPlan::Forward(f) => f,
            other => panic!("not forwarded: {other:?}"),
        }
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn plans_auth_cluster_class_and_route() {
        let c = compiled(true);
        let token: &[(&str, &[u8])] = &[("authorization", b"Bearer \xff")];
        // A list with a label selector too long to read: routed on its path, unbounded (the
        // query may say watch), and a 404 from where it goes is still caught.
        let selector = format!("?labelSelector=app+in+({})", "a1,".repeat(30_000));
        let claims_long = format!("/apis/resource.k8s.io/v1beta2/resourceclaims{selector}");
        let pods_long = format!("/api/v1/pods{selector}");
        // (method, path, headers, subject, auth, cluster, class, served by, counters)
        type Case<'a> = (
            &'a str,
            &'a str,
            &'a [(&'a str, &'a [u8])],
            Option<&'a [u8]>,
            UpstreamAuth,
            &'a str,
            RequestClass,
            Option<(ServedBy, &'a str)>,
            Vec<Counter>,
        );
        let cases: Vec<Case> = vec![
            (
                "GET",
                "/api/v1/pods",
                token,
                None,
                UpstreamAuth::Token,
                "skewgate-local-token",
                RequestClass::Short,
                Some((ServedBy::Local, "v1, Resource=pods")),
                vec![],
            ),
            (
                "GET",
                CLAIM,
                &[],
                None,
                UpstreamAuth::Anonymous,
                "p133-anonymous",
                RequestClass::Short,
                Some((
                    ServedBy::Peer,
                    "resource.k8s.io/v1beta2, Resource=resourceclaims",
                )),
                vec![],
            ),
            (
                "PATCH",
                RESIZE,
                token,
                Some(b"CN=alice"),
                UpstreamAuth::ProxyIdentity,
                "p133-identity",
                RequestClass::Short,
                Some((ServedBy::Peer, "v1, Resource=pods/resize")),
                vec![],
            ),
            (
                "GET",
                "/api/v1/pods?watch=1",
                &[],
                Some(b""),
                UpstreamAuth::Anonymous,
                "skewgate-local-anonymous",
                RequestClass::Unbounded,
                Some((ServedBy::Local, "v1, Resource=pods")),
                vec![],
            ),
            (
                "GET",
                &claims_long,
                &[],
                None,
                UpstreamAuth::Anonymous,
                "p133-anonymous",
                RequestClass::Unbounded,
                Some((
                    ServedBy::Peer,
                    "resource.k8s.io/v1beta2, Resource=resourceclaims",
                )),
                vec![],
            ),
            (
                "GET",
                &pods_long,
                &[],
                None,
                UpstreamAuth::Anonymous,
                "skewgate-local-anonymous",
                RequestClass::Unbounded,
                Some((ServedBy::Local, "v1, Resource=pods")),
                vec![],
            ),
            // Unparseable: the local apiserver answers it, unbounded as without us.
            (
                "GET",
                "/api/v1/namespaces/%zz/pods",
                &[],
                None,
                UpstreamAuth::Anonymous,
                "skewgate-local-anonymous",
                RequestClass::Unbounded,
                None,
                vec![],
            ),
            (
                "GET",
                "/apis/apps",
                &[],
                None,
                UpstreamAuth::Anonymous,
                "skewgate-local-anonymous",
                RequestClass::Short,
                None,
                vec![Counter::DiscoveryCacheMiss],
            ),
        ];
        for (method, path, extra, subject, auth, cluster, class, served, counters) in cases {
            let h = headers(method, path, extra);
            let f = forward(plan_request(&h, subject, &c));
            assert_eq!(f.auth.upstream(), auth, "{path}");
            assert_eq!(f.cluster, cluster, "{path}");
            assert_eq!(f.class, class, "{path}");
            // Envoy's routes read the class from this header: only an unbounded request
            // carries it (any other gets the short-request timeout).
            let marked = f.header_ops().contains(&HeaderOp::Set(
                "x-skewgate-request-class",
                Cow::Borrowed("unbounded"),
            ));
            assert_eq!(marked, class == RequestClass::Unbounded, "{path}");
            let got = f.response.served.as_ref();
            let got = got.map(|s| (s.by, s.target.to_string()));
            let want = served.map(|(by, target)| (by, target.to_string()));
            assert_eq!(got, want, "{path}");
            assert_eq!(f.response.discovery, None, "{path}");
            assert_eq!(f.counters, counters, "{path}");
            assert!(matches!(f.route, Route::Table(_)), "{path}");
            // A peer-bound request is counted when its response starts, with the status the
            // client gets and the resource (never the subresource) as labels.
            let rerouted = f.response.rerouted(&c, 201).map(|k| k.stat_name(&c.labels));
            let want = match path {
                p if p == CLAIM || p == claims_long => Some("apiserver_rerouted_request_total;code=201;group=resource.k8s.io;version=v1beta2;resource=resourceclaims"),
                RESIZE => Some("apiserver_rerouted_request_total;code=201;group=;version=v1;resource=pods"),
                _ => None,
            };
            assert_eq!(rerouted.as_deref(), want, "{path}");
        }
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn header_ops_strip_first_then_identity_then_routing() {
        let c = compiled(true);
        let h = headers(
            "GET",
            CLAIM,
            &[
                ("X-Remote-User", b"mallory"),
                ("x-skewgate-upstream-cluster", b"evil"),
                ("x-kubernetes-peer-proxied", b"true"),
                ("accept", b"application/json"),
            ],
        );
        let f = forward(plan_request(&h, Some(b"O=b,O=a,CN=alice"), &c));
        assert_eq!(
            f.strip,
            [
                "X-Remote-User",
                "x-skewgate-upstream-cluster",
                "x-kubernetes-peer-proxied"
            ]
        );
        assert_eq!(
            f.route,
            Route::Table(Decision {
                upstream: Upstream::Peer { cluster: "p133" },
                reason: Reason::ServedByPeer
            })
        );
        let b = |s: &'static str| Cow::Borrowed(s);
        assert_eq!(
            f.header_ops(),
            vec![
                HeaderOp::Remove("X-Remote-User"),
                HeaderOp::Remove("x-skewgate-upstream-cluster"),
                HeaderOp::Remove("x-kubernetes-peer-proxied"),
                HeaderOp::Add("x-remote-user", b("alice")),
                HeaderOp::Add("x-remote-group", b("a")),
                HeaderOp::Add("x-remote-group", b("b")),
                HeaderOp::Set("x-kubernetes-peer-proxied", b("true")),
                HeaderOp::Set("x-skewgate-upstream-cluster", b("p133-identity")),
            ]
        );
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn an_unmappable_certificate_is_refused() {
        let c = compiled(true);
        let h = headers("GET", "/api/v1/pods", &[("authorization", b"Bearer x")]);
        for subject in [&b"O=x"[..], b"CN=\xff", b"CN=a\\0Ab", b",,,"] {
            match plan_request(&h, Some(subject), &c) {
                RequestPlan::RefuseCertificate { reply, error, .. } => {
                    assert_eq!(reply.code, 401);
                    assert_eq!(reply.content_type, status::CONTENT_TYPE);
                    assert!(reply.body.contains(&error.to_string()), "{}", reply.body);
                }
                other => panic!("{subject:?}: {other:?}"),
            }
        }
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn discovery_is_negotiated_once_and_answered_from_the_choice() {
        let c = compiled(true);
        let h = headers(
            "GET",
            "/apis?timeout=32s",
            &[
                ("accept", V2.as_bytes()),
                ("if-none-match", b"\"old\""),
                ("accept-encoding", b"gzip"),
                ("authorization", b"Bearer x"),
            ],
        );
        let f = forward(plan_request(&h, None, &c));
        assert_eq!(f.route, Route::MergedDiscovery);
        assert_eq!(f.class, RequestClass::Short);
        assert_eq!(f.cluster, "skewgate-local-token");
        assert!(f.counters.is_empty());
        assert!(f.response.served.is_none());
        assert!(f.response.discovery.is_some());
        assert_eq!(
            f.header_ops(),
            vec![
                HeaderOp::Set("accept", Cow::Borrowed("application/json")),
                HeaderOp::Remove("if-none-match"),
                HeaderOp::Remove("accept-encoding"),
                HeaderOp::Set(
                    "x-skewgate-upstream-cluster",
                    Cow::Borrowed("skewgate-local-token")
                ),
            ]
        );
        let plan = f.response;
        // Only an authorized answer is replaced; code_details is needed for the others >= 400.
        for (code, replaced, needs_details) in [
            (200, true, false),
            (404, true, false),
            (304, false, false),
            (401, false, true),
            (403, false, true),
            (503, false, true),
        ] {
            assert_eq!(plan.needs_details(code), needs_details, "{code}");
            assert!(!plan.needs_content_type(code, "via_upstream"), "{code}");
            let decision = plan.decide(&c, code, "via_upstream", Some(b"text/plain"));
            match decision {
                ResponseDecision::Replace(r) if replaced => {
                    assert_eq!(r.cause, ReplaceCause::MergedDiscovery);
                    assert_eq!(r.counter, Some(Counter::DiscoveryCacheHit));
                    assert_eq!(r.body.bytes(&c), APIS.as_bytes());
                    assert_eq!(
                        r.headers,
                        vec![
                            HeaderOp::Set(":status", Cow::Owned("200".to_string())),
                            HeaderOp::Set("content-type", Cow::Borrowed(V2)),
                            HeaderOp::Remove("content-length"),
                            HeaderOp::Set("etag", Cow::Borrowed("\"aaa\"")),
                            HeaderOp::Set("vary", Cow::Borrowed("Accept")),
                            HeaderOp::Set("cache-control", Cow::Borrowed("public")),
                            HeaderOp::Remove("content-encoding"),
                        ]
                    );
                }
                ResponseDecision::Pass if !replaced => {}
                other => panic!("{code}: {other:?}"),
            }
        }
        // Without merged discovery configured, the same request is a miss, routed locally.
        let without = compiled(false);
        let f = forward(plan_request(&h, None, &without));
        assert!(f.response.discovery.is_none());
        assert!(matches!(f.route, Route::Table(_)));
        // And a choice made on another configuration answers nothing rather than panicking.
        let body = ReplacementBody::Discovery(plan.discovery.unwrap());
        assert_eq!(body.bytes(&without), b"");
    }

    /// `:method` and `:path` as text: borrowed when UTF-8, each bad sequence U+FFFD otherwise,
    /// as `String::from_utf8_lossy` gives them.
    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn lossy() {
        for bytes in [
            &b""[..],
            b"/apis/apps/v1",
            b"/caf\xc3\xa9",
            b"/\xff/x",
            b"\xc3",
            b"a\xf0\x9f\x98",
            b"\xed\xa0\x80",
        ] {
            let got = super::lossy(bytes);
            assert_eq!(got, String::from_utf8_lossy(bytes), "{bytes:?}");
            assert_eq!(
                matches!(got, Cow::Borrowed(_)),
                std::str::from_utf8(bytes).is_ok()
            );
        }
    }

    /// A target gives back its four names, empty ones included, and reads as kube's messages
    /// name a group-version-resource.
    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn a_target_keeps_its_names_in_one_string() {
        for (names, text) in [
            (
                ["apps", "v1", "deployments", ""],
                "apps/v1, Resource=deployments",
            ),
            (["", "v1", "pods", "log"], "v1, Resource=pods/log"),
            (
                ["resource.k8s.io", "v1beta2", "", ""],
                "resource.k8s.io/v1beta2 (OpenAPI v3)",
            ),
            (["", "", "", ""], " (OpenAPI v3)"),
            (
                ["\u{e9}", "v\u{1f600}", "r", "s"],
                "\u{e9}/v\u{1f600}, Resource=r/s",
            ),
        ] {
            let [group, version, resource, subresource] = names;
            let t = Target::new(group, version, resource, subresource);
            assert_eq!(
                [t.group(), t.version(), t.resource(), t.subresource()],
                names
            );
            assert_eq!(t.to_string(), text);
        }
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn envoy_replies_become_status_and_a_dead_peer_503() {
        let c = compiled(true);
        let peer = ResponsePlan {
            discovery: None,
            openapi_root: false,
            uncacheable: false,
            served: Some(Served {
                by: ServedBy::Peer,
                target: Target::new("g", "v", "r", ""),
                relayed: false,
                collection: false,
            }),
        };
        let local = ResponsePlan::default();
        assert!(peer.needs_details(503) && !peer.needs_details(200));
        assert_eq!(peer.decide(&c, 200, "", None), ResponseDecision::Pass);
        assert_eq!(
            peer.decide(&c, 503, "via_upstream", None),
            ResponseDecision::Pass
        );
        assert_eq!(peer.decide(&c, 503, "", None), ResponseDecision::Pass);
        let ResponseDecision::Replace(r) = peer.decide(&c, 504, "upstream_response_timeout", None)
        else {
            panic!("not replaced")
        };
        assert_eq!(
            r.cause,
            ReplaceCause::EnvoyReply {
                envoy_code: 504,
                code: 503
            }
        );
        assert_eq!(r.status, 503);
        assert_eq!(
            r.counter,
            Some(Counter::PeerProxyError {
                kind: PeerError::Timeout,
                gvr: GvrLabel::OTHER
            })
        );
        assert_eq!(
            r.headers,
            vec![
                HeaderOp::Set(":status", Cow::Owned("503".to_string())),
                HeaderOp::Set("content-type", Cow::Borrowed("application/json")),
                HeaderOp::Remove("content-length"),
            ]
        );
        let body = String::from_utf8(r.body.bytes(&c).to_vec()).unwrap();
        assert!(body.contains("g/v, Resource=r did not answer"), "{body}");
        // No peer of the set reached (refused, or every one silent or not ready): it did
        // nothing, so the 503 says when to retry, whatever the method.
        for details in [
            "no_healthy_upstream",
            "upstream_reset_before_response_started{remote_connection_failure}",
        ] {
            let ResponseDecision::Replace(r) = peer.decide(&c, 503, details, None) else {
                panic!("{details}: not replaced")
            };
            assert_eq!(r.status, 503, "{details}");
            assert_eq!(r.headers, retryable_status_headers(503), "{details}");
            let body: serde_json::Value = serde_json::from_slice(r.body.bytes(&c)).unwrap();
            assert_eq!(body["details"]["retryAfterSeconds"], 5, "{details}");
            assert!(
                body["message"]
                    .as_str()
                    .unwrap()
                    .contains("could not be reached"),
                "{body}"
            );
        }
        let ResponseDecision::Replace(r) = local.decide(&c, 504, "upstream_response_timeout", None)
        else {
            panic!("not replaced")
        };
        assert_eq!(
            r.cause,
            ReplaceCause::EnvoyReply {
                envoy_code: 504,
                code: 504
            }
        );
        assert_eq!(r.counter, None);
    }

    /// A local apiserver that lost `pods/resize` and `resource.k8s.io/v1beta3` (retained: the
    /// apiserver that served them is gone), with a peer serving `v1beta2`, and `pending` peers
    /// whose discovery is not known yet.
    fn failsafe(pending: &[&str]) -> CompiledConfig {
        CompiledConfig::compile(&failsafe_config(pending))
    }

    fn failsafe_config(pending: &[&str]) -> FilterConfig {
        let route = |resource: &str, local: bool, peer: Option<&str>| ResourceRoute {
            departed_cluster: None,
            retained: false,
            failover_cluster: None,
            resource: resource.into(),
            local,
            peer_cluster: peer.map(str::to_string),
        };
        let retained = |resource: &str| ResourceRoute {
            retained: true,
            failover_cluster: None,
            ..route(resource, false, None)
        };
        let gv = |group: &str, version: &str, resources| GroupVersionRoutes {
            group: group.into(),
            version: version.into(),
            shared_storage: false,
            resources,
        };
        let config = FilterConfig {
            departed_clusters: Default::default(),
            fallback: None,
            pending_peers: pending.iter().map(|p| p.to_string()).collect(),
            openapi_v3: Default::default(),
            failover_clusters: Default::default(),
            failover_all: None,
            schema: SCHEMA_VERSION,
            local_apiserver: "apiserver-a".into(),
            peer_clusters: BTreeMap::from([("p133".to_string(), vec!["b".to_string()])]),
            group_versions: vec![
                gv(
                    "",
                    "v1",
                    vec![route("pods", true, None), retained("pods/resize")],
                ),
                gv(
                    "resource.k8s.io",
                    "v1beta2",
                    vec![route("resourceclaims", false, Some("p133"))],
                ),
                gv(
                    "resource.k8s.io",
                    "v1beta3",
                    vec![retained("resourceclaims")],
                ),
                GroupVersionRoutes {
                    group: "stable.example.com".into(),
                    version: "v1".into(),
                    shared_storage: true,
                    resources: vec![],
                },
            ],
            discovery: Some(DiscoveryConfig {
                version: String::new(),
                unavailable: ["/apis/resource.k8s.io/v1beta3".to_string()].into(),
                apis: JsonDocument::from_str(APIS).unwrap(),
                apis_etag: "aaa".into(),
                api: JsonDocument::from_str(APIS).unwrap(),
                api_etag: "bbb".into(),
                legacy: BTreeMap::new(),
            }),
        };
        config.validate().unwrap();
        config
    }

    /// [`failsafe`] with `resource.k8s.io/v1beta3` retained from a departed apiserver `c`
    /// whose last address is known.
    fn departed() -> CompiledConfig {
        let mut config = failsafe_config(&[]);
        config.departed_clusters =
            BTreeMap::from([("skewgate-departed-c".to_string(), vec!["c".to_string()])]);
        for gv in &mut config.group_versions {
            for route in &mut gv.resources {
                if gv.version == "v1beta3" {
                    route.departed_cluster = Some("skewgate-departed-c".into());
                }
            }
        }
        config.validate().unwrap();
        CompiledConfig::compile(&config)
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn a_retained_key_goes_to_its_departed_apiserver_whose_silence_is_the_retained_503() {
        const RETAINED: &str = "no live apiserver serves resource.k8s.io/v1beta3, Resource=resourceclaims now; the apiserver that served it is gone or restarting (retry)";
        let c = departed();
        let headers = [
            (":method", "GET"),
            (
                ":path",
                "/apis/resource.k8s.io/v1beta3/namespaces/d/resourceclaims/x",
            ),
        ];
        let RequestPlan::Forward(forward) = plan_request(&headers, None, &c) else {
            panic!("not forwarded")
        };
        assert_eq!(forward.cluster, "skewgate-departed-c-anonymous");
        assert_eq!(
            forward.route,
            Route::Table(Decision {
                upstream: Upstream::Departed {
                    cluster: "skewgate-departed-c"
                },
                reason: Reason::Retained,
            })
        );
        // The loop guard: a departed apiserver that is back serves it itself.
        assert!(forward
            .header_ops()
            .contains(&HeaderOp::Set(PEER_PROXIED, Cow::Borrowed("true"))));
        let response = forward.response;
        assert_eq!(
            response.served.as_ref().map(|s| s.by),
            Some(ServedBy::Departed)
        );

        // Envoy's own replies without a connection (none ready, refused, TLS, no cluster): the
        // retained 503, with Retry-After.
        for (code, details) in [
            (503, "upstream_reset_before_response_started{remote_connection_failure,delayed_connect_error:_Connection_refused}"),
            (503, "upstream_reset_before_response_started{connection_failure}"),
            (503, "no_healthy_upstream"),
            (503, "cluster_not_found"),
        ] {
            let ResponseDecision::Replace(r) = response.decide(&c, code, details, None) else {
                panic!("{details}: not replaced")
            };
            assert_eq!(r.cause, ReplaceCause::DepartedUnreachable { envoy_code: code });
            assert_eq!(r.status, 503);
            assert!(r
                .headers
                .contains(&HeaderOp::Set("retry-after", Cow::Borrowed(status::RETRY_AFTER))));
            assert!(matches!(r.counter, Some(Counter::Retained { .. })), "{details}");
            let body = String::from_utf8(r.body.bytes(&c).to_vec()).unwrap();
            assert!(body.contains(RETAINED), "{body}");
        }
        // After the request went out (a reset, a timeout) the apiserver may have acted on it:
        // a peer's 503, without Retry-After (client-go would repeat even a POST on it).
        for (code, details) in [
            (504, "upstream_response_timeout"),
            (
                503,
                "upstream_reset_before_response_started{connection_termination}",
            ),
        ] {
            let ResponseDecision::Replace(r) = response.decide(&c, code, details, None) else {
                panic!("{details}: not replaced")
            };
            assert_eq!(
                r.cause,
                ReplaceCause::EnvoyReply {
                    envoy_code: code,
                    code: 503
                },
                "{details}"
            );
            assert!(
                !r.headers
                    .iter()
                    .any(|h| matches!(h, HeaderOp::Set("retry-after", _))),
                "{details}"
            );
            assert!(
                matches!(r.counter, Some(Counter::PeerProxyError { .. })),
                "{details}"
            );
        }
        // It is back and answers: its answer stands, counted as rerouted.
        const VIA: &str = local_reply::VIA_UPSTREAM;
        assert_eq!(response.decide(&c, 200, VIA, None), ResponseDecision::Pass);
        assert!(matches!(
            response.rerouted(&c, 200),
            Some(Counter::Rerouted { code: 200, .. })
        ));
        assert_eq!(
            response.decide(&c, 404, VIA, Some(b"application/json")),
            ResponseDecision::ReadNotFound,
            "a JSON 404 is read"
        );
        assert_eq!(
            response.decide_not_found_body(&c, Some(MISSING_OBJECT.as_bytes())),
            ResponseDecision::Pass,
            "a missing object's 404 from the apiserver that serves the resource stands"
        );
        // Back on a version that no longer serves it: `404 page not found` is a 503.
        let ResponseDecision::Replace(r) =
            response.decide(&c, 404, VIA, Some(b"text/plain; charset=utf-8"))
        else {
            panic!("page not found passed")
        };
        assert_eq!(
            r.cause,
            ReplaceCause::NotServed {
                by: ServedBy::Departed
            }
        );
        assert_eq!(r.status, 503);

        // Without the departed cluster (no address known): the filter's own 503, as before.
        let RequestPlan::Unavailable { cause, .. } = plan_request(&headers, None, &failsafe(&[]))
        else {
            panic!("forwarded")
        };
        assert_eq!(cause, Unavailable::Retained);
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn what_no_live_apiserver_serves_now_is_answered_503_here() {
        const RETAINED: &str = "no live apiserver serves resource.k8s.io/v1beta3, Resource=resourceclaims now; the apiserver that served it is gone or restarting (retry)";
        const RESIZE_RETAINED: &str = "no live apiserver serves v1, Resource=pods/resize now; the apiserver that served it is gone or restarting (retry)";
        const LEGACY: &str = "no live apiserver serves resource.k8s.io/v1beta3 now; the apiserver that served it is gone or restarting (retry)";
        const PENDING: &str = "no known apiserver serves nope.example.com/v1, Resource=things, and the discovery of a peer apiserver is not known yet (retry)";
        const PENDING_CORE: &str = "no known apiserver serves v1, Resource=widgets, and the discovery of a peer apiserver is not known yet (retry)";
        use Unavailable::*;
        // (method, path, with pending peers, the 503's cause and message; None: forwarded)
        type Case<'a> = (&'a str, &'a str, bool, Option<(Unavailable, &'a str)>);
        let claim3 = "/apis/resource.k8s.io/v1beta3/namespaces/d/resourceclaims/c";
        let cases: Vec<Case> = vec![
            ("GET", claim3, false, Some((Retained, RETAINED))),
            ("DELETE", claim3, true, Some((Retained, RETAINED))),
            (
                "GET",
                "/apis/resource.k8s.io/v1beta3/resourceclaims?watch=true",
                false,
                Some((Retained, RETAINED)),
            ),
            // A retained subresource of a served resource: the subresource decides.
            ("PATCH", RESIZE, false, Some((Retained, RESIZE_RETAINED))),
            ("GET", "/api/v1/namespaces/default/pods/web", false, None),
            // The retained group-version's legacy discovery, GET or HEAD, query aside.
            (
                "GET",
                "/apis/resource.k8s.io/v1beta3",
                false,
                Some((RetainedDiscovery, LEGACY)),
            ),
            (
                "HEAD",
                "/apis/resource.k8s.io/v1beta3?timeout=32s",
                false,
                Some((RetainedDiscovery, LEGACY)),
            ),
            ("POST", "/apis/resource.k8s.io/v1beta3", false, None),
            // Its OpenAPI v3 document too; a served group-version's stays local.
            (
                "GET",
                "/openapi/v3/apis/resource.k8s.io/v1beta3?hash=0A",
                false,
                Some((RetainedOpenApi, LEGACY)),
            ),
            (
                "GET",
                "/openapi/v3/apis/resource.k8s.io/v1beta2",
                false,
                None,
            ),
            ("GET", "/openapi/v3", false, None),
            ("GET", "/apis/resource.k8s.io/v1beta2", false, None),
            ("GET", "/apis/resource.k8s.io", false, None),
            // Served by nobody known: the local 404, unless a peer's discovery is pending.
            ("GET", "/apis/nope.example.com/v1/things", false, None),
            (
                "GET",
                "/apis/nope.example.com/v1/things",
                true,
                Some((PeerDiscoveryPending, PENDING)),
            ),
            (
                "POST",
                "/api/v1/namespaces/d/widgets",
                true,
                Some((PeerDiscoveryPending, PENDING_CORE)),
            ),
            // Served somewhere, shared storage, non-resource, unparseable: pending or not.
            ("GET", "/api/v1/pods", true, None),
            ("GET", CLAIM, true, None),
            ("GET", "/apis/stable.example.com/v1/widgets", true, None),
            ("GET", "/healthz", true, None),
            ("GET", "/apis/nope.example.com/v1", true, None),
            ("GET", "/api/v1/namespaces/%zz/pods", true, None),
        ];
        let settled = failsafe(&[]);
        let pending = failsafe(&["apiserver-c", "apiserver-d"]);
        for (method, path, with_pending, want) in cases {
            let c = if with_pending { &pending } else { &settled };
            let h = headers(method, path, &[("authorization", b"Bearer x")]);
            let name = format!("{method} {path} (pending peers: {with_pending})");
            match (plan_request(&h, None, c), want) {
                (RequestPlan::Forward(f), None) => {
                    assert!(
                        !f.counters.iter().any(|c| matches!(
                            c,
                            Counter::Retained { .. } | Counter::PeerDiscoveryPending { .. }
                        )),
                        "{name}: {:?}",
                        f.counters
                    );
                }
                (
                    RequestPlan::Unavailable {
                        method: m,
                        path: p,
                        cause,
                        reply,
                        counter,
                    },
                    Some((want_cause, message)),
                ) => {
                    assert_eq!((m.as_ref(), p.as_ref()), (method, path), "{name}");
                    assert_eq!(cause, want_cause, "{name}");
                    let want_counter = match cause {
                        PeerDiscoveryPending => "skewgate_peer_discovery_pending_total",
                        Retained | RetainedDiscovery | RetainedOpenApi => {
                            "skewgate_retained_unavailable_total"
                        }
                    };
                    assert_eq!(counter.metric_name(), want_counter, "{name}");
                    assert_eq!(reply.code, 503, "{name}");
                    assert_eq!(
                        reply.headers(),
                        [("content-type", "application/json"), ("retry-after", "5")],
                        "{name}"
                    );
                    assert_eq!(
                        reply.body,
                        status::unavailable(message),
                        "{name}: {}",
                        reply.body
                    );
                    // Answered before authentication: no apiserver identity in it.
                    assert!(!reply.body.contains("apiserver-c"), "{name}");
                }
                (other, want) => panic!("{name}: {other:?}, wanted {want:?}"),
            }
        }
        // The other local replies carry no Retry-After.
        assert_eq!(
            LocalReply::host_failure().headers(),
            [("content-type", "application/json")]
        );
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn a_page_not_found_from_an_apiserver_that_serves_the_request_is_a_503() {
        let c = failsafe(&[]);
        let plain: Option<&[u8]> = Some(b"text/plain; charset=utf-8");
        let json: Option<&[u8]> = Some(b"application/json");
        let protobuf: Option<&[u8]> = Some(b"application/vnd.kubernetes.protobuf");
        let upstream = local_reply::VIA_UPSTREAM;
        // (path, code, details, content type, reads the content type, 503 message target)
        type Case<'a> = (
            &'a str,
            u16,
            &'a str,
            Option<&'a [u8]>,
            bool,
            Option<&'a str>,
        );
        let cases: Vec<Case> = vec![
            // Served locally or by a peer: kube's `404 page not found` is a stale view.
            (
                "/api/v1/namespaces/d/pods/web",
                404,
                upstream,
                plain,
                true,
                Some("v1, Resource=pods"),
            ),
            (
                "/api/v1/namespaces/d/pods/web/status",
                404,
                "",
                plain,
                true,
                Some("v1, Resource=pods/status"),
            ),
            (
                CLAIM,
                404,
                upstream,
                plain,
                true,
                Some("resource.k8s.io/v1beta2, Resource=resourceclaims"),
            ),
            // A Status NotFound is a missing object: it passes, in any encoding.
            (
                "/api/v1/namespaces/d/pods/web",
                404,
                upstream,
                json,
                true,
                None,
            ),
            (CLAIM, 404, upstream, protobuf, true, None),
            (
                "/api/v1/namespaces/d/pods/web",
                404,
                upstream,
                None,
                true,
                None,
            ),
            // Other codes are not read for this.
            (
                "/api/v1/namespaces/d/pods/web",
                200,
                upstream,
                plain,
                false,
                None,
            ),
            (
                "/api/v1/namespaces/d/pods/web",
                410,
                upstream,
                plain,
                false,
                None,
            ),
            (
                "/api/v1/namespaces/d/pods/web",
                403,
                upstream,
                plain,
                false,
                None,
            ),
            // The pod's or the kubelet's 404 behind a relaying subresource passes.
            (
                "/api/v1/namespaces/d/pods/web/proxy/metrics",
                404,
                upstream,
                plain,
                false,
                None,
            ),
            (
                "/api/v1/namespaces/d/pods/web/log",
                404,
                upstream,
                plain,
                false,
                None,
            ),
            // Served by nobody known, shared storage, non-resource, unparseable: the 404 is
            // the truth.
            (
                "/apis/nope.example.com/v1/things",
                404,
                upstream,
                plain,
                false,
                None,
            ),
            (
                "/apis/stable.example.com/v1/widgets",
                404,
                upstream,
                plain,
                false,
                None,
            ),
            ("/healthz/nope", 404, upstream, plain, false, None),
            (
                "/api/v1/namespaces/%zz/pods",
                404,
                upstream,
                plain,
                false,
                None,
            ),
        ];
        for (path, code, details, content_type, reads, want) in cases {
            let h = headers("GET", path, &[]);
            let f = forward(plan_request(&h, None, &c));
            let name = format!("{path} {code} {details:?} {content_type:?}");
            let plan = f.response;
            assert_eq!(plan.needs_content_type(code, details), reads, "{name}");
            let content_type = if reads { content_type } else { None };
            let decision = match plan.decide(&c, code, details, content_type) {
                // A JSON 404 is decided on its body: a missing object's stands.
                ResponseDecision::ReadNotFound => {
                    plan.decide_not_found_body(&c, Some(MISSING_OBJECT.as_bytes()))
                }
                decision => decision,
            };
            match (decision, want) {
                (ResponseDecision::Pass, None) => {}
                (ResponseDecision::Replace(r), Some(target)) => {
                    let by = plan.served.as_ref().unwrap().by;
                    assert_eq!(r.cause, ReplaceCause::NotServed { by }, "{name}");
                    assert_eq!(
                        r.counter.map(|k| k.metric_name()),
                        Some("skewgate_not_served_404_total"),
                        "{name}"
                    );
                    assert_eq!(r.status, 503, "{name}");
                    assert_eq!(
                        r.headers,
                        vec![
                            HeaderOp::Set(":status", Cow::Owned("503".to_string())),
                            HeaderOp::Set("content-type", Cow::Borrowed("application/json")),
                            HeaderOp::Remove("content-length"),
                            HeaderOp::Remove("content-encoding"),
                            HeaderOp::Set("retry-after", Cow::Borrowed("5")),
                        ],
                        "{name}"
                    );
                    assert_eq!(
                        r.body,
                        ReplacementBody::Status(local_reply::not_served(target).body),
                        "{name}"
                    );
                }
                (other, want) => panic!("{name}: {other:?}, wanted {want:?}"),
            }
        }
        // Envoy's own 404 (no route) keeps the Envoy-reply mapping, whoever serves the request.
        let h = headers("GET", CLAIM, &[]);
        let plan = forward(plan_request(&h, None, &c)).response;
        assert!(!plan.needs_content_type(404, "route_not_found"));
        let ResponseDecision::Replace(r) = plan.decide(&c, 404, "route_not_found", None) else {
            panic!("not replaced")
        };
        assert_eq!(
            r.cause,
            ReplaceCause::EnvoyReply {
                envoy_code: 404,
                code: 404
            }
        );
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn reads_status_codes() {
        for (raw, code) in [
            (Some(&b"200"[..]), 200),
            (Some(b"503"), 503),
            (Some(b"5\xff3"), 0),
            (Some(b""), 0),
            (Some(b"99999"), 0),
            (None, 0),
        ] {
            assert_eq!(status_code(raw), code, "{raw:?}");
        }
        assert_eq!(LocalReply::host_failure().code, 503);
    }

    /// The bootstrap's local-only fallback: no table, no merged discovery, and local requests go
    /// to the static clusters it names, in the variant of each request's authentication.
    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn a_local_only_fallback_sends_everything_to_its_static_local_clusters() {
        use crate::config::{Fallback, FALLBACK_LOCAL_CLUSTER};
        let config = FilterConfig {
            departed_clusters: Default::default(),
            schema: SCHEMA_VERSION,
            local_apiserver: "apiserver-a".into(),
            peer_clusters: BTreeMap::new(),
            group_versions: Vec::new(),
            discovery: None,
            pending_peers: Vec::new(),
            openapi_v3: Default::default(),
            failover_clusters: Default::default(),
            failover_all: None,
            fallback: Some(Fallback {
                mode: FallbackMode::LocalOnly,
                local_cluster: FALLBACK_LOCAL_CLUSTER.into(),
            }),
        };
        let c =
            CompiledConfig::compile(&FilterConfig::from_json(config.to_json().as_bytes()).unwrap());
        assert_eq!(c.fallback, Some(FallbackMode::LocalOnly));
        let token: &[(&str, &[u8])] = &[("authorization", b"Bearer t")];
        for (path, extra, want) in [
            (
                "/apis/resource.k8s.io/v1beta2/resourceclaims",
                &[][..],
                "skewgate-fallback-local-anonymous",
            ),
            ("/api/v1/pods", token, "skewgate-fallback-local-token"),
            ("/apis", token, "skewgate-fallback-local-token"),
            ("/healthz", &[][..], "skewgate-fallback-local-anonymous"),
        ] {
            let h = headers("GET", path, extra);
            let f = forward(plan_request(&h, None, &c));
            assert_eq!(f.cluster, want, "{path}");
            assert_eq!(f.response.rerouted(&c, 200), None, "{path}");
        }
        // The hygiene and identity still apply.
        let h = headers("GET", "/api/v1/pods", &[("x-remote-user", b"admin")]);
        let f = forward(plan_request(&h, Some(b"O=g,CN=alice"), &c));
        assert_eq!(f.cluster, "skewgate-fallback-local-identity");
        assert_eq!(f.strip, vec!["x-remote-user"]);
        // Nobody knows yet whether a peer serves what the local apiserver does not: its
        // `404 page not found` for a resource becomes a retryable 503, while an object's 404
        // (a Status) and a non-resource 404 stay.
        let plain = Some(&b"text/plain; charset=utf-8"[..]);
        let json = Some(&b"application/json"[..]);
        let via = local_reply::VIA_UPSTREAM;
        for (path, content_type, replaced) in [
            ("/apis/resource.k8s.io/v1beta2/resourceclaims", plain, true),
            ("/api/v1/namespaces/d/widgets", plain, true),
            ("/apis/apps/v1/namespaces/d/deployments/gone", json, false),
            ("/healthz/nope", plain, false),
        ] {
            let h = headers("GET", path, token);
            let f = forward(plan_request(&h, None, &c));
            let decision = match f.response.decide(&c, 404, via, content_type) {
                // A missing object's JSON 404 stands, read or not.
                ResponseDecision::ReadNotFound => f
                    .response
                    .decide_not_found_body(&c, Some(MISSING_OBJECT.as_bytes())),
                decision => decision,
            };
            match decision {
                ResponseDecision::Replace(r) if replaced => {
                    assert_eq!(
                        r.cause,
                        ReplaceCause::NotServed {
                            by: ServedBy::Unknown
                        },
                        "{path}"
                    );
                    let body = String::from_utf8_lossy(r.body.bytes(&c)).into_owned();
                    assert!(body.contains("not known yet"), "{path}: {body}");
                    assert!(r.headers.contains(&HeaderOp::Set(
                        "retry-after",
                        Cow::Borrowed(status::RETRY_AFTER)
                    )));
                }
                ResponseDecision::Pass if !replaced => {}
                other => panic!("{path}: {other:?}"),
            }
        }
        // A fallback naming an impossible cluster is refused whole.
        let bad = config.to_json().replace(FALLBACK_LOCAL_CLUSTER, "a b");
        assert!(FilterConfig::from_json(bad.as_bytes()).is_err());
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn openapi_root_stays_local_and_peer_only_documents_go_to_the_peer() {
        let mut config = FilterConfig {
            departed_clusters: Default::default(),
            fallback: None,
            pending_peers: Vec::new(),
            openapi_v3: Default::default(),
            failover_clusters: Default::default(),
            failover_all: None,
            schema: SCHEMA_VERSION,
            local_apiserver: "apiserver-a".into(),
            peer_clusters: BTreeMap::from([("p133".to_string(), vec!["b".to_string()])]),
            group_versions: Vec::new(),
            discovery: None,
        };
        config.openapi_v3.insert(
            "apis/resource.k8s.io/v1beta2".into(),
            crate::config::OpenApiPeerEntry {
                server_relative_url: "/openapi/v3/apis/resource.k8s.io/v1beta2?hash=B2".into(),
                peer_cluster: "p133".into(),
                replaces_local: false,
            },
        );
        config.validate().unwrap();
        let with = CompiledConfig::compile(&config);
        config.openapi_v3.clear();
        let without = CompiledConfig::compile(&config);
        #[derive(Debug, PartialEq)]
        enum Want {
            /// Local, entries added to its 200.
            Root,
            /// To this cluster, with the loop guard.
            Peer(&'static str),
            /// Local, untouched.
            Local,
        }
        let cases: &[(&CompiledConfig, &str, &str, Want)] = &[
            (&with, "GET", "/openapi/v3", Want::Root),
            (&with, "HEAD", "/openapi/v3", Want::Local),
            (&without, "GET", "/openapi/v3", Want::Local),
            (
                &with,
                "GET",
                "/openapi/v3/apis/resource.k8s.io/v1beta2?hash=B2",
                Want::Peer("p133-token"),
            ),
            (
                &without,
                "GET",
                "/openapi/v3/apis/resource.k8s.io/v1beta2?hash=B2",
                Want::Local,
            ),
            (&with, "GET", "/openapi/v3/api/v1?hash=C", Want::Local),
            (&with, "GET", "/openapi/v2", Want::Local),
        ];
        for (c, method, path, want) in cases {
            let h = headers(
                method,
                path,
                &[("authorization", b"Bearer x"), ("if-none-match", b"\"E\"")],
            );
            let RequestPlan::Forward(f) = plan_request(&h, None, c) else {
                panic!("{method} {path}: not forwarded");
            };
            let ops = f.header_ops();
            let guard = ops.contains(&HeaderOp::Set(PEER_PROXIED, Cow::Borrowed("true")));
            let unconditional = ops.contains(&HeaderOp::Remove("if-none-match"));
            let got = match (&f.route, f.cluster.as_str()) {
                (Route::OpenApiRoot, "skewgate-local-token") => Want::Root,
                (Route::Table(d), cluster) if d.reason == Reason::ServedByPeer => {
                    Want::Peer(if cluster == "p133-token" {
                        "p133-token"
                    } else {
                        "?"
                    })
                }
                (Route::Table(_), "skewgate-local-token") => Want::Local,
                other => panic!("{method} {path}: {other:?}"),
            };
            assert_eq!(&got, want, "{method} {path}");
            assert_eq!(guard, matches!(want, Want::Peer(_)), "{method} {path}");
            assert_eq!(unconditional, *want == Want::Root, "{method} {path}");
            assert_eq!(
                f.response.openapi_root,
                *want == Want::Root,
                "{method} {path}"
            );
            // The peer's answer is a peer's: rerouted counted, its failures a 503, and never
            // cached by the client.
            assert_eq!(
                f.response.rerouted(c, 200).is_some(),
                matches!(want, Want::Peer(_)),
                "{method} {path}"
            );
            assert_eq!(
                f.response.uncacheable,
                matches!(want, Want::Peer(_)),
                "{method} {path}"
            );
        }
        // Every answer to a peer-only document, passed or replaced, ends uncacheable: the
        // document (200), kube's redirect for a stale hash (301), a 304, the peer's `404 page
        // not found` (503 by the safety net) and Envoy's reply for a peer it cannot reach.
        let h = headers(
            "GET",
            "/openapi/v3/apis/resource.k8s.io/v1beta2?hash=B2",
            &[("authorization", b"Bearer x")],
        );
        let RequestPlan::Forward(peer_doc) = plan_request(&h, None, &with) else {
            panic!("not forwarded");
        };
        let ends_uncacheable = |ops: &[HeaderOp<'_>]| ops.ends_with(&UNCACHEABLE);
        for code in [200, 301, 304, 403] {
            assert_eq!(
                peer_doc.response.decide(&with, code, "via_upstream", None),
                ResponseDecision::Rewrite(UNCACHEABLE.to_vec()),
                "{code}"
            );
        }
        let replaced = [
            (404, "via_upstream", Some(&b"text/plain; charset=utf-8"[..])),
            (
                503,
                "upstream_reset_before_response_started{connection_failure}",
                None,
            ),
        ];
        for (code, details, content_type) in replaced {
            let ResponseDecision::Replace(r) =
                peer_doc.response.decide(&with, code, details, content_type)
            else {
                panic!("{code} {details}: not replaced");
            };
            assert_eq!(r.status, 503, "{code} {details}");
            assert!(ends_uncacheable(&r.headers), "{code} {details}: {r:?}");
        }
        // Only the local apiserver's own 200 gets the entries; a 401, 403 or 304 stands.
        let root = ResponsePlan {
            openapi_root: true,
            ..ResponsePlan::default()
        };
        assert!(matches!(
            root.decide(&with, 200, "via_upstream", None),
            ResponseDecision::AddOpenApiEntries(ops)
                if ops.contains(&HeaderOp::Remove("content-length"))
                    && ops.contains(&HeaderOp::Remove("etag"))
        ));
        for code in [304, 401, 403, 500] {
            assert!(
                !matches!(
                    root.decide(&with, code, "via_upstream", None),
                    ResponseDecision::AddOpenApiEntries(_)
                ),
                "{code}"
            );
        }
    }
}
