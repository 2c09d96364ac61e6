//! The skew matrix (`/debug/skew`) of a live control plane in a real browser (the harness:
//! `skewgate_tests::live`).

use std::time::Duration;

use anyhow::{Context, Result};
use skewgate_tests::live::*;
use skewgate_tests::{eventually, Etcd, SimApiserver, SimOptions};

// ---------------------------------------------------------------------------------------------
// The skew matrix in a real browser.

/// `/debug/skew` in a real headless browser (Debian's chromium): the page shows the matrix of
/// a 1.30 local apiserver, its 1.33 peer and a 1.30 peer whose Lease names a hostile hostname
/// (shown as text, never run); then the 1.33 peer crashes and the page shows its API retained
/// (503). Both screenshots are kept in `target/test-artefacts/` for a person to look at.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_skew_page_shows_the_matrix_in_a_real_browser() -> Result<()> {
    const HOSTILE: &str = "apiserver-c<script>document.title='pwned'</script>";
    let _serial = SERIAL.lock().await;
    let etcd = Etcd::start().await?;
    let dir = tempfile::tempdir()?;
    let a = SimApiserver::start_with(shared("apiserver-a", "k8s-1.30", &etcd)).await?;
    let mut b = SimApiserver::start_with(shared("apiserver-b", "k8s-1.33", &etcd)).await?;
    let c = SimApiserver::start_with(SimOptions {
        hostname: Some(HOSTILE.to_string()),
        ..shared("apiserver-c", "k8s-1.30", &etcd)
    })
    .await?;
    let mut control = Control::new(&a, dir.path(), &[])?;
    let _envoy = start_routed_to_b(&mut control).await?;
    let c_lease = c.lease_name();
    eventually(
        "every apiserver in the matrix",
        Duration::from_secs(20),
        || async {
            let skew = control.skew().await?;
            let n = skew["matrix"]["apiservers"].as_array().map_or(0, Vec::len);
            Ok((n == 3).then_some(()))
        },
    )
    .await
    .with_context(|| control.log())?;
    let page = format!(
        "http://{}:{}/debug/skew",
        control.debug.host, control.debug.port
    );
    let artefacts = skewgate_tests::test_artefacts_dir()?;

    let dom = skewgate_tests::dump_dom(&page).await?;
    let shot = artefacts.join("skew-page.png");
    skewgate_tests::screenshot(&page, &shot, 1400, 2600).await?;
    eprintln!("the skew page as chromium renders it: {}", shot.display());
    // The matrix: every apiserver a column (by hostname, the local one marked), the group-version
    // only 1.33 serves, and where its requests go (the peer cluster of b).
    assert!(dom.contains("<table id=\"matrix\">"), "{dom}");
    assert!(
        dom.contains("apiserver-a <span class=\"badge\">local</span>"),
        "{dom}"
    );
    assert!(dom.contains("apiserver-b<span class=\"id\">"), "{dom}");
    assert!(dom.contains("resource.k8s.io/v1beta2"), "{dom}");
    assert!(dom.contains("<code>resourceclaims</code>"), "{dom}");
    assert!(
        dom.contains("peers: apiserver-b<span class=\"cluster\">skewgate-peers-"),
        "{dom}"
    );
    assert!(dom.contains("local (apiserver-a)"), "{dom}");
    assert!(dom.contains(&c_lease), "{dom}");
    // The hostile hostname is text on the page: no script element, the title untouched.
    assert!(
        dom.contains("apiserver-c&lt;script&gt;document.title='pwned'&lt;/script&gt;"),
        "{dom}"
    );
    assert!(!dom.contains("<script"), "{dom}");
    assert!(
        dom.contains("<title>skewgate: skew matrix</title>"),
        "{dom}"
    );
    // curl (Accept: */*) still gets the JSON.
    let (status, json) = control.get_debug("/debug/skew").await?;
    assert_eq!(status, 200);
    assert!(
        serde_json::from_str::<serde_json::Value>(&json).is_ok(),
        "{json}"
    );
    // Only on the debug port: the port Prometheus scrapes does not show it.
    assert_eq!(control.get("/debug/skew").await?.0, 404);
    assert_eq!(control.get("/metrics").await?.0, 200);

    // b, the only 1.33, crashes: after the grace its API is retained, and the page says so.
    let b_lease = b.lease_name();
    b.stop().await?;
    until_retained(&control, &b_lease).await?;
    let dom = skewgate_tests::dump_dom(&page).await?;
    let shot = artefacts.join("skew-page-retained.png");
    skewgate_tests::screenshot(&page, &shot, 1400, 1200).await?;
    eprintln!("the skew page with b's API retained: {}", shot.display());
    assert!(dom.contains("<table id=\"retained\">"), "{dom}");
    assert!(
        dom.contains("resource.k8s.io/v1beta2, Resource=resourceclaims"),
        "{dom}"
    );
    assert!(dom.contains(&b_lease), "{dom}");
    assert!(dom.contains("nowhere: 503 with Retry-After"), "{dom}");
    Ok(())
}
