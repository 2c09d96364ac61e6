//! Envoy never cuts its clients, and tells them when to move (issue 21, items 2 and 3): real
//! Envoy 1.40 started by its real entrypoint (`deploy/image/skewgate-envoy`, what the static pod
//! and the compose nodes run) with the pod's own Envoy flags (`deploy/args/envoy.args`), in front
//! of a simulated apiserver (the local-only fallback: no control plane needed), with HTTP/1.1
//! keep-alive and HTTP/2 clients that report every `Connection: close` and GOAWAY they get.
//!
//! - [`sigterm_drains_envoy_instead_of_cutting_requests`]: SIGTERM to the entrypoint under load
//!   (`skewgate-control drain-envoy`, `crate::envoy::drain` in skewgate-control);
//! - [`the_goaway_chance_moves_clients_and_never_ends_a_watch`] and
//!   [`no_goaway_without_a_chance_and_every_connection_when_switched`]: `bootstrap
//!   --goaway-chance` and its file (`crate::envoy::goaway`).

use std::path::PathBuf;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::json;
use skewgate_control::envoy::goaway::{self, ConnectionDrain};
use skewgate_control::local_channels::{LocalChannel, ADMIN_SOCKET};
use skewgate_tests::{
    control_bin, envoy_bin, filter_flags, free_port, local_get, repo_root, SimApiserver,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

/// One Envoy at a time: the timings below are in seconds on a shared machine.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const CONFIGMAPS: &str = "/api/v1/namespaces/default/configmaps";

fn configmap(name: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}})
}

/// `deploy/args/envoy.args` as the compose nodes expand it (`deploy/args/expand`), with the
/// static pod's concurrency.
fn envoy_args() -> Result<Vec<String>> {
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(r#". "$1" && expand_args "$2""#)
        .arg("expand")
        .arg(repo_root().join("deploy/args/expand"))
        .arg(repo_root().join("deploy/args/envoy.args"))
        .env("ENVOY_CONCURRENCY", "2")
        .output()?;
    ensure!(
        out.status.success(),
        "expand_args: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?
        .lines()
        .map(str::to_string)
        .collect())
}

/// Envoy as a control-plane node runs it: `skewgate-envoy BOOTSTRAP-FLAGS -- ENVOY-FLAGS`, its
/// own process group (so that dropping it kills Envoy too, whatever the entrypoint did).
struct Node {
    dir: tempfile::TempDir,
    child: Child,
    pid: u32,
    /// `127.0.0.1:port`, plaintext, HTTP/1.1 and HTTP/2 (prior knowledge).
    address: String,
    admin: LocalChannel,
}

impl Node {
    async fn start(
        sim: &SimApiserver,
        goaway_chance: &str,
        drain: u64,
        finish: u64,
    ) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin)?;
        std::os::unix::fs::symlink(envoy_bin()?, bin.join("envoy"))?;
        std::os::unix::fs::symlink(control_bin()?, bin.join("skewgate-control"))?;
        let run = dir.path().join("run");
        let address = format!("127.0.0.1:{}", free_port()?);
        let log = std::fs::File::create(dir.path().join("entrypoint.log"))?;
        let mut command = Command::new("bash");
        command
            .arg(repo_root().join("deploy/image/skewgate-envoy"))
            .arg("--node-id=drain-test")
            .arg(format!("--listen={address}"))
            .arg("--insecure-plaintext-listener")
            .arg(format!("--local-apiserver-url={}", sim.url()))
            .arg("--insecure-plaintext-upstreams")
            .args(filter_flags()?)
            // No control plane: Envoy serves its local-only fallback after this wait.
            .arg("--control-plane-wait=200ms")
            .arg(format!("--socket-dir={}", run.display()))
            .arg(format!(
                "--state-dir={}",
                dir.path().join("state").display()
            ))
            .arg(format!("--goaway-chance={goaway_chance}"))
            .arg("--")
            .args(envoy_args()?)
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    bin.display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .env("SKEWGATE_ENVOY_CONFIG", dir.path().join("envoy.yaml"))
            .env("SKEWGATE_DRAIN_SECONDS", drain.to_string())
            .env("SKEWGATE_FINISH_SECONDS", finish.to_string())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .kill_on_drop(true);
        let child = command
            .spawn()
            .context("starting deploy/image/skewgate-envoy")?;
        let pid = child.id().context("the entrypoint's pid")?;
        let mut node = Node {
            dir,
            child,
            pid,
            address,
            admin: LocalChannel::Unix(run.join(ADMIN_SOCKET)),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = node.child.try_wait()? {
                bail!("the entrypoint exited with {status}:\n{}", node.log());
            }
            if let Ok((200, _)) = h1_get(&node.address, "/version").await {
                return Ok(node);
            }
            if Instant::now() > deadline {
                bail!("Envoy did not serve within 30s:\n{}", node.log());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("entrypoint.log")).unwrap_or_default()
    }

    fn run_dir(&self) -> PathBuf {
        self.dir.path().join("run")
    }

    /// SIGTERM to the entrypoint, as the kubelet, `docker stop` and the compose node send it.
    fn sigterm(&self) -> Result<()> {
        let status = std::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status()?;
        ensure!(status.success(), "kill -TERM {}", self.pid);
        Ok(())
    }

    async fn stat(&self, name: &str) -> Result<u64> {
        let (_, stats) = local_get(&self.admin, &format!("/stats?filter=^{name}$")).await?;
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .and_then(|v| v.trim().parse().ok())
            .with_context(|| format!("stat {name} not in {stats:?}"))
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.pid)])
            .stderr(Stdio::null())
            .status();
    }
}

