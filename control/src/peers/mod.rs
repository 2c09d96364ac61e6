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
//! - [`model`]: liveness (short grace, not kube's hour), restart detection (generations),
//!   which lease is local, and the deterministic [`PeerSet`] — pure, table-tested;
//! - [`metrics`]: counters (`skewgate_peer_address_rejected_total{reason}`, ...);
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
pub mod metrics;
pub mod model;
pub mod watcher;

pub use address::{
    parse_cidr, parse_socket_address, AddressPolicy, AddressSource, MappingEntry, RejectReason,
    PEER_ADVERTISE_ADDRESS_ANNOTATION,
};
pub use metrics::PeerMetrics;
pub use model::{
    is_live, Evaluation, ExcludedPeer, Exclusion, LeaseInfo, LocalLease, LocalSelector, Notice,
    Peer, PeerConfig, PeerSet, Tracker, DEFAULT_GRACE, HOSTNAME_LABEL, IDENTITY_LABEL,
    IDENTITY_LABEL_VALUE, LEASE_NAMESPACE,
};
pub use watcher::{client_from_kubeconfig, label_selector, lease_info, PeerWatcher};
