//! `skewgate-control run`'s flags and their validation into a [`RunConfig`], as pure
//! functions (table-tested). Flags shared with other subcommands are in [`crate::flags`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::envoy::resources::FilterCode;
use crate::envoy::UpstreamTls;
use crate::flags::DataPlaneFlags;
use crate::flags::{
    parse_duration, parse_local_url, parse_socket_address, sds_dir, FlagError, LocalApiserver,
    LocalChannelFlags, PeerCidrs, Scheme, UpstreamTlsFlags, DEFAULT_STATE_DIR,
};
use crate::local_channels::LocalChannels;
use crate::peers::{AddressPolicy, LocalSelector, MappingEntry, PeerConfig};

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// `time level target: message key=value ...`
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

/// `skewgate-control run`: the live control plane beside one Envoy.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Kubeconfig for the identity Lease, CRD and APIService watches, and the credentials
    /// discovery is fetched with from every apiserver (in-cluster or $KUBECONFIG if omitted).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// How this control plane reaches the apiserver its Envoy fronts, for discovery and for
    /// Envoy's skewgate-local clusters (e.g. https://127.0.0.1:6443).
    #[arg(long, value_name = "URL")]
    pub local_apiserver_url: String,
    /// The local apiserver's identity Lease (apiserver-<hash>).
    #[arg(long, value_name = "NAME", conflicts_with = "node_name")]
    pub local_lease: Option<String>,
    /// Or: the local apiserver's host name (its Lease's kubernetes.io/hostname label).
    #[arg(long, value_name = "HOSTNAME")]
    pub node_name: Option<String>,
    /// Peer-advertise-address annotations must be inside; without any, every annotation is
    /// refused.
    #[command(flatten)]
    pub peer_cidrs: PeerCidrs,
    /// The port of every peer's Envoy peer listener (`bootstrap --peer-listen`): a peer's
    /// Lease annotation gives its address, reached at this port. kube-apiserver 1.36 and 1.37
    /// advertise --advertise-address with their own --secure-port whatever
    /// --peer-advertise-ip/--peer-advertise-port say, and under skewgate that is Envoy's client
    /// port. Without it the annotation's port is used as it is. --peer-address entries keep
    /// their own port.
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub peer_port: Option<u16>,
    /// A peer address the operator vouches for: lease/<lease-name>=ip:port or
    /// host/<hostname>=ip:port (repeatable). Wins over the lease's annotation.
    #[arg(long = "peer-address", value_name = "KIND/NAME=IP:PORT")]
    pub peer_addresses: Vec<String>,
    /// A peer whose Lease was not renewed for this long is dead (kube renews every 10s).
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub lease_grace: Duration,
    /// At most this many live peers are routed to and fetched (an HA control plane has 3–7
    /// apiservers). Beyond it, leases are left out, logged and counted: the operator's
    /// --peer-address mapping first, then the longest known, then the smallest name.
    #[arg(long, default_value_t = crate::peers::DEFAULT_MAX_PEERS, value_name = "N")]
    pub max_peers: usize,
    /// At most one discovery refetch per peer in this interval is triggered by a new holder
    /// identity (an apiserver restart); further changes within it are coalesced into one
    /// refetch at its end, so a Lease whose holder changes on every renewal cannot make us
    /// refetch on every renewal.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub holder_refetch_interval: Duration,
    #[command(flatten)]
    pub upstream: UpstreamTlsFlags,
    /// A directory Envoy can read (absolute; needed with TLS) where the SDS files of the peer
    /// CA and the proxy-client certificate are written at start: Envoy reads the certificates
    /// through them and follows renewals without a restart. `bootstrap --sds-dir` may name the
    /// same directory.
    #[arg(long, value_name = "DIR")]
    pub sds_dir: Option<PathBuf>,
    /// Where delta ADS is served to Envoy (and where Envoy's admin interface is): the same as
    /// `skewgate-control bootstrap` was given.
    #[command(flatten)]
    pub channels: LocalChannelFlags,
    /// Where to serve /healthz, /readyz and /metrics.
    #[arg(long, default_value = "127.0.0.1:18001", value_parser = parse_socket_address, value_name = "IP:PORT")]
    pub health_listen: SocketAddr,
    /// Where to serve /debug/skew (the routing table, the peers, their last errors; no
    /// authentication): a loopback address only. Off without it.
    #[arg(long, value_parser = crate::health::parse_debug_listen, value_name = "IP:PORT")]
    pub debug_listen: Option<SocketAddr>,
    #[command(flatten)]
    pub data_plane: DataPlaneFlags,
    /// The first snapshot waits for the identity leases and every live peer's discovery for at
    /// most this long (the local apiserver's discovery is always needed).
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub initial_sync_timeout: Duration,
    /// How often each apiserver's discovery is revalidated (conditional requests).
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub discovery_refresh_interval: Duration,
    /// Per discovery request.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub discovery_timeout: Duration,
    /// How long the APIs of a peer apiserver that left stay in merged discovery (marked Stale
    /// where no live apiserver serves the group-version) and answer 503 instead of the local
    /// 404. It ends earlier when the apiserver is back with fresh discovery. 0 disables it.
    #[arg(long, default_value = "15m", value_parser = parse_duration, value_name = "DURATION")]
    pub api_retention: Duration,
    /// A directory of this control plane's own where every peer's last good discovery and
    /// seniority under --max-peers are kept (at most --max-peers departed peers besides the live
    /// ones), so the API retention and the cap's order survive a restart, and the last
    /// configuration Envoy acknowledged, which `bootstrap --state-dir` renders as Envoy's
    /// fallback. Created 0700, tightened to 0700 when this user owns it, refused when another
    /// user does; files are 0600.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// When the local apiserver's discovery fetch (every second) has failed this long, every
    /// client connection of Envoy is told to go away (HTTP/2 GOAWAY, HTTP/1.1 `Connection:
    /// close`) at its next response, so clients pinned to this node move through the load
    /// balancer instead of being served by the peers for minutes; undone when it answers
    /// again. Shorter outages are ridden out on the peers (failover). 0 disables it. Needs the
    /// socket directory (not with --insecure-tcp-local-channels).
    #[arg(long, default_value = super::local_down::DEFAULT_LOCAL_DOWN_GOAWAY_AFTER, value_parser = parse_duration, value_name = "DURATION")]
    pub local_down_goaway_after: Duration,
    /// How log lines are written on standard error: `text` (key=value) or `json` (one object
    /// per line).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// The least severe level logged.
    #[arg(long, value_enum, default_value_t = LogLevel::Info)]
    pub log_level: LogLevel,
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
    /// `--sds-dir`, with `upstream_tls`.
    pub sds_dir: Option<PathBuf>,
    /// Envoy's admin interface and the xDS server.
    pub local_channels: LocalChannels,
    pub health_listen: SocketAddr,
    /// `None`: `/debug/skew` is not served.
    pub debug_listen: Option<SocketAddr>,
    pub filter_code: FilterCode,
    pub initial_sync_timeout: Duration,
    pub discovery_refresh_interval: Duration,
    pub discovery_timeout: Duration,
    pub holder_refetch_interval: Duration,
    pub api_retention: Duration,
    /// `--state-dir` (the flags always give one: [`DEFAULT_STATE_DIR`] by default).
    pub state_dir: Option<PathBuf>,
    /// `--local-down-goaway-after` ([`super::local_down`]); zero: never.
    pub local_down_goaway_after: Duration,
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

