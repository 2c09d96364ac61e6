//! The pure part of the peer watcher: identity leases in, [`PeerSet`] snapshots out.
//!
//! A [`Tracker`] holds the leases the watcher has seen (plain [`LeaseInfo`] data, no kube
//! types) and, for a given wall-clock `now`, evaluates them:
//!
//! - **liveness**: a lease is live while `now - renewTime <= grace` (default 30 s). A lease
//!   without `renewTime` is never live. A `renewTime` in the future (clock skew) counts as
//!   just renewed. `leaseDurationSeconds` is ignored on purpose: kube-apiserver writes 3600 and
//!   keeps dead peers for up to an hour; we must not.
//! - **restarts**: kube-apiserver writes a new `holderIdentity` (`<id>_<uuid>`) every time it
//!   starts. Each (lease name, holder identity) pair gets its own `generation` from one
//!   increasing counter, so a restart — or a lease that is deleted and comes back — changes the
//!   peer's generation, and whoever fetches its discovery fetches again.
//! - **addresses**: see [`super::address`] (mapping wins over the annotation; annotations only
//!   inside the configured CIDRs).
//! - **which lease is ours**: by lease name, or by the `kubernetes.io/hostname` label. The
//!   local apiserver is reported apart ([`PeerSet::local`]) and never as a peer.
//! - **a failing watch**: while the lease watch is failing we cannot tell a dead peer from one
//!   whose renewals we do not see, so liveness is frozen at the moment the watch failed
//!   ([`PeerSet::stale`]) until it works again. Dropping every peer instead would turn their
//!   resources into 404s; keeping them costs at most a 503 from a peer that really died.
//!
//! Snapshots are deterministic: peers and exclusions sorted by lease name.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use super::address::{AddressPolicy, AddressSource, RejectReason};

/// The label every kube-apiserver identity lease carries, and its value.
pub const IDENTITY_LABEL: &str = "apiserver.kubernetes.io/identity";
pub const IDENTITY_LABEL_VALUE: &str = "kube-apiserver";
/// The hostname label of an identity lease.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
/// Where kube-apiserver keeps its identity leases.
pub const LEASE_NAMESPACE: &str = "kube-system";
/// Default grace after the last renewal before a peer counts as dead (kube renews every 10 s).
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);

/// Which lease belongs to the apiserver this control plane sits beside.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum LocalSelector {
    /// Not known: every lease is a peer.
    #[default]
    None,
    /// `--local-lease apiserver-<hash>`
    LeaseName(String),
    /// `--node-name <hostname>`: the lease whose `kubernetes.io/hostname` label is this.
    Hostname(String),
}

/// Everything the peer watcher is told by the operator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerConfig {
    /// After this long without a renewal a peer is dead.
    pub grace: Duration,
    pub policy: AddressPolicy,
    pub local: LocalSelector,
}

impl Default for PeerConfig {
    fn default() -> Self {
        PeerConfig {
            grace: DEFAULT_GRACE,
            policy: AddressPolicy::default(),
            local: LocalSelector::None,
        }
    }
}

/// What we read from one identity lease.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseInfo {
    /// The lease name: kube-apiserver's identity (`apiserver-<hash>`).
    pub name: String,
    pub holder_identity: Option<String>,
    /// The `kubernetes.io/hostname` label.
    pub hostname: Option<String>,
    pub renew_time: Option<SystemTime>,
    /// The `kubernetes.io/peer-advertise-address` annotation, as written.
    pub peer_advertise_address: Option<String>,
}

/// A live peer apiserver we may route to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// The lease name.
    pub id: String,
    pub holder_identity: String,
    pub hostname: Option<String>,
    pub renew_time: SystemTime,
    pub address: SocketAddr,
    pub address_source: AddressSource,
    /// Changes whenever the holder identity changes (a restart): refetch its discovery.
    pub generation: u64,
}

/// The local apiserver's own lease (its address is not needed: Envoy reaches it locally).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalLease {
    pub id: String,
    pub holder_identity: String,
    pub hostname: Option<String>,
    pub renew_time: Option<SystemTime>,
    pub generation: u64,
    pub live: bool,
}

/// Why a lease is not in [`PeerSet::peers`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Exclusion {
    /// No `spec.renewTime`.
    NeverRenewed,
    /// Not renewed within the grace.
    Expired,
    /// No usable address (see the reason).
    Address(RejectReason),
    /// Another lease carries the local hostname; the chosen one is [`PeerSet::local`].
    DuplicateLocal,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExcludedPeer {
    pub id: String,
    pub holder_identity: String,
    pub generation: u64,
    pub reason: Exclusion,
}

