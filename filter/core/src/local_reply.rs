//! What to do with a reply Envoy generated itself (docs/ARCHITECTURE.md step 9).
//!
//! Envoy answers with plain text when it cannot reach an upstream ("upstream connect error or
//! disconnect/reset before headers..."). kube clients expect a `metav1.Status`; and for a request
//! we routed to a peer, a 404 or a 502 would be read as "gone" or as a bug. So: every reply Envoy
//! produced gets a Status body, and a peer that cannot answer is always 503 ServiceUnavailable,
//! which clients and controllers treat as retryable.

use crate::metrics::PeerError;
use crate::status;

/// Envoy's `response.code_details` for a response that came from the upstream.
pub const VIA_UPSTREAM: &str = "via_upstream";

/// The replacement for an Envoy-generated reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewrite {
    pub code: u16,
    /// A complete `metav1.Status` JSON document.
    pub body: String,
}

/// Where the request had been routed, as far as the reply mapping cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoutedTo<'a> {
    Local,
    /// `target` names what was asked for (`resource.k8s.io/v1beta2, Resource=resourceclaims`).
    Peer {
        target: &'a str,
    },
}

/// `code` is the reply's status; `details` Envoy's `response.code_details`.
/// `None` means the reply came from an apiserver and passes untouched.
pub fn rewrite(routed: RoutedTo<'_>, code: u16, details: &str) -> Option<Rewrite> {
    if details == VIA_UPSTREAM || details.is_empty() || code < 400 {
        return None;
    }
    match routed {
        RoutedTo::Peer { target } if is_upstream_failure(code) => {
            // Only a connection that never opened proves the request was not processed (no
            // peer of the set reachable, or every one of them silent or not ready: Envoy's
            // `no_healthy_upstream`): then the 503 says when to retry, as the filter's own do,
            // and client-go retries it by itself whatever the method. After a reset or a
            // timeout the peer may have acted on it: a plain 503.
            if never_connected(details) {
                let message =
                    format!("the peer apiserver serving {target} could not be reached ({details})");
                return Some(Rewrite {
                    code: 503,
                    body: status::unavailable(&message),
                });
            }
            let message = format!("the peer apiserver serving {target} did not answer ({details})");
            Some(Rewrite {
                code: 503,
                body: status::failure(503, &message),
            })
        }
        RoutedTo::Local if is_upstream_failure(code) => Some(Rewrite {
            code,
            body: status::failure(
                code,
                &format!("the apiserver could not be reached ({details})"),
            ),
        }),
        _ => Some(Rewrite {
            code,
            body: status::failure(code, &format!("rejected by the proxy ({details})")),
        }),
    }
}

/// An apiserver's answer that it does not serve the path at all: kube's `404 page not found`,
/// Go's `http.NotFound` with `Content-Type: text/plain; charset=utf-8`. A missing *object* is a
/// `metav1.Status` NotFound instead (JSON, protobuf or YAML), and passes. `details` is Envoy's
/// `response.code_details`: the answer must come from the upstream (or be unknown: a retryable
/// 503 is safer than a false 404); Envoy's own replies go through [`rewrite`].
pub fn is_page_not_found(code: u16, details: &str, content_type: Option<&[u8]>) -> bool {
    upstream_404_of(code, details, content_type, TEXT_PLAIN)
}

/// An apiserver's 404 (from the upstream, or of unknown origin) whose content type is `media`.
fn upstream_404_of(code: u16, details: &str, content_type: Option<&[u8]>, media: &[u8]) -> bool {
    code == 404
        && (details == VIA_UPSTREAM || details.is_empty())
        && content_type.is_some_and(|value| {
            value
                .trim_ascii_start()
                .get(..media.len())
                .is_some_and(|m| m.eq_ignore_ascii_case(media))
        })
}

const TEXT_PLAIN: &[u8] = b"text/plain";
const APPLICATION_JSON: &[u8] = b"application/json";

/// An apiserver's JSON 404, which only its body tells apart: kube's generic NotFound for a
/// path under a group-version it serves that names no route of it ([`is_no_route`]: a
/// resource, subresource or scope the group-version does not have, as a real 1.36 answers
/// for a resource only 1.37 serves in `certificates.k8s.io/v1`), or a missing object.
pub fn is_json_not_found(code: u16, details: &str, content_type: Option<&[u8]>) -> bool {
    upstream_404_of(code, details, content_type, APPLICATION_JSON)
}

/// The largest JSON 404 body read for [`is_no_route`]: kube's generic NotFound is about 200
/// bytes; a larger body is no such answer and passes unread.
pub const MAX_NOT_FOUND_BODY: usize = 4096;

#[derive(serde::Deserialize)]
struct NotFoundStatus<'a> {
    #[serde(borrow)]
    kind: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    reason: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    details: Option<NotFoundDetails<'a>>,
}

#[derive(serde::Deserialize)]
struct NotFoundDetails<'a> {
    #[serde(borrow, default)]
    name: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    kind: Option<std::borrow::Cow<'a, str>>,
}

