//! Envoy as skewgate configures it: the one bootstrap ([`bootstrap`]) and the
//! resources every mode shares ([`resources`]: the upstream clusters with their TLS, and the
//! filter's ECDS entry). The live mode serves those resources over delta ADS
//! ([`crate::xds`]); the static mode (`skewgate-control render-static`) writes the same
//! resources to files Envoy reads with the same bootstrap ([`crate::xds::files`]), so there is
//! one renderer for each Envoy setting, whichever way it reaches Envoy.
//!
//! This module holds the types both modes are given: apiserver addresses and the TLS files.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

pub mod admin;
pub mod bootstrap;
pub mod dialect;
pub mod drain;
pub mod fallback;
pub mod files;
pub mod goaway;
pub mod reachability;
pub mod resources;
pub mod route_timeout;
pub mod secrets;
pub mod yaml;

pub use skewgate_core::config::LOCAL_CLUSTER;

/// Name of the HTTP filter in the bootstrap, and so of its ECDS resource.
pub const FILTER_NAME: &str = "skewgate";

/// The name every apiserver's serving certificate carries: Envoy and the control plane's own
/// discovery fetches verify it, and send it as SNI (what upstream's peer proxy does).
pub const APISERVER_TLS_NAME: &str = "kubernetes.default.svc";

/// How much longer than the apiservers' `--request-timeout` Envoy waits for a response to a
/// non-long-running request, so that a live apiserver's own 504 Timeout Status wins and only an
/// apiserver that never answers becomes a 503.
pub const REQUEST_TIMEOUT_MARGIN: std::time::Duration = std::time::Duration::from_secs(10);

/// Why an Envoy configuration could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum EnvoyError {
    #[error("address {0:?} is not host:port (IPv6 hosts in brackets, e.g. [::1]:6443)")]
    BadAddress(String),
    #[error("peer {0:?} is in the routing plan but has no address")]
    UnknownPeer(String),
    #[error("{0} contains characters that cannot appear in the Envoy configuration")]
    Unsafe(&'static str),
    #[error("TLS needs a directory for the SDS files of its certificates (--sds-dir)")]
    NoSdsDir,
    #[error("the fallback configuration: {0}")]
    Fallback(&'static str),
    #[error("the SDS directory {0:?} is not absolute")]
    RelativeSdsDir(String),
    #[error("the last acknowledged configuration cannot be used: {0}")]
    Record(String),
    #[error(transparent)]
    Yaml(#[from] yaml::YamlError),
}

/// A file path Envoy will read, checked to be representable in its configuration.
pub(crate) fn checked_path<'a>(path: &'a Path, what: &'static str) -> Result<&'a str, EnvoyError> {
    let name = path.to_str().ok_or(EnvoyError::Unsafe(what))?;
    if name.is_empty() || name.chars().any(|c| c.is_control() || c == '"') {
        return Err(EnvoyError::Unsafe(what));
    }
    Ok(name)
}

/// A `host:port` an apiserver listens on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    pub host: String,
    pub port: u16,
}

/// An IP address and port (a peer's, as its Lease gave it).
impl From<std::net::SocketAddr> for Address {
    fn from(address: std::net::SocketAddr) -> Self {
        Address {
            host: address.ip().to_string(),
            port: address.port(),
        }
    }
}

/// `host:port`, IPv6 hosts in brackets: what [`Address::parse`] reads back.
impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl Address {
    /// An apiserver's address: the port must be given.
    pub fn parse(s: &str) -> Result<Self, EnvoyError> {
        let address = Self::parse_listen(s)?;
        if address.port == 0 {
            return Err(EnvoyError::BadAddress(s.to_string()));
        }
        Ok(address)
    }

    /// An address to listen on: port 0 lets the kernel choose (Envoy reports it on its admin
    /// `/listeners`).
    pub fn parse_listen(s: &str) -> Result<Self, EnvoyError> {
        let bad = || EnvoyError::BadAddress(s.to_string());
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            let (host, port) = rest.split_once("]:").ok_or_else(bad)?;
            host.parse::<std::net::Ipv6Addr>().map_err(|_| bad())?;
            (host, port)
        } else {
            let (host, port) = s.rsplit_once(':').ok_or_else(bad)?;
            if host.contains(':') {
                return Err(bad()); // an IPv6 address must be bracketed
            }
            (host, port)
        };
        let port: u16 = port.parse().map_err(|_| bad())?;
        let host_ok = !host.is_empty()
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':'));
        if !host_ok {
            return Err(bad());
        }
        Ok(Address {
            host: host.to_string(),
            port,
        })
    }

    /// Envoy resolves names itself; literal IPs need no DNS.
    pub(crate) fn is_ip(&self) -> bool {
        self.host.parse::<IpAddr>().is_ok()
    }
}

/// What Envoy presents to clients: the apiserver's own serving certificate, and the client CA
/// that verifies client certificates (optional for clients, as on kube-apiserver).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServingTls {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// kube-apiserver's `--client-ca-file`. Without it no client certificate is requested.
    pub client_ca_file: Option<PathBuf>,
}

/// How Envoy talks to apiservers: verify them against the CA that signed their serving
/// certificates, with the name upstream's peer proxy verifies, and present the proxy-client
/// certificate on `-identity` connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamTls {
    /// kube-apiserver's `--peer-ca-file`.
    pub peer_ca_file: PathBuf,
    /// kube-apiserver's `--proxy-client-cert-file` / `--proxy-client-key-file`: the
    /// certificate the apiservers trust for requestheader authentication.
    pub proxy_client_cert_file: PathBuf,
    pub proxy_client_key_file: PathBuf,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_addresses() {
        let ok = [
            ("127.0.0.1:6443", "127.0.0.1", 6443),
            ("[::1]:6444", "::1", 6444),
            ("apiserver-b.example:443", "apiserver-b.example", 443),
        ];
        for (s, host, port) in ok {
            assert_eq!(
                Address::parse(s).unwrap(),
                Address {
                    host: host.into(),
                    port
                },
                "{s}"
            );
        }
        for bad in [
            "",
            "6443",
            "127.0.0.1",
            "127.0.0.1:0",
            "127.0.0.1:99999",
            "[::1]",
            "::1:6443x",
            "a b:1",
            "x\":1",
            "[zz]:1",
            ":6443",
            "::1:6443",
        ] {
            assert!(Address::parse(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
