//! The verified client certificate's subject, as Envoy hands it to the filter in the
//! `x-forwarded-client-cert` (XFCC) request header (docs/ARCHITECTURE.md, "Step 2").
//!
//! Envoy's connection manager runs with `forward_client_cert_details: SANITIZE_SET` and
//! `set_current_client_cert_details: { subject: true }`: before any filter runs, it removes
//! every client copy of the header and, on a connection that presented a verified certificate,
//! sets exactly one element, `Hash=<hex>;Subject="<subject>"` (plus `By=<URI SAN>` first when
//! Envoy's own certificate has one). The subject is the same BoringSSL RFC 2253 string the
//! `connection.subject_peer_certificate` property returns, quoted without further escaping:
//! RFC 2253 already escapes every `"` and `\` in it (measured on Envoy 1.40, the strings are in
//! the tests). Reading it from the request headers the filter reads anyway saves a property
//! call per request (BENCHMARKS.md, "Per-request cost").
//!
//! Anything else in the header cannot come from that configuration: it is refused, and the
//! request fails closed, rather than guessed at.

use std::fmt;

/// The header Envoy writes the client certificate's details into.
pub const XFCC: &str = "x-forwarded-client-cert";

/// Why the header Envoy set could not be read. Each means Envoy is not configured as the
/// bootstrap says; the request is answered 503 and goes nowhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XfccError {
    /// More than one `x-forwarded-client-cert` header.
    Repeated,
    /// More than one element (`,` outside quotes): a proxy chain, which SANITIZE_SET never sets.
    ManyElements,
    /// A field without `=`, or a quoted value without its closing quote.
    Malformed { at: usize },
    /// No `Subject` field, or two of them.
    Subject,
}

impl fmt::Display for XfccError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Repeated => write!(f, "more than one {XFCC} header"),
            Self::ManyElements => write!(f, "{XFCC} holds more than one element"),
            Self::Malformed { at } => write!(f, "{XFCC} is malformed at byte {at}"),
            Self::Subject => write!(f, "{XFCC} does not hold exactly one Subject"),
        }
    }
}

impl std::error::Error for XfccError {}

/// The subject of the verified client certificate among the request `headers` (names in lower
/// case, as Envoy gives them): `None` when the connection presented none (Envoy then removed
/// every copy of the header). The bytes are the subject as RFC 2253 prints it, escapes kept.
pub fn subject<N: AsRef<str>, V: AsRef<[u8]>>(
    headers: &[(N, V)],
) -> Result<Option<&[u8]>, XfccError> {
    let mut values = headers
        .iter()
        .filter(|(name, _)| name.as_ref().eq_ignore_ascii_case(XFCC))
        .map(|(_, value)| value.as_ref());
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(XfccError::Repeated);
    }
    let mut subject = None;
    for (key, field) in fields(value)? {
        if key.eq_ignore_ascii_case(b"subject") {
            if subject.is_some() {
                return Err(XfccError::Subject);
            }
            subject = Some(field);
        }
    }
    subject.map(Some).ok_or(XfccError::Subject)
}

/// One `key=value` field of an element.
type Field<'a> = (&'a [u8], &'a [u8]);

/// The `key=value` fields of the one element in `value`; a quoted value comes without its
/// quotes and with its backslash escapes as they are.
fn fields(value: &[u8]) -> Result<Vec<Field<'_>>, XfccError> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < value.len() {
        let rest = value.get(i..).unwrap_or_default();
        let eq = rest
            .iter()
            .position(|&b| b == b'=')
            .ok_or(XfccError::Malformed { at: i })?;
        let key = rest.get(..eq).unwrap_or_default();
        if key.iter().any(|&b| matches!(b, b';' | b',' | b'"')) {
            return Err(XfccError::Malformed { at: i });
        }
        let start = i + eq + 1;
        let (field, end) = if value.get(start) == Some(&b'"') {
            let close =
                closing_quote(value, start + 1).ok_or(XfccError::Malformed { at: start })?;
            (value.get(start + 1..close).unwrap_or_default(), close + 1)
        } else {
            let len = value
                .get(start..)
                .unwrap_or_default()
                .iter()
                .position(|&b| matches!(b, b';' | b',' | b'"'))
                .unwrap_or(value.len() - start);
            (
                value.get(start..start + len).unwrap_or_default(),
                start + len,
            )
        };
        out.push((key, field));
        match value.get(end) {
            None => break,
            Some(b';') => i = end + 1,
            Some(b',') => return Err(XfccError::ManyElements),
            Some(_) => return Err(XfccError::Malformed { at: end }),
        }
    }
    Ok(out)
}

