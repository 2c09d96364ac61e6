//! Peer-aggregated discovery: the union of every apiserver's discovery documents.
//!
//! During an upgrade each apiserver serves a different set of groups, versions and resources.
//! Clients must see the union (KEP-4020 "peer-aggregated discovery"), or controllers that build
//! their view of the cluster from discovery would forget whatever the apiserver they happened to
//! ask does not serve. This module computes that union, deterministically:
//!
//! - Servers are taken in lexicographic order of their id, whatever order they are given in
//!   ("the earlier server" below is the lexicographically smaller id). Equal ids are ordered by
//!   the serialised document, so even that degenerate input gives one answer.
//! - Groups (by `metadata.name`), versions within a group (by `version`) and resources within a
//!   version (by `resource`) are unioned. Subresources are unioned by `subresource`.
//! - For an item several servers have, every field comes from the earlier server, except:
//!   a resource's and a subresource's `verbs` are the sorted union of all copies (kept exactly as
//!   they are when every copy has the same list), and the children lists are merged recursively.
//!   So `responseKind`, `scope`, `singularResource`, `shortNames`, `categories`, unknown fields,
//!   a version's `freshness`, a group's `metadata` and the list's own header all come from the
//!   earlier server that has the item.
//! - Order: see [`merge_order_by`]. Groups, resources and subresources break ties lexicographically;
//!   versions break ties by Kubernetes version priority ([`compare_version_priority`]).
//! - **Preferred version, local first.** A group's first version is its preferred version (the
//!   one clients use, and legacy `preferredVersion`), so it is chosen before the rest is ordered:
//!   - for a group the local apiserver serves (lists with at least one version), the local
//!     apiserver's preferred version (the first it lists), wherever the merge put it. Clients of
//!     that group keep using a version served here and do not depend on a peer, and a peer that
//!     advertises a new version cannot pull every client of the group over to itself;
//!   - for a group only peers serve, the newest version any of them serves (highest
//!     [`compare_version_priority`]).
//!
//!   The other versions follow in the merged order above, that one left out. So the merged
//!   document depends on which server is local (the `local` argument of [`merge_aggregated`]
//!   and [`merge_group_lists`]): each apiserver's merged discovery lists the same versions but
//!   may prefer different ones. For the real 1.30 and 1.33 documents, `resource.k8s.io` (1.30:
//!   `v1alpha2`; 1.33: `v1beta2, v1beta1, v1alpha3`) is `v1alpha2, v1beta2, v1beta1, v1alpha3`
//!   where 1.30 is local and `v1beta2, v1beta1, v1alpha3, v1alpha2` where 1.33 is.
//! - The result serialises to the same bytes for the same local id and the same servers, given
//!   in any order ([`merged_etag`] hashes those bytes).
//!
//! The core group (`/api`, an aggregated list holding one group named `""`) is merged with the
//! same [`merge_aggregated`]; legacy documents have [`merge_group_lists`] (`/apis`) and
//! [`merge_resource_lists`] (one group-version).
//!
//! # Where this differs from upstream kube-apiserver
//!
//! Upstream (`k8s.io/apiserver/pkg/endpoints/discovery/aggregated/peer_aggregated_handler.go` with
//! `k8s.io/apimachinery/pkg/util/sort.MergePreservingRelativeOrder`) uses the same server order,
//! the same "one list holds everything" shortcut and the same Kahn topological merge. On
//! purpose, this module differs where upstream's result is arbitrary or harmful to clients:
//!
//! - **Cycles** (servers disagree on an order): upstream sorts the whole level lexicographically;
//!   here a later server's constraint that would close a cycle is dropped, so the earliest
//!   server's order always survives intact (see [`merge_order_by`]).
//! - **Version ties**: upstream breaks them lexicographically, which for `resource.k8s.io` between
//!   1.30 (`v1alpha2`) and 1.33 (`v1beta2, v1beta1, v1alpha3`) makes `v1alpha2` the preferred
//!   version whichever server is local, so a 1.33 apiserver would send that group's clients to
//!   an alpha it does not serve. Here ties follow Kubernetes version priority.
//! - **Preferred version**: the upstream merge described here takes the first version of the
//!   merged order, whichever server serves it. Here the local apiserver's preferred version comes
//!   first for every group it serves, and the newest version for a group only peers serve.
//! - **Subresources**: upstream takes the later server's copy whole and sorts the list by name
//!   (only when the parent resources differ); here verbs are unioned, the other fields come from
//!   the earlier server, and the order is merged like every other level.
//! - **Verbs**: upstream leaves a resource untouched when all copies are deeply equal and sorts
//!   the verb union otherwise; here the rule is per verb list (an identical list is kept, a
//!   differing one becomes the sorted union).
//! - **More than two servers**: upstream folds versions and resources pairwise; here every level
//!   merges all servers' lists at once (the same result for two servers).
//! - **Duplicates** inside one server's list (never emitted by kube-apiserver) are merged into the
//!   first occurrence, as if they came from the same server; the local apiserver's preferred
//!   version of a group it lists twice is the first version it lists for the group.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeSet, BinaryHeap, HashMap};

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::discovery::{
    APIGroup, APIGroupDiscovery, APIGroupDiscoveryList, APIGroupList, APIResource,
    APIResourceDiscovery, APIResourceList, APISubresourceDiscovery, APIVersionDiscovery,
    AGGREGATED_API_VERSIONS, AGGREGATED_KIND, GROUP_LIST_KIND, RESOURCE_LIST_KIND,
};

/// How two names that no server orders relative to each other are ordered: `Less` puts the
/// first one first.
pub type TieBreak = fn(&str, &str) -> Ordering;

// ---------------------------------------------------------------------------------------------
// Aggregated discovery
// ---------------------------------------------------------------------------------------------

/// Merge the aggregated discovery documents (`/apis`, or `/api` for the core group) of several
/// apiservers, given as `(server id, document)` in any order, for the apiserver whose id is
/// `local`: a group it serves keeps its preferred version first, a group only peers serve has
/// the newest version first (an id none of `servers` has makes every group peer-only). See the
/// module documentation for the rules. With no servers, an empty `apidiscovery.k8s.io/v2` list.
///
/// The list's `kind`, `apiVersion`, `metadata` and unknown fields come from the earliest server:
/// give documents of one `apiVersion` (the caller negotiates it with each apiserver).
pub fn merge_aggregated(
    local: &str,
    servers: &[(String, APIGroupDiscoveryList)],
) -> APIGroupDiscoveryList {
    let lists = by_server_id(servers);
    let preferred = local_preferred(
        local_document(local, &lists)
            .map(|l| l.items.as_slice())
            .unwrap_or_default(),
        |g| &g.metadata.name,
        |g| g.versions.first().map(|v| v.version.as_str()),
    );
    let lists: Vec<&APIGroupDiscoveryList> = lists.into_iter().map(|(_, l)| l).collect();
    let Some(first) = lists.first() else {
        return APIGroupDiscoveryList {
            kind: AGGREGATED_KIND.to_owned(),
            api_version: AGGREGATED_API_VERSIONS[0].to_owned(),
            ..APIGroupDiscoveryList::default()
        };
    };
    let items: Vec<&[APIGroupDiscovery]> = lists.iter().map(|l| l.items.as_slice()).collect();
    APIGroupDiscoveryList {
        kind: first.kind.clone(),
        api_version: first.api_version.clone(),
        metadata: first.metadata.clone(),
        items: merge_keyed(
            &items,
            |g| &g.metadata.name,
            lexicographic,
            |copies| {
                merge_group(
                    copies,
                    preferred.get(copies[0].metadata.name.as_str()).copied(),
                )
            },
        ),
        extra: first.extra.clone(),
    }
}

/// One group's copies merged; `local_preferred` is the local apiserver's preferred version of
/// the group, `None` when only peers serve it.
fn merge_group(copies: &[&APIGroupDiscovery], local_preferred: Option<&str>) -> APIGroupDiscovery {
    let versions: Vec<&[APIVersionDiscovery]> =
        copies.iter().map(|g| g.versions.as_slice()).collect();
    let mut merged = copies[0].clone();
    merged.versions = merge_keyed(
        &versions,
        |v| &v.version,
        compare_version_priority,
        merge_version,
    );
    preferred_first(&mut merged.versions, |v| &v.version, local_preferred);
    merged
}

fn merge_version(copies: &[&APIVersionDiscovery]) -> APIVersionDiscovery {
    let resources: Vec<&[APIResourceDiscovery]> =
        copies.iter().map(|v| v.resources.as_slice()).collect();
    // `freshness` and unknown fields: the earlier server's.
    let mut merged = copies[0].clone();
    merged.resources = merge_keyed(&resources, |r| &r.resource, lexicographic, merge_resource);
    merged
}

fn merge_resource(copies: &[&APIResourceDiscovery]) -> APIResourceDiscovery {
    let subresources: Vec<&[APISubresourceDiscovery]> =
        copies.iter().map(|r| r.subresources.as_slice()).collect();
    let mut merged = copies[0].clone();
    merged.verbs = union_verbs(copies.iter().map(|r| r.verbs.as_slice()));
    merged.subresources = merge_keyed(
        &subresources,
        |s| &s.subresource,
        lexicographic,
        merge_subresource,
    );
    merged
}

fn merge_subresource(copies: &[&APISubresourceDiscovery]) -> APISubresourceDiscovery {
    let mut merged = copies[0].clone();
    merged.verbs = union_verbs(copies.iter().map(|s| s.verbs.as_slice()));
    merged
}

// ---------------------------------------------------------------------------------------------
// Legacy discovery
// ---------------------------------------------------------------------------------------------

