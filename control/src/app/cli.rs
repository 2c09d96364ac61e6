//! The `run` and `bootstrap` subcommands: flags (kube-apiserver's names where the meaning is
//! the same), logging, signals, and wiring the parts together.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::bootstrap::{Address, ServingTls};
use crate::fetch::{ClientTemplate, DiscoveryMetrics};
use crate::health::{self, Health};
use crate::peers::{self, PeerMetrics, PeerWatcher};
use crate::shared_storage::{SharedStorageMetrics, SharedStorageWatcher};
use crate::xds::bootstrap::{DynamicBootstrap, PeerPassthrough};
use crate::xds::{self, XdsMetrics};

use super::config::{parse_duration, parse_local_url, parse_xds_listen, RunConfig, RunFlags};
use super::orchestrator::{Orchestrator, Shared};
use super::state::Scheme;
use super::status::{AppMetrics, Status};

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// `time level target: message key=value ...`
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

/// `skewgate-control run`: the live control plane beside one Envoy.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Kubeconfig for the identity Lease, CRD and APIService watches, and the credentials
    /// discovery is fetched with from every apiserver (in-cluster or $KUBECONFIG if omitted).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// How this control plane reaches the apiserver its Envoy fronts, for discovery and for
    /// Envoy's skewgate-local clusters (e.g. https://127.0.0.1:6443).
    #[arg(long, value_name = "URL")]
    pub local_apiserver_url: String,
    /// The local apiserver's identity Lease (apiserver-<hash>).
    #[arg(long, value_name = "NAME", conflicts_with = "node_name")]
    pub local_lease: Option<String>,
    /// Or: the local apiserver's host name (its Lease's kubernetes.io/hostname label).
    #[arg(long, value_name = "HOSTNAME")]
    pub node_name: Option<String>,
    /// A CIDR peer-advertise-address annotations must be inside (repeatable, or
    /// comma-separated). Without any, every annotation is refused.
    #[arg(long = "peer-cidr", value_name = "CIDR")]
    pub peer_cidrs: Vec<String>,
    /// A peer address the operator vouches for: lease/<lease-name>=ip:port or
    /// host/<hostname>=ip:port (repeatable). Wins over the lease's annotation.
    #[arg(long = "peer-address", value_name = "KIND/NAME=IP:PORT")]
    pub peer_addresses: Vec<String>,
    /// A peer whose Lease was not renewed for this long is dead (kube renews every 10s).
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub lease_grace: Duration,
    /// The CA that signed the apiservers' serving certificates; they are verified with the name
    /// kubernetes.default.svc (by this control plane and by Envoy).
    #[arg(long, value_name = "PATH")]
    pub peer_ca_file: Option<PathBuf>,
    /// The certificate the apiservers accept for requestheader authentication, presented by
    /// Envoy's -identity clusters.
    #[arg(long, value_name = "PATH")]
    pub proxy_client_cert_file: Option<PathBuf>,
    #[arg(long, value_name = "PATH")]
    pub proxy_client_key_file: Option<PathBuf>,
    /// Speak plaintext HTTP to every apiserver. Tests and demos on loopback only.
    #[arg(long)]
    pub insecure_plaintext_upstreams: bool,
    /// Where to serve delta ADS to Envoy (loopback only; `skewgate-control bootstrap
    /// --xds-address` must match).
    #[arg(long, default_value = "127.0.0.1:18000", value_name = "IP:PORT")]
    pub xds_listen: String,
    /// Where to serve /healthz, /readyz, /metrics and /debug/skew.
    #[arg(long, default_value = "127.0.0.1:18001", value_name = "IP:PORT")]
    pub health_listen: String,
    /// skewgate_filter.wasm as Envoy sees it (absolute path).
    #[arg(long, value_name = "PATH")]
    pub wasm: PathBuf,
    /// The first snapshot waits for the identity leases and every live peer's discovery for at
    /// most this long (the local apiserver's discovery is always needed).
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub initial_sync_timeout: Duration,
    /// How often each apiserver's discovery is revalidated (conditional requests).
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub discovery_refresh_interval: Duration,
    /// Per discovery request.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub discovery_timeout: Duration,
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    #[arg(long, value_enum, default_value_t = LogLevel::Info)]
    pub log_level: LogLevel,
}

