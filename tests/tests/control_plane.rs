//! The live mode end to end (the harness: `skewgate_tests::live`): a real etcd, simulated
//! apiservers that keep identity Leases in it, the real `skewgate-control run` binary as a
//! child process, and real Envoy 1.40 on the bootstrap `skewgate-control bootstrap` prints,
//! loading the release `skewgate_filter.wasm`. Nothing in this process computes routing: every
//! decision is the control plane's.
//!
//! The scenarios run one at a time (the machine is small): leases and upgrades, the control
//! plane restarted under traffic, and hostile or excluded peers; and the Lease-to-route
//! benchmark (ignored). Themes of their own: `bounded_state.rs`, `local_access.rs`,
//! `skew_page.rs`, `metrics.rs`.
//!
//! Set `SKEWGATE_TEST_LOGS=1` to see the simulators' logs; the control plane's log is printed
//! when an assertion fails.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures_util::StreamExt;
use skewgate_tests::live::*;
use skewgate_tests::{
    client, envoy_bin, eventually, free_port, header, kubeconfig_tls, kubectl, repo_root,
    wasm_path, Credential, Envoy, Etcd, PeerAdvertise, Probe, SimApiserver, SimOptions, Subject,
    TestPki, TEST_TOKENS,
};
use tokio::process::Command;

// ---------------------------------------------------------------------------------------------
// Scenarios.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_join_leave_and_upgrade_and_routing_follows() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let etcd = Etcd::start().await?;
    let dir = tempfile::tempdir()?;
    let mut a = SimApiserver::start_with(shared("apiserver-a", "k8s-1.30", &etcd)).await?;
    // Without API retention (0 keeps the behaviour from before it): a dead peer's APIs leave
    // with it. Retention has its own scenario below.
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

/// `(group, version) -> freshness` of an aggregated `/apis` body (`None`: Current).
const LEASE_CANDIDATES: &str = "apis/coordination.k8s.io/v1beta1";

/// A LeaseCandidate (coordination.k8s.io/v1beta1: 1.33 serves it, 1.30 does not), with `extra`
/// added to its spec.
fn lease_candidate(extra: &str) -> String {
    format!(
        "apiVersion: coordination.k8s.io/v1beta1\nkind: LeaseCandidate\nmetadata:\n  name: lc1\n  \
         namespace: default\nspec:\n  leaseName: kube-controller-manager\n  binaryVersion: 1.33.0\n  \
         strategy: OldestEmulationVersion\n{extra}"
    )
}

/// GET `url` as JSON.
async fn json_at(url: &str) -> Result<serde_json::Value> {
    Ok(client()
        .get(url)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?)
}

/// Issue 12: through Envoy in front of a 1.30 apiserver, kubectl reads the OpenAPI v3 of a kind
/// only the 1.33 peer serves. `/openapi/v3` lists the peer's entry (its URL and hash) beside
/// the local apiserver's own entries, the document comes from the peer (kube's real one), so
/// `kubectl explain` prints its field descriptions, and `kubectl apply` (client-side with
/// strict validation, and server-side) works, the peer refusing an unknown field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_explains_and_applies_a_kind_only_a_peer_serves() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let etcd = Etcd::start().await?;
    let dir = tempfile::tempdir()?;
    let a = SimApiserver::start_with(shared("apiserver-a", "k8s-1.30", &etcd)).await?;
    let b = SimApiserver::start_with(shared("apiserver-b", "k8s-1.33", &etcd)).await?;
    let mut control = Control::new(&a, dir.path(), &[])?;
    let envoy = start_routed_to_b(&mut control).await?;

    let local_root = json_at(&format!("{}/openapi/v3", a.url())).await?;
    let peer_root = json_at(&format!("{}/openapi/v3", b.url())).await?;
    assert!(local_root["paths"].get(LEASE_CANDIDATES).is_none());
    let peer_entry = peer_root["paths"][LEASE_CANDIDATES].clone();
    let (root, _) = eventually(
        "/openapi/v3 through Envoy lists the peer's coordination.k8s.io/v1beta1",
        Duration::from_secs(30),
        || async {
            let root = json_at(&url(&envoy, "/openapi/v3")).await?;
            Ok(root["paths"]
                .get(LEASE_CANDIDATES)
                .is_some()
                .then_some(root))
        },
    )
    .await
    .with_context(|| format!("control plane log:\n{}", control.log()))?;
    // The peer's entry, exactly; every local entry the local apiserver's own; nothing else but
    // group-versions only the peer serves.
    assert_eq!(root["paths"][LEASE_CANDIDATES], peer_entry);
    let paths = root["paths"].as_object().context("paths")?;
    for (path, entry) in local_root["paths"].as_object().context("local paths")? {
        assert_eq!(paths.get(path), Some(entry), "{path}: the local entry");
    }
    for (path, entry) in paths {
        if local_root["paths"].get(path).is_none() {
            assert_eq!(
                Some(entry),
                peer_root["paths"].get(path),
                "{path}: a peer entry"
            );
        }
    }

    // The document behind the peer's URL comes from the peer, byte for byte kube's real one.
    let doc_url = peer_entry["serverRelativeURL"]
        .as_str()
        .context("serverRelativeURL")?;
    let resp = client().get(url(&envoy, doc_url)).send().await?;
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(header(&resp, "x-sim-apiserver"), "apiserver-b");
    let fixture =
        std::fs::read(repo_root().join(
            "tests/fixtures/openapi/k8s-1.33/apis__coordination.k8s.io__v1beta1_openapi.json",
        ))?;
    assert_eq!(resp.bytes().await?.as_ref(), fixture.as_slice());

    let kubeconfig = envoy.kubeconfig()?;
    let (ok, out, err) = kubectl(
        &kubeconfig,
        &[
            "explain",
            "leasecandidates",
            "--api-version=coordination.k8s.io/v1beta1",
            "--recursive",
        ],
    )
    .await?;
    assert!(ok, "kubectl explain: {err}");
    for text in [
        "LeaseCandidate defines a candidate for a Lease object",
        "binaryVersion",
        "emulationVersion",
        "renewTime",
    ] {
        assert!(out.contains(text), "{text:?} in {out}");
    }
    let (ok, out, err) = kubectl(
        &kubeconfig,
        &[
            "explain",
            "leasecandidates.spec",
            "--api-version=coordination.k8s.io/v1beta1",
        ],
    )
    .await?;
    assert!(ok, "kubectl explain leasecandidates.spec: {err}");
    for text in [
        "BinaryVersion is the binary version",
        "LeaseName is the name of the lease for which this candidate is contending",
        "strategy",
    ] {
        assert!(out.contains(text), "{text:?} in {out}");
    }

    // Client-side apply (kubectl validates strictly by default: on the server, which it learns
    // from the document's fieldValidation parameter), then server-side apply.
    let manifest = dir.path().join("lc.yaml");
    std::fs::write(&manifest, lease_candidate(""))?;
    let manifest_arg = manifest.display().to_string();
    let (ok, out, err) = kubectl(&kubeconfig, &["apply", "-f", &manifest_arg]).await?;
    assert!(ok && out.contains("created"), "kubectl apply: {out} {err}");
    let (ok, out, err) = kubectl(
        &kubeconfig,
        &["apply", "--server-side", "-f", &manifest_arg],
    )
    .await?;
    assert!(
        ok && out.contains("serverside-applied"),
        "kubectl apply --server-side: {out} {err}"
    );
    let (ok, out, err) = kubectl(
        &kubeconfig,
        &[
            "get",
            "leasecandidates.v1beta1.coordination.k8s.io",
            "lc1",
            "-n",
            "default",
            "-o",
            "jsonpath={.spec.leaseName}",
        ],
    )
    .await?;
    assert!(ok, "kubectl get: {err}");
    assert_eq!(out, "kube-controller-manager");

    // An unknown field: the peer validates against its schema and refuses it, like kube.
    let bad = dir.path().join("lc-bad.yaml");
    std::fs::write(&bad, lease_candidate("  bogusField: 1\n"))?;
    let bad_arg = bad.display().to_string();
    for args in [
        &["apply", "-f", bad_arg.as_str()][..],
        &["apply", "--server-side", "-f", bad_arg.as_str()][..],
    ] {
        let (ok, _, err) = kubectl(&kubeconfig, args).await?;
        assert!(!ok, "{args:?} must fail");
        assert!(
            err.contains("BadRequest")
                && err.contains("strict decoding error: unknown field \"spec.bogusField\""),
            "{args:?}: {err}"
        );
    }
    Ok(())
}

