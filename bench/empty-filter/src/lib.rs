//! An HTTP filter that does nothing: every callback is the SDK's default (continue, no host
//! call). What Envoy spends on it is what any Rust proxy-wasm filter costs per request.
#![forbid(unsafe_code)]

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;

struct Root;
struct Request;

impl Context for Root {}
impl RootContext for Root {
    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Request))
    }
    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

impl Context for Request {}
impl HttpContext for Request {}

proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root) });
}}
