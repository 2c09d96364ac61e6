//! The filter-configuration schema: the one contract between `control` (which renders it) and the
//! filter (which reads it).
//!
//! It travels as JSON inside Envoy's Wasm `plugin_config.configuration`. It is parsed straight
//! into typed structs (no `serde_json::Value`: every push is parsed by every VM, and wasm memory
//! never shrinks), then validated and compiled into a [`RoutingTable`](crate::routing::RoutingTable).
//! A document that does not parse or validate is rejected whole; the filter keeps its last good
//! configuration (Envoy NACKs the push).
//!
//! The routing decisions are precomputed by the control plane, which knows peer liveness: the
//! filter never reasons about peers, it only looks up which cluster serves a resource.
//!
//! **Versions** (docs/ARCHITECTURE.md, "skewgate's own upgrades"). The control plane and the
//! filter are upgraded separately, in either order, one release apart. A filter reads its own
//! release's schema and the previous release's ([`READ_SCHEMAS`]), and every field added to a
//! schema gets `#[serde(default)]`, so an older control plane's configuration still parses.
//! A filter also tells its control plane what it reads, its [`FilterDialect`] (the schemas
//! and the optional [`FilterFeature`]s it understands, in Envoy's node metadata, written by
//! the bootstrap from the same image as the filter), and the control plane sends it only a
//! configuration in that dialect ([`FilterConfig::for_dialect`]). So unknown fields stay
//! refused (`deny_unknown_fields`): a field the filter does not know was never meant for it.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::ops::RangeInclusive;

use serde::{Deserialize, Serialize};

pub use crate::group_version::valid_segment;
pub use crate::openapi::OpenApiPeerEntry;

/// The schema version this release writes (the control plane renders its configurations in
/// it) and the newest one its filter reads.
pub const SCHEMA_VERSION: u32 = 1;

/// The schema versions this filter reads: its own release's and the previous release's. A
/// configuration in any other schema is refused whole.
pub const READ_SCHEMAS: RangeInclusive<u32> = 1..=SCHEMA_VERSION;

/// An optional part of the configuration that a filter reads only if it says so in its
/// [`FilterDialect`]. A filter that does not list a feature gets the configuration without
/// that feature's fields ([`FilterConfig::for_dialect`]), so every feature must be one a
/// filter can go without: what it adds is lost, nothing else changes. A change that cannot be
/// dropped like that is a new schema version instead.
///
/// Adding one: a variant, its name in [`FilterFeature::name`], its fields with
/// `#[serde(default, skip_serializing_if = ...)]` (a configuration without them must mean
/// what it meant before), and what [`FilterConfig::uses`] and [`FilterConfig::without`] do
/// with them (the compiler asks for both). [`FilterFeature::ALL`] lists it, so this release's
/// filter advertises it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FilterFeature {
    /// Failover from the local apiserver ([`FilterConfig::failover_clusters`],
    /// [`FilterConfig::failover_all`], [`ResourceRoute::failover_cluster`]). Without it a filter
    /// sends local requests to the local apiserver only, as before.
    Failover,
    /// Retained keys sent to the apiservers that departed with them, at their last address
    /// ([`FilterConfig::departed_clusters`], [`ResourceRoute::departed_cluster`]): one that is
    /// back and ready answers at once, without waiting for its Lease to be seen; while none is,
    /// the answer is the retained 503. Without it a filter answers 503 for every retained key
    /// itself, as before.
    DepartedRoutes,
    /// OpenAPI v3 entries that replace the local apiserver's own for a group-version it serves
    /// too, where a peer serves more of its resources ([`OpenApiPeerEntry::replaces_local`]):
    /// `kubectl explain` of a resource only a newer peer serves in a group-version both serve.
    /// Without it a filter gets only the entries of group-versions the local apiserver does not
    /// serve, as before.
    OpenApiReplacesLocal,
}

impl FilterFeature {
    /// Every optional feature this filter reads: what its bootstrap advertises.
    pub const ALL: &'static [FilterFeature] = &[
        FilterFeature::Failover,
        FilterFeature::DepartedRoutes,
        FilterFeature::OpenApiReplacesLocal,
    ];

    /// The name a filter advertises for it.
    pub fn name(self) -> &'static str {
        match self {
            FilterFeature::Failover => "failover",
            FilterFeature::DepartedRoutes => "departed-routes",
            FilterFeature::OpenApiReplacesLocal => "openapi-replaces-local",
        }
    }

    /// The feature a filter advertised by `name`; `None` for a name this release does not know
    /// (a newer filter's feature, which this control plane never sends anyway).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|f| f.name() == name)
    }
}

impl fmt::Display for FilterFeature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a filter reads: the schema versions and the optional features. A filter advertises its
/// own ([`FilterDialect::this_filter`]) in Envoy's node metadata; the control plane renders for
/// it ([`FilterConfig::for_dialect`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterDialect {
    pub schemas: BTreeSet<u32>,
    pub features: BTreeSet<FilterFeature>,
}

impl FilterDialect {
    /// This release's filter: [`READ_SCHEMAS`] and [`FilterFeature::ALL`].
    pub fn this_filter() -> Self {
        FilterDialect {
            schemas: READ_SCHEMAS.collect(),
            features: FilterFeature::ALL.iter().copied().collect(),
        }
    }

    /// A filter that advertises nothing: a release from before filters advertised their
    /// dialect, which reads schema 1 with the fields it had then and no optional feature.
    pub fn unadvertised() -> Self {
        FilterDialect {
            schemas: BTreeSet::from([1]),
            features: BTreeSet::new(),
        }
    }
}

