//! The native filter's entry points (`skewgate_native::filter`) on the fake Envoy
//! (`skewgate_native::ffi::fake`, the callback table over one thread-local stream): any request
//! headers (names and values as bytes, not UTF-8), then any response status, Envoy
//! `response.code_details` and body pieces, each piece a separate body hook, some buffered.
//! Asserts, beyond "never panics" (and no unwind through a hook): a stopped request was
//! answered; a forwarded one carries no client-sent internal header except the routing the
//! filter set itself, to a cluster the configuration declares; every counter was counted with
//! as many label values as it was defined with.
#![no_main]

use libfuzzer_sys::fuzz_target;
use skewgate_native::ffi::fake::{self, with_stream, FakeStream};
use skewgate_native::filter::{BodyPhase, NativeConfig, NativeFilter, Next};

const CONFIG: &str = r#"{"schema":1,"local_apiserver":"apiserver-a",
    "peer_clusters":{"skewgate-peers-16b25d540f7c":["apiserver-b"]},
    "group_versions":[{"group":"resource.k8s.io","version":"v1alpha3","resources":[
        {"resource":"resourceclaims","peer_cluster":"skewgate-peers-16b25d540f7c"}]},
        {"group":"apps","version":"v1","resources":[{"resource":"deployments","local":true}]}],
    "failover_clusters":{"skewgate-failover-16b25d540f7c":["apiserver-b"]},
    "failover_all":"skewgate-failover-16b25d540f7c"}"#;

/// Pieces of `data` separated by 0xff bytes.
fn pieces(data: &[u8]) -> Vec<Vec<u8>> {
    data.split(|b| *b == 0xff).map(<[u8]>::to_vec).collect()
}

fuzz_target!(|data: &[u8]| {
    fake::install();
    with_stream(|s| *s = FakeStream::default());
    let config = NativeConfig::new(&fake::config(), b"skewgate", CONFIG.as_bytes())
        .expect("the configuration is valid");
    // Request headers, 0xfe, the response: status, details, then body pieces.
    let (request, response) = match data.iter().position(|b| *b == 0xfe) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let mut headers: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let mut fields = pieces(request).into_iter();
    while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
        headers.push((name, value));
    }
    with_stream(|s| s.request_headers = headers);
    let mut filter = NativeFilter::new(&config, fake::filter());
    match filter.on_request_headers() {
        Next::Stop => {
            let sent = with_stream(|s| s.sent.clone());
            let (status, _, _) = sent.expect("a stopped request is answered");
            assert!((400..600).contains(&status), "{status}");
            return;
        }
        Next::Continue => {
            let (headers, sent) = with_stream(|s| (s.request_headers.clone(), s.sent.clone()));
            assert!(sent.is_none());
            for (name, value) in &headers {
                if name.eq_ignore_ascii_case(b"x-skewgate-upstream-cluster") {
                    let value = String::from_utf8_lossy(value);
                    assert!(
                        value.starts_with("skewgate-local-")
                            || value.starts_with("skewgate-peers-16b25d540f7c-")
                            || value.starts_with("skewgate-failover-16b25d540f7c-"),
                        "{value}"
                    );
                }
            }
        }
    }
    let mut parts = pieces(response).into_iter();
    let status = parts.next().unwrap_or_default();
    let details = parts.next();
    with_stream(|s| {
        s.response_headers = vec![(b":status".to_vec(), status)];
        s.code_details = details;
    });
    let body: Vec<Vec<u8>> = parts.collect();
    filter.on_response_headers(body.is_empty());
    let last = body.len().saturating_sub(1);
    for (i, piece) in body.into_iter().enumerate() {
        with_stream(|s| s.received = piece);
        let phase = filter.on_response_body(i == last);
        with_stream(|s| {
            if phase == BodyPhase::Buffer {
                // What Envoy does with StopIterationAndBuffer: keep the piece.
                let piece = std::mem::take(&mut s.received);
                s.buffered.extend(piece);
            }
        });
    }
    with_stream(|s| {
        for (id, values, _) in &s.recorded {
            assert_eq!(s.defined[*id].1.len(), values.len());
        }
    });
});
