//! The live mode end to end (the harness: `skewgate_tests::live`): a real etcd, simulated
//! apiservers that keep identity Leases in it, the real `skewgate-control run` binary as a
//! child process, and real Envoy 1.40 on the bootstrap `skewgate-control bootstrap` prints,
//! loading the release `skewgate_filter.wasm`. Nothing in this process computes routing: every
//! decision is the control plane's.
//!
//! The scenarios run one at a time (the machine is small): leases and upgrades with routing
//! following them, and clients told to go elsewhere while the local apiserver stays down.
//! Themes of their own, on the same harness: `retention.rs` (a gone apiserver's APIs never a
//! silent 404), `fallback.rs` (Envoy without its control plane), `hostile_peers.rs` (hostile,
//! excluded and forged peers), `openapi.rs` (OpenAPI v3 of a kind only a peer serves), `tls.rs`
//! (TLS everywhere), `lease_to_route.rs` (the Lease-to-route benchmark, ignored),
//! `bounded_state.rs`, `local_access.rs`, `skew_page.rs`, `metrics.rs`.
//!
//! Set `SKEWGATE_TEST_LOGS=1` to see the simulators' logs; the control plane's log is printed
//! when an assertion fails.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use skewgate_tests::live::*;
use skewgate_tests::{eventually, header, kubectl, Etcd, SimApiserver, SimOptions};

