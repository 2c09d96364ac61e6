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

use anyhow::{Context, Result};
use clap::Parser;
use skewgate_control::cli::{Cli, Command};
use skewgate_control::envoy::drain::{self, DrainArgs};

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
        Command::RenderStatic(args) => skewgate_control::static_config::cli::render_static(args),
        Command::DrainEnvoy(args) => drain_envoy(args),
    }
}
