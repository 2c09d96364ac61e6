//! The simulator held to the real thing: the same requests to a real kube-apiserver (1.36.3 and
//! 1.37.2, built by `tests/kube/build`) and to `sim-apiserver` serving that release's documents
//! (`tests/fixtures/discovery/k8s-<release>`, captured from the same binaries), both with the
//! same PKI and kubeadm's authenticators. What skewgate relies on must be the same:
//!
//! - discovery under every Accept skewgate negotiates (aggregated v2 of `/apis` and `/api`,
//!   `profile=nopeer`, legacy JSON, protobuf only, an unknown version of the aggregated type), and
//!   `If-None-Match` against the ETag;
//! - the 404s: a path no group-version serves, a resource (or subresource, or a cluster-scoped
//!   resource under a namespace) a served group-version does not have, a missing object;
//! - `/readyz` while starting (after a SIGTERM the process may stop answering at once: both
//!   count as not ready, which is all Envoy's health check reads);
//! - requestheader authentication (the front proxy's certificate with and without
//!   `X-Remote-User`, the header from a client certificate that is no front proxy);
//! - a watch with bookmarks (`sendInitialEvents`: the initial objects, then the bookmark that
//!   ends them);
//! - the identity Lease (name, labels, annotation, holder, duration) and its removal on a
//!   graceful stop.
//!
//! Each observation is reduced to what skewgate reads (status, media type, the fields of a
//! Status, the shape of a Lease); the test fails listing every difference.

use std::time::Duration;

use anyhow::{Context, Result};
use futures_util::StreamExt;
use serde_json::Value;
use skewgate_control::envoy::resources::READY_STATUSES;
use skewgate_tests::real::{real_client, RealApiserver, RealOptions, REAL_RELEASES};
use skewgate_tests::{
    identity_lease_name, CertFiles, Etcd, SimApiserver, SimOptions, Subject, TestPki,
};

const AGGREGATED: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
const NOPEER: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer";
const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// What skewgate reads of one answer.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    status: u16,
    /// The media type and its `g`, `v`, `as` parameters (not their order, not the charset).
    media: String,
    /// For a JSON body: the fields skewgate reads (a Status's reason, message and details;
    /// a discovery document's kind; a SelfSubjectReview's user); else empty.
    body: Value,
}

fn media(content_type: Option<&str>) -> String {
    let Some(ct) = content_type else {
        return String::new();
    };
    let mut parts = ct.split(';').map(str::trim);
    let mut out = parts.next().unwrap_or("").to_ascii_lowercase();
    let mut params: Vec<String> = parts
        .filter(|p| ["g=", "v=", "as="].iter().any(|k| p.starts_with(k)))
        .map(str::to_string)
        .collect();
    params.sort();
    for p in params {
        out.push(';');
        out.push_str(&p);
    }
    out
}

/// The parts of a JSON body skewgate reads.
fn essence(body: &[u8]) -> Value {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return Value::String(String::from_utf8_lossy(body).trim().to_string());
    };
    match v["kind"].as_str() {
        Some("Status") => serde_json::json!({
            "kind": "Status",
            "code": v["code"],
            "reason": v["reason"],
            "message": v["message"],
            "details": v["details"],
        }),
        Some("SelfSubjectReview") => serde_json::json!({
            "kind": "SelfSubjectReview",
            "user": v["status"]["userInfo"]["username"],
            "groups": v["status"]["userInfo"]["groups"],
        }),
        Some(kind) => serde_json::json!({ "kind": kind }),
        None => serde_json::json!({ "kind": null }),
    }
}

struct Target {
    name: &'static str,
    url: String,
}