/// Why a configuration cannot be sent to a filter: it reads none of the schema versions the
/// configuration can be written in. The control plane sends it nothing (the filter keeps
/// what it holds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    /// The schemas the filter reads.
    pub filter_reads: BTreeSet<u32>,
    /// The schemas the configuration can be written in.
    pub written_in: BTreeSet<u32>,
}

impl fmt::Display for Unreadable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the filter reads configuration schemas {:?}, this configuration can be written in {:?} only",
            self.filter_reads, self.written_in
        )
    }
}

impl std::error::Error for Unreadable {}

/// Upper bound on one configuration document, in bytes. Most of a large one is merged
/// discovery (10,000 CRD resources: about 6 MB, BENCHMARKS.md §5), which only the VM that
/// publishes it to shared data reads whole; every other VM streams past it and keeps the
/// routing table only (docs/ARCHITECTURE.md, "Merged discovery"). Past this we refuse.
pub const MAX_CONFIG_BYTES: usize = 16 * 1024 * 1024;

/// Longest cluster name we accept; Envoy's own limit is far above, this keeps headers small.
const MAX_CLUSTER_NAME: usize = 200;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilterConfig {
    /// One of [`READ_SCHEMAS`].
    pub schema: u32,
    /// Identity of the local apiserver (its Lease name); for logs.
    pub local_apiserver: String,
    /// Every Envoy cluster the filter may route to, with the peer apiservers behind it.
    /// Clusters are created by the control plane (or the static bootstrap) under these names.
    #[serde(default)]
    pub peer_clusters: BTreeMap<String, Vec<String>>,
    /// What is served where, per group-version.
    #[serde(default)]
    pub group_versions: Vec<GroupVersionRoutes>,
    /// Peer-aggregated discovery. Absent when the control plane could not build it (or it
    /// would be too large): discovery requests then go to the local apiserver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery: Option<DiscoveryConfig>,
    /// Live peers whose discovery is not known yet (first fetch pending or failing). While
    /// any is listed, a resource request that no known apiserver serves is answered 503
    /// (that peer may serve it), never passed to the local apiserver's 404.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_peers: Vec<String>,
    /// OpenAPI v3 entries of the group-versions the local apiserver does not serve and a live
    /// peer does, by root path (`apis/<g>/<v>`): added to the local `/openapi/v3` answer, and
    /// their documents routed to that peer (docs/ARCHITECTURE.md "OpenAPI v3"). With
    /// [`OpenApiPeerEntry::replaces_local`], also of group-versions both serve where the peer
    /// serves more resources: those replace the local entry.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub openapi_v3: BTreeMap<String, OpenApiPeerEntry>,
    /// Where requests the local apiserver would serve go while it cannot be reached: each an
    /// Envoy aggregate cluster (with its [`UpstreamAuth`] suffix) of the local apiserver's
    /// cluster first and then the peer cluster of these peers (docs/ARCHITECTURE.md,
    /// "Failover from the local apiserver"). Named by [`ResourceRoute::failover_cluster`] and
    /// [`FilterConfig::failover_all`].
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub failover_clusters: BTreeMap<String, Vec<String>>,
    /// The key of [`FilterConfig::failover_clusters`] over every live peer: where non-resource
    /// requests (but this node's own health endpoints), discovery and shared-storage
    /// group-versions go while the local apiserver cannot be reached (every apiserver serves
    /// those). `None` without live peers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover_all: Option<String>,
    /// Envoy clusters (with their [`UpstreamAuth`] suffix) of departed apiservers at their last
    /// address, by the sorted set of their ids: where a retained key they served goes
    /// ([`ResourceRoute::departed_cluster`]; docs/ARCHITECTURE.md "API retention").
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub departed_clusters: BTreeMap<String, Vec<String>>,
    /// Set only in the configuration Envoy's bootstrap holds as the ECDS `default_config`: what
    /// the filter runs when the control plane did not configure it within the bootstrap's
    /// wait (`skewgate-control bootstrap --control-plane-wait`). The first configuration from
    /// the control plane replaces it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<Fallback>,
}

/// A configuration Envoy runs without its control plane (docs/ARCHITECTURE.md, "Control plane
/// missing at start").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fallback {
    pub mode: FallbackMode,
    /// The base name (before the [`UpstreamAuth`] suffix) of the static clusters of the local
    /// apiserver in the bootstrap: local requests go there instead of [`LOCAL_CLUSTER`], which
    /// only the control plane creates (CDS).
    pub local_cluster: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FallbackMode {
    /// Every request goes to the local apiserver and discovery is its own: what the apiserver
    /// would do without skewgate, with the header hygiene and identity kept.
    LocalOnly,
    /// The last configuration this Envoy's control plane saw acknowledged (kept in its
    /// `--state-dir`), with its peer clusters renamed to static copies in the bootstrap:
    /// routing and merged discovery as they were when the control plane last saw them.
    LastAcknowledged,
}

impl FallbackMode {
    pub fn as_str(self) -> &'static str {
        match self {
            FallbackMode::LocalOnly => "local-only",
            FallbackMode::LastAcknowledged => "last-acknowledged",
        }
    }

    /// The warning either shell logs when it loads this fallback (operators and the tests look
    /// for it).
    pub fn loaded_message(self) -> String {
        format!(
            "skewgate: FALLBACK configuration ({}) loaded: used while the control plane has not configured this Envoy, until its first configuration replaces it",
            self.as_str()
        )
    }
}

/// The error either shell logs when it refuses a configuration: Envoy rejects it (a NACK over
/// xDS) and keeps the one it has.
pub fn refused_message(error: impl fmt::Display) -> String {
    format!("skewgate: {error}; keeping the previous configuration")
}