/// One GET on a new HTTP/1.1 connection: the status and body.
async fn h1_get(address: &str, path: &str) -> Result<(u16, String)> {
    let tcp = TcpStream::connect(address).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    let resp = sender
        .send_request(
            hyper::Request::get(path)
                .header("host", "envoy")
                .body(Full::new(Bytes::new()))?,
        )
        .await?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// What a client saw.
#[derive(Debug, Default)]
struct Tally {
    ok: u64,
    /// Connections refused (the ports closed).
    refused: Vec<Instant>,
    /// `Connection: close` (HTTP/1.1) or GOAWAY (HTTP/2) received.
    told_to_reconnect: Vec<Instant>,
    /// Requests sent that got no complete answer, or a wrong one: what must never happen.
    failed: Vec<String>,
    /// Requests whose new connection was reset before the server sent a byte on it (when, and
    /// the request's number): a connection the kernel completed just before Envoy closed its
    /// listening socket is reset with the socket, never accepted by Envoy (see
    /// [`CountingStream`]). Turned away, if it came at the ports' close (the caller checks, and
    /// looks the HTTP/1.1 creates up on the apiserver); cut otherwise.
    reset_unread: Vec<(Instant, u64)>,
}

impl Tally {
    /// For failure messages: counts, times in seconds since `since`, every failure.
    fn summary(&self, since: Instant) -> String {
        let times = |ts: &[Instant]| match (ts.first(), ts.last()) {
            (Some(first), Some(last)) => format!(
                "{} ({:.1}s to {:.1}s)",
                ts.len(),
                secs(since, *first),
                secs(since, *last)
            ),
            _ => "0".to_string(),
        };
        format!(
            "{} ok, told to reconnect {}, refused {}, reset unread {:?}, failed {:?}",
            self.ok,
            times(&self.told_to_reconnect),
            times(&self.refused),
            self.reset_unread
                .iter()
                .map(|(t, n)| format!("request {n} at {:.1}s", secs(since, *t)))
                .collect::<Vec<_>>(),
            self.failed
        )
    }

    /// Request `n` failed with `error`: turned away (reset unread) if a TCP reset (`reset`)
    /// ended a connection the server never sent a byte on (see [`CountingStream`]), cut
    /// otherwise.
    fn request_failed(
        &mut self,
        n: u64,
        reset: bool,
        server_sent: &AtomicU64,
        error: impl std::fmt::Display,
    ) {
        if reset && server_sent.load(Ordering::Relaxed) == 0 {
            self.reset_unread.push((Instant::now(), n));
        } else {
            self.failed.push(format!("request {n}: {error}"));
        }
    }

    /// With the ports open throughout: every request sent got its complete, expected answer,
    /// and no connection was turned away.
    fn all_served(&self) -> bool {
        self.failed.is_empty() && self.reset_unread.is_empty() && self.refused.is_empty()
    }
}

/// What a request loop sends: request `n`'s method, path, body and extra header.
#[derive(Clone, Copy)]
enum Load {
    /// POST a new ConfigMap (not safe to repeat: a cut one is lost), answered 20 ms late.
    Create,
    /// GET the ConfigMap `fixed`, answered 20 ms late.
    Get,
    /// GET the ConfigMap `fixed`, at once.
    FastGet,
}

impl Load {
    fn request(self, n: u64, tag: &str) -> (hyper::Method, String, Bytes, u64) {
        match self {
            Load::Create => (
                hyper::Method::POST,
                CONFIGMAPS.to_string(),
                Bytes::from(configmap(&format!("{tag}-{n}")).to_string()),
                20,
            ),
            Load::Get => (
                hyper::Method::GET,
                format!("{CONFIGMAPS}/fixed"),
                Bytes::new(),
                20,
            ),
            Load::FastGet => (
                hyper::Method::GET,
                format!("{CONFIGMAPS}/fixed"),
                Bytes::new(),
                0,
            ),
        }
    }

    fn expected(self) -> u16 {
        match self {
            Load::Create => 201,
            Load::Get | Load::FastGet => 200,
        }
    }
}

fn is_refused(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::ConnectionRefused
}

/// A new connection the closed port turned away before the client sent anything: refused, or
/// reset while the handshake raced the listening socket's close.
fn is_turned_away(e: &std::io::Error) -> bool {
    is_refused(e) || e.kind() == std::io::ErrorKind::ConnectionReset
}

/// A client's TCP connection that counts the bytes the client read from the server on it. A
/// connection reset before the client read a byte was never accepted by Envoy: Envoy writes its
/// HTTP/2 SETTINGS as soon as it reads the preface, answers an HTTP/1.1 request before anything
/// else, and leaves the connections it accepted open when its ports close. It was reset by the
/// kernel, queued on the listening socket Envoy closed: turned away, like a refused connection.
/// (The clients read before they fail on a write, so bytes Envoy sent are read first.)
struct CountingStream {
    tcp: TcpStream,
    read: Arc<AtomicU64>,
}

impl CountingStream {
    async fn connect(address: &str) -> std::io::Result<(Self, Arc<AtomicU64>)> {
        let tcp = TcpStream::connect(address).await?;
        let read = Arc::new(AtomicU64::new(0));
        Ok((
            CountingStream {
                tcp,
                read: read.clone(),
            },
            read,
        ))
    }
}

impl AsyncRead for CountingStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.tcp).poll_read(cx, buf);
        let read = (buf.filled().len() - before) as u64;
        self.read.fetch_add(read, Ordering::Relaxed);
        polled
    }
}

