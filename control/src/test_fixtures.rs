//! The real discovery fixtures (tests/fixtures/discovery), for the unit tests.

pub const K130: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/discovery/k8s-1.30"
);
pub const K133: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/discovery/k8s-1.33"
);

/// A fixture folder by name (`k8s-1.30`, `k8s-1.33`).
pub fn dir(name: &str) -> String {
    format!(
        "{}/../tests/fixtures/discovery/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// A fixture's discovery documents.
pub fn documents(name: &str) -> crate::discovery::documents::DiscoveryDocuments {
    crate::discovery::documents::DiscoveryDocuments::from_dir(dir(name)).expect("fixture loads")
}

/// A small world for the Envoy-resource tests: local `a` serving apps/v1 deployments, peers `b`
/// and `c` at fixed addresses.
pub mod world {
    use std::collections::BTreeSet;

    use crate::discovery::ServedApis;
    use crate::envoy::Address;
    use crate::routing::{self, LocalFreshness, Peer, RoutingPlan};
    use crate::xds::{Snapshot, SnapshotInputs};

    pub fn served(entries: &[(&str, &str, &str)]) -> ServedApis {
        let mut s = ServedApis::new();
        for (g, v, k) in entries {
            s.add_resource(g, v, k).expect("valid");
        }
        s
    }

    pub fn addr(s: &str) -> Address {
        Address::parse(s).expect("address")
    }

    pub struct World {
        pub local: Address,
        pub peers: Vec<(String, Address)>,
    }

    impl World {
        pub fn new() -> Self {
            World {
                local: addr("127.0.0.1:6443"),
                peers: vec![
                    ("b".to_string(), addr("10.0.0.2:6444")),
                    ("c".to_string(), addr("10.0.0.3:6444")),
                ],
            }
        }
        pub fn snapshot(&self, plan: &RoutingPlan) -> Snapshot {
            Snapshot::from_plan(
                plan,
                &SnapshotInputs {
                    filter_code: &crate::test_fixtures::wasm_code("/opt/skewgate.wasm"),
                    local: &self.local,
                    peers: &self.peers,
                    upstream_sds: None,
                },
            )
            .expect("snapshot")
        }
    }

    pub fn plan(b: &[(&str, &str, &str)], c: &[(&str, &str, &str)]) -> RoutingPlan {
        routing::RoutingPlan::of_table(routing::build(
            &served(&[("apps", "v1", "deployments")]),
            "a",
            &[
                Peer {
                    id: "b".into(),
                    served: served(b),
                },
                Peer {
                    id: "c".into(),
                    served: served(c),
                },
            ],
            routing::RetainedRoutes::NONE,
            &BTreeSet::new(),
            LocalFreshness::Current,
        ))
    }
}

/// A realistic moment of a rolling upgrade, with every part of the filter configuration a
/// release renders: the local apiserver on 1.30, a live peer on 1.33 (its OpenAPI v3 root
/// listing group-versions only it serves), a live peer whose discovery is not known yet
/// (pending), a departed apiserver that served resource.k8s.io/v1 (a 1.34 rolled back) within
/// the retention, a CRD in shared storage, and merged discovery.
///
/// The previous release's filter configuration for this world is kept as
/// `filter/core/tests/fixtures/previous-release/filter-config.json` (its PROVENANCE.md says
/// how it was made).
pub mod rolling_upgrade {
    use std::collections::BTreeSet;

    use skewgate_core::group_version::GroupVersion;

    use crate::discovery::documents::DiscoveryDocuments;
    use crate::discovery::openapi::OpenApiRoot;
    use crate::discovery::APIGroupDiscovery;
    use crate::envoy::Address;
    use crate::plan::{plan, ApiserverView, Plan, PlanInputs, RetainedView};

    /// The CRD every apiserver serves from etcd.
    pub const CRD_GROUP_VERSION: (&str, &str) = ("stable.example.com", "v1");

    fn group(json: serde_json::Value) -> APIGroupDiscovery {
        serde_json::from_value(json).expect("an APIGroupDiscovery")
    }

    fn with_crd(mut docs: DiscoveryDocuments) -> DiscoveryDocuments {
        let (g, v) = CRD_GROUP_VERSION;
        docs.apis.items.push(group(serde_json::json!({
            "metadata": {"name": g},
            "versions": [{"version": v, "freshness": "Current", "resources": [{
                "resource": "crontabs", "responseKind": {"group": g, "version": v, "kind": "CronTab"},
                "scope": "Namespaced", "singularResource": "crontab", "shortNames": ["ct"],
                "verbs": ["delete", "deletecollection", "get", "list", "patch", "create", "update", "watch"],
                "subresources": [{"subresource": "status",
                    "responseKind": {"group": g, "version": v, "kind": "CronTab"},
                    "verbs": ["get", "patch", "update"]}]}]}]
        })));
        docs
    }

    /// The OpenAPI v3 root of the 1.33 peer: kube's entries with its 128-digit hashes, for a
    /// group-version the local apiserver serves too (its own entry stands) and two it does not.
    fn peer_root() -> OpenApiRoot {
        let hash = |c: char| c.to_string().repeat(128);
        OpenApiRoot {
            paths: [
                ("api/v1", hash('1')),
                ("apis/coordination.k8s.io/v1beta1", hash('2')),
                ("apis/resource.k8s.io/v1beta2", hash('3')),
            ]
            .into_iter()
            .map(|(path, hash)| (path.to_string(), format!("/openapi/v3/{path}?hash={hash}")))
            .collect(),
        }
    }

    /// 1.33 and resource.k8s.io/v1 (GA in 1.34).
    fn rolled_back() -> DiscoveryDocuments {
        let mut docs = super::documents("k8s-1.33");
        let kind =
            |k: &str| serde_json::json!({"group": "resource.k8s.io", "version": "v1", "kind": k});
        let v1 = serde_json::json!({"version": "v1", "freshness": "Current", "resources": [
            {"resource": "resourceclaims", "responseKind": kind("ResourceClaim"), "scope": "Namespaced",
             "singularResource": "resourceclaim", "verbs": ["create", "delete", "get", "list", "watch"],
             "subresources": [{"subresource": "status", "responseKind": kind("ResourceClaim"),
                               "verbs": ["get", "patch", "update"]}]},
            {"resource": "deviceclasses", "responseKind": kind("DeviceClass"), "scope": "Cluster",
             "singularResource": "deviceclass", "verbs": ["create", "delete", "get", "list", "watch"]}]});
        let resource = docs
            .apis
            .items
            .iter_mut()
            .find(|g| g.metadata.name == "resource.k8s.io")
            .expect("1.33 serves resource.k8s.io");
        let mut versions = vec![serde_json::from_value(v1).expect("a version")];
        versions.append(&mut resource.versions);
        resource.versions = versions;
        docs
    }

    /// The plan of this world.
    pub fn plan_it() -> Plan {
        let local_docs = with_crd(super::documents("k8s-1.30"));
        let mut peer_docs = with_crd(super::documents("k8s-1.33"));
        peer_docs.openapi = Some(peer_root());
        let departed = rolled_back();
        let (local, b, c) = (
            Address::parse("127.0.0.1:6443").expect("address"),
            Address::parse("10.0.0.12:6444").expect("address"),
            Address::parse("10.0.0.13:6444").expect("address"),
        );
        let peers = [
            ApiserverView {
                id: "apiserver-b",
                address: &b,
                documents: Some(&peer_docs),
            },
            ApiserverView {
                id: "apiserver-c",
                address: &c,
                documents: None,
            },
        ];
        let retained = [RetainedView {
            address: None,
            id: "apiserver-d",
            documents: &departed,
        }];
        let (g, v) = CRD_GROUP_VERSION;
        plan(&PlanInputs {
            local: ApiserverView {
                id: "apiserver-a",
                address: &local,
                documents: Some(&local_docs),
            },
            peers: &peers,
            retained: &retained,
            shared_storage: &BTreeSet::from([GroupVersion::new(g, v)]),
            local_freshness: crate::routing::LocalFreshness::Current,
            filter_code: &crate::test_fixtures::wasm_code("/opt/skewgate/skewgate_filter.wasm"),
            upstream_sds: None,
        })
        .expect("plans")
    }
}

/// The proxy-wasm filter at `path` (a valid path), as the control plane names it.
pub fn wasm_code(path: &str) -> crate::envoy::resources::FilterCode {
    crate::envoy::resources::FilterCode::new(
        crate::envoy::resources::DataPlane::Wasm,
        std::path::Path::new(path),
    )
    .expect("a valid path")
}

/// [`wasm_code`] of `/opt/skewgate.wasm`, for inputs that outlive a statement.
pub static OPT_WASM: std::sync::LazyLock<crate::envoy::resources::FilterCode> =
    std::sync::LazyLock::new(|| wasm_code("/opt/skewgate.wasm"));
