//! Identity leases end to end: a real etcd shared by simulated apiservers that keep their
//! identity Leases like kube-apiserver, and the control plane's kube-rs peer watcher
//! (`skewgate_control::peers`) connected to one of them through a kubeconfig.
//!
//! Set `SKEWGATE_TEST_LOGS=1` to see the simulators' logs.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use skewgate_control::peers::{
    self, AddressPolicy, AddressSource, Exclusion, LeaseField, LocalSelector, MappingEntry,
    PeerConfig, PeerMetrics, PeerSet, PeerWatcher, RejectReason,
};
use skewgate_tests::{client, watch_until, Etcd, PeerAdvertise, SimApiserver, SimOptions};

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases";

/// Renewal interval of the simulated apiservers (kube: 10 s).
const RENEW: Duration = Duration::from_millis(500);

fn config(grace: Duration) -> PeerConfig {
    PeerConfig {
        grace,
        policy: AddressPolicy::new(vec![peers::parse_cidr("127.0.0.0/8").unwrap()], []),
        local: LocalSelector::Hostname("apiserver-a".into()),
        ..Default::default()
    }
}

/// The peer watcher of the control plane beside `local`.
async fn watch_peers(
    local: &SimApiserver,
    dir: &tempfile::TempDir,
    config: PeerConfig,
) -> Result<PeerWatcher> {
    let kubeconfig = local.kubeconfig_in(dir.path())?;
    let client = peers::client_from_kubeconfig(Some(&kubeconfig)).await?;
    Ok(PeerWatcher::spawn(
        client,
        config,
        Arc::new(PeerMetrics::default()),
    ))
}

/// Wait until a snapshot satisfies `pred`; returns it and how long it took.
async fn wait_for(
    w: &PeerWatcher,
    what: &str,
    timeout: Duration,
    pred: impl Fn(&PeerSet) -> bool,
) -> Result<(PeerSet, Duration)> {
    let start = Instant::now();
    let mut rx = w.updates.clone();
    loop {
        {
            let set = rx.borrow_and_update();
            if pred(&set) {
                return Ok((set.clone(), start.elapsed()));
            }
        }
        let left = timeout.saturating_sub(start.elapsed());
        match tokio::time::timeout(left, rx.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => bail!("{what}: the peer watcher stopped"),
            Err(_) => bail!(
                "{what}: not within {timeout:?}; last snapshot: {:#?}",
                *rx.borrow()
            ),
        }
    }
}

/// Where a simulated apiserver listens.
fn socket(sim: &SimApiserver) -> SocketAddr {
    let ip: IpAddr = sim.address.host.parse().expect("an IP literal");
    SocketAddr::new(ip, sim.address.port)
}

fn shared(id: &str, fixture: &str, etcd: &Etcd) -> SimOptions {
    SimOptions::shared(id, fixture, etcd, RENEW)
}

#[tokio::test]
async fn a_peer_that_joins_appears_and_one_whose_lease_is_deleted_is_gone() -> Result<()> {
    let etcd = Etcd::start().await?;
    let dir = tempfile::tempdir()?;
    let a = SimApiserver::start_with(shared("apiserver-a", "k8s-1.30", &etcd)).await?;
    // A grace much longer than the test: only lease deletion can remove a peer here.
    let w = watch_peers(&a, &dir, config(Duration::from_secs(60))).await?;
    let (set, _) = wait_for(&w, "first sync", Duration::from_secs(20), |s| s.synced).await?;
    let local = set.local.context("the local lease is known")?;
    assert_eq!(local.id, a.lease_name());
    assert!(local.live);
    assert!(
        set.peers.is_empty(),
        "the local apiserver is never its own peer"
    );

    let joined_at = Instant::now();
    let b = SimApiserver::start_with(SimOptions {
        delete_lease_on_exit: true,
        ..shared("apiserver-b", "k8s-1.33", &etcd)
    })
    .await?;
    let mut c = SimApiserver::start_with(shared("apiserver-c", "k8s-1.33", &etcd)).await?;
    let (set, _) = wait_for(&w, "b and c join", Duration::from_secs(10), |s| {
        s.peers.len() == 2
    })
    .await?;
    println!(
        "two peers joined: {:?} from starting them",
        joined_at.elapsed()
    );
    for sim in [&b, &c] {
        let p = set.peer(&sim.lease_name()).context("peer by lease name")?;
        assert_eq!(p.address, socket(sim));
        assert_eq!(p.address_source, AddressSource::Annotation);
        assert_eq!(p.hostname.as_deref(), Some(sim.id.as_str()));
        assert!(p
            .holder_identity
            .starts_with(&format!("{}_", sim.lease_name())));
    }
    let ids: Vec<&str> = set.peers.iter().map(|p| p.id.as_str()).collect();
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(ids, sorted, "deterministic order");

    // c stops cleanly: kube leaves its lease for the garbage collector, so within the grace
    // it is still a peer.
    c.terminate().await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(w.current().peer(&c.lease_name()).is_some());
    // Its lease is deleted (through any apiserver: they share etcd): gone at once.
    let deleted_at = Instant::now();
    let resp = client()
        .delete(format!("{}{LEASES}/{}", b.url(), c.lease_name()))
        .send()
        .await?;
    assert_eq!(resp.status(), 200);
    let c_lease = c.lease_name();
    let (set, took) = wait_for(&w, "c's lease deleted", Duration::from_secs(10), |s| {
        s.peer(&c_lease).is_none()
    })
    .await?;
    println!(
        "deleted lease -> peer gone: {:?} after the DELETE was sent (event seen {took:?} after it returned)",
        deleted_at.elapsed()
    );
    assert!(deleted_at.elapsed() < Duration::from_secs(10));
    assert!(set.excluded(&c_lease).is_none(), "no lease, no trace");
    assert!(set.peer(&b.lease_name()).is_some());

    // b deletes its own lease on exit (--delete-lease-on-exit).
    let mut b = b;
    b.terminate().await?;
    let b_lease = b.lease_name();
    wait_for(
        &w,
        "b's lease deleted on exit",
        Duration::from_secs(10),
        |s| s.peer(&b_lease).is_none(),
    )
    .await?;
    assert_eq!(w.metrics.watch_errors_total(), 0);
    Ok(())
}

