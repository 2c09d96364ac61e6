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
    Fallback, FallbackMode, FilterConfig, FALLBACK_LOCAL_CLUSTER, SCHEMA_VERSION,
};

use super::resources::{cluster_json, filter_wasm_json, variants, wasm_path};
use super::{Address, EnvoyError};

/// What the fallback needs: the filter's code and the local apiserver, as the control plane
/// would give them (`run --wasm`, `--local-apiserver-url`, `--sds-dir`).
#[derive(Debug, Clone, Copy)]
pub struct FallbackInputs<'a> {
    /// The whole bound: CDS and ECDS together wait at most this long (see [`Waits::split`]).
    pub wait: Duration,
    /// `skewgate_filter.wasm` as Envoy sees it.
    pub wasm_path: &'a Path,
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
/// when it is there but unusable (too large, not JSON, a filter configuration the filter
/// would refuse, an address that is not `host:port`).
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
    // The same checks the filter makes, and every address usable.
    FilterConfig::from_json(record.filter_config.to_json().as_bytes())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    for (name, addresses) in &record.peer_clusters {
        for a in addresses {
            Address::parse(a).map_err(|e| format!("{}: cluster {name}: {e}", path.display()))?;
        }
    }
    Ok(Some(record))
}

/// The acknowledged filter configuration as a fallback: every peer cluster renamed to its
/// static copy, marked [`FallbackMode::LastAcknowledged`], local requests to the static local
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

/// A protobuf JSON duration (`1.5s`), as Envoy reads it.
pub fn envoy_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}.{:09}s", d.as_secs(), d.subsec_nanos())
    }
}

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
        fallback: Some(Fallback {
            mode: FallbackMode::LocalOnly,
            local_cluster: FALLBACK_LOCAL_CLUSTER.to_string(),
        }),
    }
}

/// The ECDS `default_config`: the Wasm filter with [`last_acknowledged_config`], or
/// [`local_only_config`] without one.
pub fn default_filter_config(inputs: &FallbackInputs<'_>) -> Result<serde_json::Value, EnvoyError> {
    let config = match inputs.acknowledged {
        Some(acknowledged) => last_acknowledged_config(acknowledged),
        None => local_only_config(inputs.local_apiserver),
    };
    Ok(filter_wasm_json(
        wasm_path(inputs.wasm_path)?,
        &config.to_json(),
    ))
}

/// The static clusters of the local apiserver, and of every acknowledged peer cluster, in the
/// three variants.
pub fn static_clusters(inputs: &FallbackInputs<'_>) -> Result<Vec<serde_json::Value>, EnvoyError> {
    let mut bases = vec![(
        FALLBACK_LOCAL_CLUSTER.to_string(),
        vec![inputs.local.clone()],
    )];
    for (name, addresses) in inputs
        .acknowledged
        .map(|a| &a.peer_clusters)
        .into_iter()
        .flatten()
    {
        let addresses = addresses
            .iter()
            .map(|a| Address::parse(a))
            .collect::<Result<Vec<_>, _>>()?;
        bases.push((format!("{FALLBACK_PREFIX}{name}"), addresses));
    }
    variants(&bases, |name, addresses, auth| {
        cluster_json(name, addresses, auth, inputs.upstream_sds)
    })
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
        assert_eq!(envoy_duration(Duration::from_secs(15)), "15s");
        assert_eq!(envoy_duration(Duration::from_millis(1250)), "1.250000000s");
        assert_eq!(envoy_duration(Duration::ZERO), "0s");
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
            wasm_path: Path::new("/opt/skewgate.wasm"),
            local: &local,
            upstream_sds: Some(Path::new("/var/lib/skewgate/sds")),
            local_apiserver: "cp-1",
            acknowledged: None,
        };
        let clusters = static_clusters(&inputs).expect("clusters");
        let names: Vec<&str> = clusters.iter().filter_map(|c| c["name"].as_str()).collect();
        assert_eq!(
            names,
            [
                "skewgate-fallback-local-identity",
                "skewgate-fallback-local-token",
                "skewgate-fallback-local-anonymous"
            ]
        );
        for c in &clusters {
            let socket = &c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
                ["address"]["socket_address"];
            assert_eq!(
                (socket["address"].as_str(), socket["port_value"].as_u64()),
                (Some("127.0.0.1"), Some(6443))
            );
            let tls = &c["transport_socket"]["typed_config"];
            assert_eq!(tls["sni"], "kubernetes.default.svc");
            assert_eq!(
                tls["common_tls_context"]["combined_validation_context"]
                    ["validation_context_sds_secret_config"]["sds_config"]["path_config_source"]
                    ["path"],
                "/var/lib/skewgate/sds/skewgate-peer-ca.pb"
            );
            // Only -identity presents the proxy-client certificate.
            let presents = tls["common_tls_context"]
                .get("tls_certificate_sds_secret_configs")
                .is_some();
            assert_eq!(presents, c["name"] == "skewgate-fallback-local-identity");
        }
        let filter = default_filter_config(&inputs).expect("filter");
        let json = filter["config"]["configuration"]["value"]
            .as_str()
            .expect("json");
        assert_eq!(
            FilterConfig::from_json(json.as_bytes()).expect("valid"),
            local_only_config("cp-1")
        );
        assert_eq!(
            filter["config"]["vm_config"]["code"]["local"]["filename"],
            "/opt/skewgate.wasm"
        );
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
            wasm_path: Path::new("/opt/skewgate.wasm"),
            local: &local,
            upstream_sds: None,
            local_apiserver: "cp-1",
            acknowledged: Some(&back),
        };
        let clusters = static_clusters(&inputs).expect("clusters");
        let names: Vec<&str> = clusters.iter().filter_map(|c| c["name"].as_str()).collect();
        assert_eq!(names.len(), 6);
        assert!(names.contains(&"skewgate-fallback-skewgate-peers-b-token"));
        let peer = clusters
            .iter()
            .find(|c| c["name"] == "skewgate-fallback-skewgate-peers-b-identity")
            .expect("peer cluster");
        let endpoints = &peer["load_assignment"]["endpoints"][0]["lb_endpoints"];
        assert_eq!(
            endpoints[1]["endpoint"]["address"]["socket_address"]["address"],
            "fd00::12"
        );

        // A record that cannot be used is an error (bootstrap then renders local-only).
        for bad in [
            "not json",
            r#"{"filter_config":{"schema":99,"local_apiserver":"x"},"peer_clusters":{}}"#,
            r#"{"filter_config":{"schema":1,"local_apiserver":"x"},"peer_clusters":{"c":["nowhere"]}}"#,
        ] {
            std::fs::write(dir.path().join(ACKNOWLEDGED_FILE), bad).expect("write");
            assert!(read_acknowledged(dir.path()).is_err(), "{bad}");
        }
    }
}
