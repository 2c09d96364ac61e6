//! The shell's pipeline against a fake host that keeps the header maps and records every call.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::rc::Rc;
use std::time::Duration;

use crate::config::{
    DiscoveryConfig, FilterConfig, GroupVersionRoutes, JsonDocument, ResourceRoute, SCHEMA_VERSION,
};
use crate::plan::CompiledConfig;
use crate::shared_discovery::{SharedData, StoreError, Versioned};

use super::{Configured, Request, Worker};
use crate::pipeline::{Action, Bytes, Headers, Host, HostError, Level};

/// proxy-wasm's `Status::InternalFailure`, as a host would report it.
const INTERNAL_FAILURE: u32 = 10;

const RESOURCECLAIM: &str = "/apis/resource.k8s.io/v1beta2/namespaces/default/resourceclaims/gpu";
const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/default/deployments?limit=500";
const WATCH_PODS: &str = "/api/v1/namespaces/default/pods?watch=true";
const KUBECTL_ACCEPT: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json;q=0.9";
const KUBECTL_ACCEPT_BYTES: &[u8] = KUBECTL_ACCEPT.as_bytes();
const V2: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
const APIS: &str = r#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","metadata":{},"items":[{"metadata":{"name":"apps"}}]}"#;
const API: &str = r#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","metadata":{},"items":[]}"#;
const GROUPS: &str = r#"{"kind":"APIGroupList","apiVersion":"v1","groups":[]}"#;
const CONNECTION_FAILURE: &str =
    "upstream_reset_before_response_started{remote_connection_failure,delayed_connect_error:_Connection_refused}";

const HITS: &str = "aggregator_discovery_peer_aggregated_cache_hits_total";
const MISSES: &str = "aggregator_discovery_peer_aggregated_cache_misses_total";
const NOPEER: &str = "aggregator_discovery_nopeer_requests_total";
const REROUTED: &str = "apiserver_rerouted_request_total";
const PEER_ERRORS: &str = "apiserver_peer_proxy_errors_total";
const NOT_SERVED: &str = "skewgate_not_served_404_total";
const CLAIM_LABELS: &str = "group=resource.k8s.io;version=v1beta2;resource=resourceclaims";

