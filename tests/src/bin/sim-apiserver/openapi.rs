//! OpenAPI documents. `/openapi/v3` lists one document per served group/version with its
//! `serverRelativeURL`, `/openapi/v3/<path>?hash=<hash>`, the hash computed as kube-openapi's
//! handler3 does (upper-case hex SHA-512 of the served JSON). A stale hash is redirected (301)
//! to the current URL and only a matching one is cached `public, immutable` with `Expires` a
//! year ahead, as kube does. `--openapi-wrong-documents` makes a peer that lies: each document
//! it serves is not the one its hash names (a marker added), with the same caching headers.
//!
//! Where the OpenAPI fixture folder has kube-apiserver's real document of a group-version
//! (`apis__<group>__<version>_openapi.json`, see `tests/fixtures/openapi/PROVENANCE.md`), it
//! is served verbatim, schemas included: `kubectl explain` and client-side validation work on
//! it, and [`OpenApi::schema_of`] gives the server its schema for strict field validation.
//! Every other group-version gets a synthetic document without schemas: a PATCH operation
//! (with its `x-kubernetes-group-version-kind`) and the `fieldValidation` query parameter for
//! every patchable resource, so kubectl (1.26+) leaves validation to the server instead of
//! failing with "failed to download openapi".
//! `/openapi/v2` is an empty document (empty protobuf, or `{}`-ish JSON): older kubectl
//! (e.g. 1.20) then finds no schema for a kind and skips client-side validation.

use std::collections::BTreeMap;

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha512};

use crate::catalog::{Catalog, ResourceInfo};
use crate::{respond, status};

/// What kube-openapi answers for the protobuf v2 document (the `@` form clients send in
/// Accept is not a valid media type to send back: client-go fails to parse it).
const PROTO_V2: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

/// The field `--openapi-wrong-documents` adds to every document (an OpenAPI extension, which
/// clients ignore): its value is the apiserver's id.
pub const WRONG_DOCUMENT_MARKER: &str = "x-sim-not-the-document-of-this-hash";

/// kube-openapi's `Expires` for a document fetched by its hash: a year from now, in Go's
/// `time.RFC1123` on a host in UTC (`UTC`, not the `GMT` RFC 9110 asks for; client-go accepts
/// it).
fn expires_in_a_year() -> String {
    let year = std::time::Duration::from_secs(365 * 24 * 3600);
    httpdate::fmt_http_date(std::time::SystemTime::now() + year).replace("GMT", "UTC")
}

pub struct OpenApi {
    root: Vec<u8>,
    /// "api/v1" or "apis/<group>/<version>" -> document and its hash
    docs: BTreeMap<String, (Vec<u8>, String)>,
    /// The real documents, parsed: for the schemas of their kinds.
    real: BTreeMap<String, Value>,
    v2_json: Vec<u8>,
}

/// kube-openapi's `computeETag`: `fmt.Sprintf("%X", sha512.Sum512(data))`.
pub fn hash(body: &[u8]) -> String {
    Sha512::digest(body)
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect()
}

/// The real documents in an OpenAPI fixture folder, by root path: `apis__<g>__<v>_openapi.json`
/// is `apis/<g>/<v>` (how kube's `hack/update-openapi-spec.sh` names them).
pub fn load_real(dir: &std::path::Path) -> anyhow::Result<BTreeMap<String, Vec<u8>>> {
    let mut out = BTreeMap::new();
    if !dir.is_dir() {
        return Ok(out);
    }
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(stem) = name.strip_suffix("_openapi.json") else {
            continue;
        };
        let bytes = std::fs::read(&path)?;
        serde_json::from_slice::<Value>(&bytes)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        out.insert(stem.replace("__", "/"), bytes);
    }
    Ok(out)
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

fn server_relative_url(path: &str, hash: &str) -> String {
    format!("/openapi/v3/{path}?hash={hash}")
}

impl OpenApi {
    /// `real`: kube-apiserver's documents by root path ([`load_real`]); one is served only for
    /// a group-version the catalog serves. `wrong_documents`: the id of an apiserver that
    /// serves each document with [`WRONG_DOCUMENT_MARKER`] added, under the hash of the
    /// document without it.
    pub fn new(
        catalog: &Catalog,
        git_version: &str,
        mut real: BTreeMap<String, Vec<u8>>,
        wrong_documents: Option<&str>,
    ) -> OpenApi {
        let mut docs = BTreeMap::new();
        let mut parsed = BTreeMap::new();
        let mut root = Map::new();
        for (g, v, resources) in catalog.group_versions() {
            let path = gv_path(g, v);
            let body = match real.remove(&path) {
                Some(body) => {
                    if let Ok(value) = serde_json::from_slice(&body) {
                        parsed.insert(path.clone(), value);
                    }
                    body
                }
                None => gv_doc(g, v, resources, git_version)
                    .to_string()
                    .into_bytes(),
            };
            let hash = hash(&body);
            root.insert(
                path.clone(),
                json!({ "serverRelativeURL": server_relative_url(&path, &hash) }),
            );
            let body = match wrong_documents {
                Some(id) => {
                    let mut doc: Value = serde_json::from_slice(&body).unwrap_or_default();
                    if let Some(doc) = doc.as_object_mut() {
                        doc.insert(WRONG_DOCUMENT_MARKER.to_string(), json!(id));
                    }
                    doc.to_string().into_bytes()
                }
                None => body,
            };
            docs.insert(path, (body, hash));
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
            real: parsed,
            v2_json: v2.to_string().into_bytes(),
        }
    }