async fn observe(
    client: &reqwest::Client,
    url: &str,
    method: reqwest::Method,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Result<(Seen, reqwest::header::HeaderMap)> {
    let mut request = client.request(method, url);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    if let Some(body) = body {
        request = request
            .header("Content-Type", "application/json")
            .body(body.to_string());
    }
    let response = request.send().await.with_context(|| url.to_string())?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let ct = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let bytes = response.bytes().await?;
    let body = if media(ct.as_deref()).starts_with("application/json")
        || media(ct.as_deref()).starts_with("text/plain")
    {
        essence(&bytes)
    } else {
        Value::Null
    };
    Ok((
        Seen {
            status,
            media: media(ct.as_deref()),
            body,
        },
        headers,
    ))
}

/// The requests both must answer alike: (what, path, method, headers, body, client).
struct Case {
    what: &'static str,
    path: String,
    method: reqwest::Method,
    headers: Vec<(&'static str, &'static str)>,
    body: Option<&'static str>,
    client: usize,
}

fn get(what: &'static str, path: &str, headers: &[(&'static str, &'static str)]) -> Case {
    Case {
        what,
        path: path.to_string(),
        method: reqwest::Method::GET,
        headers: headers.to_vec(),
        body: None,
        client: 0,
    }
}

const REVIEW: &str = r#"{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}"#;

fn review(what: &'static str, headers: &[(&'static str, &'static str)], client: usize) -> Case {
    Case {
        what,
        path: "/apis/authentication.k8s.io/v1/selfsubjectreviews".into(),
        method: reqwest::Method::POST,
        headers: headers.to_vec(),
        body: Some(REVIEW),
        client,
    }
}

/// Clients: 0 admin (client certificate), 1 the front proxy's certificate, 2 a front proxy
/// certificate of an untrusted CA, 3 alice's client certificate.
fn clients(pki: &TestPki) -> Result<Vec<reqwest::Client>> {
    let admin = pki.client_cert(
        "admin",
        &Subject::new().cn("kubernetes-admin").o("system:masters"),
    )?;
    let evil_proxy: CertFiles = pki.evil_ca.issue(
        pki.dir.path(),
        "evil-front-proxy",
        &Subject::new().cn("front-proxy-client"),
        skewgate_tests::CertUsage::Client,
        &[],
    )?;
    let alice = pki.client_cert("alice", &Subject::new().cn("alice").o("testers"))?;
    Ok(vec![
        real_client(pki, Some(&admin))?,
        real_client(pki, Some(&pki.front_proxy_client))?,
        real_client(pki, Some(&evil_proxy))?,
        real_client(pki, Some(&alice))?,
    ])
}

fn cases() -> Vec<Case> {
    vec![
        get("aggregated /apis", "/apis", &[("Accept", AGGREGATED)]),
        get("aggregated /api", "/api", &[("Accept", AGGREGATED)]),
        get("aggregated /apis, profile=nopeer", "/apis", &[("Accept", NOPEER)]),
        get(
            "aggregated /apis, v2beta1",
            "/apis",
            &[(
                "Accept",
                "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList",
            )],
        ),
        get(
            "aggregated /apis, a version nobody serves, then JSON",
            "/apis",
            &[(
                "Accept",
                "application/json;g=apidiscovery.k8s.io;v=v9;as=APIGroupDiscoveryList,application/json",
            )],
        ),
        get("legacy /apis", "/apis", &[("Accept", "application/json")]),
        get("legacy /api", "/api", &[("Accept", "application/json")]),
        get("legacy /api/v1", "/api/v1", &[("Accept", "application/json")]),
        get(
            "legacy /apis/<group>/<version>",
            "/apis/certificates.k8s.io/v1",
            &[("Accept", "application/json")],
        ),
        get("/apis, protobuf only", "/apis", &[("Accept", PROTOBUF)]),
        get("a group nobody serves", "/apis/nope.example/v1/things", &[]),
        get(
            "a resource a served group-version does not have",
            "/apis/certificates.k8s.io/v1/nonexistent",
            &[],
        ),
        get(
            "... one of its objects",
            "/apis/certificates.k8s.io/v1/nonexistent/x",
            &[],
        ),
        get(
            "a subresource its resource does not have",
            "/apis/certificates.k8s.io/v1/certificatesigningrequests/x/nonexistent",
            &[],
        ),
        get(
            "a cluster-scoped resource under a namespace",
            "/apis/certificates.k8s.io/v1/namespaces/default/certificatesigningrequests",
            &[],
        ),
        get(
            "a missing object",
            "/api/v1/namespaces/default/configmaps/missing",
            &[],
        ),
        get(
            "a missing object of a cluster-scoped resource",
            "/apis/certificates.k8s.io/v1/certificatesigningrequests/missing",
            &[],
        ),
        review("whoami, client certificate", &[], 0),
        review(
            "whoami, the front proxy with X-Remote-User/X-Remote-Group",
            &[("X-Remote-User", "alice"), ("X-Remote-Group", "g1")],
            1,
        ),
        review("whoami, the front proxy without X-Remote-User", &[], 1),
        review(
            "whoami, an untrusted front proxy with X-Remote-User",
            &[("X-Remote-User", "alice")],
            2,
        ),
        review(
            "whoami, a client certificate sending X-Remote-User",
            &[("X-Remote-User", "mallory")],
            3,
        ),
        review(
            "whoami, a static token",
            &[("Authorization", "Bearer token-bob-0123456789")],
            usize::MAX,
        ),
    ]
}

/// The first events of a watch with `sendInitialEvents`: their types and, for a bookmark,
/// whether it ends the initial events.
async fn watch_events(client: &reqwest::Client, base: &str) -> Result<Vec<String>> {
    let url = format!(
        "{base}/api/v1/namespaces/default/configmaps?watch=1&allowWatchBookmarks=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=20"
    );
    let response = client.get(url).send().await?;
    let mut out = vec![format!(
        "{} {}",
        response.status().as_u16(),
        media(
            response
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
        )
    )];
    let mut stream = response.bytes_stream();
    let mut buffer = Vec::new();
    let read = async {
        while let Some(chunk) = stream.next().await {
            buffer.extend_from_slice(&chunk?);
            while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buffer.drain(..=end).collect();
                let event: Value = serde_json::from_slice(&line)?;
                let kind = event["type"].as_str().unwrap_or("?").to_string();
                let name = event["object"]["metadata"]["name"].as_str().unwrap_or("");
                let ends = event["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"]
                    .as_str()
                    .unwrap_or("");
                out.push(format!("{kind} {name}{ends}"));
                if kind == "BOOKMARK" {
                    return Ok::<_, anyhow::Error>(());
                }
            }
        }
        Ok(())
    };
    tokio::time::timeout(Duration::from_secs(15), read)
        .await
        .unwrap_or(Ok(()))?;
    Ok(out)
}

