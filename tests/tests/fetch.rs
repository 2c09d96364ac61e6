//! Discovery fetch against real simulated apiservers and against a tiny raw-HTTP server that
//! misbehaves on purpose: aggregated and legacy documents, conditional refresh, a stopped
//! apiserver, garbage, oversized and hung answers, and the refetch on a new holder identity.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use skewgate_control::discovery::documents::{
    legacy_group_list, legacy_resource_list, DiscoveryDocuments,
};
use skewgate_control::discovery::{APIGroupDiscoveryList, DEFAULT_MAX_DISCOVERY_BYTES};
use skewgate_control::fetch::{
    spawn_apiserver_watch, Answer, Backoff, ClientTemplate, DiscoveryFetcher, DiscoveryMetrics,
    DocumentFormat, ErrorType, FetchConfig, FetchError, RefreshConfig, SyncOutcome,
    DISCOVERY_ACCEPT,
};
use skewgate_tests::{black_hole, fixture, free_port, wait_until, SimApiserver};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const V2: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
const V2BETA1: &str = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";
const JSON: &str = "application/json";
const MIB: usize = 1024 * 1024;

fn fetcher(id: &str, url: &str, config: FetchConfig) -> DiscoveryFetcher {
    DiscoveryFetcher::new(id, url, &ClientTemplate::anonymous(), config).expect("fetcher")
}

fn fixture_docs(name: &str) -> DiscoveryDocuments {
    DiscoveryDocuments::from_dir(fixture(name)).expect("fixture")
}

fn fast_refresh(interval: Duration) -> RefreshConfig {
    RefreshConfig {
        interval,
        backoff: Backoff {
            initial: Duration::from_millis(50),
            max: Duration::from_millis(200),
        },
        ..Default::default()
    }
}

// -------------------------------------------------------------------------------------------
// A tiny HTTP/1.1 server: one response per connection, then close.
// -------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Req {
    path: String,
    headers: Vec<(String, String)>,
}

impl Req {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

enum Body {
    Bytes(Vec<u8>),
    /// `total` bytes written in 64 KiB chunks (never held at once), with or without a
    /// `Content-Length`.
    Stream {
        total: usize,
        declare: bool,
    },
    /// Headers, then nothing, connection held open.
    Hang,
}

struct Reply {
    status: u16,
    content_type: Option<&'static str>,
    etag: Option<String>,
    body: Body,
}

impl Reply {
    fn ok(content_type: &'static str, body: Vec<u8>) -> Reply {
        Reply {
            status: 200,
            content_type: Some(content_type),
            etag: None,
            body: Body::Bytes(body),
        }
    }

    fn status(status: u16, body: &str) -> Reply {
        Reply {
            status,
            content_type: Some(JSON),
            etag: None,
            body: Body::Bytes(body.as_bytes().to_vec()),
        }
    }

    fn etag(mut self, etag: &str) -> Reply {
        self.etag = Some(etag.to_string());
        self
    }
}

type Handler = dyn Fn(&Req) -> Reply + Send + Sync;

struct TinyServer {
    url: String,
    requests: Arc<Mutex<Vec<Req>>>,
    /// Body bytes the server managed to write in streamed answers.
    streamed: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TinyServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TinyServer {
    async fn start(handler: impl Fn(&Req) -> Reply + Send + Sync + 'static) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let requests = Arc::new(Mutex::new(Vec::new()));
        let streamed = Arc::new(AtomicUsize::new(0));
        let handler: Arc<Handler> = Arc::new(handler);
        let (reqs, stream_count) = (requests.clone(), streamed.clone());
        let task = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let (handler, reqs, stream_count) =
                    (handler.clone(), reqs.clone(), stream_count.clone());
                tokio::spawn(async move {
                    let _ = serve(socket, handler, reqs, stream_count).await;
                });
            }
        });
        Ok(TinyServer {
            url,
            requests,
            streamed,
            task,
        })
    }

    fn requests(&self) -> Vec<Req> {
        self.requests.lock().unwrap().clone()
    }

    fn clear(&self) {
        self.requests.lock().unwrap().clear();
    }
}

