//! HTTP helpers: a client with a timeout, response headers, and watch event streams.

use std::time::Duration;

use anyhow::{bail, Result};

/// A client with a 10 s timeout.
pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("a client")
}

/// A response header as text (empty when absent).
pub fn header(resp: &reqwest::Response, name: &str) -> String {
    resp.headers()
        .get(name)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default()
}

/// Read a watch's event lines until `pred` matches one (or `timeout` passes); returns it and
/// the events before it.
pub async fn watch_until(
    resp: reqwest::Response,
    timeout: Duration,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> Result<(serde_json::Value, Vec<serde_json::Value>)> {
    use futures_util::StreamExt;
    let mut stream = resp.bytes_stream();
    let mut buf = Vec::new();
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        while let Some(i) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=i).collect();
            let v: serde_json::Value = serde_json::from_slice(&line)?;
            if pred(&v) {
                return Ok((v, seen));
            }
            seen.push(v);
        }
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(Some(chunk)) => buf.extend_from_slice(&chunk?),
            Ok(None) => bail!("watch ended; saw {seen:?}"),
            Err(_) => bail!("no matching watch event; saw {seen:?}"),
        }
    }
}
