//! The pure part of the peer watcher: identity leases in, [`PeerSet`] snapshots out.
//!
//! A [`Tracker`] holds the leases the watcher has seen (plain [`LeaseInfo`] data, no kube
//! types), remembers when *we* saw each one renewed, and for a given monotonic `now`
//! evaluates them. Time is always passed in: the tracker reads no clock.
//!
//! - **liveness, without trusting the peers' clocks**: a lease is live while
//!   `now - observed <= grace` (default 30 s), where `observed` is the [`Instant`] (our
//!   monotonic clock) at which this control plane last saw the lease's renewal record change —
//!   its `spec.renewTime` or its `spec.holderIdentity` — as client-go's leader election does
//!   with its `observedTime`. The value of `renewTime` is only compared with the previous value,
//!   never with our clock, so a peer whose clock runs minutes behind stays live while it keeps
//!   renewing, and a `renewTime` far in the future keeps nobody alive: a lease that stops
//!   changing is dead `grace` after we last saw it change. `resourceVersion` is not the signal:
//!   any write (a label, an annotation, `kubectl annotate`) bumps it, and only a renewal says
//!   the apiserver is running. A lease without `renewTime` is never live.
//!   `leaseDurationSeconds` is ignored on purpose: kube-apiserver writes 3600 and keeps dead
//!   peers for up to an hour; we must not.
//! - **first sight** (the initial list after our start, a lease created or labelled later, a
//!   re-list that finds a lease we did not know): we have no earlier value to compare with, so
//!   the lease's own `renewTime` is the only evidence, and it is trusted only this once and
//!   only as far as the grace: if `|wall clock - renewTime| <= grace` the lease counts as
//!   observed at that moment (so a restart of the control plane does not declare every peer
//!   dead, nor wait a renewal for them); otherwise it is [`Exclusion::Unconfirmed`] — not live —
//!   until we see it change. So the lease of an apiserver that died long ago (kube leaves it for
//!   an hour) is not resurrected by our restart (it would hold the first publication up until
//!   the sync deadline, waiting for the discovery of a dead peer), a `renewTime` in year 9999
//!   is never live unless it keeps changing, and a live peer whose clock is far off is
//!   confirmed by its next renewal (kube: within 10 s). A re-list compares with what we had:
//!   an unchanged lease keeps its observation, a changed one is observed at the re-list.
//! - **malformed leases**: a lease whose fields we read cannot be read (a `renewTime` that is
//!   not an RFC 3339 time k8s-openapi can represent, such as `9999-12-31T23:59:59Z`; a
//!   `holderIdentity` that is not a string; a `spec` that is not an object; metadata that does
//!   not parse) is ignored: [`Exclusion::Malformed`] with the field, reported once
//!   ([`Notice::Malformed`]). It is never a peer nor the local lease. The watcher parses leases
//!   leniently (see [`super::lease`]), so one such lease never breaks the watch.
//! - **restarts**: kube-apiserver writes a new `holderIdentity` (`<id>_<uuid>`) every time it
//!   starts. Each (lease name, holder identity) pair gets its own `generation` from one
//!   increasing counter, so a restart — or a lease that is deleted and comes back — changes the
//!   peer's generation, and whoever fetches its discovery fetches again.
//! - **addresses**: see [`super::address`] (mapping wins over the annotation; annotations only
//!   inside the configured CIDRs).
//! - **which lease is ours**: by lease name (`--local-lease`), or by host name (`--node-name`):
//!   then the lease named as kube-apiserver names its own, [`identity_lease_name`]`(hostname)`
//!   (`apiserver-<hash>`), and no other. Any other lease carrying our `kubernetes.io/hostname`
//!   label is an impostor: [`Exclusion::DuplicateLocal`], reported once
//!   ([`Notice::DuplicateLocal`]), never the local lease and never a peer — whoever can write
//!   Leases in `kube-system` cannot take the local apiserver's place, however recently it
//!   renews. The local apiserver is reported apart ([`PeerSet::local`]) and never as a peer.
//! - **a cap on peers**: at most [`PeerConfig::max_peers`] live peers (an HA control plane has
//!   3–7 apiservers), so a Lease writer cannot make every node route to and poll an unbounded
//!   number of addresses. Beyond the cap the choice is deterministic and favours what is
//!   trusted and established: addresses from the operator's mapping first, then the lease we
//!   have known the longest ([`FirstSeen`]: a flood of new leases never displaces known peers),
//!   then the smallest name. The others are [`Exclusion::OverCap`], reported once
//!   ([`Notice::OverCap`]), never routed and never fetched.
//! - **seniority survives a restart**: each peer's [`FirstSeen`] is kept in the state directory
//!   with its retained discovery (`crate::run::state_dir`) and handed back to a new tracker
//!   ([`Tracker::restoring`], at most [`PeerConfig::max_peers`] of them, the most senior). Every
//!   lease this process sees for the first time ranks after all of them, whatever our wall
//!   clock says: stamps only ever increase ([`Tracker`] ratchets them past the newest one it
//!   knows), so a clock set back cannot make a new lease look older than a known peer, and on
//!   the first list after a restart the known peers are not tied with a flood of leases whose
//!   names sort first.
//! - **a failing watch**: while the lease watch is failing we cannot tell a dead peer from one
//!   whose renewals we do not see, so liveness is frozen at the moment the watch failed
//!   ([`PeerSet::stale`]) until it works again. Dropping every peer instead would turn their
//!   resources into 404s; keeping them costs at most a 503 from a peer that really died. When
//!   it works again, leases renewed meanwhile have changed (observed then); the others expire.
//!
//! Snapshots are deterministic: peers and exclusions sorted by lease name.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};

use super::address::{AddressPolicy, AddressSource, RejectReason};
use super::lease_name::identity_lease_name;

/// The label every kube-apiserver identity lease carries, and its value.
pub const IDENTITY_LABEL: &str = "apiserver.kubernetes.io/identity";
pub const IDENTITY_LABEL_VALUE: &str = "kube-apiserver";
/// The hostname label of an identity lease.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
/// Where kube-apiserver keeps its identity leases.
pub const LEASE_NAMESPACE: &str = "kube-system";
/// Default grace after the last observed renewal before a peer counts as dead (kube renews
/// every 10 s).
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);
/// Default cap on live peers (an HA control plane has 3–7 apiservers).
pub const DEFAULT_MAX_PEERS: usize = 16;

/// Which lease belongs to the apiserver this control plane sits beside.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum LocalSelector {
    /// Not known: every lease is a peer.
    #[default]
    None,
    /// `--local-lease apiserver-<hash>`
    LeaseName(String),
    /// `--node-name <hostname>`: the lease kube-apiserver on this host names its own,
    /// [`identity_lease_name`]`(hostname)`; any other lease with this `kubernetes.io/hostname`
    /// label is refused ([`Exclusion::DuplicateLocal`]).
    Hostname(String),
}

/// Everything the peer watcher is told by the operator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerConfig {
    /// After this long without an observed renewal a peer is dead.
    pub grace: Duration,
    pub policy: AddressPolicy,
    pub local: LocalSelector,
    /// At most this many live peers (see the module doc for which ones).
    pub max_peers: usize,
}

impl Default for PeerConfig {
    fn default() -> Self {
        PeerConfig {
            grace: DEFAULT_GRACE,
            policy: AddressPolicy::default(),
            local: LocalSelector::None,
            max_peers: DEFAULT_MAX_PEERS,
        }
    }
}

/// When this control plane first saw a lease: the seniority that decides who is over the cap.
///
/// Nanoseconds since the Unix epoch by our wall clock at first sight, but never earlier than a
/// stamp already handed out or restored ([`Tracker`] ratchets them), so the order of stamps is
/// the order in which leases were first seen, across restarts, whatever the clock did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct FirstSeen(pub u64);

