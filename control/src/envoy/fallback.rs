//! What Envoy serves when its control plane is missing at start (docs/ARCHITECTURE.md,
//! "Control plane missing at start"): rendered into the live bootstrap by
//! `skewgate-control bootstrap`, so that it needs nothing from the control plane.
//!
//! Envoy waits for the first clusters (CDS) and then for the first filter configuration (ECDS);
//! the two waits run one after the other (measured on Envoy 1.40), so [`Waits::split`] divides
//! the one bound (`--control-plane-wait`) between them. When the ECDS wait expires, Envoy opens
//! its listeners with the filter's ECDS `default_config`: the local-only configuration
//! ([`local_only_config`]), which routes every request to static clusters of the local
//! apiserver in the bootstrap ([`static_clusters`], named [`FALLBACK_LOCAL_CLUSTER`]`-*`: CDS
//! does not replace a static cluster of the same name, so the live `skewgate-local-*` clusters
//! stay CDS's). The control plane's first filter configuration replaces it as usual.
//!
//! Better than local-only is what the control plane last saw Envoy acknowledge: `run
//! --state-dir` keeps it ([`AcknowledgedConfig`], written by the xDS server when Envoy has
//! ACKed a whole snapshot), and `bootstrap --state-dir` renders it instead
//! ([`last_acknowledged_config`]): its peer clusters as static copies named
//! [`FALLBACK_PREFIX`]`<name>-*`, its filter configuration renamed to them. A missing or
//! unreadable record falls back to local-only.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use skewgate_core::config::{
    Fallback, FallbackMode, FilterConfig, FilterFeature, UpstreamAuth, FALLBACK_LOCAL_CLUSTER,
    SCHEMA_VERSION,
};

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::google::protobuf::Any;

use super::resources::{
    cluster, failover_cluster, filter_extension_config, variants, FilterCode, Role,
};
use super::{Address, EnvoyError};
use crate::routing::peer_cluster_name;

/// What the fallback needs: the filter's code and the local apiserver, as the control plane
/// would give them (`run --wasm`, `--local-apiserver-url`, `--sds-dir`).
#[derive(Debug, Clone, Copy)]
pub struct FallbackInputs<'a> {
    /// The whole bound: CDS and ECDS together wait at most this long (see [`Waits::split`]).
    pub wait: Duration,
    /// The filter's code as Envoy sees it (`run --data-plane` and its path).
    pub filter_code: &'a FilterCode,
    /// The apiserver this Envoy fronts.
    pub local: &'a Address,
    /// The directory of the SDS files of the peer CA and the proxy-client certificate;
    /// `None`: plaintext (tests on loopback only).
    pub upstream_sds: Option<&'a Path>,
    /// For the filter's logs (`FilterConfig::local_apiserver`).
    pub local_apiserver: &'a str,
    /// What the control plane last saw acknowledged (`bootstrap --state-dir`); `None`:
    /// local-only.
    pub acknowledged: Option<&'a AcknowledgedConfig>,
}

/// A snapshot as the fallback needs it: the filter configuration the control plane sent, and
/// the addresses behind each of its peer clusters (the local apiserver's come from the flags).
///
/// Written by `run` (the control plane's image) and read by `bootstrap` (Envoy's image), which
/// may be a release apart (docs/ARCHITECTURE.md, "skewgate's own upgrades"). So the record
/// itself tolerates fields it does not know: a newer `run` adding one never makes an older
/// `bootstrap` fall back to local-only. Its `filter_config` is what Envoy's filter
/// acknowledged, in the dialect that filter reads, and stays strict: the reader checks it with
/// its own filter's rules ([`check_record`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcknowledgedConfig {
    pub filter_config: FilterConfig,
    /// Peer cluster base name → `host:port` of each apiserver behind it.
    pub peer_clusters: BTreeMap<String, Vec<String>>,
}

/// The file in `--state-dir` that holds the last [`AcknowledgedConfig`].
pub const ACKNOWLEDGED_FILE: &str = "last-acknowledged.json";

