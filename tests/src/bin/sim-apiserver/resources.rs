//! Resource requests: resolve the verb like kube-apiserver (method + path shape + `watch`),
//! enforce scope and the verbs discovery advertises, then list/get/create/update/patch/
//! delete against the store (memory or the shared etcd). Only the `status` subresource is
//! simulated (the streaming ones are in `upgrade.rs`). `selfsubjectreviews` create answers
//! with the authenticated caller, like kube's REST storage for them.

use std::collections::HashMap;
use std::sync::Arc;

use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};

use crate::auth::UserInfo;
use crate::catalog::ResourceInfo;
use crate::objects::{self, name_of};
use crate::router::ResourcePath;
use crate::selectors::Selector;
use crate::server::AppState;
use crate::store::{Gvr, Key, StoreError};
use crate::table::{self, IncludeObject, TableOptions};
use crate::{ids, negotiate, patch, protobuf, respond, status, validation, watch};

/// Everything a verb handler needs about one request.
struct Ctx<'a> {
    state: &'a Arc<AppState>,
    info: &'a ResourceInfo,
    path: &'a ResourcePath,
    query: &'a HashMap<String, String>,
    headers: &'a HeaderMap,
}

impl Ctx<'_> {
    fn gvr(&self) -> Gvr {
        Gvr {
            group: self.info.group.clone(),
            version: self.info.version.clone(),
            resource: self.info.resource.clone(),
        }
    }

    /// The namespace part of store keys: the request's for namespaced resources, else "".
    fn namespace(&self) -> String {
        if self.info.namespaced {
            self.path.namespace.clone().unwrap_or_default()
        } else {
            String::new()
        }
    }

    fn key(&self, name: &str) -> Key {
        Key {
            gvr: self.gvr(),
            namespace: self.namespace(),
            name: name.to_string(),
        }
    }

    /// `?fieldValidation=Strict` for a kind the sim has kube's real schema of: fields the
    /// schema does not declare are refused like kube does (`validation.rs`).
    fn check_fields(&self, obj: &Value) -> Result<(), Box<Response>> {
        if self.query.get("fieldValidation").map(String::as_str) != Some("Strict")
            || self.path.subresource.is_some()
        {
            return Ok(());
        }
        let info = self.info;
        let path = if info.group.is_empty() {
            format!("api/{}", info.version)
        } else {
            format!("apis/{}/{}", info.group, info.version)
        };
        let Some((schema, doc)) = self.state.openapi.schema_of(&path, &info.kind) else {
            return Ok(());
        };
        let unknown = validation::unknown_fields(obj, schema, doc);
        if unknown.is_empty() {
            return Ok(());
        }
        Err(Box::new(status::respond(status::bad_request(
            &validation::message(&info.kind, &info.version, &unknown),
        ))))
    }

    fn dry_run(&self) -> bool {
        self.query.get("dryRun").is_some_and(|v| v == "All")
    }

    fn table(&self) -> Option<TableOptions> {
        let accept = self
            .headers
            .get(header::ACCEPT)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        negotiate::table(accept).map(|version| TableOptions {
            version,
            include: IncludeObject::from_query(self.query.get("includeObject").map(String::as_str)),
        })
    }

    fn selector(&self) -> Result<Selector, Box<Response>> {
        Selector::parse(
            self.query.get("labelSelector").map(String::as_str),
            self.query.get("fieldSelector").map(String::as_str),
        )
        .map_err(|e| Box::new(status::respond(status::bad_request(&e))))
    }

    fn not_found(&self, name: &str) -> Response {
        status::respond(status::not_found(
            &self.info.group,
            &self.info.resource,
            name,
        ))
    }

    fn store_error(&self, e: StoreError, name: &str) -> Response {
        let (g, r) = (&self.info.group, &self.info.resource);
        status::respond(match e {
            StoreError::NotFound => status::not_found(g, r, name),
            StoreError::AlreadyExists => status::already_exists(g, r, name),
            StoreError::Conflict => status::conflict(g, r, name),
            StoreError::Unavailable(msg) => status::internal_error(&msg),
        })
    }

    /// One object, or a one-row Table when the client asked for tables.
    fn object(&self, code: StatusCode, obj: &Value) -> Response {
        match self.table() {
            Some(t) => {
                let rv = crate::store::object_rv(obj).to_string();
                respond::json(code, &table::table(std::slice::from_ref(obj), &rv, t, true))
            }
            None => respond::json(code, obj),
        }
    }
}

