//! API retention in the live mode (the harness: `skewgate_tests::live`): a real etcd, simulated
//! apiservers that keep identity Leases in it, the real `skewgate-control run` binary as a
//! child process, and real Envoy 1.40 on the bootstrap `skewgate-control bootstrap` prints,
//! loading the release `skewgate_filter.wasm`. What an apiserver served never becomes a silent
//! 404: a dead peer's API is retained (Stale, 503) until it returns or the window passes, a
//! retained peer that is back serves at once, before its discovery is read, and the local
//! apiserver restarting on a newer version, while a peer still serves what the old one served,
//! never answers a request for it with a 404.
//!
//! The scenarios run one at a time (the machine is small). Set `SKEWGATE_TEST_LOGS=1` to see
//! the simulators' logs; the control plane's log is printed when an assertion fails.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use skewgate_tests::live::*;
use skewgate_tests::{client, eventually, header, kubectl, Envoy, Etcd, SimApiserver};

// ---------------------------------------------------------------------------------------------
// Scenarios.

/// `(group, version) -> freshness` of an aggregated `/apis` body (`None`: Current).
fn freshness_of(apis: &str, group: &str, version: &str) -> Option<Option<String>> {
    let v: serde_json::Value = serde_json::from_str(apis).ok()?;
    v["items"]
        .as_array()?
        .iter()
        .filter(|g| g["metadata"]["name"] == group)
        .flat_map(|g| g["versions"].as_array().cloned().unwrap_or_default())
        .find(|v| v["version"] == version)
        .map(|v| v["freshness"].as_str().map(str::to_string))
}

/// Wait until merged discovery through `envoy` marks `resource.k8s.io/v1beta2` `freshness`.
async fn until_v1beta2_is(envoy: &Envoy, control: &Control, freshness: &str) -> Result<()> {
    eventually(
        &format!("merged discovery marks resource.k8s.io/v1beta2 {freshness}"),
        Duration::from_secs(10),
        || async {
            let (_, body) = apis(envoy).await?;
            Ok((freshness_of(&body, "resource.k8s.io", "v1beta2")
                == Some(Some(freshness.to_string())))
            .then_some(()))
        },
    )
    .await
    .map(|_| ())
    .with_context(|| control.log())
}

/// The only apiserver serving resource.k8s.io/v1beta2 dies past the lease grace (its API
/// retained: 503) and comes back, at another address, serving its resources but not yet its
/// discovery: the moment of a rolling upgrade between its new Lease and the control plane's next
/// read of its discovery. Its resources go to it (its Lease's address) at once, not to a 503;
/// discovery keeps them Stale until it is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retained_peer_back_serves_what_it_alone_served_before_its_discovery_is_read(
) -> Result<()> {
    let _serial = SERIAL.lock().await;
    let etcd = Etcd::start().await?;
    let dir = tempfile::tempdir()?;
    let a = SimApiserver::start_with(shared("apiserver-a", "k8s-1.30", &etcd)).await?;
    let mut b = SimApiserver::start_with(shared("apiserver-b", "k8s-1.33", &etcd)).await?;
    let mut control = Control::new(&a, dir.path(), &["--api-retention=300s"])?;
    let envoy = start_routed_to_b(&mut control).await?;
    let b_lease = b.lease_name();

    b.stop().await?;
    until_retained(&control, &b_lease).await?;
    assert_eq!(get(&envoy, CLAIMS).await?.0, 503, "retained: 503");

    // Back at another address (its new Lease says where; at its last one, the departed route
    // would serve it before any Lease is seen), its discovery answering 503 for longer than this
    // test runs.
    let mut opts = b.options().context("b's options")?.clone();
    opts.listen = "127.0.0.1:0".into();
    opts.extra_args
        .push("--discovery-unavailable-for=120s".to_string());
    b = SimApiserver::start_with(opts).await?;
    let took = routed(
        &envoy,
        &control,
        CLAIMS,
        (200, "apiserver-b"),
        Duration::from_secs(20),
    )
    .await?;
    eprintln!("b back, its discovery unreadable: its own resource routed to it after {took:?}");
    let skew = control.skew().await?;
    assert!(
        skew["pending_peers"]
            .as_array()
            .is_some_and(|p| p.iter().any(|id| id == b_lease.as_str())),
        "its discovery is still to be read: {skew}"
    );
    assert!(
        skew["retained"].as_array().is_none_or(Vec::is_empty),
        "nothing answered 503 as retained: {skew}"
    );
    let (_, body) = apis(&envoy).await?;
    assert_eq!(
        freshness_of(&body, "resource.k8s.io", "v1beta2"),
        Some(Some("Stale".to_string())),
        "listed, Stale until its discovery is read"
    );
    // What the local apiserver serves stays local; what nobody serves is still its 404.
    assert_eq!(get(&envoy, DEPLOYMENTS).await?, (200, "apiserver-a".into()));
    drop(b);
    Ok(())
}

