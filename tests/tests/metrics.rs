//! Metrics in the live mode (the harness: `skewgate_tests::live`): one scrape per node, both
//! planes, checked against the alert rules.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use skewgate_tests::live::*;
use skewgate_tests::{
    client, eventually, repo_root, Envoy, Etcd, PeerAdvertise, SimApiserver, SimOptions,
};

// ---------------------------------------------------------------------------------------------
// Metrics: one scrape per node.

/// One sample of a scrape: name, labels, value.
type Sample = (String, BTreeMap<String, String>, f64);

/// The samples of a Prometheus text exposition (labels unescaped).
fn samples(text: &str) -> Result<Vec<Sample>> {
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (series, value) = line
            .rsplit_once(' ')
            .with_context(|| format!("no value: {line:?}"))?;
        let value: f64 = value
            .parse()
            .with_context(|| format!("bad value: {line:?}"))?;
        let (name, labels) = match series.split_once('{') {
            None => (series, BTreeMap::new()),
            Some((name, rest)) => {
                let body = rest
                    .strip_suffix('}')
                    .with_context(|| format!("unclosed labels: {line:?}"))?;
                (name, labels_of(body).with_context(|| line.to_string())?)
            }
        };
        out.push((name.to_string(), labels, value));
    }
    Ok(out)
}

/// `a="x",b="y \"q\""` as a map.
fn labels_of(body: &str) -> Result<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    let mut rest = body;
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"").context("label without =\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next() {
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => bail!("dangling escape"),
                },
                Some((_, c)) => value.push(c),
                None => bail!("unterminated label value"),
            }
        };
        labels.insert(key.trim_start_matches(',').to_string(), value);
        rest = after[end + 1..].trim_start_matches(',');
    }
    Ok(labels)
}

