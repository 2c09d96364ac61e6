//! Hostile peers in the live mode (the harness: `skewgate_tests::live`): a real etcd, simulated
//! apiservers that keep identity Leases in it, the real `skewgate-control run` binary as a
//! child process, and real Envoy 1.40 on the bootstrap `skewgate-control bootstrap` prints,
//! loading the release `skewgate_filter.wasm`. Peers outside the allowed CIDRs, or answering
//! discovery with garbage or too much of it, change no route; a thousand forged Leases stay
//! under the peer cap, and holder churn under the rate limit.
//!
//! The scenarios run one at a time (the machine is small). Set `SKEWGATE_TEST_LOGS=1` to see
//! the simulators' logs; the control plane's log is printed when an assertion fails.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures_util::StreamExt;
use skewgate_tests::live::*;
use skewgate_tests::{client, eventually, kubectl, Etcd, PeerAdvertise, SimApiserver, SimOptions};

// ---------------------------------------------------------------------------------------------
// Scenarios.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_and_excluded_peers_change_no_route() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let etcd = Etcd::start().await?;
    let dir = tempfile::tempdir()?;
    let a = SimApiserver::start_with(shared("apiserver-a", "k8s-1.30", &etcd)).await?;
    let b = SimApiserver::start_with(shared("apiserver-b", "k8s-1.33", &etcd)).await?;
    // Peers are accepted on 127.0.0.1 only.
    let mut control = Control::new(&a, dir.path(), &["--peer-cidr=127.0.0.1/32"])?;
    let envoy = start_routed_to_b(&mut control).await?;
    let (etag, _) = apis(&envoy).await?;
    let version = control.skew().await?["snapshot_version"].clone();

    // A 1.33 apiserver on 127.0.0.3: reachable, serving everything b serves, with a live
    // lease; but its address is outside the allowed CIDRs.
    let outside = SimApiserver::start_with(SimOptions {
        listen: "127.0.0.3:0".into(),
        ..shared("apiserver-outside", "k8s-1.33", &etcd)
    })
    .await?;
    // Two peers whose advertised address answers discovery with garbage, and with a body far
    // over the size limit.
    let (garbage_addr, _garbage) = hostile_discovery_server(
        b"{\"kind\":\"APIGroupDiscoveryList\",\"items\":[{\"oops\"",
        30,
    )
    .await?;
    let (huge_addr, _huge) = hostile_discovery_server(&[b' '; 65536], 64 << 20).await?;
    let garbage = SimApiserver::start_with(SimOptions {
        peer_advertise_address: PeerAdvertise::Value(garbage_addr.to_string()),
        ..shared("apiserver-garbage", "k8s-1.33", &etcd)
    })
    .await?;
    let huge = SimApiserver::start_with(SimOptions {
        peer_advertise_address: PeerAdvertise::Value(huge_addr.to_string()),
        ..shared("apiserver-huge", "k8s-1.33", &etcd)
    })
    .await?;
    let (outside_lease, garbage_lease, huge_lease) = (
        outside.lease_name(),
        garbage.lease_name(),
        huge.lease_name(),
    );
    eventually(
        "the hostile peers were tried and refused",
        Duration::from_secs(30),
        || async {
            let rejected = control
                .metric("skewgate_peer_address_rejected_total{reason=\"outside_cidrs\"}")
                .await?;
            let garbage_errors = control
                .metric("apiserver_peer_discovery_sync_errors_total{type=\"garbage\"}")
                .await?;
            let too_large = control
                .metric("apiserver_peer_discovery_sync_errors_total{type=\"too_large\"}")
                .await?;
            Ok((rejected >= 1.0 && garbage_errors >= 1.0 && too_large >= 1.0).then_some(()))
        },
    )
    .await
    .with_context(|| control.log())?;
    // Give them a few more rounds of retries.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let skew = control.skew().await?;
    let listed = |key: &str, id: &str| {
        skew[key]
            .as_array()
            .is_some_and(|l| l.iter().any(|x| x["id"] == id))
    };
    assert!(listed("excluded_leases", &outside_lease), "{skew:#}");
    assert!(listed("unrouted_peers", &garbage_lease), "{skew:#}");
    assert!(listed("unrouted_peers", &huge_lease), "{skew:#}");
    // The two live peers whose discovery is unusable are pending: what no known apiserver
    // serves answers 503 until they are known or dead. Nothing else changes for Envoy:
    // merged discovery and every route stay as they were.
    let pending: Vec<&str> = skew["pending_peers"]
        .as_array()
        .map(|l| l.iter().filter_map(|x| x.as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        pending,
        {
            let mut want = vec![garbage_lease.as_str(), huge_lease.as_str()];
            want.sort();
            want
        },
        "{skew:#}"
    );
    assert_ne!(
        skew["snapshot_version"], version,
        "pending peers are in the filter configuration"
    );
    assert_eq!(apis(&envoy).await?.0, etag, "merged discovery unchanged");
    assert_eq!(
        get(&envoy, "/apis/nobody.example.com/v1/widgets").await?.0,
        503,
        "nobody known serves it, and two live peers are not known"
    );
    assert_eq!(
        served_by(&control, ("resource.k8s.io", "v1beta2"), "resourceclaims").await?,
        vec![b.lease_name()]
    );
    // Requests for v1beta2 keep going to b only.
    for _ in 0..20 {
        assert_eq!(get(&envoy, CLAIMS).await?, (200, "apiserver-b".into()));
    }
    let clusters = envoy.admin("/clusters").await?;
    assert!(
        !clusters.contains(&format!(":{}", outside.address.port)),
        "no cluster points at the excluded peer"
    );
    eprintln!(
        "a lease outside the CIDRs, a peer answering garbage and one answering 64 MiB: excluded/unrouted, \
         the garbage ones pending, merged discovery and routes unchanged, v1beta2 still served by b only"
    );

    // A service-backed APIService for resource.k8s.io/v1beta2 makes that group-version
    // shared storage: always local (the kube-rs APIService watcher sees it).
    let kubeconfig = a.kubeconfig_in(dir.path())?;
    let manifest = dir.path().join("apiservice.json");
    std::fs::write(
        &manifest,
        serde_json::json!({
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": "v1beta2.resource.k8s.io"},
            "spec": {
                "group": "resource.k8s.io",
                "version": "v1beta2",
                "groupPriorityMinimum": 1000,
                "versionPriority": 100,
                "service": {"namespace": "kube-system", "name": "dra-extension"}
            }
        })
        .to_string(),
    )?;
    let manifest_arg = manifest.display().to_string();
    let (ok, _, err) = kubectl(&kubeconfig, &["create", "-f", &manifest_arg]).await?;
    assert!(ok, "{err}");
    routed(
        &envoy,
        &control,
        CLAIMS,
        (404, "apiserver-a"),
        Duration::from_secs(15),
    )
    .await?;
    let skew = control.skew().await?;
    assert!(
        skew["shared_storage"]
            .as_array()
            .is_some_and(|l| l.iter().any(|x| x == "resource.k8s.io/v1beta2")),
        "{skew:#}"
    );
    let (ok, _, err) = kubectl(&kubeconfig, &["delete", "-f", &manifest_arg]).await?;
    assert!(ok, "{err}");
    routed(
        &envoy,
        &control,
        CLAIMS,
        (200, "apiserver-b"),
        Duration::from_secs(15),
    )
    .await?;
    eprintln!("a service-backed APIService made resource.k8s.io/v1beta2 local, and deleting it undid that");

    // The same for a CRD serving that group-version (the CRD watcher), and only for its served
    // versions.
    let crd = dir.path().join("crd.json");
    let crd_json = |served: bool| {
        serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.resource.k8s.io"},
            "spec": {
                "group": "resource.k8s.io",
                "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
                "scope": "Namespaced",
                "versions": [
                    {"name": "v1beta2", "served": served, "storage": true,
                     "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}
                ]
            }
        })
        .to_string()
    };
    std::fs::write(&crd, crd_json(false))?;
    let crd_arg = crd.display().to_string();
    let (ok, _, err) = kubectl(&kubeconfig, &["create", "-f", &crd_arg]).await?;
    assert!(ok, "{err}");
    // Not served: nothing changes.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(get(&envoy, CLAIMS).await?, (200, "apiserver-b".into()));
    std::fs::write(&crd, crd_json(true))?;
    let (ok, _, err) = kubectl(&kubeconfig, &["replace", "-f", &crd_arg]).await?;
    assert!(ok, "{err}");
    routed(
        &envoy,
        &control,
        CLAIMS,
        (404, "apiserver-a"),
        Duration::from_secs(15),
    )
    .await?;
    let (ok, _, err) = kubectl(&kubeconfig, &["delete", "-f", &crd_arg]).await?;
    assert!(ok, "{err}");
    routed(
        &envoy,
        &control,
        CLAIMS,
        (200, "apiserver-b"),
        Duration::from_secs(15),
    )
    .await?;
    eprintln!(
        "a CRD serving resource.k8s.io/v1beta2 made it local while served, and not before or after"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_forged_leases_stay_under_the_cap_and_holder_churn_under_the_rate_limit(
) -> Result<()> {
    const MAX_PEERS: usize = 3;
    let _serial = SERIAL.lock().await;
    let etcd = Etcd::start().await?;
    let dir = tempfile::tempdir()?;
    let a = SimApiserver::start_with(shared("apiserver-a", "k8s-1.30", &etcd)).await?;
    let b = SimApiserver::start_with(shared("apiserver-b", "k8s-1.33", &etcd)).await?;
    // Forged leases are never renewed: a grace longer than the test keeps them live.
    let mut control = Control::new(
        &a,
        dir.path(),
        &[
            "--lease-grace=120s",
            "--max-peers=3",
            "--holder-refetch-interval=2s",
        ],
    )?;
    let envoy = start_routed_to_b(&mut control).await?;
    let b_lease = b.lease_name();

    // 1,000 leases inside the peer CIDR, all pointing at b (a real apiserver: a fetch succeeds),
    // renewed "now" (a's renewTime, borrowed).
    let leases = format!("{}{LEASES}", a.url());
    let own: serde_json::Value = client()
        .get(format!("{leases}/{}", a.lease_name()))
        .send()
        .await?
        .json()
        .await?;
    let renew_time = own["spec"]["renewTime"].clone();
    let address = format!("{}:{}", b.address.host, b.address.port);
    let started = Instant::now();
    let results: Vec<Result<()>> = futures_util::stream::iter(0..1000)
        .map(|i| {
            let lease = forged_lease(&format!("apiserver-flood-{i:04}"), &address, &renew_time);
            let leases = leases.clone();
            async move {
                let resp = client().post(&leases).json(&lease).send().await?;
                if resp.status() != 201 {
                    bail!("creating a lease: {}", resp.text().await?);
                }
                Ok(())
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    results.into_iter().collect::<Result<Vec<()>>>()?;
    eprintln!("1,000 forged leases written in {:?}", started.elapsed());
    eventually(
        "every forged lease seen",
        Duration::from_secs(60),
        || async {
            let over = control
                .metric("skewgate_peer_leases_over_cap_total")
                .await?;
            Ok((over >= (1001 - MAX_PEERS) as f64).then_some(()))
        },
    )
    .await
    .with_context(|| control.log())?;
    // Let the control plane settle and fetch what it fetches.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        control.metric("skewgate_peers_live").await?,
        MAX_PEERS as f64
    );
    let fetched = fetches(&control).await?;
    eprintln!("fetched apiservers: {fetched:?}");
    assert!(
        fetched.len() <= MAX_PEERS + 1,
        "only the local apiserver and the capped peers are fetched: {fetched:?}"
    );
    // b, known longest, keeps its place; the flood takes only what is left.
    assert!(fetched.iter().any(|(id, _)| *id == b_lease), "{fetched:?}");
    let clusters = envoy.admin("/clusters").await?;
    let endpoints = clusters
        .lines()
        .filter(|l| l.starts_with("skewgate-peers-") && l.contains("::cx_active::"))
        .count();
    eprintln!("peer cluster endpoints in Envoy: {endpoints}");
    for _ in 0..10 {
        assert_eq!(get(&envoy, CLAIMS).await?.0, 200);
    }

    // One forged peer changes its holder identity every 100 ms for 6 s (60 "restarts"): at most
    // one refetch per 2 s is triggered, the rest coalesced.
    let churner = fetched
        .iter()
        .map(|(id, _)| id.clone())
        .find(|id| id.starts_with("apiserver-flood-"))
        .context("a forged lease within the cap")?;
    let before = fetches(&control)
        .await?
        .into_iter()
        .find(|(id, _)| *id == churner)
        .map_or(0.0, |(_, n)| n);
    let coalesced_before = control
        .metric("skewgate_discovery_holder_refetches_coalesced_total")
        .await?;
    let churn_started = Instant::now();
    let mut changes = 0;
    while churn_started.elapsed() < Duration::from_secs(6) {
        changes += 1;
        let resp = client()
            .patch(format!("{leases}/{churner}"))
            .header("content-type", "application/merge-patch+json")
            .body(
                serde_json::json!({"spec": {"holderIdentity": format!("{churner}_{changes}")}})
                    .to_string(),
            )
            .send()
            .await?;
        if resp.status() != 200 {
            bail!("patching {churner}: {}", resp.text().await?);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The last deferred refetch lands within the interval.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = fetches(&control)
        .await?
        .into_iter()
        .find(|(id, _)| *id == churner)
        .map_or(0.0, |(_, n)| n);
    let coalesced = control
        .metric("skewgate_discovery_holder_refetches_coalesced_total")
        .await?
        - coalesced_before;
    let elapsed = churn_started.elapsed();
    eprintln!(
        "{changes} holder changes of {churner} over {elapsed:?}: {} fetches, {coalesced} triggers coalesced",
        after - before
    );
    // One per 2 s, plus the first at once and the periodic refresh (30 s: none here).
    let limit = (elapsed.as_secs_f64() / 2.0).ceil() + 1.0;
    assert!(
        after - before <= limit,
        "{} fetches for {changes} holder changes in {elapsed:?} (limit {limit})",
        after - before
    );
    assert!(after - before >= 2.0, "the changes were followed");
    assert!(coalesced >= 1.0);
    assert_eq!(
        control.metric("skewgate_peers_live").await?,
        MAX_PEERS as f64
    );
    for _ in 0..5 {
        assert_eq!(get(&envoy, CLAIMS).await?.0, 200);
    }
    Ok(())
}
