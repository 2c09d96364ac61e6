//! The simulator's suites on the documents captured from real kube-apiservers 1.36.3 and 1.37.2
//! (`tests/fixtures/discovery/k8s-1.3{6,7}`, held to the real binaries by
//! `tests/tests/conformance.rs`), beside the 1.30/1.33 pair the other suites use: a 1.36
//! apiserver behind real Envoy with its 1.37 peer, and real kubectl and the Python client on the
//! merged discovery. What 1.37 adds by default: a whole group-version
//! (`storagemigration.k8s.io/v1`), and kinds inside group-versions both serve
//! (`certificates.k8s.io/v1` clustertrustbundles and podcertificaterequests, `resource.k8s.io/v1`
//! devicetaintrules) — the case the 1.30/1.33 pair has only for core `pods/resize`.

use std::process::Stdio;

use anyhow::{Context, Result};
use serde_json::Value;
use skewgate_tests::{client, header, kubectl, python_bin, repo_root, Envoy, SimApiserver};
use tokio::process::Command;

/// The ClusterTrustBundle of the real suites, as JSON.
fn bundle(name: &str) -> Result<Value> {
    let yaml =
        std::fs::read_to_string(repo_root().join("tests/compose/real/clustertrustbundle.yaml"))?;
    let pem_start = yaml.find("-----BEGIN").context("no PEM")?;
    let pem: String = yaml[pem_start..]
        .lines()
        .map(|l| format!("{}\n", l.trim()))
        .collect();
    Ok(serde_json::json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "ClusterTrustBundle",
        "metadata": {"name": name},
        "spec": {"trustBundle": pem},
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1_36_apiserver_behind_envoy_serves_what_its_1_37_peer_adds() -> Result<()> {
    let a = SimApiserver::start("apiserver-a", "k8s-1.36").await?;
    let b = SimApiserver::start("apiserver-b", "k8s-1.37").await?;
    let envoy = Envoy::start(&a, &[&b]).await?;
    let kubeconfig = envoy.kubeconfig()?;

    // kubectl's discovery is the union.
    let (ok, out, err) = kubectl(&kubeconfig, &["api-resources", "--no-headers"]).await?;
    assert!(ok, "{err}");
    for kind in [
        "clustertrustbundles",
        "podcertificaterequests",
        "storageversionmigrations",
        "devicetaintrules",
        "certificatesigningrequests",
    ] {
        assert!(
            out.lines().any(|l| l.starts_with(&format!("{kind} "))),
            "{kind} missing:\n{out}"
        );
    }

    // A 1.37 kind in a group-version both serve, created by kubectl through Envoy: the peer
    // stores it; its neighbour of the same group-version stays local.
    let file = envoy.dir.path().join("bundle.json");
    std::fs::write(&file, serde_json::to_vec(&bundle("through-envoy")?)?)?;
    let (ok, out, err) = kubectl(
        &kubeconfig,
        &["create", "-f", &file.display().to_string(), "-o", "json"],
    )
    .await?;
    assert!(ok, "{err}");
    let created: Value = serde_json::from_str(&out)?;
    assert_eq!(
        created["metadata"]["annotations"]["skewgate.test/served-by"], "apiserver-b",
        "{created}"
    );
    let http = client();
    for (path, server) in [
        (
            "/apis/certificates.k8s.io/v1/clustertrustbundles/through-envoy",
            "apiserver-b",
        ),
        (
            "/apis/storagemigration.k8s.io/v1/storageversionmigrations",
            "apiserver-b",
        ),
        (
            "/apis/certificates.k8s.io/v1/certificatesigningrequests",
            "apiserver-a",
        ),
    ] {
        let r = http.get(format!("{}{path}", envoy.url())).send().await?;
        assert_eq!(
            (r.status().as_u16(), header(&r, "x-sim-apiserver")),
            (200, server.to_string()),
            "{path}"
        );
    }
    // Straight to the 1.36 apiserver the kind does not exist: kube's generic NotFound.
    let r = http
        .get(format!(
            "{}/apis/certificates.k8s.io/v1/clustertrustbundles",
            a.url()
        ))
        .send()
        .await?;
    assert_eq!(r.status().as_u16(), 404);
    let body: Value = r.json().await?;
    assert_eq!(body["reason"], "NotFound", "{body}");

    // The Python client (legacy discovery, /apis/<group>/<version> merged): a
    // PodCertificateRequest, namespaced.
    let manifest = envoy.dir.path().join("pcr.json");
    let output = Command::new(python_bin()?)
        .arg("-c")
        .arg("import json, sys, yaml; m = yaml.safe_load(open(sys.argv[1])); m['metadata']['name'] = 'python'; print(json.dumps(m))")
        .arg(repo_root().join("tests/compose/real/podcertificaterequest.yaml"))
        .output()
        .await?;
    std::fs::write(&manifest, &output.stdout)?;
    let out = Command::new(python_bin()?)
        .arg(repo_root().join("tests/python/dynamic_client.py"))
        .arg(&kubeconfig)
        .arg(envoy.dir.path().join("python-cache.json"))
        .arg(&manifest)
        .stdin(Stdio::null())
        .output()
        .await?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: Value = serde_json::from_str(text.trim())?;
    assert_eq!(result["got"]["kind"], "PodCertificateRequest", "{result}");
    assert_eq!(result["got"]["served_by"], "apiserver-b", "{result}");
    assert_eq!(result["listed"], serde_json::json!(["python"]), "{result}");
    Ok(())
}
