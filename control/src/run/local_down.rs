//! When this node's apiserver stays down, every client connection is told to go away (issue 21,
//! docs/ARCHITECTURE.md "Failover from the local apiserver").
//!
//! Failover serves a client pinned to this Envoy from the peers while the local apiserver
//! restarts, which is right for a restart of seconds. When it stays down longer (a crash, a
//! node being drained), those clients should move through the load balancer to another node,
//! as they would without skewgate when the apiserver's own connections broke: its `/readyz`
//! already fails (it is this node's own, never failed over), so the load balancer sends new
//! connections elsewhere. [`LocalDown`] decides when: the local apiserver's discovery fetch
//! (every second) has failed for `--local-down-goaway-after`; then Envoy drains every client
//! connection at its next response ([`ConnectionDrain::EveryConnection`] through
//! [`goaway::write`], the switch the GOAWAY chance uses), and once a fetch succeeds again the
//! configured chance is back. The state is written again whenever the Envoy it serves
//! reconnects: a restarted Envoy's bootstrap reset the file to the configured chance.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::envoy::goaway::{self, ConnectionDrain, GoawayChance};
use crate::fetch::SyncState;
use crate::metrics::Families;
use crate::xds::XdsMetrics;

/// The default of `run --local-down-goaway-after`: longer than an apiserver restart on a
/// healthy node (clients ride it out on the peers), short against a crash loop.
pub const DEFAULT_LOCAL_DOWN_GOAWAY_AFTER: &str = "20s";

/// The pure decision: fed every outcome of the local apiserver's fetch, says when the switch
/// changes.
#[derive(Debug)]
pub struct LocalDown {
    after: Duration,
    down_since: Option<Instant>,
    /// Whether every connection is being drained; `None` until the first outcome (a control
    /// plane that restarted mid-drain restores the chance at its first success).
    draining: Option<bool>,
}

impl LocalDown {
    /// `after` zero: never (the switch is only ever the configured chance).
    pub fn new(after: Duration) -> Self {
        LocalDown {
            after,
            down_since: None,
            draining: None,
        }
    }

    /// One outcome at `now` (`ok`: the fetch succeeded); `Some(true)`: drain every
    /// connection now, `Some(false)`: back to the configured chance.
    pub fn observe(&mut self, ok: bool, now: Instant) -> Option<bool> {
        let want = if ok {
            self.down_since = None;
            false
        } else {
            let since = *self.down_since.get_or_insert(now);
            !self.after.is_zero() && now.duration_since(since) >= self.after
        };
        if self.draining == Some(want) || (self.draining.is_none() && !ok && !want) {
            return None;
        }
        self.draining = Some(want);
        Some(want)
    }

    /// Whether every connection is being drained.
    pub fn draining(&self) -> bool {
        self.draining == Some(true)
    }
}

/// The switch's counters, for `/metrics`.
#[derive(Debug, Default)]
pub struct LocalDownMetrics {
    draining: AtomicU64,
    switched: AtomicU64,
}

impl LocalDownMetrics {
    pub fn families(&self) -> Families {
        let mut f = Families::new();
        f.gauges(
            "skewgate_local_down_draining",
            "1 while every client connection is told to go away because the local apiserver stays down.",
            &[],
            vec![([], self.draining.load(Ordering::Relaxed) as f64)],
        );
        f.counters(
            "skewgate_local_down_drains_total",
            "Times every client connection was told to go away because the local apiserver stayed down.",
            &[],
            vec![([], self.switched.load(Ordering::Relaxed))],
        );
        f
    }
}

