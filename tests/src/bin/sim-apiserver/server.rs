//! The HTTP front: shared state, one fallback handler that authenticates every request like
//! kube-apiserver (401 first), routes it (upgrades, discovery, resources, 404), adds the
//! `x-sim-*` echo headers and logs one line per request.
//!
//! Echo headers: `x-sim-apiserver` (this server's id), `x-sim-peer-proxied` and
//! `x-sim-remote-user` (the raw `x-kubernetes-peer-proxied` / `x-remote-user` request headers,
//! whoever sent them), `x-sim-underscored-headers` (request header names with `_`), `x-sim-impersonate-user` (the raw `Impersonate-User`; impersonation
//! itself is not simulated), and the identity the authenticator chain settled on: `x-sim-user`,
//! `x-sim-uid` (when set), `x-sim-groups` (comma-joined) and `x-sim-authenticator`
//! (`requestheader`, `x509`, `token` or `anonymous`); a 401 carries `x-sim-auth-error`.
//! Over TLS, `x-sim-alpn` is the negotiated ALPN protocol (`h2`, `http/1.1` or `none`);
//! `x-sim-conn` numbers the connection the request came on; `x-sim-client-cert-serial` is the
//! serial (lowercase hex) of the client certificate that connection presented, if any.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::to_bytes;
use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, Version};
use axum::response::{IntoResponse, Response};
use tokio::sync::watch;

use crate::auth::{Authenticator, UserInfo};
use crate::catalog::Catalog;
use crate::discovery_http::{self, Discovery};
use crate::fixture::Fixture;
use crate::openapi::OpenApi;
use crate::router::{self, Route};
use crate::store::Store;
use crate::tls::ConnInfo;
use crate::{resources, status, upgrade};

pub const PEER_PROXIED: &str = "x-kubernetes-peer-proxied";
pub const REMOTE_USER: &str = "x-remote-user";
pub const IMPERSONATE_USER: &str = "impersonate-user";

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
    /// The authenticator chain (anonymous only, unless flags configure more).
    pub auth: Authenticator,
    /// kube's `UnauthenticatedHTTP2DOSMitigation`: an HTTP/2 connection that carried an
    /// anonymous or rejected request is closed (GOAWAY) once its requests in flight finish.
    pub http2_dos_mitigation: bool,
    /// `--reset-requests-with`: a request whose path and query contain this is never answered;
    /// its connection is dropped (what a client sees of an apiserver refusing a malformed
    /// request by resetting it).
    pub reset_requests_with: Option<String>,
    /// `--hang-requests-with`: a request whose path and query contain this is never answered,
    /// and its connection stays up (a hung apiserver behind a live connection: HTTP/2 PINGs
    /// are still answered).
    pub hang_requests_with: Option<String>,
    /// `--discovery-unavailable-for`: until then, `/api` and `/apis` answer 503.
    pub discovery_unavailable_until: Option<Instant>,
    /// `--not-ready-for`: until then, `/readyz` answers 500.
    pub not_ready_until: Option<Instant>,
}

impl AppState {
    pub fn new(
        id: String,
        fixture: &Fixture,
        git_version: &str,
        store: Store,
        bookmark_interval: Duration,
        shutdown: watch::Receiver<bool>,
        wrong_openapi_documents: bool,
    ) -> AppState {
        let catalog = Catalog::build(&fixture.aggregated, &fixture.core_v1);
        let wrong_openapi = wrong_openapi_documents.then_some(id.as_str());
        AppState {
            discovery: Discovery::new(fixture, git_version),
            openapi: OpenApi::new(
                &catalog,
                git_version,
                fixture.openapi.clone(),
                wrong_openapi,
            ),
            id,
            catalog,
            store,
            bookmark_interval,
            shutdown,
            auth: Authenticator {
                anonymous: true,
                ..Default::default()
            },
            http2_dos_mitigation: false,
            reset_requests_with: None,
            hang_requests_with: None,
            discovery_unavailable_until: None,
            not_ready_until: None,
        }
    }
}

/// A request carrying this header (milliseconds) is answered that much later, at most
/// [`MAX_DELAY_MS`]: a slow request, in flight while something happens to its proxy.
const DELAY_HEADER: &str = "x-sim-delay-ms";
const MAX_DELAY_MS: u64 = 60_000;

