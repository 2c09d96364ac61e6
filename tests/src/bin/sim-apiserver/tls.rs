//! TLS serving like kube-apiserver: `--tls-cert-file`/`--tls-private-key-file`, ALPN `h2` and
//! `http/1.1`, and client certificates requested but not required (Go's
//! `tls.RequestClientCert`): the handshake accepts any certificate whose key signs the
//! handshake, and `auth.rs` verifies the chain against each CA afterwards, as kube's
//! authenticators do. A certificate from an unknown CA therefore gets kube's 401, not a TLS
//! alert.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig};

/// What the connection a request came on knows about its client; put into every request's
/// extensions by `listen.rs`.
#[derive(Clone, Debug, Default)]
pub struct ConnInfo {
    /// A number per accepted connection (the `x-sim-conn` header): tells tests which requests
    /// shared a connection.
    pub id: u64,
    /// Notified to close the connection gracefully after the requests in flight (HTTP/2:
    /// GOAWAY), like Go's `Connection: close` on an HTTP/2 response.
    pub close: Option<Arc<tokio::sync::Notify>>,
    /// Notified to drop the connection at once, answering nothing (`--reset-requests-with`).
    pub abort: Option<Arc<tokio::sync::Notify>>,
    pub tls: bool,
    /// The negotiated ALPN protocol (`h2`, `http/1.1`), if any.
    pub alpn: Option<String>,
    /// The client's certificate chain as presented (end entity first), not yet verified.
    pub peer_certs: Option<Arc<[CertificateDer<'static>]>>,
}

pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read_certs(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("reading {}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parsing certificates in {}", path.display()))?;
    if certs.is_empty() {
        anyhow::bail!("no certificate in {}", path.display());
    }
    Ok(certs)
}

/// A verifier for one CA bundle (every certificate in the file is a trust anchor).
pub fn client_verifier(ca_file: &Path) -> anyhow::Result<Arc<dyn ClientCertVerifier>> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs(ca_file)? {
        roots
            .add(cert)
            .with_context(|| format!("CA certificate in {}", ca_file.display()))?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .allow_unauthenticated()
        .build()
        .with_context(|| format!("client CA {}", ca_file.display()))
}

/// The serving config: certificate chain and key from PEM files, ALPN h2 then http/1.1, and
/// client certificates requested (with `hints` as the acceptable CAs) when `hints` is given.
pub fn server_config(
    cert_file: &Path,
    key_file: &Path,
    hints: Option<Vec<DistinguishedName>>,
) -> anyhow::Result<Arc<ServerConfig>> {
    let certs = read_certs(cert_file)?;
    let key = PrivateKeyDer::from_pem_file(key_file)
        .with_context(|| format!("reading private key {}", key_file.display()))?;
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let builder = match hints {
        Some(hints) => builder.with_client_cert_verifier(Arc::new(RequestClientCert {
            hints,
            algorithms: provider.signature_verification_algorithms,
        })),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .context("serving certificate and key")?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Go's `tls.RequestClientCert`: ask for a certificate, accept any (or none); only the
/// handshake signature is checked, which proves the client holds the certificate's key.
#[derive(Debug)]
struct RequestClientCert {
    hints: Vec<DistinguishedName>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ClientCertVerifier for RequestClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &self.hints
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// The parts of a certificate subject kube's authenticators read, as Go's
/// `pkix.Name.FillFromRDNSequence` fills them: the last CN wins, O values in certificate
/// order (every attribute of multi-valued RDNs included).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subject {
    pub common_name: String,
    pub organizations: Vec<String>,
}

pub fn subject(cert: &CertificateDer<'_>) -> Result<Subject, String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref())
        .map_err(|e| format!("parsing the client certificate: {e}"))?;
    let mut out = Subject {
        common_name: String::new(),
        organizations: Vec::new(),
    };
    for rdn in parsed.subject().iter() {
        for attr in rdn.iter() {
            let oid = attr.attr_type();
            let value = || {
                attr.as_str()
                    .map(String::from)
                    .map_err(|e| format!("subject attribute {oid}: {e}"))
            };
            if *oid == x509_parser::oid_registry::OID_X509_COMMON_NAME {
                out.common_name = value()?;
            } else if *oid == x509_parser::oid_registry::OID_X509_ORGANIZATION_NAME {
                out.organizations.push(value()?);
            }
        }
    }
    Ok(out)
}
