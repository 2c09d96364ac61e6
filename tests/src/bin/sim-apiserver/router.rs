//! Request path parsing, written after kube-apiserver's `RequestInfoFactory` (deliberately
//! independent of `skewgate-core`): discovery paths, and resource paths
//! `/api/v1/...` or `/apis/<group>/<version>/...` with an optional `watch/` prefix, an
//! optional `namespaces/<ns>/` scope, then `<resource>[/<name>[/<subresource>]]`.
//! Whether the group/version/resource is actually served is decided later, by the catalog.

/// What a request path addresses.
#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    Version,
    Health,
    /// `/api`
    ApiRoot,
    /// `/apis`
    ApisRoot,
    /// `/apis/<group>`
    Group(String),
    /// `/api/<version>` (group "") or `/apis/<group>/<version>`
    GroupVersion {
        group: String,
        version: String,
    },
    Resource(ResourcePath),
    /// `/openapi/v2`
    OpenApiV2,
    /// `/openapi/v3`
    OpenApiV3Root,
    /// `/openapi/v3/<api/v1 | apis/g/v>`, the part after `/openapi/v3/`
    OpenApiV3(String),
    NotFound,
}

/// A resource request path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourcePath {
    pub group: String,
    pub version: String,
    /// Set when the path was `/namespaces/<ns>/<resource>...`.
    pub namespace: Option<String>,
    pub resource: String,
    pub name: Option<String>,
    pub subresource: Option<String>,
    /// The deprecated `/watch/` prefix was used.
    pub watch_prefix: bool,
}

/// Subresources of a namespace object that kube does not mistake for a resource name.
const NAMESPACE_SUBRESOURCES: [&str; 2] = ["status", "finalize"];

pub fn parse(path: &str) -> Route {
    let trimmed = path.trim_end_matches('/');
    let segs: Vec<&str> = trimmed.split('/').skip(1).collect();
    if trimmed.is_empty() || segs.iter().any(|s| s.is_empty()) {
        return Route::NotFound;
    }
    match segs.as_slice() {
        ["version"] => Route::Version,
        ["healthz"] | ["readyz"] | ["livez"] => Route::Health,
        ["openapi", "v2"] => Route::OpenApiV2,
        ["openapi", "v3"] => Route::OpenApiV3Root,
        ["openapi", "v3", rest @ ..] => Route::OpenApiV3(rest.join("/")),
        ["api"] => Route::ApiRoot,
        ["apis"] => Route::ApisRoot,
        ["apis", group] => Route::Group(group.to_string()),
        ["api", version] => gv("", version),
        ["apis", group, version] => gv(group, version),
        ["api", version, rest @ ..] => resource("", version, rest),
        ["apis", group, version, rest @ ..] => resource(group, version, rest),
        _ => Route::NotFound,
    }
}

fn gv(group: &str, version: &str) -> Route {
    Route::GroupVersion {
        group: group.to_string(),
        version: version.to_string(),
    }
}

fn resource(group: &str, version: &str, rest: &[&str]) -> Route {
    let mut parts = rest;
    let mut watch_prefix = false;
    if parts.first() == Some(&"watch") {
        watch_prefix = true;
        parts = &parts[1..];
    }
    let mut namespace = None;
    if parts.len() > 2 && parts[0] == "namespaces" && !NAMESPACE_SUBRESOURCES.contains(&parts[2]) {
        namespace = Some(parts[1].to_string());
        parts = &parts[2..];
    }
    if parts.is_empty() || parts.len() > 3 {
        return Route::NotFound;
    }
    Route::Resource(ResourcePath {
        group: group.to_string(),
        version: version.to_string(),
        namespace,
        resource: parts[0].to_string(),
        name: parts.get(1).map(|s| s.to_string()),
        subresource: parts.get(2).map(|s| s.to_string()),
        watch_prefix,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(path: &str) -> ResourcePath {
        match parse(path) {
            Route::Resource(r) => r,
            other => panic!("{path}: {other:?}"),
        }
    }

    #[test]
    fn discovery_paths() {
        assert_eq!(parse("/api"), Route::ApiRoot);
        assert_eq!(parse("/apis/"), Route::ApisRoot);
        assert_eq!(parse("/apis/apps"), Route::Group("apps".into()));
        assert_eq!(
            parse("/api/v1"),
            Route::GroupVersion {
                group: "".into(),
                version: "v1".into()
            }
        );
        assert_eq!(
            parse("/apis/resource.k8s.io/v1beta2"),
            Route::GroupVersion {
                group: "resource.k8s.io".into(),
                version: "v1beta2".into()
            }
        );
        assert_eq!(parse("/version"), Route::Version);
        assert_eq!(parse("/readyz"), Route::Health);
        assert_eq!(parse("/"), Route::NotFound);
        assert_eq!(parse("/metrics"), Route::NotFound);
        assert_eq!(parse("/openapi/v3"), Route::OpenApiV3Root);
        assert_eq!(
            parse("/openapi/v3/apis/apps/v1"),
            Route::OpenApiV3("apis/apps/v1".into())
        );
        assert_eq!(parse("/apis//v1/pods"), Route::NotFound);
    }

    #[test]
    fn namespaced_and_cluster_resources() {
        let r = res("/apis/resource.k8s.io/v1beta2/namespaces/ns1/resourceclaims/c1");
        assert_eq!(r.group, "resource.k8s.io");
        assert_eq!(r.version, "v1beta2");
        assert_eq!(r.namespace.as_deref(), Some("ns1"));
        assert_eq!(r.resource, "resourceclaims");
        assert_eq!(r.name.as_deref(), Some("c1"));
        assert_eq!(r.subresource, None);

        let r = res("/apis/resource.k8s.io/v1beta2/resourceclaims");
        assert_eq!(
            (r.namespace, r.resource.as_str(), r.name),
            (None, "resourceclaims", None)
        );

        let r = res("/api/v1/namespaces/default/pods/p/status");
        assert_eq!(r.group, "");
        assert_eq!(r.subresource.as_deref(), Some("status"));

        let r = res("/apis/storage.k8s.io/v1/storageclasses/fast");
        assert_eq!((r.namespace, r.name.as_deref()), (None, Some("fast")));
    }

    #[test]
    fn namespaces_resource_itself() {
        let r = res("/api/v1/namespaces");
        assert_eq!(
            (r.resource.as_str(), r.name, r.namespace),
            ("namespaces", None, None)
        );
        let r = res("/api/v1/namespaces/kube-system");
        assert_eq!(
            (r.resource.as_str(), r.name.as_deref(), r.namespace),
            ("namespaces", Some("kube-system"), None)
        );
        let r = res("/api/v1/namespaces/kube-system/finalize");
        assert_eq!(r.subresource.as_deref(), Some("finalize"));
        assert_eq!(r.namespace, None);
    }

    #[test]
    fn watch_prefix() {
        let r = res("/apis/resource.k8s.io/v1beta2/watch/namespaces/ns1/resourceclaims");
        assert!(r.watch_prefix);
        assert_eq!(r.namespace.as_deref(), Some("ns1"));
        assert_eq!(r.resource, "resourceclaims");
        let r = res("/api/v1/watch/pods");
        assert!(r.watch_prefix);
        assert_eq!((r.namespace, r.resource.as_str()), (None, "pods"));
        assert_eq!(parse("/api/v1/watch"), Route::NotFound);
    }

    #[test]
    fn too_deep_is_not_found() {
        assert_eq!(
            parse("/api/v1/namespaces/ns/pods/p/proxy/extra"),
            Route::NotFound
        );
    }
}