/// Merge legacy `/apis` documents (`APIGroupList`) for the apiserver whose id is `local`:
/// groups and their versions are unioned and ordered like [`merge_aggregated`] orders them
/// (the local apiserver's `preferredVersion` of a group first, or, when it names none of the
/// group's versions, the first version it lists); every other field comes from the earliest
/// server that has the group (or version). A group's `preferredVersion` is the merged group's
/// first version, as kube-apiserver always lists the preferred version first.
pub fn merge_group_lists(local: &str, servers: &[(String, APIGroupList)]) -> APIGroupList {
    let lists = by_server_id(servers);
    let preferred = local_preferred(
        local_document(local, &lists)
            .map(|l| l.groups.as_slice())
            .unwrap_or_default(),
        |g| &g.name,
        |g| {
            g.preferred_version
                .as_ref()
                .map(|p| p.version.as_str())
                .filter(|p| g.versions.iter().any(|v| v.version == *p))
                .or_else(|| g.versions.first().map(|v| v.version.as_str()))
        },
    );
    let lists: Vec<&APIGroupList> = lists.into_iter().map(|(_, l)| l).collect();
    let Some(first) = lists.first() else {
        return APIGroupList {
            kind: GROUP_LIST_KIND.to_owned(),
            api_version: "v1".to_owned(),
            ..APIGroupList::default()
        };
    };
    let groups: Vec<&[APIGroup]> = lists.iter().map(|l| l.groups.as_slice()).collect();
    APIGroupList {
        kind: first.kind.clone(),
        api_version: first.api_version.clone(),
        groups: merge_keyed(
            &groups,
            |g| &g.name,
            lexicographic,
            |copies| merge_legacy_group(copies, preferred.get(copies[0].name.as_str()).copied()),
        ),
        extra: first.extra.clone(),
    }
}

fn merge_legacy_group(copies: &[&APIGroup], local_preferred: Option<&str>) -> APIGroup {
    let versions: Vec<&[_]> = copies.iter().map(|g| g.versions.as_slice()).collect();
    let mut merged = copies[0].clone();
    merged.versions = merge_keyed(
        &versions,
        |v| &v.version,
        compare_version_priority,
        |c| c[0].clone(),
    );
    preferred_first(&mut merged.versions, |v| &v.version, local_preferred);
    if let Some(preferred) = merged.versions.first() {
        merged.preferred_version = Some(preferred.clone());
    }
    merged
}

/// Merge legacy `APIResourceList`s of one group-version (`/api/v1`, `/apis/<g>/<v>`): entries
/// (`res` and `res/sub`) are unioned by name, `verbs` as in [`merge_aggregated`], every other
/// field from the earliest server that has the entry; order as in [`merge_order`]. The list's
/// own fields (including `groupVersion`) come from the earliest server: give lists of one
/// group-version.
pub fn merge_resource_lists(servers: &[(String, APIResourceList)]) -> APIResourceList {
    let lists: Vec<&APIResourceList> = by_server_id(servers).into_iter().map(|(_, l)| l).collect();
    let Some(first) = lists.first() else {
        return APIResourceList {
            kind: RESOURCE_LIST_KIND.to_owned(),
            api_version: "v1".to_owned(),
            ..APIResourceList::default()
        };
    };
    let resources: Vec<&[APIResource]> = lists.iter().map(|l| l.resources.as_slice()).collect();
    APIResourceList {
        kind: first.kind.clone(),
        api_version: first.api_version.clone(),
        group_version: first.group_version.clone(),
        resources: merge_keyed(
            &resources,
            |r| &r.name,
            lexicographic,
            |copies| {
                let mut merged = copies[0].clone();
                merged.verbs = union_verbs(copies.iter().map(|r| r.verbs.as_slice()));
                merged
            },
        ),
        extra: first.extra.clone(),
    }
}

// ---------------------------------------------------------------------------------------------
// ETag
// ---------------------------------------------------------------------------------------------

/// Content hash of a serialised merged document: lowercase hex SHA-256 of `bytes` (64
/// characters). Equal bytes, equal tag, whichever server computed it.
pub fn merged_etag(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// [`merged_etag`] as an HTTP `ETag` header value (a strong, quoted entity tag).
pub fn http_etag(bytes: &[u8]) -> String {
    format!("\"{}\"", merged_etag(bytes))
}

// ---------------------------------------------------------------------------------------------
// Building blocks
// ---------------------------------------------------------------------------------------------

/// `(id, document)` in server-id order; equal ids (a caller bug) are ordered by content so the
/// result still does not depend on the input order.
fn by_server_id<T: Serialize>(servers: &[(String, T)]) -> Vec<(&str, &T)> {
    let mut sorted: Vec<&(String, T)> = servers.iter().collect();
    sorted.sort_by(|(a_id, a), (b_id, b)| {
        a_id.cmp(b_id).then_with(|| {
            let a = serde_json::to_vec(a).unwrap_or_default();
            let b = serde_json::to_vec(b).unwrap_or_default();
            a.cmp(&b)
        })
    });
    sorted
        .into_iter()
        .map(|(id, doc)| (id.as_str(), doc))
        .collect()
}

/// The local apiserver's document among `lists` (in server order): the first with id `local`,
/// `None` when no server has that id.
fn local_document<'a, T>(local: &str, lists: &[(&str, &'a T)]) -> Option<&'a T> {
    lists
        .iter()
        .find(|(id, _)| *id == local)
        .map(|(_, doc)| *doc)
}

/// Group name → the local apiserver's preferred version of it, for every group the local
/// document lists with a version. A group listed twice (never emitted by kube-apiserver) takes
/// its first occurrence that has one, as the merge folds repeats into the first occurrence.
fn local_preferred<'a, G>(
    groups: &'a [G],
    name: fn(&G) -> &str,
    preferred: impl Fn(&'a G) -> Option<&'a str>,
) -> HashMap<&'a str, &'a str> {
    let mut out = HashMap::new();
    for group in groups {
        if let Some(version) = preferred(group) {
            out.entry(name(group)).or_insert(version);
        }
    }
    out
}

/// Move a group's preferred version to the front of its merged `versions`, the others keeping
/// their merged order: the local apiserver's preferred version when it has one, otherwise the
/// newest by [`compare_version_priority`] (a group only peers serve).
fn preferred_first<T>(versions: &mut [T], key: fn(&T) -> &str, local_preferred: Option<&str>) {
    let position = match local_preferred {
        Some(preferred) => versions.iter().position(|v| key(v) == preferred),
        None => versions
            .iter()
            .enumerate()
            .min_by(|(_, a), (_, b)| compare_version_priority(key(a), key(b)))
            .map(|(i, _)| i),
    };
    if let Some(i) = position {
        versions[..=i].rotate_right(1);
    }
}

