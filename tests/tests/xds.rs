//! The live mode on real Envoy 1.40: the rendered bootstrap (`skewgate_control::envoy::bootstrap`), the xDS
//! server of `skewgate_control::xds` running in this test process on its Unix socket, the release
//! `skewgate_filter.wasm`, and simulated apiservers (1.30 local, 1.33 peer) serving the real
//! fixture documents.
//!
//! One scenario, in order: (a) before any snapshot Envoy's listener stays closed; (b) the first
//! snapshot opens it and routes; (c) a filter configuration the filter refuses is NACKed once,
//! not re-pushed, and Envoy keeps routing with the previous one; (d) the server stops and
//! restarts at the same socket (the dead server's socket file replaced) while traffic flows: no gap, and the reconnecting Envoy is
//! resynced from the versions it reports; (e) the restarted server pushes the next change
//! (the peer leaves: its cluster is removed after the configuration that no longer names it,
//! and only after the linger, for requests routed there before that still retry; the linger
//! is longer by as much as the route timeout Envoy's node advertises is).
//!
//! And skewgate's own version skew: one control plane, three Envoys whose bootstraps advertise
//! this release's filter dialect, nothing (the previous release), and only a later schema
//! than this control plane writes. The first two are configured as usual; the third is sent
//! its clusters but no filter configuration (no NACK), serves its bootstrap's fallback, and the
//! control plane reports it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use skewgate_control::envoy::bootstrap::{Bootstrap, ConfigSource};
use skewgate_control::envoy::dialect::node_metadata;
use skewgate_control::envoy::fallback::FallbackInputs;
use skewgate_control::envoy::resources::filter_extension_config;
use skewgate_control::envoy::{Address, FILTER_NAME};
use skewgate_control::local_channels::{self, LocalChannel, LocalChannels};
use skewgate_control::routing::{self, Peer, RoutingPlan};
use skewgate_control::xds::{
    self, Snapshot, SnapshotInputs, XdsError, XdsMetrics, CLUSTER_TYPE_URL,
    EXTENSION_CONFIG_TYPE_URL,
};
use skewgate_core::config::{FilterDialect, SCHEMA_VERSION};
use skewgate_tests::{
    client, filter_code, free_port, header, wait_until, Envoy, Probe, SimApiserver,
    DEFAULT_REQUEST_TIMEOUT,
};
use tokio::sync::{oneshot, watch};

const CLAIMS_V1BETA2: &str = "/apis/resource.k8s.io/v1beta2/namespaces/default/resourceclaims";
const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/default/deployments";
const CDS: &str = CLUSTER_TYPE_URL;
const ECDS: &str = EXTENSION_CONFIG_TYPE_URL;

type Publisher = watch::Sender<Option<Arc<Snapshot>>>;

fn init_logs() {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let _ = tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_test_writer())
        .with(Targets::new().with_target("skewgate_control", LevelFilter::DEBUG))
        .try_init();
}

/// How long a removed cluster stays here for a node with kube's default `--request-timeout`:
/// short, so that (e) sees it stay and then go.
const LINGER: Duration = Duration::from_secs(3);
/// How much longer than kube's default the live Envoy's requests may take: its bootstrap says
/// so in its node, and the server lingers that much longer.
const LONGER_REQUESTS: Duration = Duration::from_secs(2);

/// The xDS server of `skewgate_control::xds`, in this process.
struct XdsServer {
    socket: std::path::PathBuf,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), XdsError>>,
}

impl XdsServer {
    async fn start(
        socket: &std::path::Path,
        snapshots: watch::Receiver<Option<Arc<Snapshot>>>,
        metrics: Arc<XdsMetrics>,
    ) -> Result<Self> {
        let listener = local_channels::bind_unix(socket)?;
        let (stop, stopped) = oneshot::channel::<()>();
        let options = xds::ServeOptions {
            acknowledged_dir: None,
            cluster_linger: LINGER,
        };
        let task = tokio::spawn(xds::serve(
            listener,
            snapshots,
            metrics,
            options,
            async move {
                let _ = stopped.await;
            },
        ));
        Ok(XdsServer {
            socket: socket.to_path_buf(),
            stop: Some(stop),
            task,
        })
    }

