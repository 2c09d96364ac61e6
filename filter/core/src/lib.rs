//! skewgate's pure decision core.
//!
//! Everything the filter decides per request lives here as plain functions over plain data:
//! parsing the request like kube-apiserver does, choosing where it goes, which headers a client
//! may not send, and the `metav1.Status` bodies we answer with. Nothing here knows about Envoy or
//! proxy-wasm, so it is tested natively and, compiled to wasm, under wasm-bindgen-test.
#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod client_cert;
pub mod config;
pub mod discovery;
pub mod group_version;
pub mod gzip;
pub mod hygiene;
pub mod identity;
pub mod local_reply;
pub mod log_limit;
pub mod metrics;
pub mod negotiation;
pub mod openapi;
pub mod pipeline;
pub mod plan;
pub mod request_info;
pub mod routing;
pub mod shared_discovery;
pub mod status;
