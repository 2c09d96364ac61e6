//! Envoy with the skewgate filter: configured by `skewgate_control::static_config` (what
//! `skewgate-control render-static` runs: the same plan, bootstrap and Envoy resources as the
//! live mode, read from files), or from any rendered bootstrap; its admin interface, and
//! probes through it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use skewgate_control::discovery::DiscoveryDocuments;
use skewgate_control::envoy::resources::DataPlane;
use skewgate_control::envoy::Address;
use skewgate_control::local_channels::{LocalChannel, ADMIN_SOCKET};
use skewgate_control::plan::{ApiserverView, MergedOutcome};
use skewgate_control::routing::RoutingPlan;
use skewgate_control::static_config::{self, StaticConfig, BOOTSTRAP_FILE};
use tokio::process::{Child, Command};

use crate::http::{client, header, local_get};
use crate::kubeconfig::kubeconfig_yaml;
use crate::paths::{envoy_bin, filter_code, filter_code_of};
use crate::sim::SimApiserver;

/// A running Envoy with the skewgate filter.
pub struct Envoy {
    /// Where the listener is (see [`Envoy::spawn`]).
    pub address: Address,
    /// Its admin interface, as `--admin-address-path` reports it (a Unix socket by default).
    pub admin: LocalChannel,
    /// The plan a static Envoy was configured with (`None` in the live mode).
    pub plan: Option<RoutingPlan>,
    /// The listener serves TLS: [`Envoy::url`] is `https://`.
    pub tls: bool,
    pub log_path: PathBuf,
    pub dir: tempfile::TempDir,
    child: Child,
}

/// A peer as Envoy is told about it: what it serves and where it listens.
pub struct PeerSpec {
    pub id: String,
    pub documents: DiscoveryDocuments,
    pub address: Address,
}

impl PeerSpec {
    pub fn of(sim: &SimApiserver) -> Result<Self> {
        Ok(PeerSpec {
            id: sim.id.clone(),
            documents: sim.documents()?,
            address: sim.address.clone(),
        })
    }
}

/// kube-apiserver's default `--request-timeout`.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// How a test Envoy is set up beyond its apiservers.
#[derive(Debug, Clone)]
pub struct EnvoyOptions {
    pub request_timeout: Duration,
    /// `None`: plaintext listener.
    pub serving: Option<skewgate_control::envoy::ServingTls>,
    /// `None`: plaintext to the apiservers.
    pub upstream: Option<skewgate_control::envoy::UpstreamTls>,
    /// The peer port (L4 passthrough to the local apiserver), if any, and who may connect to
    /// it (default: loopback).
    pub peer_listen: Option<Address>,
    pub peer_cidrs: Vec<ipnet::IpNet>,
    /// The data plane; `None`: the one under test ([`crate::paths::data_plane`]).
    pub data_plane: Option<DataPlane>,
}

impl Default for EnvoyOptions {
    fn default() -> Self {
        EnvoyOptions {
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            serving: None,
            upstream: None,
            peer_listen: None,
            peer_cidrs: vec!["127.0.0.0/8".parse().expect("a CIDR")],
            data_plane: None,
        }
    }
}

impl Envoy {
    /// Envoy in front of `local`, with `peers`, configured by the same code
    /// `skewgate-control render-static` uses.
    pub async fn start(local: &SimApiserver, peers: &[&SimApiserver]) -> Result<Self> {
        let peers = peers
            .iter()
            .map(|p| PeerSpec::of(p))
            .collect::<Result<Vec<_>>>()?;
        Self::start_with(local, peers, EnvoyOptions::default()).await
    }

