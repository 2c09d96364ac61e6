//! Legacy discovery into aggregated form (pure): which group-versions to fetch, and the
//! aggregated documents their `APIResourceList`s make.
//!
//! Old apiservers answer `/api` with `APIVersions` and `/apis` with `APIGroupList`; the resources
//! are then one `APIResourceList` per group-version (`/api/<v>`, `/apis/<g>/<v>`). Versions keep
//! the group's order with the preferred version first, as aggregated discovery orders them.
//!
//! A named group-version that answers with an HTTP error does not fail the whole server (upstream
//! clients treat it as a partial discovery failure too; a down metrics-server must not hide
//! every other group): 404 means it went away between the two requests and it is left out;
//! any other status keeps the version, without resources and `freshness: Stale`, which is what
//! aggregated discovery says of an unavailable APIService.

use crate::discovery::documents::{aggregated_from_legacy, empty_list};
use skewgate_core::group_version::GroupVersion;

use crate::discovery::{APIGroupDiscoveryList, APIGroupList, APIResourceList, APIVersions};

/// At most this many group-versions in one legacy `/apis` (one request each).
pub const MAX_LEGACY_GROUP_VERSIONS: usize = 5000;

/// A group name or version we put into a request path: the characters of DNS names (and `_`),
/// nothing that changes the path (`/`, `..`, `%`, `?`, `#`).
pub fn path_segment_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
}

/// The group-versions of a legacy `/apis`, per group in document order, versions in the group's
/// order with the preferred one first, duplicates dropped.
pub fn plan_group_list(list: &APIGroupList) -> Result<Vec<(String, Vec<String>)>, String> {
    let mut plan: Vec<(String, Vec<String>)> = Vec::new();
    let mut count = 0;
    for group in &list.groups {
        let name = &group.name;
        if !path_segment_ok(name) {
            return Err(format!("invalid group name {name:?}"));
        }
        if plan.iter().any(|(g, _)| g == name) {
            continue;
        }
        let version_of =
            |gv: &crate::discovery::GroupVersionForDiscovery| -> Result<String, String> {
                let v = if gv.version.is_empty() {
                    gv.group_version
                        .strip_prefix(&format!("{name}/"))
                        .unwrap_or("")
                        .to_string()
                } else {
                    gv.version.clone()
                };
                if path_segment_ok(&v) {
                    Ok(v)
                } else {
                    Err(format!("group {name:?} has an invalid version {v:?}"))
                }
            };
        let mut versions = Vec::new();
        for gv in &group.versions {
            let v = version_of(gv)?;
            if !versions.contains(&v) {
                versions.push(v);
            }
        }
        if let Some(preferred) = &group.preferred_version {
            let p = version_of(preferred)?;
            if let Some(i) = versions.iter().position(|v| *v == p) {
                let p = versions.remove(i);
                versions.insert(0, p);
            }
        }
        count += versions.len();
        if count > MAX_LEGACY_GROUP_VERSIONS {
            return Err(format!(
                "more than {MAX_LEGACY_GROUP_VERSIONS} group-versions"
            ));
        }
        if !versions.is_empty() {
            plan.push((name.clone(), versions));
        }
    }
    Ok(plan)
}

/// The core versions of a legacy `/api` (`["v1"]`), duplicates dropped.
pub fn plan_core_versions(versions: &APIVersions) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for v in &versions.versions {
        if !path_segment_ok(v) {
            return Err(format!("invalid core version {v:?}"));
        }
        if !out.contains(v) {
            out.push(v.clone());
        }
    }
    if out.is_empty() {
        return Err("APIVersions lists no version".to_string());
    }
    if out.len() > 16 {
        return Err(format!("{} core versions", out.len()));
    }
    Ok(out)
}

/// The `groupVersion` a legacy resource list must carry at `group`/`version`.
pub fn check_resource_list(
    list: &APIResourceList,
    group: &str,
    version: &str,
) -> Result<(), String> {
    let expected = GroupVersion::new(group, version).to_string();
    if list.group_version == expected {
        Ok(())
    } else {
        Err(format!(
            "resource list is for {:?}, expected {expected:?}",
            list.group_version
        ))
    }
}

/// What one `/apis/<g>/<v>` gave.
#[derive(Debug, Clone, PartialEq)]
pub enum VersionOutcome {
    Served(APIResourceList),
    /// 404: gone since `/apis` was read; left out.
    Gone,
    /// Another HTTP error: kept as `freshness: Stale`, without resources.
    Unavailable,
}

