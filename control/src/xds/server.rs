//! The ADS gRPC server: a thin tonic shell around [`DeltaStream`].
//!
//! Each delta stream runs one task that owns its [`DeltaStream`] and waits on two things: the
//! client's next request and the next snapshot. After either it sends every response that is
//! due. While the snapshot `watch` holds `None` (no complete sync yet) nothing is ever due, so
//! Envoy keeps waiting: its listener stays closed (ECDS warming) and, on a reconnect, it keeps
//! serving with what it holds.
//!
//! State-of-the-World ADS is refused with `UNIMPLEMENTED`: the bootstrap asks for
//! `DELTA_GRPC`, and SotW would need a second copy of the make-before-break ordering.
//!
//! Each stream serves its Envoy's view of the snapshot ([`Snapshot::for_filter`]): the filter
//! configuration in the dialect that Envoy's filter reads, learnt from the node of the
//! stream's first request ([`crate::envoy::dialect::negotiate`]); withheld, and said so once in the
//! log, in the metrics, on `/readyz` and `/debug/skew`, when it cannot be written in it.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use super::delta::{DeltaStream, Received};
use super::metrics::XdsMetrics;
use super::snapshot::{FilterDelivery, Snapshot};
use super::{XdsError, CLUSTER_TYPE_URL, EXTENSION_CONFIG_TYPE_URL};
use crate::envoy::dialect::{self, Advertised, Negotiated};
use crate::envoy::fallback::{write_acknowledged, AcknowledgedConfig};

/// The snapshots the server serves: `None` until the first complete sync.
pub type Snapshots = watch::Receiver<Option<Arc<Snapshot>>>;

/// Largest request accepted from Envoy (NACK messages can quote a whole configuration).
const MAX_REQUEST_BYTES: usize = 16 * 1024 * 1024;

/// The `AggregatedDiscoveryService` implementation.
#[derive(Debug)]
pub struct Ads {
    snapshots: Snapshots,
    metrics: Arc<XdsMetrics>,
    /// Turns true when the server shuts down: every stream ends with UNAVAILABLE.
    closing: watch::Receiver<bool>,
    next_stream: AtomicU64,
    /// `run --state-dir`: where a snapshot Envoy acknowledged completely is kept for its
    /// bootstrap's fallback ([`crate::envoy::fallback::write_acknowledged`]).
    acknowledged_dir: Option<PathBuf>,
    /// How long a removed cluster stays at least ([`ServeOptions::cluster_linger`]).
    cluster_linger: Duration,
}

impl Ads {
    pub fn new(
        snapshots: Snapshots,
        metrics: Arc<XdsMetrics>,
        closing: watch::Receiver<bool>,
        options: ServeOptions,
    ) -> Self {
        Ads {
            snapshots,
            metrics,
            closing,
            next_stream: AtomicU64::new(1),
            acknowledged_dir: options.acknowledged_dir,
            cluster_linger: options.cluster_linger,
        }
    }
}

/// How [`serve`] serves every stream.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// `run --state-dir`: where a snapshot Envoy acknowledged completely is kept for its
    /// bootstrap's fallback ([`crate::envoy::fallback::write_acknowledged`]).
    pub acknowledged_dir: Option<PathBuf>,
    /// How long a cluster stays after Envoy holds a filter configuration that no longer names
    /// it ([`DeltaStream::with_cluster_linger`]), for an Envoy whose route timeout is at most
    /// [`LINGER_COVERS`]; a stream whose Envoy advertises a longer one lingers as much longer
    /// ([`cluster_linger`]).
    pub cluster_linger: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            acknowledged_dir: None,
            cluster_linger: CLUSTER_LINGER,
        }
    }
}

