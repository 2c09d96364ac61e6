//! The static mode in one call: [`plan`](crate::plan::plan) a fixed set of apiservers, write
//! the certificates' SDS files ([`crate::envoy::secrets`]), the Envoy resources as files
//! ([`crate::xds::files`]) and the bootstrap that reads them
//! ([`crate::envoy::bootstrap`] with [`ConfigSource::Files`]). Used by
//! `skewgate-control render-static` and by the integration tests' Envoy harness: the same
//! plan, resources and bootstrap as the live mode, delivered by files instead of ADS.

pub mod cli;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use skewgate_core::group_version::GroupVersion;

use crate::envoy::bootstrap::{Bootstrap, ConfigSource, PeerPassthrough};
use crate::envoy::resources::FilterCode;
use crate::envoy::secrets::{serving_secrets, upstream_secrets};
use crate::envoy::{Address, EnvoyError, ServingTls, UpstreamTls};
use crate::local_channels::LocalChannel;
use crate::plan::{plan, ApiserverView, Plan, PlanError, PlanInputs};
use crate::xds::files;

/// The bootstrap's file name in the output directory.
pub const BOOTSTRAP_FILE: &str = "envoy.yaml";
/// The filter configuration as JSON, for people and benchmarks (Envoy reads `filter.yaml`).
pub const FILTER_CONFIG_JSON_FILE: &str = "filter-config.json";
/// The node id of a static Envoy (Envoy requires one for file-based xDS).
pub const NODE_ID: &str = "skewgate-static";

/// Everything a static configuration is made of.
#[derive(Debug, Clone, Copy)]
pub struct StaticConfig<'a> {
    /// Where to write (created if missing).
    pub dir: &'a Path,
    pub local: ApiserverView<'a>,
    pub peers: &'a [ApiserverView<'a>],
    pub shared_storage: &'a BTreeSet<GroupVersion>,
    /// The filter's code as Envoy sees it.
    pub filter_code: &'a FilterCode,
    pub listen: &'a Address,
    /// Envoy's admin interface (its socket directory must exist).
    pub admin: &'a LocalChannel,
    pub request_timeout: Duration,
    pub serving: Option<&'a ServingTls>,
    pub upstream_tls: Option<&'a UpstreamTls>,
    /// The L4 peer port to the local apiserver, if any, and who may connect to it.
    pub peer_listen: Option<&'a Address>,
    pub peer_cidrs: &'a [ipnet::IpNet],
}

/// What [`write`] wrote.
#[derive(Debug)]
pub struct Written {
    pub plan: Plan,
    /// `dir/envoy.yaml`: `envoy -c` this.
    pub bootstrap: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum StaticConfigError {
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Envoy(#[from] EnvoyError),
    #[error("writing {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Plan, then write the resources first and the bootstrap last.
pub fn write(config: &StaticConfig<'_>) -> Result<Written, StaticConfigError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| StaticConfigError::Io { path, source }
    };
    std::fs::create_dir_all(config.dir).map_err(io(config.dir))?;
    // Absolute: Envoy resolves the file sources against its own working directory.
    let dir = std::path::absolute(config.dir).map_err(io(config.dir))?;
    // The certificates' SDS files first: the listener and the clusters read them.
    let mut secrets = Vec::new();
    if let Some(serving) = config.serving {
        secrets.extend(serving_secrets(serving)?);
    }
    if let Some(upstream) = config.upstream_tls {
        secrets.extend(upstream_secrets(upstream)?);
    }
    files::write_secrets(&dir, &secrets, "render-static").map_err(io(&dir))?;
    let planned = plan(&PlanInputs {
        local: config.local,
        peers: config.peers,
        retained: &[],
        shared_storage: config.shared_storage,
        local_freshness: crate::routing::LocalFreshness::Current,
        filter_code: config.filter_code,
        upstream_sds: config.upstream_tls.map(|_| dir.as_path()),
    })?;
    files::write(&dir, &planned.snapshot, "render-static").map_err(io(&dir))?;
    let json_path = dir.join(FILTER_CONFIG_JSON_FILE);
    std::fs::write(&json_path, planned.routing.config.to_json()).map_err(io(&json_path))?;
    let rendered = Bootstrap {
        listen: config.listen,
        admin: config.admin,
        config_source: ConfigSource::Files { dir: &dir },
        node_id: NODE_ID,
        request_timeout: config.request_timeout,
        serving: config.serving,
        sds_dir: Some(&dir),
        peer: config.peer_listen.map(|listen| PeerPassthrough {
            listen,
            apiserver: config.local.address,
            allowed_sources: config.peer_cidrs,
        }),
        fallback: None,
        // No GOAWAY chance in the static mode (no socket directory).
        goaway: None,
    }
    .render("render-static")?;
    let bootstrap = dir.join(BOOTSTRAP_FILE);
    std::fs::write(&bootstrap, rendered).map_err(io(&bootstrap))?;
    Ok(Written {
        plan: planned,
        bootstrap,
    })
}
