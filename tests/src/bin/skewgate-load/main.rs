//! `skewgate-load`: the bounded load generator and discovery sampler of the compose suite's
//! rolling-upgrade scenario (`tests/compose/rolling-upgrade`).
//!
//! `run` sends `--rate` list requests per second in total, round-robin over every `--node`
//! (each node's Envoy, TLS with a client certificate) and over a fixed mix of GVRs that only
//! 1.30 serves, only 1.33 serves, and both serve; every second it also fetches each node's
//! merged aggregated `/apis` and records which group-versions it lists and which are marked
//! `freshness: Stale`. It stops by itself after `--duration`, or earlier when the driver's truth
//! file says phase `end`; then it waits for what is in flight (each request is bounded by
//! `--timeout`) and writes `requests.jsonl`, `samples.jsonl`, `summary.json` into `--out` and
//! the per-phase table on stdout.
//!
//! `report` classifies recorded results again against the truth file (see `truth.rs` for its
//! format and for what "required" means): a **wrong 404** is a 404 for a GVR that a required
//! version serves (at the request's start and at its end); a **hiding sample** is a discovery
//! sample that lacks a group-version a required version serves. Against the driver's record of
//! what ran when (`running.rs`): an **avoidable 503** is a 503 for a GVR that an apiserver the
//! node's Envoy could reach served throughout the request; a request **cut by an Envoy
//! restart** got no answer (refused, closed, reset) from a node whose Envoy was down at some
//! moment of it.

mod report;
mod running;
mod truth;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::{Parser, Subcommand};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, Semaphore};

/// The default request mix (`--gvr`): list requests (all namespaces) by group/version/resource.
/// The first two only 1.30 serves, the next two only 1.33, the last two both (checked against
/// the fixtures by the report, not assumed here).
const GVRS: &[&str] = &[
    "resource.k8s.io/v1alpha2/resourceclaims",
    "flowcontrol.apiserver.k8s.io/v1beta3/flowschemas",
    "resource.k8s.io/v1beta2/resourceclaims",
    "resource.k8s.io/v1beta2/deviceclasses",
    "apps/v1/deployments",
    "v1/pods",
];

const AGGREGATED_ACCEPT: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

#[derive(Parser, Debug)]
#[command(name = "skewgate-load")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Send the load and sample discovery, then report.
    Run(RunArgs),
    /// Classify recorded results again (requests.jsonl and samples.jsonl in --out).
    Report(ReportArgs),
}

#[derive(clap::Args, Debug)]
struct ReportArgs {
    /// Directory with requests.jsonl and samples.jsonl; summary.json is written there.
    #[arg(long)]
    out: PathBuf,
    /// The driver's truth file (`<unix ms> <phase> <versions>` per line).
    #[arg(long)]
    truth: PathBuf,
    /// The driver's record of what ran when (`<unix ms> <node> apiserver|envoy ready|stopped
    /// [version]` per line, see running.rs).
    #[arg(long)]
    running: PathBuf,
    /// Folder of `k8s-<version>` discovery fixtures.
    #[arg(long)]
    fixtures: PathBuf,
    /// A version added to the truth is required only this long after (`10s`, `500ms`).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    settle: Duration,
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// A node's Envoy: `NAME=https://IP:6443` (repeat for each node).
    #[arg(long = "node", required = true, value_parser = parse_node)]
    nodes: Vec<(String, String)>,
    /// CA bundle the Envoys' serving certificate is checked against.
    #[arg(long)]
    ca: PathBuf,
    /// Client certificate (PEM), as kubectl's user.
    #[arg(long)]
    cert: PathBuf,
    /// Client key (PEM).
    #[arg(long)]
    key: PathBuf,
    /// Requests per second in total, over every node.
    #[arg(long, default_value_t = 120.0)]
    rate: f64,
    /// Upper bound of the run (`180s`, `3m`).
    #[arg(long, value_parser = parse_duration)]
    duration: Duration,
    /// Each request's bound.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    timeout: Duration,
    /// Requests in flight per node beyond which a tick is shed (recorded, not sent).
    #[arg(long, default_value_t = 256)]
    max_in_flight: usize,
    /// A group/version/resource to list (`apps/v1/deployments`, `v1/pods`; repeatable), in
    /// place of the default mix of 1.30-only, 1.33-only and common ones.
    #[arg(long = "gvr", value_name = "GROUP/VERSION/RESOURCE")]
    gvrs: Vec<String>,
    #[command(flatten)]
    report: ReportArgs,
}

