//! OpenAPI v3 for group-versions only peers serve (docs/ARCHITECTURE.md "OpenAPI v3").
//!
//! kubectl (`explain`, client-side validation, `apply`) reads `/openapi/v3`, a list of
//! group-version paths (`apis/<group>/<version>`, `api/v1`) each with the `serverRelativeURL`
//! of its document (`/openapi/v3/apis/<g>/<v>?hash=<sha512>`), then fetches the documents of the
//! group-versions it needs. The local apiserver lists only what it serves. Two decisions here:
//!
//! - [`OpenApiUnion::route`]: `GET /openapi/v3` stays local, and the filter adds the peer-only
//!   entries to the local apiserver's 200 answer ([`union_root`]); `/openapi/v3/<path>` of a
//!   peer-only group-version goes to the peers whose entry was listed (so the hash in the URL is
//!   theirs); a retained group-version's document answers 503; anything else stays local.
//! - [`validate_entry`]: what a peer's entry must look like to be listed at all. A peer must not
//!   be able to point kubectl anywhere but the document of the same path. The control plane
//!   keeps only entries that pass, and the filter refuses a configuration with one that does not.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::group_version::{valid_segment, GroupVersion};

/// One peer's `/openapi/v3` entry for a group-version the local apiserver does not serve: a
/// value of the filter configuration's `openapi_v3` (`crate::config::FilterConfig`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenApiPeerEntry {
    /// As the peer lists it: `/openapi/v3/<path>?hash=<hash of its document>`
    /// ([`validate_entry`]).
    pub server_relative_url: String,
    /// A key of the configuration's `peer_clusters`: the peers that list exactly this URL.
    pub peer_cluster: String,
    /// The local apiserver serves this group-version too, and the peers serve every resource
    /// of it that it serves and more: their entry replaces the local one, so that `kubectl
    /// explain` finds the resources only they serve (`FilterFeature::OpenApiReplacesLocal`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replaces_local: bool,
}

/// The root document's path.
pub const ROOT_PATH: &str = "/openapi/v3";
/// Prefix of every group-version document's path.
pub const DOCUMENT_PREFIX: &str = "/openapi/v3/";
/// The local root the filter buffers to add entries to, at most: kube's root is a few hundred
/// bytes per group-version (about 12 KiB for 1.33), and Envoy's buffer limit (1 MiB by default)
/// must never be reached while the filter holds the body. A larger answer passes unchanged.
pub const MAX_ROOT_BYTES: usize = 512 * 1024;
/// The union the filter sends in place of the buffered local root, at most: it replaces the
/// buffered body, so it must stay below Envoy's buffer limit too (1 MiB by default; past it
/// Envoy resets the stream from inside the host call). [`MAX_ENTRIES`] entries with URLs of
/// [`MAX_URL`] bytes would be about 5 MiB; the entries that do not fit, in path order, are
/// left out of the union (their documents are still routed to the peers).
pub const MAX_UNION_BYTES: usize = 896 * 1024;
/// Peer-only entries in one configuration, at most.
pub const MAX_ENTRIES: usize = 4096;
/// Longest `serverRelativeURL` accepted (kube's: the path and a 128-hex-digit hash).
pub const MAX_URL: usize = 1024;

/// Why an entry is not listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryError {
    Path(String),
    Url { path: String, url: String },
    UrlTooLong,
}

impl fmt::Display for EntryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EntryError::Path(p) => write!(
                f,
                "{p:?} is not a group-version path (apis/<group>/<version> or api/<version>)"
            ),
            EntryError::Url { path, url } => write!(
                f,
                "serverRelativeURL {url:?} is not /openapi/v3/{path} with an optional query"
            ),
            EntryError::UrlTooLong => {
                write!(f, "serverRelativeURL is longer than {MAX_URL} bytes")
            }
        }
    }
}

impl std::error::Error for EntryError {}

/// The group-version a root path names (`apis/<g>/<v>`, or `api/<v>` for the core group).
pub fn group_version_of(path: &str) -> Option<GroupVersion> {
    let segments: Vec<&str> = path.split('/').collect();
    match segments.as_slice() {
        ["apis", g, v] if path_segment(g) && path_segment(v) => Some(GroupVersion::new(*g, *v)),
        ["api", v] if path_segment(v) => Some(GroupVersion::new("", *v)),
        _ => None,
    }
}