/// Files under `dir` (recursively) whose bytes contain `needle`.
fn files_containing(dir: &Path, needle: &[u8]) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    if !dir.exists() {
        return Ok(found);
    }
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            found.extend(files_containing(&path, needle)?);
        } else if std::fs::read(&path)?
            .windows(needle.len())
            .any(|w| w == needle)
        {
            found.push(path);
        }
    }
    Ok(found)
}

/// Issue 18: a peer's OpenAPI v3 document whose `?hash=` does not name it (a peer that lies,
/// `--openapi-wrong-documents`) must not reach kubectl cacheable. kube-openapi sends a document
/// fetched by its hash as `public, immutable`, `Expires` a year ahead, and kubectl keeps it
/// that long in its disk cache under that URL, which later is the local apiserver's. Through
/// Envoy the peer's answer is `no-store`, without `Expires`, `ETag` or `Last-Modified`; real
/// kubectl reads it (explain works) and keeps nothing of it, while it does keep the local
/// apiserver's documents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peers_openapi_document_never_reaches_kubectl_cacheable() -> Result<()> {
    use sha2::{Digest, Sha512};
    const MARKER: &str = "x-sim-not-the-document-of-this-hash";
    let _serial = SERIAL.lock().await;
    let etcd = Etcd::start().await?;
    let dir = tempfile::tempdir()?;
    let a = SimApiserver::start_with(shared("apiserver-a", "k8s-1.30", &etcd)).await?;
    let mut liar = shared("apiserver-b", "k8s-1.33", &etcd);
    liar.extra_args.push("--openapi-wrong-documents".into());
    let b = SimApiserver::start_with(liar).await?;
    let mut control = Control::new(&a, dir.path(), &[])?;
    let envoy = start_routed_to_b(&mut control).await?;

    let peer_root = json_at(&format!("{}/openapi/v3", b.url())).await?;
    let doc_url = peer_root["paths"][LEASE_CANDIDATES]["serverRelativeURL"]
        .as_str()
        .context("serverRelativeURL")?
        .to_string();
    let listed_hash = doc_url.rsplit_once("?hash=").context("hash")?.1.to_string();
    eventually(
        "/openapi/v3 through Envoy lists the peer's coordination.k8s.io/v1beta1",
        Duration::from_secs(30),
        || async {
            let root = json_at(&url(&envoy, "/openapi/v3")).await?;
            Ok(
                (root["paths"][LEASE_CANDIDATES]["serverRelativeURL"] == doc_url.as_str())
                    .then_some(()),
            )
        },
    )
    .await
    .with_context(|| format!("control plane log:\n{}", control.log()))?;

    // What the peer itself sends: a document that is not the one its hash names, cacheable
    // for a year.
    let direct = client().get(format!("{}{doc_url}", b.url())).send().await?;
    assert_eq!(direct.status(), 200);
    assert_eq!(header(&direct, "cache-control"), "public, immutable");
    assert!(!header(&direct, "expires").is_empty());
    let body = direct.bytes().await?;
    let body_hash: String = Sha512::digest(&body)
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect();
    assert_ne!(body_hash, listed_hash, "the peer lies");

    // Through Envoy: the same body, from the peer, never cacheable.
    let resp = client().get(url(&envoy, &doc_url)).send().await?;
    assert_eq!(resp.status(), 200);
    assert_eq!(header(&resp, "x-sim-apiserver"), "apiserver-b");
    assert_eq!(header(&resp, "cache-control"), "no-store");
    for name in ["expires", "etag", "last-modified"] {
        assert_eq!(header(&resp, name), "", "{name}");
    }
    assert_eq!(resp.bytes().await?, body);

    // Real kubectl, with its disk cache: it reads the peer's document (explain works) and
    // keeps none of it; a document of the local apiserver's (read to validate a Lease) it
    // keeps, so the cache is in use.
    let kubeconfig = envoy.kubeconfig()?;
    let http_cache = kubeconfig.with_extension("cache").join("http");
    let (ok, out, err) = kubectl(
        &kubeconfig,
        &[
            "explain",
            "leasecandidates",
            "--api-version=coordination.k8s.io/v1beta1",
        ],
    )
    .await?;
    assert!(
        ok && out.contains("LeaseCandidate defines a candidate for a Lease object"),
        "kubectl explain: {out} {err}"
    );
    let lease = dir.path().join("lease.yaml");
    std::fs::write(
        &lease,
        "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: l1\n  namespace: default\n",
    )?;
    let lease_arg = lease.display().to_string();
    let (ok, out, err) = kubectl(
        &kubeconfig,
        &["create", "--dry-run=client", "-f", &lease_arg],
    )
    .await?;
    assert!(ok, "kubectl create --dry-run=client: {out} {err}");
    let local_doc = b"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}";
    assert!(
        !files_containing(&http_cache, local_doc)?.is_empty(),
        "kubectl's disk cache holds the local apiserver's document ({})",
        http_cache.display()
    );
    assert_eq!(
        files_containing(&http_cache, MARKER.as_bytes())?,
        Vec::<PathBuf>::new(),
        "kubectl's disk cache holds the peer's document"
    );
    Ok(())
}

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

