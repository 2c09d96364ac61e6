//! A third real client: the Python Kubernetes client (PyPI `kubernetes`, installed into
//! `.tools/venv` by `scripts/setup`). Its `DynamicClient` finds a kind through legacy discovery
//! (`/apis`, `/apis/<group>/<version>`), like kubectl 1.20 and unlike kubectl 1.37 (aggregated).
//! Behind Envoy a 1.30 apiserver, whose 1.33 peer alone serves resource.k8s.io/v1beta2: the
//! client creates, lists and gets a ResourceClaim through skewgate, and the same script fails
//! straight against the 1.30 apiserver, so the test cannot pass without skewgate.

use std::path::Path;
use std::process::Stdio;

use anyhow::{Context, Result};
use serde_json::Value;
use skewgate_tests::{kubeconfig_yaml, mixed_cluster, python_bin, repo_root};
use tokio::process::Command;

/// `tests/python/dynamic_client.py` against `kubeconfig`, creating the ResourceClaim `name`
/// (resource.k8s.io/v1beta2, in `default`): (exit code, stdout, stderr).
async fn dynamic_client(kubeconfig: &Path, name: &str) -> Result<(i32, String, String)> {
    let script = repo_root().join("tests/python/dynamic_client.py");
    // The client caches discovery in a file (by default one per server under /tmp): one per run.
    let cache = kubeconfig.with_extension("discovery.json");
    let manifest = kubeconfig.with_extension(format!("{name}.json"));
    let claim = serde_json::json!({
        "apiVersion": "resource.k8s.io/v1beta2",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}
        ]}},
    });
    std::fs::write(&manifest, serde_json::to_vec(&claim)?)?;
    let out = Command::new(python_bin()?)
        .arg(&script)
        .arg(kubeconfig)
        .arg(&cache)
        .arg(&manifest)
        .stdin(Stdio::null())
        .output()
        .await
        .context("running the Python client")?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

#[tokio::test]
async fn the_python_dynamic_client_lists_and_gets_a_peer_only_resource_through_envoy() -> Result<()>
{
    let (a, _b, envoy) = mixed_cluster().await?;

    // Straight to the 1.30 apiserver: its discovery has no resource.k8s.io/v1beta2.
    let direct = envoy.dir.path().join("direct.kubeconfig");
    std::fs::write(&direct, kubeconfig_yaml(&a.url()))?;
    let (code, out, err) = dynamic_client(&direct, "direct-claim").await?;
    assert_eq!(
        code, 3,
        "without skewgate the kind must be unknown: {out}{err}"
    );
    assert!(err.contains("ResourceNotFoundError"), "{err}");

    // Through Envoy: discovery is the union, and the requests reach the 1.33 peer.
    let (code, out, err) = dynamic_client(&envoy.kubeconfig()?, "py-claim").await?;
    assert_eq!(code, 0, "through skewgate: {out}{err}");
    let result: Value = serde_json::from_str(out.trim()).with_context(|| out.clone())?;
    eprintln!(
        "Python kubernetes {} through Envoy: {result}",
        result["client_version"]
    );
    assert_eq!(
        result["listed"],
        serde_json::json!(["py-claim"]),
        "{result}"
    );
    assert_eq!(result["got"]["name"], "py-claim", "{result}");
    assert_eq!(result["got"]["kind"], "ResourceClaim", "{result}");
    assert_eq!(result["got"]["served_by"], "apiserver-b", "{result}");
    Ok(())
}
