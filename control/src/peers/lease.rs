//! The identity Lease as the watcher reads it: leniently.
//!
//! k8s-openapi's `Lease` fails to deserialize when any of its fields is out of its range — a
//! `spec.renewTime` of `9999-12-31T23:59:59Z` is a valid time for kube-apiserver (Go) but not
//! for `jiff::Timestamp` — and kube-runtime's watcher then fails the whole list or watch, for
//! every lease, again on every retry. Anyone who can write a Lease in `kube-system` could blind
//! the control plane that way. [`IdentityLease`] never fails to deserialize: `spec` is kept as
//! JSON and only the fields we use are read, by [`lease_info`]; `metadata` is k8s-openapi's
//! `ObjectMeta` when it parses, and otherwise the plain fields the watcher and we need
//! (name, namespace, uid, resourceVersion, string labels and annotations) salvaged from it. A
//! field we read that cannot be read makes [`LeaseInfo::malformed`] say which and why, and the
//! model ignores that lease alone (see [`super::model`]). Fields we do not read
//! (`acquireTime`, `leaseDurationSeconds`, ...) are not looked at.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use k8s_openapi::NamespaceResourceScope;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::address::{loggable, PEER_ADVERTISE_ADDRESS_ANNOTATION};
use super::model::{LeaseField, LeaseInfo, MalformedLease, HOSTNAME_LABEL};

/// A `coordination.k8s.io/v1` Lease that always deserializes (see the module doc).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct IdentityLease {
    pub metadata: ObjectMeta,
    /// `spec`, as sent (`None` if absent or null).
    pub spec: Option<Value>,
    /// Why `metadata` did not parse as `ObjectMeta` (then it holds what could be salvaged).
    pub metadata_error: Option<String>,
}

impl IdentityLease {
    /// From the JSON of a Lease (anything else gives an empty lease).
    pub fn from_value(mut value: Value) -> IdentityLease {
        let spec = value
            .get_mut("spec")
            .map(Value::take)
            .filter(|s| !s.is_null());
        let md = value
            .get_mut("metadata")
            .map(Value::take)
            .unwrap_or(Value::Null);
        let (metadata, metadata_error) = if md.is_null() {
            (ObjectMeta::default(), None)
        } else {
            match ObjectMeta::deserialize(&md) {
                Ok(m) => (m, None),
                Err(e) => (salvage(&md), Some(e.to_string())),
            }
        };
        IdentityLease {
            metadata,
            spec,
            metadata_error,
        }
    }

    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }
}

/// The plain fields of metadata that did not parse as a whole.
fn salvage(md: &Value) -> ObjectMeta {
    let string = |k: &str| md.get(k).and_then(Value::as_str).map(String::from);
    let map = |k: &str| {
        md.get(k).and_then(Value::as_object).map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect::<BTreeMap<_, _>>()
        })
    };
    ObjectMeta {
        name: string("name"),
        namespace: string("namespace"),
        uid: string("uid"),
        resource_version: string("resourceVersion"),
        labels: map("labels"),
        annotations: map("annotations"),
        ..Default::default()
    }
}

impl<'de> Deserialize<'de> for IdentityLease {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(IdentityLease::from_value(Value::deserialize(deserializer)?))
    }
}

impl kube::Resource for IdentityLease {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "Lease".into()
    }

    fn group(_: &()) -> Cow<'_, str> {
        "coordination.k8s.io".into()
    }

    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }

    fn plural(_: &()) -> Cow<'_, str> {
        "leases".into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// A `MicroTime` as kube writes it (RFC 3339), within what k8s-openapi represents.
pub fn parse_micro_time(s: &str) -> Result<SystemTime, String> {
    let t: Timestamp = s.parse().map_err(|e| format!("{e}"))?;
    let (secs, nanos) = (t.as_second(), t.subsec_nanosecond());
    let since_epoch = Duration::new(secs.unsigned_abs(), 0);
    let whole = if secs >= 0 {
        UNIX_EPOCH.checked_add(since_epoch)
    } else {
        UNIX_EPOCH.checked_sub(since_epoch)
    };
    // jiff keeps the fraction of a negative time negative.
    whole
        .and_then(|w| {
            if nanos >= 0 {
                w.checked_add(Duration::from_nanos(nanos as u64))
            } else {
                w.checked_sub(Duration::from_nanos(nanos.unsigned_abs() as u64))
            }
        })
        .ok_or_else(|| "not representable".to_string())
}