#[tokio::test]
async fn a_peer_that_stops_renewing_drops_out_after_the_grace() -> Result<()> {
    let etcd = Etcd::start().await?;
    let dir = tempfile::tempdir()?;
    let grace = Duration::from_secs(3);
    let a = SimApiserver::start_with(shared("apiserver-a", "k8s-1.30", &etcd)).await?;
    let b = SimApiserver::start_with(shared("apiserver-b", "k8s-1.33", &etcd)).await?;
    let w = watch_peers(&a, &dir, config(grace)).await?;
    let b_lease = b.lease_name();
    let (set, _) = wait_for(&w, "b joins", Duration::from_secs(20), |s| {
        s.peer(&b_lease).is_some()
    })
    .await?;
    let generation = set.peer(&b_lease).map(|p| p.generation);

    // b keeps serving but no longer renews: no lease event at all from now on, so only the
    // watcher's own timer can notice.
    b.toggle_lease_renewal()?;
    let stopped = Instant::now();
    let (set, took) = wait_for(&w, "b expires", grace + Duration::from_secs(5), |s| {
        s.peer(&b_lease).is_none()
    })
    .await?;
    println!("stopped renewing -> peer gone: {took:?} (grace {grace:?}, renewal every {RENEW:?})");
    assert!(
        stopped.elapsed() >= grace - RENEW - Duration::from_millis(200),
        "not before the grace: {:?}",
        stopped.elapsed()
    );
    assert_eq!(
        set.excluded(&b_lease).map(|e| e.reason),
        Some(Exclusion::Expired)
    );
    let resp = client().get(format!("{}/version", b.url())).send().await?;
    assert_eq!(resp.status(), 200, "b itself is still up");

    // Renewing again: back, same generation (same holder: not a restart).
    b.toggle_lease_renewal()?;
    let (set, _) = wait_for(&w, "b renews again", Duration::from_secs(10), |s| {
        s.peer(&b_lease).is_some()
    })
    .await?;
    assert_eq!(set.peer(&b_lease).map(|p| p.generation), generation);
    assert_eq!(w.metrics.restarts_total(), 0);
    Ok(())
}

#[tokio::test]
async fn a_restart_is_a_new_generation_and_an_upgrade_keeps_its_address() -> Result<()> {
    let etcd = Etcd::start().await?;
    let dir = tempfile::tempdir()?;
    let a = SimApiserver::start_with(shared("apiserver-a", "k8s-1.30", &etcd)).await?;
    let mut b = SimApiserver::start_with(shared("apiserver-b", "k8s-1.30", &etcd)).await?;
    let w = watch_peers(&a, &dir, config(Duration::from_secs(30))).await?;
    let b_lease = b.lease_name();
    let (set, _) = wait_for(&w, "b joins", Duration::from_secs(20), |s| {
        s.peer(&b_lease).is_some()
    })
    .await?;
    let before = set.peer(&b_lease).cloned().context("b")?;

    // Upgrade b: stop it, start 1.33 at the same address.
    let restarted_at = Instant::now();
    b.restart(Some("k8s-1.33")).await?;
    let (set, _) = wait_for(&w, "b's new holder", Duration::from_secs(20), |s| {
        s.peer(&b_lease)
            .is_some_and(|p| p.holder_identity != before.holder_identity)
    })
    .await?;
    println!(
        "restart -> new generation seen: {:?}",
        restarted_at.elapsed()
    );
    let after = set.peer(&b_lease).context("b after restart")?;
    assert_ne!(after.generation, before.generation);
    assert_eq!(after.address, before.address);
    assert_eq!(socket(&b), before.address);
    assert_eq!(w.metrics.restarts_total(), 1);
    let version: Value = client()
        .get(format!("{}/version", b.url()))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(version["gitVersion"], "v1.33.0");

    // The apiserver the watcher talks to restarts too: the watch recovers, and the local
    // lease shows the restart.
    let mut a = a;
    let local_before = set.local.clone().context("local")?;
    a.restart(None).await?;
    let (set, took) = wait_for(&w, "local restart seen", Duration::from_secs(30), |s| {
        s.local
            .as_ref()
            .is_some_and(|l| l.generation != local_before.generation)
    })
    .await?;
    println!("watched apiserver restarted -> watch recovered: {took:?}");
    assert!(set.peer(&b_lease).is_some());
    Ok(())
}