async fn serve(
    mut socket: TcpStream,
    handler: Arc<Handler>,
    requests: Arc<Mutex<Vec<Req>>>,
    streamed: Arc<AtomicUsize>,
) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = socket.read(&mut buf).await?;
        if n == 0 || head.len() > 64 * 1024 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let mut lines = text.split("\r\n");
    let path = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .unwrap_or("/")
        .to_string();
    let headers = lines
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let req = Req { path, headers };
    requests.lock().unwrap().push(req.clone());
    let reply = handler(&req);

    let mut out = format!("HTTP/1.1 {} X\r\nConnection: close\r\n", reply.status);
    if let Some(ct) = reply.content_type {
        out.push_str(&format!("Content-Type: {ct}\r\n"));
    }
    if let Some(etag) = &reply.etag {
        out.push_str(&format!("ETag: {etag}\r\n"));
    }
    match &reply.body {
        Body::Bytes(b) if reply.status != 304 => {
            out.push_str(&format!("Content-Length: {}\r\n", b.len()))
        }
        Body::Stream {
            total,
            declare: true,
        } => out.push_str(&format!("Content-Length: {total}\r\n")),
        _ => {}
    }
    out.push_str("\r\n");
    socket.write_all(out.as_bytes()).await?;
    match reply.body {
        Body::Bytes(b) => socket.write_all(&b).await?,
        Body::Stream { total, .. } => {
            let prefix =
                br#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","x":""#;
            socket.write_all(prefix).await?;
            streamed.fetch_add(prefix.len(), Ordering::Relaxed);
            let chunk = vec![b'a'; 64 * 1024];
            let mut left = total.saturating_sub(prefix.len());
            while left > 0 {
                let n = left.min(chunk.len());
                socket.write_all(&chunk[..n]).await?;
                streamed.fetch_add(n, Ordering::Relaxed);
                left -= n;
            }
        }
        Body::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
    }
    socket.shutdown().await
}

/// The documents of a fixture, as bytes a server would send.
struct Served {
    docs: DiscoveryDocuments,
    apis: Vec<u8>,
    api: Vec<u8>,
    legacy: BTreeMap<String, Vec<u8>>,
}

impl Served {
    fn of(name: &str) -> Served {
        let dir = fixture(name);
        let docs = fixture_docs(name);
        let mut legacy = BTreeMap::new();
        legacy.insert(
            "/api".to_string(),
            std::fs::read(dir.join("api.json")).unwrap(),
        );
        legacy.insert(
            "/api/v1".to_string(),
            std::fs::read(dir.join("api__v1.json")).unwrap(),
        );
        legacy.insert(
            "/apis".to_string(),
            serde_json::to_vec(&legacy_group_list(&docs.apis)).unwrap(),
        );
        for g in &docs.apis.items {
            for v in &g.versions {
                legacy.insert(
                    format!("/apis/{}/{}", g.metadata.name, v.version),
                    serde_json::to_vec(&legacy_resource_list(&g.metadata.name, v)).unwrap(),
                );
            }
        }
        Served {
            apis: std::fs::read(dir.join("aggregated_v2.json")).unwrap(),
            api: serde_json::to_vec(&docs.api).unwrap(),
            docs,
            legacy,
        }
    }