/// One view of the control plane's apiservers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerSet {
    /// The initial list has completed at least once; before that an empty set means "not
    /// known yet", not "no peers".
    pub synced: bool,
    /// The lease watch is failing: liveness is as of the moment it failed.
    pub stale: bool,
    pub local: Option<LocalLease>,
    /// Live remote peers with an accepted address, sorted by id.
    pub peers: Vec<Peer>,
    /// Every other identity lease and why, sorted by id.
    pub excluded: Vec<ExcludedPeer>,
}

impl PeerSet {
    pub fn peer(&self, id: &str) -> Option<&Peer> {
        self.peers.iter().find(|p| p.id == id)
    }

    pub fn excluded(&self, id: &str) -> Option<&ExcludedPeer> {
        self.excluded.iter().find(|p| p.id == id)
    }

    /// `(id, generation, address)` of every peer: what routing and discovery depend on
    /// (renewals change `renew_time` every 10 s; this does not).
    pub fn endpoints(&self) -> Vec<(&str, u64, SocketAddr)> {
        self.peers
            .iter()
            .map(|p| (p.id.as_str(), p.generation, p.address))
            .collect()
    }
}

/// `now - renew <= grace`; never renewed is dead; a renewal in the future is live.
pub fn is_live(renew: Option<SystemTime>, now: SystemTime, grace: Duration) -> bool {
    match renew {
        None => false,
        Some(t) => match now.duration_since(t) {
            Ok(age) => age <= grace,
            Err(_) => true,
        },
    }
}

/// Something the caller should log (and count).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    /// A known lease got a new holder identity: the apiserver restarted.
    Restarted {
        id: String,
        old_holder: String,
        new_holder: String,
        generation: u64,
    },
    /// A lease's address was refused. Reported once per (lease, value, reason), not on every
    /// renewal.
    AddressRejected {
        id: String,
        value: Option<String>,
        reason: RejectReason,
    },
}

/// The result of one evaluation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Evaluation {
    pub set: PeerSet,
    pub notices: Vec<Notice>,
    /// When the next live lease expires if nobody renews it (re-evaluate then).
    pub next_expiry: Option<Duration>,
}

/// The leases seen so far and the generations handed out.
#[derive(Debug)]
pub struct Tracker {
    config: PeerConfig,
    leases: BTreeMap<String, LeaseInfo>,
    /// A re-list in progress (kube-runtime's Init .. InitDone); `leases` stays current until
    /// it completes.
    relist: Option<BTreeMap<String, LeaseInfo>>,
    /// lease name -> (holder identity, generation)
    generations: BTreeMap<String, (String, u64)>,
    next_generation: u64,
    synced: bool,
    /// lease name -> what was last reported as refused, so it is reported once.
    reported: BTreeMap<String, (Option<String>, RejectReason)>,
    /// Restarts seen since the last evaluation.
    pending_notices: Vec<Notice>,
    /// Set while the watch is failing: liveness is evaluated as of then.
    frozen_at: Option<SystemTime>,
}

impl Tracker {
    pub fn new(config: PeerConfig) -> Self {
        Tracker {
            config,
            leases: BTreeMap::new(),
            relist: None,
            generations: BTreeMap::new(),
            next_generation: 1,
            synced: false,
            reported: BTreeMap::new(),
            pending_notices: Vec::new(),
            frozen_at: None,
        }
    }

    /// The watch failed at `now`: freeze liveness (the first failure counts) until
    /// [`Tracker::watch_ok`].
    pub fn watch_failed(&mut self, now: SystemTime) {
        self.frozen_at.get_or_insert(now);
    }

    /// The watch delivered an event again.
    pub fn watch_ok(&mut self) {
        self.frozen_at = None;
    }

    pub fn config(&self) -> &PeerConfig {
        &self.config
    }

    /// The generation of `(name, holder)`, handing out a new one for a new pair.
    fn generation_for(&mut self, info: &LeaseInfo) -> u64 {
        let holder = info.holder_identity.clone().unwrap_or_default();
        match self.generations.get(&info.name) {
            Some((h, g)) if *h == holder => *g,
            previous => {
                let old = previous.map(|(h, _)| h.clone());
                let g = self.next_generation;
                self.next_generation += 1;
                if let Some(old_holder) = old {
                    self.pending_notices.push(Notice::Restarted {
                        id: info.name.clone(),
                        old_holder,
                        new_holder: holder.clone(),
                        generation: g,
                    });
                }
                self.generations.insert(info.name.clone(), (holder, g));
                g
            }
        }
    }