/// How long a removed cluster stays when Envoy's requests take at most
/// [`LINGER_COVERS`]: a request routed to it by the previous filter configuration retries
/// there as long as its first attempt has not failed, and Envoy bounds that attempt by the
/// route's timeout. A cluster removed sooner turns such a retry into `no_healthy_upstream`.
/// A node whose route timeout is longer gets a longer linger ([`cluster_linger`]).
pub const CLUSTER_LINGER: Duration = Duration::from_secs(90);

/// The route timeout [`CLUSTER_LINGER`] covers, with 20 s to spare: the one the bootstrap
/// renders for kube-apiserver's default `--request-timeout`, 60 s.
pub const LINGER_COVERS: Duration = crate::envoy::route_timeout::of(Duration::from_secs(60));

/// How long a stream's removed clusters linger: `base` for a node whose route timeout is at
/// most [`LINGER_COVERS`] (or who does not say, a bootstrap of a release before it did), as
/// much longer as the route timeout it advertises is longer
/// ([`crate::envoy::route_timeout::advertised`], at most a day).
pub fn cluster_linger(base: Duration, advertised_route_timeout: Option<Duration>) -> Duration {
    let longer = advertised_route_timeout.map_or(Duration::ZERO, |timeout| {
        timeout.saturating_sub(LINGER_COVERS)
    });
    base.saturating_add(longer)
}

/// Sleeps until `at`, or for ever without one (the caller's `select!` guards it).
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = BoxStream<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = BoxStream<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        _request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented(
            "skewgate serves delta ADS only: set ads_config.api_type to DELTA_GRPC",
        ))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let peer = request
            .remote_addr()
            .map_or_else(|| "unknown".to_string(), |a| a.to_string());
        let (tx, rx) = mpsc::channel(8);
        let task = StreamTask {
            id,
            inbound: request.into_inner(),
            outbound: tx,
            snapshots: self.snapshots.clone(),
            closing: self.closing.clone(),
            metrics: self.metrics.clone(),
            state: DeltaStream::new(format!("{id}-")).with_cluster_linger(self.cluster_linger),
            acknowledged_dir: self.acknowledged_dir.clone(),
            kept: None,
            negotiated: None,
            view: None,
        };
        tracing::info!(stream = id, %peer, "delta ADS stream opened");
        self.metrics.stream_opened();
        tokio::spawn(task.run());
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

struct StreamTask {
    id: u64,
    inbound: Streaming<DeltaDiscoveryRequest>,
    outbound: mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>,
    snapshots: Snapshots,
    closing: watch::Receiver<bool>,
    metrics: Arc<XdsMetrics>,
    state: DeltaStream,
    acknowledged_dir: Option<PathBuf>,
    /// The fallback record last kept by this stream (written again only when it changes).
    kept: Option<Arc<AcknowledgedConfig>>,
    /// What this stream's filter reads, from the node of its first request.
    negotiated: Option<Negotiated>,
    /// The last snapshot and this stream's view of it ([`Snapshot::for_filter`]), so that a
    /// snapshot is rendered for this filter once.
    view: Option<(Arc<Snapshot>, Arc<Snapshot>, FilterDelivery)>,
}

impl StreamTask {
    async fn run(mut self) {
        let why = self.serve().await;
        tracing::info!(stream = self.id, "delta ADS stream closed: {why}");
        self.metrics.stream_closed(self.id);
    }

