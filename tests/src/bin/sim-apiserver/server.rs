//! The HTTP front: shared state, one fallback handler that routes every request (discovery,
//! resources, 404), adds the `x-sim-*` echo headers and logs one line per request.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::to_bytes;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Uri};
use axum::response::Response;
use tokio::sync::watch;

use crate::catalog::Catalog;
use crate::discovery_http::{self, Discovery};
use crate::fixture::Fixture;
use crate::openapi::OpenApi;
use crate::router::{self, Route};
use crate::store::Store;
use crate::{resources, status};

pub const PEER_PROXIED: &str = "x-kubernetes-peer-proxied";
pub const REMOTE_USER: &str = "x-remote-user";

/// Largest request body accepted.
const MAX_BODY: usize = 16 << 20;

pub struct AppState {
    pub id: String,
    pub discovery: Discovery,
    pub catalog: Catalog,
    pub openapi: OpenApi,
    pub store: Store,
    /// How often watches with `allowWatchBookmarks=true` get a BOOKMARK.
    pub bookmark_interval: Duration,
    /// Flips to `true` on SIGTERM/SIGINT; open watches end.
    pub shutdown: watch::Receiver<bool>,
}

impl AppState {
    pub fn new(
        id: String,
        fixture: &Fixture,
        git_version: &str,
        store: Store,
        bookmark_interval: Duration,
        shutdown: watch::Receiver<bool>,
    ) -> AppState {
        let catalog = Catalog::build(&fixture.aggregated, &fixture.core_v1);
        AppState {
            id,
            discovery: Discovery::new(fixture, git_version),
            openapi: OpenApi::new(&catalog, git_version),
            catalog,
            store,
            bookmark_interval,
            shutdown,
        }
    }
}

pub async fn handle(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let method = req.method().clone();
    let uri = req.uri().clone();
    let headers = req.headers().clone();
    let mut resp = match to_bytes(req.into_body(), MAX_BODY).await {
        Ok(body) => dispatch(&state, &method, &uri, &headers, &body).await,
        Err(e) => status::respond(status::failure(
            413,
            "RequestEntityTooLarge",
            &e.to_string(),
            None,
        )),
    };
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&state.id) {
        h.insert(HeaderName::from_static("x-sim-apiserver"), v);
    }
    if let Some(v) = headers.get(PEER_PROXIED) {
        h.insert(HeaderName::from_static("x-sim-peer-proxied"), v.clone());
    }
    if let Some(v) = headers.get(REMOTE_USER) {
        h.insert(HeaderName::from_static("x-sim-remote-user"), v.clone());
    }
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    eprintln!(
        "sim-apiserver[{}] {method} {path} {} peer-proxied={}",
        state.id,
        resp.status().as_u16(),
        headers.contains_key(PEER_PROXIED)
    );
    resp
}

async fn dispatch(
    state: &Arc<AppState>,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let route = router::parse(uri.path());
    let is_get = matches!(*method, Method::GET | Method::HEAD);
    let d = &state.discovery;
    match route {
        Route::Resource(p) => {
            let query: HashMap<String, String> = Query::try_from_uri(uri)
                .map(|Query(q)| q)
                .unwrap_or_default();
            resources::handle(state, &p, method, &query, headers, body).await
        }
        Route::NotFound => status::page_not_found(),
        _ if !is_get => status::respond(status::failure(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
            Some(serde_json::json!({})),
        )),
        Route::Version => d.version(),
        Route::Health => discovery_http::health(),
        Route::ApiRoot => d.api(headers),
        Route::ApisRoot => d.apis(headers),
        Route::Group(g) => d.group(&g),
        Route::GroupVersion { group, version } => d.group_version(&group, &version),
        Route::OpenApiV2 => state.openapi.v2(headers),
        Route::OpenApiV3Root => state.openapi.v3_root(),
        Route::OpenApiV3(path) => state.openapi.v3_doc(&path),
    }
}