impl RunArgs {
    fn flags(&self) -> RunFlags {
        RunFlags {
            kubeconfig: self.kubeconfig.clone(),
            local_apiserver_url: self.local_apiserver_url.clone(),
            local_lease: self.local_lease.clone(),
            node_name: self.node_name.clone(),
            peer_cidrs: self.peer_cidrs.clone(),
            peer_addresses: self.peer_addresses.clone(),
            lease_grace: self.lease_grace,
            peer_ca_file: self.peer_ca_file.clone(),
            proxy_client_cert_file: self.proxy_client_cert_file.clone(),
            proxy_client_key_file: self.proxy_client_key_file.clone(),
            insecure_plaintext_upstreams: self.insecure_plaintext_upstreams,
            xds_listen: self.xds_listen.clone(),
            health_listen: self.health_listen.clone(),
            wasm: self.wasm.clone(),
            initial_sync_timeout: self.initial_sync_timeout,
            discovery_refresh_interval: self.discovery_refresh_interval,
            discovery_timeout: self.discovery_timeout,
        }
    }
}

fn init_logging(format: LogFormat, level: LogLevel) {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let level = match level {
        LogLevel::Error => LevelFilter::ERROR,
        LogLevel::Warn => LevelFilter::WARN,
        LogLevel::Info => LevelFilter::INFO,
        LogLevel::Debug => LevelFilter::DEBUG,
        LogLevel::Trace => LevelFilter::TRACE,
    };
    // The HTTP and TLS stacks are chatty below WARN; our own targets follow --log-level.
    let quiet = level.min(LevelFilter::WARN);
    let targets = Targets::new()
        .with_default(level)
        .with_target("h2", quiet)
        .with_target("hyper", quiet)
        .with_target("hyper_util", quiet)
        .with_target("tower", quiet)
        .with_target("rustls", quiet)
        .with_target("tonic", quiet);
    let registry = tracing_subscriber::registry().with(targets);
    let result = match format {
        LogFormat::Text => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_target(true),
            )
            .try_init(),
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(false)
                    .with_span_list(false)
                    .with_writer(std::io::stderr),
            )
            .try_init(),
    };
    if let Err(e) = result {
        eprintln!("skewgate-control: logging already set up: {e}");
    }
}