    /// This stream's view of `snapshot`: what its filter reads. `None` without a snapshot, and
    /// before the first request says what the filter reads (nothing is subscribed then).
    fn view(&mut self, snapshot: Option<Arc<Snapshot>>) -> Option<Arc<Snapshot>> {
        let snapshot = snapshot?;
        let negotiated = self.negotiated.as_ref()?;
        if let Some((source, view, _)) = &self.view {
            if Arc::ptr_eq(source, &snapshot) {
                return Some(view.clone());
            }
        }
        let (view, delivery) = snapshot.for_filter(&negotiated.dialect);
        let before = self.view.as_ref().map(|(_, _, d)| d);
        if before != Some(&delivery) {
            match &delivery {
                FilterDelivery::Withheld(why) => tracing::warn!(
                    stream = self.id,
                    "this Envoy's filter cannot read the filter configuration; it is not sent \
                     (Envoy keeps serving with what it holds, or its bootstrap's fallback) \
                     until a configuration it can read: {why}"
                ),
                FilterDelivery::Without(features) => tracing::info!(
                    stream = self.id,
                    ?features,
                    "this Envoy's filter does not read some optional features: its filter \
                     configuration goes without them"
                ),
                FilterDelivery::AsRendered if before.is_some() => tracing::info!(
                    stream = self.id,
                    "this Envoy's filter reads the filter configuration as rendered again"
                ),
                FilterDelivery::AsRendered => {}
            }
            self.metrics.delivery(self.id, &delivery);
        }
        self.view = Some((snapshot, view.clone(), delivery));
        Some(view)
    }

    async fn serve(&mut self) -> String {
        let mut snapshots_live = true;
        loop {
            if *self.closing.borrow() {
                let _ = self
                    .outbound
                    .send(Err(Status::unavailable(
                        "the control plane is shutting down",
                    )))
                    .await;
                return "server shutting down".into();
            }
            // Everything due for the latest snapshot. Reading it marks it seen, so `changed`
            // below wakes only for a newer one.
            let latest = self.snapshots.borrow_and_update().clone();
            let snapshot = self.view(latest);
            while let Some(response) = self
                .state
                .next_response(Instant::now(), snapshot.as_deref())
            {
                tracing::debug!(
                    stream = self.id,
                    type_url = %response.type_url,
                    nonce = %response.nonce,
                    resources = response.resources.len(),
                    removed = response.removed_resources.len(),
                    version = %response.system_version_info,
                    "sending"
                );
                self.metrics.sent(&response.type_url);
                if self.outbound.send(Ok(response)).await.is_err() {
                    return "client went away".into();
                }
            }
            self.report_lingering();
            // A lingering cluster's removal falls due without any event.
            let removal = self.state.next_removal(snapshot.as_deref());
            tokio::select! {
                () = sleep_until(removal), if removal.is_some() => {}
                message = self.inbound.message() => match message {
                    Ok(Some(request)) => self.received(&request),
                    Ok(None) => return "client closed the stream".into(),
                    Err(status) => return format!("stream error: {status}"),
                },
                changed = self.snapshots.changed(), if snapshots_live => {
                    if changed.is_err() {
                        // The publisher is gone: keep serving the last snapshot.
                        snapshots_live = false;
                    }
                }
                closing = self.closing.changed() => {
                    if closing.is_err() {
                        // The server itself was dropped without a shutdown.
                        let _ = self
                            .outbound
                            .send(Err(Status::unavailable("the control plane stopped")))
                            .await;
                        return "server dropped".into();
                    }
                }
                _ = self.outbound.closed() => return "client went away".into(),
            }
        }
    }