/// Map method and path shape to kube's verb; `None` means the method has no verb here.
fn resolve_verb(method: &Method, path: &ResourcePath, watch_param: bool) -> Option<&'static str> {
    let item = path.name.is_some();
    let sub = path.subresource.is_some();
    Some(match *method {
        Method::GET | Method::HEAD if path.watch_prefix || (watch_param && !sub) => "watch",
        Method::GET | Method::HEAD if item => "get",
        Method::GET | Method::HEAD => "list",
        Method::POST if path.watch_prefix => return None,
        Method::POST if !item || sub => "create",
        Method::PUT if item && !path.watch_prefix => "update",
        Method::PATCH if item && !path.watch_prefix => "patch",
        Method::DELETE if item && !sub && !path.watch_prefix => "delete",
        Method::DELETE if !item && !path.watch_prefix => "deletecollection",
        _ => return None,
    })
}

/// kube's 404 for a path [`registered`] refuses: the generic NotFound `Status` under a served
/// group-version, `404 page not found` under any other.
pub fn not_registered(state: &AppState, path: &ResourcePath) -> Response {
    if state
        .catalog
        .serves_group_version(&path.group, &path.version)
    {
        status::no_route()
    } else {
        status::page_not_found()
    }
}

/// What the path names, if kube registers a route for it (`None`: kube's 404, see
/// [`not_registered`]). Routes
/// kube does not register: unserved resources, cluster-scoped objects under a namespace,
/// single namespaced objects without one, subresources discovery does not list.
pub fn registered<'a>(state: &'a AppState, path: &ResourcePath) -> Option<&'a ResourceInfo> {
    let info = state
        .catalog
        .lookup(&path.group, &path.version, &path.resource)?;
    if (path.namespace.is_some() && !info.namespaced)
        || (info.namespaced && path.namespace.is_none() && path.name.is_some())
        || path
            .subresource
            .as_ref()
            .is_some_and(|s| !info.subresources.contains_key(s))
    {
        return None;
    }
    Some(info)
}

pub async fn handle(
    state: &Arc<AppState>,
    path: &ResourcePath,
    method: &Method,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
    body: &[u8],
    user: &UserInfo,
) -> Response {
    let Some(info) = registered(state, path) else {
        return not_registered(state, path);
    };
    let watch_param = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    let not_allowed = |verb: &str| {
        status::respond(status::method_not_allowed(
            &info.group,
            &info.resource,
            verb,
        ))
    };
    let Some(verb) = resolve_verb(method, path, watch_param) else {
        return not_allowed(&method.as_str().to_ascii_lowercase());
    };
    let allowed = match &path.subresource {
        Some(s) => info.sub_allows(s, verb),
        None => info.allows(verb),
    };
    let cluster_wide_write = info.namespaced
        && path.namespace.is_none()
        && matches!(verb, "create" | "deletecollection");
    let unsimulated_sub = path.subresource.as_deref().is_some_and(|s| s != "status");
    if !allowed || cluster_wide_write || unsimulated_sub {
        return not_allowed(verb);
    }
    if info.group == "authentication.k8s.io"
        && info.resource == "selfsubjectreviews"
        && verb == "create"
    {
        return self_subject_review(info, headers, body, user);
    }
    let ctx = Ctx {
        state,
        info,
        path,
        query,
        headers,
    };
    let name = path.name.as_deref().unwrap_or("");
    match verb {
        "list" => list(&ctx).await,
        "watch" => watch_collection(&ctx).await,
        "get" => get(&ctx, name).await,
        "create" => create(&ctx, body).await,
        "update" => update(&ctx, name, body).await,
        "patch" => patch_object(&ctx, name, body).await,
        "delete" => delete(&ctx, name).await,
        "deletecollection" => delete_collection(&ctx).await,
        _ => not_allowed(verb),
    }
}