    /// A lease was added or changed.
    pub fn apply(&mut self, info: LeaseInfo) {
        self.generation_for(&info);
        self.leases.insert(info.name.clone(), info);
    }

    /// A lease was deleted.
    pub fn delete(&mut self, name: &str) {
        self.leases.remove(name);
        self.generations.remove(name);
        self.reported.remove(name);
    }

    /// A (re-)list starts: collect until [`Tracker::finish_relist`].
    pub fn begin_relist(&mut self) {
        self.relist = Some(BTreeMap::new());
    }

    pub fn relist_apply(&mut self, info: LeaseInfo) {
        self.relist
            .get_or_insert_with(BTreeMap::new)
            .insert(info.name.clone(), info);
    }

    /// The list is complete: it replaces what we had (leases deleted meanwhile disappear).
    pub fn finish_relist(&mut self) {
        let listed = self.relist.take().unwrap_or_default();
        let gone: Vec<String> = self
            .leases
            .keys()
            .filter(|n| !listed.contains_key(*n))
            .cloned()
            .collect();
        for name in gone {
            self.delete(&name);
        }
        for info in listed.into_values() {
            self.apply(info);
        }
        self.synced = true;
    }

    fn local_name(&self, now: SystemTime) -> Option<String> {
        match &self.config.local {
            LocalSelector::None => None,
            LocalSelector::LeaseName(n) => self.leases.contains_key(n).then(|| n.clone()),
            LocalSelector::Hostname(h) => self
                .leases
                .values()
                .filter(|l| l.hostname.as_deref() == Some(h.as_str()))
                // Prefer live, then the latest renewal, then the smallest name.
                .max_by(|a, b| {
                    let live = |l: &LeaseInfo| is_live(l.renew_time, now, self.config.grace);
                    (live(a), a.renew_time)
                        .cmp(&(live(b), b.renew_time))
                        .then_with(|| b.name.cmp(&a.name))
                })
                .map(|l| l.name.clone()),
        }
    }

