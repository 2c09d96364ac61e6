//! One HTTP request through the filter (DESIGN.md "Request path", steps 1-9).

use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, Bytes};
use skewgate_core::config::{UpstreamAuth, LOCAL_CLUSTER};
use skewgate_core::discovery::{DiscoveryAnswer, DiscoveryHeaders, PassReason, Response};
use skewgate_core::hygiene::{self, PEER_PROXIED, REQUEST_CLASS, SHORT_REQUEST, UPSTREAM_CLUSTER};
use skewgate_core::identity;
use skewgate_core::local_reply::{self, RoutedTo};
use skewgate_core::routing::Upstream;
use skewgate_core::status;

use crate::host;
use crate::metrics::Metrics;
use crate::root::Compiled;

/// What the filter did with the request headers.
enum Handled {
    /// Sent on to an apiserver.
    Forwarded,
    /// Answered here (a client certificate we cannot map).
    Answered,
}

/// The headers merged discovery is negotiated on, kept to answer once the local apiserver has
/// authorized the request.
struct PendingDiscovery {
    method: String,
    path: String,
    accept: Option<Bytes>,
    if_none_match: Option<Bytes>,
    accept_encoding: Option<Bytes>,
}

impl PendingDiscovery {
    fn headers(&self) -> DiscoveryHeaders<'_> {
        DiscoveryHeaders {
            accept: self.accept.as_deref(),
            if_none_match: self.if_none_match.as_deref(),
            accept_encoding: self.accept_encoding.as_deref(),
        }
    }
}

/// What replaces the body of the response.
enum Replacement {
    /// Envoy's own reply, as a Status.
    Status(String),
    /// The local apiserver's discovery answer, by the merged document.
    Discovery,
}

pub struct Request {
    compiled: Rc<Compiled>,
    metrics: Rc<Metrics>,
    /// What a peer-bound request asked for, for the 503 message; `None` when routed locally.
    peer_target: Option<String>,
    /// A discovery request we answer from the merged documents if the local apiserver lets
    /// the client read discovery at all.
    discovery: Option<PendingDiscovery>,
    replacement: Option<Replacement>,
    /// The replacement body went out with the first chunk.
    replacement_sent: bool,
}

impl Request {
    pub fn new(compiled: Rc<Compiled>, metrics: Rc<Metrics>) -> Self {
        Request {
            compiled,
            metrics,
            peer_target: None,
            discovery: None,
            replacement: None,
            replacement_sent: false,
        }
    }

