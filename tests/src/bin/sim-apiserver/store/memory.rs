//! The in-memory object store of one process (`--storage memory`, the default without
//! `--etcd`): objects keyed by (group, version, resource, namespace, name), one global
//! resourceVersion counter, a bounded log of change events (for watches that resume from a
//! resourceVersion) and a broadcast of live events. Nothing is shared with other processes.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{json, Value};
use tokio::sync::broadcast;

use super::{object_rv, Event, EventType, Gvr, Key, StoreError, WatchFrom};

/// How a watch on the memory store starts: the events to send first and the live broadcast
/// (every change of every collection, in resourceVersion order).
pub enum MemoryWatch {
    Started {
        initial: Vec<Arc<Event>>,
        live: broadcast::Receiver<Arc<Event>>,
        rv: u64,
    },
    /// The requested resourceVersion is older than the event log reaches back.
    TooOld { requested: u64, oldest: u64 },
}

const LOG_CAPACITY: usize = 10_000;

#[derive(Default)]
struct Inner {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    log: VecDeque<Arc<Event>>,
    /// resourceVersion of the newest event dropped from the log.
    log_truncated_at: u64,
}

pub struct MemoryStore {
    inner: Mutex<Inner>,
    tx: broadcast::Sender<Arc<Event>>,
}

fn set_rv(obj: &mut Value, rv: u64) {
    if let Some(md) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        md.insert("resourceVersion".into(), json!(rv.to_string()));
    }
}