    /// Stop it: every stream ends, the port closes; returns how long that took.
    async fn stop(mut self) -> Result<Duration> {
        let started = Instant::now();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(20), &mut self.task)
            .await
            .context("the xDS server did not stop within 20s")???;
        Ok(started.elapsed())
    }
}

/// Envoy on the rendered live-mode bootstrap, its admin interface up (not its listener: that
/// opens only after the first sync).
async fn live_envoy(channels: &LocalChannels) -> Result<Envoy> {
    // The listener's port is chosen here so that its closed state can be observed.
    let listen = Address::parse(&format!("127.0.0.1:{}", free_port()?))?;
    let yaml = Bootstrap {
        listen: &listen,
        admin: channels.admin(),
        config_source: ConfigSource::Ads {
            xds: channels.xds(),
        },
        node_id: "envoy-apiserver-a",
        request_timeout: DEFAULT_REQUEST_TIMEOUT + LONGER_REQUESTS,
        serving: None,
        sds_dir: None,
        peer: None,
        fallback: None,
        goaway: None,
    }
    .render("test")?;
    Envoy::spawn(yaml.as_bytes(), listen).await
}

/// (status, x-sim-apiserver) of a GET through Envoy.
async fn get(envoy: &Envoy, path: &str) -> Result<(u16, String)> {
    let resp = client()
        .get(format!("{}{path}", envoy.url()))
        .send()
        .await?;
    Ok((resp.status().as_u16(), header(&resp, "x-sim-apiserver")))
}

