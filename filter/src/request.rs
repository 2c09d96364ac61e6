//! Envoy's HTTP callbacks to the core's request pipeline (`skewgate_core::pipeline::Request`),
//! with the proxy-wasm host.

use proxy_wasm::traits::{Context, HttpContext};
use skewgate_core::pipeline::{Action, Request};

use crate::host::ProxyHost;

/// One HTTP request of a worker VM.
pub struct HttpRequest(pub Request<ProxyHost>);

fn action(action: Action) -> proxy_wasm::types::Action {
    match action {
        Action::Continue => proxy_wasm::types::Action::Continue,
        Action::Pause => proxy_wasm::types::Action::Pause,
    }
}

impl Context for HttpRequest {}

impl HttpContext for HttpRequest {
    fn on_http_request_headers(
        &mut self,
        _num_headers: usize,
        _end_of_stream: bool,
    ) -> proxy_wasm::types::Action {
        action(self.0.on_request_headers())
    }

    fn on_http_response_headers(
        &mut self,
        _num_headers: usize,
        end_of_stream: bool,
    ) -> proxy_wasm::types::Action {
        action(self.0.on_response_headers(end_of_stream))
    }

    fn on_http_response_body(
        &mut self,
        body_size: usize,
        end_of_stream: bool,
    ) -> proxy_wasm::types::Action {
        action(self.0.on_response_body(body_size, end_of_stream))
    }
}