/// The only apiserver serving resource.k8s.io/v1beta2 stops renewing its Lease past the grace
/// while it keeps serving: it departed, and its API is retained (listed Stale). Its resources
/// still go to its last address, so while it is ready it serves them (never a 503 then). It
/// stops: the retained 503 with Retry-After. It comes back at the same address with no Lease at
/// all, not ready at first: the retained 503 until its `/readyz` passes, then served by it,
/// without waiting for a Lease to become a route (in a rolling upgrade the Lease and readiness
/// come about together, and the Lease-to-route time was the last window of avoidable 503s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_departed_apiserver_serves_what_it_retained_whenever_it_answers_at_its_last_address(
) -> Result<()> {
    let _serial = SERIAL.lock().await;
    let etcd = Etcd::start().await?;
    let dir = tempfile::tempdir()?;
    let a = SimApiserver::start_with(shared("apiserver-a", "k8s-1.30", &etcd)).await?;
    let mut b = SimApiserver::start_with(shared("apiserver-b", "k8s-1.33", &etcd)).await?;
    let mut control = Control::new(&a, dir.path(), &["--api-retention=300s"])?;
    let envoy = start_routed_to_b(&mut control).await?;
    let b_lease = b.lease_name();

    b.toggle_lease_renewal()?;
    until_retained(&control, &b_lease).await?;
    until_v1beta2_is(&envoy, &control, "Stale").await?;
    let skew = control.skew().await?;
    let b_address = b.options().context("b's options")?.listen.clone();
    assert_eq!(
        skew["retained"][0]["sent_to"],
        b_address.as_str(),
        "its last address: {skew}"
    );
    // Departed, yet answering at its last address: served by it.
    for _ in 0..5 {
        assert_eq!(
            get(&envoy, CLAIMS).await?,
            (200, "apiserver-b".to_string()),
            "{}",
            control.log()
        );
    }
    assert_eq!(get(&envoy, DEPLOYMENTS).await?, (200, "apiserver-a".into()));

    // Gone: the retained 503, with Retry-After, never the local 404.
    b.stop().await?;
    let resp = client().get(url(&envoy, CLAIMS)).send().await?;
    assert_eq!(resp.status(), 503);
    assert!(!header(&resp, "retry-after").is_empty(), "Retry-After");
    let body = resp.text().await?;
    assert!(
        body.contains("ServiceUnavailable")
            && body.contains("no live apiserver serves resource.k8s.io/v1beta2"),
        "{body}"
    );

    // Envoy's readiness check (every 250 ms) sees it gone.
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Back at the same address, with no Lease, listening but not ready (its `/readyz` 500) for
    // a while: nothing goes to it meanwhile (the retained 503), and once it is ready it serves,
    // without any Lease.
    let mut opts = b.options().context("b's options")?.clone();
    opts.lease = false;
    opts.extra_args.push("--not-ready-for=10s".to_string());
    b = SimApiserver::start_with(opts).await?;
    let started = Instant::now();
    for _ in 0..3 {
        let resp = client().get(url(&envoy, CLAIMS)).send().await?;
        assert_eq!(
            (resp.status().as_u16(), header(&resp, "x-sim-apiserver")),
            (503, String::new()),
            "listening but not ready: nothing goes to it"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "asked while it was not ready"
    );
    let took = routed(
        &envoy,
        &control,
        CLAIMS,
        (200, "apiserver-b"),
        Duration::from_secs(20),
    )
    .await?;
    eprintln!(
        "b back at its last address without a Lease, ready 10 s after it started: served by it after {took:?}"
    );
    let skew = control.skew().await?;
    assert_eq!(
        skew["retained"][0]["id"],
        b_lease.as_str(),
        "still departed (no Lease): {skew}"
    );
    drop(b);
    Ok(())
}

/// The only apiserver serving resource.k8s.io/v1beta2 crashes: its API is retained (Stale in
/// merged discovery, 503 with Retry-After, never the local 404), across a restart of the control
/// plane (state directory), until it comes back; then it crashes for good and the retention
/// passes: the local 404 is the truth and the group-version is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_peers_api_is_retained_until_it_returns_or_the_window_passes() -> Result<()> {
    const RETENTION: Duration = Duration::from_secs(20);
    let _serial = SERIAL.lock().await;
    let etcd = Etcd::start().await?;
    let dir = tempfile::tempdir()?;
    let a = SimApiserver::start_with(shared("apiserver-a", "k8s-1.30", &etcd)).await?;
    let mut b = SimApiserver::start_with(shared("apiserver-b", "k8s-1.33", &etcd)).await?;
    let state = dir.path().join("state");
    let mut control = Control::new(
        &a,
        dir.path(),
        &[
            &format!("--api-retention={}s", RETENTION.as_secs()),
            &format!("--state-dir={}", state.display()),
        ],
    )?;
    let envoy = start_routed_to_b(&mut control).await?;
    let kubeconfig = envoy.kubeconfig()?;

    // b crashes. From then on every answer for its resource is 503: first Envoy's (b refuses
    // connections), then, once the lease grace has passed, the filter's (retained).
    b.stop().await?;
    let statuses = std::sync::Mutex::new(std::collections::BTreeMap::<u16, u32>::new());
    let (_, took) = eventually(
        "b's API is retained and marked Stale",
        GRACE + Duration::from_secs(15),
        || async {
            let resp = client().get(url(&envoy, CLAIMS)).send().await?;
            if let Ok(mut s) = statuses.lock() {
                *s.entry(resp.status().as_u16()).or_default() += 1;
            }
            let (_, body) = apis(&envoy).await?;
            let stale = freshness_of(&body, "resource.k8s.io", "v1beta2")
                == Some(Some("Stale".to_string()));
            Ok(stale.then_some(()))
        },
    )
    .await
    .with_context(|| control.log())?;
    let statuses = statuses.into_inner().unwrap_or_default();
    assert_eq!(
        statuses.keys().copied().collect::<Vec<_>>(),
        vec![503],
        "only 503s while b is gone: {statuses:?}"
    );
    eprintln!("the only 1.33 apiserver crashed: its API marked Stale after {took:?} (grace {GRACE:?}), answers {statuses:?}");
    let resp = client().get(url(&envoy, CLAIMS)).send().await?;
    assert_eq!(resp.status(), 503);
    assert!(!header(&resp, "retry-after").is_empty(), "Retry-After");
    let body = resp.text().await?;
    assert!(
        body.contains("ServiceUnavailable") && body.contains("resource.k8s.io/v1beta2"),
        "{body}"
    );
    // Its OpenAPI v3 document too: 503, never the local apiserver's 404; and the local
    // `/openapi/v3` no longer lists it (no live peer serves it).
    let resp = client()
        .get(url(&envoy, "/openapi/v3/apis/resource.k8s.io/v1beta2"))
        .send()
        .await?;
    assert_eq!(resp.status(), 503);
    assert!(!header(&resp, "retry-after").is_empty(), "Retry-After");
    let root = json_at(&url(&envoy, "/openapi/v3")).await?;
    assert!(
        root["paths"].get("apis/resource.k8s.io/v1beta2").is_none(),
        "{root}"
    );
    // Real kubectl: the get is 503 (never NotFound), and discovery of everything else works.
    let (ok, _, err) = kubectl(
        &kubeconfig,
        &[
            "get",
            "resourceclaims.v1beta2.resource.k8s.io",
            "-n",
            "default",
        ],
    )
    .await?;
    assert!(!ok && !err.contains("NotFound"), "{err}");
    let (ok, out, err) = kubectl(&kubeconfig, &["api-resources"]).await?;
    assert!(ok, "{err}");
    assert!(out.contains("deployments") && out.contains("pods"), "{out}");
    let skew = control.skew().await?;
    assert_eq!(skew["retained"][0]["id"], b.lease_name().as_str(), "{skew}");
    assert!(
        control
            .metric(&format!(
                "skewgate_control_retained_resources{{apiserver=\"{}\"}}",
                b.lease_name()
            ))
            .await?
            > 0.0
    );

    // The control plane restarts while b is still gone: the retention comes back from the state
    // directory (Envoy keeps its configuration meanwhile; the new one must still retain).
    control.terminate().await?;
    control.start().await?;
    eventually("ready again", Duration::from_secs(30), || async {
        Ok(control.ready().await.then_some(()))
    })
    .await?;
    let skew = control.skew().await?;
    assert_eq!(
        skew["retained"][0]["id"],
        b.lease_name().as_str(),
        "after a restart: {skew}"
    );
    assert!(
        skew["retained"][0]["sent_to"].is_null(),
        "a Lease's address is not kept across a restart: {skew}"
    );
    let (_, body) = apis(&envoy).await?;
    assert_eq!(
        freshness_of(&body, "resource.k8s.io", "v1beta2"),
        Some(Some("Stale".to_string()))
    );
    assert_eq!(get(&envoy, CLAIMS).await?.0, 503);

    // b comes back: served by it again at once (its Lease is live again: before its discovery
    // is read), and nothing is Stale once its discovery is read.
    b.restart(None).await?;
    let took = routed(
        &envoy,
        &control,
        CLAIMS,
        (200, "apiserver-b"),
        Duration::from_secs(20),
    )
    .await?;
    until_v1beta2_is(&envoy, &control, "Current").await?;
    eprintln!("b back: routed to it {took:?} after its restart");

    // b crashes for good: retained until the window passes, then the local 404 is the truth.
    let gone = Instant::now();
    b.stop().await?;
    routed(
        &envoy,
        &control,
        CLAIMS,
        (404, "apiserver-a"),
        GRACE + RETENTION + Duration::from_secs(15),
    )
    .await?;
    let took = gone.elapsed();
    assert!(
        took >= RETENTION,
        "not before the retention passed: {took:?}"
    );
    let (_, body) = apis(&envoy).await?;
    assert_eq!(
        freshness_of(&body, "resource.k8s.io", "v1beta2"),
        None,
        "gone from discovery"
    );
    eprintln!(
        "b gone for good: the local 404 after {took:?} (grace {GRACE:?} + retention {RETENTION:?})"
    );
    drop(a);
    Ok(())
}

