//! A client for Envoy's admin interface, on its Unix socket or on loopback TCP (the local
//! channels, `crate::local_channels`): the control plane reads the filter's counters from it so
//! that one scrape of its `/metrics` carries the data plane's metrics too, and `drain-envoy`
//! drives Envoy's shutdown through it (`super::drain`; Envoy takes its mutations only as POST).

use std::time::Duration;

use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::local_channels::LocalChannel;

/// Why a request to the admin interface failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("connecting to Envoy admin at {address}: {source}")]
    Connect {
        address: String,
        source: std::io::Error,
    },
    #[error("Envoy admin at {address}: {message}")]
    Http { address: String, message: String },
    #[error("Envoy admin at {address} answered {status}")]
    Status { address: String, status: u16 },
    #[error("Envoy admin at {address} did not answer within {0:?}", TIMEOUT)]
    Timeout { address: String },
}

/// The most of a body we read: the filter's counters are a few KB, bounded by the routing
/// table's resources.
const MAX_BODY: usize = 8 << 20;
const TIMEOUT: Duration = Duration::from_secs(3);

/// The Prometheus text of the filter's counters (`wasmcustom.` stats; Envoy strips the prefix
/// and turns the labels in their names into labels, the bootstrap's `stats_tags`, `crate::envoy::bootstrap`).
pub const FILTER_STATS: &str = "/stats/prometheus?filter=%5Ewasmcustom%5C.";

/// GET `path_and_query` on Envoy's admin interface at `admin`: the body of a 200.
pub async fn get(admin: &LocalChannel, path_and_query: &str) -> Result<String, AdminError> {
    call(admin, hyper::Method::GET, path_and_query).await
}

/// POST `path_and_query` (no body) on Envoy's admin interface at `admin`: the body of a 200.
pub async fn post(admin: &LocalChannel, path_and_query: &str) -> Result<String, AdminError> {
    call(admin, hyper::Method::POST, path_and_query).await
}

async fn call(
    admin: &LocalChannel,
    method: hyper::Method,
    path_and_query: &str,
) -> Result<String, AdminError> {
    let address = admin.to_string();
    match tokio::time::timeout(TIMEOUT, connect(admin, method, path_and_query, &address)).await {
        Ok(result) => result,
        Err(_) => Err(AdminError::Timeout { address }),
    }
}

async fn connect(
    admin: &LocalChannel,
    method: hyper::Method,
    path_and_query: &str,
    address: &str,
) -> Result<String, AdminError> {
    let connect = |source| AdminError::Connect {
        address: address.to_string(),
        source,
    };
    match admin {
        LocalChannel::Unix(path) => {
            let stream = tokio::net::UnixStream::connect(path)
                .await
                .map_err(connect)?;
            request(stream, method, path_and_query, address).await
        }
        LocalChannel::Tcp(socket) => {
            let stream = tokio::net::TcpStream::connect(socket)
                .await
                .map_err(connect)?;
            request(stream, method, path_and_query, address).await
        }
    }
}

async fn request<S>(
    stream: S,
    method: hyper::Method,
    path_and_query: &str,
    address: &str,
) -> Result<String, AdminError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let http = |message: String| AdminError::Http {
        address: address.to_string(),
        message,
    };
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| http(e.to_string()))?;
    let driver = tokio::spawn(connection);
    let request = Request::builder()
        .method(method)
        .uri(path_and_query)
        .header(hyper::header::HOST, "envoy-admin")
        .body(http_body_util::Empty::<hyper::body::Bytes>::new())
        .map_err(|e| http(e.to_string()))?;
    let response: hyper::Response<Incoming> = sender
        .send_request(request)
        .await
        .map_err(|e| http(e.to_string()))?;
    let status = response.status().as_u16();
    let body = Limited::new(response.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| http(e.to_string()))?
        .to_bytes();
    driver.abort();
    if status != 200 {
        return Err(AdminError::Status {
            address: address.to_string(),
            status,
        });
    }
    String::from_utf8(body.to_vec()).map_err(|e| http(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A one-shot HTTP server on `listener`: the request line it got.
    async fn answer<L, S>(accept: L, body: &'static str) -> String
    where
        L: std::future::Future<Output = std::io::Result<S>>,
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let mut stream = accept.await.expect("accept");
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stream.read(&mut buf).await.expect("read");
            head.extend_from_slice(buf.get(..n).expect("n"));
        }
        let reply = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(reply.as_bytes()).await.expect("write");
        String::from_utf8_lossy(&head)
            .lines()
            .next()
            .unwrap_or_default()
            .to_string()
    }

    #[tokio::test]
    async fn gets_and_posts_over_tcp_and_unix_sockets() {
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin = LocalChannel::Tcp(tcp.local_addr().unwrap());
        let server = tokio::spawn(async move {
            answer(async { tcp.accept().await.map(|(s, _)| s) }, "a 1\n").await
        });
        assert_eq!(get(&admin, FILTER_STATS).await.unwrap(), "a 1\n");
        assert_eq!(
            server.await.unwrap(),
            format!("GET {FILTER_STATS} HTTP/1.1")
        );

        let dir = tempfile_dir();
        let path = dir.join("admin.sock");
        let unix = tokio::net::UnixListener::bind(&path).unwrap();
        let admin = LocalChannel::Unix(path.clone());
        let server = tokio::spawn(async move {
            answer(async { unix.accept().await.map(|(s, _)| s) }, "b 2\n").await
        });
        assert_eq!(get(&admin, "/ready").await.unwrap(), "b 2\n");
        assert_eq!(server.await.unwrap(), "GET /ready HTTP/1.1");
        let unix = tokio::net::UnixListener::bind(path.with_extension("2")).unwrap();
        let posted = LocalChannel::Unix(path.with_extension("2"));
        let server = tokio::spawn(async move {
            answer(async { unix.accept().await.map(|(s, _)| s) }, "OK\n").await
        });
        assert_eq!(post(&posted, "/healthcheck/fail").await.unwrap(), "OK\n");
        assert_eq!(server.await.unwrap(), "POST /healthcheck/fail HTTP/1.1");
        let _ = std::fs::remove_dir_all(&dir);

        // Nobody listening: a typed error naming the address.
        let gone = LocalChannel::Unix(path);
        let err = get(&gone, "/ready").await.unwrap_err();
        assert!(matches!(err, AdminError::Connect { .. }), "{err}");
        assert!(err.to_string().contains("unix:"), "{err}");
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("skewgate-admin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
