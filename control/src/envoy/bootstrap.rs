//! Renders `envoy/bootstrap.yaml`, the one Envoy bootstrap of both modes.
//!
//! The template carries every Envoy setting with the reason for it; this module only fills in
//! the listener (and its TLS), the admin address (a Unix socket by default,
//! [`crate::local_channels`]), the node id, the short request timeout, the
//! optional peer port, and where the clusters and the filter configuration come from
//! ([`ConfigSource`]: the control plane's ADS stream, or files beside the bootstrap).

use std::path::Path;
use std::time::Duration;

use super::fallback::{
    default_filter_config, envoy_duration, static_clusters, FallbackInputs, Waits, MIN_WAIT,
};
use super::secrets::{sds_secret_config_json, CLIENT_CA_SECRET, SERVING_SECRET};
use super::{checked_path, Address, EnvoyError, ServingTls, REQUEST_TIMEOUT_MARGIN};
use crate::local_channels::{LocalChannel, SOCKET_MODE};

const TEMPLATE: &str = include_str!("../../../envoy/bootstrap.yaml");

/// Where Envoy gets its clusters (CDS) and the filter configuration (ECDS).
#[derive(Debug, Clone, Copy)]
pub enum ConfigSource<'a> {
    /// The live mode: one delta ADS stream from the control plane beside Envoy, on this
    /// channel ([`crate::local_channels`]).
    Ads { xds: &'a LocalChannel },
    /// The static mode: files in this directory ([`crate::xds::files`]), which Envoy reads at
    /// start and re-reads when they are replaced.
    Files { dir: &'a Path },
}

/// What the bootstrap needs.
#[derive(Debug, Clone)]
pub struct Bootstrap<'a> {
    pub listen: &'a Address,
    /// Envoy's admin interface: a Unix socket Envoy creates with mode 0600, or loopback TCP.
    pub admin: &'a LocalChannel,
    pub config_source: ConfigSource<'a>,
    /// This Envoy's node id (for the control plane's logs).
    pub node_id: &'a str,
    /// The apiservers' `--request-timeout`: Envoy bounds non-long-running requests by
    /// [`REQUEST_TIMEOUT_MARGIN`] more.
    pub request_timeout: Duration,
    /// TLS for clients; `None` serves plaintext (tests and demos on loopback only).
    pub serving: Option<&'a ServingTls>,
    /// Where the SDS files of [`Bootstrap::serving`] are (absolute; written with
    /// [`super::secrets::serving_secrets`] and [`crate::xds::files::write_secrets`]). Needed
    /// with `serving`.
    pub sds_dir: Option<&'a Path>,
    /// The L4 peer port, if any.
    pub peer: Option<PeerPassthrough<'a>>,
    /// What Envoy serves when the control plane has not configured it within a bounded wait
    /// (live mode only); `None`: it waits for as long as it takes, its ports closed.
    pub fallback: Option<FallbackInputs<'a>>,
}

/// The peer port: TLS passed through at L4 to the apiserver this Envoy fronts, so peers reach
/// the apiserver itself (docs/ARCHITECTURE.md "Deployment topology").
#[derive(Debug, Clone, Copy)]
pub struct PeerPassthrough<'a> {
    /// Where Envoy listens for peers (the peer-advertise address).
    pub listen: &'a Address,
    /// Where the apiserver listens (`127.0.0.1:6443` when it binds loopback).
    pub apiserver: &'a Address,
    /// Who may connect: the other control-plane nodes (never empty).
    pub allowed_sources: &'a [ipnet::IpNet],
}

/// Keep or drop the lines between `# {{#name}}` and `# {{/name}}`; the marker lines always go.
fn section(template: &str, name: &str, keep: bool) -> String {
    let (open, close) = (format!("# {{{{#{name}}}}}"), format!("# {{{{/{name}}}}}"));
    let mut inside = false;
    let mut out = String::with_capacity(template.len());
    for line in template.split_inclusive('\n') {
        let trimmed = line.trim();
        if trimmed == open {
            inside = true;
        } else if trimmed == close {
            inside = false;
        } else if keep || !inside {
            out.push_str(line);
        }
    }
    out
}