/// The base name of the local apiserver's static clusters in the bootstrap, for
/// [`Fallback::local_cluster`]. Distinct from [`LOCAL_CLUSTER`]: CDS does not replace a static
/// cluster of the same name.
pub const FALLBACK_LOCAL_CLUSTER: &str = "skewgate-fallback-local";

/// The merged discovery documents the filter serves (see [`crate::discovery`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiscoveryConfig {
    /// Content hash of everything below, set by the control plane
    /// (`control/src/discovery/payload.rs`); the filter trusts it as it trusts the rest. With it, the filter keeps one copy of these documents per Envoy process
    /// in proxy-wasm shared data under this version instead of one per VM
    /// ([`crate::shared_discovery`]); empty (configurations written before it existed): every
    /// VM keeps its own copy.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// Merged `/apis`: an `apidiscovery.k8s.io/v2` `APIGroupDiscoveryList`.
    pub apis: JsonDocument,
    /// Content hash of `apis`, the ETag clients revalidate with (unquoted).
    pub apis_etag: String,
    /// Merged `/api` (the core group), same form.
    pub api: JsonDocument,
    pub api_etag: String,
    /// Legacy discovery documents by path (`/apis`, `/apis/<g>`, `/apis/<g>/<v>`, `/api/v1`),
    /// only where the union differs from what the local apiserver answers.
    #[serde(default)]
    pub legacy: BTreeMap<String, JsonDocument>,
    /// Legacy group-version paths (`/apis/<g>/<v>`) of retained group-versions: no live
    /// apiserver serves them now, a server that did is gone or not re-read yet. They answer
    /// 503, so legacy clients mark the group failed instead of believing it empty or gone.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub unavailable: BTreeSet<String>,
}

/// A JSON document carried verbatim: validated as JSON when the configuration is parsed, but
/// never turned into a tree (a merged discovery document can be megabytes, parsed by every VM).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JsonDocument(Box<serde_json::value::RawValue>);

impl JsonDocument {
    /// Fails unless `json` is one valid JSON value.
    #[allow(clippy::should_implement_trait)]
    pub fn from_str(json: &str) -> Result<Self, ConfigError> {
        serde_json::value::RawValue::from_string(json.to_string())
            .map(JsonDocument)
            .map_err(|e| ConfigError::Json(e.to_string()))
    }

    pub fn get(&self) -> &str {
        self.0.get()
    }
}

impl PartialEq for JsonDocument {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl Eq for JsonDocument {}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupVersionRoutes {
    /// API group; `""` is the core group (`/api/v1`).
    pub group: String,
    pub version: String,
    /// Served by every apiserver from shared storage (a CRD, or an APIService backed by a
    /// service): requests always go to the local apiserver, as upstream excludes these too.
    #[serde(default, skip_serializing_if = "is_false")]
    pub shared_storage: bool,
    #[serde(default)]
    pub resources: Vec<ResourceRoute>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceRoute {
    /// `resource` or `resource/subresource`, as discovery names them (`pods`, `pods/resize`).
    pub resource: String,
    /// The local apiserver serves it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub local: bool,
    /// A key of [`FilterConfig::peer_clusters`] whose peers serve it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_cluster: Option<String>,
    /// No live apiserver serves it, but one that did is gone or not re-read yet (within the
    /// control plane's `--api-retention`): requests for it are answered 503 with
    /// `Retry-After`, never the local 404. Exclusive with `local` and `peer_cluster`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub retained: bool,
    /// With `local`: a key of [`FilterConfig::failover_clusters`] whose peers serve it too, so
    /// a request for it reaches one of them while the local apiserver cannot be reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failover_cluster: Option<String>,
    /// With `retained`: a key of [`FilterConfig::departed_clusters`], the departed apiservers
    /// that served it, at their last address. A request goes there; if none of them answers,
    /// the 503 is the retained one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub departed_cluster: Option<String>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// How a forwarded request authenticates to the apiserver. Every cluster the configuration
/// names (`skewgate-local` and each peer cluster) exists in Envoy once per variant, so the
/// three kinds of traffic never share an upstream connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamAuth {
    /// The filter set `X-Remote-User`/`X-Remote-Group` from a verified client certificate:
    /// the connection presents the proxy-client certificate (requestheader authentication).
    ProxyIdentity,
    /// The client sent a bearer token: TLS without a client certificate, the apiserver
    /// authenticates the token itself.
    Token,
    /// Neither: TLS without a client certificate, in a pool of its own, because
    /// kube-apiserver may close a shared HTTP/2 connection after an unauthenticated request.
    Anonymous,
}

impl UpstreamAuth {
    pub const ALL: [UpstreamAuth; 3] = [
        UpstreamAuth::ProxyIdentity,
        UpstreamAuth::Token,
        UpstreamAuth::Anonymous,
    ];

    pub fn suffix(self) -> &'static str {
        match self {
            UpstreamAuth::ProxyIdentity => "-identity",
            UpstreamAuth::Token => "-token",
            UpstreamAuth::Anonymous => "-anonymous",
        }
    }

    /// The Envoy cluster carrying this variant of `base`.
    pub fn cluster(self, base: &str) -> String {
        // Once per request: two copies, without the formatting machinery.
        let suffix = self.suffix();
        let mut cluster = String::with_capacity(base.len() + suffix.len());
        cluster.push_str(base);
        cluster.push_str(suffix);
        cluster
    }
}

/// The cluster of the apiserver this Envoy fronts, before its [`UpstreamAuth`] suffix.
pub const LOCAL_CLUSTER: &str = "skewgate-local";

/// Why a configuration was refused. The message names the offending entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    TooLarge { bytes: usize },
    Json(String),
    Schema { found: u32 },
    Invalid(String),
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::TooLarge { bytes } => write!(
                f,
                "configuration is {bytes} bytes, more than the {MAX_CONFIG_BYTES} allowed"
            ),
            ConfigError::Json(e) => write!(f, "configuration is not valid JSON: {e}"),
            ConfigError::Schema { found } => write!(
                f,
                "configuration schema {found} is not supported (this filter reads {}-{})",
                READ_SCHEMAS.start(),
                READ_SCHEMAS.end()
            ),
            ConfigError::Invalid(why) => write!(f, "configuration is invalid: {why}"),
        }
    }
}