    fn received(&mut self, request: &DeltaDiscoveryRequest) {
        if self.negotiated.is_none() {
            // Envoy sends its node on the first request only
            // (`set_node_on_first_message_only`).
            let negotiated = dialect::negotiate(request.node.as_ref());
            if let Some(chance) = crate::envoy::goaway::configured(request.node.as_ref()) {
                self.metrics.goaway_chance_configured(chance);
            }
            let node = request.node.as_ref().map_or("", |n| n.id.as_str());
            let schemas = &negotiated.dialect.schemas;
            let features = &negotiated.dialect.features;
            match &negotiated.advertised {
                Advertised::Yes => {
                    tracing::info!(
                        stream = self.id,
                        node,
                        ?schemas,
                        ?features,
                        "the filter's dialect"
                    )
                }
                Advertised::Nothing => tracing::info!(
                    stream = self.id,
                    node,
                    ?schemas,
                    "the filter advertises no dialect: a release before dialects were \
                     advertised"
                ),
                Advertised::Malformed(why) => tracing::warn!(
                    stream = self.id,
                    node,
                    ?schemas,
                    "the node's skewgate metadata is malformed ({why}): read as a filter that \
                     advertises nothing"
                ),
            }
            self.metrics.negotiated(self.id, node, &negotiated);
            self.negotiated = Some(negotiated);
            let route_timeout = crate::envoy::route_timeout::advertised(request.node.as_ref());
            let linger = cluster_linger(self.state.cluster_linger(), route_timeout);
            self.state.set_cluster_linger(linger);
            tracing::info!(
                stream = self.id,
                node,
                ?route_timeout,
                ?linger,
                "clusters this stream removes linger for the node's longest short request"
            );
        }
        let received = self.state.on_request(request);
        let type_url = request.type_url.as_str();
        match received {
            Received::Ack => {
                self.metrics.acked(type_url);
                tracing::debug!(stream = self.id, type_url, nonce = %request.response_nonce, "ACK");
                self.keep_if_acknowledged();
            }
            Received::Nack { message, refused } => {
                tracing::warn!(
                    stream = self.id,
                    type_url,
                    nonce = %request.response_nonce,
                    refused = ?refused,
                    "Envoy refused the configuration (NACK); it keeps its last good one, and \
                     the refused versions are not sent again: {message}"
                );
                self.metrics.nacked(type_url, &message);
            }
            Received::Stale { nonce } => {
                tracing::debug!(stream = self.id, type_url, %nonce, "stale nonce ignored");
            }
            Received::Subscription => {
                tracing::debug!(
                    stream = self.id,
                    type_url,
                    subscribe = ?request.resource_names_subscribe,
                    unsubscribe = ?request.resource_names_unsubscribe,
                    initial_versions = request.initial_resource_versions.len(),
                    "subscription"
                );
            }
        }
    }
}

impl StreamTask {
    /// Tells the metrics how many removed clusters this stream keeps, and warns when some had
    /// to go before their linger was over.
    fn report_lingering(&self) {
        let early = self.metrics.clusters_kept(
            self.id,
            self.state.cluster_linger(),
            self.state.lingering_clusters(),
            self.state.clusters_removed_early(),
        );
        if early > 0 {
            tracing::warn!(
                stream = self.id,
                removed_early = early,
                "more clusters lingered than a stream keeps: the longest-lingering were removed \
                 before their linger was over (a retry of a request routed to one of them \
                 before finds no cluster and is answered 503)"
            );
        }
    }

    /// Once Envoy holds every resource of the current snapshot (both types ACKed at the
    /// snapshot's versions), keep its fallback record: what the bootstrap serves if this Envoy
    /// restarts while the control plane is missing. A failure to write is logged; the previous
    /// record (or local-only) stays.
    fn keep_if_acknowledged(&mut self) {
        if self.acknowledged_dir.is_none() {
            return;
        }
        let latest = self.snapshots.borrow().clone();
        let Some(snapshot) = self.view(latest) else {
            return;
        };
        let Some(dir) = &self.acknowledged_dir else {
            return;
        };
        // The view's record: the configuration as this Envoy's filter holds it, which the
        // bootstrap of the same image reads back.
        let Some(record) = &snapshot.acknowledged else {
            return;
        };
        if self
            .kept
            .as_ref()
            .is_some_and(|k| Arc::ptr_eq(k, record) || **k == **record)
        {
            return;
        }
        let holds_all = [CLUSTER_TYPE_URL, EXTENSION_CONFIG_TYPE_URL]
            .iter()
            .all(|t| {
                let (Some(held), Some(want)) = (self.state.held(t), snapshot.resources(t)) else {
                    return false;
                };
                want.iter()
                    .all(|(name, v)| held.get(name) == Some(&v.version))
            });
        if !holds_all {
            return;
        }
        match write_acknowledged(dir, record) {
            Ok(()) => {
                tracing::info!(stream = self.id, version = %snapshot.version(), dir = %dir.display(), "kept the acknowledged configuration for Envoy's fallback");
                self.kept = Some(record.clone());
            }
            Err(e) => {
                tracing::warn!(stream = self.id, dir = %dir.display(), error = %e, "could not keep the acknowledged configuration for Envoy's fallback")
            }
        }
    }
}

