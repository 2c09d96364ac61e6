//! One HTTP client per apiserver, all from the same base `kube::Config`.
//!
//! Every apiserver of a cluster trusts the same client CA, so the kubeconfig's credentials
//! (client certificate or token, exec plugins included) work for each of them; only the address
//! and the server verification change: the peer CA (`--peer-ca-file`) as the only root, and TLS
//! server name `kubernetes.default.svc`, which is what kube-apiserver verifies its peers with
//! (their addresses come from Leases and are not in the serving certificate).
//!
//! kube's own client stack (auth layer, rustls with the kubeconfig's identity, connect timeout)
//! does the work: [`kube::Client::send`] gives the raw response with a streaming body, so the
//! size limit applies while reading and nothing needs a second TLS/auth implementation.
//!
//! The peer CA is renewed in place like every other certificate: a template made with
//! [`ClientTemplate::with_peer_ca_file`] remembers the file and what it held, and
//! [`ClientTemplate::reload_peer_ca`] says when it holds something else; each fetcher checks
//! before every fetch and rebuilds its client then (`fetcher.rs`), as Envoy does through SDS.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::error::SetupError;

use crate::envoy::APISERVER_TLS_NAME;

/// The base configuration every apiserver's client is made from.
#[derive(Clone)]
pub struct ClientTemplate {
    base: kube::Config,
    /// DER certificates: the only roots for HTTPS apiservers. `None`: the kubeconfig's CA.
    peer_ca: Option<Vec<Vec<u8>>>,
    /// The file `peer_ca` was read from, and its bytes then.
    peer_ca_file: Option<(PathBuf, Vec<u8>)>,
    tls_server_name: String,
}

impl std::fmt::Debug for ClientTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the base config: it holds credentials.
        f.debug_struct("ClientTemplate")
            .field("peer_ca_certs", &self.peer_ca.as_ref().map(Vec::len))
            .field("tls_server_name", &self.tls_server_name)
            .finish_non_exhaustive()
    }
}

impl ClientTemplate {
    /// Credentials and default settings from `base` (its `cluster_url` is replaced per
    /// apiserver).
    pub fn new(base: kube::Config) -> Self {
        ClientTemplate {
            base,
            peer_ca: None,
            peer_ca_file: None,
            tls_server_name: APISERVER_TLS_NAME.to_string(),
        }
    }

    /// No credentials (tests, plain-HTTP apiservers on loopback).
    pub fn anonymous() -> Self {
        Self::new(kube::Config::new(http::Uri::from_static(
            "http://127.0.0.1",
        )))
    }

    /// From a kubeconfig file (`--kubeconfig`), or inferred (in-cluster / `$KUBECONFIG`).
    pub async fn from_kubeconfig(path: Option<&Path>) -> Result<Self, SetupError> {
        let config = match path {
            Some(p) => {
                let kubeconfig = kube::config::Kubeconfig::read_from(p)
                    .map_err(|e| SetupError::Kubeconfig(e.to_string()))?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                    .await
                    .map_err(|e| SetupError::Kubeconfig(e.to_string()))?
            }
            None => kube::Config::infer()
                .await
                .map_err(|e| SetupError::Kubeconfig(e.to_string()))?,
        };
        Ok(Self::new(config))
    }

    /// Verify HTTPS apiservers against these PEM certificates only.
    pub fn with_peer_ca_pem(mut self, pem_text: &[u8], what: &str) -> Result<Self, SetupError> {
        let certs: Vec<Vec<u8>> = pem::parse_many(pem_text)
            .map_err(|error| SetupError::Pem {
                what: what.to_string(),
                error,
            })?
            .into_iter()
            .filter(|p| p.tag() == "CERTIFICATE")
            .map(|p| p.into_contents())
            .collect();
        if certs.is_empty() {
            return Err(SetupError::NoCertificate {
                what: what.to_string(),
            });
        }
        self.peer_ca = Some(certs);
        Ok(self)
    }