    pub async fn start_with(
        local: &SimApiserver,
        peers: Vec<PeerSpec>,
        options: EnvoyOptions,
    ) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let local_documents = local.documents()?;
        let peer_views: Vec<ApiserverView<'_>> = peers
            .iter()
            .map(|p| ApiserverView {
                id: &p.id,
                address: &p.address,
                documents: Some(&p.documents),
            })
            .collect();
        let filter_code = match options.data_plane {
            Some(data_plane) => filter_code_of(data_plane)?,
            None => filter_code()?,
        };
        let listen = Address::parse_listen("127.0.0.1:0")?;
        // The default: admin on a Unix socket of mode 0600, here in the private temporary
        // directory.
        let admin = LocalChannel::Unix(dir.path().join(ADMIN_SOCKET));
        let written = static_config::write(&StaticConfig {
            dir: dir.path(),
            local: ApiserverView {
                id: &local.id,
                address: &local.address,
                documents: Some(&local_documents),
            },
            peers: &peer_views,
            shared_storage: &BTreeSet::new(),
            filter_code: &filter_code,
            listen: &listen,
            admin: &admin,
            request_timeout: options.request_timeout,
            serving: options.serving.as_ref(),
            upstream_tls: options.upstream.as_ref(),
            peer_listen: options.peer_listen.as_ref(),
            peer_cidrs: &options.peer_cidrs,
        })?;
        if let MergedOutcome::Skipped { reason } = &written.plan.merged {
            bail!("merged discovery was left out: {reason}");
        }
        let mut envoy = Self::spawn_in(dir, listen).await?;
        envoy.wait_ready().await?;
        envoy.plan = Some(written.plan.routing);
        envoy.tls = options.serving.is_some();
        Ok(envoy)
    }

    /// Start Envoy on a rendered bootstrap and wait for its listener; fails if Envoy exits
    /// before the listener is up.
    pub async fn start_with_bootstrap(bootstrap: &[u8]) -> Result<Self> {
        let mut envoy = Self::spawn(bootstrap, Address::parse_listen("127.0.0.1:0")?).await?;
        envoy.wait_ready().await?;
        Ok(envoy)
    }

    /// Start Envoy on a rendered bootstrap that listens on `listen`, and wait for its admin
    /// interface only: the listener may open much later (in the live mode, after the first
    /// xDS sync). With port 0 in `listen`, [`Envoy::wait_ready`] finds the kernel's choice.
    pub async fn spawn(bootstrap: &[u8], listen: Address) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join(BOOTSTRAP_FILE), bootstrap)?;
        Self::spawn_in(dir, listen).await
    }

    /// Start Envoy on the bootstrap in `dir` (`envoy.yaml`, and whatever it reads beside it),
    /// and wait for its admin interface only.
    pub async fn spawn_in(dir: tempfile::TempDir, listen: Address) -> Result<Self> {
        let config_path = dir.path().join(BOOTSTRAP_FILE);
        let admin_path = dir.path().join("admin-address");
        let log_path = dir.path().join("envoy.log");
        let mut child = Command::new(envoy_bin()?)
            .arg("-c")
            .arg(&config_path)
            .arg("--admin-address-path")
            .arg(&admin_path)
            .arg("--log-path")
            .arg(&log_path)
            .args(["--disable-hot-restart", "--concurrency", "2", "-l", "info"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting envoy")?;
        let admin_path = &admin_path;
        let admin = wait_for_envoy(
            &mut child,
            &log_path,
            "its admin interface was up",
            || async move {
                let admin = std::fs::read_to_string(admin_path).ok()?;
                let admin = admin_channel(admin.trim())?;
                local_get(&admin, "/server_info").await.ok()?;
                Some(admin)
            },
        )
        .await?;
        Ok(Envoy {
            address: listen,
            admin,
            plan: None,
            tls: false,
            log_path,
            dir,
            child,
        })
    }

    /// Wait until the listener is up; `address` becomes where it is bound.
    pub async fn wait_ready(&mut self) -> Result<()> {
        let admin = self.admin.clone();
        self.address = wait_for_envoy(&mut self.child, &self.log_path, "it was ready", || {
            Self::listener_address(&admin)
        })
        .await?;
        Ok(())
    }

    /// The listener's address once Envoy is LIVE (`/ready`: its initialization, the first
    /// health check of the local apiserver's clusters included, is done and workers accept).
    /// A bound listener alone may still refuse connections.
    async fn listener_address(admin: &LocalChannel) -> Option<Address> {
        let (status, _) = local_get(admin, "/ready").await.ok()?;
        if status != 200 {
            return None;
        }
        let (_, body) = local_get(admin, "/listeners?format=json").await.ok()?;
        let body: serde_json::Value = serde_json::from_str(&body).ok()?;
        let socket = body
            .get("listener_statuses")?
            .get(0)?
            .get("local_address")?
            .get("socket_address")?;
        let host = socket.get("address")?.as_str()?;
        let port = socket.get("port_value")?.as_u64()?;
        Address::parse(&format!("{host}:{port}")).ok()
    }

    /// A GET on the admin interface: the body.
    pub async fn admin(&self, path: &str) -> Result<String> {
        Ok(local_get(&self.admin, path).await?.1)
    }

    /// One counter or gauge from the admin `/stats`.
    pub async fn stat(&self, name: &str) -> Result<u64> {
        let stats = self.admin(&format!("/stats?filter=^{name}$")).await?;
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .and_then(|v| v.trim().parse().ok())
            .with_context(|| format!("stat {name} not found in {stats:?}"))
    }

    /// One of the filter's metrics with its labels, by the name Envoy's admin `/stats` gives
    /// it under the data plane under test ([`filter_stat`]).
    pub async fn filter_stat(&self, metric: &str, labels: &[(&str, &str)]) -> Result<u64> {
        self.stat(&filter_stat(metric, labels)?).await
    }

    /// `http://ip:port`, or `https://ip:port` when the listener serves TLS.
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}:{}", self.address.host, self.address.port)
    }

    /// Envoy's log so far (for assertion messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// A kubeconfig for real kubectl pointing at this Envoy.
    pub fn kubeconfig(&self) -> Result<PathBuf> {
        let path = self.dir.path().join("kubeconfig");
        std::fs::write(&path, kubeconfig_yaml(&self.url()))?;
        Ok(path)
    }
}

