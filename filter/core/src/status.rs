//! `metav1.Status` bodies, the way kube-apiserver writes them.
//!
//! Clients decode error bodies as Status (client-go turns `reason` into typed errors such as
//! `IsServiceUnavailable`); Envoy's plain-text local replies would surface as opaque errors.

use serde::Serialize;

/// The Content-Type kube-apiserver uses for JSON Status bodies.
pub const CONTENT_TYPE: &str = "application/json";

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusBody<'a> {
    kind: &'static str,
    api_version: &'static str,
    metadata: Empty,
    status: &'static str,
    message: &'a str,
    reason: &'static str,
    code: u16,
}

#[derive(Serialize)]
struct Empty {}

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
        code,
    };
    // A struct of strings and integers always serialises.
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
    fn reasons_follow_apimachinery() {
        for (code, reason) in [(404, "NotFound"), (504, "Timeout"), (418, "")] {
            assert_eq!(reason_for(code), reason);
        }
    }
}