/// What the fallback's static copies of peer clusters are named: this, then the live name.
pub const FALLBACK_PREFIX: &str = "skewgate-fallback-";

/// Largest record `bootstrap` reads: the filter configuration is capped at
/// [`MAX_CONFIG_BYTES`](skewgate_core::config::MAX_CONFIG_BYTES), plus room for the peer
/// addresses.
const MAX_ACKNOWLEDGED_BYTES: u64 = skewgate_core::config::MAX_CONFIG_BYTES as u64 + 1024 * 1024;

/// Keep `config` as the last acknowledged one in `dir` (atomically: a reader sees the old
/// record or the new one).
pub fn write_acknowledged(dir: &Path, config: &AcknowledgedConfig) -> std::io::Result<()> {
    let json = serde_json::to_vec(config).map_err(std::io::Error::other)?;
    crate::state_file::write(dir, ACKNOWLEDGED_FILE, &json).map_err(std::io::Error::other)
}

/// The last acknowledged configuration kept in `dir`: `Ok(None)` when there is none, an error
/// when it is there but unusable (too large, not JSON, or failing [`check_record`]).
pub fn read_acknowledged(dir: &Path) -> Result<Option<AcknowledgedConfig>, String> {
    let path = dir.join(ACKNOWLEDGED_FILE);
    let file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(file, MAX_ACKNOWLEDGED_BYTES + 1),
        &mut bytes,
    )
    .map_err(|e| format!("{}: {e}", path.display()))?;
    if bytes.len() as u64 > MAX_ACKNOWLEDGED_BYTES {
        return Err(format!(
            "{}: larger than {MAX_ACKNOWLEDGED_BYTES} bytes",
            path.display()
        ));
    }
    let record: AcknowledgedConfig =
        serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    check_record(&record).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(Some(record))
}

/// The acknowledged filter configuration as a fallback: every peer cluster renamed to its
/// static copy, no departed cluster, marked [`FallbackMode::LastAcknowledged`], local requests to the static local
/// clusters.
pub fn last_acknowledged_config(acknowledged: &AcknowledgedConfig) -> FilterConfig {
    let mut config = acknowledged.filter_config.clone();
    let rename = |name: &str| format!("{FALLBACK_PREFIX}{name}");
    config.peer_clusters = std::mem::take(&mut config.peer_clusters)
        .into_iter()
        .map(|(name, peers)| (rename(&name), peers))
        .collect();
    for gv in &mut config.group_versions {
        for route in &mut gv.resources {
            if let Some(cluster) = &mut route.peer_cluster {
                *cluster = rename(cluster);
            }
        }
    }
    for entry in config.openapi_v3.values_mut() {
        entry.peer_cluster = rename(&entry.peer_cluster);
    }
    config.failover_clusters = std::mem::take(&mut config.failover_clusters)
        .into_iter()
        .map(|(name, peers)| (rename(&name), peers))
        .collect();
    config.failover_all = config.failover_all.as_deref().map(rename);
    for gv in &mut config.group_versions {
        for route in &mut gv.resources {
            if let Some(cluster) = &mut route.failover_cluster {
                *cluster = rename(cluster);
            }
        }
    }
    // Departed apiservers get no static copy: what they served answers the filter's retained
    // 503 until the control plane is back (their addresses were never written down).
    config.without(FilterFeature::DepartedRoutes);
    config.fallback = Some(Fallback {
        mode: FallbackMode::LastAcknowledged,
        local_cluster: FALLBACK_LOCAL_CLUSTER.to_string(),
    });
    config
}

/// Envoy's `initial_fetch_timeout`s of CDS and ECDS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waits {
    pub clusters: Duration,
    pub filter: Duration,
}

impl Waits {
    /// No fallback: both wait for as long as it takes (`0s` in Envoy).
    pub const FOREVER: Waits = Waits {
        clusters: Duration::ZERO,
        filter: Duration::ZERO,
    };

