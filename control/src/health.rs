//! The control plane's HTTP endpoints (`--health-listen`):
//!
//! - `/healthz`, `/livez`: 200 while the process serves;
//! - `/readyz`: 200 only after the first complete sync was published to Envoy, 503 with the
//!   reasons before;
//! - `/metrics`: Prometheus text (peers, discovery, xDS, shared storage, the orchestrator),
//!   followed by the filter's counters read from Envoy's admin interface (the local channels,
//!   `--socket-dir`) at each scrape: one scrape per node has both planes;
//! - `/debug/skew`: the skew matrix as JSON, which apiserver serves which group-version-resource
//!   and where requests for it go (`?all=true` lists uniformly served ones too); a browser
//!   (`Accept` preferring `text/html`) gets the same document as a page ([`crate::skew_page`]).
//!
//! Nothing here decides anything: the handlers call what [`Health`] was given.

use std::future::Future;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::Deserialize;

use crate::envoy::admin::{self, FILTER_STATS};
use crate::local_channels::LocalChannel;
use crate::metrics::{encode, Families};
use crate::skew_page;

/// What the endpoints show.
pub struct Health {
    /// `Ok` when ready; otherwise why not.
    pub ready: Box<dyn Fn() -> Result<Vec<String>, Vec<String>> + Send + Sync>,
    /// Every metric of the control plane.
    pub metrics: Box<dyn Fn() -> Families + Send + Sync>,
    /// Envoy's admin interface, where the filter's counters are read (the local channels';
    /// `None` on a TCP port the kernel chose).
    pub envoy_admin: Option<LocalChannel>,
    /// The skew matrix (and apiserver status) as JSON; the flag asks for everything.
    pub skew: Box<dyn Fn(bool) -> serde_json::Value + Send + Sync>,
}

/// The router (for tests and for [`serve`]).
pub fn router(health: Arc<Health>) -> Router {
    Router::new()
        .route("/healthz", get(ok))
        .route("/livez", get(ok))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/debug/skew", get(skew))
        .with_state(health)
}

async fn ok() -> &'static str {
    "ok\n"
}