// ---------------------------------------------------------------------------------------------
// Scenarios.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_join_leave_and_upgrade_and_routing_follows() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let etcd = Etcd::start().await?;
    let dir = tempfile::tempdir()?;
    let mut a = SimApiserver::start_with(shared("apiserver-a", "k8s-1.30", &etcd)).await?;
    // Without API retention (0 keeps the behaviour from before it): a dead peer's APIs leave
    // with it. Retention has its own scenarios (retention.rs).
    let mut control = Control::new(&a, dir.path(), &["--api-retention=0s"])?;

    // Envoy first: until the control plane's first complete sync it serves nothing, its port
    // refuses connections.
    let envoy = live_envoy(&control, None, None).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let refused =
        tokio::net::TcpStream::connect((envoy.address.host.as_str(), envoy.address.port)).await;
    assert_eq!(
        refused.as_ref().err().map(|e| e.kind()),
        Some(std::io::ErrorKind::ConnectionRefused),
        "Envoy must not accept before the first sync"
    );
    assert_eq!(envoy.stat("listener_manager.workers_started").await?, 0);

    let started = Instant::now();
    control.start().await?;
    let opened = routed(
        &envoy,
        &control,
        DEPLOYMENTS,
        (200, "apiserver-a"),
        Duration::from_secs(30),
    )
    .await?;
    assert!(control.ready().await, "/readyz after the first sync");
    let first_sync = control
        .metric("skewgate_control_first_sync_seconds")
        .await?;
    eprintln!(
        "Envoy started first: port refused for 2 s; control plane started -> first request served: {:?} \
         (its first complete sync took {first_sync} s; the rest is Envoy's ADS reconnect backoff; polling took {opened:?})",
        started.elapsed()
    );
    // Nothing else serves resource.k8s.io/v1beta2 yet: the local apiserver's 404.
    assert_eq!(get(&envoy, CLAIMS).await?, (404, "apiserver-a".into()));

    // A 1.33 peer joins: routed to, and discovery is the union.
    let launched = Instant::now();
    let mut b = SimApiserver::start_with(SimOptions {
        delete_lease_on_exit: true,
        ..shared("apiserver-b", "k8s-1.33", &etcd)
    })
    .await?;
    // The simulator prints its address only once its lease exists.
    let lease_created = Instant::now();
    let took = routed(
        &envoy,
        &control,
        CLAIMS,
        (200, "apiserver-b"),
        Duration::from_secs(20),
    )
    .await?;
    eprintln!(
        "peer joined: lease created -> first request routed to it: {took:?} \
         (process start -> routed: {:?})",
        (lease_created - launched) + took
    );
    let (_, body) = apis(&envoy).await?;
    assert!(
        versions_of(&body, "resource.k8s.io").contains(&"v1beta2".to_string()),
        "merged discovery lists the peer's v1beta2"
    );
    let kubeconfig = envoy.kubeconfig()?;
    let (ok, out, err) = kubectl(
        &kubeconfig,
        &["api-resources", "--api-group=resource.k8s.io"],
    )
    .await?;
    assert!(ok, "{err}");
    assert!(out.contains("resource.k8s.io/v1beta2"), "{out}");

    // A 1.30 peer joins, then is upgraded to 1.33 (restarted with a new holder identity): it
    // is re-discovered and serves v1beta2 next to b.
    let mut c = SimApiserver::start_with(shared("apiserver-c", "k8s-1.30", &etcd)).await?;
    let (b_lease, c_lease) = (b.lease_name(), c.lease_name());
    eventually("c is fetched", Duration::from_secs(20), || async {
        let skew = control.skew().await?;
        let seen = skew["apiservers"].as_array().is_some_and(|l| {
            l.iter()
                .any(|x| x["id"] == c_lease.as_str() && x["discovery_attempts"].as_u64() > Some(0))
        });
        Ok(seen.then_some(()))
    })
    .await
    .with_context(|| control.log())?;
    assert_eq!(
        served_by(&control, ("resource.k8s.io", "v1beta2"), "resourceclaims").await?,
        vec![b_lease.clone()]
    );
    let upgrade = Instant::now();
    c.restart(Some("k8s-1.33")).await?;
    let restarted = upgrade.elapsed();
    let (_, took) = eventually(
        "c is re-discovered as 1.33",
        Duration::from_secs(20),
        || async {
            let by = served_by(&control, ("resource.k8s.io", "v1beta2"), "resourceclaims").await?;
            Ok((by == vec![b_lease.clone(), c_lease.clone()]).then_some(()))
        },
    )
    .await
    .with_context(|| control.log())?;
    eprintln!(
        "peer upgraded 1.30 -> 1.33: restart took {restarted:?}, re-discovered {took:?} later"
    );

    // b's lease is deleted (a clean shutdown that removes it): b drops out at once and c,
    // which now serves v1beta2 too, takes its requests.
    let stop = Instant::now();
    b.terminate().await?;
    let took = routed(
        &envoy,
        &control,
        CLAIMS,
        (200, "apiserver-c"),
        Duration::from_secs(GRACE.as_secs() + 10),
    )
    .await?;
    eprintln!(
        "peer's lease deleted: its requests go to the other 1.33 peer after {:?}",
        stop.elapsed().max(took)
    );
    let metrics = control.get("/metrics").await?.1;
    assert!(
        !metrics.contains(&format!("apiserver=\"{b_lease}\"")),
        "the departed peer's series are forgotten"
    );

    // c stops renewing its lease while it keeps serving: after the grace it is dead. Its
    // resources go back to the local 404, and discovery shrinks back to the local view.
    let stopped_renewing = Instant::now();
    c.toggle_lease_renewal()?;
    routed(
        &envoy,
        &control,
        CLAIMS,
        (404, "apiserver-a"),
        GRACE + Duration::from_secs(10),
    )
    .await?;
    let routed_back = stopped_renewing.elapsed();
    let (_, _) = eventually("discovery shrinks", Duration::from_secs(10), || async {
        let (_, body) = apis(&envoy).await?;
        Ok((!versions_of(&body, "resource.k8s.io").contains(&"v1beta2".to_string())).then_some(()))
    })
    .await?;
    let shrunk = stopped_renewing.elapsed();
    let (ok, out, err) = kubectl(
        &kubeconfig,
        &["api-resources", "--api-group=resource.k8s.io"],
    )
    .await?;
    assert!(ok, "{err}");
    assert!(!out.contains("resource.k8s.io/v1beta2"), "{out}");
    eprintln!(
        "peer stopped renewing (grace {GRACE:?}): its resources back to the local 404 after {routed_back:?}, \
         merged discovery back to the local view after {shrunk:?}; kubectl api-resources agrees"
    );
    // Within the grace plus the last renewal interval and the push.
    assert!(
        shrunk < GRACE + RENEW + Duration::from_secs(2),
        "{shrunk:?}"
    );

    // c renews again: it is a live peer again, and v1beta2 goes back to it.
    let resumed = Instant::now();
    c.toggle_lease_renewal()?;
    routed(
        &envoy,
        &control,
        CLAIMS,
        (200, "apiserver-c"),
        Duration::from_secs(15),
    )
    .await?;
    eprintln!(
        "peer renews again: routed to again after {:?}",
        resumed.elapsed()
    );

    // The local apiserver is upgraded to 1.33 (a restart with a new holder identity): it is
    // re-discovered, and v1beta2 is served locally instead of by the peer.
    let upgrade = Instant::now();
    a.restart(Some("k8s-1.33")).await?;
    let back = upgrade.elapsed();
    let took = routed(
        &envoy,
        &control,
        CLAIMS,
        (200, "apiserver-a"),
        Duration::from_secs(30),
    )
    .await?;
    eprintln!(
        "local apiserver upgraded 1.30 -> 1.33: back after {back:?}; v1beta2 routed locally instead of to the peer {took:?} later"
    );
    let a_lease = a.lease_name();
    assert_eq!(
        served_by(&control, ("resource.k8s.io", "v1beta2"), "resourceclaims").await?,
        Vec::<String>::new(),
        "served by both apiservers now"
    );
    let skew = control.skew().await?;
    assert_eq!(skew["matrix"]["local"], a_lease.as_str());
    let (_, body) = apis(&envoy).await?;
    assert!(versions_of(&body, "resource.k8s.io").contains(&"v1beta2".to_string()));
    assert_eq!(
        control
            .metric("skewgate_control_compose_errors_total")
            .await?,
        0.0
    );
    let nacks = control
        .metric("skewgate_xds_nacks_total{type_url=\"type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig\"}")
        .await?;
    assert_eq!(nacks, 0.0, "{}", envoy.log());
    let (status, took) = control.terminate().await?;
    assert!(status.success(), "exit status {status}: {}", control.log());
    eprintln!("SIGTERM: exited 0 in {took:?}");
    Ok(())
}

