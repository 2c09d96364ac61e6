//! What the apiserver does to request bodies before storing them: decode and check the type
//! meta, default `apiVersion`/`kind`, set the namespace, keep system fields (uid,
//! creationTimestamp) across updates, and stamp `skewgate.test/served-by`.

use std::time::SystemTime;

use serde_json::{json, Map, Value};

use crate::catalog::ResourceInfo;
use crate::{clock, ids, status};

/// The annotation that tells tests which apiserver stored an object.
pub const SERVED_BY: &str = "skewgate.test/served-by";

/// Decode a request body that must be a JSON object.
pub fn decode(body: &[u8], info: &ResourceInfo) -> Result<Value, Value> {
    let unrecognized = |why: String| {
        status::bad_request(&format!(
            "the object provided is unrecognized (must be of type {}): {why}",
            info.kind
        ))
    };
    match serde_json::from_slice::<Value>(body) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(other) => Err(unrecognized(format!(
            "couldn't get version/kind; json parse error: cannot unmarshal {} into Go value of type struct",
            type_name(&other)
        ))),
        Err(e) => Err(unrecognized(format!("couldn't get version/kind; json parse error: {e}"))),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Fill in a missing `apiVersion`/`kind`; reject ones that name another type.
pub fn check_type_meta(obj: &mut Value, info: &ResourceInfo) -> Result<(), Value> {
    let expected = info.api_version();
    match obj.get("apiVersion").and_then(Value::as_str) {
        None | Some("") => obj["apiVersion"] = json!(expected),
        Some(v) if v == expected => {}
        Some(v) => {
            return Err(status::bad_request(&format!(
                "the API version in the data ({v}) does not match the expected API version ({expected})"
            )))
        }
    }
    match obj.get("kind").and_then(Value::as_str) {
        None | Some("") => obj["kind"] = json!(info.kind),
        Some(k) if k == info.kind => {}
        Some(k) => {
            return Err(status::bad_request(&format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                info.kind
            )))
        }
    }
    Ok(())
}

/// `metadata` as a mutable map, created if missing or not an object.
pub fn metadata(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    obj["metadata"].as_object_mut().expect("metadata object")
}

pub fn name_of(obj: &Value) -> &str {
    obj.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// Check `metadata.namespace` against the request's and set it (clear it if cluster-scoped).
pub fn set_namespace(obj: &mut Value, info: &ResourceInfo, namespace: &str) -> Result<(), Value> {
    let md = metadata(obj);
    if !info.namespaced {
        md.remove("namespace");
        return Ok(());
    }
    match md.get("namespace").and_then(Value::as_str) {
        None | Some("") => {
            md.insert("namespace".into(), json!(namespace));
            Ok(())
        }
        Some(ns) if ns == namespace => Ok(()),
        Some(_) => Err(status::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
    }
}

/// Add `skewgate.test/served-by: <id>` to the object's annotations.
pub fn stamp(obj: &mut Value, server_id: &str) {
    let md = metadata(obj);
    if !md.get("annotations").is_some_and(Value::is_object) {
        md.insert("annotations".into(), json!({}));
    }
    md["annotations"][SERVED_BY] = json!(server_id);
}

/// System fields of a new object: uid, creationTimestamp, no client resourceVersion.
pub fn init_system_fields(obj: &mut Value) {
    let md = metadata(obj);
    md.insert("uid".into(), json!(ids::uid()));
    md.insert(
        "creationTimestamp".into(),
        json!(clock::rfc3339(SystemTime::now())),
    );
    md.remove("resourceVersion");
    md.remove("deletionTimestamp");
}

/// Carry the fields clients cannot change from the stored object into its replacement.
pub fn keep_system_fields(new: &mut Value, current: &Value) {
    let md = metadata(new);
    for f in ["uid", "creationTimestamp", "namespace", "name"] {
        match current.pointer(&format!("/metadata/{f}")) {
            Some(v) => md.insert(f.into(), v.clone()),
            None => md.remove(f),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn info(namespaced: bool) -> ResourceInfo {
        ResourceInfo {
            group: "resource.k8s.io".into(),
            version: "v1beta2".into(),
            resource: "resourceclaims".into(),
            kind: "ResourceClaim".into(),
            namespaced,
            verbs: vec![],
            subresources: BTreeMap::new(),
        }
    }

    #[test]
    fn decode_and_type_meta() {
        let i = info(true);
        assert_eq!(decode(b"[1]", &i).unwrap_err()["code"], 400);
        assert_eq!(decode(b"not json", &i).unwrap_err()["reason"], "BadRequest");
        let mut o = decode(br#"{"metadata":{"name":"a"}}"#, &i).unwrap();
        check_type_meta(&mut o, &i).unwrap();
        assert_eq!(o["apiVersion"], "resource.k8s.io/v1beta2");
        assert_eq!(o["kind"], "ResourceClaim");
        let mut wrong = json!({"apiVersion": "resource.k8s.io/v1alpha2"});
        assert!(check_type_meta(&mut wrong, &i).is_err());
    }

    #[test]
    fn namespace_and_stamp() {
        let mut o = json!({"metadata": {"name": "a"}});
        set_namespace(&mut o, &info(true), "ns1").unwrap();
        assert_eq!(o["metadata"]["namespace"], "ns1");
        assert!(set_namespace(&mut o, &info(true), "ns2").is_err());
        set_namespace(&mut o, &info(false), "").unwrap();
        assert!(o["metadata"].get("namespace").is_none());
        stamp(&mut o, "apiserver-a");
        assert_eq!(o["metadata"]["annotations"][SERVED_BY], "apiserver-a");
        init_system_fields(&mut o);
        let mut replaced = json!({"metadata": {"name": "a", "uid": "forged"}});
        keep_system_fields(&mut replaced, &o);
        assert_eq!(replaced["metadata"]["uid"], o["metadata"]["uid"]);
    }
}
