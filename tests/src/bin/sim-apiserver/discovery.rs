//! Pure derivations between discovery formats, all from the fixture documents:
//! legacy `APIGroupList` / `APIGroup` / `APIResourceList` from the aggregated `/apis`
//! document, and the aggregated core-group document (`/api`) from the legacy `api__v1.json`.

use serde_json::{json, Map, Value};

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

fn items(agg: &Value) -> &[Value] {
    agg.get("items")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn versions(group: &Value) -> &[Value] {
    group
        .get("versions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn group_name(group: &Value) -> &str {
    group
        .get("metadata")
        .map(|m| str_of(m, "name"))
        .unwrap_or("")
}

/// Find a group of the aggregated document by name.
pub fn find_group<'a>(agg: &'a Value, name: &str) -> Option<&'a Value> {
    items(agg).iter().find(|g| group_name(g) == name)
}

/// Find one version entry (with its `resources`) of a group.
pub fn find_version<'a>(agg: &'a Value, group: &str, version: &str) -> Option<&'a Value> {
    versions(find_group(agg, group)?)
        .iter()
        .find(|v| str_of(v, "version") == version)
}

/// Legacy `APIGroup` for one aggregated group entry; the first version is preferred.
fn legacy_group_of(group: &Value) -> Value {
    let name = group_name(group);
    let vs: Vec<Value> = versions(group)
        .iter()
        .map(|v| {
            let ver = str_of(v, "version");
            json!({ "groupVersion": format!("{name}/{ver}"), "version": ver })
        })
        .collect();
    let mut g = json!({ "name": name, "versions": vs });
    if let Some(first) = g["versions"].get(0).cloned() {
        g["preferredVersion"] = first;
    }
    g
}

/// `GET /apis` without the aggregated Accept: the legacy `APIGroupList`.
pub fn legacy_group_list(agg: &Value) -> Value {
    let groups: Vec<Value> = items(agg).iter().map(legacy_group_of).collect();
    json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": groups })
}

/// `GET /apis/<group>`: the legacy `APIGroup`, or `None` if the group is not served.
pub fn legacy_group(agg: &Value, group: &str) -> Option<Value> {
    let mut g = legacy_group_of(find_group(agg, group)?);
    let obj = g.as_object_mut()?;
    let mut out = Map::new();
    out.insert("kind".into(), json!("APIGroup"));
    out.insert("apiVersion".into(), json!("v1"));
    out.append(obj);
    Some(Value::Object(out))
}

/// Copy `group`/`version` of an aggregated `responseKind` into a legacy entry when they
/// name something other than the listing's own group/version (e.g. `deployments/scale` ->
/// `autoscaling/v1 Scale`). Empty fields mean "same as the listing".
fn legacy_response_kind(entry: &mut Map<String, Value>, rk: &Value, group: &str, version: &str) {
    entry.insert("kind".into(), json!(str_of(rk, "kind")));
    let (g, v) = (str_of(rk, "group"), str_of(rk, "version"));
    let g = if g.is_empty() && v.is_empty() {
        group
    } else {
        g
    };
    let v = if v.is_empty() { version } else { v };
    if g != group || v != version {
        entry.insert("group".into(), json!(g));
        entry.insert("version".into(), json!(v));
    }
}

fn copy_list(from: &Value, key: &str, to: &mut Map<String, Value>, as_key: &str) {
    if let Some(list) = from.get(key).and_then(Value::as_array) {
        if !list.is_empty() {
            to.insert(as_key.into(), Value::Array(list.clone()));
        }
    }
}

/// `GET /apis/<group>/<version>`: the legacy `APIResourceList` (resources and subresources
/// flattened as `res/sub`), or `None` if that group/version is not served.
pub fn legacy_resource_list(agg: &Value, group: &str, version: &str) -> Option<Value> {
    let ver = find_version(agg, group, version)?;
    let mut out = Vec::new();
    for r in ver
        .get("resources")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = str_of(r, "resource");
        let namespaced = str_of(r, "scope") == "Namespaced";
        let mut e = Map::new();
        e.insert("name".into(), json!(name));
        e.insert("singularName".into(), json!(str_of(r, "singularResource")));
        e.insert("namespaced".into(), json!(namespaced));
        legacy_response_kind(
            &mut e,
            r.get("responseKind").unwrap_or(&Value::Null),
            group,
            version,
        );
        e.insert(
            "verbs".into(),
            r.get("verbs").cloned().unwrap_or_else(|| json!([])),
        );
        copy_list(r, "shortNames", &mut e, "shortNames");
        copy_list(r, "categories", &mut e, "categories");
        out.push(Value::Object(e));
        for s in r
            .get("subresources")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let mut e = Map::new();
            e.insert(
                "name".into(),
                json!(format!("{name}/{}", str_of(s, "subresource"))),
            );
            e.insert("singularName".into(), json!(""));
            e.insert("namespaced".into(), json!(namespaced));
            legacy_response_kind(
                &mut e,
                s.get("responseKind").unwrap_or(&Value::Null),
                group,
                version,
            );
            e.insert(
                "verbs".into(),
                s.get("verbs").cloned().unwrap_or_else(|| json!([])),
            );
            out.push(Value::Object(e));
        }
    }
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": format!("{group}/{version}"),
        "resources": out,
    }))
}

