//! The control plane's HTTP endpoints, on two listeners.
//!
//! `--health-listen` ([`router`]), what probes and Prometheus need:
//!
//! - `/healthz`, `/livez`: 200 while the process serves;
//! - `/readyz`: 200 only after the first complete sync was published to Envoy, 503 with the
//!   reasons before;
//! - `/metrics`: Prometheus text (peers, discovery, xDS, shared storage, the orchestrator),
//!   followed by the filter's counters read from Envoy's admin interface (the local channels,
//!   `--socket-dir`) at each scrape: one scrape per node has both planes. Every label value
//!   comes from a closed set or is an apiserver's lease name (bounded by `--max-peers` and the
//!   retention); no error text.
//!
//! `--debug-listen` ([`debug_router`]), off unless given and on loopback only, because it shows
//! the routing table, the peers' addresses and their last errors without authentication:
//!
//! - `/debug/skew`: the skew matrix as JSON, which apiserver serves which group-version-resource
//!   and where requests for it go (`?all=true` lists uniformly served ones too); a browser
//!   (`Accept` preferring `text/html`) gets the same document as a page ([`crate::skew_page`]).
//!
//! So `/metrics` can be scraped from another host without exposing `/debug/skew`. Nothing here
//! decides anything: the handlers call what [`Health`] was given.

use std::borrow::Cow;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::Deserialize;

use crate::envoy::admin::{self, FILTER_STATS};
use crate::envoy::resources::NATIVE_METRICS_NAMESPACE;
use crate::flags::{parse_socket_address, FlagError};
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

/// The `--health-listen` router: probes and `/metrics`.
pub fn router(health: Arc<Health>) -> Router {
    Router::new()
        .route("/healthz", get(ok))
        .route("/livez", get(ok))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(health)
}

/// The `--debug-listen` router: `/debug/skew`.
pub fn debug_router(health: Arc<Health>) -> Router {
    Router::new()
        .route("/debug/skew", get(skew))
        .with_state(health)
}

/// `--debug-listen`: an `IP:PORT` on loopback (`127.0.0.0/8` or `::1`). `/debug/skew` has no
/// authentication; from another host, reach it through a tunnel to the node.
pub fn parse_debug_listen(s: &str) -> Result<SocketAddr, FlagError> {
    let address = parse_socket_address(s)?;
    if !address.ip().is_loopback() {
        return Err(FlagError::value(
            s,
            "not a loopback address: /debug/skew shows the routing table and the peers without \
             authentication, so it is served on loopback only (127.0.0.1 or ::1)",
        ));
    }
    Ok(address)
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
        body.push_str(&upstream_names(&text));
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

/// Envoy's Prometheus text of the filter's metrics, named as upstream names them whichever
/// data plane counted them: Envoy strips the proxy-wasm filter's `wasmcustom` namespace, but
/// writes a dynamic module's metrics (the native filter's, in that same namespace) as
/// `envoy_wasmcustom_<name>`. Only those names change; labels and values stay.
fn upstream_names(text: &str) -> Cow<'_, str> {
    let native_prefix = format!("envoy_{NATIVE_METRICS_NAMESPACE}_");
    if !text.contains(&native_prefix) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let (comment, rest) = match line.strip_prefix("# TYPE ") {
            Some(rest) => ("# TYPE ", rest),
            None => match line.strip_prefix("# HELP ") {
                Some(rest) => ("# HELP ", rest),
                None => ("", line),
            },
        };
        out.push_str(comment);
        out.push_str(rest.strip_prefix(native_prefix.as_str()).unwrap_or(rest));
    }
    Cow::Owned(out)
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

