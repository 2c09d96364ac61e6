//! Small response builders shared by the handlers (JSON bodies, raw JSON bytes).

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

/// A compact JSON body with `Content-Type: application/json`.
pub fn json(status: StatusCode, value: &Value) -> Response {
    raw_json(status, value.to_string().into_bytes())
}

/// Pre-serialised JSON bytes, served as they are.
pub fn raw_json(status: StatusCode, body: impl Into<Body>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.into(),
    )
        .into_response()
}