/// The aggregated `responseKind` of a legacy core entry (its own group/version if it names
/// one, e.g. `pods/eviction` -> `policy/v1 Eviction`, else core `v1`).
fn aggregated_response_kind(entry: &Value) -> Value {
    let version = match str_of(entry, "version") {
        "" => "v1",
        v => v,
    };
    json!({ "group": str_of(entry, "group"), "version": version, "kind": str_of(entry, "kind") })
}

/// `GET /api` with the aggregated Accept: an `APIGroupDiscoveryList` holding only the core
/// group, derived from the legacy core v1 `APIResourceList`. `api_version` is the negotiated
/// `apidiscovery.k8s.io/...` version.
pub fn aggregated_core(core_v1: &Value, api_version: &str) -> Value {
    let entries = core_v1
        .get("resources")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let mut resources: Vec<Value> = Vec::new();
    for e in entries {
        let name = str_of(e, "name");
        if name.contains('/') {
            continue;
        }
        let namespaced = e
            .get("namespaced")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let mut r = Map::new();
        r.insert("resource".into(), json!(name));
        r.insert("responseKind".into(), aggregated_response_kind(e));
        r.insert(
            "scope".into(),
            json!(if namespaced { "Namespaced" } else { "Cluster" }),
        );
        r.insert("singularResource".into(), json!(str_of(e, "singularName")));
        r.insert(
            "verbs".into(),
            e.get("verbs").cloned().unwrap_or_else(|| json!([])),
        );
        copy_list(e, "shortNames", &mut r, "shortNames");
        copy_list(e, "categories", &mut r, "categories");
        let subs: Vec<Value> = entries
            .iter()
            .filter_map(|s| {
                let (parent, sub) = str_of(s, "name").split_once('/')?;
                (parent == name).then(|| {
                    json!({
                        "subresource": sub,
                        "responseKind": aggregated_response_kind(s),
                        "verbs": s.get("verbs").cloned().unwrap_or_else(|| json!([])),
                    })
                })
            })
            .collect();
        if !subs.is_empty() {
            r.insert("subresources".into(), Value::Array(subs));
        }
        resources.push(Value::Object(r));
    }
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": api_version,
        "metadata": {},
        "items": [{
            "metadata": { "name": "" },
            "versions": [{ "version": "v1", "resources": resources, "freshness": "Current" }],
        }],
    })
}

/// The aggregated `/apis` fixture bytes for the negotiated version: verbatim for v2; for
/// v2beta1 only the top-level `apiVersion` string is rewritten (first occurrence).
pub fn rewrite_api_version(raw: &[u8], api_version: &str) -> Vec<u8> {
    const V2: &[u8] = b"\"apidiscovery.k8s.io/v2\"";
    let target = format!("\"{api_version}\"");
    match raw.windows(V2.len()).position(|w| w == V2) {
        Some(at) if target.as_bytes() != V2 => {
            let mut out = Vec::with_capacity(raw.len() + 8);
            out.extend_from_slice(&raw[..at]);
            out.extend_from_slice(target.as_bytes());
            out.extend_from_slice(&raw[at + V2.len()..]);
            out
        }
        _ => raw.to_vec(),
    }
}

