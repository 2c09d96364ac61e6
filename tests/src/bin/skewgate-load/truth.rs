//! Ground truth: which Kubernetes versions' APIs the cluster serves or retains at each moment,
//! as the driver writes it, and which group-versions / resources each version serves, from the
//! discovery fixtures.
//!
//! The truth file has one line per phase change, appended by the driver:
//! `<unix ms> <phase> <version>[,<version>...]` (versions as in the fixture folders' names,
//! `k8s-<version>`). The phase `end` stops the load generator.
//!
//! A version added to the set is required only after `settle` (the cluster cannot be expected
//! to have observed a new apiserver at the instant it starts); a removal takes effect at once.
//! So the versions required at `t` are those of every entry in force at some time in
//! `[t - settle, t]`, intersected.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::Context;
use serde_json::Value;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub at_ms: u64,
    pub phase: String,
    pub versions: BTreeSet<String>,
}

/// Parses the whole truth file; incomplete last lines (being written) are skipped.
pub fn parse(text: &str) -> Vec<Entry> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        let (Some(at), Some(phase)) = (parts.next(), parts.next()) else {
            continue;
        };
        let Ok(at_ms) = at.parse::<u64>() else {
            continue;
        };
        let versions = parts
            .next()
            .unwrap_or("")
            .split(',')
            .filter(|v| !v.is_empty())
            .map(str::to_string)
            .collect();
        out.push(Entry {
            at_ms,
            phase: phase.to_string(),
            versions,
        });
    }
    out
}

/// The entry in force at `t` (the first one before the first change).
pub fn entry_at(entries: &[Entry], t: u64) -> Option<&Entry> {
    entries
        .iter()
        .rev()
        .find(|e| e.at_ms <= t)
        .or_else(|| entries.first())
}

/// The versions required at `t`: in force throughout `[t - settle, t]`.
pub fn required_versions(entries: &[Entry], t: u64, settle_ms: u64) -> BTreeSet<String> {
    let from = t.saturating_sub(settle_ms);
    let mut acc: Option<BTreeSet<String>> = None;
    for (i, e) in entries.iter().enumerate() {
        let end = entries.get(i + 1).map_or(u64::MAX, |n| n.at_ms);
        let active = (e.at_ms <= t && end > from) || (i == 0 && t < e.at_ms);
        if active {
            acc = Some(match acc {
                None => e.versions.clone(),
                Some(a) => a.intersection(&e.versions).cloned().collect(),
            });
        }
    }
    acc.unwrap_or_default()
}

/// What each version serves: `/apis` group-versions with their resources, and core v1
/// resources, from `<fixtures>/k8s-<version>/{aggregated_v2,api__v1}.json`.
#[derive(Default, Debug)]
pub struct Catalog {
    /// version → group-version ("apps/v1") → resources
    apis: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
    /// version → core v1 resources
    core: BTreeMap<String, BTreeSet<String>>,
}

impl Catalog {
    pub fn load(dir: &Path) -> anyhow::Result<Self> {
        let mut cat = Catalog::default();
        for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().to_string();
            let Some(version) = name.strip_prefix("k8s-") else {
                continue;
            };
            let agg: Value = read_json(&entry.path().join("aggregated_v2.json"))?;
            let core: Value = read_json(&entry.path().join("api__v1.json"))?;
            cat.apis
                .insert(version.to_string(), aggregated_resources(&agg));
            let core_resources = core["resources"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| r["name"].as_str())
                .filter(|n| !n.contains('/'))
                .map(str::to_string)
                .collect();
            cat.core.insert(version.to_string(), core_resources);
        }
        anyhow::ensure!(
            !cat.apis.is_empty(),
            "no k8s-* fixture in {}",
            dir.display()
        );
        Ok(cat)
    }

    /// Group-versions under `/apis` that one of `versions` serves.
    pub fn group_versions(&self, versions: &BTreeSet<String>) -> BTreeSet<String> {
        versions
            .iter()
            .filter_map(|v| self.apis.get(v))
            .flat_map(|gvs| gvs.keys().cloned())
            .collect()
    }

    /// Whether one of `versions` serves `gvr` ("resource.k8s.io/v1beta2/resourceclaims", or
    /// "v1/pods" for the core group).
    pub fn serves(&self, versions: &BTreeSet<String>, gvr: &str) -> bool {
        let Some((gv, resource)) = gvr.rsplit_once('/') else {
            return false;
        };
        versions.iter().any(|v| {
            if gv == "v1" {
                self.core.get(v).is_some_and(|r| r.contains(resource))
            } else {
                self.apis
                    .get(v)
                    .and_then(|gvs| gvs.get(gv))
                    .is_some_and(|r| r.contains(resource))
            }
        })
    }
}

