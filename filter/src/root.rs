//! The root context: one per VM and configuration. Receives the configuration, compiles it, and
//! hands the compiled table to every request.

use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;
use skewgate_core::config::FilterConfig;
use skewgate_core::plan::CompiledConfig;

use crate::host::{self, ProxyHost};
use crate::request::{Configured, Request, Worker};

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
    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        let bytes = match host::plugin_configuration() {
            Ok(Some(bytes)) => bytes,
            Ok(None) => {
                log::error!("skewgate: no configuration given; refusing to start");
                return false;
            }
            Err(status) => {
                log::error!("skewgate: reading the configuration failed: {status:?}");
                return false;
            }
        };
        match FilterConfig::from_json(&bytes) {
            Ok(config) => {
                let compiled = CompiledConfig::compile(&config);
                log::info!(
                    "skewgate: configured for apiserver {:?}: {} group-versions, {} peer clusters, merged discovery {}",
                    config.local_apiserver,
                    config.group_versions.len(),
                    config.peer_clusters.len(),
                    if compiled.discovery.is_some() { "on" } else { "off" },
                );
                // Once per configuration and VM, like the line above. Envoy loads the
                // bootstrap's fallback at start (to check it) and again on every worker when
                // the control plane did not configure it within the wait.
                if let Some(mode) = compiled.fallback {
                    log::warn!(
                        "skewgate: FALLBACK configuration ({}) loaded: used while the control plane has not configured this Envoy, until its first configuration replaces it",
                        mode.as_str()
                    );
                }
                crate::metrics::set_fallback(compiled.fallback.is_some());
                // The counters' ids are per configuration: its label values may differ.
                self.config = Some(Rc::new(Configured::new(compiled)));
                if self.worker.is_none() {
                    self.worker = Some(Rc::new(Worker::new()));
                }
                true
            }
            Err(e) => {
                log::error!("skewgate: {e}; keeping the previous configuration");
                false
            }
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        let config = self.config.clone()?;
        let worker = self.worker.clone()?;
        Some(Box::new(Request::new(ProxyHost, config, worker)))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
