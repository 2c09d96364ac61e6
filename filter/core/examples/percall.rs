//! Per-call cost of skewgate-core's request path and configuration load, measured in
//! instructions with `valgrind --tool=callgrind` (deterministic, unlike wall time on a shared
//! machine). `scripts/bench` drives it; BENCHMARKS.md has the commands and the numbers.
//!
//! ```text
//! percall CASE ITERATIONS FILTER_CONFIG_JSON   run CASE ITERATIONS times, print wall ns/call
//! percall list                                 the cases, one a line
//! percall write-synthetic FILTER_CONFIG_JSON OUT [GROUPS]
//!                                              write the synthetic configuration: GROUPS
//!                                              (default 500) groups of 6 CRD resources
//! ```
//!
//! Every case does the same setup (read and compile the configuration, build the inputs)
//! whatever ITERATIONS is, so `Ir(ITERATIONS) - Ir(0)` is exactly the cost of the loop, and
//! divided by ITERATIONS the cost of one call. Inputs and results go through `black_box`, and
//! every result is dropped inside the loop (its deallocation counts, as in the filter).
//!
//! FILTER_CONFIG_JSON is the filter configuration `skewgate-control render-static
//! --filter-config-out` writes for the 1.30 + 1.33 fixtures (local 1.30, peer 1.33): the
//! routing cases use its routing table, the `config-*` cases parse it, and the `crd3000` cases
//! parse it with 3000 synthetic CRD resources added (see [`synthetic`]).

use std::error::Error;
use std::hint::black_box;
use std::time::Instant;

use skewgate_core::config::{FilterConfig, GroupVersionRoutes, JsonDocument, ResourceRoute};
use skewgate_core::discovery::{DiscoveryAnswer, DiscoveryHeaders, MergedDiscovery};
use skewgate_core::plan::{self, CompiledConfig, RequestPlan};
use skewgate_core::routing::{Reason, RoutingTable};
use skewgate_core::{hygiene, identity, negotiation};

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// kubectl / client-go 1.30+ asking for `/apis` (AcceptV2, AcceptV2Beta1, JSON at q=0.9).
const KUBECTL_ACCEPT: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json;q=0.9";

/// A kubeadm admin certificate as Envoy prints it (`connection.subject_peer_certificate`).
const ADMIN_SUBJECT: &str = "O=kubeadm:cluster-admins,CN=kubernetes-admin";

/// Served by the local 1.30 apiserver.
const LOCAL_LIST: &str = "/apis/apps/v1/namespaces/default/deployments?limit=500";
/// Served only by the 1.33 peer.
const PEER_GET: &str = "/apis/resource.k8s.io/v1beta2/namespaces/default/resourceclaims/gpu-claim";
/// What client-go's reflector sends for a pod informer.
const WATCH: &str = "/api/v1/namespaces/kube-system/pods?allowWatchBookmarks=true&labelSelector=app%3Dweb%2Ctier%21%3Dcache&resourceVersion=123456&timeoutSeconds=540&watch=true";

/// The request headers a kubectl GET carries through Envoy (HTTP/1.1, bearer token), as the
/// filter sees them: 15 names, none forbidden.
const HEADERS_CLEAN: [&str; 15] = [
    ":authority",
    ":path",
    ":method",
    ":scheme",
    "user-agent",
    "accept",
    "accept-encoding",
    "authorization",
    "kubectl-command",
    "kubectl-session",
    "x-forwarded-proto",
    "x-request-id",
    "x-forwarded-for",
    "audit-id",
    "x-envoy-expected-rq-timeout-ms",
];

/// The same 15 with three spoofing attempts among them (in mixed case).
const HEADERS_SPOOFED: [&str; 15] = [
    ":authority",
    ":path",
    ":method",
    ":scheme",
    "user-agent",
    "accept",
    "X-Remote-User",
    "authorization",
    "x-remote-group",
    "kubectl-session",
    "x-forwarded-proto",
    "X-Kubernetes-Peer-Proxied",
    "x-forwarded-for",
    "audit-id",
    "x-envoy-expected-rq-timeout-ms",
];

