//! Which peers this node's Envoy cannot reach, and since when: a peer cut off from this node
//! while it still renews its Lease is live (its APIs stay listed and `Current`), but Envoy's
//! health checks of its peer port fail, and Envoy sends it nothing
//! (`super::resources::cluster`). The control plane reads that from Envoy's admin interface
//! (`/clusters?format=json`) every [`POLL_INTERVAL`], for `/debug/skew` (each apiserver's
//! `unreachable_since_unix_seconds`) and `/metrics` (`skewgate_peer_unreachable_since_seconds`).
//!
//! Only the hosts of peer clusters count, by address (`host:port`, the peer's URL without its
//! scheme); at most as many as Envoy has peers (`--max-peers`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Deserialize;

use crate::local_channels::LocalChannel;
use crate::metrics::Families;
use crate::routing::PEER_CLUSTER_PREFIX;

/// How often Envoy's view is read: its health checks run every second, one failure takes a peer
/// out.
pub const POLL_INTERVAL: Duration = Duration::from_secs(2);

/// The admin path read.
pub const CLUSTERS: &str = "/clusters?format=json";

#[derive(Deserialize)]
struct Clusters {
    #[serde(default)]
    cluster_statuses: Vec<ClusterStatus>,
}

#[derive(Deserialize)]
struct ClusterStatus {
    #[serde(default)]
    name: String,
    #[serde(default)]
    host_statuses: Vec<HostStatus>,
}

#[derive(Deserialize)]
struct HostStatus {
    #[serde(default)]
    address: Option<HostAddress>,
    #[serde(default)]
    health_status: Option<HealthStatus>,
}

#[derive(Deserialize)]
struct HostAddress {
    #[serde(default)]
    socket_address: Option<SocketAddress>,
}

#[derive(Deserialize)]
struct SocketAddress {
    #[serde(default)]
    address: String,
    #[serde(default)]
    port_value: u32,
}

#[derive(Deserialize)]
struct HealthStatus {
    #[serde(default)]
    failed_active_health_check: bool,
}

/// The peer addresses (`host:port`) Envoy's health checks find unreachable, and those they find
/// reachable, from its `/clusters?format=json`. A peer in several sets counts as unreachable if
/// any of its hosts failed; `None` for an answer that is not that document.
pub fn peer_health(json: &str) -> Option<(BTreeSet<String>, BTreeSet<String>)> {
    let clusters: Clusters = serde_json::from_str(json).ok()?;
    let (mut failed, mut seen) = (BTreeSet::new(), BTreeSet::new());
    for cluster in clusters
        .cluster_statuses
        .iter()
        .filter(|c| c.name.starts_with(PEER_CLUSTER_PREFIX))
    {
        for host in &cluster.host_statuses {
            let Some(addr) = host
                .address
                .as_ref()
                .and_then(|a| a.socket_address.as_ref())
            else {
                continue;
            };
            let address = if addr.address.contains(':') {
                format!("[{}]:{}", addr.address, addr.port_value)
            } else {
                format!("{}:{}", addr.address, addr.port_value)
            };
            if host
                .health_status
                .as_ref()
                .is_some_and(|h| h.failed_active_health_check)
            {
                failed.insert(address.clone());
            }
            seen.insert(address);
        }
    }
    let reachable = seen.difference(&failed).cloned().collect();
    Some((failed, reachable))
}

/// Since when each unreachable peer address has been.
#[derive(Debug, Default)]
pub struct Reachability {
    since: Mutex<BTreeMap<String, SystemTime>>,
}

impl Reachability {
    /// Take one reading of Envoy's view at `now`: a peer keeps the time it was first seen
    /// unreachable; one Envoy reaches again, or no longer has, is dropped.
    pub fn update(&self, unreachable: &BTreeSet<String>, now: SystemTime) {
        let Ok(mut since) = self.since.lock() else {
            return;
        };
        since.retain(|address, _| unreachable.contains(address));
        for address in unreachable {
            since.entry(address.clone()).or_insert(now);
        }
    }

    /// When `address` (`host:port`) became unreachable, in unix seconds, if it is.
    pub fn since(&self, address: &str) -> Option<u64> {
        let since = self.since.lock().ok()?;
        since
            .get(address)
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(|d| d.as_secs())
    }