    /// An aggregated answer with `etag`, honouring `If-None-Match`.
    fn aggregated(&self, req: &Req, etag: &str) -> Reply {
        if req.header("if-none-match") == Some(etag) {
            return Reply {
                status: 304,
                content_type: None,
                etag: Some(etag.to_string()),
                body: Body::Bytes(Vec::new()),
            };
        }
        let body = match req.path.as_str() {
            "/apis" => self.apis.clone(),
            "/api" => self.api.clone(),
            _ => return Reply::status(404, r#"{"kind":"Status","code":404}"#),
        };
        Reply::ok(V2, body).etag(etag)
    }

    fn legacy(&self, req: &Req) -> Reply {
        match self.legacy.get(&req.path) {
            Some(b) => Reply::ok(JSON, b.clone()),
            None => Reply::status(404, r#"{"kind":"Status","code":404}"#),
        }
    }
}

/// Empty responseKind versions spelled out as the listing's version.
fn normalized(list: &APIGroupDiscoveryList) -> APIGroupDiscoveryList {
    let mut list = list.clone();
    for g in &mut list.items {
        for v in &mut g.versions {
            let version = v.version.clone();
            let fill = |k: &mut Option<skewgate_control::discovery::GroupVersionKind>| {
                if let Some(k) = k {
                    if k.version.is_empty() {
                        k.version = version.clone();
                    }
                }
            };
            for r in &mut v.resources {
                fill(&mut r.response_kind);
                for s in &mut r.subresources {
                    fill(&mut s.response_kind);
                }
            }
        }
    }
    list
}

/// What a sim apiserver serving fixture `name` answers (see [`normalized`]).
fn assert_same_as_sim(docs: &DiscoveryDocuments, name: &str) {
    let want = fixture_docs(name);
    assert_eq!(docs.apis, want.apis, "{name}");
    assert_eq!(normalized(&docs.api), normalized(&want.api), "{name}");
}

fn served_model(l: &APIGroupDiscoveryList) -> skewgate_control::discovery::ServedApis {
    skewgate_control::discovery::ServedApis::from_aggregated(l).unwrap()
}

// -------------------------------------------------------------------------------------------
// Against simulated apiservers.
// -------------------------------------------------------------------------------------------

#[tokio::test]
async fn aggregated_fetch_equals_the_fixtures_and_refresh_is_conditional() -> Result<()> {
    for name in ["k8s-1.30", "k8s-1.33"] {
        let sim = SimApiserver::start("apiserver-a", name).await?;
        let f = fetcher(&sim.id, &sim.url(), FetchConfig::default());
        let fetched = f.fetch(None).await?;
        for answer in [&fetched.apis, &fetched.api] {
            match answer {
                Answer::Fresh(d) => {
                    assert_eq!(d.format, DocumentFormat::AggregatedV2, "{name}");
                    assert!(d.etag.is_some(), "{name}: the sim sends ETags");
                }
                Answer::NotModified => bail!("{name}: 304 to an unconditional request"),
            }
        }
        let etags = fetched.etags(None);
        let docs = fetched.into_documents(None).context("documents")?;
        let want = fixture_docs(name);
        // `/apis`: the fixture file, exactly.
        assert_eq!(docs.apis, want.apis, "{name}");
        // `/api`: the sim derives it from the legacy core list and spells the core
        // responseKind version out (`v1`, like kube-apiserver); the fixture conversion leaves
        // it empty ("the listing's"). The same otherwise.
        assert_eq!(normalized(&docs.api), normalized(&want.api), "{name}");
        assert_eq!(docs.served()?, want.served()?, "{name}");

        // The same ETags: 304 for both, the documents stand.
        let again = f.fetch(Some(&etags)).await?;
        assert!(again.not_modified(), "{name}: {again:?}");
        assert_eq!(again.etags(Some(&etags)), etags);
        assert_eq!(again.into_documents(Some(&docs)), Some(docs.clone()));

        // A stale ETag on one document: that one comes back in full.
        let half = skewgate_control::fetch::Etags {
            apis: Some("\"old\"".into()),
            api: etags.api.clone(),
        };
        let mixed = f.fetch(Some(&half)).await?;
        assert!(matches!(mixed.apis, Answer::Fresh(_)) && mixed.api == Answer::NotModified);
        assert_eq!(mixed.into_documents(Some(&docs)), Some(docs));
    }
    Ok(())
}

#[tokio::test]
async fn a_stopped_apiserver_keeps_the_last_view_and_counts_connect_errors() -> Result<()> {
    let mut sim = SimApiserver::start("apiserver-a", "k8s-1.30").await?;
    let metrics = Arc::new(DiscoveryMetrics::new());
    let f = fetcher(&sim.id, &sim.url(), FetchConfig::default());
    let mut w = spawn_apiserver_watch(
        f.clone(),
        fast_refresh(Duration::from_millis(150)),
        metrics.clone(),
    );
    tokio::time::timeout(Duration::from_secs(20), w.tried()).await?;
    let good = w.current().context("a first view")?;
    assert_same_as_sim(&good, "k8s-1.30");
    w.documents.borrow_and_update();

    // Periodic refreshes are conditional: 304s, nothing re-published.
    let m = metrics.clone();
    wait_until("two 304 refreshes", Duration::from_secs(10), || {
        m.outcomes_total(SyncOutcome::NotModified) >= 2
    })
    .await?;
    assert!(!w.documents.has_changed()?);
    assert_eq!(metrics.errors_total(ErrorType::Connect), 0);

    sim.stop().await?;
    match f.fetch(None).await {
        Err(e @ FetchError::Connect { .. }) => {
            assert_eq!(e.error_type(), ErrorType::Connect);
            assert!(
                e.url().ends_with("/apis") || e.url().ends_with("/api"),
                "{e}"
            );
        }
        other => bail!("expected a connect error, got {other:?}"),
    }
    let m = metrics.clone();
    wait_until("connect errors counted", Duration::from_secs(10), || {
        m.errors_total(ErrorType::Connect) >= 2
    })
    .await?;
    // The last good view stands.
    assert!(!w.documents.has_changed()?);
    assert!(Arc::ptr_eq(&w.current().context("kept")?, &good));
    let status = metrics.status("apiserver-a").context("status")?;
    assert!(status.consecutive_failures >= 1 && status.last_success.is_some());
    assert_eq!(status.last_error_type, Some(ErrorType::Connect));
    assert!(w.state.borrow().consecutive_failures >= 1);
    let text = skewgate_control::metrics::encode(&metrics.families());
    assert!(
        text.lines().any(|l| l
            .starts_with("apiserver_peer_discovery_sync_errors_total{type=\"connect\"} ")
            && !l.ends_with(" 0")),
        "{text}"
    );
    assert!(text.lines().any(|l| l
        .starts_with("skewgate_discovery_last_error_info{apiserver=\"apiserver-a\",")
        && l.contains(",type=\"connect\"}")));

    // Back, upgraded, on the same address: the backoff finds it and the view follows.
    let addr = format!("{}:{}", sim.address.host, sim.address.port);
    let _sim = SimApiserver::start_on("apiserver-a", "k8s-1.33", &addr).await?;
    tokio::time::timeout(Duration::from_secs(20), w.documents.changed()).await??;
    let view = w.current().context("view")?;
    assert_same_as_sim(&view, "k8s-1.33");
    Ok(())
}

// -------------------------------------------------------------------------------------------
// Against the tiny server.
// -------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Good,
    NotJson,
    Html,
    WrongKind,
    Forbidden,
    Huge { declare: bool },
    InvalidNames,
}

#[tokio::test]
async fn garbage_and_oversized_answers_are_typed_and_change_nothing() -> Result<()> {
    let served = Arc::new(Served::of("k8s-1.30"));
    let mode = Arc::new(Mutex::new(Mode::Good));
    let server = {
        let (served, mode) = (served.clone(), mode.clone());
        TinyServer::start(move |req| {
            let m = *mode.lock().unwrap();
            match m {
                Mode::Good => served.aggregated(req, "\"e1\""),
                _ if req.path == "/api" => served.aggregated(req, "\"c1\""),
                Mode::NotJson => Reply::ok(V2, b"<html>oops</html>".to_vec()),
                Mode::Html => Reply::ok("text/html", b"<html>login</html>".to_vec()),
                Mode::WrongKind => Reply::ok(
                    V2,
                    br#"{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"v1","resources":[]}"#.to_vec(),
                ),
                Mode::Forbidden => Reply::status(
                    403,
                    r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"forbidden: User \"x\" cannot get path \"/apis\"","code":403}"#,
                ),
                Mode::Huge { declare } => Reply {
                    status: 200,
                    content_type: Some(V2),
                    etag: None,
                    body: Body::Stream {
                        total: 50 * MIB,
                        declare,
                    },
                },
                Mode::InvalidNames => Reply::ok(
                    V2,
                    br#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","items":[
                        {"metadata":{"name":"x.io"},"versions":[{"version":"v1","resources":[{"resource":"a/b"}]}]}]}"#
                        .to_vec(),
                ),
            }
        })
        .await?
    };

    // Direct fetches: one typed error per kind of garbage.
    let f = fetcher("apiserver-g", &server.url, FetchConfig::default());
    let good = f.fetch_documents().await?;
    assert_eq!(good, served.docs);
    // `/openapi/v3` is asked for beside discovery (docs/ARCHITECTURE.md "OpenAPI v3").
    let requests = server.requests();
    let apis = requests
        .iter()
        .find(|r| r.path == "/apis")
        .context("a /apis request")?;
    assert_eq!(apis.header("accept"), Some(DISCOVERY_ACCEPT));

    type Check = fn(&FetchError) -> bool;
    let cases: Vec<(Mode, ErrorType, Check)> = vec![
        (Mode::NotJson, ErrorType::Garbage, |e| {
            e.to_string().contains("not JSON")
        }),
        (Mode::Html, ErrorType::Garbage, |e| {
            e.to_string().contains("text/html")
        }),
        (Mode::WrongKind, ErrorType::Garbage, |e| {
            e.to_string().contains("APIResourceList")
        }),
        (Mode::InvalidNames, ErrorType::Garbage, |e| {
            e.to_string().contains("a/b")
        }),
        (
            Mode::Forbidden,
            ErrorType::Status,
            |e| matches!(e, FetchError::Status { status: 403, message: Some(m), .. } if m.contains("cannot get path")),
        ),
        (
            Mode::Huge { declare: true },
            ErrorType::TooLarge,
            |e| matches!(e, FetchError::TooLarge { limit, total: false, .. } if *limit == DEFAULT_MAX_DISCOVERY_BYTES),
        ),
        (
            Mode::Huge { declare: false },
            ErrorType::TooLarge,
            |e| matches!(e, FetchError::TooLarge { limit, .. } if *limit == DEFAULT_MAX_DISCOVERY_BYTES),
        ),
    ];
    for (m, want, check) in &cases {
        *mode.lock().unwrap() = *m;
        server.streamed.store(0, Ordering::Relaxed);
        let started = Instant::now();
        let e = f.fetch(None).await.expect_err("refused");
        assert_eq!(e.error_type(), *want, "{m:?}: {e}");
        assert!(check(&e), "{m:?}: {e}");
        let refused_after = started.elapsed();
        if let Mode::Huge { declare } = m {
            // The fetcher stopped reading at the limit: the server could write the limit plus
            // what loopback socket buffers hold, far from 50 MiB.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let written = server.streamed.load(Ordering::Relaxed);
            println!("{m:?}: refused after {refused_after:?}, server wrote {written} bytes");
            assert!(written < 36 * MIB, "{m:?}: {written}");
            if !declare {
                assert!(written >= DEFAULT_MAX_DISCOVERY_BYTES, "{written}");
            }
        }
    }

    // A small limit: the server gets to write little more than socket buffers.
    *mode.lock().unwrap() = Mode::Huge { declare: false };
    server.streamed.store(0, Ordering::Relaxed);
    let small = fetcher(
        "apiserver-g",
        &server.url,
        FetchConfig {
            max_bytes: MIB,
            ..Default::default()
        },
    );
    let e = small.fetch(None).await.expect_err("too large");
    assert!(
        matches!(e, FetchError::TooLarge { limit, .. } if limit == MIB),
        "{e}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let written = server.streamed.load(Ordering::Relaxed);
    println!("1 MiB limit: server wrote {written} bytes of 50 MiB");
    assert!(written < 16 * MIB, "{written}");

    // The same answers to the refresh loop: counted, the last good view stays.
    *mode.lock().unwrap() = Mode::Good;
    let metrics = Arc::new(DiscoveryMetrics::new());
    let mut w = spawn_apiserver_watch(
        f.clone(),
        fast_refresh(Duration::from_millis(100)),
        metrics.clone(),
    );
    tokio::time::timeout(Duration::from_secs(10), w.tried()).await?;
    let view = w.current().context("first view")?;
    assert_eq!(*view, served.docs);
    w.documents.borrow_and_update();
    for (m, want, _) in &cases {
        let before = metrics.errors_total(*want);
        *mode.lock().unwrap() = *m;
        let met = metrics.clone();
        let want = *want;
        wait_until(&format!("{m:?} counted"), Duration::from_secs(10), || {
            met.errors_total(want) > before
        })
        .await?;
        assert!(!w.documents.has_changed()?, "{m:?} changed the view");
        assert!(Arc::ptr_eq(&w.current().context("kept")?, &view));
    }
    let text = skewgate_control::metrics::encode(&metrics.families());
    for t in ["garbage", "status", "too_large"] {
        let line = text
            .lines()
            .find(|l| {
                l.starts_with(&format!(
                    "apiserver_peer_discovery_sync_errors_total{{type=\"{t}\"}}"
                ))
            })
            .context("line")?;
        assert!(!line.ends_with(" 0"), "{line}");
    }
    println!("{text}");

    // Good again: recovers, same documents, nothing re-published.
    *mode.lock().unwrap() = Mode::Good;
    let met = metrics.clone();
    wait_until("recovery", Duration::from_secs(10), || {
        met.status("apiserver-g")
            .is_some_and(|s| s.consecutive_failures == 0)
    })
    .await?;
    assert!(!w.documents.has_changed()?);
    Ok(())
}