impl AsyncWrite for CountingStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

/// Sequential requests on HTTP/1.1 keep-alive connections until `until` or `max` requests; a
/// new connection after each `Connection: close`.
async fn h1_loop(address: String, load: Load, until: Instant, max: u64) -> Tally {
    let mut tally = Tally::default();
    let mut n = 0;
    'connections: while Instant::now() < until && n < max {
        let (tcp, server_sent) = match CountingStream::connect(&address).await {
            Ok(tcp) => tcp,
            Err(e) => {
                if is_turned_away(&e) {
                    tally.refused.push(Instant::now());
                } else {
                    tally.failed.push(format!("connect: {e}"));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (mut sender, conn) =
            match hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await {
                Ok(c) => c,
                Err(e) => {
                    tally.failed.push(format!("handshake: {e}"));
                    continue;
                }
            };
        tokio::spawn(conn);
        while Instant::now() < until && n < max {
            if sender.ready().await.is_err() {
                // Closed while idle, without a Connection: close: nothing was sent.
                continue 'connections;
            }
            n += 1;
            let (method, path, body, delay) = load.request(n, "h1");
            let request = hyper::Request::builder()
                .method(method)
                .uri(path)
                .header("host", "envoy")
                .header("content-type", "application/json")
                .header("x-sim-delay-ms", delay.to_string())
                .body(Full::new(body))
                .expect("a request");
            let resp = match sender.send_request(request).await {
                Ok(resp) => resp,
                Err(e) => {
                    tally.request_failed(n, is_reset_by(&e), &server_sent, e);
                    continue 'connections;
                }
            };
            let status = resp.status().as_u16();
            let close = resp
                .headers()
                .get("connection")
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
            match resp.into_body().collect().await {
                Ok(_) if status == load.expected() => tally.ok += 1,
                Ok(_) => tally.failed.push(format!("request {n}: status {status}")),
                Err(e) => tally.failed.push(format!("request {n}: body: {e}")),
            }
            if close {
                tally.told_to_reconnect.push(Instant::now());
                continue 'connections;
            }
        }
        break;
    }
    tally
}

/// A watch's life: when each event arrived, and when and how it ended.
#[derive(Debug, Default)]
struct WatchLog {
    events: Vec<Instant>,
    ended: Option<(Instant, String)>,
}

impl WatchLog {
    fn events_after(&self, t: Instant) -> usize {
        self.events.iter().filter(|e| **e > t).count()
    }
}

/// Sequential requests on HTTP/2 connections (prior knowledge) until `until` or `max`
/// requests; a new connection once the current one got a GOAWAY. With `watch`, the first
/// connection also carries a watch on ConfigMaps, logged there.
async fn h2_loop(
    address: String,
    load: Load,
    until: Instant,
    max: u64,
    watch: Option<Arc<Mutex<WatchLog>>>,
) -> Tally {
    let mut tally = Tally::default();
    let mut watch = watch;
    let mut n = 0;
    'connections: while Instant::now() < until && n < max {
        let (mut send, server_sent) = match h2_connect(&address).await {
            Ok(connected) => connected,
            Err(Connect::Refused) => {
                tally.refused.push(Instant::now());
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            Err(Connect::Other(e)) => {
                tally.failed.push(format!("connect: {e}"));
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if let Some(log) = watch.take() {
            if let Err(e) = h2_watch(&address, send.clone(), log).await {
                tally.failed.push(format!("watch: {e}"));
            }
        }
        while Instant::now() < until && n < max {
            send = match send.ready().await {
                Ok(send) => send,
                Err(e) if e.is_go_away() => {
                    tally.told_to_reconnect.push(Instant::now());
                    continue 'connections;
                }
                Err(e) if is_reset(&e) && server_sent.load(Ordering::Relaxed) == 0 => {
                    // Reset before Envoy accepted it, nothing sent: turned away.
                    tally.refused.push(Instant::now());
                    continue 'connections;
                }
                Err(e) => {
                    // Closed without a GOAWAY; nothing was sent.
                    tally
                        .failed
                        .push(format!("connection lost while idle: {e}"));
                    continue 'connections;
                }
            };
            n += 1;
            let (method, path, body, delay) = load.request(n, "h2");
            let request = hyper::Request::builder()
                .method(method)
                .uri(format!("http://{address}{path}"))
                .header("content-type", "application/json")
                .header("x-sim-delay-ms", delay.to_string())
                .body(())
                .expect("a request");
            let end = body.is_empty();
            let (response, mut stream) = match send.send_request(request, end) {
                Ok(sent) => sent,
                Err(e) if e.is_go_away() => {
                    n -= 1;
                    tally.told_to_reconnect.push(Instant::now());
                    continue 'connections;
                }
                Err(e) => {
                    tally.request_failed(n, is_reset(&e), &server_sent, e);
                    continue 'connections;
                }
            };
            if !end {
                if let Err(e) = stream.send_data(body, true) {
                    tally.failed.push(format!("request {n}: body: {e}"));
                    continue 'connections;
                }
            }
            match h2_response(response).await {
                Ok((status, _)) if status == load.expected() => tally.ok += 1,
                Ok((status, body)) => tally
                    .failed
                    .push(format!("request {n}: status {status}: {body}")),
                Err(e) => {
                    // Counted once: the next request goes on a new connection, whether this one
                    // is gone or only the stream was reset.
                    tally.request_failed(n, is_reset(&e), &server_sent, e);
                    continue 'connections;
                }
            }
        }
        break;
    }
    tally
}

/// An HTTP/1.1 request's failure by a TCP reset (not a clean close, nor anything else).
fn is_reset_by(e: &hyper::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
            );
        }
        source = cause.source();
    }
    false
}

/// An HTTP/2 connection's end by a TCP reset.
fn is_reset(e: &h2::Error) -> bool {
    e.get_io()
        .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionReset)
}

