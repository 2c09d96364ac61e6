//! Renders the Envoy bootstrap for a static configuration from the templates in `envoy/`.
//!
//! The templates carry every Envoy setting with the reason for it; this module only fills in
//! addresses, the wasm path, the filter configuration and the clusters. Nothing else about
//! Envoy is decided here, so the YAML in `envoy/` is the one place to read and review.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use crate::routing::RoutingPlan;

const BOOTSTRAP_TEMPLATE: &str = include_str!("../../envoy/static-bootstrap.yaml");
const CLUSTER_TEMPLATE: &str = include_str!("../../envoy/static-cluster.yaml");
const PEER_LISTENER_TEMPLATE: &str = include_str!("../../envoy/static-peer-listener.yaml");
const PASSTHROUGH_CLUSTER_TEMPLATE: &str =
    include_str!("../../envoy/static-passthrough-cluster.yaml");

use skewgate_core::config::UpstreamAuth;
pub use skewgate_core::config::LOCAL_CLUSTER;

#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error("address {0:?} is not host:port (IPv6 hosts in brackets, e.g. [::1]:6443)")]
    BadAddress(String),
    #[error("peer {0:?} is in the routing plan but has no address")]
    UnknownPeer(String),
    #[error("{0} contains characters that cannot appear in the bootstrap")]
    Unsafe(&'static str),
}

/// A `host:port` an apiserver listens on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    pub host: String,
    pub port: u16,
}

impl Address {
    /// An apiserver's address: the port must be given.
    pub fn parse(s: &str) -> Result<Self, BootstrapError> {
        let address = Self::parse_listen(s)?;
        if address.port == 0 {
            return Err(BootstrapError::BadAddress(s.to_string()));
        }
        Ok(address)
    }

    /// An address to listen on: port 0 lets the kernel choose (Envoy reports it on its admin
    /// `/listeners`).
    pub fn parse_listen(s: &str) -> Result<Self, BootstrapError> {
        let bad = || BootstrapError::BadAddress(s.to_string());
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
    fn discovery_type(&self) -> &'static str {
        if self.host.parse::<IpAddr>().is_ok() {
            "STATIC"
        } else {
            "STRICT_DNS"
        }
    }
}

/// What the static bootstrap needs besides the routing plan.
#[derive(Debug, Clone)]
pub struct StaticBootstrap<'a> {
    pub listen: &'a Address,
    pub admin_port: u16,
    pub wasm_path: &'a Path,
    pub local: &'a Address,
    /// Address of every peer apiserver by id.
    pub peers: &'a [(String, Address)],
    /// The apiservers' `--request-timeout`; Envoy bounds non-long-running requests by a
    /// little more, so the apiserver's own timeout answer wins whenever it can give one.
    pub request_timeout: std::time::Duration,
    /// The peer port (the apiserver's peer-advertise address): TLS passed through at L4 to
    /// the local apiserver. `None` when peers reach the apiserver directly.
    pub peer_listen: Option<&'a Address>,
    /// TLS for clients; `None` serves plaintext (tests and demos on loopback only).
    pub serving: Option<&'a ServingTls>,
    /// TLS to the apiservers; `None` connects in plaintext (tests and demos on loopback only).
    pub upstream: Option<&'a UpstreamTls>,
}

/// What Envoy presents to clients: the apiserver's own serving certificate, and the client CA
/// that verifies client certificates (optional for clients, as on kube-apiserver).
#[derive(Debug, Clone)]
pub struct ServingTls {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// kube-apiserver's `--client-ca-file`. Without it no client certificate is requested.
    pub client_ca_file: Option<PathBuf>,
}

/// How Envoy talks to apiservers: verify them against the CA that signed their serving
/// certificates, with the name upstream's peer proxy verifies, and present the proxy-client
/// certificate on `-identity` connections.
#[derive(Debug, Clone)]
pub struct UpstreamTls {
    /// kube-apiserver's `--peer-ca-file`.
    pub peer_ca_file: PathBuf,
    /// kube-apiserver's `--proxy-client-cert-file` / `--proxy-client-key-file`: the
    /// certificate the apiservers trust for requestheader authentication.
    pub proxy_client_cert_file: PathBuf,
    pub proxy_client_key_file: PathBuf,
}

