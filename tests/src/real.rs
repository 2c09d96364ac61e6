//! Real kube-apiservers on loopback, for the tests that hold the simulator to the real thing
//! (`tests/tests/conformance.rs`) and for capturing real documents into `tests/fixtures/`
//! (`real-fixtures`). The binaries are those `tests/kube/build` built from the Go module proxy
//! into `.tools/kube/` (installed by `scripts/setup`); etcd is the 3.6 built beside them.
//!
//! A [`RealApiserver`] runs with the flags kubeadm gives kube-apiserver, pointed at the
//! [`TestPki`] the simulator uses, so both authenticate the same clients:
//! `--client-ca-file` (the client CA), requestheader authentication of the front proxy's
//! certificate, static tokens ([`crate::TEST_TOKENS`]), RBAC.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use skewgate_control::envoy::Address;
use tokio::process::{Child, Command};

use crate::etcd::Etcd;
use crate::net::free_port;
use crate::paths::repo_root;
use crate::pki::{CertFiles, TestPki};

/// The releases `tests/kube/build` builds (`tests/kube/kubernetes-<release>/`).
pub const REAL_RELEASES: [&str; 2] = ["1.36", "1.37"];

/// `.tools/kube/kubernetes-<release>/<binary>`, or an error naming the install step.
pub fn real_kube_bin(release: &str, binary: &str) -> Result<PathBuf> {
    built(&format!("kubernetes-{release}/{binary}"))
}

/// The etcd 3.6 `tests/kube/build` builds.
pub fn real_etcd_bin() -> Result<PathBuf> {
    built("etcd-3.6/etcd")
}

/// `.tools/kube/<path>`, which `tests/kube/build` (run by `scripts/setup`) makes.
fn built(path: &str) -> Result<PathBuf> {
    let path = repo_root().join(".tools/kube").join(path);
    if path.is_file() {
        Ok(path)
    } else {
        bail!(
            "{} not found: run scripts/setup (tests/kube/build builds it)",
            path.display()
        )
    }
}

impl Etcd {
    /// The real etcd 3.6 of the real apiservers.
    pub async fn start_real() -> Result<Etcd> {
        Etcd::start_bin(&real_etcd_bin()?).await
    }
}

/// A real kube-apiserver process on a loopback port.
pub struct RealApiserver {
    pub release: String,
    pub address: Address,
    /// Its log (stderr) and the files it was given.
    pub dir: tempfile::TempDir,
    child: Option<Child>,
}

/// How to start a [`RealApiserver`].
#[derive(Clone, Debug)]
pub struct RealOptions {
    /// `1.36` or `1.37` ([`REAL_RELEASES`]).
    pub release: String,
    pub etcd_url: String,
    /// `--etcd-prefix`: apiservers with the same prefix share their objects.
    pub etcd_prefix: String,
    /// More flags, verbatim.
    pub extra_args: Vec<String>,
}

impl RealOptions {
    pub fn new(release: &str, etcd: &Etcd) -> Self {
        RealOptions {
            release: release.to_string(),
            etcd_url: etcd.url.clone(),
            etcd_prefix: format!("/registry-{release}"),
            extra_args: Vec::new(),
        }
    }
}

impl RealApiserver {
    /// Start it and wait until `/readyz` answers 200 (at most 90 s).
    pub async fn start(opts: &RealOptions, pki: &TestPki) -> Result<Self> {
        let mut apiserver = Self::spawn(opts, pki)?;
        apiserver.wait_ready(pki, Duration::from_secs(90)).await?;
        Ok(apiserver)
    }

