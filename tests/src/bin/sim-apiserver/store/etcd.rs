//! The etcd backend (`--etcd <url>`): the cluster state every simulated apiserver shares, laid
//! out like kube-apiserver's storage.
//!
//! - key: `<prefix>/<group>/<resource>/<namespace>/<name>`; the core group has no group segment
//!   (`/registry/configmaps/default/x`, as kube keeps it) and cluster-scoped objects no namespace
//!   segment. The version is not part of the key: the object is served at whichever version
//!   the request names, with its `apiVersion` set to that version (the simulator's stand-in for
//!   kube's conversion through the storage version);
//! - value: the object's JSON without `resourceVersion` (kube does not store it either);
//! - `resourceVersion`: the key's `mod_revision`; for a list the store revision of the read;
//! - writes are transactions on `mod_revision` (create: the key must not exist; update and
//!   delete: it must be unchanged since read), so concurrent writers through different
//!   apiservers get kube's 409 Conflict, or a retry when the client gave no resourceVersion;
//! - watches are etcd watches from `resourceVersion + 1`; a compacted revision ends the watch
//!   with 410 Expired. Progress requests (every `progress_every`) feed bookmarks.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, EventType as EtcdEventType,
    GetOptions, KeyValue, Txn, TxnOp, WatchOptions,
};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::{
    object_rv, set_rv, Event, EventType, Gvr, Key, Live, StoreError, WatchFrom, WatchStart,
};

/// Attempts of an unconditional update that keeps racing with other writers.
const UPDATE_ATTEMPTS: usize = 16;

pub struct EtcdStore {
    client: Client,
    url: String,
    prefix: String,
}

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("etcd: {e}"))
}

fn revision(header: Option<&etcd_client::ResponseHeader>) -> u64 {
    header.map(|h| h.revision()).unwrap_or(0).max(0) as u64
}

impl EtcdStore {
    /// Connect and check that etcd answers.
    pub async fn connect(url: &str, prefix: &str) -> anyhow::Result<EtcdStore> {
        let options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_timeout(Duration::from_secs(10));
        let mut client = Client::connect([url], Some(options)).await?;
        client.status().await?;
        Ok(EtcdStore {
            client,
            url: url.to_string(),
            prefix: prefix.trim_end_matches('/').to_string(),
        })
    }

    pub fn describe(&self) -> String {
        format!("{} (prefix {})", self.url, self.prefix)
    }

    fn client(&self) -> Client {
        self.client.clone()
    }

    /// `<prefix>/<group>/<resource>/`, plus `<namespace>/` when given.
    fn collection_prefix(&self, gvr: &Gvr, namespace: Option<&str>) -> String {
        let mut p = format!("{}/", self.prefix);
        if !gvr.group.is_empty() {
            p.push_str(&gvr.group);
            p.push('/');
        }
        p.push_str(&gvr.resource);
        p.push('/');
        if let Some(ns) = namespace.filter(|ns| !ns.is_empty()) {
            p.push_str(ns);
            p.push('/');
        }
        p
    }

    fn object_key(&self, key: &Key) -> String {
        let ns = (!key.namespace.is_empty()).then_some(key.namespace.as_str());
        format!("{}{}", self.collection_prefix(&key.gvr, ns), key.name)
    }

    /// The stored JSON as the object of `gvr`, with its resourceVersion.
    fn decode(value: &[u8], rv: i64, gvr: &Gvr) -> Result<Value, StoreError> {
        let mut obj: Value = serde_json::from_slice(value)
            .map_err(|e| StoreError::Unavailable(format!("undecodable object in etcd: {e}")))?;
        if let Some(o) = obj.as_object_mut() {
            o.insert("apiVersion".into(), json!(gvr.api_version()));
        }
        set_rv(&mut obj, rv.max(0) as u64);
        Ok(obj)
    }

    fn decode_kv(kv: &KeyValue, gvr: &Gvr) -> Result<Value, StoreError> {
        Self::decode(kv.value(), kv.mod_revision(), gvr)
    }

    fn encode(obj: &Value) -> Vec<u8> {
        let mut stored = obj.clone();
        if let Some(md) = stored.get_mut("metadata").and_then(Value::as_object_mut) {
            md.remove("resourceVersion");
        }
        stored.to_string().into_bytes()
    }

    pub async fn current_rv(&self) -> Result<u64, StoreError> {
        let resp = self
            .client()
            .get(
                format!("{}/", self.prefix),
                Some(GetOptions::new().with_count_only()),
            )
            .await
            .map_err(unavailable)?;
        Ok(revision(resp.header()))
    }

