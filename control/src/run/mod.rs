//! `skewgate-control run`: the live control plane beside one Envoy, and `skewgate-control
//! bootstrap`, the Envoy bootstrap that points at it.
//!
//! ```text
//! identity Leases ──► PeerWatcher ──► PeerSet ─┐
//! CRDs, APIServices ─► SharedStorageWatcher ───┤
//!                                              ▼
//!            one ApiserverWatch per apiserver (local + each live peer): discovery
//!                                              ▼
//!        Orchestrator (coalesced): plan::plan (routing table, merged discovery, Envoy resources)
//!                                  + Snapshot::from_plan ──► xds::serve ──► Envoy (delta ADS)
//! ```
//!
//! - [`state`]: the decisions (which watches, the first-sync rule, composition, the skew
//!   matrix) — pure, table-tested;
//! - [`config`]: flags to a validated [`RunConfig`](config::RunConfig) — pure; likewise
//!   [`bootstrap_config`] for `bootstrap`;
//! - [`local_down`]: every client connection told to go away when the local apiserver stays
//!   down;
//! - [`orchestrator`]: the tokio loop; [`status`]: its counters and the `/readyz` and
//!   `/debug/skew` state; [`cli`]: the subcommands, logging and signals.

pub mod bootstrap_config;
pub mod cli;
pub mod config;
pub mod local_down;
pub mod orchestrator;
pub mod retention;
pub mod state;
pub mod state_dir;
pub mod status;

pub use bootstrap_config::BootstrapArgs;
pub use config::RunArgs;
