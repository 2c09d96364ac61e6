//! One HTTP request through the filter (docs/ARCHITECTURE.md "Request path", steps 1-9), behind
//! the [`Host`] trait: a shell (the proxy-wasm filter) gives it Envoy's calls; the tests a
//! recording fake. It reads what [`crate::plan`] needs, hands it over, and applies what comes
//! back; it decides nothing itself.

mod counters;
mod host;
mod request;

pub use counters::Metrics;
pub use host::{Action, Bytes, HeaderBlock, Headers, Host, HostError, Level, RequestHeaders};
pub use request::{Configured, Request, Worker};
