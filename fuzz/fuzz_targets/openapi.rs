//! OpenAPI v3 roots: the control plane's `OpenApiRoot::parse` of a peer's `/openapi/v3`, and the
//! filter's `union_root` of the local one (docs/ARCHITECTURE.md "OpenAPI v3").
//!
//! Input: any bytes, used as both. Asserts, beyond "never panics":
//! * every entry `parse` keeps passes `validate_entry`: its URL is its own path's document;
//! * `union_root` of an accepted local body is JSON whose `paths` keep every local entry as it
//!   was and add the configured peer entry only where the local body has none.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use skewgate_control::openapi::OpenApiRoot;
use skewgate_core::config::OpenApiPeerEntry;
use skewgate_core::openapi::{union_root, validate_entry, OpenApiUnion};

const PEER: &str = "apis/coordination.k8s.io/v1beta1";
const PEER_URL: &str = "/openapi/v3/apis/coordination.k8s.io/v1beta1?hash=AB";

fuzz_target!(|data: &[u8]| {
    if let Ok((root, _)) = OpenApiRoot::parse(data, 1 << 20) {
        for (path, url) in &root.paths {
            assert!(validate_entry(path, url).is_ok(), "{path} {url}");
        }
    }
    let union = OpenApiUnion::compile(&BTreeMap::from([(
        PEER.to_string(),
        OpenApiPeerEntry {
            server_relative_url: PEER_URL.to_string(),
            peer_cluster: "skewgate-peers-b".to_string(),
        },
    )]));
    let Ok(out) = union_root(data, &union) else {
        return;
    };
    let local: serde_json::Value = serde_json::from_slice(data).expect("accepted means JSON");
    let out: serde_json::Value = serde_json::from_slice(&out).expect("the union is JSON");
    let (Some(local_paths), Some(paths)) = (local["paths"].as_object(), out["paths"].as_object())
    else {
        panic!("paths objects in and out");
    };
    for (path, entry) in local_paths {
        assert_eq!(paths.get(path), Some(entry), "{path}");
    }
    if !local_paths.contains_key(PEER) {
        assert_eq!(paths[PEER]["serverRelativeURL"], PEER_URL);
    }
    assert!(paths.len() <= local_paths.len() + 1);
});
