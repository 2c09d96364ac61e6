//! OpenAPI v3 of a kind only a peer serves, in the live mode (the harness:
//! `skewgate_tests::live`): a real etcd, simulated apiservers that keep identity Leases in it
//! and serve kube's real OpenAPI documents, the real `skewgate-control run` binary as a child
//! process, real Envoy 1.40 on the bootstrap `skewgate-control bootstrap` prints, loading the
//! release `skewgate_filter.wasm`, and real kubectl: `kubectl explain` and `apply` of a kind
//! only the 1.33 peer serves, and a peer's document never reaching kubectl's cache.
//!
//! The scenarios run one at a time (the machine is small). Set `SKEWGATE_TEST_LOGS=1` to see
//! the simulators' logs; the control plane's log is printed when an assertion fails.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use skewgate_tests::live::*;
use skewgate_tests::{client, eventually, header, kubectl, repo_root, Etcd, SimApiserver};

// ---------------------------------------------------------------------------------------------
// Scenarios.

/// The group-version of LeaseCandidate, which the 1.33 peer serves and the 1.30 local
/// apiserver does not.
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
    // The peer's entry, exactly; every local entry the local apiserver's own, but where the
    // peer serves every kind of that group-version and more (networking.k8s.io/v1: 1.33 adds
    // ipaddresses and servicecidrs), which is the peer's; nothing else but group-versions only
    // the peer serves.
    assert_eq!(root["paths"][LEASE_CANDIDATES], peer_entry);
    let paths = root["paths"].as_object().context("paths")?;
    let (ours, theirs) = (a.served()?, b.served()?);
    let kinds = |served: &skewgate_control::discovery::ServedApis, path: &str| {
        let gv = skewgate_core::openapi::group_version_of(path)?;
        let keys = served.resources(&gv.group, &gv.version)?;
        Some(
            keys.iter()
                .filter(|k| !k.contains('/'))
                .cloned()
                .collect::<std::collections::BTreeSet<_>>(),
        )
    };
    let mut replaced = Vec::new();
    for (path, entry) in local_root["paths"].as_object().context("local paths")? {
        let peer_has_more = match (kinds(&ours, path), kinds(&theirs, path)) {
            (Some(o), Some(t)) => t.len() > o.len() && t.is_superset(&o),
            _ => false,
        };
        if peer_has_more {
            assert_eq!(
                paths.get(path),
                peer_root["paths"].get(path),
                "{path}: the peer's entry"
            );
            replaced.push(path.clone());
        } else {
            assert_eq!(paths.get(path), Some(entry), "{path}: the local entry");
        }
    }
    assert_eq!(
        replaced,
        ["apis/networking.k8s.io/v1"],
        "replaced local entries"
    );
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
