//! skewgate's control plane as a library: what each apiserver serves, where each request must
//! go, and the Envoy configuration that carries those decisions to the data plane.

pub mod app;
pub mod bootstrap;
pub mod discovery;
pub mod documents;
pub mod fetch;
pub mod health;
pub mod merge;
pub mod merged;
pub mod peers;
pub mod routing;
pub mod shared_storage;
pub mod xds;

#[cfg(test)]
mod test_fixtures;
