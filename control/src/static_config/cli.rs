//! `skewgate-control render-static`: its flags ([`RenderStaticArgs`]), what they say, checked
//! ([`RenderStaticConfig`], from [`RenderStaticArgs::validate`]: the shape of `run`'s and
//! `bootstrap`'s), and the command, which reads the discovery documents and writes the
//! configuration ([`super::write`]).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use skewgate_core::group_version::GroupVersion;

use super::{write, StaticConfig};
use crate::discovery::documents::DiscoveryDocuments;
use crate::envoy::resources::FilterCode;
use crate::envoy::{Address, ServingTls, UpstreamTls};
use crate::flags::DataPlaneFlags;
use crate::flags::{parse_address, FlagError, ListenerFlags, LocalChannelFlags, UpstreamTlsFlags};
use crate::local_channels::LocalChannels;
use crate::plan::{ApiserverView, MergedOutcome};

#[derive(clap::Args, Debug)]
pub struct RenderStaticArgs {
    /// An apiserver of the cluster: `id=NAME,address=HOST:PORT,discovery=DIR`, where DIR holds
    /// `aggregated_v2.json` (its `/apis` aggregated discovery) and `api__v1.json` (legacy core
    /// v1). Repeat for every apiserver, the local one included.
    #[arg(long = "apiserver", required = true, value_parser = parse_spec, value_name = "SPEC")]
    pub apiservers: Vec<ApiserverSpec>,
    /// Id of the apiserver this Envoy fronts.
    #[arg(long)]
    pub local: String,
    /// A group-version served from shared storage (a CRD or a service-backed APIService),
    /// never proxied: `GROUP/VERSION`. Repeatable.
    #[arg(long = "shared-storage", value_parser = parse_group_version, value_name = "GROUP/VERSION")]
    pub shared_storage: Vec<GroupVersion>,
    #[command(flatten)]
    pub data_plane: DataPlaneFlags,
    /// Where to write the configuration (created if missing): `envoy.yaml` (Envoy's `-c`),
    /// the clusters and the filter configuration it reads
    /// (`clusters.yaml`, `filter.yaml`), the SDS files naming the certificates
    /// (`skewgate-*.yaml`), and `filter-config.json` to read.
    #[arg(long, value_name = "DIR")]
    pub out_dir: PathBuf,
    #[command(flatten)]
    pub listener: ListenerFlags,
    #[command(flatten)]
    pub upstream: UpstreamTlsFlags,
    /// Where Envoy's admin interface is (there is no xDS in the static mode).
    #[command(flatten)]
    pub channels: LocalChannelFlags,
}

/// One `--apiserver`.
#[derive(Debug, Clone)]
pub struct ApiserverSpec {
    pub id: String,
    pub address: Address,
    /// The folder of its saved discovery documents.
    pub discovery: PathBuf,
}

fn parse_spec(spec: &str) -> Result<ApiserverSpec, String> {
    let (mut id, mut address, mut discovery) = (None, None, None);
    for part in spec.split(',') {
        match part.split_once('=') {
            Some(("id", v)) => id = Some(v.to_string()),
            Some(("address", v)) => address = Some(parse_address(v).map_err(|e| e.to_string())?),
            Some(("discovery", v)) => discovery = Some(PathBuf::from(v)),
            _ => {
                return Err(format!(
                    "unknown part {part:?} (want id=,address=,discovery=)"
                ))
            }
        }
    }
    match (id, address, discovery) {
        (Some(id), Some(address), Some(discovery)) if !id.is_empty() => Ok(ApiserverSpec {
            id,
            address,
            discovery,
        }),
        _ => Err("needs id=, address= and discovery=".to_string()),
    }
}

fn parse_group_version(s: &str) -> Result<GroupVersion, String> {
    GroupVersion::parse(s).map_err(|e| e.to_string())
}

/// What `render-static`'s flags say, checked.
#[derive(Debug, Clone)]
pub struct RenderStaticConfig {
    /// The local apiserver first, then the peers in the order given.
    pub apiservers: Vec<ApiserverSpec>,
    pub shared_storage: BTreeSet<GroupVersion>,
    pub filter_code: FilterCode,
    pub out_dir: PathBuf,
    pub listen: Address,
    pub request_timeout: Duration,
    pub serving: Option<ServingTls>,
    pub upstream_tls: Option<UpstreamTls>,
    pub channels: LocalChannels,
    pub peer_listen: Option<Address>,
    pub peer_cidrs: Vec<ipnet::IpNet>,
}