/// A kubectl GET of one local object as the filter reads it from Envoy (HTTP/1.1, bearer
/// token, the headers Envoy adds): what `plan::plan_request` gets.
const KUBECTL_GET: [(&str, &str); 12] = [
    (":authority", "10.0.0.1:6443"),
    (":path", "/apis/apps/v1/namespaces/default/deployments/web"),
    (":method", "GET"),
    (":scheme", "https"),
    (
        "user-agent",
        "kubectl/v1.37.1 (linux/amd64) kubernetes/0000000",
    ),
    ("accept", "application/json"),
    ("accept-encoding", "gzip"),
    (
        "authorization",
        "Bearer abcdefghijklmnopqrstuvwxyz0123456789",
    ),
    ("kubectl-command", "kubectl get"),
    ("kubectl-session", "0123abcd-4567-89ef-0123-456789abcdef"),
    ("x-forwarded-proto", "https"),
    ("x-request-id", "0123abcd-4567-89ef-0123-456789abcdef"),
];

const CASES: &[(&str, &str)] = &[
    (
        "plan-local-get",
        "plan::plan_request + header_ops, a kubectl GET of a local object (12 headers, token)",
    ),
    (
        "route-local-list",
        "RoutingTable::route GET (local GVR list)",
    ),
    (
        "route-peer-get",
        "RoutingTable::route GET (peer-only namespaced get)",
    ),
    ("route-watch", "RoutingTable::route GET (watch with query)"),
    (
        "route-hostile",
        "RoutingTable::route GET (8 KiB hostile path)",
    ),
    (
        "route-hostile-64k",
        "RoutingTable::route GET (64 KiB hostile path)",
    ),
    (
        "route-hostile-1m",
        "RoutingTable::route GET (1000 KiB hostile path)",
    ),
    (
        "negotiate-kubectl",
        "negotiation::negotiate_discovery (kubectl Accept)",
    ),
    (
        "discovery-answer-resource",
        "MergedDiscovery::answer (a resource path: not discovery)",
    ),
    (
        "discovery-answer-apis",
        "MergedDiscovery::answer (GET /apis, kubectl Accept)",
    ),
    (
        "hygiene-15-clean",
        "hygiene::forbidden_names (15 headers, none forbidden)",
    ),
    (
        "hygiene-15-spoofed",
        "hygiene::forbidden_names (15 headers, 3 forbidden)",
    ),
    (
        "identity-admin",
        "identity::identity_from_subject (kubeadm admin)",
    ),
    (
        "config-real-parse",
        "FilterConfig::from_json (1.30+1.33 merged config)",
    ),
    (
        "config-real-load",
        "from_json + RoutingTable::compile + MergedDiscovery::compile (1.30+1.33)",
    ),
    (
        "config-crd3000-parse",
        "FilterConfig::from_json (synthetic, 3000 CRD resources)",
    ),
    (
        "config-crd3000-load",
        "from_json + RoutingTable::compile + MergedDiscovery::compile (3000 CRDs)",
    ),
    (
        "config-crd3000-load-gzip",
        "load (3000 CRDs) + first gzip of merged /apis",
    ),
];

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["list"] => {
            for (name, what) in CASES {
                println!("{name}\t{what}");
            }
            Ok(())
        }
        ["write-synthetic", config, out] => {
            let bytes = synthetic(&std::fs::read(config)?, 500)?;
            std::fs::write(out, &bytes)?;
            Ok(())
        }
        ["write-synthetic", config, out, groups] => {
            let bytes = synthetic(&std::fs::read(config)?, groups.parse()?)?;
            std::fs::write(out, &bytes)?;
            Ok(())
        }
        [case, iterations, config] => {
            let iterations: u64 = iterations.parse()?;
            let real = std::fs::read(config)?;
            run(case, iterations, &real)
        }
        _ => Err("usage: percall CASE ITERATIONS FILTER_CONFIG_JSON | percall list | percall write-synthetic FILTER_CONFIG_JSON OUT [GROUPS]".into()),
    }
}

