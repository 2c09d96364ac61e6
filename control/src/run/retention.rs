//! API retention: the last good discovery of every peer apiserver, kept after it leaves, so that
//! an API whose objects are still in etcd never vanishes with its last server.
//!
//! When a peer stops being live (its Lease expired or was deleted), its last good discovery is
//! kept for `--api-retention` (15 minutes by default). During that window every group, version
//! and resource it served that no live apiserver serves stays in merged discovery (a group-version
//! nobody live serves is marked `freshness: Stale`) and requests for it are answered 503, or go
//! to it when its Lease is live again before its discovery is read (what is retained, and how it
//! is routed: [`crate::retained`]). A retained server stops counting:
//!
//! - when it is live again with fresh discovery ([`Retention::seen`]): then its new view is the
//!   truth, and whatever it no longer lists is gone at once (an upgrade that removed an API must
//!   not hold up namespace deletion for the whole window);
//! - when the window has passed ([`Retention::expire`]): the server never came back (a node taken
//!   out), and the local 404 is the truth again.
//!
//! **Bounded.** A Lease writer can make short-lived peers appear (each one live for a moment,
//! fetched, then gone): every one of them would leave a copy of discovery behind, in memory and
//! on disk, for the whole window. So at most `max_peers` departed servers are retained (besides
//! the live ones, which the cap on peers already bounds to `max_peers`); beyond that the
//! departed server *first seen most recently* is dropped ([`Retention::bound`],
//! [`Changes::evicted`]). The order is the cap's ([`FirstSeen`]), not the order of leaving: a
//! flood of leases always ranks after the apiservers known before it, so it can only push out
//! its own copies, never a real peer's retention (dropping the oldest departure first would let
//! each round of a flood flush a real peer that left earlier).
//!
//! **Seniority.** Each entry keeps its server's [`FirstSeen`], live or departed, so that the
//! order of the cap survives a restart (`crate::peers::Tracker::restoring`). With a zero window
//! nothing is retained, but live servers are still kept for that.
//!
//! The model is pure (time is passed in). What it holds is written to the state directory by
//! [`super::state_dir`], so a control-plane restart keeps the retention.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::discovery::DiscoveryDocuments;
use crate::envoy::Address;
use crate::peers::FirstSeen;

/// kube-style default: long enough for a node's upgrade or reboot, short enough that a node taken
/// out for good stops holding up namespace deletion the same day.
pub const DEFAULT_API_RETENTION: Duration = Duration::from_secs(15 * 60);

/// One peer apiserver's last good discovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub documents: Arc<DiscoveryDocuments>,
    /// When it stopped being live; `None` while it is live.
    pub left_at: Option<SystemTime>,
    /// Its seniority under the cap; `None`: not known (a file of an older version), ranked
    /// after every known one.
    pub first_seen: Option<FirstSeen>,
    /// Where it was last reached: its Lease's address while it was live
    /// ([`Retention::reached_at`]). A departed server's retained APIs are sent there
    /// ([`crate::retained`]), so it serves them again the moment it is back. Kept in memory
    /// only: after a restart of the control plane the addresses a Lease gave are not trusted
    /// from a file (the operator's CIDRs may have changed), and the retained 503 answers.
    pub address: Option<Address>,
}

impl Entry {
    /// The order of the cap: the most senior first, then by id.
    fn seniority<'a>(&self, id: &'a str) -> (FirstSeen, &'a str) {
        (self.first_seen.unwrap_or(FirstSeen(u64::MAX)), id)
    }
}

/// A retained server, as composition sees it.
#[derive(Debug, Clone, Copy)]
pub struct Retained<'a> {
    pub id: &'a str,
    pub documents: &'a DiscoveryDocuments,
    /// Where it was last reached, if known ([`Entry::address`]).
    pub address: Option<&'a Address>,
    pub left_at: SystemTime,
    pub expires_at: SystemTime,
}

/// What changed, for the state directory.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Changes {
    /// Entries to write again.
    pub write: BTreeSet<String>,
    /// Entries to delete.
    pub remove: BTreeSet<String>,
    /// Of those, the departed servers dropped because the retention was full.
    pub evicted: BTreeSet<String>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.write.is_empty() && self.remove.is_empty()
    }
}

#[derive(Debug, Clone, Default)]
pub struct Retention {
    window: Duration,
    /// `--max-peers`: at most this many departed servers (and the cap keeps as many live).
    max_peers: usize,
    entries: BTreeMap<String, Entry>,
}

/// The most entries a retention for `max_peers` holds: as many live as the cap allows, and as
/// many departed. What the state directory loads at most.
pub fn max_entries(max_peers: usize) -> usize {
    max_peers.saturating_mul(2)
}