impl std::error::Error for ConfigError {}

/// A configuration read without its discovery documents ([`FilterConfig::routing_from_reader`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingConfig {
    /// The configuration, `discovery` always `None`.
    pub config: FilterConfig,
    pub discovery: DiscoveryRef,
}

/// What a configuration says about its merged discovery, read without the documents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiscoveryRef {
    /// None configured: discovery goes to the local apiserver.
    None,
    /// Documents without a [`DiscoveryConfig::version`]: read them whole, per VM.
    Unversioned,
    /// Documents of this content version (validated: 1-128 letters, digits or `-`).
    Version(String),
}

/// [`FilterConfig`] with the discovery documents skipped while parsing: the same fields, so a
/// configuration the one accepts the other accepts too (a unit test keeps them equal).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FilterConfigHead {
    schema: u32,
    local_apiserver: String,
    #[serde(default)]
    peer_clusters: BTreeMap<String, Vec<String>>,
    #[serde(default)]
    group_versions: Vec<GroupVersionRoutes>,
    #[serde(default)]
    discovery: Option<DiscoveryHead>,
    #[serde(default)]
    pending_peers: Vec<String>,
    #[serde(default)]
    openapi_v3: BTreeMap<String, OpenApiPeerEntry>,
    #[serde(default)]
    failover_clusters: BTreeMap<String, Vec<String>>,
    #[serde(default)]
    failover_all: Option<String>,
    #[serde(default)]
    departed_clusters: BTreeMap<String, Vec<String>>,
    #[serde(default)]
    fallback: Option<Fallback>,
}

/// Only the version of [`DiscoveryConfig`]; serde skips the other fields without keeping them
/// (`IgnoredAny`: a skipped string is scanned, never allocated).
#[derive(Deserialize)]
struct DiscoveryHead {
    #[serde(default)]
    version: String,
}