/// A group or version as kube names them: lower-case letters, digits, `.` and `-`. Nothing
/// that would need escaping in a URL or change its meaning (`%`, `?`, `#`, `..` as a segment).
fn path_segment(s: &str) -> bool {
    valid_segment(s)
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
}

/// A query kube-openapi could have written (`hash=<hex>`): URL-safe characters only, so the
/// URL can neither leave the document's path nor smuggle anything into a header or log line.
fn query_ok(q: &str) -> bool {
    q.bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'=' | b'&' | b'-' | b'_' | b'.' | b'~'))
}

/// An entry is listed only if its path names a group-version and its `serverRelativeURL` is
/// exactly `/openapi/v3/<path>`, optionally followed by `?` and a URL-safe query.
pub fn validate_entry(path: &str, url: &str) -> Result<GroupVersion, EntryError> {
    let gv = group_version_of(path).ok_or_else(|| EntryError::Path(path.to_string()))?;
    if url.len() > MAX_URL {
        return Err(EntryError::UrlTooLong);
    }
    let bad = || EntryError::Url {
        path: path.to_string(),
        url: url.to_string(),
    };
    let rest = url
        .strip_prefix(DOCUMENT_PREFIX)
        .and_then(|r| r.strip_prefix(path))
        .ok_or_else(bad)?;
    match rest.strip_prefix('?') {
        None if rest.is_empty() => Ok(gv),
        Some(query) if query_ok(query) => Ok(gv),
        _ => Err(bad()),
    }
}

/// Where an OpenAPI request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenApiRoute<'a> {
    /// `GET /openapi/v3`: to the local apiserver, which authorizes it; its 200 answer gets the
    /// peer-only entries added.
    Root,
    /// The document of a peer-only group-version: to the peers whose entry is listed.
    Peer {
        cluster: &'a str,
        group_version: &'a GroupVersion,
    },
    /// Neither: the routing table decides (which sends non-resource paths local).
    NotOurs,
}

#[derive(Debug)]
struct Entry {
    group_version: GroupVersion,
    /// The entry as it is added to the root: `{"serverRelativeURL":"..."}`.
    json: Box<RawValue>,
    cluster: String,
    replaces_local: bool,
}

impl Entry {
    /// What adding it to `paths` adds to the serialised root, at most: `"<path>":<json>,`
    /// (a valid path needs no escaping).
    fn added_bytes(&self, path: &str) -> usize {
        path.len() + self.json.get().len() + 4
    }
}

/// The peer-only entries of one configuration, compiled for request time.
#[derive(Debug, Default)]
pub struct OpenApiUnion {
    /// By root path (`apis/<g>/<v>`).
    entries: BTreeMap<String, Entry>,
}

#[derive(Serialize)]
struct EntryJson<'a> {
    #[serde(rename = "serverRelativeURL")]
    server_relative_url: &'a str,
}

impl OpenApiUnion {
    /// Entries that fail [`validate_entry`] are left out (the configuration's validation has
    /// refused them already; this keeps the compiled form correct on its own).
    pub fn compile(entries: &BTreeMap<String, OpenApiPeerEntry>) -> Self {
        let entries = entries
            .iter()
            .filter_map(|(path, e)| {
                let group_version = validate_entry(path, &e.server_relative_url).ok()?;
                let json = serde_json::to_string(&EntryJson {
                    server_relative_url: &e.server_relative_url,
                })
                .ok()
                .and_then(|s| RawValue::from_string(s).ok())?;
                Some((
                    path.clone(),
                    Entry {
                        group_version,
                        json,
                        cluster: e.peer_cluster.clone(),
                        replaces_local: e.replaces_local,
                    },
                ))
            })
            .collect();
        OpenApiUnion { entries }
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Decide for one request (`path_and_query` is Envoy's `:path`).
    pub fn route(&self, method: &str, path_and_query: &str) -> OpenApiRoute<'_> {
        if self.entries.is_empty() {
            return OpenApiRoute::NotOurs;
        }
        let path = path_and_query
            .split_once('?')
            .map_or(path_and_query, |(p, _)| p);
        if path == ROOT_PATH {
            // HEAD has no body to add to; other methods get the apiserver's own answer.
            return if method == "GET" {
                OpenApiRoute::Root
            } else {
                OpenApiRoute::NotOurs
            };
        }
        match path
            .strip_prefix(DOCUMENT_PREFIX)
            .and_then(|p| self.entries.get(p))
        {
            Some(entry) => OpenApiRoute::Peer {
                cluster: &entry.cluster,
                group_version: &entry.group_version,
            },
            None => OpenApiRoute::NotOurs,
        }
    }
}

/// The union [`union_root`] made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnionRoot {
    /// At most [`MAX_UNION_BYTES`].
    pub body: Vec<u8>,
    /// Peer-only entries left out because the union would have been larger.
    pub left_out: usize,
}