/// The shape of an identity Lease: what skewgate's lease watcher reads, with the host- and
/// port-specific values replaced by their form.
fn lease_shape(lease: &Value, hostname: &str, port: u16) -> Value {
    let name = lease["metadata"]["name"].as_str().unwrap_or("");
    let holder = lease["spec"]["holderIdentity"].as_str().unwrap_or("");
    serde_json::json!({
        "name is apiserver-<hash of the hostname>": name == identity_lease_name(hostname),
        "labels": lease["metadata"]["labels"].as_object().map(|l| {
            l.iter().map(|(k, v)| (k.clone(), if k == "kubernetes.io/hostname" {
                Value::from(v.as_str() == Some(hostname))
            } else { v.clone() })).collect::<serde_json::Map<_, _>>()
        }),
        "peer-advertise-address is <advertise address>:<secure port>":
            lease["metadata"]["annotations"]["kubernetes.io/peer-advertise-address"].as_str()
                == Some(&format!("127.0.0.1:{port}")),
        "holder is <name>_<uuid>": holder.strip_prefix(&format!("{name}_")).is_some_and(|u| u.len() == 36),
        "leaseDurationSeconds": lease["spec"]["leaseDurationSeconds"],
        "renewTime set": lease["spec"]["renewTime"].is_string(),
    })
}

async fn identity_lease(client: &reqwest::Client, base: &str) -> Result<Option<Value>> {
    let list: Value = client
        .get(format!("{base}/apis/coordination.k8s.io/v1/namespaces/kube-system/leases?labelSelector=apiserver.kubernetes.io%2Fidentity%3Dkube-apiserver"))
        .send()
        .await?
        .json()
        .await?;
    Ok(list["items"].get(0).cloned())
}

