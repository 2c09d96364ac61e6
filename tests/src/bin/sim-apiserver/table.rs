//! Server-side printing: `meta.k8s.io` `Table` responses (what `kubectl get` asks for)
//! with the default `Name` and `Age` columns, one row per object.

use std::time::SystemTime;

use serde_json::{json, Value};

use crate::clock;
use crate::negotiate::TableVersion;

/// The `includeObject` query parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    Metadata,
    Object,
}

impl IncludeObject {
    pub fn from_query(v: Option<&str>) -> IncludeObject {
        match v {
            Some("None") => IncludeObject::None,
            Some("Object") => IncludeObject::Object,
            _ => IncludeObject::Metadata,
        }
    }
}

/// How to render rows of one request.
#[derive(Clone, Copy, Debug)]
pub struct TableOptions {
    pub version: TableVersion,
    pub include: IncludeObject,
}

fn column_definitions() -> Value {
    json!([
        {
            "name": "Name",
            "type": "string",
            "format": "name",
            "description": "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names",
            "priority": 0
        },
        {
            "name": "Age",
            "type": "string",
            "format": "",
            "description": "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.",
            "priority": 0
        }
    ])
}

/// The `Age` cell: time since `metadata.creationTimestamp`, kube-style (`<unknown>` if none).
pub fn age(obj: &Value) -> String {
    obj.pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
        .and_then(clock::parse_rfc3339)
        .map(|t| clock::human_duration(SystemTime::now().duration_since(t).unwrap_or_default()))
        .unwrap_or_else(|| "<unknown>".into())
}

fn row(obj: &Value, opts: TableOptions) -> Value {
    let name = obj.pointer("/metadata/name").cloned().unwrap_or(json!(""));
    let mut row = json!({ "cells": [name, age(obj)] });
    match opts.include {
        IncludeObject::None => {}
        IncludeObject::Object => row["object"] = obj.clone(),
        IncludeObject::Metadata => {
            row["object"] = json!({
                "kind": "PartialObjectMetadata",
                "apiVersion": opts.version.api_version(),
                "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
            })
        }
    }
    row
}

/// A Table of `objects`; `with_columns` is false for watch events after the first.
pub fn table(
    objects: &[Value],
    resource_version: &str,
    opts: TableOptions,
    with_columns: bool,
) -> Value {
    let rows: Vec<Value> = objects.iter().map(|o| row(o, opts)).collect();
    let mut t = json!({
        "kind": "Table",
        "apiVersion": opts.version.api_version(),
        "metadata": { "resourceVersion": resource_version },
    });
    t["columnDefinitions"] = if with_columns {
        column_definitions()
    } else {
        json!([])
    };
    t["rows"] = Value::Array(rows);
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_rows() {
        let now = clock::rfc3339(SystemTime::now() - std::time::Duration::from_secs(5));
        let obj = json!({"metadata": {"name": "c1", "namespace": "ns", "creationTimestamp": now}, "spec": {}});
        let opts = TableOptions {
            version: TableVersion::V1,
            include: IncludeObject::Metadata,
        };
        let t = table(std::slice::from_ref(&obj), "7", opts, true);
        assert_eq!(t["kind"], "Table");
        assert_eq!(t["apiVersion"], "meta.k8s.io/v1");
        assert_eq!(t["metadata"]["resourceVersion"], "7");
        assert_eq!(t["columnDefinitions"][0]["name"], "Name");
        assert_eq!(t["columnDefinitions"][1]["name"], "Age");
        let cells = t["rows"][0]["cells"].as_array().unwrap();
        assert_eq!(cells[0], "c1");
        assert!(matches!(cells[1].as_str(), Some("5s" | "6s")), "{cells:?}");
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
        assert_eq!(t["rows"][0]["object"]["metadata"]["namespace"], "ns");

        let full = TableOptions {
            version: TableVersion::V1Beta1,
            include: IncludeObject::Object,
        };
        let t = table(std::slice::from_ref(&obj), "7", full, false);
        assert_eq!(t["rows"][0]["object"], obj);
        assert_eq!(t["columnDefinitions"], json!([]));
        assert_eq!(t["apiVersion"], "meta.k8s.io/v1beta1");
    }
}
