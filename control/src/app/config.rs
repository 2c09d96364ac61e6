//! Flags to a validated configuration, as pure functions (table-tested): Go-style durations,
//! the local apiserver's URL, the upstream TLS or the explicit plaintext opt-out, the listen
//! addresses.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::bootstrap::{Address, UpstreamTls};
use crate::peers::{self, AddressPolicy, LocalSelector, MappingEntry, PeerConfig};

use super::state::Scheme;

/// A duration the way kube-apiserver's flags take it (Go's `time.ParseDuration`: `60s`,
/// `1m0s`, `1m30s`, `500ms`, `1h`), or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let bad = || format!("{s:?} is not a duration (like 30s, 1m0s, 500ms, or seconds)");
    if s.is_empty() {
        return Err(bad());
    }
    if s.bytes().all(|b| b.is_ascii_digit()) {
        return s.parse::<u64>().map(Duration::from_secs).map_err(|_| bad());
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        if number_end == 0 {
            return Err(bad());
        }
        let number: f64 = rest[..number_end].parse().map_err(|_| bad())?;
        rest = &rest[number_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += number * scale;
        rest = &rest[unit_end..];
    }
    if !total.is_finite() || total > 1e9 {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(total))
}

/// The local apiserver as the flags give it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalApiserver {
    /// `scheme://host:port`, no path: where discovery is fetched.
    pub url: String,
    /// The same, for Envoy's `skewgate-local` clusters.
    pub address: Address,
}

/// `--local-apiserver-url`: `https://host[:port]` (port 443 if omitted), or `http://` only
/// with `--insecure-plaintext-upstreams`.
pub fn parse_local_url(url: &str, scheme: Scheme) -> Result<LocalApiserver, String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("--local-apiserver-url {url:?}: {e}"))?;
    let (want, default_port) = match scheme {
        Scheme::Https => ("https", 443),
        Scheme::Http => ("http", 80),
    };
    if uri.scheme_str() != Some(want) {
        return Err(match scheme {
            Scheme::Https => format!(
                "--local-apiserver-url {url:?} must be https:// (http:// only with --insecure-plaintext-upstreams)"
            ),
            Scheme::Http => format!(
                "--local-apiserver-url {url:?} must be http:// with --insecure-plaintext-upstreams (Envoy would speak plaintext to it)"
            ),
        });
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(format!(
            "--local-apiserver-url {url:?}: an apiserver URL has no path or query"
        ));
    }
    let authority = uri
        .authority()
        .ok_or_else(|| format!("--local-apiserver-url {url:?}: no host"))?;
    if authority.as_str().contains('@') {
        return Err(format!(
            "--local-apiserver-url {url:?}: no credentials in the URL"
        ));
    }
    let port = authority.port_u16().unwrap_or(default_port);
    // IPv6 hosts keep their brackets here.
    let host_port = format!("{}:{port}", authority.host());
    let address =
        Address::parse(&host_port).map_err(|e| format!("--local-apiserver-url {url:?}: {e}"))?;
    Ok(LocalApiserver {
        url: format!("{want}://{host_port}"),
        address,
    })
}

/// `--xds-listen`: the ADS port carries no authentication, so it must be loopback.
pub fn parse_xds_listen(s: &str) -> Result<SocketAddr, String> {
    let addr: SocketAddr = s
        .parse()
        .map_err(|_| format!("--xds-listen {s:?} is not ip:port"))?;
    if !addr.ip().is_loopback() {
        return Err(format!(
            "--xds-listen {s:?} must be a loopback address: xDS is unauthenticated and Envoy runs beside the control plane"
        ));
    }
    Ok(addr)
}

