//! Raw HTTP/1.1 upgrades (exec/attach/port-forward: WebSocket and SPDY/3.1) over TCP or TLS, for
//! the simulated apiservers' echo streams (`identity <user> <groups...>\n`, then an echo).

use std::time::Duration;

use anyhow::{bail, Context, Result};
use skewgate_control::envoy::Address;

use crate::pki::{CertFiles, TestPki};

/// TLS for [`upgrade_request`]: trust `ca_pem`, verify the server as `server_name`, present
/// `identity` if given. ALPN offers only `http/1.1` (upgrades need it).
#[derive(Clone, Debug)]
pub struct RawTls {
    pub ca_pem: String,
    pub server_name: String,
    pub identity: Option<CertFiles>,
}

impl TestPki {
    /// [`RawTls`] trusting the cluster CA, as `kubernetes.default.svc`.
    pub fn raw_tls(&self, identity: Option<&CertFiles>) -> RawTls {
        RawTls {
            ca_pem: self.cluster_ca.cert_pem.clone(),
            server_name: skewgate_control::envoy::APISERVER_TLS_NAME.to_string(),
            identity: identity.cloned(),
        }
    }
}

/// Which upgrade to ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpgradeKind {
    /// `Upgrade: websocket`, offering these `Sec-WebSocket-Protocol`s (e.g. `v5.channel.k8s.io`).
    WebSocket(Vec<String>),
    /// `Upgrade: SPDY/3.1`, offering these `X-Stream-Protocol-Version`s.
    Spdy(Vec<String>),
}

/// The `Sec-WebSocket-Key` [`upgrade_request`] sends (RFC 6455's example) and the accept value
/// a correct server answers.
pub const WEBSOCKET_KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";
pub const WEBSOCKET_ACCEPT: &str = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=";

trait RawIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> RawIo for T {}

/// The answer to an upgrade request: the status and headers, and (after a 101) the stream.
pub struct Upgraded {
    pub status: u16,
    /// Response headers, names lower-cased, in order.
    pub headers: Vec<(String, String)>,
    io: Box<dyn RawIo>,
    buffered: Vec<u8>,
}

impl Upgraded {
    /// The first value of a response header.
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    async fn fill(&mut self) -> Result<()> {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(10), self.io.read(&mut buf))
            .await
            .context("no bytes within 10s")??;
        if n == 0 {
            bail!(
                "stream closed (got {:?} so far)",
                String::from_utf8_lossy(&self.buffered)
            );
        }
        self.buffered.extend_from_slice(&buf[..n]);
        Ok(())
    }

    /// Read up to and including the next `\n`.
    pub async fn read_line(&mut self) -> Result<String> {
        loop {
            if let Some(i) = self.buffered.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buffered.drain(..=i).collect();
                return Ok(String::from_utf8_lossy(&line).into_owned());
            }
            self.fill().await?;
        }
    }

    /// Read exactly `n` bytes.
    pub async fn read_exact(&mut self, n: usize) -> Result<Vec<u8>> {
        while self.buffered.len() < n {
            self.fill().await?;
        }
        Ok(self.buffered.drain(..n).collect())
    }

    pub async fn write(&mut self, data: &[u8]) -> Result<()> {
        use tokio::io::AsyncWriteExt;
        self.io.write_all(data).await?;
        self.io.flush().await?;
        Ok(())
    }

    /// Write `data` and read as many bytes back.
    pub async fn round_trip(&mut self, data: &[u8]) -> Result<Vec<u8>> {
        self.write(data).await?;
        self.read_exact(data.len()).await
    }

    /// The rest of the response body after a non-101 answer (until close or `limit` bytes).
    pub async fn body(&mut self, limit: usize) -> Result<String> {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 4096];
        while self.buffered.len() < limit {
            match tokio::time::timeout(Duration::from_secs(2), self.io.read(&mut buf)).await {
                Ok(Ok(0)) | Err(_) => break,
                Ok(Ok(n)) => self.buffered.extend_from_slice(&buf[..n]),
                Ok(Err(e)) => return Err(e.into()),
            }
        }
        Ok(String::from_utf8_lossy(&std::mem::take(&mut self.buffered)).into_owned())
    }
}

/// Send one HTTP/1.1 upgrade request to `address` (TLS when `tls` is given) and read the
/// response head. `headers` are added as they are (e.g. `Authorization`, `X-Remote-User`).
pub async fn upgrade_request(
    address: &Address,
    tls: Option<&RawTls>,
    method: &str,
    path: &str,
    kind: &UpgradeKind,
    headers: &[(&str, &str)],
) -> Result<Upgraded> {
    use tokio::io::AsyncWriteExt;
    let host = if address.host.contains(':') {
        format!("[{}]:{}", address.host, address.port)
    } else {
        format!("{}:{}", address.host, address.port)
    };
    let tcp = tokio::net::TcpStream::connect((address.host.as_str(), address.port))
        .await
        .with_context(|| format!("connecting to {host}"))?;
    let mut io: Box<dyn RawIo> = match tls {
        None => Box::new(tcp),
        Some(t) => Box::new(raw_tls_connect(t, tcp).await?),
    };
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\n");
    match kind {
        UpgradeKind::WebSocket(protocols) => {
            req.push_str("Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n");
            req.push_str(&format!("Sec-WebSocket-Key: {WEBSOCKET_KEY}\r\n"));
            if !protocols.is_empty() {
                req.push_str(&format!(
                    "Sec-WebSocket-Protocol: {}\r\n",
                    protocols.join(", ")
                ));
            }
        }
        UpgradeKind::Spdy(protocols) => {
            req.push_str("Upgrade: SPDY/3.1\r\n");
            for p in protocols {
                req.push_str(&format!("X-Stream-Protocol-Version: {p}\r\n"));
            }
        }
    }
    if method == "POST" {
        req.push_str("Content-Length: 0\r\n");
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    io.write_all(req.as_bytes()).await?;
    io.flush().await?;
    let mut up = Upgraded {
        status: 0,
        headers: Vec::new(),
        io,
        buffered: Vec::new(),
    };
    let head_end = loop {
        if let Some(i) = up.buffered.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        up.fill().await.context("reading the response head")?;
    };
    let head: Vec<u8> = up.buffered.drain(..head_end + 4).collect();
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    up.status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("bad status line {status_line:?}"))?;
    for line in lines.filter(|l| !l.is_empty()) {
        if let Some((k, v)) = line.split_once(':') {
            up.headers
                .push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    Ok(up)
}

/// The certificate the TLS server at `address` presents (end entity, DER), after a handshake
/// verified against `tls`'s CA.
pub async fn presented_certificate(address: &Address, tls: &RawTls) -> Result<Vec<u8>> {
    let tcp = tokio::net::TcpStream::connect((address.host.as_str(), address.port)).await?;
    let stream = raw_tls_connect(tls, tcp).await?;
    let (_, connection) = stream.get_ref();
    connection
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|cert| cert.to_vec())
        .context("no server certificate")
}

async fn raw_tls_connect(
    t: &RawTls,
    tcp: tokio::net::TcpStream,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(t.ca_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let mut config = match &t.identity {
        None => builder.with_no_client_auth(),
        Some(id) => {
            let chain = CertificateDer::pem_slice_iter(id.cert_pem.as_bytes())
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let key = PrivateKeyDer::from_pem_slice(id.key_pem.as_bytes())?;
            builder.with_client_auth_cert(chain, key)?
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let name = ServerName::try_from(t.server_name.clone())?;
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
        .context("TLS handshake")
}