/// The aggregated `/apis` of a legacy server: one group per legacy group, versions in plan
/// order; `Gone` versions left out, and groups left with no version.
pub fn assemble_apis(groups: &[(String, Vec<(String, VersionOutcome)>)]) -> APIGroupDiscoveryList {
    let empty = APIResourceList::default();
    let mut out = empty_list();
    for (group, versions) in groups {
        let kept: Vec<(&str, &APIResourceList, bool)> = versions
            .iter()
            .filter_map(|(v, outcome)| match outcome {
                VersionOutcome::Served(list) => Some((v.as_str(), list, false)),
                VersionOutcome::Unavailable => Some((v.as_str(), &empty, true)),
                VersionOutcome::Gone => None,
            })
            .collect();
        if kept.is_empty() {
            continue;
        }
        let pairs: Vec<(&str, &APIResourceList)> = kept.iter().map(|(v, l, _)| (*v, *l)).collect();
        let mut one = aggregated_from_legacy(group, &pairs);
        if let Some(item) = one.items.first_mut() {
            for (version, (_, _, stale)) in item.versions.iter_mut().zip(&kept) {
                if *stale {
                    version.freshness = Some("Stale".to_string());
                }
            }
        }
        out.items.append(&mut one.items);
    }
    out
}

/// The aggregated `/api` of a legacy server.
pub fn assemble_core(versions: &[(String, APIResourceList)]) -> APIGroupDiscoveryList {
    let pairs: Vec<(&str, &APIResourceList)> =
        versions.iter().map(|(v, l)| (v.as_str(), l)).collect();
    aggregated_from_legacy("", &pairs)
}