/// The index of the first `"` at or after `from` that no backslash escapes.
fn closing_quote(value: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while let Some(&b) = value.get(i) {
        match b {
            b'\\' => i += 2,
            b'"' => return Some(i),
            _ => i += 1,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The XFCC values a request carries, and what [`subject`] makes of them.
    type Case<'a> = (&'a [&'a [u8]], Option<&'a [u8]>);

    fn with<'a>(values: &[&'a [u8]]) -> Vec<(&'a str, &'a [u8])> {
        let mut headers: Vec<(&str, &[u8])> = vec![(":method", b"GET"), (":path", b"/api")];
        headers.extend(values.iter().map(|v| (XFCC, *v)));
        headers
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn subjects_as_envoy_writes_them() {
        let cases: &[Case] = &[
            (&[], None),
            (
                &[br#"Hash=d23f63fe37;Subject="O=system:masters+CN=admin,O=dev""#],
                Some(b"O=system:masters+CN=admin,O=dev"),
            ),
            // Measured on Envoy 1.40: a certificate for `/O=g1/O=g"2;x/CN=al\ice, "q"`
            // (openssl -subj) gives exactly this header (the hash shortened).
            (
                &[br#"Hash=d23f63fe37;Subject="CN=al\\ice\, \"q\",O=g\"2\;x,O=g1""#],
                Some(br#"CN=al\\ice\, \"q\",O=g\"2\;x,O=g1"#),
            ),
            (&[br#"Hash=d23f63fe37;Subject="""#], Some(b"")),
            (
                &[br#"By=spiffe://cluster.local/ns/a;Hash=d23f63fe37;Subject="CN=x""#],
                Some(b"CN=x"),
            ),
            (
                &[br#"Hash=d23f63fe37;Subject="CN=x";URI=spiffe://a;DNS=a"#],
                Some(b"CN=x"),
            ),
        ];
        for (values, want) in cases {
            assert_eq!(subject(&with(values)), Ok(*want), "{values:?}");
        }
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn what_envoy_does_not_write_is_refused() {
        let cases: &[(&[&[u8]], XfccError)] = &[
            (
                &[b"Hash=a;Subject=\"CN=a\"", b"Hash=b;Subject=\"CN=b\""],
                XfccError::Repeated,
            ),
            (
                &[b"Hash=a;Subject=\"CN=a\",Hash=b;Subject=\"CN=b\""],
                XfccError::ManyElements,
            ),
            (&[b"Hash=a;Subject=\"CN=a"], XfccError::Malformed { at: 15 }),
            (
                &[b"Hash=a;Subject=\"CN=a\\\""],
                XfccError::Malformed { at: 15 },
            ),
            (
                &[b"Hash=a;Subject=\"CN=a\"x"],
                XfccError::Malformed { at: 21 },
            ),
            (&[b"Hash=a;Subject"], XfccError::Malformed { at: 7 }),
            (&[b"Hash=a"], XfccError::Subject),
            (&[b"Subject=\"CN=a\";subject=\"CN=b\""], XfccError::Subject),
        ];
        for (values, want) in cases {
            let mut headers = vec![(":path", &b"/"[..])];
            headers.extend(values.iter().map(|v| (XFCC, *v)));
            assert_eq!(subject(&headers), Err(want.clone()), "{values:?}");
        }
    }
}
