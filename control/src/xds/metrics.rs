//! Counters of the xDS server, kept as atomics and listed as metric families when scraped.
//!
//! - `skewgate_xds_nacks_total{type_url}`: responses Envoy refused. Each refused version is
//!   counted once: it is never pushed again (the next push comes with the next snapshot).
//! - `skewgate_xds_acks_total{type_url}`: responses Envoy accepted.
//! - `skewgate_xds_responses_total{type_url}`: responses sent.
//! - `skewgate_xds_last_push_timestamp_seconds{type_url}`, `..._last_ack_...`: when the last
//!   response was sent and accepted; `skewgate_xds_push_age_seconds{type_url}`: how long ago
//!   the last one was sent.
//! - `skewgate_xds_streams`: ADS streams open now.
//! - `skewgate_xds_incompatible_filter_streams`: open streams whose filter reads none of the
//!   schemas the filter configuration can be written in, so it is sent nothing
//!   (docs/ARCHITECTURE.md, "skewgate's own upgrades"); `skewgate_xds_incompatible_filter_total`:
//!   how many times a stream started withholding it.
//!
//! - `skewgate_xds_lingering_clusters`: clusters the snapshot no longer has that Envoys still
//!   hold for their linger (a retry of a request routed there before may still need them);
//!   `skewgate_xds_clusters_removed_early_total`: clusters removed before their linger was over
//!   because too many lingered on one stream.
//!
//! Besides the counters, what each open stream's filter reads, how it gets its configuration
//! and how long its removed clusters linger ([`EnvoyStream`]), for `/readyz` and `/debug/skew`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use serde::Serialize;
use skewgate_core::config::FilterFeature;

use super::snapshot::FilterDelivery;
use crate::envoy::dialect::{Advertised, Negotiated};
use crate::metrics::{unix_seconds, Families};

/// The longest node id shown (Envoy's node id is the bootstrap's, but it comes over a socket).
const MAX_NODE_ID: usize = 253;

/// One open ADS stream as `/debug/skew` shows it: the Envoy behind it, what its filter reads,
/// how it gets its configuration, and the clusters it keeps after they left the snapshot.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EnvoyStream {
    pub stream: u64,
    /// Envoy's node id, printable ASCII only, at most 253 characters.
    pub node: String,
    /// `advertised`, `nothing` (a filter of the release before dialects were advertised), or
    /// `malformed: <why>` (read as nothing).
    pub advertised: String,
    pub schemas: Vec<u32>,
    pub features: Vec<&'static str>,
    /// `as rendered`, `without <features>`, or `withheld: <why>`; empty before the first
    /// snapshot.
    pub delivery: String,
    pub withheld: bool,
    /// How long a cluster this stream removes stays first (the node's route timeout decides).
    pub cluster_linger_seconds: f64,
    /// Clusters the snapshot no longer has that this Envoy holds for their linger now.
    pub lingering_clusters: usize,
    /// Clusters removed from this Envoy before their linger was over (too many lingered).
    pub clusters_removed_early: u64,
}

impl EnvoyStream {
    fn new(stream: u64, node: &str, negotiated: &Negotiated) -> Self {
        EnvoyStream {
            stream,
            node: node
                .chars()
                .take(MAX_NODE_ID)
                .map(|c| if c.is_ascii_graphic() { c } else { '?' })
                .collect(),
            advertised: match &negotiated.advertised {
                Advertised::Yes => "advertised".to_string(),
                Advertised::Nothing => "nothing".to_string(),
                Advertised::Malformed(why) => format!("malformed: {why}"),
            },
            schemas: negotiated.dialect.schemas.iter().copied().collect(),
            features: negotiated
                .dialect
                .features
                .iter()
                .map(|f| f.name())
                .collect(),
            delivery: String::new(),
            withheld: false,
            cluster_linger_seconds: 0.0,
            lingering_clusters: 0,
            clusters_removed_early: 0,
        }
    }
}

use super::{CLUSTER_TYPE_URL, EXTENSION_CONFIG_TYPE_URL};

/// The type URLs the counters are kept for, in exposition order.
const TYPE_URLS: [&str; 2] = [CLUSTER_TYPE_URL, EXTENSION_CONFIG_TYPE_URL];