/// The only apiserver serving resource.k8s.io/v1beta2 dies past the lease grace (its API
/// retained: 503) and comes back serving its resources but not yet its discovery: the moment of a
/// rolling upgrade between its new Lease and the control plane's next read of its discovery. Its
/// resources go to it at once, not to a 503; discovery keeps them Stale until it is read.
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
    eventually(
        "b's API is retained",
        GRACE + Duration::from_secs(15),
        || async {
            let skew = control.skew().await?;
            Ok((skew["retained"][0]["id"] == b_lease.as_str()).then_some(()))
        },
    )
    .await
    .with_context(|| control.log())?;
    assert_eq!(get(&envoy, CLAIMS).await?.0, 503, "retained: 503");

    // Back at the same address, its discovery answering 503 for longer than this test runs.
    let mut opts = b.options().context("b's options")?.clone();
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
    let (_, body) = apis(&envoy).await?;
    assert_eq!(
        freshness_of(&body, "resource.k8s.io", "v1beta2"),
        Some(Some("Stale".to_string()))
    );
    assert_eq!(get(&envoy, CLAIMS).await?.0, 503);

    // b comes back: served by it again at once, and nothing is Stale.
    b.restart(None).await?;
    let took = routed(
        &envoy,
        &control,
        CLAIMS,
        (200, "apiserver-b"),
        Duration::from_secs(20),
    )
    .await?;
    let (_, body) = apis(&envoy).await?;
    assert_eq!(
        freshness_of(&body, "resource.k8s.io", "v1beta2"),
        Some(Some("Current".to_string())),
        "Current again"
    );
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_keeps_serving_while_the_control_plane_restarts() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let etcd = Etcd::start().await?;
    let dir = tempfile::tempdir()?;
    let a = SimApiserver::start_with(shared("apiserver-a", "k8s-1.30", &etcd)).await?;
    let mut b = SimApiserver::start_with(shared("apiserver-b", "k8s-1.33", &etcd)).await?;
    let mut control = Control::new(&a, dir.path(), &[])?;
    let envoy = start_routed_to_b(&mut control).await?;
    let (etag_before, _) = apis(&envoy).await?;
    let version_before = control.skew().await?["snapshot_version"].clone();

    // Traffic to the peer and to the local apiserver while the control plane is killed and
    // started again.
    let probe = Probe::start(
        &envoy,
        vec![
            (CLAIMS, 200, "apiserver-b"),
            (DEPLOYMENTS, 200, "apiserver-a"),
        ],
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    control.kill().await?;
    let killed = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let served_while_down = probe.ok.load(Ordering::Relaxed);
    assert_eq!(get(&envoy, CLAIMS).await?, (200, "apiserver-b".into()));

    control.start().await?;
    let (_, ready_after) = eventually(
        "the restarted control plane is ready",
        Duration::from_secs(30),
        || async { Ok(control.ready().await.then_some(())) },
    )
    .await
    .with_context(|| control.log())?;
    eventually("Envoy reconnects", Duration::from_secs(30), || async {
        Ok((control.metric("skewgate_xds_streams").await? >= 1.0).then_some(()))
    })
    .await
    .with_context(|| envoy.log())?;
    let reconnected = killed.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (ok, failures) = probe.finish().await?;
    let resent_cds = control
        .metric("skewgate_xds_responses_total{type_url=\"type.googleapis.com/envoy.config.cluster.v3.Cluster\"}")
        .await?;
    let resent_ecds = control
        .metric("skewgate_xds_responses_total{type_url=\"type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig\"}")
        .await?;
    let nacks = control
        .metric("skewgate_xds_nacks_total{type_url=\"type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig\"}")
        .await?
        + control
            .metric("skewgate_xds_nacks_total{type_url=\"type.googleapis.com/envoy.config.cluster.v3.Cluster\"}")
            .await?;
    eprintln!(
        "control plane SIGKILLed and restarted: ready {ready_after:?} after the restart, Envoy reconnected \
         {reconnected:?} after the kill; requests during it all: {ok} answered as expected \
         ({served_while_down} while it was down), {} failed; resent after the reconnect: CDS {resent_cds}, ECDS {resent_ecds}; NACKs {nacks}",
        failures.len()
    );
    assert!(failures.is_empty(), "no traffic gap: {failures:?}");
    assert!(served_while_down > 0 && ok > served_while_down);
    assert_eq!(
        (resent_cds, resent_ecds, nacks),
        (0.0, 0.0, 0.0),
        "the same inputs give the same versions: nothing to resend\n{}",
        control.log()
    );
    assert_eq!(control.skew().await?["snapshot_version"], version_before);
    assert_eq!(apis(&envoy).await?.0, etag_before);

    // The restarted control plane carries the next change: the peer vanishes (SIGKILL, its
    // lease stays until the grace ends). Its resources are 503, never 404, before the grace
    // and after it (retained).
    b.stop().await?;
    let resp = client().get(url(&envoy, CLAIMS)).send().await?;
    let status = resp.status().as_u16();
    let body = resp.text().await?;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("\"reason\":\"ServiceUnavailable\""), "{body}");
    // After the grace b is dead and its API is retained: still 503, now the filter's, with
    // Retry-After (never the local 404; the retention scenario follows it to the end).
    tokio::time::sleep(GRACE + Duration::from_secs(2)).await;
    let resp = client().get(url(&envoy, CLAIMS)).send().await?;
    assert_eq!(resp.status(), 503);
    assert!(
        !header(&resp, "retry-after").is_empty(),
        "retained: Retry-After"
    );

    // SIGTERM: a clean exit; Envoy keeps serving on what it holds.
    let (status, took) = control.terminate().await?;
    assert!(status.success(), "exit status {status}: {}", control.log());
    assert_eq!(get(&envoy, DEPLOYMENTS).await?, (200, "apiserver-a".into()));
    eprintln!("SIGTERM: exited 0 in {took:?}; Envoy still serves");
    Ok(())
}

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