/// Run the switch until the process ends: outcomes from the local watch's `state`, the
/// configured chance and reconnects from the xDS streams.
pub async fn run(
    socket_dir: PathBuf,
    after: Duration,
    mut local: watch::Receiver<SyncState>,
    xds: Arc<XdsMetrics>,
    metrics: Arc<LocalDownMetrics>,
) {
    let mut decision = LocalDown::new(after);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut seen_attempts = 0;
    let mut streams = xds.streams_opened();
    // The configured chance was to be restored before any Envoy said which it is: written
    // once one does.
    let mut restore_pending = false;
    loop {
        tokio::select! {
            changed = local.changed() => if changed.is_err() { return },
            _ = tick.tick() => {}
        }
        let state = local.borrow().clone();
        // A new outcome, or time passing while it keeps failing.
        if state.attempts == 0 {
            continue;
        }
        let fresh = state.attempts != seen_attempts;
        seen_attempts = state.attempts;
        let ok = state.consecutive_failures == 0;
        let reconnected = xds.streams_opened() != streams;
        streams = xds.streams_opened();
        let change = if fresh || !ok {
            decision.observe(ok, Instant::now())
        } else {
            None
        };
        let write = change.or((reconnected && decision.draining()).then_some(true));
        // The chance this Envoy's bootstrap configured is known once its xDS stream said so
        // (its node metadata). A control plane that starts before its Envoy reconnects
        // restores "off" for now, so that a drain its predecessor left in the file ends, and
        // the configured chance as soon as it is known; without that second write the chance
        // stayed off until Envoy restarted.
        let known = xds.goaway_chance();
        let (drain, configured) = match write {
            Some(true) => (true, GoawayChance::OFF),
            Some(false) => {
                restore_pending = known.is_none();
                (false, known.unwrap_or(GoawayChance::OFF))
            }
            None => match known {
                Some(chance) if restore_pending && !decision.draining() => {
                    restore_pending = false;
                    (false, chance)
                }
                _ => continue,
            },
        };
        let content = if drain {
            ConnectionDrain::EveryConnection
        } else {
            ConnectionDrain::Chance(configured)
        };
        match goaway::write(&socket_dir, content) {
            Ok(()) if drain => {
                metrics.draining.store(1, Ordering::Relaxed);
                if change.is_some() {
                    metrics.switched.fetch_add(1, Ordering::Relaxed);
                }
                warn!(
                    down_for = ?after,
                    "the local apiserver stays down: every client connection is told to go away"
                );
            }
            Ok(()) => {
                metrics.draining.store(0, Ordering::Relaxed);
                info!(chance = %configured, "the local apiserver answers: client connections stay");
            }
            Err(e) => warn!(error = %e, "could not write Envoy's GOAWAY switch"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A control plane that starts (or restarts) before its Envoy reconnects: the first good
    /// fetch can only restore "off", and the chance Envoy's bootstrap configured is written
    /// as soon as its stream says which it is (before, it stayed off until Envoy restarted).
    #[tokio::test]
    async fn the_configured_chance_is_restored_once_envoy_says_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join(goaway::GOAWAY_FILE);
        let read = || std::fs::read_to_string(&file).unwrap_or_default();
        // A predecessor died while draining.
        goaway::write(dir.path(), ConnectionDrain::EveryConnection).expect("write");
        let (tx, rx) = watch::channel(SyncState::default());
        let xds = Arc::new(XdsMetrics::new());
        let task = tokio::spawn(run(
            dir.path().to_path_buf(),
            Duration::from_secs(20),
            rx,
            xds.clone(),
            Arc::new(LocalDownMetrics::default()),
        ));
        let wait_for = |want: &'static str| {
            let read = &read;
            async move {
                for _ in 0..100 {
                    if read() == want {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                panic!("{:?} never became {want:?}", read());
            }
        };
        tx.send(SyncState {
            attempts: 1,
            ..SyncState::default()
        })
        .expect("send");
        wait_for("0").await;
        xds.goaway_chance_configured("0.001".parse().expect("chance"));
        wait_for("0.001").await;
        task.abort();
    }

    /// (seconds since start, fetch ok) → the change.
    #[test]
    fn drains_after_the_local_apiserver_stayed_down_and_stops_when_it_answers() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut d = LocalDown::new(Duration::from_secs(20));
        let table: [(u64, bool, Option<bool>); 9] = [
            // The first success restores the chance (a control plane restarted mid-drain).
            (0, true, Some(false)),
            (1, true, None),
            // A restart of a few seconds: clients ride it out on the peers.
            (2, false, None),
            (10, false, None),
            (12, true, None),
            // Down for 20 s: every connection goes.
            (13, false, None),
            (33, false, Some(true)),
            (40, false, None),
            (41, true, Some(false)),
        ];
        for (s, ok, want) in table {
            assert_eq!(d.observe(ok, at(s)), want, "{s} s, ok {ok}");
        }
        assert!(!d.draining());

        // A control plane that starts while the apiserver is down counts from its start.
        let mut d = LocalDown::new(Duration::from_secs(20));
        assert_eq!(d.observe(false, at(0)), None);
        assert_eq!(d.observe(false, at(20)), Some(true));
        assert!(d.draining());
        // Zero: never.
        let mut d = LocalDown::new(Duration::ZERO);
        assert_eq!(d.observe(false, at(0)), None);
        assert_eq!(d.observe(false, at(1000)), None);
        assert_eq!(d.observe(true, at(1001)), Some(false));
    }
}