/// kube's `selfsubjectreview` REST `Create`: the request body only has to decode; the answer
/// is a new object carrying the caller's `userInfo`, 201.
fn self_subject_review(
    info: &ResourceInfo,
    headers: &HeaderMap,
    body: &[u8],
    user: &UserInfo,
) -> Response {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    let decoded = if protobuf::is_protobuf(content_type) {
        protobuf::type_meta(body)
            .map(|(api_version, kind)| json!({"apiVersion": api_version, "kind": kind}))
            .map_err(|e| {
                status::bad_request(&format!(
                    "the object provided is unrecognized (must be of type {}): {e}",
                    info.kind
                ))
            })
    } else {
        objects::decode(body, info)
    };
    let mut obj = match decoded {
        Ok(o) => o,
        Err(s) => return status::respond(s),
    };
    if let Err(s) = objects::check_type_meta(&mut obj, info) {
        return status::respond(s);
    }
    let review = json!({
        "kind": info.kind,
        "apiVersion": info.api_version(),
        "metadata": { "creationTimestamp": crate::clock::rfc3339(std::time::SystemTime::now()) },
        "status": { "userInfo": user.to_json() },
    });
    respond::json(StatusCode::CREATED, &review)
}

fn list_object(info: &ResourceInfo, items: Vec<Value>, rv: u64) -> Value {
    json!({
        "kind": format!("{}List", info.kind),
        "apiVersion": info.api_version(),
        "metadata": { "resourceVersion": rv.to_string() },
        "items": items,
    })
}

async fn list(ctx: &Ctx<'_>) -> Response {
    let selector = match ctx.selector() {
        Ok(s) => s,
        Err(r) => return *r,
    };
    let (items, rv) = match ctx
        .state
        .store
        .list(&ctx.gvr(), ctx.path.namespace.as_deref())
        .await
    {
        Ok(r) => r,
        Err(e) => return ctx.store_error(e, ""),
    };
    let items: Vec<Value> = items.into_iter().filter(|o| selector.matches(o)).collect();
    match ctx.table() {
        Some(t) => respond::json(
            StatusCode::OK,
            &table::table(&items, &rv.to_string(), t, true),
        ),
        None => respond::json(StatusCode::OK, &list_object(ctx.info, items, rv)),
    }
}

async fn watch_collection(ctx: &Ctx<'_>) -> Response {
    let mut selector = match ctx.selector() {
        Ok(s) => s,
        Err(r) => return *r,
    };
    if let Some(name) = &ctx.path.name {
        selector.add_name(name);
    }
    watch::serve(watch::WatchRequest {
        state: ctx.state.clone(),
        info: ctx.info.clone(),
        gvr: ctx.gvr(),
        namespace: ctx.path.namespace.clone(),
        selector,
        query: ctx.query.clone(),
        table: ctx.table(),
    })
    .await
}

async fn get(ctx: &Ctx<'_>, name: &str) -> Response {
    match ctx.state.store.get(&ctx.key(name)).await {
        Ok(Some(obj)) => ctx.object(StatusCode::OK, &obj),
        Ok(None) => ctx.not_found(name),
        Err(e) => ctx.store_error(e, name),
    }
}

