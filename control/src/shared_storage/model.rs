//! The pure part: CRDs and APIServices in, the shared-storage group-versions out.
//!
//! - a CustomResourceDefinition contributes `(spec.group, v)` for every version `v` with
//!   `served: true`: every apiserver serves those from the same storage;
//! - an APIService contributes `(spec.group, spec.version)` when `spec.service` is set: an
//!   aggregated API served by an extension server behind a Service, reached the same way from
//!   every apiserver. APIServices without a service are the apiservers' own built-in
//!   group-versions (`Local`), and those are exactly what differs between versions: they never
//!   count.
//!
//! Upstream's peer proxy excludes both kinds from peer routing; `routing::build` marks them
//! `shared_storage`, so the filter always keeps them local.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;

pub use skewgate_core::group_version::GroupVersion;

/// The group-versions one CRD makes shared: each served version of its group.
pub fn crd_group_versions(crd: &CustomResourceDefinition) -> Vec<GroupVersion> {
    let group = crd.spec.group.trim();
    if group.is_empty() {
        return Vec::new();
    }
    let mut out: Vec<GroupVersion> = crd
        .spec
        .versions
        .iter()
        .filter(|v| v.served && !v.name.trim().is_empty())
        .map(|v| GroupVersion::new(group, v.name.trim()))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The group-version an APIService makes shared: only one backed by a service.
pub fn apiservice_group_version(apiservice: &APIService) -> Option<GroupVersion> {
    let spec = apiservice.spec.as_ref()?;
    spec.service.as_ref()?;
    let group = spec.group.as_deref()?.trim();
    let version = spec.version.as_deref()?.trim();
    // The core group is never served by an extension server.
    if group.is_empty() || version.is_empty() {
        return None;
    }
    Some(GroupVersion::new(group, version))
}

/// Which of the two watched kinds an event is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    CustomResourceDefinitions,
    APIServices,
}

impl Kind {
    pub fn label(self) -> &'static str {
        match self {
            Kind::CustomResourceDefinitions => "customresourcedefinitions",
            Kind::APIServices => "apiservices",
        }
    }
}

/// The objects of one kind, by name, with the group-versions each contributes.
#[derive(Debug, Default, Clone)]
struct Objects {
    current: BTreeMap<String, Vec<GroupVersion>>,
    /// A list in progress (kube-runtime's `Init` .. `InitDone`): replaces `current` when done,
    /// so a re-list never shows a half-empty view.
    relist: Option<BTreeMap<String, Vec<GroupVersion>>>,
    synced: bool,
}

/// What the control plane knows about shared storage: one snapshot.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SharedStorage {
    /// Both lists completed at least once.
    pub synced: bool,
    /// Group-versions served from shared storage, sorted.
    pub group_versions: BTreeSet<GroupVersion>,
}

/// The objects seen so far, fed by the watcher.
#[derive(Debug, Default, Clone)]
pub struct Tracker {
    crds: Objects,
    apiservices: Objects,
}

impl Tracker {
    fn objects(&mut self, kind: Kind) -> &mut Objects {
        match kind {
            Kind::CustomResourceDefinitions => &mut self.crds,
            Kind::APIServices => &mut self.apiservices,
        }
    }

    pub fn begin_relist(&mut self, kind: Kind) {
        self.objects(kind).relist = Some(BTreeMap::new());
    }

    pub fn relist_apply(&mut self, kind: Kind, name: String, gvs: Vec<GroupVersion>) {
        let o = self.objects(kind);
        match &mut o.relist {
            Some(r) => {
                r.insert(name, gvs);
            }
            // An InitApply without Init: treat it as a plain apply.
            None => {
                o.current.insert(name, gvs);
            }
        }
    }

    pub fn finish_relist(&mut self, kind: Kind) {
        let o = self.objects(kind);
        if let Some(r) = o.relist.take() {
            o.current = r;
        }
        o.synced = true;
    }

    pub fn apply(&mut self, kind: Kind, name: String, gvs: Vec<GroupVersion>) {
        self.objects(kind).current.insert(name, gvs);
    }

    pub fn delete(&mut self, kind: Kind, name: &str) {
        self.objects(kind).current.remove(name);
    }

