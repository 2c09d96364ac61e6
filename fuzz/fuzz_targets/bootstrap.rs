//! Arbitrary strings in a peer's discovery, through the whole pipeline to the bootstrap Envoy
//! would start from: the peer's aggregated `/apis` carries them in every string field a
//! resource has (group and resource names, singular name, kind, short names, categories,
//! verbs), the control plane plans the cluster, keeps the configuration as it would after an
//! ACK, and `bootstrap` renders the fallback from that record.
//!
//! Asserts, beyond "never panics": a record the control plane would keep always renders (the
//! record check and the renderer agree); the rendered bootstrap (YAML) reads back as Envoy's
//! message, keeps its structure (node id, one listener, the fallback's clusters and the control
//! plane's), and carries exactly the configuration that was kept, byte for byte, which the
//! filter accepts.
#![no_main]

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use envoy_types::pb::envoy::config::bootstrap::v3::Bootstrap as EnvoyBootstrap;
use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType as NetworkConfigType;
use envoy_types::pb::envoy::extensions::filters::http::wasm::v3::Wasm;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_filter, HttpConnectionManager,
};
use envoy_types::pb::google::protobuf::StringValue;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use skewgate_control::discovery::documents::{empty_list, DiscoveryDocuments};
use skewgate_control::discovery::parse_aggregated;
use skewgate_control::envoy::bootstrap::{Bootstrap, ConfigSource, LISTENER_NAME};
use skewgate_control::envoy::fallback::{check_record, last_acknowledged_config, FallbackInputs};
use skewgate_control::envoy::resources::{DataPlane, FilterCode};
use skewgate_control::envoy::{Address, FILTER_NAME};
use skewgate_control::local_channels::LocalChannel;
use skewgate_control::plan::{plan, ApiserverView, PlanInputs};
use skewgate_control::routing::peer_cluster_name;
use skewgate_core::config::FilterConfig;

fn documents(apis: serde_json::Value) -> Option<DiscoveryDocuments> {
    let bytes = serde_json::to_vec(&apis).ok()?;
    Some(DiscoveryDocuments {
        apis: parse_aggregated(&bytes, 1 << 24).ok()?,
        api: empty_list(),
        openapi: None,
    })
}

fn resource(name: &str, strings: &[String]) -> serde_json::Value {
    let at = |i: usize| strings.get(i).cloned().unwrap_or_default();
    serde_json::json!({
        "resource": name,
        "responseKind": {"group": at(2), "version": at(3), "kind": at(4)},
        "scope": "Namespaced",
        "singularResource": at(5),
        "verbs": ["get", "list", at(6)],
        "shortNames": strings,
        "categories": strings,
        "subresources": [{"subresource": at(7), "verbs": ["get"]}],
    })
}