thread_local! {
    /// The names of the metrics defined in this test's thread, by id - 1: Envoy's ids outlive
    /// a request, and so do the configuration's cached ids.
    static DEFINED: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A 1.30 local apiserver with a 1.33 peer (cluster `p133`) and merged discovery.
fn compiled() -> Rc<Configured> {
    compiled_with(&[])
}

/// The same, while the discovery of the `pending` peers is not known yet. The apiserver that
/// served `resource.k8s.io/v1beta3` and `pods/resize` is gone: they are retained.
fn compiled_with(pending: &[&str]) -> Rc<Configured> {
    let resource = |resource: &str, local: bool, peer: Option<&str>| ResourceRoute {
        departed_cluster: None,
        resource: resource.into(),
        local,
        peer_cluster: peer.map(str::to_string),
        retained: false,
        failover_cluster: None,
    };
    let retained = |name: &str| ResourceRoute {
        retained: true,
        failover_cluster: None,
        ..resource(name, false, None)
    };
    let gv = |group: &str, version: &str, resources| GroupVersionRoutes {
        group: group.into(),
        version: version.into(),
        shared_storage: false,
        resources,
    };
    let config = FilterConfig {
        departed_clusters: Default::default(),
        fallback: None,
        pending_peers: pending.iter().map(|p| p.to_string()).collect(),
        failover_clusters: Default::default(),
        failover_all: None,
        openapi_v3: BTreeMap::from([(
            "apis/resource.k8s.io/v1beta2".to_string(),
            crate::config::OpenApiPeerEntry {
                server_relative_url: "/openapi/v3/apis/resource.k8s.io/v1beta2?hash=B2".into(),
                peer_cluster: "p133".into(),
                replaces_local: false,
            },
        )]),
        schema: SCHEMA_VERSION,
        local_apiserver: "apiserver-a".into(),
        peer_clusters: BTreeMap::from([("p133".to_string(), vec!["apiserver-b".to_string()])]),
        group_versions: vec![
            gv(
                "",
                "v1",
                vec![resource("pods", true, None), retained("pods/resize")],
            ),
            gv("apps", "v1", vec![resource("deployments", true, None)]),
            gv(
                "resource.k8s.io",
                "v1beta2",
                vec![resource("resourceclaims", false, Some("p133"))],
            ),
            gv(
                "resource.k8s.io",
                "v1beta3",
                vec![retained("resourceclaims")],
            ),
        ],
        discovery: Some(DiscoveryConfig {
            version: String::new(),
            apis: JsonDocument::from_str(APIS).unwrap(),
            apis_etag: "aaa".into(),
            api: JsonDocument::from_str(API).unwrap(),
            api_etag: "bbb".into(),
            legacy: BTreeMap::from([(
                "/apis/resource.k8s.io/v1beta2".to_string(),
                JsonDocument::from_str(GROUPS).unwrap(),
            )]),
            unavailable: ["/apis/resource.k8s.io/v1beta3".to_string()].into(),
        }),
    };
    config.validate().unwrap();
    Rc::new(Configured::new(CompiledConfig::compile(&config)))
}

fn worker() -> Rc<Worker> {
    Rc::new(Worker::new())
}

/// A local reply: status, headers, body.
type Sent = (u32, Vec<(String, String)>, String);

/// Envoy, as far as one request sees it: header maps that the calls change, properties, a
/// clock, and a record of every call.
#[derive(Debug, Default)]
struct FakeHost {
    request: Vec<(String, Bytes)>,
    response: Vec<(String, Bytes)>,
    properties: HashMap<Vec<String>, Bytes>,
    now: Duration,
    /// Every call, as `name arguments`.
    calls: Vec<String>,
    /// Increments by stat name (`name;label=value...`).
    metrics: BTreeMap<String, u64>,
    sent: Option<Sent>,
    /// Each chunk's replacement.
    bodies: Vec<Vec<u8>>,
    /// The response body the upstream sent (what `response_body` reads).
    upstream_body: Vec<u8>,
    logs: Vec<(Level, String)>,
    /// A call (by name) that fails with `HostError(INTERNAL_FAILURE)`.
    failing: Option<&'static str>,
    /// Like Envoy's dynamic modules (`true`) or proxy-wasm (`false`, the default).
    holds_response_headers: bool,
}

impl FakeHost {
    fn call(&mut self, name: &'static str, args: fmt::Arguments<'_>) -> Result<(), HostError> {
        self.calls.push(format!("{name} {args}"));
        if self.failing == Some(name) {
            return Err(HostError(INTERNAL_FAILURE));
        }
        Ok(())
    }

    fn map(&mut self, map: Headers) -> &mut Vec<(String, Bytes)> {
        match map {
            Headers::Request => &mut self.request,
            Headers::Response => &mut self.response,
        }
    }

    /// Every value of a request header, as text.
    fn values(&self, map: Headers, name: &str) -> Vec<String> {
        let map = match map {
            Headers::Request => &self.request,
            Headers::Response => &self.response,
        };
        map.iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            .collect()
    }

    /// The increments of a metric, all label values together.
    fn count(&self, metric: &str) -> u64 {
        self.metrics
            .iter()
            .filter(|(name, _)| name.split(';').next() == Some(metric))
            .map(|(_, n)| n)
            .sum()
    }

    fn infos(&self) -> Vec<&str> {
        self.logs
            .iter()
            .filter(|(level, _)| *level == Level::Info)
            .map(|(_, line)| line.as_str())
            .collect()
    }
}

/// No merged discovery document is kept in shared data in these tests (every configuration
/// here is unversioned, compiled inline); `shared_discovery`'s own tests cover the store.
struct NoSharedData;

impl SharedData for NoSharedData {
    fn get(&self, _key: &str) -> Result<Option<Versioned>, StoreError> {
        Ok(None)
    }

    fn set(&self, _key: &str, _value: &[u8], _cas: Option<u32>) -> Result<(), StoreError> {
        Ok(())
    }
}

impl Host for FakeHost {
    type RequestHeaders = Vec<(String, Bytes)>;

    fn request_headers(&mut self) -> Result<Self::RequestHeaders, HostError> {
        self.call("request_headers", format_args!(""))?;
        Ok(self.request.clone())
    }

    fn response_header(&mut self, name: &str) -> Result<Option<Bytes>, HostError> {
        self.call("response_header", format_args!("{name}"))?;
        Ok(self
            .response
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone()))
    }

    fn property(&mut self, path: &[&str]) -> Result<Option<Bytes>, HostError> {
        self.call("property", format_args!("{}", path.join(".")))?;
        let key: Vec<String> = path.iter().map(|s| s.to_string()).collect();
        Ok(self.properties.get(&key).cloned())
    }

    fn set_header(
        &mut self,
        map: Headers,
        name: &str,
        value: Option<&str>,
    ) -> Result<(), HostError> {
        self.call("set_header", format_args!("{map:?} {name} {value:?}"))?;
        let headers = self.map(map);
        headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        if let Some(value) = value {
            headers.push((name.to_string(), value.as_bytes().to_vec()));
        }
        Ok(())
    }

    fn add_header(&mut self, map: Headers, name: &str, value: &str) -> Result<(), HostError> {
        self.call("add_header", format_args!("{map:?} {name} {value}"))?;
        self.map(map)
            .push((name.to_string(), value.as_bytes().to_vec()));
        Ok(())
    }

    fn clear_route_cache(&mut self) -> Result<(), HostError> {
        self.call("clear_route_cache", format_args!(""))
    }

    fn send_response(
        &mut self,
        status: u32,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(), HostError> {
        self.call("send_response", format_args!("{status}"))?;
        self.sent = Some((
            status,
            headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            String::from_utf8(body.to_vec()).unwrap(),
        ));
        Ok(())
    }

    fn replace_response_body(&mut self, size: usize, body: &[u8]) -> Result<(), HostError> {
        self.call("replace_response_body", format_args!("{size}"))?;
        self.bodies.push(body.to_vec());
        Ok(())
    }

    fn response_body(&mut self, size: usize) -> Result<Option<Bytes>, HostError> {
        self.call("response_body", format_args!("{size}"))?;
        Ok(Some(
            self.upstream_body.iter().copied().take(size).collect(),
        ))
    }

    fn holds_response_headers(&self) -> bool {
        self.holds_response_headers
    }

    fn define_metric(&mut self, name: &str) -> Result<u32, HostError> {
        self.call("define_metric", format_args!("{name}"))?;
        Ok(DEFINED.with(|d| {
            let mut d = d.borrow_mut();
            d.push(name.to_string());
            d.len() as u32
        }))
    }

    fn increment_metric(&mut self, id: u32) -> Result<(), HostError> {
        self.call("increment_metric", format_args!("{id}"))?;
        let name = DEFINED.with(|d| d.borrow()[id as usize - 1].clone());
        *self.metrics.entry(name).or_default() += 1;
        Ok(())
    }

    fn now(&mut self) -> Result<Duration, HostError> {
        self.call("now", format_args!(""))?;
        Ok(self.now)
    }

    fn shared_data(&self) -> &dyn SharedData {
        &NoSharedData
    }

    fn log(&mut self, level: Level, message: fmt::Arguments<'_>) {
        self.logs.push((level, message.to_string()));
    }
}

/// A request as Envoy hands it over: pseudo-headers first, names in lower case.
/// The `x-forwarded-client-cert` header Envoy sets for a verified certificate with this subject
/// (SANITIZE_SET, subject only; measured on Envoy 1.40).
fn xfcc(subject: &[u8]) -> (String, Bytes) {
    let mut value =
        b"Hash=d23f63fe3776f92ae612835767ad1680dc59b5e2d8ecf029b45ede315868a739;Subject=\""
            .to_vec();
    value.extend_from_slice(subject);
    value.push(b'"');
    ("x-forwarded-client-cert".to_string(), value)
}

fn request_headers(method: &str, path: &[u8], extra: &[(&str, &[u8])]) -> Vec<(String, Bytes)> {
    let mut headers = vec![
        (":authority".to_string(), b"apiserver:6443".to_vec()),
        (":path".to_string(), path.to_vec()),
        (":method".to_string(), method.as_bytes().to_vec()),
        (":scheme".to_string(), b"https".to_vec()),
    ];
    headers.extend(extra.iter().map(|(n, v)| (n.to_string(), v.to_vec())));
    headers
}

fn request(host: FakeHost) -> Request<FakeHost> {
    Request::new(host, compiled(), worker())
}

const TOKEN: (&str, &[u8]) = ("authorization", b"Bearer abc");
const ADMIN: &[u8] = b"O=kubeadm:cluster-admins,CN=kubernetes-admin";

/// One request-phase case.
struct Case {
    name: &'static str,
    method: &'static str,
    path: &'static [u8],
    headers: &'static [(&'static str, &'static [u8])],
    subject: Option<&'static [u8]>,
    action: Action,
    /// Request headers afterwards: every value of each name (an empty list: absent).
    after: &'static [(&'static str, &'static [&'static str])],
    /// Counters incremented.
    counters: &'static [(&'static str, u64)],
    /// The status of a local reply.
    sent: Option<u32>,
}

