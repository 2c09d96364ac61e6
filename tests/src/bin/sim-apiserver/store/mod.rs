//! Object storage, two backends behind one async API:
//!
//! - `memory` (`--storage memory`, the default without `--etcd`): one process's own objects,
//!   keyed by group, version and resource, as the simulator always had;
//! - `etcd` (`--etcd <url>`): a real etcd shared by every simulated apiserver of a cluster, the
//!   way kube-apiservers share theirs. Objects live under
//!   `<prefix>/<group>/<resource>/<namespace>/<name>` (no version: an object created through
//!   one apiserver is visible through every apiserver that serves its resource, at any of the
//!   versions it serves), `resourceVersion` is etcd's `mod_revision`, watches are etcd watches
//!   (410 Expired once etcd has compacted the requested revision) and bookmarks come from
//!   etcd progress notifications.
//!
//! Watches deliver a channel of [`Live`] items, whatever the backend.

mod etcd;
mod memory;

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{broadcast, mpsc};

pub use etcd::EtcdStore;
pub use memory::{MemoryStore, MemoryWatch};

/// Which collection an object belongs to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Gvr {
    pub group: String,
    pub version: String,
    pub resource: String,
}

impl Gvr {
    /// `v1` for core, else `group/version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

/// The full key of one object; `namespace` is empty for cluster-scoped objects.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    pub gvr: Gvr,
    pub namespace: String,
    pub name: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, as seen by watchers.
#[derive(Debug)]
pub struct Event {
    pub rv: u64,
    pub kind: EventType,
    pub key: Key,
    pub object: Value,
}

#[derive(Debug, PartialEq, Eq)]
pub enum StoreError {
    AlreadyExists,
    NotFound,
    Conflict,
    /// The shared storage failed (etcd unreachable, timeout, garbage in a key).
    Unavailable(String),
}

/// Where a watch starts.
pub enum WatchFrom {
    /// Synthetic ADDED events for every existing object, then live events.
    Now,
    /// Replay events newer than this resourceVersion, then live events.
    After(u64),
}

/// What a running watch delivers after its initial events.
#[derive(Debug)]
pub enum Live {
    /// A change of the watched collection, newer than the start.
    Event(Arc<Event>),
    /// Every change up to this resourceVersion has been delivered (bookmark material).
    Progress(u64),
    /// The watch cannot continue from where it is: the client must re-list (410).
    Expired(String),
    /// The storage failed; the watch ends and the client watches again.
    Failed(String),
}

pub enum WatchStart {
    Started {
        initial: Vec<Arc<Event>>,
        live: mpsc::Receiver<Live>,
        rv: u64,
    },
    /// The requested resourceVersion is older than the store reaches back.
    TooOld {
        requested: u64,
        oldest: u64,
    },
    Failed(String),
}

fn set_rv(obj: &mut Value, rv: u64) {
    if let Some(md) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        md.insert("resourceVersion".into(), serde_json::json!(rv.to_string()));
    }
}

pub fn object_rv(obj: &Value) -> &str {
    obj.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .unwrap_or("")
}

pub enum Store {
    Memory(MemoryStore),
    Etcd(Box<EtcdStore>),
}

impl Store {
    pub fn memory() -> Store {
        Store::Memory(MemoryStore::new())
    }

    /// What `--storage` resolved to, for the log.
    pub fn describe(&self) -> String {
        match self {
            Store::Memory(_) => "memory".into(),
            Store::Etcd(e) => format!("etcd {}", e.describe()),
        }
    }

    pub async fn current_rv(&self) -> Result<u64, StoreError> {
        match self {
            Store::Memory(m) => Ok(m.current_rv()),
            Store::Etcd(e) => e.current_rv().await,
        }
    }

    pub async fn get(&self, key: &Key) -> Result<Option<Value>, StoreError> {
        match self {
            Store::Memory(m) => Ok(m.get(key)),
            Store::Etcd(e) => e.get(key).await,
        }
    }

    /// Objects of one collection (one namespace, or all when `namespace` is `None`), and
    /// the store's resourceVersion at that moment.
    pub async fn list(
        &self,
        gvr: &Gvr,
        namespace: Option<&str>,
    ) -> Result<(Vec<Value>, u64), StoreError> {
        match self {
            Store::Memory(m) => Ok(m.list(gvr, namespace)),
            Store::Etcd(e) => e.list(gvr, namespace).await,
        }
    }

    /// Store a new object, stamping its resourceVersion. With `dry_run` nothing is kept.
    pub async fn create(&self, key: Key, obj: Value, dry_run: bool) -> Result<Value, StoreError> {
        match self {
            Store::Memory(m) => m.create(key, obj, dry_run),
            Store::Etcd(e) => e.create(key, obj, dry_run).await,
        }
    }

    /// Replace an existing object. `update` gets the current object and returns the new one
    /// (or an error to pass back); a non-empty resourceVersion in the new object must match.
    /// Without one the update is retried on a concurrent change (kube's GuaranteedUpdate),
    /// so `update` may run more than once.
    pub async fn update<E>(
        &self,
        key: &Key,
        dry_run: bool,
        mut update: impl FnMut(&Value) -> Result<Value, E> + Send,
    ) -> Result<Result<Value, StoreError>, E> {
        match self {
            Store::Memory(m) => m.update(key, dry_run, |cur| update(cur)),
            Store::Etcd(e) => e.update(key, dry_run, update).await,
        }
    }

    /// Remove an object; returns it as it was (with the deletion's resourceVersion).
    pub async fn delete(&self, key: &Key, dry_run: bool) -> Result<Value, StoreError> {
        match self {
            Store::Memory(m) => m.delete(key, dry_run),
            Store::Etcd(e) => e.delete(key, dry_run).await,
        }
    }

    /// Start a watch on a collection (one namespace or all). `progress_every` is how often
    /// the backend reports progress for bookmarks. Callers still filter by namespace and
    /// selector.
    pub async fn watch(
        &self,
        gvr: &Gvr,
        namespace: Option<&str>,
        from: WatchFrom,
        progress_every: Duration,
    ) -> WatchStart {
        match self {
            Store::Memory(m) => match m.watch(gvr, from) {
                MemoryWatch::TooOld { requested, oldest } => {
                    WatchStart::TooOld { requested, oldest }
                }
                MemoryWatch::Started { initial, live, rv } => WatchStart::Started {
                    initial,
                    live: forward_memory(live, gvr.clone(), rv),
                    rv,
                },
            },
            Store::Etcd(e) => e.watch(gvr, namespace, from, progress_every).await,
        }
    }
}

/// Turn the memory store's broadcast (every collection) into this watch's [`Live`] items:
/// its collection's events after `start_rv`, and progress from everything else.
fn forward_memory(
    mut live: broadcast::Receiver<Arc<Event>>,
    gvr: Gvr,
    start_rv: u64,
) -> mpsc::Receiver<Live> {
    let (tx, rx) = mpsc::channel(256);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tx.closed() => break,
                r = live.recv() => match r {
                    Ok(ev) if ev.rv <= start_rv => {}
                    Ok(ev) if ev.key.gvr == gvr => {
                        if tx.send(Live::Event(ev)).await.is_err() {
                            break;
                        }
                    }
                    // Progress is advisory: drop it rather than wait.
                    Ok(ev) => { let _ = tx.try_send(Live::Progress(ev.rv)); }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        let _ = tx
                            .send(Live::Expired("watch fell behind; please re-list".into()))
                            .await;
                        break;
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                },
            }
        }
    });
    rx
}
