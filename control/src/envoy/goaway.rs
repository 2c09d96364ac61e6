//! kube-apiserver's `--goaway-chance` in Envoy (`bootstrap --goaway-chance`), and the one switch
//! that tells every client connection to go elsewhere.
//!
//! kube-apiserver answers each HTTP/2 request, with probability `chance`, with `Connection:
//! close`, which Go's HTTP/2 server turns into a GOAWAY (`k8s.io/apiserver/pkg/server/filters/
//! goaway.go`): the client finishes its streams on that connection and opens the next ones on a
//! new connection, through the load balancer, so long-lived clients spread over the apiservers
//! again after a rolling upgrade. It draws for every HTTP/2 request, watches and other
//! long-running ones included (`DefaultBuildHandlerChain` installs it around the whole chain),
//! and that ends no stream: a GOAWAY only stops new ones, and a watch on the connection goes on
//! streaming. Behind Envoy the apiserver's GOAWAY ends Envoy's upstream connection, never the
//! client's, so Envoy must draw it itself.
//!
//! **How.** Envoy's overload manager ([`overload_manager`]): an `injected_resource` monitor
//! reads a number from [`GOAWAY_FILE`] in the socket directory, and the
//! `disable_http_keepalive` action, scaled by it, makes Envoy drain the connection of each
//! response it sends with that probability: HTTP/2 gets a GOAWAY (the final one after the
//! connection manager's `drain_timeout`) and its streams finish, HTTP/1.1 gets `Connection:
//! close`. Counted in `http.apiserver.downstream_cx_overload_disable_keepalive`. Like kube it
//! is drawn per request, memoryless, and on watches too, which it never ends. Unlike kube it
//! also closes HTTP/1.1 connections with the same probability (one more TLS handshake per
//! 1/chance requests; kube leaves HTTP/1.1 alone, where a connection carries one request at a
//! time anyway). Chosen over the connection manager's `max_requests_per_connection =
//! 1/chance`, which is deterministic (every connection goes away exactly at request N, none
//! before) and fixed in the bootstrap: the file is also the switch issue 21 needs to move every
//! client off a node whose apiserver stays down. Envoy documents `injected_resource` as meant
//! mostly for tests; it reads the file when a file is renamed into place (an in-place write is
//! not seen) and keeps the last value it read when the file cannot be read or parsed.
//!
//! **The file** holds one number, the probability that a response drains its connection
//! ([`ConnectionDrain`]): the configured chance, or 1 for "every connection, now". It is only
//! written through [`write`] (atomically: written beside, renamed into place):
//! - `skewgate-control bootstrap` writes [`ConnectionDrain::Chance`] of `--goaway-chance` (0 by
//!   default, like kube) before every Envoy start, so a restarted Envoy never inherits "drain
//!   everything";
//! - the control plane (`run`, beside Envoy, same user, same directory) is then the file's only
//!   writer: [`ConnectionDrain::EveryConnection`] while the local apiserver stays down, and back
//!   to [`ConnectionDrain::Chance`] afterwards. The configured chance is in the bootstrap's node
//!   metadata ([`node_metadata`]: `skewgate.goaway_chance`), which Envoy sends with its first
//!   xDS request, so `run` takes it from the Envoy it serves (and writes its state again after
//!   each reconnect: a restarted Envoy's bootstrap reset the file).

use std::path::Path;

use envoy_types::pb::envoy::config::overload::v3::{
    resource_monitor, trigger, OverloadAction, OverloadManager, ResourceMonitor, ScaledTrigger,
    Trigger,
};
use envoy_types::pb::envoy::extensions::resource_monitors::injected_resource::v3::InjectedResourceConfig;
use envoy_types::pb::google::protobuf::{value, Duration as ProtoDuration, Struct};
use envoy_types::util::pack_any;

use super::{checked_path, EnvoyError};

