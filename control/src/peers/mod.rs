//! Peers: which other apiservers of the control plane are alive, and where to reach them.
//!
//! kube-apiserver publishes its identity as a `coordination.k8s.io/v1` Lease in `kube-system`,
//! named `apiserver-<hash of hostname>`, labelled `apiserver.kubernetes.io/identity=kube-apiserver`
//! and `kubernetes.io/hostname=<hostname>`, renewed every 10 s, with a new `holderIdentity`
//! (`<id>_<uuid>`) on every start. Apiservers with the peer proxy feature annotate it with
//! `kubernetes.io/peer-advertise-address: <ip:port>`.
//!
//! - [`address`]: the address policy (operator mapping, then the annotation inside the
//!   operator's CIDRs) — pure;
//! - [`model`]: liveness judged by when we saw each lease renewed (our monotonic clock, not the
//!   peers' `renewTime`; short grace, not kube's hour), restart detection (generations), which
//!   lease is local, and the deterministic [`PeerSet`] — pure, table-tested;
//! - [`lease`]: the Lease read leniently, so one malformed Lease is ignored, not the watch;
//! - [`lease_name`]: the name kube-apiserver gives its own Lease;
//! - [`metrics`]: counters (`skewgate_peer_address_rejected_total{reason}`,
//!   `skewgate_peer_leases_malformed_total{field}`, ...);
//! - [`watcher`]: the kube-runtime watcher feeding the model, publishing on a
//!   `tokio::sync::watch` channel.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use std::sync::Arc;
//! use skewgate_control::peers::{self, PeerConfig, PeerWatcher};
//! let client = peers::client_from_kubeconfig(None).await?;
//! let config = PeerConfig {
//!     policy: peers::AddressPolicy::new(vec![peers::parse_cidr("10.0.0.0/24").unwrap()], []),
//!     local: peers::LocalSelector::Hostname("cp-1".into()),
//!     ..Default::default()
//! };
//! let mut w = PeerWatcher::spawn(client, config, Arc::default());
//! while w.updates.changed().await.is_ok() {
//!     let set = w.updates.borrow_and_update().clone();
//!     for p in &set.peers {
//!         println!("{} at {} (generation {})", p.id, p.address, p.generation);
//!     }
//! }
//! # Ok(()) }
//! ```

pub mod address;
pub mod lease;
pub mod lease_name;
pub mod metrics;
pub mod model;
pub mod watcher;

pub use address::{
    parse_cidr, parse_socket_address, AddressPolicy, AddressSource, MappingEntry, RejectReason,
    PEER_ADVERTISE_ADDRESS_ANNOTATION,
};
pub use lease::{parse_micro_time, IdentityLease};
pub use lease_name::identity_lease_name;
pub use metrics::PeerMetrics;
pub use model::{
    is_live, plausible_at_first_sight, Evaluation, ExcludedPeer, Exclusion, FirstSeen, LeaseField,
    LeaseInfo, LocalLease, LocalSelector, MalformedLease, Moment, Notice, Peer, PeerConfig,
    PeerSet, Tracker, DEFAULT_GRACE, DEFAULT_MAX_PEERS, HOSTNAME_LABEL, IDENTITY_LABEL,
    IDENTITY_LABEL_VALUE, LEASE_NAMESPACE,
};
pub use watcher::{client_from_kubeconfig, label_selector, lease_info, PeerWatcher};
