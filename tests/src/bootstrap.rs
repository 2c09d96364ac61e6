//! The YAML bootstrap `skewgate-control` renders, read and edited as data (the messages, read
//! and written by `skewgate_control::envoy::yaml`): what a test checks in it, and the edits the
//! tests and the benchmark make (never as text).

use std::path::Path;

use anyhow::{anyhow, Context, Result};
use envoy_types::pb::envoy::config::bootstrap::v3::Bootstrap;
use envoy_types::pb::envoy::config::core::v3::{
    address, config_source::ConfigSourceSpecifier, ConfigSource, SocketAddress,
};
use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType as FilterConfigType;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_filter, HttpConnectionManager,
};
use envoy_types::util::pack_any;
use prost::Message;
use skewgate_control::envoy::yaml;

/// What an edit writes in the first line of the file it changes.
const EDITOR: &str = "bootstrap-edit";

/// Read a rendered bootstrap.
pub fn decode(bytes: &[u8]) -> Result<Bootstrap> {
    read(bytes).context("the bootstrap is not an Envoy Bootstrap message")
}

/// A message of a rendered file (YAML).
pub fn read<M: Message + prost::Name + Default>(bytes: &[u8]) -> Result<M> {
    Ok(yaml::from_yaml(std::str::from_utf8(bytes)?)?)
}

/// A message as a rendered file is (YAML), after a first line naming the edit.
pub fn write<M: Message + prost::Name>(message: &M) -> Result<Vec<u8>> {
    Ok(yaml::to_yaml(message, EDITOR)?.into_bytes())
}

/// `host:port` of every listener, by name.
pub fn listener_addresses(b: &Bootstrap) -> Vec<(String, String)> {
    b.static_resources
        .iter()
        .flat_map(|s| &s.listeners)
        .map(|l| {
            let address = match l.address.as_ref().and_then(|a| a.address.as_ref()) {
                Some(address::Address::SocketAddress(SocketAddress {
                    address,
                    port_specifier: Some(port),
                    ..
                })) => {
                    let envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier::PortValue(port) = port
                    else {
                        return (l.name.clone(), address.clone());
                    };
                    format!("{address}:{port}")
                }
                Some(address::Address::Pipe(pipe)) => pipe.path.clone(),
                _ => String::new(),
            };
            (l.name.clone(), address)
        })
        .collect()
}

/// The names of the static clusters.
pub fn cluster_names(b: &Bootstrap) -> Vec<String> {
    b.static_resources
        .iter()
        .flat_map(|s| &s.clusters)
        .map(|c| c.name.clone())
        .collect()
}

fn hcm(b: &Bootstrap) -> Result<HttpConnectionManager> {
    let chain = b
        .static_resources
        .iter()
        .flat_map(|s| &s.listeners)
        .flat_map(|l| &l.filter_chains)
        .next()
        .ok_or_else(|| anyhow!("no filter chain"))?;
    let Some(FilterConfigType::TypedConfig(any)) =
        chain.filters.first().and_then(|f| f.config_type.as_ref())
    else {
        return Err(anyhow!("no HTTP connection manager"));
    };
    Ok(HttpConnectionManager::decode(any.value.as_slice())?)
}

fn set_hcm(b: &mut Bootstrap, hcm: &HttpConnectionManager) -> Result<()> {
    let filter = b
        .static_resources
        .iter_mut()
        .flat_map(|s| &mut s.listeners)
        .flat_map(|l| &mut l.filter_chains)
        .next()
        .and_then(|c| c.filters.first_mut())
        .ok_or_else(|| anyhow!("no filter chain"))?;
    filter.config_type = Some(FilterConfigType::TypedConfig(pack_any(hcm.clone())));
    Ok(())
}

/// The bootstrap without the HTTP filter `name` (the benchmark's skewgate bootstrap without
/// its filter).
pub fn without_http_filter(bytes: &[u8], name: &str) -> Result<Vec<u8>> {
    let mut b = decode(bytes)?;
    let mut hcm = hcm(&b)?;
    let before = hcm.http_filters.len();
    hcm.http_filters.retain(|f| f.name != name);
    if hcm.http_filters.len() == before {
        return Err(anyhow!("the bootstrap has no HTTP filter {name:?}"));
    }
    set_hcm(&mut b, &hcm)?;
    write(&b)
}