/// (status, x-sim-* echo headers) of a GET through a TLS Envoy with `client`.
async fn get_echo(
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

/// A cluster of Envoy's `/config_dump`, as Envoy itself renders it, without what names it: the
/// static fallback clusters and the control plane's (CDS) are compared with it.
async fn cluster_dump(envoy: &Envoy, name: &str) -> Result<serde_json::Value> {
    let dump: serde_json::Value =
        serde_json::from_str(&envoy.admin("/config_dump?resource=static_clusters").await?)?;
    let dynamic: serde_json::Value = serde_json::from_str(
        &envoy
            .admin("/config_dump?resource=dynamic_active_clusters")
            .await?,
    )?;
    let empty = Vec::new();
    let mut cluster = [dump, dynamic]
        .iter()
        .flat_map(|d| d["configs"].as_array().unwrap_or(&empty).clone())
        .map(|c| c["cluster"].clone())
        .find(|c| c["name"] == name)
        .with_context(|| format!("no cluster {name} in Envoy's config dump"))?;
    for field in ["name", "@type"] {
        cluster.as_object_mut().map(|o| o.remove(field));
    }
    cluster["load_assignment"]
        .as_object_mut()
        .map(|o| o.remove("cluster_name"));
    Ok(cluster)
}

/// Issue 10, item 2: an Envoy (re)started while its control plane is down serves after the
/// bounded wait, local-only (what the apiserver alone would answer), says so in its log and
/// stats, and takes the live configuration when the control plane comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_serves_local_only_without_its_control_plane_then_the_live_configuration(
) -> Result<()> {
    let _serial = SERIAL.lock().await;
    let pki = TestPki::generate()?;
    let etcd = Etcd::start().await?;
    let dir = tempfile::tempdir()?;
    let a =
        SimApiserver::start_with(shared("apiserver-a", "k8s-1.30", &etcd).with_pki(&pki)).await?;
    let b =
        SimApiserver::start_with(shared("apiserver-b", "k8s-1.33", &etcd).with_pki(&pki)).await?;
    let mut control = Control::secure(&a, dir.path(), &pki)?;
    // The control plane is not started. Envoy's bootstrap alone writes the SDS files its
    // fallback clusters need (in its own --sds-dir, which `run` never writes to).
    let mut envoy = live_envoy_with(
        &control,
        Some(&pki),
        None,
        &[
            "--control-plane-wait=2s".into(),
            format!("--wasm={}", wasm_path()?.display()),
            format!("--local-apiserver-url={}", a.url()),
            format!("--peer-ca-file={}", pki.cluster_ca.cert_file.display()),
            format!(
                "--proxy-client-cert-file={}",
                pki.front_proxy_client.cert_file.display()
            ),
            format!(
                "--proxy-client-key-file={}",
                pki.front_proxy_client.key_file.display()
            ),
        ],
    )
    .await?;
    envoy.wait_ready().await.context("Envoy opened no port")?;
    let alice = pki.client_cert("alice", &Subject::new().o("system:masters").cn("alice"))?;
    let with_cert = pki.client(Some(&alice))?;
    let plain = pki.client(None)?;
    let (_, took) = eventually(
        "served without a control plane",
        Duration::from_secs(30),
        || async {
            Ok(matches!(
                get_echo(&plain, &envoy, DEPLOYMENTS, None).await,
                Ok((200, _))
            )
            .then_some(()))
        },
    )
    .await
    .with_context(|| envoy.log())?;
    eprintln!("fallback: served {took:?} after Envoy's admin interface was up (wait: 2 s)");
    // Both of Envoy's waits expired (CDS, then the filter configuration) and the filter runs
    // its fallback, logged and counted.
    assert_eq!(
        envoy.stat("cluster_manager.cds.init_fetch_timeout").await?,
        1
    );
    assert_eq!(
        envoy
            .stat("extension_config_discovery.http_filter.skewgate.init_fetch_timeout")
            .await?,
        1
    );
    expect_fallback(&envoy, "local-only").await?;

    // Local-only: each kind of client reaches the local apiserver over verified TLS, in its own
    // cluster variant, authenticated as it would be without skewgate; what only the 1.33 peer
    // serves is not known to exist, but not known not to either: the local apiserver's
    // `404 page not found` becomes a retryable 503, never a 404 a controller would act on.
    let bob = TEST_TOKENS[0];
    for (what, client, token, authenticator) in [
        ("certificate", &with_cert, None, "requestheader"),
        ("token", &plain, Some(bob.token), "token"),
        ("anonymous", &plain, None, "anonymous"),
    ] {
        let (status, echo) = get_echo(client, &envoy, DEPLOYMENTS, token).await?;
        let got = |k: &str| echo.get(k).map(String::as_str).unwrap_or_default();
        assert_eq!(status, 200, "{what}: {echo:?}");
        assert_eq!(got("x-sim-apiserver"), "apiserver-a", "{what}");
        assert_eq!(
            got("x-sim-authenticator"),
            authenticator,
            "{what}: {echo:?}"
        );
        let (status, echo) = get_echo(client, &envoy, CLAIMS, token).await?;
        assert_eq!(
            (status, echo.get("x-sim-apiserver").map(String::as_str)),
            (503, Some("apiserver-a")),
            "{what}: the local apiserver's 404 for a peer-only resource is a 503 here"
        );
    }
    // Discovery is the local apiserver's own: no v1beta2 of the 1.33 peer.
    let resp = with_cert
        .get(url(&envoy, "/apis"))
        .header("accept", AGGREGATED)
        .send()
        .await?;
    assert_eq!(header(&resp, "x-sim-apiserver"), "apiserver-a");
    let body = resp.text().await?;
    assert!(!versions_of(&body, "resource.k8s.io").contains(&"v1beta2".to_string()));
    // Nothing was rerouted: the counter has no label set yet (each is defined when first
    // counted).
    let rerouted = envoy
        .admin("/stats?filter=^wasmcustom.apiserver_rerouted_request_total")
        .await?;
    assert!(rerouted.trim().is_empty(), "{rerouted}");

    // The control plane comes: its configuration replaces the fallback.
    control.start().await?;
    let (_, took) = eventually("routed to b", Duration::from_secs(30), || async {
        let (status, echo) = get_echo(&with_cert, &envoy, CLAIMS, None).await?;
        Ok((status == 200
            && echo.get("x-sim-apiserver").map(String::as_str) == Some("apiserver-b"))
        .then_some(()))
    })
    .await
    .with_context(|| format!("{}\n{}", control.log(), envoy.log()))?;
    assert_eq!(
        envoy
            .stat("wasmcustom.skewgate_fallback_configuration")
            .await?,
        0
    );
    let body = with_cert
        .get(url(&envoy, "/apis"))
        .header("accept", AGGREGATED)
        .send()
        .await?
        .text()
        .await?;
    assert!(versions_of(&body, "resource.k8s.io").contains(&"v1beta2".to_string()));
    eprintln!("fallback: live configuration {took:?} after the control plane started");

    // The fallback clusters are the control plane's local clusters under other names (one
    // renderer, `envoy::resources::cluster`), compared as Envoy holds them.
    for auth in ["identity", "token", "anonymous"] {
        let fallback = cluster_dump(&envoy, &format!("skewgate-fallback-local-{auth}")).await?;
        let live = cluster_dump(&envoy, &format!("skewgate-local-{auth}")).await?;
        // Each names the SDS files in its own directory (bootstrap's and run's --sds-dir).
        let fallback = fallback.to_string().replace(
            &pki.dir.path().join("envoy-sds").display().to_string(),
            &dir.path().join("sds").display().to_string(),
        );
        assert_eq!(fallback, live.to_string(), "{auth}");
    }
    drop(b);
    Ok(())
}

