//! OpenAPI v3 of group-versions only peers serve (docs/ARCHITECTURE.md "OpenAPI v3").
//!
//! Each apiserver's `/openapi/v3` root is fetched with its discovery ([`crate::fetch`]) and
//! kept as [`OpenApiRoot`]: only the entries [`skewgate_core::openapi::validate_entry`] accepts
//! (a group-version path, and a `serverRelativeURL` that is that path's document, so a peer
//! cannot point kubectl anywhere else). [`peer_entries`] then picks, for every group-version
//! the local apiserver does not serve, the entry of the live peers that serve it, which the
//! filter adds to the local root and routes to.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;
use skewgate_core::group_version::GroupVersion;
use skewgate_core::openapi::{validate_entry, MAX_ENTRIES};

use super::ServedApis;

/// The largest `/openapi/v3` root read: [`MAX_ENTRIES`] entries of a few hundred bytes (kube's
/// 1.33 root is about 12 KiB); reading stops there.
pub const MAX_ROOT_BYTES: usize = 2 * 1024 * 1024;

/// One apiserver's `/openapi/v3` root: root path (`apis/<g>/<v>`, `api/v1`) →
/// `serverRelativeURL`, valid entries only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenApiRoot {
    pub paths: BTreeMap<String, String>,
}

/// Why a root is not used at all.
#[derive(Debug, thiserror::Error)]
pub enum OpenApiError {
    #[error("the /openapi/v3 answer is {bytes} bytes, more than the {max} allowed")]
    TooLarge { bytes: usize, max: usize },
    #[error("the /openapi/v3 answer is not a JSON object with a \"paths\" object: {0}")]
    NotARoot(#[from] serde_json::Error),
    #[error(
        "the /openapi/v3 answer lists {0} group-versions, more than the {MAX_ENTRIES} allowed"
    )]
    TooMany(usize),
}

#[derive(Deserialize)]
struct RawRoot {
    paths: BTreeMap<String, serde_json::Value>,
}

impl OpenApiRoot {
    /// Parse a root. Entries that are not an object with a valid `serverRelativeURL` are left
    /// out, each on its own (their group-versions keep the local answer); they come back
    /// with the reason, for a log line. Paths that name no group-version are not ours and are
    /// passed over without a word: kube-apiserver lists its other documents there too
    /// (`version`, `api`, `apis`, `apis/<group>`, `.well-known/openid-configuration`,
    /// `openid/v1/jwks`).
    pub fn parse(body: &[u8], max_bytes: usize) -> Result<(Self, Vec<String>), OpenApiError> {
        if body.len() > max_bytes {
            return Err(OpenApiError::TooLarge {
                bytes: body.len(),
                max: max_bytes,
            });
        }
        let raw: RawRoot = serde_json::from_slice(body)?;
        if raw.paths.len() > MAX_ENTRIES {
            return Err(OpenApiError::TooMany(raw.paths.len()));
        }
        let mut paths = BTreeMap::new();
        let mut refused = Vec::new();
        for (path, entry) in raw.paths {
            if skewgate_core::openapi::group_version_of(&path).is_none() {
                continue;
            }
            let Some(url) = entry.get("serverRelativeURL").and_then(|u| u.as_str()) else {
                refused.push(format!("{path:?}: no serverRelativeURL string"));
                continue;
            };
            match validate_entry(&path, url) {
                Ok(_) => {
                    paths.insert(path, url.to_string());
                }
                Err(e) => refused.push(e.to_string()),
            }
        }
        Ok((OpenApiRoot { paths }, refused))
    }
}

/// A live peer as [`peer_entries`] sees it.
#[derive(Debug, Clone, Copy)]
pub struct PeerRoot<'a> {
    pub id: &'a str,
    pub served: &'a ServedApis,
    pub root: Option<&'a OpenApiRoot>,
}

/// The entry chosen for one group-version, and the peers that list exactly it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerEntry {
    pub server_relative_url: String,
    /// Sorted, distinct.
    pub peer_ids: Vec<String>,
    /// The local apiserver serves the group-version too, fewer of its resources: this entry
    /// replaces the local one.
    pub replaces_local: bool,
}

