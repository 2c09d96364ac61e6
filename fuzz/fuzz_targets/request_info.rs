//! `request_info::parse` (and routing) on any method and request target.
//!
//! Input: `METHOD\nTARGET` (no newline: the whole input is a `GET` target), lossy UTF-8 as the
//! filter reads Envoy's headers. Asserts, beyond "never panics":
//! * the RequestInfo invariants upstream's parser keeps (prefixes, a group only under `apis`,
//!   no resource, name or parts outside a resource request, `deletecollection` has no name;
//!   empty segments are kept: `//api//v1` is version `""`, resource `v1`, as upstream);
//! * re-rendering: the decoded path percent-encoded again (every byte but unreserved ones and
//!   `/`; or every byte, `/` included, after the leading one), with the same query, parses to
//!   the same RequestInfo and routes the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use skewgate_core::config::{FilterConfig, GroupVersionRoutes, ResourceRoute, SCHEMA_VERSION};
use skewgate_core::request_info;
use skewgate_core::routing::{RoutingTable, MAX_ROUTED_PATH};
use std::collections::BTreeMap;
use std::fmt::Write;

fn encode(path: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(path.len() * 3);
    for (i, b) in path.bytes().enumerate() {
        let keep = b.is_ascii_alphanumeric()
            || matches!(b, b'-' | b'.' | b'_' | b'~')
            || (b == b'/' && (keep_slash || i == 0));
        if keep {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

fn route(group: &str, version: &str, resource: &str, peer: bool) -> GroupVersionRoutes {
    GroupVersionRoutes {
        group: group.into(),
        version: version.into(),
        shared_storage: false,
        resources: vec![ResourceRoute {
            departed_cluster: None,
            resource: resource.into(),
            local: !peer,
            peer_cluster: peer.then(|| "skewgate-peer-a".to_string()),
            retained: false,
            failover_cluster: None,
        }],
    }
}

fn table() -> RoutingTable {
    let mut peer_clusters = BTreeMap::new();
    peer_clusters.insert("skewgate-peer-a".to_string(), vec!["b".to_string()]);
    let mut apps = route("apps", "v1", "deployments", true);
    apps.resources.push(ResourceRoute {
        departed_cluster: None,
        resource: "deployments/scale".into(),
        local: true,
        peer_cluster: None,
        retained: false,
        failover_cluster: None,
    });
    let config = FilterConfig {
        departed_clusters: Default::default(),
        fallback: None,
        schema: SCHEMA_VERSION,
        local_apiserver: "a".into(),
        peer_clusters,
        group_versions: vec![
            route("", "v1", "pods", false),
            apps,
            route("batch", "v1", "jobs", true),
            route("resource.k8s.io", "v1beta2", "deviceclasses", false),
        ],
        discovery: None,
        pending_peers: vec![],
        openapi_v3: Default::default(),
        failover_clusters: Default::default(),
        failover_all: None,
    };
    assert!(config.validate().is_ok(), "the fuzz table validates");
    RoutingTable::compile(&config)
}

fuzz_target!(|data: &[u8]| {
    let input = String::from_utf8_lossy(data);
    let (method, target) = input.split_once('\n').unwrap_or(("GET", &input));

    let parsed = request_info::parse(method, target);
    let table = table();
    let (routed_info, decision) = table.route(method, target);
    if target.len() <= MAX_ROUTED_PATH {
        assert_eq!(routed_info, parsed.clone().ok(), "route parses like parse");
    } else if let Some((path, _)) = target
        .split_once('?')
        .filter(|(path, _)| path.len() <= MAX_ROUTED_PATH)
    {
        // A query too long to read: the path alone decides.
        let path_only = request_info::parse(method, path);
        assert_eq!(routed_info, path_only.ok(), "route parses the path alone");
    } else {
        assert_eq!(routed_info, None, "a path too long is not parsed");
    }

    let Ok(info) = parsed else { return };
    let _ = info.is_long_running();
    if info.is_resource_request {
        assert!(
            info.api_prefix == "api" || info.api_prefix == "apis",
            "{info:?}"
        );
        if info.api_prefix == "api" {
            assert!(info.api_group.is_empty(), "{info:?}");
        }
    } else {
        assert!(info.resource.is_empty() && info.name.is_empty(), "{info:?}");
        assert!(
            info.namespace.is_empty() && info.subresource.is_empty(),
            "{info:?}"
        );
        assert!(info.parts.is_empty(), "{info:?}");
    }
    if !info.name.is_empty() || !info.subresource.is_empty() {
        assert!(info.is_resource_request, "{info:?}");
    }
    if info.verb == "deletecollection" {
        assert!(info.name.is_empty(), "{info:?}");
    }

    // Re-render the decoded path; the query stays as it was.
    if !info.path.starts_with('/') {
        return; // `*`
    }
    let query = target.split_once('?').map(|(_, q)| q);
    for keep_slash in [true, false] {
        let mut again = encode(&info.path, keep_slash);
        if let Some(q) = query {
            again.push('?');
            again.push_str(q);
        }
        let reparsed = request_info::parse(method, &again);
        assert_eq!(
            reparsed.as_ref(),
            Ok(&info),
            "{target:?} re-rendered as {again:?}"
        );
        if target.len() <= MAX_ROUTED_PATH && again.len() <= MAX_ROUTED_PATH {
            let (_, decision_again) = table.route(method, &again);
            assert_eq!(
                decision_again, decision,
                "{target:?} re-rendered as {again:?}"
            );
        }
    }
});
