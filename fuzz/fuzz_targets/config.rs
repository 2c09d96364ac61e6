//! The filter configuration: `FilterConfig::from_json` + `validate`, `RoutingTable::compile`,
//! `CompiledConfig::compile`, `route` and `plan_request`.
//!
//! Input: the configuration JSON, then (after the first NUL byte) request lines
//! `METHOD PATH`. Asserts, beyond "never panics":
//! * `from_json` accepts exactly what deserializes and validates, and an accepted config
//!   survives `to_json` + `from_json` unchanged;
//! * a config that validates compiles and routes every path (the input's lines, fixed probes,
//!   and one request per configured resource) without panicking; a peer decision names a
//!   declared cluster; the request for a configured resource goes where the config says
//!   (shared storage: local; `local`: local; a peer cluster: that cluster);
//! * a config that does not parse routes the same lines through a fixed valid config.
#![no_main]

use libfuzzer_sys::fuzz_target;
use skewgate_core::config::FilterConfig;
use skewgate_core::plan::{plan_request, CompiledConfig};
use skewgate_core::routing::{Reason, RoutingTable, Upstream};
use std::fmt::Write;

const BASE: &str = r#"{"schema":1,"local_apiserver":"kube-apiserver-a","peer_clusters":{"skewgate-peer-b":["kube-apiserver-b"]},"group_versions":[{"group":"","version":"v1","resources":[{"resource":"pods","local":true},{"resource":"pods/resize","peer_cluster":"skewgate-peer-b"}]},{"group":"apps","version":"v1","resources":[{"resource":"deployments","local":true,"peer_cluster":"skewgate-peer-b"}]},{"group":"stable.example.com","version":"v1","shared_storage":true},{"group":"resource.k8s.io","version":"v1beta2","resources":[{"resource":"deviceclasses","peer_cluster":"skewgate-peer-b"},{"resource":"resourceclaims","retained":true}]}],"pending_peers":["kube-apiserver-c"]}"#;

const PROBES: [&str; 8] = [
    "/api/v1/namespaces/default/pods/p",
    "/api/v1/pods?watch=1",
    "/api/v1/namespaces/default/pods/p/resize",
    "/apis/apps/v1/deployments",
    "/apis/resource.k8s.io/v1beta2/deviceclasses/x",
    "/apis/stable.example.com/v1/crontabs",
    "/apis",
    "/healthz",
];