#[test]
fn request_headers_table() {
    let spoofed: &[(&str, &[u8])] = &[
        ("x-remote-user", b"system:admin"),
        ("X-Remote-Group", b"system:masters"),
        ("x-remote-extra-scopes", b"all"),
        ("x-kubernetes-peer-proxied", b"true"),
        ("X-Kubernetes-APIServer-Rerouted", b"true"),
        ("x-skewgate-upstream-cluster", b"p133-identity"),
        ("x-skewgate-request-class", b"short"),
        ("impersonate-user", b"bob"),
    ];
    let spoofed: &'static [(&str, &[u8])] = Box::leak(spoofed.to_vec().into_boxed_slice());
    let cases = [
        Case {
            name: "local GET with a token",
            method: "GET",
            path: DEPLOYMENTS.as_bytes(),
            headers: &[TOKEN],
            subject: None,
            action: Action::Continue,
            after: &[
                ("x-skewgate-upstream-cluster", &["skewgate-local-token"]),
                ("x-skewgate-request-class", &[]),
                ("x-kubernetes-peer-proxied", &[]),
                ("authorization", &["Bearer abc"]),
            ],
            counters: &[],
            sent: None,
        },
        Case {
            name: "a client's unbounded class is removed from a short request",
            method: "GET",
            path: DEPLOYMENTS.as_bytes(),
            headers: &[TOKEN, ("X-Skewgate-Request-Class", b"unbounded")],
            subject: None,
            action: Action::Continue,
            after: &[
                ("x-skewgate-upstream-cluster", &["skewgate-local-token"]),
                ("x-skewgate-request-class", &[]),
            ],
            counters: &[],
            sent: None,
        },
        Case {
            name: "peer GET: loop guard, peer cluster, rerouted",
            method: "GET",
            path: RESOURCECLAIM.as_bytes(),
            headers: &[TOKEN],
            subject: None,
            action: Action::Continue,
            after: &[
                ("x-skewgate-upstream-cluster", &["p133-token"]),
                ("x-skewgate-request-class", &[]),
                ("x-kubernetes-peer-proxied", &["true"]),
            ],
            // Counted when the response starts, with its status.
            counters: &[],
            sent: None,
        },
        Case {
            name: "spoofed trust, loop-guard and routing headers are removed",
            method: "GET",
            path: WATCH_PODS.as_bytes(),
            headers: spoofed,
            subject: None,
            action: Action::Continue,
            after: &[
                ("x-remote-user", &[]),
                ("x-remote-group", &[]),
                ("x-remote-extra-scopes", &[]),
                ("x-kubernetes-peer-proxied", &[]),
                ("x-kubernetes-apiserver-rerouted", &[]),
                // A watch is unbounded: the spoofed class is replaced.
                ("x-skewgate-request-class", &["unbounded"]),
                ("x-skewgate-upstream-cluster", &["skewgate-local-anonymous"]),
                ("impersonate-user", &["bob"]),
            ],
            counters: &[],
            sent: None,
        },
        Case {
            name: "certificate identity becomes X-Remote-User/Group, over spoofed ones and a token",
            method: "GET",
            path: RESOURCECLAIM.as_bytes(),
            headers: &[
                ("x-remote-user", b"mallory"),
                ("x-remote-group", b"system:masters"),
                TOKEN,
            ],
            subject: Some(b"O=b,O=a,CN=alice"),
            action: Action::Continue,
            after: &[
                ("x-remote-user", &["alice"]),
                ("x-remote-group", &["a", "b"]),
                ("x-skewgate-upstream-cluster", &["p133-identity"]),
                ("x-kubernetes-peer-proxied", &["true"]),
            ],
            // Counted when the response starts, with its status.
            counters: &[],
            sent: None,
        },
        Case {
            name: "kubeadm admin certificate",
            method: "GET",
            path: DEPLOYMENTS.as_bytes(),
            headers: &[],
            subject: Some(ADMIN),
            action: Action::Continue,
            after: &[
                ("x-remote-user", &["kubernetes-admin"]),
                ("x-remote-group", &["kubeadm:cluster-admins"]),
                ("x-skewgate-upstream-cluster", &["skewgate-local-identity"]),
            ],
            counters: &[],
            sent: None,
        },
        Case {
            name: "an empty subject is no certificate",
            method: "GET",
            path: DEPLOYMENTS.as_bytes(),
            headers: &[TOKEN],
            subject: Some(b""),
            action: Action::Continue,
            after: &[
                ("x-remote-user", &[]),
                ("x-skewgate-upstream-cluster", &["skewgate-local-token"]),
            ],
            counters: &[],
            sent: None,
        },
        Case {
            name: "unmappable certificate: 401 here",
            method: "GET",
            path: DEPLOYMENTS.as_bytes(),
            headers: &[TOKEN],
            subject: Some(b"O=no-common-name"),
            action: Action::Pause,
            after: &[("x-skewgate-upstream-cluster", &[])],
            counters: &[],
            sent: Some(401),
        },
        Case {
            name: "anonymous",
            method: "GET",
            path: DEPLOYMENTS.as_bytes(),
            headers: &[],
            subject: None,
            action: Action::Continue,
            after: &[
                ("x-skewgate-upstream-cluster", &["skewgate-local-anonymous"]),
                ("x-skewgate-request-class", &[]),
            ],
            counters: &[],
            sent: None,
        },
        Case {
            name: "discovery: a plain JSON request to the local apiserver, answered later",
            method: "GET",
            path: b"/apis",
            headers: &[
                ("accept", KUBECTL_ACCEPT_BYTES),
                ("if-none-match", b"\"zzz\""),
                ("accept-encoding", b"gzip"),
                TOKEN,
            ],
            subject: None,
            action: Action::Continue,
            after: &[
                ("accept", &["application/json"]),
                ("if-none-match", &[]),
                ("accept-encoding", &[]),
                ("x-skewgate-upstream-cluster", &["skewgate-local-token"]),
                ("x-skewgate-request-class", &[]),
            ],
            counters: &[],
            sent: None,
        },
        Case {
            name: "discovery with profile=nopeer goes to the local apiserver as sent",
            method: "GET",
            path: b"/apis",
            headers: &[(
                "accept",
                b"application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer",
            )],
            subject: None,
            action: Action::Continue,
            after: &[
                (
                    "accept",
                    &["application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer"],
                ),
                ("x-skewgate-upstream-cluster", &["skewgate-local-anonymous"]),
            ],
            counters: &[(NOPEER, 1)],
            sent: None,
        },
        Case {
            name: "discovery we cannot answer (protobuf only) counts a miss",
            method: "GET",
            path: b"/apis",
            headers: &[(
                "accept",
                b"application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
            )],
            subject: None,
            action: Action::Continue,
            after: &[("x-skewgate-upstream-cluster", &["skewgate-local-anonymous"])],
            counters: &[(MISSES, 1)],
            sent: None,
        },
        Case {
            name: "non-UTF-8 values: token, spoofed identity, path",
            method: "GET",
            path: b"/apis/apps/v1/namespaces/d\xffefault/deployments",
            headers: &[
                ("authorization", b"Bearer \xff\xfe"),
                ("x-remote-user", b"\xc3\x28"),
                ("user-agent", b"kubectl/\x80"),
            ],
            subject: None,
            action: Action::Continue,
            after: &[
                ("x-remote-user", &[]),
                ("x-skewgate-upstream-cluster", &["skewgate-local-token"]),
                ("user-agent", &["kubectl/\u{fffd}"]),
            ],
            counters: &[],
            sent: None,
        },
        Case {
            name: "a non-UTF-8 certificate subject is refused",
            method: "GET",
            path: DEPLOYMENTS.as_bytes(),
            headers: &[],
            subject: Some(b"CN=\xff"),
            action: Action::Pause,
            after: &[("x-skewgate-upstream-cluster", &[])],
            counters: &[],
            sent: Some(401),
        },
    ];
    for case in cases {
        let mut host = FakeHost {
            request: request_headers(case.method, case.path, case.headers),
            ..FakeHost::default()
        };
        if let Some(subject) = case.subject {
            host.request.push(xfcc(subject));
        }
        let mut req = request(host);
        assert_eq!(req.on_request_headers(), case.action, "{}", case.name);
        let host = &req.host;
        for (name, values) in case.after {
            assert_eq!(
                host.values(Headers::Request, name),
                *values,
                "{}: {name}",
                case.name
            );
        }
        assert_eq!(
            host.metrics,
            case.counters
                .iter()
                .map(|(name, n)| (name.to_string(), *n))
                .collect::<BTreeMap<_, _>>(),
            "{}: counters",
            case.name
        );
        assert_eq!(
            host.sent.as_ref().map(|(status, _, _)| *status),
            case.sent,
            "{}: local reply",
            case.name
        );
        let cleared = host
            .calls
            .iter()
            .filter(|c| c.starts_with("clear_route_cache"))
            .count();
        assert_eq!(
            cleared,
            usize::from(case.action == Action::Continue),
            "{}: route cache",
            case.name
        );
        // Nothing is ever forwarded with a header a client may not send, except what we set.
        if case.action == Action::Continue {
            for (name, _) in &host.request {
                let ours = [
                    "x-skewgate-upstream-cluster",
                    "x-skewgate-request-class",
                    "x-kubernetes-peer-proxied",
                    "x-remote-user",
                    "x-remote-group",
                ];
                assert!(
                    !crate::hygiene::is_forbidden_request_header(name)
                        || ours.contains(&name.as_str()),
                    "{}: {name} passed",
                    case.name
                );
            }
        }
    }
}