async fn readyz(State(h): State<Arc<Health>>) -> Response {
    match (h.ready)() {
        Ok(notes) => {
            let mut body = String::from("ok\n");
            for n in notes {
                body.push_str("- ");
                body.push_str(&n);
                body.push('\n');
            }
            (StatusCode::OK, body).into_response()
        }
        Err(reasons) => {
            let mut body = String::from("not ready: no complete sync published yet\n");
            for r in reasons {
                body.push_str("- ");
                body.push_str(&r);
                body.push('\n');
            }
            (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
        }
    }
}

async fn metrics(State(h): State<Arc<Health>>) -> Response {
    let mut families = (h.metrics)();
    let envoy = match &h.envoy_admin {
        Some(channel) => Some(admin::get(channel, FILTER_STATS).await),
        None => None,
    };
    if let Some(result) = &envoy {
        if let Err(e) = result {
            tracing::warn!(error = %e, "reading the filter's counters for /metrics");
        }
        families.gauge(
            "skewgate_envoy_stats_up",
            "1 when this scrape carries the filter's counters, read from Envoy's admin interface; 0 when reading them failed.",
            if result.is_ok() { 1.0 } else { 0.0 },
        );
    }
    let mut body = encode(&families);
    // Envoy's own Prometheus text: the filter's counters with upstream's names and labels
    // (disjoint from the control plane's names).
    if let Some(Ok(text)) = envoy {
        body.push_str(&text);
        if !body.ends_with('\n') {
            body.push('\n');
        }
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

#[derive(Deserialize)]
struct SkewQuery {
    #[serde(default)]
    all: Option<String>,
}

async fn skew(
    State(h): State<Arc<Health>>,
    Query(q): Query<SkewQuery>,
    headers: HeaderMap,
) -> Response {
    let all = matches!(q.all.as_deref(), Some("" | "1" | "true" | "yes"));
    let doc = (h.skew)(all);
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    if skew_page::wants_html(accept) {
        let page = skew_page::render(&doc, std::time::SystemTime::now());
        return (
            [
                (header::CONTENT_TYPE, "text/html; charset=utf-8"),
                (header::VARY, "Accept"),
                (
                    header::CONTENT_SECURITY_POLICY,
                    skew_page::CONTENT_SECURITY_POLICY,
                ),
                (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            ],
            page,
        )
            .into_response();
    }
    let body = serde_json::to_string_pretty(&doc).unwrap_or_else(|_| "{}".into());
    (
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::VARY, "Accept"),
        ],
        body + "\n",
    )
        .into_response()
}

/// Serve until `shutdown` completes, then stop accepting and finish in-flight requests.
pub async fn serve(
    listener: tokio::net::TcpListener,
    health: Arc<Health>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let address = listener
        .local_addr()
        .map_or_else(|_| "unknown".to_string(), |a| a.to_string());
    tracing::info!(%address, "health and metrics server listening");
    axum::serve(listener, router(health))
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// One request through the router, in process.
    async fn get(router: &Router, uri: &str) -> (StatusCode, String, Option<String>) {
        get_accepting(router, uri, None).await
    }

    async fn get_accepting(
        router: &Router,
        uri: &str,
        accept: Option<&str>,
    ) -> (StatusCode, String, Option<String>) {
        use axum::body::Body;
        use axum::http::Request;
        use http_body_util::BodyExt;
        use tower::ServiceExt;
        let mut request = Request::get(uri);
        if let Some(accept) = accept {
            request = request.header("accept", accept);
        }
        let resp = router
            .clone()
            .oneshot(request.body(Body::empty()).expect("request"))
            .await
            .expect("infallible");
        let status = resp.status();
        let ct = resp
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap_or_default().to_string());
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned(), ct)
    }

    #[tokio::test]
    async fn endpoints() {
        let ready = Arc::new(AtomicBool::new(false));
        let r = ready.clone();
        let health = Arc::new(Health {
            ready: Box::new(move || {
                if r.load(Ordering::Relaxed) {
                    Ok(vec!["peer apiserver-c: discovery not known yet".into()])
                } else {
                    Err(vec!["peer apiserver-b has not been tried yet".into()])
                }
            }),
            metrics: Box::new(|| {
                let mut f = Families::new();
                f.gauge("skewgate_control_ready", "Ready.", 0.0);
                f
            }),
            envoy_admin: None,
            skew: Box::new(|all| serde_json::json!({ "complete": all })),
        });
        let router = router(health);
        assert_eq!(get(&router, "/healthz").await.0, StatusCode::OK);
        let (status, body, _) = get(&router, "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("apiserver-b"), "{body}");
        ready.store(true, Ordering::Relaxed);
        let (status, body, _) = get(&router, "/readyz").await;
        assert_eq!(status, StatusCode::OK);
        assert!(
            body.starts_with("ok\n") && body.contains("apiserver-c"),
            "{body}"
        );
        let (status, body, ct) = get(&router, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("\nskewgate_control_ready 0\n"), "{body}");
        assert!(!body.contains("skewgate_envoy_stats_up"), "{body}");
        assert!(ct
            .unwrap_or_default()
            .starts_with("text/plain; version=0.0.4"));
        let (_, body, ct) = get(&router, "/debug/skew").await;
        assert_eq!(ct.as_deref(), Some("application/json"));
        assert!(body.contains("\"complete\": false"), "{body}");
        let (_, body, _) = get(&router, "/debug/skew?all=true").await;
        assert!(body.contains("\"complete\": true"), "{body}");
        // curl's `*/*` and a script's `application/json`: the JSON, as before.
        for accept in ["*/*", "application/json"] {
            let (_, body, ct) = get_accepting(&router, "/debug/skew", Some(accept)).await;
            assert_eq!(ct.as_deref(), Some("application/json"), "{accept}");
            assert!(body.contains("\"complete\": false"), "{body}");
        }
        // A browser: the same document as a page.
        let browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";
        let (status, body, ct) = get_accepting(&router, "/debug/skew", Some(browser)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(ct.as_deref(), Some("text/html; charset=utf-8"));
        assert!(body.starts_with("<!DOCTYPE html>"), "{body}");
        assert_eq!(get(&router, "/nope").await.0, StatusCode::NOT_FOUND);
    }
}
