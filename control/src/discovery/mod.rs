//! Discovery documents, and the model of what one apiserver serves that routing is computed from.
//!
//! kube-apiserver describes what it serves in two ways:
//!
//! - **Aggregated discovery** (`apidiscovery.k8s.io/v2`, and `v2beta1` with the same shape): one
//!   `APIGroupDiscoveryList` for `/apis` (every named group) and one for `/api` (the core group,
//!   an item named `""`). Subresources are nested under their parent resource.
//! - **Legacy discovery**: `APIVersions` at `/api`, `APIGroupList` at `/apis`, and one
//!   `APIResourceList` per group-version (`/api/v1`, `/apis/<group>/<version>`), where
//!   subresources are entries named `resource/subresource`.
//!
//! The serde types here keep every field they do not model (`extra`), because a later step merges
//! documents from several apiservers and re-serialises them for real clients: dropping a field a
//! newer apiserver added would silently change what those clients see.
//!
//! [`ServedApis`] reduces one apiserver's documents to what routing needs: the served
//! (group, version) pairs and, per pair, the resource keys `res` and `res/sub`.
//!
//! - [`documents`]: one apiserver's discovery as the two aggregated documents, and legacy
//!   documents derived from them for old clients;
//! - [`legacy`]: an old apiserver's legacy discovery read into aggregated form;
//! - [`merge`]: the peer-aggregated merge rules;
//! - [`payload`]: what of the merged discovery goes into the filter configuration.

pub mod documents;
pub mod legacy;
pub mod merge;
pub mod openapi;
pub mod payload;

pub use documents::DiscoveryDocuments;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
// The filter validates its configuration with the same rule: one definition, in the core.
use skewgate_core::group_version::valid_segment;

/// Default upper bound on one discovery document, in bytes.
///
/// A stock kube-apiserver's `/apis` aggregated document is about 60 KB; clusters with a couple of
/// thousand CRDs (large operator suites) reach a few MiB. 16 MiB leaves ample headroom for those
/// while bounding what a misbehaving or hostile endpoint can make us buffer and parse (the parsed
/// form takes several times the text's size, once per apiserver we watch).
pub const DEFAULT_MAX_DISCOVERY_BYTES: usize = 16 * 1024 * 1024;

/// `apiVersion`s of aggregated discovery we read; both have the same shape.
pub const AGGREGATED_API_VERSIONS: [&str; 2] =
    ["apidiscovery.k8s.io/v2", "apidiscovery.k8s.io/v2beta1"];
pub const AGGREGATED_KIND: &str = "APIGroupDiscoveryList";
pub const RESOURCE_LIST_KIND: &str = "APIResourceList";
pub const GROUP_LIST_KIND: &str = "APIGroupList";
pub const VERSIONS_KIND: &str = "APIVersions";

/// File names [`ServedApis::from_dir`] reads (the layout of `tests/fixtures/discovery/<label>/`).
pub const APIS_AGGREGATED_FILE: &str = "aggregated_v2.json";
pub const API_AGGREGATED_FILE: &str = "api_aggregated.json";
pub const API_V1_LEGACY_FILE: &str = "api__v1.json";

/// Why a discovery document (or a folder of them) was refused. Nothing partial comes out.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("discovery document is larger than the {limit}-byte limit")]
    TooLarge { limit: usize },
    #[error("discovery document is not JSON: {0}")]
    NotJson(serde_json::Error),
    #[error(
        "expected an {expected} document, got apiVersion {api_version:?} kind {kind:?}{}",
        message.as_ref().map(|m| format!(" ({m})")).unwrap_or_default()
    )]
    WrongKind {
        expected: &'static str,
        api_version: String,
        kind: String,
        /// The `message` of the document, if any: a `Status` (403, 503, ...) says why here.
        message: Option<String>,
    },
    #[error("{kind} document does not have the expected shape: {error}")]
    Malformed {
        kind: &'static str,
        error: serde_json::Error,
    },
    #[error("invalid discovery content: {0}")]
    Invalid(String),
    #[error("cannot read {}: {error}", path.display())]
    Io { path: PathBuf, error: io::Error },
    #[error("{}: {error}", path.display())]
    InFile {
        path: PathBuf,
        error: Box<DiscoveryError>,
    },
    #[error(
        "no discovery documents in {}: expected at least one of {APIS_AGGREGATED_FILE}, \
         {API_AGGREGATED_FILE}, {API_V1_LEGACY_FILE}",
        dir.display()
    )]
    NoDocuments { dir: PathBuf },
}