enum Connect {
    Refused,
    Other(String),
}

/// A new HTTP/2 connection, and the count of the bytes the server sent on it.
async fn h2_connect(
    address: &str,
) -> Result<(h2::client::SendRequest<Bytes>, Arc<AtomicU64>), Connect> {
    let (tcp, server_sent) = CountingStream::connect(address).await.map_err(|e| {
        if is_turned_away(&e) {
            Connect::Refused
        } else {
            Connect::Other(e.to_string())
        }
    })?;
    let (send, conn) = h2::client::handshake(tcp).await.map_err(|e| {
        if e.get_io().is_some_and(is_turned_away) {
            Connect::Refused
        } else {
            Connect::Other(e.to_string())
        }
    })?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok((send, server_sent))
}

async fn h2_response(response: h2::client::ResponseFuture) -> Result<(u16, String), h2::Error> {
    let response = response.await?;
    let status = response.status().as_u16();
    let mut body = response.into_body();
    let mut bytes = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
        bytes.extend_from_slice(&chunk);
    }
    Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
}

/// Open a watch on ConfigMaps on this HTTP/2 connection; a task logs its events until it ends.
async fn h2_watch(
    address: &str,
    send: h2::client::SendRequest<Bytes>,
    log: Arc<Mutex<WatchLog>>,
) -> Result<()> {
    let mut send = send.ready().await?;
    let request = hyper::Request::get(format!("http://{address}{CONFIGMAPS}?watch=1"))
        .body(())
        .expect("a request");
    let (response, _) = send.send_request(request, true)?;
    let response = response.await?;
    ensure!(response.status() == 200, "watch: {}", response.status());
    let mut body = response.into_body();
    tokio::spawn(async move {
        let end = loop {
            match body.data().await {
                Some(Ok(chunk)) => {
                    let _ = body.flow_control().release_capacity(chunk.len());
                    log.lock().expect("log").events.push(Instant::now());
                }
                Some(Err(e)) => break format!("error: {e}"),
                None => break "end of stream".to_string(),
            }
        };
        log.lock().expect("log").ended = Some((Instant::now(), end));
    });
    Ok(())
}

/// Open a watch on ConfigMaps on a new HTTP/1.1 connection; a task logs it until it ends.
async fn h1_watch(address: &str, log: Arc<Mutex<WatchLog>>) -> Result<()> {
    let tcp = TcpStream::connect(address).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    let resp = sender
        .send_request(
            hyper::Request::get(format!("{CONFIGMAPS}?watch=1"))
                .header("host", "envoy")
                .body(Full::new(Bytes::new()))?,
        )
        .await?;
    ensure!(resp.status() == 200, "watch: {}", resp.status());
    let mut body = resp.into_body();
    tokio::spawn(async move {
        let end = loop {
            match body.frame().await {
                Some(Ok(_)) => log.lock().expect("log").events.push(Instant::now()),
                Some(Err(e)) => break format!("error: {e}"),
                None => break "end of body".to_string(),
            }
        };
        // Keep the sender (and so the connection) until the body ended.
        drop(sender);
        log.lock().expect("log").ended = Some((Instant::now(), end));
    });
    Ok(())
}

