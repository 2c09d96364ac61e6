//! The control plane's discovery parsers on arbitrary bytes: `parse_aggregated`,
//! `parse_resource_list`, `parse_group_list`, `parse_versions`, and what is built from a document
//! they accept (`ServedApis`, the legacy planning and assembly of `discovery::legacy`).
//!
//! Asserts, beyond "never panics": every accepted document, serialised back and parsed again,
//! is the same value; `ServedApis::from_aggregated` of an accepted aggregated document never
//! panics, its stats agree with its iteration, and, as its docs promise, every name it holds
//! passes the filter's configuration validation (a config serving all of it validates); the
//! legacy plans only name path-safe segments, and assembling a legacy core document gives an
//! aggregated document that survives the same round trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use skewgate_control::discovery::legacy::{
    assemble_apis, assemble_core, check_resource_list, path_segment_ok, plan_core_versions,
    plan_group_list, stale_paths, VersionOutcome,
};
use skewgate_control::discovery::{
    parse_aggregated, parse_group_list, parse_resource_list, parse_versions, APIGroupDiscoveryList,
    ServedApis,
};
use skewgate_core::config::{FilterConfig, GroupVersionRoutes, ResourceRoute, SCHEMA_VERSION};
use std::collections::BTreeMap;

const MAX: usize = 1 << 20;

fn reparsed<T, E: std::fmt::Debug>(value: &T, parse: impl Fn(&[u8]) -> Result<T, E>) -> T
where
    T: serde::Serialize,
{
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    match parse(&bytes) {
        Ok(again) => again,
        Err(e) => panic!(
            "serialised form refused: {e:?}\n{}",
            String::from_utf8_lossy(&bytes)
        ),
    }
}

fn check_served(list: &APIGroupDiscoveryList) {
    let _ = stale_paths(list);
    let Ok(served) = ServedApis::from_aggregated(list) else {
        return;
    };
    let stats = served.stats();
    assert_eq!(stats.group_versions, served.group_versions().count());
    assert_eq!(stats.groups, served.groups().count());
    let keys: usize = served.iter().map(|(_, _, keys)| keys.len()).sum();
    assert_eq!(stats.resources + stats.subresources, keys);
    let mut again = served.clone();
    again.merge(served.clone());
    assert_eq!(again, served, "merging with itself changes nothing");
    assert!(served.difference(&served).is_empty());

    let config = FilterConfig {
        departed_clusters: Default::default(),
        fallback: None,
        schema: SCHEMA_VERSION,
        local_apiserver: "a".into(),
        peer_clusters: BTreeMap::new(),
        group_versions: served
            .iter()
            .map(|(g, v, keys)| GroupVersionRoutes {
                group: g.into(),
                version: v.into(),
                shared_storage: false,
                resources: keys
                    .iter()
                    .map(|k| ResourceRoute {
                        departed_cluster: None,
                        resource: k.clone(),
                        local: true,
                        peer_cluster: None,
                        retained: false,
                        failover_cluster: None,
                    })
                    .collect(),
            })
            .collect(),
        discovery: None,
        pending_peers: vec![],
        openapi_v3: Default::default(),
        failover_clusters: Default::default(),
        failover_all: None,
    };
    if let Err(e) = config.validate() {
        panic!("ServedApis holds what the filter config refuses: {e}");
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(list) = parse_aggregated(data, MAX) {
        let again = reparsed(&list, |b| parse_aggregated(b, MAX));
        assert_eq!(again, list, "aggregated round trip");
        check_served(&list);
    }

    if let Ok(list) = parse_resource_list(data, MAX) {
        let again = reparsed(&list, |b| parse_resource_list(b, MAX));
        assert_eq!(again, list, "resource list round trip");
        let _ = check_resource_list(&list, "", "v1");
        let mut served = ServedApis::new();
        let _ = served.add_legacy_resource_list("", "v1", &list);
        let core = assemble_core(&[("v1".to_string(), list.clone())]);
        let again = reparsed(&core, |b| parse_aggregated(b, usize::MAX));
        assert_eq!(again, core, "assembled core round trip");
        check_served(&core);
        let apis = assemble_apis(&[(
            "example.com".to_string(),
            vec![
                ("v1".to_string(), VersionOutcome::Served(list)),
                ("v2".to_string(), VersionOutcome::Unavailable),
                ("v3".to_string(), VersionOutcome::Gone),
            ],
        )]);
        assert_eq!(stale_paths(&apis), vec!["/apis/example.com/v2".to_string()]);
        check_served(&apis);
    }

    if let Ok(list) = parse_group_list(data, MAX) {
        let again = reparsed(&list, |b| parse_group_list(b, MAX));
        assert_eq!(again, list, "group list round trip");
        if let Ok(plan) = plan_group_list(&list) {
            for (group, versions) in &plan {
                assert!(path_segment_ok(group), "{group:?}");
                assert!(!versions.is_empty(), "{group:?}");
                assert!(versions.iter().all(|v| path_segment_ok(v)), "{versions:?}");
            }
        }
    }

    if let Ok(versions) = parse_versions(data, MAX) {
        let again = reparsed(&versions, |b| parse_versions(b, MAX));
        assert_eq!(again, versions, "versions round trip");
        if let Ok(plan) = plan_core_versions(&versions) {
            assert!(!plan.is_empty() && plan.len() <= 16);
            assert!(plan.iter().all(|v| path_segment_ok(v)), "{plan:?}");
        }
    }
});
