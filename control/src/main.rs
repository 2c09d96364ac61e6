//! `skewgate-control`: the skewgate control plane.
//!
//! - `run`: the live control plane: watches identity Leases, CRDs and APIServices, fetches every
//!   apiserver's discovery, and serves clusters and the filter configuration to Envoy over delta
//!   ADS (`skewgate_control::run`);
//! - `bootstrap`: prints the Envoy bootstrap for `run`;
//! - `render-static` writes a complete static configuration from discovery documents saved to
//!   disk, for setups without a live control plane and for benchmarks: the same bootstrap and
//!   the same Envoy resources as `run` (`skewgate_control::plan`), read by Envoy from files;
//! - `drain-envoy`: stops Envoy without cutting requests, what Envoy's entrypoint
//!   (`deploy/image/skewgate-envoy`) runs on SIGTERM (`skewgate_control::envoy::drain`).

use std::collections::BTreeSet;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use skewgate_control::discovery::documents::DiscoveryDocuments;
use skewgate_control::envoy::drain::{self, DrainArgs};
use skewgate_control::envoy::Address;
use skewgate_control::flags::{parse_address, ListenerFlags, LocalChannelFlags, UpstreamTlsFlags};
use skewgate_control::plan::{ApiserverView, MergedOutcome};
use skewgate_control::static_config::{self, StaticConfig};
use skewgate_core::group_version::GroupVersion;

#[derive(Parser)]
#[command(name = "skewgate-control", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the live control plane beside one Envoy (identity Leases, live discovery, xDS).
    Run(skewgate_control::run::RunArgs),
    /// Print the Envoy bootstrap for `run` (listener, its TLS, the xDS connection).
    Bootstrap(skewgate_control::run::BootstrapArgs),
    /// Write an Envoy configuration with a fixed routing table from saved discovery documents.
    RenderStatic(RenderStatic),
    /// Drain Envoy, then stop it: /readyz fails and clients are told to reconnect, the ports
    /// close after --drain-seconds, Envoy exits once no client request is in flight (at most
    /// --finish-seconds later). What Envoy's entrypoint runs on SIGTERM.
    DrainEnvoy(DrainArgs),
}

#[derive(clap::Args)]
struct RenderStatic {
    /// An apiserver of the cluster: `id=NAME,address=HOST:PORT,discovery=DIR`, where DIR holds
    /// `aggregated_v2.json` (its `/apis` aggregated discovery) and `api__v1.json` (legacy core
    /// v1). Repeat for every apiserver, the local one included.
    #[arg(long = "apiserver", required = true, value_parser = parse_spec, value_name = "SPEC")]
    apiservers: Vec<ApiserverSpec>,
    /// Id of the apiserver this Envoy fronts.
    #[arg(long)]
    local: String,
    /// A group-version served from shared storage (a CRD or a service-backed APIService),
    /// never proxied: `GROUP/VERSION`. Repeatable.
    #[arg(long = "shared-storage", value_parser = parse_group_version, value_name = "GROUP/VERSION")]
    shared_storage: Vec<GroupVersion>,
    /// Path of skewgate_filter.wasm, as Envoy will see it.
    #[arg(long)]
    wasm: PathBuf,
    /// Where to write the configuration (created if missing): `envoy.pb` (start Envoy with
    /// `envoy -c DIR/envoy.pb`), the clusters and the filter configuration it reads
    /// (`clusters.pb`, `filter.pb`), the SDS files naming the certificates (`skewgate-*.pb`),
    /// and `filter-config.json` to read.
    #[arg(long, value_name = "DIR")]
    out_dir: PathBuf,
    #[command(flatten)]
    listener: ListenerFlags,
    #[command(flatten)]
    upstream: UpstreamTlsFlags,
    /// Where Envoy's admin interface is (there is no xDS in the static mode).
    #[command(flatten)]
    channels: LocalChannelFlags,
}

#[derive(Clone)]
struct ApiserverSpec {
    id: String,
    address: Address,
    discovery: PathBuf,
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

fn render_static(args: RenderStatic) -> Result<()> {
    let mut ids = BTreeSet::new();
    for spec in &args.apiservers {
        if !ids.insert(spec.id.as_str()) {
            bail!("apiserver {:?} is given twice", spec.id);
        }
    }
    let documents = args
        .apiservers
        .iter()
        .map(|spec| {
            DiscoveryDocuments::from_dir(&spec.discovery)
                .with_context(|| format!("reading discovery of {}", spec.id))
        })
        .collect::<Result<Vec<_>>>()?;
    let views: Vec<ApiserverView<'_>> = args
        .apiservers
        .iter()
        .zip(&documents)
        .map(|(spec, docs)| ApiserverView {
            id: &spec.id,
            address: &spec.address,
            documents: Some(docs),
        })
        .collect();
    let Some(local) = views.iter().find(|v| v.id == args.local) else {
        bail!("--local {:?} is not one of the --apiserver ids", args.local);
    };
    let peers: Vec<ApiserverView<'_>> = views
        .iter()
        .filter(|v| v.id != args.local)
        .copied()
        .collect();
    let serving = args.listener.serving_tls()?;
    let (_, upstream_tls) = args.upstream.resolve()?;
    if args.channels.xds_address.is_some() {
        bail!("--xds-address: render-static has no xDS (Envoy reads its configuration from files)");
    }
    let channels = args.channels.resolve()?;
    channels.prepare().context("--socket-dir")?;
    let shared_storage: BTreeSet<GroupVersion> = args.shared_storage.iter().cloned().collect();
    let written = static_config::write(&StaticConfig {
        dir: &args.out_dir,
        local: *local,
        peers: &peers,
        shared_storage: &shared_storage,
        wasm_path: &args.wasm,
        listen: &args.listener.listen,
        admin: channels.admin(),
        request_timeout: args.listener.request_timeout,
        serving: serving.as_ref(),
        upstream_tls: upstream_tls.as_ref(),
        peer_listen: args.listener.peer_listen()?,
        peer_cidrs: &args.listener.peer_cidrs.peer_cidrs,
    })?;
    if let MergedOutcome::Skipped { reason } = &written.plan.merged {
        // Routing still works; discovery is then each apiserver's own.
        eprintln!("skewgate-control: warning: {reason}");
    }
    println!("{}", written.bootstrap.display());
    Ok(())
}

fn drain_envoy(args: DrainArgs) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let say = |what: &str| eprintln!("skewgate-control drain-envoy: {what}");
    runtime
        .block_on(drain::drain_envoy(&args, say))
        .context("draining Envoy")?;
    Ok(())
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Run(args) => skewgate_control::run::cli::run(args),
        Command::Bootstrap(args) => skewgate_control::run::cli::bootstrap(args),
        Command::RenderStatic(args) => render_static(args),
        Command::DrainEnvoy(args) => drain_envoy(args),
    }
}
