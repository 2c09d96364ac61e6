//! The merged discovery the filter serves: the union of every live apiserver's `/apis` and
//! `/api`, plus the legacy documents old clients need, where they differ from the local ones.

use std::collections::BTreeMap;

use skewgate_core::config::{DiscoveryConfig, JsonDocument, MAX_CONFIG_BYTES};

use crate::documents::{legacy_group, legacy_group_list, legacy_resource_list, DiscoveryDocuments};
use crate::merge::{merge_aggregated, merged_etag};

/// The most merged discovery we put into one filter configuration, all documents together.
///
/// Every Envoy worker VM parses each configuration push (about 7 ms and 3.5 MB of wasm memory
/// per MB of JSON, measured, and wasm memory never shrinks). A stock cluster's merged `/apis`
/// is about 60 KB; a few thousand CRD resources make it about 1-2 MB. Past this limit the
/// control plane leaves merged discovery out: discovery requests then go to the local
/// apiserver, which is upstream's behaviour without peer-aggregated discovery, and the
/// control plane says so in its log.
pub const MAX_MERGED_DISCOVERY_BYTES: usize = MAX_CONFIG_BYTES / 2;

#[derive(Debug, thiserror::Error)]
pub enum MergedDiscoveryError {
    #[error("merged discovery is {bytes} bytes, over the {MAX_MERGED_DISCOVERY_BYTES} bytes a filter configuration may carry; serving each apiserver's own discovery")]
    TooLarge { bytes: usize },
    #[error("the local apiserver {0:?} is not among the servers")]
    NoLocal(String),
    #[error("serialising merged discovery: {0}")]
    Json(#[from] serde_json::Error),
}

/// Merge `servers` (the local apiserver among them, every live peer) for the filter.
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
        &servers
            .iter()
            .map(|(id, d)| (id.clone(), d.apis.clone()))
            .collect::<Vec<_>>(),
    );
    let api = merge_aggregated(
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
                let path = if prefix == "/apis" {
                    format!("/apis/{name}/{}", version.version)
                } else {
                    format!("/api/{}", version.version)
                };
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
    Ok(DiscoveryConfig {
        apis_etag: merged_etag(apis.as_bytes()),
        api_etag: merged_etag(api.as_bytes()),
        apis: document(apis)?,
        api: document(api)?,
        legacy: legacy
            .into_iter()
            .map(|(path, json)| Ok((path, document(json)?)))
            .collect::<Result<_, MergedDiscoveryError>>()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_fixtures::documents as fixture;

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
