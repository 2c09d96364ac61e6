//! Delta xDS bookkeeping for one ADS stream, as a pure state machine (no I/O; the time is an
//! argument).
//!
//! Per type URL the stream tracks what the client subscribes to (wildcard and/or names), what
//! it holds (name → version: its `initial_resource_versions` on (re)connect, then every
//! ACKed response), the one response in flight, and the versions it refused. From that and
//! the current [`Snapshot`], [`DeltaStream::next_response`] computes the next response due:
//!
//! - only added or changed resources are sent, and `removed_resources` for held names the
//!   snapshot no longer has; a client that reconnects holding the current versions gets
//!   nothing;
//! - at most one response per type is in flight; the next one waits for its ACK or NACK;
//! - a NACKed version is never sent again: the client keeps its last good resource and the
//!   next push for that name happens only when the snapshot brings a different version;
//! - make before break: a filter configuration (ECDS) is sent only once every cluster of the
//!   snapshot was acknowledged (or refused), and a cluster is removed only once the client
//!   holds the snapshot's filter configuration. After a refused filter configuration the
//!   client keeps routing with its previous one, so the clusters that one names stay;
//! - and not at once even then: a removed cluster lingers ([`DeltaStream::with_cluster_linger`])
//!   for as long as a request routed to it by the previous filter configuration may still retry
//!   there. Envoy looks the cluster up again for every retry, and a request whose first attempt
//!   fails after its cluster is gone gets `no_healthy_upstream` (a 503), though a live
//!   apiserver could have served it;
//! - a snapshot whose filter configuration is withheld from this client (its filter cannot
//!   read it: [`Snapshot::filter_withheld`]) sends no filter configuration and removes none:
//!   the client keeps the one it holds (or its bootstrap's), and so every cluster it has.
//!
//! Subscriptions follow the delta protocol: the first request of a type with no names (or with
//! `*`) is a wildcard subscription (CDS); `*` in `resource_names_unsubscribe` ends it; other
//! names subscribe by name (ECDS). Unsubscribed names are forgotten (the client drops them).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource,
};

use super::snapshot::{Snapshot, Versioned};
use super::{CLUSTER_TYPE_URL, EXTENSION_CONFIG_TYPE_URL};

const WILDCARD: &str = "*";

/// At most this many removed clusters linger at once (100 peer sets in their three variants).
const MAX_LINGERING_CLUSTERS: usize = 300;

/// What one request meant, for logs and counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received {
    /// The in-flight response of this type was applied.
    Ack,
    /// The in-flight response of this type was refused; `refused` (name → version) will not be
    /// sent again.
    Nack {
        message: String,
        refused: BTreeMap<String, String>,
    },
    /// A nonce this stream has no response in flight for (already settled, or never sent).
    Stale { nonce: String },
    /// No nonce: a first request or a subscription change.
    Subscription,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct InFlight {
    nonce: String,
    updated: BTreeMap<String, String>,
    removed: Vec<String>,
}

#[derive(Debug, Default)]
struct TypeState {
    wildcard: bool,
    names: BTreeSet<String>,
    /// What the client holds: name → version.
    held: BTreeMap<String, String>,
    /// Versions the client refused: name → version.
    rejected: BTreeMap<String, String>,
    in_flight: Option<InFlight>,
    /// Held names the snapshot no longer has, since when they may go (the client holds a
    /// filter configuration that no longer names them): clusters linger before removal.
    unreferenced: BTreeMap<String, Instant>,
    /// Names removed before their linger was over because too many lingered.
    removed_early: u64,
}

impl TypeState {
    fn wants(&self, name: &str) -> bool {
        self.wildcard || self.names.contains(name)
    }