#[derive(Debug, Default)]
struct PerType {
    nacks: AtomicU64,
    acks: AtomicU64,
    responses: AtomicU64,
    last_push: Mutex<Option<SystemTime>>,
    last_ack: Mutex<Option<SystemTime>>,
}

/// The server's counters; share one `Arc<XdsMetrics>` between the server and `/metrics`.
#[derive(Debug, Default)]
pub struct XdsMetrics {
    per_type: [PerType; 2],
    streams: AtomicI64,
    last_nack: Mutex<Option<(String, String)>>,
    incompatible_total: AtomicU64,
    /// Clusters removed before their linger was over, on every stream since start.
    removed_early_total: AtomicU64,
    /// By stream id; only open streams that sent their first request.
    streams_by_id: Mutex<BTreeMap<u64, EnvoyStream>>,
    /// Streams opened since start (an Envoy that reconnects opens a new one).
    opened: AtomicU64,
    /// The `--goaway-chance` the latest stream's bootstrap configured (its node metadata).
    goaway_chance: Mutex<Option<crate::envoy::goaway::GoawayChance>>,
}

impl XdsMetrics {
    pub fn new() -> Self {
        Self::default()
    }

    fn slot(&self, type_url: &str) -> Option<&PerType> {
        TYPE_URLS
            .iter()
            .position(|t| *t == type_url)
            .map(|i| &self.per_type[i])
    }

    pub(crate) fn nacked(&self, type_url: &str, message: &str) {
        if let Some(slot) = self.slot(type_url) {
            slot.nacks.fetch_add(1, Ordering::Relaxed);
        }
        if let Ok(mut last) = self.last_nack.lock() {
            *last = Some((type_url.to_string(), message.to_string()));
        }
    }

    pub(crate) fn sent(&self, type_url: &str) {
        if let Some(slot) = self.slot(type_url) {
            slot.responses.fetch_add(1, Ordering::Relaxed);
            if let Ok(mut t) = slot.last_push.lock() {
                *t = Some(SystemTime::now());
            }
        }
    }

    pub(crate) fn acked(&self, type_url: &str) {
        if let Some(slot) = self.slot(type_url) {
            slot.acks.fetch_add(1, Ordering::Relaxed);
            if let Ok(mut t) = slot.last_ack.lock() {
                *t = Some(SystemTime::now());
            }
        }
    }

    pub(crate) fn stream_opened(&self) {
        self.streams.fetch_add(1, Ordering::Relaxed);
        self.opened.fetch_add(1, Ordering::Relaxed);
    }

    /// Streams opened since start.
    pub fn streams_opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    /// A stream's node said which `--goaway-chance` its bootstrap configured.
    pub(crate) fn goaway_chance_configured(&self, chance: crate::envoy::goaway::GoawayChance) {
        if let Ok(mut c) = self.goaway_chance.lock() {
            *c = Some(chance);
        }
    }

    /// The `--goaway-chance` of the latest Envoy that said one.
    pub fn goaway_chance(&self) -> Option<crate::envoy::goaway::GoawayChance> {
        self.goaway_chance.lock().ok().and_then(|c| *c)
    }

    pub(crate) fn stream_closed(&self, stream: u64) {
        self.streams.fetch_sub(1, Ordering::Relaxed);
        if let Ok(mut streams) = self.streams_by_id.lock() {
            streams.remove(&stream);
        }
    }

    /// A stream's first request said what its filter reads.
    pub(crate) fn negotiated(&self, stream: u64, node: &str, negotiated: &Negotiated) {
        if let Ok(mut streams) = self.streams_by_id.lock() {
            streams.insert(stream, EnvoyStream::new(stream, node, negotiated));
        }
    }

