//! The one pipeline from what the apiservers serve to what Envoy holds:
//!
//! ```text
//! discovery views ─► served APIs ─► routing table ─┬─► filter configuration ─► Envoy resources
//!                 └─► merged discovery ────────────┘      (validated)             (Snapshot)
//! ```
//!
//! [`plan`] is used by every mode: the live control plane (`skewgate-control run`, after each
//! change), the static renderer (`skewgate-control render-static`) and the integration tests'
//! Envoy harness, so what the tests exercise is what production runs. Pure: no I/O, no clock.

use std::collections::BTreeSet;
use std::path::Path;

use serde::Serialize;
use skewgate_core::group_version::GroupVersion;

use crate::discovery::documents::DiscoveryDocuments;
use crate::discovery::payload;
use crate::discovery::ServedApis;
use crate::envoy::{Address, EnvoyError, UpstreamTls};
use crate::routing::{self, Peer, RoutingPlan};
use crate::xds::{Snapshot, SnapshotInputs};

/// One apiserver as composition sees it.
#[derive(Debug, Clone, Copy)]
pub struct ApiserverView<'a> {
    /// Lease name (the local apiserver: its lease name when known).
    pub id: &'a str,
    pub address: &'a Address,
    /// The last good discovery, if any.
    pub documents: Option<&'a DiscoveryDocuments>,
}

#[derive(Debug, Clone, Copy)]
pub struct PlanInputs<'a> {
    pub local: ApiserverView<'a>,
    /// The live peers.
    pub peers: &'a [ApiserverView<'a>],
    pub shared_storage: &'a BTreeSet<GroupVersion>,
    pub wasm_path: &'a Path,
    pub upstream_tls: Option<&'a UpstreamTls>,
}

/// Whether merged discovery made it into the filter configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MergedOutcome {
    Included {
        bytes: usize,
    },
    /// Left out (too large, or a bug): discovery is then each apiserver's own.
    Skipped {
        reason: String,
    },
}

/// A live peer that is not routed to, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unrouted {
    pub id: String,
    pub reason: String,
}

/// Everything decided for one view of the cluster.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The routing table and the filter configuration (with merged discovery, when included).
    pub routing: RoutingPlan,
    /// The Envoy resources carrying it: served over ADS, or written to files.
    pub snapshot: Snapshot,
    /// Peers in the plan (serving something), sorted.
    pub routed: Vec<String>,
    pub unrouted: Vec<Unrouted>,
    pub merged: MergedOutcome,
    /// What each apiserver with a view serves: the local one first, then peers by id.
    pub served: Vec<(String, ServedApis)>,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("the local apiserver's discovery is not known yet")]
    NoLocalDiscovery,
    #[error("the local apiserver's discovery is unusable: {0}")]
    LocalDiscovery(String),
    #[error("the filter configuration does not validate (a bug): {0}")]
    Invalid(String),
    #[error(transparent)]
    Envoy(#[from] EnvoyError),
}

/// Routing plan, merged discovery and xDS snapshot for one view of the cluster. Peers without a
/// good view (never fetched) are left out and reported; so are peers claiming the local id.
pub fn plan(inputs: &PlanInputs<'_>) -> Result<Plan, PlanError> {
    let local_docs = inputs.local.documents.ok_or(PlanError::NoLocalDiscovery)?;
    let local_served = local_docs
        .served()
        .map_err(|e| PlanError::LocalDiscovery(e.to_string()))?;
    let mut unrouted = Vec::new();
    let mut routing_peers = Vec::new();
    let mut addresses = Vec::new();
    let mut servers: Vec<(String, &DiscoveryDocuments)> =
        vec![(inputs.local.id.to_string(), local_docs)];
    let mut served = vec![(inputs.local.id.to_string(), local_served.clone())];
    for peer in inputs.peers {
        if peer.id == inputs.local.id {
            unrouted.push(Unrouted {
                id: peer.id.to_string(),
                reason: "it has the local apiserver's id".to_string(),
            });
            continue;
        }
        let Some(docs) = peer.documents else {
            unrouted.push(Unrouted {
                id: peer.id.to_string(),
                reason: "its discovery has never been fetched successfully".to_string(),
            });
            continue;
        };
        match docs.served() {
            Ok(s) => {
                routing_peers.push(Peer {
                    id: peer.id.to_string(),
                    served: s.clone(),
                });
                addresses.push((peer.id.to_string(), peer.address.clone()));
                servers.push((peer.id.to_string(), docs));
                served.push((peer.id.to_string(), s));
            }
            Err(e) => unrouted.push(Unrouted {
                id: peer.id.to_string(),
                reason: format!("its discovery is unusable: {e}"),
            }),
        }
    }
    let mut routing = routing::build(
        &local_served,
        inputs.local.id,
        &routing_peers,
        inputs.shared_storage,
    );
    let merged = match payload::discovery_config(inputs.local.id, &servers) {
        Ok(discovery) => {
            let bytes = discovery.apis.get().len()
                + discovery.api.get().len()
                + discovery
                    .legacy
                    .values()
                    .map(|d| d.get().len())
                    .sum::<usize>();
            routing.config.discovery = Some(discovery);
            MergedOutcome::Included { bytes }
        }
        Err(e) => MergedOutcome::Skipped {
            reason: e.to_string(),
        },
    };
    let mut routed: BTreeSet<String> = BTreeSet::new();
    for c in &routing.clusters {
        routed.extend(c.peer_ids.iter().cloned());
    }
    routing
        .config
        .validate()
        .map_err(|e| PlanError::Invalid(e.to_string()))?;
    let snapshot = Snapshot::from_plan(
        &routing,
        &SnapshotInputs {
            wasm_path: inputs.wasm_path,
            local: inputs.local.address,
            peers: &addresses,
            upstream_tls: inputs.upstream_tls,
        },
    )?;
    Ok(Plan {
        routing,
        snapshot,
        routed: routed.into_iter().collect(),
        unrouted,
        merged,
        served,
    })
}
