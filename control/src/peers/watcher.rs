//! The kube glue: a kube-runtime `watcher` on the identity Leases in `kube-system`
//! (`apiserver.kubernetes.io/identity=kube-apiserver`), fed into a [`Tracker`], published as
//! [`PeerSet`] snapshots on a `tokio::sync::watch` channel.
//!
//! A snapshot is published after every lease event and whenever a live lease reaches the end
//! of its grace (a timer set to the earliest expiry), so a peer that stops renewing drops out
//! without any watch event. Only changed snapshots are published. Watch errors are retried by
//! kube-runtime with its default backoff, counted and logged; meanwhile liveness is frozen
//! (the snapshot is marked `stale`) and a re-list replaces the leases only once complete.
//!
//! Leases are watched as [`IdentityLease`], which always deserializes: a Lease with a field
//! out of k8s-openapi's range (a `renewTime` in year 9999) is ignored on its own — logged once,
//! counted in `skewgate_peer_leases_malformed_total{field}`, excluded with
//! `Exclusion::Malformed` — instead of failing the watch for every peer. Every event is
//! stamped with our clocks ([`Moment::now`]): liveness is judged by when we saw a lease
//! renewed, not by the peer-written `renewTime` (see [`super::model`]).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use futures_util::StreamExt;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use super::address::{loggable, PEER_ADVERTISE_ADDRESS_ANNOTATION};
pub use super::lease::lease_info;
use super::lease::IdentityLease;
use super::metrics::PeerMetrics;
use super::model::{
    FirstSeen, Moment, Notice, PeerConfig, PeerSet, Tracker, IDENTITY_LABEL, IDENTITY_LABEL_VALUE,
    LEASE_NAMESPACE,
};

/// `apiserver.kubernetes.io/identity=kube-apiserver`
pub fn label_selector() -> String {
    format!("{IDENTITY_LABEL}={IDENTITY_LABEL_VALUE}")
}

/// A client from a kubeconfig file (`--kubeconfig`), or inferred (in-cluster / `$KUBECONFIG`).
pub async fn client_from_kubeconfig(path: Option<&Path>) -> anyhow::Result<Client> {
    let config = match path {
        Some(p) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(p)?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?
        }
        None => kube::Config::infer().await?,
    };
    Ok(Client::try_from(config)?)
}

/// A running peer watcher. Dropping it stops the watch.
pub struct PeerWatcher {
    pub updates: watch::Receiver<PeerSet>,
    pub metrics: Arc<PeerMetrics>,
    task: JoinHandle<()>,
}

impl PeerWatcher {
    /// Start watching; the first snapshot is empty and not `synced`.
    pub fn spawn(client: Client, config: PeerConfig, metrics: Arc<PeerMetrics>) -> PeerWatcher {
        PeerWatcher::spawn_restoring(client, config, Vec::new(), metrics)
    }

    /// Start watching with the seniority of the leases known before a restart (the state
    /// directory's, see [`Tracker::restoring`]).
    pub fn spawn_restoring(
        client: Client,
        config: PeerConfig,
        first_seen: Vec<(String, FirstSeen)>,
        metrics: Arc<PeerMetrics>,
    ) -> PeerWatcher {
        let (tx, updates) = watch::channel(PeerSet::default());
        let tracker = Tracker::restoring(config, first_seen);
        let task = tokio::spawn(run(client, tracker, metrics.clone(), tx));
        PeerWatcher {
            updates,
            metrics,
            task,
        }
    }

    /// The current snapshot.
    pub fn current(&self) -> PeerSet {
        self.updates.borrow().clone()
    }
}

impl Drop for PeerWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One item of the lease watch, seen `at`. A failure freezes liveness; only what shows the
/// watch works again thaws it: a change, or a complete re-list. kube-runtime announces a
/// re-list (`Init`) before it sends the list request, so `Init` and a list's first pages
/// prove nothing: the list may still fail, and until it completes the leases are as before
/// the failure.
fn on_watch_item(
    tracker: &mut Tracker,
    item: Result<Event<IdentityLease>, watcher::Error>,
    at: Moment,
) -> Result<(), watcher::Error> {
    match item {
        Ok(Event::Init) => tracker.begin_relist(),
        Ok(Event::InitApply(l)) => tracker.relist_apply(lease_info(&l)),
        Ok(Event::InitDone) => {
            tracker.watch_resumed(at.mono);
            tracker.finish_relist(at);
        }
        Ok(Event::Apply(l)) => {
            tracker.watch_resumed(at.mono);
            tracker.apply(lease_info(&l), at);
        }
        Ok(Event::Delete(l)) => {
            tracker.watch_resumed(at.mono);
            tracker.delete(l.name());
        }
        Err(e) => {
            tracker.watch_failed(at.mono);
            return Err(e);
        }
    }
    Ok(())
}

