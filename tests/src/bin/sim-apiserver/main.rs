//! `sim-apiserver`: a simulated kube-apiserver for skewgate's integration tests.
//!
//! It serves discovery verbatim from a fixture folder (aggregated and legacy, with kube's
//! negotiation and caching headers), keeps objects of the served resources
//! (list/get/create/update/patch/delete/watch, Table output for kubectl) in memory or, with
//! `--etcd`, in a real etcd shared with the other simulated apiservers of the cluster (see
//! `store/`), keeps its identity Lease like kube-apiserver (see `lease.rs`), answers unserved
//! paths with kube's `404 page not found`, and echoes what reached it in `x-sim-*` headers.
//! `/openapi/v3` lists a document per served group-version with kube-openapi's hashes: kube's
//! real document where the OpenAPI fixture folder has it (with strict field validation against
//! its schemas, `validation.rs`), a minimal one otherwise; `/openapi/v2` is empty (see
//! `openapi.rs`).
//! It authenticates like kube-apiserver (requestheader, x509 client certificates, static
//! tokens, anonymous; see `auth.rs`) and answers `selfsubjectreviews` with the caller; with
//! `--tls-cert-file` it serves TLS with ALPN h2/http1.1 (see `tls.rs`), else plain HTTP.
//! exec/attach/portforward upgrade to an echo stream that reports the caller (`upgrade.rs`).
//! A request with `x-sim-delay-ms: N` is answered N ms late (at most a minute; `server.rs`).
//! On start (after its lease exists) it prints exactly one line, `listening on <ip:port>`, to
//! stdout. SIGTERM/SIGINT stop it; SIGUSR1 toggles lease renewal.

mod auth;
mod catalog;
mod clock;
mod discovery;
mod discovery_http;
mod fixture;
mod ids;
mod lease;
mod listen;
mod negotiate;
mod objects;
mod openapi;
mod patch;
mod protobuf;
mod resources;
mod respond;
mod router;
mod selectors;
mod server;
mod status;
mod store;
mod table;
mod tls;
mod upgrade;
mod validation;
mod watch;

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    /// Folder of real OpenAPI v3 documents (`apis__<g>__<v>_openapi.json`) served for the
    /// group-versions the fixture serves; default: `../../openapi/<fixture folder name>`
    /// next to the fixture (`tests/fixtures/openapi/k8s-1.33`), if it exists.
    #[arg(long)]
    openapi_fixture: Option<PathBuf>,
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
    /// Delete the lease on SIGTERM/SIGINT whatever --git-version says. kube-apiserver does
    /// from 1.35 on (its lease controller's Stop, "Cleaning up lease on exit"), which the
    /// simulator follows by its --git-version; before, it left the lease to the lease garbage
    /// collector.
    #[arg(long)]
    delete_lease_on_exit: bool,
    /// Skew the clock the lease's `renewTime` is read from: `-5m` behind, `5m` ahead.
    #[arg(long, default_value = "0s", allow_hyphen_values = true, value_parser = parse_clock_offset)]
    lease_clock_offset: clock::Offset,
    /// How often watches that allow bookmarks get one (kube: about a minute).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    bookmark_interval: Duration,
    /// Reset (drop the connection, answer nothing) every request whose path and query contain
    /// this string: a peer refusing one kind of request while serving the rest.
    #[arg(long)]
    reset_requests_with: Option<String>,
    /// Never answer a request whose path and query contain this string, keeping its
    /// connection up: an apiserver hung on one kind of request.
    #[arg(long)]
    hang_requests_with: Option<String>,
    /// Serve every OpenAPI v3 document changed from the one its `?hash=` names (the root
    /// lists the true hashes; the caching headers stay kube's): a peer that lies.
    #[arg(long)]
    openapi_wrong_documents: bool,
    /// For this long after start, answer `/api` and `/apis` with 503 while serving everything
    /// else: an apiserver back whose discovery cannot be read yet.
    #[arg(long, value_parser = parse_duration)]
    discovery_unavailable_for: Option<Duration>,
    /// For this long after start, answer `/readyz` with 500 (kube's failed-check text) while
    /// serving everything else: an apiserver that listens but is not ready yet.
    #[arg(long, value_parser = parse_duration)]
    not_ready_for: Option<Duration>,
    #[command(flatten)]
    secure: SecureArgs,
}

/// TLS and authentication, with kube-apiserver's flag names. No `--tls-cert-file`: plain HTTP
/// (bearer tokens and anonymous still apply; certificates cannot).
#[derive(clap::Args, Debug)]
struct SecureArgs {
    /// Serving certificate (PEM, the chain after it).
    #[arg(long, requires = "tls_private_key_file")]
    tls_cert_file: Option<PathBuf>,
    /// Serving key (PEM).
    #[arg(long, requires = "tls_cert_file")]
    tls_private_key_file: Option<PathBuf>,
    /// CA bundle for x509 client certificate users (CN = user, O = groups).
    #[arg(long, requires = "tls_cert_file")]
    client_ca_file: Option<PathBuf>,
    /// CA bundle for the front proxy's client certificate (requestheader authentication).
    #[arg(long, requires = "tls_cert_file")]
    requestheader_client_ca_file: Option<PathBuf>,
    /// Common names the front proxy's certificate may have; empty allows any.
    #[arg(long, value_delimiter = ',')]
    requestheader_allowed_names: Vec<String>,
    /// Headers with the user name; the first non-empty wins. (kube's flag has no default;
    /// kubeadm sets X-Remote-User.)
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-User")]
    requestheader_username_headers: Vec<String>,
    /// Headers with the user's UID (kube 1.32+); none by default.
    #[arg(long, value_delimiter = ',')]
    requestheader_uid_headers: Vec<String>,
    /// Headers with groups; every value of every header is one group.
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-Group")]
    requestheader_group_headers: Vec<String>,
    /// Prefixes of headers with extra user info.
    #[arg(long, value_delimiter = ',', default_value = "X-Remote-Extra-")]
    requestheader_extra_headers_prefix: Vec<String>,
    /// Static bearer tokens: CSV `token,user,uid,"group1,group2"`.
    #[arg(long)]
    token_auth_file: Option<PathBuf>,
    /// Requests no authenticator rejected are `system:anonymous`; `--anonymous-auth=false`
    /// answers them 401.
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true",
          action = clap::ArgAction::Set)]
    anonymous_auth: bool,
    /// kube feature gates, `Name=bool,...`. Only `UnauthenticatedHTTP2DOSMitigation` is read
    /// (kube: on by default since 1.29); here it defaults to on with TLS and off in plain HTTP.
    #[arg(long, value_delimiter = ',')]
    feature_gates: Vec<String>,
}

