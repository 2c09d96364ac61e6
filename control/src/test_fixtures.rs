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
    use std::path::Path;

    use crate::discovery::ServedApis;
    use crate::envoy::Address;
    use crate::routing::{self, Peer, RoutingPlan};
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
                    wasm_path: Path::new("/opt/skewgate.wasm"),
                    local: &self.local,
                    peers: &self.peers,
                    upstream_sds: None,
                },
            )
            .expect("snapshot")
        }
    }

    pub fn plan(b: &[(&str, &str, &str)], c: &[(&str, &str, &str)]) -> RoutingPlan {
        routing::build(
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
            &Default::default(),
            &BTreeSet::new(),
        )
    }
}
