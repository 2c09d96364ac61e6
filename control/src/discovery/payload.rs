//! The merged discovery the filter serves: the union of every live apiserver's `/apis` and
//! `/api`, plus the legacy documents old clients need, where they differ from the local ones.

use std::collections::BTreeMap;

use skewgate_core::config::{DiscoveryConfig, JsonDocument, MAX_CONFIG_BYTES};
use skewgate_core::group_version::GroupVersion;

use crate::discovery::documents::{
    legacy_group, legacy_group_list, legacy_resource_list, DiscoveryDocuments,
};
use crate::discovery::merge::{merge_aggregated, merged_etag};

/// The most merged discovery we put into one filter configuration, all documents together:
/// three quarters of the configuration limit, the rest is left to the routing table.
///
/// The filter keeps one copy of these documents per Envoy process (shared data), not one per
/// VM; the VM that publishes them parses them whole once per version, every other VM streams
/// past them (docs/ARCHITECTURE.md, "Merged discovery"; measured in BENCHMARKS.md §5). A stock
/// cluster's merged `/apis` is about 60 KB; 10,000 CRD resources make it about 5 MB. Past
/// this limit the control plane leaves merged discovery out: discovery requests then go to
/// the local apiserver, which is upstream's behaviour without peer-aggregated discovery, and
/// the control plane says so in its log.
pub const MAX_MERGED_DISCOVERY_BYTES: usize = MAX_CONFIG_BYTES / 4 * 3;