    /// Start it without waiting: its port is known before it listens.
    pub fn spawn(opts: &RealOptions, pki: &TestPki) -> Result<Self> {
        let bin = real_kube_bin(&opts.release, "kube-apiserver")?;
        let dir = tempfile::tempdir()?;
        let (sa_key, sa_pub) = service_account_keys(dir.path())?;
        let port = free_port()?;
        let p = |path: &Path| path.display().to_string();
        // kubeadm's flags (tests/compose/real/kube-apiserver.args), on loopback.
        let mut args = vec![
            "--advertise-address=127.0.0.1".to_string(),
            // 1.37 refuses a loopback advertise address for the `kubernetes` Service's
            // endpoints; nothing here uses them.
            "--endpoint-reconciler-type=none".to_string(),
            "--bind-address=127.0.0.1".to_string(),
            format!("--secure-port={port}"),
            "--allow-privileged=true".to_string(),
            "--authorization-mode=Node,RBAC".to_string(),
            format!("--client-ca-file={}", p(&pki.client_ca.cert_file)),
            "--enable-admission-plugins=NodeRestriction".to_string(),
            format!("--etcd-servers={}", opts.etcd_url),
            format!("--etcd-prefix={}", opts.etcd_prefix),
            format!(
                "--requestheader-client-ca-file={}",
                p(&pki.front_proxy_ca.cert_file)
            ),
            "--requestheader-allowed-names=front-proxy-client".to_string(),
            "--requestheader-username-headers=X-Remote-User".to_string(),
            "--requestheader-group-headers=X-Remote-Group".to_string(),
            "--requestheader-extra-headers-prefix=X-Remote-Extra-".to_string(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_string(),
            format!("--service-account-key-file={}", p(&sa_pub)),
            format!("--service-account-signing-key-file={}", p(&sa_key)),
            "--service-cluster-ip-range=10.96.0.0/12".to_string(),
            format!("--tls-cert-file={}", p(&pki.serving.cert_file)),
            format!("--tls-private-key-file={}", p(&pki.serving.key_file)),
            format!("--token-auth-file={}", p(&pki.token_file)),
        ];
        args.extend(opts.extra_args.iter().cloned());
        let log = std::fs::File::create(dir.path().join("kube-apiserver.log"))?;
        let child = Command::new(&bin)
            .args(&args)
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(RealApiserver {
            release: opts.release.clone(),
            address: Address::parse(&format!("127.0.0.1:{port}"))?,
            dir,
            child: Some(child),
        })
    }

    pub fn url(&self) -> String {
        format!("https://{}:{}", self.address.host, self.address.port)
    }

    /// Its log so far (for assertion messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("kube-apiserver.log")).unwrap_or_default()
    }

    async fn wait_ready(&mut self, pki: &TestPki, within: Duration) -> Result<()> {
        let client = real_client(pki, None)?;
        let deadline = Instant::now() + within;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    bail!(
                        "kube-apiserver exited with {status}:\n{}",
                        tail(&self.log())
                    );
                }
            }
            let ready = client
                .get(format!("{}/readyz", self.url()))
                .send()
                .await
                .is_ok_and(|r| r.status() == 200);
            if ready {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "kube-apiserver was not ready within {within:?}:\n{}",
                    tail(&self.log())
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The process id (for signals).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// SIGTERM, without waiting.
    pub fn terminate(&self) -> Result<()> {
        let pid = self.pid().context("kube-apiserver is not running")?;
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()?;
        if !status.success() {
            bail!("kill -TERM {pid} failed");
        }
        Ok(())
    }

    /// Wait for its exit (at most `within`).
    pub async fn wait_exit(&mut self, within: Duration) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            tokio::time::timeout(within, child.wait())
                .await
                .context("kube-apiserver did not exit")??;
        }
        Ok(())
    }
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// The service-account token signing key pair (P-256: kube signs ES256 with it).
fn service_account_keys(dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let key = rcgen::KeyPair::generate()?;
    let (private, public) = (dir.join("sa.key"), dir.join("sa.pub"));
    std::fs::write(&private, key.serialize_pem())?;
    std::fs::write(&public, key.public_key_pem())?;
    Ok((private, public))
}

/// An HTTP client that trusts `pki`'s serving certificate and presents `cert` when given.
pub fn real_client(pki: &TestPki, cert: Option<&CertFiles>) -> Result<reqwest::Client> {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&pki.cluster_ca.cert_file)?)?;
    let mut builder = reqwest::Client::builder()
        .add_root_certificate(ca)
        .timeout(Duration::from_secs(30));
    if let Some(cert) = cert {
        let mut pem = std::fs::read(&cert.cert_file)?;
        pem.extend(std::fs::read(&cert.key_file)?);
        builder = builder.identity(reqwest::Identity::from_pem(&pem)?);
    }
    Ok(builder.build()?)
}
