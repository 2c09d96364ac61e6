//! Identity Lease parsing (`peers::lease`) on arbitrary bytes. Asserts, beyond "never panics":
//! any JSON value deserializes as an `IdentityLease` (the watcher must never fail on a Lease),
//! the same as `from_value`; `lease_info` reads the name the metadata holds, and a renew time
//! only from a lease it found well-formed; `parse_micro_time` never panics on any string.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use skewgate_control::peers::lease::{lease_info, parse_micro_time, IdentityLease};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = parse_micro_time(&text);

    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let lease = match serde_json::from_slice::<IdentityLease>(data) {
        Ok(lease) => lease,
        Err(e) => panic!("a JSON value failed to deserialize as IdentityLease: {e}"),
    };
    assert_eq!(
        lease,
        IdentityLease::from_value(value),
        "Deserialize = from_value"
    );
    let info = lease_info(&lease);
    assert_eq!(info.name, lease.name());
    if info.renew_time.is_some() {
        assert!(info.malformed.is_none(), "{info:?}");
    }
    if let Some(Value::String(t)) = lease.spec.as_ref().and_then(|s| s.get("renewTime")) {
        let _ = parse_micro_time(t);
    }
});
