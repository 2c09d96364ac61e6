//! Renders `envoy/dynamic-bootstrap.yaml`, the Envoy bootstrap of the live mode.
//!
//! The template carries every Envoy setting with the reason for it; this module only fills in
//! the listener, admin and control-plane addresses, the node id and the short request timeout.
//! Clusters and the filter configuration are not in the bootstrap: they come over ADS.

use std::time::Duration;

use super::XdsError;
use crate::bootstrap::{Address, REQUEST_TIMEOUT_MARGIN};

const TEMPLATE: &str = include_str!("../../../envoy/dynamic-bootstrap.yaml");

/// What the live-mode bootstrap needs.
#[derive(Debug, Clone)]
pub struct DynamicBootstrap<'a> {
    pub listen: &'a Address,
    pub admin_port: u16,
    /// Where the control plane serves ADS (loopback, beside Envoy).
    pub xds: &'a Address,
    /// This Envoy's node id (for the control plane's logs).
    pub node_id: &'a str,
    /// The apiservers' `--request-timeout` (see [`crate::bootstrap::StaticBootstrap`]).
    pub request_timeout: Duration,
}

impl DynamicBootstrap<'_> {
    pub fn render(&self) -> Result<String, XdsError> {
        let node_ok = !self.node_id.is_empty()
            && self.node_id.len() <= 253
            && self
                .node_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | ':'));
        if !node_ok {
            return Err(XdsError::Unsafe("the node id"));
        }
        Ok(TEMPLATE
            .replace("{{node_id}}", &format!("\"{}\"", self.node_id))
            .replace("{{admin_port}}", &self.admin_port.to_string())
            .replace("{{listen_address}}", &quoted_host(self.listen))
            .replace("{{listen_port}}", &self.listen.port.to_string())
            .replace("{{xds_address}}", &quoted_host(self.xds))
            .replace("{{xds_port}}", &self.xds.port.to_string())
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

    #[test]
    fn renders_every_placeholder() {
        let listen = Address::parse_listen("10.0.0.11:6443").expect("listen");
        let xds = Address::parse("127.0.0.1:18000").expect("xds");
        let yaml = DynamicBootstrap {
            listen: &listen,
            admin_port: 9901,
            xds: &xds,
            node_id: "apiserver-a",
            request_timeout: Duration::from_secs(60),
        }
        .render()
        .expect("renders");
        assert!(!yaml.replace("{{...}}", "").contains("{{"), "{yaml}");
        for want in [
            "id: \"apiserver-a\"",
            "address: \"10.0.0.11\", port_value: 6443",
            "address: \"127.0.0.1\", port_value: 18000",
            "port_value: 9901",
            "timeout: 70s",
            "api_type: DELTA_GRPC",
            "initial_fetch_timeout: 0s",
            "type_urls: [type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm]",
            "validate_clusters: false",
        ] {
            assert!(yaml.contains(want), "{want} missing");
        }
        // The filter keeps its name: ECDS resources are looked up by it.
        assert!(yaml.contains(&format!("- name: {}\n", super::super::FILTER_NAME)));
    }

    #[test]
    fn refuses_unsafe_node_ids() {
        let a = Address::parse("127.0.0.1:1").expect("address");
        for bad in ["", "a b", "a\"b", "a\nb"] {
            let r = DynamicBootstrap {
                listen: &a,
                admin_port: 0,
                xds: &a,
                node_id: bad,
                request_timeout: Duration::from_secs(60),
            }
            .render();
            assert!(r.is_err(), "{bad:?}");
        }
    }
}
