//! `real-fixtures`: captures the documents of real kube-apiservers into `tests/fixtures/`, for
//! the simulator and the tests (`tests/fixtures/discovery/PROVENANCE.md` says how and when):
//!
//! | what | file |
//! | --- | --- |
//! | aggregated `/apis` (apidiscovery.k8s.io/v2) | `discovery/k8s-<release>/aggregated_v2.json` |
//! | legacy `/api` and `/api/v1` | `discovery/k8s-<release>/api.json`, `api__v1.json` |
//! | OpenAPI v3 of the group-versions the releases serve differently | `openapi/k8s-<release>/apis__<group>__<version>_openapi.json` |
//! | the identity Lease | `leases/k8s-<release>.json` |
//!
//! Each release's kube-apiserver (`tests/kube/build`) runs alone on loopback with kubeadm's
//! flags and its defaults (no `--runtime-config`), on etcd 3.6; the documents are written as
//! it served them, byte for byte.
//!
//!     cargo run -p skewgate-tests --bin real-fixtures [-- RELEASE...]

use std::path::Path;

use anyhow::{bail, Context, Result};
use skewgate_tests::real::{real_client, RealApiserver, RealOptions, REAL_RELEASES};
use skewgate_tests::{repo_root, Etcd, Subject, TestPki};

const AGGREGATED: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
/// The group-versions whose OpenAPI documents are kept: where 1.36 and 1.37 differ.
const OPENAPI: [&str; 2] = [
    "apis/certificates.k8s.io/v1",
    "apis/storagemigration.k8s.io/v1",
];

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let releases: Vec<&str> = if args.is_empty() {
        REAL_RELEASES.to_vec()
    } else {
        args.iter().map(String::as_str).collect()
    };
    let fixtures = repo_root().join("tests/fixtures");
    for release in releases {
        if !REAL_RELEASES.contains(&release) {
            bail!("{release}: not one of {REAL_RELEASES:?}");
        }
        let pki = TestPki::generate()?;
        let etcd = Etcd::start_real().await?;
        let apiserver = RealApiserver::start(&RealOptions::new(release, &etcd), &pki).await?;
        let admin = pki.client_cert(
            "admin",
            &Subject::new().cn("kubernetes-admin").o("system:masters"),
        )?;
        let client = real_client(&pki, Some(&admin))?;
        let get = |path: String, accept: &'static str| {
            let client = client.clone();
            let url = format!("{}{path}", apiserver.url());
            async move {
                let response = client.get(&url).header("Accept", accept).send().await?;
                if response.status() != 200 {
                    bail!("GET {url}: {}", response.status());
                }
                Ok::<_, anyhow::Error>(response.bytes().await?.to_vec())
            }
        };
        let dir = fixtures.join("discovery").join(format!("k8s-{release}"));
        write(
            &dir.join("aggregated_v2.json"),
            &get("/apis".into(), AGGREGATED).await?,
        )?;
        write(
            &dir.join("api.json"),
            &get("/api".into(), "application/json").await?,
        )?;
        write(
            &dir.join("api__v1.json"),
            &get("/api/v1".into(), "application/json").await?,
        )?;

        let root: serde_json::Value =
            serde_json::from_slice(&get("/openapi/v3".into(), "application/json").await?)?;
        for path in OPENAPI {
            let Some(url) = root["paths"][path]["serverRelativeURL"].as_str() else {
                continue; // this release does not serve it
            };
            let name = format!("{}_openapi.json", path.replace('/', "__"));
            let body = get(url.to_string(), "application/json").await?;
            write(
                &fixtures
                    .join("openapi")
                    .join(format!("k8s-{release}"))
                    .join(name),
                &body,
            )?;
        }

        let leases: serde_json::Value = serde_json::from_slice(
            &get(
                "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases?labelSelector=apiserver.kubernetes.io%2Fidentity%3Dkube-apiserver".into(),
                "application/json",
            )
            .await?,
        )?;
        let lease = leases["items"]
            .get(0)
            .context("kube-apiserver keeps no identity Lease")?;
        write(
            &fixtures.join("leases").join(format!("k8s-{release}.json")),
            &serde_json::to_vec_pretty(lease)?,
        )?;
        println!(
            "captured kube-apiserver {release} into {}",
            fixtures.display()
        );
    }
    Ok(())
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}
