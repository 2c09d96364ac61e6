//! `sim-apiserver`: a simulated kube-apiserver for skewgate's integration tests.
//!
//! It serves discovery verbatim from a fixture folder (aggregated and legacy, with kube's
//! negotiation and caching headers), keeps objects of the served resources in memory
//! (list/get/create/update/patch/delete/watch, Table output for kubectl), answers unserved
//! paths with kube's `404 page not found`, and echoes what reached it in `x-sim-*` headers.
//! Minimal `/openapi/v3` and `/openapi/v2` documents keep kubectl's client-side validation
//! from failing (see `openapi.rs`).
//! On start it prints exactly one line, `listening on <ip:port>`, to stdout.

mod catalog;
mod clock;
mod discovery;
mod discovery_http;
mod fixture;
mod ids;
mod negotiate;
mod objects;
mod openapi;
mod patch;
mod resources;
mod respond;
mod router;
mod selectors;
mod server;
mod status;
mod store;
mod table;
mod watch;

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use tokio::signal::unix::{signal, SignalKind};

/// A simulated kube-apiserver serving discovery from a fixture and objects from memory.
#[derive(Parser, Debug)]
#[command(name = "sim-apiserver")]
struct Args {
    /// Apiserver identity (e.g. apiserver-a); echoed in `x-sim-apiserver` and stamped on objects.
    #[arg(long)]
    id: String,
    /// Address to listen on (port 0 picks a free port; the bound address is printed).
    #[arg(long)]
    listen: SocketAddr,
    /// Fixture folder with aggregated_v2.json, api.json and api__v1.json.
    #[arg(long)]
    fixture: PathBuf,
    /// gitVersion reported by /version.
    #[arg(long, default_value = "v1.30.0")]
    git_version: String,
}

async fn wait_for_signal() -> anyhow::Result<()> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let fixture = fixture::Fixture::load(&args.fixture)?;
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let state = Arc::new(server::AppState::new(
        args.id.clone(),
        &fixture,
        &args.git_version,
        shutdown_rx,
    ));
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let addr = listener.local_addr()?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening on {addr}")?;
        out.flush()?;
    }
    let app = axum::Router::new()
        .fallback(server::handle)
        .with_state(state);
    let id = args.id.clone();
    let shutdown = async move {
        if let Err(e) = wait_for_signal().await {
            eprintln!("sim-apiserver[{id}] cannot wait for signals: {e}");
            std::future::pending::<()>().await;
        }
        eprintln!("sim-apiserver[{id}] shutting down");
        let _ = shutdown_tx.send(true);
        // Do not let a stuck connection keep the process alive.
        tokio::spawn(async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            std::process::exit(0);
        });
    };
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}