/// Create ConfigMaps on the apiserver itself (not through Envoy) every 100 ms until `until`:
/// events for the watches, whatever state Envoy's ports are in.
async fn create_directly(sim_url: String, until: Instant) -> Result<u64> {
    let client = reqwest::Client::new();
    let mut n = 0;
    while Instant::now() < until {
        n += 1;
        let resp = client
            .post(format!("{sim_url}{CONFIGMAPS}"))
            .json(&configmap(&format!("direct-{n}")))
            .send()
            .await?;
        ensure!(resp.status() == 201, "direct create: {}", resp.status());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(n)
}

/// A load balancer's `/readyz` probe: a new connection every 200 ms until `until`.
async fn probe_readyz(address: String, until: Instant) -> Vec<(Instant, String)> {
    let mut seen = Vec::new();
    while Instant::now() < until {
        let at = Instant::now();
        let result = match h1_get(&address, "/readyz").await {
            Ok((status, _)) => status.to_string(),
            Err(e) if e.downcast_ref::<std::io::Error>().is_some_and(is_refused) => {
                "refused".to_string()
            }
            Err(e) => format!("error: {e}"),
        };
        seen.push((at, result));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    seen
}

/// The clients' own reading of a reset, which the SIGTERM test relies on. A connection the
/// kernel completed on a listening socket that closes before accepting it is reset before the
/// server sent a byte: its request is counted as reset unread (turned away), and the next
/// connections as refused. A connection reset after the server sent something (a partial
/// HTTP/1.1 answer, HTTP/2's SETTINGS) is a cut request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_before_the_server_sent_a_byte_is_turned_away_and_after_it_cut() -> Result<()> {
    // The clients reconnect to ports this test frees: no other Envoy or apiserver of this
    // file may take one meanwhile.
    let _serial = SERIAL.lock().await;
    for http2 in [false, true] {
        let (load, name) = (Load::FastGet, if http2 { "HTTP/2" } else { "HTTP/1.1" });
        let client = |address: String, until: Instant| {
            if http2 {
                tokio::spawn(h2_loop(address, load, until, 2, None))
            } else {
                tokio::spawn(h1_loop(address, load, until, 2))
            }
        };

        // Never accepted: the listening socket closes with the connection queued on it.
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let address = listener.local_addr()?.to_string();
        let tally = client(address, Instant::now() + Duration::from_millis(800));
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(listener);
        let tally = tally.await?;
        ensure!(
            tally.failed.is_empty()
                && tally.ok == 0
                && tally.reset_unread.iter().map(|(_, n)| *n).eq([1])
                && !tally.refused.is_empty(),
            "{name}, never accepted: {tally:?}"
        );

        // Accepted, the request read, some bytes sent, then reset.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?.to_string();
        let tally = client(address, Instant::now() + Duration::from_millis(800));
        let (mut tcp, _) = listener.accept().await?;
        let mut request = [0; 64];
        tokio::io::AsyncReadExt::read(&mut tcp, &mut request).await?;
        let sent: &[u8] = if http2 {
            // An empty SETTINGS frame.
            &[0, 0, 0, 4, 0, 0, 0, 0, 0]
        } else {
            b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{"
        };
        tokio::io::AsyncWriteExt::write_all(&mut tcp, sent).await?;
        tokio::time::sleep(Duration::from_millis(100)).await;
        // The port closes first: the client's next connection is refused, not queued.
        drop(listener);
        tcp.set_zero_linger()?;
        drop(tcp);
        let tally = tally.await?;
        ensure!(
            tally.failed.len() == 1 && tally.ok == 0 && tally.reset_unread.is_empty(),
            "{name}, reset after the server sent {} bytes: {tally:?}",
            sent.len()
        );
    }
    Ok(())
}

fn secs(since: Instant, t: Instant) -> f64 {
    t.saturating_duration_since(since).as_secs_f64()
        - since.saturating_duration_since(t).as_secs_f64()
}

/// SIGTERM to the entrypoint while HTTP/1.1 and HTTP/2 clients send requests back to back
/// (creates over HTTP/1.1, reads over HTTP/2, each answered 20 ms late so one is always in
/// flight), two watches stream, a load balancer probes `/readyz`, and a slow request (2 s) is
/// sent just before the ports close. With a drain time D and a finish time T:
/// - no request is cut, POSTs included: every request sent got its complete answer;
/// - from the SIGTERM every client is told to reconnect (HTTP/1.1 `Connection: close`, HTTP/2
///   GOAWAY), `/readyz` answers 503, new connections are still served until D and refused
///   after it;
/// - the slow request, in flight when the ports close, is answered;
/// - both watches stream until Envoy exits at D + T (events after D), and end then;
/// - the entrypoint exits 0 at D + T.
///
/// With the old entrypoint (`exec envoy`) this fails at once: Envoy exits on SIGTERM, the
/// requests in flight fail (`connection closed before message completed`), the watches end and
/// connections are refused immediately.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_drains_envoy_instead_of_cutting_requests() -> Result<()> {
    let _serial = SERIAL.lock().await;
    const D: u64 = 3;
    const T: u64 = 3;
    let sim = SimApiserver::start("apiserver-a", "k8s-1.33").await?;
    let fixed = reqwest::Client::new()
        .post(format!("{}{CONFIGMAPS}", sim.url()))
        .json(&configmap("fixed"))
        .send()
        .await?;
    ensure!(fixed.status() == 201, "creating fixed: {}", fixed.status());
    let mut node = Node::start(&sim, "0", D, T).await?;

    let sigterm_at = Instant::now() + Duration::from_secs(2);
    let d = sigterm_at + Duration::from_secs(D);
    let dt = d + Duration::from_secs(T);
    // The loops stop well after the ports closed (they are refused by then) and before Envoy
    // exits; the watches and the creates go on past the exit.
    let loops_until = d + Duration::from_millis(1500);
    let h1 = tokio::spawn(h1_loop(
        node.address.clone(),
        Load::Create,
        loops_until,
        u64::MAX,
    ));
    let h2_watch_log = Arc::new(Mutex::new(WatchLog::default()));
    let h2 = tokio::spawn(h2_loop(
        node.address.clone(),
        Load::Get,
        loops_until,
        u64::MAX,
        Some(h2_watch_log.clone()),
    ));
    let h1_watch_log = Arc::new(Mutex::new(WatchLog::default()));
    h1_watch(&node.address, h1_watch_log.clone()).await?;
    let creates = tokio::spawn(create_directly(sim.url(), dt + Duration::from_secs(2)));
    let readyz = tokio::spawn(probe_readyz(node.address.clone(), loops_until));
    let slow = {
        let address = node.address.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until((d - Duration::from_millis(800)).into()).await;
            let sent = Instant::now();
            let tcp = TcpStream::connect(&address).await?;
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
            tokio::spawn(conn);
            let resp = sender
                .send_request(
                    hyper::Request::get(format!("{CONFIGMAPS}/fixed"))
                        .header("host", "envoy")
                        .header("x-sim-delay-ms", "2000")
                        .body(Full::new(Bytes::new()))?,
                )
                .await?;
            let status = resp.status().as_u16();
            resp.into_body().collect().await?;
            anyhow::Ok((sent, status, Instant::now()))
        })
    };

    tokio::time::sleep_until(sigterm_at.into()).await;
    node.sigterm()?;
    let sigterm = Instant::now();
    let status = tokio::time::timeout(Duration::from_secs(D + T + 15), node.child.wait())
        .await
        .context("the entrypoint did not exit")??;
    let exited = Instant::now();
    let h1 = h1.await?;
    let h2 = h2.await?;
    let readyz = readyz.await?;
    let slow = slow.await?;
    let created = creates.await??;
    let log = node.log();
    let context = || {
        format!(
            "HTTP/1.1: {}\nHTTP/2: {}\nreadyz {:?}\nentrypoint log:\n{log}",
            h1.summary(sigterm),
            h2.summary(sigterm),
            readyz
                .iter()
                .map(|(t, r)| format!("{:.1}s {r}", secs(sigterm, *t)))
                .collect::<Vec<_>>()
        )
    };

    eprintln!(
        "HTTP/1.1: {} ok, {} Connection: close, {} refused; HTTP/2: {} ok, {} GOAWAY, {} refused",
        h1.ok,
        h1.told_to_reconnect.len(),
        h1.refused.len(),
        h2.ok,
        h2.told_to_reconnect.len(),
        h2.refused.len()
    );
    // Nothing cut.
    ensure!(
        h1.failed.is_empty() && h2.failed.is_empty(),
        "requests were cut:\n{}",
        context()
    );
    // A request reset before Envoy sent a byte on its new connection: the kernel reset a
    // connection Envoy never accepted, as the ports closed. Turned away, if it came at the close
    // and (the creates, looked up by name) never reached the apiserver; cut otherwise.
    // The lookup finds what did reach it: the first create, answered long before the SIGTERM.
    let first = reqwest::get(format!("{}{CONFIGMAPS}/h1-1", sim.url()))
        .await?
        .status();
    ensure!(first == 200, "the first create is not found ({first})");
    for (name, tally) in [("HTTP/1.1", &h1), ("HTTP/2", &h2)] {
        for (at, n) in &tally.reset_unread {
            ensure!(
                *at > d - Duration::from_millis(200) && *at < d + Duration::from_secs(1),
                "{name} request {n} reset unread away from the ports' close:\n{}",
                context()
            );
        }
    }
    for (_, n) in &h1.reset_unread {
        let found = reqwest::get(format!("{}{CONFIGMAPS}/h1-{n}", sim.url()))
            .await?
            .status();
        ensure!(
            found == 404,
            "HTTP/1.1 request {n} was reset without an answer but reached the apiserver ({found}):\n{}",
            context()
        );
    }
    ensure!(h1.ok > 20 && h2.ok > 20, "too little load:\n{}", context());
    // Told to reconnect during the drain, served while the ports were open, refused after.
    for (name, tally) in [("HTTP/1.1", &h1), ("HTTP/2", &h2)] {
        ensure!(
            tally
                .told_to_reconnect
                .iter()
                .any(|t| *t > sigterm && *t < d),
            "{name}: never told to reconnect during the drain:\n{}",
            context()
        );
        ensure!(
            tally
                .refused
                .iter()
                .all(|t| *t > d - Duration::from_millis(200)),
            "{name}: refused before the drain time ended:\n{}",
            context()
        );
        ensure!(
            !tally.refused.is_empty(),
            "{name}: never refused after the drain time:\n{}",
            context()
        );
    }
    // /readyz: the apiserver's 200 before, Envoy's 503 from the SIGTERM, refused after D.
    for (at, result) in &readyz {
        let t = secs(sigterm, *at);
        let expected = if t < -0.1 {
            "200"
        } else if t > 0.3 && t < D as f64 - 0.3 {
            "503"
        } else if t > D as f64 + 0.3 {
            "refused"
        } else {
            continue;
        };
        ensure!(
            result == expected,
            "/readyz at {t:.1}s: {result}, expected {expected}:\n{}",
            context()
        );
    }
    // The slow request crossed the closing of the ports and was answered.
    let (slow_sent, slow_status, slow_done) =
        slow.with_context(|| format!("the slow request:\n{}", context()))?;
    ensure!(
        slow_status == 200 && slow_sent < d && slow_done > d,
        "slow request: {slow_status}, sent {:.1}s, done {:.1}s:\n{}",
        secs(sigterm, slow_sent),
        secs(sigterm, slow_done),
        context()
    );
    // The watches stream until Envoy exits, then end.
    for (name, log) in [("HTTP/1.1", &h1_watch_log), ("HTTP/2", &h2_watch_log)] {
        let log = log.lock().expect("log");
        let after_d = log.events_after(d + Duration::from_millis(300));
        let Some((ended, how)) = &log.ended else {
            bail!("{name} watch still open after Envoy exited:\n{}", context());
        };
        ensure!(
            after_d > 0 && *ended > dt - Duration::from_millis(500),
            "{name} watch: {after_d} events after D, ended at {:.1}s ({how}); {created} created:\n{}",
            secs(sigterm, *ended),
            context()
        );
    }
    ensure!(
        status.success(),
        "the entrypoint exited with {status}:\n{}",
        context()
    );
    let took = secs(sigterm, exited);
    ensure!(
        took > (D + T) as f64 - 0.5 && took < (D + T) as f64 + 5.0,
        "Envoy exited {took:.1}s after SIGTERM, expected about {}s:\n{}",
        D + T,
        context()
    );
    Ok(())
}

