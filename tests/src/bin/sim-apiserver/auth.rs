//! Authentication like kube-apiserver's chain (`pkg/kubeapiserver/authenticator`): a union of
//! requestheader (front-proxy), x509 client certificates and static bearer tokens, first
//! success wins; `system:authenticated` is added to whoever authenticated; anonymous only when
//! nothing failed. An authenticator that fails (a certificate that does not verify, an unknown
//! token) makes the whole request 401 unless a later one succeeds, exactly like kube's
//! `union.NewFailOnError(union(...), anonymous)`.
//!
//! The TLS handshake accepts any client certificate (Go's `tls.RequestClientCert`, see
//! `tls.rs`); each authenticator verifies the presented chain against its own CA here, so a
//! certificate of the front-proxy CA is never a user certificate and vice versa.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use axum::http::HeaderMap;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::ClientCertVerifier;
use serde_json::{json, Value};

use crate::tls::{self, ConnInfo};

pub const ANONYMOUS: &str = "system:anonymous";
pub const UNAUTHENTICATED: &str = "system:unauthenticated";
pub const AUTHENTICATED: &str = "system:authenticated";

/// Which authenticator produced the identity (the `x-sim-authenticator` header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    RequestHeader,
    X509,
    Token,
    Anonymous,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::RequestHeader => "requestheader",
            Method::X509 => "x509",
            Method::Token => "token",
            Method::Anonymous => "anonymous",
        }
    }
}

/// kube's `user.Info` plus the authenticator that produced it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
    pub method: Method,
}

impl UserInfo {
    fn new(name: &str, uid: &str, groups: Vec<String>, method: Method) -> UserInfo {
        UserInfo {
            name: name.to_string(),
            uid: uid.to_string(),
            groups,
            extra: BTreeMap::new(),
            method,
        }
    }

    pub fn anonymous() -> UserInfo {
        UserInfo::new(
            ANONYMOUS,
            "",
            vec![UNAUTHENTICATED.to_string()],
            Method::Anonymous,
        )
    }

    /// kube's `isAnonymousUser`: `system:anonymous` in `system:unauthenticated`.
    pub fn is_anonymous(&self) -> bool {
        self.name == ANONYMOUS && self.groups.iter().any(|g| g == UNAUTHENTICATED)
    }

    /// kube's `authenticationv1.UserInfo` JSON (every field `omitempty`).
    pub fn to_json(&self) -> Value {
        let mut m = serde_json::Map::new();
        if !self.name.is_empty() {
            m.insert("username".into(), json!(self.name));
        }
        if !self.uid.is_empty() {
            m.insert("uid".into(), json!(self.uid));
        }
        if !self.groups.is_empty() {
            m.insert("groups".into(), json!(self.groups));
        }
        if !self.extra.is_empty() {
            m.insert("extra".into(), json!(self.extra));
        }
        Value::Object(m)
    }

    /// `identity <user> <groups...>`, the first line of an upgraded stream.
    pub fn identity_line(&self) -> String {
        let mut line = format!("identity {}", self.name);
        for g in &self.groups {
            line.push(' ');
            line.push_str(g);
        }
        line.push('\n');
        line
    }
}

/// kube's `AuthenticatedGroupAdder`: everyone but the anonymous user (and users that already
/// carry one of the two "all" groups) gets `system:authenticated`.
fn add_authenticated_group(mut user: UserInfo) -> UserInfo {
    if user.name == ANONYMOUS
        || user
            .groups
            .iter()
            .any(|g| g == AUTHENTICATED || g == UNAUTHENTICATED)
    {
        return user;
    }
    user.groups.push(AUTHENTICATED.to_string());
    user
}

/// A CA bundle that client certificate chains are verified against (`x509.Verify` with
/// `ExtKeyUsageClientAuth`, like kube's `x509.Verifier`).
#[derive(Debug)]
pub struct CaVerifier {
    pub path: String,
    verifier: Arc<dyn ClientCertVerifier>,
}