/// A Lease written by anyone with write access to kube-system (no apiserver behind it),
/// renewed "now" (the renewTime of a live lease is borrowed).
async fn forge_lease(
    base: &str,
    name: &str,
    hostname: &str,
    annotation: Option<&str>,
    renew_time: &str,
) -> Result<()> {
    let mut lease = json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "namespace": "kube-system",
            "labels": {
                "apiserver.kubernetes.io/identity": "kube-apiserver",
                "kubernetes.io/hostname": hostname
            }
        },
        "spec": {
            "holderIdentity": format!("{name}_forged"),
            "leaseDurationSeconds": 3600,
            "renewTime": renew_time
        }
    });
    if let Some(a) = annotation {
        lease["metadata"]["annotations"] = json!({ "kubernetes.io/peer-advertise-address": a });
    }
    let resp = client()
        .post(format!("{base}{LEASES}"))
        .json(&lease)
        .send()
        .await?;
    if resp.status() != 201 {
        bail!("creating lease {name}: {}", resp.text().await?);
    }
    Ok(())
}

#[tokio::test]
async fn addresses_outside_the_cidrs_or_not_ip_port_never_become_peers() -> Result<()> {
    let etcd = Etcd::start().await?;
    let dir = tempfile::tempdir()?;
    let a = SimApiserver::start_with(shared("apiserver-a", "k8s-1.30", &etcd)).await?;
    let b = SimApiserver::start_with(shared("apiserver-b", "k8s-1.33", &etcd)).await?;
    // A real apiserver advertising an address outside 127.0.0.0/8.
    let c = SimApiserver::start_with(SimOptions {
        peer_advertise_address: PeerAdvertise::Value("10.0.0.1:6443".into()),
        ..shared("apiserver-c", "k8s-1.33", &etcd)
    })
    .await?;
    // One without the annotation (feature gate off), reached through the operator's mapping.
    let d = SimApiserver::start_with(SimOptions {
        peer_advertise_address: PeerAdvertise::Omit,
        ..shared("apiserver-d", "k8s-1.33", &etcd)
    })
    .await?;
    // Forged leases with hostile annotations.
    let renew_time: Value = client()
        .get(format!("{}{LEASES}/{}", a.url(), a.lease_name()))
        .send()
        .await?
        .json()
        .await?;
    let renew_time = renew_time["spec"]["renewTime"]
        .as_str()
        .context("renewTime")?
        .to_string();
    let forged = [
        (
            "apiserver-forged-host",
            Some("evil.com:443"),
            RejectReason::Hostname,
        ),
        (
            "apiserver-forged-port",
            Some("127.0.0.1:99999"),
            RejectReason::Invalid,
        ),
        (
            "apiserver-forged-noport",
            Some("[::1]"),
            RejectReason::Invalid,
        ),
        ("apiserver-forged-empty", Some(""), RejectReason::Empty),
        (
            "apiserver-forged-any",
            Some("0.0.0.0:6443"),
            RejectReason::NotUnicast,
        ),
        ("apiserver-forged-none", None, RejectReason::Missing),
    ];
    for (name, annotation, _) in &forged {
        forge_lease(&b.url(), name, name, *annotation, &renew_time).await?;
    }

    let mut cfg = config(Duration::from_secs(60));
    cfg.policy = AddressPolicy::new(
        vec![peers::parse_cidr("127.0.0.0/8").map_err(anyhow::Error::msg)?],
        [MappingEntry::ByHostname("apiserver-d".into(), socket(&d))],
    );
    let w = watch_peers(&a, &dir, cfg).await?;
    let (b_lease, d_lease, c_lease) = (b.lease_name(), d.lease_name(), c.lease_name());
    wait_for(&w, "b and d", Duration::from_secs(20), |s| {
        s.peer(&b_lease).is_some() && s.peer(&d_lease).is_some()
    })
    .await?;
    // Watch every snapshot for a while (c renews many times meanwhile): only b and d ever.
    let mut rx = w.updates.clone();
    let until = Instant::now() + Duration::from_secs(3);
    let mut seen = 0;
    while Instant::now() < until {
        {
            let set = rx.borrow_and_update();
            let ids: Vec<&str> = set.peers.iter().map(|p| p.id.as_str()).collect();
            let mut want = vec![b_lease.as_str(), d_lease.as_str()];
            want.sort();
            assert_eq!(ids, want);
            seen += 1;
        }
        let _ = tokio::time::timeout(Duration::from_millis(500), rx.changed()).await;
    }
    let set = w.current();
    println!("{seen} snapshots checked; excluded: {:?}", set.excluded);
    let d_peer = set.peer(&d_lease).context("d")?;
    assert_eq!(d_peer.address_source, AddressSource::MappingByHostname);
    assert_eq!(d_peer.address, socket(&d));
    assert_eq!(
        set.excluded(&c_lease).map(|e| e.reason),
        Some(Exclusion::Address(RejectReason::OutsideCidrs))
    );
    for (name, _, reason) in &forged {
        assert_eq!(
            set.excluded(name).map(|e| e.reason),
            Some(Exclusion::Address(*reason)),
            "{name}"
        );
    }
    // Each refusal is counted once, not on every renewal.
    let m = &w.metrics;
    assert_eq!(m.rejected_total(RejectReason::OutsideCidrs), 1);
    assert_eq!(m.rejected_total(RejectReason::Hostname), 1);
    assert_eq!(m.rejected_total(RejectReason::Invalid), 2);
    assert_eq!(m.rejected_total(RejectReason::Empty), 1);
    assert_eq!(m.rejected_total(RejectReason::NotUnicast), 1);
    assert_eq!(m.rejected_total(RejectReason::Missing), 1);
    let text = skewgate_control::metrics::encode(&m.families());
    assert!(text.contains("skewgate_peer_address_rejected_total{reason=\"outside_cidrs\"} 1"));

    // No CIDR configured: every annotation is refused, the mapping still works.
    let mut cfg = config(Duration::from_secs(60));
    cfg.policy = AddressPolicy::new(
        vec![],
        [MappingEntry::ByHostname("apiserver-d".into(), socket(&d))],
    );
    let strict = watch_peers(&a, &dir, cfg).await?;
    let (set, _) = wait_for(&strict, "strict sync", Duration::from_secs(20), |s| {
        s.synced && s.peer(&d_lease).is_some()
    })
    .await?;
    assert_eq!(set.peers.len(), 1);
    assert_eq!(
        set.excluded(&b_lease).map(|e| e.reason),
        Some(Exclusion::Address(RejectReason::NoCidrs))
    );
    Ok(())
}