/// The local apiserver restarts on a newer version under load while a peer still serves what
/// the old version served: no request for it ever gets a 404 (the node answers from the peer,
/// or 503 while it is in doubt), and merged discovery follows the new local view within about
/// a second of the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_apiserver_restarting_on_a_new_version_never_yields_a_404() -> Result<()> {
    const FLOWSCHEMAS_V1BETA3: &str = "/apis/flowcontrol.apiserver.k8s.io/v1beta3/flowschemas";
    let _serial = SERIAL.lock().await;
    let etcd = Etcd::start().await?;
    let dir = tempfile::tempdir()?;
    let mut a = SimApiserver::start_with(shared("apiserver-a", "k8s-1.30", &etcd)).await?;
    let b = SimApiserver::start_with(shared("apiserver-b", "k8s-1.30", &etcd)).await?;
    let mut control = Control::new(&a, dir.path(), &[])?;
    control.start().await?;
    let envoy = live_envoy(&control, None, None).await?;
    routed(
        &envoy,
        &control,
        FLOWSCHEMAS_V1BETA3,
        (200, "apiserver-a"),
        Duration::from_secs(30),
    )
    .await?;

    // Load: flowcontrol v1beta3 (1.30 only: served by a before its upgrade, by b after) and
    // apps/v1 (both), as fast as one client goes, until told to stop.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (stop, base) = (stop.clone(), envoy.url());
        tokio::spawn(async move {
            let mut seen: std::collections::BTreeMap<(String, u16, String), u32> =
                Default::default();
            while !stop.load(Ordering::Relaxed) {
                for path in [FLOWSCHEMAS_V1BETA3, DEPLOYMENTS] {
                    if let Ok(resp) = client().get(format!("{base}{path}")).send().await {
                        let key = (
                            path.to_string(),
                            resp.status().as_u16(),
                            header(&resp, "x-sim-apiserver"),
                        );
                        *seen.entry(key).or_default() += 1;
                    }
                }
            }
            seen
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let upgrade = Instant::now();
    a.restart(Some("k8s-1.33")).await?;
    let restarted = upgrade.elapsed();
    // Merged discovery follows the new local view: v1beta2 (1.33) appears.
    let (_, followed) = eventually(
        "merged discovery lists the new local version",
        Duration::from_secs(10),
        || async {
            let (_, body) = apis(&envoy).await?;
            Ok(versions_of(&body, "resource.k8s.io")
                .contains(&"v1beta2".to_string())
                .then_some(()))
        },
    )
    .await
    .with_context(|| control.log())?;
    routed(
        &envoy,
        &control,
        FLOWSCHEMAS_V1BETA3,
        (200, "apiserver-b"),
        Duration::from_secs(10),
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let seen = load.await?;
    eprintln!(
        "local apiserver upgraded 1.30 -> 1.33 under load (restart took {restarted:?}): merged \
         discovery followed {followed:?} after it was back; answers: {seen:?}"
    );
    let not_found: Vec<_> = seen
        .iter()
        .filter(|((_, code, _), _)| *code == 404)
        .collect();
    assert!(
        not_found.is_empty(),
        "404s: {not_found:?}\n{}",
        control.log()
    );
    assert!(
        followed < Duration::from_millis(2500),
        "discovery followed the restart only after {followed:?}"
    );
    drop(b);
    Ok(())
}
