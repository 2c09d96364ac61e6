//! skewgate's control plane as a library: what each apiserver serves, where each request must
//! go, and the Envoy configuration that carries those decisions to the data plane.

pub mod cli;
pub mod discovery;
pub mod envoy;
pub mod fetch;
pub mod flags;
pub mod health;
pub mod local_channels;
pub mod metrics;
pub mod peers;
pub mod plan;
pub mod retained;
pub mod routing;
pub mod run;
pub mod shared_storage;
pub mod skew_page;
pub mod state_file;
pub mod static_config;
pub mod xds;

#[cfg(test)]
mod test_fixtures;
