//! `skewgate-control bootstrap`: its flags ([`BootstrapArgs`]) and what they say, checked
//! ([`BootstrapConfig`], from [`BootstrapArgs::validate`]); the same shape as `run`'s
//! ([`super::config`]). Pure: nothing is read or written here.

use std::path::PathBuf;
use std::time::Duration;

use crate::envoy::goaway::{GoawayChance, GOAWAY_FILE};
use crate::envoy::resources::FilterCode;
use crate::envoy::{Address, ServingTls, UpstreamTls};
use crate::flags::DataPlaneFlags;
use crate::flags::{
    parse_control_plane_wait, parse_local_url, sds_dir, FlagError, ListenerFlags,
    LocalChannelFlags, Scheme, UpstreamTlsFlags, DEFAULT_STATE_DIR,
};
use crate::local_channels::LocalChannels;

/// `skewgate-control bootstrap`: print the Envoy bootstrap of the live mode.
#[derive(clap::Args, Debug)]
pub struct BootstrapArgs {
    #[command(flatten)]
    pub listener: ListenerFlags,
    /// Where Envoy's admin interface is and where `skewgate-control run` serves xDS (give
    /// both the same).
    #[command(flatten)]
    pub channels: LocalChannelFlags,
    /// This Envoy's node id, for the control plane's logs.
    #[arg(long, default_value = "skewgate")]
    pub node_id: String,
    /// Where the apiserver this Envoy fronts listens (as for `run`): for the peer port and the
    /// fallback's clusters.
    #[arg(long, value_name = "URL")]
    pub local_apiserver_url: Option<String>,
    /// How long Envoy waits at start for the control plane's configuration before it serves
    /// local-only routing (every request to the local apiserver, as without skewgate) until
    /// the control plane's first configuration replaces it. 0: wait for as long as it takes,
    /// the ports closed meanwhile. Needs --wasm, --local-apiserver-url and the upstream TLS
    /// flags (as for `run`).
    #[arg(long, default_value = "30s", value_parser = parse_control_plane_wait, value_name = "DURATION")]
    pub control_plane_wait: Duration,
    /// The filter Envoy runs (as `run` gives it): its path is needed for the fallback.
    #[command(flatten)]
    pub data_plane: DataPlaneFlags,
    #[command(flatten)]
    pub upstream: UpstreamTlsFlags,
    /// A directory Envoy can read (absolute; needed with TLS) where the SDS files of the
    /// serving certificate and the client CA are written: Envoy reads the certificates
    /// through them and follows renewals without a restart. `run --sds-dir` may name the same
    /// directory.
    #[arg(long, value_name = "DIR")]
    pub sds_dir: Option<PathBuf>,
    /// `run --state-dir`: where the control plane keeps the last configuration Envoy
    /// acknowledged; the fallback serves it instead of local-only routing when it is there.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// kube-apiserver's --goaway-chance, which no longer reaches clients behind Envoy: the
    /// probability that Envoy tells a request's connection to go away (HTTP/2 GOAWAY, HTTP/1.1
    /// Connection: close; the request and the others in flight finish, watches included), so
    /// long-lived clients spread over the apiservers again through the load balancer. From 0
    /// (off) to 0.02; 0.001 is a good start. Needs --socket-dir (Envoy reads it from a file
    /// there that bootstrap writes).
    #[arg(long, value_name = "CHANCE", default_value_t = GoawayChance::OFF)]
    pub goaway_chance: GoawayChance,
}

/// The fallback's inputs: Envoy's wait for the control plane, the filter, the upstream TLS.
#[derive(Debug, Clone)]
pub struct FallbackSettings {
    pub wait: Duration,
    pub filter_code: FilterCode,
    pub upstream: Option<UpstreamTls>,
}