/// The local apiserver stays down past `--local-down-goaway-after`: requests are still served
/// (by the peer, failover), and every response tells its client to reconnect (HTTP/1.1
/// `Connection: close`; HTTP/2 gets a GOAWAY the same way), so clients pinned to this node move
/// through the load balancer; once the local apiserver answers again, connections stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_are_told_to_go_elsewhere_when_the_local_apiserver_stays_down() -> Result<()> {
    const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/default/deployments";
    let _serial = SERIAL.lock().await;
    let etcd = Etcd::start().await?;
    let dir = tempfile::tempdir()?;
    let mut a = SimApiserver::start_with(shared("apiserver-a", "k8s-1.30", &etcd)).await?;
    let _b = SimApiserver::start_with(shared("apiserver-b", "k8s-1.33", &etcd)).await?;
    let mut control = Control::new(&a, dir.path(), &["--local-down-goaway-after=2s"])?;
    let envoy = start_routed_to_b(&mut control).await?;
    // HTTP/1.1, a fresh connection each time: the header is per response.
    let h1 = || {
        reqwest::Client::builder()
            .http1_only()
            .timeout(Duration::from_secs(10))
            .build()
    };
    let get = |client: reqwest::Client, path: &'static str| {
        let target = url(&envoy, path);
        async move {
            let resp = client.get(target).send().await?;
            Ok::<_, anyhow::Error>((
                resp.status().as_u16(),
                header(&resp, "x-sim-apiserver"),
                header(&resp, "connection"),
            ))
        }
    };
    assert_eq!(
        get(h1()?, DEPLOYMENTS).await?,
        (200, "apiserver-a".to_string(), String::new())
    );

    a.stop().await?;
    // Served by the peer at once; told to go elsewhere once it stayed down 2 s.
    let (_, took) = eventually(
        "every response says Connection: close",
        Duration::from_secs(20),
        || async {
            let (status, by, connection) = get(h1()?, DEPLOYMENTS).await?;
            assert_eq!((status, by.as_str()), (200, "apiserver-b"), "failover");
            Ok((connection == "close").then_some(()))
        },
    )
    .await
    .with_context(|| control.log())?;
    eprintln!("every connection drained {took:?} after the local apiserver stopped");
    for _ in 0..5 {
        assert_eq!(get(h1()?, DEPLOYMENTS).await?.2, "close");
    }
    let scrape = reqwest::get(format!("http://{}/metrics", control.health))
        .await?
        .text()
        .await?;
    assert!(
        scrape.contains("skewgate_local_down_draining 1"),
        "{scrape}"
    );

    // Back: connections stay again.
    a.restart(None).await?;
    eventually("connections stay", Duration::from_secs(20), || async {
        let (status, by, connection) = get(h1()?, DEPLOYMENTS).await?;
        Ok((status == 200 && by == "apiserver-a" && connection.is_empty()).then_some(()))
    })
    .await
    .with_context(|| control.log())?;
    Ok(())
}