impl FirstSeen {
    pub fn from_wall(t: SystemTime) -> FirstSeen {
        let nanos = t
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        FirstSeen(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    pub fn wall(self) -> SystemTime {
        std::time::UNIX_EPOCH + Duration::from_nanos(self.0)
    }

    /// The stamp for a first sight at `wall` after `newest`: later than `newest` even if our
    /// clock is behind it (saturating at the end of `u64`, where only names break ties).
    pub fn after(newest: Option<FirstSeen>, wall: SystemTime) -> FirstSeen {
        let at = FirstSeen::from_wall(wall);
        match newest {
            Some(n) if at <= n => FirstSeen(n.0.saturating_add(1)),
            _ => at,
        }
    }
}

/// A moment as both of our clocks tell it: the monotonic one for observations and liveness,
/// the wall clock only to judge a lease seen for the first time (and to stamp it, [`FirstSeen`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moment {
    pub mono: Instant,
    pub wall: SystemTime,
}

impl Moment {
    pub fn now() -> Moment {
        Moment {
            mono: Instant::now(),
            wall: SystemTime::now(),
        }
    }
}

/// A field of an identity lease that could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LeaseField {
    /// `metadata` (e.g. a timestamp out of range, a label that is not a string).
    Metadata,
    /// `spec` is not an object.
    Spec,
    /// `spec.holderIdentity` is not a string.
    HolderIdentity,
    /// `spec.renewTime` is not a time (RFC 3339, within what k8s-openapi represents).
    RenewTime,
}

impl LeaseField {
    pub const ALL: [LeaseField; 4] = [
        LeaseField::Metadata,
        LeaseField::Spec,
        LeaseField::HolderIdentity,
        LeaseField::RenewTime,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            LeaseField::Metadata => "metadata",
            LeaseField::Spec => "spec",
            LeaseField::HolderIdentity => "holder_identity",
            LeaseField::RenewTime => "renew_time",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// Why a lease could not be read: the field and what was wrong (for the log).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MalformedLease {
    pub field: LeaseField,
    pub detail: String,
}

/// What we read from one identity lease.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseInfo {
    /// The lease name: kube-apiserver's identity (`apiserver-<hash>`).
    pub name: String,
    pub holder_identity: Option<String>,
    /// The `kubernetes.io/hostname` label.
    pub hostname: Option<String>,
    /// As the peer wrote it (its clock): compared with the previous value, never with ours
    /// (except at first sight, see the module doc).
    pub renew_time: Option<SystemTime>,
    /// The `kubernetes.io/peer-advertise-address` annotation, as written.
    pub peer_advertise_address: Option<String>,
    /// Set when a field we read could not be read: the lease is ignored.
    pub malformed: Option<MalformedLease>,
}

impl LeaseInfo {
    /// The same renewal record (holder identity and renew time, or the same breakage): no
    /// renewal was observed between `self` and `other`.
    fn same_renewal(&self, other: &LeaseInfo) -> bool {
        self.holder_identity == other.holder_identity
            && self.renew_time == other.renew_time
            && self.malformed == other.malformed
    }
}

/// A live peer apiserver we may route to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// The lease name.
    pub id: String,
    pub holder_identity: String,
    pub hostname: Option<String>,
    /// The last `renewTime` as the peer wrote it (its clock; informational).
    pub renew_time: SystemTime,
    pub address: SocketAddr,
    pub address_source: AddressSource,
    /// Changes whenever the holder identity changes (a restart): refetch its discovery.
    pub generation: u64,
    /// Its seniority under the cap, kept in the state directory with its retained discovery.
    pub first_seen: FirstSeen,
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
    /// A field we read could not be read: the lease is ignored.
    Malformed(LeaseField),
    /// No `spec.renewTime`.
    NeverRenewed,
    /// Seen for the first time with a `renewTime` more than the grace away from our clock,
    /// and not seen renewing since.
    Unconfirmed,
    /// Not seen renewing within the grace.
    Expired,
    /// No usable address (see the reason).
    Address(RejectReason),
    /// The lease carries the local hostname but is not named as kube-apiserver names its own
    /// lease ([`identity_lease_name`]): an impostor, never local, never a peer.
    DuplicateLocal,
    /// Live with an accepted address, but beyond [`PeerConfig::max_peers`].
    OverCap,
}

impl Exclusion {
    /// The metric label of the exclusions counted by reason.
    pub fn label(self) -> &'static str {
        match self {
            Exclusion::Malformed(_) => "malformed",
            Exclusion::NeverRenewed => "never_renewed",
            Exclusion::Unconfirmed => "unconfirmed",
            Exclusion::Expired => "expired",
            Exclusion::Address(_) => "address",
            Exclusion::DuplicateLocal => "duplicate_local",
            Exclusion::OverCap => "over_cap",
        }
    }
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

/// `now - observed <= grace`, `observed` being when we last saw the lease renewed (our
/// monotonic clock); never observed is not live.
pub fn is_live(observed: Option<Instant>, now: Instant, grace: Duration) -> bool {
    observed.is_some_and(|o| now.saturating_duration_since(o) <= grace)
}

/// Whether a `renewTime` seen for the first time may stand for "renewed just now": within the
/// grace of our wall clock, either way.
pub fn plausible_at_first_sight(renew: SystemTime, now: SystemTime, grace: Duration) -> bool {
    match now.duration_since(renew) {
        Ok(age) => age <= grace,
        Err(ahead) => ahead.duration() <= grace,
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
    /// A lease could not be read and is ignored. Reported once per (lease, field, detail).
    Malformed {
        id: String,
        field: LeaseField,
        detail: String,
    },
    /// A lease claims the local hostname under a name that is not the local apiserver's:
    /// refused. Reported once per lease (again if it comes back after being accepted or gone).
    DuplicateLocal {
        id: String,
        hostname: String,
        /// The name the local apiserver's lease has.
        expected: String,
    },
    /// A live peer beyond the cap: not routed, not fetched. Reported once per lease.
    OverCap { id: String, max_peers: usize },
}

/// The result of one evaluation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Evaluation {
    pub set: PeerSet,
    pub notices: Vec<Notice>,
    /// When the next live lease expires if nobody renews it (re-evaluate then).
    pub next_expiry: Option<Duration>,
}

/// A lease and when we last saw it renewed.
#[derive(Clone, Debug)]
struct Tracked {
    info: LeaseInfo,
    /// `None`: seen only with an implausible `renewTime` and never renewed since.
    observed: Option<Instant>,
    /// When we first saw the lease (kept across re-lists while it exists, and across restarts
    /// through the state directory): seniority for the cap on peers.
    first_seen: FirstSeen,
}

/// What was last reported about a lease, so it is reported once.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Reported {
    Address(Option<String>, RejectReason),
    Malformed(MalformedLease),
    DuplicateLocal,
    OverCap,
}

/// The leases seen so far, when each was last seen renewed, and the generations handed out.
#[derive(Debug)]
pub struct Tracker {
    config: PeerConfig,
    leases: BTreeMap<String, Tracked>,
    /// A re-list in progress (kube-runtime's Init .. InitDone); `leases` stays current until
    /// it completes.
    relist: Option<BTreeMap<String, LeaseInfo>>,
    /// lease name -> (holder identity, generation)
    generations: BTreeMap<String, (String, u64)>,
    next_generation: u64,
    synced: bool,
    /// lease name -> what was last reported as refused or malformed, so it is reported once.
    reported: BTreeMap<String, Reported>,
    /// Restarts seen since the last evaluation.
    pending_notices: Vec<Notice>,
    /// Set while the watch is failing: liveness is evaluated as of then.
    frozen_at: Option<Instant>,
    /// Seniority kept from before a restart, for leases not seen yet in this process (at most
    /// `max_peers`); a lease takes its stamp from here at first sight.
    restored: BTreeMap<String, FirstSeen>,
    /// The newest stamp restored or handed out, and the moment it was handed out (leases first
    /// seen at the same moment, one list, share it and are ordered by name).
    newest: Option<(FirstSeen, Option<Instant>)>,
}

impl Tracker {
    pub fn new(config: PeerConfig) -> Self {
        Tracker::restoring(config, [])
    }

