//! The `run` and `bootstrap` subcommands: flags (kube-apiserver's names where the meaning is
//! the same), logging, signals, and wiring the parts together.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::envoy::bootstrap::{Bootstrap, ConfigSource, PeerPassthrough};
use crate::envoy::fallback::{read_acknowledged, FallbackInputs};
use crate::envoy::goaway::{self, ConnectionDrain, GoawayFile, GOAWAY_FILE};
use crate::envoy::reachability::Reachability;
use crate::envoy::secrets::{serving_secrets, upstream_secrets};
use crate::fetch::{ClientTemplate, DiscoveryMetrics};
use crate::health::{self, Health};
use crate::local_channels::{self, LocalChannel, PrivateDir};
use crate::peers::{self, PeerMetrics, PeerWatcher};
use crate::shared_storage::{SharedStorageMetrics, SharedStorageWatcher};
use crate::xds::{self, XdsMetrics};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret;

pub use super::bootstrap_config::BootstrapArgs;
use super::bootstrap_config::BootstrapConfig;
use super::config::{LogFormat, LogLevel, RunArgs, RunConfig};
use super::orchestrator::{restore_state, Orchestrator, Shared};
use super::status::{AppMetrics, Status};

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
    let config = args.validate()?;
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

/// Write the SDS files into `--sds-dir`, created 0700 if missing and refused, like
/// `--socket-dir`, when another user owns it or may write to it: whoever replaces an SDS file
/// chooses the client CA Envoy verifies identities against.
fn write_sds_files(dir: &std::path::Path, secrets: &[Secret], writer: &str) -> Result<()> {
    local_channels::prepare_private_dir(dir, PrivateDir::SdsFiles)?;
    xds::files::write_secrets(dir, secrets, writer)
        .with_context(|| format!("writing the SDS files in --sds-dir {}", dir.display()))
}

/// The xDS server's listener: its Unix socket (the socket directory created or checked first),
/// or loopback TCP.
async fn bind_xds(channels: &local_channels::LocalChannels) -> Result<xds::Listener> {
    match channels.xds() {
        LocalChannel::Unix(path) => {
            channels.prepare().context("--socket-dir")?;
            Ok(local_channels::bind_unix(path)
                .context("the xDS socket in --socket-dir")?
                .into())
        }
        LocalChannel::Tcp(address) => {
            warn!(
                "INSECURE: --insecure-tcp-local-channels: xDS on {address} and Envoy's admin \
                 interface on loopback TCP: any process on this node can reach them"
            );
            Ok(tokio::net::TcpListener::bind(address)
                .await
                .with_context(|| format!("--xds-address {address}"))?
                .into())
        }
    }
}

