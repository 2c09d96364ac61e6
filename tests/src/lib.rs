//! Harness for skewgate's integration tests and demo: real Envoy loading the release
//! `skewgate_filter.wasm`, in front of simulated apiservers that serve the real fixture
//! discovery documents, on loopback.
//!
//! Every process is killed when its handle drops, so a failing test leaves nothing behind.
//!
//! Everything is re-exported here (`skewgate_tests::Envoy`); the modules hold it by job:
//!
//! | module | what |
//! | --- | --- |
//! | `bootstrap` | the rendered bootstrap (binary protobuf) read and edited as data |
//! | `paths` | the repository, fixtures, the release filter, tool binaries (Envoy, kubectl, Python), `skewgate-control` |
//! | `sim` | simulated apiservers ([`SimApiserver`], [`SimOptions`]) and identity Lease names |
//! | `real` | real kube-apiservers built by `tests/kube/build` ([`real::RealApiserver`]) |
//! | `envoy` | Envoy with the filter ([`Envoy`], [`EnvoyOptions`], [`PeerSpec`], [`Probe`]) |
//! | `etcd` | a real etcd for shared cluster state ([`Etcd`]) |
//! | `pki` | the test PKI ([`TestPki`], [`TestCa`], [`CertFiles`], [`Subject`]) and token users |
//! | `kubeconfig` | kubeconfigs, plain and TLS ([`Credential`]) |
//! | `kubectl` | running real kubectl |
//! | `browser` | a real headless browser (Debian's chromium): DOM and screenshots |
//! | `upgrades` | raw HTTP/1.1 upgrades, WebSocket and SPDY ([`upgrade_request`], [`Upgraded`]) |
//! | `http` | GETs on local channels (Envoy's admin socket), response headers and watch streams |
//! | `net` | free loopback ports and a peer that never answers |
//! | `wait` | polling a condition |

pub mod bootstrap;
mod browser;
mod envoy;
mod etcd;
mod http;
mod kubeconfig;
mod kubectl;
pub mod live;
mod net;
mod paths;
mod pki;
pub mod real;
mod sim;
mod upgrades;
mod wait;

pub use browser::{chromium_bin, dump_dom, screenshot, test_artefacts_dir};
pub use envoy::{
    filter_stat, mixed_cluster, Envoy, EnvoyOptions, PeerSpec, Probe, DEFAULT_REQUEST_TIMEOUT,
};
pub use etcd::Etcd;
pub use http::{client, header, local_get, watch_until};
pub use kubeconfig::{kubeconfig_tls, kubeconfig_yaml, Credential};
pub use kubectl::{kubectl, kubectl_with};
pub use net::{black_hole, free_port, free_ports};
pub use paths::{
    control_bin, data_plane, envoy_bin, etcd_bin, filter_code, filter_code_of, filter_flags,
    fixture, kubectl_1_20_bin, kubectl_bin, native_module_path, python_bin, repo_root, wasm_path,
};
pub use pki::{
    cert_dns_names, cert_serial, replace_file, token_file_csv, CertFiles, CertUsage, Subject,
    TestCa, TestPki, TestToken, FRONT_PROXY_CLIENT_CN, SERVING_NAMES, TEST_TOKENS,
};
pub use sim::{PeerAdvertise, SimApiserver, SimOptions};
/// The simulated apiserver names its identity Lease as kube-apiserver does: the control plane's
/// function, checked against a known name in `tests/tests/leases.rs`.
pub use skewgate_control::peers::identity_lease_name;
pub use upgrades::{
    presented_certificate, upgrade_request, RawTls, UpgradeKind, Upgraded, WEBSOCKET_ACCEPT,
    WEBSOCKET_KEY,
};
pub use wait::{eventually, wait_until};
