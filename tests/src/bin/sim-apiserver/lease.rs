//! The identity Lease, as kube-apiserver keeps it (`pkg/controlplane/apiserver`, the
//! `APIServerIdentity` lease controller):
//!
//! - `coordination.k8s.io/v1` Lease `kube-system/apiserver-<hash>`, the hash being kube's
//!   (sha256 of the length-prefixed hostname and `kube-apiserver`, base32 of 16 bytes);
//! - labels `apiserver.kubernetes.io/identity: kube-apiserver`, `kubernetes.io/hostname: <hostname>`;
//! - `spec.holderIdentity: <lease name>_<uuid>`, new on every start (a restart is visible);
//! - `spec.leaseDurationSeconds: 3600`, `spec.renewTime` (MicroTime) renewed every
//!   `--lease-renew-interval` (kube: 10 s); a deleted lease is recreated on the next renewal;
//! - annotation `kubernetes.io/peer-advertise-address: <ip:port>` (the listen address unless
//!   `--peer-advertise-address` overrides it or `--no-peer-advertise-address` omits it).
//!
//! On SIGTERM the lease stays (kube leaves it to the garbage collector) unless
//! `--delete-lease-on-exit`. SIGUSR1 toggles renewing, so tests can stop renewals while the
//! process keeps serving. `--lease-clock-offset` skews the clock `renewTime` is read from, like
//! a host whose clock runs ahead or behind.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};

use crate::store::{Gvr, Key, Store, StoreError};
use crate::{clock, ids, objects};

pub const IDENTITY_LABEL: &str = "apiserver.kubernetes.io/identity";
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
pub const PEER_ADDRESS_ANNOTATION: &str = "kubernetes.io/peer-advertise-address";
pub const NAMESPACE: &str = "kube-system";
/// kube-apiserver's `IdentityLeaseDurationSeconds`.
pub const DURATION_SECONDS: u64 = 3600;

pub struct LeaseOptions {
    /// The `kubernetes.io/hostname` label, and what the lease name is derived from.
    pub hostname: String,
    pub renew_interval: Duration,
    /// The annotation's value; `None` leaves the annotation out.
    pub peer_address: Option<String>,
    pub delete_on_exit: bool,
    /// This apiserver's clock, as far as `renewTime` goes (a skewed host).
    pub clock: clock::Offset,
}

pub struct IdentityLease {
    pub name: String,
    pub holder: String,
    server_id: String,
    opts: LeaseOptions,
    renewing: AtomicBool,
}

impl IdentityLease {
    pub fn new(server_id: &str, opts: LeaseOptions) -> IdentityLease {
        let name = skewgate_tests::identity_lease_name(&opts.hostname);
        let holder = format!("{name}_{}", ids::uid());
        IdentityLease {
            name,
            holder,
            server_id: server_id.to_string(),
            opts,
            renewing: AtomicBool::new(true),
        }
    }

    pub fn delete_on_exit(&self) -> bool {
        self.opts.delete_on_exit
    }

    fn key(&self) -> Key {
        Key {
            gvr: Gvr {
                group: "coordination.k8s.io".into(),
                version: "v1".into(),
                resource: "leases".into(),
            },
            namespace: NAMESPACE.into(),
            name: self.name.clone(),
        }
    }

    /// Our fields on top of `obj` (other labels and annotations are kept).
    fn apply_to(&self, obj: &mut Value, now: SystemTime) {
        obj["apiVersion"] = json!("coordination.k8s.io/v1");
        obj["kind"] = json!("Lease");
        let md = objects::metadata(obj);
        md.insert("name".into(), json!(self.name));
        md.insert("namespace".into(), json!(NAMESPACE));
        md.remove("resourceVersion");
        for field in ["labels", "annotations"] {
            if !md.get(field).is_some_and(Value::is_object) {
                md.insert(field.into(), json!({}));
            }
        }
        md["labels"][IDENTITY_LABEL] = json!("kube-apiserver");
        md["labels"][HOSTNAME_LABEL] = json!(self.opts.hostname);
        if let Some(annotations) = md["annotations"].as_object_mut() {
            match &self.opts.peer_address {
                Some(a) => annotations.insert(PEER_ADDRESS_ANNOTATION.into(), json!(a)),
                None => annotations.remove(PEER_ADDRESS_ANNOTATION),
            };
        }
        if !obj.get("spec").is_some_and(Value::is_object) {
            obj["spec"] = json!({});
        }
        obj["spec"]["holderIdentity"] = json!(self.holder);
        obj["spec"]["leaseDurationSeconds"] = json!(DURATION_SECONDS);
        obj["spec"]["renewTime"] = json!(clock::rfc3339_micros(now));
        objects::stamp(obj, &self.server_id);
    }