/// What `--admin-address-path` holds: the socket's path, or `ip:port`.
fn admin_channel(written: &str) -> Option<LocalChannel> {
    if written.starts_with('/') {
        Some(LocalChannel::Unix(written.into()))
    } else {
        written.parse().ok().map(LocalChannel::Tcp)
    }
}

/// Poll `probe` until it gives `Some`, for up to 60 s; fails if Envoy exits first.
async fn wait_for_envoy<T, F, Fut>(
    child: &mut Child,
    log_path: &Path,
    what: &str,
    mut probe: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait()? {
            let log = std::fs::read_to_string(log_path).unwrap_or_default();
            bail!("envoy exited with {status} before {what}:\n{log}");
        }
        if Instant::now() > deadline {
            bail!("envoy: 60 s passed before {what}");
        }
        if let Some(found) = probe().await {
            return Ok(found);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A 1.30 apiserver `a` behind Envoy, with the 1.33 peer `b`.
pub async fn mixed_cluster() -> Result<(SimApiserver, SimApiserver, Envoy)> {
    let a = SimApiserver::start("apiserver-a", "k8s-1.30").await?;
    let b = SimApiserver::start("apiserver-b", "k8s-1.33").await?;
    let envoy = Envoy::start(&a, &[&b]).await?;
    Ok((a, b, envoy))
}

/// Requests through Envoy in a loop until [`Probe::finish`] (at most 120 s): how many answered
/// as expected (path, status, `x-sim-apiserver`), and the others.
pub struct Probe {
    stop: Arc<AtomicBool>,
    pub ok: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<Vec<String>>,
}

impl Probe {
    pub fn start(envoy: &Envoy, expect: Vec<(&'static str, u16, &'static str)>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let (s, o) = (stop.clone(), ok.clone());
        let base = envoy.url();
        let task = tokio::spawn(async move {
            let client = client();
            let mut failures = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(120);
            while !s.load(Ordering::Relaxed) && Instant::now() < deadline {
                for (path, status, server) in &expect {
                    match client.get(format!("{base}{path}")).send().await {
                        Ok(r)
                            if r.status().as_u16() == *status
                                && header(&r, "x-sim-apiserver") == *server =>
                        {
                            o.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(r) => failures.push(format!(
                            "{path}: {} from {:?}",
                            r.status(),
                            header(&r, "x-sim-apiserver")
                        )),
                        Err(e) => failures.push(format!("{path}: {e}")),
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            failures
        });
        Probe { stop, ok, task }
    }

    pub async fn finish(self) -> Result<(u64, Vec<String>)> {
        self.stop.store(true, Ordering::Relaxed);
        let failures = self.task.await?;
        Ok((self.ok.load(Ordering::Relaxed), failures))
    }
}

/// The admin `/stats` name of one of the filter's metrics with `labels` under the data plane
/// under test: the proxy-wasm filter writes the labels into the name
/// (`wasmcustom.metric;label=value`, which the bootstrap's tag regexes make labels again), the
/// native filter defines them as Envoy labels (`wasmcustom.metric.label.value`). Prometheus
/// shows both the same way.
pub fn filter_stat(metric: &str, labels: &[(&str, &str)]) -> Result<String> {
    let (between, pair) = match crate::paths::data_plane()? {
        DataPlane::Wasm => (";", "="),
        DataPlane::Native => (".", "."),
    };
    let mut name = format!("wasmcustom.{metric}");
    for (label, value) in labels {
        name.push_str(between);
        name.push_str(label);
        name.push_str(pair);
        name.push_str(value);
    }
    Ok(name)
}
