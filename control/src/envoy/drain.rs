//! Envoy stops without cutting a request: `skewgate-control drain-envoy`, which Envoy's
//! entrypoint (`deploy/image/skewgate-envoy`: the static pod and the compose nodes) runs when it
//! gets SIGTERM, and the `/readyz` check that lets the load balancer see it coming.
//!
//! Envoy does not drain on SIGTERM: it exits within milliseconds, cutting every request in
//! flight (envoyproxy/envoy#3837). So the entrypoint keeps Envoy as its child and, on SIGTERM,
//! runs [`drain`] against Envoy's admin interface:
//!
//! 1. `POST /healthcheck/fail`: `/readyz` through Envoy answers 503 from now on
//!    ([`readyz_health_check_filter`]), as kube-apiserver's own `/readyz` does once its shutdown
//!    starts, so the load balancer takes the node out; and every response tells its client to
//!    reconnect (HTTP/1.1 `Connection: close`, HTTP/2 GOAWAY).
//! 2. `POST /drain_listeners?graceful&skip_exit`: Envoy's drain sequence starts. With
//!    `--drain-strategy immediate` (`deploy/args/envoy.args`) every HTTP/2 connection, idle ones
//!    included, gets a GOAWAY at once, and the final one after the HTTP connection manager's
//!    `drain_timeout` (Envoy's default, 5 s); each connection closes when its last stream ends.
//!    The ports keep accepting, so a client the load balancer still sends here is served (and
//!    told to reconnect) rather than refused. `skip_exit`: the ports stay open until step 3, so
//!    the drain time is this command's [`DrainArgs::drain_seconds`] alone, not also Envoy's
//!    `--drain-time-s`.
//! 3. After the drain time, `POST /drain_listeners`: the ports close (connections are refused;
//!    the load balancer has had the drain time to notice `/readyz`). Open connections stay.
//! 4. Once no client request is in flight (polled every 100 ms), or at the latest after the
//!    finish time, `POST /quitquitquit`: Envoy exits, and the kubelet (or the compose node) can
//!    start the next one; a client pinned to this node's address, not going through the load
//!    balancer, is refused only until it listens. What is still open then ends:
//!    watches and other long-running requests (an HTTP/1.1 watch sees the connection close
//!    without the last chunk, an HTTP/2 one the connection close after the final GOAWAY; client-go
//!    takes either as the end of the watch and watches again, through the load balancer, on
//!    another apiserver), short requests that outlast the finish time (a LIST may run up to the
//!    apiservers' `--request-timeout`), and the peer port's connections (L4, nothing to drain).
//!
//! The two times, and the static pod's `terminationGracePeriodSeconds`
//! ([`TERMINATION_GRACE_PERIOD_SECONDS`], which `deploy/render` writes into
//! `deploy/kubeadm/skewgate-envoy.yaml`), have their defaults here only.

use std::path::PathBuf;
use std::time::Duration;

use envoy_types::pb::envoy::config::bootstrap::v3::Bootstrap as EnvoyBootstrap;
use envoy_types::pb::envoy::config::core::v3::{address, socket_address};
use envoy_types::pb::envoy::config::route::v3::{
    header_matcher::HeaderMatchSpecifier, HeaderMatcher,
};
use envoy_types::pb::envoy::extensions::filters::http::health_check::v3::HealthCheck;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_filter, HttpFilter,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{
    string_matcher::MatchPattern, RegexMatcher, StringMatcher,
};
use envoy_types::pb::google::protobuf::BoolValue;
use envoy_types::util::pack_any;
use prost::Message;

use super::admin::{self, AdminError};
use crate::local_channels::LocalChannel;

