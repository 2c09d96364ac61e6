//! The flags more than one subcommand takes, defined once: each setting has one flag, one
//! typed value parser and one default, and errors are typed ([`FlagError`]). kube-apiserver's
//! names where the meaning is the same (`--tls-cert-file`, `--request-timeout`, ...).
//!
//! - [`ListenerFlags`]: how Envoy serves clients (`bootstrap`, `render-static`);
//! - [`LocalChannelFlags`]: where Envoy's admin interface and the xDS stream are (`run`,
//!   `bootstrap`, `render-static`): Unix sockets in `--socket-dir`, or loopback TCP;
//! - [`UpstreamTlsFlags`]: how Envoy and the control plane reach apiservers (`run`,
//!   `render-static`, and `bootstrap` for its fallback clusters);
//! - [`DataPlaneFlags`]: which filter Envoy runs and its file (`run`, `bootstrap`,
//!   `render-static`);
//! - [`parse_control_plane_wait`]: `bootstrap --control-plane-wait`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::envoy::resources::{DataPlane, FilterCode};
use crate::envoy::{Address, ServingTls, UpstreamTls};
use crate::local_channels::{
    LocalChannels, DEFAULT_ADMIN_PORT, DEFAULT_SOCKET_DIR, DEFAULT_XDS_ADDRESS,
};

/// `--state-dir`'s default, for `run` (which keeps its state there) and `bootstrap` (which
/// renders Envoy's fallback from it): the same directory, so that the safe setting (retention
/// and the last acknowledged configuration surviving a restart) needs no flag.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/skewgate";

/// A flag whose value, or whose combination with other flags, cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlagError {
    /// A value parser refused a value (clap names the flag).
    #[error("{value:?}: {reason}")]
    Value { value: String, reason: String },
    /// A flag's value, refused after parsing.
    #[error("{flag} {value:?}: {reason}")]
    Flag {
        flag: &'static str,
        value: String,
        reason: String,
    },
    /// Flags that do not go together, or one that is missing.
    #[error("{0}")]
    Combination(String),
}

impl FlagError {
    pub fn value(value: &str, reason: impl Into<String>) -> Self {
        FlagError::Value {
            value: value.to_string(),
            reason: reason.into(),
        }
    }

    pub fn flag(flag: &'static str, value: impl ToString, reason: impl Into<String>) -> Self {
        FlagError::Flag {
            flag,
            value: value.to_string(),
            reason: reason.into(),
        }
    }
}

/// How this control plane and Envoy reach apiservers (the local one and its peers alike).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Https,
    /// `--insecure-plaintext-upstreams`: tests and demos on loopback only.
    Http,
}

impl Scheme {
    pub fn url(self, address: SocketAddr) -> String {
        match self {
            Scheme::Https => format!("https://{address}"),
            Scheme::Http => format!("http://{address}"),
        }
    }
}

/// The longest duration a flag takes (about 31 years): any longer is a typo, and one near
/// `u64::MAX` seconds would overflow the arithmetic on instants that every duration flag
/// feeds (a panic in a long-running task).
const MAX_DURATION_SECONDS: u64 = 1_000_000_000;