/// The file in the socket directory (`--socket-dir`, private to Envoy's and the control
/// plane's user) Envoy reads the drain probability from.
pub const GOAWAY_FILE: &str = "goaway-chance";
/// kube-apiserver's bound for `--goaway-chance` (1 request in 50); it recommends 0.001.
pub const MAX_GOAWAY_CHANCE: f64 = 0.02;
/// The key of [`node_metadata`] under `skewgate`.
pub const NODE_METADATA_KEY: &str = "goaway_chance";

const INJECTED_RESOURCE: &str = "envoy.resource_monitors.injected_resource";

/// Where the bootstrap's overload manager reads the chance from, and the configured chance.
#[derive(Debug, Clone, Copy)]
pub struct GoawayFile<'a> {
    /// [`GOAWAY_FILE`] in the socket directory (absolute).
    pub path: &'a Path,
    /// `--goaway-chance`, for [`node_metadata`].
    pub configured: GoawayChance,
}

/// A `--goaway-chance`: the probability, per request, that its connection is told to go away;
/// 0 (the default) never.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct GoawayChance(f64);

impl GoawayChance {
    pub const OFF: GoawayChance = GoawayChance(0.0);

    pub fn value(self) -> f64 {
        self.0
    }

    pub fn is_off(self) -> bool {
        self.0 == 0.0
    }
}

/// A chance that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GoawayChanceError {
    #[error("{0:?}: not a number")]
    NotANumber(String),
    #[error(
        "{0:?}: must be from 0 (off) to {MAX_GOAWAY_CHANCE}, as kube-apiserver's; 0.001 is a good start"
    )]
    OutOfRange(String),
}

impl std::str::FromStr for GoawayChance {
    type Err = GoawayChanceError;

    /// kube-apiserver's rule: from 0 (off) to [`MAX_GOAWAY_CHANCE`].
    fn from_str(s: &str) -> Result<Self, GoawayChanceError> {
        let chance: f64 = s
            .trim()
            .parse()
            .map_err(|_| GoawayChanceError::NotANumber(s.to_string()))?;
        if !(0.0..=MAX_GOAWAY_CHANCE).contains(&chance) {
            return Err(GoawayChanceError::OutOfRange(s.to_string()));
        }
        Ok(GoawayChance(chance))
    }
}

impl std::fmt::Display for GoawayChance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// What [`GOAWAY_FILE`] says: the probability that a response drains its connection.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ConnectionDrain {
    /// The configured `--goaway-chance`.
    Chance(GoawayChance),
    /// Every connection, at its next response: 1.
    EveryConnection,
}

impl ConnectionDrain {
    /// The file's content: a number Envoy parses (`0`, `0.001`, `1`; never an exponent).
    fn text(self) -> String {
        match self {
            ConnectionDrain::Chance(chance) => chance.to_string(),
            ConnectionDrain::EveryConnection => "1".to_string(),
        }
    }
}

/// Write `drain` into `socket_dir`'s [`GOAWAY_FILE`], renamed into place (Envoy reloads it on
/// the rename and never sees half a file). The only writer of the file.
pub fn write(socket_dir: &Path, drain: ConnectionDrain) -> std::io::Result<()> {
    super::files::replace(socket_dir, GOAWAY_FILE, drain.text().as_bytes())
}

/// The overload manager that reads `file` (absolute, [`GOAWAY_FILE`] in the socket directory)
/// and drains each response's connection with the probability it holds. Read four times a
/// second: "every connection" takes effect within a quarter of a second.
pub fn overload_manager(file: &Path) -> Result<OverloadManager, EnvoyError> {
    let filename = checked_path(file, "the GOAWAY chance file")?.to_string();
    Ok(OverloadManager {
        refresh_interval: Some(ProtoDuration {
            seconds: 0,
            nanos: 250_000_000,
        }),
        resource_monitors: vec![ResourceMonitor {
            name: INJECTED_RESOURCE.into(),
            config_type: Some(resource_monitor::ConfigType::TypedConfig(pack_any(
                InjectedResourceConfig { filename },
            ))),
        }],
        actions: vec![OverloadAction {
            name: "envoy.overload_actions.disable_http_keepalive".into(),
            // Scaled from 0 to 1: the action's value is the file's number, and Envoy draws
            // bernoulli(value) for every response it encodes.
            triggers: vec![Trigger {
                name: INJECTED_RESOURCE.into(),
                trigger_oneof: Some(trigger::TriggerOneof::Scaled(ScaledTrigger {
                    scaling_threshold: 0.0,
                    saturation_threshold: 1.0,
                })),
            }],
            ..Default::default()
        }],
        ..Default::default()
    })
}

