//! Loading a discovery fixture folder: `aggregated_v2.json` (`/apis`), `api.json` (`/api`)
//! and `api__v1.json` (`/api/v1`). The raw bytes are kept to be served verbatim.

use std::path::Path;

use anyhow::Context;
use serde_json::Value;

pub struct Fixture {
    pub aggregated_raw: Vec<u8>,
    pub aggregated: Value,
    pub api_raw: Vec<u8>,
    pub core_v1_raw: Vec<u8>,
    pub core_v1: Value,
}

fn read(dir: &Path, file: &str) -> anyhow::Result<(Vec<u8>, Value)> {
    let path = dir.join(file);
    let raw = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    let value =
        serde_json::from_slice(&raw).with_context(|| format!("parsing {}", path.display()))?;
    Ok((raw, value))
}

impl Fixture {
    pub fn load(dir: &Path) -> anyhow::Result<Fixture> {
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
        })
    }
}
