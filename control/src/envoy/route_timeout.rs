//! How long Envoy lets a short (not long-running) request take: the route timeout the bootstrap
//! gives it ([`of`]), and the same value advertised to the control plane in Envoy's node
//! metadata (`skewgate: {route_timeout_seconds: N}`, [`node_metadata`]).
//!
//! Why the control plane needs it: a request routed by one filter configuration retries on the
//! cluster that configuration chose for as long as its route timeout runs, and Envoy answers
//! `no_healthy_upstream` to a retry whose cluster is gone. The xDS server keeps a cluster a
//! configuration dropped that long ([`crate::xds::server::cluster_linger`]). `run` does not
//! know the `--request-timeout` the bootstrap was rendered with; the bootstrap says it here.
//!
//! Read back leniently ([`advertised`]), as hostile input: anything but a number of seconds
//! from 0 to [`MAX_ROUTE_TIMEOUT`] is clamped or ignored, never an error.

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::google::protobuf::{value::Kind, Struct};

use super::dialect;
use super::REQUEST_TIMEOUT_MARGIN;

/// The key of [`node_metadata`] under `skewgate`.
pub const NODE_METADATA_KEY: &str = "route_timeout_seconds";

/// The longest route timeout read back: a day. Beyond it a stream's removed clusters linger
/// no longer (their number is bounded anyway, `xds::delta::MAX_LINGERING_CLUSTERS`).
pub const MAX_ROUTE_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

/// The route timeout of a short request for the apiservers' `--request-timeout`: a live
/// apiserver's own 504 Timeout Status wins, and only one that never answers becomes a 503.
pub const fn of(request_timeout: Duration) -> Duration {
    request_timeout.saturating_add(REQUEST_TIMEOUT_MARGIN)
}

/// How long one try of a short GET or HEAD sent to a set of peers may go without a byte from
/// the peer before Envoy gives up on it and repeats it on another peer that serves the resource
/// (route `per_try_idle_timeout`): a third of the `--request-timeout`, 20 s at kube's default.
///
/// A peer whose network went silent is found sooner by the HTTP/2 PINGs (two seconds) and its
/// health check; this is for a peer whose connection still answers PINGs but whose apiserver
/// answers nothing. Longer than kube-apiserver's own longest wait before it answers at all, the
/// priority-and-fairness queue (`--request-timeout`/4, after which it answers 429), so a busy
/// apiserver's answer always comes first. Idle, not total: a large LIST that keeps sending is
/// never cut. Never for watches and the other long-running requests (they have no route
/// timeout either), nor for the local apiserver, whose slow LISTs of large collections a
/// peer could not answer faster.
pub fn peer_try_idle(request_timeout: Duration) -> Duration {
    request_timeout / 3
}

/// `route_timeout` as the bootstrap's node metadata.
pub fn node_metadata(route_timeout: Duration) -> Struct {
    dialect::under_key([(
        NODE_METADATA_KEY,
        Kind::NumberValue(route_timeout.as_secs_f64()),
    )])
}

/// The route timeout a node's bootstrap advertised ([`node_metadata`]), at most
/// [`MAX_ROUTE_TIMEOUT`]; `None` without one, or for anything but a non-negative number.
pub fn advertised(node: Option<&Node>) -> Option<Duration> {
    match dialect::advertised(node, NODE_METADATA_KEY).and_then(dialect::number) {
        Some(seconds) if seconds >= 0.0 => Some(
            Duration::try_from_secs_f64(seconds.min(MAX_ROUTE_TIMEOUT.as_secs_f64()))
                .unwrap_or(MAX_ROUTE_TIMEOUT),
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envoy::dialect::METADATA_KEY;
    use envoy_types::pb::google::protobuf::Value;

    fn node(skewgate: Option<Kind>) -> Node {
        Node {
            metadata: skewgate.map(|kind| Struct {
                fields: [(METADATA_KEY.to_string(), Value { kind: Some(kind) })].into(),
            }),
            ..Default::default()
        }
    }

    fn with_value(kind: Kind) -> Node {
        node(Some(Kind::StructValue(Struct {
            fields: [(NODE_METADATA_KEY.to_string(), Value { kind: Some(kind) })].into(),
        })))
    }

    #[test]
    fn the_route_timeout_is_the_request_timeout_and_the_margin() {
        assert_eq!(of(Duration::from_secs(60)), Duration::from_secs(70));
        assert_eq!(of(Duration::MAX), Duration::MAX);
    }

    #[test]
    fn what_the_bootstrap_advertises_is_read_back() {
        for timeout in [0.0, 0.5, 70.0, 3_600.0] {
            let timeout = Duration::from_secs_f64(timeout);
            let node = Node {
                metadata: Some(node_metadata(timeout)),
                ..Default::default()
            };
            assert_eq!(advertised(Some(&node)), Some(timeout));
        }
    }

    /// A node is whatever connected to the xDS socket: what is not a number of seconds is not
    /// advertised, and no number makes a duration that cannot be added to.
    #[test]
    fn hostile_metadata_advertises_nothing_or_at_most_a_day() {
        assert_eq!(advertised(None), None);
        assert_eq!(advertised(Some(&node(None))), None);
        assert_eq!(advertised(Some(&node(Some(Kind::NumberValue(70.0))))), None);
        for bad in [
            Kind::NumberValue(-1.0),
            Kind::NumberValue(f64::NAN),
            Kind::NumberValue(f64::NEG_INFINITY),
            Kind::StringValue("seventy".into()),
            Kind::StringValue("-70".into()),
            Kind::StringValue("NaN".into()),
            Kind::StringValue("7".repeat(65)),
            Kind::BoolValue(true),
            Kind::NullValue(0),
        ] {
            assert_eq!(advertised(Some(&with_value(bad.clone()))), None, "{bad:?}");
        }
        // A number in a string is a number: Envoy reads a YAML bootstrap's `11.5` into the
        // node metadata as the string "11.5" (`super::super::yaml`).
        assert_eq!(
            advertised(Some(&with_value(Kind::StringValue("11.5".into())))),
            Some(Duration::from_secs_f64(11.5))
        );
        for huge in [f64::INFINITY, f64::MAX, 1e20, 86_401.0] {
            assert_eq!(
                advertised(Some(&with_value(Kind::NumberValue(huge)))),
                Some(MAX_ROUTE_TIMEOUT),
                "{huge}"
            );
        }
    }
}
