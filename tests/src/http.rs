//! HTTP helpers: a client with a timeout, GETs on a local channel (Envoy's admin interface on
//! its Unix socket or loopback TCP), response headers, and watch event streams.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use skewgate_control::local_channels::LocalChannel;

/// The tests' HTTP client: a bound on every answer (20 s), so "within a bounded time" holds
/// for the 503 cases and a hung request fails its test instead of hanging it.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap_or_default()
}

/// A GET on a local channel: (status, body). Over a Unix socket: one HTTP/1.1 connection.
pub async fn local_get(channel: &LocalChannel, path: &str) -> Result<(u16, String)> {
    let path_and_query = path.to_string();
    match channel {
        LocalChannel::Tcp(address) => {
            let resp = client()
                .get(format!("http://{address}{path_and_query}"))
                .send()
                .await?;
            Ok((resp.status().as_u16(), resp.text().await?))
        }
        LocalChannel::Unix(socket) => {
            tokio::time::timeout(Duration::from_secs(10), unix_get(socket, &path_and_query))
                .await
                .with_context(|| format!("GET {path} on {channel}: no answer within 10s"))?
        }
    }
}

async fn unix_get(socket: &std::path::Path, path: &str) -> Result<(u16, String)> {
    use http_body_util::BodyExt;
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .with_context(|| format!("connecting to {}", socket.display()))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, "localhost")
        .body(http_body_util::Empty::<hyper::body::Bytes>::new())?;
    let response = sender.send_request(request).await?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
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
