//! The request: reads what the core needs, hands it to [`plan::plan_request`] and
//! [`ResponsePlan::decide`], and applies what they return through the [`Host`] trait. It
//! decides nothing, and is generic over the host so its tests run natively against a fake.

use std::borrow::Cow;
use std::cell::Cell;
use std::fmt;
use std::rc::Rc;
use std::sync::Arc;

use super::counters::Metrics;
use super::host::{Action, Headers, Host, HostError, Level, RequestHeaders};
use crate::client_cert;
use crate::log_limit::LogLimit;
use crate::metrics::Counter;
use crate::openapi;
use crate::plan::{
    self, CompiledConfig, HeaderOp, LocalReply, ReplaceCause, ReplacementBody, RequestPlan,
    ResponseDecision, ResponsePlan, Route, ServedBy,
};

/// One accepted configuration as every request of a worker VM shares it: compiled, and the
/// ids of the counters defined for its label values (a request counts with the configuration
/// it was planned with, so an id never names another configuration's label).
#[derive(Debug)]
pub struct Configured {
    /// Shared by every worker's `Configured` where the host has threads (the native shell).
    pub compiled: Arc<CompiledConfig>,
    pub metrics: Metrics,
}

impl Configured {
    pub fn new(compiled: impl Into<Arc<CompiledConfig>>) -> Self {
        Configured {
            compiled: compiled.into(),
            metrics: Metrics::default(),
        }
    }
}

/// What every request of one worker VM shares besides the configuration.
#[derive(Debug, Default)]
pub struct Worker {
    /// The info line for each reply of Envoy's we map: at most one per window.
    pub reply_log: Cell<LogLimit>,
    /// The info line for each request we answer 503 because no live apiserver is known to
    /// serve it now (retained, or a peer's discovery pending): at most one per window.
    pub unavailable_log: Cell<LogLimit>,
    /// The info line for each apiserver's 404 for a path it has no route for that we answer 503
    /// (our view of it is out of date): at most one per window.
    pub not_served_log: Cell<LogLimit>,
}

impl Worker {
    pub fn new() -> Self {
        Worker {
            reply_log: Cell::default(),
            unavailable_log: Cell::default(),
            not_served_log: Cell::default(),
        }
    }
}

pub struct Request<H> {
    host: H,
    config: Rc<Configured>,
    worker: Rc<Worker>,
    /// What the response phase needs, from the request plan.
    response: ResponsePlan,
    replacement: Option<ReplacementBody>,
    /// The replacement body went out with the first chunk.
    replacement_sent: bool,
    /// The local `/openapi/v3` answer is being buffered to add the peer-only entries to.
    openapi_root: bool,
    /// A JSON 404 is being buffered, its headers held, to see whether it is kube's generic
    /// NotFound ([`ResponseDecision::ReadNotFound`]).
    not_found_body: bool,
}

impl<H: Host> Request<H> {
    pub fn new(host: H, config: Rc<Configured>, worker: Rc<Worker>) -> Self {
        Request {
            host,
            config,
            worker,
            response: ResponsePlan::default(),
            replacement: None,
            replacement_sent: false,
            openapi_root: false,
            not_found_body: false,
        }
    }

    /// The host, for a shell that keeps per-stream state in it.
    pub fn host(&self) -> &H {
        &self.host
    }

    pub fn host_mut(&mut self) -> &mut H {
        &mut self.host
    }

    /// Steps 1-8. A host call that fails makes the request fail closed with a 503 Status: a
    /// request we could not sanitise must not reach an apiserver.
    pub fn on_request_headers(&mut self) -> Action {
        match self.route_request() {
            Ok(action) => action,
            Err(e) => {
                self.host.log(
                    Level::Error,
                    format_args!("skewgate: host call failed while routing: {e:?}"),
                );
                // If even this fails there is nothing left to do but stop the request.
                let _ = send_local(&mut self.host, &LocalReply::host_failure());
                Action::Pause
            }
        }
    }