/// Setup, then the loop. Prints `CASE ITERATIONS NS_PER_CALL` (wall time: indicative only).
fn run(case: &str, iterations: u64, real: &[u8]) -> Result<()> {
    let config = FilterConfig::from_json(real)?;
    let table = RoutingTable::compile(&config);
    let merged = config
        .discovery
        .as_ref()
        .map(MergedDiscovery::compile)
        .ok_or("the configuration has no merged discovery")?;
    let hostile = hostile_path(match case {
        "route-hostile-64k" => 64 * 1024,
        "route-hostile-1m" => 1000 * 1024,
        _ => 8 * 1024,
    });
    let synthetic_bytes = if case.starts_with("config-crd3000") {
        synthetic(real, 500)?
    } else {
        Vec::new()
    };
    check(case, &table, &merged, &hostile)?;
    let compiled = CompiledConfig::compile(&config);
    let kubectl_get: Vec<(String, Vec<u8>)> = KUBECTL_GET
        .iter()
        .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
        .collect();
    if case == "plan-local-get" {
        match plan::plan_request(&kubectl_get, None, &compiled) {
            RequestPlan::Forward(f) if f.cluster == "skewgate-local-token" => {}
            other => return Err(format!("plan-local-get: {other:?}").into()),
        }
    }

    let start = Instant::now();
    match case {
        "plan-local-get" => {
            for _ in 0..iterations {
                if let RequestPlan::Forward(f) =
                    plan::plan_request(black_box(&kubectl_get), None, black_box(&compiled))
                {
                    black_box(f.header_ops());
                    black_box(f);
                }
            }
        }
        "route-local-list" => route(&table, LOCAL_LIST, iterations),
        "route-peer-get" => route(&table, PEER_GET, iterations),
        "route-watch" => route(&table, WATCH, iterations),
        "route-hostile" | "route-hostile-64k" | "route-hostile-1m" => {
            route(&table, &hostile, iterations)
        }
        "negotiate-kubectl" => {
            for _ in 0..iterations {
                let _ = black_box(negotiation::negotiate_discovery(black_box(Some(
                    KUBECTL_ACCEPT.as_bytes(),
                ))));
            }
        }
        "discovery-answer-resource" => answer(&merged, PEER_GET, iterations),
        "discovery-answer-apis" => answer(&merged, "/apis", iterations),
        "hygiene-15-clean" => forbidden(&HEADERS_CLEAN, iterations),
        "hygiene-15-spoofed" => forbidden(&HEADERS_SPOOFED, iterations),
        "identity-admin" => {
            for _ in 0..iterations {
                let _ = black_box(identity::identity_from_subject(black_box(ADMIN_SUBJECT)));
            }
        }
        "config-real-parse" => parse(real, iterations)?,
        "config-real-load" => load(real, iterations, false)?,
        "config-crd3000-parse" => parse(&synthetic_bytes, iterations)?,
        "config-crd3000-load" => load(&synthetic_bytes, iterations, false)?,
        "config-crd3000-load-gzip" => load(&synthetic_bytes, iterations, true)?,
        other => return Err(format!("unknown case {other:?} (percall list)").into()),
    }
    let elapsed = start.elapsed();
    let per_call = if iterations == 0 {
        0.0
    } else {
        elapsed.as_nanos() as f64 / iterations as f64
    };
    println!("{case} {iterations} {per_call:.0}");
    Ok(())
}

/// The inputs do what the case names say (outside the measured loop).
fn check(case: &str, table: &RoutingTable, merged: &MergedDiscovery, hostile: &str) -> Result<()> {
    let want = |path: &str, reason: Reason| -> Result<()> {
        let (_, decision) = table.route("GET", path);
        if decision.reason == reason {
            Ok(())
        } else {
            Err(format!("{case}: {path:.80} decided {decision:?}, expected {reason:?}").into())
        }
    };
    match case {
        "route-local-list" | "route-watch" => want(
            if case == "route-watch" {
                WATCH
            } else {
                LOCAL_LIST
            },
            Reason::ServedLocally,
        ),
        "route-peer-get" => want(PEER_GET, Reason::ServedByPeer),
        "route-hostile" | "route-hostile-64k" | "route-hostile-1m" => {
            // Long, not invalid: parsed unless its path (not only its query) is past the bound.
            let (info, _) = table.route("GET", hostile);
            let path = hostile.split_once('?').map_or(hostile, |(path, _)| path);
            let parsed = path.len() <= skewgate_core::routing::MAX_ROUTED_PATH;
            if info.is_some() == parsed {
                Ok(())
            } else {
                Err(format!("{case}: parsed {}, want {parsed}", info.is_some()).into())
            }
        }
        "discovery-answer-apis" => match answer_once(merged, "/apis") {
            DiscoveryAnswer::Respond(r) if r.status == 200 => Ok(()),
            other => Err(format!("discovery-answer-apis: {other:?}").into()),
        },
        "discovery-answer-resource" => match answer_once(merged, PEER_GET) {
            DiscoveryAnswer::Pass => Ok(()),
            other => Err(format!("discovery-answer-resource: {other:?}").into()),
        },
        "hygiene-15-clean" if !hygiene::forbidden_names(HEADERS_CLEAN).is_empty() => {
            Err("hygiene-15-clean: found forbidden names".into())
        }
        "hygiene-15-spoofed" if hygiene::forbidden_names(HEADERS_SPOOFED).len() != 3 => {
            Err("hygiene-15-spoofed: expected 3 forbidden names".into())
        }
        "identity-admin" => match identity::identity_from_subject(ADMIN_SUBJECT) {
            Ok(id) if id.user == "kubernetes-admin" => Ok(()),
            other => Err(format!("identity-admin: {other:?}").into()),
        },
        _ => Ok(()),
    }
}