fn malformed(field: LeaseField, detail: String) -> Option<MalformedLease> {
    Some(MalformedLease { field, detail })
}

/// A JSON value for a log line: short, escaped.
fn shown(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{:?}", loggable(s)),
        other => loggable(&other.to_string()),
    }
}

/// The plain data of one identity lease; [`LeaseInfo::malformed`] says what could not be read.
pub fn lease_info(lease: &IdentityLease) -> LeaseInfo {
    let md = &lease.metadata;
    let mut info = LeaseInfo {
        name: md.name.clone().unwrap_or_default(),
        hostname: md
            .labels
            .as_ref()
            .and_then(|l| l.get(HOSTNAME_LABEL))
            .cloned(),
        peer_advertise_address: md
            .annotations
            .as_ref()
            .and_then(|a| a.get(PEER_ADVERTISE_ADDRESS_ANNOTATION))
            .cloned(),
        ..Default::default()
    };
    let field = |name: &str| {
        lease
            .spec
            .as_ref()
            .and_then(|s| s.get(name))
            .filter(|v| !v.is_null())
    };
    info.malformed = if let Some(e) = &lease.metadata_error {
        malformed(LeaseField::Metadata, loggable(e))
    } else if lease.spec.as_ref().is_some_and(|s| !s.is_object()) {
        malformed(
            LeaseField::Spec,
            format!(
                "{}: not an object",
                shown(lease.spec.as_ref().unwrap_or(&Value::Null))
            ),
        )
    } else {
        None
    };
    if info.malformed.is_some() {
        return info;
    }
    match field("holderIdentity") {
        None => {}
        Some(Value::String(h)) => info.holder_identity = Some(h.clone()),
        Some(v) => {
            info.malformed = malformed(
                LeaseField::HolderIdentity,
                format!("{}: not a string", shown(v)),
            );
            return info;
        }
    }
    match field("renewTime") {
        None => {}
        Some(Value::String(s)) => match parse_micro_time(s) {
            Ok(t) => info.renew_time = Some(t),
            Err(e) => {
                info.malformed = malformed(
                    LeaseField::RenewTime,
                    format!("{}: {}", shown(&Value::String(s.clone())), loggable(&e)),
                )
            }
        },
        Some(v) => {
            info.malformed = malformed(LeaseField::RenewTime, format!("{}: not a string", shown(v)))
        }
    }
    info
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lease(spec: Value) -> Value {
        json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": "apiserver-abc",
                "namespace": "kube-system",
                "resourceVersion": "42",
                "creationTimestamp": "2024-05-01T12:00:00Z",
                "labels": {
                    "apiserver.kubernetes.io/identity": "kube-apiserver",
                    "kubernetes.io/hostname": "cp-1"
                },
                "annotations": {"kubernetes.io/peer-advertise-address": "10.0.0.1:6444"}
            },
            "spec": spec
        })
    }

    fn info(v: Value) -> LeaseInfo {
        lease_info(&serde_json::from_value(v).unwrap())
    }

    #[test]
    fn a_well_formed_lease() {
        let i = info(lease(json!({
            "holderIdentity": "apiserver-abc_0b3c",
            "leaseDurationSeconds": 3600,
            "renewTime": "2024-05-01T12:34:56.123456Z"
        })));
        assert_eq!(i.name, "apiserver-abc");
        assert_eq!(i.holder_identity.as_deref(), Some("apiserver-abc_0b3c"));
        assert_eq!(i.hostname.as_deref(), Some("cp-1"));
        assert_eq!(i.peer_advertise_address.as_deref(), Some("10.0.0.1:6444"));
        assert_eq!(
            i.renew_time,
            Some(UNIX_EPOCH + Duration::from_micros(1_714_566_896_123_456))
        );
        assert_eq!(i.malformed, None);

        let bare = info(json!({"metadata": {"name": "apiserver-x"}}));
        assert_eq!(
            bare,
            LeaseInfo {
                name: "apiserver-x".into(),
                ..Default::default()
            }
        );
    }

    #[test]
    fn what_breaks_k8s_openapi_is_one_malformed_lease_here() {
        use k8s_openapi::api::coordination::v1::Lease;
        let year_9999 = lease(json!({
            "holderIdentity": "apiserver-abc_0b3c",
            "renewTime": "9999-12-31T23:59:59Z",
            "acquireTime": "also nonsense",
            "leaseDurationSeconds": "not ours to read"
        }));
        // The failure this module exists for.
        assert!(serde_json::from_value::<Lease>(year_9999.clone()).is_err());
        let l: IdentityLease = serde_json::from_value(year_9999).unwrap();
        assert_eq!(l.metadata.resource_version.as_deref(), Some("42"));
        let i = lease_info(&l);
        assert_eq!(i.name, "apiserver-abc");
        assert_eq!(i.holder_identity.as_deref(), Some("apiserver-abc_0b3c"));
        let m = i.malformed.unwrap();
        assert_eq!(m.field, LeaseField::RenewTime);
        assert!(
            m.detail.starts_with("\"9999-12-31T23:59:59Z\": "),
            "{}",
            m.detail
        );

        let cases = [
            (json!({"renewTime": "yesterday"}), LeaseField::RenewTime),
            (json!({"renewTime": 1714566896}), LeaseField::RenewTime),
            (json!({"holderIdentity": 7}), LeaseField::HolderIdentity),
            (json!(["not", "an", "object"]), LeaseField::Spec),
        ];
        for (spec, want) in cases {
            let i = info(lease(spec.clone()));
            assert_eq!(i.malformed.map(|m| m.field), Some(want), "{spec}");
        }
        // The latest time k8s-openapi represents is fine (and simply far in the future).
        let i = info(lease(json!({"renewTime": "9999-12-30T00:00:00Z"})));
        assert_eq!(i.malformed, None);
        assert_eq!(
            i.renew_time,
            Some(UNIX_EPOCH + Duration::from_secs(253_402_128_000))
        );
        // Null is absent.
        let i = info(lease(json!({"renewTime": null, "holderIdentity": null})));
        assert_eq!(
            (i.malformed, i.renew_time, i.holder_identity),
            (None, None, None)
        );
    }

    #[test]
    fn metadata_that_does_not_parse_is_salvaged_for_the_watch() {
        let mut v = lease(json!({"renewTime": "2024-05-01T12:34:56.123456Z"}));
        v["metadata"]["creationTimestamp"] = json!("9999-12-31T23:59:59Z");
        v["metadata"]["labels"]["odd"] = json!(1);
        let l: IdentityLease = serde_json::from_value(v).unwrap();
        assert!(l.metadata_error.is_some());
        assert_eq!(l.name(), "apiserver-abc");
        assert_eq!(l.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(
            l.metadata
                .labels
                .as_ref()
                .unwrap()
                .get(HOSTNAME_LABEL)
                .map(String::as_str),
            Some("cp-1")
        );
        let i = lease_info(&l);
        assert_eq!(i.malformed.map(|m| m.field), Some(LeaseField::Metadata));
    }

    #[test]
    fn a_list_with_one_bad_lease_still_lists_the_others() {
        let list = json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "LeaseList",
            "metadata": {"resourceVersion": "7"},
            "items": [
                lease(json!({"renewTime": "9999-12-31T23:59:59Z"})),
                lease(json!({"renewTime": "2024-05-01T12:34:56.123456Z"})),
            ]
        });
        let list: kube::core::ObjectList<IdentityLease> = serde_json::from_value(list).unwrap();
        assert_eq!(list.items.len(), 2);
        assert!(lease_info(&list.items[0]).malformed.is_some());
        assert!(lease_info(&list.items[1]).malformed.is_none());
    }
}
