//! Which request headers a client may not send.
//!
//! Trust headers are always stripped, never merged or allow-listed: an aggregator that stripped
//! only the configured `X-Remote-*` names was spoofable (kubernetes#119631). Loop-guard and
//! internal routing headers are stripped too, so a client can neither pick an upstream nor make
//! an apiserver believe a peer already proxied the request. `Impersonate-*` passes: the
//! apiserver authorizes impersonation for the authenticated user.

/// The loop guard kube-apiserver's Mixed Version Proxy sets and honours.
pub const PEER_PROXIED: &str = "x-kubernetes-peer-proxied";
/// The loop-guard name from the KEP-4020 text; never set by us, never accepted from clients.
pub const APISERVER_REROUTED: &str = "x-kubernetes-apiserver-rerouted";
/// Prefix of every header skewgate uses internally between its filter and Envoy's router.
pub const INTERNAL_PREFIX: &str = "x-skewgate-";
/// The header Envoy's peer route reads as `cluster_header`.
pub const UPSTREAM_CLUSTER: &str = "x-skewgate-upstream-cluster";

/// Set on requests kube-apiserver does not bound by its `--request-timeout` (watches, proxy,
/// exec, attach, port-forward, logs, and what it cannot parse); Envoy's routes give every other
/// request a timeout. The rare long-running request carries the header, not the common short
/// one: one header write fewer on almost every request (BENCHMARKS.md, "Per-request cost").
pub const REQUEST_CLASS: &str = "x-skewgate-request-class";
/// The value of [`REQUEST_CLASS`] for an unbounded request.
pub const UNBOUNDED_REQUEST: &str = "unbounded";

/// Headers that carry identity for requestheader authentication (`--requestheader-*-headers`):
/// `X-Remote-User`, `X-Remote-Group`, `X-Remote-Extra-*`, and any other `X-Remote-` name an
/// operator may have configured.
const REMOTE_PREFIX: &str = "x-remote-";

/// True for a header name a client must never get past the filter. Case-insensitive: HTTP/1
/// names arrive in any case, and a mixed-case duplicate must not slip through.
pub fn is_forbidden_request_header(name: &str) -> bool {
    starts_with_ignore_case(name, REMOTE_PREFIX)
        || starts_with_ignore_case(name, INTERNAL_PREFIX)
        || name.eq_ignore_ascii_case(PEER_PROXIED)
        || name.eq_ignore_ascii_case(APISERVER_REROUTED)
}

fn starts_with_ignore_case(s: &str, prefix: &str) -> bool {
    s.len() >= prefix.len()
        && s.as_bytes()
            .iter()
            .zip(prefix.as_bytes())
            .all(|(a, b)| a.eq_ignore_ascii_case(b))
}

/// The names among `headers` to remove, each once, in first-seen order.
pub fn forbidden_names<'a, I>(headers: I) -> Vec<&'a str>
where
    I: IntoIterator<Item = &'a str>,
{
    let mut out: Vec<&str> = Vec::new();
    for name in headers {
        if is_forbidden_request_header(name) && !out.iter().any(|n| n.eq_ignore_ascii_case(name)) {
            out.push(name);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn classifies_headers() {
        let cases = [
            ("x-remote-user", true),
            ("X-Remote-User", true),
            ("X-REMOTE-GROUP", true),
            ("x-remote-extra-scopes", true),
            ("x-remote-anything-an-operator-configured", true),
            ("x-remote-", true),
            ("x-kubernetes-peer-proxied", true),
            ("X-Kubernetes-Peer-Proxied", true),
            ("x-kubernetes-apiserver-rerouted", true),
            ("X-Kubernetes-APIServer-Rerouted", true),
            ("x-skewgate-upstream-cluster", true),
            ("X-Skewgate-Anything", true),
            ("impersonate-user", false),
            ("Impersonate-Group", false),
            ("authorization", false),
            ("x-remote", false),
            ("x-remotes-user", false),
            ("x-kubernetes-peer-proxied-not", false),
            (":path", false),
            ("", false),
            ("x-skewgate", false),
        ];
        for (name, forbidden) in cases {
            assert_eq!(is_forbidden_request_header(name), forbidden, "{name:?}");
        }
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn lists_each_forbidden_name_once() {
        let names = [
            "accept",
            "x-remote-user",
            "X-Remote-User",
            "x-kubernetes-peer-proxied",
            "impersonate-user",
            "x-skewgate-upstream-cluster",
        ];
        assert_eq!(
            forbidden_names(names),
            vec![
                "x-remote-user",
                "x-kubernetes-peer-proxied",
                "x-skewgate-upstream-cluster"
            ]
        );
    }
}
