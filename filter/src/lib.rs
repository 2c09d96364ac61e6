//! skewgate's proxy-wasm filter: a thin shell that binds the pure core (`skewgate-core`) to Envoy.
//!
//! - `root`: receives the configuration, validates and compiles it, refuses a bad one whole;
//! - `request`: per request, strips what a client may not send, routes, maps Envoy's replies;
//! - `metrics`: the counters;
//! - `host`: the few host calls we make, each returning a `Result` instead of panicking
//!   (the SDK's convenience methods unwrap, and its `String` getters panic on non-UTF-8 values).
//!
//! The data plane never panics: `unwrap`, `expect`, `panic` and slice indexing are denied.

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
