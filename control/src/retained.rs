//! What is retained: of the APIs that departed apiservers served (their last good discovery,
//! kept by `crate::run::retention` for `--api-retention`), the ones no live apiserver serves.
//! Pure: the live control plane and the tests hand it views, it returns what [`crate::plan`]
//! routes, lists and marks.
//!
//! - A key only a departed apiserver served is **retained**: never the local `404` a controller
//!   would act on. It goes to the departed apiservers that served it, at their last address,
//!   when that is known: one that is back serves it as soon as it is ready, without waiting for
//!   its Lease to be seen (an apiserver writes its Lease about when it gets ready, and the
//!   Lease takes a few hundred milliseconds to become a route); while none is ready, the
//!   answer is the retained 503. Without an address the filter answers 503 itself.
//! - A group-version no live apiserver serves at all is **stale**: `freshness: Stale` in merged
//!   discovery, and its legacy resource list answers 503. A resource missing from a group-version
//!   that is live stays listed (from the departed apiserver's own document).
//! - An apiserver whose identity Lease is **live again** but whose discovery has not been read
//!   again yet (the second between its return and its next fetch) is **returning**: what it alone
//!   served before goes to it, not to a 503. It is the only apiserver that may serve it, and if
//!   it no longer does, the filter's 404 safety net and Envoy's connect failure still answer 503.
//!   Discovery stays as for a departed apiserver (stale) until its documents are read.

use std::collections::BTreeSet;

use skewgate_core::group_version::GroupVersion;

use crate::discovery::documents::DiscoveryDocuments;
use crate::discovery::ServedApis;
use crate::envoy::Address;

/// A peer apiserver that is gone (or not re-read yet) within the API retention: its last good
/// discovery.
#[derive(Debug, Clone, Copy)]
pub struct RetainedView<'a> {
    pub id: &'a str,
    pub documents: &'a DiscoveryDocuments,
    /// Where it was last reached, if known: a departed apiserver's retained keys are sent
    /// there ([`crate::routing`]'s departed clusters), so it serves them as soon as it is ready
    /// again, before its Lease is seen; until then the answer is the retained 503.
    pub address: Option<&'a Address>,
}

/// What the retained apiservers add to what the live ones serve.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetainedApis {
    /// Keys only departed apiservers served: answered 503.
    pub keys: ServedApis,
    /// Group-versions no live apiserver serves: `Stale`, their legacy documents 503.
    pub stale: BTreeSet<GroupVersion>,
    /// Each retained apiserver's documents restricted to what it alone contributes, for merged
    /// discovery, by id.
    pub documents: Vec<(String, DiscoveryDocuments)>,
    /// What each departed apiserver alone served, by id (status page, metrics).
    pub departed: Vec<(String, ServedApis)>,
    /// What each returning apiserver alone served before, by id: routed to it.
    pub returning: Vec<(String, ServedApis)>,
}

