//! The real discovery fixtures (tests/fixtures/discovery), for the unit tests.

pub const K130: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/discovery/k8s-1.30"
);
pub const K133: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/discovery/k8s-1.33"
);
