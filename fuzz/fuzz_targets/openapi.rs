//! OpenAPI v3 roots: the control plane's `OpenApiRoot::parse` of a peer's `/openapi/v3`, and the
//! filter's `union_root` of the local one (docs/ARCHITECTURE.md "OpenAPI v3").
//!
//! Input: any bytes, used as both. Asserts, beyond "never panics":
//! * every entry `parse` keeps passes `validate_entry`: its URL is its own path's document;
//! * `union_root` of an accepted local body is JSON whose `paths` keep every local entry as it
//!   was and add the configured peer entry only where the local body has none;
//! * the union is no longer than the local body and the entry added (`union_root`'s size
//!   bound, which keeps it under `MAX_UNION_BYTES`).
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use serde_json::value::RawValue;
use skewgate_control::discovery::openapi::OpenApiRoot;
use skewgate_core::config::OpenApiPeerEntry;
use skewgate_core::openapi::{union_root, validate_entry, OpenApiUnion, MAX_UNION_BYTES};

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
            replaces_local: false,
        },
    )]));
    let Ok(out) = union_root(data, &union) else {
        return;
    };
    assert_eq!(out.left_out, 0);
    let entry = format!(r#""{PEER}":{{"serverRelativeURL":"{PEER_URL}"}},"#);
    assert!(out.body.len() <= data.len() + entry.len() && out.body.len() <= MAX_UNION_BYTES);
    let out = out.body;
    // Compared as raw JSON text, not as serde_json::Value: a number beyond f64 (`1E400`) is
    // valid JSON that the union passes through unchanged, and Value cannot hold it.
    let raw_map = |text: &[u8], what: &str| -> BTreeMap<String, Box<RawValue>> {
        serde_json::from_slice(text).unwrap_or_else(|e| panic!("{what}: {e}"))
    };
    let local = raw_map(data, "accepted means a JSON object");
    let out = raw_map(&out, "the union is a JSON object");
    let (Some(local_paths), Some(paths)) = (local.get("paths"), out.get("paths")) else {
        panic!("paths in and out");
    };
    let local_paths = raw_map(
        local_paths.get().as_bytes(),
        "accepted means paths is an object",
    );
    let paths = raw_map(paths.get().as_bytes(), "the union's paths are an object");
    for (path, entry) in &local_paths {
        assert_eq!(
            paths.get(path).map(|e| e.get()),
            Some(entry.get()),
            "{path}"
        );
    }
    if !local_paths.contains_key(PEER) {
        let peer: serde_json::Value =
            serde_json::from_str(paths.get(PEER).expect("the peer entry is added").get())
                .expect("the peer entry is JSON");
        assert_eq!(peer["serverRelativeURL"], PEER_URL);
    }
    assert!(paths.len() <= local_paths.len() + 1);
});