#[tokio::test]
async fn hung_and_refused_connections_are_timeouts_and_connect_errors() -> Result<()> {
    let quick = FetchConfig {
        timeout: Duration::from_millis(500),
        ..Default::default()
    };
    // Accepts, never answers.
    let (addr, _hole) = black_hole().await?;
    let f = fetcher(
        "apiserver-h",
        &format!("http://{}:{}", addr.host, addr.port),
        quick.clone(),
    );
    let started = Instant::now();
    let e = f.fetch(None).await.expect_err("hung");
    assert_eq!(e.error_type(), ErrorType::Timeout, "{e}");
    assert!(started.elapsed() < Duration::from_secs(5));

    // Headers, then a body that never comes.
    let server = TinyServer::start(|_| Reply {
        status: 200,
        content_type: Some(V2),
        etag: None,
        body: Body::Hang,
    })
    .await?;
    let e = fetcher("apiserver-h", &server.url, quick.clone())
        .fetch(None)
        .await
        .expect_err("hung body");
    assert!(matches!(e, FetchError::Timeout { .. }), "{e}");

    // Nothing listening.
    let port = free_port()?;
    let e = fetcher("apiserver-h", &format!("http://127.0.0.1:{port}"), quick)
        .fetch(None)
        .await
        .expect_err("refused");
    assert!(matches!(e, FetchError::Connect { .. }), "{e}");
    println!("{e}");
    Ok(())
}

