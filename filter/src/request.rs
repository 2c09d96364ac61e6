//! One HTTP request through the filter (DESIGN.md "Request path", steps 1 and 4-9).

use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use skewgate_core::discovery::{DiscoveryAnswer, DiscoveryHeaders, PassReason, Response};
use skewgate_core::hygiene::{self, PEER_PROXIED, REQUEST_CLASS, SHORT_REQUEST, UPSTREAM_CLUSTER};
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
    /// Answered here (merged discovery).
    Answered,
}

pub struct Request {
    compiled: Rc<Compiled>,
    metrics: Rc<Metrics>,
    /// What a peer-bound request asked for, for the 503 message; `None` when routed locally.
    peer_target: Option<String>,
    /// The Status body replacing an Envoy-generated reply, written once the body arrives.
    replacement_body: Option<String>,
}

impl Request {
    pub fn new(compiled: Rc<Compiled>, metrics: Rc<Metrics>) -> Self {
        Request {
            compiled,
            metrics,
            peer_target: None,
            replacement_body: None,
        }
    }

    /// Steps 1 and 4-8. Errors from the host are logged and the request fails closed with a
    /// 503 Status: a request we could not sanitise must not reach an apiserver.
    fn route_request(&mut self) -> Result<Handled, proxy_wasm::types::Status> {
        let headers = host::request_headers()?;

        // Step 1: strip every header a client must not control, before anything else.
        let forbidden = hygiene::forbidden_names(headers.iter().map(|(n, _)| n.as_str()));
        let mut route_header_removed = false;
        for name in &forbidden {
            host::remove_request_header(name)?;
            route_header_removed |= name.eq_ignore_ascii_case(UPSTREAM_CLUSTER);
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

        // Step 3: discovery from the merged documents.
        if let Some(discovery) = &self.compiled.discovery {
            let discovery_headers = DiscoveryHeaders {
                accept: raw("accept"),
                if_none_match: raw("if-none-match"),
                accept_encoding: raw("accept-encoding"),
            };
            let (answer, reason) = discovery.answer(&method, &path, discovery_headers);
            match (answer, reason) {
                (DiscoveryAnswer::Respond(response), _) => {
                    Metrics::inc(self.metrics.discovery_cache_hits);
                    send_discovery(&response)?;
                    return Ok(Handled::Answered);
                }
                (DiscoveryAnswer::Pass, PassReason::NoPeer) => {
                    Metrics::inc(self.metrics.discovery_nopeer)
                }
                (DiscoveryAnswer::Pass, PassReason::Local) => {
                    Metrics::inc(self.metrics.discovery_cache_misses)
                }
                (DiscoveryAnswer::Pass, PassReason::NotDiscovery) => {}
            }
        }

        // Steps 4-8.
        let (info, decision) = self.compiled.table.route(&method, &path);
        log::debug!("skewgate: {method} {path} -> {decision:?}");
        // Watches, exec, logs and the like stream without a timeout; everything else is
        // bounded, so a peer that accepts the connection but never answers yields a 503.
        let short = info.as_ref().is_some_and(|i| !i.is_long_running());
        if short {
            host::set_request_header(REQUEST_CLASS, SHORT_REQUEST)?;
        }
        match decision.upstream {
            Upstream::Local => {
                if route_header_removed || short {
                    host::clear_route_cache()?;
                }
            }
            Upstream::Peer { cluster } => {
                Metrics::inc(self.metrics.rerouted);
                host::set_request_header(UPSTREAM_CLUSTER, cluster)?;
                // The loop guard: the peer apiserver must serve this itself, never re-proxy.
                host::set_request_header(PEER_PROXIED, "true")?;
                host::clear_route_cache()?;
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
            }
        }
        Ok(Handled::Forwarded)
    }

    /// Step 9: give Envoy's own replies a Status body, and make an unreachable peer a 503.
    fn map_response(&mut self) -> Result<(), proxy_wasm::types::Status> {
        let code = host::response_header(":status")?
            .and_then(|v| std::str::from_utf8(&v).ok()?.parse::<u16>().ok())
            .unwrap_or(0);
        if code < 400 {
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
            self.replacement_body = Some(rewrite.body);
        }
        Ok(())
    }
}

/// Answer a discovery request with kube-apiserver's headers.
fn send_discovery(response: &Response<'_>) -> Result<(), proxy_wasm::types::Status> {
    let mut headers = vec![("content-type", response.content_type)];
    if let Some(etag) = response.etag {
        // Aggregated discovery is cacheable and varies by Accept (v2, v2beta1, legacy).
        headers.push(("etag", etag));
        headers.push(("vary", "Accept"));
        headers.push(("cache-control", "public"));
    }
    if response.gzip {
        headers.push(("content-encoding", "gzip"));
        headers.push(("vary", "Accept-Encoding"));
    }
    proxy_wasm::hostcalls::send_http_response(
        u32::from(response.status),
        headers,
        Some(response.body),
    )
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
                let _ = proxy_wasm::hostcalls::send_http_response(
                    503,
                    vec![("content-type", status::CONTENT_TYPE)],
                    Some(body.as_bytes()),
                );
                Action::Pause
            }
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if let Err(e) = self.map_response() {
            log::error!("skewgate: host call failed while mapping a reply: {e:?}");
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let Some(body) = &self.replacement_body else {
            return Action::Continue;
        };
        if !end_of_stream {
            // Buffer Envoy's text until it is complete, then replace it whole.
            return Action::Pause;
        }
        if let Err(e) = host::replace_response_body(body_size, body.as_bytes()) {
            log::error!("skewgate: replacing the reply body failed: {e:?}");
        }
        Action::Continue
    }
}