async fn wait_true(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

async fn run_async(config: RunConfig) -> Result<()> {
    let config = Arc::new(config);
    readable(
        std::path::Path::new(config.filter_code.path()),
        config.filter_code.data_plane.path_flag(),
    )?;
    // Before anything listens: a state directory another user owns is refused here.
    let restored = restore_state(&config).context("--state-dir")?;
    if let Some(tls) = &config.upstream_tls {
        // Envoy reads these; a typo should fail here, not as a NACK later.
        readable(&tls.proxy_client_cert_file, "--proxy-client-cert-file")?;
        readable(&tls.proxy_client_key_file, "--proxy-client-key-file")?;
        // The clusters name the certificates through these SDS files: they exist before the
        // first cluster is served. Envoy follows the certificate files from there.
        let dir = config.sds_dir.as_deref().context("TLS needs --sds-dir")?;
        write_sds_files(dir, &upstream_secrets(tls)?, "run")?;
    }
    let xds_listener = bind_xds(&config.local_channels).await?;
    let health_listener = tokio::net::TcpListener::bind(config.health_listen)
        .await
        .with_context(|| format!("--health-listen {}", config.health_listen))?;
    let debug_listener = match config.debug_listen {
        Some(address) => Some(
            tokio::net::TcpListener::bind(address)
                .await
                .with_context(|| format!("--debug-listen {address}"))?,
        ),
        None => None,
    };

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

    let metrics = Metrics::default();
    let peer_watcher = PeerWatcher::spawn_restoring(
        client.clone(),
        config.peers.clone(),
        restored.retention.first_seen(),
        metrics.peers.clone(),
    );
    let shared_watcher = SharedStorageWatcher::spawn(client, metrics.shared_storage.clone());
    let status = Arc::new(Status::default());
    let (publisher, snapshots) = watch::channel(None);
    let (shutdown_tx, shutdown_rx) = watch::channel(false);

    let health = health_endpoints(&config, &metrics, &status);
    // Which peers Envoy's health checks find unreachable, for /debug/skew and /metrics.
    let _reachability_task = config.local_channels.envoy_admin().cloned().map(|admin| {
        let reachability = metrics.reachability.clone();
        let shutdown = shutdown_rx.clone();
        tokio::spawn(async move { reachability.poll(admin, shutdown).await })
    });
    let mut health_task =
        spawn_health_servers(health_listener, debug_listener, health, shutdown_rx.clone());
    let mut xds_task = tokio::spawn(xds::serve(
        xds_listener,
        snapshots,
        metrics.xds.clone(),
        xds::ServeOptions {
            acknowledged_dir: config.state_dir.clone(),
            ..xds::ServeOptions::default()
        },
        wait_true(shutdown_rx.clone()),
    ));
    let orchestrator = Orchestrator::new(
        config.clone(),
        template,
        Shared {
            discovery_metrics: metrics.discovery.clone(),
            app_metrics: metrics.app.clone(),
            status,
        },
        publisher,
        restored,
    )?;
    // Every client connection told to go away while the local apiserver stays down.
    let _local_down_task = config.local_channels.socket_dir().map(|dir| {
        tokio::spawn(super::local_down::run(
            dir.to_path_buf(),
            config.local_down_goaway_after,
            orchestrator.local_state(),
            metrics.xds.clone(),
            metrics.local_down.clone(),
        ))
    });
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
        r = &mut health_task => Some(format!("the health or debug server stopped: {r:?}")),
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

/// Every metric family `run` exposes, by the part that counts it.
#[derive(Default)]
struct Metrics {
    peers: Arc<PeerMetrics>,
    shared_storage: Arc<SharedStorageMetrics>,
    discovery: Arc<DiscoveryMetrics>,
    xds: Arc<XdsMetrics>,
    app: Arc<AppMetrics>,
    local_down: Arc<super::local_down::LocalDownMetrics>,
    /// Which peers this node's Envoy cannot reach (read from its admin interface).
    reachability: Arc<Reachability>,
}

/// `/readyz`, `/metrics` and `/debug/skew` over the run's status and metrics.
fn health_endpoints(config: &RunConfig, metrics: &Metrics, status: &Arc<Status>) -> Arc<Health> {
    let (s1, s2) = (status.clone(), status.clone());
    let (pm, dm, xm, sm, am, lm) = (
        metrics.peers.clone(),
        metrics.discovery.clone(),
        metrics.xds.clone(),
        metrics.shared_storage.clone(),
        metrics.app.clone(),
        metrics.local_down.clone(),
    );
    let (rm, rs) = (metrics.reachability.clone(), metrics.reachability.clone());
    let (xr, xs) = (metrics.xds.clone(), metrics.xds.clone());
    Arc::new(Health {
        // Ready says nothing about Envoy; a note names an Envoy whose filter cannot read the
        // filter configuration (skewgate's own version skew).
        ready: Box::new(move || {
            s1.ready().map(|mut notes| {
                notes.extend(xr.readiness_notes());
                notes
            })
        }),
        metrics: Box::new(move || {
            let mut f = am.families();
            f.extend(pm.families());
            f.extend(dm.families());
            f.extend(xm.families());
            f.extend(sm.families());
            f.extend(lm.families());
            f.extend(rm.families());
            f
        }),
        envoy_admin: config.local_channels.envoy_admin().cloned(),
        skew: Box::new(move |all| {
            let mut doc = s2.skew_json(all);
            if let Some(doc) = doc.as_object_mut() {
                doc.insert(
                    "envoy_streams".to_string(),
                    serde_json::to_value(xs.envoy_streams()).unwrap_or_default(),
                );
                // A live peer this node's Envoy cannot reach, and since when.
                for apiserver in doc
                    .get_mut("apiservers")
                    .and_then(|a| a.as_array_mut())
                    .into_iter()
                    .flatten()
                {
                    let address = apiserver["url"]
                        .as_str()
                        .and_then(|u| u.split_once("://"))
                        .map(|(_, a)| a.to_string());
                    if let (Some(since), Some(entry)) = (
                        address.and_then(|a| rs.since(&a)),
                        apiserver.as_object_mut(),
                    ) {
                        entry.insert("unreachable_since_unix_seconds".into(), since.into());
                    }
                }
            }
            doc
        }),
    })
}

/// The health listener and, when given, the debug listener, in one task: either stopping is a
/// failure.
fn spawn_health_servers(
    health_listener: tokio::net::TcpListener,
    debug_listener: Option<tokio::net::TcpListener>,
    health: Arc<Health>,
    shutdown: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<std::io::Result<()>> {
    let serve_health = health::serve(
        health_listener,
        health::router(health.clone()),
        "health and metrics",
        wait_true(shutdown.clone()),
    );
    let debug_shutdown = wait_true(shutdown);
    let serve_debug = async move {
        match debug_listener {
            Some(listener) => {
                health::serve(
                    listener,
                    health::debug_router(health),
                    "debug (/debug/skew)",
                    debug_shutdown,
                )
                .await
            }
            None => Ok(()),
        }
    };
    tokio::spawn(async move { tokio::try_join!(serve_health, serve_debug).map(|_| ()) })
}

/// Render the bootstrap for these flags (YAML, [`Bootstrap::render`]).
pub fn render_bootstrap(args: &BootstrapArgs) -> Result<String> {
    render(&args.validate()?)
}

fn render(config: &BootstrapConfig) -> Result<String> {
    // What the control plane last saw acknowledged, if it kept it: a record that cannot be
    // read or rendered ([`read_acknowledged`] checks it as the fallback will use it), or that
    // sits in a directory another user could write (whatever it holds could be theirs), leaves
    // the fallback local-only, and says so on stderr (the Envoy pod's log): Envoy must start
    // regardless.
    let acknowledged = match &config.fallback {
        Some(_) => match crate::state_file::check_dir(&config.state_dir)
            .map_err(|e| e.to_string())
            .and_then(|()| read_acknowledged(&config.state_dir))
        {
            Ok(record) => record,
            Err(e) => {
                eprintln!(
                    "skewgate-control: warning: the last acknowledged configuration is not used, \
                     the fallback is local-only: {e}"
                );
                None
            }
        },
        _ => None,
    };
    let fallback = match (&config.fallback, &config.local) {
        (Some(flags), Some(local)) => Some(FallbackInputs {
            wait: flags.wait,
            filter_code: &flags.filter_code,
            local,
            upstream_sds: flags.upstream.as_ref().and(config.sds_dir.as_deref()),
            local_apiserver: &config.node_id,
            acknowledged: acknowledged.as_ref(),
        }),
        _ => None,
    };
    Ok(Bootstrap {
        listen: &config.listen,
        admin: config.channels.admin(),
        config_source: ConfigSource::Ads {
            xds: config.channels.xds(),
        },
        node_id: &config.node_id,
        request_timeout: config.request_timeout,
        serving: config.serving.as_ref(),
        sds_dir: config.sds_dir.as_deref(),
        peer: config
            .peer_listen
            .as_ref()
            .zip(config.local.as_ref())
            .map(|(listen, apiserver)| PeerPassthrough {
                listen,
                apiserver,
                allowed_sources: &config.peer_cidrs,
            }),
        fallback,
        goaway: config.goaway_file.as_deref().map(|path| GoawayFile {
            path,
            configured: config.goaway_chance,
        }),
    }
    .render("bootstrap")?)
}

/// The SDS files `bootstrap` writes and where (`None` without TLS): the listener's serving
/// certificate and client CA, and with the fallback's TLS clusters the peer CA and the
/// proxy-client certificate (the same files `run --sds-dir` writes: the fallback must not
/// depend on the control plane having run).
pub fn bootstrap_secrets(
    args: &BootstrapArgs,
) -> Result<Option<(std::path::PathBuf, Vec<Secret>)>> {
    secrets(&args.validate()?)
}

fn secrets(config: &BootstrapConfig) -> Result<Option<(std::path::PathBuf, Vec<Secret>)>> {
    let mut secrets = Vec::new();
    if let Some(serving) = &config.serving {
        secrets.extend(serving_secrets(serving)?);
    }
    if let Some(upstream) = config.fallback.as_ref().and_then(|f| f.upstream.as_ref()) {
        secrets.extend(upstream_secrets(upstream)?);
    }
    if secrets.is_empty() {
        return Ok(None);
    }
    let Some(dir) = config.sds_dir.clone() else {
        bail!("TLS needs --sds-dir");
    };
    Ok(Some((dir, secrets)))
}

/// `skewgate-control bootstrap`: create (or check) the socket directory Envoy binds its admin
/// socket in, write the GOAWAY chance there and the SDS files (the listener's, and the fallback
/// clusters'), print the bootstrap.
pub fn bootstrap(args: BootstrapArgs) -> Result<()> {
    let config = args.validate()?;
    let bootstrap = render(&config)?;
    let channels = &config.channels;
    channels.prepare().context("--socket-dir")?;
    if let Some(dir) = channels.socket_dir() {
        // Before every Envoy start: the configured chance, never a "drain everything" a
        // previous Envoy's control plane left (`crate::envoy::goaway`).
        goaway::write(dir, ConnectionDrain::Chance(config.goaway_chance))
            .with_context(|| format!("writing {GOAWAY_FILE} in --socket-dir {}", dir.display()))?;
    }
    if config.insecure_tcp_local_channels {
        eprintln!("skewgate-control: warning: --insecure-tcp-local-channels: Envoy's admin interface and xDS on loopback TCP, which any process on this node can reach");
    }
    if let Some((dir, secrets)) = secrets(&config)? {
        write_sds_files(&dir, &secrets, "bootstrap")?;
    }
    if config.insecure_plaintext_listener {
        eprintln!("skewgate-control: warning: --insecure-plaintext-listener: Envoy serves clients in PLAINTEXT (tests on loopback only)");
    }
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(bootstrap.as_bytes())
        .context("writing the bootstrap")?;
    stdout.flush().context("writing the bootstrap")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envoy::bootstrap::inspect::*;
    use crate::envoy::bootstrap::{
        CONTROL_PLANE_CLUSTER, LISTENER_NAME, PASSTHROUGH_CLUSTER, PEER_LISTENER_NAME,
    };
    use clap::Parser;
    use envoy_types::pb::envoy::config::bootstrap::v3::Bootstrap as EnvoyBootstrap;
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::common_tls_context::ValidationContextType;
    use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
    use skewgate_core::config::{FallbackMode, FilterConfig, UpstreamAuth, FALLBACK_LOCAL_CLUSTER};

    fn decoded(args: &BootstrapArgs) -> EnvoyBootstrap {
        crate::envoy::yaml::from_yaml(&render_bootstrap(args).expect("renders"))
            .expect("reads back")
    }

    fn secs(seconds: i64) -> ProtoDuration {
        ProtoDuration { seconds, nanos: 0 }
    }

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    // Test-only and short-lived: the size of `RunArgs` does not matter here.
    #[allow(clippy::large_enum_variant)]
    #[derive(clap::Subcommand)]
    enum Command {
        Run(RunArgs),
        Bootstrap(BootstrapArgs),
    }

    fn parse(args: &[&str]) -> Result<Command, clap::Error> {
        Cli::try_parse_from(std::iter::once("skewgate-control").chain(args.iter().copied()))
            .map(|c| c.command)
    }

    /// A default written as a flag's text is the constant the code's own defaults use.
    #[test]
    fn run_flag_defaults_are_the_constants() {
        let Ok(Command::Run(args)) = parse(&[
            "run",
            "--local-apiserver-url=https://127.0.0.1:6443",
            "--node-name=cp-1",
            "--wasm=/x.wasm",
        ]) else {
            panic!("parses");
        };
        assert_eq!(args.lease_grace, crate::peers::DEFAULT_GRACE);
        assert_eq!(
            args.api_retention,
            crate::run::retention::DEFAULT_API_RETENTION
        );
        assert_eq!(args.max_peers, crate::peers::DEFAULT_MAX_PEERS);
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
            "--sds-dir=/var/lib/skewgate/sds",
            "--wasm=/usr/lib/skewgate/skewgate_filter.wasm",
            "--log-format=json",
        ]) else {
            panic!("parses");
        };
        assert_eq!(args.lease_grace, Duration::from_secs(45));
        assert_eq!(args.log_format, LogFormat::Json);
        let config = args.validate().expect("valid");
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
        let Ok(Command::Bootstrap(args)) = parse(&[
            "bootstrap",
            "--insecure-tcp-local-channels",
            "--control-plane-wait=0",
            "--xds-address=127.0.0.1:18000",
        ]) else {
            panic!("parses");
        };
        assert!(
            render_bootstrap(&args).is_err(),
            "neither TLS nor plaintext"
        );
        let Ok(Command::Bootstrap(args)) = parse(&[
            "bootstrap",
            "--control-plane-wait=0",
            "--insecure-plaintext-listener",
            "--listen=127.0.0.1:16440",
            "--request-timeout=1m0s",
        ]) else {
            panic!("parses");
        };
        let b = decoded(&args);
        assert_eq!(
            route_timeouts(&b),
            [[Some(secs(0)); 4], [Some(secs(70)); 4]].concat(),
            "the short-request timeout is --request-timeout + 10s"
        );
        let chain = &listener(&b, LISTENER_NAME).expect("listener").filter_chains[0];
        assert_eq!(chain.name, "plaintext");
        assert!(cluster_names(&b).contains(&CONTROL_PLANE_CLUSTER));
        let tls = [
            "bootstrap",
            "--control-plane-wait=0",
            "--tls-cert-file=/pki/apiserver.crt",
            "--tls-private-key-file=/pki/apiserver.key",
            "--client-ca-file=/pki/ca.crt",
        ];
        let Ok(Command::Bootstrap(args)) = parse(&tls) else {
            panic!("parses");
        };
        assert!(render_bootstrap(&args).is_err(), "TLS without --sds-dir");
        let Ok(Command::Bootstrap(args)) =
            parse(&[tls.as_slice(), &["--sds-dir=/var/lib/skewgate/sds"]].concat())
        else {
            panic!("parses");
        };
        let common = downstream_tls_context(&decoded(&args))
            .expect("TLS")
            .common_tls_context
            .expect("common");
        let sds = |name| {
            crate::envoy::secrets::sds_secret_config(
                std::path::Path::new("/var/lib/skewgate/sds"),
                name,
            )
            .expect("sds")
        };
        assert_eq!(
            common.tls_certificate_sds_secret_configs,
            [sds("skewgate-serving")]
        );
        assert_eq!(
            common.validation_context_type,
            Some(ValidationContextType::ValidationContextSdsSecretConfig(
                sds("skewgate-client-ca")
            ))
        );
        // The files themselves are in the secrets written beside.
        let (dir, secrets) = bootstrap_secrets(&args).expect("secrets").expect("TLS");
        assert_eq!(dir, std::path::Path::new("/var/lib/skewgate/sds"));
        assert_eq!(
            secrets,
            serving_secrets(&args.listener.serving_tls().expect("tls").expect("some"))
                .expect("secrets")
        );
        // The xDS port carries no authentication: loopback only (refused by the parser).
        assert!(parse(&[
            "bootstrap",
            "--control-plane-wait=0",
            "--insecure-plaintext-listener",
            "--insecure-tcp-local-channels",
            "--xds-address=10.0.0.1:18000",
        ])
        .is_err());
        // The peer port, passed through to the apiserver.
        let Ok(Command::Bootstrap(args)) = parse(&[
            "bootstrap",
            "--control-plane-wait=0",
            "--insecure-plaintext-listener",
            "--listen=10.0.0.11:6443",
            "--peer-listen=10.0.0.11:6444",
            "--peer-cidr=10.0.0.0/24",
            "--local-apiserver-url=https://127.0.0.1:6443",
        ]) else {
            panic!("parses");
        };
        let b = decoded(&args);
        let peer = listener(&b, PEER_LISTENER_NAME).expect("the peer port");
        assert_eq!(address_of(&peer.address), socket("10.0.0.11", 6444));
        assert!(cluster_names(&b).contains(&PASSTHROUGH_CLUSTER));
        let Ok(Command::Bootstrap(args)) = parse(&[
            "bootstrap",
            "--control-plane-wait=0",
            "--insecure-plaintext-listener",
            "--peer-listen=10.0.0.11:6444",
            "--peer-cidr=10.0.0.0/24",
        ]) else {
            panic!("parses");
        };
        assert!(
            render_bootstrap(&args).is_err(),
            "a peer port leading nowhere"
        );
        // Both ways to serve at once is a contradiction.
        assert!(parse(&[
            "bootstrap",
            "--control-plane-wait=0",
            "--insecure-plaintext-listener",
            "--tls-cert-file=/a",
            "--tls-private-key-file=/b",
        ])
        .is_err());
    }

    /// Whoever can replace an SDS file chooses the client CA, so every identity Envoy vouches
    /// for: `--sds-dir` is checked like `--socket-dir` before anything is written into it.
    #[test]
    fn the_sds_directory_is_private() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let Ok(Command::Bootstrap(args)) = parse(&[
            "bootstrap",
            "--control-plane-wait=0",
            "--tls-cert-file=/pki/apiserver.crt",
            "--tls-private-key-file=/pki/apiserver.key",
            "--client-ca-file=/pki/ca.crt",
            "--sds-dir=/unused",
        ]) else {
            panic!("parses");
        };
        let (_, secrets) = bootstrap_secrets(&args).expect("secrets").expect("TLS");
        let tmp = tempfile::tempdir().expect("tempdir");
        let mode = |p: &std::path::Path| std::fs::metadata(p).expect("metadata").mode() & 0o7777;

        // Missing: created 0700, and written.
        let created = tmp.path().join("run/sds");
        write_sds_files(&created, &secrets, "test").expect("written");
        assert_eq!(mode(&created), 0o700);
        assert!(created.join("skewgate-client-ca.yaml").exists());

        // Writable by group or others: refused, nothing written.
        for refused in [0o770, 0o757, 0o1777] {
            let dir = tmp.path().join(format!("open-{refused:o}"));
            std::fs::create_dir(&dir).expect("mkdir");
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(refused))
                .expect("chmod");
            let err = write_sds_files(&dir, &secrets, "test").expect_err("refused");
            let text = format!("{err:#}");
            assert!(
                text.contains("--sds-dir") && text.contains("client CA"),
                "{text}"
            );
            assert_eq!(
                std::fs::read_dir(&dir).expect("read").count(),
                0,
                "{refused:o}"
            );
        }

        // Another user's: refused (only root can make one here).
        let theirs = tmp.path().join("theirs");
        std::fs::create_dir(&theirs).expect("mkdir");
        if std::os::unix::fs::chown(&theirs, Some(4242), Some(4242)).is_ok() {
            let err = write_sds_files(&theirs, &secrets, "test").expect_err("refused");
            assert!(
                format!("{err:#}").contains("belongs to uid 4242"),
                "{err:#}"
            );
            assert_eq!(std::fs::read_dir(&theirs).expect("read").count(), 0);
        }
    }

    #[test]
    fn bootstrap_reads_the_state_dir_run_keeps_by_default() {
        let Ok(Command::Bootstrap(bootstrap)) =
            parse(&["bootstrap", "--insecure-plaintext-listener"])
        else {
            panic!("parses");
        };
        let Ok(Command::Run(run)) = parse(&[
            "run",
            "--local-apiserver-url=http://127.0.0.1:8080",
            "--node-name=cp-1",
            "--insecure-plaintext-upstreams",
            "--wasm=/x.wasm",
        ]) else {
            panic!("parses");
        };
        assert_eq!(
            bootstrap.state_dir,
            std::path::Path::new(crate::flags::DEFAULT_STATE_DIR)
        );
        assert_eq!(run.state_dir, bootstrap.state_dir);
    }

    #[test]
    fn bootstrap_falls_back_to_local_only_after_the_wait() {
        let base = [
            "bootstrap",
            "--insecure-plaintext-listener",
            "--node-id=cp-1",
            "--local-apiserver-url=https://127.0.0.1:6443",
            "--wasm=/usr/lib/skewgate/skewgate_filter.wasm",
            "--peer-ca-file=/pki/ca.crt",
            "--proxy-client-cert-file=/pki/front-proxy-client.crt",
            "--proxy-client-key-file=/pki/front-proxy-client.key",
            "--sds-dir=/var/lib/skewgate/sds",
        ];
        let Ok(Command::Bootstrap(args)) = parse(&base) else {
            panic!("parses");
        };
        assert_eq!(args.control_plane_wait, Duration::from_secs(30));
        let b = decoded(&args);
        // The one bound, split between CDS and ECDS (they expire one after the other).
        assert_eq!(waits(&b), [Some(secs(15)), Some(secs(15))]);
        let config = FilterConfig::from_json(default_filter_config(&b).as_bytes()).expect("valid");
        assert_eq!(
            config.fallback.map(|f| f.mode),
            Some(FallbackMode::LocalOnly)
        );
        for auth in UpstreamAuth::ALL {
            let name = auth.cluster(FALLBACK_LOCAL_CLUSTER);
            assert!(cluster_names(&b).contains(&name.as_str()), "{name}");
            let tls = upstream_tls_context(&b, &name).expect("TLS to the apiserver");
            let Some(ValidationContextType::CombinedValidationContext(combined)) = tls
                .common_tls_context
                .expect("common")
                .validation_context_type
            else {
                panic!("a combined validation context");
            };
            assert_eq!(
                combined
                    .validation_context_sds_secret_config
                    .map(|c| c.name),
                Some("skewgate-peer-ca".to_string())
            );
        }
        // It writes the upstream SDS files itself: Envoy may start before `run` ever did.
        let (_, secrets) = bootstrap_secrets(&args).expect("secrets").expect("TLS");
        let names: Vec<&str> = secrets.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["skewgate-peer-ca", "skewgate-proxy-client"]);

        // Plaintext upstreams only when asked for, and then the URL must say http://.
        let plain = [
            "bootstrap",
            "--insecure-plaintext-listener",
            "--local-apiserver-url=http://127.0.0.1:6443",
            "--wasm=/x.wasm",
            "--insecure-plaintext-upstreams",
            "--control-plane-wait=2s",
        ];
        let Ok(Command::Bootstrap(args)) = parse(&plain) else {
            panic!("parses");
        };
        let b = decoded(&args);
        assert_eq!(waits(&b), [Some(secs(1)), Some(secs(1))]);
        let local = UpstreamAuth::Token.cluster(FALLBACK_LOCAL_CLUSTER);
        assert!(cluster_names(&b).contains(&local.as_str()));
        assert!(upstream_tls_context(&b, &local).is_none());
        assert!(bootstrap_secrets(&args).expect("secrets").is_none());

        // Missing pieces are refused, not silently left without a fallback.
        for drop in ["--wasm", "--local-apiserver-url", "--peer-ca-file"] {
            let args: Vec<&str> = base
                .iter()
                .copied()
                .filter(|a| !a.starts_with(drop))
                .collect();
            let Ok(Command::Bootstrap(args)) = parse(&args) else {
                panic!("parses");
            };
            assert!(render_bootstrap(&args).is_err(), "without {drop}");
        }
        assert!(parse(&[base.as_slice(), &["--control-plane-wait=1ms"]].concat()).is_err());
        // 0: no fallback, both waits forever.
        let Ok(Command::Bootstrap(args)) =
            parse(&[base.as_slice(), &["--control-plane-wait=0"]].concat())
        else {
            panic!("parses");
        };
        let b = decoded(&args);
        assert_eq!(waits(&b), [Some(secs(0)), Some(secs(0))]);
        assert!(filter_discovery(&b).default_config.is_none());
        assert!(!cluster_names(&b)
            .iter()
            .any(|c| c.starts_with("skewgate-fallback")));
    }

    #[test]
    fn bootstrap_ignores_a_kept_configuration_others_could_have_written() {
        use crate::envoy::fallback::{local_only_config, write_acknowledged, AcknowledgedConfig};
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let tmp = tempfile::tempdir().expect("tempdir");
        let state = tmp.path().join("state");
        let flag = format!("--state-dir={}", state.display());
        let Ok(Command::Bootstrap(args)) = parse(&[
            "bootstrap",
            "--insecure-plaintext-listener",
            "--local-apiserver-url=http://127.0.0.1:6443",
            "--wasm=/x.wasm",
            "--insecure-plaintext-upstreams",
            &flag,
        ]) else {
            panic!("parses");
        };
        let mode = |args: &BootstrapArgs| {
            FilterConfig::from_json(default_filter_config(&decoded(args)).as_bytes())
                .expect("valid")
                .fallback
                .map(|f| f.mode)
        };
        // No directory yet (the control plane never ran): local-only, nothing created.
        assert_eq!(mode(&args), Some(FallbackMode::LocalOnly));
        assert!(!state.exists());
        let record = AcknowledgedConfig {
            filter_config: local_only_config("cp-1"),
            peer_clusters: Default::default(),
        };
        write_acknowledged(&state, &record).expect("kept");
        assert_eq!(mode(&args), Some(FallbackMode::LastAcknowledged));
        // Writable by others: whoever could write it chooses the routing. Refused, untouched.
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        assert_eq!(mode(&args), Some(FallbackMode::LocalOnly));
        assert_eq!(
            std::fs::metadata(&state).expect("metadata").mode() & 0o7777,
            0o777
        );
    }
}
