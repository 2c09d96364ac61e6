//! Discovery `Accept` negotiation on any header value. Input: one byte of options (bit 0:
//! `v2beta1` accepted), then the raw header bytes. Asserts, beyond "never panics", that the
//! choice is consistent with the clauses:
//! * an aggregated answer needs `apidiscovery.k8s.io` and `APIGroupDiscoveryList` (exact case)
//!   and its version (`v2`, `v2beta1`) in the header; `v2beta1` only when the options allow it;
//! * `nopeer` only on an aggregated answer whose header says `nopeer`; `protobuf` only if a
//!   clause names `application/vnd.kubernetes.protobuf`
//!   (spaces around the `/` allowed: goautoneg trims them); `json` only if `json` or a wildcard
//!   appears;
//! * too many clauses only with more than `MAX_CLAUSES` commas' worth of clauses;
//! * appending the aggregated v2 JSON clause to a header that got no aggregated answer makes
//!   it an aggregated JSON answer, unless the header then has too many clauses. Not always v2:
//!   the first acceptable clause wins, and appending `, ...` can make an earlier clause
//!   acceptable (the header's trailing whitespace, trimmed before, now ends a clause's
//!   parameters), so it may be that clause's `v2beta1` when the options allow it;
//! * `etag_matches` never panics, and a value never matches an empty ETag.
#![no_main]

use libfuzzer_sys::fuzz_target;
use skewgate_core::negotiation::{
    etag_matches, negotiate_discovery_with, DiscoveryFormat, NegotiationError, NegotiationOptions,
    AGGREGATED_V2_CONTENT_TYPE, MAX_CLAUSES,
};

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, header)) = data.split_first() else {
        return;
    };
    let options = NegotiationOptions {
        v2beta1: flags & 1 == 1,
    };
    let result = negotiate_discovery_with(Some(header), options);
    assert_eq!(
        result,
        negotiate_discovery_with(Some(header), options),
        "deterministic"
    );
    let lower = header.to_ascii_lowercase();
    match result {
        Ok(choice) => {
            let _ = choice.peer_aggregated();
            match choice.format {
                DiscoveryFormat::AggregatedV2 | DiscoveryFormat::AggregatedV2Beta1 => {
                    assert!(contains(header, b"apidiscovery.k8s.io"), "{choice:?}");
                    assert!(contains(header, b"APIGroupDiscoveryList"), "{choice:?}");
                    assert!(contains(header, b"v2"), "{choice:?}");
                }
                DiscoveryFormat::Legacy => assert!(!choice.nopeer, "{choice:?}"),
            }
            if choice.format == DiscoveryFormat::AggregatedV2Beta1 {
                assert!(options.v2beta1, "{choice:?}");
                assert!(contains(header, b"v2beta1"), "{choice:?}");
            }
            if choice.nopeer {
                assert!(contains(header, b"nopeer"), "{choice:?}");
            }
            if choice.protobuf {
                // goautoneg trims spaces around the type and subtype: `application /vnd...`.
                assert!(contains(header, b"vnd.kubernetes.protobuf"), "{choice:?}");
                assert!(contains(header, b"application"), "{choice:?}");
            }
            if choice.json && !header.iter().all(|b| b.is_ascii_whitespace()) {
                assert!(
                    contains(&lower, b"json") || contains(header, b"*"),
                    "{choice:?}"
                );
            }
        }
        Err(NegotiationError::TooManyClauses) => {
            let commas = header.iter().filter(|&&b| b == b',').count();
            assert!(commas >= MAX_CLAUSES, "{commas} commas");
        }
        Err(NegotiationError::NotAcceptable) => {}
    }

    let aggregated = matches!(
        result,
        Ok(c) if c.format != DiscoveryFormat::Legacy
    );
    if !aggregated {
        let mut more = header.to_vec();
        more.extend_from_slice(b", ");
        more.extend_from_slice(AGGREGATED_V2_CONTENT_TYPE.as_bytes());
        match negotiate_discovery_with(Some(&more), options) {
            Ok(choice) => {
                assert!(
                    choice.format == DiscoveryFormat::AggregatedV2
                        || (options.v2beta1 && choice.format == DiscoveryFormat::AggregatedV2Beta1),
                    "{choice:?}"
                );
                assert!(choice.json, "{choice:?}");
            }
            Err(NegotiationError::TooManyClauses) => {}
            Err(e) => panic!("{more:?}: {e:?}, the appended aggregated clause is acceptable"),
        }
    }

    let etag = String::from_utf8_lossy(header);
    let _ = etag_matches(Some(header), &etag);
    let _ = etag_matches(Some(header), "0A1B2C");
    assert!(
        !etag_matches(Some(header), ""),
        "an empty ETag never matches"
    );
    assert!(!etag_matches(None, &etag));
});