/// Every snapshot for `for_at_least` satisfies `pred` (the watcher publishes on every change,
/// renewals included, so this sees each renewal).
async fn holds_for(
    w: &PeerWatcher,
    what: &str,
    for_at_least: Duration,
    pred: impl Fn(&PeerSet) -> bool,
) -> Result<usize> {
    let mut rx = w.updates.clone();
    let until = Instant::now() + for_at_least;
    let mut seen = 0;
    while Instant::now() < until {
        {
            let set = rx.borrow_and_update();
            if !pred(&set) {
                bail!("{what}: not so after {seen} snapshots: {:#?}", *set);
            }
            seen += 1;
        }
        let left = until.saturating_duration_since(Instant::now());
        let _ = tokio::time::timeout(left.min(Duration::from_millis(500)), rx.changed()).await;
    }
    Ok(seen)
}

/// A valid time for kube-apiserver (Go), out of range for k8s-openapi's `Lease` (jiff).
const YEAR_9999: &str = "9999-12-31T23:59:59Z";

#[tokio::test]
async fn a_lease_whose_renew_time_is_out_of_range_is_ignored_not_the_watch() -> Result<()> {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::{Api, ListParams};

    let etcd = Etcd::start().await?;
    let dir = tempfile::tempdir()?;
    let a = SimApiserver::start_with(shared("apiserver-a", "k8s-1.30", &etcd)).await?;
    let b = SimApiserver::start_with(shared("apiserver-b", "k8s-1.33", &etcd)).await?;
    // Anyone who may write Leases in kube-system, before the control plane starts...
    let listed = "apiserver-forged-9999-listed";
    forge_lease(&b.url(), listed, listed, Some("127.0.0.9:6443"), YEAR_9999).await?;
    // What the watch used to do with it: k8s-openapi's Lease cannot list the identity leases
    // at all, so no peer was seen.
    let client = peers::client_from_kubeconfig(Some(&a.kubeconfig_in(dir.path())?)).await?;
    let typed: Api<Lease> = Api::namespaced(client, "kube-system");
    let err = typed
        .list(&ListParams::default().labels(&peers::label_selector()))
        .await
        .expect_err("k8s-openapi's Lease cannot hold year 9999");
    println!("a typed list fails: {err}");

    let grace = Duration::from_secs(3);
    let w = watch_peers(&a, &dir, config(grace)).await?;
    let b_lease = b.lease_name();
    let (set, _) = wait_for(
        &w,
        "b seen despite the bad lease",
        Duration::from_secs(20),
        |s| s.synced && s.peer(&b_lease).is_some(),
    )
    .await?;
    assert_eq!(
        set.excluded(listed).map(|e| e.reason),
        Some(Exclusion::Malformed(LeaseField::RenewTime))
    );
    assert_eq!(
        set.local.as_ref().map(|l| l.id.clone()),
        Some(a.lease_name())
    );

    // ...and one written while it watches (a watch event, not the list).
    let watched = "apiserver-forged-9999-watched";
    forge_lease(
        &b.url(),
        watched,
        watched,
        Some("127.0.0.9:6443"),
        YEAR_9999,
    )
    .await?;
    wait_for(
        &w,
        "the second bad lease excluded",
        Duration::from_secs(10),
        |s| {
            s.excluded(watched).map(|e| e.reason)
                == Some(Exclusion::Malformed(LeaseField::RenewTime))
        },
    )
    .await?;
    // Renewals keep being seen: with a 3 s grace b would drop out if the watch had stopped.
    let seen = holds_for(&w, "b stays live", grace * 2 + RENEW, |s| {
        s.peer(&b_lease).is_some()
            && s.peers.len() == 1
            && s.local.as_ref().is_some_and(|l| l.live)
            && !s.stale
    })
    .await?;
    println!(
        "{seen} snapshots with b live; excluded: {:?}",
        w.current().excluded
    );

    // Each bad lease is counted once (not on every evaluation), and the watch never failed.
    let m = &w.metrics;
    assert_eq!(m.malformed_total(LeaseField::RenewTime), 2);
    assert_eq!(m.watch_errors_total(), 0);
    assert!(skewgate_control::metrics::encode(&m.families())
        .contains("skewgate_peer_leases_malformed_total{field=\"renew_time\"} 2\n"));
    Ok(())
}