/// `skewgate-control run`. Returns when SIGTERM or SIGINT stopped it cleanly.
pub fn run(args: RunArgs) -> Result<()> {
    init_logging(args.log_format, args.log_level);
    let config = args.flags().validate().map_err(anyhow::Error::msg)?;
    if config.upstream_tls.is_none() {
        warn!(
            "INSECURE: --insecure-plaintext-upstreams: discovery is fetched and Envoy forwards \
             requests to every apiserver in PLAINTEXT, without verifying them and without the \
             proxy-client certificate. Use this for tests on loopback only."
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(run_async(config))
}

fn readable(path: &std::path::Path, what: &str) -> Result<()> {
    std::fs::File::open(path)
        .map(|_| ())
        .with_context(|| format!("{what} {}", path.display()))
}

async fn wait_true(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

async fn run_async(config: RunConfig) -> Result<()> {
    let config = Arc::new(config);
    readable(&config.wasm, "--wasm")?;
    if let Some(tls) = &config.upstream_tls {
        // Envoy reads these; a typo should fail here, not as a NACK later.
        readable(&tls.proxy_client_cert_file, "--proxy-client-cert-file")?;
        readable(&tls.proxy_client_key_file, "--proxy-client-key-file")?;
    }
    let xds_listener = tokio::net::TcpListener::bind(config.xds_listen)
        .await
        .with_context(|| format!("--xds-listen {}", config.xds_listen))?;
    let health_listener = tokio::net::TcpListener::bind(config.health_listen)
        .await
        .with_context(|| format!("--health-listen {}", config.health_listen))?;

    let client = peers::client_from_kubeconfig(config.kubeconfig.as_deref())
        .await
        .context("--kubeconfig")?;
    let mut template = ClientTemplate::from_kubeconfig(config.kubeconfig.as_deref())
        .await
        .context("--kubeconfig")?;
    if let Some(tls) = &config.upstream_tls {
        template = template
            .with_peer_ca_file(&tls.peer_ca_file)
            .context("--peer-ca-file")?;
    }

    let peer_metrics = Arc::new(PeerMetrics::default());
    let peer_watcher =
        PeerWatcher::spawn(client.clone(), config.peers.clone(), peer_metrics.clone());
    let shared_metrics = Arc::new(SharedStorageMetrics::default());
    let shared_watcher = SharedStorageWatcher::spawn(client, shared_metrics.clone());
    let discovery_metrics = Arc::new(DiscoveryMetrics::new());
    let xds_metrics = Arc::new(XdsMetrics::new());
    let app_metrics = Arc::new(AppMetrics::default());
    let status = Arc::new(Status::default());
    let (publisher, snapshots) = watch::channel(None);
    let (shutdown_tx, shutdown_rx) = watch::channel(false);

    let health = {
        let (s1, s2) = (status.clone(), status.clone());
        let (pm, dm, xm, sm, am) = (
            peer_metrics.clone(),
            discovery_metrics.clone(),
            xds_metrics.clone(),
            shared_metrics.clone(),
            app_metrics.clone(),
        );
        Arc::new(Health {
            ready: Box::new(move || s1.ready()),
            metrics: Box::new(move || {
                let mut out = am.render();
                out.push_str(&pm.render());
                out.push_str(&dm.render_prometheus());
                out.push_str(&xm.render());
                out.push_str(&sm.render());
                out
            }),
            skew: Box::new(move |all| s2.skew_json(all)),
        })
    };
    let mut health_task = tokio::spawn(health::serve(
        health_listener,
        health,
        wait_true(shutdown_rx.clone()),
    ));
    let mut xds_task = tokio::spawn(xds::serve(
        xds_listener,
        snapshots,
        xds_metrics.clone(),
        wait_true(shutdown_rx.clone()),
    ));
    let orchestrator = Orchestrator::new(
        config.clone(),
        template,
        Shared {
            discovery_metrics,
            app_metrics,
            status,
        },
        publisher,
    )?;
    let orchestrator_task = tokio::spawn(orchestrator.run(
        peer_watcher.updates.clone(),
        shared_watcher.updates.clone(),
        shutdown_rx.clone(),
    ));

    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let failure = tokio::select! {
        _ = term.recv() => { info!(signal = "SIGTERM", "shutting down"); None }
        _ = int.recv() => { info!(signal = "SIGINT", "shutting down"); None }
        r = &mut xds_task => Some(format!("the xDS server stopped: {r:?}")),
        r = &mut health_task => Some(format!("the health server stopped: {r:?}")),
    };
    // Stop accepting, end the xDS streams (Envoy keeps serving with what it holds and
    // reconnects to whoever listens next), stop the watches.
    let _ = shutdown_tx.send(true);
    let drain = async {
        let _ = orchestrator_task.await;
        if failure.is_none() {
            match xds_task.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => error!(error = %e, "xDS server"),
                Err(e) => error!(error = %e, "xDS server task"),
            }
            let _ = health_task.await;
        }
    };
    if tokio::time::timeout(Duration::from_secs(10), drain)
        .await
        .is_err()
    {
        warn!("shutdown took longer than 10s; exiting anyway");
    }
    drop(peer_watcher);
    drop(shared_watcher);
    match failure {
        None => {
            info!("stopped");
            Ok(())
        }
        Some(why) => bail!(why),
    }
}

/// `skewgate-control bootstrap`: print the Envoy bootstrap of the live mode.
#[derive(clap::Args, Debug)]
pub struct BootstrapArgs {
    /// Address Envoy listens on for clients (the apiserver's advertised address and port).
    #[arg(long, default_value = "127.0.0.1:6443", value_name = "IP:PORT")]
    pub listen: String,
    /// Loopback port of Envoy's admin interface.
    #[arg(long, default_value_t = 9901)]
    pub admin_port: u16,
    /// Where `skewgate-control run` serves xDS (its --xds-listen; loopback).
    #[arg(long, default_value = "127.0.0.1:18000", value_name = "IP:PORT")]
    pub xds_address: String,
    /// This Envoy's node id, for the control plane's logs.
    #[arg(long, default_value = "skewgate")]
    pub node_id: String,
    /// The apiservers' --request-timeout (kube's default 1m0s): Envoy bounds non-long-running
    /// requests by 10s more, so a peer that never answers becomes a 503.
    #[arg(long, default_value = "60s", value_parser = parse_duration, value_name = "DURATION")]
    pub request_timeout: Duration,
    /// The apiserver's serving certificate, which Envoy presents to clients in its place.
    #[arg(long, value_name = "PATH", requires = "tls_private_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    #[arg(long, value_name = "PATH", requires = "tls_cert_file")]
    pub tls_private_key_file: Option<PathBuf>,
    /// The cluster's client CA: client certificates are optional and verified against it; a
    /// verified one becomes X-Remote-User/X-Remote-Group towards the apiservers.
    #[arg(long, value_name = "PATH", requires = "tls_cert_file")]
    pub client_ca_file: Option<PathBuf>,
    /// Serve clients in plaintext. Tests and demos on loopback only.
    #[arg(long, conflicts_with = "tls_cert_file")]
    pub insecure_plaintext_listener: bool,
    /// Also open the peer port here (the peer-advertise address): TLS passed through at L4 to
    /// the apiserver itself, for the other apiservers' Envoys.
    #[arg(long, value_name = "IP:PORT", requires = "local_apiserver_url")]
    pub peer_listen: Option<String>,
    /// Where the apiserver this Envoy fronts listens (as for `run`), for the peer port.
    #[arg(long, value_name = "URL", requires = "peer_listen")]
    pub local_apiserver_url: Option<String>,
}

/// Render the bootstrap for these flags.
pub fn render_bootstrap(args: &BootstrapArgs) -> Result<String> {
    let listen = Address::parse_listen(&args.listen)?;
    let xds = parse_xds_listen(&args.xds_address)
        .map_err(|e| anyhow::anyhow!(e.replace("--xds-listen", "--xds-address")))?;
    let xds = Address::parse(&xds.to_string())?;
    let serving = match (&args.tls_cert_file, &args.tls_private_key_file) {
        (Some(cert), Some(key)) => {
            for (flag, p) in [
                ("--tls-cert-file", Some(cert)),
                ("--tls-private-key-file", Some(key)),
                ("--client-ca-file", args.client_ca_file.as_ref()),
            ] {
                if let Some(p) = p {
                    if !p.is_absolute() {
                        bail!("{flag} {}: give an absolute path", p.display());
                    }
                }
            }
            Some(ServingTls {
                cert_file: cert.clone(),
                key_file: key.clone(),
                client_ca_file: args.client_ca_file.clone(),
            })
        }
        _ if args.insecure_plaintext_listener => None,
        _ => bail!(
            "give --tls-cert-file and --tls-private-key-file (or, on loopback only, --insecure-plaintext-listener)"
        ),
    };
    let peer = match (&args.peer_listen, &args.local_apiserver_url) {
        (Some(peer_listen), Some(url)) => {
            let scheme = if url.starts_with("http://") {
                Scheme::Http
            } else {
                Scheme::Https
            };
            let apiserver = parse_local_url(url, scheme).map_err(anyhow::Error::msg)?;
            let peer_listen =
                Address::parse(peer_listen).map_err(|e| anyhow::anyhow!("--peer-listen: {e}"))?;
            if peer_listen == listen {
                bail!("--peer-listen must differ from --listen");
            }
            Some((peer_listen, apiserver.address))
        }
        _ => None,
    };
    Ok(DynamicBootstrap {
        listen: &listen,
        admin_port: args.admin_port,
        xds: &xds,
        node_id: &args.node_id,
        request_timeout: args.request_timeout,
        serving: serving.as_ref(),
        peer: peer
            .as_ref()
            .map(|(listen, apiserver)| PeerPassthrough { listen, apiserver }),
    }
    .render()?)
}

/// `skewgate-control bootstrap`.
pub fn bootstrap(args: BootstrapArgs) -> Result<()> {
    let yaml = render_bootstrap(&args)?;
    if args.insecure_plaintext_listener {
        eprintln!("skewgate-control: warning: --insecure-plaintext-listener: Envoy serves clients in PLAINTEXT (tests on loopback only)");
    }
    print!("{yaml}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    #[derive(clap::Subcommand)]
    enum Command {
        Run(RunArgs),
        Bootstrap(BootstrapArgs),
    }

    fn parse(args: &[&str]) -> Result<Command, clap::Error> {
        Cli::try_parse_from(std::iter::once("skewgate-control").chain(args.iter().copied()))
            .map(|c| c.command)
    }

    #[test]
    fn run_flags_parse_like_kube_apiserver_flags() {
        let Ok(Command::Run(args)) = parse(&[
            "run",
            "--kubeconfig=/etc/kubernetes/skewgate.conf",
            "--local-apiserver-url=https://127.0.0.1:6443",
            "--node-name=cp-1",
            "--peer-cidr=10.0.0.0/24",
            "--peer-cidr=fd00::/64",
            "--peer-address=host/cp-2=10.0.0.12:6444",
            "--lease-grace=45s",
            "--peer-ca-file=/etc/kubernetes/pki/ca.crt",
            "--proxy-client-cert-file=/etc/kubernetes/pki/front-proxy-client.crt",
            "--proxy-client-key-file=/etc/kubernetes/pki/front-proxy-client.key",
            "--wasm=/usr/lib/skewgate/skewgate_filter.wasm",
            "--log-format=json",
        ]) else {
            panic!("parses");
        };
        assert_eq!(args.lease_grace, Duration::from_secs(45));
        assert_eq!(args.log_format, LogFormat::Json);
        let config = args.flags().validate().expect("valid");
        assert_eq!(config.peers.policy.allowed_cidrs.len(), 2);
        assert!(config.upstream_tls.is_some());
        // --local-lease and --node-name exclude each other already in the parser.
        assert!(parse(&[
            "run",
            "--local-apiserver-url=https://127.0.0.1:6443",
            "--node-name=cp-1",
            "--local-lease=apiserver-x",
            "--wasm=/x.wasm",
        ])
        .is_err());
    }

    #[test]
    fn bootstrap_needs_tls_or_the_plaintext_opt_out() {
        let Ok(Command::Bootstrap(args)) = parse(&["bootstrap", "--xds-address=127.0.0.1:18000"])
        else {
            panic!("parses");
        };
        assert!(
            render_bootstrap(&args).is_err(),
            "neither TLS nor plaintext"
        );
        let Ok(Command::Bootstrap(args)) = parse(&[
            "bootstrap",
            "--insecure-plaintext-listener",
            "--listen=127.0.0.1:16440",
            "--request-timeout=1m0s",
        ]) else {
            panic!("parses");
        };
        let yaml = render_bootstrap(&args).expect("renders");
        assert!(yaml.contains("timeout: 70s"));
        assert!(yaml.contains("- name: plaintext"));
        let Ok(Command::Bootstrap(args)) = parse(&[
            "bootstrap",
            "--tls-cert-file=/pki/apiserver.crt",
            "--tls-private-key-file=/pki/apiserver.key",
            "--client-ca-file=/pki/ca.crt",
        ]) else {
            panic!("parses");
        };
        let yaml = render_bootstrap(&args).expect("renders");
        assert!(yaml.contains("DownstreamTlsContext"));
        assert!(yaml.contains("/pki/ca.crt"));
        // The xDS port carries no authentication: loopback only.
        let Ok(Command::Bootstrap(args)) = parse(&[
            "bootstrap",
            "--insecure-plaintext-listener",
            "--xds-address=10.0.0.1:18000",
        ]) else {
            panic!("parses");
        };
        assert!(render_bootstrap(&args).is_err());
        // The peer port, passed through to the apiserver.
        let Ok(Command::Bootstrap(args)) = parse(&[
            "bootstrap",
            "--insecure-plaintext-listener",
            "--listen=10.0.0.11:6443",
            "--peer-listen=10.0.0.11:6444",
            "--local-apiserver-url=https://127.0.0.1:6443",
        ]) else {
            panic!("parses");
        };
        let yaml = render_bootstrap(&args).expect("renders");
        assert!(yaml.contains("port_value: 6444") && yaml.contains("skewgate-local-passthrough"));
        assert!(parse(&["bootstrap", "--peer-listen=10.0.0.11:6444"]).is_err());
        // Both ways to serve at once is a contradiction.
        assert!(parse(&[
            "bootstrap",
            "--insecure-plaintext-listener",
            "--tls-cert-file=/a",
            "--tls-private-key-file=/b",
        ])
        .is_err());
    }
}