#[tokio::test]
async fn legacy_only_server_gives_the_same_documents() -> Result<()> {
    for name in ["k8s-1.30", "k8s-1.33"] {
        let served = Arc::new(Served::of(name));
        let server = {
            let served = served.clone();
            // A legacy server ignores the aggregated clauses of Accept.
            TinyServer::start(move |req| served.legacy(req)).await?
        };
        let f = fetcher("apiserver-l", &server.url, FetchConfig::default());
        let fetched = f.fetch(None).await?;
        for answer in [&fetched.apis, &fetched.api] {
            match answer {
                Answer::Fresh(d) => {
                    assert_eq!(d.format, DocumentFormat::Legacy);
                    assert_eq!(d.etag, None, "assembled documents are never conditional");
                    assert!(d.stale.is_empty());
                }
                Answer::NotModified => bail!("304"),
            }
        }
        let docs = fetched.into_documents(None).context("docs")?;
        // Core: exactly what the fixture's legacy api__v1.json converts to.
        assert_eq!(docs.api, served.docs.api, "{name}");
        // Named groups: the same model, groups and versions in the same order (preferred first).
        assert_eq!(
            served_model(&docs.apis),
            served_model(&served.docs.apis),
            "{name}"
        );
        let order = |l: &APIGroupDiscoveryList| -> Vec<(String, Vec<String>)> {
            l.items
                .iter()
                .map(|g| {
                    (
                        g.metadata.name.clone(),
                        g.versions.iter().map(|v| v.version.clone()).collect(),
                    )
                })
                .collect()
        };
        assert_eq!(order(&docs.apis), order(&served.docs.apis), "{name}");
        assert_eq!(docs.served()?, served.docs.served()?, "{name}");

        // Every group-version was asked for, as plain JSON.
        let requests = server.requests();
        let gv_requests: Vec<&Req> = requests
            .iter()
            .filter(|r| r.path.starts_with("/apis/"))
            .collect();
        assert_eq!(
            gv_requests.len(),
            served
                .legacy
                .keys()
                .filter(|p| p.starts_with("/apis/"))
                .count()
        );
        assert!(gv_requests.iter().all(|r| r.header("accept") == Some(JSON)));
        println!("{name}: legacy fetch took {} requests", requests.len());
    }

    // A group-version that fails (a down aggregated APIService) is Stale, one that vanished
    // (404) is left out; the rest of the server is still seen.
    let served = Arc::new(Served::of("k8s-1.33"));
    let server =
        {
            let served = served.clone();
            TinyServer::start(move |req| match req.path.as_str() {
                "/apis" => {
                    let mut list: serde_json::Value =
                        serde_json::from_slice(&served.legacy["/apis"]).unwrap();
                    for (g, v) in [("metrics.k8s.io", "v1beta1"), ("gone.example.io", "v1")] {
                        list["groups"].as_array_mut().unwrap().push(serde_json::json!({
                        "name": g,
                        "versions": [{"groupVersion": format!("{g}/{v}"), "version": v}],
                        "preferredVersion": {"groupVersion": format!("{g}/{v}"), "version": v},
                    }));
                    }
                    Reply::ok(JSON, serde_json::to_vec(&list).unwrap())
                }
                "/apis/metrics.k8s.io/v1beta1" => Reply::status(503, "service unavailable"),
                _ => served.legacy(req),
            })
            .await?
        };
    let fetched = fetcher("apiserver-l", &server.url, FetchConfig::default())
        .fetch(None)
        .await?;
    assert_eq!(fetched.stale(), vec!["/apis/metrics.k8s.io/v1beta1"]);
    let docs = fetched.into_documents(None).context("docs")?;
    let metrics_group = docs
        .apis
        .items
        .iter()
        .find(|g| g.metadata.name == "metrics.k8s.io")
        .context("metrics group kept")?;
    assert_eq!(
        metrics_group.versions[0].freshness.as_deref(),
        Some("Stale")
    );
    assert!(!docs
        .apis
        .items
        .iter()
        .any(|g| g.metadata.name == "gone.example.io"));
    assert!(docs
        .served()?
        .serves("resource.k8s.io", "v1beta2", "resourceclaims"));

    // Garbage in one group-version fails the whole fetch (nothing partial is kept).
    let server = {
        let served = served.clone();
        TinyServer::start(move |req| match req.path.as_str() {
            "/apis/apps/v1" => Reply::ok(JSON, b"{not json".to_vec()),
            _ => served.legacy(req),
        })
        .await?
    };
    let e = fetcher("apiserver-l", &server.url, FetchConfig::default())
        .fetch(None)
        .await
        .expect_err("garbage");
    assert_eq!(e.error_type(), ErrorType::Garbage);
    assert!(e.url().ends_with("/apis/apps/v1"), "{e}");
    Ok(())
}

