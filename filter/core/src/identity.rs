//! The identity kube-apiserver would derive from a verified client certificate, computed from the
//! subject string Envoy gives us.
//!
//! # What arrives
//!
//! Envoy's `connection.subject_peer_certificate` property is BoringSSL's
//! `X509_NAME_print_ex(bio, subject, 0, XN_FLAG_RFC2253)`. Every assumption below was checked
//! against Envoy 1.40.0 (BoringSSL) on this machine, by presenting real client certificates and
//! logging `%DOWNSTREAM_PEER_SUBJECT%` (the same BoringSSL call); the strings are in the tests.
//!
//! * Order: `XN_FLAG_DN_REV`. BoringSSL flattens the name into its entries in certificate (DER)
//!   order, each entry remembering which RDN (SET) it came from, and prints the entries from the
//!   last to the first. So the whole string is the exact reverse of certificate order, *including
//!   the members of a multi-valued RDN*: the DER SET `{CN=u, O=g}` prints as `O=g+CN=u`.
//! * Separators: `,` between RDNs, `+` between members of one RDN, `=` between type and value,
//!   never any spaces (`XN_FLAG_SEP_COMMA_PLUS`, no `XN_FLAG_SPC_EQ`).
//! * Types: short names (`CN`, `O`, `OU`, `C`, `L`, `ST`, `DC`, `emailAddress`, ...); an OID
//!   BoringSSL does not know is printed dotted (`1.2.3.4`) and its value is *always* dumped as
//!   `#` + the uppercase hex of the whole DER element (`XN_FLAG_DUMP_UNKNOWN_FIELDS`).
//! * Values of known types (`ASN1_STRFLGS_RFC2253`):
//!   - a UTF8String's bytes are printed one byte at a time (not re-encoded); T61String,
//!     PrintableString, IA5String, NumericString, VisibleString, UTCTime and GeneralizedTime are
//!     read as Latin-1 and BMPString/UniversalString as UCS-2/UCS-4, then converted to UTF-8
//!     (`ASN1_STRFLGS_UTF8_CONVERT`); every resulting byte goes through the escaper;
//!   - escaper (`ESC_CTRL`, `ESC_MSB`, `ESC_2253`): a byte < 0x20, 0x7F or >= 0x80 becomes `\XX`
//!     (two uppercase hex digits: `café` arrives as `caf\C3\A9`, a newline as `\0A`); `\` and
//!     `"` always, `,` `+` `<` `>` `;` always, `#` and space when first, space when last, become
//!     `\` + the character; everything else is printed as is (`=` and inner `#` are not escaped);
//!   - a value of any other ASN.1 type (OCTET STRING, INTEGER, ...) is dumped like unknown OIDs:
//!     `CN=#0403414243` (measured).
//!
//!   So the printed string is printable ASCII only, `\U`/`\W` escapes cannot occur (they need
//!   code points above 0xFF, which UTF-8 conversion never hands to the escaper), and quoting
//!   (`ESC_QUOTE`) is off.
//! * OpenSSL 3.0 prints the same strings except for a value that is exactly `#`: its `do_buf`
//!   overwrites the "first character" flag with the "last character" flag on a one-character
//!   value and prints `CN=#`; BoringSSL (rewritten with separate `is_first`/`is_last`) prints
//!   `CN=\#`. We refuse `#` with no hex digits rather than guess which printer produced it.
//! * BoringSSL refuses to parse (handshake fails, measured) certificates whose names hold an
//!   invalid UTF8String, an odd-length or surrogate BMPString, so such values never reach us.
//!
//! # What kube-apiserver derives
//!
//! `CommonNameUserConversion`: user = `Subject.CommonName`, groups = `Subject.Organization`.
//! Go's `pkix.Name.FillFromRDNSequence` walks RDNs in certificate order and, inside each RDN, its
//! members in DER order; each string-valued CN *overwrites* `CommonName`, each O is appended. An
//! empty user fails authentication (401). Walking our string backwards is exactly that walk.
//!
//! # Decisions (identity must never be guessed)
//!
//! * Syntax the printer cannot produce is refused, never repaired: raw control or non-ASCII
//!   bytes, unescaped `"` `<` `>` `;` (`;` is an RDN separator to RFC 2253 readers), unescaped
//!   leading or trailing spaces, `\` not followed by a special character or two hex digits, odd
//!   or non-hex `#` dumps. Unambiguous escapes BoringSSL happens not to emit (`\41`, `\=`, lower
//!   case hex) are decoded.
//! * Every text value must decode to UTF-8: non-UTF-8 can only come from an invalid UTF8String,
//!   which Go refuses (the whole certificate).
//! * A `#` dump in a CN or O is decoded only when it is one well-formed DER UTF8String,
//!   PrintableString or IA5String whose content Go's `parseASN1String` accepts; anything else is
//!   refused (newer Go skips non-string CN/O values, older Go rejects the certificate: no single
//!   answer to copy). `#` dumps of other attributes only need well-formed hex: they cannot
//!   change the identity.
//! * The user and every group travel in `X-Remote-User`/`X-Remote-Group` header values, which
//!   cannot carry control bytes (refused: [`IdentityError::ControlCharacter`]), lose leading and
//!   trailing spaces, and are dropped by kube's requestheader authenticator when empty (refused:
//!   [`IdentityError::Unforwardable`]).
//!
//! # Known limits
//!
//! The printed string loses the ASN.1 type of text values. A CN or O stored as a type Go does
//! not treat as a string (VisibleString, UniversalString, UTCTime, GeneralizedTime), or a
//! PrintableString/IA5String holding characters outside its alphabet, prints like a UTF8String:
//! kube-apiserver would skip that attribute or refuse the certificate, and we use it. Only a
//! client CA that signs such subjects can create them (kube's own signers re-encode subjects
//! through Go). Exact parity needs the DER certificate (for example Envoy's XFCC `Cert=`).

use std::fmt;

/// Longest subject accepted, in bytes.
pub const MAX_SUBJECT_LEN: usize = 64 * 1024;
/// The requestheader user header kube-apiserver reads (`--requestheader-username-headers`).
pub const REMOTE_USER: &str = "x-remote-user";
/// The requestheader group header kube-apiserver reads (`--requestheader-group-headers`).
pub const REMOTE_GROUP: &str = "x-remote-group";

