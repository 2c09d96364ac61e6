//! One apiserver's discovery, as the two aggregated documents it serves (`/apis` and `/api`),
//! and the conversions between aggregated and legacy discovery.
//!
//! Aggregated discovery is the one form we keep: old servers' legacy documents are converted
//! into it on the way in, and legacy answers for old clients are derived from it on the way
//! out. Legacy fields aggregated discovery does not carry (`storageVersionHash`) are not
//! invented; the filter serves a derived legacy document only where the union differs from
//! what the local apiserver answers, so the local apiserver's own documents are used otherwise.

use std::collections::BTreeSet;
use std::path::Path;

use skewgate_core::group_version::GroupVersion;

use crate::discovery::{
    self, parse_aggregated, parse_resource_list, APIGroup, APIGroupDiscovery,
    APIGroupDiscoveryList, APIGroupList, APIResource, APIResourceDiscovery, APIResourceList,
    APISubresourceDiscovery, APIVersionDiscovery, DiscoveryError, GroupVersionForDiscovery,
    GroupVersionKind, ObjectMeta, ServedApis, DEFAULT_MAX_DISCOVERY_BYTES,
};

pub const AGGREGATED_V2: &str = "apidiscovery.k8s.io/v2";

/// What one apiserver serves, in aggregated form.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DiscoveryDocuments {
    /// `/apis`: every named group.
    pub apis: APIGroupDiscoveryList,
    /// `/api`: the core group (one item named `""`).
    pub api: APIGroupDiscoveryList,
    /// `/openapi/v3`, when the apiserver answered it (docs/ARCHITECTURE.md "OpenAPI v3").
    pub openapi: Option<super::openapi::OpenApiRoot>,
}

impl DiscoveryDocuments {
    /// A fixture-style folder: `aggregated_v2.json` for `/apis`, and `api_aggregated.json` or
    /// the legacy `api__v1.json` for the core group.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self, DiscoveryError> {
        let dir = dir.as_ref();
        let read = |name: &str| -> Result<Option<Vec<u8>>, DiscoveryError> {
            let path = dir.join(name);
            match std::fs::read(&path) {
                Ok(bytes) => Ok(Some(bytes)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(error) => Err(DiscoveryError::Io { path, error }),
            }
        };
        let in_file = |name: &str, e: DiscoveryError| DiscoveryError::InFile {
            path: dir.join(name),
            error: Box::new(e),
        };
        let limit = DEFAULT_MAX_DISCOVERY_BYTES;
        let apis = match read(discovery::APIS_AGGREGATED_FILE)? {
            Some(bytes) => parse_aggregated(&bytes, limit)
                .map_err(|e| in_file(discovery::APIS_AGGREGATED_FILE, e))?,
            None => empty_list(),
        };
        let api = if let Some(bytes) = read(discovery::API_AGGREGATED_FILE)? {
            parse_aggregated(&bytes, limit)
                .map_err(|e| in_file(discovery::API_AGGREGATED_FILE, e))?
        } else if let Some(bytes) = read(discovery::API_V1_LEGACY_FILE)? {
            let list = parse_resource_list(&bytes, limit)
                .map_err(|e| in_file(discovery::API_V1_LEGACY_FILE, e))?;
            aggregated_from_legacy("", &[("v1", &list)])
        } else {
            empty_list()
        };
        if apis.items.is_empty() && api.items.is_empty() {
            return Err(DiscoveryError::NoDocuments {
                dir: dir.to_path_buf(),
            });
        }
        Ok(DiscoveryDocuments {
            apis,
            api,
            openapi: None,
        })
    }

    /// Only the resources (and subresources) `keep` lists, in this apiserver's own order and
    /// with its own fields; a group-version in `stale` is marked `freshness: Stale`. What a
    /// retained apiserver contributes to merged discovery.
    pub fn restricted_to(&self, keep: &ServedApis, stale: &BTreeSet<GroupVersion>) -> Self {
        let restrict = |list: &APIGroupDiscoveryList| {
            let mut list = list.clone();
            for group in &mut list.items {
                let name = group.metadata.name.clone();
                for version in &mut group.versions {
                    let v = version.version.clone();
                    version.resources.retain_mut(|r| {
                        r.subresources.retain(|s| {
                            keep.serves(&name, &v, &format!("{}/{}", r.resource, s.subresource))
                        });
                        keep.serves(&name, &v, &r.resource) || !r.subresources.is_empty()
                    });
                    if stale.contains(&GroupVersion::new(name.as_str(), v.as_str())) {
                        version.freshness = Some("Stale".to_string());
                    }
                }
                group.versions.retain(|v| !v.resources.is_empty());
            }
            list.items.retain(|g| !g.versions.is_empty());
            list
        };
        DiscoveryDocuments {
            apis: restrict(&self.apis),
            api: restrict(&self.api),
            // A retained apiserver's documents are nobody's to route to.
            openapi: None,
        }
    }