    /// The peer set as of `now` (or as of the watch failure, while it fails), and what to
    /// log.
    pub fn evaluate(&mut self, now: SystemTime) -> Evaluation {
        let stale = self.frozen_at.is_some();
        let now = self.frozen_at.map_or(now, |f| f.min(now));
        let grace = self.config.grace;
        let local_name = self.local_name(now);
        let mut set = PeerSet {
            synced: self.synced,
            stale,
            ..Default::default()
        };
        let mut notices = std::mem::take(&mut self.pending_notices);
        let mut next_expiry: Option<Duration> = None;
        let mut still_rejected = BTreeMap::new();
        for info in self.leases.values() {
            let holder = info.holder_identity.clone().unwrap_or_default();
            let generation = self
                .generations
                .get(&info.name)
                .map(|(_, g)| *g)
                .unwrap_or(0);
            let live = is_live(info.renew_time, now, grace);
            if live {
                if let Some(renew) = info.renew_time {
                    // Dead just after renew + grace.
                    let left = (renew + grace + Duration::from_millis(1))
                        .duration_since(now)
                        .unwrap_or_default();
                    next_expiry = Some(next_expiry.map_or(left, |n| n.min(left)));
                }
            }
            let exclude = |reason| ExcludedPeer {
                id: info.name.clone(),
                holder_identity: holder.clone(),
                generation,
                reason,
            };
            if local_name.as_deref() == Some(info.name.as_str()) {
                set.local = Some(LocalLease {
                    id: info.name.clone(),
                    holder_identity: holder.clone(),
                    hostname: info.hostname.clone(),
                    renew_time: info.renew_time,
                    generation,
                    live,
                });
                continue;
            }
            if let LocalSelector::Hostname(h) = &self.config.local {
                if info.hostname.as_deref() == Some(h.as_str()) {
                    set.excluded.push(exclude(Exclusion::DuplicateLocal));
                    continue;
                }
            }
            let Some(renew_time) = info.renew_time else {
                set.excluded.push(exclude(Exclusion::NeverRenewed));
                continue;
            };
            if !live {
                set.excluded.push(exclude(Exclusion::Expired));
                continue;
            }
            match self.config.policy.resolve(
                &info.name,
                info.hostname.as_deref(),
                info.peer_advertise_address.as_deref(),
            ) {
                Ok((address, address_source)) => set.peers.push(Peer {
                    id: info.name.clone(),
                    holder_identity: holder,
                    hostname: info.hostname.clone(),
                    renew_time,
                    address,
                    address_source,
                    generation,
                }),
                Err(reason) => {
                    let value = info.peer_advertise_address.clone();
                    let key = (value.clone(), reason);
                    if self.reported.get(&info.name) != Some(&key) {
                        notices.push(Notice::AddressRejected {
                            id: info.name.clone(),
                            value,
                            reason,
                        });
                    }
                    still_rejected.insert(info.name.clone(), key);
                    set.excluded.push(exclude(Exclusion::Address(reason)));
                }
            }
        }
        // Forget reports of leases that are gone, dead or accepted now: a relapse is reported.
        self.reported = still_rejected;
        Evaluation {
            set,
            notices,
            // Frozen: nothing expires until the watch works again.
            next_expiry: if stale { None } else { next_expiry },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::address::{parse_cidr, MappingEntry};
    use super::*;
    use std::time::UNIX_EPOCH;

    const T0: u64 = 1_700_000_000;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(T0 + secs)
    }

    fn lease(name: &str, holder: &str, renew: Option<u64>, addr: Option<&str>) -> LeaseInfo {
        LeaseInfo {
            name: name.into(),
            holder_identity: Some(holder.into()),
            hostname: Some(format!("host-{name}")),
            renew_time: renew.map(at),
            peer_advertise_address: addr.map(String::from),
        }
    }

    fn config(cidrs: &[&str]) -> PeerConfig {
        PeerConfig {
            grace: Duration::from_secs(30),
            policy: AddressPolicy::new(cidrs.iter().map(|c| parse_cidr(c).unwrap()).collect(), []),
            local: LocalSelector::None,
        }
    }

    fn synced(cfg: PeerConfig, leases: Vec<LeaseInfo>) -> Tracker {
        let mut t = Tracker::new(cfg);
        t.begin_relist();
        for l in leases {
            t.relist_apply(l);
        }
        t.finish_relist();
        t
    }

    fn ids(set: &PeerSet) -> Vec<&str> {
        set.peers.iter().map(|p| p.id.as_str()).collect()
    }

    #[test]
    fn liveness_table() {
        let g = Duration::from_secs(30);
        let cases = [
            (None, 0, false),
            (Some(100), 100, true),
            (Some(100), 130, true), // exactly the grace: still live
            (Some(100), 131, false),
            (Some(100), 3600, false), // upstream would still keep it (1 h lease)
            (Some(200), 100, true),   // renewed "in the future": clock skew
        ];
        for (renew, now, want) in cases {
            assert_eq!(
                is_live(renew.map(at), at(now), g),
                want,
                "{renew:?} @ {now}"
            );
        }
        assert!(!is_live(
            Some(at(100)),
            at(100) + Duration::from_millis(30_001),
            g
        ));
    }

    #[test]
    fn live_peers_sorted_dead_and_unrenewed_excluded() {
        let mut t = synced(
            config(&["10.0.0.0/8"]),
            vec![
                lease("apiserver-c", "c_1", Some(95), Some("10.0.0.3:6443")),
                lease("apiserver-a", "a_1", Some(99), Some("10.0.0.1:6443")),
                lease("apiserver-b", "b_1", Some(50), Some("10.0.0.2:6443")),
                lease("apiserver-d", "d_1", None, Some("10.0.0.4:6443")),
            ],
        );
        let e = t.evaluate(at(100));
        assert!(e.set.synced);
        assert_eq!(ids(&e.set), ["apiserver-a", "apiserver-c"]);
        assert_eq!(
            e.set.excluded("apiserver-b").unwrap().reason,
            Exclusion::Expired
        );
        assert_eq!(
            e.set.excluded("apiserver-d").unwrap().reason,
            Exclusion::NeverRenewed
        );
        assert_eq!(
            e.set.peer("apiserver-a").unwrap().address,
            "10.0.0.1:6443".parse().unwrap()
        );
        // apiserver-c (renewed at 95) expires first: at 125 s + 1 ms.
        assert_eq!(e.next_expiry, Some(Duration::from_millis(25_001)));
        // Nobody renews: c drops out on the timer, then a.
        let e = t.evaluate(at(126));
        assert_eq!(ids(&e.set), ["apiserver-a"]);
        let e = t.evaluate(at(130));
        assert_eq!(ids(&e.set), Vec::<&str>::new());
        assert_eq!(e.next_expiry, None);
        // A renewal brings a back, same generation.
        let g = t.generations["apiserver-a"].1;
        t.apply(lease(
            "apiserver-a",
            "a_1",
            Some(131),
            Some("10.0.0.1:6443"),
        ));
        let e = t.evaluate(at(132));
        assert_eq!(ids(&e.set), ["apiserver-a"]);
        assert_eq!(e.set.peers[0].generation, g);
        assert!(e.notices.is_empty());
    }

    #[test]
    fn not_synced_until_the_first_list_completes() {
        let mut t = Tracker::new(config(&["10.0.0.0/8"]));
        assert!(!t.evaluate(at(0)).set.synced);
        t.begin_relist();
        t.relist_apply(lease("apiserver-a", "a_1", Some(0), Some("10.0.0.1:1")));
        assert!(!t.evaluate(at(0)).set.synced);
        assert!(t.evaluate(at(0)).set.peers.is_empty());
        t.finish_relist();
        assert_eq!(ids(&t.evaluate(at(0)).set), ["apiserver-a"]);
    }

    #[test]
    fn restart_changes_the_generation() {
        let mut t = synced(
            config(&["10.0.0.0/8"]),
            vec![
                lease("apiserver-a", "apiserver-a_1", Some(0), Some("10.0.0.1:1")),
                lease("apiserver-b", "apiserver-b_1", Some(0), Some("10.0.0.2:1")),
            ],
        );
        let before = t.evaluate(at(1)).set;
        let (ga, gb) = (
            before.peer("apiserver-a").unwrap().generation,
            before.peer("apiserver-b").unwrap().generation,
        );
        assert_ne!(ga, gb);
        // Renewal by the same holder: no change.
        t.apply(lease(
            "apiserver-a",
            "apiserver-a_1",
            Some(5),
            Some("10.0.0.1:1"),
        ));
        let e = t.evaluate(at(6));
        assert_eq!(e.set.peer("apiserver-a").unwrap().generation, ga);
        assert!(e.notices.is_empty());
        // New holder: a restart.
        t.apply(lease(
            "apiserver-a",
            "apiserver-a_2",
            Some(7),
            Some("10.0.0.1:1"),
        ));
        let e = t.evaluate(at(8));
        let ga2 = e.set.peer("apiserver-a").unwrap().generation;
        assert!(ga2 > ga && ga2 != gb);
        assert_eq!(e.set.peer("apiserver-b").unwrap().generation, gb);
        assert_eq!(
            e.notices,
            vec![Notice::Restarted {
                id: "apiserver-a".into(),
                old_holder: "apiserver-a_1".into(),
                new_holder: "apiserver-a_2".into(),
                generation: ga2,
            }]
        );
        // Restart back to an older holder is a restart too (generations never go back).
        t.apply(lease(
            "apiserver-a",
            "apiserver-a_1",
            Some(9),
            Some("10.0.0.1:1"),
        ));
        let ga3 = t
            .evaluate(at(9))
            .set
            .peer("apiserver-a")
            .unwrap()
            .generation;
        assert!(ga3 > ga2);
        // Deleted and recreated: new generation, no "restart" notice (it was gone).
        t.delete("apiserver-a");
        assert!(t.evaluate(at(10)).set.peer("apiserver-a").is_none());
        t.apply(lease(
            "apiserver-a",
            "apiserver-a_1",
            Some(10),
            Some("10.0.0.1:1"),
        ));
        let e = t.evaluate(at(10));
        assert!(e.set.peer("apiserver-a").unwrap().generation > ga3);
        assert!(e.notices.is_empty());
    }

    #[test]
    fn relist_keeps_generations_and_drops_vanished_leases() {
        let mut t = synced(
            config(&["10.0.0.0/8"]),
            vec![
                lease("apiserver-a", "a_1", Some(0), Some("10.0.0.1:1")),
                lease("apiserver-b", "b_1", Some(0), Some("10.0.0.2:1")),
            ],
        );
        let before = t.evaluate(at(1)).set;
        // A watch desync: re-list without b, and with a restarted.
        t.begin_relist();
        t.relist_apply(lease("apiserver-a", "a_1", Some(1), Some("10.0.0.1:1")));
        t.relist_apply(lease("apiserver-c", "c_1", Some(1), Some("10.0.0.3:1")));
        // Until the list is complete the old view stands.
        assert_eq!(ids(&t.evaluate(at(2)).set), ["apiserver-a", "apiserver-b"]);
        t.finish_relist();
        let after = t.evaluate(at(2)).set;
        assert_eq!(ids(&after), ["apiserver-a", "apiserver-c"]);
        assert_eq!(
            after.peer("apiserver-a").unwrap().generation,
            before.peer("apiserver-a").unwrap().generation
        );
    }

    #[test]
    fn hostile_annotations_never_become_peers_and_are_reported_once() {
        let mut t = synced(
            config(&["10.0.0.0/24", "fd00::/64"]),
            vec![
                lease("apiserver-1", "h", Some(0), Some("evil.com:443")),
                lease("apiserver-2", "h", Some(0), Some("10.0.0.1:99999")),
                lease("apiserver-3", "h", Some(0), Some("[::1]")),
                lease("apiserver-4", "h", Some(0), Some("")),
                lease("apiserver-5", "h", Some(0), Some("192.0.2.1:6443")),
                lease("apiserver-6", "h", Some(0), Some("[fd01::1]:6443")),
                lease("apiserver-7", "h", Some(0), None),
                lease("apiserver-8", "h", Some(0), Some("[fd00::8]:6443")),
            ],
        );
        let e = t.evaluate(at(1));
        assert_eq!(ids(&e.set), ["apiserver-8"]);
        let reasons: Vec<(String, RejectReason)> = e
            .notices
            .iter()
            .map(|n| match n {
                Notice::AddressRejected { id, reason, .. } => (id.clone(), *reason),
                other => panic!("{other:?}"),
            })
            .collect();
        use RejectReason::*;
        let want = [
            ("apiserver-1", Hostname),
            ("apiserver-2", Invalid),
            ("apiserver-3", Invalid),
            ("apiserver-4", Empty),
            ("apiserver-5", OutsideCidrs),
            ("apiserver-6", OutsideCidrs),
            ("apiserver-7", Missing),
        ];
        assert_eq!(
            reasons,
            want.iter()
                .map(|(i, r)| (i.to_string(), *r))
                .collect::<Vec<_>>()
        );
        for (id, r) in want {
            assert_eq!(e.set.excluded(id).unwrap().reason, Exclusion::Address(r));
        }
        // Renewals do not repeat the warning...
        t.apply(lease("apiserver-1", "h", Some(10), Some("evil.com:443")));
        assert!(t.evaluate(at(11)).notices.is_empty());
        // ...a new value does.
        t.apply(lease("apiserver-1", "h", Some(12), Some("evil.org:443")));
        assert_eq!(t.evaluate(at(12)).notices.len(), 1);
        // Fixed, then broken again: reported again.
        t.apply(lease("apiserver-1", "h", Some(13), Some("10.0.0.9:6443")));
        let e = t.evaluate(at(13));
        assert!(e.notices.is_empty());
        assert!(e.set.peer("apiserver-1").is_some());
        t.apply(lease("apiserver-1", "h", Some(14), Some("evil.org:443")));
        assert_eq!(t.evaluate(at(14)).notices.len(), 1);
    }

    #[test]
    fn no_cidrs_refuses_every_annotation_but_not_the_mapping() {
        let mut cfg = config(&[]);
        cfg.policy = AddressPolicy::new(
            vec![],
            [MappingEntry::ByHostname(
                "host-apiserver-b".into(),
                "10.9.9.9:6444".parse().unwrap(),
            )],
        );
        let mut t = synced(
            cfg,
            vec![
                lease("apiserver-a", "a", Some(0), Some("10.0.0.1:6443")),
                lease("apiserver-b", "b", Some(0), Some("10.0.0.2:6443")),
            ],
        );
        let e = t.evaluate(at(1));
        assert_eq!(ids(&e.set), ["apiserver-b"]);
        let b = e.set.peer("apiserver-b").unwrap();
        assert_eq!(b.address, "10.9.9.9:6444".parse().unwrap());
        assert_eq!(b.address_source, AddressSource::MappingByHostname);
        assert_eq!(
            e.set.excluded("apiserver-a").unwrap().reason,
            Exclusion::Address(RejectReason::NoCidrs)
        );
    }

    #[test]
    fn local_by_lease_name_or_hostname() {
        let leases = vec![
            lease("apiserver-a", "a_1", Some(0), None),
            lease("apiserver-b", "b_1", Some(0), Some("10.0.0.2:1")),
        ];
        let mut cfg = config(&["10.0.0.0/8"]);
        cfg.local = LocalSelector::LeaseName("apiserver-a".into());
        let e = synced(cfg.clone(), leases.clone()).evaluate(at(1));
        let local = e.set.local.clone().unwrap();
        assert_eq!((local.id.as_str(), local.live), ("apiserver-a", true));
        // The local lease needs no address and is never a peer, nor a rejection.
        assert_eq!(ids(&e.set), ["apiserver-b"]);
        assert!(e.set.excluded.is_empty());
        assert!(e.notices.is_empty());

        cfg.local = LocalSelector::Hostname("host-apiserver-b".into());
        let e = synced(cfg.clone(), leases.clone()).evaluate(at(1));
        assert_eq!(e.set.local.as_ref().unwrap().id, "apiserver-b");
        // apiserver-a has no address: excluded, reported.
        assert!(e.set.peers.is_empty());
        assert_eq!(
            e.set.excluded("apiserver-a").unwrap().reason,
            Exclusion::Address(RejectReason::Missing)
        );

        // Two leases claim our hostname: the live, most recently renewed one is ours.
        let mut dup = lease("apiserver-z", "z", Some(5), Some("10.0.0.26:1"));
        dup.hostname = Some("host-apiserver-b".into());
        let mut more = leases.clone();
        more.push(dup);
        let e = synced(cfg.clone(), more).evaluate(at(6));
        assert_eq!(e.set.local.as_ref().unwrap().id, "apiserver-z");
        assert_eq!(
            e.set.excluded("apiserver-b").unwrap().reason,
            Exclusion::DuplicateLocal
        );

        // A dead local lease is still reported as local, flagged dead.
        let e = synced(cfg, leases).evaluate(at(100));
        let local = e.set.local.unwrap();
        assert_eq!((local.id.as_str(), local.live), ("apiserver-b", false));

        // Not present: no local.
        let mut cfg = config(&["10.0.0.0/8"]);
        cfg.local = LocalSelector::LeaseName("apiserver-x".into());
        assert!(synced(cfg, vec![]).evaluate(at(0)).set.local.is_none());
    }

    #[test]
    fn a_failing_watch_freezes_liveness() {
        let mut t = synced(
            config(&["10.0.0.0/8"]),
            vec![lease("apiserver-a", "a", Some(0), Some("10.0.0.1:1"))],
        );
        assert!(!t.evaluate(at(1)).set.stale);
        // The watch breaks at 10: renewals are no longer seen.
        t.watch_failed(at(10));
        t.watch_failed(at(20)); // the first failure counts
        let e = t.evaluate(at(100));
        assert!(e.set.stale);
        assert_eq!(
            ids(&e.set),
            ["apiserver-a"],
            "not dropped while we cannot see"
        );
        assert_eq!(e.next_expiry, None);
        // Back: the lease was renewed meanwhile...
        t.watch_ok();
        t.apply(lease("apiserver-a", "a", Some(95), Some("10.0.0.1:1")));
        let e = t.evaluate(at(100));
        assert!(!e.set.stale);
        assert_eq!(ids(&e.set), ["apiserver-a"]);
        // ...or it was not: then it expires as usual.
        t.watch_failed(at(101));
        t.watch_ok();
        assert!(t.evaluate(at(200)).set.peers.is_empty());
    }

    #[test]
    fn snapshots_are_deterministic() {
        let leases = vec![
            lease("apiserver-b", "b", Some(0), Some("10.0.0.2:1")),
            lease("apiserver-a", "a", Some(0), Some("10.0.0.1:1")),
            lease("apiserver-c", "c", Some(0), Some("nope")),
        ];
        let mut rev = leases.clone();
        rev.reverse();
        let x = synced(config(&["10.0.0.0/8"]), leases).evaluate(at(1)).set;
        let y = synced(config(&["10.0.0.0/8"]), rev).evaluate(at(1)).set;
        assert_eq!(ids(&x), ["apiserver-a", "apiserver-b"]);
        assert_eq!(x, y);
    }
}