/// The user and groups kube-apiserver's x509 authenticator would derive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    /// The certificate's CommonName (the last CN in certificate order).
    pub user: String,
    /// Every Organization, in certificate order.
    pub groups: Vec<String>,
}

/// Why a subject could not be mapped to an identity. Every variant means: answer 401, forward
/// nothing. `at` is a byte offset into the subject (of the offending byte, or of the value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdentityError {
    /// The subject is empty.
    Empty,
    /// The subject is longer than [`MAX_SUBJECT_LEN`].
    TooLong { len: usize },
    /// Not something BoringSSL's RFC 2253 printer produces.
    Malformed { at: usize, why: &'static str },
    /// No CN, or the CN that counts is empty: kube-apiserver would not authenticate it.
    NoCommonName,
    /// A value whose decoded bytes are not UTF-8.
    NotUtf8 { at: usize },
    /// A `#` DER dump in a CN or O that is not a string we decode.
    UnsupportedDer { at: usize, why: &'static str },
    /// The user or a group contains a control byte (< 0x20 or 0x7F), which no header value
    /// can carry faithfully (and `\r`/`\n` would smuggle header syntax).
    ControlCharacter { attribute: &'static str, at: usize },
    /// The user or a group cannot cross an HTTP header unchanged: empty, or with a leading or
    /// trailing space.
    Unforwardable {
        attribute: &'static str,
        at: usize,
        why: &'static str,
    },
}

impl fmt::Display for IdentityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => f.write_str("client certificate subject is empty"),
            Self::TooLong { len } => write!(
                f,
                "client certificate subject is {len} bytes, more than {MAX_SUBJECT_LEN}"
            ),
            Self::Malformed { at, why } => {
                write!(
                    f,
                    "malformed client certificate subject at byte {at}: {why}"
                )
            }
            Self::NoCommonName => f.write_str("client certificate subject has no common name"),
            Self::NotUtf8 { at } => {
                write!(
                    f,
                    "client certificate subject value at byte {at} is not UTF-8"
                )
            }
            Self::UnsupportedDer { at, why } => {
                write!(f, "client certificate subject value at byte {at}: {why}")
            }
            Self::ControlCharacter { attribute, at } => write!(
                f,
                "client certificate {attribute} at byte {at} contains a control character"
            ),
            Self::Unforwardable { attribute, at, why } => write!(
                f,
                "client certificate {attribute} at byte {at} cannot be forwarded: {why}"
            ),
        }
    }
}

impl std::error::Error for IdentityError {}

/// One attribute value as printed: text (unescaped bytes) or a `#` dump (the DER element).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Value {
    Text(Vec<u8>),
    Der(Vec<u8>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Attribute {
    kind: String,
    value: Value,
    /// Offset of the value's first byte in the subject.
    at: usize,
}

/// Parses an RFC 2253 subject as BoringSSL prints it. RDNs (and their members) come back in
/// the order printed, which is the reverse of certificate order. Each value is decoded: escapes
/// resolved for text values; for a `#` dump, the bytes are the dumped DER element (tag, length,
/// content), not interpreted.
#[allow(clippy::type_complexity)]
pub fn parse_rfc2253(subject: &str) -> Result<Vec<Vec<(String, Vec<u8>)>>, IdentityError> {
    Ok(parse(subject)?
        .into_iter()
        .map(|rdn| {
            rdn.into_iter()
                .map(|a| {
                    let bytes = match a.value {
                        Value::Text(b) | Value::Der(b) => b,
                    };
                    (a.kind, bytes)
                })
                .collect()
        })
        .collect())
}

/// The identity kube-apiserver's x509 authenticator derives from the certificate whose subject
/// Envoy printed as `subject`: see the module docs for every rule.
pub fn identity_from_subject(subject: &str) -> Result<ClientIdentity, IdentityError> {
    let rdns = parse(subject)?;
    let mut user: Option<(String, usize)> = None;
    let mut groups: Vec<(String, usize)> = Vec::new();
    // The printed order reversed, members included, is certificate order: the order in which
    // Go's FillFromRDNSequence sees them. Each CN overwrites the previous one, so the user is
    // the LAST CN in certificate order, which is the FIRST CN printed: a certificate
    // `/CN=first/CN=second` prints `CN=second,CN=first` and kube's user is `second`.
    for attr in rdns.iter().rev().flat_map(|rdn| rdn.iter().rev()) {
        match role(&attr.kind) {
            Role::CommonName => user = Some((value_string(attr)?, attr.at)),
            Role::Organization => groups.push((value_string(attr)?, attr.at)),
            Role::Other => {
                if let Value::Text(bytes) = &attr.value {
                    // Only an invalid UTF8String prints as non-UTF-8, and Go refuses those.
                    if std::str::from_utf8(bytes).is_err() {
                        return Err(IdentityError::NotUtf8 { at: attr.at });
                    }
                }
            }
        }
    }
    let (user, user_at) = match user {
        Some((u, at)) if !u.is_empty() => (u, at),
        _ => return Err(IdentityError::NoCommonName),
    };
    check_forwardable(&user, "CN", user_at)?;
    for (group, at) in &groups {
        check_forwardable(group, "O", *at)?;
    }
    Ok(ClientIdentity {
        user,
        groups: groups.into_iter().map(|(g, _)| g).collect(),
    })
}

/// The requestheader headers that carry `identity`: the user, then one group header per group,
/// in order. The caller has removed every client-sent `X-Remote-*` header first.
pub fn remote_headers(identity: &ClientIdentity) -> Vec<(&'static str, &str)> {
    let mut out = Vec::with_capacity(identity.groups.len().saturating_add(1));
    out.push((REMOTE_USER, identity.user.as_str()));
    for group in &identity.groups {
        out.push((REMOTE_GROUP, group.as_str()));
    }
    out
}

enum Role {
    CommonName,
    Organization,
    Other,
}

/// BoringSSL prints `CN` and `O`; the long names and OIDs of the same attributes are accepted
/// too, so that no spelling of a CN or O is ever mistaken for an unrelated attribute.
fn role(kind: &str) -> Role {
    let is = |names: &[&str]| names.iter().any(|n| kind.eq_ignore_ascii_case(n));
    if is(&["CN", "commonName", "2.5.4.3"]) {
        Role::CommonName
    } else if is(&["O", "organizationName", "2.5.4.10"]) {
        Role::Organization
    } else {
        Role::Other
    }
}

/// The string value of a CN or O.
fn value_string(attr: &Attribute) -> Result<String, IdentityError> {
    match &attr.value {
        Value::Text(bytes) => {
            String::from_utf8(bytes.clone()).map_err(|_| IdentityError::NotUtf8 { at: attr.at })
        }
        Value::Der(der) => {
            der_string(der).map_err(|why| IdentityError::UnsupportedDer { at: attr.at, why })
        }
    }
}

fn check_forwardable(value: &str, attribute: &'static str, at: usize) -> Result<(), IdentityError> {
    if value.is_empty() {
        return Err(IdentityError::Unforwardable {
            attribute,
            at,
            why: "empty (kube-apiserver ignores empty header values)",
        });
    }
    if value.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return Err(IdentityError::ControlCharacter { attribute, at });
    }
    if value.starts_with(' ') || value.ends_with(' ') {
        return Err(IdentityError::Unforwardable {
            attribute,
            at,
            why: "leading or trailing space (HTTP trims header values)",
        });
    }
    Ok(())
}