/// A valid [`DiscoveryConfig::version`] or ETag: 1-128 letters, digits or `-` (it becomes part
/// of shared-data keys and of headers).
pub fn valid_version(version: &str) -> bool {
    !version.is_empty()
        && version.len() <= 128
        && version
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

impl FilterConfig {
    /// Parse and validate everything but the discovery documents, reading `reader` as a stream:
    /// memory holds the routing table, never the (possibly megabytes of) documents. The caller
    /// bounds what `reader` yields to [`MAX_CONFIG_BYTES`].
    pub fn routing_from_reader(reader: impl std::io::Read) -> Result<RoutingConfig, ConfigError> {
        Self::routing_from_head(
            serde_json::from_reader(reader).map_err(|e| ConfigError::Json(e.to_string()))?,
        )
    }

    /// [`routing_from_reader`](Self::routing_from_reader) from bytes already in memory: about
    /// three times faster (serde_json reads a slice without a per-byte reader), for
    /// configurations small enough to hold whole.
    pub fn routing_from_slice(bytes: &[u8]) -> Result<RoutingConfig, ConfigError> {
        if bytes.len() > MAX_CONFIG_BYTES {
            return Err(ConfigError::TooLarge { bytes: bytes.len() });
        }
        Self::routing_from_head(
            serde_json::from_slice(bytes).map_err(|e| ConfigError::Json(e.to_string()))?,
        )
    }

    fn routing_from_head(head: FilterConfigHead) -> Result<RoutingConfig, ConfigError> {
        let discovery = match head.discovery {
            None => DiscoveryRef::None,
            Some(d) if d.version.is_empty() => DiscoveryRef::Unversioned,
            Some(d) if valid_version(&d.version) => DiscoveryRef::Version(d.version),
            Some(d) => {
                return Err(ConfigError::Invalid(format!(
                    "discovery version {:?} must be 1-128 letters, digits or '-'",
                    d.version
                )))
            }
        };
        let config = FilterConfig {
            schema: head.schema,
            local_apiserver: head.local_apiserver,
            peer_clusters: head.peer_clusters,
            group_versions: head.group_versions,
            discovery: None,
            pending_peers: head.pending_peers,
            openapi_v3: head.openapi_v3,
            failover_clusters: head.failover_clusters,
            failover_all: head.failover_all,
            departed_clusters: head.departed_clusters,
            fallback: head.fallback,
        };
        config.validate()?;
        Ok(RoutingConfig { config, discovery })
    }

    /// Parse and validate. Nothing partial ever comes out of here.
    pub fn from_json(bytes: &[u8]) -> Result<Self, ConfigError> {
        if bytes.len() > MAX_CONFIG_BYTES {
            return Err(ConfigError::TooLarge { bytes: bytes.len() });
        }
        let config: FilterConfig =
            serde_json::from_slice(bytes).map_err(|e| ConfigError::Json(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// Canonical JSON (deterministic: maps are ordered, lists keep the order control gave them).
    pub fn to_json(&self) -> String {
        // Serialising plain structs and string maps cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The optional features this configuration uses (fields set that a filter reads only if
    /// it advertises the feature).
    pub fn uses(&self) -> BTreeSet<FilterFeature> {
        FilterFeature::ALL
            .iter()
            .copied()
            .filter(|&feature| match feature {
                FilterFeature::Failover => {
                    !self.failover_clusters.is_empty()
                        || self.failover_all.is_some()
                        || self
                            .group_versions
                            .iter()
                            .flat_map(|gv| &gv.resources)
                            .any(|r| r.failover_cluster.is_some())
                }
                FilterFeature::DepartedRoutes => {
                    !self.departed_clusters.is_empty()
                        || self
                            .group_versions
                            .iter()
                            .flat_map(|gv| &gv.resources)
                            .any(|r| r.departed_cluster.is_some())
                }
                FilterFeature::OpenApiReplacesLocal => {
                    self.openapi_v3.values().any(|e| e.replaces_local)
                }
            })
            .collect()
    }

    /// This configuration without `feature`'s fields: what a filter that does not read the
    /// feature gets, which must then behave as it did before the feature existed (and what
    /// the control plane leaves out of a configuration too large to send whole).
    pub fn without(&mut self, feature: FilterFeature) {
        match feature {
            FilterFeature::Failover => {
                self.failover_clusters.clear();
                self.failover_all = None;
                for route in self
                    .group_versions
                    .iter_mut()
                    .flat_map(|gv| &mut gv.resources)
                {
                    route.failover_cluster = None;
                }
            }
            FilterFeature::DepartedRoutes => {
                self.departed_clusters.clear();
                for route in self
                    .group_versions
                    .iter_mut()
                    .flat_map(|gv| &mut gv.resources)
                {
                    route.departed_cluster = None;
                }
            }
            FilterFeature::OpenApiReplacesLocal => {
                self.openapi_v3.retain(|_, e| !e.replaces_local);
            }
        }
    }

    /// This configuration as a filter that reads `dialect` gets it: in this release's schema
    /// (the only one it can be written in: a release that changes the schema adds the
    /// conversion to the previous one here) and without the optional features the filter does
    /// not list. Borrowed when nothing had to change (the usual case: a filter of this release,
    /// or one that reads everything this configuration uses).
    pub fn for_dialect(
        &self,
        dialect: &FilterDialect,
    ) -> Result<Cow<'_, FilterConfig>, Unreadable> {
        if !dialect.schemas.contains(&self.schema) {
            return Err(Unreadable {
                filter_reads: dialect.schemas.clone(),
                written_in: BTreeSet::from([self.schema]),
            });
        }
        let unread: Vec<FilterFeature> = self
            .uses()
            .into_iter()
            .filter(|f| !dialect.features.contains(f))
            .collect();
        if unread.is_empty() {
            return Ok(Cow::Borrowed(self));
        }
        let mut config = self.clone();
        for feature in unread {
            config.without(feature);
        }
        Ok(Cow::Owned(config))
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if !READ_SCHEMAS.contains(&self.schema) {
            return Err(ConfigError::Schema { found: self.schema });
        }
        if let Some(fallback) = &self.fallback {
            if !valid_cluster_name(&fallback.local_cluster) {
                return Err(ConfigError::Invalid(format!(
                    "fallback local cluster name {:?} must be 1-{MAX_CLUSTER_NAME} visible ASCII characters",
                    fallback.local_cluster
                )));
            }
        }
        for (name, peers) in &self.peer_clusters {
            if !valid_cluster_name(name) {
                return Err(ConfigError::Invalid(format!(
                    "peer cluster name {name:?} must be 1-{MAX_CLUSTER_NAME} visible ASCII characters"
                )));
            }
            if peers.is_empty() {
                return Err(ConfigError::Invalid(format!(
                    "peer cluster {name:?} has no apiservers"
                )));
            }
        }
        for (name, peers) in &self.failover_clusters {
            if !valid_cluster_name(name) || self.peer_clusters.contains_key(name) {
                return Err(ConfigError::Invalid(format!(
                    "failover cluster name {name:?} must be 1-{MAX_CLUSTER_NAME} visible ASCII characters and not a peer cluster's"
                )));
            }
            if peers.is_empty() {
                return Err(ConfigError::Invalid(format!(
                    "failover cluster {name:?} has no apiservers"
                )));
            }
        }
        for (name, departed) in &self.departed_clusters {
            if !valid_cluster_name(name)
                || self.peer_clusters.contains_key(name)
                || self.failover_clusters.contains_key(name)
            {
                return Err(ConfigError::Invalid(format!(
                    "departed cluster name {name:?} must be 1-{MAX_CLUSTER_NAME} visible ASCII characters and not a peer or failover cluster's"
                )));
            }
            if departed.is_empty() {
                return Err(ConfigError::Invalid(format!(
                    "departed cluster {name:?} has no apiservers"
                )));
            }
        }
        if let Some(all) = &self.failover_all {
            if !self.failover_clusters.contains_key(all) {
                return Err(ConfigError::Invalid(format!(
                    "failover cluster {all:?} of every live peer is not declared"
                )));
            }
        }
        if let Some(discovery) = &self.discovery {
            discovery.validate()?;
        }
        if self.openapi_v3.len() > crate::openapi::MAX_ENTRIES {
            return Err(ConfigError::Invalid(format!(
                "{} OpenAPI entries, more than the {} allowed",
                self.openapi_v3.len(),
                crate::openapi::MAX_ENTRIES
            )));
        }
        for (path, entry) in &self.openapi_v3 {
            crate::openapi::validate_entry(path, &entry.server_relative_url)
                .map_err(|e| ConfigError::Invalid(format!("OpenAPI entry {path:?}: {e}")))?;
            if !self.peer_clusters.contains_key(&entry.peer_cluster) {
                return Err(ConfigError::Invalid(format!(
                    "OpenAPI entry {path:?}: peer cluster {:?} is not declared",
                    entry.peer_cluster
                )));
            }
        }
        let mut seen_gv = BTreeSet::new();
        for gv in &self.group_versions {
            if gv.version.is_empty() || !valid_segment(&gv.version) {
                return Err(ConfigError::Invalid(format!(
                    "group {:?} has an invalid version {:?}",
                    gv.group, gv.version
                )));
            }
            if !gv.group.is_empty() && !valid_segment(&gv.group) {
                return Err(ConfigError::Invalid(format!(
                    "invalid group name {:?}",
                    gv.group
                )));
            }
            if !seen_gv.insert((gv.group.as_str(), gv.version.as_str())) {
                return Err(ConfigError::Invalid(format!(
                    "group-version {:?}/{:?} is listed twice",
                    gv.group, gv.version
                )));
            }
            let mut seen_resource = BTreeSet::new();
            for r in &gv.resources {
                let ok = match r.resource.split_once('/') {
                    Some((res, sub)) => valid_segment(res) && valid_segment(sub),
                    None => valid_segment(&r.resource),
                };
                if !ok {
                    return Err(ConfigError::Invalid(format!(
                        "{}/{}: invalid resource {:?}",
                        gv.group, gv.version, r.resource
                    )));
                }
                if !seen_resource.insert(r.resource.as_str()) {
                    return Err(ConfigError::Invalid(format!(
                        "{}/{}: resource {:?} is listed twice",
                        gv.group, gv.version, r.resource
                    )));
                }
                match &r.peer_cluster {
                    Some(c) if !self.peer_clusters.contains_key(c) => {
                        return Err(ConfigError::Invalid(format!(
                            "{}/{}/{}: peer cluster {c:?} is not declared",
                            gv.group, gv.version, r.resource
                        )));
                    }
                    None if !r.local && !r.retained => {
                        return Err(ConfigError::Invalid(format!(
                            "{}/{}/{}: served neither locally nor by a peer, nor retained",
                            gv.group, gv.version, r.resource
                        )));
                    }
                    _ => {}
                }
                if let Some(c) = &r.failover_cluster {
                    if !r.local || !self.failover_clusters.contains_key(c) {
                        return Err(ConfigError::Invalid(format!(
                            "{}/{}/{}: failover cluster {c:?} is not declared or the key is not served locally",
                            gv.group, gv.version, r.resource
                        )));
                    }
                }
                if r.retained && (r.local || r.peer_cluster.is_some()) {
                    return Err(ConfigError::Invalid(format!(
                        "{}/{}/{}: retained, yet served",
                        gv.group, gv.version, r.resource
                    )));
                }
                if let Some(c) = &r.departed_cluster {
                    if !r.retained || !self.departed_clusters.contains_key(c) {
                        return Err(ConfigError::Invalid(format!(
                            "{}/{}/{}: departed cluster {c:?} is not declared or the key is not retained",
                            gv.group, gv.version, r.resource
                        )));
                    }
                }
            }
        }
        Ok(())
    }
}

impl DiscoveryConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !self.version.is_empty() && !valid_version(&self.version) {
            return Err(ConfigError::Invalid(format!(
                "discovery version {:?} must be 1-128 letters, digits or '-'",
                self.version
            )));
        }
        for (what, doc, etag) in [
            ("/apis", &self.apis, &self.apis_etag),
            ("/api", &self.api, &self.api_etag),
        ] {
            if !doc.get().starts_with('{') {
                return Err(ConfigError::Invalid(format!(
                    "discovery document for {what} is not a JSON object"
                )));
            }
            let etag_ok = !etag.is_empty()
                && etag.len() <= 128
                && etag.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
            if !etag_ok {
                return Err(ConfigError::Invalid(format!(
                    "discovery ETag for {what} must be 1-128 letters, digits or '-'"
                )));
            }
        }
        for (path, doc) in &self.legacy {
            let segments: Vec<&str> = path.split('/').skip(1).collect();
            let path_ok = path.starts_with('/')
                && segments.iter().all(|s| valid_segment(s))
                && matches!(
                    segments.as_slice(),
                    ["apis"] | ["apis", _] | ["apis", _, _] | ["api", _]
                );
            if !path_ok {
                return Err(ConfigError::Invalid(format!(
                    "{path:?} is not a legacy discovery path"
                )));
            }
            if !doc.get().starts_with('{') {
                return Err(ConfigError::Invalid(format!(
                    "legacy discovery document for {path} is not a JSON object"
                )));
            }
        }
        for path in &self.unavailable {
            let segments: Vec<&str> = path.split('/').skip(1).collect();
            let path_ok = path.starts_with('/')
                && segments.iter().all(|s| valid_segment(s))
                && matches!(segments.as_slice(), ["apis", _, _] | ["api", _]);
            if !path_ok {
                return Err(ConfigError::Invalid(format!(
                    "{path:?} is not a legacy group-version path"
                )));
            }
        }
        Ok(())
    }
}

fn valid_cluster_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_CLUSTER_NAME && name.bytes().all(|b| b.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> FilterConfig {
        FilterConfig {
            departed_clusters: Default::default(),
            fallback: None,
            pending_peers: Vec::new(),
            openapi_v3: BTreeMap::new(),
            failover_clusters: Default::default(),
            failover_all: None,
            schema: SCHEMA_VERSION,
            local_apiserver: "apiserver-a".into(),
            peer_clusters: BTreeMap::from([(
                "skewgate-peers-b".to_string(),
                vec!["apiserver-b".to_string()],
            )]),
            group_versions: vec![GroupVersionRoutes {
                group: "resource.k8s.io".into(),
                version: "v1beta2".into(),
                shared_storage: false,
                resources: vec![ResourceRoute {
                    departed_cluster: None,
                    retained: false,
                    failover_cluster: None,
                    resource: "resourceclaims".into(),
                    local: false,
                    peer_cluster: Some("skewgate-peers-b".into()),
                }],
            }],
            discovery: None,
        }
    }

    #[test]
    fn round_trips() {
        let c = sample();
        let parsed = FilterConfig::from_json(c.to_json().as_bytes());
        assert_eq!(parsed, Ok(c));
    }

    #[test]
    fn rejects_bad_documents_whole() {
        let undeclared = sample().to_json().replace(
            "\"peer_cluster\":\"skewgate-peers-b\"",
            "\"peer_cluster\":\"nope\"",
        );
        let cases: Vec<(&str, String)> = vec![
            ("not json", "{".into()),
            (
                "wrong schema",
                sample().to_json().replace("\"schema\":1", "\"schema\":2"),
            ),
            (
                "unknown field",
                sample()
                    .to_json()
                    .replace("\"schema\":1", "\"schema\":1,\"x\":1"),
            ),
            ("undeclared cluster", undeclared),
            (
                "routes nowhere",
                sample()
                    .to_json()
                    .replace(",\"peer_cluster\":\"skewgate-peers-b\"", ""),
            ),
            (
                "slash in resource",
                sample().to_json().replace("resourceclaims", "a/b/c"),
            ),
            ("empty version", sample().to_json().replace("v1beta2", "")),
        ];
        for (what, doc) in cases {
            assert!(
                FilterConfig::from_json(doc.as_bytes()).is_err(),
                "{what} should be rejected: {doc}"
            );
        }
    }

    #[test]
    fn rejects_duplicates() {
        let mut c = sample();
        let gv = c.group_versions[0].clone();
        c.group_versions.push(gv);
        assert!(matches!(c.validate(), Err(ConfigError::Invalid(_))));

        let mut c = sample();
        let r = c.group_versions[0].resources[0].clone();
        c.group_versions[0].resources.push(r);
        assert!(matches!(c.validate(), Err(ConfigError::Invalid(_))));
    }

    #[test]
    fn the_routing_part_reads_like_the_whole_configuration_without_its_documents() {
        let discovery = |version: &str| DiscoveryConfig {
            version: version.into(),
            apis: JsonDocument::from_str(r#"{"items":[{"a":"\"}"}]}"#).unwrap(),
            apis_etag: "e1".into(),
            api: JsonDocument::from_str("{}").unwrap(),
            api_etag: "e2".into(),
            legacy: BTreeMap::new(),
            unavailable: BTreeSet::new(),
        };
        let with = |d: Option<DiscoveryConfig>| FilterConfig {
            discovery: d,
            ..sample()
        };
        let cases = [
            ("no discovery", with(None), DiscoveryRef::None),
            (
                "unversioned",
                with(Some(discovery(""))),
                DiscoveryRef::Unversioned,
            ),
            (
                "versioned",
                with(Some(discovery("abc-123"))),
                DiscoveryRef::Version("abc-123".into()),
            ),
        ];
        for (what, config, want) in cases {
            let json = config.to_json();
            let routing = FilterConfig::routing_from_reader(json.as_bytes()).unwrap();
            assert_eq!(
                FilterConfig::routing_from_slice(json.as_bytes()).as_ref(),
                Ok(&routing),
                "{what}"
            );
            let whole = FilterConfig::from_json(json.as_bytes()).unwrap();
            assert_eq!(routing.discovery, want, "{what}");
            assert_eq!(
                routing.config,
                FilterConfig {
                    discovery: None,
                    ..whole
                },
                "{what}"
            );
        }
        // What the whole parse refuses in the routing part, the routing parse refuses too; a
        // version that cannot be a key is refused.
        let bad = [
            sample()
                .to_json()
                .replace("\"schema\":1", "\"schema\":1,\"x\":1"),
            sample().to_json().replace("v1beta2", ""),
            with(Some(discovery("a/b"))).to_json(),
            with(Some(discovery(""))).to_json().replace("}}", "}"),
        ];
        for json in bad {
            assert!(
                FilterConfig::routing_from_reader(json.as_bytes()).is_err(),
                "{json}"
            );
            assert!(
                FilterConfig::routing_from_slice(json.as_bytes()).is_err(),
                "{json}"
            );
            assert!(FilterConfig::from_json(json.as_bytes()).is_err(), "{json}");
        }
    }

    #[test]
    fn rejects_oversized() {
        let big = vec![b' '; MAX_CONFIG_BYTES + 1];
        assert!(matches!(
            FilterConfig::from_json(&big),
            Err(ConfigError::TooLarge { .. })
        ));
    }

    #[test]
    fn openapi_entries_are_checked() {
        let entry = |url: &str, cluster: &str| OpenApiPeerEntry {
            server_relative_url: url.to_string(),
            peer_cluster: cluster.to_string(),
            replaces_local: false,
        };
        let path = "apis/coordination.k8s.io/v1beta1";
        let url = "/openapi/v3/apis/coordination.k8s.io/v1beta1?hash=AB";
        let cases = [
            (path, entry(url, "skewgate-peers-b"), true),
            (path, entry(url, "skewgate-peers-undeclared"), false),
            (
                path,
                entry("/openapi/v3/apis/apps/v1?hash=AB", "skewgate-peers-b"),
                false,
            ),
            (
                "version",
                entry("/openapi/v3/version", "skewgate-peers-b"),
                false,
            ),
        ];
        for (path, entry, ok) in cases {
            let mut c = sample();
            c.openapi_v3.insert(path.to_string(), entry.clone());
            assert_eq!(c.validate().is_ok(), ok, "{path} {entry:?}");
        }
        let mut c = sample();
        for i in 0..=crate::openapi::MAX_ENTRIES {
            let p = format!("apis/g{i}.example/v1");
            let u = format!("/openapi/v3/{p}");
            c.openapi_v3.insert(p, entry(&u, "skewgate-peers-b"));
        }
        assert!(c.validate().is_err());
    }

    #[test]
    fn reads_its_own_and_the_previous_releases_schema_and_no_other() {
        assert!(READ_SCHEMAS.contains(&SCHEMA_VERSION));
        assert!(*READ_SCHEMAS.start() >= SCHEMA_VERSION.saturating_sub(1).max(1));
        for schema in [
            0,
            READ_SCHEMAS.start() - 1,
            READ_SCHEMAS.end() + 1,
            u32::MAX,
        ] {
            let c = FilterConfig { schema, ..sample() };
            assert_eq!(
                FilterConfig::from_json(c.to_json().as_bytes()),
                Err(ConfigError::Schema { found: schema })
            );
            assert!(FilterConfig::routing_from_slice(c.to_json().as_bytes()).is_err());
        }
        for schema in READ_SCHEMAS {
            let c = FilterConfig { schema, ..sample() };
            assert_eq!(FilterConfig::from_json(c.to_json().as_bytes()), Ok(c));
        }
    }

    #[test]
    fn renders_for_the_dialect_of_the_filter_it_goes_to() {
        let c = sample();
        // This release's filter, and the previous release's (which advertises nothing), read
        // it as it is: no copy.
        for dialect in [FilterDialect::this_filter(), FilterDialect::unadvertised()] {
            assert!(
                matches!(c.for_dialect(&dialect), Ok(Cow::Borrowed(_))),
                "{dialect:?}"
            );
        }
        // A filter that reads none of the schemas it can be written in gets nothing.
        let later = FilterDialect {
            schemas: BTreeSet::from([SCHEMA_VERSION + 1]),
            features: BTreeSet::new(),
        };
        let err = c.for_dialect(&later).map(|_| ()).unwrap_err();
        assert_eq!(
            err,
            Unreadable {
                filter_reads: BTreeSet::from([SCHEMA_VERSION + 1]),
                written_in: BTreeSet::from([SCHEMA_VERSION]),
            }
        );
        assert!(err.to_string().contains("reads configuration schemas"));
        let nothing = FilterDialect {
            schemas: BTreeSet::new(),
            features: BTreeSet::new(),
        };
        assert!(c.for_dialect(&nothing).is_err());
        // Every feature this filter reads is one the control plane can drop; the sample uses
        // none.
        assert!(c.uses().is_empty());
    }

    /// A retained key with the departed apiserver that served it: valid only on a retained key
    /// and a declared departed cluster of its own name, and dropped for a filter that does not
    /// read departed routes (which then answers 503 itself, as before).
    #[test]
    fn departed_routes_are_checked_and_dropped_for_a_filter_that_does_not_read_them() {
        let with_departed = |retained: bool, cluster: &str, declared: &str| {
            let mut c = sample();
            c.departed_clusters = BTreeMap::from([(declared.to_string(), vec!["c".to_string()])]);
            c.group_versions[0].resources[0] = ResourceRoute {
                resource: "resourceclaims".into(),
                local: false,
                peer_cluster: None,
                retained,
                failover_cluster: None,
                departed_cluster: Some(cluster.into()),
            };
            c
        };
        let c = with_departed(true, "skewgate-departed-c", "skewgate-departed-c");
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(
            FilterConfig::from_json(c.to_json().as_bytes()),
            Ok(c.clone())
        );
        assert_eq!(
            FilterConfig::routing_from_slice(c.to_json().as_bytes()).map(|r| r.config),
            Ok(c.clone())
        );
        for (bad, why) in [
            (
                with_departed(false, "skewgate-departed-c", "skewgate-departed-c"),
                "not retained",
            ),
            (
                with_departed(true, "skewgate-departed-x", "skewgate-departed-c"),
                "not declared",
            ),
            (
                with_departed(true, "skewgate-peers-b", "skewgate-peers-b"),
                "a peer cluster's name",
            ),
            (with_departed(true, "bad name", "bad name"), "not a name"),
        ] {
            assert!(bad.validate().is_err(), "{why}");
        }
        assert_eq!(c.uses(), BTreeSet::from([FilterFeature::DepartedRoutes]));
        assert!(matches!(
            c.for_dialect(&FilterDialect::this_filter()),
            Ok(Cow::Borrowed(_))
        ));
        let Ok(Cow::Owned(older)) = c.for_dialect(&FilterDialect::unadvertised()) else {
            panic!("not rendered again")
        };
        assert!(older.departed_clusters.is_empty());
        let route = &older.group_versions[0].resources[0];
        assert!(route.retained && route.departed_cluster.is_none());
        assert_eq!(older.validate(), Ok(()));
        assert!(older.uses().is_empty());
    }

    #[test]
    fn features_are_known_by_their_names_and_unknown_names_are_nothing() {
        let names: BTreeSet<&str> = FilterFeature::ALL.iter().map(|f| f.name()).collect();
        assert_eq!(names.len(), FilterFeature::ALL.len(), "unique names");
        for feature in FilterFeature::ALL {
            assert_eq!(FilterFeature::from_name(feature.name()), Some(*feature));
        }
        for unknown in ["", "a-feature-of-a-newer-release", "FAILOVER ", "\u{0}"] {
            assert_eq!(FilterFeature::from_name(unknown), None, "{unknown:?}");
        }
        assert_eq!(
            FilterDialect::this_filter().features.len(),
            FilterFeature::ALL.len()
        );
        assert_eq!(
            FilterDialect::this_filter().schemas,
            READ_SCHEMAS.collect::<BTreeSet<_>>()
        );
        assert!(FilterDialect::unadvertised().features.is_empty());
    }
}
