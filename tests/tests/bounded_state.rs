//! Bounded state in the live mode (the harness: `skewgate_tests::live`): what a Lease writer
//! leaves in the state directory, and the cap on peers across control-plane restarts.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use skewgate_tests::live::*;
use skewgate_tests::{client, eventually, Etcd, SimApiserver, SimOptions};

// ---------------------------------------------------------------------------------------------
// Bounded state: what a Lease writer leaves in the state directory, and the cap across restarts.

/// a's current `renewTime`: a forged lease that borrows it looks renewed just now.
async fn renew_time_of(local: &SimApiserver) -> Result<serde_json::Value> {
    let own: serde_json::Value = client()
        .get(format!("{}{LEASES}/{}", local.url(), local.lease_name()))
        .send()
        .await?
        .json()
        .await?;
    Ok(own["spec"]["renewTime"].clone())
}

/// Create `names` as forged identity leases pointing at `address`, renewed "now".
async fn forge_leases(local: &SimApiserver, names: &[String], address: &str) -> Result<()> {
    let renew_time = renew_time_of(local).await?;
    let leases = format!("{}{LEASES}", local.url());
    for name in names {
        let resp = client()
            .post(&leases)
            .json(&forged_lease(name, address, &renew_time))
            .send()
            .await?;
        if resp.status() != 201 {
            bail!("creating lease {name}: {}", resp.text().await?);
        }
    }
    Ok(())
}

/// Renew `names` once ("now", a's `renewTime`).
async fn renew_leases(local: &SimApiserver, names: &[String]) -> Result<()> {
    let renew_time = renew_time_of(local).await?;
    for name in names {
        let resp = client()
            .patch(format!("{}{LEASES}/{name}", local.url()))
            .header("content-type", "application/merge-patch+json")
            .body(serde_json::json!({"spec": {"renewTime": renew_time}}).to_string())
            .send()
            .await?;
        if resp.status() != 200 {
            bail!("renewing lease {name}: {}", resp.text().await?);
        }
    }
    Ok(())
}

/// The retention files in `<state>/retention`: id → whether it is departed (`left_at` set).
fn retention_files(state: &Path) -> Result<BTreeMap<String, bool>> {
    let mut files = BTreeMap::new();
    for item in std::fs::read_dir(state.join("retention"))? {
        let item = item?;
        let name = item.file_name().to_string_lossy().into_owned();
        let Some(id) = name
            .strip_suffix(".json")
            .filter(|_| !name.starts_with('.'))
        else {
            continue;
        };
        let stored: serde_json::Value = serde_json::from_slice(&std::fs::read(item.path())?)?;
        files.insert(id.to_string(), !stored["left_at"].is_null());
    }
    Ok(files)
}