/// `bootstrap --goaway-chance=0.02` (kube-apiserver's maximum): about 2 % of the requests on
/// HTTP/2 connections end their connection with a GOAWAY (1,500 sequential requests: 30
/// expected; 10 to 60 accepted, each bound more than four standard deviations away), no request
/// fails, and HTTP/1.1 clients get `Connection: close` likewise (500 requests). A watch on the
/// first HTTP/2 connection keeps streaming after its connection got its GOAWAY, and after the
/// final one (the connection manager's drain timeout, 5 s, later): like kube-apiserver's, the
/// chance moves a client's next requests, never ends a watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_goaway_chance_moves_clients_and_never_ends_a_watch() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let sim = SimApiserver::start("apiserver-a", "k8s-1.33").await?;
    let fixed = reqwest::Client::new()
        .post(format!("{}{CONFIGMAPS}", sim.url()))
        .json(&configmap("fixed"))
        .send()
        .await?;
    ensure!(fixed.status() == 201, "creating fixed: {}", fixed.status());
    let node = Node::start(&sim, "0.02", 1, 1).await?;
    let far = Instant::now() + Duration::from_secs(120);
    let creates = tokio::spawn(create_directly(sim.url(), far));

    let watch = Arc::new(Mutex::new(WatchLog::default()));
    let start = Instant::now();
    let h2 = h2_loop(
        node.address.clone(),
        Load::FastGet,
        far,
        1500,
        Some(watch.clone()),
    )
    .await;
    let h1 = h1_loop(node.address.clone(), Load::FastGet, far, 500).await;
    let context = || {
        format!(
            "HTTP/2: {}\nHTTP/1.1: {}\nentrypoint log:\n{}",
            h2.summary(start),
            h1.summary(start),
            node.log()
        )
    };
    ensure!(
        h2.all_served() && h1.all_served(),
        "requests failed:\n{}",
        context()
    );
    let goaways = h2.told_to_reconnect.len();
    eprintln!(
        "chance 0.02: {goaways} GOAWAYs in {} HTTP/2 requests, {} Connection: close in {} HTTP/1.1 requests",
        h2.ok,
        h1.told_to_reconnect.len(),
        h1.ok
    );
    ensure!(
        (10..=60).contains(&goaways),
        "{goaways} GOAWAYs in 1500 HTTP/2 requests at chance 0.02:\n{}",
        context()
    );
    let closes = h1.told_to_reconnect.len();
    ensure!(
        (1..=30).contains(&closes),
        "{closes} Connection: close in 500 HTTP/1.1 requests at chance 0.02:\n{}",
        context()
    );
    // Envoy counts the connections it drained for the chance (GOAWAYs the client had no
    // request left to see are counted too).
    let drained = node
        .stat("http.apiserver.downstream_cx_overload_disable_keepalive")
        .await?;
    ensure!(
        drained as usize >= goaways + closes,
        "Envoy drained {drained} connections, the clients saw {goaways} + {closes}"
    );

    // The watch's connection got its GOAWAY with the loop's first one; its final GOAWAY comes
    // 5 s later. The watch streams on past both.
    let first_goaway = h2.told_to_reconnect[0];
    tokio::time::sleep_until((first_goaway + Duration::from_millis(6500)).into()).await;
    let log = watch.lock().expect("log");
    let late = log.events_after(first_goaway + Duration::from_millis(5500));
    ensure!(
        log.ended.is_none() && late > 0,
        "the watch: ended {:?}, {late} events after the final GOAWAY:\n{}",
        log.ended,
        context()
    );
    drop(log);
    creates.abort();
    Ok(())
}