// ---------------------------------------------------------------------------------------------
// Aggregated discovery (apidiscovery.k8s.io/v2, v2beta1)
// ---------------------------------------------------------------------------------------------

/// `metav1.GroupVersionKind` as discovery uses it. Empty `group`/`version` mean "the
/// group-version this resource is listed under" (that is what kube-apiserver emits for most).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupVersionKind {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The `metadata` of an `APIGroupDiscovery` (an `ObjectMeta`; only `name`, the group, matters).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    #[serde(default)]
    pub name: String,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct APIGroupDiscoveryList {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    /// `ListMeta`; kube-apiserver emits `{}`.
    #[serde(default)]
    pub metadata: Map<String, Value>,
    #[serde(default)]
    pub items: Vec<APIGroupDiscovery>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct APIGroupDiscovery {
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// In server priority order: the first is the preferred version.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub versions: Vec<APIVersionDiscovery>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct APIVersionDiscovery {
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub resources: Vec<APIResourceDiscovery>,
    /// `Current`, or `Stale` when an aggregated APIService's own discovery could not be fetched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub freshness: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct APIResourceDiscovery {
    #[serde(default)]
    pub resource: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_kind: Option<GroupVersionKind>,
    /// `Cluster` or `Namespaced`.
    #[serde(default)]
    pub scope: String,
    #[serde(default)]
    pub singular_resource: String,
    #[serde(default)]
    pub verbs: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub short_names: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub categories: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subresources: Vec<APISubresourceDiscovery>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct APISubresourceDiscovery {
    #[serde(default)]
    pub subresource: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_kind: Option<GroupVersionKind>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accepted_types: Vec<GroupVersionKind>,
    #[serde(default)]
    pub verbs: Vec<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

// ---------------------------------------------------------------------------------------------
// Legacy discovery
// ---------------------------------------------------------------------------------------------

/// `/api/v1` or `/apis/<group>/<version>`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct APIResourceList {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    /// `v1` for core, `<group>/<version>` otherwise.
    #[serde(default)]
    pub group_version: String,
    #[serde(default)]
    pub resources: Vec<APIResource>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct APIResource {
    /// `resource`, or `resource/subresource` for a subresource.
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub singular_name: String,
    #[serde(default)]
    pub namespaced: bool,
    /// Group and version of the *response kind* when it differs from the list's
    /// (`pods/eviction` → `policy`/`v1`); the resource is still served under the list's GV.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub verbs: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub short_names: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub categories: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_version_hash: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Legacy `/apis`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct APIGroupList {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    #[serde(default)]
    pub groups: Vec<APIGroup>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct APIGroup {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub versions: Vec<GroupVersionForDiscovery>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_version: Option<GroupVersionForDiscovery>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub server_address_by_client_cidrs: Vec<Value>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupVersionForDiscovery {
    #[serde(default)]
    pub group_version: String,
    #[serde(default)]
    pub version: String,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Legacy `/api`: the versions of the core group (always `["v1"]`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct APIVersions {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    #[serde(default)]
    pub versions: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub server_address_by_client_cidrs: Vec<Value>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

// ---------------------------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------------------------

/// The type header every document carries, read first so a wrong document (a `Status` from a
/// 403, an HTML error page, the legacy list where the aggregated one was expected) is named as
/// such rather than reported as a missing field.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TypeHeader {
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    message: Option<Value>,
}

fn check_size(bytes: &[u8], max_bytes: usize) -> Result<(), DiscoveryError> {
    if bytes.len() > max_bytes {
        return Err(DiscoveryError::TooLarge { limit: max_bytes });
    }
    Ok(())
}

/// Size check, then the type header; `accept` decides on (apiVersion, kind).
fn check_header(
    bytes: &[u8],
    max_bytes: usize,
    expected: &'static str,
    accept: impl Fn(&str, &str) -> bool,
) -> Result<(), DiscoveryError> {
    check_size(bytes, max_bytes)?;
    // serde would also read a struct from a JSON array; a document is an object.
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(
            match serde_json::from_slice::<serde::de::IgnoredAny>(bytes) {
                Err(e) => DiscoveryError::NotJson(e),
                Ok(_) => DiscoveryError::Malformed {
                    kind: expected,
                    error: serde::de::Error::custom("the document is not a JSON object"),
                },
            },
        );
    }
    let header: TypeHeader = serde_json::from_slice(bytes).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => DiscoveryError::Malformed {
            kind: expected,
            error: e,
        },
        _ => DiscoveryError::NotJson(e),
    })?;
    let api_version = header.api_version.unwrap_or_default();
    let kind = header.kind.unwrap_or_default();
    if accept(&api_version, &kind) {
        return Ok(());
    }
    let message = match header.message {
        Some(Value::String(m)) => Some(m.chars().take(300).collect()),
        _ => None,
    };
    Err(DiscoveryError::WrongKind {
        expected,
        api_version,
        kind,
        message,
    })
}

fn parse_typed<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    kind: &'static str,
) -> Result<T, DiscoveryError> {
    serde_json::from_slice(bytes).map_err(|error| DiscoveryError::Malformed { kind, error })
}

/// Parse an aggregated discovery document (`/apis` or `/api`, `apidiscovery.k8s.io/v2` or
/// `v2beta1`). `max_bytes` is usually [`DEFAULT_MAX_DISCOVERY_BYTES`].
pub fn parse_aggregated(
    bytes: &[u8],
    max_bytes: usize,
) -> Result<APIGroupDiscoveryList, DiscoveryError> {
    check_header(bytes, max_bytes, AGGREGATED_KIND, |api_version, kind| {
        kind == AGGREGATED_KIND && AGGREGATED_API_VERSIONS.contains(&api_version)
    })?;
    parse_typed(bytes, AGGREGATED_KIND)
}

/// Parse a legacy `APIResourceList` (`/api/v1`, `/apis/<group>/<version>`). Its `apiVersion` is
/// `v1` when present (kube-apiserver's generated documents leave it out).
pub fn parse_resource_list(
    bytes: &[u8],
    max_bytes: usize,
) -> Result<APIResourceList, DiscoveryError> {
    check_header(bytes, max_bytes, RESOURCE_LIST_KIND, |api_version, kind| {
        kind == RESOURCE_LIST_KIND && (api_version.is_empty() || api_version == "v1")
    })?;
    parse_typed(bytes, RESOURCE_LIST_KIND)
}

/// Parse a legacy `APIGroupList` (`/apis`).
pub fn parse_group_list(bytes: &[u8], max_bytes: usize) -> Result<APIGroupList, DiscoveryError> {
    check_header(bytes, max_bytes, GROUP_LIST_KIND, |api_version, kind| {
        kind == GROUP_LIST_KIND && (api_version.is_empty() || api_version == "v1")
    })?;
    parse_typed(bytes, GROUP_LIST_KIND)
}

/// Parse a legacy `APIVersions` (`/api`).
pub fn parse_versions(bytes: &[u8], max_bytes: usize) -> Result<APIVersions, DiscoveryError> {
    check_header(bytes, max_bytes, VERSIONS_KIND, |api_version, kind| {
        kind == VERSIONS_KIND && (api_version.is_empty() || api_version == "v1")
    })?;
    parse_typed(bytes, VERSIONS_KIND)
}

// ---------------------------------------------------------------------------------------------
// The model
// ---------------------------------------------------------------------------------------------

/// Counts over a [`ServedApis`] (for logs and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ServedStats {
    /// Distinct groups (the core group `""` counts as one).
    pub groups: usize,
    pub group_versions: usize,
    /// Top-level resource keys (`pods`), summed over group-versions.
    pub resources: usize,
    /// Subresource keys (`pods/status`), summed over group-versions.
    pub subresources: usize,
}

/// What one apiserver serves: the (group, version) pairs and, per pair, the resource keys
/// `res` and `res/sub`. The core group is `""`. Iteration is sorted by group, then version, then
/// key. Every name in here is a valid path segment (checked on the way in), so anything built
/// from it passes the filter's configuration validation.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServedApis {
    /// group -> version -> keys.
    groups: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
}

impl ServedApis {
    pub const fn new() -> Self {
        ServedApis {
            groups: BTreeMap::new(),
        }
    }

    /// The model of one aggregated document.
    pub fn from_aggregated(list: &APIGroupDiscoveryList) -> Result<Self, DiscoveryError> {
        let mut served = Self::new();
        served.add_aggregated(list)?;
        Ok(served)
    }

    /// Add what an aggregated document lists (use it for both `/apis` and `/api`). On error
    /// `self` is left unchanged.
    pub fn add_aggregated(&mut self, list: &APIGroupDiscoveryList) -> Result<(), DiscoveryError> {
        let mut add = Self::new();
        for group in &list.items {
            let g = group.metadata.name.as_str();
            for version in &group.versions {
                let v = version.version.as_str();
                add.add_group_version(g, v)?;
                for resource in &version.resources {
                    // Nested form: a top-level name never contains a `/`.
                    check_segment("resource", &resource.resource, g, v)?;
                    add.add_resource(g, v, &resource.resource)?;
                    for sub in &resource.subresources {
                        check_segment("subresource", &sub.subresource, g, v)?;
                        add.add_resource(
                            g,
                            v,
                            &format!("{}/{}", resource.resource, sub.subresource),
                        )?;
                    }
                }
            }
        }
        self.merge(add);
        Ok(())
    }

    /// Add a legacy `APIResourceList` served at `group`/`version` (`""`/`v1` for `/api/v1`).
    /// Its `groupVersion` must agree. On error `self` is left unchanged.
    pub fn add_legacy_resource_list(
        &mut self,
        group: &str,
        version: &str,
        list: &APIResourceList,
    ) -> Result<(), DiscoveryError> {
        let expected = skewgate_core::group_version::GroupVersion::new(group, version).to_string();
        if list.group_version != expected {
            return Err(DiscoveryError::Invalid(format!(
                "resource list is for {:?}, expected {expected:?}",
                list.group_version
            )));
        }
        let mut add = Self::new();
        add.add_group_version(group, version)?;
        for resource in &list.resources {
            add.add_resource(group, version, &resource.name)?;
        }
        self.merge(add);
        Ok(())
    }

    /// Record a served group-version (with no resources yet). `group` may be `""` (core).
    pub fn add_group_version(&mut self, group: &str, version: &str) -> Result<(), DiscoveryError> {
        if !group.is_empty() && !valid_segment(group) {
            return Err(DiscoveryError::Invalid(format!(
                "invalid group name {group:?}"
            )));
        }
        if !valid_segment(version) {
            return Err(DiscoveryError::Invalid(format!(
                "group {group:?} has an invalid version {version:?}"
            )));
        }
        self.groups
            .entry(group.to_owned())
            .or_default()
            .entry(version.to_owned())
            .or_default();
        Ok(())
    }

    /// Record a served resource key (`res` or `res/sub`), and its group-version.
    pub fn add_resource(
        &mut self,
        group: &str,
        version: &str,
        key: &str,
    ) -> Result<(), DiscoveryError> {
        match key.split_once('/') {
            Some((res, sub)) => {
                check_segment("resource", res, group, version)?;
                check_segment("subresource", sub, group, version)?;
            }
            None => check_segment("resource", key, group, version)?,
        }
        self.add_group_version(group, version)?;
        if let Some(keys) = self
            .groups
            .get_mut(group)
            .and_then(|versions| versions.get_mut(version))
        {
            keys.insert(key.to_owned());
        }
        Ok(())
    }

    /// Union with another model.
    pub fn merge(&mut self, other: ServedApis) {
        for (group, versions) in other.groups {
            let mine = self.groups.entry(group).or_default();
            for (version, keys) in versions {
                mine.entry(version).or_default().extend(keys);
            }
        }
    }

    /// What `self` serves that `other` does not: keys, with their group-versions.
    pub fn difference(&self, other: &ServedApis) -> ServedApis {
        let mut out = ServedApis::new();
        for (group, version, keys) in self.iter() {
            let missing: BTreeSet<String> = keys
                .iter()
                .filter(|k| !other.serves(group, version, k))
                .cloned()
                .collect();
            if !missing.is_empty() {
                out.groups
                    .entry(group.to_owned())
                    .or_default()
                    .insert(version.to_owned(), missing);
            }
        }
        out
    }

    /// Read a fixture-style folder: `aggregated_v2.json` (the `/apis` aggregated document), plus
    /// the core group from `api_aggregated.json` (the `/api` aggregated document) or, when that is
    /// absent, `api__v1.json` (legacy core v1). Each file is optional; a folder with none of them
    /// is an error. Uses [`DEFAULT_MAX_DISCOVERY_BYTES`] per file.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self, DiscoveryError> {
        Self::from_dir_with_limit(dir, DEFAULT_MAX_DISCOVERY_BYTES)
    }

    /// [`from_dir`](Self::from_dir) with a per-file byte limit.
    pub fn from_dir_with_limit(
        dir: impl AsRef<Path>,
        max_bytes: usize,
    ) -> Result<Self, DiscoveryError> {
        let dir = dir.as_ref();
        let mut served = Self::new();
        let mut found = false;

        let apis = dir.join(APIS_AGGREGATED_FILE);
        if let Some(bytes) = read_optional(&apis, max_bytes)? {
            found = true;
            parse_aggregated(&bytes, max_bytes)
                .and_then(|list| served.add_aggregated(&list))
                .map_err(|e| in_file(&apis, e))?;
        }

        let api = dir.join(API_AGGREGATED_FILE);
        let legacy = dir.join(API_V1_LEGACY_FILE);
        if let Some(bytes) = read_optional(&api, max_bytes)? {
            found = true;
            parse_aggregated(&bytes, max_bytes)
                .and_then(|list| served.add_aggregated(&list))
                .map_err(|e| in_file(&api, e))?;
        } else if let Some(bytes) = read_optional(&legacy, max_bytes)? {
            found = true;
            parse_resource_list(&bytes, max_bytes)
                .and_then(|list| served.add_legacy_resource_list("", "v1", &list))
                .map_err(|e| in_file(&legacy, e))?;
        }

        if !found {
            return Err(DiscoveryError::NoDocuments {
                dir: dir.to_path_buf(),
            });
        }
        Ok(served)
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    pub fn serves_group_version(&self, group: &str, version: &str) -> bool {
        self.resources(group, version).is_some()
    }

    /// Whether `key` (`res` or `res/sub`) is served at `group`/`version`.
    pub fn serves(&self, group: &str, version: &str, key: &str) -> bool {
        self.resources(group, version)
            .is_some_and(|keys| keys.contains(key))
    }

    /// The keys served at `group`/`version`, or `None` when the group-version is not served.
    pub fn resources(&self, group: &str, version: &str) -> Option<&BTreeSet<String>> {
        self.groups
            .get(group)
            .and_then(|versions| versions.get(version))
    }

    /// Served groups, sorted.
    pub fn groups(&self) -> impl Iterator<Item = &str> {
        self.groups.keys().map(String::as_str)
    }

    /// Served (group, version) pairs, sorted.
    pub fn group_versions(&self) -> impl Iterator<Item = (&str, &str)> {
        self.iter().map(|(g, v, _)| (g, v))
    }

    /// (group, version, keys), sorted by group then version.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str, &BTreeSet<String>)> {
        self.groups.iter().flat_map(|(g, versions)| {
            versions
                .iter()
                .map(move |(v, keys)| (g.as_str(), v.as_str(), keys))
        })
    }

    pub fn stats(&self) -> ServedStats {
        let mut stats = ServedStats {
            groups: self.groups.len(),
            ..ServedStats::default()
        };
        for (_, _, keys) in self.iter() {
            stats.group_versions += 1;
            let subresources = keys.iter().filter(|k| k.contains('/')).count();
            stats.subresources += subresources;
            stats.resources += keys.len() - subresources;
        }
        stats
    }
}