/// The name every apiserver's serving certificate carries; upstream's peer proxy verifies it.
pub const APISERVER_TLS_NAME: &str = "kubernetes.default.svc";

fn file(path: &Path) -> Result<serde_json::Value, BootstrapError> {
    let name = path.to_str().ok_or(BootstrapError::Unsafe("a file path"))?;
    if name.is_empty() || name.chars().any(char::is_control) {
        return Err(BootstrapError::Unsafe("a file path"));
    }
    Ok(serde_json::json!({ "filename": name }))
}

impl ServingTls {
    /// The filter chain's `transport_socket`, as one line of YAML flow (JSON).
    fn transport_socket(&self) -> Result<String, BootstrapError> {
        let mut common = serde_json::json!({
            "alpn_protocols": ["h2", "http/1.1"],
            "tls_certificates": [{
                "certificate_chain": file(&self.cert_file)?,
                "private_key": file(&self.key_file)?,
            }],
        });
        if let Some(ca) = &self.client_ca_file {
            common["validation_context"] = serde_json::json!({ "trusted_ca": file(ca)? });
        }
        let socket = serde_json::json!({
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
                // Optional, as on kube-apiserver: token and anonymous clients present none. A
                // certificate that is presented must verify, or the handshake fails.
                "require_client_certificate": false,
                "common_tls_context": common,
            }
        });
        Ok(socket.to_string())
    }
}

impl UpstreamTls {
    fn transport_socket(&self, auth: UpstreamAuth) -> Result<String, BootstrapError> {
        let mut common = serde_json::json!({
            "validation_context": {
                "trusted_ca": file(&self.peer_ca_file)?,
                "match_typed_subject_alt_names": [
                    { "san_type": "DNS", "matcher": { "exact": APISERVER_TLS_NAME } }
                ],
            },
        });
        if auth == UpstreamAuth::ProxyIdentity {
            common["tls_certificates"] = serde_json::json!([{
                "certificate_chain": file(&self.proxy_client_cert_file)?,
                "private_key": file(&self.proxy_client_key_file)?,
            }]);
        }
        let socket = serde_json::json!({
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "sni": APISERVER_TLS_NAME,
                "common_tls_context": common,
            }
        });
        Ok(socket.to_string())
    }
}

/// How much longer than the apiserver's request timeout Envoy waits.
pub const REQUEST_TIMEOUT_MARGIN: std::time::Duration = std::time::Duration::from_secs(10);

impl StaticBootstrap<'_> {
    pub fn render(&self, plan: &RoutingPlan) -> Result<String, BootstrapError> {
        let wasm = self
            .wasm_path
            .to_str()
            .ok_or(BootstrapError::Unsafe("the wasm path"))?;
        if wasm.chars().any(|c| c.is_control() || c == '"') {
            return Err(BootstrapError::Unsafe("the wasm path"));
        }
        let mut clusters = self.render_clusters(LOCAL_CLUSTER, std::slice::from_ref(self.local))?;
        for cluster in &plan.clusters {
            let addresses = cluster
                .peer_ids
                .iter()
                .map(|id| {
                    self.peers
                        .iter()
                        .find(|(peer, _)| peer == id)
                        .map(|(_, address)| address.clone())
                        .ok_or_else(|| BootstrapError::UnknownPeer(id.clone()))
                })
                .collect::<Result<Vec<_>, _>>()?;
            clusters.push_str(&self.render_clusters(&cluster.name, &addresses)?);
        }
        let peer_listener = match self.peer_listen {
            Some(peer) => {
                clusters.push_str(
                    &PASSTHROUGH_CLUSTER_TEMPLATE
                        .replace("{{discovery_type}}", self.local.discovery_type())
                        .replace("{{address}}", &yaml_host(self.local))
                        .replace("{{port}}", &self.local.port.to_string()),
                );
                PEER_LISTENER_TEMPLATE
                    .replace("{{peer_address}}", &yaml_host(peer))
                    .replace("{{peer_port}}", &peer.port.to_string())
            }
            None => String::new(),
        };
        let downstream_tls = match self.serving {
            Some(tls) => format!(
                "name: tls\n      transport_socket: {}",
                tls.transport_socket()?
            ),
            None => "name: plaintext".to_string(),
        };
        // A JSON string is a valid YAML double-quoted scalar.
        let filter_config = serde_json::to_string(&plan.config.to_json())
            .map_err(|_| BootstrapError::Unsafe("the filter configuration"))?;
        Ok(BOOTSTRAP_TEMPLATE
            .replace("{{admin_port}}", &self.admin_port.to_string())
            .replace("{{listen_address}}", &yaml_host(self.listen))
            .replace("{{listen_port}}", &self.listen.port.to_string())
            .replace("{{downstream_tls}}", &downstream_tls)
            .replace("{{peer_listener}}", peer_listener.trim_end())
            .replace("{{wasm_path}}", &format!("\"{wasm}\""))
            .replace("{{filter_config}}", &filter_config)
            .replace(
                "{{short_request_timeout}}",
                &format!(
                    "{}s",
                    (self.request_timeout + REQUEST_TIMEOUT_MARGIN).as_secs()
                ),
            )
            .replace("{{clusters}}", clusters.trim_end()))
    }
}

