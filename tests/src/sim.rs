//! Simulated kube-apiservers (`sim-apiserver` processes): plain or with everything
//! [`SimOptions`] can say (shared etcd, identity Leases, TLS and authentication), stopped,
//! restarted and upgraded.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use skewgate_control::discovery::DiscoveryDocuments;
use skewgate_control::envoy::Address;
use skewgate_control::peers::identity_lease_name;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::etcd::Etcd;
use crate::kubeconfig::{kubeconfig_tls, kubeconfig_yaml, Credential};
use crate::paths::{fixture, sim_bin};
use crate::pki::{TestPki, FRONT_PROXY_CLIENT_CN};

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

impl SimOptions {
    /// These options with TLS and every authenticator from `pki`: the cluster-CA serving
    /// certificate, `--client-ca-file` = the client CA, `--requestheader-client-ca-file` = the
    /// front-proxy CA with `--requestheader-allowed-names=front-proxy-client`, and the token file
    /// of [`TEST_TOKENS`](crate::TEST_TOKENS).
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
