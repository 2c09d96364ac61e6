//! Connection upgrades on resource paths, the way exec/attach/port-forward reach
//! kube-apiserver: WebSocket (RFC 6455 handshake, `Sec-WebSocket-Protocol` negotiation such
//! as `v5.channel.k8s.io`) and SPDY/3.1 (`Upgrade: SPDY/3.1`, `X-Stream-Protocol-Version`).
//! After `101 Switching Protocols` the stream carries no framing of ours: one line
//! `identity <user> <groups...>\n` with the authenticated caller, then every byte received is
//! echoed back. Upgrades need HTTP/1.1 (HTTP/2 has no `Upgrade`).
//!
//! Which requests upgrade: the `exec`, `attach` and `portforward` subresources of a served
//! resource (without `Upgrade` kube answers 400), and, as a test hook, any GET on a served
//! resource path that carries `Upgrade: websocket`.

use std::sync::Arc;

use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use hyper_util::rt::TokioIo;
use sha1::{Digest, Sha1};
use tokio::io::{AsyncWriteExt, BufReader};

use crate::auth::UserInfo;
use crate::router::{ResourcePath, Route};
use crate::server::AppState;
use crate::status;

/// Subresources that only work as a stream.
pub const STREAM_SUBRESOURCES: [&str; 3] = ["exec", "attach", "portforward"];

const WEBSOCKET_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    WebSocket,
    Spdy,
}

/// Every comma-separated token of every value of a header, trimmed.
fn tokens<'a>(headers: &'a HeaderMap, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// The upgrade the client asks for: `Connection: Upgrade` plus a protocol we speak.
pub fn requested(headers: &HeaderMap) -> Option<Protocol> {
    if !tokens(headers, "connection").any(|t| t.eq_ignore_ascii_case("upgrade")) {
        return None;
    }
    tokens(headers, "upgrade").find_map(|t| {
        if t.eq_ignore_ascii_case("websocket") {
            Some(Protocol::WebSocket)
        } else if t.eq_ignore_ascii_case("spdy/3.1") {
            Some(Protocol::Spdy)
        } else {
            None
        }
    })
}

fn wants_websocket(headers: &HeaderMap) -> bool {
    tokens(headers, "upgrade").any(|t| t.eq_ignore_ascii_case("websocket"))
}

/// Whether this request is one `handle` must answer (before its body is read).
pub fn applies(state: &AppState, method: &Method, route: &Route, headers: &HeaderMap) -> bool {
    let Route::Resource(p) = route else {
        return false;
    };
    if state
        .catalog
        .lookup(&p.group, &p.version, &p.resource)
        .is_none()
    {
        return false;
    }
    let stream_sub = p
        .subresource
        .as_deref()
        .is_some_and(|s| STREAM_SUBRESOURCES.contains(&s));
    stream_sub || (*method == Method::GET && wants_websocket(headers))
}

/// `Sec-WebSocket-Accept` for a `Sec-WebSocket-Key` (RFC 6455 section 4.2.2).
pub fn websocket_accept(key: &str) -> String {
    let mut sha = Sha1::new();
    sha.update(key.trim().as_bytes());
    sha.update(WEBSOCKET_GUID.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(sha.finalize())
}

fn bad_request(message: &str) -> Response {
    status::respond(status::bad_request(message))
}

/// Answer an upgrade request on a resource path: 101 and the echo stream, or kube's errors.
pub async fn handle(
    state: &Arc<AppState>,
    path: &ResourcePath,
    mut req: Request,
    user: &UserInfo,
) -> Response {
    let Some(info) = crate::resources::registered(state, path) else {
        return crate::resources::not_registered(state, path);
    };
    if let Some(sub) = &path.subresource {
        if STREAM_SUBRESOURCES.contains(&sub.as_str()) {
            let verb = match *req.method() {
                Method::GET => "get",
                Method::POST => "create",
                _ => "",
            };
            if verb.is_empty() || !info.sub_allows(sub, verb) {
                return status::respond(status::method_not_allowed(
                    &info.group,
                    &info.resource,
                    &req.method().as_str().to_ascii_lowercase(),
                ));
            }
            if path.name.is_none() {
                return status::page_not_found();
            }
        }
    }
    let headers = req.headers();
    let Some(protocol) = requested(headers) else {
        return bad_request("Upgrade request required");
    };
    if req.version() != axum::http::Version::HTTP_11 {
        return bad_request("Upgrade request required (upgrades need HTTP/1.1)");
    }
    let mut resp = StatusCode::SWITCHING_PROTOCOLS.into_response();
    let h = resp.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    match protocol {
        Protocol::WebSocket => {
            let version_ok = headers
                .get("sec-websocket-version")
                .is_some_and(|v| v.as_bytes() == b"13");
            let Some(key) = headers
                .get("sec-websocket-key")
                .and_then(|k| k.to_str().ok())
            else {
                return bad_request("websocket: not a websocket handshake: 'Sec-WebSocket-Key' header is missing or blank");
            };
            if !version_ok {
                return bad_request("websocket: unsupported version: 13 not found in 'Sec-Websocket-Version' header");
            }
            h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
            if let Ok(v) = HeaderValue::from_str(&websocket_accept(key)) {
                h.insert("sec-websocket-accept", v);
            }
            if let Some(p) = tokens(headers, "sec-websocket-protocol").next() {
                if let Ok(v) = HeaderValue::from_str(p) {
                    h.insert("sec-websocket-protocol", v);
                }
            }
        }
        Protocol::Spdy => {
            h.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
            if let Some(p) = tokens(headers, "x-stream-protocol-version").next() {
                if let Ok(v) = HeaderValue::from_str(p) {
                    h.insert("x-stream-protocol-version", v);
                }
            }
        }
    }
    let on_upgrade = hyper::upgrade::on(&mut req);
    let line = user.identity_line();
    let mut shutdown = state.shutdown.clone();
    let label = format!("sim-apiserver[{}]", state.id);
    tokio::spawn(async move {
        let upgraded = match on_upgrade.await {
            Ok(u) => u,
            Err(e) => {
                eprintln!("{label} upgrade failed: {e}");
                return;
            }
        };
        let io = TokioIo::new(upgraded);
        let (reader, mut writer) = tokio::io::split(io);
        let echo = async move {
            writer.write_all(line.as_bytes()).await?;
            writer.flush().await?;
            let mut reader = BufReader::new(reader);
            tokio::io::copy_buf(&mut reader, &mut writer).await?;
            writer.shutdown().await
        };
        tokio::select! {
            r = echo => {
                if let Err(e) = r {
                    eprintln!("{label} upgraded stream: {e}");
                }
            }
            _ = shutdown.wait_for(|stop| *stop) => {}
        }
    });
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn rfc6455_example_key() {
        assert_eq!(
            websocket_accept("dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[test]
    fn upgrade_detection() {
        assert_eq!(
            requested(&headers(&[
                ("connection", "keep-alive, Upgrade"),
                ("upgrade", "WebSocket")
            ])),
            Some(Protocol::WebSocket)
        );
        assert_eq!(
            requested(&headers(&[
                ("connection", "Upgrade"),
                ("upgrade", "SPDY/3.1")
            ])),
            Some(Protocol::Spdy)
        );
        assert_eq!(requested(&headers(&[("upgrade", "websocket")])), None);
        assert_eq!(
            requested(&headers(&[("connection", "upgrade"), ("upgrade", "h2c")])),
            None
        );
    }
}