impl CaVerifier {
    pub fn load(path: &Path) -> anyhow::Result<CaVerifier> {
        Ok(CaVerifier {
            path: path.display().to_string(),
            verifier: tls::client_verifier(path)?,
        })
    }

    /// Verify a chain (end entity first) against this CA, now.
    pub fn verify(&self, chain: &[CertificateDer<'static>]) -> Result<(), String> {
        let (leaf, intermediates) = chain.split_first().ok_or("no client certificate")?;
        self.verifier
            .verify_client_cert(leaf, intermediates, UnixTime::now())
            .map(|_| ())
            .map_err(|e| format!("verifying against {}: {e}", self.path))
    }

    pub fn hints(&self) -> &[rustls::DistinguishedName] {
        self.verifier.root_hint_subjects()
    }
}

/// `--requestheader-*`: who may assert identities, and in which headers.
#[derive(Debug)]
pub struct RequestHeader {
    pub ca: CaVerifier,
    /// Allowed common names of the proxy's certificate; empty allows any.
    pub allowed_names: Vec<String>,
    pub username_headers: Vec<String>,
    pub uid_headers: Vec<String>,
    pub group_headers: Vec<String>,
    pub extra_prefixes: Vec<String>,
}

/// The whole chain, as configured by the flags.
#[derive(Debug, Default)]
pub struct Authenticator {
    pub request_header: Option<RequestHeader>,
    pub client_ca: Option<CaVerifier>,
    /// token -> user (kube's `--token-auth-file`).
    pub tokens: Option<HashMap<String, UserInfo>>,
    pub anonymous: bool,
}

/// Why a request got 401 (kube logs it; the sim also returns it in `x-sim-auth-error`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unauthorized(pub String);

impl Authenticator {
    /// Hints for the TLS CertificateRequest: the subjects of every client CA.
    pub fn ca_hints(&self) -> Vec<rustls::DistinguishedName> {
        let mut hints = Vec::new();
        if let Some(rh) = &self.request_header {
            hints.extend_from_slice(rh.ca.hints());
        }
        if let Some(ca) = &self.client_ca {
            hints.extend_from_slice(ca.hints());
        }
        hints
    }

    /// Authenticate one request that arrived on `conn` (plain HTTP: no certificates).
    pub fn authenticate(
        &self,
        conn: Option<&ConnInfo>,
        headers: &HeaderMap,
    ) -> Result<UserInfo, Unauthorized> {
        let chain = conn.and_then(|c| c.peer_certs.as_deref());
        let mut errors = Vec::new();
        let steps: [&dyn Fn() -> Result<Option<UserInfo>, String>; 3] = [
            &|| self.request_header(chain, headers),
            &|| self.x509(chain),
            &|| self.token(headers),
        ];
        for step in steps {
            match step() {
                Ok(Some(user)) => return Ok(add_authenticated_group(user)),
                Ok(None) => {}
                Err(e) => errors.push(e),
            }
        }
        if !errors.is_empty() {
            return Err(Unauthorized(errors.join("; ")));
        }
        if self.anonymous {
            Ok(UserInfo::anonymous())
        } else {
            Err(Unauthorized(
                "no credentials and anonymous auth is off".into(),
            ))
        }
    }

