//! Keeping one apiserver's discovery current: a task per apiserver that fetches, refreshes
//! periodically with conditional requests, backs off on failure, refetches at once when its
//! Lease gets a new holder identity (at most once per [`RefreshConfig::holder_refetch_interval`],
//! later changes coalesced into one refetch at its end), and publishes only good views.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::discovery::documents::DiscoveryDocuments;

use super::backoff::{jitter_unit, refresh_delay, Backoff};
use super::error::FetchError;
use super::fetcher::{DiscoveryFetcher, Etags};
use super::metrics::{DiscoveryMetrics, SyncOutcome};

/// When to fetch again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefreshConfig {
    /// After a success (±10 % jitter).
    pub interval: Duration,
    /// After failures.
    pub backoff: Backoff,
    /// At most one refetch triggered by a new holder identity per this interval: a trigger
    /// within it is deferred to its end, and triggers meanwhile are coalesced into that one
    /// refetch. A Lease writer changing the holder on every renewal then costs one fetch per
    /// interval, not one per renewal; a real restart is followed at once.
    pub holder_refetch_interval: Duration,
}

impl Default for RefreshConfig {
    fn default() -> Self {
        RefreshConfig {
            interval: Duration::from_secs(30),
            backoff: Backoff::default(),
            holder_refetch_interval: DEFAULT_HOLDER_REFETCH_INTERVAL,
        }
    }
}

/// The default of [`RefreshConfig::holder_refetch_interval`].
pub const DEFAULT_HOLDER_REFETCH_INTERVAL: Duration = Duration::from_secs(10);

/// Attempts so far, for the "first complete sync" rule and for status pages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncState {
    /// Finished attempts, good or not.
    pub attempts: u64,
    pub consecutive_failures: u32,
    pub last_error: Option<String>,
}

/// Asks an apiserver's task to fetch again now, without `If-None-Match`.
#[derive(Debug, Clone, Default)]
pub struct RefetchTrigger {
    inner: Arc<TriggerInner>,
}

#[derive(Debug, Default)]
struct TriggerInner {
    notify: Notify,
    holder: Mutex<Option<String>>,
}

impl RefetchTrigger {
    /// Refetch at once (a pending trigger is kept if the task is mid-fetch).
    pub fn refetch_now(&self) {
        self.inner.notify.notify_one();
    }

    /// Report the apiserver's Lease `holderIdentity`. A change from the last one reported (a
    /// restart, maybe an upgrade) triggers a refetch and returns `true`; the first report only
    /// records it.
    pub fn observe_holder_identity(&self, holder: &str) -> bool {
        let mut last = self.inner.holder.lock().unwrap_or_else(|p| p.into_inner());
        let changed = last.as_deref().is_some_and(|l| l != holder);
        if last.as_deref() != Some(holder) {
            *last = Some(holder.to_string());
        }
        if changed {
            self.refetch_now();
        }
        changed
    }
}

/// A running apiserver watch. Dropping it stops the task.
#[derive(Debug)]
pub struct ApiserverWatch {
    pub id: String,
    /// The last good view; `None` until the first success. Changes only when the documents do.
    pub documents: watch::Receiver<Option<Arc<DiscoveryDocuments>>>,
    /// Changes after every attempt.
    pub state: watch::Receiver<SyncState>,
    pub trigger: RefetchTrigger,
    task: JoinHandle<()>,
}

impl ApiserverWatch {
    /// The last good view.
    pub fn current(&self) -> Option<Arc<DiscoveryDocuments>> {
        self.documents.borrow().clone()
    }

    /// Wait until the first attempt finished (good or not): "tried", for the first sync.
    pub async fn tried(&mut self) {
        let _ = self.state.wait_for(|s| s.attempts > 0).await;
    }

    /// Stop the task.
    pub fn abort(&self) {
        self.task.abort();
    }
}

impl Drop for ApiserverWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Start keeping `fetcher`'s apiserver current. The first fetch starts at once.
pub fn spawn_apiserver_watch(
    fetcher: DiscoveryFetcher,
    refresh: RefreshConfig,
    metrics: Arc<DiscoveryMetrics>,
) -> ApiserverWatch {
    let (docs_tx, documents) = watch::channel(None);
    let (state_tx, state) = watch::channel(SyncState::default());
    let trigger = RefetchTrigger::default();
    let id = fetcher.id().to_string();
    metrics.register(&id);
    let task = tokio::spawn(run(
        fetcher,
        refresh,
        metrics,
        trigger.clone(),
        docs_tx,
        state_tx,
    ));
    ApiserverWatch {
        id,
        documents,
        state,
        trigger,
        task,
    }
}