/// Serve `router` (`what` names it in the log) until `shutdown` completes, then stop accepting
/// and finish in-flight requests.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    what: &'static str,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let address = listener
        .local_addr()
        .map_or_else(|_| "unknown".to_string(), |a| a.to_string());
    tracing::info!(%address, "{what} server listening");
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Text as Envoy 1.40 wrote it for the native filter (tests/tests/metrics.rs reads it live).
    #[test]
    fn native_metric_names_are_upstream_names() {
        let native = "# TYPE envoy_wasmcustom_apiserver_rerouted_request_total counter\n\
            envoy_wasmcustom_apiserver_rerouted_request_total{code=\"200\",group=\"resource.k8s.io\",version=\"v1beta2\",resource=\"resourceclaims\"} 2\n\
            # TYPE envoy_wasmcustom_skewgate_fallback_configuration gauge\n\
            envoy_wasmcustom_skewgate_fallback_configuration{} 0\n";
        assert_eq!(
            upstream_names(native),
            "# TYPE apiserver_rerouted_request_total counter\n\
            apiserver_rerouted_request_total{code=\"200\",group=\"resource.k8s.io\",version=\"v1beta2\",resource=\"resourceclaims\"} 2\n\
            # TYPE skewgate_fallback_configuration gauge\n\
            skewgate_fallback_configuration{} 0\n"
        );
        // The proxy-wasm filter's text is already so: borrowed, unchanged.
        let wasm = "# TYPE apiserver_rerouted_request_total counter\napiserver_rerouted_request_total{code=\"200\"} 1\n";
        assert!(matches!(upstream_names(wasm), Cow::Borrowed(t) if t == wasm));
    }

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
        let debug = debug_router(health.clone());
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
        // /debug/skew is on its own listener, never beside /metrics: a port opened to a
        // scraper does not show the routing table.
        for path in ["/debug/skew", "/debug/skew?all=true"] {
            assert_eq!(get(&router, path).await.0, StatusCode::NOT_FOUND, "{path}");
        }
        for path in ["/healthz", "/readyz", "/metrics"] {
            assert_eq!(get(&debug, path).await.0, StatusCode::NOT_FOUND, "{path}");
        }
        let (_, body, ct) = get(&debug, "/debug/skew").await;
        assert_eq!(ct.as_deref(), Some("application/json"));
        assert!(body.contains("\"complete\": false"), "{body}");
        let (_, body, _) = get(&debug, "/debug/skew?all=true").await;
        assert!(body.contains("\"complete\": true"), "{body}");
        // curl's `*/*` and a script's `application/json`: the JSON, as before.
        for accept in ["*/*", "application/json"] {
            let (_, body, ct) = get_accepting(&debug, "/debug/skew", Some(accept)).await;
            assert_eq!(ct.as_deref(), Some("application/json"), "{accept}");
            assert!(body.contains("\"complete\": false"), "{body}");
        }
        // A browser: the same document as a page.
        let browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";
        let (status, body, ct) = get_accepting(&debug, "/debug/skew", Some(browser)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(ct.as_deref(), Some("text/html; charset=utf-8"));
        assert!(body.starts_with("<!DOCTYPE html>"), "{body}");
        assert_eq!(get(&router, "/nope").await.0, StatusCode::NOT_FOUND);
    }

    #[test]
    fn debug_listen_is_loopback_only() {
        for ok in ["127.0.0.1:18002", "127.9.9.9:1", "[::1]:18002"] {
            assert!(parse_debug_listen(ok).is_ok(), "{ok}");
        }
        for refused in [
            "0.0.0.0:18002",
            "[::]:18002",
            "10.0.0.11:18002",
            "[fd00::1]:18002",
            "localhost:18002",
            "127.0.0.1",
            "",
        ] {
            assert!(parse_debug_listen(refused).is_err(), "{refused}");
        }
    }

    /// The exposition is bounded: Envoy's text is read up to the admin client's limit (8 MiB),
    /// and an answer past it is left out (`skewgate_envoy_stats_up 0`), never passed on.
    #[tokio::test]
    async fn an_oversized_envoy_answer_is_left_out_of_metrics() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("admin.sock");
        let listener = tokio::net::UnixListener::bind(&socket).expect("bind");
        let body = "wasmcustom_x 1\n".repeat((9 << 20) / 15);
        let server = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("accept");
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = stream.read(&mut buf).await.expect("read");
                head.extend_from_slice(buf.get(..n).expect("n"));
            }
            let reply = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(reply.as_bytes()).await;
        });
        let health = Arc::new(Health {
            ready: Box::new(|| Ok(Vec::new())),
            metrics: Box::new(Families::new),
            envoy_admin: Some(LocalChannel::Unix(socket)),
            skew: Box::new(|_| serde_json::json!({})),
        });
        let (status, body, _) = get(&router(health), "/metrics").await;
        server.abort();
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("\nskewgate_envoy_stats_up 0\n"), "{body}");
        assert!(body.len() < 4096, "{} bytes", body.len());
    }
}
