//! An older control plane, a newer filter: the configuration the previous release's control
//! plane renders (`tests/fixtures/previous-release/`, see its PROVENANCE.md) is accepted by
//! this release's filter and routes as it did (docs/ARCHITECTURE.md, "skewgate's own
//! upgrades").
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use skewgate_core::config::{DiscoveryRef, FilterConfig, READ_SCHEMAS};
use skewgate_core::plan::{plan_request, CompiledConfig, RequestPlan, Route, Unavailable};
use skewgate_core::routing::{Decision, Upstream};

const PREVIOUS_RELEASE: &str = include_str!("fixtures/previous-release/filter-config.json");

/// The peer cluster of the 1.33 peer in the fixture's world.
const PEER: &str = "skewgate-peers-16b25d540f7c";
const AGGREGATED: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Goes {
    Local,
    Peer,
    MergedDiscovery,
    Answered503(Unavailable),
}

fn goes(compiled: &CompiledConfig, path: &str, accept: &str) -> Goes {
    let headers = [(":method", "GET"), (":path", path), ("accept", accept)];
    match plan_request(&headers, None, compiled) {
        RequestPlan::Forward(f) => match f.route {
            Route::MergedDiscovery => Goes::MergedDiscovery,
            Route::Table(Decision {
                upstream: Upstream::Local,
                ..
            }) => {
                assert_eq!(f.cluster, "skewgate-local-anonymous", "{path}");
                Goes::Local
            }
            Route::Table(Decision {
                upstream: Upstream::Peer { cluster },
                ..
            }) => {
                assert_eq!(cluster, PEER, "{path}");
                assert_eq!(f.cluster, format!("{PEER}-anonymous"), "{path}");
                Goes::Peer
            }
            other => panic!("{path}: {other:?}"),
        },
        RequestPlan::Unavailable { cause, .. } => Goes::Answered503(cause),
        other => panic!("{path}: {other:?}"),
    }
}

#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn the_previous_releases_configuration_is_accepted_and_routes_as_before() {
    let bytes = PREVIOUS_RELEASE.as_bytes();
    let config = FilterConfig::from_json(bytes).expect("accepted whole");
    assert!(READ_SCHEMAS.contains(&config.schema));
    // The routing-only parse every VM but one does accepts it too, with its discovery version.
    let routing = FilterConfig::routing_from_slice(bytes).expect("accepted, routing part");
    assert!(matches!(routing.discovery, DiscoveryRef::Version(_)));
    assert_eq!(
        FilterConfig::routing_from_reader(bytes).expect("streamed"),
        routing
    );
    let compiled = CompiledConfig::compile(&config);
    assert!(compiled.discovery.is_some(), "merged discovery");
    assert!(compiled.fallback.is_none());

    let hash = |c: char| c.to_string().repeat(128);
    let cases = [
        // Served by the local 1.30 apiserver.
        ("/api/v1/namespaces/default/pods", "*/*", Goes::Local),
        (
            "/apis/apps/v1/namespaces/default/deployments",
            "*/*",
            Goes::Local,
        ),
        ("/version", "*/*", Goes::Local),
        // Only the 1.33 peer serves it: the resource, and a new subresource of a local one.
        (
            "/apis/resource.k8s.io/v1beta2/namespaces/default/resourceclaims/gpu",
            "*/*",
            Goes::Peer,
        ),
        (
            "/api/v1/namespaces/default/pods/web/resize",
            "*/*",
            Goes::Peer,
        ),
        (
            "/apis/coordination.k8s.io/v1beta1/namespaces/kube-system/leasecandidates",
            "*/*",
            Goes::Peer,
        ),
        // A CRD: shared storage, always local.
        (
            "/apis/stable.example.com/v1/namespaces/default/crontabs",
            "*/*",
            Goes::Local,
        ),
        // Only the departed apiserver served it: 503, never the local 404.
        (
            "/apis/resource.k8s.io/v1/deviceclasses",
            "*/*",
            Goes::Answered503(Unavailable::Retained),
        ),
        (
            "/apis/resource.k8s.io/v1",
            "application/json",
            Goes::Answered503(Unavailable::RetainedDiscovery),
        ),
        (
            "/openapi/v3/apis/resource.k8s.io/v1",
            "application/json",
            Goes::Answered503(Unavailable::RetainedOpenApi),
        ),
        // Nobody known serves it while a peer's discovery is pending: 503.
        (
            "/apis/example.com/v1/widgets",
            "*/*",
            Goes::Answered503(Unavailable::PeerDiscoveryPending),
        ),
        // Merged discovery, and a peer-only OpenAPI v3 document at its peer.
        ("/apis", AGGREGATED, Goes::MergedDiscovery),
        ("/api", AGGREGATED, Goes::MergedDiscovery),
        (
            &format!(
                "/openapi/v3/apis/coordination.k8s.io/v1beta1?hash={}",
                hash('2')
            ),
            "application/json",
            Goes::Peer,
        ),
    ];
    for (path, accept, want) in cases {
        assert_eq!(goes(&compiled, path, accept), want, "{path}");
    }
}
