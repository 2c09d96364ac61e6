//! `identity_from_subject` and `parse_rfc2253` on any subject (lossy UTF-8, as the filter reads
//! Envoy's `connection.subject_peer_certificate`). Asserts, beyond "never panics": an accepted
//! subject parses as RFC 2253 too, and yields a non-empty user, and a user and groups that can
//! cross an HTTP header unchanged (no control byte, no leading or trailing space, no empty
//! group); the requestheader headers carry exactly that user and those groups.
#![no_main]

use libfuzzer_sys::fuzz_target;
use skewgate_core::identity::{
    identity_from_subject, parse_rfc2253, remote_headers, IdentityError, MAX_SUBJECT_LEN,
    REMOTE_GROUP, REMOTE_USER,
};

fn forwardable(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with(' ')
        && !s.ends_with(' ')
        && !s.bytes().any(|b| b < 0x20 || b == 0x7f)
}

fuzz_target!(|data: &[u8]| {
    let subject = String::from_utf8_lossy(data);
    let rdns = parse_rfc2253(&subject);
    let result = identity_from_subject(&subject);
    if subject.is_empty() {
        assert_eq!(result, Err(IdentityError::Empty));
    }
    if subject.len() > MAX_SUBJECT_LEN {
        assert!(
            matches!(result, Err(IdentityError::TooLong { .. })),
            "{result:?}"
        );
    }
    let Ok(id) = result else { return };
    let _ = id.clone();
    assert!(
        rdns.is_ok(),
        "accepted {subject:?} but parse_rfc2253 refused it: {rdns:?}"
    );
    assert!(!id.user.is_empty(), "{subject:?}");
    assert!(forwardable(&id.user), "{subject:?} -> user {:?}", id.user);
    for g in &id.groups {
        assert!(forwardable(g), "{subject:?} -> group {g:?}");
    }
    let headers = remote_headers(&id);
    assert_eq!(headers.len(), id.groups.len() + 1);
    assert_eq!(headers.first(), Some(&(REMOTE_USER, id.user.as_str())));
    for ((name, value), group) in headers.iter().skip(1).zip(&id.groups) {
        assert_eq!((*name, *value), (REMOTE_GROUP, group.as_str()));
    }
});
