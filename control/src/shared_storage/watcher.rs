//! The kube glue: one kube-runtime watcher per kind, both applied to one [`Tracker`] by one task,
//! published as [`SharedStorage`] snapshots (only changed ones).
//!
//! Watch errors (RBAC, a broken connection, 410 Gone) are retried by kube-runtime with its
//! default backoff, counted and logged; the last view stays meanwhile.

use crate::metrics::Families;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::model::{
    apiservice_group_version, crd_group_versions, GroupVersion, Kind, SharedStorage, Tracker,
};

/// Counters of the shared-storage watchers.
#[derive(Debug, Default)]
pub struct SharedStorageMetrics {
    crd_errors: AtomicU64,
    apiservice_errors: AtomicU64,
    group_versions: AtomicU64,
}

impl SharedStorageMetrics {
    fn error(&self, kind: Kind) {
        match kind {
            Kind::CustomResourceDefinitions => &self.crd_errors,
            Kind::APIServices => &self.apiservice_errors,
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    pub fn errors_total(&self, kind: Kind) -> u64 {
        match kind {
            Kind::CustomResourceDefinitions => &self.crd_errors,
            Kind::APIServices => &self.apiservice_errors,
        }
        .load(Ordering::Relaxed)
    }

    /// These metrics, for `/metrics`.
    pub fn families(&self) -> Families {
        let mut f = Families::new();
        f.counters(
            "skewgate_shared_storage_watch_errors_total",
            "Errors of the CRD and APIService watches (they retry with backoff).",
            &["resource"],
            [Kind::CustomResourceDefinitions, Kind::APIServices]
                .iter()
                .map(|k| ([k.label()], self.errors_total(*k))),
        );
        f.gauge(
            "skewgate_shared_storage_group_versions",
            "Group-versions served from shared storage (CRDs, service-backed APIServices), never routed to peers.",
            self.group_versions.load(Ordering::Relaxed) as f64,
        );
        f
    }
}

/// A running pair of watchers. Dropping it stops them.
pub struct SharedStorageWatcher {
    pub updates: watch::Receiver<SharedStorage>,
    pub metrics: Arc<SharedStorageMetrics>,
    task: JoinHandle<()>,
}

impl Drop for SharedStorageWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SharedStorageWatcher {
    /// Start watching; the first snapshot is empty and not `synced`.
    pub fn spawn(client: Client, metrics: Arc<SharedStorageMetrics>) -> Self {
        let (tx, updates) = watch::channel(SharedStorage::default());
        let task = tokio::spawn(run(client, metrics.clone(), tx));
        SharedStorageWatcher {
            updates,
            metrics,
            task,
        }
    }
}

fn object_name<K: kube::Resource>(o: &K) -> String {
    o.meta().name.clone().unwrap_or_default()
}

/// Apply one event of `kind` whose objects contribute `gvs(object)`.
fn apply<K: kube::Resource>(
    tracker: &mut Tracker,
    kind: Kind,
    event: Event<K>,
    gvs: impl Fn(&K) -> Vec<GroupVersion>,
) {
    match event {
        Event::Init => tracker.begin_relist(kind),
        Event::InitApply(o) => tracker.relist_apply(kind, object_name(&o), gvs(&o)),
        Event::InitDone => tracker.finish_relist(kind),
        Event::Apply(o) => tracker.apply(kind, object_name(&o), gvs(&o)),
        Event::Delete(o) => tracker.delete(kind, &object_name(&o)),
    }
}

async fn run(client: Client, metrics: Arc<SharedStorageMetrics>, tx: watch::Sender<SharedStorage>) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let apiservices: Api<APIService> = Api::all(client);
    let mut crd_events = watcher::watcher(crds, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut apiservice_events = watcher::watcher(apiservices, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut tracker = Tracker::default();
    loop {
        let failed = tokio::select! {
            ev = crd_events.next() => match ev {
                Some(Ok(ev)) => {
                    apply(&mut tracker, Kind::CustomResourceDefinitions, ev, crd_group_versions);
                    None
                }
                Some(Err(e)) => Some((Kind::CustomResourceDefinitions, e)),
                None => return,
            },
            ev = apiservice_events.next() => match ev {
                Some(Ok(ev)) => {
                    apply(&mut tracker, Kind::APIServices, ev, |a| {
                        apiservice_group_version(a).into_iter().collect()
                    });
                    None
                }
                Some(Err(e)) => Some((Kind::APIServices, e)),
                None => return,
            },
            _ = tx.closed() => return,
        };
        if let Some((kind, e)) = failed {
            metrics.error(kind);
            warn!(resource = kind.label(), error = %e, "shared-storage watch failed; retrying (the last view stays)");
            continue;
        }
        let new = tracker.snapshot();
        metrics
            .group_versions
            .store(new.group_versions.len() as u64, Ordering::Relaxed);
        tx.send_if_modified(|current| {
            if *current == new {
                return false;
            }
            if new.synced && !current.synced {
                info!(
                    group_versions = new.group_versions.len(),
                    "CRDs and APIServices synced"
                );
            } else if new.group_versions != current.group_versions {
                let added: Vec<String> = new
                    .group_versions
                    .difference(&current.group_versions)
                    .map(GroupVersion::to_string)
                    .collect();
                let removed: Vec<String> = current
                    .group_versions
                    .difference(&new.group_versions)
                    .map(GroupVersion::to_string)
                    .collect();
                info!(?added, ?removed, "shared-storage group-versions changed");
            }
            *current = new;
            true
        });
    }
}
