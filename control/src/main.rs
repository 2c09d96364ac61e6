//! `skewgate-control`: the skewgate control plane.
//!
//! - `run`: the live control plane: watches identity Leases, CRDs and APIServices, fetches every
//!   apiserver's discovery, and serves clusters and the filter configuration to Envoy over delta
//!   ADS (`skewgate_control::app`);
//! - `bootstrap`: prints the Envoy bootstrap for `run`;
//! - `render-static` renders a complete Envoy bootstrap (listener, filter with its routing table,
//!   clusters) from discovery documents saved to disk, for setups without a live control plane
//!   and for tests.

use std::collections::BTreeSet;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use skewgate_control::bootstrap::{Address, ServingTls, StaticBootstrap, UpstreamTls};
use skewgate_control::documents::DiscoveryDocuments;
use skewgate_control::merged;
use skewgate_control::routing::{self, Peer};

#[derive(Parser)]
#[command(name = "skewgate-control", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the live control plane beside one Envoy (identity Leases, live discovery, xDS).
    Run(skewgate_control::app::RunArgs),
    /// Print the Envoy bootstrap for `run` (listener, its TLS, the xDS connection).
    Bootstrap(skewgate_control::app::BootstrapArgs),
    /// Render an Envoy bootstrap with a static routing table from saved discovery documents.
    RenderStatic(RenderStatic),
}

#[derive(clap::Args)]
struct RenderStatic {
    /// An apiserver of the cluster: `id=NAME,address=HOST:PORT,discovery=DIR`, where DIR holds
    /// `aggregated_v2.json` (its `/apis` aggregated discovery) and `api__v1.json` (legacy core
    /// v1). Repeat for every apiserver, the local one included.
    #[arg(long = "apiserver", required = true, value_name = "SPEC")]
    apiservers: Vec<String>,
    /// Id of the apiserver this Envoy fronts.
    #[arg(long)]
    local: String,
    /// Address Envoy listens on for clients.
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: String,
    /// Loopback port of Envoy's admin interface.
    #[arg(long, default_value_t = 9901)]
    admin_port: u16,
    /// Path of skewgate_filter.wasm, as Envoy will see it.
    #[arg(long)]
    wasm: PathBuf,
    /// A group-version served from shared storage (a CRD or a service-backed APIService),
    /// never proxied: `GROUP/VERSION`. Repeatable.
    #[arg(long = "shared-storage", value_name = "GROUP/VERSION")]
    shared_storage: Vec<String>,
    /// The apiservers' `--request-timeout` in seconds (kube-apiserver's default is 60). Envoy
    /// gives non-long-running requests 10 s more before answering 503/504 itself.
    #[arg(long, default_value_t = 60, value_name = "SECONDS")]
    request_timeout: u64,
    /// Also listen here for peers (the apiserver's peer-advertise address), passing their
    /// TLS through at L4 to the local apiserver, e.g. `10.0.0.11:6444`.
    #[arg(long)]
    peer_listen: Option<String>,
    /// The apiserver's serving certificate, which Envoy presents to clients in its place.
    #[arg(long, requires = "tls_private_key_file")]
    tls_cert_file: Option<PathBuf>,
    #[arg(long, requires = "tls_cert_file")]
    tls_private_key_file: Option<PathBuf>,
    /// The cluster's client CA: client certificates are optional and verified against it; a
    /// verified one becomes X-Remote-User/X-Remote-Group towards the apiservers.
    #[arg(long, requires = "tls_cert_file")]
    client_ca_file: Option<PathBuf>,
    /// The CA that signed the apiservers' serving certificates (verified with the name
    /// kubernetes.default.svc).
    #[arg(long, requires_all = ["proxy_client_cert_file", "proxy_client_key_file"])]
    peer_ca_file: Option<PathBuf>,
    /// The certificate the apiservers accept for requestheader authentication; it must not
    /// chain to the client CA.
    #[arg(long, requires = "peer_ca_file")]
    proxy_client_cert_file: Option<PathBuf>,
    #[arg(long, requires = "peer_ca_file")]
    proxy_client_key_file: Option<PathBuf>,
    /// Serve clients in plaintext. For tests and demos on loopback only.
    #[arg(long, conflicts_with = "tls_cert_file")]
    insecure_plaintext_listener: bool,
    /// Connect to apiservers in plaintext. For tests and demos on loopback only.
    #[arg(long, conflicts_with = "peer_ca_file")]
    insecure_plaintext_upstreams: bool,
    /// Also write the filter configuration (JSON) to this file.
    #[arg(long)]
    filter_config_out: Option<PathBuf>,
}

struct ApiserverSpec {
    id: String,
    address: Address,
    discovery: PathBuf,
}