#[tokio::test]
async fn liveness_follows_observed_renewals_not_the_peers_clocks() -> Result<()> {
    let etcd = Etcd::start().await?;
    let dir = tempfile::tempdir()?;
    let five_minutes = Duration::from_secs(300);
    let a = SimApiserver::start_with(shared("apiserver-a", "k8s-1.30", &etcd)).await?;
    let skewed = |id: &str, offset: &str| SimOptions {
        extra_args: vec![format!("--lease-clock-offset={offset}")],
        ..shared(id, "k8s-1.33", &etcd)
    };
    let behind = SimApiserver::start_with(skewed("apiserver-behind", "-5m")).await?;
    let ahead = SimApiserver::start_with(skewed("apiserver-ahead", "5m")).await?;
    let grace = Duration::from_secs(3);
    let w = watch_peers(&a, &dir, config(grace)).await?;
    let (behind_lease, ahead_lease) = (behind.lease_name(), ahead.lease_name());

    // The lagging peer's renewTime looks 5 minutes old at first sight; its next renewal
    // confirms it.
    let (set, took) = wait_for(&w, "both skewed peers live", Duration::from_secs(20), |s| {
        s.peer(&behind_lease).is_some() && s.peer(&ahead_lease).is_some()
    })
    .await?;
    println!("skewed peers live {took:?} after the watcher started");
    let now = std::time::SystemTime::now();
    let lag = now
        .duration_since(set.peer(&behind_lease).context("behind")?.renew_time)
        .unwrap_or_default();
    assert!(lag >= five_minutes - grace, "its clock lags: {lag:?}");
    let lead = set
        .peer(&ahead_lease)
        .context("ahead")?
        .renew_time
        .duration_since(now)
        .unwrap_or_default();
    assert!(lead >= five_minutes - grace, "its clock leads: {lead:?}");

    // Both stay live while they renew, for well over the grace.
    holds_for(&w, "skewed peers stay live", grace * 2 + RENEW, |s| {
        s.peer(&behind_lease).is_some() && s.peer(&ahead_lease).is_some()
    })
    .await?;

    // The one whose renewTime is 5 minutes in the future stops renewing: dead after the grace,
    // not 5 minutes later.
    ahead.toggle_lease_renewal()?;
    let stopped = Instant::now();
    let (set, took) = wait_for(&w, "ahead expires", grace + Duration::from_secs(5), |s| {
        s.peer(&ahead_lease).is_none()
    })
    .await?;
    println!("future renewTime, renewals stopped -> peer gone: {took:?} (grace {grace:?})");
    assert!(stopped.elapsed() >= grace - RENEW - Duration::from_millis(200));
    assert_eq!(
        set.excluded(&ahead_lease).map(|e| e.reason),
        Some(Exclusion::Expired)
    );
    assert!(
        set.peer(&behind_lease).is_some(),
        "the lagging one renews on"
    );
    assert_eq!(w.metrics.watch_errors_total(), 0);
    Ok(())
}

