//! Fetching every apiserver's own discovery, robustly.
//!
//! Per apiserver (the local one and each live peer), `GET /apis` and `GET /api` with
//! [`DISCOVERY_ACCEPT`] (`profile=nopeer` first: the server's own document, not a merged one).
//! The answer's `Content-Type` decides: aggregated v2 / v2beta1 is parsed as is; plain JSON is
//! legacy discovery, completed with one request per group-version and converted into aggregated
//! form. The result is a [`DiscoveryDocuments`](crate::discovery::documents::DiscoveryDocuments).
//!
//! Robustness: every request has a timeout and a body size limit (the body is streamed and
//! dropped at the limit); failures are typed ([`FetchError`], [`ErrorType`]) and counted
//! ([`DiscoveryMetrics`]); [`spawn_apiserver_watch`] refreshes periodically with `If-None-Match`,
//! backs off with jitter on failure, refetches unconditionally when the Lease's holder identity
//! changes ([`RefetchTrigger`]) and never replaces the last good view with a failed one.
//!
//! - [`content_type`], [`backoff`], [`legacy`], [`body`]'s buffer: pure, table-tested;
//! - [`client`]: one kube client per apiserver from the kubeconfig's credentials, the peer CA and
//!   SNI `kubernetes.default.svc`;
//! - [`fetcher`]: the HTTP part; [`supervisor`]: the refresh loop; [`metrics`].
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use std::sync::Arc;
//! use skewgate_control::fetch::*;
//! let template = ClientTemplate::from_kubeconfig(None)
//!     .await?
//!     .with_peer_ca_file("/etc/kubernetes/pki/ca.crt".as_ref())?;
//! let metrics = Arc::new(DiscoveryMetrics::new());
//! let fetcher = DiscoveryFetcher::new(
//!     "apiserver-abc",
//!     "https://10.0.0.2:6443",
//!     &template,
//!     FetchConfig::default(),
//! )?;
//! let mut watch = spawn_apiserver_watch(fetcher, RefreshConfig::default(), metrics.clone());
//! watch.tried().await;
//! // From the Lease watcher, on every snapshot:
//! watch.trigger.observe_holder_identity("apiserver-abc_0c5a...");
//! while watch.documents.changed().await.is_ok() {
//!     let docs = watch.documents.borrow_and_update().clone();
//!     println!("{} groups", docs.map(|d| d.apis.items.len()).unwrap_or(0));
//! }
//! # Ok(()) }
//! ```

pub mod backoff;
pub mod body;
pub mod client;
pub mod content_type;
pub mod error;
pub mod fetcher;
pub mod metrics;
pub mod supervisor;

pub use backoff::Backoff;
pub use client::{https_url, ClientTemplate};
pub use content_type::{classify_content_type, DocumentFormat, DISCOVERY_ACCEPT};
pub use error::{ErrorType, FetchError, GarbageReason, SetupError};
pub use fetcher::{Answer, DiscoveryFetcher, Document, Etags, FetchConfig, Fetched};
pub use metrics::{ApiserverSyncStatus, DiscoveryMetrics, SyncOutcome};
pub use supervisor::{
    fetch_all_once, spawn_apiserver_watch, ApiserverWatch, RefetchTrigger, RefreshConfig, SyncState,
};