/// A duration the way kube-apiserver's flags take it (Go's `time.ParseDuration`: `60s`,
/// `1m0s`, `1m30s`, `500ms`, `1h`), or a bare number of seconds; at most
/// [`MAX_DURATION_SECONDS`].
pub fn parse_duration(s: &str) -> Result<Duration, FlagError> {
    let s = s.trim();
    let bad = || FlagError::value(s, "not a duration (like 30s, 1m0s, 500ms, or seconds)");
    if s.is_empty() {
        return Err(bad());
    }
    if s.bytes().all(|b| b.is_ascii_digit()) {
        return match s.parse::<u64>() {
            Ok(secs) if secs <= MAX_DURATION_SECONDS => Ok(Duration::from_secs(secs)),
            _ => Err(too_long(s)),
        };
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
    if !total.is_finite() || total > MAX_DURATION_SECONDS as f64 {
        return Err(too_long(s));
    }
    Ok(Duration::from_secs_f64(total))
}

fn too_long(s: &str) -> FlagError {
    FlagError::value(
        s,
        format!("longer than the longest duration taken ({MAX_DURATION_SECONDS} seconds)"),
    )
}

/// An apiserver's or a peer port's `host:port` (the port must be given).
pub fn parse_address(s: &str) -> Result<Address, FlagError> {
    Address::parse(s).map_err(|e| FlagError::value(s, e.to_string()))
}

/// An address to listen on (port 0: the kernel chooses).
pub fn parse_listen_address(s: &str) -> Result<Address, FlagError> {
    Address::parse_listen(s).map_err(|e| FlagError::value(s, e.to_string()))
}

/// A numeric `ip:port` to bind.
pub fn parse_socket_address(s: &str) -> Result<SocketAddr, FlagError> {
    s.parse()
        .map_err(|_| FlagError::value(s, "not ip:port (a numeric address)"))
}

/// A CIDR (`10.0.0.0/24`, `fd00::/64`; a bare address is a /32 or /128).
pub fn parse_cidr(s: &str) -> Result<ipnet::IpNet, FlagError> {
    crate::peers::parse_cidr(s).map_err(|e| FlagError::value(s, e))
}

/// Which filter Envoy runs, and where Envoy finds it.
#[derive(Debug, Clone, clap::Args)]
pub struct DataPlaneFlags {
    /// Which build of the filter Envoy runs: `wasm`, the proxy-wasm filter in Envoy's V8
    /// sandbox (portable across Envoy versions); or `native`, the same filter as an Envoy
    /// dynamic module (Envoy's own speed, no sandbox: a crash is Envoy's; only for the Envoy
    /// version it was built for, 1.40).
    #[arg(long, value_enum, default_value_t = DataPlane::Wasm, value_name = "wasm|native")]
    pub data_plane: DataPlane,
    /// skewgate_filter.wasm as Envoy sees it (absolute path), for `--data-plane wasm`.
    #[arg(long, value_name = "PATH")]
    pub wasm: Option<PathBuf>,
    /// libskewgate_native.so as Envoy sees it (absolute path), for `--data-plane native`.
    #[arg(long, value_name = "PATH")]
    pub native_module: Option<PathBuf>,
}

impl DataPlaneFlags {
    /// The filter's code; `None` when its path is not given (`bootstrap` without a fallback
    /// needs none). The other data plane's path may be given and is not used: the deploy files
    /// name both builds, and `--data-plane` alone switches (deploy/args, `$(DATA_PLANE)`).
    pub fn resolve(&self) -> Result<Option<FilterCode>, FlagError> {
        let path = match self.data_plane {
            DataPlane::Wasm => &self.wasm,
            DataPlane::Native => &self.native_module,
        };
        let Some(path) = path else {
            return Ok(None);
        };
        let flag = self.data_plane.path_flag();
        absolute(flag, path)?;
        FilterCode::new(self.data_plane, path)
            .map(Some)
            .map_err(|e| FlagError::flag(flag, path.display(), e.to_string()))
    }

    /// The filter's code, which must be given.
    pub fn require(&self) -> Result<FilterCode, FlagError> {
        self.resolve()?.ok_or_else(|| {
            FlagError::Combination(format!(
                "--data-plane {} needs {}",
                self.data_plane.name(),
                self.data_plane.path_flag()
            ))
        })
    }
}

/// Envoy resolves relative paths against its own working directory: refuse them.
pub fn absolute(flag: &'static str, path: &Path) -> Result<(), FlagError> {
    if path.is_absolute() {
        Ok(())
    } else {
        Err(FlagError::flag(
            flag,
            path.display(),
            "give an absolute path (Envoy resolves relative ones against its own working directory)",
        ))
    }
}

/// `--sds-dir` of `run` and `bootstrap`: where the SDS files of the certificates Envoy uses
/// are written (`crate::envoy::secrets`). Needed, and absolute, when there is TLS (`tls`);
/// `None` otherwise.
pub fn sds_dir(value: Option<&Path>, tls: bool) -> Result<Option<PathBuf>, FlagError> {
    match (value, tls) {
        (_, false) => Ok(None),
        (None, true) => Err(FlagError::Combination(
            "TLS needs --sds-dir: a directory Envoy can read where the SDS files naming the certificates are written, so that renewed certificates take effect without a restart".into(),
        )),
        (Some(dir), true) => {
            absolute("--sds-dir", dir)?;
            Ok(Some(dir.to_path_buf()))
        }
    }
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
pub fn parse_local_url(url: &str, scheme: Scheme) -> Result<LocalApiserver, FlagError> {
    let bad = |why: String| FlagError::flag("--local-apiserver-url", url, why);
    let uri: http::Uri = url.parse().map_err(|e| bad(format!("{e}")))?;
    let (want, default_port) = match scheme {
        Scheme::Https => ("https", 443),
        Scheme::Http => ("http", 80),
    };
    if uri.scheme_str() != Some(want) {
        return Err(bad(match scheme {
            Scheme::Https => {
                "must be https:// (http:// only with --insecure-plaintext-upstreams)".into()
            }
            Scheme::Http => "must be http:// with --insecure-plaintext-upstreams (Envoy would speak plaintext to it)".into(),
        }));
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(bad("an apiserver URL has no path or query".into()));
    }
    let authority = uri.authority().ok_or_else(|| bad("no host".into()))?;
    if authority.as_str().contains('@') {
        return Err(bad("no credentials in the URL".into()));
    }
    let port = authority.port_u16().unwrap_or(default_port);
    // IPv6 hosts keep their brackets here.
    let host_port = format!("{}:{port}", authority.host());
    let address = Address::parse(&host_port).map_err(|e| bad(e.to_string()))?;
    Ok(LocalApiserver {
        url: format!("{want}://{host_port}"),
        address,
    })
}

/// `--xds-address`: the ADS port carries no authentication, so it must be loopback.
pub fn parse_xds_address(s: &str) -> Result<SocketAddr, FlagError> {
    let addr = parse_socket_address(s)?;
    if !addr.ip().is_loopback() {
        return Err(FlagError::value(
            s,
            "must be a loopback address: xDS is unauthenticated and Envoy runs beside the control plane",
        ));
    }
    Ok(addr)
}

/// `bootstrap --control-plane-wait`: how long a starting Envoy waits for its control plane before
/// it serves the fallback (`crate::envoy::fallback`); `0` waits forever (ports closed until the
/// first sync). Otherwise at least [`crate::envoy::fallback::MIN_WAIT`], so that neither of
/// Envoy's two waits (CDS, then ECDS) becomes 0, which Envoy reads as "forever".
pub fn parse_control_plane_wait(s: &str) -> Result<Duration, FlagError> {
    let wait = parse_duration(s)?;
    if !wait.is_zero() && wait < crate::envoy::fallback::MIN_WAIT {
        return Err(FlagError::value(
            s,
            "too short to split between Envoy's two waits (give 0 to wait forever)",
        ));
    }
    Ok(wait)
}

/// How Envoy serves clients: the same flags for `bootstrap` and `render-static`.
#[derive(clap::Args, Debug, Clone)]
pub struct ListenerFlags {
    /// Address Envoy listens on for clients (the apiserver's advertised address and port).
    #[arg(long, default_value = "127.0.0.1:6443", value_parser = parse_listen_address, value_name = "IP:PORT")]
    pub listen: Address,
    /// The apiservers' --request-timeout (kube's default 1m0s): Envoy bounds non-long-running
    /// requests by 10s more, so an apiserver that never answers becomes a 503.
    #[arg(long, default_value = "60s", value_parser = parse_duration, value_name = "DURATION")]
    pub request_timeout: Duration,
    /// Also open the peer port here (the peer-advertise address): TLS passed through at L4 to
    /// the apiserver itself, for the other apiservers' Envoys.
    #[arg(long, value_parser = parse_address, value_name = "IP:PORT")]
    pub peer_listen: Option<Address>,
    #[command(flatten)]
    pub peer_cidrs: PeerCidrs,
    /// The apiserver's serving certificate, which Envoy presents to clients in its place.
    #[arg(long, value_name = "PATH", requires = "tls_private_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// The key of --tls-cert-file.
    #[arg(long, value_name = "PATH", requires = "tls_cert_file")]
    pub tls_private_key_file: Option<PathBuf>,
    /// The cluster's client CA: client certificates are optional and verified against it; a
    /// verified one becomes X-Remote-User/X-Remote-Group towards the apiservers.
    #[arg(long, value_name = "PATH", requires = "tls_cert_file")]
    pub client_ca_file: Option<PathBuf>,
    /// Serve clients in plaintext. Tests and demos on loopback only.
    #[arg(long, conflicts_with = "tls_cert_file")]
    pub insecure_plaintext_listener: bool,
}

impl ListenerFlags {
    /// The listener's TLS, or `None` with `--insecure-plaintext-listener`.
    pub fn serving_tls(&self) -> Result<Option<ServingTls>, FlagError> {
        match (
            &self.tls_cert_file,
            &self.tls_private_key_file,
            self.insecure_plaintext_listener,
        ) {
            (Some(cert), Some(key), false) => {
                absolute("--tls-cert-file", cert)?;
                absolute("--tls-private-key-file", key)?;
                if let Some(ca) = &self.client_ca_file {
                    absolute("--client-ca-file", ca)?;
                }
                Ok(Some(ServingTls {
                    cert_file: cert.clone(),
                    key_file: key.clone(),
                    client_ca_file: self.client_ca_file.clone(),
                }))
            }
            (None, None, true) if self.client_ca_file.is_none() => Ok(None),
            (_, _, true) => Err(FlagError::Combination(
                "--insecure-plaintext-listener and --tls-cert-file, --tls-private-key-file or --client-ca-file contradict each other".into(),
            )),
            _ => Err(FlagError::Combination(
                "give --tls-cert-file and --tls-private-key-file (or, on loopback only, --insecure-plaintext-listener)".into(),
            )),
        }
    }

    /// The peer port must not be the client port, and only peers may connect to it: it
    /// passes TLS straight to the apiserver, past the filter.
    pub fn peer_listen(&self) -> Result<Option<&Address>, FlagError> {
        match &self.peer_listen {
            Some(peer) if *peer == self.listen => Err(FlagError::Combination(
                "--peer-listen must differ from --listen".into(),
            )),
            Some(_) if self.peer_cidrs.peer_cidrs.is_empty() => Err(FlagError::Combination(
                "--peer-listen needs --peer-cidr: only the other apiservers' Envoys may reach the peer port, which passes TLS to the apiserver past the filter".into(),
            )),
            other => Ok(other.as_ref()),
        }
    }
}

/// Where Envoy's admin interface and the xDS stream are (`crate::local_channels`): the same
/// flags for `run` and `bootstrap`, which must agree, and `render-static` (admin only).
#[derive(clap::Args, Debug, Clone)]
pub struct LocalChannelFlags {
    /// Directory of the Unix sockets of Envoy's admin interface (envoy-admin.sock) and of the
    /// xDS stream (xds.sock), both mode 0600: run Envoy and skewgate-control as the same user.
    /// Created with mode 0700 if missing; refused if another user owns it or group or others
    /// may write to it.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_SOCKET_DIR, conflicts_with = "insecure_tcp_local_channels")]
    pub socket_dir: PathBuf,
    /// Put Envoy's admin interface and xDS on loopback TCP instead (--admin-port,
    /// --xds-address). Any process on the node can then reach them: stop Envoy, dump its
    /// configuration, or serve it clusters while the control plane restarts.
    #[arg(long)]
    pub insecure_tcp_local_channels: bool,
    /// With --insecure-tcp-local-channels: Envoy's admin port on 127.0.0.1 (default 9901; 0:
    /// the kernel chooses).
    #[arg(long, value_name = "PORT", requires = "insecure_tcp_local_channels")]
    pub admin_port: Option<u16>,
    /// With --insecure-tcp-local-channels: the loopback address the xDS server listens on and
    /// Envoy connects to (default 127.0.0.1:18000).
    #[arg(long, value_parser = parse_xds_address, value_name = "IP:PORT", requires = "insecure_tcp_local_channels")]
    pub xds_address: Option<SocketAddr>,
}

impl LocalChannelFlags {
    /// The two channels, checked (the socket directory is not touched here:
    /// [`LocalChannels::prepare`]).
    pub fn resolve(&self) -> Result<LocalChannels, FlagError> {
        if self.insecure_tcp_local_channels {
            return Ok(LocalChannels::tcp(
                self.admin_port.unwrap_or(DEFAULT_ADMIN_PORT),
                self.xds_address.unwrap_or(DEFAULT_XDS_ADDRESS),
            ));
        }
        LocalChannels::unix(&self.socket_dir)
            .map_err(|e| FlagError::flag("--socket-dir", self.socket_dir.display(), e.to_string()))
    }
}

/// Where the other control-plane nodes are: their peer-advertise addresses must be inside
/// (`run`), and only they may connect to the peer port (`bootstrap`, `render-static`).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PeerCidrs {
    /// A CIDR the other control-plane nodes are in (repeatable, or comma-separated). `run`
    /// accepts peer-advertise addresses only inside; the peer port accepts connections only
    /// from inside.
    #[arg(long = "peer-cidr", value_name = "CIDR", value_delimiter = ',', value_parser = parse_cidr)]
    pub peer_cidrs: Vec<ipnet::IpNet>,
}

/// How Envoy (and the control plane's own discovery fetches) reach apiservers: the same flags
/// for `run`, `render-static` and `bootstrap` (its fallback clusters).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct UpstreamTlsFlags {
    /// The CA that signed the apiservers' serving certificates; they are verified with the name
    /// kubernetes.default.svc.
    #[arg(long, value_name = "PATH")]
    pub peer_ca_file: Option<PathBuf>,
    /// The certificate the apiservers accept for requestheader authentication, presented by
    /// Envoy's -identity clusters; it must not chain to the client CA.
    #[arg(long, value_name = "PATH")]
    pub proxy_client_cert_file: Option<PathBuf>,
    /// The key of --proxy-client-cert-file.
    #[arg(long, value_name = "PATH")]
    pub proxy_client_key_file: Option<PathBuf>,
    /// Speak plaintext HTTP to every apiserver. Tests and demos on loopback only.
    #[arg(long, conflicts_with = "peer_ca_file")]
    pub insecure_plaintext_upstreams: bool,
}