impl Retention {
    /// `window` zero: nothing is ever retained (a peer's APIs leave with it).
    pub fn new(window: Duration, max_peers: usize) -> Self {
        Retention::restore(window, max_peers, BTreeMap::new())
    }

    /// Start from what the state directory held (bounded at the first [`Retention::bound`]).
    pub fn restore(window: Duration, max_peers: usize, entries: BTreeMap<String, Entry>) -> Self {
        Retention {
            window,
            max_peers,
            entries,
        }
    }

    pub fn window(&self) -> Duration {
        self.window
    }

    /// The seniority of every server kept (for `crate::peers::Tracker::restoring`).
    pub fn first_seen(&self) -> Vec<(String, FirstSeen)> {
        self.entries
            .iter()
            .filter_map(|(id, e)| Some((id.clone(), e.first_seen?)))
            .collect()
    }

    pub fn entries(&self) -> &BTreeMap<String, Entry> {
        &self.entries
    }

    /// `id` is live (first seen `first_seen`) and its discovery was (re)read: it is the truth
    /// for that server now.
    pub fn seen(
        &mut self,
        id: &str,
        documents: &Arc<DiscoveryDocuments>,
        first_seen: FirstSeen,
        changes: &mut Changes,
    ) {
        let entry = Entry {
            documents: documents.clone(),
            left_at: None,
            first_seen: Some(first_seen),
            address: self.entries.get(id).and_then(|e| e.address.clone()),
        };
        match self.entries.get(id) {
            // Same documents (by identity or content), still live, same seniority: nothing to
            // write.
            Some(old)
                if old.left_at.is_none()
                    && old.first_seen == entry.first_seen
                    && (Arc::ptr_eq(&old.documents, documents) || old.documents == *documents) =>
            {
                return;
            }
            _ => {}
        }
        self.entries.insert(id.to_string(), entry);
        changes.remove.remove(id);
        changes.evicted.remove(id);
        changes.write.insert(id.to_string());
    }

    /// `id` is live at `address` (its Lease's, as checked by the peer address policy). Nothing
    /// to write: addresses stay in memory ([`Entry::address`]).
    pub fn reached_at(&mut self, id: &str, address: Address) {
        if let Some(entry) = self.entries.get_mut(id) {
            entry.address = Some(address);
        }
    }

    /// `id` is no longer live (or not live at start): its APIs are retained from `now` on, if
    /// its discovery was ever known. Leaving twice keeps the first time. With a zero window it
    /// is forgotten at once.
    pub fn left(&mut self, id: &str, now: SystemTime, changes: &mut Changes) {
        if self.window.is_zero() {
            if self.entries.remove(id).is_some() {
                changes.write.remove(id);
                changes.remove.insert(id.to_string());
            }
            return;
        }
        if let Some(entry) = self.entries.get_mut(id) {
            if entry.left_at.is_none() {
                entry.left_at = Some(now);
                changes.write.insert(id.to_string());
            }
        }
    }

    /// Every server known here that is not in `live` has left (at `now`, unless it left before).
    pub fn left_unless(&mut self, live: &BTreeSet<&str>, now: SystemTime, changes: &mut Changes) {
        let gone: Vec<String> = self
            .entries
            .keys()
            .filter(|id| !live.contains(id.as_str()))
            .cloned()
            .collect();
        for id in gone {
            self.left(&id, now, changes);
        }
    }

    /// Drop what the window has passed for.
    pub fn expire(&mut self, now: SystemTime, changes: &mut Changes) {
        let window = self.window;
        let expired: Vec<String> = self
            .entries
            .iter()
            .filter(|(_, e)| e.left_at.is_some_and(|left| expiry(left, window) <= now))
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            self.entries.remove(&id);
            changes.write.remove(&id);
            changes.remove.insert(id);
        }
    }

    /// Keep at most `max_peers` departed servers: beyond that, drop the one first seen most
    /// recently (see the module doc), into `changes.evicted` (and `changes.remove`).
    pub fn bound(&mut self, changes: &mut Changes) {
        let mut departed: Vec<(FirstSeen, &str)> = self
            .entries
            .iter()
            .filter(|(_, e)| e.left_at.is_some())
            .map(|(id, e)| e.seniority(id))
            .collect();
        if departed.len() <= self.max_peers {
            return;
        }
        departed.sort_unstable();
        let evicted: Vec<String> = departed
            .split_off(self.max_peers)
            .into_iter()
            .map(|(_, id)| id.to_string())
            .collect();
        for id in evicted {
            self.entries.remove(&id);
            changes.write.remove(&id);
            changes.remove.insert(id.clone());
            changes.evicted.insert(id);
        }
    }

    /// The servers whose APIs are retained now, by id.
    pub fn retained(&self) -> Vec<Retained<'_>> {
        self.entries
            .iter()
            .filter_map(|(id, e)| {
                let left_at = e.left_at?;
                Some(Retained {
                    id,
                    documents: &e.documents,
                    address: e.address.as_ref(),
                    left_at,
                    expires_at: expiry(left_at, self.window),
                })
            })
            .collect()
    }

    /// How long until the next entry expires, if any is retained.
    pub fn next_expiry(&self, now: SystemTime) -> Option<Duration> {
        self.retained()
            .iter()
            .map(|r| r.expires_at.duration_since(now).unwrap_or(Duration::ZERO))
            .min()
    }
}