    /// The model routing works on.
    pub fn served(&self) -> Result<ServedApis, DiscoveryError> {
        let mut served = ServedApis::from_aggregated(&self.apis)?;
        served.add_aggregated(&self.api)?;
        Ok(served)
    }
}

pub fn empty_list() -> APIGroupDiscoveryList {
    APIGroupDiscoveryList {
        kind: discovery::AGGREGATED_KIND.to_string(),
        api_version: AGGREGATED_V2.to_string(),
        ..Default::default()
    }
}

/// A group's legacy `APIResourceList`s (one per version, in priority order) as one aggregated
/// group. Entries named `res/sub` become subresources of `res`.
pub fn aggregated_from_legacy(
    group: &str,
    versions: &[(&str, &APIResourceList)],
) -> APIGroupDiscoveryList {
    let mut out = APIGroupDiscovery {
        metadata: ObjectMeta {
            name: group.to_string(),
            ..Default::default()
        },
        ..Default::default()
    };
    for (version, list) in versions {
        let mut resources: Vec<APIResourceDiscovery> = Vec::new();
        for r in list.resources.iter().filter(|r| !r.name.contains('/')) {
            resources.push(APIResourceDiscovery {
                resource: r.name.clone(),
                response_kind: Some(GroupVersionKind {
                    group: r.group.clone().unwrap_or_default(),
                    version: r.version.clone().unwrap_or_default(),
                    kind: r.kind.clone(),
                    ..Default::default()
                }),
                scope: if r.namespaced {
                    "Namespaced"
                } else {
                    "Cluster"
                }
                .to_string(),
                singular_resource: r.singular_name.clone(),
                verbs: r.verbs.clone(),
                short_names: r.short_names.clone(),
                categories: r.categories.clone(),
                ..Default::default()
            });
        }
        for r in &list.resources {
            let Some((parent, sub)) = r.name.split_once('/') else {
                continue;
            };
            if let Some(p) = resources.iter_mut().find(|p| p.resource == parent) {
                p.subresources.push(APISubresourceDiscovery {
                    subresource: sub.to_string(),
                    response_kind: Some(GroupVersionKind {
                        group: r.group.clone().unwrap_or_default(),
                        version: r.version.clone().unwrap_or_default(),
                        kind: r.kind.clone(),
                        ..Default::default()
                    }),
                    verbs: r.verbs.clone(),
                    ..Default::default()
                });
            }
        }
        out.versions.push(APIVersionDiscovery {
            version: version.to_string(),
            resources,
            freshness: Some("Current".to_string()),
            ..Default::default()
        });
    }
    APIGroupDiscoveryList {
        items: vec![out],
        ..empty_list()
    }
}

fn for_discovery(group: &str, version: &str) -> GroupVersionForDiscovery {
    GroupVersionForDiscovery {
        group_version: GroupVersion::new(group, version).to_string(),
        version: version.to_string(),
        ..Default::default()
    }
}

/// Legacy `APIGroup` (`/apis/<group>`) of an aggregated group: its first version is preferred.
pub fn legacy_group(group: &APIGroupDiscovery) -> APIGroup {
    let name = &group.metadata.name;
    let versions: Vec<GroupVersionForDiscovery> = group
        .versions
        .iter()
        .map(|v| for_discovery(name, &v.version))
        .collect();
    APIGroup {
        name: name.clone(),
        preferred_version: versions.first().cloned(),
        versions,
        extra: [
            ("kind".to_string(), "APIGroup".into()),
            ("apiVersion".to_string(), "v1".into()),
        ]
        .into_iter()
        .collect(),
        ..Default::default()
    }
}

/// Legacy `/apis` (`APIGroupList`) of an aggregated `/apis` document.
pub fn legacy_group_list(apis: &APIGroupDiscoveryList) -> APIGroupList {
    APIGroupList {
        kind: discovery::GROUP_LIST_KIND.to_string(),
        api_version: "v1".to_string(),
        groups: apis
            .items
            .iter()
            .map(|g| APIGroup {
                extra: Default::default(),
                ..legacy_group(g)
            })
            .collect(),
        ..Default::default()
    }
}