/// `bootstrap` flags for a 2 s fallback from the state directory `state`, to `local`.
fn fallback_flags(state: &Path, local: &SimApiserver, pki: &TestPki) -> Result<Vec<String>> {
    Ok(vec![
        "--control-plane-wait=2s".to_string(),
        format!("--state-dir={}", state.display()),
        format!("--wasm={}", wasm_path()?.display()),
        format!("--local-apiserver-url={}", local.url()),
        format!("--peer-ca-file={}", pki.cluster_ca.cert_file.display()),
        format!(
            "--proxy-client-cert-file={}",
            pki.front_proxy_client.cert_file.display()
        ),
        format!(
            "--proxy-client-key-file={}",
            pki.front_proxy_client.key_file.display()
        ),
    ])
}

/// Strings a peer (or an extension apiserver behind an APIService) could put in its discovery:
/// template syntax, quotes, backslashes, control characters, NUL, YAML/JSON syntax, HTML,
/// non-ASCII and a long one.
fn hostile_strings() -> Vec<String> {
    vec![
        "{{node_id}}".into(),
        "{{#fallback}}x{{/fallback}}".into(),
        "\"".into(),
        "'".into(),
        "\\".into(),
        "\u{0}".into(),
        "\n- name: evil\n  type: STATIC".into(),
        "\r\t\u{7}\u{1b}[31m".into(),
        "]}}{{: ,&a *a !!binary |".into(),
        "{\"@type\":\"x\"}".into(),
        "</script><script>alert(1)</script>".into(),
        "Ünïcødé ✓ 日本 \u{202e}".into(),
        "y".repeat(10_000),
    ]
}

/// The 1.33 fixture with the hostile strings in every string field of the peer-only
/// `resourceclaims` that kube does not constrain to a name (`shortNames`, `categories`), and a
/// resource of their own beside it carrying them in its singular name and kind too.
fn hostile_fixture(dir: &Path) -> Result<PathBuf> {
    let out = dir.join("k8s-1.33-hostile");
    std::fs::create_dir_all(&out)?;
    let source = skewgate_tests::fixture("k8s-1.33");
    for file in ["api.json", "api__v1.json"] {
        std::fs::copy(source.join(file), out.join(file))?;
    }
    let mut apis: serde_json::Value =
        serde_json::from_slice(&std::fs::read(source.join("aggregated_v2.json"))?)?;
    let hostile = hostile_strings();
    let mut edited = 0;
    for group in apis["items"].as_array_mut().into_iter().flatten() {
        if group["metadata"]["name"] != "resource.k8s.io" {
            continue;
        }
        for version in group["versions"].as_array_mut().into_iter().flatten() {
            if version["version"] != "v1beta2" {
                continue;
            }
            let resources = version["resources"].as_array_mut().context("resources")?;
            for r in resources.iter_mut() {
                if r["resource"] == "resourceclaims" {
                    r["shortNames"] = serde_json::json!(hostile);
                    r["categories"] = serde_json::json!(hostile);
                    edited += 1;
                }
            }
            resources.push(serde_json::json!({
                "resource": "hostilethings",
                "responseKind": {"group": "", "version": "", "kind": hostile[0]},
                "scope": "Namespaced",
                "singularResource": hostile[1],
                "verbs": ["get", "list"],
                "shortNames": hostile,
                "categories": hostile,
            }));
        }
    }
    assert_eq!(
        edited, 1,
        "the fixture has resource.k8s.io/v1beta2 resourceclaims"
    );
    std::fs::write(out.join("aggregated_v2.json"), serde_json::to_vec(&apis)?)?;
    Ok(out)
}

