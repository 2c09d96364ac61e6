//! The live mode's harness for the integration tests: a real etcd, simulated apiservers that
//! keep identity Leases in it, the real `skewgate-control run` binary as a child process
//! ([`Control`]), and real Envoy 1.40 on the bootstrap `skewgate-control bootstrap` prints
//! ([`live_envoy`]). Used by
//! `tests/tests/{control_plane,retention,fallback,hostile_peers,openapi,tls,lease_to_route,bounded_state,local_access,skew_page,metrics}.rs`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use skewgate_control::envoy::Address;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

use crate::{
    client, control_bin, eventually, filter_flags, free_port, free_ports, header, Credential,
    Envoy, Etcd, SimApiserver, SimOptions, TestPki, TEST_TOKENS,
};

/// Lease renewal of the simulated apiservers (kube: 10 s), and the control plane's grace.
pub const RENEW: Duration = Duration::from_millis(500);
pub const GRACE: Duration = Duration::from_secs(3);

pub const CLAIMS: &str = "/apis/resource.k8s.io/v1beta2/namespaces/default/resourceclaims";
pub const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/default/deployments";
pub const AGGREGATED: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// One scenario at a time: each runs etcd, several apiservers, Envoy and the control plane.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The upstream TLS flags `run` and `bootstrap` share: the peer CA and the proxy-client
/// certificate of `pki`.
pub fn upstream_tls_flags(pki: &TestPki) -> [String; 3] {
    [
        format!("--peer-ca-file={}", pki.cluster_ca.cert_file.display()),
        format!(
            "--proxy-client-cert-file={}",
            pki.front_proxy_client.cert_file.display()
        ),
        format!(
            "--proxy-client-key-file={}",
            pki.front_proxy_client.key_file.display()
        ),
    ]
}

pub fn shared(id: &str, fixture: &str, etcd: &Etcd) -> SimOptions {
    SimOptions::shared(id, fixture, etcd, RENEW)
}

// ---------------------------------------------------------------------------------------------
// The control plane as a child process.

/// `skewgate-control run`, restartable at the same ports.
pub struct Control {
    pub args: Vec<OsString>,
    pub health: Address,
    /// `--debug-listen`: `/debug/skew`.
    pub debug: Address,
    /// `--socket-dir`: the xDS socket and Envoy's admin socket (the default local channels).
    pub socket_dir: PathBuf,
    /// `--state-dir`, always given: its default is the host's /var/lib/skewgate. Envoy's
    /// bootstrap ([`live_envoy_with`]) reads the same one unless told otherwise.
    pub state_dir: PathBuf,
    pub log_path: PathBuf,
    pub child: Option<Child>,
    /// Another `skewgate-control` binary than this tree's (benchmark variants).
    pub bin: Option<PathBuf>,
}

impl Control {
    /// The control plane beside `local`'s Envoy: plaintext to the simulators, leases through
    /// `local`, peers accepted on loopback. Not started.
    pub fn new(local: &SimApiserver, dir: &Path, extra: &[&str]) -> Result<Self> {
        let kubeconfig = local.kubeconfig_in(dir)?;
        let mut args = vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            "--insecure-plaintext-upstreams".to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        Self::with_args(local, dir, args)
    }

    /// The same over TLS: the peer CA, the proxy-client certificate, and a kubeconfig with a
    /// bearer token (the apiservers authenticate the control plane like any client).
    pub fn secure(local: &SimApiserver, dir: &Path, pki: &TestPki) -> Result<Self> {
        let kubeconfig = local.kubeconfig_tls_in(
            dir,
            "skewgate-control",
            &pki.cluster_ca.cert_file,
            &Credential::Token(TEST_TOKENS[0].token.to_string()),
        )?;
        let mut args = vec![format!("--kubeconfig={}", kubeconfig.display())];
        args.extend(upstream_tls_flags(pki));
        args.push(format!("--sds-dir={}", dir.join("sds").display()));
        Self::with_args(local, dir, args)
    }