    /// A tracker that remembers the seniority of leases seen before a restart (from the state
    /// directory): only the `max_peers` most senior count, and every lease first seen from now
    /// on ranks after them.
    pub fn restoring(
        config: PeerConfig,
        first_seen: impl IntoIterator<Item = (String, FirstSeen)>,
    ) -> Self {
        let mut known: Vec<(String, FirstSeen)> = first_seen.into_iter().collect();
        known.sort_by(|(a, sa), (b, sb)| (sa, a).cmp(&(sb, b)));
        known.truncate(config.max_peers);
        let newest = known.iter().map(|(_, s)| *s).max().map(|s| (s, None));
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
            restored: known.into_iter().collect(),
            newest,
        }
    }

    /// The stamp of a lease first seen `at`: restored from before a restart, or the next one.
    fn first_sight(&mut self, name: &str, at: Moment) -> FirstSeen {
        if let Some(kept) = self.restored.remove(name) {
            return kept;
        }
        let stamp = match self.newest {
            Some((stamp, Some(mono))) if mono == at.mono => stamp,
            newest => FirstSeen::after(newest.map(|(s, _)| s), at.wall),
        };
        self.newest = Some((stamp, Some(at.mono)));
        stamp
    }

    /// The watch failed at `now`: freeze liveness (the first failure counts) until
    /// [`Tracker::watch_resumed`].
    pub fn watch_failed(&mut self, now: Instant) {
        self.frozen_at.get_or_insert(now);
    }

    /// The watch delivers leases again at `now` (a change, or a complete re-list: not the start
    /// of one, which kube-runtime announces before its list request, and whose list may fail).
    /// The time it was frozen does not count against any lease: renewals could not be seen
    /// then, so each lease has the rest of its grace it had when the watch failed. Without
    /// that, a watch resumed after more than the grace would declare every peer dead until
    /// its events arrived, one by one.
    pub fn watch_resumed(&mut self, now: Instant) {
        let Some(frozen_at) = self.frozen_at.take() else {
            return;
        };
        let paused = now.saturating_duration_since(frozen_at);
        for tracked in self.leases.values_mut() {
            if let Some(observed) = &mut tracked.observed {
                // Never later than now (a lease observed after the failure, if any), and
                // unchanged if the sum does not fit in an Instant.
                *observed = observed
                    .checked_add(paused)
                    .map_or(*observed, |shifted| shifted.min(now.max(*observed)));
            }
        }
    }

    pub fn config(&self) -> &PeerConfig {
        &self.config
    }

    /// When we last saw `name` renewed (`None`: unknown, or never confirmed).
    pub fn observed(&self, name: &str) -> Option<Instant> {
        self.leases.get(name).and_then(|t| t.observed)
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

    /// A lease was added or changed, seen `at`.
    pub fn apply(&mut self, info: LeaseInfo, at: Moment) {
        let first_seen = match self.leases.get(&info.name) {
            Some(known) => known.first_seen,
            None => self.first_sight(&info.name, at),
        };
        let observed = match self.leases.get(&info.name) {
            // Nothing renewed (e.g. an annotation changed, or a re-list): keep what we had.
            Some(known) if known.info.same_renewal(&info) => known.observed,
            // A renewal (or a restart, or a repair) seen now.
            Some(_) => Some(at.mono),
            // First sight: only a plausible renewTime stands for "renewed now".
            None => info
                .renew_time
                .filter(|t| plausible_at_first_sight(*t, at.wall, self.config.grace))
                .map(|_| at.mono),
        };
        if info.malformed.is_none() {
            self.generation_for(&info);
        }
        self.leases.insert(
            info.name.clone(),
            Tracked {
                info,
                observed,
                first_seen,
            },
        );
    }

    /// A lease was deleted.
    pub fn delete(&mut self, name: &str) {
        self.leases.remove(name);
        self.generations.remove(name);
        self.reported.remove(name);
        // A lease deleted and created again is a new lease, as without a restart.
        self.restored.remove(name);
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

    /// The list is complete, `at`: it replaces what we had (leases deleted meanwhile
    /// disappear; leases that changed count as renewed `at`).
    pub fn finish_relist(&mut self, at: Moment) {
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
            self.apply(info, at);
        }
        // Restored seniority of a lease the list does not have: it was deleted while we were
        // down, and a lease created again later is a new lease.
        self.restored.clear();
        self.synced = true;
    }

    fn local_name(&self) -> Option<String> {
        let name = match &self.config.local {
            LocalSelector::None => return None,
            LocalSelector::LeaseName(n) => n.clone(),
            // kube's own name for the lease of this host, and no other: a lease claiming the
            // hostname under another name is refused, however recently it renews.
            LocalSelector::Hostname(h) => identity_lease_name(h),
        };
        self.leases
            .get(&name)
            .filter(|t| t.info.malformed.is_none())
            .map(|_| name)
    }

    /// The peer set as of `now` (or as of the watch failure, while it fails), and what to
    /// log.
    pub fn evaluate(&mut self, now: Instant) -> Evaluation {
        let stale = self.frozen_at.is_some();
        let now = self.frozen_at.map_or(now, |f| f.min(now));
        let grace = self.config.grace;
        let local_name = self.local_name();
        // Live peers with an accepted address, before the cap.
        let mut candidates: Vec<Peer> = Vec::new();
        let mut set = PeerSet {
            synced: self.synced,
            stale,
            ..Default::default()
        };
        let mut notices = std::mem::take(&mut self.pending_notices);
        let mut next_expiry: Option<Duration> = None;
        let mut still_reported = BTreeMap::new();
        for Tracked {
            info,
            observed,
            first_seen,
        } in self.leases.values()
        {
            let holder = info.holder_identity.clone().unwrap_or_default();
            let generation = self
                .generations
                .get(&info.name)
                .map(|(_, g)| *g)
                .unwrap_or(0);
            let exclude = |reason| ExcludedPeer {
                id: info.name.clone(),
                holder_identity: holder.clone(),
                generation,
                reason,
            };
            if let Some(bad) = &info.malformed {
                let key = Reported::Malformed(bad.clone());
                if self.reported.get(&info.name) != Some(&key) {
                    notices.push(Notice::Malformed {
                        id: info.name.clone(),
                        field: bad.field,
                        detail: bad.detail.clone(),
                    });
                }
                still_reported.insert(info.name.clone(), key);
                set.excluded.push(exclude(Exclusion::Malformed(bad.field)));
                continue;
            }
            let live = info.renew_time.is_some() && is_live(*observed, now, grace);
            if live {
                if let Some(o) = observed {
                    // Dead just after observed + grace.
                    let left =
                        (*o + grace + Duration::from_millis(1)).saturating_duration_since(now);
                    next_expiry = Some(next_expiry.map_or(left, |n| n.min(left)));
                }
            }
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
                    let key = Reported::DuplicateLocal;
                    if self.reported.get(&info.name) != Some(&key) {
                        notices.push(Notice::DuplicateLocal {
                            id: info.name.clone(),
                            hostname: h.clone(),
                            expected: identity_lease_name(h),
                        });
                    }
                    still_reported.insert(info.name.clone(), key);
                    set.excluded.push(exclude(Exclusion::DuplicateLocal));
                    continue;
                }
            }
            let Some(renew_time) = info.renew_time else {
                set.excluded.push(exclude(Exclusion::NeverRenewed));
                continue;
            };
            if !live {
                set.excluded.push(exclude(if observed.is_some() {
                    Exclusion::Expired
                } else {
                    Exclusion::Unconfirmed
                }));
                continue;
            }
            match self.config.policy.resolve(
                &info.name,
                info.hostname.as_deref(),
                info.peer_advertise_address.as_deref(),
            ) {
                Ok((address, address_source)) => candidates.push(Peer {
                    id: info.name.clone(),
                    holder_identity: holder,
                    hostname: info.hostname.clone(),
                    renew_time,
                    address,
                    address_source,
                    generation,
                    first_seen: *first_seen,
                }),
                Err(reason) => {
                    let value = info.peer_advertise_address.clone();
                    let key = Reported::Address(value.clone(), reason);
                    if self.reported.get(&info.name) != Some(&key) {
                        notices.push(Notice::AddressRejected {
                            id: info.name.clone(),
                            value,
                            reason,
                        });
                    }
                    still_reported.insert(info.name.clone(), key);
                    set.excluded.push(exclude(Exclusion::Address(reason)));
                }
            }
        }
        // The cap: the operator's mapping first, then the longest known, then the smallest
        // name (`candidates` is in name order and the sort is stable).
        if candidates.len() > self.config.max_peers {
            candidates.sort_by_key(|p| (!p.address_source.is_mapping(), p.first_seen));
        }
        for (i, peer) in candidates.into_iter().enumerate() {
            if i < self.config.max_peers {
                set.peers.push(peer);
                continue;
            }
            let key = Reported::OverCap;
            if self.reported.get(&peer.id) != Some(&key) {
                notices.push(Notice::OverCap {
                    id: peer.id.clone(),
                    max_peers: self.config.max_peers,
                });
            }
            still_reported.insert(peer.id.clone(), key);
            set.excluded.push(ExcludedPeer {
                id: peer.id,
                holder_identity: peer.holder_identity,
                generation: peer.generation,
                reason: Exclusion::OverCap,
            });
        }
        set.peers.sort_by(|a, b| a.id.cmp(&b.id));
        set.excluded.sort_by(|a, b| a.id.cmp(&b.id));
        // Forget reports of leases that are gone, dead, repaired or accepted now: a relapse
        // is reported.
        self.reported = still_reported;
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

    use std::sync::OnceLock;

    const T0: u64 = 1_700_000_000;

    /// Our wall clock (and, unless a test says otherwise, the peers').
    fn wall(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(T0 + secs)
    }

    /// Our monotonic clock, `secs` after the test's origin.
    fn mono(secs: u64) -> Instant {
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        *ORIGIN.get_or_init(Instant::now) + Duration::from_secs(secs)
    }

    /// Both our clocks at `secs`.
    fn at(secs: u64) -> Moment {
        Moment {
            mono: mono(secs),
            wall: wall(secs),
        }
    }

    fn lease(name: &str, holder: &str, renew: Option<u64>, addr: Option<&str>) -> LeaseInfo {
        LeaseInfo {
            name: name.into(),
            holder_identity: Some(holder.into()),
            hostname: Some(format!("host-{name}")),
            renew_time: renew.map(wall),
            peer_advertise_address: addr.map(String::from),
            malformed: None,
        }
    }

    fn config(cidrs: &[&str]) -> PeerConfig {
        PeerConfig {
            grace: Duration::from_secs(30),
            policy: AddressPolicy::new(cidrs.iter().map(|c| parse_cidr(c).unwrap()).collect(), []),
            local: LocalSelector::None,
            max_peers: DEFAULT_MAX_PEERS,
        }
    }

    /// Listed at 0.
    fn synced(cfg: PeerConfig, leases: Vec<LeaseInfo>) -> Tracker {
        synced_at(cfg, leases, 0)
    }

    fn synced_at(cfg: PeerConfig, leases: Vec<LeaseInfo>, secs: u64) -> Tracker {
        let mut t = Tracker::new(cfg);
        t.begin_relist();
        for l in leases {
            t.relist_apply(l);
        }
        t.finish_relist(at(secs));
        t
    }

    fn ids(set: &PeerSet) -> Vec<&str> {
        set.peers.iter().map(|p| p.id.as_str()).collect()
    }

    #[test]
    fn liveness_table() {
        let g = Duration::from_secs(30);
        // (observed, now, live): only our own observations count.
        let cases = [
            (None, 0, false),
            (Some(100), 100, true),
            (Some(100), 130, true), // exactly the grace: still live
            (Some(100), 131, false),
            (Some(100), 3600, false), // upstream would still keep it (1 h lease)
            (Some(200), 100, true),   // observed after `now` (a frozen evaluation)
        ];
        for (observed, now, want) in cases {
            assert_eq!(
                is_live(observed.map(mono), mono(now), g),
                want,
                "{observed:?} @ {now}"
            );
        }
        assert!(!is_live(
            Some(mono(100)),
            mono(100) + Duration::from_millis(30_001),
            g
        ));
        // (renewTime, our wall clock, plausible at first sight)
        let first_sight = [
            (100, 100, true),
            (70, 100, true),  // the grace, in the past
            (69, 100, false), // a lease left behind by a dead apiserver
            (130, 100, true), // the grace, in the future
            (131, 100, false),
        ];
        for (renew, now, want) in first_sight {
            assert_eq!(
                plausible_at_first_sight(wall(renew), wall(now), g),
                want,
                "{renew} @ {now}"
            );
        }
    }

    #[test]
    fn first_list_trusts_renew_times_within_the_grace_only() {
        // Listed at 100 (a control plane that just started).
        let mut t = synced_at(
            config(&["10.0.0.0/8"]),
            vec![
                lease("apiserver-c", "c_1", Some(95), Some("10.0.0.3:6443")),
                lease("apiserver-a", "a_1", Some(99), Some("10.0.0.1:6443")),
                lease("apiserver-b", "b_1", Some(50), Some("10.0.0.2:6443")),
                lease("apiserver-d", "d_1", None, Some("10.0.0.4:6443")),
            ],
            100,
        );
        let e = t.evaluate(mono(100));
        assert!(e.set.synced);
        // Plausible renewTimes count as observed at the list: not every peer dead on restart.
        assert_eq!(ids(&e.set), ["apiserver-a", "apiserver-c"]);
        // A renewTime 50 s old: not resurrected (kube leaves dead leases for an hour).
        assert_eq!(
            e.set.excluded("apiserver-b").unwrap().reason,
            Exclusion::Unconfirmed
        );
        assert_eq!(
            e.set.excluded("apiserver-d").unwrap().reason,
            Exclusion::NeverRenewed
        );
        assert_eq!(
            e.set.peer("apiserver-a").unwrap().address,
            "10.0.0.1:6443".parse().unwrap()
        );
        // Both observed at 100: they expire at 130 s + 1 ms, whatever their renewTimes said.
        assert_eq!(e.next_expiry, Some(Duration::from_millis(30_001)));
        // c renews at 110; a never again.
        t.apply(
            lease("apiserver-c", "c_1", Some(110), Some("10.0.0.3:6443")),
            at(110),
        );
        let e = t.evaluate(mono(130));
        assert_eq!(ids(&e.set), ["apiserver-a", "apiserver-c"]);
        assert_eq!(e.next_expiry, Some(Duration::from_millis(1)));
        let e = t.evaluate(mono(131));
        assert_eq!(ids(&e.set), ["apiserver-c"]);
        assert_eq!(
            e.set.excluded("apiserver-a").unwrap().reason,
            Exclusion::Expired
        );
        let e = t.evaluate(mono(141));
        assert_eq!(ids(&e.set), Vec::<&str>::new());
        assert_eq!(e.next_expiry, None);
        // A renewal brings a back, same generation.
        let g = t.generations["apiserver-a"].1;
        t.apply(
            lease("apiserver-a", "a_1", Some(150), Some("10.0.0.1:6443")),
            at(150),
        );
        let e = t.evaluate(mono(151));
        assert_eq!(ids(&e.set), ["apiserver-a"]);
        assert_eq!(e.set.peers[0].generation, g);
        assert!(e.notices.is_empty());
        // b was not dead after all (or its clock is 50 s behind): its first renewal we see
        // confirms it.
        t.apply(
            lease("apiserver-b", "b_1", Some(101), Some("10.0.0.2:6443")),
            at(152),
        );
        assert_eq!(
            ids(&t.evaluate(mono(152)).set),
            ["apiserver-a", "apiserver-b"]
        );
    }

    #[test]
    fn a_peer_whose_clock_is_five_minutes_behind_stays_live_while_it_renews() {
        let behind = 300;
        // Its renewTime is 5 min old by our clock, at every renewal.
        let renewal = |ours: u64| {
            (
                lease(
                    "apiserver-s",
                    "s_1",
                    Some(ours - behind),
                    Some("10.0.0.9:1"),
                ),
                at(ours),
            )
        };
        let mut t = Tracker::new(config(&["10.0.0.0/8"]));
        t.begin_relist();
        t.relist_apply(renewal(1000).0);
        t.finish_relist(at(1000));
        // First sight: 5 min old looks like a dead apiserver's lease...
        let e = t.evaluate(mono(1000));
        assert_eq!(
            e.set.excluded("apiserver-s").unwrap().reason,
            Exclusion::Unconfirmed
        );
        // ...until we see it renew (kube: within 10 s); then live as long as it renews.
        for ours in (1010..=1600).step_by(10) {
            let (info, seen) = renewal(ours);
            t.apply(info, seen);
            for now in [ours, ours + 9] {
                assert_eq!(ids(&t.evaluate(mono(now)).set), ["apiserver-s"], "at {now}");
            }
        }
        // It stops renewing: dead the grace after we last saw a renewal.
        assert_eq!(ids(&t.evaluate(mono(1630)).set), ["apiserver-s"]);
        let e = t.evaluate(mono(1631));
        assert!(e.set.peers.is_empty());
        assert_eq!(
            e.set.excluded("apiserver-s").unwrap().reason,
            Exclusion::Expired
        );
    }

    #[test]
    fn a_renew_time_in_year_9999_keeps_nobody_alive() {
        // 9999-12-30T00:00:00Z: representable, and far beyond any clock skew.
        let year_9999 = UNIX_EPOCH + Duration::from_secs(253_402_128_000);
        let mut far = lease("apiserver-f", "f_1", Some(0), Some("10.0.0.6:1"));
        far.renew_time = Some(year_9999);
        let normal = lease("apiserver-f", "f_1", Some(0), Some("10.0.0.6:1"));

        // Seen first with it: never live unless it changes.
        let mut t = synced(config(&["10.0.0.0/8"]), vec![far.clone()]);
        for now in [0, 30, 31, 3600] {
            let e = t.evaluate(mono(now));
            assert!(e.set.peers.is_empty(), "at {now}");
            assert_eq!(
                e.set.excluded("apiserver-f").unwrap().reason,
                Exclusion::Unconfirmed
            );
        }
        // A relist with the same value is no renewal either.
        t.begin_relist();
        t.relist_apply(far.clone());
        t.finish_relist(at(4000));
        assert!(t.evaluate(mono(4000)).set.peers.is_empty());

        // A live peer whose lease is then written with year 9999 and never again: the write
        // was a change we saw, so it is live for the grace after it, and dead after.
        let mut t = synced(config(&["10.0.0.0/8"]), vec![normal]);
        t.apply(far.clone(), at(10));
        assert_eq!(ids(&t.evaluate(mono(40)).set), ["apiserver-f"]);
        let e = t.evaluate(mono(41));
        assert!(e.set.peers.is_empty());
        assert_eq!(
            e.set.excluded("apiserver-f").unwrap().reason,
            Exclusion::Expired
        );
        // Re-delivered unchanged (a watch restart): still dead.
        t.apply(far, at(100));
        assert!(t.evaluate(mono(100)).set.peers.is_empty());
    }

    #[test]
    fn an_observed_renewal_resets_the_grace_and_nothing_else_does() {
        let mut t = synced(
            config(&["10.0.0.0/8"]),
            vec![lease("apiserver-a", "a_1", Some(0), Some("10.0.0.1:1"))],
        );
        assert_eq!(t.observed("apiserver-a"), Some(mono(0)));
        // Another annotation value (a new resourceVersion, no renewal): no reset.
        t.apply(
            lease("apiserver-a", "a_1", Some(0), Some("10.0.0.1:2")),
            at(20),
        );
        assert_eq!(t.observed("apiserver-a"), Some(mono(0)));
        assert!(t.evaluate(mono(31)).set.peers.is_empty());
        // The same renewTime re-delivered (a re-list, a watch restart): no renewal.
        t.apply(
            lease("apiserver-a", "a_1", Some(0), Some("10.0.0.1:2")),
            at(40),
        );
        assert_eq!(t.observed("apiserver-a"), Some(mono(0)));
        // A new renewTime — even an earlier one — is a renewal we saw.
        let mut earlier = lease("apiserver-a", "a_1", None, Some("10.0.0.1:2"));
        earlier.renew_time = Some(wall(0) - Duration::from_secs(1));
        t.apply(earlier, at(45));
        assert_eq!(t.observed("apiserver-a"), Some(mono(45)));
        assert_eq!(ids(&t.evaluate(mono(75)).set), ["apiserver-a"]);
        assert!(t.evaluate(mono(76)).set.peers.is_empty());
        // A new holder with the same renewTime (a restart): a renewal too.
        let mut restarted = lease("apiserver-a", "a_2", None, Some("10.0.0.1:2"));
        restarted.renew_time = Some(wall(0) - Duration::from_secs(1));
        t.apply(restarted, at(80));
        assert_eq!(t.observed("apiserver-a"), Some(mono(80)));
        assert_eq!(ids(&t.evaluate(mono(80)).set), ["apiserver-a"]);
    }

    #[test]
    fn a_malformed_lease_is_excluded_with_a_reason_and_reported_once() {
        let malformed = |name: &str, field, detail: &str| {
            let mut l = lease(name, "m_1", None, Some("10.0.0.7:1"));
            l.malformed = Some(MalformedLease {
                field,
                detail: detail.into(),
            });
            l
        };
        let mut cfg = config(&["10.0.0.0/8"]);
        cfg.local = LocalSelector::LeaseName("apiserver-m".into());
        let mut t = synced(
            cfg,
            vec![
                lease("apiserver-a", "a_1", Some(0), Some("10.0.0.1:1")),
                malformed(
                    "apiserver-m",
                    LeaseField::RenewTime,
                    "\"9999-12-31T23:59:59Z\": out of range",
                ),
                malformed("apiserver-n", LeaseField::HolderIdentity, "not a string"),
            ],
        );
        let e = t.evaluate(mono(1));
        // The others are unaffected.
        assert_eq!(ids(&e.set), ["apiserver-a"]);
        // Never local, never a peer, excluded with the field.
        assert!(e.set.local.is_none());
        assert_eq!(
            e.set.excluded("apiserver-m").unwrap().reason,
            Exclusion::Malformed(LeaseField::RenewTime)
        );
        assert_eq!(
            e.set.excluded("apiserver-n").unwrap().reason,
            Exclusion::Malformed(LeaseField::HolderIdentity)
        );
        assert_eq!(
            e.notices,
            vec![
                Notice::Malformed {
                    id: "apiserver-m".into(),
                    field: LeaseField::RenewTime,
                    detail: "\"9999-12-31T23:59:59Z\": out of range".into(),
                },
                Notice::Malformed {
                    id: "apiserver-n".into(),
                    field: LeaseField::HolderIdentity,
                    detail: "not a string".into(),
                },
            ]
        );
        // Re-delivered or re-evaluated: not reported again.
        t.apply(
            malformed(
                "apiserver-m",
                LeaseField::RenewTime,
                "\"9999-12-31T23:59:59Z\": out of range",
            ),
            at(5),
        );
        assert!(t.evaluate(mono(5)).notices.is_empty());
        // Repaired: the repair is a write we saw, so it is live (and local) from then on.
        t.apply(lease("apiserver-m", "m_1", Some(8), None), at(8));
        let e = t.evaluate(mono(8));
        assert!(e.notices.is_empty());
        let local = e.set.local.unwrap();
        assert_eq!((local.id.as_str(), local.live), ("apiserver-m", true));
        // Broken again: reported again.
        t.apply(
            malformed("apiserver-m", LeaseField::RenewTime, "\"soon\": not a time"),
            at(9),
        );
        assert_eq!(t.evaluate(mono(9)).notices.len(), 1);
    }

    #[test]
    fn not_synced_until_the_first_list_completes() {
        let mut t = Tracker::new(config(&["10.0.0.0/8"]));
        assert!(!t.evaluate(mono(0)).set.synced);
        t.begin_relist();
        t.relist_apply(lease("apiserver-a", "a_1", Some(0), Some("10.0.0.1:1")));
        assert!(!t.evaluate(mono(0)).set.synced);
        assert!(t.evaluate(mono(0)).set.peers.is_empty());
        t.finish_relist(at(0));
        assert_eq!(ids(&t.evaluate(mono(0)).set), ["apiserver-a"]);
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
        let before = t.evaluate(mono(1)).set;
        let (ga, gb) = (
            before.peer("apiserver-a").unwrap().generation,
            before.peer("apiserver-b").unwrap().generation,
        );
        assert_ne!(ga, gb);
        // Renewal by the same holder: no change.
        t.apply(
            lease("apiserver-a", "apiserver-a_1", Some(5), Some("10.0.0.1:1")),
            at(5),
        );
        let e = t.evaluate(mono(6));
        assert_eq!(e.set.peer("apiserver-a").unwrap().generation, ga);
        assert!(e.notices.is_empty());
        // New holder: a restart.
        t.apply(
            lease("apiserver-a", "apiserver-a_2", Some(7), Some("10.0.0.1:1")),
            at(7),
        );
        let e = t.evaluate(mono(8));
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
        t.apply(
            lease("apiserver-a", "apiserver-a_1", Some(9), Some("10.0.0.1:1")),
            at(9),
        );
        let ga3 = t
            .evaluate(mono(9))
            .set
            .peer("apiserver-a")
            .unwrap()
            .generation;
        assert!(ga3 > ga2);
        // Deleted and recreated: new generation, no "restart" notice (it was gone).
        t.delete("apiserver-a");
        assert!(t.evaluate(mono(10)).set.peer("apiserver-a").is_none());
        t.apply(
            lease("apiserver-a", "apiserver-a_1", Some(10), Some("10.0.0.1:1")),
            at(10),
        );
        let e = t.evaluate(mono(10));
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
        let before = t.evaluate(mono(1)).set;
        // A watch desync: re-list without b, and with a restarted.
        t.begin_relist();
        t.relist_apply(lease("apiserver-a", "a_1", Some(1), Some("10.0.0.1:1")));
        t.relist_apply(lease("apiserver-c", "c_1", Some(1), Some("10.0.0.3:1")));
        // Until the list is complete the old view stands.
        assert_eq!(
            ids(&t.evaluate(mono(2)).set),
            ["apiserver-a", "apiserver-b"]
        );
        t.finish_relist(at(2));
        let after = t.evaluate(mono(2)).set;
        assert_eq!(ids(&after), ["apiserver-a", "apiserver-c"]);
        // a changed: renewed as of the re-list; c is new and plausible: observed then too.
        assert_eq!(t.observed("apiserver-a"), Some(mono(2)));
        assert_eq!(t.observed("apiserver-c"), Some(mono(2)));
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
        let e = t.evaluate(mono(1));
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
        t.apply(
            lease("apiserver-1", "h", Some(10), Some("evil.com:443")),
            at(10),
        );
        assert!(t.evaluate(mono(11)).notices.is_empty());
        // ...a new value does.
        t.apply(
            lease("apiserver-1", "h", Some(12), Some("evil.org:443")),
            at(12),
        );
        assert_eq!(t.evaluate(mono(12)).notices.len(), 1);
        // Fixed, then broken again: reported again.
        t.apply(
            lease("apiserver-1", "h", Some(13), Some("10.0.0.9:6443")),
            at(13),
        );
        let e = t.evaluate(mono(13));
        assert!(e.notices.is_empty());
        assert!(e.set.peer("apiserver-1").is_some());
        t.apply(
            lease("apiserver-1", "h", Some(14), Some("evil.org:443")),
            at(14),
        );
        assert_eq!(t.evaluate(mono(14)).notices.len(), 1);
    }

    /// The lease kube-apiserver on `host` writes: named after the host.
    fn lease_of_host(host: &str, renew: Option<u64>, addr: Option<&str>) -> LeaseInfo {
        LeaseInfo {
            hostname: Some(host.into()),
            ..lease(&identity_lease_name(host), host, renew, addr)
        }
    }

    #[test]
    fn no_cidrs_refuses_every_annotation_but_not_the_mapping() {
        let mut cfg = config(&[]);
        cfg.policy = AddressPolicy::new(
            vec![],
            [MappingEntry::ByHostname(
                "cp-b".into(),
                "10.9.9.9:6444".parse().unwrap(),
            )],
        );
        let b_name = identity_lease_name("cp-b");
        let mut t = synced(
            cfg,
            vec![
                lease("apiserver-a", "a", Some(0), Some("10.0.0.1:6443")),
                lease_of_host("cp-b", Some(0), Some("10.0.0.2:6443")),
            ],
        );
        let e = t.evaluate(mono(1));
        assert_eq!(ids(&e.set), [b_name.as_str()]);
        let b = e.set.peer(&b_name).unwrap();
        assert_eq!(b.address, "10.9.9.9:6444".parse().unwrap());
        assert_eq!(b.address_source, AddressSource::MappingByHostname);
        assert_eq!(
            e.set.excluded("apiserver-a").unwrap().reason,
            Exclusion::Address(RejectReason::NoCidrs)
        );
    }

    /// Leases that claim a mapped host under names of their own do not get its address, so
    /// they cannot take the places the mapping ranks first and push a known peer over
    /// `--max-peers`.
    #[test]
    fn leases_claiming_a_mapped_host_do_not_push_known_peers_out() {
        let mut cfg = config(&["10.0.0.0/24"]);
        cfg.max_peers = 2;
        cfg.policy = AddressPolicy::new(
            vec![parse_cidr("10.0.0.0/24").unwrap()],
            [MappingEntry::ByHostname(
                "cp-2".into(),
                "10.0.0.2:6443".parse().unwrap(),
            )],
        );
        let mut t = synced(
            cfg,
            vec![
                lease_of_host("cp-2", Some(0), None),
                lease_of_host("cp-3", Some(0), Some("10.0.0.3:6443")),
            ],
        );
        let (cp2, cp3) = (identity_lease_name("cp-2"), identity_lease_name("cp-3"));
        let mut known = vec![cp2.clone(), cp3.clone()];
        known.sort();
        assert_eq!(ids(&t.evaluate(mono(1)).set), known);
        // Later, fakes claiming cp-2, without an annotation and with one inside the CIDRs.
        for (i, addr) in [None, Some("10.0.0.2:6443"), Some("10.0.0.9:6443")]
            .into_iter()
            .enumerate()
        {
            t.apply(
                LeaseInfo {
                    hostname: Some("cp-2".into()),
                    ..lease(&format!("apiserver-f{i}"), "f", Some(5), addr)
                },
                at(5),
            );
        }
        let e = t.evaluate(mono(6));
        assert_eq!(ids(&e.set), known, "the known peers keep their places");
        assert_eq!(
            e.set.peer(&cp2).unwrap().address_source,
            AddressSource::MappingByHostname
        );
        assert_eq!(
            e.set.excluded("apiserver-f0").unwrap().reason,
            Exclusion::Address(RejectReason::Missing)
        );
        for fake in ["apiserver-f1", "apiserver-f2"] {
            assert_eq!(e.set.excluded(fake).unwrap().reason, Exclusion::OverCap);
        }
    }

    #[test]
    fn local_by_lease_name_or_hostname() {
        let leases = vec![
            lease("apiserver-a", "a_1", Some(0), None),
            lease("apiserver-b", "b_1", Some(0), Some("10.0.0.2:1")),
        ];
        let mut cfg = config(&["10.0.0.0/8"]);
        cfg.local = LocalSelector::LeaseName("apiserver-a".into());
        let e = synced(cfg.clone(), leases.clone()).evaluate(mono(1));
        let local = e.set.local.clone().unwrap();
        assert_eq!((local.id.as_str(), local.live), ("apiserver-a", true));
        // The local lease needs no address and is never a peer, nor a rejection.
        assert_eq!(ids(&e.set), ["apiserver-b"]);
        assert!(e.set.excluded.is_empty());
        assert!(e.notices.is_empty());

        // By host name: the lease kube-apiserver on that host names its own.
        let b_name = identity_lease_name("cp-b");
        let mut b = lease(&b_name, "b_1", Some(0), Some("10.0.0.2:1"));
        b.hostname = Some("cp-b".into());
        let leases = vec![lease("apiserver-a", "a_1", Some(0), None), b];
        cfg.local = LocalSelector::Hostname("cp-b".into());
        let e = synced(cfg.clone(), leases.clone()).evaluate(mono(1));
        assert_eq!(e.set.local.as_ref().unwrap().id, b_name);
        // apiserver-a has no address: excluded, reported.
        assert!(e.set.peers.is_empty());
        assert_eq!(
            e.set.excluded("apiserver-a").unwrap().reason,
            Exclusion::Address(RejectReason::Missing)
        );

        // A dead local lease is still reported as local, flagged dead.
        let e = synced(cfg.clone(), leases.clone()).evaluate(mono(100));
        let local = e.set.local.unwrap();
        assert_eq!((local.id.as_str(), local.live), (b_name.as_str(), false));

        // Only a lease named as kube names it is ours: a lease with our hostname label under
        // another name is nobody's, even when it is the only one.
        let mut impostor = lease("apiserver-z", "z", Some(0), Some("10.0.0.26:1"));
        impostor.hostname = Some("cp-b".into());
        let e = synced(cfg.clone(), vec![impostor]).evaluate(mono(1));
        assert!(e.set.local.is_none());
        assert!(e.set.peers.is_empty());

        // Not present: no local.
        let mut cfg = config(&["10.0.0.0/8"]);
        cfg.local = LocalSelector::LeaseName("apiserver-x".into());
        assert!(synced(cfg, vec![]).evaluate(mono(0)).set.local.is_none());
    }

    #[test]
    fn a_second_lease_claiming_the_local_hostname_changes_nothing() {
        let ours = identity_lease_name("cp-1");
        let mut local = lease(&ours, "l_1", Some(0), None);
        local.hostname = Some("cp-1".into());
        let peer = lease("apiserver-p", "p_1", Some(0), Some("10.0.0.2:1"));
        let mut cfg = config(&["10.0.0.0/8"]);
        cfg.local = LocalSelector::Hostname("cp-1".into());
        let mut t = synced(cfg, vec![local.clone(), peer.clone()]);
        let before = t.evaluate(mono(1)).set;
        assert_eq!(before.local.as_ref().unwrap().id, ours);

        // (impostor name, renews after ours, dead local): none of it makes the impostor ours
        // nor a peer, and the set is otherwise unchanged.
        let cases = [
            ("apiserver-0", false, false),  // sorts first
            ("apiserver-zzz", true, false), // renews more recently
            ("apiserver-m", true, true),    // ours is dead, the impostor is live
        ];
        for (name, renews, local_dead) in cases {
            let mut t = synced(
                PeerConfig {
                    local: LocalSelector::Hostname("cp-1".into()),
                    ..config(&["10.0.0.0/8"])
                },
                vec![local.clone(), peer.clone()],
            );
            let mut imp = lease(name, &format!("{name}_x"), Some(0), Some("10.0.0.66:1"));
            imp.hostname = Some("cp-1".into());
            t.apply(imp.clone(), at(1));
            let now = if local_dead { 40 } else { 5 };
            if renews {
                imp.renew_time = Some(wall(now - 1));
                t.apply(imp.clone(), at(now - 1));
                t.apply(
                    lease("apiserver-p", "p_1", Some(now - 1), Some("10.0.0.2:1")),
                    at(now - 1),
                );
            }
            let e = t.evaluate(mono(now));
            let l = e.set.local.as_ref().unwrap();
            assert_eq!(l.id, ours, "{name}");
            assert_eq!(l.live, !local_dead, "{name}");
            assert_eq!(ids(&e.set), ["apiserver-p"], "{name}");
            assert_eq!(
                e.set.excluded(name).unwrap().reason,
                Exclusion::DuplicateLocal,
                "{name}"
            );
            assert_eq!(
                e.notices,
                [Notice::DuplicateLocal {
                    id: name.into(),
                    hostname: "cp-1".into(),
                    expected: ours.clone(),
                }],
                "{name}: reported"
            );
            // Reported once.
            t.apply(imp.clone(), at(now));
            assert!(t.evaluate(mono(now)).notices.is_empty(), "{name}: once");
        }
        // And before any impostor: the same local, the same peers.
        let e = t.evaluate(mono(2));
        assert_eq!(e.set.local, before.local);
        assert_eq!(e.set.peers, before.peers);
    }

    #[test]
    fn peers_beyond_the_cap_are_excluded_deterministically() {
        // (max, leases as (name, first seen at, mapped), expected peers, over the cap)
        type Case = (
            usize,
            &'static [(&'static str, u64, bool)],
            &'static [&'static str],
            &'static [&'static str],
        );
        let cases: &[Case] = &[
            // Under or at the cap: everyone.
            (3, &[("a", 0, false), ("b", 0, false)], &["a", "b"], &[]),
            (2, &[("a", 0, false), ("b", 0, false)], &["a", "b"], &[]),
            // Seen together: the smallest names.
            (
                2,
                &[("c", 0, false), ("a", 0, false), ("b", 0, false)],
                &["a", "b"],
                &["c"],
            ),
            // Known longer wins over a smaller name.
            (
                2,
                &[("a", 5, false), ("b", 0, false), ("c", 1, false)],
                &["b", "c"],
                &["a"],
            ),
            // The operator's mapping wins over everything.
            (1, &[("a", 0, false), ("z", 9, true)], &["z"], &["a"]),
            (
                2,
                &[
                    ("a", 0, false),
                    ("b", 0, false),
                    ("y", 9, true),
                    ("z", 8, true),
                ],
                &["y", "z"],
                &["a", "b"],
            ),
        ];
        for (max, leases, peers, over) in cases {
            let mut cfg = PeerConfig {
                policy: AddressPolicy::new(
                    vec![parse_cidr("10.0.0.0/8").unwrap()],
                    leases
                        .iter()
                        .filter(|(_, _, mapped)| *mapped)
                        .map(|(n, _, _)| {
                            MappingEntry::ByLease(n.to_string(), "192.0.2.1:6444".parse().unwrap())
                        })
                        .collect::<Vec<_>>(),
                ),
                ..config(&[])
            };
            cfg.max_peers = *max;
            let mut t = synced(cfg, vec![]);
            let mut order: Vec<_> = leases.to_vec();
            order.sort_by_key(|(_, seen, _)| *seen);
            for (n, seen, _) in &order {
                t.apply(
                    lease(n, &format!("{n}_1"), Some(*seen), Some("10.0.0.1:1")),
                    at(*seen),
                );
            }
            let e = t.evaluate(mono(10));
            assert_eq!(ids(&e.set), *peers, "{max} {leases:?}");
            let excluded: Vec<&str> = e
                .set
                .excluded
                .iter()
                .filter(|x| x.reason == Exclusion::OverCap)
                .map(|x| x.id.as_str())
                .collect();
            assert_eq!(excluded, *over, "{max} {leases:?}");
            let reported: Vec<&str> = e
                .notices
                .iter()
                .filter_map(|n| match n {
                    Notice::OverCap { id, max_peers } if max_peers == max => Some(id.as_str()),
                    _ => None,
                })
                .collect();
            assert_eq!(reported, *over, "reported");
            assert!(t.evaluate(mono(11)).notices.is_empty(), "reported once");
        }
    }

    #[test]
    fn a_flood_of_leases_never_displaces_known_peers() {
        let mut cfg = config(&["10.0.0.0/8"]);
        cfg.max_peers = 3;
        let mut t = synced(
            cfg,
            vec![
                lease("apiserver-m", "m", Some(0), Some("10.0.0.1:1")),
                lease("apiserver-n", "n", Some(0), Some("10.0.0.2:1")),
            ],
        );
        for i in 0..1000 {
            let name = format!("apiserver-{i:04}");
            t.apply(lease(&name, "x", Some(1), Some("10.0.1.1:1")), at(1));
        }
        let e = t.evaluate(mono(2));
        assert_eq!(
            ids(&e.set),
            ["apiserver-0000", "apiserver-m", "apiserver-n"]
        );
        assert_eq!(e.set.excluded.len(), 999);
        assert_eq!(e.notices.len(), 999);
        // A re-list keeps seniority.
        t.begin_relist();
        t.relist_apply(lease("apiserver-m", "m", Some(0), Some("10.0.0.1:1")));
        t.relist_apply(lease("apiserver-n", "n", Some(0), Some("10.0.0.2:1")));
        for i in 0..1000 {
            let name = format!("apiserver-{i:04}");
            t.relist_apply(lease(&name, "x", Some(1), Some("10.0.1.1:1")));
        }
        t.finish_relist(at(3));
        let e = t.evaluate(mono(4));
        assert_eq!(
            ids(&e.set),
            ["apiserver-0000", "apiserver-m", "apiserver-n"]
        );
        assert!(e.notices.is_empty());
    }

    /// The finding of issue 18: after a restart every lease was first seen at the same moment
    /// (the first list), so 16 renewed leases whose names sort first pushed the real peer out
    /// of the cap. Seniority kept in the state directory keeps it in.
    #[test]
    fn after_a_restart_leases_whose_names_sort_first_never_take_a_known_peers_place() {
        let cfg = config(&["10.0.0.0/8"]);
        let real = || lease("apiserver-real", "r", Some(0), Some("10.0.0.2:1"));
        let flood = |renew: u64| -> Vec<LeaseInfo> {
            (0..16)
                .map(|i| {
                    lease(
                        &format!("apiserver-0{i:02}"),
                        "x",
                        Some(renew),
                        Some("10.0.1.1:1"),
                    )
                })
                .collect()
        };
        // Before the restart: the real peer was known first; the flood fills what is left.
        let mut before = synced(cfg.clone(), vec![real()]);
        for l in flood(10) {
            before.apply(l, at(10));
        }
        let e = before.evaluate(mono(10));
        assert!(e.set.peer("apiserver-real").is_some());
        assert_eq!(e.set.peers.len(), DEFAULT_MAX_PEERS);
        // What the retention keeps: the seniority of the peers within the cap.
        let kept: Vec<(String, FirstSeen)> = e
            .set
            .peers
            .iter()
            .map(|p| (p.id.clone(), p.first_seen))
            .collect();

        // The restart: everything listed at once, all renewed.
        let listed = || {
            let mut leases = flood(100);
            leases.push(lease("apiserver-real", "r", Some(100), Some("10.0.0.2:1")));
            leases
        };
        let relist = |t: &mut Tracker| {
            t.begin_relist();
            for l in listed() {
                t.relist_apply(l);
            }
            t.finish_relist(at(100));
        };
        let mut without = Tracker::new(cfg.clone());
        relist(&mut without);
        assert_eq!(
            without
                .evaluate(mono(100))
                .set
                .excluded("apiserver-real")
                .map(|x| x.reason),
            Some(Exclusion::OverCap),
            "without the seniority: the smallest names win"
        );
        let mut after = Tracker::restoring(cfg, kept);
        relist(&mut after);
        let e = after.evaluate(mono(100));
        assert!(
            e.set.peer("apiserver-real").is_some(),
            "{:?}",
            e.set.excluded
        );
        assert_eq!(e.set.peers.len(), DEFAULT_MAX_PEERS);
        // The one flood lease that was over the cap before is the one over it now.
        let over: Vec<&str> = e.set.excluded.iter().map(|x| x.id.as_str()).collect();
        assert_eq!(over, ["apiserver-015"]);
        // And the stamps carry on: what the state directory would write again is unchanged.
        assert_eq!(
            e.set.peer("apiserver-real").map(|p| p.first_seen),
            before
                .evaluate(mono(10))
                .set
                .peer("apiserver-real")
                .map(|p| p.first_seen)
        );
    }

    #[test]
    fn a_clock_set_back_never_makes_a_new_lease_look_older() {
        let mut cfg = config(&["10.0.0.0/8"]);
        cfg.max_peers = 1;
        let when = |mono_secs: u64, wall_secs: u64| Moment {
            mono: mono(mono_secs),
            wall: wall(wall_secs),
        };
        // Within one process: "m" first seen at 5000 by the wall clock, which is then set back
        // an hour; "a" (a smaller name) first seen after it still ranks after it.
        let mut t = synced(cfg.clone(), vec![]);
        t.apply(
            lease("apiserver-m", "m", Some(5000), Some("10.0.0.1:1")),
            when(1, 5000),
        );
        t.apply(
            lease("apiserver-a", "a", Some(1400), Some("10.0.0.2:1")),
            when(2, 1400),
        );
        let e = t.evaluate(mono(3));
        assert_eq!(ids(&e.set), ["apiserver-m"]);
        let (m, a) = (
            t.leases["apiserver-m"].first_seen,
            t.leases["apiserver-a"].first_seen,
        );
        assert!(a > m, "{a:?} after {m:?}");
        // Across a restart onto a clock a year behind: restored seniority stays ahead of every
        // lease seen from now on.
        let kept = [(
            "apiserver-m".to_string(),
            FirstSeen::from_wall(wall(365 * 86_400)),
        )];
        let mut t = Tracker::restoring(cfg, kept);
        t.begin_relist();
        t.relist_apply(lease("apiserver-a", "a", Some(0), Some("10.0.0.2:1")));
        t.relist_apply(lease("apiserver-m", "m", Some(0), Some("10.0.0.1:1")));
        t.finish_relist(when(10, 0));
        assert_eq!(ids(&t.evaluate(mono(10)).set), ["apiserver-m"]);
        assert!(t.leases["apiserver-a"].first_seen > t.leases["apiserver-m"].first_seen);
        // The stamps only grow; at the end of u64 they saturate (names decide).
        assert_eq!(
            FirstSeen::after(Some(FirstSeen(u64::MAX)), wall(0)),
            FirstSeen(u64::MAX)
        );
        assert_eq!(
            FirstSeen::after(None, wall(5)),
            FirstSeen::from_wall(wall(5))
        );
        assert_eq!(FirstSeen::from_wall(wall(5)).wall(), wall(5));
    }

    #[test]
    fn restored_seniority_is_bounded_by_the_cap_and_lost_with_the_lease() {
        let mut cfg = config(&["10.0.0.0/8"]);
        cfg.max_peers = 2;
        // Three kept (a directory of another configuration): only the two most senior count.
        let kept = [
            ("apiserver-c".to_string(), FirstSeen(3)),
            ("apiserver-a".to_string(), FirstSeen(1)),
            ("apiserver-b".to_string(), FirstSeen(2)),
        ];
        let t = Tracker::restoring(cfg.clone(), kept.clone());
        assert_eq!(
            t.restored.keys().map(String::as_str).collect::<Vec<_>>(),
            ["apiserver-a", "apiserver-b"]
        );
        // The first list finds "a" only: "b" was deleted while we were down, and when a lease
        // of that name is created later, it is a new one.
        let mut t = Tracker::restoring(cfg.clone(), kept.clone());
        t.begin_relist();
        t.relist_apply(lease("apiserver-a", "a", Some(100), Some("10.0.0.1:1")));
        t.finish_relist(at(100));
        assert_eq!(t.leases["apiserver-a"].first_seen, FirstSeen(1));
        assert!(t.restored.is_empty());
        t.apply(
            lease("apiserver-b", "b", Some(101), Some("10.0.0.2:1")),
            at(101),
        );
        assert!(t.leases["apiserver-b"].first_seen > FirstSeen(3));
        // A lease deleted and created again in this process is new too.
        t.delete("apiserver-a");
        t.apply(
            lease("apiserver-a", "a", Some(102), Some("10.0.0.1:1")),
            at(102),
        );
        assert!(t.leases["apiserver-a"].first_seen > t.leases["apiserver-b"].first_seen);
    }

    #[test]
    fn a_failing_watch_freezes_liveness() {
        let mut t = synced(
            config(&["10.0.0.0/8"]),
            vec![lease("apiserver-a", "a", Some(0), Some("10.0.0.1:1"))],
        );
        assert!(!t.evaluate(mono(1)).set.stale);
        // The watch breaks at 10: renewals are no longer seen.
        t.watch_failed(mono(10));
        t.watch_failed(mono(20)); // the first failure counts
        let e = t.evaluate(mono(100));
        assert!(e.set.stale);
        assert_eq!(
            ids(&e.set),
            ["apiserver-a"],
            "not dropped while we cannot see"
        );
        assert_eq!(e.next_expiry, None);
        // Back at 100: the lease was renewed meanwhile (seen now)...
        t.watch_resumed(mono(100));
        t.apply(
            lease("apiserver-a", "a", Some(95), Some("10.0.0.1:1")),
            at(100),
        );
        let e = t.evaluate(mono(100));
        assert!(!e.set.stale);
        assert_eq!(ids(&e.set), ["apiserver-a"]);
        // ...or it was not: then it expires as usual.
        t.watch_failed(mono(101));
        t.watch_resumed(mono(101));
        assert!(t.evaluate(mono(200)).set.peers.is_empty());
    }

    /// A watch that comes back after more than the grace does not make every peer dead
    /// before its renewals arrive: the outage is not counted, each lease keeps the rest of the
    /// grace it had when the watch failed, and a lease not renewed since expires after that.
    #[test]
    fn the_time_a_watch_was_failing_does_not_count_against_a_lease() {
        let mut t = synced(
            config(&["10.0.0.0/8"]),
            vec![
                lease("apiserver-a", "a", Some(0), Some("10.0.0.1:1")),
                lease("apiserver-b", "b", Some(0), Some("10.0.0.2:1")),
            ],
        );
        // Both seen renewed at 0; the watch fails at 20 (10 s of their 30 s grace left).
        t.watch_failed(mono(20));
        // Back at 300 with a's renewal first: b's renewal is still on its way.
        t.watch_resumed(mono(300));
        t.apply(
            lease("apiserver-a", "a", Some(299), Some("10.0.0.1:1")),
            at(300),
        );
        let e = t.evaluate(mono(300));
        assert!(!e.set.stale);
        assert_eq!(ids(&e.set), ["apiserver-a", "apiserver-b"]);
        assert_eq!(
            e.next_expiry,
            Some(Duration::from_millis(10_001)),
            "b's rest"
        );
        assert_eq!(
            ids(&t.evaluate(mono(310)).set),
            ["apiserver-a", "apiserver-b"]
        );
        // b is never renewed: it expires 10 s after the watch came back.
        assert_eq!(ids(&t.evaluate(mono(311)).set), ["apiserver-a"]);
        // Resuming when nothing was frozen changes nothing.
        t.watch_resumed(mono(400));
        assert!(t.evaluate(mono(400)).set.peers.is_empty());
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
        let x = synced(config(&["10.0.0.0/8"]), leases)
            .evaluate(mono(1))
            .set;
        let y = synced(config(&["10.0.0.0/8"]), rev).evaluate(mono(1)).set;
        assert_eq!(ids(&x), ["apiserver-a", "apiserver-b"]);
        assert_eq!(x, y);
    }
}