fn in_file(path: &Path, error: DiscoveryError) -> DiscoveryError {
    DiscoveryError::InFile {
        path: path.to_path_buf(),
        error: Box::new(error),
    }
}

/// The file's bytes, `None` when it does not exist; never reads more than `max_bytes + 1`.
fn read_optional(path: &Path, max_bytes: usize) -> Result<Option<Vec<u8>>, DiscoveryError> {
    let io_error = |error| DiscoveryError::Io {
        path: path.to_path_buf(),
        error,
    };
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error(e)),
    };
    let mut bytes = Vec::new();
    let cap = u64::try_from(max_bytes)
        .unwrap_or(u64::MAX)
        .saturating_add(1);
    file.take(cap).read_to_end(&mut bytes).map_err(io_error)?;
    check_size(&bytes, max_bytes).map_err(|e| in_file(path, e))?;
    Ok(Some(bytes))
}

fn check_segment(what: &str, name: &str, group: &str, version: &str) -> Result<(), DiscoveryError> {
    if valid_segment(name) {
        Ok(())
    } else {
        Err(DiscoveryError::Invalid(format!(
            "{group}/{version}: invalid {what} name {name:?}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_fixtures::{K130, K133};

    fn read(dir: &str, file: &str) -> Vec<u8> {
        std::fs::read(Path::new(dir).join(file)).expect("fixture is readable")
    }

    fn aggregated(dir: &str) -> APIGroupDiscoveryList {
        parse_aggregated(
            &read(dir, APIS_AGGREGATED_FILE),
            DEFAULT_MAX_DISCOVERY_BYTES,
        )
        .expect("fixture parses")
    }

    /// A fresh empty folder under the system temp dir.
    fn temp_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("skewgate-discovery-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    #[test]
    fn fixture_counts_match_provenance() {
        // (dir, /apis stats, core v1 resources, core v1 subresources); PROVENANCE.md's counts
        // exclude core.
        let cases = [
            (
                K130,
                ServedStats {
                    groups: 22,
                    group_versions: 31,
                    resources: 63,
                    subresources: 30,
                },
                17,
                21,
            ),
            (
                K133,
                ServedStats {
                    groups: 22,
                    group_versions: 34,
                    resources: 71,
                    subresources: 29,
                },
                17,
                22,
            ),
        ];
        for (dir, apis, core_resources, core_subresources) in cases {
            let list = aggregated(dir);
            assert_eq!(list.api_version, "apidiscovery.k8s.io/v2");
            assert!(
                list.items.iter().all(|g| !g.metadata.name.is_empty()),
                "{dir}: /apis has no core"
            );
            let served = ServedApis::from_aggregated(&list).expect("valid");
            assert_eq!(served.stats(), apis, "{dir}");

            let all = ServedApis::from_dir(dir).expect("folder loads");
            assert_eq!(
                all.stats(),
                ServedStats {
                    groups: apis.groups + 1,
                    group_versions: apis.group_versions + 1,
                    resources: apis.resources + core_resources,
                    subresources: apis.subresources + core_subresources,
                },
                "{dir}"
            );
        }
    }

    #[test]
    fn fixture_contents() {
        let k130 = ServedApis::from_dir(K130).expect("1.30");
        let k133 = ServedApis::from_dir(K133).expect("1.33");
        // (model, group, version, key, served)
        let cases = [
            (&k130, "apps", "v1", "deployments", true),
            (&k130, "apps", "v1", "deployments/scale", true),
            (&k130, "", "v1", "pods", true),
            (&k130, "", "v1", "pods/resize", false),
            (&k133, "", "v1", "pods/resize", true),
            (&k130, "resource.k8s.io", "v1alpha2", "resourceclaims", true),
            (
                &k133,
                "resource.k8s.io",
                "v1alpha2",
                "resourceclaims",
                false,
            ),
            (&k133, "resource.k8s.io", "v1beta2", "resourceclaims", true),
            (
                &k133,
                "resource.k8s.io",
                "v1beta2",
                "resourceclaims/status",
                true,
            ),
            (
                &k130,
                "admissionregistration.k8s.io",
                "v1alpha1",
                "validatingadmissionpolicies",
                true,
            ),
            (
                &k133,
                "admissionregistration.k8s.io",
                "v1alpha1",
                "validatingadmissionpolicies",
                false,
            ),
            (
                &k133,
                "admissionregistration.k8s.io",
                "v1alpha1",
                "mutatingadmissionpolicies",
                true,
            ),
        ];
        for (served, g, v, key, want) in cases {
            assert_eq!(served.serves(g, v, key), want, "{g}/{v}/{key}");
        }
        assert!(k130.serves_group_version("", "v1"));
        assert!(!k130.serves_group_version("resource.k8s.io", "v1beta2"));
        let sorted: Vec<_> = k133.group_versions().collect();
        let mut expected = sorted.clone();
        expected.sort();
        assert_eq!(sorted, expected);
        assert_eq!(sorted.first(), Some(&("", "v1")));
    }

    #[test]
    fn legacy_documents_parse() {
        for dir in [K130, K133] {
            let versions = parse_versions(&read(dir, "api.json"), DEFAULT_MAX_DISCOVERY_BYTES)
                .expect("api.json");
            assert_eq!(versions.versions, vec!["v1".to_string()]);
            let list =
                parse_resource_list(&read(dir, API_V1_LEGACY_FILE), 1 << 20).expect("api__v1.json");
            assert_eq!(list.group_version, "v1");
            let eviction = list
                .resources
                .iter()
                .find(|r| r.name == "pods/eviction")
                .expect("pods/eviction");
            assert_eq!(eviction.group.as_deref(), Some("policy"));
        }
        let groups = br#"{"kind":"APIGroupList","apiVersion":"v1","groups":[{"name":"apps",
            "versions":[{"groupVersion":"apps/v1","version":"v1"}],
            "preferredVersion":{"groupVersion":"apps/v1","version":"v1"}}]}"#;
        let groups = parse_group_list(groups, 1024).expect("group list");
        assert_eq!(groups.groups.first().map(|g| g.name.as_str()), Some("apps"));
    }

    #[test]
    fn round_trips_without_losing_fields() {
        for dir in [K130, K133] {
            let original: Value =
                serde_json::from_slice(&read(dir, APIS_AGGREGATED_FILE)).expect("json");
            let again = serde_json::to_value(aggregated(dir)).expect("serialises");
            assert_eq!(again, original, "{dir}");
        }
        // Fields we do not model, at every level, survive.
        let doc = br#"{"apiVersion":"apidiscovery.k8s.io/v2beta1","kind":"APIGroupDiscoveryList",
            "metadata":{"resourceVersion":"7"},"future":1,
            "items":[{"metadata":{"name":"x.io","labels":{"a":"b"}},"future":2,
              "versions":[{"version":"v1","freshness":"Stale","future":3,
                "resources":[{"resource":"widgets","scope":"Namespaced","singularResource":"widget",
                  "verbs":["get"],"future":4,
                  "responseKind":{"group":"","version":"","kind":"Widget","future":5},
                  "subresources":[{"subresource":"status","verbs":["get"],"future":6,
                    "acceptedTypes":[{"group":"x.io","version":"v1","kind":"W"}]}]}]}]}]}"#;
        let list = parse_aggregated(doc, 4096).expect("v2beta1 parses");
        let original: Value = serde_json::from_slice(doc).expect("json");
        assert_eq!(serde_json::to_value(&list).expect("serialises"), original);
        let served = ServedApis::from_aggregated(&list).expect("valid");
        assert!(served.serves("x.io", "v1", "widgets/status"));
    }

    #[test]
    fn hostile_input_is_refused_with_typed_errors() {
        let huge = {
            // 20 MiB of a syntactically fine document.
            let mut doc =
                br#"{"apiVersion":"apidiscovery.k8s.io/v2","kind":"APIGroupDiscoveryList","x":""#
                    .to_vec();
            doc.resize(20 * 1024 * 1024, b'a');
            doc.extend_from_slice(b"\"}");
            doc
        };
        type Check = fn(&DiscoveryError) -> bool;
        let too_large: Check = |e| matches!(e, DiscoveryError::TooLarge { .. });
        let not_json: Check = |e| matches!(e, DiscoveryError::NotJson(_));
        let wrong_kind: Check = |e| matches!(e, DiscoveryError::WrongKind { .. });
        let malformed: Check = |e| matches!(e, DiscoveryError::Malformed { .. });
        let invalid: Check = |e| matches!(e, DiscoveryError::Invalid(_));
        let cases: Vec<(&str, Vec<u8>, usize, Check)> = vec![
            ("20 MiB, small limit", huge.clone(), 1024 * 1024, too_large),
            ("20 MiB, default limit", huge, DEFAULT_MAX_DISCOVERY_BYTES, too_large),
            ("html", b"<html>503</html>".to_vec(), 1024, not_json),
            ("truncated", br#"{"kind":"APIGroupDiscoveryList""#.to_vec(), 1024, not_json),
            ("trailing garbage", br#"{} {}"#.to_vec(), 1024, not_json),
            ("empty", Vec::new(), 1024, not_json),
            ("deep array nesting", [b"[".repeat(10_000), b"]".repeat(10_000)].concat(), 1 << 20, malformed),
            (
                "deep object nesting",
                [
                    br#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","x":"#.to_vec(),
                    b"{\"a\":".repeat(10_000),
                    b"1".to_vec(),
                    b"}".repeat(10_001),
                ]
                .concat(),
                1 << 20,
                malformed,
            ),
            ("array", b"[]".to_vec(), 1024, malformed),
            ("string", b" \"x\" ".to_vec(), 1024, malformed),
            ("kind not a string", br#"{"kind":3}"#.to_vec(), 1024, malformed),
            (
                "status",
                br#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"forbidden","code":403}"#.to_vec(),
                1024,
                wrong_kind,
            ),
            ("no kind", br#"{"items":[]}"#.to_vec(), 1024, wrong_kind),
            (
                "unknown apiVersion",
                br#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v3","items":[]}"#.to_vec(),
                1024,
                wrong_kind,
            ),
            ("legacy list", read(K130, API_V1_LEGACY_FILE), 1 << 20, wrong_kind),
            (
                "items not a list",
                br#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","items":"x"}"#.to_vec(),
                1024,
                malformed,
            ),
            (
                "slash in resource",
                br#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2",
                    "items":[{"metadata":{"name":"x.io"},"versions":[{"version":"v1",
                    "resources":[{"resource":"a/b"}]}]}]}"#.to_vec(),
                1024,
                invalid,
            ),
            (
                "space in subresource",
                br#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2",
                    "items":[{"metadata":{"name":"x.io"},"versions":[{"version":"v1",
                    "resources":[{"resource":"a","subresources":[{"subresource":"s t"}]}]}]}]}"#.to_vec(),
                1024,
                invalid,
            ),
            (
                "empty version",
                br#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2",
                    "items":[{"metadata":{"name":"x.io"},"versions":[{"version":""}]}]}"#.to_vec(),
                1024,
                invalid,
            ),
        ];
        for (what, doc, limit, check) in cases {
            let result =
                parse_aggregated(&doc, limit).and_then(|list| ServedApis::from_aggregated(&list));
            match result {
                Err(e) => assert!(check(&e), "{what}: unexpected error {e}"),
                Ok(_) => panic!("{what}: accepted"),
            }
        }

        let status = br#"{"kind":"Status","apiVersion":"v1","message":"forbidden: no"}"#;
        let err = parse_resource_list(status, 1024).expect_err("status is not a resource list");
        assert!(err.to_string().contains("forbidden: no"), "{err}");
    }

    #[test]
    fn legacy_list_must_match_its_group_version() {
        let list = parse_resource_list(&read(K130, API_V1_LEGACY_FILE), 1 << 20).expect("parses");
        let mut served = ServedApis::new();
        assert!(matches!(
            served.add_legacy_resource_list("apps", "v1", &list),
            Err(DiscoveryError::Invalid(_))
        ));
        assert!(served.is_empty(), "nothing partial is kept");
        served
            .add_legacy_resource_list("", "v1", &list)
            .expect("core v1");
        assert!(served.serves("", "v1", "pods/exec"));
    }

    #[test]
    fn from_dir_variants() {
        // Nothing there.
        let empty = temp_dir("empty");
        assert!(matches!(
            ServedApis::from_dir(&empty),
            Err(DiscoveryError::NoDocuments { .. })
        ));

        // Only legacy core v1.
        let legacy = temp_dir("legacy");
        std::fs::write(
            legacy.join(API_V1_LEGACY_FILE),
            read(K133, API_V1_LEGACY_FILE),
        )
        .expect("write");
        let served = ServedApis::from_dir(&legacy).expect("legacy only");
        assert_eq!(
            served.group_versions().collect::<Vec<_>>(),
            vec![("", "v1")]
        );

        // An aggregated /api document takes precedence over api__v1.json.
        let core = br#"{"apiVersion":"apidiscovery.k8s.io/v2","kind":"APIGroupDiscoveryList",
            "metadata":{},"items":[{"metadata":{"name":""},"versions":[{"version":"v1",
            "resources":[{"resource":"pods","subresources":[{"subresource":"resize"}]}]}]}]}"#;
        std::fs::write(legacy.join(API_AGGREGATED_FILE), core).expect("write");
        let served = ServedApis::from_dir(&legacy).expect("aggregated core");
        let keys: Vec<_> = served
            .resources("", "v1")
            .map(|k| k.iter().cloned().collect())
            .unwrap_or_default();
        assert_eq!(keys, vec!["pods".to_string(), "pods/resize".to_string()]);

        // A bad file is named in the error, with the typed cause inside.
        let bad = temp_dir("bad");
        std::fs::write(bad.join(APIS_AGGREGATED_FILE), b"not json").expect("write");
        match ServedApis::from_dir(&bad) {
            Err(DiscoveryError::InFile { path, error }) => {
                assert!(path.ends_with(APIS_AGGREGATED_FILE));
                assert!(matches!(*error, DiscoveryError::NotJson(_)));
            }
            other => panic!("unexpected {other:?}"),
        }
        std::fs::write(bad.join(APIS_AGGREGATED_FILE), vec![b' '; 2048]).expect("write");
        match ServedApis::from_dir_with_limit(&bad, 1024) {
            Err(DiscoveryError::InFile { error, .. }) => {
                assert!(matches!(*error, DiscoveryError::TooLarge { limit: 1024 }));
            }
            other => panic!("unexpected {other:?}"),
        }

        for dir in [empty, legacy, bad] {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