fn read_json(path: &Path) -> anyhow::Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// group-version → resources of an `APIGroupDiscoveryList`.
pub fn aggregated_resources(doc: &Value) -> BTreeMap<String, BTreeSet<String>> {
    let mut out = BTreeMap::new();
    for group in doc["items"].as_array().into_iter().flatten() {
        let name = group["metadata"]["name"].as_str().unwrap_or("");
        for v in group["versions"].as_array().into_iter().flatten() {
            let version = v["version"].as_str().unwrap_or("");
            let gv = if name.is_empty() {
                version.to_string()
            } else {
                format!("{name}/{version}")
            };
            let resources = v["resources"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| r["resource"].as_str())
                .map(str::to_string)
                .collect();
            out.insert(gv, resources);
        }
    }
    out
}

/// The group-versions of an `APIGroupDiscoveryList`, and those marked `freshness: Stale`.
pub fn present_and_stale(doc: &Value) -> Option<(BTreeSet<String>, BTreeSet<String>)> {
    let items = doc["items"].as_array()?;
    let (mut present, mut stale) = (BTreeSet::new(), BTreeSet::new());
    for group in items {
        let name = group["metadata"]["name"].as_str().unwrap_or("");
        for v in group["versions"].as_array().into_iter().flatten() {
            let gv = format!("{name}/{}", v["version"].as_str().unwrap_or(""));
            if v["freshness"].as_str() == Some("Stale") {
                stale.insert(gv.clone());
            }
            present.insert(gv);
        }
    }
    Some((present, stale))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn additions_settle_removals_do_not() {
        let e = parse("1000 baseline 1.30\n5000 node-1-upgraded 1.30,1.33\n9000 last 1.33\n900");
        assert_eq!(e.len(), 3);
        assert_eq!(required_versions(&e, 500, 2000), set(&["1.30"]));
        assert_eq!(required_versions(&e, 5500, 2000), set(&["1.30"]));
        assert_eq!(required_versions(&e, 7001, 2000), set(&["1.30", "1.33"]));
        assert_eq!(required_versions(&e, 9000, 2000), set(&["1.33"]));
        assert_eq!(required_versions(&e, 9000, 0), set(&["1.33"]));
        assert_eq!(required_versions(&e, 11001, 2000), set(&["1.33"]));
        assert_eq!(
            entry_at(&e, 5000).map(|e| e.phase.as_str()),
            Some("node-1-upgraded")
        );
        assert_eq!(entry_at(&e, 10).map(|e| e.phase.as_str()), Some("baseline"));
    }

    #[test]
    fn the_fixtures_tell_which_version_serves_what() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/discovery");
        let cat = Catalog::load(&dir).expect("fixtures");
        let old = set(&["1.30"]);
        let new = set(&["1.33"]);
        assert!(cat.serves(&old, "resource.k8s.io/v1alpha2/resourceclaims"));
        assert!(!cat.serves(&new, "resource.k8s.io/v1alpha2/resourceclaims"));
        assert!(cat.serves(&new, "resource.k8s.io/v1beta2/deviceclasses"));
        assert!(cat.serves(&old, "v1/pods") && cat.serves(&new, "v1/pods"));
        assert!(cat
            .group_versions(&old)
            .contains("flowcontrol.apiserver.k8s.io/v1beta3"));
        assert!(!cat
            .group_versions(&new)
            .contains("flowcontrol.apiserver.k8s.io/v1beta3"));
    }
}