fn parse_node(s: &str) -> Result<(String, String), String> {
    let (name, url) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not NAME=URL"))?;
    Ok((name.to_string(), url.trim_end_matches('/').to_string()))
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, mult) = if let Some(n) = s.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else {
        (s, 1.0)
    };
    let n: f64 = num.parse().map_err(|_| format!("bad duration {s:?}"))?;
    if !(n.is_finite() && n >= 0.0) {
        return Err(format!("bad duration {s:?}"));
    }
    Ok(Duration::from_secs_f64(n * mult))
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// One list request.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct RequestRecord {
    /// unix ms at send and at the end of the answer (or the error)
    pub t0: u64,
    pub t1: u64,
    pub node: String,
    pub gvr: String,
    /// HTTP status; 0 when there was none (transport error, timeout, shed)
    pub status: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub err: Option<String>,
    /// `x-sim-apiserver`: which apiserver answered
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// The `message` of a `metav1.Status` answer other than 2xx (who refused, and why), cut
    /// to [`MAX_MESSAGE`] bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// How much of a Status message a record keeps.
const MAX_MESSAGE: usize = 300;

/// The `message` of a `metav1.Status` body, if it is one.
fn status_message(body: &[u8]) -> Option<String> {
    let status: serde_json::Value = serde_json::from_slice(body).ok()?;
    let message = status.get("message")?.as_str()?;
    let mut end = message.len().min(MAX_MESSAGE);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    Some(message[..end].to_string())
}

/// One discovery sample of a node's merged `/apis`.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct SampleRecord {
    pub t0: u64,
    pub t1: u64,
    pub node: String,
    pub status: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub err: Option<String>,
    /// group-versions listed (empty when the sample failed)
    #[serde(default)]
    pub present: Vec<String>,
    /// those marked `freshness: Stale`
    #[serde(default)]
    pub stale: Vec<String>,
}

fn gvr_path(gvr: &str) -> String {
    match gvr.strip_prefix("v1/") {
        Some(resource) => format!("/api/v1/{resource}?limit=50"),
        None => format!("/apis/{gvr}?limit=50"),
    }
}

fn client(args: &RunArgs) -> anyhow::Result<reqwest::Client> {
    let read = |p: &Path| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
    let ca = reqwest::Certificate::from_pem(&read(&args.ca)?)?;
    let mut identity = read(&args.cert)?;
    identity.push(b'\n');
    identity.extend(read(&args.key)?);
    Ok(reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca)
        .identity(reqwest::Identity::from_pem(&identity)?)
        .timeout(args.timeout)
        .connect_timeout(Duration::from_secs(5))
        .build()?)
}

fn describe(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connect"
    } else if e.is_body() || e.is_decode() {
        "body"
    } else {
        "request"
    };
    let mut msg = format!("{kind}: {e}");
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg.push_str(&format!(": {s}"));
        src = s.source();
    }
    msg
}

async fn one_request(
    client: reqwest::Client,
    node: String,
    url: String,
    gvr: String,
) -> RequestRecord {
    let t0 = now_ms();
    let (status, err, by, message) =
        match client.get(format!("{url}{}", gvr_path(&gvr))).send().await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let by = resp
                    .headers()
                    .get("x-sim-apiserver")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                match resp.bytes().await {
                    Ok(body) if !(200..300).contains(&status) => {
                        (status, None, by, status_message(&body))
                    }
                    Ok(_) => (status, None, by, None),
                    Err(e) => (status, Some(describe(&e)), by, None),
                }
            }
            Err(e) => (0, Some(describe(&e)), None, None),
        };
    RequestRecord {
        t0,
        t1: now_ms(),
        node,
        gvr,
        status,
        err,
        by,
        message,
    }
}

async fn one_sample(client: reqwest::Client, node: String, url: String) -> SampleRecord {
    let t0 = now_ms();
    let mut rec = SampleRecord {
        t0,
        t1: t0,
        node,
        status: 0,
        err: None,
        present: Vec::new(),
        stale: Vec::new(),
    };
    let resp = client
        .get(format!("{url}/apis"))
        .header("accept", AGGREGATED_ACCEPT)
        .timeout(Duration::from_secs(10))
        .send()
        .await;
    match resp {
        Err(e) => rec.err = Some(describe(&e)),
        Ok(resp) => {
            rec.status = resp.status().as_u16();
            match resp.bytes().await {
                Err(e) => rec.err = Some(describe(&e)),
                Ok(body) if rec.status == 200 => {
                    match serde_json::from_slice::<serde_json::Value>(&body)
                        .ok()
                        .as_ref()
                        .and_then(truth::present_and_stale)
                    {
                        Some((present, stale)) => {
                            rec.present = present.into_iter().collect();
                            rec.stale = stale.into_iter().collect();
                        }
                        None => rec.err = Some("not an APIGroupDiscoveryList".to_string()),
                    }
                }
                Ok(_) => rec.err = Some(format!("HTTP {}", rec.status)),
            }
        }
    }
    rec.t1 = now_ms();
    rec
}