    fn request_header(
        &self,
        chain: Option<&[CertificateDer<'static>]>,
        headers: &HeaderMap,
    ) -> Result<Option<UserInfo>, String> {
        let (Some(rh), Some(chain)) = (&self.request_header, chain) else {
            return Ok(None);
        };
        if chain.is_empty() {
            return Ok(None);
        }
        rh.ca
            .verify(chain)
            .map_err(|e| format!("requestheader: {e}"))?;
        let subject = tls::subject(&chain[0]).map_err(|e| format!("requestheader: {e}"))?;
        if !rh.allowed_names.is_empty() && !rh.allowed_names.contains(&subject.common_name) {
            return Err(format!(
                "requestheader: x509: subject with cn={} is not in the allowed list",
                subject.common_name
            ));
        }
        let Some(name) = first_value(headers, &rh.username_headers) else {
            return Ok(None);
        };
        let uid = first_value(headers, &rh.uid_headers).unwrap_or_default();
        let groups = all_values(headers, &rh.group_headers);
        let mut user = UserInfo::new(&name, &uid, groups, Method::RequestHeader);
        user.extra = extras(headers, &rh.extra_prefixes);
        Ok(Some(user))
    }

    fn x509(&self, chain: Option<&[CertificateDer<'static>]>) -> Result<Option<UserInfo>, String> {
        let (Some(ca), Some(chain)) = (&self.client_ca, chain) else {
            return Ok(None);
        };
        if chain.is_empty() {
            return Ok(None);
        }
        ca.verify(chain).map_err(|e| format!("x509: {e}"))?;
        let subject = tls::subject(&chain[0]).map_err(|e| format!("x509: {e}"))?;
        // kube's CommonNameUserConversion: no CN, no user (and no error).
        if subject.common_name.is_empty() {
            return Ok(None);
        }
        Ok(Some(UserInfo::new(
            &subject.common_name,
            "",
            subject.organizations,
            Method::X509,
        )))
    }

    fn token(&self, headers: &HeaderMap) -> Result<Option<UserInfo>, String> {
        let Some(tokens) = &self.tokens else {
            return Ok(None);
        };
        let Some(token) = bearer_token(headers) else {
            return Ok(None);
        };
        match tokens.get(&token) {
            Some(user) => Ok(Some(user.clone())),
            None => Err("invalid bearer token".into()),
        }
    }
}

/// kube's `bearertoken` authenticator: `Authorization: Bearer <token>`, scheme
/// case-insensitive, an empty token is no token.
pub fn bearer_token(headers: &HeaderMap) -> Option<String> {
    let auth = headers.get("authorization")?.to_str().ok()?.trim();
    let mut parts = auth.splitn(3, ' ');
    let scheme = parts.next()?;
    let token = parts.next()?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then(|| token.to_string())
}

/// Go's `http.Header.Get` over several names: the first non-empty first value.
fn first_value(headers: &HeaderMap, names: &[String]) -> Option<String> {
    names.iter().find_map(|n| {
        headers
            .get(n.as_str())
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .filter(|v| !v.is_empty())
    })
}

/// kube's `allHeaderValues`: every non-empty value of every named header, in order.
fn all_values(headers: &HeaderMap, names: &[String]) -> Vec<String> {
    names
        .iter()
        .flat_map(|n| headers.get_all(n.as_str()).iter())
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .filter(|v| !v.is_empty())
        .collect()
}

/// kube's `newExtra`: `<prefix><key>` headers, the key lower-cased and path-unescaped.
fn extras(headers: &HeaderMap, prefixes: &[String]) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for prefix in prefixes {
        let prefix = prefix.to_ascii_lowercase();
        for (name, value) in headers {
            // HeaderMap names are already lower case.
            let Some(key) = name.as_str().strip_prefix(&prefix) else {
                continue;
            };
            out.entry(path_unescape(key))
                .or_default()
                .push(String::from_utf8_lossy(value.as_bytes()).into_owned());
        }
    }
    out
}

/// Go's `url.PathUnescape`, falling back to the input when it is not valid escaping.
fn path_unescape(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            match hex {
                Some(b) => {
                    out.push(b);
                    i += 3;
                    continue;
                }
                None => return s.to_string(),
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap_or_else(|_| s.to_string())
}

/// Parse kube's static token file: CSV `token,user,uid[,"group1,group2"]`, as Go's
/// `encoding/csv` reads it (quoted fields, `""` escapes, any number of fields per record).
/// Records with an empty token are skipped; a later duplicate token wins.
pub fn parse_token_file(text: &str) -> anyhow::Result<HashMap<String, UserInfo>> {
    let mut tokens = HashMap::new();
    for (n, record) in parse_csv(text)?.into_iter().enumerate() {
        if record.len() < 3 {
            anyhow::bail!(
                "token file must have at least 3 columns (token, user name, user uid), found {} in record {}",
                record.len(),
                n + 1
            );
        }
        if record[0].is_empty() {
            continue;
        }
        let groups = match record.get(3) {
            Some(g) => g.split(',').map(String::from).collect(),
            None => Vec::new(),
        };
        tokens.insert(
            record[0].clone(),
            UserInfo::new(&record[1], &record[2], groups, Method::Token),
        );
    }
    Ok(tokens)
}

pub fn load_token_file(path: &Path) -> anyhow::Result<HashMap<String, UserInfo>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading token file {}", path.display()))?;
    parse_token_file(&text).with_context(|| format!("token file {}", path.display()))
}

/// A small RFC 4180 reader (what `encoding/csv` accepts with default settings, minus comments).
fn parse_csv(text: &str) -> anyhow::Result<Vec<Vec<String>>> {
    let mut records = Vec::new();
    let mut chars = text.chars().peekable();
    let mut record: Vec<String> = Vec::new();
    let mut field = String::new();
    let mut line = 1;
    loop {
        // At the start of a field.
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next() {
                    Some('"') if chars.peek() == Some(&'"') => {
                        chars.next();
                        field.push('"');
                    }
                    Some('"') => break,
                    Some(c) => {
                        if c == '\n' {
                            line += 1;
                        }
                        field.push(c);
                    }
                    None => anyhow::bail!("line {line}: extraneous or missing \" in quoted-field"),
                }
            }
            match chars.peek() {
                None | Some(',') | Some('\n') | Some('\r') => {}
                Some(_) => anyhow::bail!("line {line}: extraneous or missing \" in quoted-field"),
            }
        } else {
            while let Some(&c) = chars.peek() {
                if matches!(c, ',' | '\n' | '\r') {
                    break;
                }
                if c == '"' {
                    anyhow::bail!("line {line}: bare \" in non-quoted-field");
                }
                field.push(c);
                chars.next();
            }
        }
        record.push(std::mem::take(&mut field));
        match chars.next() {
            Some(',') => continue,
            Some('\r') if chars.peek() == Some(&'\n') => {
                chars.next();
            }
            _ => {}
        }
        // End of a record (or of the input).
        line += 1;
        let blank = record.len() == 1 && record[0].is_empty();
        if !blank {
            records.push(std::mem::take(&mut record));
        }
        record.clear();
        if chars.peek().is_none() {
            break;
        }
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn token_file_like_kube() {
        let t = parse_token_file(
            "tok1,alice,uid-1,\"dev,qa\"\n\n,skipped,x\ntok2,bob,uid-2\r\n\"tok\"\"3\",carol,u3,ops\n",
        )
        .unwrap();
        assert_eq!(t.len(), 3);
        assert_eq!(t["tok1"].name, "alice");
        assert_eq!(t["tok1"].uid, "uid-1");
        assert_eq!(t["tok1"].groups, vec!["dev", "qa"]);
        assert!(t["tok2"].groups.is_empty());
        assert_eq!(t["tok\"3"].groups, vec!["ops"]);
        assert!(parse_token_file("tok,alice\n").is_err());
        assert!(parse_token_file("to\"k,alice,u\n").is_err());
        assert!(parse_token_file("\"tok,alice,u\n").is_err());
        // The last record needs no newline.
        assert_eq!(parse_token_file("a,b,c").unwrap()["a"].name, "b");
    }

