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