    /// [`Self::with_peer_ca_pem`] from a file (`--peer-ca-file`), which
    /// [`Self::reload_peer_ca`] then follows.
    pub fn with_peer_ca_file(self, path: &Path) -> Result<Self, SetupError> {
        let text = std::fs::read(path).map_err(|error| SetupError::Io {
            path: path.display().to_string(),
            error,
        })?;
        let mut template = self.with_peer_ca_pem(&text, &path.display().to_string())?;
        template.peer_ca_file = Some((path.to_path_buf(), text));
        Ok(template)
    }

    /// The template with the peer CA its file holds now, when that differs from what this
    /// template was made with; `Ok(None)` when it is the same (or there is no CA file). A file
    /// that cannot be read or holds no certificate (say, caught half-written) is an error: the
    /// caller keeps what it has and asks again next time. Reads the file (a few KiB) each call.
    pub fn reload_peer_ca(&self) -> Result<Option<Self>, SetupError> {
        let Some((path, held)) = &self.peer_ca_file else {
            return Ok(None);
        };
        let now = std::fs::read(path).map_err(|error| SetupError::Io {
            path: path.display().to_string(),
            error,
        })?;
        if now == *held {
            return Ok(None);
        }
        self.clone().with_peer_ca_file(path).map(Some)
    }

    /// Another TLS server name than [`APISERVER_TLS_NAME`].
    pub fn with_tls_server_name(mut self, name: impl Into<String>) -> Self {
        self.tls_server_name = name.into();
        self
    }

    /// The client configuration for the apiserver at `url` (`https://host:port` or, on trusted
    /// networks and in tests, `http://host:port`).
    pub fn config_for(&self, url: &str, timeout: Duration) -> Result<kube::Config, SetupError> {
        let bad = |reason: &str| SetupError::Url {
            url: url.to_string(),
            reason: reason.to_string(),
        };
        let uri: http::Uri = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| bad(&e.to_string()))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(bad("the scheme must be https or http")),
        };
        if uri.authority().is_none() {
            return Err(bad("no host"));
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err(bad("an apiserver URL has no path or query"));
        }
        let mut c = self.base.clone();
        c.cluster_url = uri;
        // Our own backoff decides when to retry; kube's retry layer would stretch a timeout.
        c.default_retry = false;
        c.connect_timeout = Some(timeout);
        c.read_timeout = None;
        c.write_timeout = Some(timeout);
        // Peers are reached directly, and always verified.
        c.proxy_url = None;
        c.accept_invalid_certs = false;
        if https {
            c.tls_server_name = Some(self.tls_server_name.clone());
            if let Some(ca) = &self.peer_ca {
                c.root_cert = Some(ca.clone());
                c.root_cert_file = None;
            }
        }
        Ok(c)
    }

    /// A client for the apiserver at `url`. Needs a Tokio runtime (kube's client spawns its
    /// request buffer).
    pub fn client_for(&self, url: &str, timeout: Duration) -> Result<kube::Client, SetupError> {
        Ok(kube::Client::try_from(self.config_for(url, timeout)?)?)
    }
}

