//! `metav1.Status` bodies, the way kube-apiserver writes them.
//!
//! Clients decode error bodies as Status (client-go turns `reason` into typed errors such as
//! `IsServiceUnavailable`); Envoy's plain-text local replies would surface as opaque errors.

use serde::Serialize;

/// The Content-Type kube-apiserver uses for JSON Status bodies.
pub const CONTENT_TYPE: &str = "application/json";

/// How long a client should wait before retrying a 503 the filter answers because no live
/// apiserver is known to serve a resource now. client-go retries a 5xx that carries
/// `Retry-After` by itself (and `SuggestsClientDelay` reads `details.retryAfterSeconds`).
pub const RETRY_AFTER_SECONDS: u32 = 5;
/// [`RETRY_AFTER_SECONDS`] as the `Retry-After` header value.
pub const RETRY_AFTER: &str = "5";

/// What kube's clients print for a 503 (`StatusReasonServiceUnavailable`); our 503 messages
/// start with it.
pub const UNAVAILABLE_PREFIX: &str = "the server is currently unable to handle the request";

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusBody<'a> {
    kind: &'static str,
    api_version: &'static str,
    metadata: Empty,
    status: &'static str,
    message: &'a str,
    reason: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<Details>,
    code: u16,
}

#[derive(Serialize)]
struct Empty {}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Details {
    retry_after_seconds: u32,
}

/// The `reason` kube uses for a status code (apimachinery's `StatusReason` constants).
pub fn reason_for(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        406 => "NotAcceptable",
        409 => "Conflict",
        410 => "Expired",
        413 => "RequestEntityTooLarge",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "",
    }
}

/// A Failure Status with the given code and message, as compact JSON.
pub fn failure(code: u16, message: &str) -> String {
    let body = StatusBody {
        kind: "Status",
        api_version: "v1",
        metadata: Empty {},
        status: "Failure",
        message,
        reason: reason_for(code),
        details: None,
        code,
    };
    // A struct of strings and integers always serialises.
    serde_json::to_string(&body).unwrap_or_default()
}

/// A 503 `ServiceUnavailable` Status that asks for a retry after [`RETRY_AFTER_SECONDS`]
/// (`details.retryAfterSeconds`, as kube writes it); `message` follows
/// [`UNAVAILABLE_PREFIX`]. Send it with `Retry-After: `[`RETRY_AFTER`].
pub fn unavailable(message: &str) -> String {
    let message = format!("{UNAVAILABLE_PREFIX}: {message}");
    let body = StatusBody {
        kind: "Status",
        api_version: "v1",
        metadata: Empty {},
        status: "Failure",
        message: &message,
        reason: reason_for(503),
        details: Some(Details {
            retry_after_seconds: RETRY_AFTER_SECONDS,
        }),
        code: 503,
    };
    serde_json::to_string(&body).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn renders_kube_shaped_status() {
        let body = failure(503, "peer \"apiserver-b\" is \"unreachable\"");
        assert_eq!(
            body,
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"peer \"apiserver-b\" is \"unreachable\"","reason":"ServiceUnavailable","code":503}"#
        );
        let parsed: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(parsed["code"], 503);
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn unavailable_asks_for_a_retry() {
        assert_eq!(
            unavailable("no live apiserver serves g/v, Resource=r now"),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server is currently unable to handle the request: no live apiserver serves g/v, Resource=r now","reason":"ServiceUnavailable","details":{"retryAfterSeconds":5},"code":503}"#
        );
        assert_eq!(RETRY_AFTER, RETRY_AFTER_SECONDS.to_string());
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn reasons_follow_apimachinery() {
        for (code, reason) in [(404, "NotFound"), (504, "Timeout"), (418, "")] {
            assert_eq!(reason_for(code), reason);
        }
    }
}