/// The flags of `run`, before validation (what clap gives).
#[derive(Debug, Clone, Default)]
pub struct RunFlags {
    pub kubeconfig: Option<PathBuf>,
    pub local_apiserver_url: String,
    pub local_lease: Option<String>,
    pub node_name: Option<String>,
    pub peer_cidrs: Vec<String>,
    pub peer_addresses: Vec<String>,
    pub lease_grace: Duration,
    pub peer_ca_file: Option<PathBuf>,
    pub proxy_client_cert_file: Option<PathBuf>,
    pub proxy_client_key_file: Option<PathBuf>,
    pub insecure_plaintext_upstreams: bool,
    pub xds_listen: String,
    pub health_listen: String,
    pub wasm: PathBuf,
    pub initial_sync_timeout: Duration,
    pub discovery_refresh_interval: Duration,
    pub discovery_timeout: Duration,
}

/// Everything `run` needs, validated.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub kubeconfig: Option<PathBuf>,
    pub local: LocalApiserver,
    pub peers: PeerConfig,
    pub scheme: Scheme,
    /// `None` only with `--insecure-plaintext-upstreams`.
    pub upstream_tls: Option<UpstreamTls>,
    pub xds_listen: SocketAddr,
    pub health_listen: SocketAddr,
    pub wasm: PathBuf,
    pub initial_sync_timeout: Duration,
    pub discovery_refresh_interval: Duration,
    pub discovery_timeout: Duration,
}

impl RunConfig {
    /// The id the local apiserver goes by before its lease is seen.
    pub fn local_fallback_id(&self) -> String {
        match &self.peers.local {
            LocalSelector::LeaseName(n) => n.clone(),
            LocalSelector::Hostname(h) => format!("node/{h}"),
            LocalSelector::None => "local".to_string(),
        }
    }
}

fn nonempty(flag: &str, value: &Option<String>) -> Result<Option<String>, String> {
    match value.as_deref().map(str::trim) {
        Some("") => Err(format!("{flag} is empty")),
        Some(v) => Ok(Some(v.to_string())),
        None => Ok(None),
    }
}

fn absolute(flag: &str, path: &Path) -> Result<(), String> {
    if path.is_absolute() {
        Ok(())
    } else {
        Err(format!(
            "{flag} {}: give an absolute path (Envoy resolves relative ones against its own working directory)",
            path.display()
        ))
    }
}