/// Why the local root stands unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootError {
    TooLarge(usize),
    NotARoot(String),
    Serialise(String),
    /// The union came out larger than [`MAX_UNION_BYTES`] (it cannot: the bound is checked
    /// as entries are added; kept so the cap holds whatever serde does).
    UnionTooLarge(usize),
}

impl fmt::Display for RootError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RootError::TooLarge(n) => write!(
                f,
                "the local /openapi/v3 answer is {n} bytes, more than the {MAX_ROOT_BYTES} buffered"
            ),
            RootError::NotARoot(e) => write!(
                f,
                "the local /openapi/v3 answer is not a JSON object with a \"paths\" object: {e}"
            ),
            RootError::Serialise(e) => write!(f, "serialising the union failed: {e}"),
            RootError::UnionTooLarge(n) => write!(
                f,
                "the /openapi/v3 union is {n} bytes, more than the {MAX_UNION_BYTES} sent"
            ),
        }
    }
}

/// The local apiserver's root with the peer-only entries added. The local entries stay the
/// local apiserver's own (their hashes are always fresh), so is every other field; a path the
/// local answer lists already keeps the local entry, unless the peers' entry replaces it
/// ([`OpenApiPeerEntry::replaces_local`]). Keys come out sorted, as kube writes them.
///
/// The union is at most [`MAX_UNION_BYTES`]: re-serialised, the local root is no longer than
/// it came (whitespace goes, escapes stay or shrink, raw values are copied), and each entry
/// adds at most [`Entry::added_bytes`]; entries that would pass the cap are left out, in path
/// order, and counted. Nothing larger is ever built.
pub fn union_root(local: &[u8], union: &OpenApiUnion) -> Result<UnionRoot, RootError> {
    if local.len() > MAX_ROOT_BYTES {
        return Err(RootError::TooLarge(local.len()));
    }
    let mut root: BTreeMap<String, Box<RawValue>> =
        serde_json::from_slice(local).map_err(|e| RootError::NotARoot(e.to_string()))?;
    let mut paths: BTreeMap<String, &RawValue> = match root.get("paths") {
        Some(raw) => serde_json::from_str(raw.get())
            .map_err(|e| RootError::NotARoot(format!("paths: {e}")))?,
        None => return Err(RootError::NotARoot("no paths".to_string())),
    };
    let mut size = local.len();
    let mut left_out = 0;
    for (path, entry) in &union.entries {
        if let Some(local_entry) = paths.get(path) {
            if entry.replaces_local {
                // Same path, the peers' URL: the size changes by the difference of the two.
                let (old, new) = (local_entry.get().len(), entry.json.get().len());
                if new > old && size.saturating_add(new - old) > MAX_UNION_BYTES {
                    left_out += 1;
                    continue;
                }
                size = size.saturating_add(new).saturating_sub(old);
                paths.insert(path.clone(), &entry.json);
            }
            continue;
        }
        let added = entry.added_bytes(path);
        if size.saturating_add(added) > MAX_UNION_BYTES {
            left_out += 1;
            continue;
        }
        size += added;
        paths.insert(path.clone(), &entry.json);
    }
    let paths =
        serde_json::value::to_raw_value(&paths).map_err(|e| RootError::Serialise(e.to_string()))?;
    root.insert("paths".to_string(), paths);
    let body = serde_json::to_vec(&root).map_err(|e| RootError::Serialise(e.to_string()))?;
    if body.len() > MAX_UNION_BYTES {
        return Err(RootError::UnionTooLarge(body.len()));
    }
    Ok(UnionRoot { body, left_out })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(url: &str, cluster: &str) -> OpenApiPeerEntry {
        OpenApiPeerEntry {
            server_relative_url: url.to_string(),
            peer_cluster: cluster.to_string(),
            replaces_local: false,
        }
    }

    fn union() -> OpenApiUnion {
        let mut m = BTreeMap::new();
        m.insert(
            "apis/coordination.k8s.io/v1beta1".to_string(),
            entry(
                "/openapi/v3/apis/coordination.k8s.io/v1beta1?hash=ABC123",
                "skewgate-peers-0123456789ab",
            ),
        );
        OpenApiUnion::compile(&m)
    }

    #[test]
    fn entries_are_validated() {
        let p = "apis/coordination.k8s.io/v1beta1";
        let cases: &[(&str, &str, bool)] = &[
            (
                p,
                "/openapi/v3/apis/coordination.k8s.io/v1beta1?hash=0A1B",
                true,
            ),
            (p, "/openapi/v3/apis/coordination.k8s.io/v1beta1", true),
            ("api/v1", "/openapi/v3/api/v1?hash=FF", true),
            // Another document, another place, a longer path, a fragment, an escape.
            (p, "/openapi/v3/apis/apps/v1?hash=0A", false),
            (
                p,
                "https://evil.example/openapi/v3/apis/coordination.k8s.io/v1beta1",
                false,
            ),
            (
                p,
                "//evil.example/openapi/v3/apis/coordination.k8s.io/v1beta1",
                false,
            ),
            (
                p,
                "/openapi/v3/apis/coordination.k8s.io/v1beta1/../../../apis/x/v1",
                false,
            ),
            (p, "/openapi/v3/apis/coordination.k8s.io/v1beta1#x", false),
            (
                p,
                "/openapi/v3/apis/coordination.k8s.io/v1beta1?hash=a%0d%0a",
                false,
            ),
            (
                p,
                "/openapi/v3/apis/coordination.k8s.io/v1beta1?hash=a b",
                false,
            ),
            (p, "/openapi/v3/apis/coordination.k8s.io/v1beta1x", false),
            (p, "", false),
            // Paths that are not group-versions.
            ("apis/../v1", "/openapi/v3/apis/../v1", false),
            ("apis/Apps/v1", "/openapi/v3/apis/Apps/v1", false),
            ("apis/apps", "/openapi/v3/apis/apps", false),
            ("version", "/openapi/v3/version", false),
            ("apis/a%2Fb/v1", "/openapi/v3/apis/a%2Fb/v1", false),
        ];
        for (path, url, ok) in cases {
            assert_eq!(validate_entry(path, url).is_ok(), *ok, "{path} {url}");
        }
        let long = format!("/openapi/v3/{p}?hash={}", "A".repeat(MAX_URL));
        assert_eq!(validate_entry(p, &long), Err(EntryError::UrlTooLong));
    }

    #[test]
    fn routes() {
        let u = union();
        let gv = GroupVersion::new("coordination.k8s.io", "v1beta1");
        let peer = OpenApiRoute::Peer {
            cluster: "skewgate-peers-0123456789ab",
            group_version: &gv,
        };
        let cases: &[(&str, &str, OpenApiRoute<'_>)] = &[
            ("GET", "/openapi/v3", OpenApiRoute::Root),
            ("GET", "/openapi/v3?timeout=32s", OpenApiRoute::Root),
            ("HEAD", "/openapi/v3", OpenApiRoute::NotOurs),
            ("POST", "/openapi/v3", OpenApiRoute::NotOurs),
            ("GET", "/openapi/v3/", OpenApiRoute::NotOurs),
            (
                "GET",
                "/openapi/v3/apis/coordination.k8s.io/v1beta1?hash=ABC123",
                peer,
            ),
            ("GET", "/openapi/v3/apis/coordination.k8s.io/v1beta1", peer),
            // A stale hash still goes to the peer, which redirects to its current URL.
            (
                "GET",
                "/openapi/v3/apis/coordination.k8s.io/v1beta1?hash=OLD",
                peer,
            ),
            (
                "GET",
                "/openapi/v3/apis/coordination.k8s.io/v1",
                OpenApiRoute::NotOurs,
            ),
            (
                "GET",
                "/openapi/v3/apis/coordination.k8s.io/v1beta1/",
                OpenApiRoute::NotOurs,
            ),
            (
                "GET",
                "/openapi/v3/apis/coordination.k8s.io%2Fv1beta1",
                OpenApiRoute::NotOurs,
            ),
            ("GET", "/openapi/v2", OpenApiRoute::NotOurs),
            (
                "GET",
                "/apis/coordination.k8s.io/v1beta1",
                OpenApiRoute::NotOurs,
            ),
        ];
        for (method, path, want) in cases {
            assert_eq!(u.route(method, path), *want, "{method} {path}");
        }
        // Without entries nothing is ours: the root stays the local apiserver's, unbuffered.
        assert_eq!(
            OpenApiUnion::default().route("GET", "/openapi/v3"),
            OpenApiRoute::NotOurs
        );
    }

    #[test]
    fn union_adds_peer_entries_and_keeps_local_ones() {
        let local = br#"{"paths":{"api/v1":{"serverRelativeURL":"/openapi/v3/api/v1?hash=L1"},"apis/coordination.k8s.io/v1":{"serverRelativeURL":"/openapi/v3/apis/coordination.k8s.io/v1?hash=L2"}}}"#;
        let out = union_root(local, &union()).unwrap();
        assert_eq!(out.left_out, 0);
        assert_eq!(
            std::str::from_utf8(&out.body).unwrap(),
            r#"{"paths":{"api/v1":{"serverRelativeURL":"/openapi/v3/api/v1?hash=L1"},"apis/coordination.k8s.io/v1":{"serverRelativeURL":"/openapi/v3/apis/coordination.k8s.io/v1?hash=L2"},"apis/coordination.k8s.io/v1beta1":{"serverRelativeURL":"/openapi/v3/apis/coordination.k8s.io/v1beta1?hash=ABC123"}}}"#
        );
        // The local apiserver serves it after all: its own entry wins.
        let local = br#"{"paths":{"apis/coordination.k8s.io/v1beta1":{"serverRelativeURL":"/openapi/v3/apis/coordination.k8s.io/v1beta1?hash=MINE"}},"x":1}"#;
        let out = union_root(local, &union()).unwrap();
        assert_eq!(
            std::str::from_utf8(&out.body).unwrap(),
            r#"{"paths":{"apis/coordination.k8s.io/v1beta1":{"serverRelativeURL":"/openapi/v3/apis/coordination.k8s.io/v1beta1?hash=MINE"}},"x":1}"#
        );
    }

    /// A peer that serves more of a group-version than the local apiserver (a newer release):
    /// its entry replaces the local one, and its document is routed to it; the route of a
    /// path whose entry does not replace stays the local answer in the root.
    #[test]
    fn an_entry_that_replaces_the_local_one_takes_its_place() {
        let path = "apis/certificates.k8s.io/v1";
        let mut m = BTreeMap::new();
        m.insert(
            path.to_string(),
            OpenApiPeerEntry {
                replaces_local: true,
                ..entry(
                    "/openapi/v3/apis/certificates.k8s.io/v1?hash=PEER",
                    "skewgate-peers-b",
                )
            },
        );
        let union = OpenApiUnion::compile(&m);
        let local = br#"{"paths":{"api/v1":{"serverRelativeURL":"/openapi/v3/api/v1?hash=L1"},"apis/certificates.k8s.io/v1":{"serverRelativeURL":"/openapi/v3/apis/certificates.k8s.io/v1?hash=MINE"}}}"#;
        let out = union_root(local, &union).unwrap();
        assert_eq!(out.left_out, 0);
        assert_eq!(
            std::str::from_utf8(&out.body).unwrap(),
            r#"{"paths":{"api/v1":{"serverRelativeURL":"/openapi/v3/api/v1?hash=L1"},"apis/certificates.k8s.io/v1":{"serverRelativeURL":"/openapi/v3/apis/certificates.k8s.io/v1?hash=PEER"}}}"#
        );
        assert_eq!(
            union.route("GET", "/openapi/v3/apis/certificates.k8s.io/v1?hash=PEER"),
            OpenApiRoute::Peer {
                cluster: "skewgate-peers-b",
                group_version: &GroupVersion::new("certificates.k8s.io", "v1"),
            }
        );
        // The local root does not list it (the local apiserver stopped serving it): added.
        let out = union_root(br#"{"paths":{}}"#, &union).unwrap();
        assert!(std::str::from_utf8(&out.body)
            .unwrap()
            .contains("hash=PEER"));
    }

    /// [`MAX_ENTRIES`] entries with groups of 206 characters, their URLs [`MAX_URL`] long
    /// (`longest`) or with kube's 128-digit hash.
    fn entries_at_the_limit(longest: bool) -> OpenApiUnion {
        let entries: BTreeMap<String, OpenApiPeerEntry> = (0..MAX_ENTRIES)
            .map(|i| {
                let path = format!("apis/g{i:04}.{}/v1", "x".repeat(200));
                let url = format!("/openapi/v3/{path}?hash=");
                let hash = "A".repeat(if longest { MAX_URL - url.len() } else { 128 });
                (
                    path,
                    entry(&format!("{url}{hash}"), "skewgate-peers-0123456789ab"),
                )
            })
            .collect();
        let union = OpenApiUnion::compile(&entries);
        assert_eq!(union.entries.len(), MAX_ENTRIES, "every entry is valid");
        union
    }

    /// A local root of `len` bytes with two entries of its own (kube's is about 12 KiB).
    fn local_root(len: usize) -> Vec<u8> {
        let head = r#"{"paths":{"api/v1":{"serverRelativeURL":"/openapi/v3/api/v1?hash=L1"},"apis/g0000.x/v1":{"serverRelativeURL":"/openapi/v3/apis/g0000.x/v1?hash=L2"}},"pad":""#;
        let mut root = head.to_string();
        root.push_str(&"p".repeat(len.saturating_sub(head.len() + 2)));
        root.push_str("\"}");
        assert_eq!(root.len(), len);
        root.into_bytes()
    }

    #[test]
    fn the_union_stays_under_envoys_buffer_limit_at_the_entry_limit() {
        for (what, longest, local_len) in [
            ("URLs of the longest length allowed", true, 12 * 1024),
            ("kube's hashes", false, 12 * 1024),
            ("the largest local root buffered", true, MAX_ROOT_BYTES),
        ] {
            let union = entries_at_the_limit(longest);
            let local = local_root(local_len);
            let out = union_root(&local, &union).unwrap();
            assert!(
                out.body.len() <= MAX_UNION_BYTES,
                "{what}: {}",
                out.body.len()
            );
            let root: BTreeMap<String, Box<RawValue>> = serde_json::from_slice(&out.body).unwrap();
            let paths: BTreeMap<String, Box<RawValue>> =
                serde_json::from_str(root["paths"].get()).unwrap();
            // The local entries and fields stay; the peer entries that fit are added in path
            // order, the rest are counted.
            let local_paths = ["api/v1", "apis/g0000.x/v1"];
            for path in local_paths {
                assert!(paths.contains_key(path), "{what}: {path}");
            }
            assert!(root.contains_key("pad"), "{what}");
            let added: Vec<&String> = paths
                .keys()
                .filter(|p| !local_paths.contains(&p.as_str()))
                .collect();
            assert!(out.left_out > 0, "{what}: everything fit");
            assert_eq!(added.len() + out.left_out, MAX_ENTRIES, "{what}");
            let first: Vec<&String> = union.entries.keys().take(added.len()).collect();
            assert_eq!(added, first, "{what}");
            // Nearly full: the next entry would not have fit.
            assert!(
                out.body.len() + 1300 > MAX_UNION_BYTES,
                "{what}: {} bytes",
                out.body.len()
            );
        }
        // Below the cap nothing is left out.
        let few = OpenApiUnion {
            entries: entries_at_the_limit(true)
                .entries
                .into_iter()
                .take(100)
                .collect(),
        };
        assert_eq!(
            union_root(&local_root(12 * 1024), &few).unwrap().left_out,
            0
        );
    }

    #[test]
    fn a_local_answer_that_is_not_a_root_stands() {
        let cases: &[&[u8]] = &[
            b"",
            b"not json",
            b"[]",
            b"{}",
            br#"{"paths":[]}"#,
            b"{\"paths\":{",
        ];
        for body in cases {
            assert!(
                matches!(union_root(body, &union()), Err(RootError::NotARoot(_))),
                "{body:?}"
            );
        }
        let huge = vec![b' '; MAX_ROOT_BYTES + 1];
        assert_eq!(
            union_root(&huge, &union()),
            Err(RootError::TooLarge(MAX_ROOT_BYTES + 1))
        );
    }
}