    /// Create or update the lease with a fresh `renewTime` (and our holder identity).
    pub async fn renew(&self, store: &Store) -> Result<(), StoreError> {
        let key = self.key();
        for _ in 0..3 {
            let now = self.opts.clock.apply(SystemTime::now());
            let updated = store
                .update(&key, false, |current| {
                    let mut obj = current.clone();
                    self.apply_to(&mut obj, now);
                    Ok::<_, StoreError>(obj)
                })
                .await;
            match updated {
                Ok(Ok(_)) => return Ok(()),
                Ok(Err(StoreError::NotFound)) => {}
                Ok(Err(e)) | Err(e) => return Err(e),
            }
            let mut obj = json!({});
            self.apply_to(&mut obj, now);
            objects::init_system_fields(&mut obj);
            match store.create(key.clone(), obj, false).await {
                Ok(_) => return Ok(()),
                // Someone created it meanwhile: update it.
                Err(StoreError::AlreadyExists) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::Conflict)
    }

    /// Flip renewing on or off; returns the new state.
    pub fn toggle_renewing(&self) -> bool {
        !self.renewing.fetch_xor(true, Ordering::SeqCst)
    }

    /// Renew every interval while renewing is on, until the process ends.
    pub async fn run(self: Arc<Self>, state: Arc<crate::server::AppState>) {
        let mut ticks = tokio::time::interval(self.opts.renew_interval);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            if !self.renewing.load(Ordering::SeqCst) {
                continue;
            }
            if let Err(e) = self.renew(&state.store).await {
                eprintln!(
                    "sim-apiserver[{}] cannot renew lease {}: {e:?}",
                    self.server_id, self.name
                );
            }
        }
    }

    /// Delete the lease if it is still ours (`--delete-lease-on-exit`).
    pub async fn release(&self, store: &Store) -> Result<(), StoreError> {
        let key = self.key();
        let Some(current) = store.get(&key).await? else {
            return Ok(());
        };
        if current
            .pointer("/spec/holderIdentity")
            .and_then(Value::as_str)
            != Some(&self.holder)
        {
            return Ok(());
        }
        match store.delete(&key, false).await {
            Ok(_) | Err(StoreError::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(addr: Option<&str>) -> IdentityLease {
        IdentityLease::new(
            "apiserver-a",
            LeaseOptions {
                hostname: "apiserver-a".into(),
                renew_interval: Duration::from_secs(10),
                peer_address: addr.map(String::from),
                delete_on_exit: false,
                clock: clock::Offset::default(),
            },
        )
    }

    #[tokio::test]
    async fn create_renew_recreate_release() {
        let store = Store::memory();
        let l = lease(Some("127.0.0.1:6443"));
        assert!(l.name.starts_with("apiserver-") && l.name.len() == "apiserver-".len() + 26);
        assert!(l.holder.starts_with(&format!("{}_", l.name)));
        l.renew(&store).await.unwrap();
        let first = store.get(&l.key()).await.unwrap().unwrap();
        assert_eq!(
            first["metadata"]["labels"][IDENTITY_LABEL],
            "kube-apiserver"
        );
        assert_eq!(first["metadata"]["labels"][HOSTNAME_LABEL], "apiserver-a");
        assert_eq!(
            first["metadata"]["annotations"][PEER_ADDRESS_ANNOTATION],
            "127.0.0.1:6443"
        );
        assert_eq!(first["spec"]["leaseDurationSeconds"], 3600);
        assert_eq!(first["spec"]["holderIdentity"], json!(l.holder));
        let renew = first["spec"]["renewTime"].as_str().unwrap();
        assert_eq!(renew.len(), "2024-05-01T12:34:56.123456Z".len());
        assert!(first["metadata"]["uid"].is_string());

        l.renew(&store).await.unwrap();
        let second = store.get(&l.key()).await.unwrap().unwrap();
        assert_eq!(second["metadata"]["uid"], first["metadata"]["uid"]);
        assert_ne!(
            second["metadata"]["resourceVersion"],
            first["metadata"]["resourceVersion"]
        );

        // A restart: same name, new holder, annotation dropped.
        let restarted = lease(None);
        assert_eq!(restarted.name, l.name);
        assert_ne!(restarted.holder, l.holder);
        restarted.renew(&store).await.unwrap();
        let third = store.get(&l.key()).await.unwrap().unwrap();
        assert_eq!(third["spec"]["holderIdentity"], json!(restarted.holder));
        assert!(third["metadata"]["annotations"]
            .get(PEER_ADDRESS_ANNOTATION)
            .is_none());

        // The old holder does not delete the new holder's lease.
        l.release(&store).await.unwrap();
        assert!(store.get(&l.key()).await.unwrap().is_some());
        restarted.release(&store).await.unwrap();
        assert!(store.get(&l.key()).await.unwrap().is_none());
        // Deleted while running: the next renewal recreates it.
        restarted.renew(&store).await.unwrap();
        assert!(store.get(&l.key()).await.unwrap().is_some());

        assert!(!l.toggle_renewing());
        assert!(l.toggle_renewing());
    }
}