/// The filter chain's name and `transport_socket`, as YAML (the socket in one line of JSON
/// flow). The certificate, key and client CA come through SDS from the files in `sds_dir`
/// ([`super::secrets`]), so that renewed files take effect without a restart.
fn downstream_tls(
    serving: Option<&ServingTls>,
    sds_dir: Option<&Path>,
) -> Result<String, EnvoyError> {
    let Some(tls) = serving else {
        return Ok("name: plaintext".to_string());
    };
    let dir = sds_dir.ok_or(EnvoyError::NoSdsDir)?;
    let mut common = serde_json::json!({
        "alpn_protocols": ["h2", "http/1.1"],
        "tls_certificate_sds_secret_configs": [sds_secret_config_json(dir, SERVING_SECRET)?],
    });
    if tls.client_ca_file.is_some() {
        common["validation_context_sds_secret_config"] =
            sds_secret_config_json(dir, CLIENT_CA_SECRET)?;
    }
    let socket = serde_json::json!({
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
            // Optional, as on kube-apiserver: token and anonymous clients present none. A
            // certificate that is presented must verify, or the handshake fails.
            "require_client_certificate": false,
            "common_tls_context": common,
        }
    });
    Ok(format!("name: tls\n      transport_socket: {socket}"))
}

/// A local channel as an Envoy `Address`, in YAML flow. `bind`: Envoy listens on it, and
/// creates a socket with mode [`SOCKET_MODE`].
fn local_address(channel: &LocalChannel, bind: bool) -> Result<String, EnvoyError> {
    Ok(match channel {
        LocalChannel::Unix(path) => {
            let path = checked_path(path, "the socket path")?;
            let pipe = if bind {
                serde_json::json!({ "mode": SOCKET_MODE, "path": path })
            } else {
                serde_json::json!({ "path": path })
            };
            serde_json::json!({ "pipe": pipe }).to_string()
        }
        LocalChannel::Tcp(address) => serde_json::json!({ "socket_address": {
            "address": address.ip().to_string(),
            "port_value": address.port(),
        }})
        .to_string(),
    })
}

/// A config source in YAML flow: ADS, or one file of `dir`.
fn config_source(source: ConfigSource<'_>, file: &str) -> Result<String, EnvoyError> {
    Ok(match source {
        ConfigSource::Ads { .. } => "ads: {}".to_string(),
        ConfigSource::Files { dir } => {
            let path = checked_path(dir, "the configuration directory")?;
            format!(
                "path_config_source: {}",
                serde_json::json!({ "path": format!("{}/{file}", path.trim_end_matches('/')) })
            )
        }
    })
}

