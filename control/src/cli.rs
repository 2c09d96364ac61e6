//! `skewgate-control`'s command line: one clap [`Cli`] with a subcommand per mode, each with
//! its own `Args`. Here rather than in the binary so that the configuration reference
//! (docs/configuration.md) is generated from these very definitions (`tests/tests/docs.rs`).

use clap::{Parser, Subcommand};

use crate::envoy::drain::DrainArgs;
use crate::run::{BootstrapArgs, RunArgs};
use crate::static_config::cli::RenderStaticArgs;

/// The release and the git commit this binary was built from (`--version`).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (git ",
    env!("SKEWGATE_GIT_COMMIT"),
    ")"
);

#[derive(Parser, Debug)]
#[command(name = "skewgate-control", version = VERSION, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the live control plane beside one Envoy (identity Leases, live discovery, xDS).
    Run(RunArgs),
    /// Print the Envoy bootstrap for `run` (listener, its TLS, the xDS connection).
    Bootstrap(BootstrapArgs),
    /// Write an Envoy configuration with a fixed routing table from saved discovery documents.
    RenderStatic(RenderStaticArgs),
    /// Drain Envoy, then stop it: /readyz fails and clients are told to reconnect, the ports
    /// close after --drain-seconds, Envoy exits once no client request is in flight (at most
    /// --finish-seconds later). What Envoy's entrypoint runs on SIGTERM.
    DrainEnvoy(DrainArgs),
}