/// For every group-version the local apiserver does not serve (and that is not shared
/// storage, which every apiserver serves), the entry of the live peers that both serve it (by
/// their discovery) and list it in their root. Peers listing different URLs (different
/// documents, e.g. different versions) are grouped by URL; the URL most peers list wins, and
/// among equals the smallest, so the choice is deterministic. Only the peers of that URL
/// serve its requests: the hash in it is theirs.
///
/// At most [`MAX_ENTRIES`], the first in path order: each root is held to that many, but
/// several peers together could list more, and the filter refuses a configuration with more
/// (a NACK, which would freeze routing).
pub fn peer_entries(
    local: &ServedApis,
    shared_storage: &BTreeSet<GroupVersion>,
    peers: &[PeerRoot<'_>],
) -> BTreeMap<String, PeerEntry> {
    // path -> url -> peer ids
    let mut candidates: BTreeMap<&str, BTreeMap<&str, BTreeSet<&str>>> = BTreeMap::new();
    for peer in peers {
        let Some(root) = peer.root else { continue };
        for (path, url) in &root.paths {
            let Some(gv) = skewgate_core::openapi::group_version_of(path) else {
                continue;
            };
            if shared_storage.contains(&gv) {
                continue;
            }
            let Some(theirs) = peer.served.resources(&gv.group, &gv.version) else {
                continue;
            };
            // A group-version the local apiserver serves keeps its own entry unless the peer
            // serves every kind of it that the local one does, and more: a newer release,
            // typically, whose document describes the local kinds too, and the one `kubectl
            // explain` needs for the new kinds. Subresources do not count (core/v1 grows by
            // `pods/resize` in 1.33, and no kind is new there: the local document stands).
            // Where each serves a kind the other does not, neither document describes
            // everything, and the local one stands too.
            if let Some(ours) = local.resources(&gv.group, &gv.version) {
                let kinds = |keys: &std::collections::BTreeSet<String>| -> BTreeSet<String> {
                    keys.iter().filter(|k| !k.contains('/')).cloned().collect()
                };
                let (theirs, ours) = (kinds(theirs), kinds(ours));
                if !(theirs.len() > ours.len() && theirs.is_superset(&ours)) {
                    continue;
                }
            }
            candidates
                .entry(path)
                .or_default()
                .entry(url)
                .or_default()
                .insert(peer.id);
        }
    }
    candidates
        .into_iter()
        .filter_map(|(path, urls)| {
            // Most peers first; BTreeMap order (smallest URL) breaks ties as `max_by` keeps
            // the last maximum, so iterate in reverse.
            let (url, ids) = urls.iter().rev().max_by_key(|(_, ids)| ids.len())?;
            let replaces_local = skewgate_core::openapi::group_version_of(path)
                .is_some_and(|gv| local.serves_group_version(&gv.group, &gv.version));
            Some((
                path.to_string(),
                PeerEntry {
                    server_relative_url: (*url).to_string(),
                    peer_ids: ids.iter().map(|id| (*id).to_string()).collect(),
                    replaces_local,
                },
            ))
        })
        .take(MAX_ENTRIES)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_fixtures::documents;

    const P: &str = "apis/coordination.k8s.io/v1beta1";

    fn root(entries: &[(&str, &str)]) -> OpenApiRoot {
        OpenApiRoot {
            paths: entries
                .iter()
                .map(|(p, u)| (p.to_string(), u.to_string()))
                .collect(),
        }
    }

    #[test]
    fn roots_are_parsed_and_bad_entries_left_out() {
        let body = br#"{"paths":{
            "api/v1":{"serverRelativeURL":"/openapi/v3/api/v1?hash=AA"},
            "apis/coordination.k8s.io/v1beta1":{"serverRelativeURL":"/openapi/v3/apis/coordination.k8s.io/v1beta1?hash=BB","x":1},
            "apis/evil/v1":{"serverRelativeURL":"https://evil.example/x"},
            "apis/other/v1":{"serverRelativeURL":"/openapi/v3/apis/coordination.k8s.io/v1beta1?hash=BB"},
            "apis/nourl/v1":{},
            "apis/number/v1":{"serverRelativeURL":7},
            "version":{"serverRelativeURL":"/openapi/v3/version"},
            "apis/apps":{"serverRelativeURL":"/openapi/v3/apis/apps?hash=CC"},
            ".well-known/openid-configuration":{"serverRelativeURL":"/openapi/v3/.well-known/openid-configuration?hash=DD"}
        },"extra":true}"#;
        let (root, refused) = OpenApiRoot::parse(body, 1 << 20).unwrap();
        assert_eq!(
            root.paths.keys().collect::<Vec<_>>(),
            ["api/v1", "apis/coordination.k8s.io/v1beta1"]
        );
        // kube-apiserver's own documents that name no group-version are not refusals: they
        // are passed over without a log line (a real 1.36 root lists six of them).
        assert_eq!(refused.len(), 4, "{refused:?}");
        assert!(
            refused
                .iter()
                .all(|r| !r.contains("version\"") && !r.contains("well-known")),
            "{refused:?}"
        );
    }

    #[test]
    fn garbage_and_huge_roots_are_refused() {
        let cases: &[&[u8]] = &[b"", b"garbage", b"[]", b"{}", br#"{"paths":[]}"#, b"null"];
        for body in cases {
            assert!(
                matches!(
                    OpenApiRoot::parse(body, 1 << 20),
                    Err(OpenApiError::NotARoot(_))
                ),
                "{body:?}"
            );
        }
        let big = format!(r#"{{"paths":{{}},"pad":"{}"}}"#, "x".repeat(100));
        assert!(matches!(
            OpenApiRoot::parse(big.as_bytes(), 50),
            Err(OpenApiError::TooLarge { .. })
        ));
        let many: BTreeMap<String, serde_json::Value> = (0..=MAX_ENTRIES)
            .map(|i| (format!("apis/g{i}/v1"), serde_json::json!({})))
            .collect();
        let many = serde_json::to_vec(&serde_json::json!({ "paths": many })).unwrap();
        assert!(matches!(
            OpenApiRoot::parse(&many, usize::MAX),
            Err(OpenApiError::TooMany(_))
        ));
    }

    #[test]
    fn peer_only_group_versions_get_the_entry_most_serving_peers_list() {
        let local = documents("k8s-1.30").served().unwrap();
        let new = documents("k8s-1.33").served().unwrap();
        let u1 = "/openapi/v3/apis/coordination.k8s.io/v1beta1?hash=H1";
        let u2 = "/openapi/v3/apis/coordination.k8s.io/v1beta1?hash=H2";
        let local_gv = ("apis/apps/v1", "/openapi/v3/apis/apps/v1?hash=PEER");
        let (b, c, d) = (
            root(&[(P, u2), local_gv]),
            root(&[(P, u1)]),
            root(&[(P, u1)]),
        );
        let empty = ServedApis::new();
        let peer = |id, served, root| PeerRoot { id, served, root };
        // (peers, shared storage, expected entry for P)
        type Case<'a> = (
            Vec<PeerRoot<'a>>,
            BTreeSet<GroupVersion>,
            Option<(&'a str, Vec<&'a str>)>,
        );
        let cases: Vec<Case<'_>> = vec![
            (
                vec![peer("b", &new, Some(&b))],
                BTreeSet::new(),
                Some((u2, vec!["b"])),
            ),
            // Two peers list H1, one H2: H1 and only its peers.
            (
                vec![
                    peer("b", &new, Some(&b)),
                    peer("c", &new, Some(&c)),
                    peer("d", &new, Some(&d)),
                ],
                BTreeSet::new(),
                Some((u1, vec!["c", "d"])),
            ),
            // A tie: the smallest URL.
            (
                vec![peer("b", &new, Some(&b)), peer("c", &new, Some(&c))],
                BTreeSet::new(),
                Some((u1, vec!["c"])),
            ),
            // A peer whose discovery does not serve it, or without a root: nothing.
            (vec![peer("b", &empty, Some(&b))], BTreeSet::new(), None),
            (vec![peer("b", &new, None)], BTreeSet::new(), None),
            // Shared storage is everyone's: the local answer.
            (
                vec![peer("b", &new, Some(&b))],
                BTreeSet::from([GroupVersion::new("coordination.k8s.io", "v1beta1")]),
                None,
            ),
        ];
        for (i, (peers, shared, want)) in cases.into_iter().enumerate() {
            let got = peer_entries(&local, &shared, &peers);
            // The local apiserver serves apps/v1: never a peer's entry.
            assert!(!got.contains_key(local_gv.0), "case {i}");
            let got = got.get(P).map(|e| {
                (
                    e.server_relative_url.as_str(),
                    e.peer_ids.iter().map(String::as_str).collect::<Vec<_>>(),
                )
            });
            assert_eq!(got, want, "case {i}");
        }
    }

    /// A group-version both serve, as certificates.k8s.io/v1 between a real 1.36 and 1.37
    /// (1.37 adds clustertrustbundles and podcertificaterequests): the peer's entry replaces
    /// the local one only where the peer serves everything the local apiserver serves there
    /// and more; an equal or a different set keeps the local entry.
    #[test]
    fn a_group_version_both_serve_takes_the_peers_entry_where_it_serves_more() {
        const CERTS: &str = "apis/certificates.k8s.io/v1";
        let served = |keys: &[&str]| {
            let mut s = ServedApis::new();
            for key in keys {
                s.add_resource("certificates.k8s.io", "v1", key).unwrap();
            }
            s
        };
        let local = served(&[
            "certificatesigningrequests",
            "certificatesigningrequests/status",
        ]);
        let newer = served(&[
            "certificatesigningrequests",
            "certificatesigningrequests/status",
            "clustertrustbundles",
            "podcertificaterequests",
            "podcertificaterequests/status",
        ]);
        let same = local.clone();
        let different = served(&["clustertrustbundles"]);
        // More subresources only (core/v1's pods/resize in 1.33): no new kind to explain.
        let more_subresources = served(&[
            "certificatesigningrequests",
            "certificatesigningrequests/status",
            "certificatesigningrequests/approval",
        ]);
        let url = "/openapi/v3/apis/certificates.k8s.io/v1?hash=PEER";
        let root = root(&[(CERTS, url)]);
        let entry = |served| {
            peer_entries(
                &local,
                &BTreeSet::new(),
                &[PeerRoot {
                    id: "b",
                    served,
                    root: Some(&root),
                }],
            )
            .remove(CERTS)
        };
        assert_eq!(
            entry(&newer),
            Some(PeerEntry {
                server_relative_url: url.into(),
                peer_ids: vec!["b".into()],
                replaces_local: true,
            })
        );
        assert_eq!(entry(&same), None);
        assert_eq!(entry(&different), None);
        assert_eq!(entry(&more_subresources), None);
        // A group-version the local apiserver does not serve at all: added, not replacing.
        let e = peer_entries(
            &ServedApis::new(),
            &BTreeSet::new(),
            &[PeerRoot {
                id: "b",
                served: &newer,
                root: Some(&root),
            }],
        )
        .remove(CERTS)
        .expect("a peer-only entry");
        assert!(!e.replaces_local);
    }

    #[test]
    fn peers_together_never_list_more_than_the_filter_accepts() {
        // Two peers, each within the limit on its own, serving and listing different
        // group-versions: more than MAX_ENTRIES together.
        let per_peer = MAX_ENTRIES * 3 / 4;
        let peer = |prefix: &str| {
            let groups: Vec<serde_json::Value> = (0..per_peer)
                .map(|i| {
                    serde_json::json!({
                        "metadata": {"name": format!("{prefix}{i:04}.example.com")},
                        "versions": [{"version": "v1", "resources": [{"resource": "widgets"}]}]
                    })
                })
                .collect();
            let list: crate::discovery::APIGroupDiscoveryList = serde_json::from_value(
                serde_json::json!({"kind": "APIGroupDiscoveryList", "items": groups}),
            )
            .unwrap();
            let paths = (0..per_peer)
                .map(|i| {
                    let path = format!("apis/{prefix}{i:04}.example.com/v1");
                    let url = format!("/openapi/v3/{path}?hash=A");
                    (path, url)
                })
                .collect();
            (
                ServedApis::from_aggregated(&list).unwrap(),
                OpenApiRoot { paths },
            )
        };
        let (b, c) = (peer("b"), peer("c"));
        let local = documents("k8s-1.30").served().unwrap();
        let got = peer_entries(
            &local,
            &BTreeSet::new(),
            &[
                PeerRoot {
                    id: "b",
                    served: &b.0,
                    root: Some(&b.1),
                },
                PeerRoot {
                    id: "c",
                    served: &c.0,
                    root: Some(&c.1),
                },
            ],
        );
        assert_eq!(got.len(), MAX_ENTRIES);
        // The first in path order: all of b's, then c's.
        assert!(got.contains_key("apis/b0000.example.com/v1"));
        assert!(got.contains_key(&format!("apis/b{:04}.example.com/v1", per_peer - 1)));
        assert!(got.contains_key("apis/c0000.example.com/v1"));
        assert!(!got.contains_key(&format!("apis/c{:04}.example.com/v1", per_peer - 1)));
    }
}