fuzz_target!(|data: &[u8]| {
    if data.len() > 64 * 1024 {
        return;
    }
    let strings: Vec<String> = data
        .split(|b| *b == 0xff)
        .take(16)
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    let at = |i: usize| strings.get(i).cloned().unwrap_or_default();
    // The peer serves a group named by the input (when it is a name the control plane takes)
    // beside one that is always fine, each with a resource carrying every string.
    let peer_apis = serde_json::json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {},
        "items": [
            {"metadata": {"name": "fuzz.example.com"}, "versions": [
                {"version": "v1", "resources": [resource("things", &strings)], "freshness": "Current"}]},
            {"metadata": {"name": at(0)}, "versions": [
                {"version": "v1", "resources": [resource(&at(1), &strings)], "freshness": "Current"}]},
        ],
    });
    let local_apis = serde_json::json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {},
        "items": [{"metadata": {"name": "apps"}, "versions": [{"version": "v1", "resources": [
            {"resource": "deployments", "responseKind": {"group": "", "version": "", "kind": "Deployment"},
             "scope": "Namespaced", "singularResource": "deployment", "verbs": ["get"]}]}]}],
    });
    let (Some(local_docs), Some(peer_docs)) = (documents(local_apis), documents(peer_apis)) else {
        return;
    };
    let local = Address::parse("127.0.0.1:6443").expect("address");
    let peer = Address::parse("10.0.0.12:6444").expect("address");
    let peers = [ApiserverView {
        id: "apiserver-b",
        address: &peer,
        documents: Some(&peer_docs),
    }];
    let wasm = FilterCode::new(
        DataPlane::Wasm,
        Path::new("/usr/lib/skewgate/skewgate_filter.wasm"),
    )
    .expect("a valid path");
    let Ok(planned) = plan(&PlanInputs {
        local: ApiserverView {
            id: "apiserver-a",
            address: &local,
            documents: Some(&local_docs),
        },
        peers: &peers,
        retained: &[],
        shared_storage: &BTreeSet::new(),
        local_freshness: skewgate_control::routing::LocalFreshness::Current,
        filter_code: &wasm,
        upstream_sds: Some(Path::new("/run/skewgate/sds")),
    }) else {
        return;
    };
    let record = planned
        .snapshot
        .acknowledged
        .as_deref()
        .expect("a planned snapshot carries its record")
        .clone();
    // What the control plane keeps must render.
    if let Err(e) = check_record(&record) {
        panic!("a record the control plane keeps does not render: {e}");
    }
    let admin = LocalChannel::Unix("/run/skewgate/envoy-admin.sock".into());
    let xds = LocalChannel::Unix("/run/skewgate/xds.sock".into());
    let listen = Address::parse_listen("10.0.0.11:6443").expect("listen");
    let rendered = Bootstrap {
        listen: &listen,
        admin: &admin,
        config_source: ConfigSource::Ads { xds: &xds },
        node_id: "cp-1",
        request_timeout: Duration::from_secs(60),
        serving: None,
        sds_dir: None,
        peer: None,
        fallback: Some(FallbackInputs {
            wait: Duration::from_secs(30),
            filter_code: &wasm,
            local: &local,
            upstream_sds: Some(Path::new("/run/skewgate/sds")),
            local_apiserver: "cp-1",
            acknowledged: Some(&record),
        }),
        goaway: None,
    }
    .render("fuzz")
    .expect("the bootstrap renders from a kept record");

    // YAML, and read back as Envoy's message (the renderer checked that it writes the same
    // text again).
    let b: EnvoyBootstrap =
        skewgate_control::envoy::yaml::from_yaml(&rendered).expect("reads back");
    assert_eq!(b.node.as_ref().map(|n| n.id.as_str()), Some("cp-1"));
    let resources = b.static_resources.as_ref().expect("static resources");
    assert_eq!(resources.listeners.len(), 1);
    assert_eq!(resources.listeners[0].name, LISTENER_NAME);
    // Three variants each of the local apiserver, every peer set the configuration needs (its
    // routes' and its failover sets'), and every failover aggregate; plus the control plane.
    let failover = &record.filter_config.failover_clusters;
    let peer_sets: BTreeSet<String> = record
        .filter_config
        .peer_clusters
        .keys()
        .cloned()
        .chain(failover.values().map(|ids| peer_cluster_name(ids)))
        .collect();
    let expected_clusters = 3 * (1 + peer_sets.len() + failover.len()) + 1;
    assert_eq!(resources.clusters.len(), expected_clusters);
    let Some(NetworkConfigType::TypedConfig(any)) =
        &resources.listeners[0].filter_chains[0].filters[0].config_type
    else {
        panic!("the connection manager");
    };
    let hcm = HttpConnectionManager::decode(any.value.as_slice()).expect("decodes");
    let Some(http_filter::ConfigType::ConfigDiscovery(discovery)) = hcm
        .http_filters
        .iter()
        .find(|f| f.name == FILTER_NAME)
        .and_then(|f| f.config_type.as_ref())
    else {
        panic!("the filter over ECDS");
    };
    let wasm = Wasm::decode(
        discovery
            .default_config
            .as_ref()
            .expect("the fallback")
            .value
            .as_slice(),
    )
    .expect("decodes");
    let configuration = wasm
        .config
        .and_then(|c| c.configuration)
        .expect("a configuration");
    let json = StringValue::decode(configuration.value.as_slice())
        .expect("decodes")
        .value;
    assert_eq!(json, last_acknowledged_config(&record).to_json());
    FilterConfig::from_json(json.as_bytes()).expect("the filter accepts it");
});