#[tokio::test]
async fn v2beta1_answers_are_read() -> Result<()> {
    let served = Arc::new(Served::of("k8s-1.30"));
    let server = {
        let served = served.clone();
        TinyServer::start(move |req| {
            let body = if req.path == "/apis" {
                &served.apis
            } else {
                &served.api
            };
            let text = String::from_utf8(body.clone())
                .unwrap()
                .replace("apidiscovery.k8s.io/v2\"", "apidiscovery.k8s.io/v2beta1\"");
            Reply::ok(
                // Parameters in another order, with spaces.
                if req.path == "/apis" {
                    V2BETA1
                } else {
                    "application/json; as=APIGroupDiscoveryList; v=v2beta1; g=apidiscovery.k8s.io"
                },
                text.into_bytes(),
            )
        })
        .await?
    };
    let fetched = fetcher("apiserver-b", &server.url, FetchConfig::default())
        .fetch(None)
        .await?;
    assert!(
        matches!(&fetched.apis, Answer::Fresh(d) if d.format == DocumentFormat::AggregatedV2Beta1)
    );
    let docs = fetched.into_documents(None).context("docs")?;
    assert_eq!(docs.apis.api_version, "apidiscovery.k8s.io/v2beta1");
    assert_eq!(docs.served()?, served.docs.served()?);
    Ok(())
}

