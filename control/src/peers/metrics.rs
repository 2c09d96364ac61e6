//! Counters of the peer watcher, as plain atomics, listed as metric families when scraped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::address::RejectReason;
use super::model::{ExcludedPeer, LeaseField};
use crate::metrics::Families;

/// The states of `skewgate_peer_leases{state}`: live, then every reason a lease is not a
/// peer (`expired`: dead).
const LEASE_STATES: [&str; 8] = [
    "live",
    "expired",
    "unconfirmed",
    "never_renewed",
    "malformed",
    "address",
    "duplicate_local",
    "over_cap",
];

#[derive(Debug, Default)]
pub struct PeerMetrics {
    address_rejected: [AtomicU64; RejectReason::ALL.len()],
    malformed: [AtomicU64; LeaseField::ALL.len()],
    watch_errors: AtomicU64,
    restarts: AtomicU64,
    duplicate_local: AtomicU64,
    over_cap: AtomicU64,
    live_peers: AtomicU64,
    excluded_leases: AtomicU64,
    /// Leases by [`LEASE_STATES`].
    states: Mutex<[u64; LEASE_STATES.len()]>,
}

impl PeerMetrics {
    pub fn address_rejected(&self, reason: RejectReason) {
        self.address_rejected[reason.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub fn rejected_total(&self, reason: RejectReason) -> u64 {
        self.address_rejected[reason.index()].load(Ordering::Relaxed)
    }

    /// A lease that cannot be read was ignored (counted once per lease and value).
    pub fn malformed(&self, field: LeaseField) {
        self.malformed[field.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub fn malformed_total(&self, field: LeaseField) -> u64 {
        self.malformed[field.index()].load(Ordering::Relaxed)
    }

    pub fn watch_error(&self) {
        self.watch_errors.fetch_add(1, Ordering::Relaxed);
    }

    pub fn watch_errors_total(&self) -> u64 {
        self.watch_errors.load(Ordering::Relaxed)
    }

    pub fn restarted(&self) {
        self.restarts.fetch_add(1, Ordering::Relaxed);
    }

    pub fn restarts_total(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    /// A lease claiming the local hostname under another name was refused (once per lease).
    pub fn duplicate_local(&self) {
        self.duplicate_local.fetch_add(1, Ordering::Relaxed);
    }

    pub fn duplicate_local_total(&self) -> u64 {
        self.duplicate_local.load(Ordering::Relaxed)
    }

    /// A live peer beyond `--max-peers` was left out (once per lease).
    pub fn over_cap(&self) {
        self.over_cap.fetch_add(1, Ordering::Relaxed);
    }

    pub fn over_cap_total(&self) -> u64 {
        self.over_cap.load(Ordering::Relaxed)
    }

    pub fn set_counts(&self, live: usize, excluded: &[ExcludedPeer]) {
        self.live_peers.store(live as u64, Ordering::Relaxed);
        self.excluded_leases
            .store(excluded.len() as u64, Ordering::Relaxed);
        let mut states = [0u64; LEASE_STATES.len()];
        states[0] = live as u64;
        for e in excluded {
            if let Some(i) = LEASE_STATES.iter().position(|s| *s == e.reason.label()) {
                states[i] += 1;
            }
        }
        if let Ok(mut s) = self.states.lock() {
            *s = states;
        }
    }

    /// These metrics, for `/metrics`.
    pub fn families(&self) -> Families {
        let mut f = Families::new();
        f.counters(
            "skewgate_peer_address_rejected_total",
            "Peer addresses ignored, by reason (reported once per lease and value).",
            &["reason"],
            RejectReason::ALL
                .iter()
                .map(|r| ([r.label()], self.rejected_total(*r))),
        );
        f.counters(
            "skewgate_peer_leases_malformed_total",
            "Identity leases ignored because a field cannot be read, by field (reported once per lease and value).",
            &["field"],
            LeaseField::ALL
                .iter()
                .map(|l| ([l.label()], self.malformed_total(*l))),
        );
        f.counter(
            "skewgate_peer_watch_errors_total",
            "Errors of the identity lease watch (it retries with backoff).",
            self.watch_errors_total(),
        );
        f.counter(
            "skewgate_peer_restarts_total",
            "Identity leases that got a new holder identity (apiserver restarts).",
            self.restarts_total(),
        );
        f.counter(
            "skewgate_peer_leases_duplicate_local_total",
            "Identity leases refused because they claim the local hostname under a name that is not the local apiserver's (once per lease).",
            self.duplicate_local_total(),
        );
        f.counter(
            "skewgate_peer_leases_over_cap_total",
            "Live identity leases left out because of --max-peers (once per lease).",
            self.over_cap_total(),
        );
        f.gauge(
            "skewgate_peers_live",
            "Live peer apiservers with an accepted address.",
            self.live_peers.load(Ordering::Relaxed) as f64,
        );
        f.gauge(
            "skewgate_peer_leases_excluded",
            "Identity leases that are not peers (dead, unconfirmed, malformed, no usable address, impostors of the local lease, over the cap).",
            self.excluded_leases.load(Ordering::Relaxed) as f64,
        );
        let states = self.states.lock().map(|s| *s).unwrap_or_default();
        f.gauges(
            "skewgate_peer_leases",
            "Identity leases of other apiservers by state: live peers, and why the others are not peers (expired: dead).",
            &["state"],
            LEASE_STATES
                .iter()
                .zip(states)
                .map(|(s, n)| ([*s], n as f64)),
        );
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_reason() {
        let m = PeerMetrics::default();
        m.address_rejected(RejectReason::OutsideCidrs);
        m.address_rejected(RejectReason::OutsideCidrs);
        m.address_rejected(RejectReason::Hostname);
        m.malformed(LeaseField::RenewTime);
        m.set_counts(
            2,
            &[ExcludedPeer {
                id: "apiserver-x".into(),
                holder_identity: "x".into(),
                generation: 1,
                reason: super::super::model::Exclusion::Expired,
            }],
        );
        let text = crate::metrics::encode(&m.families());
        assert!(
            text.contains("skewgate_peer_leases{state=\"expired\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("skewgate_peer_leases{state=\"live\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("skewgate_peer_leases_malformed_total{field=\"renew_time\"} 1\n"));
        assert!(text.contains("skewgate_peer_leases_malformed_total{field=\"metadata\"} 0\n"));
        assert!(text.contains("skewgate_peer_address_rejected_total{reason=\"outside_cidrs\"} 2\n"));
        assert!(text.contains("skewgate_peer_address_rejected_total{reason=\"hostname\"} 1\n"));
        assert!(text.contains("skewgate_peer_address_rejected_total{reason=\"no_cidrs\"} 0\n"));
        assert!(text.contains("skewgate_peers_live 2\n"));
        assert_eq!(
            text.matches("skewgate_peer_address_rejected_total{")
                .count(),
            RejectReason::ALL.len()
        );
    }
}
