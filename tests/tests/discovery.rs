//! Peer-aggregated discovery through real Envoy, checked with real clients: kubectl 1.37
//! (aggregated v2), Debian's kubectl 1.20 (legacy discovery only) and raw HTTP. A 1.30
//! apiserver is behind Envoy with a 1.33 peer; the expected unions are computed here, straight
//! from the fixture files, independently of skewgate's merge code.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::Value;
use skewgate_control::envoy::resources::DataPlane;
use skewgate_tests::{
    data_plane, fixture, kubectl, kubectl_1_20_bin, kubectl_with, mixed_cluster, Envoy,
    EnvoyOptions, PeerSpec, SimApiserver,
};

const V2: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
const V2BETA1: &str = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// (group, version, resource) of every top-level resource a fixture serves, core included.
fn gvrs(fixture_name: &str) -> BTreeSet<(String, String, String)> {
    let dir = fixture(fixture_name);
    let mut out = BTreeSet::new();
    let apis = read_json(&dir.join("aggregated_v2.json"));
    for group in apis["items"].as_array().unwrap() {
        let g = group["metadata"]["name"].as_str().unwrap();
        for version in group["versions"].as_array().unwrap() {
            let v = version["version"].as_str().unwrap();
            for r in version["resources"].as_array().unwrap() {
                out.insert((g.into(), v.into(), r["resource"].as_str().unwrap().into()));
            }
        }
    }
    let core = read_json(&dir.join("api__v1.json"));
    for r in core["resources"].as_array().unwrap() {
        let name = r["name"].as_str().unwrap();
        if !name.contains('/') {
            out.insert((String::new(), "v1".into(), name.into()));
        }
    }
    out
}

fn union() -> BTreeSet<(String, String, String)> {
    gvrs("k8s-1.30").union(&gvrs("k8s-1.33")).cloned().collect()
}

/// `kubectl api-resources -o name` spelling: `pods`, `deployments.apps`.
fn resource_names(gvrs: &BTreeSet<(String, String, String)>) -> BTreeSet<String> {
    gvrs.iter()
        .map(|(g, _, r)| {
            if g.is_empty() {
                r.clone()
            } else {
                format!("{r}.{g}")
            }
        })
        .collect()
}