pub async fn handle(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let method = req.method().clone();
    let uri = req.uri().clone();
    let headers = req.headers().clone();
    let conn = req.extensions().get::<ConnInfo>().cloned();
    let target = uri.path_and_query().map_or("", |p| p.as_str());
    let marked =
        |marker: &Option<String>| marker.as_ref().is_some_and(|m| target.contains(m.as_str()));
    if marked(&state.reset_requests_with) {
        if let Some(abort) = conn.as_ref().and_then(|c| c.abort.as_ref()) {
            eprintln!("{}: resetting {method} {target}", state.id);
            abort.notify_one();
            // The connection task drops this request with its connection.
            std::future::pending::<()>().await;
        }
    }
    if marked(&state.hang_requests_with) {
        eprintln!("{}: leaving {method} {target} unanswered", state.id);
        std::future::pending::<()>().await;
    }
    if state
        .discovery_unavailable_until
        .is_some_and(|until| Instant::now() < until)
        && matches!(uri.path(), "/api" | "/apis")
    {
        return status::respond(status::failure(
            503,
            "ServiceUnavailable",
            "discovery is not ready yet (--discovery-unavailable-for)",
            None,
        ));
    }
    if state
        .not_ready_until
        .is_some_and(|until| Instant::now() < until)
        && uri.path() == "/readyz"
    {
        // kube-apiserver's answer while a post-start hook has not finished.
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "[-]poststarthook/sim-not-ready failed: not finished (--not-ready-for)\nreadyz check failed\n",
        )
            .into_response();
    }
    if let Some(delay) = headers
        .get(DELAY_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    {
        tokio::time::sleep(Duration::from_millis(delay.min(MAX_DELAY_MS))).await;
    }
    let auth = state.auth.authenticate(conn.as_ref(), &headers);
    let unauthenticated = auth.as_ref().map_or(true, UserInfo::is_anonymous);
    if state.http2_dos_mitigation && req.version() == Version::HTTP_2 && unauthenticated {
        if let Some(close) = conn.as_ref().and_then(|c| c.close.as_ref()) {
            close.notify_one();
        }
    }
    let mut resp = match &auth {
        Err(e) => unauthorized(&e.0),
        Ok(user) => {
            let route = router::parse(uri.path());
            if upgrade::applies(&state, &method, &route, &headers) {
                match &route {
                    Route::Resource(p) => upgrade::handle(&state, p, req, user).await,
                    _ => status::page_not_found(),
                }
            } else {
                match to_bytes(req.into_body(), MAX_BODY).await {
                    Ok(body) => dispatch(&state, route, &method, &uri, &headers, &body, user).await,
                    Err(e) => status::respond(status::failure(
                        413,
                        "RequestEntityTooLarge",
                        &e.to_string(),
                        None,
                    )),
                }
            }
        }
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
    if let Some(v) = headers.get(IMPERSONATE_USER) {
        h.insert(HeaderName::from_static("x-sim-impersonate-user"), v.clone());
    }
    // Header names with underscores: servers that fold `_` into `-` (CGI-style, some extension
    // apiservers) would read `X_Remote_User` as `X-Remote-User`.
    let underscored: Vec<&str> = headers
        .keys()
        .map(HeaderName::as_str)
        .filter(|n| n.contains('_'))
        .collect();
    if let Ok(v) = HeaderValue::from_str(&underscored.join(",")) {
        if !underscored.is_empty() {
            h.insert(HeaderName::from_static("x-sim-underscored-headers"), v);
        }
    }
    if let Some(c) = &conn {
        h.insert(
            HeaderName::from_static("x-sim-conn"),
            HeaderValue::from(c.id),
        );
    }
    let client_serial = conn
        .as_ref()
        .and_then(|c| c.peer_certs.as_deref()?.first().cloned())
        .and_then(|cert| {
            let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
            HeaderValue::from_str(&parsed.raw_serial_as_string().replace(':', "")).ok()
        });
    if let Some(v) = client_serial {
        h.insert(HeaderName::from_static("x-sim-client-cert-serial"), v);
    }
    if let Some(c) = conn.as_ref().filter(|c| c.tls) {
        let alpn = c.alpn.as_deref().unwrap_or("none");
        if let Ok(v) = HeaderValue::from_str(alpn) {
            h.insert(HeaderName::from_static("x-sim-alpn"), v);
        }
    }
    let who = match &auth {
        Ok(user) => {
            identity_headers(h, user);
            format!("{}/{}", user.method.as_str(), user.name)
        }
        Err(e) => {
            if let Ok(v) = HeaderValue::from_bytes(e.0.as_bytes()) {
                h.insert(HeaderName::from_static("x-sim-auth-error"), v);
            }
            format!("unauthorized ({})", e.0)
        }
    };
    let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    eprintln!(
        "sim-apiserver[{}] {method} {path} {} peer-proxied={} user={who}",
        state.id,
        resp.status().as_u16(),
        headers.contains_key(PEER_PROXIED)
    );
    resp
}

/// kube's `Unauthorized` handler: 401 with a `Status` body.
fn unauthorized(_why: &str) -> Response {
    status::respond(status::failure(401, "Unauthorized", "Unauthorized", None))
}

fn identity_headers(h: &mut HeaderMap, user: &UserInfo) {
    let mut set = |name: &'static str, value: &str| {
        if let Ok(v) = HeaderValue::from_bytes(value.as_bytes()) {
            h.insert(HeaderName::from_static(name), v);
        }
    };
    set("x-sim-user", &user.name);
    if !user.uid.is_empty() {
        set("x-sim-uid", &user.uid);
    }
    set("x-sim-groups", &user.groups.join(","));
    set("x-sim-authenticator", user.method.as_str());
}

async fn dispatch(
    state: &Arc<AppState>,
    route: Route,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
    user: &UserInfo,
) -> Response {
    let is_get = matches!(*method, Method::GET | Method::HEAD);
    let d = &state.discovery;
    match route {
        Route::Resource(p) => {
            let query: HashMap<String, String> = Query::try_from_uri(uri)
                .map(|Query(q)| q)
                .unwrap_or_default();
            resources::handle(state, &p, method, &query, headers, body, user).await
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
        Route::OpenApiV3(path) => {
            let query: HashMap<String, String> = Query::try_from_uri(uri)
                .map(|Query(q)| q)
                .unwrap_or_default();
            state
                .openapi
                .v3_doc(&path, query.get("hash").map(String::as_str))
        }
    }
}