    /// Resources to send: wanted, neither held nor refused at the snapshot's version.
    fn upserts<'a>(
        &self,
        resources: &'a BTreeMap<String, Versioned>,
    ) -> Vec<(&'a String, &'a Versioned)> {
        resources
            .iter()
            .filter(|(name, v)| {
                self.wants(name)
                    && self.held.get(*name) != Some(&v.version)
                    && self.rejected.get(*name) != Some(&v.version)
            })
            .collect()
    }

    /// Held names the snapshot no longer has.
    fn removals(&self, resources: &BTreeMap<String, Versioned>) -> Vec<String> {
        self.held
            .keys()
            .filter(|name| !resources.contains_key(*name))
            .cloned()
            .collect()
    }

    /// The held names the snapshot no longer has that have been unreferenced for `linger`
    /// by `now`; the others start or keep their time.
    fn due_removals(
        &mut self,
        resources: &BTreeMap<String, Versioned>,
        now: Instant,
        linger: Duration,
    ) -> Vec<String> {
        let gone: BTreeSet<String> = self.removals(resources).into_iter().collect();
        // A name the snapshot has again, or the client no longer holds, starts afresh.
        self.unreferenced.retain(|name, _| gone.contains(name));
        let mut due = Vec::new();
        let mut waiting = Vec::new();
        for name in gone {
            let since = *self.unreferenced.entry(name.clone()).or_insert(now);
            if now.saturating_duration_since(since) >= linger {
                due.push(name);
            } else {
                waiting.push((since, name));
            }
        }
        // Bounded whatever the churn (a Lease writer can make a new peer set every publish):
        // past the cap the longest-lingering go now.
        waiting.sort();
        let excess = waiting.len().saturating_sub(MAX_LINGERING_CLUSTERS);
        self.removed_early = self.removed_early.saturating_add(excess as u64);
        due.extend(waiting.into_iter().take(excess).map(|(_, name)| name));
        due
    }

    /// Held names the snapshot no longer has, waiting for their linger (not yet on their way
    /// out in a response).
    fn lingering(&self) -> usize {
        let leaving = self.in_flight.as_ref().map_or(&[][..], |f| &f.removed[..]);
        self.unreferenced
            .keys()
            .filter(|name| !leaving.contains(name))
            .count()
    }

    /// The client holds exactly the snapshot's resources of this type.
    fn in_sync(&self, resources: &BTreeMap<String, Versioned>) -> bool {
        self.in_flight.is_none()
            && self.removals(resources).is_empty()
            && resources
                .iter()
                .filter(|(name, _)| self.wants(name))
                .all(|(name, v)| self.held.get(name) == Some(&v.version))
    }
}

/// The delta bookkeeping of one ADS stream.
#[derive(Debug)]
pub struct DeltaStream {
    nonce_prefix: String,
    next_nonce: u64,
    types: BTreeMap<String, TypeState>,
    cluster_linger: Duration,
}

impl DeltaStream {
    /// `nonce_prefix` makes nonces unique across streams (for logs; the protocol needs them
    /// unique per stream only).
    pub fn new(nonce_prefix: impl Into<String>) -> Self {
        DeltaStream {
            nonce_prefix: nonce_prefix.into(),
            next_nonce: 1,
            types: BTreeMap::new(),
            cluster_linger: Duration::ZERO,
        }
    }

    /// A cluster no longer in the snapshot is removed only `linger` after the client holds a
    /// filter configuration that no longer names it (none: at once).
    pub fn with_cluster_linger(mut self, linger: Duration) -> Self {
        self.set_cluster_linger(linger);
        self
    }

    /// As [`with_cluster_linger`](Self::with_cluster_linger), once the client has said how long
    /// its requests may take.
    pub fn set_cluster_linger(&mut self, linger: Duration) {
        self.cluster_linger = linger;
    }

    pub fn cluster_linger(&self) -> Duration {
        self.cluster_linger
    }

    /// Clusters the snapshot no longer has that the client still holds, waiting for their
    /// linger.
    pub fn lingering_clusters(&self) -> usize {
        self.types
            .get(CLUSTER_TYPE_URL)
            .map_or(0, TypeState::lingering)
    }

    /// Clusters removed before their linger was over, because more than
    /// [`MAX_LINGERING_CLUSTERS`] lingered: a retry of a request routed to one of them before
    /// finds no cluster.
    pub fn clusters_removed_early(&self) -> u64 {
        self.types
            .get(CLUSTER_TYPE_URL)
            .map_or(0, |cds| cds.removed_early)
    }

    /// When the next lingering cluster's removal falls due for `snapshot`, if one waits on
    /// nothing but time: the caller asks [`next_response`](Self::next_response) again then.
    /// `None` while a cluster response is in flight or the filter configuration is not
    /// settled: the client's next request is what moves those on.
    pub fn next_removal(&self, snapshot: Option<&Snapshot>) -> Option<Instant> {
        let snapshot = snapshot?;
        let cds = self.types.get(CLUSTER_TYPE_URL)?;
        if cds.in_flight.is_some() || !self.filters_settled(snapshot) {
            return None;
        }
        let since = cds
            .unreferenced
            .iter()
            .filter(|(name, _)| {
                cds.held.contains_key(*name) && !snapshot.clusters.contains_key(*name)
            })
            .map(|(_, since)| since)
            .min()?;
        // A linger too long to add is one that never ends by time.
        since.checked_add(self.cluster_linger)
    }

    /// The client holds the snapshot's filter configuration: it routes to no cluster the
    /// snapshot lacks.
    fn filters_settled(&self, snapshot: &Snapshot) -> bool {
        !snapshot.filter_withheld
            && self
                .types
                .get(EXTENSION_CONFIG_TYPE_URL)
                .is_none_or(|ecds| ecds.in_sync(&snapshot.extension_configs))
    }

    /// What the client holds of `type_url` (name → version), as far as this stream knows.
    pub fn held(&self, type_url: &str) -> Option<&BTreeMap<String, String>> {
        self.types.get(type_url).map(|t| &t.held)
    }