/// Collects records in memory (the report is made from them) and writes them as JSON lines,
/// best effort: a write error (a full disk) is reported once and writing stops, not the run.
async fn collect<T: Serialize>(path: PathBuf, mut rx: mpsc::UnboundedReceiver<T>) -> Vec<T> {
    let mut out = match tokio::fs::File::create(&path).await {
        Ok(f) => Some(tokio::io::BufWriter::new(f)),
        Err(e) => {
            eprintln!("skewgate-load: cannot create {}: {e}", path.display());
            None
        }
    };
    let mut all = Vec::new();
    while let Some(rec) = rx.recv().await {
        if let Some(w) = out.as_mut() {
            let mut line = serde_json::to_vec(&rec).unwrap_or_default();
            line.push(b'\n');
            if let Err(e) = w.write_all(&line).await {
                eprintln!(
                    "skewgate-load: writing {}: {e}; no more lines are written",
                    path.display()
                );
                out = None;
            }
        }
        all.push(rec);
    }
    if let Some(mut w) = out {
        if let Err(e) = w.flush().await {
            eprintln!("skewgate-load: writing {}: {e}", path.display());
        }
    }
    all
}

/// Whether the driver's truth file says `end`.
fn truth_says_end(path: &Path) -> bool {
    std::fs::read_to_string(path)
        .map(|t| truth::parse(&t).last().is_some_and(|e| e.phase == "end"))
        .unwrap_or(false)
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.rate > 0.0, "--rate must be positive");
    let client = client(&args)?;
    let out = &args.report.out;
    std::fs::create_dir_all(out)?;
    let (req_tx, req_rx) = mpsc::unbounded_channel::<RequestRecord>();
    let (smp_tx, smp_rx) = mpsc::unbounded_channel::<SampleRecord>();
    let req_writer = tokio::spawn(collect(out.join("requests.jsonl"), req_rx));
    let smp_writer = tokio::spawn(collect(out.join("samples.jsonl"), smp_rx));

    let nodes: Vec<(String, String, Arc<Semaphore>)> = args
        .nodes
        .iter()
        .map(|(n, u)| {
            (
                n.clone(),
                u.clone(),
                Arc::new(Semaphore::new(args.max_in_flight)),
            )
        })
        .collect();
    let gvrs: Vec<String> = if args.gvrs.is_empty() {
        GVRS.iter().map(|g| g.to_string()).collect()
    } else {
        args.gvrs.clone()
    };
    eprintln!(
        "skewgate-load: {} req/s over {} nodes x {} GVRs, discovery every 1s, at most {:?}",
        args.rate,
        nodes.len(),
        gvrs.len(),
        args.duration
    );
    let deadline = Instant::now() + args.duration;
    let mut tasks = tokio::task::JoinSet::new();
    let mut load = tokio::time::interval(Duration::from_secs_f64(1.0 / args.rate));
    let mut sampler = tokio::time::interval(Duration::from_secs(1));
    let mut truth_poll = tokio::time::interval(Duration::from_millis(250));
    let mut i: usize = 0;
    loop {
        tokio::select! {
            _ = load.tick() => {
                let (node, url, sem) = &nodes[i % nodes.len()];
                let gvr = &gvrs[(i / nodes.len()) % gvrs.len()];
                i += 1;
                match sem.clone().try_acquire_owned() {
                    Ok(permit) => {
                        let (c, n, u, g, tx) = (client.clone(), node.clone(), url.clone(), gvr.to_string(), req_tx.clone());
                        tasks.spawn(async move {
                            let rec = one_request(c, n, u, g).await;
                            drop(permit);
                            let _ = tx.send(rec);
                        });
                    }
                    Err(_) => {
                        let t = now_ms();
                        let _ = req_tx.send(RequestRecord {
                            t0: t, t1: t, node: node.clone(), gvr: gvr.to_string(), status: 0,
                            err: Some(format!("shed: {} requests in flight", args.max_in_flight)), by: None, message: None,
                        });
                    }
                }
            }
            _ = sampler.tick() => {
                for (node, url, _) in &nodes {
                    let (c, n, u, tx) = (client.clone(), node.clone(), url.clone(), smp_tx.clone());
                    tasks.spawn(async move { let _ = tx.send(one_sample(c, n, u).await); });
                }
            }
            _ = truth_poll.tick() => {
                if Instant::now() >= deadline {
                    eprintln!("skewgate-load: duration reached");
                    break;
                }
                if truth_says_end(&args.report.truth) {
                    eprintln!("skewgate-load: the driver says end");
                    break;
                }
            }
            Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                if let Err(e) = done { eprintln!("skewgate-load: a task failed: {e}"); }
            }
        }
    }
    eprintln!(
        "skewgate-load: {i} ticks; waiting for {} requests in flight",
        tasks.len()
    );
    while let Some(done) = tasks.join_next().await {
        if let Err(e) = done {
            eprintln!("skewgate-load: a task failed: {e}");
        }
    }
    drop((req_tx, smp_tx));
    let requests = req_writer.await?;
    let samples = smp_writer.await?;
    report::report_records(&args.report, requests, samples)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Run(args) => run(args).await,
        Command::Report(args) => report::report(&args),
    }
}