    /// Steps 1-8. Errors from the host are returned, and the request then fails closed with a
    /// 503 Status: a request we could not sanitise must not reach an apiserver.
    fn route_request(&mut self) -> Result<Handled, proxy_wasm::types::Status> {
        let headers = host::request_headers()?;

        // Step 1: strip every header a client must not control, before anything else.
        let forbidden = hygiene::forbidden_names(headers.iter().map(|(n, _)| n.as_str()));
        for name in &forbidden {
            host::remove_request_header(name)?;
        }
        if !forbidden.is_empty() {
            log::debug!("skewgate: removed client headers {forbidden:?}");
        }

        // Envoy gives names in lower case; the first value counts, as Go's Header.Get.
        let raw = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_slice())
        };
        let method = String::from_utf8_lossy(raw(":method").unwrap_or_default());
        let path = String::from_utf8_lossy(raw(":path").unwrap_or_default());

        // Step 2: identity.
        let auth = match host::property(&["connection", "subject_peer_certificate"])? {
            Some(subject) if !subject.is_empty() => {
                let subject = String::from_utf8_lossy(&subject);
                match identity::identity_from_subject(&subject) {
                    Ok(id) => {
                        // Step 1 removed every client copy, so adding is setting.
                        for (name, value) in identity::remote_headers(&id) {
                            host::add_request_header(name, value)?;
                        }
                        UpstreamAuth::ProxyIdentity
                    }
                    Err(e) => {
                        // kube-apiserver's x509 authenticator fails such a certificate too.
                        log::info!("skewgate: refusing client certificate {subject:?}: {e}");
                        let body = status::failure(
                            401,
                            &format!("client certificate cannot be used to authenticate: {e}"),
                        );
                        host::send_response(
                            401,
                            &[("content-type", status::CONTENT_TYPE)],
                            body.as_bytes(),
                        )?;
                        return Ok(Handled::Answered);
                    }
                }
            }
            _ if raw("authorization").is_some() => UpstreamAuth::Token,
            _ => UpstreamAuth::Anonymous,
        };

        // Step 3: discovery. The local apiserver still authenticates and authorizes the
        // request (anonymous users may not read /apis by default): it gets a plain request
        // for its own document, and only an authorized answer (200, or 404 for a legacy path
        // it does not serve) is replaced by the merged one.
        if let Some(discovery) = &self.compiled.discovery {
            let discovery_headers = DiscoveryHeaders {
                accept: raw("accept"),
                if_none_match: raw("if-none-match"),
                accept_encoding: raw("accept-encoding"),
            };
            let (answer, reason) = discovery.answer(&method, &path, discovery_headers);
            match reason {
                PassReason::NoPeer => Metrics::inc(self.metrics.discovery_nopeer),
                PassReason::Local => Metrics::inc(self.metrics.discovery_cache_misses),
                PassReason::NotDiscovery => {}
            }
            if let DiscoveryAnswer::Respond(_) = answer {
                self.discovery = Some(PendingDiscovery {
                    method: method.to_string(),
                    path: path.to_string(),
                    accept: raw("accept").map(<[u8]>::to_vec),
                    if_none_match: raw("if-none-match").map(<[u8]>::to_vec),
                    accept_encoding: raw("accept-encoding").map(<[u8]>::to_vec),
                });
                host::set_request_header("accept", "application/json")?;
                host::remove_request_header("if-none-match")?;
                host::remove_request_header("accept-encoding")?;
                host::set_request_header(UPSTREAM_CLUSTER, &auth.cluster(LOCAL_CLUSTER))?;
                host::set_request_header(REQUEST_CLASS, SHORT_REQUEST)?;
                host::clear_route_cache()?;
                return Ok(Handled::Forwarded);
            }
        }

        // Steps 4-8.
        let (info, decision) = self.compiled.table.route(&method, &path);
        log::debug!("skewgate: {method} {path} -> {decision:?}");
        // Watches, exec, logs and the like stream without a timeout; everything else is
        // bounded, so an apiserver that accepts the connection but never answers yields a 503.
        if info.as_ref().is_some_and(|i| !i.is_long_running()) {
            host::set_request_header(REQUEST_CLASS, SHORT_REQUEST)?;
        }
        let base = match decision.upstream {
            Upstream::Local => LOCAL_CLUSTER,
            Upstream::Peer { cluster } => {
                Metrics::inc(self.metrics.rerouted);
                // The loop guard: the peer apiserver must serve this itself, never re-proxy.
                host::set_request_header(PEER_PROXIED, "true")?;
                self.peer_target = info.map(|i| {
                    let gv = if i.api_group.is_empty() {
                        i.api_version
                    } else {
                        format!("{}/{}", i.api_group, i.api_version)
                    };
                    let resource = if i.subresource.is_empty() {
                        i.resource
                    } else {
                        format!("{}/{}", i.resource, i.subresource)
                    };
                    format!("{gv}, Resource={resource}")
                });
                cluster
            }
        };
        host::set_request_header(UPSTREAM_CLUSTER, &auth.cluster(base))?;
        host::clear_route_cache()?;
        Ok(Handled::Forwarded)
    }

    /// The local apiserver let the client read discovery: answer with the merged document.
    fn answer_discovery(&mut self, code: u16) -> Result<bool, proxy_wasm::types::Status> {
        let (Some(pending), Some(merged)) = (&self.discovery, &self.compiled.discovery) else {
            return Ok(false);
        };
        // 200, or 404 for a legacy path it does not serve itself: either way the request was
        // authenticated and authorized (kube authorizes before routing). 401, 403 and the rest:
        // the apiserver's own answer stands.
        if code != 200 && code != 404 {
            return Ok(false);
        }
        let (DiscoveryAnswer::Respond(response), _) =
            merged.answer(&pending.method, &pending.path, pending.headers())
        else {
            return Ok(false);
        };
        Metrics::inc(self.metrics.discovery_cache_hits);
        set_discovery_headers(&response)?;
        self.replacement = Some(Replacement::Discovery);
        Ok(true)
    }

    /// Step 9: give Envoy's own replies a Status body, and make an unreachable peer a 503.
    fn map_response(&mut self) -> Result<(), proxy_wasm::types::Status> {
        let code = host::response_header(":status")?
            .and_then(|v| std::str::from_utf8(&v).ok()?.parse::<u16>().ok())
            .unwrap_or(0);
        if self.answer_discovery(code)? || code < 400 {
            return Ok(());
        }
        let details = host::property(&["response", "code_details"])?
            .map(|v| String::from_utf8_lossy(&v).into_owned())
            .unwrap_or_default();
        let routed = match &self.peer_target {
            Some(target) => RoutedTo::Peer { target },
            None => RoutedTo::Local,
        };
        if let Some(rewrite) = local_reply::rewrite(routed, code, &details) {
            if self.peer_target.is_some() {
                Metrics::inc(self.metrics.peer_proxy_errors);
            }
            log::info!(
                "skewgate: Envoy replied {code} ({details}); answering {} with a Status",
                rewrite.code
            );
            host::set_response_header(":status", &rewrite.code.to_string())?;
            host::set_response_header("content-type", status::CONTENT_TYPE)?;
            host::remove_response_header("content-length")?;
            self.replacement = Some(Replacement::Status(rewrite.body));
        }
        Ok(())
    }

    fn replacement_body(&self) -> Option<&[u8]> {
        match self.replacement.as_ref()? {
            Replacement::Status(body) => Some(body.as_bytes()),
            Replacement::Discovery => {
                let (pending, merged) =
                    (self.discovery.as_ref()?, self.compiled.discovery.as_ref()?);
                match merged
                    .answer(&pending.method, &pending.path, pending.headers())
                    .0
                {
                    DiscoveryAnswer::Respond(response) => Some(response.body),
                    DiscoveryAnswer::Pass => None,
                }
            }
        }
    }
}

