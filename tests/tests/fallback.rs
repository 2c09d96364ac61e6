//! Envoy without its control plane, in the live mode (the harness: `skewgate_tests::live`): a
//! real etcd, simulated apiservers that keep identity Leases in it, the real
//! `skewgate-control run` binary as a child process (killed, restarted, or not started), and
//! real Envoy 1.40 on the bootstrap `skewgate-control bootstrap` prints, loading the release
//! `skewgate_filter.wasm`. Envoy keeps serving while the control plane restarts; one started
//! without it serves, after `--control-plane-wait`, the last acknowledged configuration or
//! local-only without one, then takes the live configuration; and hostile strings in a peer's
//! discovery cannot keep it from starting on the kept configuration.
//!
//! The scenarios run one at a time (the machine is small). Set `SKEWGATE_TEST_LOGS=1` to see
//! the simulators' logs; the control plane's log is printed when an assertion fails.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use skewgate_control::envoy::resources::DataPlane;
use skewgate_tests::live::*;
use skewgate_tests::{
    client, data_plane, envoy_bin, eventually, filter_flags, free_port, header, Envoy, Etcd, Probe,
    SimApiserver, Subject, TestPki, TEST_TOKENS,
};
use tokio::process::Command;

// ---------------------------------------------------------------------------------------------
// Scenarios.

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

/// A cluster of Envoy's `/config_dump`, as Envoy itself renders it, without what names it: the
/// static fallback clusters and the control plane's (CDS) are compared with it.
/// Envoy in front of `local` over TLS, on the bootstrap of `control`'s flags, with the control
/// plane not started: after `wait` it runs its fallback. The bootstrap alone writes the SDS
/// files its fallback clusters need (in its own --sds-dir, which `run` never writes to).
async fn envoy_without_its_control_plane(
    control: &Control,
    local: &SimApiserver,
    pki: &TestPki,
    wait: &str,
) -> Result<Envoy> {
    let mut envoy = live_envoy_with(
        control,
        Some(pki),
        None,
        &[
            [
                format!("--control-plane-wait={wait}"),
                format!("--local-apiserver-url={}", local.url()),
            ]
            .as_slice(),
            &filter_flags()?,
            &upstream_tls_flags(pki),
        ]
        .concat(),
    )
    .await?;
    envoy.wait_ready().await.context("Envoy opened no port")?;
    Ok(envoy)
}

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