/// A peer whose discovery carries hostile strings in every string field it has: routing is
/// unaffected, merged discovery is valid JSON holding them verbatim, the bootstrap rendered
/// from the kept configuration passes `envoy --mode validate`, and Envoy restarted alone from
/// it serves `/version` and the peer-only resource. (Before the bootstrap was built as data,
/// `{{node_id}}` in a shortName broke the rendered YAML and Envoy exited at start, on every
/// node that kept the configuration.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_strings_in_a_peers_discovery_cannot_keep_envoy_from_starting() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let pki = TestPki::generate()?;
    let etcd = Etcd::start().await?;
    let dir = tempfile::tempdir()?;
    let state = dir.path().join("state");
    let hostile = hostile_fixture(dir.path())?;
    let a =
        SimApiserver::start_with(shared("apiserver-a", "k8s-1.30", &etcd).with_pki(&pki)).await?;
    let _b = SimApiserver::start_with(
        shared("apiserver-b", &hostile.display().to_string(), &etcd).with_pki(&pki),
    )
    .await?;
    let mut control = Control::secure(&a, dir.path(), &pki)?;
    assert_eq!(control.state_dir, state, "Control's own --state-dir");
    let bootstrap = fallback_flags(&state, &a, &pki)?;
    let bob = TEST_TOKENS[0];
    let plain = pki.client(None)?;
    let get_as_bob = |envoy: &Envoy, path: &str| {
        let (plain, envoy_url) = (plain.clone(), url(envoy, path));
        async move {
            let resp = plain.get(envoy_url).bearer_auth(bob.token).send().await?;
            Ok::<_, anyhow::Error>((resp.status().as_u16(), header(&resp, "x-sim-apiserver")))
        }
    };

    control.start().await?;
    let envoy = live_envoy_with(&control, Some(&pki), None, &bootstrap).await?;
    eventually("routed to b", Duration::from_secs(30), || async {
        Ok((get_as_bob(&envoy, CLAIMS).await? == (200, "apiserver-b".to_string())).then_some(()))
    })
    .await
    .with_context(|| control.log())?;
    // Merged discovery: valid JSON, the strings verbatim.
    let merged: serde_json::Value = plain
        .get(url(&envoy, "/apis"))
        .bearer_auth(bob.token)
        .header("accept", AGGREGATED)
        .send()
        .await?
        .json()
        .await
        .context("merged /apis is not JSON")?;
    let resources: Vec<&serde_json::Value> = merged["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|g| g["metadata"]["name"] == "resource.k8s.io")
        .flat_map(|g| g["versions"].as_array().into_iter().flatten())
        .filter(|v| v["version"] == "v1beta2")
        .flat_map(|v| v["resources"].as_array().into_iter().flatten())
        .collect();
    let things = resources
        .iter()
        .find(|r| r["resource"] == "hostilethings")
        .context("the hostile resource is in merged discovery")?;
    assert_eq!(things["shortNames"], serde_json::json!(hostile_strings()));
    assert_eq!(things["responseKind"]["kind"], "{{node_id}}");
    let kept = state.join("last-acknowledged.json");
    eventually(
        "the configuration kept",
        Duration::from_secs(10),
        || async { Ok(kept.exists().then_some(())) },
    )
    .await
    .with_context(|| control.log())?;
    assert!(
        std::fs::read_to_string(&kept)?.contains("{{node_id}}"),
        "the kept configuration holds the hostile strings"
    );

    // Both gone. The bootstrap rendered from the kept configuration: Envoy validates it.
    control.kill().await?;
    drop(envoy);
    let rendered =
        render_live_bootstrap(&control, Some(&pki), None, &bootstrap, free_port()?).await?;
    let file = dir.path().join("validate.pb");
    std::fs::write(&file, &rendered)?;
    let out = Command::new(envoy_bin()?)
        .args(["--mode", "validate", "-c"])
        .arg(&file)
        .output()
        .await?;
    assert!(
        out.status.success(),
        "envoy --mode validate refused the bootstrap:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // Envoy restarted alone serves from it: /version locally, the peer-only resource from b.
    let mut envoy = live_envoy_with(&control, Some(&pki), None, &bootstrap).await?;
    envoy.wait_ready().await.with_context(|| envoy.log())?;
    eventually(
        "the peer-only resource from b",
        Duration::from_secs(30),
        || async {
            Ok(
                (get_as_bob(&envoy, CLAIMS).await.ok() == Some((200, "apiserver-b".to_string())))
                    .then_some(()),
            )
        },
    )
    .await
    .with_context(|| envoy.log())?;
    assert_eq!(
        get_as_bob(&envoy, "/version").await?,
        (200, "apiserver-a".to_string())
    );
    expect_fallback(&envoy, "last-acknowledged").await?;
    Ok(())
}

/// The fallback with a kept configuration: an Envoy that the control plane configured once,
/// restarted while the control plane is gone, serves what the control plane last saw it
/// acknowledge (kept in `run --state-dir`, rendered by `bootstrap --state-dir`): the peer-only
/// resource still goes to the peer, not to the local apiserver's 503 or 404. Then the control
/// plane's configuration replaces it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_restarted_without_its_control_plane_serves_the_last_acknowledged_configuration(
) -> Result<()> {
    let _serial = SERIAL.lock().await;
    let pki = TestPki::generate()?;
    let etcd = Etcd::start().await?;
    let dir = tempfile::tempdir()?;
    let state = dir.path().join("state");
    let a =
        SimApiserver::start_with(shared("apiserver-a", "k8s-1.30", &etcd).with_pki(&pki)).await?;
    let _b =
        SimApiserver::start_with(shared("apiserver-b", "k8s-1.33", &etcd).with_pki(&pki)).await?;
    let mut control = Control::secure(&a, dir.path(), &pki)?;
    assert_eq!(control.state_dir, state, "Control's own --state-dir");
    let bootstrap = fallback_flags(&state, &a, &pki)?;
    let bob = TEST_TOKENS[0];
    let plain = pki.client(None)?;
    let claims_from = |envoy: &Envoy| {
        let (plain, envoy_url) = (plain.clone(), url(envoy, CLAIMS));
        async move {
            let resp = plain.get(envoy_url).bearer_auth(bob.token).send().await?;
            Ok::<_, anyhow::Error>((resp.status().as_u16(), header(&resp, "x-sim-apiserver")))
        }
    };

    // Configured once by the control plane: routed to b, and the configuration kept.
    control.start().await?;
    let envoy = live_envoy_with(&control, Some(&pki), None, &bootstrap).await?;
    eventually("routed to b", Duration::from_secs(30), || async {
        Ok((claims_from(&envoy).await? == (200, "apiserver-b".to_string())).then_some(()))
    })
    .await
    .with_context(|| control.log())?;
    let kept = state.join("last-acknowledged.json");
    eventually(
        "the acknowledged configuration kept",
        Duration::from_secs(10),
        || async { Ok(kept.exists().then_some(())) },
    )
    .await
    .with_context(|| control.log())?;

    // Both gone; Envoy restarts alone.
    control.kill().await?;
    drop(envoy);
    let mut envoy = live_envoy_with(&control, Some(&pki), None, &bootstrap).await?;
    envoy.wait_ready().await.context("Envoy opened no port")?;
    let (_, took) = eventually(
        "the peer-only resource still from b",
        Duration::from_secs(30),
        || async {
            Ok(
                (claims_from(&envoy).await.ok() == Some((200, "apiserver-b".to_string())))
                    .then_some(()),
            )
        },
    )
    .await
    .with_context(|| envoy.log())?;
    eprintln!("last acknowledged: served from b {took:?} after Envoy's admin was up (wait: 2 s)");
    expect_fallback(&envoy, "last-acknowledged").await?;
    // Served locally as before: the local clusters are the static ones.
    let resp = plain
        .get(url(&envoy, DEPLOYMENTS))
        .bearer_auth(bob.token)
        .send()
        .await?;
    assert_eq!(
        (resp.status().as_u16(), header(&resp, "x-sim-apiserver")),
        (200, "apiserver-a".to_string())
    );

    // The control plane returns: its configuration replaces the fallback.
    control.start().await?;
    eventually(
        "the live configuration",
        Duration::from_secs(30),
        || async {
            Ok((envoy
                .stat("wasmcustom.skewgate_fallback_configuration")
                .await?
                == 0)
                .then_some(()))
        },
    )
    .await
    .with_context(|| control.log())?;
    assert_eq!(claims_from(&envoy).await?, (200, "apiserver-b".to_string()));
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_everywhere_with_the_three_upstream_identities() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let pki = TestPki::generate()?;
    let etcd = Etcd::start().await?;
    let dir = tempfile::tempdir()?;
    let a =
        SimApiserver::start_with(shared("apiserver-a", "k8s-1.30", &etcd).with_pki(&pki)).await?;
    let b =
        SimApiserver::start_with(shared("apiserver-b", "k8s-1.33", &etcd).with_pki(&pki)).await?;
    let mut control = Control::secure(&a, dir.path(), &pki)?;
    control.start().await?;
    let peer_port = free_port()?;
    let envoy = live_envoy(&control, Some(&pki), Some((peer_port, &a))).await?;

    // The first sync over TLS: discovery from both apiservers verified with the peer CA.
    eventually("ready", Duration::from_secs(30), || async {
        Ok(control.ready().await.then_some(()))
    })
    .await
    .with_context(|| control.log())?;
    let alice = pki.client_cert("alice", &Subject::new().o("system:masters").cn("alice"))?;
    let with_cert = pki.client(Some(&alice))?;
    let plain = pki.client(None)?;
    let h1 = pki.client_builder(None)?.http1_only().build()?;
    let bob = TEST_TOKENS[0];

    // Each kind of client reaches the 1.33 peer through its own cluster variant, over TLS that
    // verified the peer, and the peer authenticates it as it should.
    let (_, took) = eventually("routed to b over TLS", Duration::from_secs(20), || async {
        let (status, echo) = get_echo(&with_cert, &envoy, CLAIMS, None).await?;
        Ok((status == 200
            && echo.get("x-sim-apiserver").map(String::as_str) == Some("apiserver-b"))
        .then_some(echo))
    })
    .await
    .with_context(|| format!("{}\n{}", control.log(), envoy.log()))?;
    // (what, client, token, authenticator, user, upstream ALPN)
    type Case<'a> = (
        &'a str,
        &'a reqwest::Client,
        Option<&'a str>,
        &'a str,
        &'a str,
        &'a str,
    );
    let cases: Vec<Case<'_>> = vec![
        (
            "client certificate over h2",
            &with_cert,
            None,
            "requestheader",
            "alice",
            "h2",
        ),
        (
            "bearer token over h2",
            &plain,
            Some(bob.token),
            "token",
            bob.user,
            "h2",
        ),
        (
            "bearer token over HTTP/1.1",
            &h1,
            Some(bob.token),
            "token",
            bob.user,
            "http/1.1",
        ),
        (
            "anonymous over h2",
            &plain,
            None,
            "anonymous",
            "system:anonymous",
            "http/1.1",
        ),
    ];
    for (what, client, token, authenticator, user, alpn) in cases {
        for (path, server) in [(CLAIMS, "apiserver-b"), (DEPLOYMENTS, "apiserver-a")] {
            let (status, echo) = get_echo(client, &envoy, path, token).await?;
            let got = |k: &str| echo.get(k).map(String::as_str).unwrap_or_default();
            assert_eq!(status, 200, "{what} {path}: {echo:?}");
            assert_eq!(got("x-sim-apiserver"), server, "{what} {path}");
            assert_eq!(
                got("x-sim-authenticator"),
                authenticator,
                "{what} {path}: {echo:?}"
            );
            assert_eq!(got("x-sim-user"), user, "{what} {path}");
            assert_eq!(got("x-sim-alpn"), alpn, "{what} {path}: upstream protocol");
        }
        eprintln!("TLS: {what}: {authenticator}/{user}, upstream ALPN {alpn}, local and peer");
    }
    eprintln!("TLS: first request routed to the peer {took:?} after ready");

    // kubectl with a client certificate, through Envoy, on the peer's resource.
    let kubeconfig = dir.path().join("alice.kubeconfig");
    std::fs::write(
        &kubeconfig,
        kubeconfig_tls(
            &envoy.url(),
            &pki.cluster_ca.cert_file,
            None,
            &Credential::cert(&alice),
        ),
    )?;
    let (ok, out, err) = kubectl(
        &kubeconfig,
        &["get", "resourceclaims.v1beta2.resource.k8s.io", "-A"],
    )
    .await?;
    assert!(ok, "{out}{err}");
    let metrics = control.get("/metrics").await?.1;
    assert!(metrics.contains("skewgate_control_ready 1"), "{metrics}");

    // The peer port passes TLS straight through to apiserver-a: no filter (v1beta2 is a's own
    // 404 there), the client's own handshake and ALPN, and the front-proxy identity a peer's
    // Envoy presents is authenticated by apiserver-a itself.
    let peer_url = format!("https://127.0.0.1:{peer_port}");
    let as_peer = pki.client(Some(&pki.front_proxy_client))?;
    let resp = as_peer
        .get(format!("{peer_url}{CLAIMS}"))
        .header("x-remote-user", "alice")
        .header("x-remote-group", "system:masters")
        .send()
        .await?;
    assert_eq!(
        resp.status().as_u16(),
        404,
        "not routed: no filter on the peer port"
    );
    assert_eq!(header(&resp, "x-sim-apiserver"), "apiserver-a");
    assert_eq!(header(&resp, "x-sim-authenticator"), "requestheader");
    assert_eq!(header(&resp, "x-sim-user"), "alice");
    assert_eq!(header(&resp, "x-sim-alpn"), "h2");
    let resp = plain
        .get(format!("{peer_url}{DEPLOYMENTS}"))
        .bearer_auth(bob.token)
        .send()
        .await?;
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(header(&resp, "x-sim-authenticator"), "token");
    eprintln!("TLS: the peer port passes TLS through to the apiserver (requestheader identity, h2 end to end)");

    // A 1.33 apiserver whose serving certificate is not from the peer CA (its lease and
    // address are fine): its discovery fails verification, so it is never routed to.
    let evil_serving = pki.serving_cert(&pki.evil_ca, "evil-serving")?;
    let evil = SimApiserver::start_with(SimOptions {
        tls_cert_file: Some(evil_serving.cert_file.clone()),
        tls_private_key_file: Some(evil_serving.key_file.clone()),
        ..shared("apiserver-evil", "k8s-1.33", &etcd).with_pki(&pki)
    })
    .await?;
    let evil_lease = evil.lease_name();
    let (skew, _) = eventually("the impostor is tried", Duration::from_secs(20), || async {
        let skew = control.skew().await?;
        let tried = skew["apiservers"].as_array().is_some_and(|l| {
            l.iter().any(|x| {
                x["id"] == evil_lease.as_str() && x["consecutive_failures"].as_u64() >= Some(1)
            })
        });
        Ok(tried.then_some(skew))
    })
    .await
    .with_context(|| control.log())?;
    assert!(
        skew["unrouted_peers"]
            .as_array()
            .is_some_and(|l| l.iter().any(|x| x["id"] == evil_lease.as_str())),
        "{skew:#}"
    );
    assert!(
        control
            .metric("apiserver_peer_discovery_sync_errors_total{type=\"connect\"}")
            .await?
            >= 1.0
    );
    assert_eq!(
        served_by(&control, ("resource.k8s.io", "v1beta2"), "resourceclaims").await?,
        vec![b.lease_name()]
    );
    for _ in 0..10 {
        let (status, echo) = get_echo(&with_cert, &envoy, CLAIMS, None).await?;
        assert_eq!(
            (status, echo.get("x-sim-apiserver").map(String::as_str)),
            (200, Some("apiserver-b"))
        );
    }
    eprintln!("TLS: a peer with a serving certificate from another CA is never routed to");
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