const DER_UTF8_STRING: u8 = 0x0c;
const DER_PRINTABLE_STRING: u8 = 0x13;
const DER_IA5_STRING: u8 = 0x16;

/// Decodes one DER UTF8String, PrintableString or IA5String element, validating its content
/// the way Go's `parseASN1String` does.
fn der_string(der: &[u8]) -> Result<String, &'static str> {
    let (&tag, rest) = der.split_first().ok_or("empty DER dump")?;
    let (len, content) = match rest.split_first() {
        Some((&l, tail)) if l < 0x80 => (usize::from(l), tail),
        Some((&0x81, tail)) => match tail.split_first() {
            Some((&l, tail)) if l >= 0x80 => (usize::from(l), tail),
            _ => return Err("invalid DER length"),
        },
        Some((&0x82, tail)) => match tail {
            [hi, lo, tail @ ..] if *hi != 0 => ((usize::from(*hi) << 8) | usize::from(*lo), tail),
            _ => return Err("invalid DER length"),
        },
        _ => return Err("invalid or unsupported DER length"),
    };
    if content.len() != len {
        return Err("DER length does not match the dump");
    }
    match tag {
        DER_UTF8_STRING => String::from_utf8(content.to_vec()).map_err(|_| "invalid UTF8String"),
        DER_PRINTABLE_STRING if content.iter().all(|&b| is_go_printable(b)) => {
            Ok(content.iter().map(|&b| char::from(b)).collect())
        }
        DER_PRINTABLE_STRING => Err("invalid PrintableString"),
        DER_IA5_STRING if content.is_ascii() => {
            Ok(content.iter().map(|&b| char::from(b)).collect())
        }
        DER_IA5_STRING => Err("invalid IA5String"),
        _ => Err("DER dump is not a UTF8String, PrintableString or IA5String"),
    }
}

/// Go's `isPrintable` (crypto/x509): PrintableString plus the `*` and `&` Go tolerates.
fn is_go_printable(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b' ' | b'\'' | b'(' | b')' | b'+' | b',' | b'-' | b'.' | b'/' | b':' | b'=' | b'?'
        )
        || b == b'*'
        || b == b'&'
}

fn malformed(at: usize, why: &'static str) -> IdentityError {
    IdentityError::Malformed { at, why }
}

/// Characters of an attribute type: BoringSSL short names (letters, digits, `-`, `_`) and
/// dotted OIDs.
fn is_type_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_')
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'A'..=b'F' => Some(b - b'A' + 10),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    }
}

fn parse(subject: &str) -> Result<Vec<Vec<Attribute>>, IdentityError> {
    let b = subject.as_bytes();
    if b.is_empty() {
        return Err(IdentityError::Empty);
    }
    if b.len() > MAX_SUBJECT_LEN {
        return Err(IdentityError::TooLong { len: b.len() });
    }
    let mut rdns = Vec::new();
    let mut rdn = Vec::new();
    let mut i = 0;
    loop {
        let start = i;
        while b.get(i).copied().is_some_and(is_type_byte) {
            i += 1;
        }
        if i == start {
            return Err(malformed(i, "expected an attribute type"));
        }
        if b.get(i) != Some(&b'=') {
            return Err(malformed(i, "expected '=' after the attribute type"));
        }
        let kind = subject.get(start..i).unwrap_or_default().to_owned();
        i += 1;
        let at = i;
        let (value, end) = if b.get(i) == Some(&b'#') {
            parse_hex(b, i + 1)?
        } else {
            parse_text(b, i)?
        };
        i = end;
        rdn.push(Attribute { kind, value, at });
        match b.get(i) {
            None => {
                rdns.push(rdn);
                return Ok(rdns);
            }
            Some(b',') => rdns.push(std::mem::take(&mut rdn)),
            Some(b'+') => {}
            Some(_) => return Err(malformed(i, "expected ',' or '+' after a value")),
        }
        i += 1;
    }
}

/// A `#` dump from `i` (just after the `#`) to the next `,`, `+` or the end.
fn parse_hex(b: &[u8], mut i: usize) -> Result<(Value, usize), IdentityError> {
    let mut der = Vec::new();
    loop {
        match b.get(i) {
            None | Some(b',') | Some(b'+') => break,
            Some(&hi) => {
                let hi =
                    hex_value(hi).ok_or_else(|| malformed(i, "non-hex digit in a '#' dump"))?;
                let lo = b
                    .get(i + 1)
                    .copied()
                    .and_then(hex_value)
                    .ok_or_else(|| malformed(i + 1, "odd or non-hex digit in a '#' dump"))?;
                der.push((hi << 4) | lo);
                i += 2;
            }
        }
    }
    if der.is_empty() {
        // OpenSSL prints a one-character "#" value this way; BoringSSL escapes it (`\#`).
        return Err(malformed(i, "'#' without hex digits"));
    }
    Ok((Value::Der(der), i))
}