    async fn get_kv(&self, key: &Key) -> Result<Option<KeyValue>, StoreError> {
        let mut resp = self
            .client()
            .get(self.object_key(key), None)
            .await
            .map_err(unavailable)?;
        Ok(resp.take_kvs().into_iter().next())
    }

    pub async fn get(&self, key: &Key) -> Result<Option<Value>, StoreError> {
        match self.get_kv(key).await? {
            Some(kv) => Ok(Some(Self::decode_kv(&kv, &key.gvr)?)),
            None => Ok(None),
        }
    }

    pub async fn list(
        &self,
        gvr: &Gvr,
        namespace: Option<&str>,
    ) -> Result<(Vec<Value>, u64), StoreError> {
        let resp = self
            .client()
            .get(
                self.collection_prefix(gvr, namespace),
                Some(GetOptions::new().with_prefix()),
            )
            .await
            .map_err(unavailable)?;
        let items = resp
            .kvs()
            .iter()
            .map(|kv| Self::decode_kv(kv, gvr))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((items, revision(resp.header())))
    }

    pub async fn create(
        &self,
        key: Key,
        mut obj: Value,
        dry_run: bool,
    ) -> Result<Value, StoreError> {
        let k = self.object_key(&key);
        if dry_run {
            return match self.get_kv(&key).await? {
                Some(_) => Err(StoreError::AlreadyExists),
                None => Ok(obj),
            };
        }
        let txn = Txn::new()
            .when([Compare::version(k.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(k, Self::encode(&obj), None)]);
        let resp = self.client().txn(txn).await.map_err(unavailable)?;
        if !resp.succeeded() {
            return Err(StoreError::AlreadyExists);
        }
        set_rv(&mut obj, revision(resp.header()));
        Ok(obj)
    }

    pub async fn update<E>(
        &self,
        key: &Key,
        dry_run: bool,
        mut update: impl FnMut(&Value) -> Result<Value, E> + Send,
    ) -> Result<Result<Value, StoreError>, E> {
        let k = self.object_key(key);
        for _ in 0..UPDATE_ATTEMPTS {
            let kv = match self.get_kv(key).await {
                Ok(Some(kv)) => kv,
                Ok(None) => return Ok(Err(StoreError::NotFound)),
                Err(e) => return Ok(Err(e)),
            };
            let current = match Self::decode_kv(&kv, &key.gvr) {
                Ok(c) => c,
                Err(e) => return Ok(Err(e)),
            };
            let mut obj = update(&current)?;
            let wanted = object_rv(&obj).to_string();
            if !wanted.is_empty() && wanted != object_rv(&current) {
                return Ok(Err(StoreError::Conflict));
            }
            if dry_run {
                return Ok(Ok(obj));
            }
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    k.clone(),
                    CompareOp::Equal,
                    kv.mod_revision(),
                )])
                .and_then([TxnOp::put(k.clone(), Self::encode(&obj), None)]);
            let resp = match self.client().txn(txn).await {
                Ok(r) => r,
                Err(e) => return Ok(Err(unavailable(e))),
            };
            if resp.succeeded() {
                set_rv(&mut obj, revision(resp.header()));
                return Ok(Ok(obj));
            }
            if !wanted.is_empty() {
                // The client named the version it read; someone else wrote in between.
                return Ok(Err(StoreError::Conflict));
            }
        }
        Ok(Err(StoreError::Conflict))
    }

    pub async fn delete(&self, key: &Key, dry_run: bool) -> Result<Value, StoreError> {
        if dry_run {
            return self.get(key).await?.ok_or(StoreError::NotFound);
        }
        let mut resp = self
            .client()
            .delete(
                self.object_key(key),
                Some(DeleteOptions::new().with_prev_key()),
            )
            .await
            .map_err(unavailable)?;
        let rv = revision(resp.header());
        let prev = resp.take_prev_kvs().into_iter().next();
        match prev {
            Some(kv) if resp.deleted() > 0 => {
                let mut obj = Self::decode(kv.value(), kv.mod_revision(), &key.gvr)?;
                set_rv(&mut obj, rv);
                Ok(obj)
            }
            _ => Err(StoreError::NotFound),
        }
    }

    /// One etcd watch event as a store event of `gvr`; `None` for what cannot be decoded.
    fn event(ev: &etcd_client::Event, gvr: &Gvr) -> Option<Event> {
        let kv = ev.kv()?;
        let (kind, object) = match ev.event_type() {
            EtcdEventType::Put => {
                let kind = if kv.version() == 1 {
                    EventType::Added
                } else {
                    EventType::Modified
                };
                (kind, Self::decode(kv.value(), kv.mod_revision(), gvr).ok()?)
            }
            EtcdEventType::Delete => {
                // The last state, at the deletion's revision (the previous value is asked
                // for; it is missing only if etcd compacted it meanwhile).
                let object = match ev.prev_kv() {
                    Some(prev) => Self::decode(prev.value(), kv.mod_revision(), gvr).ok()?,
                    None => {
                        let name = kv.key_str().ok()?.rsplit('/').next()?.to_string();
                        let mut o =
                            json!({"apiVersion": gvr.api_version(), "metadata": {"name": name}});
                        set_rv(&mut o, kv.mod_revision().max(0) as u64);
                        o
                    }
                };
                (EventType::Deleted, object)
            }
        };
        let md = object.get("metadata");
        let field = |f: &str| {
            md.and_then(|m| m.get(f))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        Some(Event {
            rv: kv.mod_revision().max(0) as u64,
            kind,
            key: Key {
                gvr: gvr.clone(),
                namespace: field("namespace"),
                name: field("name"),
            },
            object,
        })
    }

    pub async fn watch(
        &self,
        gvr: &Gvr,
        namespace: Option<&str>,
        from: WatchFrom,
        progress_every: Duration,
    ) -> WatchStart {
        let prefix = self.collection_prefix(gvr, namespace);
        let (initial, start_rv) = match from {
            WatchFrom::Now => {
                let resp = match self
                    .client()
                    .get(prefix.clone(), Some(GetOptions::new().with_prefix()))
                    .await
                {
                    Ok(r) => r,
                    Err(e) => return WatchStart::Failed(format!("etcd: {e}")),
                };
                let mut initial = Vec::new();
                for kv in resp.kvs() {
                    let Ok(object) = Self::decode_kv(kv, gvr) else {
                        continue;
                    };
                    let md = object.get("metadata").cloned().unwrap_or(Value::Null);
                    let field =
                        |f: &str| md.get(f).and_then(Value::as_str).unwrap_or("").to_string();
                    initial.push(Arc::new(Event {
                        rv: kv.mod_revision().max(0) as u64,
                        kind: EventType::Added,
                        key: Key {
                            gvr: gvr.clone(),
                            namespace: field("namespace"),
                            name: field("name"),
                        },
                        object,
                    }));
                }
                (initial, revision(resp.header()))
            }
            WatchFrom::After(rv) => (Vec::new(), rv),
        };
        let options = WatchOptions::new()
            .with_prefix()
            .with_prev_key()
            .with_start_revision(start_rv as i64 + 1);
        let mut stream = match self.client().watch(prefix, Some(options)).await {
            Ok(s) => s,
            Err(e) => return WatchStart::Failed(format!("etcd: {e}")),
        };
        let (tx, rx) = mpsc::channel(256);
        let gvr = gvr.clone();
        tokio::spawn(async move {
            let mut progress =
                tokio::time::interval(progress_every.max(Duration::from_millis(100)));
            progress.tick().await;
            loop {
                tokio::select! {
                    _ = tx.closed() => break,
                    _ = progress.tick() => {
                        if let Err(e) = stream.request_progress().await {
                            let _ = tx.send(Live::Failed(format!("etcd: {e}"))).await;
                            break;
                        }
                    }
                    msg = stream.message() => match msg {
                        Ok(Some(resp)) => {
                            if resp.compact_revision() > 0 {
                                let msg = format!(
                                    "too old resource version: {start_rv} ({})",
                                    resp.compact_revision()
                                );
                                let _ = tx.send(Live::Expired(msg)).await;
                                break;
                            }
                            if resp.canceled() {
                                let msg = format!("etcd watch canceled: {}", resp.cancel_reason());
                                let _ = tx.send(Live::Failed(msg)).await;
                                break;
                            }
                            if resp.events().is_empty() {
                                if !resp.created() {
                                    let rv = revision(resp.header());
                                    let _ = tx.try_send(Live::Progress(rv));
                                }
                                continue;
                            }
                            for ev in resp.events() {
                                if let Some(ev) = Self::event(ev, &gvr) {
                                    if tx.send(Live::Event(Arc::new(ev))).await.is_err() {
                                        return;
                                    }
                                }
                            }
                        }
                        Ok(None) => {
                            let _ = tx.send(Live::Failed("etcd watch closed".into())).await;
                            break;
                        }
                        Err(e) => {
                            let _ = tx.send(Live::Failed(format!("etcd: {e}"))).await;
                            break;
                        }
                    },
                }
            }
        });
        WatchStart::Started {
            initial,
            live: rx,
            rv: start_rv,
        }
    }
}