impl Bootstrap<'_> {
    pub fn render(&self) -> Result<String, EnvoyError> {
        let node_ok = !self.node_id.is_empty()
            && self.node_id.len() <= 253
            && self
                .node_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | ':'));
        if !node_ok {
            return Err(EnvoyError::Unsafe("the node id"));
        }
        let downstream_tls = downstream_tls(self.serving, self.sds_dir)?;
        let mut template = section(TEMPLATE, "peer_listener", self.peer.is_some());
        template = section(&template, "fallback", self.fallback.is_some());
        let waits = match &self.fallback {
            None => Waits::FOREVER,
            Some(fallback) => {
                if !matches!(self.config_source, ConfigSource::Ads { .. }) {
                    return Err(EnvoyError::Fallback(
                        "the static mode has no control plane to wait for",
                    ));
                }
                if fallback.wait < MIN_WAIT {
                    return Err(EnvoyError::Fallback(
                        "the wait must be at least 2ms (0: no fallback)",
                    ));
                }
                let clusters: Vec<String> = static_clusters(fallback)?
                    .iter()
                    .map(|c| format!("- {c}"))
                    .collect();
                template = template
                    .replace("{{fallback_clusters}}", &clusters.join("\n  "))
                    .replace(
                        "{{filter_default_config}}",
                        &default_filter_config(fallback)?.to_string(),
                    );
                Waits::split(fallback.wait)
            }
        };
        template = template
            .replace("{{clusters_wait}}", &envoy_duration(waits.clusters))
            .replace("{{filter_wait}}", &envoy_duration(waits.filter));
        template = section(
            &template,
            "ads",
            matches!(self.config_source, ConfigSource::Ads { .. }),
        );
        if let Some(peer) = &self.peer {
            let discovery_type = if peer.apiserver.is_ip() {
                "STATIC"
            } else {
                "STRICT_DNS"
            };
            if peer.allowed_sources.is_empty() {
                return Err(EnvoyError::Unsafe("a peer port open to every source"));
            }
            let principals: Vec<serde_json::Value> = peer
                .allowed_sources
                .iter()
                .map(|net| {
                    serde_json::json!({ "direct_remote_ip": {
                        "address_prefix": net.network().to_string(),
                        "prefix_len": net.prefix_len(),
                    }})
                })
                .collect();
            template = template
                .replace(
                    "{{peer_principals}}",
                    &serde_json::Value::from(principals).to_string(),
                )
                .replace("{{peer_listen_address}}", &quoted_host(peer.listen))
                .replace("{{peer_listen_port}}", &peer.listen.port.to_string())
                .replace("{{apiserver_address}}", &quoted_host(peer.apiserver))
                .replace("{{apiserver_port}}", &peer.apiserver.port.to_string())
                .replace("{{apiserver_discovery_type}}", discovery_type);
        }
        if let ConfigSource::Ads { xds } = self.config_source {
            template = template.replace("{{xds_address}}", &local_address(xds, false)?);
        }
        Ok(template
            .replace("{{downstream_tls}}", &downstream_tls)
            .replace("{{node_id}}", &format!("\"{}\"", self.node_id))
            .replace("{{admin_address}}", &local_address(self.admin, true)?)
            .replace("{{listen_address}}", &quoted_host(self.listen))
            .replace("{{listen_port}}", &self.listen.port.to_string())
            .replace(
                "{{clusters_config_source}}",
                &config_source(self.config_source, crate::xds::files::CLUSTERS_FILE)?,
            )
            .replace(
                "{{filter_config_source}}",
                &config_source(self.config_source, crate::xds::files::FILTER_FILE)?,
            )
            .replace(
                "{{short_request_timeout}}",
                &format!(
                    "{}s",
                    (self.request_timeout + REQUEST_TIMEOUT_MARGIN).as_secs()
                ),
            ))
    }
}