    pub fn snapshot(&self) -> SharedStorage {
        SharedStorage {
            synced: self.crds.synced && self.apiservices.synced,
            group_versions: self
                .crds
                .current
                .values()
                .chain(self.apiservices.current.values())
                .flatten()
                .cloned()
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn crd(group: &str, versions: &[(&str, bool)]) -> CustomResourceDefinition {
        serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("widgets.{group}")},
            "spec": {
                "group": group,
                "names": {"plural": "widgets", "kind": "Widget"},
                "scope": "Namespaced",
                "versions": versions.iter().map(|(name, served)| json!({
                    "name": name, "served": served, "storage": false
                })).collect::<Vec<_>>()
            }
        }))
        .expect("a CRD")
    }

    fn apiservice(group: &str, version: &str, service: bool) -> APIService {
        let mut spec = json!({
            "group": group,
            "version": version,
            "groupPriorityMinimum": 100,
            "versionPriority": 100
        });
        if service {
            spec["service"] = json!({"namespace": "kube-system", "name": "metrics-server"});
        }
        serde_json::from_value(json!({
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": format!("{version}.{group}")},
            "spec": spec
        }))
        .expect("an APIService")
    }

    fn gv(g: &str, v: &str) -> GroupVersion {
        GroupVersion::new(g, v)
    }

    #[test]
    fn crds_contribute_their_served_versions() {
        type Case<'a> = (&'a str, &'a [(&'a str, bool)], &'a [(&'a str, &'a str)]);
        let cases: &[Case<'_>] = &[
            (
                "example.com",
                &[("v1", true), ("v1beta1", true)],
                &[("example.com", "v1"), ("example.com", "v1beta1")],
            ),
            // Not served: requests for it are the apiserver's own 404, everywhere.
            (
                "example.com",
                &[("v1", true), ("v2", false)],
                &[("example.com", "v1")],
            ),
            ("example.com", &[("v1", false)], &[]),
            ("", &[("v1", true)], &[]),
            (
                "example.com",
                &[("v1", true), ("v1", true)],
                &[("example.com", "v1")],
            ),
        ];
        for (group, versions, want) in cases {
            let got = crd_group_versions(&crd(group, versions));
            let want: Vec<GroupVersion> = want.iter().map(|(g, v)| gv(g, v)).collect();
            assert_eq!(got, want, "{group} {versions:?}");
        }
    }

    #[test]
    fn only_service_backed_apiservices_count() {
        assert_eq!(
            apiservice_group_version(&apiservice("metrics.k8s.io", "v1beta1", true)),
            Some(gv("metrics.k8s.io", "v1beta1"))
        );
        // The apiservers' own group-versions (Local APIServices) are what skew is about.
        assert_eq!(
            apiservice_group_version(&apiservice("apps", "v1", false)),
            None
        );
        assert_eq!(apiservice_group_version(&apiservice("", "v1", true)), None);
        let bare: APIService =
            serde_json::from_value(json!({"metadata": {"name": "v1."}})).expect("bare");
        assert_eq!(apiservice_group_version(&bare), None);
    }

    #[test]
    fn synced_after_both_lists_and_relists_replace_whole() {
        let mut t = Tracker::default();
        assert!(!t.snapshot().synced);
        t.begin_relist(Kind::CustomResourceDefinitions);
        t.relist_apply(
            Kind::CustomResourceDefinitions,
            "widgets.example.com".into(),
            vec![gv("example.com", "v1")],
        );
        t.finish_relist(Kind::CustomResourceDefinitions);
        assert!(!t.snapshot().synced, "APIServices not listed yet");
        t.begin_relist(Kind::APIServices);
        t.finish_relist(Kind::APIServices);
        let s = t.snapshot();
        assert!(s.synced);
        assert_eq!(
            s.group_versions.iter().cloned().collect::<Vec<_>>(),
            vec![gv("example.com", "v1")]
        );

        t.apply(
            Kind::APIServices,
            "v1beta1.metrics.k8s.io".into(),
            vec![gv("metrics.k8s.io", "v1beta1")],
        );
        // The same group-version from two objects stays until both are gone.
        t.apply(
            Kind::CustomResourceDefinitions,
            "gadgets.example.com".into(),
            vec![gv("example.com", "v1")],
        );
        t.delete(Kind::CustomResourceDefinitions, "widgets.example.com");
        assert_eq!(
            t.snapshot()
                .group_versions
                .iter()
                .cloned()
                .collect::<Vec<_>>(),
            vec![gv("example.com", "v1"), gv("metrics.k8s.io", "v1beta1")]
        );

        // A re-list in progress keeps the old view; when done it replaces it.
        t.begin_relist(Kind::CustomResourceDefinitions);
        assert_eq!(t.snapshot().group_versions.len(), 2);
        t.finish_relist(Kind::CustomResourceDefinitions);
        assert_eq!(
            t.snapshot()
                .group_versions
                .iter()
                .cloned()
                .collect::<Vec<_>>(),
            vec![gv("metrics.k8s.io", "v1beta1")]
        );
        assert!(t.snapshot().synced);
    }
}