fn route(table: &RoutingTable, path: &str, iterations: u64) {
    for _ in 0..iterations {
        let _ = black_box(table.route(black_box("GET"), black_box(path)));
    }
}

/// What kubectl sends for discovery: its Accept, and `Accept-Encoding: gzip`, which Go's
/// transport adds (the merged `/apis` of the fixtures is below the 128 KiB gzip threshold, so
/// it is answered uncompressed).
const KUBECTL_DISCOVERY_HEADERS: DiscoveryHeaders<'static> = DiscoveryHeaders {
    accept: Some(KUBECTL_ACCEPT.as_bytes()),
    if_none_match: None,
    accept_encoding: Some(b"gzip"),
};

fn answer_once<'a>(merged: &'a MergedDiscovery, path: &str) -> DiscoveryAnswer<'a> {
    merged.answer("GET", path, KUBECTL_DISCOVERY_HEADERS).0
}

fn answer(merged: &MergedDiscovery, path: &str, iterations: u64) {
    for _ in 0..iterations {
        let _ = black_box(merged.answer(
            black_box("GET"),
            black_box(path),
            black_box(KUBECTL_DISCOVERY_HEADERS),
        ));
    }
}

fn forbidden(names: &[&'static str; 15], iterations: u64) {
    for _ in 0..iterations {
        let _ = black_box(hygiene::forbidden_names(black_box(names.iter().copied())));
    }
}

fn parse(bytes: &[u8], iterations: u64) -> Result<()> {
    for _ in 0..iterations {
        black_box(FilterConfig::from_json(black_box(bytes))?);
    }
    Ok(())
}

/// What the filter's `on_configure` does with a configuration (`filter/src/root.rs`); with
/// `gzip`, also the first gzip-accepting `/apis` request, which compresses the document once.
fn load(bytes: &[u8], iterations: u64, gzip: bool) -> Result<()> {
    for _ in 0..iterations {
        let config = FilterConfig::from_json(black_box(bytes))?;
        let table = RoutingTable::compile(&config);
        let merged = config.discovery.as_ref().map(MergedDiscovery::compile);
        if gzip {
            if let Some(merged) = &merged {
                let headers = DiscoveryHeaders {
                    accept: Some(KUBECTL_ACCEPT.as_bytes()),
                    if_none_match: None,
                    accept_encoding: Some(b"gzip"),
                };
                match merged.answer("GET", "/apis", headers).0 {
                    DiscoveryAnswer::Respond(r) if r.gzip => {
                        black_box(r.body);
                    }
                    other => return Err(format!("expected a gzipped /apis: {other:?}").into()),
                }
            }
        }
        black_box((config, table, merged));
    }
    Ok(())
}

/// A long path a hostile client may send, still a valid resource request: a namespace of
/// percent escapes, then about 60% of `len` in escaped-slash dot segments, then a long query;
/// at most `len` bytes. Envoy passes paths up to its `max_request_headers_kb` (1024 KiB in
/// skewgate's bootstraps) through the filter: measured with 8 KiB to 1000 KiB.
fn hostile_path(len: usize) -> String {
    let mut path = String::from("/apis/apps/v1/namespaces/");
    path.push_str(&"%61".repeat(300));
    path.push_str("/deployments/");
    let segment = "x%2F..%2F";
    while path.len() + segment.len() <= len * 6 / 10 {
        path.push_str(segment);
    }
    path.push_str("/status?");
    let param = "watch=false&labelSelector=a%3Db&";
    while path.len() + param.len() <= len {
        path.push_str(param);
    }
    path
}

/// The real configuration plus `groups` × 6 CRD resources (the benchmarks use 500 groups: 3000
/// resources): groups `crd-NNN.bench.example.com`,
/// one version `v1`, six namespaced resources each with a `status` subresource. Each resource
/// is listed in the routing table as served locally (what `render-static` emits for a CRD
/// group-version not marked `--shared-storage`; the live control plane marks CRDs shared
/// storage and lists no resources, which is cheaper to parse and compile), in the merged
/// aggregated `/apis` with the fields kube-apiserver emits for a CRD, and in the legacy `/apis`
/// `APIGroupList`.
fn synthetic(real: &[u8], groups: usize) -> Result<Vec<u8>> {
    const PER_GROUP: usize = 6;
    let mut config = FilterConfig::from_json(real)?;
    let discovery = config
        .discovery
        .as_mut()
        .ok_or("the configuration has no merged discovery")?;
    let mut apis: serde_json::Value = serde_json::from_str(discovery.apis.get())?;
    let mut legacy_apis: Option<serde_json::Value> = discovery
        .legacy
        .get("/apis")
        .map(|d| serde_json::from_str(d.get()))
        .transpose()?;
    for g in 0..groups {
        let group = format!("crd-{g:03}.bench.example.com");
        let mut routes = Vec::new();
        let mut resources = Vec::new();
        for r in 0..PER_GROUP {
            let kind = format!("Widget{r}");
            let plural = format!("widget{r}s");
            routes.push(ResourceRoute {
                departed_cluster: None,
                retained: false,
                failover_cluster: None,
                resource: plural.clone(),
                local: true,
                peer_cluster: None,
            });
            routes.push(ResourceRoute {
                departed_cluster: None,
                retained: false,
                failover_cluster: None,
                resource: format!("{plural}/status"),
                local: true,
                peer_cluster: None,
            });
            resources.push(serde_json::json!({
                "resource": plural,
                "responseKind": {"group": group, "version": "v1", "kind": kind},
                "scope": "Namespaced",
                "singularResource": format!("widget{r}"),
                "verbs": ["delete", "deletecollection", "get", "list", "patch", "create", "update", "watch"],
                "shortNames": [format!("w{r}")],
                "categories": ["all"],
                "subresources": [{
                    "subresource": "status",
                    "responseKind": {"group": group, "version": "v1", "kind": kind},
                    "verbs": ["get", "patch", "update"],
                }],
            }));
        }
        config.group_versions.push(GroupVersionRoutes {
            group: group.clone(),
            version: "v1".into(),
            shared_storage: false,
            resources: routes,
        });
        if let Some(items) = apis.get_mut("items").and_then(|i| i.as_array_mut()) {
            items.push(serde_json::json!({
                "metadata": {"name": group, "creationTimestamp": null},
                "versions": [{"version": "v1", "resources": resources, "freshness": "Current"}],
            }));
        }
        if let Some(groups) = legacy_apis
            .as_mut()
            .and_then(|l| l.get_mut("groups"))
            .and_then(|g| g.as_array_mut())
        {
            let gv = format!("{group}/v1");
            groups.push(serde_json::json!({
                "name": group,
                "versions": [{"groupVersion": gv, "version": "v1"}],
                "preferredVersion": {"groupVersion": gv, "version": "v1"},
            }));
        }
    }
    discovery.apis = JsonDocument::from_str(&apis.to_string())?;
    if let Some(legacy) = legacy_apis {
        discovery
            .legacy
            .insert("/apis".into(), JsonDocument::from_str(&legacy.to_string())?);
    }
    let json = config.to_json();
    // It must load like the real one.
    FilterConfig::from_json(json.as_bytes())?;
    Ok(json.into_bytes())
}