fn nonempty(flag: &'static str, value: &Option<String>) -> Result<Option<String>, FlagError> {
    match value.as_deref().map(str::trim) {
        Some("") => Err(FlagError::flag(flag, "", "is empty")),
        Some(v) => Ok(Some(v.to_string())),
        None => Ok(None),
    }
}

impl RunArgs {
    /// Everything `run` needs, checked.
    pub fn validate(&self) -> Result<RunConfig, FlagError> {
        let local = match (
            nonempty("--local-lease", &self.local_lease)?,
            nonempty("--node-name", &self.node_name)?,
        ) {
            (Some(l), None) => LocalSelector::LeaseName(l),
            (None, Some(n)) => LocalSelector::Hostname(n),
            (Some(_), Some(_)) => {
                return Err(FlagError::Combination(
                    "give --local-lease or --node-name, not both".into(),
                ))
            }
            (None, None) => {
                return Err(FlagError::Combination(
                    "say which identity lease is the local apiserver's: --local-lease apiserver-<hash> or --node-name <hostname>".into(),
                ))
            }
        };
        let cidrs = self.peer_cidrs.peer_cidrs.clone();
        let mapping = self
            .peer_addresses
            .iter()
            .map(|m| {
                m.parse::<MappingEntry>()
                    .map_err(|e| FlagError::flag("--peer-address", m, e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if self.lease_grace.is_zero() {
            return Err(FlagError::flag("--lease-grace", "0s", "must be positive"));
        }
        if self.max_peers == 0 {
            return Err(FlagError::flag(
                "--max-peers",
                "0",
                "must be at least 1 (peers are found by their identity Leases)",
            ));
        }
        let (scheme, upstream_tls) = self.upstream.resolve()?;
        let local_channels = self.channels.resolve()?;
        let sds_dir = sds_dir(self.sds_dir.as_deref(), upstream_tls.is_some())?;
        let local_api = parse_local_url(self.local_apiserver_url.trim(), scheme)?;
        let filter_code = self.data_plane.require()?;
        if self.debug_listen == Some(self.health_listen) {
            return Err(FlagError::Combination(
                "--debug-listen and --health-listen must differ (two listeners, so /metrics can be exposed without /debug/skew)".into(),
            ));
        }
        if self.initial_sync_timeout.is_zero()
            || self.discovery_refresh_interval.is_zero()
            || self.discovery_timeout.is_zero()
        {
            return Err(FlagError::Combination(
                "--initial-sync-timeout, --discovery-refresh-interval and --discovery-timeout must be positive".into(),
            ));
        }
        Ok(RunConfig {
            kubeconfig: self.kubeconfig.clone(),
            local: local_api,
            peers: PeerConfig {
                grace: self.lease_grace,
                policy: AddressPolicy::new(cidrs, mapping).with_peer_port(self.peer_port),
                local,
                max_peers: self.max_peers,
            },
            scheme,
            upstream_tls,
            sds_dir,
            local_channels,
            health_listen: self.health_listen,
            debug_listen: self.debug_listen,
            filter_code,
            initial_sync_timeout: self.initial_sync_timeout,
            discovery_refresh_interval: self.discovery_refresh_interval,
            discovery_timeout: self.discovery_timeout,
            holder_refetch_interval: self.holder_refetch_interval,
            api_retention: self.api_retention,
            state_dir: Some(self.state_dir.clone()),
            local_down_goaway_after: self.local_down_goaway_after,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envoy::resources::DataPlane;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    const BASE: &[&str] = &[
        "--local-apiserver-url=https://127.0.0.1:6443",
        "--node-name=cp-1",
        "--peer-cidr=10.0.0.0/24",
        "--peer-address=lease/apiserver-x=10.0.1.5:6444",
        "--peer-ca-file=/pki/ca.crt",
        "--proxy-client-cert-file=/pki/front-proxy-client.crt",
        "--proxy-client-key-file=/pki/front-proxy-client.key",
        "--sds-dir=/var/lib/skewgate/sds",
        "--health-listen=0.0.0.0:18001",
        "--wasm=/opt/skewgate.wasm",
    ];

    /// `BASE` with the flags named in `drop` removed and `add` appended.
    fn args(drop: &[&str], add: &[&str]) -> Result<RunArgs, clap::Error> {
        let kept = BASE
            .iter()
            .filter(|a| !drop.iter().any(|d| a.starts_with(&format!("--{d}="))));
        Cli::try_parse_from(
            std::iter::once("run")
                .chain(kept.copied())
                .chain(add.iter().copied()),
        )
        .map(|c| c.run)
    }

    /// wasm by default; `--data-plane native` runs the module at `--native-module`.
    #[test]
    fn the_data_plane_is_wasm_unless_native_is_asked_for() {
        let c = args(&[], &[]).expect("parses").validate().expect("valid");
        assert_eq!(c.filter_code.data_plane, DataPlane::Wasm);
        assert_eq!(c.filter_code.path(), "/opt/skewgate.wasm");
        let c = args(
            &["wasm"],
            &[
                "--data-plane=native",
                "--native-module=/opt/libskewgate_native.so",
            ],
        )
        .expect("parses")
        .validate()
        .expect("valid");
        assert_eq!(c.filter_code.data_plane, DataPlane::Native);
        assert_eq!(c.filter_code.path(), "/opt/libskewgate_native.so");
        // Both paths given (the deploy files): --data-plane chooses.
        let both = ["--native-module=/opt/libskewgate_native.so"];
        let c = args(&[], &both).expect("parses").validate().expect("valid");
        assert_eq!(c.filter_code.path(), "/opt/skewgate.wasm");
        let c = args(&[], &[both[0], "--data-plane=native"])
            .expect("parses")
            .validate()
            .expect("valid");
        assert_eq!(c.filter_code.path(), "/opt/libskewgate_native.so");
    }

    #[test]
    fn run_flags_validate() {
        let c = args(&[], &[]).expect("parses").validate().expect("valid");
        assert_eq!(c.scheme, Scheme::Https);
        assert!(c.upstream_tls.is_some());
        assert_eq!(c.sds_dir, Some(PathBuf::from("/var/lib/skewgate/sds")));
        assert_eq!(c.peers.local, LocalSelector::Hostname("cp-1".into()));
        assert_eq!(c.peers.policy.allowed_cidrs.len(), 1);
        assert_eq!(c.peers.policy.by_lease.len(), 1);
        assert_eq!(c.local_fallback_id(), "node/cp-1");
        assert_eq!(c.peers.grace, Duration::from_secs(30));
        assert_eq!(c.discovery_timeout, Duration::from_secs(10));
        assert_eq!(c.peers.max_peers, 16);
        assert_eq!(c.holder_refetch_interval, Duration::from_secs(10));
        // The safe setting without a flag: the retention and the last acknowledged
        // configuration survive a restart, in the directory `bootstrap` reads by default.
        assert_eq!(c.state_dir, Some(PathBuf::from(DEFAULT_STATE_DIR)));
        assert_eq!(DEFAULT_STATE_DIR, "/var/lib/skewgate");
        assert_eq!(
            c.local_channels,
            LocalChannels::unix(std::path::Path::new("/run/skewgate")).expect("channels")
        );
        assert_eq!(c.debug_listen, None, "/debug/skew is off by default");
        for (debug, want) in [
            ("127.0.0.1:18002", "127.0.0.1:18002"),
            ("127.1.2.3:9", "127.1.2.3:9"),
            ("[::1]:18002", "[::1]:18002"),
        ] {
            let c = args(&[], &[&format!("--debug-listen={debug}")])
                .expect("parses")
                .validate()
                .expect("valid");
            assert_eq!(c.debug_listen, Some(want.parse().expect("address")));
        }
        let c = args(&[], &["--max-peers=5", "--holder-refetch-interval=1m"])
            .expect("parses")
            .validate()
            .expect("valid");
        assert_eq!(c.peers.max_peers, 5);
        assert_eq!(c.holder_refetch_interval, Duration::from_secs(60));

        let plain = args(
            &[
                "peer-ca-file",
                "proxy-client-cert-file",
                "proxy-client-key-file",
                "local-apiserver-url",
                "node-name",
            ],
            &[
                "--insecure-plaintext-upstreams",
                "--local-apiserver-url=http://127.0.0.1:8080",
                "--local-lease=apiserver-abc",
            ],
        )
        .expect("parses")
        .validate()
        .expect("valid");
        assert_eq!(plain.scheme, Scheme::Http);
        assert!(plain.upstream_tls.is_none());
        assert!(plain.sds_dir.is_none(), "no TLS, no SDS files");
        assert_eq!(plain.local_fallback_id(), "apiserver-abc");

        // Refused by the parser or by validation, never accepted.
        let bad: Vec<(&str, Vec<&str>, Vec<&str>)> = vec![
            ("no local selector", vec!["node-name"], vec![]),
            ("both selectors", vec![], vec!["--local-lease=apiserver-a"]),
            (
                "missing proxy-client key",
                vec!["proxy-client-key-file"],
                vec![],
            ),
            ("TLS without an SDS directory", vec!["sds-dir"], vec![]),
            (
                "a relative SDS directory",
                vec!["sds-dir"],
                vec!["--sds-dir=sds"],
            ),
            (
                "plaintext and TLS at once",
                vec!["local-apiserver-url"],
                vec![
                    "--insecure-plaintext-upstreams",
                    "--local-apiserver-url=http://127.0.0.1:8080",
                ],
            ),
            (
                "plaintext URL without the opt-out",
                vec!["local-apiserver-url"],
                vec!["--local-apiserver-url=http://127.0.0.1:8080"],
            ),
            (
                "xDS not on loopback",
                vec![],
                vec![
                    "--insecure-tcp-local-channels",
                    "--xds-address=0.0.0.0:18000",
                ],
            ),
            (
                "bad CIDR",
                vec!["peer-cidr"],
                vec!["--peer-cidr=10.0.0.0/33"],
            ),
            (
                "bad mapping",
                vec!["peer-address"],
                vec!["--peer-address=lease/x=evil.com:443"],
            ),
            ("relative wasm", vec!["wasm"], vec!["--wasm=skewgate.wasm"]),
            ("no wasm", vec!["wasm"], vec![]),
            (
                "native without its module",
                vec![],
                vec!["--data-plane=native"],
            ),
            (
                "relative native module",
                vec!["wasm"],
                vec![
                    "--data-plane=native",
                    "--native-module=libskewgate_native.so",
                ],
            ),
            ("unknown data plane", vec![], vec!["--data-plane=lua"]),
            ("zero grace", vec![], vec!["--lease-grace=0s"]),
            ("no peers allowed", vec![], vec!["--max-peers=0"]),
            ("negative cap", vec![], vec!["--max-peers=-1"]),
            ("bad duration", vec![], vec!["--discovery-timeout=soon"]),
            (
                "TCP without the opt-out",
                vec![],
                vec!["--xds-address=127.0.0.1:18000"],
            ),
            (
                "/debug/skew off loopback",
                vec![],
                vec!["--debug-listen=0.0.0.0:18002"],
            ),
            (
                "/debug/skew on another host's address",
                vec![],
                vec!["--debug-listen=10.0.0.1:18002"],
            ),
            (
                "/debug/skew on any IPv6",
                vec![],
                vec!["--debug-listen=[::]:18002"],
            ),
            (
                "/debug/skew by name",
                vec![],
                vec!["--debug-listen=localhost:18002"],
            ),
            (
                "/debug/skew on the health port",
                vec!["health-listen"],
                vec![
                    "--health-listen=127.0.0.1:18001",
                    "--debug-listen=127.0.0.1:18001",
                ],
            ),
        ];
        for (what, drop, add) in bad {
            let refused = match args(&drop, &add) {
                Err(_) => true,
                Ok(a) => a.validate().is_err(),
            };
            assert!(refused, "{what}");
        }
        // Comma-separated CIDRs are accepted too.
        let c = args(&["peer-cidr"], &["--peer-cidr=10.0.0.0/24,fd00::/64"])
            .expect("parses")
            .validate()
            .expect("valid");
        assert_eq!(c.peers.policy.allowed_cidrs.len(), 2);
    }
}