async fn create(ctx: &Ctx<'_>, body: &[u8]) -> Response {
    let mut obj = match objects::decode(body, ctx.info) {
        Ok(o) => o,
        Err(s) => return status::respond(s),
    };
    if let Err(r) = ctx.check_fields(&obj) {
        return *r;
    }
    if let Err(s) = objects::check_type_meta(&mut obj, ctx.info)
        .and_then(|_| objects::set_namespace(&mut obj, ctx.info, &ctx.namespace()))
    {
        return status::respond(s);
    }
    objects::init_system_fields(&mut obj);
    objects::stamp(&mut obj, &ctx.state.id);
    let generate = obj
        .pointer("/metadata/generateName")
        .and_then(Value::as_str)
        .map(String::from);
    let fixed = name_of(&obj).to_string();
    let attempts = if fixed.is_empty() { 8 } else { 1 };
    for _ in 0..attempts {
        let name = match (&generate, fixed.is_empty()) {
            (_, false) => fixed.clone(),
            (Some(prefix), true) => format!("{prefix}{}", ids::name_suffix()),
            (None, true) => {
                return status::respond(status::invalid(
                    &ctx.info.group,
                    &ctx.info.kind,
                    "",
                    "metadata.name",
                    "Required value: name or generateName is required",
                ))
            }
        };
        objects::metadata(&mut obj).insert("name".into(), json!(name));
        match ctx
            .state
            .store
            .create(ctx.key(&name), obj.clone(), ctx.dry_run())
            .await
        {
            Ok(stored) => return respond::json(StatusCode::CREATED, &stored),
            Err(StoreError::AlreadyExists) if generate.is_some() && fixed.is_empty() => continue,
            Err(e) => return ctx.store_error(e, &name),
        }
    }
    status::respond(status::failure(
        500,
        "InternalError",
        "could not generate a unique name",
        None,
    ))
}

/// Shared tail of update and patch: check the name, keep system fields, stamp, store.
async fn replace(
    ctx: &Ctx<'_>,
    name: &str,
    mut build: impl FnMut(&Value) -> Result<Value, Value> + Send,
) -> Response {
    let info = ctx.info;
    let is_status = ctx.path.subresource.is_some();
    let server_id = ctx.state.id.clone();
    let result = ctx
        .state
        .store
        .update(&ctx.key(name), ctx.dry_run(), |current| {
            let mut new = build(current)?;
            objects::check_type_meta(&mut new, info)?;
            let new_name = name_of(&new);
            if !new_name.is_empty() && new_name != name {
                return Err(status::bad_request(&format!(
                "the name of the object ({new_name}) does not match the name on the URL ({name})"
            )));
            }
            if info.namespaced {
                objects::set_namespace(
                    &mut new,
                    info,
                    current["metadata"]["namespace"].as_str().unwrap_or(""),
                )?;
            }
            if is_status {
                // Only .status changes through the status subresource.
                let mut merged = current.clone();
                merged["status"] = new.get("status").cloned().unwrap_or(Value::Null);
                if let Some(rv) = new.pointer("/metadata/resourceVersion").cloned() {
                    objects::metadata(&mut merged).insert("resourceVersion".into(), rv);
                }
                new = merged;
            }
            objects::keep_system_fields(&mut new, current);
            objects::stamp(&mut new, &server_id);
            Ok(new)
        })
        .await;
    match result {
        Ok(Ok(obj)) => respond::json(StatusCode::OK, &obj),
        Ok(Err(e)) => ctx.store_error(e, name),
        Err(s) => status::respond(s),
    }
}

async fn update(ctx: &Ctx<'_>, name: &str, body: &[u8]) -> Response {
    let new = match objects::decode(body, ctx.info) {
        Ok(o) => o,
        Err(s) => return status::respond(s),
    };
    if let Err(r) = ctx.check_fields(&new) {
        return *r;
    }
    replace(ctx, name, |_| Ok(new.clone())).await
}