async fn conformance(release: &str) -> Result<()> {
    let pki = TestPki::generate()?;
    let etcd = Etcd::start_real().await?;
    let real_options = RealOptions::new(release, &etcd);
    let real_prefix = real_options.etcd_prefix.clone();
    let sim_prefix = format!("/sim-{release}");
    let mut real = RealApiserver::start(&real_options, &pki).await?;
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")?
        .trim()
        .to_string();
    let mut sim = SimApiserver::start_with(SimOptions {
        hostname: Some(hostname.clone()),
        etcd: Some(etcd.url.clone()),
        etcd_prefix: Some(sim_prefix.clone()),
        ..SimOptions::new("sim", &format!("k8s-{release}")).with_pki(&pki)
    })
    .await?;
    let targets = [
        Target {
            name: "kube-apiserver",
            url: real.url(),
        },
        Target {
            name: "sim-apiserver",
            url: sim.url(),
        },
    ];
    let clients = clients(&pki)?;
    let anonymous = real_client(&pki, None)?;
    let mut differences = Vec::new();
    let mut note = |what: String, real: String, sim: String| {
        if real != sim {
            differences.push(format!(
                "{what}:\n  kube-apiserver: {real}\n  sim-apiserver:  {sim}"
            ));
        }
    };

    for case in cases() {
        let client = clients.get(case.client).unwrap_or(&anonymous);
        let mut seen = Vec::new();
        for t in &targets {
            let (s, headers) = observe(
                client,
                &format!("{}{}", t.url, case.path),
                case.method.clone(),
                &case.headers,
                case.body,
            )
            .await
            .with_context(|| format!("{} to {}", case.what, t.name))?;
            // Discovery's caching headers, where skewgate reads them.
            let etag = headers.get("etag").is_some();
            let vary = headers
                .get("vary")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.to_ascii_lowercase().contains("accept"));
            let cache = if s.status == 200 && case.headers.iter().any(|(_, v)| *v == AGGREGATED) {
                format!(" etag={etag} vary-accept={vary}")
            } else {
                String::new()
            };
            seen.push((s, cache, headers));
        }
        note(
            format!("{} ({} {})", case.what, case.method, case.path),
            format!("{:?}{}", seen[0].0, seen[0].1),
            format!("{:?}{}", seen[1].0, seen[1].1),
        );
        // A conditional GET with the ETag each answered: 304.
        if case.what == "aggregated /apis" {
            let mut codes = Vec::new();
            for (t, (_, _, headers)) in targets.iter().zip(&seen) {
                let etag = headers
                    .get("etag")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                let (s, _) = observe(
                    &clients[0],
                    &format!("{}/apis", t.url),
                    reqwest::Method::GET,
                    &[("Accept", AGGREGATED), ("If-None-Match", etag)],
                    None,
                )
                .await?;
                codes.push(s.status.to_string());
            }
            note(
                "aggregated /apis with If-None-Match: its ETag".into(),
                codes[0].clone(),
                codes[1].clone(),
            );
        }
    }

    // The discovery documents themselves: the simulator serves the captured ones.
    for (path, accept) in [("/apis", AGGREGATED), ("/api/v1", "application/json")] {
        let mut docs = Vec::new();
        for t in &targets {
            let v: Value = clients[0]
                .get(format!("{}{path}", t.url))
                .header("Accept", accept)
                .send()
                .await?
                .json()
                .await?;
            docs.push(v);
        }
        note(
            format!("the document of GET {path}"),
            if docs[0] == docs[1] {
                "equal"
            } else {
                "differs"
            }
            .into(),
            "equal".into(),
        );
    }

    // A watch with bookmarks: the initial objects, then the bookmark that ends them.
    for t in &targets {
        let _ = clients[0]
            .post(format!("{}/api/v1/namespaces/default/configmaps", t.url))
            .header("Content-Type", "application/json")
            .body(r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"conformance"}}"#)
            .send()
            .await?;
    }
    let real_watch = watch_events(&clients[0], &targets[0].url).await?;
    let sim_watch = watch_events(&clients[0], &targets[1].url).await?;
    eprintln!("kube-apiserver {release}: a watch with bookmarks: {real_watch:?}");
    note(
        "a watch with sendInitialEvents and bookmarks".into(),
        format!("{real_watch:?}"),
        format!("{sim_watch:?}"),
    );

    // The identity Lease.
    let real_lease = identity_lease(&clients[0], &targets[0].url)
        .await?
        .context("kube-apiserver keeps no identity Lease")?;
    let sim_lease = identity_lease(&clients[0], &targets[1].url)
        .await?
        .context("sim-apiserver keeps no identity Lease")?;
    note(
        "the identity Lease".into(),
        lease_shape(&real_lease, &hostname, real.address.port).to_string(),
        lease_shape(&sim_lease, &hostname, sim.address.port).to_string(),
    );

    // /readyz while starting: a second kube-apiserver on the same etcd, asked from its first
    // answer on; the simulator with --not-ready-for.
    let real_first = first_readyz_answer(&RealOptions::new(release, &etcd), &pki).await?;
    let sim_starting = SimApiserver::start_with(SimOptions {
        extra_args: vec!["--not-ready-for=5s".into()],
        lease: false,
        ..SimOptions::new("starting", &format!("k8s-{release}")).with_pki(&pki)
    })
    .await?;
    let (sim_first, _) = observe(
        &anonymous,
        &format!("{}/readyz", sim_starting.url()),
        reqwest::Method::GET,
        &[],
        None,
    )
    .await?;
    note(
        "/readyz while starting, as Envoy's health check judges it".into(),
        real_first,
        readyz_form(&sim_first),
    );

    // A graceful stop deletes the identity Lease (kube-apiserver from 1.35 on): read in etcd,
    // under each one's prefix.
    let lease_name = identity_lease_name(&hostname);
    real.terminate()?;
    real.wait_exit(Duration::from_secs(60)).await?;
    sim.terminate().await?;
    let mut kept = Vec::new();
    for prefix in [real_prefix.as_str(), sim_prefix.as_str()] {
        let keys = etcd_keys(&etcd.url, prefix).await?;
        let lease = keys
            .iter()
            .any(|k| k.ends_with(&format!("/leases/kube-system/{lease_name}")));
        kept.push(if lease { "kept" } else { "deleted" }.to_string());
    }
    note(
        "after SIGTERM, its identity Lease".into(),
        kept[0].clone(),
        kept[1].clone(),
    );

    assert!(
        differences.is_empty(),
        "kube-apiserver {release} and sim-apiserver (k8s-{release}) differ where skewgate relies on them:\n\n{}",
        differences.join("\n\n")
    );
    Ok(())
}