    /// Apply one request from the client.
    pub fn on_request(&mut self, request: &DeltaDiscoveryRequest) -> Received {
        let first = !self.types.contains_key(&request.type_url);
        if first && request.type_url == EXTENSION_CONFIG_TYPE_URL {
            // Until now this stream did not know the filter configuration the client holds, and
            // took it for settled: that one may still name the clusters whose time started.
            if let Some(cds) = self.types.get_mut(CLUSTER_TYPE_URL) {
                cds.unreferenced.clear();
            }
        }
        let state = self.types.entry(request.type_url.clone()).or_default();
        if first {
            state.wildcard = request.resource_names_subscribe.is_empty()
                || request
                    .resource_names_subscribe
                    .iter()
                    .any(|n| n == WILDCARD);
            state.held = request
                .initial_resource_versions
                .iter()
                .map(|(name, version)| (name.clone(), version.clone()))
                .collect();
        }
        for name in &request.resource_names_subscribe {
            if name == WILDCARD {
                state.wildcard = true;
            } else {
                state.names.insert(name.clone());
            }
        }
        for name in &request.resource_names_unsubscribe {
            if name == WILDCARD {
                state.wildcard = false;
            } else {
                state.names.remove(name);
            }
        }
        let received = if request.response_nonce.is_empty() {
            Received::Subscription
        } else {
            match state.in_flight.take() {
                Some(in_flight) if in_flight.nonce == request.response_nonce => {
                    match &request.error_detail {
                        Some(status) => {
                            state.rejected.extend(in_flight.updated.clone());
                            Received::Nack {
                                message: status.message.clone(),
                                refused: in_flight.updated,
                            }
                        }
                        None => {
                            state.held.extend(in_flight.updated);
                            for name in &in_flight.removed {
                                state.held.remove(name);
                                state.unreferenced.remove(name);
                            }
                            Received::Ack
                        }
                    }
                }
                other => {
                    state.in_flight = other;
                    Received::Stale {
                        nonce: request.response_nonce.clone(),
                    }
                }
            }
        };
        // The client forgets what it no longer subscribes to.
        let TypeState {
            held,
            rejected,
            wildcard,
            names,
            ..
        } = state;
        let wants = |name: &String| *wildcard || names.contains(name);
        held.retain(|name, _| wants(name));
        rejected.retain(|name, _| wants(name));
        received
    }

    /// The next response due at `now` for `snapshot`, if any. Call until it returns `None`
    /// after every request, every snapshot change and at [`next_removal`](Self::next_removal).
    /// With no snapshot (no complete sync yet) nothing is ever due: Envoy keeps waiting (and
    /// its listener stays closed).
    pub fn next_response(
        &mut self,
        now: Instant,
        snapshot: Option<&Snapshot>,
    ) -> Option<DeltaDiscoveryResponse> {
        let snapshot = snapshot?;
        let clusters = &snapshot.clusters;
        let filters = &snapshot.extension_configs;

        // Clusters first: additions and changes now, removals once the client holds a filter
        // configuration that no longer names them, and has held it for the linger.
        let filters_settled = self.filters_settled(snapshot);
        let linger = self.cluster_linger;
        if let Some(cds) = self.types.get_mut(CLUSTER_TYPE_URL) {
            if cds.in_flight.is_none() {
                let upserts = owned(cds.upserts(clusters));
                let removals = if filters_settled {
                    cds.due_removals(clusters, now, linger)
                } else {
                    // No time starts while the client may hold a configuration that names the
                    // cluster; one back in the snapshot loses its time.
                    cds.unreferenced
                        .retain(|name, _| !clusters.contains_key(name));
                    Vec::new()
                };
                if !upserts.is_empty() || !removals.is_empty() {
                    return Some(self.respond(CLUSTER_TYPE_URL, snapshot, upserts, removals));
                }
            }
        }

        // Then the filter configuration, once every cluster it may name is in place.
        if snapshot.filter_withheld {
            return None;
        }
        let clusters_ready = self
            .types
            .get(CLUSTER_TYPE_URL)
            .is_none_or(|cds| cds.in_flight.is_none() && cds.upserts(clusters).is_empty());
        if clusters_ready {
            if let Some(ecds) = self.types.get(EXTENSION_CONFIG_TYPE_URL) {
                if ecds.in_flight.is_none() {
                    let upserts = owned(ecds.upserts(filters));
                    let removals = ecds.removals(filters);
                    if !upserts.is_empty() || !removals.is_empty() {
                        return Some(self.respond(
                            EXTENSION_CONFIG_TYPE_URL,
                            snapshot,
                            upserts,
                            removals,
                        ));
                    }
                }
            }
        }
        None
    }