    pub fn families(&self) -> Families {
        let mut f = Families::default();
        let Ok(since) = self.since.lock() else {
            return f;
        };
        f.gauges(
            "skewgate_peer_unreachable_since_seconds",
            "When this node's Envoy found the peer at this address unreachable (unix seconds): its health checks of the peer port fail, and it sends the peer nothing. Absent while every peer is reachable.",
            &["address"],
            since.iter().map(|(address, t)| {
                let secs = t
                    .duration_since(UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs() as f64);
                ([address.as_str()], secs)
            }),
        );
        f
    }

    /// Read Envoy's view every [`POLL_INTERVAL`] until `shutdown`.
    pub async fn poll(
        &self,
        admin: LocalChannel,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut tick = tokio::time::interval(POLL_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => return,
            }
            if *shutdown.borrow() {
                return;
            }
            match super::admin::get(&admin, CLUSTERS).await {
                Ok(body) => match peer_health(&body) {
                    Some((unreachable, _)) => self.update(&unreachable, SystemTime::now()),
                    None => tracing::debug!("Envoy's /clusters answer is not its JSON"),
                },
                // Envoy restarting, or not started yet: the last reading stands.
                Err(e) => tracing::debug!(error = %e, "reading Envoy's peer health"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLUSTERS_JSON: &str = r#"{"cluster_statuses":[
        {"name":"skewgate-local-identity","host_statuses":[
            {"address":{"socket_address":{"address":"127.0.0.1","port_value":6443}},"health_status":{"failed_active_health_check":true}}]},
        {"name":"skewgate-peers-abc-identity","host_statuses":[
            {"address":{"socket_address":{"address":"10.0.0.12","port_value":6444}},"health_status":{"failed_active_health_check":true,"eds_health_status":"HEALTHY"}},
            {"address":{"socket_address":{"address":"10.0.0.13","port_value":6444}},"health_status":{"eds_health_status":"HEALTHY"}}]},
        {"name":"skewgate-peers-abc-token","host_statuses":[
            {"address":{"socket_address":{"address":"10.0.0.13","port_value":6444}},"health_status":{}}]},
        {"name":"skewgate-peers-def-anonymous","host_statuses":[
            {"address":{"socket_address":{"address":"fd00::14","port_value":6444}},"health_status":{"failed_active_health_check":true}}]}
    ]}"#;

    #[test]
    fn envoys_failed_health_checks_of_peer_hosts_are_the_unreachable_peers() {
        let (failed, reachable) = peer_health(CLUSTERS_JSON).expect("parsed");
        // The local apiserver's cluster is not a peer's.
        assert_eq!(
            failed.into_iter().collect::<Vec<_>>(),
            ["10.0.0.12:6444", "[fd00::14]:6444"]
        );
        assert_eq!(
            reachable.into_iter().collect::<Vec<_>>(),
            ["10.0.0.13:6444"]
        );
        assert!(peer_health("not json").is_none());
        assert_eq!(
            peer_health(r#"{"x":1}"#),
            Some((BTreeSet::new(), BTreeSet::new()))
        );
    }

    #[test]
    fn an_unreachable_peer_keeps_the_time_it_was_first_seen() {
        let r = Reachability::default();
        let t0 = UNIX_EPOCH + Duration::from_secs(1000);
        let set = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        r.update(&set(&["10.0.0.12:6444"]), t0);
        r.update(
            &set(&["10.0.0.12:6444", "10.0.0.13:6444"]),
            t0 + Duration::from_secs(2),
        );
        assert_eq!(r.since("10.0.0.12:6444"), Some(1000));
        assert_eq!(r.since("10.0.0.13:6444"), Some(1002));
        // Reached again: gone; unreachable again later: a new time.
        r.update(&set(&["10.0.0.13:6444"]), t0 + Duration::from_secs(4));
        assert_eq!(r.since("10.0.0.12:6444"), None);
        r.update(
            &set(&["10.0.0.12:6444", "10.0.0.13:6444"]),
            t0 + Duration::from_secs(6),
        );
        assert_eq!(r.since("10.0.0.12:6444"), Some(1006));
        let text = crate::metrics::encode(&r.families());
        assert!(
            text.contains(
                "skewgate_peer_unreachable_since_seconds{address=\"10.0.0.12:6444\"} 1006"
            ),
            "{text}"
        );
    }
}