/// A quoted hex hash of a body, used as the discovery `ETag` (128-bit FNV-1a).
pub fn etag(body: &[u8]) -> String {
    let mut h: u128 = 0x6c62272e07bb014262b821756295c58d;
    for b in body {
        h ^= u128::from(*b);
        h = h.wrapping_mul(0x0000000001000000000000000000013B);
    }
    format!("\"{h:032X}\"")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn fixture(release: &str, file: &str) -> Value {
        let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/discovery")
            .join(release)
            .join(file);
        serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
    }

    #[test]
    fn legacy_group_list_from_aggregated() {
        let agg = fixture("k8s-1.33", "aggregated_v2.json");
        let list = legacy_group_list(&agg);
        assert_eq!(list["kind"], "APIGroupList");
        let groups = list["groups"].as_array().unwrap();
        assert_eq!(groups.len(), 22);
        let res = groups
            .iter()
            .find(|g| g["name"] == "resource.k8s.io")
            .unwrap();
        assert_eq!(
            res["preferredVersion"],
            json!({"groupVersion":"resource.k8s.io/v1beta2","version":"v1beta2"})
        );
        assert_eq!(res["versions"].as_array().unwrap().len(), 3);
        assert!(groups.iter().all(|g| g["name"] != ""));
    }

    #[test]
    fn legacy_group_and_unknown() {
        let agg = fixture("k8s-1.30", "aggregated_v2.json");
        let g = legacy_group(&agg, "autoscaling").unwrap();
        assert_eq!(g["kind"], "APIGroup");
        assert_eq!(g["preferredVersion"]["version"], "v2");
        assert!(legacy_group(&agg, "nope.example.com").is_none());
        assert!(legacy_resource_list(&agg, "resource.k8s.io", "v1beta2").is_none());
    }

    #[test]
    fn legacy_resource_list_flattens_subresources() {
        let agg = fixture("k8s-1.33", "aggregated_v2.json");
        let list = legacy_resource_list(&agg, "apps", "v1").unwrap();
        assert_eq!(list["groupVersion"], "apps/v1");
        let rs = list["resources"].as_array().unwrap();
        let dep = rs.iter().find(|r| r["name"] == "deployments").unwrap();
        assert_eq!(dep["kind"], "Deployment");
        assert_eq!(dep["namespaced"], true);
        assert_eq!(dep["singularName"], "deployment");
        assert_eq!(dep["shortNames"], json!(["deploy"]));
        assert_eq!(dep["categories"], json!(["all"]));
        assert!(dep.get("group").is_none());
        let scale = rs
            .iter()
            .find(|r| r["name"] == "deployments/scale")
            .unwrap();
        assert_eq!(scale["kind"], "Scale");
        assert_eq!(scale["group"], "autoscaling");
        assert_eq!(scale["version"], "v1");
        assert_eq!(scale["verbs"], json!(["get", "patch", "update"]));
        let status = rs
            .iter()
            .find(|r| r["name"] == "deployments/status")
            .unwrap();
        assert!(status.get("group").is_none());

        let claims = legacy_resource_list(&agg, "resource.k8s.io", "v1beta2").unwrap();
        let rc = claims["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "resourceclaims")
            .unwrap();
        assert_eq!(rc["kind"], "ResourceClaim");
        let cs = legacy_resource_list(&agg, "storage.k8s.io", "v1").unwrap();
        let sc = cs["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "storageclasses")
            .unwrap();
        assert_eq!(sc["namespaced"], false);
    }

    #[test]
    fn aggregated_core_from_legacy() {
        let core = fixture("k8s-1.33", "api__v1.json");
        let doc = aggregated_core(&core, "apidiscovery.k8s.io/v2");
        assert_eq!(doc["kind"], "APIGroupDiscoveryList");
        let items = doc["items"].as_array().unwrap();
        assert_eq!(items.len(), 1);
        assert_eq!(items[0]["metadata"]["name"], "");
        let v = &items[0]["versions"][0];
        assert_eq!(v["version"], "v1");
        assert_eq!(v["freshness"], "Current");
        let rs = v["resources"].as_array().unwrap();
        assert!(rs
            .iter()
            .all(|r| !r["resource"].as_str().unwrap().contains('/')));
        let pods = rs.iter().find(|r| r["resource"] == "pods").unwrap();
        assert_eq!(pods["scope"], "Namespaced");
        assert_eq!(
            pods["responseKind"],
            json!({"group":"","version":"v1","kind":"Pod"})
        );
        assert_eq!(pods["shortNames"], json!(["po"]));
        let subs = pods["subresources"].as_array().unwrap();
        let ev = subs
            .iter()
            .find(|s| s["subresource"] == "eviction")
            .unwrap();
        assert_eq!(
            ev["responseKind"],
            json!({"group":"policy","version":"v1","kind":"Eviction"})
        );
        assert!(subs.iter().any(|s| s["subresource"] == "resize"));
        let ns = rs.iter().find(|r| r["resource"] == "namespaces").unwrap();
        assert_eq!(ns["scope"], "Cluster");
        assert_eq!(ns["subresources"].as_array().unwrap().len(), 2);
        // Every legacy entry is accounted for: top-level resources plus subresources.
        let total: usize = rs
            .iter()
            .map(|r| 1 + r["subresources"].as_array().map_or(0, Vec::len))
            .sum();
        assert_eq!(total, core["resources"].as_array().unwrap().len());
    }

    #[test]
    fn rewrite_only_api_version() {
        let raw = br#"{"apiVersion": "apidiscovery.k8s.io/v2", "items": [], "x": "apidiscovery.k8s.io/v2"}"#;
        let out = rewrite_api_version(raw, "apidiscovery.k8s.io/v2beta1");
        assert_eq!(
            out,
            br#"{"apiVersion": "apidiscovery.k8s.io/v2beta1", "items": [], "x": "apidiscovery.k8s.io/v2"}"#
        );
        assert_eq!(
            rewrite_api_version(raw, "apidiscovery.k8s.io/v2"),
            raw.to_vec()
        );
        assert_ne!(etag(raw), etag(&out));
        assert!(etag(raw).starts_with('"') && etag(raw).ends_with('"'));
    }
}