    fn respond(
        &mut self,
        type_url: &str,
        snapshot: &Snapshot,
        upserts: Vec<(String, Versioned)>,
        removed: Vec<String>,
    ) -> DeltaDiscoveryResponse {
        let nonce = format!("{}{}", self.nonce_prefix, self.next_nonce);
        self.next_nonce += 1;
        let state = self.types.entry(type_url.to_string()).or_default();
        state.in_flight = Some(InFlight {
            nonce: nonce.clone(),
            updated: upserts
                .iter()
                .map(|(name, v)| (name.clone(), v.version.clone()))
                .collect(),
            removed: removed.clone(),
        });
        DeltaDiscoveryResponse {
            system_version_info: snapshot.version(),
            type_url: type_url.to_string(),
            resources: upserts
                .into_iter()
                .map(|(name, v)| Resource {
                    name,
                    version: v.version,
                    resource: Some(v.resource),
                    ..Default::default()
                })
                .collect(),
            removed_resources: removed,
            nonce,
            ..Default::default()
        }
    }
}

fn owned(upserts: Vec<(&String, &Versioned)>) -> Vec<(String, Versioned)> {
    upserts
        .into_iter()
        .map(|(name, v)| (name.clone(), v.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use envoy_types::pb::google::protobuf::Any;
    use envoy_types::pb::google::rpc::Status;

    use super::*;

    const CDS: &str = CLUSTER_TYPE_URL;
    const ECDS: &str = EXTENSION_CONFIG_TYPE_URL;

    /// One fixed instant for every test: without a linger the time does not matter.
    fn t0() -> Instant {
        static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *T0.get_or_init(Instant::now)
    }

    /// The linger of the tests that have one.
    const LINGER: Duration = Duration::from_secs(90);

    /// Peer b, served and then gone: the snapshot naming it, and the one without it.
    fn b_then_gone() -> (Snapshot, Snapshot) {
        (
            snap(
                &[("local", "l"), ("peers-b", "b")],
                &[("skewgate", "uses b")],
            ),
            snap(&[("local", "l")], &[("skewgate", "local only")]),
        )
    }

    /// A snapshot from (cluster name, content) and (filter name, content) pairs; the content
    /// stands in for the encoded resource.
    fn snap(clusters: &[(&str, &str)], filters: &[(&str, &str)]) -> Snapshot {
        let versioned = |type_url: &str, content: &str| {
            Versioned::new(Any {
                type_url: type_url.to_string(),
                value: content.as_bytes().to_vec(),
            })
        };
        Snapshot {
            clusters: clusters
                .iter()
                .map(|(n, c)| (n.to_string(), versioned(CDS, c)))
                .collect(),
            extension_configs: filters
                .iter()
                .map(|(n, c)| (n.to_string(), versioned(ECDS, c)))
                .collect(),
            ..Default::default()
        }
    }

    /// `s` as a client whose filter cannot read its filter configuration sees it.
    fn withheld(s: &Snapshot) -> Snapshot {
        Snapshot {
            clusters: s.clusters.clone(),
            filter_withheld: true,
            ..Default::default()
        }
    }

    fn subscribe(type_url: &str, names: &[&str]) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: type_url.to_string(),
            resource_names_subscribe: names.iter().map(|n| n.to_string()).collect(),
            ..Default::default()
        }
    }

    fn reconnect(type_url: &str, names: &[&str], held: &[(&str, &str)]) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            initial_resource_versions: held
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect::<HashMap<_, _>>(),
            ..subscribe(type_url, names)
        }
    }

    fn ack(r: &DeltaDiscoveryResponse) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: r.type_url.clone(),
            response_nonce: r.nonce.clone(),
            ..Default::default()
        }
    }

    fn nack(r: &DeltaDiscoveryResponse, message: &str) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            error_detail: Some(Status {
                code: 3,
                message: message.to_string(),
                details: Vec::new(),
            }),
            ..ack(r)
        }
    }

    /// (type, sent names, removed names) of a response.
    fn shape(r: &DeltaDiscoveryResponse) -> (&str, Vec<&str>, Vec<&str>) {
        (
            r.type_url.as_str(),
            r.resources.iter().map(|x| x.name.as_str()).collect(),
            r.removed_resources.iter().map(String::as_str).collect(),
        )
    }

    fn version(s: &Snapshot, type_url: &str, name: &str) -> String {
        s.resources(type_url).expect("type")[name].version.clone()
    }

    /// A stream that subscribed CDS (wildcard) and ECDS (`skewgate`) and holds `s` fully.
    fn synced(s: &Snapshot) -> DeltaStream {
        let mut st = DeltaStream::new("t-");
        st.on_request(&subscribe(CDS, &[]));
        st.on_request(&subscribe(ECDS, &["skewgate"]));
        while let Some(r) = st.next_response(t0(), Some(s)) {
            assert_eq!(st.on_request(&ack(&r)), Received::Ack);
        }
        st
    }

    #[test]
    fn nothing_is_sent_before_the_first_snapshot() {
        let mut st = DeltaStream::new("t-");
        assert_eq!(st.on_request(&subscribe(CDS, &[])), Received::Subscription);
        assert_eq!(
            st.on_request(&subscribe(ECDS, &["skewgate"])),
            Received::Subscription
        );
        assert_eq!(st.next_response(t0(), None), None);
    }

    #[test]
    fn initial_sync_sends_clusters_then_the_filter_config() {
        let s = snap(&[("local", "l"), ("peers-b", "b")], &[("skewgate", "f1")]);
        let mut st = DeltaStream::new("t-");
        st.on_request(&subscribe(CDS, &[]));
        st.on_request(&subscribe(ECDS, &["skewgate"]));

        let r1 = st.next_response(t0(), Some(&s)).expect("clusters");
        assert_eq!(shape(&r1), (CDS, vec!["local", "peers-b"], vec![]));
        assert_eq!(r1.resources[0].version, version(&s, CDS, "local"));
        assert_eq!(
            r1.resources[0].resource,
            Some(s.clusters["local"].resource.clone())
        );
        // The filter configuration waits for the clusters' ACK.
        assert_eq!(st.next_response(t0(), Some(&s)), None);
        assert_eq!(st.on_request(&ack(&r1)), Received::Ack);

        let r2 = st.next_response(t0(), Some(&s)).expect("filter config");
        assert_eq!(shape(&r2), (ECDS, vec!["skewgate"], vec![]));
        assert_ne!(r2.nonce, r1.nonce);
        assert_eq!(
            st.next_response(t0(), Some(&s)),
            None,
            "one in flight per type"
        );
        assert_eq!(st.on_request(&ack(&r2)), Received::Ack);
        assert_eq!(st.next_response(t0(), Some(&s)), None, "in sync");
        assert_eq!(
            st.held(ECDS).expect("ecds"),
            &BTreeMap::from([("skewgate".to_string(), version(&s, ECDS, "skewgate"))])
        );
    }

    #[test]
    fn a_subscription_by_name_gets_only_that_name() {
        let s = snap(&[], &[("skewgate", "f"), ("other", "o")]);
        let mut st = DeltaStream::new("t-");
        st.on_request(&subscribe(ECDS, &["skewgate"]));
        let r = st.next_response(t0(), Some(&s)).expect("sent");
        assert_eq!(shape(&r), (ECDS, vec!["skewgate"], vec![]));
    }

    #[test]
    fn a_change_sends_only_what_changed() {
        let s1 = snap(&[("local", "l"), ("peers-b", "b")], &[("skewgate", "f1")]);
        let mut st = synced(&s1);
        let s2 = snap(&[("local", "l"), ("peers-b", "b2")], &[("skewgate", "f1")]);
        let r = st.next_response(t0(), Some(&s2)).expect("changed cluster");
        assert_eq!(shape(&r), (CDS, vec!["peers-b"], vec![]));
        st.on_request(&ack(&r));
        assert_eq!(st.next_response(t0(), Some(&s2)), None);
    }

    #[test]
    fn a_nack_keeps_the_last_good_config_and_is_not_pushed_again() {
        let s1 = snap(&[("local", "l")], &[("skewgate", "good")]);
        let mut st = synced(&s1);
        let good = version(&s1, ECDS, "skewgate");

        let s2 = snap(&[("local", "l")], &[("skewgate", "bad")]);
        let r = st.next_response(t0(), Some(&s2)).expect("pushed once");
        assert_eq!(shape(&r), (ECDS, vec!["skewgate"], vec![]));
        let received = st.on_request(&nack(&r, "undeclared cluster"));
        assert_eq!(
            received,
            Received::Nack {
                message: "undeclared cluster".into(),
                refused: BTreeMap::from([("skewgate".into(), version(&s2, ECDS, "skewgate"))]),
            }
        );
        // No loop: the same snapshot (or an equal one) never pushes the refused version again.
        for _ in 0..3 {
            assert_eq!(st.next_response(t0(), Some(&s2)), None);
            assert_eq!(st.next_response(t0(), Some(&s2.clone())), None);
        }
        assert_eq!(
            st.held(ECDS).expect("ecds")["skewgate"],
            good,
            "last good kept"
        );

        // Going back to the held version needs no push; a new version is pushed.
        assert_eq!(st.next_response(t0(), Some(&s1)), None);
        let s3 = snap(&[("local", "l")], &[("skewgate", "fixed")]);
        let r = st.next_response(t0(), Some(&s3)).expect("new version");
        assert_eq!(shape(&r), (ECDS, vec!["skewgate"], vec![]));
        assert_eq!(st.on_request(&ack(&r)), Received::Ack);
        assert_eq!(st.next_response(t0(), Some(&s3)), None);
    }

    #[test]
    fn clusters_are_added_before_and_removed_after_the_filter_config() {
        let s1 = snap(
            &[("local", "l"), ("peers-b", "b")],
            &[("skewgate", "uses b")],
        );
        let mut st = synced(&s1);
        // b is gone, c appears: add c, then the config naming c, then remove b.
        let s2 = snap(
            &[("local", "l"), ("peers-c", "c")],
            &[("skewgate", "uses c")],
        );
        let r = st.next_response(t0(), Some(&s2)).expect("add");
        assert_eq!(shape(&r), (CDS, vec!["peers-c"], vec![]));
        st.on_request(&ack(&r));
        let r = st.next_response(t0(), Some(&s2)).expect("config");
        assert_eq!(shape(&r), (ECDS, vec!["skewgate"], vec![]));
        assert_eq!(
            st.next_response(t0(), Some(&s2)),
            None,
            "b stays until the config is held"
        );
        st.on_request(&ack(&r));
        let r = st.next_response(t0(), Some(&s2)).expect("remove");
        assert_eq!(shape(&r), (CDS, vec![], vec!["peers-b"]));
        st.on_request(&ack(&r));
        assert_eq!(st.next_response(t0(), Some(&s2)), None);
        assert_eq!(
            st.held(CDS).expect("cds").keys().collect::<Vec<_>>(),
            vec!["local", "peers-c"]
        );
    }

    /// A request routed to b by the previous configuration may still retry there: b goes only
    /// after the linger, counted from the moment the client holds the configuration without
    /// it; a cluster that comes back before then stays, and loses its time.
    #[test]
    fn a_removed_cluster_lingers_after_the_config_that_dropped_it() {
        let (s1, s2) = b_then_gone();
        let mut st = synced(&s1).with_cluster_linger(LINGER);
        assert_eq!(st.next_removal(Some(&s1)), None);
        let r = st.next_response(t0(), Some(&s2)).expect("config");
        assert_eq!(shape(&r), (ECDS, vec!["skewgate"], vec![]));
        assert_eq!(
            st.next_removal(Some(&s2)),
            None,
            "the config is not held yet"
        );
        // Acknowledged 5 s later: b's time starts then.
        let acked = t0() + Duration::from_secs(5);
        st.on_request(&ack(&r));
        assert_eq!(st.next_response(acked, Some(&s2)), None, "b lingers");
        assert_eq!(st.lingering_clusters(), 1);
        assert_eq!(st.next_removal(Some(&s2)), Some(acked + LINGER));
        let almost = acked + LINGER - Duration::from_millis(1);
        assert_eq!(st.next_response(almost, Some(&s2)), None, "b still lingers");
        let r = st
            .next_response(acked + LINGER, Some(&s2))
            .expect("removal");
        assert_eq!(shape(&r), (CDS, vec![], vec!["peers-b"]));
        assert_eq!(st.lingering_clusters(), 0, "on its way out");
        assert_eq!(
            st.next_removal(Some(&s2)),
            None,
            "in flight: the ACK moves it on, not the time"
        );
        st.on_request(&ack(&r));
        assert_eq!(st.next_removal(Some(&s2)), None);
        assert_eq!(
            (st.lingering_clusters(), st.clusters_removed_early()),
            (0, 0)
        );
        assert!(!st.held(CDS).expect("cds").contains_key("peers-b"));

        // c leaves, comes back within its linger, leaves again: its time starts afresh.
        let s3 = snap(
            &[("local", "l"), ("peers-c", "c")],
            &[("skewgate", "uses c")],
        );
        let mut st = synced(&s3).with_cluster_linger(LINGER);
        let s4 = snap(&[("local", "l")], &[("skewgate", "local only")]);
        let r = st.next_response(t0(), Some(&s4)).expect("config");
        st.on_request(&ack(&r));
        assert_eq!(st.next_response(t0(), Some(&s4)), None);
        let back = t0() + Duration::from_secs(60);
        let r = st.next_response(back, Some(&s3)).expect("config naming c");
        assert_eq!(shape(&r), (ECDS, vec!["skewgate"], vec![]));
        assert_eq!(
            st.next_removal(Some(&s3)),
            None,
            "c is in the snapshot again"
        );
        st.on_request(&ack(&r));
        let left = t0() + Duration::from_secs(70);
        let r = st.next_response(left, Some(&s4)).expect("config");
        st.on_request(&ack(&r));
        assert_eq!(st.next_response(left, Some(&s4)), None);
        assert_eq!(
            st.next_response(t0() + LINGER, Some(&s4)),
            None,
            "the first departure's time no longer counts"
        );
        let r = st.next_response(left + LINGER, Some(&s4)).expect("removal");
        assert_eq!(shape(&r), (CDS, vec![], vec!["peers-c"]));
    }

    /// A reconnecting client reports clusters before its filter configuration: a cluster the
    /// snapshot lacks does not start its time until the stream knows that configuration, and
    /// the client holds the snapshot's.
    #[test]
    fn a_reconnecting_clients_old_config_holds_the_linger_back() {
        let (s1, s2) = b_then_gone();
        let mut st = DeltaStream::new("t-").with_cluster_linger(LINGER);
        let cds_b = version(&s1, CDS, "peers-b");
        let cds_l = version(&s1, CDS, "local");
        st.on_request(&reconnect(
            CDS,
            &[],
            &[("local", &cds_l), ("peers-b", &cds_b)],
        ));
        // Only CDS known yet: b's time would start here.
        assert_eq!(st.next_response(t0(), Some(&s2)), None);
        let ecds_old = version(&s1, ECDS, "skewgate");
        st.on_request(&reconnect(ECDS, &["skewgate"], &[("skewgate", &ecds_old)]));
        let later = t0() + LINGER;
        let r = st.next_response(later, Some(&s2)).expect("config");
        assert_eq!(shape(&r), (ECDS, vec!["skewgate"], vec![]));
        st.on_request(&ack(&r));
        assert_eq!(
            st.next_response(later, Some(&s2)),
            None,
            "b's time starts only now"
        );
        assert_eq!(st.next_removal(Some(&s2)), Some(later + LINGER));
    }

    /// However fast peer sets come and go, at most [`MAX_LINGERING_CLUSTERS`] linger: past
    /// that, the ones removed longest ago go at once.
    #[test]
    fn lingering_clusters_are_bounded() {
        let many = MAX_LINGERING_CLUSTERS + 5;
        let names: Vec<String> = (0..many).map(|i| format!("peers-{i:04}")).collect();
        let with_all: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "p")).collect();
        let s1 = snap(&with_all, &[("skewgate", "uses all")]);
        let mut st = synced(&s1).with_cluster_linger(LINGER);
        // They leave one snapshot at a time, 100 ms apart: none lingers its whole time here.
        let mut now = t0();
        let mut removed = Vec::new();
        for i in 0..many {
            let rest: Vec<(&str, &str)> = with_all[i + 1..].to_vec();
            let s = snap(&rest, &[("skewgate", &format!("without {i}"))]);
            while let Some(r) = st.next_response(now, Some(&s)) {
                removed.extend(r.removed_resources.clone());
                st.on_request(&ack(&r));
            }
            now += Duration::from_millis(100);
        }
        assert_eq!(
            removed,
            names[..5].to_vec(),
            "the five that left first went early, oldest first"
        );
        assert_eq!(st.clusters_removed_early(), 5);
        assert_eq!(st.lingering_clusters(), MAX_LINGERING_CLUSTERS);
    }

    /// After a response that is not due, the stream never asks to be woken in the past: a
    /// NACKed or withheld filter configuration and a cluster response in flight wait for the
    /// client, not for the time.
    #[test]
    fn a_removal_never_falls_due_while_it_cannot_be_sent() {
        let (s1, s2) = b_then_gone();
        let s3 = snap(&[("local", "l")], &[("skewgate", "refused")]);
        let mut st = synced(&s1).with_cluster_linger(LINGER);
        let r = st.next_response(t0(), Some(&s2)).expect("config");
        st.on_request(&ack(&r));
        assert_eq!(st.next_response(t0(), Some(&s2)), None);
        // A refused configuration: unsettled, whatever the time.
        let r = st.next_response(t0(), Some(&s3)).expect("config");
        st.on_request(&nack(&r, "no"));
        let late = t0() + LINGER * 2;
        assert_eq!(st.next_response(late, Some(&s3)), None);
        assert_eq!(st.next_removal(Some(&s3)), None);
        // Withheld: likewise.
        assert_eq!(st.next_response(late, Some(&withheld(&s2))), None);
        assert_eq!(st.next_removal(Some(&withheld(&s2))), None);
        // Settled again: due at once, then in flight until the ACK.
        let r = st.next_response(late, Some(&s2)).expect("removal");
        assert_eq!(shape(&r), (CDS, vec![], vec!["peers-b"]));
        assert_eq!(st.next_response(late, Some(&s2)), None);
        assert_eq!(st.next_removal(Some(&s2)), None);
    }

    #[test]
    fn clusters_the_last_good_config_names_stay_after_a_nack() {
        let s1 = snap(
            &[("local", "l"), ("peers-b", "b")],
            &[("skewgate", "uses b")],
        );
        let mut st = synced(&s1);
        let s2 = snap(&[("local", "l")], &[("skewgate", "refused")]);
        let r = st.next_response(t0(), Some(&s2)).expect("config");
        assert_eq!(shape(&r), (ECDS, vec!["skewgate"], vec![]));
        assert!(matches!(
            st.on_request(&nack(&r, "no")),
            Received::Nack { .. }
        ));
        assert_eq!(
            st.next_response(t0(), Some(&s2)),
            None,
            "peers-b is not removed"
        );
        assert!(st.held(CDS).expect("cds").contains_key("peers-b"));
    }

    #[test]
    fn a_reconnecting_client_gets_only_what_it_lacks() {
        let s = snap(&[("local", "l"), ("peers-b", "b")], &[("skewgate", "f")]);
        let current = |t, n| version(&s, t, n);

        // Holds everything: nothing to send.
        let mut st = DeltaStream::new("t-");
        st.on_request(&reconnect(
            CDS,
            &["*"],
            &[
                ("local", &current(CDS, "local")),
                ("peers-b", &current(CDS, "peers-b")),
            ],
        ));
        st.on_request(&reconnect(
            ECDS,
            &["skewgate"],
            &[("skewgate", &current(ECDS, "skewgate"))],
        ));
        assert_eq!(st.next_response(t0(), Some(&s)), None);

        // Holds an old cluster version and a cluster that is gone: send one, then the
        // (unchanged) config needs nothing, then remove the old one.
        let mut st = DeltaStream::new("t-");
        st.on_request(&reconnect(
            CDS,
            &[],
            &[
                ("local", &current(CDS, "local")),
                ("peers-b", "old"),
                ("peers-gone", "x"),
            ],
        ));
        st.on_request(&reconnect(
            ECDS,
            &["skewgate"],
            &[("skewgate", &current(ECDS, "skewgate"))],
        ));
        let r = st
            .next_response(t0(), Some(&s))
            .expect("update and removal");
        assert_eq!(shape(&r), (CDS, vec!["peers-b"], vec!["peers-gone"]));
        st.on_request(&ack(&r));
        assert_eq!(st.next_response(t0(), Some(&s)), None);
    }

    #[test]
    fn stale_nonces_and_unsubscribes() {
        let s = snap(&[("local", "l")], &[("skewgate", "f")]);
        let mut st = synced(&s);
        let stale = DeltaDiscoveryRequest {
            type_url: ECDS.into(),
            response_nonce: "t-1".into(),
            ..Default::default()
        };
        assert_eq!(
            st.on_request(&stale),
            Received::Stale {
                nonce: "t-1".into()
            }
        );
        assert_eq!(st.next_response(t0(), Some(&s)), None);

        let unsubscribe = DeltaDiscoveryRequest {
            type_url: ECDS.into(),
            resource_names_unsubscribe: vec!["skewgate".into()],
            ..Default::default()
        };
        st.on_request(&unsubscribe);
        assert!(st.held(ECDS).expect("ecds").is_empty());
        let s2 = snap(&[("local", "l")], &[("skewgate", "f2")]);
        assert_eq!(st.next_response(t0(), Some(&s2)), None, "not subscribed");
        st.on_request(&subscribe(ECDS, &["skewgate"]));
        let r = st.next_response(t0(), Some(&s2)).expect("subscribed again");
        assert_eq!(shape(&r), (ECDS, vec!["skewgate"], vec![]));
    }

    #[test]
    fn a_withheld_filter_configuration_is_neither_sent_nor_removed() {
        // A client that connects for the first time: its clusters, no filter configuration.
        let s1 = snap(
            &[("local", "l"), ("peers-b", "b")],
            &[("skewgate", "uses b")],
        );
        let mut st = DeltaStream::new("t-");
        st.on_request(&subscribe(CDS, &[]));
        st.on_request(&subscribe(ECDS, &["skewgate"]));
        let r = st
            .next_response(t0(), Some(&withheld(&s1)))
            .expect("clusters");
        assert_eq!(shape(&r), (CDS, vec!["local", "peers-b"], vec![]));
        st.on_request(&ack(&r));
        assert_eq!(st.next_response(t0(), Some(&withheld(&s1))), None);
        assert!(st.held(ECDS).expect("ecds").is_empty());

        // A client that holds a filter configuration (from before, or its reconnect): it keeps
        // it, and the clusters it may name, while new and changed clusters still go out.
        let mut st = synced(&s1);
        let held = st.held(ECDS).expect("ecds").clone();
        let s2 = snap(
            &[("local", "l2"), ("peers-c", "c")],
            &[("skewgate", "uses c")],
        );
        let r = st
            .next_response(t0(), Some(&withheld(&s2)))
            .expect("clusters");
        assert_eq!(shape(&r), (CDS, vec!["local", "peers-c"], vec![]));
        st.on_request(&ack(&r));
        for _ in 0..3 {
            assert_eq!(
                st.next_response(t0(), Some(&withheld(&s2))),
                None,
                "peers-b stays, the filter configuration is not removed"
            );
        }
        assert_eq!(st.held(ECDS).expect("ecds"), &held);
        assert!(st.held(CDS).expect("cds").contains_key("peers-b"));

        // Once it can be sent again (a snapshot the filter reads), it goes as usual.
        let r = st.next_response(t0(), Some(&s2)).expect("config");
        assert_eq!(shape(&r), (ECDS, vec!["skewgate"], vec![]));
        st.on_request(&ack(&r));
        let r = st.next_response(t0(), Some(&s2)).expect("removal");
        assert_eq!(shape(&r), (CDS, vec![], vec!["peers-b"]));
    }
}