/// `/readyz` reduced to what Envoy's health check reads: ready or not, by its statuses.
fn readyz_form(s: &Seen) -> String {
    let code = i64::from(s.status);
    let ready = READY_STATUSES
        .iter()
        .any(|&(start, end)| (start..end).contains(&code));
    format!("{}ready", if ready { "" } else { "not " })
}

/// The first `/readyz` answer of a kube-apiserver starting (polled from the moment it is
/// spawned; it answers 500 until its post-start hooks finish), reduced by [`readyz_form`].
async fn first_readyz_answer(opts: &RealOptions, pki: &TestPki) -> Result<String> {
    let client = real_client(pki, None)?;
    let apiserver = RealApiserver::spawn(opts, pki)?;
    let url = format!("{}/readyz", apiserver.url());
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(response) = client.get(&url).send().await {
            let status = response.status().as_u16();
            let ct = response
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let text = response.text().await.unwrap_or_default();
            return Ok(readyz_form(&Seen {
                status,
                media: media(ct.as_deref()),
                body: Value::String(text.trim().to_string()),
            }));
        }
        if std::time::Instant::now() > deadline {
            anyhow::bail!(
                "kube-apiserver never answered /readyz:\n{}",
                apiserver.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The keys etcd holds under `prefix/` (its JSON gateway, `/v3/kv/range`, keys only).
async fn etcd_keys(url: &str, prefix: &str) -> Result<Vec<String>> {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let answer: Value = reqwest::Client::new()
        .post(format!("{url}/v3/kv/range"))
        .json(&serde_json::json!({
            "key": b64(&format!("{prefix}/")),
            "range_end": b64(&format!("{prefix}0")),
            "keys_only": true,
        }))
        .send()
        .await?
        .json()
        .await?;
    Ok(answer["kvs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|kv| kv["key"].as_str())
        .filter_map(|k| base64::engine::general_purpose::STANDARD.decode(k).ok())
        .map(|k| String::from_utf8_lossy(&k).into_owned())
        .collect())
}

#[tokio::test]
async fn the_simulator_answers_like_kube_apiserver_1_36() -> Result<()> {
    conformance(REAL_RELEASES[0]).await
}

#[tokio::test]
async fn the_simulator_answers_like_kube_apiserver_1_37() -> Result<()> {
    conformance(REAL_RELEASES[1]).await
}