/// Whether a JSON 404 body is kube's generic NotFound (`the server could not find the
/// requested resource`): a `Status` with reason NotFound whose details name neither an object
/// nor a kind. A missing object's NotFound names both, and passes.
pub fn is_no_route(body: &[u8]) -> bool {
    let Ok(status) = serde_json::from_slice::<NotFoundStatus<'_>>(body) else {
        return false;
    };
    let empty = |s: &Option<std::borrow::Cow<'_, str>>| s.as_deref().is_none_or(str::is_empty);
    status.kind.as_deref() == Some("Status")
        && status.reason.as_deref() == Some("NotFound")
        && status
            .details
            .as_ref()
            .is_none_or(|d| empty(&d.name) && empty(&d.kind))
}

/// The 503 for an apiserver that answered `404 page not found` for `target`, which the routing
/// table says it serves: our view of it is out of date (it restarted on another version), so
/// the client retries rather than read "gone".
pub fn not_served(target: &str) -> Rewrite {
    Rewrite {
        code: 503,
        body: status::unavailable(&format!(
            "{target} is not served by the apiserver that answered, which has probably just \
             restarted (retry)"
        )),
    }
}

/// The 503 for the local apiserver's `404 page not found` while this Envoy runs its fallback
/// configuration (no control plane yet): another apiserver may serve `target`.
pub fn not_known(target: &str) -> Rewrite {
    Rewrite {
        code: 503,
        body: status::unavailable(&format!(
            "{target} is not served by this apiserver, and whether another one serves it is \
             not known yet: skewgate has not configured this proxy (retry)"
        )),
    }
}

/// Why a peer-bound request Envoy replied to itself failed (`code` and `details` as for
/// [`rewrite`]), for `apiserver_peer_proxy_errors_total{type}`.
pub fn peer_error(code: u16, details: &str) -> PeerError {
    if !is_upstream_failure(code) {
        PeerError::Rejected
    } else if never_connected(details) {
        PeerError::Connect
    } else if details.contains("timeout") {
        PeerError::Timeout
    } else {
        PeerError::Reset
    }
}

/// Envoy never had a connection to send the request on (refused, TLS failure, no healthy
/// host): the request was not processed anywhere.
pub fn never_connected(details: &str) -> bool {
    details.contains("connection_failure") || details.contains("no_healthy_upstream")
}