fn parse_spec(spec: &str) -> Result<ApiserverSpec> {
    let (mut id, mut address, mut discovery) = (None, None, None);
    for part in spec.split(',') {
        match part.split_once('=') {
            Some(("id", v)) => id = Some(v.to_string()),
            Some(("address", v)) => address = Some(Address::parse(v)?),
            Some(("discovery", v)) => discovery = Some(PathBuf::from(v)),
            _ => {
                bail!("--apiserver {spec:?}: unknown part {part:?} (want id=,address=,discovery=)")
            }
        }
    }
    match (id, address, discovery) {
        (Some(id), Some(address), Some(discovery)) if !id.is_empty() => Ok(ApiserverSpec {
            id,
            address,
            discovery,
        }),
        _ => bail!("--apiserver {spec:?} needs id=, address= and discovery="),
    }
}

fn render_static(args: RenderStatic) -> Result<()> {
    let specs = args
        .apiservers
        .iter()
        .map(|s| parse_spec(s))
        .collect::<Result<Vec<_>>>()?;
    let mut ids = BTreeSet::new();
    for spec in &specs {
        if !ids.insert(spec.id.as_str()) {
            bail!("apiserver {:?} is given twice", spec.id);
        }
    }
    let local = specs
        .iter()
        .find(|s| s.id == args.local)
        .with_context(|| format!("--local {:?} is not one of the --apiserver ids", args.local))?;
    let mut documents = Vec::new();
    for spec in &specs {
        let docs = DiscoveryDocuments::from_dir(&spec.discovery)
            .with_context(|| format!("reading discovery of {}", spec.id))?;
        documents.push((spec.id.clone(), docs));
    }
    let mut local_served = None;
    let mut peers = Vec::new();
    let mut peer_addresses = Vec::new();
    for (spec, (_, docs)) in specs.iter().zip(&documents) {
        let served = docs
            .served()
            .with_context(|| format!("discovery of {}", spec.id))?;
        if spec.id == args.local {
            local_served = Some(served);
        } else {
            peers.push(Peer {
                id: spec.id.clone(),
                served,
            });
            peer_addresses.push((spec.id.clone(), spec.address.clone()));
        }
    }
    let local_served = local_served.context("the local apiserver has no discovery")?;
    let shared_storage = args
        .shared_storage
        .iter()
        .map(|gv| match gv.rsplit_once('/') {
            Some((g, v)) if !v.is_empty() => Ok((g.to_string(), v.to_string())),
            _ => bail!("--shared-storage {gv:?} is not GROUP/VERSION"),
        })
        .collect::<Result<BTreeSet<_>>>()?;

    let mut plan = routing::build(&local_served, &local.id, &peers, &shared_storage);
    let servers: Vec<(String, &DiscoveryDocuments)> =
        documents.iter().map(|(id, d)| (id.clone(), d)).collect();
    match merged::discovery_config(&local.id, &servers) {
        Ok(discovery) => plan.config.discovery = Some(discovery),
        // Routing still works; discovery is then each apiserver's own.
        Err(e) => eprintln!("skewgate-control: warning: {e}"),
    }
    plan.config
        .validate()
        .context("the rendered filter configuration does not validate (a bug)")?;
    if let Some(path) = &args.filter_config_out {
        std::fs::write(path, plan.config.to_json())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let listen = Address::parse_listen(&args.listen)?;
    let peer_listen = args
        .peer_listen
        .as_deref()
        .map(Address::parse)
        .transpose()?;
    let serving = match (&args.tls_cert_file, &args.tls_private_key_file) {
        (Some(cert), Some(key)) => Some(ServingTls {
            cert_file: cert.clone(),
            key_file: key.clone(),
            client_ca_file: args.client_ca_file.clone(),
        }),
        _ if args.insecure_plaintext_listener => None,
        _ => bail!("give --tls-cert-file and --tls-private-key-file (or, on loopback only, --insecure-plaintext-listener)"),
    };
    let upstream = match (&args.peer_ca_file, &args.proxy_client_cert_file, &args.proxy_client_key_file) {
        (Some(ca), Some(cert), Some(key)) => Some(UpstreamTls {
            peer_ca_file: ca.clone(),
            proxy_client_cert_file: cert.clone(),
            proxy_client_key_file: key.clone(),
        }),
        _ if args.insecure_plaintext_upstreams => None,
        _ => bail!("give --peer-ca-file, --proxy-client-cert-file and --proxy-client-key-file (or, on loopback only, --insecure-plaintext-upstreams)"),
    };
    let bootstrap = StaticBootstrap {
        listen: &listen,
        admin_port: args.admin_port,
        wasm_path: &args.wasm,
        local: &local.address,
        peers: &peer_addresses,
        request_timeout: std::time::Duration::from_secs(args.request_timeout),
        serving: serving.as_ref(),
        upstream: upstream.as_ref(),
        peer_listen: peer_listen.as_ref(),
    }
    .render(&plan)?;
    print!("{bootstrap}");
    Ok(())
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Run(args) => skewgate_control::app::cli::run(args),
        Command::Bootstrap(args) => skewgate_control::app::cli::bootstrap(args),
        Command::RenderStatic(args) => render_static(args),
    }
}
