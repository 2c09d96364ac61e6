//! The set of resources this apiserver serves (group, version, resource -> kind, scope,
//! verbs, subresources), built from the fixture: core v1 from `api__v1.json`, everything
//! else from the aggregated `/apis` document.

use std::collections::BTreeMap;

use serde_json::Value;

/// One served resource of one group/version.
#[derive(Clone, Debug)]
pub struct ResourceInfo {
    pub group: String,
    pub version: String,
    pub resource: String,
    pub kind: String,
    pub namespaced: bool,
    pub verbs: Vec<String>,
    /// subresource name -> its verbs
    pub subresources: BTreeMap<String, Vec<String>>,
}

impl ResourceInfo {
    /// `v1` for core, else `group/version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    pub fn allows(&self, verb: &str) -> bool {
        self.verbs.iter().any(|v| v == verb)
    }

    pub fn sub_allows(&self, sub: &str, verb: &str) -> bool {
        self.subresources
            .get(sub)
            .is_some_and(|vs| vs.iter().any(|v| v == verb))
    }
}

/// All served group/versions and their resources.
#[derive(Debug, Default)]
pub struct Catalog {
    gvs: BTreeMap<(String, String), BTreeMap<String, ResourceInfo>>,
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

impl Catalog {
    pub fn build(aggregated: &Value, core_v1: &Value) -> Catalog {
        let mut cat = Catalog::default();
        let core = cat.gvs.entry((String::new(), "v1".into())).or_default();
        let entries = core_v1
            .get("resources")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for e in &entries {
            let name = str_of(e, "name");
            if name.contains('/') {
                continue;
            }
            core.insert(
                name.to_string(),
                ResourceInfo {
                    group: String::new(),
                    version: "v1".into(),
                    resource: name.to_string(),
                    kind: str_of(e, "kind").to_string(),
                    namespaced: e
                        .get("namespaced")
                        .and_then(Value::as_bool)
                        .unwrap_or(false),
                    verbs: strings(e.get("verbs")),
                    subresources: BTreeMap::new(),
                },
            );
        }
        for e in &entries {
            if let Some((parent, sub)) = str_of(e, "name").split_once('/') {
                if let Some(p) = core.get_mut(parent) {
                    p.subresources
                        .insert(sub.to_string(), strings(e.get("verbs")));
                }
            }
        }
        for g in aggregated
            .get("items")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let group = g.get("metadata").map(|m| str_of(m, "name")).unwrap_or("");
            for v in g
                .get("versions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let version = str_of(v, "version");
                let gv = cat
                    .gvs
                    .entry((group.to_string(), version.to_string()))
                    .or_default();
                for r in v
                    .get("resources")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let resource = str_of(r, "resource");
                    let kind = r
                        .get("responseKind")
                        .map(|k| str_of(k, "kind"))
                        .unwrap_or("");
                    let subresources = r
                        .get("subresources")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .map(|s| {
                            (
                                str_of(s, "subresource").to_string(),
                                strings(s.get("verbs")),
                            )
                        })
                        .collect();
                    gv.insert(
                        resource.to_string(),
                        ResourceInfo {
                            group: group.to_string(),
                            version: version.to_string(),
                            resource: resource.to_string(),
                            kind: kind.to_string(),
                            namespaced: str_of(r, "scope") == "Namespaced",
                            verbs: strings(r.get("verbs")),
                            subresources,
                        },
                    );
                }
            }
        }
        cat
    }

    /// Every served group/version with its resources, core first.
    pub fn group_versions(
        &self,
    ) -> impl Iterator<Item = (&str, &str, &BTreeMap<String, ResourceInfo>)> {
        self.gvs
            .iter()
            .map(|((g, v), rs)| (g.as_str(), v.as_str(), rs))
    }

    pub fn serves_group_version(&self, group: &str, version: &str) -> bool {
        self.gvs
            .contains_key(&(group.to_string(), version.to_string()))
    }

    pub fn lookup(&self, group: &str, version: &str, resource: &str) -> Option<&ResourceInfo> {
        self.gvs
            .get(&(group.to_string(), version.to_string()))?
            .get(resource)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn load(release: &str) -> Catalog {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/discovery")
            .join(release);
        let read = |f: &str| -> Value {
            serde_json::from_slice(&std::fs::read(dir.join(f)).unwrap()).unwrap()
        };
        Catalog::build(&read("aggregated_v2.json"), &read("api__v1.json"))
    }

    #[test]
    fn core_and_groups() {
        let c = load("k8s-1.33");
        let pods = c.lookup("", "v1", "pods").unwrap();
        assert_eq!(pods.kind, "Pod");
        assert!(pods.namespaced);
        assert!(pods.subresources.contains_key("status"));
        assert!(pods.sub_allows("eviction", "create"));
        assert!(!c.lookup("", "v1", "namespaces").unwrap().namespaced);
        let rc = c
            .lookup("resource.k8s.io", "v1beta2", "resourceclaims")
            .unwrap();
        assert_eq!(rc.kind, "ResourceClaim");
        assert_eq!(rc.api_version(), "resource.k8s.io/v1beta2");
        assert!(rc.allows("watch"));
        assert!(c
            .lookup("resource.k8s.io", "v1alpha2", "resourceclaims")
            .is_none());
        assert!(c
            .lookup("resource.k8s.io", "v1alpha3", "devicetaintrules")
            .is_some());
    }

    #[test]
    fn release_differences() {
        let c = load("k8s-1.30");
        assert!(c
            .lookup("resource.k8s.io", "v1alpha2", "resourceclaims")
            .is_some());
        assert!(c
            .lookup("resource.k8s.io", "v1beta2", "resourceclaims")
            .is_none());
        assert!(!c
            .lookup("", "v1", "pods")
            .unwrap()
            .subresources
            .contains_key("resize"));
    }
}