/// The lease ids `/debug/skew` lists as excluded for `reason` (`Expired`, `OverCap`, ...).
fn excluded_for(skew: &serde_json::Value, reason: &str) -> BTreeSet<String> {
    skew["excluded_leases"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|e| e["reason"] == reason)
                .filter_map(|e| e["id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The peers `/debug/skew` lists (live, within the cap), and of those the ones routed to.
fn peer_ids(skew: &serde_json::Value) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut live, mut routed) = (BTreeSet::new(), BTreeSet::new());
    for s in skew["apiservers"].as_array().into_iter().flatten() {
        let Some(id) = s["id"].as_str().filter(|_| s["local"] == false) else {
            continue;
        };
        live.insert(id.to_string());
        if s["routed"] == true {
            routed.insert(id.to_string());
        }
    }
    (live, routed)
}

/// Every state file is 0600 and every state directory 0700.
fn assert_private(state: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let mode = |p: &Path| -> Result<u32> { Ok(std::fs::metadata(p)?.mode() & 0o7777) };
    for dir in [state.to_path_buf(), state.join("retention")] {
        assert_eq!(mode(&dir)?, 0o700, "{}", dir.display());
        for item in std::fs::read_dir(&dir)? {
            let path = item?.path();
            if path.is_file() {
                assert_eq!(mode(&path)?, 0o600, "{}", path.display());
            }
        }
    }
    Ok(())
}

/// Issue 18: 3 rounds of 15 short-lived identity leases (each renewed once, each advertising a
/// real apiserver that serves what no live one does) left 46 copies of discovery in
/// `state/retention/` and as many retained apiservers. Now at most `--max-peers` departed ones
/// stay (the flood's most senior), the real peer's place and file untouched, each drop counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_of_short_lived_leases_leave_at_most_the_bound_of_discovery_copies() -> Result<()> {
    const MAX_PEERS: usize = 16; // the default
    const ROUNDS: usize = 3;
    const PER_ROUND: usize = MAX_PEERS - 1; // b holds one place
    let _serial = SERIAL.lock().await;
    let etcd = Etcd::start().await?;
    let dir = tempfile::tempdir()?;
    let a = SimApiserver::start_with(shared("apiserver-a", "k8s-1.30", &etcd)).await?;
    let b = SimApiserver::start_with(shared("apiserver-b", "k8s-1.30", &etcd)).await?;
    // A real apiserver without a lease of its own, newer than a and b: what every forged lease
    // advertises, so each forged peer is fetched and, once gone, retains what only it served.
    let c = SimApiserver::start_with(SimOptions {
        lease: false,
        ..shared("apiserver-c", "k8s-1.33", &etcd)
    })
    .await?;
    let c_address = format!("{}:{}", c.address.host, c.address.port);
    let state = dir.path().join("state");
    let mut control = Control::new(
        &a,
        dir.path(),
        &[
            "--api-retention=600s",
            &format!("--state-dir={}", state.display()),
        ],
    )?;
    control.start().await?;
    let b_lease = b.lease_name();
    eventually("b fetched and kept", Duration::from_secs(30), || async {
        Ok((retention_files(&state)?.get(&b_lease) == Some(&false)).then_some(()))
    })
    .await
    .with_context(|| control.log())?;

    for round in 0..ROUNDS {
        let names: Vec<String> = (0..PER_ROUND)
            .map(|i| format!("apiserver-flood-{round}-{i:02}"))
            .collect();
        forge_leases(&a, &names, &c_address).await?;
        // Each one live and fetched: its copy is kept while it is live.
        eventually(
            &format!("round {round}: every forged peer fetched and kept"),
            Duration::from_secs(30),
            || async {
                let files = retention_files(&state)?;
                Ok(names
                    .iter()
                    .all(|n| files.get(n) == Some(&false))
                    .then_some(()))
            },
        )
        .await
        .with_context(|| control.log())?;
        renew_leases(&a, &names).await?;
        // Then gone: the grace passes after the one renewal. `/debug/skew` shows them expired
        // once the recomputation that saw them go (and wrote the retention) is done.
        eventually(
            &format!("round {round}: every forged peer expired"),
            GRACE + Duration::from_secs(15),
            || async {
                let expired = excluded_for(&control.skew().await?, "Expired");
                Ok(names.iter().all(|n| expired.contains(n)).then_some(()))
            },
        )
        .await
        .with_context(|| control.log())?;
        let files = retention_files(&state)?;
        let departed = files.values().filter(|d| **d).count();
        eprintln!(
            "round {round}: {} retention files, {departed} departed",
            files.len()
        );
        assert_eq!(
            departed,
            ((round + 1) * PER_ROUND).min(MAX_PEERS),
            "round {round}: departed copies kept: {files:?}"
        );
    }
    let files = retention_files(&state)?;
    let departed: Vec<&String> = files
        .iter()
        .filter(|(_, d)| **d)
        .map(|(id, _)| id)
        .collect();
    assert_eq!(departed.len(), MAX_PEERS, "{files:?}");
    assert_eq!(files.len(), MAX_PEERS + 1, "the departed and b: {files:?}");
    assert_eq!(files.get(&b_lease), Some(&false), "b's file stays");
    // The most senior stay: the first round whole, then the first of the second.
    assert!(
        departed
            .iter()
            .all(|id| id.starts_with("apiserver-flood-0-") || *id == "apiserver-flood-1-00"),
        "{departed:?}"
    );
    let skew = control.skew().await?;
    let retained = skew["retained"].as_array().map_or(0, Vec::len);
    assert_eq!(retained, MAX_PEERS, "{}", skew["retained"]);
    assert_eq!(
        control
            .metric("skewgate_control_retention_evicted_total")
            .await?,
        (ROUNDS * PER_ROUND - MAX_PEERS) as f64
    );
    // Per-apiserver series are the running watches only: the local apiserver and b.
    assert_eq!(
        fetches(&control).await?.len(),
        2,
        "{:?}",
        fetches(&control).await?
    );
    assert!(
        skew["apiservers"]
            .as_array()
            .is_some_and(|a| a.iter().any(|s| s["id"] == b_lease.as_str())),
        "b is still a peer: {}",
        skew["apiservers"]
    );
    assert_private(&state)?;
    Ok(())
}

