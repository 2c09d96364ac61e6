//! Counters of the peer watcher, as plain atomics, rendered in the Prometheus text format.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use super::address::RejectReason;
use super::model::LeaseField;

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

    pub fn set_counts(&self, live: usize, excluded: usize) {
        self.live_peers.store(live as u64, Ordering::Relaxed);
        self.excluded_leases
            .store(excluded as u64, Ordering::Relaxed);
    }

    /// The Prometheus text exposition of these metrics.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str(
            "# HELP skewgate_peer_address_rejected_total Peer addresses ignored, by reason (reported once per lease and value).\n\
             # TYPE skewgate_peer_address_rejected_total counter\n",
        );
        for r in RejectReason::ALL {
            let _ = writeln!(
                out,
                "skewgate_peer_address_rejected_total{{reason=\"{}\"}} {}",
                r.label(),
                self.rejected_total(r)
            );
        }
        out.push_str(
            "# HELP skewgate_peer_leases_malformed_total Identity leases ignored because a field cannot be read, by field (reported once per lease and value).\n\
             # TYPE skewgate_peer_leases_malformed_total counter\n",
        );
        for f in LeaseField::ALL {
            let _ = writeln!(
                out,
                "skewgate_peer_leases_malformed_total{{field=\"{}\"}} {}",
                f.label(),
                self.malformed_total(f)
            );
        }
        let _ = write!(
            out,
            "# HELP skewgate_peer_watch_errors_total Errors of the identity lease watch (it retries with backoff).\n\
             # TYPE skewgate_peer_watch_errors_total counter\n\
             skewgate_peer_watch_errors_total {}\n\
             # HELP skewgate_peer_restarts_total Identity leases that got a new holder identity (apiserver restarts).\n\
             # TYPE skewgate_peer_restarts_total counter\n\
             skewgate_peer_restarts_total {}\n\
             # HELP skewgate_peer_leases_duplicate_local_total Identity leases refused because they claim the local hostname under a name that is not the local apiserver's (once per lease).\n\
             # TYPE skewgate_peer_leases_duplicate_local_total counter\n\
             skewgate_peer_leases_duplicate_local_total {}\n\
             # HELP skewgate_peer_leases_over_cap_total Live identity leases left out because of --max-peers (once per lease).\n\
             # TYPE skewgate_peer_leases_over_cap_total counter\n\
             skewgate_peer_leases_over_cap_total {}\n\
             # HELP skewgate_peers_live Live peer apiservers with an accepted address.\n\
             # TYPE skewgate_peers_live gauge\n\
             skewgate_peers_live {}\n\
             # HELP skewgate_peer_leases_excluded Identity leases that are not peers (dead, unconfirmed, malformed, no usable address, impostors of the local lease, over the cap).\n\
             # TYPE skewgate_peer_leases_excluded gauge\n\
             skewgate_peer_leases_excluded {}\n",
            self.watch_errors_total(),
            self.restarts_total(),
            self.duplicate_local_total(),
            self.over_cap_total(),
            self.live_peers.load(Ordering::Relaxed),
            self.excluded_leases.load(Ordering::Relaxed),
        );
        out
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
        m.set_counts(2, 1);
        let text = m.render();
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