    pub fn with_args(local: &SimApiserver, dir: &Path, extra: Vec<String>) -> Result<Self> {
        let [health, debug] = free_ports()?;
        let socket_dir = extra
            .iter()
            .find_map(|a| a.strip_prefix("--socket-dir="))
            .map_or_else(|| dir.join("sockets"), PathBuf::from);
        let state_dir = extra
            .iter()
            .find_map(|a| a.strip_prefix("--state-dir="))
            .map_or_else(|| dir.join("state"), PathBuf::from);
        let mut args: Vec<OsString> = vec!["run".into()];
        args.push(format!("--local-apiserver-url={}", local.url()).into());
        args.push(format!("--local-lease={}", local.lease_name()).into());
        if !extra.iter().any(|a| a.starts_with("--lease-grace")) {
            args.push(format!("--lease-grace={}ms", GRACE.as_millis()).into());
        }
        if !extra.iter().any(|a| a.starts_with("--socket-dir")) {
            args.push(format!("--socket-dir={}", socket_dir.display()).into());
        }
        if !extra.iter().any(|a| a.starts_with("--state-dir")) {
            args.push(format!("--state-dir={}", state_dir.display()).into());
        }
        args.push(format!("--health-listen=127.0.0.1:{health}").into());
        args.push(format!("--debug-listen=127.0.0.1:{debug}").into());
        args.extend(filter_flags()?.into_iter().map(OsString::from));
        args.push("--initial-sync-timeout=20s".into());
        args.push("--discovery-timeout=3s".into());
        args.push("--log-level=debug".into());
        if !extra.iter().any(|a| a.starts_with("--peer-cidr")) {
            args.push("--peer-cidr=127.0.0.0/8".into());
        }
        args.extend(extra.into_iter().map(OsString::from));
        Ok(Control {
            args,
            health: Address::parse(&format!("127.0.0.1:{health}"))?,
            debug: Address::parse(&format!("127.0.0.1:{debug}"))?,
            socket_dir,
            state_dir,
            log_path: dir.join("skewgate-control.log"),
            child: None,
            bin: None,
        })
    }

