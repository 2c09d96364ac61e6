//! The Lease-to-route benchmark in the live mode (the harness: `skewgate_tests::live`),
//! ignored in the test suite (`scripts/bench lease-to-route` runs it): a real etcd, simulated
//! apiservers, and for every control plane build compared its own real `skewgate-control run`
//! as a child process and its own real Envoy 1.40 on the bootstrap `skewgate-control bootstrap`
//! prints, loading the release `skewgate_filter.wasm`. It prints how long a Lease change takes
//! to become a route in Envoy.
//!
//! Set `SKEWGATE_TEST_LOGS=1` to see the simulators' logs; `SKEWGATE_BENCH_LOGS=1` prints each
//! control plane's log at the end.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use skewgate_tests::live::*;
use skewgate_tests::{client, eventually, header, Envoy, Etcd, SimApiserver, SimOptions};

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