#[test]
fn unmappable_certificate_gets_a_401_status() {
    let mut host = FakeHost {
        request: request_headers("GET", DEPLOYMENTS.as_bytes(), &[]),
        ..FakeHost::default()
    };
    host.request.push(xfcc(b"O=system:masters"));
    let mut req = request(host);
    assert_eq!(req.on_request_headers(), Action::Pause);
    let (status, headers, body) = req.host.sent.clone().unwrap();
    assert_eq!(status, 401);
    assert_eq!(
        headers,
        vec![("content-type".to_string(), "application/json".to_string())]
    );
    assert!(
        body.starts_with(r#"{"kind":"Status","apiVersion":"v1","#),
        "{body}"
    );
    assert!(
        body.contains(r#""reason":"Unauthorized","code":401}"#),
        "{body}"
    );
    assert!(
        body.contains(r#""message":"client certificate cannot be used to authenticate: "#),
        "{body}"
    );
    // Nothing was changed on a request that goes nowhere.
    assert_eq!(req.host.calls, ["request_headers ", "send_response 401"]);
    assert_eq!(req.host.infos().len(), 1);
}

/// A plain (short) GET makes three host calls: read the headers (the client certificate's
/// subject is among them), set the cluster, clear the route cache; a short request carries no
/// class header.
#[test]
fn a_plain_request_makes_three_host_calls() {
    let host = FakeHost {
        request: request_headers("GET", DEPLOYMENTS.as_bytes(), &[TOKEN]),
        ..FakeHost::default()
    };
    let mut req = request(host);
    assert_eq!(req.on_request_headers(), Action::Continue);
    assert_eq!(
        req.host.calls,
        [
            "request_headers ",
            "set_header Request x-skewgate-upstream-cluster Some(\"skewgate-local-token\")",
            "clear_route_cache ",
        ]
    );
    // An apiserver's answer is read once and passes.
    req.host.response = vec![(":status".into(), b"200".to_vec())];
    assert_eq!(req.on_response_headers(false), Action::Continue);
    assert_eq!(req.on_response_body(10, false), Action::Continue);
    assert_eq!(req.host.calls.len(), 4);
    assert!(req.host.bodies.is_empty());
}

/// Two client-certificate headers cannot come from Envoy (it replaces every client copy with
/// one): the request fails closed and goes nowhere.
#[test]
fn an_unreadable_client_certificate_header_fails_closed_with_a_503() {
    let mut host = FakeHost {
        request: request_headers("GET", DEPLOYMENTS.as_bytes(), &[]),
        ..FakeHost::default()
    };
    host.request.push(xfcc(b"CN=alice"));
    host.request.push(xfcc(b"CN=admin,O=system:masters"));
    let mut req = request(host);
    assert_eq!(req.on_request_headers(), Action::Pause);
    let (status, _, body) = req.host.sent.clone().unwrap();
    assert_eq!(status, 503);
    assert!(
        body.contains("the proxy could not process the request"),
        "{body}"
    );
    assert_eq!(req.host.calls, ["request_headers ", "send_response 503"]);
}

#[test]
fn a_failing_host_call_fails_closed_with_a_503() {
    let host = FakeHost {
        request: request_headers("GET", RESOURCECLAIM.as_bytes(), &[("x-remote-user", b"x")]),
        failing: Some("clear_route_cache"),
        ..FakeHost::default()
    };
    let mut req = request(host);
    assert_eq!(req.on_request_headers(), Action::Pause);
    let (status, _, body) = req.host.sent.clone().unwrap();
    assert_eq!(status, 503);
    assert!(body.contains("\"reason\":\"ServiceUnavailable\""), "{body}");
    assert!(
        body.contains("the proxy could not process the request"),
        "{body}"
    );
    assert!(req
        .host
        .logs
        .iter()
        .any(|(level, line)| *level == Level::Error && line.contains("while routing")));
}

/// Plan a request, then feed it a response; returns the request for inspection.
fn round_trip(
    method: &str,
    path: &str,
    headers: &[(&str, &[u8])],
    response: &[(&str, &str)],
    details: Option<&str>,
    end_of_stream: bool,
) -> Request<FakeHost> {
    let mut host = FakeHost {
        request: request_headers(method, path.as_bytes(), headers),
        ..FakeHost::default()
    };
    if let Some(details) = details {
        host.properties.insert(
            vec!["response".into(), "code_details".into()],
            details.as_bytes().to_vec(),
        );
    }
    let mut req = request(host);
    assert_eq!(req.on_request_headers(), Action::Continue);
    req.host.response = response
        .iter()
        .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
        .collect();
    // Only a JSON 404 is held at its headers, to read its body.
    let reading = req.on_response_headers(end_of_stream) == Action::Pause;
    assert!(!reading || !end_of_stream);
    if !end_of_stream {
        // The original body in three chunks; while it is read, each size is all of it so far
        // (Envoy buffers), and the chunks before the last wait.
        let n = req.host.upstream_body.len();
        let sizes = if reading {
            [n / 3, n * 2 / 3, n]
        } else {
            [100, 50, 7]
        };
        for (i, size) in sizes.into_iter().enumerate() {
            let last = i == 2;
            let want = if reading && !last {
                Action::Pause
            } else {
                Action::Continue
            };
            assert_eq!(req.on_response_body(size, last), want);
        }
    }
    req
}

#[test]
fn discovery_is_answered_from_the_merged_document_when_the_local_apiserver_allows_it() {
    let local_answer = [
        (":status", "200"),
        ("content-type", "application/json"),
        ("content-length", "1234"),
        ("etag", "\"local\""),
    ];
    let req = round_trip(
        "GET",
        "/apis",
        &[("accept", KUBECTL_ACCEPT.as_bytes()), TOKEN],
        &local_answer,
        None,
        false,
    );
    let host = &req.host;
    assert_eq!(host.values(Headers::Response, ":status"), ["200"]);
    assert_eq!(host.values(Headers::Response, "content-type"), [V2]);
    assert!(host.values(Headers::Response, "content-length").is_empty());
    assert_eq!(host.values(Headers::Response, "etag"), ["\"aaa\""]);
    assert_eq!(host.values(Headers::Response, "vary"), ["Accept"]);
    assert_eq!(host.values(Headers::Response, "cache-control"), ["public"]);
    assert!(host
        .values(Headers::Response, "content-encoding")
        .is_empty());
    // The merged document replaces the first chunk; later chunks are dropped.
    assert_eq!(
        host.bodies,
        [APIS.as_bytes().to_vec(), Vec::new(), Vec::new()]
    );
    assert_eq!(host.metrics, BTreeMap::from([(HITS.to_string(), 1)]));
    // code_details is not read for an answer we replace.
    assert!(!host.calls.iter().any(|c| c.contains("code_details")));

    // Revalidation with the merged ETag: 304, no body.
    let req = round_trip(
        "GET",
        "/apis",
        &[("accept", V2.as_bytes()), ("if-none-match", b"\"aaa\"")],
        &local_answer,
        None,
        false,
    );
    assert_eq!(req.host.values(Headers::Response, ":status"), ["304"]);
    assert_eq!(req.host.bodies, [Vec::<u8>::new(), Vec::new(), Vec::new()]);

    // Legacy discovery of a group-version the local apiserver does not serve: its 404 is
    // authorized, and the merged list answers.
    let req = round_trip(
        "GET",
        "/apis/resource.k8s.io/v1beta2",
        &[("accept", b"application/json, */*")],
        &[(":status", "404"), ("content-type", "application/json")],
        Some("via_upstream"),
        false,
    );
    assert_eq!(req.host.values(Headers::Response, ":status"), ["200"]);
    assert_eq!(
        req.host.values(Headers::Response, "content-type"),
        ["application/json"]
    );
    assert!(req.host.values(Headers::Response, "etag").is_empty());
    assert_eq!(req.host.bodies[0], GROUPS.as_bytes());

    // HEAD: the headers are replaced, and there is no body to replace.
    let req = round_trip(
        "HEAD",
        "/apis",
        &[("accept", V2.as_bytes())],
        &local_answer,
        None,
        true,
    );
    assert_eq!(req.host.values(Headers::Response, "etag"), ["\"aaa\""]);
    assert!(req.host.bodies.is_empty());
}

#[test]
fn discovery_the_local_apiserver_refuses_keeps_its_answer() {
    for (status, details) in [
        ("401", "via_upstream"),
        ("403", "via_upstream"),
        ("500", "via_upstream"),
    ] {
        let req = round_trip(
            "GET",
            "/apis",
            &[("accept", KUBECTL_ACCEPT.as_bytes())],
            &[(":status", status), ("content-length", "99")],
            Some(details),
            false,
        );
        assert_eq!(req.host.values(Headers::Response, ":status"), [status]);
        assert_eq!(req.host.values(Headers::Response, "content-length"), ["99"]);
        assert!(req.host.bodies.is_empty(), "{status}");
        assert!(req.host.metrics.is_empty(), "{status}");
    }
}

#[test]
fn envoy_replies_are_mapped_to_status() {
    // (path, status, details, expected status or None = untouched, message part, peer error)
    type Case<'a> = (&'a str, &'a str, &'a str, Option<&'a str>, &'a str, bool);
    let cases: [Case; 6] = [
        (
            RESOURCECLAIM,
            "503",
            CONNECTION_FAILURE,
            Some("503"),
            "the peer apiserver serving resource.k8s.io/v1beta2, Resource=resourceclaims could not be reached",
            true,
        ),
        (
            RESOURCECLAIM,
            "504",
            "upstream_response_timeout",
            Some("503"),
            "resource.k8s.io/v1beta2, Resource=resourceclaims did not answer (upstream_response_timeout)",
            true,
        ),
        (
            RESOURCECLAIM,
            "502",
            "upstream_reset_before_response_started{connection_termination}",
            Some("503"),
            "did not answer",
            true,
        ),
        // The peer itself answered 503: its answer stands.
        (RESOURCECLAIM, "503", "via_upstream", None, "", false),
        (
            DEPLOYMENTS,
            "503",
            CONNECTION_FAILURE,
            Some("503"),
            "the apiserver could not be reached",
            false,
        ),
        (
            DEPLOYMENTS,
            "431",
            "request_headers_too_large",
            Some("431"),
            "rejected by the proxy (request_headers_too_large)",
            false,
        ),
    ];
    for (path, status, details, want, message, peer_error) in cases {
        let req = round_trip(
            "GET",
            path,
            &[TOKEN],
            &[
                (":status", status),
                ("content-length", "91"),
                ("content-type", "text/plain"),
            ],
            Some(details),
            false,
        );
        let host = &req.host;
        let name = format!("{path} {status} {details}");
        match want {
            None => {
                assert_eq!(
                    host.values(Headers::Response, ":status"),
                    [status],
                    "{name}"
                );
                assert_eq!(
                    host.values(Headers::Response, "content-length"),
                    ["91"],
                    "{name}"
                );
                assert!(host.bodies.is_empty(), "{name}");
                assert!(host.infos().is_empty(), "{name}");
            }
            Some(want) => {
                assert_eq!(host.values(Headers::Response, ":status"), [want], "{name}");
                assert_eq!(
                    host.values(Headers::Response, "content-type"),
                    ["application/json"],
                    "{name}"
                );
                assert!(
                    host.values(Headers::Response, "content-length").is_empty(),
                    "{name}"
                );
                assert_eq!(host.bodies.len(), 3, "{name}");
                assert!(
                    host.bodies[1].is_empty() && host.bodies[2].is_empty(),
                    "{name}"
                );
                let body = String::from_utf8(host.bodies[0].clone()).unwrap();
                assert!(body.starts_with(r#"{"kind":"Status","#), "{name}: {body}");
                assert!(
                    body.ends_with(&format!(r#""code":{want}}}"#)),
                    "{name}: {body}"
                );
                assert!(body.contains(message), "{name}: {body}");
                assert_eq!(
                    host.infos(),
                    [format!(
                        "skewgate: Envoy replied {status} ({details}); answering {want} with a Status"
                    )],
                    "{name}"
                );
            }
        }
        assert_eq!(
            host.count(PEER_ERRORS),
            u64::from(peer_error),
            "{name}: peer errors"
        );
        let rerouted = u64::from(path == RESOURCECLAIM);
        assert_eq!(host.count(REROUTED), rerouted, "{name}: rerouted");
        if path == RESOURCECLAIM {
            // With the status the client got, and the resource the configuration knows.
            let code = want.unwrap_or(status);
            let key = format!("{REROUTED};code={code};{CLAIM_LABELS}");
            assert_eq!(
                host.metrics.get(&key),
                Some(&1),
                "{name}: {:?}",
                host.metrics
            );
        }
    }
}

#[test]
fn a_response_without_status_details_passes() {
    // No code_details: leave the reply alone rather than guess.
    let req = round_trip(
        "GET",
        RESOURCECLAIM,
        &[],
        &[(":status", "503")],
        None,
        false,
    );
    assert!(req.host.bodies.is_empty());
    assert_eq!(req.host.count(PEER_ERRORS), 0);
    // An unreadable :status is no error either.
    let req = round_trip(
        "GET",
        RESOURCECLAIM,
        &[],
        &[(":status", "5\u{fffd}3")],
        Some(CONNECTION_FAILURE),
        false,
    );
    assert!(req.host.bodies.is_empty());
}

/// A peer outage maps every peer-bound request: one info line per window and worker, then one
/// with the count left out.
#[test]
fn mapped_replies_log_at_most_once_per_window() {
    let compiled = compiled();
    let worker = worker();
    let mut lines = Vec::new();
    let mut peer_errors = 0;
    let mut defined = 0;
    // 10 requests a second for 25 seconds.
    for tenth in 0..250u64 {
        let host = FakeHost {
            request: request_headers("GET", RESOURCECLAIM.as_bytes(), &[TOKEN]),
            now: Duration::from_secs(1_700_000_000) + Duration::from_millis(tenth * 100),
            properties: HashMap::from([(
                vec!["response".to_string(), "code_details".to_string()],
                CONNECTION_FAILURE.as_bytes().to_vec(),
            )]),
            ..FakeHost::default()
        };
        let mut req = Request::new(host, Rc::clone(&compiled), Rc::clone(&worker));
        assert_eq!(req.on_request_headers(), Action::Continue);
        req.host.response = vec![(":status".into(), b"503".to_vec())];
        req.on_response_headers(false);
        assert_eq!(req.host.values(Headers::Response, ":status"), ["503"]);
        peer_errors += req.host.count(PEER_ERRORS);
        defined += req
            .host
            .calls
            .iter()
            .filter(|c| c.starts_with("define_metric"))
            .count();
        lines.extend(req.host.infos().into_iter().map(str::to_string));
    }
    assert_eq!(peer_errors, 250);
    // Each label set is defined once per configuration, not per request: rerouted with 503,
    // and the peer error.
    assert_eq!(defined, 2);
    let line =
        format!("skewgate: Envoy replied 503 ({CONNECTION_FAILURE}); answering 503 with a Status");
    assert_eq!(
        lines,
        [
            line.clone(),
            format!("{line} (99 more such replies since the last line not logged)"),
            format!("{line} (99 more such replies since the last line not logged)"),
        ]
    );
}

const CLAIM_V1BETA3: &str = "/apis/resource.k8s.io/v1beta3/namespaces/default/resourceclaims/gpu";
const RESIZE: &str = "/api/v1/namespaces/default/pods/web/resize";

/// What no live apiserver is known to serve now is answered here: 503, `Retry-After`, a Status
/// naming it, one counter, nothing forwarded.
#[test]
fn unavailable_requests_are_answered_503_with_retry_after() {
    // (name, method, path, pending peers, counter, message)
    type Case<'a> = (&'a str, &'a str, &'a str, &'a [&'a str], &'a str, &'a str);
    let cases: [Case; 5] = [
        (
            "retained resource",
            "GET",
            CLAIM_V1BETA3,
            &[],
            "skewgate_retained_unavailable_total;group=resource.k8s.io;version=v1beta3;resource=resourceclaims",
            "no live apiserver serves resource.k8s.io/v1beta3, Resource=resourceclaims now; \
             the apiserver that served it is gone or restarting (retry)",
        ),
        (
            "retained subresource of a served resource",
            "PATCH",
            RESIZE,
            &[],
            "skewgate_retained_unavailable_total;group=;version=v1;resource=pods",
            "no live apiserver serves v1, Resource=pods/resize now; the apiserver that served \
             it is gone or restarting (retry)",
        ),
        (
            "legacy discovery of a retained group-version",
            "GET",
            "/apis/resource.k8s.io/v1beta3?timeout=32s",
            &[],
            "skewgate_retained_unavailable_total;group=resource.k8s.io;version=v1beta3;resource=",
            "no live apiserver serves resource.k8s.io/v1beta3 now; the apiserver that served \
             it is gone or restarting (retry)",
        ),
        (
            "served by nobody known while a peer's discovery is pending",
            "GET",
            "/apis/resource.k8s.io/v1/resourceclaims",
            &["apiserver-c"],
            // A group-version the configuration does not know: `other`, whatever the client
            // asked for.
            "skewgate_peer_discovery_pending_total;group=other;version=other;resource=other",
            "no known apiserver serves resource.k8s.io/v1, Resource=resourceclaims, and the \
             discovery of a peer apiserver is not known yet (retry)",
        ),
        (
            "a resource unknown in a known group-version, peers pending",
            "DELETE",
            "/apis/apps/v1/namespaces/d/replicasets/r",
            &["apiserver-c", "apiserver-d"],
            "skewgate_peer_discovery_pending_total;group=other;version=other;resource=other",
            "no known apiserver serves apps/v1, Resource=replicasets, and the discovery of a \
             peer apiserver is not known yet (retry)",
        ),
    ];
    for (name, method, path, pending, counter, message) in cases {
        let host = FakeHost {
            request: request_headers(method, path.as_bytes(), &[TOKEN, ("x-remote-user", b"m")]),
            ..FakeHost::default()
        };
        let mut req = Request::new(host, compiled_with(pending), worker());
        assert_eq!(req.on_request_headers(), Action::Pause, "{name}");
        let (status, headers, body) = req.host.sent.clone().unwrap();
        assert_eq!(status, 503, "{name}");
        assert_eq!(
            headers,
            [
                ("content-type".to_string(), "application/json".to_string()),
                ("retry-after".to_string(), "5".to_string()),
            ],
            "{name}"
        );
        assert_eq!(
            body,
            format!(
                r#"{{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Failure","message":"the server is currently unable to handle the request: {message}","reason":"ServiceUnavailable","details":{{"retryAfterSeconds":5}},"code":503}}"#
            ),
            "{name}"
        );
        assert_eq!(
            req.host.metrics,
            BTreeMap::from([(counter.to_string(), 1)]),
            "{name}"
        );
        // Nothing is changed or routed for a request that goes nowhere.
        let calls: Vec<String> = req
            .host
            .calls
            .iter()
            .map(|c| match c.strip_prefix("increment_metric ") {
                Some(_) => "increment_metric".to_string(),
                None => c.clone(),
            })
            .collect();
        assert_eq!(
            calls,
            [
                "request_headers ".to_string(),
                format!("define_metric {counter}"),
                "increment_metric".to_string(),
                "now ".to_string(),
                "send_response 503".to_string(),
            ],
            "{name}"
        );
        assert_eq!(
            req.host.infos(),
            [format!(
                "skewgate: answering {method} {path:?} with 503 ({})",
                if counter.starts_with("skewgate_peer_discovery_pending_total") {
                    "PeerDiscoveryPending"
                } else if path.contains('?') {
                    "RetainedDiscovery"
                } else {
                    "Retained"
                }
            )],
            "{name}"
        );
    }
}

/// Pending peers change nothing for what is served, shared, or not a resource.
#[test]
fn pending_peers_leave_served_and_non_resource_requests_alone() {
    for (path, cluster) in [
        (DEPLOYMENTS, "skewgate-local-token"),
        (RESOURCECLAIM, "p133-token"),
        ("/healthz", "skewgate-local-token"),
        ("/apis/nope.example.com/v1", "skewgate-local-token"),
        ("/api/v1/namespaces/%zz/pods", "skewgate-local-token"),
    ] {
        let host = FakeHost {
            request: request_headers("GET", path.as_bytes(), &[TOKEN]),
            ..FakeHost::default()
        };
        let mut req = Request::new(host, compiled_with(&["apiserver-c"]), worker());
        assert_eq!(req.on_request_headers(), Action::Continue, "{path}");
        assert!(req.host.sent.is_none(), "{path}");
        assert_eq!(
            req.host
                .values(Headers::Request, "x-skewgate-upstream-cluster"),
            [cluster],
            "{path}"
        );
        assert_eq!(
            req.host.count("skewgate_peer_discovery_pending_total"),
            0,
            "{path}"
        );
    }
}

/// An apiserver's `404 page not found` (text/plain) for what the routing table says it serves
/// means our view of it is stale: the client gets a retryable 503, the body replaced chunk by
/// chunk. A Status NotFound, and any 404 for what nobody serves, pass.
#[test]
fn a_page_not_found_from_a_serving_apiserver_becomes_a_503() {
    let plain = "text/plain; charset=utf-8";
    // (path, content type, replaced, log line's subject)
    let cases: [(&str, &str, Option<&str>); 6] = [
        (DEPLOYMENTS, plain, Some("the local apiserver")),
        (RESOURCECLAIM, plain, Some("a peer apiserver")),
        // A list never answers NotFound for a route kube has: its JSON 404 is no route.
        (DEPLOYMENTS, "application/json", Some("the local apiserver")),
        (RESOURCECLAIM, "application/vnd.kubernetes.protobuf", None),
        ("/apis/apps/v1/namespaces/d/replicasets", plain, None),
        ("/openapi/v3/apis/nope", plain, None),
    ];
    for (path, content_type, replaced) in cases {
        let name = format!("{path} {content_type}");
        let req = round_trip(
            "GET",
            path,
            &[TOKEN],
            &[
                (":status", "404"),
                ("content-type", content_type),
                ("content-length", "19"),
                ("x-content-type-options", "nosniff"),
            ],
            Some("via_upstream"),
            false,
        );
        let host = &req.host;
        let Some(by) = replaced else {
            assert_eq!(host.values(Headers::Response, ":status"), ["404"], "{name}");
            assert_eq!(
                host.values(Headers::Response, "content-type"),
                [content_type],
                "{name}"
            );
            assert_eq!(
                host.values(Headers::Response, "content-length"),
                ["19"],
                "{name}"
            );
            assert!(host.bodies.is_empty(), "{name}");
            assert_eq!(host.count(NOT_SERVED), 0, "{name}");
            assert!(host.infos().is_empty(), "{name}");
            continue;
        };
        assert_eq!(host.values(Headers::Response, ":status"), ["503"], "{name}");
        assert_eq!(
            host.values(Headers::Response, "content-type"),
            ["application/json"],
            "{name}"
        );
        assert!(host.values(Headers::Response, "content-length").is_empty());
        assert_eq!(
            host.values(Headers::Response, "retry-after"),
            ["5"],
            "{name}"
        );
        assert_eq!(host.bodies.len(), 3, "{name}");
        assert!(host.bodies[1].is_empty() && host.bodies[2].is_empty());
        let target = if path == DEPLOYMENTS {
            "apps/v1, Resource=deployments"
        } else {
            "resource.k8s.io/v1beta2, Resource=resourceclaims"
        };
        assert_eq!(
            String::from_utf8(host.bodies[0].clone()).unwrap(),
            format!(
                r#"{{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Failure","message":"the server is currently unable to handle the request: {target} is not served by the apiserver that answered, which has probably just restarted (retry)","reason":"ServiceUnavailable","details":{{"retryAfterSeconds":5}},"code":503}}"#
            ),
            "{name}"
        );
        assert_eq!(host.count(NOT_SERVED), 1, "{name}");
        assert_eq!(host.count(PEER_ERRORS), 0, "{name}");
        assert_eq!(
            host.infos(),
            [format!(
                "skewgate: {by} answered that it has no route for {target}, which the routing \
                 table says it serves (restarted?); answering 503"
            )],
            "{name}"
        );
    }
}

/// kube's generic NotFound (JSON: "the server could not find the requested resource", no
/// object named) is what a real kube-apiserver answers for a resource it does not serve in a
/// group-version it serves: from an apiserver the routing table says serves it, a 503 like its
/// `404 page not found`, decided on the body with the headers held. A missing object's
/// NotFound, a body too large to be that answer, and a body-less 404 pass as they came.
#[test]
fn kubes_generic_not_found_from_a_serving_apiserver_becomes_a_503() {
    let no_route = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server could not find the requested resource","reason":"NotFound","details":{},"code":404}"#;
    let missing = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"deployments.apps \"x\" not found","reason":"NotFound","details":{"name":"x","group":"apps","kind":"deployments"},"code":404}"#;
    let padded = format!(
        "{}{}",
        no_route,
        " ".repeat(crate::local_reply::MAX_NOT_FOUND_BODY)
    );
    const DEPLOYMENT: &str = "/apis/apps/v1/namespaces/default/deployments/web";
    // (path, body, replaced by). An object's: only its body tells.
    let cases: [(&str, &str, Option<&str>); 5] = [
        (DEPLOYMENT, no_route, Some("the local apiserver")),
        (RESOURCECLAIM, no_route, Some("a peer apiserver")),
        (DEPLOYMENT, missing, None),
        (DEPLOYMENT, &padded, None),
        // Nobody serves it: the 404 is the truth, and is not even read.
        ("/apis/apps/v1/namespaces/d/replicasets/x", no_route, None),
    ];
    for (path, body, replaced) in cases {
        let name = format!("{path} {}", &body[..60.min(body.len())]);
        let mut host = FakeHost {
            request: request_headers("GET", path.as_bytes(), &[TOKEN]),
            upstream_body: body.as_bytes().to_vec(),
            holds_response_headers: true,
            ..FakeHost::default()
        };
        host.properties.insert(
            vec!["response".into(), "code_details".into()],
            b"via_upstream".to_vec(),
        );
        let mut req = request(host);
        assert_eq!(req.on_request_headers(), Action::Continue);
        req.host.response = [
            (":status", "404"),
            ("content-type", "application/json"),
            ("content-length", "162"),
        ]
        .iter()
        .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
        .collect();
        let served = path != "/apis/apps/v1/namespaces/d/replicasets/x";
        let held = req.on_response_headers(false);
        assert_eq!(held == Action::Pause, served, "{name}");
        if served {
            // The first piece waits for the rest (unless it is already too large).
            let first = body.len() / 2;
            let want = if first > crate::local_reply::MAX_NOT_FOUND_BODY {
                Action::Continue
            } else {
                Action::Pause
            };
            assert_eq!(req.on_response_body(first, false), want, "{name}");
            if want == Action::Pause {
                assert_eq!(req.on_response_body(body.len(), true), Action::Continue);
            }
        }
        let host = &req.host;
        let read = host.calls.iter().any(|c| c.starts_with("response_body"));
        assert_eq!(
            read,
            served && body.len() <= crate::local_reply::MAX_NOT_FOUND_BODY,
            "{name}"
        );
        let Some(by) = replaced else {
            assert_eq!(host.values(Headers::Response, ":status"), ["404"], "{name}");
            assert_eq!(
                host.values(Headers::Response, "content-length"),
                ["162"],
                "{name}"
            );
            assert!(host.bodies.is_empty(), "{name}");
            assert_eq!(host.count(NOT_SERVED), 0, "{name}");
            continue;
        };
        assert_eq!(host.values(Headers::Response, ":status"), ["503"], "{name}");
        assert!(host.values(Headers::Response, "content-length").is_empty());
        assert_eq!(
            host.values(Headers::Response, "retry-after"),
            ["5"],
            "{name}"
        );
        let sent: serde_json::Value = serde_json::from_slice(&host.bodies[0]).unwrap();
        assert_eq!(sent["reason"], "ServiceUnavailable", "{name}");
        assert_eq!(host.count(NOT_SERVED), 1, "{name}");
        assert!(
            host.infos()[0]
                .starts_with(&format!("skewgate: {by} answered that it has no route for")),
            "{name}: {:?}",
            host.infos()
        );
    }
}

/// A host that cannot hold the response headers while it reads the body (proxy-wasm): an
/// object's JSON 404 passes unread; a list's is no route whatever its body, decided at once.
#[test]
fn without_held_headers_only_a_collections_json_404_becomes_a_503() {
    for (path, status) in [
        ("/apis/apps/v1/namespaces/default/deployments/web", "404"),
        (DEPLOYMENTS, "503"),
        (
            "/apis/apps/v1/namespaces/default/deployments?watch=1",
            "503",
        ),
    ] {
        let mut host = FakeHost {
            request: request_headers("GET", path.as_bytes(), &[TOKEN]),
            ..FakeHost::default()
        };
        host.properties.insert(
            vec!["response".into(), "code_details".into()],
            b"via_upstream".to_vec(),
        );
        let mut req = request(host);
        assert_eq!(req.on_request_headers(), Action::Continue);
        req.host.response = vec![
            (":status".into(), b"404".to_vec()),
            ("content-type".into(), b"application/json".to_vec()),
        ];
        assert_eq!(req.on_response_headers(false), Action::Continue, "{path}");
        assert_eq!(req.on_response_body(162, true), Action::Continue, "{path}");
        assert_eq!(
            req.host.values(Headers::Response, ":status"),
            [status],
            "{path}"
        );
        assert!(
            !req.host
                .calls
                .iter()
                .any(|c| c.starts_with("response_body")),
            "{path}: never read"
        );
    }
}

/// The response side reads `content-type` only for a 404 of a request an apiserver serves:
/// one host call more there, none anywhere else.
#[test]
fn only_a_served_404_reads_the_content_type() {
    // (path, status, response host calls)
    let cases: [(&str, &str, &[&str]); 6] = [
        (DEPLOYMENTS, "200", &["response_header :status"]),
        (
            DEPLOYMENTS,
            "500",
            &["response_header :status", "property response.code_details"],
        ),
        (
            DEPLOYMENTS,
            "404",
            &[
                "response_header :status",
                "property response.code_details",
                "response_header content-type",
            ],
        ),
        (
            RESOURCECLAIM,
            "404",
            &[
                "response_header :status",
                "property response.code_details",
                "response_header content-type",
            ],
        ),
        (
            "/apis/apps/v1/replicasets",
            "404",
            &["response_header :status", "property response.code_details"],
        ),
        (
            "/healthz/nope",
            "404",
            &["response_header :status", "property response.code_details"],
        ),
    ];
    for (path, status, calls) in cases {
        let mut host = FakeHost {
            request: request_headers("GET", path.as_bytes(), &[TOKEN]),
            ..FakeHost::default()
        };
        host.properties.insert(
            vec!["response".into(), "code_details".into()],
            b"via_upstream".to_vec(),
        );
        let mut req = request(host);
        assert_eq!(req.on_request_headers(), Action::Continue);
        let before = req.host.calls.len();
        // Protobuf: a 404 whose content type is read and nothing more (a JSON one may be
        // decided at once, or held for its body).
        req.host.response = vec![
            (":status".into(), status.as_bytes().to_vec()),
            (
                "content-type".into(),
                b"application/vnd.kubernetes.protobuf".to_vec(),
            ),
        ];
        assert_eq!(req.on_response_headers(false), Action::Continue);
        assert_eq!(req.on_response_body(10, false), Action::Continue);
        // Reading is what this is about; counting a rerouted response is not a read.
        let reads: Vec<&String> = req.host.calls[before..]
            .iter()
            .filter(|c| !c.contains("_metric "))
            .collect();
        assert_eq!(reads, calls, "{path} {status}");
    }
}

#[test]
fn logged_paths_are_clipped_at_a_character_boundary() {
    let long = format!("/apis/{}", "é".repeat(400));
    let clipped = super::clip(&long);
    assert!(clipped.len() <= super::LOGGED_PATH && clipped.len() >= super::LOGGED_PATH - 1);
    assert!(long.starts_with(clipped));
    assert_eq!(super::clip("/api/v1/pods"), "/api/v1/pods");
    assert_eq!(super::clip(""), "");
}

/// `GET /openapi/v3`: the local apiserver's 200 is held until complete and sent with the
/// peer-only entries added; anything else about the answer stays the apiserver's.
#[test]
fn the_local_openapi_root_gets_the_peer_only_entries() {
    let local = br#"{"paths":{"api/v1":{"serverRelativeURL":"/openapi/v3/api/v1?hash=L"}}}"#;
    let union = r#"{"paths":{"api/v1":{"serverRelativeURL":"/openapi/v3/api/v1?hash=L"},"apis/resource.k8s.io/v1beta2":{"serverRelativeURL":"/openapi/v3/apis/resource.k8s.io/v1beta2?hash=B2"}}}"#;
    // (status, body, what the client gets: None = the local body untouched)
    let cases: &[(&str, &[u8], Option<&str>)] = &[
        ("200", local, Some(union)),
        // Not a root: logged, the local answer stands.
        ("200", b"<html>", None),
        // Not authorized: no buffering at all.
        ("403", b"{\"kind\":\"Status\"}", None),
    ];
    for (status, body, want) in cases {
        let host = FakeHost {
            request: request_headers("GET", b"/openapi/v3", &[TOKEN, ("if-none-match", b"\"x\"")]),
            upstream_body: body.to_vec(),
            ..FakeHost::default()
        };
        let mut req = request(host);
        assert_eq!(req.on_request_headers(), Action::Continue);
        let sent = |n: &str| req.host.request.iter().any(|(k, _)| k == n);
        assert!(
            !sent("if-none-match"),
            "{status}: a 304 has nothing to add to"
        );
        req.host.response = vec![
            (":status".into(), status.as_bytes().to_vec()),
            ("content-length".into(), body.len().to_string().into_bytes()),
            ("etag".into(), b"\"local\"".to_vec()),
        ];
        assert_eq!(req.on_response_headers(false), Action::Continue);
        let half = body.len() / 2;
        let first = req.on_response_body(half, false);
        let last = req.on_response_body(body.len(), true);
        assert_eq!(last, Action::Continue, "{status}");
        let kept = |n: &str| req.host.response.iter().any(|(k, _)| k == n);
        match want {
            Some(union) => {
                assert_eq!(first, Action::Pause, "{status}: held until complete");
                assert!(!kept("content-length") && !kept("etag"), "{status}");
                assert_eq!(req.host.bodies, vec![union.as_bytes().to_vec()], "{status}");
            }
            None => {
                assert!(req.host.bodies.is_empty(), "{status}");
            }
        }
    }
    // Past the cap the body is released unchanged, long before Envoy's buffer limit.
    let host = FakeHost {
        request: request_headers("GET", b"/openapi/v3", &[TOKEN]),
        ..FakeHost::default()
    };
    let mut req = request(host);
    req.on_request_headers();
    req.host.response = vec![(":status".into(), b"200".to_vec())];
    req.on_response_headers(false);
    let cap = crate::openapi::MAX_ROOT_BYTES;
    assert_eq!(req.on_response_body(cap, false), Action::Pause);
    assert_eq!(req.on_response_body(cap + 1, false), Action::Continue);
    assert_eq!(req.on_response_body(cap + 2, true), Action::Continue);
    assert!(req.host.bodies.is_empty());
}

/// The document of a peer-only group-version goes to the peer that listed it, with the loop
/// guard and the client's identity variant, like a resource that peer serves.
#[test]
fn a_peer_only_openapi_document_goes_to_the_peer() {
    let host = FakeHost {
        request: request_headers(
            "GET",
            b"/openapi/v3/apis/resource.k8s.io/v1beta2?hash=B2",
            &[TOKEN],
        ),
        ..FakeHost::default()
    };
    let mut req = request(host);
    assert_eq!(req.on_request_headers(), Action::Continue);
    let header = |n: &str| {
        req.host
            .request
            .iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| String::from_utf8_lossy(v).to_string())
    };
    assert_eq!(
        header("x-skewgate-upstream-cluster").as_deref(),
        Some("p133-token")
    );
    assert_eq!(header("x-kubernetes-peer-proxied").as_deref(), Some("true"));

    // kube-openapi's answer to a matching hash, cacheable for a year: it reaches the client
    // uncacheable, its body untouched, and counts as rerouted.
    req.host.response = vec![
        (":status".into(), b"200".to_vec()),
        ("content-type".into(), b"application/json".to_vec()),
        ("etag".into(), b"\"B2\"".to_vec()),
        ("cache-control".into(), b"public, immutable".to_vec()),
        ("expires".into(), b"Thu, 01 Jan 2099 00:00:00 UTC".to_vec()),
        (
            "last-modified".into(),
            b"Thu, 01 Jan 2026 00:00:00 GMT".to_vec(),
        ),
    ];
    assert_eq!(req.on_response_headers(false), Action::Continue);
    let response: Vec<(&str, &[u8])> = req
        .host
        .response
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_slice()))
        .collect();
    assert_eq!(
        response,
        [
            (":status", &b"200"[..]),
            ("content-type", b"application/json"),
            ("cache-control", b"no-store"),
        ]
    );
    assert_eq!(req.on_response_body(10, true), Action::Continue);
    assert!(req.host.bodies.is_empty(), "the body passes untouched");
    assert_eq!(
        req.host.metrics.keys().collect::<Vec<_>>(),
        [&format!(
            "{REROUTED};code=200;group=resource.k8s.io;version=v1beta2;resource="
        )]
    );
}