#[tokio::test]
async fn a_new_holder_identity_refetches_at_once_without_if_none_match() -> Result<()> {
    // The server keeps the same ETag while its content changes (a restarted apiserver whose
    // ETag happens to match): only an unconditional request sees the new documents.
    let (v130, v133) = (
        Arc::new(Served::of("k8s-1.30")),
        Arc::new(Served::of("k8s-1.33")),
    );
    let upgraded = Arc::new(Mutex::new(false));
    let server = {
        let (v130, v133, upgraded) = (v130.clone(), v133.clone(), upgraded.clone());
        TinyServer::start(move |req| {
            if *upgraded.lock().unwrap() {
                v133.aggregated(req, "\"same\"")
            } else {
                v130.aggregated(req, "\"same\"")
            }
        })
        .await?
    };
    let metrics = Arc::new(DiscoveryMetrics::new());
    // Long interval: only the trigger can cause a fetch during the test.
    let mut w = spawn_apiserver_watch(
        fetcher("apiserver-t", &server.url, FetchConfig::default()),
        RefreshConfig {
            interval: Duration::from_secs(3600),
            holder_refetch_interval: Duration::from_secs(2),
            ..Default::default()
        },
        metrics.clone(),
    );
    tokio::time::timeout(Duration::from_secs(10), w.tried()).await?;
    assert_eq!(*w.current().context("view")?, v130.docs);
    w.documents.borrow_and_update();
    assert!(
        !w.trigger.observe_holder_identity("apiserver-t_1"),
        "first sighting"
    );

    *upgraded.lock().unwrap() = true;
    server.clear();
    let started = Instant::now();
    assert!(w.trigger.observe_holder_identity("apiserver-t_2"));
    tokio::time::timeout(Duration::from_secs(10), w.documents.changed()).await??;
    println!("new holder identity to new view: {:?}", started.elapsed());
    assert_eq!(*w.current().context("view")?, v133.docs);
    let requests = server.requests();
    // `/apis`, `/api`, and `/openapi/v3` beside them.
    assert_eq!(requests.len(), 3, "{requests:?}");
    assert!(
        requests.iter().any(|r| r.path == "/openapi/v3"),
        "{requests:?}"
    );
    assert!(requests.iter().all(|r| r.header("if-none-match").is_none()));
    assert_eq!(metrics.outcomes_total(SyncOutcome::Updated), 2);

    // The same holder again: nothing happens.
    server.clear();
    assert!(!w.trigger.observe_holder_identity("apiserver-t_2"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(server.requests().is_empty());

    // A holder that changes on every renewal (here every 10 ms) within the rate limit: no
    // fetch until the interval after the last triggered one has passed, then exactly one
    // (unconditional) for all of them.
    for i in 3..40 {
        assert!(w
            .trigger
            .observe_holder_identity(&format!("apiserver-t_{i}")));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let deferred_within = Duration::from_secs(2).saturating_sub(started.elapsed());
    assert!(
        server.requests().is_empty(),
        "no refetch within the interval: {:?}",
        server.requests()
    );
    tokio::time::sleep(deferred_within + Duration::from_millis(1500)).await;
    let requests = server.requests();
    assert_eq!(
        requests.len(),
        3,
        "one coalesced refetch (/apis, /api, /openapi/v3): {requests:?}"
    );
    assert!(requests.iter().all(|r| r.header("if-none-match").is_none()));
    assert!(metrics.coalesced_triggers_total() >= 1);
    println!(
        "37 holder changes in {:?}: 1 refetch, {} triggers coalesced",
        started.elapsed(),
        metrics.coalesced_triggers_total()
    );
    Ok(())
}

// -------------------------------------------------------------------------------------------
// HTTPS: kube's TLS stack with the peer CA and SNI `kubernetes.default.svc`, against
// `openssl s_server` (skipped where there is no openssl binary).
// -------------------------------------------------------------------------------------------

fn openssl(dir: &std::path::Path, args: &[&str]) -> Result<()> {
    let out = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .context("running openssl")?;
    if !out.status.success() {
        bail!("openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// A CA (`<name>.crt`) and, signed by it, a serving certificate for `kubernetes.default.svc`
/// only (no IP SAN: verification must use the TLS server name, not the address).
fn make_pki(dir: &std::path::Path) -> Result<()> {
    for ca in ["ca", "other-ca"] {
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-keyout",
                &format!("{ca}.key"),
                "-out",
                &format!("{ca}.crt"),
                "-days",
                "2",
                "-subj",
                &format!("/CN={ca}"),
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        )?;
    }
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=kube-apiserver",
        ],
    )?;
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=DNS:kubernetes.default.svc,DNS:kubernetes\nbasicConstraints=CA:FALSE\n\
         keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
    )?;
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ],
    )
}