/// Union of the items of `lists` (already in server order) by `key`, in merged order, each
/// key's copies (server order, then position) combined by `merge`.
fn merge_keyed<'a, T>(
    lists: &[&'a [T]],
    key: fn(&T) -> &str,
    tie: TieBreak,
    merge: impl Fn(&[&'a T]) -> T,
) -> Vec<T> {
    let mut copies: HashMap<&'a str, Vec<&'a T>> = HashMap::new();
    let mut orders: Vec<Vec<&'a str>> = Vec::with_capacity(lists.len());
    for list in lists {
        let mut order = Vec::with_capacity(list.len());
        for item in list.iter() {
            let k = key(item);
            copies.entry(k).or_default().push(item);
            order.push(k);
        }
        orders.push(order);
    }
    merge_order_refs(&orders, tie)
        .into_iter()
        .filter_map(|k| copies.get(k).map(|c| merge(c)))
        .collect()
}

/// Verbs of several copies of one resource: the list itself when every copy has the same list,
/// otherwise the sorted, distinct union.
fn union_verbs<'a>(lists: impl Iterator<Item = &'a [String]> + Clone) -> Vec<String> {
    let Some(first) = lists.clone().next() else {
        return Vec::new();
    };
    if lists.clone().all(|l| l == first) {
        return first.to_vec();
    }
    let union: BTreeSet<&String> = lists.flatten().collect();
    union.into_iter().cloned().collect()
}

fn lexicographic(a: &str, b: &str) -> Ordering {
    a.cmp(b)
}

/// Kubernetes version priority, as kube-apiserver orders CRD versions
/// (`CompareKubeAwareVersionStrings`): `Less` means `a` has the higher priority. Versions
/// matching `v<N>` (GA) come first, then `v<N>beta<M>`, then `v<N>alpha<M>`, each by descending
/// `N` then `M`; versions of any other form come last, lexicographically.
///
/// `v2, v1, v11beta2, v10beta3, v3beta1, v12alpha1, v11alpha2, foo1, foo10`.
pub fn compare_version_priority(a: &str, b: &str) -> Ordering {
    match (kube_version(a), kube_version(b)) {
        // Higher level, major, minor first; equal keys (`v1` vs `v01`) by name.
        (Some(ka), Some(kb)) => kb.cmp(&ka).then_with(|| a.cmp(b)),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => a.cmp(b),
    }
}

/// `(level, major, minor)` of a Kubernetes-style version: level 2 GA, 1 beta, 0 alpha; `None`
/// for any other string.
fn kube_version(v: &str) -> Option<(u8, u64, u64)> {
    let rest = v.strip_prefix('v')?;
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    let major: u64 = rest[..digits].parse().ok()?;
    let rest = &rest[digits..];
    if rest.is_empty() {
        return Some((2, major, 0));
    }
    let (level, minor) = if let Some(m) = rest.strip_prefix("beta") {
        (1, m)
    } else if let Some(m) = rest.strip_prefix("alpha") {
        (0, m)
    } else {
        return None;
    };
    if minor.is_empty() || !minor.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((level, major, minor.parse().ok()?))
}

// ---------------------------------------------------------------------------------------------
// Order
// ---------------------------------------------------------------------------------------------

/// Merge several orderings of names (one per server, in server order) into one, with
/// lexicographic tie-break. See [`merge_order_by`].
pub fn merge_order(lists: &[Vec<String>]) -> Vec<String> {
    merge_order_by(lists, lexicographic)
}

/// Merge several orderings of names (one per server, in server order) into one:
///
/// 1. Each list is read without its repeated names (the first occurrence counts).
/// 2. If some list holds every name, the first such list is the answer (upstream's shortcut: a
///    server that serves everything decides the order, even against an earlier partial list).
/// 3. Otherwise every list is a chain of "a before b" constraints between neighbours, and the
///    result is a topological order of all of them (Kahn's algorithm); among the names free to
///    come next, `tie` picks (the smallest first; equal by `tie`, by name).
/// 4. Cycles: constraints are accepted list by list in server order, and within a list from
///    front to back; a constraint that would close a cycle with those already accepted is
///    dropped. The earliest list's order therefore always holds entirely, later lists' as far
///    as they do not contradict earlier ones. (Upstream sorts the whole level by name instead.)
///
/// The result holds each name once; it is a pure function of `lists` and `tie`.
pub fn merge_order_by(lists: &[Vec<String>], tie: TieBreak) -> Vec<String> {
    let refs: Vec<Vec<&str>> = lists
        .iter()
        .map(|l| l.iter().map(String::as_str).collect())
        .collect();
    merge_order_refs(&refs, tie)
        .into_iter()
        .map(str::to_owned)
        .collect()
}

fn merge_order_refs<'a>(lists: &[Vec<&'a str>], tie: TieBreak) -> Vec<&'a str> {
    // Intern names in first-seen order; drop repeats inside each list.
    let mut ids: HashMap<&'a str, usize> = HashMap::new();
    let mut names: Vec<&'a str> = Vec::new();
    let mut chains: Vec<Vec<usize>> = Vec::with_capacity(lists.len());
    for list in lists {
        let mut seen = vec![false; names.len()];
        let mut chain = Vec::with_capacity(list.len());
        for &name in list {
            let id = *ids.entry(name).or_insert_with(|| {
                names.push(name);
                names.len() - 1
            });
            if id >= seen.len() {
                seen.resize(id + 1, false);
            }
            if !seen[id] {
                seen[id] = true;
                chain.push(id);
            }
        }
        chains.push(chain);
    }

    // A list holding every name decides.
    if let Some(full) = chains.iter().find(|c| c.len() == names.len()) {
        return full.iter().map(|&id| names[id]).collect();
    }

    // Tie-break rank of each name.
    let mut by_rank: Vec<usize> = (0..names.len()).collect();
    by_rank.sort_by(|&a, &b| tie(names[a], names[b]).then_with(|| names[a].cmp(names[b])));
    let mut rank = vec![0; names.len()];
    for (r, &id) in by_rank.iter().enumerate() {
        rank[id] = r;
    }

    // Fast path: all constraints; when they contain a cycle, rebuild dropping the late ones.
    let mut successors = vec![BTreeSet::new(); names.len()];
    for chain in &chains {
        for pair in chain.windows(2) {
            successors[pair[0]].insert(pair[1]);
        }
    }
    let order = match kahn(&successors, &rank, &by_rank) {
        Some(order) => order,
        None => {
            let mut successors = vec![BTreeSet::new(); names.len()];
            for chain in &chains {
                for pair in chain.windows(2) {
                    let (from, to) = (pair[0], pair[1]);
                    if !reaches(&successors, to, from) {
                        successors[from].insert(to);
                    }
                }
            }
            kahn(&successors, &rank, &by_rank).unwrap_or(by_rank)
        }
    };
    order.into_iter().map(|id| names[id]).collect()
}

/// Kahn's topological sort, taking the lowest-ranked free node first; `None` on a cycle.
fn kahn(successors: &[BTreeSet<usize>], rank: &[usize], by_rank: &[usize]) -> Option<Vec<usize>> {
    let mut in_degree = vec![0usize; successors.len()];
    for next in successors.iter().flatten() {
        in_degree[*next] += 1;
    }
    let mut free: BinaryHeap<Reverse<usize>> = (0..successors.len())
        .filter(|&id| in_degree[id] == 0)
        .map(|id| Reverse(rank[id]))
        .collect();
    let mut order = Vec::with_capacity(successors.len());
    while let Some(Reverse(r)) = free.pop() {
        let id = by_rank[r];
        order.push(id);
        for &next in &successors[id] {
            in_degree[next] -= 1;
            if in_degree[next] == 0 {
                free.push(Reverse(rank[next]));
            }
        }
    }
    (order.len() == successors.len()).then_some(order)
}