    fn route_request(&mut self) -> Result<Action, HostError> {
        let held = self.host.request_headers()?;
        let headers = held.pairs();
        // The verified client certificate's subject, set by Envoy in a header it never lets a
        // client's copy through (docs/ARCHITECTURE.md, "Step 2"): no property call.
        let subject = match client_cert::subject(&headers) {
            Ok(subject) => subject,
            Err(e) => {
                self.host.log(
                    Level::Error,
                    format_args!("skewgate: reading the client certificate failed: {e}"),
                );
                send_local(&mut self.host, &LocalReply::host_failure())?;
                return Ok(Action::Pause);
            }
        };
        let forward = match plan::plan_request(&headers, subject, &self.config.compiled) {
            RequestPlan::Forward(forward) => forward,
            RequestPlan::RefuseCertificate {
                subject,
                error,
                reply,
            } => {
                self.host.log(
                    Level::Info,
                    format_args!("skewgate: refusing client certificate {subject:?}: {error}"),
                );
                send_local(&mut self.host, &reply)?;
                return Ok(Action::Pause);
            }
            RequestPlan::Unavailable {
                method,
                path,
                cause,
                reply,
                counter,
            } => {
                count(&mut self.host, &self.config, counter);
                log_limited(
                    &mut self.host,
                    &self.worker.unavailable_log,
                    format_args!(
                        "skewgate: answering {method} {:?} with 503 ({cause:?})",
                        clip(&path)
                    ),
                );
                send_local(&mut self.host, &reply)?;
                return Ok(Action::Pause);
            }
        };
        if !forward.strip.is_empty() {
            self.host.log(
                Level::Debug,
                format_args!("skewgate: removed client headers {:?}", forward.strip),
            );
        }
        if let Route::Table(decision) = &forward.route {
            self.host.log(
                Level::Debug,
                format_args!(
                    "skewgate: {} {} -> {decision:?}",
                    forward.method, forward.path
                ),
            );
        }
        for counter in &forward.counters {
            count(&mut self.host, &self.config, *counter);
        }
        apply(&mut self.host, Headers::Request, &forward.header_ops())?;
        self.host.clear_route_cache()?;
        self.response = forward.response;
        Ok(Action::Continue)
    }

    /// Step 9, and the merged discovery answer. Pauses only to read a JSON 404's body, its
    /// headers held until it is read.
    pub fn on_response_headers(&mut self, end_of_stream: bool) -> Action {
        if let Err(e) = self.map_response() {
            self.host.log(
                Level::Error,
                format_args!("skewgate: host call failed while mapping a reply: {e:?}"),
            );
        }
        if end_of_stream {
            // No body follows (HEAD): nothing to replace, add to or read.
            self.replacement = None;
            self.openapi_root = false;
            self.not_found_body = false;
        }
        if self.not_found_body {
            Action::Pause
        } else {
            Action::Continue
        }
    }

    fn map_response(&mut self) -> Result<(), HostError> {
        let status = self.host.response_header(":status")?;
        let code = plan::status_code(status.as_deref());
        let details = if self.response.needs_details(code) {
            self.host.property(&["response", "code_details"])?
        } else {
            None
        };
        let details = details
            .as_deref()
            .map_or(Cow::Borrowed(""), String::from_utf8_lossy);
        // Only for a 404 of a request routed to an apiserver that serves it.
        let content_type = if self.response.needs_content_type(code, &details) {
            self.host.response_header("content-type")?
        } else {
            None
        };
        let config = self.config.clone();
        let decision =
            self.response
                .decide(&config.compiled, code, &details, content_type.as_deref());
        self.apply(decision, code, &details)
    }