/// `drain-envoy --drain-seconds`'s default: how long the ports stay open after SIGTERM, every
/// response telling its client to reconnect and `/readyz` failing. Long enough for a load
/// balancer checking `/readyz` every 2–3 s to take the node out.
pub const DEFAULT_DRAIN_SECONDS: u64 = 10;
/// `drain-envoy --finish-seconds`'s default: how long requests in flight get to finish once the
/// ports are closed, before Envoy exits.
pub const DEFAULT_FINISH_SECONDS: u64 = 15;
/// What the kubelet must allow beyond the two: this command's start and its admin calls.
pub const STOP_MARGIN_SECONDS: u64 = 5;
/// The static pod's `terminationGracePeriodSeconds` (`deploy/render` reads the three numbers
/// above from this file; `tests/tests/deploy.rs` checks the manifest against this sum). 30 s,
/// the pod default, with the default times.
pub const TERMINATION_GRACE_PERIOD_SECONDS: u64 =
    DEFAULT_DRAIN_SECONDS + DEFAULT_FINISH_SECONDS + STOP_MARGIN_SECONDS;

/// The path Envoy answers itself, with 503, once `/healthcheck/fail` was posted: what load
/// balancers probe, and what kube-apiserver fails when its own shutdown starts (the query
/// aside: `/readyz?verbose` too).
pub const READYZ_PATH_REGEX: &str = r"^/readyz(\?.*)?$";

/// `skewgate-control drain-envoy`: drain Envoy and stop it.
#[derive(clap::Args, Debug, Clone)]
pub struct DrainArgs {
    /// The bootstrap Envoy runs with (`skewgate-control bootstrap`'s output): its admin
    /// interface is where this command talks to Envoy.
    #[arg(long, value_name = "FILE")]
    pub bootstrap: PathBuf,
    /// How long Envoy keeps its ports open after the drain starts: every response tells its
    /// client to reconnect (HTTP/1.1 Connection: close, HTTP/2 GOAWAY) and /readyz answers
    /// 503, so the load balancer takes the node out.
    #[arg(long, value_name = "SECONDS", env = "SKEWGATE_DRAIN_SECONDS", default_value_t = DEFAULT_DRAIN_SECONDS)]
    pub drain_seconds: u64,
    /// Then, the ports closed, how long requests in flight get to finish at most: Envoy exits
    /// as soon as none is left, or when this runs out; watches and other long-running requests
    /// end then (clients watch again elsewhere).
    #[arg(long, value_name = "SECONDS", env = "SKEWGATE_FINISH_SECONDS", default_value_t = DEFAULT_FINISH_SECONDS)]
    pub finish_seconds: u64,
}

/// The finish time of a `--finish-seconds` too large to add to the clock (about 30 years).
const LONGEST_FINISH: Duration = Duration::from_secs(1_000_000_000);

/// Why Envoy could not be drained.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    #[error("reading the bootstrap {path:?}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the bootstrap {path:?}: {why}")]
    Bootstrap { path: PathBuf, why: &'static str },
    #[error("{step}: {source}")]
    Admin {
        step: &'static str,
        source: AdminError,
    },
}

/// Where the admin interface of the Envoy that runs `bootstrap` (the YAML `skewgate-control
/// bootstrap` prints) is. The binary protobuf earlier releases printed is read too: while
/// skewgate itself is upgraded, the Envoy being drained may have been started from one.
pub fn admin_of_bootstrap(bootstrap: &[u8]) -> Result<LocalChannel, &'static str> {
    let bootstrap = std::str::from_utf8(bootstrap)
        .ok()
        .and_then(|text| super::yaml::from_yaml::<EnvoyBootstrap>(text).ok())
        .or_else(|| EnvoyBootstrap::decode(bootstrap).ok())
        .ok_or("not an Envoy bootstrap (YAML, or the binary protobuf of earlier releases)")?;
    let address = bootstrap
        .admin
        .and_then(|admin| admin.address)
        .and_then(|address| address.address)
        .ok_or("no admin address")?;
    match address {
        address::Address::Pipe(pipe) if !pipe.path.is_empty() => {
            Ok(LocalChannel::Unix(pipe.path.into()))
        }
        address::Address::SocketAddress(socket) => {
            let ip: std::net::IpAddr = socket
                .address
                .parse()
                .map_err(|_| "the admin address is not an IP address")?;
            match socket.port_specifier {
                Some(socket_address::PortSpecifier::PortValue(port)) if port != 0 => {
                    let port = u16::try_from(port).map_err(|_| "the admin port is not a port")?;
                    Ok(LocalChannel::Tcp(std::net::SocketAddr::new(ip, port)))
                }
                _ => Err("the admin port is 0 (the kernel chose it) or named"),
            }
        }
        _ => Err("an admin address of an unknown kind"),
    }
}