// ---- the simulated apiservers' shared state, without the control plane ----

fn claim(version: &str, name: &str) -> Value {
    json!({
        "apiVersion": format!("resource.k8s.io/{version}"),
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {}
    })
}

#[tokio::test]
async fn objects_written_through_one_apiserver_are_served_by_the_others() -> Result<()> {
    let etcd = Etcd::start().await?;
    let a = SimApiserver::start_with(shared("apiserver-a", "k8s-1.30", &etcd)).await?;
    let b = SimApiserver::start_with(shared("apiserver-b", "k8s-1.33", &etcd)).await?;
    let http = client();
    let cms = "/api/v1/namespaces/default/configmaps";

    let created: Value = http
        .post(format!("{}{cms}", a.url()))
        .json(&json!({"metadata": {"name": "shared"}, "data": {"k": "1"}}))
        .send()
        .await?
        .json()
        .await?;
    let got: Value = http
        .get(format!("{}{cms}/shared", b.url()))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(got["metadata"]["uid"], created["metadata"]["uid"]);
    assert_eq!(
        got["metadata"]["resourceVersion"],
        created["metadata"]["resourceVersion"]
    );
    assert_eq!(
        got["metadata"]["annotations"]["skewgate.test/served-by"],
        "apiserver-a"
    );

    // Optimistic concurrency across apiservers: a stale resourceVersion is a 409.
    let mut update = got.clone();
    update["data"]["k"] = json!("2");
    let resp = http
        .put(format!("{}{cms}/shared", b.url()))
        .json(&update)
        .send()
        .await?;
    assert_eq!(resp.status(), 200);
    let resp = http
        .put(format!("{}{cms}/shared", a.url()))
        .json(&update)
        .send()
        .await?;
    assert_eq!(resp.status(), 409, "stale resourceVersion");

    // Keyed by group and resource: a claim created at v1beta2 through the 1.33 apiserver is
    // served at v1alpha2 by the 1.30 apiserver.
    let resp = http
        .post(format!(
            "{}/apis/resource.k8s.io/v1beta2/namespaces/default/resourceclaims",
            b.url()
        ))
        .json(&claim("v1beta2", "gpu"))
        .send()
        .await?;
    assert_eq!(resp.status(), 201);
    let old: Value = http
        .get(format!(
            "{}/apis/resource.k8s.io/v1alpha2/namespaces/default/resourceclaims/gpu",
            a.url()
        ))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(old["apiVersion"], "resource.k8s.io/v1alpha2");
    assert_eq!(old["metadata"]["name"], "gpu");

    // Both see every identity lease.
    for sim in [&a, &b] {
        let list: Value = http
            .get(format!(
                "{}{LEASES}?labelSelector=apiserver.kubernetes.io%2Fidentity%3Dkube-apiserver",
                sim.url()
            ))
            .send()
            .await?
            .json()
            .await?;
        let mut names: Vec<&str> = list["items"]
            .as_array()
            .context("items")?
            .iter()
            .filter_map(|l| l["metadata"]["name"].as_str())
            .collect();
        names.sort();
        let mut want = [a.lease_name(), b.lease_name()];
        want.sort();
        assert_eq!(names, want);
    }
    Ok(())
}