    /// Carry out a response decision: counters, log lines, header changes, and the body to
    /// send in place of the apiserver's.
    fn apply(
        &mut self,
        decision: ResponseDecision<'_>,
        code: u16,
        details: &str,
    ) -> Result<(), HostError> {
        let replacement = match decision {
            ResponseDecision::ReadNotFound if self.host.holds_response_headers() => {
                self.not_found_body = true;
                return Ok(());
            }
            ResponseDecision::Pass | ResponseDecision::ReadNotFound => {
                if let Some(counter) = self.response.rerouted(&self.config.compiled, code) {
                    count(&mut self.host, &self.config, counter);
                }
                return Ok(());
            }
            ResponseDecision::Rewrite(headers) => {
                if let Some(counter) = self.response.rerouted(&self.config.compiled, code) {
                    count(&mut self.host, &self.config, counter);
                }
                apply(&mut self.host, Headers::Response, &headers)?;
                return Ok(());
            }
            ResponseDecision::Replace(replacement) => replacement,
            ResponseDecision::AddOpenApiEntries(headers) => {
                apply(&mut self.host, Headers::Response, &headers)?;
                self.openapi_root = true;
                return Ok(());
            }
        };
        // A merged document kept in shared data is copied in now, while the headers can
        // still become a 503 if it is gone.
        let replacement =
            match replacement.fetch_stored(&self.config.compiled, self.host.shared_data()) {
                Ok(replacement) => replacement,
                Err((replacement, e)) => {
                    self.host.log(
                        Level::Error,
                        format_args!("skewgate: merged discovery document: {e}"),
                    );
                    replacement
                }
            };
        // A retained 503 for departed apiservers none of which was reached is no rerouted request.
        let reached = !matches!(replacement.cause, ReplaceCause::DepartedUnreachable { .. });
        if let Some(counter) = self
            .response
            .rerouted(&self.config.compiled, replacement.status)
            .filter(|_| reached)
        {
            count(&mut self.host, &self.config, counter);
        }
        if let Some(counter) = replacement.counter {
            count(&mut self.host, &self.config, counter);
        }
        match replacement.cause {
            ReplaceCause::EnvoyReply { envoy_code, code } => log_limited(
                &mut self.host,
                &self.worker.reply_log,
                format_args!(
                    "skewgate: Envoy replied {envoy_code} ({details}); answering {code} with a Status"
                ),
            ),
            ReplaceCause::NotServed { by } => {
                let by = match by {
                    ServedBy::Local => "the local apiserver",
                    ServedBy::Peer => "a peer apiserver",
                    ServedBy::Departed => "a departed apiserver back at its address",
                    ServedBy::Unknown => "the local apiserver (fallback configuration)",
                };
                let target = self.response.served.as_ref().map(|s| &s.target);
                log_limited(
                    &mut self.host,
                    &self.worker.not_served_log,
                    format_args!(
                        "skewgate: {by} answered that it has no route for {}, which the routing \
                         table says it serves (restarted?); answering 503",
                        DisplayOr(target)
                    ),
                );
            }
            // Counted (`skewgate_retained_unavailable_total`), as the filter's own retained 503.
            ReplaceCause::MergedDiscovery | ReplaceCause::DepartedUnreachable { .. } => {}
        }
        apply(&mut self.host, Headers::Response, &replacement.headers)?;
        self.replacement = Some(replacement.body);
        Ok(())
    }

    /// Whether [`Request::on_response_body`] does anything with the body: a replacement to
    /// send, or the local `/openapi/v3` answer to complete. A shell whose host must measure
    /// the body first can skip that for every other response.
    pub fn wants_response_body(&self) -> bool {
        self.openapi_root || self.not_found_body || self.replacement.is_some()
    }

    /// The replacement goes out in place of the first chunk, and every later chunk of the
    /// original is dropped. Nothing is buffered: buffering a document larger than Envoy's
    /// buffer limit (1 MiB by default; merged discovery may be 12 MiB) makes Envoy reset the
    /// stream from inside the host call, which re-enters the VM and takes Envoy down.
    pub fn on_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.openapi_root {
            return self.add_openapi_entries(body_size, end_of_stream);
        }
        if self.not_found_body {
            match self.read_not_found(body_size, end_of_stream) {
                Action::Pause => return Action::Pause,
                // Replaced (the body goes out below) or passed as it came.
                Action::Continue => {}
            }
        }
        let Some(replacement) = &self.replacement else {
            return Action::Continue;
        };
        let body = if self.replacement_sent {
            &[][..]
        } else {
            replacement.bytes(&self.config.compiled)
        };
        if let Err(e) = self.host.replace_response_body(body_size, body) {
            self.host.log(
                Level::Error,
                format_args!("skewgate: replacing the response body failed: {e:?}"),
            );
        }
        self.replacement_sent = true;
        // A document copied out of shared data is not needed once sent: free it now rather
        // than when the stream ends (later chunks send nothing).
        if let Some(ReplacementBody::Fetched(bytes)) = &mut self.replacement {
            *bytes = Vec::new();
        }
        Action::Continue
    }
}

impl<H: Host> Request<H> {
    /// A JSON 404 held at its headers: buffered until complete (at most
    /// [`local_reply::MAX_NOT_FOUND_BODY`](crate::local_reply::MAX_NOT_FOUND_BODY): past it
    /// the answer passes unread), then decided on its body. The held headers are changed now
    /// if it becomes a 503.
    fn read_not_found(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let too_large = body_size > crate::local_reply::MAX_NOT_FOUND_BODY;
        if !end_of_stream && !too_large {
            return Action::Pause;
        }
        self.not_found_body = false;
        let body = if too_large {
            None
        } else {
            match self.host.response_body(body_size) {
                Ok(body) => Some(body.unwrap_or_default()),
                Err(e) => {
                    self.host.log(
                        Level::Error,
                        format_args!("skewgate: reading a 404's body failed: {e:?}"),
                    );
                    None
                }
            }
        };
        let config = self.config.clone();
        let decision = self
            .response
            .decide_not_found_body(&config.compiled, body.as_deref());
        if let Err(e) = self.apply(decision, 404, crate::local_reply::VIA_UPSTREAM) {
            self.host.log(
                Level::Error,
                format_args!("skewgate: host call failed while mapping a 404: {e:?}"),
            );
        }
        Action::Continue
    }