    /// How a stream's filter gets the current snapshot's configuration (called when that
    /// changes). Counts a stream that starts withholding it.
    pub(crate) fn delivery(&self, stream: u64, delivery: &FilterDelivery) {
        let Ok(mut streams) = self.streams_by_id.lock() else {
            return;
        };
        let Some(filter) = streams.get_mut(&stream) else {
            return;
        };
        let withheld = matches!(delivery, FilterDelivery::Withheld(_));
        if withheld && !filter.withheld {
            self.incompatible_total.fetch_add(1, Ordering::Relaxed);
        }
        filter.withheld = withheld;
        filter.delivery = match delivery {
            FilterDelivery::AsRendered => "as rendered".to_string(),
            FilterDelivery::Without(features) => format!(
                "without {}",
                features
                    .iter()
                    .map(|f: &FilterFeature| f.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            FilterDelivery::Withheld(why) => format!("withheld: {why}"),
        };
    }

    /// A stream's removed clusters: how long they linger, how many do now, and how many it
    /// removed early so far (a running total: only its growth is counted). Returns that
    /// growth.
    pub(crate) fn clusters_kept(
        &self,
        stream: u64,
        linger: Duration,
        lingering: usize,
        removed_early: u64,
    ) -> u64 {
        let Ok(mut streams) = self.streams_by_id.lock() else {
            return 0;
        };
        let Some(s) = streams.get_mut(&stream) else {
            return 0;
        };
        let grown = removed_early.saturating_sub(s.clusters_removed_early);
        self.removed_early_total.fetch_add(grown, Ordering::Relaxed);
        s.cluster_linger_seconds = linger.as_secs_f64();
        s.lingering_clusters = lingering;
        s.clusters_removed_early = removed_early;
        grown
    }

    /// `f` of the open streams (nothing, if the lock was poisoned).
    fn over_streams<T: Default>(
        &self,
        f: impl FnOnce(std::collections::btree_map::Values<'_, u64, EnvoyStream>) -> T,
    ) -> T {
        self.streams_by_id
            .lock()
            .map(|streams| f(streams.values()))
            .unwrap_or_default()
    }

    /// `skewgate_xds_lingering_clusters`: summed over the open streams.
    pub fn lingering_clusters(&self) -> usize {
        self.over_streams(|s| s.map(|s| s.lingering_clusters).sum())
    }

    /// `skewgate_xds_clusters_removed_early_total`.
    pub fn clusters_removed_early(&self) -> u64 {
        self.removed_early_total.load(Ordering::Relaxed)
    }

    /// Every open stream: its Envoy, what its filter reads, how it gets its configuration.
    pub fn envoy_streams(&self) -> Vec<EnvoyStream> {
        self.over_streams(|s| s.cloned().collect())
    }

    /// Open streams whose filter configuration is withheld.
    pub fn incompatible_streams(&self) -> usize {
        self.over_streams(|s| s.filter(|s| s.withheld).count())
    }

    /// `skewgate_xds_incompatible_filter_total`.
    pub fn incompatible_total(&self) -> u64 {
        self.incompatible_total.load(Ordering::Relaxed)
    }

    /// A line for `/readyz` per stream whose filter configuration is withheld.
    pub fn readiness_notes(&self) -> Vec<String> {
        self.envoy_streams()
            .into_iter()
            .filter(|s| s.withheld)
            .map(|s| {
                format!(
                    "Envoy {} (ADS stream {}): no filter configuration sent, it keeps what it holds: {}",
                    s.node, s.stream, s.delivery
                )
            })
            .collect()
    }

    /// `skewgate_xds_nacks_total{type_url}`.
    pub fn nacks(&self, type_url: &str) -> u64 {
        self.slot(type_url)
            .map_or(0, |s| s.nacks.load(Ordering::Relaxed))
    }

    /// `skewgate_xds_responses_total{type_url}`.
    pub fn responses(&self, type_url: &str) -> u64 {
        self.slot(type_url)
            .map_or(0, |s| s.responses.load(Ordering::Relaxed))
    }

    /// ADS streams open now.
    pub fn streams(&self) -> i64 {
        self.streams.load(Ordering::Relaxed)
    }

    /// The type URL and Envoy's message of the latest NACK.
    pub fn last_nack(&self) -> Option<(String, String)> {
        self.last_nack.lock().ok().and_then(|l| l.clone())
    }

    /// These metrics, for `/metrics`.
    pub fn families(&self) -> Families {
        let now = SystemTime::now();
        let per_type = |f: &dyn Fn(&PerType) -> Option<f64>| {
            TYPE_URLS
                .iter()
                .zip(&self.per_type)
                .filter_map(|(t, slot)| Some(([*t], f(slot)?)))
                .collect::<Vec<_>>()
        };
        let count = |f: fn(&PerType) -> &AtomicU64| {
            TYPE_URLS
                .iter()
                .zip(&self.per_type)
                .map(|(t, slot)| ([*t], f(slot).load(Ordering::Relaxed)))
                .collect::<Vec<_>>()
        };
        let time = |m: &Mutex<Option<SystemTime>>| m.lock().ok().and_then(|t| *t);
        let mut f = Families::new();
        f.counters(
            "skewgate_xds_nacks_total",
            "xDS responses Envoy refused (NACKed).",
            &["type_url"],
            count(|s| &s.nacks),
        );
        f.counters(
            "skewgate_xds_acks_total",
            "xDS responses Envoy accepted (ACKed).",
            &["type_url"],
            count(|s| &s.acks),
        );
        f.counters(
            "skewgate_xds_responses_total",
            "xDS responses sent.",
            &["type_url"],
            count(|s| &s.responses),
        );
        f.gauges(
            "skewgate_xds_last_push_timestamp_seconds",
            "When the last xDS response of this type was sent.",
            &["type_url"],
            per_type(&|s| time(&s.last_push).map(unix_seconds)),
        );
        f.gauges(
            "skewgate_xds_last_ack_timestamp_seconds",
            "When Envoy last accepted an xDS response of this type.",
            &["type_url"],
            per_type(&|s| time(&s.last_ack).map(unix_seconds)),
        );
        f.gauges(
            "skewgate_xds_push_age_seconds",
            "Seconds since the last xDS response of this type was sent.",
            &["type_url"],
            per_type(&|s| {
                let t = time(&s.last_push)?;
                Some(now.duration_since(t).unwrap_or_default().as_secs_f64())
            }),
        );
        f.gauge(
            "skewgate_xds_streams",
            "ADS streams open.",
            self.streams() as f64,
        );
        f.gauge(
            "skewgate_xds_incompatible_filter_streams",
            "ADS streams whose filter reads none of the schemas the filter configuration can be written in: they are sent no filter configuration.",
            self.incompatible_streams() as f64,
        );
        f.counter(
            "skewgate_xds_incompatible_filter_total",
            "Times an ADS stream started withholding the filter configuration from a filter that cannot read it.",
            self.incompatible_total(),
        );
        f.gauge(
            "skewgate_xds_lingering_clusters",
            "Clusters the snapshot no longer has that Envoys still hold for their linger (a retry of a request routed there before may need them).",
            self.lingering_clusters() as f64,
        );
        f.counter(
            "skewgate_xds_clusters_removed_early_total",
            "Clusters removed from an Envoy before their linger was over, because too many lingered on its stream.",
            self.clusters_removed_early(),
        );
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_type_and_renders() {
        let m = XdsMetrics::new();
        m.nacked(EXTENSION_CONFIG_TYPE_URL, "bad config");
        m.sent(CLUSTER_TYPE_URL);
        m.sent(CLUSTER_TYPE_URL);
        m.nacked("type.googleapis.com/unknown", "ignored in counters");
        m.acked(CLUSTER_TYPE_URL);
        assert_eq!(m.nacks(EXTENSION_CONFIG_TYPE_URL), 1);
        assert_eq!(m.nacks(CLUSTER_TYPE_URL), 0);
        assert_eq!(m.responses(CLUSTER_TYPE_URL), 2);
        let text = crate::metrics::encode(&m.families());
        assert!(text.contains(&format!(
            "skewgate_xds_nacks_total{{type_url=\"{EXTENSION_CONFIG_TYPE_URL}\"}} 1\n"
        )));
        assert!(text.contains(&format!(
            "skewgate_xds_responses_total{{type_url=\"{CLUSTER_TYPE_URL}\"}} 2\n"
        )));
        assert!(text.contains(&format!(
            "skewgate_xds_acks_total{{type_url=\"{CLUSTER_TYPE_URL}\"}} 1\n"
        )));
        assert!(text.contains(&format!(
            "skewgate_xds_push_age_seconds{{type_url=\"{CLUSTER_TYPE_URL}\"}} "
        )));
        assert!(!text.contains(&format!(
            "skewgate_xds_push_age_seconds{{type_url=\"{EXTENSION_CONFIG_TYPE_URL}\"}}"
        )));
    }

    #[test]
    fn a_withheld_filter_configuration_is_counted_once_and_shown_per_stream() {
        use std::collections::BTreeSet;

        use skewgate_core::config::{FilterDialect, Unreadable};

        let m = XdsMetrics::new();
        let later = Negotiated {
            dialect: FilterDialect {
                schemas: BTreeSet::from([7]),
                features: BTreeSet::new(),
            },
            advertised: Advertised::Yes,
        };
        let withheld = FilterDelivery::Withheld(Unreadable {
            filter_reads: BTreeSet::from([7]),
            written_in: BTreeSet::from([1]),
        });
        m.stream_opened();
        m.stream_opened();
        m.negotiated(1, "envoy-a\n<b>", &later);
        m.negotiated(
            2,
            "envoy-b",
            &Negotiated {
                dialect: FilterDialect::unadvertised(),
                advertised: Advertised::Nothing,
            },
        );
        m.delivery(2, &FilterDelivery::AsRendered);
        for _ in 0..3 {
            m.delivery(1, &withheld);
        }
        assert_eq!((m.incompatible_streams(), m.incompatible_total()), (1, 1));
        let text = crate::metrics::encode(&m.families());
        assert!(
            text.contains("skewgate_xds_incompatible_filter_streams 1\n"),
            "{text}"
        );
        assert!(
            text.contains("skewgate_xds_incompatible_filter_total 1\n"),
            "{text}"
        );
        let notes = m.readiness_notes();
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].starts_with("Envoy envoy-a?<b> (ADS stream 1): no filter configuration sent"),
            "{notes:?}"
        );
        assert!(notes[0].contains("schemas {7}"), "{notes:?}");
        let shown = m.envoy_streams();
        assert_eq!(shown.len(), 2);
        assert_eq!(shown[1].advertised, "nothing");
        assert_eq!(shown[1].delivery, "as rendered");
        assert_eq!(shown[1].schemas, [1]);

        // Readable again (a newer snapshot), then gone: the gauge follows, the count stays.
        m.delivery(1, &FilterDelivery::AsRendered);
        assert_eq!((m.incompatible_streams(), m.incompatible_total()), (0, 1));
        m.delivery(1, &withheld);
        assert_eq!((m.incompatible_streams(), m.incompatible_total()), (1, 2));
        m.stream_closed(1);
        m.stream_closed(2);
        assert_eq!((m.incompatible_streams(), m.streams()), (0, 0));
        assert!(m.envoy_streams().is_empty());
        assert!(m.readiness_notes().is_empty());
    }

    /// The gauge sums the open streams' lingering clusters; the counter counts each early
    /// removal once, however often a stream reports its running total, and keeps it after the
    /// stream closes.
    #[test]
    fn lingering_clusters_are_summed_and_early_removals_counted_once() {
        let m = XdsMetrics::new();
        let negotiated = Negotiated {
            dialect: skewgate_core::config::FilterDialect::unadvertised(),
            advertised: Advertised::Nothing,
        };
        m.negotiated(1, "envoy-a", &negotiated);
        m.negotiated(2, "envoy-b", &negotiated);
        let linger = Duration::from_secs(90);
        let later = Duration::from_millis(310_500);
        assert_eq!(m.clusters_kept(1, linger, 3, 0), 0);
        assert_eq!(m.clusters_kept(2, later, 300, 4), 4);
        assert_eq!(m.clusters_kept(2, later, 300, 4), 0, "the same total again");
        assert_eq!(m.clusters_kept(2, later, 298, 6), 2);
        // A stream that never said what it reads is not shown, and counts nothing.
        assert_eq!(m.clusters_kept(9, linger, 50, 50), 0);
        assert_eq!(
            (m.lingering_clusters(), m.clusters_removed_early()),
            (301, 6)
        );
        let shown = m.envoy_streams();
        assert_eq!(shown[1].cluster_linger_seconds, 310.5);
        assert_eq!(
            (shown[1].lingering_clusters, shown[1].clusters_removed_early),
            (298, 6)
        );
        let text = crate::metrics::encode(&m.families());
        assert!(
            text.contains("skewgate_xds_lingering_clusters 301\n"),
            "{text}"
        );
        assert!(
            text.contains("skewgate_xds_clusters_removed_early_total 6\n"),
            "{text}"
        );
        m.stream_closed(2);
        assert_eq!((m.lingering_clusters(), m.clusters_removed_early()), (3, 6));
    }
}