/// Where the xDS server accepts: a Unix socket (the default,
/// [`crate::local_channels::bind_unix`]) or loopback TCP.
#[derive(Debug)]
pub enum Listener {
    Unix(tokio::net::UnixListener),
    Tcp(tokio::net::TcpListener),
}

impl From<tokio::net::UnixListener> for Listener {
    fn from(listener: tokio::net::UnixListener) -> Self {
        Listener::Unix(listener)
    }
}

impl From<tokio::net::TcpListener> for Listener {
    fn from(listener: tokio::net::TcpListener) -> Self {
        Listener::Tcp(listener)
    }
}

impl Listener {
    fn describe(&self) -> String {
        let address = match self {
            Listener::Unix(l) => l
                .local_addr()
                .ok()
                .and_then(|a| a.as_pathname().map(|p| format!("unix:{}", p.display()))),
            Listener::Tcp(l) => l.local_addr().ok().map(|a| a.to_string()),
        };
        address.unwrap_or_else(|| "unknown".to_string())
    }
}

/// Serve ADS on `listener` until `shutdown` completes: then every open stream ends with
/// UNAVAILABLE (Envoy keeps its configuration and reconnects), and this returns once the
/// connections are closed.
pub async fn serve(
    listener: impl Into<Listener>,
    snapshots: Snapshots,
    metrics: Arc<XdsMetrics>,
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), XdsError> {
    let listener = listener.into();
    let (close_tx, close_rx) = watch::channel(false);
    let ads = Ads::new(snapshots, metrics, close_rx, options);
    let service =
        AggregatedDiscoveryServiceServer::new(ads).max_decoding_message_size(MAX_REQUEST_BYTES);
    let local = listener.describe();
    tracing::info!(address = %local, "xDS server listening");
    let router = tonic::transport::Server::builder()
        // Finds an Envoy that vanished without closing its connection.
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .add_service(service);
    let signal = async move {
        shutdown.await;
        tracing::info!(address = %local, "xDS server shutting down");
        let _ = close_tx.send(true);
    };
    match listener {
        Listener::Unix(listener) => {
            let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
            router
                .serve_with_incoming_shutdown(incoming, signal)
                .await?
        }
        Listener::Tcp(listener) => {
            let incoming = tonic::transport::server::TcpIncoming::from(listener);
            router
                .serve_with_incoming_shutdown(incoming, signal)
                .await?
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The linger covers the node's route timeout: the base up to kube's default, longer by
    /// as much as the node's is longer, never shorter, and never an overflow.
    #[test]
    fn the_linger_grows_with_the_route_timeout_the_node_advertises() {
        let s = Duration::from_secs;
        for (base, advertised, linger) in [
            (CLUSTER_LINGER, None, CLUSTER_LINGER),
            (CLUSTER_LINGER, Some(s(0)), CLUSTER_LINGER),
            (CLUSTER_LINGER, Some(LINGER_COVERS), CLUSTER_LINGER),
            // --request-timeout=300s: a route timeout of 310 s, 20 s to spare as by default.
            (CLUSTER_LINGER, Some(s(310)), s(330)),
            (s(3), Some(s(75)), s(8)),
            (Duration::MAX, Some(s(310)), Duration::MAX),
            (
                CLUSTER_LINGER,
                Some(crate::envoy::route_timeout::MAX_ROUTE_TIMEOUT),
                s(24 * 3600 + 20),
            ),
        ] {
            assert_eq!(
                cluster_linger(base, advertised),
                linger,
                "{base:?} {advertised:?}"
            );
        }
    }
}