    /// The other body the filter buffers: the local `/openapi/v3` answer (a few KiB), held until
    /// it is complete, then sent with the peer-only entries added, at most
    /// [`openapi::MAX_UNION_BYTES`]. Past [`openapi::MAX_ROOT_BYTES`] it is released
    /// unchanged, long before Envoy's buffer limit; an answer that is not a root stands too
    /// (docs/ARCHITECTURE.md "OpenAPI v3").
    fn add_openapi_entries(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if body_size > openapi::MAX_ROOT_BYTES {
            self.openapi_root = false;
            self.host.log(
                Level::Warn,
                format_args!(
                    "skewgate: the local /openapi/v3 answer exceeds {} bytes; passing it without \
                     the peer-only entries",
                    openapi::MAX_ROOT_BYTES
                ),
            );
            return Action::Continue;
        }
        if !end_of_stream {
            return Action::Pause;
        }
        self.openapi_root = false;
        let local = match self.host.response_body(body_size) {
            Ok(body) => body.unwrap_or_default(),
            Err(e) => {
                self.host.log(
                    Level::Error,
                    format_args!("skewgate: reading the local /openapi/v3 answer failed: {e:?}"),
                );
                return Action::Continue;
            }
        };
        match openapi::union_root(&local, &self.config.compiled.openapi) {
            Ok(union) => {
                if union.left_out > 0 {
                    self.host.log(
                        Level::Warn,
                        format_args!(
                            "skewgate: {} peer-only OpenAPI entries left out of /openapi/v3 to \
                             keep it under {} bytes",
                            union.left_out,
                            openapi::MAX_UNION_BYTES
                        ),
                    );
                }
                if let Err(e) = self.host.replace_response_body(body_size, &union.body) {
                    self.host.log(
                        Level::Error,
                        format_args!("skewgate: replacing the /openapi/v3 answer failed: {e:?}"),
                    );
                }
            }
            Err(e) => self.host.log(
                Level::Info,
                format_args!("skewgate: {e}; the local answer stands"),
            ),
        }
        Action::Continue
    }
}

/// One info line per window and worker for each kind of line (`limit`): a long peer outage
/// maps every peer-bound request, a retained resource answers every request for it, and
/// neither must flood Envoy's log.
fn log_limited<H: Host>(host: &mut H, limit: &Cell<LogLimit>, line: fmt::Arguments<'_>) {
    let admitted = match host.now() {
        Ok(now) => {
            let mut state = limit.get();
            let admitted = state.admit(now);
            limit.set(state);
            admitted
        }
        // Without a clock, write it: better a busy log than a silent one.
        Err(_) => Some(0),
    };
    match admitted {
        None => {}
        Some(0) => host.log(Level::Info, line),
        Some(left_out) => host.log(
            Level::Info,
            format_args!("{line} ({left_out} more such replies since the last line not logged)"),
        ),
    }
}

/// At most [`LOGGED_PATH`] bytes of a client's path, cut at a character boundary: a log line
/// stays a line.
fn clip(path: &str) -> &str {
    let mut end = path.len().min(LOGGED_PATH);
    while !path.is_char_boundary(end) {
        end = end.saturating_sub(1);
    }
    path.get(..end).unwrap_or_default()
}

const LOGGED_PATH: usize = 512;

/// A value's text, or `?` without one.
struct DisplayOr<T>(Option<T>);

impl<T: fmt::Display> fmt::Display for DisplayOr<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(value) => value.fmt(f),
            None => f.write_str("?"),
        }
    }
}

fn apply<H: Host>(host: &mut H, map: Headers, ops: &[HeaderOp<'_>]) -> Result<(), HostError> {
    for op in ops {
        match op {
            HeaderOp::Remove(name) => host.set_header(map, name, None)?,
            HeaderOp::Set(name, value) => host.set_header(map, name, Some(value))?,
            HeaderOp::Add(name, value) => host.add_header(map, name, value)?,
        }
    }
    Ok(())
}

fn count<H: Host>(host: &mut H, config: &Configured, counter: Counter) {
    config.metrics.count(host, &config.compiled.labels, counter);
}

fn send_local<H: Host>(host: &mut H, reply: &LocalReply) -> Result<(), HostError> {
    host.send_response(
        u32::from(reply.code),
        &reply.headers(),
        reply.body.as_bytes(),
    )
}

// The request's tests reach into it (its host, its private helpers): a child module.
#[cfg(all(test, not(target_arch = "wasm32")))]
#[path = "tests.rs"]
mod tests;