/// With the default chance (0) no connection is ever told to go away, over HTTP/2 or HTTP/1.1.
/// Then the switch issue 21's "local apiserver down" needs, through the one writer of the file
/// (`goaway::write`, as the control plane will use it): "every connection" makes each response
/// drain its connection (every request on a new HTTP/2 connection sees its GOAWAY), and the
/// configured chance again stops that.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_goaway_without_a_chance_and_every_connection_when_switched() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let sim = SimApiserver::start("apiserver-a", "k8s-1.33").await?;
    let fixed = reqwest::Client::new()
        .post(format!("{}{CONFIGMAPS}", sim.url()))
        .json(&configmap("fixed"))
        .send()
        .await?;
    ensure!(fixed.status() == 201, "creating fixed: {}", fixed.status());
    let node = Node::start(&sim, "0", 1, 1).await?;
    let far = Instant::now() + Duration::from_secs(120);
    let drained = "http.apiserver.downstream_cx_overload_disable_keepalive";
    let pressure = "overload.envoy.resource_monitors.injected_resource.pressure";

    let start = Instant::now();
    let h2 = h2_loop(node.address.clone(), Load::FastGet, far, 500, None).await;
    let h1 = h1_loop(node.address.clone(), Load::FastGet, far, 300).await;
    ensure!(
        h2.all_served() && h1.all_served() && h2.ok == 500 && h1.ok == 300,
        "HTTP/2: {}\nHTTP/1.1: {}",
        h2.summary(start),
        h1.summary(start)
    );
    ensure!(
        h2.told_to_reconnect.is_empty() && h1.told_to_reconnect.is_empty(),
        "told to reconnect at chance 0: HTTP/2: {}\nHTTP/1.1: {}",
        h2.summary(start),
        h1.summary(start)
    );
    ensure!(
        node.stat(drained).await? == 0,
        "Envoy drained connections at chance 0"
    );

    let wait_for_pressure = |percent: u64| {
        let node = &node;
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            while node.stat(pressure).await? != percent {
                ensure!(
                    Instant::now() < deadline,
                    "{pressure} never became {percent}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            anyhow::Ok(())
        }
    };
    goaway::write(&node.run_dir(), ConnectionDrain::EveryConnection)?;
    wait_for_pressure(100).await?;
    let every = h2_loop(node.address.clone(), Load::FastGet, far, 20, None).await;
    ensure!(
        every.all_served() && every.ok == 20 && every.told_to_reconnect.len() >= 19,
        "every connection: {}",
        every.summary(start)
    );

    goaway::write(
        &node.run_dir(),
        ConnectionDrain::Chance("0".parse().map_err(anyhow::Error::msg)?),
    )?;
    wait_for_pressure(0).await?;
    let after = h2_loop(node.address.clone(), Load::FastGet, far, 200, None).await;
    ensure!(
        after.all_served() && after.ok == 200 && after.told_to_reconnect.is_empty(),
        "back to the chance: {}",
        after.summary(start)
    );
    Ok(())
}