/// The node metadata that tells the control plane the configured chance (`skewgate:
/// {goaway_chance: N}`), the value it writes back after "every connection".
pub fn node_metadata(chance: GoawayChance) -> Struct {
    super::dialect::under_key([(NODE_METADATA_KEY, value::Kind::NumberValue(chance.value()))])
}

/// The chance a node's bootstrap configured ([`node_metadata`]), read leniently: anything but a
/// number kube-apiserver would take is `None`.
pub fn configured(
    node: Option<&envoy_types::pb::envoy::config::core::v3::Node>,
) -> Option<GoawayChance> {
    super::dialect::advertised(node, NODE_METADATA_KEY)
        .and_then(super::dialect::number)
        .and_then(|n| n.to_string().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chances_as_kube_apiserver_takes_them() {
        for (s, v) in [
            ("0", 0.0),
            ("0.001", 0.001),
            ("0.02", 0.02),
            (" 0.005 ", 0.005),
        ] {
            assert_eq!(s.parse::<GoawayChance>().expect(s).value(), v, "{s}");
        }
        for bad in ["", "-0.001", "0.021", "1", "NaN", "inf", "1e", "0x1"] {
            assert!(bad.parse::<GoawayChance>().is_err(), "{bad}");
        }
        assert!(GoawayChance::default().is_off());
        assert_eq!(GoawayChance::default(), GoawayChance::OFF);
    }

    #[test]
    fn the_file_holds_a_number_envoy_parses_renamed_into_place() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join(GOAWAY_FILE);
        let chance = |s: &str| ConnectionDrain::Chance(s.parse().expect("chance"));
        for (drain, text) in [
            (chance("0"), "0"),
            (chance("0.001"), "0.001"),
            (chance("0.0000001"), "0.0000001"),
            (chance("0.02"), "0.02"),
            (ConnectionDrain::EveryConnection, "1"),
        ] {
            write(dir.path(), drain).expect("written");
            assert_eq!(std::fs::read_to_string(&file).expect("read"), text);
        }
        // Only the file: no temporary left beside it.
        assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 1);
    }

    #[test]
    fn the_overload_manager_reads_the_file_and_scales_keepalive_by_it() {
        let manager = overload_manager(Path::new("/run/skewgate/goaway-chance")).expect("built");
        let [monitor] = manager.resource_monitors.as_slice() else {
            panic!("one monitor");
        };
        let Some(resource_monitor::ConfigType::TypedConfig(any)) = &monitor.config_type else {
            panic!("typed");
        };
        let config: InjectedResourceConfig =
            prost::Message::decode(any.value.as_slice()).expect("decodes");
        assert_eq!(config.filename, "/run/skewgate/goaway-chance");
        let [action] = manager.actions.as_slice() else {
            panic!("one action");
        };
        assert_eq!(action.name, "envoy.overload_actions.disable_http_keepalive");
        assert_eq!(
            action.triggers[0].trigger_oneof,
            Some(trigger::TriggerOneof::Scaled(ScaledTrigger {
                scaling_threshold: 0.0,
                saturation_threshold: 1.0
            }))
        );
        assert!(matches!(
            overload_manager(Path::new("/run/x\ny")),
            Err(EnvoyError::Unsafe(_))
        ));
    }

    /// `bootstrap --goaway-chance`: the overload manager reads the socket directory's file,
    /// and the node metadata carries the configured chance; without a socket directory
    /// (loopback TCP) there is neither, and a chance is refused.
    #[test]
    fn bootstrap_renders_the_chance_beside_the_sockets() {
        use crate::run::cli::render_bootstrap;
        use crate::run::BootstrapArgs;
        use clap::{Args, FromArgMatches};
        use envoy_types::pb::envoy::config::bootstrap::v3::Bootstrap as EnvoyBootstrap;
        use prost::Message;
        let args = |extra: &[&str]| {
            let base = [
                "bootstrap",
                "--insecure-plaintext-listener",
                "--control-plane-wait=0",
            ];
            let matches = BootstrapArgs::augment_args(clap::Command::new("bootstrap"))
                .try_get_matches_from(base.iter().chain(extra))
                .expect("parses");
            BootstrapArgs::from_arg_matches(&matches).expect("args")
        };
        let decoded = |args: &BootstrapArgs| {
            crate::envoy::yaml::from_yaml::<EnvoyBootstrap>(
                &render_bootstrap(args).expect("renders"),
            )
            .expect("reads back")
        };
        let b = decoded(&args(&["--socket-dir=/run/sg", "--goaway-chance=0.001"]));
        let manager = b.overload_manager.clone().expect("an overload manager");
        let Some(resource_monitor::ConfigType::TypedConfig(any)) =
            &manager.resource_monitors[0].config_type
        else {
            panic!("typed");
        };
        let config = InjectedResourceConfig::decode(any.value.as_slice()).expect("decodes");
        assert_eq!(config.filename, "/run/sg/goaway-chance");
        // The chance sits beside the filter's dialect in the node's `skewgate` metadata.
        let chance_of = |b: &EnvoyBootstrap| {
            let metadata = b.node.as_ref().and_then(|n| n.metadata.as_ref())?;
            let Some(value::Kind::StructValue(skewgate)) = metadata
                .fields
                .get("skewgate")
                .and_then(|v| v.kind.as_ref())
            else {
                return None;
            };
            let want = node_metadata(GoawayChance::OFF);
            assert!(want.fields["skewgate"].kind.is_some());
            match skewgate
                .fields
                .get(NODE_METADATA_KEY)
                .and_then(|v| v.kind.as_ref())
            {
                Some(value::Kind::NumberValue(n)) => Some(*n),
                _ => None,
            }
        };
        assert_eq!(chance_of(&b), Some(0.001));
        assert_eq!(
            crate::envoy::dialect::negotiate(b.node.as_ref()).dialect,
            skewgate_core::config::FilterDialect::this_filter(),
            "the filter's dialect is still there"
        );
        assert_eq!(
            crate::envoy::route_timeout::advertised(b.node.as_ref()),
            Some(std::time::Duration::from_secs(70)),
            "and so is the route timeout"
        );
        // The default, 0: the overload manager is there (the switch), drawing nothing.
        let b = decoded(&args(&[]));
        assert!(b.overload_manager.is_some());
        assert_eq!(chance_of(&b), Some(0.0));
        let b = decoded(&args(&["--request-timeout=300s"]));
        assert_eq!(
            crate::envoy::route_timeout::advertised(b.node.as_ref()),
            Some(std::time::Duration::from_secs(310)),
        );
        // Loopback TCP: no directory for the file.
        let tcp = args(&["--insecure-tcp-local-channels"]);
        assert!(decoded(&tcp).overload_manager.is_none());
        let tcp = args(&["--insecure-tcp-local-channels", "--goaway-chance=0.001"]);
        assert!(render_bootstrap(&tcp).is_err());
        let matches = BootstrapArgs::augment_args(clap::Command::new("bootstrap"))
            .try_get_matches_from(["bootstrap", "--goaway-chance=0.05"]);
        assert!(matches.is_err(), "above kube's bound");
    }
}