    #[test]
    fn bearer_tokens() {
        assert_eq!(
            bearer_token(&headers(&[("authorization", "Bearer abc")])),
            Some("abc".into())
        );
        assert_eq!(
            bearer_token(&headers(&[("authorization", "bearer abc extra")])),
            Some("abc".into())
        );
        assert_eq!(
            bearer_token(&headers(&[("authorization", "Bearer ")])),
            None
        );
        assert_eq!(
            bearer_token(&headers(&[("authorization", "Basic x")])),
            None
        );
        assert_eq!(bearer_token(&headers(&[])), None);
    }

    #[test]
    fn token_chain_and_anonymous() {
        let auth = Authenticator {
            tokens: Some(parse_token_file("good,alice,u1,\"dev,qa\"\n").unwrap()),
            anonymous: true,
            ..Default::default()
        };
        let u = auth
            .authenticate(None, &headers(&[("authorization", "Bearer good")]))
            .unwrap();
        assert_eq!(u.name, "alice");
        assert_eq!(u.groups, vec!["dev", "qa", AUTHENTICATED]);
        assert_eq!(u.method, Method::Token);
        // An unknown token fails the request; it does not fall through to anonymous.
        assert!(auth
            .authenticate(None, &headers(&[("authorization", "Bearer bad")]))
            .is_err());
        // Spoofed identity headers mean nothing without the proxy certificate.
        let u = auth
            .authenticate(None, &headers(&[("x-remote-user", "admin")]))
            .unwrap();
        assert_eq!(u, UserInfo::anonymous());
        let off = Authenticator {
            anonymous: false,
            ..Default::default()
        };
        assert!(off.authenticate(None, &headers(&[])).is_err());
    }

