//! The xDS half of the live control plane: Envoy resources computed from a
//! [`RoutingPlan`](crate::routing::RoutingPlan), and the ADS gRPC server that serves them.
//!
//! - [`resources`]: pure functions from a routing plan and apiserver addresses to Envoy
//!   resources (`skewgate-local` and one cluster per peer set, each in three `UpstreamAuth`
//!   variants with their upstream TLS; the filter configuration as an ECDS
//!   `TypedExtensionConfig`), gathered in a [`Snapshot`] whose resource versions are content
//!   hashes.
//! - [`delta`]: the per-stream bookkeeping of delta xDS as a pure state machine: what the client
//!   holds, what is in flight, what it refused, and which response is due next.
//! - [`server`]: the tonic shell: `AggregatedDiscoveryService` driven by a `watch` of
//!   snapshots, and [`serve`].
//! - [`metrics`]: the counters the server keeps (`skewgate_xds_nacks_total{type_url}`, ...).
//! - [`bootstrap`]: renders `envoy/dynamic-bootstrap.yaml`, the Envoy bootstrap of the live
//!   mode (`skewgate-control bootstrap`).
//!
//! Nothing here decides routing: the plan is computed elsewhere; this module only carries it to
//! Envoy, in an order that never lets Envoy route to a cluster it does not have (clusters are
//! added before the filter configuration that names them, and removed only after a filter
//! configuration that no longer names them was accepted).

pub mod bootstrap;
pub mod delta;
pub mod metrics;
pub mod resources;
pub mod server;

pub use metrics::XdsMetrics;
pub use resources::{Snapshot, SnapshotInputs, Versioned};
pub use server::serve;

/// Type URL of CDS resources.
pub const CLUSTER_TYPE_URL: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// Type URL of ECDS resources (the filter configuration).
pub const EXTENSION_CONFIG_TYPE_URL: &str =
    "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig";
/// Name of the HTTP filter in the bootstrap, and so of its ECDS resource.
pub const FILTER_NAME: &str = "skewgate";

/// Why an xDS snapshot or bootstrap could not be built, or the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum XdsError {
    #[error("peer {0:?} is in the routing plan but has no address")]
    UnknownPeer(String),
    #[error("{0} contains characters that cannot appear in the Envoy configuration")]
    Unsafe(&'static str),
    #[error("the xDS server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
}