/// Issue 18: after a control-plane restart every lease was first seen at the same moment, so
/// 16 renewed leases whose names sort first pushed the real peer out of the cap (`OverCap`: its
/// resources answered 503). The seniority kept in the state directory keeps it routed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_leases_whose_names_sort_first_never_push_the_real_peer_out() -> Result<()>
{
    const MAX_PEERS: usize = 16; // the default
    let _serial = SERIAL.lock().await;
    let etcd = Etcd::start().await?;
    let dir = tempfile::tempdir()?;
    let a = SimApiserver::start_with(shared("apiserver-a", "k8s-1.30", &etcd)).await?;
    let b = SimApiserver::start_with(shared("apiserver-b", "k8s-1.33", &etcd)).await?;
    let state = dir.path().join("state");
    let mut control = Control::new(
        &a,
        dir.path(),
        &[&format!("--state-dir={}", state.display())],
    )?;
    let envoy = start_routed_to_b(&mut control).await?;
    let b_lease = b.lease_name();

    // 16 leases whose names sort before b's (`apiserver-` and base32), pointing at a (they
    // serve nothing b alone serves: a request for b's resources is 200 only if b is routed),
    // renewed all along.
    let names: Vec<String> = (0..MAX_PEERS)
        .map(|i| format!("apiserver-{i:04}"))
        .collect();
    assert!(names.iter().all(|n| *n < b_lease));
    let a_address = format!("{}:{}", a.address.host, a.address.port);
    forge_leases(&a, &names, &a_address).await?;
    let renewer = {
        let (a_url, a_lease, names) = (a.url(), a.lease_name(), names.clone());
        tokio::spawn(async move {
            loop {
                let renewed = async {
                    let own: serde_json::Value = client()
                        .get(format!("{a_url}{LEASES}/{a_lease}"))
                        .send()
                        .await?
                        .json()
                        .await?;
                    for name in &names {
                        client()
                            .patch(format!("{a_url}{LEASES}/{name}"))
                            .header("content-type", "application/merge-patch+json")
                            .body(
                                serde_json::json!({"spec": {"renewTime": own["spec"]["renewTime"]}})
                                    .to_string(),
                            )
                            .send()
                            .await?;
                    }
                    anyhow::Ok(())
                };
                let _ = renewed.await;
                tokio::time::sleep(RENEW).await;
            }
        })
    };
    let over = eventually("the cap full", Duration::from_secs(30), || async {
        let skew = control.skew().await?;
        let over = excluded_for(&skew, "OverCap");
        let (live, routed) = peer_ids(&skew);
        // Every peer within the cap fetched: its seniority is in the state directory.
        let kept = retention_files(&state)?;
        Ok((live.len() == MAX_PEERS
            && routed.contains(&b_lease)
            && over.len() == 1
            && live.iter().all(|id| kept.get(id) == Some(&false)))
        .then_some(over))
    })
    .await
    .with_context(|| control.log())?
    .0;
    assert_eq!(over, BTreeSet::from(["apiserver-0015".to_string()]));
    assert_eq!(get(&envoy, CLAIMS).await?, (200, "apiserver-b".to_string()));

    control.terminate().await?;
    control.start().await?;
    eventually("ready again", Duration::from_secs(30), || async {
        Ok(control.ready().await.then_some(()))
    })
    .await
    .with_context(|| control.log())?;
    let skew = control.skew().await?;
    assert!(
        peer_ids(&skew).1.contains(&b_lease),
        "b routed after the restart: {}\n{}",
        skew["excluded_leases"],
        control.log()
    );
    assert_eq!(
        excluded_for(&skew, "OverCap"),
        over,
        "the same lease over the cap"
    );
    // And it stays so, through Envoy: b's resources are b's, never the 503 of an apiserver
    // pushed out of the cap.
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        assert_eq!(get(&envoy, CLAIMS).await?, (200, "apiserver-b".to_string()));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    renewer.abort();
    // The state files: private, the last acknowledged configuration among them.
    assert!(state.join("last-acknowledged.json").is_file());
    assert_private(&state)?;
    Ok(())
}