fn encode(segment: &str) -> String {
    let mut out = String::new();
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

fn exercise(config: &FilterConfig, lines: &[(&str, &str)]) {
    let table = RoutingTable::compile(config);
    let compiled = CompiledConfig::compile(config);
    let _ = table.local_apiserver();
    let probes = PROBES.iter().map(|p| ("GET", *p));
    for (method, path) in lines.iter().copied().chain(probes) {
        let (_, decision) = table.route(method, path);
        match decision.upstream {
            Upstream::Peer { cluster } => {
                assert!(config.peer_clusters.contains_key(cluster), "{cluster:?}");
                assert_eq!(decision.reason, Reason::ServedByPeer);
            }
            // A retained key, to the declared departed apiservers that served it.
            Upstream::Departed { cluster } => {
                assert!(
                    config.departed_clusters.contains_key(cluster),
                    "{cluster:?}"
                );
                assert_eq!(decision.reason, Reason::Retained);
            }
            Upstream::Local => assert_ne!(decision.reason, Reason::ServedByPeer),
            // Failover: a declared failover cluster, for what the local apiserver serves (or
            // every apiserver does).
            Upstream::LocalFirst { failover } => {
                assert!(
                    config.failover_clusters.contains_key(failover),
                    "{failover:?}"
                );
                assert!(
                    matches!(
                        decision.reason,
                        Reason::ServedLocally | Reason::SharedStorage | Reason::NonResourceRequest
                    ),
                    "{:?}",
                    decision.reason
                );
            }
            // Answered 503 by the filter: only for retained resources, or while a live peer's
            // discovery is not known yet.
            Upstream::Unavailable => assert!(
                matches!(
                    decision.reason,
                    Reason::Retained | Reason::PeerDiscoveryPending
                ),
                "{:?}",
                decision.reason
            ),
        }
        let headers = [(":method", method), (":path", path), ("accept", path)];
        let _ = plan_request(&headers, None, &compiled);
        let _ = plan_request(&headers, Some(path.as_bytes()), &compiled);
    }

    // One request per configured top-level resource goes where the config says.
    for gv in &config.group_versions {
        for r in &gv.resources {
            if r.resource.contains('/') || matches!(r.resource.as_str(), "watch" | "proxy") {
                continue;
            }
            let path = if gv.group.is_empty() {
                format!("/api/{}/{}", encode(&gv.version), encode(&r.resource))
            } else {
                format!(
                    "/apis/{}/{}/{}",
                    encode(&gv.group),
                    encode(&gv.version),
                    encode(&r.resource)
                )
            };
            let (info, decision) = table.route("GET", &path);
            let Some(info) = info else {
                panic!("{path:?} does not parse");
            };
            assert_eq!(
                (&*info.api_group, &*info.api_version),
                (gv.group.as_str(), gv.version.as_str()),
                "{path:?}"
            );
            assert_eq!(info.resource, r.resource, "{path:?}");
            if gv.shared_storage {
                assert_eq!(decision.reason, Reason::SharedStorage, "{path:?}");
            } else if r.local {
                assert_eq!(decision.reason, Reason::ServedLocally, "{path:?}");
                if let Some(failover) = &r.failover_cluster {
                    assert_eq!(
                        decision.upstream,
                        Upstream::LocalFirst { failover },
                        "{path:?}"
                    );
                }
            } else if let Some(cluster) = &r.peer_cluster {
                assert_eq!(decision.upstream, Upstream::Peer { cluster }, "{path:?}");
            } else if r.retained {
                assert_eq!(decision.reason, Reason::Retained, "{path:?}");
                match &r.departed_cluster {
                    Some(cluster) => assert_eq!(
                        decision.upstream,
                        Upstream::Departed { cluster },
                        "{path:?}"
                    ),
                    None => assert_eq!(decision.upstream, Upstream::Unavailable, "{path:?}"),
                }
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let (json, rest) = match data.iter().position(|&b| b == 0) {
        Some(i) => (
            data.get(..i).unwrap_or_default(),
            data.get(i + 1..).unwrap_or_default(),
        ),
        None => (data, &[][..]),
    };
    let rest = String::from_utf8_lossy(rest);
    let lines: Vec<(&str, &str)> = rest
        .lines()
        .take(64)
        .map(|l| l.split_once(' ').unwrap_or(("GET", l)))
        .collect();

    let parsed = FilterConfig::from_json(json);
    let deserialized = serde_json::from_slice::<FilterConfig>(json);
    if let Ok(config) = &deserialized {
        assert_eq!(
            config.validate().is_ok(),
            parsed.is_ok(),
            "from_json and deserialize + validate disagree"
        );
        // Compiling and routing do not rely on validation to stay panic-free.
        let table = RoutingTable::compile(config);
        for (method, path) in &lines {
            let _ = table.route(method, path);
        }
    } else {
        assert!(parsed.is_err());
    }

    match parsed {
        Ok(config) => {
            let json = config.to_json();
            let again = FilterConfig::from_json(json.as_bytes());
            assert_eq!(again.as_ref(), Ok(&config), "to_json: {json}");
            exercise(&config, &lines);
        }
        Err(_) => {
            let base = FilterConfig::from_json(BASE.as_bytes());
            let Ok(base) = base else {
                panic!("the base config is refused: {base:?}");
            };
            exercise(&base, &lines);
        }
    }
});