/// A text value from `i` to the next unescaped `,`, `+` or the end.
fn parse_text(b: &[u8], mut i: usize) -> Result<(Value, usize), IdentityError> {
    let mut out = Vec::new();
    let mut trailing_space = false;
    if b.get(i) == Some(&b' ') {
        return Err(malformed(i, "unescaped leading space"));
    }
    loop {
        match b.get(i) {
            None | Some(b',') | Some(b'+') => break,
            Some(b'\\') => {
                trailing_space = false;
                match b.get(i + 1) {
                    None => return Err(malformed(i, "backslash at the end of the subject")),
                    Some(
                        &c @ (b',' | b'+' | b'"' | b'\\' | b'<' | b'>' | b';' | b'#' | b' ' | b'='),
                    ) => {
                        out.push(c);
                        i += 2;
                    }
                    Some(&hi) => {
                        let byte = hex_value(hi)
                            .zip(b.get(i + 2).copied().and_then(hex_value))
                            .map(|(hi, lo)| (hi << 4) | lo)
                            .ok_or_else(|| {
                                malformed(i, "backslash not followed by a special character or two hex digits")
                            })?;
                        out.push(byte);
                        i += 3;
                    }
                }
            }
            Some(b'"' | b'<' | b'>' | b';') => {
                return Err(malformed(i, "unescaped special character"));
            }
            Some(&c) if (0x20..0x7f).contains(&c) => {
                trailing_space = c == b' ';
                out.push(c);
                i += 1;
            }
            Some(_) => return Err(malformed(i, "raw control or non-ASCII byte")),
        }
    }
    if trailing_space {
        return Err(malformed(i.saturating_sub(1), "unescaped trailing space"));
    }
    Ok((Value::Text(out), i))
}

#[cfg(test)]
mod tests {
    use super::*;

