//! skewgate's proxy-wasm filter: a thin shell that binds the pure core (`skewgate-core`) to Envoy.
//!
//! - `root`: receives the configuration, validates and compiles it, refuses a bad one whole;
//! - `request`: Envoy's HTTP callbacks, handed to the core's request pipeline
//!   (`skewgate_core::pipeline::Request`), which applies what `skewgate_core::plan` decides;
//! - `metrics`: the fallback gauge (the counters are the pipeline's);
//! - `host`: the core's `Host` trait by the few host calls we make, each returning a `Result`
//!   instead of panicking (the SDK's convenience methods unwrap, and its `String` getters panic
//!   on non-UTF-8 values).
//!
//! The data plane never panics: `unwrap`, `expect`, `panic` and slice indexing are denied.
#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

mod host;
mod metrics;
mod request;
mod root;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
    proxy_wasm::set_root_context(|_context_id| -> Box<dyn proxy_wasm::traits::RootContext> {
        Box::new(root::Root::default())
    });
}}
