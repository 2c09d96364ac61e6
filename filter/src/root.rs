//! The root context: one per VM and configuration. Receives the configuration, compiles it, and
//! hands the compiled table to every request.

use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;
use skewgate_core::config::{
    refused_message, ConfigError, DiscoveryRef, FilterConfig, MAX_CONFIG_BYTES,
};
use skewgate_core::discovery::MergedDiscovery;
use skewgate_core::plan::CompiledConfig;
use skewgate_core::shared_discovery;

use crate::host::{self, ProxyHost};
use crate::request::HttpRequest;
use skewgate_core::pipeline::Host;
use skewgate_core::pipeline::{Configured, Request, Worker};

#[derive(Default)]
pub struct Root {
    /// `None` until a configuration has been accepted; Envoy does not create HTTP contexts for
    /// a plugin whose `on_configure` failed, so requests never see `None`.
    config: Option<Rc<Configured>>,
    /// Defined with the first accepted configuration, kept across the later ones.
    worker: Option<Rc<Worker>>,
}

impl Context for Root {}

impl RootContext for Root {
    /// Runs once per VM for every configuration pushed (concurrency + 2 times): keep it a
    /// typed parse and a compile, nothing more. Returning false makes Envoy reject the config
    /// (a NACK over xDS) and keep the previous one.
    ///
    /// The routing part is read as a stream without the discovery documents; the documents
    /// are read only by the VM that publishes them to shared data, once per configuration
    /// version (docs/ARCHITECTURE.md, "Merged discovery").
    fn on_configure(&mut self, plugin_configuration_size: usize) -> bool {
        let started = ProxyHost.now().ok();
        if plugin_configuration_size > MAX_CONFIG_BYTES {
            log::error!(
                "{}",
                refused_message(ConfigError::TooLarge {
                    bytes: plugin_configuration_size
                })
            );
            return false;
        }
        let routing = if plugin_configuration_size <= READ_WHOLE_BYTES {
            // Small: read whole and parse the slice, the faster way; the buffer is reused.
            match host::plugin_configuration() {
                Ok(bytes) => FilterConfig::routing_from_slice(&bytes.unwrap_or_default()),
                Err(status) => Err(ConfigError::Invalid(format!(
                    "reading the configuration failed: {status:?}"
                ))),
            }
        } else {
            FilterConfig::routing_from_reader(std::io::BufReader::with_capacity(
                READ_PIECE_BYTES,
                host::PluginConfigurationReader::new(plugin_configuration_size),
            ))
        };
        let routing = match routing {
            Ok(routing) => routing,
            Err(e) => {
                log::error!("{}", refused_message(e));
                return false;
            }
        };
        let (discovery, how) = match &routing.discovery {
            DiscoveryRef::None => (None, "off".to_string()),
            DiscoveryRef::Unversioned => match full_configuration(None) {
                Ok(config) => (
                    config.discovery.as_ref().map(MergedDiscovery::compile),
                    "on (unversioned: this VM's own copy)".to_string(),
                ),
                Err(e) => {
                    log::error!("{}", refused_message(e));
                    return false;
                }
            },
            DiscoveryRef::Version(version) => match shared_discovery(version) {
                Ok(found) => found,
                Err(e) => {
                    log::error!("{}", refused_message(e));
                    return false;
                }
            },
        };
        let config = &routing.config;
        let compiled = CompiledConfig::with_discovery(config, discovery);
        let took = started
            .zip(ProxyHost.now().ok())
            .map(|(a, b)| b.saturating_sub(a).as_millis())
            .unwrap_or_default();
        log::info!(
            "skewgate: configured for apiserver {:?}: {} group-versions, {} peer clusters, merged discovery {how}; {plugin_configuration_size} bytes read in {took} ms",
            config.local_apiserver,
            config.group_versions.len(),
            config.peer_clusters.len(),
        );
        // Once per configuration and VM, like the line above. Envoy loads the
        // bootstrap's fallback at start (to check it) and again on every worker when
        // the control plane did not configure it within the wait.
        if let Some(mode) = compiled.fallback {
            log::warn!("{}", mode.loaded_message());
        }
        crate::metrics::set_fallback(compiled.fallback.is_some());
        // The counters' ids are per configuration: its label values may differ.
        self.config = Some(Rc::new(Configured::new(compiled)));
        if self.worker.is_none() {
            self.worker = Some(Rc::new(Worker::new()));
        }
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        let config = self.config.clone()?;
        let worker = self.worker.clone()?;
        Some(Box::new(HttpRequest(Request::new(
            ProxyHost, config, worker,
        ))))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// How much of the configuration one host call copies into the VM while streaming it.
const READ_PIECE_BYTES: usize = 64 * 1024;

/// Configurations up to this size are read whole (parsing a slice is about three times faster
/// than a stream); larger ones are streamed, so that no VM but the publisher ever holds their
/// discovery documents.
const READ_WHOLE_BYTES: usize = 1024 * 1024;

/// The whole configuration, parsed and validated (documents included); with `version`, its
/// discovery must carry that version.
fn full_configuration(version: Option<&str>) -> Result<FilterConfig, String> {
    let bytes = match host::plugin_configuration() {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return Err("no configuration given".to_string()),
        Err(status) => return Err(format!("reading the configuration failed: {status:?}")),
    };
    let config = FilterConfig::from_json(&bytes).map_err(|e| e.to_string())?;
    let found = config.discovery.as_ref().map(|d| d.version.as_str());
    if version.is_some() && found != version {
        return Err(format!(
            "configuration changed while read: discovery version {found:?}, expected {version:?}"
        ));
    }
    Ok(config)
}

/// The merged discovery of `version` from shared data, published there first if no VM did
/// yet; and how, for the log. If shared data refuses it, this VM keeps its own copy.
fn shared_discovery(version: &str) -> Result<(Option<MergedDiscovery>, String), String> {
    let store = host::HostSharedData;
    match shared_discovery::load(&store, version) {
        Ok(Some(stored)) => return Ok((Some(stored), format!("{version} (shared)"))),
        Ok(None) => {}
        Err(e) => log::warn!("skewgate: {e}; publishing discovery {version} again"),
    }
    let config = full_configuration(Some(version))?;
    let Some(discovery) = config.discovery.as_ref() else {
        return Err("configuration changed while read: discovery gone".to_string());
    };
    let merged = MergedDiscovery::compile(discovery);
    match shared_discovery::publish(&store, version, &merged) {
        Ok(stored) => Ok((
            Some(stored),
            format!("{version} (published to shared data)"),
        )),
        Err(e) => {
            log::warn!("skewgate: {e}; this VM keeps its own copy of discovery {version}");
            Ok((Some(merged), format!("{version} (this VM's own copy)")))
        }
    }
}