#[tokio::test]
async fn watches_follow_other_apiservers_writes_with_bookmarks_and_410_after_compaction(
) -> Result<()> {
    let etcd = Etcd::start().await?;
    let a = SimApiserver::start_with(SimOptions {
        bookmark_interval: Some(Duration::from_millis(500)),
        ..shared("apiserver-a", "k8s-1.30", &etcd)
    })
    .await?;
    let b = SimApiserver::start_with(shared("apiserver-b", "k8s-1.33", &etcd)).await?;
    let http = reqwest::Client::new();
    let cms = "/api/v1/namespaces/default/configmaps";
    let list: Value = http
        .get(format!("{}{cms}", a.url()))
        .send()
        .await?
        .json()
        .await?;
    let rv: u64 = list["metadata"]["resourceVersion"]
        .as_str()
        .context("list rv")?
        .parse()?;

    // What kube-rs's watcher sends after its list.
    let watch = http
        .get(format!(
            "{}{cms}?watch=true&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=20",
            a.url()
        ))
        .send()
        .await?;
    assert_eq!(watch.status(), 200);
    let resp = http
        .post(format!("{}{cms}", b.url()))
        .json(&json!({"metadata": {"name": "via-b"}}))
        .send()
        .await?;
    assert_eq!(resp.status(), 201);
    let (added, _) = watch_until(watch, Duration::from_secs(10), |v| v["type"] == "ADDED").await?;
    assert_eq!(added["object"]["metadata"]["name"], "via-b");
    let added_rv: u64 = added["object"]["metadata"]["resourceVersion"]
        .as_str()
        .context("rv")?
        .parse()?;
    assert!(added_rv > rv);

    // Bookmarks carry a resourceVersion at least as new as what was delivered (leases keep
    // etcd's revision moving).
    let watch = http
        .get(format!(
            "{}{cms}?watch=true&resourceVersion={added_rv}&allowWatchBookmarks=true&timeoutSeconds=20",
            a.url()
        ))
        .send()
        .await?;
    let (bookmark, _) = watch_until(watch, Duration::from_secs(10), |v| {
        v["type"] == "BOOKMARK"
            && v["object"]["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|r| r.parse::<u64>().ok())
                .is_some_and(|r| r > added_rv)
    })
    .await?;
    assert_eq!(bookmark["object"]["kind"], "ConfigMap");

    // etcd compacts: a watch from before the compaction is told 410 Expired.
    compact(&etcd).await?;
    let watch = http
        .get(format!(
            "{}{cms}?watch=true&resourceVersion={rv}&timeoutSeconds=20",
            a.url()
        ))
        .send()
        .await?;
    let (error, _) = watch_until(watch, Duration::from_secs(10), |v| v["type"] == "ERROR").await?;
    assert_eq!(error["object"]["code"], 410);
    assert_eq!(error["object"]["reason"], "Expired");
    Ok(())
}

/// Compact etcd up to its current revision (what kube-apiserver does every 5 minutes).
async fn compact(etcd: &Etcd) -> Result<i64> {
    let mut client = etcd_client::Client::connect([etcd.url.as_str()], None).await?;
    let current = client
        .get("/", Some(etcd_client::GetOptions::new().with_count_only()))
        .await?
        .header()
        .map(|h| h.revision())
        .context("revision")?;
    client.compact(current, None).await?;
    Ok(current)
}

#[tokio::test]
async fn kube_rs_watchers_list_or_stream_and_relist_after_410() -> Result<()> {
    use futures_util::StreamExt;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, PostParams};
    use kube::runtime::watcher::{self, Event};

    let etcd = Etcd::start().await?;
    // Its lease renewals keep etcd's revision moving past what the watchers have seen.
    let a = SimApiserver::start_with(shared("apiserver-a", "k8s-1.30", &etcd)).await?;
    let dir = tempfile::tempdir()?;
    let client = peers::client_from_kubeconfig(Some(&a.kubeconfig_in(dir.path())?)).await?;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("one".into());
    cms.create(&PostParams::default(), &cm).await?;

    let strategies = [
        (
            "list then watch (kube-rs default)",
            watcher::Config::default(),
        ),
        (
            "streaming list",
            watcher::Config::default().streaming_lists(),
        ),
    ];
    for (label, config) in strategies {
        // Each watch call ends after 1 s, so the watcher watches again from its version.
        let mut stream = watcher::watcher(cms.clone(), config.timeout(1)).boxed();
        let mut inits = 0;
        let mut saw_410 = false;
        let mut names = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while inits < 2 {
            let left = deadline.saturating_duration_since(Instant::now());
            let next = tokio::time::timeout(left, stream.next())
                .await
                .with_context(|| format!("{label}: inits {inits}, 410 seen: {saw_410}"))?
                .context("watcher ended")?;
            match next {
                Ok(Event::Init) => names.clear(),
                Ok(Event::InitApply(o)) => names.push(o.metadata.name.unwrap_or_default()),
                Ok(Event::InitDone) => {
                    assert_eq!(names, ["one"], "{label}");
                    inits += 1;
                    if inits == 1 {
                        tokio::time::sleep(RENEW * 2).await;
                        compact(&etcd).await?;
                    }
                }
                Ok(other) => bail!("{label}: unexpected {other:?}"),
                Err(watcher::Error::WatchError(status)) if status.code == 410 => saw_410 = true,
                Err(e) => bail!("{label}: {e}"),
            }
        }
        assert!(saw_410, "{label}: the re-list followed a 410");
        println!("{label}: listed, got 410 Expired after compaction, re-listed");
    }
    Ok(())
}

