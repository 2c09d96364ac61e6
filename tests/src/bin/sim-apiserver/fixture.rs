//! Loading a discovery fixture folder: `aggregated_v2.json` (`/apis`), `api.json` (`/api`)
//! and `api__v1.json` (`/api/v1`), and the real OpenAPI v3 documents of the same release, if
//! any (`openapi.rs`). The raw bytes are kept to be served verbatim.

use std::collections::BTreeMap;

use std::path::Path;

use anyhow::Context;
use serde_json::Value;

pub struct Fixture {
    pub aggregated_raw: Vec<u8>,
    pub aggregated: Value,
    pub api_raw: Vec<u8>,
    pub core_v1_raw: Vec<u8>,
    pub core_v1: Value,
    /// Real OpenAPI v3 documents by root path (`apis/<g>/<v>`).
    pub openapi: BTreeMap<String, Vec<u8>>,
}

/// Where the OpenAPI documents of a discovery fixture folder are by default: the folder of the
/// same name under `openapi/` next to `discovery/` (`tests/fixtures/openapi/k8s-1.33` for
/// `tests/fixtures/discovery/k8s-1.33`).
pub fn default_openapi_dir(discovery: &Path) -> Option<std::path::PathBuf> {
    let name = discovery.file_name()?;
    Some(discovery.parent()?.parent()?.join("openapi").join(name))
}

fn read(dir: &Path, file: &str) -> anyhow::Result<(Vec<u8>, Value)> {
    let path = dir.join(file);
    let raw = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    let value =
        serde_json::from_slice(&raw).with_context(|| format!("parsing {}", path.display()))?;
    Ok((raw, value))
}

impl Fixture {
    pub fn load(dir: &Path, openapi_dir: Option<&Path>) -> anyhow::Result<Fixture> {
        let openapi = match openapi_dir
            .map(Path::to_path_buf)
            .or_else(|| default_openapi_dir(dir))
        {
            Some(d) => crate::openapi::load_real(&d)?,
            None => BTreeMap::new(),
        };
        let (aggregated_raw, aggregated) = read(dir, "aggregated_v2.json")?;
        let (api_raw, _) = read(dir, "api.json")?;
        let (core_v1_raw, core_v1) = read(dir, "api__v1.json")?;
        anyhow::ensure!(
            aggregated.get("kind").and_then(Value::as_str) == Some("APIGroupDiscoveryList"),
            "{}/aggregated_v2.json is not an APIGroupDiscoveryList",
            dir.display()
        );
        Ok(Fixture {
            aggregated_raw,
            aggregated,
            api_raw,
            core_v1_raw,
            core_v1,
            openapi,
        })
    }
}