/// `live`: what the apiservers with known discovery serve (local and peers). `live_ids`: their
/// ids. `returning`: ids of live peers whose discovery is not known (now). `retained`: the
/// retention's views; those whose id is in `live_ids` count for nothing (their fresh discovery is
/// the truth), those whose documents do not parse likewise.
///
/// A key a returning and a departed apiserver both served goes to the returning one; a key two
/// departed ones served is listed for each (each one's retention is reported).
pub fn retained(
    live: &ServedApis,
    live_ids: &BTreeSet<&str>,
    returning: &BTreeSet<&str>,
    retained: &[RetainedView<'_>],
) -> RetainedApis {
    let mut out = RetainedApis::default();
    let (back, gone): (Vec<&RetainedView<'_>>, Vec<&RetainedView<'_>>) = retained
        .iter()
        .filter(|r| !live_ids.contains(r.id))
        .partition(|r| returning.contains(r.id));
    // Returning apiservers: each what no live one serves (two that served the same key share
    // it: routing gives them one cluster). Departed ones: what neither a live nor a returning
    // one serves (each of them lists it, so each one's expiry is reported).
    let mut covered = live.clone();
    let mut missing_of = |r: &RetainedView<'_>, from: &ServedApis| {
        let their = r.documents.served().ok()?;
        let missing = their.difference(from);
        if missing.is_empty() {
            return None;
        }
        for (group, version) in missing.group_versions() {
            if !live.serves_group_version(group, version) {
                out.stale.insert(GroupVersion::new(group, version));
            }
        }
        out.documents.push((
            r.id.to_string(),
            r.documents.restricted_to(&missing, &out.stale),
        ));
        Some(missing)
    };
    let mut returning_alone = Vec::new();
    for r in back {
        if let Some(missing) = missing_of(r, live) {
            covered.merge(missing.clone());
            returning_alone.push((r.id.to_string(), missing));
        }
    }
    let mut departed = Vec::new();
    for r in gone {
        if let Some(missing) = missing_of(r, &covered) {
            departed.push((r.id.to_string(), missing));
        }
    }
    for (_, missing) in &departed {
        out.keys.merge(missing.clone());
    }
    out.returning = returning_alone;
    out.departed = departed;
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_fixtures::documents;

    fn view<'a>(id: &'a str, documents: &'a DiscoveryDocuments) -> RetainedView<'a> {
        RetainedView {
            id,
            documents,
            address: None,
        }
    }

    fn ids<'a>(v: &[&'a str]) -> BTreeSet<&'a str> {
        v.iter().copied().collect()
    }

    /// The local apiserver on 1.30; the retained one on 1.33.
    fn live_130() -> ServedApis {
        documents("k8s-1.30").served().expect("served")
    }

    #[test]
    fn a_departed_apiserver_keeps_only_what_no_live_one_serves() {
        let b = documents("k8s-1.33");
        let views = [view("b", &b)];
        let r = retained(&live_130(), &ids(&["a"]), &ids(&[]), &views);
        assert!(r
            .keys
            .serves("resource.k8s.io", "v1beta2", "resourceclaims"));
        assert!(r.keys.serves("", "v1", "pods/resize"));
        assert!(
            !r.keys.serves("", "v1", "pods"),
            "the live apiserver serves pods"
        );
        assert!(r
            .stale
            .contains(&GroupVersion::new("resource.k8s.io", "v1beta2")));
        assert!(
            !r.stale.contains(&GroupVersion::new("", "v1")),
            "a live group-version is never stale"
        );
        assert_eq!(r.departed.len(), 1);
        assert_eq!(r.departed[0].1, r.keys);
        assert!(r.returning.is_empty());
        assert_eq!(r.documents.len(), 1);
    }

    #[test]
    fn a_returning_apiserver_gets_what_it_alone_served_instead_of_a_503() {
        let b = documents("k8s-1.33");
        let views = [view("b", &b)];
        let r = retained(&live_130(), &ids(&["a"]), &ids(&["b"]), &views);
        assert!(r.keys.is_empty(), "nothing answered 503");
        assert!(r.departed.is_empty());
        assert_eq!(r.returning.len(), 1);
        assert!(r.returning[0]
            .1
            .serves("resource.k8s.io", "v1beta2", "resourceclaims"));
        // Its discovery is not confirmed: listed, but stale, until it is read again.
        assert!(r
            .stale
            .contains(&GroupVersion::new("resource.k8s.io", "v1beta2")));
    }

    #[test]
    fn a_key_both_a_returning_and_a_departed_apiserver_served_goes_to_the_returning_one() {
        let b = documents("k8s-1.33");
        let c = documents("k8s-1.33");
        // Sorted so that the departed one comes first.
        let views = [view("a-departed", &c), view("b-returning", &b)];
        let r = retained(&live_130(), &ids(&["a"]), &ids(&["b-returning"]), &views);
        assert!(r.keys.is_empty() && r.departed.is_empty());
        assert_eq!(r.returning.len(), 1);
        assert_eq!(r.returning[0].0, "b-returning");
    }

    #[test]
    fn a_key_two_departed_apiservers_served_is_listed_for_each() {
        let b = documents("k8s-1.33");
        let c = documents("k8s-1.33");
        let views = [view("b", &b), view("c", &c)];
        let r = retained(&live_130(), &ids(&["a"]), &ids(&[]), &views);
        assert_eq!(r.departed.len(), 2);
        assert_eq!(r.departed[0].1, r.departed[1].1);
        assert!(r.departed[1]
            .1
            .serves("resource.k8s.io", "v1beta2", "resourceclaims"));
    }

    #[test]
    fn a_key_two_returning_apiservers_served_goes_to_both() {
        let b = documents("k8s-1.33");
        let c = documents("k8s-1.33");
        let views = [view("b", &b), view("c", &c)];
        let r = retained(&live_130(), &ids(&["a"]), &ids(&["b", "c"]), &views);
        assert!(r.keys.is_empty() && r.departed.is_empty());
        assert_eq!(r.returning.len(), 2);
        assert_eq!(r.returning[0].1, r.returning[1].1);
    }

    #[test]
    fn an_apiserver_live_with_known_discovery_is_not_retained_at_all() {
        let b = documents("k8s-1.33");
        let views = [view("b", &b)];
        let r = retained(&live_130(), &ids(&["a", "b"]), &ids(&[]), &views);
        assert_eq!(r, RetainedApis::default());
    }

    #[test]
    fn nothing_missing_nothing_retained() {
        let a = documents("k8s-1.30");
        let views = [view("b", &a)];
        let r = retained(&live_130(), &ids(&["a"]), &ids(&["b"]), &views);
        assert_eq!(r, RetainedApis::default());
    }
}
