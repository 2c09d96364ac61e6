//! TLS everywhere in the live mode (the harness: `skewgate_tests::live`): a real etcd,
//! simulated apiservers over TLS that keep identity Leases in it and authenticate like
//! kube-apiserver, the real `skewgate-control run` binary as a child process, and real Envoy
//! 1.40 on the bootstrap `skewgate-control bootstrap` prints, loading the release
//! `skewgate_filter.wasm`: clients with a certificate, a bearer token or neither (kubectl
//! among them) each reach a peer with their own upstream identity, the L4 peer port passes TLS
//! straight through to the local apiserver, and a peer whose serving certificate is not from
//! the peer CA is never routed to.
//!
//! Set `SKEWGATE_TEST_LOGS=1` to see the simulators' logs; the control plane's log is printed
//! when an assertion fails.

use std::time::Duration;

use anyhow::{Context, Result};
use skewgate_tests::live::*;
use skewgate_tests::{
    eventually, free_port, header, kubeconfig_tls, kubectl, Credential, Etcd, SimApiserver,
    SimOptions, Subject, TestPki, TEST_TOKENS,
};

// ---------------------------------------------------------------------------------------------
// Scenarios.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_everywhere_with_the_three_upstream_identities() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let pki = TestPki::generate()?;
    let etcd = Etcd::start().await?;
    let dir = tempfile::tempdir()?;
    let a =
        SimApiserver::start_with(shared("apiserver-a", "k8s-1.30", &etcd).with_pki(&pki)).await?;
    let b =
        SimApiserver::start_with(shared("apiserver-b", "k8s-1.33", &etcd).with_pki(&pki)).await?;
    let mut control = Control::secure(&a, dir.path(), &pki)?;
    control.start().await?;
    let peer_port = free_port()?;
    let envoy = live_envoy(&control, Some(&pki), Some((peer_port, &a))).await?;

    // The first sync over TLS: discovery from both apiservers verified with the peer CA.
    eventually("ready", Duration::from_secs(30), || async {
        Ok(control.ready().await.then_some(()))
    })
    .await
    .with_context(|| control.log())?;
    let alice = pki.client_cert("alice", &Subject::new().o("system:masters").cn("alice"))?;
    let with_cert = pki.client(Some(&alice))?;
    let plain = pki.client(None)?;
    let h1 = pki.client_builder(None)?.http1_only().build()?;
    let bob = TEST_TOKENS[0];

    // Each kind of client reaches the 1.33 peer through its own cluster variant, over TLS that
    // verified the peer, and the peer authenticates it as it should.
    let (_, took) = eventually("routed to b over TLS", Duration::from_secs(20), || async {
        let (status, echo) = get_echo(&with_cert, &envoy, CLAIMS, None).await?;
        Ok((status == 200
            && echo.get("x-sim-apiserver").map(String::as_str) == Some("apiserver-b"))
        .then_some(echo))
    })
    .await
    .with_context(|| format!("{}\n{}", control.log(), envoy.log()))?;
    // (what, client, token, authenticator, user, upstream ALPN)
    type Case<'a> = (
        &'a str,
        &'a reqwest::Client,
        Option<&'a str>,
        &'a str,
        &'a str,
        &'a str,
    );
    let cases: Vec<Case<'_>> = vec![
        (
            "client certificate over h2",
            &with_cert,
            None,
            "requestheader",
            "alice",
            "h2",
        ),
        (
            "bearer token over h2",
            &plain,
            Some(bob.token),
            "token",
            bob.user,
            "h2",
        ),
        (
            "bearer token over HTTP/1.1",
            &h1,
            Some(bob.token),
            "token",
            bob.user,
            "http/1.1",
        ),
        (
            "anonymous over h2",
            &plain,
            None,
            "anonymous",
            "system:anonymous",
            "http/1.1",
        ),
    ];
    for (what, client, token, authenticator, user, alpn) in cases {
        for (path, server) in [(CLAIMS, "apiserver-b"), (DEPLOYMENTS, "apiserver-a")] {
            let (status, echo) = get_echo(client, &envoy, path, token).await?;
            let got = |k: &str| echo.get(k).map(String::as_str).unwrap_or_default();
            assert_eq!(status, 200, "{what} {path}: {echo:?}");
            assert_eq!(got("x-sim-apiserver"), server, "{what} {path}");
            assert_eq!(
                got("x-sim-authenticator"),
                authenticator,
                "{what} {path}: {echo:?}"
            );
            assert_eq!(got("x-sim-user"), user, "{what} {path}");
            assert_eq!(got("x-sim-alpn"), alpn, "{what} {path}: upstream protocol");
        }
        eprintln!("TLS: {what}: {authenticator}/{user}, upstream ALPN {alpn}, local and peer");
    }
    eprintln!("TLS: first request routed to the peer {took:?} after ready");

    // kubectl with a client certificate, through Envoy, on the peer's resource.
    let kubeconfig = dir.path().join("alice.kubeconfig");
    std::fs::write(
        &kubeconfig,
        kubeconfig_tls(
            &envoy.url(),
            &pki.cluster_ca.cert_file,
            None,
            &Credential::cert(&alice),
        ),
    )?;
    let (ok, out, err) = kubectl(
        &kubeconfig,
        &["get", "resourceclaims.v1beta2.resource.k8s.io", "-A"],
    )
    .await?;
    assert!(ok, "{out}{err}");
    let metrics = control.get("/metrics").await?.1;
    assert!(metrics.contains("skewgate_control_ready 1"), "{metrics}");

    // The peer port passes TLS straight through to apiserver-a: no filter (v1beta2 is a's own
    // 404 there), the client's own handshake and ALPN, and the front-proxy identity a peer's
    // Envoy presents is authenticated by apiserver-a itself.
    let peer_url = format!("https://127.0.0.1:{peer_port}");
    let as_peer = pki.client(Some(&pki.front_proxy_client))?;
    let resp = as_peer
        .get(format!("{peer_url}{CLAIMS}"))
        .header("x-remote-user", "alice")
        .header("x-remote-group", "system:masters")
        .send()
        .await?;
    assert_eq!(
        resp.status().as_u16(),
        404,
        "not routed: no filter on the peer port"
    );
    assert_eq!(header(&resp, "x-sim-apiserver"), "apiserver-a");
    assert_eq!(header(&resp, "x-sim-authenticator"), "requestheader");
    assert_eq!(header(&resp, "x-sim-user"), "alice");
    assert_eq!(header(&resp, "x-sim-alpn"), "h2");
    let resp = plain
        .get(format!("{peer_url}{DEPLOYMENTS}"))
        .bearer_auth(bob.token)
        .send()
        .await?;
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(header(&resp, "x-sim-authenticator"), "token");
    eprintln!("TLS: the peer port passes TLS through to the apiserver (requestheader identity, h2 end to end)");

    // A 1.33 apiserver whose serving certificate is not from the peer CA (its lease and
    // address are fine): its discovery fails verification, so it is never routed to.
    let evil_serving = pki.serving_cert(&pki.evil_ca, "evil-serving")?;
    let evil = SimApiserver::start_with(SimOptions {
        tls_cert_file: Some(evil_serving.cert_file.clone()),
        tls_private_key_file: Some(evil_serving.key_file.clone()),
        ..shared("apiserver-evil", "k8s-1.33", &etcd).with_pki(&pki)
    })
    .await?;
    let evil_lease = evil.lease_name();
    let (skew, _) = eventually("the impostor is tried", Duration::from_secs(20), || async {
        let skew = control.skew().await?;
        let tried = skew["apiservers"].as_array().is_some_and(|l| {
            l.iter().any(|x| {
                x["id"] == evil_lease.as_str() && x["consecutive_failures"].as_u64() >= Some(1)
            })
        });
        Ok(tried.then_some(skew))
    })
    .await
    .with_context(|| control.log())?;
    assert!(
        skew["unrouted_peers"]
            .as_array()
            .is_some_and(|l| l.iter().any(|x| x["id"] == evil_lease.as_str())),
        "{skew:#}"
    );
    assert!(
        control
            .metric("apiserver_peer_discovery_sync_errors_total{type=\"connect\"}")
            .await?
            >= 1.0
    );
    assert_eq!(
        served_by(&control, ("resource.k8s.io", "v1beta2"), "resourceclaims").await?,
        vec![b.lease_name()]
    );
    for _ in 0..10 {
        let (status, echo) = get_echo(&with_cert, &envoy, CLAIMS, None).await?;
        assert_eq!(
            (status, echo.get("x-sim-apiserver").map(String::as_str)),
            (200, Some("apiserver-b"))
        );
    }
    eprintln!("TLS: a peer with a serving certificate from another CA is never routed to");
    Ok(())
}
