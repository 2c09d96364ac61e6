//! Minimal OpenAPI documents, just enough for kubectl's client-side checks:
//! `/openapi/v3` lists one document per served group/version, and each document declares a
//! PATCH operation (with its `x-kubernetes-group-version-kind`) and the `fieldValidation`
//! query parameter for every patchable resource, so kubectl (1.26+) leaves validation to the
//! server instead of failing with "failed to download openapi". No schemas are included.
//! `/openapi/v2` is an empty document (empty protobuf, or `{}`-ish JSON): older kubectl
//! (e.g. 1.20) then finds no schema for a kind and skips client-side validation.

use std::collections::BTreeMap;

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

use crate::catalog::{Catalog, ResourceInfo};
use crate::{discovery, respond, status};

/// What kube-openapi answers for the protobuf v2 document (the `@` form clients send in
/// Accept is not a valid media type to send back: client-go fails to parse it).
const PROTO_V2: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

pub struct OpenApi {
    root: Vec<u8>,
    /// "api/v1" or "apis/<group>/<version>" -> document
    docs: BTreeMap<String, Vec<u8>>,
    v2_json: Vec<u8>,
}

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

fn query_param(name: &str) -> Value {
    json!({ "name": name, "in": "query", "schema": { "type": "string", "uniqueItems": true } })
}

fn path_param(name: &str) -> Value {
    json!({ "name": name, "in": "path", "required": true, "schema": { "type": "string", "uniqueItems": true } })
}

fn item_path(info: &ResourceInfo, gv: &str) -> (String, Value) {
    // Like kube: path parameters on the path item, options on the operation (kubectl
    // looks for `fieldValidation` among the PATCH operation's own parameters).
    let mut params = vec![path_param("name")];
    let path = if info.namespaced {
        params.push(path_param("namespace"));
        format!("/{gv}/namespaces/{{namespace}}/{}/{{name}}", info.resource)
    } else {
        format!("/{gv}/{}/{{name}}", info.resource)
    };
    params.push(query_param("pretty"));
    let op_params: Vec<Value> = ["dryRun", "fieldManager", "fieldValidation", "force"]
        .into_iter()
        .map(query_param)
        .collect();
    let op = json!({
        "description": format!("partially update the specified {}", info.kind),
        "operationId": format!("patch{}", info.kind),
        "parameters": op_params,
        "responses": { "200": { "description": "OK" } },
        "x-kubernetes-action": "patch",
        "x-kubernetes-group-version-kind": {
            "group": info.group, "version": info.version, "kind": info.kind
        },
    });
    (path, json!({ "parameters": params, "patch": op }))
}

fn gv_doc(
    group: &str,
    version: &str,
    resources: &BTreeMap<String, ResourceInfo>,
    git_version: &str,
) -> Value {
    let gv = gv_path(group, version);
    let paths: Map<String, Value> = resources
        .values()
        .filter(|r| r.allows("patch"))
        .map(|r| item_path(r, &gv))
        .collect();
    json!({
        "openapi": "3.0.0",
        "info": { "title": "Kubernetes", "version": git_version },
        "paths": paths,
        "components": {},
    })
}

impl OpenApi {
    pub fn new(catalog: &Catalog, git_version: &str) -> OpenApi {
        let mut docs = BTreeMap::new();
        let mut root = Map::new();
        for (g, v, resources) in catalog.group_versions() {
            let path = gv_path(g, v);
            let body = gv_doc(g, v, resources, git_version)
                .to_string()
                .into_bytes();
            let hash = discovery::etag(&body).trim_matches('"').to_string();
            root.insert(
                path.clone(),
                json!({ "serverRelativeURL": format!("/openapi/v3/{path}?hash={hash}") }),
            );
            docs.insert(path, body);
        }
        let v2 = json!({
            "swagger": "2.0",
            "info": { "title": "Kubernetes", "version": git_version },
            "paths": {},
            "definitions": {},
        });
        OpenApi {
            root: json!({ "paths": root }).to_string().into_bytes(),
            docs,
            v2_json: v2.to_string().into_bytes(),
        }
    }

    /// `GET /openapi/v3`
    pub fn v3_root(&self) -> Response {
        respond::raw_json(StatusCode::OK, self.root.clone())
    }

    /// `GET /openapi/v3/<api/v1 | apis/g/v>`
    pub fn v3_doc(&self, path: &str) -> Response {
        match self.docs.get(path) {
            Some(d) => respond::raw_json(StatusCode::OK, d.clone()),
            None => status::page_not_found(),
        }
    }

    /// `GET /openapi/v2`: an empty document in the format asked for.
    pub fn v2(&self, headers: &HeaderMap) -> Response {
        let accept = headers
            .get(header::ACCEPT)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        if accept.contains("protobuf") {
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, PROTO_V2)],
                Vec::<u8>::new(),
            )
                .into_response()
        } else {
            respond::raw_json(StatusCode::OK, self.v2_json.clone())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn documents_per_group_version() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/discovery/k8s-1.33");
        let read = |f: &str| -> Value {
            serde_json::from_slice(&std::fs::read(dir.join(f)).unwrap()).unwrap()
        };
        let cat = Catalog::build(&read("aggregated_v2.json"), &read("api__v1.json"));
        let o = OpenApi::new(&cat, "v1.33.0");
        let root: Value = serde_json::from_slice(&o.root).unwrap();
        let url = root["paths"]["apis/resource.k8s.io/v1beta2"]["serverRelativeURL"]
            .as_str()
            .unwrap();
        assert!(url.starts_with("/openapi/v3/apis/resource.k8s.io/v1beta2?hash="));
        assert!(root["paths"].get("api/v1").is_some());
        let doc: Value = serde_json::from_slice(&o.docs["apis/resource.k8s.io/v1beta2"]).unwrap();
        let p = &doc["paths"]
            ["/apis/resource.k8s.io/v1beta2/namespaces/{namespace}/resourceclaims/{name}"];
        assert_eq!(
            p["patch"]["x-kubernetes-group-version-kind"]["kind"],
            "ResourceClaim"
        );
        assert!(p["patch"]["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["name"] == "fieldValidation"));
        let core: Value = serde_json::from_slice(&o.docs["api/v1"]).unwrap();
        assert!(core["paths"].get("/api/v1/nodes/{name}").is_some());
    }
}