// ---------------------------------------------------------------------------------------------
// Benchmark (ignored; `scripts/bench lease-to-route` runs it): how long a Lease change takes to
// become a route in Envoy. Not a timed test: it asserts nothing about the numbers, it prints
// them.

/// The `p`-quantile (0..=1) of sorted `samples`, nearest rank.
fn quantile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn distribution(samples: &mut [Duration]) -> String {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    format!(
        "n={} p50={:.1}ms p90={:.1}ms p99={:.1}ms max={:.1}ms",
        samples.len(),
        ms(quantile(samples, 0.5)),
        ms(quantile(samples, 0.9)),
        ms(quantile(samples, 0.99)),
        ms(quantile(samples, 1.0)),
    )
}

/// Poll `CLAIMS` through `envoy` every 2 ms until `routed_to_b` says it is (or is no longer)
/// answered by apiserver-b; how long that took from `since`.
async fn until_route(envoy: &Envoy, routed_to_b: bool, since: Instant) -> Result<Duration> {
    let client = client();
    loop {
        let resp = client.get(url(envoy, CLAIMS)).send().await?;
        let by_b = resp.status() == 200 && header(&resp, "x-sim-apiserver") == "apiserver-b";
        if by_b == routed_to_b {
            return Ok(since.elapsed());
        }
        if since.elapsed() > Duration::from_secs(20) {
            bail!("the route did not follow the lease within 20 s");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Lease change → route in effect, for every control plane variant side by side: each variant
/// (`SKEWGATE_BENCH_CONTROLS=name=/path/to/skewgate-control,...`; default: this tree's binary)
/// runs its own control plane and Envoy beside the same apiservers, so every lease change is seen
/// by all of them at once and the samples are paired. A trial writes an identity Lease pointing
/// at apiserver-b (a 1.33 apiserver without a lease of its own) and waits until a peer-only
/// resource is answered by b through each Envoy ("join"), then deletes it and waits until it is
/// not ("leave", no API retention). `SKEWGATE_BENCH_TRIALS` trials (default 30).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: scripts/bench lease-to-route"]
async fn bench_lease_to_route() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let trials: usize = std::env::var("SKEWGATE_BENCH_TRIALS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(30);
    let variants: Vec<(String, Option<PathBuf>)> = match std::env::var("SKEWGATE_BENCH_CONTROLS") {
        Ok(list) => list
            .split(',')
            .map(|v| match v.split_once('=') {
                Some((name, path)) => Ok((name.to_string(), Some(PathBuf::from(path)))),
                None => bail!("SKEWGATE_BENCH_CONTROLS: `{v}` is not name=path"),
            })
            .collect::<Result<_>>()?,
        Err(_) => vec![("this tree".to_string(), None)],
    };
    let etcd = Etcd::start().await?;
    let dir = tempfile::tempdir()?;
    let a = SimApiserver::start_with(shared("apiserver-a", "k8s-1.30", &etcd)).await?;
    let b = SimApiserver::start_with(SimOptions {
        lease: false,
        ..shared("apiserver-b", "k8s-1.33", &etcd)
    })
    .await?;
    let mut stacks = Vec::new();
    for (i, (name, bin)) in variants.iter().enumerate() {
        let vdir = dir.path().join(format!("variant-{i}"));
        std::fs::create_dir_all(&vdir)?;
        let mut control = Control::new(&a, &vdir, &["--api-retention=0s", "--lease-grace=600s"])?;
        control.bin = bin.clone();
        control.start().await?;
        let envoy = live_envoy(&control, None, None).await?;
        eventually("ready", Duration::from_secs(30), || async {
            Ok(control.ready().await.then_some(()))
        })
        .await?;
        // Envoy's listener opens with the first filter configuration.
        eventually("Envoy serves", Duration::from_secs(30), || async {
            Ok(get(&envoy, CLAIMS).await.ok().map(|_| ()))
        })
        .await?;
        until_route(&envoy, false, Instant::now()).await?;
        stacks.push((name.clone(), control, envoy, Vec::new(), Vec::new()));
    }

    let leases = format!("{}{LEASES}", a.url());
    let address = format!("{}:{}", b.address.host, b.address.port);
    for trial in 0..trials {
        let own: serde_json::Value = client()
            .get(format!("{leases}/{}", a.lease_name()))
            .send()
            .await?
            .json()
            .await?;
        let name = format!("apiserver-bench-{trial:03}");
        let lease = forged_lease(&name, &address, &own["spec"]["renewTime"]);
        let written = Instant::now();
        let resp = client().post(&leases).json(&lease).send().await?;
        if resp.status() != 201 {
            bail!("creating a lease: {}", resp.text().await?);
        }
        let joins = futures_util::future::join_all(
            stacks
                .iter()
                .map(|(_, _, envoy, _, _)| until_route(envoy, true, written)),
        )
        .await;
        let deleted = Instant::now();
        let resp = client().delete(format!("{leases}/{name}")).send().await?;
        if resp.status() != 200 {
            bail!("deleting a lease: {}", resp.text().await?);
        }
        let leaves = futures_util::future::join_all(
            stacks
                .iter()
                .map(|(_, _, envoy, _, _)| until_route(envoy, false, deleted)),
        )
        .await;
        for ((stack, join), leave) in stacks.iter_mut().zip(joins).zip(leaves) {
            stack.3.push(join.with_context(|| stack.1.log())?);
            stack.4.push(leave.with_context(|| stack.1.log())?);
        }
        // Quiet between trials: each one starts from a settled control plane.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for (name, _, _, joins, leaves) in &mut stacks {
        println!("lease-to-route [{name}] join:  {}", distribution(joins));
        println!("lease-to-route [{name}] leave: {}", distribution(leaves));
    }
    if std::env::var_os("SKEWGATE_BENCH_LOGS").is_some() {
        for (name, control, _, _, _) in &stacks {
            println!("---- control plane log [{name}]\n{}", control.log());
        }
    }
    Ok(())
}