    #[test]
    fn authenticated_group_added_once() {
        let u = add_authenticated_group(UserInfo::new(
            "a",
            "",
            vec!["system:authenticated".into()],
            Method::Token,
        ));
        assert_eq!(u.groups, vec![AUTHENTICATED]);
        let u = add_authenticated_group(UserInfo::anonymous());
        assert_eq!(u.groups, vec![UNAUTHENTICATED]);
    }

    #[test]
    fn request_header_values_and_extras() {
        let h = headers(&[
            ("x-remote-user", ""),
            ("x-remote-user", "ignored-second"),
            ("x-remote-group", "a,b"),
            ("x-remote-group", ""),
            ("x-remote-group", "c"),
            ("x-remote-extra-scopes", "s1"),
            ("x-remote-extra-scopes", "s2"),
            ("x-remote-extra-example.com%2fkey", "v"),
        ]);
        // The first value of X-Remote-User is empty: Go's Header.Get sees "".
        assert_eq!(first_value(&h, &["X-Remote-User".into()]), None);
        assert_eq!(
            all_values(&h, &["X-Remote-Group".into()]),
            vec!["a,b".to_string(), "c".to_string()]
        );
        let e = extras(&h, &["X-Remote-Extra-".into()]);
        assert_eq!(e["scopes"], vec!["s1", "s2"]);
        assert_eq!(e["example.com/key"], vec!["v"]);
        assert_eq!(path_unescape("a%zz"), "a%zz");
    }

    #[test]
    fn user_json_and_identity_line() {
        let mut u = UserInfo::new("alice", "", vec!["dev".into()], Method::X509);
        assert_eq!(u.to_json(), json!({"username": "alice", "groups": ["dev"]}));
        u.extra.insert("k".into(), vec!["v".into()]);
        u.uid = "1".into();
        assert_eq!(
            u.to_json(),
            json!({"username": "alice", "uid": "1", "groups": ["dev"], "extra": {"k": ["v"]}})
        );
        assert_eq!(u.identity_line(), "identity alice dev\n");
    }
}

/// The chain against real certificates from the test PKI.
#[cfg(test)]
mod cert_tests {
    use super::*;
    use axum::http::HeaderValue;
    use rustls::pki_types::pem::PemObject;
    use skewgate_tests::{CertFiles, Subject, TestPki};

    fn conn(files: &CertFiles) -> ConnInfo {
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(files.cert_pem.as_bytes())
                .collect::<Result<_, _>>()
                .unwrap();
        ConnInfo {
            tls: true,
            peer_certs: Some(chain.into()),
            ..ConnInfo::default()
        }
    }

    fn chain(pki: &TestPki, allowed: &[&str]) -> Authenticator {
        Authenticator {
            request_header: Some(RequestHeader {
                ca: CaVerifier::load(&pki.front_proxy_ca.cert_file).unwrap(),
                allowed_names: allowed.iter().map(|s| s.to_string()).collect(),
                username_headers: vec!["X-Remote-User".into()],
                uid_headers: vec![],
                group_headers: vec!["X-Remote-Group".into()],
                extra_prefixes: vec!["X-Remote-Extra-".into()],
            }),
            client_ca: Some(CaVerifier::load(&pki.client_ca.cert_file).unwrap()),
            tokens: Some(load_token_file(&pki.token_file).unwrap()),
            anonymous: true,
        }
    }