    /// The real schema of `kind` in group-version `path` (`apis/<g>/<v>`), and the document
    /// its `$ref`s resolve in; `None` where only a synthetic document exists.
    pub fn schema_of(&self, path: &str, kind: &str) -> Option<(&Value, &Value)> {
        let doc = self.real.get(path)?;
        let schemas = doc.pointer("/components/schemas")?.as_object()?;
        let schema = schemas.values().find(|s| {
            s.get("x-kubernetes-group-version-kind")
                .and_then(Value::as_array)
                .is_some_and(|gvks| gvks.iter().any(|gvk| gvk["kind"] == kind))
        })?;
        Some((schema, doc))
    }

    /// `GET /openapi/v3`, with the ETag kube-openapi gives it (the hash of the root).
    pub fn v3_root(&self) -> Response {
        (
            StatusCode::OK,
            [
                (header::CONTENT_TYPE, "application/json".to_string()),
                (header::ETAG, format!("\"{}\"", hash(&self.root))),
            ],
            self.root.clone(),
        )
            .into_response()
    }

    /// `GET /openapi/v3/<api/v1 | apis/g/v>`, `hash` the query's. Like kube-openapi's
    /// handler3: a stale hash is redirected (301) to the current URL; the matching one is
    /// cacheable for a year; without one the document is served without caching headers.
    pub fn v3_doc(&self, path: &str, query_hash: Option<&str>) -> Response {
        let Some((body, hash)) = self.docs.get(path) else {
            return status::page_not_found();
        };
        let etag = format!("\"{hash}\"");
        match query_hash {
            Some(q) if !q.is_empty() && q != hash => (
                StatusCode::MOVED_PERMANENTLY,
                [(header::LOCATION, server_relative_url(path, hash))],
            )
                .into_response(),
            Some(q) if !q.is_empty() => (
                StatusCode::OK,
                [
                    (header::CONTENT_TYPE, "application/json".to_string()),
                    (header::ETAG, etag),
                    (header::VARY, "Accept".to_string()),
                    (header::CACHE_CONTROL, "public, immutable".to_string()),
                    (header::EXPIRES, expires_in_a_year()),
                ],
                body.clone(),
            )
                .into_response(),
            _ => (
                StatusCode::OK,
                [
                    (header::CONTENT_TYPE, "application/json".to_string()),
                    (header::ETAG, etag),
                    (header::VARY, "Accept".to_string()),
                ],
                body.clone(),
            )
                .into_response(),
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
        let real =
            load_real(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/openapi/k8s-1.33"))
                .unwrap();
        let fixture = real["apis/coordination.k8s.io/v1beta1"].clone();
        let o = OpenApi::new(&cat, "v1.33.0", real.clone(), None);
        let root: Value = serde_json::from_slice(&o.root).unwrap();
        let url = root["paths"]["apis/resource.k8s.io/v1beta2"]["serverRelativeURL"]
            .as_str()
            .unwrap();
        assert!(url.starts_with("/openapi/v3/apis/resource.k8s.io/v1beta2?hash="));
        assert!(root["paths"].get("api/v1").is_some());
        // The real document, verbatim, under kube's hash.
        let (body, h) = &o.docs["apis/coordination.k8s.io/v1beta1"];
        assert_eq!(body, &fixture);
        assert_eq!(h.len(), 128);
        assert_eq!(
            root["paths"]["apis/coordination.k8s.io/v1beta1"]["serverRelativeURL"],
            format!("/openapi/v3/apis/coordination.k8s.io/v1beta1?hash={h}")
        );
        let (schema, _) = o
            .schema_of("apis/coordination.k8s.io/v1beta1", "LeaseCandidate")
            .unwrap();
        assert!(schema["properties"]["spec"].is_object());
        assert_eq!(
            o.v3_doc("apis/coordination.k8s.io/v1beta1", Some("STALE"))
                .status(),
            StatusCode::MOVED_PERMANENTLY
        );
        assert_eq!(
            o.v3_doc("apis/coordination.k8s.io/v1beta1", Some(h))
                .status(),
            StatusCode::OK
        );
        let doc: Value = serde_json::from_slice(&o.docs["apis/resource.k8s.io/v1beta2"].0).unwrap();
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
        let core: Value = serde_json::from_slice(&o.docs["api/v1"].0).unwrap();
        assert!(core["paths"].get("/api/v1/nodes/{name}").is_some());

        // A lying apiserver: the same root, each document not the one its hash names.
        let liar = OpenApi::new(&cat, "v1.33.0", real, Some("apiserver-x"));
        assert_eq!(liar.root, o.root);
        let (body, listed) = &liar.docs["apis/coordination.k8s.io/v1beta1"];
        assert_eq!(listed, h);
        assert_ne!(&hash(body), listed);
        let doc: Value = serde_json::from_slice(body).unwrap();
        assert_eq!(doc[WRONG_DOCUMENT_MARKER], "apiserver-x");
        let resp = liar.v3_doc("apis/coordination.k8s.io/v1beta1", Some(h));
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()[header::CACHE_CONTROL], "public, immutable");
        assert!(resp.headers()[header::EXPIRES]
            .to_str()
            .unwrap()
            .ends_with(" UTC"));
    }
}