fn expiry(left_at: SystemTime, window: Duration) -> SystemTime {
    left_at.checked_add(window).unwrap_or(left_at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_fixtures::documents;
    use std::time::UNIX_EPOCH;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    fn ids(r: &Retention) -> Vec<&str> {
        r.retained().iter().map(|r| r.id).collect()
    }

    fn set(ids: &[&str]) -> BTreeSet<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    const SENIOR: FirstSeen = FirstSeen(1);

    #[test]
    fn enter_expire_revive() {
        let old = Arc::new(documents("k8s-1.33"));
        let new = Arc::new(documents("k8s-1.30"));
        let mut r = Retention::new(Duration::from_secs(900), 16);
        let mut c = Changes::default();

        // Live: known, not retained.
        r.seen("b", &old, SENIOR, &mut c);
        assert_eq!(c.write, set(&["b"]));
        assert!(ids(&r).is_empty());
        // The same documents again write nothing.
        let mut c = Changes::default();
        r.seen("b", &Arc::new(documents("k8s-1.33")), SENIOR, &mut c);
        assert!(c.is_empty());
        // A new seniority (the lease was deleted and created again) is written.
        r.seen("b", &old, FirstSeen(7), &mut c);
        assert_eq!(c.write, set(&["b"]));
        r.seen("b", &old, SENIOR, &mut c);
        // Where it is reached: in memory only (nothing to write), kept across a new read.
        let b_at = Address {
            host: "10.0.0.2".into(),
            port: 6443,
        };
        let mut c = Changes::default();
        r.reached_at("b", b_at.clone());
        r.reached_at("unknown", b_at.clone());
        assert!(c.is_empty());
        r.seen("b", &new, SENIOR, &mut c);
        r.seen("b", &old, SENIOR, &mut c);
        assert_eq!(r.entries().len(), 1, "an address alone keeps nothing");

        // It leaves: retained, with its expiry and its last address.
        r.left_unless(&BTreeSet::new(), at(0), &mut c);
        assert_eq!(ids(&r), ["b"]);
        assert_eq!(r.retained()[0].address, Some(&b_at));
        assert_eq!(r.retained()[0].expires_at, at(900));
        assert_eq!(r.next_expiry(at(100)), Some(Duration::from_secs(800)));
        // Leaving again keeps the first time.
        r.left("b", at(50), &mut c);
        assert_eq!(r.retained()[0].left_at, at(0));

        // Not yet expired at 899 s; expired at 900 s.
        let mut c = Changes::default();
        r.expire(at(899), &mut c);
        assert_eq!(ids(&r), ["b"]);
        r.expire(at(900), &mut c);
        assert!(ids(&r).is_empty());
        assert_eq!(c.remove, set(&["b"]));
        assert!(c.evicted.is_empty(), "expired, not evicted");
        assert_eq!(r.next_expiry(at(900)), None);

        // Back within the window with fresh discovery: its new view is the truth at once.
        let mut r = Retention::new(Duration::from_secs(900), 16);
        let mut c = Changes::default();
        r.seen("b", &old, SENIOR, &mut c);
        r.left("b", at(0), &mut c);
        r.seen("b", &new, SENIOR, &mut c);
        assert!(ids(&r).is_empty());
        assert_eq!(r.entries()["b"].documents, new);
    }

    #[test]
    fn a_server_never_read_is_never_retained_and_zero_keeps_only_the_live_ones() {
        let mut r = Retention::new(Duration::from_secs(900), 16);
        let mut c = Changes::default();
        r.left("never-read", at(0), &mut c);
        assert!(ids(&r).is_empty() && c.is_empty());

        // A zero window retains nothing, but keeps a live server's seniority for a restart.
        let mut off = Retention::new(Duration::ZERO, 16);
        off.seen("b", &Arc::new(documents("k8s-1.33")), SENIOR, &mut c);
        assert_eq!(off.first_seen(), [("b".to_string(), SENIOR)]);
        let mut c = Changes::default();
        off.left("b", at(0), &mut c);
        assert!(ids(&off).is_empty() && off.entries().is_empty());
        assert_eq!(c.remove, set(&["b"]));
    }

    /// The finding of issue 18: rounds of short-lived leases, each fetched while live, left a
    /// copy of discovery each for the whole window (45 leases: 46 copies). Now at most
    /// `max_peers` departed copies stay, and never at the expense of a peer known before.
    #[test]
    fn a_flood_of_short_lived_peers_is_bounded_and_never_evicts_a_known_peer() {
        const MAX_PEERS: usize = 16;
        let docs = Arc::new(documents("k8s-1.33"));
        let mut r = Retention::new(Duration::from_secs(900), MAX_PEERS);
        let mut c = Changes::default();
        // Known peers: "m" left (an upgrade in progress), "n" live.
        r.seen("m", &docs, FirstSeen(10), &mut c);
        r.seen("n", &docs, FirstSeen(11), &mut c);
        r.left("m", at(0), &mut c);
        // Three rounds of 15 leases (all the cap leaves free), each live, fetched, then gone;
        // each round first seen after the last. Names sort before the real ones.
        let mut evicted = BTreeSet::new();
        for round in 0..3u64 {
            let mut c = Changes::default();
            let fakes: Vec<String> = (0..15).map(|i| format!("a-{round}-{i:02}")).collect();
            for (i, id) in fakes.iter().enumerate() {
                r.seen(id, &docs, FirstSeen(100 * (round + 1) + i as u64), &mut c);
            }
            r.left_unless(&BTreeSet::from(["n"]), at(10 * (round + 1)), &mut c);
            r.expire(at(10 * (round + 1)), &mut c);
            r.bound(&mut c);
            assert!(c.evicted.is_subset(&c.remove));
            assert!(c.write.is_disjoint(&c.remove));
            evicted.extend(c.evicted);
            let departed = r.retained().len();
            assert!(departed <= MAX_PEERS, "round {round}: {departed} retained");
            assert!(r.entries().len() <= max_entries(MAX_PEERS));
            assert!(
                ids(&r).contains(&"m"),
                "round {round}: the known peer's retention stays"
            );
            assert!(r.entries().contains_key("n"));
        }
        // 45 + m departed, 16 kept: m and the 15 most senior fakes (the first round's).
        assert_eq!(r.retained().len(), MAX_PEERS);
        assert_eq!(evicted.len(), 45 + 1 - MAX_PEERS);
        let kept: BTreeSet<&str> = ids(&r).into_iter().collect();
        assert!(
            kept.iter().all(|id| *id == "m" || id.starts_with("a-0-")),
            "{kept:?}"
        );
        // Evicted ones are counted once: gone from the model.
        assert!(evicted.iter().all(|id| !r.entries().contains_key(id)));
    }

    #[test]
    fn restored_entries_keep_their_time_and_unknown_seniority_ranks_last() {
        let docs = Arc::new(documents("k8s-1.33"));
        let entry = |left_at, first_seen| Entry {
            address: None,
            documents: docs.clone(),
            left_at,
            first_seen,
        };
        let entries = BTreeMap::from([
            ("gone".to_string(), entry(Some(at(0)), Some(FirstSeen(5)))),
            ("was-live".to_string(), entry(None, Some(FirstSeen(6)))),
            // A file of a version that did not keep seniority.
            ("old-file".to_string(), entry(Some(at(0)), None)),
        ]);
        let mut r = Retention::restore(Duration::from_secs(900), 2, entries);
        assert_eq!(
            r.first_seen(),
            [
                ("gone".to_string(), FirstSeen(5)),
                ("was-live".to_string(), FirstSeen(6))
            ]
        );
        let mut c = Changes::default();
        // At start nobody is live yet: the one that was live when we stopped leaves now; the
        // one that had left keeps its time.
        r.left_unless(&BTreeSet::new(), at(600), &mut c);
        r.bound(&mut c);
        assert_eq!(
            c.evicted,
            set(&["old-file"]),
            "unknown seniority goes first"
        );
        let retained = r.retained();
        assert_eq!(retained[0].id, "gone");
        assert_eq!(retained[0].expires_at, at(900));
        assert_eq!(retained[1].id, "was-live");
        assert_eq!(retained[1].expires_at, at(1500));
    }
}