/// kube-apiserver's headers for a discovery answer, over the local apiserver's.
fn set_discovery_headers(response: &Response<'_>) -> Result<(), proxy_wasm::types::Status> {
    host::set_response_header(":status", &response.status.to_string())?;
    host::set_response_header("content-type", response.content_type)?;
    host::remove_response_header("content-length")?;
    match response.etag {
        Some(etag) => {
            // Aggregated discovery is cacheable and varies by Accept (v2, v2beta1, legacy).
            host::set_response_header("etag", etag)?;
            host::set_response_header("vary", "Accept")?;
            host::set_response_header("cache-control", "public")?;
        }
        None => host::remove_response_header("etag")?,
    }
    if response.gzip {
        host::set_response_header("content-encoding", "gzip")?;
        host::add_response_header("vary", "Accept-Encoding")?;
    } else {
        host::remove_response_header("content-encoding")?;
    }
    Ok(())
}

impl Context for Request {}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        match self.route_request() {
            Ok(Handled::Forwarded) => Action::Continue,
            Ok(Handled::Answered) => Action::Pause,
            Err(e) => {
                log::error!("skewgate: host call failed while routing: {e:?}");
                let body = status::failure(503, "the proxy could not process the request");
                // If even this fails there is nothing left to do but stop the request.
                let _ = host::send_response(
                    503,
                    &[("content-type", status::CONTENT_TYPE)],
                    body.as_bytes(),
                );
                Action::Pause
            }
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        if let Err(e) = self.map_response() {
            log::error!("skewgate: host call failed while mapping a reply: {e:?}");
        }
        if end_of_stream && self.replacement.is_some() {
            // No body follows (HEAD): nothing to replace.
            self.replacement = None;
        }
        Action::Continue
    }

    /// The replacement goes out in place of the first chunk, and every later chunk of the
    /// original is dropped. Nothing is buffered: buffering a document larger than Envoy's
    /// buffer limit (1 MiB by default; merged discovery may be 4 MiB) makes Envoy reset the
    /// stream from inside the host call, which re-enters the VM and takes Envoy down.
    fn on_http_response_body(&mut self, body_size: usize, _end_of_stream: bool) -> Action {
        if self.replacement.is_none() {
            return Action::Continue;
        }
        let body = if self.replacement_sent {
            &[][..]
        } else {
            self.replacement_body().unwrap_or_default()
        };
        if let Err(e) = host::replace_response_body(body_size, body) {
            log::error!("skewgate: replacing the response body failed: {e:?}");
        }
        self.replacement_sent = true;
        Action::Continue
    }
}