    /// Half of `total` each, so that the sum is `total` (Envoy waits for CDS first, then for
    /// ECDS). Neither may be zero, which Envoy reads as "forever": `total` is at least
    /// [`MIN_WAIT`] (checked by the flag).
    pub fn split(total: Duration) -> Waits {
        let clusters = total / 2;
        Waits {
            clusters,
            filter: total - clusters,
        }
    }
}

/// The shortest `--control-plane-wait` besides 0 (no fallback): both halves stay non-zero.
pub const MIN_WAIT: Duration = Duration::from_millis(2);

/// The local-only filter configuration: no routing table (every request goes local, as the
/// apiserver alone would answer it), no merged discovery (the local apiserver's own: merged
/// documents could not be known fresh), and the static clusters as the local ones. The header
/// hygiene and identity of every request are unchanged.
pub fn local_only_config(local_apiserver: &str) -> FilterConfig {
    FilterConfig {
        schema: SCHEMA_VERSION,
        local_apiserver: local_apiserver.to_string(),
        peer_clusters: Default::default(),
        group_versions: Vec::new(),
        discovery: None,
        pending_peers: Vec::new(),
        openapi_v3: Default::default(),
        failover_clusters: Default::default(),
        failover_all: None,
        departed_clusters: Default::default(),
        fallback: Some(Fallback {
            mode: FallbackMode::LocalOnly,
            local_cluster: FALLBACK_LOCAL_CLUSTER.to_string(),
        }),
    }
}

/// The fallback as the bootstrap holds it: the static clusters it routes to and the filter's
/// ECDS `default_config`.
#[derive(Debug, Clone, PartialEq)]
pub struct RenderedFallback {
    /// The local apiserver's clusters, and with a record, every acknowledged peer cluster, in
    /// the three variants: the same messages as the live clusters ([`cluster`]), renamed.
    pub clusters: Vec<Cluster>,
    /// The Wasm filter with [`last_acknowledged_config`], or [`local_only_config`] without a
    /// record: the `typed_config` of the live ECDS resource ([`filter_extension_config`]).
    pub filter: Any,
}

/// Why a kept record cannot be rendered (the bootstrap then renders local-only).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("the filter would refuse its configuration: {0}")]
    FilterConfig(String),
    #[error("its filter configuration names peer cluster {0:?}, which has no addresses")]
    NoAddresses(String),
    #[error("cluster {cluster:?}: {error}")]
    Address { cluster: String, error: String },
}

/// Check a kept record as the fallback will use it: the filter accepts the renamed
/// configuration (the same check as on an ECDS push), and every peer cluster it routes to has
/// usable addresses.
pub fn check_record(record: &AcknowledgedConfig) -> Result<(), RecordError> {
    FilterConfig::from_json(last_acknowledged_config(record).to_json().as_bytes())
        .map_err(|e| RecordError::FilterConfig(e.to_string()))?;
    for (name, addresses) in &record.peer_clusters {
        for a in addresses {
            Address::parse(a).map_err(|e| RecordError::Address {
                cluster: name.clone(),
                error: e.to_string(),
            })?;
        }
    }
    for name in needed_peer_clusters(&record.filter_config) {
        if record.peer_clusters.get(&name).is_none_or(Vec::is_empty) {
            return Err(RecordError::NoAddresses(name));
        }
    }
    Ok(())
}

/// The peer clusters a configuration needs, under their live names: those its routes name, and
/// the peer cluster of each failover cluster (the same set of peers).
fn needed_peer_clusters(config: &FilterConfig) -> std::collections::BTreeSet<String> {
    config
        .peer_clusters
        .keys()
        .cloned()
        .chain(
            config
                .failover_clusters
                .values()
                .map(|ids| peer_cluster_name(ids)),
        )
        .collect()
}