/// Poll until `path` answers `status` from `server`; returns when it first did.
async fn wait_routed(envoy: &Envoy, path: &str, status: u16, server: &str) -> Result<Instant> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let last = match get(envoy, path).await {
            Ok((s, by)) if s == status && by == server => return Ok(Instant::now()),
            Ok(other) => format!("{other:?}"),
            Err(e) => e.to_string(),
        };
        if Instant::now() > deadline {
            bail!(
                "{path} never answered {status} from {server} (last: {last})\n{}",
                envoy.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn plan(local: &SimApiserver, peers: &[&SimApiserver]) -> Result<RoutingPlan> {
    let peers = peers
        .iter()
        .map(|p| {
            Ok(Peer {
                id: p.id.clone(),
                served: p.served()?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RoutingPlan::of_table(routing::build(
        &local.served()?,
        &local.id,
        &peers,
        routing::RetainedRoutes::NONE,
        &Default::default(),
        routing::LocalFreshness::Current,
    )))
}

fn snapshot(
    plan: &RoutingPlan,
    local: &SimApiserver,
    peers: &[&SimApiserver],
) -> Result<Arc<Snapshot>> {
    let filter_code = filter_code()?;
    let addresses: Vec<(String, Address)> = peers
        .iter()
        .map(|p| (p.id.clone(), p.address.clone()))
        .collect();
    Ok(Arc::new(Snapshot::from_plan(
        plan,
        &SnapshotInputs {
            filter_code: &filter_code,
            local: &local.address,
            peers: &addresses,
            upstream_sds: None,
        },
    )?))
}

/// Publish and measure publish → first request routed as expected.
async fn publish_and_time(
    publisher: &Publisher,
    snapshot: Arc<Snapshot>,
    envoy: &Envoy,
    path: &str,
    status: u16,
    server: &str,
) -> Result<Duration> {
    let published = Instant::now();
    publisher.send_replace(Some(snapshot));
    let routed = wait_routed(envoy, path, status, server).await?;
    Ok(routed - published)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_control_plane_over_delta_ads() -> Result<()> {
    init_logs();
    let a = SimApiserver::start("apiserver-a", "k8s-1.30").await?;
    let b = SimApiserver::start("apiserver-b", "k8s-1.33").await?;

    let (publisher, snapshots) = watch::channel(None);
    let metrics = Arc::new(XdsMetrics::new());
    let sockets = tempfile::tempdir()?;
    let channels = LocalChannels::unix(sockets.path())?;
    let LocalChannel::Unix(xds_socket) = channels.xds() else {
        bail!("the default is a Unix socket");
    };
    let server = XdsServer::start(xds_socket, snapshots.clone(), metrics.clone()).await?;
    let envoy = live_envoy(&channels).await?;

    // (a) Envoy has opened its ADS stream, but no snapshot exists: nothing is sent, and the
    // listener stays closed (warming on ECDS).
    wait_until(
        "Envoy opens its ADS stream",
        Duration::from_secs(30),
        || metrics.streams() >= 1,
    )
    .await
    .with_context(|| envoy.log())?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let refused =
        tokio::net::TcpStream::connect((envoy.address.host.as_str(), envoy.address.port)).await;
    assert!(
        refused.is_err(),
        "the listener must not accept before the first sync"
    );
    let refused = refused.err().map(|e| e.kind());
    assert_eq!(
        refused,
        Some(std::io::ErrorKind::ConnectionRefused),
        "closed port"
    );
    // Envoy is still initializing (waiting for its clusters, then for the filter
    // configuration): the listen socket exists, but no worker listens on it.
    let workers = envoy.stat("listener_manager.workers_started").await?;
    let ready = envoy.admin("/ready").await?;
    eprintln!(
        "(a) before any snapshot: connect -> {refused:?}; workers started {workers}; /ready {:?}; responses sent: CDS {}, ECDS {}",
        ready.trim(),
        metrics.responses(CDS),
        metrics.responses(ECDS)
    );
    assert_eq!(workers, 0, "{}", envoy.log());
    assert_ne!(ready.trim(), "LIVE");
    assert_eq!((metrics.responses(CDS), metrics.responses(ECDS)), (0, 0));

    // (b) The first complete snapshot: the listener opens and routes.
    let good_plan = plan(&a, &[&b])?;
    let good = snapshot(&good_plan, &a, &[&b])?;
    let took = publish_and_time(
        &publisher,
        good.clone(),
        &envoy,
        CLAIMS_V1BETA2,
        200,
        "apiserver-b",
    )
    .await?;
    eprintln!(
        "(b) first snapshot publish -> first request routed to the peer: {took:?} \
         (filter configuration resource: {} bytes)",
        good.extension_configs[FILTER_NAME].resource.value.len()
    );
    assert_eq!(get(&envoy, DEPLOYMENTS).await?, (200, "apiserver-a".into()));
    assert_eq!(
        get(&envoy, CLAIMS_V1BETA2).await?,
        (200, "apiserver-b".into())
    );
    assert_eq!(envoy.stat("listener_manager.workers_started").await?, 1);
    assert_eq!(envoy.admin("/ready").await?.trim(), "LIVE");
    assert_eq!((metrics.responses(CDS), metrics.responses(ECDS)), (1, 1));
    assert_eq!(metrics.nacks(ECDS), 0);

    // (c) A filter configuration the filter refuses (it routes to a cluster it does not
    // declare): NACKed once, never re-pushed, and Envoy keeps the previous configuration.
    let peer_cluster = routing::peer_cluster_name(&[b.id.as_str()]);
    let good_json = good_plan.config.to_json();
    let bad_json = good_json.replace(
        &format!("\"peer_cluster\":\"{peer_cluster}\""),
        "\"peer_cluster\":\"skewgate-peers-undeclared\"",
    );
    assert_ne!(bad_json, good_json);
    let filter_code = filter_code()?;
    let bad = Arc::new(Snapshot {
        clusters: good.clusters.clone(),
        extension_configs: Snapshot::new([], [filter_extension_config(&filter_code, &bad_json)])
            .extension_configs,
        ..Default::default()
    });
    publisher.send_replace(Some(bad.clone()));
    wait_until(
        "the bad configuration is NACKed",
        Duration::from_secs(20),
        || metrics.nacks(ECDS) >= 1,
    )
    .await
    .with_context(|| envoy.log())?;
    // The same snapshot again, as a new publish: still nothing to send.
    tokio::time::sleep(Duration::from_secs(1)).await;
    publisher.send_replace(Some(Arc::new((*bad).clone())));
    tokio::time::sleep(Duration::from_secs(2)).await;
    eprintln!(
        "(c) NACK: nacks {}, ECDS responses {} (1 good + 1 bad), CDS responses {}; Envoy said: {:?}",
        metrics.nacks(ECDS),
        metrics.responses(ECDS),
        metrics.responses(CDS),
        metrics.last_nack().map(|(_, m)| m)
    );
    assert_eq!(metrics.nacks(ECDS), 1, "counted once");
    assert_eq!(
        metrics.responses(ECDS),
        2,
        "the refused version is not re-pushed"
    );
    assert_eq!(metrics.responses(CDS), 1, "clusters unchanged");
    assert_eq!(
        get(&envoy, CLAIMS_V1BETA2).await?,
        (200, "apiserver-b".into())
    );
    assert_eq!(get(&envoy, DEPLOYMENTS).await?, (200, "apiserver-a".into()));

    // (d) The control plane stops and comes back at the same address, with traffic flowing:
    // Envoy keeps serving with its last good configuration, reconnects reporting the versions
    // it holds, and the restarted server has nothing to resend.
    let probe = Probe::start(&envoy, vec![(CLAIMS_V1BETA2, 200, "apiserver-b")]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let xds_socket = server.socket.clone();
    let stopped_in = server.stop().await?;
    let down_since = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(metrics.streams(), 0);
    let served_while_down = probe.ok.load(Ordering::Relaxed);

    let (publisher2, snapshots2) = watch::channel(Some(good.clone()));
    let metrics2 = Arc::new(XdsMetrics::new());
    // The stopped server's socket file is still there: the next one replaces it.
    assert!(xds_socket.exists());
    let server2 = XdsServer::start(&xds_socket, snapshots2, metrics2.clone()).await?;
    wait_until("Envoy reconnects", Duration::from_secs(30), || {
        metrics2.streams() >= 1
    })
    .await
    .with_context(|| envoy.log())?;
    let reconnected_after = down_since.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (ok, failures) = probe.finish().await?;
    let failed = failures.len();
    eprintln!(
        "(d) server stopped in {stopped_in:?}; Envoy reconnected {reconnected_after:?} after the stop; \
         requests during stop/restart: {ok} routed to the peer ({served_while_down} before the restart), {failed} failed; \
         resent after reconnect: CDS {}, ECDS {}",
        metrics2.responses(CDS),
        metrics2.responses(ECDS)
    );
    assert_eq!(failed, 0, "no traffic gap: {failures:?}");
    assert!(ok > 0);
    assert_eq!(
        (metrics2.responses(CDS), metrics2.responses(ECDS)),
        (0, 0),
        "Envoy reported the versions it holds: nothing to resend"
    );

    // (e) The restarted server pushes the next change: the peer leaves. The configuration
    // that no longer names its cluster goes first, then the cluster is removed.
    let solo_plan = plan(&a, &[])?;
    let solo = snapshot(&solo_plan, &a, &[])?;
    let took = publish_and_time(
        &publisher2,
        solo,
        &envoy,
        CLAIMS_V1BETA2,
        404,
        "apiserver-a",
    )
    .await?;
    eprintln!(
        "(e) after restart, publish -> peer-only GVR goes local (404 from apiserver-a): {took:?}"
    );
    // Envoy routes with the new configuration; the cluster it no longer names lingers.
    let routed_local = Instant::now();
    assert!(
        envoy.admin("/clusters").await?.contains(&peer_cluster),
        "{peer_cluster} lingers"
    );
    // The server shows it lingering (with the other clusters of that peer set), and for how
    // long it will (the node's route timeout).
    let linger = LINGER + LONGER_REQUESTS;
    wait_until(
        "the server counts the peer cluster lingering",
        Duration::from_secs(2),
        || metrics2.lingering_clusters() > 0,
    )
    .await?;
    let streams = metrics2.envoy_streams();
    assert_eq!(
        streams
            .iter()
            .map(|s| s.cluster_linger_seconds)
            .collect::<Vec<_>>(),
        [linger.as_secs_f64()],
        "{streams:?}"
    );
    wait_until(
        "the peer cluster is removed",
        Duration::from_secs(20),
        || metrics2.responses(CDS) >= 1,
    )
    .await?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while envoy.admin("/clusters").await?.contains(&peer_cluster) {
        if Instant::now() > deadline {
            bail!("{peer_cluster} is still in Envoy's clusters");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Its time starts when Envoy acknowledges the configuration, about when it first routes
    // with it; it lasts longer by as much as this Envoy's requests may take longer (its node
    // says so).
    let lingered = routed_local.elapsed();
    eprintln!("(e) {peer_cluster} was removed {lingered:?} after Envoy routed without it");
    assert!(
        lingered + Duration::from_millis(500) >= linger,
        "{peer_cluster} went after {lingered:?}, before the linger ({linger:?})"
    );
    assert_eq!((metrics2.responses(ECDS), metrics2.responses(CDS)), (1, 1));
    assert_eq!(metrics2.nacks(ECDS) + metrics2.nacks(CDS), 0);
    wait_until(
        "the server counts no cluster lingering",
        Duration::from_secs(5),
        || metrics2.lingering_clusters() == 0,
    )
    .await?;
    assert_eq!(metrics2.clusters_removed_early(), 0, "it lingered its time");
    assert_eq!(get(&envoy, DEPLOYMENTS).await?, (200, "apiserver-a".into()));

    server2.stop().await?;
    drop(publisher);
    Ok(())
}

/// What an Envoy's bootstrap says its filter reads.
#[derive(Debug, Clone, Copy)]
enum Advertises {
    /// What the bootstrap writes: this release's filter.
    ThisFilter,
    /// No node metadata: a bootstrap of the release before filters advertised a dialect.
    Nothing,
    /// Only a schema newer than this control plane writes (a filter more than a release
    /// ahead).
    LaterSchema,
}

/// Envoy on the live bootstrap, its node metadata as `advertises` says, its own admin socket
/// in `dir`, the ADS stream on `xds`, and a local-only fallback after a short wait.
async fn envoy_advertising(
    advertises: Advertises,
    node_id: &str,
    dir: &std::path::Path,
    xds: &LocalChannel,
    local: &SimApiserver,
) -> Result<Envoy> {
    let channels = LocalChannels::unix(dir)?;
    let listen = Address::parse(&format!("127.0.0.1:{}", free_port()?))?;
    let filter_code = filter_code()?;
    let mut bootstrap = Bootstrap {
        listen: &listen,
        admin: channels.admin(),
        config_source: ConfigSource::Ads { xds },
        node_id,
        request_timeout: DEFAULT_REQUEST_TIMEOUT,
        serving: None,
        sds_dir: None,
        peer: None,
        fallback: Some(FallbackInputs {
            wait: Duration::from_secs(2),
            filter_code: &filter_code,
            local: &local.address,
            upstream_sds: None,
            local_apiserver: &local.id,
            acknowledged: None,
        }),
        goaway: None,
    }
    .build()?;
    let node = bootstrap
        .node
        .as_mut()
        .context("the bootstrap has a node")?;
    match advertises {
        Advertises::ThisFilter => {}
        Advertises::Nothing => node.metadata = None,
        Advertises::LaterSchema => {
            node.metadata = Some(node_metadata(&FilterDialect {
                schemas: [SCHEMA_VERSION + 1].into(),
                features: Default::default(),
            }))
        }
    }
    Envoy::spawn(&skewgate_tests::bootstrap::write(&bootstrap)?, listen).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_filter_configuration_goes_only_to_an_envoy_whose_filter_reads_it() -> Result<()> {
    init_logs();
    let a = SimApiserver::start("apiserver-a", "k8s-1.30").await?;
    let b = SimApiserver::start("apiserver-b", "k8s-1.33").await?;
    let snapshot = snapshot(&plan(&a, &[&b])?, &a, &[&b])?;
    let (_publisher, snapshots) = watch::channel(Some(snapshot));
    let metrics = Arc::new(XdsMetrics::new());
    let sockets = tempfile::tempdir()?;
    let channels = LocalChannels::unix(sockets.path())?;
    let xds = channels.xds();
    let LocalChannel::Unix(xds_socket) = xds else {
        bail!("the default is a Unix socket");
    };
    let server = XdsServer::start(xds_socket, snapshots, metrics.clone()).await?;
    let dirs = [
        tempfile::tempdir()?,
        tempfile::tempdir()?,
        tempfile::tempdir()?,
    ];
    let current = envoy_advertising(
        Advertises::ThisFilter,
        "envoy-current",
        dirs[0].path(),
        xds,
        &a,
    )
    .await?;
    let previous = envoy_advertising(
        Advertises::Nothing,
        "envoy-previous",
        dirs[1].path(),
        xds,
        &a,
    )
    .await?;
    let later = envoy_advertising(
        Advertises::LaterSchema,
        "envoy-later",
        dirs[2].path(),
        xds,
        &a,
    )
    .await?;

    // This release's filter, and one that advertises nothing (the previous release), are
    // configured as usual: the peer-only resource goes to the peer.
    for envoy in [&current, &previous] {
        wait_routed(envoy, CLAIMS_V1BETA2, 200, "apiserver-b").await?;
        assert_eq!(get(envoy, DEPLOYMENTS).await?, (200, "apiserver-a".into()));
    }

    // The filter that reads only a later schema is sent its clusters, never a filter
    // configuration: its ECDS wait expires and it serves its bootstrap's local-only fallback
    // (the peer-only resource: 503, never the local 404), with no NACK.
    wait_routed(&later, DEPLOYMENTS, 200, "apiserver-a").await?;
    assert_eq!(
        later
            .stat("extension_config_discovery.http_filter.skewgate.init_fetch_timeout")
            .await?,
        1,
        "{}",
        later.log()
    );
    assert_eq!(
        later
            .stat("wasmcustom.skewgate_fallback_configuration")
            .await?,
        1
    );
    assert_eq!(get(&later, CLAIMS_V1BETA2).await?.0, 503);
    assert!(
        later
            .admin("/clusters")
            .await?
            .contains("skewgate-local-identity"),
        "the clusters were sent"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let filters = metrics.envoy_streams();
    let by_node = |node: &str| {
        filters
            .iter()
            .find(|f| f.node == node)
            .with_context(|| format!("no stream of {node}: {filters:?}"))
    };
    eprintln!(
        "streams: {filters:#?}\nresponses: CDS {}, ECDS {}; NACKs: CDS {}, ECDS {}; readyz notes: {:?}",
        metrics.responses(CDS),
        metrics.responses(ECDS),
        metrics.nacks(CDS),
        metrics.nacks(ECDS),
        metrics.readiness_notes()
    );
    assert_eq!(
        metrics.responses(ECDS),
        2,
        "one filter configuration each for current and previous"
    );
    assert_eq!(metrics.responses(CDS), 3, "clusters for all three");
    assert_eq!(metrics.nacks(CDS) + metrics.nacks(ECDS), 0);
    assert_eq!(
        (metrics.incompatible_streams(), metrics.incompatible_total()),
        (1, 1)
    );
    let later_stream = by_node("envoy-later")?;
    assert!(later_stream.withheld);
    assert_eq!(later_stream.schemas, [SCHEMA_VERSION + 1]);
    assert!(
        later_stream.delivery.starts_with("withheld: "),
        "{later_stream:?}"
    );
    let notes = metrics.readiness_notes();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].contains("envoy-later"), "{notes:?}");
    // The previous release reads this schema but not the failover fields: it is sent the
    // configuration without them (local first with no failover, as that release routed).
    for (node, advertised, delivery) in [
        ("envoy-current", "advertised", "as rendered"),
        ("envoy-previous", "nothing", "without failover"),
    ] {
        let stream = by_node(node)?;
        assert_eq!(
            (
                stream.advertised.as_str(),
                stream.delivery.as_str(),
                stream.withheld
            ),
            (advertised, delivery, false)
        );
    }
    // Still serving, still nothing sent.
    assert_eq!(get(&later, DEPLOYMENTS).await?, (200, "apiserver-a".into()));
    assert_eq!(metrics.responses(ECDS), 2);

    server.stop().await?;
    Ok(())
}
