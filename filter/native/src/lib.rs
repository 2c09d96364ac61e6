//! skewgate's native filter: the pure core (`skewgate-core`) as an Envoy 1.40 dynamic module
//! (`libskewgate_native.so`, `--data-plane native`), beside the proxy-wasm filter.
//!
//! - `ffi`: Envoy's dynamic-module ABI, its host side: the callbacks looked up in the host and
//!   safe handles over them;
//! - `hooks`: the module's side, the event hooks Envoy calls (with `ffi`, the only modules
//!   with `unsafe`);
//! - `filter`: the configuration (compiled once per Envoy, shared by every worker) and one
//!   stream's filter, the core's request pipeline with Envoy's callbacks as its host.
//!
//! The data plane never panics: `unwrap`, `expect`, `panic` and slice indexing are denied, and
//! every hook catches an unwind before it could reach Envoy.
#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

#[allow(unsafe_code)]
pub mod ffi;
pub mod filter;
#[allow(unsafe_code)]
pub mod hooks;
