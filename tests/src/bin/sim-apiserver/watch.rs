//! Watch responses: a chunked `application/json` stream of one JSON event per line.
//! Starts with synthetic ADDED events (no resourceVersion, `0`, or `sendInitialEvents=true`,
//! the latter closed by an `initial-events-end` BOOKMARK) or with the stored events after
//! the given resourceVersion (an `ERROR` event with a 410 `Expired` Status when the store no
//! longer reaches back that far), then follows the store live until `timeoutSeconds`, the
//! client going away, or server shutdown. With `allowWatchBookmarks=true` a BOOKMARK carrying
//! the latest resourceVersion known to be complete is sent every `--bookmark-interval`.
//! Each event is flushed as its own chunk.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::catalog::ResourceInfo;
use crate::selectors::Selector;
use crate::server::AppState;
use crate::status;
use crate::store::{Event, Gvr, Live, WatchFrom, WatchStart};
use crate::table::{self, TableOptions};

/// kube's default when a client gives no `timeoutSeconds` (`--min-request-timeout`).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

pub struct WatchRequest {
    pub state: Arc<AppState>,
    pub info: ResourceInfo,
    pub gvr: Gvr,
    pub namespace: Option<String>,
    pub selector: Selector,
    pub query: HashMap<String, String>,
    pub table: Option<TableOptions>,
}

/// Turns store events into watch event lines for one stream.
struct Encoder {
    table: Option<TableOptions>,
    sent_columns: bool,
}

impl Encoder {
    /// `{"type":...,"object":...}` and a newline, `type` first like kube writes it.
    fn line(&mut self, kind: &str, object: Value) -> Bytes {
        Bytes::from(format!(
            "{{\"type\":{},\"object\":{object}}}\n",
            json!(kind)
        ))
    }

    fn event(&mut self, ev: &Event) -> Bytes {
        let object = match self.table {
            Some(t) => {
                let rv = crate::store::object_rv(&ev.object).to_string();
                let with_columns = !self.sent_columns;
                self.sent_columns = true;
                table::table(std::slice::from_ref(&ev.object), &rv, t, with_columns)
            }
            None => ev.object.clone(),
        };
        self.line(ev.kind.as_str(), object)
    }
}

fn query_flag(q: &HashMap<String, String>, key: &str) -> bool {
    matches!(q.get(key).map(String::as_str), Some("true" | "1"))
}

pub async fn serve(req: WatchRequest) -> Response {
    let q = &req.query;
    let send_initial = query_flag(q, "sendInitialEvents");
    let from = match q.get("resourceVersion").map(String::as_str) {
        _ if send_initial => WatchFrom::Now,
        None | Some("") | Some("0") => WatchFrom::Now,
        Some(v) => match v.parse::<u64>() {
            Ok(n) => WatchFrom::After(n),
            Err(_) => {
                return status::respond(status::bad_request(&format!(
                    "resourceVersion: Invalid value: {v:?}: must be a number"
                )))
            }
        },
    };
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_TIMEOUT);
    let bookmarks = query_flag(q, "allowWatchBookmarks");
    let interval = req.state.bookmark_interval;
    let start = req
        .state
        .store
        .watch(&req.gvr, req.namespace.as_deref(), from, interval / 2)
        .await;
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let opts = PumpOptions {
        send_initial,
        timeout,
        bookmarks: bookmarks.then_some(interval),
    };
    tokio::spawn(pump(req, start, opts, tx));
    let body = Body::from_stream(ReceiverStream::new(rx).map(Ok::<_, Infallible>));
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

struct PumpOptions {
    send_initial: bool,
    timeout: Duration,
    /// `allowWatchBookmarks=true`: how often to send one.
    bookmarks: Option<Duration>,
}

fn bookmark(info: &ResourceInfo, rv: u64, initial_end: bool) -> Value {
    let mut md = json!({ "resourceVersion": rv.to_string() });
    if initial_end {
        md["annotations"] = json!({ "k8s.io/initial-events-end": "true" });
    }
    json!({
        "kind": info.kind,
        "apiVersion": info.api_version(),
        "metadata": md,
    })
}

async fn pump(req: WatchRequest, start: WatchStart, opts: PumpOptions, tx: mpsc::Sender<Bytes>) {
    let mut enc = Encoder {
        table: req.table,
        sent_columns: false,
    };
    let (initial, mut live, start_rv) = match start {
        WatchStart::Started { initial, live, rv } => (initial, live, rv),
        WatchStart::TooOld { requested, oldest } => {
            let msg = format!("too old resource version: {requested} ({oldest})");
            let _ = tx.send(enc.line("ERROR", status::expired(&msg))).await;
            return;
        }
        WatchStart::Failed(msg) => {
            eprintln!("sim-apiserver[{}] watch failed: {msg}", req.state.id);
            let s = status::failure(500, "InternalError", &msg, None);
            let _ = tx.send(enc.line("ERROR", s)).await;
            return;
        }
    };
    let wanted = |ev: &Event| {
        ev.key.gvr == req.gvr
            && req
                .namespace
                .as_deref()
                .is_none_or(|ns| ev.key.namespace == ns)
            && req.selector.matches(&ev.object)
    };
    for ev in initial.iter().filter(|e| wanted(e)) {
        if tx.send(enc.event(ev)).await.is_err() {
            return;
        }
    }
    if opts.send_initial {
        let line = enc.line("BOOKMARK", bookmark(&req.info, start_rv, true));
        if tx.send(line).await.is_err() {
            return;
        }
    }
    // Everything up to here has been delivered: the resourceVersion for the next bookmark.
    let mut progress = start_rv;
    let mut shutdown = req.state.shutdown.clone();
    let deadline = tokio::time::sleep(opts.timeout);
    tokio::pin!(deadline);
    let period = opts.bookmarks.unwrap_or(Duration::from_secs(3600));
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    loop {
        tokio::select! {
            _ = &mut deadline => break,
            _ = shutdown.changed() => break,
            _ = tx.closed() => break,
            _ = ticks.tick(), if opts.bookmarks.is_some() => {
                if tx.send(enc.line("BOOKMARK", bookmark(&req.info, progress, false))).await.is_err() {
                    break;
                }
            }
            item = live.recv() => match item {
                Some(Live::Event(ev)) => {
                    progress = progress.max(ev.rv);
                    if wanted(&ev) && tx.send(enc.event(&ev)).await.is_err() {
                        break;
                    }
                }
                Some(Live::Progress(rv)) => progress = progress.max(rv),
                Some(Live::Expired(msg)) => {
                    let _ = tx.send(enc.line("ERROR", status::expired(&msg))).await;
                    break;
                }
                Some(Live::Failed(msg)) => {
                    // The client sees the stream end and watches again from its last version.
                    eprintln!("sim-apiserver[{}] watch ended: {msg}", req.state.id);
                    break;
                }
                None => break,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_line_format() {
        let mut enc = Encoder {
            table: None,
            sent_columns: false,
        };
        let line = enc.line("ADDED", json!({"kind": "X"}));
        assert_eq!(
            &line[..],
            b"{\"type\":\"ADDED\",\"object\":{\"kind\":\"X\"}}\n"
        );
    }
}