    /// Start it and wait until it answers `/healthz` (not until it is ready).
    pub async fn start(&mut self) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)?;
        let bin = match &self.bin {
            Some(bin) => bin.clone(),
            None => control_bin()?,
        };
        let mut child = Command::new(bin)
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .context("starting skewgate-control")?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait()? {
                bail!("skewgate-control exited with {status}:\n{}", self.log());
            }
            if self.get("/healthz").await.is_ok_and(|(s, _)| s == 200) {
                self.child = Some(child);
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("skewgate-control did not serve /healthz within 30s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILL: a control plane that vanishes.
    pub async fn kill(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill().await?;
        }
        Ok(())
    }

    /// SIGTERM; returns its exit status and how long it took.
    pub async fn terminate(&mut self) -> Result<(std::process::ExitStatus, Duration)> {
        let mut child = self.child.take().context("not running")?;
        let pid = child.id().context("no pid")?;
        let started = Instant::now();
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()?;
        if !status.success() {
            bail!("kill -TERM {pid} failed");
        }
        let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
            .await
            .context("skewgate-control ignored SIGTERM for 20s")??;
        Ok((status, started.elapsed()))
    }

    pub fn log(&self) -> String {
        let log = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        // The end is what matters; the whole log can be long at debug level.
        let tail: Vec<&str> = log.lines().rev().take(200).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// GET on the health port (`/healthz`, `/readyz`, `/metrics`).
    pub async fn get(&self, path: &str) -> Result<(u16, String)> {
        get_at(&self.health, path).await
    }

    /// GET on the debug port (`/debug/skew`).
    pub async fn get_debug(&self, path: &str) -> Result<(u16, String)> {
        get_at(&self.debug, path).await
    }

    pub async fn ready(&self) -> bool {
        self.get("/readyz").await.is_ok_and(|(s, _)| s == 200)
    }

    /// One sample of `/metrics`, by its exact `name{labels}`.
    pub async fn metric(&self, sample: &str) -> Result<f64> {
        let (_, text) = self.get("/metrics").await?;
        text.lines()
            .find_map(|l| {
                let (name, value) = l.rsplit_once(' ')?;
                (name == sample).then(|| value.parse().ok())?
            })
            .with_context(|| format!("{sample} not in /metrics"))
    }

    pub async fn skew(&self) -> Result<serde_json::Value> {
        let (_, text) = self.get_debug("/debug/skew").await?;
        Ok(serde_json::from_str(&text)?)
    }
}

pub async fn get_at(address: &Address, path: &str) -> Result<(u16, String)> {
    let url = format!("http://{}:{}{path}", address.host, address.port);
    let resp = client().get(url).send().await?;
    Ok((resp.status().as_u16(), resp.text().await?))
}

/// Who serves `resource` of `group/version`, according to the control plane's skew matrix
/// (empty when every apiserver does, or nobody).
pub async fn served_by(control: &Control, gv: (&str, &str), resource: &str) -> Result<Vec<String>> {
    let skew = control.skew().await?;
    let empty = Vec::new();
    let gvs = skew["matrix"]["group_versions"]
        .as_array()
        .unwrap_or(&empty);
    let Some(gv) = gvs
        .iter()
        .find(|x| x["group"] == gv.0 && x["version"] == gv.1)
    else {
        return Ok(Vec::new());
    };
    let Some(r) = gv["resources"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .find(|r| r["resource"] == resource)
    else {
        return Ok(Vec::new());
    };
    Ok(r["served_by"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect())
}

// ---------------------------------------------------------------------------------------------
// Envoy on the printed bootstrap.

/// `skewgate-control bootstrap` for this control plane, then Envoy on it, its admin interface
/// up (the listener opens after the first sync). With `pki`: TLS with the apiservers' serving
/// certificate, client certificates of the client CA optional. With `peer_port`: the L4 peer
/// port, to `local`.
pub async fn live_envoy(
    control: &Control,
    pki: Option<&TestPki>,
    peer_port: Option<(u16, &SimApiserver)>,
) -> Result<Envoy> {
    // Without the fallback: these scenarios see the ports closed until the first sync.
    live_envoy_with(control, pki, peer_port, &["--control-plane-wait=0".into()]).await
}

/// [`live_envoy`] with more `bootstrap` flags.
pub async fn live_envoy_with(
    control: &Control,
    pki: Option<&TestPki>,
    peer_port: Option<(u16, &SimApiserver)>,
    extra: &[String],
) -> Result<Envoy> {
    let port = free_port()?;
    let bootstrap = render_live_bootstrap(control, pki, peer_port, extra, port).await?;
    let mut envoy = Envoy::spawn(&bootstrap, Address::parse(&format!("127.0.0.1:{port}"))?).await?;
    envoy.tls = pki.is_some();
    Ok(envoy)
}

/// What `skewgate-control bootstrap` prints for [`live_envoy_with`], listening on `port`.
pub async fn render_live_bootstrap(
    control: &Control,
    pki: Option<&TestPki>,
    peer_port: Option<(u16, &SimApiserver)>,
    extra: &[String],
    port: u16,
) -> Result<Vec<u8>> {
    let mut listener_args: Vec<String> = match pki {
        Some(pki) => vec![
            format!("--tls-cert-file={}", pki.serving.cert_file.display()),
            format!("--tls-private-key-file={}", pki.serving.key_file.display()),
            format!("--client-ca-file={}", pki.client_ca.cert_file.display()),
            format!("--sds-dir={}", pki.dir.path().join("envoy-sds").display()),
        ],
        None => vec!["--insecure-plaintext-listener".to_string()],
    };
    if let Some((peer_port, local)) = peer_port {
        listener_args.push(format!("--peer-listen=127.0.0.1:{peer_port}"));
        listener_args.push("--peer-cidr=127.0.0.0/8".to_string());
        listener_args.push(format!("--local-apiserver-url={}", local.url()));
    }
    if !extra.iter().any(|a| a.starts_with("--state-dir")) {
        listener_args.push(format!("--state-dir={}", control.state_dir.display()));
    }
    let out = Command::new(control_bin()?)
        .arg("bootstrap")
        .args(&listener_args)
        .arg(format!("--listen=127.0.0.1:{port}"))
        .arg(format!("--socket-dir={}", control.socket_dir.display()))
        .arg("--node-id=envoy-apiserver-a")
        .args(extra)
        .output()
        .await?;
    if !out.status.success() {
        bail!(
            "skewgate-control bootstrap: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    if !out.stderr.is_empty() {
        eprintln!(
            "skewgate-control bootstrap: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out.stdout)
}

/// `path` through Envoy.
pub fn url(envoy: &Envoy, path: &str) -> String {
    format!("{}{path}", envoy.url())
}

/// (status, x-sim-apiserver) of a GET through Envoy.
pub async fn get(envoy: &Envoy, path: &str) -> Result<(u16, String)> {
    let resp = client().get(url(envoy, path)).send().await?;
    Ok((resp.status().as_u16(), header(&resp, "x-sim-apiserver")))
}

/// The aggregated `/apis` through Envoy (merged discovery): (ETag, body).
pub async fn apis(envoy: &Envoy) -> Result<(String, String)> {
    let resp = client()
        .get(url(envoy, "/apis"))
        .header("accept", AGGREGATED)
        .send()
        .await?;
    Ok((header(&resp, "etag"), resp.text().await?))
}

/// The versions of `group` in an aggregated `/apis` body.
pub fn versions_of(apis: &str, group: &str) -> Vec<String> {
    let v: serde_json::Value = serde_json::from_str(apis).unwrap_or_default();
    let empty = Vec::new();
    v["items"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .filter(|g| g["metadata"]["name"] == group)
        .flat_map(|g| g["versions"].as_array().cloned().unwrap_or_default())
        .filter_map(|v| v["version"].as_str().map(str::to_string))
        .collect()
}

/// GET `url` as JSON.
pub async fn json_at(url: &str) -> Result<serde_json::Value> {
    Ok(client()
        .get(url)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?)
}

/// (status, x-sim-* echo headers) of a GET through a TLS Envoy with `client`.
pub async fn get_echo(
    client: &reqwest::Client,
    envoy: &Envoy,
    path: &str,
    token: Option<&str>,
) -> Result<(u16, std::collections::BTreeMap<String, String>)> {
    let mut req = client.get(url(envoy, path));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await?;
    let echo = resp
        .headers()
        .iter()
        .filter(|(n, _)| n.as_str().starts_with("x-sim-"))
        .map(|(n, v)| {
            (
                n.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    Ok((resp.status().as_u16(), echo))
}

/// Envoy runs the bootstrap's fallback configuration in `mode`: its gauge says so, and so does
/// its log (written every few seconds).
pub async fn expect_fallback(envoy: &Envoy, mode: &str) -> Result<()> {
    assert_eq!(
        envoy
            .stat("wasmcustom.skewgate_fallback_configuration")
            .await?,
        1
    );
    let line = format!("FALLBACK configuration ({mode})");
    eventually("the fallback logged", Duration::from_secs(30), || async {
        Ok(envoy.log().contains(&line).then_some(()))
    })
    .await?;
    Ok(())
}

/// Wait until `path` answers `status` from `server` through Envoy.
pub async fn routed(
    envoy: &Envoy,
    control: &Control,
    path: &str,
    want: (u16, &str),
    timeout: Duration,
) -> Result<Duration> {
    let what = format!("{path} answers {} from {}", want.0, want.1);
    eventually(&what, timeout, || async {
        let got = get(envoy, path).await?;
        Ok((got.0 == want.0 && got.1 == want.1).then_some(()))
    })
    .await
    .map(|(_, d)| d)
    .with_context(|| format!("control plane log:\n{}", control.log()))
}

/// Wait until `/debug/skew` lists the apiserver of Lease `lease` first among the retained: it
/// left (past the lease grace) and its APIs are kept.
pub async fn until_retained(control: &Control, lease: &str) -> Result<()> {
    eventually(
        &format!("{lease}'s API is retained"),
        GRACE + Duration::from_secs(15),
        || async {
            let skew = control.skew().await?;
            Ok((skew["retained"][0]["id"] == lease).then_some(()))
        },
    )
    .await
    .map(|_| ())
    .with_context(|| control.log())
}

/// Start `control`, then Envoy on it; returns once the first sync routes v1beta2 to
/// `apiserver-b`.
pub async fn start_routed_to_b(control: &mut Control) -> Result<Envoy> {
    control.start().await?;
    let envoy = live_envoy(control, None, None).await?;
    routed(
        &envoy,
        control,
        CLAIMS,
        (200, "apiserver-b"),
        Duration::from_secs(30),
    )
    .await?;
    Ok(envoy)
}

pub const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases";

/// A Lease written by anyone allowed to write Leases in kube-system: an identity lease with no
/// apiserver behind it, pointing at `address`.
pub fn forged_lease(
    name: &str,
    address: &str,
    renew_time: &serde_json::Value,
) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "namespace": "kube-system",
            "labels": {
                "apiserver.kubernetes.io/identity": "kube-apiserver",
                "kubernetes.io/hostname": name
            },
            "annotations": { "kubernetes.io/peer-advertise-address": address }
        },
        "spec": {
            "holderIdentity": format!("{name}_0"),
            "leaseDurationSeconds": 3600,
            "renewTime": renew_time
        }
    })
}

/// `skewgate_discovery_fetches_total` by apiserver.
pub async fn fetches(control: &Control) -> Result<Vec<(String, f64)>> {
    let (_, text) = control.get("/metrics").await?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("skewgate_discovery_fetches_total{apiserver=\"")?;
            let (id, value) = rest.split_once("\"} ")?;
            Some((id.to_string(), value.parse().ok()?))
        })
        .collect())
}

/// A peer address that answers discovery with `body` (and a Content-Length of `declared`).
pub async fn hostile_discovery_server(
    body: &'static [u8],
    declared: usize,
) -> Result<(std::net::SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let task = tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                    if head.len() > 65536 {
                        return;
                    }
                }
                let header = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: {AGGREGATED}\r\nContent-Length: {declared}\r\nConnection: close\r\n\r\n"
                );
                if socket.write_all(header.as_bytes()).await.is_err() {
                    return;
                }
                // Up to the declared length, for as long as the client reads.
                let mut sent = 0;
                while sent < declared {
                    let n = body.len().min(declared - sent);
                    if socket.write_all(&body[..n]).await.is_err() {
                        return;
                    }
                    sent += n;
                }
            });
        }
    });
    Ok((address, task))
}