impl UpstreamTlsFlags {
    /// The upstream TLS, or plaintext with `--insecure-plaintext-upstreams`.
    pub fn resolve(&self) -> Result<(Scheme, Option<UpstreamTls>), FlagError> {
        let tls_flags = [
            ("--peer-ca-file", &self.peer_ca_file),
            ("--proxy-client-cert-file", &self.proxy_client_cert_file),
            ("--proxy-client-key-file", &self.proxy_client_key_file),
        ];
        if self.insecure_plaintext_upstreams {
            if let Some((flag, _)) = tls_flags.iter().find(|(_, v)| v.is_some()) {
                return Err(FlagError::Combination(format!(
                    "{flag} and --insecure-plaintext-upstreams contradict each other"
                )));
            }
            return Ok((Scheme::Http, None));
        }
        let (Some(ca), Some(cert), Some(key)) = (
            &self.peer_ca_file,
            &self.proxy_client_cert_file,
            &self.proxy_client_key_file,
        ) else {
            let missing: Vec<&str> = tls_flags
                .iter()
                .filter(|(_, v)| v.is_none())
                .map(|(f, _)| *f)
                .collect();
            return Err(FlagError::Combination(format!(
                "missing {}: Envoy verifies every apiserver against the peer CA and presents the proxy-client certificate (or, for tests on loopback only, --insecure-plaintext-upstreams)",
                missing.join(", ")
            )));
        };
        absolute("--peer-ca-file", ca)?;
        absolute("--proxy-client-cert-file", cert)?;
        absolute("--proxy-client-key-file", key)?;
        Ok((
            Scheme::Https,
            Some(UpstreamTls {
                peer_ca_file: ca.clone(),
                proxy_client_cert_file: cert.clone(),
                proxy_client_key_file: key.clone(),
            }),
        ))
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
        // Bounded either way it is written: a bare number of seconds too (one near u64::MAX
        // panicked later, adding it to an instant).
        assert_eq!(
            parse_duration("1000000000"),
            Ok(Duration::from_secs(1_000_000_000))
        );
        for too_long in [
            "1000000001",
            "18446744073709551615",
            "99999999999999999999999",
            "1000000001s",
            "300000h",
        ] {
            let e = parse_duration(too_long).expect_err(too_long).to_string();
            assert!(e.contains("longer than the longest duration"), "{e}");
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

    #[derive(clap::Parser, Debug)]
    struct Flags {
        #[command(flatten)]
        listener: ListenerFlags,
        #[command(flatten)]
        upstream: UpstreamTlsFlags,
        #[command(flatten)]
        channels: LocalChannelFlags,
    }

    fn parse(args: &[&str]) -> Result<Flags, clap::Error> {
        use clap::Parser;
        Flags::try_parse_from(std::iter::once("t").chain(args.iter().copied()))
    }

    #[test]
    fn local_channels_are_unix_sockets_unless_tcp_is_asked_for() {
        use crate::local_channels::LocalChannel;
        let plain = [
            "--insecure-plaintext-listener",
            "--insecure-plaintext-upstreams",
        ];
        let channels = |extra: &[&str]| {
            parse(&[plain.as_slice(), extra].concat()).map(|f| f.channels.resolve())
        };
        let c = channels(&[]).expect("parses").expect("valid");
        assert_eq!(
            c.admin(),
            &LocalChannel::Unix("/run/skewgate/envoy-admin.sock".into())
        );
        assert_eq!(
            c.xds(),
            &LocalChannel::Unix("/run/skewgate/xds.sock".into())
        );
        let c = channels(&["--socket-dir=/var/run/sg"])
            .expect("parses")
            .expect("valid");
        assert_eq!(c.xds(), &LocalChannel::Unix("/var/run/sg/xds.sock".into()));
        let c = channels(&["--insecure-tcp-local-channels"])
            .expect("parses")
            .expect("valid");
        assert_eq!(
            c.admin(),
            &LocalChannel::Tcp("127.0.0.1:9901".parse().expect("a"))
        );
        assert_eq!(
            c.xds(),
            &LocalChannel::Tcp("127.0.0.1:18000".parse().expect("a"))
        );
        let c = channels(&[
            "--insecure-tcp-local-channels",
            "--admin-port=0",
            "--xds-address=[::1]:18010",
        ])
        .expect("parses")
        .expect("valid");
        assert_eq!(
            c.admin(),
            &LocalChannel::Tcp("127.0.0.1:0".parse().expect("a"))
        );
        assert_eq!(
            c.xds(),
            &LocalChannel::Tcp("[::1]:18010".parse().expect("a"))
        );
        // TCP only when asked for by name, on loopback only; a relative directory never.
        assert!(channels(&["--admin-port=9901"]).is_err());
        assert!(channels(&["--xds-address=127.0.0.1:18000"]).is_err());
        assert!(channels(&["--insecure-tcp-local-channels", "--socket-dir=/run/x"]).is_err());
        assert!(channels(&[
            "--insecure-tcp-local-channels",
            "--xds-address=10.0.0.1:18000"
        ])
        .is_err());
        assert!(channels(&["--socket-dir=run/skewgate"])
            .expect("parses")
            .is_err());
    }

    #[test]
    fn listener_and_upstream_tls_flags() {
        let tls = [
            "--tls-cert-file=/pki/apiserver.crt",
            "--tls-private-key-file=/pki/apiserver.key",
            "--client-ca-file=/pki/ca.crt",
        ];
        let upstream = [
            "--peer-ca-file=/pki/ca.crt",
            "--proxy-client-cert-file=/pki/fp.crt",
            "--proxy-client-key-file=/pki/fp.key",
        ];
        let all: Vec<&str> = tls.iter().chain(&upstream).copied().collect();
        let f = parse(&all).expect("parses");
        assert!(f.listener.serving_tls().expect("valid").is_some());
        assert_eq!(
            f.listener.listen,
            parse_address("127.0.0.1:6443").expect("a")
        );
        assert_eq!(f.listener.request_timeout, Duration::from_secs(60));
        assert_eq!(f.upstream.resolve().expect("valid").0, Scheme::Https);
        let f = parse(&[
            "--insecure-plaintext-listener",
            "--insecure-plaintext-upstreams",
            "--request-timeout=90",
        ])
        .expect("parses");
        assert!(f.listener.serving_tls().expect("valid").is_none());
        assert_eq!(f.upstream.resolve().expect("valid"), (Scheme::Http, None));
        assert_eq!(f.listener.request_timeout, Duration::from_secs(90));

        // Refused by the parser or by validation, never accepted.
        let refused = |args: &[&str]| match parse(args) {
            Err(_) => true,
            Ok(f) => {
                f.listener.serving_tls().is_err()
                    || f.listener.peer_listen().is_err()
                    || f.upstream.resolve().is_err()
            }
        };
        let plain_up = "--insecure-plaintext-upstreams";
        let plain_down = "--insecure-plaintext-listener";
        for bad in [
            vec![plain_up],
            vec![plain_down],
            vec![plain_down, plain_up, tls[0], tls[1]],
            vec![plain_down, plain_up, upstream[0]],
            vec![plain_down, upstream[0], upstream[1]],
            vec![
                plain_up,
                "--tls-cert-file=apiserver.crt",
                "--tls-private-key-file=/k",
            ],
            vec![
                plain_down,
                "--peer-ca-file=ca.crt",
                upstream[1],
                upstream[2],
            ],
            vec![
                plain_down,
                plain_up,
                "--listen=10.0.0.1:6443",
                "--peer-listen=10.0.0.1:6443",
            ],
            vec![plain_down, plain_up, "--request-timeout=soon"],
            vec![plain_down, plain_up, "--listen=[::1]"],
        ] {
            assert!(refused(&bad), "{bad:?}");
        }
    }
}