impl MemoryStore {
    pub fn new() -> MemoryStore {
        let (tx, _) = broadcast::channel(4096);
        MemoryStore {
            inner: Mutex::new(Inner::default()),
            tx,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Record and broadcast a change (caller holds the lock; rv already bumped).
    fn emit(&self, inner: &mut Inner, kind: EventType, key: Key, object: Value) {
        let ev = Arc::new(Event {
            rv: inner.rv,
            kind,
            key,
            object,
        });
        inner.log.push_back(ev.clone());
        while inner.log.len() > LOG_CAPACITY {
            if let Some(old) = inner.log.pop_front() {
                inner.log_truncated_at = old.rv;
            }
        }
        let _ = self.tx.send(ev);
    }

    pub fn current_rv(&self) -> u64 {
        self.lock().rv
    }

    pub fn get(&self, key: &Key) -> Option<Value> {
        self.lock().objects.get(key).cloned()
    }

    /// Objects of one collection (one namespace, or all when `namespace` is `None`), and
    /// the store's resourceVersion at that moment.
    pub fn list(&self, gvr: &Gvr, namespace: Option<&str>) -> (Vec<Value>, u64) {
        let inner = self.lock();
        let items = inner
            .objects
            .iter()
            .filter(|(k, _)| &k.gvr == gvr && namespace.is_none_or(|ns| k.namespace == ns))
            .map(|(_, v)| v.clone())
            .collect();
        (items, inner.rv)
    }

    /// Store a new object, stamping its resourceVersion. With `dry_run` nothing is kept.
    pub fn create(&self, key: Key, mut obj: Value, dry_run: bool) -> Result<Value, StoreError> {
        let mut inner = self.lock();
        if inner.objects.contains_key(&key) {
            return Err(StoreError::AlreadyExists);
        }
        if dry_run {
            return Ok(obj);
        }
        inner.rv += 1;
        set_rv(&mut obj, inner.rv);
        inner.objects.insert(key.clone(), obj.clone());
        self.emit(&mut inner, EventType::Added, key, obj.clone());
        Ok(obj)
    }

    /// Replace an existing object. `update` gets the current object and returns the new one
    /// (or an error to pass back); a non-empty resourceVersion in the new object must match.
    pub fn update<E>(
        &self,
        key: &Key,
        dry_run: bool,
        update: impl FnOnce(&Value) -> Result<Value, E>,
    ) -> Result<Result<Value, StoreError>, E> {
        let mut inner = self.lock();
        let Some(current) = inner.objects.get(key) else {
            return Ok(Err(StoreError::NotFound));
        };
        let mut obj = update(current)?;
        let wanted = object_rv(&obj);
        if !wanted.is_empty() && wanted != object_rv(current) {
            return Ok(Err(StoreError::Conflict));
        }
        if dry_run {
            return Ok(Ok(obj));
        }
        inner.rv += 1;
        set_rv(&mut obj, inner.rv);
        inner.objects.insert(key.clone(), obj.clone());
        self.emit(&mut inner, EventType::Modified, key.clone(), obj.clone());
        Ok(Ok(obj))
    }

    /// Remove an object; returns it as it was (with the deletion's resourceVersion).
    pub fn delete(&self, key: &Key, dry_run: bool) -> Result<Value, StoreError> {
        let mut inner = self.lock();
        if dry_run {
            return inner.objects.get(key).cloned().ok_or(StoreError::NotFound);
        }
        let mut obj = inner.objects.remove(key).ok_or(StoreError::NotFound)?;
        inner.rv += 1;
        set_rv(&mut obj, inner.rv);
        self.emit(&mut inner, EventType::Deleted, key.clone(), obj.clone());
        Ok(obj)
    }

    /// Start a watch on a collection. The initial events and the live receiver are taken
    /// under one lock, so no change falls between them. Callers filter by namespace.
    pub fn watch(&self, gvr: &Gvr, from: WatchFrom) -> MemoryWatch {
        let inner = self.lock();
        let live = self.tx.subscribe();
        let initial = match from {
            WatchFrom::Now => inner
                .objects
                .iter()
                .filter(|(k, _)| &k.gvr == gvr)
                .map(|(k, v)| {
                    Arc::new(Event {
                        rv: object_rv(v).parse().unwrap_or(0),
                        kind: EventType::Added,
                        key: k.clone(),
                        object: v.clone(),
                    })
                })
                .collect(),
            WatchFrom::After(rv) => {
                if inner.log_truncated_at > 0 && rv < inner.log_truncated_at {
                    return MemoryWatch::TooOld {
                        requested: rv,
                        oldest: inner.log_truncated_at,
                    };
                }
                inner
                    .log
                    .iter()
                    .filter(|e| e.rv > rv && &e.key.gvr == gvr)
                    .cloned()
                    .collect()
            }
        };
        MemoryWatch::Started {
            initial,
            live,
            rv: inner.rv,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ns: &str, name: &str) -> Key {
        Key {
            gvr: Gvr {
                group: "g".into(),
                version: "v1".into(),
                resource: "things".into(),
            },
            namespace: ns.into(),
            name: name.into(),
        }
    }

    fn obj(name: &str) -> Value {
        json!({"metadata": {"name": name}})
    }

    #[test]
    fn create_get_update_delete() {
        let s = MemoryStore::new();
        let a = s.create(key("ns", "a"), obj("a"), false).unwrap();
        assert_eq!(object_rv(&a), "1");
        assert_eq!(
            s.create(key("ns", "a"), obj("a"), false),
            Err(StoreError::AlreadyExists)
        );
        s.create(key("other", "b"), obj("b"), false).unwrap();
        let gvr = key("", "").gvr;
        assert_eq!(s.list(&gvr, Some("ns")).0.len(), 1);
        assert_eq!(s.list(&gvr, None).0.len(), 2);

        let stale = json!({"metadata": {"name": "a", "resourceVersion": "999"}});
        let r = s
            .update(&key("ns", "a"), false, |_| Ok::<_, ()>(stale))
            .unwrap();
        assert_eq!(r, Err(StoreError::Conflict));
        let r = s
            .update(&key("ns", "a"), false, |cur| Ok::<_, ()>(cur.clone()))
            .unwrap()
            .unwrap();
        assert_eq!(object_rv(&r), "3");

        assert_eq!(object_rv(&s.delete(&key("ns", "a"), false).unwrap()), "4");
        assert_eq!(s.get(&key("ns", "a")), None);
        assert_eq!(s.delete(&key("ns", "a"), false), Err(StoreError::NotFound));
        // dry run keeps nothing
        s.create(key("ns", "dry"), obj("dry"), true).unwrap();
        assert_eq!(s.get(&key("ns", "dry")), None);
        assert_eq!(s.current_rv(), 4);
    }

    #[test]
    fn watch_replays_after_rv_and_lists_now() {
        let s = MemoryStore::new();
        s.create(key("ns", "a"), obj("a"), false).unwrap();
        s.create(key("ns", "b"), obj("b"), false).unwrap();
        let gvr = key("", "").gvr;
        match s.watch(&gvr, WatchFrom::After(1)) {
            MemoryWatch::Started { initial, rv, .. } => {
                assert_eq!(initial.len(), 1);
                assert_eq!(initial[0].key.name, "b");
                assert_eq!(rv, 2);
            }
            MemoryWatch::TooOld { .. } => panic!("too old"),
        }
        match s.watch(&gvr, WatchFrom::Now) {
            MemoryWatch::Started {
                initial, mut live, ..
            } => {
                assert_eq!(initial.len(), 2);
                assert!(initial.iter().all(|e| e.kind == EventType::Added));
                s.delete(&key("ns", "a"), false).unwrap();
                let ev = live.try_recv().unwrap();
                assert_eq!((ev.kind, ev.rv), (EventType::Deleted, 3));
            }
            MemoryWatch::TooOld { .. } => panic!("too old"),
        }
    }
}