    fn h(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn each_authenticator_decides_for_its_own_ca() {
        let pki = TestPki::generate().unwrap();
        let a = chain(&pki, &["front-proxy-client"]);
        let alice = pki
            .client_cert(
                "alice",
                &Subject::new().o("z-first").cn("alice").o("dev").o("qa"),
            )
            .unwrap();
        let proxy = conn(&pki.front_proxy_client);
        let token = ("authorization", "Bearer token-bob-0123456789");

        // x509: CN and every O in certificate order; spoofed X-Remote-User means nothing.
        let u = a
            .authenticate(Some(&conn(&alice)), &h(&[("x-remote-user", "admin")]))
            .unwrap();
        assert_eq!(u.method, Method::X509);
        assert_eq!(u.name, "alice");
        assert_eq!(u.groups, vec!["z-first", "dev", "qa", AUTHENTICATED]);

        // requestheader: the proxy asserts the user, groups and extras.
        let u = a
            .authenticate(
                Some(&proxy),
                &h(&[
                    ("x-remote-user", "dave"),
                    ("x-remote-group", "g1"),
                    ("x-remote-group", "g2"),
                    ("x-remote-extra-scopes", "s"),
                ]),
            )
            .unwrap();
        assert_eq!(u.method, Method::RequestHeader);
        assert_eq!((u.name.as_str(), u.groups.len()), ("dave", 3));
        assert_eq!(u.extra["scopes"], vec!["s"]);

        // The proxy certificate without X-Remote-User is not a user certificate: 401, unless a
        // token authenticates.
        assert!(a.authenticate(Some(&proxy), &h(&[])).is_err());
        let u = a.authenticate(Some(&proxy), &h(&[token])).unwrap();
        assert_eq!((u.method, u.name.as_str()), (Method::Token, "bob"));

        // A CN outside --requestheader-allowed-names: 401.
        let other = conn(&pki.front_proxy_cert("other-proxy", "someone-else").unwrap());
        let err = a
            .authenticate(Some(&other), &h(&[("x-remote-user", "dave")]))
            .unwrap_err();
        assert!(err.0.contains("not in the allowed list"), "{err:?}");
        // ... which an empty list allows.
        let any = chain(&pki, &[]);
        let u = any
            .authenticate(Some(&other), &h(&[("x-remote-user", "dave")]))
            .unwrap();
        assert_eq!(u.name, "dave");

        // The evil CA (same subject as the client CA): 401; a valid token still wins.
        let evil = conn(
            &pki.evil_client_cert("mallory", &Subject::new().cn("alice").o("system:masters"))
                .unwrap(),
        );
        assert!(a.authenticate(Some(&evil), &h(&[])).is_err());
        assert_eq!(
            a.authenticate(Some(&evil), &h(&[token])).unwrap().name,
            "bob"
        );

        // A user certificate is no proxy certificate.
        let u = a
            .authenticate(Some(&conn(&alice)), &h(&[("x-remote-user", "admin")]))
            .unwrap();
        assert_eq!(u.name, "alice");

        // No CN: x509 does not authenticate (and does not fail), but requestheader failed on
        // that certificate, so the union fails: 401, as in kube.
        let no_cn = conn(&pki.client_cert("no-cn", &Subject::new().o("dev")).unwrap());
        let err = a.authenticate(Some(&no_cn), &h(&[])).unwrap_err();
        assert!(err.0.starts_with("requestheader"), "{err:?}");
        // Without requestheader configured it is anonymous.
        let x509_only = Authenticator {
            request_header: None,
            ..chain(&pki, &[])
        };
        assert_eq!(
            x509_only.authenticate(Some(&no_cn), &h(&[])).unwrap(),
            UserInfo::anonymous()
        );
    }
}