/// Paths of the stale versions of an assembled `/apis` (for logs and metrics).
pub fn stale_paths(apis: &APIGroupDiscoveryList) -> Vec<String> {
    let mut out = Vec::new();
    for g in &apis.items {
        for v in &g.versions {
            if v.freshness.as_deref() == Some("Stale") {
                out.push(GroupVersion::new(&g.metadata.name, &v.version).api_path());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::documents::{
        legacy_group_list, legacy_resource_list, DiscoveryDocuments,
    };
    use crate::discovery::{
        parse_group_list, parse_resource_list, APIGroup, GroupVersionForDiscovery, ServedApis,
        DEFAULT_MAX_DISCOVERY_BYTES,
    };

    fn gv(group: &str, version: &str) -> GroupVersionForDiscovery {
        GroupVersionForDiscovery {
            group_version: format!("{group}/{version}"),
            version: version.to_string(),
            ..Default::default()
        }
    }

    fn group(name: &str, versions: &[&str], preferred: Option<&str>) -> APIGroup {
        APIGroup {
            name: name.to_string(),
            versions: versions.iter().map(|v| gv(name, v)).collect(),
            preferred_version: preferred.map(|p| gv(name, p)),
            ..Default::default()
        }
    }

    fn list(groups: Vec<APIGroup>) -> APIGroupList {
        APIGroupList {
            groups,
            ..Default::default()
        }
    }

    #[test]
    fn plans() {
        type Case = (
            Vec<APIGroup>,
            Result<Vec<(&'static str, Vec<&'static str>)>, &'static str>,
        );
        let cases: Vec<Case> = vec![
            (vec![], Ok(vec![])),
            (
                vec![group("apps", &["v1"], Some("v1"))],
                Ok(vec![("apps", vec!["v1"])]),
            ),
            // Preferred first, the rest in the group's order.
            (
                vec![group(
                    "resource.k8s.io",
                    &["v1alpha3", "v1beta1", "v1beta2"],
                    Some("v1beta2"),
                )],
                Ok(vec![(
                    "resource.k8s.io",
                    vec!["v1beta2", "v1alpha3", "v1beta1"],
                )]),
            ),
            // A preferred version that is not listed changes nothing; no preferred is fine.
            (
                vec![
                    group("a.io", &["v1", "v2"], Some("v3")),
                    group("b.io", &["v2", "v1"], None),
                ],
                Ok(vec![("a.io", vec!["v1", "v2"]), ("b.io", vec!["v2", "v1"])]),
            ),
            // Duplicates dropped; groups without versions left out.
            (
                vec![
                    group("a.io", &["v1", "v1"], None),
                    group("a.io", &["v9"], None),
                    group("empty.io", &[], None),
                ],
                Ok(vec![("a.io", vec!["v1"])]),
            ),
            // Nothing that changes the request path.
            (vec![group("..", &["v1"], None)], Err("invalid group name")),
            (vec![group("a/b", &["v1"], None)], Err("invalid group name")),
            (vec![group("", &["v1"], None)], Err("invalid group name")),
            (
                vec![group("a.io", &["v1?x=1"], None)],
                Err("invalid version"),
            ),
            (
                vec![group("a.io", &["%2e%2e"], None)],
                Err("invalid version"),
            ),
            (
                vec![group("a.io", &["v1"], Some("../v1"))],
                Err("invalid version"),
            ),
        ];
        for (groups, want) in cases {
            let got = plan_group_list(&list(groups.clone()));
            match (got, want) {
                (Ok(got), Ok(want)) => {
                    let want: Vec<(String, Vec<String>)> = want
                        .into_iter()
                        .map(|(g, vs)| (g.to_string(), vs.into_iter().map(String::from).collect()))
                        .collect();
                    assert_eq!(got, want, "{groups:?}");
                }
                (Err(e), Err(w)) => assert!(e.contains(w), "{e} !~ {w}"),
                (got, want) => panic!("{groups:?}: got {got:?}, want {want:?}"),
            }
        }
        // The version may be given only inside groupVersion.
        let mut g = group("apps", &[], None);
        g.versions.push(GroupVersionForDiscovery {
            group_version: "apps/v1".into(),
            ..Default::default()
        });
        assert_eq!(
            plan_group_list(&list(vec![g])).unwrap(),
            vec![("apps".to_string(), vec!["v1".to_string()])]
        );
        // Bounded.
        let many: Vec<APIGroup> = (0..=MAX_LEGACY_GROUP_VERSIONS)
            .map(|i| group(&format!("g{i}.io"), &["v1"], None))
            .collect();
        assert!(plan_group_list(&list(many)).is_err());
    }

    #[test]
    fn core_plans_and_segments() {
        let v = |vs: &[&str]| APIVersions {
            versions: vs.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        assert_eq!(plan_core_versions(&v(&["v1"])).unwrap(), vec!["v1"]);
        assert_eq!(plan_core_versions(&v(&["v1", "v1"])).unwrap(), vec!["v1"]);
        assert!(plan_core_versions(&v(&[])).is_err());
        assert!(plan_core_versions(&v(&["v1/.."])).is_err());
        for (s, ok) in [
            ("v1", true),
            ("metrics.k8s.io", true),
            ("a_b-c.D", true),
            ("", false),
            (".", false),
            ("..", false),
            ("a b", false),
            ("a#b", false),
            ("ü", false),
        ] {
            assert_eq!(path_segment_ok(s), ok, "{s:?}");
        }
        let mut l = APIResourceList {
            group_version: "apps/v1".into(),
            ..Default::default()
        };
        assert!(check_resource_list(&l, "apps", "v1").is_ok());
        assert!(check_resource_list(&l, "apps", "v2").is_err());
        l.group_version = "v1".into();
        assert!(check_resource_list(&l, "", "v1").is_ok());
    }

    fn fixture_dir(name: &str) -> String {
        format!(
            "{}/../tests/fixtures/discovery/{name}",
            env!("CARGO_MANIFEST_DIR")
        )
    }

    /// The fixture's `/apis` served as legacy documents, assembled back: the same model, the
    /// same group and version order (preferred first), the same resources in the same order.
    #[test]
    fn assembly_from_fixture_legacy_documents() {
        for name in ["k8s-1.30", "k8s-1.33"] {
            let docs = DiscoveryDocuments::from_dir(fixture_dir(name)).unwrap();
            let group_list = parse_group_list(
                &serde_json::to_vec(&legacy_group_list(&docs.apis)).unwrap(),
                DEFAULT_MAX_DISCOVERY_BYTES,
            )
            .unwrap();
            let plan = plan_group_list(&group_list).unwrap();
            let fetched: Vec<(String, Vec<(String, VersionOutcome)>)> = plan
                .iter()
                .map(|(g, versions)| {
                    let item = docs
                        .apis
                        .items
                        .iter()
                        .find(|i| &i.metadata.name == g)
                        .unwrap();
                    let outcomes = versions
                        .iter()
                        .map(|v| {
                            let agg = item.versions.iter().find(|x| &x.version == v).unwrap();
                            let json = serde_json::to_vec(&legacy_resource_list(g, agg)).unwrap();
                            let list =
                                parse_resource_list(&json, DEFAULT_MAX_DISCOVERY_BYTES).unwrap();
                            check_resource_list(&list, g, v).unwrap();
                            (v.clone(), VersionOutcome::Served(list))
                        })
                        .collect();
                    (g.clone(), outcomes)
                })
                .collect();
            let apis = assemble_apis(&fetched);
            assert_eq!(
                ServedApis::from_aggregated(&apis).unwrap(),
                ServedApis::from_aggregated(&docs.apis).unwrap(),
                "{name}"
            );
            let order =
                |l: &APIGroupDiscoveryList| -> Vec<(String, Vec<String>, Vec<Vec<String>>)> {
                    l.items
                        .iter()
                        .map(|g| {
                            (
                                g.metadata.name.clone(),
                                g.versions.iter().map(|v| v.version.clone()).collect(),
                                g.versions
                                    .iter()
                                    .map(|v| {
                                        v.resources.iter().map(|r| r.resource.clone()).collect()
                                    })
                                    .collect(),
                            )
                        })
                        .collect()
                };
            assert_eq!(order(&apis), order(&docs.apis), "{name}");
            assert!(stale_paths(&apis).is_empty());
            // Verbs, scope and kinds survive the round trip.
            let find = |l: &APIGroupDiscoveryList| {
                l.items
                    .iter()
                    .find(|g| g.metadata.name == "apps")
                    .unwrap()
                    .versions[0]
                    .resources
                    .iter()
                    .find(|r| r.resource == "deployments")
                    .cloned()
                    .unwrap()
            };
            let (a, b) = (find(&apis), find(&docs.apis));
            assert_eq!(
                (&a.verbs, &a.scope, &a.short_names),
                (&b.verbs, &b.scope, &b.short_names)
            );
            assert_eq!(a.response_kind.unwrap().kind, "Deployment");
            let scale = a
                .subresources
                .iter()
                .find(|s| s.subresource == "scale")
                .unwrap();
            assert_eq!(scale.response_kind.as_ref().unwrap().group, "autoscaling");

            // Core from the fixture's legacy api__v1.json.
            let core_list = parse_resource_list(
                &std::fs::read(format!("{}/api__v1.json", fixture_dir(name))).unwrap(),
                DEFAULT_MAX_DISCOVERY_BYTES,
            )
            .unwrap();
            assert_eq!(
                assemble_core(&[("v1".into(), core_list)]),
                docs.api,
                "{name}"
            );
        }
    }

    #[test]
    fn failed_group_versions_are_stale_or_left_out() {
        let list = |gv: &str, res: &str| APIResourceList {
            group_version: gv.into(),
            resources: vec![crate::discovery::APIResource {
                name: res.into(),
                kind: "K".into(),
                verbs: vec!["get".into()],
                ..Default::default()
            }],
            ..Default::default()
        };
        let fetched = vec![
            (
                "metrics.k8s.io".to_string(),
                vec![("v1beta1".to_string(), VersionOutcome::Unavailable)],
            ),
            (
                "a.io".to_string(),
                vec![
                    ("v2".to_string(), VersionOutcome::Gone),
                    (
                        "v1".to_string(),
                        VersionOutcome::Served(list("a.io/v1", "as")),
                    ),
                ],
            ),
            (
                "gone.io".to_string(),
                vec![("v1".to_string(), VersionOutcome::Gone)],
            ),
        ];
        let apis = assemble_apis(&fetched);
        let names: Vec<&str> = apis
            .items
            .iter()
            .map(|g| g.metadata.name.as_str())
            .collect();
        assert_eq!(names, vec!["metrics.k8s.io", "a.io"]);
        let metrics = &apis.items[0].versions[0];
        assert_eq!(metrics.freshness.as_deref(), Some("Stale"));
        assert!(metrics.resources.is_empty());
        let a = &apis.items[1];
        assert_eq!(a.versions.len(), 1);
        assert_eq!(a.versions[0].freshness.as_deref(), Some("Current"));
        assert_eq!(stale_paths(&apis), vec!["/apis/metrics.k8s.io/v1beta1"]);
        let served = ServedApis::from_aggregated(&apis).unwrap();
        assert!(served.serves_group_version("metrics.k8s.io", "v1beta1"));
        assert!(served.serves("a.io", "v1", "as"));
    }
}