fn report(notice: &Notice, metrics: &PeerMetrics) {
    match notice {
        Notice::Restarted {
            id,
            old_holder,
            new_holder,
            generation,
        } => {
            metrics.restarted();
            info!(peer = %id, %old_holder, %new_holder, generation, "apiserver restarted (new holder identity)");
        }
        Notice::AddressRejected { id, value, reason } => {
            metrics.address_rejected(*reason);
            let value = value.as_deref().map(loggable);
            warn!(
                peer = %id,
                value = ?value,
                reason = reason.label(),
                "ignoring identity lease: no acceptable peer address"
            );
        }
        Notice::DuplicateLocal {
            id,
            hostname,
            expected,
        } => {
            metrics.duplicate_local();
            warn!(
                lease = %loggable(id),
                hostname = %loggable(hostname),
                local_lease = %expected,
                "refusing identity lease: it claims the local hostname but is not the local apiserver's lease"
            );
        }
        Notice::OverCap { id, max_peers } => {
            metrics.over_cap();
            warn!(
                peer = %loggable(id),
                max_peers,
                "ignoring live identity lease: more peers than --max-peers (not routed, not fetched)"
            );
        }
        Notice::Malformed { id, field, detail } => {
            metrics.malformed(*field);
            warn!(
                lease = %loggable(id),
                field = field.label(),
                %detail,
                "ignoring identity lease: a field cannot be read"
            );
        }
    }
}

/// Log who joined, left or changed between two snapshots.
fn log_changes(old: &PeerSet, new: &PeerSet) {
    for p in &new.peers {
        match old.peer(&p.id) {
            None => {
                info!(peer = %p.id, address = %p.address, generation = p.generation, "peer joined")
            }
            Some(o) if o.address != p.address || o.generation != p.generation => info!(
                peer = %p.id,
                address = %p.address,
                generation = p.generation,
                "peer changed"
            ),
            Some(_) => {}
        }
    }
    for o in &old.peers {
        if new.peer(&o.id).is_none() {
            match new.excluded(&o.id) {
                Some(e) => info!(peer = %o.id, reason = ?e.reason, "peer left"),
                None => info!(peer = %o.id, "peer left (lease deleted)"),
            }
        }
    }
    if new.stale != old.stale {
        if new.stale {
            warn!("identity lease watch failing: peers are kept as last seen until it recovers");
        } else {
            info!("identity lease watch recovered");
        }
    }
    if new.synced && !old.synced {
        info!(peers = new.peers.len(), local = ?new.local.as_ref().map(|l| &l.id), "identity leases synced");
    }
}

