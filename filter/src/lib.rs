//! skewgate's proxy-wasm filter: a thin shell that binds the pure core (`skewgate-core`) to Envoy.
//!
//! - `root`: receives the configuration, validates and compiles it, refuses a bad one whole;
//! - `request`: per request, applies the plan `skewgate_core::plan` decides: strips what a
//!   client may not send, routes, answers discovery, maps Envoy's replies;
//! - `metrics`: the counters;
//! - `host`: the [`host::Host`] trait the request goes through, and its implementation by the
//!   few host calls we make, each returning a `Result` instead of panicking (the SDK's
//!   convenience methods unwrap, and its `String` getters panic on non-UTF-8 values). The
//!   request's tests use a recording fake instead.
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
