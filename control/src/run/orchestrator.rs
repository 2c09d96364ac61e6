//! The tokio glue of `skewgate-control run`: identity leases → one discovery watch per
//! apiserver → (coalesced) routing plan, merged discovery and xDS snapshot → the xDS server.
//!
//! Every decision is a function of [`super::state`]; this loop only keeps the watches running,
//! gathers their latest views, and publishes what [`compose`] returns:
//!
//! - a [`PeerSet`] change reconciles the per-peer [`ApiserverWatch`]es ([`reconcile`]: start for
//!   a new peer, recreate on an address change, drop and forget the metrics of one that left)
//!   and reports every lease's holder identity to its watch, so a restart refetches at once;
//! - the first change (peers, shared storage, a watch's documents or attempts) after a quiet
//!   spell is recomputed at once; changes that follow a recomputation within its
//!   [`Coalescer`] window wait for the window's end and become one recomputation, so a burst
//!   becomes a few pushes and a single lease change reaches Envoy without a fixed delay;
//! - nothing is published before [`first_sync_gate`] allows it; after that every recomputation
//!   whose snapshot differs (content-hash versions) is published.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use skewgate_core::group_version::GroupVersion;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tracing::{debug, error, info, warn};

use crate::discovery::documents::DiscoveryDocuments;
use crate::envoy::Address;
use crate::fetch::{
    spawn_apiserver_watch, ApiserverWatch, Backoff, ClientTemplate, DiscoveryFetcher,
    DiscoveryMetrics, FetchConfig, RefreshConfig,
};
use crate::peers::PeerSet;
use crate::routing::LocalFreshness;
use crate::shared_storage::SharedStorage;
use crate::xds::Snapshot;

use super::config::RunConfig;
use super::retention::{Changes, Retention};
use super::state::{first_sync_gate, peer_urls, reconcile, Gate, Progress, SyncView};
use super::state_dir::StateDir;
use super::status::RetainedStatus;
use super::status::{ApiserverStatus, AppMetrics, ExcludedLease, Status, View};
use crate::plan::{
    plan, ApiserverView, MergedOutcome, Plan, PlanError, PlanInputs, RetainedView, Unrouted,
};

/// The shortest time between two recomputations: changes that arrive sooner after one (a
/// peer's lease and then its discovery, several peers restarting) wait and are recomputed
/// together. Pushes cannot outrun Envoy whatever this is: the delta ADS stream sends the next
/// update of a type only after Envoy acknowledged the previous one (`xds::delta`).
pub const COALESCE: Duration = Duration::from_millis(40);

/// How long a recomputation waits for a peer that just joined to answer its first discovery
/// fetch. A fetch on a healthy network answers well within this, and the peer is then routed
/// in one push instead of two (first "discovery pending", 503 for what only it may serve, then
/// routed: each ECDS update costs Envoy tens of milliseconds). A peer that does not answer in
/// time is published as pending, as before.
pub const FIRST_FETCH_WAIT: Duration = Duration::from_millis(50);

/// When the next recomputation may run: at once after a quiet spell, otherwise once the
/// window after the last one has passed. The window is [`COALESCE`] or as long as the last
/// recomputation took, whichever is longer, so with a large cluster (a merge of megabytes of
/// discovery) recomputing never takes more than half of the orchestrator's time.
#[derive(Debug, Default)]
struct Coalescer {
    /// When the last recomputation ended, and how long it took.
    last: Option<(tokio::time::Instant, Duration)>,
}

impl Coalescer {
    /// When a change seen at `now` should be recomputed; `hold`: not before then either (a
    /// peer's first fetch, see [`FIRST_FETCH_WAIT`]).
    fn due(
        &self,
        now: tokio::time::Instant,
        hold: Option<tokio::time::Instant>,
    ) -> tokio::time::Instant {
        let window = match self.last {
            Some((ended, took)) => now.max(ended + COALESCE.max(took)),
            None => now,
        };
        window.max(hold.unwrap_or(now))
    }