#[test]
fn identity_lease_names_are_kubes() {
    // sha256(\x00\x0bapiserver-a \x00\x0ekube-apiserver), first 16 bytes, base32, lower case:
    // computed independently of this code.
    assert_eq!(
        skewgate_tests::identity_lease_name("apiserver-a"),
        "apiserver-g24gd6l4nm7gx56pradztv5ogy"
    );
}

#[tokio::test]
async fn a_second_lease_with_the_local_hostname_and_a_flood_of_leases_change_nothing() -> Result<()>
{
    use futures_util::StreamExt;
    const MAX_PEERS: usize = 4;
    let etcd = Etcd::start().await?;
    let dir = tempfile::tempdir()?;
    let a = SimApiserver::start_with(shared("apiserver-a", "k8s-1.30", &etcd)).await?;
    let b = SimApiserver::start_with(shared("apiserver-b", "k8s-1.33", &etcd)).await?;
    let w = watch_peers(
        &a,
        &dir,
        PeerConfig {
            max_peers: MAX_PEERS,
            ..config(Duration::from_secs(120))
        },
    )
    .await?;
    let b_lease = b.lease_name();
    let (before, _) = wait_for(&w, "b joins", Duration::from_secs(20), |s| {
        s.peer(&b_lease).is_some() && s.local.is_some()
    })
    .await?;
    assert_eq!(
        before.local.as_ref().map(|l| l.id.clone()),
        Some(a.lease_name())
    );

    // Anyone allowed to write Leases in kube-system claims the local hostname, renewing more
    // recently than the local apiserver, with an address inside the CIDR.
    let renew = || async {
        let lease: Value = client()
            .get(format!("{}{LEASES}/{}", a.url(), a.lease_name()))
            .send()
            .await?
            .json()
            .await?;
        anyhow::Ok(
            lease["spec"]["renewTime"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        )
    };
    let impostor = "apiserver-0-impostor";
    tokio::time::sleep(RENEW * 2).await;
    forge_lease(
        &a.url(),
        impostor,
        "apiserver-a",
        Some("127.0.0.1:1"),
        &renew().await?,
    )
    .await?;
    let (set, _) = wait_for(&w, "the impostor is seen", Duration::from_secs(10), |s| {
        s.excluded(impostor).is_some()
    })
    .await?;
    assert_eq!(
        set.excluded(impostor).map(|e| e.reason),
        Some(Exclusion::DuplicateLocal)
    );
    assert_eq!(w.metrics.duplicate_local_total(), 1);
    let local = a.lease_name();
    let unchanged = |s: &PeerSet| {
        s.local.as_ref().is_some_and(|l| l.id == local && l.live)
            && s.peers.iter().map(|p| &p.id).eq([&b_lease])
            && s.excluded(impostor).map(|e| e.reason) == Some(Exclusion::DuplicateLocal)
    };
    let seen = holds_for(
        &w,
        "the local lease stays a's",
        Duration::from_secs(3),
        unchanged,
    )
    .await?;
    println!("a lease claiming the local hostname: refused, {seen} snapshots unchanged");
    assert_eq!(w.metrics.duplicate_local_total(), 1, "reported once");

    // 1,000 leases pointing into the CIDR: the routed set never grows past the cap, b (known
    // longest) keeps its place, the rest are excluded and counted once each.
    let renew_time = renew().await?;
    let base = a.url();
    let started = Instant::now();
    let results: Vec<Result<()>> = futures_util::stream::iter(0..1000)
        .map(|i| {
            let (base, renew_time) = (base.clone(), renew_time.clone());
            async move {
                let name = format!("apiserver-flood-{i:04}");
                forge_lease(&base, &name, &name, Some("127.0.0.9:6443"), &renew_time).await
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    results.into_iter().collect::<Result<Vec<()>>>()?;
    println!("1,000 leases written in {:?}", started.elapsed());
    let (set, took) = wait_for(&w, "every flood lease seen", Duration::from_secs(60), |s| {
        s.excluded.len() > 1001 - MAX_PEERS
    })
    .await?;
    println!("flood seen in {took:?}");
    assert_eq!(set.peers.len(), MAX_PEERS);
    assert!(set.peer(&b_lease).is_some(), "b keeps its place");
    assert_eq!(
        set.excluded
            .iter()
            .filter(|e| e.reason == Exclusion::OverCap)
            .count(),
        1001 - MAX_PEERS
    );
    assert_eq!(w.metrics.over_cap_total(), (1001 - MAX_PEERS) as u64);
    assert_eq!(
        set.local.as_ref().map(|l| l.id.clone()),
        Some(a.lease_name())
    );
    holds_for(&w, "capped", Duration::from_secs(2), |s| {
        s.peers.len() == MAX_PEERS && s.peer(&b_lease).is_some()
    })
    .await?;
    assert_eq!(
        w.metrics.over_cap_total(),
        (1001 - MAX_PEERS) as u64,
        "reported once"
    );
    Ok(())
}
