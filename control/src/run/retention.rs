//! API retention: the last good discovery of every peer apiserver, kept after it leaves, so that
//! an API whose objects are still in etcd never vanishes with its last server.
//!
//! When a peer stops being live (its Lease expired or was deleted), its last good discovery is
//! kept for `--api-retention` (15 minutes by default). During that window every group, version
//! and resource it served that no live apiserver serves stays in merged discovery (a group-version
//! nobody live serves is marked `freshness: Stale`) and requests for it are answered 503 (see
//! [`crate::plan`]). A retained server stops counting:
//!
//! - when it is live again with fresh discovery ([`Retention::seen`]): then its new view is the
//!   truth, and whatever it no longer lists is gone at once (an upgrade that removed an API must
//!   not hold up namespace deletion for the whole window);
//! - when the window has passed ([`Retention::expire`]): the server never came back (a node taken
//!   out), and the local 404 is the truth again.
//!
//! The model is pure (time is passed in). What it holds is written to the state directory by
//! [`super::state_dir`], so a control-plane restart keeps the retention.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::discovery::DiscoveryDocuments;

/// kube-style default: long enough for a node's upgrade or reboot, short enough that a node taken
/// out for good stops holding up namespace deletion the same day.
pub const DEFAULT_API_RETENTION: Duration = Duration::from_secs(15 * 60);

/// One peer apiserver's last good discovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub documents: Arc<DiscoveryDocuments>,
    /// When it stopped being live; `None` while it is live.
    pub left_at: Option<SystemTime>,
}

/// A retained server, as composition sees it.
#[derive(Debug, Clone, Copy)]
pub struct Retained<'a> {
    pub id: &'a str,
    pub documents: &'a DiscoveryDocuments,
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
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.write.is_empty() && self.remove.is_empty()
    }
}

#[derive(Debug, Clone, Default)]
pub struct Retention {
    window: Duration,
    entries: BTreeMap<String, Entry>,
}

impl Retention {
    /// `window` zero: nothing is ever retained (a peer's APIs leave with it).
    pub fn new(window: Duration) -> Self {
        Retention {
            window,
            entries: BTreeMap::new(),
        }
    }

    /// Start from what the state directory held.
    pub fn restore(window: Duration, entries: BTreeMap<String, Entry>) -> Self {
        Retention { window, entries }
    }

    pub fn window(&self) -> Duration {
        self.window
    }

    pub fn entries(&self) -> &BTreeMap<String, Entry> {
        &self.entries
    }

    /// `id` is live and its discovery was (re)read: it is the truth for that server now.
    pub fn seen(&mut self, id: &str, documents: &Arc<DiscoveryDocuments>, changes: &mut Changes) {
        if self.window.is_zero() {
            return;
        }
        let entry = Entry {
            documents: documents.clone(),
            left_at: None,
        };
        match self.entries.get(id) {
            // Same documents (by identity or content), still live: nothing to write.
            Some(old)
                if old.left_at.is_none()
                    && (Arc::ptr_eq(&old.documents, documents) || old.documents == *documents) =>
            {
                return;
            }
            _ => {}
        }
        self.entries.insert(id.to_string(), entry);
        changes.write.insert(id.to_string());
    }

    /// `id` is no longer live (or not live at start): its APIs are retained from `now` on, if
    /// its discovery was ever known. Leaving twice keeps the first time.
    pub fn left(&mut self, id: &str, now: SystemTime, changes: &mut Changes) {
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

    /// The servers whose APIs are retained now, by id.
    pub fn retained(&self) -> Vec<Retained<'_>> {
        self.entries
            .iter()
            .filter_map(|(id, e)| {
                let left_at = e.left_at?;
                Some(Retained {
                    id,
                    documents: &e.documents,
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

    #[test]
    fn enter_expire_revive() {
        let old = Arc::new(documents("k8s-1.33"));
        let new = Arc::new(documents("k8s-1.30"));
        let mut r = Retention::new(Duration::from_secs(900));
        let mut c = Changes::default();

        // Live: known, not retained.
        r.seen("b", &old, &mut c);
        assert_eq!(c.write, BTreeSet::from(["b".to_string()]));
        assert!(ids(&r).is_empty());
        // The same documents again write nothing.
        let mut c = Changes::default();
        r.seen("b", &Arc::new(documents("k8s-1.33")), &mut c);
        assert!(c.is_empty());

        // It leaves: retained, with its expiry.
        r.left_unless(&BTreeSet::new(), at(0), &mut c);
        assert_eq!(ids(&r), ["b"]);
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
        assert_eq!(c.remove, BTreeSet::from(["b".to_string()]));
        assert_eq!(r.next_expiry(at(900)), None);

        // Back within the window with fresh discovery: its new view is the truth at once.
        let mut r = Retention::new(Duration::from_secs(900));
        let mut c = Changes::default();
        r.seen("b", &old, &mut c);
        r.left("b", at(0), &mut c);
        r.seen("b", &new, &mut c);
        assert!(ids(&r).is_empty());
        assert_eq!(r.entries()["b"].documents, new);
    }

    #[test]
    fn a_server_never_read_is_never_retained_and_zero_keeps_nothing() {
        let mut r = Retention::new(Duration::from_secs(900));
        let mut c = Changes::default();
        r.left("never-read", at(0), &mut c);
        assert!(ids(&r).is_empty() && c.is_empty());

        let mut off = Retention::new(Duration::ZERO);
        off.seen("b", &Arc::new(documents("k8s-1.33")), &mut c);
        off.left("b", at(0), &mut c);
        assert!(ids(&off).is_empty() && c.is_empty());
    }

    #[test]
    fn restored_entries_keep_their_time() {
        let docs = Arc::new(documents("k8s-1.33"));
        let entries = BTreeMap::from([
            (
                "gone".to_string(),
                Entry {
                    documents: docs.clone(),
                    left_at: Some(at(0)),
                },
            ),
            (
                "was-live".to_string(),
                Entry {
                    documents: docs,
                    left_at: None,
                },
            ),
        ]);
        let mut r = Retention::restore(Duration::from_secs(900), entries);
        let mut c = Changes::default();
        // At start nobody is live yet: the one that was live when we stopped leaves now; the
        // one that had left keeps its time.
        r.left_unless(&BTreeSet::new(), at(600), &mut c);
        let retained = r.retained();
        assert_eq!(retained[0].id, "gone");
        assert_eq!(retained[0].expires_at, at(900));
        assert_eq!(retained[1].id, "was-live");
        assert_eq!(retained[1].expires_at, at(1500));
    }
}