impl StaticBootstrap<'_> {
    /// The three variants of one cluster.
    fn render_clusters(&self, base: &str, addresses: &[Address]) -> Result<String, BootstrapError> {
        let mut out = String::new();
        for auth in UpstreamAuth::ALL {
            let transport_socket = match self.upstream {
                Some(tls) => format!("    transport_socket: {}\n", tls.transport_socket(auth)?),
                None => String::new(),
            };
            out.push_str(&render_cluster(
                &auth.cluster(base),
                addresses,
                auth,
                &transport_socket,
            ));
        }
        Ok(out)
    }
}

fn yaml_host(address: &Address) -> String {
    format!("\"{}\"", address.host)
}

const KEEP_DOWNSTREAM_PROTOCOL: &str =
    "        # HTTP/2 has no Upgrade: keep the client's protocol upstream so that WebSocket and
        # SPDY upgrades arriving over HTTP/1.1 stay HTTP/1.1 to the apiserver.
        # PINGs find a pooled HTTP/2 connection to an apiserver cut off the network within
        # 15 s, instead of every request on it waiting out the request timeout.
        use_downstream_protocol_config:
          http_protocol_options: {}
          http2_protocol_options:
            connection_keepalive: { interval: 10s, timeout: 5s }
";
const HTTP1_ONLY: &str =
    "        # Unauthenticated requests never share an HTTP/2 connection with anyone.
        explicit_http_config:
          http_protocol_options: {}
";

fn render_cluster(
    name: &str,
    addresses: &[Address],
    auth: UpstreamAuth,
    transport_socket: &str,
) -> String {
    let mut endpoints = String::new();
    for a in addresses {
        // Writing to a String cannot fail.
        let _ = writeln!(
            endpoints,
            "        - endpoint: {{ address: {{ socket_address: {{ address: {}, port_value: {} }} }} }}",
            yaml_host(a),
            a.port
        );
    }
    // All peers of one cluster resolve the same way; a mix of names and IPs needs DNS.
    let discovery_type = if addresses.iter().all(|a| a.discovery_type() == "STATIC") {
        "STATIC"
    } else {
        "STRICT_DNS"
    };
    let mut out = CLUSTER_TEMPLATE
        .replace("{{name}}", name)
        .replace("{{discovery_type}}", discovery_type)
        .replace("{{endpoints}}", endpoints.trim_end())
        .replace(
            "{{protocol_options}}",
            if auth == UpstreamAuth::Anonymous {
                HTTP1_ONLY
            } else {
                KEEP_DOWNSTREAM_PROTOCOL
            },
        )
        .replace("{{transport_socket}}", transport_socket);
    out.push('\n');
    out
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