fn lines(out: &str) -> BTreeSet<String> {
    out.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

#[tokio::test]
async fn kubectl_api_resources_and_api_versions_list_the_union() -> Result<()> {
    let (_a, _b, envoy) = mixed_cluster().await?;
    let kubeconfig = envoy.kubeconfig()?;
    let expected = resource_names(&union());
    // The union is strictly more than either side: the test would catch a local-only answer.
    assert!(expected.len() > resource_names(&gvrs("k8s-1.30")).len());
    assert!(expected.len() > resource_names(&gvrs("k8s-1.33")).len());

    let (ok, out, err) = kubectl(&kubeconfig, &["api-resources", "-o", "name"]).await?;
    assert!(ok, "{err}");
    assert_eq!(lines(&out), expected);

    let (ok, out, err) = kubectl(&kubeconfig, &["api-versions"]).await?;
    assert!(ok, "{err}");
    let versions: BTreeSet<String> = union()
        .iter()
        .map(|(g, v, _)| {
            if g.is_empty() {
                v.clone()
            } else {
                format!("{g}/{v}")
            }
        })
        .collect();
    assert_eq!(lines(&out), versions);

    // The preferred version of resource.k8s.io stays the local (1.30) apiserver's, v1alpha2,
    // though the 1.33 peer serves newer ones; a resource only the peer serves comes from the
    // next version in the merged order, the peer's newest (v1beta2).
    let (ok, out, err) = kubectl(
        &kubeconfig,
        &["api-resources", "--api-group=resource.k8s.io", "-o", "wide"],
    )
    .await?;
    assert!(ok, "{err}");
    let line = |resource: &str| {
        out.lines()
            .find(|l| l.starts_with(&format!("{resource} ")))
            .unwrap_or_default()
            .to_owned()
    };
    assert!(
        line("resourceclaims").contains("resource.k8s.io/v1alpha2"),
        "{out}"
    );
    assert!(
        line("deviceclasses").contains("resource.k8s.io/v1beta2"),
        "{out}"
    );
    Ok(())
}

#[tokio::test]
async fn kubectl_gets_every_peer_only_resource_by_name() -> Result<()> {
    let (_a, _b, envoy) = mixed_cluster().await?;
    let kubeconfig = envoy.kubeconfig()?;
    let peer_only: Vec<_> = gvrs("k8s-1.33")
        .difference(&gvrs("k8s-1.30"))
        .cloned()
        .collect();
    assert_eq!(
        peer_only.len(),
        23,
        "PROVENANCE.md counts 23 GVRs only 1.33 serves"
    );
    for (g, v, r) in peer_only {
        let name = format!("{r}.{v}.{g}");
        let (ok, out, err) = kubectl(&kubeconfig, &["get", &name, "-A"]).await?;
        assert!(ok, "kubectl get {name}: {out}{err}");
    }
    // And a created object comes back from the peer through the resolved name.
    let manifest = envoy.dir.path().join("claim.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: resource.k8s.io/v1beta2\nkind: ResourceClaim\nmetadata:\n  name: by-name\n  namespace: default\nspec: {}\n",
    )?;
    let (ok, out, err) =
        kubectl(&kubeconfig, &["create", "-f", &manifest.to_string_lossy()]).await?;
    assert!(ok, "{out}{err}");
    let (ok, out, err) = kubectl(
        &kubeconfig,
        &[
            "get",
            "resourceclaims.v1beta2.resource.k8s.io",
            "by-name",
            "-n",
            "default",
            "-o",
            "json",
        ],
    )
    .await?;
    assert!(ok, "{err}");
    let object: Value = serde_json::from_str(&out)?;
    assert_eq!(
        object["metadata"]["annotations"]["skewgate.test/served-by"],
        "apiserver-b"
    );
    Ok(())
}

#[tokio::test]
async fn nopeer_returns_the_local_document_byte_for_byte() -> Result<()> {
    let (_a, _b, envoy) = mixed_cluster().await?;
    let client = reqwest::Client::new();
    let local = std::fs::read(fixture("k8s-1.30").join("aggregated_v2.json"))?;
    let resp = client
        .get(format!("{}/apis", envoy.url()))
        .header(
            "accept",
            format!("{V2};profile=nopeer,{V2},application/json"),
        )
        .send()
        .await?;
    assert_eq!(resp.headers()["x-sim-apiserver"], "apiserver-a");
    assert_eq!(resp.bytes().await?.as_ref(), local.as_slice());

    // Without nopeer: the merged document with kube's headers, once the local apiserver has
    // authorized the request.
    let resp = client
        .get(format!("{}/apis", envoy.url()))
        .header("accept", format!("{V2},application/json"))
        .send()
        .await?;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-sim-apiserver"], "apiserver-a");
    assert_eq!(resp.headers()["content-type"], V2);
    assert_eq!(resp.headers()["vary"], "Accept");
    assert_eq!(resp.headers()["cache-control"], "public");
    let etag = resp.headers()["etag"].to_str()?.to_string();
    assert!(etag.starts_with('"') && etag.ends_with('"'), "{etag}");
    let merged: Value = resp.json().await?;
    assert_eq!(merged["apiVersion"], "apidiscovery.k8s.io/v2");

    // Revalidation.
    let resp = client
        .get(format!("{}/apis", envoy.url()))
        .header("accept", V2)
        .header("if-none-match", &etag)
        .send()
        .await?;
    assert_eq!(resp.status(), 304);
    // HEAD.
    let resp = client
        .head(format!("{}/apis", envoy.url()))
        .header("accept", V2)
        .send()
        .await?;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["etag"].to_str()?, etag);
    // v2beta1-only clients (client-go 1.26-1.29) get the same union as v2beta1.
    let resp = client
        .get(format!("{}/apis", envoy.url()))
        .header("accept", V2BETA1)
        .send()
        .await?;
    assert_eq!(resp.headers()["content-type"], V2BETA1);
    let beta: Value = resp.json().await?;
    assert_eq!(beta["apiVersion"], "apidiscovery.k8s.io/v2beta1");
    assert_eq!(beta["items"], merged["items"]);
    Ok(())
}

#[tokio::test]
async fn kubectl_1_20_sees_the_union_through_legacy_discovery() -> Result<()> {
    let (_a, _b, envoy) = mixed_cluster().await?;
    let kubeconfig = envoy.kubeconfig()?;
    let old = kubectl_1_20_bin()?;
    let (ok, out, err) = kubectl_with(&old, &kubeconfig, &["api-resources", "-o", "name"]).await?;
    assert!(ok, "{err}");
    assert_eq!(lines(&out), resource_names(&union()));
    let (ok, out, err) = kubectl_with(
        &old,
        &kubeconfig,
        &["get", "resourceclaims.v1beta2.resource.k8s.io", "-A"],
    )
    .await?;
    assert!(ok, "{out}{err}");
    Ok(())
}