/// The static mode's clusters file (one `DiscoveryResponse` of clusters) with every HTTP
/// health check made over HTTP/2 (h2c): the benchmark's TLS variants reach a static nginx that
/// speaks only h2c, where a kube-apiserver answers both protocols.
pub fn health_checks_over_http2(bytes: &[u8]) -> Result<Vec<u8>> {
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use envoy_types::pb::envoy::config::core::v3::health_check::HealthChecker;
    use envoy_types::pb::envoy::r#type::v3::CodecClientType;
    use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
    let mut response: DiscoveryResponse = read(bytes).context("a DiscoveryResponse")?;
    let mut edited = 0;
    for resource in &mut response.resources {
        let mut cluster = Cluster::decode(resource.value.as_slice()).context("a Cluster")?;
        for check in &mut cluster.health_checks {
            if let Some(HealthChecker::HttpHealthCheck(http)) = check.health_checker.as_mut() {
                http.codec_client_type = CodecClientType::Http2 as i32;
                edited += 1;
            }
        }
        resource.value = cluster.encode_to_vec();
    }
    if edited == 0 {
        return Err(anyhow!("no HTTP health check in the clusters"));
    }
    write(&response)
}

fn relocate_source(source: Option<&mut ConfigSource>, from: &Path, to: &Path) {
    if let Some(ConfigSourceSpecifier::PathConfigSource(file)) =
        source.and_then(|s| s.config_source_specifier.as_mut())
    {
        if let Ok(rest) = Path::new(&file.path).strip_prefix(from) {
            file.path = to.join(rest).display().to_string();
        }
    }
}

/// A static-mode bootstrap that reads its clusters and filter configuration from `to` instead
/// of `from` (a copy of the directory with edited files).
pub fn relocate_static(bytes: &[u8], from: &Path, to: &Path) -> Result<Vec<u8>> {
    let mut b = decode(bytes)?;
    relocate_source(
        b.dynamic_resources
            .as_mut()
            .and_then(|d| d.cds_config.as_mut()),
        from,
        to,
    );
    let mut hcm = hcm(&b)?;
    for filter in &mut hcm.http_filters {
        if let Some(http_filter::ConfigType::ConfigDiscovery(discovery)) = &mut filter.config_type {
            relocate_source(discovery.config_source.as_mut(), from, to);
        }
    }
    set_hcm(&mut b, &hcm)?;
    write(&b)
}

/// The static mode's filter file (`filter.yaml`: one `DiscoveryResponse` of the filter's
/// `TypedExtensionConfig`) with `edit` applied to the configuration the filter reads (its JSON,
/// a `StringValue` inside the wasm or the native filter's message), as data.
pub fn edit_filter_config(bytes: &[u8], edit: impl Fn(&str) -> String) -> Result<Vec<u8>> {
    use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
    use envoy_types::pb::envoy::extensions::filters::http::dynamic_modules::v3::DynamicModuleFilter;
    use envoy_types::pb::envoy::extensions::filters::http::wasm::v3::Wasm;
    use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
    use envoy_types::pb::google::protobuf::{Any, StringValue};
    let edit_any = |any: &mut Any| -> Result<()> {
        let mut config = StringValue::decode(any.value.as_slice())?;
        config.value = edit(&config.value);
        *any = pack_any(config);
        Ok(())
    };
    let mut response: DiscoveryResponse = read(bytes).context("a DiscoveryResponse")?;
    for resource in &mut response.resources {
        let mut extension = TypedExtensionConfig::decode(resource.value.as_slice())?;
        let typed = extension
            .typed_config
            .as_mut()
            .ok_or_else(|| anyhow!("a filter without its configuration"))?;
        if typed.type_url.ends_with("wasm.v3.Wasm") {
            let mut wasm = Wasm::decode(typed.value.as_slice())?;
            if let Some(any) = wasm.config.as_mut().and_then(|c| c.configuration.as_mut()) {
                edit_any(any)?;
            }
            *typed = pack_any(wasm);
        } else {
            let mut native = DynamicModuleFilter::decode(typed.value.as_slice())?;
            if let Some(any) = native.filter_config.as_mut() {
                edit_any(any)?;
            }
            *typed = pack_any(native);
        }
        *resource = pack_any(extension);
    }
    write(&response)
}