async fn patch_object(ctx: &Ctx<'_>, name: &str, body: &[u8]) -> Response {
    let content_type = ctx
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let json_patch = match content_type.as_str() {
        "application/json-patch+json" => true,
        "application/merge-patch+json"
        | "application/strategic-merge-patch+json"
        | "application/apply-patch+yaml" => false,
        other => return status::respond(status::unsupported_media_type(other)),
    };
    let patch_doc: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return status::respond(status::bad_request(&format!("error decoding patch: {e}")))
        }
    };
    if !json_patch {
        if let Err(r) = ctx.check_fields(&patch_doc) {
            return *r;
        }
    }
    let is_apply = content_type == "application/apply-patch+yaml";
    if is_apply
        && ctx.path.subresource.is_none()
        && matches!(ctx.state.store.get(&ctx.key(name)).await, Ok(None))
    {
        // Server-side apply creates missing objects.
        let mut obj = patch_doc;
        objects::metadata(&mut obj).insert("name".into(), json!(name));
        return create(ctx, obj.to_string().as_bytes()).await;
    }
    replace(ctx, name, |current| {
        let mut new = current.clone();
        if json_patch {
            patch::json_patch(&mut new, &patch_doc)
                .map_err(|e| status::failure(422, "Invalid", &e, None))?;
        } else {
            patch::merge(&mut new, &patch_doc);
        }
        // A patch that does not mention resourceVersion is unconditional.
        if patch_doc.pointer("/metadata/resourceVersion").is_none() {
            objects::metadata(&mut new).remove("resourceVersion");
        }
        Ok(new)
    })
    .await
}

async fn delete(ctx: &Ctx<'_>, name: &str) -> Response {
    match ctx.state.store.delete(&ctx.key(name), ctx.dry_run()).await {
        Ok(obj) => respond::json(StatusCode::OK, &obj),
        Err(e) => ctx.store_error(e, name),
    }
}

async fn delete_collection(ctx: &Ctx<'_>) -> Response {
    let selector = match ctx.selector() {
        Ok(s) => s,
        Err(r) => return *r,
    };
    let (items, _) = match ctx
        .state
        .store
        .list(&ctx.gvr(), ctx.path.namespace.as_deref())
        .await
    {
        Ok(r) => r,
        Err(e) => return ctx.store_error(e, ""),
    };
    let mut deleted = Vec::new();
    for obj in items.into_iter().filter(|o| selector.matches(o)) {
        let ns = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let key = Key {
            gvr: ctx.gvr(),
            namespace: ns,
            name: name_of(&obj).to_string(),
        };
        if let Ok(d) = ctx.state.store.delete(&key, ctx.dry_run()).await {
            deleted.push(d);
        }
    }
    let rv = match ctx.state.store.current_rv().await {
        Ok(rv) => rv,
        Err(e) => return ctx.store_error(e, ""),
    };
    respond::json(StatusCode::OK, &list_object(ctx.info, deleted, rv))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::{parse, Route};

    fn verb(method: Method, path: &str, watch: bool) -> Option<&'static str> {
        match parse(path) {
            Route::Resource(p) => resolve_verb(&method, &p, watch),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn verbs_like_kube() {
        let coll = "/apis/resource.k8s.io/v1beta2/namespaces/ns/resourceclaims";
        let item = "/apis/resource.k8s.io/v1beta2/namespaces/ns/resourceclaims/c";
        assert_eq!(verb(Method::GET, coll, false), Some("list"));
        assert_eq!(verb(Method::GET, coll, true), Some("watch"));
        assert_eq!(verb(Method::GET, item, true), Some("watch"));
        assert_eq!(
            verb(
                Method::GET,
                "/apis/resource.k8s.io/v1beta2/watch/resourceclaims",
                false
            ),
            Some("watch")
        );
        assert_eq!(verb(Method::GET, item, false), Some("get"));
        assert_eq!(verb(Method::POST, coll, false), Some("create"));
        assert_eq!(verb(Method::POST, item, false), None);
        assert_eq!(verb(Method::PUT, item, false), Some("update"));
        assert_eq!(verb(Method::PUT, coll, false), None);
        assert_eq!(verb(Method::PATCH, item, false), Some("patch"));
        assert_eq!(verb(Method::DELETE, item, false), Some("delete"));
        assert_eq!(verb(Method::DELETE, coll, false), Some("deletecollection"));
        assert_eq!(
            verb(Method::PUT, &format!("{item}/status"), false),
            Some("update")
        );
        assert_eq!(
            verb(Method::GET, &format!("{item}/status"), true),
            Some("get")
        );
        assert_eq!(verb(Method::OPTIONS, coll, false), None);
    }
}