/// Legacy `APIResourceList` (`/apis/<g>/<v>`, `/api/v1`) of one aggregated version.
pub fn legacy_resource_list(group: &str, version: &APIVersionDiscovery) -> APIResourceList {
    let gv_of = |kind: &Option<GroupVersionKind>| -> (Option<String>, Option<String>, String) {
        match kind {
            Some(k) => (
                (!k.group.is_empty() || !k.version.is_empty()).then(|| k.group.clone()),
                (!k.version.is_empty()).then(|| k.version.clone()),
                k.kind.clone(),
            ),
            None => (None, None, String::new()),
        }
    };
    let mut resources = Vec::new();
    for r in &version.resources {
        let (g, v, kind) = gv_of(&r.response_kind);
        let namespaced = r.scope == "Namespaced";
        resources.push(APIResource {
            name: r.resource.clone(),
            singular_name: r.singular_resource.clone(),
            namespaced,
            group: g,
            version: v,
            kind,
            verbs: r.verbs.clone(),
            short_names: r.short_names.clone(),
            categories: r.categories.clone(),
            ..Default::default()
        });
        for s in &r.subresources {
            let (g, v, kind) = gv_of(&s.response_kind);
            resources.push(APIResource {
                name: format!("{}/{}", r.resource, s.subresource),
                namespaced,
                group: g,
                version: v,
                kind,
                verbs: s.verbs.clone(),
                ..Default::default()
            });
        }
    }
    APIResourceList {
        kind: discovery::RESOURCE_LIST_KIND.to_string(),
        api_version: "v1".to_string(),
        group_version: GroupVersion::new(group, version.version.as_str()).to_string(),
        resources,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    use crate::test_fixtures::documents as fixture;

    #[test]
    fn core_group_from_legacy_keeps_every_resource_and_subresource() {
        for (name, resize) in [("k8s-1.30", false), ("k8s-1.33", true)] {
            let docs = fixture(name);
            let core = &docs.api.items[0];
            assert_eq!(core.metadata.name, "");
            let v1 = &core.versions[0];
            let pods = v1.resources.iter().find(|r| r.resource == "pods").unwrap();
            let subs: BTreeSet<&str> = pods
                .subresources
                .iter()
                .map(|s| s.subresource.as_str())
                .collect();
            assert!(
                subs.contains("status") && subs.contains("exec"),
                "{name}: {subs:?}"
            );
            assert_eq!(subs.contains("resize"), resize, "{name}");
            assert_eq!(pods.scope, "Namespaced");
            // Round trip to legacy gives back the same names.
            let legacy_path = format!("{}/api__v1.json", crate::test_fixtures::dir(name));
            let original =
                parse_resource_list(&std::fs::read(legacy_path).unwrap(), 1 << 20).unwrap();
            let derived = legacy_resource_list("", v1);
            let names = |l: &APIResourceList| -> BTreeSet<String> {
                l.resources.iter().map(|r| r.name.clone()).collect()
            };
            assert_eq!(names(&derived), names(&original), "{name}");
            assert_eq!(derived.group_version, "v1");
        }
    }

    #[test]
    fn legacy_documents_from_aggregated() {
        let docs = fixture("k8s-1.33");
        let list = legacy_group_list(&docs.apis);
        let resource = list
            .groups
            .iter()
            .find(|g| g.name == "resource.k8s.io")
            .unwrap();
        assert_eq!(
            resource.preferred_version.as_ref().unwrap().group_version,
            "resource.k8s.io/v1beta2"
        );
        let apps = docs
            .apis
            .items
            .iter()
            .find(|g| g.metadata.name == "apps")
            .unwrap();
        let v1 = legacy_resource_list("apps", &apps.versions[0]);
        let scale = v1
            .resources
            .iter()
            .find(|r| r.name == "deployments/scale")
            .unwrap();
        assert_eq!(scale.group.as_deref(), Some("autoscaling"));
        assert_eq!(scale.kind, "Scale");
        let json = serde_json::to_value(legacy_group(apps)).unwrap();
        assert_eq!(json["kind"], "APIGroup");
        assert_eq!(json["preferredVersion"]["groupVersion"], "apps/v1");
    }
}