/// Whether `to` can be reached from `from` (or is `from`).
fn reaches(successors: &[BTreeSet<usize>], from: usize, to: usize) -> bool {
    let mut visited = vec![false; successors.len()];
    let mut stack = vec![from];
    while let Some(id) = stack.pop() {
        if id == to {
            return true;
        }
        if !std::mem::replace(&mut visited[id], true) {
            stack.extend(successors[id].iter().copied());
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::{
        parse_aggregated, parse_resource_list, GroupVersionForDiscovery, ServedApis,
        APIS_AGGREGATED_FILE, API_V1_LEGACY_FILE, DEFAULT_MAX_DISCOVERY_BYTES,
    };
    use serde_json::{json, Value};
    use std::collections::BTreeMap;
    use std::path::Path;

    use crate::test_fixtures::{K130, K133};

    fn read(dir: &str, file: &str) -> Vec<u8> {
        std::fs::read(Path::new(dir).join(file)).expect("fixture is readable")
    }

    fn fixture(dir: &str) -> APIGroupDiscoveryList {
        parse_aggregated(
            &read(dir, APIS_AGGREGATED_FILE),
            DEFAULT_MAX_DISCOVERY_BYTES,
        )
        .expect("fixture parses")
    }

    fn legacy_core(dir: &str) -> APIResourceList {
        parse_resource_list(&read(dir, API_V1_LEGACY_FILE), DEFAULT_MAX_DISCOVERY_BYTES)
            .expect("fixture parses")
    }

    /// A local id no test server has: every group is peer-only.
    const NOBODY: &str = "(no local server)";

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    /// An aggregated list with these items.
    fn doc(items: Value) -> APIGroupDiscoveryList {
        serde_json::from_value(json!({
            "kind": "APIGroupDiscoveryList",
            "apiVersion": "apidiscovery.k8s.io/v2",
            "metadata": {},
            "items": items,
        }))
        .expect("test document")
    }

    fn servers<T: Clone>(docs: &[(&str, &T)]) -> Vec<(String, T)> {
        docs.iter()
            .map(|(id, d)| ((*id).to_owned(), (*d).clone()))
            .collect()
    }

    fn bytes(list: &impl Serialize) -> Vec<u8> {
        serde_json::to_vec(list).expect("serialises")
    }

    fn group<'a>(list: &'a APIGroupDiscoveryList, name: &str) -> &'a APIGroupDiscovery {
        list.items
            .iter()
            .find(|g| g.metadata.name == name)
            .unwrap_or_else(|| panic!("group {name:?}"))
    }

    fn group_mut<'a>(list: &'a mut APIGroupDiscoveryList, name: &str) -> &'a mut APIGroupDiscovery {
        list.items
            .iter_mut()
            .find(|g| g.metadata.name == name)
            .unwrap_or_else(|| panic!("group {name:?}"))
    }

    fn versions<'a>(list: &'a APIGroupDiscoveryList, g: &str) -> Vec<&'a str> {
        group(list, g)
            .versions
            .iter()
            .map(|v| v.version.as_str())
            .collect()
    }

    fn version<'a>(list: &'a APIGroupDiscoveryList, g: &str, v: &str) -> &'a APIVersionDiscovery {
        group(list, g)
            .versions
            .iter()
            .find(|x| x.version == v)
            .unwrap_or_else(|| panic!("{g}/{v}"))
    }

    fn resource<'a>(
        list: &'a APIGroupDiscoveryList,
        g: &str,
        v: &str,
        r: &str,
    ) -> &'a APIResourceDiscovery {
        version(list, g, v)
            .resources
            .iter()
            .find(|x| x.resource == r)
            .unwrap_or_else(|| panic!("{g}/{v}/{r}"))
    }

    fn resource_mut<'a>(
        list: &'a mut APIGroupDiscoveryList,
        g: &str,
        v: &str,
        r: &str,
    ) -> &'a mut APIResourceDiscovery {
        group_mut(list, g)
            .versions
            .iter_mut()
            .find(|x| x.version == v)
            .and_then(|x| x.resources.iter_mut().find(|x| x.resource == r))
            .unwrap_or_else(|| panic!("{g}/{v}/{r}"))
    }

    type Gvr = (String, String, String);

    /// (group, version, resource) and (group, version, resource/subresource) keys, built
    /// directly from the document.
    fn keys(list: &APIGroupDiscoveryList) -> (BTreeSet<Gvr>, BTreeSet<Gvr>) {
        let mut resources = BTreeSet::new();
        let mut subresources = BTreeSet::new();
        for g in &list.items {
            for v in &g.versions {
                for r in &v.resources {
                    let key = (
                        g.metadata.name.clone(),
                        v.version.clone(),
                        r.resource.clone(),
                    );
                    assert!(
                        resources.insert(key),
                        "duplicate {}/{}/{}",
                        g.metadata.name,
                        v.version,
                        r.resource
                    );
                    for s in &r.subresources {
                        let key = (
                            g.metadata.name.clone(),
                            v.version.clone(),
                            format!("{}/{}", r.resource, s.subresource),
                        );
                        assert!(subresources.insert(key), "duplicate subresource");
                    }
                }
            }
        }
        (resources, subresources)
    }

    /// Every permutation of `items`; fine for the handful used here.
    fn permutations<T: Clone>(items: &[T]) -> Vec<Vec<T>> {
        if items.len() <= 1 {
            return vec![items.to_vec()];
        }
        let mut out = Vec::new();
        for i in 0..items.len() {
            let mut rest = items.to_vec();
            let head = rest.remove(i);
            for mut tail in permutations(&rest) {
                tail.insert(0, head.clone());
                out.push(tail);
            }
        }
        out
    }

    // -----------------------------------------------------------------------------------------
    // merge_order
    // -----------------------------------------------------------------------------------------

    /// (what, lists in server order, expected merged order)
    type OrderCase<'a> = (&'a str, &'a [&'a [&'a str]], &'a [&'a str]);

    #[test]
    fn merge_order_table() {
        let cases: &[OrderCase] = &[
            ("no lists", &[], &[]),
            ("one empty list", &[&[]], &[]),
            ("all empty", &[&[], &[]], &[]),
            ("empty then one", &[&[], &["b", "a"]], &["b", "a"]),
            (
                "single list kept as is",
                &[&["c", "a", "b"]],
                &["c", "a", "b"],
            ),
            (
                "first holds all",
                &[&["b", "a", "c"], &["a", "c"]],
                &["b", "a", "c"],
            ),
            (
                "later holds all",
                &[&["a", "c"], &["c", "b", "a"]],
                &["c", "b", "a"],
            ),
            (
                "both hold all: the first wins",
                &[&["b", "a"], &["a", "b"]],
                &["b", "a"],
            ),
            ("same list twice", &[&["z", "a"], &["z", "a"]], &["z", "a"]),
            (
                "disjoint",
                &[&["b", "a"], &["d", "c"]],
                &["b", "a", "d", "c"],
            ),
            (
                "disjoint, interleaved by name",
                &[&["a", "c"], &["b", "d"]],
                &["a", "b", "c", "d"],
            ),
            (
                "shared middle",
                &[&["a", "c", "e"], &["b", "c", "d"]],
                &["a", "b", "c", "d", "e"],
            ),
            (
                "inserted in the middle",
                &[&["a", "b", "d"], &["b", "c", "d"]],
                &["a", "b", "c", "d"],
            ),
            (
                "new item in front",
                &[&["x", "y"], &["w", "x"]],
                &["w", "x", "y"],
            ),
            (
                "new items at both ends",
                &[&["m", "n"], &["z", "m"], &["n", "a"]],
                &["z", "m", "n", "a"],
            ),
            (
                "chain across lists",
                &[&["c", "x"], &["b", "c"], &["a", "b"]],
                &["a", "b", "c", "x"],
            ),
            // Cycles: the later server's contradicting constraint is dropped.
            (
                "two-list cycle",
                &[&["b", "a", "x"], &["a", "b", "y"]],
                &["b", "a", "x", "y"],
            ),
            (
                "cycle, first order kept",
                &[&["c", "b", "a"], &["a", "c", "d"]],
                &["c", "b", "a", "d"],
            ),
            (
                "three-list cycle",
                &[&["z", "y"], &["y", "x"], &["x", "z"]],
                &["z", "y", "x"],
            ),
            (
                "cycle drops one edge, keeps the rest",
                &[&["b", "a"], &["a", "b", "c"], &["c", "d"]],
                // a->b dropped; b->c kept (not a->b->c), c->d.
                &["b", "a", "c", "d"],
            ),
            (
                "cycle through an earlier chain",
                &[&["p", "q", "r"], &["r", "s"], &["s", "p", "t"]],
                &["p", "q", "r", "s", "t"],
            ),
            // Repeated names: the first occurrence counts.
            (
                "repeat in one list",
                &[&["a", "b", "a", "c"]],
                &["a", "b", "c"],
            ),
            (
                "repeat, then partial",
                &[&["b", "a", "b"], &["c"]],
                &["b", "a", "c"],
            ),
            (
                "repeat makes a full list",
                &[&["a", "b", "a"], &["b", "a", "c"]],
                &["b", "a", "c"],
            ),
            (
                "repeat across lists",
                &[&["a", "b"], &["a", "a", "b"]],
                &["a", "b"],
            ),
        ];
        for (what, lists, want) in cases {
            let lists: Vec<Vec<String>> = lists.iter().map(|l| strings(l)).collect();
            assert_eq!(merge_order(&lists), strings(want), "{what}");
        }
    }

    #[test]
    fn merge_order_versions_by_priority() {
        let cases: &[OrderCase] = &[
            (
                "resource.k8s.io 1.30 + 1.33",
                &[&["v1alpha2"], &["v1beta2", "v1beta1", "v1alpha3"]],
                &["v1beta2", "v1beta1", "v1alpha3", "v1alpha2"],
            ),
            (
                "same, other server first",
                &[&["v1beta2", "v1beta1", "v1alpha3"], &["v1alpha2"]],
                &["v1beta2", "v1beta1", "v1alpha3", "v1alpha2"],
            ),
            (
                "networking 1.30 + 1.33",
                &[&["v1", "v1alpha1"], &["v1", "v1beta1"]],
                &["v1", "v1beta1", "v1alpha1"],
            ),
            (
                "GA beats beta",
                &[&["v1beta1"], &["v1"]],
                &["v1", "v1beta1"],
            ),
            (
                "explicit order beats priority",
                &[&["v1beta1", "v1"]],
                &["v1beta1", "v1"],
            ),
            (
                "constraint, then priority",
                &[&["v1alpha1", "v2"], &["v1"]],
                &["v1", "v1alpha1", "v2"],
            ),
            (
                "non-kube versions last",
                &[&["foo"], &["v1alpha1"]],
                &["v1alpha1", "foo"],
            ),
        ];
        for (what, lists, want) in cases {
            let lists: Vec<Vec<String>> = lists.iter().map(|l| strings(l)).collect();
            assert_eq!(
                merge_order_by(&lists, compare_version_priority),
                strings(want),
                "{what}"
            );
        }
    }

    #[test]
    fn version_priority() {
        let want = [
            "v10",
            "v2",
            "v1",
            "v11beta2",
            "v10beta3",
            "v3beta1",
            "v12alpha1",
            "v11alpha2",
            "foo1",
            "foo10",
            "v",
            "v1beta",
            "v1gamma1",
            "vbeta1",
        ];
        let mut got = want.to_vec();
        got.reverse();
        got.sort_by(|a, b| compare_version_priority(a, b));
        assert_eq!(got, want);
        let cases = [
            ("v1", Some((2, 1, 0))),
            ("v1beta2", Some((1, 1, 2))),
            ("v3alpha10", Some((0, 3, 10))),
            ("v", None),
            ("1", None),
            ("v1beta", None),
            ("v1beta1x", None),
            ("v1-beta1", None),
            ("V1", None),
            ("v99999999999999999999999", None),
        ];
        for (v, want) in cases {
            assert_eq!(kube_version(v), want, "{v}");
        }
        assert_eq!(compare_version_priority("v1", "v01"), Ordering::Greater);
    }

    /// A small deterministic generator, so the property test needs no crate.
    struct Lcg(u64);

    impl Lcg {
        fn next(&mut self, bound: usize) -> usize {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((self.0 >> 33) as usize) % bound.max(1)
        }
    }

    fn is_subsequence(sub: &[String], of: &[String]) -> bool {
        let mut it = of.iter();
        sub.iter().all(|s| it.any(|o| o == s))
    }

    fn dedup(list: &[String]) -> Vec<String> {
        let mut seen = BTreeSet::new();
        list.iter().filter(|s| seen.insert(*s)).cloned().collect()
    }

    #[test]
    fn merge_order_properties() {
        let mut rng = Lcg(42);
        let pool: Vec<String> = (0..9).map(|i| format!("n{i}")).collect();
        for round in 0..2000 {
            let consistent = round % 2 == 0;
            let mut universe = pool.clone();
            for i in (1..universe.len()).rev() {
                universe.swap(i, rng.next(i + 1));
            }
            let lists: Vec<Vec<String>> = (0..1 + rng.next(4))
                .map(|_| {
                    if consistent {
                        // A subsequence of one global order.
                        universe
                            .iter()
                            .filter(|_| rng.next(3) > 0)
                            .cloned()
                            .collect()
                    } else {
                        // Anything, repeats included.
                        (0..rng.next(7))
                            .map(|_| pool[rng.next(pool.len())].clone())
                            .collect()
                    }
                })
                .collect();
            let merged = merge_order(&lists);
            let union: BTreeSet<&String> = lists.iter().flatten().collect();
            let got: BTreeSet<&String> = merged.iter().collect();
            assert_eq!(got, union, "{lists:?}");
            assert_eq!(merged.len(), union.len(), "each name once: {lists:?}");
            assert_eq!(merge_order(&lists), merged, "pure");
            let first = lists.first().map(|l| dedup(l)).unwrap_or_default();
            let full = lists
                .iter()
                .map(|l| dedup(l))
                .find(|l| l.len() == union.len());
            match full {
                Some(full) => assert_eq!(merged, full, "{lists:?}"),
                // Without the shortcut the earliest list's order always holds.
                None => assert!(is_subsequence(&first, &merged), "{lists:?} -> {merged:?}"),
            }
            if consistent {
                for list in &lists {
                    assert!(is_subsequence(list, &merged), "{lists:?} -> {merged:?}");
                }
            }
        }
    }

    // -----------------------------------------------------------------------------------------
    // Aggregated, on the real 1.30 and 1.33 documents
    // -----------------------------------------------------------------------------------------

    #[test]
    fn fixtures_merge_to_the_union() {
        let (k130, k133) = (fixture(K130), fixture(K133));
        let (r130, s130) = keys(&k130);
        let (r133, s133) = keys(&k133);
        for (a, b) in [("a", "b"), ("b", "a")] {
            let merged = merge_aggregated(a, &servers(&[(a, &k130), (b, &k133)]));
            let (resources, subresources) = keys(&merged);
            assert_eq!(resources, r130.union(&r133).cloned().collect());
            assert_eq!(subresources, s130.union(&s133).cloned().collect());
            // The same union by the routing model.
            let mut model = ServedApis::from_aggregated(&k130).expect("valid");
            model.merge(ServedApis::from_aggregated(&k133).expect("valid"));
            assert_eq!(ServedApis::from_aggregated(&merged).expect("valid"), model);
            // No group or version listed twice.
            let groups: BTreeSet<_> = merged.items.iter().map(|g| &g.metadata.name).collect();
            assert_eq!(groups.len(), merged.items.len());
            for g in &merged.items {
                let vs: BTreeSet<_> = g.versions.iter().map(|v| &v.version).collect();
                assert_eq!(vs.len(), g.versions.len(), "{}", g.metadata.name);
            }
        }
        // Counts from PROVENANCE.md: 63 + 71 triples, 15 only in 1.30, 23 only in 1.33.
        assert_eq!(r130.union(&r133).count(), 63 + 23);
    }

    /// With no local server every group is peer-only: the newest version first, the rest by
    /// the merge (here the same as by priority).
    #[test]
    fn fixtures_version_priority() {
        let (k130, k133) = (fixture(K130), fixture(K133));
        let cases: &[(&str, &[&str])] = &[
            (
                "resource.k8s.io",
                &["v1beta2", "v1beta1", "v1alpha3", "v1alpha2"],
            ),
            ("networking.k8s.io", &["v1", "v1beta1", "v1alpha1"]),
            ("authentication.k8s.io", &["v1", "v1beta1", "v1alpha1"]),
            ("coordination.k8s.io", &["v1", "v1beta1", "v1alpha2"]),
            ("certificates.k8s.io", &["v1", "v1beta1", "v1alpha1"]),
            ("storage.k8s.io", &["v1", "v1beta1", "v1alpha1"]),
            ("flowcontrol.apiserver.k8s.io", &["v1", "v1beta3"]),
            ("autoscaling", &["v2", "v1"]),
            (
                "admissionregistration.k8s.io",
                &["v1", "v1beta1", "v1alpha1"],
            ),
        ];
        for ids in [("a", "b"), ("b", "a")] {
            let merged = merge_aggregated(NOBODY, &servers(&[(ids.0, &k130), (ids.1, &k133)]));
            for (g, want) in cases {
                assert_eq!(versions(&merged, g), *want, "{g} with 1.30 as {:?}", ids.0);
            }
            let v1alpha1: Vec<_> = version(&merged, "admissionregistration.k8s.io", "v1alpha1")
                .resources
                .iter()
                .map(|r| r.resource.as_str())
                .collect();
            assert_eq!(
                v1alpha1,
                [
                    "mutatingadmissionpolicies",
                    "mutatingadmissionpolicybindings",
                    "validatingadmissionpolicies",
                    "validatingadmissionpolicybindings",
                ]
            );
        }
    }

    /// The first version of each group that has one.
    fn first_versions(list: &APIGroupDiscoveryList) -> BTreeMap<&str, &str> {
        list.items
            .iter()
            .filter_map(|g| {
                Some((
                    g.metadata.name.as_str(),
                    g.versions.first()?.version.as_str(),
                ))
            })
            .collect()
    }

    #[test]
    fn fixtures_local_preferred_version_first() {
        let (k130, k133) = (fixture(K130), fixture(K133));
        for (name, local_doc, peer_doc) in [("1.30", &k130, &k133), ("1.33", &k133, &k130)] {
            // The local server earlier and later in server order, given in either input order.
            for (local, peer) in [("a", "b"), ("b", "a")] {
                for reversed in [false, true] {
                    let mut input = servers(&[(local, local_doc), (peer, peer_doc)]);
                    if reversed {
                        input.reverse();
                    }
                    let merged = merge_aggregated(local, &input);
                    let what = format!("local {name} as {local:?}, reversed {reversed}");
                    let local_first = first_versions(local_doc);
                    assert_eq!(local_first.len(), local_doc.items.len(), "{what}");
                    for (g, preferred) in &local_first {
                        let got = versions(&merged, g);
                        assert_eq!(got[0], *preferred, "{g}: {what}");
                        // The rest: the merge of both servers' orders, the preferred one left out.
                        let orders: Vec<Vec<String>> = by_server_id(&input)
                            .iter()
                            .filter_map(|(_, l)| l.items.iter().find(|x| x.metadata.name == *g))
                            .map(|x| x.versions.iter().map(|v| v.version.clone()).collect())
                            .collect();
                        let mut rest = merge_order_by(&orders, compare_version_priority);
                        rest.retain(|v| v != preferred);
                        assert_eq!(got[1..], rest, "{g}: {what}");
                    }
                }
            }
        }
        // resource.k8s.io: 1.30 serves v1alpha2 only, 1.33 v1beta2, v1beta1, v1alpha3.
        let cases: &[(
            &str,
            &APIGroupDiscoveryList,
            &APIGroupDiscoveryList,
            &[&str],
        )] = &[
            (
                "1.30",
                &k130,
                &k133,
                &["v1alpha2", "v1beta2", "v1beta1", "v1alpha3"],
            ),
            (
                "1.33",
                &k133,
                &k130,
                &["v1beta2", "v1beta1", "v1alpha3", "v1alpha2"],
            ),
        ];
        for (name, local_doc, peer_doc, want) in cases {
            for (local, peer) in [("a", "b"), ("b", "a")] {
                let merged =
                    merge_aggregated(local, &servers(&[(local, *local_doc), (peer, *peer_doc)]));
                let what = format!("local {name} as {local:?}");
                assert_eq!(versions(&merged, "resource.k8s.io"), *want, "{what}");
            }
        }
    }

    #[test]
    fn fixtures_peer_only_group_prefers_the_newest_version() {
        let (k130, k133) = (fixture(K130), fixture(K133));
        // A local 1.30 that does not serve resource.k8s.io (nor certificates.k8s.io), a 1.30
        // peer that serves v1alpha2 and a 1.33 peer that serves v1beta2, v1beta1, v1alpha3.
        let mut local = k130.clone();
        local.items.retain(|g| {
            !["resource.k8s.io", "certificates.k8s.io"].contains(&g.metadata.name.as_str())
        });
        let inputs = [("local", local), ("peer-130", k130), ("peer-133", k133)];
        for permutation in permutations(&inputs) {
            let merged = merge_aggregated(
                "local",
                &permutation
                    .iter()
                    .map(|(id, d)| ((*id).to_owned(), d.clone()))
                    .collect::<Vec<_>>(),
            );
            assert_eq!(
                versions(&merged, "resource.k8s.io"),
                ["v1beta2", "v1beta1", "v1alpha3", "v1alpha2"]
            );
            assert_eq!(
                versions(&merged, "certificates.k8s.io"),
                ["v1", "v1beta1", "v1alpha1"]
            );
        }
    }

    /// (what, local id, each server's id and versions of x.io (none: it does not serve x.io),
    /// merged versions of x.io)
    type PreferredCase<'a> = (
        &'a str,
        &'a str,
        &'a [(&'a str, &'a [&'a str])],
        &'a [&'a str],
    );

    #[test]
    fn local_preferred_version_first_table() {
        let cases: &[PreferredCase] = &[
            (
                "a peer advertises v2 of a group whose local preferred is v1",
                "a",
                &[("a", &["v1"]), ("b", &["v2", "v1"])],
                &["v1", "v2"],
            ),
            (
                "the same with the local server later in id order",
                "b",
                &[("a", &["v2", "v1"]), ("b", &["v1"])],
                &["v1", "v2"],
            ),
            (
                "local v1 and v1beta1, the peer v2 and v1",
                "a",
                &[("a", &["v1", "v1beta1"]), ("b", &["v2", "v1"])],
                &["v1", "v2", "v1beta1"],
            ),
            (
                "the local server prefers a beta the peer has as GA",
                "b",
                &[("a", &["v1"]), ("b", &["v1beta1"])],
                &["v1beta1", "v1"],
            ),
            (
                "the local preferred is already first",
                "a",
                &[("a", &["v2", "v1"]), ("b", &["v1"])],
                &["v2", "v1"],
            ),
            (
                "three servers, the local one in the middle",
                "b",
                &[
                    ("a", &["v2", "v1"]),
                    ("b", &["v1beta1"]),
                    ("c", &["v1", "v1beta1"]),
                ],
                &["v1beta1", "v2", "v1"],
            ),
            (
                "peer-only: the newest first",
                "a",
                &[("a", &[]), ("b", &["v1alpha1"]), ("c", &["v1beta1"])],
                &["v1beta1", "v1alpha1"],
            ),
            (
                "peer-only: the newest first, even against a peer that lists every version",
                "a",
                &[("a", &[]), ("b", &["v1beta1", "v1"]), ("c", &["v1"])],
                &["v1", "v1beta1"],
            ),
            (
                "peer-only: non-Kubernetes version strings last",
                "c",
                &[("a", &["foo", "v1alpha1"]), ("c", &[])],
                &["v1alpha1", "foo"],
            ),
            (
                "no server is local: every group is peer-only",
                NOBODY,
                &[("a", &["v1beta1"]), ("b", &["v1"])],
                &["v1", "v1beta1"],
            ),
        ];
        let document = |versions: &[&str]| {
            let mut groups = vec![json!({"metadata": {"name": "other.io"},
                "versions": [{"version": "v1"}]})];
            if !versions.is_empty() {
                groups.push(json!({"metadata": {"name": "x.io"},
                    "versions": versions.iter().map(|v| json!({"version": v})).collect::<Vec<_>>()}));
            }
            doc(Value::Array(groups))
        };
        for (what, local, input, want) in cases {
            let docs: Vec<(String, APIGroupDiscoveryList)> = input
                .iter()
                .map(|(id, versions)| ((*id).to_owned(), document(versions)))
                .collect();
            let mut outputs = BTreeSet::new();
            for permutation in permutations(&docs) {
                let merged = merge_aggregated(local, &permutation);
                assert_eq!(versions(&merged, "x.io"), *want, "{what}");
                // Legacy /apis agrees: the same order, the first one preferred.
                let legacy: Vec<(String, APIGroupList)> = permutation
                    .iter()
                    .map(|(id, d)| (id.clone(), legacy_groups(d)))
                    .collect();
                assert_eq!(
                    merge_group_lists(local, &legacy),
                    legacy_groups(&merged),
                    "{what}"
                );
                outputs.insert(bytes(&merged));
            }
            assert_eq!(outputs.len(), 1, "{what}: one output for every input order");
        }

        // A local group with no version is peer-only; a group the local server lists twice
        // (never emitted by kube-apiserver) prefers the first version it lists.
        let empty = doc(json!([{"metadata": {"name": "x.io"}, "versions": []}]));
        let twice = doc(json!([
            {"metadata": {"name": "x.io"}, "versions": []},
            {"metadata": {"name": "x.io"}, "versions": [{"version": "v1beta1"}]},
        ]));
        let peer = document(&["v1"]);
        let merged = merge_aggregated("a", &servers(&[("a", &empty), ("b", &peer)]));
        assert_eq!(versions(&merged, "x.io"), ["v1"]);
        let peer = doc(json!([{"metadata": {"name": "x.io"},
            "versions": [{"version": "v1"}, {"version": "v1beta1"}]}]));
        let merged = merge_aggregated("a", &servers(&[("a", &twice), ("b", &peer)]));
        assert_eq!(versions(&merged, "x.io"), ["v1beta1", "v1"]);
        let merged = merge_aggregated("a", &servers(&[("a", &empty), ("b", &peer)]));
        assert_eq!(versions(&merged, "x.io"), ["v1", "v1beta1"]);
    }

    #[test]
    fn fixtures_merge_independent_of_input_order() {
        let (k130, k133) = (fixture(K130), fixture(K133));
        // A third apiserver: a CRD group in front, one group fewer, a verb more.
        let mut other = k133.clone();
        other.items.retain(|g| g.metadata.name != "batch");
        other.items.insert(
            0,
            doc(
                json!([{"metadata": {"name": "example.com"}, "versions": [{"version": "v1",
                "resources": [{"resource": "widgets", "scope": "Namespaced",
                  "singularResource": "widget", "verbs": ["get"]}]}]}]),
            )
            .items
            .remove(0),
        );
        resource_mut(&mut other, "apps", "v1", "deployments")
            .verbs
            .push("escalate".to_owned());
        let inputs = [("s1", k130), ("s2", k133), ("s3", other)];
        let mut outputs = BTreeSet::new();
        for permutation in permutations(&inputs) {
            let list: Vec<(String, APIGroupDiscoveryList)> = permutation
                .iter()
                .map(|(id, d)| ((*id).to_owned(), d.clone()))
                .collect();
            outputs.insert(bytes(&merge_aggregated("s1", &list)));
        }
        assert_eq!(outputs.len(), 1, "6 permutations, one output");
        let merged: APIGroupDiscoveryList =
            serde_json::from_slice(outputs.first().expect("one")).expect("parses");
        assert!(group(&merged, "batch").versions.len() == 1);
        assert_eq!(
            resource(&merged, "apps", "v1", "deployments").verbs,
            strings(&[
                "create",
                "delete",
                "deletecollection",
                "escalate",
                "get",
                "list",
                "patch",
                "update",
                "watch"
            ])
        );
        // example.com is new in front of s3's order, batch missing there: no list holds every
        // group, and s1's order holds throughout.
        let names: Vec<_> = merged
            .items
            .iter()
            .map(|g| g.metadata.name.as_str())
            .collect();
        let s1: Vec<_> = inputs[0]
            .1
            .items
            .iter()
            .map(|g| g.metadata.name.clone())
            .collect();
        assert!(is_subsequence(
            &s1,
            &names.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()
        ));
        assert!(names.contains(&"example.com"));
    }

    #[test]
    fn fixtures_merge_with_itself_is_unchanged() {
        for dir in [K130, K133] {
            let list = fixture(dir);
            for n in 1..=3 {
                let copies: Vec<(String, APIGroupDiscoveryList)> =
                    (0..n).map(|i| (format!("s{i}"), list.clone())).collect();
                // Local first or last, or none (kube lists the newest version first anyway).
                for local in ["s0".to_owned(), format!("s{}", n - 1), NOBODY.to_owned()] {
                    let merged = merge_aggregated(&local, &copies);
                    assert_eq!(merged, list, "{dir} x{n} local {local}");
                    assert_eq!(
                        serde_json::to_value(&merged).expect("json"),
                        serde_json::from_slice::<Value>(&read(dir, APIS_AGGREGATED_FILE))
                            .expect("json"),
                        "{dir} x{n} local {local}: same JSON as the file"
                    );
                }
            }
            let core = legacy_core(dir);
            assert_eq!(
                merge_resource_lists(&servers(&[("a", &core), ("b", &core)])),
                core,
                "{dir}"
            );
        }
    }

    #[test]
    fn earlier_server_id_wins_scalar_fields() {
        let mut k130 = fixture(K130);
        let mut k133 = fixture(K133);
        {
            let d = resource_mut(&mut k133, "apps", "v1", "deployments");
            d.singular_resource = "deployment-133".to_owned();
            d.short_names = strings(&["d133"]);
            d.categories = strings(&["c133"]);
            d.extra.insert("future".to_owned(), json!(133));
        }
        resource_mut(&mut k130, "apps", "v1", "deployments")
            .verbs
            .retain(|v| v != "watch");
        let k133_order: Vec<_> = k133.items.iter().map(|g| g.metadata.name.clone()).collect();
        let k130_order: Vec<_> = k130.items.iter().map(|g| g.metadata.name.clone()).collect();
        assert_ne!(
            k130_order, k133_order,
            "the fixtures order their groups differently"
        );

        // (ids of 1.30 and 1.33, 1.30 earlier?)
        for (id130, id133, first130) in [("a", "b", true), ("b", "a", false)] {
            for reversed in [false, true] {
                let mut input = servers(&[(id130, &k130), (id133, &k133)]);
                if reversed {
                    input.reverse();
                }
                let merged = merge_aggregated(id130, &input);
                let what = format!("1.30 earlier: {first130}, input reversed: {reversed}");
                let d = resource(&merged, "apps", "v1", "deployments");
                let (singular, short, categories, future) = if first130 {
                    ("deployment", vec!["deploy"], vec!["all"], None)
                } else {
                    (
                        "deployment-133",
                        vec!["d133"],
                        vec!["c133"],
                        Some(&json!(133)),
                    )
                };
                assert_eq!(d.singular_resource, singular, "{what}");
                assert_eq!(d.short_names, strings(&short), "{what}");
                assert_eq!(d.categories, strings(&categories), "{what}");
                assert_eq!(d.extra.get("future"), future, "{what}");
                // Verbs are a union either way.
                assert!(d.verbs.contains(&"watch".to_owned()), "{what}");
                // Group metadata: 1.30 carries `creationTimestamp: null`, 1.33 does not.
                assert_eq!(
                    group(&merged, "apps")
                        .metadata
                        .extra
                        .contains_key("creationTimestamp"),
                    first130,
                    "{what}"
                );
                // Both hold every group: the earlier server's group order is used.
                let order: Vec<_> = merged
                    .items
                    .iter()
                    .map(|g| g.metadata.name.clone())
                    .collect();
                assert_eq!(
                    &order,
                    if first130 { &k130_order } else { &k133_order },
                    "{what}"
                );
            }
        }
    }

    // -----------------------------------------------------------------------------------------
    // Aggregated, hand-made
    // -----------------------------------------------------------------------------------------

    fn widgets(verbs: Value, subresources: Value) -> APIGroupDiscoveryList {
        doc(
            json!([{"metadata": {"name": "x.io"}, "versions": [{"version": "v1",
            "resources": [{"resource": "widgets", "scope": "Namespaced",
              "singularResource": "widget", "responseKind": {"group": "", "version": "", "kind": "Widget"},
              "verbs": verbs, "subresources": subresources}]}]}]),
        )
    }

    #[test]
    fn verbs_are_a_sorted_union() {
        // (verbs of a, verbs of b, merged)
        let cases: &[(&[&str], &[&str], &[&str])] = &[
            (
                &["list", "get"],
                &["watch", "get", "create"],
                &["create", "get", "list", "watch"],
            ),
            (&["get"], &[], &["get"]),
            (&[], &[], &[]),
            (&["get", "get"], &["list"], &["get", "list"]),
            // Identical lists are kept as they are.
            (&["list", "get"], &["list", "get"], &["list", "get"]),
        ];
        for (a, b, want) in cases {
            for ids in [("a", "b"), ("b", "a")] {
                let merged = merge_aggregated(
                    ids.0,
                    &[
                        (ids.0.to_owned(), widgets(json!(a), json!([]))),
                        (ids.1.to_owned(), widgets(json!(b), json!([]))),
                    ],
                );
                assert_eq!(
                    resource(&merged, "x.io", "v1", "widgets").verbs,
                    strings(want),
                    "{a:?} + {b:?}"
                );
            }
        }
    }

    #[test]
    fn subresources_are_unioned() {
        let a = widgets(
            json!(["get"]),
            json!([
                {"subresource": "status", "verbs": ["get"], "responseKind": {"kind": "Widget"}},
                {"subresource": "scale", "verbs": ["update", "get"],
                 "responseKind": {"group": "autoscaling", "version": "v1", "kind": "Scale"}},
            ]),
        );
        let b = widgets(
            json!(["get"]),
            json!([
                {"subresource": "status", "verbs": ["patch", "get"], "responseKind": {"kind": "WidgetStatus"},
                 "acceptedTypes": [{"group": "x.io", "version": "v1", "kind": "Widget"}], "future": 1},
                {"subresource": "eviction", "verbs": ["create"]},
            ]),
        );
        let merged = merge_aggregated("a", &servers(&[("b", &b), ("a", &a)]));
        let got = serde_json::to_value(&resource(&merged, "x.io", "v1", "widgets").subresources)
            .expect("json");
        assert_eq!(
            got,
            json!([
                // Verbs unioned; everything else from a (no acceptedTypes, no "future").
                {"subresource": "status", "verbs": ["get", "patch"],
                 "responseKind": {"group": "", "version": "", "kind": "Widget"}},
                // Only in b; a's order (status, scale) and b's (status, eviction) leave eviction
                // and scale free: by name.
                {"subresource": "eviction", "verbs": ["create"]},
                // Only in a, untouched (verbs included).
                {"subresource": "scale", "verbs": ["update", "get"],
                 "responseKind": {"group": "autoscaling", "version": "v1", "kind": "Scale"}},
            ])
        );
        // Swapping ids: b's status wins its fields.
        let merged = merge_aggregated("a", &servers(&[("a", &b), ("b", &a)]));
        let status = &resource(&merged, "x.io", "v1", "widgets").subresources[0];
        assert_eq!(status.subresource, "status");
        assert_eq!(status.verbs, strings(&["get", "patch"]));
        assert_eq!(status.accepted_types.len(), 1);
        assert_eq!(status.extra.get("future"), Some(&json!(1)));
    }

    #[test]
    fn freshness_and_version_fields_from_the_earlier_server() {
        let mk = |freshness: &str, extra: i64, resource: &str| {
            doc(json!([{"metadata": {"name": "x.io"}, "future": extra,
                "versions": [{"version": "v1", "freshness": freshness, "future": extra,
                  "resources": [{"resource": resource, "verbs": ["get"]}]}]}]))
        };
        let stale = mk("Stale", 1, "widgets");
        let current = mk("Current", 2, "gadgets");
        for (ids, want, extra) in [(("a", "b"), "Stale", 1), (("b", "a"), "Current", 2)] {
            let merged = merge_aggregated(ids.0, &servers(&[(ids.0, &stale), (ids.1, &current)]));
            let v = version(&merged, "x.io", "v1");
            assert_eq!(v.freshness.as_deref(), Some(want));
            assert_eq!(v.extra.get("future"), Some(&json!(extra)));
            assert_eq!(
                group(&merged, "x.io").extra.get("future"),
                Some(&json!(extra))
            );
            let names: Vec<_> = v.resources.iter().map(|r| r.resource.as_str()).collect();
            assert_eq!(names, ["gadgets", "widgets"]);
        }
    }

    #[test]
    fn list_header_and_empty_input() {
        let empty = merge_aggregated(NOBODY, &[]);
        assert_eq!(
            serde_json::to_value(&empty).expect("json"),
            json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2",
                   "metadata": {}, "items": []})
        );
        let mut beta = doc(json!([]));
        beta.api_version = "apidiscovery.k8s.io/v2beta1".to_owned();
        beta.metadata
            .insert("resourceVersion".to_owned(), json!("7"));
        let v2 = doc(json!([]));
        let merged = merge_aggregated("m", &servers(&[("z", &v2), ("m", &beta)]));
        assert_eq!(merged, beta);
        assert_eq!(
            serde_json::to_value(merge_group_lists(NOBODY, &[])).expect("json"),
            json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []})
        );
        assert_eq!(
            serde_json::to_value(merge_resource_lists(&[])).expect("json"),
            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "", "resources": []})
        );
    }

    #[test]
    fn duplicate_ids_and_items_are_deterministic() {
        let (k130, k133) = (fixture(K130), fixture(K133));
        let one = merge_aggregated("x", &servers(&[("x", &k130), ("x", &k133)]));
        let two = merge_aggregated("x", &servers(&[("x", &k133), ("x", &k130)]));
        assert_eq!(bytes(&one), bytes(&two));
        // A group listed twice by one server is merged into its first occurrence (whose
        // metadata wins), like a copy from a later server.
        let twice = doc(json!([
            {"metadata": {"name": "x.io"}, "versions": [{"version": "v1",
              "resources": [{"resource": "a", "verbs": ["get"]}]}]},
            {"metadata": {"name": "y.io"}},
            {"metadata": {"name": "x.io", "labels": {"l": "2"}}, "versions": [{"version": "v2"},
              {"version": "v1", "resources": [{"resource": "b", "verbs": ["get"]},
                {"resource": "a", "verbs": ["list"]}]}]},
        ]));
        // As a peer's list (no local server): v2, the newest, first.
        let merged = merge_aggregated(NOBODY, &servers(&[("s", &twice)]));
        // As the local list: its preferred version of x.io is the first it lists.
        assert_eq!(
            versions(&merge_aggregated("s", &servers(&[("s", &twice)])), "x.io"),
            ["v1", "v2"]
        );
        assert_eq!(
            serde_json::to_value(&merged.items).expect("json"),
            json!([
                {"metadata": {"name": "x.io"}, "versions": [
                  {"version": "v2", "resources": []},
                  // The second copy lists every version and every v1 resource: its order.
                  {"version": "v1", "resources": [
                    {"resource": "b", "scope": "", "singularResource": "", "verbs": ["get"]},
                    {"resource": "a", "scope": "", "singularResource": "", "verbs": ["get", "list"]}]}]},
                {"metadata": {"name": "y.io"}},
            ])
        );
    }

    #[test]
    fn core_group_merges_the_same_way() {
        let core = |subresources: Value, extra_resource: bool| {
            let mut resources = vec![
                json!({"resource": "bindings", "scope": "Namespaced", "singularResource": "binding",
                       "verbs": ["create"]}),
                json!({"resource": "pods", "scope": "Namespaced", "singularResource": "pod",
                       "shortNames": ["po"], "verbs": ["get", "list"], "subresources": subresources}),
            ];
            if extra_resource {
                resources.push(json!({"resource": "podcheckpoints", "verbs": ["create"]}));
            }
            doc(
                json!([{"metadata": {"name": ""}, "versions": [{"version": "v1", "resources": resources}]}]),
            )
        };
        let old = core(
            json!([{"subresource": "status", "verbs": ["get"]},
                              {"subresource": "exec", "verbs": ["get"]}]),
            false,
        );
        let new = core(
            json!([{"subresource": "status", "verbs": ["get"]},
                              {"subresource": "exec", "verbs": ["create", "get"]},
                              {"subresource": "resize", "verbs": ["patch"]}]),
            true,
        );
        let merged = merge_aggregated("old", &servers(&[("new", &new), ("old", &old)]));
        let served = ServedApis::from_aggregated(&merged).expect("valid");
        for key in [
            "pods",
            "pods/status",
            "pods/exec",
            "pods/resize",
            "bindings",
            "podcheckpoints",
        ] {
            assert!(served.serves("", "v1", key), "{key}");
        }
        assert_eq!(merged.items.len(), 1);
        let pods = resource(&merged, "", "v1", "pods");
        let subs: Vec<_> = pods
            .subresources
            .iter()
            .map(|s| s.subresource.as_str())
            .collect();
        assert_eq!(subs, ["status", "exec", "resize"]);
        assert_eq!(pods.subresources[1].verbs, strings(&["create", "get"]));
        assert_eq!(pods.short_names, strings(&["po"]));
    }

    // -----------------------------------------------------------------------------------------
    // Legacy
    // -----------------------------------------------------------------------------------------

    /// Legacy `/apis` as kube-apiserver derives it from the aggregated document.
    fn legacy_groups(list: &APIGroupDiscoveryList) -> APIGroupList {
        let groups = list
            .items
            .iter()
            .map(|g| {
                let versions: Vec<GroupVersionForDiscovery> = g
                    .versions
                    .iter()
                    .map(|v| GroupVersionForDiscovery {
                        group_version: format!("{}/{}", g.metadata.name, v.version),
                        version: v.version.clone(),
                        extra: Default::default(),
                    })
                    .collect();
                APIGroup {
                    name: g.metadata.name.clone(),
                    preferred_version: versions.first().cloned(),
                    versions,
                    ..APIGroup::default()
                }
            })
            .collect();
        APIGroupList {
            kind: GROUP_LIST_KIND.to_owned(),
            api_version: "v1".to_owned(),
            groups,
            extra: Default::default(),
        }
    }

    #[test]
    fn legacy_group_lists_agree_with_aggregated() {
        let (k130, k133) = (fixture(K130), fixture(K133));
        let (l130, l133) = (legacy_groups(&k130), legacy_groups(&k133));
        for ids in [("a", "b"), ("b", "a")] {
            // (local id, resource.k8s.io's preferred version): 1.30's id, then 1.33's, then none.
            for (local, want) in [
                (ids.0, "resource.k8s.io/v1alpha2"),
                (ids.1, "resource.k8s.io/v1beta2"),
                (NOBODY, "resource.k8s.io/v1beta2"),
            ] {
                let aggregated =
                    merge_aggregated(local, &servers(&[(ids.0, &k130), (ids.1, &k133)]));
                let legacy = merge_group_lists(local, &servers(&[(ids.1, &l133), (ids.0, &l130)]));
                assert_eq!(legacy, legacy_groups(&aggregated), "{ids:?} local {local}");
                let resource = legacy
                    .groups
                    .iter()
                    .find(|g| g.name == "resource.k8s.io")
                    .expect("resource.k8s.io");
                assert_eq!(
                    resource
                        .preferred_version
                        .as_ref()
                        .map(|v| v.group_version.as_str()),
                    Some(want),
                    "{ids:?} local {local}"
                );
            }
        }
        assert_eq!(
            merge_group_lists("a", &servers(&[("a", &l130), ("b", &l130)])),
            l130
        );
    }

    /// (what, local's versions, local's preferredVersion, merged versions)
    type LegacyPreferredCase<'a> = (&'a str, &'a [&'a str], Option<&'a str>, &'a [&'a str]);

    #[test]
    fn legacy_local_preferred_version_first() {
        let list =
            |json: Value| -> APIGroupList { serde_json::from_value(json).expect("test list") };
        let gv = |v: &str| json!({"groupVersion": format!("x.io/{v}"), "version": v});
        let group = |versions: &[&str], preferred: Option<&str>| {
            let mut g = json!({"name": "x.io",
                "versions": versions.iter().map(|v| gv(v)).collect::<Vec<_>>()});
            if let Some(p) = preferred {
                g["preferredVersion"] = gv(p);
            }
            list(json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [g]}))
        };
        let peer = group(&["v2", "v1", "v1beta1"], Some("v2"));
        let cases: &[LegacyPreferredCase] = &[
            (
                "local v1, peer adds v2",
                &["v1", "v1beta1"],
                Some("v1"),
                &["v1", "v2", "v1beta1"],
            ),
            (
                "local prefers a beta",
                &["v1beta1"],
                Some("v1beta1"),
                &["v1beta1", "v2", "v1"],
            ),
            (
                "preferredVersion, not the first listed, decides",
                &["v1beta1", "v1"],
                Some("v1"),
                &["v1", "v2", "v1beta1"],
            ),
            (
                "no preferredVersion: the first listed",
                &["v1", "v1beta1"],
                None,
                &["v1", "v2", "v1beta1"],
            ),
            (
                "preferredVersion names a version not listed: the first listed",
                &["v1beta1"],
                Some("v3"),
                &["v1beta1", "v2", "v1"],
            ),
        ];
        for (what, versions, preferred, want) in cases {
            let local = group(versions, *preferred);
            for (local_id, peer_id) in [("a", "b"), ("b", "a")] {
                for reversed in [false, true] {
                    let mut input = servers(&[(local_id, &local), (peer_id, &peer)]);
                    if reversed {
                        input.reverse();
                    }
                    let merged = merge_group_lists(local_id, &input);
                    let got: Vec<_> = merged.groups[0]
                        .versions
                        .iter()
                        .map(|v| v.version.as_str())
                        .collect();
                    assert_eq!(got, *want, "{what}, local {local_id}");
                    assert_eq!(
                        merged.groups[0].preferred_version.as_ref(),
                        merged.groups[0].versions.first(),
                        "{what}, local {local_id}"
                    );
                }
            }
        }
    }

    #[test]
    fn legacy_group_fields() {
        let list =
            |json: Value| -> APIGroupList { serde_json::from_value(json).expect("test list") };
        let a = list(
            json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            {"name": "x.io", "versions": [{"groupVersion": "x.io/v1beta1", "version": "v1beta1"}],
             "preferredVersion": {"groupVersion": "x.io/v1beta1", "version": "v1beta1"},
             "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "a:6443"}]}]}),
        );
        let b = list(
            json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            {"name": "y.io", "versions": [{"groupVersion": "y.io/v1", "version": "v1"}],
             "preferredVersion": {"groupVersion": "y.io/v1", "version": "v1"}},
            {"name": "x.io", "versions": [{"groupVersion": "x.io/v1", "version": "v1"},
                                          {"groupVersion": "x.io/v1beta1", "version": "v1beta1", "future": 1}],
             "preferredVersion": {"groupVersion": "x.io/v1", "version": "v1"},
             "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "b:6443"}]}]}),
        );
        for reversed in [false, true] {
            let mut input = servers(&[("a", &a), ("b", &b)]);
            if reversed {
                input.reverse();
            }
            let merged = serde_json::to_value(merge_group_lists("b", &input)).expect("json");
            assert_eq!(
                merged,
                json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                    // b holds every group: its order. x.io: b holds every version: its order;
                    // the version entries and the CIDRs from a; preferred = first merged.
                    {"name": "y.io", "versions": [{"groupVersion": "y.io/v1", "version": "v1"}],
                     "preferredVersion": {"groupVersion": "y.io/v1", "version": "v1"}},
                    {"name": "x.io", "versions": [{"groupVersion": "x.io/v1", "version": "v1"},
                                                  {"groupVersion": "x.io/v1beta1", "version": "v1beta1"}],
                     "preferredVersion": {"groupVersion": "x.io/v1", "version": "v1"},
                     "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "a:6443"}]},
                ]}),
                "reversed: {reversed}"
            );
        }
    }

    #[test]
    fn legacy_resource_lists() {
        let (c130, c133) = (legacy_core(K130), legacy_core(K133));
        let names = |l: &APIResourceList| -> BTreeSet<String> {
            l.resources.iter().map(|r| r.name.clone()).collect()
        };
        let merged = merge_resource_lists(&servers(&[("b", &c130), ("a", &c133)]));
        let again = merge_resource_lists(&servers(&[("a", &c133), ("b", &c130)]));
        assert_eq!(bytes(&merged), bytes(&again));
        assert_eq!(
            names(&merged),
            names(&c130).union(&names(&c133)).cloned().collect()
        );
        assert!(names(&merged).contains("pods/resize"));
        assert_eq!(merged.group_version, "v1");

        let list = |resources: Value| -> APIResourceList {
            serde_json::from_value(json!({"kind": "APIResourceList", "groupVersion": "x.io/v1",
                "resources": resources}))
            .expect("test list")
        };
        let a = list(json!([
            {"name": "widgets", "singularName": "widget", "namespaced": true, "kind": "Widget",
             "verbs": ["list", "get"], "shortNames": ["w"], "storageVersionHash": "aaa"},
            {"name": "widgets/status", "singularName": "", "namespaced": true, "kind": "Widget",
             "verbs": ["get"]},
        ]));
        let b = list(json!([
            {"name": "gadgets", "singularName": "gadget", "namespaced": false, "kind": "Gadget",
             "verbs": ["get"]},
            {"name": "widgets", "singularName": "widget", "namespaced": true, "kind": "Widget",
             "verbs": ["watch", "get"], "shortNames": ["wd"], "storageVersionHash": "bbb"},
        ]));
        for ids in [("a", "b"), ("b", "a")] {
            let merged = merge_resource_lists(&servers(&[(ids.1, &b), (ids.0, &a)]));
            let by_name: BTreeMap<_, _> = merged
                .resources
                .iter()
                .map(|r| (r.name.as_str(), r))
                .collect();
            let widgets = by_name["widgets"];
            assert_eq!(widgets.verbs, strings(&["get", "list", "watch"]));
            let a_first = ids.0 == "a";
            assert_eq!(
                widgets.short_names,
                strings(&[if a_first { "w" } else { "wd" }])
            );
            assert_eq!(
                widgets.storage_version_hash.as_deref(),
                Some(if a_first { "aaa" } else { "bbb" })
            );
            let order: Vec<_> = merged.resources.iter().map(|r| r.name.as_str()).collect();
            // a: widgets < widgets/status; b: gadgets < widgets.
            assert_eq!(order, ["gadgets", "widgets", "widgets/status"]);
        }
    }

    // -----------------------------------------------------------------------------------------
    // ETag
    // -----------------------------------------------------------------------------------------

    #[test]
    fn etags() {
        assert_eq!(
            merged_etag(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            http_etag(b""),
            "\"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\""
        );
        let (k130, k133) = (fixture(K130), fixture(K133));
        let ab = bytes(&merge_aggregated(
            "a",
            &servers(&[("a", &k130), ("b", &k133)]),
        ));
        let ba = bytes(&merge_aggregated(
            "a",
            &servers(&[("b", &k133), ("a", &k130)]),
        ));
        let swapped = bytes(&merge_aggregated(
            "a",
            &servers(&[("b", &k130), ("a", &k133)]),
        ));
        assert_eq!(merged_etag(&ab), merged_etag(&ba));
        assert_ne!(
            merged_etag(&ab),
            merged_etag(&swapped),
            "the earlier server shapes the bytes"
        );
        let tag = merged_etag(&ab);
        assert_eq!(tag.len(), 64);
        assert!(tag
            .bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)));
    }
}
