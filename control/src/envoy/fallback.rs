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

use std::path::Path;
use std::time::Duration;

use skewgate_core::config::{
    Fallback, FallbackMode, FilterConfig, UpstreamAuth, FALLBACK_LOCAL_CLUSTER, SCHEMA_VERSION,
};

use super::resources::{cluster_json, filter_wasm_json, wasm_path};
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
        fallback: Some(Fallback {
            mode: FallbackMode::LocalOnly,
            local_cluster: FALLBACK_LOCAL_CLUSTER.to_string(),
        }),
    }
}

/// The ECDS `default_config`: the Wasm filter with [`local_only_config`].
pub fn default_filter_config(inputs: &FallbackInputs<'_>) -> Result<serde_json::Value, EnvoyError> {
    let config = local_only_config(inputs.local_apiserver);
    Ok(filter_wasm_json(
        wasm_path(inputs.wasm_path)?,
        &config.to_json(),
    ))
}

/// The static clusters of the local apiserver, in the three variants.
pub fn static_clusters(inputs: &FallbackInputs<'_>) -> Result<Vec<serde_json::Value>, EnvoyError> {
    UpstreamAuth::ALL
        .into_iter()
        .map(|auth| {
            cluster_json(
                &auth.cluster(FALLBACK_LOCAL_CLUSTER),
                std::slice::from_ref(inputs.local),
                auth,
                inputs.upstream_sds,
            )
        })
        .collect()
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
}
