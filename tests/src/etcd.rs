//! Shared cluster state: a real etcd that simulated apiservers share, like kube-apiservers do.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tokio::process::{Child, Command};

use crate::net::free_ports;
use crate::paths::etcd_bin;

/// A real single-member etcd on loopback ports, with its data in a temporary folder; killed
/// (and the folder removed) on drop.
pub struct Etcd {
    pub url: String,
    pub dir: tempfile::TempDir,
    _child: Child,
}

impl Etcd {
    /// Debian's etcd (or `$SKEWGATE_ETCD`), for the simulated apiservers.
    pub async fn start() -> Result<Etcd> {
        Etcd::start_bin(&etcd_bin()?).await
    }

    /// The etcd binary `bin`.
    pub async fn start_bin(bin: &Path) -> Result<Etcd> {
        let mut last_error = None;
        // Ports are picked before etcd binds them: retry if another process took one.
        for _ in 0..4 {
            let dir = tempfile::tempdir()?;
            let [client_port, peer_port] = free_ports()?;
            let url = format!("http://127.0.0.1:{client_port}");
            let peer = format!("http://127.0.0.1:{peer_port}");
            let log = std::fs::File::create(dir.path().join("etcd.log"))?;
            let mut child = Command::new(bin)
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