#[derive(Debug, thiserror::Error)]
pub enum MergedDiscoveryError {
    #[error("merged discovery is {bytes} bytes, over the {MAX_MERGED_DISCOVERY_BYTES} bytes a filter configuration may carry; serving each apiserver's own discovery")]
    TooLarge { bytes: usize },
    #[error("the local apiserver {0:?} is not among the servers")]
    NoLocal(String),
    #[error("serialising merged discovery: {0}")]
    Json(#[from] serde_json::Error),
}

/// Merge `servers` (the local apiserver among them, every live peer) for the filter fronting
/// `local_id`. Every document keeps the local apiserver's preferred version of each group it
/// serves first (aggregated `/apis` and `/api`, served as v2 and v2beta1, and the legacy
/// `/apis` and `/apis/<group>` `preferredVersion`, derived from the aggregated order); a group
/// only peers serve prefers its newest version (`crate::merge`).
pub fn discovery_config(
    local_id: &str,
    servers: &[(String, &DiscoveryDocuments)],
) -> Result<DiscoveryConfig, MergedDiscoveryError> {
    let local = servers
        .iter()
        .find(|(id, _)| id == local_id)
        .map(|(_, docs)| *docs)
        .ok_or_else(|| MergedDiscoveryError::NoLocal(local_id.to_string()))?;
    let apis = merge_aggregated(
        local_id,
        &servers
            .iter()
            .map(|(id, d)| (id.clone(), d.apis.clone()))
            .collect::<Vec<_>>(),
    );
    let api = merge_aggregated(
        local_id,
        &servers
            .iter()
            .map(|(id, d)| (id.clone(), d.api.clone()))
            .collect::<Vec<_>>(),
    );

    let mut legacy: BTreeMap<String, String> = BTreeMap::new();
    let mut differs = |path: String, merged: String, local: Option<String>| {
        if local.as_deref() != Some(merged.as_str()) {
            legacy.insert(path, merged);
        }
    };
    differs(
        "/apis".to_string(),
        serde_json::to_string(&legacy_group_list(&apis))?,
        Some(serde_json::to_string(&legacy_group_list(&local.apis))?),
    );
    for (prefix, merged_doc, local_doc) in
        [("/apis", &apis, &local.apis), ("/api", &api, &local.api)]
    {
        for group in &merged_doc.items {
            let name = &group.metadata.name;
            let local_group = local_doc.items.iter().find(|g| &g.metadata.name == name);
            if prefix == "/apis" {
                differs(
                    format!("/apis/{name}"),
                    serde_json::to_string(&legacy_group(group))?,
                    local_group
                        .map(legacy_group)
                        .map(|g| serde_json::to_string(&g))
                        .transpose()?,
                );
            }
            for version in &group.versions {
                // The core group is the item named "" in `/api`.
                let path = GroupVersion::new(name.as_str(), version.version.as_str()).api_path();
                let local_version = local_group
                    .and_then(|g| g.versions.iter().find(|v| v.version == version.version));
                differs(
                    path,
                    serde_json::to_string(&legacy_resource_list(name, version))?,
                    local_version
                        .map(|v| serde_json::to_string(&legacy_resource_list(name, v)))
                        .transpose()?,
                );
            }
        }
    }

    let apis = serde_json::to_string(&apis)?;
    let api = serde_json::to_string(&api)?;
    let bytes = apis.len() + api.len() + legacy.values().map(String::len).sum::<usize>();
    if bytes > MAX_MERGED_DISCOVERY_BYTES {
        return Err(MergedDiscoveryError::TooLarge { bytes });
    }
    let document = |json: String| {
        // Serialised by serde_json just above: always one valid JSON value.
        JsonDocument::from_str(&json).map_err(|e| {
            MergedDiscoveryError::Json(serde_json::Error::io(std::io::Error::other(e.to_string())))
        })
    };
    let mut config = DiscoveryConfig {
        version: String::new(),
        unavailable: Default::default(),
        apis_etag: merged_etag(apis.as_bytes()),
        api_etag: merged_etag(api.as_bytes()),
        apis: document(apis)?,
        api: document(api)?,
        legacy: legacy
            .into_iter()
            .map(|(path, json)| Ok((path, document(json)?)))
            .collect::<Result<_, MergedDiscoveryError>>()?,
    };
    set_content_version(&mut config);
    Ok(config)
}

/// Sets `discovery.version` to the content hash of everything else in it (SHA-256 of its
/// canonical JSON without the version): the key under which each Envoy keeps one copy of these
/// documents for all its VMs (docs/ARCHITECTURE.md, "Merged discovery"). Call it last, once
/// nothing else changes.
pub fn set_content_version(discovery: &mut DiscoveryConfig) {
    discovery.version = String::new();
    // Serialising plain structs and string maps cannot fail.
    let json = serde_json::to_vec(&*discovery).unwrap_or_default();
    discovery.version = merged_etag(&json);
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::discovery::{APIGroup, APIGroupDiscoveryList, APIGroupList};
    use crate::test_fixtures::documents as fixture;

    /// `(group, versions)` of the merged aggregated `/apis`.
    fn aggregated(config: &DiscoveryConfig) -> Vec<(String, Vec<String>)> {
        let list: APIGroupDiscoveryList = serde_json::from_str(config.apis.get()).unwrap();
        list.items
            .into_iter()
            .map(|g| {
                let versions = g.versions.into_iter().map(|v| v.version).collect();
                (g.metadata.name, versions)
            })
            .collect()
    }

    /// What a client of the filter gets for `path`: the merged legacy document where the union
    /// differs from the local one, else the local apiserver's own (`local`).
    fn legacy<T: serde::de::DeserializeOwned>(
        config: &DiscoveryConfig,
        path: &str,
        local: impl FnOnce() -> T,
    ) -> T {
        match config.legacy.get(path) {
            Some(doc) => serde_json::from_str(doc.get()).unwrap(),
            None => local(),
        }
    }

    /// Every document the filter serves for `local_id` prefers, for each group, the version the
    /// aggregated order puts first: aggregated `/apis` (served as v2, and as v2beta1 by changing
    /// only `apiVersion`), legacy `/apis` and `/apis/<group>`. Returns the preferred versions.
    fn preferred_everywhere(
        local_id: &str,
        servers: &[(String, &DiscoveryDocuments)],
    ) -> BTreeMap<String, String> {
        let config = discovery_config(local_id, servers).unwrap();
        let local = servers.iter().find(|(id, _)| id == local_id).unwrap().1;
        let aggregated = aggregated(&config);
        let group_list: APIGroupList = legacy(&config, "/apis", || legacy_group_list(&local.apis));
        assert_eq!(group_list.groups.len(), aggregated.len());
        let mut preferred = BTreeMap::new();
        for (group, (name, versions)) in group_list.groups.iter().zip(&aggregated) {
            assert_eq!(&group.name, name);
            let listed: Vec<&String> = group.versions.iter().map(|v| &v.version).collect();
            assert_eq!(listed, versions.iter().collect::<Vec<_>>(), "/apis {name}");
            let first = &versions[0];
            assert_eq!(
                group.preferred_version.as_ref().map(|v| &v.version),
                Some(first),
                "/apis {name}"
            );
            let path = format!("/apis/{name}");
            let single: APIGroup = legacy(&config, &path, || {
                legacy_group(
                    local
                        .apis
                        .items
                        .iter()
                        .find(|g| &g.metadata.name == name)
                        .unwrap(),
                )
            });
            assert_eq!(
                single.preferred_version.as_ref().map(|v| &v.version),
                Some(first),
                "{path}"
            );
            preferred.insert(name.clone(), first.clone());
        }
        // The core group: /api lists v1 only, on every version we have.
        let api: APIGroupDiscoveryList = serde_json::from_str(config.api.get()).unwrap();
        assert_eq!(api.items[0].versions[0].version, "v1");
        preferred
    }

    #[test]
    fn local_preferred_versions_first_in_every_document() {
        for (local_name, peer_name) in [("k8s-1.30", "k8s-1.33"), ("k8s-1.33", "k8s-1.30")] {
            let (local, peer) = (fixture(local_name), fixture(peer_name));
            // The local apiserver earlier and later in id order.
            for (local_id, peer_id) in [
                ("apiserver-a", "apiserver-b"),
                ("apiserver-b", "apiserver-a"),
            ] {
                let servers = [(local_id.to_string(), &local), (peer_id.to_string(), &peer)];
                let preferred = preferred_everywhere(local_id, &servers);
                for group in &local.apis.items {
                    assert_eq!(
                        preferred[&group.metadata.name], group.versions[0].version,
                        "{} with {local_name} local as {local_id}",
                        group.metadata.name
                    );
                }
                // 1.30 serves resource.k8s.io v1alpha2 only; 1.33 v1beta2, v1beta1, v1alpha3.
                let want = if local_name == "k8s-1.30" {
                    "v1alpha2"
                } else {
                    "v1beta2"
                };
                assert_eq!(
                    preferred["resource.k8s.io"], want,
                    "{local_name} as {local_id}"
                );
            }
        }
    }

    #[test]
    fn peer_only_group_prefers_its_newest_version() {
        // The local 1.30 apiserver does not serve resource.k8s.io; a 1.30 peer serves v1alpha2,
        // a 1.33 peer v1beta2, v1beta1 and v1alpha3.
        let mut local = fixture("k8s-1.30");
        local
            .apis
            .items
            .retain(|g| g.metadata.name != "resource.k8s.io");
        let (old, new) = (fixture("k8s-1.30"), fixture("k8s-1.33"));
        let servers = [
            ("apiserver-b".to_string(), &local),
            ("apiserver-a".to_string(), &old),
            ("apiserver-c".to_string(), &new),
        ];
        let preferred = preferred_everywhere("apiserver-b", &servers);
        assert_eq!(preferred["resource.k8s.io"], "v1beta2");
        let config = discovery_config("apiserver-b", &servers).unwrap();
        let resource = aggregated(&config)
            .into_iter()
            .find(|(g, _)| g == "resource.k8s.io")
            .unwrap();
        assert_eq!(resource.1, ["v1beta2", "v1beta1", "v1alpha3", "v1alpha2"]);
    }

    #[test]
    fn legacy_documents_only_where_the_union_differs() {
        let (old, new) = (fixture("k8s-1.30"), fixture("k8s-1.33"));
        let servers = [
            ("apiserver-a".to_string(), &old),
            ("apiserver-b".to_string(), &new),
        ];
        let config = discovery_config("apiserver-a", &servers).unwrap();
        let paths: Vec<&str> = config.legacy.keys().map(String::as_str).collect();
        for want in [
            "/apis",
            "/apis/resource.k8s.io",
            "/apis/resource.k8s.io/v1beta2",
            "/apis/admissionregistration.k8s.io/v1alpha1",
            "/api/v1",
        ] {
            assert!(paths.contains(&want), "{want} missing from {paths:?}");
        }
        for absent in [
            "/apis/apps",
            "/apis/apps/v1",
            "/apis/resource.k8s.io/v1alpha2",
        ] {
            assert!(!paths.contains(&absent), "{absent} needlessly in {paths:?}");
        }
        // The merged core group has pods/resize, which only 1.33 serves.
        assert!(config.api.get().contains("\"resize\""));
        assert!(config.apis.get().contains("\"v1beta2\""));
        config.validate().unwrap();

        // Alone, an apiserver's merged view is its own, and needs no legacy documents.
        let alone = discovery_config("apiserver-a", &servers[..1]).unwrap();
        assert!(alone.legacy.is_empty(), "{:?}", alone.legacy.keys());
    }

    #[test]
    fn etags_follow_content_and_not_input_order() {
        let (old, new) = (fixture("k8s-1.30"), fixture("k8s-1.33"));
        let ab =
            discovery_config("a", &[("a".to_string(), &old), ("b".to_string(), &new)]).unwrap();
        let ba =
            discovery_config("a", &[("b".to_string(), &new), ("a".to_string(), &old)]).unwrap();
        assert_eq!(ab, ba);
        let alone = discovery_config("a", &[("a".to_string(), &old)]).unwrap();
        assert_ne!(ab.apis_etag, alone.apis_etag);
    }
}