impl RunFlags {
    pub fn validate(&self) -> Result<RunConfig, String> {
        let local = match (
            nonempty("--local-lease", &self.local_lease)?,
            nonempty("--node-name", &self.node_name)?,
        ) {
            (Some(l), None) => LocalSelector::LeaseName(l),
            (None, Some(n)) => LocalSelector::Hostname(n),
            (Some(_), Some(_)) => {
                return Err("give --local-lease or --node-name, not both".to_string())
            }
            (None, None) => {
                return Err(
                    "say which identity lease is the local apiserver's: --local-lease apiserver-<hash> or --node-name <hostname>"
                        .to_string(),
                )
            }
        };
        let cidrs = self
            .peer_cidrs
            .iter()
            .flat_map(|c| c.split(','))
            .map(|c| peers::parse_cidr(c).map_err(|e| format!("--peer-cidr: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        let mapping = self
            .peer_addresses
            .iter()
            .map(|m| {
                m.parse::<MappingEntry>()
                    .map_err(|e| format!("--peer-address {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if self.lease_grace.is_zero() {
            return Err("--lease-grace must be positive".to_string());
        }
        let tls_flags = [
            ("--peer-ca-file", &self.peer_ca_file),
            ("--proxy-client-cert-file", &self.proxy_client_cert_file),
            ("--proxy-client-key-file", &self.proxy_client_key_file),
        ];
        let (scheme, upstream_tls) = if self.insecure_plaintext_upstreams {
            if let Some((flag, _)) = tls_flags.iter().find(|(_, v)| v.is_some()) {
                return Err(format!(
                    "{flag} and --insecure-plaintext-upstreams contradict each other"
                ));
            }
            (Scheme::Http, None)
        } else {
            let missing: Vec<&str> = tls_flags
                .iter()
                .filter(|(_, v)| v.is_none())
                .map(|(f, _)| *f)
                .collect();
            if !missing.is_empty() {
                return Err(format!(
                    "missing {}: Envoy verifies every apiserver against the peer CA and presents the proxy-client certificate (or, for tests on loopback only, --insecure-plaintext-upstreams)",
                    missing.join(", ")
                ));
            }
            let tls = UpstreamTls {
                peer_ca_file: self.peer_ca_file.clone().unwrap_or_default(),
                proxy_client_cert_file: self.proxy_client_cert_file.clone().unwrap_or_default(),
                proxy_client_key_file: self.proxy_client_key_file.clone().unwrap_or_default(),
            };
            absolute("--peer-ca-file", &tls.peer_ca_file)?;
            absolute("--proxy-client-cert-file", &tls.proxy_client_cert_file)?;
            absolute("--proxy-client-key-file", &tls.proxy_client_key_file)?;
            (Scheme::Https, Some(tls))
        };
        let local_api = parse_local_url(self.local_apiserver_url.trim(), scheme)?;
        let xds_listen = parse_xds_listen(&self.xds_listen)?;
        let health_listen: SocketAddr = self
            .health_listen
            .parse()
            .map_err(|_| format!("--health-listen {:?} is not ip:port", self.health_listen))?;
        absolute("--wasm", &self.wasm)?;
        if self.initial_sync_timeout.is_zero()
            || self.discovery_refresh_interval.is_zero()
            || self.discovery_timeout.is_zero()
        {
            return Err(
                "--initial-sync-timeout, --discovery-refresh-interval and --discovery-timeout must be positive"
                    .to_string(),
            );
        }
        Ok(RunConfig {
            kubeconfig: self.kubeconfig.clone(),
            local: local_api,
            peers: PeerConfig {
                grace: self.lease_grace,
                policy: AddressPolicy::new(cidrs, mapping),
                local,
            },
            scheme,
            upstream_tls,
            xds_listen,
            health_listen,
            wasm: self.wasm.clone(),
            initial_sync_timeout: self.initial_sync_timeout,
            discovery_refresh_interval: self.discovery_refresh_interval,
            discovery_timeout: self.discovery_timeout,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_like_kube_flags() {
        let ok = [
            ("60s", 60_000),
            ("1m0s", 60_000),
            ("1m30s", 90_000),
            ("500ms", 500),
            ("1.5s", 1_500),
            ("2h", 7_200_000),
            ("60", 60_000),
            ("0", 0),
        ];
        for (s, ms) in ok {
            assert_eq!(parse_duration(s), Ok(Duration::from_millis(ms)), "{s}");
        }
        for bad in ["", "s", "1x", "-1s", "1 s", "1m s", "ms5", "1e3s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn local_urls() {
        let https = Scheme::Https;
        let l = parse_local_url("https://127.0.0.1:6443", https).expect("ok");
        assert_eq!(l.url, "https://127.0.0.1:6443");
        assert_eq!(l.address, Address::parse("127.0.0.1:6443").expect("a"));
        let l = parse_local_url("https://[::1]:6443/", https).expect("ok");
        assert_eq!(l.url, "https://[::1]:6443");
        assert_eq!(l.address.host, "::1");
        let l = parse_local_url("https://localhost", https).expect("ok");
        assert_eq!(l.url, "https://localhost:443");
        let l = parse_local_url("http://127.0.0.1:8080", Scheme::Http).expect("ok");
        assert_eq!(l.url, "http://127.0.0.1:8080");
        for (bad, scheme) in [
            ("http://127.0.0.1:6443", Scheme::Https),
            ("https://127.0.0.1:6443", Scheme::Http),
            ("https://127.0.0.1:6443/api", Scheme::Https),
            ("https://127.0.0.1:6443/?x=1", Scheme::Https),
            ("https://user:pw@127.0.0.1:6443", Scheme::Https),
            ("127.0.0.1:6443", Scheme::Https),
            ("https://127.0.0.1:0", Scheme::Https),
        ] {
            assert!(parse_local_url(bad, scheme).is_err(), "{bad}");
        }
    }

    fn flags() -> RunFlags {
        RunFlags {
            local_apiserver_url: "https://127.0.0.1:6443".into(),
            node_name: Some("cp-1".into()),
            peer_cidrs: vec!["10.0.0.0/24".into()],
            peer_addresses: vec!["lease/apiserver-x=10.0.1.5:6444".into()],
            lease_grace: Duration::from_secs(30),
            peer_ca_file: Some("/pki/ca.crt".into()),
            proxy_client_cert_file: Some("/pki/front-proxy-client.crt".into()),
            proxy_client_key_file: Some("/pki/front-proxy-client.key".into()),
            xds_listen: "127.0.0.1:18000".into(),
            health_listen: "0.0.0.0:18001".into(),
            wasm: "/opt/skewgate.wasm".into(),
            initial_sync_timeout: Duration::from_secs(30),
            discovery_refresh_interval: Duration::from_secs(30),
            discovery_timeout: Duration::from_secs(10),
            ..Default::default()
        }
    }

    #[test]
    fn run_flags_validate() {
        let c = flags().validate().expect("valid");
        assert_eq!(c.scheme, Scheme::Https);
        assert!(c.upstream_tls.is_some());
        assert_eq!(c.peers.local, LocalSelector::Hostname("cp-1".into()));
        assert_eq!(c.peers.policy.allowed_cidrs.len(), 1);
        assert_eq!(c.peers.policy.by_lease.len(), 1);
        assert_eq!(c.local_fallback_id(), "node/cp-1");

        let plain = RunFlags {
            insecure_plaintext_upstreams: true,
            peer_ca_file: None,
            proxy_client_cert_file: None,
            proxy_client_key_file: None,
            local_apiserver_url: "http://127.0.0.1:8080".into(),
            local_lease: Some("apiserver-abc".into()),
            node_name: None,
            ..flags()
        };
        let c = plain.validate().expect("valid");
        assert_eq!(c.scheme, Scheme::Http);
        assert!(c.upstream_tls.is_none());
        assert_eq!(c.local_fallback_id(), "apiserver-abc");

        let bad: Vec<(&str, RunFlags)> = vec![
            (
                "no local selector",
                RunFlags {
                    node_name: None,
                    ..flags()
                },
            ),
            (
                "both selectors",
                RunFlags {
                    local_lease: Some("apiserver-a".into()),
                    ..flags()
                },
            ),
            (
                "missing proxy-client key",
                RunFlags {
                    proxy_client_key_file: None,
                    ..flags()
                },
            ),
            (
                "plaintext and TLS at once",
                RunFlags {
                    insecure_plaintext_upstreams: true,
                    local_apiserver_url: "http://127.0.0.1:8080".into(),
                    ..flags()
                },
            ),
            (
                "plaintext URL without the opt-out",
                RunFlags {
                    local_apiserver_url: "http://127.0.0.1:8080".into(),
                    ..flags()
                },
            ),
            (
                "xDS not on loopback",
                RunFlags {
                    xds_listen: "0.0.0.0:18000".into(),
                    ..flags()
                },
            ),
            (
                "bad CIDR",
                RunFlags {
                    peer_cidrs: vec!["10.0.0.0/33".into()],
                    ..flags()
                },
            ),
            (
                "bad mapping",
                RunFlags {
                    peer_addresses: vec!["lease/x=evil.com:443".into()],
                    ..flags()
                },
            ),
            (
                "relative wasm",
                RunFlags {
                    wasm: "skewgate.wasm".into(),
                    ..flags()
                },
            ),
            (
                "zero grace",
                RunFlags {
                    lease_grace: Duration::ZERO,
                    ..flags()
                },
            ),
        ];
        for (what, f) in bad {
            assert!(f.validate().is_err(), "{what}");
        }
        // Comma-separated CIDRs are accepted too.
        let c = RunFlags {
            peer_cidrs: vec!["10.0.0.0/24,fd00::/64".into()],
            ..flags()
        }
        .validate()
        .expect("valid");
        assert_eq!(c.peers.policy.allowed_cidrs.len(), 2);
    }
}