#[tokio::test]
async fn https_apiservers_are_verified_with_the_peer_ca_and_sni() -> Result<()> {
    if std::process::Command::new("openssl")
        .arg("version")
        .output()
        .is_err()
    {
        println!("SKIPPED: no openssl binary");
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    make_pki(dir.path())?;
    // `s_server -HTTP` answers `GET /<file>` with the file, a complete HTTP response.
    let served = Served::of("k8s-1.30");
    for (file, body) in [("apis", &served.apis), ("api", &served.api)] {
        let mut response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: {V2}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        response.extend_from_slice(body);
        std::fs::write(dir.path().join(file), response)?;
    }
    let port = free_port()?;
    let _server = tokio::process::Command::new("openssl")
        .args([
            "s_server",
            "-quiet",
            "-cert",
            "server.crt",
            "-key",
            "server.key",
            "-HTTP",
        ])
        .args(["-accept", &format!("127.0.0.1:{port}")])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let url = format!("https://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).await.is_err() {
        if Instant::now() > deadline {
            bail!("openssl s_server did not start");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let ca = std::fs::read(dir.path().join("ca.crt"))?;
    let template = ClientTemplate::anonymous().with_peer_ca_file(&dir.path().join("ca.crt"))?;
    let f = DiscoveryFetcher::new("apiserver-s", &url, &template, FetchConfig::default())?;
    let docs = f.fetch_documents().await?;
    assert_eq!(docs, served.docs);

    // Another CA, or another server name: the handshake fails, a connect error.
    let other = ClientTemplate::anonymous().with_peer_ca_file(&dir.path().join("other-ca.crt"))?;
    let wrong_name = ClientTemplate::anonymous()
        .with_peer_ca_pem(&ca, "ca.crt")?
        .with_tls_server_name("apiserver.example");
    for (what, t) in [("other CA", other), ("other server name", wrong_name)] {
        let e = DiscoveryFetcher::new("apiserver-s", &url, &t, FetchConfig::default())?
            .fetch(None)
            .await
            .expect_err(what);
        assert_eq!(e.error_type(), ErrorType::Connect, "{what}: {e}");
        println!("{what}: {e}");
    }

    // The peer CA file is renewed under a running fetcher: its next fetch verifies with the
    // new CA (no restart), and a file caught unusable keeps the client it had.
    let peer_ca = dir.path().join("peer-ca.crt");
    std::fs::copy(dir.path().join("other-ca.crt"), &peer_ca)?;
    let template = ClientTemplate::anonymous().with_peer_ca_file(&peer_ca)?;
    let f = DiscoveryFetcher::new("apiserver-s", &url, &template, FetchConfig::default())?;
    let e = f.fetch(None).await.expect_err("the other CA");
    assert_eq!(e.error_type(), ErrorType::Connect, "{e}");
    let tmp = dir.path().join(".peer-ca.crt.tmp");
    std::fs::write(&tmp, &ca)?;
    std::fs::rename(&tmp, &peer_ca)?;
    assert_eq!(f.fetch_documents().await?, served.docs);
    std::fs::write(&peer_ca, b"-----BEGIN CERTIFICATE-----\n")?;
    assert_eq!(
        f.fetch_documents().await?,
        served.docs,
        "kept the last good CA"
    );
    Ok(())
}