#[tokio::test]
async fn a_merged_document_over_envoys_buffer_limit_is_served_whole() -> Result<()> {
    // 4500 CRD groups (served by the local apiserver, so the legacy documents stay its own):
    // the merged /apis is well over Envoy's 1 MiB buffer limit.
    let dir = tempfile::tempdir()?;
    let base = fixture("k8s-1.30");
    for f in ["api.json", "api__v1.json"] {
        std::fs::copy(base.join(f), dir.path().join(f))?;
    }
    let mut apis = read_json(&base.join("aggregated_v2.json"));
    let items = apis["items"].as_array_mut().expect("items");
    for i in 0..4500 {
        items.push(serde_json::json!({
            "metadata": {"name": format!("group{i}.example.com")},
            "versions": [{"version": "v1", "freshness": "Current", "resources": [{
                "resource": format!("widgets{i}"), "scope": "Namespaced",
                "singularResource": format!("widget{i}"),
                "responseKind": {"group": "", "version": "", "kind": format!("Widget{i}")},
                "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}]}]
        }));
    }
    std::fs::write(
        dir.path().join("aggregated_v2.json"),
        serde_json::to_vec(&apis)?,
    )?;

    let a = SimApiserver::start("apiserver-a", &dir.path().to_string_lossy()).await?;
    let b = SimApiserver::start("apiserver-b", "k8s-1.33").await?;
    let envoy = Envoy::start(&a, &[&b]).await?;
    let client = reqwest::Client::builder().no_gzip().build()?;
    for round in 0..2 {
        let resp = client
            .get(format!("{}/apis", envoy.url()))
            .header("accept", V2)
            .send()
            .await?;
        assert_eq!(resp.status(), 200, "round {round}");
        let body = resp.bytes().await?;
        assert!(body.len() > 1 << 20, "round {round}: {} bytes", body.len());
        let merged: Value = serde_json::from_slice(&body)?;
        let groups = merged["items"].as_array().map(Vec::len).unwrap_or(0);
        assert!(groups > 4500, "round {round}: {groups} groups");
    }
    // Compressed for clients that accept it.
    let resp = client
        .get(format!("{}/apis", envoy.url()))
        .header("accept", V2)
        .header("accept-encoding", "gzip")
        .send()
        .await?;
    assert_eq!(resp.headers()["content-encoding"], "gzip");
    assert!(resp.bytes().await?.len() < 1 << 20);
    assert!(!envoy.log().contains("panicked"), "{}", envoy.log());
    Ok(())
}

/// Issue 18: the `/openapi/v3` union is the one body the filter buffers, and it replaces the
/// buffered local root, so it must stay below Envoy's buffer limit (1 MiB) whatever the
/// configuration: here the control plane's limit of 4096 peer-only entries, each with the
/// longest URL allowed (about 5 MiB of entries). Through real Envoy, over HTTP/1.1 and HTTP/2,
/// the union is valid JSON of at most `MAX_UNION_BYTES`, keeps every local entry and adds the
/// peer entries that fit, in path order; Envoy keeps serving.
#[tokio::test]
async fn the_openapi_union_at_the_entry_limit_stays_under_envoys_buffer_limit() -> Result<()> {
    use skewgate_control::discovery::openapi::OpenApiRoot;
    use skewgate_control::discovery::APIGroupDiscovery;
    use skewgate_core::openapi::{MAX_ENTRIES, MAX_UNION_BYTES, MAX_URL};

    let a = SimApiserver::start("apiserver-a", "k8s-1.30").await?;
    let b = SimApiserver::start("apiserver-b", "k8s-1.33").await?;
    // The peer serves 4096 more group-versions and lists each in its `/openapi/v3`.
    let mut peer = PeerSpec::of(&b)?;
    let mut paths = BTreeMap::new();
    for i in 0..MAX_ENTRIES {
        let group = format!("g{i:04}.example.com");
        peer.documents
            .apis
            .items
            .push(serde_json::from_value::<APIGroupDiscovery>(
                serde_json::json!({
                    "metadata": {"name": group},
                    "versions": [{"version": "v1", "freshness": "Current", "resources": [{
                        "resource": "widgets", "scope": "Namespaced", "singularResource": "widget",
                        "responseKind": {"group": group, "version": "v1", "kind": "Widget"},
                        "verbs": ["get", "list"]}]}]
                }),
            )?);
        let path = format!("apis/{group}/v1");
        let url = format!("/openapi/v3/{path}?hash=");
        let hash = "A".repeat(MAX_URL - url.len());
        paths.insert(path, format!("{url}{hash}"));
    }
    peer.documents.openapi = Some(OpenApiRoot { paths });
    let envoy = Envoy::start_with(&a, vec![peer], EnvoyOptions::default()).await?;
    let entries = &envoy.plan.as_ref().context("plan")?.config.openapi_v3;
    assert_eq!(entries.len(), MAX_ENTRIES);

    let local: Value = reqwest::get(format!("{}/openapi/v3", a.url()))
        .await?
        .json()
        .await?;
    let local_paths = local["paths"].as_object().context("local paths")?;
    for http2 in [false, true] {
        let client = if http2 {
            reqwest::Client::builder().http2_prior_knowledge().build()?
        } else {
            reqwest::Client::builder().http1_only().build()?
        };
        let resp = client
            .get(format!("{}/openapi/v3", envoy.url()))
            .send()
            .await?;
        assert_eq!(resp.status(), 200, "http2={http2}: {}", envoy.log());
        let body = resp.bytes().await?;
        assert!(
            body.len() <= MAX_UNION_BYTES,
            "http2={http2}: {} bytes",
            body.len()
        );
        let union: Value = serde_json::from_slice(&body)?;
        let paths = union["paths"].as_object().context("paths")?;
        for (path, entry) in local_paths {
            assert_eq!(paths.get(path), Some(entry), "http2={http2}: {path}");
        }
        let added: Vec<&String> = paths
            .keys()
            .filter(|p| !local_paths.contains_key(*p))
            .collect();
        assert!(
            !added.is_empty() && added.len() < MAX_ENTRIES,
            "http2={http2}: {} peer entries",
            added.len()
        );
        let first: Vec<&String> = entries.keys().take(added.len()).collect();
        assert_eq!(
            added, first,
            "http2={http2}: the first entries in path order"
        );
        for path in &added {
            assert_eq!(
                paths[path.as_str()]["serverRelativeURL"],
                entries[path.as_str()].server_relative_url.as_str()
            );
        }
    }
    let version = reqwest::get(format!("{}/version", envoy.url())).await?;
    assert_eq!(version.status(), 200, "{}", envoy.log());
    assert!(!envoy.log().contains("panicked"), "{}", envoy.log());
    Ok(())
}

/// The scale target: 10,000 CRD resources (1,667 groups of 6, each with a status
/// subresource, listed as kube-apiserver lists a CRD) make a merged `/apis` of about 5 MB, more
/// than a configuration could carry before the documents were kept once per Envoy process.
/// Envoy runs two workers: every discovery answer, on whichever worker, must be the exact
/// merged document of the configuration, and routing must work beside it.
#[tokio::test]
async fn ten_thousand_crd_resources_are_served_whole_on_every_worker_from_one_shared_copy(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let base = fixture("k8s-1.30");
    for f in ["api.json", "api__v1.json"] {
        std::fs::copy(base.join(f), dir.path().join(f))?;
    }
    let mut apis = read_json(&base.join("aggregated_v2.json"));
    let items = apis["items"].as_array_mut().expect("items");
    for g in 0..1667 {
        let group = format!("crd-{g}.bench.example.com");
        let resources: Vec<Value> = (0..6)
            .map(|r| {
                let kind = serde_json::json!({"group": group, "version": "v1", "kind": format!("Widget{r}")});
                serde_json::json!({
                    "resource": format!("widget{r}s"), "responseKind": kind, "scope": "Namespaced",
                    "singularResource": format!("widget{r}"),
                    "verbs": ["delete", "deletecollection", "get", "list", "patch", "create", "update", "watch"],
                    "shortNames": [format!("w{r}")], "categories": ["all"],
                    "subresources": [{"subresource": "status", "responseKind": kind, "verbs": ["get", "patch", "update"]}]
                })
            })
            .collect();
        items.push(serde_json::json!({
            "metadata": {"name": group, "creationTimestamp": null},
            "versions": [{"version": "v1", "freshness": "Current", "resources": resources}]
        }));
    }
    std::fs::write(
        dir.path().join("aggregated_v2.json"),
        serde_json::to_vec(&apis)?,
    )?;

    let a = SimApiserver::start("apiserver-a", &dir.path().to_string_lossy()).await?;
    let b = SimApiserver::start("apiserver-b", "k8s-1.33").await?;
    let envoy = Envoy::start(&a, &[&b]).await?;
    let config = &envoy.plan.as_ref().expect("a static plan").config;
    let discovery = config.discovery.as_ref().expect("merged discovery");
    assert!(
        discovery.apis.get().len() > 4_500_000,
        "{} bytes",
        discovery.apis.get().len()
    );
    let apis_v2 = discovery.apis.get().as_bytes();
    let apis_v2beta1 = discovery.apis.get().replacen(
        "\"apiVersion\":\"apidiscovery.k8s.io/v2\"",
        "\"apiVersion\":\"apidiscovery.k8s.io/v2beta1\"",
        1,
    );
    let legacy_apis = discovery.legacy.get("/apis").expect("legacy /apis").get();
    let etag = format!("\"{}\"", discovery.apis_etag);

    // (path, Accept, gzip, expected body): a new client per request is a new connection, which
    // Envoy hands to either worker.
    let cases: [(&str, &str, bool, &[u8]); 6] = [
        ("/apis", V2, false, apis_v2),
        ("/apis", V2, true, apis_v2),
        ("/apis", V2BETA1, true, apis_v2beta1.as_bytes()),
        ("/api", V2, false, discovery.api.get().as_bytes()),
        ("/apis", "application/json", false, legacy_apis.as_bytes()),
        ("/apis", "application/json", true, legacy_apis.as_bytes()),
    ];
    for round in 0..4 {
        for (path, accept, gzip, want) in cases {
            let client = reqwest::Client::builder().no_gzip().build()?;
            let mut request = client
                .get(format!("{}{path}", envoy.url()))
                .header("accept", accept);
            if gzip {
                request = request.header("accept-encoding", "gzip");
            }
            let resp = request.send().await?;
            let what = format!("round {round}: {path} {accept} gzip={gzip}");
            assert_eq!(resp.status(), 200, "{what}");
            let gzipped = resp
                .headers()
                .get("content-encoding")
                .is_some_and(|v| v == "gzip");
            assert_eq!(gzipped, gzip && want.len() >= 128 * 1024, "{what}");
            if path == "/apis" && accept == V2 {
                assert_eq!(resp.headers()["etag"].to_str()?, etag, "{what}");
            }
            let body = resp.bytes().await?;
            let body = if gzipped {
                skewgate_core::gzip::decompress(&body).expect("gzip")
            } else {
                body.to_vec()
            };
            assert!(
                body == want,
                "{what}: {} bytes, expected {}",
                body.len(),
                want.len()
            );
        }
    }
    // Routing beside it: a peer-only resource goes to the peer, a CRD's to the local apiserver.
    let client = reqwest::Client::new();
    for (path, server) in [
        (
            "/apis/resource.k8s.io/v1beta2/namespaces/default/resourceclaims",
            "apiserver-b",
        ),
        (
            "/apis/crd-1666.bench.example.com/v1/namespaces/default/widget5s",
            "apiserver-a",
        ),
    ] {
        let resp = client.get(format!("{}{path}", envoy.url())).send().await?;
        assert_eq!(resp.headers()["x-sim-apiserver"], server, "{path}");
    }
    // One copy for the whole Envoy. The proxy-wasm filter: one VM read the documents and
    // published them, the others (the main thread's and both workers') took them from shared
    // data. The native filter: the configuration, and the documents in it, are compiled once
    // per Envoy and every worker reads that one.
    // (Envoy flushes its log file every few seconds: wait for the lines, bounded.)
    let native = data_plane()? == DataPlane::Native;
    let counts = |log: &str| {
        (
            log.matches("(published to shared data)").count(),
            log.matches(" (shared)").count(),
            log.matches("(held once by this Envoy)").count(),
        )
    };
    let enough = |(published, shared, held): (usize, usize, usize)| {
        if native {
            held == 1
        } else {
            published >= 1 && shared >= 2
        }
    };
    let mut log = envoy.log();
    for _ in 0..150 {
        if enough(counts(&log)) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        log = envoy.log();
    }
    let (published, shared, held) = counts(&log);
    assert!(
        enough((published, shared, held)),
        "published {published}, shared {shared}, held once {held}:\n{log}"
    );
    assert!(!log.contains("panicked"), "{log}");
    Ok(())
}