    fn recomputed(&mut self, started: tokio::time::Instant, ended: tokio::time::Instant) {
        self.last = Some((ended, ended.saturating_duration_since(started)));
    }
}

/// How often the local apiserver's discovery is revalidated (a conditional request on loopback,
/// answered 304 while nothing changed), and the longest wait between attempts while it fails.
/// A restart of the local apiserver on another version is seen within about this long, instead
/// of when its identity Lease shows a new holder (which goes through that same apiserver).
pub const LOCAL_REFRESH: Duration = Duration::from_secs(1);

/// A running discovery watch and the task that wakes the orchestrator when it changes.
struct Running {
    url: String,
    watch: ApiserverWatch,
    forwarder: JoinHandle<()>,
    started: tokio::time::Instant,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.forwarder.abort();
    }
}

impl Running {
    fn start(
        id: &str,
        url: &str,
        template: &ClientTemplate,
        fetch: &FetchConfig,
        refresh: RefreshConfig,
        metrics: &Arc<DiscoveryMetrics>,
        wake: &Arc<Notify>,
    ) -> Result<Self, crate::fetch::SetupError> {
        let fetcher = DiscoveryFetcher::new(id, url, template, fetch.clone())?;
        let watch = spawn_apiserver_watch(fetcher, refresh, metrics.clone());
        let (mut docs, mut state) = (watch.documents.clone(), watch.state.clone());
        let wake = wake.clone();
        let forwarder = tokio::spawn(async move {
            loop {
                let alive = tokio::select! {
                    r = docs.changed() => r.is_ok(),
                    r = state.changed() => r.is_ok(),
                };
                if !alive {
                    return;
                }
                wake.notify_one();
            }
        });
        Ok(Running {
            url: url.to_string(),
            watch,
            forwarder,
            started: tokio::time::Instant::now(),
        })
    }

    fn progress(&self) -> Progress {
        Progress {
            attempts: self.watch.state.borrow().attempts,
            has_documents: self.watch.documents.borrow().is_some(),
        }
    }
}

/// What the last composition was computed from: the same inputs give the same snapshot, so
/// they are not composed again. Documents are compared by identity (a watch publishes a new
/// `Arc` only when its documents change); holding them keeps the comparison sound.
#[derive(Default)]
struct Fingerprint {
    local_id: String,
    local: Option<Arc<DiscoveryDocuments>>,
    peers: Vec<(
        String,
        std::net::SocketAddr,
        Option<Arc<DiscoveryDocuments>>,
    )>,
    shared: BTreeSet<GroupVersion>,
    /// Retained apiservers and when each left.
    retained: Vec<(String, SystemTime)>,
    /// Whether the local apiserver's last discovery fetch failed.
    local_freshness: LocalFreshness,
}