/// Envoy's `health_check` HTTP filter on `/readyz` ([`READYZ_PATH_REGEX`]), first in the
/// chain. In pass-through mode it answers nothing itself while Envoy is healthy: the request
/// goes through the skewgate filter (hygiene, identity, routing: local, a non-resource path)
/// like any other, and the local apiserver's own `/readyz` answers, so a node whose apiserver
/// is not ready is taken out as without skewgate. Once `/healthcheck/fail` was posted (step 1
/// of [`drain`]) it answers 503 itself and nothing goes upstream: no client can use it to
/// reach an apiserver past the skewgate filter.
pub fn readyz_health_check_filter() -> HttpFilter {
    let readyz = HeaderMatcher {
        name: ":path".into(),
        header_match_specifier: Some(HeaderMatchSpecifier::StringMatch(StringMatcher {
            match_pattern: Some(MatchPattern::SafeRegex(RegexMatcher {
                regex: READYZ_PATH_REGEX.into(),
                ..Default::default()
            })),
            ..Default::default()
        })),
        ..Default::default()
    };
    HttpFilter {
        name: "envoy.filters.http.health_check".into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(
            HealthCheck {
                pass_through_mode: Some(BoolValue { value: true }),
                headers: vec![readyz],
                ..Default::default()
            },
        ))),
        ..Default::default()
    }
}

/// Steps 1–4 of the module documentation against the admin interface at `admin`; `say` is
/// told each step (the entrypoint's log, Envoy's pod log). Returns when Envoy was told to
/// exit; fails at the first admin call that fails (the caller then stops Envoy itself).
pub async fn drain(
    admin: &LocalChannel,
    drain_time: Duration,
    finish_time: Duration,
    say: impl Fn(&str),
) -> Result<(), DrainError> {
    let post = |step: &'static str, path: &'static str| async move {
        admin::post(admin, path)
            .await
            .map(|_| ())
            .map_err(|source| DrainError::Admin { step, source })
    };
    post("failing /readyz", "/healthcheck/fail").await?;
    post("starting the drain", "/drain_listeners?graceful&skip_exit").await?;
    say(&format!(
        "draining: /readyz fails, every response tells its client to reconnect; the ports close in {}s",
        drain_time.as_secs_f64()
    ));
    tokio::time::sleep(drain_time).await;
    post("closing the ports", "/drain_listeners").await?;
    say(&format!(
        "ports closed; Envoy exits once no client request is in flight, at most in {}s",
        finish_time.as_secs_f64()
    ));
    // Any number of seconds is taken: one too long for the clock waits as long as it can
    // (adding it would panic, and the image's entrypoint would then cut every request).
    let now = tokio::time::Instant::now();
    let finished = now
        .checked_add(finish_time)
        .unwrap_or_else(|| now + LONGEST_FINISH);
    loop {
        if requests_in_flight(admin).await == Some(0) {
            say("no client request in flight");
            break;
        }
        let now = tokio::time::Instant::now();
        if now >= finished {
            break;
        }
        tokio::time::sleep(FINISH_POLL.min(finished - now)).await;
    }
    post("stopping Envoy", "/quitquitquit").await?;
    say("Envoy told to exit");
    Ok(())
}

/// How often the finish step asks Envoy whether a client request is still in flight.
const FINISH_POLL: Duration = Duration::from_millis(100);

/// The client listener's requests in flight (its connection manager's
/// `downstream_rq_active`); `None` when Envoy does not say (the finish time then runs out).
/// Once the ports are closed, Envoy exits as soon as this is zero: a node whose clients
/// cannot reach the load balancer (pinned to its address) is refused only for Envoy's
/// restart, not for the whole finish time. Watches keep it above zero until the finish time.
async fn requests_in_flight(admin: &LocalChannel) -> Option<u64> {
    let body = admin::get(admin, REQUESTS_IN_FLIGHT_STAT).await.ok()?;
    parse_requests_in_flight(&body)
}