/// Every metric name the shipped Grafana dashboard and Prometheus rules query.
fn queried_metrics() -> Result<BTreeSet<String>> {
    let dir = repo_root().join("deploy/monitoring");
    let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        dir.join("grafana-dashboard.json"),
    )?)?;
    let mut exprs = Vec::new();
    fn walk(v: &serde_json::Value, exprs: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v.as_str()) {
                        ("expr", Some(e)) => exprs.push(e.to_string()),
                        _ => walk(v, exprs),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, exprs)),
            _ => {}
        }
    }
    walk(&dashboard, &mut exprs);
    let dashboard_exprs = exprs.len();
    // The rules are a valid Prometheus rule file (promtool from Debian's prometheus,
    // scripts/setup).
    let out = std::process::Command::new("promtool")
        .args(["check", "rules"])
        .arg(dir.join("alerts.yaml"))
        .output()
        .context("promtool (Debian's prometheus package; scripts/setup installs it)")?;
    assert!(
        out.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let rules = std::fs::read_to_string(dir.join("alerts.yaml"))?;
    exprs.extend(
        rules
            .lines()
            .filter_map(|l| l.trim().strip_prefix("expr:"))
            .map(str::to_string),
    );
    assert!(
        dashboard_exprs >= 10 && exprs.len() > dashboard_exprs,
        "{exprs:?}"
    );
    // Metric names are the identifiers with our prefixes (PromQL functions, label names and
    // the `$instance` variable have none).
    Ok(exprs
        .iter()
        .flat_map(|e| {
            e.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .filter(|t| {
                    ["apiserver_", "aggregator_", "skewgate_"]
                        .iter()
                        .any(|p| t.starts_with(p))
                })
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect())
}

/// A GET through Envoy with an Accept header: (status, body).
async fn get_accept(envoy: &Envoy, path: &str, accept: &str) -> Result<(u16, String)> {
    let resp = client()
        .get(url(envoy, path))
        .header("accept", accept)
        .send()
        .await?;
    Ok((resp.status().as_u16(), resp.text().await?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_scrape_has_both_planes_with_upstreams_names_and_bounded_labels() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let etcd = Etcd::start().await?;
    let dir = tempfile::tempdir()?;
    let a = SimApiserver::start_with(shared("apiserver-a", "k8s-1.30", &etcd)).await?;
    let mut b = SimApiserver::start_with(shared("apiserver-b", "k8s-1.33", &etcd)).await?;
    // A grace long enough that b, killed, is still live when the next request for its API
    // comes: Envoy cannot reach it (a peer proxy error); after the grace its API is retained.
    // Envoy's admin socket is in the control plane's --socket-dir: it reads the filter's
    // counters there.
    let mut control = Control::new(&a, dir.path(), &["--lease-grace=10s"])?;
    let envoy = start_routed_to_b(&mut control).await?;

    // Rerouted: v1beta2 resourceclaims are b's only.
    for _ in 0..3 {
        assert_eq!(get(&envoy, CLAIMS).await?, (200, "apiserver-b".into()));
    }
    // Merged discovery: a hit, a miss (protobuf only: not answered from the merged
    // documents) and a no-peer request.
    assert!(apis(&envoy).await?.1.contains("resource.k8s.io"));
    let protobuf =
        "application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
    get_accept(&envoy, "/apis", protobuf).await?;
    let nopeer = format!("{AGGREGATED};profile=nopeer");
    assert_eq!(get_accept(&envoy, "/apis", &nopeer).await?.0, 200);

    // A live peer whose discovery is garbage: pending. A client-chosen group-version nobody
    // known serves is answered 503, and counted as `other`, never under the client's names.
    let (garbage_addr, _garbage) = hostile_discovery_server(b"{\"kind\":", 8).await?;
    let _garbage_peer = SimApiserver::start_with(SimOptions {
        peer_advertise_address: PeerAdvertise::Value(garbage_addr.to_string()),
        ..shared("apiserver-garbage", "k8s-1.33", &etcd)
    })
    .await?;
    eventually(
        "the garbage peer is pending",
        Duration::from_secs(30),
        || async {
            let skew = control.skew().await?;
            Ok(skew["pending_peers"]
                .as_array()
                .is_some_and(|p| !p.is_empty())
                .then_some(()))
        },
    )
    .await
    .with_context(|| control.log())?;
    let nobody = "/apis/nobody.example.com/v1/namespaces/x/widgets";
    eventually(
        "503 while a peer is pending",
        Duration::from_secs(30),
        || async { Ok((get(&envoy, nobody).await?.0 == 503).then_some(())) },
    )
    .await?;

    // b vanishes: while its lease is live, Envoy cannot reach it (a peer proxy error, 503);
    // after the grace its API is retained (503 from the filter).
    b.stop().await?;
    let (status, body) = get_accept(&envoy, CLAIMS, "application/json").await?;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("could not be reached"), "{body}");
    eventually("b's API is retained", Duration::from_secs(30), || async {
        let (status, body) = get_accept(&envoy, CLAIMS, "application/json").await?;
        Ok((status == 503 && body.contains("no live apiserver serves")).then_some(()))
    })
    .await
    .with_context(|| control.log())?;

    // One scrape.
    let (status, text) = control.get("/metrics").await?;
    assert_eq!(status, 200);
    let scraped = samples(&text)?;
    let names: BTreeSet<&str> = scraped.iter().map(|(n, _, _)| n.as_str()).collect();
    let value = |name: &str, labels: &[(&str, &str)]| -> f64 {
        let want: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        scraped
            .iter()
            .find(|(n, l, _)| n == name && *l == want)
            .map_or(0.0, |(_, _, v)| *v)
    };
    let claims = [
        ("group", "resource.k8s.io"),
        ("version", "v1beta2"),
        ("resource", "resourceclaims"),
    ];
    let with = |extra: (&'static str, &'static str)| {
        let mut l = vec![extra];
        l.extend(claims);
        l
    };
    let other = [
        ("group", "other"),
        ("version", "other"),
        ("resource", "other"),
    ];
    for (name, labels, at_least) in [
        (
            "apiserver_rerouted_request_total",
            with(("code", "200")),
            3.0,
        ),
        (
            "apiserver_rerouted_request_total",
            with(("code", "503")),
            1.0,
        ),
        (
            "apiserver_peer_proxy_errors_total",
            with(("type", "connect")),
            1.0,
        ),
        ("skewgate_retained_unavailable_total", claims.to_vec(), 1.0),
        ("skewgate_peer_discovery_pending_total", other.to_vec(), 1.0),
        (
            "aggregator_discovery_peer_aggregated_cache_hits_total",
            vec![],
            1.0,
        ),
        (
            "aggregator_discovery_peer_aggregated_cache_misses_total",
            vec![],
            1.0,
        ),
        ("aggregator_discovery_nopeer_requests_total", vec![], 1.0),
        ("skewgate_envoy_stats_up", vec![], 1.0),
        ("skewgate_peer_leases", vec![("state", "expired")], 1.0),
    ] {
        assert!(
            value(name, &labels) >= at_least,
            "{name}{labels:?} < {at_least} in\n{text}"
        );
    }
    // Label names are upstream's, and no label value is one a client chose.
    let label_names = |name: &str| -> BTreeSet<BTreeSet<&str>> {
        scraped
            .iter()
            .filter(|(n, _, _)| n == name)
            .map(|(_, l, _)| l.keys().map(String::as_str).collect())
            .collect()
    };
    let set = |keys: &[&'static str]| BTreeSet::from([keys.iter().copied().collect()]);
    assert_eq!(
        label_names("apiserver_rerouted_request_total"),
        set(&["code", "group", "resource", "version"])
    );
    assert_eq!(
        label_names("apiserver_peer_proxy_errors_total"),
        set(&["group", "resource", "type", "version"])
    );
    for (_, labels, _) in &scraped {
        for v in labels.values() {
            assert!(
                !v.contains("nobody") && !v.contains("widgets"),
                "a client-chosen label value: {labels:?}"
            );
        }
    }
    // Every metric the dashboard and the alert rules query is in this scrape.
    let queried = queried_metrics()?;
    let missing: Vec<&String> = queried
        .iter()
        .filter(|q| !names.contains(q.as_str()))
        .collect();
    assert!(missing.is_empty(), "not in the scrape: {missing:?}\n{text}");
    // Every metric of skewgate's own in this scrape is in the configuration reference
    // (Envoy's own statistics are Envoy's documentation's).
    let reference = std::fs::read_to_string(repo_root().join("docs/configuration.md"))?;
    let undocumented: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| {
            ["skewgate_", "apiserver_", "aggregator_"]
                .iter()
                .any(|p| n.starts_with(p))
        })
        .filter(|n| {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| n.strip_suffix(suffix))
                .unwrap_or(n);
            !reference.contains(&format!("`{n}`")) && !reference.contains(&format!("`{family}`"))
        })
        .collect();
    assert!(
        undocumented.is_empty(),
        "not in docs/configuration.md's metrics: {undocumented:?}"
    );

    // The scrape, as the report shows it: each name with its label sets.
    let mut shown: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for (name, labels, _) in &scraped {
        let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
        shown
            .entry(name)
            .or_default()
            .insert(format!("{{{}}}", labels.join(",")));
    }
    for (name, sets) in shown {
        eprintln!("{name} {}", sets.into_iter().collect::<Vec<_>>().join(" "));
    }
    eprintln!(
        "{} metrics in one scrape; the {} the dashboard and rules query are all there",
        names.len(),
        queried.len()
    );
    Ok(())
}
