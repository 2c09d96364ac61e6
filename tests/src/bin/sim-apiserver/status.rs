//! Error responses shaped like kube-apiserver's: `metav1.Status` JSON bodies (NotFound,
//! AlreadyExists, BadRequest, ...) and the plain-text `404 page not found` of the NotFound
//! handler that answers paths no API group/version serves.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// `resource.group`, or just `resource` for the core group (kube's `GroupResource.String()`).
pub fn qualified(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

/// A `StatusDetails` object; empty group and name are left out like Go's `omitempty`.
pub fn details(group: &str, resource: &str, name: &str) -> Value {
    let mut d = serde_json::Map::new();
    if !name.is_empty() {
        d.insert("name".into(), json!(name));
    }
    if !group.is_empty() {
        d.insert("group".into(), json!(group));
    }
    if !resource.is_empty() {
        d.insert("kind".into(), json!(resource));
    }
    Value::Object(d)
}

/// A failure `Status` object (the body; see [`respond`] for the HTTP response).
pub fn failure(code: u16, reason: &str, message: &str, details: Option<Value>) -> Value {
    let mut s = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
    });
    if let Some(d) = details {
        s["details"] = d;
    }
    s["code"] = json!(code);
    s
}

/// Serve a `Status` object with its own `code` as the HTTP status.
pub fn respond(status: Value) -> Response {
    let code = status["code"].as_u64().unwrap_or(500) as u16;
    crate::respond::json(
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        &status,
    )
}

/// kube's NotFound handler: any path that no installed API group/version serves.
pub fn page_not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        "404 page not found\n",
    )
        .into_response()
}

/// What kube-apiserver answers for a path under a group-version it serves that names no route
/// of it (a resource or subresource it does not serve, a cluster-scoped resource under a
/// namespace): go-restful's 404 as kube's generic `Status`, NotFound with empty details. Only
/// a path under no served group-version gets the plain [`page_not_found`] (both checked
/// against a real kube-apiserver by `tests/tests/conformance.rs`).
pub fn no_route() -> Response {
    respond(failure(
        404,
        "NotFound",
        "the server could not find the requested resource",
        Some(json!({})),
    ))
}

pub fn not_found(group: &str, resource: &str, name: &str) -> Value {
    failure(
        404,
        "NotFound",
        &format!("{} \"{name}\" not found", qualified(group, resource)),
        Some(details(group, resource, name)),
    )
}

pub fn already_exists(group: &str, resource: &str, name: &str) -> Value {
    failure(
        409,
        "AlreadyExists",
        &format!("{} \"{name}\" already exists", qualified(group, resource)),
        Some(details(group, resource, name)),
    )
}

pub fn conflict(group: &str, resource: &str, name: &str) -> Value {
    failure(
        409,
        "Conflict",
        &format!(
            "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; \
             please apply your changes to the latest version and try again",
            qualified(group, resource)
        ),
        Some(details(group, resource, name)),
    )
}

pub fn bad_request(message: &str) -> Value {
    failure(400, "BadRequest", message, None)
}

/// 422 Invalid with one `FieldValueRequired` cause; kube names the object by `Kind.group`.
pub fn invalid(group: &str, kind: &str, name: &str, field: &str, detail: &str) -> Value {
    let mut d = details(group, kind, name);
    d["causes"] = json!([{ "reason": "FieldValueRequired", "message": detail, "field": field }]);
    failure(
        422,
        "Invalid",
        &format!(
            "{} \"{name}\" is invalid: {field}: {detail}",
            qualified(group, kind)
        ),
        Some(d),
    )
}

/// `NewMethodNotSupported`: the verb is not served for this resource.
pub fn method_not_allowed(group: &str, resource: &str, verb: &str) -> Value {
    failure(
        405,
        "MethodNotAllowed",
        &format!(
            "{verb} is not supported on resources of kind \"{}\"",
            qualified(group, resource)
        ),
        Some(details(group, resource, "")),
    )
}

/// 415 for a PATCH content type we do not understand.
pub fn unsupported_media_type(content_type: &str) -> Value {
    failure(
        415,
        "UnsupportedMediaType",
        &format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json; got {content_type:?}"),
        None,
    )
}

/// 500 InternalError: the storage failed (kube answers the same for etcd errors).
pub fn internal_error(message: &str) -> Value {
    failure(500, "InternalError", message, None)
}

/// 410 Expired, sent as a watch ERROR event when a resourceVersion is too old.
pub fn expired(message: &str) -> Value {
    failure(410, "Expired", message, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_matches_kube_shape() {
        let s = not_found("resource.k8s.io", "resourceclaims", "x");
        assert_eq!(
            s.to_string(),
            r#"{"apiVersion":"v1","code":404,"details":{"group":"resource.k8s.io","kind":"resourceclaims","name":"x"},"kind":"Status","message":"resourceclaims.resource.k8s.io \"x\" not found","metadata":{},"reason":"NotFound","status":"Failure"}"#
        );
        let core = not_found("", "pods", "p");
        assert_eq!(core["message"], "pods \"p\" not found");
        assert!(core["details"].get("group").is_none());
    }
}