/// The URL of an apiserver at a socket address (`https://[::1]:6443` for IPv6).
pub fn https_url(address: std::net::SocketAddr) -> String {
    format!("https://{address}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const CA: &str = "-----BEGIN CERTIFICATE-----\nAAECAw==\n-----END CERTIFICATE-----\n\
                      -----BEGIN PRIVATE KEY-----\nBAUG\n-----END PRIVATE KEY-----\n";

    #[test]
    fn per_apiserver_configs() {
        let mut base = kube::Config::new(http::Uri::from_static("https://lb.example:6443"));
        base.root_cert = Some(vec![vec![9]]);
        base.accept_invalid_certs = true;
        base.auth_info.token = Some("secret".to_string().into());
        let t = ClientTemplate::new(base.clone());
        let timeout = Duration::from_secs(10);

        // Without a peer CA: the kubeconfig's CA, the peer server name, always verified.
        let c = t.config_for("https://10.0.0.2:6443", timeout).unwrap();
        assert_eq!(c.cluster_url.to_string(), "https://10.0.0.2:6443/");
        assert_eq!(c.root_cert, Some(vec![vec![9]]));
        assert_eq!(c.tls_server_name.as_deref(), Some(APISERVER_TLS_NAME));
        assert!(!c.accept_invalid_certs && !c.default_retry);
        assert_eq!(c.connect_timeout, Some(timeout));
        assert!(c.auth_info.token.is_some(), "credentials are reused");

        // With one: only it.
        let t = t.with_peer_ca_pem(CA.as_bytes(), "test").unwrap();
        let c = t.config_for("https://[fd00::2]:6443", timeout).unwrap();
        assert_eq!(c.root_cert, Some(vec![vec![0, 1, 2, 3]]));
        assert_eq!(c.cluster_url.host(), Some("[fd00::2]"));
        assert!(format!("{t:?}").contains("peer_ca_certs: Some(1)"));
        assert!(!format!("{t:?}").contains("secret"));

        // Plain HTTP is allowed (loopback tests); no TLS settings needed.
        let c = t.config_for("http://127.0.0.1:8080", timeout).unwrap();
        assert_eq!(c.tls_server_name, None);

        for bad in [
            "10.0.0.2:6443",
            "ftp://10.0.0.2",
            "https://10.0.0.2:6443/apis",
            "https://10.0.0.2:6443/?x=1",
            "https://",
            "not a url",
        ] {
            assert!(t.config_for(bad, timeout).is_err(), "{bad}");
        }
        assert_eq!(
            https_url("[fd00::2]:6443".parse().unwrap()),
            "https://[fd00::2]:6443"
        );
    }

    #[test]
    fn the_peer_ca_file_is_followed() {
        let dir = std::env::temp_dir().join(format!("skewgate-peer-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ca.crt");
        std::fs::write(&path, CA).unwrap();
        let t = ClientTemplate::anonymous()
            .with_peer_ca_file(&path)
            .unwrap();
        assert!(t.reload_peer_ca().unwrap().is_none(), "unchanged");
        // Renewed (replaced by a rename): a template with the new CA.
        let renewed = "-----BEGIN CERTIFICATE-----\nBAUG\n-----END CERTIFICATE-----\n";
        std::fs::write(dir.join(".ca.tmp"), renewed).unwrap();
        std::fs::rename(dir.join(".ca.tmp"), &path).unwrap();
        let t2 = t.reload_peer_ca().unwrap().expect("reloaded");
        let c = t2
            .config_for("https://10.0.0.2:6443", Duration::from_secs(1))
            .unwrap();
        assert_eq!(c.root_cert, Some(vec![vec![4, 5, 6]]));
        assert!(
            t2.reload_peer_ca().unwrap().is_none(),
            "it remembers the new one"
        );
        // Caught half-written, or gone: an error, and the caller keeps its client.
        std::fs::write(&path, "-----BEGIN CERT").unwrap();
        assert!(t2.reload_peer_ca().is_err());
        std::fs::remove_file(&path).unwrap();
        assert!(t2.reload_peer_ca().is_err());
        // A CA given inline is never reloaded.
        let inline = ClientTemplate::anonymous()
            .with_peer_ca_pem(CA.as_bytes(), "x")
            .unwrap();
        assert!(inline.reload_peer_ca().unwrap().is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn peer_ca_must_hold_a_certificate() {
        let t = ClientTemplate::anonymous();
        assert!(matches!(
            t.clone().with_peer_ca_pem(
                b"-----BEGIN PRIVATE KEY-----\nBAUG\n-----END PRIVATE KEY-----\n",
                "x"
            ),
            Err(SetupError::NoCertificate { .. })
        ));
        assert!(matches!(
            t.clone().with_peer_ca_pem(b"", "x"),
            Err(SetupError::NoCertificate { .. })
        ));
        assert!(t
            .with_peer_ca_file(Path::new("/nonexistent/ca.crt"))
            .is_err());
    }
}
