//! `sim-apiserver`: a simulated kube-apiserver for skewgate's integration tests.
//!
//! It serves discovery verbatim from a fixture folder (aggregated and legacy, with kube's
//! negotiation and caching headers), keeps objects of the served resources
//! (list/get/create/update/patch/delete/watch, Table output for kubectl) in memory or, with
//! `--etcd`, in a real etcd shared with the other simulated apiservers of the cluster (see
//! `store/`), keeps its identity Lease like kube-apiserver (see `lease.rs`), answers unserved
//! paths with kube's `404 page not found`, and echoes what reached it in `x-sim-*` headers.
//! Minimal `/openapi/v3` and `/openapi/v2` documents keep kubectl's client-side validation
//! from failing (see `openapi.rs`).
//! On start (after its lease exists) it prints exactly one line, `listening on <ip:port>`, to
//! stdout. SIGTERM/SIGINT stop it; SIGUSR1 toggles lease renewal.

mod catalog;
mod clock;
mod discovery;
mod discovery_http;
mod fixture;
mod ids;
mod lease;
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
use clap::{Parser, ValueEnum};
use tokio::signal::unix::{signal, SignalKind};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum StorageKind {
    /// This process's own objects (nothing shared).
    Memory,
    /// A real etcd shared by every apiserver given the same `--etcd` and `--etcd-prefix`.
    Etcd,
}

/// A simulated kube-apiserver serving discovery from a fixture and objects from memory or etcd.
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
    /// Storage backend; the default is `etcd` when --etcd is given, else `memory`.
    #[arg(long, value_enum)]
    storage: Option<StorageKind>,
    /// etcd client URL (e.g. http://127.0.0.1:2379).
    #[arg(long)]
    etcd: Option<String>,
    /// Key prefix in etcd (kube-apiserver's --etcd-prefix).
    #[arg(long, default_value = "/registry")]
    etcd_prefix: String,
    /// Do not create, renew or delete an identity lease.
    #[arg(long)]
    no_lease: bool,
    /// The `kubernetes.io/hostname` of the lease and the input of its name (default: --id).
    #[arg(long)]
    hostname: Option<String>,
    /// How often the lease is renewed (kube: 10s). Accepts `500ms`, `1s`, `2m`, or seconds.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    lease_renew_interval: Duration,
    /// Value of the `kubernetes.io/peer-advertise-address` annotation (default: the bound
    /// address). Not validated: tests use it to write hostile values.
    #[arg(long, conflicts_with = "no_peer_advertise_address")]
    peer_advertise_address: Option<String>,
    /// Leave the `kubernetes.io/peer-advertise-address` annotation out.
    #[arg(long)]
    no_peer_advertise_address: bool,
    /// Delete the lease on SIGTERM/SIGINT (kube leaves it to its garbage collector).
    #[arg(long)]
    delete_lease_on_exit: bool,
    /// How often watches that allow bookmarks get one (kube: about a minute).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    bookmark_interval: Duration,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: f64 = num.parse().map_err(|_| format!("bad duration {s:?}"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("bad duration unit in {s:?} (ms, s, m, h)")),
    };
    if !(secs.is_finite() && secs > 0.0) {
        return Err(format!("duration must be positive: {s:?}"));
    }
    Ok(Duration::from_secs_f64(secs))
}

enum Signal {
    Stop,
    ToggleRenewal,
}

async fn next_signal() -> anyhow::Result<Signal> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut usr1 = signal(SignalKind::user_defined1())?;
    Ok(tokio::select! {
        _ = term.recv() => Signal::Stop,
        _ = int.recv() => Signal::Stop,
        _ = usr1.recv() => Signal::ToggleRenewal,
    })
}

async fn open_store(args: &Args) -> anyhow::Result<store::Store> {
    let kind = args.storage.unwrap_or(if args.etcd.is_some() {
        StorageKind::Etcd
    } else {
        StorageKind::Memory
    });
    Ok(match kind {
        StorageKind::Memory => store::Store::memory(),
        StorageKind::Etcd => {
            let url = args
                .etcd
                .as_deref()
                .context("--storage etcd needs --etcd <url>")?;
            store::Store::Etcd(Box::new(
                store::EtcdStore::connect(url, &args.etcd_prefix)
                    .await
                    .with_context(|| format!("connecting to etcd at {url}"))?,
            ))
        }
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let fixture = fixture::Fixture::load(&args.fixture)?;
    let store = open_store(&args).await?;
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let state = Arc::new(server::AppState::new(
        args.id.clone(),
        &fixture,
        &args.git_version,
        store,
        args.bookmark_interval,
        shutdown_rx,
    ));
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let addr = listener.local_addr()?;
    let id = args.id.clone();
    eprintln!("sim-apiserver[{id}] storage: {}", state.store.describe());

    let lease = if args.no_lease {
        None
    } else {
        let peer_address = match (&args.peer_advertise_address, args.no_peer_advertise_address) {
            (_, true) => None,
            (Some(a), false) => Some(a.clone()),
            (None, false) => Some(addr.to_string()),
        };
        let lease = Arc::new(lease::IdentityLease::new(
            &id,
            lease::LeaseOptions {
                hostname: args.hostname.clone().unwrap_or_else(|| id.clone()),
                renew_interval: args.lease_renew_interval,
                peer_address,
                delete_on_exit: args.delete_lease_on_exit,
            },
        ));
        lease
            .renew(&state.store)
            .await
            .map_err(|e| anyhow::anyhow!("creating the identity lease: {e:?}"))?;
        eprintln!(
            "sim-apiserver[{id}] identity lease kube-system/{} holder {}",
            lease.name, lease.holder
        );
        tokio::spawn(lease.clone().run(state.clone()));
        Some(lease)
    };

    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening on {addr}")?;
        out.flush()?;
    }
    let app = axum::Router::new()
        .fallback(server::handle)
        .with_state(state.clone());
    let shutdown = async move {
        loop {
            match next_signal().await {
                Ok(Signal::Stop) => break,
                Ok(Signal::ToggleRenewal) => {
                    if let Some(l) = &lease {
                        let on = l.toggle_renewing();
                        eprintln!(
                            "sim-apiserver[{id}] lease renewal {}",
                            if on { "on" } else { "off" }
                        );
                    }
                }
                Err(e) => {
                    eprintln!("sim-apiserver[{id}] cannot wait for signals: {e}");
                    std::future::pending::<()>().await;
                }
            }
        }
        eprintln!("sim-apiserver[{id}] shutting down");
        if let Some(l) = lease.as_ref().filter(|l| l.delete_on_exit()) {
            let released =
                tokio::time::timeout(Duration::from_secs(3), l.release(&state.store)).await;
            eprintln!("sim-apiserver[{id}] lease deleted: {released:?}");
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("5d").is_err());
        assert!(parse_duration("fast").is_err());
    }
}