/// The gauge: the client listener's connection manager (its `stat_prefix` is
/// [`crate::envoy::bootstrap::LISTENER_NAME`]).
const REQUESTS_IN_FLIGHT: &str = "http.apiserver.downstream_rq_active";
/// `/stats` in its text form, filtered to [`REQUESTS_IN_FLIGHT`] alone.
const REQUESTS_IN_FLIGHT_STAT: &str =
    "/stats?filter=%5Ehttp%5C.apiserver%5C.downstream_rq_active%24";

fn parse_requests_in_flight(body: &str) -> Option<u64> {
    body.lines()
        .find_map(|line| line.strip_prefix(REQUESTS_IN_FLIGHT)?.strip_prefix(':'))
        .and_then(|value| value.trim().parse().ok())
}

/// `skewgate-control drain-envoy`: read the admin address from the bootstrap, then [`drain`].
pub async fn drain_envoy(args: &DrainArgs, say: impl Fn(&str)) -> Result<(), DrainError> {
    let bytes = std::fs::read(&args.bootstrap).map_err(|source| DrainError::Read {
        path: args.bootstrap.clone(),
        source,
    })?;
    let admin = admin_of_bootstrap(&bytes).map_err(|why| DrainError::Bootstrap {
        path: args.bootstrap.clone(),
        why,
    })?;
    drain(
        &admin,
        Duration::from_secs(args.drain_seconds),
        Duration::from_secs(args.finish_seconds),
        say,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envoy::bootstrap::{Bootstrap, ConfigSource};
    use crate::envoy::Address;
    use crate::local_channels::LocalChannels;
    use std::path::Path;
    use std::sync::{Arc, Mutex};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn bootstrap_with(channels: &LocalChannels) -> Vec<u8> {
        let listen = Address::parse_listen("127.0.0.1:0").expect("listen");
        Bootstrap {
            listen: &listen,
            admin: channels.admin(),
            config_source: ConfigSource::Ads {
                xds: channels.xds(),
            },
            node_id: "cp-1",
            request_timeout: Duration::from_secs(60),
            serving: None,
            sds_dir: None,
            peer: None,
            fallback: None,
            goaway: None,
        }
        .render("test")
        .expect("renders")
        .into_bytes()
    }

    #[test]
    fn the_admin_interface_is_the_one_the_bootstrap_names() {
        let unix = LocalChannels::unix(Path::new("/run/skewgate")).expect("channels");
        assert_eq!(
            admin_of_bootstrap(&bootstrap_with(&unix)),
            Ok(LocalChannel::Unix("/run/skewgate/envoy-admin.sock".into()))
        );
        let tcp = LocalChannels::tcp(9901, "127.0.0.1:18000".parse().expect("xds"));
        assert_eq!(
            admin_of_bootstrap(&bootstrap_with(&tcp)),
            Ok(LocalChannel::Tcp("127.0.0.1:9901".parse().expect("admin")))
        );
        // Port 0: the kernel chose it, nobody can know which.
        let zero = LocalChannels::tcp(0, "127.0.0.1:18000".parse().expect("xds"));
        assert!(admin_of_bootstrap(&bootstrap_with(&zero)).is_err());
        assert!(admin_of_bootstrap(b"admin: {}").is_err());
        assert!(admin_of_bootstrap(&EnvoyBootstrap::default().encode_to_vec()).is_err());
    }

    /// A fake admin interface: answers `status` to every request and records its request line.
    async fn fake_admin(status: u16) -> (LocalChannel, Arc<Mutex<Vec<String>>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let channel = LocalChannel::Tcp(listener.local_addr().expect("addr"));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(buf.get(..n).unwrap_or_default()),
                    }
                }
                let line = String::from_utf8_lossy(&head)
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_string();
                let body = if line.starts_with("GET /stats?") {
                    "http.apiserver.downstream_rq_active: 0\n"
                } else {
                    "OK\n"
                };
                log.lock().expect("log").push(line);
                let reply = format!(
                    "HTTP/1.1 {status} X\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(reply.as_bytes()).await;
            }
        });
        (channel, seen)
    }

    #[tokio::test]
    async fn the_drain_fails_readyz_drains_closes_the_ports_then_stops_envoy() {
        let (admin, seen) = fake_admin(200).await;
        let said = Mutex::new(Vec::new());
        // Nothing in flight once the ports are closed: Envoy stops at once, not after the
        // finish time (here the largest `SKEWGATE_FINISH_SECONDS` parses: more than the clock
        // can add, which panicked).
        let started = tokio::time::Instant::now();
        drain(&admin, Duration::ZERO, Duration::from_secs(u64::MAX), |s| {
            said.lock().expect("said").push(s.to_string())
        })
        .await
        .expect("drained");
        assert!(started.elapsed() < Duration::from_secs(60));
        assert_eq!(
            *seen.lock().expect("seen"),
            [
                "POST /healthcheck/fail HTTP/1.1",
                "POST /drain_listeners?graceful&skip_exit HTTP/1.1",
                "POST /drain_listeners HTTP/1.1",
                &format!("GET {REQUESTS_IN_FLIGHT_STAT} HTTP/1.1"),
                "POST /quitquitquit HTTP/1.1",
            ]
        );
        assert_eq!(said.lock().expect("said").len(), 4);

        // The first refusal stops the sequence, naming its step.
        let (admin, seen) = fake_admin(405).await;
        let err = drain(&admin, Duration::ZERO, Duration::ZERO, |_| {})
            .await
            .expect_err("refused");
        assert!(err.to_string().starts_with("failing /readyz"), "{err}");
        assert_eq!(seen.lock().expect("seen").len(), 1);
    }

    /// The gauge's name and the query both follow the listener's stat prefix.
    #[test]
    fn the_gauge_is_the_client_listeners() {
        let gauge = format!(
            "http.{}.downstream_rq_active",
            crate::envoy::bootstrap::LISTENER_NAME
        );
        assert_eq!(REQUESTS_IN_FLIGHT, gauge);
        assert_eq!(
            REQUESTS_IN_FLIGHT_STAT,
            format!("/stats?filter=%5E{}%24", gauge.replace('.', "%5C."))
        );
    }

    #[test]
    fn requests_in_flight_is_read_from_the_stats_text() {
        for (body, want) in [
            ("http.apiserver.downstream_rq_active: 0\n", Some(0)),
            ("x: 1\nhttp.apiserver.downstream_rq_active: 12\n", Some(12)),
            ("http.apiserver.downstream_rq_active: many\n", None),
            ("http.peer.downstream_rq_active: 0\n", None),
            ("OK\n", None),
            ("", None),
        ] {
            assert_eq!(parse_requests_in_flight(body), want, "{body:?}");
        }
    }

    #[test]
    fn readyz_is_checked_first_and_passes_through_until_the_drain() {
        let unix = LocalChannels::unix(Path::new("/run/skewgate")).expect("channels");
        let b = crate::envoy::yaml::from_yaml::<EnvoyBootstrap>(
            &String::from_utf8(bootstrap_with(&unix)).expect("text"),
        )
        .expect("reads back");
        let hcm = crate::envoy::bootstrap::inspect::hcm(&b);
        let first = &hcm.http_filters[0];
        assert_eq!(first.name, "envoy.filters.http.health_check");
        let Some(http_filter::ConfigType::TypedConfig(any)) = &first.config_type else {
            panic!("typed config");
        };
        let check = HealthCheck::decode(any.value.as_slice()).expect("decodes");
        assert_eq!(check.pass_through_mode, Some(BoolValue { value: true }));
        let [readyz] = check.headers.as_slice() else {
            panic!("one matcher");
        };
        assert_eq!(readyz.name, ":path");
        let Some(HeaderMatchSpecifier::StringMatch(StringMatcher {
            match_pattern: Some(MatchPattern::SafeRegex(regex)),
            ..
        })) = &readyz.header_match_specifier
        else {
            panic!("a regex on the path");
        };
        assert_eq!(regex.regex, READYZ_PATH_REGEX);
        // The skewgate filter comes right after it: nothing else answers or routes first.
        assert_eq!(hcm.http_filters[1].name, crate::envoy::FILTER_NAME);
    }
}