async fn run(
    fetcher: DiscoveryFetcher,
    refresh: RefreshConfig,
    metrics: Arc<DiscoveryMetrics>,
    trigger: RefetchTrigger,
    docs_tx: watch::Sender<Option<Arc<DiscoveryDocuments>>>,
    state_tx: watch::Sender<SyncState>,
) {
    let id = fetcher.id().to_string();
    // The last good view and its ETags, always together.
    let mut last: Option<(Arc<DiscoveryDocuments>, Etags)> = None;
    let mut failures: u32 = 0;
    let mut unconditional = true;
    let mut last_stale: Vec<String> = Vec::new();
    // When the last triggered refetch started, and a trigger deferred until the interval
    // after it has passed.
    let mut last_triggered: Option<tokio::time::Instant> = None;
    let mut deferred: Option<tokio::time::Instant> = None;
    loop {
        let etags = match (&last, unconditional) {
            (Some((_, etags)), false) => Some(etags),
            _ => None,
        };
        let delay = match fetcher.fetch(etags).await {
            Ok(fetched) => {
                failures = 0;
                let stale = fetched.stale();
                let not_modified = fetched.not_modified();
                let new_etags = fetched.etags(last.as_ref().map(|(_, e)| e));
                let outcome = match fetched.into_documents(last.as_ref().map(|(d, _)| d.as_ref())) {
                    Some(docs) => {
                        let changed = last.as_ref().is_none_or(|(d, _)| **d != docs);
                        let docs = if changed {
                            let docs = Arc::new(docs);
                            info!(apiserver = %id, groups = docs.apis.items.len(), "discovery updated");
                            docs_tx.send_replace(Some(docs.clone()));
                            docs
                        } else {
                            last.as_ref()
                                .map(|(d, _)| d.clone())
                                .unwrap_or_else(|| Arc::new(docs))
                        };
                        last = Some((docs, new_etags));
                        if not_modified {
                            SyncOutcome::NotModified
                        } else if changed {
                            SyncOutcome::Updated
                        } else {
                            SyncOutcome::Unchanged
                        }
                    }
                    // Unreachable (a 304 needs ETags we only keep with documents).
                    None => SyncOutcome::NotModified,
                };
                if stale != last_stale {
                    if stale.is_empty() {
                        info!(apiserver = %id, "every legacy group-version answers again");
                    } else {
                        warn!(apiserver = %id, ?stale, "legacy group-versions unavailable, kept as Stale");
                    }
                }
                let stale_count = stale.len();
                last_stale = stale;
                debug!(apiserver = %id, outcome = outcome.label(), "discovery synced");
                metrics.record_success(&id, outcome, stale_count);
                state_tx.send_modify(|s| {
                    s.attempts += 1;
                    s.consecutive_failures = 0;
                });
                refresh_delay(refresh.interval, jitter_unit())
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                log_error(&id, &e, failures, last.is_some());
                metrics.record_error(&id, &e);
                let message = e.to_string();
                state_tx.send_modify(|s| {
                    s.attempts += 1;
                    s.consecutive_failures = failures;
                    s.last_error = Some(message);
                });
                refresh.backoff.delay(failures, jitter_unit())
            }
        };
        let refresh_at = tokio::time::Instant::now() + delay;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(refresh_at) => {
                    // A deferred trigger rides on this fetch, made unconditional.
                    unconditional = deferred.take().is_some();
                    if unconditional {
                        last_triggered = Some(tokio::time::Instant::now());
                    }
                    break;
                }
                _ = trigger.inner.notify.notified() => {
                    let now = tokio::time::Instant::now();
                    match last_triggered.map(|t| t + refresh.holder_refetch_interval) {
                        Some(allowed) if now < allowed => {
                            if deferred.is_none() {
                                info!(apiserver = %id, in_ms = (allowed - now).as_millis() as u64, "new holder identity again soon after the last: refetch deferred (further changes coalesced)");
                            }
                            deferred = Some(allowed);
                            metrics.record_coalesced_trigger();
                        }
                        _ => {
                            info!(apiserver = %id, "refetching discovery now (new holder identity)");
                            last_triggered = Some(now);
                            unconditional = true;
                            failures = 0;
                            break;
                        }
                    }
                }
                _ = sleep_until_opt(deferred), if deferred.is_some() => {
                    info!(apiserver = %id, "refetching discovery now (deferred holder identity change)");
                    deferred = None;
                    last_triggered = Some(tokio::time::Instant::now());
                    unconditional = true;
                    failures = 0;
                    break;
                }
            }
        }
    }
}

async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn log_error(id: &str, e: &FetchError, failures: u32, have_view: bool) {
    let kind = e.error_type().label();
    // Every failure is counted; the log says it on the first and then now and then.
    if failures == 1 || failures.is_power_of_two() {
        warn!(apiserver = %id, error = %e, r#type = kind, failures, keeping_last_view = have_view, "discovery fetch failed");
    } else {
        debug!(apiserver = %id, error = %e, r#type = kind, failures, "discovery fetch failed");
    }
}

/// Fetch every apiserver once, concurrently (the first complete sync: the local apiserver and
/// every live peer tried). Results in the order given; outcomes are recorded in `metrics`.
pub async fn fetch_all_once(
    fetchers: &[DiscoveryFetcher],
    metrics: Option<&DiscoveryMetrics>,
) -> Vec<(String, Result<DiscoveryDocuments, FetchError>)> {
    let results = futures_util::future::join_all(fetchers.iter().map(|f| async move {
        let result = f.fetch_documents().await;
        (f.id().to_string(), result)
    }))
    .await;
    if let Some(m) = metrics {
        for (id, r) in &results {
            m.register(id);
            match r {
                Ok(docs) => m.record_success(
                    id,
                    SyncOutcome::Updated,
                    crate::discovery::legacy::stale_paths(&docs.apis).len(),
                ),
                Err(e) => m.record_error(id, e),
            }
        }
    }
    results
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn holder_identity_changes_trigger_once() {
        let t = RefetchTrigger::default();
        assert!(!t.observe_holder_identity("a_1"), "first sighting");
        assert!(!t.observe_holder_identity("a_1"));
        assert!(t.observe_holder_identity("a_2"));
        // The permit waits for the task.
        tokio::time::timeout(Duration::from_secs(1), t.inner.notify.notified())
            .await
            .expect("notified");
        assert!(!t.observe_holder_identity("a_2"));
        assert!(
            tokio::time::timeout(Duration::from_millis(50), t.inner.notify.notified())
                .await
                .is_err(),
            "no refetch without a change"
        );
    }
}