/// Watch until `tx` has no receivers left.
pub async fn run(
    client: Client,
    mut tracker: Tracker,
    metrics: Arc<PeerMetrics>,
    tx: watch::Sender<PeerSet>,
) {
    let config = tracker.config().clone();
    if config.policy.allowed_cidrs.is_empty() {
        warn!("no peer CIDR configured: every {PEER_ADVERTISE_ADDRESS_ANNOTATION} annotation is refused; only the operator's peer address mapping is used");
    } else {
        let cidrs: Vec<String> = config
            .policy
            .allowed_cidrs
            .iter()
            .map(|c| c.to_string())
            .collect();
        info!(?cidrs, grace = ?config.grace, "watching apiserver identity leases");
    }
    let api: Api<IdentityLease> = Api::namespaced(client, LEASE_NAMESPACE);
    let wc = watcher::Config::default().labels(&label_selector());
    let mut events = watcher::watcher(api, wc).default_backoff().boxed();
    let mut deadline: Option<tokio::time::Instant> = None;
    loop {
        let expiry = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            ev = events.next() => match ev {
                Some(item) => {
                    if let Err(e) = on_watch_item(&mut tracker, item, Moment::now()) {
                        metrics.watch_error();
                        warn!(error = %e, "identity lease watch failed; retrying (peer liveness frozen meanwhile)");
                    }
                }
                None => {
                    warn!("identity lease watch ended");
                    return;
                }
            },
            _ = expiry => debug!("a peer lease reached the end of its grace"),
            _ = tx.closed() => return,
        }
        let eval = tracker.evaluate(Instant::now());
        for n in &eval.notices {
            report(n, &metrics);
        }
        metrics.set_counts(eval.set.peers.len(), &eval.set.excluded);
        deadline = eval.next_expiry.map(|d| tokio::time::Instant::now() + d);
        let new = eval.set;
        tx.send_if_modified(|current| {
            if *current == new {
                return false;
            }
            log_changes(current, &new);
            *current = new;
            true
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selector() {
        assert_eq!(
            label_selector(),
            "apiserver.kubernetes.io/identity=kube-apiserver"
        );
    }

    /// Both clocks `secs` after one origin (the wall clock's is a fixed date).
    fn at(secs: u64) -> Moment {
        static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        let offset = std::time::Duration::from_secs(secs);
        Moment {
            mono: *ORIGIN.get_or_init(Instant::now) + offset,
            wall: std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000) + offset,
        }
    }

    /// An identity Lease of `name` renewed at `secs`, as the apiserver serves it.
    fn lease(name: &str, ip: &str, secs: u64) -> IdentityLease {
        let renew = k8s_openapi::jiff::Timestamp::try_from(at(secs).wall)
            .unwrap()
            .to_string();
        IdentityLease::from_value(serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": name,
                "namespace": LEASE_NAMESPACE,
                "labels": {IDENTITY_LABEL: IDENTITY_LABEL_VALUE},
                "annotations": {PEER_ADVERTISE_ADDRESS_ANNOTATION: format!("{ip}:6443")},
            },
            "spec": {"holderIdentity": format!("{name}_1"), "renewTime": renew,
                     "leaseDurationSeconds": 3600},
        }))
    }

    fn peers(tracker: &mut Tracker, secs: u64) -> (Vec<String>, bool) {
        let set = tracker.evaluate(at(secs).mono).set;
        (set.peers.into_iter().map(|p| p.id).collect(), set.stale)
    }

    /// The events kube-runtime gives after an outage longer than the grace (a 410 on the watch,
    /// or an apiserver down while it restarts): `Init` before each list request, lists that
    /// fail, then one that completes. No peer is dropped on the way.
    #[test]
    fn a_relist_after_a_long_outage_drops_no_peer_before_it_completes() {
        use super::super::address::{parse_cidr, AddressPolicy};
        let config = PeerConfig {
            policy: AddressPolicy::new(vec![parse_cidr("10.0.0.0/8").unwrap()], []),
            ..PeerConfig::default()
        };
        let grace = config.grace.as_secs();
        let mut tracker = Tracker::new(config);
        let both = ["apiserver-a", "apiserver-b"].map(String::from).to_vec();
        let list = |t: &mut Tracker, secs: u64| {
            for item in [
                Ok(Event::Init),
                Ok(Event::InitApply(lease("apiserver-a", "10.0.0.1", secs))),
                Ok(Event::InitApply(lease("apiserver-b", "10.0.0.2", secs))),
                Ok(Event::InitDone),
            ] {
                on_watch_item(t, item, at(secs)).unwrap();
            }
        };
        list(&mut tracker, 0);
        assert_eq!(peers(&mut tracker, 1), (both.clone(), false));

        // The watch fails at 5; kube-runtime retries with a re-list long after the grace.
        let failed = |t: &mut Tracker, secs| {
            let gone = Err(watcher::Error::NoResourceVersion);
            assert!(on_watch_item(t, gone, at(secs)).is_err());
        };
        failed(&mut tracker, 5);
        for retry in [grace * 3, grace * 4] {
            on_watch_item(&mut tracker, Ok(Event::Init), at(retry)).unwrap();
            assert_eq!(
                peers(&mut tracker, retry),
                (both.clone(), true),
                "announced, not listed: still frozen"
            );
            // The list request itself fails.
            failed(&mut tracker, retry + 1);
            assert_eq!(peers(&mut tracker, retry + 1), (both.clone(), true));
        }
        // A list that completes: the leases were renewed meanwhile, both are live.
        let back = grace * 5;
        list(&mut tracker, back);
        assert_eq!(peers(&mut tracker, back), (both.clone(), false));

        // A watch resumed with the events it missed, one at a time: b is not dead before its
        // own event arrives.
        failed(&mut tracker, back + 1);
        let later = back + grace * 3;
        on_watch_item(
            &mut tracker,
            Ok(Event::Apply(lease("apiserver-a", "10.0.0.1", later))),
            at(later),
        )
        .unwrap();
        assert_eq!(peers(&mut tracker, later), (both.clone(), false));
    }
}