/// `Address` only admits hosts of letters, digits, `.`, `-` and `:`: safe in double quotes.
fn quoted_host(address: &Address) -> String {
    format!("\"{}\"", address.host)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local_channels::LocalChannels;

    /// Every label the filter writes into a stat name has its tag regex, and nothing else does.
    #[test]
    fn tags_every_filter_label() {
        let tags: Vec<&str> = TEMPLATE
            .lines()
            .filter_map(|l| l.trim().strip_prefix("- { tag_name: "))
            .collect();
        let want: Vec<String> = skewgate_core::metrics::LABELS
            .iter()
            .map(|l| format!("{l}, regex: \"(;{l}=([^;]*))\" }}"))
            .collect();
        assert_eq!(tags, want);
    }

    #[test]
    fn renders_every_placeholder() {
        let listen = Address::parse_listen("10.0.0.11:6443").expect("listen");
        let channels = LocalChannels::unix(Path::new("/run/skewgate")).expect("channels");
        let yaml = Bootstrap {
            listen: &listen,
            admin: channels.admin(),
            config_source: ConfigSource::Ads {
                xds: channels.xds(),
            },
            node_id: "apiserver-a",
            request_timeout: Duration::from_secs(60),
            serving: None,
            sds_dir: None,
            peer: None,
            fallback: None,
        }
        .render()
        .expect("renders");
        assert!(!yaml.replace("{{...}}", "").contains("{{"), "{yaml}");
        for want in [
            "id: \"apiserver-a\"",
            "address: \"10.0.0.11\", port_value: 6443",
            // Admin and xDS on Unix sockets only the owner may open; Envoy binds admin.
            r#"address: {"pipe":{"mode":384,"path":"/run/skewgate/envoy-admin.sock"}}"#,
            r#"endpoint: { address: {"pipe":{"path":"/run/skewgate/xds.sock"}} }"#,
            "timeout: 70s",
            "api_type: DELTA_GRPC",
            "initial_fetch_timeout: 0s",
            "type_urls: [type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm]",
            "validate_clusters: false",
            "- name: plaintext\n      filters:",
            "cluster_header: x-skewgate-upstream-cluster",
            "direct_response:",
            "\"reason\":\"ServiceUnavailable\",\"code\":503}'",
        ] {
            assert!(yaml.contains(want), "{want} missing");
        }
        assert!(!yaml.contains("port_value: 9901") && !yaml.contains("port_value: 18000"));
        // Every route goes through the filter's header: none names a cluster itself.
        assert!(!yaml.contains("cluster: skewgate-local"), "{yaml}");
        assert!(!yaml.contains("transport_socket"));
        // No peer port unless asked for; no section marker is ever left.
        assert!(
            !yaml.contains("stat_prefix: peer") && !yaml.contains("skewgate-local-passthrough")
        );
        assert!(!yaml.contains("{{#") && !yaml.contains("{{/"));
        // The filter keeps its name: ECDS resources are looked up by it.
        assert!(yaml.contains(&format!("- name: {}\n", super::super::FILTER_NAME)));
    }

    #[test]
    fn the_static_mode_reads_the_same_resources_from_files() {
        let listen = Address::parse_listen("127.0.0.1:0").expect("listen");
        let admin = LocalChannel::Unix("/var/lib/skewgate/envoy-admin.sock".into());
        let render = |dir: &str| {
            Bootstrap {
                listen: &listen,
                admin: &admin,
                config_source: ConfigSource::Files {
                    dir: Path::new(dir),
                },
                node_id: "skewgate-static",
                request_timeout: Duration::from_secs(60),
                serving: None,
                sds_dir: None,
                peer: None,
                fallback: None,
            }
            .render()
        };
        let yaml = render("/var/lib/skewgate/").expect("renders");
        assert!(!yaml.replace("{{...}}", "").contains("{{"), "{yaml}");
        assert!(
            yaml.contains(r#"path_config_source: {"path":"/var/lib/skewgate/clusters.pb"}"#),
            "{yaml}"
        );
        assert!(
            yaml.contains(r#"path_config_source: {"path":"/var/lib/skewgate/filter.pb"}"#),
            "{yaml}"
        );
        // No control plane: no ADS stream, no cluster for it, nothing else differs.
        assert!(!yaml.contains("ads_config") && !yaml.contains("ads: {}"));
        assert!(!yaml.contains("name: skewgate-control"));
        assert!(yaml.contains("initial_fetch_timeout: 0s"));
        assert!(matches!(render("/a\nb"), Err(EnvoyError::Unsafe(_))));
    }

    #[test]
    fn refuses_unsafe_node_ids() {
        let a = Address::parse("127.0.0.1:1").expect("address");
        let channel = LocalChannel::Tcp("127.0.0.1:1".parse().expect("address"));
        for bad in ["", "a b", "a\"b", "a\nb"] {
            let r = Bootstrap {
                listen: &a,
                admin: &channel,
                config_source: ConfigSource::Ads { xds: &channel },
                node_id: bad,
                request_timeout: Duration::from_secs(60),
                serving: None,
                sds_dir: None,
                peer: None,
                fallback: None,
            }
            .render();
            assert!(r.is_err(), "{bad:?}");
        }
    }

    #[test]
    fn serves_tls_with_optional_client_certificates() {
        let listen = Address::parse_listen("10.0.0.11:6443").expect("listen");
        let channels = LocalChannels::tcp(9901, "127.0.0.1:18000".parse().expect("xds"));
        let mut serving = ServingTls {
            cert_file: "/etc/kubernetes/pki/apiserver.crt".into(),
            key_file: "/etc/kubernetes/pki/apiserver.key".into(),
            client_ca_file: Some("/etc/kubernetes/pki/ca.crt".into()),
        };
        let render = |serving: &ServingTls, sds_dir: Option<&str>| {
            Bootstrap {
                listen: &listen,
                admin: channels.admin(),
                config_source: ConfigSource::Ads {
                    xds: channels.xds(),
                },
                node_id: "apiserver-a",
                request_timeout: Duration::from_secs(60),
                serving: Some(serving),
                sds_dir: sds_dir.map(Path::new),
                peer: None,
                fallback: None,
            }
            .render()
        };
        let yaml = render(&serving, Some("/var/lib/skewgate/sds")).expect("renders");
        // --insecure-tcp-local-channels: admin and xDS on loopback TCP.
        assert!(yaml
            .contains(r#"address: {"socket_address":{"address":"127.0.0.1","port_value":9901}}"#));
        assert!(yaml.contains(
            r#"endpoint: { address: {"socket_address":{"address":"127.0.0.1","port_value":18000}}"#
        ));
        assert!(!yaml.contains("pipe"));
        let line = yaml
            .lines()
            .find_map(|l| l.trim().strip_prefix("transport_socket: "))
            .expect("a transport socket");
        let socket: serde_json::Value = serde_json::from_str(line).expect("JSON flow");
        let ctx = &socket["typed_config"];
        assert_eq!(
            ctx["@type"],
            "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext"
        );
        assert_eq!(ctx["require_client_certificate"], false);
        let common = &ctx["common_tls_context"];
        assert_eq!(
            common["alpn_protocols"],
            serde_json::json!(["h2", "http/1.1"])
        );
        // The certificate and the client CA come through SDS from files (rotation without a
        // restart), exactly as the clusters name theirs.
        let sds = |name: &str| {
            super::super::secrets::sds_secret_config_json(Path::new("/var/lib/skewgate/sds"), name)
                .expect("sds")
        };
        assert_eq!(
            common["tls_certificate_sds_secret_configs"],
            serde_json::json!([sds(SERVING_SECRET)])
        );
        assert_eq!(
            common["tls_certificate_sds_secret_configs"][0]["sds_config"]["path_config_source"]
                ["path"],
            "/var/lib/skewgate/sds/skewgate-serving.pb"
        );
        assert_eq!(
            common["validation_context_sds_secret_config"],
            sds(CLIENT_CA_SECRET)
        );
        // No file is named inline: Envoy would read it once and never again.
        assert!(!yaml.contains("filename") && !yaml.contains("tls_certificates"));
        assert!(yaml.contains("- name: tls\n      transport_socket: {"));

        // Without a client CA no certificate is requested.
        serving.client_ca_file = None;
        let yaml = render(&serving, Some("/sds")).expect("renders");
        assert!(!yaml.contains("validation_context"));

        assert!(matches!(render(&serving, None), Err(EnvoyError::NoSdsDir)));
        assert!(matches!(
            render(&serving, Some("/sds\n")),
            Err(EnvoyError::Unsafe(_))
        ));
    }

    #[test]
    fn the_peer_port_passes_tls_through_to_the_apiserver() {
        let listen = Address::parse_listen("10.0.0.11:6443").expect("listen");
        let peer_listen = Address::parse_listen("10.0.0.11:6444").expect("peer");
        let apiserver = Address::parse("127.0.0.1:6443").expect("apiserver");
        let channels = LocalChannels::unix(Path::new("/run/skewgate")).expect("channels");
        let yaml = Bootstrap {
            listen: &listen,
            admin: channels.admin(),
            config_source: ConfigSource::Ads {
                xds: channels.xds(),
            },
            node_id: "cp-1",
            request_timeout: Duration::from_secs(60),
            serving: None,
            sds_dir: None,
            peer: Some(PeerPassthrough {
                listen: &peer_listen,
                apiserver: &apiserver,
                allowed_sources: &["10.0.0.0/24".parse().expect("cidr")],
            }),
            fallback: None,
        }
        .render()
        .expect("renders");
        for want in [
            "- name: peer\n",
            "address: \"10.0.0.11\", port_value: 6444",
            "envoy.filters.network.tcp_proxy",
            "cluster: skewgate-local-passthrough",
            "type: STATIC\n",
            "address: \"127.0.0.1\", port_value: 6443",
            "envoy.filters.network.rbac",
            r#"principals: [{"direct_remote_ip":{"address_prefix":"10.0.0.0","prefix_len":24}}]"#,
        ] {
            assert!(yaml.contains(want), "{want} missing:\n{yaml}");
        }
        assert!(!yaml.replace("{{...}}", "").contains("{{"), "{yaml}");
    }

    #[test]
    fn sections() {
        let t = "a\n  # {{#x}}\n  b\n  # {{/x}}\nc\n";
        assert_eq!(section(t, "x", true), "a\n  b\nc\n");
        assert_eq!(section(t, "x", false), "a\nc\n");
        assert_eq!(section(t, "y", false), t);
    }

    #[test]
    fn the_fallback_is_rendered_only_with_a_control_plane_to_wait_for() {
        let listen = Address::parse_listen("127.0.0.1:0").expect("listen");
        let admin = LocalChannel::Unix("/run/skewgate/envoy-admin.sock".into());
        let xds = LocalChannel::Unix("/run/skewgate/xds.sock".into());
        let local = Address::parse("127.0.0.1:6443").expect("local");
        let fallback = |wait| FallbackInputs {
            wait,
            wasm_path: Path::new("/opt/skewgate.wasm"),
            local: &local,
            upstream_sds: None,
            local_apiserver: "cp-1",
            acknowledged: None,
        };
        let render = |config_source, fallback| {
            Bootstrap {
                listen: &listen,
                admin: &admin,
                config_source,
                node_id: "cp-1",
                request_timeout: Duration::from_secs(60),
                serving: None,
                sds_dir: None,
                peer: None,
                fallback,
            }
            .render()
        };
        let ads = ConfigSource::Ads { xds: &xds };
        let yaml = render(ads, Some(fallback(Duration::from_secs(3)))).expect("renders");
        assert!(!yaml.replace("{{...}}", "").contains("{{"), "{yaml}");
        assert_eq!(
            yaml.matches("initial_fetch_timeout: 1.500000000s").count(),
            2
        );
        assert_eq!(
            yaml.matches(r#""name":"skewgate-fallback-local-"#).count(),
            3,
            "{yaml}"
        );
        assert_eq!(yaml.matches("\n              default_config: {").count(), 1);
        // No control plane to wait for, or a wait Envoy would read as "forever": refused.
        let files = ConfigSource::Files {
            dir: Path::new("/var/lib/skewgate"),
        };
        assert!(matches!(
            render(files, Some(fallback(Duration::from_secs(3)))),
            Err(EnvoyError::Fallback(_))
        ));
        assert!(matches!(
            render(ads, Some(fallback(Duration::from_millis(1)))),
            Err(EnvoyError::Fallback(_))
        ));
    }
}