/// The fallback for `inputs`: a record that fails [`check_record`] is an error (the caller
/// renders local-only instead, and says why).
pub fn render(inputs: &FallbackInputs<'_>) -> Result<RenderedFallback, EnvoyError> {
    let config = match inputs.acknowledged {
        Some(record) => {
            check_record(record).map_err(|e| EnvoyError::Record(e.to_string()))?;
            last_acknowledged_config(record)
        }
        None => local_only_config(inputs.local_apiserver),
    };
    let mut clusters = variants(
        &[(
            FALLBACK_LOCAL_CLUSTER.to_string(),
            vec![inputs.local.clone()],
        )],
        |name, addresses, auth| cluster(name, addresses, auth, Role::Local, inputs.upstream_sds),
    )?;
    if let Some(record) = inputs.acknowledged {
        let rename = |name: &str| format!("{FALLBACK_PREFIX}{name}");
        let mut bases = Vec::new();
        for name in needed_peer_clusters(&record.filter_config) {
            let addresses = record
                .peer_clusters
                .get(&name)
                .into_iter()
                .flatten()
                .map(|a| Address::parse(a))
                .collect::<Result<Vec<_>, _>>()?;
            bases.push((rename(&name), addresses));
        }
        clusters.extend(variants(&bases, |name, addresses, auth| {
            cluster(name, addresses, auth, Role::Peer, inputs.upstream_sds)
        })?);
        for (name, ids) in &record.filter_config.failover_clusters {
            for auth in UpstreamAuth::ALL {
                clusters.push(failover_cluster(
                    &rename(name),
                    FALLBACK_LOCAL_CLUSTER,
                    &rename(&peer_cluster_name(ids)),
                    auth,
                ));
            }
        }
    }
    let filter = filter_extension_config(inputs.filter_code, &config.to_json())
        .typed_config
        .ok_or(EnvoyError::Fallback(
            "the filter entry has no configuration",
        ))?;
    Ok(RenderedFallback { clusters, filter })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_waits_add_up_to_the_bound_and_are_never_forever() {
        for total in [
            MIN_WAIT,
            Duration::from_secs(2),
            Duration::from_secs(30),
            Duration::from_millis(2501),
        ] {
            let w = Waits::split(total);
            assert_eq!(w.clusters + w.filter, total);
            assert!(!w.clusters.is_zero() && !w.filter.is_zero(), "{total:?}");
        }
    }

    #[test]
    fn local_only_routes_nothing_itself_and_validates() {
        let config = local_only_config("cp-1");
        let back = FilterConfig::from_json(config.to_json().as_bytes()).expect("valid");
        assert_eq!(back, config);
        assert!(config.group_versions.is_empty() && config.discovery.is_none());
        assert!(config.to_json().contains(
            r#""fallback":{"mode":"local-only","local_cluster":"skewgate-fallback-local"}"#
        ));
    }

    #[test]
    fn static_clusters_are_the_local_apiserver_in_three_variants() {
        let local = Address::parse("127.0.0.1:6443").expect("address");
        let inputs = FallbackInputs {
            wait: Duration::from_secs(30),
            filter_code: &crate::test_fixtures::wasm_code("/opt/skewgate.wasm"),
            local: &local,
            upstream_sds: Some(Path::new("/var/lib/skewgate/sds")),
            local_apiserver: "cp-1",
            acknowledged: None,
        };
        let rendered = render(&inputs).expect("renders");
        let names: Vec<&str> = rendered.clusters.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "skewgate-fallback-local-identity",
                "skewgate-fallback-local-token",
                "skewgate-fallback-local-anonymous"
            ]
        );
        // The live clusters of the local apiserver, renamed: one renderer.
        for (fallback, auth) in rendered.clusters.iter().zip(UpstreamAuth::ALL) {
            let live = cluster(
                &auth.cluster(FALLBACK_LOCAL_CLUSTER),
                std::slice::from_ref(&local),
                auth,
                Role::Local,
                inputs.upstream_sds,
            )
            .expect("cluster");
            assert_eq!(*fallback, live);
            assert!(fallback.transport_socket.is_some(), "TLS to the apiserver");
        }
        let live = filter_extension_config(
            &crate::test_fixtures::wasm_code("/opt/skewgate.wasm"),
            &local_only_config("cp-1").to_json(),
        );
        assert_eq!(Some(rendered.filter), live.typed_config);
    }

    #[test]
    fn the_last_acknowledged_configuration_routes_to_static_copies_of_its_peer_clusters() {
        let filter_config = FilterConfig::from_json(
            br#"{"schema":1,"local_apiserver":"cp-1",
                 "peer_clusters":{"skewgate-peers-b":["apiserver-b"]},
                 "group_versions":[{"group":"resource.k8s.io","version":"v1beta2","resources":[
                   {"resource":"resourceclaims","peer_cluster":"skewgate-peers-b"},
                   {"resource":"deviceclasses","local":true}]}],
                 "openapi_v3":{"apis/resource.k8s.io/v1beta2":{
                   "server_relative_url":"/openapi/v3/apis/resource.k8s.io/v1beta2?hash=AB",
                   "peer_cluster":"skewgate-peers-b"}}}"#,
        )
        .expect("valid");
        let record = AcknowledgedConfig {
            filter_config,
            peer_clusters: BTreeMap::from([(
                "skewgate-peers-b".to_string(),
                vec!["10.0.0.12:6444".to_string(), "[fd00::12]:6444".to_string()],
            )]),
        };
        let dir = tempfile::tempdir().expect("dir");
        assert_eq!(read_acknowledged(dir.path()), Ok(None), "none kept yet");
        write_acknowledged(dir.path(), &record).expect("write");
        let back = read_acknowledged(dir.path())
            .expect("readable")
            .expect("kept");
        assert_eq!(back, record);

        let config = last_acknowledged_config(&back);
        assert_eq!(
            config.fallback,
            Some(Fallback {
                mode: FallbackMode::LastAcknowledged,
                local_cluster: FALLBACK_LOCAL_CLUSTER.to_string(),
            })
        );
        assert_eq!(
            config.peer_clusters.keys().collect::<Vec<_>>(),
            ["skewgate-fallback-skewgate-peers-b"]
        );
        assert_eq!(
            config.group_versions[0].resources[0]
                .peer_cluster
                .as_deref(),
            Some("skewgate-fallback-skewgate-peers-b")
        );
        assert_eq!(
            config.openapi_v3["apis/resource.k8s.io/v1beta2"].peer_cluster,
            "skewgate-fallback-skewgate-peers-b"
        );
        FilterConfig::from_json(config.to_json().as_bytes()).expect("the filter accepts it");

        let local = Address::parse("127.0.0.1:6443").expect("address");
        let inputs = FallbackInputs {
            wait: Duration::from_secs(30),
            filter_code: &crate::test_fixtures::wasm_code("/opt/skewgate.wasm"),
            local: &local,
            upstream_sds: None,
            local_apiserver: "cp-1",
            acknowledged: Some(&back),
        };
        let rendered = render(&inputs).expect("renders");
        let names: Vec<&str> = rendered.clusters.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names.len(), 6);
        assert!(names.contains(&"skewgate-fallback-skewgate-peers-b-token"));
        let peer = rendered
            .clusters
            .iter()
            .find(|c| c.name == "skewgate-fallback-skewgate-peers-b-identity")
            .expect("peer cluster");
        let addresses =
            ["10.0.0.12:6444", "[fd00::12]:6444"].map(|a| Address::parse(a).expect("a"));
        assert_eq!(
            *peer,
            cluster(
                &peer.name,
                &addresses,
                UpstreamAuth::ProxyIdentity,
                Role::Peer,
                None
            )
            .expect("cluster")
        );

        // A field of a newer record is ignored; the filter configuration inside it is checked as
        // strictly as ever.
        let mut newer: serde_json::Value = serde_json::to_value(&record).expect("json");
        newer["kept_by"] = serde_json::json!({"release": "next", "at": 1_700_000_000});
        newer["peer_addresses_v2"] = serde_json::json!([]);
        std::fs::write(
            dir.path().join(ACKNOWLEDGED_FILE),
            serde_json::to_vec(&newer).expect("json"),
        )
        .expect("write");
        assert_eq!(
            read_acknowledged(dir.path()),
            Ok(Some(record.clone())),
            "a newer record's additions are ignored"
        );
        let mut unknown_in_filter = newer.clone();
        unknown_in_filter["filter_config"]["failover"] = serde_json::json!({});
        std::fs::write(
            dir.path().join(ACKNOWLEDGED_FILE),
            serde_json::to_vec(&unknown_in_filter).expect("json"),
        )
        .expect("write");
        assert!(
            read_acknowledged(dir.path()).is_err(),
            "a filter configuration this filter would refuse is refused"
        );

        // A record that cannot be used is an error (bootstrap then renders local-only).
        for bad in [
            "not json",
            r#"{"filter_config":{"schema":99,"local_apiserver":"x"},"peer_clusters":{}}"#,
            r#"{"filter_config":{"schema":1,"local_apiserver":"x"},"peer_clusters":{"c":["nowhere"]}}"#,
            // A peer cluster the configuration routes to without an address.
            r#"{"filter_config":{"schema":1,"local_apiserver":"x","peer_clusters":{"p":["b"]}},"peer_clusters":{}}"#,
        ] {
            std::fs::write(dir.path().join(ACKNOWLEDGED_FILE), bad).expect("write");
            assert!(read_acknowledged(dir.path()).is_err(), "{bad}");
        }
    }

    /// A kept configuration with failover: the fallback's copies fail over from the static
    /// local clusters to static copies of the same peers.
    #[test]
    fn the_last_acknowledged_failover_uses_static_copies() {
        let b = vec!["apiserver-b".to_string()];
        let failover = crate::routing::failover_cluster_name(&b);
        let peers = peer_cluster_name(&b);
        let filter_config = FilterConfig::from_json(
            format!(
                r#"{{"schema":1,"local_apiserver":"cp-1",
                     "failover_clusters":{{"{failover}":["apiserver-b"]}},
                     "failover_all":"{failover}",
                     "group_versions":[{{"group":"apps","version":"v1","resources":[
                       {{"resource":"deployments","local":true,"failover_cluster":"{failover}"}}]}}]}}"#
            )
            .as_bytes(),
        )
        .expect("valid");
        let record = AcknowledgedConfig {
            filter_config,
            peer_clusters: BTreeMap::from([(peers.clone(), vec!["10.0.0.12:6444".to_string()])]),
        };
        check_record(&record).expect("usable");
        let config = last_acknowledged_config(&record);
        let renamed = format!("{FALLBACK_PREFIX}{failover}");
        assert_eq!(config.failover_all.as_deref(), Some(renamed.as_str()));
        assert_eq!(
            config.group_versions[0].resources[0]
                .failover_cluster
                .as_deref(),
            Some(renamed.as_str())
        );
        let local = Address::parse("127.0.0.1:6443").expect("address");
        let rendered = render(&FallbackInputs {
            wait: Duration::from_secs(30),
            filter_code: &crate::test_fixtures::wasm_code("/opt/skewgate.wasm"),
            local: &local,
            upstream_sds: None,
            local_apiserver: "cp-1",
            acknowledged: Some(&record),
        })
        .expect("renders");
        for auth in UpstreamAuth::ALL {
            let aggregate = rendered
                .clusters
                .iter()
                .find(|c| c.name == auth.cluster(&renamed))
                .expect("the failover cluster's static copy");
            assert_eq!(
                *aggregate,
                failover_cluster(
                    &renamed,
                    FALLBACK_LOCAL_CLUSTER,
                    &format!("{FALLBACK_PREFIX}{peers}"),
                    auth
                )
            );
            let peer_copy = auth.cluster(&format!("{FALLBACK_PREFIX}{peers}"));
            assert!(
                rendered.clusters.iter().any(|c| c.name == peer_copy),
                "{peer_copy}"
            );
        }
        // Without the peers' addresses the record cannot be used.
        let mut without = record;
        without.peer_clusters.clear();
        assert!(matches!(
            check_record(&without),
            Err(RecordError::NoAddresses(_))
        ));
    }
}
