//! The accept loop: plain HTTP or TLS, HTTP/1.1 (with upgrades) and HTTP/2 on the same port
//! (ALPN over TLS, prior knowledge in plain text), each request carrying the [`ConnInfo`] of
//! its connection. A handler can ask for its connection to be closed gracefully (GOAWAY on
//! HTTP/2) through `ConnInfo::close`, or dropped at once through `ConnInfo::abort`. On shutdown it stops accepting and lets open connections
//! finish.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rustls::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Notify};
use tower_service::Service;

use crate::tls::ConnInfo;

/// How long a client may take to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<ServerConfig>>,
    app: axum::Router,
    shutdown: impl Future<Output = ()>,
    label: String,
) {
    // As `axum::serve` configures it (no header-read timer: idle keep-alive connections of
    // Envoy's pools stay open).
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http2().enable_connect_protocol();
    let builder = Arc::new(builder);
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    // Connections drain on `stop`; `open` closes when the last connection task is gone.
    let (stop_tx, stop) = watch::channel(false);
    let (open, mut all_closed) = mpsc::channel::<()>(1);
    let next_id = AtomicU64::new(1);
    tokio::pin!(shutdown);
    loop {
        let (tcp, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    eprintln!("{label} accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = tcp.set_nodelay(true);
        let conn = Conn {
            builder: builder.clone(),
            app: app.clone(),
            stop: stop.clone(),
            _open: open.clone(),
            info: ConnInfo {
                id: next_id.fetch_add(1, Ordering::Relaxed),
                close: Some(Arc::new(Notify::new())),
                abort: Some(Arc::new(Notify::new())),
                ..ConnInfo::default()
            },
        };
        let (acceptor, label) = (acceptor.clone(), label.clone());
        tokio::spawn(async move {
            let Some(acceptor) = acceptor else {
                return conn.serve(tcp).await;
            };
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => return eprintln!("{label} TLS handshake from {remote}: {e}"),
                Err(_) => return eprintln!("{label} TLS handshake from {remote} timed out"),
            };
            let tls = stream.get_ref().1;
            let info = ConnInfo {
                tls: true,
                alpn: tls
                    .alpn_protocol()
                    .map(|p| String::from_utf8_lossy(p).into_owned()),
                peer_certs: tls
                    .peer_certificates()
                    .filter(|c| !c.is_empty())
                    .map(|c| c.iter().map(|c| c.clone().into_owned()).collect()),
                ..conn.info.clone()
            };
            Conn { info, ..conn }.serve(stream).await
        });
    }
    // Let in-flight requests finish; watches end through the shutdown channel, and main
    // exits the process after a few seconds whatever is still open.
    let _ = stop_tx.send(true);
    drop(open);
    let _ = all_closed.recv().await;
}

/// One accepted connection and what serving it needs.
struct Conn {
    builder: Arc<auto::Builder<TokioExecutor>>,
    app: axum::Router,
    stop: watch::Receiver<bool>,
    /// Held until the connection is done (see `all_closed`).
    _open: mpsc::Sender<()>,
    info: ConnInfo,
}

impl Conn {
    async fn serve<S>(mut self, io: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let close = self.info.close.clone().unwrap_or_default();
        let abort = self.info.abort.clone().unwrap_or_default();
        let (info, app) = (self.info.clone(), self.app.clone());
        let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
            req.extensions_mut().insert(info.clone());
            let mut app = app.clone();
            async move { app.call(req).await }
        });
        let conn = self
            .builder
            .serve_connection_with_upgrades(TokioIo::new(io), service);
        tokio::pin!(conn);
        let mut draining = false;
        loop {
            tokio::select! {
                // Clients that hang up mid-request are no news.
                _ = conn.as_mut() => break,
                // Dropped: the socket closes with nothing answered (a reset, to the client).
                _ = abort.notified() => break,
                _ = close.notified(), if !draining => {
                    conn.as_mut().graceful_shutdown();
                    draining = true;
                }
                _ = self.stop.wait_for(|stop| *stop), if !draining => {
                    conn.as_mut().graceful_shutdown();
                    draining = true;
                }
            }
        }
    }
}
