//! The xDS half of the live control plane: Envoy resources computed from a
//! [`RoutingPlan`](crate::routing::RoutingPlan), and the ADS gRPC server that serves them.
//!
//! - [`snapshot`]: the Envoy resources of a routing plan ([`crate::envoy::resources`]) gathered
//!   once in a [`Snapshot`] whose resource versions are content hashes.
//! - [`dialect`]: what the filter behind a stream reads (schema versions, optional features),
//!   advertised in Envoy's node metadata by the bootstrap and read back by the server, which
//!   renders each stream's filter configuration for it ([`Snapshot::for_filter`]).
//! - [`files`]: the same snapshot written as files Envoy reads itself (the static mode).
//! - [`delta`]: the per-stream bookkeeping of delta xDS as a pure state machine: what the client
//!   holds, what is in flight, what it refused, and which response is due next.
//! - [`server`]: the tonic shell: `AggregatedDiscoveryService` driven by a `watch` of
//!   snapshots, and [`serve`] on a Unix socket or loopback TCP.
//! - [`metrics`]: the counters the server keeps (`skewgate_xds_nacks_total{type_url}`, ...).
//!
//! Nothing here decides routing: the plan is computed elsewhere; this module only carries it to
//! Envoy, in an order that never lets Envoy route to a cluster it does not have (clusters are
//! added before the filter configuration that names them, and removed only after a filter
//! configuration that no longer names them was accepted, and at least [`CLUSTER_LINGER`] later
//! (longer for an Envoy whose requests may take longer, [`server::cluster_linger`]), while a
//! request routed there before may still retry).

pub mod delta;
pub mod files;
pub mod metrics;
pub mod server;
pub mod snapshot;

pub use metrics::XdsMetrics;
pub use server::{serve, Listener, ServeOptions, CLUSTER_LINGER};
pub use snapshot::{FilterDelivery, Snapshot, SnapshotInputs, Versioned};

/// Type URL of CDS resources.
pub const CLUSTER_TYPE_URL: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// Type URL of ECDS resources (the filter configuration).
pub const EXTENSION_CONFIG_TYPE_URL: &str =
    "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig";
/// Why the xDS server could not run.
#[derive(Debug, thiserror::Error)]
pub enum XdsError {
    #[error("the xDS server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
}