/// Local-only, in front of a real release's documents: kube-apiserver 1.36 serves
/// `certificates.k8s.io/v1` without `clustertrustbundles` (1.37 serves them), and answers a
/// request for them with kube's generic NotFound Status (JSON), not `404 page not found`
/// (`tests/tests/conformance.rs` holds the simulator to that). Whether another apiserver
/// serves them is not known: a retryable 503, never a 404. A missing object's NotFound, in the
/// same group-version, stands. Before, the client got the 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_only_a_resource_the_local_group_version_lacks_is_a_503_not_a_404() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let pki = TestPki::generate()?;
    let etcd = Etcd::start().await?;
    let dir = tempfile::tempdir()?;
    let a =
        SimApiserver::start_with(shared("apiserver-a", "k8s-1.36", &etcd).with_pki(&pki)).await?;
    let control = Control::secure(&a, dir.path(), &pki)?;
    let envoy = envoy_without_its_control_plane(&control, &a, &pki, "1s").await?;
    let admin = pki.client_cert("admin", &Subject::new().o("system:masters").cn("admin"))?;
    let client = pki.client(Some(&admin))?;
    let bundles = "/apis/certificates.k8s.io/v1/clustertrustbundles";
    eventually(
        "served without a control plane",
        Duration::from_secs(30),
        || async {
            Ok(matches!(
                get_echo(
                    &client,
                    &envoy,
                    "/apis/certificates.k8s.io/v1/certificatesigningrequests",
                    None
                )
                .await,
                Ok((200, _))
            )
            .then_some(()))
        },
    )
    .await
    .with_context(|| envoy.log())?;
    expect_fallback(&envoy, "local-only").await?;
    // A list: no body needed to tell. One object: only its body tells, which a data plane
    // can read with the headers held (native); proxy-wasm cannot (its answer passes:
    // docs/data-plane.md, "The one behaviour difference").
    let mut paths = vec![bundles.to_string()];
    if data_plane()? == DataPlane::Native {
        paths.push(format!("{bundles}/some-bundle"));
    }
    for path in paths {
        let resp = client.get(url(&envoy, &path)).send().await?;
        let (status, retry_after) = (resp.status().as_u16(), header(&resp, "retry-after"));
        let body: serde_json::Value = resp.json().await?;
        assert_eq!(
            (status, body["reason"].as_str(), retry_after.as_str()),
            (503, Some("ServiceUnavailable"), "5"),
            "{path}: {body}"
        );
    }
    let resp = client
        .get(url(
            &envoy,
            "/apis/certificates.k8s.io/v1/certificatesigningrequests/missing",
        ))
        .send()
        .await?;
    assert_eq!(resp.status().as_u16(), 404);
    let body: serde_json::Value = resp.json().await?;
    assert_eq!(body["details"]["name"], "missing", "{body}");
    Ok(())
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
    let envoy = envoy_without_its_control_plane(&control, &a, &pki, "2s").await?;
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
    let mut flags = vec![
        "--control-plane-wait=2s".to_string(),
        format!("--state-dir={}", state.display()),
        format!("--local-apiserver-url={}", local.url()),
    ];
    flags.extend(filter_flags()?);
    flags.extend(upstream_tls_flags(pki));
    Ok(flags)
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
        // What YAML (the bootstrap's format) reads as something else than the string.
        "---".into(),
        "...".into(),
        "&anchor".into(),
        "*alias".into(),
        "!!tag".into(),
        "key: value".into(),
        "# comment".into(),
        " leading".into(),
        "trailing ".into(),
        "\ttab".into(),
        "\\x41 \\u0041 \\q".into(),
        "yes".into(),
        "No".into(),
        "on".into(),
        "OFF".into(),
        "~".into(),
        "null".into(),
        "0755".into(),
        "0o17".into(),
        "0x1F".into(),
        "1e3".into(),
        ".inf".into(),
        "y".repeat(64 * 1024),
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
    let merged = merged_apis(&plain, &envoy, bob.token)
        .await
        .context("merged /apis")?;
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
    let file = dir.path().join("validate.yaml");
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
    // The strings went through the YAML bootstrap into the filter and come back out of it
    // byte for byte, in the merged discovery it serves from the kept configuration.
    let served = merged_apis(&plain, &envoy, bob.token)
        .await
        .context("merged /apis from the fallback")?;
    let short_names: Vec<&serde_json::Value> = served["items"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["versions"].as_array().into_iter().flatten())
        .flat_map(|v| v["resources"].as_array().into_iter().flatten())
        .filter(|r| r["resource"] == "hostilethings")
        .map(|r| &r["shortNames"])
        .collect();
    assert_eq!(short_names, [&serde_json::json!(hostile_strings())]);
    // And in what Envoy says it runs: every string a leaf of its config_dump (the filter's
    // configuration is a JSON string in it, read as JSON too).
    let dump: serde_json::Value = serde_json::from_str(&envoy.admin("/config_dump").await?)?;
    let mut leaves = std::collections::HashSet::new();
    string_leaves(&dump, &mut leaves);
    for s in hostile_strings() {
        assert!(
            leaves.contains(&s),
            "{:?} is not in Envoy's config_dump",
            s.chars().take(40).collect::<String>()
        );
    }
    Ok(())
}

/// Every string in `value`, and in the strings that are JSON documents themselves.
/// Envoy's merged `/apis` (aggregated v2), for the holder of `token`.
async fn merged_apis(
    client: &reqwest::Client,
    envoy: &Envoy,
    token: &str,
) -> Result<serde_json::Value> {
    Ok(client
        .get(url(envoy, "/apis"))
        .bearer_auth(token)
        .header("accept", AGGREGATED)
        .send()
        .await?
        .json()
        .await?)
}

fn string_leaves(value: &serde_json::Value, out: &mut std::collections::HashSet<String>) {
    match value {
        serde_json::Value::String(s) => {
            if let Ok(inner @ (serde_json::Value::Object(_) | serde_json::Value::Array(_))) =
                serde_json::from_str::<serde_json::Value>(s)
            {
                string_leaves(&inner, out);
            }
            out.insert(s.clone());
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| string_leaves(v, out)),
        serde_json::Value::Object(fields) => fields.values().for_each(|v| string_leaves(v, out)),
        _ => {}
    }
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