fn same_docs(a: &Option<Arc<DiscoveryDocuments>>, b: &Option<Arc<DiscoveryDocuments>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

impl PartialEq for Fingerprint {
    fn eq(&self, other: &Self) -> bool {
        self.local_id == other.local_id
            && same_docs(&self.local, &other.local)
            && self.shared == other.shared
            && self.retained == other.retained
            && self.local_freshness == other.local_freshness
            && self.peers.len() == other.peers.len()
            && self
                .peers
                .iter()
                .zip(&other.peers)
                .all(|(a, b)| a.0 == b.0 && a.1 == b.1 && same_docs(&a.2, &b.2))
    }
}

/// What the state directory gave back at start: the retention, and with it the seniority of
/// the peers it knew (for the peer watcher, before its first list).
pub struct RestoredState {
    pub retention: Retention,
    pub state_dir: Option<StateDir>,
}

/// Open `--state-dir` (refused when another user owns it: see [`crate::state_file`]) and read
/// what it kept, bounded by `--max-peers`; without it, an empty retention.
pub fn restore_state(config: &RunConfig) -> anyhow::Result<RestoredState> {
    let max_peers = config.peers.max_peers;
    let Some(dir) = &config.state_dir else {
        return Ok(RestoredState {
            retention: Retention::new(config.api_retention, max_peers),
            state_dir: None,
        });
    };
    let state = StateDir::open(dir)?;
    let loaded = state.load(max_peers);
    for p in &loaded.problems {
        warn!(problem = %p, "ignoring an unreadable file in the state directory");
    }
    if !loaded.dropped.is_empty() {
        warn!(
            dropped = ?loaded.dropped,
            kept = loaded.entries.len(),
            "the state directory held more apiservers than --max-peers allows: kept the longest known"
        );
    }
    if !loaded.entries.is_empty() {
        info!(
            apiservers = loaded.entries.len(),
            "restored the last good discovery and seniority of peers from the state directory"
        );
    }
    Ok(RestoredState {
        retention: Retention::restore(config.api_retention, max_peers, loaded.entries),
        state_dir: Some(state),
    })
}

/// Everything the orchestrator shares with the rest of the process.
pub struct Shared {
    pub discovery_metrics: Arc<DiscoveryMetrics>,
    pub app_metrics: Arc<AppMetrics>,
    pub status: Arc<Status>,
}

pub struct Orchestrator {
    config: Arc<RunConfig>,
    template: ClientTemplate,
    fetch: FetchConfig,
    refresh: RefreshConfig,
    retention: Retention,
    state_dir: Option<StateDir>,
    shared: Shared,
    publisher: watch::Sender<Option<Arc<Snapshot>>>,
    wake: Arc<Notify>,
    local: Running,
    peers: BTreeMap<String, Running>,
    started: Instant,
    published_version: Option<String>,
    fingerprint: Option<Fingerprint>,
    /// Peers in the last composition.
    routed: Vec<String>,
    reported_unrouted: Vec<Unrouted>,
    reported_waiting: Vec<String>,
    merged_skipped: Option<String>,
}

impl Orchestrator {
    /// The outcomes of the local apiserver's discovery fetches ([`super::local_down`]).
    pub fn local_state(&self) -> watch::Receiver<crate::fetch::SyncState> {
        self.local.watch.state.clone()
    }

    /// Start the local apiserver's discovery watch at once.
    pub fn new(
        config: Arc<RunConfig>,
        template: ClientTemplate,
        shared: Shared,
        publisher: watch::Sender<Option<Arc<Snapshot>>>,
        restored: RestoredState,
    ) -> anyhow::Result<Self> {
        let fetch = FetchConfig {
            timeout: config.discovery_timeout,
            ..FetchConfig::default()
        };
        let refresh = RefreshConfig {
            interval: config.discovery_refresh_interval,
            backoff: Backoff {
                initial: Duration::from_millis(500),
                max: config
                    .discovery_refresh_interval
                    .min(Duration::from_secs(30)),
            },
            holder_refetch_interval: config.holder_refetch_interval,
        };
        let local_refresh = RefreshConfig {
            interval: LOCAL_REFRESH.min(config.discovery_refresh_interval),
            backoff: Backoff {
                initial: Duration::from_millis(250),
                max: LOCAL_REFRESH,
            },
            holder_refetch_interval: config.holder_refetch_interval,
        };
        let RestoredState {
            retention,
            state_dir,
        } = restored;
        let wake = Arc::new(Notify::new());
        let local = Running::start(
            "local",
            &config.local.url,
            &template,
            &fetch,
            local_refresh,
            &shared.discovery_metrics,
            &wake,
        )?;
        info!(url = %config.local.url, "fetching the local apiserver's discovery");
        Ok(Orchestrator {
            config,
            template,
            fetch,
            refresh,
            retention,
            state_dir,
            shared,
            publisher,
            wake,
            local,
            peers: BTreeMap::new(),
            started: Instant::now(),
            published_version: None,
            fingerprint: None,
            routed: Vec::new(),
            reported_unrouted: Vec::new(),
            reported_waiting: Vec::new(),
            merged_skipped: None,
        })
    }

    /// Run until `shutdown` turns true (or its sender goes away).
    pub async fn run(
        mut self,
        mut peers_rx: watch::Receiver<PeerSet>,
        mut shared_rx: watch::Receiver<SharedStorage>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let deadline =
            tokio::time::Instant::from_std(self.started + self.config.initial_sync_timeout);
        let mut deadline_passed = false;
        let mut peers_live = true;
        let mut shared_live = true;
        let mut due = Some(tokio::time::Instant::now());
        let mut coalescer = Coalescer::default();
        let wake = self.wake.clone();
        let set = peers_rx.borrow_and_update().clone();
        self.on_peers(&set);
        loop {
            if *shutdown.borrow() {
                break;
            }
            let waiting_for_deadline = self.published_version.is_none() && !deadline_passed;
            let next_expiry = self.retention.next_expiry(SystemTime::now());
            let debounce = async {
                match due {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            let mut changed = false;
            tokio::select! {
                r = shutdown.changed() => {
                    if r.is_err() {
                        break;
                    }
                }
                r = peers_rx.changed(), if peers_live => {
                    if r.is_ok() {
                        let set = peers_rx.borrow_and_update().clone();
                        self.on_peers(&set);
                    } else {
                        warn!("the identity lease watcher stopped; peers stay as last seen");
                        peers_live = false;
                    }
                    changed = true;
                }
                r = shared_rx.changed(), if shared_live => {
                    if r.is_err() {
                        warn!("the shared-storage watcher stopped; its last view stays");
                        shared_live = false;
                    }
                    changed = true;
                }
                _ = wake.notified() => changed = true,
                _ = tokio::time::sleep(next_expiry.unwrap_or_default()), if next_expiry.is_some() => {
                    // Expired here, not only by the next recomputation: before the first-sync
                    // gate opens (a local apiserver still starting) that does not come, and an
                    // entry past its window would wake this loop at once, again and again.
                    self.settle_retention(SystemTime::now(), Changes::default());
                    changed = true;
                }
                _ = tokio::time::sleep_until(deadline), if waiting_for_deadline => {
                    deadline_passed = true;
                    changed = true;
                }
                _ = debounce => {
                    due = None;
                    let started = tokio::time::Instant::now();
                    let set = peers_rx.borrow().clone();
                    let storage = shared_rx.borrow().clone();
                    self.recompute(&set, &storage, deadline_passed);
                    coalescer.recomputed(started, tokio::time::Instant::now());
                }
            }
            if changed {
                // Recomputed on every change: a first fetch that completes ends its hold early.
                due = Some(coalescer.due(tokio::time::Instant::now(), self.first_fetch_hold()));
            }
        }
        info!("orchestrator stopped");
    }

    /// Until when a recomputation waits for peers that joined moments ago to answer their first
    /// discovery fetch ([`FIRST_FETCH_WAIT`]); `None` when no such fetch is in flight.
    fn first_fetch_hold(&self) -> Option<tokio::time::Instant> {
        let now = tokio::time::Instant::now();
        self.peers
            .values()
            .filter(|r| r.watch.state.borrow().attempts == 0)
            .map(|r| r.started + FIRST_FETCH_WAIT)
            .filter(|until| *until > now)
            .max()
    }

    fn start_peer(&mut self, id: &str, url: &str) {
        match Running::start(
            id,
            url,
            &self.template,
            &self.fetch,
            self.refresh,
            &self.shared.discovery_metrics,
            &self.wake,
        ) {
            Ok(r) => {
                self.peers.insert(id.to_string(), r);
            }
            Err(e) => {
                error!(peer = %id, %url, error = %e, "cannot fetch this peer's discovery; it is not routed to")
            }
        }
    }

    fn on_peers(&mut self, set: &PeerSet) {
        let desired = peer_urls(set, self.config.scheme);
        let running: BTreeMap<String, String> = self
            .peers
            .iter()
            .map(|(id, r)| (id.clone(), r.url.clone()))
            .collect();
        let changes = reconcile(&running, &desired);
        for id in &changes.stop {
            self.peers.remove(id);
            self.shared.discovery_metrics.forget(id);
            info!(peer = %id, "peer left: its discovery is no longer fetched");
        }
        for (id, url) in &changes.restart {
            self.peers.remove(id);
            info!(peer = %id, %url, "peer moved: fetching its discovery at the new address");
            self.start_peer(id, url);
        }
        for (id, url) in &changes.start {
            info!(peer = %id, %url, "peer joined: fetching its discovery");
            self.start_peer(id, url);
        }
        for p in &set.peers {
            if let Some(r) = self.peers.get(&p.id) {
                r.watch.trigger.observe_holder_identity(&p.holder_identity);
            }
        }
        if let Some(l) = &set.local {
            self.local
                .watch
                .trigger
                .observe_holder_identity(&l.holder_identity);
        }
    }

    fn local_id(&self, set: &PeerSet) -> String {
        set.local
            .as_ref()
            .map(|l| l.id.clone())
            .unwrap_or_else(|| self.config.local_fallback_id())
    }

    fn report_status(&self, set: &PeerSet, routed: Option<&[String]>) {
        let state = |r: &Running| r.watch.state.borrow().clone();
        let local_state = state(&self.local);
        let mut apiservers = vec![ApiserverStatus {
            id: self.local_id(set),
            hostname: set.local.as_ref().and_then(|l| l.hostname.clone()),
            local: true,
            url: self.local.url.clone(),
            holder_identity: set.local.as_ref().map(|l| l.holder_identity.clone()),
            generation: set.local.as_ref().map(|l| l.generation),
            routed: true,
            discovery_attempts: local_state.attempts,
            consecutive_failures: local_state.consecutive_failures,
            last_error: local_state.last_error,
        }];
        for p in &set.peers {
            let s = self.peers.get(&p.id).map(state).unwrap_or_default();
            apiservers.push(ApiserverStatus {
                id: p.id.clone(),
                hostname: p.hostname.clone(),
                local: false,
                url: self.config.scheme.url(p.address),
                holder_identity: Some(p.holder_identity.clone()),
                generation: Some(p.generation),
                routed: routed.is_some_and(|r| r.contains(&p.id)),
                discovery_attempts: s.attempts,
                consecutive_failures: s.consecutive_failures,
                last_error: s.last_error,
            });
        }
        let excluded = set
            .excluded
            .iter()
            .map(|e| ExcludedLease {
                id: e.id.clone(),
                reason: format!("{:?}", e.reason),
            })
            .collect();
        self.shared.status.apiservers(apiservers, excluded);
    }

    /// One recomputation: nothing before the first-sync gate opens; nothing new when the inputs
    /// are the ones of the last plan; otherwise plan, report, and publish if Envoy would see a
    /// difference.
    fn recompute(&mut self, set: &PeerSet, storage: &SharedStorage, deadline_passed: bool) {
        if self.published_version.is_none()
            && !self.first_sync_allows(set, storage, deadline_passed)
        {
            return;
        }
        self.update_retention(set);
        let fingerprint = self.fingerprint(set, storage);
        if self.fingerprint.as_ref() == Some(&fingerprint) {
            self.report_status(set, Some(&self.routed));
            return;
        }
        let was = self.fingerprint.as_ref().map(|f| f.local_freshness);
        if was.is_some_and(|was| was != fingerprint.local_freshness) {
            match fingerprint.local_freshness {
                LocalFreshness::Unconfirmed => info!(
                    "the local apiserver's discovery could not be read: what the peers serve too goes to them until it is read again"
                ),
                LocalFreshness::Current => {
                    info!("the local apiserver's discovery was read again: local first as before")
                }
            }
        }
        let local_id = fingerprint.local_id.clone();
        let planned = match self.plan(set, storage, &fingerprint) {
            Ok(p) => p,
            Err(e) => {
                error!(error = %e, "could not build a snapshot; Envoy keeps the last one");
                self.shared.app_metrics.compose_error();
                self.report_status(set, None);
                return;
            }
        };
        let merged_note = self.report_plan(set, &planned);
        let retained_status = self.retained_status(&planned);
        self.shared
            .app_metrics
            .fail_safe(retained_status.clone(), planned.pending.len());
        let version = self.publish(&planned, &local_id, &merged_note);
        self.fingerprint = Some(fingerprint);
        self.routed = planned.routed.clone();
        self.report_status(set, Some(&planned.routed));
        self.shared.status.published(View {
            snapshot_version: version,
            published_at: SystemTime::now(),
            served: planned.served,
            plan: planned.routing,
            shared_storage: storage.group_versions.clone(),
            unrouted: planned.unrouted,
            merged_discovery: merged_note,
            retained: retained_status,
            pending: planned.pending,
        });
    }

    fn retained_status(&self, planned: &Plan) -> Vec<RetainedStatus> {
        let unix = |t: SystemTime| {
            t.duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or_default()
        };
        let times: BTreeMap<&str, (SystemTime, SystemTime, Option<&Address>)> = self
            .retention
            .retained()
            .iter()
            .map(|r| (r.id, (r.left_at, r.expires_at, r.address)))
            .collect();
        planned
            .retained
            .iter()
            .filter_map(|(id, served)| {
                let (left, expires, address) = times.get(id.as_str())?;
                Some(RetainedStatus {
                    id: id.clone(),
                    left_unix_seconds: unix(*left),
                    expires_unix_seconds: unix(*expires),
                    sent_to: address.map(Address::to_string),
                    resources: served
                        .iter()
                        .flat_map(|(g, v, keys)| {
                            keys.iter()
                                .map(move |k| format!("{}, Resource={k}", GroupVersion::new(g, v)))
                        })
                        .collect(),
                })
            })
            .collect()
    }

    /// Before the first publication: may it happen now? Reports why not.
    fn first_sync_allows(
        &mut self,
        set: &PeerSet,
        storage: &SharedStorage,
        deadline_passed: bool,
    ) -> bool {
        let view = SyncView {
            peers_synced: set.synced,
            shared_storage_synced: storage.synced,
            local: self.local.progress(),
            peers: set
                .peers
                .iter()
                .map(|p| {
                    let progress = self
                        .peers
                        .get(&p.id)
                        .map(Running::progress)
                        .unwrap_or_default();
                    (p.id.clone(), progress)
                })
                .collect(),
            deadline_passed,
        };
        match first_sync_gate(&view) {
            Gate::Wait(reasons) => {
                if reasons != self.reported_waiting {
                    info!(
                        ?reasons,
                        "waiting for the first complete sync; nothing is published to Envoy yet"
                    );
                    self.reported_waiting = reasons.clone();
                }
                self.report_status(set, None);
                self.shared.status.waiting(reasons);
                false
            }
            Gate::Publish { incomplete } => {
                if !incomplete.is_empty() {
                    warn!(
                        ?incomplete,
                        timeout = ?self.config.initial_sync_timeout,
                        "the initial sync deadline passed: publishing what is known"
                    );
                }
                true
            }
        }
    }

    /// What a plan would be computed from now.
    fn fingerprint(&self, set: &PeerSet, storage: &SharedStorage) -> Fingerprint {
        Fingerprint {
            local_id: self.local_id(set),
            local: self.local.watch.current(),
            peers: set
                .peers
                .iter()
                .map(|p| {
                    (
                        p.id.clone(),
                        p.address,
                        self.peers.get(&p.id).and_then(|r| r.watch.current()),
                    )
                })
                .collect(),
            shared: storage.group_versions.clone(),
            retained: self
                .retention
                .retained()
                .iter()
                .map(|r| (r.id.to_string(), r.left_at))
                .collect(),
            local_freshness: if self.local.watch.state.borrow().consecutive_failures > 0 {
                LocalFreshness::Unconfirmed
            } else {
                LocalFreshness::Current
            },
        }
    }

    /// Peers with fresh discovery are the truth for themselves; peers that are no longer live
    /// keep their last good discovery for the retention window; expired ones go. Written to the
    /// state directory when it changed.
    fn update_retention(&mut self, set: &PeerSet) {
        let now = SystemTime::now();
        let mut changes = Changes::default();
        for p in &set.peers {
            if let Some(docs) = self.peers.get(&p.id).and_then(|r| r.watch.current()) {
                self.retention
                    .seen(&p.id, &docs, p.first_seen, &mut changes);
            }
            self.retention.reached_at(&p.id, Address::from(p.address));
        }
        // Before the first lease list nobody is known to be live, not even to have left.
        if set.synced {
            let live: BTreeSet<&str> = set.peers.iter().map(|p| p.id.as_str()).collect();
            self.retention.left_unless(&live, now, &mut changes);
        }
        self.settle_retention(now, changes);
    }

    /// Ends the retentions whose window passed by `now` and bounds the rest, on top of
    /// `changes`; logs what ended and writes every change to the state directory.
    fn settle_retention(&mut self, now: SystemTime, mut changes: Changes) {
        self.retention.expire(now, &mut changes);
        self.retention.bound(&mut changes);
        for id in &changes.remove {
            if changes.evicted.contains(id) {
                self.shared.app_metrics.retention_evicted();
                warn!(
                    peer = %id,
                    max_peers = self.config.peers.max_peers,
                    "API retention full (--max-peers departed apiservers): dropped the discovery of the one first seen most recently"
                );
            } else {
                info!(peer = %id, "API retention ended: what only this apiserver served is gone");
            }
        }
        if changes.is_empty() {
            return;
        }
        if let Some(state) = &self.state_dir {
            if let Err(e) = state.apply(&self.retention, &changes) {
                error!(error = %e, "could not write the state directory; the retention is kept in memory only");
            }
        }
    }

    fn plan(
        &self,
        set: &PeerSet,
        storage: &SharedStorage,
        fingerprint: &Fingerprint,
    ) -> Result<Plan, PlanError> {
        let addresses: Vec<Address> = set.peers.iter().map(|p| Address::from(p.address)).collect();
        let views: Vec<ApiserverView<'_>> = fingerprint
            .peers
            .iter()
            .zip(&addresses)
            .map(|((id, _, docs), address)| ApiserverView {
                id,
                address,
                documents: docs.as_deref(),
            })
            .collect();
        let retained: Vec<RetainedView<'_>> = self
            .retention
            .retained()
            .into_iter()
            .map(|r| RetainedView {
                id: r.id,
                documents: r.documents,
                address: r.address,
            })
            .collect();
        plan(&PlanInputs {
            local: ApiserverView {
                id: &fingerprint.local_id,
                address: &self.config.local.address,
                documents: fingerprint.local.as_deref(),
            },
            peers: &views,
            retained: &retained,
            shared_storage: &storage.group_versions,
            local_freshness: fingerprint.local_freshness,
            filter_code: &self.config.filter_code,
            // With TLS, `--sds-dir` holds the SDS files written at start (`cli::run_async`).
            upstream_sds: self.config.sds_dir.as_deref(),
        })
    }

    /// Logs (once per change) what the plan left out, and updates the metrics. Returns the
    /// merged-discovery note for the status page.
    fn report_plan(&mut self, set: &PeerSet, planned: &Plan) -> String {
        // Unrouted peers are reported once they were tried (a peer that just joined has not
        // answered yet).
        let tried_unrouted: Vec<Unrouted> = planned
            .unrouted
            .iter()
            .filter(|u| {
                self.peers
                    .get(&u.id)
                    .is_none_or(|r| r.watch.state.borrow().attempts > 0)
            })
            .cloned()
            .collect();
        for u in &tried_unrouted {
            if !self.reported_unrouted.contains(u) {
                warn!(peer = %u.id, reason = %u.reason, "live peer is not routed to");
            }
        }
        self.reported_unrouted = tried_unrouted;
        self.shared.app_metrics.peers(
            planned.routed.len(),
            set.peers.len().saturating_sub(planned.routed.len()),
        );
        match &planned.merged {
            MergedOutcome::Included { bytes } => {
                if self.merged_skipped.take().is_some() {
                    info!(
                        bytes,
                        "merged discovery is back in the filter configuration"
                    );
                }
                self.shared.app_metrics.merged(Some(*bytes));
                format!("included ({bytes} bytes)")
            }
            MergedOutcome::Skipped { reason } => {
                if self.merged_skipped.as_ref() != Some(reason) {
                    warn!(%reason, "merged discovery left out of the filter configuration; discovery is each apiserver's own");
                    self.merged_skipped = Some(reason.clone());
                }
                self.shared.app_metrics.merged(None);
                format!("skipped: {reason}")
            }
        }
    }

    /// Hands the snapshot to the xDS server when its version is new. Returns the version.
    fn publish(&mut self, planned: &Plan, local_id: &str, merged_note: &str) -> String {
        let version = planned.snapshot.version();
        if self.published_version.as_deref() == Some(version.as_str()) {
            debug!(version = %version, "recomputed: nothing changed for Envoy");
            return version;
        }
        let first = self.published_version.is_none();
        info!(
            version = %version,
            local = %local_id,
            routed_peers = ?planned.routed,
            clusters = planned.snapshot.clusters.len(),
            filter_config_bytes = planned.routing.config.to_json().len(),
            merged_discovery = %merged_note,
            "publishing a new snapshot to Envoy"
        );
        self.publisher
            .send_replace(Some(Arc::new(planned.snapshot.clone())));
        self.shared.app_metrics.published();
        if first {
            let after = self.started.elapsed();
            info!(after = ?after, "first complete sync published: Envoy may open its listener");
            self.shared
                .app_metrics
                .set_ready(u64::try_from(after.as_millis()).unwrap_or(u64::MAX));
        }
        self.published_version = Some(version.clone());
        version
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_change_is_recomputed_at_once_and_followers_wait_for_the_window() {
        let t0 = tokio::time::Instant::now();
        let ms = Duration::from_millis;
        let mut c = Coalescer::default();
        assert_eq!(c.due(t0, None), t0, "nothing recomputed yet: at once");

        // A quick recomputation: the window is COALESCE.
        c.recomputed(t0, t0 + ms(2));
        let cases = [
            (ms(3), ms(2) + COALESCE, "right after: the window's end"),
            (ms(30), ms(2) + COALESCE, "inside the window: its end"),
            (ms(2) + COALESCE, ms(2) + COALESCE, "at its end: now"),
            (ms(500), ms(500), "after a quiet spell: at once"),
        ];
        for (seen, due, why) in cases {
            assert_eq!(c.due(t0 + seen, None), t0 + due, "{why}");
        }
        // A peer's first fetch holds a recomputation, in or after the window.
        let hold = Some(t0 + ms(60));
        assert_eq!(c.due(t0 + ms(3), hold), t0 + ms(60));
        assert_eq!(
            c.due(t0 + ms(500), hold),
            t0 + ms(500),
            "a passed hold is no hold"
        );

        // A slow recomputation (a huge merge) widens the window to its own length.
        c.recomputed(t0, t0 + ms(300));
        assert_eq!(c.due(t0 + ms(301), None), t0 + ms(600));
        assert_eq!(c.due(t0 + ms(700), None), t0 + ms(700));
    }
}