impl SecureArgs {
    fn feature_gate(&self, name: &str) -> anyhow::Result<Option<bool>> {
        let mut value = None;
        for gate in &self.feature_gates {
            let (k, v) = gate
                .split_once('=')
                .with_context(|| format!("--feature-gates: {gate:?} is not Name=bool"))?;
            let v: bool = v
                .trim()
                .parse()
                .with_context(|| format!("--feature-gates: {gate:?} is not Name=bool"))?;
            if k.trim() == name {
                value = Some(v);
            } else {
                eprintln!("sim-apiserver: feature gate {k} is not simulated; ignored");
            }
        }
        Ok(value)
    }

    fn authenticator(&self) -> anyhow::Result<auth::Authenticator> {
        let request_header = match &self.requestheader_client_ca_file {
            None => None,
            Some(path) => Some(auth::RequestHeader {
                ca: auth::CaVerifier::load(path)?,
                allowed_names: self
                    .requestheader_allowed_names
                    .iter()
                    .filter(|n| !n.is_empty())
                    .cloned()
                    .collect(),
                username_headers: self.requestheader_username_headers.clone(),
                uid_headers: self.requestheader_uid_headers.clone(),
                group_headers: self.requestheader_group_headers.clone(),
                extra_prefixes: self.requestheader_extra_headers_prefix.clone(),
            }),
        };
        Ok(auth::Authenticator {
            request_header,
            client_ca: self
                .client_ca_file
                .as_deref()
                .map(auth::CaVerifier::load)
                .transpose()?,
            tokens: self
                .token_auth_file
                .as_deref()
                .map(auth::load_token_file)
                .transpose()?,
            anonymous: self.anonymous_auth,
        })
    }

    fn tls_config(
        &self,
        authn: &auth::Authenticator,
    ) -> anyhow::Result<Option<Arc<rustls::ServerConfig>>> {
        let (Some(cert), Some(key)) = (&self.tls_cert_file, &self.tls_private_key_file) else {
            return Ok(None);
        };
        let wants_certs = authn.client_ca.is_some() || authn.request_header.is_some();
        let hints = wants_certs.then(|| authn.ca_hints());
        Ok(Some(tls::server_config(cert, key, hints)?))
    }
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

fn parse_clock_offset(s: &str) -> Result<clock::Offset, String> {
    clock::Offset::parse(s, parse_duration)
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
    let fixture = fixture::Fixture::load(&args.fixture, args.openapi_fixture.as_deref())?;
    let authn = args.secure.authenticator()?;
    let tls_config = args.secure.tls_config(&authn)?;
    let store = open_store(&args).await?;
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    let mut state = server::AppState::new(
        args.id.clone(),
        &fixture,
        &args.git_version,
        store,
        args.bookmark_interval,
        shutdown_rx,
        args.openapi_wrong_documents,
    );
    state.auth = authn;
    state.reset_requests_with = args.reset_requests_with.clone().filter(|m| !m.is_empty());
    state.hang_requests_with = args.hang_requests_with.clone().filter(|m| !m.is_empty());
    state.discovery_unavailable_until = args.discovery_unavailable_for.map(|d| Instant::now() + d);
    state.not_ready_until = args.not_ready_for.map(|d| Instant::now() + d);
    state.http2_dos_mitigation = args
        .secure
        .feature_gate("UnauthenticatedHTTP2DOSMitigation")?
        .unwrap_or(tls_config.is_some());
    let state = Arc::new(state);
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let addr = listener.local_addr()?;
    let id = args.id.clone();
    eprintln!("sim-apiserver[{id}] storage: {}", state.store.describe());
    eprintln!(
        "sim-apiserver[{id}] serving {}; authenticators: {}",
        if tls_config.is_some() {
            "TLS (h2, http/1.1)"
        } else {
            "plain HTTP"
        },
        describe_auth(&state.auth)
    );

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
                delete_on_exit: args.delete_lease_on_exit
                    || discovery_http::at_least(&args.git_version, 1, 35),
                clock: args.lease_clock_offset,
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
    listen::serve(
        listener,
        tls_config,
        app,
        shutdown,
        format!("sim-apiserver[{}]", args.id),
    )
    .await;
    Ok(())
}

fn describe_auth(a: &auth::Authenticator) -> String {
    let mut parts = Vec::new();
    if let Some(rh) = &a.request_header {
        parts.push(format!(
            "requestheader (CA {}, allowed names {:?})",
            rh.ca.path, rh.allowed_names
        ));
    }
    if let Some(ca) = &a.client_ca {
        parts.push(format!("x509 (CA {})", ca.path));
    }
    if let Some(t) = &a.tokens {
        parts.push(format!("token ({} tokens)", t.len()));
    }
    if a.anonymous {
        parts.push("anonymous".into());
    }
    parts.join(", ")
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