    type Want = Result<(&'static str, &'static [&'static str]), IdentityError>;

    fn check(subject: &str, want: &Want) {
        let want = want.clone().map(|(user, groups)| ClientIdentity {
            user: user.to_owned(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        });
        assert_eq!(identity_from_subject(subject), want, "subject {subject:?}");
    }

    /// Real certificates: `openssl req -x509 -subj SUBJ` (OpenSSL 3.0.19; `+` makes a
    /// multi-valued RDN), printed by `openssl x509 -noout -subject -nameopt RFC2253` AND by
    /// Envoy 1.40.0/BoringSSL (`%DOWNSTREAM_PEER_SUBJECT%` with the certificate presented as a
    /// client certificate). Both printers gave the same string except where `openssl` is set.
    /// Rows marked "python" were built with python `cryptography` (string types openssl req
    /// cannot choose, some bytes patched into the DER afterwards) and printed the same way.
    struct Real {
        subj: &'static str,
        boringssl: &'static str,
        openssl: Option<&'static str>,
        want: Want,
    }

    const REAL: &[Real] = &[
        Real {
            subj: "/CN=alice",
            boringssl: "CN=alice",
            openssl: None,
            want: Ok(("alice", &[])),
        },
        Real {
            subj: "/CN=alice/O=system:masters",
            boringssl: "O=system:masters,CN=alice",
            openssl: None,
            want: Ok(("alice", &["system:masters"])),
        },
        Real {
            subj: "/O=a/O=b/CN=u",
            boringssl: "CN=u,O=b,O=a",
            openssl: None,
            want: Ok(("u", &["a", "b"])),
        },
        // DER SET order {CN=u, O=g}: members print reversed too.
        Real {
            subj: "/CN=u+O=g",
            boringssl: "O=g+CN=u",
            openssl: None,
            want: Ok(("u", &["g"])),
        },
        // DER sorts the SET: {O=a, O=b} whatever the -subj order.
        Real {
            subj: "/O=b+O=a/CN=u",
            boringssl: "CN=u,O=b+O=a",
            openssl: None,
            want: Ok(("u", &["a", "b"])),
        },
        // DER: {CN=a, O=g1, O=g2}, {O=g0}; Go's Organization is [g1, g2, g0].
        Real {
            subj: "/CN=a+O=g2+O=g1/O=g0",
            boringssl: "O=g0,O=g2+O=g1+CN=a",
            openssl: None,
            want: Ok(("a", &["g1", "g2", "g0"])),
        },
        Real {
            subj: "/CN=Smith, John",
            boringssl: "CN=Smith\\, John",
            openssl: None,
            want: Ok(("Smith, John", &[])),
        },
        Real {
            subj: "/CN=a\\+b\"c\\\\d<e>f;g=h",
            boringssl: "CN=a\\+b\\\"c\\\\d\\<e\\>f\\;g=h",
            openssl: None,
            want: Ok(("a+b\"c\\d<e>f;g=h", &[])),
        },
        Real {
            subj: "/O=g/CN=a, b\\+c",
            boringssl: "CN=a\\, b\\+c,O=g",
            openssl: None,
            want: Ok(("a, b+c", &["g"])),
        },
        Real {
            subj: "/CN=#hash",
            boringssl: "CN=\\#hash",
            openssl: None,
            want: Ok(("#hash", &[])),
        },
        Real {
            subj: "/CN=a#b/O=x y",
            boringssl: "O=x y,CN=a#b",
            openssl: None,
            want: Ok(("a#b", &["x y"])),
        },
        // Escaped leading and trailing spaces decode, but HTTP would trim them: refused.
        Real {
            subj: "/CN= lead and trail ",
            boringssl: "CN=\\ lead and trail\\ ",
            openssl: None,
            want: Err(IdentityError::Unforwardable {
                attribute: "CN",
                at: 3,
                why: "leading or trailing space (HTTP trims header values)",
            }),
        },
        Real {
            subj: "/CN= # ",
            boringssl: "CN=\\ #\\ ",
            openssl: None,
            want: Err(IdentityError::Unforwardable {
                attribute: "CN",
                at: 3,
                why: "leading or trailing space (HTTP trims header values)",
            }),
        },
        Real {
            subj: "/CN= ",
            boringssl: "CN=\\ ",
            openssl: None,
            want: Err(IdentityError::Unforwardable {
                attribute: "CN",
                at: 3,
                why: "leading or trailing space (HTTP trims header values)",
            }),
        },
        // The one difference measured: OpenSSL 3.0 does not escape a lone '#'.
        Real {
            subj: "/CN=#",
            boringssl: "CN=\\#",
            openssl: Some("CN=#"),
            want: Ok(("#", &[])),
        },
        Real {
            subj: "/CN=café (-utf8)",
            boringssl: "CN=caf\\C3\\A9",
            openssl: None,
            want: Ok(("café", &[])),
        },
        // Last CN in certificate order wins: the first printed.
        Real {
            subj: "/CN=first/CN=second",
            boringssl: "CN=second,CN=first",
            openssl: None,
            want: Ok(("second", &[])),
        },
        Real {
            subj: "/O=x",
            boringssl: "O=x",
            openssl: None,
            want: Err(IdentityError::NoCommonName),
        },
        Real {
            subj: "/CN=a<LF>b",
            boringssl: "CN=a\\0Ab",
            openssl: None,
            want: Err(IdentityError::ControlCharacter {
                attribute: "CN",
                at: 3,
            }),
        },
        Real {
            subj: "/CN=a<DEL>b",
            boringssl: "CN=a\\7Fb",
            openssl: None,
            want: Err(IdentityError::ControlCharacter {
                attribute: "CN",
                at: 3,
            }),
        },
        Real {
            subj: "/CN=a<0x01>b<0x1F>c",
            boringssl: "CN=a\\01b\\1Fc",
            openssl: None,
            want: Err(IdentityError::ControlCharacter {
                attribute: "CN",
                at: 3,
            }),
        },
        Real {
            subj: "/DC=com/DC=example/OU=team/CN=y/emailAddress=y@example.com",
            boringssl: "emailAddress=y@example.com,CN=y,OU=team,DC=example,DC=com",
            openssl: None,
            want: Ok(("y", &[])),
        },
        Real {
            subj: "/C=US/ST=CA/L=SF/O=Acme/OU=Eng/CN=bob",
            boringssl: "CN=bob,OU=Eng,O=Acme,L=SF,ST=CA,C=US",
            openssl: None,
            want: Ok(("bob", &["Acme"])),
        },
        Real {
            subj: "/CN=system:node:n1/O=system:nodes",
            boringssl: "O=system:nodes,CN=system:node:n1",
            openssl: None,
            want: Ok(("system:node:n1", &["system:nodes"])),
        },
        Real {
            subj: "python: 1.2.3.4 UTF8String \"abc\", then CN=x",
            boringssl: "CN=x,1.2.3.4=#0C03616263",
            openssl: None,
            want: Ok(("x", &[])),
        },
        // OpenSSL 3.0 refuses to load these two; BoringSSL accepts and dumps the OCTET STRING.
        Real {
            subj: "python: 1.2.3.4 OCTET STRING \"ABC\", then CN=x",
            boringssl: "CN=x,1.2.3.4=#0403414243",
            openssl: None,
            want: Ok(("x", &[])),
        },
        Real {
            subj: "python: CN OCTET STRING \"ABC\", then CN=y",
            boringssl: "CN=y,CN=#0403414243",
            openssl: None,
            want: Err(IdentityError::UnsupportedDer {
                at: 8,
                why: "DER dump is not a UTF8String, PrintableString or IA5String",
            }),
        },
        // kube's user-UID attribute is unknown to BoringSSL (not mapped here).
        Real {
            subj: "python: 1.3.6.1.4.1.57683.2=uid-1, then CN=x",
            boringssl: "CN=x,1.3.6.1.4.1.57683.2=#0C057569642D31",
            openssl: None,
            want: Ok(("x", &[])),
        },
        // Converted to UTF-8 by the printer, exactly as Go decodes them.
        Real {
            subj: "python: CN BMPString 日本",
            boringssl: "CN=\\E6\\97\\A5\\E6\\9C\\AC",
            openssl: None,
            want: Ok(("日本", &[])),
        },
        Real {
            subj: "python: CN UniversalString a😀",
            boringssl: "CN=a\\F0\\9F\\98\\80",
            openssl: None,
            want: Ok(("a😀", &[])),
        },
        // T61String bytes C3 A9 are Latin-1 "Ã©" to BoringSSL and to Go alike.
        Real {
            subj: "python: CN T61String bytes caf C3 A9",
            boringssl: "CN=caf\\C3\\83\\C2\\A9",
            openssl: None,
            want: Ok(("cafÃ©", &[])),
        },
        Real {
            subj: "python: CN PrintableString alice, O PrintableString sys:m",
            boringssl: "O=sys:m,CN=alice",
            openssl: None,
            want: Ok(("alice", &["sys:m"])),
        },
        Real {
            subj: "python: CN UTF8String a<NUL>b",
            boringssl: "CN=a\\00b",
            openssl: None,
            want: Err(IdentityError::ControlCharacter {
                attribute: "CN",
                at: 3,
            }),
        },
        // Go strips a BMPString's NUL terminator; we refuse rather than strip.
        Real {
            subj: "python: O BMPString a<NUL>, then CN=alice",
            boringssl: "CN=alice,O=a\\00",
            openssl: None,
            want: Err(IdentityError::ControlCharacter {
                attribute: "O",
                at: 11,
            }),
        },
        // Known limit: VisibleString prints as text (Go would skip this CN): see module docs.
        Real {
            subj: "python: CN VisibleString vis, then CN=z",
            boringssl: "CN=z,CN=vis",
            openssl: None,
            want: Ok(("z", &[])),
        },
    ];

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn identity_of_real_certificates() {
        for case in REAL {
            check(case.boringssl, &case.want);
            if let Some(openssl) = case.openssl {
                // The OpenSSL-only form is refused, never guessed.
                assert!(
                    matches!(
                        identity_from_subject(openssl),
                        Err(IdentityError::Malformed { at, .. }) if at == openssl.len()
                    ),
                    "{}: {openssl:?}",
                    case.subj
                );
            }
        }
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn identity_of_synthetic_subjects() {
        let cases: &[(&str, Want)] = &[
            ("CN=alice", Ok(("alice", &[]))),
            (
                "O=system:masters,CN=alice",
                Ok(("alice", &["system:masters"])),
            ),
            ("CN=u,O=b,O=a", Ok(("u", &["a", "b"]))),
            ("CN=u+O=g", Ok(("u", &["g"]))),
            ("O=g2+O=g1,CN=u", Ok(("u", &["g1", "g2"]))),
            ("CN=Smith\\, John", Ok(("Smith, John", &[]))),
            ("CN=a\\+b", Ok(("a+b", &[]))),
            ("CN=\\\"q\\\"", Ok(("\"q\"", &[]))),
            ("CN=back\\\\slash", Ok(("back\\slash", &[]))),
            ("CN=\\#x", Ok(("#x", &[]))),
            ("CN=x\\#", Ok(("x#", &[]))),
            ("CN=a=b", Ok(("a=b", &[]))),
            ("CN==a", Ok(("=a", &[]))),
            ("CN=caf\\C3\\A9", Ok(("café", &[]))),
            ("CN=caf\\c3\\a9", Ok(("café", &[]))),
            ("CN=\\41\\=", Ok(("A=", &[]))),
            ("CN=#0C05616C696365", Ok(("alice", &[]))),
            ("CN=#1305616C696365", Ok(("alice", &[]))),
            ("CN=#1605616C696365", Ok(("alice", &[]))),
            ("CN=#0c05616c696365", Ok(("alice", &[]))),
            ("O=#0C0167,CN=u", Ok(("u", &["g"]))),
            ("1.2.3.4=#0403414243,CN=x", Ok(("x", &[]))),
            ("CN=x,1.2.3.4=#0403414243", Ok(("x", &[]))),
            ("2.5.4.3=#0C0161", Ok(("a", &[]))),
            ("commonName=a,organizationName=g", Ok(("a", &["g"]))),
            ("cn=a,o=g", Ok(("a", &["g"]))),
            ("CN=second,CN=first", Ok(("second", &[]))),
            ("O=g+CN=second+CN=first", Ok(("second", &["g"]))),
            ("CN=x,OU=team,L=", Ok(("x", &[]))),
            // The CN that counts is empty: kube answers 401.
            ("CN=,CN=first", Err(IdentityError::NoCommonName)),
            ("CN=x,CN=", Ok(("x", &[]))),
            ("O=a", Err(IdentityError::NoCommonName)),
            ("OU=a,C=US", Err(IdentityError::NoCommonName)),
            ("CN=", Err(IdentityError::NoCommonName)),
            ("", Err(IdentityError::Empty)),
            (
                "CN=a\\0Ab",
                Err(IdentityError::ControlCharacter {
                    attribute: "CN",
                    at: 3,
                }),
            ),
            (
                "CN=a\\0Db",
                Err(IdentityError::ControlCharacter {
                    attribute: "CN",
                    at: 3,
                }),
            ),
            (
                "CN=a\\00",
                Err(IdentityError::ControlCharacter {
                    attribute: "CN",
                    at: 3,
                }),
            ),
            (
                "CN=a\\09b",
                Err(IdentityError::ControlCharacter {
                    attribute: "CN",
                    at: 3,
                }),
            ),
            (
                "O=x\\0Ay,CN=u",
                Err(IdentityError::ControlCharacter {
                    attribute: "O",
                    at: 2,
                }),
            ),
            (
                "CN=#0C03610A62",
                Err(IdentityError::ControlCharacter {
                    attribute: "CN",
                    at: 3,
                }),
            ),
            (
                "O=,CN=u",
                Err(IdentityError::Unforwardable {
                    attribute: "O",
                    at: 2,
                    why: "empty (kube-apiserver ignores empty header values)",
                }),
            ),
            (
                "CN=u\\ ",
                Err(IdentityError::Unforwardable {
                    attribute: "CN",
                    at: 3,
                    why: "leading or trailing space (HTTP trims header values)",
                }),
            ),
            // Decoded bytes that are not UTF-8: truncated sequence, lone continuation, overlong.
            ("CN=a\\C3", Err(IdentityError::NotUtf8 { at: 3 })),
            ("CN=\\A9", Err(IdentityError::NotUtf8 { at: 3 })),
            ("CN=\\C0\\AF", Err(IdentityError::NotUtf8 { at: 3 })),
            ("OU=\\FF,CN=x", Err(IdentityError::NotUtf8 { at: 3 })),
            ("O=\\FF,CN=x", Err(IdentityError::NotUtf8 { at: 2 })),
            // A CN of an unknown OID's value does not matter.
            ("CN=x,1.2.3.4=#FF", Ok(("x", &[]))),
        ];
        for (subject, want) in cases {
            check(subject, want);
        }
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn refuses_der_dumps_we_do_not_decode() {
        let unsupported = |at, why| Err(IdentityError::UnsupportedDer { at, why });
        let cases: &[(&str, Want)] = &[
            (
                "CN=#0403414243",
                unsupported(
                    3,
                    "DER dump is not a UTF8String, PrintableString or IA5String",
                ),
            ),
            (
                "CN=#1403414243",
                unsupported(
                    3,
                    "DER dump is not a UTF8String, PrintableString or IA5String",
                ),
            ),
            (
                "CN=#1E0400610062",
                unsupported(
                    3,
                    "DER dump is not a UTF8String, PrintableString or IA5String",
                ),
            ),
            (
                "CN=#2C03414243",
                unsupported(
                    3,
                    "DER dump is not a UTF8String, PrintableString or IA5String",
                ),
            ),
            (
                "O=#0403414243,CN=x",
                unsupported(
                    2,
                    "DER dump is not a UTF8String, PrintableString or IA5String",
                ),
            ),
            (
                "CN=#0C",
                unsupported(3, "invalid or unsupported DER length"),
            ),
            (
                "CN=#0C0161FF",
                unsupported(3, "DER length does not match the dump"),
            ),
            (
                "CN=#0C0261",
                unsupported(3, "DER length does not match the dump"),
            ),
            ("CN=#0C8101FF", unsupported(3, "invalid DER length")),
            ("CN=#0C820001FF", unsupported(3, "invalid DER length")),
            (
                "CN=#0C80",
                unsupported(3, "invalid or unsupported DER length"),
            ),
            (
                "CN=#0C830000",
                unsupported(3, "invalid or unsupported DER length"),
            ),
            ("CN=#0C02C328", unsupported(3, "invalid UTF8String")),
            (
                "CN=#130161@",
                Err(IdentityError::Malformed {
                    at: 10,
                    why: "non-hex digit in a '#' dump",
                }),
            ),
            ("CN=#130140", unsupported(3, "invalid PrintableString")),
            ("CN=#1601E9", unsupported(3, "invalid IA5String")),
            ("CN=#13012A", Ok(("*", &[]))),
        ];
        for (subject, want) in cases {
            check(subject, want);
        }
        // Long-form lengths.
        let long = "a".repeat(200);
        let hex: String = long.bytes().map(|b| format!("{b:02X}")).collect();
        assert_eq!(
            identity_from_subject(&format!("CN=#0C81C8{hex}")).map(|id| id.user),
            Ok(long)
        );
        let longer = "b".repeat(300);
        let hex: String = longer.bytes().map(|b| format!("{b:02X}")).collect();
        assert_eq!(
            identity_from_subject(&format!("CN=#0C82012C{hex}")).map(|id| id.user),
            Ok(longer)
        );
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn refuses_malformed_subjects() {
        let cases: &[(&str, usize, &str)] = &[
            ("CN", 2, "expected '=' after the attribute type"),
            ("=x", 0, "expected an attribute type"),
            ("CN=a,", 5, "expected an attribute type"),
            ("CN=a+", 5, "expected an attribute type"),
            (",CN=a", 0, "expected an attribute type"),
            ("CN=a,,O=b", 5, "expected an attribute type"),
            ("CN=a\\", 4, "backslash at the end of the subject"),
            (
                "CN=a\\G1",
                4,
                "backslash not followed by a special character or two hex digits",
            ),
            (
                "CN=a\\C",
                4,
                "backslash not followed by a special character or two hex digits",
            ),
            (
                "CN=a\\U00E9",
                4,
                "backslash not followed by a special character or two hex digits",
            ),
            (
                "CN=a\\W0001F600",
                4,
                "backslash not followed by a special character or two hex digits",
            ),
            (
                "CN=a\\n",
                4,
                "backslash not followed by a special character or two hex digits",
            ),
            ("CN=a\"b\"", 4, "unescaped special character"),
            ("CN=a;O=b", 4, "unescaped special character"),
            ("CN=<a>", 3, "unescaped special character"),
            ("CN= a", 3, "unescaped leading space"),
            ("CN=a ", 4, "unescaped trailing space"),
            ("CN=a ,O=b", 4, "unescaped trailing space"),
            ("CN=a, O=b", 5, "expected an attribute type"),
            ("CN = a", 2, "expected '=' after the attribute type"),
            ("CN=a\nb", 4, "raw control or non-ASCII byte"),
            ("CN=a\u{7f}", 4, "raw control or non-ASCII byte"),
            ("CN=café", 6, "raw control or non-ASCII byte"),
            ("CN=a\0", 4, "raw control or non-ASCII byte"),
            ("CN=#", 4, "'#' without hex digits"),
            ("CN=#,O=x", 4, "'#' without hex digits"),
            ("CN=#0", 5, "odd or non-hex digit in a '#' dump"),
            ("CN=#0G", 5, "odd or non-hex digit in a '#' dump"),
            ("CN=#0C0161 ", 10, "non-hex digit in a '#' dump"),
            ("CN=#xyz", 4, "non-hex digit in a '#' dump"),
            ("C N=a", 1, "expected '=' after the attribute type"),
            ("CN=a=b=c,=", 9, "expected an attribute type"),
        ];
        for (subject, at, why) in cases {
            let want = IdentityError::Malformed { at: *at, why };
            assert_eq!(
                identity_from_subject(subject),
                Err(want.clone()),
                "subject {subject:?}"
            );
            assert_eq!(parse_rfc2253(subject), Err(want), "subject {subject:?}");
        }
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn parses_rdn_structure_in_printed_order() {
        type Rdns = &'static [&'static [(&'static str, &'static [u8])]];
        let cases: &[(&str, Rdns)] = &[
            ("CN=alice", &[&[("CN", b"alice")]]),
            (
                "O=g+CN=u,C=US",
                &[&[("O", b"g"), ("CN", b"u")], &[("C", b"US")]],
            ),
            ("CN=a\\,b\\+c", &[&[("CN", b"a,b+c")]]),
            ("CN=caf\\C3\\A9", &[&[("CN", b"caf\xc3\xa9")]]),
            ("CN=a\\00b", &[&[("CN", b"a\0b")]]),
            ("CN=\\FF", &[&[("CN", b"\xff")]]),
            (
                "1.2.3.4=#0403414243,CN=x",
                &[&[("1.2.3.4", b"\x04\x03ABC")], &[("CN", b"x")]],
            ),
            ("CN=,O=", &[&[("CN", b"")], &[("O", b"")]]),
            ("CN=+O=", &[&[("CN", b""), ("O", b"")]]),
            (
                "emailAddress=y@example.com",
                &[&[("emailAddress", b"y@example.com")]],
            ),
        ];
        for (subject, want) in cases {
            let want: Vec<Vec<(String, Vec<u8>)>> = want
                .iter()
                .map(|rdn| {
                    rdn.iter()
                        .map(|(k, v)| ((*k).to_owned(), v.to_vec()))
                        .collect()
                })
                .collect();
            assert_eq!(parse_rfc2253(subject), Ok(want), "subject {subject:?}");
        }
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn bounds_the_subject_length() {
        let at_limit = format!("CN={}", "a".repeat(MAX_SUBJECT_LEN - 3));
        assert_eq!(at_limit.len(), MAX_SUBJECT_LEN);
        assert_eq!(
            identity_from_subject(&at_limit).map(|id| id.user.len()),
            Ok(MAX_SUBJECT_LEN - 3)
        );
        let over = format!("{at_limit}a");
        assert_eq!(
            identity_from_subject(&over),
            Err(IdentityError::TooLong {
                len: MAX_SUBJECT_LEN + 1
            })
        );
        assert_eq!(
            parse_rfc2253(&over),
            Err(IdentityError::TooLong {
                len: MAX_SUBJECT_LEN + 1
            })
        );
        // Worst case expansion: every byte escaped.
        let escaped = format!("CN={}", "\\2C".repeat((MAX_SUBJECT_LEN - 3) / 3));
        assert_eq!(
            identity_from_subject(&escaped).map(|id| id.user.len()),
            Ok((MAX_SUBJECT_LEN - 3) / 3)
        );
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn remote_headers_carry_user_then_groups_in_order() {
        let id = identity_from_subject("CN=u,O=b,O=a,O=b").unwrap();
        assert_eq!(
            remote_headers(&id),
            vec![
                ("x-remote-user", "u"),
                ("x-remote-group", "b"),
                ("x-remote-group", "a"),
                ("x-remote-group", "b"),
            ]
        );
        let id = identity_from_subject("CN=alice").unwrap();
        assert_eq!(remote_headers(&id), vec![("x-remote-user", "alice")]);
        assert!(remote_headers(&id)
            .iter()
            .all(|(n, _)| crate::hygiene::is_forbidden_request_header(n)));
        assert_eq!(
            IdentityError::ControlCharacter {
                attribute: "CN",
                at: 3
            }
            .to_string(),
            "client certificate CN at byte 3 contains a control character"
        );
    }

    /// xorshift64*: deterministic, no dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
        fn pick(&mut self, items: &[&'static str]) -> &'static str {
            items[self.below(items.len())]
        }
    }

    fn assert_sane(subject: &str) {
        let parsed = parse_rfc2253(subject);
        let identity = identity_from_subject(subject);
        if let Ok(id) = &identity {
            assert!(parsed.is_ok(), "{subject:?}");
            for value in std::iter::once(&id.user).chain(&id.groups) {
                assert!(!value.is_empty(), "{subject:?}");
                assert!(!value.bytes().any(|b| b < 0x20 || b == 0x7f), "{subject:?}");
                assert!(
                    !value.starts_with(' ') && !value.ends_with(' '),
                    "{subject:?}"
                );
            }
            assert_eq!(remote_headers(id).len(), id.groups.len() + 1);
        }
        let _ = identity.map_err(|e| e.to_string());
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn hostile_subjects_never_panic() {
        const TOKENS: &[&str] = &[
            "CN",
            "O",
            "OU",
            "1.2.3.4",
            "=",
            "==",
            ",",
            "+",
            "\\",
            "\\\\",
            "\\,",
            "\\+",
            "\\#",
            "\\ ",
            "#",
            "#0C",
            "#0C03616263",
            "#04",
            "#0C81",
            "#0C82FFFF",
            "#1E",
            "\\C3",
            "\\A9",
            "\\C3\\A9",
            "\\0A",
            "\\0D",
            "\\00",
            "\\7F",
            "\\FF",
            "\\G",
            "\\U00E9",
            " ",
            "  ",
            "\"",
            ";",
            "<",
            ">",
            "a",
            "alice",
            "system:masters",
            "é",
            "\u{0}",
            "\n",
            "\r\n",
            "\u{7f}",
            "0",
            "F",
            "ZZ",
        ];
        let mut rng = Rng(0x5EED_1DE7_1717_0005);
        for _ in 0..5_000 {
            let mut s = String::new();
            let n = rng.below(40);
            for _ in 0..n {
                if rng.below(8) == 0 {
                    // An arbitrary char, including non-ASCII ones.
                    s.push(char::from_u32(rng.below(0x3000) as u32).unwrap_or('?'));
                } else {
                    s.push_str(rng.pick(TOKENS));
                }
            }
            assert_sane(&s);
            // The same string with a plausible head, so the parser gets past the first type.
            assert_sane(&format!("CN=x,{s}"));
        }
    }

    /// BoringSSL's `do_esc_char` with `ASN1_STRFLGS_RFC2253`, for UTF-8 bytes.
    fn print_value(value: &[u8]) -> String {
        let mut out = String::new();
        for (i, &c) in value.iter().enumerate() {
            let (first, last) = (i == 0, i + 1 == value.len());
            if !(0x20..0x7f).contains(&c) {
                out.push_str(&format!("\\{c:02X}"));
            } else if matches!(c, b'\\' | b'"' | b',' | b'+' | b'<' | b'>' | b';')
                || (first && (c == b' ' || c == b'#'))
                || (last && c == b' ')
            {
                out.push('\\');
                out.push(char::from(c));
            } else {
                out.push(char::from(c));
            }
        }
        out
    }

    /// Random certificates, printed the way BoringSSL prints them, must map to exactly what Go's
    /// FillFromRDNSequence + CommonNameUserConversion derive (modulo our refusals).
    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn random_certificates_map_like_kube() {
        const PIECES: &[&str] = &[
            "a", "b", "z", "0", ":", " ", ",", "+", "\"", "\\", "#", "<", ">", ";", "=", "é", "日",
            "😀", "\n", "\0", "\u{7f}", "system:", "masters",
        ];
        const KINDS: &[&str] = &["CN", "O", "O", "OU", "C", "1.2.3.4"];
        let mut rng = Rng(0x0BAD_C0DE_2253_0001);
        for _ in 0..3_000 {
            // Certificate order: RDNs, each with 1..=3 members.
            let mut cert: Vec<Vec<(&str, String)>> = Vec::new();
            for _ in 0..1 + rng.below(5) {
                let mut rdn = Vec::new();
                for _ in 0..1 + rng.below(3) {
                    let mut v = String::new();
                    for _ in 0..rng.below(6) {
                        v.push_str(rng.pick(PIECES));
                    }
                    rdn.push((rng.pick(KINDS), v));
                }
                cert.push(rdn);
            }
            let printed: Vec<String> = cert
                .iter()
                .rev()
                .map(|rdn| {
                    rdn.iter()
                        .rev()
                        .map(|(k, v)| {
                            if k.starts_with('1') {
                                let der: String = [0x0c, v.len() as u8]
                                    .iter()
                                    .chain(v.as_bytes())
                                    .map(|b| format!("{b:02X}"))
                                    .collect();
                                format!("{k}=#{der}")
                            } else {
                                format!("{k}={}", print_value(v.as_bytes()))
                            }
                        })
                        .collect::<Vec<_>>()
                        .join("+")
                })
                .collect();
            let subject = printed.join(",");

            // Go: walk certificate order; CN overwrites, O appends.
            let mut user: Option<&str> = None;
            let mut groups: Vec<&str> = Vec::new();
            for (kind, value) in cert.iter().flatten() {
                match *kind {
                    "CN" => user = Some(value),
                    "O" => groups.push(value),
                    _ => {}
                }
            }
            let bad = |v: &str| {
                v.is_empty()
                    || v.bytes().any(|b| b < 0x20 || b == 0x7f)
                    || v.starts_with(' ')
                    || v.ends_with(' ')
            };
            let got = identity_from_subject(&subject);
            match user {
                None | Some("") => assert_eq!(got, Err(IdentityError::NoCommonName), "{subject:?}"),
                Some(u) if bad(u) || groups.iter().any(|g| bad(g)) => {
                    assert!(
                        matches!(
                            got,
                            Err(IdentityError::ControlCharacter { .. }
                                | IdentityError::Unforwardable { .. })
                        ),
                        "{subject:?} -> {got:?}"
                    );
                }
                Some(u) => {
                    let want = ClientIdentity {
                        user: u.to_owned(),
                        groups: groups.iter().map(|g| (*g).to_owned()).collect(),
                    };
                    assert_eq!(got, Ok(want), "{subject:?}");
                }
            }
        }
    }
}