/// Codes Envoy uses when the upstream did not answer: reset, refused, TLS failure (502/503),
/// and timeout before response headers (504).
fn is_upstream_failure(code: u16) -> bool {
    matches!(code, 502..=504)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn maps_envoy_replies() {
        let peer = RoutedTo::Peer {
            target: "resource.k8s.io/v1beta2, Resource=resourceclaims",
        };
        let refused = "upstream_reset_before_response_started{remote_connection_failure,delayed_connect_error:_Connection_refused}";
        // (routed, code, details, expected code or None)
        let cases: Vec<(RoutedTo, u16, &str, Option<u16>)> = vec![
            // Apiserver answers pass, whatever they are.
            (peer, 503, VIA_UPSTREAM, None),
            (peer, 404, VIA_UPSTREAM, None),
            (RoutedTo::Local, 500, VIA_UPSTREAM, None),
            (peer, 200, VIA_UPSTREAM, None),
            // Peer unreachable in any way: 503.
            (peer, 503, refused, Some(503)),
            (peer, 503, "no_healthy_upstream", Some(503)),
            (peer, 502, "upstream_reset_before_response_started{connection_termination}", Some(503)),
            (peer, 503, "upstream_reset_before_response_started{connection_failure,TLS_error:_CERTIFICATE_VERIFY_FAILED}", Some(503)),
            (peer, 504, "upstream_response_timeout", Some(503)),
            // Local failures keep their code, with a Status body.
            (RoutedTo::Local, 503, refused, Some(503)),
            (RoutedTo::Local, 504, "upstream_response_timeout", Some(504)),
            // Other Envoy replies keep their code too.
            (RoutedTo::Local, 431, "request_headers_too_large", Some(431)),
            (RoutedTo::Local, 400, "http1.codec_error", Some(400)),
            (peer, 413, "request_payload_too_large", Some(413)),
            // No details known: leave it alone rather than guess.
            (peer, 503, "", None),
            (RoutedTo::Local, 101, "upgrade", None),
        ];
        for (code, details, want) in [
            (503, refused, PeerError::Connect),
            (503, "no_healthy_upstream", PeerError::Connect),
            (503, "upstream_reset_before_response_started{connection_failure,TLS_error:_CERTIFICATE_VERIFY_FAILED}", PeerError::Connect),
            (502, "upstream_reset_before_response_started{connection_termination}", PeerError::Reset),
            (504, "upstream_response_timeout", PeerError::Timeout),
            (413, "request_payload_too_large", PeerError::Rejected),
        ] {
            assert_eq!(peer_error(code, details), want, "{code} {details}");
        }
        for (routed, code, details, want) in cases {
            let got = rewrite(routed, code, details);
            assert_eq!(
                got.as_ref().map(|r| r.code),
                want,
                "{routed:?} {code} {details}"
            );
            if let Some(r) = got {
                let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
                assert_eq!(v["kind"], "Status");
                assert_eq!(v["code"], r.code);
                assert_eq!(v["reason"], status::reason_for(r.code));
            }
        }
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn tells_page_not_found_from_a_missing_object() {
        let plain = Some(&b"text/plain; charset=utf-8"[..]);
        // (code, details, content type, page not found)
        let cases: Vec<(u16, &str, Option<&[u8]>, bool)> = vec![
            (404, VIA_UPSTREAM, plain, true),
            (404, VIA_UPSTREAM, Some(b"Text/Plain"), true),
            (404, VIA_UPSTREAM, Some(b" text/plain;charset=utf-8"), true),
            (404, "", plain, true),
            // A Status NotFound for a missing object, in any of kube's encodings.
            (404, VIA_UPSTREAM, Some(b"application/json"), false),
            (
                404,
                VIA_UPSTREAM,
                Some(b"application/vnd.kubernetes.protobuf"),
                false,
            ),
            (404, VIA_UPSTREAM, Some(b"application/yaml"), false),
            (404, VIA_UPSTREAM, None, false),
            (404, VIA_UPSTREAM, Some(b"text/pla"), false),
            (404, VIA_UPSTREAM, Some(b"text/html"), false),
            // Not a 404, or Envoy's own reply (mapped by `rewrite`).
            (200, VIA_UPSTREAM, plain, false),
            (410, VIA_UPSTREAM, plain, false),
            (404, "route_not_found", plain, false),
        ];
        for (code, details, content_type, want) in cases {
            assert_eq!(
                is_page_not_found(code, details, content_type),
                want,
                "{code} {details} {content_type:?}"
            );
        }
        // The JSON 404s: which ones are read at all, and which body is no route.
        let json = Some(&b"application/json"[..]);
        assert!(is_json_not_found(404, VIA_UPSTREAM, json));
        assert!(is_json_not_found(
            404,
            "",
            Some(b" Application/JSON;charset=utf-8")
        ));
        assert!(!is_json_not_found(404, VIA_UPSTREAM, plain));
        assert!(!is_json_not_found(
            404,
            VIA_UPSTREAM,
            Some(b"application/vnd.kubernetes.protobuf")
        ));
        assert!(!is_json_not_found(404, "route_not_found", json));
        assert!(!is_json_not_found(200, VIA_UPSTREAM, json));
        let bodies: &[(&[u8], bool)] = &[
            // A real 1.36 asked for a 1.37-only resource of certificates.k8s.io/v1 (compact, as
            // client-go gets it, and pretty, as curl does).
            (br#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server could not find the requested resource","reason":"NotFound","details":{},"code":404}"#, true),
            (b"{\n  \"kind\": \"Status\",\n  \"apiVersion\": \"v1\",\n  \"metadata\": {},\n  \"status\": \"Failure\",\n  \"message\": \"the server could not find the requested resource\",\n  \"reason\": \"NotFound\",\n  \"details\": {},\n  \"code\": 404\n}", true),
            (br#"{"kind":"Status","reason":"NotFound","code":404}"#, true),
            // A missing object: named.
            (br#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"configmaps \"x\" not found","reason":"NotFound","details":{"name":"x","kind":"configmaps"},"code":404}"#, false),
            (br#"{"kind":"Status","reason":"NotFound","details":{"kind":"pods"}}"#, false),
            // Anything else.
            (br#"{"kind":"Status","reason":"Forbidden","details":{}}"#, false),
            (br#"{"kind":"ConfigMap","reason":"NotFound"}"#, false),
            (b"404 page not found", false),
            (b"", false),
            (br#"{"kind":7}"#, false),
        ];
        for (body, want) in bodies {
            assert_eq!(
                is_no_route(body),
                *want,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        let r = not_served("g/v, Resource=r");
        assert_eq!(r.code, 503);
        let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(v["reason"], "ServiceUnavailable");
        assert_eq!(v["details"]["retryAfterSeconds"], 5);
        assert_eq!(
            v["message"],
            "the server is currently unable to handle the request: g/v, Resource=r is not served \
             by the apiserver that answered, which has probably just restarted (retry)"
        );
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn peer_message_names_the_resource() {
        let r = rewrite(
            RoutedTo::Peer {
                target: "g/v, Resource=r",
            },
            503,
            "no_healthy_upstream",
        );
        let r = r.unwrap();
        assert!(r.body.contains("g/v, Resource=r"), "{}", r.body);
        assert!(r.body.contains("\"reason\":\"ServiceUnavailable\""));
        assert!(r.body.contains("could not be reached"), "{}", r.body);
        let r = rewrite(
            RoutedTo::Peer {
                target: "g/v, Resource=r",
            },
            504,
            "response_timeout",
        );
        assert!(r
            .unwrap()
            .body
            .contains("did not answer (response_timeout)"));
    }
}