/// What `bootstrap`'s flags say, checked.
#[derive(Debug, Clone)]
pub struct BootstrapConfig {
    pub listen: Address,
    pub request_timeout: Duration,
    pub serving: Option<ServingTls>,
    pub channels: LocalChannels,
    pub node_id: String,
    /// The local apiserver, when given (the peer port and the fallback lead there).
    pub local: Option<Address>,
    /// The peer port (it needs `local`), and who may connect to it.
    pub peer_listen: Option<Address>,
    pub peer_cidrs: Vec<ipnet::IpNet>,
    /// `None` with `--control-plane-wait=0`.
    pub fallback: Option<FallbackSettings>,
    /// Where the SDS files are, with TLS.
    pub sds_dir: Option<PathBuf>,
    pub state_dir: PathBuf,
    /// The GOAWAY chance's file beside the sockets (none on loopback TCP, and then no chance).
    pub goaway_file: Option<PathBuf>,
    pub goaway_chance: GoawayChance,
    /// Opt-outs to warn about.
    pub insecure_tcp_local_channels: bool,
    pub insecure_plaintext_listener: bool,
}

impl BootstrapArgs {
    /// Everything `bootstrap` needs, checked.
    pub fn validate(&self) -> Result<BootstrapConfig, FlagError> {
        let listener = &self.listener;
        let channels = self.channels.resolve()?;
        let serving = listener.serving_tls()?;
        let fallback = self.fallback()?;
        let upstream_tls = fallback.as_ref().is_some_and(|(f, _)| f.upstream.is_some());
        let sds_dir = sds_dir(self.sds_dir.as_deref(), serving.is_some() || upstream_tls)?;
        let local = match &self.local_apiserver_url {
            Some(url) => {
                // The fallback's clusters speak what the upstream flags say; the peer port
                // passes bytes through whatever they are.
                let scheme = match &fallback {
                    Some((_, scheme)) => *scheme,
                    None if url.starts_with("http://") => Scheme::Http,
                    None => Scheme::Https,
                };
                Some(parse_local_url(url, scheme)?.address)
            }
            None => None,
        };
        let peer_listen = listener.peer_listen()?.cloned();
        if peer_listen.is_some() && local.is_none() {
            return Err(FlagError::Combination(
                "--peer-listen needs --local-apiserver-url (where the peer port leads)".into(),
            ));
        }
        // The GOAWAY chance's file lives beside the sockets, which only Envoy's and the control
        // plane's user can write; on loopback TCP there is no such directory, and no chance.
        let goaway_file = channels.socket_dir().map(|dir| dir.join(GOAWAY_FILE));
        if goaway_file.is_none() && !self.goaway_chance.is_off() {
            return Err(FlagError::Combination(
                "--goaway-chance needs --socket-dir (Envoy reads the chance from a file there), not --insecure-tcp-local-channels".into(),
            ));
        }
        Ok(BootstrapConfig {
            listen: listener.listen.clone(),
            request_timeout: listener.request_timeout,
            serving,
            channels,
            node_id: self.node_id.clone(),
            local,
            peer_listen,
            peer_cidrs: listener.peer_cidrs.peer_cidrs.clone(),
            fallback: fallback.map(|(f, _)| f),
            sds_dir,
            state_dir: self.state_dir.clone(),
            goaway_file,
            goaway_chance: self.goaway_chance,
            insecure_tcp_local_channels: self.channels.insecure_tcp_local_channels,
            insecure_plaintext_listener: listener.insecure_plaintext_listener,
        })
    }

    /// The fallback's inputs from the flags and the upstream scheme: `None` with
    /// `--control-plane-wait=0`.
    fn fallback(&self) -> Result<Option<(FallbackSettings, Scheme)>, FlagError> {
        if self.control_plane_wait.is_zero() {
            return Ok(None);
        }
        let (Some(filter_code), Some(_)) = (self.data_plane.resolve()?, &self.local_apiserver_url)
        else {
            return Err(FlagError::Combination(format!(
                "--control-plane-wait (default 30s) needs {} and --local-apiserver-url: when \
                 the control plane has not configured Envoy in time, Envoy serves local-only \
                 routing to the local apiserver (--control-plane-wait=0 waits forever instead)",
                self.data_plane.data_plane.path_flag()
            )));
        };
        let (scheme, upstream) = self.upstream.resolve()?;
        Ok(Some((
            FallbackSettings {
                wait: self.control_plane_wait,
                filter_code,
                upstream,
            },
            scheme,
        )))
    }
}
