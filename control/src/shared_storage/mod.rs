//! Shared storage: the group-versions every apiserver serves from the same storage, which are
//! never routed to a peer (docs/ARCHITECTURE.md "Request path", step 6).
//!
//! Two kube-runtime watchers, on `apiextensions.k8s.io/v1` CustomResourceDefinitions and on
//! `apiregistration.k8s.io/v1` APIServices, feed a [`Tracker`]; [`SharedStorageWatcher`]
//! publishes [`SharedStorage`] snapshots on a `tokio::sync::watch` channel. The set goes to
//! `routing::build` as its `shared_storage` argument.
//!
//! - [`model`]: which group-versions a CRD or an APIService contributes, and the tracker — pure;
//! - [`watcher`]: the kube glue.

pub mod model;
pub mod watcher;

pub use model::{
    apiservice_group_version, crd_group_versions, GroupVersion, Kind, SharedStorage, Tracker,
};
pub use watcher::{SharedStorageMetrics, SharedStorageWatcher};