impl RenderStaticArgs {
    /// Everything `render-static` needs, checked.
    pub fn validate(&self) -> Result<RenderStaticConfig, FlagError> {
        let mut ids = BTreeSet::new();
        for spec in &self.apiservers {
            if !ids.insert(spec.id.as_str()) {
                return Err(FlagError::flag("--apiserver", &spec.id, "is given twice"));
            }
        }
        let Some(local) = self.apiservers.iter().find(|s| s.id == self.local) else {
            return Err(FlagError::flag(
                "--local",
                &self.local,
                "is not one of the --apiserver ids",
            ));
        };
        let apiservers = std::iter::once(local.clone())
            .chain(
                self.apiservers
                    .iter()
                    .filter(|s| s.id != self.local)
                    .cloned(),
            )
            .collect();
        if self.channels.xds_address.is_some() {
            return Err(FlagError::Combination(
                "--xds-address: render-static has no xDS (Envoy reads its configuration from files)"
                    .into(),
            ));
        }
        let (_, upstream_tls) = self.upstream.resolve()?;
        Ok(RenderStaticConfig {
            apiservers,
            shared_storage: self.shared_storage.iter().cloned().collect(),
            filter_code: self.data_plane.require()?,
            out_dir: self.out_dir.clone(),
            listen: self.listener.listen.clone(),
            request_timeout: self.listener.request_timeout,
            serving: self.listener.serving_tls()?,
            upstream_tls,
            channels: self.channels.resolve()?,
            peer_listen: self.listener.peer_listen()?.cloned(),
            peer_cidrs: self.listener.peer_cidrs.peer_cidrs.clone(),
        })
    }
}

/// `skewgate-control render-static`: read every apiserver's saved discovery, write the
/// configuration, print the bootstrap's path.
pub fn render_static(args: RenderStaticArgs) -> Result<()> {
    let config = args.validate()?;
    let documents = config
        .apiservers
        .iter()
        .map(|spec| {
            DiscoveryDocuments::from_dir(&spec.discovery)
                .with_context(|| format!("reading discovery of {}", spec.id))
        })
        .collect::<Result<Vec<_>>>()?;
    let views: Vec<ApiserverView<'_>> = config
        .apiservers
        .iter()
        .zip(&documents)
        .map(|(spec, docs)| ApiserverView {
            id: &spec.id,
            address: &spec.address,
            documents: Some(docs),
        })
        .collect();
    let Some((local, peers)) = views.split_first() else {
        anyhow::bail!("no --apiserver");
    };
    config.channels.prepare().context("--socket-dir")?;
    let written = write(&StaticConfig {
        dir: &config.out_dir,
        local: *local,
        peers,
        shared_storage: &config.shared_storage,
        filter_code: &config.filter_code,
        listen: &config.listen,
        admin: config.channels.admin(),
        request_timeout: config.request_timeout,
        serving: config.serving.as_ref(),
        upstream_tls: config.upstream_tls.as_ref(),
        peer_listen: config.peer_listen.as_ref(),
        peer_cidrs: &config.peer_cidrs,
    })?;
    if let MergedOutcome::Skipped { reason } = &written.plan.merged {
        // Routing still works; discovery is then each apiserver's own.
        eprintln!("skewgate-control: warning: {reason}");
    }
    println!("{}", written.bootstrap.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Args, FromArgMatches};

    fn parse(extra: &[&str]) -> RenderStaticArgs {
        let base = [
            "render-static",
            "--apiserver=id=b,address=10.0.0.2:6443,discovery=/d/b",
            "--apiserver=id=a,address=10.0.0.1:6443,discovery=/d/a",
            "--wasm=/opt/skewgate_filter.wasm",
            "--out-dir=/tmp/out",
            "--insecure-plaintext-listener",
            "--insecure-plaintext-upstreams",
            "--insecure-tcp-local-channels",
        ];
        let matches = RenderStaticArgs::augment_args(clap::Command::new("render-static"))
            .try_get_matches_from(base.iter().chain(extra))
            .expect("parses");
        RenderStaticArgs::from_arg_matches(&matches).expect("args")
    }

    #[test]
    fn the_local_apiserver_comes_first_and_the_rest_keep_their_order() {
        let config = parse(&["--local=a"]).validate().expect("valid");
        let ids: Vec<&str> = config.apiservers.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, ["a", "b"]);
    }

    #[test]
    fn what_render_static_refuses() {
        let cases: &[(&[&str], &str)] = &[
            (&["--local=c"], "--local"),
            (
                &[
                    "--local=a",
                    "--apiserver=id=a,address=10.0.0.3:6443,discovery=/d/c",
                ],
                "given twice",
            ),
            (&["--local=a", "--xds-address=127.0.0.1:18000"], "no xDS"),
            (
                &["--local=a", "--peer-listen=0.0.0.0:6443"],
                "--peer-listen",
            ),
        ];
        for (extra, want) in cases {
            let err = parse(extra).validate().expect_err("refused").to_string();
            assert!(err.contains(want), "{extra:?}: {err}");
        }
    }
}
